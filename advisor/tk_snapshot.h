/* tk_snapshot.h — a PyTorch CUDA memory snapshot read and diagnosed: the
 * figures PyTorch's own counters give, who holds the live memory, the
 * memory over time from the trace, and the same diagnoses the advisor makes
 * for a plan, with fixes written as the PyTorch/transformers code to change.
 *
 * Forms read: the pickle of `torch.cuda.memory._snapshot()` as
 * `_dump_snapshot` writes it (a dict with `segments` and `device_traces`),
 * the older pickle of the segment list alone, and the same data as JSON.
 * The pickle goes through tk_pickle with no global allowed: nothing in the
 * file is executed.
 *
 * Figures are exact sums over the file: reserved = segments' total_size;
 * allocated = sizes of 'active_allocated' blocks (memory_allocated());
 * requested = their requested_size; largest_free_block = the largest
 * 'inactive' block; the same per device in devices[]. The trace is replayed
 * as PyTorch's caching allocator ran it (its requests rounded and split into
 * blocks, the blocks from before the recording put back), so its allocated
 * is memory_allocated() too; its peak is read whole (phase, step, what was
 * live by category and layer), library workspaces are named. A pickle's
 * trace is streamed (its events kept as records), so the file's size is not
 * a limit. The reader's files go one way: advisor/snapshot_decode.h names
 * them in order.
 *
 * Ownership: tk_snap_read returns a new tk_snapshot (tk_snap_destroy);
 * every pointer inside is owned by it.
 */
#ifndef TK_SNAPSHOT_H
#define TK_SNAPSHOT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"
#include "tk_config.h"
#include "tk_advisor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tk_snap_pool {
    char pool[16];        /* "small" / "large" (segment_type) */
    int64_t stream;
    int segments;
    size_t reserved, allocated, free, largest_free;
} tk_snap_pool;

typedef struct tk_snap_owner {
    char owner[192];      /* "cell, line 12", "train.py, line 40 (step) · linear", "backward (autograd engine)",
                             "no Python frame" */
    size_t bytes;         /* live (active_allocated) bytes */
    int blocks;
    char phase[64];       /* what ran when its largest block was allocated (annotations, trace order), or "" */
    int64_t largest_addr; /* that block's address (the phase is looked up by it) */
    size_t largest;
    size_t pool_bytes;    /* of its bytes, those of an inference engine's preallocated pool */
} tk_snap_owner;

/* One device's share of the figures (a snapshot holds every device's segments). */
typedef struct tk_snap_device {
    int device;
    int segments;
    size_t reserved, allocated, largest_free_block;
    size_t free_small, largest_small, free_large, largest_large; /* by pool: what an OOM on it could use */
} tk_snap_device;

typedef struct tk_snap_point {
    int64_t event;        /* index of the trace event */
    int64_t time_us;      /* its time_us, or -1 when the file has none */
    size_t allocated, reserved;
} tk_snap_point;

/* A BERT recognised from the live blocks' sizes (or named by --model), and
 * the batch shape the activations imply. */
typedef struct tk_snap_model {
    int recognised;       /* 1: a BERT-family encoder (the only family planned), from its blocks or --model */
    char family[16];      /* "bert", "llama", "qwen", "mistral", "gpt2", "opt", "decoder", "unknown" */
    char why[384];        /* the evidence for the family, or what is missing */
    char from[TK_PATH_MAX + 16];  /* "block sizes", or "--model NAME" */
    char preset[48];      /* the preset with these dimensions, or "" */
    int hidden, layers, heads, intermediate, vocab, max_position;
    int elem;             /* bytes per parameter element: 4 (fp32) or 2 (fp16/bf16) */
    int mixed;            /* 16-bit copies of the weights were found beside fp32 ones */
    int copies;           /* tensors of each parameter's shape: 1 weights, 2 + grads, 4 + AdamW's two states */
    size_t param_bytes;   /* the recognised parameter-shaped blocks, all copies */
    int batch, seq;       /* the shape planned; 0 when unknown */
    char shape_from[96];  /* "activation blocks", "--batch/--seq", "" */
    int planned;          /* the current setting was planned and agrees with the file (shown) */
    int plan_withheld;    /* planned, but it disagrees with the file: not shown as the run's plan */
    char plan_note[320];  /* why it was withheld, or what it was checked against */
    char engine[16];      /* the planner that made it, as --json names it: "pytorch" or "txkernel" */
    char engine_label[128];/* the same for a reader (tk_plan_engine_name): "engine: pytorch (torch 2.x + ...)" */
    size_t plan_peak, plan_capacity; /* its planned peak reserved; the capacity planned against (0: none known) */
    size_t plan_allocated, plan_against; /* its planned peak allocated, and the file's figure it was held to
                                            (the trace's peak, with the failed request at an OOM) */
    int plan_fits;
    char capacity_from[96];
    /* the user's traced model (tk_snap_opts.plan_fn): */
    char planned_by[1600];/* "Planned by tracing clf (SentimentClassifier): ..." when it planned the run and
                             its fixes; "" when it did not */
    char traced_note[320];/* why it did not, in one line ("the snapshot's step is batch 16 x 64 tokens, the
                             traced config's 4 x 128"); "" without a traced model */
} tk_snap_model;

