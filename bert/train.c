/* train.c — the training loop: epochs of optimizer steps, eval after each
 * epoch, history, progress, cancel, OOM unwinding and checkpoints.
 *
 * tk_train_run is a short loop of named steps, each a function of one job:
 * run_begin (arguments, sizes), run_resume (a checkpoint or HF weights, the
 * trainer), run_epoch (its order, then run_step for each optimizer step:
 * tk_train_step of step.c — the step the planner runs too — then a due
 * checkpoint and progress), run_eval, run_save (the model folder),
 * run_checkpoint, run_end (results, memory back). run_state is the one
 * builder of tk_train_state, save_failed the one save-error policy.
 *
 * Guarantees:
 *  - k micro-batches make one optimizer step (tk_train_step); micro-batch
 *    j's gradient is scaled by B_j / sum(B), so the step equals the one on
 *    the concatenated batch (mean loss over its examples).
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
#include "tk_data_parallel.h"
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

void tk_train_epoch_order(int *order, int n, uint64_t seed, int epoch) {
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
    int n = tk_ckpt_list(c->output_dir, &steps), mine = 0;
    for (int i = 0; i < n && !dir[0]; i++) {
        snprintf(dir, dn, "%s/checkpoint-%lld", c->output_dir, (long long)steps[i]);
        tk_err e = {0};
        char why[256];
        if (!tk_ckpt_is_ours(dir, why, sizeof why)) {
            note(cb, "resume_from auto: passing over checkpoint-%lld: %s", (long long)steps[i], why);
            dir[0] = 0;
            continue;
        }
        mine++;
        if (tk_ckpt_verify(dir, &e) != TK_OK) {
            note(cb, "resume_from auto: passing over checkpoint-%lld: %s", (long long)steps[i], e.msg);
            dir[0] = 0;
        }
    }
    free(steps);
    if (mine > 0 && !dir[0]) {
        tk_err_set(err, TK_EIO, "resume_from: auto: none of the %d checkpoints in %s is complete (see the notes)",
                   mine, c->output_dir);
        return TK_EIO;
    }
    if (!dir[0])
        note(cb, "resume_from auto: no checkpoint in %s yet; starting at step 0", c->output_dir);
    return TK_OK;
}

static int cancelled(const tk_train_callbacks *cb) {
    return cb && cb->cancel && *cb->cancel;
}

/* Rank 0 writes the run's files; the others train alongside it. */
static int writer(const tk_trainer *t) { return t->rank == 0; }

/* Everything one run carries from step to step. */
typedef struct run {
    const tk_config *c;
    tk_model *m;
    tk_dev *d;
    tk_alloc *a;
    const tk_batch *train, *dev;
    int n_train, n_dev;
    const tk_train_callbacks *cb;
    tk_train_result *r;
    tk_trainer t;               /* the optimizer and the step counters */
    int k, epochs, log_every;   /* k: micro-batches per step, all ranks' */
    int want_cancel;            /* the progress callback asked to stop */
    int64_t total_steps;
    int *order;                 /* the epoch's order of micro-batches */
    double t_start, last_save;
    int every_epoch;            /* checkpoints at each epoch's end only */
    uint64_t digest;            /* of the training batches, for checkpoints */
    const char *vocab;          /* copied into checkpoints */
    char resume[TK_PATH_MAX + 64]; /* the checkpoint the run goes on from ("" none) */
    /* where the run stands: restored by a resume, kept by each step */
    int ep0, pos0;              /* the first epoch and its first micro-batch */
    double ep_loss0, ep_s0;     /* that epoch's sums before the resume */
    int64_t ep_rows0;
    int ep;                     /* the epoch under way */
    double t_ep, ep_loss, log_loss;
    int64_t ep_rows, log_rows;
    float gnorm;
} run;

static tk_status cancel_error(run *R, tk_err *err) {
    tk_err_set(err, TK_ECANCEL, "training cancelled after step %lld of %lld", (long long)R->t.step,
               (long long)R->total_steps);
    return TK_ECANCEL;
}

