/* txadvise.c — `%txadvise`: why the session's config does not fit (or just
 * ran out of memory) and a ranked list of fixes, each planned; `%txfix`: take
 * one of them (or the best that keeps the effective batch), make it the
 * session's config, show what changed, and with --run train it and compare
 * the measured peak with the predicted one.
 *
 * Inputs come from the session only: the last config (from %%txtrain,
 * %txplan or %txfix), the last run's OOM record when that run ran out, the
 * corpus lengths of the last run or %txdata, what the device has free now
 * and what this session still holds on it, and the allocated bytes at each
 * step of the last run (for the leak diagnosis).
 *
 * Guarantees: advising plans on private meta devices only; the session's
 * device is not touched. A fix is applied only to the session's config;
 * nothing trains without --run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_app.h"
#include "tk_data.h"
#include "tk_embed_trace.h"
#include "tk_advisor.h"
#include "tk_host_mem.h"
#include "tk_magics.h"
#include "tk_oom_message.h"
#include "tk_render.h"
#include "tk_pipeline.h"
#include "tk_session.h"
#include "tk_txmagics.h"

#define TXADVISE_USAGE "%txadvise [key=value ...] [--gpu PROFILE] [--top N] [--margin F] [--for colab|kaggle] [--api trainer|loop|txkernel|keras] [--json]; %%txadvise --from-error [--for colab|kaggle] [--api ...] + the pasted message"
#define TXFIX_USAGE "%txfix N|auto|FIX-NAME [--for colab|kaggle|colab-2020|all] [--run] [--json]"

/* card_note: the line saying which card the advice is for when the config
 * names none (the platform's smallest), and what planned it; "" otherwise.
 * traced: tk_traced_summary's line for a traced model's advice (JSON
 * "planned_by"), else "". */
static json_t *advice_bundle(const tk_advice *a, int top, const char *card_note, const tk_run_spec *spec,
                             const char *traced) {
    char *txt = tk_advice_format(a, top);
    tk_sb tt = {0};
    if (card_note[0]) tk_sb_addf(&tt, "%s\n", card_note);
    tk_sb_add(&tt, txt ? txt : "");
    free(txt);
    txt = tk_sb_take(&tt);
    json_t *b = tk_bundle_new(txt ? txt : "");
    free(txt);
    char b1[32], b2[32], b3[32];
    tk_sb h = {0};
    if (card_note[0]) {
        tk_sb_add(&h, "<p>");
        tk_sb_add_html(&h, card_note);
        tk_sb_add(&h, "</p>");
    }
    int limited = a->free_now > 0;
    if (limited)
        tk_sb_addf(&h, "<div><p><b>Planned peak %s</b> of %s available - %s.</p>",
                   tk_format_bytes(a->base.peak_reserved, b1, sizeof b1), tk_format_bytes(a->free_now, b2, sizeof b2),
                   a->base.fits && a->base.peak_reserved <= a->free_now ? "fits" : "does not fit");
    else
        tk_sb_addf(&h, "<div><p><b>Planned peak %s</b>; no capacity to fit against (give <code>gpu:</code> or "
                   "<code>capacity:</code>): the fixes are ranked by what they save and cost.</p>",
                   tk_format_bytes(a->base.peak_reserved, b1, sizeof b1));
    if (a->n_diag) {
        tk_sb_add(&h, "<p><b>Why</b></p><ul>");
        for (int i = 0; i < a->n_diag; i++) {
            tk_sb_add(&h, "<li><b>[");
            tk_sb_add_html(&h, tk_diag_name(a->diag[i].kind));
            tk_sb_add(&h, "]</b> ");
            tk_sb_add_html(&h, a->diag[i].title);
            tk_sb_add(&h, "<br><small>");
            tk_sb_add_html(&h, a->diag[i].evidence);
            tk_sb_add(&h, "</small></li>");
        }
        tk_sb_add(&h, "</ul>");
    }
    tk_sb_add(&h, "</div>");
    const char *hd[] = {">#", "fix", ">planned peak", ">margin", ">time/sample", "at risk", "fits"};
    char title[128];
    snprintf(title, sizeof title, "Fixes, best first (%d config%s planned in %.0f ms)", a->n_planned,
             a->n_planned == 1 ? "" : "s", a->ms);
    tk_rtable *t = tk_rtable_new(title, 7, hd);
    int n = top > 0 && top < a->n_cand ? top : a->n_cand;
    for (int i = 0; t && i < n; i++) {
        const tk_candidate *c = &a->cand[i];
        char mg[40];
        if (!limited) snprintf(mg, sizeof mg, "-");
        else if (c->margin >= 0) tk_format_bytes((size_t)c->margin, mg, sizeof mg);
        else {
            mg[0] = '-';
            tk_format_bytes((size_t)-c->margin, mg + 1, sizeof mg - 1);
        }
        tk_rtable_rowf(t, "%d\t%s\t%s\t%s\t%.2fx\t%s\t%s", i + 1, c->label, tk_format_bytes(c->peak, b3, sizeof b3),
                       mg, c->slowdown, c->risk_text[0] ? c->risk_text : "-",
                       !limited ? "-" : c->fits_margin ? "yes" : c->fits ? "no margin" : "no");
    }
    char *th = t ? tk_rtable_html(t) : NULL;
    if (th) tk_sb_add(&h, th);
    free(th);
    int au = tk_advice_auto(a);
    if (au >= 0) {
        tk_sb_addf(&h, "<p><code>%%txfix %d</code> (or <code>%%txfix auto</code>) applies: ", au + 1);
        tk_sb_add_html(&h, a->cand[au].reason);
        tk_sb_add(&h, "</p>");
    }
    tk_bundle_take(b, "text/html", tk_sb_take(&h));
    tk_rtable_destroy(&t);
    char *js = tk_advice_json(a);
    json_t *j = js ? json_loads(js, 0, NULL) : NULL;
    free(js);
    if (j) json_object_set_new(j, "run", tk_run_spec_json(spec));
    if (j && traced[0]) json_object_set_new(j, "planned_by", json_string(traced));
    tk_bundle_take_json(b, "application/json", j);
    return b;
}

