/* cuda_emu.h — just enough of CUDA's execution model, on the host, to run
 * gpu/cuda's kernels and launchers without a GPU.
 *
 * Include it (C++) before the kernel files (cuda_emu_backend.cpp). A launch runs its blocks one after
 * another. A block's threads are fibers on the calling thread, each with
 * its own stack (switched by twelve instructions on x86-64, by ucontext
 * elsewhere, which costs a system call per switch), and a scheduler resumes
 * every runnable fiber in turn until it finishes or waits:
 *  - __syncthreads(): the fiber waits; when every thread of the block waits,
 *    all run on. A block where some threads finished while others wait, or
 *    where one warp waits at a barrier and another at a shuffle, can never
 *    go on: the emulator says so and aborts (on a GPU that is a hang or
 *    undefined behaviour).
 *  - __shfl_xor_sync over a full warp (32 consecutive linear thread ids):
 *    the lane posts its value and waits; when all 32 lanes wait, each gets
 *    its partner's value and runs on.
 *  - threadIdx / blockIdx (set before each fiber is resumed), blockDim /
 *    gridDim (per launch);
 *  - __shared__: function-scope statics, which is per-block storage because
 *    one block runs at a time;
 *  - dynamic shared memory (the launch's fourth argument): one host buffer
 *    per launch, tk_emu_dyn_smem, filled with NaN before every block, so a
 *    block that reads a word no thread of its own wrote shows NaN;
 *  - atomicOr on a 32-bit word.
 * Fibers run in ascending thread order in even blocks and descending in odd
 * ones: a thread that reads what another wrote without a barrier between
 * sees different values in the two, and the comparison with the cpu
 * backend fails. Under ASan the stack switches are announced to it
 * (__sanitizer_{start,finish}_switch_fiber).
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
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "cuda/cuda_internal.h"

#if defined(__x86_64__)
/* tk_emu_switch(&save, to): saves the callee-saved registers on the current
 * stack and its pointer in *save, then resumes the stack `to` (saved the
 * same way, or laid out by tk_emu_ctx_new). */
extern "C" void tk_emu_switch(void **save, void *to);
__asm__(".text\n"
        ".p2align 4\n"
        "tk_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n");
typedef void *tk_emu_ctx;
#define TK_EMU_SWITCH(from, to) tk_emu_switch((from), *(to))
#else
#include <ucontext.h>
typedef ucontext_t tk_emu_ctx;
#define TK_EMU_SWITCH(from, to) swapcontext((from), (to))
#endif

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/common_interface_defs.h>
#define TK_EMU_ASAN 1
#endif

#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)

static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static float *tk_emu_dyn_smem;   /* the launch's dynamic shared memory */
static size_t tk_emu_dyn_bytes;

#define TK_EMU_MAX_THREADS 1024
/* Each fiber's stack, the lowest page of it a guard (a kernel that overflows
 * faults there instead of writing into its neighbour's). Kept small because
 * ASan clears a stack's shadow on every switch into it. */
#define TK_EMU_STACK ((size_t)32 << 10)
#define TK_EMU_GUARD ((size_t)4 << 10)

enum { TK_EMU_RUN, TK_EMU_BAR, TK_EMU_SHFL, TK_EMU_DONE };

struct tk_emu_fiber {
    tk_emu_ctx uc;
    int state;      /* TK_EMU_* */
    int lane_mask;  /* a waiting shuffle's xor mask */
    uint64_t post;  /* the value it offers */
    uint64_t got;   /* its partner's, once the warp met */
};

struct tk_emu_state {
    tk_emu_ctx sched;
    tk_emu_fiber f[TK_EMU_MAX_THREADS];
    char *stacks;                /* TK_EMU_MAX_THREADS stacks, mapped on first use */
    int cur;                     /* the fiber running now */
    void (*invoke)(void *);      /* runs the launch's body ... */
    void *body;                  /* ... on this closure */
    const void *sched_bottom;    /* the scheduler's stack, for ASan */
    size_t sched_size;
};
static tk_emu_state tk_emu;

