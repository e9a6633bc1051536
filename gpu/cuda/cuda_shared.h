/* cuda_shared.h — index arithmetic the cuda kernels share with their host
 * tests: the column-major GEMM arguments, the head/bias index maps and the
 * dropout test with its per-row work hoisted (the attention kernels). The
 * numeric rules both backends follow (AdamW, dropout, q8 codes, the mask
 * bias, fp16/bf16) are gpu/tk_ops_spec.h's, included here.
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

/* ---- dropout, hoisted ----------------------------------------------------------
 * tk_dropout_keep(key, row + j, p) with the per-row work done once: the hash
 * input key + (row + j)*G is tk_drop_row_base(key, row) + j*G (mod 2^64).
 * Its test u >= p, u = (h >> 40) / 2^24, is (h >> 40) >= ceil(p 2^24), i.e.
 * the high word of h >= tk_drop_keep_min(p) = ceil(p 2^24) * 256; of the
 * last mix step only that high word is formed (three 32-bit multiplies for a
 * 64-bit one). p >= 1 gives 0xffffffff, which keeps a word of all ones where
 * tk_dropout_keep keeps nothing: the factor, tk_dropout_scale(p) = 0, drops
 * it anyway. Host-tested bit for bit against tk_dropout_keep. */
TK_HD uint64_t tk_drop_row_base(uint64_t key, uint64_t row) { return key + row * TK_DROPOUT_GOLDEN; }

TK_HD uint32_t tk_drop_keep_min(float p) {
    const double t = ceil((double)p * 16777216.0);
    return t <= 0.0 ? 0u : t >= 16777216.0 ? 0xffffffffu : (uint32_t)t << 8;
}

/* z: the hash's input, key + idx*G. */
TK_HD int tk_drop_keep_z(uint64_t z, uint32_t keep_min) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    const uint32_t lo = (uint32_t)z, hi = (uint32_t)(z >> 32), cl = 0x133111EBu, ch = 0x94D049BBu;
    const uint32_t h = (uint32_t)(((uint64_t)lo * cl) >> 32) + lo * ch + hi * cl; /* (z * C) >> 32 */
    return (h ^ (h >> 31)) >= keep_min; /* z ^= z >> 31, its high word */
}

TK_HD int tk_drop_keep_hi(uint64_t base, uint64_t j, uint32_t keep_min) {
    return tk_drop_keep_z(base + j * TK_DROPOUT_GOLDEN, keep_min);
}

#endif
