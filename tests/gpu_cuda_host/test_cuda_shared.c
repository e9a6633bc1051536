/* test_cuda_shared.c — the cuda plugin's per-element rules and its GEMM
 * layout, checked on the host (no GPU needed, so `make test` runs it).
 *
 * gpu/cuda/cuda_shared.h holds the AdamW update and the dropout scale that
 * the cuda kernels run; it compiles with gcc as well as nvcc. Here the gcc
 * build of it must reproduce the cpu backend's tk_op_adamw bit for bit, and
 * its dropout scale the cpu backend's kept values. The kernels are built with
 * -fmad=false, so the device build does the same IEEE operations in the same
 * order; the GPU suite (make test-gpu) checks that on real hardware.
 * The column-major arguments the plugin hands cuBLAS (tk_gemm_colmajor) are
 * fed here to OpenBLAS's column-major sgemm, which has the same contract,
 * and must give the cpu backend's row-major result for every transpose.
 */
#include <cblas.h>
#include <stdlib.h>
#include "cuda/cuda_shared.h"
#include "tk_test.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static tk_dev *open_cpu(void) {
    tk_dev_opts o = { .kind = TK_DEV_CPU, .threads = 1 };
    tk_err err = {0};
    tk_dev *d = tk_dev_new(&o, &err);
    TK_CHECK_MSG(d != NULL, "%s", err.msg);
    return d;
}

static tk_tensor upload(tk_dev *d, const float *h, int64_t n) {
    tk_tensor t = {0};
    tk_err err = {0};
    int64_t shape[1] = { n };
    TK_CHECK(tk_tensor_alloc(d, &t, TK_F32, 1, shape, TK_CAT_OPTIM, "test", &err) == TK_OK);
    TK_CHECK(tk_tensor_write(d, &t, h, &err) == TK_OK);
    return t;
}

static void test_adamw_matches_cpu_bitwise(void) {
    enum { N = 4099 };
    static float p[N], m[N], v[N], g[N], hp_[N], hm[N], hv[N], back[N];
    tk_dev *d = open_cpu();
    if (!d) return;
    for (int i = 0; i < N; i++) { p[i] = frand(); m[i] = 0.0f; v[i] = 0.0f; }
    memcpy(hp_, p, sizeof p); memcpy(hm, m, sizeof m); memcpy(hv, v, sizeof v);
    tk_tensor tp = upload(d, p, N), tm = upload(d, m, N), tv = upload(d, v, N);
    tk_adamw_hp hp = { .lr = 2e-5f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                       .weight_decay = 0.01f, .grad_scale = 0.125f, .step = 1 };
    tk_err err = {0};
    for (hp.step = 1; hp.step <= 5; hp.step++) {
        for (int i = 0; i < N; i++) g[i] = 3.0f * frand();
        tk_tensor tg = upload(d, g, N);
        TK_CHECK(tk_op_adamw(d, &tp, &tg, &tm, &tv, N, &hp) == TK_OK);
        tk_tensor_free(d, &tg);
        tk_adamw_coef k = tk_adamw_coef_of(&hp);
        for (int i = 0; i < N; i++) tk_adamw_update(&hp_[i], &hm[i], &hv[i], g[i] * k.grad_scale, &k);
    }
    TK_CHECK(tk_tensor_read(d, &tp, back, &err) == TK_OK);
    TK_CHECK_MSG(memcmp(back, hp_, sizeof back) == 0, "params differ from the cpu backend");
    TK_CHECK(tk_tensor_read(d, &tm, back, &err) == TK_OK);
    TK_CHECK_MSG(memcmp(back, hm, sizeof back) == 0, "m differs from the cpu backend");
    TK_CHECK(tk_tensor_read(d, &tv, back, &err) == TK_OK);
    TK_CHECK_MSG(memcmp(back, hv, sizeof back) == 0, "v differs from the cpu backend");
    tk_tensor_free(d, &tp); tk_tensor_free(d, &tm); tk_tensor_free(d, &tv);
    tk_dev_destroy(&d);
}

/* Kept values = x * tk_dropout_scale(p), dropped ones 0, for p in (0,1) and
 * p = 0 (a copy; the op wrappers reject p >= 1). */
