/* tk_ops_spec.h — bit-exact definitions every backend must share.
 *
 * The one copy of each numeric rule: the cpu backend (gpu/cpu_backend.c,
 * gpu/cpu_attention.c), the cuda kernels (gpu/cuda/), dtype.c's public
 * converters and bert/'s generators all include this file, so a rule changes
 * in one place. It holds: splitmix64 (dropout and every seeded generator),
 * dropout's mask and scale, the 8-bit AdamW codes, the AdamW update, the
 * attention mask's bias and fp16/bf16 <-> fp32 conversion.
 *
 * Two ops promise the same result on every backend: dropout (the same
 * (seed, offset) gives the same mask, so recompute and the cpu/cuda parity
 * tests reproduce it) and the 8-bit AdamW state codes (a checkpointed or
 * planned q8 state means the same numbers everywhere). Their arithmetic lives
 * here as static inline functions that compile with gcc and with nvcc
 * (TK_SPEC_FN adds __host__ __device__ there). Everything is integer
 * arithmetic or single IEEE operations (+, *, /, sqrtf) that are correctly
 * rounded on both sides; CUDA code must not be built with --use_fast_math and
 * the q8 coders use __fmul_rn/__fadd_rn so nvcc cannot contract them into FMAs.
 *
 * Dropout generator (counter based, stateless):
 *   key  = mix64(seed ^ 0x6A09E667F3BCC909)
 *   h(i) = mix64(key + (offset + i) * 0x9E3779B97F4A7C15)      (mod 2^64)
 *   u(i) = (float)(h(i) >> 40) * 2^-24                           (exact, in [0,1))
 *   element i is kept  <=>  u(i) >= p ; kept values are multiplied by
 *   scale = 1.0f / (1.0f - p) (one IEEE float division).
 * mix64 is the splitmix64 finaliser (Steele, Lea, Flood 2014):
 *   z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31.
 *
 * 8-bit AdamW state (block-wise, TK_Q8_BLOCK elements share one f32 scale):
 *   m (signed, i8 code q in [-127,127]):  scale = max |m| over the block;
 *       encode a = round_half_up(sqrt(|m|/scale) * 127), q = sign(m) * a;
 *       decode t = |q| / 127, m = sign(q) * scale * t * t.
 *   v (unsigned, u8 code q in [0,255]):   scale = max v over the block;
 *       encode q = round_half_up(sqrt(sqrt(v/scale)) * 255);
 *       decode t = q / 255, v = scale * (t*t) * (t*t).
 *   A square (m) and fourth-power (v) map spends the codes near zero, where
 *   Adam moments cluster, much like a dynamic map but cheap to compute. The
 *   relative error of sqrt(v), which is what the update divides by, stays
 *   below ~1/q. A scale of 0 means an all-zero block (every code 0).
 */
#ifndef TK_OPS_SPEC_H
#define TK_OPS_SPEC_H

#include <stdint.h>
#include <string.h>

#include "tk_gpu.h"

#ifdef __CUDACC__
#include <math.h>
#define TK_SPEC_FN static __host__ __device__ __forceinline__
/* __fmul_rn and friends are device-only: the host pass of nvcc uses the
 * plain operators (host code does not contract them). */
TK_SPEC_FN float tk_spec_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
TK_SPEC_FN float tk_spec_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
TK_SPEC_FN float tk_spec_sqrt(float a) {
#ifdef __CUDA_ARCH__
    return __fsqrt_rn(a);
#else
    return sqrtf(a);
#endif
}
#define TK_SPEC_MUL(a, b) tk_spec_mul((a), (b))
#define TK_SPEC_ADD(a, b) tk_spec_add((a), (b))
#define TK_SPEC_SQRT(a) tk_spec_sqrt(a)
#else
#include <math.h>
#define TK_SPEC_FN static inline
#define TK_SPEC_MUL(a, b) ((a) * (b))
#define TK_SPEC_ADD(a, b) ((a) + (b))
#define TK_SPEC_SQRT(a) sqrtf(a)
#endif

#define TK_DROPOUT_SEED_SALT 0x6A09E667F3BCC909ULL
#define TK_DROPOUT_GOLDEN 0x9E3779B97F4A7C15ULL

TK_SPEC_FN uint64_t tk_spec_mix64(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z;
}

/* splitmix64 as a stream: advance the state by the golden gamma, mix. Every
 * seeded generator (weight init, batch order, splits and shuffles) draws from
 * it, so a seed gives the same numbers on every machine and C library. */
