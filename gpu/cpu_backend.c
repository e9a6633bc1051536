/* cpu_backend.c — the host backend: memory from posix_memalign, ops with
 * OpenBLAS (GEMM) and OpenMP (everything else).
 *
 * Guarantees:
 *  - Every op in the tk_backend table does real arithmetic with the semantics
 *    documented in tk_gpu.h; "float" tensors may be f32, f16 or bf16 (16-bit
 *    values are converted to f32 on load and rounded to nearest even on store;
 *    arithmetic is always f32, reductions accumulate in f32 or f64).
 *  - Results do not depend on scheduling: reductions and scatter-adds split
 *    work statically (by columns, or by thread then reduced in thread order),
 *    so a run with the same thread count gives bit-identical results, and
 *    embed_bwd / scatter_add_rows / bias_grad are identical for any count.
 *  - Dropout and the 8-bit AdamW codes follow tk_ops_spec.h bit for bit.
 *  - Nothing aborts. Host scratch (f32 copies of 16-bit GEMM operands, per
 *    thread row buffers) is malloc'd outside the tagged allocator because it
 *    is not device memory; a failed scratch malloc returns TK_ENOMEM, out of
 *    host memory (not TK_EOOM, which promises a tk_oom record from the
 *    tagged allocator).
 * Arguments are validated by the tk_op_* wrappers; the ops here only return
 * TK_EINVAL for what only the data can reveal (an id or label out of range).
 *
 * Threads: opts->threads (0 = every core) is used for every OpenMP region of
 * this context, GEMMs included: one pool. A GEMM is cut into one slice per
 * OpenMP thread (rows or columns of C, or the batch) and each slice is one
 * single-threaded OpenBLAS call. OpenBLAS's own pthreads pool is never woken
 * here: after a region, libgomp's workers spin-wait (OMP_WAIT_POLICY's
 * default) and starved OpenBLAS's threads on the same cores; txk re-execs
 * with the passive policy, but a library loaded into Python cannot (torch
 * has often loaded libgomp, with its policy, before us), and the companion
 * trained at 0.4x txk's speed. OpenBLAS's thread count is process-wide and
 * may be numpy's too, so it is set to 1 only for the call and restored.
 * Transcendental loops use the branch-free exp/erfc below, with AVX-512 and
 * AVX2 clones.
 */
/* Floating-point exceptions and errno are never inspected here; without this
 * GCC will not turn the selects of the vector math below into blends (a
 * compare could trap), and those loops would stay scalar. For sqrtf the
 * pragma is not enough (GCC 12 kept AdamW's loop scalar under it): the
 * Makefile compiles this file with -fno-math-errno -fno-trapping-math too. */
#pragma GCC optimize("no-trapping-math", "no-math-errno")

#include "tk_backend_impl.h"
#include "tk_host_mem.h"
#include "tk_ops_spec.h"
#include "tk_cpu_vec.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- context ------------------------------------------------------------ */

typedef struct cpu_ctx {
    tk_cpu_ctx_head head; /* first: the thread count (tk_backend_impl.h) */
    size_t capacity;     /* simulated capacity (0: physical RAM) */
    size_t reserved;     /* bytes in live segments */
    float *gemm_scratch; /* f32 panels for 16-bit GEMM operands; grows, never shrinks */
    size_t gemm_scratch_n;
} cpu_ctx;

void *tk_cpu_ctx_new(const tk_dev_opts *opts) {
    cpu_ctx *c = tk_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->head.threads = (opts && opts->threads > 0) ? opts->threads : omp_get_num_procs();
    if (c->head.threads < 1) c->head.threads = 1;
    c->capacity = opts ? opts->capacity : 0;
    return c;
}

static void cpu_destroy(void *ctx) {
    cpu_ctx *c = ctx;
    if (!c) return;
    free(c->gemm_scratch);
    free(c);
}

static int cpu_seg_alloc(void *ctx, size_t bytes, void **ptr) {
    cpu_ctx *c = ctx;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return 1;
    c->reserved += bytes;
    *ptr = p;
    return 0;
}

static void cpu_seg_free(void *ctx, void *ptr, size_t bytes) {
    cpu_ctx *c = ctx;
    if (!ptr) return;
    free(ptr);
    c->reserved -= bytes < c->reserved ? bytes : c->reserved;
}

static tk_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes, tk_err *err) {
    (void)ctx; (void)err;
    if (bytes) memmove(dst, src, bytes);
    return TK_OK;
}

static tk_status cpu_sync(void *ctx, tk_err *err) {
    (void)ctx; (void)err;
    return TK_OK;
}

static void cpu_info(void *ctx, tk_dev_info *out) {
    cpu_ctx *c = ctx;
    memset(out, 0, sizeof *out);
    out->kind = TK_DEV_CPU;
    snprintf(out->name, sizeof out->name, "cpu");
    size_t total = c->capacity;
    if (!total) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        total = (pages > 0 && psz > 0) ? (size_t)pages * (size_t)psz : 0;
    }
    out->total = total;
    out->free_bytes = total > c->reserved ? total - c->reserved : 0;
    out->simulated = 1;
    snprintf(out->runtime, sizeof out->runtime, "openblas %d threads", c->head.threads);
}

/* ---- dtype conversion ----------------------------------------------------
 * The element converters are tk_ops_spec.h's (static inline, so the hot
 * loops inline them); short names for this file. */
#define h2f tk_spec_f16_to_f32
#define f2h tk_spec_f32_to_f16
#define bf2f tk_spec_bf16_to_f32
#define f2bf tk_spec_f32_to_bf16

static inline float ld1(const tk_tensor *t, int64_t i) {
    switch (t->dtype) {
    case TK_F16: return h2f(((const uint16_t *)t->data)[i]);
    case TK_BF16: return bf2f(((const uint16_t *)t->data)[i]);
    default: return ((const float *)t->data)[i];
    }
}

static inline void st1(tk_tensor *t, int64_t i, float v) {
    switch (t->dtype) {
    case TK_F16: ((uint16_t *)t->data)[i] = f2h(v); break;
    case TK_BF16: ((uint16_t *)t->data)[i] = f2bf(v); break;
    default: ((float *)t->data)[i] = v; break;
    }
}

/* A chunk of a float tensor as f32: the tensor itself when it is f32, else
 * `buf` filled by conversion. */
static inline const float *ld_chunk(float *buf, const tk_tensor *t, int64_t off, int64_t n) {
    if (t->dtype == TK_F32) return (const float *)t->data + off;
    tk_cpu_to_f32(buf, t->data, t->dtype, off, n);
    return buf;
}
/* Where to write a chunk: the tensor itself when f32, else `buf`, which
 * st_commit then converts into the tensor. */
