/* test_attention.c — fused attention (tk_op_attention_fwd/bwd) against
 * standard attention built from the existing ops (batched GEMMs,
 * softmax_fwd/bwd, dropout_fwd/bwd) on the cpu device:
 *  - fp32, with and without dropout, with padded keys and a sequence whose
 *    keys are all masked: out, dq, dk, dv within 1e-5 (absolute, values O(1));
 *    the fused op takes (B,T,NH,HS) tensors, the standard ops (B,NH,T,HS);
 *  - q, k, v (and dq, dk, dv) as slices of one fused QKV buffer (rows
 *    3*NH*HS apart) give the same bytes as tensors of their own, and dq, dk
 *    and dv write every element of theirs;
 *  - bf16 inputs/outputs against the fp32 reference within one bf16 ulp at 1;
 *  - meta counts the op's cost without data, and the fused forward keeps
 *    B*NH*T lse floats where standard keeps B*NH*T*T probabilities;
 *  - the keep mask forward writes holds each element's dropout decision at
 *    tk_ops_spec.h's bit (and 0 outside T x T), and backward reads it: an
 *    all-zero mask drops every probability, so dV is 0;
 *  - bad arguments are refused with a message naming the tensor (backward
 *    with dropout and no keep mask among them). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tk_gpu.h"
#include "tk_ops_spec.h"
#include "tk_test.h"

enum { B = 3, NH = 2, T = 37, HS = 16 };
#define N ((int64_t)B * NH * T * HS)
#define NP ((int64_t)B * NH * T * T)

static tk_dev *dev_of(tk_dev_kind kind) {
    tk_dev_opts o = { .kind = kind, .threads = 2 };
    tk_err e = { 0 };
    tk_dev *d = tk_dev_new(&o, &e);
    TK_CHECK_MSG(d != NULL, "%s", e.msg);
    return d;
}

static void alloc(tk_dev *d, tk_tensor *t, tk_dtype dt, int64_t n, const float *init) {
    tk_err e = { 0 };
    TK_CHECK(tk_tensor_alloc(d, t, dt, 1, &n, TK_CAT_TEMP, "test", &e) == TK_OK);
    if (init) TK_CHECK(tk_tensor_write_f32(d, t, init, &e) == TK_OK);
}

static float *readf(tk_dev *d, const tk_tensor *t) {
    float *h = malloc((size_t)tk_tensor_numel(t) * sizeof *h);
    tk_err e = { 0 };
    TK_CHECK(tk_tensor_read_f32(d, t, h, &e) == TK_OK);
    return h;
}

static double maxdiff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - (double)b[i]);
        if (!(x <= m) && !isnan(m)) m = x; /* the first NaN stays */
    }
    return m;
}

typedef struct {
    float *out, *dq, *dk, *dv;
} grads;

static void grads_free(grads *g) {
    free(g->out);
    free(g->dq);
    free(g->dk);
    free(g->dv);
}

/* Host inputs shared by both paths. */
typedef struct {
    float *q, *k, *v, *dout;
    int32_t mask[B * T];
} inputs;

static void inputs_make(inputs *in) {
    in->q = tk_test_uniform(N, 1, 1.0f);
    in->k = tk_test_uniform(N, 2, 1.0f);
    in->v = tk_test_uniform(N, 3, 1.0f);
    in->dout = tk_test_uniform(N, 4, 1.0f);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < T; j++)
            /* seq 0 all kept, seq 1 the last 12 keys padded, seq 2 all masked */
            in->mask[b * T + j] = b == 0 ? 1 : b == 1 ? j < T - 12 : 0;
}

/* Standard attention from the existing ops: scores = q k^T (per head),
 * P = softmax(scale*scores + mask), Pd = dropout(P), out = Pd v; backward
 * through the same ops. */
