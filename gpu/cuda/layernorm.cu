/* layernorm.cu — LayerNorm forward (alone, or fused with the dropout and
 * residual add before it) and backward.
 *
 * Reference kernels: one block per row (two passes: mean, then the centred
 * variance, as the cpu backend), and for the backward a row kernel for din
 * and a column-sum kernel for the weight and bias gradients.
 *
 * Fast kernels: one warp per row, eight elements per lane per step through
 * 128-bit loads, warp shuffles for the row sums.
 *  - k_ln_fwd8 <RES = 1> reads x and res, writes r = dropout(x) + res (each
 *    rounded to r's dtype as the separate ops would) and normalises it: the
 *    dropout, the add and the LayerNorm of a transformer block in one pass.
 *  - k_ln_bwd8 computes din and, in registers, the lane's columns of
 *    sum dout * norm and sum dout over the warp's rows: each warp owns a
 *    fixed run of rows (a row group, tk_layernorm_bwd_groups), writes its
 *    partial sums to the caller's scratch, and k_ln_bwd_sum adds the groups
 *    in group order. One pass over the rows, no atomics, the same bits on
 *    every run.
 * The fast kernels need C a multiple of 8 (at most 1024 in the backward),
 * 16-byte aligned rows, f32 weight and bias and one dtype for the rows.
 */
#include "cuda_common.cuh"

/* ---- reference kernels ---------------------------------------------------------- */

/* One block per row of C. Two passes (mean, then centred variance) as the
 * cpu reference, not E[x^2] - E[x]^2, which cancels badly. */
__global__ void k_layernorm_fwd(void *out, int dto, float *mean, float *rstd, const void *in, int dti,
                                const void *w, int dtw, const void *b, int dtb, int64_t C, float eps) {
    __shared__ float sh[THREADS / 32];
    int64_t row = blockIdx.x;
    const int64_t base = row * C;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += THREADS) s += ld(in, dti, base + c);
    float mu = block_sum(s, sh) / (float)C;
    float q = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += THREADS) {
        float d = ld(in, dti, base + c) - mu;
        q += d * d;
    }
    float var = block_sum(q, sh) / (float)C;
    float r = 1.0f / sqrtf(var + eps);
    for (int64_t c = threadIdx.x; c < C; c += THREADS) {
        float v = (ld(in, dti, base + c) - mu) * r;
        float wv = w ? ld(w, dtw, c) : 1.0f;
        float bv = b ? ld(b, dtb, c) : 0.0f;
        st(out, dto, base + c, v * wv + bv);
    }
    if (threadIdx.x == 0) {
        if (mean) mean[row] = mu;
        if (rstd) rstd[row] = r;
    }
}

/* din = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * w. */
__global__ void k_layernorm_bwd_in(void *din, int dtd, const void *dout, int dtg, const void *in, int dti,
                                   const void *w, int dtw, const float *mean, const float *rstd,
                                   int64_t C, int accumulate) {
    __shared__ float sh[THREADS / 32];
    int64_t row = blockIdx.x;
    const int64_t base = row * C;
    float mu = mean[row], r = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += THREADS) {
        float norm = (ld(in, dti, base + c) - mu) * r;
        float dn = ld(dout, dtg, base + c) * (w ? ld(w, dtw, c) : 1.0f);
        s1 += dn;
        s2 += dn * norm;
    }
    float m1 = block_sum(s1, sh) / (float)C;
    float m2 = block_sum(s2, sh) / (float)C;
    for (int64_t c = threadIdx.x; c < C; c += THREADS) {
        float norm = (ld(in, dti, base + c) - mu) * r;
        float dn = ld(dout, dtg, base + c) * (w ? ld(w, dtw, c) : 1.0f);
        float v = (dn - m1 - norm * m2) * r;
        if (accumulate) v += ld(din, dtd, base + c);
        st(din, dtd, base + c, v);
    }
}