TK_SPEC_FN uint64_t tk_spec_splitmix64(uint64_t *state) {
    return tk_spec_mix64(*state += TK_DROPOUT_GOLDEN);
}

/* The per-call key; compute once per op. */
TK_SPEC_FN uint64_t tk_dropout_key(uint64_t seed) {
    return tk_spec_mix64(seed ^ TK_DROPOUT_SEED_SALT);
}

/* The uniform in [0,1) for absolute element index idx = offset + i. */
TK_SPEC_FN float tk_dropout_u(uint64_t key, uint64_t idx) {
    uint64_t h = tk_spec_mix64(key + idx * TK_DROPOUT_GOLDEN);
    return (float)(uint32_t)(h >> 40) * (1.0f / 16777216.0f);
}

TK_SPEC_FN int tk_dropout_keep(uint64_t key, uint64_t idx, float p) {
    return tk_dropout_u(key, idx) >= p;
}

/* Kept values are scaled by one IEEE division; p <= 0 keeps everything
 * unscaled, p >= 1 drops everything. */
TK_SPEC_FN float tk_dropout_scale(float p) {
    return p <= 0.0f ? 1.0f : (p < 1.0f ? 1.0f / (1.0f - p) : 0.0f);
}

/* ---- fused attention's keep mask ----
 * tk_op_attention_fwd keeps its dropout decisions for backward as one bit per
 * (sequence*head bh, query i, key j), in the order the tensor-core forward
 * (gpu/cuda/attention.cu) holds the scores in registers, so that each of its
 * lanes writes one 32-bit word per 64 x 64 tile and the dQ kernel reads it
 * back the same way:
 *   tile  (bh, i/64, j/64) row-major, nt = ceil(T/64) tiles a side, each 128
 *         words (512 bytes): T = 512 is T*T/8 bytes a head, other T padded;
 *   word  (i%64/16)*32 + (i%8)*4 + (j%8)/2 in its tile (the mma fragment's
 *         warp and lane: g = i%8, t = (j%8)/2);
 *   bit   (j%64/8)*4 + (i%16/8)*2 + j%2 (n-tile and register).
 * A bit is 1 <=> tk_dropout_keep(key, offset + (bh*T + i)*T + j, p): the
 * dropout's own bits. Bits of i or j >= T are 0. Words are little-endian in
 * the op's u8 tensor (every host and card this builds for). */
#define TK_ATTN_KEEP_TILE 64

/* 32-bit words of one sequence*head's mask */
TK_SPEC_FN int64_t tk_attn_keep_words(int64_t T) {
    const int64_t nt = (T + TK_ATTN_KEEP_TILE - 1) / TK_ATTN_KEEP_TILE;
    return nt * nt * 128;
}

/* Where (query i, key j)'s bit is: the word (in its sequence*head's words)
 * returned, the bit in *bit. */
TK_SPEC_FN int64_t tk_attn_keep_at(int64_t T, int64_t i, int64_t j, int *bit) {
    const int64_t nt = (T + TK_ATTN_KEEP_TILE - 1) / TK_ATTN_KEEP_TILE;
    *bit = (int)((j % 64 / 8) * 4 + (i % 16 / 8) * 2 + (j & 1));
    return ((i / 64) * nt + j / 64) * 128 + (i % 64 / 16) * 32 + (i % 8) * 4 + (j % 8) / 2;
}

/* Word w of sequence*head bh's mask (dropout key and offset as tk_attn's). */
TK_SPEC_FN uint32_t tk_attn_keep_word(uint64_t key, uint64_t offset, float p, int64_t T, int64_t bh, int64_t w) {
    const int64_t nt = (T + TK_ATTN_KEEP_TILE - 1) / TK_ATTN_KEEP_TILE, tile = w / 128, x = w % 128;
    const int64_t g = x % 32 / 4, t = x % 4, i0 = tile / nt * 64 + x / 32 * 16 + g, j0 = tile % nt * 64 + 2 * t;
    uint32_t bits = 0;
    for (int n = 0; n < 8; n++)
        for (int e = 0; e < 4; e++) {
            const int64_t i = i0 + 8 * (e >> 1), j = j0 + 8 * n + (e & 1);
            if (i < T && j < T && tk_dropout_keep(key, offset + (uint64_t)((bh * T + i) * T + j), p))
                bits |= 1u << (n * 4 + e);
        }
    return bits;
}

/* ---- attention mask ---- */

/* Added to the scores of masked keys before softmax: -FLT_MAX, so a masked
 * key's probability is exactly 0 (exp underflows) while an all-masked row
 * stays finite (uniform), as HF's finfo.min additive mask. */
