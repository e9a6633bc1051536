/* test_checkpoint.c — checkpoint-STEP folders and exact resume on the cpu
 * device with a tiny BERT (hidden 32, 2 layers, vocabulary 160, dropout on):
 *  - a run cancelled after checkpoint k and resumed with resume_from: auto
 *    ends with weights, the final checkpoint's optimizer file and the
 *    per-epoch metrics bitwise equal to an uninterrupted run, for fp32
 *    AdamW, 8-bit AdamW, fp16 with loss scaling, accumulation (with a
 *    partial last group), dynamic padding, length buckets, and the pooled,
 *    span and flatten_dense heads;
 *  - save_every by the clock saves at the first step boundary after it;
 *  - every field of the training state round-trips exactly (a loss scaler
 *    that has moved, NaN metrics);
 *  - a checkpoint of another config is refused naming the setting;
 *  - a corrupted and a truncated file are detected (checksum, size),
 *    auto passes over them to the next newest, a named one is refused and
 *    the next newest offered, nothing earlier is touched;
 *  - a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored, in a forked child)
 *    makes the next save fail with EFBIG: the run goes on (save_error:
 *    continue) or stops (save_error: stop), the earlier checkpoint still
 *    verifies and no .tmp folder is left. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tk_checkpoint.h"
#include "tk_test.h"
#include "tk_train.h"

#define V 160
#define NL 3
#define TMAX 16

static char root[128];

/* ---- data: n examples of lengths 6..TMAX-1, label = count of token 5 mod 3 */

typedef struct {
    int n;
    int32_t ids[48][TMAX], mask[48][TMAX], types[48][TMAX], labels[48], starts[48], ends[48];
    int len[48];
} corpus;

static void corpus_make(corpus *s, int n) {
    memset(s, 0, sizeof *s);
    s->n = n;
    uint64_t x = 12345;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int len = 6 + (int)((x >> 40) % (TMAX - 6)), fives = 0;
        s->len[i] = len;
        for (int t = 0; t < len; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int id = t == 0 ? 2 : t == len - 1 ? 3 : 4 + (int)((x >> 33) % (V - 4));
            s->ids[i][t] = id;
            s->mask[i][t] = 1;
            fives += id == 5;
        }
        s->labels[i] = fives % NL;
        s->starts[i] = 1 + i % (len - 2);
        s->ends[i] = s->starts[i] + (i % 2);
    }
}

/* Batches of B rows. padded: every batch is TMAX long (fixed); otherwise
 * each is as long as its longest row (dynamic padding). sorted: rows are
 * taken in length order first, as length buckets group them. The row data
 * is copied into per-batch arrays (owned by `store`, free()). */
static tk_batch *batches(const corpus *s, int B, int padded, int sorted, int *nb, int32_t **store) {
    int order[48];
    for (int i = 0; i < s->n; i++) order[i] = i;
    if (sorted)
        for (int i = 1; i < s->n; i++)
            for (int j = i; j > 0 && s->len[order[j]] < s->len[order[j - 1]]; j--) {
                int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
            }
    *nb = (s->n + B - 1) / B;
    tk_batch *b = calloc((size_t)*nb, sizeof *b);
    *store = calloc((size_t)s->n * (3 * TMAX + 3), sizeof(int32_t));
    int32_t *p = *store;
    for (int k = 0; k < *nb; k++) {
        int r0 = k * B, rows = s->n - r0 < B ? s->n - r0 : B, T = padded ? TMAX : 1;
        for (int r = 0; r < rows && !padded; r++) if (s->len[order[r0 + r]] > T) T = s->len[order[r0 + r]];
        int32_t *ids = p, *mask = p + rows * T, *types = p + 2 * rows * T, *lab = p + 3 * rows * T;
        int32_t *st = lab + rows, *en = st + rows;
        p = en + rows;
        for (int r = 0; r < rows; r++) {
            int i = order[r0 + r];
            memcpy(ids + r * T, s->ids[i], (size_t)T * 4);
            memcpy(mask + r * T, s->mask[i], (size_t)T * 4);
            memcpy(types + r * T, s->types[i], (size_t)T * 4);
            lab[r] = s->labels[i];
            st[r] = s->starts[i];
            en[r] = s->ends[i];
        }
        b[k] = (tk_batch){ .B = rows, .T = T, .input_ids = ids, .token_type_ids = types,
                           .attention_mask = mask, .labels = lab, .start_positions = st, .end_positions = en };
    }
    return b;
}

