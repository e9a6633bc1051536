/* ops.c — the public tk_op_* wrappers: argument checks, cost counting, and
 * dispatch to the device's backend table.
 *
 * Each wrapper checks its arguments (tensors present and holding data, dtypes
 * allowed, sizes non-negative and within each tensor's element count). A bad
 * argument returns TK_EINVAL, leaves the device's cost counters untouched and
 * records a one-line message in tk_dev_last_err(d). A good call adds its cost
 * to the device's counters on every backend (meta included: that is how a
 * plan gets a predicted time) and then calls the backend's function; an op
 * the backend leaves NULL does nothing (meta leaves them all NULL).
 *
 * Cost model (estimates, used relatively by the planner with a GPU profile's
 * peak FLOP/s and bandwidth, roofline style: time ~ max(flops/peak, bytes/bw)):
 *  - bytes = every element read plus every element written, each at its
 *    tensor's dtype size; an output that is accumulated into (beta != 0,
 *    "+=") is counted as read and written. Index tensors count 4 B/element.
 *  - flops: GEMM 2*M*N*K*batch (+ M*N*batch for a bias). Elementwise ops
 *    count arithmetic per element with a transcendental (exp, erf, tanh,
 *    sqrt) as 4: add 1, axpby 3, cast/fill/copies 0, gelu 8 fwd / 15 bwd,
 *    tanh 4 / 3, dropout 2, softmax 9 / 5 per element, layernorm 8 / 14,
 *    cross-entropy 7 / 8 per logit, AdamW 18 and 8-bit AdamW 30 per
 *    parameter, sum of squares 2, bias grad and scatter-add 1.
 *  - fused attention per (sequence, head): forward 4*T*T*HS (q k^T and P v)
 *    + 9*T*T (softmax) (+ 2*T*T dropout); backward 10*T*T*HS (q k^T again,
 *    dout v^T, P^T dout, dS k, dS^T q) + 8*T*T (+ 2*T*T dropout). Bytes: its
 *    tensors once each — the (T,T) matrix never goes to memory.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dev_internal.h"
#include "tk_ops_spec.h"

#define M_FLT ((1u << TK_F32) | (1u << TK_F16) | (1u << TK_BF16))
#define M_F32 (1u << TK_F32)
#define M_I32 (1u << TK_I32)
#define M_U8 (1u << TK_U8)
#define M_I8 (1u << TK_I8)
#define M_ANY ((1u << TK_DTYPE_COUNT) - 1)

/* a*b saturating at INT64_MAX, so an overflowing size fails the numel check. */
static int64_t smul(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0) return INT64_MAX;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t sadd(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

__attribute__((format(printf, 3, 4)))
static tk_status fail(tk_dev *d, const char *op, const char *fmt, ...) {
    char buf[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    tk_err_set(&d->last_err, TK_EINVAL, "%s: %s", op, buf);
    return TK_EINVAL;
}

/* Checks one tensor argument: present (unless optional), a dtype in `mask`,
 * at least `need` elements, and data behind them. Returns TK_OK or records
 * why not. */
static tk_status arg(tk_dev *d, const char *op, const char *name, const tk_tensor *t,
                     unsigned mask, int64_t need, int optional) {
    if (!t) return optional ? TK_OK : fail(d, op, "%s is missing", name);
    if ((unsigned)t->dtype >= TK_DTYPE_COUNT || !(mask & (1u << t->dtype)))
        return fail(d, op, "%s has dtype %s, which this op does not take", name,
                    tk_dtype_name(t->dtype));
    int64_t n = tk_tensor_numel(t);
    if (need > n)
        return fail(d, op, "%s (%s) has %lld elements, the sizes given need %lld", name,
                    tk_alloc_owner_name(d->alloc, t->tag.owner), (long long)n, (long long)need);
    if (need > 0 && !t->data)
        return fail(d, op, "%s (%s) has no data (freed or never allocated)", name,
                    tk_alloc_owner_name(d->alloc, t->tag.owner));
    return TK_OK;
}

static tk_status sizes(tk_dev *d, const char *op, int n, ...) {
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        long long v = va_arg(ap, long long);
        if (v < 0) { va_end(ap); return fail(d, op, "size argument %d is negative (%lld)", i + 1, v); }
    }
    va_end(ap);
    return TK_OK;
}

static double sz(const tk_tensor *t) { return t ? (double)tk_dtype_size(t->dtype) : 0.0; }

static void charge(tk_dev *d, double flops, double bytes) {
    d->cost.flops += flops;
    d->cost.bytes += bytes;
    d->cost.n_ops++;
}

#define TRY(x) do { tk_status _s = (x); if (_s != TK_OK) return _s; } while (0)
#define DEV_OK() do { if (!d) return TK_EINVAL; } while (0)
#define LL(x) ((long long)(x))
#define DISPATCH(fn, ...) return d->be->fn ? d->be->fn(d->ctx, __VA_ARGS__) : TK_OK

tk_status tk_op_gemm(tk_dev *d, tk_tensor *C, const tk_tensor *A, const tk_tensor *B,
                     const tk_tensor *bias, const tk_gemm *g) {
    const char *op = "gemm";
    DEV_OK();
    if (!g) return fail(d, op, "no tk_gemm shape");
    const int64_t M = g->m, N = g->n, K = g->k, batch = g->batch;
    const int64_t strideA = g->stride_a, strideB = g->stride_b, strideC = g->stride_c;
    const float beta = g->beta;
    TRY(sizes(d, op, 7, LL(M), LL(N), LL(K), LL(batch), LL(strideA), LL(strideB), LL(strideC)));
    int64_t last = batch > 0 ? batch - 1 : 0;
    int64_t nb = batch > 0 ? 1 : 0;
    TRY(arg(d, op, "A", A, M_FLT, sadd(smul(last, strideA), smul(nb, smul(M, K))), 0));
    TRY(arg(d, op, "B", B, M_FLT, sadd(smul(last, strideB), smul(nb, smul(K, N))), 0));
    TRY(arg(d, op, "C", C, M_FLT, sadd(smul(last, strideC), smul(nb, smul(M, N))), 0));
    if (bias) TRY(arg(d, op, "bias", bias, M_F32 | (1u << C->dtype), smul(nb, N), 0));
    if (g->bgrad) {
        if (batch != 1) return fail(d, op, "a bias gradient needs batch 1 (got %lld)", LL(batch));
        TRY(arg(d, op, "bgrad", g->bgrad, M_F32, M, 0));
        TRY(arg(d, op, "bgrad_tmp", g->bgrad_tmp, M_F32, M, 0));
    }
    double mn = (double)M * N * batch;
    charge(d, 2.0 * M * N * (double)K * batch + (bias ? mn : 0) + (g->bgrad ? (double)M * K : 0),
           (double)batch * ((double)M * K * sz(A) + (double)K * N * sz(B)) +
           mn * sz(C) * (beta != 0.0f ? 2 : 1) + (bias ? (double)N * sz(bias) : 0) +
           (g->bgrad ? 8.0 * M : 0));
    DISPATCH(gemm, C, A, B, bias, g);
}

tk_status tk_op_embed_fwd(tk_dev *d, tk_tensor *out, const tk_tensor *ids, const tk_tensor *table,
                          int64_t n, int64_t C) {
    const char *op = "embed_fwd";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(n), LL(C)));
    TRY(arg(d, op, "out", out, M_FLT, smul(n, C), 0));
    TRY(arg(d, op, "ids", ids, M_I32, n, 0));
    TRY(arg(d, op, "table", table, M_FLT, C, 0));
    charge(d, 0, 4.0 * n + (double)n * C * (sz(table) + sz(out)));
    DISPATCH(embed_fwd, out, ids, table, n, C);
}