#define TK_MASK_BIAS (-3.4028234663852886e38f)

/* ---- q8 state codes ---- */

TK_SPEC_FN int8_t tk_q8_encode_m(float m, float scale) {
    if (!(scale > 0.0f)) return 0;
    float r = fabsf(m) / scale;
    if (r > 1.0f) r = 1.0f;
    float a = floorf(TK_SPEC_ADD(TK_SPEC_MUL(TK_SPEC_SQRT(r), 127.0f), 0.5f));
    int q = (int)a;
    if (q > 127) q = 127;
    return (int8_t)(m < 0.0f ? -q : q);
}

TK_SPEC_FN float tk_q8_decode_m(int8_t q, float scale) {
    int a = q < 0 ? -q : q;
    float t = (float)a / 127.0f;
    float v = TK_SPEC_MUL(scale, TK_SPEC_MUL(t, t));
    return q < 0 ? -v : v;
}

TK_SPEC_FN uint8_t tk_q8_encode_v(float v, float scale) {
    if (!(scale > 0.0f) || !(v > 0.0f)) return 0;
    float r = v / scale;
    if (r > 1.0f) r = 1.0f;
    float a = floorf(TK_SPEC_ADD(TK_SPEC_MUL(TK_SPEC_SQRT(TK_SPEC_SQRT(r)), 255.0f), 0.5f));
    int q = (int)a;
    if (q > 255) q = 255;
    return (uint8_t)q;
}

TK_SPEC_FN float tk_q8_decode_v(uint8_t q, float scale) {
    float t = (float)q / 255.0f;
    float t2 = TK_SPEC_MUL(t, t);
    return TK_SPEC_MUL(scale, TK_SPEC_MUL(t2, t2));
}

/* ---- AdamW ---- */

/* torch.optim.AdamW (foreach=False), in one operation order so that, with
 * FMA contraction off (gcc's default for separate statements here, nvcc
 * -fmad=false), f32 results agree bit for bit on every backend:
 *   g *= grad_scale; p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). */
typedef struct tk_adamw_coef {
    float decay, b1, b2, omb1, omb2, step_size, inv_sqrt_bc2, eps, grad_scale;
} tk_adamw_coef;

TK_SPEC_FN tk_adamw_coef tk_adamw_coef_of(const tk_adamw_hp *hp) {
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

/* One element. g is the gradient already multiplied by grad_scale; m and v
 * in: the previous moments (decoded, for 8-bit); out: the new ones. */
TK_SPEC_FN void tk_adamw_update(float *p, float *m, float *v, float g, const tk_adamw_coef *k) {
    float mi = k->b1 * *m + k->omb1 * g;
    float vi = k->b2 * *v + k->omb2 * g * g;
    *m = mi; /* p, m and v are distinct elements */
    *v = vi;
    *p = *p * k->decay - k->step_size * mi / (sqrtf(vi) * k->inv_sqrt_bc2 + k->eps);
}

/* ---- fp16 / bf16 <-> fp32 ---- */

/* Round to nearest even, subnormals included; NaN stays a quiet NaN with its
 * top payload bits (as F16C's vcvtps2ph and CUDA's __float2half_rn), and
 * infinities stay infinite. */
TK_SPEC_FN uint32_t tk_spec_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
TK_SPEC_FN float tk_spec_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

TK_SPEC_FN uint16_t tk_spec_f32_to_f16(float f) {
    uint32_t x = tk_spec_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or NaN: keep NaN quiet and non-zero */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) { /* below 2^-14: fp16 subnormal or zero */
        if (absx < 0x33000000u) return sign; /* below half the smallest subnormal */
        uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
        int shift = 113 - (int)(absx >> 23) + 13; /* 126 - exp + 13 - 14 + 1 */
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((absx >> 13) - (112u << 10)); /* rebias exponent 127 -> 15 */
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* carry may bump the exponent */
    return (uint16_t)(sign | h);
}

TK_SPEC_FN float tk_spec_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return tk_spec_bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) /* zero or subnormal: mant * 2^-24, exact in fp32 */
        return tk_spec_bits_f32(sign | tk_spec_f32_bits((float)mant * (1.0f / 16777216.0f)));
    return tk_spec_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

TK_SPEC_FN uint16_t tk_spec_f32_to_bf16(float f) {
    uint32_t x = tk_spec_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

TK_SPEC_FN float tk_spec_bf16_to_f32(uint16_t h) { return tk_spec_bits_f32((uint32_t)h << 16); }

#endif
