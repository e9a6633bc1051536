/* attention.cu — the cuda backend's fused attention: tk_op_attention_fwd/bwd
 * (tk_gpu.h's contract: (B, T, NH, HS) tensors, q-like rows `ld` apart, a
 * per-row log-sum-exp, the counter-based dropout kept as
 * bits for backward).
 *
 * Two implementations, picked per call by gpu/tk_attn_kernel.h's rule:
 *  - the tensor-core kernels below, FlashAttention-2's recurrence on
 *    mma.sync through mma.cuh (m16n8k16 from sm80, m16n8k8 on sm75): f16 or
 *    bf16 tensors, head size 64 or 16, any T (the last tiles masked);
 *  - the reference kernel (cuda_attention.h's phases, fp32 cores) for
 *    everything else; it is what the fast kernels are checked against on a
 *    card (tests/gpu_cuda/gpu_ops.c).
 *
 * The tensor-core kernels. A block is 4 warps; a warp owns 16 rows of a
 * 64-row tile, whose accumulators (scores, output, gradients) live in its
 * registers as mma fragments:
 *   forward  block (64 query rows, sequence*head); per tile of 64 keys: S =
 *            Q K^T, the running row max m and sum l (base 2: scores are
 *            scaled by scale*log2(e)), P = 2^(S - m), O = O*2^(m_old - m) +
 *            dropout(P) V. At the end O / l and lse = (m + log2 l) ln 2.
 *   D        D_i = dO_i . O_i once per query row (k_attn_mma_rowd), kept in
 *            the first 4 bytes of dq's row i, head h until dQ overwrites it
 *            (so nothing is allocated: ops never do).
 *   dK, dV   block (64 keys, sequence*head); per query tile: S^T = K Q^T,
 *            P^T from lse, dV += (P M)^T dO, dP^T = V dO^T, dK += dS^T Q.
 *   dQ       block (64 query rows, sequence*head); per key tile: P rebuilt
 *            from lse, dP = dO V^T, dS = P (dP M - D) scale, dQ += dS K.
 * with M the dropout factor (0 or 1/(1-p)): the forward hashes each element
 * once and stores its keep bit, one 32-bit word per lane and tile in the
 * order its fragments hold them (tk_ops_spec.h's keep mask, B*NH*T*T/8
 * bytes, a planned tensor of the op), which dQ reads back a word per lane
 * and tile, and dK/dV (whose fragments are the transpose) 16 words per lane
 * and tile, both through shared memory; dS's scale is applied once, to
 * dQ and dK. Splitting dQ from dK/dV costs S and dP twice but needs no
 * atomics: every output element has one writer, so a run repeats bit for
 * bit. P and dS go from the accumulators into the next mma as A fragments,
 * rounded to the inputs' 16-bit dtype (FlashAttention does the same).
 * The grid puts the tiles of one sequence*head next to each other (x), so
 * the blocks that read the same K and V run together and share L2.
 *
 * What a tile costs in instructions (bench/attn_sass.py counts them from the
 * SASS; bench/RESULTS.md has the counts, gpu/cuda/ptxas_check.sh holds each
 * kernel to its register budget in the build): the exponent is
 * ex2.approx.ftz (fm_exp2; the kernels have no bit-exact contract and are
 * compiled with FMA contraction, unlike the other files); the forward's
 * dropout test is cuda_shared.h's tk_drop_keep_hi with each row's part of
 * the hash done once, the same bits as tk_dropout_keep, under one branch per
 * tile that every thread of the grid takes the same way (so are the
 * backward kernels' reads of the keep bits).
 *
 * Shared memory: 3 (forward) or 4 (backward) tiles of 64 rows x (HS + 8)
 * 16-bit values (the 8 of padding put the 8 rows an ldmatrix reads in 8
 * different bank groups), three rows of 64 floats and in backward a tile's
 * 128 keep words: 28 KiB / 38 KiB at HS = 64, under the 48 KiB every card gives
 * without opting in. Loads and
 * stores of tiles are 128-bit.
 *
 * The same source runs in the host emulation (tests/gpu_cuda_host/:
 * cuda_emu.h runs every thread as a fiber, mma.cuh's steps as warp
 * operations), where `make test` compares it with the cpu backend.
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_internal.h"
#include "cuda_attention.h"
#include "cuda_shared.h"
#include "mma.cuh"
#include "tk_attn_kernel.h"

#ifndef TK_LAUNCH
#define TK_LAUNCH(k, ...) k<<<__VA_ARGS__>>>
#endif

#ifdef __CUDACC__
#define FM_UNROLL _Pragma("unroll")
#else
#define FM_UNROLL
#endif

#define FM_THREADS 128 /* 4 warps */
#define FM_TILE 64     /* query rows of a block, keys of a tile; 16 per warp */
#define FM_LOG2E 1.4426950408889634f
#define FM_LN2 0.6931471805599453f

/* Every launch's dynamic shared memory (one declaration for every kernel of
 * this file: their element types differ). */
static __device__ __forceinline__ unsigned char *attn_smem() {
#ifdef TK_CUDA_EMU
    return (unsigned char *)tk_emu_dyn_smem; /* cuda_emu.h: the launch's buffer */
#else
    extern __shared__ __align__(16) unsigned char tk_attn_smem[];
    return tk_attn_smem;
#endif
}

/* ---- the reference kernel (cuda_attention.h) ---------------------------------- */

/* One block per (sequence*head, tile); the phases of cuda_attention.h with a
 * barrier after each. The phase count depends only on T and the tiles, so
 * every thread reaches every barrier. */
template <int KIND> __global__ void __launch_bounds__(TK_FA_THREADS) k_attn(tk_fa_args a) {
    tk_fa_smem sh;
    tk_fa_carve(&sh, (float *)attn_smem(), KIND, a.HS, a.qt, a.kt);
    for (int ph = 0;; ph++) {
        int more = tk_fa_phase(KIND, &a, &sh, blockIdx.x, blockIdx.y, ph, threadIdx.x, blockDim.x);
        __syncthreads();
        if (!more) break;
    }
}

