/* tk_ops_spec.h — bit-exact definitions every backend must share.
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

#endif
