/* test_cuda_attention.c — the cuda backend's reference fused attention, run
 * on the host (the tensor-core kernels: gpu_ops' attention rows, emulated).
 *
 * gpu/cuda/cuda_attention.h writes each kernel as a sequence of phases
 * (barrier to barrier) that one thread index runs at a time; the kernel in
 * attention.cu runs them on the GPU with __syncthreads() between. Here every
 * block is emulated: shared memory is a host buffer poisoned with NaN before
 * each block (a read of a piece no phase wrote shows up as NaN), and the
 * threads of a phase run one after another, once in ascending and once in
 * descending order (a thread reading what another wrote in the same phase
 * would make the two runs differ). The results must match the cpu backend's
 * fused attention (gpu/cpu_attention.c) on the same inputs:
 *  - fp32: out, lse, dq, dk, dv within 2e-6 of the tensor's scale (max |x|),
 *    with padded keys, a sequence whose keys are all masked, dropout on and
 *    off, tiles that do not divide T, tiles of the size the plugin picks and
 *    tiny ones (many tiles per row), a sequence shorter than one tile, and
 *    BERT's T=384 (SQuAD) with head size 64;
 *  - bf16 and fp16 inputs and outputs within two roundings of the format at
 *    the tensor's scale (8e-3, 1e-3);
 *  - the tile sizes fit a block in 48 KiB for every head size BERT uses and
 *    refuse absurd ones.
 * The GPU suite (make test-gpu) checks the device build against the cpu.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_attention.h"
#include "cuda/cuda_shared.h"
#include "tk_test.h"

typedef struct {
    int64_t B, NH, T, HS;
    int qt, kt; /* 0: the plugin's choice (tk_fa_tiles) */
    float p;
    tk_dtype dt;
    const int *lens; /* B key lengths, NULL: no mask */
} scase;

static tk_dev *g_dev;

static tk_tensor mk(tk_dtype dt, int64_t n, const float *init) {
    tk_tensor t = { 0 };
    tk_err e = { 0 };
    TK_CHECK_MSG(tk_tensor_alloc(g_dev, &t, dt, 1, &n, TK_CAT_TEMP, "test", &e) == TK_OK, "%s", e.msg);
    if (init) TK_CHECK(tk_tensor_write_f32(g_dev, &t, init, &e) == TK_OK);
    return t;
}

static float *back(const tk_tensor *t) {
    float *h = malloc((size_t)tk_tensor_numel(t) * sizeof *h);
    tk_err e = { 0 };
    TK_CHECK(tk_tensor_read_f32(g_dev, t, h, &e) == TK_OK);
    return h;
}

/* Worst absolute error over the tensor's scale (max |ref|); NaN is worst.
 * The two sides sum in different orders (tiles of keys against one row at
 * a time), so single elements near zero differ by a few ulps of the
 * tensor's largest values, not of their own. */
static double relerr(const float *ref, const float *x, int64_t n) {
    double mx = 0.0, worst = 0.0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    if (mx < 1e-30) mx = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)ref[i] - x[i]) / mx;
        if (!(e <= worst) && !isnan(worst)) worst = e; /* the first NaN stays */
    }
    return worst;
}

/* Runs every block of one kernel, phase by phase; `reverse` runs a phase's
 * threads from the last to the first. */
static void emulate(int kind, const tk_fa_args *a, int64_t BH, int reverse) {
    const int64_t tiles = kind == TK_FA_BWD_KV ? tk_fa_ntiles(a->T, a->kt) : tk_fa_ntiles(a->T, a->qt);
    tk_fa_smem sh;
    const size_t nf = tk_fa_carve(&sh, NULL, kind, a->HS, a->qt, a->kt);
    float *mem = malloc(nf * sizeof(float));
    const int nt = TK_FA_THREADS;
    for (int64_t bh = 0; bh < BH; bh++) {
        for (int64_t tb = 0; tb < tiles; tb++) {
            for (size_t i = 0; i < nf; i++) mem[i] = NAN;
            tk_fa_carve(&sh, mem, kind, a->HS, a->qt, a->kt);
            for (int ph = 0;; ph++) {
                int more0 = -1, uniform = 1;
                for (int i = 0; i < nt; i++) {
                    int tid = reverse ? nt - 1 - i : i;
                    int more = tk_fa_phase(kind, a, &sh, bh, tb, ph, tid, nt);
                    if (more0 < 0) more0 = more;
                    else if (more != more0) uniform = 0;
                }
                if (!uniform) {
                    TK_CHECK_MSG(0, "kind %d phase %d: threads disagree on whether another phase follows", kind, ph);
                    free(mem);
                    return;
                }
                if (!more0) break;
                if (ph > 100000) {
                    TK_CHECK_MSG(0, "kind %d: no end of phases", kind);
                    free(mem);
                    return;
                }
            }
        }
    }
    free(mem);
}