static grads standard(tk_dev *d, const inputs *in, float scale, float p, uint64_t seed, uint64_t off) {
    tk_tensor q, k, v, S, P, Pd, o, go, dPd, dP, dS, dq, dk, dv, m;
    memset(&m, 0, sizeof m);
    alloc(d, &q, TK_F32, N, in->q);
    alloc(d, &k, TK_F32, N, in->k);
    alloc(d, &v, TK_F32, N, in->v);
    alloc(d, &go, TK_F32, N, in->dout);
    int64_t nm = B * T;
    tk_err e = { 0 };
    TK_CHECK(tk_tensor_alloc(d, &m, TK_I32, 1, &nm, TK_CAT_TEMP, "test", &e) == TK_OK);
    TK_CHECK(tk_tensor_write(d, &m, in->mask, &e) == TK_OK);
    alloc(d, &S, TK_F32, NP, NULL);
    alloc(d, &P, TK_F32, NP, NULL);
    alloc(d, &Pd, TK_F32, NP, NULL);
    alloc(d, &o, TK_F32, N, NULL);
    alloc(d, &dPd, TK_F32, NP, NULL);
    alloc(d, &dP, TK_F32, NP, NULL);
    alloc(d, &dS, TK_F32, NP, NULL);
    alloc(d, &dq, TK_F32, N, NULL);
    alloc(d, &dk, TK_F32, N, NULL);
    alloc(d, &dv, TK_F32, N, NULL);
    const int64_t BH = B * NH, TH = T * HS, TT = T * T;
    TK_CHECK(tk_op_gemm(d, &S, &q, &k, NULL, &(tk_gemm){ .m = T, .n = T, .k = HS, .trans_b = 1, .batch = BH, .stride_a = TH, .stride_b = TH, .stride_c = TT, .alpha = 1.0f }) == TK_OK);
    TK_CHECK(tk_op_softmax_fwd(d, &P, &S, &m, B, NH, T, scale) == TK_OK);
    TK_CHECK(tk_op_dropout_fwd(d, &Pd, NULL, &P, NP, p, seed, off) == TK_OK);
    TK_CHECK(tk_op_gemm(d, &o, &Pd, &v, NULL, &(tk_gemm){ .m = T, .n = HS, .k = T, .batch = BH, .stride_a = TT, .stride_b = TH, .stride_c = TH, .alpha = 1.0f }) == TK_OK);
    /* dPd = dout v^T; dv = Pd^T dout; dP = dropout_bwd(dPd); dS = softmax_bwd */
    TK_CHECK(tk_op_gemm(d, &dPd, &go, &v, NULL, &(tk_gemm){ .m = T, .n = T, .k = HS, .trans_b = 1, .batch = BH, .stride_a = TH, .stride_b = TH, .stride_c = TT, .alpha = 1.0f }) == TK_OK);
    TK_CHECK(tk_op_gemm(d, &dv, &Pd, &go, NULL, &(tk_gemm){ .m = T, .n = HS, .k = T, .trans_a = 1, .batch = BH, .stride_a = TT, .stride_b = TH, .stride_c = TH, .alpha = 1.0f }) == TK_OK);
    TK_CHECK(tk_op_dropout_bwd(d, &dP, &dPd, NP, p, seed, off) == TK_OK);
    TK_CHECK(tk_op_softmax_bwd(d, &dS, &P, &dP, BH * T, T, scale) == TK_OK);
    TK_CHECK(tk_op_gemm(d, &dq, &dS, &k, NULL, &(tk_gemm){ .m = T, .n = HS, .k = T, .batch = BH, .stride_a = TT, .stride_b = TH, .stride_c = TH, .alpha = 1.0f }) == TK_OK);
    TK_CHECK(tk_op_gemm(d, &dk, &dS, &q, NULL, &(tk_gemm){ .m = T, .n = HS, .k = T, .trans_a = 1, .batch = BH, .stride_a = TT, .stride_b = TH, .stride_c = TH, .alpha = 1.0f }) == TK_OK);
    grads g = { readf(d, &o), readf(d, &dq), readf(d, &dk), readf(d, &dv) };
    tk_tensor *all[] = { &q, &k, &v, &S, &P, &Pd, &o, &go, &dPd, &dP, &dS, &dq, &dk, &dv, &m };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tk_tensor_free(d, all[i]);
    return g;
}

/* (B,NH,T,HS) <-> (B,T,NH,HS) on the host: the standard ops' layout and
 * the fused op's. */
static float *to_btnh(const float *x) {
    float *y = malloc((size_t)N * sizeof *y);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++)
                memcpy(y + (((int64_t)b * T + t) * NH + h) * HS, x + (((int64_t)b * NH + h) * T + t) * HS,
                       HS * sizeof *y);
    return y;
}

static float *from_btnh(float *y) {
    float *x = malloc((size_t)N * sizeof *x);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++)
                memcpy(x + (((int64_t)b * NH + h) * T + t) * HS, y + (((int64_t)b * T + t) * NH + h) * HS,
                       HS * sizeof *x);
    free(y);
    return x;
}

