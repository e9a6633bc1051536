/* gpu_ops.c — every op of the cuda backend against the cpu backend.
 *
 * Same random inputs on both devices, same op through the public tk_op_*
 * API, results compared within the tolerances in gpu_common.h. Ops that
 * move or select data (cast, heads, gather, embedding forward, dropout
 * masks and values, fill) must agree byte for byte, and so must the f32
 * AdamW step (both sides follow one operation order without FMA); fused
 * attention must also repeat itself bit for bit, and its tensor-core kernels
 * (the card's own and the forced sm75 path) are checked against its
 * reference kernel on the card. Sizes are odd on purpose: rows not a
 * multiple of the block size, partial q8 blocks, T not a multiple of a tile.
 */
#include "gpu_common.h"
#include "tk_attn_kernel.h"

/* Runs `call` on the cpu device and then on the cuda device; inside it, D is
 * the device and T(p) the pair's tensor on that device. */
#define BOTH(call) do { tk_dev *D = g_cpu; int S_ = 0; \
    TK_CHECK_MSG((call) == TK_OK, "cpu: %s", #call); \
    D = g_gpu; S_ = 1; \
    TK_CHECK_MSG((call) == TK_OK, "cuda: %s", #call); (void)D; (void)S_; } while (0)
#define T(p) (S_ ? &(p).g : &(p).c)

/* The cpu copy's bytes onto the cuda copy (inputs one op computed, handed
 * to the next with identical bytes on both sides). */
static void pair_sync_from_cpu(pair *p) {
    tk_err err = {0};
    size_t nb = tk_tensor_nbytes(&p->c);
    void *h = malloc(nb ? nb : 1);
    TK_CHECK(tk_tensor_read(g_cpu, &p->c, h, &err) == TK_OK);
    TK_CHECK(tk_tensor_write(g_gpu, &p->g, h, &err) == TK_OK);
    free(h);
}

static void test_gemm(void) {
    const int64_t M = 37, N = 29, K = 53, batch = 3;
    for (int di = 0; di < 3; di++) {
        tk_dtype dt = FLOATS[di];
        for (int outs = 0; outs < (dt == TK_F32 ? 1 : 2); outs++) {
            tk_dtype ct = outs ? dt : TK_F32;
            double tol = outs ? tol_for(dt) : (dt == TK_F32 ? 1e-5 : 1e-4);
            for (int tr = 0; tr < 4; tr++) {
                int ta = tr & 1, tb = tr >> 1;
                int64_t sA = M * K + 3, sB = K * N + 5, sC = M * N + 7;
                pair A = pair_new(dt, sA * batch, NULL, 1.0f);
                pair B = pair_new(dt, sB * batch, NULL, 1.0f);
                pair C = pair_new(ct, sC * batch, NULL, 1.0f);
                pair bias = pair_new(TK_F32, N, NULL, 1.0f);
                char what[96];
                snprintf(what, sizeof what, "gemm %s->%s transA=%d transB=%d", tk_dtype_name(dt),
                         tk_dtype_name(ct), ta, tb);
                BOTH(tk_op_gemm(D, T(C), T(A), T(B), NULL, &(tk_gemm){ .m = M, .n = N, .k = K, .trans_a = ta, .trans_b = tb, .batch = batch, .stride_a = sA, .stride_b = sB, .stride_c = sC, .alpha = 1.0f }));
                pair_cmp(&C, tol, what);
                snprintf(what, sizeof what, "gemm+bias %s->%s transA=%d transB=%d alpha/beta",
                         tk_dtype_name(dt), tk_dtype_name(ct), ta, tb);
                BOTH(tk_op_gemm(D, T(C), T(A), T(B), T(bias), &(tk_gemm){ .m = M, .n = N, .k = K, .trans_a = ta, .trans_b = tb, .batch = batch, .stride_a = sA, .stride_b = sB, .stride_c = sC, .alpha = 0.5f, .beta = 0.25f }));
                pair_cmp(&C, tol * 2, what);
                pair_free(&A); pair_free(&B); pair_free(&C); pair_free(&bias);
            }
        }
    }
}

/* cuBLASLt's epilogues on the model's combinations (a linear layer's
 * forward with its bias in the output's dtype, f32 or 16-bit; its weight
 * GEMM's bias gradient into an f32 gradient) are taken: no decline from
 * sm80 (tk_cuda_lt_declines; the emulation's stub declines what cuBLASLt
 * does not document, so it holds there too). A 16-bit output with an f32
 * bias is not documented: there the reference path runs it (the same
 * result as the cpu's), and the counter says so once per call. */
static void test_lt_declines(void) {
    const int64_t M = 67, N = 48, K = 40;
    uint64_t calls = 0, declined = 0;
    char report[1024];
    gpu_lt_reset();
    for (int di = 0; di < 3; di++) {
        tk_dtype dt = FLOATS[di];
        char what[96];
        pair x = pair_new(dt, M * K, NULL, 1.0f), w = pair_new(dt, N * K, NULL, 1.0f), y = pair_new(dt, M * N, NULL, 1.0f);
        pair b = pair_new(dt, N, NULL, 1.0f), dw = pair_new(TK_F32, N * K, NULL, 1.0f), db = pair_new(TK_F32, N, NULL, 1.0f);
        pair tmp = pair_new(TK_F32, N, NULL, 1.0f);
        snprintf(what, sizeof what, "linear forward %s, bias %s", tk_dtype_name(dt), tk_dtype_name(dt));
        BOTH(tk_op_gemm(D, T(y), T(x), T(w), T(b), &(tk_gemm){ .m = M, .n = N, .k = K, .trans_b = 1, .batch = 1, .alpha = 1.0f }));
        pair_cmp(&y, tol_for(dt) * 2, what);
        snprintf(what, sizeof what, "weight GEMM %s with its bias gradient", tk_dtype_name(dt));
        BOTH(tk_op_gemm(D, T(dw), T(y), T(x), NULL, &(tk_gemm){ .m = N, .n = K, .k = M, .trans_a = 1, .batch = 1, .alpha = 1.0f, .beta = 1.0f, .bgrad = T(db), .bgrad_tmp = T(tmp) }));
        pair_cmp(&dw, dt == TK_F32 ? 1e-5 : 1e-4, what);
        pair_cmp(&db, dt == TK_F32 ? 1e-5 : 1e-4, what);
        pair_free(&x); pair_free(&w); pair_free(&y); pair_free(&b); pair_free(&dw); pair_free(&db); pair_free(&tmp);
    }
    TK_CHECK(gpu_lt_declines(&calls, &declined, report, sizeof report));
    fprintf(stderr, "  %s\n", report);
    TK_CHECK_EQ_INT(calls, 6);
    if (g_cc_major >= 8) TK_CHECK_MSG(declined == 0, "the model's epilogues were declined: %s", report);
    /* an f32 bias for a 16-bit output: declined (in the emulation, and where a card declines it), same result */
    pair x = pair_new(TK_F16, M * K, NULL, 1.0f), w = pair_new(TK_F16, N * K, NULL, 1.0f);
    pair y = pair_new(TK_F16, M * N, NULL, 1.0f), b = pair_new(TK_F32, N, NULL, 1.0f);
    gpu_lt_reset();
    BOTH(tk_op_gemm(D, T(y), T(x), T(w), T(b), &(tk_gemm){ .m = M, .n = N, .k = K, .trans_b = 1, .batch = 1, .alpha = 1.0f, .beta = 0.5f }));
    /* the fallback rounds beta C + bias to f16 before cuBLAS adds the product: two roundings, not one */
    pair_cmp(&y, tol_for(TK_F16) * 4, "linear forward f16, bias f32");
    TK_CHECK(gpu_lt_declines(&calls, &declined, report, sizeof report));
    fprintf(stderr, "  %s\n", report);
    TK_CHECK_EQ_INT(calls, 1);
#ifdef TK_CUDA_EMU
    TK_CHECK_EQ_INT(declined, 1);
    TK_CHECK(strstr(report, "bias (A f16, C f16, f32): 1 of 1 declined: a bias dtype other than the output's") != NULL);
#endif
    pair_free(&x); pair_free(&w); pair_free(&y); pair_free(&b);
    gpu_lt_reset();
}

static void test_embed_gather_scatter(void) {
    const int64_t V = 50, C = 300, n = 41;
    int32_t ids[41];
    for (int i = 0; i < n; i++) ids[i] = (i * 7 + 3) % V; /* repeats: accumulation order matters */
    ids[5] = ids[6] = 0;
    for (int di = 0; di < 3; di++) {
        tk_dtype dt = FLOATS[di];
        pair table = pair_new(dt, V * C, NULL, 1.0f);
        table.c.ndim = table.g.ndim = 2;
        table.c.shape[0] = table.g.shape[0] = V;
        table.c.shape[1] = table.g.shape[1] = C;
        pair idx = pair_i32(n, ids);
        pair out = pair_new(dt, n * C, NULL, 1.0f);
        BOTH(tk_op_embed_fwd(D, T(out), T(idx), T(table), n, C));
        pair_same_bytes(&out, "embed_fwd");
        /* same order of 16-bit roundings on both sides: exact */
        BOTH(tk_op_embed_bwd(D, T(table), T(idx), T(out), n, C, NULL, NULL));
        pair_same_bytes(&table, "embed_bwd");
        BOTH(tk_op_gather_rows(D, T(out), T(table), T(idx), n, C));
        pair_same_bytes(&out, "gather_rows");
        BOTH(tk_op_scatter_add_rows(D, T(table), T(out), T(idx), n, C));
        pair_same_bytes(&table, "scatter_add_rows");
        pair_free(&table); pair_free(&idx); pair_free(&out);
    }
}

/* A fresh output pair with identical bytes on both sides. */
#define FRESH(p, dt, n) do { pair_free(&(p)); (p) = pair_new((dt), (n), NULL, 1.0f); } while (0)

static void test_elementwise(void) {
    const int64_t n = 100003;
    for (int di = 0; di < 3; di++) {
        tk_dtype dt = FLOATS[di];
        double tol = tol_for(dt);
        pair a = pair_new(dt, n, NULL, 3.0f), b = pair_new(TK_F32, n, NULL, 3.0f);
        pair o = pair_new(dt, n, NULL, 1.0f), o2 = pair_new(dt, n, NULL, 1.0f);
        BOTH(tk_op_add(D, T(o), T(a), T(b), n));
        pair_cmp(&o, tol, "add");
        FRESH(o, dt, n);
        BOTH(tk_op_axpby(D, T(o), 0.75f, T(a), -1.5f, n));
        pair_cmp(&o, tol, "axpby");
        /* beta == 0 must not read y: put NaNs there first */
        BOTH(tk_op_fill(D, T(o), NAN, n));
        BOTH(tk_op_axpby(D, T(o), 2.0f, T(a), 0.0f, n));
        pair_cmp(&o, tol, "axpby beta=0 over NaN");
        BOTH(tk_op_fill(D, T(o), 1.0f / 3.0f, n));
        pair_same_bytes(&o, "fill");
        BOTH(tk_op_gelu_fwd(D, T(o), T(a), n));
        pair_cmp(&o, tol, "gelu_fwd");
        BOTH(tk_op_gelu_bwd(D, T(o2), T(a), T(b), n));
        pair_cmp(&o2, tol, "gelu_bwd");
        BOTH(tk_op_tanh_fwd(D, T(o), T(a), n));
        pair_cmp(&o, tol, "tanh_fwd");
        FRESH(o, dt, n); /* a tanh output in [-1, 1), the same bytes on both sides */
        BOTH(tk_op_tanh_bwd(D, T(o2), T(o), T(b), n));
        pair_cmp(&o2, tol, "tanh_bwd");
        for (int dj = 0; dj < 3; dj++) {
            pair c = pair_new(FLOATS[dj], n, NULL, 1.0f);
            BOTH(tk_op_cast(D, T(c), T(b), n));
            pair_same_bytes(&c, "cast from f32");
            BOTH(tk_op_cast(D, T(o), T(c), n));
            pair_same_bytes(&o, "cast between float dtypes");
            pair_free(&c);
        }
        pair_free(&a); pair_free(&b); pair_free(&o); pair_free(&o2);
    }
    int32_t z[5] = { 0 };
    pair iv = pair_i32(5, z);
    BOTH(tk_op_fill(D, T(iv), 7.0f, 5));
    pair_same_bytes(&iv, "fill i32");
    pair_free(&iv);
}

static void test_layernorm(void) {
    const int64_t N = 33, C = 997;
    for (int di = 0; di < 3; di++) {
        tk_dtype dt = FLOATS[di];
        double tol = tol_for(dt);
        pair in = pair_new(dt, N * C, NULL, 2.0f), w = pair_new(TK_F32, C, NULL, 1.0f);
        pair b = pair_new(TK_F32, C, NULL, 1.0f), out = pair_new(dt, N * C, NULL, 1.0f);
        pair mean = pair_new(TK_F32, N, NULL, 1.0f), rstd = pair_new(TK_F32, N, NULL, 1.0f);
        pair dout = pair_new(dt, N * C, NULL, 1.0f), din = pair_new(dt, N * C, NULL, 1.0f);
        pair dw = pair_new(TK_F32, C, NULL, 1.0f), db = pair_new(TK_F32, C, NULL, 1.0f);
        BOTH(tk_op_layernorm_fwd(D, T(out), T(mean), T(rstd), T(in), T(w), T(b), N, C, 1e-12f));
        pair_cmp(&out, dt == TK_F32 ? 1e-4 : tol, "layernorm_fwd out");
        pair_cmp(&mean, 1e-4, "layernorm_fwd mean");
        pair_cmp(&rstd, 1e-5, "layernorm_fwd rstd");
        for (int acc = 0; acc < 2; acc++) {
            FRESH(din, dt, N * C);
            BOTH(tk_op_layernorm_bwd(D, T(din), T(dw), T(db), T(dout), T(in), T(w), T(mean), T(rstd),
                                     N, C, acc, NULL));
            pair_cmp(&din, dt == TK_F32 ? 1e-4 : tol, acc ? "layernorm_bwd din (accumulate)" : "layernorm_bwd din");
            pair_cmp(&dw, 1e-4, "layernorm_bwd dw");
            pair_cmp(&db, 1e-5, "layernorm_bwd db");
        }
        pair_free(&in); pair_free(&w); pair_free(&b); pair_free(&out); pair_free(&mean);
        pair_free(&rstd); pair_free(&dout); pair_free(&din); pair_free(&dw); pair_free(&db);
    }
}

static void test_softmax(void) {
    const int64_t B = 2, NH = 3, T_ = 300, rows = B * NH * T_;
    int32_t *mk = malloc((size_t)(B * T_) * sizeof(int32_t));
    for (int64_t i = 0; i < B * T_; i++) mk[i] = (i % T_) < (i < T_ ? 250 : 17); /* padded keys */
    for (int di = 0; di < 3; di++) {
        tk_dtype dt = FLOATS[di];
        double tol = tol_for(dt);
        pair mask = pair_i32(B * T_, mk);
        pair in = pair_new(dt, rows * T_, NULL, 8.0f), out = pair_new(dt, rows * T_, NULL, 1.0f);
        pair dout = pair_new(dt, rows * T_, NULL, 1.0f), din = pair_new(dt, rows * T_, NULL, 1.0f);
        BOTH(tk_op_softmax_fwd(D, T(out), T(in), T(mask), B, NH, T_, 0.125f));
        pair_cmp(&out, tol, "softmax_fwd");
        FRESH(out, dt, rows * T_);
        BOTH(tk_op_softmax_bwd(D, T(din), T(out), T(dout), rows, T_, 0.125f));
        pair_cmp(&din, dt == TK_F32 ? 1e-4 : tol, "softmax_bwd");
        pair_free(&mask); pair_free(&in); pair_free(&out); pair_free(&dout); pair_free(&din);
    }
    free(mk);
}

/* ---- fused attention ------------------------------------------------------
 *
 * One case: shape, mask lengths, q/k/v as slices of one QKV buffer or not.
 * attn_run() runs forward and backward on a device with TXK_ATTN_KERNEL set
 * to `kernel` (NULL: unset, the device's own pick) and returns host copies
 * of out, lse, dq, dk, dv, and with dropout the keep mask its forward wrote
 * (backward reads it): every backend and kernel must write the same bytes
 * (attn_same_keep). Inputs are the same values on every run: random,
 * rounded to the 16-bit dtype under test first, so an f32 run sees exactly
 * the values a 16-bit run does. Backward takes out and lse from `from` when
 * given (every run's backward then reads the same bytes), else from its own
 * forward.
 *
 * Judged as gpu_model judges 16-bit steps (tk_gpu.h's fused attention has no
 * exact answer in 16 bits): per tensor, on its scale (max |ref16|),
 * |x - ref16| <= 3 |ref16 - ref32| + 1e-3, where ref16 and ref32 are the
 * reference on 16-bit and on f32 tensors of the same values. f32 results:
 * within 1e-5 of the tensor's scale. */
typedef struct {
    int64_t B, NH, T, HS;
    int qkv;            /* q, k, v, dq, dk, dv: slices of (B*T, 3*NH*HS) buffers */
    const int *lens;    /* B kept-key counts: the first n keys, or for -n the last n (left padding) */
} attn_case;

enum { A_OUT, A_LSE, A_DQ, A_DK, A_DV, A_N };
static const char *const A_NAMES[A_N] = { "out", "lse", "dq", "dk", "dv" };
typedef struct { float *t[A_N]; int64_t n[A_N]; uint8_t *keep; int64_t nkeep; } attn_res; /* keep: p > 0 */

static void attn_res_free(attn_res *r) {
    for (int i = 0; i < A_N; i++) free(r->t[i]);
    free(r->keep);
    memset(r, 0, sizeof *r);
}

static float round_to(tk_dtype dt, float x) {
    return dt == TK_F16 ? tk_f16_to_f32(tk_f32_to_f16(x)) : dt == TK_BF16 ? tk_bf16_to_f32(tk_f32_to_bf16(x)) : x;
}

/* A tensor of n elements of dt on d holding host values h (NULL: none). */
static tk_tensor attn_tensor(tk_dev *d, tk_dtype dt, int64_t n, const float *h) {
    tk_tensor t = {0};
    tk_err err = {0};
    TK_CHECK_MSG(tk_tensor_alloc(d, &t, dt, 1, &n, TK_CAT_TEMP, "test", &err) == TK_OK, "%s", err.msg);
    if (h) TK_CHECK_MSG(tk_tensor_write_f32(d, &t, h, &err) == TK_OK, "%s", err.msg);
    return t;
}

static float *attn_back(tk_dev *d, const tk_tensor *t, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    tk_err err = {0};
    tk_tensor v = tk_tensor_view(t, 0, n);
    TK_CHECK_MSG(tk_tensor_read_f32(d, &v, h, &err) == TK_OK, "%s", err.msg);
    return h;
}

static void attn_env(const char *kernel) {
    if (kernel) setenv("TXK_ATTN_KERNEL", kernel, 1);
    else unsetenv("TXK_ATTN_KERNEL");
}

/* q, k, v (or dq, dk, dv) on d: three tensors, or three views of one
 * buffer *buf whose rows hold q, k and v side by side. h: 3 host arrays of
 * n = B*T*C values or NULL. */
static void attn_triple(tk_dev *d, tk_dtype dt, const attn_case *c, float *const *h, tk_tensor *buf, tk_tensor out[3]) {
    const int64_t C = c->NH * c->HS, rows = c->B * c->T, n = rows * C;
    memset(buf, 0, sizeof *buf);
    if (!c->qkv) {
        for (int j = 0; j < 3; j++) out[j] = attn_tensor(d, dt, n, h ? h[j] : NULL);
        return;
    }
    float *all = NULL;
    if (h) {
        all = malloc((size_t)(3 * n) * sizeof *all);
        for (int64_t r = 0; r < rows; r++)
            for (int j = 0; j < 3; j++) memcpy(all + r * 3 * C + j * C, h[j] + r * C, (size_t)C * sizeof *all);
    }
    *buf = attn_tensor(d, dt, 3 * n, all);
    for (int j = 0; j < 3; j++) out[j] = tk_tensor_view(buf, j * C, 3 * n - 2 * C);
    free(all);
}

/* Host copies of a triple, each as a (B*T, C) array. */
static void attn_triple_back(tk_dev *d, const attn_case *c, const tk_tensor t[3], float **h) {
    const int64_t C = c->NH * c->HS, rows = c->B * c->T, ld = c->qkv ? 3 * C : C;
    for (int j = 0; j < 3; j++) {
        float *all = attn_back(d, &t[j], (rows - 1) * ld + C);
        h[j] = malloc((size_t)(rows * C) * sizeof(float));
        for (int64_t r = 0; r < rows; r++) memcpy(h[j] + r * C, all + r * ld, (size_t)C * sizeof(float));
        free(all);
    }
}

static attn_res attn_run(tk_dev *d, const char *kernel, tk_dtype dt, const attn_case *c, float *const *in, float p,
                         const attn_res *from) {
    const int64_t C = c->NH * c->HS, n = c->B * c->T * C, nl = c->B * c->NH * c->T;
    attn_res r = { .n = { n, nl, n, n, n } };
    int32_t *mk = malloc((size_t)(c->B * c->T) * sizeof *mk);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->T; t++) mk[b * c->T + t] = c->lens[b] >= 0 ? t < c->lens[b] : t >= c->T + c->lens[b];
    tk_tensor mask = {0}, qb, dqb, qkv[3], dqkv[3];
    tk_err err = {0};
    int64_t bt = c->B * c->T;
    TK_CHECK(tk_tensor_alloc(d, &mask, TK_I32, 1, &bt, TK_CAT_INPUT, "test", &err) == TK_OK);
    TK_CHECK(tk_tensor_write(d, &mask, mk, &err) == TK_OK);
    attn_triple(d, dt, c, in, &qb, qkv);
    attn_triple(d, dt, c, NULL, &dqb, dqkv);
    tk_tensor g = attn_tensor(d, dt, n, in[3]), out = attn_tensor(d, dt, n, NULL), lse = attn_tensor(d, TK_F32, nl, NULL);
    tk_tensor keep = {0};
    r.nkeep = p > 0 ? tk_attn_keep_bytes(c->B, c->NH, c->T) : 0;
    if (p > 0) TK_CHECK(tk_tensor_alloc(d, &keep, TK_U8, 1, &r.nkeep, TK_CAT_TEMP, "test", &err) == TK_OK);
    const tk_attn a = { .B = c->B, .NH = c->NH, .T = c->T, .HS = c->HS, .ld = c->qkv ? 3 * C : C,
                        .scale = 1.0f / sqrtf((float)c->HS), .p = p, .seed = 5, .offset = 77 };
    attn_env(kernel);
    TK_CHECK_MSG(tk_op_attention_fwd(d, &out, &lse, p > 0 ? &keep : NULL, &qkv[0], &qkv[1], &qkv[2], &mask, &a) ==
                 TK_OK, "fwd: %s", tk_dev_last_err(d) ? tk_dev_last_err(d)->msg : "");
    TK_CHECK_MSG(tk_dev_sync(d, &err) == TK_OK, "%s", err.msg);
    if (p > 0) {
        r.keep = malloc((size_t)r.nkeep);
        TK_CHECK_MSG(tk_tensor_read(d, &keep, r.keep, &err) == TK_OK, "%s", err.msg);
    }
    r.t[A_OUT] = attn_back(d, &out, n);
    r.t[A_LSE] = attn_back(d, &lse, nl);
    if (from) {
        TK_CHECK(tk_tensor_write_f32(d, &out, from->t[A_OUT], &err) == TK_OK);
        TK_CHECK(tk_tensor_write_f32(d, &lse, from->t[A_LSE], &err) == TK_OK);
    }
    TK_CHECK_MSG(tk_op_attention_bwd(d, &dqkv[0], &dqkv[1], &dqkv[2], &g, &qkv[0], &qkv[1], &qkv[2], &out, &lse,
                                     p > 0 ? &keep : NULL, &mask, &a) == TK_OK,
                 "bwd: %s", tk_dev_last_err(d) ? tk_dev_last_err(d)->msg : "");
    TK_CHECK_MSG(tk_dev_sync(d, &err) == TK_OK, "%s", err.msg);
    attn_triple_back(d, c, dqkv, &r.t[A_DQ]);
    attn_env(NULL);
    if (c->qkv) {
        tk_tensor_free(d, &qb);
        tk_tensor_free(d, &dqb);
    } else {
        for (int j = 0; j < 3; j++) {
            tk_tensor_free(d, &qkv[j]);
            tk_tensor_free(d, &dqkv[j]);
        }
    }
    tk_tensor_free(d, &g);
    tk_tensor_free(d, &out);
    tk_tensor_free(d, &lse);
    tk_tensor_free(d, &keep);
    tk_tensor_free(d, &mask);
    free(mk);
    return r;
}

/* The keep masks of two runs (p > 0) are the same bytes: every backend and
 * kernel writes tk_ops_spec.h's bits in its order. */
static void attn_same_keep(const attn_res *x, const attn_res *ref, const char *what) {
    if (!ref->keep) return;
    TK_CHECK_MSG(x->keep && x->nkeep == ref->nkeep, "%s: no keep mask read back", what);
    if (!x->keep) return;
    int64_t at = -1;
    for (int64_t i = 0; i < x->nkeep && at < 0; i++)
        if (x->keep[i] != ref->keep[i]) at = i;
    TK_CHECK_MSG(at < 0, "%s: keep mask byte %lld is 0x%02x, the reference's 0x%02x (of %lld bytes)", what,
                 (long long)at, at < 0 ? 0 : x->keep[at], at < 0 ? 0 : ref->keep[at], (long long)x->nkeep);
}

/* Worst |a - b| over the largest |a|. */
static double attn_err(const float *a, const float *b, int64_t n, int64_t *at) {
    double mx = 0.0, worst = 0.0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(a[i]));
    if (mx < 1e-30) mx = 1e-30;
    *at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / mx;
        if (!(e <= worst) && !isnan(worst)) { worst = e; *at = i; } /* the first NaN stays worst */
    }
    return worst;
}

