/* step.c — one training step, the same for the run and the plan.
 *
 * tk_train_run (train.c) calls tk_train_step on the run's device and the
 * planner (plan.c) calls it on the meta device, so what the allocator sees in
 * a plan is what a run does by construction, not because two copies of the
 * loop are kept in step: zero the gradients, forward+backward over the
 * step's micro-batches, the AdamW step, the empty_cache policy (every:N
 * after the step, on_oom: release the cache and redo the step once) and the
 * fp16 loss scaler.
 *
 * Guarantees: a step that fails leaves the counters as they were, except
 * the micro-step counter (dropout streams are never reused) and the spent
 * on_oom retry; the optimizer's state is the trainer's and is released by
 * tk_trainer_close whatever happened.
 *
 * The optimizer's parameter table and the fp16 loss scaler live here too:
 * the step is their one user besides checkpoints.
 */
#include <stdlib.h>
#include <string.h>

#include "tk_data_parallel.h"
#include "tk_train.h"
#include "tk_host_mem.h"

tk_optim_param *tk_train_optim_params(tk_model *m, int *n) {
    int np = tk_model_n_params(m);
    tk_optim_param *ps = tk_calloc(np > 0 ? (size_t)np : 1, sizeof *ps);
    if (!ps) {
        *n = 0;
        return NULL;
    }
    for (int i = 0; i < np; i++) {
        const tk_param *p = tk_model_param(m, i);
        ps[i] = (tk_optim_param){ .name = p->name, .param = p->w, .grad = p->g,
                                  .no_decay = p->no_decay, .frozen = p->frozen };
    }
    *n = np;
    return ps;
}

/* ---- fp16 loss scaling ------------------------------------------------ */

void tk_loss_scaler_init(tk_loss_scaler *s, tk_precision p) {
    memset(s, 0, sizeof *s);
    s->enabled = p == TK_PREC_FP16;
    s->scale = s->enabled ? TK_LOSS_SCALE_INIT : 1.0f;
    s->growth_interval = TK_LOSS_SCALE_GROWTH_INTERVAL;
}

void tk_loss_scaler_update(tk_loss_scaler *s, int overflow) {
    if (!s->enabled)
        return;
    if (overflow) {
        s->skipped++;
        s->good_steps = 0;
        if (s->scale * 0.5f >= TK_LOSS_SCALE_MIN)
            s->scale *= 0.5f;
        return;
    }
    if (++s->good_steps >= s->growth_interval) {
        s->good_steps = 0;
        if (s->scale * 2.0f <= TK_LOSS_SCALE_MAX)
            s->scale *= 2.0f;
    }
}

/* ---- the trainer and its step ------------------------------------------- */

tk_status tk_trainer_open_rank(tk_trainer *t, const tk_config *c, tk_model *m, int64_t total_steps, int rank,
                               tk_err *err) {
    memset(t, 0, sizeof *t);
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    t->c = c;
    t->m = m;
    t->sched = tk_sched_from_config(c, total_steps);
    tk_loss_scaler_init(&t->scaler, c->precision);
    /* the ranks first: ZeRO 2 tells the model to hold no gradients */
    tk_status st = tk_dp_open(t, rank, err);
    if (st != TK_OK)
        return st;
    /* Gradients before optimizer state, as in PyTorch (first backward, then
     * first step); the grad tensors must exist for the optimizer's table. */
    if ((st = tk_model_alloc_grads(m, err)) != TK_OK)
        return st;
    int np = 0;
    if (!(t->params = tk_train_optim_params(m, &np)))
        return tk_err_nomem(err, "train: the optimizer's table");
    tk_dp_fill_params(t, t->params, np);
    if (!(t->opt = tk_adamw_new(tk_model_dev(m), c, t->params, np, err)))
        return err->status; /* the optimizer's own: out of host or device memory, a bad config */
    if (tk_dp_sharded(t))
        tk_adamw_set_coll(t->opt, t->coll);
    return TK_OK;
}

tk_status tk_trainer_open(tk_trainer *t, const tk_config *c, tk_model *m, int64_t total_steps, tk_err *err) {
    return tk_trainer_open_rank(t, c, m, total_steps, 0, err);
}