/* Arguments, the run's length in steps and epochs, its host arrays. */
static tk_status run_begin(run *R, tk_err *err) {
    const tk_config *c = R->c;
    if (!c || !R->m || !R->train || R->n_train <= 0 || (R->n_dev > 0 && !R->dev)) {
        tk_err_set(err, TK_EINVAL, "train: %s", R->n_train <= 0 ? "the training set has no batches"
                                                                : "no config, model or batches");
        return TK_EINVAL;
    }
    R->d = tk_model_dev(R->m);
    R->a = tk_dev_alloc(R->d);
    tk_alloc_stats s0;
    tk_alloc_stats_get(R->a, &s0);
    R->r->allocated_before = s0.allocated;
    R->t_start = now_s();
    /* one step takes accumulate micro-batches on each of world_size ranks */
    R->k = (c->accumulate > 1 ? c->accumulate : 1) * tk_config_world_size(c);
    int64_t steps_per_epoch = (R->n_train + R->k - 1) / R->k;
    R->epochs = c->epochs > 0 ? c->epochs : 1;
    R->total_steps = steps_per_epoch * R->epochs;
    if (c->max_steps > 0) {
        R->total_steps = c->max_steps;
        R->epochs = (int)((R->total_steps + steps_per_epoch - 1) / steps_per_epoch);
    }
    R->log_every = c->log_every > 0 ? c->log_every : 10;
    R->every_epoch = c->save_every <= 0 && c->save_every_s <= 0;
    R->vocab = R->cb && R->cb->vocab_file ? R->cb->vocab_file : c->vocab;
    /* nothing is written into a folder holding another model's files (the
     * session refuses it before any weight is fetched; this holds for
     * every caller) */
    tk_status st = tk_ckpt_claim_output_dir(c, err);
    if (st != TK_OK) return st;
    /* the result reports the scaler whatever happens */
    tk_loss_scaler_init(&R->t.scaler, c->precision);
    R->order = tk_malloc((size_t)R->n_train * sizeof *R->order);
    R->r->history = tk_calloc((size_t)R->epochs, sizeof *R->r->history);
    if (!R->order || !R->r->history) {
        tk_err_set(err, TK_ENOMEM, "train: out of host memory");
        return TK_ENOMEM;
    }
    return TK_OK;
}

/* Where the run stands, as a checkpoint records it: the one builder of
 * tk_train_state (epoch and position: where the next step starts). */
static tk_train_state run_state(const run *R, int epoch, int position) {
    int open = position > 0; /* the epoch's sums go on only inside it */
    return (tk_train_state){
        .step = R->t.step, .epoch = epoch, .position = position, .micro = R->t.micro,
        .ep_loss = open ? R->ep_loss : 0, .ep_rows = open ? R->ep_rows : 0,
        .log_loss = R->log_loss, .log_rows = R->log_rows,
        .ep_seconds = open ? now_s() - R->t_ep : 0, .run_seconds = now_s() - R->t_start,
        .oom_retried = R->t.oom_retried, .scaler = R->t.scaler, .sched = R->t.sched,
        .n_train = R->n_train, .data_digest = R->digest,
        .n_history = R->r->n_history, .history = R->r->history,
    };
}

/* The inverse of run_state: a checkpoint's state put back into the run. */
static void run_restore(run *R, tk_train_state *rs) {
    tk_train_result *r = R->r;
    R->t.step = rs->step;
    R->t.micro = rs->micro;
    R->t.oom_retried = rs->oom_retried;
    R->t.scaler = rs->scaler;
    R->log_loss = rs->log_loss;
    R->log_rows = rs->log_rows;
    R->ep0 = rs->epoch;
    R->pos0 = rs->position;
    R->ep_loss0 = rs->ep_loss;
    R->ep_rows0 = rs->ep_rows;
    R->ep_s0 = rs->ep_seconds;
    R->t_start -= rs->run_seconds;
    int nh = rs->n_history < R->epochs ? rs->n_history : R->epochs;
    memcpy(r->history, rs->history, (size_t)nh * sizeof *r->history);
    r->n_history = nh;
    r->epochs_done = nh;
}

/* resume_from: the checkpoint to go on from (weights, moments, counters,
 * history) or an HF folder's weights; then the optimizer. */
