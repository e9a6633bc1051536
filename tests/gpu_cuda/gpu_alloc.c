/* gpu_alloc.c — the caching allocator on real device memory, and CUPTI's
 * view of it.
 *
 *  - device info comes from the driver (name, capacity, compute capability);
 *  - tensors land in cudaMalloc'd segments; data round-trips exactly;
 *  - a request the device cannot hold is an OOM record, not a crash, and the
 *    device works afterwards (the CUDA error was cleared);
 *  - CUPTI: its live device total minus the allocator's reserved equals the
 *    plugin's "outside the allocator" figure, which covers at least the
 *    cuBLAS workspace; freeing and emptying the cache moves CUPTI's total by
 *    exactly the segments returned; kernels are timed per owner scope.
 */
#include <jansson.h>
#include "gpu_common.h"
#include "tk_session.h"

static tk_cuda_mem_totals_get_fn totals_fn(void) {
    return (tk_cuda_mem_totals_get_fn)tk_dev_plugin_sym(g_gpu, "tk_cuda_mem_totals_get");
}

static void test_info(void) {
    tk_dev_info info;
    tk_dev_info_get(g_gpu, &info);
    TK_CHECK_EQ_INT(info.kind, TK_DEV_CUDA);
    TK_CHECK(info.name[0] != 0);
    TK_CHECK(info.total > 0 && info.free_bytes <= info.total);
    TK_CHECK(info.cc_major >= 7);
    TK_CHECK(info.driver[0] != 0 && info.runtime[0] != 0);
}

static void test_segments_roundtrip_empty_cache(void) {
    tk_alloc *a = tk_dev_alloc(g_gpu);
    tk_err err = {0};
    tk_alloc_empty_cache(a);
    tk_alloc_stats s0, s1, s2;
    tk_alloc_stats_get(a, &s0);
    const int64_t sizes[3] = { 256, 5 << 20, 30 << 20 }; /* small pool, large pool, own segment */
    tk_tensor t[3] = { 0 };
    for (int i = 0; i < 3; i++) {
        int64_t shape[1] = { sizes[i] / 4 };
        TK_CHECK_MSG(tk_tensor_alloc(g_gpu, &t[i], TK_F32, 1, shape, TK_CAT_ACT, "test.seg", &err) == TK_OK,
                     "%s", err.msg);
    }
    tk_alloc_stats_get(a, &s1);
    TK_CHECK(s1.reserved > s0.reserved);
    TK_CHECK(s1.allocated >= s0.allocated + (size_t)(sizes[0] + sizes[1] + sizes[2]));
    /* exact round trip through device memory */
    int64_t n = sizes[2] / 4;
    float *h = malloc((size_t)n * 4), *back = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) h[i] = frand();
    TK_CHECK(tk_tensor_write(g_gpu, &t[2], h, &err) == TK_OK);
    TK_CHECK(tk_tensor_read(g_gpu, &t[2], back, &err) == TK_OK);
    TK_CHECK(memcmp(h, back, (size_t)n * 4) == 0);
    free(h);
    free(back);
    for (int i = 0; i < 3; i++) tk_tensor_free(g_gpu, &t[i]);
    tk_alloc_stats_get(a, &s2);
    TK_CHECK_EQ_INT(s2.allocated, s0.allocated);
    TK_CHECK(s2.reserved == s1.reserved); /* cached, as PyTorch does */
    tk_alloc_empty_cache(a);
    tk_alloc_stats_get(a, &s2);
    TK_CHECK_EQ_INT(s2.reserved, s0.reserved);
    tk_cuda_mem_totals tot;
    tk_cuda_mem_totals_get_fn get = totals_fn();
    TK_CHECK(get != NULL);
    if (get) {
        TK_CHECK(get(tk_dev_backend_ctx(g_gpu), &tot, &err) == TK_OK);
        TK_CHECK_EQ_INT(tot.segments_live, s2.reserved); /* the plugin saw the same segments */
    }
}

/* A simulated capacity far above the card makes the allocator ask cudaMalloc
 * for more than exists: the device's own failure must become TK_EOOM. */
