/* tk_train.h — the optimizer, the learning-rate schedule and the training loop.
 *
 * What it owns: AdamW (32-bit and 8-bit state) over the model's parameters,
 * global-norm gradient clipping, HF's linear-warmup schedules, the epoch/step
 * loop with gradient accumulation, evaluation after each epoch, per-epoch
 * history, progress callbacks, cancellation at step boundaries, OOM unwinding,
 * the empty-cache policy and atomic checkpoints.
 *
 * Guarantees:
 *  - Optimizer state is allocated through the device (TK_CAT_OPTIM, owner =
 *    the parameter's owner) lazily at the first step, as torch.optim.AdamW
 *    does, so a plan shows it at the moment a real run allocates it.
 *  - tk_train_run never leaves memory behind: on success, cancel or OOM every
 *    tensor it allocated is released (the model's parameters belong to the
 *    caller and stay). On OOM, result->oom keeps the allocator's record.
 *  - A checkpoint in output_dir is replaced only by a complete new one (temp
 *    file, fsync, rename), so a crash or OOM never corrupts the last good one.
 *
 * Ownership: the caller owns config, model, batches and device; the result is
 * plain data except history, released by tk_train_result_clear().
 */
#ifndef TK_TRAIN_H
#define TK_TRAIN_H

#include <stdint.h>
#include "tk_gpu.h"
#include "tk_collective.h"
#include "tk_config.h"
#include "tk_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- learning-rate schedule (HF get_linear_schedule_with_warmup) ------- */

typedef struct tk_sched {
    float lr;               /* peak learning rate */
    int64_t warmup_steps;   /* ceil(warmup_ratio * total_steps), as HF's Trainer */
    int64_t total_steps;    /* optimizer steps of the whole run */
    int constant;           /* 1: after warmup the rate stays at lr (no decay) */
} tk_sched;

/* Schedule for a run of total_steps optimizer steps from the config
 * (lr, warmup_ratio, schedule "linear" | "constant"). */
tk_sched tk_sched_from_config(const tk_config *c, int64_t total_steps);
/* Learning rate of the optimizer step that follows `done` completed steps,
 * i.e. LambdaLR's lr after `done` scheduler.step() calls: warmup
 * lr*done/warmup, then lr*(total-done)/(total-warmup) clamped at 0. */
float tk_sched_lr(const tk_sched *s, int64_t done);

/* ---- AdamW ----------------------------------------------------------- */

/* One trainable tensor as the optimizer sees it (all borrowed). */
typedef struct tk_optim_param {
    const char *name;  /* HF parameter name, for messages */
    tk_tensor *param;  /* f32 master weights */
    tk_tensor *grad;   /* gradient (any float dtype); unused when frozen */
    int no_decay;      /* 1: bias and LayerNorm weights (no weight decay) */
    int frozen;        /* 1: never updated, no state allocated */
    /* ZeRO 1 and 2 (piece = 1): this rank's piece of the parameter,
     * elements [lo, hi), maybe empty; its state covers only the piece.
     * grad_is_piece = 1: grad holds the piece's elements only (ZeRO 2). */
    int piece;
    int64_t lo, hi;
    int grad_is_piece;
} tk_optim_param;

/* Pieces of a parameter are whole chunks of TK_DP_CHUNK elements (a multiple
 * of TK_Q8_BLOCK, so 8-bit state's blocks never straddle two ranks), and a
 * sharded gradient norm is the sum of per-chunk sums of squares taken in
 * chunk order, so it is the same sum whatever the number of ranks. */
#define TK_DP_CHUNK 65536

typedef struct tk_adamw tk_adamw;

/* New optimizer over `n` parameters (the array is copied; the tensors stay
 * borrowed and must outlive the optimizer). Hyper-parameters come from the
 * config (adam_beta1/2, adam_eps, weight_decay, max_grad_norm, optimizer,
 * adamw8_fp32_embeddings). Allocates nothing on the device. */