/* x against ref16, by the 16-bit rule with ref32 (NULL: f32, within 1e-5). */
static void attn_judge(const attn_res *x, const attn_res *ref16, const attn_res *ref32, const char *what) {
    for (int i = 0; i < A_N; i++) {
        int64_t at, at16;
        double e = attn_err(ref16->t[i], x->t[i], x->n[i], &at);
        double e16 = ref32 ? attn_err(ref16->t[i], ref32->t[i], x->n[i], &at16) : 0.0;
        double bound = ref32 ? 3.0 * e16 + 1e-3 : 1e-5;
        if (getenv("TXK_TEST_VERBOSE")) printf("  %s %s: %.3g (bound %.3g)\n", what, A_NAMES[i], e, bound);
        TK_CHECK_MSG(e <= bound, "%s %s: differs by %.3g of the tensor's scale at [%lld] (%.9g, reference %.9g); "
                     "16-bit rounding alone moves it %.3g, bound %.3g", what, A_NAMES[i], e, (long long)at,
                     x->t[i][at], ref16->t[i][at], e16, bound);
    }
}

static float **attn_inputs(const attn_case *c, tk_dtype dt, uint64_t seed) {
    const int64_t n = c->B * c->T * c->NH * c->HS;
    float **in = malloc(4 * sizeof *in);
    for (int j = 0; j < 4; j++) {
        in[j] = tk_test_uniform(n, seed + (uint64_t)j, 1.0f);
        for (int64_t i = 0; i < n; i++) in[j][i] = round_to(dt, in[j][i]);
    }
    return in;
}

