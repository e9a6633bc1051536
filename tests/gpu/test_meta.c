/* test_meta.c — devices, tensors and op wrappers: the meta device's simulated
 * capacity and OOM record/message, op argument checks and cost counting, the
 * cuda loader's fallback, and the planner's promise — a scripted op sequence
 * on meta and on cpu makes the same allocation events and reaches the same
 * peaks, byte for byte. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tk_backend_impl.h"
#include "tk_test.h"

#define MiB ((size_t)1 << 20)

static tk_dev *open_dev(tk_dev_kind kind, size_t cap) {
    tk_dev_opts o = {.kind = kind, .capacity = cap, .threads = 1};
    tk_err err = {0};
    tk_dev *d = tk_dev_new(&o, &err);
    TK_CHECK_MSG(d != NULL, "%s", err.msg);
    return d;
}

static void test_meta_device(void) {
    tk_dev *d = open_dev(TK_DEV_META, 100 * MiB);
    if (!d) return;
    TK_CHECK(tk_dev_kind_of(d) == TK_DEV_META);
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    TK_CHECK_STR(info.name, "meta");
    TK_CHECK_EQ_INT(info.simulated, 1);
    TK_CHECK_EQ_INT(info.total, 100 * MiB);
    TK_CHECK_EQ_INT(info.free_bytes, 100 * MiB);
    TK_CHECK(tk_dev_last_oom(d) == NULL);
    tk_tensor t;
    tk_err err = {0};
    int64_t shape[2] = {768, 3072};
    TK_CHECK(tk_tensor_alloc(d, &t, TK_F32, 2, shape, TK_CAT_PARAM,
                             "bert.encoder.layer.0.intermediate.dense", &err) == TK_OK);
    TK_CHECK(t.data != NULL && t.owns == 1);
    TK_CHECK_EQ_INT(tk_tensor_numel(&t), 768 * 3072);
    TK_CHECK_EQ_INT(tk_tensor_nbytes(&t), 768 * 3072 * 4);
    tk_dev_info_get(d, &info);
    TK_CHECK_EQ_INT(info.free_bytes, 100 * MiB - 20 * MiB); /* 9 MiB < 10 MiB: a 20 MiB large segment */
    /* copies on meta succeed and touch nothing */
    float host[4] = {1, 2, 3, 4};
    tk_tensor v = tk_tensor_view(&t, 10, 4);
    TK_CHECK(v.owns == 0 && v.ndim == 1 && v.shape[0] == 4);
    TK_CHECK((char *)v.data == (char *)t.data + 40);
    TK_CHECK(tk_tensor_write_f32(d, &v, host, &err) == TK_OK);
    TK_CHECK(tk_tensor_read_f32(d, &v, host, &err) == TK_OK);
    TK_CHECK(host[3] == 4);
    tk_tensor_free(d, &v); /* a view frees nothing */
    TK_CHECK_EQ_INT(tk_tensor_numel(&v), 1); /* zeroed: ndim 0 */
    int id = tk_alloc_owner_id(tk_dev_alloc(d), "bert.encoder.layer.0.intermediate.dense");
    TK_CHECK_EQ_INT(tk_alloc_owner_live(tk_dev_alloc(d), id, TK_CAT_PARAM), 768 * 3072 * 4);
    tk_tensor_free(d, &t);
    TK_CHECK(t.data == NULL);
    TK_CHECK_EQ_INT(tk_alloc_owner_live(tk_dev_alloc(d), id, TK_CAT_PARAM), 0);
    tk_dev_destroy(&d);
    TK_CHECK(d == NULL);
    tk_dev_destroy(&d);
}

