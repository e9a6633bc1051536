/* test_advisor.c — one scenario per diagnosis, each built to trigger it,
 * asserting the diagnosis and the top-ranked fix; plus the seed scenario's
 * %txfix auto, the fixes' purity, and a fix kind the test adds to the
 * catalogue itself (tk_fix_register) that the search plans and ranks. Plans
 * run on the meta backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tk_test.h"
#include "tk_advisor.h"

static tk_advice *adv;

static int has_diag(const tk_advice *a, tk_diag_kind k) {
    for (int i = 0; i < a->n_diag; i++)
        if (a->diag[i].kind == k)
            return 1;
    return 0;
}
static const tk_diag *get_diag(const tk_advice *a, tk_diag_kind k) {
    for (int i = 0; i < a->n_diag; i++)
        if (a->diag[i].kind == k)
            return &a->diag[i];
    return NULL;
}
static int top_has(const tk_advice *a, tk_fix_kind k) {
    if (a->n_cand == 0)
        return 0;
    for (int i = 0; i < a->cand[0].n_fixes; i++)
        if (a->cand[0].fixes[i].kind == k)
            return 1;
    return 0;
}

static void base_config(tk_config *c, const char *model, int max_len, int batch, const char *cap) {
    tk_err e;
    tk_config_defaults(c);
    snprintf(c->model, sizeof c->model, "%s", model);
    c->max_len = max_len;
    c->batch_size = batch;
    c->device = TK_DEVICE_META;
    if (cap && tk_parse_bytes(cap, &c->capacity) != 0)
        c->capacity = 0;
    TK_CHECK(tk_config_resolve_model(c, &e) == TK_OK);
}

/* A long-tailed corpus: most examples 20..150 tokens, 1% longer. */
static int32_t *corpus(int n, int p99_target) {
    int32_t *l = malloc((size_t)n * sizeof *l);
    uint64_t s = 42;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        int r = (int)((s >> 33) % 1000);
        l[i] = r < 995 ? 20 + (int)((s >> 13) % (uint64_t)(p99_target - 20)) : 200 + r;
    }
    return l;
}

static void test_seed_capacity_auto(void) {
    tk_config c;
    tk_err e;
    base_config(&c, "bert-base-cased", 512, 32, "7.43GiB");
    tk_advise_input in = { .config = &c };
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    TK_CHECK(has_diag(adv, TK_DIAG_CAPACITY));
    TK_CHECK(!adv->base.fits);
    int au = tk_advice_auto(adv);
    TK_CHECK_MSG(au >= 0, "no fitting candidate among %d", adv->n_cand);
    if (au >= 0) {
        const tk_candidate *k = &adv->cand[au];
        TK_CHECK(k->fits_margin);
        TK_CHECK_EQ_INT(k->config.batch_size * k->config.accumulate, 32);
        /* re-plan the chosen config on its own: it fits under the capacity with margin */
        tk_plan_result p;
        TK_CHECK(tk_plan(&k->config, NULL, 0, &p, &e) == TK_OK);
        TK_CHECK(p.fits);
        TK_CHECK(p.peak_reserved + (size_t)(0.05 * (double)c.capacity) <= c.capacity);
        fprintf(stderr, "  seed auto: %s, peak %zu of %zu (%d configs planned in %.0f ms)\n", k->label,
                p.peak_reserved, c.capacity, adv->n_planned, adv->ms);
    }
}

static void test_flatten_head(void) {
    tk_config c;
    tk_err e;
    base_config(&c, "bert-base-uncased", 512, 8, "15.90GiB"); /* the seed's P100 */
    c.task = TK_TASK_QA;
    c.head = TK_HEAD_FLATTEN_DENSE;
    c.head_units = 1604;
    c.towers = 2;
    tk_advise_input in = { .config = &c };
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    const tk_diag *d = get_diag(adv, TK_DIAG_DOMINANT_LAYER);
    TK_CHECK(d != NULL);
    if (d) {
        TK_CHECK(strstr(d->evidence, "786432") != NULL);
        TK_CHECK(strstr(d->evidence, "4.70 GiB") != NULL);
        fprintf(stderr, "  %s\n  %s\n", d->title, d->evidence);
    }
    TK_CHECK(top_has(adv, TK_FIX_HEAD));
}

