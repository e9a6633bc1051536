/* test_plan_vs_cpu.c — the planner's predicted peak equals the peak a real
 * cpu run reaches, byte for byte (allocated and reserved), for several
 * configs on bert-tiny and bert-mini: heads, accumulation, 8-bit AdamW,
 * freezing, eval batch size, capacity, and the memory-saving techniques
 * (recompute layers/attention, fp16/bf16, fused attention, a combination).
 * Also: a plan that does not fit says so (and where), without touching any
 * real device, and bert-base plans fast. */
#include <stdlib.h>
#include <string.h>

#include "tk_plan.h"
#include "tk_test.h"
#include "tk_train.h"

typedef struct {
    const char *name;
    const char *model;
    tk_head_kind head;
    int B, T, EB, k;
    tk_optim optim;
    int freeze_emb, freeze_layers;
    size_t capacity;
    tk_precision prec;
    tk_recompute recompute;
    tk_attention attention;
} pcase;

static tk_config cfg_of(const pcase *p) {
    tk_config c;
    tk_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "%s", p->model);
    c.head = p->head;
    c.num_labels = 3;
    c.head_units = 5;
    c.towers = 2;
    c.batch_size = p->B;
    c.max_len = p->T;
    c.eval_batch_size = p->EB;
    c.accumulate = p->k;
    c.optimizer = p->optim;
    c.freeze_embeddings = p->freeze_emb;
    c.freeze_layers = p->freeze_layers;
    c.capacity = p->capacity;
    c.precision = p->prec;
    c.recompute = p->recompute;
    c.attention = p->attention;
    c.dropout = 0.1f;
    c.lr = 1e-4f;
    c.epochs = 1;
    c.log_every = 1000;
    return c;
}

/* Batches of the planned shape with valid ids (the cpu computes on them). */
static void fill_batch(tk_batch *b, int B, int rows, int T, int32_t *buf) {
    int32_t *ids = buf, *types = buf + (size_t)B * rows * T, *mask = types + (size_t)B * rows * T;
    int32_t *lab = mask + (size_t)B * rows * T;
    for (size_t i = 0; i < (size_t)B * rows * T; i++) {
        ids[i] = (int32_t)(100 + i % 500);
        types[i] = 0;
        mask[i] = 1;
    }
    for (int i = 0; i < B; i++)
        lab[i] = i % 2;
    *b = (tk_batch){ .B = B, .T = T, .input_ids = ids, .token_type_ids = types, .attention_mask = mask,
                     .labels = lab, .start_positions = lab, .end_positions = lab };
}