/* The 99th percentile of the corpus' token lengths, as %txdata and txk
 * data compute it; 0 without a corpus. */
static int lengths_p99(const int32_t *lengths, int n) {
    if (!lengths || n <= 0) return 0;
    tk_length_stats st;
    tk_length_stats_compute(lengths, n, &st);
    return st.p99;
}

/* The API a pasted message's fixes are written in: --api, the config's
 * api:, the traceback's Trainer, the config's engine, else a loop. */
static tk_api message_api(const tk_oom_report_opts *o, const tk_config *c, const tk_oom_message *msg) {
    if (o && o->api != TK_API_AUTO) return o->api;
    if (c && c->api != TK_API_AUTO) return c->api;
    if (msg->format == TK_OOMMSG_TF) return TK_API_KERAS;
    if (msg->trainer) return TK_API_TRAINER;
    return c ? tk_config_api(c) : TK_API_LOOP;
}

tk_status tk_oom_message_report(const char *text, size_t len, const tk_config *c, const int32_t *lengths,
                                int n_lengths, const tk_oom_report_opts *opts, json_t **bundle, tk_err *err) {
    *bundle = NULL;
    tk_oom_message *msg = tk_malloc(sizeof *msg);
    tk_advice *a = NULL;
    char *adv_text = NULL;
    tk_status st = TK_OK;
    if (!msg) {
        tk_err_set(err, TK_ENOMEM, "out of host memory reading the message");
        return TK_ENOMEM;
    }
    if (tk_oom_message_parse(text, len, msg) != 0) {
        free(msg);
        tk_err_set(err, TK_EFORMAT, "no OOM message found");
        return TK_EFORMAT;
    }
    if (opts && opts->platform) {
        snprintf(msg->platform, sizeof msg->platform, "%s", opts->platform);
        msg->platform_from_path = 0;
    }
    msg->api = message_api(opts, c, msg);
    if (c && msg->format != TK_OOMMSG_NO_KERNEL_IMAGE) { /* no plan answers a missing kernel */
        const char *platform = tk_oom_message_platform(msg);
        tk_card_fit cards[16];
        int n = 0;
        /* The message is PyTorch's: the config is planned as PyTorch runs it
         * (engine: pytorch), unless it asks for what that engine does not
         * model (a flatten_dense head, recompute: attention, ...): then by
         * txkernel's trainer, and the report says which. */
        tk_config pc = *c;
        pc.engine = TK_ENGINE_PYTORCH;
        tk_err pe = {0};
        tk_plan_fn pf = opts ? opts->plan_fn : NULL; /* a traced model: its own step, traced */
        void *pctx = opts ? opts->plan_ctx : NULL;
        st = tk_plan_cards_by(pf, pctx, &pc, lengths, n_lengths, platform, cards, 16, &n, &pe);
        if (st == TK_EINVAL && !pf) {
            pc.engine = TK_ENGINE_TXKERNEL;
            st = tk_plan_cards(&pc, lengths, n_lengths, platform, cards, 16, &n, err);
        } else if (st != TK_OK && err) {
            *err = pe;
        }
        if (st != TK_OK) goto done;
        snprintf(msg->plan_engine, sizeof msg->plan_engine, "%s",
                 pf && opts->plan_name ? opts->plan_name : tk_plan_engine_name(&pc));
        /* the user's own numbers and settings for the fix code, and the plan
         * of the config on the message's card to set beside PyTorch's figures */
        msg->user_batch = c->batch_size;
        msg->user_accumulate = c->accumulate;
        msg->user_max_len = c->max_len;
        msg->user_p99 = lengths_p99(lengths, n_lengths);
        msg->have_user_config = 1;
        msg->user_precision = c->precision;
        msg->user_recompute = c->recompute;
        msg->user_optimizer = c->optimizer;
        msg->user_batching = c->batching;
        msg->user_torch = c->torch_version;
        snprintf(msg->user_output_dir, sizeof msg->user_output_dir, "%s", c->output_dir);
        for (int i = 0; i < n; i++)
            if (cards[i].card == msg->card) {
                msg->have_plan = 1, msg->plan_peak = cards[i].peak;
                /* PyTorch's message counts allocated bytes: set the plan's beside it */
                if (pc.engine == TK_ENGINE_PYTORCH) msg->plan_allocated = cards[i].peak_allocated;
            }
        tk_oom_message_diagnose(msg, cards, n, platform);
        /* the config advised on the card the message names, by the same engine */
        tk_config on = pc;
        if (msg->card) {
            on.capacity = 0;
            if ((st = tk_config_set(&on, "gpu", msg->card->name, err)) != TK_OK) goto done;
        }
        a = tk_malloc(sizeof *a);
        tk_advise_input in = {.config = &on, .lengths = lengths, .n_lengths = n_lengths, .margin_frac = 0.05,
                              .platform = msg->platform[0] ? platform : NULL, .api = msg->api,
                              .plan_fn = pf, .plan_ctx = pctx};
        if (!a || (st = tk_advise(&in, a, err)) != TK_OK) {
            if (!a) tk_err_set(err, st = TK_ENOMEM, "out of host memory advising");
            goto done;
        }
        adv_text = opts && opts->cli_config ? tk_advice_format_cli(a, 5, opts->cli_config) : tk_advice_format(a, 5);
        if (!adv_text) goto nomem;
        int au = tk_advice_auto(a);
        if (msg->n_fixes == TK_OOMMSG_MAX_FIXES) msg->n_fixes--;
        /* the planned fix of the user's own config goes first when the top
         * diagnosis is the step's own size (capacity); otherwise the top
         * diagnosis' fix (free what is held, stop the other process,
         * expandable segments) stays first and the planned one follows it,
         * and when the config fits the card it goes last: no fix that
         * shrinks the step ranks above one that frees memory */
        int fits_card = 0;
        for (int i = 0; i < n; i++)
            if (cards[i].card == msg->card) fits_card = cards[i].fits;
        int at = !msg->n_diag || msg->diag[0].kind == TK_DIAG_CAPACITY ? 0 : fits_card ? msg->n_fixes
                                                                          : (msg->n_fixes ? 1 : 0);
        for (int i = 0; i < a->n_cand; i++) {
            if (i != au && !(au < 0 && i == 0)) continue;
            char *code = tk_fix_code(&on, &a->cand[i].config, msg->api);
            if (!code) goto nomem;
            memmove(&msg->fixes[at + 1], &msg->fixes[at], (size_t)(msg->n_fixes - at) * sizeof msg->fixes[0]);
            msg->n_fixes++;
            tk_fix_note *x = &msg->fixes[at];
            char b1[32];
            snprintf(x->text, sizeof x->text, "your config's fix, as %s plans it on %s: %s (peak %s%s)",
                     msg->plan_engine, msg->card ? msg->card->name : "this card", a->cand[i].label,
                     tk_format_bytes(a->cand[i].peak, b1, sizeof b1), a->cand[i].fits_margin ? ", fits with margin" : "");
            snprintf(x->code, sizeof x->code, "%s", code);
            free(code);
        }
    } else {
        tk_oom_message_diagnose(msg, NULL, 0, NULL);
    }
    /* Every part or none: a part that could not be built is an error, not a
     * shorter report. */
    char *txt = tk_oom_message_format(msg);
    json_t *jv = tk_oom_message_to_json(msg);
    tk_sb sb = {0};
    tk_sb_add(&sb, txt ? txt : "");
    char adv_head[240] = "";
    if (adv_text)
        snprintf(adv_head, sizeof adv_head, "The config planned on %s by %s (%s):\n", msg->card ? msg->card->name : "this card",
                 msg->plan_engine, strncmp(msg->plan_engine, "engine: pytorch", 15) == 0
                     ? "one training step as PyTorch allocates it, not your run's figures"
                     : "its own plan, not your PyTorch run's figures");
    if (adv_text) tk_sb_addf(&sb, "%s%s", adv_head, adv_text);
    char *plain = tk_sb_take(&sb);
    tk_sb_add(&sb, "<pre>");
    tk_sb_add_html(&sb, txt ? txt : "");
    if (adv_text) {
        tk_sb_add_html(&sb, adv_head);
        tk_sb_add_html(&sb, adv_text);
    }
    tk_sb_add(&sb, "</pre>");
    char *html = tk_sb_take(&sb);
    int bad = !txt || !jv || !plain || !html || !(*bundle = tk_bundle_new(plain));
    free(txt);
    free(plain);
    if (bad) {
        free(html);
        json_decref(jv);
        goto nomem;
    }
    if (tk_bundle_take(*bundle, "text/html", html) || tk_bundle_take_json(*bundle, "application/json", jv))
        goto nomem;
    goto done;
nomem:
    json_decref(*bundle);
    *bundle = NULL;
    st = tk_err_nomem(err, "the OOM message's report");
done:
    free(adv_text);
    free(a);
    free(msg);
    return st;
}

