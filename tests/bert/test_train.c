/* test_train.c — the training loop on a small BERT on the cpu device:
 * accumulation of k micro-batches equals the full batch (1e-5), an OOM at any
 * segment request releases everything the run took (chaos, as jansson's
 * test_chaos), cancel at a step boundary (flag and callback), checkpoint
 * write / resume roundtrip, an OOM mid-epoch leaves the last checkpoint
 * byte-identical, and history/progress are filled. */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tk_test.h"
#include "tk_train.h"

#define V 64
#define NL 3

static tk_model_opts small_opts(void) {
    tk_model_opts o;
    memset(&o, 0, sizeof o);
    o.dims = (tk_bert_dims){ .hidden = 32, .layers = 2, .heads = 2, .intermediate = 64,
                             .vocab_size = V, .max_position = 64, .type_vocab = 2,
                             .layer_norm_eps = 1e-12f };
    o.head = TK_HEAD_POOLED;
    o.num_labels = NL;
    o.towers = 1;
    o.max_len = 16;
    o.seed = 7;
    return o;
}

static tk_config small_cfg(void) {
    tk_config c;
    tk_config_defaults(&c);
    c.lr = 1e-3f;
    c.warmup_ratio = 0;
    c.epochs = 1;
    c.log_every = 1;
    c.accumulate = 1;
    c.output_dir[0] = c.resume_from[0] = '\0';
    return c;
}

/* Host data for n examples of length T: the label is the count of token 5
 * in the sequence, mod 3 — learnable, deterministic. */
typedef struct {
    int n, T;
    int32_t *ids, *types, *mask, *labels;
} host_set;

static void set_make(host_set *s, int n, int T, uint64_t seed) {
    s->n = n;
    s->T = T;
    s->ids = calloc((size_t)n * T, 4);
    s->types = calloc((size_t)n * T, 4);
    s->mask = calloc((size_t)n * T, 4);
    s->labels = calloc((size_t)n, 4);
    uint64_t x = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        int len = 6 + (int)(i % (T - 6)), fives = 0;
        for (int t = 0; t < T; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int id = t == 0 ? 2 : t == len - 1 ? 3 : 4 + (int)((x >> 33) % (V - 4));
            if (t >= len)
                id = 0;
            s->ids[(size_t)i * T + t] = id;
            s->mask[(size_t)i * T + t] = t < len;
            fives += id == 5;
        }
        s->labels[i] = fives % NL;
    }
}

static void set_free(host_set *s) {
    free(s->ids);
    free(s->types);
    free(s->mask);
    free(s->labels);
}

/* Batches of size B over the set (views into its arrays). */
static tk_batch *batches_of(const host_set *s, int B, int *nb) {
    *nb = (s->n + B - 1) / B;
    tk_batch *b = calloc((size_t)*nb, sizeof *b);
    for (int i = 0; i < *nb; i++) {
        int r0 = i * B, rows = s->n - r0 < B ? s->n - r0 : B;
        size_t off = (size_t)r0 * s->T;
        b[i] = (tk_batch){ .B = rows, .T = s->T, .input_ids = s->ids + off,
                           .token_type_ids = s->types + off, .attention_mask = s->mask + off,
                           .labels = s->labels + r0 };
    }
    return b;
}

static tk_dev *cpu(size_t cap) {
    tk_dev_opts o = { .kind = TK_DEV_CPU, .capacity = cap, .threads = 2 };
    tk_err e = { 0 };
    tk_dev *d = tk_dev_new(&o, &e);
    if (!d)
        fprintf(stderr, "  device: %s\n", e.msg);
    return d;
}

static tk_model *model(tk_dev *d, float dropout) {
    tk_model_opts o = small_opts();
    o.dims.hidden_dropout = o.dims.attn_dropout = dropout;
    tk_err e = { 0 };
    tk_model *m = tk_model_new(d, &o, &e);
    if (!m || tk_model_init_random(m, 11, &e) != TK_OK) {
        fprintf(stderr, "  model: %s\n", e.msg);
        tk_model_destroy(&m);
    }
    return m;
}

static float *weights(tk_model *m, int64_t *n) {
    *n = tk_model_n_weights(m);
    float *w = malloc((size_t)*n * sizeof *w);
    int64_t off = 0;
    tk_err e = { 0 };
    for (int i = 0; i < tk_model_n_params(m); i++) {
        const tk_param *p = tk_model_param(m, i);
        tk_tensor_read_f32(tk_model_dev(m), p->w, w + off, &e);
        off += tk_tensor_numel(p->w);
    }
    return w;
}