static void run_case(const pcase *p) {
    tk_config c = cfg_of(p);
    tk_plan_result plan;
    tk_err e = { 0 };
    TK_CHECK_MSG(tk_plan(&c, NULL, 0, &plan, &e) == TK_OK, "%s: %s", p->name, e.msg);
    TK_CHECK_EQ_INT(plan.batch, p->B);
    TK_CHECK_EQ_INT(plan.seq, p->T);

    tk_dev_opts dopts = { .kind = TK_DEV_CPU, .capacity = p->capacity, .threads = 2 };
    tk_dev *d = tk_dev_new(&dopts, &e);
    tk_model_opts mo;
    TK_CHECK(tk_model_opts_from_config(&mo, &c, &e) == TK_OK);
    tk_model *m = d ? tk_model_new(d, &mo, &e) : NULL;
    if (!m || tk_model_init_random(m, 3, &e) != TK_OK) {
        TK_CHECK_MSG(0, "%s: %s", p->name, e.msg);
        tk_model_destroy(&m);
        tk_dev_destroy(&d);
        return;
    }
    int rows = p->head == TK_HEAD_FLATTEN_DENSE ? 2 : 1;
    int EB = p->EB ? p->EB : p->B;
    int32_t *tb = malloc(((size_t)p->B * rows * p->T * 3 + p->B) * 4);
    int32_t *eb = malloc(((size_t)EB * rows * p->T * 3 + EB) * 4);
    tk_batch train[16], dev[1];
    fill_batch(&train[0], p->B, rows, p->T, tb);
    for (int i = 1; i < 2 * p->k; i++)
        train[i] = train[0];
    fill_batch(&dev[0], EB, rows, p->T, eb);
    tk_train_result r;
    tk_status st = tk_train_run(&c, m, train, 2 * p->k, dev, 1, NULL, &r, &e);
    TK_CHECK_MSG(st == TK_OK, "%s: %s", p->name, e.msg);
    TK_CHECK_EQ_INT(r.steps, 2);
    TK_CHECK_MSG(r.peak_allocated == plan.peak_allocated, "%s: measured %zu planned %zu", p->name,
                 r.peak_allocated, plan.peak_allocated);
    TK_CHECK_MSG(r.peak_reserved == plan.peak_reserved, "%s: reserved measured %zu planned %zu",
                 p->name, r.peak_reserved, plan.peak_reserved);
    tk_alloc_stats s;
    tk_alloc_stats_get(tk_dev_alloc(d), &s);
    for (int cat = 0; cat < TK_CAT_COUNT; cat++)
        TK_CHECK_MSG(s.by_cat_at_peak[cat] == plan.by_cat_at_peak[cat], "%s: %s at peak %zu vs %zu",
                     p->name, tk_cat_name((tk_cat)cat), s.by_cat_at_peak[cat], plan.by_cat_at_peak[cat]);
    TK_CHECK(plan.fits);
    TK_CHECK(plan.n_top > 0);
    TK_CHECK(plan.train_step.flops > 0);
    TK_CHECK(plan.optim_bytes > 0);
    tk_train_result_clear(&r);
    free(tb);
    free(eb);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
}

