/* attn_gpu.c — times fused attention on the GPU, each kernel the cuda
 * backend has for it, at a BERT layer's shapes.
 *
 *   attn_gpu [--batch 32] [--heads 12] [--seq 128,512] [--hs 64] [--dtypes fp16,bf16,fp32] [--p 0.1] [--reps 20]
 *
 * For each sequence length and dtype, forward and backward of
 * tk_op_attention_* (as the model calls them: q, k, v, the context and its
 * gradient (B,T,NH,HS) tensors of their own, the keep mask, the attention mask, dropout
 * 0.1, or each rate of --p: 0,0.1 times the kernels without and with it) with TXK_ATTN_KERNEL unset (the card's pick), =sm75 (T4's m16n8k8
 * path) and =reference (the fp32-core kernel). One call warms up, then
 * `reps` calls are timed between two device syncs; the line gives the mean
 * per call and TFLOP/s at the op's count (4 T^2 HS forward, 10 T^2 HS
 * backward per sequence and head), so every kernel is measured on the same
 * work. Needs a GPU and the cuda plugin (TXK_CUDA_PLUGIN or beside the
 * binary, as every txk binary finds it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk_attn_kernel.h"
#include "tk_gpu.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int alloc(tk_dev *d, tk_tensor *t, tk_dtype dt, int64_t n, int fill) {
    tk_err e = {0};
    if (tk_tensor_alloc(d, t, dt, 1, &n, TK_CAT_TEMP, "bench", &e) != TK_OK) {
        fprintf(stderr, "attn_gpu: %s\n", e.msg);
        return -1;
    }
    if (!fill) return 0;
    float *h = malloc((size_t)n * sizeof *h);
    if (!h) return -1;
    for (int64_t i = 0; i < n; i++) h[i] = (float)((i * 2654435761u) % 2000) / 1000.0f - 1.0f;
    int rc = tk_tensor_write_f32(d, t, h, &e) == TK_OK ? 0 : -1;
    free(h);
    return rc;
}

/* Mean seconds per call of forward (fb = 0) or backward (1). */
static double time_calls(tk_dev *d, int fb, int reps, tk_tensor *t, const tk_tensor *mask, const tk_attn *a) {
    tk_err e = {0};
    tk_status st = TK_OK;
    double t0 = 0;
    for (int r = -1; r < reps && st == TK_OK; r++) {
        if (r == 0) {
            if (tk_dev_sync(d, &e) != TK_OK) break;
            t0 = now();
        }
        tk_tensor *keep = a->p > 0 ? &t[9] : NULL;
        st = fb ? tk_op_attention_bwd(d, &t[5], &t[6], &t[7], &t[4], &t[0], &t[1], &t[2], &t[3], &t[8], keep, mask, a)
                : tk_op_attention_fwd(d, &t[3], &t[8], keep, &t[0], &t[1], &t[2], mask, a);
    }
    if (st != TK_OK || tk_dev_sync(d, &e) != TK_OK) return -1.0;
    return (now() - t0) / reps;
}

