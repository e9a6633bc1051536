/* tk_torchplan.h — how PyTorch would allocate this: a transformers BERT
 * training step planned in PyTorch's own terms (`engine: pytorch`).
 *
 * txkernel's planner (bert/tk_plan.h) runs txkernel's own step. This module
 * plans the step a user's PyTorch + transformers run makes for the same
 * config: a BertForSequenceClassification (task: classify) or
 * BertForQuestionAnswering (task: qa) training step, tensor by tensor, as
 * PyTorch's autograd keeps and frees them (what each op saves for backward,
 * what it allocates for a moment, the order backward frees them in), through
 * txkernel's caching allocator with PyTorch's rounding, pools and splitting.
 *
 * The loop planned is the plain PyTorch one: zero_grad(set_to_none=True), a
 * fresh batch (input_ids, token_type_ids, attention_mask all ones, labels),
 * `accumulate` forward/backward passes, optimizer.step(); no gradient
 * clipping. Two steps are planned: the first (AdamW's state is created) and a
 * steady one, whose peak is what torch.cuda.max_memory_allocated() reports
 * with the peak statistics reset just before it.
 *
 * Versions followed: torch 2.x with transformers 5.x (checked against
 * torch 2.15 + transformers 5.24 on the CPU, tests/torchplan/), or, with
 * `torch_version: 1.13`, torch 1.13 + transformers 4.40, which run BERT's
 * attention eagerly only; or `torch_version: 1.10`, torch 1.10 +
 * transformers 4.15 (what HF's published V100 figures ran on): 1.13's rules,
 * softmax keeping its input for backward too, and the Trainer's own AdamW.
 *
 * The worst batch: batch_size x max_len, or with batching: dynamic (HF's
 * DataCollatorWithPadding) or buckets (the Trainer's group_by_length) and
 * the corpus' token lengths, batch_size x the longest example
 * (tk_plan_worst_len, the one rule every planner of a config follows).
 *
 * Two or more GPUs (gpu: t4x2, or world_size; `parallel`): each GPU is
 * planned. DistributedDataParallel: each rank the one-GPU step plus the
 * reducer's gradient buckets and DDP's broadcasts. DataParallel (what the
 * Trainer does on two GPUs without a launcher): GPU 0 keeps the model, its
 * gradients, AdamW's state and the whole batch, and gets every replica's
 * gradient summed onto it; each other GPU gets a copy of the parameters
 * each forward and its share of the batch. DeepSpeed ZeRO-2: the model
 * states by DeepSpeed's own estimate, the activations as planned here.
 *
 * What is checked and what is not: device: cpu is held against PyTorch's
 * own allocator events on the CPU (tests/torchplan/test_torchplan_grid.py),
 * DDP against two gloo ranks of PyTorch itself there; DataParallel and
 * ZeRO-2 cannot run here and say "not measured".
 * device: cuda (or a gpu: card) follows PyTorch's CUDA kernels as their
 * sources describe them (a 1-byte dropout mask, SDPA's flash or efficient
 * kernel, foreach AdamW, the cuBLAS workspace from the caching allocator);
 * those choices are checked only where a GPU run was recorded
 * (bench/RESULTS.md).
 */
#ifndef TK_TORCHPLAN_H
#define TK_TORCHPLAN_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "tk_gpu.h"
#include "tk_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One GPU's figures in a plan over several (alike GPUs share a row). */
typedef struct tk_torchplan_gpu {
    char who[64];                  /* "GPU 0", "GPU 1", "each of the 2 ranks" */
    size_t peak_allocated, first_step_peak_allocated, peak_reserved, device_used;
    int n_workspaces;              /* cuBLAS workspaces kept on it: its forward thread's and autograd's */
    int fits;
} tk_torchplan_gpu;

