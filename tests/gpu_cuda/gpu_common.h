/* gpu_common.h — helpers for the GPU-only tests (make test-gpu).
 *
 * Each test opens a cpu device (the reference) and a cuda device through the
 * public API, uploads the same host data to both, runs the same op and
 * compares what comes back. The binaries are built by `make all` (so they
 * cannot rot) but only run by `make test-gpu`, on a machine with a GPU.
 *
 * Tolerances (relative, against max(|ref|, 1e-2 * max|ref| over the tensor),
 * so values that cancel to near zero are judged on the tensor's scale):
 *   f32 results              1e-5
 *   f16 results              2e-3  (one f16 rounding is 2^-11 ~ 4.9e-4; the
 *                                   two sides may round a different fp32 value)
 *   bf16 results             1.6e-2 (one bf16 rounding is 2^-8 ~ 3.9e-3)
 *   GEMM with 16-bit inputs and f32 output: 1e-4 (tensor cores sum in a
 *                                   different order and alignment than BLAS)
 *   f16 values in the subnormal range (< 2^-14, e.g. the probabilities of a
 *   29k-word softmax): a difference of one subnormal step (2^-24) is allowed
 *   f32 row sums followed by a subtraction (layernorm_fwd out and mean,
 *   layernorm_bwd din, softmax_bwd), column sums (bias_grad, layernorm_bwd
 *   dw) and softmax probabilities over a long row (xent_fwd, V = 28996: the
 *   cpu sums the row's exponentials in f32, the kernel in f64):
 *                            1e-4 (a sum over ~1000 terms in another order
 *                                   differs by ~1e-6 of its terms, and the
 *                                   subtraction can leave a result 100x smaller)
 * Every op gets inputs with identical bytes on both sides (no chaining of one
 * op's output into the next), so 16-bit roundings do not compound.
 */
#ifndef TK_GPU_COMMON_H
#define TK_GPU_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "tk_backend_impl.h"
#include "tk_cuda.h"
#include "tk_gpu.h"
#include "tk_test.h"

static tk_dev *g_cpu, *g_gpu;
static int g_cc_major, g_cc_minor; /* the card's, read by gpu_open */

#ifdef TK_CUDA_EMU
/* tests/gpu_cuda_host/cuda_emu_backend.cpp: the plugin's kernels on host threads */
tk_dev *tk_cuda_emu_open(tk_err *err);
#endif

/* Opens both devices; on failure says why (test-gpu runs only where a GPU is,
 * so a missing one is a failure, not a skip). Built with -DTK_CUDA_EMU, the
 * "cuda" device is the emulated one (make test runs gpu_ops that way). */
static inline int gpu_open(void) {
    tk_err err = {0};
    tk_dev_opts oc = { .kind = TK_DEV_CPU };
    g_cpu = tk_dev_new(&oc, &err);
    if (!g_cpu) { fprintf(stderr, "cpu device: %s\n", err.msg); return 0; }
#ifdef TK_CUDA_EMU
    g_gpu = tk_cuda_emu_open(&err);
#else
    tk_dev_opts og = { .kind = TK_DEV_CUDA };
    g_gpu = tk_dev_new(&og, &err);
#endif
    if (!g_gpu) { fprintf(stderr, "cuda device: %s\n", err.msg); return 0; }
    tk_dev_info info;
    tk_dev_info_get(g_gpu, &info);
    g_cc_major = info.cc_major;
    g_cc_minor = info.cc_minor;
    return 1;
}

/* The cuda device's reference kernels (on != 0) or its fast ones
 * (tk_cuda_set_reference); 0 when the plugin lacks the switch. */
static inline int gpu_reference(int on) {
#ifdef TK_CUDA_EMU
    tk_cuda_set_reference(tk_dev_backend_ctx(g_gpu), on);
    return 1;
#else
    tk_cuda_set_reference_fn f = (tk_cuda_set_reference_fn)tk_dev_plugin_sym(g_gpu, "tk_cuda_set_reference");
    if (f) f(tk_dev_backend_ctx(g_gpu), on);
    return f != NULL;
#endif
}

