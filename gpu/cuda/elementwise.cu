/* elementwise.cu — one value in, one value out: add, axpby, fill (one
 * tensor or a whole table of them), cast, GELU, tanh and dropout, forward
 * and backward.
 *
 * Reference kernels: one element per thread, any mix of dtypes. Fast
 * kernels: eight elements per thread through 128-bit loads and stores, for
 * tensors that are 16-byte aligned with n a multiple of 8 (the model's
 * activations always are); the arithmetic per element is the reference's,
 * so both give the same bits. GELU is the erf form BERT uses.
 */
#include "cuda_common.cuh"

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

__device__ __forceinline__ float gelu_of(float x) { return 0.5f * x * (1.0f + erff(x * INV_SQRT2)); }

__device__ __forceinline__ float gelu_grad_of(float x, float g) {
    float cdf = 0.5f * (1.0f + erff(x * INV_SQRT2));
    float pdf = INV_SQRT_2PI * expf(-0.5f * x * x);
    return g * (cdf + x * pdf);
}

/* Any dtype, for fill (integer tensors get the value truncated toward zero). */
__device__ __forceinline__ void st_any(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case TK_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case TK_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case TK_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case TK_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: st(p, dt, i, v); break;
    }
}

/* ---- reference kernels ------------------------------------------------------ */

__global__ void k_add(void *out, int dto, const void *a, int dta, const void *b, int dtb, int64_t n) {
    GRID_STRIDE(i, n) st(out, dto, i, ld(a, dta, i) + ld(b, dtb, i));
}

__global__ void k_axpby(void *y, int dty, float alpha, const void *x, int dtx, float beta, int64_t n) {
    /* beta == 0 does not read y, as in BLAS: NaN garbage in y must not leak. */
    GRID_STRIDE(i, n) st(y, dty, i, beta == 0.0f ? alpha * ld(x, dtx, i)
                                                  : alpha * ld(x, dtx, i) + beta * ld(y, dty, i));
}

__global__ void k_fill(void *t, int dt, float value, int64_t n) {
    GRID_STRIDE(i, n) st_any(t, dt, i, value);
}

__global__ void k_cast(void *out, int dto, const void *in, int dti, int64_t n) {
    GRID_STRIDE(i, n) st(out, dto, i, ld(in, dti, i));
}

__global__ void k_gelu_fwd(void *out, int dto, const void *in, int dti, int64_t n) {
    GRID_STRIDE(i, n) st(out, dto, i, gelu_of(ld(in, dti, i)));
}

__global__ void k_gelu_bwd(void *din, int dtd, const void *in, int dti, const void *dout, int dtg, int64_t n) {
    GRID_STRIDE(i, n) st(din, dtd, i, gelu_grad_of(ld(in, dti, i), ld(dout, dtg, i)));
}

__global__ void k_tanh_fwd(void *out, int dto, const void *in, int dti, int64_t n) {
    GRID_STRIDE(i, n) st(out, dto, i, tanhf(ld(in, dti, i)));
}

__global__ void k_tanh_bwd(void *din, int dtd, const void *out, int dto, const void *dout, int dtg, int64_t n) {
    GRID_STRIDE(i, n) {
        float y = ld(out, dto, i);
        st(din, dtd, i, ld(dout, dtg, i) * (1.0f - y * y));
    }
}

__global__ void k_dropout_fwd(void *out, int dto, uint8_t *mask, const void *in, int dti, int64_t n,
                              float p, float scale, uint64_t key, uint64_t offset) {
    GRID_STRIDE(i, n) {
        int keep = tk_dropout_keep(key, offset + (uint64_t)i, p);
        st(out, dto, i, keep ? ld(in, dti, i) * scale : 0.0f);
        if (mask) mask[i] = (uint8_t)keep;
    }
}

__global__ void k_dropout_bwd(void *din, int dtd, const void *dout, int dtg, int64_t n,
                              float p, float scale, uint64_t key, uint64_t offset) {
    GRID_STRIDE(i, n) {
        int keep = tk_dropout_keep(key, offset + (uint64_t)i, p);
        st(din, dtd, i, keep ? ld(dout, dtg, i) * scale : 0.0f);
    }
}

/* ---- fast kernels: eight elements per thread ------------------------------- */

template <typename T> __global__ void k_add8(T *out, const T *a, const T *b, int64_t n8) {
    GRID_STRIDE(g, n8) {
        float x[8], y[8];
        ld8(a + g * 8, x);
        ld8(b + g * 8, y);
        for (int j = 0; j < 8; j++) x[j] += y[j];
        st8(out + g * 8, x);
    }
}

