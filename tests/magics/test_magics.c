/* test_magics.c — the txkernel magics driven through the interpreter
 * interface (tk_magics_interp), with an output sink that records every
 * message: config errors name line and key, a plan that does not fit stops
 * before the first device allocation, a run-time OOM releases everything,
 * a small run trains, and %txmem / %txdata / %txdevice / %txreset answer. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tk_magics.h"
#include "tk_session.h"
#include "tk_test.h"

#include "magics_rec.h"

static json_int_t mem_field(const char *field) {
    int rc;
    json_t *msgs = run("%txmem --json", &rc);
    json_t *j = last_json(msgs);
    json_int_t v = j ? json_integer_value(json_object_get(j, field)) : -1;
    json_decref(msgs);
    return v;
}

#define TINY                                                                                   \
    "model: bert-tiny\ninit: random\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"      \
    "vocab: tests/data/vocab_cased.txt\ntrain_file: tests/data/reviews_train.csv\n"            \
    "dev_split: 0\nmax_examples: 16\nmax_len: 32\nbatch_size: 8\nmax_steps: 2\ndevice: cpu\n"

static void test_config_errors(void) {
    int rc;
    json_t *m = run("%%txtrain\nmodel: bert-tiny\nbatchsize: 8\n", &rc);
    TK_CHECK_EQ_INT(rc, -1);
    /* lines as the editor numbers them: the %%txtrain line is line 1 */
    TK_CHECK_STR(evalue(m), "cell:3: unknown key 'batchsize' (did you mean 'batch_size'?)");
    json_decref(m);
    m = run("%%txtrain\nmodel: bert-tiny\nprecision: fp8\n", &rc);
    TK_CHECK_STR(evalue(m), "cell:3: precision: 'fp8' is not one of fp32, fp16, bf16");
    json_decref(m);
    /* comment lines above the magic count too */
    m = run("# a note\n\n%%txplan\nmodel: bert-tiny\nbatch_size: [8\n", &rc);
    TK_CHECK_MSG(strncmp(evalue(m), "cell:", 5) == 0 && atoi(evalue(m) + 5) >= 5 && atoi(evalue(m) + 5) <= 6,
                 "%s", evalue(m));
    json_decref(m);
    m = run("# a note\n%%txadvise\nmodel: bert-tiny\n\nbatchsize: 8\n", &rc);
    TK_CHECK_STR(evalue(m), "cell:5: unknown key 'batchsize' (did you mean 'batch_size'?)");
    json_decref(m);
    m = run("%%txtrain batch_size=0\nmodel: bert-tiny\n", &rc);
    TK_CHECK_STR(evalue(m), "batch_size: 0 is out of range (must be 1..1048576)");
    json_decref(m);
    m = run("%%txtrain --fast\nmodel: bert-tiny\n", &rc);
    TK_CHECK_EQ_INT(rc, -1);
    TK_CHECK(strstr(evalue(m), "unknown option --fast") != NULL);
    json_decref(m);
    m = run("%%txtrain\n" TINY "train_file: nope.csv\n", &rc);
    TK_CHECK(strstr(evalue(m), "train_file: set twice") != NULL);
    json_decref(m);
}

