/* cuda_plugin.c — the cuda backend's entry point and memory functions (its
 * GEMM is matmul.cu's, its kernels the other .cu files: README.md there).
 *
 * tk_cuda_plugin_open picks the device, starts CUPTI (before the context
 * exists, so every allocation is recorded; its memory records only, unless
 * TXK_CUPTI=kernels asks for kernel records and owner scopes too, whose
 * tracing costs each launch host time; TXK_CUPTI=0 leaves it off, to time a
 * run without any tracing), creates the context and
 * the cuBLAS handle, and returns the backend table. The device then takes
 * the plugin's buffers (the GEMM workspace, the kernels' scratch) from its
 * caching allocator and binds them (tk_cuda_bind_buffers): the plugin itself
 * allocates nothing outside the allocator.
 *
 * cuBLAS works only in the workspace it is given. What the H200 showed
 * (tests/data/gpu_h200/first_contact/cublas_outside_allocator.txt): with a 32 MiB workspace
 * set, cuBLAS still held 64 MiB + 128 KiB of its own, and
 * CUBLAS_WORKSPACE_CONFIG=:0:0 removed exactly that. The variable sizes
 * cuBLAS's default workspace pool, and the figure is two 32 MiB buffers and
 * eight of 16 KiB: the shape of the documented default before Hopper
 * (`:4096:2:16:8`) with Hopper's 32 MiB buffers. So the handle kept a default
 * pool although cublasSetWorkspace pointed it at ours: the pool is taken
 * when a handle is bound to a stream (cublasCreate binds the legacy default
 * stream; cublasSetStream, which the plugin called next, "resets the
 * workspace to the default pool" in cuBLAS's documentation), and pointing the
 * handle elsewhere does not give it back. Hence: no cublasSetStream (a new
 * handle is on the legacy default stream already), and the handle is created
 * with the default pool sized zero (CUBLAS_WORKSPACE_CONFIG=:0:0 for that
 * call only, unless the user set the variable; unset again at once, so
 * PyTorch in the same process reads what the user set). Which of the two
 * calls took the pool was not seen on the card: tests/gpu_cuda/gpu_alloc.c
 * prints CUPTI's live bytes by library after each step of opening.
 *
 * Guarantees:
 *  - seg_alloc is cudaMalloc; a device out of memory returns nonzero with the
 *    CUDA error cleared, so the caching allocator can release its cache and
 *    retry, and the process goes on.
 *  - Every CUDA/cuBLAS call is checked and turns into TK_EDEVICE with file,
 *    line and the library's message; nothing here exits.
 *  - All work goes to the legacy default stream, so the synchronous
 *    cudaMemcpy in read/write is ordered after every queued op.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include "cuda_dynload.h"
#include "cuda_internal.h"
#include "cuda_shared.h"

const char *tk_cublas_status_str(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "cuBLAS not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "cuBLAS could not allocate (device out of memory)";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value (a size, stride or leading dimension)";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "not supported on this GPU architecture";
    case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "kernel execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported (dtype combination or layout)";
    case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
    }
    return "unknown cuBLAS status";
}

/* ---- memory ------------------------------------------------------------ */

static int cu_seg_alloc(void *vctx, size_t bytes, void **ptr) {
    tk_cuda_ctx *c = vctx;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        /* cudaMalloc's errors are not sticky, but the last-error slot keeps
         * them until read: clear it so the next launch check is not fooled. */
        cudaGetLastError();
        snprintf(c->last_error, sizeof c->last_error, "cudaMalloc(%zu) failed: %s", bytes,
                 cudaGetErrorString(e));
        *ptr = NULL;
        return e == cudaErrorMemoryAllocation ? 1 : 2;
    }
    pthread_mutex_lock(&c->lock);
    c->seg_live += bytes;
    if (c->seg_live > c->seg_peak) c->seg_peak = c->seg_live;
    pthread_mutex_unlock(&c->lock);
    *ptr = p;
    return 0;
}

static void cu_seg_free(void *vctx, void *ptr, size_t bytes) {
    tk_cuda_ctx *c = vctx;
    if (!ptr) return;
    /* cudaFree synchronises the device first, so no queued kernel still
     * reads the segment. A failure here (context already broken) leaves
     * nothing to recover: note it and go on. */
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(c->last_error, sizeof c->last_error, "cudaFree failed: %s", cudaGetErrorString(e));
    }
    pthread_mutex_lock(&c->lock);
    c->seg_live -= bytes;
    pthread_mutex_unlock(&c->lock);
}

static tk_status cu_write(void *vctx, void *dst, const void *src, size_t bytes, tk_err *err) {
    (void)vctx;
    if (!bytes) return TK_OK;
    TK_CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), err);
    return TK_OK;
}

static tk_status cu_read(void *vctx, void *dst, const void *src, size_t bytes, tk_err *err) {
    (void)vctx;
    if (!bytes) return TK_OK;
    TK_CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), err);
    return TK_OK;
}