static inline float *st_chunk(float *buf, tk_tensor *t, int64_t off) {
    return t->dtype == TK_F32 ? (float *)t->data + off : buf;
}
static inline void st_commit(tk_tensor *t, int64_t off, int64_t n, const float *buf) {
    if (t->dtype != TK_F32) tk_cpu_from_f32(t->data, t->dtype, off, buf, n);
}

/* Elementwise ops walk CH-element chunks; small tensors stay on one thread
 * because waking the team costs more than the work. */
#define CH 2048
#define PAR_MIN 32768
#define NCHUNK(n) (((n) + CH - 1) / CH)
#define CHUNK_LEN(n, ci) ((n) - (ci) * CH < CH ? (n) - (ci) * CH : CH)

/* ---- vectorisable math (v_exp and TK_VEC_CLONES: tk_cpu_vec.h) --------------
 *  v_erfc: Numerical Recipes' erfcc Chebyshev fit, fractional error < 1.2e-7
 *    for z >= 0, which keeps GELU's far negative tail accurate in relative
 *    terms (1 + erf(x) computed from erf alone would cancel). */
static inline float v_erfc_pos(float z) { /* z >= 0 */
    float t = 1.0f / (1.0f + 0.5f * z);
    float q = 0.17087277f;
    q = q * t - 0.82215223f;
    q = q * t + 1.48851587f;
    q = q * t - 1.13520398f;
    q = q * t + 0.27886807f;
    q = q * t - 0.18628806f;
    q = q * t + 0.09678418f;
    q = q * t + 0.37409196f;
    q = q * t + 1.00002368f;
    q = q * t - 1.26551223f;
    return t * v_exp(q - z * z);
}

/* Phi(x), the standard normal CDF */
static inline float v_phi(float x) {
    float e = 0.5f * v_erfc_pos(fabsf(x) * 0.70710678118654752440f);
    return x < 0.0f ? e : 1.0f - e;
}

TK_VEC_CLONES
static void k_gelu_fwd(float *o, const float *x, int64_t n) { /* o may be x */
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = x[i] * v_phi(x[i]);
}

/* d/dx [x Phi(x)] = Phi(x) + x phi(x) */
TK_VEC_CLONES
static void k_gelu_bwd(float *o, const float *x, const float *d, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float pdf = 0.39894228040143267794f * v_exp(-0.5f * xi * xi);
        o[i] = d[i] * (v_phi(xi) + xi * pdf);
    }
}

/* o[j] = exp(o[j] - mx) in place; returns the sum */
TK_VEC_CLONES
static float k_exp_sub_sum(float *o, float mx, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) {
        o[j] = v_exp(o[j] - mx);
        s += o[j];
    }
    return s;
}

/* ---- GEMM ----------------------------------------------------------------- */

static int gemm_scratch(cpu_ctx *c, size_t n) {
    if (c->gemm_scratch_n >= n) return 0;
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, n * sizeof(float)) != 0) return -1;
    free(c->gemm_scratch);
    c->gemm_scratch = p;
    c->gemm_scratch_n = n;
    return 0;
}

static void par_to_f32(cpu_ctx *c, float *dst, const tk_tensor *t, int64_t off, int64_t n) {
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++)
        tk_cpu_to_f32(dst + ci * CH, t->data, t->dtype, off + ci * CH, CHUNK_LEN(n, ci));
}

static void par_from_f32(cpu_ctx *c, tk_tensor *t, int64_t off, const float *src, int64_t n) {
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++)
        tk_cpu_from_f32(t->data, t->dtype, off + ci * CH, src + ci * CH, CHUNK_LEN(n, ci));
}

/* C (M x N, row-major, ldc = N) = alpha op(A) op(B) + beta C on nt OpenMP
 * threads, each thread one single-threaded cblas_sgemm on its slice: rows of
 * C when M is the longer side, else columns (op(A) rows start at row i of A,
 * or column i when A is transposed; likewise op(B)'s columns). Slices are
 * multiples of 16 so OpenBLAS's micro-kernels see full tiles. Every element
 * is still one sum over all of K, in OpenBLAS's order. */
#define GEMM_PAR_MIN (1 << 18) /* M*N*K below this: one call, no region */
static void sgemm_sliced(int nt, int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *pa, int lda, const float *pb, int ldb, float beta, float *pc) {
    enum CBLAS_TRANSPOSE ta = transA ? CblasTrans : CblasNoTrans, tb = transB ? CblasTrans : CblasNoTrans;
    int saved = openblas_get_num_threads();
    if (saved != 1) openblas_set_num_threads(1);
    int rows = M >= N;
    int64_t len = rows ? M : N;
    if (nt > 1 && len >= 32 && (double)M * N * K >= GEMM_PAR_MIN) {
#pragma omp parallel num_threads(nt)
        {
            int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num(); /* the runtime may grant fewer */
            int64_t per = ((len + nth - 1) / nth + 15) / 16 * 16;
            int64_t a = tid * per, b = a + per < len ? a + per : len;
            if (a < b && rows)
                cblas_sgemm(CblasRowMajor, ta, tb, (int)(b - a), (int)N, (int)K, alpha,
                            pa + (transA ? a : a * lda), lda, pb, ldb, beta, pc + a * N, (int)N);
            else if (a < b)
                cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)(b - a), (int)K, alpha, pa, lda,
                            pb + (transB ? a * ldb : a), ldb, beta, pc + a, (int)N);
        }
    } else {
        cblas_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, alpha, pa, lda, pb, ldb, beta, pc, (int)N);
    }
    if (saved != 1) openblas_set_num_threads(saved);
}

static tk_status cpu_bias_grad(void *ctx, tk_tensor *db, const tk_tensor *dout, int64_t N, int64_t C);

/* g->bgrad[i] += sum_k op(A)[i, k]: a column sum of A stored K x M
 * (transposed), else a row sum; in the order tk_op_bias_grad adds. */
static tk_status gemm_bgrad(cpu_ctx *c, const tk_tensor *A, const tk_gemm *g) {
    if (g->trans_a) return cpu_bias_grad(c, g->bgrad, A, g->k, g->m);
    for (int64_t i = 0; i < g->m; i++) {
        float s = 0.0f;
        for (int64_t k = 0; k < g->k; k++) s += ld1(A, i * g->k + k);
        st1(g->bgrad, i, ld1(g->bgrad, i) + s);
    }
    return TK_OK;
}

/* f32 throughout: g->tf32 asks the cuda backend's tensor cores for TF32,
 * which a CPU does not have; the result here is the full-f32 one. */
