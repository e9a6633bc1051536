/* mma.cuh — the tensor-core steps of the attention kernels (attention.cu),
 * one warp at a time: load fragments from shared memory (ldmatrix), multiply
 * and accumulate (mma.sync), and pack f32 values into 16-bit fragments.
 *
 * Fragments are the PTX ISA's (section "Matrix Fragments for mma.m16n8k16"
 * and "... mma.m16n8k8", f16/bf16 inputs, f32 accumulators). With
 * g = lane / 4 and t = lane % 4:
 *   A (16 x 16, row major), four registers of two 16-bit values (low half
 *     first): r[0] = (g, 2t..2t+1), r[1] = (g+8, 2t..), r[2] = (g, 8+2t..),
 *     r[3] = (g+8, 8+2t..);
 *   B (16 x 8, k x n), two registers: r[0] = (k 2t..2t+1, n g),
 *     r[1] = (k 8+2t.., n g);
 *   C, D (16 x 8, f32): c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..).
 * So an accumulator pair of n-tiles (keys 16j..16j+15) is, packed, the A
 * fragment of the next product: the attention kernels feed P and dS from
 * registers into mma without a trip through shared memory.
 *
 * One k16 step, tk_mma<DT, K16>(d, a, b): d += a b.
 *   K16 = 1  mma.sync.aligned.m16n8k16 (f16 or bf16 inputs): sm80 and newer;
 *   K16 = 0  two mma.sync.aligned.m16n8k8 (f16 only) on the halves of a and
 *            b (r[0..1] with r[0], then r[2..3] with r[1]): what sm75 (T4)
 *            has, and what TXK_ATTN_KERNEL=sm75 runs on a newer card.
 * tk_ldmatrix_x4<TRANS>(r, row): ldmatrix.sync.aligned.m8n8.x4(.trans).b16 —
 *   lanes 8i..8i+7 give the 16-byte rows of 8 x 8 matrix i; r[i] gets
 *   element (g, 2t..2t+1) of matrix i, or with TRANS of its transpose.
 *
 * The same calls run in the host emulation (tests/gpu_cuda_host/cuda_emu.h,
 * TK_CUDA_EMU): each one is a warp operation there that gathers the 32
 * lanes' registers into matrices by the layouts above, element by element,
 * computes in f32 (16-bit products are exact in f32) and hands each lane its
 * part of the result by the same layouts. So a kernel that puts a value in
 * the wrong lane or register computes a wrong attention on the host as it
 * would on a card, and `make test` sees it. A lane that is not at the same
 * step as the rest of its warp, or an ldmatrix row that is not 16-byte
 * aligned, stops the emulator with a message.
 */
#ifndef TK_CUDA_MMA_CUH
#define TK_CUDA_MMA_CUH

#include <stdint.h>
#include <string.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "tk_gpu.h"
#include "tk_ops_spec.h"

#define TK_MMA_FN static __device__ __forceinline__

typedef struct { uint32_t r[4]; } tk_mma_a; /* A, 16 x 16 */
typedef struct { uint32_t r[2]; } tk_mma_b; /* B, 16 x 8 */
typedef struct { float c[4]; } tk_mma_c;    /* C and D, 16 x 8, f32 */

/* ---- 16-bit values ------------------------------------------------------ */

/* Two f32 values as one register of DT (TK_F16 or TK_BF16), lo in the low
 * half, each rounded to nearest even. */
template <int DT> TK_MMA_FN uint32_t tk_mma_pack(float lo, float hi) {
    uint32_t u;
#ifdef __CUDA_ARCH__
    if constexpr (DT == TK_F16) {
        __half2 h = __floats2half2_rn(lo, hi);
        memcpy(&u, &h, 4);
    } else {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        memcpy(&u, &h, 4);
    }
#else
    if constexpr (DT == TK_F16) u = (uint32_t)tk_spec_f32_to_f16(lo) | (uint32_t)tk_spec_f32_to_f16(hi) << 16;
    else u = (uint32_t)tk_spec_f32_to_bf16(lo) | (uint32_t)tk_spec_f32_to_bf16(hi) << 16;
#endif
    return u;
}

/* One 16-bit value of DT (its bits) as f32, exactly. */
template <int DT> TK_MMA_FN float tk_mma_unpack(uint32_t bits) {
#ifdef __CUDA_ARCH__
    if constexpr (DT == TK_F16) return __half2float(__ushort_as_half((unsigned short)bits));
    else return __uint_as_float(bits << 16);
#else
    return DT == TK_F16 ? tk_spec_f16_to_f32((uint16_t)bits) : tk_spec_bf16_to_f32((uint16_t)bits);
#endif
}

