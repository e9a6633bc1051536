/* gemm_cpu.c — the CPU backend's GEMM (tk_op_gemm: row slices across OpenMP
 * threads, one single-threaded OpenBLAS sgemm each) on the linear layers'
 * shapes of a BERT step, in GFLOP/s; run.py puts PyTorch's matmul beside it.
 *
 *   gemm_cpu M K N [--threads T] [--reps R]     C (M x N) = A (M x K) B^T (N x K)^T
 *
 * Prints one JSON line: {"m", "k", "n", "threads", "gflops", "best_gflops"}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk_gpu.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: gemm_cpu M K N [--threads T] [--reps R]\n");
        return 2;
    }
    int64_t M = atoll(argv[1]), K = atoll(argv[2]), N = atoll(argv[3]);
    int threads = 2, reps = 20;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else { fprintf(stderr, "gemm_cpu: unknown option %s\n", argv[i]); return 2; }
    }
    if (M < 1 || K < 1 || N < 1 || threads < 1 || reps < 1) { fprintf(stderr, "gemm_cpu: bad sizes\n"); return 2; }
    tk_err err = {0};
    tk_dev_opts o = {.kind = TK_DEV_CPU, .threads = threads};
    tk_dev *d = tk_dev_new(&o, &err);
    tk_tensor A = {0}, B = {0}, C = {0};
    int64_t sa[2] = {M, K}, sb[2] = {N, K}, sc[2] = {M, N};
    if (!d || tk_tensor_alloc(d, &A, TK_F32, 2, sa, TK_CAT_TEMP, "A", &err) != TK_OK ||
        tk_tensor_alloc(d, &B, TK_F32, 2, sb, TK_CAT_TEMP, "B", &err) != TK_OK ||
        tk_tensor_alloc(d, &C, TK_F32, 2, sc, TK_CAT_TEMP, "C", &err) != TK_OK) {
        fprintf(stderr, "gemm_cpu: %s\n", err.msg);
        return 1;
    }
    float *a = A.data, *b = B.data;
    for (int64_t i = 0; i < M * K; i++) a[i] = (float)(i % 17) * 0.01f;
    for (int64_t i = 0; i < N * K; i++) b[i] = (float)(i % 13) * 0.01f;
    tk_gemm g = {.m = M, .n = N, .k = K, .trans_b = 1, .batch = 1, .alpha = 1.0f};
    double best = 1e30, sum = 0;
    for (int r = -3; r < reps; r++) {
        double t0 = now();
        if (tk_op_gemm(d, &C, &A, &B, NULL, &g) != TK_OK || tk_dev_sync(d, &err) != TK_OK) {
            fprintf(stderr, "gemm_cpu: gemm failed: %s\n", err.msg);
            return 1;
        }
        double dt = now() - t0;
        if (r < 0) continue;
        sum += dt;
        best = dt < best ? dt : best;
    }
    double flop = 2.0 * (double)M * (double)N * (double)K;
    printf("{\"m\": %lld, \"k\": %lld, \"n\": %lld, \"threads\": %d, \"gflops\": %.1f, \"best_gflops\": %.1f}\n",
           (long long)M, (long long)K, (long long)N, threads, flop / (sum / reps) / 1e9, flop / best / 1e9);
    tk_tensor_free(d, &A), tk_tensor_free(d, &B), tk_tensor_free(d, &C);
    tk_dev_destroy(&d);
    return 0;
}