/* The fused op on (B,T,NH,HS) copies of the inputs; the gradients come
 * back in the standard layout. qkv: q, k, v and dq, dk, dv are slices of
 * two fused buffers (rows 3*NH*HS apart) instead of tensors of their own. */
static grads fused_ld(tk_dev *d, const inputs *in, tk_dtype dt, float scale, float p, uint64_t seed, uint64_t off,
                      int qkv) {
    tk_tensor q, k, v, o, go, lse, dq, dk, dv, m, x, dx, km;
    memset(&x, 0, sizeof x);
    memset(&dx, 0, sizeof dx);
    memset(&km, 0, sizeof km);
    float *hq = to_btnh(in->q), *hk = to_btnh(in->k), *hv = to_btnh(in->v), *hg = to_btnh(in->dout);
    const int64_t C = NH * HS, ld = qkv ? 3 * C : C;
    if (qkv) {
        float *buf = malloc((size_t)3 * N * sizeof *buf);
        for (int64_t r = 0; r < (int64_t)B * T; r++)
            for (int64_t c = 0; c < C; c++) {
                buf[r * ld + c] = hq[r * C + c];
                buf[r * ld + C + c] = hk[r * C + c];
                buf[r * ld + 2 * C + c] = hv[r * C + c];
            }
        alloc(d, &x, dt, 3 * N, buf);
        /* NaN first: dq, dk and dv together must write every element */
        for (int64_t i = 0; i < 3 * N; i++) buf[i] = NAN;
        alloc(d, &dx, dt, 3 * N, buf);
        free(buf);
        const int64_t nv = 3 * N - 2 * C; /* rows ld apart, the last one C long */
        q = tk_tensor_view(&x, 0, nv);
        k = tk_tensor_view(&x, C, nv);
        v = tk_tensor_view(&x, 2 * C, nv);
        dq = tk_tensor_view(&dx, 0, nv);
        dk = tk_tensor_view(&dx, C, nv);
        dv = tk_tensor_view(&dx, 2 * C, nv);
    } else {
        alloc(d, &q, dt, N, hq);
        alloc(d, &k, dt, N, hk);
        alloc(d, &v, dt, N, hv);
        alloc(d, &dq, dt, N, NULL);
        alloc(d, &dk, dt, N, NULL);
        alloc(d, &dv, dt, N, NULL);
    }
    alloc(d, &go, dt, N, hg);
    alloc(d, &o, dt, N, NULL);
    alloc(d, &lse, TK_F32, B * NH * T, NULL);
    int64_t nm = B * T, nk = tk_attn_keep_bytes(B, NH, T);
    tk_err e = { 0 };
    if (p > 0) TK_CHECK(tk_tensor_alloc(d, &km, TK_U8, 1, &nk, TK_CAT_TEMP, "test", &e) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &m, TK_I32, 1, &nm, TK_CAT_TEMP, "test", &e) == TK_OK);
    TK_CHECK(tk_tensor_write(d, &m, in->mask, &e) == TK_OK);
    const tk_attn a = { .B = B, .NH = NH, .T = T, .HS = HS, .ld = ld, .scale = scale, .p = p, .seed = seed,
                        .offset = off };
    TK_CHECK(tk_op_attention_fwd(d, &o, &lse, p > 0 ? &km : NULL, &q, &k, &v, &m, &a) == TK_OK);
    TK_CHECK(tk_op_attention_bwd(d, &dq, &dk, &dv, &go, &q, &k, &v, &o, &lse, p > 0 ? &km : NULL, &m, &a) == TK_OK);
    grads g;
    if (qkv) {
        float *all = readf(d, &dx), *parts[3];
        int64_t untouched = 0;
        for (int j = 0; j < 3; j++) {
            parts[j] = malloc((size_t)N * sizeof(float));
            for (int64_t r = 0; r < (int64_t)B * T; r++)
                memcpy(parts[j] + r * C, all + r * ld + j * C, C * sizeof(float));
        }
        for (int64_t i = 0; i < 3 * N; i++) untouched += isnan(all[i]) != 0;
        TK_CHECK_MSG(untouched == 0, "%lld elements of the fused dqkv buffer were not written", (long long)untouched);
        free(all);
        g = (grads){ from_btnh(readf(d, &o)), from_btnh(parts[0]), from_btnh(parts[1]), from_btnh(parts[2]) };
    } else {
        g = (grads){ from_btnh(readf(d, &o)), from_btnh(readf(d, &dq)), from_btnh(readf(d, &dk)),
                     from_btnh(readf(d, &dv)) };
    }
    tk_tensor *all[] = { &q, &k, &v, &o, &go, &lse, &dq, &dk, &dv, &m, &x, &dx, &km };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tk_tensor_free(d, all[i]);
    free(hq);
    free(hk);
    free(hv);
    free(hg);
    return g;
}

