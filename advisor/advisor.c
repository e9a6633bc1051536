/* advisor.c — diagnoses of a plan or an OOM, and the search that plans each
 * fix of the catalogue (fixes.c, one table) and combinations of them on the
 * meta device, then ranks them.
 *
 * The plan's room reads one way: read -> facts -> diagnose -> fixes -> code.
 * read_plan_facts fills the one facts record (tk_facts.h) that the pasted
 * message's and the snapshot's readers fill too, with what the figures
 * prove; the one ordered table of diagnoses (diagnoses.c) adds each finding
 * with the numbers behind it and marks the fixes that remove its cause.
 *
 * Guarantees: every candidate offered was planned with the config it shows,
 * by the engine it names or by the input's planner (plan_fn: a traced
 * model's, which traces each candidate) (a config the trainer rejects is dropped, never offered); the
 * search is bounded by a plan budget; nothing here allocates device memory
 * outside the planner's meta devices.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk_advisor.h"
#include "tk_host_mem.h"
#include "tk_advisor_impl.h"
#include "tk_oom_message.h"
#include "tk_facts.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static char *fmtb(size_t b, char *buf) { return tk_format_bytes(b, buf, 32); }

/* ---- costs ---------------------------------------------------------------- */

/* Relative time per training sample of a plan. The roofline step time when a
 * GPU profile is known; otherwise FLOPs plus bytes weighted by a generic
 * 10 FLOP/byte machine balance — only ratios of it are used. With several
 * ranks their steps run side by side, each on its own batch; the time the
 * collectives take is not in it (not modelled). */
static double time_per_sample(const tk_config *c, const tk_plan_result *p) {
    double t = p->step_seconds > 0 ? p->step_seconds
                                    : p->train_step.flops + 10.0 * p->train_step.bytes;
    int acc = c->accumulate > 1 ? c->accumulate : 1;
    double samples = (double)c->batch_size * acc * tk_config_world_size(c);
    return samples > 0 ? t / samples : t;
}

/* The one way a config is planned here: the input's planner (a traced
 * model's, each candidate traced), else the engine the config names. */
static tk_status plan_config(const tk_advise_input *in, const tk_config *c, tk_plan_result *out, tk_err *err) {
    if (in->plan_fn) return in->plan_fn(in->plan_ctx, c, (const int *)in->lengths, in->n_lengths, out, err);
    return tk_plan_engine(c, (const int *)in->lengths, in->n_lengths, out, err);
}

static int effective_batch(const tk_config *c) {
    return c->batch_size * (c->accumulate > 1 ? c->accumulate : 1) * tk_config_world_size(c);
}

/* ---- diagnoses ------------------------------------------------------------ */

typedef struct {
    const tk_advise_input *in;
    tk_advice *out;
    size_t available;          /* what a run may take now */
    size_t margin_bytes;
    int cause[TK_FIX_MAX_KINDS]; /* 1: this kind removes a diagnosed cause */
    double base_tps;
    int nomem;                 /* a plan ran out of host memory: the advice fails with TK_ENOMEM */
    tk_card_fit cards[16];     /* the config on each card of the platform (the facts' cards) */
} adv_ctx;

static void add_diag(tk_advice *a, tk_diag_kind k, const char *title, const char *evidence) {
    if (a->n_diag >= TK_DIAG_COUNT)
        return;
    tk_diag *d = &a->diag[a->n_diag++];
    d->kind = k;
    snprintf(d->title, sizeof d->title, "%s", title);
    snprintf(d->evidence, sizeof d->evidence, "%s", evidence);
}

/* The plan's reader: the facts record (tk_facts.h) from the config as
 * given, its plan, what is free and held, the session's OOM record, the
 * corpus' lengths, the allocated bytes at step boundaries and the config
 * planned on each card of the platform; then what those figures prove,
 * once. The rules below only test and say it. */
