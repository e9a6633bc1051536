/* test_traced.c — the companion's traced model as the advice's planner
 * (app/traced.c, issue 41 point 6), with a stand-in tracer whose step's
 * activations are batch x seq x 8 MiB (16 x 128 does not fit a T4): the config as given is the trace
 * %txplan made (no call); a candidate is its own trace, asked of the tracer
 * with the candidate's settings and kept (the same settings again: no call);
 * what the tracer cannot vary is refused without a call; the trace budget
 * refuses what is not traced yet and is counted; a tracer's refusal is the
 * error; which configs the model describes; and tk_advise through the seam
 * (tk_advise_input.plan_fn): the base and every candidate planned by it;
 * a release %txfix, which resets the session, keeping the traced model;
 * and %txfix auto --for PLATFORM planning each card by tracing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tk_advisor.h"
#include "tk_app.h"
#include "tk_oom_message.h"
#include "tk_embed_trace.h"
#include "tk_session.h"
#include "tk_test.h"

#define MiB (1 << 20)

typedef struct {
    int calls;
    int fail;                 /* 1: the tracer refuses (as for an op it cannot trace) */
    char last[512];           /* the last request */
} tracer;

static json_t *toy_trace(int batch, int seq) {
    json_t *ev = json_array();
    json_array_append_new(ev, json_pack("[s, i, i, s, i, i]", "a", 0, 4 * MiB, "param", 0, -1));
    for (int s = 0; s < 2; s++) {
        json_array_append_new(ev, json_pack("[s, i]", "s", s));
        json_array_append_new(ev, json_pack("[s, i, I, s, i, i]", "a", 10 + s, (json_int_t)batch * seq * 8 * MiB, "act", 0,
                                            -1));
        json_array_append_new(ev, json_pack("[s, i]", "f", 10 + s));
    }
    json_array_append_new(ev, json_pack("[s, i]", "s", 2));
    return json_pack("{s:s, s:i, s:i, s:s, s:s, s:s, s:i, s:I, s:I, s:[s], s:[], s:o}", "model", "Toy", "batch", batch,
                     "seq", seq, "precision", "fp32", "optimizer", "adamw", "loss", "ce", "steps", 2, "n_params",
                     (json_int_t)MiB, "n_trainable", (json_int_t)MiB, "owners", "", "ops", "events", ev);
}

static int trace_fn(void *user, const char *request, const char *out_path, char *errbuf, size_t errlen) {
    tracer *t = user;
    t->calls++;
    snprintf(t->last, sizeof t->last, "%s", request);
    if (t->fail) {
        snprintf(errbuf, errlen, "enc (Toy) cannot be traced at op aten::nonzero");
        return -1;
    }
    json_t *rq = json_loads(request, 0, NULL);
    int b = (int)json_integer_value(json_object_get(rq, "batch")), s = (int)json_integer_value(json_object_get(rq, "seq"));
    json_decref(rq);
    json_t *tr = toy_trace(b, s);
    int rc = json_dump_file(tr, out_path, 0);
    json_decref(tr);
    return rc ? -1 : 0;
}

static void base_config(tk_config *c) {
    tk_config_defaults(c);
    tk_err e = {0};
    TK_CHECK(tk_config_set(c, "engine", "pytorch", &e) == TK_OK);
    TK_CHECK(tk_config_set(c, "init", "random", &e) == TK_OK);
    TK_CHECK(tk_config_set(c, "layers", "2", &e) == TK_OK);
    TK_CHECK(tk_config_set(c, "batch_size", "16", &e) == TK_OK);
    TK_CHECK(tk_config_set(c, "max_len", "128", &e) == TK_OK);
    TK_CHECK(tk_config_set(c, "gpu", "t4", &e) == TK_OK);
    TK_CHECK_MSG(tk_config_validate(c, &e) == TK_OK, "%s", e.msg);
}