/* ---- the tensor-core kernels ---------------------------------------------------- */

typedef struct tk_fm_args {
    const uint16_t *q, *k, *v;    /* (b, t, h, c) at (b*T + t)*ld + h*HS + c */
    const uint16_t *o, *dout;     /* ... at (b*T + t)*ldo + h*HS + c */
    uint16_t *out, *dq, *dk, *dv;
    const float *lse_in;
    float *lse_out;               /* (b*NH + h)*T + t */
    const int32_t *mask;          /* [B, T] or NULL */
    int64_t BH, NH, T, ld, ldo;
    float scale, scale_log2, keep_scale;
    int drop;                     /* p > 0 */
    uint32_t keep_min;            /* fm_keep_hi's threshold for p */
    uint64_t key, offset;         /* dropout */
    uint32_t *keep;               /* p > 0: the keep mask (tk_ops_spec.h), written by forward (unless NULL),
                                     read by dQ and dK/dV */
    int64_t nt;                   /* 64-row tiles a side: ceil(T/64) */
} tk_fm_args;

enum { FM_FWD, FM_DQ, FM_DKV, FM_D };

/* Bytes of shared memory: 16-bit tiles, then three rows of floats (bias,
 * lse and D; the forward uses the first), then in dQ and dK/dV one tile's
 * keep words (128: staged with the tiles, so that no register holds one
 * across the tile's mma passes). */
static size_t fm_smem_bytes(int kind, int64_t HS) {
    const size_t tiles = kind == FM_FWD ? 3 : 4;
    return tiles * FM_TILE * (size_t)(HS + 8) * 2 + 3 * FM_TILE * sizeof(float) +
           (kind == FM_FWD ? 0 : FM_THREADS * sizeof(uint32_t));
}

/* The first keep word of the tile (query tile qt, key tile kt) of
 * sequence*head bh: 128 a tile, one a thread (tk_ops_spec.h). */
static __device__ __forceinline__ int64_t fm_keep_tile(const tk_fm_args &a, int64_t bh, int64_t qt, int64_t kt) {
    return ((bh * a.nt + qt) * a.nt + kt) * FM_THREADS;
}

/* The bits of a forward lane's keep word (bit n*4 + e: key n*8 + 2t + e%2 of
 * the tile) whose key is below rem = T - k0 (1..64): the last tile's
 * padding gets 0 bits. */
static __device__ __forceinline__ uint32_t fm_keep_cols(int64_t rem, int t) {
    uint32_t m = 0;
    FM_UNROLL
    for (int c = 0; c < 2; c++) {
        const int64_t nv = (rem - 2 * t - c + 7) / 8; /* n-tiles with a key below rem */
        const uint32_t low = nv >= 8 ? 0xffffffffu : nv <= 0 ? 0u : (1u << (4 * nv)) - 1u;
        m |= low & (c ? 0xAAAAAAAAu : 0x55555555u);
    }
    return m;
}

/* 1 when the sequence has a kept key (or there is no mask): otherwise every
 * score is 0. One barrier. */
static __device__ __forceinline__ int fm_kept(const tk_fm_args &a, int64_t b) {
    int any = !a.mask;
    for (int64_t j = threadIdx.x; a.mask && j < a.T; j += FM_THREADS) any |= a.mask[b * a.T + j] != 0;
    return __syncthreads_or(any);
}

/* The bias of key j: -inf past T or masked (in a sequence with a kept key). */
static __device__ __forceinline__ float fm_bias(const tk_fm_args &a, int64_t b, int64_t j, int kept) {
    if (j >= a.T) return -INFINITY;
    return a.mask && kept && a.mask[b * a.T + j] == 0 ? -INFINITY : 0.0f;
}

/* Rows r0..r0+63 of x (rows ld apart, the sequence*head's first element at
 * x) into a tile with rows HS + 8 apart; rows past T are zeros. */
template <int HS> static __device__ __forceinline__ void fm_load(uint16_t *tile, const uint16_t *x, int64_t ld,
                                                                 int64_t r0, int64_t T) {
    constexpr int CPR = HS / 8; /* 128-bit chunks per row */
    for (int e = threadIdx.x; e < FM_TILE * CPR; e += FM_THREADS) {
        const int r = e / CPR, c = e % CPR * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < T) v = *(const uint4 *)(x + (r0 + r) * ld + c);
        *(uint4 *)(tile + r * (HS + 8) + c) = v;
    }
}

/* The tile's rows r0..r0+63 that are below T back to x. */
template <int HS> static __device__ __forceinline__ void fm_store(uint16_t *x, int64_t ld, const uint16_t *tile,
                                                                  int64_t r0, int64_t T) {
    constexpr int CPR = HS / 8;
    for (int e = threadIdx.x; e < FM_TILE * CPR; e += FM_THREADS) {
        const int r = e / CPR, c = e % CPR * 8;
        if (r0 + r < T) *(uint4 *)(x + (r0 + r) * ld + c) = *(const uint4 *)(tile + r * (HS + 8) + c);
    }
}

/* A warp's accumulators (its 16 rows from row0, HS columns) into the tile as
 * DT, rows g and g+8 times f0 and f1. */
template <int DT, int HS> static __device__ __forceinline__ void fm_stage(uint16_t *tile, const tk_mma_c *acc,
                                                                          float f0, float f1, int row0, int lane) {
    const int g = lane >> 2, t = lane & 3;
    uint16_t *r0 = tile + (row0 + g) * (HS + 8) + 2 * t, *r1 = r0 + 8 * (HS + 8);
    FM_UNROLL
    for (int n = 0; n < HS / 8; n++) {
        *(uint32_t *)(r0 + n * 8) = tk_mma_pack<DT>(acc[n].c[0] * f0, acc[n].c[1] * f0);
        *(uint32_t *)(r1 + n * 8) = tk_mma_pack<DT>(acc[n].c[2] * f1, acc[n].c[3] * f1);
    }
}

