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
        {"gpu: t4\ntorch_version: 1.13\noptimizer: adamw_torch_fused\n", "optimizer: adamw_torch_fused"},
        {"gpu: t4\nzero: 2\n", "zero: 2"},
        {"world_size: 2\n", "parallel: dataparallel"},
        {"gpu: t4x2\nparallel: zero2\n", "parallel: zero2"},
        {"gpu: t4x2\nparallel: zero2\nprecision: fp16\noptimizer: adamw8bit\n", "optimizer: adamw8bit"},
    };
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        tk_config c = tiny(BAD[i].yaml);
        tk_torchplan_result r;
        tk_err err = {0};
        TK_CHECK_EQ_INT(tk_torchplan(&c, &r, &err), TK_EINVAL);
        TK_CHECK_MSG(strstr(err.msg, BAD[i].key) == err.msg, "%s: %s", BAD[i].yaml, err.msg);
    }
}

/* torch.optim.AdamW(fused=True): the step tensors on the device, no
 * temporaries: on CUDA under foreach, whose _foreach_sqrt list is a
 * parameter-sized temporary (a short batch: the optimizer step makes the
 * first step's peak). */
static void test_fused_adamw(void) {
    tk_torchplan_result foreach = plan("gpu: t4\nbatch_size: 1\nmax_len: 16\n");
    tk_torchplan_result fused = plan("gpu: t4\nbatch_size: 1\nmax_len: 16\noptimizer: adamw_torch_fused\n");
    TK_CHECK_STR(fused.optimizer, "AdamW (fused)");
    TK_CHECK(fused.optim_bytes > foreach.optim_bytes); /* + one 512-byte step tensor per parameter */
    TK_CHECK(fused.first_step_peak_allocated + (size_t)fused.n_trainable * 4 / 2 < foreach.first_step_peak_allocated);
    tk_torchplan_result cpu = plan("optimizer: adamw_torch_fused\n");
    TK_CHECK_STR(cpu.optimizer, "AdamW (fused)");
}

/* batching: dynamic / buckets: the worst batch is the corpus' longest (as
 * txkernel's planner takes it), equal to the fixed plan at that max_len with
 * the same data; without data, max_len, and the plan says so. */
static void test_dynamic_padding(void) {
    static const int len[] = {12, 57, 33, 57, 9};
    tk_config d = tiny("batching: dynamic\n"), f = tiny("max_len: 57\n"), b = tiny("batching: buckets\n");
    tk_torchplan_result rd, rf, rb, rn;
    tk_err err = {0};
    TK_CHECK_EQ_INT(tk_torchplan_data(&d, len, 5, &rd, &err), TK_OK);
    TK_CHECK_EQ_INT(tk_torchplan_data(&f, len, 5, &rf, &err), TK_OK);
    TK_CHECK_EQ_INT(tk_torchplan_data(&b, len, 5, &rb, &err), TK_OK);
    TK_CHECK_EQ_INT(rd.seq, 57);
    TK_CHECK(rd.peak_allocated == rf.peak_allocated && rd.first_step_peak_allocated == rf.first_step_peak_allocated);
    TK_CHECK(rd.peak_reserved == rf.peak_reserved && rb.peak_allocated == rd.peak_allocated);
    TK_CHECK_MSG(strstr(rd.seq_from, "longest example of 5") != NULL, "%s", rd.seq_from);
    TK_CHECK(strstr(rd.attention, "padding mask") != NULL); /* shorter examples: padded batches */
    TK_CHECK_EQ_INT(tk_torchplan_data(&d, NULL, 0, &rn, &err), TK_OK);
    TK_CHECK_EQ_INT(rn.seq, 128);
    TK_CHECK_MSG(strstr(rn.seq_from, "without data") != NULL, "%s", rn.seq_from);
    TK_CHECK(rn.peak_allocated > rd.peak_allocated);
}