template <typename T> __global__ void k_axpby8(T *y, float alpha, const T *x, float beta, int64_t n8) {
    GRID_STRIDE(g, n8) {
        float a[8], b[8];
        ld8(x + g * 8, a);
        if (beta != 0.0f) ld8(y + g * 8, b);
        for (int j = 0; j < 8; j++) a[j] = beta == 0.0f ? alpha * a[j] : alpha * a[j] + beta * b[j];
        st8(y + g * 8, a);
    }
}

template <typename TO, typename TI> __global__ void k_cast8(TO *out, const TI *in, int64_t n8) {
    GRID_STRIDE(g, n8) {
        float x[8];
        ld8(in + g * 8, x);
        st8(out + g * 8, x);
    }
}

template <typename T> __global__ void k_gelu_fwd8(T *out, const T *in, int64_t n8) {
    GRID_STRIDE(g, n8) {
        float x[8];
        ld8(in + g * 8, x);
        for (int j = 0; j < 8; j++) x[j] = gelu_of(x[j]);
        st8(out + g * 8, x);
    }
}

template <typename T> __global__ void k_gelu_bwd8(T *din, const T *in, const T *dout, int64_t n8) {
    GRID_STRIDE(g, n8) {
        float x[8], d[8];
        ld8(in + g * 8, x);
        ld8(dout + g * 8, d);
        for (int j = 0; j < 8; j++) x[j] = gelu_grad_of(x[j], d[j]);
        st8(din + g * 8, x);
    }
}

/* Forward and backward dropout are one kernel: out = keep ? in * scale : 0. */
template <typename T>
__global__ void k_dropout8(T *out, const T *in, int64_t n8, float p, float scale, uint64_t key, uint64_t offset) {
    GRID_STRIDE(g, n8) {
        float x[8];
        ld8(in + g * 8, x);
        for (int j = 0; j < 8; j++)
            x[j] = tk_dropout_keep(key, offset + (uint64_t)(g * 8 + j), p) ? x[j] * scale : 0.0f;
        st8(out + g * 8, x);
    }
}

/* A table of tensors to fill: entry i owns blocks [first[i], first[i+1]),
 * each block THREADS * 8 of its elements. */
typedef struct fill_table {
    int n;
    float value;
    int64_t first[TK_TABLE_MAX + 1];
    void *ptr[TK_TABLE_MAX];
    int64_t numel[TK_TABLE_MAX];
    int dt[TK_TABLE_MAX];
} fill_table;

#define FILL_TILE (THREADS * 8)

__global__ void k_fill_table(TK_TABLE_PARAM(fill_table, t)) {
    int i = table_find(t.first, t.n, blockIdx.x);
    int64_t e0 = (blockIdx.x - t.first[i]) * FILL_TILE + (int64_t)threadIdx.x * 8;
    int64_t n = t.numel[i];
    void *p = t.ptr[i];
    int dt = t.dt[i];
    if (e0 + 8 <= n && dt == TK_F32 && aligned16((float *)p + e0)) {
        float v[8];
        for (int j = 0; j < 8; j++) v[j] = t.value;
        st8((float *)p + e0, v);
        return;
    }
    for (int64_t e = e0; e < e0 + 8 && e < n; e++) st(p, dt, e, t.value);
}

/* ---- launchers ----------------------------------------------------------------- */

