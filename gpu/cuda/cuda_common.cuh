/* cuda_common.cuh — what every kernel file of the cuda plugin shares: the
 * launch macro, element access in any float dtype, 128-bit packed loads and
 * stores, warp and block reductions, and the launchers' argument checks.
 *
 * Each op family is one file (gpu/cuda/README.md lists them), holding its
 * kernels and their launchers (tk_cuda_<op>, registered in the backend table
 * by cuda_plugin.c). nvcc compiles each file on its own; the host emulation
 * (tests/gpu_cuda_host/cuda_emu_backend.cpp) includes them all into one
 * translation unit after cuda_emu.h, so kernel and helper names are unique
 * across files and everything here is inline or a template.
 *
 * Two kernels per op where speed asked for one: the reference (one element
 * or one row per thread, any dtype mix; what the emulation has always
 * tested against the cpu backend) and the fast one (128-bit loads, warp
 * reductions, one pass). A launcher runs the fast kernel when its shape and
 * alignment allow and the context does not ask for the references
 * (tk_cuda_set_reference, tk_cuda.h); gpu_ops compares the two on the card.
 */
#ifndef TK_CUDA_COMMON_CUH
#define TK_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_internal.h"
#include "cuda_shared.h"

/* Every launch goes through TK_LAUNCH(kernel, grid, block[, smem])(args):
 * nvcc's <<<>>> here; tests/gpu_cuda_host/cuda_emu.h defines it to run the
 * same kernels on host threads, so `make test` runs these files without a GPU. */
#ifndef TK_LAUNCH
#define TK_LAUNCH(k, ...) k<<<__VA_ARGS__>>>
#endif

#define THREADS 256
#define WARP 32

/* Unroll the next loop (nvcc); the host emulation's compiler decides itself. */
#ifdef __CUDACC__
#define TK_UNROLL _Pragma("unroll")
#else
#define TK_UNROLL
#endif

/* TK_CU_LAUNCHED (cuda_internal.h) returns on a failed launch; a launcher
 * with something to release first asks LAUNCH_STATUS(what) instead. */
#ifdef TK_CUDA_EMU
#define LAUNCH_STATUS(what) TK_OK
#else
static inline tk_status launch_status(const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return TK_OK;
    fprintf(stderr, "txkernel cuda: launching %s failed: %s\n", what, cudaGetErrorString(e));
    return TK_EDEVICE;
}
#define LAUNCH_STATUS(what) launch_status(what)
#endif

/* ---- element access by runtime dtype (the reference kernels) -------------- */