static void read_plan_facts(adv_ctx *x, tk_facts *f) {
    const tk_advise_input *in = x->in;
    const tk_advice *a = x->out;
    const tk_config *c = in->config;
    const tk_plan_result *p = &a->base;
    memset(f, 0, sizeof *f);
    f->own = f->other = -1;
    f->snap_user = f->snap_device = -1;
    f->lottery_near = -1;
    f->api = a->api;
    f->config = c, f->base = p;
    f->capacity = a->capacity, f->available = x->available;
    f->held_in_process = in->held_in_process, f->held_by_session = in->held_by_session;
    f->oom = in->oom;
    f->last_run = in->last_run, f->torch_live = in->torch_live;
    f->step_allocated = in->step_allocated, f->n_steps = in->n_steps, f->leak_owner = in->leak_owner;
    if (in->lengths && in->n_lengths > 0) {
        f->lengths = in->lengths, f->n_lengths = in->n_lengths;
        f->p50 = tk_adv_quantile(in->lengths, in->n_lengths, 0.50);
        f->p99 = tk_adv_quantile(in->lengths, in->n_lengths, 0.99);
        f->len_max = tk_adv_quantile(in->lengths, in->n_lengths, 1.0);
    }
    /* room: capacity, or headroom (fits the card, not what is free now) */
    size_t need = p->peak_reserved;
    f->over_capacity = a->capacity && need > a->capacity;
    f->over_free = !f->over_capacity && a->capacity && need > x->available;
    f->oom_frag = in->oom && in->oom->fragmentation;
    f->ran_out_fits = in->last_run && in->last_run->ran_out && in->last_run->same_config && !f->over_capacity &&
                      !f->over_free && a->capacity;
    if (in->oom) f->oom_cat = tk_cat_name(in->oom->tag.cat);
    /* the peak's owners and categories */
    if (p->n_top > 0 && p->peak_allocated > 0) f->top_share = (double)p->top[0].bytes / (double)p->peak_allocated;
    if (p->peak_allocated > 0) {
        f->states = p->by_cat_at_peak[TK_CAT_PARAM] + p->by_cat_at_peak[TK_CAT_GRAD] + p->by_cat_at_peak[TK_CAT_OPTIM];
        f->act = p->by_cat_at_peak[TK_CAT_ACT] + p->by_cat_at_peak[TK_CAT_TEMP];
        f->act_share = (double)f->act / (double)p->peak_allocated;
        f->states_share = (double)f->states / (double)p->peak_allocated;
    }
    /* a flatten_dense head as the largest owner: its weight's shape */
    if (p->n_top > 0 && c->head == TK_HEAD_FLATTEN_DENSE && strncmp(p->top[0].owner, "bert.", 5) != 0) {
        tk_config hc = tk_adv_dims_of(c);
        f->head_dominates = 1;
        f->head_units = hc.head_units;
        f->head_in = (int64_t)(hc.towers > 0 ? hc.towers : 1) * hc.max_len * hc.hidden;
        f->head_weight = (size_t)f->head_in * (size_t)(hc.head_units > 0 ? hc.head_units : 1) * 4;
        f->head_span = (size_t)(2 * hc.hidden + 2) * 4;
    }
    /* the corpus: padding far above what it needs, or a spike under dynamic padding */
    if (f->lengths) {
        if (c->batching == TK_BATCH_FIXED && c->max_len >= 2 * tk_adv_round_up8(f->p99)) {
            double real = 0;
            for (int i = 0; i < f->n_lengths; i++)
                real += f->lengths[i] < c->max_len ? f->lengths[i] : c->max_len;
            f->padded = 1;
            f->pad_waste = 1.0 - real / ((double)f->n_lengths * c->max_len);
        }
        if (c->batching != TK_BATCH_FIXED && f->len_max > 2 * f->p99 && f->len_max > 2 * f->p50) {
            f->spike = 1;
            f->spike_cap = f->len_max < c->max_len ? f->len_max : c->max_len;
            /* a dynamic batch of B random examples pads to the longest of B:
             * its median is the 0.5^(1/B) quantile of the lengths; a bucket's
             * batch holds similar lengths, about the median one */
            f->spike_typical = c->batching == TK_BATCH_BUCKETS
                                   ? f->p50
                                   : tk_adv_quantile(f->lengths, f->n_lengths,
                                                     pow(0.5, 1.0 / (c->batch_size > 0 ? c->batch_size : 1)));
            if (f->spike_typical > f->spike_cap) f->spike_typical = f->spike_cap;
        }
    }
    /* a leak: allocated at step boundaries keeps growing */
    if (f->step_allocated && f->n_steps >= 3) {
        int up = 0;
        for (int i = 1; i < f->n_steps; i++)
            up += f->step_allocated[i] > f->step_allocated[i - 1];
        f->leak_first = f->step_allocated[0], f->leak_last = f->step_allocated[f->n_steps - 1];
        if (f->leak_last > f->leak_first && up >= (f->n_steps - 1) * 3 / 4) {
            f->leak = 1;
            f->leak_per = (f->leak_last - f->leak_first) / (size_t)(f->n_steps - 1);
        }
    }
    /* the same config on each card the platform hands out (the card lottery);
     * on Kaggle the card is the notebook's setting (card choice) */
    f->gpu = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    f->platform = in->platform ? in->platform : tk_gpu_platform_of(f->gpu);
    int nc = 0;
    tk_err ce = { 0 };
    tk_status cst = f->platform ? tk_plan_cards_by(in->plan_fn, in->plan_ctx, c, in->lengths, in->n_lengths,
                                                   f->platform, x->cards, 16, &nc, &ce)
                                : TK_EINVAL;
    if (cst == TK_ENOMEM) x->nomem = 1;
    if (cst == TK_OK) {
        f->cards = x->cards, f->n_cards = nc;
        int any = 0, fits_cur = a->base.fits;
        for (int i = 0; i < nc; i++) {
            any |= x->cards[i].fits;
            if (x->cards[i].card == f->gpu) fits_cur = x->cards[i].fits;
            if (x->cards[i].fits && x->cards[i].margin < (int64_t)(x->cards[i].budget / 20) && f->lottery_near < 0)
                f->lottery_near = i;
        }
        f->lottery = any && (!fits_cur || f->lottery_near >= 0);
    }
}