int main(int argc, char **argv) {
    int B = 32, NH = 12, HS = 64, reps = 20;
    char seqs[64] = "128,512", dts[64] = "fp16,bf16,fp32", ps[64] = "0.1";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) NH = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hs")) HS = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) snprintf(seqs, sizeof seqs, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--dtypes")) snprintf(dts, sizeof dts, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--p")) snprintf(ps, sizeof ps, "%s", argv[i + 1]);
        else { fprintf(stderr, "attn_gpu: unknown option %s\n", argv[i]); return 2; }
    }
    if (B < 1 || NH < 1 || HS < 1 || reps < 1) { fprintf(stderr, "attn_gpu: bad sizes\n"); return 2; }
    tk_err e = {0};
    tk_dev_opts o = {.kind = TK_DEV_CUDA};
    tk_dev *d = tk_dev_new(&o, &e);
    if (!d) { fprintf(stderr, "attn_gpu: %s\n", e.msg); return 1; }
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    printf("fused attention on %s (cc %d.%d), B=%d NH=%d HS=%d, mask, dropout %s, mean of %d calls\n", info.name,
           info.cc_major, info.cc_minor, B, NH, HS, ps, reps);
    printf("%-5s %-5s %-4s %-14s %10s %8s %10s %8s\n", "T", "dtype", "p", "kernel", "fwd ms", "TFLOP/s", "bwd ms",
           "TFLOP/s");
    const char *asks[3] = { NULL, "sm75", "reference" };
    int rc = 0;
    for (char *sp = seqs; *sp; ) {
        const int T = atoi(sp);
        for (char *dp = dts; *dp && T > 0; ) {
            tk_dtype dt;
            char name[8] = "";
            sscanf(dp, "%7[^,]", name);
            dt = !strcmp(name, "fp16") ? TK_F16 : !strcmp(name, "bf16") ? TK_BF16 : TK_F32;
            const int64_t n = (int64_t)B * T * NH * HS;
            tk_tensor t[10], mask; /* q k v out dout dq dk dv lse keep */
            memset(t, 0, sizeof t);
            memset(&mask, 0, sizeof mask);
            int ok = 1;
            for (int i = 0; i < 8 && ok; i++) ok = alloc(d, &t[i], dt, n, i < 5) == 0;
            ok = ok && alloc(d, &t[8], TK_F32, (int64_t)B * NH * T, 0) == 0;
            ok = ok && alloc(d, &t[9], TK_U8, tk_attn_keep_bytes(B, NH, T), 0) == 0;
            ok = ok && alloc(d, &mask, TK_I32, (int64_t)B * T, 0) == 0 && tk_op_fill(d, &mask, 1.0f, (int64_t)B * T) == TK_OK;
            for (char *pp = ps; *pp && ok; ) {
                char *end;
                const float p = strtof(pp, &end);
                if (end == pp || !(p >= 0.0f && p < 1.0f)) {
                    fprintf(stderr, "attn_gpu: --p: '%s' is not a rate in [0, 1)\n", pp);
                    rc = 2;
                    break;
                }
                pp = end + (*end == ',');
                const tk_attn a = { .B = B, .NH = NH, .T = T, .HS = HS, .scale = 0.125f, .p = p, .seed = 1, .offset = 0 };
                unsigned timed = 0; /* kernels timed already: asking sm75 for bf16 gets the reference */
                for (int k = 0; k < 3 && ok; k++) {
                    const tk_attn_kernel kern = tk_attn_kernel_pick(info.cc_major, info.cc_minor, dt, HS,
                                                                    tk_attn_kernel_ask(asks[k]), NULL);
                    if (timed & (1u << kern)) continue;
                    timed |= 1u << kern;
                    if (asks[k]) setenv(TK_ATTN_KERNEL_ENV, asks[k], 1);
                    else unsetenv(TK_ATTN_KERNEL_ENV);
                    const double f = time_calls(d, 0, reps, t, &mask, &a), b = time_calls(d, 1, reps, t, &mask, &a);
                    const double work = (double)B * NH * T * T * HS;
                    if (f < 0 || b < 0) {
                        fprintf(stderr, "attn_gpu: T=%d %s p=%g %s failed: %s\n", T, name, p, tk_attn_kernel_name(kern),
                                tk_dev_last_err(d) ? tk_dev_last_err(d)->msg : "see above");
                        rc = 1;
                        continue;
                    }
                    printf("%-5d %-5s %-4g %-14s %10.3f %8.1f %10.3f %8.1f\n", T, name, p, tk_attn_kernel_name(kern),
                           f * 1e3, 4.0 * work / f * 1e-12, b * 1e3, 10.0 * work / b * 1e-12);
                    fflush(stdout);
                }
            }
            unsetenv(TK_ATTN_KERNEL_ENV);
            for (int i = 0; i < 10; i++) tk_tensor_free(d, &t[i]);
            tk_tensor_free(d, &mask);
            dp += strlen(name);
            if (*dp == ',') dp++;
        }
        while (*sp && *sp != ',') sp++;
        if (*sp == ',') sp++;
    }
    tk_dev_destroy(&d);
    return rc;
}