tk_status tk_op_embed_bwd(tk_dev *d, tk_tensor *dtable, const tk_tensor *ids, const tk_tensor *dout,
                          int64_t n, int64_t C, const tk_tensor *groups, tk_tensor *scratch) {
    const char *op = "embed_bwd";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(n), LL(C)));
    TRY(arg(d, op, "dtable", dtable, M_FLT, C, 0));
    TRY(arg(d, op, "ids", ids, M_I32, n, 0));
    TRY(arg(d, op, "dout", dout, M_FLT, smul(n, C), 0));
    if (groups) {
        TRY(arg(d, op, "groups", groups, M_I32, tk_embed_groups_numel(n), 0));
        TRY(arg(d, op, "scratch", scratch, M_F32, tk_embed_bwd_scratch_numel(n, C), 0));
    }
    charge(d, (double)n * C, 4.0 * n + (double)n * C * (sz(dout) + 2 * sz(dtable)));
    DISPATCH(embed_bwd, dtable, ids, dout, n, C, groups, scratch);
}

tk_status tk_op_add(tk_dev *d, tk_tensor *out, const tk_tensor *a, const tk_tensor *b, int64_t n) {
    const char *op = "add";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(arg(d, op, "a", a, M_FLT, n, 0));
    TRY(arg(d, op, "b", b, M_FLT, n, 0));
    charge(d, (double)n, (double)n * (sz(a) + sz(b) + sz(out)));
    DISPATCH(add, out, a, b, n);
}

