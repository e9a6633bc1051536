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

#endif