static void attn_inputs_free(float **in) {
    for (int j = 0; j < 4; j++) free(in[j]);
    free(in);
}

/* Padded keys, a sequence with every key masked, and left padding whose
 * first 64 keys are all masked; head size 32, which the tensor-core kernels
 * do not cover (the reference runs). On the emulator: sizes that keep the
 * ASan build fast, with T not a multiple of 64, a head size of 16 and q/k/v
 * slices of one QKV buffer still in. */
static const int LENS_A[3] = { 77, 25, 0 }, LENS_B[1] = { 384 }, LENS_C[2] = { 50, 31 }, LENS_D[2] = { 130, -7 };
static const int LENS_E[3] = { 70, -6, 0 }, LENS_F[2] = { 20, 9 };
#ifndef TK_CUDA_EMU
static const attn_case ATTN_CASES[] = { { 3, 2, 77, 64, 0, LENS_A }, { 1, 2, 384, 64, 0, LENS_B },
                                        { 2, 3, 50, 16, 1, LENS_C }, { 2, 2, 130, 64, 1, LENS_D },
                                        { 2, 2, 50, 32, 0, LENS_C } };
#else
static const attn_case ATTN_CASES[] = { { 3, 2, 70, 64, 0, LENS_E }, { 2, 2, 20, 16, 1, LENS_F },
                                        { 1, 2, 20, 32, 0, LENS_F } };