/* Two GPUs: each GPU planned, the strategy named, how it is known said. */
static void test_two_gpus(void) {
    tk_torchplan_result one = plan("gpu: t4\n");
    tk_torchplan_result dp = plan("gpu: t4x2\n");
    TK_CHECK_EQ_INT(dp.world_size, 2);
    TK_CHECK_STR(dp.parallel, "DataParallel");
    TK_CHECK(strncmp(dp.checked, "not measured", 12) == 0);
    TK_CHECK_EQ_INT(dp.n_gpu_rows, 2);
    TK_CHECK_STR(dp.gpu_rows[0].who, "GPU 0");
    TK_CHECK_STR(dp.gpu_rows[1].who, "GPU 1");
    /* GPU 0 holds the model, its gradients, AdamW's state and the reduce;
     * GPU 1 a replica's copies and its own gradients for the reduce */
    TK_CHECK(dp.gpu_rows[0].peak_allocated > one.peak_allocated);
    TK_CHECK(dp.gpu_rows[1].peak_allocated < dp.gpu_rows[0].peak_allocated);
    TK_CHECK(dp.peak_allocated == dp.gpu_rows[0].peak_allocated);
    TK_CHECK(dp.gpu_rows[1].device_used == dp.gpu_rows[1].peak_reserved + dp.context_bytes);
    /* each GPU's replica forward runs on a thread of its own, and its
     * backward on autograd's thread for that device: two cuBLAS workspaces
     * on each where the version keeps them, none where it frees them per GEMM */
    tk_torchplan_result dp11 = plan("gpu: t4x2\ntorch_version: 2.11\n"), dp15 = plan("gpu: t4x2\ntorch_version: 2.15\n");
    TK_CHECK(dp11.gpu_rows[0].n_workspaces == 2 && dp11.gpu_rows[1].n_workspaces == 2);
    TK_CHECK(dp15.gpu_rows[0].n_workspaces == 0 && dp15.gpu_rows[1].n_workspaces == 0);
    tk_torchplan_result ddp = plan("gpu: t4x2\nparallel: ddp\n");
    TK_CHECK_STR(ddp.parallel, "DDP");
    TK_CHECK_EQ_INT(ddp.n_gpu_rows, 1);
    TK_CHECK_STR(ddp.gpu_rows[0].who, "each of the 2 ranks");
    TK_CHECK(strstr(ddp.checked, "gloo") != NULL);
    /* the reducer's buckets: the trainable parameters' bytes once more */
    TK_CHECK(ddp.peak_allocated >= one.peak_allocated + (size_t)one.n_trainable * 4);
    TK_CHECK(ddp.peak_allocated <= one.peak_allocated + (size_t)one.n_trainable * 4 + ((size_t)4 << 20));
    tk_torchplan_result gloo = plan("world_size: 2\nparallel: ddp\n");
    TK_CHECK_STR(gloo.device, "cpu");
    TK_CHECK_EQ_INT(gloo.world_size, 2);
    tk_torchplan_result z = plan("gpu: t4x2\nparallel: zero2\nprecision: fp16\n");
    TK_CHECK_STR(z.parallel, "DeepSpeed ZeRO-2");
    TK_CHECK(strncmp(z.checked, "not measured", 12) == 0);
    /* DeepSpeed's estimate: 16 bytes per parameter over the 2 GPUs */
    size_t psi = (size_t)z.n_params;
    TK_CHECK_MSG(z.optim_bytes >= 8 * psi && z.optim_bytes < 8 * psi + 512, "%zu vs %zu", z.optim_bytes, 8 * psi);
    json_t *j = tk_torchplan_json(&dp);
    TK_CHECK(j && json_array_size(json_object_get(j, "gpus")) == 2);
    TK_CHECK_STR(json_string_value(json_object_get(j, "parallel")), "DataParallel");
    json_decref(j);
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

/* Each host allocation of a plan fails in turn (the first 200, then a
 * stride): the plan is TK_ENOMEM saying so, or the same plan. */
static void host_chaos(const char *yaml) {
    tk_config c = tiny(yaml);
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

static void test_host_chaos(void) {
    host_chaos("recompute: layers\nprecision: bf16\n");
    host_chaos("gpu: t4x2\n");
    host_chaos("world_size: 2\nparallel: ddp\n");
    host_chaos("gpu: t4x2\nparallel: zero2\nprecision: fp16\n");
}

int main(void) {
    TK_RUN(test_kernels_per_device);
    TK_RUN(test_techniques_move_the_peak);
    TK_RUN(test_unmodelled_options_are_errors);
    TK_RUN(test_fused_adamw);
    TK_RUN(test_dynamic_padding);
    TK_RUN(test_two_gpus);
    TK_RUN(test_json_names_the_engine);
    TK_RUN(test_blas_rules_per_version_and_arch);
    TK_RUN(test_plan_holds_the_workspaces);
    TK_RUN(test_host_chaos);
    return tk_test_done();
}
