/* tk_cuda.h — what the cuda plugin (build/libtk_cuda.so) exports besides its
 * backend table. Plain C, no CUDA headers: the main binaries include it and
 * resolve these functions with dlsym on the plugin they opened.
 *
 * The plugin's backend table comes from tk_cuda_plugin_open (declared in
 * tk_backend_impl.h). The functions below take the ctx that call returned.
 *
 * Device memory the plugin sees, in two parts:
 *  - segments: what seg_alloc handed to the caching allocator (its
 *    `reserved`), the plugin's own buffers included: the device takes the
 *    GEMM workspace and the kernels' scratch from its allocator and binds
 *    them (tk_cuda_bind_buffers) before any op runs;
 *  - everything else in the process that CUPTI records (libraries allocating
 *    for themselves, other code calling cudaMalloc).
 * "Outside the allocator" is CUPTI's live device total minus the segments.
 */
#ifndef TK_CUDA_H
#define TK_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TK_CUDA_MAX_SCOPES 256

/* tk_cuda_mem_totals, the struct the plugin fills, is declared in tk_gpu.h:
 * the main binaries read it through tk_dev_cuda_mem_totals without this
 * header. Its kernel counts (n_kernels, kernel_ns) and the owner scopes
 * below need TXK_CUPTI=kernels when the device opens: by default CUPTI
 * records memory only (kernel tracing costs every launch host time). */

/* Waits for the device, flushes CUPTI's buffers and fills *out. Works (with
 * cupti_active = 0) when CUPTI could not be enabled. */
tk_status tk_cuda_mem_totals_get(void *ctx, tk_cuda_mem_totals *out, tk_err *err);
typedef tk_status (*tk_cuda_mem_totals_get_fn)(void *ctx, tk_cuda_mem_totals *out, tk_err *err);

/* Gives the plugin its buffers, allocator blocks the device took for it:
 * the GEMM workspace every cuBLAS/cuBLASLt call works in (ws, ws_bytes) and
 * the kernels' scratch (TK_CUDA_RED_BLOCKS doubles, then the error word).
 * Called once, as the device opens, before any op. */
tk_status tk_cuda_bind_buffers(void *ctx, void *ws, size_t ws_bytes, void *scratch, size_t scratch_bytes,
                               tk_err *err);
typedef tk_status (*tk_cuda_bind_buffers_fn)(void *ctx, void *ws, size_t ws_bytes, void *scratch,
                                             size_t scratch_bytes, tk_err *err);

/* Starts the peaks (CUPTI's device and per-library peaks, the segments'
 * peak) afresh from what is live now, after waiting for the device: a run
 * then reports its own peak, not the process' highest. */
tk_status tk_cuda_mem_reset_peak(void *ctx, tk_err *err);
typedef tk_status (*tk_cuda_mem_reset_peak_fn)(void *ctx, tk_err *err);

/* Kernel time per owner scope. Between push(id) and the matching pop, every
 * kernel the calling thread launches is counted against `id` (an allocator
 * owner id, >= 0); scopes nest, the innermost wins. No-ops without CUPTI. */
void tk_cuda_scope_push(void *ctx, int owner);
void tk_cuda_scope_pop(void *ctx);
/* Kernel count and nanoseconds counted against `owner` so far (after a
 * tk_cuda_mem_totals_get, which flushes). Owners >= TK_CUDA_MAX_SCOPES and
 * kernels outside any scope are counted under -1. */
void tk_cuda_scope_kernel_time(void *ctx, int owner, uint64_t *n_kernels, double *ns);
typedef void (*tk_cuda_scope_push_fn)(void *ctx, int owner);
typedef void (*tk_cuda_scope_pop_fn)(void *ctx);
typedef void (*tk_cuda_scope_kernel_time_fn)(void *ctx, int owner, uint64_t *n_kernels, double *ns);

/* The reference kernels instead of the fast ones (cuda_common.cuh), for
 * every op this context runs from now on (on != 0), or the fast ones again.
 * The GPU tests run each fast kernel against its reference this way. */
void tk_cuda_set_reference(void *ctx, int on);
typedef void (*tk_cuda_set_reference_fn)(void *ctx, int on);

/* GEMMs that asked cuBLASLt for an epilogue (a linear layer's bias, its
 * bias gradient) since the device opened or the last reset, and how many of
 * them cuBLASLt declined (the reference kernels ran them). report (may be
 * NULL) gets a line of totals and one line per declined (shape, epilogue,
 * dtypes) with its reason: what the device prints when it closes. */
void tk_cuda_lt_declines(void *ctx, uint64_t *calls, uint64_t *declined, char *report, size_t n);
void tk_cuda_lt_reset(void *ctx);
typedef void (*tk_cuda_lt_declines_fn)(void *ctx, uint64_t *calls, uint64_t *declined, char *report, size_t n);
typedef void (*tk_cuda_lt_reset_fn)(void *ctx);

#ifdef __cplusplus
}
#endif
#endif
