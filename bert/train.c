/* train.c — the training loop: epochs of accumulated micro-batches, AdamW
 * steps on HF's schedule, eval after each epoch, history, progress, cancel,
 * OOM unwinding, the empty-cache policy and per-epoch checkpoints.
 *
 * Guarantees:
 *  - k micro-batches make one optimizer step; micro-batch j's gradient is
 *    scaled by B_j / sum(B), so the step equals the one on the concatenated
 *    batch (mean loss over its examples).
 *  - The cancel flag and the progress callback's answer are looked at only
 *    between optimizer steps: a cancelled run has whole steps only.
 *  - Whatever ends the run (success, cancel, OOM, error) the optimizer state
 *    and every scratch tensor are released before return; the model keeps its
 *    parameters and gradients (they are the model's, tk_model_destroy frees
 *    them). On OOM the allocator's record is copied into the result.
 *  - The HF folder in output_dir is written only after a complete epoch,
 *    file by file atomically (tk_model_save_hf); checkpoint-STEP folders
 *    (checkpoint.c) appear whole or not at all. A resumed run repeats the
 *    saved one's arithmetic exactly: the epoch's order comes from
 *    seed + epoch, dropout from seed + the micro-step counter, and the
 *    checkpoint carries the counter, the moments, the scaler and the sums
 *    behind the metrics.
 *  - precision fp16 trains under a dynamic loss scale (tk_loss_scaler): a
 *    step whose gradients overflowed changes nothing (weights, moments,
 *    optimizer step count) but still counts as a loop step, so a run always
 *    ends after total_steps. The scaler is host state only: the allocation
 *    sequence is the one the planner replays.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk_checkpoint.h"
#include "tk_host_mem.h"
#include "tk_train.h"
#include "tk_ops_spec.h" /* splitmix64 for the batch order */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tk_train_result_clear(tk_train_result *r) {
    if (!r)
        return;
    free(r->history);
    memset(r, 0, sizeof *r);
}

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