static tk_status cpu_gemm(void *ctx, tk_tensor *C, const tk_tensor *A, const tk_tensor *B,
                          const tk_tensor *bias, const tk_gemm *g) {
    cpu_ctx *c = ctx;
    const int transA = g->trans_a, transB = g->trans_b;
    const int64_t M = g->m, N = g->n, K = g->k, batch = g->batch;
    const int64_t strideA = g->stride_a, strideB = g->stride_b, strideC = g->stride_c;
    const float alpha = g->alpha, beta = g->beta;
    if (M <= 0 || N <= 0 || batch <= 0) return TK_OK;
    if (g->bgrad) {
        tk_status st = gemm_bgrad(c, A, g);
        if (st != TK_OK) return st;
    }
    int a32 = A->dtype == TK_F32, b32 = B->dtype == TK_F32, c32 = C->dtype == TK_F32;
    size_t need = (a32 ? 0 : (size_t)(M * K)) + (b32 ? 0 : (size_t)(K * N)) + (c32 ? 0 : (size_t)(M * N));
    if (need && gemm_scratch(c, need)) return TK_ENOMEM;
    float *sa = c->gemm_scratch, *sb = sa + (a32 ? 0 : M * K), *sc = sb + (b32 ? 0 : K * N);
    int lda = (int)(transA ? M : K), ldb = (int)(transB ? K : N);
    if (a32 && b32 && c32 && K > 0 && batch >= c->head.threads && c->head.threads > 1 && !bias) {
        /* many small f32 products (attention's per-head GEMMs): one per thread
         * at a time, each single-threaded in OpenBLAS (see the file's header) */
        int saved = openblas_get_num_threads();
        if (saved != 1) openblas_set_num_threads(1);
#pragma omp parallel for num_threads(c->head.threads) schedule(static)
        for (int64_t bi = 0; bi < batch; bi++)
            cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                        (int)M, (int)N, (int)K, alpha, (const float *)A->data + bi * strideA, lda,
                        (const float *)B->data + bi * strideB, ldb, beta, (float *)C->data + bi * strideC, (int)N);
        if (saved != 1) openblas_set_num_threads(saved);
        return TK_OK;
    }
    for (int64_t bi = 0; bi < batch; bi++) {
        const float *pa, *pb;
        float *pc;
        if (a32) pa = (const float *)A->data + bi * strideA;
        else { par_to_f32(c, sa, A, bi * strideA, M * K); pa = sa; }
        if (b32) pb = (const float *)B->data + bi * strideB;
        else { par_to_f32(c, sb, B, bi * strideB, K * N); pb = sb; }
        if (c32) pc = (float *)C->data + bi * strideC;
        else {
            if (beta != 0.0f) par_to_f32(c, sc, C, bi * strideC, M * N);
            pc = sc;
        }
        if (K > 0) {
            sgemm_sliced(c->head.threads, transA, transB, M, N, K, alpha, pa, lda, pb, ldb, beta, pc);
        } else {
            for (int64_t i = 0; i < M * N; i++) pc[i] = beta == 0.0f ? 0.0f : beta * pc[i];
        }
        if (bias) {
            float *bb = NULL;
            const float *bv = bias->data;
            if (bias->dtype != TK_F32) {
                bb = tk_malloc((size_t)N * sizeof(float));
                if (!bb) return TK_ENOMEM;
                tk_cpu_to_f32(bb, bias->data, bias->dtype, 0, N);
                bv = bb;
            }
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (M * N > PAR_MIN)
            for (int64_t i = 0; i < M; i++) {
                float *row = pc + i * N;
#pragma omp simd
                for (int64_t j = 0; j < N; j++) row[j] += bv[j];
            }
            free(bb);
        }
        if (!c32) par_from_f32(c, C, bi * strideC, sc, M * N);
    }
    return TK_OK;
}

/* ---- rows: gather, embed, heads ------------------------------------------- */

/* dst row (C elements at element offset doff) = src row (at soff), converting. */
static inline void copy_row(void *dst, tk_dtype ddt, int64_t doff, const void *src, tk_dtype sdt,
                            int64_t soff, int64_t C) {
    if (ddt == sdt) {
        size_t es = ddt == TK_F32 ? 4 : 2;
        memmove((char *)dst + doff * es, (const char *)src + soff * es, (size_t)C * es);
    } else if (ddt == TK_F32) {
        tk_cpu_to_f32((float *)dst + doff, src, sdt, soff, C);
    } else {
        float buf[CH];
        for (int64_t j = 0; j < C; j += CH) {
            int64_t len = C - j < CH ? C - j : CH;
            tk_cpu_to_f32(buf, src, sdt, soff + j, len);
            tk_cpu_from_f32(dst, ddt, doff + j, buf, len);
        }
    }
}

static tk_status gather(cpu_ctx *c, tk_tensor *out, const tk_tensor *in, int64_t rows_in,
                        const tk_tensor *idx, int64_t n, int64_t C) {
    const int32_t *ix = idx->data;
    for (int64_t i = 0; i < n; i++)
        if (ix[i] < 0 || (rows_in >= 0 && ix[i] >= rows_in)) return TK_EINVAL;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n * C > PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        copy_row(out->data, out->dtype, i * C, in->data, in->dtype, (int64_t)ix[i] * C, C);
    return TK_OK;
}

/* dst[idx[i],:] += src[i,:]. Threads own disjoint column ranges and walk the
 * rows in order, so the result is the same for any thread count. */
static tk_status scatter_add(cpu_ctx *c, tk_tensor *dst, int64_t rows_dst, const tk_tensor *src,
                             const tk_tensor *idx, int64_t n, int64_t C) {
    const int32_t *ix = idx->data;
    for (int64_t i = 0; i < n; i++)
        if (ix[i] < 0 || (rows_dst >= 0 && ix[i] >= rows_dst)) return TK_EINVAL;
    int nt = (n * C > PAR_MIN) ? c->head.threads : 1;
    int64_t cw = ((C + nt - 1) / nt + 15) / 16 * 16;
    int64_t nblk = (C + cw - 1) / cw;
    int all32 = dst->dtype == TK_F32 && src->dtype == TK_F32;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * cw, c1 = c0 + cw < C ? c0 + cw : C;
        if (all32) {
            float *d = dst->data;
            const float *s = src->data;
            for (int64_t i = 0; i < n; i++) {
                float *restrict dr = d + (int64_t)ix[i] * C;
                const float *restrict sr = s + i * C;
#pragma omp simd
                for (int64_t j = c0; j < c1; j++) dr[j] += sr[j];
            }
        } else {
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = c0; j < c1; j++) {
                    int64_t di = (int64_t)ix[i] * C + j;
                    st1(dst, di, ld1(dst, di) + ld1(src, i * C + j));
                }
        }
    }
    return TK_OK;
}

/* Rows of C elements a tensor holds (its element count / C, whatever its
 * shape: a [B,T,C] gradient is B*T rows), so ids past the end are refused
 * instead of written out of bounds. */
static int64_t table_rows(const tk_tensor *t, int64_t C) {
    if (t->ndim < 1 || C <= 0) return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim && i < TK_MAX_DIMS; i++) n *= t->shape[i];
    return n / C;
}

static tk_status cpu_embed_fwd(void *ctx, tk_tensor *out, const tk_tensor *ids, const tk_tensor *table,
                               int64_t n, int64_t C) {
    return gather(ctx, out, table, table_rows(table, C), ids, n, C);
}