/* Fiber side: hand control back to the scheduler with a new state. */
static inline void tk_emu_yield(int state) {
    tk_emu_fiber *f = &tk_emu.f[tk_emu.cur];
    f->state = state;
#ifdef TK_EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(state == TK_EMU_DONE ? NULL : &fake, tk_emu.sched_bottom, tk_emu.sched_size);
#endif
    TK_EMU_SWITCH(&f->uc, &tk_emu.sched);
#ifdef TK_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, &tk_emu.sched_bottom, &tk_emu.sched_size);
#endif
}

static void tk_emu_fiber_main() {
#ifdef TK_EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &tk_emu.sched_bottom, &tk_emu.sched_size);
#endif
    tk_emu.invoke(tk_emu.body);
    tk_emu_yield(TK_EMU_DONE); /* never resumed */
    abort();
}

/* Scheduler side: run fiber i until it waits or finishes. */
static inline void tk_emu_resume(int i) {
    tk_emu.cur = i;
    threadIdx.x = (unsigned)i % blockDim.x;
    threadIdx.y = (unsigned)i / blockDim.x % blockDim.y;
    threadIdx.z = (unsigned)i / (blockDim.x * blockDim.y);
#ifdef TK_EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, tk_emu.stacks + (size_t)i * TK_EMU_STACK + TK_EMU_GUARD,
                                   TK_EMU_STACK - TK_EMU_GUARD);
#endif
    TK_EMU_SWITCH(&tk_emu.sched, &tk_emu.f[i].uc);
#ifdef TK_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

static inline int tk_emu_tid() {
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

static inline void __syncthreads() { tk_emu_yield(TK_EMU_BAR); }

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a value wider than 64 bits");
    (void)mask;
    tk_emu_fiber *f = &tk_emu.f[tk_emu_tid()];
    f->lane_mask = lane_mask;
    memcpy(&f->post, &v, sizeof v);
    tk_emu_yield(TK_EMU_SHFL);
    T r;
    memcpy(&r, &f->got, sizeof r);
    return r;
}

static inline unsigned atomicOr(unsigned *p, unsigned v) { unsigned o = *p; *p = o | v; return o; }

[[noreturn]] static void tk_emu_stuck(int n, const char *why) {
    int st[4] = { 0, 0, 0, 0 };
    for (int i = 0; i < n; i++) st[tk_emu.f[i].state]++;
    fprintf(stderr, "cuda_emu: block (%u,%u,%u) of %d threads cannot go on: %s "
            "(%d at a barrier, %d at a shuffle, %d finished)\n", blockIdx.x, blockIdx.y, blockIdx.z, n, why,
            st[TK_EMU_BAR], st[TK_EMU_SHFL], st[TK_EMU_DONE]);
    abort();
}

/* A fresh fiber for thread i, to start in tk_emu_fiber_main. */
__attribute__((noinline)) static void tk_emu_fiber_new(int i) {
    tk_emu_fiber *f = &tk_emu.f[i];
    char *lo = tk_emu.stacks + (size_t)i * TK_EMU_STACK + TK_EMU_GUARD;
#if defined(__x86_64__)
    /* From the top: a zero return address for the entry function (it never
     * returns; the entry then sees the stack as after a call, 8 mod 16), the
     * entry's address for tk_emu_switch's ret, six zero registers. */
    void **sp = (void **)(tk_emu.stacks + (size_t)(i + 1) * TK_EMU_STACK);
    *--sp = NULL;
    *--sp = (void *)tk_emu_fiber_main;
    for (int r = 0; r < 6; r++) *--sp = NULL;
    f->uc = sp;
    (void)lo;
#else
    /* out of line: getcontext returns twice, as setjmp does */
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = lo;
    f->uc.uc_stack.ss_size = TK_EMU_STACK - TK_EMU_GUARD;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, tk_emu_fiber_main, 0);
#endif
    f->state = TK_EMU_RUN;
}