/* The cuda device's cuBLASLt epilogue GEMMs and declines since the last
 * gpu_lt_reset (tk_cuda_lt_declines); report gets the table. 0 when the
 * plugin lacks the counters. */
static inline int gpu_lt_declines(uint64_t *calls, uint64_t *declined, char *report, size_t n) {
#ifdef TK_CUDA_EMU
    tk_cuda_lt_declines(tk_dev_backend_ctx(g_gpu), calls, declined, report, n);
    return 1;
#else
    tk_cuda_lt_declines_fn f = (tk_cuda_lt_declines_fn)tk_dev_plugin_sym(g_gpu, "tk_cuda_lt_declines");
    if (f) f(tk_dev_backend_ctx(g_gpu), calls, declined, report, n);
    return f != NULL;
#endif
}

static inline void gpu_lt_reset(void) {
#ifdef TK_CUDA_EMU
    tk_cuda_lt_reset(tk_dev_backend_ctx(g_gpu));
#else
    tk_cuda_lt_reset_fn f = (tk_cuda_lt_reset_fn)tk_dev_plugin_sym(g_gpu, "tk_cuda_lt_reset");
    if (f) f(tk_dev_backend_ctx(g_gpu));
#endif
}

static inline void gpu_close(void) {
    tk_dev_destroy(&g_gpu);
    tk_dev_destroy(&g_cpu);
}

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static inline float frand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* The same tensor on both devices. */
typedef struct { tk_tensor c, g; int64_t n; tk_dtype dt; } pair;

static inline void pair_free(pair *p) {
    tk_tensor_free(g_cpu, &p->c);
    tk_tensor_free(g_gpu, &p->g);
}

/* Allocates on both; fills with host values from `vals` (f32, converted to
 * the dtype) or, when NULL, uniform in [-scale, scale). */
static inline pair pair_new(tk_dtype dt, int64_t n, const float *vals, float scale) {
    pair p = { .n = n, .dt = dt };
    int64_t shape[1] = { n };
    tk_err err = {0};
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = vals ? vals[i] : scale * frand();
    TK_CHECK_MSG(tk_tensor_alloc(g_cpu, &p.c, dt, 1, shape, TK_CAT_TEMP, "test", &err) == TK_OK, "%s", err.msg);
    TK_CHECK_MSG(tk_tensor_alloc(g_gpu, &p.g, dt, 1, shape, TK_CAT_TEMP, "test", &err) == TK_OK, "%s", err.msg);
    if (dt == TK_F32 || dt == TK_F16 || dt == TK_BF16) {
        TK_CHECK_MSG(tk_tensor_write_f32(g_cpu, &p.c, h, &err) == TK_OK, "%s", err.msg);
        TK_CHECK_MSG(tk_tensor_write_f32(g_gpu, &p.g, h, &err) == TK_OK, "%s", err.msg);
    } else { /* integer codes and masks start at zero */
        memset(h, 0, (size_t)(n ? n : 1) * sizeof(float));
        TK_CHECK_MSG(tk_tensor_write(g_cpu, &p.c, h, &err) == TK_OK, "%s", err.msg);
        TK_CHECK_MSG(tk_tensor_write(g_gpu, &p.g, h, &err) == TK_OK, "%s", err.msg);
    }
    free(h);
    return p;
}