/* The grouped order of tk_op_embed_bwd (tk_gpu.h, gpu/embed_groups.c): each
 * table row's positions summed a chunk at a time from zero, the chunk sums
 * added to the row in chunk order. Rows are independent, so threads take
 * whole groups. */
static tk_status embed_bwd_grouped(cpu_ctx *c, tk_tensor *dtable, int64_t rows, const tk_tensor *dout,
                                   const int32_t *gr, int64_t n, int64_t C) {
    const int64_t G = gr[0], NC = gr[1];
    const int32_t *row = gr + 4, *first = row + G, *start = first + G + 1, *order = start + NC + 1 + NC;
    for (int64_t g = 0; g < G; g++)
        if (row[g] < 0 || (rows >= 0 && row[g] >= rows)) return TK_EINVAL;
    int failed = 0;
#pragma omp parallel num_threads(c->head.threads) if (n * C > PAR_MIN)
    {
        float *s = tk_malloc((size_t)C * 2 * sizeof(float)), *bx = s ? s + C : NULL;
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 16)
        for (int64_t g = 0; g < G; g++) {
            if (!s) continue;
            int64_t dst = (int64_t)row[g] * C;
            for (int64_t ch = first[g]; ch < first[g + 1]; ch++) {
                memset(s, 0, (size_t)C * sizeof(float));
                for (int64_t k = start[ch]; k < start[ch + 1]; k++) {
                    const float *x = ld_chunk(bx, dout, (int64_t)order[k] * C, C);
#pragma omp simd
                    for (int64_t j = 0; j < C; j++) s[j] += x[j];
                }
                for (int64_t j = 0; j < C; j++) st1(dtable, dst + j, ld1(dtable, dst + j) + s[j]);
            }
        }
        free(s);
    }
    (void)n;
    return failed ? TK_ENOMEM : TK_OK;
}

static tk_status cpu_embed_bwd(void *ctx, tk_tensor *dtable, const tk_tensor *ids, const tk_tensor *dout,
                               int64_t n, int64_t C, const tk_tensor *groups, tk_tensor *scratch) {
    (void)scratch; /* host memory needs no staging: each group writes its row directly */
    if (groups) return embed_bwd_grouped(ctx, dtable, table_rows(dtable, C), dout, groups->data, n, C);
    return scatter_add(ctx, dtable, table_rows(dtable, C), dout, ids, n, C);
}

static tk_status cpu_gather_rows(void *ctx, tk_tensor *out, const tk_tensor *in, const tk_tensor *idx,
                                 int64_t n, int64_t C) {
    return gather(ctx, out, in, table_rows(in, C), idx, n, C);
}

static tk_status cpu_scatter_add_rows(void *ctx, tk_tensor *din, const tk_tensor *dout,
                                      const tk_tensor *idx, int64_t n, int64_t C) {
    return scatter_add(ctx, din, table_rows(din, C), dout, idx, n, C);
}

/* (B,T,NH,HS) <-> (B,NH,T,HS); split != 0 goes left to right. */
static tk_status heads(cpu_ctx *c, tk_tensor *out, const tk_tensor *in, int64_t B, int64_t T,
                       int64_t NH, int64_t HS, int split) {
    int64_t rows = B * T * NH;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (rows * HS > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (T * NH), t = (r / NH) % T, h = r % NH;
        int64_t o_btnh = ((b * T + t) * NH + h) * HS, o_bnth = ((b * NH + h) * T + t) * HS;
        if (split) copy_row(out->data, out->dtype, o_bnth, in->data, in->dtype, o_btnh, HS);
        else copy_row(out->data, out->dtype, o_btnh, in->data, in->dtype, o_bnth, HS);
    }
    return TK_OK;
}

static tk_status cpu_split_heads(void *ctx, tk_tensor *out, const tk_tensor *in,
                                 int64_t B, int64_t T, int64_t NH, int64_t HS) {
    return heads(ctx, out, in, B, T, NH, HS, 1);
}

static tk_status cpu_merge_heads(void *ctx, tk_tensor *out, const tk_tensor *in,
                                 int64_t B, int64_t T, int64_t NH, int64_t HS) {
    return heads(ctx, out, in, B, T, NH, HS, 0);
}

/* ---- elementwise ------------------------------------------------------------ */

static tk_status cpu_add(void *ctx, tk_tensor *out, const tk_tensor *a, const tk_tensor *b, int64_t n) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++) {
        float ba[CH], bb[CH], bo[CH];
        int64_t off = ci * CH, len = CHUNK_LEN(n, ci);
        const float *x = ld_chunk(ba, a, off, len), *y = ld_chunk(bb, b, off, len);
        float *o = st_chunk(bo, out, off);
#pragma omp simd
        for (int64_t i = 0; i < len; i++) o[i] = x[i] + y[i];
        st_commit(out, off, len, o);
    }
    return TK_OK;
}

static tk_status cpu_axpby(void *ctx, tk_tensor *y, float alpha, const tk_tensor *x, float beta, int64_t n) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++) {
        float bx[CH], by[CH];
        int64_t off = ci * CH, len = CHUNK_LEN(n, ci);
        const float *xv = ld_chunk(bx, x, off, len);
        float *yv = st_chunk(by, y, off);
        if (beta == 0.0f) { /* as in BLAS: y is not read, so NaN garbage in y does not leak */
#pragma omp simd
            for (int64_t i = 0; i < len; i++) yv[i] = alpha * xv[i];
        } else {
            if (y->dtype != TK_F32) tk_cpu_to_f32(by, y->data, y->dtype, off, len);
#pragma omp simd
            for (int64_t i = 0; i < len; i++) yv[i] = alpha * xv[i] + beta * yv[i];
        }
        st_commit(y, off, len, yv);
    }
    return TK_OK;
}

static tk_status cpu_fill(void *ctx, tk_tensor *t, float value, int64_t n) {
    cpu_ctx *c = ctx;
    if (t->dtype == TK_F32) {
        float *p = t->data;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) p[i] = value;
    } else if (t->dtype == TK_F16 || t->dtype == TK_BF16) {
        uint16_t v = t->dtype == TK_F16 ? f2h(value) : f2bf(value), *p = t->data;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) p[i] = v;
    } else if (t->dtype == TK_I32) {
        int32_t v = (int32_t)value, *p = t->data;
        for (int64_t i = 0; i < n; i++) p[i] = v;
    } else if (t->dtype == TK_I8 || t->dtype == TK_U8) {
        memset(t->data, t->dtype == TK_I8 ? (int8_t)value : (uint8_t)value, (size_t)n);
    } else {
        int64_t v = (int64_t)value, *p = t->data;
        for (int64_t i = 0; i < n; i++) p[i] = v;
    }
    return TK_OK;
}