static void run_case(const char *name, const scase *c) {
    const int64_t BH = c->B * c->NH, n = BH * c->T * c->HS, nl = BH * c->T;
    const float scale = 1.0f / sqrtf((float)c->HS);
    tk_err e = { 0 };
    float *hq = tk_test_uniform(n, 1, 1.0f), *hk = tk_test_uniform(n, 2, 1.0f), *hv = tk_test_uniform(n, 3, 1.0f), *hg = tk_test_uniform(n, 4, 1.0f);
    tk_tensor q = mk(c->dt, n, hq), k = mk(c->dt, n, hk), v = mk(c->dt, n, hv), g = mk(c->dt, n, hg);
    tk_tensor oc = mk(c->dt, n, NULL), lc = mk(TK_F32, nl, NULL);
    tk_tensor dqc = mk(c->dt, n, NULL), dkc = mk(c->dt, n, NULL), dvc = mk(c->dt, n, NULL);
    tk_tensor mask = { 0 };
    if (c->lens) {
        int64_t bt = c->B * c->T;
        TK_CHECK(tk_tensor_alloc(g_dev, &mask, TK_I32, 1, &bt, TK_CAT_INPUT, "test", &e) == TK_OK);
        int32_t *m = mask.data;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t t = 0; t < c->T; t++) m[b * c->T + t] = t < c->lens[b];
    }
    const tk_tensor *mp = c->lens ? &mask : NULL;
    const uint64_t seed = 99, offset = 1234;

    const tk_attn at = { .B = c->B, .NH = c->NH, .T = c->T, .HS = c->HS, .scale = scale, .p = c->p, .seed = seed,
                         .offset = offset };
    tk_tensor km = { 0 };
    int64_t nk = tk_attn_keep_bytes(c->B, c->NH, c->T);
    if (c->p > 0) TK_CHECK(tk_tensor_alloc(g_dev, &km, TK_U8, 1, &nk, TK_CAT_TEMP, "test", &e) == TK_OK);
    TK_CHECK(tk_op_attention_fwd(g_dev, &oc, &lc, c->p > 0 ? &km : NULL, &q, &k, &v, mp, &at) == TK_OK);
    TK_CHECK(tk_op_attention_bwd(g_dev, &dqc, &dkc, &dvc, &g, &q, &k, &v, &oc, &lc, c->p > 0 ? &km : NULL, mp, &at) ==
             TK_OK);
    tk_tensor_free(g_dev, &km);
    float *ref[5] = { back(&oc), back(&lc), back(&dqc), back(&dkc), back(&dvc) };
    const int64_t cnt[5] = { n, nl, n, n, n };
    const char *what[5] = { "out", "lse", "dq", "dk", "dv" };
    const double tol = c->dt == TK_F16 ? 1e-3 : c->dt == TK_BF16 ? 8e-3 : 2e-6;

    float *first[5] = { 0 };
    for (int order = 0; order < 2; order++) {
        tk_tensor oe = mk(c->dt, n, NULL), le = mk(TK_F32, nl, NULL);
        tk_tensor dqe = mk(c->dt, n, NULL), dke = mk(c->dt, n, NULL), dve = mk(c->dt, n, NULL);
        tk_fa_args a;
        memset(&a, 0, sizeof a);
        if (c->qt) {
            a.qt = c->qt;
            a.kt = c->kt;
        } else {
            TK_CHECK(tk_fa_tiles(c->HS, &a.qt, &a.kt));
        }
        a.q = q.data; a.k = k.data; a.v = v.data;
        a.dtq = a.dtk = a.dtv = a.dto = a.dtg = (int)c->dt;
        a.mask = c->lens ? mask.data : NULL;
        a.NH = c->NH; a.T = c->T; a.HS = c->HS;
        a.ld = a.ldo = c->NH * c->HS;
        a.scale = scale; a.p = c->p; a.keep_scale = tk_dropout_scale(c->p);
        a.key = tk_dropout_key(seed); a.offset = offset;
        a.out = oe.data; a.dt_out = (int)c->dt; a.lse_out = le.data;
        emulate(TK_FA_FWD, &a, BH, order);
        /* backward from the emulated forward's out and lse, as the model does */
        a.o = oe.data; a.dout = g.data; a.lse_in = le.data;
        a.dq = dqe.data; a.dk = dke.data; a.dv = dve.data;
        a.dt_dq = a.dt_dk = a.dt_dv = (int)c->dt;
        emulate(TK_FA_BWD_KV, &a, BH, order);
        emulate(TK_FA_BWD_Q, &a, BH, order);
        float *got[5] = { back(&oe), back(&le), back(&dqe), back(&dke), back(&dve) };
        for (int i = 0; i < 5; i++) {
            double err = relerr(ref[i], got[i], cnt[i]);
            if (getenv("TXK_TEST_VERBOSE"))
                printf("  %s %s %s: %.3g\n", name, tk_dtype_name(c->dt), what[i], err);
            TK_CHECK_MSG(err <= tol, "%s (%s, tiles %dx%d, %s threads): %s rel err %.3g > %.3g", name,
                         tk_dtype_name(c->dt), a.qt, a.kt, order ? "descending" : "ascending", what[i], err, tol);
            if (order == 0) {
                first[i] = got[i];
            } else {
                TK_CHECK_MSG(memcmp(first[i], got[i], (size_t)cnt[i] * sizeof(float)) == 0,
                             "%s: %s differs between thread orders (a phase reads another thread's write)", name,
                             what[i]);
                free(got[i]);
                free(first[i]);
            }
        }
        tk_tensor_free(g_dev, &oe); tk_tensor_free(g_dev, &le);
        tk_tensor_free(g_dev, &dqe); tk_tensor_free(g_dev, &dke); tk_tensor_free(g_dev, &dve);
    }
    for (int i = 0; i < 5; i++) free(ref[i]);
    tk_tensor_free(g_dev, &q); tk_tensor_free(g_dev, &k); tk_tensor_free(g_dev, &v); tk_tensor_free(g_dev, &g);
    tk_tensor_free(g_dev, &oc); tk_tensor_free(g_dev, &lc);
    tk_tensor_free(g_dev, &dqc); tk_tensor_free(g_dev, &dkc); tk_tensor_free(g_dev, &dvc);
    tk_tensor_free(g_dev, &mask);
    free(hq); free(hk); free(hv); free(hg);
}