static void test_oom_record_and_message(void) {
    tk_dev *d = open_dev(TK_DEV_META, 30 * MiB);
    if (!d) return;
    tk_tensor t[3];
    tk_err err = {0};
    int64_t shape[1] = {3 * 1024 * 1024}; /* 12 MiB f32 */
    TK_CHECK(tk_tensor_alloc(d, &t[0], TK_F32, 1, shape, TK_CAT_ACT, "classifier", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &t[1], TK_F32, 1, shape, TK_CAT_GRAD, "classifier", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &t[2], TK_F32, 1, shape, TK_CAT_ACT, "bert.pooler.dense", &err) == TK_EOOM);
    TK_CHECK(t[2].data == NULL && t[2].ndim == 0);
    TK_CHECK(err.status == TK_EOOM);
    TK_CHECK_MSG(strstr(err.msg, "tried to allocate 12.00 MiB for bert.pooler.dense (act, f32 [3145728])") != NULL, "%s", err.msg);
    TK_CHECK_MSG(strstr(err.msg, "Device meta has a simulated capacity of 30.00 MiB of which 6.00 MiB is free") != NULL, "%s", err.msg);
    TK_CHECK(strchr(err.msg, '\n') == NULL);
    TK_CHECK_MSG(strstr(err.msg, "24.00 MiB is allocated and 24.00 MiB reserved") != NULL, "%s", err.msg);
    const tk_oom *o = tk_dev_last_oom(d);
    TK_CHECK(o != NULL);
    if (o) {
        TK_CHECK_EQ_INT(o->requested, 12 * MiB);
        TK_CHECK_EQ_INT(o->capacity, 30 * MiB);
        TK_CHECK_EQ_INT(o->by_cat[TK_CAT_GRAD], 12 * MiB);
        TK_CHECK_STR(o->top[0].owner, "classifier");
        TK_CHECK_EQ_INT(o->top[0].bytes, 24 * MiB);
        TK_CHECK_STR(o->owner_name, "bert.pooler.dense");
    }
    int64_t bad[2] = {-1, 4};
    TK_CHECK(tk_tensor_alloc(d, &t[2], TK_F32, 2, bad, TK_CAT_ACT, "x", &err) == TK_EINVAL);
    TK_CHECK(tk_tensor_alloc(d, &t[2], TK_F32, 5, bad, TK_CAT_ACT, "x", &err) == TK_EINVAL);
    tk_tensor_free(d, &t[0]);
    tk_tensor_free(d, &t[1]);
    tk_dev_destroy(&d);
}