tk_status tk_op_axpby(tk_dev *d, tk_tensor *y, float alpha, const tk_tensor *x, float beta, int64_t n) {
    const char *op = "axpby";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(arg(d, op, "y", y, M_FLT, n, 0));
    TRY(arg(d, op, "x", x, M_FLT, n, 0));
    charge(d, 3.0 * n, (double)n * (sz(x) + sz(y) * (beta != 0.0f ? 2 : 1)));
    DISPATCH(axpby, y, alpha, x, beta, n);
}

tk_status tk_op_fill(tk_dev *d, tk_tensor *t, float value, int64_t n) {
    const char *op = "fill";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(arg(d, op, "t", t, M_ANY, n, 0));
    charge(d, 0, (double)n * sz(t));
    DISPATCH(fill, t, value, n);
}

tk_status tk_op_fill_many(tk_dev *d, tk_tensor *const *ts, int n, float value) {
    const char *op = "fill_many";
    DEV_OK();
    if (n < 0 || (n > 0 && !ts)) return fail(d, op, "no tensor list (n = %d)", n);
    double bytes = 0;
    for (int i = 0; i < n; i++) {
        TRY(arg(d, op, "ts[i]", ts[i], M_FLT, 0, 0));
        bytes += (double)tk_tensor_numel(ts[i]) * sz(ts[i]);
    }
    charge(d, 0, bytes);
    DISPATCH(fill_many, ts, n, value);
}

tk_status tk_op_cast(tk_dev *d, tk_tensor *out, const tk_tensor *in, int64_t n) {
    const char *op = "cast";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(arg(d, op, "in", in, M_FLT, n, 0));
    charge(d, 0, (double)n * (sz(in) + sz(out)));
    DISPATCH(cast, out, in, n);
}

tk_status tk_op_layernorm_fwd(tk_dev *d, tk_tensor *out, tk_tensor *mean, tk_tensor *rstd,
                              const tk_tensor *in, const tk_tensor *w, const tk_tensor *b,
                              int64_t N, int64_t C, float eps) {
    const char *op = "layernorm_fwd";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(N), LL(C)));
    TRY(arg(d, op, "out", out, M_FLT, smul(N, C), 0));
    TRY(arg(d, op, "mean", mean, M_F32, N, 1));
    TRY(arg(d, op, "rstd", rstd, M_F32, N, 1));
    TRY(arg(d, op, "in", in, M_FLT, smul(N, C), 0));
    TRY(arg(d, op, "w", w, M_FLT, C, 0));
    TRY(arg(d, op, "b", b, M_FLT, C, 0));
    double nc = (double)N * C;
    charge(d, 8.0 * nc, nc * (sz(in) + sz(out)) + C * (sz(w) + sz(b)) + N * (sz(mean) + sz(rstd)));
    DISPATCH(layernorm_fwd, out, mean, rstd, in, w, b, N, C, eps);
}

static tk_status check_p(tk_dev *d, const char *op, float p);

tk_status tk_op_residual_layernorm_fwd(tk_dev *d, tk_tensor *r, tk_tensor *out, tk_tensor *mean,
                                       tk_tensor *rstd, const tk_tensor *x, const tk_tensor *res,
                                       const tk_tensor *w, const tk_tensor *b, int64_t N, int64_t C,
                                       float eps, float p, uint64_t seed, uint64_t offset) {
    const char *op = "residual_layernorm_fwd";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(N), LL(C)));
    TRY(check_p(d, op, p));
    int64_t nc = smul(N, C);
    TRY(arg(d, op, "r", r, M_FLT, nc, 0));
    TRY(arg(d, op, "out", out, M_FLT, nc, 0));
    TRY(arg(d, op, "mean", mean, M_F32, N, 1));
    TRY(arg(d, op, "rstd", rstd, M_F32, N, 1));
    TRY(arg(d, op, "x", x, M_FLT, nc, 0));
    TRY(arg(d, op, "res", res, M_FLT, nc, 0));
    TRY(arg(d, op, "w", w, M_FLT, C, 0));
    TRY(arg(d, op, "b", b, M_FLT, C, 0));
    double n = (double)nc;
    charge(d, (p > 0 ? 2.0 : 0.0) * n + n + 8.0 * n,
           n * (sz(x) + sz(res) + sz(r) + sz(out)) + C * (sz(w) + sz(b)) + N * (sz(mean) + sz(rstd)));
    DISPATCH(residual_layernorm_fwd, r, out, mean, rstd, x, res, w, b, N, C, eps, p, seed, offset);
}