static grads fused(tk_dev *d, const inputs *in, tk_dtype dt, float scale, float p, uint64_t seed, uint64_t off) {
    return fused_ld(d, in, dt, scale, p, seed, off, 0);
}

static void compare(const char *what, const grads *a, const grads *b, double tol) {
    double d[4] = { maxdiff(a->out, b->out, N), maxdiff(a->dq, b->dq, N), maxdiff(a->dk, b->dk, N),
                    maxdiff(a->dv, b->dv, N) };
    const char *nm[4] = { "out", "dq", "dk", "dv" };
    fprintf(stderr, "  %s: max |diff| out %.2g dq %.2g dk %.2g dv %.2g\n", what, d[0], d[1], d[2], d[3]);
    for (int i = 0; i < 4; i++)
        TK_CHECK_MSG(d[i] <= tol, "%s: %s differs by %g (tolerance %g)", what, nm[i], d[i], tol);
}

static void test_matches_standard_f32(void) {
    tk_dev *d = dev_of(TK_DEV_CPU);
    inputs in;
    inputs_make(&in);
    const float scale = 1.0f / sqrtf((float)HS);
    const float ps[2] = { 0.0f, 0.1f };
    for (int i = 0; i < 2; i++) {
        grads s = standard(d, &in, scale, ps[i], 77, 1000);
        grads f = fused(d, &in, TK_F32, scale, ps[i], 77, 1000);
        compare(ps[i] > 0 ? "fp32, dropout 0.1" : "fp32, no dropout", &f, &s, 1e-5);
        /* the fully masked sequence attends uniformly; padded keys get nothing */
        double mdv = 0;
        for (int j = T - 12; j < T; j++)
            for (int h = 0; h < NH; h++)
                for (int c = 0; c < HS; c++)
                    mdv = fmax(mdv, fabs(f.dv[((int64_t)(1 * NH + h) * T + j) * HS + c]));
        TK_CHECK_MSG(mdv == 0.0, "padded keys got gradient %g", mdv);
        grads_free(&s);
        grads_free(&f);
    }
    /* Slices of fused QKV buffers: the same bytes (the same sums in the
     * same order), and nothing outside the slices written. */
    grads sep = fused(d, &in, TK_F32, scale, 0.1f, 77, 1000), sl = fused_ld(d, &in, TK_F32, scale, 0.1f, 77, 1000, 1);
    compare("fp32, q/k/v slices of one QKV buffer (rows 3C apart)", &sl, &sep, 0.0);
    grads_free(&sep);
    grads_free(&sl);
    /* A different dropout offset draws a different mask. */
    grads a = fused(d, &in, TK_F32, scale, 0.1f, 77, 1000), b = fused(d, &in, TK_F32, scale, 0.1f, 77, 5);
    TK_CHECK(maxdiff(a.out, b.out, N) > 1e-3);
    grads_free(&a);
    grads_free(&b);
    free(in.q);
    free(in.k);
    free(in.v);
    free(in.dout);
    tk_alloc_stats st;
    tk_alloc_stats_get(tk_dev_alloc(d), &st);
    TK_CHECK_EQ_INT(st.allocated, 0);
    tk_dev_destroy(&d);
}

/* 16-bit storage, f32 arithmetic: bf16 inputs (rounded) against the f32
 * reference on the same rounded inputs; outputs carry bf16's 8-bit
 * significand (relative 2^-8 of values O(1)). */
static void test_bf16(void) {
    tk_dev *d = dev_of(TK_DEV_CPU);
    inputs in;
    inputs_make(&in);
    float *arrs[4] = { in.q, in.k, in.v, in.dout };
    for (int a = 0; a < 4; a++)
        for (int64_t i = 0; i < N; i++)
            arrs[a][i] = tk_bf16_to_f32(tk_f32_to_bf16(arrs[a][i]));
    const float scale = 0.25f;
    grads s = standard(d, &in, scale, 0.1f, 3, 0);
    grads f = fused(d, &in, TK_BF16, scale, 0.1f, 3, 0);
    compare("bf16", &f, &s, 8e-3); /* one bf16 ulp at 1; measured 1.5e-3 */
    grads_free(&s);
    grads_free(&f);
    for (int a = 0; a < 4; a++)
        free(arrs[a]);
    tk_dev_destroy(&d);
}

