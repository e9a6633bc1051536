/* cuda_ops.cu — the cuda backend's own kernels: every op except gemm and
 * fused attention (attention.cu).
 *
 * Semantics are those documented in tk_gpu.h and implemented by the cpu
 * backend (gpu/cpu_backend.c), which is the reference the GPU tests compare
 * against. Float tensors may be f32, f16 or bf16 independently of each
 * other; every kernel loads to fp32, computes in fp32 and rounds once on
 * store (round to nearest even, as tk_f32_to_f16/bf16).
 *
 * Guarantees:
 *  - Deterministic: no float atomics. Embedding and scatter accumulation
 *    walk the rows in order, one thread per column, so they add in the cpu
 *    backend's order. Column sums (bias and LayerNorm weight gradients) use
 *    a fixed split of the rows over 8 lanes; whole-tensor sums a fixed
 *    two-pass reduction in the plugin's scratch. A run repeats bit for bit.
 *  - Ops never allocate. An index out of range (token id, label, row) is
 *    skipped and sets a sticky flag that the next sync reports.
 *  - Every launch is followed by a launch-error check returning TK_EDEVICE.
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include "cuda_internal.h"
#include "cuda_shared.h"

/* Every launch goes through TK_LAUNCH(kernel, grid, block[, smem])(args):
 * nvcc's <<<>>> here; tests/gpu_cuda_host/cuda_emu.h defines it to run the
 * same kernels on host threads, so `make test` runs this file without a GPU. */
#ifndef TK_LAUNCH
#define TK_LAUNCH(k, ...) k<<<__VA_ARGS__>>>
#endif

#define THREADS 256
static_assert(TK_Q8_BLOCK == THREADS, "k_adamw8 runs one thread per element of a block");

/* ---- element access -------------------------------------------------------- */

__device__ __forceinline__ float ld(const void *p, int dt, int64_t i) {
    switch (dt) {
    case TK_F16: return __half2float(((const __half *)p)[i]);
    case TK_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

__device__ __forceinline__ void st(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case TK_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case TK_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v; break;
    }
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

static int64_t numel_of(const tk_tensor *t) {
    if (t->ndim < 1) return -1; /* unknown: the row range is then not checked */
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Rows of C elements the tensor holds, or -1 when its shape says nothing. */
static int64_t rows_of(const tk_tensor *t, int64_t C) {
    int64_t n = numel_of(t);
    return (n < 0 || C <= 0) ? -1 : n / C;
}

static int is_float(tk_dtype dt) { return dt == TK_F32 || dt == TK_F16 || dt == TK_BF16; }

static tk_status bad(const char *op, const char *what) {
    fprintf(stderr, "txkernel cuda: %s: %s\n", op, what);
    return TK_EINVAL;
}

#define NEED_FLOAT(op, t) do { if (!is_float((t)->dtype)) return bad(op, #t " must be f32, f16 or bf16"); } while (0)
#define NEED_I32(op, t) do { if ((t)->dtype != TK_I32) return bad(op, #t " must be i32"); } while (0)

static unsigned grid_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    if (b > 65535 * 8) b = 65535 * 8;
    return (unsigned)(b < 1 ? 1 : b);
}

#define GRID_STRIDE(i, n) for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
                               i += (int64_t)gridDim.x * blockDim.x)

/* ---- block reductions (blockDim.x == THREADS) ------------------------------ */

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block, result in every thread. sh holds THREADS/32 values. */
template <typename T> __device__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T t = (threadIdx.x < THREADS / 32) ? sh[threadIdx.x] : (T)0;
    if (w == 0) t = warp_sum(t);
    if (threadIdx.x == 0) sh[0] = t;
    __syncthreads();
    return sh[0];
}

__device__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = (threadIdx.x < THREADS / 32) ? sh[threadIdx.x] : -INFINITY;
    if (w == 0) t = warp_max(t);
    if (threadIdx.x == 0) sh[0] = t;
    __syncthreads();
    return sh[0];
}

/* ---- elementwise ----------------------------------------------------------- */

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