tk_status tk_op_layernorm_bwd(tk_dev *d, tk_tensor *din, tk_tensor *dw, tk_tensor *db,
                              const tk_tensor *dout, const tk_tensor *in, const tk_tensor *w,
                              const tk_tensor *mean, const tk_tensor *rstd,
                              int64_t N, int64_t C, int accumulate, tk_tensor *scratch) {
    const char *op = "layernorm_bwd";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(N), LL(C)));
    TRY(arg(d, op, "din", din, M_FLT, smul(N, C), 0));
    TRY(arg(d, op, "dw", dw, M_FLT, C, 1));
    TRY(arg(d, op, "db", db, M_FLT, C, 1));
    TRY(arg(d, op, "dout", dout, M_FLT, smul(N, C), 0));
    TRY(arg(d, op, "in", in, M_FLT, smul(N, C), 0));
    TRY(arg(d, op, "w", w, M_FLT, C, 0));
    TRY(arg(d, op, "mean", mean, M_F32, N, 0));
    TRY(arg(d, op, "rstd", rstd, M_F32, N, 0));
    TRY(arg(d, op, "scratch", scratch, M_F32, tk_layernorm_bwd_scratch_numel(N, C), 1));
    double nc = (double)N * C;
    charge(d, 14.0 * nc, nc * (sz(dout) + sz(in) + sz(din) * (accumulate ? 2 : 1)) +
           C * (sz(w) + 2 * sz(dw) + 2 * sz(db)) + 8.0 * N);
    DISPATCH(layernorm_bwd, din, dw, db, dout, in, w, mean, rstd, N, C, accumulate, scratch);
}

tk_status tk_op_gelu_fwd(tk_dev *d, tk_tensor *out, const tk_tensor *in, int64_t n) {
    const char *op = "gelu_fwd";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(arg(d, op, "in", in, M_FLT, n, 0));
    charge(d, 8.0 * n, (double)n * (sz(in) + sz(out)));
    DISPATCH(gelu_fwd, out, in, n);
}

tk_status tk_op_gelu_bwd(tk_dev *d, tk_tensor *din, const tk_tensor *in, const tk_tensor *dout, int64_t n) {
    const char *op = "gelu_bwd";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(arg(d, op, "din", din, M_FLT, n, 0));
    TRY(arg(d, op, "in", in, M_FLT, n, 0));
    TRY(arg(d, op, "dout", dout, M_FLT, n, 0));
    charge(d, 15.0 * n, (double)n * (sz(in) + sz(dout) + sz(din)));
    DISPATCH(gelu_bwd, din, in, dout, n);
}

tk_status tk_op_tanh_fwd(tk_dev *d, tk_tensor *out, const tk_tensor *in, int64_t n) {
    const char *op = "tanh_fwd";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(arg(d, op, "in", in, M_FLT, n, 0));
    charge(d, 4.0 * n, (double)n * (sz(in) + sz(out)));
    DISPATCH(tanh_fwd, out, in, n);
}

tk_status tk_op_tanh_bwd(tk_dev *d, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout, int64_t n) {
    const char *op = "tanh_bwd";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(arg(d, op, "din", din, M_FLT, n, 0));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(arg(d, op, "dout", dout, M_FLT, n, 0));
    charge(d, 3.0 * n, (double)n * (sz(out) + sz(dout) + sz(din)));
    DISPATCH(tanh_bwd, din, out, dout, n);
}

tk_status tk_op_softmax_fwd(tk_dev *d, tk_tensor *out, const tk_tensor *in, const tk_tensor *mask,
                            int64_t B, int64_t NH, int64_t T, float scale) {
    const char *op = "softmax_fwd";
    DEV_OK();
    TRY(sizes(d, op, 3, LL(B), LL(NH), LL(T)));
    int64_t n = smul(smul(B, NH), smul(T, T));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(arg(d, op, "in", in, M_FLT, n, 0));
    TRY(arg(d, op, "mask", mask, M_I32, smul(B, T), 1));
    charge(d, 9.0 * n, (double)n * (sz(in) + sz(out)) + (mask ? 4.0 * B * T : 0));
    DISPATCH(softmax_fwd, out, in, mask, B, NH, T, scale);
}

tk_status tk_op_softmax_bwd(tk_dev *d, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout,
                            int64_t rows, int64_t T, float scale) {
    const char *op = "softmax_bwd";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(rows), LL(T)));
    int64_t n = smul(rows, T);
    TRY(arg(d, op, "din", din, M_FLT, n, 0));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(arg(d, op, "dout", dout, M_FLT, n, 0));
    charge(d, 5.0 * n, (double)n * (sz(out) + sz(dout) + sz(din)));
    DISPATCH(softmax_bwd, din, out, dout, rows, T, scale);
}