/* A user's data file, through the pipeline's tokenizer. */
typedef struct tk_snap_data {
    int have;
    char file[TK_PATH_MAX];
    int n, max, p50, p95, p99;
    int max_length;       /* the max_length proposed (p99 rounded up to 8, at most the model's positions) */
    char vocab_note[256];
} tk_snap_data;

/* How the trace was replayed (see advisor/snapshot_trace.c). */
typedef struct tk_snap_replay {
    int rounded;          /* 1: blocks as PyTorch's caching allocator rounds and splits requests (the trace
                             records requests); 0: the file's sizes as they are (txkernel's own snapshots) */
    int rounding_unknown; /* allocator_settings set roundup_power2_divisions: rounded to 512 B only */
    int before_blocks;    /* blocks live before the recording began (freed in the trace, or live at the end,
                             with no alloc in it) */
    size_t before_bytes;  /* allocated at the trace's first event */
    int unplaced;         /* allocs at an address the replay had no free block for: their request rounded */
    int end_checked, end_mismatch; /* blocks live at the end that the trace allocated; of them, replayed
                                      sizes that differ from the file's */
} tk_snap_replay;

/* A share of the memory live at the peak: a category or a layer. */
typedef struct tk_snap_part {
    char id[24];          /* "param", "grad", "optim", "act", "temp_backward", "temp_optimizer", "input",
                             "workspace", "before_recording", "other"; for a layer "layer_3", "before_layers" */
    char text[112];       /* what it is, for a reader */
    size_t bytes;
    int blocks;
} tk_snap_part;

/* A library workspace the file shows (cuBLAS's, one per thread's handle). */
typedef struct tk_snap_ws {
    char name[192];       /* as an owner: "library: cuBLAS workspace (...)" */
    size_t bytes;
    int at_peak;          /* live at the trace's peak */
} tk_snap_ws;

#define TK_SNAP_MAX_PARTS 12
#define TK_SNAP_MAX_WS 8

/* The trace's allocated peak: when, in which phase, and what was live. */
typedef struct tk_snap_peak {
    int have;             /* the trace reaches its peak at an alloc it shows */
    int64_t event, time_us;
    size_t allocated;     /* = trace_peak_allocated */
    char phase[24];       /* "forward", "backward", "optimizer step", "zero_grad", "data loading",
                             "loading the model", "your code", "" (the file does not say) */
    char where[64];       /* the phase as the annotations or frames name it */
    int step, steps;      /* the step it falls in (1-based, counted by optimizer steps) and the steps the
                             trace shows; 0 when no optimizer step shows */
    int n_parts;
    tk_snap_part parts[TK_SNAP_MAX_PARTS]; /* by category, largest first */
    int n_layers;
    tk_snap_part *layers; /* the activations live then by the forward's layer, in forward order */
    int layers_seen;      /* calls of the model's repeated layer in each forward pass, 0 unknown */
    size_t *state_sizes;  /* requested sizes, ascending, of the blocks live then that hold the model's state
                             (parameters, gradients, optimizer state, blocks from before the recording): the
                             model is recognised from them */
    int n_state_sizes;
    size_t *act_sizes;    /* the same of the forward's activations at the forward's or backward's high point
                             (the peak itself when it falls there): the batch shape */
    int n_act_sizes;
    int tokens, batch, label_blocks; /* from the int64 blocks your code made (the batch): tokens per step
                                        (B x T), the batch B and the blocks of B labels; 0 unknown */
} tk_snap_peak;