static void test_dropout_scale_matches_cpu(void) {
    enum { N = 1000 };
    static float x[N], out[N];
    static uint8_t mask[N];
    const float ps[3] = { 0.1f, 0.3f, 0.0f };
    tk_dev *d = open_cpu();
    if (!d) return;
    for (int i = 0; i < N; i++) x[i] = frand();
    tk_tensor tx = upload(d, x, N), to = upload(d, x, N), tmk = {0};
    int64_t shape[1] = { N };
    tk_err err = {0};
    TK_CHECK(tk_tensor_alloc(d, &tmk, TK_U8, 1, shape, TK_CAT_ACT, "test", &err) == TK_OK);
    for (int k = 0; k < 3; k++) {
        TK_CHECK(tk_op_dropout_fwd(d, &to, &tmk, &tx, N, ps[k], 42, 7) == TK_OK);
        TK_CHECK(tk_tensor_read(d, &to, out, &err) == TK_OK);
        TK_CHECK(tk_tensor_read(d, &tmk, mask, &err) == TK_OK);
        float sc = tk_dropout_scale(ps[k]);
        uint64_t key = tk_dropout_key(42);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            int keep = ps[k] <= 0.0f ? 1 : tk_dropout_keep(key, 7 + (uint64_t)i, ps[k]);
            float want = keep ? x[i] * sc : 0.0f;
            if (mask[i] != keep || memcmp(&out[i], &want, sizeof want) != 0) bad++;
        }
        TK_CHECK_MSG(bad == 0, "p=%g: %d elements differ", ps[k], bad);
    }
    tk_tensor_free(d, &tx); tk_tensor_free(d, &to); tk_tensor_free(d, &tmk);
    tk_dev_destroy(&d);
}

static void test_gemm_colmajor_layout(void) {
    enum { M = 5, N = 7, K = 3 };
    static float A[M * K], B[K * N], Cref[M * N], Ccm[M * N];
    tk_dev *d = open_cpu();
    if (!d) return;
    tk_err err = {0};
    for (int tr = 0; tr < 4; tr++) {
        int ta = tr & 1, tb = tr >> 1;
        for (int i = 0; i < M * K; i++) A[i] = frand();
        for (int i = 0; i < K * N; i++) B[i] = frand();
        for (int i = 0; i < M * N; i++) Ccm[i] = Cref[i] = frand();
        tk_tensor tA = upload(d, A, M * K), tB = upload(d, B, K * N), tC = upload(d, Cref, M * N);
        TK_CHECK(tk_op_gemm(d, &tC, &tA, &tB, NULL, &(tk_gemm){ .m = M, .n = N, .k = K, .trans_a = ta, .trans_b = tb, .batch = 1, .alpha = 0.5f, .beta = 0.25f }) == TK_OK);
        TK_CHECK(tk_tensor_read(d, &tC, Cref, &err) == TK_OK);
        tk_gemm_cm g = tk_gemm_colmajor(ta, tb, M, N, K);
        cblas_sgemm(CblasColMajor, g.trans_first ? CblasTrans : CblasNoTrans,
                    g.trans_second ? CblasTrans : CblasNoTrans, (int)g.m, (int)g.n, (int)g.k, 0.5f,
                    B, (int)g.ld_first, A, (int)g.ld_second, 0.25f, Ccm, (int)g.ldc);
        double worst = 0.0;
        for (int i = 0; i < M * N; i++) worst = fmax(worst, fabs((double)Cref[i] - Ccm[i]));
        TK_CHECK_MSG(worst <= 1e-6, "transA=%d transB=%d: max abs diff %g", ta, tb, worst);
        tk_tensor_free(d, &tA); tk_tensor_free(d, &tB); tk_tensor_free(d, &tC);
    }
    tk_dev_destroy(&d);
}

/* The heads kernel reads input element tk_heads_src(k) for output k: that
 * permutation must be the cpu backend's split/merge. */
