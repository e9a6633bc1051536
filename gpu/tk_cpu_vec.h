/* tk_cpu_vec.h — vectorisable math shared by the cpu backend's files
 * (cpu_backend.c, cpu_attention.c); internal to gpu/.
 *
 * Files including this should carry
 *   #pragma GCC optimize("no-trapping-math", "no-math-errno")
 * before their includes, or GCC keeps the selects below scalar. */
#ifndef TK_CPU_VEC_H
#define TK_CPU_VEC_H

#include <stdint.h>
#include <string.h>

#include "tk_gpu.h"
#include "tk_ops_spec.h"

/* ---- vectorisable math ---------------------------------------------------------
 * glibc's expf/erff are scalar calls that stop the compiler from vectorising
 * a loop; these are branch-free (selects only) so `omp simd` loops vectorise.
 *  v_exp: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, Cephes' degree-7
 *    polynomial for e^r, 2^n built in the exponent bits; rounding of n by the
 *    1.5*2^23 trick. Relative error about 2 ulp; NaN stays NaN, x > 88
 *    saturates at e^88, and x < -80 gives exactly 0: masked softmax entries
 *    come out 0, and no result lands near the subnormal range (< 1.2e-38),
 *    where x86 arithmetic is ~100x slower (GELU's backward on activations
 *    of magnitude > 13 ran 5x slower before this cutoff).
 */
static inline float v_exp(float x) {
    float xc = x < -80.0f ? -80.0f : (x > 88.0f ? 88.0f : x);
    float t = xc * 1.44269504088896341f + 12582912.0f;
    int32_t ti;
    memcpy(&ti, &t, 4);
    float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t eb = (ti - 0x4B400000 + 127) << 23;
    float sc;
    memcpy(&sc, &eb, 4);
    float res = p * sc;
    return x < -80.0f ? 0.0f : res;
}

/* The transcendental loops as array kernels, each compiled three times: for
 * x86-64-v4 (AVX-512, 16 lanes), x86-64-v3 (AVX2+FMA, 8 lanes) and the
 * baseline (SSE2, 4 lanes); the loader picks one per machine (ifunc). On the
 * 2-core EPYC dev box GELU fwd takes 5.8 ms (v3) vs 2.9 ms (v4) for 4.2M
 * elements. Results may differ in the last bits between the variants (FMA),
 * never between runs on one machine. ASan builds keep the baseline only. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define TK_VEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TK_VEC_CLONES
#endif

/* ---- float tensors as f32 ------------------------------------------------------
 * Float tensors may be f32, f16 or bf16; kernels load a run as f32, work, and
 * store it back in the tensor's dtype (tk_ops_spec.h's rounding). */

/* f16 <-> f32 with the F16C instructions (vcvtph2ps / vcvtps2ph, round to
 * nearest even like tk_spec_f32_to_f16; the tests compare both with _Float16) where
 * the CPU has them: 16-bit activations convert at memory speed instead of
 * through the bit-twiddling loops. */
#if defined(__x86_64__)
typedef _Float16 tk_h16 __attribute__((may_alias));
__attribute__((target("avx2,f16c")))
static inline void h2f_f16c(float *restrict dst, const uint16_t *restrict src, int64_t n) {
    const tk_h16 *h = (const tk_h16 *)src;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] = (float)h[i];
}
__attribute__((target("avx2,f16c")))
static inline void f2h_f16c(uint16_t *restrict dst, const float *restrict src, int64_t n) {
    tk_h16 *h = (tk_h16 *)dst;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) h[i] = (_Float16)src[i];
}
static inline int have_f16c(void) {
    return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
}
#else
static inline void h2f_f16c(float *dst, const uint16_t *src, int64_t n) { (void)dst; (void)src; (void)n; }
static inline void f2h_f16c(uint16_t *dst, const float *src, int64_t n) { (void)dst; (void)src; (void)n; }
static inline int have_f16c(void) { return 0; }
#endif

/* dst[0..n) = src[off..off+n) as f32 */
static inline void tk_cpu_to_f32(float *restrict dst, const void *src, tk_dtype dt, int64_t off, int64_t n) {
    if (dt == TK_F32) {
        memcpy(dst, (const float *)src + off, (size_t)n * 4);
    } else if (dt == TK_F16) {
        const uint16_t *s = (const uint16_t *)src + off;
        if (have_f16c()) h2f_f16c(dst, s, n);
        else
            for (int64_t i = 0; i < n; i++) dst[i] = tk_spec_f16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = tk_spec_bf16_to_f32(s[i]);
    }
}

/* dst[off..off+n) = src[0..n) converted to dt */
static inline void tk_cpu_from_f32(void *dst, tk_dtype dt, int64_t off, const float *restrict src, int64_t n) {
    if (dt == TK_F32) {
        memcpy((float *)dst + off, src, (size_t)n * 4);
    } else if (dt == TK_F16) {
        uint16_t *d = (uint16_t *)dst + off;
        if (have_f16c()) f2h_f16c(d, src, n);
        else
            for (int64_t i = 0; i < n; i++) d[i] = tk_spec_f32_to_f16(src[i]);
    } else {
        uint16_t *d = (uint16_t *)dst + off;
        for (int64_t i = 0; i < n; i++) d[i] = tk_spec_f32_to_bf16(src[i]);
    }
}

#endif