static void test_max_len_from_corpus(void) {
    tk_config c;
    tk_err e;
    base_config(&c, "bert-base-cased", 512, 32, "14.75GiB");
    int n = 5000;
    int32_t *len = corpus(n, 150);
    tk_advise_input in = { .config = &c, .lengths = len, .n_lengths = n };
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    TK_CHECK(has_diag(adv, TK_DIAG_PADDING));
    TK_CHECK(top_has(adv, TK_FIX_MAX_LEN));
    if (adv->n_cand) {
        TK_CHECK(strstr(adv->cand[0].risk_text, "truncates") != NULL);
        TK_CHECK(adv->cand[0].config.max_len <= 160);
        TK_CHECK(adv->cand[0].risk <= 0.02);
        fprintf(stderr, "  top: %s (%s)\n", adv->cand[0].label, adv->cand[0].risk_text);
    }
    free(len);
}

static void test_fragmentation(void) {
    tk_config c;
    tk_err e;
    base_config(&c, "bert-small", 128, 16, "2GiB");
    tk_oom o;
    memset(&o, 0, sizeof o);
    o.requested = o.rounded = 24u << 20;
    o.capacity = c.capacity;
    o.reserved = 1900u << 20;
    o.allocated = 1500u << 20;
    o.largest_free_block = 20u << 20;
    o.fragmentation = 1;
    snprintf(o.owner_name, sizeof o.owner_name, "bert.encoder.layer.3.intermediate.dense");
    o.tag.cat = TK_CAT_ACT;
    tk_advise_input in = { .config = &c, .oom = &o };
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    TK_CHECK(has_diag(adv, TK_DIAG_FRAGMENTATION));
    TK_CHECK(top_has(adv, TK_FIX_EMPTY_CACHE));
}

static void test_earlier_run_held(void) {
    tk_config c;
    tk_err e;
    base_config(&c, "bert-small", 128, 16, "1GiB");
    tk_plan_result p;
    TK_CHECK(tk_plan(&c, NULL, 0, &p, &e) == TK_OK);
    TK_CHECK(p.fits);
    /* an earlier run holds all but a sliver of what the run needs */
    size_t held = c.capacity - p.peak_reserved / 2;
    tk_advise_input in = { .config = &c, .held_by_session = held };
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    TK_CHECK(has_diag(adv, TK_DIAG_HEADROOM));
    TK_CHECK(top_has(adv, TK_FIX_RELEASE));
    TK_CHECK(adv->n_cand > 0 && adv->cand[0].action_only);
}

/* The session's last run and the companion's live torch state (issue 40):
 * a run of this config that ran out although the plan fits is named with its
 * OOM record and what PyTorch in the process holds, read live; a torch that
 * sees no CUDA is said to hold none of what an earlier run keeps. */
static void test_last_run_and_live_torch(void) {
    tk_config c;
    tk_err e;
    base_config(&c, "bert-small", 128, 16, "1GiB");
    tk_plan_result p;
    TK_CHECK(tk_plan(&c, NULL, 0, &p, &e) == TK_OK);
    TK_CHECK(p.fits);
    tk_oom o;
    memset(&o, 0, sizeof o);
    o.requested = o.rounded = 64u << 20;
    o.allocated = 900u << 20;
    o.reserved = 960u << 20;
    snprintf(o.owner_name, sizeof o.owner_name, "bert.encoder.layer.1.attention.self");
    tk_advise_run run = {.ran_out = 1, .same_config = 1, .oom = &o, .oom_phase = "training",
                         .peak_allocated = 900u << 20, .peak_reserved = 960u << 20, .free_before = 400u << 20};
    tk_advise_torch live = {.state = TK_TORCH_LIVE_HOLDS, .allocated = 512u << 20, .reserved = 768u << 20};
    tk_advise_input in = {.config = &c, .last_run = &run, .torch_live = &live};
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    const tk_diag *d = get_diag(adv, TK_DIAG_HEADROOM);
    TK_CHECK_MSG(d && strstr(d->title, "the last run of this config ran out of memory"), "%s", d ? d->title : "none");
    TK_CHECK_MSG(d && strstr(d->evidence, "in training: bert.encoder.layer.1.attention.self asked for 64.00 MiB") &&
                 strstr(d->evidence, "started with 400.00 MiB free") &&
                 strstr(d->evidence, "memory_reserved() 768.00 MiB, memory_allocated() 512.00 MiB: 256.00 MiB is cache"),
                 "%s", d ? d->evidence : "none");
    /* the same run of another config says nothing of this one */
    run.same_config = 0;
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    TK_CHECK(!has_diag(adv, TK_DIAG_HEADROOM));
    /* no CUDA in torch: what an earlier run holds is not PyTorch's */
    live = (tk_advise_torch){.state = TK_TORCH_LIVE_NO_CUDA};
    tk_advise_input in2 = {.config = &c, .held_by_session = c.capacity - p.peak_reserved / 2, .torch_live = &live};
    TK_CHECK(tk_advise(&in2, adv, &e) == TK_OK);
    d = get_diag(adv, TK_DIAG_HEADROOM);
    TK_CHECK_MSG(d && strstr(d->evidence, "%txreset releases it; PyTorch in this process sees no CUDA device, so it "
                                          "holds none of it"), "%s", d ? d->evidence : "none");
    /* absent by default: the evidence as before */
    tk_advise_input in3 = {.config = &c, .held_by_session = c.capacity - p.peak_reserved / 2};
    TK_CHECK(tk_advise(&in3, adv, &e) == TK_OK);
    d = get_diag(adv, TK_DIAG_HEADROOM);
    TK_CHECK(d && !strstr(d->evidence, "PyTorch"));
}