static tk_status cpu_fill_many(void *ctx, tk_tensor *const *ts, int n, float value) {
    return tk_fill_many_each(ctx, cpu_fill, ts, n, value);
}

static tk_status cpu_cast(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++)
        copy_row(out->data, out->dtype, ci * CH, in->data, in->dtype, ci * CH, CHUNK_LEN(n, ci));
    return TK_OK;
}

static tk_status cpu_gelu_fwd(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN / 8)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++) {
        float bx[CH], bo[CH];
        int64_t off = ci * CH, len = CHUNK_LEN(n, ci);
        const float *x = ld_chunk(bx, in, off, len);
        float *o = st_chunk(bo, out, off);
        k_gelu_fwd(o, x, len);
        st_commit(out, off, len, o);
    }
    return TK_OK;
}

static tk_status cpu_gelu_bwd(void *ctx, tk_tensor *din, const tk_tensor *in, const tk_tensor *dout, int64_t n) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN / 8)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++) {
        float bx[CH], bd[CH], bo[CH];
        int64_t off = ci * CH, len = CHUNK_LEN(n, ci);
        const float *x = ld_chunk(bx, in, off, len), *d = ld_chunk(bd, dout, off, len);
        float *o = st_chunk(bo, din, off);
        k_gelu_bwd(o, x, d, len);
        st_commit(din, off, len, o);
    }
    return TK_OK;
}

static tk_status cpu_tanh_fwd(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN / 8)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++) {
        float bx[CH], bo[CH];
        int64_t off = ci * CH, len = CHUNK_LEN(n, ci);
        const float *x = ld_chunk(bx, in, off, len);
        float *o = st_chunk(bo, out, off);
        for (int64_t i = 0; i < len; i++) o[i] = tanhf(x[i]);
        st_commit(out, off, len, o);
    }
    return TK_OK;
}

static tk_status cpu_tanh_bwd(void *ctx, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout, int64_t n) {
    cpu_ctx *c = ctx;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++) {
        float by[CH], bd[CH], bo[CH];
        int64_t off = ci * CH, len = CHUNK_LEN(n, ci);
        const float *y = ld_chunk(by, out, off, len), *d = ld_chunk(bd, dout, off, len);
        float *o = st_chunk(bo, din, off);
#pragma omp simd
        for (int64_t i = 0; i < len; i++) o[i] = d[i] * (1.0f - y[i] * y[i]);
        st_commit(din, off, len, o);
    }
    return TK_OK;
}

/* ---- dropout (tk_ops_spec.h) ------------------------------------------------ */

/* Dropout of n elements whose absolute indices start at idx0, with the bits
 * of tk_ops_spec.h's rule: keep = (float)(h >> 40) * 2^-24 >= p compares an
 * exact 24-bit integer scaled by a power of two with p, so it is the integer
 * compare (h >> 40) >= ceil(p * 2^24), which `omp simd` runs 4 or 8 lanes
 * wide with the hash (AVX2 builds the 64-bit multiplies from 32-bit ones).
 * The mask, when kept, is written in a second loop: a conditional store in
 * the first would keep it scalar. test_cpu_ops holds the bits to
 * tk_dropout_keep. */
static inline int64_t top24(uint64_t key, uint64_t idx) { /* < 2^24: a signed compare suffices */
    return (int64_t)(tk_spec_mix64(key + idx * TK_DROPOUT_GOLDEN) >> 40);
}

TK_VEC_CLONES
static void k_dropout(float *o, uint8_t *mk, const float *x, int64_t n, uint64_t key, uint64_t idx0, float p,
                      float scale) { /* o may be x; 0 < p < 1 */
    const int64_t t = (int64_t)ceilf(p * 16777216.0f); /* keep iff h >> 40 >= t; t = 2^24 keeps none */
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = top24(key, idx0 + (uint64_t)i) >= t ? x[i] * scale : 0.0f;
    if (mk) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) mk[i] = (uint8_t)(top24(key, idx0 + (uint64_t)i) >= t);
    }
}

static tk_status cpu_dropout_fwd(void *ctx, tk_tensor *out, tk_tensor *mask, const tk_tensor *in,
                                 int64_t n, float p, uint64_t seed, uint64_t offset) {
    cpu_ctx *c = ctx;
    uint64_t key = tk_dropout_key(seed);
    float scale = tk_dropout_scale(p);
    uint8_t *mk = mask ? mask->data : NULL;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN / 4)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++) {
        float bx[CH], bo[CH];
        int64_t off = ci * CH, len = CHUNK_LEN(n, ci);
        const float *x = ld_chunk(bx, in, off, len);
        float *o = st_chunk(bo, out, off);
        if (p <= 0.0f) {
            if (o != x) memcpy(o, x, (size_t)len * 4);
            if (mk) memset(mk + off, 1, (size_t)len);
        } else {
            k_dropout(o, mk ? mk + off : NULL, x, len, key, offset + (uint64_t)off, p, scale);
        }
        st_commit(out, off, len, o);
    }
    return TK_OK;
}

static tk_status cpu_dropout_bwd(void *ctx, tk_tensor *din, const tk_tensor *dout, int64_t n,
                                 float p, uint64_t seed, uint64_t offset) {
    return cpu_dropout_fwd(ctx, din, NULL, dout, n, p, seed, offset);
}

/* ---- row ops: layernorm, softmax, cross-entropy ------------------------------
 * A thread converts 16-bit rows into its own f32 buffers (malloc'd once per
 * op per thread); f32 rows are used in place. */

static tk_status cpu_layernorm_fwd(void *ctx, tk_tensor *out, tk_tensor *mean, tk_tensor *rstd,
                                   const tk_tensor *in, const tk_tensor *w, const tk_tensor *b,
                                   int64_t N, int64_t C, float eps) {
    cpu_ctx *c = ctx;
    int failed = 0;
    float *mu = mean ? mean->data : NULL, *rs = rstd ? rstd->data : NULL;
#pragma omp parallel num_threads(c->head.threads) if (N * C > PAR_MIN)
    {
        float *buf = tk_malloc((size_t)C * 4 * sizeof(float));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        float *bx = buf, *bo = buf ? buf + C : NULL, *bw = buf ? buf + 2 * C : NULL, *bb = buf ? buf + 3 * C : NULL;
        const float *wv = NULL, *bv = NULL;
        if (buf) {
            wv = ld_chunk(bw, w, 0, C);
            bv = ld_chunk(bb, b, 0, C);
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            if (!buf) continue;
            const float *x = ld_chunk(bx, in, r * C, C);
            float *o = st_chunk(bo, out, r * C);
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t j = 0; j < C; j++) s += x[j];
            float m = s / (float)C, v = 0.0f;
#pragma omp simd reduction(+ : v)
            for (int64_t j = 0; j < C; j++) {
                float d = x[j] - m;
                v += d * d;
            }
            float rstdv = 1.0f / sqrtf(v / (float)C + eps);
#pragma omp simd
            for (int64_t j = 0; j < C; j++) o[j] = (x[j] - m) * rstdv * wv[j] + bv[j];
            st_commit(out, r * C, C, o);
            if (mu) mu[r] = m;
            if (rs) rs[r] = rstdv;
        }
        free(buf);
    }
    return failed ? TK_ENOMEM : TK_OK;
}