static void test_cost_and_checks(void) {
    tk_dev *d = open_dev(TK_DEV_META, 0);
    if (!d) return;
    tk_tensor A, B, C, bias, ids;
    tk_err err = {0};
    int64_t sa[2] = {64, 32}, sb[2] = {32, 16}, sc[2] = {64, 16}, sbias[1] = {16}, si[1] = {64};
    TK_CHECK(tk_tensor_alloc(d, &A, TK_F16, 2, sa, TK_CAT_ACT, "a", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &B, TK_F16, 2, sb, TK_CAT_PARAM, "b", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &C, TK_F32, 2, sc, TK_CAT_ACT, "c", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &bias, TK_F32, 1, sbias, TK_CAT_PARAM, "b", &err) == TK_OK);
    TK_CHECK(tk_tensor_alloc(d, &ids, TK_I32, 1, si, TK_CAT_INPUT, "ids", &err) == TK_OK);
    tk_cost c;
    TK_CHECK(tk_op_gemm(d, &C, &A, &B, NULL, &(tk_gemm){ .m = 64, .n = 16, .k = 32, .batch = 1, .alpha = 1.0f }) == TK_OK);
    tk_dev_cost_get(d, &c);
    TK_CHECK_NEAR(c.flops, 2.0 * 64 * 16 * 32, 0);
    TK_CHECK_NEAR(c.bytes, 64 * 32 * 2 + 32 * 16 * 2 + 64 * 16 * 4, 0);
    TK_CHECK_EQ_INT(c.n_ops, 1);
    tk_dev_cost_reset(d);
    /* with a bias and beta != 0: C is read and written, the bias read */
    TK_CHECK(tk_op_gemm(d, &C, &A, &B, &bias, &(tk_gemm){ .m = 64, .n = 16, .k = 32, .batch = 1, .alpha = 1.0f, .beta = 1.0f }) == TK_OK);
    tk_dev_cost_get(d, &c);
    TK_CHECK_NEAR(c.flops, 2.0 * 64 * 16 * 32 + 64 * 16, 0);
    TK_CHECK_NEAR(c.bytes, 64 * 32 * 2 + 32 * 16 * 2 + 2 * 64 * 16 * 4 + 16 * 4, 0);
    tk_dev_cost_reset(d);
    /* batched: 4 matrices of 16x8 @ 8x16 inside A (2048 elements) */
    TK_CHECK(tk_op_gemm(d, &C, &A, &B, NULL, &(tk_gemm){ .m = 16, .n = 16, .k = 8, .batch = 4, .stride_a = 128, .stride_c = 256, .alpha = 1.0f }) == TK_OK);
    tk_dev_cost_get(d, &c);
    TK_CHECK_NEAR(c.flops, 2.0 * 16 * 16 * 8 * 4, 0);
    TK_CHECK(tk_op_add(d, &C, &C, &C, 1024) == TK_OK);
    TK_CHECK(tk_op_embed_fwd(d, &C, &ids, &B, 64, 16) == TK_OK);
    tk_dev_cost_reset(d);

    /* bad arguments: EINVAL, a message saying what, and no cost */
    TK_CHECK(tk_op_gemm(d, &C, &A, &B, NULL, &(tk_gemm){ .m = 64, .n = 16, .k = 33, .batch = 1, .alpha = 1.0f }) == TK_EINVAL);
    TK_CHECK(tk_dev_last_err(d) != NULL);
    if (tk_dev_last_err(d))
        TK_CHECK_MSG(strstr(tk_dev_last_err(d)->msg, "gemm: A (a) has 2048 elements, the sizes given need 2112"),
                     "%s", tk_dev_last_err(d)->msg);
    TK_CHECK(tk_op_add(d, &C, &C, &C, 1025) == TK_EINVAL);
    TK_CHECK(tk_op_add(d, &C, &C, NULL, 10) == TK_EINVAL);
    TK_CHECK(tk_op_add(d, &C, &C, &C, -1) == TK_EINVAL);
    TK_CHECK(tk_op_embed_fwd(d, &C, &C, &B, 64, 16) == TK_EINVAL); /* ids must be i32 */
    TK_CHECK_MSG(strstr(tk_dev_last_err(d)->msg, "ids has dtype f32") != NULL, "%s", tk_dev_last_err(d)->msg);
    TK_CHECK(tk_op_dropout_fwd(d, &C, NULL, &C, 10, 1.0f, 1, 0) == TK_EINVAL);
    tk_adamw_hp hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 0};
    TK_CHECK(tk_op_adamw(d, &C, &C, &C, &C, 10, &hp) == TK_EINVAL);
    TK_CHECK(tk_op_gemm(NULL, &C, &A, &B, NULL, &(tk_gemm){ .m = 1, .n = 1, .k = 1, .batch = 1, .alpha = 1 }) == TK_EINVAL);
    TK_CHECK(tk_op_layernorm_fwd(d, &C, NULL, NULL, &C, &bias, NULL, 64, 16, 1e-12f) == TK_EINVAL);
    TK_CHECK_MSG(strstr(tk_dev_last_err(d)->msg, "layernorm_fwd: b is missing") != NULL, "%s", tk_dev_last_err(d)->msg);
    tk_tensor empty = {0};
    empty.ndim = 1;
    empty.shape[0] = 8;
    TK_CHECK(tk_op_fill(d, &empty, 0, 8) == TK_EINVAL); /* no data behind it */
    tk_dev_cost_get(d, &c);
    TK_CHECK_EQ_INT(c.n_ops, 0);
    TK_CHECK(c.flops == 0 && c.bytes == 0);
    tk_tensor_free(d, &A);
    tk_tensor_free(d, &B);
    tk_tensor_free(d, &C);
    tk_tensor_free(d, &bias);
    tk_tensor_free(d, &ids);
    tk_dev_destroy(&d);
}

static void test_cuda_fallback(void) {
    setenv("TXK_CUDA_PLUGIN", "/nonexistent/libtk_cuda.so", 1);
    tk_dev_opts o = {.kind = TK_DEV_CUDA};
    tk_err err = {0};
    tk_dev *d = tk_dev_new(&o, &err);
    if (d) { /* a machine with a GPU and a built plugin: it must be a cuda device */
        TK_CHECK(tk_dev_kind_of(d) == TK_DEV_CUDA);
        tk_dev_destroy(&d);
    } else {
        TK_CHECK(err.status != TK_OK);
        TK_CHECK_MSG(strncmp(err.msg, "cuda unavailable: ", 18) == 0, "%s", err.msg);
        TK_CHECK(strchr(err.msg, '\n') == NULL); /* one line */
    }
    unsetenv("TXK_CUDA_PLUGIN");
    tk_dev *m = open_dev(TK_DEV_META, 0);
    TK_CHECK(tk_dev_backend_ctx(m) != NULL);
    TK_CHECK(tk_dev_plugin_sym(m, "tk_cuda_mem_totals_get") == NULL); /* no plugin on meta */
    TK_CHECK(tk_dev_sync(m, &err) == TK_OK);
    tk_dev_destroy(&m);
    o.kind = (tk_dev_kind)7;
    TK_CHECK(tk_dev_new(&o, &err) == NULL && err.status == TK_EINVAL);
}