/* --api's value as the config key reads it; -1 (an error shown) when bad. */
static int api_arg(tk_magic_ctx *m, const char *v, tk_api *out) {
    tk_config probe;
    tk_config_defaults(&probe);
    tk_err e = {0};
    if (!v || tk_config_set(&probe, "api", v, &e) != TK_OK)
        return tk_magic_error(m, "UsageError", "--api %s: expected trainer, loop, txkernel or keras\nusage: %s", v ? v : "",
                              TXADVISE_USAGE);
    *out = probe.api;
    return 0;
}

/* --for P and --api A, which %txadvise and %%txadvise --from-error share:
 * 1 when argv[*i] is one of them (*i moved past its value; *rc the error
 * shown, if any), else 0. */
static int platform_api_flag(tk_magic_ctx *m, char **argv, int argc, int *i, char *platform, size_t pn, tk_api *api,
                             int *rc) {
    char why[200];
    if (!strcmp(argv[*i], "--for")) {
        const char *bad = tk_platform_check(*i + 1 < argc ? argv[*i + 1] : NULL, 0, why, sizeof why);
        if (bad) *rc = tk_magic_error(m, "UsageError", "%s\nusage: %s", bad, TXADVISE_USAGE);
        else snprintf(platform, pn, "%s", argv[++*i]);
        return 1;
    }
    if (!strcmp(argv[*i], "--api")) {
        *rc = api_arg(m, *i + 1 < argc ? argv[*i + 1] : NULL, api);
        ++*i;
        return 1;
    }
    return 0;
}