/* D_i = dO_i . O_i of every query row, once per backward (FM_D, before dK/dV
 * and dQ): written as an f32 into the first two 16-bit slots of that row's
 * dq (element (b, i, h, 0..1)), which no one reads before the dQ kernel
 * overwrites it: the block that owns the row reads its D there first. HS/8
 * threads per (row, head), one 128-bit chunk of O and dO each, summed by
 * shuffles in a fixed order. */
template <int DT, int HS> __global__ void __launch_bounds__(FM_THREADS) k_attn_mma_rowd(tk_fm_args a, int64_t rows) {
    constexpr int CPR = HS / 8;
    const int64_t e = (int64_t)blockIdx.x * FM_THREADS + threadIdx.x, rh = e / CPR;
    const int c = (int)(e % CPR);
    float d = 0.0f;
    if (rh < rows) {
        const int64_t at = rh * HS + c * 8; /* O and dO rows are NH*HS = ldo apart: (row, head) is rh */
        const uint4 ov = *(const uint4 *)(a.o + at), gv = *(const uint4 *)(a.dout + at);
        const uint32_t ow[4] = { ov.x, ov.y, ov.z, ov.w }, gw[4] = { gv.x, gv.y, gv.z, gv.w };
        FM_UNROLL
        for (int w = 0; w < 4; w++)
            d += tk_mma_unpack<DT>(ow[w] & 0xffffu) * tk_mma_unpack<DT>(gw[w] & 0xffffu) +
                 tk_mma_unpack<DT>(ow[w] >> 16) * tk_mma_unpack<DT>(gw[w] >> 16);
    }
    FM_UNROLL
    for (int o = 1; o < CPR; o <<= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (rh < rows && c == 0) {
        const int64_t row = rh / a.NH, h = rh % a.NH;
        *(float *)(a.dq + row * a.ld + h * HS) = d;
    }
}

/* For the query tile at q0: lse2[r] = lse of row q0 + r in base 2 (+inf
 * past T: its probabilities are 0) and dd[r] = its D (k_attn_mma_rowd; 0
 * past T). */
template <int HS> static __device__ __forceinline__ void fm_row_stats(const tk_fm_args &a, int64_t b, int64_t h,
                                                                      int64_t q0, float *lse2, float *dd) {
    const int r = threadIdx.x;
    const int64_t i = q0 + r;
    if (r < FM_TILE) {
        dd[r] = i < a.T ? *(const float *)(a.dq + (b * a.T + i) * a.ld + h * HS) : 0.0f;
        lse2[r] = i < a.T ? a.lse_in[(b * a.NH + h) * a.T + i] * FM_LOG2E : INFINITY;
    }
}

/* s (16 x 64: n-tiles of 8) = x y^T: x the warp's 16 rows of a tile (its
 * A fragments loaded a k-step at a time: they are not kept in registers
 * between tiles, which leaves those to the accumulators), y a tile of 64
 * rows (keys, or queries in dK/dV). */
template <int DT, int K16, int HS> static __device__ __forceinline__ void fm_scores(tk_mma_c *s, const uint16_t *x,
                                                                                    const uint16_t *y, int warp,
                                                                                    int lane) {
    FM_UNROLL
    for (int n = 0; n < FM_TILE / 8; n++) s[n] = tk_mma_c{ { 0.0f, 0.0f, 0.0f, 0.0f } };
    FM_UNROLL
    for (int kk = 0; kk < HS / 16; kk++) {
        tk_mma_a xa;
        tk_mma_load_a(xa, x, HS + 8, warp * 16, kk * 16, lane);
        FM_UNROLL
        for (int np = 0; np < FM_TILE / 16; np++) {
            tk_mma_b yb[2];
            tk_mma_load_bt(yb, y, HS + 8, np * 16, kk * 16, lane);
            tk_mma<DT, K16>(s[2 * np], xa, yb[0]);
            tk_mma<DT, K16>(s[2 * np + 1], xa, yb[1]);
        }
    }
}

/* acc (16 x HS) += p y: p the 16 x 64 accumulators of fm_scores (already
 * turned into probabilities or dS), y a tile of 64 rows x HS. */
template <int DT, int K16, int HS> static __device__ __forceinline__ void fm_accum(tk_mma_c *acc, const tk_mma_c *p,
                                                                                   const uint16_t *y, int lane) {
    FM_UNROLL
    for (int kk = 0; kk < FM_TILE / 16; kk++) {
        tk_mma_a pa;
        tk_mma_a_of<DT>(pa, p[2 * kk], p[2 * kk + 1]);
        FM_UNROLL
        for (int np = 0; np < HS / 16; np++) {
            tk_mma_b yb[2];
            tk_mma_load_b(yb, y, HS + 8, kk * 16, np * 16, lane);
            tk_mma<DT, K16>(acc[2 * np], pa, yb[0]);
            tk_mma<DT, K16>(acc[2 * np + 1], pa, yb[1]);
        }
    }
}

/* 2^x as ex2.approx.ftz.f32 (2 ulp; subnormal inputs and results are 0):
 * the softmax's exponent, which has no bit-exact contract. The host
 * emulation computes exp2f and flushes as the instruction does. */
static __device__ __forceinline__ float fm_exp2(float x) {
#if defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    if (fabsf(x) < FLT_MIN) x = 0.0f;
    const float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y;
#endif
}

/* The dropout test of row `base` (tk_drop_row_base: the row's part of the
 * hash, once per lane) and key j: cuda_shared.h's tk_drop_keep_hi, the bits
 * of tk_dropout_keep. Only the forward hashes; dQ and dK/dV read its bits. */
static __device__ __forceinline__ uint64_t fm_drop_base(const tk_fm_args &a, uint64_t row) {
    return tk_drop_row_base(a.key, row);
}

/* The dropout factor of a keep bit: keep_scale's bits under an all-ones
 * or all-zero mask (no predicate a select would hold). */
static __device__ __forceinline__ float fm_factor(const tk_fm_args &a, uint32_t word, int bit) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(__float_as_uint(a.keep_scale) & (0u - (word >> bit & 1u)));
#else
    return word >> bit & 1u ? a.keep_scale : 0.0f;
#endif
}

