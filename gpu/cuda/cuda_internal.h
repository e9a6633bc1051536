/* cuda_internal.h — shared by the files of the cuda plugin only.
 *
 * The plugin context, the error helpers every CUDA/cuBLAS call goes through
 * and the entry points of the kernel files (the .cu files here, one per op
 * family: README.md). Host-only code (cuda_plugin.c, cuda_cupti.c,
 * cuda_reference.c) is compiled by gcc against the toolkit's headers; the
 * .cu files by nvcc. The plugin links nothing from libtk: it is
 * loaded into binaries that do not export their symbols, so it formats its
 * own errors.
 *
 * Checks never exit: TK_CU / TK_CUBLAS record file:line and the library's
 * message in the tk_err and make the enclosing function return TK_EDEVICE.
 */
#ifndef TK_CUDA_INTERNAL_H
#define TK_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include "tk_backend_impl.h"
#include "tk_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* TK_CUDA_WORKSPACE_BYTES, TK_CUDA_RED_BLOCKS and TK_CUDA_SCRATCH_BYTES are
 * in tk_gpu.h: the device takes those buffers from its allocator and binds
 * them (tk_cuda_bind_buffers), so plans hold them. */
/* Sticky device-side error bits, reported by the next sync. */
#define TK_CUDA_FLAG_BAD_INDEX 1u  /* an id/label/index outside its table */

typedef struct tk_cuda_ctx {
    int device;
    int cc_major, cc_minor;      /* the card's compute capability (attention.cu picks its kernel by it) */
    cublasHandle_t blas;
    void *workspace;             /* the GEMM workspace (an allocator block, bound at open) */
    size_t workspace_bytes;
    double *red;                 /* TK_CUDA_RED_BLOCKS partial sums (the scratch block) */
    unsigned *flags;             /* device word of TK_CUDA_FLAG_* bits (after red) */
    size_t plugin_bytes;         /* allocated by the plugin outside the allocator: 0 */
    pthread_mutex_t lock;        /* guards the segment counters (allocator may be shared) */
    size_t seg_live, seg_peak;
    char last_error[256];        /* why the last seg_alloc failed, for the caller's message */
    int cupti_on;                /* this ctx holds a reference on the CUPTI session */
    char cupti_why[256];         /* why CUPTI is off, when it is */
    int reference;               /* 1: every op runs its reference kernels (tk_cuda_set_reference) */
    cublasLtHandle_t lt;         /* cuBLASLt, created by the first GEMM with an epilogue (matmul.cu) */
    void *lt_cache;              /* matmul.cu's algorithms by GEMM shape */
    void *lt_stats;              /* matmul.cu's epilogue GEMMs and declines by key (tk_cuda_lt_declines) */
} tk_cuda_ctx;