/* %%txadvise --from-error [--for P] [--api A] [--json]: the cell body is the
 * pasted message; the session's last config, when there is one, is planned
 * on its card. */
static int txadvise_from_error(tk_magic_ctx *m) {
    char **argv = NULL;
    int argc = 0, json_only = 0, rc = 0;
    tk_oom_report_opts o = {0};
    char platform[16] = "";
    if (tk_txargs_split(m->args, &argv, &argc)) return tk_magic_error(m, "UsageError", "unbalanced quotes");
    for (int i = 0; i < argc && !rc; i++) {
        if (!strcmp(argv[i], "--from-error")) continue;
        if (!strcmp(argv[i], "--json")) json_only = 1;
        else if (platform_api_flag(m, argv, argc, &i, platform, sizeof platform, &o.api, &rc)) {
        } else {
            rc = tk_magic_error(m, "UsageError", "%%%%txadvise --from-error: unexpected '%s'\nusage: %s", argv[i],
                                TXADVISE_USAGE);
        }
    }
    tk_txargs_free(argv, argc);
    if (rc) return rc;
    if (platform[0]) o.platform = platform;
    const char *body = m->body ? m->body : "";
    const tk_config *last = tk_session_config(m->session);
    int nl = 0;
    const int *len = tk_session_lengths(m->session, &nl);
    /* the companion's traced model: the message's config is its own step, traced */
    tk_traced_model *tm = last ? tk_session_traced(m->session, last) : NULL;
    char pname[200] = "";
    if (tm) {
        tk_traced_begin(tm);
        snprintf(pname, sizeof pname, "engine: pytorch, traced %s", tk_traced_label(tm));
        o.plan_fn = tk_traced_plan, o.plan_ctx = tm, o.plan_name = pname;
    }
    json_t *b = NULL;
    tk_err err = {0};
    tk_status st = tk_oom_message_report(body, strlen(body), last, (const int32_t *)len, nl, &o, &b, &err);
    if (st == TK_EFORMAT) {
        json_t *nb = tk_bundle_new("no OOM message found\n");
        tk_txemit(m, nb, 0);
        json_decref(nb);
        return 0;
    }
    if (st != TK_OK) return tk_magic_error(m, "AdviseError", "%s", err.msg);
    tk_txemit(m, b, json_only);
    json_decref(b);
    return 0;
}