/* read -> facts -> diagnose (the one table, diagnoses.c): the findings
 * with their titles into the advice, then the fix kinds whose cause a
 * finding names */
static void diagnose(adv_ctx *x) {
    tk_facts f;
    read_plan_facts(x, &f);
    tk_diagnosis *d = tk_malloc(sizeof *d);
    if (!d) {
        x->nomem = 1;
        return;
    }
    d->max_diag = TK_DIAG_COUNT, d->max_fixes = 0;
    tk_diagnose(&f, d);
    for (int i = 0; i < d->n_diag; i++)
        add_diag(x->out, d->diag[i].kind, d->title[i], d->diag[i].text);
    for (int k = 0; k < TK_FIX_COUNT; k++)
        if (d->cause & (1u << k)) x->cause[k] = 1;
    free(d);
    /* a registered fix names the diagnoses whose cause it removes */
    for (int k = TK_FIX_COUNT; k < tk_fix_n_kinds(); k++)
        for (int i = 0; i < x->out->n_diag; i++)
            if (tk_fix_def_of((tk_fix_kind)k)->removes & (1u << x->out->diag[i].kind))
                x->cause[k] = 1;
}

/* ---- candidates ----------------------------------------------------------- */

typedef struct {
    tk_candidate *v;
    int n, cap;
} cand_list;

static int has_kind(const tk_candidate *c, tk_fix_kind k) {
    for (int i = 0; i < c->n_fixes; i++)
        if (c->fixes[i].kind == k)
            return 1;
    return 0;
}

/* Applies the fixes to the candidate's config, one by one, through their
 * rows: the reason, the label and the risk of each. -1 when one does not
 * apply. */