static tk_status cu_sync(void *vctx, tk_err *err) {
    tk_cuda_ctx *c = vctx;
    unsigned flags = 0;
    TK_CU(cudaDeviceSynchronize(), err);
    TK_CU(cudaMemcpy(&flags, c->flags, sizeof flags, cudaMemcpyDeviceToHost), err);
    if (flags) {
        TK_CU(cudaMemset(c->flags, 0, sizeof(unsigned)), err);
        if (flags & TK_CUDA_FLAG_BAD_INDEX)
            return tk_cuda_fail(err, TK_EINVAL,
                                "an op read an index outside its table (token id >= vocab size, "
                                "label >= number of classes, or a row index past the end); "
                                "the affected rows were left at zero");
    }
    return TK_OK;
}

static void fmt_version(char *buf, size_t n, int v) {
    snprintf(buf, n, "%d.%d", v / 1000, (v % 1000) / 10);
}

static void cu_info(void *vctx, tk_dev_info *out) {
    tk_cuda_ctx *c = vctx;
    struct cudaDeviceProp prop;
    size_t free_b = 0, total_b = 0;
    int drv = 0, rt = 0;
    memset(out, 0, sizeof *out);
    out->kind = TK_DEV_CUDA;
    if (cudaGetDeviceProperties(&prop, c->device) == cudaSuccess) {
        snprintf(out->name, sizeof out->name, "%.*s", (int)sizeof out->name - 1, prop.name);
        out->cc_major = prop.major;
        out->cc_minor = prop.minor;
    } else {
        cudaGetLastError();
        snprintf(out->name, sizeof out->name, "cuda:%d", c->device);
    }
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        out->total = total_b;
        out->free_bytes = free_b;
    } else {
        cudaGetLastError();
    }
    if (cudaDriverGetVersion(&drv) == cudaSuccess) fmt_version(out->driver, sizeof out->driver, drv);
    else cudaGetLastError();
    if (cudaRuntimeGetVersion(&rt) == cudaSuccess) fmt_version(out->runtime, sizeof out->runtime, rt);
    else cudaGetLastError();
}

static void cu_destroy(void *vctx) {
    tk_cuda_ctx *c = vctx;
    if (!c) return;
    cudaDeviceSynchronize();
    tk_cuda_lt_stats_close(c);
    tk_cuda_matmul_release(c);
    if (c->blas) cublasDestroy(c->blas);
    cudaGetLastError();
    if (c->cupti_on) tk_cupti_release();
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* ---- the table ------------------------------------------------------------ */

#define CUDA_DEVICE(op) .op = cu_##op,
#define CUDA_KERNEL(op) .op = tk_cuda_##op,
TK_BACKEND_TABLE(cuda_backend, "cuda", CUDA_DEVICE, CUDA_KERNEL, tk_cuda_attention_fwd, tk_cuda_attention_bwd);
#undef CUDA_DEVICE
#undef CUDA_KERNEL

/* cublasCreate with cuBLAS's default workspace pool sized zero, unless the
 * user sized it (see the header): the handle never works in that pool. */
static cublasStatus_t create_handle(cublasHandle_t *h) {
    static const char var[] = "CUBLAS_WORKSPACE_CONFIG";
    if (getenv(var)) return cublasCreate(h);
    setenv(var, ":0:0", 1);
    cublasStatus_t s = cublasCreate(h);
    unsetenv(var);
    return s;
}

/* Everything after the context exists; on failure the caller destroys c. */
static tk_status open_device(tk_cuda_ctx *c, tk_err *err) {
    TK_CU(cudaSetDevice(c->device), err);
    /* cudaFree(0) creates the primary context now, so a broken driver shows
     * up here with its own message rather than inside the first op. */
    TK_CU(cudaFree(0), err);
    TK_CU(cudaDeviceGetAttribute(&c->cc_major, cudaDevAttrComputeCapabilityMajor, c->device), err);
    TK_CU(cudaDeviceGetAttribute(&c->cc_minor, cudaDevAttrComputeCapabilityMinor, c->device), err);
    TK_CUBLAS(create_handle(&c->blas), err);
    TK_CUBLAS(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), err);
    c->plugin_bytes = 0;
    return TK_OK;
}