static const int LENS3[3] = { 37, 20, 0 }; /* full, padded, every key masked */

static void test_f32_masked(void) {
    scase c = { .B = 3, .NH = 2, .T = 37, .HS = 16, .dt = TK_F32, .lens = LENS3 };
    run_case("masked", &c);
    c.p = 0.1f;
    run_case("masked+dropout", &c);
}

static void test_small_tiles(void) {
    scase c = { .B = 3, .NH = 2, .T = 37, .HS = 16, .qt = 4, .kt = 8, .p = 0.1f, .dt = TK_F32, .lens = LENS3 };
    run_case("tiles 4x8", &c);
    c.qt = 5; /* not a power of two, not dividing the thread count */
    c.kt = 3;
    run_case("tiles 5x3", &c);
}

static void test_short_unmasked(void) {
    scase c = { .B = 2, .NH = 3, .T = 5, .HS = 8, .dt = TK_F32 };
    run_case("T=5, no mask", &c);
}

static void test_bert_head_size(void) {
    static const int lens[2] = { 70, 41 };
    scase c = { .B = 2, .NH = 2, .T = 70, .HS = 64, .p = 0.1f, .dt = TK_F32, .lens = lens };
    run_case("HS=64", &c);
    c.dt = TK_BF16;
    run_case("HS=64 bf16", &c);
    c.dt = TK_F16;
    c.p = 0.0f;
    run_case("HS=64 f16", &c);
}

static void test_long(void) {
    static const int lens[1] = { 384 };
    scase c = { .B = 1, .NH = 2, .T = 384, .HS = 64, .p = 0.1f, .dt = TK_F32, .lens = lens };
    run_case("T=384", &c);
}

static void test_tiles_fit(void) {
    const int64_t hs[5] = { 16, 32, 64, 128, 256 };
    for (int i = 0; i < 5; i++) {
        int qt = 0, kt = 0;
        TK_CHECK(tk_fa_tiles(hs[i], &qt, &kt));
        size_t need = 0;
        for (int kind = 0; kind < 3; kind++) {
            size_t b = tk_fa_smem_bytes(kind, hs[i], qt, kt);
            if (b > need) need = b;
        }
        TK_CHECK_MSG(need <= TK_FA_SMEM_LIMIT, "HS %lld: tiles %dx%d need %zu bytes", (long long)hs[i], qt, kt, need);
        if (hs[i] <= 64) {
            TK_CHECK_EQ_INT(qt, 16);
            TK_CHECK_EQ_INT(kt, 32);
        }
    }
    int qt = 0, kt = 0;
    TK_CHECK(!tk_fa_tiles(100000, &qt, &kt));
}

int main(void) {
    tk_dev_opts o = { .kind = TK_DEV_CPU, .threads = 2 };
    tk_err e = { 0 };
    g_dev = tk_dev_new(&o, &e);
    TK_CHECK_MSG(g_dev != NULL, "%s", e.msg);
    if (!g_dev) return tk_test_done();
    TK_RUN(test_f32_masked);
    TK_RUN(test_small_tiles);
    TK_RUN(test_short_unmasked);
    TK_RUN(test_bert_head_size);
    TK_RUN(test_long);
    TK_RUN(test_tiles_fit);
    tk_dev_destroy(&g_dev);
    return tk_test_done();
}
