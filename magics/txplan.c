/* txplan.c — `%txplan` / `%%txplan`: the planned peak of a run and where it
 * goes, without training; `--max-batch`: the largest batch per sequence
 * length that fits a capacity.
 *
 * The base config is the session's last one (from %%txtrain, %txplan or
 * %txfix), so `%txplan batch_size=8` asks "and with batch 8?". The plan and
 * the config become the session's last, for %txadvise.
 *
 * Guarantees: planning runs on a private meta device; the session's device
 * is never touched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk_magics.h"
#include "tk_model.h"
#include "tk_oom_message.h"
#include "tk_pipeline.h"
#include "tk_plan.h"
#include "tk_torchplan.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_train.h"
#include "tk_txmagics.h"

/* Largest batch in [1, hi] whose plan fits `cap`, by bisection (a plan's
 * peak grows with the batch). 0 when batch 1 does not fit. */
static int largest_batch(tk_config c, int seq, size_t cap, int hi, size_t *peak, tk_err *err) {
    c.max_len = seq;
    c.batch_size = 1;
    c.eval_batch_size = 0;
    c.capacity = cap;
    tk_plan_result p;
    if (tk_plan(&c, NULL, 0, &p, err) != TK_OK) return -1;
    if (!p.fits) return 0;
    *peak = p.peak_reserved;
    int lo = 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        c.batch_size = mid;
        if (tk_plan(&c, NULL, 0, &p, err) != TK_OK) return -1;
        if (p.fits) {
            lo = mid;
            *peak = p.peak_reserved;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
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

static int run_txplan(tk_magic_ctx *m) {
    tk_session *s = m->session;
    tk_config base;
    const tk_config *last = tk_session_config(s);
    if (last && !m->is_cell) base = *last;
    else tk_config_defaults(&base);
    tk_config c;
    if (tk_txconfig_from_cell(m, &base, &c, 1)) return -1;
    char **argv = NULL;
    int argc = 0, json_only = 0, max_batch = 0, sweep = 0, measure = 0, epoch = 0, rc = 0;
    char gpus[16] = "";
    tk_err err = {0};
    if (tk_txargs_split(m->args, &argv, &argc)) return tk_magic_error(m, "UsageError", "unbalanced quotes");
    for (int i = 0; i < argc && !rc; i++) {
        if (!strcmp(argv[i], "--json")) json_only = 1;
        else if (!strcmp(argv[i], "--max-batch")) max_batch = 1;
        else if (!strcmp(argv[i], "--sweep")) sweep = 1;
        else if (!strcmp(argv[i], "--epoch")) epoch = 1;
        else if (!strcmp(argv[i], "--measure")) measure = sweep = 1;
        else if (!strcmp(argv[i], "--gpus")) {
            /* checked here, before the session's last config is read: a bad
             * flag is named even when that config would fail (a failed cell) */
            const tk_gpu_profile *probe[16];
            if (i + 1 >= argc) rc = tk_magic_error(m, "UsageError", "--gpus needs %s", tk_gpu_platform_names());
            else if (tk_gpu_platform_cards(argv[i + 1], probe, 16) < 0)
                rc = tk_magic_error(m, "UsageError", "--gpus %s: expected %s", argv[i + 1], tk_gpu_platform_names());
            else snprintf(gpus, sizeof gpus, "%s", argv[++i]);
        } else if (!strcmp(argv[i], "--gpu") || !strcmp(argv[i], "--file")) {
            if (i + 1 >= argc) {
                rc = tk_magic_error(m, "UsageError", "%s needs a value", argv[i]);
            } else if (!strcmp(argv[i], "--gpu")) {
                if (tk_config_set(&c, "gpu", argv[++i], &err) != TK_OK) rc = tk_magic_error(m, "ConfigError", "%s", err.msg);
            } else {
                /* a YAML file read under the overrides already applied: re-apply */
                FILE *f = fopen(argv[++i], "rb");
                if (!f) {
                    rc = tk_magic_error(m, "ConfigError", "%s: cannot open", argv[i]);
                } else {
                    char *buf = NULL;
                    size_t len = 0;
                    FILE *mem = open_memstream(&buf, &len);
                    char chunk[4096];
                    size_t k;
                    while (mem && (k = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, k, mem);
                    if (mem) fclose(mem);
                    fclose(f);
                    tk_config fresh;
                    tk_config_defaults(&fresh);
                    if (tk_config_parse_yaml(&fresh, buf ? buf : "", len, argv[i], &err) != TK_OK)
                        rc = tk_magic_error(m, "ConfigError", "%s", err.msg);
                    else if (tk_txconfig_from_cell(m, &fresh, &c, 1))
                        rc = -1;
                    free(buf);
                }
            }
        } else if (!strncmp(argv[i], "--", 2)) {
            rc = tk_magic_error(m, "UsageError", "%%txplan: unknown option %s\nusage: %%txplan [key=value ...] "
                                                  "[--gpu PROFILE | --gpus colab|kaggle|colab-2020|all] [--file cfg.yaml] [--max-batch] [--sweep [--measure]] [--epoch] [--json]", argv[i]);
        }
    }
    tk_txargs_free(argv, argc);
    if (rc) return rc;
    if (tk_config_validate(&c, &err) != TK_OK) return tk_magic_error(m, "ConfigError", "%s", err.msg);
    if (c.engine == TK_ENGINE_PYTORCH) {
        /* the user's PyTorch step: the same plan and report as `txk plan` */
        if (max_batch || sweep || epoch)
            return tk_magic_error(m, "UsageError", "--max-batch, --sweep and --epoch plan txkernel's own engine; "
                                                   "engine: pytorch plans one step (or --gpus)");
        if (gpus[0]) {
            json_t *gb = NULL;
            if (tk_torchplan_gpus_report(&c, gpus, &gb, &err) != TK_OK) return tk_magic_error(m, "PlanError", "%s", err.msg);
            tk_session_set_config(s, &c);
            tk_txemit(m, gb, json_only);
            json_decref(gb);
            return 0;
        }
        /* batching: dynamic / buckets plan the corpus' longest batch, as
         * txkernel's own plan takes it (the config's data, else %txdata's) */
        tk_run_data data;
        if (tk_session_load_data(s, &c, &data, &err) != TK_OK) return tk_magic_error(m, "DataError", "%s", err.msg);
        tk_run_data_clear(&data);
        int nl = 0;
        const int *len = tk_session_lengths(s, &nl);
        tk_torchplan_result r;
        if (tk_torchplan_data(&c, len, nl, &r, &err) != TK_OK) return tk_magic_error(m, "PlanError", "%s", err.msg);
        json_t *tb = tk_report_torchplan(&r);
        if (!tb) return tk_magic_error(m, "MemoryError", "out of host memory");
        tk_session_set_config(s, &c);
        tk_txemit(m, tb, json_only);
        json_decref(tb);
        return 0;
    }
    /* a config with a train_file plans the run's model and corpus */
    tk_run_data data;
    if (tk_session_load_data(s, &c, &data, &err) != TK_OK) return tk_magic_error(m, "DataError", "%s", err.msg);
    json_t *bundle = NULL;
    if (gpus[0]) {
        if (tk_gpus_report(&c, gpus, &bundle, &err) != TK_OK) goto plan_error;
        tk_session_set_config(s, &c);
    } else if (max_batch) {
        if (tk_max_batch_report(&c, &bundle, &err) != TK_OK) goto plan_error;
    } else if (sweep) {
        if (tk_sweep_report(&c, measure, &bundle, &err) != TK_OK) goto plan_error;
    } else {
        int n = 0;
        const int *len = tk_session_lengths(s, &n);
        tk_plan_result p;
        tk_dev *sd = tk_session_current_device(s);
        if (c.capacity == 0 && !c.gpu[0]) {
            /* plan against the session device's capacity when it has one */
            tk_dev_info info;
            tk_dev_info_get(sd, &info);
            if (sd && tk_dev_kind_of(sd) == TK_DEV_CUDA) c.capacity = info.total;
        }
        /* attention: auto as the session's device would run it (a run
         * decides it the same way; without a device, from the config) */
        const char *attn_why = NULL;
        tk_err fit_err = { 0 };
        c.attention = tk_config_attention_fit(&c, sd ? tk_dev_kind_of(sd) : TK_DEV_META, tk_plan_attention_fits,
                                              &fit_err, &attn_why);
        if (fit_err.status != TK_OK) {
            err = fit_err;
            goto plan_error;
        }
        /* --epoch: the run's first epoch, its own batches in its order */
        tk_plan_batches run = {.train = data.train, .n_train = data.n_train, .dev = data.dev, .n_dev = data.n_dev};
        if ((epoch ? tk_plan_epoch(&c, &run, NULL, &p, &err) : tk_plan(&c, len, n, &p, &err)) != TK_OK) goto plan_error;
        snprintf(p.attention_why, sizeof p.attention_why, "%s", attn_why);
        tk_session_set_config(s, &c);
        tk_session_set_plan(s, &p);
        /* PyTorch in the same process (the companion) takes its reserved
         * bytes from what the plan can have: then it is planned against free */
        size_t plan_free = 0;
        if (tk_session_held_in_process(s)) {
            size_t fr, ours; /* what the session itself holds is this plan's to use */
            tk_session_device_now(s, &c, &fr, &ours);
            plan_free = fr ? fr + ours : 0;
        }
        bundle = tk_report_plan(&p, plan_free);
        tk_report_add_holder(bundle, tk_session_holder(s), 0);
        tk_report_add_head_note(bundle, &c, &p);
        tk_tensor_info big[8];
        int nb = 0;
        if ((epoch ? tk_plan_epoch_tensors_at_peak(&c, &run, big, 8, &nb, &err)
                   : tk_plan_tensors_at_peak(&c, len, n, big, 8, &nb, &err)) == TK_OK)
            tk_report_add_tensors(bundle, big, nb);
        tk_report_add_data(bundle, &data);
    }
    tk_run_data_clear(&data);
    tk_txemit(m, bundle, json_only);
    json_decref(bundle);
    return 0;
plan_error:
    tk_run_data_clear(&data);
    return tk_magic_error(m, "PlanError", "%s", err.msg);
}

static const tk_magic_def TXPLAN[] = {
    {"txplan", TK_MAGIC_BOTH, run_txplan, "predicted peak memory of a run and who takes it, without training",
     "%txplan [key=value ...] [--gpu PROFILE | --gpus colab|kaggle|colab-2020|all] [--file cfg.yaml] [--max-batch] [--sweep [--measure]] [--epoch] [--json]\n"
     "%%txplan [key=value ...]\n<YAML config>\n\n"
     "Runs one training step (and an eval step) of the config on the meta device: no\n"
     "arithmetic, same allocator, same allocation order as a real run. Shows the peak\n"
     "(allocated and reserved) against the capacity, the bytes per category at the peak\n"
     "and the top owners (HF module names). The line form starts from the last config of\n"
     "the session and applies key=value overrides: %txplan batch_size=8 precision=fp16.\n"
     "--epoch: the run's first epoch instead of the worst-case batch: its own batches in the\n"
     "run's order through the run's step (empty_cache, the on_oom retry), then every dev\n"
     "batch, so the cache that dynamic padding fragments is planned too (needs train_file).\n"
     "--max-batch: the largest batch for max_len 64..512 that fits the capacity.\n"
     "--sweep: the peak (and its categories) with each memory-saving technique and a few\n"
     "combinations: recompute, fused attention, fp16/bf16, 8-bit AdamW, frozen embeddings,\n"
     "accumulation. --measure also runs each row for two steps on the config's device\n"
     "(the cpu: keep the model small; cuda for device: cuda) and shows the measured\n"
     "peak, whether it equals the plan, and ms/step; on cuda ten more steps are timed\n"
     "and CUPTI's device peak is set against the plan plus the plugin's own buffers.\n"
     "--gpus colab|kaggle|colab-2020|all: the config planned on each card the platform hands out\n"
     "(its capacity, as `gpu: CARD` gives): fits, margin, predicted step time, and one\n"
     "sentence saying on which cards it fits.\n"
     "engine: pytorch in the config plans the user's transformers BERT step as PyTorch runs\n"
     "it instead (torchplan/): peak allocated, first step, reserved, device used (alone or\n"
     "with --gpus); in the companion, %txplan --torch-model NAME / --trainer NAME reads a\n"
     "live model or Trainer [--batch B --seq T --gpu P --precision P --optimizer O --show-config]."},
};

int tk_magics_register_txplan(tk_magics *m) { return tk_magics_add_table(m, TXPLAN, 1); }