#endif
#define N_ATTN_CASES ((int)(sizeof ATTN_CASES / sizeof ATTN_CASES[0]))

/* The device's fused attention (its own pick of kernel: the tensor-core one
 * for f16/bf16 where the card has it) against the cpu backend's, each
 * dtype, dropout on and off; a second backward repeats the first bit for
 * bit (no atomics). */
static void test_attention(void) {
    (void)LENS_A; (void)LENS_B; (void)LENS_C; (void)LENS_D; (void)LENS_E; (void)LENS_F;
    for (int ci = 0; ci < N_ATTN_CASES; ci++) {
        const attn_case *c = &ATTN_CASES[ci];
        for (int di = 0; di < 3; di++) {
            tk_dtype dt = FLOATS[di];
            float **in = attn_inputs(c, dt, 11 + (uint64_t)ci);
            for (int pi = 0; pi < 2; pi++) {
                const float p = pi ? 0.1f : 0.0f;
                char what[128];
                snprintf(what, sizeof what, "attention B=%lld T=%lld HS=%lld%s %s p=%g", (long long)c->B,
                         (long long)c->T, (long long)c->HS, c->qkv ? " qkv" : "", tk_dtype_name(dt), p);
                attn_res cpu = attn_run(g_cpu, NULL, dt, c, in, p, NULL);
                attn_res dev = attn_run(g_gpu, NULL, dt, c, in, p, &cpu);
                attn_res cpu32 = { 0 };
                if (dt != TK_F32) cpu32 = attn_run(g_cpu, NULL, TK_F32, c, in, p, &cpu);
                attn_judge(&dev, &cpu, dt != TK_F32 ? &cpu32 : NULL, what);
                attn_same_keep(&dev, &cpu, what);
                attn_res again = attn_run(g_gpu, NULL, dt, c, in, p, &cpu);
                for (int i = A_DQ; i < A_N; i++)
                    TK_CHECK_MSG(memcmp(dev.t[i], again.t[i], (size_t)dev.n[i] * sizeof(float)) == 0,
                                 "%s: a second cuda backward differs (%s)", what, A_NAMES[i]);
                attn_res_free(&cpu);
                attn_res_free(&dev);
                attn_res_free(&cpu32);
                attn_res_free(&again);
            }
            attn_inputs_free(in);
        }
    }
}

/* The tensor-core kernels against the reference kernel on the device, by
 * the 16-bit rule: the card's own pick (the sm80 path from sm80 up) and
 * TXK_ATTN_KERNEL=sm75 (T4's m16n8k8 path on any card), f16 and bf16,
 * dropout on and off. Backward reads the reference's out and lse in every
 * run. Where the rule picks a tensor-core kernel its results must differ
 * from the reference's somewhere (they sum in another order): the same
 * bytes would mean the call fell back; where it picks the reference (bf16
 * on the sm75 path) they must be the same bytes. */
static void test_attention_kernels(void) {
    tk_dev_info info;
    tk_dev_info_get(g_gpu, &info);
    const char *kernels[2] = { NULL, "sm75" };
    for (int ki = 0; ki < 2; ki++)
        for (int ci = 0; ci < N_ATTN_CASES; ci++) {
            const attn_case *c = &ATTN_CASES[ci];
            for (int di = 1; di < 3; di++) {
                tk_dtype dt = FLOATS[di];
                const tk_attn_kernel want = tk_attn_kernel_pick(info.cc_major, info.cc_minor, dt, c->HS,
                                                                tk_attn_kernel_ask(kernels[ki]), NULL);
                float **in = attn_inputs(c, dt, 23 + (uint64_t)ci);
                for (int pi = 0; pi < 2; pi++) {
                    const float p = pi ? 0.1f : 0.0f;
                    char what[160];
                    snprintf(what, sizeof what, "%s (TXK_ATTN_KERNEL=%s) B=%lld T=%lld HS=%lld%s %s p=%g",
                             tk_attn_kernel_name(want), kernels[ki] ? kernels[ki] : "", (long long)c->B,
                             (long long)c->T, (long long)c->HS, c->qkv ? " qkv" : "", tk_dtype_name(dt), p);
                    attn_res ref = attn_run(g_gpu, "reference", dt, c, in, p, NULL);
                    attn_res ref32 = attn_run(g_gpu, "reference", TK_F32, c, in, p, &ref);
                    attn_res fast = attn_run(g_gpu, kernels[ki], dt, c, in, p, &ref);
                    attn_judge(&fast, &ref, &ref32, what);
                    attn_same_keep(&fast, &ref, what);
                    int same = 1;
                    for (int i = 0; i < A_N; i++)
                        same &= memcmp(fast.t[i], ref.t[i], (size_t)fast.n[i] * sizeof(float)) == 0;
                    if (want == TK_ATTN_KERNEL_REFERENCE)
                        TK_CHECK_MSG(same, "%s: the reference kernel was to run, but the bytes differ", what);
                    else
                        TK_CHECK_MSG(!same, "%s: the same bytes as the reference kernel: the call fell back", what);
                    attn_res_free(&ref);
                    attn_res_free(&ref32);
                    attn_res_free(&fast);
                }
                attn_inputs_free(in);
            }
        }
    /* a value TXK_ATTN_KERNEL does not know is refused */
    const attn_case *c = &ATTN_CASES[0];
    attn_env("sm99");
    tk_tensor t = attn_tensor(g_gpu, TK_F16, c->B * c->T * c->NH * c->HS, NULL);
    tk_tensor l = attn_tensor(g_gpu, TK_F32, c->B * c->NH * c->T, NULL);
    const tk_attn a = { .B = c->B, .NH = c->NH, .T = c->T, .HS = c->HS, .scale = 0.125f };
    TK_CHECK_EQ_INT(tk_op_attention_fwd(g_gpu, &t, &l, NULL, &t, &t, &t, NULL, &a), TK_EINVAL);
    attn_env(NULL);
    tk_tensor_free(g_gpu, &t);
    tk_tensor_free(g_gpu, &l);
}

