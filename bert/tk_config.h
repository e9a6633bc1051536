/* tk_config.h — one fine-tuning run, as the user wrote it.
 *
 * The %%txtrain cell body (YAML), `txk train cfg.yaml`, the planner and the
 * advisor's fixes all speak this struct: a fix is a pure function
 * tk_config -> tk_config. It is plain data (fixed-size strings, no pointers),
 * so it copies with `=` and compares field by field.
 *
 * Keys in YAML are the field names below (nested maps allowed for `model:`,
 * `data:`, `device:`, `train:`; a dotted or flat key is the same key).
 * Unknown keys and bad values are errors that name the key (and line), and
 * suggest the closest known key or list the allowed values.
 */
#ifndef TK_CONFIG_H
#define TK_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TK_TASK_CLASSIFY = 0, TK_TASK_QA } tk_task;
typedef enum { TK_HEAD_POOLED = 0, TK_HEAD_SPAN, TK_HEAD_FLATTEN_DENSE } tk_head_kind;
typedef enum { TK_PREC_FP32 = 0, TK_PREC_FP16, TK_PREC_BF16 } tk_precision;
typedef enum { TK_RECOMPUTE_NONE = 0, TK_RECOMPUTE_LAYERS, TK_RECOMPUTE_ATTENTION } tk_recompute;
/* adamw_torch_fused: engine pytorch's torch.optim.AdamW(fused=True) (transformers
 * 5's TrainingArguments default); txkernel's own trainer runs it as adamw. */
typedef enum { TK_OPTIM_ADAMW = 0, TK_OPTIM_ADAMW8, TK_OPTIM_ADAMW_FUSED } tk_optim;
/* TK_ATTN_AUTO (the default) is decided per device by tk_config_attention. */
typedef enum { TK_ATTN_STANDARD = 0, TK_ATTN_FUSED, TK_ATTN_AUTO } tk_attention;
typedef enum { TK_BATCH_FIXED = 0, TK_BATCH_DYNAMIC, TK_BATCH_BUCKETS } tk_batching;
typedef enum { TK_EMPTY_NEVER = 0, TK_EMPTY_EVERY, TK_EMPTY_ON_OOM } tk_empty_cache;
typedef enum { TK_DEVICE_AUTO = 0, TK_DEVICE_CPU, TK_DEVICE_CUDA, TK_DEVICE_META } tk_device_choice;
typedef enum { TK_INIT_PRETRAINED = 0, TK_INIT_RANDOM } tk_init;
/* Whose training step a plan describes: txkernel's own, or a transformers
 * BertFor* step as PyTorch runs it (torchplan/tk_torchplan.h). */
typedef enum { TK_ENGINE_TXKERNEL = 0, TK_ENGINE_PYTORCH } tk_engine;
/* engine: pytorch only: transformers' attn_implementation. */
typedef enum { TK_ATTN_IMPL_SDPA = 0, TK_ATTN_IMPL_EAGER } tk_attn_impl;
/* engine: pytorch only: the torch + transformers the plan follows. */
/* engine: pytorch's `torch_version`: "2" (torch 2.x, the minor not said: the
 * cuBLAS rules of 2.11, Colab's in 2026), "1.13", "1.10", or a 2.x minor
 * "2.0" .. "2.15" (TK_TORCH_2_MINOR(n)), which differ in where cuBLAS's
 * workspaces live (torchplan/blas_rules.c). */
typedef enum { TK_TORCH_2 = 0, TK_TORCH_1_13, TK_TORCH_1_10, TK_TORCH_2_0 } tk_torch_version;
#define TK_TORCH_2_LAST_MINOR 15
#define TK_TORCH_2_MINOR(n) ((tk_torch_version)(TK_TORCH_2_0 + (n)))
#define TK_TORCH_N_VERSIONS (TK_TORCH_2_0 + TK_TORCH_2_LAST_MINOR + 1)
/* The 2.x minor whose rules a version follows: n for 2.n, 11 for "2", -1
 * for 1.13 and 1.10. */
int tk_torch_minor(tk_torch_version v);
/* engine: pytorch only, two or more GPUs: how the step is spread over them
 * (torch.nn.DataParallel, as the Trainer wraps a model on two GPUs without a
 * launcher; DistributedDataParallel; DeepSpeed ZeRO stage 2). */
typedef enum { TK_PAR_DATAPARALLEL = 0, TK_PAR_DDP, TK_PAR_ZERO2 } tk_parallel;
/* The API the user trains with, which advice writes its fixes in: auto (the
 * default: a pasted traceback's Trainer.train or the companion's --trainer
 * say trainer; otherwise loop for engine: pytorch and txkernel for engine:
 * txkernel, tk_config_api), transformers' Trainer (TrainingArguments lines),
 * a plain PyTorch loop, or txkernel's own config (YAML). */
typedef enum { TK_API_AUTO = 0, TK_API_TRAINER, TK_API_LOOP, TK_API_TXKERNEL, TK_API_KERAS } tk_api;

#define TK_PATH_MAX 512