static float *grads(tk_model *m, int64_t *n) {
    *n = tk_model_n_weights(m);
    float *g = calloc((size_t)*n, sizeof *g);
    int64_t off = 0;
    tk_err e = { 0 };
    for (int i = 0; i < tk_model_n_params(m); i++) {
        const tk_param *p = tk_model_param(m, i);
        if (p->g && p->g->data)
            tk_tensor_read_f32(tk_model_dev(m), p->g, g + off, &e);
        off += tk_tensor_numel(p->w);
    }
    return g;
}

/* One optimizer step on 8 examples as one batch vs as 4 micro-batches of 2
 * (and 2 of 4) with accumulate = 4 (2): the accumulated gradient (left in
 * the model after the step) equals the full batch's within 1e-5 of its
 * largest element; the weights after the step agree within 1e-4 (Adam's
 * first step divides by |g|, which magnifies rounding where g is tiny). */
static void test_accumulation_equals_full_batch(void) {
    host_set s;
    set_make(&s, 8, 12, 1);
    float *ref = NULL, *gref = NULL;
    int64_t n = 0;
    int ks[3] = { 1, 4, 2 };
    for (int v = 0; v < 3; v++) {
        tk_dev *d = cpu(0);
        tk_model *m = model(d, 0.0f);
        if (!m) {
            TK_CHECK(0);
            tk_dev_destroy(&d);
            break;
        }
        int nb = 0;
        tk_batch *b = batches_of(&s, 8 / ks[v], &nb);
        tk_config c = small_cfg();
        c.accumulate = ks[v];
        c.max_steps = 1;
        tk_train_result r;
        tk_err e = { 0 };
        TK_CHECK_EQ_INT(tk_train_run(&c, m, b, nb, NULL, 0, NULL, &r, &e), TK_OK);
        TK_CHECK_EQ_INT(r.steps, 1);
        float *w = weights(m, &n), *g = grads(m, &n);
        if (!ref) {
            ref = w;
            gref = g;
        } else {
            double maxd = 0, maxg = 0, gmax = 0;
            for (int64_t i = 0; i < n; i++)
                gmax = fabs(gref[i]) > gmax ? fabs(gref[i]) : gmax;
            for (int64_t i = 0; i < n; i++) {
                double dd = fabs(w[i] - ref[i]) / (fabs(ref[i]) + 1e-2);
                double dg = fabs(g[i] - gref[i]) / gmax;
                maxd = dd > maxd ? dd : maxd;
                maxg = dg > maxg ? dg : maxg;
            }
            TK_CHECK(gmax > 0);
            TK_CHECK_MSG(maxg < 1e-5, "accumulate %d: gradient max relative difference %g", ks[v], maxg);
            TK_CHECK_MSG(maxd < 1e-4, "accumulate %d: weights max relative difference %g", ks[v], maxd);
            free(w);
            free(g);
        }
        tk_train_result_clear(&r);
        free(b);
        tk_model_destroy(&m);
        tk_dev_destroy(&d);
    }
    free(ref);
    free(gref);
    set_free(&s);
}

static int count_progress(void *ud, const tk_progress *p) {
    int *calls = ud;
    (*calls)++;
    return p->step >= 2; /* cancel after the second step */
}

static void test_cancel_at_step_boundary(void) {
    host_set s;
    set_make(&s, 32, 12, 2);
    int nb = 0;
    tk_batch *b = batches_of(&s, 4, &nb);
    tk_dev *d = cpu(0);
    tk_model *m = model(d, 0.1f);
    tk_err e = { 0 };
    TK_CHECK(m && tk_model_alloc_grads(m, &e) == TK_OK);
    tk_alloc_stats s0, s1;
    tk_alloc_stats_get(tk_dev_alloc(d), &s0);
    tk_config c = small_cfg();
    int calls = 0;
    tk_train_callbacks cb = { .on_progress = count_progress, .ud = &calls };
    tk_train_result r;
    TK_CHECK_EQ_INT(tk_train_run(&c, m, b, nb, b, 1, &cb, &r, &e), TK_ECANCEL);
    TK_CHECK_EQ_INT(r.steps, 2);
    TK_CHECK_EQ_INT(calls, 2);
    TK_CHECK_EQ_INT(r.epochs_done, 0);
    TK_CHECK(strstr(e.msg, "cancel") != NULL);
    tk_alloc_stats_get(tk_dev_alloc(d), &s1);
    TK_CHECK_EQ_INT(s1.allocated, s0.allocated);
    TK_CHECK_EQ_INT(r.allocated_after, r.allocated_before);
    tk_train_result_clear(&r);

    /* the flag, set before the run: no step at all */
    volatile int flag = 1;
    tk_train_callbacks cb2 = { .cancel = &flag };
    TK_CHECK_EQ_INT(tk_train_run(&c, m, b, nb, NULL, 0, &cb2, &r, &e), TK_ECANCEL);
    TK_CHECK_EQ_INT(r.steps, 0);
    tk_train_result_clear(&r);
    free(b);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    set_free(&s);
}

