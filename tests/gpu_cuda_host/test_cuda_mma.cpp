/* test_cuda_mma.cpp — gpu/cuda/mma.cuh's steps in the host emulation.
 *
 * One warp-sized kernel per check, launched through cuda_emu.h like the
 * plugin's kernels: it puts row-major matrices in shared memory, loads
 * fragments with mma.cuh's loaders (ldmatrix, plain and transposed), runs
 * tk_mma and writes D back by the accumulator layout. The result must be
 * the plain product of the row-major matrices, computed here without any
 * fragment layout, for:
 *  - m16n8k16 with f16 and bf16 inputs and two m16n8k8 (sm75's f16 path);
 *  - B given as the rows of X (S = Q K^T: tk_mma_load_bt) and as X itself
 *    (O = P V: tk_mma_load_b), two n-tiles per load;
 *  - an accumulator fed on as an A fragment (tk_mma_a_of): (A B) C, the
 *    step that carries P and dS from one product into the next;
 *  - accumulation into a non-zero C.
 * Inputs are small integers and halves, exact in every format, so the
 * results must be exact. Also: the kernels run in more than one warp and
 * in blocks of both thread orders, and a block whose warps call different
 * warp operations is stopped by the emulator (checked in a child process).
 */
#include "cuda_emu.h"
#include "cuda/mma.cuh"

#include <sys/wait.h>
#include <unistd.h>

#include "tk_test.h"

namespace {

enum { LD = 24 }; /* shared row stride (16-bit elements): 16 + 8, as the kernels pad */

/* matrices of one check, row major, f32 values exact in 16 bits */
struct mats {
    float A[16][16], B[16][16], C[16][16], D[16][16];
};

template <int DT> uint16_t bits_of(float x) { return DT == TK_F16 ? tk_spec_f32_to_f16(x) : tk_spec_f32_to_bf16(x); }

/* values in [-4, 4] in steps of 1/4 */
float small(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int)(*s >> 59) - 16) * 0.25f;
}

/* D (16 x 16: two n-tiles) = A (16 x 16) B (16 x 16) + C, B either as X's
 * rows (bt: B[k][n] = X[n][k]) or X itself. */
template <int DT, int K16, int BT> __global__ void k_product(const mats *m, float *out) {
    uint16_t *sa = (uint16_t *)tk_emu_dyn_smem, *sx = sa + 16 * LD;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) /* every warp writes the same values: no race */
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++) {
                sa[r * LD + c] = bits_of<DT>(m->A[r][c]);
                sx[r * LD + c] = bits_of<DT>(BT ? m->B[c][r] : m->B[r][c]);
            }
    __syncwarp();
    tk_mma_a a;
    tk_mma_b b[2];
    tk_mma_load_a(a, sa, LD, 0, 0, lane);
    if (BT) tk_mma_load_bt(b, sx, LD, 0, 0, lane);
    else tk_mma_load_b(b, sx, LD, 0, 0, lane);
    const int g = lane >> 2, t = lane & 3;
    tk_mma_c d[2];
    for (int n = 0; n < 2; n++) {
        for (int i = 0; i < 4; i++) d[n].c[i] = m->C[g + (i >> 1) * 8][n * 8 + 2 * t + (i & 1)];
        tk_mma<DT, K16>(d[n], a, b[n]);
        for (int i = 0; i < 4; i++) out[warp * 256 + (g + (i >> 1) * 8) * 16 + n * 8 + 2 * t + (i & 1)] = d[n].c[i];
    }
}

/* E (16 x 8) = (A B) C: the 16 x 16 accumulator pair of A B as the A
 * fragment of the next product (B as X itself, C as rows). */
template <int DT, int K16> __global__ void k_chain(const mats *m, float *out) {
    uint16_t *sa = (uint16_t *)tk_emu_dyn_smem, *sb = sa + 16 * LD, *sc = sb + 16 * LD;
    const int lane = threadIdx.x & 31;
    if (lane == 0)
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++) {
                sa[r * LD + c] = bits_of<DT>(m->A[r][c]);
                sb[r * LD + c] = bits_of<DT>(m->B[r][c]);
                sc[r * LD + c] = bits_of<DT>(m->C[c][r]); /* rows of sc = columns of C */
            }
    __syncwarp();
    tk_mma_a a, p;
    tk_mma_b b[2], c[2];
    tk_mma_load_a(a, sa, LD, 0, 0, lane);
    tk_mma_load_b(b, sb, LD, 0, 0, lane);
    tk_mma_c ab[2] = {};
    tk_mma<DT, K16>(ab[0], a, b[0]);
    tk_mma<DT, K16>(ab[1], a, b[1]);
    tk_mma_a_of<DT>(p, ab[0], ab[1]);
    tk_mma_load_bt(c, sc, LD, 0, 0, lane);
    tk_mma_c e = {};
    tk_mma<DT, K16>(e, p, c[0]);
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) out[(g + (i >> 1) * 8) * 8 + 2 * t + (i & 1)] = e.c[i];
}

