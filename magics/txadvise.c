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

#include "tk_advisor.h"
#include "tk_magics.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_txmagics.h"

#define TXADVISE_USAGE "%txadvise [key=value ...] [--top N] [--margin F] [--json]"
#define TXFIX_USAGE "%txfix N|auto|FIX-NAME [--run] [--json]"

/* What the device free now and what this session holds on it, when the
 * session has a device for the same capacity as config c. */
static void device_now(tk_session *s, const tk_config *c, size_t *free_now, size_t *held) {
    *free_now = 0;
    *held = 0;
    tk_dev *d = tk_session_current_device(s);
    if (!d) return;
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    size_t cap = tk_session_capacity_of(c);
    int cuda = tk_dev_kind_of(d) == TK_DEV_CUDA;
    if (!cuda && cap && info.total != cap) return; /* another simulated device: it would be replaced */
    tk_alloc_stats st;
    tk_alloc_stats_get(tk_dev_alloc(d), &st);
    *held = st.allocated;
    if (cuda || cap) *free_now = info.free_bytes + (st.reserved - st.allocated);
}

static json_t *advice_bundle(const tk_advice *a, int top) {
    char *txt = tk_advice_format(a, top);
    json_t *b = tk_bundle_new(txt ? txt : "");
    free(txt);
    char b1[32], b2[32], b3[32];
    tk_sb h = {0};
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
    tk_bundle_take_json(b, "application/json", j);
    return b;
}

static int run_txadvise(tk_magic_ctx *m) {
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
    if (tk_txargs_split(m->args, &argv, &argc)) return tk_magic_error(m, "UsageError", "unbalanced quotes");
    for (int i = 0; i < argc && !rc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--json")) json_only = 1;
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

    tk_advise_input in = {.config = &c, .margin_frac = margin};
    const tk_run_report *lr = tk_session_last_run(s);
    /* the OOM record counts only for the config that ran out */
    if (lr && lr->end == TK_RUN_OOM && lr->have_oom && last && !m->is_cell && !memcmp(last, &c, sizeof c))
        in.oom = &lr->oom;
    int nl = 0;
    const int *len = tk_session_lengths(s, &nl);
    in.lengths = (const int32_t *)len;
    in.n_lengths = nl;
    device_now(s, &c, &in.free_now, &in.held_by_session);
    int nt = 0;
    const tk_mem_sample *tl = tk_session_timeline(s, &nt);
    size_t *steps = nt > 0 ? malloc((size_t)nt * sizeof *steps) : NULL;
    for (int i = 0; steps && i < nt; i++) steps[i] = tl[i].allocated;
    in.step_allocated = steps;
    in.n_steps = steps ? nt : 0;

    tk_advice *a = malloc(sizeof *a);
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
    json_t *b = advice_bundle(a, top);
    tk_session_take_advice(s, a);
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

static int run_txfix(tk_magic_ctx *m) {
    tk_session *s = m->session;
    char **argv = NULL;
    int argc = 0, run = 0, json_only = 0, rc = 0;
    const char *what = NULL;
    if (tk_txargs_split(m->args, &argv, &argc)) return tk_magic_error(m, "UsageError", "unbalanced quotes");
    for (int i = 0; i < argc && !rc; i++) {
        if (!strcmp(argv[i], "--run")) run = 1;
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
    int i = rc ? -1 : pick(m, a, what);
    char what_buf[64];
    snprintf(what_buf, sizeof what_buf, "%s", what ? what : "");
    what = what_buf;
    tk_txargs_free(argv, argc);
    if (rc || i < 0) return -1;

    const tk_candidate *cand = &a->cand[i];
    const tk_config *old = tk_session_config(s);
    tk_config before = old ? *old : cand->config, after = cand->config;
    size_t predicted = cand->peak;
    char b1[32], b2[32], b3[32], b4[32];
    if (cand->action_only) {
        /* release what the session holds; the config stays */
        tk_dev *d = tk_session_current_device(s);
        tk_alloc_stats st = {0};
        if (d) tk_alloc_stats_get(tk_dev_alloc(d), &st);
        char label[sizeof cand->label];
        snprintf(label, sizeof label, "%s", cand->label);
        tk_session_reset(s); /* frees the advice too: cand is gone after this */
        cand = NULL;
        tk_session_set_config(s, &after);
        tk_magic_printf(m, "stdout", "Fix #%d (%s): released the session's device (%s allocated, %s reserved).\n",
                        i + 1, label, tk_format_bytes(st.allocated, b1, sizeof b1),
                        tk_format_bytes(st.reserved, b2, sizeof b2));
    } else {
        char *diff = tk_config_diff(&before, &after);
        tk_session_set_config(s, &after);
        json_t *b = json_object();
        char *yaml = tk_config_to_yaml(&after);
        tk_sb t = {0};
        tk_sb_addf(&t, "Fix #%d: %s\n  %s\nChanged:\n%s", i + 1, cand->label, cand->reason,
                   diff && *diff ? diff : "  (nothing)\n");
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
            json_array_append_new(fx, json_pack("{s:s, s:i, s:i}", "kind", tk_fix_name(cand->fixes[k].kind), "value",
                                                cand->fixes[k].value, "variant", cand->fixes[k].variant));
        json_object_set_new(b, "application/json",
                            json_pack("{s:i, s:s, s:s, s:o, s:I, s:I, s:b, s:s, s:s}", "index", i + 1, "label",
                                      cand->label, "reason", cand->reason, "fixes", fx, "planned_peak",
                                      (json_int_t)cand->peak, "margin", (json_int_t)cand->margin, "fits_margin",
                                      cand->fits_margin, "diff", diff ? diff : "", "yaml", yaml ? yaml : ""));
        free(tt);
        free(yaml);
        free(diff);
        tk_txemit(m, b, json_only);
        json_decref(b);
    }
    if (!run) return 0;

    /* train the fixed config and hold the plan to account */
    if (tk_txtrain_run_config(m, &after, 0)) return -1;
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
     "Pick one with %txfix."},
    {"txfix", TK_MAGIC_LINE, run_txfix, "apply a fix from %txadvise to the session's config (--run trains it)",
     TXFIX_USAGE "\n\n"
     "N: the candidate numbered N in the last %txadvise table. auto: the best candidate\n"
     "that fits with margin and keeps the effective batch (batch_size x accumulate).\n"
     "A label from the table (\"fp16 + accumulate 4\") or a fix name (max_len, head, ...)\n"
     "picks that row. Shows what changed and the new plan; the fixed config becomes the\n"
     "session's: %txtrain (the line form) trains it, %txplan plans it with overrides.\n"
     "--run trains it now and compares the measured peak with the planned one."},
};

int tk_magics_register_txadvise(tk_magics *m) { return tk_magics_add_table(m, TXADVISE, 2); }