static int apply_fixes(adv_ctx *x, const tk_fix *fixes, int n, tk_candidate *out) {
    const tk_advise_input *in = x->in;
    double risk_keep = 1.0;
    char rtext[192] = "";
    for (int i = 0; i < n; i++) {
        const tk_fix_def *d = tk_fix_def_of(fixes[i].kind);
        char reason[256], lab[48], w[96] = "";
        if (!d || d->apply(&out->config, &fixes[i], in->lengths, in->n_lengths, reason, sizeof reason))
            return -1;
        out->fixes[i] = fixes[i];
        size_t l = strlen(out->reason);
        snprintf(out->reason + l, sizeof out->reason - l, "%s%s", l ? "; " : "", reason);
        tk_fix_label(&fixes[i], &out->config, lab, sizeof lab);
        l = strlen(out->label);
        snprintf(out->label + l, sizeof out->label - l, "%s%s", l ? " + " : "", lab);
        double r = d->risk ? d->risk(&fixes[i], &out->config, in->lengths, in->n_lengths, w, sizeof w) : 0;
        risk_keep *= 1.0 - r;
        if (w[0]) {
            l = strlen(rtext);
            snprintf(rtext + l, sizeof rtext - l, "%s%s", l ? "; " : "", w);
        }
        if (d->action_only)
            out->action_only = n == 1;
        if (x->cause[fixes[i].kind])
            out->addresses_cause = 1;
    }
    out->risk = 1.0 - risk_keep;
    snprintf(out->risk_text, sizeof out->risk_text, "%s", rtext[0] ? rtext : "none");
    return 0;
}

/* Applies fixes to the config, plans it and fills a candidate. Returns 0, or
 * -1 when a fix does not apply or the trainer rejects the config. */
static int evaluate(adv_ctx *x, const tk_fix *fixes, int n, tk_candidate *out) {
    const tk_advise_input *in = x->in;
    memset(out, 0, sizeof *out);
    out->config = *in->config;
    out->n_fixes = n;
    if (apply_fixes(x, fixes, n, out))
        return -1;
    tk_plan_result p;
    tk_err e;
    tk_status pst = plan_config(in, &out->config, &p, &e);
    if (pst == TK_ENOMEM) x->nomem = 1; /* not the config's fault: the whole advice fails */
    if (pst != TK_OK)
        return -1;
    x->out->n_planned++;
    size_t avail = x->available;
    for (int i = 0; i < n; i++) {
        const tk_fix_def *d = tk_fix_def_of(fixes[i].kind);
        if (d->frees)
            avail += d->frees(&fixes[i], in);
    }
    if (x->out->capacity && avail > x->out->capacity)
        avail = x->out->capacity;
    out->peak = p.peak_reserved;
    out->margin = (int64_t)avail - (int64_t)p.peak_reserved;
    out->fits = !avail || p.peak_reserved <= avail;
    out->fits_margin = !avail || p.peak_reserved + x->margin_bytes <= avail;
    double tps = time_per_sample(&out->config, &p);
    out->slowdown = x->base_tps > 0 ? tps / x->base_tps : 1.0;
    return 0;
}

static int push(cand_list *l, const tk_candidate *c) {
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 64;
        tk_candidate *v = tk_realloc(l->v, (size_t)nc * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = nc;
    }
    l->v[l->n++] = *c;
    return 0;
}

static int tier(const tk_candidate *c) { return c->fits_margin ? 0 : c->fits ? 1 : 2; }

static int cmp_cand(const void *pa, const void *pb) {
    const tk_candidate *a = pa, *b = pb;
    if (tier(a) != tier(b))
        return tier(a) - tier(b);
    if (tier(a) == 2) /* nothing fits: the closest first */
        return a->margin > b->margin ? -1 : a->margin < b->margin;
    if (a->addresses_cause != b->addresses_cause)
        return b->addresses_cause - a->addresses_cause;
    if (a->n_fixes != b->n_fixes)
        return a->n_fixes - b->n_fixes;
    /* the same single fix with two parameters: the smaller change first
     * (accumulate x2 before x8, fewer frozen layers, the larger batch) */
    if (a->n_fixes == 1 && b->n_fixes == 1 && a->fixes[0].kind == b->fixes[0].kind && a->fixes[0].value != b->fixes[0].value) {
        tk_fix_kind k = a->fixes[0].kind;
        if (k == TK_FIX_ACCUMULATE || k == TK_FIX_FREEZE_LAYERS)
            return a->fixes[0].value < b->fixes[0].value ? -1 : 1;
        if (k == TK_FIX_BATCH || k == TK_FIX_EVAL_BATCH)
            return a->fixes[0].value > b->fixes[0].value ? -1 : 1;
    }
    /* a fix that puts more than 2% of results at risk (truncated examples,
     * frozen weights) ranks after those that do not */
    if ((a->risk > 0.02) != (b->risk > 0.02))
        return a->risk > 0.02 ? 1 : -1;
    /* slowdowns within 2% are a tie: then the lower risk */
    if (fabs(a->slowdown - b->slowdown) > 0.02 * (a->slowdown < b->slowdown ? a->slowdown : b->slowdown))
        return a->slowdown < b->slowdown ? -1 : 1;
    if (a->risk != b->risk)
        return a->risk < b->risk ? -1 : 1;
    return a->peak < b->peak ? -1 : a->peak > b->peak;
}

