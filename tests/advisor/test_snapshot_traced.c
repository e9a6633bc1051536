/* test_snapshot_traced.c — a PyTorch snapshot's step planned by the user's
 * traced model (tk_snap_opts.plan_fn, issue 41 point 6), on a real file:
 * tests/data/gpu_h200/mini-16x64-sdpa (a BertForSequenceClassification of
 * hidden 256, 4 layers, batch 16 x 64 tokens, two steps on an H200; read
 * through `xz -dc`). The planner here is a stand-in that counts its calls
 * and plans with tk_plan_engine (the companion's is app/traced.c, tested in
 * tests/app/test_traced.c and tests/companion/test_txwatch_traced.py):
 * - the file's batch and length are the traced config's: the run as it ran
 *   is planned by the stand-in, on the card the file's 32 MiB cuBLAS
 *   workspaces show, and the report says so (text, JSON planned_by);
 * - a batch or a length that differ: one line naming each figure, the
 *   stand-in never called, the plan as today (engine: pytorch);
 * - the stand-in refusing: one line with its reason, the plan as today;
 * - no shape (a file whose blocks show no BERT): one line saying so;
 * - at an OOM (a file built here as test_snapshot_bert.py builds one:
 *   BERT-mini's weights and AdamW's states and 6 x 128's activations, then
 *   one more request), each fix is planned by the traced planner too (its own
 *   config: the step's change), against the file's capacity, not the card
 *   the model was planned on, and its code is in the traced config's API
 *   (a Trainer's: TrainingArguments lines); the planner's own account
 *   (tk_snap_opts.describe) is the report's planned_by, asked last. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_snapshot.h"
#include "tk_plan.h"
#include "tk_test.h"

#define MiB ((size_t)1 << 20)

typedef struct {
    int calls;
    int refuse;
    char gpu[32];
    int batch, seq;
    struct { int batch, accumulate, recompute; tk_precision precision; } seen[8]; /* each config planned */
} stand_in;

/* tk_snap_opts.describe: what the stand-in planned, once the plans are made. */
static void describe(void *ctx, char *buf, size_t n) {
    const stand_in *t = ctx;
    snprintf(buf, n, "Planned by the stand-in: %d plans.", t->calls);
}

static tk_status plan_by(void *ctx, const tk_config *c, const int *lengths, int n, tk_plan_result *out, tk_err *err) {
    stand_in *t = ctx;
    if (t->calls < 8) {
        t->seen[t->calls].batch = c->batch_size, t->seen[t->calls].accumulate = c->accumulate;
        t->seen[t->calls].recompute = c->recompute != TK_RECOMPUTE_NONE, t->seen[t->calls].precision = c->precision;
    }
    t->calls++;
    snprintf(t->gpu, sizeof t->gpu, "%s", c->gpu);
    t->batch = c->batch_size, t->seq = c->max_len;
    if (t->refuse) {
        tk_err_set(err, TK_EINVAL, "mini (BertForSequenceClassification): not traced: the stand-in refuses");
        return TK_EINVAL;
    }
    return tk_plan_engine(c, lengths, n, out, err);
}