tk_status tk_op_softmax_dropout_fwd(tk_dev *d, tk_tensor *P, tk_tensor *PD, const tk_tensor *in,
                                    const tk_tensor *mask, int64_t B, int64_t NH, int64_t T, float scale,
                                    float p, uint64_t seed, uint64_t offset) {
    const char *op = "softmax_dropout_fwd";
    DEV_OK();
    TRY(sizes(d, op, 3, LL(B), LL(NH), LL(T)));
    TRY(check_p(d, op, p));
    int64_t n = smul(smul(B, NH), smul(T, T));
    TRY(arg(d, op, "P", P, M_FLT, n, 0));
    TRY(arg(d, op, "PD", PD, M_FLT, n, p == 0.0f));
    TRY(arg(d, op, "in", in, M_FLT, n, 0));
    TRY(arg(d, op, "mask", mask, M_I32, smul(B, T), 1));
    charge(d, 9.0 * n + (p > 0 ? 2.0 * n : 0),
           (double)n * (sz(in) + sz(P) + (p > 0 ? sz(PD) : 0)) + (mask ? 4.0 * B * T : 0));
    DISPATCH(softmax_dropout_fwd, P, p > 0 ? PD : NULL, in, mask, B, NH, T, scale, p, seed, offset);
}

tk_status tk_op_softmax_dropout_bwd(tk_dev *d, tk_tensor *din, const tk_tensor *P, const tk_tensor *dPD,
                                    int64_t rows, int64_t T, float scale, float p, uint64_t seed,
                                    uint64_t offset) {
    const char *op = "softmax_dropout_bwd";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(rows), LL(T)));
    TRY(check_p(d, op, p));
    int64_t n = smul(rows, T);
    TRY(arg(d, op, "din", din, M_FLT, n, 0));
    TRY(arg(d, op, "P", P, M_FLT, n, 0));
    TRY(arg(d, op, "dPD", dPD, M_FLT, n, 0));
    charge(d, 5.0 * n + (p > 0 ? 2.0 * n : 0), (double)n * (sz(P) + sz(dPD) + sz(din)));
    DISPATCH(softmax_dropout_bwd, din, P, dPD, rows, T, scale, p, seed, offset);
}

static tk_status check_p(tk_dev *d, const char *op, float p) {
    if (!(p >= 0.0f && p < 1.0f)) return fail(d, op, "p = %g is not in [0, 1)", (double)p);
    return TK_OK;
}

tk_status tk_op_dropout_fwd(tk_dev *d, tk_tensor *out, tk_tensor *mask, const tk_tensor *in,
                            int64_t n, float p, uint64_t seed, uint64_t offset) {
    const char *op = "dropout_fwd";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(check_p(d, op, p));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(arg(d, op, "mask", mask, M_U8, n, 1));
    TRY(arg(d, op, "in", in, M_FLT, n, 0));
    charge(d, 2.0 * n, (double)n * (sz(in) + sz(out) + sz(mask)));
    DISPATCH(dropout_fwd, out, mask, in, n, p, seed, offset);
}

tk_status tk_op_dropout_bwd(tk_dev *d, tk_tensor *din, const tk_tensor *dout, int64_t n,
                            float p, uint64_t seed, uint64_t offset) {
    const char *op = "dropout_bwd";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(check_p(d, op, p));
    TRY(arg(d, op, "din", din, M_FLT, n, 0));
    TRY(arg(d, op, "dout", dout, M_FLT, n, 0));
    charge(d, 2.0 * n, (double)n * (sz(dout) + sz(din)));
    DISPATCH(dropout_bwd, din, dout, n, p, seed, offset);
}

tk_status tk_op_xent_fwd(tk_dev *d, tk_tensor *losses, tk_tensor *probs, const tk_tensor *logits,
                         const tk_tensor *labels, int64_t N, int64_t V) {
    const char *op = "xent_fwd";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(N), LL(V)));
    int64_t nv = smul(N, V);
    TRY(arg(d, op, "losses", losses, M_F32, N, 0));
    TRY(arg(d, op, "probs", probs, M_FLT, nv, 1));
    TRY(arg(d, op, "logits", logits, M_FLT, nv, 0));
    TRY(arg(d, op, "labels", labels, M_I32, N, 0));
    charge(d, 7.0 * nv, (double)nv * (sz(logits) + sz(probs)) + 8.0 * N);
    DISPATCH(xent_fwd, losses, probs, logits, labels, N, V);
}

tk_status tk_op_xent_bwd(tk_dev *d, tk_tensor *dlogits, const tk_tensor *logits,
                         const tk_tensor *labels, int64_t N, int64_t V, float scale) {
    const char *op = "xent_bwd";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(N), LL(V)));
    int64_t nv = smul(N, V);
    TRY(arg(d, op, "dlogits", dlogits, M_FLT, nv, 0));
    TRY(arg(d, op, "logits", logits, M_FLT, nv, 0));
    TRY(arg(d, op, "labels", labels, M_I32, N, 0));
    charge(d, 8.0 * nv, (double)nv * (sz(logits) + sz(dlogits)) + 4.0 * N);
    DISPATCH(xent_bwd, dlogits, logits, labels, N, V, scale);
}