static void epoch_order(int *order, int n, uint64_t seed, int epoch) {
    for (int i = 0; i < n; i++)
        order[i] = i;
    uint64_t s = seed * 1000003ull + (uint64_t)epoch;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(tk_spec_splitmix64(&s) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* ---- evaluation ------------------------------------------------------- */

/* HF run_qa.py's max_answer_length */
#define TK_MAX_ANSWER_TOKENS 30

typedef struct {
    double loss_sum;           /* sum of per-example losses */
    int64_t loss_rows, n_rows, n_correct;
    int num_labels;
    int64_t *tp, *fp, *fn;     /* classification, per class */
    double em_sum, f1_sum;     /* span */
} eval_acc;

static void eval_classify(eval_acc *e, const tk_batch *b, const float *logits) {
    for (int i = 0; i < b->B; i++) {
        int y = b->labels ? b->labels[i] : -1;
        if (y < 0)
            continue;
        const float *l = logits + (size_t)i * e->num_labels;
        int best = 0;
        for (int k = 1; k < e->num_labels; k++)
            if (l[k] > l[best])
                best = k;
        e->n_rows++;
        if (best == y) {
            e->n_correct++;
            e->tp[y]++;
        } else {
            e->fp[best]++;
            if (y < e->num_labels)
                e->fn[y]++;
        }
    }
}

/* Best span (s <= e < s + 30, both on kept tokens; (0,0) is the [CLS]
 * no-answer span) against the gold positions: SQuAD EM and token-overlap F1
 * over positions. */
static void eval_span(eval_acc *e, const tk_batch *b, const float *logits) {
    for (int i = 0; i < b->B; i++) {
        const float *l = logits + (size_t)i * b->T * 2;
        const int32_t *mask = b->attention_mask ? b->attention_mask + (size_t)i * b->T : NULL;
        int bs = 0, be = 0;
        float best = l[0] + l[1];
        for (int s = 1; s < b->T; s++) {
            if (mask && !mask[s])
                continue;
            for (int t = s; t < b->T && t < s + TK_MAX_ANSWER_TOKENS; t++) {
                if (mask && !mask[t])
                    continue;
                float sc = l[2 * s] + l[2 * t + 1];
                if (sc > best) {
                    best = sc;
                    bs = s;
                    be = t;
                }
            }
        }
        int gs = b->start_positions ? b->start_positions[i] : 0;
        int ge = b->end_positions ? b->end_positions[i] : 0;
        int em = bs == gs && be == ge;
        double f1 = em;
        if (!em && gs > 0 && bs > 0) {
            int lo = bs > gs ? bs : gs, hi = be < ge ? be : ge;
            int ov = hi - lo + 1;
            if (ov > 0) {
                double p = (double)ov / (be - bs + 1), r = (double)ov / (ge - gs + 1);
                f1 = 2 * p * r / (p + r);
            }
        }
        e->n_rows++;
        e->em_sum += em;
        e->f1_sum += f1;
    }
}

static tk_status evaluate(tk_model *m, const tk_batch *dev, int n_dev, tk_epoch_stats *es,
                          tk_err *err) {
    const tk_model_opts *mo = tk_model_opts_of(m);
    int span = mo->head == TK_HEAD_SPAN;
    eval_acc e;
    memset(&e, 0, sizeof e);
    e.num_labels = span ? 2 : mo->num_labels;
    e.tp = tk_calloc((size_t)e.num_labels * 3, sizeof(int64_t));
    int64_t maxl = 0;
    for (int i = 0; i < n_dev; i++) {
        int64_t nl = tk_model_n_logits(m, dev[i].B, dev[i].T);
        if (nl > maxl)
            maxl = nl;
    }
    float *logits = tk_malloc((size_t)(maxl > 0 ? maxl : 1) * sizeof(float));
    if (!e.tp || !logits) {
        free(e.tp);
        free(logits);
        tk_err_set(err, TK_ENOMEM, "eval: out of host memory");
        return TK_ENOMEM;
    }
    e.fp = e.tp + e.num_labels;
    e.fn = e.fp + e.num_labels;
    tk_status st = TK_OK;
    for (int i = 0; i < n_dev && st == TK_OK; i++) {
        float loss = 0;
        st = tk_model_forward_eval(m, &dev[i], &loss, logits, err);
        if (st != TK_OK)
            break;
        /* the mean over examples (HF Trainer's eval_loss): each batch's mean
         * weighs by the rows it averaged (labelled rows; every row for span) */
        int rows = 0;
        for (int r = 0; r < dev[i].B; r++) rows += span || !dev[i].labels || dev[i].labels[r] >= 0;
        e.loss_sum += (double)loss * rows;
        e.loss_rows += rows;
        if (span)
            eval_span(&e, &dev[i], logits);
        else
            eval_classify(&e, &dev[i], logits);
    }
    if (st == TK_OK) {
        es->dev_loss = e.loss_rows ? (float)(e.loss_sum / (double)e.loss_rows) : NAN;
        if (span) {
            es->dev_em = e.n_rows ? (float)(100.0 * e.em_sum / (double)e.n_rows) : NAN;
            es->dev_span_f1 = e.n_rows ? (float)(100.0 * e.f1_sum / (double)e.n_rows) : NAN;
        } else {
            es->dev_acc = e.n_rows ? (float)e.n_correct / (float)e.n_rows : NAN;
            /* macro F1 over the classes seen in labels or predictions (sklearn's) */
            double f1 = 0;
            int k = 0;
            for (int c = 0; c < e.num_labels; c++) {
                int64_t tp = e.tp[c], fp = e.fp[c], fn = e.fn[c];
                if (tp + fp + fn == 0)
                    continue;
                f1 += 2.0 * (double)tp / (double)(2 * tp + fp + fn);
                k++;
            }
            es->dev_f1 = k ? (float)(f1 / k) : NAN;
        }
    }
    free(e.tp);
    free(logits);
    return st;
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

/* ---- the loop --------------------------------------------------------- */

static void fill_progress(tk_progress *p, tk_dev *d) {
    tk_alloc_stats s;
    tk_alloc_stats_get(tk_dev_alloc(d), &s);
    p->allocated = s.allocated;
    p->peak = s.allocated_peak;
    p->reserved = s.reserved;
    p->capacity = s.capacity;
}

static void note(const tk_train_callbacks *cb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const tk_train_callbacks *cb, const char *fmt, ...) {
    if (!cb || !cb->on_note)
        return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cb->on_note(cb->ud, line);
}

/* The checkpoint a run goes on from: resume_from itself, or with "auto" the
 * newest checkpoint-STEP in output_dir that verifies (each damaged one
 * passed over is said). "" when auto finds none: the run starts afresh. A
 * named checkpoint that fails verification is an error that offers the
 * newest complete one beside it. */
static tk_status pick_resume(const tk_config *c, const tk_train_callbacks *cb, char *dir, size_t dn,
                             tk_err *err) {
    dir[0] = 0;
    if (strcmp(c->resume_from, "auto") != 0) {
        if (!tk_ckpt_is_checkpoint(c->resume_from))
            return TK_OK;
        if (tk_ckpt_verify(c->resume_from, err) == TK_OK) {
            snprintf(dir, dn, "%s", c->resume_from);
            return TK_OK;
        }
        char why[sizeof err->msg], parent[TK_PATH_MAX], alt[TK_PATH_MAX + 64] = "";
        snprintf(why, sizeof why, "%s", err->msg);
        snprintf(parent, sizeof parent, "%s", c->resume_from);
        size_t l = strlen(parent);
        while (l > 1 && parent[l - 1] == '/') parent[--l] = 0;
        char *slash = strrchr(parent, '/');
        if (slash) *slash = 0;
        else snprintf(parent, sizeof parent, ".");
        int64_t *steps = NULL;
        int n = tk_ckpt_list(parent, &steps);
        tk_err e2 = {0};
        for (int i = 0; i < n && !alt[0]; i++) {
            snprintf(alt, sizeof alt, "%s/checkpoint-%lld", parent, (long long)steps[i]);
            if (!strcmp(alt, c->resume_from) || tk_ckpt_verify(alt, &e2) != TK_OK)
                alt[0] = 0;
        }
        free(steps);
        tk_err_set(err, TK_EIO, "resume_from: %s%s%s", why,
                   alt[0] ? "; the newest complete checkpoint beside it is " : "", alt);
        return TK_EIO;
    }
    if (!c->output_dir[0]) {
        tk_err_set(err, TK_EINVAL, "resume_from: auto looks in output_dir, which is not set");
        return TK_EINVAL;
    }
    int64_t *steps = NULL;
    int n = tk_ckpt_list(c->output_dir, &steps);
    for (int i = 0; i < n && !dir[0]; i++) {
        snprintf(dir, dn, "%s/checkpoint-%lld", c->output_dir, (long long)steps[i]);
        tk_err e = {0};
        if (tk_ckpt_verify(dir, &e) != TK_OK) {
            note(cb, "resume_from auto: passing over checkpoint-%lld: %s", (long long)steps[i], e.msg);
            dir[0] = 0;
        }
    }
    free(steps);
    if (n > 0 && !dir[0]) {
        tk_err_set(err, TK_EIO, "resume_from: auto: none of the %d checkpoints in %s is complete (see the notes)",
                   n, c->output_dir);
        return TK_EIO;
    }
    if (!dir[0])
        note(cb, "resume_from auto: no checkpoint in %s yet; starting at step 0", c->output_dir);
    return TK_OK;
}

static int cancelled(const tk_train_callbacks *cb) {
    return cb && cb->cancel && *cb->cancel;
}

/* A checkpoint-STEP; a failed save is said and the run goes on unless
 * save_error is stop (then its error ends the run). */
static tk_status save_checkpoint(const tk_config *c, tk_model *m, tk_adamw *opt, const char *vocab,
                                 const tk_train_state *ss, const tk_train_callbacks *cb, tk_train_result *r,
                                 tk_err *err) {
    tk_err e = {0};
    char path[TK_PATH_MAX];
    if (tk_ckpt_save(c->output_dir, m, opt, c, vocab, ss, path, sizeof path, &e) == TK_OK) {
        snprintf(r->checkpoint, sizeof r->checkpoint, "%s", path);
        r->saves++;
        return TK_OK;
    }
    r->failed_saves++;
    if (c->save_error_stop) {
        *err = e;
        return e.status ? e.status : TK_EIO;
    }
    note(cb, "%s; training goes on (save_error: stop ends the run instead)", e.msg);
    return TK_OK;
}

/* One optimizer step over micro-batches order[g0..g1). The gradients hold
 * scale x the true gradient (fp16 loss scaling; scale 1 otherwise) and the
 * optimizer unscales them; *skipped says the update was skipped for a
 * non-finite gradient norm. */
static tk_status train_group(tk_model *m, tk_adamw *opt, const tk_batch *train, const int *order,
                             int g0, int g1, uint64_t *micro, float lr, float scale,
                             double *loss_sum, int64_t *rows, float *gnorm, int *skipped,
                             tk_err *err) {
    tk_status st = tk_model_zero_grads(m, err);
    if (st != TK_OK)
        return st;
    int64_t total = 0;
    for (int j = g0; j < g1; j++)
        total += train[order[j]].B;
    for (int j = g0; j < g1 && st == TK_OK; j++) {
        const tk_batch *b = &train[order[j]];
        float loss = 0;
        st = tk_model_forward_backward(m, b, (*micro)++, scale * ((float)b->B / (float)total), &loss,
                                       NULL, err);
        if (st == TK_OK) {
            *loss_sum += (double)loss * b->B;
            *rows += b->B;
        }
    }
    if (st != TK_OK)
        return st;
    return tk_adamw_step(opt, lr, 1.0f / scale, gnorm, skipped, err);
}

tk_status tk_train_run(const tk_config *c, tk_model *m, const tk_batch *train, int n_train,
                       const tk_batch *dev, int n_dev, const tk_train_callbacks *cb,
                       tk_train_result *r, tk_err *err) {
    memset(r, 0, sizeof *r);
    tk_err local = { 0 };
    if (!err) err = &local; /* callees' failures are read from it, never guessed */
    if (!c || !m || (n_train > 0 && !train) || n_train <= 0 || (n_dev > 0 && !dev)) {
        tk_err_set(err, TK_EINVAL, "train: %s", n_train <= 0 ? "the training set has no batches"
                                                            : "no config, model or batches");
        return r->status = TK_EINVAL;
    }
    tk_dev *d = tk_model_dev(m);
    tk_alloc *a = tk_dev_alloc(d);
    tk_alloc_stats s0;
    tk_alloc_stats_get(a, &s0);
    r->allocated_before = s0.allocated;
    double t_start = now_s();

    int k = c->accumulate > 1 ? c->accumulate : 1;
    int64_t steps_per_epoch = (n_train + k - 1) / k;
    int epochs = c->epochs > 0 ? c->epochs : 1;
    int64_t total_steps = steps_per_epoch * epochs;
    if (c->max_steps > 0) {
        total_steps = c->max_steps;
        epochs = (int)((total_steps + steps_per_epoch - 1) / steps_per_epoch);
    }
    tk_sched sched = tk_sched_from_config(c, total_steps);
    int log_every = c->log_every > 0 ? c->log_every : 10;

    tk_status st = TK_OK;
    /* before any exit path: the result reports it whatever happens */
    tk_loss_scaler scaler;
    tk_loss_scaler_init(&scaler, c->precision);
    tk_adamw *opt = NULL;
    int np = 0;
    tk_optim_param *ps = NULL;
    int *order = tk_malloc((size_t)n_train * sizeof *order);
    r->history = tk_calloc((size_t)epochs, sizeof *r->history);
    if (!order || !r->history) {
        tk_err_set(err, TK_ENOMEM, "train: out of host memory");
        st = TK_ENOMEM;
        goto out;
    }
    char resume[TK_PATH_MAX + 64] = "";
    if (c->resume_from[0] && (st = pick_resume(c, cb, resume, sizeof resume, err)) != TK_OK)
        goto out;
    /* an HF folder that is not a checkpoint: its weights only */
    if (c->resume_from[0] && !resume[0] && strcmp(c->resume_from, "auto") != 0 &&
        (st = tk_model_load_hf(m, c->resume_from, NULL, err)) != TK_OK)
        goto out;
    /* Gradients before optimizer state, as in PyTorch (first backward, then
     * first step); the grad tensors must exist for the optimizer's table. */
    if ((st = tk_model_alloc_grads(m, err)) != TK_OK)
        goto out;
    if (!(ps = tk_train_optim_params(m, &np))) {
        tk_err_set(err, TK_ENOMEM, "train: out of host memory");
        st = TK_ENOMEM;
        goto out;
    }
    if (!(opt = tk_adamw_new(d, c, ps, np, err))) {
        st = err->status; /* the optimizer's own: out of host or device memory, a bad config */
        goto out;
    }

    uint64_t micro = 0;
    int64_t step = 0;
    double log_loss = 0;
    int64_t log_rows = 0;
    int oom_retried = 0;
    int ep0 = 0, pos0 = 0;
    double ep_loss0 = 0, ep_s0 = 0;
    int64_t ep_rows0 = 0;
    uint64_t digest = c->output_dir[0] || resume[0] ? tk_ckpt_data_digest(train, n_train) : 0;
    const char *vocab = cb && cb->vocab_file ? cb->vocab_file : c->vocab;
    if (resume[0]) {
        tk_train_state rs;
        if ((st = tk_ckpt_load(resume, m, opt, c, n_train, digest, &rs, err)) != TK_OK)
            goto out;
        step = rs.step;
        micro = rs.micro;
        log_loss = rs.log_loss;
        log_rows = rs.log_rows;
        oom_retried = rs.oom_retried;
        scaler = rs.scaler;
        ep0 = rs.epoch;
        pos0 = rs.position;
        ep_loss0 = rs.ep_loss;
        ep_rows0 = rs.ep_rows;
        ep_s0 = rs.ep_seconds;
        t_start -= rs.run_seconds;
        int nh = rs.n_history < epochs ? rs.n_history : epochs;
        memcpy(r->history, rs.history, (size_t)nh * sizeof *r->history);
        r->n_history = nh;
        r->epochs_done = nh;
        tk_train_state_clear(&rs);
        snprintf(r->resumed_from, sizeof r->resumed_from, "%s", resume);
        r->resumed_step = step;
        note(cb, "resumed from %s: step %lld of %lld, epoch %d, %d epoch(s) in the history", resume,
             (long long)step, (long long)total_steps, ep0 + 1, nh);
        for (int i = 0; i < nh && cb && cb->on_epoch; i++)
            cb->on_epoch(cb->ud, &r->history[i]);
    }
    double last_save = now_s();
    int every_epoch = c->save_every <= 0 && c->save_every_s <= 0;
    /* a checkpoint taken inside an epoch (position > 0) leaves that epoch
     * open: its end (dev eval, history, the model folder) is still owed even
     * when no step is left, as after a save at the run's last step */
    int open_epoch = resume[0] && pos0 > 0;
    for (int ep = ep0; ep < epochs && (step < total_steps || (ep == ep0 && open_epoch)); ep++) {
        double t_ep = now_s() - (ep == ep0 ? ep_s0 : 0), ep_loss = ep == ep0 ? ep_loss0 : 0;
        int64_t ep_rows = ep == ep0 ? ep_rows0 : 0;
        float gnorm = 0;
        tk_alloc_reset_peak(a);
        epoch_order(order, n_train, c->seed, ep);
        for (int g0 = ep == ep0 ? pos0 : 0; g0 < n_train && step < total_steps; g0 += k) {
            if (cancelled(cb)) {
                tk_err_set(err, TK_ECANCEL, "training cancelled after step %lld of %lld",
                           (long long)step, (long long)total_steps);
                st = TK_ECANCEL;
                goto out;
            }
            int g1 = g0 + k < n_train ? g0 + k : n_train;
            float lr = tk_sched_lr(&sched, step);
            double lsum = 0;
            int64_t rows = 0;
            int skipped = 0;
            st = train_group(m, opt, train, order, g0, g1, &micro, lr, scaler.scale, &lsum, &rows, &gnorm,
                             &skipped, err);
            if (st == TK_EOOM && c->empty_cache == TK_EMPTY_ON_OOM && !oom_retried) {
                /* The policy users apply by hand: release the cache, redo the
                 * whole step once (its gradients are zeroed again). */
                oom_retried = 1;
                tk_alloc_empty_cache(a);
                lsum = 0;
                rows = 0;
                st = train_group(m, opt, train, order, g0, g1, &micro, lr, scaler.scale, &lsum, &rows,
                                 &gnorm, &skipped, err);
            }
            if (st != TK_OK)
                goto out;
            tk_loss_scaler_update(&scaler, skipped);
            step++;
            ep_loss += lsum;
            ep_rows += rows;
            log_loss += lsum;
            log_rows += rows;
            if (c->empty_cache == TK_EMPTY_EVERY && c->empty_cache_every > 0 &&
                step % c->empty_cache_every == 0)
                tk_alloc_empty_cache(a);
            if (c->output_dir[0] && !every_epoch &&
                ((c->save_every > 0 && step % c->save_every == 0) ||
                 (c->save_every_s > 0 && now_s() - last_save >= c->save_every_s))) {
                tk_train_state ss = {
                    .step = step, .epoch = ep, .position = g1, .micro = micro,
                    .ep_loss = ep_loss, .log_loss = log_loss, .ep_rows = ep_rows, .log_rows = log_rows,
                    .ep_seconds = now_s() - t_ep, .run_seconds = now_s() - t_start,
                    .oom_retried = oom_retried, .scaler = scaler, .sched = sched,
                    .n_train = n_train, .data_digest = digest,
                    .n_history = r->n_history, .history = r->history,
                };
                if ((st = save_checkpoint(c, m, opt, vocab, &ss, cb, r, err)) != TK_OK)
                    goto out;
                last_save = now_s();
            }
            if (cb && cb->on_progress && (step % log_every == 0 || step == total_steps)) {
                double el = now_s() - t_ep;
                double el_run = now_s() - t_start;
                tk_progress p = {
                    .epoch = ep + 1, .epochs = epochs, .step = step, .total_steps = total_steps,
                    .loss = log_rows ? (float)(log_loss / (double)log_rows) : 0.0f,
                    .lr = lr, .grad_norm = gnorm,
                    .loss_scale = scaler.scale, .skipped_steps = scaler.skipped,
                    .samples_per_s = el > 0 ? (double)ep_rows / el : 0,
                    .eta_s = el_run / (double)step * (double)(total_steps - step),
                };
                fill_progress(&p, d);
                log_loss = 0;
                log_rows = 0;
                if (cb->on_progress(cb->ud, &p)) {
                    tk_err_set(err, TK_ECANCEL, "training cancelled after step %lld of %lld",
                               (long long)step, (long long)total_steps);
                    st = TK_ECANCEL;
                    goto out;
                }
            }
        }
        tk_epoch_stats *es = &r->history[r->n_history];
        memset(es, 0, sizeof *es);
        es->epoch = ep + 1;
        es->seconds = now_s() - t_ep;
        es->train_loss = ep_rows ? (float)(ep_loss / (double)ep_rows) : NAN;
        es->samples_per_s = es->seconds > 0 ? (double)ep_rows / es->seconds : 0;
        es->dev_loss = es->dev_acc = es->dev_f1 = es->dev_em = es->dev_span_f1 = NAN;
        if (n_dev > 0 && (st = evaluate(m, dev, n_dev, es, err)) != TK_OK)
            goto out;
        tk_alloc_stats sp;
        tk_alloc_stats_get(a, &sp);
        es->peak_allocated = sp.allocated_peak;
        es->peak_reserved = sp.reserved_peak;
        if (sp.allocated_peak > r->peak_allocated)
            r->peak_allocated = sp.allocated_peak;
        if (sp.reserved_peak > r->peak_reserved)
            r->peak_reserved = sp.reserved_peak;
        if (c->output_dir[0]) {
            /* a full disk is the checkpoints' policy here too (save_error) */
            tk_err e = {0};
            if (tk_model_save_hf(m, c->output_dir, &e) == TK_OK) {
                snprintf(r->checkpoint, sizeof r->checkpoint, "%s", c->output_dir);
            } else if (c->save_error_stop) {
                *err = e;
                st = e.status ? e.status : TK_EIO;
                goto out;
            } else {
                r->failed_saves++;
                note(cb, "%s (the model folder's earlier files are kept); training goes on", e.msg);
            }
        }
        r->n_history++;
        r->epochs_done = ep + 1;
        if (c->output_dir[0] && every_epoch) {
            tk_train_state ss = {
                .step = step, .epoch = ep + 1, .position = 0, .micro = micro,
                .log_loss = log_loss, .log_rows = log_rows, .run_seconds = now_s() - t_start,
                .oom_retried = oom_retried, .scaler = scaler, .sched = sched,
                .n_train = n_train, .data_digest = digest,
                .n_history = r->n_history, .history = r->history,
            };
            if ((st = save_checkpoint(c, m, opt, vocab, &ss, cb, r, err)) != TK_OK)
                goto out;
        }
        if (cb && cb->on_epoch)
            cb->on_epoch(cb->ud, es);
    }

out:
    r->steps = tk_adamw_steps(opt);
    r->skipped_steps = scaler.skipped;
    r->loss_scale = scaler.scale;
    if (st == TK_EOOM) {
        const tk_oom *o = tk_dev_last_oom(d);
        if (o) {
            r->have_oom = 1;
            r->oom = *o;
        }
    }
    tk_adamw_destroy(&opt);
    free(ps);
    free(order);
    {
        tk_alloc_stats s1;
        tk_alloc_stats_get(a, &s1);
        r->allocated_after = s1.allocated;
        if (s1.allocated_peak > r->peak_allocated)
            r->peak_allocated = s1.allocated_peak;
        if (s1.reserved_peak > r->peak_reserved)
            r->peak_reserved = s1.reserved_peak;
    }
    r->seconds = now_s() - t_start;
    return r->status = st;
}

/* ---- measuring a config the way the planner replays it ---------------------- */

tk_status tk_train_measure(const tk_config *c0, tk_dev_kind kind, int timed_steps, tk_measure *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    tk_err local = { 0 };
    if (!err) err = &local;
    tk_config c = *c0;
    c.device = kind == TK_DEV_CUDA ? TK_DEVICE_CUDA : TK_DEVICE_CPU;
    c.capacity = 0;
    c.gpu[0] = 0;
    c.epochs = 1;
    c.max_steps = 0;
    c.output_dir[0] = 0;
    c.resume_from[0] = 0;
    tk_model_opts mo;
    if (tk_model_opts_from_config(&mo, &c, err) != TK_OK) return err->status;
    tk_dev_opts dopts = {.kind = kind, .threads = c.threads};
    tk_dev *d = tk_dev_new(&dopts, err);
    tk_model *m = d ? tk_model_new(d, &mo, err) : NULL;
    tk_status st = m ? tk_model_init_random(m, 3, err) : err->status;
    int rows = c.head == TK_HEAD_FLATTEN_DENSE ? (c.towers > 0 ? c.towers : 1) : 1;
    int B = c.batch_size, T = c.max_len, EB = c.eval_batch_size > 0 ? c.eval_batch_size : B;
    int k = c.accumulate > 1 ? c.accumulate : 1;
    int nsteps = timed_steps > 0 ? timed_steps : 0;
    size_t nb = (size_t)(B > EB ? B : EB) * rows * T;
    int32_t *ids = tk_malloc(nb * 4), *types = tk_calloc(nb, 4), *mask = tk_malloc(nb * 4);
    int32_t *lab = tk_calloc((size_t)(B > EB ? B : EB), 4);
    int nbatch = 2 * k > nsteps * k ? 2 * k : nsteps * k;
    tk_batch *train = tk_calloc((size_t)nbatch, sizeof *train);
    if (st == TK_OK && (!ids || !types || !mask || !lab || !train)) {
        tk_err_set(err, TK_ENOMEM, "out of host memory");
        st = TK_ENOMEM;
    }
    if (st == TK_OK) {
        tk_dev_info info;
        tk_dev_info_get(d, &info);
        snprintf(out->device, sizeof out->device, "%s", info.name);
        for (size_t i = 0; i < nb; i++) {
            ids[i] = (int32_t)(100 + i % 500);
            mask[i] = 1;
        }
        for (int i = 0; i < nbatch; i++)
            train[i] = (tk_batch){.B = B, .T = T, .input_ids = ids, .token_type_ids = types, .attention_mask = mask,
                                  .labels = lab, .start_positions = lab, .end_positions = lab};
        tk_batch dev = train[0];
        dev.B = EB;
        tk_train_result r;
        double t0 = now_s();
        st = tk_train_run(&c, m, train, 2 * k, &dev, 1, NULL, &r, err);
        if (st == TK_OK) st = tk_dev_sync(d, err);
        double t1 = now_s();
        out->peak_allocated = r.peak_allocated;
        out->peak_reserved = r.peak_reserved;
        out->timed_steps = r.steps;
        out->ms_per_step = r.steps > 0 ? 1e3 * (t1 - t0) / (double)r.steps : 0;
        tk_train_result_clear(&r);
        if (st == TK_OK && kind == TK_DEV_CUDA) {
            /* CUPTI's figures before the timing run: the peak is the memory run's */
            tk_cuda_mem_totals tot;
            if ((st = tk_dev_cuda_mem_totals(d, &tot, err)) == TK_OK) {
                out->have_device = 1;
                out->cupti_active = tot.cupti_active;
                out->device_peak = tot.device_peak;
                out->plugin_bytes = tot.plugin_bytes;
            }
        }
        if (st == TK_OK && nsteps > 0) {
            tk_config ct = c;
            ct.max_steps = nsteps;
            t0 = now_s();
            st = tk_train_run(&ct, m, train, nsteps * k, NULL, 0, NULL, &r, err);
            if (st == TK_OK) st = tk_dev_sync(d, err);
            t1 = now_s();
            out->timed_steps = r.steps;
            out->ms_per_step = r.steps > 0 ? 1e3 * (t1 - t0) / (double)r.steps : 0;
            tk_train_result_clear(&r);
        }
    }
    free(ids);
    free(types);
    free(mask);
    free(lab);
    free(train);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    return st;
}