void fill(mats *m, uint64_t seed) {
    uint64_t s = seed;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            m->A[r][c] = small(&s);
            m->B[r][c] = small(&s);
            m->C[r][c] = small(&s);
        }
}

template <int DT, int K16, int BT> void check_product(const char *what) {
    mats m;
    fill(&m, 3 + DT * 10 + K16 * 100 + BT);
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = m.C[r][n];
            for (int k = 0; k < 16; k++) s += m.A[r][k] * m.B[k][n];
            m.D[r][n] = s;
        }
    enum { WARPS = 2 };
    float out[WARPS * 256];
    for (int blocks = 1; blocks <= 2; blocks++) { /* the second block runs its threads in descending order */
        for (int i = 0; i < WARPS * 256; i++) out[i] = NAN;
        auto kernel = k_product<DT, K16, BT>;
        TK_LAUNCH(kernel, dim3(blocks), dim3(32 * WARPS), 2 * 16 * LD * 2)(&m, out);
        int bad = 0;
        for (int w = 0; w < WARPS; w++)
            for (int r = 0; r < 16; r++)
                for (int n = 0; n < 16; n++) bad += out[w * 256 + r * 16 + n] != m.D[r][n];
        TK_CHECK_MSG(bad == 0, "%s: %d of %d elements differ from the plain product", what, bad, WARPS * 256);
    }
}

template <int DT, int K16> void check_chain(const char *what) {
    mats m;
    fill(&m, 77 + DT + K16);
    float ab[16][16], want[16][8], out[128];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += m.A[r][k] * m.B[k][n];
            ab[r][n] = tk_mma_unpack<DT>(bits_of<DT>(s)); /* rounded as the A fragment carries it */
        }
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            float s = 0.0f;
            for (int k = 0; k < 16; k++) s += ab[r][k] * m.C[k][n];
            want[r][n] = s;
        }
    auto kernel = k_chain<DT, K16>;
    TK_LAUNCH(kernel, dim3(1), dim3(32), 3 * 16 * LD * 2)(&m, out);
    int bad = 0;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) bad += out[r * 8 + n] != want[r][n];
    TK_CHECK_MSG(bad == 0, "%s: %d of 128 elements differ from (A B) C", what, bad);
}

void test_products() {
    check_product<TK_F16, 1, 1>("f16 m16n8k16, B as rows (Q K^T)");
    check_product<TK_F16, 1, 0>("f16 m16n8k16, B as it is (P V)");
    check_product<TK_BF16, 1, 1>("bf16 m16n8k16, B as rows");
    check_product<TK_BF16, 1, 0>("bf16 m16n8k16, B as it is");
    check_product<TK_F16, 0, 1>("f16 2 x m16n8k8 (sm75), B as rows");
    check_product<TK_F16, 0, 0>("f16 2 x m16n8k8 (sm75), B as it is");
}

void test_chains() {
    check_chain<TK_F16, 1>("f16 m16n8k16");
    check_chain<TK_BF16, 1>("bf16 m16n8k16");
    check_chain<TK_F16, 0>("f16 m16n8k8");
}

/* The lanes of one warp split between two different warp operations: the
 * emulator must stop, not hang or mix them. */
__global__ void k_split_warp() {
    const int lane = threadIdx.x & 31;
    if (lane < 16) __syncwarp();
    else (void)__shfl_xor_sync(0xffffffffu, lane, 1);
}

void test_split_warp_stops() {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2);
        TK_LAUNCH(k_split_warp, dim3(1), dim3(32))();
        _exit(0); /* not reached when the emulator stops the block */
    }
    int st = 0;
    waitpid(pid, &st, 0);
    TK_CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "a warp split between two warp operations ran on");
}

} /* namespace */

int main() {
    TK_RUN(test_products);
    TK_RUN(test_chains);
    TK_RUN(test_split_warp_stops);
    return tk_test_done();
}