/* 1: the candidate saves nothing against `than` (its plan's peak is not
 * below it), frees nothing outside the config and removes no diagnosed
 * cause: not worth listing. */
static int saves_nothing(const adv_ctx *x, const tk_candidate *c, size_t than) {
    if (c->action_only || c->peak < than || c->addresses_cause)
        return 0; /* a diagnosed cause's own fix (empty_cache for fragmentation) stays */
    for (int i = 0; i < c->n_fixes; i++) {
        const tk_fix_def *d = tk_fix_def_of(c->fixes[i].kind);
        if (d->frees && d->frees(&c->fixes[i], x->in))
            return 0;
        if (c->fixes[i].kind == TK_FIX_DATA_PARALLEL)
            return 0; /* its peak is each GPU's: the split is the saving */
    }
    return 1;
}

/* The single fixes worth trying for this config: each row's proposals, in
 * the table's order. */
static int single_fixes(const adv_ctx *x, tk_fix *f, int max) {
    int n = 0;
    for (int k = 0; k < tk_fix_n_kinds() && n < max; k++) {
        const tk_fix_def *d = tk_fix_def_of((tk_fix_kind)k);
        if (d->propose)
            n += d->propose((tk_fix_kind)k, x->in, f + n, max - n);
    }
    return n;
}

/* Kinds that are combined in the search; the others stand alone. */
static int combinable(tk_fix_kind k) {
    const tk_fix_def *d = tk_fix_def_of(k);
    return d && d->combinable;
}