__device__ __forceinline__ float ld(const void *p, int dt, int64_t i) {
    switch (dt) {
    case TK_F16: return __half2float(((const __half *)p)[i]);
    case TK_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

__device__ __forceinline__ void st(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case TK_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case TK_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* v rounded to dtype dt and back, as a store and a load would leave it. */
__device__ __forceinline__ float round_to(int dt, float v) {
    switch (dt) {
    case TK_F16: return __half2float(__float2half_rn(v));
    case TK_BF16: return __bfloat162float(__float2bfloat16_rn(v));
    default: return v;
    }
}

/* ---- element access by type (the fast kernels) ---------------------------- */

__device__ __forceinline__ float tof(float x) { return x; }
__device__ __forceinline__ float tof(__half x) { return __half2float(x); }
__device__ __forceinline__ float tof(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T fromf(float v);
template <> __device__ __forceinline__ float fromf<float>(float v) { return v; }
template <> __device__ __forceinline__ __half fromf<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 fromf<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/* x rounded to T and back: what storing it in a T tensor and reading it
 * again gives (a fused kernel rounds where the separate ops would). */
template <typename T> __device__ __forceinline__ float stored(float x) { return tof(fromf<T>(x)); }

/* 16 bytes of T: 4 floats or 8 halves, moved by one 128-bit load or store.
 * Callers check alignment first (aligned16) and keep element counts a
 * multiple of pack<T>::n. */
template <typename T> struct alignas(16) pack {
    static constexpr int n = 16 / (int)sizeof(T);
    T x[n];
};

template <typename T> __device__ __forceinline__ pack<T> ld128(const T *p) {
    int4 bits = *reinterpret_cast<const int4 *>(p);
    pack<T> r;
    memcpy(&r, &bits, 16);
    return r;
}

template <typename T> __device__ __forceinline__ void st128(T *p, const pack<T> &v) {
    int4 bits;
    memcpy(&bits, &v, 16);
    *reinterpret_cast<int4 *>(p) = bits;
}

static __host__ __device__ inline int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Eight consecutive elements as f32: two packs of float or one of 16-bit.
 * The fast kernels move data eight elements per thread whatever the dtype,
 * so tensors of different dtypes line up element for element. */
template <typename T> __device__ __forceinline__ void ld8(const T *p, float *f) {
    if constexpr (sizeof(T) == 4) {
        pack<T> a = ld128(p), b = ld128(p + 4);
        for (int i = 0; i < 4; i++) {
            f[i] = tof(a.x[i]);
            f[4 + i] = tof(b.x[i]);
        }
    } else {
        pack<T> a = ld128(p);
        for (int i = 0; i < 8; i++) f[i] = tof(a.x[i]);
    }
}

template <typename T> __device__ __forceinline__ void st8(T *p, const float *f) {
    if constexpr (sizeof(T) == 4) {
        pack<T> a, b;
        for (int i = 0; i < 4; i++) {
            a.x[i] = fromf<T>(f[i]);
            b.x[i] = fromf<T>(f[4 + i]);
        }
        st128(p, a);
        st128(p + 4, b);
    } else {
        pack<T> a;
        for (int i = 0; i < 8; i++) a.x[i] = fromf<T>(f[i]);
        st128(p, a);
    }
}

/* A launcher may take the eight-element kernels when every tensor is
 * 16-byte aligned and n is a multiple of 8. */
static inline int fast8(int64_t n, const void *a, const void *b, const void *c) {
    return n % 8 == 0 && aligned16(a) && (!b || aligned16(b)) && (!c || aligned16(c));
}

/* A table of up to TK_TABLE_MAX tensors handed to one launch as a kernel
 * parameter (CUDA 12.1+ takes up to 32 KiB of them): __grid_constant__ on
 * the device; by reference in the emulation, whose fibers have small stacks. */
#define TK_TABLE_MAX 256
#ifdef TK_CUDA_EMU
#define TK_TABLE_PARAM(type, name) const type &name
#else
#define TK_TABLE_PARAM(type, name) const __grid_constant__ type name
#endif

/* The entry i whose [first[i], first[i+1]) holds b (first[0] = 0, n entries). */
__device__ __forceinline__ int table_find(const int64_t *first, int n, int64_t b) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (first[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Runs `body` with T the C++ type of float dtype dt (f32, f16 or bf16). */
#define TK_FLOAT_TYPE(dt, T, ...)                                     \
    do {                                                              \
        switch (dt) {                                                 \
        case TK_F16: { typedef __half T; __VA_ARGS__; } break;        \
        case TK_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; } break; \
        default: { typedef float T; __VA_ARGS__; } break;             \
        }                                                             \
    } while (0)

/* ---- reductions ------------------------------------------------------------- */

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of THREADS threads, result in every thread. sh holds
 * THREADS/32 values. */
template <typename T> __device__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T t = (threadIdx.x < THREADS / 32) ? sh[threadIdx.x] : (T)0;
    if (w == 0) t = warp_sum(t);
    if (threadIdx.x == 0) sh[0] = t;
    __syncthreads();
    return sh[0];
}

__device__ __forceinline__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = (threadIdx.x < THREADS / 32) ? sh[threadIdx.x] : -INFINITY;
    if (w == 0) t = warp_max(t);
    if (threadIdx.x == 0) sh[0] = t;
    __syncthreads();
    return sh[0];
}

/* Column sums (bias and LayerNorm weight gradients, the references): blocks
 * of COL_W columns x COL_H row lanes. Lane y sums rows y, y + COL_H, ... of
 * its column in order; lane 0 then adds the COL_H partials in lane order.
 * Fixed order for a given N, so a run repeats bit for bit. */
#define COL_W 32
#define COL_H 8

/* ---- launch shapes ------------------------------------------------------------ */

static inline unsigned grid_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    if (b > 65535 * 8) b = 65535 * 8;
    return (unsigned)(b < 1 ? 1 : b);
}

#define GRID_STRIDE(i, n) for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
                               i += (int64_t)gridDim.x * blockDim.x)

/* ---- the launchers' side ------------------------------------------------------ */

#define CTX ((tk_cuda_ctx *)ctx)
#define DT(t) ((int)(t)->dtype)
/* The fast kernels unless the context asks for the references. */
#define FAST() (!CTX->reference)

static inline int64_t numel_of(const tk_tensor *t) {
    if (t->ndim < 1) return -1; /* unknown: the row range is then not checked */
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Elements of a tensor (0 for one never shaped). The plugin links nothing
 * from libtk, so not tk_tensor_numel. */
static inline int64_t tensor_numel(const tk_tensor *t) {
    int64_t n = numel_of(t);
    return n < 0 ? 0 : n;
}

/* Rows of C elements the tensor holds, or -1 when its shape says nothing. */
static inline int64_t rows_of(const tk_tensor *t, int64_t C) {
    int64_t n = numel_of(t);
    return (n < 0 || C <= 0) ? -1 : n / C;
}

static inline int is_float(tk_dtype dt) { return dt == TK_F32 || dt == TK_F16 || dt == TK_BF16; }

static inline tk_status bad(const char *op, const char *what) {
    fprintf(stderr, "txkernel cuda: %s: %s\n", op, what);
    return TK_EINVAL;
}

#define NEED_FLOAT(op, t) do { if (!is_float((t)->dtype)) return bad(op, #t " must be f32, f16 or bf16"); } while (0)
#define NEED_I32(op, t) do { if ((t)->dtype != TK_I32) return bad(op, #t " must be i32"); } while (0)

/* The fast kernels take one dtype for all their float tensors (casts
 * excepted): the mixes the model never asks for stay with the references
 * and cost no compile time. */
static inline int same3(const tk_tensor *a, const tk_tensor *b, const tk_tensor *c) {
    return a->dtype == b->dtype && b->dtype == c->dtype;
}

/* Elements per 128-bit pack of dtype dt. */
static inline int64_t pack_n(tk_dtype dt) { return dt == TK_F32 ? 4 : 8; }

#endif