#define TK_SNAP_MAX_POOLS 32
#define TK_SNAP_MAX_DEVICES 16
#define TK_SNAP_MAX_DIAG 6
#define TK_SNAP_MAX_FIXES 10

typedef struct tk_snapshot {
    char path[512];
    const char *form;     /* "pickle (dict)", "pickle (list of segments)", "json" */
    int n_segments, n_blocks, n_live_blocks, n_free_blocks, n_devices;
    size_t reserved, allocated, requested, pending_free;
    size_t free_in_cache;        /* inactive blocks summed */
    size_t largest_free_block;
    size_t empty_segments;       /* bytes of segments with no active block: what empty_cache() returns */
    int n_pools;
    tk_snap_pool pools[TK_SNAP_MAX_POOLS];
    int n_owners;
    tk_snap_owner *owners;       /* sorted by bytes, largest first */
    int n_device_rows;
    tk_snap_device devices[TK_SNAP_MAX_DEVICES]; /* by device index, ascending */
    int has_oom;
    int trainer;                 /* 1: a live block's frames pass through transformers/trainer.py: fixes as
                                    TrainingArguments lines; 0: a plain loop's code */
    int by_txkernel;             /* the live blocks' frames are txkernel's own (txk train/plan --snapshot) */
    int oom_device;              /* the device whose trace holds the oom event */
    size_t oom_size, oom_device_free;
    int64_t oom_time_us;         /* -1: none */
    int expandable_on;           /* allocator_settings.expandable_segments, or an is_expandable segment */
    int has_annotations;         /* external_annotations with at least one range */
    char phase_at_peak[64], phase_at_oom[64]; /* "" when nothing says */
    int64_t peak_time_us;        /* time_us of the trace's allocated peak, -1 when none */
    int n_trace;                 /* trace events read */
    int n_points;
    tk_snap_point *points;       /* memory over time, one per alloc/free/segment event */
    size_t trace_peak_allocated; /* the highest allocated the trace reaches (PyTorch's memory_allocated():
                                    block sizes, with the blocks live before the recording) */
    tk_snap_replay replay;
    tk_snap_peak peak;
    int n_ws;
    tk_snap_ws ws[TK_SNAP_MAX_WS]; /* library workspaces, in the trace or before it */
    size_t capacity;             /* the device's, from the caller; 0: unknown */
    int n_diag;
    tk_finding diag[TK_SNAP_MAX_DIAG];     /* ranked, the cause first */
    int n_fixes;
    tk_fix_note fixes[TK_SNAP_MAX_FIXES];  /* ranked, best first */
    /* the leak: allocated between iterations (troughs between peaks of the
     * trace) rising steadily */
    int leak_iterations;         /* iterations the trace shows (troughs); 0 without a trace */
    int has_leak;
    int has_growth;              /* allocated rose inside one step (not a loop's iterations) */
    size_t growth_bytes;         /* first trough to the highest, over the step */
    int growth_rises;
    size_t leak_per_iteration, leak_total; /* growth per iteration; first to last trough */
    char leak_owner[192];        /* who allocated the blocks still live across iterations, or "" */
    size_t leak_owner_bytes;
    int leak_owner_iterations, leak_owner_blocks;
    /* live block sizes (requested_size, else size), ascending: the
     * recognition of a BERT works from them */
    size_t *live_sizes;
    int n_live_sizes, live_sizes_cap;
    /* the model module the live blocks' frames pass through most, by bytes
     * ("llama" from transformers/models/llama/modeling_llama.py), or "" */
    char model_module[48];
    char model_module_file[160];
    size_t model_module_bytes;
    size_t vllm_pool_bytes;      /* live blocks an inference engine preallocated (vLLM's KV cache) */
    int vllm_pool_blocks;
    tk_snap_model model;
    tk_snap_data data;
} tk_snapshot;

/* Reads and diagnoses the snapshot at path. capacity: the device's total
 * bytes (a GPU profile's or --capacity), 0 when unknown. NULL with err
 * (one line naming the file) on any error. */
tk_snapshot *tk_snap_read(const char *path, size_t capacity, tk_err *err);
/* The same from memory; name is used in messages. */
tk_snapshot *tk_snap_read_buf(const uint8_t *buf, size_t len, const char *name, size_t capacity, tk_err *err);
void tk_snap_destroy(tk_snapshot **ps);

