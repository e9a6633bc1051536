/* test_torchtrace.c — the traced plan's replay (torchplan/torchtrace.c,
 * issue 41) on a small hand-made trace: on the cpu the peaks are the live
 * sum of the rounded storages, step by step; on a card the dropout's noise
 * becomes its 1-byte mask, the attention's own CPU buffers go, q, k, v and
 * the output are held to its backward and the output's copy is a view, the
 * workspaces and context are added; bad events are errors naming the
 * event; every host allocation may fail (ASan, TK_HOST_CHAOS). The figures
 * for real models are held against PyTorch in test_torchtrace.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_host_mem.h"
#include "tk_test.h"
#include "tk_torchtrace.h"

#define MiB (1 << 20)

/* One step of the hand-made model: ids step*100 + n, its dropout op 2 step, its attention 2 step + 1
 * (the tracer makes an op per call). */
static void step_events(json_t *ev, int step) {
    int o = step * 100, p = 2 * step;
#define A(id, bytes, cat, owner, op) \
    json_array_append_new(ev, json_pack("[s, i, i, s, i, i]", "a", o + (id), bytes, cat, owner, (op) < 0 ? -1 : p + (op)))
#define F(id) json_array_append_new(ev, json_pack("[s, i]", "f", o + (id)))
#define OP(op, ph) json_array_append_new(ev, json_pack("[s, i, s]", "op", p + (op), ph))
#define G(bwd, bias) json_array_append_new(ev, json_pack("[s, i, i]", "g", bwd, bias))
    json_array_append_new(ev, json_pack("[s, i]", "s", step));
    A(1, 8192, "input", 0, -1);
    A(2, 4 * MiB, "act", 1, -1);       /* x = linear(ids) */
    G(0, 1);
    A(3, 4 * MiB, "act", 2, 0);        /* the CPU's dropout noise */
    A(4, 4, "act", 2, 0);              /* and its scalar */
    F(4);
    A(5, 4 * MiB, "act", 2, -1);       /* dropout's output */
    OP(0, "fwd");
    A(6, 256 * 1024, "act", 3, -1);    /* q, k, v */
    A(7, 256 * 1024, "act", 3, -1);
    A(8, 256 * 1024, "act", 3, -1);
    A(9, MiB, "act", 3, 1);            /* the math path's scores, kept */
    A(10, 256 * 1024, "act", 3, -1);   /* the attention output */
    OP(1, "fwd");
    F(6), F(7), F(8);                  /* the CPU's math path kept copies, not q, k, v */
    A(11, 256 * 1024, "act", 3, -1);   /* the output's contiguous copy */
    F(10);
    OP(1, "bwd");
    A(12, MiB, "temp", 3, 1);          /* the math path's backward buffer */
    A(13, 256 * 1024, "temp", 3, -1);  /* the gradient it hands on */
    F(12);
    G(1, 0);
    OP(1, "bwd_end");
    F(11), F(9), F(13), F(3);
    F(5), F(2), F(1);
#undef A
#undef F
#undef OP
#undef G
}

static json_t *trace_new(void) {
    json_t *ev = json_array();
    json_t *t = json_pack("{s:s, s:i, s:i, s:s, s:s, s:s, s:i, s:I, s:I, s:[s, s, s, s], s:o}", "model", "Toy", "batch", 2,
                          "seq", 128, "precision", "fp32", "optimizer", "adamw", "loss", "ce", "steps", 2, "n_params",
                          (json_int_t)MiB, "n_trainable", (json_int_t)MiB, "owners", "", "enc", "enc.drop", "enc.attn",
                          "events", ev);
    json_array_append_new(ev, json_pack("[s, i, i, s, i, i]", "a", 0, 4 * MiB, "param", 1, -1));
    step_events(ev, 0);
    step_events(ev, 1);
    json_array_append_new(ev, json_pack("[s, i]", "s", 2));
    json_t *ops = json_array();
    for (int o = 0; o <= 100; o += 100) {
        json_array_append_new(ops, json_pack("{s:s, s:[i, i], s:s, s:f, s:s}", "kind", "dropout", "shape", 1024, 1024,
                                             "dtype", "float32", "p", 0.1, "module", "enc.drop"));
        json_array_append_new(ops, json_pack("{s:s, s:[i, i, i, i], s:[i, i, i, i], s:s, s:f, s:b, s:[], s:b, s:s, "
                                             "s:[i, i, i, i], s:[i]}", "kind", "sdpa", "shape", 2, 4, 128, 64, "kv", 2, 4,
                                             128, 64, "dtype", "float32", "p", 0.0, "mask", 0, "mask_shape", "causal", 0,
                                             "module", "enc.attn", "keep", o + 6, o + 7, o + 8, o + 10, "copies", o + 11));
    }
    json_object_set_new(t, "ops", ops);
    return t;
}