tk_status tk_op_bias_grad(tk_dev *d, tk_tensor *db, const tk_tensor *dout, int64_t N, int64_t C) {
    const char *op = "bias_grad";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(N), LL(C)));
    TRY(arg(d, op, "db", db, M_FLT, C, 0));
    TRY(arg(d, op, "dout", dout, M_FLT, smul(N, C), 0));
    charge(d, (double)N * C, (double)N * C * sz(dout) + 2.0 * C * sz(db));
    DISPATCH(bias_grad, db, dout, N, C);
}

static tk_status heads(tk_dev *d, const char *op, tk_tensor *out, const tk_tensor *in,
                       int64_t B, int64_t T, int64_t NH, int64_t HS) {
    TRY(sizes(d, op, 4, LL(B), LL(T), LL(NH), LL(HS)));
    int64_t n = smul(smul(B, T), smul(NH, HS));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(arg(d, op, "in", in, M_FLT, n, 0));
    charge(d, 0, (double)n * (sz(in) + sz(out)));
    return TK_OK;
}

tk_status tk_op_split_heads(tk_dev *d, tk_tensor *out, const tk_tensor *in,
                            int64_t B, int64_t T, int64_t NH, int64_t HS) {
    DEV_OK();
    TRY(heads(d, "split_heads", out, in, B, T, NH, HS));
    DISPATCH(split_heads, out, in, B, T, NH, HS);
}

tk_status tk_op_merge_heads(tk_dev *d, tk_tensor *out, const tk_tensor *in,
                            int64_t B, int64_t T, int64_t NH, int64_t HS) {
    DEV_OK();
    TRY(heads(d, "merge_heads", out, in, B, T, NH, HS));
    DISPATCH(merge_heads, out, in, B, T, NH, HS);
}

tk_status tk_op_gather_rows(tk_dev *d, tk_tensor *out, const tk_tensor *in, const tk_tensor *idx,
                            int64_t n, int64_t C) {
    const char *op = "gather_rows";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(n), LL(C)));
    TRY(arg(d, op, "out", out, M_FLT, smul(n, C), 0));
    TRY(arg(d, op, "in", in, M_FLT, C, 0));
    TRY(arg(d, op, "idx", idx, M_I32, n, 0));
    charge(d, 0, 4.0 * n + (double)n * C * (sz(in) + sz(out)));
    DISPATCH(gather_rows, out, in, idx, n, C);
}

tk_status tk_op_scatter_add_rows(tk_dev *d, tk_tensor *din, const tk_tensor *dout,
                                 const tk_tensor *idx, int64_t n, int64_t C) {
    const char *op = "scatter_add_rows";
    DEV_OK();
    TRY(sizes(d, op, 2, LL(n), LL(C)));
    TRY(arg(d, op, "din", din, M_FLT, C, 0));
    TRY(arg(d, op, "dout", dout, M_FLT, smul(n, C), 0));
    TRY(arg(d, op, "idx", idx, M_I32, n, 0));
    charge(d, (double)n * C, 4.0 * n + (double)n * C * (sz(dout) + 2 * sz(din)));
    DISPATCH(scatter_add_rows, din, dout, idx, n, C);
}

tk_status tk_op_sumsq(tk_dev *d, tk_tensor *out, const tk_tensor *x, int64_t n, int accumulate) {
    const char *op = "sumsq";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(arg(d, op, "out", out, M_F32, 1, 0));
    TRY(arg(d, op, "x", x, M_FLT, n, 0));
    charge(d, 2.0 * n, (double)n * sz(x) + (accumulate ? 8 : 4));
    DISPATCH(sumsq, out, x, n, accumulate);
}

tk_status tk_op_sumsq_many(tk_dev *d, tk_tensor *out, const tk_tensor *const *xs, int n) {
    const char *op = "sumsq_many";
    DEV_OK();
    if (n < 0 || (n > 0 && !xs)) return fail(d, op, "no tensor list (n = %d)", n);
    TRY(arg(d, op, "out", out, M_F32, 1, 0));
    double elems = 0, bytes = 4;
    for (int i = 0; i < n; i++) {
        TRY(arg(d, op, "xs[i]", xs[i], M_FLT, 0, 0));
        elems += (double)tk_tensor_numel(xs[i]);
        bytes += (double)tk_tensor_numel(xs[i]) * sz(xs[i]);
    }
    charge(d, 2.0 * elems, bytes);
    DISPATCH(sumsq_many, out, xs, n);
}

