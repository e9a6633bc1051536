/* softmax_dropout.cu — standard attention's masked softmax and the dropout
 * on its probabilities, forward and backward.
 *
 * Reference kernels: one block per row (k_softmax_fwd, k_softmax_bwd), the
 * dropout being elementwise.cu's; the fused ops run them in sequence.
 * Fast kernels: one warp per row of T (a multiple of 8), eight elements per
 * lane per step, warp shuffles for the row max and sums. The forward writes
 * the probabilities P (kept for backward) and their dropout PD in the same
 * pass; the backward regenerates the dropout mask from (seed, offset)
 * (nothing stored) and applies the softmax backward. Each value is rounded
 * as the separate ops would round it (P, then PD from the rounded P; dP, then
 * din), so only the order of a row's sums differs from the reference.
 */
#include "cuda_common.cuh"

/* ---- reference kernels ----------------------------------------------------------- */

/* HF BERT's extended attention mask: (1 - mask) * finfo(float32).min, as
 * TK_MASK_BIAS (tk_ops_spec.h). Rows (B, NH, T, T): row r belongs to batch
 * r / (NH*T); key j is masked where mask[b, j] == 0. */
__global__ void k_softmax_fwd(void *out, int dto, const void *in, int dti, const int32_t *mask,
                              int64_t NH, int64_t T, float scale) {
    __shared__ float sh[THREADS / 32];
    int64_t row = blockIdx.x;
    int64_t b = row / (NH * T);
    const int64_t base = row * T;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < T; j += THREADS) {
        float x = scale * ld(in, dti, base + j) + ((mask && mask[b * T + j] == 0) ? TK_MASK_BIAS : 0.0f);
        mx = fmaxf(mx, x);
    }
    mx = block_max(mx, sh);
    if (mx == -INFINITY) { /* every logit -inf: no distribution exists; zeros, as the cpu backend */
        for (int64_t j = threadIdx.x; j < T; j += THREADS) st(out, dto, base + j, 0.0f);
        return;
    }
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < T; j += THREADS) {
        float x = scale * ld(in, dti, base + j) + ((mask && mask[b * T + j] == 0) ? TK_MASK_BIAS : 0.0f);
        s += expf(x - mx);
    }
    s = block_sum(s, sh);
    float inv = 1.0f / s;
    for (int64_t j = threadIdx.x; j < T; j += THREADS) {
        float x = scale * ld(in, dti, base + j) + ((mask && mask[b * T + j] == 0) ? TK_MASK_BIAS : 0.0f);
        st(out, dto, base + j, expf(x - mx) * inv);
    }
}

__global__ void k_softmax_bwd(void *din, int dtd, const void *out, int dto, const void *dout, int dtg,
                              int64_t T, float scale) {
    __shared__ float sh[THREADS / 32];
    const int64_t base = (int64_t)blockIdx.x * T;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < T; j += THREADS) s += ld(dout, dtg, base + j) * ld(out, dto, base + j);
    s = block_sum(s, sh);
    for (int64_t j = threadIdx.x; j < T; j += THREADS) {
        float y = ld(out, dto, base + j);
        st(din, dtd, base + j, scale * y * (ld(dout, dtg, base + j) - s));
    }
}

/* ---- fast kernels: a warp per row --------------------------------------------- */

#define SM_ROWS (THREADS / WARP)


/* Eight scaled, masked logits of a row from column c. */
template <typename T>
__device__ __forceinline__ void logits8(float *z, const T *x, const int32_t *mrow, int c, float scale) {
    ld8(x + c, z);
    for (int j = 0; j < 8; j++) z[j] = scale * z[j] + ((mrow && mrow[c + j] == 0) ? TK_MASK_BIAS : 0.0f);
}