typedef struct tk_config {
    /* model */
    char model[TK_PATH_MAX];   /* local HF folder or file, hub id ("org/name"), or preset (an alias of a hub id) */
    char revision[128];        /* hub branch, tag or commit ("main") */
    tk_init init;              /* pretrained: the model's weights (an error when there are none); random: a shape */
    char vocab[TK_PATH_MAX];   /* vocab.txt; "" = the model folder's */
    int hidden, layers, heads, intermediate; /* 0 = from preset / config.json */
    int vocab_size, max_position, type_vocab;
    int lowercase;             /* -1 = from the model (uncased presets lower-case) */
    float dropout;             /* hidden and attention dropout */

    /* data */
    char train_file[TK_PATH_MAX], dev_file[TK_PATH_MAX];
    char text_col[64], text_pair_col[64], label_col[64];
    float dev_split;           /* fraction held out when there is no dev_file */
    int max_examples;          /* 0 = all */

    /* task */
    tk_task task;
    tk_head_kind head;
    int head_units;            /* flatten_dense: units of the Dense layer */
    int towers;                /* flatten_dense: number of BERT towers (the seed model has 2) */
    int num_labels;            /* 0 = from the data */
    int max_len, doc_stride;
    int batch_size, eval_batch_size; /* eval_batch_size 0 = batch_size */
    int epochs, max_steps;     /* max_steps 0 = epochs decide */
    float lr, weight_decay, warmup_ratio, max_grad_norm;
    float adam_beta1, adam_beta2, adam_eps;
    char schedule[16];         /* "linear" | "constant" */
    uint64_t seed;

    /* device */
    tk_device_choice device;
    size_t capacity;           /* simulated capacity in bytes; 0 = the device's */
    char gpu[32];              /* a GPU profile name ("t4"); sets capacity and costs */
    int threads;               /* cpu threads; 0 = all */
    int world_size;            /* data-parallel ranks: GPUs in this process on cuda, MPI processes on the cpu */
    int zero;                  /* 0: all-reduce gradients; 1: shard AdamW's state; 2: shard the gradients too */

    /* memory-saving techniques */
    tk_precision precision;
    int tf32;                  /* 1: fp32 GEMMs may round their inputs to TF32 on tensor cores (cuda) */
    int accumulate;            /* micro-batches per optimizer step (>= 1) */
    tk_recompute recompute;
    int freeze_embeddings;     /* 1: no grad, no optimizer state for embeddings */
    int freeze_layers;         /* the first N encoder layers are frozen */
    tk_optim optimizer;
    int adamw8_fp32_embeddings;/* 8-bit AdamW keeps embeddings' state in fp32 */
    tk_attention attention;    /* standard | fused | auto (the default: tk_config_attention) */
    tk_batching batching;
    int buckets;               /* length buckets for batching: buckets */
    tk_empty_cache empty_cache;
    int empty_cache_every;     /* with empty_cache: every:N */

    /* engine */
    tk_engine engine;          /* txkernel (default) | pytorch */
    tk_attn_impl attn_implementation; /* pytorch: sdpa (default, as transformers 5) | eager */
    float attention_dropout;   /* pytorch: attention_probs_dropout_prob; < 0 = `dropout` */
    tk_torch_version torch_version; /* pytorch: 2 (torch 2.x + transformers 5.x) | 2.0 .. 2.15 | 1.13 (+ 4.40) | 1.10 (+ 4.15) */
    tk_parallel parallel;      /* pytorch, world size > 1: dataparallel (default) | ddp | zero2 */
    int bucket_cap_mb;         /* pytorch, parallel: ddp: DDP's bucket_cap_mb; 0 = its default (25, first bucket 1 MiB) */
    tk_api api;                /* the API fixes are written in: auto | trainer | loop | txkernel */

    /* output */
    char output_dir[TK_PATH_MAX]; /* checkpoints; "" = no checkpoints */
    char resume_from[TK_PATH_MAX]; /* a checkpoint folder, an HF folder (weights only) or "auto" */
    int log_every;             /* progress callback every N steps */
    int save_every;            /* checkpoint-STEP every N optimizer steps; 0 = at each epoch's end */
    int save_every_s;          /* instead, every N seconds of training (save_every: 10min) */
    int keep_checkpoints;      /* checkpoint-STEP folders kept in output_dir (newest); 0 = all */
    int save_error_stop;       /* 1 (default): a failed save (disk full) stops the run; 0: it goes on */
    int overwrite;             /* 1: write into an output_dir holding a model txkernel did not write */
} tk_config;

/* HF-like defaults: bert-base-cased, max_len 128, batch 32, 3 epochs, lr 2e-5,
 * linear schedule, AdamW (0.9, 0.999, 1e-8, wd 0.01), clip 1.0, fp32, cpu,
 * attention: auto. */
void tk_config_defaults(tk_config *c);