/* The end of a two-column-sum block (COL_W x COL_H, cuda_common.cuh): each
 * lane's partials (sw, sb) to shared memory, lane 0 adds them in lane order
 * and accumulates into dw[c], db[c]. */
__device__ __forceinline__ void colsum2_finish(float sw, float sb, int64_t c, int64_t C, void *dw, int dtw, void *db,
                                               int dtb) {
    __shared__ float pw[COL_H][COL_W], pb[COL_H][COL_W];
    pw[threadIdx.y][threadIdx.x] = sw;
    pb[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < COL_H; y++) {
        sw += pw[y][threadIdx.x];
        sb += pb[y][threadIdx.x];
    }
    if (dw) st(dw, dtw, c, ld(dw, dtw, c) + sw);
    if (db) st(db, dtb, c, ld(db, dtb, c) + sb);
}

/* dw[c] += sum_n dout[n,c] * norm[n,c]; db[c] += sum_n dout[n,c]. */
__global__ void k_layernorm_bwd_wb(void *dw, int dtw, void *db, int dtb, const void *dout, int dtg,
                                   const void *in, int dti, const float *mean, const float *rstd,
                                   int64_t N, int64_t C) {
    int64_t c = (int64_t)blockIdx.x * COL_W + threadIdx.x;
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int64_t n = threadIdx.y; n < N; n += COL_H) {
            float g = ld(dout, dtg, n * C + c);
            sw += g * ((ld(in, dti, n * C + c) - mean[n]) * rstd[n]);
            sb += g;
        }
    colsum2_finish(sw, sb, c, C, dw, dtw, db, dtb);
}

/* ---- fast kernels: a warp per row -------------------------------------------- */

#define ROWS_PER_BLOCK (THREADS / WARP)

/* RES = 0: out = LN(in) (x is in). RES = 1: r = dropout(x) + res, out = LN(r). */
template <typename T, int RES>
__global__ void k_ln_fwd8(T *out, float *mean, float *rstd, T *r, const T *x, const T *res, const float *w,
                          const float *b, int64_t N, int C, float eps, float p, float scale, uint64_t key,
                          uint64_t offset) {
    const int lane = threadIdx.x % WARP;
    const int64_t row = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (row >= N) return; /* a whole warp: no shuffle waits on it */
    const int64_t base = row * C;
    const T *src = RES ? (const T *)r : x; /* what the norm reads (r: written in pass 1) */
    float s = 0.0f;
    for (int c = lane * 8; c < C; c += WARP * 8) {
        float v[8];
        ld8(x + base + c, v);
        if (RES) {
            float q[8];
            ld8(res + base + c, q);
            for (int j = 0; j < 8; j++) {
                float d = v[j];
                if (p > 0.0f)
                    d = tk_dropout_keep(key, offset + (uint64_t)(base + c + j), p) ? stored<T>(v[j] * scale) : 0.0f;
                v[j] = stored<T>(d + q[j]);
            }
            st8(r + base + c, v);
        }
        for (int j = 0; j < 8; j++) s += v[j];
    }
    const float mu = warp_sum(s) / (float)C;
    float q = 0.0f;
    for (int c = lane * 8; c < C; c += WARP * 8) {
        float v[8];
        ld8(src + base + c, v);
        for (int j = 0; j < 8; j++) q += (v[j] - mu) * (v[j] - mu);
    }
    const float rs = 1.0f / sqrtf(warp_sum(q) / (float)C + eps);
    for (int c = lane * 8; c < C; c += WARP * 8) {
        float v[8], wv[8], bv[8];
        ld8(src + base + c, v);
        ld8(w + c, wv);
        ld8(b + c, bv);
        for (int j = 0; j < 8; j++) v[j] = (v[j] - mu) * rs * wv[j] + bv[j];
        st8(out + base + c, v);
    }
    if (lane == 0) {
        if (mean) mean[row] = mu;
        if (rstd) rstd[row] = rs;
    }
}