static tk_status run_resume(run *R, tk_err *err) {
    const tk_config *c = R->c;
    tk_status st;
    if (c->resume_from[0] && (st = pick_resume(c, R->cb, R->resume, sizeof R->resume, err)) != TK_OK)
        return st;
    /* an HF folder that is not a checkpoint: its weights only */
    if (c->resume_from[0] && !R->resume[0] && strcmp(c->resume_from, "auto") != 0 &&
        (st = tk_model_load_hf(R->m, c->resume_from, NULL, err)) != TK_OK)
        return st;
    if ((st = tk_trainer_open(&R->t, c, R->m, R->total_steps, err)) != TK_OK)
        return st;
    R->digest = c->output_dir[0] || R->resume[0] ? tk_ckpt_data_digest(R->train, R->n_train) : 0;
    if (!R->resume[0])
        return TK_OK;
    tk_train_state rs;
    if ((st = tk_ckpt_load(R->resume, R->m, R->t.opt, c, R->n_train, R->digest, &rs, err)) != TK_OK)
        return st;
    run_restore(R, &rs);
    tk_train_state_clear(&rs);
    tk_train_result *r = R->r;
    snprintf(r->resumed_from, sizeof r->resumed_from, "%s", R->resume);
    r->resumed_step = R->t.step;
    note(R->cb, "resumed from %s: step %lld of %lld, epoch %d, %d epoch(s) in the history", R->resume,
         (long long)R->t.step, (long long)R->total_steps, R->ep0 + 1, r->n_history);
    for (int i = 0; i < r->n_history && R->cb && R->cb->on_epoch; i++)
        R->cb->on_epoch(R->cb->ud, &r->history[i]);
    return TK_OK;
}

/* The one save-error policy, for checkpoints and the epoch's model folder:
 * a failed save is counted and said, and the run goes on unless save_error
 * is stop (then the save's error ends the run). `kept` says what survives. */
static tk_status save_failed(run *R, const tk_err *e, const char *kept, tk_err *err) {
    R->r->failed_saves++;
    if (R->c->save_error_stop) {
        *err = *e;
        return e->status ? e->status : TK_EIO;
    }
    note(R->cb, "%s%s", e->msg, kept);
    return TK_OK;
}

/* A checkpoint-STEP of where the run stands. */
static tk_status run_checkpoint(run *R, int epoch, int position, tk_err *err) {
    /* sharded AdamW state is saved whole: every rank sends its pieces */
    void **full = NULL;
    tk_status st = tk_dp_gather_state(&R->t, &full, err);
    if (st != TK_OK)
        return st;
    if (!writer(&R->t)) {
        tk_dp_free_state(&R->t, full);
        return TK_OK;
    }
    tk_train_state ss = run_state(R, epoch, position);
    ss.optim_full = full;
    tk_err e = {0};
    char path[TK_PATH_MAX];
    st = tk_ckpt_save(R->c->output_dir, R->m, R->t.opt, R->c, R->vocab, &ss, path, sizeof path, &e);
    tk_dp_free_state(&R->t, full);
    if (st != TK_OK)
        return save_failed(R, &e, "; training goes on (save_error: stop ends the run instead)", err);
    snprintf(R->r->checkpoint, sizeof R->r->checkpoint, "%s", path);
    R->r->saves++;
    return TK_OK;
}

/* The progress callback every log_every steps and at the last one; its
 * nonzero answer cancels the run. */
static tk_status run_progress(run *R, float lr, tk_err *err) {
    const tk_train_callbacks *cb = R->cb;
    int64_t step = R->t.step;
    if (!cb || !cb->on_progress || (step % R->log_every != 0 && step != R->total_steps))
        return TK_OK;
    double el = now_s() - R->t_ep, el_run = now_s() - R->t_start;
    tk_progress p = {
        .epoch = R->ep + 1, .epochs = R->epochs, .step = step, .total_steps = R->total_steps,
        .loss = R->log_rows ? (float)(R->log_loss / (double)R->log_rows) : 0.0f,
        .lr = lr, .grad_norm = R->gnorm,
        .loss_scale = R->t.scaler.scale, .skipped_steps = R->t.scaler.skipped,
        .samples_per_s = el > 0 ? (double)R->ep_rows / el : 0,
        .eta_s = el_run / (double)step * (double)(R->total_steps - step),
    };
    fill_progress(&p, R->d);
    R->log_loss = 0;
    R->log_rows = 0;
    if (cb->on_progress(cb->ud, &p))
        R->want_cancel = 1; /* every rank stops before the next step (run_step) */
    return R->t.world > 1 ? TK_OK : R->want_cancel ? cancel_error(R, err) : TK_OK;
}

/* One optimizer step of the epoch's micro-batches from g0, then what follows
 * a step: the sums, a checkpoint when one is due, progress. */