static void test_leak_named(void) {
    tk_config c;
    tk_err e;
    base_config(&c, "bert-tiny", 64, 8, "1GiB");
    size_t steps[6] = { 100u << 20, 104u << 20, 108u << 20, 112u << 20, 116u << 20, 120u << 20 };
    tk_advise_input in = { .config = &c, .step_allocated = steps, .n_steps = 6,
                           .leak_owner = "classifier" };
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    const tk_diag *d = get_diag(adv, TK_DIAG_LEAK);
    TK_CHECK(d != NULL && strstr(d->title, "classifier") != NULL);
    /* a flat series is no leak */
    size_t flat[6] = { 100, 100, 100, 100, 100, 100 };
    in.step_allocated = flat;
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    TK_CHECK(!has_diag(adv, TK_DIAG_LEAK));
}

static void test_fix_purity(void) {
    tk_config c, d;
    char r[256];
    base_config(&c, "bert-base-cased", 512, 32, "7.43GiB");
    d = c;
    tk_fix f = { .kind = TK_FIX_ACCUMULATE, .value = 4 };
    TK_CHECK(tk_fix_apply(&d, &f, NULL, 0, r, sizeof r) == 0);
    TK_CHECK_EQ_INT(d.batch_size, 8);
    TK_CHECK_EQ_INT(d.accumulate, 4);
    TK_CHECK_EQ_INT(c.batch_size, 32);
    tk_fix m = { .kind = TK_FIX_MAX_LEN, .value = 128 };
    TK_CHECK(tk_fix_apply(&d, &m, NULL, 0, r, sizeof r) == -1); /* needs corpus lengths */
    tk_fix h = { .kind = TK_FIX_HEAD };
    TK_CHECK(tk_fix_apply(&d, &h, NULL, 0, r, sizeof r) == -1); /* not a flatten head */
}

/* The one long batch that only sometimes comes: dynamic padding over a
 * corpus of short examples with a few at 512. Diagnosed as a data spike whose
 * typical batch (the median longest of 32 random examples) is far below the
 * longest; the top fix cuts max_len, with its truncation said. */
static void test_data_spike(void) {
    tk_config c;
    tk_err e;
    base_config(&c, "bert-base-cased", 512, 32, "14.75GiB");
    c.batching = TK_BATCH_DYNAMIC;
    int n = 4000;
    int32_t *len = malloc((size_t)n * sizeof *len);
    for (int i = 0; i < n; i++)
        len[i] = i % 400 == 7 ? 512 : 16 + (i * 37) % 96; /* 0.25% at 512, the rest 16..111 */
    tk_advise_input in = { .config = &c, .lengths = len, .n_lengths = n };
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    const tk_diag *d = get_diag(adv, TK_DIAG_DATA_SPIKE);
    TK_CHECK(d != NULL);
    if (d) {
        int longest = 0, typical = 0;
        TK_CHECK(sscanf(d->title, "the longest batch pads to %d tokens; the typical one to about %d", &longest,
                        &typical) == 2);
        TK_CHECK_EQ_INT(longest, 512);
        /* 0.5^(1/32) = 0.9786: the 97.9th percentile of 16..111 is about 109 */
        TK_CHECK_MSG(typical >= 100 && typical <= 111, "typical %d", typical);
        TK_CHECK(strstr(d->evidence, "intermittent") != NULL);
    }
    TK_CHECK(adv->n_cand > 0 && adv->cand[0].fixes[0].kind == TK_FIX_MAX_LEN && adv->cand[0].fits_margin);
    if (adv->n_cand) {
        TK_CHECK(strstr(adv->cand[0].risk_text, "truncates 0.2% of examples") != NULL ||
                 strstr(adv->cand[0].risk_text, "truncates 0.3% of examples") != NULL);
        fprintf(stderr, "  spike: %s; top: %s (%s)\n", d ? d->title : "-", adv->cand[0].label, adv->cand[0].risk_text);
    }
    free(len);
}