/* The block's sequence*head: grid (tiles, heads) with the tiles fastest, so
 * the blocks that read one head's K and V run side by side (L2); heads past
 * 65535 go on in z. */
static __device__ __forceinline__ int64_t fm_bh() { return (int64_t)blockIdx.z * gridDim.y + blockIdx.y; }

template <int DT, int K16, int HS> __global__ void __launch_bounds__(FM_THREADS, 3) k_attn_mma_fwd(tk_fm_args a) {
    constexpr int LDS = HS + 8, NT = FM_TILE / 8;
    const int64_t bh = fm_bh();
    if (bh >= a.BH) return; /* the whole block: no barrier is left waiting */
    uint16_t *Qs = (uint16_t *)attn_smem(), *Ks = Qs + FM_TILE * LDS, *Vs = Ks + FM_TILE * LDS;
    float *bias = (float *)(Vs + FM_TILE * LDS);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t T = a.T, b = bh / a.NH, h = bh % a.NH, q0 = (int64_t)blockIdx.x * FM_TILE;
    const int64_t at = b * T * a.ld + h * HS;
    const int kept = fm_kept(a, b);
    fm_load<HS>(Qs, a.q + at, a.ld, q0, T);
    const float sc = kept ? a.scale_log2 : 0.0f;
    const int64_t i0 = q0 + warp * 16 + g; /* this lane's rows: i0 (c[0..1]) and i0 + 8 (c[2..3]) */
    const uint64_t dbase[2] = { fm_drop_base(a, a.offset + (uint64_t)((bh * T + i0) * T)),
                                fm_drop_base(a, a.offset + (uint64_t)((bh * T + i0 + 8) * T)) };
    /* the keep word's bits of rows below T (e < 2: row i0, else i0 + 8) */
    const uint32_t rows_in = (i0 < T ? 0x33333333u : 0u) | (i0 + 8 < T ? 0xCCCCCCCCu : 0u);
    uint32_t *keep = a.keep ? a.keep + fm_keep_tile(a, bh, blockIdx.x, 0) + threadIdx.x : NULL;
    float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
    tk_mma_c o[HS / 8];
    FM_UNROLL
    for (int n = 0; n < HS / 8; n++) o[n] = tk_mma_c{ { 0.0f, 0.0f, 0.0f, 0.0f } };
    for (int64_t k0 = 0; k0 < T; k0 += FM_TILE) {
        __syncthreads(); /* the previous tile is read */
        fm_load<HS>(Ks, a.k + at, a.ld, k0, T);
        fm_load<HS>(Vs, a.v + at, a.ld, k0, T);
        if (threadIdx.x < FM_TILE) bias[threadIdx.x] = fm_bias(a, b, k0 + threadIdx.x, kept);
        __syncthreads();
        tk_mma_c s[NT];
        fm_scores<DT, K16, HS>(s, Qs, Ks, warp, lane);
        float mx[2] = { m[0], m[1] };
        FM_UNROLL
        for (int n = 0; n < NT; n++)
            FM_UNROLL
            for (int e = 0; e < 4; e++) {
                const float x = s[n].c[e] * sc + bias[n * 8 + 2 * t + (e & 1)];
                s[n].c[e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float base[2];
        FM_UNROLL
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            base[r] = mx[r] == -INFINITY ? 0.0f : mx[r]; /* no key yet: every p is 0 */
            const float alpha = fm_exp2(m[r] - base[r]);
            m[r] = mx[r];
            l[r] *= alpha;
            FM_UNROLL
            for (int n = 0; n < HS / 8; n++) {
                o[n].c[2 * r] *= alpha;
                o[n].c[2 * r + 1] *= alpha;
            }
        }
        FM_UNROLL
        for (int n = 0; n < NT; n++)
            FM_UNROLL
            for (int e = 0; e < 4; e++) {
                const float p = fm_exp2(s[n].c[e] - base[e >> 1]);
                l[e >> 1] += p;
                s[n].c[e] = p;
            }
        if (a.drop) { /* the same for every thread of the grid: no divergence */
            uint32_t bits = 0; /* this lane's keep word of the tile: bit n*4 + e */
            FM_UNROLL
            for (int n = 0; n < NT; n++)
                FM_UNROLL
                for (int e = 0; e < 4; e++) {
                    const uint32_t kb = tk_drop_keep_hi(dbase[e >> 1], (uint64_t)(k0 + n * 8 + 2 * t + (e & 1)),
                                                        a.keep_min);
                    bits |= kb << (n * 4 + e);
                    s[n].c[e] *= kb ? a.keep_scale : 0.0f;
                }
            if (keep) { /* uniform too; the last tile's padding gets 0 bits */
                if (k0 + FM_TILE > T) bits &= fm_keep_cols(T - k0, t);
                keep[k0 / FM_TILE * FM_THREADS] = bits & rows_in;
            }
        }
        fm_accum<DT, K16, HS>(o, s, Vs, lane);
    }
    float inv[2];
    FM_UNROLL
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = 1.0f / l[r];
        if (t == 0 && i0 + 8 * r < T)
            a.lse_out[bh * T + i0 + 8 * r] = ((m[r] == -INFINITY ? 0.0f : m[r]) + log2f(l[r])) * FM_LN2;
    }
    __syncthreads(); /* every warp's last read of Qs is done: stage O there */
    fm_stage<DT, HS>(Qs, o, inv[0], inv[1], warp * 16, lane);
    __syncthreads();
    fm_store<HS>(a.out + b * T * a.ldo + h * HS, a.ldo, Qs, q0, T);
}