tk_adamw *tk_adamw_new(tk_dev *d, const tk_config *c, const tk_optim_param *params, int n,
                       tk_err *err);
/* Releases the optimizer's state tensors and the optimizer. */
void tk_adamw_destroy(tk_adamw **po);
/* Sharded state (ZeRO 1/2, pieces in the parameter table): the gradient
 * norm is taken per chunk (TK_DP_CHUNK) over this rank's pieces and summed
 * across the ranks of `coll` (borrowed; must outlive the optimizer). */
void tk_adamw_set_coll(tk_adamw *o, tk_coll *coll);

/* One optimizer step at learning rate `lr`. Gradients are first multiplied
 * by grad_scale (1/loss-scale for fp16, 1 otherwise), then clipped to
 * max_grad_norm by global norm (torch's clip_grad_norm_: factor
 * max/(norm+1e-6) when below 1) — the clip is folded into the update, grads
 * are not modified. On the first call the moments are allocated (TK_EOOM
 * possible: then nothing is updated and the call may be retried). A
 * non-finite gradient norm skips the update (*skipped = 1), as an fp16 loss
 * scaler needs. *grad_norm (may be NULL) gets the norm before clipping
 * (0 on meta). */
tk_status tk_adamw_step(tk_adamw *o, float lr, float grad_scale, float *grad_norm, int *skipped,
                        tk_err *err);
/* Optimizer steps taken so far. */
int64_t tk_adamw_steps(const tk_adamw *o);
/* Bytes of optimizer state (0 before the first step). */
size_t tk_adamw_state_bytes(const tk_adamw *o);
/* Bytes of state the optimizer will hold after its first step, without
 * allocating (the planner and the advisor use it). */
size_t tk_adamw_state_bytes_planned(const tk_adamw *o);

/* The state of parameter i (0 <= i < tk_adamw_n_slots) as a checkpoint
 * sees it: all borrowed from the optimizer. m and v are f32 (q8 = 0), or
 * i8 / u8 with f32 per-block scales mscale / vscale (q8 = 1). Tensors not
 * allocated (frozen parameters, no state yet) have data NULL. */
typedef struct tk_adamw_state_view {
    const char *name;
    int q8, frozen;
    tk_tensor *m, *v, *mscale, *vscale;
    /* ZeRO 1/2: the tensors hold elements [lo, lo + n) of the parameter's
     * numel (piece = 1); a checkpoint holds the whole (consolidated) state */
    int piece;
    int64_t lo, n, numel;
    const tk_tensor *param;     /* the parameter (its shape is the state's) */
} tk_adamw_state_view;

/* Moment j of a slot (0 m, 1 v, 2 m's scales, 3 v's scales; 2 and 3 only
 * with q8) as a whole-parameter tensor and as this rank's part of it. */
typedef struct tk_adamw_moment {
    int present;                /* 0: no such moment (j > 1 without q8, frozen) */
    tk_dtype dtype;
    int ndim;
    int64_t shape[TK_MAX_DIMS]; /* of the whole */
    int64_t numel;              /* of the whole */
    int64_t off, count;         /* this rank's elements of it */
} tk_adamw_moment;
void tk_adamw_moment_layout(const tk_adamw_state_view *v, int j, tk_adamw_moment *out);

int tk_adamw_n_slots(const tk_adamw *o);
void tk_adamw_state_at(tk_adamw *o, int i, tk_adamw_state_view *out);
/* 1 once the moments exist (after the first step or tk_adamw_alloc_state). */
int tk_adamw_has_state(const tk_adamw *o);
/* Allocates zeroed moments now instead of at the first step (a resume fills
 * them). No-op when they exist; on failure nothing is left allocated. */
tk_status tk_adamw_alloc_state(tk_adamw *o, tk_err *err);
/* Sets the count of steps taken (the bias correction of the next step). */
void tk_adamw_set_steps(tk_adamw *o, int64_t steps);