/* A traced model of c over the stand-in tracer, seeded with c's trace. */
static tk_traced_model *model_of(tracer *tr, double budget, const tk_config *cfg) {
    tk_config c = *cfg;
    tk_traced_model *m = tk_traced_new(&c, "toy (Toy)", "In Toy, checkpointing: model.enc.gradient_checkpointing_enable().",
                                       trace_fn, tr, budget);
    TK_CHECK(m != NULL);
    char path[] = "/tmp/txk-test-traced-XXXXXX";
    int fd = mkstemp(path);
    TK_CHECK(fd >= 0);
    close(fd);
    json_t *t = toy_trace(c.batch_size, c.max_len);
    TK_CHECK(json_dump_file(t, path, 0) == 0);
    json_decref(t);
    tk_err e = {0};
    TK_CHECK_MSG(tk_traced_seed(m, path, &e) == TK_OK, "%s", e.msg);
    unlink(path);
    return m;
}

/* A traced model over the stand-in tracer, seeded with the base config's trace. */
static tk_traced_model *model_new(tracer *tr, double budget) {
    tk_config c;
    base_config(&c);
    return model_of(tr, budget, &c);
}

static size_t peak_of(tk_traced_model *m, const tk_config *c, tk_status *st, tk_err *e) {
    tk_plan_result p;
    *st = tk_traced_plan(m, c, NULL, 0, &p, e);
    return *st == TK_OK ? p.peak_allocated : 0;
}

