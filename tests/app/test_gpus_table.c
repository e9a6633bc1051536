/* test_gpus_table.c — the one --gpus table frame (tk_gpus_table,
 * app/report_torchplan.c) that engine: pytorch's plan and the traced plan
 * share: a row per card the planner plans, its label and note, a card left
 * out with its note, the JSON rows under the caller's keys, the planner's
 * error passed on, an unknown platform named; and both reports through it
 * (the traced one leaves the pair out, the C plan splits it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_embed_trace.h"
#include "tk_session.h"
#include "tk_test.h"
#include "tk_torchplan.h"

typedef struct {
    tk_torchplan_result r;
    int calls, fail_at;
    char head_saw[64];
} stand_in;

static tk_status stand_in_card(void *ctx, const tk_gpu_profile *card, tk_gpus_row *row, tk_err *err) {
    stand_in *x = ctx;
    if (++x->calls == x->fail_at) {
        tk_err_set(err, TK_EINVAL, "planning %s failed", card->name);
        return TK_EINVAL;
    }
    if (card->gpus > 1) { /* left out, said */
        snprintf(row->note, sizeof row->note, "%s: left out", card->name);
        return TK_OK;
    }
    memset(&x->r, 0, sizeof x->r);
    x->r.capacity = card->capacity;
    x->r.peak_allocated = 1 << 20, x->r.peak_reserved = 2 << 20, x->r.device_used = 3 << 20;
    x->r.attention = "stand-in";
    row->plan = &x->r;
    row->usable = card->capacity / 2;
    row->fits = 1;
    snprintf(row->label, sizeof row->label, "%s*", card->name);
    row->json = json_pack("{s:s}", "card", card->name);
    return TK_OK;
}

static void stand_in_head(void *ctx, const char *platform, tk_sb *sb) {
    stand_in *x = ctx;
    snprintf(x->head_saw, sizeof x->head_saw, "%d calls", x->calls);
    tk_sb_addf(sb, "stand-in on %s:\n", platform);
}

static void test_the_frame(void) {
    stand_in *x = calloc(1, sizeof *x);
    json_t *b = NULL;
    tk_err e = {0};
    TK_CHECK_MSG(tk_gpus_table("kaggle", stand_in_card, stand_in_head, x, json_pack("{s:s}", "engine", "stand-in"), &b,
                               &e) == TK_OK, "%s", e.msg);
    const char *t = json_string_value(json_object_get(b, "text/plain"));
    TK_CHECK_MSG(t && !strncmp(t, "stand-in on kaggle:\ncard", 24) && strstr(t, "t4*") && strstr(t, "stand-in") &&
                 strstr(t, "t4x2: left out\n") && !strstr(t, "t4x2*"), "%s", t ? t : "(none)");
    TK_CHECK_STR(x->head_saw, "4 calls"); /* the head is written once every card is planned */
    json_t *j = json_object_get(b, "application/json");
    TK_CHECK_STR(json_string_value(json_object_get(j, "engine")), "stand-in");
    TK_CHECK_EQ_INT(json_array_size(json_object_get(j, "cards")), 3);
    TK_CHECK(json_string_value(json_object_get(b, "text/html")) != NULL);
    json_decref(b);
    x->calls = 0, x->fail_at = 3; /* the planner's error is the table's; meta is released (ASan) */
    b = NULL;
    TK_CHECK(tk_gpus_table("kaggle", stand_in_card, stand_in_head, x, json_pack("{s:s}", "engine", "x"), &b, &e) ==
             TK_EINVAL && !b && strstr(e.msg, "planning p100 failed"));
    TK_CHECK(tk_gpus_table("nowhere", stand_in_card, stand_in_head, x, json_object(), &b, &e) == TK_EINVAL &&
             strstr(e.msg, "--gpus nowhere: expected"));
    free(x);
}

static json_t *toy_trace(void) {
    json_t *ev = json_array();
    json_array_append_new(ev, json_pack("[s, i, i, s, i, i]", "a", 0, 4 << 20, "param", 0, -1));
    for (int s = 0; s < 2; s++) {
        json_array_append_new(ev, json_pack("[s, i]", "s", s));
        json_array_append_new(ev, json_pack("[s, i, i, s, i, i]", "a", 10 + s, 64 << 20, "act", 0, -1));
        json_array_append_new(ev, json_pack("[s, i]", "f", 10 + s));
    }
    json_array_append_new(ev, json_pack("[s, i]", "s", 2));
    return json_pack("{s:s, s:i, s:i, s:s, s:s, s:s, s:i, s:i, s:i, s:[s], s:[], s:o}", "model", "Toy", "batch", 2,
                     "seq", 16, "precision", "fp32", "optimizer", "adamw", "loss", "ce", "steps", 2, "n_params", 1 << 20,
                     "n_trainable", 1 << 20, "owners", "", "ops", "events", ev);
}

static void test_both_reports_through_it(void) {
    json_t *tr = toy_trace(), *b = NULL;
    tk_err e = {0};
    TK_CHECK_MSG(tk_torchtrace_gpus_report(tr, TK_TORCH_2, "kaggle", &b, &e) == TK_OK, "%s", e.msg);
    const char *t = json_string_value(json_object_get(b, "text/plain"));
    TK_CHECK_MSG(t && strstr(t, "engine: pytorch, traced — Toy's own training step on each kaggle card") &&
                 strstr(t, "t4x2: the traced step is one GPU's"), "%s", t ? t : "(none)");
    json_t *j = json_object_get(b, "application/json");
    TK_CHECK(json_is_true(json_object_get(j, "traced")) && json_array_size(json_object_get(j, "cards")) == 3);
    json_decref(b);
    json_decref(tr);
    tk_config c;
    tk_config_defaults(&c);
    TK_CHECK(tk_config_set(&c, "engine", "pytorch", &e) == TK_OK && tk_config_set(&c, "max_len", "64", &e) == TK_OK);
    b = NULL;
    TK_CHECK_MSG(tk_torchplan_gpus_report(&c, "kaggle", &b, &e) == TK_OK, "%s", e.msg);
    t = json_string_value(json_object_get(b, "text/plain"));
    TK_CHECK_MSG(t && strstr(t, "engine: pytorch — the step as torch") && strstr(t, "t4x2 (DataParallel)") &&
                 strstr(t, "t4x2: 2 GPUs, DataParallel"), "%s", t ? t : "(none)");
    TK_CHECK_EQ_INT(json_array_size(json_object_get(json_object_get(b, "application/json"), "cards")), 4);
    json_decref(b);
}

int main(void) {
    TK_RUN(test_the_frame);
    TK_RUN(test_both_reports_through_it);
    return tk_test_done();
}