tk_status tk_advise(const tk_advise_input *in, tk_advice *out, tk_err *err) {
    double t0 = now_ms();
    if (!in || !in->config || !out) {
        tk_err_set(err, TK_EINVAL, "tk_advise: config is required");
        return TK_EINVAL;
    }
    memset(out, 0, sizeof *out);
    out->given = *in->config;
    out->api = in->api != TK_API_AUTO ? in->api : tk_config_api(in->config);
    if (in->plan) {
        out->base = *in->plan;
    } else {
        tk_status pst = plan_config(in, in->config, &out->base, err);
        if (pst != TK_OK)
            return pst;
        out->n_planned++;
    }
    adv_ctx x = { .in = in, .out = out };
    out->capacity = out->base.capacity;
    if (in->oom && !out->capacity)
        out->capacity = in->oom->capacity;
    size_t avail = in->free_now ? in->free_now : out->capacity;
    if (!in->free_now) {
        size_t held = in->held_by_session + in->held_in_process;
        avail = avail > held ? avail - held : (avail ? 1 : 0);
    }
    x.available = avail;
    out->free_now = avail;
    double mf = in->margin_frac > 0 ? in->margin_frac : 0.05;
    x.margin_bytes = (size_t)(mf * (double)out->capacity);
    x.base_tps = time_per_sample(in->config, &out->base);
    out->base_effective_batch = effective_batch(in->config);

    diagnose(&x);
    if (x.nomem)
        return tk_err_nomem(err, "advisor: planning the platform's cards");

    int budget = in->max_plans > 0 ? in->max_plans : 400;
    tk_fix singles[32];
    int ns = single_fixes(&x, singles, 32);
    cand_list all = { 0 };
    tk_candidate c;
    /* which singles were planned, and which fit with margin (supersets of a
     * set that fits already are not searched: they only add change) */
    int ok1[32] = { 0 }, fit1[32] = { 0 };
    size_t peak1[32] = { 0 };
    for (int i = 0; i < ns && out->n_planned < budget; i++) {
        if (evaluate(&x, &singles[i], 1, &c) == 0) {
            ok1[i] = 1;
            fit1[i] = c.fits_margin;
            peak1[i] = c.peak;
            if (saves_nothing(&x, &c, out->base.peak_reserved))
                continue; /* a fix that saves nothing is not listed */
            if (push(&all, &c))
                goto nomem;
        }
    }
    /* pairs, then triples, of combinable fixes of different kinds */
    int pair_fit[32][32];
    memset(pair_fit, 0, sizeof pair_fit);
    for (int i = 0; i < ns && out->n_planned < budget; i++) {
        if (!ok1[i] || fit1[i] || !combinable(singles[i].kind))
            continue;
        for (int j = i + 1; j < ns && out->n_planned < budget; j++) {
            if (!ok1[j] || fit1[j] || !combinable(singles[j].kind) || singles[j].kind == singles[i].kind)
                continue;
            tk_fix f[2] = { singles[i], singles[j] };
            if (evaluate(&x, f, 2, &c) == 0) {
                pair_fit[i][j] = c.fits_margin ? 1 : -1;
                /* a pair one of whose fixes adds nothing to the other is that other alone */
                if (saves_nothing(&x, &c, peak1[i] < peak1[j] ? peak1[i] : peak1[j]))
                    continue;
                if (push(&all, &c))
                    goto nomem;
            }
        }
    }
    for (int i = 0; i < ns && out->n_planned < budget; i++) {
        for (int j = i + 1; j < ns && out->n_planned < budget; j++) {
            if (pair_fit[i][j] != -1)
                continue;
            for (int k = j + 1; k < ns && out->n_planned < budget; k++) {
                if (pair_fit[i][k] != -1 || pair_fit[j][k] != -1 ||
                    singles[k].kind == singles[i].kind || singles[k].kind == singles[j].kind)
                    continue;
                tk_fix f[3] = { singles[i], singles[j], singles[k] };
                if (evaluate(&x, f, 3, &c) == 0 && push(&all, &c))
                    goto nomem;
            }
        }
    }
    if (x.nomem)
        goto nomem;
    if (all.n) { /* none at all: all.v is NULL, which qsort and memcpy may not take */
        qsort(all.v, (size_t)all.n, sizeof *all.v, cmp_cand);
        out->n_cand = all.n < TK_ADVICE_MAX_CANDS ? all.n : TK_ADVICE_MAX_CANDS;
        memcpy(out->cand, all.v, (size_t)out->n_cand * sizeof *all.v);
    }
    free(all.v);
    out->ms = now_ms() - t0;
    return TK_OK;
nomem:
    free(all.v);
    tk_err_set(err, TK_ENOMEM, "advisor: out of host memory while ranking fixes");
    return TK_ENOMEM;
}

json_t *tk_fix_json(const tk_fix *f) {
    char param[48];
    return json_pack("{s:s, s:i, s:s}", "kind", tk_fix_name(f->kind), "value", f->value, "param",
                     tk_fix_param(f, param, sizeof param));
}

int tk_advice_auto(const tk_advice *a) {
    for (int i = 0; i < a->n_cand; i++) {
        const tk_candidate *c = &a->cand[i];
        if (c->fits_margin && !has_kind(c, TK_FIX_BATCH) && !tk_config_plan_only(&c->config) &&
            effective_batch(&c->config) == a->base_effective_batch)
            return i;
    }
    return -1;
}

/* ---- reports -------------------------------------------------------------- */

static void sb_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void sb_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    if (!*buf)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (k < 0)
            return;
        if ((size_t)k < *cap - *len) {
            *len += (size_t)k;
            return;
        }
        size_t nc = *cap * 2 + (size_t)k;
        char *nb = tk_realloc(*buf, nc);
        if (!nb) {
            free(*buf);
            *buf = NULL;
            return;
        }
        *buf = nb;
        *cap = nc;
    }
}