static void test_dropout(void) {
    const int64_t n = 100003;
    const float ps[3] = { 0.1f, 0.5f, 0.0f };
    for (int di = 0; di < 3; di++) {
        tk_dtype dt = FLOATS[di];
        for (int k = 0; k < 3; k++) {
            pair in = pair_new(dt, n, NULL, 1.0f), out = pair_new(dt, n, NULL, 1.0f);
            pair mask = pair_new(TK_U8, n, NULL, 0.0f);
            BOTH(tk_op_dropout_fwd(D, T(out), T(mask), T(in), n, ps[k], 1234 + k, 99));
            pair_same_bytes(&mask, "dropout mask");
            pair_same_bytes(&out, "dropout_fwd values");
            BOTH(tk_op_dropout_bwd(D, T(out), T(in), n, ps[k], 1234 + k, 99));
            pair_same_bytes(&out, "dropout_bwd values");
            pair_free(&in); pair_free(&out); pair_free(&mask);
        }
    }
}

static void test_xent(void) {
    const int64_t Ns[2] = { 13, 8 }, Vs[2] = { 7, 28996 };
    for (int s = 0; s < 2; s++) {
        int64_t N = Ns[s], V = Vs[s];
        int32_t lab[13];
        for (int i = 0; i < N; i++) lab[i] = (int32_t)((i * 5 + 1) % V);
        lab[2] = -100; /* ignored, as HF's -100 */
        for (int di = 0; di < 3; di++) {
            tk_dtype dt = FLOATS[di];
            double tol = tol_for(dt);
            pair labels = pair_i32(N, lab), logits = pair_new(dt, N * V, NULL, 6.0f);
            pair losses = pair_new(TK_F32, N, NULL, 1.0f), probs = pair_new(dt, N * V, NULL, 1.0f);
            pair dl = pair_new(dt, N * V, NULL, 1.0f);
            BOTH(tk_op_xent_fwd(D, T(losses), T(probs), T(logits), T(labels), N, V));
            pair_cmp(&losses, 1e-5, "xent_fwd losses");
            pair_cmp(&probs, dt == TK_F32 ? 1e-4 : tol, "xent_fwd probs");
            BOTH(tk_op_xent_fwd(D, T(losses), NULL, T(logits), T(labels), N, V));
            pair_cmp(&losses, 1e-5, "xent_fwd losses without probs");
            BOTH(tk_op_xent_bwd(D, T(dl), T(logits), T(labels), N, V, 1.0f / (float)N));
            pair_cmp(&dl, tol, "xent_bwd");
            pair_free(&labels); pair_free(&logits); pair_free(&losses); pair_free(&probs); pair_free(&dl);
        }
    }
}

static void test_bias_grad_heads(void) {
    for (int di = 0; di < 3; di++) {
        tk_dtype dt = FLOATS[di];
        const int64_t N = 700, C = 300;
        pair dout = pair_new(dt, N * C, NULL, 1.0f), db = pair_new(TK_F32, C, NULL, 1.0f);
        BOTH(tk_op_bias_grad(D, T(db), T(dout), N, C));
        pair_cmp(&db, 1e-4, "bias_grad");
        pair_free(&dout); pair_free(&db);
        const int64_t B = 2, Tn = 5, NH = 3, HS = 64, n = B * Tn * NH * HS;
        pair x = pair_new(dt, n, NULL, 1.0f), y = pair_new(dt, n, NULL, 1.0f);
        BOTH(tk_op_split_heads(D, T(y), T(x), B, Tn, NH, HS));
        pair_same_bytes(&y, "split_heads");
        BOTH(tk_op_merge_heads(D, T(x), T(y), B, Tn, NH, HS));
        pair_same_bytes(&x, "merge_heads");
        pair_free(&x); pair_free(&y);
    }
}

static void test_sumsq(void) {
    for (int di = 0; di < 3; di++) {
        const int64_t n = 1000003;
        pair x = pair_new(FLOATS[di], n, NULL, 1.0f), out = pair_new(TK_F32, 1, NULL, 1.0f);
        BOTH(tk_op_sumsq(D, T(out), T(x), n, 0));
        pair_cmp(&out, 1e-5, "sumsq");
        BOTH(tk_op_sumsq(D, T(out), T(x), n, 1));
        pair_cmp(&out, 1e-5, "sumsq accumulate");
        pair_free(&x); pair_free(&out);
    }
}

static void test_adamw(void) {
    const int64_t n = 1000;
    tk_adamw_hp hp = { .lr = 2e-5f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                       .weight_decay = 0.01f, .grad_scale = 0.5f, .step = 1 };
    for (int di = 0; di < 3; di++) {
        pair p = pair_new(TK_F32, n, NULL, 1.0f), m = pair_new(TK_F32, n, NULL, 0.0f);
        pair v = pair_new(TK_F32, n, NULL, 0.0f);
        for (hp.step = 1; hp.step <= 3; hp.step++) {
            pair g = pair_new(FLOATS[di], n, NULL, 1e-2f);
            BOTH(tk_op_adamw(D, T(p), T(g), T(m), T(v), n, &hp));
            pair_free(&g);
        }
        pair_same_bytes(&p, "adamw param (bitwise)");
        pair_same_bytes(&m, "adamw m (bitwise)");
        pair_same_bytes(&v, "adamw v (bitwise)");
        pair_free(&p); pair_free(&m); pair_free(&v);
    }
}

/* 8-bit AdamW: same codes and scales. Each side's arithmetic is correctly
 * rounded IEEE in the same order, so these are exact too. */
static void test_adamw8(void) {
    const int64_t n = 1000, nb = (n + TK_Q8_BLOCK - 1) / TK_Q8_BLOCK;
    tk_adamw_hp hp = { .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                       .weight_decay = 0.0f, .grad_scale = 1.0f, .step = 1 };
    pair p = pair_new(TK_F32, n, NULL, 1.0f);
    pair m = pair_new(TK_I8, n, NULL, 0.0f), v = pair_new(TK_U8, n, NULL, 0.0f);
    pair ms = pair_new(TK_F32, nb, NULL, 0.0f), vs = pair_new(TK_F32, nb, NULL, 0.0f);
    for (hp.step = 1; hp.step <= 4; hp.step++) {
        pair g = pair_new(TK_F32, n, NULL, 1e-1f);
        BOTH(tk_op_adamw8(D, T(p), T(g), T(m), T(ms), T(v), T(vs), n, &hp));
        pair_free(&g);
    }
    pair_same_bytes(&m, "adamw8 m codes");
    pair_same_bytes(&v, "adamw8 v codes");
    pair_same_bytes(&ms, "adamw8 m scales");
    pair_same_bytes(&vs, "adamw8 v scales");
    pair_cmp(&p, 1e-6, "adamw8 param");
    pair_free(&p); pair_free(&m); pair_free(&v); pair_free(&ms); pair_free(&vs);
}



/* The ops added for speed, cuda (fast kernels) against the cpu backend:
 * the grouped embedding backward and the AdamW table to the bit, the rest
 * within the tolerances of the ops they fuse. */