static void test_device_oom_recovers(void) {
    tk_err err = {0};
    tk_dev_opts o = { .kind = TK_DEV_CUDA, .capacity = (size_t)1 << 50 };
    tk_dev *d = tk_dev_new(&o, &err);
    TK_CHECK_MSG(d != NULL, "%s", err.msg);
    if (!d) return;
    tk_dev_info info;
    tk_dev_info_get(g_gpu, &info);
    int64_t shape[1] = { (int64_t)((info.total + ((size_t)1 << 30)) / 4) };
    tk_tensor big = { 0 }, small = { 0 };
    TK_CHECK_EQ_INT(tk_tensor_alloc(d, &big, TK_F32, 1, shape, TK_CAT_ACT, "test.big", &err), TK_EOOM);
    TK_CHECK(big.data == NULL);
    const tk_oom *oom = tk_dev_last_oom(d);
    TK_CHECK(oom != NULL);
    if (oom) TK_CHECK(oom->requested == (size_t)shape[0] * 4);
    int64_t s1[1] = { 1 << 20 };
    TK_CHECK_MSG(tk_tensor_alloc(d, &small, TK_F32, 1, s1, TK_CAT_ACT, "test.small", &err) == TK_OK, "%s", err.msg);
    TK_CHECK(tk_op_fill(d, &small, 2.5f, s1[0]) == TK_OK);
    float v = 0.0f;
    tk_tensor one = tk_tensor_view(&small, s1[0] - 1, 1);
    TK_CHECK(tk_tensor_read(d, &one, &v, &err) == TK_OK);
    TK_CHECK(v == 2.5f);
    TK_CHECK_EQ_INT(tk_dev_sync(d, &err), TK_OK);
    tk_tensor_free(d, &small);
    tk_dev_destroy(&d);
}