/* Meta: no data touched, the op's cost counted; memory of what is kept for
 * backward: lse (B*NH*T f32) instead of the probabilities (B*NH*T*T). */
static void test_meta_cost(void) {
    tk_dev *d = dev_of(TK_DEV_META);
    tk_tensor q, k, v, o, lse;
    alloc(d, &q, TK_F16, N, NULL);
    alloc(d, &k, TK_F16, N, NULL);
    alloc(d, &v, TK_F16, N, NULL);
    alloc(d, &o, TK_F16, N, NULL);
    alloc(d, &lse, TK_F32, B * NH * T, NULL);
    tk_dev_cost_reset(d);
    const tk_attn a = { .B = B, .NH = NH, .T = T, .HS = HS, .scale = 0.25f };
    TK_CHECK(tk_op_attention_fwd(d, &o, &lse, NULL, &q, &k, &v, NULL, &a) == TK_OK);
    tk_cost c;
    tk_dev_cost_get(d, &c);
    double bh = (double)B * NH, tt = (double)T * T;
    TK_CHECK_NEAR(c.flops, bh * (4.0 * tt * HS + 9.0 * tt), 1.0);
    TK_CHECK_NEAR(c.bytes, 4.0 * N * 2 + 4.0 * bh * T, 1.0);
    TK_CHECK(tk_tensor_nbytes(&lse) * T == (size_t)NP * 4);
    /* a missing lse is refused, named, and costs nothing */
    tk_dev_cost_reset(d);
    TK_CHECK_EQ_INT(tk_op_attention_fwd(d, &o, NULL, NULL, &q, &k, &v, NULL, &a), TK_EINVAL);
    TK_CHECK(strstr(tk_dev_last_err(d)->msg, "attention_fwd: lse is missing") != NULL);
    TK_CHECK_EQ_INT(tk_op_attention_bwd(d, &q, &k, &v, &o, &q, &k, &v, &o, &lse, NULL, NULL,
                                        &(tk_attn){ .B = B, .NH = NH, .T = T + 1, .HS = HS, .scale = 0.25f }),
                    TK_EINVAL);
    TK_CHECK(strstr(tk_dev_last_err(d)->msg, "elements") != NULL);
    /* a row stride below NH*HS, and q-like tensors too small for theirs */
    TK_CHECK_EQ_INT(tk_op_attention_fwd(d, &o, &lse, NULL, &q, &k, &v, NULL,
                                        &(tk_attn){ .B = B, .NH = NH, .T = T, .HS = HS, .ld = NH * HS - 1 }),
                    TK_EINVAL);
    TK_CHECK(strstr(tk_dev_last_err(d)->msg, "row stride ld") != NULL);
    TK_CHECK_EQ_INT(tk_op_attention_fwd(d, &o, &lse, NULL, &q, &k, &v, NULL,
                                        &(tk_attn){ .B = B, .NH = NH, .T = T, .HS = HS, .ld = 3 * NH * HS }),
                    TK_EINVAL);
    TK_CHECK(strstr(tk_dev_last_err(d)->msg, "q (test) has") != NULL);
    /* backward with dropout needs the forward's keep mask */
    TK_CHECK_EQ_INT(tk_op_attention_bwd(d, &q, &k, &v, &o, &q, &k, &v, &o, &lse, NULL, NULL,
                                        &(tk_attn){ .B = B, .NH = NH, .T = T, .HS = HS, .scale = 0.25f, .p = 0.1f }),
                    TK_EINVAL);
    TK_CHECK(strstr(tk_dev_last_err(d)->msg, "attention_bwd: keep is missing") != NULL);
    tk_dev_cost_get(d, &c);
    TK_CHECK(c.flops == 0);
    tk_tensor *all[] = { &q, &k, &v, &o, &lse };
    for (size_t i = 0; i < 5; i++)
        tk_tensor_free(d, all[i]);
    tk_dev_destroy(&d);
}

/* The keep mask on the cpu device, two sequence*head tiles a side (T = 70:
 * the second padded): every bit where tk_ops_spec.h puts it, set iff
 * tk_dropout_keep keeps that element, none outside T x T; then backward
 * with the mask zeroed (every probability dropped) gives dV = 0 where the
 * forward's own mask gives a nonzero dV: backward reads the mask. */