/* ---- runs ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    tk_head_kind head;
    tk_precision precision;
    tk_optim optimizer;
    int accumulate, padded, sorted, batch;
} variant;

static tk_config cfg_of(const variant *v, const char *out) {
    tk_config c;
    tk_config_defaults(&c);
    c.lr = 2e-3f;
    c.warmup_ratio = 0.2f;
    c.epochs = 2;
    c.log_every = 1;
    c.seed = 7;
    c.precision = v->precision;
    c.optimizer = v->optimizer;
    c.accumulate = v->accumulate;
    c.head = v->head;
    c.save_every = 2;
    c.keep_checkpoints = 0;
    snprintf(c.output_dir, sizeof c.output_dir, "%s", out);
    c.resume_from[0] = 0;
    return c;
}

static tk_model *model_of(tk_dev *d, const variant *v) {
    tk_model_opts o;
    memset(&o, 0, sizeof o);
    o.dims = (tk_bert_dims){ .hidden = 32, .layers = 2, .heads = 2, .intermediate = 64, .vocab_size = V,
                             .max_position = 32, .type_vocab = 2, .layer_norm_eps = 1e-12f,
                             .hidden_dropout = 0.1f, .attn_dropout = 0.1f };
    o.head = v->head;
    o.num_labels = NL;
    o.towers = 1;
    o.max_len = TMAX;
    o.precision = v->precision;
    o.seed = 7;
    tk_err e = { 0 };
    tk_model *m = tk_model_new(d, &o, &e);
    if (!m || tk_model_init_random(m, 11, &e) != TK_OK) {
        fprintf(stderr, "  model: %s\n", e.msg);
        tk_model_destroy(&m);
    }
    return m;
}

static tk_dev *cpu(void) {
    tk_dev_opts o = { .kind = TK_DEV_CPU, .threads = 1 };
    tk_err e = { 0 };
    return tk_dev_new(&o, &e);
}

static int64_t cancel_at;
static int stop_at(void *ud, const tk_progress *p) {
    (void)ud;
    return cancel_at > 0 && p->step == cancel_at;
}

static char notes[4096];
static void on_note(void *ud, const char *line) {
    (void)ud;
    size_t l = strlen(notes);
    snprintf(notes + l, sizeof notes - l, "%s\n", line);
}

/* Trains variant v into dir; with stop > 0 cancels after that step, then
 * trains again with resume_from: auto on a freshly initialised model.
 * Returns the final weights (f32, every parameter) and the result. */
static float *run(const variant *v, const char *dir, int64_t stop, tk_train_result *r, int64_t *nw, tk_status *rc,
                  tk_err *e) {
    corpus s;
    corpus_make(&s, v->head == TK_HEAD_SPAN ? 20 : 22);
    int nb;
    int32_t *store;
    tk_batch *tb = batches(&s, v->batch, v->padded, v->sorted, &nb, &store);
    tk_config c = cfg_of(v, dir);
    tk_train_callbacks cb = { .on_progress = stop_at, .on_note = on_note };
    float *w = NULL;
    tk_dev *d = cpu();
    tk_model *m = d ? model_of(d, v) : NULL;
    *rc = TK_EINVAL;
    if (!m) goto done;
    cancel_at = stop;
    *rc = tk_train_run(&c, m, tb, nb, tb, 2, &cb, r, e);
    if (stop > 0) {
        TK_CHECK_MSG(*rc == TK_ECANCEL, "%s: the first half ended with %d (%s)", v->name, *rc, e->msg);
        tk_train_result_clear(r);
        tk_model_destroy(&m);
        cancel_at = 0;
        m = model_of(d, v);
        snprintf(c.resume_from, sizeof c.resume_from, "auto");
        *rc = tk_train_run(&c, m, tb, nb, tb, 2, &cb, r, e);
    }
    *nw = tk_model_n_weights(m);
    w = malloc((size_t)*nw * sizeof *w);
    int64_t off = 0;
    for (int i = 0; i < tk_model_n_params(m); i++) {
        const tk_param *p = tk_model_param(m, i);
        tk_tensor_read_f32(d, p->w, w + off, e);
        off += tk_tensor_numel(p->w);
    }
done:
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    free(tb);
    free(store);
    return w;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    *n = fread(b, 1, (size_t)l, f);
    fclose(f);
    return b;
}

