/* cuda_shared.h — per-element rules the cuda kernels share with the cpu
 * backend (gpu/cpu_backend.c): the AdamW update and the dropout scale. The
 * dropout generator and the 8-bit state codes come from gpu/tk_ops_spec.h.
 * Written so that nvcc (device and host) and a plain C compiler both take it,
 * so a host test can check these functions against the cpu backend without
 * a GPU.
 */
#ifndef TK_CUDA_SHARED_H
#define TK_CUDA_SHARED_H

#include <math.h>
#include <stdint.h>
#include "tk_gpu.h"
#include "tk_ops_spec.h"

#ifdef __CUDACC__
#define TK_HD static __host__ __device__ __forceinline__
#else
#define TK_HD static inline
#endif

/* ---- dropout -------------------------------------------------------------- */

/* The generator and the q8 codes are tk_ops_spec.h's. Kept values are scaled
 * by one IEEE division; p <= 0 keeps everything unscaled, as the cpu backend. */
TK_HD float tk_dropout_scale(float p) {
    return p <= 0.0f ? 1.0f : (p < 1.0f ? 1.0f / (1.0f - p) : 0.0f);
}

/* ---- AdamW ------------------------------------------------------------------- */

/* torch.optim.AdamW (foreach=False), in the cpu backend's exact operation
 * order so that, with FMA contraction off (nvcc -fmad=false), f32 results
 * agree bit for bit:
 *   p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). */
typedef struct tk_adamw_coef {
    float decay, b1, b2, omb1, omb2, step_size, inv_sqrt_bc2, eps, grad_scale;
} tk_adamw_coef;

TK_HD tk_adamw_coef tk_adamw_coef_of(const tk_adamw_hp *hp) {
    tk_adamw_coef k;
    double t = (double)(hp->step > 0 ? hp->step : 1);
    double bc1 = 1.0 - pow((double)hp->beta1, t), bc2 = 1.0 - pow((double)hp->beta2, t);
    k.decay = 1.0f - hp->lr * hp->weight_decay;
    k.b1 = hp->beta1;
    k.b2 = hp->beta2;
    k.omb1 = 1.0f - hp->beta1;
    k.omb2 = 1.0f - hp->beta2;
    k.step_size = (float)(hp->lr / bc1);
    k.inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    k.eps = hp->eps;
    k.grad_scale = hp->grad_scale;
    return k;
}

/* m and v in: the previous moments (decoded, for 8-bit); out: the new ones. */
TK_HD void tk_adamw_update(float *p, float *m, float *v, float g, const tk_adamw_coef *k) {
    float mi = k->b1 * *m + k->omb1 * g;
    float vi = k->b2 * *v + k->omb2 * g * g;
    float pi = *p * k->decay;
    *p = pi - k->step_size * mi / (sqrtf(vi) * k->inv_sqrt_bc2 + k->eps);
    *m = mi;
    *v = vi;
}

/* ---- GEMM layout ------------------------------------------------------------- */

/* A row-major C (M×N) = op(A) @ op(B) is, read column-major, C^T (N×M) =
 * op(B)^T @ op(A)^T: the column-major GEMM gets B first, with m = N, n = M.
 * These are the column-major arguments (BLAS/cuBLAS order) for our call;
 * trans_first/trans_second say whether the first (B) and second (A)
 * operands are transposed. Host-tested against the cpu backend. */
typedef struct tk_gemm_cm {
    int trans_first, trans_second;
    int64_t m, n, k, ld_first, ld_second, ldc;
} tk_gemm_cm;

TK_HD tk_gemm_cm tk_gemm_colmajor(int transA, int transB, int64_t M, int64_t N, int64_t K) {
    tk_gemm_cm g;
    g.trans_first = transB != 0;
    g.trans_second = transA != 0;
    g.m = N;
    g.n = M;
    g.k = K;
    g.ld_first = transB ? K : N;  /* B stored N×K (transB) or K×N, row-major */
    g.ld_second = transA ? M : K; /* A stored K×M (transA) or M×K, row-major */
    g.ldc = N;
    if (g.ld_first < 1) g.ld_first = 1;
    if (g.ld_second < 1) g.ld_second = 1;
    return g;
}

/* ---- index maps ------------------------------------------------------------- */

/* Heads: element k of the output, as an element index of the input.
 * to_heads: out (B,NH,T,HS) from in (B,T,NH,HS); else the reverse. */
TK_HD int64_t tk_heads_src(int64_t k, int64_t T, int64_t NH, int64_t HS, int to_heads) {
    int64_t s = k % HS, r = k / HS;
    if (to_heads) {
        int64_t t = r % T, h = (r / T) % NH, b = r / (T * NH);
        return ((b * T + t) * NH + h) * HS + s;
    }
    int64_t h = r % NH, t = (r / NH) % T, b = r / (NH * T);
    return ((b * NH + h) * T + t) * HS + s;
}

/* Biased GEMM: element k of the batch x M x N grid, as an element index of C
 * (batch matrices strideC apart) and of the bias. */
TK_HD int64_t tk_bias_rows_at(int64_t k, int64_t M, int64_t N, int64_t strideC, int64_t *bias_at) {
    int64_t n = k % N, r = k / N;
    *bias_at = n;
    return (r / M) * strideC + (r % M) * N + n;
}

#endif