extern "C" {

tk_status tk_cuda_add(void *ctx, tk_tensor *out, const tk_tensor *a, const tk_tensor *b, int64_t n) {
    NEED_FLOAT("add", out); NEED_FLOAT("add", a); NEED_FLOAT("add", b);
    if (n == 0) return TK_OK;
    if (FAST() && same3(out, a, b) && fast8(n, out->data, a->data, b->data)) {
        TK_FLOAT_TYPE(DT(out), T, TK_LAUNCH(k_add8<T>, grid_for(n / 8), THREADS)((T *)out->data, (const T *)a->data,
                                                                            (const T *)b->data, n / 8));
        TK_CU_LAUNCHED("k_add8");
        return TK_OK;
    }
    TK_LAUNCH(k_add, grid_for(n), THREADS)(out->data, DT(out), a->data, DT(a), b->data, DT(b), n);
    TK_CU_LAUNCHED("k_add");
    return TK_OK;
}

tk_status tk_cuda_axpby(void *ctx, tk_tensor *y, float alpha, const tk_tensor *x, float beta, int64_t n) {
    NEED_FLOAT("axpby", y); NEED_FLOAT("axpby", x);
    if (n == 0) return TK_OK;
    if (FAST() && same3(y, x, x) && fast8(n, y->data, x->data, NULL)) {
        TK_FLOAT_TYPE(DT(y), T, TK_LAUNCH(k_axpby8<T>, grid_for(n / 8), THREADS)((T *)y->data, alpha,
                                                                            (const T *)x->data, beta, n / 8));
        TK_CU_LAUNCHED("k_axpby8");
        return TK_OK;
    }
    TK_LAUNCH(k_axpby, grid_for(n), THREADS)(y->data, DT(y), alpha, x->data, DT(x), beta, n);
    TK_CU_LAUNCHED("k_axpby");
    return TK_OK;
}

tk_status tk_cuda_fill(void *ctx, tk_tensor *t, float value, int64_t n) {
    if (n == 0) return TK_OK;
    TK_LAUNCH(k_fill, grid_for(n), THREADS)(t->data, DT(t), value, n);
    TK_CU_LAUNCHED("k_fill");
    return TK_OK;
}

/* One launch per TK_TABLE_MAX tensors (one for BERT-base's 201 gradients). */
tk_status tk_cuda_fill_many(void *ctx, tk_tensor *const *ts, int n, float value) {
    if (!FAST()) return tk_fill_many_each(ctx, tk_cuda_fill, ts, n, value);
    fill_table *t = (fill_table *)malloc(sizeof *t);
    if (!t) return TK_ENOMEM;
    for (int i0 = 0; i0 < n; i0 += TK_TABLE_MAX) {
        memset(t, 0, sizeof *t);
        t->value = value;
        for (int i = i0; i < n && t->n < TK_TABLE_MAX; i++) {
            int64_t e = tensor_numel(ts[i]);
            if (e == 0) continue;
            t->ptr[t->n] = ts[i]->data;
            t->numel[t->n] = e;
            t->dt[t->n] = DT(ts[i]);
            t->first[t->n + 1] = t->first[t->n] + (e + FILL_TILE - 1) / FILL_TILE;
            t->n++;
        }
        if (t->n == 0) continue;
        if (t->first[t->n] > INT32_MAX) {
            free(t);
            return bad("fill_many", "more than 2^31 blocks");
        }
        TK_LAUNCH(k_fill_table, (unsigned)t->first[t->n], THREADS)(*t);
        tk_status ls = LAUNCH_STATUS("k_fill_table");
        if (ls != TK_OK) {
            free(t);
            return ls;
        }
    }
    free(t);
    return TK_OK;
}

tk_status tk_cuda_cast(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n) {
    NEED_FLOAT("cast", out); NEED_FLOAT("cast", in);
    if (n == 0) return TK_OK;
    if (FAST() && fast8(n, out->data, in->data, NULL)) {
        TK_FLOAT_TYPE(DT(out), TO, TK_FLOAT_TYPE(DT(in), TI, {
            void (*k)(TO *, const TI *, int64_t) = k_cast8<TO, TI>;
            TK_LAUNCH(k, grid_for(n / 8), THREADS)((TO *)out->data, (const TI *)in->data, n / 8);
        }));
        TK_CU_LAUNCHED("k_cast8");
        return TK_OK;
    }
    TK_LAUNCH(k_cast, grid_for(n), THREADS)(out->data, DT(out), in->data, DT(in), n);
    TK_CU_LAUNCHED("k_cast");
    return TK_OK;
}

tk_status tk_cuda_gelu_fwd(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n) {
    NEED_FLOAT("gelu_fwd", out); NEED_FLOAT("gelu_fwd", in);
    if (n == 0) return TK_OK;
    if (FAST() && same3(out, in, in) && fast8(n, out->data, in->data, NULL)) {
        TK_FLOAT_TYPE(DT(out), T, TK_LAUNCH(k_gelu_fwd8<T>, grid_for(n / 8), THREADS)((T *)out->data,
                                                                                 (const T *)in->data, n / 8));
        TK_CU_LAUNCHED("k_gelu_fwd8");
        return TK_OK;
    }
    TK_LAUNCH(k_gelu_fwd, grid_for(n), THREADS)(out->data, DT(out), in->data, DT(in), n);
    TK_CU_LAUNCHED("k_gelu_fwd");
    return TK_OK;
}

tk_status tk_cuda_gelu_bwd(void *ctx, tk_tensor *din, const tk_tensor *in, const tk_tensor *dout, int64_t n) {
    NEED_FLOAT("gelu_bwd", din); NEED_FLOAT("gelu_bwd", in); NEED_FLOAT("gelu_bwd", dout);
    if (n == 0) return TK_OK;
    if (FAST() && same3(din, in, dout) && fast8(n, din->data, in->data, dout->data)) {
        TK_FLOAT_TYPE(DT(din), T, TK_LAUNCH(k_gelu_bwd8<T>, grid_for(n / 8), THREADS)((T *)din->data,
                                                                                 (const T *)in->data,
                                                                                 (const T *)dout->data, n / 8));
        TK_CU_LAUNCHED("k_gelu_bwd8");
        return TK_OK;
    }
    TK_LAUNCH(k_gelu_bwd, grid_for(n), THREADS)(din->data, DT(din), in->data, DT(in), dout->data, DT(dout), n);
    TK_CU_LAUNCHED("k_gelu_bwd");
    return TK_OK;
}

tk_status tk_cuda_tanh_fwd(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n) {
    NEED_FLOAT("tanh_fwd", out); NEED_FLOAT("tanh_fwd", in);
    if (n == 0) return TK_OK;
    TK_LAUNCH(k_tanh_fwd, grid_for(n), THREADS)(out->data, DT(out), in->data, DT(in), n);
    TK_CU_LAUNCHED("k_tanh_fwd");
    return TK_OK;
}

tk_status tk_cuda_tanh_bwd(void *ctx, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout, int64_t n) {
    NEED_FLOAT("tanh_bwd", din); NEED_FLOAT("tanh_bwd", out); NEED_FLOAT("tanh_bwd", dout);
    if (n == 0) return TK_OK;
    TK_LAUNCH(k_tanh_bwd, grid_for(n), THREADS)(din->data, DT(din), out->data, DT(out), dout->data, DT(dout), n);
    TK_CU_LAUNCHED("k_tanh_bwd");
    return TK_OK;
}

/* Without a mask to write, forward and backward are the same eight-wide kernel. */
static tk_status dropout8(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n, float p, uint64_t seed,
                          uint64_t offset) {
    TK_FLOAT_TYPE(DT(out), T, TK_LAUNCH(k_dropout8<T>, grid_for(n / 8), THREADS)((T *)out->data, (const T *)in->data,
                                                                             n / 8, p, tk_dropout_scale(p),
                                                                             tk_dropout_key(seed), offset));
    TK_CU_LAUNCHED("k_dropout8");
    return TK_OK;
}

tk_status tk_cuda_dropout_fwd(void *ctx, tk_tensor *out, tk_tensor *mask, const tk_tensor *in,
                              int64_t n, float p, uint64_t seed, uint64_t offset) {
    NEED_FLOAT("dropout_fwd", out); NEED_FLOAT("dropout_fwd", in);
    if (mask && mask->dtype != TK_U8) return bad("dropout_fwd", "mask must be u8");
    if (n == 0) return TK_OK;
    if (FAST() && !mask && same3(out, in, in) && fast8(n, out->data, in->data, NULL)) return dropout8(ctx, out, in, n, p, seed, offset);
    TK_LAUNCH(k_dropout_fwd, grid_for(n), THREADS)(out->data, DT(out), mask ? (uint8_t *)mask->data : NULL,
                                            in->data, DT(in), n, p, tk_dropout_scale(p), tk_dropout_key(seed), offset);
    TK_CU_LAUNCHED("k_dropout_fwd");
    return TK_OK;
}

tk_status tk_cuda_dropout_bwd(void *ctx, tk_tensor *din, const tk_tensor *dout, int64_t n,
                              float p, uint64_t seed, uint64_t offset) {
    NEED_FLOAT("dropout_bwd", din); NEED_FLOAT("dropout_bwd", dout);
    if (n == 0) return TK_OK;
    if (FAST() && same3(din, dout, dout) && fast8(n, din->data, dout->data, NULL)) return dropout8(ctx, din, dout, n, p, seed, offset);
    TK_LAUNCH(k_dropout_bwd, grid_for(n), THREADS)(din->data, DT(din), dout->data, DT(dout), n, p,
                                            tk_dropout_scale(p), tk_dropout_key(seed), offset);
    TK_CU_LAUNCHED("k_dropout_bwd");
    return TK_OK;
}

} /* extern "C" */