static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

static int same_metrics(const tk_epoch_stats *a, const tk_epoch_stats *b) {
    return a->epoch == b->epoch && !memcmp(&a->train_loss, &b->train_loss, 4) && !memcmp(&a->dev_loss, &b->dev_loss, 4) &&
           !memcmp(&a->dev_acc, &b->dev_acc, 4) && !memcmp(&a->dev_f1, &b->dev_f1, 4) &&
           !memcmp(&a->dev_em, &b->dev_em, 4) && !memcmp(&a->dev_span_f1, &b->dev_span_f1, 4);
}

static void resume_equals_uninterrupted(const variant *v, int64_t stop) {
    char a[512], b[512], p[1200], q[1200];
    snprintf(a, sizeof a, "%s/%s-whole", root, v->name);
    snprintf(b, sizeof b, "%s/%s-resumed", root, v->name);
    tk_train_result ra, rb;
    tk_err e = { 0 };
    tk_status rca, rcb;
    int64_t na = 0, nb = 0;
    float *wa = run(v, a, 0, &ra, &na, &rca, &e);
    TK_CHECK_MSG(rca == TK_OK, "%s: whole run: %s", v->name, e.msg);
    notes[0] = 0;
    float *wb = run(v, b, stop, &rb, &nb, &rcb, &e);
    TK_CHECK_MSG(rcb == TK_OK, "%s: resumed run: %s", v->name, e.msg);
    TK_CHECK_MSG(strstr(notes, "resumed from") != NULL, "%s: no resume note: %s", v->name, notes);
    TK_CHECK_MSG(rb.resumed_step > 0 && rb.resumed_step < stop + 1, "%s: resumed at %lld", v->name,
                 (long long)rb.resumed_step);
    TK_CHECK(wa && wb && na == nb && na > 0);
    if (wa && wb && na == nb)
        TK_CHECK_MSG(memcmp(wa, wb, (size_t)na * 4) == 0, "%s: final weights differ", v->name);
    TK_CHECK_EQ_INT(ra.steps, rb.steps);
    TK_CHECK_EQ_INT(ra.skipped_steps, rb.skipped_steps);
    TK_CHECK(!memcmp(&ra.loss_scale, &rb.loss_scale, 4));
    TK_CHECK_EQ_INT(ra.n_history, rb.n_history);
    for (int i = 0; i < ra.n_history && i < rb.n_history; i++)
        TK_CHECK_MSG(same_metrics(&ra.history[i], &rb.history[i]), "%s: epoch %d metrics differ (%.9g vs %.9g)",
                     v->name, i + 1, ra.history[i].train_loss, rb.history[i].train_loss);
    /* the final checkpoint (total steps are even, save_every 2): moments and weights */
    int64_t *sa = NULL, *sb = NULL;
    int ka = tk_ckpt_list(a, &sa), kb = tk_ckpt_list(b, &sb);
    TK_CHECK(ka > 0 && kb > 0 && sa[0] == sb[0]);
    if (ka > 0 && kb > 0) {
        const char *files[] = { "optimizer.safetensors", "model.safetensors" };
        for (int i = 0; i < 2; i++) {
            snprintf(p, sizeof p, "%s/checkpoint-%lld/%s", a, (long long)sa[0], files[i]);
            snprintf(q, sizeof q, "%s/checkpoint-%lld/%s", b, (long long)sb[0], files[i]);
            TK_CHECK_MSG(same_file(p, q), "%s: %s differs", v->name, p);
        }
    }
    free(sa);
    free(sb);
    free(wa);
    free(wb);
    tk_train_result_clear(&ra);
    tk_train_result_clear(&rb);
}

/* 22 examples: 6 batches of 4 (the last of 2) per epoch, 12 steps */
static const variant FP32 = { "fp32", TK_HEAD_POOLED, TK_PREC_FP32, TK_OPTIM_ADAMW, 1, 1, 0, 4 };

static void test_resume_fp32_adamw(void) { resume_equals_uninterrupted(&FP32, 5); }

static void test_resume_adamw8bit(void) {
    variant v = FP32;
    v.name = "adamw8";
    v.optimizer = TK_OPTIM_ADAMW8;
    resume_equals_uninterrupted(&v, 9);
}

