/* test_train_finetune.c — the whole `txk train` path below the session (the
 * pipeline tk_run_data_load, tk_model_from_config, tk_train_run) on the
 * project's generated reviews data (tests/data/gen_data.py: pos / neg /
 * mixed, decided by sentiment words) with its generated vocabulary: a
 * randomly initialised bert-tiny must reach clearly-above-chance dev
 * accuracy (chance is the largest class share, about 1/3) within the time
 * limit, with history, progress and memory figures filled. */
#include <math.h>
#include <string.h>
#include <time.h>

#include "tk_test.h"
#include "tk_pipeline.h"
#include "tk_train.h"

static int progress_calls;
static size_t progress_peak;
static int on_progress(void *ud, const tk_progress *p) {
    (void)ud;
    progress_calls++;
    progress_peak = p->peak;
    TK_CHECK(p->step <= p->total_steps);
    TK_CHECK(isfinite(p->loss));
    return 0;
}

/* Data, model, loop: what `txk train` does below the session. */
static tk_status train_config(const tk_config *c0, tk_dev *d, const tk_train_callbacks *cb, tk_model **mo,
                              tk_train_result *r, tk_err *e) {
    memset(r, 0, sizeof *r);
    *mo = NULL;
    tk_config c = *c0;
    tk_run_data data;
    tk_status st = tk_run_data_load(&c, &data, e);
    if (st != TK_OK) return st;
    tk_run_config(&data, &c);
    TK_CHECK_EQ_INT(c.num_labels, 3); /* pos / neg / mixed, from the data */
    *mo = tk_model_from_config(d, &c, NULL, NULL, e);
    st = *mo ? tk_train_run(&c, *mo, data.train, data.n_train, data.dev, data.n_dev, cb, r, e) : e->status;
    tk_run_data_clear(&data);
    return st;
}

static void test_reviews_bert_tiny(void) {
    tk_config c;
    tk_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "bert-tiny");
    c.init = TK_INIT_RANDOM; /* the shape, random weights: no download */
    snprintf(c.vocab, sizeof c.vocab, "tests/data/vocab_uncased.txt");
    snprintf(c.train_file, sizeof c.train_file, "tests/data/reviews_train.csv");
    snprintf(c.dev_file, sizeof c.dev_file, "tests/data/reviews_dev.csv");
    snprintf(c.text_col, sizeof c.text_col, "text");
    snprintf(c.label_col, sizeof c.label_col, "label");
    c.max_len = 64;
    c.max_examples = 640; /* keeps the ASan suite lean */
    c.batch_size = 32;
    c.eval_batch_size = 64;
    c.batching = TK_BATCH_DYNAMIC;
    c.epochs = 2;
    c.lr = 2e-3f;
    c.warmup_ratio = 0.1f;
    c.dropout = 0.0f;
    c.log_every = 20;
    c.seed = 42;
    c.output_dir[0] = '\0';
    tk_dev_opts o = { .kind = TK_DEV_CPU, .threads = 0 };
    tk_err e = { 0 };
    tk_dev *d = tk_dev_new(&o, &e);
    tk_train_callbacks cb = { .on_progress = on_progress };
    tk_train_result r;
    tk_model *m = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tk_status st = train_config(&c, d, &cb, &m, &r, &e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    TK_CHECK_MSG(st == TK_OK, "%s", e.msg);
    TK_CHECK(m != NULL);
    TK_CHECK_EQ_INT(r.n_history, 2);
    for (int i = 0; i < r.n_history; i++)
        fprintf(stderr, "  epoch %d: train loss %.4f dev loss %.4f acc %.3f macro-F1 %.3f, %.0f samples/s, peak %zu\n",
                r.history[i].epoch, r.history[i].train_loss, r.history[i].dev_loss, r.history[i].dev_acc,
                r.history[i].dev_f1, r.history[i].samples_per_s, r.history[i].peak_allocated);
    fprintf(stderr, "  %.1f s in all\n", secs);
    if (r.n_history == 2) {
        TK_CHECK_MSG(r.history[1].dev_acc >= 0.55f, "dev accuracy %.3f", r.history[1].dev_acc);
        TK_CHECK(r.history[1].dev_f1 > 0.45f);
        TK_CHECK(r.history[1].train_loss < r.history[0].train_loss);
    }
    TK_CHECK(progress_calls > 0);
    TK_CHECK(progress_peak > 0);
    TK_CHECK(secs < 120);
    tk_train_result_clear(&r);
    tk_model_destroy(&m);
    tk_alloc_stats s;
    tk_alloc_stats_get(tk_dev_alloc(d), &s);
    TK_CHECK_EQ_INT(s.allocated, 0); /* model gone: nothing left */
    tk_dev_destroy(&d);
}

/* Bad data is an error naming the file, not a crash. */
static void test_missing_file(void) {
    tk_config c;
    tk_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "bert-tiny");
    c.init = TK_INIT_RANDOM; /* the shape, random weights: no download */
    snprintf(c.vocab, sizeof c.vocab, "tests/data/vocab_uncased.txt");
    snprintf(c.train_file, sizeof c.train_file, "tests/data/no_such_file.csv");
    tk_dev_opts o = { .kind = TK_DEV_CPU };
    tk_err e = { 0 };
    tk_dev *d = tk_dev_new(&o, &e);
    tk_train_result r;
    tk_model *m = NULL;
    TK_CHECK(train_config(&c, d, NULL, &m, &r, &e) != TK_OK);
    TK_CHECK(m == NULL);
    TK_CHECK_MSG(strstr(e.msg, "no_such_file.csv") != NULL, "%s", e.msg);
    snprintf(c.train_file, sizeof c.train_file, "tests/data/reviews_train.csv");
    snprintf(c.text_col, sizeof c.text_col, "txt");
    TK_CHECK(train_config(&c, d, NULL, &m, &r, &e) != TK_OK);
    TK_CHECK_MSG(strstr(e.msg, "reviews_train.csv") && strstr(e.msg, "txt"), "%s", e.msg);
    tk_dev_destroy(&d);
}

int main(void) {
    TK_RUN(test_missing_file);
    TK_RUN(test_reviews_bert_tiny);
    return tk_test_done();
}
