/* test_cpu_ops.c — every op of the cpu backend against a naive reference
 * written here (double precision, obvious loops), every backward against
 * central finite differences of its forward, plus dropout determinism and the
 * AdamW step worked by hand. Ops are called through the backend table
 * directly, on tensors whose data this test mallocs, so the backend is tested
 * apart from the allocator and the tk_op_* wrappers. */
#include "tk_test.h"
#include "tk_backend_impl.h"
#include "tk_ops_spec.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const tk_backend *BE;
static void *CTX;  /* default thread count */
static void *CTX1; /* one thread */

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_state = 12345;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* Reference conversions, written independently of the backend's: f16 by the
 * compiler's _Float16, bf16 by picking the nearer of the two candidates. */
static uint16_t ref_f2h(float f) {
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
static float ref_h2f(uint16_t u) {
    _Float16 h;
    memcpy(&h, &u, 2);
    return (float)h;
}
static float ref_bf2f(uint16_t u) {
    uint32_t x = (uint32_t)u << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t ref_f2bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if (isnan(f)) return (uint16_t)((x >> 16) | 0x40);
    uint16_t lo = (uint16_t)(x >> 16), hi = (uint16_t)(lo + 1);
    double dl = fabs((double)ref_bf2f(lo) - f), dh = fabs((double)ref_bf2f(hi) - f);
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo & 1) ? hi : lo;
}

static tk_tensor mk(tk_dtype dt, int64_t n) {
    tk_tensor t;
    memset(&t, 0, sizeof t);
    size_t es = (dt == TK_F32 || dt == TK_I32) ? 4 : (dt == TK_F16 || dt == TK_BF16) ? 2 : dt == TK_I64 ? 8 : 1;
    t.data = calloc((size_t)(n > 0 ? n : 1), es);
    t.shape[0] = n;
    t.ndim = 1;
    t.dtype = dt;
    return t;
}
static void rm(tk_tensor *t) {
    free(t->data);
    t->data = NULL;
}
static float get(const tk_tensor *t, int64_t i) {
    switch (t->dtype) {
    case TK_F16: return ref_h2f(((uint16_t *)t->data)[i]);
    case TK_BF16: return ref_bf2f(((uint16_t *)t->data)[i]);
    default: return ((float *)t->data)[i];
    }
}
static void set(tk_tensor *t, int64_t i, float v) {
    switch (t->dtype) {
    case TK_F16: ((uint16_t *)t->data)[i] = ref_f2h(v); break;
    case TK_BF16: ((uint16_t *)t->data)[i] = ref_f2bf(v); break;
    default: ((float *)t->data)[i] = v; break;
    }
}
static tk_tensor mk_rand(tk_dtype dt, int64_t n, float amp) {
    tk_tensor t = mk(dt, n);
    for (int64_t i = 0; i < n; i++) set(&t, i, amp * frand());
    return t;
}
/* relative-or-absolute closeness */
static int close_to(double a, double b, double rtol, double atol) {
    return fabs(a - b) <= atol + rtol * fabs(b);
}
static double tol_of(tk_dtype dt) { return dt == TK_F32 ? 1e-5 : dt == TK_F16 ? 2e-3 : 1.6e-2; }

static const tk_dtype FDT[3] = {TK_F32, TK_F16, TK_BF16};

/* ---- conversions and memory ---------------------------------------------------- */

static void test_cast_f16_all_values(void) {
    tk_tensor h = mk(TK_F16, 65536), f = mk(TK_F32, 65536), h2 = mk(TK_F16, 65536);
    for (int i = 0; i < 65536; i++) ((uint16_t *)h.data)[i] = (uint16_t)i;
    TK_CHECK(BE->cast(CTX, &f, &h, 65536) == TK_OK);
    TK_CHECK(BE->cast(CTX, &h2, &f, 65536) == TK_OK);
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        float r = ref_h2f((uint16_t)i), g = ((float *)f.data)[i];
        if (isnan(r) ? !isnan(g) : memcmp(&r, &g, 4) != 0) bad++;
        if (!isnan(r) && ((uint16_t *)h2.data)[i] != (uint16_t)i) bad++;
    }
    TK_CHECK_EQ_INT(bad, 0);
    rm(&h); rm(&f); rm(&h2);
}

static void test_cast_f32_to_16bit_rounding(void) {
    enum { N = 200000 };
    tk_tensor f = mk(TK_F32, N), h = mk(TK_F16, N), b = mk(TK_BF16, N);
    float *fv = f.data;
    for (int i = 0; i < N; i++) {
        rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t x = (uint32_t)(rng_state >> 32) ^ (uint32_t)(rng_state >> 7);
        if (i % 4 == 0) x = (x & 0x807fffffu) | ((uint32_t)(100 + (i / 4) % 60) << 23); /* f16 range incl. subnormals */
        if (i % 4 == 1) x = (x & 0xffff8000u) | 0x1000u; /* exact f16 ties in the normal range */
        memcpy(&fv[i], &x, 4);
    }
    fv[0] = 65519.0f; fv[1] = 65520.0f; fv[2] = -65520.0f; fv[3] = 0x1p-25f; fv[4] = 0x1.8p-25f;
    fv[5] = 0x1p-24f; fv[6] = INFINITY; fv[7] = -0.0f; fv[8] = 3.4028234663852886e38f;
    TK_CHECK(BE->cast(CTX, &h, &f, N) == TK_OK);
    TK_CHECK(BE->cast(CTX, &b, &f, N) == TK_OK);
    int badh = 0, badb = 0;
    for (int i = 0; i < N; i++) {
        if (isnan(fv[i])) continue;
        if (((uint16_t *)h.data)[i] != ref_f2h(fv[i])) {
            if (badh++ < 5) fprintf(stderr, "  f16 %a: %04x vs %04x\n", fv[i], ((uint16_t *)h.data)[i], ref_f2h(fv[i]));
        }
        if (fabsf(fv[i]) < 3.38e38f && ((uint16_t *)b.data)[i] != ref_f2bf(fv[i])) {
            if (badb++ < 5) fprintf(stderr, "  bf16 %a: %04x vs %04x\n", fv[i], ((uint16_t *)b.data)[i], ref_f2bf(fv[i]));
        }
    }
    TK_CHECK_EQ_INT(badh, 0);
    TK_CHECK_EQ_INT(badb, 0);
    rm(&f); rm(&h); rm(&b);
}

static void test_memory_and_info(void) {
    void *p = NULL;
    TK_CHECK(BE->seg_alloc(CTX, 1000, &p) == 0);
    TK_CHECK(p != NULL && ((uintptr_t)p % 64) == 0);
    char host[1000], back[1000];
    for (int i = 0; i < 1000; i++) host[i] = (char)i;
    TK_CHECK(BE->write(CTX, p, host, 1000, NULL) == TK_OK);
    TK_CHECK(BE->read(CTX, back, p, 1000, NULL) == TK_OK);
    TK_CHECK(memcmp(host, back, 1000) == 0);
    tk_dev_info info;
    BE->info(CTX, &info);
    TK_CHECK(info.kind == TK_DEV_CPU);
    TK_CHECK(info.total > 0 && info.free_bytes <= info.total);
    BE->seg_free(CTX, p, 1000);
    TK_CHECK(BE->sync(CTX, NULL) == TK_OK);
    tk_dev_opts o = {.kind = TK_DEV_CPU, .capacity = 1 << 20, .threads = 1};
    void *c = tk_cpu_ctx_new(&o);
    BE->info(c, &info);
    TK_CHECK_EQ_INT(info.total, 1 << 20);
    TK_CHECK(BE->seg_alloc(c, 4096, &p) == 0);
    BE->info(c, &info);
    TK_CHECK_EQ_INT(info.free_bytes, (1 << 20) - 4096);
    BE->seg_free(c, p, 4096);
    BE->destroy(c);
}

/* ---- GEMM ----------------------------------------------------------------------- */

static void gemm_case(tk_dtype dt, tk_dtype bias_dt, int transA, int transB, int64_t M, int64_t N,
                      int64_t K, int64_t batch, float alpha, float beta, int with_bias) {
    int64_t sA = M * K + 3, sB = K * N + 5, sC = M * N + 7; /* padded: strides are honoured */
    tk_tensor A = mk_rand(dt, sA * batch, 1), B = mk_rand(dt, sB * batch, 1), C = mk_rand(dt, sC * batch, 1);
    tk_tensor bias = mk_rand(bias_dt, N, 1);
    double *ref = malloc(sizeof(double) * (size_t)(sC * batch));
    for (int64_t i = 0; i < sC * batch; i++) ref[i] = get(&C, i);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) {
                    double a = get(&A, b * sA + (transA ? k * M + i : i * K + k));
                    double bb = get(&B, b * sB + (transB ? j * K + k : k * N + j));
                    s += a * bb;
                }
                double *c = &ref[b * sC + i * N + j];
                *c = alpha * s + (beta == 0 ? 0 : beta * *c) + (with_bias ? get(&bias, j) : 0);
            }
    TK_CHECK(BE->gemm(CTX, &C, &A, &B, with_bias ? &bias : NULL, &(tk_gemm){ .m = M, .n = N, .k = K, .trans_a = transA, .trans_b = transB, .batch = batch, .stride_a = sA, .stride_b = sB, .stride_c = sC, .alpha = alpha, .beta = beta }) == TK_OK);
    int bad = 0;
    double tol = dt == TK_F32 ? 1e-4 : tol_of(dt) * 2;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < sC; i++) {
            double g = get(&C, b * sC + i), r = ref[b * sC + i];
            if (!close_to(g, r, tol, tol * sqrt((double)K))) {
                if (bad++ < 3) fprintf(stderr, "  gemm dt=%d tA=%d tB=%d [%ld]: %g vs %g\n", dt, transA, transB, (long)i, g, r);
            }
        }
    TK_CHECK_EQ_INT(bad, 0);
    free(ref);
    rm(&A); rm(&B); rm(&C); rm(&bias);
}