#ifdef TK_CUDA_EMU
/* ---- the host side of each step: warp operations of cuda_emu.h ------------ */

template <int DT> static inline float tk_emu_half(uint32_t reg, int hi) {
    return tk_mma_unpack<DT>(hi ? reg >> 16 : reg & 0xffffu);
}

struct tk_emu_mma_arg { const uint32_t *a, *b; float *d; };

/* mma.sync m16n8k16 (K16) or m16n8k8 on the lanes' fragments: gather A
 * (16 x K) and B (K x 8) by the PTX layouts, D = A B + C in f32 by k, scatter
 * D by the accumulator layout. m16n8k8 reads a[0..1] and b[0] only. */
template <int DT, int K16> static void tk_emu_mma_fn(void *const *lanes) {
    const int K = K16 ? 16 : 8;
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const tk_emu_mma_arg *x = (const tk_emu_mma_arg *)lanes[l];
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < (K16 ? 8 : 4); i++) { /* a_i: register i/2, half i%2 */
            int row = g + ((i >> 1) & 1) * 8, col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = tk_emu_half<DT>(x->a[i >> 1], i & 1);
        }
        for (int i = 0; i < (K16 ? 4 : 2); i++) { /* b_i: register i/2, half i%2 */
            int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
            B[row][g] = tk_emu_half<DT>(x->b[i >> 1], i & 1);
        }
        for (int i = 0; i < 4; i++) C[g + (i >> 1) * 8][2 * t + (i & 1)] = x->d[i];
    }
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 8; c++) {
            float s = C[r][c];
            for (int k = 0; k < K; k++) s += A[r][k] * B[k][c];
            C[r][c] = s;
        }
    for (int l = 0; l < 32; l++) {
        const tk_emu_mma_arg *x = (const tk_emu_mma_arg *)lanes[l];
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) x->d[i] = C[g + (i >> 1) * 8][2 * t + (i & 1)];
    }
}

struct tk_emu_ldm_arg { const void *row; uint32_t *r; };

/* ldmatrix x4: lane 8i+j gives row j of matrix i; every row 16-byte
 * aligned, as the instruction requires. */
template <int TRANS> static void tk_emu_ldmatrix_fn(void *const *lanes) {
    const uint16_t *row[4][8];
    for (int l = 0; l < 32; l++) {
        const void *p = ((const tk_emu_ldm_arg *)lanes[l])->row;
        if ((uintptr_t)p % 16) {
            fprintf(stderr, "cuda_emu: ldmatrix row address %p of lane %d is not 16-byte aligned\n", p, l);
            abort();
        }
        row[l >> 3][l & 7] = (const uint16_t *)p;
    }
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        uint32_t *r = ((const tk_emu_ldm_arg *)lanes[l])->r;
        for (int i = 0; i < 4; i++) {
            uint16_t lo = TRANS ? row[i][2 * t][g] : row[i][g][2 * t];
            uint16_t hi = TRANS ? row[i][2 * t + 1][g] : row[i][g][2 * t + 1];
            r[i] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
}
#endif /* TK_CUDA_EMU */

/* ---- the steps ---------------------------------------------------------- */

/* d += a b over k = 16: one m16n8k16 (K16) or two m16n8k8 (f16 only). */
template <int DT, int K16> TK_MMA_FN void tk_mma(tk_mma_c &d, const tk_mma_a &a, const tk_mma_b &b) {
    static_assert(DT == TK_F16 || DT == TK_BF16, "tensor-core inputs are f16 or bf16");
    static_assert(K16 || DT == TK_F16, "m16n8k8 with bf16 inputs needs sm80; sm75 has f16 only");
#if defined(TK_CUDA_EMU)
    if constexpr (K16) {
        tk_emu_mma_arg x = { a.r, b.r, d.c };
        tk_emu_warp(tk_emu_mma_fn<DT, 1>, &x);
    } else {
        const uint32_t lo_a[2] = { a.r[0], a.r[1] }, hi_a[2] = { a.r[2], a.r[3] };
        tk_emu_mma_arg x = { lo_a, &b.r[0], d.c };
        tk_emu_warp(tk_emu_mma_fn<DT, 0>, &x);
        x.a = hi_a;
        x.b = &b.r[1];
        tk_emu_warp(tk_emu_mma_fn<DT, 0>, &x);
    }
#elif defined(__CUDA_ARCH__)
    if constexpr (K16) {
#if __CUDA_ARCH__ >= 800
        if constexpr (DT == TK_F16)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};\n"
                         : "+f"(d.c[0]), "+f"(d.c[1]), "+f"(d.c[2]), "+f"(d.c[3])
                         : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
        else
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};\n"
                         : "+f"(d.c[0]), "+f"(d.c[1]), "+f"(d.c[2]), "+f"(d.c[3])
                         : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
#else
        __trap(); /* the launcher never runs a K16 kernel below sm80 */
#endif
    } else {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d.c[0]), "+f"(d.c[1]), "+f"(d.c[2]), "+f"(d.c[3])
                     : "r"(a.r[0]), "r"(a.r[1]), "r"(b.r[0]));
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d.c[0]), "+f"(d.c[1]), "+f"(d.c[2]), "+f"(d.c[3])
                     : "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[1]));
    }
