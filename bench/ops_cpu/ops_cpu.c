/* ops_cpu.c — times the cpu backend's ops at BERT fine-tuning sizes.
 *
 *   ops_cpu [--hidden H] [--batch B] [--seq T] [--threads N] [--reps R]
 *
 * Shapes follow one encoder layer of a BERT with hidden H (heads H/64,
 * intermediate 4H) on a B x T batch, plus AdamW over 11M parameters
 * (bert-mini's size). Each op runs once to warm up, then R times; the line
 * printed is the minimum wall time (the least disturbed by other load on a
 * shared machine), in the same format as ops_torch.py so the two can be put
 * side by side. Calls the backend table directly (no allocator in the loop). */
#include "tk_backend_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static tk_tensor mk(tk_dtype dt, int64_t n) {
    tk_tensor t;
    memset(&t, 0, sizeof t);
    size_t es = dt == TK_U8 ? 1 : 4;
    t.data = calloc((size_t)n, es);
    t.shape[0] = n;
    t.ndim = 1;
    t.dtype = dt;
    if (t.data && dt == TK_F32)
        for (int64_t i = 0; i < n; i++) ((float *)t.data)[i] = (float)((i * 2654435761u) % 2000) / 1000.0f - 1.0f;
    if (t.data && dt == TK_I32)
        for (int64_t i = 0; i < n; i++) ((int32_t *)t.data)[i] = 1;
    return t;
}

static int reps = 10;
#define BENCH(name, flops, expr) do { \
    expr; double best = 1e30; \
    for (int r_ = 0; r_ < reps; r_++) { double t0 = now(); expr; double dt = now() - t0; if (dt < best) best = dt; } \
    if ((flops) > 0) printf("%-16s %9.3f ms %8.1f GFLOP/s\n", name, best * 1e3, (flops) / best * 1e-9); \
    else printf("%-16s %9.3f ms\n", name, best * 1e3); } while (0)

int main(int argc, char **argv) {
    int H = 256, B = 32, T = 128, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--hidden")) H = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else { fprintf(stderr, "ops_cpu: unknown option %s\n", argv[i]); return 2; }
    }
    if (H < 64 || B < 1 || T < 1 || reps < 1) { fprintf(stderr, "ops_cpu: bad sizes\n"); return 2; }
    int I = 4 * H, NH = H / 64, HS = 64;
    int64_t N = (int64_t)B * T, S = (int64_t)B * NH * T * T, P = 11000000;
    const tk_backend *be = tk_backend_cpu();
    tk_dev_opts o = {.kind = TK_DEV_CPU, .threads = threads};
    void *c = tk_cpu_ctx_new(&o);
    tk_tensor x = mk(TK_F32, N * H), w = mk(TK_F32, (int64_t)H * I), bias = mk(TK_F32, I);
    tk_tensor y = mk(TK_F32, N * I), z = mk(TK_F32, N * I), dy = mk(TK_F32, N * I), dx = mk(TK_F32, N * H);
    tk_tensor q = mk(TK_F32, N * H), k = mk(TK_F32, N * H), s = mk(TK_F32, S), sp = mk(TK_F32, S), ds = mk(TK_F32, S);
    tk_tensor mask = mk(TK_I32, N), m8 = mk(TK_U8, S);
    tk_tensor lw = mk(TK_F32, H), lb = mk(TK_F32, H), mean = mk(TK_F32, N), rstd = mk(TK_F32, N);
    tk_tensor ly = mk(TK_F32, N * H), dw = mk(TK_F32, H), db = mk(TK_F32, H);
    tk_tensor p = mk(TK_F32, P), g = mk(TK_F32, P), am = mk(TK_F32, P), av = mk(TK_F32, P);
    if (!c || !x.data || !p.data || !av.data) { fprintf(stderr, "ops_cpu: out of host memory\n"); return 1; }
    tk_adamw_hp hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f, 1};
    double fl = 2.0 * (double)N * H * I, fa = 2.0 * (double)B * NH * T * T * HS;
    printf("# cpu backend: hidden %d, batch %d x %d, %d thread(s), min of %d\n", H, B, T, threads, reps);
    BENCH("linear_fwd", fl, be->gemm(c, &y, &x, &w, &bias, &(tk_gemm){ .m = N, .n = I, .k = H, .trans_a = 0, .trans_b = 1, .batch = 1, .stride_a = 0, .stride_b = 0, .stride_c = 0, .alpha = 1.0f, .beta = 0.0f }));
    BENCH("linear_dx", fl, be->gemm(c, &dx, &dy, &w, NULL, &(tk_gemm){ .m = N, .n = H, .k = I, .trans_a = 0, .trans_b = 0, .batch = 1, .stride_a = 0, .stride_b = 0, .stride_c = 0, .alpha = 1.0f, .beta = 0.0f }));
    BENCH("linear_dw", fl, be->gemm(c, &w, &dy, &x, NULL, &(tk_gemm){ .m = I, .n = H, .k = N, .trans_a = 1, .trans_b = 0, .batch = 1, .stride_a = 0, .stride_b = 0, .stride_c = 0, .alpha = 1.0f, .beta = 1.0f }));
    BENCH("attn_qk", fa, be->gemm(c, &s, &q, &k, NULL, &(tk_gemm){ .m = T, .n = T, .k = HS, .trans_a = 0, .trans_b = 1, .batch = (int64_t)B * NH, .stride_a = T * HS, .stride_b = T * HS, .stride_c = (int64_t)T * T, .alpha = 1.0f, .beta = 0.0f }));
    BENCH("gelu_fwd", 0, be->gelu_fwd(c, &z, &y, N * I));
    BENCH("gelu_bwd", 0, be->gelu_bwd(c, &z, &y, &dy, N * I));
    BENCH("softmax_fwd", 0, be->softmax_fwd(c, &sp, &s, &mask, B, NH, T, 0.125f));
    BENCH("softmax_bwd", 0, be->softmax_bwd(c, &ds, &sp, &s, (int64_t)B * NH * T, T, 0.125f));
    BENCH("layernorm_fwd", 0, be->layernorm_fwd(c, &ly, &mean, &rstd, &x, &lw, &lb, N, H, 1e-12f));
    BENCH("layernorm_bwd", 0, be->layernorm_bwd(c, &dx, &dw, &db, &ly, &x, &lw, &mean, &rstd, N, H, 0, NULL));
    BENCH("dropout_fwd", 0, be->dropout_fwd(c, &ds, &m8, &sp, S, 0.1f, 1, 0));
    BENCH("add", 0, be->add(c, &z, &y, &dy, N * I));
    BENCH("bias_grad", 0, be->bias_grad(c, &bias, &dy, N, I));
    BENCH("adamw_11M", 0, be->adamw(c, &p, &g, &am, &av, P, &hp));
    tk_tensor *all[] = {&x, &w, &bias, &y, &z, &dy, &dx, &q, &k, &s, &sp, &ds, &mask, &m8, &lw, &lb,
                        &mean, &rstd, &ly, &dw, &db, &p, &g, &am, &av};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]->data);
    be->destroy(c);
    return 0;
}