template <typename T>
__global__ void k_softmax_drop_fwd8(T *P, T *PD, const T *in, const int32_t *mask, int64_t rows, int64_t NH,
                                    int T_, float scale, float p, float pscale, uint64_t key, uint64_t offset) {
    const int lane = threadIdx.x % WARP;
    const int64_t row = (int64_t)blockIdx.x * SM_ROWS + threadIdx.x / WARP;
    if (row >= rows) return;
    const int64_t base = row * T_;
    const int32_t *mrow = mask ? mask + (row / (NH * T_)) * T_ : NULL;
    float mx = -INFINITY;
    for (int c = lane * 8; c < T_; c += WARP * 8) {
        float z[8];
        logits8(z, in + base, mrow, c, scale);
        for (int j = 0; j < 8; j++) mx = fmaxf(mx, z[j]);
    }
    mx = warp_max(mx);
    float inv = 0.0f;
    if (mx != -INFINITY) { /* else every logit is -inf: zeros, as the reference */
        float s = 0.0f;
        for (int c = lane * 8; c < T_; c += WARP * 8) {
            float z[8];
            logits8(z, in + base, mrow, c, scale);
            for (int j = 0; j < 8; j++) s += expf(z[j] - mx);
        }
        inv = 1.0f / warp_sum(s);
    }
    for (int c = lane * 8; c < T_; c += WARP * 8) {
        float z[8], d[8];
        logits8(z, in + base, mrow, c, scale);
        for (int j = 0; j < 8; j++) {
            z[j] = mx == -INFINITY ? 0.0f : expf(z[j] - mx) * inv;
            if (PD) {
                int keep = tk_dropout_keep(key, offset + (uint64_t)(base + c + j), p);
                d[j] = keep ? stored<T>(z[j]) * pscale : 0.0f;
            }
        }
        st8(P + base + c, z);
        if (PD) st8(PD + base + c, d);
    }
}

/* Eight of a row's P and dP from column c: dP regenerated from dPD through
 * the dropout mask (nothing stored), rounded as tk_op_dropout_bwd's output. */
template <typename T>
__device__ __forceinline__ void probs_grads8(float *y, float *d, const T *P, const T *dPD, int64_t base, int c, float p,
                                             float pscale, uint64_t key, uint64_t offset) {
    ld8(P + base + c, y);
    ld8(dPD + base + c, d);
    if (p > 0.0f)
        for (int j = 0; j < 8; j++)
            d[j] = tk_dropout_keep(key, offset + (uint64_t)(base + c + j), p) ? stored<T>(d[j] * pscale) : 0.0f;
}

template <typename T>
__global__ void k_softmax_drop_bwd8(T *din, const T *P, const T *dPD, int64_t rows, int T_, float scale, float p,
                                    float pscale, uint64_t key, uint64_t offset) {
    const int lane = threadIdx.x % WARP;
    const int64_t row = (int64_t)blockIdx.x * SM_ROWS + threadIdx.x / WARP;
    if (row >= rows) return;
    const int64_t base = row * T_;
    float s = 0.0f;
    for (int c = lane * 8; c < T_; c += WARP * 8) {
        float y[8], d[8];
        probs_grads8(y, d, P, dPD, base, c, p, pscale, key, offset);
        for (int j = 0; j < 8; j++) s += d[j] * y[j];
    }
    s = warp_sum(s);
    for (int c = lane * 8; c < T_; c += WARP * 8) {
        float y[8], d[8];
        probs_grads8(y, d, P, dPD, base, c, p, pscale, key, offset);
        for (int j = 0; j < 8; j++) d[j] = scale * y[j] * (d[j] - s);
        st8(din + base + c, d);
    }
}

/* ---- launchers ---------------------------------------------------------------------- */