static void test_gemm(void) {
    for (int d = 0; d < 3; d++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                gemm_case(FDT[d], FDT[d], ta, tb, 5, 7, 3, 1, 1.0f, 0.0f, 0);
                gemm_case(FDT[d], TK_F32, ta, tb, 13, 6, 9, 3, 0.5f, 1.0f, 1);
                gemm_case(FDT[d], FDT[d], ta, tb, 4, 33, 17, 2, -1.5f, 0.25f, 1);
            }
    gemm_case(TK_F32, TK_F32, 0, 1, 64, 96, 80, 4, 0.125f, 0.0f, 1); /* big enough for threads */
    /* each of the GEMM's thread splits (cpu_backend.c's sgemm_sliced): rows
     * of C, columns of C (slices not multiples of 16 at the end), and the
     * batch (f32 without bias), for every transpose */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(TK_F32, TK_F32, ta, tb, 100, 40, 70, 1, 1.0f, 0.5f, 0);
            gemm_case(TK_F32, TK_F32, ta, tb, 40, 100, 70, 2, 0.75f, 0.0f, 1);
            gemm_case(TK_F16, TK_F32, ta, tb, 100, 40, 70, 1, 1.0f, 0.0f, 1);
            gemm_case(TK_F32, TK_F32, ta, tb, 9, 11, 5, 5, 1.0f, 0.25f, 0);
        }
}

/* ---- elementwise ---------------------------------------------------------------- */

static void test_add_axpby_fill(void) {
    for (int d = 0; d < 3; d++) {
        tk_dtype dt = FDT[d];
        int64_t n = 70001; /* crosses the threading threshold and a partial chunk */
        tk_tensor a = mk_rand(dt, n, 3), b = mk_rand(dt, n, 3), o = mk(dt, n), y = mk_rand(dt, n, 2);
        tk_tensor y0 = mk(TK_F32, n);
        for (int64_t i = 0; i < n; i++) set(&y0, i, get(&y, i));
        TK_CHECK(BE->add(CTX, &o, &a, &b, n) == TK_OK);
        TK_CHECK(BE->axpby(CTX, &y, 0.5f, &a, -2.0f, n) == TK_OK);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            if (!close_to(get(&o, i), (double)get(&a, i) + get(&b, i), tol_of(dt), 1e-6)) bad++;
            if (!close_to(get(&y, i), 0.5 * get(&a, i) - 2.0 * get(&y0, i), tol_of(dt), 1e-5)) bad++;
        }
        TK_CHECK_EQ_INT(bad, 0);
        /* aliasing: a = a + b */
        TK_CHECK(BE->add(CTX, &a, &a, &b, n) == TK_OK);
        for (int64_t i = 0; i < n; i++) bad += get(&a, i) != get(&o, i);
        TK_CHECK_EQ_INT(bad, 0);
        /* beta 0 does not read y (NaN does not leak) */
        set(&y, 3, NAN);
        TK_CHECK(BE->axpby(CTX, &y, 2.0f, &b, 0.0f, n) == TK_OK);
        TK_CHECK(get(&y, 3) == get(&b, 3) * 2.0f);
        TK_CHECK(BE->fill(CTX, &o, 1.5f, n - 1) == TK_OK);
        TK_CHECK(get(&o, 0) == 1.5f && get(&o, n - 2) == 1.5f && get(&o, n - 1) != 1.5f);
        rm(&a); rm(&b); rm(&o); rm(&y); rm(&y0);
    }
    tk_tensor i32 = mk(TK_I32, 10), u8 = mk(TK_U8, 10);
    TK_CHECK(BE->fill(CTX, &i32, -3.0f, 10) == TK_OK);
    TK_CHECK(BE->fill(CTX, &u8, 7.0f, 9) == TK_OK);
    TK_CHECK(((int32_t *)i32.data)[9] == -3 && ((uint8_t *)u8.data)[8] == 7 && ((uint8_t *)u8.data)[9] == 0);
    rm(&i32); rm(&u8);
}

/* Finite-difference check: loss(x) = sum_i r_i * f(x)_i for a unary map f run
 * by `fwd`; compares the analytic gradient in `grad` with central differences
 * at a few coordinates. */
typedef void (*fwd_fn)(tk_tensor *out, tk_tensor *in, void *ud);

static double loss_of(fwd_fn f, tk_tensor *out, tk_tensor *in, const float *r, int64_t nout, void *ud) {
    f(out, in, ud);
    double s = 0;
    for (int64_t i = 0; i < nout; i++) s += (double)r[i] * ((float *)out->data)[i];
    return s;
}

static int fd_check(fwd_fn f, tk_tensor *in, int64_t nin, tk_tensor *out, const float *r, int64_t nout,
                    const float *grad, void *ud, double h, double tol, const char *what) {
    int bad = 0;
    float *x = in->data;
    for (int64_t k = 0; k < nin; k += (nin > 40 ? nin / 37 + 1 : 1)) {
        float x0 = x[k];
        x[k] = (float)(x0 + h);
        double lp = loss_of(f, out, in, r, nout, ud);
        x[k] = (float)(x0 - h);
        double lm = loss_of(f, out, in, r, nout, ud);
        x[k] = x0;
        double fd = (lp - lm) / (2 * h);
        if (!close_to(grad[k], fd, tol, tol)) {
            if (bad++ < 3) fprintf(stderr, "  %s d/dx[%ld]: analytic %g vs fd %g\n", what, (long)k, grad[k], fd);
        }
    }
    return bad;
}

static void gelu_f(tk_tensor *o, tk_tensor *i, void *ud) { BE->gelu_fwd(CTX, o, i, *(int64_t *)ud); }
static void tanh_f(tk_tensor *o, tk_tensor *i, void *ud) { BE->tanh_fwd(CTX, o, i, *(int64_t *)ud); }

static void test_gelu_tanh(void) {
    for (int d = 0; d < 3; d++) {
        tk_dtype dt = FDT[d];
        int64_t n = 5000;
        tk_tensor x = mk_rand(dt, n, 5), o = mk(dt, n), t = mk(dt, n);
        TK_CHECK(BE->gelu_fwd(CTX, &o, &x, n) == TK_OK);
        TK_CHECK(BE->tanh_fwd(CTX, &t, &x, n) == TK_OK);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            double xi = get(&x, i);
            if (!close_to(get(&o, i), 0.5 * xi * (1 + erf(xi / sqrt(2.0))), tol_of(dt), 1e-6)) bad++;
            if (!close_to(get(&t, i), tanh(xi), tol_of(dt), 1e-6)) bad++;
        }
        TK_CHECK_EQ_INT(bad, 0);
        rm(&x); rm(&o); rm(&t);
    }
    int64_t n = 300;
    tk_tensor x = mk_rand(TK_F32, n, 4), o = mk(TK_F32, n), r = mk_rand(TK_F32, n, 1), g = mk(TK_F32, n);
    TK_CHECK(BE->gelu_bwd(CTX, &g, &x, &r, n) == TK_OK);
    TK_CHECK_EQ_INT(fd_check(gelu_f, &x, n, &o, r.data, n, g.data, &n, 1e-2, 2e-3, "gelu"), 0);
    TK_CHECK(BE->tanh_fwd(CTX, &o, &x, n) == TK_OK);
    TK_CHECK(BE->tanh_bwd(CTX, &g, &o, &r, n) == TK_OK);
    TK_CHECK_EQ_INT(fd_check(tanh_f, &x, n, &o, r.data, n, g.data, &n, 1e-2, 2e-3, "tanh"), 0);
    /* 16-bit backward agrees with f32 backward on the same values */
    tk_tensor xh = mk(TK_BF16, n), rh = mk(TK_BF16, n), gh = mk(TK_BF16, n), x32 = mk(TK_F32, n), r32 = mk(TK_F32, n);
    for (int64_t i = 0; i < n; i++) {
        set(&xh, i, get(&x, i)); set(&rh, i, get(&r, i));
        set(&x32, i, get(&xh, i)); set(&r32, i, get(&rh, i));
    }
    TK_CHECK(BE->gelu_bwd(CTX, &gh, &xh, &rh, n) == TK_OK);
    TK_CHECK(BE->gelu_bwd(CTX, &g, &x32, &r32, n) == TK_OK);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += get(&gh, i) != ref_bf2f(ref_f2bf(get(&g, i)));
    TK_CHECK_EQ_INT(bad, 0);
    rm(&x); rm(&o); rm(&r); rm(&g); rm(&xh); rm(&rh); rm(&gh); rm(&x32); rm(&r32);
}

/* ---- layernorm ------------------------------------------------------------------ */

typedef struct { tk_tensor *w, *b, *mean, *rstd; int64_t N, C; int which; tk_tensor *x; } ln_ud;
/* which: 0 vary input (in is x), 1 vary w (in is w), 2 vary b */
static void ln_f(tk_tensor *o, tk_tensor *in, void *p) {
    ln_ud *u = p;
    (void)in;
    BE->layernorm_fwd(CTX, o, u->mean, u->rstd, u->x, u->w, u->b, u->N, u->C, 1e-5f);
}

