/* plan.c — plans a training run on the meta device.
 *
 * The plan runs the run's own code on a meta device with the config's
 * capacity: the model, then tk_trainer_open (gradients, the optimizer) and
 * tk_train_step, the very step tk_train_run calls (zero grads, `accumulate`
 * forward+backward micro-steps, AdamW, the empty_cache policy, the on_oom
 * retry), then the eval the run makes. By default it steps twice over the
 * worst-case batch (the second step is the first with optimizer state live
 * during forward, so it is the steady-state peak) and evaluates one eval
 * batch: on cpu a run with fixed-shape batches reaches this peak byte for
 * byte. tk_plan_epoch steps through the run's own first epoch instead (its
 * batches, its order), so the reserved bytes that differently shaped
 * batches leave in the cache are planned too.
 *
 * When the run does not fit, the plan is made twice: once under the capacity
 * (to record where the first OOM happens) and once without a limit (to say
 * how much the run needs).
 *
 * The step time is a roofline-like estimate, max(FLOPs / peak FLOP/s,
 * bytes / bandwidth) from the GPU profile, not a measurement.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk_attn_kernel.h"
#include "tk_plan.h"
#include "tk_host_mem.h"
#include "tk_train.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

typedef struct {
    int32_t *ids, *types, *mask, *labels, *starts, *ends;
} host_batch;

static void host_batch_free(host_batch *h) {
    free(h->ids);
    free(h->types);
    free(h->mask);
    free(h->labels);
    free(h->starts);
    free(h->ends);
    memset(h, 0, sizeof *h);
}

/* A batch of the given shape. The meta backend never reads data, but the
 * arrays are real so the same function can drive a cpu run in tests. */