/* Blocks per SM the kernels are built for (ptxas_check.sh holds the
 * registers to them): forward and dQ three (168 registers), dK/dV two. On
 * sm_100 and sm_120 ptxas spills dQ at 168 (8 and 16 bytes), so two there. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define FM_DQ_BLOCKS 2
#else
#define FM_DQ_BLOCKS 3
#endif

template <int DT, int K16, int HS> __global__ void __launch_bounds__(FM_THREADS, FM_DQ_BLOCKS) k_attn_mma_dq(tk_fm_args a) {
    constexpr int LDS = HS + 8, NT = FM_TILE / 8;
    const int64_t bh = fm_bh();
    if (bh >= a.BH) return;
    uint16_t *Qs = (uint16_t *)attn_smem(), *Gs = Qs + FM_TILE * LDS, *Ks = Gs + FM_TILE * LDS;
    uint16_t *Vs = Ks + FM_TILE * LDS;
    float *bias = (float *)(Vs + FM_TILE * LDS), *lse2 = bias + FM_TILE, *dd = lse2 + FM_TILE;
    uint32_t *kws = (uint32_t *)(bias + 3 * FM_TILE); /* the key tile's keep words (fm_smem_bytes) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t T = a.T, b = bh / a.NH, h = bh % a.NH, q0 = (int64_t)blockIdx.x * FM_TILE;
    const int64_t at = b * T * a.ld + h * HS, ato = b * T * a.ldo + h * HS;
    const int kept = fm_kept(a, b);
    fm_load<HS>(Qs, a.q + at, a.ld, q0, T);
    fm_load<HS>(Gs, a.dout + ato, a.ldo, q0, T);
    fm_row_stats<HS>(a, b, h, q0, lse2, dd);
    __syncthreads();
    const float sc = kept ? a.scale_log2 : 0.0f;
    const int rl = warp * 16 + g; /* this lane's rows in the tile: rl, rl + 8 */
    const float L[2] = { lse2[rl], lse2[rl + 8] }, D[2] = { dd[rl], dd[rl + 8] };
    tk_mma_c acc[HS / 8];
    FM_UNROLL
    for (int n = 0; n < HS / 8; n++) acc[n] = tk_mma_c{ { 0.0f, 0.0f, 0.0f, 0.0f } };
    for (int64_t k0 = 0; k0 < T; k0 += FM_TILE) {
        __syncthreads();
        fm_load<HS>(Ks, a.k + at, a.ld, k0, T);
        fm_load<HS>(Vs, a.v + at, a.ld, k0, T);
        if (threadIdx.x < FM_TILE) bias[threadIdx.x] = fm_bias(a, b, k0 + threadIdx.x, kept);
        if (a.drop) /* the forward's keep words of this query and key tile */
            kws[threadIdx.x] = a.keep[fm_keep_tile(a, fm_bh(), blockIdx.x, k0 / FM_TILE) + threadIdx.x];
        __syncthreads();
        tk_mma_c s[NT], dp[NT];
        fm_scores<DT, K16, HS>(s, Qs, Ks, warp, lane);
        fm_scores<DT, K16, HS>(dp, Gs, Vs, warp, lane);
        /* dS / scale = P (dP M - D): the scale is applied once, to dQ */
        if (a.drop) { /* the same for every thread of the grid: no divergence */
            const uint32_t kw = kws[threadIdx.x];
            FM_UNROLL
            for (int n = 0; n < NT; n++)
                FM_UNROLL
                for (int e = 0; e < 4; e++) dp[n].c[e] *= fm_factor(a, kw, n * 4 + e);
        }
        FM_UNROLL
        for (int n = 0; n < NT; n++)
            FM_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, j = n * 8 + 2 * t + (e & 1);
                s[n].c[e] = fm_exp2(s[n].c[e] * sc + bias[j] - L[r]) * (dp[n].c[e] - D[r]);
            }
        fm_accum<DT, K16, HS>(acc, s, Ks, lane);
    }
    __syncthreads(); /* every warp's last read of Qs is done */
    fm_stage<DT, HS>(Qs, acc, a.scale, a.scale, warp * 16, lane);
    __syncthreads();
    fm_store<HS>(a.dq + at, a.ld, Qs, q0, T);
}

