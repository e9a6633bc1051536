/* test_train_optim.c — the optimizer and the schedule on their own: HF's
 * schedule values, one AdamW step against a double-precision reference
 * (weight decay, no_decay, clipping), lazy state tagged TK_CAT_OPTIM with the
 * parameter's owner, frozen parameters, 8-bit state sizes, skipped steps on
 * non-finite gradients, OOM while allocating state, and meta == cpu bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tk_test.h"
#include "tk_train.h"

static tk_config cfg(void) {
    tk_config c;
    memset(&c, 0, sizeof c);
    c.lr = 1e-3f;
    c.adam_beta1 = 0.9f;
    c.adam_beta2 = 0.999f;
    c.adam_eps = 1e-8f;
    c.weight_decay = 0.01f;
    c.max_grad_norm = 1.0f;
    strcpy(c.schedule, "linear");
    return c;
}

static tk_dev *dev_new(tk_dev_kind k, size_t cap) {
    tk_dev_opts o = { .kind = k, .capacity = cap, .threads = 1 };
    tk_err e = { 0 };
    tk_dev *d = tk_dev_new(&o, &e);
    if (!d)
        fprintf(stderr, "  device: %s\n", e.msg);
    return d;
}

static void test_schedule(void) {
    tk_config c = cfg();
    c.warmup_ratio = 0.25f;
    tk_sched s = tk_sched_from_config(&c, 10);
    TK_CHECK_EQ_INT(s.warmup_steps, 3); /* ceil(2.5) as HF */
    TK_CHECK_NEAR(tk_sched_lr(&s, 0), 0.0, 1e-12);
    TK_CHECK_NEAR(tk_sched_lr(&s, 1), 1e-3 / 3, 1e-9);
    TK_CHECK_NEAR(tk_sched_lr(&s, 3), 1e-3, 1e-9);
    TK_CHECK_NEAR(tk_sched_lr(&s, 5), 1e-3 * 5.0 / 7.0, 1e-9);
    TK_CHECK_NEAR(tk_sched_lr(&s, 10), 0.0, 1e-12);
    TK_CHECK_NEAR(tk_sched_lr(&s, 12), 0.0, 1e-12);
    strcpy(c.schedule, "constant");
    s = tk_sched_from_config(&c, 10);
    TK_CHECK_NEAR(tk_sched_lr(&s, 1), 1e-3 / 3, 1e-9);
    TK_CHECK_NEAR(tk_sched_lr(&s, 9), 1e-3, 1e-9);
    c.warmup_ratio = 0;
    s = tk_sched_from_config(&c, 4);
    TK_CHECK_NEAR(tk_sched_lr(&s, 0), 1e-3, 1e-9);
}

/* Two parameters: a weight (decayed) and a bias (no_decay). */
typedef struct {
    tk_dev *d;
    tk_tensor p[2], g[2];
    tk_optim_param ps[2];
} rig;

static int rig_new(rig *r, tk_dev_kind k, size_t cap, int64_t n0, int64_t n1) {
    memset(r, 0, sizeof *r);
    if (!(r->d = dev_new(k, cap)))
        return -1;
    tk_err e = { 0 };
    const char *own[2] = { "bert.encoder.layer.0.output.dense", "bert.encoder.layer.0.output.dense" };
    int64_t n[2] = { n0, n1 };
    for (int i = 0; i < 2; i++) {
        if (n[i] == 0)
            continue;
        if (tk_tensor_alloc(r->d, &r->p[i], TK_F32, 1, &n[i], TK_CAT_PARAM, own[i], &e) ||
            tk_tensor_alloc(r->d, &r->g[i], TK_F32, 1, &n[i], TK_CAT_GRAD, own[i], &e)) {
            fprintf(stderr, "  alloc: %s\n", e.msg);
            return -1;
        }
        tk_op_fill(r->d, &r->p[i], 0.0f, n[i]);
        tk_op_fill(r->d, &r->g[i], 0.0f, n[i]);
        r->ps[i] = (tk_optim_param){ .name = i ? "bert.encoder.layer.0.output.dense.bias"
                                               : "bert.encoder.layer.0.output.dense.weight",
                                     .param = &r->p[i], .grad = &r->g[i], .no_decay = i };
    }
    return 0;
}

static void rig_free(rig *r) {
    for (int i = 0; i < 2; i++) {
        tk_tensor_free(r->d, &r->p[i]);
        tk_tensor_free(r->d, &r->g[i]);
    }
    tk_dev_destroy(&r->d);
}