static void test_resume_fp16_loss_scaling(void) {
    variant v = FP32;
    v.name = "fp16";
    v.precision = TK_PREC_FP16;
    resume_equals_uninterrupted(&v, 7);
}

static void test_resume_accumulation(void) {
    variant v = FP32;
    v.name = "accumulate";
    v.accumulate = 2;  /* 6 micro-batches: 3 steps per epoch, 6 in all */
    v.batch = 3;       /* 8 micro-batches of 3 (the last 1): 4 steps per epoch */
    resume_equals_uninterrupted(&v, 3);
}

static void test_resume_dynamic_padding(void) {
    variant v = FP32;
    v.name = "dynamic";
    v.padded = 0;
    resume_equals_uninterrupted(&v, 3);
}

static void test_resume_buckets(void) {
    variant v = FP32;
    v.name = "buckets";
    v.padded = 0;
    v.sorted = 1;
    resume_equals_uninterrupted(&v, 7);
}

static void test_resume_span_head(void) {
    variant v = FP32;
    v.name = "span";
    v.head = TK_HEAD_SPAN;
    v.batch = 5;   /* 20 examples: 4 batches, 8 steps */
    resume_equals_uninterrupted(&v, 5);
}

static void test_resume_flatten_dense_head(void) {
    variant v = FP32;
    v.name = "flatten";
    v.head = TK_HEAD_FLATTEN_DENSE;
    resume_equals_uninterrupted(&v, 3);
}

/* Every field of the training state comes back bit for bit, including a
 * loss scaler that has halved and skipped (the fp16 run above never
 * overflows, so its scale never moves) and NaN metrics (no dev set). */
static void test_state_round_trip(void) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/state", root);
    variant v = FP32;
    v.precision = TK_PREC_FP16;
    tk_config c = cfg_of(&v, dir);
    tk_dev *d = cpu();
    tk_model *m = model_of(d, &v);
    tk_err e = { 0 };
    int np = 0;
    tk_optim_param *ps = NULL;
    tk_adamw *o = NULL;
    TK_CHECK(m && tk_model_alloc_grads(m, &e) == TK_OK && (ps = tk_train_optim_params(m, &np)) &&
             (o = tk_adamw_new(d, &c, ps, np, &e)));
    tk_epoch_stats h[2] = { { .epoch = 1, .train_loss = 1.0986123f, .dev_loss = NAN, .dev_acc = 0.25f },
                            { .epoch = 2, .train_loss = 0.7f, .dev_loss = 0.123456789f, .dev_f1 = NAN } };
    tk_train_state s = { .step = 37, .epoch = 2, .position = 3, .micro = 12345678901234ull,
                         .ep_loss = 3.14159265358979, .log_loss = 2.5e-7, .ep_rows = 12, .log_rows = 4,
                         .ep_seconds = 1.5, .run_seconds = 9.25, .oom_retried = 1,
                         .scaler = { .enabled = 1, .scale = 1024.0f, .good_steps = 17, .growth_interval = 2000,
                                     .skipped = 3 },
                         .sched = tk_sched_from_config(&c, 40), .n_train = 6, .data_digest = 0xfeedbeefcafe1234ull,
                         .n_history = 2, .history = h };
    tk_adamw_set_steps(o, 34);
    char path[600];
    TK_CHECK_MSG(tk_ckpt_save(dir, m, o, &c, NULL, &s, path, sizeof path, &e) == TK_OK, "%s", e.msg);
    tk_train_state l;
    TK_CHECK_MSG(tk_ckpt_load(path, m, o, &c, 6, 0xfeedbeefcafe1234ull, &l, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(l.step, 37);
    TK_CHECK_EQ_INT(l.epoch, 2);
    TK_CHECK_EQ_INT(l.position, 3);
    TK_CHECK(l.micro == 12345678901234ull);
    TK_CHECK(l.ep_loss == s.ep_loss && l.log_loss == s.log_loss && l.ep_seconds == 1.5 && l.run_seconds == 9.25);
    TK_CHECK_EQ_INT(l.ep_rows, 12);
    TK_CHECK_EQ_INT(l.log_rows, 4);
    TK_CHECK_EQ_INT(l.oom_retried, 1);
    TK_CHECK(!memcmp(&l.scaler, &s.scaler, sizeof s.scaler));
    TK_CHECK(l.sched.lr == s.sched.lr && l.sched.warmup_steps == s.sched.warmup_steps &&
             l.sched.total_steps == 40 && l.sched.constant == s.sched.constant);
    TK_CHECK_EQ_INT(tk_adamw_steps(o), 34);
    TK_CHECK_EQ_INT(l.n_history, 2);
    if (l.n_history == 2) {
        TK_CHECK(same_metrics(&l.history[0], &h[0]) && same_metrics(&l.history[1], &h[1]));
        TK_CHECK(isnan(l.history[0].dev_loss) && isnan(l.history[1].dev_f1));
    }
    tk_train_state_clear(&l);
    tk_adamw_destroy(&o);
    free(ps);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
}

static int sleep_at_3(void *ud, const tk_progress *p) {
    (void)ud;
    if (p->step == 3)
        usleep(1100 * 1000);
    return 0;
}

/* save_every: 1s — nothing is saved until a second has passed, then the
 * next step boundary saves. */
static void test_save_by_the_clock(void) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/clock", root);
    corpus s;
    corpus_make(&s, 22);
    int nb;
    int32_t *store;
    tk_batch *tb = batches(&s, 4, 1, 0, &nb, &store);
    tk_config c = cfg_of(&FP32, dir);
    c.epochs = 1;
    c.save_every = 0;
    c.save_every_s = 1;
    tk_dev *d = cpu();
    tk_model *m = model_of(d, &FP32);
    tk_train_result r;
    tk_err e = { 0 };
    tk_train_callbacks cb = { .on_progress = sleep_at_3 };
    TK_CHECK_MSG(tk_train_run(&c, m, tb, nb, NULL, 0, &cb, &r, &e) == TK_OK, "%s", e.msg);
    int64_t *st = NULL;
    int n = tk_ckpt_list(dir, &st);
    TK_CHECK(n >= 1);
    if (n >= 1)
        TK_CHECK_EQ_INT(st[n - 1], 4);  /* the oldest: the first boundary after the second passed */
    free(st);
    tk_train_result_clear(&r);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    free(tb);
    free(store);
}