/* Fail the Nth segment request for N = 1.. until a run survives: every run
 * either succeeds or returns TK_EOOM with the record, and allocated comes
 * back to the baseline each time (ASan checks the host side). */
static void test_oom_chaos_releases_everything(void) {
    host_set s;
    set_make(&s, 128, 32, 3); /* activations past one 2 MiB segment */
    int nb = 0;
    tk_batch *b = batches_of(&s, 64, &nb);
    tk_dev *d = cpu(0);
    tk_model *m = model(d, 0.1f);
    tk_err e = { 0 };
    TK_CHECK(m && tk_model_alloc_grads(m, &e) == TK_OK);
    tk_alloc *a = tk_dev_alloc(d);
    tk_alloc_stats s0, s1;
    tk_alloc_stats_get(a, &s0);
    tk_config c = small_cfg();
    c.epochs = 1;
    int ooms = 0, ok = 0;
    for (uint64_t k = 1; k <= 40 && !ok; k++) {
        tk_alloc_empty_cache(a); /* so the run must ask for segments again */
        tk_alloc_fail_segment_after(a, k);
        tk_train_result r;
        memset(&e, 0, sizeof e);
        tk_status st = tk_train_run(&c, m, b, nb, b, 1, NULL, &r, &e);
        tk_alloc_fail_segment_after(a, 0);
        TK_CHECK_MSG(st == TK_OK || st == TK_EOOM, "k=%d: %s: %s", (int)k, tk_status_name(st), e.msg);
        if (st == TK_EOOM) {
            ooms++;
            TK_CHECK(r.have_oom);
            TK_CHECK(r.oom.requested > 0);
        } else {
            ok = 1;
        }
        tk_alloc_stats_get(a, &s1);
        TK_CHECK_MSG(s1.allocated == s0.allocated, "k=%d: allocated %zu, baseline %zu", (int)k,
                     s1.allocated, s0.allocated);
        TK_CHECK_EQ_INT(r.allocated_after, s0.allocated);
        tk_train_result_clear(&r);
    }
    TK_CHECK(ooms >= 1);
    TK_CHECK(ok);
    free(b);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    set_free(&s);
}

/* A capacity too small for the activations: the step fails, the record says
 * what was asked, all the run took is released, and the model still trains
 * on a device with room afterwards (same model object). */
static void test_oom_small_capacity(void) {
    host_set s;
    set_make(&s, 256, 32, 4);
    int nb = 0;
    tk_batch *b = batches_of(&s, 256, &nb);
    tk_dev *d = cpu(4u << 20);
    tk_model *m = model(d, 0.0f);
    tk_err e = { 0 };
    TK_CHECK(m && tk_model_alloc_grads(m, &e) == TK_OK);
    tk_alloc_stats s0, s1;
    tk_alloc_stats_get(tk_dev_alloc(d), &s0);
    tk_config c = small_cfg();
    tk_train_result r;
    TK_CHECK_EQ_INT(tk_train_run(&c, m, b, nb, NULL, 0, NULL, &r, &e), TK_EOOM);
    TK_CHECK(r.have_oom);
    TK_CHECK_EQ_INT(r.oom.capacity, 4u << 20);
    TK_CHECK(r.oom.requested > 0);
    tk_alloc_stats_get(tk_dev_alloc(d), &s1);
    TK_CHECK_EQ_INT(s1.allocated, s0.allocated);
    tk_train_result_clear(&r);
    /* smaller batches fit: the same model object trains on */
    free(b);
    b = batches_of(&s, 4, &nb);
    TK_CHECK_EQ_INT(tk_train_run(&c, m, b, 2, NULL, 0, NULL, &r, &e), TK_OK);
    TK_CHECK_EQ_INT(r.steps, 2);
    tk_train_result_clear(&r);
    free(b);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    set_free(&s);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    *n = fread(buf, 1, (size_t)sz, f);
    fclose(f);
    return buf;
}

