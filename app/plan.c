/* plan.c — the plan verb of the request layer (issue 39): `txk plan` and
 * `%txplan` / `%%txplan` both call tk_app_plan with a typed request and
 * print or show the bundle it returns: the planned peak of a run and where
 * it goes, without training; `--max-batch`: the largest batch per sequence
 * length that fits a capacity; `--sweep`: each memory-saving technique;
 * `--gpus`: each card of a platform; engine: pytorch's own plan.
 *
 * The plan and the config become the session's last, for %txadvise; --gpus
 * makes the session remember the platform.
 *
 * Guarantees: planning runs on a private meta device; the session's device
 * is never touched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk_app.h"
#include "tk_model.h"
#include "tk_oom_message.h"
#include "tk_pipeline.h"
#include "tk_plan.h"
#include "tk_torchplan.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_train.h"

/* The largest batch in [lo, hi] whose plan of c (its attention as set) fits,
 * by bisection (a plan's peak grows with the batch): lo fits already (its
 * peak in *peak), or lo is 0 and batch 1 is planned first (0 when it does
 * not fit). -1 on a plan's error. */
static int bisect_batch(tk_config *c, int lo, int hi, size_t *peak, tk_err *err) {
    tk_plan_result p;
    if (lo < 1) {
        c->batch_size = 1;
        if (tk_plan(c, NULL, 0, &p, err) != TK_OK) return -1;
        if (!p.fits) return 0;
        *peak = p.peak_reserved;
        lo = 1;
    }
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        c->batch_size = mid;
        if (tk_plan(c, NULL, 0, &p, err) != TK_OK) return -1;
        if (p.fits) {
            lo = mid;
            *peak = p.peak_reserved;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

/* tk_config_attention_fit's `fits` that only notes it was asked. */
static int attention_asked(const tk_config *c, void *u) {
    (void)c;
    *(int *)u = 1;
    return 1;
}

/* Largest batch in [1, hi] whose plan fits `cap`; 0 when batch 1 does not
 * fit. Each candidate batch is planned once: attention: auto is resolved
 * for the search, not in every plan. Where memory has no say in it (a
 * card's fast kernel, the cpu) it is one attention for every batch. Where
 * it has (fp32 on a card: standard, unless only fused fits), a batch fits
 * when standard or fused does, so the answer is the larger of the two
 * largest batches: fused's by bisection, then standard from there on
 * (standard at fused's largest and one more: where standard fits at a
 * batch, auto runs it and reports its peak). */
static int largest_batch(tk_config c, int seq, size_t cap, int hi, size_t *peak, tk_err *err) {
    c.max_len = seq;
    c.batch_size = 1;
    c.eval_batch_size = 0;
    c.capacity = cap;
    if (c.attention == TK_ATTN_AUTO) {
        int asked = 0;
        const tk_attention a = tk_config_attention_fit(&c, TK_DEV_META, attention_asked, &asked, NULL);
        if (!asked) c.attention = a;
    }
    if (c.attention != TK_ATTN_AUTO) return bisect_batch(&c, 0, hi, peak, err);
    c.attention = TK_ATTN_FUSED;
    const int bf = bisect_batch(&c, 0, hi, peak, err);
    if (bf < 0) return -1;
    c.attention = TK_ATTN_STANDARD;
    c.batch_size = bf > 0 ? bf : 1;
    tk_plan_result p;
    if (tk_plan(&c, NULL, 0, &p, err) != TK_OK) return -1;
    if (!p.fits) return bf; /* auto runs fused there: its peak */
    *peak = p.peak_reserved;
    const int b0 = c.batch_size;
    if (b0 >= hi) return b0;
    c.batch_size = b0 + 1;
    if (tk_plan(&c, NULL, 0, &p, err) != TK_OK) return -1;
    if (!p.fits) return b0;
    *peak = p.peak_reserved;
    return bisect_batch(&c, b0 + 1, hi, peak, err);
}

/* A table bundle with a bar chart: text/plain `text` (taken), the table's
 * HTML followed by the SVG chart, the SVG alone, the Vega-Lite spec, and
 * `json` (taken) as application/json. */
static json_t *bars_bundle(const tk_rtable *t, char *text, const char *title, const char *unit, const char *label_field,
                           const char *value_field, int n, const char *const *labels, const double *vals, json_t *json) {
    json_t *out = tk_bundle_new("");
    tk_bundle_take(out, "text/plain", text);
    char *html = tk_rtable_html(t);
    char *svg = tk_svg_bars(title, unit, n, labels, vals);
    tk_sb hs = {0};
    if (html) tk_sb_add(&hs, html);
    if (svg) tk_sb_add(&hs, svg);
    free(html);
    tk_bundle_take(out, "text/html", tk_sb_take(&hs));
    tk_bundle_take(out, "image/svg+xml", svg);
    tk_bundle_take_json(out, "application/vnd.vegalite.v5+json",
                        tk_vegalite_bars(title, label_field, value_field, n, labels, vals));
    tk_bundle_take_json(out, "application/json", json);
    return out;
}

tk_status tk_max_batch_report(const tk_config *c0, json_t **bundle, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    tk_config c = *c0;
    size_t cap = tk_session_capacity_of(&c);
    *bundle = NULL;
    if (!cap) {
        tk_err_set(err, TK_EINVAL, "--max-batch needs a capacity: give --gpu PROFILE or capacity=7.43GiB");
        return TK_EINVAL;
    }
    tk_config dims = c;
    if (tk_config_resolve_model(&dims, err) != TK_OK) return err->status;
    static const int seqs[] = {64, 128, 256, 384, 512};
    char title[256], cb[32];
    snprintf(title, sizeof title, "Largest batch per sequence length: %.120s on %s (%s)", c.model,
             c.gpu[0] ? c.gpu : "capacity", tk_format_bytes(cap, cb, sizeof cb));
    const char *h[] = {">max_len", ">largest batch", ">peak reserved", ">margin"};
    tk_rtable *t = tk_rtable_new(title, 4, h);
    if (!t) {
        tk_err_set(err, TK_ENOMEM, "out of host memory");
        return TK_ENOMEM;
    }
    const char *labels[5];
    char lb[5][16];
    double vals[5];
    int n = 0;
    for (int i = 0; i < 5; i++) {
        if (dims.max_position && seqs[i] > dims.max_position) break;
        size_t peak = 0;
        int b = largest_batch(c, seqs[i], cap, 4096, &peak, err);
        if (b < 0) {
            tk_rtable_destroy(&t);
            return err->status;
        }
        char pb[32], mb[32];
        tk_rtable_rowf(t, "%d\t%d\t%s\t%s", seqs[i], b, b ? tk_format_bytes(peak, pb, sizeof pb) : "-",
                       b ? tk_format_bytes(cap - peak, mb, sizeof mb) : "-");
        snprintf(lb[n], sizeof lb[n], "%d", seqs[i]);
        labels[n] = lb[n];
        vals[n++] = b;
    }
    char *txt = tk_rtable_text(t);
    tk_sb s = {0};
    tk_sb_addf(&s, "%s(%s, precision %s, optimizer %s; planned on meta, nothing allocated)\n", txt ? txt : "",
               c.model, c.precision == TK_PREC_FP32 ? "fp32" : c.precision == TK_PREC_FP16 ? "fp16" : "bf16",
               c.optimizer == TK_OPTIM_ADAMW8 ? "adamw8bit" : "adamw");
    free(txt);
    *bundle = bars_bundle(t, tk_sb_take(&s), title, "batch", "max_len", "largest_batch", n, labels, vals,
                          tk_rtable_json(t));
    tk_rtable_destroy(&t);
    return TK_OK;
}

/* ---- --sweep: each memory-saving technique, planned ------------------------- */

typedef struct { const char *label; const char *kv[4]; } sweep_row;
static const sweep_row SWEEP[] = {
    {"baseline", {NULL}},
    {"recompute layers", {"recompute=layers"}},
    {"recompute attention", {"recompute=attention"}},
    {"fused attention", {"attention=fused"}},
    {"fp16", {"precision=fp16"}},
    {"bf16", {"precision=bf16"}},
    {"8-bit AdamW", {"optimizer=adamw8bit"}},
    {"frozen embeddings", {"freeze_embeddings=true"}},
    {"accumulate x4 (batch / 4)", {"accumulate=4"}},
    {"fp16 + fused", {"precision=fp16", "attention=fused"}},
    {"fp16 + recompute layers", {"precision=fp16", "recompute=layers"}},
    {"bf16 + recompute + fused", {"precision=bf16", "recompute=layers", "attention=fused"}},
    {"fp16 + recompute + fused + 8-bit AdamW", {"precision=fp16", "recompute=layers", "attention=fused", "optimizer=adamw8bit"}},
};


tk_status tk_sweep_report(const tk_config *c0, int measure, json_t **bundle, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    *bundle = NULL;
    size_t cap = tk_session_capacity_of(c0);
    char title[320], b[8][32];
    /* the baseline's attention: on a card the default is fused already */
    const char *attn_why = NULL;
    tk_attention attn = tk_config_attention(c0, TK_DEV_META, &attn_why);
    snprintf(title, sizeof title, "Peak per technique: %.120s, batch %d x max_len %d%s%s, baseline attention %s (%s) "
             "(planned on meta)", c0->model, c0->batch_size, c0->max_len, cap ? ", capacity " : "",
             cap ? tk_format_bytes(cap, b[0], sizeof b[0]) : "", tk_attention_name(attn), attn_why);
    /* measured where the config says it runs: cuda, or else the cpu */
    const int on_cuda = c0->device == TK_DEVICE_CUDA;
    const char *h[] = {"technique", ">peak reserved", ">vs baseline", ">param", ">grad", ">optim", ">act", ">temp",
                       "fits", on_cuda ? ">measured on cuda" : ">measured on cpu", "= plan", ">ms/step",
                       ">time vs baseline", ">device peak (CUPTI)", ">vs plan + plugin"};
    tk_rtable *t = tk_rtable_new(title, measure ? (on_cuda ? 15 : 13) : 9, h);
    double base_ms = 0;
    if (!t) {
        tk_err_set(err, TK_ENOMEM, "out of host memory");
        return TK_ENOMEM;
    }
    int n = (int)(sizeof SWEEP / sizeof SWEEP[0]);
    const char *labels[sizeof SWEEP / sizeof SWEEP[0]];
    double vals[sizeof SWEEP / sizeof SWEEP[0]];
    json_t *rows = json_array();
    size_t base = 0;
    int nl = 0; /* rows shown (accumulate needs a batch it divides) */
    for (int i = 0; i < n; i++) {
        tk_config c = *c0;
        for (int k = 0; k < 4 && SWEEP[i].kv[k]; k++) {
            char kv[64];
            snprintf(kv, sizeof kv, "%s", SWEEP[i].kv[k]);
            char *eq = strchr(kv, '=');
            *eq = 0;
            if (tk_config_set(&c, kv, eq + 1, err) != TK_OK) goto fail;
        }
        if (c.accumulate > 1) {
            if (c.batch_size % c.accumulate) continue; /* batch not divisible: no such row */
            c.batch_size /= c.accumulate;
        }
        tk_plan_result p;
        if (tk_config_validate(&c, err) != TK_OK || tk_plan(&c, NULL, 0, &p, err) != TK_OK) goto fail;
        if (i == 0) base = p.peak_reserved;
        const size_t *bc = p.by_cat_at_peak;
        tk_measure ms_ = {0};
        if (measure) {
            /* cuda: ten more steps are timed (the first two include cuBLAS's warm-up) */
            if (tk_train_measure(&c, on_cuda ? TK_DEV_CUDA : TK_DEV_CPU, on_cuda ? 10 : 0, &ms_, err) != TK_OK)
                goto fail;
            if (i == 0) base_ms = ms_.ms_per_step;
        }
        size_t m_alloc = ms_.peak_allocated, m_res = ms_.peak_reserved;
        double ms = ms_.ms_per_step;
        int same = m_alloc == p.peak_allocated && m_res == p.peak_reserved;
        /* CUPTI's device peak against the plan plus the plugin's fixed buffers */
        double dev_ratio = ms_.cupti_active && p.peak_reserved + ms_.plugin_bytes > 0
                               ? (double)ms_.device_peak / (double)(p.peak_reserved + ms_.plugin_bytes) : 0;
        char dp[32];
        snprintf(dp, sizeof dp, "-");
        if (ms_.cupti_active) tk_format_bytes(ms_.device_peak, dp, sizeof dp);
        tk_rtable_rowf(t, measure ? (on_cuda ? "%s\t%s\t%.2fx\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.2fx\t%s\t%.3fx"
                                             : "%s\t%s\t%.2fx\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.2fx")
                                  : "%s\t%s\t%.2fx\t%s\t%s\t%s\t%s\t%s\t%s", SWEEP[i].label,
                       tk_format_bytes(p.peak_reserved, b[0], sizeof b[0]), base ? (double)p.peak_reserved / (double)base : 1.0,
                       tk_format_bytes(bc[TK_CAT_PARAM], b[1], sizeof b[1]), tk_format_bytes(bc[TK_CAT_GRAD], b[2], sizeof b[2]),
                       tk_format_bytes(bc[TK_CAT_OPTIM], b[3], sizeof b[3]), tk_format_bytes(bc[TK_CAT_ACT], b[4], sizeof b[4]),
                       tk_format_bytes(bc[TK_CAT_TEMP], b[5], sizeof b[5]), cap ? (p.fits ? "yes" : "no") : "-",
                       tk_format_bytes(m_res, b[6], sizeof b[6]), same ? "yes" : "NO", ms, base_ms > 0 ? ms / base_ms : 1.0,
                       dp, dev_ratio);
        json_t *cats = json_object();
        for (int k = 0; k < TK_CAT_COUNT; k++) json_object_set_new(cats, tk_cat_name((tk_cat)k), json_integer((json_int_t)bc[k]));
        json_array_append_new(rows, json_pack("{s:s, s:I, s:I, s:I, s:o, s:I, s:I, s:b, s:i}", "technique", SWEEP[i].label,
                                              "peak_reserved", (json_int_t)p.peak_reserved, "peak_allocated",
                                              (json_int_t)p.peak_allocated, "n_params", (json_int_t)p.n_params, "at_peak",
                                              cats, "optim_bytes", (json_int_t)p.optim_bytes, "grad_bytes",
                                              (json_int_t)p.grad_bytes, "fits", p.fits, "batch", c.batch_size));
        if (measure) {
            json_t *row = json_array_get(rows, json_array_size(rows) - 1);
            json_object_set_new(row, "measured_peak_allocated", json_integer((json_int_t)m_alloc));
            json_object_set_new(row, "measured_peak_reserved", json_integer((json_int_t)m_res));
            json_object_set_new(row, "measured_equals_plan", json_boolean(same));
            json_object_set_new(row, "ms_per_step", json_real(ms));
            json_object_set_new(row, "measured_on", json_string(on_cuda ? "cuda" : "cpu"));
            if (ms_.have_device) {
                json_object_set_new(row, "cupti_active", json_boolean(ms_.cupti_active));
                json_object_set_new(row, "device_peak", json_integer((json_int_t)ms_.device_peak));
                json_object_set_new(row, "plugin_bytes", json_integer((json_int_t)ms_.plugin_bytes));
            }
        }
        labels[nl] = SWEEP[i].label;
        vals[nl++] = (double)p.peak_reserved / (1 << 20);
    }
    *bundle = bars_bundle(t, tk_rtable_text(t), title, "MiB", "technique", "peak_MiB", nl, labels, vals, rows);
    tk_rtable_destroy(&t);
    return TK_OK;
fail:
    json_decref(rows);
    tk_rtable_destroy(&t);
    return err->status;
}

tk_status tk_gpus_report(const tk_config *c, const char *platform, json_t **bundle, tk_err *err) {
    *bundle = NULL;
    tk_card_fit cards[16];
    int n = 0;
    tk_status st = tk_plan_cards(c, NULL, 0, platform, cards, 16, &n, err);
    if (st != TK_OK) return st;
    char sentence[400], title[96], b1[32], b2[32], b3[32], b4[40];
    tk_cards_sentence(cards, n, platform, sentence, sizeof sentence);
    if (!strcmp(platform, "all")) snprintf(title, sizeof title, "The config on every GPU profile");
    else snprintf(title, sizeof title, "The config on each card %s hands out", platform);
    const char *hd[] = {"card", ">capacity", ">budget", ">planned peak", "fits", ">margin", ">step"};
    tk_rtable *t = tk_rtable_new(title, 7, hd);
    json_t *rows = json_array();
    for (int i = 0; t && i < n; i++) {
        const tk_card_fit *r = &cards[i];
        if (r->margin >= 0) tk_format_bytes((size_t)r->margin, b4, sizeof b4);
        else b4[0] = '-', tk_format_bytes((size_t)-r->margin, b4 + 1, sizeof b4 - 1);
        char step[32];
        if (r->step_seconds > 0) snprintf(step, sizeof step, "%.0f ms", 1e3 * r->step_seconds);
        else snprintf(step, sizeof step, "-");
        tk_rtable_rowf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s", r->card->name, tk_format_bytes(r->card->capacity, b1, sizeof b1),
                       tk_format_bytes(r->budget, b2, sizeof b2), tk_format_bytes(r->peak, b3, sizeof b3),
                       r->fits ? "yes" : "no", b4, step);
        json_array_append_new(rows, json_pack("{s:s, s:s, s:I, s:I, s:I, s:b, s:I, s:f, s:I, s:b, s:s}", "card",
                                              r->card->name, "long_name", r->card->long_name, "capacity",
                                              (json_int_t)r->card->capacity, "budget", (json_int_t)r->budget,
                                              "peak_reserved", (json_int_t)r->peak, "fits", r->fits, "margin",
                                              (json_int_t)r->margin, "step_seconds", r->step_seconds, "outside_budget",
                                              (json_int_t)(r->card->capacity - r->budget), "context_measured", 0,
                                              "source", r->card->source ? r->card->source : ""));
    }
    /* what budget means, once, and where each capacity was read */
    static const char note[] = "budget: the card's usable capacity, the same figure every plan, --max-batch and "
                               "--from-error use: capacity (the total PyTorch prints) less the CUDA context and library "
                               "buffers (the profile's default, not measured) less txkernel's 32 MiB of workspace.";
    tk_sb src = {0};
    for (int i = 0; i < n; i++)
        tk_sb_addf(&src, "  %s: %s\n", cards[i].card->name, cards[i].card->source ? cards[i].card->source : "?");
    char *txt = t ? tk_rtable_text(t) : NULL;
    tk_sb sb = {0};
    tk_sb_add(&sb, txt ? txt : "");
    /* Kaggle's P100 plans, but its cu128 torch cannot run there */
    static const char p100[] = "On Kaggle the P100 is being retired and its cu128 torch has no sm_60 kernels "
                               "(Kaggle/docker-python#1546): the plan holds, but PyTorch fails there with \"no kernel "
                               "image is available\"; pick the T4.";
    int kaggle = !strcmp(platform, "kaggle");
    tk_sb_addf(&sb, "The config %s.\n%s\n%s%sCapacity read from:\n%s", sentence, note, kaggle ? p100 : "",
               kaggle ? "\n" : "", src.p ? src.p : "");
    free(txt);
    *bundle = tk_bundle_new(sb.p ? sb.p : "");
    tk_sb_clear(&sb);
    char *html = t ? tk_rtable_html(t) : NULL;
    tk_sb_add(&sb, html ? html : "");
    free(html);
    tk_sb_add(&sb, "<p>The config ");
    tk_sb_add_html(&sb, sentence);
    tk_sb_add(&sb, ".</p><p><small>");
    tk_sb_add_html(&sb, note);
    if (kaggle) {
        tk_sb_add(&sb, "<br>");
        tk_sb_add_html(&sb, p100);
    }
    tk_sb_add(&sb, "<br>Capacity read from:<br>");
    for (int i = 0; i < n; i++) {
        tk_sb_add_html(&sb, cards[i].card->name);
        tk_sb_add(&sb, ": ");
        tk_sb_add_html(&sb, cards[i].card->source ? cards[i].card->source : "?");
        tk_sb_add(&sb, "<br>");
    }
    tk_sb_add(&sb, "</small></p>");
    tk_sb_clear(&src);
    tk_bundle_take(*bundle, "text/html", tk_sb_take(&sb));
    tk_bundle_take_json(*bundle, "application/json",
                        json_pack("{s:s, s:o, s:s}", "platform", platform, "cards", rows, "sentence", sentence));
    tk_rtable_destroy(&t);
    return TK_OK;
}

/* engine: pytorch: the user's PyTorch step, one card or each of a platform's */
static tk_status plan_torch(tk_session *s, const tk_plan_request *rq, tk_config *c, tk_plan_reply *out, tk_err *err) {
    const char *only = rq->max_batch ? "--max-batch" : rq->sweep ? "--sweep" : rq->epoch ? "--epoch" : NULL;
    if (only) {
        out->ename = "UsageError";
        tk_err_set(err, TK_EINVAL, "%s plans txkernel's own engine; engine: pytorch plans one step (drop %s)", only,
                   only);
        return TK_EINVAL;
    }
    if (rq->gpus) {
        if (tk_torchplan_gpus_report(c, rq->gpus, &out->bundle, err) != TK_OK) return err->status;
        tk_session_set_config(s, c);
        return TK_OK;
    }
    /* batching: dynamic / buckets plan the corpus' longest batch, as
     * txkernel's own plan takes it (the config's data, else %txdata's) */
    tk_run_data data;
    out->ename = "DataError";
    if (tk_session_load_data(s, c, &data, err) != TK_OK) return err->status;
    tk_run_data_clear(&data);
    out->ename = "PlanError";
    int nl = 0;
    const int *len = tk_session_lengths(s, &nl);
    tk_torchplan_result r;
    if (tk_torchplan_data(c, len, nl, &r, err) != TK_OK) return err->status;
    if (!(out->bundle = tk_report_torchplan(&r))) return tk_err_nomem(err, "the plan's report");
    out->fits = r.fits;
    tk_session_set_config(s, c);
    return TK_OK;
}

/* txkernel's own step on meta: the run resolved once (as %%txtrain and `txk
 * train` resolve it), the worst-case batch or the first epoch, its report. */
static tk_status plan_step(tk_session *s, const tk_plan_request *rq, tk_config *c, tk_run_data *data,
                           tk_plan_reply *out, tk_err *err) {
    tk_run_where where;
    tk_session_where(s, &where);
    where.platform = NULL; /* a plan is of the config as given: no platform card */
    tk_run_spec spec;
    tk_config given = *c; /* the session keeps the config as given: every later request resolves it again */
    if (tk_run_spec_resolve(c, &where, &spec, err) != TK_OK || tk_run_spec_apply(&spec, c, err) != TK_OK)
        return err->status;
    int n = 0;
    const int *len = tk_session_lengths(s, &n);
    tk_plan_result p;
    tk_plan_batches run = {.train = data->train, .n_train = data->n_train, .dev = data->dev, .n_dev = data->n_dev};
    tk_plan_snapshot ps = {.path = rq->snapshot};
    tk_plan_watch w;
    tk_plan_snapshot_watch(&ps, &w);
    if ((rq->epoch ? tk_plan_epoch(c, &run, rq->snapshot ? &w : NULL, &p, err)
                   : tk_plan_watched(c, len, n, rq->snapshot ? &w : NULL, &p, err)) != TK_OK)
        return err->status;
    snprintf(p.attention_why, sizeof p.attention_why, "%s", spec.attention_why);
    tk_session_set_config(s, &given);
    tk_session_set_plan(s, &p);
    /* PyTorch in the same process (the companion) takes its reserved bytes
     * from what the plan can have: then it is planned against free */
    size_t plan_free = 0;
    if (tk_session_held_in_process(s)) {
        size_t fr, ours; /* what the session itself holds is this plan's to use */
        tk_session_device_now(s, c, &fr, &ours);
        plan_free = fr ? fr + ours : 0;
    }
    if (!(out->bundle = tk_report_plan(&p, plan_free))) return tk_err_nomem(err, "the plan's report");
    json_object_set_new(json_object_get(out->bundle, "application/json"), "run", tk_run_spec_json(&spec));
    tk_report_add_holder(out->bundle, tk_session_holder(s), 0);
    tk_report_add_head_note(out->bundle, c, &p);
    tk_tensor_info big[8];
    int nb = 0;
    tk_err terr = {0};
    if ((rq->epoch ? tk_plan_epoch_tensors_at_peak(c, &run, big, 8, &nb, &terr)
                   : tk_plan_tensors_at_peak(c, len, n, big, 8, &nb, &terr)) == TK_OK)
        tk_report_add_tensors(out->bundle, big, nb);
    tk_report_add_data(out->bundle, data);
    out->fits = p.fits;
    if (rq->snapshot && tk_plan_snapshot_said(&ps, out->said, sizeof out->said)) {
        out->ename = "SnapshotError";
        tk_err_set(err, TK_EIO, "%s", out->said);
        out->said[0] = 0;
        return TK_EIO;
    }
    return TK_OK;
}

tk_status tk_app_check_platform(const char *gpus, tk_err *err) {
    const tk_gpu_profile *probe[16];
    if (gpus && tk_gpu_platform_cards(gpus, probe, 16) < 0) {
        tk_err_set(err, TK_EINVAL, "--gpus %s: expected %s", gpus, tk_gpu_platform_names());
        return TK_EINVAL;
    }
    return TK_OK;
}

tk_status tk_app_plan(tk_session *s, const tk_plan_request *rq, tk_plan_reply *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    out->fits = 1;
    out->ename = "ConfigError";
    if (tk_app_check_platform(rq->gpus, err) != TK_OK) {
        out->ename = "UsageError";
        return TK_EINVAL;
    }
    tk_config c = rq->config;
    if (rq->gpu && tk_config_set(&c, "gpu", rq->gpu, err) != TK_OK) return err->status;
    if (tk_config_validate(&c, err) != TK_OK) return err->status;
    /* --gpus P: the session remembers the platform, so %txadvise and %txfix
     * advise for its smallest card; a new config forgets it */
    if (rq->gpus) tk_session_set_platform(s, rq->gpus);
    else if (rq->new_config) tk_session_set_platform(s, NULL);
    if (rq->snapshot && (c.engine == TK_ENGINE_PYTORCH || rq->gpus || rq->max_batch || rq->sweep)) {
        out->ename = "UsageError";
        tk_err_set(err, TK_EINVAL, "--snapshot writes txkernel's planned step: not with engine: pytorch, --gpus, "
                   "--max-batch or --sweep");
        return TK_EINVAL;
    }
    if (c.engine == TK_ENGINE_PYTORCH) return plan_torch(s, rq, &c, out, err);
    /* a config with a train_file plans the run's model and corpus */
    tk_run_data data;
    out->ename = "DataError";
    if (tk_session_load_data(s, &c, &data, err) != TK_OK) return err->status;
    out->ename = "PlanError";
    tk_status st;
    if (rq->gpus) {
        if ((st = tk_gpus_report(&c, rq->gpus, &out->bundle, err)) == TK_OK) tk_session_set_config(s, &c);
    } else if (rq->max_batch) {
        st = tk_max_batch_report(&c, &out->bundle, err);
    } else if (rq->sweep) {
        st = tk_sweep_report(&c, rq->measure, &out->bundle, err);
    } else {
        st = plan_step(s, rq, &c, &data, out, err);
    }
    tk_run_data_clear(&data);
    if (st != TK_OK) {
        json_decref(out->bundle);
        out->bundle = NULL;
    }
    return st;
}

json_t *tk_app_planned_oom_report(tk_session *s, const tk_config *c, const tk_run_report *r) {
    json_t *pb = tk_report_plan(&r->plan, r->free_before);
    tk_report_add_holder(pb, tk_session_holder(s), 0);
    tk_report_add_head_note(pb, c, &r->plan);
    int nl = 0;
    const int *len = tk_session_lengths(s, &nl);
    tk_tensor_info big[8];
    int nb = 0;
    tk_err terr = {0};
    if (tk_plan_tensors_at_peak(c, len, nl, big, 8, &nb, &terr) == TK_OK) tk_report_add_tensors(pb, big, nb);
    return pb;
}
