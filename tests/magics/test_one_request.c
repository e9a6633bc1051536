/* test_one_request.c — issue 39's cases through the txkernel interpreter
 * (the same magics the kernel and the companion run):
 *  - `%txadvise --api loop` is taken (its usage line lists it; it was
 *    refused: "expected key=value, got 'loop'"), and every valued flag of
 *    the option table that a cell takes reads its value;
 *  - after %txplan --gpus colab of a config that names no card, %txadvise
 *    advises for colab's smallest card (T4), says so, plans against its
 *    capacity and offers no bf16 (a T4 has no bf16 tensor cores); %txfix
 *    then changes only what the fix changes (no gpu: appears);
 *  - after --gpu t4, or a YAML plan with gpu: t4, the same card; bf16 only
 *    for a card with bf16 tensor cores (a100-40) or no card at all;
 *  - --snapshot on %txplan and %%txtrain writes a PyTorch snapshot;
 *    %%txtrain --file reads the config from a file;
 *  - the resolved spec: plan and a planned-OOM run of one config name the
 *    same attention (and why) and capacity. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tk_app.h"
#include "tk_magics.h"
#include "tk_plan.h"
#include "tk_session.h"
#include "tk_test.h"

#include "magics_rec.h"

/* bert-base at 512 tokens, batch 16, fp32: does not fit a T4 (the case) */
#define BIG "model: bert-base-cased\ninit: random\nnum_labels: 2\nmax_len: 512\nbatch_size: 16\ndevice: cpu\n"
#define TINY                                                                                                     \
    "model: bert-tiny\ninit: random\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"                       \
    "vocab: tests/data/vocab_cased.txt\ntrain_file: tests/data/reviews_train.csv\ndev_split: 0\n"               \
    "max_examples: 16\nmax_len: 32\nbatch_size: 8\nmax_steps: 1\nlr: 2e-3\ndevice: cpu\n"

static int has_bf16(const json_t *advice) {
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(advice, "candidates"), i, c) {
        const char *l = json_string_value(json_object_get(c, "label"));
        if (l && strstr(l, "bf16")) return 1;
    }
    return 0;
}

static json_t *advise_json(const char *line, int *rc) {
    json_t *m = run(line, rc);
    TK_CHECK_MSG(*rc == 0, "%s: %s", line, evalue(m));
    json_t *j = last_json(m);
    json_incref(j);
    json_decref(m);
    return j;
}

