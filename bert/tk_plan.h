/* tk_plan.h — the planner: what a training run will take, before it runs.
 *
 * tk_plan runs the real training-step code (model init, optimizer init,
 * forward, backward, optimizer step, then an eval step) on the META device at
 * the worst-case batch shape: batch_size x max_len, or, when corpus lengths
 * are given with dynamic padding or buckets, the longest batch. Because the
 * allocator and the allocation sequence are the real ones, the predicted
 * peak on cpu equals the measured peak byte for byte.
 *
 * The step-time estimate is a roofline-like model, not a measurement:
 * max(flops / peak_flops, bytes / bandwidth) per step from the GPU profile.
 */
#ifndef TK_PLAN_H
#define TK_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"
#include "tk_config.h"
#include "tk_model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TK_PLAN_TOP 10

/* ranks planned one by one; a larger world_size plans its first and last
 * TK_PLAN_MAX_RANKS / 2 (the pieces of the others repeat theirs) */
#define TK_PLAN_MAX_RANKS 16

typedef struct tk_plan_result {
    int batch, seq;                /* the worst-case shape planned (an epoch plan: its largest batch) */
    int epoch_steps;               /* tk_plan_epoch: the steps planned; 0 for the worst-case plan */
    size_t capacity;               /* 0: no limit known (cpu without capacity) */
    size_t context_bytes;          /* a GPU profile's context overhead, already taken
                                      off its capacity (0 with an explicit capacity) */
    size_t peak_allocated, peak_reserved;
    size_t by_cat_at_peak[TK_CAT_COUNT];
    int n_top;
    struct {
        char owner[128];
        size_t bytes;                 /* all categories */
        size_t by_cat[TK_CAT_COUNT];  /* the same bytes per category */
    } top[TK_PLAN_TOP];               /* owners at the peak, largest first */
    size_t param_bytes, grad_bytes, optim_bytes; /* steady-state totals */
    int64_t n_params, n_trainable;
    int fits;                      /* 1: peak_reserved <= capacity (or no capacity) */
    int64_t margin;                /* capacity - peak_reserved (negative: short by) */
    int oom;                       /* 1: the planned step itself ran out (oom holds it) */
    tk_oom oom_record;
    char oom_phase[32];            /* "model", "forward", "backward", "optimizer", "eval" */
    tk_cost train_step;            /* FLOPs and bytes of one optimizer step */
    tk_cost eval_step;             /* of one eval batch */
    double step_seconds;           /* roofline estimate (0 if no GPU profile) */
    char profile[32];              /* GPU profile used for the estimate */
    tk_attention attention;        /* the attention planned (tk_config_attention) */
    char attention_why[48];        /* "set in the config", "default on the cpu", TK_ATTN_WHY_* */
    char attention_kernel[192];    /* fused on a gpu: profile's card: the cuda kernel that runs it and
                                      why (gpu/tk_attn_kernel.h); "" otherwise */
    double plan_ms;                /* how long planning took */
    /* data parallelism (world_size > 1): each rank is planned on its own
     * (its pieces of the state, its micro-batches); peak_allocated and
     * peak_reserved above are the largest of any rank's, the other figures
     * are those of the rank whose reserved peak is largest (peak_rank) */
    int world_size, zero;
    int n_ranks;                   /* ranks planned: min(world_size, TK_PLAN_MAX_RANKS) */
    int peak_rank;
    int rank_of[TK_PLAN_MAX_RANKS];/* the rank rank[i] is */
    int global_batch;              /* batch x world_size x accumulate */
    struct { size_t peak_allocated, peak_reserved, param_bytes, grad_bytes, optim_bytes; } rank[TK_PLAN_MAX_RANKS];
    uint64_t comm_bytes;           /* one step's bytes sent by the largest rank (ring algorithms) */
} tk_plan_result;