/* The code of candidate i in the advice's API, indented under its row. */
static void format_code(char **s, size_t *len, size_t *cap, const tk_advice *a, int i) {
    const tk_candidate *c = &a->cand[i];
    if (c->action_only) return;
    char *code = tk_fix_code(&a->given, &c->config, a->api);
    if (!code) { /* out of host memory: the whole report fails, never a shorter one */
        free(*s);
        *s = NULL;
        return;
    }
    sb_printf(s, len, cap, "  #%d %s:\n", i + 1, c->label);
    for (const char *p = code; *p;) {
        const char *nl = strchr(p, '\n');
        int k = nl ? (int)(nl - p) : (int)strlen(p);
        sb_printf(s, len, cap, "      %.*s\n", k, p);
        p += k + (nl ? 1 : 0);
    }
    free(code);
}

/* What the given config has on already, which no fix offers again, in
 * words ("fp16, gradient checkpointing"); "" when nothing. Returns buf. */
static char *already_on(const tk_config *c, char *buf, size_t n) {
    size_t w = 0;
    buf[0] = 0;
#define ON(cond, words) \
    if (cond) w += (size_t)snprintf(buf + w, w < n ? n - w : 0, "%s%s", w ? ", " : "", words)
    ON(c->precision != TK_PREC_FP32, c->precision == TK_PREC_BF16 ? "bf16 mixed precision" : "fp16 mixed precision");
    ON(c->recompute != TK_RECOMPUTE_NONE, "gradient checkpointing");
    ON(c->optimizer == TK_OPTIM_ADAMW8, "8-bit AdamW");
    ON(c->batching != TK_BATCH_FIXED, c->batching == TK_BATCH_BUCKETS ? "length buckets" : "dynamic padding");
    ON(c->freeze_embeddings, "frozen embeddings");
#undef ON
    return buf;
}

/* The report; `cli`: the config's path when a shell prints it (closing
 * lines name txk's commands), NULL in a notebook (they name the magics). */
static char *format_advice(const tk_advice *a, int top, const char *cli) {
    size_t cap = 4096, len = 0;
    char *s = tk_malloc(cap);
    char b1[32], b2[32];
    if (!s)
        return NULL;
    s[0] = 0;
    int limited = a->free_now > 0;
    if (limited) {
        sb_printf(&s, &len, &cap, "Planned peak %s of %s available",
                  fmtb(a->base.peak_reserved, b1), fmtb(a->free_now, b2));
        sb_printf(&s, &len, &cap, a->base.fits && a->base.peak_reserved <= a->free_now ? " - fits.\n" : " - does not fit.\n");
    } else {
        sb_printf(&s, &len, &cap, "Planned peak %s; no capacity to fit against (give gpu: PROFILE or capacity: "
                  "SIZE, or run on cuda): the fixes below are ranked by what they save and cost.\n",
                  fmtb(a->base.peak_reserved, b1));
    }
    if (a->n_diag) {
        sb_printf(&s, &len, &cap, "\nWhy:\n");
        for (int i = 0; i < a->n_diag; i++)
            sb_printf(&s, &len, &cap, "  [%s] %s\n      %s\n", tk_diag_name(a->diag[i].kind),
                      a->diag[i].title, a->diag[i].evidence);
    }
    int n = top > 0 && top < a->n_cand ? top : a->n_cand;
    char on[200];
    if (*already_on(&a->given, on, sizeof on))
        sb_printf(&s, &len, &cap, "\nAlready on in your config, so not offered again: %s.\n", on);
    sb_printf(&s, &len, &cap, "\nFixes (%d planned in %.0f ms), best first:\n", a->n_planned, a->ms);
    sb_printf(&s, &len, &cap, "  %-3s %-44s %12s %12s %9s  %s\n", "#", "fix", "peak", "margin",
              "time", "risk");
    for (int i = 0; i < n; i++) {
        const tk_candidate *c = &a->cand[i];
        char mg[40];
        if (!limited)
            snprintf(mg, sizeof mg, "-");
        else if (c->margin >= 0)
            fmtb((size_t)c->margin, mg);
        else {
            mg[0] = '-';
            fmtb((size_t)(-c->margin), mg + 1);
        }
        sb_printf(&s, &len, &cap, "  %-3d %-44.44s %12s %12s %8.2fx  %s%s\n", i + 1, c->label,
                  fmtb(c->peak, b1), mg, c->slowdown, c->risk_text, c->fits || !limited ? "" : "  (does not fit)");
    }
    /* the leading fixes as the code the user changes (api: trainer, loop or txkernel) */
    int shown = n < 3 ? n : 3;
    if (shown)
        sb_printf(&s, &len, &cap, "\nIn your code (api: %s):\n", tk_api_name(a->api));
    for (int i = 0; s && i < shown; i++)
        format_code(&s, &len, &cap, a, i);
    int au = tk_advice_auto(a);
    if (au >= 0 && cli)
        sb_printf(&s, &len, &cap, "\n#%d: %s\ntxk advise %s --fix %d -o FIXED.yaml writes your config with it; "
                  "--fix auto picks #%d.\n", au + 1, a->cand[au].reason, cli, au + 1, au + 1);
    else if (au >= 0)
        sb_printf(&s, &len, &cap, "\n%%txfix %d applies: %s\n%%txfix auto picks #%d.\n", au + 1,
                  a->cand[au].reason, au + 1);
    else
        sb_printf(&s, &len, &cap, "\nNo single change or combination found fits with margin.\n");
    return s;
}