static void test_layernorm(void) {
    for (int d = 0; d < 3; d++) {
        tk_dtype dt = FDT[d];
        int64_t N = 37, C = 96;
        tk_tensor x = mk_rand(dt, N * C, 2), w = mk_rand(dt, C, 1), b = mk_rand(dt, C, 1), o = mk(dt, N * C);
        tk_tensor mean = mk(TK_F32, N), rstd = mk(TK_F32, N);
        for (int64_t j = 0; j < C; j++) set(&x, 5 * C + j, 3.0f + get(&x, 5 * C + j)); /* shifted row */
        TK_CHECK(BE->layernorm_fwd(CTX, &o, &mean, &rstd, &x, &w, &b, N, C, 1e-5f) == TK_OK);
        int bad = 0;
        for (int64_t r = 0; r < N; r++) {
            double m = 0, v = 0;
            for (int64_t j = 0; j < C; j++) m += get(&x, r * C + j);
            m /= C;
            for (int64_t j = 0; j < C; j++) v += pow(get(&x, r * C + j) - m, 2);
            double rs = 1 / sqrt(v / C + 1e-5);
            if (!close_to(((float *)mean.data)[r], m, 1e-5, 1e-6) || !close_to(((float *)rstd.data)[r], rs, 1e-5, 0)) bad++;
            for (int64_t j = 0; j < C; j++) {
                double ref = (get(&x, r * C + j) - m) * rs * get(&w, j) + get(&b, j);
                if (!close_to(get(&o, r * C + j), ref, tol_of(dt), 1e-5)) bad++;
            }
        }
        TK_CHECK_EQ_INT(bad, 0);
        rm(&x); rm(&w); rm(&b); rm(&o); rm(&mean); rm(&rstd);
    }
    /* backward by finite differences (f32), for din (overwrite and accumulate), dw, db */
    int64_t N = 6, C = 20;
    tk_tensor x = mk_rand(TK_F32, N * C, 2), w = mk_rand(TK_F32, C, 1), b = mk_rand(TK_F32, C, 1), o = mk(TK_F32, N * C);
    tk_tensor mean = mk(TK_F32, N), rstd = mk(TK_F32, N), r = mk_rand(TK_F32, N * C, 1);
    tk_tensor dx = mk(TK_F32, N * C), dw = mk(TK_F32, C), db = mk(TK_F32, C);
    BE->fill(CTX, &dw, 0.25f, C);
    BE->fill(CTX, &db, -0.5f, C);
    BE->fill(CTX, &dx, 1.0f, N * C);
    TK_CHECK(BE->layernorm_fwd(CTX, &o, &mean, &rstd, &x, &w, &b, N, C, 1e-5f) == TK_OK);
    TK_CHECK(BE->layernorm_bwd(CTX, &dx, &dw, &db, &r, &x, &w, &mean, &rstd, N, C, 1, NULL) == TK_OK);
    float *g = malloc(sizeof(float) * N * C);
    for (int64_t i = 0; i < N * C; i++) g[i] = ((float *)dx.data)[i] - 1.0f;
    for (int64_t i = 0; i < C; i++) {
        ((float *)dw.data)[i] -= 0.25f;
        ((float *)db.data)[i] += 0.5f;
    }
    ln_ud u = {&w, &b, &mean, &rstd, N, C, 0, &x};
    TK_CHECK_EQ_INT(fd_check(ln_f, &x, N * C, &o, r.data, N * C, g, &u, 1e-2, 3e-3, "ln dx"), 0);
    TK_CHECK_EQ_INT(fd_check(ln_f, &w, C, &o, r.data, N * C, dw.data, &u, 1e-2, 3e-3, "ln dw"), 0);
    TK_CHECK_EQ_INT(fd_check(ln_f, &b, C, &o, r.data, N * C, db.data, &u, 1e-2, 3e-3, "ln db"), 0);
    /* overwrite mode gives the same din as accumulate-into-zero */
    TK_CHECK(BE->layernorm_fwd(CTX, &o, &mean, &rstd, &x, &w, &b, N, C, 1e-5f) == TK_OK);
    TK_CHECK(BE->layernorm_bwd(CTX, &dx, &dw, &db, &r, &x, &w, &mean, &rstd, N, C, 0, NULL) == TK_OK);
    int bad = 0;
    for (int64_t i = 0; i < N * C; i++) bad += !close_to(((float *)dx.data)[i], g[i], 1e-5, 1e-6);
    TK_CHECK_EQ_INT(bad, 0);
    free(g);
    rm(&x); rm(&w); rm(&b); rm(&o); rm(&mean); rm(&rstd); rm(&r); rm(&dx); rm(&dw); rm(&db);
}

/* ---- softmax -------------------------------------------------------------------- */

typedef struct { tk_tensor *mask; int64_t B, NH, T; float scale; } sm_ud;
static void sm_f(tk_tensor *o, tk_tensor *in, void *p) {
    sm_ud *u = p;
    BE->softmax_fwd(CTX, o, in, u->mask, u->B, u->NH, u->T, u->scale);
}

static void test_softmax(void) {
    int64_t B = 3, NH = 2, T = 9, rows = B * NH * T;
    tk_tensor mask = mk(TK_I32, B * T);
    int32_t *mk_ = mask.data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) mk_[b * T + t] = t < T - 2 * b; /* [CLS] always kept */
    for (int d = 0; d < 3; d++) {
        tk_dtype dt = FDT[d];
        tk_tensor x = mk_rand(dt, rows * T, 8), o = mk(dt, rows * T);
        set(&x, 1, 1e30f * (dt != TK_F16)); /* huge logit: no overflow */
        TK_CHECK(BE->softmax_fwd(CTX, &o, &x, &mask, B, NH, T, 0.125f) == TK_OK);
        int bad = 0;
        for (int64_t r = 0; r < rows; r++) {
            int64_t b = r / (NH * T);
            double mx = -INFINITY, s = 0, z[64];
            for (int64_t j = 0; j < T; j++) {
                z[j] = 0.125 * get(&x, r * T + j) + (mk_[b * T + j] ? 0 : -3.4028234663852886e38);
                mx = fmax(mx, z[j]);
            }
            for (int64_t j = 0; j < T; j++) s += exp(z[j] - mx);
            for (int64_t j = 0; j < T; j++) {
                double ref = exp(z[j] - mx) / s, g = get(&o, r * T + j);
                if (!close_to(g, ref, tol_of(dt), 1e-7) || !isfinite(g)) bad++;
                if (!mk_[b * T + j] && g != 0) bad++;
            }
        }
        TK_CHECK_EQ_INT(bad, 0);
        rm(&x); rm(&o);
    }
    /* backward by finite differences */
    tk_tensor x = mk_rand(TK_F32, rows * T, 2), o = mk(TK_F32, rows * T), r = mk_rand(TK_F32, rows * T, 1);
    tk_tensor dx = mk(TK_F32, rows * T);
    sm_ud u = {&mask, B, NH, T, 0.7f};
    sm_f(&o, &x, &u);
    TK_CHECK(BE->softmax_bwd(CTX, &dx, &o, &r, rows, T, 0.7f) == TK_OK);
    TK_CHECK_EQ_INT(fd_check(sm_f, &x, rows * T, &o, r.data, rows * T, dx.data, &u, 1e-2, 2e-3, "softmax"), 0);
    /* no mask */
    sm_ud u2 = {NULL, B, NH, T, 1.0f};
    sm_f(&o, &x, &u2);
    double s = 0;
    for (int64_t j = 0; j < T; j++) s += ((float *)o.data)[j];
    TK_CHECK_NEAR(s, 1.0, 1e-6);
    TK_CHECK(((float *)o.data)[T - 1] > 0);
    rm(&x); rm(&o); rm(&r); rm(&dx); rm(&mask);
}

/* ---- cross-entropy ---------------------------------------------------------------- */

typedef struct { tk_tensor *labels, *losses; int64_t N, V; } xe_ud;
/* forward for fd: out holds losses (the fd loss weights them) */
static void xe_f(tk_tensor *o, tk_tensor *in, void *p) {
    xe_ud *u = p;
    BE->xent_fwd(CTX, o, NULL, in, u->labels, u->N, u->V);
}