static int epochs_seen;
static void on_epoch(void *ud, const tk_epoch_stats *es) {
    (void)ud;
    epochs_seen++;
    TK_CHECK_EQ_INT(es->epoch, epochs_seen);
}

static void test_checkpoint_roundtrip_and_oom_safety(void) {
    char dir[] = "/tmp/tk_train_ckpt_XXXXXX";
    TK_CHECK(mkdtemp(dir) != NULL);
    host_set s;
    set_make(&s, 192, 32, 5);
    int nb = 0;
    tk_batch *b = batches_of(&s, 64, &nb);
    tk_dev *d = cpu(0);
    tk_model *m = model(d, 0.1f);
    tk_config c = small_cfg();
    c.epochs = 2;
    snprintf(c.output_dir, sizeof c.output_dir, "%s", dir);
    tk_train_result r;
    tk_err e = { 0 };
    epochs_seen = 0;
    tk_train_callbacks cb = { .on_epoch = on_epoch };
    TK_CHECK_EQ_INT(tk_train_run(&c, m, b, nb, b, 2, &cb, &r, &e), TK_OK);
    TK_CHECK_EQ_INT(epochs_seen, 2);
    TK_CHECK_EQ_INT(r.n_history, 2);
    TK_CHECK_EQ_INT(r.steps, 2 * nb);
    /* the HF folder in output_dir, and a checkpoint-STEP after each epoch */
    char last[600];
    snprintf(last, sizeof last, "%s/checkpoint-%d", dir, 2 * nb);
    TK_CHECK_STR(r.checkpoint, last);
    TK_CHECK_EQ_INT(r.saves, 2);
    for (int i = 0; i < r.n_history; i++) {
        TK_CHECK(isfinite(r.history[i].train_loss));
        TK_CHECK(isfinite(r.history[i].dev_loss));
        TK_CHECK(r.history[i].dev_acc >= 0 && r.history[i].dev_acc <= 1);
        TK_CHECK(r.history[i].dev_f1 >= 0 && r.history[i].dev_f1 <= 1);
        TK_CHECK(r.history[i].samples_per_s > 0);
        TK_CHECK(r.history[i].peak_allocated > 0);
    }
    tk_train_result_clear(&r);
    int64_t n = 0;
    float *w1 = weights(m, &n);

    /* resume into a differently initialised model: lr 0 keeps what was loaded */
    char st_path[600];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    size_t n_before = 0, n_after = 0;
    char *before = slurp(st_path, &n_before);
    TK_CHECK(before != NULL);
    tk_model *m2 = model(d, 0.1f);
    TK_CHECK(m2 && tk_model_init_random(m2, 99, &e) == TK_OK);
    tk_config c2 = small_cfg();
    c2.lr = 0;
    c2.max_steps = 1;
    snprintf(c2.resume_from, sizeof c2.resume_from, "%s", dir);
    TK_CHECK_EQ_INT(tk_train_run(&c2, m2, b, nb, NULL, 0, NULL, &r, &e), TK_OK);
    tk_train_result_clear(&r);
    int64_t n2 = 0;
    float *w2 = weights(m2, &n2);
    TK_CHECK_EQ_INT(n2, n);
    TK_CHECK(n2 == n && memcmp(w1, w2, (size_t)n * sizeof(float)) == 0);

    /* an OOM in the middle of the next epoch: the checkpoint stays as it was */
    tk_config c3 = small_cfg();
    snprintf(c3.output_dir, sizeof c3.output_dir, "%s", dir);
    tk_alloc_empty_cache(tk_dev_alloc(d));
    tk_alloc_fail_segment_after(tk_dev_alloc(d), 2);
    tk_status st = tk_train_run(&c3, m2, b, nb, b, 1, NULL, &r, &e);
    tk_alloc_fail_segment_after(tk_dev_alloc(d), 0);
    TK_CHECK_EQ_INT(st, TK_EOOM);
    TK_CHECK_EQ_INT(r.epochs_done, 0);
    tk_train_result_clear(&r);
    char *after = slurp(st_path, &n_after);
    TK_CHECK(after && n_after == n_before && memcmp(before, after, n_before) == 0);
    /* no temp files left behind: the HF folder's two files, the two
     * epochs' checkpoint folders and the mark that the folder is ours */
    DIR *dd = opendir(dir);
    int files = 0;
    struct dirent *de;
    while (dd && (de = readdir(dd))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        files++;
        TK_CHECK_MSG(strcmp(de->d_name, "model.safetensors") == 0 || strcmp(de->d_name, "config.json") == 0 ||
                     strcmp(de->d_name, "txkernel_output.json") == 0 || strncmp(de->d_name, "checkpoint-", 11) == 0,
                     "unexpected file %s", de->d_name);
    }
    if (dd)
        closedir(dd);
    TK_CHECK_EQ_INT(files, 5);
    char rm[700];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    TK_CHECK(system(rm) == 0);
    free(before);
    free(after);
    free(w1);
    free(w2);
    free(b);
    tk_model_destroy(&m2);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    set_free(&s);
}