static void test_api_flag_is_taken(void) {
    int rc;
    json_decref(run("%txreset", &rc));
    json_t *m = run("%%txplan\n" BIG, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_decref(m);
    json_t *a = advise_json("%txadvise --api loop --json", &rc);
    TK_CHECK(a && !strcmp(json_string_value(json_object_get(a, "api")), "loop"));
    json_decref(a);
    /* the cell form takes it the same way */
    m = run("%%txadvise --api trainer --top 3\n" BIG, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_decref(m);
    /* every flag a cell of %txadvise takes with a value is read as a flag, never as key=value */
    int n = 0;
    const tk_option *o = tk_app_options(&n);
    for (int i = 0; i < n; i++) {
        if (!tk_app_option_takes(&o[i], TK_VERB_ADVISE, TK_DOOR_CELL) || !tk_app_option_valued(&o[i], TK_DOOR_CELL))
            continue;
        char line[128];
        snprintf(line, sizeof line, "%%txadvise %s x", o[i].name);
        m = run(line, &rc);
        TK_CHECK_MSG(!strstr(evalue(m), "expected key=value"), "%s: %s", line, evalue(m));
        json_decref(m);
    }
}

static void test_platform_card(void) {
    int rc;
    json_decref(run("%txreset", &rc));
    json_t *m = run("%%txplan --gpus colab\n" BIG, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_decref(m);
    m = run("%txadvise", &rc);
    char out[8192];
    json_t *d = first(m, "display");
    const char *txt = d ? json_string_value(json_object_get(json_object_get(d, "data"), "text/plain")) : NULL;
    snprintf(out, sizeof out, "%s", txt ? txt : "");
    TK_CHECK_MSG(rc == 0 && strstr(out, "Advised for t4, the smallest card colab hands out"), "%s", out);
    TK_CHECK_MSG(!strstr(out, "no capacity to fit against"), "%s", out);
    json_decref(m);
    json_t *a = advise_json("%txadvise --json", &rc);
    json_t *run_ = json_object_get(a, "run");
    TK_CHECK(run_ && !strcmp(json_string_value(json_object_get(run_, "card")), "t4"));
    TK_CHECK_EQ_INT((long long)json_integer_value(json_object_get(a, "capacity")),
                    (long long)tk_gpu_profile_budget(tk_gpu_profile_find("t4")));
    TK_CHECK_MSG(!has_bf16(a), "bf16 offered for a T4");
    json_decref(a);
    /* the fix changes what it changes: the session's config names no card after it */
    m = run("%txfix 1 --json", &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_t *f = last_json(m);
    const char *diff = json_string_value(json_object_get(f, "diff"));
    TK_CHECK_MSG(diff && !strstr(diff, "gpu"), "%s", diff ? diff : "");
    json_decref(m);
    TK_CHECK(tk_session_config(tk_magics_session(M))->gpu[0] == 0);
    /* --for names the platform the same way (and kaggle's smallest is a T4 too) */
    json_decref(run("%%txplan\n" BIG, &rc));
    a = advise_json("%txadvise --for kaggle --json", &rc);
    TK_CHECK(a && !strcmp(json_string_value(json_object_get(json_object_get(a, "run"), "card")), "t4"));
    TK_CHECK(!has_bf16(a));
    json_decref(a);
    /* a new config (a cell) forgets the platform: no card, so bf16 may be offered */
    a = advise_json("%txadvise --json", &rc);
    TK_CHECK(a && !strcmp(json_string_value(json_object_get(json_object_get(a, "run"), "card")), ""));
    TK_CHECK(has_bf16(a));
    json_decref(a);
}

static void test_named_card(void) {
    int rc;
    json_decref(run("%txreset", &rc));
    json_t *m = run("%%txplan --gpu t4\n" BIG, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_decref(m);
    json_t *a = advise_json("%txadvise --json", &rc);
    TK_CHECK(a && !strcmp(json_string_value(json_object_get(json_object_get(a, "run"), "card")), "t4"));
    TK_CHECK(!has_bf16(a));
    json_decref(a);
    json_decref(run("%%txplan\n" BIG "gpu: t4\n", &rc));
    a = advise_json("%txadvise --json", &rc);
    TK_CHECK(!has_bf16(a));
    json_decref(a);
    json_decref(run("%txplan --gpu a100-40", &rc));
    a = advise_json("%txadvise --json", &rc);
    TK_CHECK(a && !strcmp(json_string_value(json_object_get(json_object_get(a, "run"), "card")), "a100-40"));
    json_decref(a);
}

static long file_size(const char *p) {
    struct stat st;
    return stat(p, &st) ? -1 : (long)st.st_size;
}

static void test_snapshot_and_file(void) {
    int rc;
    char snap[64], cfg[64], out[4096];
    snprintf(snap, sizeof snap, "/tmp/txk_one_request_%d.pickle", (int)getpid());
    snprintf(cfg, sizeof cfg, "/tmp/txk_one_request_%d.yaml", (int)getpid());
    json_decref(run("%txreset", &rc));
    char line[512];
    snprintf(line, sizeof line, "%%%%txplan --snapshot %s\n" TINY, snap);
    json_t *m = stdout_of(run(line, &rc), out, sizeof out);
    TK_CHECK_MSG(rc == 0 && strstr(out, "PyTorch snapshot of the planned step written to") && file_size(snap) > 0,
                 "%s %s", evalue(m), out);
    json_decref(m);
    remove(snap);
    FILE *f = fopen(cfg, "w");
    TK_CHECK(f != NULL);
    if (!f) return;
    fputs(TINY, f);
    fclose(f);
    snprintf(line, sizeof line, "%%txtrain --file %s --snapshot %s", cfg, snap);
    m = stdout_of(run(line, &rc), out, sizeof out);
    TK_CHECK_MSG(rc == 0 && strstr(out, "PyTorch snapshot written to") && file_size(snap) > 0, "%s %s", evalue(m), out);
    json_decref(m);
    const tk_run_report *r = tk_session_last_run(tk_magics_session(M));
    TK_CHECK(r && r->end == TK_RUN_DONE && r->steps == 1);
    remove(snap);
    remove(cfg);
    /* a flag the verb does not take names itself and the verb's flags */
    m = run("%txtrain --gpus colab", &rc);
    TK_CHECK_MSG(rc == -1 && strstr(evalue(m), "unknown option --gpus") && strstr(evalue(m), "--snapshot"), "%s",
                 evalue(m));
    json_decref(m);
}

/* The plan and the run of one config read one resolved spec: a run that
 * stops at its plan shows the plan it made, which names the same attention,
 * reason and capacity as %txplan of the same config. */
static void test_plan_and_run_agree(void) {
    static const char *const extra[] = {"capacity: 4MiB\n", "capacity: 4MiB\nattention: fused\n",
                                        "gpu: t4\ncapacity: 36MiB\n"};
    for (int i = 0; i < 3; i++) {
        int rc;
        char cell[1024];
        json_decref(run("%txreset", &rc));
        snprintf(cell, sizeof cell, "%%%%txplan --json\n" TINY "%s", extra[i]);
        json_t *m = run(cell, &rc);
        json_t *p = json_deep_copy(last_json(m));
        json_decref(m);
        json_decref(run("%txreset", &rc));
        snprintf(cell, sizeof cell, "%%%%txtrain\n" TINY "%s", extra[i]);
        m = run(cell, &rc);
        TK_CHECK_MSG(rc == -1 && strstr(evalue(m), "stopped before allocating"), "%s", evalue(m));
        json_t *t = last_json(m);
        TK_CHECK(p && t);
        if (p && t) {
            TK_CHECK_MSG(json_equal(json_object_get(p, "attention"), json_object_get(t, "attention")) &&
                             json_equal(json_object_get(p, "attention_why"), json_object_get(t, "attention_why")) &&
                             json_equal(json_object_get(p, "capacity"), json_object_get(t, "capacity")),
                         "config %d: plan %s (%s) vs run %s (%s)", i,
                         json_string_value(json_object_get(p, "attention")),
                         json_string_value(json_object_get(p, "attention_why")),
                         json_string_value(json_object_get(t, "attention")),
                         json_string_value(json_object_get(t, "attention_why")));
        }
        json_decref(p);
        json_decref(m);
    }
}

/* peak reserved of c planned with attention a */
static size_t planned_with(const tk_config *c, tk_attention a) {
    tk_config t = *c;
    t.attention = a;
    tk_plan_result p;
    tk_err err = {0};
    TK_CHECK(tk_plan(&t, NULL, 0, &p, &err) == TK_OK);
    return p.peak_reserved;
}

/* The resolver alone, with the device a run would have on a card: the card's
 * total as capacity for `device: auto`, and attention: auto by the one rule
 * (issue 43), whether the plan or the run asks (both call this one
 * function): fp32 has no fast kernel, so standard where it fits; fp16 runs
 * the tensor-core kernel, so fused; where only fused fits the capacity,
 * fused, saying why. */
static void test_spec_on_cuda(void) {
    tk_config c;
    tk_config_defaults(&c);
    tk_run_where w = {.device_known = 1, .device = TK_DEV_CUDA, .device_total = (size_t)80 << 30};
    tk_run_spec s;
    tk_err err = {0};
    TK_CHECK(tk_run_spec_resolve(&c, &w, &s, &err) == TK_OK);
    TK_CHECK(s.attention == TK_ATTN_STANDARD && !strcmp(s.attention_why, TK_ATTN_WHY_SLOW) &&
             s.capacity == (size_t)80 << 30 && !s.card[0]);
    tk_config h = c;
    h.precision = TK_PREC_FP16;
    TK_CHECK(tk_run_spec_resolve(&h, &w, &s, &err) == TK_OK);
    TK_CHECK(s.attention == TK_ATTN_FUSED && !strcmp(s.attention_why, TK_ATTN_WHY_FAST));
    tk_config big = c;
    big.max_len = 512;
    size_t std_need = planned_with(&big, TK_ATTN_STANDARD), fused_need = planned_with(&big, TK_ATTN_FUSED);
    TK_CHECK(fused_need < std_need);
    tk_run_where tight = w;
    tight.device_total = fused_need + (std_need - fused_need) / 2; /* fused fits, standard does not */
    TK_CHECK(tk_run_spec_resolve(&big, &tight, &s, &err) == TK_OK);
    TK_CHECK(s.attention == TK_ATTN_FUSED && !strcmp(s.attention_why, TK_ATTN_WHY_FITS));
    w.device = TK_DEV_CPU;
    TK_CHECK(tk_run_spec_resolve(&c, &w, &s, &err) == TK_OK);
    TK_CHECK(s.attention == TK_ATTN_STANDARD && s.capacity == 0);
    w.platform = "colab";
    TK_CHECK(tk_run_spec_resolve(&c, &w, &s, &err) == TK_OK);
    TK_CHECK(!strcmp(s.card, "t4") && s.capacity == tk_gpu_profile_budget(tk_gpu_profile_find("t4")));
    w.platform = "nowhere";
    TK_CHECK(tk_run_spec_resolve(&c, &w, &s, &err) == TK_EINVAL && strstr(err.msg, "nowhere"));
}

int main(void) {
    M = tk_magics_new();
    I = tk_magics_interp(M);
    TK_RUN(test_spec_on_cuda);
    TK_RUN(test_api_flag_is_taken);
    TK_RUN(test_platform_card);
    TK_RUN(test_named_card);
    TK_RUN(test_snapshot_and_file);
    TK_RUN(test_plan_and_run_agree);
    tk_magics_destroy(&M);
    return tk_test_done();
}