/* ---- fp16 dynamic loss scaling ---------------------------------------- */

/* torch.cuda.amp.GradScaler's policy: the loss (hence every gradient) is
 * multiplied by `scale` so small fp16 activation gradients do not flush to
 * zero; the optimizer step unscales (grad_scale = 1/scale). A step whose
 * gradients overflowed (non-finite norm) is skipped and the scale halved; after
 * growth_interval finite steps in a row it doubles. Only precision fp16 scales:
 * fp32 and bf16 (fp32's exponent range) keep scale 1 and never change it. */
#define TK_LOSS_SCALE_INIT 65536.0f     /* 2^16, GradScaler's init_scale */
#define TK_LOSS_SCALE_GROWTH_INTERVAL 2000
#define TK_LOSS_SCALE_MIN (1.0f / 16777216.0f) /* 2^-24: halving never reaches 0 */
#define TK_LOSS_SCALE_MAX 16777216.0f   /* 2^24: growth stops (fp32 keeps headroom) */

typedef struct tk_loss_scaler {
    int enabled;               /* 1: precision fp16 */
    float scale;               /* current loss scale (1 when disabled) */
    int64_t good_steps;        /* finite steps since the scale last changed */
    int64_t growth_interval;   /* finite steps before doubling */
    int64_t skipped;           /* steps skipped for overflow so far */
} tk_loss_scaler;

void tk_loss_scaler_init(tk_loss_scaler *s, tk_precision p);
/* After an optimizer step: overflow = 1 (the step was skipped) halves the
 * scale and counts the skip; overflow = 0 counts a good step and doubles the
 * scale every growth_interval of them. No-op when disabled. */
void tk_loss_scaler_update(tk_loss_scaler *s, int overflow);

/* ---- the training loop ------------------------------------------------ */

/* What the progress callback sees. */
typedef struct tk_progress {
    int epoch, epochs;          /* 1-based epoch */
    int64_t step, total_steps;  /* optimizer steps done / planned */
    float loss;                 /* mean loss of the last log_every steps */
    float lr, grad_norm;
    float loss_scale;           /* fp16: current loss scale; 1 otherwise */
    int64_t skipped_steps;      /* fp16: steps skipped for overflow so far */
    double samples_per_s;       /* over the current epoch */
    double eta_s;               /* seconds left, at the current rate */
    size_t allocated, peak, reserved, capacity;
} tk_progress;

/* One row of per-epoch history. */
typedef struct tk_epoch_stats {
    int epoch;
    float train_loss;           /* mean over the epoch's micro-batches */
    float dev_loss;             /* NaN when there is no dev set */
    float dev_acc, dev_f1;      /* classification: accuracy, macro F1 */
    float dev_em, dev_span_f1;  /* QA: SQuAD exact match and token F1 (percent) */
    double samples_per_s;       /* training samples per second */
    double seconds;
    size_t peak_allocated, peak_reserved;
} tk_epoch_stats;

typedef struct tk_train_callbacks {
    /* Called every log_every optimizer steps and at each epoch end; return
     * nonzero to cancel (same as setting *cancel). May be NULL. */
    int (*on_progress)(void *ud, const tk_progress *p);
    /* Called after each epoch's eval (and checkpoint). May be NULL. */
    void (*on_epoch)(void *ud, const tk_epoch_stats *e);
    void *ud;
    /* Honoured at step boundaries: the run stops with TK_ECANCEL, memory
     * released, the last epoch's checkpoint intact. May be NULL. */
    volatile int *cancel;
    /* A line for the user (which checkpoint a run resumed from, a damaged
     * checkpoint passed over, a save that failed). May be NULL. */
    void (*on_note)(void *ud, const char *line);
    /* The tokenizer's vocab.txt (tk_run_data.vocab_path), copied into each
     * checkpoint so the folder loads on its own; NULL = c->vocab. */
    const char *vocab_file;
} tk_train_callbacks;

