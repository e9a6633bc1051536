/* advise.c — the advise verb of the request layer (issue 39): `txk advise`
 * and `%txadvise` (plan advice), `txk advise --from-error` and `%%txadvise
 * --from-error` (a pasted OOM message), and `%txfix` (a fix taken) call the
 * functions here with a typed request and print or show what they return.
 * Moved from magics/txadvise.c and cli/txk.c, where each door built the
 * same request by hand; the advisor's public API (tk_advisor.h,
 * tk_oom_message.h) is called as the doors called it.
 *
 * Inputs beyond the request come from the session: the platform it planned
 * on, its device, the last run's OOM record and timeline, the corpus
 * lengths. A shell passes a fresh session, so they are empty there.
 *
 * Guarantees: advising plans on private meta devices only; the session's
 * device is not touched. A fix is applied only to the session's config;
 * nothing trains here (%txfix --run is the door's, through the train verb).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tk_advisor.h"
#include "tk_app.h"
#include "tk_config_edit.h"
#include "tk_data.h"
#include "tk_embed_trace.h"
#include "tk_host_mem.h"
#include "tk_oom_message.h"
#include "tk_pipeline.h"
#include "tk_render.h"
#include "tk_session.h"

/* The advice as a bundle. card_note: the line saying which card the advice
 * is for when the config names none (the platform's smallest), and what
 * planned it; "" otherwise. cli_config: the config's path when txk prints it
 * (the text names txk's commands); NULL in a notebook (it names the magics).
 * traced: tk_traced_summary's line for a traced model's advice (JSON
 * "planned_by"), else "". */
static json_t *advice_bundle(const tk_advice *a, int top, const char *card_note, const tk_run_spec *spec,
                             const char *cli_config, const char *traced) {
    char *txt = cli_config ? tk_advice_format_cli(a, top, cli_config) : tk_advice_format(a, top);
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
    if (opts) msg->torch_live = opts->torch_live, msg->last_run = opts->last_run;
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
        tk_traced_model *tm = opts ? opts->traced : NULL; /* a traced model: its own step, traced */
        tk_plan_fn pf = tm ? tk_traced_plan : NULL;
        void *pctx = tm;
        char pname[150] = "";
        if (tm) {
            tk_traced_begin(tm);
            snprintf(pname, sizeof pname, "engine: pytorch, traced %s", tk_traced_label(tm));
        }
        st = tk_plan_cards_by(pf, pctx, &pc, lengths, n_lengths, platform, cards, 16, &n, &pe);
        if (st == TK_EINVAL && !pf) {
            pc.engine = TK_ENGINE_TXKERNEL;
            st = tk_plan_cards(&pc, lengths, n_lengths, platform, cards, 16, &n, err);
        } else if (st != TK_OK && err) {
            *err = pe;
        }
        if (st != TK_OK) goto done;
        snprintf(msg->plan_engine, sizeof msg->plan_engine, "%s",
                 tm ? pname : tk_plan_engine_name(&pc));
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
                              .plan_fn = pf, .plan_ctx = pctx, .torch_live = msg->torch_live,
                              .last_run = msg->last_run};
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
    char adv_head[400] = "";
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


/* ---- the words of an advise request ----------------------------------------- */

/* --api's value as the config key reads it; TK_EINVAL naming it when it is
 * not an API the fixes can be written in. */
static tk_status api_flag(const char *v, tk_api *out, tk_err *err) {
    tk_config probe;
    tk_config_defaults(&probe);
    if (!v || tk_config_set(&probe, "api", v, NULL) != TK_OK || probe.api == TK_API_AUTO) {
        tk_err_set(err, TK_EINVAL, "--api %s: expected trainer, loop, txkernel or keras", v ? v : "");
        return TK_EINVAL;
    }
    *out = probe.api;
    return TK_OK;
}

/* What --from-error takes besides itself: the platform, the API, --json,
 * and in a shell the config (a word or --file) with the corpus of --data. */
static int from_error_takes(const char *flag) {
    static const char *const ok[] = {"--from-error", "--for", "--api", "--json", "--data", "--file"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(flag, ok[i])) return 1;
    return 0;
}