extern "C" {

tk_status tk_cuda_softmax_fwd(void *ctx, tk_tensor *out, const tk_tensor *in, const tk_tensor *mask,
                              int64_t B, int64_t NH, int64_t T, float scale) {
    NEED_FLOAT("softmax_fwd", out); NEED_FLOAT("softmax_fwd", in);
    if (mask) NEED_I32("softmax_fwd", mask);
    int64_t rows = B * NH * T;
    if (rows == 0) return TK_OK;
    if (rows > INT32_MAX) return bad("softmax_fwd", "more than 2^31 rows");
    TK_LAUNCH(k_softmax_fwd, (unsigned)rows, THREADS)(out->data, DT(out), in->data, DT(in),
                                               mask ? (const int32_t *)mask->data : NULL, NH, T, scale);
    TK_CU_LAUNCHED("k_softmax_fwd");
    return TK_OK;
}

tk_status tk_cuda_softmax_bwd(void *ctx, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout,
                              int64_t rows, int64_t T, float scale) {
    NEED_FLOAT("softmax_bwd", din); NEED_FLOAT("softmax_bwd", out); NEED_FLOAT("softmax_bwd", dout);
    if (rows == 0 || T == 0) return TK_OK;
    if (rows > INT32_MAX) return bad("softmax_bwd", "more than 2^31 rows");
    TK_LAUNCH(k_softmax_bwd, (unsigned)rows, THREADS)(din->data, DT(din), out->data, DT(out), dout->data,
                                               DT(dout), T, scale);
    TK_CU_LAUNCHED("k_softmax_bwd");
    return TK_OK;
}

tk_status tk_cuda_softmax_dropout_fwd(void *ctx, tk_tensor *P, tk_tensor *PD, const tk_tensor *in,
                                      const tk_tensor *mask, int64_t B, int64_t NH, int64_t T, float scale,
                                      float p, uint64_t seed, uint64_t offset) {
    NEED_FLOAT("softmax_dropout_fwd", P); NEED_FLOAT("softmax_dropout_fwd", in);
    if (PD) NEED_FLOAT("softmax_dropout_fwd", PD);
    if (mask) NEED_I32("softmax_dropout_fwd", mask);
    const int64_t rows = B * NH * T;
    if (rows == 0 || T == 0) return TK_OK;
    if (FAST() && T <= INT32_MAX && same3(P, in, PD ? PD : in) &&
        fast8(T, P->data, in->data, PD ? PD->data : NULL) && (rows + SM_ROWS - 1) / SM_ROWS <= INT32_MAX) {
        TK_FLOAT_TYPE(DT(P), TT,
            TK_LAUNCH(k_softmax_drop_fwd8<TT>, (unsigned)((rows + SM_ROWS - 1) / SM_ROWS), THREADS)(
                (TT *)P->data, PD ? (TT *)PD->data : (TT *)NULL, (const TT *)in->data,
                mask ? (const int32_t *)mask->data : NULL, rows, NH, (int)T, scale, p, tk_dropout_scale(p),
                tk_dropout_key(seed), offset));
        TK_CU_LAUNCHED("k_softmax_drop_fwd8");
        return TK_OK;
    }
    tk_status st = tk_cuda_softmax_fwd(ctx, P, in, mask, B, NH, T, scale);
    return st == TK_OK && PD ? tk_cuda_dropout_fwd(ctx, PD, NULL, P, rows * T, p, seed, offset) : st;
}

tk_status tk_cuda_softmax_dropout_bwd(void *ctx, tk_tensor *din, const tk_tensor *P, const tk_tensor *dPD,
                                      int64_t rows, int64_t T, float scale, float p, uint64_t seed,
                                      uint64_t offset) {
    NEED_FLOAT("softmax_dropout_bwd", din); NEED_FLOAT("softmax_dropout_bwd", P);
    NEED_FLOAT("softmax_dropout_bwd", dPD);
    if (rows == 0 || T == 0) return TK_OK;
    if (FAST() && T <= INT32_MAX && same3(din, P, dPD) && fast8(T, din->data, P->data, dPD->data) &&
        (rows + SM_ROWS - 1) / SM_ROWS <= INT32_MAX) {
        TK_FLOAT_TYPE(DT(din), TT,
            TK_LAUNCH(k_softmax_drop_bwd8<TT>, (unsigned)((rows + SM_ROWS - 1) / SM_ROWS), THREADS)(
                (TT *)din->data, (const TT *)P->data, (const TT *)dPD->data, rows, (int)T, scale, p,
                tk_dropout_scale(p), tk_dropout_key(seed), offset));
        TK_CU_LAUNCHED("k_softmax_drop_bwd8");
        return TK_OK;
    }
    tk_status st = tk_cuda_dropout_bwd(ctx, din, dPD, rows * T, p, seed, offset);
    return st == TK_OK ? tk_cuda_softmax_bwd(ctx, din, P, din, rows, T, scale) : st;
}

} /* extern "C" */