static void test_xent(void) {
    int64_t N = 7, V = 11;
    tk_tensor labels = mk(TK_I32, N);
    int32_t *lab = labels.data;
    for (int64_t i = 0; i < N; i++) lab[i] = (int32_t)((i * 5) % V);
    lab[2] = -100;
    for (int d = 0; d < 3; d++) {
        tk_dtype dt = FDT[d];
        tk_tensor x = mk_rand(dt, N * V, 6), loss = mk(TK_F32, N), probs = mk(dt, N * V);
        set(&x, 0, 80.0f); /* large logit: stays finite */
        TK_CHECK(BE->xent_fwd(CTX, &loss, &probs, &x, &labels, N, V) == TK_OK);
        int bad = 0;
        for (int64_t r = 0; r < N; r++) {
            double mx = -INFINITY, s = 0;
            for (int64_t j = 0; j < V; j++) mx = fmax(mx, get(&x, r * V + j));
            for (int64_t j = 0; j < V; j++) s += exp(get(&x, r * V + j) - mx);
            double lse = mx + log(s);
            double ref = lab[r] < 0 ? 0 : lse - get(&x, r * V + lab[r]);
            if (!close_to(((float *)loss.data)[r], ref, 1e-5, 1e-5)) bad++;
            for (int64_t j = 0; j < V; j++)
                if (!close_to(get(&probs, r * V + j), exp(get(&x, r * V + j) - lse), tol_of(dt), 1e-7)) bad++;
        }
        TK_CHECK_EQ_INT(bad, 0);
        rm(&x); rm(&loss); rm(&probs);
    }
    /* backward: d/dlogits of scale * sum(losses) */
    tk_tensor x = mk_rand(TK_F32, N * V, 3), loss = mk(TK_F32, N), dx = mk(TK_F32, N * V);
    float ones[16], scale = 1.0f / 6;
    for (int i = 0; i < 16; i++) ones[i] = scale;
    TK_CHECK(BE->xent_bwd(CTX, &dx, &x, &labels, N, V, scale) == TK_OK);
    xe_ud u = {&labels, &loss, N, V};
    TK_CHECK_EQ_INT(fd_check(xe_f, &x, N * V, &loss, ones, N, dx.data, &u, 1e-2, 2e-3, "xent"), 0);
    int nz = 0;
    for (int64_t j = 0; j < V; j++) nz += ((float *)dx.data)[2 * V + j] != 0;
    TK_CHECK_EQ_INT(nz, 0);
    lab[4] = (int32_t)V; /* out of range: refused */
    TK_CHECK(BE->xent_fwd(CTX, &loss, NULL, &x, &labels, N, V) == TK_EINVAL);
    TK_CHECK(BE->xent_bwd(CTX, &dx, &x, &labels, N, V, 1.0f) == TK_EINVAL);
    rm(&x); rm(&loss); rm(&dx); rm(&labels);
}

/* ---- dropout ---------------------------------------------------------------------- */

static void test_dropout(void) {
    int64_t n = 200000;
    float p = 0.1f;
    tk_tensor x = mk_rand(TK_F32, n, 1), o = mk(TK_F32, n), o2 = mk(TK_F32, n), m = mk(TK_U8, n), m2 = mk(TK_U8, n);
    TK_CHECK(BE->dropout_fwd(CTX, &o, &m, &x, n, p, 42, 1000) == TK_OK);
    TK_CHECK(BE->dropout_fwd(CTX1, &o2, &m2, &x, n, p, 42, 1000) == TK_OK);
    TK_CHECK(memcmp(o.data, o2.data, (size_t)n * 4) == 0);
    TK_CHECK(memcmp(m.data, m2.data, (size_t)n) == 0);
    int64_t kept = 0, bad = 0;
    float sc = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; i++) {
        uint8_t k = ((uint8_t *)m.data)[i];
        kept += k;
        float want = k ? ((float *)x.data)[i] * sc : 0.0f;
        bad += ((float *)o.data)[i] != want;
        bad += k != tk_dropout_keep(tk_dropout_key(42), 1000 + (uint64_t)i, p);
    }
    TK_CHECK_EQ_INT(bad, 0);
    double rate = 1.0 - (double)kept / n; /* sd of the rate ~ 0.00067 */
    TK_CHECK_NEAR(rate, p, 0.004);
    /* an offset shifts the stream: (seed, 1000 + 7) element i is (seed, 1000) element i + 7 */
    TK_CHECK(BE->dropout_fwd(CTX, &o2, &m2, &x, n - 7, p, 42, 1007) == TK_OK);
    TK_CHECK(memcmp((uint8_t *)m.data + 7, m2.data, (size_t)(n - 7)) == 0);
    /* another seed gives another mask */
    TK_CHECK(BE->dropout_fwd(CTX, &o2, &m2, &x, n, p, 43, 1000) == TK_OK);
    TK_CHECK(memcmp(m.data, m2.data, (size_t)n) != 0);
    /* backward applies the same mask and scale */
    TK_CHECK(BE->dropout_bwd(CTX, &o2, &x, n, p, 42, 1000) == TK_OK);
    TK_CHECK(memcmp(o.data, o2.data, (size_t)n * 4) == 0);
    /* the kernel's integer threshold keeps exactly what tk_dropout_keep keeps,
     * at rates whose p * 2^24 is and is not a whole number, and near 0 and 1 */
    const float ps[] = {0.5f, 0.3f, 1.0f / 3.0f, 0.9f, 1e-7f, 0.99999994f, 1.0f, 3.0f / 16777216.0f};
    for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) {
        TK_CHECK(BE->dropout_fwd(CTX, &o2, &m2, &x, n, ps[j], 5, 123) == TK_OK);
        int64_t off = 0;
        for (int64_t i = 0; i < n; i++)
            off += ((uint8_t *)m2.data)[i] != tk_dropout_keep(tk_dropout_key(5), 123 + (uint64_t)i, ps[j]);
        TK_CHECK_EQ_INT(off, 0);
    }
    /* p = 0 copies */
    TK_CHECK(BE->dropout_fwd(CTX, &o2, &m2, &x, n, 0.0f, 42, 0) == TK_OK);
    TK_CHECK(memcmp(o2.data, x.data, (size_t)n * 4) == 0);
    /* 16-bit in and out */
    tk_tensor xh = mk_rand(TK_F16, 1000, 1), oh = mk(TK_F16, 1000);
    TK_CHECK(BE->dropout_fwd(CTX, &oh, NULL, &xh, 1000, 0.5f, 7, 3) == TK_OK);
    for (int64_t i = 0; i < 1000; i++)
        bad += get(&oh, i) != (tk_dropout_keep(tk_dropout_key(7), 3 + (uint64_t)i, 0.5f) ? get(&xh, i) * 2 : 0.0f);
    TK_CHECK_EQ_INT(bad, 0);
    rm(&x); rm(&o); rm(&o2); rm(&m); rm(&m2); rm(&xh); rm(&oh);
}

/* Pinned values of the generator, so a change to tk_ops_spec.h (which the
 * cuda kernels must follow) cannot slip by. Computed from the formula in the
 * spec's comment, independently of tk_ops_spec.h. */
static uint64_t mix_ref(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static void test_dropout_spec(void) {
    uint64_t seeds[3] = {0, 42, 0xdeadbeefcafeULL};
    int bad = 0;
    for (int s = 0; s < 3; s++) {
        uint64_t key = mix_ref(seeds[s] ^ 0x6A09E667F3BCC909ULL);
        TK_CHECK(key == tk_dropout_key(seeds[s]));
        for (uint64_t i = 0; i < 1000; i += 37) {
            uint64_t h = mix_ref(key + i * 0x9E3779B97F4A7C15ULL);
            float u = (float)ldexp((double)(h >> 40), -24);
            bad += u != tk_dropout_u(key, i);
        }
    }
    TK_CHECK_EQ_INT(bad, 0);
    /* splitmix64's published first output for state 0 after one increment */
    TK_CHECK(tk_spec_mix64(0x9E3779B97F4A7C15ULL) == 0xE220A8397B1DCDAFULL);
}

/* ---- rows: bias_grad, heads, gather/scatter, embed ---------------------------------- */

static void test_bias_grad(void) {
    for (int d = 0; d < 3; d++) {
        tk_dtype dt = FDT[d];
        int64_t N = 300, C = 150;
        tk_tensor dout = mk_rand(dt, N * C, 1), db = mk_rand(dt, C, 1), db1 = mk(dt, C);
        memcpy(db1.data, db.data, (size_t)C * (dt == TK_F32 ? 4 : 2));
        double *ref = calloc((size_t)C, sizeof(double));
        for (int64_t j = 0; j < C; j++) ref[j] = get(&db, j);
        for (int64_t r = 0; r < N; r++)
            for (int64_t j = 0; j < C; j++) ref[j] += get(&dout, r * C + j);
        TK_CHECK(BE->bias_grad(CTX, &db, &dout, N, C) == TK_OK);
        TK_CHECK(BE->bias_grad(CTX1, &db1, &dout, N, C) == TK_OK);
        int bad = 0;
        for (int64_t j = 0; j < C; j++) bad += !close_to(get(&db, j), ref[j], tol_of(dt), 1e-4);
        TK_CHECK_EQ_INT(bad, 0);
        TK_CHECK(memcmp(db.data, db1.data, (size_t)C * (dt == TK_F32 ? 4 : 2)) == 0);
        free(ref);
        rm(&dout); rm(&db); rm(&db1);
    }
}

static void test_heads(void) {
    int64_t B = 2, T = 5, NH = 3, HS = 4, n = B * T * NH * HS;
    tk_tensor x = mk_rand(TK_F32, n, 1), s = mk(TK_F32, n), back = mk(TK_F32, n), h16 = mk(TK_BF16, n);
    TK_CHECK(BE->split_heads(CTX, &s, &x, B, T, NH, HS) == TK_OK);
    int bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < NH; h++)
                for (int64_t e = 0; e < HS; e++)
                    bad += get(&s, ((b * NH + h) * T + t) * HS + e) != get(&x, ((b * T + t) * NH + h) * HS + e);
    TK_CHECK_EQ_INT(bad, 0);
    TK_CHECK(BE->merge_heads(CTX, &back, &s, B, T, NH, HS) == TK_OK);
    TK_CHECK(memcmp(back.data, x.data, (size_t)n * 4) == 0);
    TK_CHECK(BE->split_heads(CTX, &h16, &x, B, T, NH, HS) == TK_OK); /* converting copy */
    for (int64_t i = 0; i < n; i++) bad += get(&h16, i) != ref_bf2f(ref_f2bf(get(&s, i)));
    TK_CHECK_EQ_INT(bad, 0);
    rm(&x); rm(&s); rm(&back); rm(&h16);
}

