/* tk_gpu.h — the device runtime's public interface.
 *
 * What it owns: dtypes, allocation tags, the tagged caching allocator, devices
 * (meta, cpu, cuda) and the operations the fine-tuner composes. What it knows
 * nothing of: BERT, notebooks, sockets.
 *
 * Guarantees:
 *  - Every device allocation goes through one tk_alloc with a tag (category +
 *    owner). The meta device allocates through the same allocator against a
 *    counting "device", so a planned step and a real step make the same
 *    allocation sequence and reach the same peak, byte for byte.
 *  - Nothing here aborts or exits on a runtime failure: functions return a
 *    tk_status, and an out-of-memory leaves a tk_oom record on the device.
 *  - Ops never allocate: callers allocate every output and scratch tensor, so
 *    the memory they take is visible and tagged.
 *
 * Ownership: "new" means the caller must destroy; "borrowed" means it lives as
 * long as its owner. *_destroy(T **p) is a no-op on NULL and sets *p to NULL.
 */
#ifndef TK_GPU_H
#define TK_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status and errors ------------------------------------------------ */

typedef enum {
    TK_OK = 0,
    TK_EOOM = -1,     /* the device allocator could not satisfy a request; only ever
                         returned with its tk_oom record (tk_dev_last_oom) */
    TK_EINVAL = -2,   /* bad argument or input; the tk_err says which */
    TK_EIO = -3,      /* a file could not be read or written */
    TK_ECANCEL = -4,  /* a cancel flag was honoured */
    TK_EDEVICE = -5,  /* the device (driver, CUDA, cuBLAS) reported an error */
    TK_EFORMAT = -6,  /* malformed input data (file, line and field in tk_err) */
    TK_ENOMEM = -7    /* a host allocation (malloc, jansson, ...) failed: "out of host memory" */
} tk_status;

/* An error a user can act on. Functions take an optional tk_err * (may be
 * NULL) and fill it on failure. */
typedef struct tk_err {
    tk_status status;
    char msg[1024];
} tk_err;