/* The sequence length of the worst-case batch: max_len with fixed padding
 * (or without lengths); with dynamic padding or buckets, the longest of the
 * corpus' `lengths` (n of them), at most max_len. Every planner of a config
 * (this one, torchplan's engine: pytorch) takes its length from here. */
int tk_plan_worst_len(const tk_config *c, const int *lengths, int n);

/* tk_config_attention_fit's `fits` (bert/tk_config.h): 1 when a plan of c
 * (its attention set) at the worst-case shape (batch_size x max_len) fits its
 * capacity, else 0. u: a tk_err (may be NULL) that gets the error when c
 * cannot be planned (out of host memory, ...): the caller checks its status
 * after tk_config_attention_fit, so a failure is not taken for "no fit". */
int tk_plan_attention_fits(const tk_config *c, void *u);

/* Plans config `c`. `lengths` (may be NULL) are the corpus' token lengths
 * (n of them) for dynamic padding / buckets; otherwise batch_size x max_len.
 * A plan that runs out of the capacity is still TK_OK with fits = 0 and
 * oom = 1 (the record says where); errors are bad configs. */
tk_status tk_plan(const tk_config *c, const int *lengths, int n, tk_plan_result *out, tk_err *err);

/* Hooks into the planned run's meta device, for callers that want its
 * allocator (to record its history and write it as a PyTorch snapshot):
 * `opened` before the first allocation, `closing` after the last step (oom:
 * the device's OOM record when the planned step ran out, else NULL). Only
 * the simulation against the capacity is watched. */
typedef struct tk_plan_watch {
    void (*opened)(tk_alloc *a, void *ud);
    void (*closing)(tk_alloc *a, const tk_oom *oom, void *ud);
    void *ud;
} tk_plan_watch;
tk_status tk_plan_watched(const tk_config *c, const int *lengths, int n, const tk_plan_watch *w, tk_plan_result *out,
                          tk_err *err);

/* The run's own batches (borrowed; the meta device never reads their data). */
typedef struct tk_plan_batches {
    const tk_batch *train, *dev;
    int n_train, n_dev;
} tk_plan_batches;

/* The plan of the run's first epoch as it will happen (`txk plan --epoch`):
 * its training batches in the run's order (seed, epoch 0), every step through
 * the run's own tk_train_step (accumulation, the empty_cache policy, the
 * on_oom retry), up to max_steps, then every dev batch. Differently shaped
 * batches leave the cache fragmented as the run's do, so on cpu the peak
 * reserved of a one-epoch run is planned byte for byte, not only the peak
 * allocated. Costs are the mean step's and the mean eval batch's; batch and
 * seq the largest batch's. Slower than tk_plan by the number of steps. */
tk_status tk_plan_epoch(const tk_config *c, const tk_plan_batches *b, const tk_plan_watch *w, tk_plan_result *out,
                        tk_err *err);

/* The plan of using the model: the weights and one eval batch
 * (eval_batch_size, else batch_size) at the worst-case length, with no
 * gradients or optimizer state; the same fields, train_step zero. */
tk_status tk_plan_inference(const tk_config *c, const int *lengths, int n, tk_plan_result *out, tk_err *err);

/* The largest tensors live at the planned peak (largest first, at most max),
 * with owner, category, dtype and shape: the same plan simulated again with
 * tensor tracking on. For reports, not for searches (tracking costs a list
 * walk per free). *n_out gets the count. */
tk_status tk_plan_tensors_at_peak(const tk_config *c, const int *lengths, int n, tk_tensor_info *out, int max,
                                  int *n_out, tk_err *err);

/* tk_plan_tensors_at_peak of tk_plan_epoch's plan. */
tk_status tk_plan_epoch_tensors_at_peak(const tk_config *c, const tk_plan_batches *b, tk_tensor_info *out, int max,
                                        int *n_out, tk_err *err);

/* Human-readable summary (new string, free()). */
char *tk_plan_format(const tk_plan_result *p);

#ifdef __cplusplus
}
#endif
#endif