void tk_trainer_close(tk_trainer *t) {
    if (!t)
        return;
    tk_adamw_destroy(&t->opt);
    tk_dp_close(t);
    free(t->params);
    t->params = NULL;
}

/* One attempt: zero, forward+backward over this rank's micro-batches of
 * order[g0..g1), the reduction over the ranks, AdamW, the all-gather.
 * Micro-batch j's gradient is scaled by B_j / sum(B) over the whole group,
 * so the step equals the one on the concatenated batch. Dropout's stream of
 * micro-batch j is micro + (j - g0) on whichever rank runs it. */
static tk_status attempt(tk_trainer *t, const tk_batch *batches, const int *order, int g0, int g1,
                         tk_step_out *o, tk_err *err) {
    o->loss_sum = 0;
    o->rows = 0;
    o->phase = "forward/backward";
    tk_status st = tk_model_zero_grads(t->m, err);
    if (st == TK_OK)
        st = tk_dp_begin(t, err);
    if (st != TK_OK)
        return st;
    int64_t total = 0;
    for (int j = g0; j < g1; j++)
        total += batches[order[j]].B;
    float scale = t->scaler.scale;
    uint64_t micro0 = t->micro;
    t->micro += (uint64_t)(g1 - g0);
    int nth = 0;
    for (int j = g0 + t->rank; j < g1; j += t->world, nth++) {
        const tk_batch *b = &batches[order[j]];
        float loss = 0;
        tk_dp_micro(t, nth);
        st = tk_model_forward_backward(t->m, b, micro0 + (uint64_t)(j - g0), scale * ((float)b->B / (float)total),
                                       &loss, NULL, err);
        if (st != TK_OK)
            return st;
        o->loss_sum += (double)loss * b->B;
        o->rows += b->B;
    }
    tk_dp_micro(t, 0);
    o->phase = "gradient reduction";
    if ((st = tk_dp_reduce(t, err)) != TK_OK)
        return st;
    o->phase = "optimizer";
    if ((st = tk_adamw_step(t->opt, o->lr, 1.0f / scale, &o->grad_norm, &o->skipped, err)) != TK_OK)
        return st;
    o->phase = "parameter all-gather";
    if (!o->skipped && (st = tk_dp_gather(t, err)) != TK_OK)
        return st;
    if (t->world > 1) {
        double sums[2] = { o->loss_sum, (double)o->rows };
        if ((st = tk_coll_all_reduce_host(t->coll, sums, 2, err)) != TK_OK)
            return st;
        o->loss_sum = sums[0];
        o->rows = (int64_t)sums[1];
    }
    return TK_OK;
}

tk_status tk_train_step(tk_trainer *t, const tk_batch *batches, const int *order, int g0, int g1,
                        tk_step_out *o, tk_err *err) {
    const tk_config *c = t->c;
    tk_alloc *a = tk_dev_alloc(tk_model_dev(t->m));
    memset(o, 0, sizeof *o);
    o->lr = tk_sched_lr(&t->sched, t->step);
    tk_status st = attempt(t, batches, order, g0, g1, o, err);
    if (st != TK_OK)
        tk_dp_abandon(t);
    if (st == TK_EOOM && c->empty_cache == TK_EMPTY_ON_OOM && !t->oom_retried) {
        /* The policy users apply by hand: release the cache, redo the whole
         * step once (its gradients are zeroed again). */
        t->oom_retried = 1;
        o->retried = 1;
        tk_alloc_empty_cache(a);
        st = attempt(t, batches, order, g0, g1, o, err);
        if (st != TK_OK)
            tk_dp_abandon(t);
    }
    if (st != TK_OK)
        return st;
    o->phase = NULL;
    tk_loss_scaler_update(&t->scaler, o->skipped);
    t->step++;
    if (c->empty_cache == TK_EMPTY_EVERY && c->empty_cache_every > 0 && t->step % c->empty_cache_every == 0)
        tk_alloc_empty_cache(a);
    return TK_OK;
}