/* One block: every thread to the end, releasing barriers and shuffles. */
static void tk_emu_block(int n, int descending) {
    for (int i = 0; i < n; i++) tk_emu_fiber_new(i);
    for (;;) {
        for (int k = 0; k < n; k++) {
            int i = descending ? n - 1 - k : k;
            if (tk_emu.f[i].state == TK_EMU_RUN) tk_emu_resume(i);
        }
        int bar = 0, done = 0, moved = 0;
        for (int i = 0; i < n; i++) {
            bar += tk_emu.f[i].state == TK_EMU_BAR;
            done += tk_emu.f[i].state == TK_EMU_DONE;
        }
        if (done == n) return;
        if (bar == n) {
            for (int i = 0; i < n; i++) tk_emu.f[i].state = TK_EMU_RUN;
            continue;
        }
        for (int w = 0; w < n; w += 32) {
            int all = 1;
            for (int l = 0; l < 32; l++) all &= tk_emu.f[w + l].state == TK_EMU_SHFL;
            if (!all) continue;
            for (int l = 0; l < 32; l++) {
                tk_emu_fiber *f = &tk_emu.f[w + l];
                f->got = tk_emu.f[w + (l ^ (f->lane_mask & 31))].post;
            }
            for (int l = 0; l < 32; l++) tk_emu.f[w + l].state = TK_EMU_RUN;
            moved = 1;
        }
        if (!moved)
            tk_emu_stuck(n, done ? "some threads finished while others wait"
                                 : "threads wait at different barriers or shuffles");
    }
}

template <typename F> static void tk_emu_run(dim3 grid, dim3 block, size_t smem, F body) {
    int n = (int)(block.x * block.y * block.z);
    if (n <= 0 || n > TK_EMU_MAX_THREADS || n % 32) {
        fprintf(stderr, "cuda_emu: a block of %d threads (1..1024, whole warps expected)\n", n);
        abort();
    }
    if (smem > 48 * 1024) { /* above this a kernel must opt in (cudaFuncSetAttribute); ours do not */
        fprintf(stderr, "cuda_emu: %zu bytes of dynamic shared memory (48 KiB at most)\n", smem);
        abort();
    }
    if (!tk_emu.stacks) {
        void *p = mmap(NULL, TK_EMU_MAX_THREADS * TK_EMU_STACK, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            fprintf(stderr, "cuda_emu: cannot map fiber stacks\n");
            abort();
        }
        tk_emu.stacks = (char *)p;
        for (int i = 0; i < TK_EMU_MAX_THREADS; i++) mprotect(tk_emu.stacks + (size_t)i * TK_EMU_STACK, TK_EMU_GUARD, PROT_NONE);
    }
    tk_emu_dyn_bytes = smem;
    tk_emu_dyn_smem = smem ? (float *)malloc(smem) : NULL;
    if (smem && !tk_emu_dyn_smem) {
        fprintf(stderr, "cuda_emu: out of host memory for shared memory\n");
        abort();
    }
    gridDim = grid;
    blockDim = block;
    tk_emu.invoke = [](void *b) { (*(F *)b)(); };
    tk_emu.body = &body;
    unsigned long nb = 0;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++, nb++) {
                blockIdx.x = x; blockIdx.y = y; blockIdx.z = z;
                for (size_t i = 0; i < smem / sizeof(float); i++) tk_emu_dyn_smem[i] = NAN;
                tk_emu_block(n, (int)(nb & 1));
            }
    free(tk_emu_dyn_smem);
    tk_emu_dyn_smem = NULL;
    tk_emu_dyn_bytes = 0;
}

/* TK_LAUNCH(kernel, grid, block[, smem])(args...): kernel(args...) on every
 * thread of every block, with smem bytes of dynamic shared memory. */
template <typename K> struct tk_emu_launcher {
    K kernel;
    dim3 grid, block;
    size_t smem;
    template <typename... A> void operator()(A... args) {
        tk_emu_run(grid, block, smem, [&]() { kernel(args...); });
    }
};
template <typename K> static tk_emu_launcher<K> tk_emu_launch(K k, dim3 grid, dim3 block, size_t smem = 0) {
    return tk_emu_launcher<K>{ k, grid, block, smem };
}
#define TK_LAUNCH(k, grid, ...) tk_emu_launch(k, grid, __VA_ARGS__)

/* No CUDA runtime here: a launch cannot fail to start. */
#undef TK_CU_LAUNCHED
#define TK_CU_LAUNCHED(what) do { } while (0)

#endif