/* Lane l holds columns (k * WARP + l) * 8 .. + 8 for k < KMAX: C <= KMAX * 256. */
#define LN_KMAX 4

/* Warp g (of W) takes rows [g * R, (g + 1) * R); its lanes' column sums go
 * to part[g][0][:] (dout * norm) and part[g][1][:] (dout). */
template <typename T>
__global__ void k_ln_bwd8(T *din, float *part, const T *dout, const T *in, const float *w, const float *mean,
                          const float *rstd, int64_t N, int C, int64_t W, int64_t R, int accumulate) {
    const int lane = threadIdx.x % WARP;
    const int64_t g = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (g >= W) return;
    float aw[LN_KMAX * 8], ab[LN_KMAX * 8];
    for (int j = 0; j < LN_KMAX * 8; j++) aw[j] = ab[j] = 0.0f;
    const int64_t r1 = (g + 1) * R < N ? (g + 1) * R : N;
    for (int64_t row = g * R; row < r1; row++) {
        const int64_t base = row * C;
        const float mu = mean[row], rs = rstd[row];
        float s1 = 0.0f, s2 = 0.0f;
        TK_UNROLL
        for (int k = 0; k < LN_KMAX; k++) {
            const int c = (k * WARP + lane) * 8;
            if (c >= C) break;
            float d[8], x[8], wv[8];
            ld8(dout + base + c, d);
            ld8(in + base + c, x);
            ld8(w + c, wv);
            for (int j = 0; j < 8; j++) {
                float norm = (x[j] - mu) * rs, dn = d[j] * wv[j];
                s1 += dn;
                s2 += dn * norm;
                aw[k * 8 + j] += d[j] * norm;
                ab[k * 8 + j] += d[j];
            }
        }
        const float m1 = warp_sum(s1) / (float)C, m2 = warp_sum(s2) / (float)C;
        if (!din) continue;
        TK_UNROLL
        for (int k = 0; k < LN_KMAX; k++) {
            const int c = (k * WARP + lane) * 8;
            if (c >= C) break;
            float d[8], x[8], wv[8], o[8];
            ld8(dout + base + c, d);
            ld8(in + base + c, x);
            ld8(w + c, wv);
            if (accumulate) ld8(din + base + c, o);
            for (int j = 0; j < 8; j++) {
                float norm = (x[j] - mu) * rs, v = (d[j] * wv[j] - m1 - norm * m2) * rs;
                o[j] = accumulate ? o[j] + v : v;
            }
            st8(din + base + c, o);
        }
    }
    float *pw = part + g * 2 * C, *pb = pw + C;
    TK_UNROLL
    for (int k = 0; k < LN_KMAX; k++) {
        const int c = (k * WARP + lane) * 8;
        if (c >= C) break;
        st8(pw + c, aw + k * 8);
        st8(pb + c, ab + k * 8);
    }
}

/* dw[c] += sum over the W groups of part[g][0][c], db likewise from
 * part[g][1][c], in the column-sum layout (fixed order). */
__global__ void k_ln_bwd_sum(void *dw, int dtw, void *db, int dtb, const float *part, int64_t W, int64_t C) {
    int64_t c = (int64_t)blockIdx.x * COL_W + threadIdx.x;
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int64_t g = threadIdx.y; g < W; g += COL_H) {
            sw += part[g * 2 * C + c];
            sb += part[g * 2 * C + C + c];
        }
    colsum2_finish(sw, sb, c, C, dw, dtw, db, dtb);
}

/* ---- launchers --------------------------------------------------------------------- */

/* k_ln_fwd8's type, to name an instance outside a macro's arguments. */
template <typename T>
using ln_fwd8_fn = void (*)(T *, float *, float *, T *, const T *, const T *, const float *, const float *, int64_t,
                            int, float, float, float, uint64_t, uint64_t);