static void test_fused_ops(void) {
    const int64_t N = 21, C = 200;
    for (int di = 0; di < 3; di++) {
        tk_dtype dt = FLOATS[di];
        double tol = dt == TK_F32 ? 1e-4 : tol_for(dt);
        pair x = pair_new(dt, N * C, NULL, 2.0f), res = pair_new(dt, N * C, NULL, 1.0f);
        pair w = pair_new(TK_F32, C, NULL, 1.0f), b = pair_new(TK_F32, C, NULL, 1.0f), out = pair_new(dt, N * C, NULL, 1.0f);
        pair mean = pair_new(TK_F32, N, NULL, 1.0f), rstd = pair_new(TK_F32, N, NULL, 1.0f);
        BOTH(tk_op_residual_layernorm_fwd(D, T(x), T(out), T(mean), T(rstd), T(x), T(res), T(w), T(b), N, C, 1e-12f,
                                          0.1f, 4, 1000));
        pair_cmp(&x, tol, "residual_layernorm_fwd sum");
        pair_cmp(&out, dt == TK_F32 ? 1e-4 : tol, "residual_layernorm_fwd out");
        pair_cmp(&rstd, 1e-4, "residual_layernorm_fwd rstd");
        pair_sync_from_cpu(&x);
        pair_sync_from_cpu(&mean);
        pair_sync_from_cpu(&rstd);
        pair dw = pair_new(TK_F32, C, NULL, 1.0f), db = pair_new(TK_F32, C, NULL, 1.0f);
        pair scr = pair_new(TK_F32, tk_layernorm_bwd_scratch_numel(N, C), NULL, 0.0f);
        BOTH(tk_op_layernorm_bwd(D, T(res), T(dw), T(db), T(out), T(x), T(w), T(mean), T(rstd), N, C, 0, T(scr)));
        pair_cmp(&res, dt == TK_F32 ? 1e-4 : tol, "layernorm_bwd din (row groups)");
        pair_cmp(&dw, 1e-4, "layernorm_bwd dw (row groups)");
        pair_cmp(&db, 1e-4, "layernorm_bwd db (row groups)");
        pair_free(&x); pair_free(&res); pair_free(&w); pair_free(&b); pair_free(&out); pair_free(&mean);
        pair_free(&rstd); pair_free(&dw); pair_free(&db); pair_free(&scr);

        const int64_t B = 2, NH = 2, T_ = 24, np = B * NH * T_ * T_;
        int32_t mk[2 * 24];
        for (int i = 0; i < B * T_; i++) mk[i] = (i % T_) < (i < T_ ? T_ : 7);
        pair mask = pair_i32(B * T_, mk), P = pair_new(dt, np, NULL, 8.0f), PD = pair_new(dt, np, NULL, 1.0f);
        BOTH(tk_op_softmax_dropout_fwd(D, T(P), T(PD), T(P), T(mask), B, NH, T_, 0.125f, 0.1f, 8, 99));
        pair_cmp(&P, tol, "softmax_dropout_fwd P");
        pair_cmp(&PD, tol, "softmax_dropout_fwd PD");
        pair_sync_from_cpu(&P);
        BOTH(tk_op_softmax_dropout_bwd(D, T(PD), T(P), T(PD), B * NH * T_, T_, 0.125f, 0.1f, 8, 99));
        pair_cmp(&PD, dt == TK_F32 ? 1e-4 : tol, "softmax_dropout_bwd");
        pair_free(&mask); pair_free(&P); pair_free(&PD);

        /* token 1 at 3/4 of 300 positions: several chunks of TK_EMBED_CHUNK */
        enum { EN = 300, EV = 30, EC = 40 };
        int32_t ids[EN], *gr = malloc((size_t)tk_embed_groups_numel(EN) * sizeof *gr);
        for (int i = 0; i < EN; i++) ids[i] = i % 4 ? 1 : (int32_t)((i * 11) % EV);
        TK_CHECK_EQ_INT(tk_embed_groups_build(gr, ids, EN, EV), 0);
        pair idx = pair_i32(EN, ids), groups = pair_i32(tk_embed_groups_numel(EN), gr);
        pair table = pair_new(TK_F32, EV * EC, NULL, 1.0f), dout = pair_new(dt, EN * EC, NULL, 1.0f);
        pair escr = pair_new(TK_F32, tk_embed_bwd_scratch_numel(EN, EC), NULL, 0.0f);
        table.c.ndim = table.g.ndim = 2;
        table.c.shape[0] = table.g.shape[0] = EV;
        table.c.shape[1] = table.g.shape[1] = EC;
        BOTH(tk_op_embed_bwd(D, T(table), T(idx), T(dout), EN, EC, T(groups), T(escr)));
        pair_same_bytes(&table, "embed_bwd (grouped)");
        pair_free(&idx); pair_free(&groups); pair_free(&table); pair_free(&dout); pair_free(&escr);
        free(gr);

        /* the weight GEMM with the bias gradient in its epilogue */
        const int64_t R = 48, I = 40, O = 24;
        pair dy = pair_new(dt, R * O, NULL, 1.0f), xin = pair_new(dt, R * I, NULL, 1.0f);
        pair dW = pair_new(TK_F32, O * I, NULL, 1.0f), dB = pair_new(TK_F32, O, NULL, 1.0f);
        pair tmp = pair_new(TK_F32, O, NULL, 0.0f);
        BOTH(tk_op_gemm(D, T(dW), T(dy), T(xin), NULL, &(tk_gemm){ .m = O, .n = I, .k = R, .trans_a = 1, .batch = 1, .alpha = 1.0f, .beta = 1.0f, .bgrad = T(dB), .bgrad_tmp = T(tmp) }));
        pair_cmp(&dW, dt == TK_F32 ? 1e-5 : 1e-4, "gemm dW");
        pair_cmp(&dB, 1e-4, "gemm bias gradient");
        pair_free(&dy); pair_free(&xin); pair_free(&dW); pair_free(&dB); pair_free(&tmp);

        /* the tables: AdamW bitwise (one operation order), the norm in f64 */
        pair p0 = pair_new(TK_F32, 1000, NULL, 1.0f), g0 = pair_new(dt, 1000, NULL, 0.1f);
        pair m0 = pair_new(TK_F32, 1000, NULL, 0.0f), v0 = pair_new(TK_F32, 1000, NULL, 0.0f);
        pair p1 = pair_new(TK_F32, 77, NULL, 1.0f), g1 = pair_new(dt, 77, NULL, 0.1f);
        pair m1 = pair_new(TK_F32, 77, NULL, 0.0f), v1 = pair_new(TK_F32, 77, NULL, 0.0f);
        pair nrm = pair_new(TK_F32, 1, NULL, 0.0f);
        tk_adamw_hp hp = { .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                           .grad_scale = 0.5f, .step = 1 };
        for (int S_ = 0; S_ < 2; S_++) {
            tk_dev *D = S_ ? g_gpu : g_cpu;
            tk_adamw_item it[2] = {
                { .param = *T(p0), .grad = *T(g0), .m = *T(m0), .v = *T(v0), .n = 1000 },
                { .param = *T(p1), .grad = *T(g1), .m = *T(m1), .v = *T(v1), .n = 77, .no_decay = 1 },
            };
            const tk_tensor *xs[2] = { T(g0), T(g1) };
            tk_tensor *gs[2] = { T(g0), T(g1) };
            TK_CHECK(tk_op_sumsq_many(D, T(nrm), xs, 2) == TK_OK);
            TK_CHECK(tk_op_adamw_many(D, it, 2, &hp) == TK_OK);
            TK_CHECK(tk_op_fill_many(D, gs, 2, 0.0f) == TK_OK);
        }
        pair_cmp(&nrm, 1e-6, "sumsq_many");
        pair_same_bytes(&p0, "adamw_many param (bitwise)");
        pair_same_bytes(&v1, "adamw_many v, no decay (bitwise)");
        pair_same_bytes(&g1, "fill_many");
        pair_free(&p0); pair_free(&g0); pair_free(&m0); pair_free(&v0); pair_free(&p1); pair_free(&g1);
        pair_free(&m1); pair_free(&v1); pair_free(&nrm);
    }
}

/* ---- fast kernels against their references, on the cuda device ------------
 * Each op runs three times on the cuda device from the same values: fast
 * kernels with dtype dt, reference kernels with dt, reference kernels with
 * every float tensor in f32. gpu_model's 16-bit rule, per output tensor on
 * its scale: |fast - ref| <= 3 |ref16 - ref32| + 1e-3; in f32, where ref16
 * is ref32, gpu_model's fp32 bound instead: 1e-4 of the scale (the sums run
 * in other orders, nothing else may differ). */