template <int DT, int K16, int HS> __global__ void __launch_bounds__(FM_THREADS, 2) k_attn_mma_dkv(tk_fm_args a) {
    constexpr int LDS = HS + 8, NT = FM_TILE / 8;
    const int64_t bh = fm_bh();
    if (bh >= a.BH) return;
    uint16_t *Ks = (uint16_t *)attn_smem(), *Vs = Ks + FM_TILE * LDS, *Qs = Vs + FM_TILE * LDS;
    uint16_t *Gs = Qs + FM_TILE * LDS;
    float *lse2 = (float *)(Gs + FM_TILE * LDS), *dd = lse2 + FM_TILE;
    uint32_t *kws = (uint32_t *)(lse2 + 3 * FM_TILE); /* the query tile's keep words (fm_smem_bytes) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t T = a.T, b = bh / a.NH, h = bh % a.NH, j0 = (int64_t)blockIdx.x * FM_TILE;
    const int64_t at = b * T * a.ld + h * HS, ato = b * T * a.ldo + h * HS;
    const int kept = fm_kept(a, b);
    fm_load<HS>(Ks, a.k + at, a.ld, j0, T);
    fm_load<HS>(Vs, a.v + at, a.ld, j0, T);
    const float sc = kept ? a.scale_log2 : 0.0f;
    const int64_t jr[2] = { j0 + warp * 16 + g, j0 + warp * 16 + g + 8 }; /* this lane's keys */
    const float kb[2] = { fm_bias(a, b, jr[0], kept), fm_bias(a, b, jr[1], kept) };
    /* Element (key jr[r], query q0 + n*8 + 2t + c) is the forward's bit
     * (2 warp + r)*4 + (n%2)*2 + g%2 of word (n/2)*32 + (2t + c)*4 + g/2 of
     * the tile (tk_ops_spec.h with the roles of rows and columns swapped):
     * each lane reads 16 words from shared memory and shifts them by ksh. */
    const int ksh = 8 * warp + (g & 1);
    tk_mma_c dk[HS / 8], dv[HS / 8];
    FM_UNROLL
    for (int n = 0; n < HS / 8; n++) dk[n] = dv[n] = tk_mma_c{ { 0.0f, 0.0f, 0.0f, 0.0f } };
    for (int64_t q0 = 0; q0 < T; q0 += FM_TILE) {
        __syncthreads();
        fm_load<HS>(Qs, a.q + at, a.ld, q0, T);
        fm_load<HS>(Gs, a.dout + ato, a.ldo, q0, T);
        fm_row_stats<HS>(a, b, h, q0, lse2, dd);
        if (a.drop) kws[threadIdx.x] = a.keep[fm_keep_tile(a, bh, q0 / FM_TILE, blockIdx.x) + threadIdx.x];
        __syncthreads();
        tk_mma_c st[NT], dpt[NT]; /* S^T and dP^T: this warp's 16 keys x 64 queries */
        fm_scores<DT, K16, HS>(st, Ks, Qs, warp, lane);
        fm_scores<DT, K16, HS>(dpt, Vs, Gs, warp, lane);
        FM_UNROLL
        for (int n = 0; n < NT; n++)
            FM_UNROLL
            for (int e = 0; e < 4; e++) st[n].c[e] = fm_exp2(st[n].c[e] * sc + kb[e >> 1] - lse2[n * 8 + 2 * t + (e & 1)]);
        if (a.drop) { /* uniform: no divergence */
            FM_UNROLL
            for (int n = 0; n < NT; n++)
                FM_UNROLL
                for (int c = 0; c < 2; c++) {
                    const uint32_t w = kws[(n >> 1) * 32 + (2 * t + c) * 4 + (g >> 1)] >> ksh;
                    FM_UNROLL
                    for (int r = 0; r < 2; r++) {
                        const int e = 2 * r + c, il = n * 8 + 2 * t + c;
                        const float f = fm_factor(a, w, 4 * r + 2 * (n & 1)), p = st[n].c[e];
                        st[n].c[e] = p * f;
                        dpt[n].c[e] = p * (dpt[n].c[e] * f - dd[il]); /* dS^T / scale */
                    }
                }
        }
        else
            FM_UNROLL
            for (int n = 0; n < NT; n++)
                FM_UNROLL
                for (int e = 0; e < 4; e++)
                    dpt[n].c[e] = st[n].c[e] * (dpt[n].c[e] - dd[n * 8 + 2 * t + (e & 1)]);
        fm_accum<DT, K16, HS>(dv, st, Gs, lane);
        fm_accum<DT, K16, HS>(dk, dpt, Qs, lane);
    }
    __syncthreads(); /* every warp's last read of Ks and Vs is done */
    fm_stage<DT, HS>(Ks, dk, a.scale, a.scale, warp * 16, lane); /* the scale of dS, once */
    fm_stage<DT, HS>(Vs, dv, 1.0f, 1.0f, warp * 16, lane);
    __syncthreads();
    fm_store<HS>(a.dk + at, a.ld, Ks, j0, T);
    fm_store<HS>(a.dv + at, a.ld, Vs, j0, T);
}

/* The keep mask the tensor-core forward writes, for a forward that runs the
 * reference kernel (which hashes again in its backward, but a later
 * backward may run the tensor-core kernels): one thread per word. */
__global__ void __launch_bounds__(256) k_attn_keep_fill(uint32_t *keep, uint64_t key, uint64_t offset, float p,
                                                         int64_t T, int64_t words, int64_t total) {
    const int64_t x = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (x < total) keep[x] = tk_attn_keep_word(key, offset, p, T, x / words, x % words);
}

/* ---- launchers ------------------------------------------------------------------ */

typedef void (*fm_kernel)(tk_fm_args);
typedef void (*fm_rowd_kernel)(tk_fm_args, int64_t);

template <int DT, int K16, int HS> static fm_kernel fm_kernel_of(int kind) {
    return kind == FM_FWD ? k_attn_mma_fwd<DT, K16, HS> : kind == FM_DQ ? k_attn_mma_dq<DT, K16, HS>
                                                                        : k_attn_mma_dkv<DT, K16, HS>;
}

template <int DT, int K16> static fm_kernel fm_kernel_hs(int kind, int64_t HS) {
    return HS == 16 ? fm_kernel_of<DT, K16, 16>(kind) : fm_kernel_of<DT, K16, 64>(kind);
}

static const char *fm_name(int kind) {
    return kind == FM_FWD ? "k_attn_mma_fwd" : kind == FM_DQ ? "k_attn_mma_dq" : kind == FM_DKV ? "k_attn_mma_dkv"
                                                                                                : "k_attn_mma_rowd";
}

/* Launches one tensor-core kernel: grid (64-row tiles of T, B*NH) (FM_D: a
 * thread per 128-bit chunk of every (row, head) of O). */
static tk_status fm_launch(int kind, tk_attn_kernel k, tk_dtype dt, const tk_fm_args &a, int64_t HS) {
    if (kind == FM_D) {
        const int64_t rows = a.BH * a.T, threads = rows * (HS / 8);
        fm_rowd_kernel f = dt == TK_BF16 ? (HS == 16 ? k_attn_mma_rowd<TK_BF16, 16> : k_attn_mma_rowd<TK_BF16, 64>)
                                         : (HS == 16 ? k_attn_mma_rowd<TK_F16, 16> : k_attn_mma_rowd<TK_F16, 64>);
        TK_LAUNCH(f, (unsigned)((threads + FM_THREADS - 1) / FM_THREADS), FM_THREADS)(a, rows);
        TK_CU_LAUNCHED(fm_name(kind));
        return TK_OK;
    }
    fm_kernel f = k == TK_ATTN_KERNEL_SM75 ? fm_kernel_hs<TK_F16, 0>(kind, HS)
                  : dt == TK_F16           ? fm_kernel_hs<TK_F16, 1>(kind, HS)
                                           : fm_kernel_hs<TK_BF16, 1>(kind, HS);
    const unsigned gy = (unsigned)(a.BH < 65535 ? a.BH : 65535);
    const dim3 grid((unsigned)((a.T + FM_TILE - 1) / FM_TILE), gy, (unsigned)((a.BH + gy - 1) / gy));
    TK_LAUNCH(f, grid, FM_THREADS, fm_smem_bytes(kind, HS))(a);
    TK_CU_LAUNCHED(fm_name(kind));
    return TK_OK;
}