__attribute__((visibility("default")))
tk_status tk_cuda_bind_buffers(void *vctx, void *ws, size_t ws_bytes, void *scratch, size_t scratch_bytes,
                               tk_err *err) {
    tk_cuda_ctx *c = vctx;
    if (!ws || ws_bytes < TK_CUDA_WORKSPACE_BYTES || !scratch || scratch_bytes < TK_CUDA_SCRATCH_BYTES)
        return tk_cuda_fail(err, TK_EINVAL, "tk_cuda_bind_buffers: a workspace of %zu B and scratch of %zu B "
                            "are needed (got %zu and %zu)", (size_t)TK_CUDA_WORKSPACE_BYTES,
                            (size_t)TK_CUDA_SCRATCH_BYTES, ws_bytes, scratch_bytes);
    TK_CUBLAS(cublasSetWorkspace(c->blas, ws, ws_bytes), err);
    c->workspace = ws;
    c->workspace_bytes = ws_bytes;
    c->red = scratch;
    c->flags = (unsigned *)((char *)scratch + TK_CUDA_RED_BLOCKS * sizeof(double));
    TK_CU(cudaMemset(c->flags, 0, sizeof(unsigned)), err);
    return TK_OK;
}

__attribute__((visibility("default")))
tk_status tk_cuda_plugin_open(const tk_dev_opts *opts, const tk_backend **be, void **ctx, tk_err *err) {
    int n = 0;
    cudaError_t e;
    char why[256] = "";
    *be = NULL;
    *ctx = NULL;
    e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return tk_cuda_fail(err, TK_EDEVICE, "no usable CUDA device: %s", cudaGetErrorString(e));
    }
    int dev = opts ? opts->cuda_device : 0;
    if (dev < 0 || dev >= n)
        return tk_cuda_fail(err, TK_EINVAL, "cuda_device %d does not exist (this machine has %d)",
                            dev, n);
    /* cuBLAS is opened here, from CUDA 13 or 12, whichever this runtime has
     * (cuda_dynload.c); a missing one is said in one line naming it */
    char blas_why[1024];
    if (tk_cuda_blas_open(blas_why, sizeof blas_why) != 0)
        return tk_cuda_fail(err, TK_EDEVICE, "%s", blas_why);
    tk_cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return tk_cuda_fail(err, TK_ENOMEM, "out of host memory opening the cuda device");
    c->device = dev;
    pthread_mutex_init(&c->lock, NULL);
    /* CUPTI before the context: allocations made while creating cuBLAS and
     * its workspace are then in the records too. Failure is not fatal. */
    const char *want = getenv("TXK_CUPTI");
    if (want && (strcmp(want, "0") == 0 || strcmp(want, "off") == 0))
        snprintf(why, sizeof why, "turned off by TXK_CUPTI=%s", want);
    else if (tk_cuda_cupti_open(why, sizeof why) == 0)
        c->cupti_on = tk_cupti_acquire(want && strcmp(want, "kernels") == 0, why, sizeof why);
    if (!c->cupti_on) {
        snprintf(c->cupti_why, sizeof c->cupti_why, "%s", why);
        fprintf(stderr, "txkernel cuda: CUPTI tracing off (%s); memory outside the allocator "
                "is then only what the plugin itself allocated\n", why);
    }
    tk_status st = open_device(c, err);
    if (st != TK_OK) {
        cu_destroy(c);
        return st;
    }
    *be = &cuda_backend;
    *ctx = c;
    return TK_OK;
}

__attribute__((visibility("default")))
tk_status tk_cuda_mem_reset_peak(void *vctx, tk_err *err) {
    tk_cuda_ctx *c = vctx;
    TK_CU(cudaDeviceSynchronize(), err);
    if (c->cupti_on) {
        /* records of what already happened must be in before the reset */
        if (tk_cupti_flush() != TK_OK)
            return tk_cuda_fail(err, TK_EDEVICE, "CUPTI could not flush its activity buffers");
        tk_cupti_reset_peak();
    }
    pthread_mutex_lock(&c->lock);
    c->seg_peak = c->seg_live;
    pthread_mutex_unlock(&c->lock);
    return TK_OK;
}

__attribute__((visibility("default")))
tk_status tk_cuda_mem_totals_get(void *vctx, tk_cuda_mem_totals *out, tk_err *err) {
    tk_cuda_ctx *c = vctx;
    memset(out, 0, sizeof *out);
    TK_CU(cudaDeviceSynchronize(), err);
    if (c->cupti_on) {
        tk_status st = tk_cupti_flush();
        if (st != TK_OK) return tk_cuda_fail(err, st, "CUPTI could not flush its activity buffers");
        tk_cupti_fill(out);
    } else {
        snprintf(out->cupti_error, sizeof out->cupti_error, "%s",
                 c->cupti_why[0] ? c->cupti_why : "CUPTI was not enabled at open");
    }
    TK_CU(cudaMemGetInfo(&out->device_free, &out->device_total), err);
    pthread_mutex_lock(&c->lock);
    out->segments_live = c->seg_live;
    out->segments_peak = c->seg_peak;
    pthread_mutex_unlock(&c->lock);
    out->plugin_bytes = c->plugin_bytes;
    out->workspace_bytes = c->workspace_bytes;
    if (out->cupti_active)
        out->outside_allocator = out->device_live >= out->segments_live
                                     ? out->device_live - out->segments_live : 0;
    else
        out->outside_allocator = c->plugin_bytes;
    return TK_OK;
}