tk_status tk_app_advise_flags(const tk_app_args *a, tk_door door, tk_advise_request *rq, tk_err *err) {
    rq->door = door;
    rq->gpu = tk_app_arg(a, "--gpu");
    rq->platform = tk_app_arg(a, "--for");
    rq->fix = tk_app_arg(a, "--fix");
    rq->out = tk_app_arg(a, "-o");
    rq->data = tk_app_arg(a, "--data");
    rq->from_error = tk_app_has(a, "--from-error");
    rq->from_error_path = tk_app_arg(a, "--from-error");
    rq->api = TK_API_AUTO;
    rq->top = 12;
    rq->margin = 0.05;
    for (int i = 0; rq->from_error && i < a->n_flags; i++)
        if (!from_error_takes(a->flag[i]->name)) {
            tk_err_set(err, TK_EINVAL, "--from-error: unexpected %s (it takes --for, --api, --json; in a shell a "
                       "config and --data FILE)", a->flag[i]->name);
            return TK_EINVAL;
        }
    if (rq->from_error && door == TK_DOOR_CELL && (a->n_kv || a->n_plain)) {
        tk_err_set(err, TK_EINVAL, "--from-error: unexpected '%s' (the cell body is the message; the session's "
                   "config is planned on its card)", a->n_kv ? a->kv[0] : a->plain[0]);
        return TK_EINVAL;
    }
    const char *top = tk_app_arg(a, "--top"), *margin = tk_app_arg(a, "--margin");
    char *end = NULL;
    if (top) {
        long v = strtol(top, &end, 10);
        if (!*top || *end || v < 1 || v > TK_ADVICE_MAX_CANDS) {
            tk_err_set(err, TK_EINVAL, "--top: expected 1..%d, got '%s'", TK_ADVICE_MAX_CANDS, top);
            return TK_EINVAL;
        }
        rq->top = (int)v;
    }
    if (margin) {
        double v = strtod(margin, &end);
        if (!*margin || *end || !(v >= 0 && v < 0.5)) {
            tk_err_set(err, TK_EINVAL, "--margin: expected a share of capacity in [0, 0.5), got '%s'", margin);
            return TK_EINVAL;
        }
        rq->margin = v;
    }
    if (tk_app_has(a, "--api") && api_flag(tk_app_arg(a, "--api"), &rq->api, err) != TK_OK) return TK_EINVAL;
    int fix_auto = rq->fix && !strcmp(rq->fix, "auto");
    if (rq->platform && !strcasecmp(rq->platform, "all") && door == TK_DOOR_SHELL && !rq->from_error && !fix_auto) {
        tk_err_set(err, TK_EINVAL, "--for all goes with --fix auto (a config that fits every GPU profile)");
        return TK_EINVAL;
    }
    char why[200];
    const char *bad = tk_app_has(a, "--for") ? tk_platform_check(rq->platform, fix_auto, why, sizeof why) : NULL;
    if (bad) {
        tk_err_set(err, TK_EINVAL, "%s", bad);
        return TK_EINVAL;
    }
    if (rq->out && !rq->fix) {
        tk_err_set(err, TK_EINVAL, "-o goes with --fix N|auto");
        return TK_EINVAL;
    }
    return TK_OK;
}

/* ---- plan advice ------------------------------------------------------------------ */

/* The config file with the chosen fix's change, as `txk advise --fix`
 * writes it: the file's own text, its changed lines replaced and new keys
 * added (tk_config_edit_yaml); what the file leaves unset stays unset.
 * `to` is the fixed config; --api is how advice is written, not a setting
 * of the run, so it is not written. New string, NULL with err set. */
