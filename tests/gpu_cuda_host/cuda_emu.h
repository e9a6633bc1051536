/* cuda_emu.h — just enough of CUDA's execution model, on host threads, to
 * run gpu/cuda/cuda_ops.cu's kernels and wrappers without a GPU.
 *
 * Include it (C++) before cuda_ops.cu. A launch runs its blocks one after
 * another; each block on blockDim.x*y*z POSIX threads that stay for the
 * whole launch. What the kernels rely on, emulated:
 *  - threadIdx / blockIdx (per thread), blockDim / gridDim (per launch);
 *  - __shared__: function-scope statics, which is per-block storage because
 *    one block runs at a time (a barrier separates blocks);
 *  - __syncthreads(): a barrier over the block's threads;
 *  - __shfl_xor_sync over a full warp (32 consecutive linear thread ids):
 *    each lane posts its value, the warp meets at a barrier, reads its
 *    partner's, meets again;
 *  - atomicOr on a 32-bit word (a host atomic).
 * Arithmetic is the host's (libm's expf, erff, ...), not the device's, so
 * this checks indexing, barriers, reductions and launch shapes; the GPU
 * suite (make test-gpu) checks the device's rounding.
 */
#ifndef TK_CUDA_EMU_H
#define TK_CUDA_EMU_H

#define TK_CUDA_EMU 1

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda/cuda_internal.h"

#undef __shared__
#define __shared__ static

static thread_local uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

struct tk_emu_state {
    pthread_barrier_t block;     /* every thread of the block */
    pthread_barrier_t warp[32];  /* 32 lanes each (1024 threads at most) */
    uint64_t lanes[1024];        /* shuffle mailboxes, by linear thread id */
};
static tk_emu_state tk_emu;

static inline int tk_emu_tid() {
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

static inline void __syncthreads() { pthread_barrier_wait(&tk_emu.block); }

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a value wider than 64 bits");
    (void)mask;
    int tid = tk_emu_tid(), w = tid / 32, src = (tid & ~31) | ((tid & 31) ^ lane_mask);
    memcpy(&tk_emu.lanes[tid], &v, sizeof v);
    pthread_barrier_wait(&tk_emu.warp[w]);
    T r;
    memcpy(&r, &tk_emu.lanes[src], sizeof r);
    pthread_barrier_wait(&tk_emu.warp[w]); /* nobody overwrites a mailbox still to be read */
    return r;
}

static inline unsigned atomicOr(unsigned *p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }

/* A launch's threads: each runs the body once per block, blocks in order. */
template <typename F> struct tk_emu_launch_ctx {
    F *body;
    int tid;
};

template <typename F> static void *tk_emu_thread(void *arg) {
    tk_emu_launch_ctx<F> *c = (tk_emu_launch_ctx<F> *)arg;
    threadIdx.x = (unsigned)c->tid % blockDim.x;
    threadIdx.y = (unsigned)c->tid / blockDim.x % blockDim.y;
    threadIdx.z = (unsigned)c->tid / (blockDim.x * blockDim.y);
    for (unsigned z = 0; z < gridDim.z; z++)
        for (unsigned y = 0; y < gridDim.y; y++)
            for (unsigned x = 0; x < gridDim.x; x++) {
                blockIdx.x = x; blockIdx.y = y; blockIdx.z = z;
                (*c->body)();
                pthread_barrier_wait(&tk_emu.block); /* the block is done before the next starts */
            }
    return NULL;
}

template <typename F> static void tk_emu_run(dim3 grid, dim3 block, F body) {
    int n = (int)(block.x * block.y * block.z);
    if (n <= 0 || n > 1024 || n % 32) {
        fprintf(stderr, "cuda_emu: a block of %d threads (1..1024, whole warps expected)\n", n);
        abort();
    }
    gridDim = grid;
    blockDim = block;
    pthread_barrier_init(&tk_emu.block, NULL, (unsigned)n);
    for (int w = 0; w < n / 32; w++) pthread_barrier_init(&tk_emu.warp[w], NULL, 32);
    pthread_t th[1024];
    tk_emu_launch_ctx<F> ctx[1024];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, (size_t)1 << 20);
    for (int i = 0; i < n; i++) {
        ctx[i].body = &body;
        ctx[i].tid = i;
        if (pthread_create(&th[i], &attr, tk_emu_thread<F>, &ctx[i]) != 0) {
            fprintf(stderr, "cuda_emu: pthread_create failed\n");
            abort();
        }
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    pthread_attr_destroy(&attr);
    pthread_barrier_destroy(&tk_emu.block);
    for (int w = 0; w < n / 32; w++) pthread_barrier_destroy(&tk_emu.warp[w]);
}

/* TK_LAUNCH(kernel, grid, block[, smem])(args...): kernel(args...) on every
 * thread of every block. Dynamic shared memory is not emulated. */
template <typename K> struct tk_emu_launcher {
    K kernel;
    dim3 grid, block;
    template <typename... A> void operator()(A... args) {
        tk_emu_run(grid, block, [&]() { kernel(args...); });
    }
};
template <typename K> static tk_emu_launcher<K> tk_emu_launch(K k, dim3 grid, dim3 block) {
    return tk_emu_launcher<K>{ k, grid, block };
}
#define TK_LAUNCH(k, grid, block) tk_emu_launch(k, grid, block)

/* No CUDA runtime here: a launch cannot fail to start. */
#undef TK_CU_LAUNCHED
#define TK_CU_LAUNCHED(what) do { } while (0)

#endif