/* ---- a fix kind defined here, through the table alone ---------------------- */

static int half_apply(tk_config *c, const tk_fix *f, const int32_t *len, int n, char *reason, size_t rn) {
    (void)f, (void)len, (void)n;
    if (c->max_len < 64)
        return -1;
    snprintf(reason, rn, "max_len %d -> %d (the test's own fix)", c->max_len, c->max_len / 2);
    c->max_len /= 2;
    return 0;
}
static int half_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    if (max < 1 || in->config->max_len < 64)
        return 0;
    out[0] = (tk_fix){ .kind = self };
    return 1;
}
static void half_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    (void)f;
    snprintf(o, n, "halve max_len to %d", fixed->max_len);
}

static void test_registered_fix_kind(void) {
    int before = tk_fix_n_kinds();
    tk_fix_def half = { .name = "half max_len", .apply = half_apply, .propose = half_propose, .label = half_label,
                        .removes = 1u << TK_DIAG_CAPACITY };
    int kind = tk_fix_register(&half);
    TK_CHECK_EQ_INT(kind, before);
    TK_CHECK_EQ_INT(tk_fix_n_kinds(), before + 1);
    TK_CHECK(strcmp(tk_fix_name((tk_fix_kind)kind), "half max_len") == 0);
    tk_fix_def bad = { .name = "no apply" };
    TK_CHECK_EQ_INT(tk_fix_register(&bad), -1);

    /* the seed: bert-base 512 x 32 in 7.43 GiB does not fit */
    tk_config c;
    tk_err e;
    base_config(&c, "bert-base-cased", 512, 32, "7.43GiB");
    tk_advise_input in = { .config = &c };
    TK_CHECK(tk_advise(&in, adv, &e) == TK_OK);
    TK_CHECK(has_diag(adv, TK_DIAG_CAPACITY));
    int at = -1;
    for (int i = 0; i < adv->n_cand && at < 0; i++)
        if (adv->cand[i].n_fixes == 1 && (int)adv->cand[i].fixes[0].kind == kind)
            at = i;
    TK_CHECK_MSG(at >= 0, "the registered fix is not among the %d candidates", adv->n_cand);
    if (at < 0)
        return;
    const tk_candidate *k = &adv->cand[at];
    /* planned: its peak is the planner's for the config it shows */
    TK_CHECK_EQ_INT(k->config.max_len, 256);
    TK_CHECK(strcmp(k->label, "halve max_len to 256") == 0);
    TK_CHECK(strstr(k->reason, "the test's own fix") != NULL);
    tk_plan_result p;
    TK_CHECK(tk_plan(&k->config, NULL, 0, &p, &e) == TK_OK);
    TK_CHECK_EQ_INT(k->peak, p.peak_reserved);
    /* ranked: it fits with margin and removes the diagnosed cause (capacity),
     * with no risk stated: first, and what %txfix auto picks */
    TK_CHECK(k->fits_margin && k->addresses_cause);
    TK_CHECK(strcmp(k->risk_text, "none") == 0);
    TK_CHECK_EQ_INT(at, 0);
    TK_CHECK_EQ_INT(tk_advice_auto(adv), 0);
    fprintf(stderr, "  registered fix: #%d of %d, peak %zu of capacity %zu\n", at + 1, adv->n_cand, k->peak,
            adv->capacity);
}

int main(void) {
    adv = malloc(sizeof *adv);
    TK_RUN(test_fix_purity);
    TK_RUN(test_seed_capacity_auto);
    TK_RUN(test_flatten_head);
    TK_RUN(test_max_len_from_corpus);
    TK_RUN(test_fragmentation);
    TK_RUN(test_earlier_run_held);
    TK_RUN(test_last_run_and_live_torch);
    TK_RUN(test_leak_named);
    TK_RUN(test_data_spike);
    TK_RUN(test_registered_fix_kind); /* last: it adds a row for the rest of the process */
    free(adv);
    return tk_test_done();
}