static int run_txadvise(tk_magic_ctx *m) {
    if (m->args && strstr(m->args, "--from-error")) {
        if (!m->is_cell)
            return tk_magic_error(m, "UsageError", "--from-error reads the cell body: %%%%txadvise --from-error, then "
                                                   "the pasted message on the next lines");
        return txadvise_from_error(m);
    }
    tk_session *s = m->session;
    const tk_config *last = tk_session_config(s);
    if (!last && !m->is_cell)
        return tk_magic_error(m, "UsageError",
                              "%%txadvise needs a config: run %%%%txtrain or %%txplan first, or give one as a "
                              "%%%%txadvise cell body\nusage: %s", TXADVISE_USAGE);
    tk_config base;
    if (last && !m->is_cell) base = *last;
    else tk_config_defaults(&base);
    tk_config c;
    if (tk_txconfig_from_cell(m, &base, &c, 1)) return -1;
    char **argv = NULL;
    int argc = 0, json_only = 0, top = 12, rc = 0;
    double margin = 0.05;
    char platform[16] = ""; /* --for: the platform whose cards the advice knows (two T4s on kaggle) */
    tk_api api = TK_API_AUTO;
    if (tk_txargs_split(m->args, &argv, &argc)) return tk_magic_error(m, "UsageError", "unbalanced quotes");
    for (int i = 0; i < argc && !rc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--json")) json_only = 1;
        else if (platform_api_flag(m, argv, argc, &i, platform, sizeof platform, &api, &rc)) {
        }
        else if (!strcmp(argv[i], "--gpu")) {
            /* the card to advise for, as `txk advise --gpu` and %txplan --gpu take it */
            tk_err ge = {0};
            if (i + 1 >= argc) rc = tk_magic_error(m, "UsageError", "--gpu needs a value\nusage: %s", TXADVISE_USAGE);
            else if (tk_config_set(&c, "gpu", argv[++i], &ge) != TK_OK) rc = tk_magic_error(m, "ConfigError", "%s", ge.msg);
        }
        else if (!strcmp(argv[i], "--top") || !strcmp(argv[i], "--margin")) {
            if (i + 1 >= argc) {
                rc = tk_magic_error(m, "UsageError", "%s needs a value\nusage: %s", argv[i], TXADVISE_USAGE);
                break;
            }
            if (!strcmp(argv[i], "--top")) {
                long v = strtol(argv[++i], &end, 10);
                if (*end || v < 1 || v > TK_ADVICE_MAX_CANDS)
                    rc = tk_magic_error(m, "UsageError", "--top: expected 1..%d, got '%s'", TK_ADVICE_MAX_CANDS, argv[i]);
                top = (int)v;
            } else {
                double v = strtod(argv[++i], &end);
                if (*end || !(v >= 0 && v < 0.5))
                    rc = tk_magic_error(m, "UsageError", "--margin: expected a share of capacity in [0, 0.5), got '%s'",
                                        argv[i]);
                margin = v;
            }
        } else if (!strncmp(argv[i], "--", 2)) {
            rc = tk_magic_error(m, "UsageError", "%%txadvise: unknown option %s\nusage: %s", argv[i], TXADVISE_USAGE);
        }
    }
    tk_txargs_free(argv, argc);
    if (rc) return rc;
    tk_err err = {0};
    if (tk_config_validate(&c, &err) != TK_OK) return tk_magic_error(m, "ConfigError", "%s", err.msg);

    if (api != TK_API_AUTO) c.api = api; /* --api is the config's key: the session's config keeps it */
    /* the run resolved once: the session's device, the card of the config,
     * else the smallest card of --for or of the platform %txplan --gpus
     * planned on (said, never silent); the session's config stays as given */
    tk_run_where where;
    tk_session_where(s, &where);
    if (platform[0]) where.platform = platform;
    tk_run_spec spec;
    tk_config on = c;
    if (tk_run_spec_resolve(&c, &where, &spec, &err) != TK_OK || tk_run_spec_apply(&spec, &on, &err) != TK_OK)
        return tk_magic_error(m, "ConfigError", "%s", err.msg);
    char card_note[256] = "";
    if (!c.gpu[0] && on.gpu[0])
        snprintf(card_note, sizeof card_note, "Advised for %s.", spec.card_why);
    tk_advise_input in = {.config = &on, .margin_frac = margin, .platform = spec.platform[0] ? spec.platform : NULL};
    /* the companion's traced model: the config and each candidate are its own step, traced */
    tk_traced_model *tm = tk_session_traced(s, &c);
    if (tm) {
        tk_traced_begin(tm);
        in.plan_fn = tk_traced_plan, in.plan_ctx = tm;
    }
    const tk_run_report *lr = tk_session_last_run(s);
    /* the OOM record counts only for the config that ran out (--api is how
     * the advice is written, not the run) */
    tk_config ran = c;
    if (last) ran.api = last->api;
    if (lr && lr->end == TK_RUN_OOM && lr->have_oom && last && !m->is_cell && !memcmp(last, &ran, sizeof ran))
        in.oom = &lr->oom;
    /* a config with a train_file is advised on the run's model and corpus */
    tk_run_data data;
    if (tk_session_load_data(s, &c, &data, &err) != TK_OK) return tk_magic_error(m, "DataError", "%s", err.msg);
    tk_run_data_clear(&data);
    int nl = 0;
    const int *len = tk_session_lengths(s, &nl);
    in.lengths = (const int32_t *)len;
    in.n_lengths = nl;
    tk_session_device_now(s, &on, &in.free_now, &in.held_by_session);
    in.held_in_process = tk_session_held_in_process(s);
    int nt = 0;
    const tk_mem_sample *tl = tk_session_timeline(s, &nt);
    size_t *steps = nt > 0 ? tk_malloc((size_t)nt * sizeof *steps) : NULL;
    for (int i = 0; steps && i < nt; i++) steps[i] = tl[i].allocated;
    in.step_allocated = steps;
    in.n_steps = steps ? nt : 0;

    tk_advice *a = tk_malloc(sizeof *a);
    if (!a) {
        free(steps);
        return tk_magic_error(m, "MemoryError", "out of host memory");
    }
    tk_status st = tk_advise(&in, a, &err);
    free(steps);
    if (st != TK_OK) {
        free(a);
        return tk_magic_error(m, "AdviseError", "%s", err.msg);
    }
    tk_session_set_config(s, &c);
    tk_session_set_plan(s, &a->base);
    char note[2048], traced[1600] = ""; /* said first: the card it is for, and what planned it */
    if (tm) tk_traced_summary(tm, traced, sizeof traced);
    snprintf(note, sizeof note, "%s%s%s", card_note, card_note[0] && traced[0] ? "\n" : "", traced);
    json_t *b = advice_bundle(a, top, note, &spec, traced);
    tk_session_take_advice(s, a);
    tk_session_set_advice_config(s, &c);
    tk_txemit(m, b, json_only);
    json_decref(b);
    return 0;
}

/* ---- %txfix -------------------------------------------------------------------- */

/* The candidate `what` names: 1-based index, "auto", or a fix label. -1 and
 * an error through the sink if none. */
static int pick(tk_magic_ctx *m, const tk_advice *a, const char *what) {
    if (!strcmp(what, "auto")) {
        int i = tk_advice_auto(a);
        if (i < 0)
            tk_magic_error(m, "NoFixError",
                           "no candidate fits with margin and keeps the effective batch of %d; pick one by number "
                           "from the %%txadvise table (those change the batch or do not fit)",
                           a->base_effective_batch);
        return i;
    }
    char *end = NULL;
    long k = strtol(what, &end, 10);
    if (*what && !*end) {
        if (k < 1 || k > a->n_cand) {
            tk_magic_error(m, "UsageError", "%%txfix %s: the last advice has candidates 1..%d", what, a->n_cand);
            return -1;
        }
        return (int)k - 1;
    }
    for (int i = 0; i < a->n_cand; i++)
        if (!strcmp(a->cand[i].label, what)) return i;
    for (int i = 0; i < a->n_cand; i++) /* a fix name: the best candidate with that fix alone */
        if (a->cand[i].n_fixes == 1 && !strcmp(tk_fix_name(a->cand[i].fixes[0].kind), what)) return i;
    tk_magic_error(m, "UsageError", "%%txfix: no candidate named '%s' in the last advice (give its number, auto, or "
                                    "a label from the table)\nusage: %s", what, TXFIX_USAGE);
    return -1;
}