/* ---- bad checkpoints -------------------------------------------------------- */

static void corrupt_byte(const char *path, long at) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static void test_refuses_another_config(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/fp32-whole", root);  /* written by test_resume_fp32_adamw */
    corpus s;
    corpus_make(&s, 22);
    int nb;
    int32_t *store;
    tk_batch *tb = batches(&s, 4, 1, 0, &nb, &store);
    tk_config c = cfg_of(&FP32, dir);
    c.lr = 3e-3f;
    snprintf(c.resume_from, sizeof c.resume_from, "auto");
    tk_dev *d = cpu();
    tk_model *m = model_of(d, &FP32);
    tk_train_result r;
    tk_err e = { 0 };
    tk_status rc = tk_train_run(&c, m, tb, nb, NULL, 0, NULL, &r, &e);
    TK_CHECK_EQ_INT(rc, TK_EINVAL);
    TK_CHECK_MSG(strstr(e.msg, "lr is") && strstr(e.msg, "made by another run"), "%s", e.msg);
    tk_train_result_clear(&r);
    /* other data: one batch fewer */
    c.lr = 2e-3f;
    rc = tk_train_run(&c, m, tb, nb - 1, NULL, 0, NULL, &r, &e);
    TK_CHECK_EQ_INT(rc, TK_EINVAL);
    TK_CHECK_MSG(strstr(e.msg, "other training data"), "%s", e.msg);
    tk_train_result_clear(&r);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    free(tb);
    free(store);
}