static int host_batch_make(host_batch *h, tk_batch *b, int B, int rows_per_ex, int T) {
    size_t n = (size_t)B * rows_per_ex * T;
    memset(h, 0, sizeof *h);
    h->ids = tk_calloc(n, sizeof(int32_t));
    h->types = tk_calloc(n, sizeof(int32_t));
    h->mask = tk_malloc(n * sizeof(int32_t));
    h->labels = tk_calloc((size_t)B, sizeof(int32_t));
    h->starts = tk_calloc((size_t)B, sizeof(int32_t));
    h->ends = tk_calloc((size_t)B, sizeof(int32_t));
    if (!h->ids || !h->types || !h->mask || !h->labels || !h->starts || !h->ends) {
        host_batch_free(h);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        h->mask[i] = 1;
    *b = (tk_batch){ .B = B, .T = T, .input_ids = h->ids, .token_type_ids = h->types,
                     .attention_mask = h->mask, .labels = h->labels,
                     .start_positions = h->starts, .end_positions = h->ends };
    return 0;
}

typedef struct {
    tk_status st;
    char phase[32];
    tk_oom oom;
    tk_alloc_stats stats;      /* at the end */
    size_t steady[TK_CAT_COUNT]; /* live bytes after the last optimizer step */
    tk_cost train_cost, eval_cost;
    int64_t n_params, n_trainable;
    int steps;                 /* optimizer steps simulated */
    uint64_t comm_bytes;       /* the collectives' bytes of one step */
    int n_top;
    struct { char owner[128]; size_t bytes, by_cat[TK_CAT_COUNT]; } top[TK_PLAN_TOP];
    /* asked for by tk_plan_tensors_at_peak: the tensors live at the peak */
    tk_tensor_info *tensors;
    int max_tensors, n_tensors;
} sim_out;

static void top_owners(tk_alloc *a, sim_out *o) {
    int n = tk_alloc_n_owners(a);
    o->n_top = 0;
    for (int id = 0; id < n; id++) {
        size_t b = 0, bc[TK_CAT_COUNT];
        for (int c = 0; c < TK_CAT_COUNT; c++)
            b += bc[c] = tk_alloc_owner_at_peak(a, id, (tk_cat)c);
        if (b == 0)
            continue;
        int pos = o->n_top < TK_PLAN_TOP ? o->n_top++ : TK_PLAN_TOP;
        if (pos == TK_PLAN_TOP) {
            if (b <= o->top[TK_PLAN_TOP - 1].bytes)
                continue;
            pos = TK_PLAN_TOP - 1;
        }
        while (pos > 0 && o->top[pos - 1].bytes < b) {
            o->top[pos] = o->top[pos - 1];
            pos--;
        }
        snprintf(o->top[pos].owner, sizeof o->top[pos].owner, "%s", tk_alloc_owner_name(a, id));
        o->top[pos].bytes = b;
        memcpy(o->top[pos].by_cat, bc, sizeof bc);
    }
}

int tk_plan_worst_len(const tk_config *c, const int *lengths, int n) {
    /* fixed padding pads every batch to max_len; dynamic padding and buckets
     * pad to the longest example of the batch, at worst the corpus' longest
     * (capped by max_len). flatten_dense needs max_len. */
    int T = c->max_len;
    if (lengths && n > 0 && c->batching != TK_BATCH_FIXED && c->head != TK_HEAD_FLATTEN_DENSE) {
        int mx = 1;
        for (int i = 0; i < n; i++)
            if (lengths[i] > mx)
                mx = lengths[i];
        if (mx < T)
            T = mx;
    }
    return T;
}

/* What one simulation runs: the worst-case batch (B x T for two steps of
 * `accumulate` micro-batches, then one eval batch EB x T), or, when `train`
 * is set, the first epoch of the run's own batches in the run's order and
 * every dev batch. */
typedef struct {
    int B, T, EB;
    const tk_batch *train, *dev;
    int n_train, n_dev;
    int inference;             /* weights and eval only */
} sim_job;

static void cost_div(tk_cost *c, int n) {
    if (n <= 1)
        return;
    c->flops /= n;
    c->bytes /= n;
    c->attn_flops /= n;
    c->n_ops /= (uint64_t)n;
}

/* The steps of the job through tk_train_step, the run's own step. */
static tk_status sim_steps(const tk_config *c, tk_trainer *t, tk_dev *d, const sim_job *j, const tk_batch *tb,
                           sim_out *o, tk_err *err) {
    /* a step is accumulate micro-batches on each of world_size ranks */
    int k = (c->accumulate > 1 ? c->accumulate : 1) * tk_config_world_size(c);
    const tk_batch *batches = tb;
    int n = k, steps = 2;
    if (j->train) {
        batches = j->train;
        n = j->n_train;
        steps = (n + k - 1) / k;
        if (c->max_steps > 0 && c->max_steps < steps)
            steps = c->max_steps;
    }
    int *order = tk_calloc((size_t)n, sizeof *order); /* the worst case: k times batch 0 */
    if (!order) {
        tk_err_set(err, TK_ENOMEM, "plan: out of host memory");
        return TK_ENOMEM;
    }
    if (j->train)
        tk_train_epoch_order(order, n, c->seed, 0);
    tk_status st = TK_OK;
    tk_cost sum = { 0 };
    for (int s = 0; s < steps && st == TK_OK; s++) {
        int g0 = j->train ? s * k : 0, g1 = g0 + k < n ? g0 + k : n;
        tk_step_out so;
        tk_dev_cost_reset(d);
        tk_coll_reset_bytes(t->coll);
        snprintf(o->phase, sizeof o->phase, "forward/backward");
        st = tk_train_step(t, batches, order, g0, g1, &so, err);
        if (tk_coll_bytes_sent(t->coll) > o->comm_bytes)
            o->comm_bytes = tk_coll_bytes_sent(t->coll);
        if (st == TK_OK)
            o->steps++;
        else if (so.phase)
            snprintf(o->phase, sizeof o->phase, "%s", so.phase);
        tk_dev_cost_get(d, &o->train_cost);
        sum.flops += o->train_cost.flops;
        sum.bytes += o->train_cost.bytes;
        sum.attn_flops += o->train_cost.attn_flops;
        sum.n_ops += o->train_cost.n_ops;
    }
    if (st == TK_OK && j->train) { /* an epoch's step is its mean step */
        cost_div(&sum, steps);
        o->train_cost = sum;
    }
    free(order);
    return st;
}

/* The eval the run makes after an epoch: one batch EB x T, or every dev
 * batch of the run. */
static tk_status sim_eval(tk_model *m, tk_dev *d, const sim_job *j, const tk_batch *eb, sim_out *o, tk_err *err) {
    const tk_batch *dev = j->train ? j->dev : eb;
    int n = j->train ? j->n_dev : 1;
    tk_dev_cost_reset(d);
    snprintf(o->phase, sizeof o->phase, "eval");
    tk_status st = TK_OK;
    for (int i = 0; i < n && st == TK_OK; i++)
        st = tk_model_forward_eval(m, &dev[i], NULL, NULL, err);
    tk_dev_cost_get(d, &o->eval_cost);
    cost_div(&o->eval_cost, n);
    return st;
}

/* One simulated run under `capacity` (0 = none). */
static tk_status simulate(const tk_config *c, const tk_model_opts *mo, size_t capacity, const sim_job *j, int rank,
                          const tk_plan_watch *w, sim_out *o, tk_err *err) {
    tk_tensor_info *want = o->tensors;
    int max_want = o->max_tensors;
    memset(o, 0, sizeof *o);
    o->tensors = want;
    o->max_tensors = max_want;
    tk_err local = { 0 };
    if (!err) err = &local; /* what failed is always recorded, so its status is read, not guessed */
    tk_dev_opts dopts = { .kind = TK_DEV_META, .capacity = capacity, .card_buffers = tk_config_on_card(c) };
    tk_dev *d = tk_dev_new(&dopts, err);
    if (!d)
        return err->status;
    tk_status tst;
    if (want && max_want > 0 && (tst = tk_dev_track_tensors(d, err)) != TK_OK) {
        tk_dev_destroy(&d);
        return tst;
    }
    tk_alloc *a = tk_dev_alloc(d);
    if (w && w->opened) w->opened(a, w->ud);
    tk_model *m = NULL;
    tk_trainer t;
    memset(&t, 0, sizeof t);
    host_batch hb, he;
    tk_batch tb, eb;
    int rows = mo->head == TK_HEAD_FLATTEN_DENSE ? (mo->towers > 0 ? mo->towers : 1) : 1;
    tk_status st = TK_OK;
    memset(&hb, 0, sizeof hb);
    memset(&he, 0, sizeof he);
    if (!j->train && (host_batch_make(&hb, &tb, j->B, rows, j->T) || host_batch_make(&he, &eb, j->EB, rows, j->T))) {
        tk_err_set(err, TK_ENOMEM, "plan: out of host memory");
        st = TK_ENOMEM;
        goto out;
    }
    snprintf(o->phase, sizeof o->phase, "model");
    if (!(m = tk_model_new(d, mo, err))) {
        st = err->status;
        goto out;
    }
    o->n_params = tk_model_n_weights(m);
    o->n_trainable = tk_model_n_trainable(m);
    if (!j->inference) { /* inference: weights and eval batches only */
        snprintf(o->phase, sizeof o->phase, "gradients");
        if ((st = tk_trainer_open_rank(&t, c, m, 2, rank, err)) != TK_OK ||
            (st = sim_steps(c, &t, d, j, &tb, o, err)) != TK_OK)
            goto out;
    }
    {
        tk_alloc_stats s;
        tk_alloc_stats_get(a, &s);
        memcpy(o->steady, s.by_cat, sizeof o->steady);
    }
    if ((st = sim_eval(m, d, j, &eb, o, err)) != TK_OK)
        goto out;
    o->phase[0] = '\0';
out:
    if (st == TK_EOOM && tk_dev_last_oom(d))
        o->oom = *tk_dev_last_oom(d);
    tk_alloc_stats_get(a, &o->stats);
    top_owners(a, o);
    if (want)
        o->n_tensors = tk_dev_tensors_at_peak(d, want, max_want);
    if (w && w->closing) w->closing(a, st == TK_EOOM ? tk_dev_last_oom(d) : NULL, w->ud);
    tk_trainer_close(&t);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    host_batch_free(&hb);
    host_batch_free(&he);
    return o->st = st;
}

static tk_status plan_impl(const tk_config *c, const int *lengths, int n, const tk_plan_batches *run, int inference,
                           const tk_plan_watch *w, tk_plan_result *out, tk_tensor_info *tensors, int max_tensors,
                           int *n_tensors, tk_err *err);

/* attention: auto's memory clause (tk_config_attention_fit): whether config
 * t fits, planned as the plan that asks (its lengths, batches and mode). A
 * plan that fails (out of host memory, say) answers 0 and leaves its error
 * in q->err for the asker to return: a failure is never taken for a fit. */
typedef struct plan_ask {
    const int *lengths;
    int n;
    const tk_plan_batches *run;
    int inference;
    tk_err *err;
    tk_plan_result *done[2];     /* the plans asked for, by attention (standard, fused); owned: the asker
                                    reuses the one it chooses */
} plan_ask;

static int plan_fits(const tk_config *t, void *u) {
    plan_ask *q = (plan_ask *)u;
    if (q->err->status != TK_OK || (t->attention != TK_ATTN_STANDARD && t->attention != TK_ATTN_FUSED))
        return 0; /* an earlier question failed: no more planning */
    tk_plan_result **r = &q->done[t->attention == TK_ATTN_FUSED];
    if (!*r && !(*r = tk_malloc(sizeof **r))) {
        tk_err_set(q->err, TK_ENOMEM, "plan: out of host memory");
        return 0;
    }
    if (plan_impl(t, q->lengths, q->n, q->run, q->inference, NULL, *r, NULL, 0, NULL, q->err) != TK_OK) {
        free(*r);
        *r = NULL;
        return 0;
    }
    return (*r)->fits;
}

int tk_plan_attention_fits(const tk_config *c, void *u) {
    tk_err local = { 0 };
    plan_ask q = { NULL, 0, NULL, 0, u ? (tk_err *)u : &local, { NULL, NULL } };
    const int fits = plan_fits(c, &q);
    free(q.done[0]);
    free(q.done[1]);
    return fits;
}

tk_status tk_plan(const tk_config *c, const int *lengths, int n, tk_plan_result *out, tk_err *err) {
    return plan_impl(c, lengths, n, NULL, 0, NULL, out, NULL, 0, NULL, err);
}

tk_status tk_plan_watched(const tk_config *c, const int *lengths, int n, const tk_plan_watch *w, tk_plan_result *out,
                          tk_err *err) {
    return plan_impl(c, lengths, n, NULL, 0, w, out, NULL, 0, NULL, err);
}

tk_status tk_plan_inference(const tk_config *c, const int *lengths, int n, tk_plan_result *out, tk_err *err) {
    return plan_impl(c, lengths, n, NULL, 1, NULL, out, NULL, 0, NULL, err);
}

tk_status tk_plan_epoch(const tk_config *c, const tk_plan_batches *b, const tk_plan_watch *w, tk_plan_result *out,
                        tk_err *err) {
    if (!b || !b->train || b->n_train <= 0 || (b->n_dev > 0 && !b->dev)) {
        memset(out, 0, sizeof *out);
        tk_err_set(err, TK_EINVAL, "plan --epoch: needs the run's training batches (a config with a train_file)");
        return TK_EINVAL;
    }
    return plan_impl(c, NULL, 0, b, 0, w, out, NULL, 0, NULL, err);
}

static tk_status tensors_at_peak(const tk_config *c, const int *lengths, int n, const tk_plan_batches *run,
                                 tk_tensor_info *out, int max, int *n_out, tk_err *err) {
    *n_out = 0;
    tk_plan_result *p = tk_malloc(sizeof *p);
    if (!p) {
        tk_err_set(err, TK_ENOMEM, "plan: out of host memory");
        return TK_ENOMEM;
    }
    tk_status st = plan_impl(c, lengths, n, run, 0, NULL, p, out, max, n_out, err);
    free(p);
    return st;
}

tk_status tk_plan_tensors_at_peak(const tk_config *c, const int *lengths, int n, tk_tensor_info *out, int max,
                                  int *n_out, tk_err *err) {
    return tensors_at_peak(c, lengths, n, NULL, out, max, n_out, err);
}

tk_status tk_plan_epoch_tensors_at_peak(const tk_config *c, const tk_plan_batches *b, tk_tensor_info *out, int max,
                                        int *n_out, tk_err *err) {
    return tensors_at_peak(c, NULL, 0, b, out, max, n_out, err);
}

/* The roofline step time of one optimizer step on the profile's card.
 * kernel: which fused attention kernel the card runs (when fused). */
static void estimate_step_time(tk_plan_result *out, const tk_config *c, const tk_gpu_profile *prof,
                               const tk_cost *cost, tk_attn_kernel kernel) {
    snprintf(out->profile, sizeof out->profile, "%s", prof->name);
    double rate = c->precision == TK_PREC_FP32 ? prof->fp32_flops
                : c->precision == TK_PREC_BF16 ? prof->bf16_flops : prof->fp16_flops;
    double tc = rate > 0 ? cost->flops / rate : 0;
    /* The op counts 4 + 10 T^2*HS FLOPs per head (forward, backward). The
     * tensor-core kernels run at the 16-bit rate and compute S and dP twice
     * in backward: 4 + 14. The reference kernel runs on the fp32 cores and
     * computes the scores twice in forward and backward: 6 + 14. */
    if (rate > 0 && cost->attn_flops > 0) {
        if (kernel != TK_ATTN_KERNEL_REFERENCE)
            tc += cost->attn_flops * (18.0 / 14.0 - 1.0) / rate;
        else if (prof->fp32_flops > 0)
            tc += cost->attn_flops * (20.0 / 14.0 / prof->fp32_flops - 1.0 / rate);
    }
    double tm = prof->bandwidth > 0 ? cost->bytes / prof->bandwidth : 0;
    out->step_seconds = tc > tm ? tc : tm;
}

static tk_status plan_impl(const tk_config *c, const int *lengths, int n, const tk_plan_batches *run, int inference,
                           const tk_plan_watch *w, tk_plan_result *out, tk_tensor_info *tensors, int max_tensors,
                           int *n_tensors, tk_err *err) {
    double t0 = now_ms();
    memset(out, 0, sizeof *out);
    if (!c || c->batch_size < 1 || c->max_len < 1) {
        tk_err_set(err, TK_EINVAL, "plan: batch_size and max_len must be >= 1");
        return TK_EINVAL;
    }
    /* Before the data is read the label count may be unknown (0); the
     * classifier is then planned with 2 classes (it is H*2 weights). */
    tk_config cc = *c;
    if (cc.head == TK_HEAD_POOLED && cc.num_labels <= 0)
        cc.num_labels = 2;
    /* attention: auto decided once, memory included (a card's fp32 run that
     * fits only fused stays fused): the model below is built with it */
    const char *attn_why = NULL;
    tk_err ask_err = { 0 };
    plan_ask ask = { lengths, n, run, inference, &ask_err, { NULL, NULL } };
    cc.attention = tk_config_attention_fit(&cc, TK_DEV_META, plan_fits, &ask, &attn_why);
    const tk_plan_result *done = ask.done[cc.attention == TK_ATTN_FUSED];
    const int reuse = ask_err.status == TK_OK && done && !w && !tensors && !n_tensors;
    if (reuse) { /* the memory clause planned this very config: that plan is this one */
        *out = *done;
        snprintf(out->attention_why, sizeof out->attention_why, "%s", attn_why);
        out->plan_ms = now_ms() - t0;
    }
    free(ask.done[0]);
    free(ask.done[1]);
    if (ask_err.status != TK_OK) {
        if (err) *err = ask_err;
        return ask_err.status;
    }
    if (reuse) return TK_OK;
    c = &cc;
    tk_model_opts mo;
    tk_status st = tk_model_opts_from_config(&mo, c, err);
    if (st != TK_OK)
        return st;
    const tk_gpu_profile *prof = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    if (c->gpu[0] && !prof) {
        tk_err_set(err, TK_EINVAL, "plan: gpu: unknown GPU profile '%s'", c->gpu);
        return TK_EINVAL;
    }
    /* an explicit capacity is the allocator's budget as given; a profile's
     * card also holds the CUDA context, library kernels and what the
     * libraries keep outside the buffers they are given */
    size_t capacity = tk_config_capacity(c);
    size_t context_bytes = !c->capacity && prof ? prof->capacity - capacity : 0;

    /* An epoch plan reports the largest batch of the run's own. */
    int T = tk_plan_worst_len(c, lengths, n);
    int B = c->batch_size;
    int EB = c->eval_batch_size > 0 ? c->eval_batch_size : B;
    sim_job job = { .B = B, .T = T, .EB = EB, .inference = inference };
    if (run) {
        job.train = run->train;
        job.n_train = run->n_train;
        job.dev = run->dev;
        job.n_dev = run->n_dev;
        B = T = 0;
        for (int i = 0; i < run->n_train; i++) {
            B = run->train[i].B > B ? run->train[i].B : B;
            T = run->train[i].T > T ? run->train[i].T : T;
        }
    }
    out->batch = B;
    out->seq = T;
    out->attention = c->attention;
    snprintf(out->attention_why, sizeof out->attention_why, "%s", attn_why);
    out->capacity = capacity;
    out->context_bytes = context_bytes;

    sim_out *so = tk_calloc(1, sizeof *so);
    if (!so) {
        tk_err_set(err, TK_ENOMEM, "plan: out of host memory");
        return TK_ENOMEM;
    }
    so->tensors = tensors;
    so->max_tensors = max_tensors;
    /* each rank on its own (its pieces differ); the largest is reported */
    int W = tk_config_world_size(c);
    out->world_size = W;
    out->global_batch = c->batch_size * W * (c->accumulate > 1 ? c->accumulate : 1);
    out->zero = W > 1 ? c->zero : 0;
    out->n_ranks = W < TK_PLAN_MAX_RANKS ? W : TK_PLAN_MAX_RANKS;
    int best = 0, best_oom = 0;
    for (int i = 0; i < out->n_ranks; i++) {
        int rank = W <= TK_PLAN_MAX_RANKS || i < TK_PLAN_MAX_RANKS / 2 ? i : W - (out->n_ranks - i);
        int oom = 0;
        st = simulate(c, &mo, capacity, &job, rank, i == 0 ? w : NULL, so, err);
        if (st == TK_EOOM && capacity) {
            oom = 1;
            if (!out->oom) {
                out->oom_record = so->oom;
                snprintf(out->oom_phase, sizeof out->oom_phase, "%s", so->phase);
            }
            out->oom = 1;
            if (err)
                memset(err, 0, sizeof *err);
            st = simulate(c, &mo, 0, &job, rank, NULL, so, err);
        }
        if (st != TK_OK) {
            free(so);
            return st;
        }
        out->rank_of[i] = rank;
        out->rank[i].peak_allocated = so->stats.allocated_peak;
        out->rank[i].peak_reserved = so->stats.reserved_peak;
        out->rank[i].param_bytes = so->steady[TK_CAT_PARAM];
        out->rank[i].grad_bytes = so->steady[TK_CAT_GRAD];
        out->rank[i].optim_bytes = so->steady[TK_CAT_OPTIM];
        if (i == 0 || so->stats.reserved_peak > out->rank[best].peak_reserved ||
            (so->stats.reserved_peak == out->rank[best].peak_reserved &&
             so->stats.allocated_peak > out->rank[best].peak_allocated)) {
            best = i;
            best_oom = oom;
            out->peak_rank = rank;
            out->comm_bytes = so->comm_bytes;
        }
    }
    /* the details below are the last simulation's: the largest rank's again
     * when it was not the last one planned */
    if (best != out->n_ranks - 1 &&
        (st = simulate(c, &mo, best_oom ? 0 : capacity, &job, out->peak_rank, NULL, so, err)) != TK_OK) {
        free(so);
        return st;
    }
    out->peak_allocated = so->stats.allocated_peak;
    out->peak_reserved = so->stats.reserved_peak;
    for (int i = 0; i < out->n_ranks; i++) { /* each the largest of any rank */
        if (out->rank[i].peak_allocated > out->peak_allocated) out->peak_allocated = out->rank[i].peak_allocated;
        if (out->rank[i].peak_reserved > out->peak_reserved) out->peak_reserved = out->rank[i].peak_reserved;
    }
    memcpy(out->by_cat_at_peak, so->stats.by_cat_at_peak, sizeof out->by_cat_at_peak);
    out->n_top = so->n_top;
    for (int i = 0; i < so->n_top; i++) {
        memcpy(out->top[i].owner, so->top[i].owner, sizeof out->top[i].owner);
        out->top[i].bytes = so->top[i].bytes;
        memcpy(out->top[i].by_cat, so->top[i].by_cat, sizeof out->top[i].by_cat);
    }
    out->param_bytes = so->steady[TK_CAT_PARAM];
    out->grad_bytes = so->steady[TK_CAT_GRAD];
    out->optim_bytes = so->steady[TK_CAT_OPTIM];
    out->epoch_steps = run ? so->steps : 0;
    out->n_params = so->n_params;
    out->n_trainable = so->n_trainable;
    out->train_step = so->train_cost;
    out->eval_step = so->eval_cost;
    out->fits = !out->oom && (!capacity || out->peak_reserved <= capacity);
    out->margin = capacity ? (int64_t)capacity - (int64_t)out->peak_reserved : 0;
    /* fused on a named card: which of the cuda backend's kernels runs it */
    tk_attn_kernel kernel = TK_ATTN_KERNEL_REFERENCE;
    if (prof && out->attention == TK_ATTN_FUSED)
        kernel = tk_attn_kernel_line(out->attention_kernel, sizeof out->attention_kernel, prof->cc_major,
                                     prof->cc_minor, mo.precision == TK_PREC_FP16 ? TK_F16
                                                     : mo.precision == TK_PREC_BF16 ? TK_BF16 : TK_F32,
                                     mo.dims.heads > 0 ? mo.dims.hidden / mo.dims.heads : 0,
                                     tk_attn_kernel_ask(getenv(TK_ATTN_KERNEL_ENV)));
    if (prof)
        estimate_step_time(out, c, prof, &so->train_cost, kernel);
    if (n_tensors)
        *n_tensors = so->n_tensors;
    free(so);
    out->plan_ms = now_ms() - t0;
    return TK_OK;
}

char *tk_plan_format(const tk_plan_result *p) {
    size_t cap = 4096;
    char *s = tk_malloc(cap);
    if (!s)
        return NULL;
    char b1[32], b2[32], b3[32];
    int n = 0;
#define OUT(...) do { if (n < (int)cap) n += snprintf(s + n, cap - (size_t)n, __VA_ARGS__); } while (0)
    OUT("plan: batch %d x seq %d, %lld parameters (%lld trainable)\n", p->batch, p->seq,
        (long long)p->n_params, (long long)p->n_trainable);
    OUT("predicted peak: %s allocated, %s reserved", tk_format_bytes(p->peak_allocated, b1, sizeof b1),
        tk_format_bytes(p->peak_reserved, b2, sizeof b2));
    if (p->capacity) {
        int64_t mg = p->margin;
        OUT(" of %s capacity: %s (%s %s)\n", tk_format_bytes(p->capacity, b3, sizeof b3),
            p->fits ? "fits" : "does NOT fit", p->fits ? "margin" : "short by",
            tk_format_bytes((size_t)(mg < 0 ? -mg : mg), b1, sizeof b1));
        if (p->context_bytes)
            OUT("(the %s profile's card less %s for the CUDA context, library kernels and what the libraries keep "
                "outside their workspaces; the cuBLAS workspace and kernel scratch are in the plan, category "
                "workspace)\n", p->profile, tk_format_bytes(p->context_bytes, b1, sizeof b1));
    } else {
        OUT(" (no capacity given)\n");
    }
    if (p->oom)
        OUT("first OOM during %s: %s for %s (%s)\n", p->oom_phase,
            tk_format_bytes(p->oom_record.requested, b1, sizeof b1), p->oom_record.owner_name,
            tk_cat_name(p->oom_record.tag.cat));
    OUT("attention: %s (%s)\n", tk_attention_name(p->attention), p->attention_why);
    if (p->attention_kernel[0])
        OUT("attention kernel on %s: %s\n", p->profile, p->attention_kernel);
    OUT("at the peak, by category:\n");
    for (int c = 0; c < TK_CAT_COUNT; c++)
        if (p->by_cat_at_peak[c])
            OUT("  %-10s %s\n", tk_cat_name((tk_cat)c), tk_format_bytes(p->by_cat_at_peak[c], b1, sizeof b1));
    OUT("top owners at the peak:\n");
    for (int i = 0; i < p->n_top; i++)
        OUT("  %-56s %s\n", p->top[i].owner, tk_format_bytes(p->top[i].bytes, b1, sizeof b1));
    OUT("one optimizer step: %.3g GFLOP, %.3g GB moved", p->train_step.flops / 1e9, p->train_step.bytes / 1e9);
    if (p->profile[0])
        OUT("; on %s about %.3g s (roofline estimate, not measured)", p->profile, p->step_seconds);
    OUT("\nplanned in %.2f ms\n", p->plan_ms);
#undef OUT
    return s;
}