/* "equal, byte for byte", "below the plan by X", "ABOVE the plan by X". */
static void compare(size_t measured, size_t planned, char *buf, size_t n) {
    char b[32];
    if (measured == planned) snprintf(buf, n, "equal, byte for byte");
    else if (measured < planned) snprintf(buf, n, "below the plan by %s", tk_format_bytes(planned - measured, b, sizeof b));
    else snprintf(buf, n, "ABOVE the plan by %s", tk_format_bytes(measured - planned, b, sizeof b));
}

/* %txfix's words: the candidate it names (-1: an error was shown), the
 * flags. `what` (wn bytes) gets the name as given. */
static int parse_txfix(tk_magic_ctx *m, const tk_advice **pa, int *run_out, int *json_out, char *what_out,
                       size_t wn) {
    tk_session *s = m->session;
    char **argv = NULL;
    int argc = 0, run = 0, json_only = 0, rc = 0;
    const char *what = NULL;
    char for_platform[16] = "";
    if (tk_txargs_split(m->args, &argv, &argc)) {
        tk_magic_error(m, "UsageError", "unbalanced quotes");
        return -1;
    }
    for (int i = 0; i < argc && !rc; i++) {
        if (!strcmp(argv[i], "--run")) run = 1;
        else if (!strcmp(argv[i], "--for")) {
            char why[200];
            const char *bad = tk_platform_check(i + 1 < argc ? argv[i + 1] : NULL, 1, why, sizeof why);
            if (bad) rc = tk_magic_error(m, "UsageError", "%s", bad);
            else snprintf(for_platform, sizeof for_platform, "%s", argv[++i]);
        }
        else if (!strcmp(argv[i], "--json")) json_only = 1;
        else if (!strncmp(argv[i], "--", 2))
            rc = tk_magic_error(m, "UsageError", "%%txfix: unknown option %s\nusage: %s", argv[i], TXFIX_USAGE);
        else if (what)
            rc = tk_magic_error(m, "UsageError", "%%txfix takes one fix, got '%s' and '%s'\nusage: %s",
                                what, argv[i], TXFIX_USAGE);
        else
            what = argv[i];
    }
    if (!rc && !what) rc = tk_magic_error(m, "UsageError", "%%txfix: which fix?\nusage: %s", TXFIX_USAGE);
    const tk_advice *a = tk_session_advice(s);
    if (!rc && !a) rc = tk_magic_error(m, "UsageError", "%%txfix: no advice yet: run %%txadvise first");
    if (!rc && for_platform[0] && strcmp(what, "auto"))
        rc = tk_magic_error(m, "UsageError", "--for goes with auto: %%txfix auto --for %s", for_platform);
    int i = -1;
    if (!rc && for_platform[0]) {
        int nl = 0;
        const int *len = tk_session_lengths(s, &nl);
        i = tk_advice_auto_for(a, for_platform, (const int32_t *)len, nl);
        if (i < 0)
            rc = tk_magic_error(m, "NoFixError", "no candidate of the last advice fits with a 5%% margin on every card "
                                                 "%s hands out and keeps the effective batch of %d", for_platform,
                                a->base_effective_batch);
    } else if (!rc) {
        i = pick(m, a, what);
    }
    snprintf(what_out, wn, "%s", what ? what : "");
    tk_txargs_free(argv, argc);
    *pa = a;
    *run_out = run;
    *json_out = json_only;
    return rc ? -1 : i;
}

/* A release (action_only): what the session holds is freed; what PyTorch in
 * this process caches is the user's Python to free, so it is said, not
 * done (and *run is cleared: a run would meet the same memory). */
static void apply_release(tk_magic_ctx *m, const tk_candidate *cand, int i, const tk_config *after, int *run) {
    tk_session *s = m->session;
    char b1[32], b2[32];
    unsigned release = cand->fixes[0].release;
    tk_dev *d = tk_session_current_device(s);
    tk_alloc_stats st = {0};
    if (d) tk_alloc_stats_get(tk_dev_alloc(d), &st);
    char label[sizeof cand->label];
    snprintf(label, sizeof label, "%s", cand->label);
    if (release & TK_RELEASE_SESSION) {
        tk_session_reset(s); /* frees the advice too: cand is gone after this */
        cand = NULL;
        tk_session_set_config(s, after);
        tk_magic_printf(m, "stdout", "Fix #%d (%s): released the session's device (%s allocated, %s reserved).\n",
                        i + 1, label, tk_format_bytes(st.allocated, b1, sizeof b1),
                        tk_format_bytes(st.reserved, b2, sizeof b2));
    }
    if (release & TK_RELEASE_IN_PROCESS) {
        const tk_holder *h = tk_session_holder(s);
        tk_magic_printf(m, "stdout",
                        "Fix #%d (%s): PyTorch's caching allocator in this process holds %s reserved (%s "
                        "allocated), which only your Python can free. Run in a cell:\n"
                        "    del model, optimizer, outputs   # whatever still refers to tensors on the GPU\n"
                        "    import gc; gc.collect()\n"
                        "    import torch; torch.cuda.empty_cache()\n"
                        "then %%txtrain (%%txmem shows what PyTorch still holds).\n",
                        i + 1, label, tk_format_bytes(h->reserved, b1, sizeof b1),
                        tk_format_bytes(h->allocated, b2, sizeof b2));
        if (*run) {
            tk_magic_printf(m, "stdout", "Not training now (--run): the run would meet the same memory until "
                                         "your Python frees it.\n");
            *run = 0;
        }
    }
}