enum { K_FLT, K_F32, K_I32 };   /* follows dt / always f32 / fixed ints */
/* values uniform in [-scale, scale), or [0, -scale) when scale < 0 (AdamW's v) */
typedef struct { int kind; int64_t n; float scale; int out; const int32_t *ints; } fr_spec;
typedef tk_status (*fr_op)(tk_dev *d, tk_tensor **t, const void *arg);

#define FR_MAX 10

static void fr_alloc(tk_tensor *t, const fr_spec *sp, tk_dtype dt) {
    int64_t shape[1] = { sp->n };
    tk_err err = {0};
    tk_dtype want = sp->kind == K_FLT ? dt : sp->kind == K_F32 ? TK_F32 : TK_I32;
    TK_CHECK_MSG(tk_tensor_alloc(g_gpu, t, want, 1, shape, TK_CAT_TEMP, "test", &err) == TK_OK, "%s", err.msg);
}

static float *fr_read(tk_tensor *t, int64_t n) {
    tk_err err = {0};
    float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    TK_CHECK_MSG(tk_dev_sync(g_gpu, &err) == TK_OK, "sync: %s", err.msg);
    TK_CHECK_MSG(tk_tensor_read_f32(g_gpu, t, h, &err) == TK_OK, "%s", err.msg);
    return h;
}

/* max |a - b| over max(max |b|, 1e-30) */
static double fr_err(const float *a, const float *b, int64_t n) {
    double mx = 0, e = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d; /* NaN counts */
    }
    return e / fmax(mx, 1e-30);
}

static void fast_vs_ref(const char *what, fr_op op, const void *arg, const fr_spec *sp, int nt) {
    for (int di = 0; di < 3; di++) {
        tk_dtype dt = FLOATS[di];
        tk_tensor set[3][FR_MAX];
        memset(set, 0, sizeof set);
        for (int i = 0; i < nt; i++) {
            for (int r = 0; r < 3; r++) fr_alloc(&set[r][i], &sp[i], r == 2 ? TK_F32 : dt);
            tk_err err = {0};
            if (sp[i].kind == K_I32) {
                for (int r = 0; r < 3; r++) TK_CHECK(tk_tensor_write(g_gpu, &set[r][i], sp[i].ints, &err) == TK_OK);
                continue;
            }
            float *h = malloc((size_t)sp[i].n * sizeof *h);
            for (int64_t k = 0; k < sp[i].n; k++) h[k] = sp[i].scale < 0 ? fabsf(sp[i].scale * frand()) : sp[i].scale * frand();
            TK_CHECK(tk_tensor_write_f32(g_gpu, &set[0][i], h, &err) == TK_OK);
            free(h);
            h = fr_read(&set[0][i], sp[i].n); /* the values dt holds, the same in every set */
            for (int r = 1; r < 3; r++) TK_CHECK(tk_tensor_write_f32(g_gpu, &set[r][i], h, &err) == TK_OK);
            free(h);
        }
        for (int r = 0; r < 3; r++) {
            tk_tensor *tp[FR_MAX];
            for (int i = 0; i < nt; i++) tp[i] = &set[r][i];
            TK_CHECK(gpu_reference(r != 0));
            TK_CHECK_MSG(op(g_gpu, tp, arg) == TK_OK, "%s %s run %d: %s", what, tk_dtype_name(dt), r,
                         tk_dev_last_err(g_gpu) ? tk_dev_last_err(g_gpu)->msg : "");
        }
        gpu_reference(0);
        for (int i = 0; i < nt; i++) {
            if (sp[i].out) {
                float *fa = fr_read(&set[0][i], sp[i].n), *rf = fr_read(&set[1][i], sp[i].n);
                float *r32 = fr_read(&set[2][i], sp[i].n);
                double e = fr_err(fa, rf, sp[i].n), e16 = fr_err(rf, r32, sp[i].n);
                double bound = dt == TK_F32 ? 1e-4 : 3 * e16 + 1e-3;
                TK_CHECK_MSG(e <= bound, "%s %s output %d: fast differs from the reference by %.3g of its scale; "
                             "16-bit rounding alone moves it %.3g, bound %.3g", what, tk_dtype_name(dt), i, e, e16,
                             bound);
                free(fa); free(rf); free(r32);
            }
            for (int r = 0; r < 3; r++) tk_tensor_free(g_gpu, &set[r][i]);
        }
    }
}

typedef struct { int64_t N, C, B, NH, T, n; float p; } fr_shape;

static tk_status op_ln_fwd(tk_dev *d, tk_tensor **t, const void *a) {
    const fr_shape *s = a;
    return tk_op_layernorm_fwd(d, t[0], t[1], t[2], t[3], t[4], t[5], s->N, s->C, 1e-12f);
}
static tk_status op_res_ln(tk_dev *d, tk_tensor **t, const void *a) {
    const fr_shape *s = a;
    return tk_op_residual_layernorm_fwd(d, t[0], t[1], t[2], t[3], t[0], t[4], t[5], t[6], s->N, s->C, 1e-12f, s->p,
                                        9, 1234);
}
/* t: din, dw, db, dout, in, w, mean, rstd, scratch */
static tk_status op_ln_bwd(tk_dev *d, tk_tensor **t, const void *a) {
    const fr_shape *s = a;
    return tk_op_layernorm_bwd(d, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], s->N, s->C, 0, t[8]);
}
/* t: P (in: the scores), PD, mask */
static tk_status op_sm_drop_fwd(tk_dev *d, tk_tensor **t, const void *a) {
    const fr_shape *s = a;
    return tk_op_softmax_dropout_fwd(d, t[0], t[1], t[0], t[2], s->B, s->NH, s->T, 0.125f, s->p, 3, 77);
}
/* t: dPD (becomes din), P */
static tk_status op_sm_drop_bwd(tk_dev *d, tk_tensor **t, const void *a) {
    const fr_shape *s = a;
    return tk_op_softmax_dropout_bwd(d, t[0], t[1], t[0], s->B * s->NH * s->T, s->T, 0.125f, s->p, 3, 77);
}
/* t: dtable, ids, dout, groups, scratch */
static tk_status op_embed_bwd(tk_dev *d, tk_tensor **t, const void *a) {
    const fr_shape *s = a;
    return tk_op_embed_bwd(d, t[0], t[1], t[2], s->n, s->C, t[3], t[4]);
}
/* t: out, a, b (gelu_fwd, gelu_bwd into b, add, cast to a, dropout) */
static tk_status op_elementwise(tk_dev *d, tk_tensor **t, const void *a) {
    const fr_shape *s = a;
    tk_status st = tk_op_gelu_fwd(d, t[0], t[1], s->n);
    if (st == TK_OK) st = tk_op_gelu_bwd(d, t[2], t[1], t[2], s->n);
    if (st == TK_OK) st = tk_op_add(d, t[0], t[0], t[2], s->n);
    if (st == TK_OK) st = tk_op_dropout_fwd(d, t[2], NULL, t[2], s->n, 0.2f, 5, 11);
    if (st == TK_OK) st = tk_op_axpby(d, t[2], 0.5f, t[1], 2.0f, s->n);
    return st == TK_OK ? tk_op_cast(d, t[3], t[0], s->n) : st;
}
/* t: C, A, B, bias, dW (f32), dWb (f32 bias gradient), tmp (f32), A2 */
static tk_status op_linear(tk_dev *d, tk_tensor **t, const void *a) {
    const fr_shape *s = a; /* rows N, in C, out T */
    tk_status st = tk_op_gemm(d, t[0], t[1], t[2], t[3], &(tk_gemm){ .m = s->N, .n = s->T, .k = s->C, .trans_b = 1, .batch = 1, .alpha = 1.0f });
    return st == TK_OK ? tk_op_gemm(d, t[4], t[7], t[1], NULL, &(tk_gemm){ .m = s->T, .n = s->C, .k = s->N, .trans_a = 1, .batch = 1, .alpha = 1.0f, .beta = 1.0f, .bgrad = t[5], .bgrad_tmp = t[6] }) : st;
}
/* t: p0, g0, m0, v0, p1, g1, m1, v1 (two parameters), norm, and fill over g0, g1 */
static tk_status op_tables(tk_dev *d, tk_tensor **t, const void *a) {
    const fr_shape *s = a;
    const tk_tensor *xs[2] = { t[1], t[5] };
    tk_status st = tk_op_sumsq_many(d, t[8], xs, 2);
    tk_adamw_hp hp = { .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                       .grad_scale = 0.5f, .step = 2 };
    tk_adamw_item it[2] = {
        { .param = *t[0], .grad = *t[1], .m = *t[2], .v = *t[3], .n = s->n, .no_decay = 0 },
        { .param = *t[4], .grad = *t[5], .m = *t[6], .v = *t[7], .n = s->C, .no_decay = 1 },
    };
    if (st == TK_OK) st = tk_op_adamw_many(d, it, 2, &hp);
    tk_tensor *gs[2] = { t[1], t[5] };
    return st == TK_OK ? tk_op_fill_many(d, gs, 2, 0.25f) : st;
}