/* The three ops in sequence (the order and roundings tk_gpu.h promises);
 * r aliases x in the model, so the dropout runs in place there. */
static tk_status cpu_residual_layernorm_fwd(void *ctx, tk_tensor *r, tk_tensor *out, tk_tensor *mean,
                                            tk_tensor *rstd, const tk_tensor *x, const tk_tensor *res,
                                            const tk_tensor *w, const tk_tensor *b, int64_t N, int64_t C,
                                            float eps, float p, uint64_t seed, uint64_t offset) {
    tk_status st = cpu_dropout_fwd(ctx, r, NULL, x, N * C, p, seed, offset);
    if (st == TK_OK) st = cpu_add(ctx, r, r, res, N * C);
    return st == TK_OK ? cpu_layernorm_fwd(ctx, out, mean, rstd, r, w, b, N, C, eps) : st;
}

/* din = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * w;
 * dw += sum dout * norm, db += sum dout, each thread summing its rows into a
 * private row that is then added in thread order (deterministic). */
static tk_status cpu_layernorm_bwd(void *ctx, tk_tensor *din, tk_tensor *dw, tk_tensor *db,
                                   const tk_tensor *dout, const tk_tensor *in, const tk_tensor *w,
                                   const tk_tensor *mean, const tk_tensor *rstd,
                                   int64_t N, int64_t C, int accumulate, tk_tensor *scratch) {
    cpu_ctx *c = ctx;
    (void)scratch; /* the threads' partial rows below are host memory of their own */
    int nt = (N * C > PAR_MIN) ? c->head.threads : 1;
    float *part = tk_calloc((size_t)nt * 2 * C, sizeof(float));
    if (!part) return TK_ENOMEM;
    int failed = 0;
    const float *mu = mean->data, *rs = rstd->data;
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num();
        float *pdw = part + (size_t)tid * 2 * C, *pdb = pdw + C;
        float *buf = tk_malloc((size_t)C * 5 * sizeof(float));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        float *bx = buf, *bd = buf ? buf + C : NULL, *bo = buf ? buf + 2 * C : NULL,
              *bw = buf ? buf + 3 * C : NULL, *nrm = buf ? buf + 4 * C : NULL;
        const float *wv = buf ? ld_chunk(bw, w, 0, C) : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            if (!buf) continue;
            const float *x = ld_chunk(bx, in, r * C, C), *d = ld_chunk(bd, dout, r * C, C);
            float m = mu[r], rsv = rs[r], sd = 0.0f, sdn = 0.0f;
#pragma omp simd reduction(+ : sd, sdn)
            for (int64_t j = 0; j < C; j++) {
                float nj = (x[j] - m) * rsv, dn = d[j] * wv[j];
                nrm[j] = nj;
                sd += dn;
                sdn += dn * nj;
                pdw[j] += d[j] * nj;
                pdb[j] += d[j];
            }
            sd /= (float)C;
            sdn /= (float)C;
            float *o = st_chunk(bo, din, r * C);
            if (accumulate && din->dtype != TK_F32) tk_cpu_to_f32(bo, din->data, din->dtype, r * C, C);
            if (accumulate) {
#pragma omp simd
                for (int64_t j = 0; j < C; j++) o[j] += (d[j] * wv[j] - sd - nrm[j] * sdn) * rsv;
            } else {
#pragma omp simd
                for (int64_t j = 0; j < C; j++) o[j] = (d[j] * wv[j] - sd - nrm[j] * sdn) * rsv;
            }
            st_commit(din, r * C, C, o);
        }
        free(buf);
    }
    if (!failed) {
        for (int64_t j = 0; j < C; j++) {
            float sw = 0.0f, sb = 0.0f;
            for (int t = 0; t < nt; t++) {
                sw += part[(size_t)t * 2 * C + j];
                sb += part[(size_t)t * 2 * C + C + j];
            }
            if (dw) st1(dw, j, ld1(dw, j) + sw);
            if (db) st1(db, j, ld1(db, j) + sb);
        }
    }
    free(part);
    return failed ? TK_ENOMEM : TK_OK;
}

/* HF BERT's extended attention mask: (1 - mask) * finfo(float32).min. */

static tk_status cpu_softmax_fwd(void *ctx, tk_tensor *out, const tk_tensor *in, const tk_tensor *mask,
                                 int64_t B, int64_t NH, int64_t T, float scale) {
    cpu_ctx *c = ctx;
    int64_t rows = B * NH * T;
    const int32_t *mk = mask ? mask->data : NULL;
    int failed = 0;
#pragma omp parallel num_threads(c->head.threads) if (rows * T > PAR_MIN / 4)
    {
        int need = in->dtype != TK_F32 || out->dtype != TK_F32;
        float *buf = need ? tk_malloc((size_t)T * 2 * sizeof(float)) : NULL;
        if (need && !buf) {
#pragma omp atomic write
            failed = 1;
        }
        float *bx = buf, *bo = buf ? buf + T : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (need && !buf) continue;
            const float *x = ld_chunk(bx, in, r * T, T);
            float *o = st_chunk(bo, out, r * T);
            const int32_t *mrow = mk ? mk + (r / (NH * T)) * T : NULL;
            float mx = -INFINITY;
            if (mrow) {
#pragma omp simd reduction(max : mx)
                for (int64_t j = 0; j < T; j++) {
                    float z = scale * x[j] + (mrow[j] == 0 ? TK_MASK_BIAS : 0.0f);
                    o[j] = z;
                    mx = z > mx ? z : mx;
                }
            } else {
#pragma omp simd reduction(max : mx)
                for (int64_t j = 0; j < T; j++) {
                    float z = scale * x[j];
                    o[j] = z;
                    mx = z > mx ? z : mx;
                }
            }
            if (mx == -INFINITY) { /* every logit -inf: no distribution exists; emit zeros */
                for (int64_t j = 0; j < T; j++) o[j] = 0.0f;
            } else {
                float s = k_exp_sub_sum(o, mx, T);
                float inv = 1.0f / s;
#pragma omp simd
                for (int64_t j = 0; j < T; j++) o[j] *= inv;
            }
            st_commit(out, r * T, T, o);
        }
        free(buf);
    }
    return failed ? TK_ENOMEM : TK_OK;
}