static void test_cupti_reconciles(void) {
    tk_err err = {0};
    tk_cuda_mem_totals_get_fn get = totals_fn();
    TK_CHECK(get != NULL);
    if (!get) return;
    void *ctx = tk_dev_backend_ctx(g_gpu);
    tk_alloc *a = tk_dev_alloc(g_gpu);
    /* Some tensors and a cuBLAS GEMM (its first call may allocate for itself). */
    const int64_t M = 512;
    int64_t shape[1] = { M * M };
    tk_tensor A = { 0 }, B = { 0 }, C = { 0 };
    TK_CHECK(tk_tensor_alloc(g_gpu, &A, TK_F16, 1, shape, TK_CAT_PARAM, "test.A", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(g_gpu, &B, TK_F16, 1, shape, TK_CAT_ACT, "test.B", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(g_gpu, &C, TK_F32, 1, shape, TK_CAT_ACT, "test.C", &err) == TK_OK);
    TK_CHECK(tk_op_fill(g_gpu, &A, 0.5f, M * M) == TK_OK);
    TK_CHECK(tk_op_fill(g_gpu, &B, 0.25f, M * M) == TK_OK);
    TK_CHECK(tk_op_gemm(g_gpu, &C, &A, &B, NULL, &(tk_gemm){ .m = M, .n = M, .k = M, .trans_b = 1, .batch = 1, .alpha = 1.0f }) == TK_OK);
    /* and cuBLASLt GEMMs with an epilogue (a linear layer's bias into a
     * 16-bit output, its bias gradient), whose handle and algorithms are
     * the first thing cuBLASLt makes (issue 43): nothing outside either */
    {
        tk_tensor C16 = { 0 }, bias = { 0 }, dW = { 0 }, db = { 0 }, tmp = { 0 };
        int64_t ns[1] = { M };
        TK_CHECK(tk_tensor_alloc(g_gpu, &C16, TK_F16, 1, shape, TK_CAT_ACT, "test.C16", &err) == TK_OK);
        TK_CHECK(tk_tensor_alloc(g_gpu, &dW, TK_F32, 1, shape, TK_CAT_GRAD, "test.dW", &err) == TK_OK);
        TK_CHECK(tk_tensor_alloc(g_gpu, &bias, TK_F16, 1, ns, TK_CAT_PARAM, "test.bias", &err) == TK_OK);
        TK_CHECK(tk_tensor_alloc(g_gpu, &db, TK_F32, 1, ns, TK_CAT_GRAD, "test.db", &err) == TK_OK);
        TK_CHECK(tk_tensor_alloc(g_gpu, &tmp, TK_F32, 1, ns, TK_CAT_TEMP, "test.tmp", &err) == TK_OK);
        TK_CHECK(tk_op_fill(g_gpu, &bias, 0.125f, M) == TK_OK);
        TK_CHECK(tk_op_fill(g_gpu, &db, 0.0f, M) == TK_OK);
        TK_CHECK(tk_op_fill(g_gpu, &dW, 0.0f, M * M) == TK_OK);
        uint64_t calls = 0, declined = 0;
        char report[512];
        gpu_lt_reset();
        TK_CHECK(tk_op_gemm(g_gpu, &C16, &A, &B, &bias, &(tk_gemm){ .m = M, .n = M, .k = M, .trans_b = 1, .batch = 1, .alpha = 1.0f }) == TK_OK);
        TK_CHECK(tk_op_gemm(g_gpu, &dW, &C16, &A, NULL, &(tk_gemm){ .m = M, .n = M, .k = M, .trans_a = 1, .batch = 1, .alpha = 1.0f, .beta = 1.0f, .bgrad = &db, .bgrad_tmp = &tmp }) == TK_OK);
        TK_CHECK(gpu_lt_declines(&calls, &declined, report, sizeof report));
        TK_CHECK_EQ_INT(calls, 2);
        fprintf(stderr, "  %s\n", report);
        tk_tensor_free(g_gpu, &tmp);
        tk_tensor_free(g_gpu, &db);
        tk_tensor_free(g_gpu, &bias);
        tk_tensor_free(g_gpu, &dW);
        tk_tensor_free(g_gpu, &C16);
    }
    tk_cuda_mem_totals t;
    TK_CHECK(get(ctx, &t, &err) == TK_OK);
    TK_CHECK_MSG(t.cupti_active, "CUPTI inactive: %s (is another profiler attached?)", t.cupti_error);
    if (!t.cupti_active) goto out;
    tk_alloc_stats s;
    tk_alloc_stats_get(a, &s);
    TK_CHECK_EQ_INT(t.segments_live, s.reserved);
    TK_CHECK_EQ_INT(t.device_live - s.reserved, t.outside_allocator);
    /* The plugin's buffers are allocator blocks (the GEMM workspace under
     * owner "cublas"), and cuBLAS and cuBLASLt work in them: after their GEMMs nothing is
     * outside the allocator but what gpu/profile.c says the libraries keep
     * on this architecture. The sources say who, if it ever is more. */
    TK_CHECK_EQ_INT(t.plugin_bytes, 0);
    TK_CHECK_EQ_INT(t.workspace_bytes, TK_CUDA_WORKSPACE_BYTES);
    TK_CHECK_EQ_INT(tk_alloc_owner_live(a, tk_alloc_owner_id(a, "cublas"), TK_CAT_WORKSPACE), TK_CUDA_WORKSPACE_BYTES);
    TK_CHECK_MSG(t.outside_allocator <= card_outside(0),
                 "CUPTI: %zu B outside the allocator after a GEMM, gpu/profile.c allows %zu B for sm%d%d "
                 "(bytes by library below)", t.outside_allocator, card_outside(0), g_cc_major, g_cc_minor);
    TK_CHECK(t.device_peak >= t.device_live);
    TK_CHECK(t.n_alloc_records >= 3);
    TK_CHECK(t.n_sources >= 1);
    TK_CHECK(t.n_kernels >= 3 && t.kernel_ns > 0.0);
    TK_CHECK_EQ_INT(t.dropped_records, 0);
    TK_CHECK(t.device_total > 0 && t.device_total - t.device_free >= t.device_live);
    fprintf(stderr, "  CUPTI: device live %zu B, allocator reserved %zu B, outside %zu B "
            "(plugin %zu B), %d sources:", t.device_live, s.reserved, t.outside_allocator,
            t.plugin_bytes, t.n_sources);
    for (int i = 0; i < t.n_sources; i++)
        fprintf(stderr, " %s=%zu", t.sources[i].name, t.sources[i].live);
    fputc('\n', stderr);

    /* Freeing and emptying the cache moves CUPTI's total by the segments returned. */
    tk_tensor_free(g_gpu, &A);
    tk_tensor_free(g_gpu, &B);
    tk_tensor_free(g_gpu, &C);
    tk_alloc_empty_cache(a);
    tk_alloc_stats s2;
    tk_cuda_mem_totals t2;
    tk_alloc_stats_get(a, &s2);
    TK_CHECK(get(ctx, &t2, &err) == TK_OK);
    TK_CHECK_EQ_INT(t.device_live - t2.device_live, s.reserved - s2.reserved);
    TK_CHECK_EQ_INT(t2.device_live - s2.reserved, t2.outside_allocator);

    /* Kernel time per owner scope. */
    int owner = tk_alloc_owner_id(a, "bert.encoder.layer.0.attention.self.query");
    tk_tensor x = { 0 };
    int64_t xs[1] = { 1 << 20 };
    TK_CHECK(tk_tensor_alloc(g_gpu, &x, TK_F32, 1, xs, TK_CAT_TEMP, "test.x", &err) == TK_OK);
    tk_cuda_scope_push_fn push = (tk_cuda_scope_push_fn)tk_dev_plugin_sym(g_gpu, "tk_cuda_scope_push");
    tk_cuda_scope_pop_fn pop = (tk_cuda_scope_pop_fn)tk_dev_plugin_sym(g_gpu, "tk_cuda_scope_pop");
    tk_cuda_scope_kernel_time_fn ktime =
        (tk_cuda_scope_kernel_time_fn)tk_dev_plugin_sym(g_gpu, "tk_cuda_scope_kernel_time");
    TK_CHECK(push && pop && ktime);
    if (!push || !pop || !ktime) { tk_tensor_free(g_gpu, &x); return; }
    uint64_t n0 = 0, n1 = 0;
    double ns0 = 0, ns1 = 0;
    ktime(ctx, owner, &n0, &ns0);
    push(ctx, owner);
    for (int i = 0; i < 3; i++) TK_CHECK(tk_op_fill(g_gpu, &x, (float)i, xs[0]) == TK_OK);
    pop(ctx);
    TK_CHECK(get(ctx, &t2, &err) == TK_OK);
    ktime(ctx, owner, &n1, &ns1);
    TK_CHECK_EQ_INT(n1 - n0, 3);
    TK_CHECK(ns1 > ns0);
    tk_tensor_free(g_gpu, &x);
    return;
out:
    tk_tensor_free(g_gpu, &A);
    tk_tensor_free(g_gpu, &B);
    tk_tensor_free(g_gpu, &C);
}

/* %txmem's report on cuda carries CUPTI's view, reconciled: device live =
 * segments + outside the allocator, and the text says so. */
static void test_txmem_report_reconciles(void) {
    tk_err err = {0};
    tk_tensor t = {0};
    int64_t shape[1] = { (int64_t)(7 << 20) / 4 };
    TK_CHECK_MSG(tk_tensor_alloc(g_gpu, &t, TK_F32, 1, shape, TK_CAT_ACT, "test.report", &err) == TK_OK, "%s", err.msg);
    json_t *b = tk_report_mem(g_gpu, "owner", 5);
    const char *text = json_string_value(json_object_get(b, "text/plain"));
    json_t *rec = json_object_get(json_object_get(b, "application/json"), "device_records");
    TK_CHECK_MSG(rec != NULL, "no device_records in %%txmem's JSON");
    if (rec && json_is_true(json_object_get(rec, "cupti_active"))) {
        json_int_t live = json_integer_value(json_object_get(rec, "device_live"));
        json_int_t seg = json_integer_value(json_object_get(rec, "segments_live"));
        json_int_t out = json_integer_value(json_object_get(rec, "outside_allocator"));
        TK_CHECK_EQ_INT(live, seg + out);
        TK_CHECK(seg >= (json_int_t)(7 << 20));
        TK_CHECK(text && strstr(text, "outside the allocator") != NULL);
    } else {
        TK_CHECK_MSG(0, "CUPTI inactive: %s", rec ? json_string_value(json_object_get(rec, "error")) : "?");
    }
    json_decref(b);
    tk_tensor_free(g_gpu, &t);
}

int main(void) {
    setenv("TXK_CUPTI", "kernels", 1); /* kernel records and owner scopes (test_cupti), off by default */
    if (!gpu_open()) {
        gpu_close();
        printf("0 passed, 1 failed\n");
        return 1;
    }
    TK_RUN(test_info);
    TK_RUN(test_segments_roundtrip_empty_cache);
    TK_RUN(test_device_oom_recovers);
    TK_RUN(test_cupti_reconciles);
    TK_RUN(test_txmem_report_reconciles);
    gpu_close();
    return tk_test_done();
}