/* Training lowers the loss on the learnable toy task. */
static void test_loss_goes_down(void) {
    host_set s;
    set_make(&s, 96, 12, 6);
    int nb = 0;
    tk_batch *b = batches_of(&s, 8, &nb);
    tk_dev *d = cpu(0);
    tk_model *m = model(d, 0.0f);
    tk_config c = small_cfg();
    c.lr = 3e-3f;
    c.epochs = 4;
    c.warmup_ratio = 0.1f;
    tk_train_result r;
    tk_err e = { 0 };
    TK_CHECK_EQ_INT(tk_train_run(&c, m, b, nb, b, nb, NULL, &r, &e), TK_OK);
    TK_CHECK_EQ_INT(r.n_history, 4);
    if (r.n_history == 4)
        TK_CHECK_MSG(r.history[3].train_loss < r.history[0].train_loss - 0.05f, "loss %g -> %g",
                     r.history[0].train_loss, r.history[3].train_loss);
    tk_train_result_clear(&r);
    free(b);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    set_free(&s);
}

/* The dev loss is the mean over examples (HF Trainer's eval_loss), not the
 * mean of batch means: 10 dev examples in eval batches of 4, 4 and 2. With
 * lr 0 the weights after the one training step are the initial ones, so
 * each example's own loss (a batch of one) can be summed here. */
static void test_dev_loss_is_per_example_mean(void) {
    host_set s;
    set_make(&s, 10, 12, 9);
    int nb = 0, nt = 0;
    tk_batch *dev = batches_of(&s, 4, &nb), *one = batches_of(&s, 1, &nt);
    TK_CHECK_EQ_INT(nb, 3);
    tk_dev *d = cpu(0);
    tk_model *m = model(d, 0.0f);
    tk_config c = small_cfg();
    c.lr = 0.0f;
    c.weight_decay = 0.0f;
    tk_train_result r;
    tk_err e = { 0 };
    TK_CHECK_EQ_INT(tk_train_run(&c, m, dev, 1, dev, nb, NULL, &r, &e), TK_OK);
    double sum = 0, batch_means = 0;
    for (int i = 0; i < nt; i++) {
        float l = 0;
        TK_CHECK_EQ_INT(tk_model_forward_eval(m, &one[i], &l, NULL, &e), TK_OK);
        sum += l;
    }
    for (int i = 0; i < nb; i++) {
        float l = 0;
        TK_CHECK_EQ_INT(tk_model_forward_eval(m, &dev[i], &l, NULL, &e), TK_OK);
        batch_means += l / nb;
    }
    double per_example = sum / nt;
    /* the data makes the two means differ, so the check below can fail */
    TK_CHECK_MSG(fabs(batch_means - per_example) > 1e-4, "%g vs %g", batch_means, per_example);
    TK_CHECK_EQ_INT(r.n_history, 1);
    if (r.n_history == 1)
        TK_CHECK_NEAR(r.history[0].dev_loss, per_example, 1e-5);
    tk_train_result_clear(&r);
    free(dev);
    free(one);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    set_free(&s);
}

int main(void) {
    TK_RUN(test_dev_loss_is_per_example_mean);
    TK_RUN(test_accumulation_equals_full_batch);
    TK_RUN(test_cancel_at_step_boundary);
    TK_RUN(test_oom_chaos_releases_everything);
    TK_RUN(test_oom_small_capacity);
    TK_RUN(test_checkpoint_roundtrip_and_oom_safety);
    TK_RUN(test_loss_goes_down);
    return tk_test_done();
}