static void test_fast_vs_reference(void) {
    if (!gpu_reference(0)) {
        TK_CHECK_MSG(0, "the plugin has no tk_cuda_set_reference: its fast kernels cannot be checked");
        return;
    }
    const int64_t N = 37, C = 264; /* C a multiple of 8: the fast kernels' shape; N not of 8 */
    fr_shape ln = { .N = N, .C = C, .p = 0.1f };
    fr_spec lnf[] = { { K_FLT, N * C, 1, 1, NULL }, { K_F32, N, 1, 1, NULL }, { K_F32, N, 1, 1, NULL },
                      { K_FLT, N * C, 2, 0, NULL }, { K_F32, C, 1, 0, NULL }, { K_F32, C, 1, 0, NULL } };
    fast_vs_ref("layernorm_fwd", op_ln_fwd, &ln, lnf, 6);
    fr_spec rln[] = { { K_FLT, N * C, 2, 1, NULL }, { K_FLT, N * C, 1, 1, NULL }, { K_F32, N, 1, 1, NULL },
                      { K_F32, N, 1, 1, NULL }, { K_FLT, N * C, 2, 0, NULL }, { K_F32, C, 1, 0, NULL },
                      { K_F32, C, 1, 0, NULL } };
    fast_vs_ref("residual_layernorm_fwd", op_res_ln, &ln, rln, 7);
    fr_spec lnb[] = { { K_FLT, N * C, 1, 1, NULL }, { K_F32, C, 1, 1, NULL }, { K_F32, C, 1, 1, NULL },
                      { K_FLT, N * C, 1, 0, NULL }, { K_FLT, N * C, 2, 0, NULL }, { K_F32, C, 1, 0, NULL },
                      { K_F32, N, 0.1f, 0, NULL }, { K_F32, N, 1, 0, NULL },
                      { K_F32, tk_layernorm_bwd_scratch_numel(N, C), 0, 0, NULL } };
    fast_vs_ref("layernorm_bwd", op_ln_bwd, &ln, lnb, 9);

    enum { SB = 2, SNH = 3, ST = 40 };
    static int32_t mk[SB * ST];
    for (int i = 0; i < SB * ST; i++) mk[i] = (i % ST) < (i < ST ? ST : 13);
    fr_shape sm = { .B = SB, .NH = SNH, .T = ST, .p = 0.1f };
    const int64_t np = (int64_t)SB * SNH * ST * ST;
    fr_spec smf[] = { { K_FLT, np, 8, 1, NULL }, { K_FLT, np, 1, 1, NULL }, { K_I32, SB * ST, 0, 0, mk } };
    fast_vs_ref("softmax_dropout_fwd", op_sm_drop_fwd, &sm, smf, 3);
    fr_spec smb[] = { { K_FLT, np, 1, 1, NULL }, { K_FLT, np, 0.05f, 0, NULL } };
    fast_vs_ref("softmax_dropout_bwd", op_sm_drop_bwd, &sm, smb, 2);

    /* token 3 at 150 positions (three chunks), the rest spread over 20 rows */
    enum { EN = 400, EV = 24, EC = 72 };
    static int32_t ids[EN], groups[5 * EN + 6];
    for (int i = 0; i < EN; i++) ids[i] = i % 8 < 3 ? 3 : (int32_t)((i * 7) % 20);
    TK_CHECK_EQ_INT(tk_embed_groups_build(groups, ids, EN, EV), 0);
    fr_shape em = { .n = EN, .C = EC };
    fr_spec emb[] = { { K_F32, EV * EC, 1, 1, NULL }, { K_I32, EN, 0, 0, ids }, { K_FLT, EN * EC, 1, 0, NULL },
                      { K_I32, tk_embed_groups_numel(EN), 0, 0, groups },
                      { K_F32, tk_embed_bwd_scratch_numel(EN, EC), 0, 0, NULL } };
    fast_vs_ref("embed_bwd (grouped)", op_embed_bwd, &em, emb, 5);

    const int64_t n = 8 * 1000;
    fr_shape el = { .n = n };
    fr_spec elw[] = { { K_FLT, n, 1, 1, NULL }, { K_FLT, n, 3, 0, NULL }, { K_FLT, n, 1, 1, NULL },
                      { K_F32, n, 1, 1, NULL } };
    fast_vs_ref("gelu, add, dropout, axpby, cast", op_elementwise, &el, elw, 4);

    const int64_t LN_ = 48, LI = 40, LO = 24; /* rows, in, out */
    fr_shape li = { .N = LN_, .C = LI, .T = LO };
    fr_spec lin[] = { { K_FLT, LN_ * LO, 1, 1, NULL }, { K_FLT, LN_ * LI, 1, 0, NULL }, { K_FLT, LO * LI, 1, 0, NULL },
                      { K_F32, LO, 1, 0, NULL }, { K_F32, LO * LI, 1, 1, NULL }, { K_F32, LO, 1, 1, NULL },
                      { K_F32, LO, 0, 0, NULL }, { K_FLT, LN_ * LO, 1, 0, NULL } };
    fast_vs_ref("gemm: bias epilogue, bias gradient", op_linear, &li, lin, 8);

    fr_shape tb = { .n = 3000, .C = 333 };
    fr_spec tab[] = { { K_F32, 3000, 1, 1, NULL }, { K_FLT, 3000, 0.1f, 1, NULL }, { K_F32, 3000, 0.01f, 1, NULL },
                      { K_F32, 3000, -0.01f, 1, NULL }, { K_F32, 333, 1, 1, NULL }, { K_FLT, 333, 0.1f, 1, NULL },
                      { K_F32, 333, 0.01f, 1, NULL }, { K_F32, 333, -0.01f, 1, NULL }, { K_F32, 1, 0, 1, NULL } };
    fast_vs_ref("sumsq, adamw and fill over tables", op_tables, &tb, tab, 9);
}

/* A token id past the table: the cuda op cannot fail synchronously, so the
 * next sync reports it, once, and the device stays usable. */
static void test_bad_index_reported(void) {
    tk_err err = {0};
    int32_t ids[2] = { 1, 500 };
    pair table = pair_new(TK_F32, 10 * 8, NULL, 1.0f);
    table.g.ndim = 2; table.g.shape[0] = 10; table.g.shape[1] = 8;
    pair idx = pair_i32(2, ids), out = pair_new(TK_F32, 16, NULL, 1.0f);
    TK_CHECK_EQ_INT(tk_op_embed_fwd(g_gpu, &out.g, &idx.g, &table.g, 2, 8), TK_OK);
    TK_CHECK_EQ_INT(tk_dev_sync(g_gpu, &err), TK_EINVAL);
    TK_CHECK(strstr(err.msg, "outside") != NULL);
    TK_CHECK_EQ_INT(tk_dev_sync(g_gpu, &err), TK_OK);
    pair_free(&table); pair_free(&idx); pair_free(&out);
}

int main(void) {
    if (!gpu_open()) {
        gpu_close();
        printf("0 passed, 1 failed\n");
        return 1;
    }
    tk_dev_info info;
    tk_dev_info_get(g_gpu, &info);
    fprintf(stderr, "cuda device: %s (cc %d.%d, driver %s, runtime %s)\n", info.name, info.cc_major,
            info.cc_minor, info.driver, info.runtime);
    TK_RUN(test_gemm);
    TK_RUN(test_lt_declines);
    TK_RUN(test_embed_gather_scatter);
    TK_RUN(test_elementwise);
    TK_RUN(test_layernorm);
    TK_RUN(test_softmax);
    TK_RUN(test_dropout);
    TK_RUN(test_attention);
    TK_RUN(test_attention_kernels);
    TK_RUN(test_xent);
    TK_RUN(test_bias_grad_heads);
    TK_RUN(test_sumsq);
    TK_RUN(test_adamw);
    TK_RUN(test_adamw8);
    TK_RUN(test_bad_index_reported);
    TK_RUN(test_fused_ops);
    TK_RUN(test_fast_vs_reference);
    gpu_close();
    return tk_test_done();
}