static tk_status check_hp(tk_dev *d, const char *op, const tk_adamw_hp *hp) {
    if (!hp) return fail(d, op, "hyperparameters are missing");
    if (hp->step < 1) return fail(d, op, "step is %lld; AdamW steps count from 1", (long long)hp->step);
    if (!(hp->beta1 >= 0 && hp->beta1 < 1) || !(hp->beta2 >= 0 && hp->beta2 < 1))
        return fail(d, op, "betas (%g, %g) must lie in [0, 1)", (double)hp->beta1, (double)hp->beta2);
    return TK_OK;
}

tk_status tk_op_adamw(tk_dev *d, tk_tensor *param, const tk_tensor *grad, tk_tensor *m, tk_tensor *v,
                      int64_t n, const tk_adamw_hp *hp) {
    const char *op = "adamw";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(check_hp(d, op, hp));
    TRY(arg(d, op, "param", param, M_F32, n, 0));
    TRY(arg(d, op, "grad", grad, M_FLT, n, 0));
    TRY(arg(d, op, "m", m, M_F32, n, 0));
    TRY(arg(d, op, "v", v, M_F32, n, 0));
    charge(d, 18.0 * n, (double)n * (24.0 + sz(grad)));
    DISPATCH(adamw, param, grad, m, v, n, hp);
}

tk_status tk_op_adamw_many(tk_dev *d, const tk_adamw_item *items, int n_items, const tk_adamw_hp *hp) {
    const char *op = "adamw_many";
    DEV_OK();
    if (n_items < 0 || (n_items > 0 && !items)) return fail(d, op, "no parameter table (n = %d)", n_items);
    TRY(check_hp(d, op, hp));
    double flops = 0, bytes = 0;
    for (int i = 0; i < n_items; i++) {
        const tk_adamw_item *it = &items[i];
        TRY(sizes(d, op, 1, LL(it->n)));
        TRY(arg(d, op, "param", &it->param, M_F32, it->n, 0));
        TRY(arg(d, op, "grad", &it->grad, M_FLT, it->n, 0));
        TRY(arg(d, op, "m", &it->m, M_F32, it->n, 0));
        TRY(arg(d, op, "v", &it->v, M_F32, it->n, 0));
        flops += 18.0 * it->n;
        bytes += (double)it->n * (24.0 + sz(&it->grad));
    }
    charge(d, flops, bytes);
    DISPATCH(adamw_many, items, n_items, hp);
}

tk_status tk_op_adamw8(tk_dev *d, tk_tensor *param, const tk_tensor *grad,
                       tk_tensor *m, tk_tensor *mscale, tk_tensor *v, tk_tensor *vscale,
                       int64_t n, const tk_adamw_hp *hp) {
    const char *op = "adamw8";
    DEV_OK();
    TRY(sizes(d, op, 1, LL(n)));
    TRY(check_hp(d, op, hp));
    int64_t nb = (n + TK_Q8_BLOCK - 1) / TK_Q8_BLOCK;
    TRY(arg(d, op, "param", param, M_F32, n, 0));
    TRY(arg(d, op, "grad", grad, M_FLT, n, 0));
    TRY(arg(d, op, "m", m, M_I8, n, 0));
    TRY(arg(d, op, "mscale", mscale, M_F32, nb, 0));
    TRY(arg(d, op, "v", v, M_U8, n, 0));
    TRY(arg(d, op, "vscale", vscale, M_F32, nb, 0));
    charge(d, 30.0 * n, (double)n * (8.0 + sz(grad) + 4.0) + 16.0 * nb);
    DISPATCH(adamw8, param, grad, m, mscale, v, vscale, n, hp);
}

/* ---- fused attention ---------------------------------------------------- */

/* Shared checks of the fused attention ops; fills *r with a's fields and ld
 * resolved, *n with the elements of one (B,T,NH,HS) tensor and *nld with
 * the elements a q-like tensor (rows ld apart) must hold. */
static tk_status attn_args(tk_dev *d, const char *op, const tk_attn *a, const tk_tensor *mask,
                           const tk_tensor *lse, tk_attn *r, int64_t *n, int64_t *nld) {
    if (!a) return fail(d, op, "no tk_attn shape");
    *r = *a;
    TRY(sizes(d, op, 5, LL(a->B), LL(a->NH), LL(a->T), LL(a->HS), LL(a->ld)));
    TRY(check_p(d, op, a->p));
    const int64_t C = smul(a->NH, a->HS), rows = smul(a->B, a->T);
    if (r->ld == 0) r->ld = C;
    if (r->ld < C)
        return fail(d, op, "row stride ld %lld is less than NH*HS = %lld", LL(r->ld), LL(C));
    *n = smul(rows, C);
    *nld = rows > 0 ? sadd(smul(rows - 1, r->ld), C) : 0;
    TRY(arg(d, op, "mask", mask, M_I32, rows, 1));
    return arg(d, op, "lse", lse, M_F32, smul(smul(a->B, a->NH), a->T), 0);
}