typedef struct tk_train_result {
    tk_status status;
    int64_t steps;              /* optimizer updates applied (skipped steps excluded) */
    int64_t skipped_steps;      /* fp16: steps skipped for a gradient overflow */
    float loss_scale;           /* fp16: the loss scale at the end; 1 otherwise */
    int epochs_done;            /* complete epochs (evaluated) */
    int n_history;
    tk_epoch_stats *history;    /* n_history rows, owned (tk_train_result_clear) */
    int have_oom;               /* 1: the run ended in OOM; oom holds the record */
    tk_oom oom;
    size_t allocated_before, allocated_after; /* device allocated bytes */
    size_t peak_allocated, peak_reserved;     /* over the whole run */
    double seconds;
    char checkpoint[TK_PATH_MAX];  /* last checkpoint folder written ("" none) */
    char resumed_from[TK_PATH_MAX + 64]; /* the checkpoint-STEP folder the run went on from ("" none) */
    int64_t resumed_step;       /* its step */
    int saves, failed_saves;    /* checkpoint-STEP folders written / saves (checkpoints, the epoch's model folder) that failed */
} tk_train_result;

void tk_train_result_clear(tk_train_result *r);

/* Trains `model` (parameters on the model's device) on the n_train host
 * batches for config->epochs (or max_steps), visiting them in a seeded
 * shuffled order each epoch, and evaluates on the n_dev dev batches (may be
 * 0) after each epoch. Each batch is one micro-batch: with accumulate = k,
 * k consecutive batches make one optimizer step (a last partial group is
 * still stepped, normalised by its own size). With c->output_dir set, the
 * HF folder is written there after each epoch and checkpoint-STEP folders
 * (tk_checkpoint.h) every c->save_every steps or c->save_every_s seconds, or
 * after each epoch when both are 0. c->resume_from: a checkpoint-STEP folder
 * or "auto" (the newest one in output_dir that verifies; damaged ones are
 * passed over with a note) continues that run exactly, history included (the
 * restored epochs go to on_epoch first); an HF folder loads weights only. Returns TK_OK, TK_ECANCEL, TK_EOOM or another error (err says
 * which); `r` is filled in every case. Batches are borrowed. */
tk_status tk_train_run(const tk_config *c, tk_model *model, const tk_batch *train, int n_train,
                       const tk_batch *dev, int n_dev, const tk_train_callbacks *cb,
                       tk_train_result *r, tk_err *err);

/* ---- one training step: what the run and the plan both execute --------- */

/* The optimizer and the counters a step needs, as the run keeps them between
 * steps (a checkpoint saves and restores exactly these). */
typedef struct tk_trainer {
    const tk_config *c;         /* borrowed */
    tk_model *m;                /* borrowed */
    tk_adamw *opt;              /* owned (tk_trainer_close) */
    tk_optim_param *params;     /* owned: the optimizer's table */
    tk_sched sched;
    tk_loss_scaler scaler;
    uint64_t micro;             /* micro-steps so far (all ranks'): seeds dropout */
    tk_coll *coll;              /* owned: the ranks of a data-parallel run (single for one) */
    struct tk_dp *dp;           /* owned: this rank's pieces, ZeRO 2's gradient pieces (data_parallel.c) */
    int rank, world, zero;
    int64_t step;               /* loop steps done (fp16 skipped steps included) */
    int oom_retried;            /* empty_cache on_oom spent its one retry */
} tk_trainer;

/* What one step did. */
typedef struct tk_step_out {
    float lr;                   /* the rate the step used */
    double loss_sum;            /* sum over its examples of the loss (every rank's) */
    int64_t rows;               /* examples in the step (every rank's) */
    float grad_norm;            /* before clipping (0 on meta) */
    int skipped;                /* fp16: non-finite gradients, no update */
    int retried;                /* 1: the on_oom retry ran in this step */
    const char *phase;          /* on failure: "forward/backward" or "optimizer" */
} tk_step_out;