typedef struct tk_torchplan_result {
    int batch, seq, accumulate;
    int on_cuda;                   /* 1: the step as it runs on a CUDA device */
    const char *device;            /* "cpu" | "cuda" */
    const char *torch_version;     /* "2.x" | "2.0" .. "2.15" | "1.13" | "1.10" */
    const char *transformers_version; /* "5.x" | "4.40" | "4.15" */
    const char *attention;         /* "eager", "sdpa (cpu flash)", "sdpa (math)", "sdpa (flash)", "sdpa (efficient)" */
    const char *optimizer;         /* "AdamW (single-tensor)", "AdamW (foreach)", "AdamW (fused)", "AdamW8bit (bitsandbytes)" */
    const char *precision;         /* "fp32", "bf16 autocast", "fp16 autocast + GradScaler" */
    size_t peak_allocated;         /* the steady step's */
    size_t first_step_peak_allocated;
    size_t peak_reserved;          /* over both steps (the cache keeps step 1's segments) */
    size_t workspace_bytes;        /* cuda: one cuBLAS workspace (W), per handle and stream */
    int n_workspaces;              /* cuda: the Ws kept at the end of the step (forward's and autograd's
                                      threads; 0 when the version frees them per GEMM) */
    size_t lt_workspace_bytes;     /* cuda: cuBLASLt's workspaces kept at the end (0: per call or shared) */
    size_t outside_bytes;          /* cuda: what cuBLAS holds outside the allocator (torch 1.x's own pools),
                                      counted in device_used */
    const char *workspaces;        /* cuda: where this version keeps them, with its source */
    size_t context_bytes;          /* cuda: the card's CUDA context (outside the allocator) */
    size_t device_used;            /* peak_reserved + context: what nvidia-smi shows */
    size_t capacity;               /* the card's (0: none) */
    int fits;                      /* device_used <= capacity (or no capacity) */
    size_t param_bytes, grad_bytes, optim_bytes;
    size_t by_cat_at_peak[TK_CAT_COUNT];
    int64_t n_params, n_trainable;
    char gpu[32];                  /* the card planned for ("" none) */
    char seq_from[160];            /* where seq came from: max_len, or the data's longest example */
    /* two or more GPUs: each GPU's figures (the ones above are the fullest
     * GPU's: the largest device_used) */
    int world_size;                /* GPUs (ranks); 1: one */
    const char *parallel;          /* "DataParallel", "DDP", "DeepSpeed ZeRO-2"; NULL with one GPU */
    const char *checked;           /* how the figures are known: checked against PyTorch, or "not measured: ..." */
    int n_gpu_rows;
    tk_torchplan_gpu gpu_rows[2];
} tk_torchplan_result;

/* Plans config `c` (engine: pytorch is implied; its model is resolved from
 * the preset or folder as txkernel's planner does) at batch_size x max_len.
 * Errors (TK_EINVAL) name the key: a head or option this engine does not
 * model (flatten_dense, freeze_layers, recompute: attention, fp16 on the
 * cpu, DataParallel or ZeRO-2 off CUDA, txkernel's own zero: key). The plan runs against no capacity: an over-large step is planned
 * whole, and fits says whether it would fit. */
tk_status tk_torchplan(const tk_config *c, tk_torchplan_result *out, tk_err *err);

/* The same with the corpus' token lengths (n of them; NULL/0: none): with
 * batching: dynamic or buckets the worst batch is the longest example's
 * (tk_plan_worst_len); without lengths it is max_len, and seq_from says so. */
tk_status tk_torchplan_data(const tk_config *c, const int *lengths, int n, tk_torchplan_result *out, tk_err *err);

/* The plan as data (new reference; NULL when out of host memory): engine,
 * versions, peak_allocated, first_step_peak_allocated, peak_reserved,
 * device_used and the choices made. */
json_t *tk_torchplan_json(const tk_torchplan_result *r);

/* Where a torch version keeps cuBLAS's workspace (W, one per handle and
 * stream: a training step's forward thread and autograd's device thread) and
 * cuBLASLt's (Lt, used by a Linear with a bias), on a card of compute
 * capability cc_major.cc_minor (torchplan/blas_rules.c, with its sources). */
typedef enum {
    TK_BLAS_W_OUTSIDE = 0, /* cuBLAS's own pool: not in allocated/reserved, only on the card (1.x) */
    TK_BLAS_W_KEPT,        /* from the caching allocator at the thread's first GEMM, then kept (2.0-2.14) */
    TK_BLAS_W_PER_OP       /* from the caching allocator around each GEMM, freed after it (2.15) */
} tk_blas_w_where;
typedef enum {
    TK_BLAS_LT_NONE = 0,   /* no cuBLASLt in a Linear (1.10) */
    TK_BLAS_LT_PER_CALL,   /* lt_bytes allocated and freed around each biased Linear (1.13, 2.0-2.8) */
    TK_BLAS_LT_KEPT,       /* lt_bytes per thread from its first biased Linear, kept (2.9-2.11, 2.15) */
    TK_BLAS_LT_SHARED      /* inside W: no block of its own (2.12-2.14) */
} tk_blas_lt_mode;
typedef struct tk_torch_blas {
    tk_blas_w_where where;
    size_t w_bytes;                /* one W */
    tk_blas_lt_mode lt;
    size_t lt_bytes;               /* one Lt workspace */
    const char *source;            /* the release and the lines or PRs read */
} tk_torch_blas;
void tk_torch_blas_rules(tk_torch_version v, int cc_major, int cc_minor, tk_torch_blas *out);

/* The CUDA context PyTorch itself takes on card `prof` (its kernels, cuBLAS
 * and cuDNN loaded): measured where it was, else the profile's estimate; 0
 * without a card. */
size_t tk_torchplan_context(const tk_gpu_profile *prof);

/* The versions `torch_version` follows, as a plan names its engine:
 * "engine: pytorch (torch 2.x + transformers 5.x)" and the like. */
const char *tk_torchplan_label(tk_torch_version v);

#ifdef __cplusplus
}
#endif
#endif