static tk_status attn_bad(const char *op, const char *what) {
    fprintf(stderr, "txkernel cuda: %s: %s\n", op, what);
    return TK_EINVAL;
}

static int attn_float(const tk_tensor *t) {
    return t->dtype == TK_F32 || t->dtype == TK_F16 || t->dtype == TK_BF16;
}

/* The dtype every tensor has, or TK_F32 when they differ. */
static tk_dtype attn_one_dtype(const tk_tensor *const *ts, int n) {
    for (int i = 1; i < n; i++)
        if (ts[i]->dtype != ts[0]->dtype) return TK_F32;
    return ts[0]->dtype;
}

/* Rows start 16-byte aligned: what the 128-bit tile loads need. */
static int attn_aligned(const tk_tensor *const *ts, int n, int64_t ld, int64_t ldo) {
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ts[i]->data % 16) return 0;
    return ld % 8 == 0 && ldo % 8 == 0;
}

/* Whether dq's bytes (rows ld apart, 16-bit) meet those of ts[0..n-1]
 * (q-like rows ld apart, or out/dout: ts[3], ts[4], rows NH*HS apart). */
static int attn_dq_overlaps(const tk_tensor *dq, const tk_tensor *const *ts, int n, const tk_attn *a) {
    const int64_t rows = a->B * a->T, C = a->NH * a->HS;
    const uintptr_t d0 = (uintptr_t)dq->data, d1 = d0 + (uintptr_t)(((rows - 1) * a->ld + C) * 2);
    for (int i = 0; i < n; i++) {
        const int64_t ld = i >= 3 ? C : a->ld;
        const uintptr_t t0 = (uintptr_t)ts[i]->data, t1 = t0 + (uintptr_t)(((rows - 1) * ld + C) * 2);
        if (t0 < d1 && d0 < t1) return 1;
    }
    return 0;
}

/* The kernel for this call (tk_attn_kernel.h), or TK_EINVAL for a bad
 * TXK_ATTN_KERNEL. */
static tk_status attn_pick(void *ctx, const char *op, const tk_tensor *const *ts, int n, const tk_attn *a,
                           tk_attn_kernel *k) {
    const char *env = getenv(TK_ATTN_KERNEL_ENV);
    const int ask = tk_attn_kernel_ask(env);
    if (ask == TK_ATTN_ASK_BAD) {
        fprintf(stderr, "txkernel cuda: %s: %s=%s: expected %s\n", op, TK_ATTN_KERNEL_ENV, env,
                TK_ATTN_KERNEL_VALUES);
        return TK_EINVAL;
    }
    const tk_cuda_ctx *c = (const tk_cuda_ctx *)ctx;
    *k = tk_attn_kernel_pick(c->cc_major, c->cc_minor, attn_one_dtype(ts, n), a->HS, ask, NULL);
    if (*k != TK_ATTN_KERNEL_REFERENCE && !attn_aligned(ts, n, a->ld, a->NH * a->HS))
        *k = TK_ATTN_KERNEL_REFERENCE;
    if (a->T > (int64_t)65535 * FM_TILE || a->B * a->NH > INT32_MAX)
        *k = TK_ATTN_KERNEL_REFERENCE; /* it checks and refuses what no grid holds */
    return TK_OK;
}

static void fm_setup(tk_fm_args *f, const tk_attn *a, const tk_tensor *keep) {
    memset(f, 0, sizeof *f);
    f->keep = keep && a->p > 0.0f ? (uint32_t *)keep->data : NULL;
    f->nt = (a->T + FM_TILE - 1) / FM_TILE;
    f->NH = a->NH;
    f->T = a->T;
    f->ld = a->ld;
    f->ldo = a->NH * a->HS;
    f->scale = a->scale;
    f->scale_log2 = a->scale * FM_LOG2E;
    f->BH = a->B * a->NH;
    f->drop = a->p > 0.0f;
    f->keep_min = tk_drop_keep_min(a->p);
    f->keep_scale = tk_dropout_scale(a->p);
    f->key = tk_dropout_key(a->seed);
    f->offset = a->offset;
}

/* The reference kernel's arguments common to both directions; checks the
 * grid fits. */
static tk_status fa_setup(tk_fa_args *f, const char *op, const tk_tensor *q, const tk_tensor *k, const tk_tensor *v,
                          const tk_attn *a, dim3 *gq, dim3 *gk) {
    memset(f, 0, sizeof *f);
    if (!tk_fa_tiles(a->HS, &f->qt, &f->kt)) return attn_bad(op, "head size too large for a block's shared memory");
    int64_t BH = a->B * a->NH, nq = (a->T + f->qt - 1) / f->qt, nk = (a->T + f->kt - 1) / f->kt;
    if (BH > INT32_MAX || nq > 65535) return attn_bad(op, "more than 2^31 heads or 65535 query tiles");
    f->q = q->data; f->k = k->data; f->v = v->data;
    f->dtq = (int)q->dtype; f->dtk = (int)k->dtype; f->dtv = (int)v->dtype;
    f->NH = a->NH; f->T = a->T; f->HS = a->HS;
    f->ld = a->ld; f->ldo = a->NH * a->HS;
    f->scale = a->scale; f->p = a->p; f->keep_scale = tk_dropout_scale(a->p);
    f->key = tk_dropout_key(a->seed); f->offset = a->offset;
    *gq = dim3((unsigned)BH, (unsigned)nq);
    *gk = dim3((unsigned)BH, (unsigned)nk);
    return TK_OK;
}