/* A config change: the diff, the new plan's figures, the session's config
 * set to it. */
static void apply_config_fix(tk_magic_ctx *m, const tk_advice *a, const tk_candidate *cand, int i,
                             const tk_config *before, const tk_config *after, int run, const char *what,
                             int json_only) {
    tk_session *s = m->session;
    char b1[32], b2[32], b3[32];
    char *diff = tk_config_diff(before, after);
    tk_session_set_config(s, after);
    json_t *b = json_object();
    char *yaml = tk_config_to_yaml(after);
    char *code = tk_fix_code(before, after, a->api);
    int plan_only = tk_config_plan_only(after);
    tk_sb t = {0};
    tk_sb_addf(&t, "Fix #%d: %s\n  %s\nChanged:\n%s", i + 1, cand->label, cand->reason,
               diff && *diff ? diff : "  (nothing)\n");
    if (code && *code && a->api != TK_API_TXKERNEL) tk_sb_addf(&t, "In your code (api: %s):\n%s\n", tk_api_name(a->api), code);
    if (plan_only)
        tk_sb_addf(&t, "Planned peak %s reserved (was %s), margin %s%s. The session's config is now this one, as a "
                   "plan only: txkernel does not start %d GPUs on cuda; the same split in PyTorch:\n%s\n",
                   tk_format_bytes(cand->peak, b1, sizeof b1), tk_format_bytes(a->base.peak_reserved, b2, sizeof b2),
                   cand->margin < 0 ? "-" : "",
                   tk_format_bytes((size_t)(cand->margin < 0 ? -cand->margin : cand->margin), b3, sizeof b3),
                   tk_config_world_size(after), code ? code : "");
    else
        tk_sb_addf(&t, "Planned peak %s reserved (was %s), margin %s%s. The session's config is now this one%s%s%s\n",
                   tk_format_bytes(cand->peak, b1, sizeof b1), tk_format_bytes(a->base.peak_reserved, b2, sizeof b2),
                   cand->margin < 0 ? "-" : "",
                   tk_format_bytes((size_t)(cand->margin < 0 ? -cand->margin : cand->margin), b3, sizeof b3),
                   run ? "; training it now." : ": %txtrain trains it (or %txfix ", run ? "" : what,
                   run ? "" : " --run).");
    char *tt = tk_sb_take(&t);
    json_object_set_new(b, "text/plain", json_string(tt ? tt : ""));
    tk_sb h = {0};
    tk_sb_add(&h, "<div><p><b>Fix #");
    tk_sb_addf(&h, "%d: ", i + 1);
    tk_sb_add_html(&h, cand->label);
    tk_sb_add(&h, "</b> - ");
    tk_sb_add_html(&h, cand->reason);
    tk_sb_add(&h, "</p><pre>");
    tk_sb_add_html(&h, diff ? diff : "");
    tk_sb_add(&h, "</pre><details><summary>the whole config (YAML)</summary><pre>");
    tk_sb_add_html(&h, yaml ? yaml : "");
    tk_sb_add(&h, "</pre></details></div>");
    tk_bundle_take(b, "text/html", tk_sb_take(&h));
    json_t *fx = json_array();
    for (int k = 0; fx && k < cand->n_fixes; k++)
        json_array_append_new(fx, tk_fix_json(&cand->fixes[k]));
    json_object_set_new(b, "application/json",
                        json_pack("{s:i, s:s, s:s, s:o, s:I, s:I, s:b, s:s, s:s, s:s, s:s, s:b}", "index", i + 1, "label",
                                  cand->label, "reason", cand->reason, "fixes", fx, "planned_peak",
                                  (json_int_t)cand->peak, "margin", (json_int_t)cand->margin, "fits_margin",
                                  cand->fits_margin, "diff", diff ? diff : "", "yaml", yaml ? yaml : "", "code",
                                  code ? code : "", "api", tk_api_name(a->api), "plan_only", plan_only));
    free(code);
    free(tt);
    free(yaml);
    free(diff);
    tk_txemit(m, b, json_only);
    json_decref(b);
}