static void test_plan_equals_cpu(void) {
    static const pcase cases[] = {
        { "tiny pooled", "bert-tiny", TK_HEAD_POOLED, 4, 32, 0, 1, TK_OPTIM_ADAMW, 0, 0, 0, TK_PREC_FP32, TK_RECOMPUTE_NONE, TK_ATTN_STANDARD },
        { "tiny span acc2 eval8", "bert-tiny", TK_HEAD_SPAN, 2, 64, 8, 2, TK_OPTIM_ADAMW, 0, 0, 0, TK_PREC_FP32, TK_RECOMPUTE_NONE, TK_ATTN_STANDARD },
        { "tiny frozen", "bert-tiny", TK_HEAD_POOLED, 8, 32, 0, 1, TK_OPTIM_ADAMW, 1, 1, 0, TK_PREC_FP32, TK_RECOMPUTE_NONE, TK_ATTN_STANDARD },
        { "tiny flatten_dense", "bert-tiny", TK_HEAD_FLATTEN_DENSE, 2, 16, 0, 1, TK_OPTIM_ADAMW, 0, 0, 0, TK_PREC_FP32, TK_RECOMPUTE_NONE, TK_ATTN_STANDARD },
        { "mini adamw8 cap", "bert-mini", TK_HEAD_POOLED, 4, 32, 0, 1, TK_OPTIM_ADAMW8, 0, 0, 512u << 20, TK_PREC_FP32, TK_RECOMPUTE_NONE, TK_ATTN_STANDARD },
        { "mini pooled acc3", "bert-mini", TK_HEAD_POOLED, 2, 48, 4, 3, TK_OPTIM_ADAMW, 0, 0, 0, TK_PREC_FP32, TK_RECOMPUTE_NONE, TK_ATTN_STANDARD },
        /* memory-saving techniques: the planner replays them as the cpu runs them */
        { "tiny recompute layers", "bert-tiny", TK_HEAD_POOLED, 4, 32, 0, 1, TK_OPTIM_ADAMW, 0, 0, 0,
          TK_PREC_FP32, TK_RECOMPUTE_LAYERS, TK_ATTN_STANDARD },
        { "tiny recompute span acc2", "bert-tiny", TK_HEAD_SPAN, 2, 48, 4, 2, TK_OPTIM_ADAMW, 0, 0, 0,
          TK_PREC_FP32, TK_RECOMPUTE_LAYERS, TK_ATTN_STANDARD },
        { "tiny recompute attention", "bert-tiny", TK_HEAD_POOLED, 4, 32, 0, 1, TK_OPTIM_ADAMW, 0, 0, 0,
          TK_PREC_FP32, TK_RECOMPUTE_ATTENTION, TK_ATTN_STANDARD },
        { "tiny fp16", "bert-tiny", TK_HEAD_POOLED, 4, 32, 0, 1, TK_OPTIM_ADAMW, 0, 0, 0,
          TK_PREC_FP16, TK_RECOMPUTE_NONE, TK_ATTN_STANDARD },
        { "tiny bf16 span", "bert-tiny", TK_HEAD_SPAN, 2, 48, 0, 1, TK_OPTIM_ADAMW, 0, 0, 0,
          TK_PREC_BF16, TK_RECOMPUTE_NONE, TK_ATTN_STANDARD },
        { "tiny fused attention", "bert-tiny", TK_HEAD_POOLED, 4, 64, 0, 1, TK_OPTIM_ADAMW, 0, 0, 0,
          TK_PREC_FP32, TK_RECOMPUTE_NONE, TK_ATTN_FUSED },
        { "mini all: fp16 recompute fused adamw8 frozen", "bert-mini", TK_HEAD_POOLED, 2, 32, 0, 1,
          TK_OPTIM_ADAMW8, 1, 1, 0, TK_PREC_FP16, TK_RECOMPUTE_LAYERS, TK_ATTN_FUSED },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
}

/* The seed's scenario: bert-base-cased, 512 x 32 in the seed's 7.43 GiB
 * (T4 profile for the step time) does not fit; the plan says so, names the phase, and is fast. */
static void test_plan_does_not_fit(void) {
    tk_config c;
    tk_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "bert-base-cased");
    snprintf(c.gpu, sizeof c.gpu, "t4");
    c.capacity = (size_t)(7.43 * 1024 * 1024 * 1024); /* the seed's "7.43 GiB total capacity" */
    c.num_labels = 2;
    c.max_len = 512;
    c.batch_size = 32;
    tk_plan_result p;
    tk_err e = { 0 };
    TK_CHECK_EQ_INT(tk_plan(&c, NULL, 0, &p, &e), TK_OK);
    TK_CHECK(!p.fits);
    TK_CHECK(p.oom);
    TK_CHECK(p.margin < 0);
    TK_CHECK(p.peak_reserved > p.capacity);
    TK_CHECK(p.oom_phase[0] != '\0');
    TK_CHECK(p.step_seconds > 0);
    TK_CHECK(p.by_cat_at_peak[TK_CAT_ACT] > p.by_cat_at_peak[TK_CAT_PARAM]);
    /* bert-base-cased has 108M encoder+embedding weights (+ pooler, head) */
    TK_CHECK(p.n_params > 108000000 && p.n_params < 110000000);
    /* two fp32 moments per weight; the allocator's rounding (512 B blocks,
     * and a large block whose segment remainder is <= 1 MiB counts whole, as
     * PyTorch's) adds a little: 877767680 vs 866494480 bytes here (1.3%) */
    TK_CHECK(p.optim_bytes >= (size_t)(2 * 4 * p.n_trainable));
    TK_CHECK_MSG(p.optim_bytes < (size_t)(2 * 4 * p.n_trainable) * 102 / 100, "optim %zu for %lld weights",
                 p.optim_bytes, (long long)p.n_trainable);
    fprintf(stderr, "  bert-base 32x512 in 7.43 GiB: peak %zu reserved %zu, planned in %.1f ms\n",
            p.peak_allocated, p.peak_reserved, p.plan_ms);
    char *txt = tk_plan_format(&p);
    TK_CHECK(txt && strstr(txt, "does NOT fit") && strstr(txt, "roofline"));
    free(txt);

    /* batch 8 x 128 fits */
    c.max_len = 128;
    c.batch_size = 8;
    TK_CHECK_EQ_INT(tk_plan(&c, NULL, 0, &p, &e), TK_OK);
    TK_CHECK(p.fits);
    TK_CHECK(!p.oom);
    TK_CHECK(p.margin > 0);
}