static void test_gather_scatter_embed(void) {
    int64_t rows = 10, C = 70, n = 40000 / 70 + 50;
    tk_tensor table = mk_rand(TK_F32, rows * C, 1), idx = mk(TK_I32, n), out = mk(TK_F32, n * C);
    table.ndim = 2; table.shape[0] = rows; table.shape[1] = C;
    int32_t *ix = idx.data;
    for (int64_t i = 0; i < n; i++) ix[i] = (int32_t)((i * 7 + i / 3) % rows); /* many duplicates */
    TK_CHECK(BE->embed_fwd(CTX, &out, &idx, &table, n, C) == TK_OK);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += memcmp((float *)out.data + i * C, (float *)table.data + ix[i] * C, C * 4) != 0;
    TK_CHECK(BE->gather_rows(CTX, &out, &table, &idx, n, C) == TK_OK);
    for (int64_t i = 0; i < n; i++) bad += memcmp((float *)out.data + i * C, (float *)table.data + ix[i] * C, C * 4) != 0;
    TK_CHECK_EQ_INT(bad, 0);
    /* backward: accumulates, sums duplicates, same bits for 1 or many threads */
    tk_tensor dout = mk_rand(TK_F32, n * C, 1), dt = mk_rand(TK_F32, rows * C, 1), dt1 = mk(TK_F32, rows * C);
    dt.ndim = dt1.ndim = 2; dt.shape[0] = dt1.shape[0] = rows; dt.shape[1] = dt1.shape[1] = C;
    memcpy(dt1.data, dt.data, (size_t)(rows * C * 4));
    double *ref = malloc(sizeof(double) * rows * C);
    for (int64_t i = 0; i < rows * C; i++) ref[i] = ((float *)dt.data)[i];
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < C; j++) ref[ix[i] * C + j] += ((float *)dout.data)[i * C + j];
    TK_CHECK(BE->embed_bwd(CTX, &dt, &idx, &dout, n, C, NULL, NULL) == TK_OK);
    TK_CHECK(BE->scatter_add_rows(CTX1, &dt1, &dout, &idx, n, C) == TK_OK);
    for (int64_t i = 0; i < rows * C; i++) bad += !close_to(((float *)dt.data)[i], ref[i], 1e-5, 1e-4);
    TK_CHECK_EQ_INT(bad, 0);
    TK_CHECK(memcmp(dt.data, dt1.data, (size_t)(rows * C * 4)) == 0);
    /* 16-bit table */
    tk_tensor th = mk(TK_F16, rows * C), oh = mk(TK_F32, n * C);
    th.ndim = 2; th.shape[0] = rows; th.shape[1] = C;
    for (int64_t i = 0; i < rows * C; i++) set(&th, i, ((float *)table.data)[i]);
    TK_CHECK(BE->embed_fwd(CTX, &oh, &idx, &th, n, C) == TK_OK);
    for (int64_t i = 0; i < n * C; i++) bad += get(&oh, i) != get(&th, ix[i / C] * C + i % C);
    TK_CHECK_EQ_INT(bad, 0);
    /* out-of-range ids are refused before anything is written */
    ix[5] = (int32_t)rows;
    TK_CHECK(BE->embed_fwd(CTX, &out, &idx, &table, n, C) == TK_EINVAL);
    TK_CHECK(BE->embed_bwd(CTX, &dt, &idx, &dout, n, C, NULL, NULL) == TK_EINVAL);
    ix[5] = -1;
    TK_CHECK(BE->gather_rows(CTX, &out, &table, &idx, n, C) == TK_EINVAL);
    free(ref);
    rm(&table); rm(&idx); rm(&out); rm(&dout); rm(&dt); rm(&dt1); rm(&th); rm(&oh);
}

/* ---- sumsq ---------------------------------------------------------------------------- */

static void test_sumsq(void) {
    int64_t n = 100003;
    tk_tensor x = mk_rand(TK_BF16, n, 2), out = mk(TK_F32, 1), out1 = mk(TK_F32, 1);
    double ref = 0;
    for (int64_t i = 0; i < n; i++) ref += (double)get(&x, i) * get(&x, i);
    TK_CHECK(BE->sumsq(CTX, &out, &x, n, 0) == TK_OK);
    TK_CHECK(close_to(((float *)out.data)[0], ref, 1e-5, 0));
    TK_CHECK(BE->sumsq(CTX, &out, &x, n, 1) == TK_OK);
    TK_CHECK(close_to(((float *)out.data)[0], 2 * ref, 1e-5, 0));
    set(&x, 77, INFINITY);
    TK_CHECK(BE->sumsq(CTX1, &out1, &x, n, 0) == TK_OK);
    TK_CHECK(!isfinite(((float *)out1.data)[0]));
    set(&x, 77, NAN);
    TK_CHECK(BE->sumsq(CTX, &out1, &x, n, 0) == TK_OK);
    TK_CHECK(isnan(((float *)out1.data)[0]));
    rm(&x); rm(&out); rm(&out1);
}

/* ---- AdamW ------------------------------------------------------------------------------ */

static void test_adamw_hand_step(void) {
    /* p=1, g=0.5 (grad_scale 0.5 on a stored 1.0), lr=0.1, wd=0.01, betas .9/.999:
     * m = 0.05, v = 0.00025, mhat = 0.5, vhat = 0.25; p = 1*(1-0.001) - 0.1*0.5/(0.5+1e-8) = 0.899 */
    tk_tensor p = mk(TK_F32, 1), g = mk(TK_F32, 1), m = mk(TK_F32, 1), v = mk(TK_F32, 1);
    ((float *)p.data)[0] = 1.0f;
    ((float *)g.data)[0] = 1.0f;
    tk_adamw_hp hp = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                      .grad_scale = 0.5f, .step = 1};
    TK_CHECK(BE->adamw(CTX, &p, &g, &m, &v, 1, &hp) == TK_OK);
    /* hp holds floats: 1 - 0.999f is 0.00099998713, hence the 2e-5 relative slack on v */
    TK_CHECK(close_to(((float *)m.data)[0], 0.05, 1e-6, 0));
    TK_CHECK(close_to(((float *)v.data)[0], 0.00025, 2e-5, 0));
    TK_CHECK_NEAR(((float *)p.data)[0], 0.899, 1e-6);
    /* step 2 with g = -0.5: m = .045-.05 = -0.005 ... hand values in double */
    ((float *)g.data)[0] = -1.0f;
    hp.step = 2;
    TK_CHECK(BE->adamw(CTX, &p, &g, &m, &v, 1, &hp) == TK_OK);
    double m2 = 0.9 * 0.05 + 0.1 * -0.5, v2 = 0.999 * 0.00025 + 0.001 * 0.25;
    double p2 = 0.899 * (1 - 0.001) - 0.1 * (m2 / (1 - 0.81)) / (sqrt(v2 / (1 - 0.999 * 0.999)) + 1e-8);
    TK_CHECK(close_to(((float *)m.data)[0], m2, 1e-5, 1e-9));
    TK_CHECK(close_to(((float *)v.data)[0], v2, 2e-5, 0));
    TK_CHECK_NEAR(((float *)p.data)[0], p2, 2e-6);
    rm(&p); rm(&g); rm(&m); rm(&v);
}

static void test_adamw_many_and_16bit_grad(void) {
    int64_t n = 50000;
    tk_tensor p = mk_rand(TK_F32, n, 1), m = mk(TK_F32, n), v = mk(TK_F32, n), g = mk(TK_BF16, n);
    double *rp = malloc(sizeof(double) * n), *rm_ = calloc((size_t)n, sizeof(double)), *rv = calloc((size_t)n, sizeof(double));
    for (int64_t i = 0; i < n; i++) rp[i] = ((float *)p.data)[i];
    tk_adamw_hp hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .weight_decay = 0.1f, .grad_scale = 0.25f};
    for (int s = 1; s <= 3; s++) {
        for (int64_t i = 0; i < n; i++) set(&g, i, frand());
        hp.step = s;
        TK_CHECK(BE->adamw(CTX, &p, &g, &m, &v, n, &hp) == TK_OK);
        for (int64_t i = 0; i < n; i++) {
            double gi = get(&g, i) * 0.25;
            rm_[i] = 0.9 * rm_[i] + 0.1 * gi;
            rv[i] = 0.999 * rv[i] + 0.001 * gi * gi;
            rp[i] = rp[i] * (1 - 1e-4) - 1e-3 * (rm_[i] / (1 - pow(0.9, s))) / (sqrt(rv[i] / (1 - pow(0.999, s))) + 1e-6);
        }
    }
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += !close_to(((float *)p.data)[i], rp[i], 1e-6, 1e-6);
    TK_CHECK_EQ_INT(bad, 0);
    free(rp); free(rm_); free(rv);
    rm(&p); rm(&m); rm(&v); rm(&g);
}