/* The capacity to judge a snapshot against: a GPU profile's (gpu, "t4") or
 * a size ("14.75GiB"); both NULL gives 0 (unknown). -1 with err if unknown. */
int tk_snap_capacity(const char *gpu, const char *size, size_t *out, tk_err *err);

/* What tk_snap_plan is asked: the model (a preset name, an HF folder with
 * config.json, or a hub id "org/name", whose config and tokenizer files
 * come from the HF cache or the hub, never its weights; NULL: recognise it
 * from the block sizes), the batch
 * shape (0: infer it from the activation blocks), the user's data file
 * (NULL: none) and its text column (NULL: "text"), the GPU profile the
 * capacity came from (NULL: none; the plans then take off its context). */
typedef struct tk_snap_opts {
    const char *model, *data, *text_col, *gpu;
    int batch, seq;
    /* The user's traced model as the planner (issue 41 point 6; the hook
     * tk_advise_input.plan_fn is): when the snapshot's batch and length are
     * traced's, the run as it ran and each fix are planned by plan_fn on
     * traced (its gpu when the file names no card), with the fixes' code in
     * traced's API. NULL plan_fn: the BERT the blocks show, on tk_plan_engine. */
    tk_plan_fn plan_fn;
    void *plan_ctx;               /* plan_fn's own, borrowed */
    const tk_config *traced;      /* the config the model was traced with, borrowed */
    const char *traced_label;     /* "clf (SentimentClassifier)" */
    /* plan_fn's account of what it planned, called with plan_ctx once the
     * plans are made, into model.planned_by (app/traced.c's
     * tk_traced_summary). NULL: "Planned by tracing LABEL: the run as it ran
     * and each fix, ... replayed on the NAME profile." */
    void (*describe)(void *ctx, char *buf, size_t n);
} tk_snap_opts;

/* Recognises the BERT (o->model, else the live blocks' sizes), reads the
 * data file through the pipeline's tokenizer, and plans the current setting
 * and each fix of s on the planner (bert/plan.c, or o->plan_fn when the
 * file's step is o->traced's; else s->model.traced_note says why not). An
 * unrecognised model is not an error (s->model.recognised stays 0). -1 with
 * err naming the file, the model or the option on a bad --model, --data or
 * shape. */
int tk_snap_plan(tk_snapshot *s, const tk_snap_opts *o, tk_err *err);

/* The recognised model in one line ("BERT = bert-base-uncased, hidden 768, ..."). */
void tk_snap_model_line(const tk_snap_model *md, char *buf, size_t n);
/* Text report (new string, free()). */
char *tk_snap_text(const tk_snapshot *s, int top);
/* JSON object: reserved, allocated, requested, largest_free_block, segments
 * (by pool/stream), devices [{device, reserved, allocated,
 * largest_free_block}], top [{owner, bytes, blocks, phase when the file has
 * annotations}], oom {size, device_free, device, phase}, phase_at_peak,
 * timeline {events, points, peak_allocated, allocated_as, replay}, peak
 * {allocated, event, phase, where, step, steps, by_category, by_layer,
 * layers_seen, batch}, workspaces [{library, name, bytes, at_peak}], growth,
 * leak, model {family, why, ...}, diagnoses [{id, text}], fixes [{id, text,
 * code, saves}], and with a traced model (tk_snap_opts.plan_fn) planned_by
 * or traced_note (model.planned_by / model.traced_note) (new reference). */
json_t *tk_snap_json(const tk_snapshot *s, int top);

/* Writes the allocator's state as a PyTorch snapshot (the dict form, pickle
 * protocol 4 with only the opcodes PyTorch's web viewer decodes):
 * `segments` with their blocks from the allocator's real state, and
 * `device_traces` from its recorded history (tk_alloc_record_history; empty
 * when it was off), then an `oom` event when oom is given. Every block and
 * event carries one frame {filename "txkernel", line 0, name "OWNER · CAT · PHASE"}
 * (the phase when the trainer set one).
 * 0, or -1 with err naming the file. */
int tk_snap_write(const tk_alloc *a, const tk_oom *oom, const char *path, tk_err *err);

#ifdef __cplusplus
}
#endif
#endif