static char *fixed_file(const char *path, const tk_config *to, size_t *out_len, tk_err *err) {
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    size_t len = 0;
    FILE *mem = f ? open_memstream(&text, &len) : NULL;
    char chunk[8192];
    size_t k;
    while (mem && (k = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, k, mem);
    if (f) fclose(f);
    if (mem) fclose(mem);
    tk_config from, want = *to;
    tk_config_defaults(&from);
    char *out = NULL;
    if (text && tk_config_parse_yaml(&from, text, len, path, err) == TK_OK) {
        want.api = from.api;
        out = tk_config_edit_yaml(text, len, path, &from, &want, out_len, err);
    }
    if (!out && !err->msg[0]) tk_err_set(err, TK_EIO, "%s: cannot read the config again", path);
    free(text);
    return out;
}

/* The candidate of the session's advice a that fits every card of platform
 * (tk_advice_auto_for): each card planned as the advice was, by the traced
 * model when it describes the session's config, else by the engine. fresh:
 * a request of its own (%txfix), whose trace budget starts now. */
static int auto_for(tk_session *s, const tk_advice *a, const char *platform, int fresh) {
    int nl = 0;
    const int *len = tk_session_lengths(s, &nl);
    tk_traced_model *tm = tk_session_traced(s, tk_session_config(s));
    if (tm && fresh) tk_traced_begin(tm);
    return tk_advice_auto_for_by(tm ? tk_traced_plan : NULL, tm, a, platform, (const int32_t *)len, nl);
}

/* txk advise --fix N|auto: the candidate (-1: auto found none), or -2 with
 * err set when N names none. */
static int fix_pick(const tk_advice *a, const char *fix, const char *platform, tk_session *s, tk_err *err) {
    if (!strcmp(fix, "auto")) return platform ? auto_for(s, a, platform, 0) : tk_advice_auto(a);
    char *end = NULL;
    long k = strtol(fix, &end, 10);
    if (*fix && !*end && k >= 1 && k <= a->n_cand) return (int)k - 1;
    tk_err_set(err, TK_EINVAL, "--fix %s: give auto or a candidate number 1..%d", fix, a->n_cand);
    return -2;
}

/* The fixed config written (-o) or handed back for txk to print. */
static void fix_write(const tk_advise_request *rq, const tk_advice *a, int pick, const tk_config *on,
                      const tk_config *given, tk_advise_reply *out) {
    size_t yn = 0;
    tk_err err = {0};
    tk_config fixed = a->cand[pick].config;
    tk_run_spec_unapply(&fixed, on, given);
    char *y = fixed_file(rq->cli_config, &fixed, &yn, &err);
    FILE *f = y && rq->out ? fopen(rq->out, "w") : NULL;
    int bad = f && fwrite(y, 1, yn, f) != yn;
    if (f && fclose(f) != 0) bad = 1;
    if (!y) {
        snprintf(out->said, sizeof out->said, "%s", err.msg);
        out->fix_failed = 1;
    } else if (!rq->out) {
        out->yaml = y;
        y = NULL;
    } else if (!f || bad) {
        snprintf(out->said, sizeof out->said, "%s: cannot write the fixed config", rq->out);
        out->fix_failed = 1;
    } else {
        snprintf(out->said, sizeof out->said, "wrote %s: %s with #%d (%s)%s", rq->out, rq->cli_config, pick + 1,
                 a->cand[pick].label, tk_config_plan_only(&a->cand[pick].config)
                     ? "; a plan only: txk does not start several GPUs on cuda (the advice's code gives the PyTorch "
                       "recipe)" : "");
    }
    free(y);
}

tk_status tk_app_advise(tk_session *s, const tk_advise_request *rq, tk_advise_reply *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    out->ename = "ConfigError";
    tk_config c = rq->config;
    tk_status st;
    if ((rq->gpu && (st = tk_config_set(&c, "gpu", rq->gpu, err)) != TK_OK) ||
        (st = tk_config_validate(&c, err)) != TK_OK)
        return st;
    if (rq->api != TK_API_AUTO) c.api = rq->api; /* --api is the config's key: the session's config keeps it */
    /* the OOM record counts only for the config that ran out (--api is how
     * the advice is written, not the run) */
    const tk_config *last = tk_session_config(s);
    const tk_run_report *lr = tk_session_last_run(s);
    tk_config ran = c;
    if (last) ran.api = last->api;
    int oom = lr && lr->end == TK_RUN_OOM && lr->have_oom && last && rq->from_session && !memcmp(last, &ran, sizeof ran);
    /* a config with a train_file is advised on the run's model and corpus */
    tk_run_data data;
    if ((st = tk_session_load_data(s, &c, &data, err)) != TK_OK) {
        out->ename = "DataError";
        return st;
    }
    tk_run_data_clear(&data);
    /* the run resolved once: the session's device, the card of the config,
     * else the smallest card of --for or of the platform %txplan --gpus
     * planned on (said, never silent); the session's config stays as given */
    tk_run_where where;
    tk_session_where(s, &where);
    if (rq->platform && strcasecmp(rq->platform, "all")) where.platform = rq->platform;
    tk_run_spec spec;
    tk_config on = c;
    if ((st = tk_run_spec_resolve(&c, &where, &spec, err)) != TK_OK || (st = tk_run_spec_apply(&spec, &on, err)) != TK_OK)
        return st;
    char card_note[256] = "";
    if (!c.gpu[0] && on.gpu[0]) snprintf(card_note, sizeof card_note, "Advised for %s.", spec.card_why);
    tk_advise_input in = {.config = &on, .margin_frac = rq->margin, .platform = spec.platform[0] ? spec.platform : NULL,
                          .api = rq->api, .oom = oom ? &lr->oom : NULL};
    /* the companion's traced model: the config and each candidate are its own step, traced */
    tk_traced_model *tm = tk_session_traced(s, &c);
    if (tm) {
        tk_traced_begin(tm);
        in.plan_fn = tk_traced_plan, in.plan_ctx = tm;
    }
    int nl = 0;
    in.lengths = (const int32_t *)tk_session_lengths(s, &nl);
    in.n_lengths = nl;
    tk_session_device_now(s, &on, &in.free_now, &in.held_by_session);
    in.held_in_process = tk_session_held_in_process(s);
    tk_advise_run lrun; /* the session's last run and the live torch state, when the session has them */
    tk_advise_torch live;
    tk_session_advise_facts(s, last && rq->from_session && !memcmp(last, &ran, sizeof ran), &in, &lrun, &live);
    int nt = 0;
    const tk_mem_sample *tl = tk_session_timeline(s, &nt);
    size_t *steps = nt > 0 ? tk_malloc((size_t)nt * sizeof *steps) : NULL;
    for (int i = 0; steps && i < nt; i++) steps[i] = tl[i].allocated;
    in.step_allocated = steps;
    in.n_steps = steps ? nt : 0;
    tk_advice *a = tk_malloc(sizeof *a);
    out->ename = a ? "AdviseError" : "MemoryError";
    st = a ? tk_advise(&in, a, err) : tk_err_nomem(err, "the advice");
    free(steps);
    if (st != TK_OK) {
        free(a);
        return st;
    }
    tk_session_set_config(s, &c);
    tk_session_set_plan(s, &a->base);
    tk_session_take_advice(s, a);
    tk_session_set_advice_config(s, &c);
    int pick = rq->fix ? fix_pick(a, rq->fix, rq->platform, s, err) : -1;
    if (pick == -2) {
        out->ename = "UsageError";
        return TK_EINVAL;
    }
    char note[2048], traced[1600] = ""; /* said first: the card it is for, and what planned it */
    if (tm) tk_traced_summary(tm, traced, sizeof traced);
    snprintf(note, sizeof note, "%s%s%s", card_note, card_note[0] && traced[0] ? "\n" : "", traced);
    if (!(out->bundle = advice_bundle(a, rq->top, note, &spec, rq->cli_config, traced))) {
        out->ename = "MemoryError";
        return tk_err_nomem(err, "the advice");
    }
    if (rq->fix && pick < 0) {
        out->no_fix = 1;
        snprintf(out->said, sizeof out->said, "--fix auto: no candidate fits with margin%s%s and keeps the effective "
                 "batch", rq->platform ? " on every card of " : "", rq->platform ? rq->platform : "");
    } else if (rq->fix) {
        fix_write(rq, a, pick, &on, &c, out);
    }
    return TK_OK;
}

/* ---- a pasted OOM message ----------------------------------------------------------- */

/* A whole file, or standard input for "-". New buffer, NULL on failure. */
static char *read_message(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0;
    FILE *mem = open_memstream(&buf, &n);
    char chunk[8192];
    size_t k;
    while (mem && (k = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, k, mem);
    if (f != stdin) fclose(f);
    if (!mem) return NULL;
    fclose(mem);
    *len = n;
    return buf;
}

tk_status tk_app_advise_error(tk_session *s, const tk_advise_request *rq, const char *text, size_t len,
                              json_t **bundle, const char **ename, tk_err *err) {
    *bundle = NULL;
    *ename = "UsageError";
    const tk_config *c = rq->have_config ? &rq->config : NULL;
    if (rq->data && !c) {
        tk_err_set(err, TK_EINVAL, "--data %s needs a config: its model's tokenizer counts the tokens", rq->data);
        return TK_EINVAL;
    }
    tk_config cc;
    if (c) cc = *c;
    /* --data: the corpus whose p99 length the max_length fix carries */
    tk_err derr = {0};
    if (rq->data && tk_config_set(&cc, "train_file", rq->data, &derr) != TK_OK) {
        tk_err_set(err, TK_EINVAL, "--data: %s", derr.msg);
        return TK_EINVAL;
    }
    *ename = "AdviseError";
    char *read = NULL;
    if (!text) {
        if (!(text = read = read_message(rq->from_error_path ? rq->from_error_path : "-", &len))) {
            tk_err_set(err, TK_EIO, "%s: cannot read the message", rq->from_error_path ? rq->from_error_path : "-");
            return TK_EIO;
        }
    }
    tk_oom_report_opts opts = {.platform = rq->platform, .api = rq->api,
                               .cli_config = rq->door == TK_DOOR_SHELL ? (rq->cli_config ? rq->cli_config : "CFG") : NULL};
    /* a shell reads the corpus' lengths untruncated (up to BERT's 512
     * positions), so the max_length fix sees the real p99 (plans still cap
     * at the config's max_len); a cell has the session's */
    tk_run_data data;
    memset(&data, 0, sizeof data);
    const int32_t *lengths = NULL;
    int nl = 0;
    tk_status st = TK_OK;
    if (rq->door == TK_DOOR_SHELL && c && cc.train_file[0]) {
        tk_config dc = cc;
        if (dc.max_len < 512) dc.max_len = 512;
        st = tk_run_data_load(&dc, &data, err);
        lengths = (const int32_t *)data.lengths, nl = data.n_lengths;
    } else if (rq->door != TK_DOOR_SHELL) {
        lengths = (const int32_t *)tk_session_lengths(s, &nl);
    }
    /* the companion's traced model: the message's config is its own step, traced */
    opts.traced = rq->door != TK_DOOR_SHELL && c ? tk_session_traced(s, &cc) : NULL;
    /* a cell's session: the companion's live torch state and the last run are facts of the message too */
    tk_advise_input known = {0};
    tk_advise_run lrun;
    tk_advise_torch live;
    if (rq->door != TK_DOOR_SHELL) {
        const tk_config *last = tk_session_config(s);
        tk_session_advise_facts(s, last && c && !memcmp(last, &cc, sizeof cc), &known, &lrun, &live);
        opts.torch_live = known.torch_live, opts.last_run = known.last_run;
    }
    if (st == TK_OK) st = tk_oom_message_report(text, len, c ? &cc : NULL, lengths, nl, &opts, bundle, err);
    tk_run_data_clear(&data);
    free(read);
    return st;
}

/* ---- %txfix ---------------------------------------------------------------------- */

/* "%txfix N|auto|FIX-NAME [--for PLATFORM] ..." from the option table. */
static void fix_usage(char *buf, size_t n) {
    char *u = tk_app_usage_flags(TK_VERB_FIX, TK_DOOR_CELL);
    snprintf(buf, n, "%%txfix N|auto|FIX-NAME %s", u ? u : "");
    free(u);
}

/* The candidate `what` names: 1-based index, "auto", or a fix label. -1
 * with err and *ename set if none. */
static int pick(const tk_advice *a, const char *what, const char **ename, tk_err *err) {
    if (!strcmp(what, "auto")) {
        int i = tk_advice_auto(a);
        if (i < 0) {
            *ename = "NoFixError";
            tk_err_set(err, TK_EINVAL, "no candidate fits with margin and keeps the effective batch of %d; pick one by "
                       "number from the %%txadvise table (those change the batch or do not fit)", a->base_effective_batch);
        }
        return i;
    }
    char *end = NULL;
    long k = strtol(what, &end, 10);
    *ename = "UsageError";
    if (*what && !*end) {
        if (k < 1 || k > a->n_cand) {
            tk_err_set(err, TK_EINVAL, "%%txfix %s: the last advice has candidates 1..%d", what, a->n_cand);
            return -1;
        }
        return (int)k - 1;
    }
    for (int i = 0; i < a->n_cand; i++)
        if (!strcmp(a->cand[i].label, what)) return i;
    for (int i = 0; i < a->n_cand; i++) /* a fix name: the best candidate with that fix alone */
        if (a->cand[i].n_fixes == 1 && !strcmp(tk_fix_name(a->cand[i].fixes[0].kind), what)) return i;
    char u[256];
    fix_usage(u, sizeof u);
    tk_err_set(err, TK_EINVAL, "%%txfix: no candidate named '%s' in the last advice (give its number, auto, or a label "
               "from the table)\nusage: %s", what, u);
    return -1;
}

/* %txfix's words: the candidate they name, or -1 with err and *ename set. */
static int fix_words(tk_session *s, const tk_app_args *w, const char **ename, tk_err *err) {
    const char *what = w->n_plain ? w->plain[0] : w->n_kv ? w->kv[0] : NULL, *platform = tk_app_arg(w, "--for");
    char why[200], u[256];
    const char *bad = tk_app_has(w, "--for") ? tk_platform_check(platform, 1, why, sizeof why) : NULL;
    *ename = "UsageError";
    fix_usage(u, sizeof u);
    if (bad) tk_err_set(err, TK_EINVAL, "%s", bad);
    else if (w->n_plain + w->n_kv > 1)
        tk_err_set(err, TK_EINVAL, "%%txfix takes one fix, got '%s' and '%s'\nusage: %s", w->n_plain ? w->plain[0] : w->kv[0],
                   w->n_plain > 1 ? w->plain[1] : w->kv[w->n_kv - 1], u);
    else if (!what) tk_err_set(err, TK_EINVAL, "%%txfix: which fix?\nusage: %s", u);
    else if (!tk_session_advice(s)) tk_err_set(err, TK_EINVAL, "%%txfix: no advice yet: run %%txadvise first");
    else if (platform && strcmp(what, "auto"))
        tk_err_set(err, TK_EINVAL, "--for goes with auto: %%txfix auto --for %s", platform);
    else if (!platform) return pick(tk_session_advice(s), what, ename, err);
    else {
        const tk_advice *a = tk_session_advice(s);
        int i = auto_for(s, a, platform, 1);
        if (i >= 0) return i;
        *ename = "NoFixError";
        tk_err_set(err, TK_EINVAL, "no candidate of the last advice fits with a 5%% margin on every card %s hands out "
                   "and keeps the effective batch of %d", platform, a->base_effective_batch);
    }
    return -1;
}

/* A release (action_only): what the session holds is freed; what PyTorch in
 * this process caches is the user's Python to free, so it is said, not
 * done (and out->run is cleared: a run would meet the same memory). */
static void apply_release(tk_session *s, const tk_candidate *cand, int i, tk_fix_reply *out, tk_sb *said) {
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
        tk_session_set_config(s, &out->after);
        tk_sb_addf(said, "Fix #%d (%s): released the session's device (%s allocated, %s reserved).\n", i + 1, label,
                   tk_format_bytes(st.allocated, b1, sizeof b1), tk_format_bytes(st.reserved, b2, sizeof b2));
    }
    if (release & TK_RELEASE_IN_PROCESS) {
        const tk_holder *h = tk_session_holder(s);
        tk_sb_addf(said,
                   "Fix #%d (%s): PyTorch's caching allocator in this process holds %s reserved (%s "
                   "allocated), which only your Python can free. Run in a cell:\n"
                   "    del model, optimizer, outputs   # whatever still refers to tensors on the GPU\n"
                   "    import gc; gc.collect()\n"
                   "    import torch; torch.cuda.empty_cache()\n"
                   "then %%txtrain (%%txmem shows what PyTorch still holds).\n",
                   i + 1, label, tk_format_bytes(h->reserved, b1, sizeof b1),
                   tk_format_bytes(h->allocated, b2, sizeof b2));
        if (out->run) {
            tk_sb_add(said, "Not training now (--run): the run would meet the same memory until your Python frees it.\n");
            out->run = 0;
        }
    }
}

/* A config change: the diff, the new plan's figures, the session's config
 * set to it. The bundle (new reference). */
static json_t *apply_config_fix(tk_session *s, const tk_advice *a, const tk_candidate *cand, int i,
                                const tk_config *before, const tk_config *after, int run, const char *what) {
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
    return b;
}

tk_status tk_app_fix(tk_session *s, const tk_app_args *w, tk_fix_reply *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    int i = fix_words(s, w, &out->ename, err);
    if (i < 0) return TK_EINVAL;
    const char *what = w->n_plain ? w->plain[0] : w->kv[0];
    const tk_advice *a = tk_session_advice(s);
    const tk_candidate *cand = &a->cand[i];
    const tk_config *old = tk_session_config(s);
    tk_config before = old ? *old : cand->config;
    out->after = cand->config;
    out->run = tk_app_has(w, "--run");
    /* the advice planned the config as the run resolved it (the card of a
     * platform, the device's attention): what no fix changed goes back to
     * the session's config as the user gave it */
    const tk_config *asked = tk_session_advice_config(s);
    if (asked) tk_run_spec_unapply(&out->after, &a->given, asked);
    out->predicted = cand->peak;
    tk_sb said = {0};
    if (out->run && tk_config_plan_only(&out->after)) {
        tk_sb_addf(&said, "Not training (--run): txkernel does not start %d GPUs on cuda; the fix below is a plan, "
                   "with the PyTorch recipe for it.\n", tk_config_world_size(&out->after));
        out->run = 0;
    }
    if (cand->action_only)
        apply_release(s, cand, i, out, &said); /* may free the advice: cand is gone after this */
    else
        out->bundle = apply_config_fix(s, a, cand, i, &before, &out->after, out->run, what);
    char *t = tk_sb_take(&said);
    snprintf(out->said, sizeof out->said, "%s", t ? t : "");
    free(t);
    return TK_OK;
}

/* "equal, byte for byte", "below the plan by X", "ABOVE the plan by X". */
static void compare(size_t measured, size_t planned, char *buf, size_t n) {
    char b[32];
    if (measured == planned) snprintf(buf, n, "equal, byte for byte");
    else if (measured < planned) snprintf(buf, n, "below the plan by %s", tk_format_bytes(planned - measured, b, sizeof b));
    else snprintf(buf, n, "ABOVE the plan by %s", tk_format_bytes(measured - planned, b, sizeof b));
}

char *tk_app_fix_measured(const tk_session *s, size_t predicted) {
    const tk_run_report *r = tk_session_last_run(s);
    if (!r) return NULL;
    char b1[32], b2[32], b3[32], b4[32];
    tk_sb t = {0};
    /* reserved is the figure the advice ranks by; allocated is shown too.
     * With dynamic padding or buckets the plan assumes a full batch at the
     * corpus' longest length: a run whose longest batch is partial stays
     * below it. */
    char v1[96], v2[96];
    compare(r->peak_reserved, r->plan.peak_reserved, v1, sizeof v1);
    compare(r->peak_allocated, r->plan.peak_allocated, v2, sizeof v2);
    tk_sb_addf(&t, "Measured peak %s reserved (planned %s: %s), %s allocated (planned %s: %s).%s\n",
               tk_format_bytes(r->peak_reserved, b1, sizeof b1), tk_format_bytes(r->plan.peak_reserved, b2, sizeof b2),
               v1, tk_format_bytes(r->peak_allocated, b3, sizeof b3),
               tk_format_bytes(r->plan.peak_allocated, b4, sizeof b4), v2,
               r->plan.peak_reserved == predicted ? "" : " (the advice's plan differed: new corpus lengths)");
    if (r->peak_reserved > r->plan.peak_reserved)
        tk_sb_add(&t, "Why above: the plan steps the worst-case batch, while the run's batches differ in shape "
                  "(dynamic padding, the last partial batch, the dev batches), and each shape leaves the cache split "
                  "differently. %%txplan --epoch plans the run's own batches in the run's order, reserved included.\n");
    if (r->have_device_peak) {
        /* on cuda: everything the process had on the device, against the
         * plan plus the plugin's own buffers (cuBLAS workspace, scratch) */
        size_t want = r->plan.peak_reserved + r->plugin_bytes;
        double off = want ? 100.0 * ((double)r->device_peak - (double)want) / (double)want : 0.0;
        tk_sb_addf(&t, "Device peak (CUPTI, every allocation in the process) %s; plan + plugin buffers %s: %+.2f%%.\n",
                   tk_format_bytes(r->device_peak, b1, sizeof b1), tk_format_bytes(want, b2, sizeof b2), off);
    }
    return tk_sb_take(&t);
}
