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
    gpu_close();
    return tk_test_done();
}