/* ---- meta vs cpu: the same script, the same events ------------------------ */

#define MAXEV 512
typedef struct { int n; struct { int is_alloc; size_t bytes; tk_tag tag; } ev[MAXEV]; } evlog;

static void on_event(void *ud, int is_alloc, size_t bytes, tk_tag t) {
    evlog *l = ud;
    if (l->n < MAXEV) { l->ev[l->n].is_alloc = is_alloc; l->ev[l->n].bytes = bytes; l->ev[l->n].tag = t; }
    l->n++;
}

#define TRY(x) do { if ((x) != TK_OK) { st = 1; goto out; } } while (0)

/* A two-layer MLP step, tagged like the trainer tags it: params, grads, Adam
 * state, activations, temps; the activation of layer 1 is freed before the
 * optimizer step, as recompute would. Returns 0 on success. */
static int mlp_step(tk_dev *d, int B, int H, int steps) {
    int st = 0;
    tk_err err = {0};
    tk_tensor w1 = {0}, w2 = {0}, g1 = {0}, g2 = {0}, m1 = {0}, v1 = {0}, m2 = {0}, v2 = {0};
    tk_tensor x = {0}, h = {0}, a = {0}, y = {0}, dy = {0}, da = {0}, dh = {0}, tmp = {0};
    int64_t sx[2] = {B, H}, s4[2] = {B, 4 * H}, sw2[2] = {4 * H, H};
    TRY(tk_tensor_alloc(d, &w1, TK_F32, 2, (int64_t[]){H, 4 * H}, TK_CAT_PARAM, "layer.0.dense", &err));
    TRY(tk_tensor_alloc(d, &w2, TK_F32, 2, sw2, TK_CAT_PARAM, "layer.1.dense", &err));
    TRY(tk_tensor_alloc(d, &g1, TK_F32, 2, (int64_t[]){H, 4 * H}, TK_CAT_GRAD, "layer.0.dense", &err));
    TRY(tk_tensor_alloc(d, &g2, TK_F32, 2, sw2, TK_CAT_GRAD, "layer.1.dense", &err));
    TRY(tk_tensor_alloc(d, &m1, TK_F32, 2, (int64_t[]){H, 4 * H}, TK_CAT_OPTIM, "layer.0.dense", &err));
    TRY(tk_tensor_alloc(d, &v1, TK_F32, 2, (int64_t[]){H, 4 * H}, TK_CAT_OPTIM, "layer.0.dense", &err));
    TRY(tk_tensor_alloc(d, &m2, TK_F32, 2, sw2, TK_CAT_OPTIM, "layer.1.dense", &err));
    TRY(tk_tensor_alloc(d, &v2, TK_F32, 2, sw2, TK_CAT_OPTIM, "layer.1.dense", &err));
    TRY(tk_op_fill(d, &w1, 0.01f, tk_tensor_numel(&w1)));
    TRY(tk_op_fill(d, &w2, -0.02f, tk_tensor_numel(&w2)));
    for (int s = 0; s < steps; s++) {
        TRY(tk_tensor_alloc(d, &x, TK_F32, 2, sx, TK_CAT_INPUT, "input", &err));
        TRY(tk_op_fill(d, &x, 0.5f, tk_tensor_numel(&x)));
        TRY(tk_tensor_alloc(d, &h, TK_F32, 2, s4, TK_CAT_ACT, "layer.0.dense", &err));
        TRY(tk_op_gemm(d, &h, &x, &w1, NULL, &(tk_gemm){ .m = B, .n = 4 * H, .k = H, .batch = 1, .alpha = 1 }));
        TRY(tk_tensor_alloc(d, &a, TK_F32, 2, s4, TK_CAT_ACT, "layer.0.gelu", &err));
        TRY(tk_op_gelu_fwd(d, &a, &h, tk_tensor_numel(&h)));
        TRY(tk_tensor_alloc(d, &y, TK_F32, 2, sx, TK_CAT_ACT, "layer.1.dense", &err));
        TRY(tk_op_gemm(d, &y, &a, &w2, NULL, &(tk_gemm){ .m = B, .n = H, .k = 4 * H, .batch = 1, .alpha = 1 }));
        TRY(tk_tensor_alloc(d, &dy, TK_F32, 2, sx, TK_CAT_TEMP, "layer.1.dense", &err));
        TRY(tk_op_axpby(d, &dy, 1.0f, &y, 0.0f, tk_tensor_numel(&y)));
        TRY(tk_op_gemm(d, &g2, &a, &dy, NULL, &(tk_gemm){ .m = 4 * H, .n = H, .k = B, .trans_a = 1, .batch = 1, .alpha = 1, .beta = 1 }));
        TRY(tk_tensor_alloc(d, &da, TK_F32, 2, s4, TK_CAT_TEMP, "layer.1.dense", &err));
        TRY(tk_op_gemm(d, &da, &dy, &w2, NULL, &(tk_gemm){ .m = B, .n = 4 * H, .k = H, .trans_b = 1, .batch = 1, .alpha = 1 }));
        tk_tensor_free(d, &dy);
        tk_tensor_free(d, &y);
        tk_tensor_free(d, &a);
        TRY(tk_tensor_alloc(d, &dh, TK_F32, 2, s4, TK_CAT_TEMP, "layer.0.gelu", &err));
        TRY(tk_op_gelu_bwd(d, &dh, &h, &da, tk_tensor_numel(&h)));
        tk_tensor_free(d, &da);
        TRY(tk_op_gemm(d, &g1, &x, &dh, NULL, &(tk_gemm){ .m = H, .n = 4 * H, .k = B, .trans_a = 1, .batch = 1, .alpha = 1, .beta = 1 }));
        tk_tensor_free(d, &dh);
        tk_tensor_free(d, &h);
        TRY(tk_tensor_alloc(d, &tmp, TK_F32, 1, (int64_t[]){1}, TK_CAT_TEMP, "grad_norm", &err));
        TRY(tk_op_sumsq(d, &tmp, &g1, tk_tensor_numel(&g1), 0));
        TRY(tk_op_sumsq(d, &tmp, &g2, tk_tensor_numel(&g2), 1));
        tk_tensor_free(d, &tmp);
        tk_adamw_hp hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f, s + 1};
        TRY(tk_op_adamw(d, &w1, &g1, &m1, &v1, tk_tensor_numel(&w1), &hp));
        TRY(tk_op_adamw(d, &w2, &g2, &m2, &v2, tk_tensor_numel(&w2), &hp));
        tk_tensor_free(d, &x);
    }