void tk_err_set(tk_err *err, tk_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A failed host allocation: fills err with "<what>: out of host memory"
 * (what may be NULL) and returns TK_ENOMEM, so a caller writes
 * `return tk_err_nomem(err, "plan");`. */
tk_status tk_err_nomem(tk_err *err, const char *what);
const char *tk_status_name(tk_status st);

/* ---- dtypes ------------------------------------------------------------ */

typedef enum { TK_F32 = 0, TK_F16, TK_BF16, TK_I8, TK_U8, TK_I32, TK_I64, TK_DTYPE_COUNT } tk_dtype;

size_t tk_dtype_size(tk_dtype dt);
const char *tk_dtype_name(tk_dtype dt);        /* "f32", "f16", ... */
int tk_dtype_parse(const char *s, tk_dtype *out); /* 0 on success */

/* fp16/bf16 <-> fp32 conversions (round to nearest even). */
uint16_t tk_f32_to_f16(float f);
float tk_f16_to_f32(uint16_t h);
uint16_t tk_f32_to_bf16(float f);
float tk_bf16_to_f32(uint16_t h);

/* ---- allocation tags ---------------------------------------------------- */

typedef enum {
    TK_CAT_PARAM = 0, /* model weights (fp32 master and 16-bit copies) */
    TK_CAT_GRAD,      /* parameter gradients */
    TK_CAT_OPTIM,     /* optimizer state (Adam moments, quantisation scales) */
    TK_CAT_ACT,       /* activations kept for backward */
    TK_CAT_TEMP,      /* scratch freed within one op sequence */
    TK_CAT_WORKSPACE, /* library workspaces (cuBLAS) */
    TK_CAT_INPUT,     /* input ids, masks, labels */
    TK_CAT_COUNT
} tk_cat;

const char *tk_cat_name(tk_cat c); /* "param", "grad", ... */

/* A tag: category plus owner. Owners are dotted names matching HF parameter
 * names ("bert.encoder.layer.7.attention.self.query", "classifier"), interned
 * by the allocator into small integer ids. */
typedef struct { tk_cat cat; int owner; } tk_tag;

/* ---- the caching allocator -------------------------------------------- */

/* Where segments come from. seg_alloc returns 0 and a device address, or
 * nonzero when the device itself is out of memory. seg_free gives a segment
 * back. The meta device hands out fake, never-dereferenced addresses. */
typedef struct tk_devmem {
    int  (*seg_alloc)(void *ctx, size_t bytes, void **ptr);
    void (*seg_free)(void *ctx, void *ptr, size_t bytes);
    void *ctx;
} tk_devmem;

/* The record an out-of-memory leaves: what was asked, for whom, and the state
 * of the allocator at that moment. Byte counts are exact. */
#define TK_OOM_TOP 8
typedef struct tk_oom {
    size_t requested;        /* bytes asked by the caller */
    size_t rounded;          /* after rounding */
    tk_tag tag;
    char owner_name[128];
    size_t capacity;         /* device capacity the allocator works against */
    size_t free_bytes;       /* capacity - reserved */
    size_t allocated;        /* live blocks */
    size_t reserved;         /* segments held */
    size_t largest_free_block; /* largest cached free block */
    int fragmentation;       /* 1: reserved - allocated >= request but no block fits */
    size_t by_cat[TK_CAT_COUNT]; /* live bytes per category */
    int n_top;
    struct { char owner[128]; size_t bytes; } top[TK_OOM_TOP]; /* top live owners */
    char tensor[96];         /* the tensor asked for, "f32 [32, 12, 512, 512]" ("" when not a tensor) */
} tk_oom;

typedef struct tk_alloc_stats {
    size_t capacity;
    size_t allocated, allocated_peak;    /* bytes in live blocks (rounded) */
    size_t requested, requested_peak;    /* bytes the callers asked for */
    size_t reserved, reserved_peak;      /* bytes in segments */
    size_t inactive_split;               /* free bytes inside segments that hold live blocks */
    size_t largest_free_block;
    uint64_t n_alloc, n_free, n_segments_alloc, n_segments_free;
    uint64_t n_retries, n_ooms;
    size_t n_segments;                   /* current */
    size_t by_cat[TK_CAT_COUNT];         /* live bytes per category */
    size_t by_cat_at_peak[TK_CAT_COUNT]; /* live bytes per category when allocated peaked */
} tk_alloc_stats;

typedef struct tk_alloc tk_alloc;

/* New allocator over a segment source, working against `capacity` bytes
 * (0: no simulated limit; the device's own failures still count). */
tk_alloc *tk_alloc_new(tk_devmem dev, size_t capacity);
/* Releases every segment (live blocks included) and the allocator. */
void tk_alloc_destroy(tk_alloc **pa);

/* Interns an owner name; returns its id (>= 0). Borrowed string is copied. */
int tk_alloc_owner_id(tk_alloc *a, const char *name);
const char *tk_alloc_owner_name(const tk_alloc *a, int id); /* borrowed */

/* Allocates `bytes` with `tag`. On success *ptr is the block's device address.
 * On failure allocates nothing and returns TK_EOOM (the device could not
 * serve it: fills *oom if given) or TK_ENOMEM (the host could not hold the
 * allocator's own bookkeeping; no record).
 * bytes == 0 gives *ptr = NULL and TK_OK. */
tk_status tk_alloc_malloc(tk_alloc *a, size_t bytes, tk_tag tag, void **ptr, tk_oom *oom);
/* Frees a block from tk_alloc_malloc. NULL is a no-op. */
void tk_alloc_free(tk_alloc *a, void *ptr);
/* Returns every fully free cached segment to the device. */
void tk_alloc_empty_cache(tk_alloc *a);
void tk_alloc_stats_get(const tk_alloc *a, tk_alloc_stats *out);
void tk_alloc_reset_peak(tk_alloc *a);
/* Live (and peak) bytes for one owner; owners are 0..tk_alloc_n_owners()-1. */
int tk_alloc_n_owners(const tk_alloc *a);
size_t tk_alloc_owner_live(const tk_alloc *a, int owner, tk_cat cat);
/* The size of the live block at ptr as the allocator accounts it (rounded,
 * and with an unsplit remainder included), or 0 if ptr is not live here. */
size_t tk_alloc_block_size(const tk_alloc *a, const void *ptr);
size_t tk_alloc_owner_peak(const tk_alloc *a, int owner); /* all categories */
/* The live breakdown at the moment `allocated` last reached its peak:
 * bytes for (owner, cat). */
size_t tk_alloc_owner_at_peak(const tk_alloc *a, int owner, tk_cat cat);

/* A hook the allocator calls on every malloc/free (for traces and for the
 * meta-vs-cpu sequence tests). ptr is the block address, bytes the rounded
 * size; is_alloc 1 for malloc, 0 for free. */
typedef void (*tk_alloc_event_fn)(void *ud, int is_alloc, size_t bytes, tk_tag tag);
void tk_alloc_set_event_hook(tk_alloc *a, tk_alloc_event_fn fn, void *ud);

/* For the chaos tests: the Nth segment request from now (1-based) fails as if
 * the device had no memory; 0 disables. */
void tk_alloc_fail_segment_after(tk_alloc *a, uint64_t n);

/* JSON snapshot of segments, blocks, owners and counters (new string, free()). */
char *tk_alloc_snapshot_json(const tk_alloc *a);

/* History: the allocator's events as PyTorch's memory history records them
 * (alloc, free, segment_alloc, segment_free, oom), kept in a ring of the last
 * max_events (like torch.cuda.memory._record_memory_history(max_entries=N));
 * off unless asked, and one 48-byte store per event when on. max_events 0
 * turns it off and drops what was kept. -1 if the ring cannot be had. */
typedef enum { TK_AEV_ALLOC = 0, TK_AEV_FREE, TK_AEV_SEGMENT_ALLOC, TK_AEV_SEGMENT_FREE, TK_AEV_OOM } tk_alloc_ev_kind;
typedef struct tk_alloc_event {
    uint64_t addr;        /* block or segment address (oom: 0) */
    uint64_t size;        /* rounded block size, segment size, or (oom) the bytes asked */
    uint64_t req;         /* alloc: the bytes asked; oom: capacity - reserved then; else 0 */
    uint64_t seq;         /* event number since recording started */
    const char *phase;    /* block and oom events: the phase the block was allocated in, or NULL */
    int32_t owner;        /* block and oom events: the tag's owner; segments: -1 */
    uint8_t kind;         /* tk_alloc_ev_kind */
    uint8_t cat;          /* block and oom events: the tag's category */
} tk_alloc_event;
int tk_alloc_record_history(tk_alloc *a, size_t max_events);
/* The phase of the step now ("forward", "backward", "optimizer", "eval";
 * NULL: none), kept with each block allocated from now on and in its
 * events. phase must outlive the allocator (a string literal). */
void tk_alloc_set_phase(tk_alloc *a, const char *phase);
/* The kept events, oldest first, copied to out (at most max); returns how
 * many were copied. *dropped (optional) gets how many older ones the ring
 * overwrote. */
size_t tk_alloc_history(const tk_alloc *a, tk_alloc_event *out, size_t max, uint64_t *dropped);
size_t tk_alloc_history_len(const tk_alloc *a);

/* Walks every segment (in creation order) and its blocks (in address order):
 * seg_fn once per segment, then blk_fn for each of its blocks. */
typedef struct tk_alloc_seg_info { uint64_t addr; size_t size; int small_pool; size_t live_bytes; } tk_alloc_seg_info;
typedef struct tk_alloc_blk_info {
    uint64_t addr;
    size_t size, requested;
    int live;
    tk_tag tag;
    const char *phase;    /* live blocks: the phase they were allocated in, or NULL */
} tk_alloc_blk_info;
void tk_alloc_walk(const tk_alloc *a, void (*seg_fn)(void *ud, const tk_alloc_seg_info *s),
                   void (*blk_fn)(void *ud, const tk_alloc_blk_info *b), void *ud);

/* ---- GPU profiles ------------------------------------------------------ */

typedef struct tk_gpu_profile {
    const char *name;          /* "t4" */
    const char *long_name;     /* "NVIDIA Tesla T4" */
    size_t capacity;           /* usable bytes as PyTorch reports them */
    size_t context_overhead;   /* CUDA context + library kernels to expect */
    double fp32_flops, fp16_flops, bf16_flops; /* peak FLOP/s of a mixed-precision step */
    double bandwidth;          /* bytes/s */
    int cc_major, cc_minor;
    const char *source;        /* where `capacity` was read, with its date, or what is not known */
    int gpus;                  /* cards of this kind in one machine (t4x2: 2); capacity is per card */
    int sm_count;              /* streaming multiprocessors (PyTorch sizes its reductions' grids by them) */
    int threads_per_sm;        /* resident threads per SM, by compute capability */
    double tf32_flops;         /* dense TF32 tensor-core FLOP/s (the fp32 rate where there is no TF32) */
    const char *peak_source;   /* where the FLOP/s figures were read */
} tk_gpu_profile;

/* The card's dense peak FLOP/s for a step's precision ("fp32", "tf32",
 * "fp16", "bf16"): the denominator of MFU; 0 for an unknown precision. */
double tk_gpu_profile_peak(const tk_gpu_profile *p, const char *precision);
/* The one-card profile whose long name is the device's own name, compared
 * case-insensitively without a leading "NVIDIA " ("Tesla T4" -> t4, "NVIDIA
 * H200" -> h200); NULL for any other card (an H200 NVL is not the SXM). */
const tk_gpu_profile *tk_gpu_profile_by_device(const char *device_name);


/* The cuda backend's device buffers. They are taken through the device's
 * caching allocator, tag `workspace`, when a card's device opens
 * (tk_dev_opts.card_buffers; always on cuda), so every plan for a card holds
 * them and CUPTI sees nothing of the backend's outside the allocator:
 *  - the GEMM workspace, owner "cublas": the one buffer cuBLAS and cuBLASLt
 *    work in (32 MiB, NVIDIA's recommended size for Hopper; taken on every
 *    card so a plan does not depend on the card);
 *  - the kernels' scratch, owner "cuda.scratch": one double per block of a
 *    two-pass sum, then the sticky error word. */
#define TK_CUDA_WORKSPACE_BYTES ((size_t)32 << 20)
#define TK_CUDA_RED_BLOCKS 1024
#define TK_CUDA_SCRATCH_BYTES (TK_CUDA_RED_BLOCKS * sizeof(double) + sizeof(unsigned))
/* What the CUDA libraries hold on the card outside every buffer txkernel
 * gives them, by architecture, where a card showed it (gpu/profile.c says
 * where each figure was seen); `source` (may be NULL) gets that line. */
size_t tk_cuda_library_own_bytes(int cc_major, int cc_minor, const char **source);

/* Looks up a profile by name (case-insensitive); NULL if unknown. Borrowed. */
const tk_gpu_profile *tk_gpu_profile_find(const char *name);
const tk_gpu_profile *tk_gpu_profile_at(int i); /* NULL past the end */
/* The profiles of the cards a platform hands out: "colab" (2026: T4, L4,
 * A100-40, A100-80, H100-80, RTX PRO 6000), "kaggle" (T4, P100, RTX PRO
 * 6000), "colab-2020" (the seed's runtime: K80, P4, T4, P100, V100-16), or
 * "all" (every profile). Fills out[0..max) with borrowed pointers; returns
 * how many, or -1 for an unknown platform. */
int tk_gpu_platform_cards(const char *platform, const tk_gpu_profile **out, int max);
/* The first of colab, kaggle, colab-2020 whose list holds the card (a P4 or
 * K80: colab-2020), else NULL. */
const char *tk_gpu_platform_of(const tk_gpu_profile *card);
/* "colab, kaggle, colab-2020 or all": the accepted names, for messages. */
const char *tk_gpu_platform_names(void);
/* 1 when 16-bit training is faster than fp32 on the card (tensor cores);
 * 0 where fp16 only saves memory (K80, P4, P100). */
int tk_gpu_profile_fast_fp16(const tk_gpu_profile *p);
/* The card's one usable capacity: what the caching allocator can take on
 * it, i.e. capacity (the total PyTorch prints) less the context overhead
 * (the CUDA context and library kernels: the profile's default) and less
 * what the CUDA libraries hold outside every buffer they are given
 * (tk_cuda_library_own_bytes). The cuda backend's own buffers are inside:
 * they come from the allocator. Plans, --gpus, --max-batch and the
 * OOM-message diagnosis all use this figure. */
size_t tk_gpu_profile_budget(const tk_gpu_profile *p);
/* Parses "7.43GiB", "15GB", "800MiB", "1234567" into bytes; 0 on success. */
int tk_parse_bytes(const char *s, size_t *out);
/* Formats bytes as PyTorch does: "24.00 MiB". Returns buf. */
char *tk_format_bytes(size_t bytes, char *buf, size_t n);

/* ---- devices ------------------------------------------------------------- */

typedef enum { TK_DEV_META = 0, TK_DEV_CPU, TK_DEV_CUDA } tk_dev_kind;

typedef struct tk_dev_info {
    tk_dev_kind kind;
    char name[128];           /* "cpu", "meta", "NVIDIA Tesla T4" */
    size_t total, free_bytes; /* what the device says (cpu: simulated capacity) */
    int simulated;            /* 1: capacity is simulated (cpu, meta) */
    int cc_major, cc_minor;
    char driver[64], runtime[64];
} tk_dev_info;

/* Cost counters: what the ops issued so far would cost. */
typedef struct tk_cost {
    double flops;        /* floating-point operations */
    double bytes;        /* bytes read + written by ops */
    double attn_flops;   /* of which in fused attention (tk_op_attention_*) */
    uint64_t n_ops;
} tk_cost;

typedef struct tk_dev tk_dev;

typedef struct tk_dev_opts {
    tk_dev_kind kind;
    size_t capacity;          /* 0: device's real free memory (cuda) or unlimited (cpu/meta) */
    int threads;              /* cpu: 0 = all cores */
    int cuda_device;          /* cuda: device ordinal */
    int card_buffers;         /* 1: take the cuda backend's buffers (TK_CUDA_WORKSPACE_BYTES, then
                                 TK_CUDA_SCRATCH_BYTES) through the allocator as the device opens, as
                                 a card does: set on meta and cpu for a plan or a simulation of a
                                 card's run (tk_config_on_card); cuda takes them whatever it says */
} tk_dev_opts;

/* Opens a device. For TK_DEV_CUDA the plugin is loaded with dlopen; when it is
 * absent or finds no GPU this returns NULL with a message saying why (callers
 * fall back to cpu and print that one line). New reference. */
tk_dev *tk_dev_new(const tk_dev_opts *opts, tk_err *err);
void tk_dev_destroy(tk_dev **pd);
tk_dev_kind tk_dev_kind_of(const tk_dev *d);
tk_alloc *tk_dev_alloc(tk_dev *d);              /* borrowed */
void tk_dev_info_get(tk_dev *d, tk_dev_info *out);
const tk_oom *tk_dev_last_oom(const tk_dev *d); /* borrowed; NULL if none yet */
/* The card's buffers a device took as it opened (tk_dev_opts.card_buffers;
 * 0 and 0 when none): their blocks, and the segments taken for them. A plan
 * for the card holds both, so what a run has free beside them is the
 * device's free plus those segments. */
void tk_dev_card_buffers(const tk_dev *d, size_t *allocated, size_t *reserved);
/* The last error an op reported (ops take no tk_err: a TK_EINVAL from a
 * tk_op_* call says what was wrong here). Borrowed; NULL if none yet. */
const tk_err *tk_dev_last_err(const tk_dev *d);
void tk_dev_cost_get(const tk_dev *d, tk_cost *out);
void tk_dev_cost_reset(tk_dev *d);
/* Waits for all queued work (cuda); no-op elsewhere. */
tk_status tk_dev_sync(tk_dev *d, tk_err *err);

/* Device memory as the cuda plugin sees it (CUPTI's records, the allocator's
 * segments, the plugin's own buffers). Declared here, not in the plugin's
 * header, so the layers above gpu/ read it without knowing the plugin. */
#define TK_CUDA_MAX_SOURCES 16

typedef struct tk_cuda_mem_totals {
    int cupti_active;            /* 1: CUPTI records device memory; 0: see cupti_error */
    char cupti_error[256];       /* why CUPTI is off (e.g. another profiler subscribed) */
    size_t device_live;          /* CUPTI: device bytes allocated and not yet freed */
    size_t device_peak;          /* CUPTI: highest device_live since open */
    size_t segments_live;        /* bytes in segments held by the caching allocator */
    size_t segments_peak;
    size_t plugin_bytes;         /* what the plugin itself allocates outside the allocator: 0 (its
                                    buffers are allocator blocks); kept so a reader can hold it to 0 */
    size_t workspace_bytes;      /* the GEMM workspace the plugin was given (inside the allocator) */
    size_t outside_allocator;    /* device_live - segments_live (without CUPTI: plugin_bytes) */
    size_t device_total, device_free; /* cudaMemGetInfo now: total - free - device_live is what
                                        no allocation record covers (the CUDA context, module
                                        code, and other processes on the same GPU) */
    uint64_t n_alloc_records, n_free_records;
    uint64_t dropped_records;    /* CUPTI records lost for lack of buffer space */
    uint64_t n_kernels;          /* kernels CUPTI timed */
    double kernel_ns;            /* their total duration */
    int n_sources;
    struct {
        char name[64];           /* the library that asked, e.g. "libcublasLt.so.13" */
        size_t live, peak;
    } sources[TK_CUDA_MAX_SOURCES];
} tk_cuda_mem_totals;

/* The totals of device d's cuda plugin (it waits for the device and flushes
 * CUPTI's buffers first). TK_EINVAL (err says so) when d is not a cuda
 * device. Works, with cupti_active = 0, when CUPTI could not be enabled. */
tk_status tk_dev_cuda_mem_totals(tk_dev *d, tk_cuda_mem_totals *out, tk_err *err);
/* Starts the device's peaks afresh from what is live now (a run then
 * reports its own peak). */
tk_status tk_dev_cuda_mem_reset_peak(tk_dev *d, tk_err *err);

/* ---- tensors ------------------------------------------------------------ */

#define TK_MAX_DIMS 4
typedef struct tk_tensor {
    void *data;              /* device address (fake on meta) */
    int64_t shape[TK_MAX_DIMS];
    int ndim;
    tk_dtype dtype;
    tk_tag tag;
    int owns;                /* 1: data is an allocator block this tensor frees */
} tk_tensor;

/* Elements in t's shape (0 for NULL). Inline: backends count without
 * calling into the device layer that holds them. */
static inline int64_t tk_tensor_numel(const tk_tensor *t) {
    if (!t) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
size_t tk_tensor_nbytes(const tk_tensor *t);

/* Allocates a tensor of the given shape through the device's allocator.
 * On TK_EOOM the tensor is left empty (data NULL) and tk_dev_last_oom() holds
 * the record; `err` says it in words. */
tk_status tk_tensor_alloc(tk_dev *d, tk_tensor *t, tk_dtype dt, int ndim, const int64_t *shape,
                          tk_cat cat, const char *owner, tk_err *err);
/* Frees an owning tensor (no-op on empty or view) and zeroes it. */
void tk_tensor_free(tk_dev *d, tk_tensor *t);

/* Tensor tracking: off by default (it costs a list walk per free). When on,
 * the device keeps its live owning tensors and a copy of them as they were
 * when `allocated` last reached its peak, so a report can name the tensors
 * behind the peak with their shapes. Turn it on before the first tensor. */
typedef struct tk_tensor_info {
    char owner[128];
    tk_cat cat;
    tk_dtype dtype;
    int ndim;
    int64_t shape[TK_MAX_DIMS];
    size_t bytes;                 /* the tensor's bytes */
    size_t block;                 /* the allocator's block for it (rounded; what counts in allocated) */
} tk_tensor_info;
tk_status tk_dev_track_tensors(tk_dev *d, tk_err *err);
/* The tensors live at the peak, largest first, at most max of them; returns
 * how many were written (0 when tracking is off). */
int tk_dev_tensors_at_peak(const tk_dev *d, tk_tensor_info *out, int max);
/* A non-owning view of `numel` elements of t starting at element `offset`,
 * as a 1-D tensor; reshape by setting shape/ndim. */
tk_tensor tk_tensor_view(const tk_tensor *t, int64_t offset, int64_t numel);

/* Host <-> device copies (meta: no-op). Sizes are the tensor's bytes. */
tk_status tk_tensor_write(tk_dev *d, tk_tensor *t, const void *host, tk_err *err);
tk_status tk_tensor_read(tk_dev *d, const tk_tensor *t, void *host, tk_err *err);
/* Reads any float dtype into fp32 host memory (n = numel). */
tk_status tk_tensor_read_f32(tk_dev *d, const tk_tensor *t, float *host, tk_err *err);
/* Writes fp32 host values into any float dtype tensor. */
tk_status tk_tensor_write_f32(tk_dev *d, tk_tensor *t, const float *host, tk_err *err);

/* ---- operations ---------------------------------------------------------
 * Row-major. Float tensors may be f32, f16 or bf16 unless said otherwise;
 * arithmetic is fp32 (on cuda, GEMMs use tensor cores for 16-bit inputs with
 * fp32 accumulation). Each op adds its FLOPs and bytes to the device's cost
 * counters, on every backend; on meta it does nothing else. Sizes in element
 * counts. "accumulates" means the output is added to, not overwritten. */

/* The shape and scaling of a (batched) GEMM, every field named where it is
 * used: `&(tk_gemm){ .m = rows, .n = O, .k = I, .trans_b = 1, .batch = 1,
 * .alpha = 1.0f }`. Fields left out are 0 (no transpose, no stride, beta 0:
 * C is overwritten, no bias gradient, no TF32); batch and alpha have no
 * default worth having, so write them. */
typedef struct tk_gemm {
    int64_t m, n, k;                      /* op(A) is m×k, op(B) k×n, C m×n */
    int trans_a, trans_b;                 /* A is stored K×M / B is stored N×K */
    int64_t batch;                        /* matrices (0: none) */
    int64_t stride_a, stride_b, stride_c; /* elements between consecutive batch matrices */
    float alpha, beta;                    /* C = alpha op(A) op(B) + beta C */
    /* The bias gradient of a linear layer's weight GEMM (batch 1), in the
     * same pass: bgrad[i] += sum_k op(A)[i, k] (f32, m elements); bgrad_tmp
     * is f32 scratch of m elements the op may overwrite (cuBLASLt writes its
     * sum there before it is added), NULL when bgrad is. */
    tk_tensor *bgrad, *bgrad_tmp;
    int tf32;                             /* f32 inputs may round to TF32 on tensor cores (cuda);
                                             0: full f32, as PyTorch's default matmul */
} tk_gemm;

/* C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] (+ bias[n] on every row if
 * bias != NULL), for b < g->batch, with g's shape (tk_gemm), and g->bgrad's
 * bias gradient when asked. The bias is added to the f32 product before C's
 * one rounding (cuda: the cuBLASLt epilogue). bias is f32 or C's dtype. */
tk_status tk_op_gemm(tk_dev *d, tk_tensor *C, const tk_tensor *A, const tk_tensor *B,
                     const tk_tensor *bias, const tk_gemm *g);

/* out[i,:] = table[ids[i],:], ids i32 of n rows, C columns. */
tk_status tk_op_embed_fwd(tk_dev *d, tk_tensor *out, const tk_tensor *ids, const tk_tensor *table,
                          int64_t n, int64_t C);
/* dtable[ids[i],:] += dout[i,:] (accumulates; deterministic order).
 * Without groups the rows are added one by one in row order. With groups
 * (i32, tk_embed_groups_numel(n) elements, filled by tk_embed_groups_build
 * from the same ids) each table row has one writer: its rows, in row order,
 * are summed TK_EMBED_CHUNK at a time from zero, and the chunk sums are
 * added to the row in chunk order; scratch (f32,
 * tk_embed_bwd_scratch_numel(n, C) elements) holds the chunk sums of rows
 * that have more than one chunk. The same groups give the same bits on
 * every backend and every run. */
tk_status tk_op_embed_bwd(tk_dev *d, tk_tensor *dtable, const tk_tensor *ids, const tk_tensor *dout,
                          int64_t n, int64_t C, const tk_tensor *groups, tk_tensor *scratch);

/* Rows per chunk of the grouped embedding backward (part of its arithmetic:
 * it fixes the order of the additions). */
#define TK_EMBED_CHUNK 64
/* Elements of the i32 groups tensor for n ids, and of its f32 scratch for n
 * ids of C columns. Shapes only, so meta plans them. */
static inline int64_t tk_embed_groups_numel(int64_t n) { return 5 * n + 6; }
static inline int64_t tk_embed_bwd_scratch_numel(int64_t n, int64_t C) {
    return (2 * n / TK_EMBED_CHUNK + 1) * C;
}
/* Fills out (tk_embed_groups_numel(n) elements) from n host ids: the
 * table rows that occur and, for each, its rows of ids in order, cut into
 * chunks of TK_EMBED_CHUNK (rows with several chunks first). Layout:
 *   [0] G rows that occur, [1] NC chunks, [2] NM chunks of rows with several,
 *   [3] GM rows with several chunks;
 *   then row[G] (the table row), first[G + 1] (its first chunk),
 *   start[NC + 1] (each chunk's first position in `order`), owner[NC]
 *   (the group of each chunk), order[n] (positions in ids, grouped).
 * Groups with several chunks come first, then by table row; chunks are in
 * group order, so chunk c < NM has its partial sum in scratch row c.
 * Returns 0, -1 when an id is outside [0, rows) (rows < 0: unchecked), -2
 * when out of host memory. The sizes: a group owns at most n chunks and
 * there are at most n groups, so 5n + 6 elements hold the layout; a group
 * of s > K positions has ceil(s / K) < 2s / K chunks, so fewer than 2n / K
 * chunks need a scratch row. */
int tk_embed_groups_build(int32_t *out, const int32_t *ids, int64_t n, int64_t rows);

/* out = a + b (n elements; out may alias a or b). */
tk_status tk_op_add(tk_dev *d, tk_tensor *out, const tk_tensor *a, const tk_tensor *b, int64_t n);
/* y = alpha * x + beta * y. */
tk_status tk_op_axpby(tk_dev *d, tk_tensor *y, float alpha, const tk_tensor *x, float beta, int64_t n);
/* Fills n elements with value. */
tk_status tk_op_fill(tk_dev *d, tk_tensor *t, float value, int64_t n);
/* Fills every element of each of the n tensors (float dtypes) with value:
 * all of a model's gradients zeroed by one launch. */
tk_status tk_op_fill_many(tk_dev *d, tk_tensor *const *ts, int n, float value);
/* Copies n elements converting dtype (f32/f16/bf16 in any direction). */
tk_status tk_op_cast(tk_dev *d, tk_tensor *out, const tk_tensor *in, int64_t n);

/* LayerNorm over the last dim C of N rows. mean, rstd: f32 [N]. */
tk_status tk_op_layernorm_fwd(tk_dev *d, tk_tensor *out, tk_tensor *mean, tk_tensor *rstd,
                              const tk_tensor *in, const tk_tensor *w, const tk_tensor *b,
                              int64_t N, int64_t C, float eps);
/* r = dropout(x) + res (r may alias x or res; dropout as tk_op_dropout_fwd
 * at offset, p = 0 copies), then out = LayerNorm(r) as tk_op_layernorm_fwd,
 * in one pass: the residual branch and the norm of a transformer block.
 * Rounds as the three ops in sequence would (each result to its tensor's
 * dtype). */
tk_status tk_op_residual_layernorm_fwd(tk_dev *d, tk_tensor *r, tk_tensor *out, tk_tensor *mean,
                                       tk_tensor *rstd, const tk_tensor *x, const tk_tensor *res,
                                       const tk_tensor *w, const tk_tensor *b, int64_t N, int64_t C,
                                       float eps, float p, uint64_t seed, uint64_t offset);
/* din = ... (overwrites din, or accumulates into it when accumulate != 0);
 * dw, db accumulate. scratch (f32, tk_layernorm_bwd_scratch_numel(N, C)
 * elements, may be NULL) holds per-row-group partial sums of dw and db, so a
 * backend computes din, dw and db in one pass over the rows and then adds
 * the groups in a fixed order (no atomics). */
tk_status tk_op_layernorm_bwd(tk_dev *d, tk_tensor *din, tk_tensor *dw, tk_tensor *db,
                              const tk_tensor *dout, const tk_tensor *in, const tk_tensor *w,
                              const tk_tensor *mean, const tk_tensor *rstd,
                              int64_t N, int64_t C, int accumulate, tk_tensor *scratch);
/* Row groups of tk_op_layernorm_bwd's partial sums for N rows, and the
 * scratch elements for N rows of C (2 * C per group). Shapes only. */
#define TK_LN_BWD_GROUPS 1024
static inline int64_t tk_layernorm_bwd_groups(int64_t N) { return N < TK_LN_BWD_GROUPS ? N : TK_LN_BWD_GROUPS; }
static inline int64_t tk_layernorm_bwd_scratch_numel(int64_t N, int64_t C) {
    return tk_layernorm_bwd_groups(N) * 2 * C;
}

/* GELU (erf form, as HF BERT). */
tk_status tk_op_gelu_fwd(tk_dev *d, tk_tensor *out, const tk_tensor *in, int64_t n);
tk_status tk_op_gelu_bwd(tk_dev *d, tk_tensor *din, const tk_tensor *in, const tk_tensor *dout, int64_t n);
/* tanh (pooler). bwd uses the forward output. */
tk_status tk_op_tanh_fwd(tk_dev *d, tk_tensor *out, const tk_tensor *in, int64_t n);
tk_status tk_op_tanh_bwd(tk_dev *d, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout, int64_t n);

/* Attention softmax: for each of B*NH*T rows of length T,
 * out = softmax(scale * in + maskbias), where maskbias[b, j] = 0 for kept keys
 * and -inf-like (-1e4 as HF uses finfo.min) where mask (i32 [B,T]) is 0.
 * Rows are laid out (B, NH, T, T). */
tk_status tk_op_softmax_fwd(tk_dev *d, tk_tensor *out, const tk_tensor *in, const tk_tensor *mask,
                            int64_t B, int64_t NH, int64_t T, float scale);
/* din = scale * out * (dout - sum(dout * out)) per row. */
tk_status tk_op_softmax_bwd(tk_dev *d, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout,
                            int64_t rows, int64_t T, float scale);

/* Standard attention's probabilities and their dropout in one pass:
 * P = tk_op_softmax_fwd's result (P may alias in), PD = dropout(P) as
 * tk_op_dropout_fwd over the (B,NH,T,T) elements at offset (PD NULL when
 * p == 0). Rounds as the two ops in sequence would. */
tk_status tk_op_softmax_dropout_fwd(tk_dev *d, tk_tensor *P, tk_tensor *PD, const tk_tensor *in,
                                    const tk_tensor *mask, int64_t B, int64_t NH, int64_t T, float scale,
                                    float p, uint64_t seed, uint64_t offset);
/* Its backward: din = tk_op_softmax_bwd(P, tk_op_dropout_bwd(dPD)) over rows
 * of T (din may alias dPD), rounded as the two ops in sequence. */
tk_status tk_op_softmax_dropout_bwd(tk_dev *d, tk_tensor *din, const tk_tensor *P, const tk_tensor *dPD,
                                    int64_t rows, int64_t T, float scale, float p, uint64_t seed,
                                    uint64_t offset);

/* Dropout with a counter-based generator: element i is kept when
 * hash(seed, offset + i) >= p; kept values are scaled by 1/(1-p). mask (u8,
 * may be NULL) records what was kept. p == 0 copies. The same (seed, offset)
 * gives the same mask on every backend, so recompute reproduces it. */
tk_status tk_op_dropout_fwd(tk_dev *d, tk_tensor *out, tk_tensor *mask, const tk_tensor *in,
                            int64_t n, float p, uint64_t seed, uint64_t offset);
tk_status tk_op_dropout_bwd(tk_dev *d, tk_tensor *din, const tk_tensor *dout, int64_t n,
                            float p, uint64_t seed, uint64_t offset);

/* Softmax cross-entropy over N rows of V logits. labels i32 [N]; a label < 0
 * is ignored (as HF's -100). losses f32 [N] (0 for ignored rows), probs [N,V]
 * may be NULL in fwd. */
tk_status tk_op_xent_fwd(tk_dev *d, tk_tensor *losses, tk_tensor *probs, const tk_tensor *logits,
                         const tk_tensor *labels, int64_t N, int64_t V);
/* dlogits = scale * (softmax(logits) - onehot(label)), 0 for ignored rows. */
tk_status tk_op_xent_bwd(tk_dev *d, tk_tensor *dlogits, const tk_tensor *logits,
                         const tk_tensor *labels, int64_t N, int64_t V, float scale);

/* db[c] += sum over N rows of dout[n, c]. */
tk_status tk_op_bias_grad(tk_dev *d, tk_tensor *db, const tk_tensor *dout, int64_t N, int64_t C);

/* (B,T,NH,HS) -> (B,NH,T,HS) and back. */
tk_status tk_op_split_heads(tk_dev *d, tk_tensor *out, const tk_tensor *in,
                            int64_t B, int64_t T, int64_t NH, int64_t HS);
tk_status tk_op_merge_heads(tk_dev *d, tk_tensor *out, const tk_tensor *in,
                            int64_t B, int64_t T, int64_t NH, int64_t HS);

/* Gathers rows: out[i,:] = in[idx[i],:] for n rows of C (idx i32). Used for the
 * [CLS] token and SQuAD positions. */
tk_status tk_op_gather_rows(tk_dev *d, tk_tensor *out, const tk_tensor *in, const tk_tensor *idx,
                            int64_t n, int64_t C);
/* din[idx[i],:] += dout[i,:]. */
tk_status tk_op_scatter_add_rows(tk_dev *d, tk_tensor *din, const tk_tensor *dout,
                                 const tk_tensor *idx, int64_t n, int64_t C);

/* out (f32, 1 element) = sum of squares of x (n elements), accumulated into
 * out when accumulate != 0. Also reports non-finite values via the sum. */
tk_status tk_op_sumsq(tk_dev *d, tk_tensor *out, const tk_tensor *x, int64_t n, int accumulate);
/* out (f32, 1 element) = the sum of squares of every element of the n
 * tensors, summed in f64 in an order fixed by their sizes (the same bits on
 * every run), rounded once. */
tk_status tk_op_sumsq_many(tk_dev *d, tk_tensor *out, const tk_tensor *const *xs, int n);

/* Memory-efficient ("fused") attention for B sequences, NH heads, T
 * positions, head size HS: out = dropout(softmax(scale * q k^T + maskbias)) v
 * with maskbias as tk_op_softmax_fwd's (mask i32 [B,T], may be NULL).
 *
 * Layout: every tensor is (B, T, NH, HS), the layout of the Q, K and V
 * projections' outputs and of the attention output dense's input, so no
 * head transposes surround the op. Element (b, t, h, c) of q, k, v, dq, dk
 * and dv is at (b*T + t)*ld + h*HS + c (ld >= NH*HS: NH*HS for tensors of
 * their own, 3*NH*HS for slices of one fused QKV projection's (B*T, 3*NH*HS)
 * output, each its own view), of out and dout at (b*T + t)*NH*HS + h*HS + c.
 * Any float dtype, arithmetic in f32.
 *
 * The (T,T) probabilities are never stored: forward keeps only out and lse
 * (f32 [B*NH*T], element (b*NH + h)*T + t: each query row's log-sum-exp of
 * its scaled, masked scores); backward rebuilds each probability from q, k
 * and lse (FlashAttention's recurrence: dS = P * (dP - rowsum(dout * out))).
 * Dropout (p > 0) on the probabilities uses the tk_op_dropout generator with
 * element index offset + ((b*NH + h)*T + i)*T + j (query i, key j) — the
 * mask standard attention gets from tk_op_dropout_fwd over the (B,NH,T,T)
 * probabilities at that offset. keep (u8, tk_attn_keep_bytes(B, NH, T);
 * p > 0 only) holds those decisions bit-packed (tk_ops_spec.h's layout,
 * the tensor-core forward's fragment order): forward writes it when given
 * one (NULL: a forward whose activations are not kept for backward), and
 * backward, which needs it when p > 0, reads it instead of hashing every
 * element again (every backend: the cpu backend fills it and reads its own
 * forward's decisions from it too; cuda's reference kernel fills it and
 * hashes). dq, dk, dv are overwritten. No backend must
 * provide them: a device whose backend lacks them fails with TK_EINVAL (meta
 * counts costs only). On cuda, which kernel runs is tk_attn_kernel.h's rule. */
typedef struct tk_attn {
    int64_t B, NH, T, HS;
    int64_t ld;            /* row stride of q, k, v, dq, dk, dv (elements); 0: NH*HS */
    float scale, p;        /* scores scale; dropout rate of the probabilities */
    uint64_t seed, offset; /* the dropout generator's, as tk_op_dropout_fwd */
} tk_attn;

tk_status tk_op_attention_fwd(tk_dev *d, tk_tensor *out, tk_tensor *lse, tk_tensor *keep,
                              const tk_tensor *q, const tk_tensor *k, const tk_tensor *v,
                              const tk_tensor *mask, const tk_attn *a);
tk_status tk_op_attention_bwd(tk_dev *d, tk_tensor *dq, tk_tensor *dk, tk_tensor *dv,
                              const tk_tensor *dout, const tk_tensor *q, const tk_tensor *k,
                              const tk_tensor *v, const tk_tensor *out, const tk_tensor *lse,
                              const tk_tensor *keep, const tk_tensor *mask, const tk_attn *a);
/* Bytes of the fused attention's keep mask for B sequences of T, NH heads:
 * B*NH*T*T/8 when 64 divides T (tiles of 64 x 64 elements, the last padded). */
int64_t tk_attn_keep_bytes(int64_t B, int64_t NH, int64_t T);

/* AdamW (decoupled weight decay, bias-corrected). param f32 master; grad any
 * float dtype, multiplied by grad_scale first; m, v f32. step >= 1. */
typedef struct tk_adamw_hp {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int64_t step;
} tk_adamw_hp;
tk_status tk_op_adamw(tk_dev *d, tk_tensor *param, const tk_tensor *grad, tk_tensor *m, tk_tensor *v,
                      int64_t n, const tk_adamw_hp *hp);
/* One AdamW step over many parameters (a parameter table, one launch on
 * cuda): item i updates items[i].n elements of its param, grad, m and v
 * (views) exactly as tk_op_adamw with hp would, weight decay 0 when
 * no_decay. */
typedef struct tk_adamw_item {
    tk_tensor param, grad, m, v; /* views: param, m, v f32; grad any float dtype */
    int64_t n;
    int no_decay;
} tk_adamw_item;
tk_status tk_op_adamw_many(tk_dev *d, const tk_adamw_item *items, int n_items, const tk_adamw_hp *hp);
/* 8-bit AdamW: m (i8) and v (u8) block-wise quantised with per-block f32
 * absmax scales (mscale, vscale: ceil(n / TK_Q8_BLOCK) elements). */
#define TK_Q8_BLOCK 256
tk_status tk_op_adamw8(tk_dev *d, tk_tensor *param, const tk_tensor *grad,
                       tk_tensor *m, tk_tensor *mscale, tk_tensor *v, tk_tensor *vscale,
                       int64_t n, const tk_adamw_hp *hp);

#ifdef __cplusplus
}
#endif
#endif