static void test_q8_codes(void) {
    /* round trips: every code decodes and re-encodes to itself */
    int bad = 0;
    for (int q = -127; q <= 127; q++) bad += tk_q8_encode_m(tk_q8_decode_m((int8_t)q, 0.37f), 0.37f) != q;
    for (int q = 0; q <= 255; q++) bad += tk_q8_encode_v(tk_q8_decode_v((uint8_t)q, 2.5e-3f), 2.5e-3f) != q;
    TK_CHECK_EQ_INT(bad, 0);
    TK_CHECK(tk_q8_encode_m(-0.37f, 0.37f) == -127 && tk_q8_encode_v(2.5e-3f, 2.5e-3f) == 255);
    TK_CHECK(tk_q8_encode_m(1.0f, 0.0f) == 0 && tk_q8_decode_v(0, 1.0f) == 0.0f);
    /* error of sqrt(v) relative to sqrt(scale) stays under half a code step */
    double worst = 0;
    for (int i = 1; i <= 10000; i++) {
        float v = 1e-3f * (float)i / 10000.0f;
        double e = fabs(sqrt(tk_q8_decode_v(tk_q8_encode_v(v, 1e-3f), 1e-3f)) - sqrt(v)) / sqrt(1e-3);
        worst = fmax(worst, e);
    }
    TK_CHECK(worst < 1.0 / 255);
}

static void test_adamw8_tracks_adamw(void) {
    int64_t n = 3 * TK_Q8_BLOCK + 77; /* a partial last block */
    int64_t nb = (n + TK_Q8_BLOCK - 1) / TK_Q8_BLOCK;
    tk_tensor p = mk_rand(TK_F32, n, 1), p8 = mk(TK_F32, n), m = mk(TK_F32, n), v = mk(TK_F32, n), g = mk(TK_F32, n);
    tk_tensor mq = mk(TK_I8, n), vq = mk(TK_U8, n), ms = mk(TK_F32, nb), vs = mk(TK_F32, nb);
    memcpy(p8.data, p.data, (size_t)n * 4);
    float *p0 = malloc(sizeof(float) * n);
    memcpy(p0, p.data, (size_t)n * 4);
    tk_adamw_hp hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .grad_scale = 1.0f};
    for (int s = 1; s <= 20; s++) {
        for (int64_t i = 0; i < n; i++) ((float *)g.data)[i] = frand() * (i < TK_Q8_BLOCK ? 1e-3f : 1.0f) + 0.3f * ((float *)p.data)[i];
        hp.step = s;
        TK_CHECK(BE->adamw(CTX, &p, &g, &m, &v, n, &hp) == TK_OK);
        TK_CHECK(BE->adamw8(CTX, &p8, &g, &mq, &ms, &vq, &vs, n, &hp) == TK_OK);
    }
    /* the parameters move the same way: the 8-bit drift is small next to the total move */
    double move = 0, drift = 0;
    for (int64_t i = 0; i < n; i++) {
        move += fabs(((float *)p.data)[i] - p0[i]);
        drift += fabs(((float *)p8.data)[i] - ((float *)p.data)[i]);
    }
    TK_CHECK_MSG(drift < 0.05 * move, "drift %g move %g", drift, move);
    /* scales are the block absmax of the moments */
    for (int64_t b = 0; b < nb; b++) {
        float mx = 0;
        for (int64_t i = b * TK_Q8_BLOCK; i < n && i < (b + 1) * TK_Q8_BLOCK; i++) mx = fmaxf(mx, fabsf(((float *)m.data)[i]));
        TK_CHECK(close_to(((float *)ms.data)[b], mx, 0.05, 0));
    }
    free(p0);
    rm(&p); rm(&p8); rm(&m); rm(&v); rm(&g); rm(&mq); rm(&vq); rm(&ms); rm(&vs);
}

/* Ops whose output may be their input (the model runs some in place) give
 * the same bits as out of place. */
static void test_in_place(void) {
    for (int d = 0; d < 3; d++) {
        tk_dtype dt = FDT[d];
        int64_t N = 9, V = 13, n = N * V;
        size_t bytes = (size_t)n * (dt == TK_F32 ? 4 : 2);
        tk_tensor x = mk_rand(dt, n, 4), o = mk(dt, n), io = mk(dt, n), dd = mk_rand(dt, n, 1), lab = mk(TK_I32, N);
        for (int64_t i = 0; i < N; i++) ((int32_t *)lab.data)[i] = (int32_t)(i % V);
#define SAME(call_out, call_in) do { memcpy(io.data, x.data, bytes); \
        TK_CHECK((call_out) == TK_OK); TK_CHECK((call_in) == TK_OK); \
        TK_CHECK(memcmp(o.data, io.data, bytes) == 0); } while (0)
        SAME(BE->gelu_fwd(CTX, &o, &x, n), BE->gelu_fwd(CTX, &io, &io, n));
        SAME(BE->gelu_bwd(CTX, &o, &x, &dd, n), BE->gelu_bwd(CTX, &io, &io, &dd, n));
        SAME(BE->tanh_fwd(CTX, &o, &x, n), BE->tanh_fwd(CTX, &io, &io, n));
        SAME(BE->dropout_fwd(CTX, &o, NULL, &x, n, 0.3f, 5, 9), BE->dropout_fwd(CTX, &io, NULL, &io, n, 0.3f, 5, 9));
        SAME(BE->add(CTX, &o, &x, &dd, n), BE->add(CTX, &io, &io, &dd, n));
        SAME(BE->xent_bwd(CTX, &o, &x, &lab, N, V, 0.5f), BE->xent_bwd(CTX, &io, &io, &lab, N, V, 0.5f));
        SAME(BE->softmax_bwd(CTX, &o, &dd, &x, N, V, 0.5f), BE->softmax_bwd(CTX, &io, &dd, &io, N, V, 0.5f));
        SAME(BE->cast(CTX, &o, &x, n), BE->cast(CTX, &io, &io, n));
#undef SAME
        rm(&x); rm(&o); rm(&io); rm(&dd); rm(&lab);
    }
}

/* 16-bit storage is only storage: an op on 16-bit tensors gives the f32
 * op's result on the same (already rounded) values, rounded once. */
static tk_tensor widen(const tk_tensor *t, int64_t n) {
    tk_tensor w = mk(TK_F32, n);
    for (int64_t i = 0; i < n; i++) set(&w, i, get(t, i));
    return w;
}
static int same_rounded(const tk_tensor *t16, const tk_tensor *t32, int64_t n) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float r = get(t32, i);
        float want = t16->dtype == TK_F16 ? ref_h2f(ref_f2h(r)) : ref_bf2f(ref_f2bf(r));
        if (get(t16, i) != want && bad++ < 3)
            fprintf(stderr, "  [%ld] %g vs %g\n", (long)i, get(t16, i), want);
    }
    return bad;
}

static void test_16bit_backwards(void) {
    for (int d = 1; d < 3; d++) {
        tk_dtype dt = FDT[d];
        int64_t N = 11, C = 40, n = N * C;
        tk_tensor x = mk_rand(dt, n, 3), dy = mk_rand(dt, n, 1), w = mk_rand(dt, C, 1), b = mk_rand(dt, C, 1);
        tk_tensor x3 = widen(&x, n), dy3 = widen(&dy, n), w3 = widen(&w, C), b3 = widen(&b, C);
        tk_tensor mean = mk(TK_F32, N), rstd = mk(TK_F32, N), y = mk(dt, n), y3 = mk(TK_F32, n);
        tk_tensor o = mk(dt, n), o3 = mk(TK_F32, n), dw = mk(TK_F32, C), db = mk(TK_F32, C);
        TK_CHECK(BE->layernorm_fwd(CTX, &y, &mean, &rstd, &x, &w, &b, N, C, 1e-5f) == TK_OK);
        TK_CHECK(BE->layernorm_fwd(CTX, &y3, &mean, &rstd, &x3, &w3, &b3, N, C, 1e-5f) == TK_OK);
        TK_CHECK_EQ_INT(same_rounded(&y, &y3, n), 0);
        TK_CHECK(BE->layernorm_bwd(CTX, &o, &dw, &db, &dy, &x, &w, &mean, &rstd, N, C, 0, NULL) == TK_OK);
        TK_CHECK(BE->layernorm_bwd(CTX, &o3, &dw, &db, &dy3, &x3, &w3, &mean, &rstd, N, C, 0, NULL) == TK_OK);
        TK_CHECK_EQ_INT(same_rounded(&o, &o3, n), 0);
        TK_CHECK(BE->softmax_bwd(CTX, &o, &x, &dy, N, C, 0.5f) == TK_OK);
        TK_CHECK(BE->softmax_bwd(CTX, &o3, &x3, &dy3, N, C, 0.5f) == TK_OK);
        TK_CHECK_EQ_INT(same_rounded(&o, &o3, n), 0);
        tk_tensor lab = mk(TK_I32, N);
        for (int64_t i = 0; i < N; i++) ((int32_t *)lab.data)[i] = (int32_t)(i * 3 % C) - (i == 4 ? 100 : 0);
        TK_CHECK(BE->xent_bwd(CTX, &o, &x, &lab, N, C, 0.25f) == TK_OK);
        TK_CHECK(BE->xent_bwd(CTX, &o3, &x3, &lab, N, C, 0.25f) == TK_OK);
        TK_CHECK_EQ_INT(same_rounded(&o, &o3, n), 0);
        TK_CHECK(BE->tanh_bwd(CTX, &o, &x, &dy, n) == TK_OK);
        TK_CHECK(BE->tanh_bwd(CTX, &o3, &x3, &dy3, n) == TK_OK);
        TK_CHECK_EQ_INT(same_rounded(&o, &o3, n), 0);
        TK_CHECK(BE->dropout_bwd(CTX, &o, &dy, n, 0.2f, 11, 0) == TK_OK);
        TK_CHECK(BE->dropout_bwd(CTX, &o3, &dy3, n, 0.2f, 11, 0) == TK_OK);
        TK_CHECK_EQ_INT(same_rounded(&o, &o3, n), 0);
        TK_CHECK(BE->softmax_fwd(CTX, &o, &x, NULL, 1, 1, N, 0.3f) == TK_OK); /* N rows of N, no mask */
        TK_CHECK(BE->softmax_fwd(CTX, &o3, &x3, NULL, 1, 1, N, 0.3f) == TK_OK);
        TK_CHECK_EQ_INT(same_rounded(&o, &o3, N * N), 0);
        rm(&x); rm(&dy); rm(&w); rm(&b); rm(&x3); rm(&dy3); rm(&w3); rm(&b3); rm(&mean); rm(&rstd);
        rm(&y); rm(&y3); rm(&o); rm(&o3); rm(&dw); rm(&db); rm(&lab);
    }
}