static tk_status cpu_softmax_bwd(void *ctx, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout,
                                 int64_t rows, int64_t T, float scale) {
    cpu_ctx *c = ctx;
    int failed = 0;
#pragma omp parallel num_threads(c->head.threads) if (rows * T > PAR_MIN / 4)
    {
        int need = din->dtype != TK_F32 || out->dtype != TK_F32 || dout->dtype != TK_F32;
        float *buf = need ? tk_malloc((size_t)T * 3 * sizeof(float)) : NULL;
        if (need && !buf) {
#pragma omp atomic write
            failed = 1;
        }
        float *by = buf, *bd = buf ? buf + T : NULL, *bo = buf ? buf + 2 * T : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (need && !buf) continue;
            const float *y = ld_chunk(by, out, r * T, T), *d = ld_chunk(bd, dout, r * T, T);
            float *o = st_chunk(bo, din, r * T);
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t j = 0; j < T; j++) s += y[j] * d[j];
#pragma omp simd
            for (int64_t j = 0; j < T; j++) o[j] = scale * y[j] * (d[j] - s);
            st_commit(din, r * T, T, o);
        }
        free(buf);
    }
    return failed ? TK_ENOMEM : TK_OK;
}

/* The fused pair as the two ops in sequence (tk_gpu.h). */
static tk_status cpu_softmax_dropout_fwd(void *ctx, tk_tensor *P, tk_tensor *PD, const tk_tensor *in,
                                         const tk_tensor *mask, int64_t B, int64_t NH, int64_t T, float scale,
                                         float p, uint64_t seed, uint64_t offset) {
    tk_status st = cpu_softmax_fwd(ctx, P, in, mask, B, NH, T, scale);
    if (st != TK_OK || !PD) return st;
    return cpu_dropout_fwd(ctx, PD, NULL, P, B * NH * T * T, p, seed, offset);
}

static tk_status cpu_softmax_dropout_bwd(void *ctx, tk_tensor *din, const tk_tensor *P, const tk_tensor *dPD,
                                         int64_t rows, int64_t T, float scale, float p, uint64_t seed,
                                         uint64_t offset) {
    tk_status st = cpu_dropout_fwd(ctx, din, NULL, dPD, rows * T, p, seed, offset);
    return st == TK_OK ? cpu_softmax_bwd(ctx, din, P, din, rows, T, scale) : st;
}

/* One row: p = softmax(x) written to o (may be NULL), returns log-sum-exp.
 * The sum of exponentials is >= 1 (the max term is 1), so f32 holds it well. */
static float softmax_row(float *o, const float *x, int64_t V) {
    float mx = -INFINITY, s = 0.0f;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    if (o) {
        memmove(o, x, (size_t)V * sizeof(float)); /* in-place xent_bwd: o == x */
        s = k_exp_sub_sum(o, mx, V);
        float inv = 1.0f / s;
#pragma omp simd
        for (int64_t j = 0; j < V; j++) o[j] *= inv;
    } else {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < V; j++) s += v_exp(x[j] - mx);
    }
    return mx + logf(s);
}

static tk_status cpu_xent_fwd(void *ctx, tk_tensor *losses, tk_tensor *probs, const tk_tensor *logits,
                              const tk_tensor *labels, int64_t N, int64_t V) {
    cpu_ctx *c = ctx;
    const int32_t *lab = labels->data;
    for (int64_t i = 0; i < N; i++)
        if (lab[i] >= V) return TK_EINVAL;
    float *loss = losses->data;
    int failed = 0;
#pragma omp parallel num_threads(c->head.threads) if (N * V > PAR_MIN / 4)
    {
        float *buf = tk_malloc((size_t)V * 2 * sizeof(float));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            if (!buf) continue;
            const float *x = ld_chunk(buf, logits, r * V, V);
            float *o = probs ? st_chunk(buf + V, probs, r * V) : NULL;
            float lse = softmax_row(o, x, V);
            loss[r] = lab[r] < 0 ? 0.0f : lse - x[lab[r]];
            if (o) st_commit(probs, r * V, V, o);
        }
        free(buf);
    }
    return failed ? TK_ENOMEM : TK_OK;
}

static tk_status cpu_xent_bwd(void *ctx, tk_tensor *dlogits, const tk_tensor *logits,
                              const tk_tensor *labels, int64_t N, int64_t V, float scale) {
    cpu_ctx *c = ctx;
    const int32_t *lab = labels->data;
    for (int64_t i = 0; i < N; i++)
        if (lab[i] >= V) return TK_EINVAL;
    int failed = 0;
#pragma omp parallel num_threads(c->head.threads) if (N * V > PAR_MIN / 4)
    {
        float *buf = tk_malloc((size_t)V * 2 * sizeof(float));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            if (!buf) continue;
            float *o = st_chunk(buf + V, dlogits, r * V);
            if (lab[r] < 0) {
                memset(o, 0, (size_t)V * sizeof(float));
            } else {
                const float *x = ld_chunk(buf, logits, r * V, V);
                softmax_row(o, x, V);
                o[lab[r]] -= 1.0f;
                for (int64_t j = 0; j < V; j++) o[j] *= scale;
            }
            st_commit(dlogits, r * V, V, o);
        }
        free(buf);
    }
    return failed ? TK_ENOMEM : TK_OK;
}

/* ---- reductions ----------------------------------------------------------- */

/* db[c] += sum_n dout[n,c]; threads own column ranges (same result for any count). */
static tk_status cpu_bias_grad(void *ctx, tk_tensor *db, const tk_tensor *dout, int64_t N, int64_t C) {
    cpu_ctx *c = ctx;
    int nt = (N * C > PAR_MIN) ? c->head.threads : 1;
    int64_t cw = ((C + nt - 1) / nt + 15) / 16 * 16;
    int64_t nblk = (C + cw - 1) / cw;
    int failed = 0;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * cw, c1 = c0 + cw < C ? c0 + cw : C, w = c1 - c0;
        float *acc = tk_calloc((size_t)w, sizeof(float));
        if (!acc) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        if (dout->dtype == TK_F32) {
            const float *d = dout->data;
            for (int64_t r = 0; r < N; r++) {
                const float *restrict row = d + r * C + c0;
#pragma omp simd
                for (int64_t j = 0; j < w; j++) acc[j] += row[j];
            }
        } else {
            for (int64_t r = 0; r < N; r++)
                for (int64_t j = 0; j < w; j++) acc[j] += ld1(dout, r * C + c0 + j);
        }
        for (int64_t j = 0; j < w; j++) st1(db, c0 + j, ld1(db, c0 + j) + acc[j]);
        free(acc);
    }
    return failed ? TK_ENOMEM : TK_OK;
}

#define SUMSQ_MAXT 256