static tk_status run_step(run *R, int g0, tk_err *err) {
    double stop = cancelled(R->cb) || R->want_cancel;
    /* an interrupt seen by one rank stops them all at the same step */
    tk_status st;
    if (R->t.world > 1 && (st = tk_coll_all_reduce_host(R->t.coll, &stop, 1, err)) != TK_OK)
        return st;
    if (stop > 0)
        return cancel_error(R, err);
    int g1 = g0 + R->k < R->n_train ? g0 + R->k : R->n_train;
    tk_step_out o;
    st = tk_train_step(&R->t, R->train, R->order, g0, g1, &o, err);
    if (st != TK_OK)
        return st;
    R->gnorm = o.grad_norm;
    R->ep_loss += o.loss_sum;
    R->ep_rows += o.rows;
    R->log_loss += o.loss_sum;
    R->log_rows += o.rows;
    const tk_config *c = R->c;
    double due = c->output_dir[0] && !R->every_epoch &&
                 ((c->save_every > 0 && R->t.step % c->save_every == 0) ||
                  (c->save_every_s > 0 && now_s() - R->last_save >= c->save_every_s));
    /* by the clock, the ranks' clocks differ: every rank saves (gathers its
     * state) when any is due, or none */
    if (R->t.world > 1 && c->save_every_s > 0 && (st = tk_coll_all_reduce_host(R->t.coll, &due, 1, err)) != TK_OK)
        return st;
    if (due > 0) {
        /* the clock restarts after a failed save too: it is retried in
         * save_every_s, not at every step */
        if ((st = run_checkpoint(R, R->ep, g1, err)) != TK_OK)
            return st;
        R->last_save = now_s();
    }
    return run_progress(R, o.lr, err);
}

/* The epoch's history row: train loss, dev metrics, the epoch's peaks. */
static tk_status run_eval(run *R, tk_epoch_stats *es, tk_err *err) {
    memset(es, 0, sizeof *es);
    es->epoch = R->ep + 1;
    es->seconds = now_s() - R->t_ep;
    es->train_loss = R->ep_rows ? (float)(R->ep_loss / (double)R->ep_rows) : NAN;
    es->samples_per_s = es->seconds > 0 ? (double)R->ep_rows / es->seconds : 0;
    es->dev_loss = es->dev_acc = es->dev_f1 = es->dev_em = es->dev_span_f1 = NAN;
    tk_status st;
    if (R->n_dev > 0 && (st = evaluate(R->m, R->dev, R->n_dev, es, err)) != TK_OK)
        return st;
    tk_alloc_stats sp;
    tk_alloc_stats_get(R->a, &sp);
    es->peak_allocated = sp.allocated_peak;
    es->peak_reserved = sp.reserved_peak;
    if (sp.allocated_peak > R->r->peak_allocated)
        R->r->peak_allocated = sp.allocated_peak;
    if (sp.reserved_peak > R->r->peak_reserved)
        R->r->peak_reserved = sp.reserved_peak;
    return TK_OK;
}

/* The HF model folder in output_dir, after each evaluated epoch. */
static tk_status run_save(run *R, tk_err *err) {
    if (!R->c->output_dir[0] || !writer(&R->t))
        return TK_OK;
    tk_err e = {0};
    if (tk_model_save_hf(R->m, R->c->output_dir, &e) != TK_OK)
        return save_failed(R, &e, " (the model folder's earlier files are kept); training goes on", err);
    snprintf(R->r->checkpoint, sizeof R->r->checkpoint, "%s", R->c->output_dir);
    return TK_OK;
}

/* One epoch: its order, its steps from the resume position, its end (eval,
 * model folder, the epoch's checkpoint, on_epoch). */