/* ---- through the device: tk_dev_new + tk_op_* ------------------------------------------ */

static void test_scatter_into_3d(void) {
    /* a [B,T,C] gradient takes ids over all B*T rows */
    tk_tensor din = mk(TK_F32, 2 * 3 * 4), dout = mk_rand(TK_F32, 2 * 4, 1), idx = mk(TK_I32, 2);
    din.ndim = 3; din.shape[0] = 2; din.shape[1] = 3; din.shape[2] = 4;
    ((int32_t *)idx.data)[0] = 0;
    ((int32_t *)idx.data)[1] = 5;
    TK_CHECK(BE->scatter_add_rows(CTX, &din, &dout, &idx, 2, 4) == TK_OK);
    TK_CHECK(get(&din, 5 * 4 + 3) == get(&dout, 4 + 3));
    ((int32_t *)idx.data)[1] = 6;
    TK_CHECK(BE->scatter_add_rows(CTX, &din, &dout, &idx, 2, 4) == TK_EINVAL);
    rm(&din); rm(&dout); rm(&idx);
}

static void test_converters_match_dtype_c(void) {
    int bad = 0;
    tk_tensor f = mk(TK_F32, 1), h = mk(TK_F16, 1), b = mk(TK_BF16, 1);
    for (int i = 0; i < 20000; i++) {
        float v = frand() * (float)ldexp(1.0, (i % 60) - 30);
        ((float *)f.data)[0] = v;
        BE->cast(CTX, &h, &f, 1);
        BE->cast(CTX, &b, &f, 1);
        bad += ((uint16_t *)h.data)[0] != tk_f32_to_f16(v);
        bad += ((uint16_t *)b.data)[0] != tk_f32_to_bf16(v);
        BE->cast(CTX, &f, &h, 1);
        bad += ((float *)f.data)[0] != tk_f16_to_f32(((uint16_t *)h.data)[0]);
    }
    TK_CHECK_EQ_INT(bad, 0);
    rm(&f); rm(&h); rm(&b);
}

/* A dense + bias + GELU + LayerNorm + cross-entropy chain through the public
 * API on a cpu device, against the same arithmetic done here in double. */
static void test_device_chain(void) {
    tk_err err = {0};
    tk_dev_opts o = {.kind = TK_DEV_CPU, .threads = 2};
    tk_dev *d = tk_dev_new(&o, &err);
    TK_CHECK_MSG(d != NULL, "%s", err.msg);
    if (!d) return;
    enum { N = 6, K = 8, C = 5 };
    tk_tensor x = {0}, w = {0}, bias = {0}, h = {0}, g = {0}, y = {0}, lw = {0}, lb = {0}, mean = {0}, rstd = {0};
    tk_tensor lab = {0}, loss = {0};
    int64_t sx[2] = {N, K}, sw[2] = {K, C}, sc[1] = {C}, sh[2] = {N, C}, sn[1] = {N};
    TK_CHECK(tk_tensor_alloc(d, &x, TK_F32, 2, sx, TK_CAT_ACT, "x", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &w, TK_BF16, 2, sw, TK_CAT_PARAM, "dense.weight", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &bias, TK_F32, 1, sc, TK_CAT_PARAM, "dense.bias", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &h, TK_F32, 2, sh, TK_CAT_ACT, "dense", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &g, TK_F32, 2, sh, TK_CAT_ACT, "gelu", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &y, TK_F32, 2, sh, TK_CAT_ACT, "ln", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &lw, TK_F32, 1, sc, TK_CAT_PARAM, "ln.weight", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &lb, TK_F32, 1, sc, TK_CAT_PARAM, "ln.bias", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &mean, TK_F32, 1, sn, TK_CAT_ACT, "ln.mean", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &rstd, TK_F32, 1, sn, TK_CAT_ACT, "ln.rstd", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &lab, TK_I32, 1, sn, TK_CAT_INPUT, "labels", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &loss, TK_F32, 1, sn, TK_CAT_ACT, "loss", &err) == TK_OK);
    float hx[N * K], hw[K * C], hb[C], hlw[C], hlb[C], out[N];
    int32_t hl[N];
    for (int i = 0; i < N * K; i++) hx[i] = frand();
    for (int i = 0; i < K * C; i++) hw[i] = frand();
    for (int i = 0; i < C; i++) { hb[i] = frand(); hlw[i] = 1 + 0.1f * frand(); hlb[i] = 0.1f * frand(); }
    for (int i = 0; i < N; i++) hl[i] = i == 3 ? -100 : i % C;
    TK_CHECK(tk_tensor_write_f32(d, &x, hx, &err) == TK_OK);
    TK_CHECK(tk_tensor_write_f32(d, &w, hw, &err) == TK_OK);
    TK_CHECK(tk_tensor_write_f32(d, &bias, hb, &err) == TK_OK);
    TK_CHECK(tk_tensor_write_f32(d, &lw, hlw, &err) == TK_OK);
    TK_CHECK(tk_tensor_write_f32(d, &lb, hlb, &err) == TK_OK);
    TK_CHECK(tk_tensor_write(d, &lab, hl, &err) == TK_OK);
    TK_CHECK(tk_op_gemm(d, &h, &x, &w, &bias, &(tk_gemm){ .m = N, .n = C, .k = K, .batch = 1, .alpha = 1.0f }) == TK_OK);
    TK_CHECK(tk_op_gelu_fwd(d, &g, &h, N * C) == TK_OK);
    TK_CHECK(tk_op_layernorm_fwd(d, &y, &mean, &rstd, &g, &lw, &lb, N, C, 1e-12f) == TK_OK);
    TK_CHECK(tk_op_xent_fwd(d, &loss, NULL, &y, &lab, N, C) == TK_OK);
    TK_CHECK(tk_tensor_read_f32(d, &loss, out, &err) == TK_OK);
    int bad = 0;
    for (int r = 0; r < N; r++) {
        double z[C], m = 0, v = 0, mx = -1e300, s = 0;
        for (int j = 0; j < C; j++) {
            double a = hb[j];
            for (int k = 0; k < K; k++) a += (double)hx[r * K + k] * ref_bf2f(ref_f2bf(hw[k * C + j]));
            z[j] = 0.5 * a * (1 + erf(a / sqrt(2.0)));
            m += z[j] / C;
        }
        for (int j = 0; j < C; j++) v += (z[j] - m) * (z[j] - m) / C;
        for (int j = 0; j < C; j++) { z[j] = (z[j] - m) / sqrt(v + 1e-12) * hlw[j] + hlb[j]; mx = fmax(mx, z[j]); }
        for (int j = 0; j < C; j++) s += exp(z[j] - mx);
        double ref = hl[r] < 0 ? 0 : mx + log(s) - z[hl[r]];
        if (!close_to(out[r], ref, 1e-4, 1e-5)) {
            if (bad++ < 3) fprintf(stderr, "  row %d: %g vs %g\n", r, out[r], ref);
        }
    }
    TK_CHECK_EQ_INT(bad, 0);
    tk_cost cost;
    tk_dev_cost_get(d, &cost);
    TK_CHECK(cost.n_ops == 4 && cost.flops > 2.0 * N * C * K);
    tk_tensor *all[] = {&x, &w, &bias, &h, &g, &y, &lw, &lb, &mean, &rstd, &lab, &loss};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) tk_tensor_free(d, all[i]);
    tk_dev_destroy(&d);
    TK_CHECK(d == NULL);
}

/* ---- --torch DIR: the PyTorch comparison's runner ------------------------------------------
 * tests/gpu/test_cpu_ops_torch.py writes DIR/in.bin, runs this binary with
 * --torch DIR, and compares DIR/out.bin with torch's results. Both files are a
 * sequence of records: name (32 bytes, NUL padded), kind (i32: 0 f32, 1 i32),
 * count (i64), then count little-endian elements. */

typedef struct { char name[32]; int32_t kind; int64_t n; void *data; } rec;
typedef struct { rec r[64]; int n; } recs;

static int recs_read(recs *rs, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    rs->n = 0;
    rec r;
    while (rs->n < 64 && fread(r.name, 32, 1, f) == 1) {
        if (fread(&r.kind, 4, 1, f) != 1 || fread(&r.n, 8, 1, f) != 1 || r.n < 0) break;
        r.data = malloc((size_t)(r.n ? r.n : 1) * 4);
        if (!r.data || fread(r.data, 4, (size_t)r.n, f) != (size_t)r.n) { free(r.data); break; }
        rs->r[rs->n++] = r;
    }
    fclose(f);
    return 0;
}