out:
    for (tk_tensor *t[] = {&w1, &w2, &g1, &g2, &m1, &v1, &m2, &v2, &x, &h, &a, &y, &dy, &da, &dh, &tmp},
         **p = t; p < t + 16; p++)
        tk_tensor_free(d, *p);
    return st;
}

static void test_meta_matches_cpu(void) {
    static const int shapes[][2] = {{4, 32}, {8, 64}, {32, 128}, {3, 200}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        tk_dev *meta = open_dev(TK_DEV_META, 0), *cpu = open_dev(TK_DEV_CPU, 0);
        if (!meta || !cpu) { tk_dev_destroy(&meta); tk_dev_destroy(&cpu); return; }
        static evlog lm, lc;
        memset(&lm, 0, sizeof lm);
        memset(&lc, 0, sizeof lc);
        tk_alloc_set_event_hook(tk_dev_alloc(meta), on_event, &lm);
        tk_alloc_set_event_hook(tk_dev_alloc(cpu), on_event, &lc);
        TK_CHECK_EQ_INT(mlp_step(meta, shapes[k][0], shapes[k][1], 2), 0);
        TK_CHECK_EQ_INT(mlp_step(cpu, shapes[k][0], shapes[k][1], 2), 0);
        TK_CHECK(lm.n > 20 && lm.n <= MAXEV);
        TK_CHECK_EQ_INT(lm.n, lc.n);
        int diff = 0;
        for (int i = 0; i < lm.n && i < MAXEV; i++)
            if (lm.ev[i].is_alloc != lc.ev[i].is_alloc || lm.ev[i].bytes != lc.ev[i].bytes ||
                lm.ev[i].tag.cat != lc.ev[i].tag.cat || lm.ev[i].tag.owner != lc.ev[i].tag.owner)
                diff++;
        TK_CHECK_EQ_INT(diff, 0);
        tk_alloc_stats sm, sc;
        tk_alloc_stats_get(tk_dev_alloc(meta), &sm);
        tk_alloc_stats_get(tk_dev_alloc(cpu), &sc);
        TK_CHECK_EQ_INT(sm.allocated_peak, sc.allocated_peak);
        TK_CHECK_EQ_INT(sm.reserved_peak, sc.reserved_peak);
        TK_CHECK_EQ_INT(sm.requested_peak, sc.requested_peak);
        TK_CHECK(memcmp(sm.by_cat_at_peak, sc.by_cat_at_peak, sizeof sm.by_cat_at_peak) == 0);
        TK_CHECK_EQ_INT(sm.n_segments_alloc, sc.n_segments_alloc);
        tk_cost cm, cc;
        tk_dev_cost_get(meta, &cm);
        tk_dev_cost_get(cpu, &cc);
        TK_CHECK(cm.flops == cc.flops && cm.bytes == cc.bytes && cm.n_ops == cc.n_ops);
        tk_dev_destroy(&meta);
        tk_dev_destroy(&cpu);
    }
}