/* bert-tiny, two labels, batch x max_len, defaults otherwise. */
static tk_config tiny_cfg(int max_len, int batch) {
    tk_config c;
    tk_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "bert-tiny");
    c.num_labels = 2;
    c.max_len = max_len;
    c.batch_size = batch;
    return c;
}

/* Dynamic padding plans the longest batch of the corpus, not max_len. */
static void test_plan_dynamic_lengths(void) {
    tk_config c = tiny_cfg(256, 8);
    c.batching = TK_BATCH_DYNAMIC;
    int lens[5] = { 12, 40, 90, 33, 7 };
    tk_plan_result a, b;
    tk_err e = { 0 };
    TK_CHECK_EQ_INT(tk_plan(&c, lens, 5, &a, &e), TK_OK);
    TK_CHECK_EQ_INT(a.seq, 90);
    c.batching = TK_BATCH_FIXED;
    TK_CHECK_EQ_INT(tk_plan(&c, lens, 5, &b, &e), TK_OK);
    TK_CHECK_EQ_INT(b.seq, 256);
    TK_CHECK(a.peak_allocated < b.peak_allocated);
}

/* attention: fused on cuda (the tiled kernels of gpu/cuda/cuda_attention.h
 * allocate nothing of their own): planned there, and it saves the same bytes
 * as on cpu, where the plan is checked against measured runs. */
static void test_plan_fused_on_cuda(void) {
    tk_config c = tiny_cfg(64, 4);
    tk_err e = { 0 };
    size_t saved[2] = { 0, 0 };
    const tk_device_choice devs[2] = { TK_DEVICE_CPU, TK_DEVICE_CUDA };
    for (int i = 0; i < 2; i++) {
        tk_plan_result std_, fu;
        c.device = devs[i];
        c.attention = TK_ATTN_STANDARD;
        TK_CHECK_MSG(tk_plan(&c, NULL, 0, &std_, &e) == TK_OK, "%s", e.msg);
        c.attention = TK_ATTN_FUSED;
        TK_CHECK_MSG(tk_plan(&c, NULL, 0, &fu, &e) == TK_OK, "%s", e.msg);
        TK_CHECK(fu.peak_allocated < std_.peak_allocated);
        saved[i] = std_.peak_allocated - fu.peak_allocated;
    }
    TK_CHECK_EQ_INT(saved[1], saved[0]);
}

/* attention: auto (the default) is standard on the cpu; on a card fused
 * where a tensor-core kernel runs it (fp16 on a t4) and standard where only
 * the reference kernel would (fp32), unless only fused fits the capacity
 * (tk_config_attention_fit, the plan's memory clause); the plan says which
 * and why (and, for a card, which cuda kernel runs it: tensor cores for
 * 16-bit where the card has them, TXK_ATTN_KERNEL's choice), and a cpu run
 * of a card's config (gpu: t4, as demo notebooks run them) uses what its
 * plan used, so they still agree byte for byte. */