#define INV_SQRT2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f

__global__ void k_gelu_fwd(void *out, int dto, const void *in, int dti, int64_t n) {
    GRID_STRIDE(i, n) {
        float x = ld(in, dti, i);
        st(out, dto, i, 0.5f * x * (1.0f + erff(x * INV_SQRT2)));
    }
}

__global__ void k_gelu_bwd(void *din, int dtd, const void *in, int dti, const void *dout, int dtg, int64_t n) {
    GRID_STRIDE(i, n) {
        float x = ld(in, dti, i);
        float cdf = 0.5f * (1.0f + erff(x * INV_SQRT2));
        float pdf = INV_SQRT_2PI * expf(-0.5f * x * x);
        st(din, dtd, i, ld(dout, dtg, i) * (cdf + x * pdf));
    }
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

/* ---- rows: LayerNorm, softmax, cross-entropy ---------------------------- */

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

/* Column sums: blocks of COL_W columns x COL_H row lanes. Lane y sums rows
 * y, y + COL_H, ... of its column in order; lane 0 then adds the COL_H
 * partials in lane order. Fixed order for a given N, so a run repeats bit
 * for bit, and COL_H times the parallelism of one thread per column. */
#define COL_W 32
#define COL_H 8

/* dw[c] += sum_n dout[n,c] * norm[n,c]; db[c] += sum_n dout[n,c]. */
__global__ void k_layernorm_bwd_wb(void *dw, int dtw, void *db, int dtb, const void *dout, int dtg,
                                   const void *in, int dti, const float *mean, const float *rstd,
                                   int64_t N, int64_t C) {
    __shared__ float pw[COL_H][COL_W], pb[COL_H][COL_W];
    int64_t c = (int64_t)blockIdx.x * COL_W + threadIdx.x;
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int64_t n = threadIdx.y; n < N; n += COL_H) {
            float g = ld(dout, dtg, n * C + c);
            sw += g * ((ld(in, dti, n * C + c) - mean[n]) * rstd[n]);
            sb += g;
        }
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

/* HF BERT's extended attention mask: (1 - mask) * finfo(float32).min, as
 * TK_MASK_BIAS (tk_ops_spec.h). */

/* Rows (B, NH, T, T): row r belongs to batch r / (NH*T); key j is masked
 * where mask[b, j] == 0. */
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

/* Per row: loss = logsumexp(x) - x[label]. */
__global__ void k_xent_fwd(float *losses, void *probs, int dtp, const void *logits, int dtl,
                           const int32_t *labels, int64_t V, unsigned *flags) {
    __shared__ float sh[THREADS / 32];
    __shared__ double shd[THREADS / 32];
    int64_t row = blockIdx.x;
    const int64_t base = row * V;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += THREADS) mx = fmaxf(mx, ld(logits, dtl, base + j));
    mx = block_max(mx, sh);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += THREADS) s += (double)expf(ld(logits, dtl, base + j) - mx);
    s = block_sum(s, shd);
    float inv = (float)(1.0 / s);
    if (probs)
        for (int64_t j = threadIdx.x; j < V; j += THREADS)
            st(probs, dtp, base + j, expf(ld(logits, dtl, base + j) - mx) * inv);
    if (threadIdx.x == 0) {
        int32_t y = labels[row];
        float loss = 0.0f;
        if (y >= V) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
        else if (y >= 0) loss = (mx + (float)log(s)) - ld(logits, dtl, base + y);
        losses[row] = loss;
    }
}