/* The live sum of the rounded storages, per step, as the trace has it. */
static void expected_cpu(const json_t *t, size_t *first, size_t *steady) {
    size_t live[300] = {0}, cur = 0, peak[3] = {0};
    int step = -1;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(t, "events"), i, e) {
        const char *k = json_string_value(json_array_get(e, 0));
        int id = (int)json_integer_value(json_array_get(e, 1));
        if (!strcmp(k, "s")) {
            step = id;
            if (step < 3) peak[step] = cur;
        } else if (!strcmp(k, "a")) {
            size_t b = (size_t)json_integer_value(json_array_get(e, 2));
            live[id] = b < 512 ? 512 : (b + 511) / 512 * 512;
            cur += live[id];
            if (step >= 0 && step < 3 && cur > peak[step]) peak[step] = cur;
        } else if (!strcmp(k, "f")) {
            cur -= live[id];
            live[id] = 0;
        }
    }
    *first = peak[0], *steady = peak[1];
}

static void test_cpu_is_the_trace(void) {
    json_t *t = trace_new();
    tk_torchtrace_result r;
    tk_err err = {0};
    TK_CHECK_MSG(tk_torchtrace_plan(t, NULL, TK_TORCH_2, &r, &err) == TK_OK, "%s", err.msg);
    size_t first, steady;
    expected_cpu(t, &first, &steady);
    TK_CHECK_EQ_INT(r.plan.peak_allocated, steady);
    TK_CHECK_EQ_INT(r.plan.first_step_peak_allocated, first);
    TK_CHECK_STR(r.plan.device, "cpu");
    TK_CHECK(r.plan.context_bytes == 0 && r.plan.device_used == r.plan.peak_reserved);
    TK_CHECK(r.n_sdpa == 2 && r.n_dropout == 2); /* one per call: two steps */
    TK_CHECK_STR(r.model, "Toy");
    TK_CHECK_STR(r.loss, "cross-entropy");
    /* the largest storages at the steady peak, largest first, with their module */
    TK_CHECK(r.n_largest > 0 && r.largest[0].bytes == 4 * MiB);
    for (int i = 1; i < r.n_largest; i++) TK_CHECK(r.largest[i - 1].bytes >= r.largest[i].bytes);
    TK_CHECK(r.n_modules > 0 && r.modules[0].bytes >= r.modules[r.n_modules - 1].bytes);
    json_t *j = tk_torchtrace_json(&r);
    TK_CHECK(j && json_is_true(json_object_get(j, "traced")) && json_array_size(json_object_get(j, "by_module")) > 0);
    json_decref(j);
    json_decref(t);
}

