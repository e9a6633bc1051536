/* test_torchplan.c — engine: pytorch's choices, errors and host-memory
 * failures (issue 26). Its numbers are checked against PyTorch itself in
 * tests/torchplan/test_torchplan_grid.py; here: which kernel and optimizer
 * each device gets, what the techniques do to the peak, that options it
 * does not model are errors naming their key, and that every host
 * allocation may fail (TK_ENOMEM, nothing leaked: this binary runs under
 * ASan) without changing a plan that succeeds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_config.h"
#include "tk_host_mem.h"
#include "tk_test.h"
#include "tk_torchplan.h"

static tk_config tiny(const char *extra) {
    tk_config c;
    tk_err err = {0};
    tk_config_defaults(&c);
    const char *base = "engine: pytorch\nmodel: bert-tiny\ninit: random\nvocab_size: 1000\nnum_labels: 2\n";
    char y[1024];
    snprintf(y, sizeof y, "%s%s%s%s", base, strstr(extra, "batch_size:") ? "" : "batch_size: 4\n",
             strstr(extra, "max_len:") ? "" : "max_len: 128\n", extra);
    TK_CHECK_MSG(tk_config_parse_yaml(&c, y, strlen(y), "test", &err) == TK_OK, "%s", err.msg);
    return c;
}

static tk_torchplan_result plan(const char *extra) {
    tk_config c = tiny(extra);
    tk_torchplan_result r;
    tk_err err = {0};
    TK_CHECK_MSG(tk_torchplan(&c, &r, &err) == TK_OK, "%s: %s", extra, err.msg);
    return r;
}

static void test_kernels_per_device(void) {
    tk_torchplan_result r = plan("attention_dropout: 0\n");
    TK_CHECK_STR(r.attention, "sdpa (cpu flash)");
    TK_CHECK_STR(r.optimizer, "AdamW (single-tensor)");
    TK_CHECK_STR(r.device, "cpu");
    TK_CHECK(r.context_bytes == 0 && r.workspace_bytes == 0 && r.device_used == r.peak_reserved);
    r = plan("");
    TK_CHECK(strstr(r.attention, "sdpa (math") == r.attention);
    r = plan("gpu: t4\n");
    TK_CHECK_STR(r.attention, "sdpa (efficient)");
    TK_CHECK_STR(r.optimizer, "AdamW (foreach)");
    TK_CHECK(r.workspace_bytes > 0 && r.context_bytes > 0);
    TK_CHECK(r.device_used == r.peak_reserved + r.context_bytes + r.outside_bytes);
    r = plan("gpu: a100-40\nprecision: bf16\n");
    TK_CHECK_STR(r.attention, "sdpa (flash)");
    r = plan("gpu: t4\ntorch_version: 1.13\n");
    TK_CHECK(strstr(r.attention, "eager") == r.attention);
    TK_CHECK_STR(r.optimizer, "AdamW (single-tensor)");
    TK_CHECK_STR(r.torch_version, "1.13");
    TK_CHECK_STR(r.transformers_version, "4.40");
    r = plan("gpu: v100-16\ntorch_version: 1.10\n");
    TK_CHECK(strstr(r.attention, "eager") == r.attention);
    TK_CHECK(strstr(r.optimizer, "transformers' own") != NULL);
    TK_CHECK_STR(r.torch_version, "1.10");
    TK_CHECK_STR(r.transformers_version, "4.15");
    r = plan("gpu: t4\noptimizer: adamw8bit\n");
    TK_CHECK_STR(r.optimizer, "AdamW8bit (bitsandbytes)");
}

static void test_techniques_move_the_peak(void) {
    /* long sequences: the activations make the peak */
    tk_torchplan_result eager = plan("max_len: 512\nattn_implementation: eager\n");
    tk_torchplan_result sdpa = plan("max_len: 512\nattention_dropout: 0\n");
    tk_torchplan_result ckpt = plan("max_len: 512\nattn_implementation: eager\nrecompute: layers\n");
    TK_CHECK(sdpa.peak_allocated < eager.peak_allocated);
    TK_CHECK(ckpt.peak_allocated < eager.peak_allocated);
    tk_torchplan_result acc = plan("max_len: 512\nattn_implementation: eager\nbatch_size: 1\naccumulate: 4\n");
    TK_CHECK(acc.peak_allocated < eager.peak_allocated);
    /* the steady step starts with the moments live: never under the first */
    TK_CHECK(eager.peak_allocated >= eager.first_step_peak_allocated);
    tk_torchplan_result frozen = plan("max_len: 512\nattn_implementation: eager\nfreeze: embeddings\n");
    TK_CHECK(frozen.n_trainable < frozen.n_params);
    TK_CHECK(frozen.optim_bytes < eager.optim_bytes);
    tk_torchplan_result a8 = plan("gpu: t4\noptimizer: adamw8bit\n"), a32 = plan("gpu: t4\n");
    TK_CHECK(a8.optim_bytes < a32.optim_bytes / 2);
}