static void fill_host(float *x, int64_t n, float a, float b) {
    for (int64_t i = 0; i < n; i++)
        x[i] = a * sinf((float)i * 0.37f + b);
}

/* Reference: torch's clip_grad_norm_ then one AdamW step, in double. */
static void ref_step(double *p, const double *g, int64_t n, double lr, double wd, double clip) {
    double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i] * clip;
        double m = (1 - b1) * gi, v = (1 - b2) * gi * gi;
        double mh = m / (1 - b1), vh = v / (1 - b2);
        p[i] = p[i] * (1 - lr * wd) - lr * mh / (sqrt(vh) + eps);
    }
}

static void test_one_step_vs_reference(void) {
    for (int clipped = 0; clipped < 2; clipped++) {
        rig r;
        if (rig_new(&r, TK_DEV_CPU, 0, 300, 40)) {
            TK_CHECK(0);
            return;
        }
        tk_config c = cfg();
        c.max_grad_norm = clipped ? 0.5f : 1000.0f;
        float hp[2][300], hg[2][300];
        double dp[2][300], dg[2][300], sq = 0;
        int64_t n[2] = { 300, 40 };
        tk_err e = { 0 };
        for (int i = 0; i < 2; i++) {
            fill_host(hp[i], n[i], 0.5f, (float)i);
            fill_host(hg[i], n[i], 0.3f, 1.0f + (float)i);
            tk_tensor_write(r.d, &r.p[i], hp[i], &e);
            tk_tensor_write(r.d, &r.g[i], hg[i], &e);
            for (int64_t k = 0; k < n[i]; k++) {
                dp[i][k] = hp[i][k];
                dg[i][k] = hg[i][k];
                sq += dg[i][k] * dg[i][k];
            }
        }
        double norm = sqrt(sq), coef = c.max_grad_norm / (norm + 1e-6);
        double clip = coef < 1 ? coef : 1;
        TK_CHECK(clipped ? clip < 1 : clip == 1);
        tk_adamw *o = tk_adamw_new(r.d, &c, r.ps, 2, &e);
        float gn = 0;
        int skipped = -1;
        TK_CHECK_EQ_INT(tk_adamw_step(o, 1e-2f, 1.0f, &gn, &skipped, &e), TK_OK);
        TK_CHECK_EQ_INT(skipped, 0);
        TK_CHECK_NEAR(gn, norm, 1e-5 * norm);
        TK_CHECK_EQ_INT(tk_adamw_steps(o), 1);
        double maxrel = 0;
        for (int i = 0; i < 2; i++) {
            ref_step(dp[i], dg[i], n[i], 1e-2, i ? 0.0 : c.weight_decay, clip);
            tk_tensor_read(r.d, &r.p[i], hp[i], &e);
            for (int64_t k = 0; k < n[i]; k++) {
                double rel = fabs(hp[i][k] - dp[i][k]) / (fabs(dp[i][k]) + 1e-3);
                if (rel > maxrel)
                    maxrel = rel;
            }
        }
        TK_CHECK_MSG(maxrel < 1e-5, "max relative error %g (clipped %d)", maxrel, clipped);
        tk_adamw_destroy(&o);
        TK_CHECK(o == NULL);
        rig_free(&r);
    }
}

static void test_lazy_state_tags(void) {
    rig r;
    if (rig_new(&r, TK_DEV_CPU, 0, 1024, 128)) {
        TK_CHECK(0);
        return;
    }
    tk_config c = cfg();
    tk_err e = { 0 };
    tk_op_fill(r.d, &r.g[0], 0.1f, 1024);
    tk_op_fill(r.d, &r.g[1], 0.1f, 128);
    tk_alloc *a = tk_dev_alloc(r.d);
    tk_alloc_stats s;
    tk_adamw *o = tk_adamw_new(r.d, &c, r.ps, 2, &e);
    tk_alloc_stats_get(a, &s);
    TK_CHECK_EQ_INT(s.by_cat[TK_CAT_OPTIM], 0);
    TK_CHECK_EQ_INT(tk_adamw_state_bytes(o), 0);
    TK_CHECK_EQ_INT(tk_adamw_state_bytes_planned(o), 2 * 4 * (1024 + 128));
    TK_CHECK_EQ_INT(tk_adamw_step(o, 1e-3f, 1.0f, NULL, NULL, &e), TK_OK);
    tk_alloc_stats_get(a, &s);
    TK_CHECK_EQ_INT(s.by_cat[TK_CAT_OPTIM], 2 * 4 * (1024 + 128));
    TK_CHECK_EQ_INT(s.by_cat[TK_CAT_TEMP], 0); /* the norm scratch is gone */
    int own = tk_alloc_owner_id(a, "bert.encoder.layer.0.output.dense");
    TK_CHECK_EQ_INT(tk_alloc_owner_live(a, own, TK_CAT_OPTIM), 2 * 4 * (1024 + 128));
    TK_CHECK_EQ_INT(tk_adamw_state_bytes(o), 2 * 4 * (1024 + 128));
    tk_adamw_destroy(&o);
    tk_alloc_stats_get(a, &s);
    TK_CHECK_EQ_INT(s.by_cat[TK_CAT_OPTIM], 0);
    tk_adamw_destroy(&o); /* no-op on NULL */
    rig_free(&r);
}