static tk_tensor in_t(recs *rs, const char *name) {
    tk_tensor t;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < rs->n; i++)
        if (strcmp(rs->r[i].name, name) == 0) {
            t.data = rs->r[i].data;
            t.shape[0] = rs->r[i].n;
            t.ndim = 1;
            t.dtype = rs->r[i].kind ? TK_I32 : TK_F32;
        }
    if (!t.data) fprintf(stderr, "--torch: input %s missing\n", name);
    return t;
}

static void out_w(FILE *f, const char *name, const tk_tensor *t, int64_t n) {
    char nm[32] = {0};
    snprintf(nm, sizeof nm, "%s", name);
    int32_t kind = 0;
    fwrite(nm, 32, 1, f);
    fwrite(&kind, 4, 1, f);
    fwrite(&n, 8, 1, f);
    fwrite(t->data, 4, (size_t)n, f);
}

static int torch_io(const char *dir) {
    char path[4096];
    recs rs;
    snprintf(path, sizeof path, "%s/in.bin", dir);
    if (recs_read(&rs, path) != 0) { fprintf(stderr, "--torch: cannot read %s\n", path); return 2; }
    snprintf(path, sizeof path, "%s/out.bin", dir);
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "--torch: cannot write %s\n", path); return 2; }
    tk_tensor dims = in_t(&rs, "dims");
    if (!dims.data) { fclose(f); return 2; }
    const int32_t *dm = dims.data;
    int64_t Bt = dm[0], M = dm[1], N = dm[2], K = dm[3], B = dm[4], NH = dm[5], T = dm[6], V = dm[7], R = dm[8], C = dm[9];
    int st = 0;
#define OUT(name, n) do { tk_tensor _o = mk(TK_F32, (n)); tk_tensor *o = &_o;
#define END(name, n) out_w(f, name, o, (n)); rm(o); } while (0)
    /* gemm: C = A @ B^T + bias, A [Bt,M,K], B [Bt,N,K]; and gemm with transA: A2 [Bt,K,M] */
    tk_tensor A = in_t(&rs, "A"), Bm = in_t(&rs, "B"), A2 = in_t(&rs, "A2"), bias = in_t(&rs, "bias");
    OUT("gemm", Bt * M * N);
    st |= BE->gemm(CTX, o, &A, &Bm, &bias, &(tk_gemm){ .m = M, .n = N, .k = K, .trans_a = 0, .trans_b = 1, .batch = Bt, .stride_a = M * K, .stride_b = N * K, .stride_c = M * N, .alpha = 1.0f, .beta = 0.0f });
    END("gemm", Bt * M * N);
    OUT("gemm_tA", Bt * M * N);
    st |= BE->gemm(CTX, o, &A2, &Bm, NULL, &(tk_gemm){ .m = M, .n = N, .k = K, .trans_a = 1, .trans_b = 1, .batch = Bt, .stride_a = M * K, .stride_b = N * K, .stride_c = M * N, .alpha = 0.5f, .beta = 0.0f });
    END("gemm_tA", Bt * M * N);
    /* layernorm over rows R of C */
    tk_tensor x = in_t(&rs, "ln_x"), w = in_t(&rs, "ln_w"), b = in_t(&rs, "ln_b"), dy = in_t(&rs, "ln_dy");
    tk_tensor mean = mk(TK_F32, R), rstd = mk(TK_F32, R), dw = mk(TK_F32, C), db = mk(TK_F32, C);
    OUT("ln_y", R * C);
    st |= BE->layernorm_fwd(CTX, o, &mean, &rstd, &x, &w, &b, R, C, 1e-12f);
    END("ln_y", R * C);
    OUT("ln_dx", R * C);
    st |= BE->layernorm_bwd(CTX, o, &dw, &db, &dy, &x, &w, &mean, &rstd, R, C, 0, NULL);
    END("ln_dx", R * C);
    out_w(f, "ln_dw", &dw, C);
    out_w(f, "ln_db", &db, C);
    rm(&mean); rm(&rstd); rm(&dw); rm(&db);
    /* gelu, tanh on the same x */
    tk_tensor ex = in_t(&rs, "ew_x"), ed = in_t(&rs, "ew_d");
    int64_t ne = ex.shape[0];
    OUT("gelu", ne); st |= BE->gelu_fwd(CTX, o, &ex, ne); END("gelu", ne);
    OUT("gelu_dx", ne); st |= BE->gelu_bwd(CTX, o, &ex, &ed, ne); END("gelu_dx", ne);
    tk_tensor ty = mk(TK_F32, ne);
    st |= BE->tanh_fwd(CTX, &ty, &ex, ne);
    out_w(f, "tanh", &ty, ne);
    OUT("tanh_dx", ne); st |= BE->tanh_bwd(CTX, o, &ty, &ed, ne); END("tanh_dx", ne);
    rm(&ty);
    /* attention softmax with mask, scale 0.125 */
    tk_tensor sx = in_t(&rs, "sm_x"), smask = in_t(&rs, "sm_mask"), sd = in_t(&rs, "sm_d");
    int64_t ns = B * NH * T * T;
    tk_tensor sy = mk(TK_F32, ns);
    st |= BE->softmax_fwd(CTX, &sy, &sx, &smask, B, NH, T, 0.125f);
    out_w(f, "sm_y", &sy, ns);
    OUT("sm_dx", ns); st |= BE->softmax_bwd(CTX, o, &sy, &sd, B * NH * T, T, 0.125f); END("sm_dx", ns);
    rm(&sy);
    /* cross-entropy: rows R of V, mean over valid labels */
    tk_tensor lg = in_t(&rs, "xe_logits"), lab = in_t(&rs, "xe_labels");
    int nvalid = 0;
    for (int64_t i = 0; i < R; i++) nvalid += ((int32_t *)lab.data)[i] >= 0;
    OUT("xe_loss", R); st |= BE->xent_fwd(CTX, o, NULL, &lg, &lab, R, V); END("xe_loss", R);
    OUT("xe_dlogits", R * V);
    st |= BE->xent_bwd(CTX, o, &lg, &lab, R, V, 1.0f / (float)(nvalid ? nvalid : 1));
    END("xe_dlogits", R * V);
    /* embedding backward (index_add) and bias grad */
    tk_tensor ids = in_t(&rs, "emb_ids"), edy = in_t(&rs, "emb_dy");
    OUT("emb_dtable", V * C);
    st |= BE->embed_bwd(CTX, o, &ids, &edy, R, C, NULL, NULL);
    END("emb_dtable", V * C);
    OUT("bias_grad", C); st |= BE->bias_grad(CTX, o, &edy, R, C); END("bias_grad", C);
    /* three AdamW steps */
    tk_tensor p0 = in_t(&rs, "adam_p"), g3 = in_t(&rs, "adam_g");
    int64_t np = p0.shape[0];
    tk_tensor am = mk(TK_F32, np), av = mk(TK_F32, np);
    tk_adamw_hp hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .grad_scale = 1.0f};
    for (int s2 = 0; s2 < 3; s2++) {
        tk_tensor g = g3;
        g.data = (float *)g3.data + s2 * np;
        hp.step = s2 + 1;
        st |= BE->adamw(CTX, &p0, &g, &am, &av, np, &hp);
    }
    out_w(f, "adam_p", &p0, np);
    rm(&am); rm(&av);
#undef OUT
#undef END
    fclose(f);
    for (int i = 0; i < rs.n; i++) free(rs.r[i].data);
    (void)Bt;
    return st ? 1 : 0;
}

int main(int argc, char **argv) {
    BE = tk_backend_cpu();
    /* two threads even on a one-core machine, so the parallel paths run */
    tk_dev_opts o = {.kind = TK_DEV_CPU, .threads = 2}, o1 = {.kind = TK_DEV_CPU, .threads = 1};
    CTX = tk_cpu_ctx_new(&o);
    CTX1 = tk_cpu_ctx_new(&o1);
    if (argc == 3 && strcmp(argv[1], "--torch") == 0) {
        int rc = torch_io(argv[2]);
        BE->destroy(CTX);
        BE->destroy(CTX1);
        return rc;
    }
    TK_RUN(test_memory_and_info);
    TK_RUN(test_cast_f16_all_values);
    TK_RUN(test_cast_f32_to_16bit_rounding);
    TK_RUN(test_gemm);
    TK_RUN(test_add_axpby_fill);
    TK_RUN(test_gelu_tanh);
    TK_RUN(test_layernorm);
    TK_RUN(test_softmax);
    TK_RUN(test_xent);
    TK_RUN(test_dropout);
    TK_RUN(test_dropout_spec);
    TK_RUN(test_bias_grad);
    TK_RUN(test_heads);
    TK_RUN(test_gather_scatter_embed);
    TK_RUN(test_sumsq);
    TK_RUN(test_adamw_hand_step);
    TK_RUN(test_adamw_many_and_16bit_grad);
    TK_RUN(test_q8_codes);
    TK_RUN(test_adamw8_tracks_adamw);
    TK_RUN(test_in_place);
    TK_RUN(test_16bit_backwards);
    TK_RUN(test_scatter_into_3d);
    TK_RUN(test_converters_match_dtype_c);
    TK_RUN(test_device_chain);
    BE->destroy(CTX);
    BE->destroy(CTX1);
    return tk_test_done();
}
