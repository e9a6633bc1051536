/* test_host_chaos.c — fails the Nth host allocation (tk_malloc and friends,
 * and jansson's, through json_set_alloc_funcs) for every N a run makes, as
 * jansson's test_chaos does, over the three things a user asks of us:
 *
 *   plan     a bert-tiny-shaped model planned on meta (tk_plan);
 *   train    a bert-tiny-shaped random model trained 2 steps on cpu, the
 *            device and the model made inside the run;
 *   advise   the advisor on a given plan (tk_advise), and on a pasted OOM
 *            message with a config (tk_oom_message_report: planned on the
 *            platform's cards, advised on the card it names).
 *
 * For each N the run must either give exactly the clean run's result (an
 * allocation whose failure has a fallback) or fail with TK_ENOMEM and a
 * message that says "out of host memory". Nothing may crash, and ASan's leak
 * check at exit fails the binary if a failure path leaks.
 *
 * Time: every N up to TK_CHAOS_DENSE, then a stride that keeps each scenario
 * to about TK_CHAOS_RUNS runs (the runs after the dense part step through
 * the whole count, so late allocations — the optimizer, eval, the report —
 * are failed too). Needs the test build's counting allocator (-DTK_HOST_CHAOS,
 * libtk_asan.a). TK_CHAOS_RUNS=n makes a deeper run by hand (n runs a
 * scenario, every N when n exceeds the count). TK_CHAOS_ALL=1 lists every misreported N, each with the
 * stack of the allocation that failed. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_advisor.h"
#include "tk_host_mem.h"
#include "tk_oom_message.h"
#include "tk_plan.h"
#include "tk_test.h"
#include "tk_train.h"
#include "tk_txmagics.h"

#define TK_CHAOS_DENSE 60
#define TK_CHAOS_RUNS 120

/* A scenario: runs once, writes what its result was into out (compared with
 * the clean run's), returns the status. */
typedef tk_status (*scenario)(char *out, size_t n, tk_err *e);

static const tk_config *plan_cfg(void) {
    static tk_config c;
    static int ready;
    if (!ready) {
        tk_err e = { 0 };
        tk_config_defaults(&c);
        snprintf(c.model, sizeof c.model, "bert-tiny");
        c.max_len = 32;
        c.batch_size = 8;
        c.device = TK_DEVICE_META;
        c.capacity = (size_t)64 << 20;
        TK_CHECK(tk_config_resolve_model(&c, &e) == TK_OK);
        ready = 1;
    }
    return &c;
}

static tk_status run_plan(char *out, size_t n, tk_err *e) {
    tk_plan_result p;
    tk_status st = tk_plan(plan_cfg(), NULL, 0, &p, e);
    if (st == TK_OK)
        snprintf(out, n, "%zu %zu %d %lld", p.peak_allocated, p.peak_reserved, p.fits, (long long)p.n_params);
    return st;
}

/* bert-tiny's shape (128 hidden, 2 layers, 2 heads, 512 intermediate) with a
 * small vocabulary, so a run takes milliseconds under ASan. */
#define TV 256
#define TB 2
#define TT 8
static tk_status run_train(char *out, size_t n, tk_err *e) {
    static int32_t ids[2 * TB * TT], types[2 * TB * TT], mask[2 * TB * TT], labels[2 * TB];
    for (int i = 0; i < 2 * TB * TT; i++) {
        ids[i] = 4 + (i * 37) % (TV - 4);
        mask[i] = (i % TT) < TT - 2;
        types[i] = 0;
    }
    for (int i = 0; i < 2 * TB; i++) labels[i] = i % 2;
    tk_batch b[2];
    for (int i = 0; i < 2; i++)
        b[i] = (tk_batch){ .B = TB, .T = TT, .input_ids = ids + i * TB * TT, .token_type_ids = types + i * TB * TT,
                           .attention_mask = mask + i * TB * TT, .labels = labels + i * TB };
    tk_model_opts o;
    memset(&o, 0, sizeof o);
    o.dims = (tk_bert_dims){ .hidden = 128, .layers = 2, .heads = 2, .intermediate = 512, .vocab_size = TV,
                             .max_position = 64, .type_vocab = 2, .layer_norm_eps = 1e-12f };
    o.head = TK_HEAD_POOLED;
    o.num_labels = 2;
    o.towers = 1;
    o.max_len = TT;
    o.seed = 3;
    tk_config c;
    tk_config_defaults(&c);
    c.lr = 1e-3f;
    c.epochs = 1;
    c.log_every = 1;
    c.output_dir[0] = c.resume_from[0] = '\0';
    tk_dev_opts dopt = { .kind = TK_DEV_CPU, .threads = 1 };
    tk_train_result r;
    memset(&r, 0, sizeof r);
    tk_status st;
    tk_model *m = NULL;
    tk_dev *d = tk_dev_new(&dopt, e);
    if (!d) return e->status;
    if (!(m = tk_model_new(d, &o, e))) {
        st = e->status;
        goto out;
    }
    if ((st = tk_model_init_random(m, 5, e)) != TK_OK) goto out;
    if ((st = tk_train_run(&c, m, b, 2, b, 1, NULL, &r, e)) != TK_OK) goto out;
    float l = r.n_history ? r.history[r.n_history - 1].train_loss : -1.0f;
    snprintf(out, n, "%lld %a %zu", (long long)r.steps, l, r.peak_reserved);
out:
    tk_train_result_clear(&r);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    return st;
}