static void test_frozen_and_nonfinite(void) {
    rig r;
    if (rig_new(&r, TK_DEV_CPU, 0, 256, 256)) {
        TK_CHECK(0);
        return;
    }
    tk_config c = cfg();
    tk_err e = { 0 };
    r.ps[1].frozen = 1;
    float before[256], after[256];
    fill_host(before, 256, 1.0f, 0.0f);
    tk_tensor_write(r.d, &r.p[1], before, &e);
    tk_tensor_write(r.d, &r.p[0], before, &e);
    tk_op_fill(r.d, &r.g[0], 0.2f, 256);
    tk_op_fill(r.d, &r.g[1], 0.2f, 256);
    tk_adamw *o = tk_adamw_new(r.d, &c, r.ps, 2, &e);
    TK_CHECK_EQ_INT(tk_adamw_state_bytes_planned(o), 2 * 4 * 256);
    TK_CHECK_EQ_INT(tk_adamw_step(o, 1e-2f, 1.0f, NULL, NULL, &e), TK_OK);
    TK_CHECK_EQ_INT(tk_adamw_state_bytes(o), 2 * 4 * 256);
    tk_tensor_read(r.d, &r.p[1], after, &e);
    TK_CHECK(memcmp(before, after, sizeof before) == 0);
    tk_tensor_read(r.d, &r.p[0], after, &e);
    TK_CHECK(memcmp(before, after, sizeof before) != 0);

    /* an inf gradient (fp16 overflow): step skipped, nothing moves */
    float g[256];
    for (int i = 0; i < 256; i++)
        g[i] = i == 7 ? INFINITY : 0.1f;
    tk_tensor_write(r.d, &r.g[0], g, &e);
    tk_tensor_read(r.d, &r.p[0], before, &e);
    int skipped = 0;
    float gn = 0;
    TK_CHECK_EQ_INT(tk_adamw_step(o, 1e-2f, 1.0f, &gn, &skipped, &e), TK_OK);
    TK_CHECK_EQ_INT(skipped, 1);
    TK_CHECK(!isfinite(gn));
    TK_CHECK_EQ_INT(tk_adamw_steps(o), 1);
    tk_tensor_read(r.d, &r.p[0], after, &e);
    TK_CHECK(memcmp(before, after, sizeof before) == 0);
    tk_adamw_destroy(&o);
    rig_free(&r);
}

static void test_adamw8_sizes(void) {
    rig r;
    /* 8192 elements: 8-bit; 100 elements: below bitsandbytes' 4096 -> fp32 */
    if (rig_new(&r, TK_DEV_CPU, 0, 8192, 100)) {
        TK_CHECK(0);
        return;
    }
    tk_config c = cfg();
    c.optimizer = TK_OPTIM_ADAMW8;
    tk_err e = { 0 };
    tk_op_fill(r.d, &r.g[0], 0.05f, 8192);
    tk_op_fill(r.d, &r.g[1], 0.05f, 100);
    static float before[8192], after[8192];
    tk_tensor_read(r.d, &r.p[0], before, &e);
    tk_adamw *o = tk_adamw_new(r.d, &c, r.ps, 2, &e);
    size_t want = 2 * 8192 + 2 * (8192 / TK_Q8_BLOCK) * 4 + 2 * 4 * 100;
    TK_CHECK_EQ_INT(tk_adamw_state_bytes_planned(o), want);
    TK_CHECK_EQ_INT(tk_adamw_step(o, 1e-2f, 1.0f, NULL, NULL, &e), TK_OK);
    TK_CHECK_EQ_INT(tk_adamw_state_bytes(o), want);
    tk_tensor_read(r.d, &r.p[0], after, &e);
    /* the first step of Adam moves each weight by about lr (m/sqrt(v) = 1) */
    double moved = 0;
    for (int i = 0; i < 100; i++)
        moved += fabs(after[i] - before[i] * (1 - 1e-2 * 0.01));
    TK_CHECK_NEAR(moved / 100, 1e-2, 2e-3);
    tk_adamw_destroy(&o);

    /* embeddings keep 32-bit state when asked */
    c.adamw8_fp32_embeddings = 1;
    r.ps[0].name = "bert.embeddings.word_embeddings.weight";
    o = tk_adamw_new(r.d, &c, r.ps, 2, &e);
    TK_CHECK_EQ_INT(tk_adamw_state_bytes_planned(o), 2 * 4 * (8192 + 100));
    tk_adamw_destroy(&o);
    rig_free(&r);
}