static void test_plan_line_magic(void) {
    int rc;
    json_t *m = run("%txplan model=bert-base-cased max_len=512 batch_size=32 capacity=7.43GiB gpu=t4 num_labels=2 --json",
                    &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_t *j = last_json(m);
    TK_CHECK(j != NULL);
    TK_CHECK(json_is_false(json_object_get(j, "fits")));
    TK_CHECK(json_integer_value(json_object_get(j, "peak_reserved")) > (json_int_t)(7.43 * (1 << 30)));
    TK_CHECK_EQ_INT(json_integer_value(json_object_get(j, "n_params")), 108311810);
    json_t *d = first(m, "display");
    TK_CHECK(d && json_object_get(json_object_get(d, "data"), "application/json"));
    json_decref(m);
    /* the line form starts from the last config: only batch_size changes */
    m = run("%txplan batch_size=1", &rc);
    d = first(m, "display");
    /* without --json the data travels under the vendor type, so notebooks
     * render the HTML rather than a JSON tree */
    TK_CHECK(d && !json_object_get(json_object_get(d, "data"), "application/json"));
    TK_CHECK(d && json_object_get(json_object_get(d, "data"), "application/vnd.txkernel.plan+json"));
    TK_CHECK(d && strstr(json_string_value(json_object_get(json_object_get(d, "data"), "text/html")), "<svg"));
    TK_CHECK(d && json_object_get(json_object_get(d, "data"), "application/vnd.vegalite.v5+json") &&
             json_object_get(json_object_get(d, "data"), "image/svg+xml") &&
             json_object_get(json_object_get(d, "data"), "text/html"));
    json_decref(m);
    m = run("%txplan batch_size=1 --json", &rc);
    j = last_json(m);
    TK_CHECK(j && json_integer_value(json_object_get(j, "batch")) == 1 && json_integer_value(json_object_get(j, "seq")) == 512);
    json_decref(m);
    m = run("%txplan --max-batch model=bert-tiny --json", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    j = last_json(m);
    TK_CHECK(json_is_array(j) && json_array_size(j) == 5);
    TK_CHECK(j && json_integer_value(json_object_get(json_array_get(j, 0), "largest batch")) >=
                      json_integer_value(json_object_get(json_array_get(j, 4), "largest batch")));
    json_decref(m);
}

/* %%txplan --epoch plans the run's first epoch: issue 29's bert-tiny figures
 * (test_plan_epoch.c trains the same config and gets them) */
static void test_plan_epoch_cell(void) {
    int rc;
    json_t *m = run("%%txplan max_steps=12 capacity=2GiB --epoch --json\n"
                    "model: bert-tiny\ninit: random\nvocab: tests/data/vocab_uncased.txt\n"
                    "train_file: tests/data/reviews_train.csv\ndev_file: tests/data/reviews_dev.csv\n"
                    "text_col: text\nlabel_col: label\nmax_len: 128\nbatching: dynamic\nbatch_size: 32\n"
                    "eval_batch_size: 64\nepochs: 3\nlr: 2e-3\nwarmup_ratio: 0.1\ndropout: 0.0\nseed: 42\n",
                    &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_t *j = last_json(m);
    TK_CHECK(j != NULL);
    TK_CHECK_EQ_INT(json_integer_value(json_object_get(j, "epoch_steps")), 12);
    TK_CHECK_EQ_INT(json_integer_value(json_object_get(j, "peak_reserved")), 190840832);
    TK_CHECK_EQ_INT(json_integer_value(json_object_get(j, "peak_allocated")), 147975680);
    json_decref(m);
    m = run("%txplan --epoch", &rc); /* the line form: the session's config, same plan */
    TK_CHECK_EQ_INT(rc, 0);
    json_t *d = first(m, "display");
    const char *text = d ? json_string_value(json_object_get(json_object_get(d, "data"), "text/plain")) : NULL;
    TK_CHECK(text && strstr(text, "Plan of the first epoch as the run makes it: 12 steps"));
    json_decref(m);
}

/* A plan that does not fit never reaches the device allocator. */
static void test_plan_gate_allocates_nothing(void) {
    int rc;
    json_t *m = run("%txreset", &rc);
    json_decref(m);
    m = run("%%txtrain capacity=5MiB\n" TINY, &rc);
    TK_CHECK_EQ_INT(rc, -1);
    json_t *e = first(m, "error");
    TK_CHECK(e && !strcmp(json_string_value(json_object_get(e, "ename")), "OutOfMemoryPlanned"));
    TK_CHECK(last_json(m) && json_is_false(json_object_get(last_json(m), "fits")));
    json_decref(m);
    TK_CHECK_EQ_INT(mem_field("n_alloc"), 0);
    TK_CHECK_EQ_INT(mem_field("allocated"), 0);
    TK_CHECK_EQ_INT(mem_field("reserved"), 0);
}

/* --no-plan goes ahead and meets the OOM at run time: an autopsy, memory back
 * to the baseline, and the next run in the same session works. */
static void test_runtime_oom_then_fit(void) {
    int rc;
    for (int cycle = 0; cycle < 3; cycle++) {
        json_t *m = run("%%txtrain capacity=21MiB --no-plan\n" TINY, &rc);
        TK_CHECK_EQ_INT(rc, -1);
        json_t *e = first(m, "error");
        TK_CHECK(e && !strcmp(json_string_value(json_object_get(e, "ename")), "OutOfMemoryError"));
        const char *v = evalue(m);
        TK_CHECK_MSG(strstr(v, "tried to allocate") && strstr(v, "Capacity 21.00 MiB") && strstr(v, "Top owners:") &&
                         strstr(v, "allocated is back to 0 bytes"),
                     "%s", v);
        /* the first line names the tensor: "... for <owner> (<cat>, f32 [8, 32, 64])." */
        const char *nl = strchr(v, '\n'), *lb = strstr(v, " [");
        TK_CHECK_MSG(lb && nl && lb < nl && strstr(v, "]).") && strstr(v, "]).") < nl, "%s", v);
        json_decref(m);
        TK_CHECK_EQ_INT(mem_field("allocated"), 0);
    }
    TK_CHECK(mem_field("n_ooms") >= 3);
    json_t *m = run("%%txtrain\n" TINY, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_t *res = first(m, "result");
    json_t *j = res ? json_object_get(json_object_get(res, "data"), "application/vnd.txkernel.result+json") : NULL;
    TK_CHECK(j && json_integer_value(json_object_get(j, "steps")) == 2);
    /* on cpu the planned peak is the measured one, byte for byte */
    TK_CHECK(j && json_integer_value(json_object_get(j, "peak_allocated")) ==
                      json_integer_value(json_object_get(j, "planned_peak_allocated")));
    TK_CHECK(first(m, "display") != NULL && first(m, "update") != NULL);
    json_decref(m);
    /* what the advisor reads from the session */
    const tk_run_report *last = tk_session_last_run(tk_magics_session(M));
    TK_CHECK(last && last->end == TK_RUN_DONE && last->history == NULL);
    TK_CHECK(last && last->peak_allocated == last->plan.peak_allocated);
    TK_CHECK(tk_session_config(tk_magics_session(M)) && tk_session_plan(tk_magics_session(M)));
    TK_CHECK(tk_session_oom(tk_magics_session(M)) && tk_session_oom(tk_magics_session(M))->capacity == 21u << 20);
    TK_CHECK_EQ_INT(mem_field("allocated"), 0);
}

static void test_mem_data_device_reset(void) {
    char text[8192];
    int rc;
    json_t *m = run("%txmem --by layer --top 3", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_t *d = first(m, "display");
    TK_CHECK(d && json_object_get(json_object_get(d, "data"), "image/svg+xml"));
    json_decref(m);
    m = run("%txmem --timeline --json", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_t *tl = json_object_get(last_json(m), "timeline");
    TK_CHECK_EQ_INT(json_array_size(tl), 2);
    json_decref(m);
    m = run("%txmem --by shoe", &rc);
    TK_CHECK_EQ_INT(rc, -1);
    json_decref(m);
    m = run("%txdata tests/data/reviews_train.csv --vocab tests/data/vocab_cased.txt --max-len 128 --json", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_t *j = last_json(m);
    TK_CHECK(j && json_integer_value(json_object_get(j, "examples")) > 100);
    TK_CHECK(j && json_integer_value(json_object_get(j, "p50")) <= json_integer_value(json_object_get(j, "p99")));
    TK_CHECK(j && json_array_size(json_object_get(j, "padding")) == 3);
    json_decref(m);
    m = run("%txdata tests/data/reviews_train.csv --text body", &rc);
    TK_CHECK(strstr(evalue(m), "no column 'body'") != NULL);
    json_decref(m);
    /* %txhelp lists a verb's flags from the option table (the cell-only ones too) */
    m = run("%txhelp txdata", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    stdout_of(m, text, sizeof text);
    TK_CHECK_MSG(strstr(text, "Flags (from the option table") && strstr(text, "--max-len N") &&
                 strstr(text, "--json  print"), "%s", text);
    json_decref(m);
    /* %txdevice's words are the option table's: one it does not take is named */
    m = run("%txdevice --jsn", &rc);
    TK_CHECK_EQ_INT(rc, -1);
    TK_CHECK_MSG(strstr(evalue(m), "--jsn") != NULL, "%s", evalue(m));
    json_decref(m);
    m = run("%txdevice --json", &rc);
    j = last_json(m);
    TK_CHECK(j && !strcmp(json_string_value(json_object_get(j, "kind")), "cpu"));
    TK_CHECK(j && json_is_true(json_object_get(j, "simulated")));
    /* the process's RSS beside the device figures */
    TK_CHECK(j && json_integer_value(json_object_get(j, "host_rss")) > (1 << 20));
    json_decref(m);
    TK_CHECK(mem_field("host_rss") > (1 << 20));
    m = run("%txreset", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_decref(m);
    m = run("%txmem --json", &rc);
    TK_CHECK(last_json(m) && !strcmp(json_string_value(json_object_get(last_json(m), "device")), "none"));
    json_decref(m);
}

/* The allocator's event ring is off unless asked (tk_gpu.h): a run without
 * %txmem --record keeps no events; with it, the run's are kept, and a reset
 * keeps the request; --record off drops them; --record N keeps N, and a
 * flag after --record is not its value. */
static void test_event_ring_only_when_asked(void) {
    int rc;
    tk_session *s = tk_magics_session(M);
    json_t *m = run("%%txtrain\n" TINY, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_decref(m);
    tk_dev *d = tk_session_current_device(s);
    TK_CHECK(d && tk_alloc_history_len(tk_dev_alloc(d)) == 0);
    m = run("%txmem --record", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_decref(m);
    TK_CHECK_EQ_INT(tk_session_recording(s), 1 << 18);
    m = run("%txreset", &rc);
    json_decref(m);
    m = run("%%txtrain\n" TINY, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_decref(m);
    d = tk_session_current_device(s);
    TK_CHECK(d && tk_alloc_history_len(tk_dev_alloc(d)) > 100);
    m = run("%txmem --record off", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_decref(m);
    TK_CHECK(d && tk_alloc_history_len(tk_dev_alloc(d)) == 0 && tk_session_recording(s) == 0);
    m = run("%txmem --record 12x", &rc);
    TK_CHECK_EQ_INT(rc, -1);
    json_decref(m);
    /* --record's value is optional in the option table: a number is its
     * value, a flag after it is not (the default count) */
    m = run("%txmem --record 5000", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_decref(m);
    TK_CHECK_EQ_INT(tk_session_recording(s), 5000);
    m = run("%txmem --record --json", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_decref(m);
    TK_CHECK_EQ_INT(tk_session_recording(s), 1 << 18);
    m = run("%txmem --record off", &rc);
    json_decref(m);
    TK_CHECK_EQ_INT(tk_session_recording(s), 0);
}

static void test_keys_magic(void) {
    int rc;
    json_t *m = run("%txkeys", &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_t *j = last_json(m);
    TK_CHECK(json_array_size(j) > 50);
    TK_CHECK_STR(json_string_value(json_object_get(json_array_get(j, 0), "key")), "model");
    json_decref(m);
}

static void test_completion(void) {
    json_t *matches = json_array();
    size_t start = 0, end = 0;
    const char *code = "%%txtrain\nmodel: bert-tiny\nbatch_s";
    I.complete(I.self, code, strlen(code), matches, &start, &end);
    int found = 0;
    size_t i;
    json_t *v;
    json_array_foreach(matches, i, v) found |= !strcmp(json_string_value(v), "batch_size");
    TK_CHECK(found);
    TK_CHECK_EQ_INT(end - start, 7);
    json_decref(matches);
}

/* Issue 28's smaller errors, each naming what to fix: a missing train_file
 * names the key; a CSV without the label column is a DataError (as a bad
 * row is) that suggests label_col:; after a failed cell, a bad --gpus is
 * named rather than the earlier cell's error; a mistyped model folder is
 * "no such folder". */
static void test_errors_name_what_to_fix(void) {
    int rc;
    const char *tiny = "model: bert-tiny\ninit: random\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"
                       "vocab: tests/data/vocab_cased.txt\nmax_len: 32\nbatch_size: 8\nmax_steps: 1\n"
                       "device: cpu\n";
    char cell[1024];
    snprintf(cell, sizeof cell, "%%%%txtrain\n%strain_file: tests/data/no_such.csv\n", tiny);
    json_t *m = run(cell, &rc);
    json_t *e = first(m, "error");
    TK_CHECK(e && !strcmp(json_string_value(json_object_get(e, "ename")), "DataError"));
    TK_CHECK_MSG(strstr(evalue(m), "train_file: tests/data/no_such.csv: cannot open"), "%s", evalue(m));
    json_decref(m);
    m = run("%txplan --gpus colba", &rc);
    e = first(m, "error");
    TK_CHECK(e && !strcmp(json_string_value(json_object_get(e, "ename")), "UsageError"));
    TK_CHECK_STR(evalue(m), "--gpus colba: expected colab, kaggle, colab-2020 or all");
    json_decref(m);

    const char *csv = "/tmp/tk_test_magics_nolabel.csv";
    FILE *f = fopen(csv, "w");
    TK_CHECK(f != NULL);
    if (f) {
        fputs("text,sentiment\ngood,pos\nbad,neg\n", f);
        fclose(f);
    }
    snprintf(cell, sizeof cell, "%%%%txtrain\n%strain_file: %s\ndev_split: 0\n", tiny, csv);
    m = run(cell, &rc);
    e = first(m, "error");
    TK_CHECK(e && !strcmp(json_string_value(json_object_get(e, "ename")), "DataError"));
    TK_CHECK_MSG(strstr(evalue(m), "tk_test_magics_nolabel.csv: no column 'label' for the label (columns: text, "
                                   "sentiment; set label_col: to one of them)"), "%s", evalue(m));
    json_decref(m);
    unlink(csv);

    /* an output_dir that cannot be made: a SaveError naming it, before training */
    f = fopen("/tmp/tk_test_magics_a_file", "w");
    if (f) fclose(f);
    snprintf(cell, sizeof cell, "%%%%txtrain\n%strain_file: tests/data/reviews_train.csv\ndev_split: 0\n"
                                "max_examples: 16\noutput_dir: /tmp/tk_test_magics_a_file/run\n", tiny);
    m = run(cell, &rc);
    e = first(m, "error");
    TK_CHECK(e && !strcmp(json_string_value(json_object_get(e, "ename")), "SaveError"));
    TK_CHECK_MSG(strstr(evalue(m), "output_dir /tmp/tk_test_magics_a_file/run: cannot create folder "
                                   "/tmp/tk_test_magics_a_file: Not a directory") &&
                     strstr(evalue(m), "nothing was trained"), "%s", evalue(m));
    TK_CHECK(first(m, "result") == NULL);
    json_decref(m);
    unlink("/tmp/tk_test_magics_a_file");

    m = run("%txpredict /tmp/tk_test_magics_no_such_run --input tests/data/reviews_dev.csv", &rc);
    TK_CHECK_MSG(strstr(evalue(m), "/tmp/tk_test_magics_no_such_run: no such folder"), "%s", evalue(m));
    json_decref(m);
}

/* %%txtrain says which device trains (a gpu: profile on the cpu is only the
 * memory limit), and that the default lr is too small for random weights;
 * %txdevice then says how the profile's card would run fused attention. */
static void test_train_says_device_and_lr(void) {
    int rc;
    json_t *m = run("%%txtrain\nmodel: bert-tiny\ninit: random\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"
                    "vocab: tests/data/vocab_cased.txt\ntrain_file: tests/data/reviews_train.csv\ndev_split: 0\n"
                    "max_examples: 16\nmax_len: 32\nbatch_size: 8\nmax_steps: 1\ngpu: t4\n", &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    char *all = json_dumps(m, 0);
    TK_CHECK_MSG(all && strstr(all, "training on the cpu (device: cpu") &&
                     strstr(all, "gpu: t4 is the planning profile"), "%s", all ? all : "");
    TK_CHECK_MSG(all && strstr(all, "warning: lr: 2e-05 is the default") && strstr(all, "lr: 2e-3"), "%s",
                 all ? all : "");
    free(all);
    json_decref(m);
    /* %txdevice says which cuda kernel the planning profile's card runs
     * fused attention with, for the session's precision (fp32 here) */
    m = run("%txdevice --json", &rc);
    json_t *j = last_json(m);
    const char *k = j ? json_string_value(json_object_get(j, "profile_attention_kernel")) : NULL;
    const char *want = "the reference kernel (fp32 cores): f32 tensors";
    TK_CHECK_MSG(k && !strncmp(k, want, strlen(want)), "%s", k ? k : "(none)");
    json_decref(m);
}

int main(void) {
    M = tk_magics_new();
    TK_CHECK(M != NULL);
    if (!M) return tk_test_done();
    I = tk_magics_interp(M);
    TK_RUN(test_config_errors);
    TK_RUN(test_plan_line_magic);
    TK_RUN(test_plan_epoch_cell);
    TK_RUN(test_plan_gate_allocates_nothing);
    TK_RUN(test_runtime_oom_then_fit);
    TK_RUN(test_mem_data_device_reset);
    TK_RUN(test_event_ring_only_when_asked);
    TK_RUN(test_keys_magic);
    TK_RUN(test_completion);
    TK_RUN(test_errors_name_what_to_fix);
    TK_RUN(test_train_says_device_and_lr);
    tk_magics_destroy(&M);
    return tk_test_done();
}