#endif
}

/* Four 8 x 8 matrices of 16-bit values from shared memory; `row` is this
 * lane's row (lanes 8i..8i+7: matrix i). */
template <int TRANS> TK_MMA_FN void tk_ldmatrix_x4(uint32_t r[4], const void *row) {
#if defined(TK_CUDA_EMU)
    tk_emu_ldm_arg x = { row, r };
    tk_emu_warp(tk_emu_ldmatrix_fn<TRANS>, &x);
#elif defined(__CUDA_ARCH__)
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
#endif
}

/* ---- fragments of a tile in shared memory ---------------------------------
 * X is row major with a row stride of `ld` 16-bit elements (a multiple of 8,
 * so that every row of an 8 x 8 matrix starts 16-byte aligned). */

/* The A fragment of rows r0..r0+15, columns c0..c0+15 of X. */
TK_MMA_FN void tk_mma_load_a(tk_mma_a &a, const uint16_t *X, int ld, int r0, int c0, int lane) {
    /* matrices: (rows +0, cols +0), (+8, +0), (+0, +8), (+8, +8) = r[0..3] */
    const int r = r0 + (lane & 7) + ((lane >> 3) & 1) * 8, c = c0 + (lane >> 4) * 8;
    tk_ldmatrix_x4<0>(a.r, X + (int64_t)r * ld + c);
}

/* B fragments of two n-tiles, b[0] for n0..n0+7 and b[1] for n0+8..n0+15,
 * over k0..k0+15, where B[k][n] = X[n][k] (X holds B's columns as rows:
 * keys for S = Q K^T). */
TK_MMA_FN void tk_mma_load_bt(tk_mma_b b[2], const uint16_t *X, int ld, int n0, int k0, int lane) {
    /* matrices: (n +0, k +0), (n +0, k +8), (n +8, k +0), (n +8, k +8) */
    uint32_t r[4];
    const int n = n0 + (lane & 7) + (lane >> 4) * 8, k = k0 + ((lane >> 3) & 1) * 8;
    tk_ldmatrix_x4<0>(r, X + (int64_t)n * ld + k);
    b[0].r[0] = r[0]; b[0].r[1] = r[1];
    b[1].r[0] = r[2]; b[1].r[1] = r[3];
}

/* B fragments of two n-tiles as above, where B[k][n] = X[k][n] (X holds B
 * itself row major: values for O = P V). */
TK_MMA_FN void tk_mma_load_b(tk_mma_b b[2], const uint16_t *X, int ld, int k0, int n0, int lane) {
    /* transposed matrices: (k +0, n +0), (k +8, n +0), (k +0, n +8), (k +8, n +8) */
    uint32_t r[4];
    const int k = k0 + (lane & 7) + ((lane >> 3) & 1) * 8, n = n0 + (lane >> 4) * 8;
    tk_ldmatrix_x4<1>(r, X + (int64_t)k * ld + n);
    b[0].r[0] = r[0]; b[0].r[1] = r[1];
    b[1].r[0] = r[2]; b[1].r[1] = r[3];
}

/* The A fragment (16 x 16) made of accumulator n-tiles c0 (columns 0..7)
 * and c1 (8..15), each value times its own factor already: the PTX layouts
 * put accumulator (g, 2t..) where A wants it. */
template <int DT> TK_MMA_FN void tk_mma_a_of(tk_mma_a &a, const tk_mma_c &c0, const tk_mma_c &c1) {
    a.r[0] = tk_mma_pack<DT>(c0.c[0], c0.c[1]);
    a.r[1] = tk_mma_pack<DT>(c0.c[2], c0.c[3]);
    a.r[2] = tk_mma_pack<DT>(c1.c[0], c1.c[1]);
    a.r[3] = tk_mma_pack<DT>(c1.c[2], c1.c[3]);
}

#endif