/* Formats a message into err (which may be NULL); returns st. */
static inline tk_status tk_cuda_fail(tk_err *err, tk_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline tk_status tk_cuda_fail(tk_err *err, tk_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = st;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

const char *tk_cublas_status_str(cublasStatus_t s);

/* The GEMMs cuBLAS is asked for (cu_gemm): why one would be refused, or
 * NULL. Shared with the host emulation (tests/gpu_cuda_host), whose GEMM is
 * the cpu backend's and would otherwise accept dtype mixes the device does
 * not: a model that only ran there could call one and pass. */
static inline const char *tk_cuda_gemm_refusal(const tk_tensor *A, const tk_tensor *B, const tk_tensor *C,
                                               int64_t M, int64_t N, int64_t K, int64_t batch) {
    int fa = A->dtype == TK_F32 || A->dtype == TK_F16 || A->dtype == TK_BF16;
    int fb = B->dtype == TK_F32 || B->dtype == TK_F16 || B->dtype == TK_BF16;
    int fc = C->dtype == TK_F32 || C->dtype == TK_F16 || C->dtype == TK_BF16;
    if (!fa || !fb || !fc) return "A, B and C must be f32, f16 or bf16";
    if (A->dtype != B->dtype) return "A and B differ in dtype; cuBLAS needs both inputs of one dtype";
    if (A->dtype == TK_F32 && C->dtype != TK_F32) return "f32 inputs need an f32 output";
    if (A->dtype != TK_F32 && C->dtype != TK_F32 && C->dtype != A->dtype)
        return "16-bit inputs need an f32 output or one of their own dtype";
    if (M > 2147483647 || N > 2147483647 || K > 2147483647 || batch > 2147483647)
        return "a dimension exceeds INT_MAX";
    return NULL;
}


#define TK_CU(call, err) do { cudaError_t _e = (call); if (_e != cudaSuccess) { \
    cudaGetLastError(); \
    return tk_cuda_fail((err), TK_EDEVICE, "%s:%d: %s failed: %s (%s)", __FILE__, __LINE__, \
                        #call, cudaGetErrorString(_e), cudaGetErrorName(_e)); } } while (0)

#define TK_CUBLAS(call, err) do { cublasStatus_t _s = (call); if (_s != CUBLAS_STATUS_SUCCESS) { \
    return tk_cuda_fail((err), TK_EDEVICE, "%s:%d: %s failed: %s", __FILE__, __LINE__, \
                        #call, tk_cublas_status_str(_s)); } } while (0)

/* After every kernel launch: a bad configuration shows up here, not later. */
#define TK_CU_LAUNCHED(what) do { cudaError_t _e = cudaGetLastError(); if (_e != cudaSuccess) { \
    fprintf(stderr, "txkernel cuda: %s:%d: launching %s failed: %s\n", __FILE__, __LINE__, \
            (what), cudaGetErrorString(_e)); return TK_EDEVICE; } } while (0)

/* cuda_cupti.c: the process-wide CUPTI session (reference counted). */
/* 1: active; 0: unavailable, *why says why. kernels: kernel records (and the
 * API records behind owner scopes) too, not only memory; the first acquirer
 * of the process-wide session decides. */
int tk_cupti_acquire(int kernels, char *why, size_t n);
void tk_cupti_release(void);
tk_status tk_cupti_flush(void);
void tk_cupti_fill(tk_cuda_mem_totals *out);
void tk_cupti_reset_peak(void); /* peaks (device and per source) := what is live now */

/* The kernels' launchers, one file per op family (gpu/cuda/README.md); the
 * same argument lists as tk_backend's entries. */
/* embedding.cu */
tk_status tk_cuda_embed_fwd(void *ctx, tk_tensor *out, const tk_tensor *ids, const tk_tensor *table,
                            int64_t n, int64_t C);
tk_status tk_cuda_embed_bwd(void *ctx, tk_tensor *dtable, const tk_tensor *ids, const tk_tensor *dout,
                            int64_t n, int64_t C, const tk_tensor *groups, tk_tensor *scratch);
tk_status tk_cuda_gather_rows(void *ctx, tk_tensor *out, const tk_tensor *in, const tk_tensor *idx,
                              int64_t n, int64_t C);
tk_status tk_cuda_scatter_add_rows(void *ctx, tk_tensor *din, const tk_tensor *dout,
                                   const tk_tensor *idx, int64_t n, int64_t C);
/* elementwise.cu */
tk_status tk_cuda_add(void *ctx, tk_tensor *out, const tk_tensor *a, const tk_tensor *b, int64_t n);
tk_status tk_cuda_axpby(void *ctx, tk_tensor *y, float alpha, const tk_tensor *x, float beta, int64_t n);
tk_status tk_cuda_fill(void *ctx, tk_tensor *t, float value, int64_t n);
tk_status tk_cuda_fill_many(void *ctx, tk_tensor *const *ts, int n, float value);
tk_status tk_cuda_cast(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n);
tk_status tk_cuda_gelu_fwd(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n);
tk_status tk_cuda_gelu_bwd(void *ctx, tk_tensor *din, const tk_tensor *in, const tk_tensor *dout, int64_t n);
tk_status tk_cuda_tanh_fwd(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n);
tk_status tk_cuda_tanh_bwd(void *ctx, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout, int64_t n);
tk_status tk_cuda_dropout_fwd(void *ctx, tk_tensor *out, tk_tensor *mask, const tk_tensor *in,
                              int64_t n, float p, uint64_t seed, uint64_t offset);
tk_status tk_cuda_dropout_bwd(void *ctx, tk_tensor *din, const tk_tensor *dout, int64_t n,
                              float p, uint64_t seed, uint64_t offset);
/* layernorm.cu */
tk_status tk_cuda_layernorm_fwd(void *ctx, tk_tensor *out, tk_tensor *mean, tk_tensor *rstd,
                                const tk_tensor *in, const tk_tensor *w, const tk_tensor *b,
                                int64_t N, int64_t C, float eps);
tk_status tk_cuda_residual_layernorm_fwd(void *ctx, tk_tensor *r, tk_tensor *out, tk_tensor *mean,
                                         tk_tensor *rstd, const tk_tensor *x, const tk_tensor *res,
                                         const tk_tensor *w, const tk_tensor *b, int64_t N, int64_t C,
                                         float eps, float p, uint64_t seed, uint64_t offset);
tk_status tk_cuda_layernorm_bwd(void *ctx, tk_tensor *din, tk_tensor *dw, tk_tensor *db,
                                const tk_tensor *dout, const tk_tensor *in, const tk_tensor *w,
                                const tk_tensor *mean, const tk_tensor *rstd,
                                int64_t N, int64_t C, int accumulate, tk_tensor *scratch);
/* softmax_dropout.cu */
tk_status tk_cuda_softmax_fwd(void *ctx, tk_tensor *out, const tk_tensor *in, const tk_tensor *mask,
                              int64_t B, int64_t NH, int64_t T, float scale);
tk_status tk_cuda_softmax_bwd(void *ctx, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout,
                              int64_t rows, int64_t T, float scale);
tk_status tk_cuda_softmax_dropout_fwd(void *ctx, tk_tensor *P, tk_tensor *PD, const tk_tensor *in,
                                      const tk_tensor *mask, int64_t B, int64_t NH, int64_t T, float scale,
                                      float p, uint64_t seed, uint64_t offset);
tk_status tk_cuda_softmax_dropout_bwd(void *ctx, tk_tensor *din, const tk_tensor *P, const tk_tensor *dPD,
                                      int64_t rows, int64_t T, float scale, float p, uint64_t seed,
                                      uint64_t offset);
/* classifier.cu */
tk_status tk_cuda_xent_fwd(void *ctx, tk_tensor *losses, tk_tensor *probs, const tk_tensor *logits,
                           const tk_tensor *labels, int64_t N, int64_t V);
tk_status tk_cuda_xent_bwd(void *ctx, tk_tensor *dlogits, const tk_tensor *logits,
                           const tk_tensor *labels, int64_t N, int64_t V, float scale);
/* heads.cu */
tk_status tk_cuda_split_heads(void *ctx, tk_tensor *out, const tk_tensor *in,
                              int64_t B, int64_t T, int64_t NH, int64_t HS);
tk_status tk_cuda_merge_heads(void *ctx, tk_tensor *out, const tk_tensor *in,
                              int64_t B, int64_t T, int64_t NH, int64_t HS);
/* optimizer.cu */
tk_status tk_cuda_sumsq(void *ctx, tk_tensor *out, const tk_tensor *x, int64_t n, int accumulate);
tk_status tk_cuda_sumsq_many(void *ctx, tk_tensor *out, const tk_tensor *const *xs, int n);
tk_status tk_cuda_adamw(void *ctx, tk_tensor *param, const tk_tensor *grad, tk_tensor *m, tk_tensor *v,
                        int64_t n, const tk_adamw_hp *hp);
tk_status tk_cuda_adamw_many(void *ctx, const tk_adamw_item *items, int n_items, const tk_adamw_hp *hp);
tk_status tk_cuda_adamw8(void *ctx, tk_tensor *param, const tk_tensor *grad,
                         tk_tensor *m, tk_tensor *mscale, tk_tensor *v, tk_tensor *vscale,
                         int64_t n, const tk_adamw_hp *hp);
/* attention.cu: fused attention (tk_attn_kernel.h picks the kernel). */
tk_status tk_cuda_attention_fwd(void *ctx, tk_tensor *out, tk_tensor *lse, tk_tensor *keep,
                                const tk_tensor *q, const tk_tensor *k, const tk_tensor *v,
                                const tk_tensor *mask, const tk_attn *a);
tk_status tk_cuda_attention_bwd(void *ctx, tk_tensor *dq, tk_tensor *dk, tk_tensor *dv,
                                const tk_tensor *dout, const tk_tensor *q, const tk_tensor *k,
                                const tk_tensor *v, const tk_tensor *out, const tk_tensor *lse,
                                const tk_tensor *keep, const tk_tensor *mask, const tk_attn *a);
/* matmul.cu: the backend's GEMM (cuBLASLt with its bias and bias-gradient
 * epilogues; cuBLAS plus the reference bias kernels where cuBLASLt declines
 * or the references are asked for) and the bias-gradient op. */
tk_status cu_gemm(void *ctx, tk_tensor *C, const tk_tensor *A, const tk_tensor *B, const tk_tensor *bias,
                  const tk_gemm *g);
tk_status tk_cuda_bias_grad(void *ctx, tk_tensor *db, const tk_tensor *dout, int64_t N, int64_t C);
/* The two library calls under cu_gemm, defined in matmul.cu for the device
 * and by tests/gpu_cuda_host/cuda_emu_backend.cpp for the emulation:
 *  - blas: C = alpha op(A) op(B) + beta C, strided-batched (g's shape, its
 *    beta replaced by `beta`);
 *  - lt (batch 1): C = alpha op(A) op(B) + g->beta C (+ bias on every row),
 *    and with g->bgrad the bias gradient sum written (not added) to
 *    g->bgrad_tmp; *declined = a TK_LT_* reason (nothing done) when it is
 *    not asked (bias and bias gradient at once, a misaligned vector) or the
 *    library has no algorithm for it, so cu_gemm falls back to blas and the
 *    reference kernels; the emulation's stub also declines what cuBLASLt
 *    does not document (a bias dtype other than the output's). */
enum { TK_LT_BOTH = 1, TK_LT_ALIGN, TK_LT_DTYPE, TK_LT_NO_LT, TK_LT_NO_ALGO, TK_LT_REFUSED };
tk_status tk_cuda_blas_gemm(tk_cuda_ctx *c, tk_tensor *C, const tk_tensor *A, const tk_tensor *B,
                            const tk_gemm *g, float beta);
tk_status tk_cuda_lt_gemm(tk_cuda_ctx *c, tk_tensor *C, const tk_tensor *A, const tk_tensor *B,
                          const tk_tensor *bias, const tk_gemm *g, int *declined);
/* matmul.cu: releases the cuBLASLt handle (cu_destroy). */
void tk_cuda_matmul_release(tk_cuda_ctx *c);
/* matmul.cu: prints the epilogue GEMMs and their declines (when there were
 * any GEMMs with an epilogue) and frees the counts; every device close. */
void tk_cuda_lt_stats_close(tk_cuda_ctx *c);

#ifdef __cplusplus
}
#endif
#endif