static void test_card_sizes_its_own_kernels(void) {
    json_t *t = trace_new();
    tk_torchtrace_result cpu, r;
    tk_err err = {0};
    TK_CHECK(tk_torchtrace_plan(t, NULL, TK_TORCH_2, &cpu, &err) == TK_OK);
    TK_CHECK_MSG(tk_torchtrace_plan(t, "t4", TK_TORCH_2_MINOR(11), &r, &err) == TK_OK, "%s", err.msg);
    TK_CHECK_STR(r.plan.attention, "sdpa (efficient)");
    TK_CHECK_STR(r.plan.device, "cuda");
    TK_CHECK_STR(r.plan.gpu, "t4");
    /* 2.11 keeps a W per thread that ran a GEMM and a cuBLASLt block for the biased forward GEMM */
    TK_CHECK_EQ_INT(r.plan.n_workspaces, 2);
    TK_CHECK_EQ_INT(r.plan.lt_workspace_bytes, MiB);
    TK_CHECK(r.plan.context_bytes > 0);
    TK_CHECK_EQ_INT(r.plan.device_used, r.plan.peak_reserved + r.plan.context_bytes + r.plan.outside_bytes);
    /* both peaks are in the attention's backward: on the card the noise's 4 MiB is a 1 MiB mask, the
     * math path's 1 MiB scores and 1 MiB backward buffer are gone, q, k, v are held (+768 KiB) with
     * the efficient kernel's logsumexp (4 KiB: 2 x 4 heads x 128 rows, fp32), and the output's copy is
     * a view of the output it keeps */
    size_t ws = r.plan.by_cat_at_peak[TK_CAT_WORKSPACE];
    TK_CHECK_EQ_INT(ws, 2 * (8 * MiB + 128 * 1024) + MiB);
    TK_CHECK_EQ_INT(r.plan.peak_allocated - ws, cpu.plan.peak_allocated - 3 * MiB - 2 * MiB + 3 * 256 * 1024 + 4096);
    json_decref(t);
}

static void test_bad_traces_are_errors(void) {
    tk_torchtrace_result r;
    tk_err err = {0};
    json_t *t = trace_new();
    TK_CHECK(tk_torchtrace_plan(t, "t5", TK_TORCH_2, &r, &err) == TK_EINVAL && strstr(err.msg, "'t5'"));
    json_array_append_new(json_object_get(t, "events"), json_pack("[s, i]", "f", 999));
    memset(&err, 0, sizeof err);
    TK_CHECK(tk_torchtrace_plan(t, NULL, TK_TORCH_2, &r, &err) == TK_EINVAL && strstr(err.msg, "event "));
    json_decref(t);
    t = json_pack("{s:[], s:[], s:[], s:i}", "events", "ops", "owners", "steps", 1);
    memset(&err, 0, sizeof err);
    TK_CHECK(tk_torchtrace_plan(t, NULL, TK_TORCH_2, &r, &err) == TK_EINVAL && strstr(err.msg, "steps"));
    json_decref(t);
    t = json_pack("{s:i}", "events", 3);
    memset(&err, 0, sizeof err);
    TK_CHECK(tk_torchtrace_plan(t, NULL, TK_TORCH_2, &r, &err) == TK_EINVAL && strstr(err.msg, "\"events\""));
    json_decref(t);
}

static void test_host_chaos(void) {
    json_t *t = trace_new();
    tk_torchtrace_result want, got;
    tk_err err = {0};
    tk_host_chaos_arm(0);
    TK_CHECK(tk_torchtrace_plan(t, "t4", TK_TORCH_2, &want, &err) == TK_OK);
    uint64_t calls = tk_host_chaos_calls();
    TK_CHECK(calls > 5);
    int nomem = 0;
    for (uint64_t k = 1; k <= calls; k++) {
        memset(&err, 0, sizeof err);
        tk_host_chaos_arm(k);
        tk_status st = tk_torchtrace_plan(t, "t4", TK_TORCH_2, &got, &err);
        int fired = tk_host_chaos_fired();
        tk_host_chaos_arm(0);
        if (st == TK_OK && got.plan.peak_allocated == want.plan.peak_allocated) continue;
        TK_CHECK_MSG(fired && st == TK_ENOMEM && strstr(err.msg, "out of host memory"), "allocation %llu: %s: %s",
                     (unsigned long long)k, tk_status_name(st), err.msg);
        nomem++;
    }
    TK_CHECK(nomem > 0);
    json_decref(t);
}

int main(void) {
    TK_RUN(test_cpu_is_the_trace);
    TK_RUN(test_card_sizes_its_own_kernels);
    TK_RUN(test_bad_traces_are_errors);
    TK_RUN(test_host_chaos);
    return tk_test_done();
}