/* The file's bytes, decompressed by xz (NULL with a message when xz fails). */
static uint8_t *xz_file(const char *path, size_t *len) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "xz -dc '%s'", path);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 20, n = 0;
    uint8_t *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n, p)) > 0) {
        n += k;
        if (n == cap) {
            uint8_t *b2 = realloc(buf, cap *= 2);
            if (!b2) free(buf);
            buf = b2;
        }
    }
    if (pclose(p) != 0 || !n) {
        fprintf(stderr, "%s: xz -dc failed (is xz installed?)\n", path);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

#define MINI "tests/data/gpu_h200/mini-16x64-sdpa.pickle.xz"

/* The traced config: the file's model as engine: pytorch plans it, batch x seq. */
static void traced_config(tk_config *c, int batch, int seq) {
    tk_config_defaults(c);
    tk_err e = {0};
    const char *kv[][2] = {{"engine", "pytorch"}, {"init", "random"},       {"hidden", "256"},
                           {"layers", "4"},       {"heads", "4"},           {"intermediate", "1024"},
                           {"vocab_size", "4000"}, {"gpu", "t4"}};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
        TK_CHECK_MSG(tk_config_set(c, kv[i][0], kv[i][1], &e) == TK_OK, "%s: %s", kv[i][0], e.msg);
    c->batch_size = batch, c->max_len = seq;
    TK_CHECK_MSG(tk_config_validate(c, &e) == TK_OK, "%s", e.msg);
}

/* The mini file planned with the stand-in as the traced model of batch x seq. */
static tk_snapshot *planned(stand_in *t, int batch, int seq, char **text, json_t **js) {
    size_t len = 0;
    uint8_t *buf = xz_file(MINI, &len);
    TK_CHECK(buf != NULL);
    if (!buf) return NULL;
    tk_err e = {0};
    tk_snapshot *s = tk_snap_read_buf(buf, len, MINI, 0, &e);
    free(buf);
    TK_CHECK_MSG(s != NULL, "%s", e.msg);
    if (!s) return NULL;
    tk_config c;
    traced_config(&c, batch, seq);
    tk_snap_opts o = {.plan_fn = plan_by, .plan_ctx = t, .traced = &c, .traced_label = "mini (BertForSequenceClassification)"};
    TK_CHECK_MSG(tk_snap_plan(s, &o, &e) == 0, "%s", e.msg);
    *text = tk_snap_text(s, 10);
    *js = tk_snap_json(s, 10);
    return s;
}

static void test_its_own_step_is_planned_by_the_traced_model(void) {
    stand_in t = {0};
    char *text = NULL;
    json_t *js = NULL;
    tk_snapshot *s = planned(&t, 16, 64, &text, &js);
    if (!s) return;
    const tk_snap_model *m = &s->model;
    TK_CHECK_EQ_INT(m->batch, 16);
    TK_CHECK_EQ_INT(m->seq, 64);
    TK_CHECK(t.calls >= 1 && t.batch == 16 && t.seq == 64);
    /* the card the file's workspaces show, not the t4 the model was planned on */
    TK_CHECK_MSG(!strcmp(t.gpu, "h100-80"), "%s", t.gpu);
    TK_CHECK_MSG(m->planned && strstr(m->engine_label, "traced mini (BertForSequenceClassification)"), "%s / %s",
                 m->engine_label, m->plan_note);
    TK_CHECK_MSG(!m->traced_note[0], "%s", m->traced_note);
    TK_CHECK_MSG(strstr(text, "Planned by tracing mini (BertForSequenceClassification): the run as it ran and each fix"),
                 "%s", text);
    const char *by = json_string_value(json_object_get(js, "planned_by"));
    TK_CHECK(by && !strncmp(by, "Planned by tracing mini (BertForSequenceClassification)", 55));
    TK_CHECK(!json_object_get(js, "traced_note"));
    free(text);
    json_decref(js);
    tk_snap_destroy(&s);
}

static void test_another_step_says_which_figures_differ(void) {
    stand_in t = {0};
    char *text = NULL;
    json_t *js = NULL;
    tk_snapshot *s = planned(&t, 8, 128, &text, &js);
    if (!s) return;
    const tk_snap_model *m = &s->model;
    TK_CHECK_EQ_INT(t.calls, 0);
    TK_CHECK_MSG(strstr(m->traced_note, "Not planned by tracing mini (BertForSequenceClassification): the snapshot's "
                                        "step is not the traced one: batch 16 here, 8 traced; length 64 here, 128 traced"),
                 "%s", m->traced_note);
    TK_CHECK(!strchr(m->traced_note, '\n'));
    /* today's plan: the BERT the blocks show, on engine: pytorch */
    TK_CHECK_MSG(m->planned && !strstr(m->engine_label, "traced") && strstr(m->engine_label, "engine: pytorch"), "%s",
                 m->engine_label);
    TK_CHECK(!m->planned_by[0] && !json_object_get(js, "planned_by"));
    TK_CHECK(strstr(text, m->traced_note) != NULL);
    TK_CHECK(json_string_value(json_object_get(js, "traced_note")) != NULL);
    free(text);
    json_decref(js);
    tk_snap_destroy(&s);
    /* only the length differs: only it is named */
    stand_in t2 = {0};
    s = planned(&t2, 16, 128, &text, &js);
    if (!s) return;
    TK_CHECK_MSG(strstr(s->model.traced_note, "traced one: length 64 here, 128 traced") &&
                 !strstr(s->model.traced_note, "batch 16"), "%s", s->model.traced_note);
    free(text);
    json_decref(js);
    tk_snap_destroy(&s);
}

static void test_a_refusal_keeps_todays_plan(void) {
    stand_in t = {.refuse = 1};
    char *text = NULL;
    json_t *js = NULL;
    tk_snapshot *s = planned(&t, 16, 64, &text, &js);
    if (!s) return;
    const tk_snap_model *m = &s->model;
    TK_CHECK_EQ_INT(t.calls, 1);
    TK_CHECK_MSG(strstr(m->traced_note, "Not planned by tracing mini (BertForSequenceClassification): mini "
                                        "(BertForSequenceClassification): not traced: the stand-in refuses"),
                 "%s", m->traced_note);
    TK_CHECK(m->planned && !strstr(m->engine_label, "traced") && !m->planned_by[0]);
    free(text);
    json_decref(js);
    tk_snap_destroy(&s);
}

static void test_no_shape_to_match(void) {
    /* a decoder served by FlexGen: no BERT's blocks, so no batch and length */
    tk_err e = {0};
    tk_snapshot *s = tk_snap_read("tests/data/pytorch_snapshots/llm_oom.pickle", 0, &e);
    TK_CHECK_MSG(s != NULL, "%s", e.msg);
    if (!s) return;
    stand_in t = {0};
    tk_config c;
    traced_config(&c, 16, 64);
    tk_snap_opts o = {.plan_fn = plan_by, .plan_ctx = &t, .traced = &c, .traced_label = "mini (BertForSequenceClassification)"};
    TK_CHECK_MSG(tk_snap_plan(s, &o, &e) == 0, "%s", e.msg);
    TK_CHECK_EQ_INT(t.calls, 0);
    TK_CHECK_MSG(strstr(s->model.traced_note, "the snapshot's batch and length cannot be read"), "%s",
                 s->model.traced_note);
    tk_snap_destroy(&s);
}

/* A PyTorch snapshot (its JSON form) at an OOM, as
 * tests/advisor/test_snapshot_bert.py builds one: BERT-mini (hidden 256, 4
 * layers, intermediate 1024, vocab 4000, 512 positions, a 2-label head) in
 * fp32 with AdamW's two states (the gradients set to None), the forward's
 * kept activations of 6 x 128 (4 heads) for every layer, each tensor its own
 * block and segment, then a request for one more score block with 1 MiB
 * free on the device. 6 x 128: no activation of the size of a weight (at
 * 16 x 64 a B x T x H block is an H x I weight's size). The bytes: new,
 * free(). */
static char *oom_snapshot_json(void) {
    enum { H = 256, L = 4, I = 1024, V = 4000, P = 512, A = 4, B = 6, T = 128 };
    size_t sizes[4 * (9 + 16 * L) + 10 * L], n = 0;
    for (int copy = 0; copy < 3; copy++) {
        size_t emb[] = {(size_t)V * H, (size_t)P * H, 2 * H, H, H};
        for (size_t i = 0; i < 5; i++) sizes[n++] = emb[i] * 4;
        for (int l = 0; l < L; l++) {
            for (int k = 0; k < 4; k++) sizes[n++] = H * H * 4, sizes[n++] = H * 4;
            size_t rest[] = {H, H, (size_t)I * H, I, (size_t)H * I, H, H, H};
            for (size_t i = 0; i < 8; i++) sizes[n++] = rest[i] * 4;
        }
        sizes[n++] = H * H * 4, sizes[n++] = H * 4, sizes[n++] = 2 * H * 4, sizes[n++] = 2 * 4;
    }
    for (int l = 0; l < L; l++) {
        size_t acts[] = {B * T * H, B * T * H, B * T * H, B * T * H, B * T * H, B * T * H, B * T * I, B * T * I,
                         (size_t)B * A * T * T, (size_t)B * A * T * T};
        for (size_t i = 0; i < 10; i++) sizes[n++] = acts[i] * 4;
    }
    json_t *segs = json_array();
    json_int_t addr = (json_int_t)1 << 40;
    for (size_t i = 0; i < n; i++) {
        json_int_t size = (json_int_t)((sizes[i] + 511) / 512 * 512);
        json_t *blk = json_pack("{s:I, s:I, s:I, s:s, s:[]}", "address", addr, "size", size, "requested_size",
                                (json_int_t)sizes[i], "state", "active_allocated", "frames");
        json_array_append_new(segs, json_pack("{s:i, s:I, s:I, s:I, s:I, s:I, s:i, s:s, s:[o]}", "device", 0, "address",
                                              addr, "total_size", size, "allocated_size", size, "active_size", size,
                                              "requested_size", (json_int_t)sizes[i], "stream", 0, "segment_type",
                                              size > (json_int_t)MiB ? "large" : "small", "blocks", blk));
        addr += size;
    }
    json_t *oom = json_pack("{s:s, s:i, s:I, s:i, s:i, s:I, s:[]}", "action", "oom", "addr", 0, "size",
                            (json_int_t)B * A * T * T * 4, "stream", 0, "time_us", 1, "device_free", (json_int_t)MiB,
                            "frames");
    json_t *root = json_pack("{s:o, s:[[o]]}", "segments", segs, "device_traces", oom);
    char *text = json_dumps(root, 0);
    json_decref(root);
    return text;
}

static void test_fixes_at_an_oom_are_planned_by_the_traced_model(void) {
    char *js = oom_snapshot_json();
    TK_CHECK(js != NULL);
    if (!js) return;
    tk_err e = {0};
    tk_snapshot *s = tk_snap_read_buf((const uint8_t *)js, strlen(js), "bert-mini-oom.json", 0, &e);
    free(js);
    TK_CHECK_MSG(s != NULL, "%s", e.msg);
    if (!s) return;
    stand_in t = {0};
    tk_config c;
    traced_config(&c, 6, 128);
    c.api = TK_API_TRAINER; /* a Trainer's model: the fixes' code is TrainingArguments lines */
    tk_snap_opts o = {.plan_fn = plan_by, .plan_ctx = &t, .traced = &c, .traced_label = "mini (BertForSequenceClassification)",
                      .describe = describe};
    TK_CHECK_MSG(tk_snap_plan(s, &o, &e) == 0, "%s", e.msg);
    const tk_snap_model *m = &s->model;
    TK_CHECK_MSG(m->recognised && m->batch == 6 && m->seq == 128, "%d x %d (%s)", m->batch, m->seq, m->why);
    TK_CHECK_MSG(m->planned && m->planned_by[0] && !m->traced_note[0], "%s / %s / %s", m->plan_note, m->traced_note,
                 m->engine_label);
    /* held to the file's capacity (reserved + free at its OOM), not the t4's */
    TK_CHECK_EQ_INT(m->plan_capacity, s->reserved + s->oom_device_free);
    TK_CHECK_STR(m->capacity_from, "reserved + device free at the OOM");
    TK_CHECK(!m->plan_fits);
    int fixes = 0;
    for (int i = 0; i < s->n_fixes; i++) {
        const tk_fix_note *f = &s->fixes[i];
        if (!f->planned) continue;
        fixes++;
        /* the planner saw that fix's own config */
        int seen = 0;
        for (int k = 1; k < t.calls && k < 8; k++) {
            if (!strcmp(f->id, "precision")) seen |= t.seen[k].precision == TK_PREC_FP16;
            if (!strcmp(f->id, "checkpointing")) seen |= t.seen[k].recompute;
            if (!strcmp(f->id, "batch")) seen |= t.seen[k].batch == 3 && t.seen[k].accumulate == 2;
        }
        TK_CHECK_MSG(seen, "fix %s: no planned config of its change", f->id);
        if (!strcmp(f->id, "checkpointing")) TK_CHECK_MSG(strstr(f->code, "gradient_checkpointing=True)"), "%s", f->code);
        if (!strcmp(f->id, "precision")) TK_CHECK_MSG(strstr(f->code, "fp16=True)"), "%s", f->code);
        if (!strcmp(f->id, "batch"))
            TK_CHECK_MSG(strstr(f->code, "per_device_train_batch_size=3, gradient_accumulation_steps=2"), "%s", f->code);
    }
    TK_CHECK_MSG(fixes >= 2 && t.calls == 1 + fixes, "%d fixes planned, %d calls", fixes, t.calls);
    /* the planner's own account, asked once every plan was made */
    char want[64];
    snprintf(want, sizeof want, "Planned by the stand-in: %d plans.", t.calls);
    TK_CHECK_STR(m->planned_by, want);
    tk_snap_destroy(&s);
}

int main(void) {
    TK_RUN(test_its_own_step_is_planned_by_the_traced_model);
    TK_RUN(test_another_step_says_which_figures_differ);
    TK_RUN(test_a_refusal_keeps_todays_plan);
    TK_RUN(test_no_shape_to_match);
    TK_RUN(test_fixes_at_an_oom_are_planned_by_the_traced_model);
    return tk_test_done();
}