/* The same script under a capacity that runs out: both devices fail at the
 * same allocation with the same record. */
static void test_meta_matches_cpu_oom(void) {
    tk_dev *meta = open_dev(TK_DEV_META, 24 * MiB), *cpu = open_dev(TK_DEV_CPU, 24 * MiB);
    if (!meta || !cpu) { tk_dev_destroy(&meta); tk_dev_destroy(&cpu); return; }
    TK_CHECK(mlp_step(meta, 64, 512, 1) != 0);
    TK_CHECK(mlp_step(cpu, 64, 512, 1) != 0);
    const tk_oom *om = tk_dev_last_oom(meta), *oc = tk_dev_last_oom(cpu);
    TK_CHECK(om && oc);
    if (om && oc) {
        TK_CHECK_EQ_INT(om->requested, oc->requested);
        TK_CHECK_EQ_INT(om->allocated, oc->allocated);
        TK_CHECK_EQ_INT(om->reserved, oc->reserved);
        TK_CHECK_STR(om->owner_name, oc->owner_name);
    }
    tk_alloc_stats s, sm;
    tk_alloc_stats_get(tk_dev_alloc(cpu), &s);
    tk_alloc_stats_get(tk_dev_alloc(meta), &sm);
    TK_CHECK_EQ_INT(s.allocated, 0); /* the script released everything */
    TK_CHECK_EQ_INT(s.n_retries, sm.n_retries);
    TK_CHECK_EQ_INT(s.n_ooms, sm.n_ooms);
    TK_CHECK_EQ_INT(s.n_ooms, 1);
    TK_CHECK_EQ_INT(s.reserved_peak, sm.reserved_peak);
    tk_dev_destroy(&meta);
    tk_dev_destroy(&cpu);
}

static void test_f16_roundtrip_on_cpu(void) {
    tk_dev *d = open_dev(TK_DEV_CPU, 0);
    if (!d) return;
    tk_tensor t;
    tk_err err = {0};
    float in[5] = {1.0f, -2.5f, 65504.0f, 1e-8f, 0.1f}, out[5];
    for (int dt = TK_F16; dt <= TK_BF16; dt++) {
        TK_CHECK(tk_tensor_alloc(d, &t, (tk_dtype)dt, 1, (int64_t[]){5}, TK_CAT_TEMP, "t", &err) == TK_OK);
        TK_CHECK(tk_tensor_write_f32(d, &t, in, &err) == TK_OK);
        TK_CHECK(tk_tensor_read_f32(d, &t, out, &err) == TK_OK);
        TK_CHECK(out[0] == 1.0f && out[1] == -2.5f);
        TK_CHECK_NEAR(out[4], 0.1, dt == TK_F16 ? 1e-4 : 1e-3);
        tk_tensor_free(d, &t);
    }
    TK_CHECK(tk_tensor_alloc(d, &t, TK_I32, 1, (int64_t[]){5}, TK_CAT_INPUT, "t", &err) == TK_OK);
    TK_CHECK(tk_tensor_read_f32(d, &t, out, &err) == TK_EINVAL);
    tk_tensor_free(d, &t);
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    TK_CHECK_EQ_INT(info.simulated, 1);
    TK_CHECK(info.total > 0);
    tk_dev_destroy(&d);
}

int main(void) {
    TK_RUN(test_meta_device);
    TK_RUN(test_oom_record_and_message);
    TK_RUN(test_cost_and_checks);
    TK_RUN(test_cuda_fallback);
    TK_RUN(test_meta_matches_cpu);
    TK_RUN(test_meta_matches_cpu_oom);
    TK_RUN(test_f16_roundtrip_on_cpu);
    return tk_test_done();
}