extern "C" {

tk_status tk_cuda_attention_fwd(void *ctx, tk_tensor *out, tk_tensor *lse, tk_tensor *keep, const tk_tensor *q,
                                const tk_tensor *k, const tk_tensor *v, const tk_tensor *mask, const tk_attn *a) {
    const char *op = "attention_fwd";
    if (a->B * a->NH == 0 || a->T == 0 || a->HS == 0) return TK_OK;
    if (!attn_float(q) || !attn_float(k) || !attn_float(v) || !attn_float(out))
        return attn_bad(op, "q, k, v and out must be f32, f16 or bf16");
    if (lse->dtype != TK_F32) return attn_bad(op, "lse must be f32");
    if (mask && mask->dtype != TK_I32) return attn_bad(op, "mask must be i32");
    const tk_tensor *ts[4] = { q, k, v, out };
    tk_attn_kernel kern;
    tk_status st = attn_pick(ctx, op, ts, 4, a, &kern);
    if (st != TK_OK) return st;
    if (kern != TK_ATTN_KERNEL_REFERENCE) {
        tk_fm_args f;
        fm_setup(&f, a, keep);
        f.q = (const uint16_t *)q->data; f.k = (const uint16_t *)k->data; f.v = (const uint16_t *)v->data;
        f.out = (uint16_t *)out->data;
        f.lse_out = (float *)lse->data;
        f.mask = mask ? (const int32_t *)mask->data : NULL;
        return fm_launch(FM_FWD, kern, q->dtype, f, a->HS);
    }
    tk_fa_args f;
    dim3 gq, gk;
    st = fa_setup(&f, op, q, k, v, a, &gq, &gk);
    if (st != TK_OK) return st;
    f.mask = mask ? (const int32_t *)mask->data : NULL;
    f.out = out->data; f.dt_out = (int)out->dtype;
    f.lse_out = (float *)lse->data;
    auto kf = k_attn<TK_FA_FWD>;
    TK_LAUNCH(kf, gq, TK_FA_THREADS, tk_fa_smem_bytes(TK_FA_FWD, a->HS, f.qt, f.kt))(f);
    TK_CU_LAUNCHED("k_attn_fwd");
    if (keep && a->p > 0.0f) {
        const int64_t words = tk_attn_keep_words(a->T), total = a->B * a->NH * words, blocks = (total + 255) / 256;
        if (blocks > INT32_MAX) return attn_bad(op, "a keep mask of more than 2^39 words");
        TK_LAUNCH(k_attn_keep_fill, (unsigned)blocks, 256)((uint32_t *)keep->data, f.key, f.offset, a->p, a->T, words,
                                                           total);
        TK_CU_LAUNCHED("k_attn_keep_fill");
    }
    return TK_OK;
}

tk_status tk_cuda_attention_bwd(void *ctx, tk_tensor *dq, tk_tensor *dk, tk_tensor *dv, const tk_tensor *dout,
                                const tk_tensor *q, const tk_tensor *k, const tk_tensor *v, const tk_tensor *out,
                                const tk_tensor *lse, const tk_tensor *keep, const tk_tensor *mask, const tk_attn *a) {
    const char *op = "attention_bwd";
    if (a->B * a->NH == 0 || a->T == 0 || a->HS == 0) return TK_OK;
    const tk_tensor *ts[8] = { q, k, v, out, dout, dq, dk, dv };
    for (int i = 0; i < 8; i++)
        if (!attn_float(ts[i])) return attn_bad(op, "q, k, v, out, dout, dq, dk and dv must be f32, f16 or bf16");
    if (lse->dtype != TK_F32) return attn_bad(op, "lse must be f32");
    if (mask && mask->dtype != TK_I32) return attn_bad(op, "mask must be i32");
    tk_attn_kernel kern;
    tk_status st = attn_pick(ctx, op, ts, 8, a, &kern);
    if (st != TK_OK) return st;
    if (kern != TK_ATTN_KERNEL_REFERENCE && attn_dq_overlaps(dq, ts, 5, a))
        kern = TK_ATTN_KERNEL_REFERENCE; /* D goes through dq's rows (k_attn_mma_rowd): no input may lie there */
    if (kern != TK_ATTN_KERNEL_REFERENCE) {
        tk_fm_args f;
        fm_setup(&f, a, keep); /* tk_op_attention_bwd: keep is there when p > 0 */
        f.q = (const uint16_t *)q->data; f.k = (const uint16_t *)k->data; f.v = (const uint16_t *)v->data;
        f.o = (const uint16_t *)out->data; f.dout = (const uint16_t *)dout->data;
        f.dq = (uint16_t *)dq->data; f.dk = (uint16_t *)dk->data; f.dv = (uint16_t *)dv->data;
        f.lse_in = (const float *)lse->data;
        f.mask = mask ? (const int32_t *)mask->data : NULL;
        if ((st = fm_launch(FM_D, kern, q->dtype, f, a->HS)) != TK_OK) return st; /* D into dq's rows */
        if ((st = fm_launch(FM_DKV, kern, q->dtype, f, a->HS)) != TK_OK) return st;
        return fm_launch(FM_DQ, kern, q->dtype, f, a->HS);
    }
    tk_fa_args f;
    dim3 gq, gk;
    st = fa_setup(&f, op, q, k, v, a, &gq, &gk);
    if (st != TK_OK) return st;
    f.mask = mask ? (const int32_t *)mask->data : NULL;
    f.o = out->data; f.dto = (int)out->dtype;
    f.dout = dout->data; f.dtg = (int)dout->dtype;
    f.lse_in = (const float *)lse->data;
    f.dq = dq->data; f.dt_dq = (int)dq->dtype;
    f.dk = dk->data; f.dt_dk = (int)dk->dtype;
    f.dv = dv->data; f.dt_dv = (int)dv->dtype;
    auto kkv = k_attn<TK_FA_BWD_KV>, kq = k_attn<TK_FA_BWD_Q>;
    TK_LAUNCH(kkv, gk, TK_FA_THREADS, tk_fa_smem_bytes(TK_FA_BWD_KV, a->HS, f.qt, f.kt))(f);
    TK_CU_LAUNCHED("k_attn_bwd_kv");
    TK_LAUNCH(kq, gq, TK_FA_THREADS, tk_fa_smem_bytes(TK_FA_BWD_Q, a->HS, f.qt, f.kt))(f);
    TK_CU_LAUNCHED("k_attn_bwd_q");
    return TK_OK;
}

} /* extern "C" */