static void test_plan_default_attention(void) {
    tk_config c = tiny_cfg(64, 4);
    c.threads = 2;
    tk_err e = { 0 };
    tk_plan_result cpu, card, card16, fused;
    TK_CHECK_MSG(tk_plan(&c, NULL, 0, &cpu, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(cpu.attention, TK_ATTN_STANDARD);
    TK_CHECK_STR(cpu.attention_why, "default on the cpu");
    snprintf(c.gpu, sizeof c.gpu, "t4");
    TK_CHECK_MSG(tk_plan(&c, NULL, 0, &card, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(card.attention, TK_ATTN_STANDARD); /* fp32: the reference kernel would run fused */
    TK_CHECK_STR(card.attention_why, TK_ATTN_WHY_SLOW);
    char *txt = tk_plan_format(&card);
    TK_CHECK(txt && strstr(txt, "attention: standard (" TK_ATTN_WHY_SLOW ")\n"));
    TK_CHECK_STR(card.attention_kernel, "");
    free(txt);
    tk_config h = c;
    h.precision = TK_PREC_FP16;
    TK_CHECK_MSG(tk_plan(&h, NULL, 0, &card16, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(card16.attention, TK_ATTN_FUSED);
    TK_CHECK_STR(card16.attention_why, TK_ATTN_WHY_FAST);
    txt = tk_plan_format(&card16);
    TK_CHECK(txt && strstr(txt, "attention: fused (" TK_ATTN_WHY_FAST ")\n"));
    /* and which cuda kernel the card runs it with (gpu/tk_attn_kernel.h) */
    TK_CHECK(txt && strstr(txt, "attention kernel on t4: tensor cores, mma.sync m16n8k8 (sm75); head size 64, f16"));
    TK_CHECK_STR(cpu.attention_kernel, "");
    free(txt);
    /* memory: a capacity between the fused and the standard plan's peaks
     * keeps fp32 fused; above both, standard; below both, standard (the
     * advisor takes it from there) */
    tk_config mc = tiny_cfg(512, 16); /* long enough that the T x T probabilities show in the reserved peak */
    snprintf(mc.gpu, sizeof mc.gpu, "t4");
    tk_plan_result ms, mf, r;
    mc.attention = TK_ATTN_STANDARD;
    TK_CHECK_MSG(tk_plan(&mc, NULL, 0, &ms, &e) == TK_OK, "%s", e.msg);
    mc.attention = TK_ATTN_FUSED;
    TK_CHECK_MSG(tk_plan(&mc, NULL, 0, &mf, &e) == TK_OK, "%s", e.msg);
    TK_CHECK(mf.peak_reserved < ms.peak_reserved);
    mc.attention = TK_ATTN_AUTO;
    mc.capacity = (mf.peak_reserved + ms.peak_reserved) / 2;
    TK_CHECK_MSG(tk_plan(&mc, NULL, 0, &r, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(r.attention, TK_ATTN_FUSED);
    TK_CHECK_STR(r.attention_why, TK_ATTN_WHY_FITS);
    TK_CHECK(r.fits && r.peak_reserved == mf.peak_reserved);
    TK_CHECK(strstr(r.attention_kernel, "the reference kernel (fp32 cores): f32 tensors") == r.attention_kernel);
    mc.capacity = ms.peak_reserved;
    TK_CHECK_MSG(tk_plan(&mc, NULL, 0, &r, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(r.attention, TK_ATTN_STANDARD);
    mc.capacity = mf.peak_allocated / 2; /* (just under mf's reserved peak is not: under pressure the allocator
                                          * releases its cache and fits in less) */
    TK_CHECK_MSG(tk_plan(&mc, NULL, 0, &r, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(r.attention, TK_ATTN_STANDARD);
    TK_CHECK_STR(r.attention_why, TK_ATTN_WHY_SLOW);
    const struct { const char *gpu; tk_precision prec; const char *ask, *want; } kern[] = {
        { "t4", TK_PREC_FP16, NULL, "tensor cores, mma.sync m16n8k8 (sm75); head size 64, f16" },
        { "h100-80", TK_PREC_BF16, NULL, "tensor cores, mma.sync m16n8k16 (sm80+); head size 64, bf16" },
        { "h100-80", TK_PREC_FP16, "sm75", "TXK_ATTN_KERNEL=sm75: mma.sync m16n8k8; head size 64, f16" },
        { "l4", TK_PREC_FP16, "reference", "the reference kernel (fp32 cores): TXK_ATTN_KERNEL=reference" },
    };
    for (size_t i = 0; i < sizeof kern / sizeof kern[0]; i++) {
        tk_config k = c;
        tk_plan_result r;
        snprintf(k.gpu, sizeof k.gpu, "%s", kern[i].gpu);
        k.precision = kern[i].prec;
        if (kern[i].ask) setenv("TXK_ATTN_KERNEL", kern[i].ask, 1);
        TK_CHECK_MSG(tk_plan(&k, NULL, 0, &r, &e) == TK_OK, "%s", e.msg);
        unsetenv("TXK_ATTN_KERNEL");
        TK_CHECK_MSG(strncmp(r.attention_kernel, kern[i].want, strlen(kern[i].want)) == 0, "%s: '%s', want '%s'",
                     kern[i].gpu, r.attention_kernel, kern[i].want);
    }
    /* where no tensor-core kernel runs, auto is standard: a t4's bf16, a k80 */
    const struct { const char *gpu; tk_precision prec; } slow[] = { { "t4", TK_PREC_BF16 }, { "k80", TK_PREC_FP16 } };
    for (size_t i = 0; i < sizeof slow / sizeof slow[0]; i++) {
        tk_config k = c;
        snprintf(k.gpu, sizeof k.gpu, "%s", slow[i].gpu);
        k.precision = slow[i].prec;
        TK_CHECK_MSG(tk_plan(&k, NULL, 0, &r, &e) == TK_OK, "%s", e.msg);
        TK_CHECK_MSG(r.attention == TK_ATTN_STANDARD, "%s: auto gave %s", slow[i].gpu, tk_attention_name(r.attention));
    }
    c.attention = TK_ATTN_FUSED; /* the same bytes as auto where auto is fused */
    h.attention = TK_ATTN_FUSED;
    TK_CHECK_MSG(tk_plan(&h, NULL, 0, &fused, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_STR(fused.attention_why, "set in the config");
    TK_CHECK_EQ_INT(fused.peak_allocated, card16.peak_allocated);
    TK_CHECK_MSG(tk_plan(&c, NULL, 0, &fused, &e) == TK_OK, "%s", e.msg);
    /* the card's plan also holds its GEMM workspace and kernel scratch (tag
     * workspace, which the cpu's has not): fused attention keeps less of
     * everything else */
    TK_CHECK_EQ_INT(fused.by_cat_at_peak[TK_CAT_WORKSPACE], TK_CUDA_WORKSPACE_BYTES + 8704);
    TK_CHECK_EQ_INT(card.by_cat_at_peak[TK_CAT_WORKSPACE], TK_CUDA_WORKSPACE_BYTES + 8704);
    TK_CHECK_EQ_INT(cpu.by_cat_at_peak[TK_CAT_WORKSPACE], 0);
    TK_CHECK(fused.peak_allocated - fused.by_cat_at_peak[TK_CAT_WORKSPACE] < cpu.peak_allocated);
    c.attention = TK_ATTN_AUTO;
    tk_measure m;
    TK_CHECK_MSG(tk_train_measure(&c, TK_DEV_CPU, 0, &m, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(m.peak_allocated, card.peak_allocated);
    TK_CHECK_EQ_INT(m.peak_reserved, card.peak_reserved);
}

/* A GPU profile's card also holds the CUDA context, library kernels and what
 * the libraries keep outside the buffers they are given: a plan against
 * `gpu: t4` gives the allocator the card's capacity less the profile's
 * context overhead and those bytes, and says so; the cuda backend's
 * buffers (the GEMM workspace, the kernels' scratch) are allocator blocks
 * inside that budget, tagged `workspace`. An explicit capacity is taken as
 * the allocator's budget. */
static void test_plan_profile_budget(void) {
    tk_config c = tiny_cfg(64, 4);
    snprintf(c.gpu, sizeof c.gpu, "t4");
    const tk_gpu_profile *t4 = tk_gpu_profile_find("t4");
    tk_plan_result p;
    tk_err e = { 0 };
    TK_CHECK_MSG(tk_plan(&c, NULL, 0, &p, &e) == TK_OK, "%s", e.msg);
    size_t own = tk_cuda_library_own_bytes(t4->cc_major, t4->cc_minor, NULL);
    TK_CHECK_EQ_INT(p.capacity, t4->capacity - t4->context_overhead - own);
    TK_CHECK_EQ_INT(p.context_bytes, t4->context_overhead + own);
    TK_CHECK_EQ_INT(p.margin, (int64_t)p.capacity - (int64_t)p.peak_reserved);
    char *txt = tk_plan_format(&p);
    TK_CHECK(txt && strstr(txt, "for the CUDA context"));
    free(txt);
    c.capacity = (size_t)1 << 30;
    TK_CHECK(tk_plan(&c, NULL, 0, &p, &e) == TK_OK);
    TK_CHECK_EQ_INT(p.capacity, (size_t)1 << 30);
    TK_CHECK_EQ_INT(p.context_bytes, 0);
}

/* tk_train_measure (what %txplan --sweep --measure and the GPU suite run):
 * on cpu its peaks equal the plan, and timed_steps runs that many more
 * steps after the memory run without moving the measured peak. */
static void test_measure_matches_plan(void) {
    tk_config c = tiny_cfg(32, 8);
    c.accumulate = 2;
    c.threads = 2;
    tk_err e = { 0 };
    tk_plan_result p;
    TK_CHECK_MSG(tk_plan(&c, NULL, 0, &p, &e) == TK_OK, "%s", e.msg);
    tk_measure m;
    TK_CHECK_MSG(tk_train_measure(&c, TK_DEV_CPU, 3, &m, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(m.peak_reserved, p.peak_reserved);
    TK_CHECK_EQ_INT(m.peak_allocated, p.peak_allocated);
    TK_CHECK_EQ_INT(m.timed_steps, 3);
    TK_CHECK(m.ms_per_step > 0);
    TK_CHECK(!m.have_device);
    /* the cuda records are refused on a cpu device, with the reason */
    tk_dev_opts o = { .kind = TK_DEV_CPU, .threads = 1 };
    tk_dev *d = tk_dev_new(&o, &e);
    tk_cuda_mem_totals t;
    TK_CHECK(tk_dev_cuda_mem_totals(d, &t, &e) == TK_EINVAL);
    TK_CHECK(strstr(e.msg, "cuda") != NULL && strstr(e.msg, "cpu") != NULL);
    tk_dev_destroy(&d);
}

/* The cause of the reserved bytes the H200 showed beyond four plans (issue
 * 33: `accumulate x2` candidates of a 300 MiB plan, 30 MiB more reserved on
 * the card, allocated equal): a plan that reaches its capacity releases the
 * cached segments and retries, as PyTorch's allocator does, and a run under
 * more memory keeps them. Reproduced here on the cpu with a capacity a little
 * under the unconstrained reserved peak: the plan fits only by releasing,
 * a run with no capacity (what tk_train_measure used to do) reserves more,
 * and tk_train_measure, which now runs under the plan's capacity, equals
 * the plan byte for byte. */
static void test_measure_under_plan_capacity(void) {
    tk_config c = tiny_cfg(128, 8);
    c.accumulate = 2;
    c.threads = 2;
    tk_err e = { 0 };
    tk_plan_result free_run, capped;
    TK_CHECK_MSG(tk_plan(&c, NULL, 0, &free_run, &e) == TK_OK, "%s", e.msg);
    /* the tightest capacity that still fits, in 512 KiB steps down from the
     * unconstrained reserved peak: there the plan must give back cache */
    size_t cap = free_run.peak_reserved;
    for (size_t try = free_run.peak_reserved - ((size_t)512 << 10); try > free_run.peak_allocated;
         try -= (size_t)512 << 10) {
        c.capacity = try;
        if (tk_plan(&c, NULL, 0, &capped, &e) != TK_OK || !capped.fits) break;
        cap = try;
    }
    c.capacity = cap;
    TK_CHECK_MSG(tk_plan(&c, NULL, 0, &capped, &e) == TK_OK, "%s", e.msg);
    TK_CHECK(capped.fits);
    TK_CHECK_MSG(capped.peak_reserved < free_run.peak_reserved, "capacity %zu: reserved %zu, unconstrained %zu", cap,
                 capped.peak_reserved, free_run.peak_reserved);
    TK_CHECK_EQ_INT(capped.peak_allocated, free_run.peak_allocated);
    tk_measure m, unlimited;
    TK_CHECK_MSG(tk_train_measure(&c, TK_DEV_CPU, 0, &m, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(m.peak_reserved, capped.peak_reserved);
    TK_CHECK_EQ_INT(m.peak_allocated, capped.peak_allocated);
    c.capacity = 0; /* the measurement as it was: more memory than the plan had */
    TK_CHECK_MSG(tk_train_measure(&c, TK_DEV_CPU, 0, &unlimited, &e) == TK_OK, "%s", e.msg);
    TK_CHECK_EQ_INT(unlimited.peak_allocated, capped.peak_allocated);
    TK_CHECK_EQ_INT(unlimited.peak_reserved, free_run.peak_reserved);
    TK_CHECK(unlimited.peak_reserved > capped.peak_reserved);
}

/* The tensors behind the peak: with every live tensor asked for, their
 * allocator blocks add up to the planned peak, category by category, and
 * each block holds its tensor; the largest for bert-base 32 x 512 is
 * an attention probability tensor [32, 12, 512, 512] of a layer's self
 * attention. */
static void test_tensors_at_peak(void) {
    static tk_tensor_info all[20000];
    const char *models[] = { "bert-tiny", "bert-mini" };
    for (int mi = 0; mi < 2; mi++) {
        pcase pc = { "t", models[mi], TK_HEAD_POOLED, 4, 32, 0, 1, TK_OPTIM_ADAMW, 0, 0, 0, TK_PREC_FP32,
                     TK_RECOMPUTE_NONE, TK_ATTN_STANDARD };
        tk_config c = cfg_of(&pc);
        tk_plan_result p;
        tk_err e = { 0 };
        int n = 0;
        TK_CHECK(tk_plan(&c, NULL, 0, &p, &e) == TK_OK);
        TK_CHECK(tk_plan_tensors_at_peak(&c, NULL, 0, all, 20000, &n, &e) == TK_OK);
        TK_CHECK(n > 0 && n < 20000);
        size_t sum = 0, by[TK_CAT_COUNT] = { 0 };
        for (int i = 0; i < n; i++) {
            size_t r = all[i].block;
            TK_CHECK(r >= all[i].bytes && r - all[i].bytes < (2u << 20));
            sum += r;
            by[all[i].cat] += r;
            if (i) TK_CHECK(all[i].bytes <= all[i - 1].bytes);
        }
        TK_CHECK_MSG(sum == p.peak_allocated, "%s: tensors %zu vs peak %zu", models[mi], sum, p.peak_allocated);
        for (int k = 0; k < TK_CAT_COUNT; k++)
            TK_CHECK_MSG(by[k] == p.by_cat_at_peak[k], "%s %s: %zu vs %zu", models[mi], tk_cat_name((tk_cat)k), by[k],
                         p.by_cat_at_peak[k]);
    }
    tk_config c;
    tk_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "bert-base-cased");
    c.num_labels = 2;
    c.max_len = 512;
    c.batch_size = 32;
    c.device = TK_DEVICE_META;
    int n = 0;
    tk_err e = { 0 };
    TK_CHECK(tk_plan_tensors_at_peak(&c, NULL, 0, all, 3, &n, &e) == TK_OK && n == 3);
    TK_CHECK(all[0].ndim == 4 && all[0].shape[0] == 32 && all[0].shape[1] == 12 && all[0].shape[2] == 512 &&
             all[0].shape[3] == 512 && all[0].dtype == TK_F32 && all[0].bytes == (size_t)32 * 12 * 512 * 512 * 4);
    TK_CHECK(strstr(all[0].owner, "attention.self") != NULL);
}

int main(void) {
    TK_RUN(test_plan_equals_cpu);
    TK_RUN(test_tensors_at_peak);
    TK_RUN(test_plan_does_not_fit);
    TK_RUN(test_plan_dynamic_lengths);
    TK_RUN(test_plan_fused_on_cuda);
    TK_RUN(test_plan_default_attention);
    TK_RUN(test_measure_matches_plan);
    TK_RUN(test_measure_under_plan_capacity);
    TK_RUN(test_plan_profile_budget);
    return tk_test_done();
}