__global__ void k_xent_bwd(void *dlogits, int dtd, const void *logits, int dtl, const int32_t *labels,
                           int64_t V, float scale, unsigned *flags) {
    __shared__ float sh[THREADS / 32];
    __shared__ double shd[THREADS / 32];
    int64_t row = blockIdx.x;
    const int64_t base = row * V;
    int32_t y = labels[row];
    if (y < 0 || y >= V) {
        if (y >= V && threadIdx.x == 0) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
        for (int64_t j = threadIdx.x; j < V; j += THREADS) st(dlogits, dtd, base + j, 0.0f);
        return;
    }
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += THREADS) mx = fmaxf(mx, ld(logits, dtl, base + j));
    mx = block_max(mx, sh);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += THREADS) s += (double)expf(ld(logits, dtl, base + j) - mx);
    s = block_sum(s, shd);
    float inv = (float)(1.0 / s);
    for (int64_t j = threadIdx.x; j < V; j += THREADS) {
        float pr = expf(ld(logits, dtl, base + j) - mx) * inv;
        st(dlogits, dtd, base + j, (j == y ? pr - 1.0f : pr) * scale);
    }
}

/* ---- columns: bias gradient, row gathers and scatters ------------------------- */

/* db[c] += sum_n dout[n, c], in the column-sum layout of k_layernorm_bwd_wb. */
__global__ void k_bias_grad(void *db, int dtb, const void *dout, int dtg, int64_t N, int64_t C) {
    __shared__ float part[COL_H][COL_W];
    int64_t c = (int64_t)blockIdx.x * COL_W + threadIdx.x;
    float s = 0.0f;
    if (c < C)
        for (int64_t n = threadIdx.y; n < N; n += COL_H) s += ld(dout, dtg, n * C + c);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < COL_H; y++) s += part[y][threadIdx.x];
    st(db, dtb, c, ld(db, dtb, c) + s);
}

/* out[i, c] = in[idx[i], c] for idx[i] in [0, rows); else zeros and a flag. */
__global__ void k_gather(void *out, int dto, const void *in, int dti, const int32_t *idx, int64_t n,
                         int64_t C, int64_t rows, unsigned *flags) {
    GRID_STRIDE(k, n * C) {
        int64_t i = k / C, c = k % C;
        int32_t r = idx[i];
        if (r < 0 || (rows >= 0 && r >= rows)) {
            st(out, dto, k, 0.0f);
            if (c == 0) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
        } else {
            st(out, dto, k, ld(in, dti, (int64_t)r * C + c));
        }
    }
}

/* dst[idx[i], c] += src[i, c], i in order: one thread per column, so every
 * element of dst receives its additions in row order, as on the cpu. Rows go
 * four at a time when their four destinations differ (then the order among
 * them cannot matter), which keeps four loads in flight instead of one. */
#define SCATTER_THREADS 64

__device__ __forceinline__ int bad_row(int32_t r, int64_t rows) { return r < 0 || (rows >= 0 && r >= rows); }

__global__ void k_scatter_add(void *__restrict__ dst, int dtd, const void *__restrict__ src, int dts,
                              const int32_t *__restrict__ idx, int64_t n, int64_t C, int64_t rows,
                              unsigned *flags) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        int32_t r0 = idx[i], r1 = idx[i + 1], r2 = idx[i + 2], r3 = idx[i + 3];
        int ok = !bad_row(r0, rows) && !bad_row(r1, rows) && !bad_row(r2, rows) && !bad_row(r3, rows) &&
                 r0 != r1 && r0 != r2 && r0 != r3 && r1 != r2 && r1 != r3 && r2 != r3;
        if (ok) {
            int64_t k0 = (int64_t)r0 * C + c, k1 = (int64_t)r1 * C + c;
            int64_t k2 = (int64_t)r2 * C + c, k3 = (int64_t)r3 * C + c;
            float d0 = ld(dst, dtd, k0), d1 = ld(dst, dtd, k1), d2 = ld(dst, dtd, k2), d3 = ld(dst, dtd, k3);
            float s0 = ld(src, dts, i * C + c), s1 = ld(src, dts, (i + 1) * C + c);
            float s2 = ld(src, dts, (i + 2) * C + c), s3 = ld(src, dts, (i + 3) * C + c);
            st(dst, dtd, k0, d0 + s0);
            st(dst, dtd, k1, d1 + s1);
            st(dst, dtd, k2, d2 + s2);
            st(dst, dtd, k3, d3 + s3);
            continue;
        }
        for (int64_t j = i; j < i + 4; j++) {
            int32_t r = idx[j];
            if (bad_row(r, rows)) {
                if (c == 0) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
                continue;
            }
            int64_t k = (int64_t)r * C + c;
            st(dst, dtd, k, ld(dst, dtd, k) + ld(src, dts, j * C + c));
        }
    }
    for (; i < n; i++) {
        int32_t r = idx[i];
        if (bad_row(r, rows)) {
            if (c == 0) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
            continue;
        }
        int64_t k = (int64_t)r * C + c;
        st(dst, dtd, k, ld(dst, dtd, k) + ld(src, dts, i * C + c));
    }
}