/* --run: train the fixed config and hold the plan to account. */
static int train_and_compare(tk_magic_ctx *m, const tk_config *after, size_t predicted) {
    tk_session *s = m->session;
    char b1[32], b2[32], b3[32], b4[32];
    if (tk_txtrain_run_config(m, after, 0, 0)) return -1;
    const tk_run_report *r = tk_session_last_run(s);
    if (!r) return 0;
    /* reserved is the figure the advice ranks by; allocated is shown too.
     * With dynamic padding or buckets the plan assumes a full batch at the
     * corpus' longest length: a run whose longest batch is partial stays
     * below it. */
    char v1[96], v2[96];
    compare(r->peak_reserved, r->plan.peak_reserved, v1, sizeof v1);
    compare(r->peak_allocated, r->plan.peak_allocated, v2, sizeof v2);
    tk_magic_printf(m, "stdout",
                    "Measured peak %s reserved (planned %s: %s), %s allocated (planned %s: %s).%s\n",
                    tk_format_bytes(r->peak_reserved, b1, sizeof b1), tk_format_bytes(r->plan.peak_reserved, b2, sizeof b2),
                    v1, tk_format_bytes(r->peak_allocated, b3, sizeof b3),
                    tk_format_bytes(r->plan.peak_allocated, b4, sizeof b4), v2,
                    r->plan.peak_reserved == predicted ? "" : " (the advice's plan differed: new corpus lengths)");
    if (r->peak_reserved > r->plan.peak_reserved)
        tk_magic_printf(m, "stdout", "Why above: the plan steps the worst-case batch, while the run's batches differ "
                        "in shape (dynamic padding, the last partial batch, the dev batches), and each shape leaves "
                        "the cache split differently. %%%%txplan --epoch plans the run's own batches in the run's order, "
                        "reserved included.\n");
    if (r->have_device_peak) {
        /* on cuda: everything the process had on the device, against the
         * plan plus the plugin's own buffers (cuBLAS workspace, scratch) */
        size_t want = r->plan.peak_reserved + r->plugin_bytes;
        double off = want ? 100.0 * ((double)r->device_peak - (double)want) / (double)want : 0.0;
        tk_magic_printf(m, "stdout", "Device peak (CUPTI, every allocation in the process) %s; plan + plugin "
                        "buffers %s: %+.2f%%.\n", tk_format_bytes(r->device_peak, b1, sizeof b1),
                        tk_format_bytes(want, b2, sizeof b2), off);
    }
    return 0;
}

static int run_txfix(tk_magic_ctx *m) {
    const tk_advice *a = NULL;
    int run = 0, json_only = 0;
    char what[64];
    int i = parse_txfix(m, &a, &run, &json_only, what, sizeof what);
    if (i < 0) return -1;
    const tk_candidate *cand = &a->cand[i];
    const tk_config *old = tk_session_config(m->session);
    tk_config before = old ? *old : cand->config, after = cand->config;
    /* the advice planned the config as the run resolved it (the card of a
     * platform, the device's attention): what no fix changed goes back to
     * the session's config as the user gave it */
    const tk_config *asked = tk_session_advice_config(m->session);
    if (asked) tk_run_spec_unapply(&after, &a->given, asked);
    size_t predicted = cand->peak;
    if (run && tk_config_plan_only(&after)) {
        tk_magic_printf(m, "stdout", "Not training (--run): txkernel does not start %d GPUs on cuda; the fix below is "
                        "a plan, with the PyTorch recipe for it.\n", tk_config_world_size(&after));
        run = 0;
    }
    if (cand->action_only)
        apply_release(m, cand, i, &after, &run); /* may free the advice: cand is gone after this */
    else
        apply_config_fix(m, a, cand, i, &before, &after, run, what, json_only);
    return run ? train_and_compare(m, &after, predicted) : 0;
}

static const tk_magic_def TXADVISE[] = {
    {"txadvise", TK_MAGIC_BOTH, run_txadvise, "why a run does not fit, and fixes ranked by what they cost",
     TXADVISE_USAGE "\n%%txadvise [key=value ...]\n<YAML config>\n\n"
     "Diagnoses the session's last config (or the cell's): more than the card has, memory\n"
     "another run still holds, fragmentation, one layer or one category that dominates the\n"
     "peak, max_len far above what the corpus needs, a long batch that only sometimes comes,\n"
     "memory that grows step after step. Then plans candidate fixes on the meta device -\n"
     "single changes, pairs and triples: max_len from the corpus, a span head instead of a\n"
     "flatten Dense head, fp16/bf16, gradient accumulation, recompute, fused attention,\n"
     "8-bit AdamW, frozen embeddings, dynamic padding or length buckets, emptying the cache\n"
     "- and ranks them: fits with margin, removes a cause, fewer changes, results at risk,\n"
     "time per sample. --margin is the safety margin as a share of capacity (0.05).\n"
     "When the config fits some of the cards its platform hands out (Colab, Kaggle) but\n"
     "not its own, or fits one within 5%, it adds the card lottery. Pick one with %txfix.\n\n"
     "%%txadvise --from-error [--json]\n<the pasted OOM message or traceback>\n"
     "Reads PyTorch's OOM message (1.0-1.3 \"cached\", 1.4-2.0 \"reserved in total\", 2.1+)\n"
     "or TensorFlow's (\"OOM when allocating tensor with shape[...]\"): every figure in\n"
     "bytes, the card its total names, impossible figures left out, the diagnoses and the\n"
     "fixes as code. With a session config, that config is planned on each card of the\n"
     "platform and advised on the message's card."},
    {"txfix", TK_MAGIC_LINE, run_txfix, "apply a fix from %txadvise to the session's config (--run trains it)",
     TXFIX_USAGE "\n\n"
     "N: the candidate numbered N in the last %txadvise table. auto: the best candidate\n"
     "that fits with margin and keeps the effective batch (batch_size x accumulate).\n"
     "A label from the table (\"fp16 + accumulate 4\") or a fix name (max_len, head, ...)\n"
     "picks that row. Shows what changed and the new plan; the fixed config becomes the\n"
     "session's: %txtrain (the line form) trains it, %txplan plans it with overrides.\n"
     "--run trains it now and compares the measured peak with the planned one.\n"
     "auto --for colab|kaggle|colab-2020|all: the best candidate that also fits with a 5% margin on\n"
     "every card the platform hands out, so the card the runtime gets does not matter."},
};

int tk_magics_register_txadvise(tk_magics *m) { return tk_magics_add_table(m, TXADVISE, 2); }