/* Whether the warp-per-row kernels take these tensors. */
static int ln_fast(void *ctx, int64_t N, int64_t C, const tk_tensor *a, const tk_tensor *b, const tk_tensor *c,
                   const tk_tensor *w, const tk_tensor *bias) {
    return FAST() && C % 8 == 0 && C <= INT32_MAX && N <= (int64_t)INT32_MAX * ROWS_PER_BLOCK &&
           same3(a, b, c) && w && w->dtype == TK_F32 && (!bias || bias->dtype == TK_F32) &&
           aligned16(a->data) && aligned16(b->data) && aligned16(c->data) && aligned16(w->data) &&
           (!bias || aligned16(bias->data));
}

extern "C" {

tk_status tk_cuda_layernorm_fwd(void *ctx, tk_tensor *out, tk_tensor *mean, tk_tensor *rstd,
                                const tk_tensor *in, const tk_tensor *w, const tk_tensor *b,
                                int64_t N, int64_t C, float eps) {
    NEED_FLOAT("layernorm_fwd", out); NEED_FLOAT("layernorm_fwd", in);
    if ((mean && mean->dtype != TK_F32) || (rstd && rstd->dtype != TK_F32))
        return bad("layernorm_fwd", "mean and rstd must be f32");
    if (N == 0 || C == 0) return TK_OK;
    if (N > INT32_MAX) return bad("layernorm_fwd", "more than 2^31 rows");
    if (b && ln_fast(ctx, N, C, out, in, in, w, b)) {
        TK_FLOAT_TYPE(DT(out), T, {
            ln_fwd8_fn<T> k = k_ln_fwd8<T, 0>;
            TK_LAUNCH(k, (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), THREADS)(
                (T *)out->data, mean ? (float *)mean->data : NULL, rstd ? (float *)rstd->data : NULL, (T *)NULL,
                (const T *)in->data, (const T *)NULL, (const float *)w->data, (const float *)b->data, N, (int)C, eps,
                0.0f, 1.0f, (uint64_t)0, (uint64_t)0);
        });
        TK_CU_LAUNCHED("k_ln_fwd8");
        return TK_OK;
    }
    TK_LAUNCH(k_layernorm_fwd, (unsigned)N, THREADS)(out->data, DT(out), mean ? (float *)mean->data : NULL,
                                              rstd ? (float *)rstd->data : NULL, in->data, DT(in),
                                              w ? w->data : NULL, w ? DT(w) : 0, b ? b->data : NULL,
                                              b ? DT(b) : 0, C, eps);
    TK_CU_LAUNCHED("k_layernorm_fwd");
    return TK_OK;
}

tk_status tk_cuda_residual_layernorm_fwd(void *ctx, tk_tensor *r, tk_tensor *out, tk_tensor *mean,
                                         tk_tensor *rstd, const tk_tensor *x, const tk_tensor *res,
                                         const tk_tensor *w, const tk_tensor *b, int64_t N, int64_t C,
                                         float eps, float p, uint64_t seed, uint64_t offset) {
    NEED_FLOAT("residual_layernorm_fwd", r); NEED_FLOAT("residual_layernorm_fwd", x);
    NEED_FLOAT("residual_layernorm_fwd", res);
    if (N == 0 || C == 0) return TK_OK;
    if (ln_fast(ctx, N, C, r, x, res, w, b) && out->dtype == r->dtype && aligned16(out->data)) {
        TK_FLOAT_TYPE(DT(r), T, {
            ln_fwd8_fn<T> k = k_ln_fwd8<T, 1>;
            TK_LAUNCH(k, (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), THREADS)(
                (T *)out->data, mean ? (float *)mean->data : NULL, rstd ? (float *)rstd->data : NULL, (T *)r->data,
                (const T *)x->data, (const T *)res->data, (const float *)w->data, (const float *)b->data, N, (int)C,
                eps, p, tk_dropout_scale(p), tk_dropout_key(seed), offset);
        });
        TK_CU_LAUNCHED("k_ln_fwd8 (residual)");
        return TK_OK;
    }
    /* the reference: the three ops' own kernels in sequence */
    tk_status st = tk_cuda_dropout_fwd(ctx, r, NULL, x, N * C, p, seed, offset);
    if (st == TK_OK) st = tk_cuda_add(ctx, r, r, res, N * C);
    return st == TK_OK ? tk_cuda_layernorm_fwd(ctx, out, mean, rstd, r, w, b, N, C, eps) : st;
}

tk_status tk_cuda_layernorm_bwd(void *ctx, tk_tensor *din, tk_tensor *dw, tk_tensor *db,
                                const tk_tensor *dout, const tk_tensor *in, const tk_tensor *w,
                                const tk_tensor *mean, const tk_tensor *rstd,
                                int64_t N, int64_t C, int accumulate, tk_tensor *scratch) {
    NEED_FLOAT("layernorm_bwd", dout); NEED_FLOAT("layernorm_bwd", in);
    if (mean->dtype != TK_F32 || rstd->dtype != TK_F32)
        return bad("layernorm_bwd", "mean and rstd must be f32");
    if (N == 0 || C == 0) return TK_OK;
    if (N > INT32_MAX) return bad("layernorm_bwd", "more than 2^31 rows");
    if (scratch && din && C <= LN_KMAX * WARP * 8 && ln_fast(ctx, N, C, din, dout, in, w, NULL)) {
        const int64_t W = tk_layernorm_bwd_groups(N), R = (N + W - 1) / W;
        /* k_ln_bwd8 stores its partial sums 128 bits at a time (st8): rows of
         * C floats from a 16-byte aligned start, 2 C per group */
        if (scratch->dtype != TK_F32 || !aligned16(scratch->data) || tk_tensor_numel(scratch) < 2 * W * C)
            return bad("layernorm_bwd", "scratch must be f32, 16-byte aligned, of at least 2 x groups x C elements "
                       "(tk_layernorm_bwd_groups)");
        TK_FLOAT_TYPE(DT(din), T,
            TK_LAUNCH(k_ln_bwd8<T>, (unsigned)((W + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), THREADS)(
                (T *)din->data, (float *)scratch->data, (const T *)dout->data, (const T *)in->data,
                (const float *)w->data, (const float *)mean->data, (const float *)rstd->data, N, (int)C, W, R,
                accumulate));
        TK_CU_LAUNCHED("k_ln_bwd8");
        if (dw || db) {
            TK_LAUNCH(k_ln_bwd_sum, (unsigned)((C + COL_W - 1) / COL_W), dim3(COL_W, COL_H))(
                dw ? dw->data : NULL, dw ? DT(dw) : 0, db ? db->data : NULL, db ? DT(db) : 0,
                (const float *)scratch->data, W, C);
            TK_CU_LAUNCHED("k_ln_bwd_sum");
        }
        return TK_OK;
    }
    if (din) {
        TK_LAUNCH(k_layernorm_bwd_in, (unsigned)N, THREADS)(din->data, DT(din), dout->data, DT(dout), in->data,
                                                     DT(in), w ? w->data : NULL, w ? DT(w) : 0,
                                                     (const float *)mean->data, (const float *)rstd->data,
                                                     C, accumulate);
        TK_CU_LAUNCHED("k_layernorm_bwd_in");
    }
    if (dw || db) {
        TK_LAUNCH(k_layernorm_bwd_wb, (unsigned)((C + COL_W - 1) / COL_W), dim3(COL_W, COL_H))(
            dw ? dw->data : NULL, dw ? DT(dw) : 0, db ? db->data : NULL, db ? DT(db) : 0, dout->data,
            DT(dout), in->data, DT(in), (const float *)mean->data, (const float *)rstd->data, N, C);
        TK_CU_LAUNCHED("k_layernorm_bwd_wb");
    }
    return TK_OK;
}

} /* extern "C" */