static void test_corrupted_and_truncated(void) {
    char dir[300], p[1200], newest[400], second[400], third[400];
    snprintf(dir, sizeof dir, "%s/fp32-resumed", root);
    int64_t *st = NULL;
    int n = tk_ckpt_list(dir, &st);
    TK_CHECK(n >= 3);
    if (n < 3) { free(st); return; }
    snprintf(newest, sizeof newest, "%s/checkpoint-%lld", dir, (long long)st[0]);
    snprintf(second, sizeof second, "%s/checkpoint-%lld", dir, (long long)st[1]);
    snprintf(third, sizeof third, "%s/checkpoint-%lld", dir, (long long)st[2]);
    tk_err e = { 0 };
    TK_CHECK(tk_ckpt_verify(newest, &e) == TK_OK);
    snprintf(p, sizeof p, "%s/model.safetensors", newest);
    corrupt_byte(p, 5000);
    TK_CHECK(tk_ckpt_verify(newest, &e) == TK_EIO);
    TK_CHECK_MSG(strstr(e.msg, "model.safetensors") && strstr(e.msg, "corrupted"), "%s", e.msg);
    snprintf(p, sizeof p, "%s/optimizer.safetensors", second);
    TK_CHECK(truncate(p, 1000) == 0);
    TK_CHECK(tk_ckpt_verify(second, &e) == TK_EIO);
    TK_CHECK_MSG(strstr(e.msg, "optimizer.safetensors") && strstr(e.msg, "truncated"), "%s", e.msg);
    size_t sn = 0;
    snprintf(p, sizeof p, "%s/trainer_state.json", third);
    char *before = slurp(p, &sn);

    /* auto passes over both, says so, and resumes from the third newest */
    corpus s;
    corpus_make(&s, 22);
    int nb;
    int32_t *store;
    tk_batch *tb = batches(&s, 4, 1, 0, &nb, &store);
    tk_config c = cfg_of(&FP32, dir);
    c.keep_checkpoints = 0;
    snprintf(c.resume_from, sizeof c.resume_from, "auto");
    tk_dev *d = cpu();
    tk_model *m = model_of(d, &FP32);
    tk_train_result r;
    tk_train_callbacks cb = { .on_note = on_note };
    notes[0] = 0;
    tk_status rc = tk_train_run(&c, m, tb, nb, NULL, 0, &cb, &r, &e);
    TK_CHECK_MSG(rc == TK_OK, "%s", e.msg);
    TK_CHECK_MSG(strstr(notes, "passing over checkpoint") && strstr(notes, "corrupted") && strstr(notes, "truncated"),
                 "%s", notes);
    TK_CHECK_STR(r.resumed_from, third);
    tk_train_result_clear(&r);

    /* the damaged ones were replaced by that run; damage the newest again and
     * name it: refused, the next newest offered */
    snprintf(p, sizeof p, "%s/model.safetensors", newest);
    corrupt_byte(p, 6000);
    snprintf(c.resume_from, sizeof c.resume_from, "%s", newest);
    rc = tk_train_run(&c, m, tb, nb, NULL, 0, &cb, &r, &e);
    TK_CHECK_EQ_INT(rc, TK_EIO);
    TK_CHECK_MSG(strstr(e.msg, "corrupted") && strstr(e.msg, "newest complete checkpoint beside it is") &&
                 strstr(e.msg, second), "%s", e.msg);
    tk_train_result_clear(&r);
    /* nothing earlier was touched */
    size_t an = 0;
    snprintf(p, sizeof p, "%s/trainer_state.json", third);
    char *after = slurp(p, &an);
    TK_CHECK(before && after && sn == an && !memcmp(before, after, sn));
    TK_CHECK(tk_ckpt_verify(third, &e) == TK_OK);
    free(before);
    free(after);
    free(st);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    free(tb);
    free(store);
}

/* ---- a full disk ----------------------------------------------------------------- */

static int limit_at(void *ud, const tk_progress *p) {
    (void)ud;
    if (p->step == 3) {
        struct rlimit rl = { 4096, 4096 };
        setrlimit(RLIMIT_FSIZE, &rl);
    }
    return 0;
}

/* Child: a run that saves checkpoint-2, then meets a 4 KiB file-size limit.
 * Exit status 0: continue finished (stop=0) / stop ended with EFBIG's
 * message (stop=1); 1 otherwise. */