/* The attention a run of `c` uses: the one rule for the attention default.
 * A config that names standard or fused gets it. By default (auto):
 *  - on a GPU (the run is on cuda, `on` == TK_DEV_CUDA; it says device:
 *    cuda; or it is for a card, gpu: PROFILE, on any machine: a plan for a
 *    t4 is a plan of a t4 run): fused, which keeps no T x T matrix for
 *    backward, where one of the cuda backend's tensor-core kernels runs it
 *    for the config's precision and head size on that card
 *    (gpu/tk_attn_kernel.h: fp16, and bf16 from sm80; the card is the
 *    profile's, else taken as sm80) — why: TK_ATTN_WHY_FAST; otherwise (fp32
 *    above all, where only the slow reference kernel would run) standard,
 *    the faster there — TK_ATTN_WHY_SLOW — unless memory forces fused: with
 *    `fits` (may be NULL: memory not considered) and a known capacity
 *    (tk_config_capacity), a run whose standard attention does not fit and
 *    whose fused one does stays fused — TK_ATTN_WHY_FITS. fits(t, u) says
 *    whether config t (its attention set) fits: tk_plan_attention_fits
 *    (bert/tk_plan.h) plans it;
 *  - standard on the cpu, where it is the faster of the two (bench/RESULTS.md:
 *    the cpu's fused kernel walks rows, the standard path runs BLAS GEMMs).
 * `on` is the kind of device the run got; TK_DEV_META (a plan, or a device
 * not opened yet) decides from the config alone, so device: auto without a
 * profile counts as the cpu there. `why` (may be NULL) gets "set in the
 * config", "default on the cpu" or one of the TK_ATTN_WHY_* (static
 * strings, each starting "default on cuda"). tk_config_attention is
 * tk_config_attention_fit without `fits`. */
typedef int (*tk_attention_fits)(const tk_config *c, void *u);
#define TK_ATTN_WHY_FAST "default on cuda, fast kernel"
#define TK_ATTN_WHY_SLOW "default on cuda, fp32 or no fast kernel"
#define TK_ATTN_WHY_FITS "default on cuda, only fused fits"
tk_attention tk_config_attention_fit(const tk_config *c, tk_dev_kind on, tk_attention_fits fits, void *u,
                                     const char **why);
tk_attention tk_config_attention(const tk_config *c, tk_dev_kind on, const char **why);
/* The ranks a run of `c` has: world_size when set above 1, else the GPUs
 * of its gpu: profile (t4x2: 2), else 1. The planner, the run and txk's
 * launcher all ask it. */
int tk_config_world_size(const tk_config *c);
/* 1 when a run of `c` is a card's run: device: cuda, or a gpu: profile (a
 * plan for a t4 is a plan of a t4 run, and a cpu run of that config
 * simulates the card). Such a run takes the cuda backend's buffers (the
 * cuBLAS workspace and the kernels' scratch) through its allocator when its
 * device opens (tk_dev_opts.card_buffers), so the plan holds them too. A run
 * of device: auto that found cuda is a card's run whatever this says: its
 * caller plans it as device: cuda. */
int tk_config_on_card(const tk_config *c);
/* The capacity a plan of `c` works against: `capacity` when set, else its
 * gpu: profile's budget (tk_gpu_profile_budget), else 0 (none). A
 * measurement of the plan (tk_train_measure) runs under the same, so that
 * the allocator releases its cache and retries at the same moment in both. */
size_t tk_config_capacity(const tk_config *c);
/* "standard" | "fused" | "auto" */
const char *tk_attention_name(tk_attention a);

/* Parses a YAML document over `c` (which holds defaults or a previous config).
 * `source` names it in errors ("cell", "cfg.yaml"). On error, `c` is left as
 * it was and err says: source:line: key: what is wrong (closest key / allowed
 * values). */
tk_status tk_config_parse_yaml(tk_config *c, const char *yaml, size_t len, const char *source,
                               tk_err *err);
/* The same for a document that starts on line first_line of its source (a
 * cell's YAML body starts below its %%magic line), so errors name the line
 * an editor shows. */
tk_status tk_config_parse_yaml_at(tk_config *c, const char *yaml, size_t len, const char *source,
                                  int first_line, tk_err *err);
/* Sets one key from a string ("batch_size", "16"); the same checks. */
tk_status tk_config_set(tk_config *c, const char *key, const char *value, tk_err *err);
/* Fills model dimensions from the preset or the folder's config.json. */
tk_status tk_config_resolve_model(tk_config *c, tk_err *err);
/* Checks cross-field rules (batch_size >= 1, heads divide hidden, ...). */
tk_status tk_config_validate(const tk_config *c, tk_err *err);
/* YAML text of every key (new string, free()). */
char *tk_config_to_yaml(const tk_config *c);
/* Lines "key: old -> new" for each differing key (new string, free()). */
char *tk_config_diff(const tk_config *a, const tk_config *b);
/* The list of known keys (NULL-terminated, borrowed), for completion and help. */
const char *const *tk_config_keys(void);
/* One-line help for a key; NULL if unknown. */
const char *tk_config_key_help(const char *key);

#ifdef __cplusplus
}
#endif
#endif
