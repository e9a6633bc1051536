/* gpu_ops.c — every op of the cuda backend against the cpu backend.
 *
 * Same random inputs on both devices, same op through the public tk_op_*
 * API, results compared within the tolerances in gpu_common.h. Ops that
 * move or select data (cast, heads, gather, embedding forward, dropout
 * masks and values, fill) must agree byte for byte, and so must the f32
 * AdamW step (both sides follow one operation order without FMA); fused
 * attention must also repeat itself bit for bit. Sizes are
 * odd on purpose: rows not a multiple of the block size, partial q8 blocks.
 */
#include "gpu_common.h"

/* Runs `call` on the cpu device and then on the cuda device; inside it, D is
 * the device and T(p) the pair's tensor on that device. */
#define BOTH(call) do { tk_dev *D = g_cpu; int S_ = 0; \
    TK_CHECK_MSG((call) == TK_OK, "cpu: %s", #call); \
    D = g_gpu; S_ = 1; \
    TK_CHECK_MSG((call) == TK_OK, "cuda: %s", #call); (void)D; (void)S_; } while (0)
#define T(p) (S_ ? &(p).g : &(p).c)

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

/* Fused attention (cuda_attention.h's tiles) against the cpu backend's:
 * padded keys, a sequence with every key masked, dropout on and off, T not a
 * multiple of either tile, each float dtype. Backward gets the cpu's out and
 * lse on both sides. A second cuda run must repeat the first bit for bit
 * (no atomics). */
static void test_attention(void) {
    const int64_t shapes[2][4] = { { 3, 2, 77, 64 }, { 1, 2, 384, 64 } };
    for (int si = 0; si < 2; si++) {
        const int64_t B = shapes[si][0], NH = shapes[si][1], T_ = shapes[si][2], HS = shapes[si][3];
        const int64_t n = B * NH * T_ * HS, nl = B * NH * T_;
        int32_t *mk = malloc((size_t)(B * T_) * sizeof(int32_t));
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T_; t++) mk[b * T_ + t] = t < (b == 0 ? T_ : b == 1 ? T_ / 3 : 0);
        pair mask = pair_i32(B * T_, mk);
        for (int di = 0; di < 3; di++) {
            tk_dtype dt = FLOATS[di];
            double tol = dt == TK_F32 ? 1e-4 : tol_for(dt);
            for (int pi = 0; pi < 2; pi++) {
                float p = pi ? 0.1f : 0.0f;
                char what[96];
                pair q = pair_new(dt, n, NULL, 1.0f), k = pair_new(dt, n, NULL, 1.0f), v = pair_new(dt, n, NULL, 1.0f);
                pair g = pair_new(dt, n, NULL, 1.0f), out = pair_new(dt, n, NULL, 1.0f);
                pair lse = pair_new(TK_F32, nl, NULL, 1.0f);
                pair dq = pair_new(dt, n, NULL, 1.0f), dk = pair_new(dt, n, NULL, 1.0f), dv = pair_new(dt, n, NULL, 1.0f);
                BOTH(tk_op_attention_fwd(D, T(out), T(lse), T(q), T(k), T(v), T(mask), B, NH, T_, HS, 0.125f, p, 5, 77));
                snprintf(what, sizeof what, "attention_fwd T=%lld %s p=%g out", (long long)T_, tk_dtype_name(dt), p);
                pair_cmp(&out, tol, what);
                snprintf(what, sizeof what, "attention_fwd T=%lld %s p=%g lse", (long long)T_, tk_dtype_name(dt), p);
                pair_cmp(&lse, 1e-5, what);
                pair_sync_from_cpu(&out);
                pair_sync_from_cpu(&lse);
                BOTH(tk_op_attention_bwd(D, T(dq), T(dk), T(dv), T(g), T(q), T(k), T(v), T(out), T(lse), T(mask),
                                         B, NH, T_, HS, 0.125f, p, 5, 77));
                pair *grads[3] = { &dq, &dk, &dv };
                const char *gn[3] = { "dq", "dk", "dv" };
                for (int i = 0; i < 3; i++) {
                    snprintf(what, sizeof what, "attention_bwd T=%lld %s p=%g %s", (long long)T_, tk_dtype_name(dt), p,
                             gn[i]);
                    pair_cmp(grads[i], tol, what);
                }
                /* determinism: the cuda backward again, same bytes */
                tk_err err = {0};
                size_t nb = tk_tensor_nbytes(&dk.g);
                void *h1 = malloc(nb), *h2 = malloc(nb);
                TK_CHECK(tk_tensor_read(g_gpu, &dk.g, h1, &err) == TK_OK);
                TK_CHECK(tk_op_attention_bwd(g_gpu, &dq.g, &dk.g, &dv.g, &g.g, &q.g, &k.g, &v.g, &out.g, &lse.g,
                                             &mask.g, B, NH, T_, HS, 0.125f, p, 5, 77) == TK_OK);
                TK_CHECK(tk_tensor_read(g_gpu, &dk.g, h2, &err) == TK_OK);
                TK_CHECK_MSG(memcmp(h1, h2, nb) == 0, "attention_bwd: a second cuda run differs");
                free(h1);
                free(h2);
                pair_free(&q); pair_free(&k); pair_free(&v); pair_free(&g); pair_free(&out); pair_free(&lse);
                pair_free(&dq); pair_free(&dk); pair_free(&dv);
            }
        }
        pair_free(&mask);
        free(mk);
    }
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
    TK_RUN(test_embed_gather_scatter);
    TK_RUN(test_elementwise);
    TK_RUN(test_layernorm);
    TK_RUN(test_softmax);
    TK_RUN(test_dropout);
#ifndef TK_CUDA_EMU
    TK_RUN(test_attention);
#else /* emulated phase by phase in tests/gpu_cuda_host/test_cuda_attention.c */
    (void)test_attention;
#endif
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