/* (B,T,NH,HS) <-> (B,NH,T,HS). to_heads: out is (B,NH,T,HS). */
__global__ void k_heads(void *out, int dto, const void *in, int dti, int64_t T, int64_t NH, int64_t HS,
                        int64_t total, int to_heads) {
    GRID_STRIDE(k, total) st(out, dto, k, ld(in, dti, tk_heads_src(k, T, NH, HS, to_heads)));
}

__global__ void k_bias_rows(void *Cm, int dtc, const void *bias, int dtb, int64_t M, int64_t N,
                            int64_t strideC, int64_t total, float beta) {
    GRID_STRIDE(k, total) {
        int64_t bi;
        int64_t at = tk_bias_rows_at(k, M, N, strideC, &bi);
        float v = ld(bias, dtb, bi);
        if (beta != 0.0f) v += beta * ld(Cm, dtc, at);
        st(Cm, dtc, at, v);
    }
}

/* ---- sums of squares ---------------------------------------------------------- */

__global__ void k_sumsq_partial(double *red, const void *x, int dtx, int64_t n) {
    __shared__ double sh[THREADS / 32];
    double s = 0.0;
    GRID_STRIDE(i, n) {
        double v = (double)ld(x, dtx, i);
        s += v * v;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) red[blockIdx.x] = s;
}