/* 6 MiB tensors in a 20 MiB device: param + grad + m fit in the first 20 MiB
 * segment, v needs a second one -> OOM. Nothing may stay allocated. */
static void test_oom_in_state(void) {
    rig r;
    int64_t n = 6 * 1024 * 1024 / 4;
    if (rig_new(&r, TK_DEV_CPU, 20u << 20, n, 0)) {
        TK_CHECK(0);
        return;
    }
    tk_config c = cfg();
    tk_err e = { 0 };
    tk_alloc *a = tk_dev_alloc(r.d);
    tk_alloc_stats s0, s1;
    tk_alloc_stats_get(a, &s0);
    tk_adamw *o = tk_adamw_new(r.d, &c, r.ps, 1, &e);
    TK_CHECK_EQ_INT(tk_adamw_step(o, 1e-3f, 1.0f, NULL, NULL, &e), TK_EOOM);
    tk_alloc_stats_get(a, &s1);
    TK_CHECK_EQ_INT(s1.allocated, s0.allocated);
    TK_CHECK_EQ_INT(s1.by_cat[TK_CAT_OPTIM], 0);
    TK_CHECK_EQ_INT(tk_adamw_steps(o), 0);
    const tk_oom *oom = tk_dev_last_oom(r.d);
    TK_CHECK(oom != NULL);
    if (oom) {
        TK_CHECK_EQ_INT(oom->tag.cat, TK_CAT_OPTIM);
        TK_CHECK_STR(oom->owner_name, "bert.encoder.layer.0.output.dense");
    }
    TK_CHECK(strlen(e.msg) > 0);
    tk_adamw_destroy(&o);
    rig_free(&r);
}

/* The same parameters on meta and on cpu allocate the same optimizer bytes
 * at the same moment (the planner relies on it). */
static void test_meta_matches_cpu(void) {
    size_t peak[2], optim[2];
    tk_dev_kind kinds[2] = { TK_DEV_META, TK_DEV_CPU };
    for (int k = 0; k < 2; k++) {
        rig r;
        if (rig_new(&r, kinds[k], 0, 5000, 64)) {
            TK_CHECK(0);
            return;
        }
        tk_config c = cfg();
        c.optimizer = TK_OPTIM_ADAMW8; /* 5000: 8-bit state, 64: fp32 state */
        tk_err e = { 0 };
        tk_op_fill(r.d, &r.g[0], 0.01f, 5000);
        tk_op_fill(r.d, &r.g[1], 0.01f, 64);
        tk_adamw *o = tk_adamw_new(r.d, &c, r.ps, 2, &e);
        TK_CHECK_EQ_INT(tk_adamw_step(o, 1e-3f, 1.0f, NULL, NULL, &e), TK_OK);
        TK_CHECK_EQ_INT(tk_adamw_step(o, 1e-3f, 1.0f, NULL, NULL, &e), TK_OK);
        tk_alloc_stats s;
        tk_alloc_stats_get(tk_dev_alloc(r.d), &s);
        peak[k] = s.allocated_peak;
        optim[k] = s.by_cat[TK_CAT_OPTIM];
        tk_adamw_destroy(&o);
        rig_free(&r);
    }
    TK_CHECK_EQ_INT(peak[0], peak[1]);
    TK_CHECK_EQ_INT(optim[0], optim[1]);
    TK_CHECK(optim[0] >= 2 * 5000 + 2 * 4 * 64);
}

int main(void) {
    TK_RUN(test_schedule);
    TK_RUN(test_one_step_vs_reference);
    TK_RUN(test_lazy_state_tags);
    TK_RUN(test_frozen_and_nonfinite);
    TK_RUN(test_adamw8_sizes);
    TK_RUN(test_oom_in_state);
    TK_RUN(test_meta_matches_cpu);
    return tk_test_done();
}