char *tk_advice_format(const tk_advice *a, int top) {
    return format_advice(a, top, NULL);
}

char *tk_advice_format_cli(const tk_advice *a, int top, const char *cfg_path) {
    return format_advice(a, top, cfg_path ? cfg_path : "CFG");
}

char *tk_advice_json(const tk_advice *a) {
    char on[200];
    json_t *o = json_pack("{s:I, s:I, s:I, s:i, s:f, s:i, s:s, s:s}", "peak", (json_int_t)a->base.peak_reserved,
                          "available", (json_int_t)a->free_now, "capacity", (json_int_t)a->capacity,
                          "planned", a->n_planned, "ms", a->ms, "auto", tk_advice_auto(a), "api", tk_api_name(a->api),
                          "already_on", already_on(&a->given, on, sizeof on));
    json_t *diags = json_array(), *cands = json_array();
    if (!o || !diags || !cands) {
        json_decref(o);
        json_decref(diags);
        json_decref(cands);
        return NULL;
    }
    for (int i = 0; i < a->n_diag; i++)
        json_array_append_new(diags, json_pack("{s:s, s:s, s:s}", "kind", tk_diag_name(a->diag[i].kind),
                                               "title", a->diag[i].title, "evidence", a->diag[i].evidence));
    for (int i = 0; i < a->n_cand; i++) {
        const tk_candidate *c = &a->cand[i];
        json_t *fx = json_array();
        for (int k = 0; fx && k < c->n_fixes; k++)
            json_array_append_new(fx, tk_fix_json(&c->fixes[k]));
        char *code = c->action_only ? NULL : tk_fix_code(&a->given, &c->config, a->api);
        json_array_append_new(cands, json_pack("{s:s, s:s, s:I, s:I, s:b, s:b, s:f, s:f, s:s, s:b, s:b, s:o*, s:s*, s:b}",
                                               "label", c->label, "reason", c->reason,
                                               "peak", (json_int_t)c->peak, "margin", (json_int_t)c->margin,
                                               "fits", c->fits, "fits_margin", c->fits_margin,
                                               "slowdown", c->slowdown, "risk", c->risk,
                                               "risk_text", c->risk_text, "addresses_cause", c->addresses_cause,
                                               "action_only", c->action_only, "fixes", fx, "code", code,
                                               "plan_only", tk_config_plan_only(&c->config)));
        free(code);
    }
    json_object_set_new(o, "diagnoses", diags);
    json_object_set_new(o, "candidates", cands);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}