/* Allocates the model's gradients and creates the optimizer (no device
 * state until the first step), the schedule for total_steps and the loss
 * scaler, and the communicator of c->world_size ranks (tk_collective.h).
 * On failure call tk_trainer_close all the same. */
tk_status tk_trainer_open(tk_trainer *t, const tk_config *c, tk_model *m, int64_t total_steps, tk_err *err);
/* The same for the planner, which plays rank `rank` of c->world_size on
 * meta (a real run's rank comes from its launcher). */
tk_status tk_trainer_open_rank(tk_trainer *t, const tk_config *c, tk_model *m, int64_t total_steps, int rank,
                               tk_err *err);
/* Releases the optimizer's state and table (the model keeps its gradients). */
void tk_trainer_close(tk_trainer *t);

/* One optimizer step over the micro-batches batches[order[g0..g1)] of all
 * ranks: this rank takes those at g0 + rank, g0 + rank + world, ... (with
 * accumulate k the group holds k x world). Zero the gradients,
 * forward+backward each (micro-batch j weighted by B_j / sum(B) over the
 * whole group, times the loss scale; a micro-batch after a rank's first
 * adds its fresh gradients to the earlier ones, as the reduction adds the
 * ranks'), reduce across ranks (ZeRO 0 all-reduce, 1 and 2 reduce-scatter),
 * AdamW at the schedule's rate (on this rank's pieces; then all-gather), then
 * the loss scaler and the empty_cache policy (every:N releases the cache
 * after every Nth step; on_oom releases it and redoes a step that ran out,
 * once per run). The run calls it on its device, the planner on meta.
 * TK_EOOM leaves the device's record (tk_dev_last_oom). */
tk_status tk_train_step(tk_trainer *t, const tk_batch *batches, const int *order, int g0, int g1,
                        tk_step_out *out, tk_err *err);

/* The order in which an epoch visits the n training micro-batches: a
 * shuffle seeded by seed and the epoch (splitmix64, so it does not depend on
 * the C library). The run and tk_plan_epoch use it. */
void tk_train_epoch_order(int *order, int n, uint64_t seed, int epoch);

/* What tk_train_measure saw. */
typedef struct tk_measure {
    size_t peak_allocated, peak_reserved; /* the caching allocator, over the measured run */
    double ms_per_step;         /* wall time per optimizer step (see timed_steps) */
    int64_t timed_steps;
    /* cuda only (have_device = 1): CUPTI's records of every device
     * allocation in the process, and the plugin's own buffers */
    int have_device, cupti_active;
    size_t device_peak;         /* highest device bytes live (CUPTI) */
    size_t plugin_bytes;        /* cuBLAS workspace + plugin scratch, allocated at open */
    char device[128];           /* the device's name */
} tk_measure;

/* Runs config c the way the planner replays it — a fresh device of `kind`,
 * random weights, two optimizer steps of `accumulate` micro-batches of
 * synthetic ids at batch x max_len, one eval batch — and reports the
 * allocator's peaks (equal to tk_plan's peak_allocated / peak_reserved when
 * the plan is right) and, on cuda, CUPTI's device peak. Simulated capacities
 * (capacity, gpu) are ignored. timed_steps > 0 then times that many more
 * steps on the same model (after the memory run, without eval: a steady
 * state); 0 times the two-step run itself. */
tk_status tk_train_measure(const tk_config *c, tk_dev_kind kind, int timed_steps, tk_measure *out, tk_err *err);

/* Optimizer parameters for a model (new array of tk_model_n_params entries,
 * free()); the model's tk_param pointers are borrowed. */
tk_optim_param *tk_train_optim_params(tk_model *m, int *n);

#ifdef __cplusplus
}
#endif
#endif