static void test_heads_index_map(void) {
    enum { B = 2, T = 5, NH = 3, HS = 4, NE = B * T * NH * HS };
    static float x[NE], ref[NE];
    tk_dev *d = open_cpu();
    if (!d) return;
    tk_err err = {0};
    for (int i = 0; i < NE; i++) x[i] = (float)i;
    for (int to_heads = 0; to_heads < 2; to_heads++) {
        tk_tensor tx = upload(d, x, NE), ty = upload(d, x, NE);
        if (to_heads) TK_CHECK(tk_op_split_heads(d, &ty, &tx, B, T, NH, HS) == TK_OK);
        else TK_CHECK(tk_op_merge_heads(d, &ty, &tx, B, T, NH, HS) == TK_OK);
        TK_CHECK(tk_tensor_read(d, &ty, ref, &err) == TK_OK);
        int bad = 0;
        for (int64_t k = 0; k < NE; k++) bad += ref[k] != x[tk_heads_src(k, T, NH, HS, to_heads)];
        TK_CHECK_MSG(bad == 0, "to_heads=%d: %d elements differ", to_heads, bad);
        tk_tensor_free(d, &tx); tk_tensor_free(d, &ty);
    }
    tk_dev_destroy(&d);
}

/* The biased-GEMM pre-pass writes C[at] = bias[bias_at] for each k: every
 * element of every batch matrix exactly once, never the gap between them. */
static void test_bias_rows_index_map(void) {
    enum { M = 3, N = 4, BATCH = 3, STRIDE = M * N + 5 };
    static int hits[STRIDE * BATCH];
    memset(hits, 0, sizeof hits);
    int bad_bias = 0;
    for (int64_t k = 0; k < (int64_t)M * N * BATCH; k++) {
        int64_t bi;
        int64_t at = tk_bias_rows_at(k, M, N, STRIDE, &bi);
        TK_CHECK(at >= 0 && at < STRIDE * BATCH);
        if (at >= 0 && at < STRIDE * BATCH) hits[at]++;
        bad_bias += bi != (at % STRIDE) % N;
    }
    TK_CHECK_EQ_INT(bad_bias, 0);
    for (int b = 0; b < BATCH; b++)
        for (int i = 0; i < STRIDE; i++)
            TK_CHECK_EQ_INT(hits[b * STRIDE + i], i < M * N ? 1 : 0);
}

/* The attention kernels' hoisted dropout test (base once per row, the high
 * word of the last mix step, an integer threshold) keeps exactly what
 * tk_dropout_keep keeps: rows and keys of a 512-token head, rates from 0 to
 * 1, the thresholds' edges (p a multiple of 2^-24 and next to one). */
static void test_drop_keep_hoisted_bitwise(void) {
    const float ps[] = { 0.0f, 1e-30f, 0.1f, 0.5f, 0.9f, 0.125f, 0.125f + 5.96e-8f, 3.0f / 16777216.0f,
                         nextafterf(3.0f / 16777216.0f, 1.0f), 0.99999994f };
    const uint64_t key = tk_dropout_key(1234), offset = 98765;
    long bad = 0, kept = 0, n = 0;
    for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
        const uint32_t km = tk_drop_keep_min(ps[pi]);
        for (uint64_t i = 0; i < 64; i++) {
            const uint64_t row = offset + (5 * 512 + i * 7) * 512;
            const uint64_t base = tk_drop_row_base(key, row);
            for (uint64_t j = 0; j < 512; j++, n++) {
                const int want = tk_dropout_keep(key, row + j, ps[pi]);
                kept += want;
                bad += tk_drop_keep_hi(base, j, km) != want;
            }
        }
    }
    TK_CHECK_MSG(bad == 0, "%ld of %ld dropout tests differ from tk_dropout_keep", bad, n);
    TK_CHECK(kept > n / 3 && kept < n); /* the rates did keep and drop */
    /* the top of the hash: u = (2^24 - 1) / 2^24 against p just below and at it */
    TK_CHECK_EQ_INT((int)tk_drop_keep_min(1.0f - 1.0f / 16777216.0f), (int)0xffffff00u);
    TK_CHECK_EQ_INT((int)tk_drop_keep_min(1.0f), (int)0xffffffffu);
    TK_CHECK_EQ_INT((int)tk_drop_keep_min(0.0f), 0);
}

int main(void) {
    TK_RUN(test_heads_index_map);
    TK_RUN(test_bias_rows_index_map);
    TK_RUN(test_gemm_colmajor_layout);
    TK_RUN(test_adamw_matches_cpu_bitwise);
    TK_RUN(test_dropout_scale_matches_cpu);
    TK_RUN(test_drop_keep_hoisted_bitwise);
    return tk_test_done();
}