/* A real device without the op cannot run it (meta only counts). */
static tk_status attn_missing(tk_dev *d, const char *op) {
    if (tk_dev_kind_of(d) == TK_DEV_META) return TK_OK;
    return fail(d, op, "the %s backend has no fused attention kernel; use attention: standard",
                d->be->name);
}

int64_t tk_attn_keep_bytes(int64_t B, int64_t NH, int64_t T) {
    return smul(smul(B, NH), smul(tk_attn_keep_words(T), 4));
}

/* The keep mask's check: u8, every sequence*head's words; when p is 0 it is
 * not read or written (and may be NULL). */
static tk_status attn_keep(tk_dev *d, const char *op, const tk_tensor *keep, const tk_attn *r, int optional) {
    if (r->p <= 0.0f) return TK_OK;
    return arg(d, op, "keep", keep, M_U8, tk_attn_keep_bytes(r->B, r->NH, r->T), optional);
}

tk_status tk_op_attention_fwd(tk_dev *d, tk_tensor *out, tk_tensor *lse, tk_tensor *keep,
                              const tk_tensor *q, const tk_tensor *k, const tk_tensor *v,
                              const tk_tensor *mask, const tk_attn *a) {
    const char *op = "attention_fwd";
    DEV_OK();
    tk_attn r;
    int64_t n, nld;
    TRY(attn_args(d, op, a, mask, lse, &r, &n, &nld));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(arg(d, op, "q", q, M_FLT, nld, 0));
    TRY(arg(d, op, "k", k, M_FLT, nld, 0));
    TRY(arg(d, op, "v", v, M_FLT, nld, 0));
    TRY(attn_keep(d, op, keep, &r, 1));
    if (r.p <= 0.0f) keep = NULL;
    if (!d->be->attention_fwd) TRY(attn_missing(d, op));
    const double bh = (double)r.B * r.NH, tt = (double)r.T * r.T;
    const double fl = bh * (4.0 * tt * r.HS + 9.0 * tt + (r.p > 0 ? 2.0 * tt : 0));
    d->cost.attn_flops += fl;
    charge(d, fl, (double)n * (sz(q) + sz(k) + sz(v) + sz(out)) + 4.0 * bh * r.T + (mask ? 4.0 * r.B * r.T : 0) +
                      (keep ? (double)tk_attn_keep_bytes(r.B, r.NH, r.T) : 0));
    DISPATCH(attention_fwd, out, lse, keep, q, k, v, mask, &r);
}

tk_status tk_op_attention_bwd(tk_dev *d, tk_tensor *dq, tk_tensor *dk, tk_tensor *dv,
                              const tk_tensor *dout, const tk_tensor *q, const tk_tensor *k,
                              const tk_tensor *v, const tk_tensor *out, const tk_tensor *lse,
                              const tk_tensor *keep, const tk_tensor *mask, const tk_attn *a) {
    const char *op = "attention_bwd";
    DEV_OK();
    tk_attn r;
    int64_t n, nld;
    TRY(attn_args(d, op, a, mask, lse, &r, &n, &nld));
    TRY(arg(d, op, "dq", dq, M_FLT, nld, 0));
    TRY(arg(d, op, "dk", dk, M_FLT, nld, 0));
    TRY(arg(d, op, "dv", dv, M_FLT, nld, 0));
    TRY(arg(d, op, "dout", dout, M_FLT, n, 0));
    TRY(arg(d, op, "q", q, M_FLT, nld, 0));
    TRY(arg(d, op, "k", k, M_FLT, nld, 0));
    TRY(arg(d, op, "v", v, M_FLT, nld, 0));
    TRY(arg(d, op, "out", out, M_FLT, n, 0));
    TRY(attn_keep(d, op, keep, &r, 0));
    if (r.p <= 0.0f) keep = NULL;
    if (!d->be->attention_bwd) TRY(attn_missing(d, op));
    const double bh = (double)r.B * r.NH, tt = (double)r.T * r.T;
    const double fl = bh * (10.0 * tt * r.HS + 8.0 * tt + (r.p > 0 ? 2.0 * tt : 0));
    d->cost.attn_flops += fl;
    charge(d, fl,
           (double)n * (sz(dq) + sz(dk) + sz(dv) + sz(dout) + sz(q) + sz(k) + sz(v) + sz(out)) +
               4.0 * bh * r.T + (mask ? 4.0 * r.B * r.T : 0) +
               (keep ? (double)tk_attn_keep_bytes(r.B, r.NH, r.T) : 0));
    DISPATCH(attention_bwd, dq, dk, dv, dout, q, k, v, out, lse, keep, mask, &r);
}