static int full_disk_child(const char *dir, int stop) {
    signal(SIGXFSZ, SIG_IGN);
    corpus s;
    corpus_make(&s, 22);
    int nb;
    int32_t *store;
    tk_batch *tb = batches(&s, 4, 1, 0, &nb, &store);
    tk_config c = cfg_of(&FP32, dir);
    c.epochs = 1;
    c.save_error_stop = stop;
    tk_dev *d = cpu();
    tk_model *m = model_of(d, &FP32);
    tk_train_result r;
    tk_train_callbacks cb = { .on_progress = limit_at, .on_note = on_note };
    tk_err e = { 0 };
    notes[0] = 0;
    tk_status rc = tk_train_run(&c, m, tb, nb, NULL, 0, &cb, &r, &e);
    int ok = stop ? rc == TK_EIO && strstr(e.msg, "File too large") && strstr(e.msg, "checkpoint-4 not saved")
                  : rc == TK_OK && r.steps == 6 && r.failed_saves >= 2 && r.saves == 1 &&
                        strstr(notes, "File too large") && strstr(notes, "training goes on");
    if (!ok)
        fprintf(stderr, "  full disk (stop=%d): rc %d, %s / notes: %s\n", stop, rc, e.msg, notes);
    tk_train_result_clear(&r);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    free(tb);
    free(store);
    return ok ? 0 : 1;
}

static void test_full_disk(void) {
    for (int stop = 0; stop < 2; stop++) {
        char dir[512], p[1200];
        snprintf(dir, sizeof dir, "%s/full-%d", root, stop);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0)
            _exit(full_disk_child(dir, stop));
        int ws = 0;
        waitpid(pid, &ws, 0);
        TK_CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "stop=%d: child status %d", stop, ws);
        int64_t *st = NULL;
        int n = tk_ckpt_list(dir, &st);
        TK_CHECK_EQ_INT(n, 1);
        if (n == 1) TK_CHECK_EQ_INT(st[0], 2);
        free(st);
        snprintf(p, sizeof p, "%s/checkpoint-2", dir);
        tk_err e = { 0 };
        TK_CHECK_MSG(tk_ckpt_verify(p, &e) == TK_OK, "%s", e.msg);
        DIR *dd = opendir(dir);
        int tmp = 0;
        for (struct dirent *de; dd && (de = readdir(dd));) tmp += strstr(de->d_name, ".tmp") != NULL;
        if (dd) closedir(dd);
        TK_CHECK_EQ_INT(tmp, 0);
    }
}

/* save_every: steps or a time; written back as it was meant */
static void test_save_every_key(void) {
    tk_config c;
    tk_config_defaults(&c);
    tk_err e = { 0 };
    TK_CHECK_EQ_INT(c.keep_checkpoints, 3);
    TK_CHECK_EQ_INT(tk_config_set(&c, "save_every", "10min", &e), TK_OK);
    TK_CHECK_EQ_INT(c.save_every_s, 600);
    TK_CHECK_EQ_INT(c.save_every, 0);
    char *y = tk_config_to_yaml(&c);
    TK_CHECK(y && strstr(y, "save_every: 600s"));
    free(y);
    TK_CHECK_EQ_INT(tk_config_set(&c, "save_steps", "500", &e), TK_OK);
    TK_CHECK_EQ_INT(c.save_every, 500);
    TK_CHECK_EQ_INT(c.save_every_s, 0);
    TK_CHECK_EQ_INT(tk_config_set(&c, "save_every", "3 days", &e), TK_EINVAL);
    TK_CHECK_MSG(strstr(e.msg, "save_every"), "%s", e.msg);
    TK_CHECK_EQ_INT(tk_config_set(&c, "save_error", "stop", &e), TK_OK);
    TK_CHECK_EQ_INT(c.save_error_stop, 1);
    TK_CHECK_EQ_INT(tk_config_set(&c, "save_total_limit", "5", &e), TK_OK);
    TK_CHECK_EQ_INT(c.keep_checkpoints, 5);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/tk_test_checkpoint_%d", (int)getpid());
    mkdir(root, 0755);
    TK_RUN(test_save_every_key);
    TK_RUN(test_resume_fp32_adamw);
    TK_RUN(test_resume_adamw8bit);
    TK_RUN(test_resume_fp16_loss_scaling);
    TK_RUN(test_resume_accumulation);
    TK_RUN(test_resume_dynamic_padding);
    TK_RUN(test_resume_buckets);
    TK_RUN(test_resume_span_head);
    TK_RUN(test_resume_flatten_dense_head);
    TK_RUN(test_state_round_trip);
    TK_RUN(test_save_by_the_clock);
    TK_RUN(test_refuses_another_config);
    TK_RUN(test_corrupted_and_truncated);
    TK_RUN(test_full_disk);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "  could not remove %s\n", root);
    return tk_test_done();
}