static void test_keep_mask(void) {
    enum { KB = 2, KNH = 2, KT = 70, KHS = 16 };
    const int64_t n = (int64_t)KB * KT * KNH * KHS, nk = tk_attn_keep_bytes(KB, KNH, KT), nl = KB * KNH * KT;
    TK_CHECK_EQ_INT(nk, (int64_t)KB * KNH * 128 * 128 / 8);
    TK_CHECK_EQ_INT(tk_attn_keep_bytes(1, 1, 512), 512 * 512 / 8);
    tk_dev *d = dev_of(TK_DEV_CPU);
    float *h = malloc((size_t)n * sizeof *h);
    tk_tensor t[8], km, lse;
    for (int i = 0; i < 8; i++) {
        for (int64_t e = 0; e < n; e++) h[e] = sinf(0.37f * (float)(e * (i + 1) % 101)) * 0.5f;
        alloc(d, &t[i], TK_F32, n, i < 3 || i == 4 ? h : NULL); /* q k v o dout dq dk dv */
    }
    alloc(d, &lse, TK_F32, nl, NULL);
    tk_err e = { 0 };
    TK_CHECK(tk_tensor_alloc(d, &km, TK_U8, 1, &nk, TK_CAT_TEMP, "test", &e) == TK_OK);
    const tk_attn a = { .B = KB, .NH = KNH, .T = KT, .HS = KHS, .scale = 0.25f, .p = 0.3f, .seed = 9, .offset = 12345 };
    TK_CHECK(tk_op_attention_fwd(d, &t[3], &lse, &km, &t[0], &t[1], &t[2], NULL, &a) == TK_OK);
    uint32_t *w = malloc((size_t)nk);
    TK_CHECK(tk_tensor_read(d, &km, w, &e) == TK_OK);
    const uint64_t key = tk_dropout_key(a.seed);
    const int64_t nw = nk / 4 / (KB * KNH);
    int64_t wrong = 0, kept = 0, set = 0;
    for (int64_t bh = 0; bh < KB * KNH; bh++)
        for (int64_t i = 0; i < KT; i++)
            for (int64_t j = 0; j < KT; j++) {
                int bit;
                const int64_t at = tk_attn_keep_at(KT, i, j, &bit);
                const int want = tk_dropout_keep(key, a.offset + (uint64_t)((bh * KT + i) * KT + j), a.p);
                wrong += (int)(w[bh * nw + at] >> bit & 1u) != want;
                kept += want;
            }
    for (int64_t x = 0; x < nk / 4; x++) set += __builtin_popcount(w[x]);
    TK_CHECK_MSG(wrong == 0, "%lld bits differ from tk_dropout_keep", (long long)wrong);
    TK_CHECK_MSG(set == kept, "%lld bits set, %lld elements kept: bits outside T x T", (long long)set,
                 (long long)kept);
    TK_CHECK(kept > 0 && kept < KB * KNH * KT * KT);
    TK_CHECK(tk_op_attention_bwd(d, &t[5], &t[6], &t[7], &t[4], &t[0], &t[1], &t[2], &t[3], &lse, &km, NULL, &a) ==
             TK_OK);
    float *dv = readf(d, &t[7]);
    double mx = 0;
    for (int64_t x = 0; x < n; x++) mx = fmax(mx, fabs(dv[x]));
    TK_CHECK(mx > 0);
    free(dv);
    memset(w, 0, (size_t)nk);
    TK_CHECK(tk_tensor_write(d, &km, w, &e) == TK_OK);
    TK_CHECK(tk_op_attention_bwd(d, &t[5], &t[6], &t[7], &t[4], &t[0], &t[1], &t[2], &t[3], &lse, &km, NULL, &a) ==
             TK_OK);
    dv = readf(d, &t[7]);
    mx = 0;
    for (int64_t x = 0; x < n; x++) mx = fmax(mx, fabs(dv[x]));
    TK_CHECK_MSG(mx == 0, "dV %g with every element dropped: backward did not read the mask", mx);
    free(dv);
    free(w);
    free(h);
    for (int i = 0; i < 8; i++) tk_tensor_free(d, &t[i]);
    tk_tensor_free(d, &km);
    tk_tensor_free(d, &lse);
    tk_dev_destroy(&d);
}

int main(void) {
    TK_RUN(test_matches_standard_f32);
    TK_RUN(test_bf16);
    TK_RUN(test_meta_cost);
    TK_RUN(test_keep_mask);
    return tk_test_done();
}
