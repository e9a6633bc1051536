/* cuda_shared.h — the per-element rules the cuda kernels must share bit for
 * bit with the cpu backend (gpu/cpu_backend.c): the dropout generator, the
 * AdamW update and the 8-bit moment quantisation. Written so that nvcc
 * (device and host) and a plain C compiler both take it, which lets a host
 * test check these functions against the cpu backend without a GPU.
 */
#ifndef TK_CUDA_SHARED_H
#define TK_CUDA_SHARED_H

#include <math.h>
#include <stdint.h>
#include "tk_gpu.h"

#ifdef __CUDACC__
#define TK_HD __host__ __device__ __forceinline__
#else
#define TK_HD static inline
#endif

/* ---- dropout -------------------------------------------------------------- */

/* splitmix64 finaliser over (seed, index): a counter-based generator, so
 * element i's draw depends on nothing but (seed, offset + i). */
TK_HD uint64_t tk_dropout_hash(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Kept when the top 24 bits, as a uniform draw in [0, 1), are >= p. */
TK_HD int tk_dropout_keep(uint64_t seed, uint64_t i, float p) {
    float u = (float)(tk_dropout_hash(seed, i) >> 40) * (1.0f / 16777216.0f);
    return u >= p;
}

TK_HD float tk_dropout_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

/* ---- AdamW ------------------------------------------------------------------- */

/* Per-step constants, computed once on the host. */
typedef struct tk_adamw_coef {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    float bc1, bc2; /* 1 - beta^step */
} tk_adamw_coef;

TK_HD tk_adamw_coef tk_adamw_coef_of(const tk_adamw_hp *hp) {
    tk_adamw_coef k;
    k.lr = hp->lr;
    k.beta1 = hp->beta1;
    k.beta2 = hp->beta2;
    k.eps = hp->eps;
    k.weight_decay = hp->weight_decay;
    k.grad_scale = hp->grad_scale;
    k.bc1 = (float)(1.0 - pow((double)hp->beta1, (double)hp->step));
    k.bc2 = (float)(1.0 - pow((double)hp->beta2, (double)hp->step));
    return k;
}

/* torch.optim.AdamW's order: decay the weight, then the Adam step. */
TK_HD void tk_adamw_update(float *p, float *m, float *v, float g, const tk_adamw_coef *k) {
    float mi = k->beta1 * *m + (1.0f - k->beta1) * g;
    float vi = k->beta2 * *v + (1.0f - k->beta2) * g * g;
    float mhat = mi / k->bc1;
    float vhat = vi / k->bc2;
    float pi = *p * (1.0f - k->lr * k->weight_decay);
    pi -= k->lr * mhat / (sqrtf(vhat) + k->eps);
    *p = pi;
    *m = mi;
    *v = vi;
}

/* ---- 8-bit moments ---------------------------------------------------------------- */

/* m: signed, linear in [-absmax, absmax] -> [-127, 127]; v >= 0: linear in
 * [0, max] -> [0, 255]. A zero scale stores zeros. */
TK_HD float tk_q8_m_dequant(int8_t q, float scale) { return (float)q * (scale / 127.0f); }
TK_HD float tk_q8_v_dequant(uint8_t q, float scale) { return (float)q * (scale / 255.0f); }
TK_HD int8_t tk_q8_m_quant(float m, float absmax) {
    if (!(absmax > 0.0f)) return 0;
    float q = rintf(m / absmax * 127.0f);
    return (int8_t)(q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q));
}
TK_HD uint8_t tk_q8_v_quant(float v, float vmax) {
    if (!(vmax > 0.0f)) return 0;
    float q = rintf(v / vmax * 255.0f);
    return (uint8_t)(q > 255.0f ? 255.0f : (q < 0.0f ? 0.0f : q));
}

#endif