static void test_unmodelled_options_are_errors(void) {
    static const struct { const char *yaml, *key; } BAD[] = {
        {"head: flatten_dense\n", "head: flatten_dense"},
        {"freeze: layers:1\n", "freeze_layers"},
        {"recompute: attention\n", "recompute: attention"},
        {"precision: fp16\n", "precision: fp16"},
        {"optimizer: adamw8bit\n", "optimizer: adamw8bit"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        tk_config c = tiny(BAD[i].yaml);
        tk_torchplan_result r;
        tk_err err = {0};
        TK_CHECK_EQ_INT(tk_torchplan(&c, &r, &err), TK_EINVAL);
        TK_CHECK_MSG(strstr(err.msg, BAD[i].key) == err.msg, "%s: %s", BAD[i].yaml, err.msg);
    }
}

static void test_json_names_the_engine(void) {
    tk_torchplan_result r = plan("gpu: t4\n");
    json_t *j = tk_torchplan_json(&r);
    TK_CHECK(j != NULL);
    TK_CHECK_STR(json_string_value(json_object_get(j, "engine")), "pytorch");
    TK_CHECK_STR(json_string_value(json_object_get(j, "torch_version")), "2.x");
    TK_CHECK(json_integer_value(json_object_get(j, "device_used")) == (json_int_t)r.device_used);
    TK_CHECK(json_integer_value(json_object_get(j, "peak_allocated")) == (json_int_t)r.peak_allocated);
    json_decref(j);
}

/* Each host allocation of a plan fails in turn (the first 200, then a
 * stride): the plan is TK_ENOMEM saying so, or the same plan. */
/* Where each torch version keeps cuBLAS's and cuBLASLt's workspaces, on every
 * architecture the profiles name (and sm86, which none does), as each
 * release's source gives them (torchplan/blas_rules.c cites the lines):
 *  - 1.10, 1.13: cuBLAS's own pool, outside the allocator (no
 *    cublasSetWorkspace in CublasHandlePool.cpp), `:4096:2:16:8`;
 *    cuBLASLt 1 MiB per biased addmm from 1.12 (#73439);
 *  - 2.0 .. 2.11: `sm90 ? 4096 * 8 * 1024 : 4096 * 1024 * 2 + 16 * 1024 * 8`
 *    (CublasHandlePool.cpp@26a3905:150), kept per handle and stream; cuBLASLt
 *    1 MiB per call until 2.8, kept per handle from 2.9 (#156495);
 *  - 2.12, 2.13: 32 MiB on majors 9, 10, 12 (CublasHandlePool.cpp@f414718:181),
 *    cuBLASLt in it (l.347-349); 2.14: majors 9-12 (#189312);
 *  - 2.15: a workspace per GEMM (#194311), cuBLASLt's kept per handle. */
static void test_blas_rules_per_version_and_arch(void) {
    static const int arch[][2] = {{3, 7}, {6, 0}, {6, 1}, {7, 0}, {7, 5}, {8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}, {12, 0}};
    const size_t small = 8519680, big = (size_t)32 << 20;
    for (int v = 0; v < TK_TORCH_N_VERSIONS; v++) {
        int minor = tk_torch_minor((tk_torch_version)v);
        for (size_t a = 0; a < sizeof arch / sizeof arch[0]; a++) {
            int M = arch[a][0], m = arch[a][1];
            tk_torch_blas b;
            tk_torch_blas_rules((tk_torch_version)v, M, m, &b);
            size_t want_w = minor < 0    ? small
                          : minor >= 14  ? (M >= 9 && M <= 12 ? big : small)
                          : minor >= 12  ? (M == 9 || M == 10 || M == 12 ? big : small)
                                         : (M == 9 && m == 0 ? big : small);
            tk_blas_w_where want_where = minor < 0 ? TK_BLAS_W_OUTSIDE : minor >= 15 ? TK_BLAS_W_PER_OP : TK_BLAS_W_KEPT;
            tk_blas_lt_mode want_lt = v == TK_TORCH_1_10 ? TK_BLAS_LT_NONE
                                    : v == TK_TORCH_1_13 ? TK_BLAS_LT_PER_CALL
                                    : minor >= 15        ? TK_BLAS_LT_KEPT
                                    : minor >= 12        ? TK_BLAS_LT_SHARED
                                    : minor >= 9         ? TK_BLAS_LT_KEPT
                                                         : TK_BLAS_LT_PER_CALL;
            TK_CHECK_MSG(b.w_bytes == want_w && b.where == want_where && b.lt == want_lt && b.lt_bytes == (size_t)1 << 20,
                         "torch_version %d, sm%d%d: W %zu where %d lt %d", v, M, m, b.w_bytes, (int)b.where, (int)b.lt);
            TK_CHECK(b.source && b.source[0]);
        }
    }
}

/* The plan holds them as the rules say, per profile: two Ws kept (the
 * forward's thread and autograd's) from 2.0 to 2.14, none kept in 2.15 (per
 * GEMM) nor in 1.x (outside the allocator, counted in device_used); one
 * cuBLASLt block kept where the version keeps it (the forward's biased
 * Linears; backward's GEMMs are plain cuBLAS). */
static void test_plan_holds_the_workspaces(void) {
    static const char *const cards[] = {"p100", "v100-16", "t4", "a100-40", "l4", "h100-80", "rtx-pro-6000"};
    static const char *const versions[] = {"1.13", "2.0", "2.9", "2.11", "2.12", "2.15", "2"};
    for (size_t i = 0; i < sizeof cards / sizeof cards[0]; i++) {
        const tk_gpu_profile *p = tk_gpu_profile_find(cards[i]);
        for (size_t k = 0; k < sizeof versions / sizeof versions[0]; k++) {
            char y[128];
            snprintf(y, sizeof y, "gpu: %s\ntorch_version: %s\nattn_implementation: eager\n", cards[i], versions[k]);
            tk_config c = tiny(y);
            tk_torch_blas b;
            tk_torch_blas_rules(c.torch_version, p->cc_major, p->cc_minor, &b);
            tk_torchplan_result r = plan(y);
            TK_CHECK_MSG(r.workspace_bytes == b.w_bytes, "%s", y);
            int want_n = b.where == TK_BLAS_W_KEPT ? 2 : 0;
            TK_CHECK_MSG(r.n_workspaces == want_n, "%s: %d kept", y, r.n_workspaces);
            TK_CHECK_MSG(r.lt_workspace_bytes == (b.lt == TK_BLAS_LT_KEPT ? b.lt_bytes : 0), "%s", y);
            TK_CHECK_MSG(r.outside_bytes == (b.where == TK_BLAS_W_OUTSIDE ? 2 * b.w_bytes : 0), "%s", y);
            TK_CHECK(r.device_used == r.peak_reserved + r.context_bytes + r.outside_bytes);
            if (b.where == TK_BLAS_W_KEPT)
                TK_CHECK_MSG(r.by_cat_at_peak[TK_CAT_WORKSPACE] >= 2 * b.w_bytes, "%s", y);
        }
    }
    /* 2.15's per-GEMM workspace is live while its GEMM runs: 2.14 keeps two
     * (and no cuBLASLt block), 2.15 keeps none (and cuBLASLt's 1 MiB), and
     * its peak, reached inside a GEMM, holds one */
    tk_torchplan_result kept = plan("gpu: h100-80\ntorch_version: 2.14\n");
    tk_torchplan_result per_op = plan("gpu: h100-80\ntorch_version: 2.15\n");
    TK_CHECK_EQ_INT(kept.peak_allocated - per_op.peak_allocated, kept.workspace_bytes - per_op.lt_workspace_bytes);
}

static void test_host_chaos(void) {
    tk_config c = tiny("recompute: layers\nprecision: bf16\n");
    tk_torchplan_result want, got;
    tk_err err = {0};
    tk_host_chaos_arm(0);
    TK_CHECK_EQ_INT(tk_torchplan(&c, &want, &err), TK_OK);
    uint64_t calls = tk_host_chaos_calls();
    TK_CHECK(calls > 10);
    int nomem = 0, same = 0;
    for (uint64_t k = 1; k <= calls; k += k < 200 ? 1 : calls / 50 + 1) {
        memset(&err, 0, sizeof err);
        tk_host_chaos_arm(k);
        tk_status st = tk_torchplan(&c, &got, &err);
        int fired = tk_host_chaos_fired();
        tk_host_chaos_arm(0);
        if (st == TK_OK && got.peak_allocated == want.peak_allocated && got.peak_reserved == want.peak_reserved) {
            same++;
        } else {
            TK_CHECK_MSG(fired && st == TK_ENOMEM && strstr(err.msg, "out of host memory"),
                         "allocation %llu: %s: %s", (unsigned long long)k, tk_status_name(st), err.msg);
            nomem++;
        }
    }
    TK_CHECK(nomem > 0);
}

int main(void) {
    TK_RUN(test_kernels_per_device);
    TK_RUN(test_techniques_move_the_peak);
    TK_RUN(test_unmodelled_options_are_errors);
    TK_RUN(test_json_names_the_engine);
    TK_RUN(test_blas_rules_per_version_and_arch);
    TK_RUN(test_plan_holds_the_workspaces);
    TK_RUN(test_host_chaos);
    return tk_test_done();
}