static tk_status run_advise_plan(char *out, size_t n, tk_err *e) {
    tk_config c = *plan_cfg();
    c.batch_size = 64;
    c.max_len = 128;
    c.capacity = (size_t)40 << 20; /* too small: the advisor has fixes to rank */
    tk_plan_result p;
    tk_status st = tk_plan(&c, NULL, 0, &p, e);
    if (st != TK_OK) return st;
    tk_advice *a = tk_malloc(sizeof *a);
    if (!a) return tk_err_nomem(e, "test");
    tk_advise_input in = { .config = &c, .plan = &p, .max_plans = 40 };
    if ((st = tk_advise(&in, a, e)) == TK_OK) {
        char *txt = tk_advice_format(a, 3);
        if (!txt) st = tk_err_nomem(e, "advice");
        else snprintf(out, n, "%d %d %zu %s", a->n_diag, a->n_cand, a->n_cand ? a->cand[0].peak : 0, txt);
        free(txt);
    }
    free(a);
    return st;
}

static char *pasted;
static size_t pasted_n;

static tk_status run_advise_message(char *out, size_t n, tk_err *e) {
    tk_config c = *plan_cfg();
    c.batch_size = 32;
    c.max_len = 128;
    c.device = TK_DEVICE_META;
    json_t *bundle = NULL;
    tk_status st = tk_oom_message_report(pasted, pasted_n, &c, NULL, 0, NULL, &bundle, e);
    if (st == TK_OK) {
        char *js = json_dumps(bundle, JSON_SORT_KEYS | JSON_COMPACT);
        if (!js) st = tk_err_nomem(e, "test");
        else snprintf(out, n, "%s", js);
        free(js);
    }
    json_decref(bundle);
    return st;
}

/* The clean run's count, then N = 1..DENSE and a stride over the rest. */
static void chaos(const char *name, scenario run) {
    static char want[1 << 16], got[1 << 16];
    tk_err e = { 0 };
    want[0] = '\0';
    tk_host_chaos_arm(0);
    tk_status st0 = run(want, sizeof want, &e);
    uint64_t calls = tk_host_chaos_calls();
    TK_CHECK_MSG(st0 == TK_OK, "%s clean: %s: %s", name, tk_status_name(st0), e.msg);
    TK_CHECK(calls > 0);
    /* TK_CHAOS_RUNS=n: a deeper run by hand (n runs a scenario, at most) */
    uint64_t nruns = getenv("TK_CHAOS_RUNS") ? strtoull(getenv("TK_CHAOS_RUNS"), NULL, 10) : TK_CHAOS_RUNS;
    if (nruns <= TK_CHAOS_DENSE) nruns = TK_CHAOS_DENSE + 1;
    uint64_t stride = calls > TK_CHAOS_DENSE ? (calls - TK_CHAOS_DENSE) / (nruns - TK_CHAOS_DENSE) + 1 : 1;
    int runs = 0, ok = 0, nomem = 0, bad = 0;
    for (uint64_t k = 1; k <= calls; k += k < TK_CHAOS_DENSE ? 1 : stride) {
        memset(&e, 0, sizeof e);
        got[0] = '\0';
        tk_host_chaos_arm(k);
        tk_status st = run(got, sizeof got, &e);
        int fired = tk_host_chaos_fired();
        tk_host_chaos_arm(0);
        runs++;
        if (st == TK_OK && strcmp(got, want) == 0) {
            ok++;
        } else if (fired && st == TK_ENOMEM && strstr(e.msg, "out of host memory")) {
            nomem++;
        } else if (bad++ < (getenv("TK_CHAOS_ALL") ? 100000 : 8)) {
            TK_CHECK_MSG(0, "%s: allocation %llu of %llu failed%s: %s: %s%s", name, (unsigned long long)k,
                         (unsigned long long)calls, fired ? "" : " (not reached)", tk_status_name(st), e.msg,
                         st == TK_OK ? " (a different result)" : "");
            if (getenv("TK_CHAOS_ALL") && !getenv("TK_CHAOS_TRACE")) { /* once more, showing where */
                setenv("TK_CHAOS_TRACE", "1", 1);
                tk_host_chaos_arm(k);
                run(got, sizeof got, &e);
                tk_host_chaos_arm(0);
                unsetenv("TK_CHAOS_TRACE");
            }
        }
    }
    if (bad) TK_CHECK_MSG(bad == 0, "%s: %d of %d runs misreported", name, bad, runs);
    fprintf(stderr, "  %s: %llu host allocations; %d runs (every N to %d, then every %llu): %d out of host "
            "memory, %d the clean result\n", name, (unsigned long long)calls, runs, TK_CHAOS_DENSE,
            (unsigned long long)stride, nomem, ok);
}

static void test_plan(void) { chaos("plan", run_plan); }
static void test_train(void) { chaos("train", run_train); }
static void test_advise_plan(void) { chaos("advise on a plan", run_advise_plan); }

static void test_advise_message(void) {
    FILE *f = fopen("tests/data/oom_messages/00_seed_p4.txt", "rb");
    TK_CHECK(f);
    if (!f) return;
    pasted = calloc(1, 1 << 16);
    pasted_n = fread(pasted, 1, (1 << 16) - 1, f);
    fclose(f);
    chaos("advise on a pasted message", run_advise_message);
    free(pasted);
}

int main(void) {
    json_set_alloc_funcs(tk_malloc, free); /* jansson's allocations fail in turn too */
    TK_RUN(test_plan);
    TK_RUN(test_train);
    TK_RUN(test_advise_plan);
    TK_RUN(test_advise_message);
    return tk_test_done();
}
