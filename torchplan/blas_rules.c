/* blas_rules.c — where PyTorch keeps cuBLAS's and cuBLASLt's workspaces, by
 * torch version and GPU architecture: the table engine: pytorch plans them
 * from (tk_torch_blas_rules).
 *
 * Read in PyTorch's own source (aten/src/ATen/cuda/CublasHandlePool.cpp and
 * CUDABlas.cpp) and dated by the pull requests each release holds; cited
 * per row below as FILE@COMMIT:LINE or #PR (merge date). What was not read
 * in a release's source is said so. The research notes behind it:
 * DEVELOPERS.md "engine: pytorch on a card".
 *
 *  - 1.10 .. 1.13: getCurrentCUDABlasHandle only sets the stream and the
 *    math mode (no cublasSetWorkspace; CublasHandlePool.cpp of the 1.10 and
 *    1.13 era, l.38-43 / l.46-51 in the forks read): cuBLAS works in its own
 *    default pool, outside the caching allocator, one per (handle, stream),
 *    sized `:4096:2:16:8` (8 MiB + 128 KiB) by cuBLAS's documented default.
 *    1.12 added cuBLASLt for a biased addmm (#72148, #73439): a 1 MiB
 *    workspace taken from the allocator and freed around every call.
 *  - 2.0 (#86645, 2022-10-11; sizes #91564, 2023-01-03): the workspace comes
 *    from the caching allocator at a (handle, stream)'s first GEMM and is
 *    kept: `sm90 ? 4096 * 8 * 1024 : 4096 * 1024 * 2 + 16 * 1024 * 8`
 *    (CublasHandlePool.cpp@26a3905:150, the same expression since #91564),
 *    32 MiB on compute capability 9.0 only. cuBLASLt: 1 MiB per call
 *    (CUDABlas.cpp's bgemm_internal_cublaslt allocates and frees it).
 *  - 2.9 (#156495, 2025-06-27; whether it reached 2.8 was not settled): the
 *    cuBLASLt workspace is kept per (handle, stream), 1 MiB
 *    (CublasHandlePool.cpp@26a3905:186 `workspace_size = 1024` KiB, l.296-322
 *    its cache), separate from cuBLAS's (l.283: shared only when
 *    TORCH_CUBLASLT_UNIFIED_WORKSPACE is set). The H200's snapshots (torch
 *    2.11) show exactly this: a 32 MiB block and a 1 MiB block in the first
 *    forward Linear, a second 32 MiB block at the first backward GEMM (the
 *    autograd thread's own handle), none of them freed.
 *  - 2.12 (#175344, 2026-02-19: 32 MiB for major 10 and 12 too; #175879,
 *    2026-03-02: cuBLASLt shares the cuBLAS workspace):
 *    CublasHandlePool.cpp@f414718 (cyyever/pytorch):181 `use32mb = major ==
 *    9 || 10 || 12`, l.347-349 the shared buffer: no cuBLASLt block.
 *  - 2.14 (#189312, 2026-07-09): major 11 gets 32 MiB too.
 *  - 2.15 (#194311, 2026-08-21; torch 2.15's torch.cuda.current_blas_handle
 *    docs): ATen binds a workspace from the allocator for each GEMM and
 *    frees it when the call returns, unless TORCH_CUBLAS_WORKSPACE_CACHE=1;
 *    CublasHandlePool.cpp (2.15 era):185-188 `use32mb` for majors 9-12, and
 *    cuBLASLt's workspace is still kept per handle ("cache-owned even when
 *    ATen workspace caching is disabled", its header). Not seen on a card.
 *
 * One workspace per (handle, stream), and handles are per thread: a training
 * step has the forward's thread and autograd's device thread (backward, and
 * checkpointed layers' recomputation), so two.
 */
#include "tk_torchplan.h"

#define MIB ((size_t)1 << 20)
#define W_SMALL ((size_t)4096 * 1024 * 2 + (size_t)16 * 1024 * 8) /* :4096:2:16:8, 8519680 B */
#define W_32MIB ((size_t)4096 * 8 * 1024)                           /* 33554432 B */

void tk_torch_blas_rules(tk_torch_version v, int cc_major, int cc_minor, tk_torch_blas *out) {
    int minor = tk_torch_minor(v);
    *out = (tk_torch_blas){0};
    out->lt_bytes = MIB;
    if (minor < 0) {
        out->where = TK_BLAS_W_OUTSIDE;
        out->w_bytes = W_SMALL;
        out->lt = v == TK_TORCH_1_13 ? TK_BLAS_LT_PER_CALL : TK_BLAS_LT_NONE;
        out->source = v == TK_TORCH_1_13
                          ? "torch 1.13: cuBLAS's own pool (no cublasSetWorkspace in CublasHandlePool.cpp), cuBLASLt "
                            "1 MiB per biased addmm (#73439)"
                          : "torch 1.10: cuBLAS's own pool (no cublasSetWorkspace in CublasHandlePool.cpp), no "
                            "cuBLASLt in addmm (it came in 1.12, #72148)";
        return;
    }
    int big = minor >= 14 ? cc_major >= 9 && cc_major <= 12
            : minor >= 12 ? cc_major == 9 || cc_major == 10 || cc_major == 12
                          : cc_major == 9 && cc_minor == 0;
    out->w_bytes = big ? W_32MIB : W_SMALL;
    out->where = minor >= 15 ? TK_BLAS_W_PER_OP : TK_BLAS_W_KEPT;
    out->lt = minor >= 15 ? TK_BLAS_LT_KEPT : minor >= 12 ? TK_BLAS_LT_SHARED : minor >= 9 ? TK_BLAS_LT_KEPT
                                                                                            : TK_BLAS_LT_PER_CALL;
    out->source = minor >= 15 ? "torch 2.15: a workspace per GEMM from the caching allocator (#194311), "
                                "cuBLASLt's 1 MiB kept per handle; read in the source, not seen on a card"
                : minor >= 14 ? "torch 2.14: kept per handle and stream, 32 MiB on majors 9-12 (#189312), "
                                "cuBLASLt in it (#175879)"
                : minor >= 12 ? "torch 2.12: kept per handle and stream, 32 MiB on majors 9, 10, 12 "
                                "(CublasHandlePool.cpp:181), cuBLASLt in it (l.347-349)"
                : minor >= 9  ? "torch 2.9-2.11: kept per handle and stream, 32 MiB on sm90 "
                                "(CublasHandlePool.cpp@26a3905:150), cuBLASLt's own 1 MiB kept (l.296-322); "
                                "as the H200's snapshots show"
                              : "torch 2.0-2.8: kept per handle and stream from the first GEMM (#86645), 32 MiB "
                                "on sm90 (#91564), cuBLASLt 1 MiB per call";
}