static void test_each_candidate_is_its_own_trace_and_kept(void) {
    tracer tr = {0};
    tk_traced_model *m = model_new(&tr, 60);
    tk_config c = *tk_traced_config(m);
    tk_err e = {0};
    tk_status st;
    size_t base = peak_of(m, &c, &st, &e);
    TK_CHECK_MSG(st == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(tr.calls, 0); /* %txplan's trace */
    c.batch_size = 8;
    size_t half = peak_of(m, &c, &st, &e);
    TK_CHECK_MSG(st == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(tr.calls, 1);
    TK_CHECK(strstr(tr.last, "\"batch\": 8") && strstr(tr.last, "\"seq\": 128") && strstr(tr.last, "\"target\": \"cuda\""));
    /* the activations are the step's own: 16 x 128 x 8 MiB against 8 x 128 x 8 MiB */
    TK_CHECK_EQ_INT(base - half, 8LL * 128 * 8 * MiB);
    c.accumulate = 2; /* the same step: kept */
    TK_CHECK(peak_of(m, &c, &st, &e) == half && tr.calls == 1);
    c.precision = TK_PREC_FP16;
    c.recompute = TK_RECOMPUTE_LAYERS;
    c.freeze_embeddings = 1;
    peak_of(m, &c, &st, &e);
    TK_CHECK(st == TK_OK && tr.calls == 2);
    TK_CHECK(strstr(tr.last, "\"precision\": \"fp16\"") && strstr(tr.last, "\"checkpointing\": true") &&
             strstr(tr.last, "\"freeze_embeddings\": true"));
    char sum[2048];
    tk_traced_summary(m, sum, sizeof sum);
    TK_CHECK_MSG(strstr(sum, "Planned by tracing toy (Toy)") && strstr(sum, "2 traced in") &&
                 strstr(sum, "model.enc.gradient_checkpointing_enable()"), "%s", sum);
    tk_traced_destroy(&m);
    TK_CHECK(m == NULL);
}

static void test_what_it_cannot_trace_is_refused_by_name(void) {
    tracer tr = {0};
    tk_traced_model *m = model_new(&tr, 60);
    tk_config c = *tk_traced_config(m);
    tk_err e = {0};
    tk_status st;
    c.optimizer = TK_OPTIM_ADAMW8;
    peak_of(m, &c, &st, &e);
    TK_CHECK(st == TK_EINVAL && tr.calls == 0 && strstr(e.msg, "adamw8bit"));
    c = *tk_traced_config(m);
    c.eval_batch_size = 4;
    peak_of(m, &c, &st, &e);
    TK_CHECK(st == TK_EINVAL && strstr(e.msg, "eval_batch_size"));
    c = *tk_traced_config(m);
    c.batch_size = 4;
    tr.fail = 1; /* the tracer's own refusal: the module and the op */
    peak_of(m, &c, &st, &e);
    TK_CHECK(st == TK_EINVAL && tr.calls == 1 && strstr(e.msg, "toy (Toy): enc (Toy) cannot be traced at op aten::nonzero"));
    char sum[2048];
    tk_traced_summary(m, sum, sizeof sum);
    TK_CHECK_MSG(strstr(sum, "3 not traceable (first: optimizer: adamw8bit"), "%s", sum);
    tk_traced_destroy(&m);
}

static void test_the_budget_refuses_what_is_not_traced_yet(void) {
    tracer tr = {0};
    tk_traced_model *m = model_new(&tr, 1e-9); /* spent by the first trace */
    tk_config c = *tk_traced_config(m);
    tk_err e = {0};
    tk_status st;
    c.batch_size = 8;
    peak_of(m, &c, &st, &e);
    TK_CHECK(st == TK_OK && tr.calls == 1);
    c.batch_size = 4;
    peak_of(m, &c, &st, &e);
    TK_CHECK(st == TK_EINVAL && tr.calls == 1 && strstr(e.msg, "trace budget"));
    c.batch_size = 8; /* traced already: still planned */
    peak_of(m, &c, &st, &e);
    TK_CHECK(st == TK_OK && tr.calls == 1);
    char sum[2048];
    tk_traced_summary(m, sum, sizeof sum);
    TK_CHECK_MSG(strstr(sum, "1 candidates not planned: past the trace budget"), "%s", sum);
    tk_traced_begin(m); /* the next advice starts its own count */
    tk_traced_summary(m, sum, sizeof sum);
    TK_CHECK_MSG(strstr(sum, "(0 traced in 0.0 s, 0 replays") && !strstr(sum, "budget"), "%s", sum);
    tk_traced_destroy(&m);
}

static void test_which_configs_it_describes(void) {
    tracer tr = {0};
    tk_traced_model *m = model_new(&tr, 60);
    tk_config c = *tk_traced_config(m);
    TK_CHECK(tk_traced_describes(m, &c));
    c.batch_size = 2, c.accumulate = 8, c.precision = TK_PREC_BF16, c.freeze_layers = 1;
    snprintf(c.gpu, sizeof c.gpu, "l4");
    TK_CHECK(tk_traced_describes(m, &c)); /* what a fix of its advice leaves */
    c.hidden = 1024;
    TK_CHECK(!tk_traced_describes(m, &c)); /* another model */
    TK_CHECK(!tk_traced_describes(NULL, &c));
    tk_traced_destroy(&m);
}

static void test_advice_plans_through_the_seam(void) {
    tracer tr = {0};
    tk_traced_model *m = model_new(&tr, 60);
    tk_config c = *tk_traced_config(m);
    tk_advice *a = calloc(1, sizeof *a);
    tk_advise_input in = {.config = &c, .margin_frac = 0.05, .plan_fn = tk_traced_plan, .plan_ctx = m};
    tk_err e = {0};
    TK_CHECK_MSG(tk_advise(&in, a, &e) == TK_OK, "%s", e.msg);
    tk_plan_result p;
    TK_CHECK(tk_traced_plan(m, &c, NULL, 0, &p, &e) == TK_OK);
    TK_CHECK_EQ_INT(a->base.peak_reserved, p.peak_reserved);
    TK_CHECK(!a->base.fits && a->n_cand > 0 && tr.calls > 0);
    int fits = 0;
    for (int i = 0; i < a->n_cand; i++) { /* every candidate: the planner's figure for its config */
        if (a->cand[i].action_only) continue;
        TK_CHECK(tk_traced_plan(m, &a->cand[i].config, NULL, 0, &p, &e) == TK_OK);
        TK_CHECK_MSG(a->cand[i].peak == p.peak_reserved, "%s", a->cand[i].label);
        TK_CHECK(a->cand[i].config.optimizer != TK_OPTIM_ADAMW8); /* refused: never offered */
        fits |= a->cand[i].fits;
    }
    TK_CHECK(fits); /* a smaller step, traced, fits */
    free(a);
    tk_traced_destroy(&m);
}

/* %txadvise on the session's config (the line form); its JSON's planned_by,
 * "" when the advice was not planned by tracing. */
static void advise_planned_by(tk_session *s, char *by, size_t n) {
    tk_advise_request rq = {.have_config = 1, .from_session = 1, .door = TK_DOOR_CELL, .api = TK_API_AUTO, .top = 12,
                            .margin = 0.05};
    TK_CHECK(tk_session_config(s) != NULL);
    rq.config = *tk_session_config(s);
    tk_advise_reply out = {0};
    tk_err e = {0};
    TK_CHECK_MSG(tk_app_advise(s, &rq, &out, &e) == TK_OK, "%s", e.msg);
    json_t *j = json_object_get(out.bundle, "application/json");
    const char *p = json_string_value(json_object_get(j, "planned_by"));
    snprintf(by, n, "%s", p ? p : "");
    json_decref(out.bundle);
}

/* A release %txfix resets the session (its device, plan, advice): the traced
 * model, which describes the user's model, stays, so the next advice on its
 * config still plans by tracing (issue 41 point 6). */
static void test_a_release_fix_keeps_the_traced_model(void) {
    tracer tr = {0};
    tk_err e = {0};
    tk_config c;
    base_config(&c);
    TK_CHECK(tk_config_set(&c, "device", "meta", &e) == TK_OK); /* the earlier run's memory: no host pages */
    TK_CHECK(tk_config_set(&c, "batch_size", "8", &e) == TK_OK);
    TK_CHECK_MSG(tk_config_validate(&c, &e) == TK_OK, "%s", e.msg);
    tk_session *s = tk_session_new();
    tk_session_set_traced(s, model_of(&tr, 60, &c));
    /* an earlier run's 2 GiB still on the session's device */
    tk_dev *d = tk_session_device(s, tk_session_config(s), NULL, &e);
    TK_CHECK_MSG(d != NULL, "%s", e.msg);
    void *p = NULL;
    TK_CHECK(tk_alloc_malloc(tk_dev_alloc(d), (size_t)2048 * MiB, (tk_tag){TK_CAT_ACT, -1}, &p, NULL) == TK_OK);
    char by[1600];
    advise_planned_by(s, by, sizeof by);
    TK_CHECK_MSG(!strncmp(by, "Planned by tracing toy (Toy)", 28), "%s", by);
    const tk_advice *a = tk_session_advice(s);
    int rel = -1;
    for (int i = 0; a && i < a->n_cand; i++)
        if (a->cand[i].action_only && (a->cand[i].fixes[0].release & TK_RELEASE_SESSION)) rel = i;
    TK_CHECK_MSG(rel >= 0, "no release candidate in the advice");
    char num[16], *argv[] = {num};
    snprintf(num, sizeof num, "%d", rel + 1);
    tk_app_args w;
    TK_CHECK_MSG(tk_app_args_parse(TK_VERB_FIX, TK_DOOR_CELL, "%txfix", argv, 1, &w, &e) == TK_OK, "%s", e.msg);
    tk_fix_reply fr = {0};
    TK_CHECK_MSG(tk_app_fix(s, &w, &fr, &e) == TK_OK, "%s", e.msg);
    json_decref(fr.bundle);
    TK_CHECK_MSG(strstr(fr.said, "released the session's device") != NULL, "%s", fr.said);
    TK_CHECK(tk_session_current_device(s) == NULL); /* the device (and the 2 GiB) went */
    TK_CHECK(tk_session_traced(s, tk_session_config(s)) != NULL);
    advise_planned_by(s, by, sizeof by);
    TK_CHECK_MSG(!strncmp(by, "Planned by tracing toy (Toy)", 28), "after the release: '%s'", by);
    tk_session_destroy(&s); /* frees the traced model */
}

/* 1 when config c, traced, fits with a 5 % margin on every card of colab. */
static int traced_fits_colab(tk_traced_model *m, const tk_config *c) {
    tk_card_fit cards[16];
    int n = 0;
    tk_err e = {0};
    TK_CHECK_MSG(tk_plan_cards_by(tk_traced_plan, m, c, NULL, 0, "colab", cards, 16, &n, &e) == TK_OK, "%s", e.msg);
    int ok = n > 0;
    for (int k = 0; k < n; k++) ok &= cards[k].margin >= (int64_t)(cards[k].budget / 20);
    return ok;
}

/* %txfix auto --for colab on the traced model's advice (for an L4): each
 * card planned by tracing (tk_advice_auto_for_by with tk_traced_plan), not
 * by the engine, which plans the toy's 2-layer BERT far smaller than its
 * trace and so takes a candidate whose traced step does not fit a T4. */
static void test_fix_auto_for_a_platform_plans_the_cards_by_tracing(void) {
    tracer tr = {0};
    tk_err e = {0};
    tk_config c; /* 32 x 128 on an L4: traced, accumulate x2 (16 GiB) fits the L4 but not Colab's T4 */
    base_config(&c);
    TK_CHECK(tk_config_set(&c, "batch_size", "32", &e) == TK_OK && tk_config_set(&c, "gpu", "l4", &e) == TK_OK);
    TK_CHECK_MSG(tk_config_validate(&c, &e) == TK_OK, "%s", e.msg);
    tk_session *s = tk_session_new();
    tk_traced_model *m = model_of(&tr, 60, &c);
    tk_session_set_traced(s, m);
    char by[1600];
    advise_planned_by(s, by, sizeof by);
    TK_CHECK_MSG(!strncmp(by, "Planned by tracing toy (Toy)", 28), "%s", by);
    const tk_advice *a = tk_session_advice(s);
    int engine = tk_advice_auto_for(a, "colab", NULL, 0);
    TK_CHECK_MSG(engine >= 0 && !traced_fits_colab(m, &a->cand[engine].config), "the engine's pick: %d", engine);
    int traced = tk_advice_auto_for_by(tk_traced_plan, m, a, "colab", NULL, 0);
    TK_CHECK(traced >= 0 && traced != engine && traced_fits_colab(m, &a->cand[traced].config));
    char *argv[] = {"auto", "--for", "colab"};
    tk_app_args w;
    TK_CHECK_MSG(tk_app_args_parse(TK_VERB_FIX, TK_DOOR_CELL, "%txfix", argv, 3, &w, &e) == TK_OK, "%s", e.msg);
    tk_fix_reply fr = {0};
    TK_CHECK_MSG(tk_app_fix(s, &w, &fr, &e) == TK_OK, "%s", e.msg);
    json_decref(fr.bundle);
    TK_CHECK(traced_fits_colab(m, &fr.after)); /* what %txfix applied: the traced pick */
    TK_CHECK_EQ_INT(fr.after.batch_size, a->cand[traced].config.batch_size);
    TK_CHECK_EQ_INT(fr.after.accumulate, a->cand[traced].config.accumulate);
    TK_CHECK(fr.predicted == a->cand[traced].peak);
    tk_session_destroy(&s);
}

int main(void) {
    TK_RUN(test_each_candidate_is_its_own_trace_and_kept);
    TK_RUN(test_what_it_cannot_trace_is_refused_by_name);
    TK_RUN(test_the_budget_refuses_what_is_not_traced_yet);
    TK_RUN(test_which_configs_it_describes);
    TK_RUN(test_advice_plans_through_the_seam);
    TK_RUN(test_a_release_fix_keeps_the_traced_model);
    TK_RUN(test_fix_auto_for_a_platform_plans_the_cards_by_tracing);
    return tk_test_done();
}