__global__ void k_sumsq_final(float *out, const double *red, int nblocks, int accumulate) {
    __shared__ double sh[THREADS / 32];
    double s = 0.0;
    for (int i = threadIdx.x; i < nblocks; i += THREADS) s += red[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = (float)(accumulate ? (double)out[0] + s : s);
}

/* ---- AdamW ---------------------------------------------------------------------- */

__global__ void k_adamw(float *param, const void *grad, int dtg, float *m, float *v, int64_t n,
                        tk_adamw_coef k) {
    GRID_STRIDE(i, n) {
        float g = ld(grad, dtg, i) * k.grad_scale;
        float p = param[i], mi = m[i], vi = v[i];
        tk_adamw_update(&p, &mi, &vi, g, &k);
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
    }
}

/* One block per quantisation block of TK_Q8_BLOCK elements (== THREADS). */
__global__ void k_adamw8(float *param, const void *grad, int dtg, int8_t *mq, float *mscale,
                         uint8_t *vq, float *vscale, int64_t n, tk_adamw_coef k) {
    __shared__ float sh[THREADS / 32];
    int64_t blk = blockIdx.x;
    int64_t i = blk * TK_Q8_BLOCK + threadIdx.x;
    int live = i < n;
    float p = 0.0f, mi = 0.0f, vi = 0.0f;
    if (live) {
        float g = ld(grad, dtg, i) * k.grad_scale;
        p = param[i];
        mi = tk_q8_decode_m(mq[i], mscale[blk]);
        vi = tk_q8_decode_v(vq[i], vscale[blk]);
        tk_adamw_update(&p, &mi, &vi, g, &k);
        param[i] = p;
    }
    /* New absmax scales over the block, then re-quantise against them. */
    float am = block_max(live ? fabsf(mi) : 0.0f, sh);
    float av = block_max(live ? vi : 0.0f, sh);
    if (live) {
        mq[i] = tk_q8_encode_m(mi, am);
        vq[i] = tk_q8_encode_v(vi, av);
    }
    if (threadIdx.x == 0) {
        mscale[blk] = am;
        vscale[blk] = av;
    }
}

/* ---- host wrappers ---------------------------------------------------------- */

#define CTX ((tk_cuda_ctx *)ctx)
#define DT(t) ((int)(t)->dtype)

extern "C" {

tk_status tk_cuda_embed_fwd(void *ctx, tk_tensor *out, const tk_tensor *ids, const tk_tensor *table,
                            int64_t n, int64_t C) {
    NEED_FLOAT("embed_fwd", out); NEED_FLOAT("embed_fwd", table); NEED_I32("embed_fwd", ids);
    if (n * C == 0) return TK_OK;
    int64_t rows = rows_of(table, C);
    TK_LAUNCH(k_gather, grid_for(n * C), THREADS)(out->data, DT(out), table->data, DT(table),
                                           (const int32_t *)ids->data, n, C, rows, CTX->flags);
    TK_CU_LAUNCHED("k_gather (embed_fwd)");
    return TK_OK;
}

tk_status tk_cuda_embed_bwd(void *ctx, tk_tensor *dtable, const tk_tensor *ids, const tk_tensor *dout,
                            int64_t n, int64_t C) {
    NEED_FLOAT("embed_bwd", dtable); NEED_FLOAT("embed_bwd", dout); NEED_I32("embed_bwd", ids);
    if (n * C == 0) return TK_OK;
    int64_t rows = rows_of(dtable, C);
    TK_LAUNCH(k_scatter_add, (unsigned)((C + SCATTER_THREADS - 1) / SCATTER_THREADS), SCATTER_THREADS)(
        dtable->data, DT(dtable), dout->data, DT(dout), (const int32_t *)ids->data, n, C, rows, CTX->flags);
    TK_CU_LAUNCHED("k_scatter_add (embed_bwd)");
    return TK_OK;
}

tk_status tk_cuda_add(void *ctx, tk_tensor *out, const tk_tensor *a, const tk_tensor *b, int64_t n) {
    NEED_FLOAT("add", out); NEED_FLOAT("add", a); NEED_FLOAT("add", b);
    if (n == 0) return TK_OK;
    TK_LAUNCH(k_add, grid_for(n), THREADS)(out->data, DT(out), a->data, DT(a), b->data, DT(b), n);
    TK_CU_LAUNCHED("k_add");
    return TK_OK;
}

tk_status tk_cuda_axpby(void *ctx, tk_tensor *y, float alpha, const tk_tensor *x, float beta, int64_t n) {
    NEED_FLOAT("axpby", y); NEED_FLOAT("axpby", x);
    if (n == 0) return TK_OK;
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

tk_status tk_cuda_cast(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n) {
    NEED_FLOAT("cast", out); NEED_FLOAT("cast", in);
    if (n == 0) return TK_OK;
    TK_LAUNCH(k_cast, grid_for(n), THREADS)(out->data, DT(out), in->data, DT(in), n);
    TK_CU_LAUNCHED("k_cast");
    return TK_OK;
}

tk_status tk_cuda_layernorm_fwd(void *ctx, tk_tensor *out, tk_tensor *mean, tk_tensor *rstd,
                                const tk_tensor *in, const tk_tensor *w, const tk_tensor *b,
                                int64_t N, int64_t C, float eps) {
    NEED_FLOAT("layernorm_fwd", out); NEED_FLOAT("layernorm_fwd", in);
    if ((mean && mean->dtype != TK_F32) || (rstd && rstd->dtype != TK_F32))
        return bad("layernorm_fwd", "mean and rstd must be f32");
    if (N == 0 || C == 0) return TK_OK;
    if (N > INT32_MAX) return bad("layernorm_fwd", "more than 2^31 rows");
    TK_LAUNCH(k_layernorm_fwd, (unsigned)N, THREADS)(out->data, DT(out), mean ? (float *)mean->data : NULL,
                                              rstd ? (float *)rstd->data : NULL, in->data, DT(in),
                                              w ? w->data : NULL, w ? DT(w) : 0, b ? b->data : NULL,
                                              b ? DT(b) : 0, C, eps);
    TK_CU_LAUNCHED("k_layernorm_fwd");
    return TK_OK;
}

tk_status tk_cuda_layernorm_bwd(void *ctx, tk_tensor *din, tk_tensor *dw, tk_tensor *db,
                                const tk_tensor *dout, const tk_tensor *in, const tk_tensor *w,
                                const tk_tensor *mean, const tk_tensor *rstd,
                                int64_t N, int64_t C, int accumulate) {
    NEED_FLOAT("layernorm_bwd", dout); NEED_FLOAT("layernorm_bwd", in);
    if (mean->dtype != TK_F32 || rstd->dtype != TK_F32)
        return bad("layernorm_bwd", "mean and rstd must be f32");
    if (N == 0 || C == 0) return TK_OK;
    if (N > INT32_MAX) return bad("layernorm_bwd", "more than 2^31 rows");
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

tk_status tk_cuda_gelu_fwd(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n) {
    NEED_FLOAT("gelu_fwd", out); NEED_FLOAT("gelu_fwd", in);
    if (n == 0) return TK_OK;
    TK_LAUNCH(k_gelu_fwd, grid_for(n), THREADS)(out->data, DT(out), in->data, DT(in), n);
    TK_CU_LAUNCHED("k_gelu_fwd");
    return TK_OK;
}

tk_status tk_cuda_gelu_bwd(void *ctx, tk_tensor *din, const tk_tensor *in, const tk_tensor *dout, int64_t n) {
    NEED_FLOAT("gelu_bwd", din); NEED_FLOAT("gelu_bwd", in); NEED_FLOAT("gelu_bwd", dout);
    if (n == 0) return TK_OK;
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

tk_status tk_cuda_dropout_fwd(void *ctx, tk_tensor *out, tk_tensor *mask, const tk_tensor *in,
                              int64_t n, float p, uint64_t seed, uint64_t offset) {
    NEED_FLOAT("dropout_fwd", out); NEED_FLOAT("dropout_fwd", in);
    if (mask && mask->dtype != TK_U8) return bad("dropout_fwd", "mask must be u8");
    if (n == 0) return TK_OK;
    TK_LAUNCH(k_dropout_fwd, grid_for(n), THREADS)(out->data, DT(out), mask ? (uint8_t *)mask->data : NULL,
                                            in->data, DT(in), n, p, tk_dropout_scale(p), tk_dropout_key(seed), offset);
    TK_CU_LAUNCHED("k_dropout_fwd");
    return TK_OK;
}

tk_status tk_cuda_dropout_bwd(void *ctx, tk_tensor *din, const tk_tensor *dout, int64_t n,
                              float p, uint64_t seed, uint64_t offset) {
    NEED_FLOAT("dropout_bwd", din); NEED_FLOAT("dropout_bwd", dout);
    if (n == 0) return TK_OK;
    TK_LAUNCH(k_dropout_bwd, grid_for(n), THREADS)(din->data, DT(din), dout->data, DT(dout), n, p,
                                            tk_dropout_scale(p), tk_dropout_key(seed), offset);
    TK_CU_LAUNCHED("k_dropout_bwd");
    return TK_OK;
}

tk_status tk_cuda_xent_fwd(void *ctx, tk_tensor *losses, tk_tensor *probs, const tk_tensor *logits,
                           const tk_tensor *labels, int64_t N, int64_t V) {
    NEED_FLOAT("xent_fwd", logits); NEED_I32("xent_fwd", labels);
    if (losses->dtype != TK_F32) return bad("xent_fwd", "losses must be f32");
    if (probs) NEED_FLOAT("xent_fwd", probs);
    if (N == 0) return TK_OK;
    if (N > INT32_MAX) return bad("xent_fwd", "more than 2^31 rows");
    TK_LAUNCH(k_xent_fwd, (unsigned)N, THREADS)((float *)losses->data, probs ? probs->data : NULL,
                                         probs ? DT(probs) : 0, logits->data, DT(logits),
                                         (const int32_t *)labels->data, V, CTX->flags);
    TK_CU_LAUNCHED("k_xent_fwd");
    return TK_OK;
}

tk_status tk_cuda_xent_bwd(void *ctx, tk_tensor *dlogits, const tk_tensor *logits,
                           const tk_tensor *labels, int64_t N, int64_t V, float scale) {
    NEED_FLOAT("xent_bwd", dlogits); NEED_FLOAT("xent_bwd", logits); NEED_I32("xent_bwd", labels);
    if (N == 0) return TK_OK;
    if (N > INT32_MAX) return bad("xent_bwd", "more than 2^31 rows");
    TK_LAUNCH(k_xent_bwd, (unsigned)N, THREADS)(dlogits->data, DT(dlogits), logits->data, DT(logits),
                                         (const int32_t *)labels->data, V, scale, CTX->flags);
    TK_CU_LAUNCHED("k_xent_bwd");
    return TK_OK;
}

tk_status tk_cuda_bias_grad(void *ctx, tk_tensor *db, const tk_tensor *dout, int64_t N, int64_t C) {
    NEED_FLOAT("bias_grad", db); NEED_FLOAT("bias_grad", dout);
    if (C == 0) return TK_OK;
    TK_LAUNCH(k_bias_grad, (unsigned)((C + COL_W - 1) / COL_W), dim3(COL_W, COL_H))(db->data, DT(db), dout->data,
                                                                            DT(dout), N, C);
    TK_CU_LAUNCHED("k_bias_grad");
    return TK_OK;
}

static tk_status heads(tk_tensor *out, const tk_tensor *in, int64_t B, int64_t T, int64_t NH, int64_t HS,
                       int to_heads) {
    NEED_FLOAT(to_heads ? "split_heads" : "merge_heads", out);
    NEED_FLOAT(to_heads ? "split_heads" : "merge_heads", in);
    int64_t total = B * T * NH * HS;
    if (total == 0) return TK_OK;
    TK_LAUNCH(k_heads, grid_for(total), THREADS)(out->data, DT(out), in->data, DT(in), T, NH, HS, total, to_heads);
    TK_CU_LAUNCHED("k_heads");
    return TK_OK;
}

tk_status tk_cuda_split_heads(void *ctx, tk_tensor *out, const tk_tensor *in,
                              int64_t B, int64_t T, int64_t NH, int64_t HS) {
    (void)ctx;
    return heads(out, in, B, T, NH, HS, 1);
}

tk_status tk_cuda_merge_heads(void *ctx, tk_tensor *out, const tk_tensor *in,
                              int64_t B, int64_t T, int64_t NH, int64_t HS) {
    (void)ctx;
    return heads(out, in, B, T, NH, HS, 0);
}

tk_status tk_cuda_gather_rows(void *ctx, tk_tensor *out, const tk_tensor *in, const tk_tensor *idx,
                              int64_t n, int64_t C) {
    NEED_FLOAT("gather_rows", out); NEED_FLOAT("gather_rows", in); NEED_I32("gather_rows", idx);
    if (n * C == 0) return TK_OK;
    int64_t rows = rows_of(in, C);
    TK_LAUNCH(k_gather, grid_for(n * C), THREADS)(out->data, DT(out), in->data, DT(in),
                                           (const int32_t *)idx->data, n, C, rows, CTX->flags);
    TK_CU_LAUNCHED("k_gather (gather_rows)");
    return TK_OK;
}

tk_status tk_cuda_scatter_add_rows(void *ctx, tk_tensor *din, const tk_tensor *dout,
                                   const tk_tensor *idx, int64_t n, int64_t C) {
    NEED_FLOAT("scatter_add_rows", din); NEED_FLOAT("scatter_add_rows", dout);
    NEED_I32("scatter_add_rows", idx);
    if (n * C == 0) return TK_OK;
    int64_t rows = rows_of(din, C);
    TK_LAUNCH(k_scatter_add, (unsigned)((C + SCATTER_THREADS - 1) / SCATTER_THREADS), SCATTER_THREADS)(
        din->data, DT(din), dout->data, DT(dout), (const int32_t *)idx->data, n, C, rows, CTX->flags);
    TK_CU_LAUNCHED("k_scatter_add (scatter_add_rows)");
    return TK_OK;
}

tk_status tk_cuda_sumsq(void *ctx, tk_tensor *out, const tk_tensor *x, int64_t n, int accumulate) {
    NEED_FLOAT("sumsq", x);
    if (out->dtype != TK_F32) return bad("sumsq", "out must be f32");
    unsigned nb = grid_for(n);
    if (nb > TK_CUDA_RED_BLOCKS) nb = TK_CUDA_RED_BLOCKS;
    if (n > 0) {
        TK_LAUNCH(k_sumsq_partial, nb, THREADS)(CTX->red, x->data, DT(x), n);
        TK_CU_LAUNCHED("k_sumsq_partial");
    } else {
        nb = 0;
    }
    TK_LAUNCH(k_sumsq_final, 1, THREADS)((float *)out->data, CTX->red, (int)nb, accumulate);
    TK_CU_LAUNCHED("k_sumsq_final");
    return TK_OK;
}

tk_status tk_cuda_adamw(void *ctx, tk_tensor *param, const tk_tensor *grad, tk_tensor *m, tk_tensor *v,
                        int64_t n, const tk_adamw_hp *hp) {
    NEED_FLOAT("adamw", grad);
    if (param->dtype != TK_F32 || m->dtype != TK_F32 || v->dtype != TK_F32)
        return bad("adamw", "param, m and v must be f32");
    if (n == 0) return TK_OK;
    tk_adamw_coef k = tk_adamw_coef_of(hp);
    TK_LAUNCH(k_adamw, grid_for(n), THREADS)((float *)param->data, grad->data, DT(grad), (float *)m->data,
                                      (float *)v->data, n, k);
    TK_CU_LAUNCHED("k_adamw");
    return TK_OK;
}

tk_status tk_cuda_adamw8(void *ctx, tk_tensor *param, const tk_tensor *grad,
                         tk_tensor *m, tk_tensor *mscale, tk_tensor *v, tk_tensor *vscale,
                         int64_t n, const tk_adamw_hp *hp) {
    NEED_FLOAT("adamw8", grad);
    if (param->dtype != TK_F32 || m->dtype != TK_I8 || v->dtype != TK_U8 || mscale->dtype != TK_F32 ||
        vscale->dtype != TK_F32)
        return bad("adamw8", "param f32, m i8, v u8, mscale and vscale f32 expected");
    if (n == 0) return TK_OK;
    int64_t nblk = (n + TK_Q8_BLOCK - 1) / TK_Q8_BLOCK;
    if (nblk > INT32_MAX) return bad("adamw8", "too many quantisation blocks");
    tk_adamw_coef k = tk_adamw_coef_of(hp);
    TK_LAUNCH(k_adamw8, (unsigned)nblk, TK_Q8_BLOCK)((float *)param->data, grad->data, DT(grad),
                                              (int8_t *)m->data, (float *)mscale->data,
                                              (uint8_t *)v->data, (float *)vscale->data, n, k);
    TK_CU_LAUNCHED("k_adamw8");
    return TK_OK;
}

tk_status tk_cuda_bias_rows(void *ctx, tk_tensor *C, const tk_tensor *bias, int64_t M, int64_t N,
                            int64_t batch, int64_t strideC, float beta) {
    (void)ctx;
    NEED_FLOAT("gemm bias", bias);
    int64_t total = M * N * batch;
    if (total == 0) return TK_OK;
    TK_LAUNCH(k_bias_rows, grid_for(total), THREADS)(C->data, DT(C), bias->data, DT(bias), M, N,
                                              batch > 1 ? strideC : M * N, total, beta);
    TK_CU_LAUNCHED("k_bias_rows");
    return TK_OK;
}

} /* extern "C" */