static tk_status cpu_sumsq(void *ctx, tk_tensor *out, const tk_tensor *x, int64_t n, int accumulate) {
    cpu_ctx *c = ctx;
    int nt = (n > PAR_MIN) ? (c->head.threads < SUMSQ_MAXT ? c->head.threads : SUMSQ_MAXT) : 1;
    double part[SUMSQ_MAXT] = {0};
    /* Chunk ci always goes to thread ci % nt and partials are added in thread
     * order: the same n and thread count give the same bits. */
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), nth = omp_get_num_threads(); /* the runtime may grant fewer */
        double acc = 0.0;
        float bx[CH];
        for (int64_t ci = tid; ci < NCHUNK(n); ci += nth) {
            int64_t len = CHUNK_LEN(n, ci);
            const float *v = ld_chunk(bx, x, ci * CH, len);
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t i = 0; i < len; i++) s += v[i] * v[i];
            acc += s;
        }
        part[tid] = acc;
    }
    double tot = 0.0;
    for (int t = 0; t < nt; t++) tot += part[t];
    float *o = out->data;
    o[0] = accumulate ? o[0] + (float)tot : (float)tot;
    return TK_OK;
}

/* Each tensor's sum in f64 chunk by chunk (chunk ci to thread ci % nt, the
 * threads' sums added in thread order), the tensors' sums in list order,
 * rounded once: the same bits for the same list and thread count. */
static tk_status cpu_sumsq_many(void *ctx, tk_tensor *out, const tk_tensor *const *xs, int n) {
    cpu_ctx *c = ctx;
    double tot = 0.0;
    for (int i = 0; i < n; i++) {
        const tk_tensor *x = xs[i];
        int64_t len_x = tk_tensor_numel(x);
        int nt = (len_x > PAR_MIN) ? (c->head.threads < SUMSQ_MAXT ? c->head.threads : SUMSQ_MAXT) : 1;
        double part[SUMSQ_MAXT] = {0};
#pragma omp parallel num_threads(nt)
        {
            int tid = omp_get_thread_num(), nth = omp_get_num_threads();
            double acc = 0.0;
            float bx[CH];
            for (int64_t ci = tid; ci < NCHUNK(len_x); ci += nth) {
                int64_t len = CHUNK_LEN(len_x, ci);
                const float *v = ld_chunk(bx, x, ci * CH, len);
                for (int64_t k = 0; k < len; k++) acc += (double)v[k] * v[k];
            }
            part[tid] = acc;
        }
        for (int t = 0; t < nt; t++) tot += part[t];
    }
    ((float *)out->data)[0] = (float)tot;
    return TK_OK;
}

/* ---- optimizers -------------------------------------------------------------
 * torch.optim.AdamW (foreach=False): the update is tk_ops_spec.h's
 * tk_adamw_update, the one the cuda kernels run. */

/* No AVX clones here: the update is memory-bound (no measurable gain), and
 * without FMA contraction it stays bit-identical on every x86-64 machine and
 * to the cuda kernels' host build (tests/gpu_cuda_host checks that). It runs
 * 4 wide (SSE2) now that the file is built with -fno-math-errno: sqrtps and
 * divps round exactly as sqrtss and divss do, so the bits are the same. */
static void k_adamw(float *restrict p, float *restrict m, float *restrict v, const float *restrict g,
                    int64_t n, const tk_adamw_coef *kp) {
    const tk_adamw_coef k = *kp;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) tk_adamw_update(&p[i], &m[i], &v[i], g[i] * k.grad_scale, &k);
}

static tk_status cpu_adamw(void *ctx, tk_tensor *param, const tk_tensor *grad, tk_tensor *m, tk_tensor *v,
                           int64_t n, const tk_adamw_hp *hp) {
    cpu_ctx *c = ctx;
    tk_adamw_coef k = tk_adamw_coef_of(hp);
    float *p = param->data, *mm = m->data, *vv = v->data;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN / 4)
    for (int64_t ci = 0; ci < NCHUNK(n); ci++) {
        float bg[CH];
        int64_t off = ci * CH, len = CHUNK_LEN(n, ci);
        k_adamw(p + off, mm + off, vv + off, ld_chunk(bg, grad, off, len), len, &k);
    }
    return TK_OK;
}

/* The table one parameter at a time: the same bits as tk_op_adamw per item. */
static tk_status cpu_adamw_many(void *ctx, const tk_adamw_item *items, int n_items, const tk_adamw_hp *hp) {
    return tk_adamw_many_each(ctx, cpu_adamw, items, n_items, hp);
}

/* 8-bit AdamW: per block, decode m and v (tk_ops_spec.h), update in f32 as
 * above, take the new block absmax as scale, re-encode. The parameter update
 * uses the unquantised new moments. Blocks are independent. */
static tk_status cpu_adamw8(void *ctx, tk_tensor *param, const tk_tensor *grad,
                            tk_tensor *m, tk_tensor *mscale, tk_tensor *v, tk_tensor *vscale,
                            int64_t n, const tk_adamw_hp *hp) {
    cpu_ctx *c = ctx;
    tk_adamw_coef k = tk_adamw_coef_of(hp);
    float *p = param->data, *ms = mscale->data, *vs = vscale->data;
    int8_t *mq = m->data;
    uint8_t *vq = v->data;
    int64_t nb = (n + TK_Q8_BLOCK - 1) / TK_Q8_BLOCK;
#pragma omp parallel for num_threads(c->head.threads) schedule(static) if (n > PAR_MIN / 4)
    for (int64_t bi = 0; bi < nb; bi++) {
        float bg[TK_Q8_BLOCK], bm[TK_Q8_BLOCK], bv[TK_Q8_BLOCK];
        int64_t off = bi * TK_Q8_BLOCK, len = n - off < TK_Q8_BLOCK ? n - off : TK_Q8_BLOCK;
        const float *g = ld_chunk(bg, grad, off, len);
        float msc = ms[bi], vsc = vs[bi], mmax = 0.0f, vmax = 0.0f;
        for (int64_t i = 0; i < len; i++) {
            float mi = tk_q8_decode_m(mq[off + i], msc), vi = tk_q8_decode_v(vq[off + i], vsc);
            tk_adamw_update(&p[off + i], &mi, &vi, g[i] * k.grad_scale, &k);
            bm[i] = mi;
            bv[i] = vi;
            float am = fabsf(mi);
            mmax = am > mmax ? am : mmax;
            vmax = vi > vmax ? vi : vmax;
        }
        for (int64_t i = 0; i < len; i++) {
            mq[off + i] = tk_q8_encode_m(bm[i], mmax);
            vq[off + i] = tk_q8_encode_v(bv[i], vmax);
        }
        ms[bi] = mmax;
        vs[bi] = vmax;
    }
    return TK_OK;
}

/* ---- the table -------------------------------------------------------------- */

#define cpu_write cpu_copy /* host memory: the same copy both ways */
#define cpu_read cpu_copy
#define CPU_OP(op) .op = cpu_##op,
TK_BACKEND_TABLE(cpu_backend, "cpu", CPU_OP, CPU_OP, tk_cpu_attention_fwd, tk_cpu_attention_bwd);
#undef CPU_OP

const tk_backend *tk_backend_cpu(void) { return &cpu_backend; }