static tk_status run_epoch(run *R, tk_err *err) {
    int ep = R->ep, first = ep == R->ep0;
    R->t_ep = now_s() - (first ? R->ep_s0 : 0);
    R->ep_loss = first ? R->ep_loss0 : 0;
    R->ep_rows = first ? R->ep_rows0 : 0;
    R->gnorm = 0;
    tk_alloc_reset_peak(R->a);
    tk_train_epoch_order(R->order, R->n_train, R->c->seed, ep);
    tk_status st;
    for (int g0 = first ? R->pos0 : 0; g0 < R->n_train && R->t.step < R->total_steps; g0 += R->k)
        if ((st = run_step(R, g0, err)) != TK_OK)
            return st;
    tk_train_result *r = R->r;
    tk_epoch_stats *es = &r->history[r->n_history];
    if ((st = run_eval(R, es, err)) != TK_OK || (st = run_save(R, err)) != TK_OK)
        return st;
    r->n_history++;
    r->epochs_done = ep + 1;
    if (R->c->output_dir[0] && R->every_epoch && (st = run_checkpoint(R, ep + 1, 0, err)) != TK_OK)
        return st;
    if (R->cb && R->cb->on_epoch)
        R->cb->on_epoch(R->cb->ud, es);
    return TK_OK;
}

/* Whatever ended the run: its counters, its OOM record, its memory back. */
static tk_status run_end(run *R, tk_status st) {
    tk_train_result *r = R->r;
    r->steps = tk_adamw_steps(R->t.opt);
    r->skipped_steps = R->t.scaler.skipped;
    r->loss_scale = R->t.scaler.scale;
    if (st == TK_EOOM && R->d && tk_dev_last_oom(R->d)) {
        r->have_oom = 1;
        r->oom = *tk_dev_last_oom(R->d);
    }
    tk_trainer_close(&R->t);
    free(R->order);
    if (R->a) {
        tk_alloc_stats s1;
        tk_alloc_stats_get(R->a, &s1);
        r->allocated_after = s1.allocated;
        if (s1.allocated_peak > r->peak_allocated)
            r->peak_allocated = s1.allocated_peak;
        if (s1.reserved_peak > r->peak_reserved)
            r->peak_reserved = s1.reserved_peak;
        r->seconds = now_s() - R->t_start;
    }
    return r->status = st;
}

tk_status tk_train_run(const tk_config *c, tk_model *m, const tk_batch *train, int n_train,
                       const tk_batch *dev, int n_dev, const tk_train_callbacks *cb,
                       tk_train_result *r, tk_err *err) {
    memset(r, 0, sizeof *r);
    tk_err local = { 0 };
    if (!err) err = &local; /* callees' failures are read from it, never guessed */
    run R = { .c = c, .m = m, .train = train, .n_train = n_train, .dev = dev, .n_dev = n_dev, .cb = cb, .r = r };
    tk_status st = run_begin(&R, err);
    if (st == TK_OK)
        st = run_resume(&R, err);
    R.last_save = now_s();
    /* a checkpoint taken inside an epoch (position > 0) leaves that epoch
     * open: its end (dev eval, history, the model folder) is still owed even
     * when no step is left, as after a save at the run's last step */
    int open_epoch = R.resume[0] && R.pos0 > 0;
    for (R.ep = R.ep0; st == TK_OK && R.ep < R.epochs &&
                       (R.t.step < R.total_steps || (R.ep == R.ep0 && open_epoch)); R.ep++)
        st = run_epoch(&R, err);
    return run_end(&R, st);
}

/* ---- measuring a config the way the planner replays it ---------------------- */

tk_status tk_train_measure(const tk_config *c0, tk_dev_kind kind, int timed_steps, tk_measure *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    tk_err local = { 0 };
    if (!err) err = &local;
    tk_config c = *c0;
    c.attention = tk_config_attention(c0, TK_DEV_META, NULL); /* as the plan of c0 has it */
    c.device = kind == TK_DEV_CUDA ? TK_DEVICE_CUDA : TK_DEVICE_CPU;
    /* Under the plan's capacity: a plan that reaches it releases the cache
     * and retries (as PyTorch's allocator does), and so must the run, or its
     * reserved peak keeps the cached segments the plan gave back (the H200
     * showed 30 MiB more reserved in four `accumulate x2` candidates planned
     * under 300 MiB and measured under the card's 141 GB). The card's
     * buffers as the plan has them (a cpu run of a card's config simulates
     * the card). */
    c.capacity = tk_config_capacity(c0);
    c.gpu[0] = 0;
    c.epochs = 1;
    c.max_steps = 0;
    c.output_dir[0] = 0;
    c.resume_from[0] = 0;
    tk_model_opts mo;
    if (tk_model_opts_from_config(&mo, &c, err) != TK_OK) return err->status;
    tk_dev_opts dopts = {.kind = kind, .threads = c.threads, .capacity = c.capacity,
                         .card_buffers = tk_config_on_card(c0)};
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