/* An i32 tensor with the given values on both devices. */
static inline pair pair_i32(int64_t n, const int32_t *vals) {
    pair p = { .n = n, .dt = TK_I32 };
    int64_t shape[1] = { n };
    tk_err err = {0};
    TK_CHECK(tk_tensor_alloc(g_cpu, &p.c, TK_I32, 1, shape, TK_CAT_INPUT, "test", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(g_gpu, &p.g, TK_I32, 1, shape, TK_CAT_INPUT, "test", &err) == TK_OK);
    TK_CHECK(tk_tensor_write(g_cpu, &p.c, vals, &err) == TK_OK);
    TK_CHECK(tk_tensor_write(g_gpu, &p.g, vals, &err) == TK_OK);
    return p;
}

static inline double tol_for(tk_dtype dt) {
    return dt == TK_F16 ? 2e-3 : dt == TK_BF16 ? 1.6e-2 : 1e-5;
}

/* Compares the cuda copy with the cpu copy; returns the worst relative error. */
static inline double pair_cmp(const pair *p, double tol, const char *what) {
    tk_err err = {0};
    float *a = malloc((size_t)(p->n ? p->n : 1) * sizeof(float));
    float *b = malloc((size_t)(p->n ? p->n : 1) * sizeof(float));
    TK_CHECK_MSG(tk_dev_sync(g_gpu, &err) == TK_OK, "%s: sync: %s", what, err.msg);
    TK_CHECK_MSG(tk_tensor_read_f32(g_cpu, &p->c, a, &err) == TK_OK, "%s", err.msg);
    TK_CHECK_MSG(tk_tensor_read_f32(g_gpu, &p->g, b, &err) == TK_OK, "%s", err.msg);
    double mx = 0.0, worst = 0.0;
    int64_t at = -1;
    for (int64_t i = 0; i < p->n; i++) mx = fmax(mx, fabs(a[i]));
    double floor_ = 1e-2 * mx > 1e-30 ? 1e-2 * mx : 1e-30;
    for (int64_t i = 0; i < p->n; i++) {
        double d = fabs((double)a[i] - b[i]);
        /* f16 below 2^-14 is subnormal: its step is 2^-24 whatever the value,
         * so one rounding apart there is 2^-24, not a fraction of the value */
        if (p->dt == TK_F16 && d <= 0x1p-24) d = 0.0;
        double e = d / fmax(fabs(a[i]), floor_);
        if (!(e <= worst) && !isnan(worst)) { worst = e; at = i; } /* the first NaN stays worst */
    }
    TK_CHECK_MSG(worst <= tol, "%s: rel err %.3g at [%lld] (cpu %.9g, cuda %.9g), tol %.3g", what, worst,
                 (long long)at, at >= 0 ? a[at] : 0.0, at >= 0 ? b[at] : 0.0, tol);
    free(a);
    free(b);
    return worst;
}

/* Raw bytes equal on both sides (masks, copies, integer codes). */
static inline int pair_same_bytes(const pair *p, const char *what) {
    tk_err err = {0};
    size_t nb = tk_tensor_nbytes(&p->c);
    unsigned char *a = malloc(nb ? nb : 1), *b = malloc(nb ? nb : 1);
    TK_CHECK(tk_tensor_read(g_cpu, &p->c, a, &err) == TK_OK);
    TK_CHECK(tk_tensor_read(g_gpu, &p->g, b, &err) == TK_OK);
    int same = memcmp(a, b, nb) == 0;
    TK_CHECK_MSG(same, "%s: bytes differ between cpu and cuda", what);
    free(a);
    free(b);
    return same;
}

static const tk_dtype FLOATS[3] = { TK_F32, TK_F16, TK_BF16 };

/* For tests that open their own cuda devices: checks that the cpu and cuda
 * devices open and closes them again (so CUPTI's session ends and the next
 * device starts its peak from zero). 0 after printing why and the closing
 * "0 passed, 1 failed" line: the caller returns 1. */
static inline int gpu_probe(void) {
    int ok = gpu_open();
    gpu_close();
    if (!ok) printf("0 passed, 1 failed\n");
    return ok;
}

/* What the plan says the card holds beyond the allocator's segments: what
 * the CUDA libraries keep outside the buffers they are given (the
 * architecture's figure, gpu/profile.c), plus whatever the plugin allocated
 * outside the allocator (0: its buffers are allocator blocks). */
static inline size_t card_outside(size_t plugin_bytes) {
    return tk_cuda_library_own_bytes(g_cc_major, g_cc_minor, NULL) + plugin_bytes;
}

/* How far CUPTI's device peak is from the plan's reserved plus what the card
 * holds outside the allocator, as a share of the device peak (issue 33's
 * bar is 0.015). */
#define CUPTI_BOUND 0.015
static inline double cupti_apart(size_t device_peak, size_t planned_reserved, size_t outside) {
    double want = (double)(planned_reserved + outside);
    return device_peak ? fabs((double)device_peak - want) / (double)device_peak : 1.0;
}

#endif
