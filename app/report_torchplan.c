/* report_torchplan.c — an `engine: pytorch` plan (torchplan/) as text, HTML
 * and JSON, for `txk plan` and `%txplan`: it names the engine and the torch
 * and transformers versions it follows, so a number is never read as
 * txkernel's own. Against a card's profile, fits is the card's one usable
 * capacity (tk_gpu_profile_budget, the figure advice uses too), said beside
 * the total it comes from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_render.h"
#include "tk_session.h"
#include "tk_torchplan.h"

/* The card's one usable capacity for a plan against its profile (0 when
 * the plan has none: a capacity: given, or no card), and whether the plan
 * fits in it. */
static size_t usable(const tk_torchplan_result *r, int *fits) {
    const tk_gpu_profile *card = r->gpu[0] ? tk_gpu_profile_find(r->gpu) : NULL;
    size_t b = card && r->capacity == card->capacity ? tk_gpu_profile_budget(card) : 0;
    *fits = b ? r->peak_reserved <= b : r->fits;
    return b;
}

/* The plan's JSON with the usable capacity and the verdict against it. */
static json_t *plan_json(const tk_torchplan_result *r) {
    json_t *j = tk_torchplan_json(r);
    int fits;
    size_t b = usable(r, &fits);
    if (j && b && (json_object_set_new(j, "usable", json_integer((json_int_t)b)) ||
                   json_object_set_new(j, "fits", json_boolean(fits)))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

json_t *tk_report_torchplan(const tk_torchplan_result *r) {
    char a[32], b[32], c[32], d[32];
    tk_sb text = {0}, html = {0};
    tk_sb_addf(&text, "Plan (engine: pytorch — a transformers BERT training step as torch %s + transformers %s run it, "
                      "on %s%s%s): batch %d x seq %d%s\n",
               r->torch_version, r->transformers_version, r->device,
               r->gpu[0] ? " " : "", r->gpu, r->batch, r->seq, r->accumulate > 1 ? " (accumulated)" : "");
    if (r->accumulate > 1) tk_sb_addf(&text, "accumulate: %d micro-batches per optimizer step\n", r->accumulate);
    if (strncmp(r->seq_from, "max_len (fixed", 14)) tk_sb_addf(&text, "seq %d: %s\n", r->seq, r->seq_from);
    if (r->parallel) {
        const char *unit = r->on_cuda ? "GPU" : "rank";
        tk_sb_addf(&text, "%d %ss%s, %s, batch %d per %s (%s):\n", r->world_size, unit, r->on_cuda ? "" : " on the cpu",
                   r->parallel, r->batch, unit, r->checked);
        for (int i = 0; i < r->n_gpu_rows; i++) {
            const tk_torchplan_gpu *g = &r->gpu_rows[i];
            tk_sb_addf(&text, "  %s: peak allocated %s, first step %s, peak reserved %s", g->who,
                       tk_format_bytes(g->peak_allocated, a, sizeof a), tk_format_bytes(g->first_step_peak_allocated, b, sizeof b),
                       tk_format_bytes(g->peak_reserved, c, sizeof c));
            if (r->on_cuda) tk_sb_addf(&text, ", device used %s", tk_format_bytes(g->device_used, d, sizeof d));
            if (r->capacity) tk_sb_addf(&text, ": %s", g->fits ? "fits" : "DOES NOT FIT");
            tk_sb_add(&text, "\n");
        }
        tk_sb_addf(&text, "the figures below are the fullest %s's\n", unit);
    }
    tk_sb_addf(&text, "attention: %s; optimizer: %s; precision: %s\n", r->attention, r->optimizer, r->precision);
    tk_sb_addf(&text, "peak allocated %s (steady step: torch.cuda.max_memory_allocated() after a reset before it); "
                      "first step %s\n", tk_format_bytes(r->peak_allocated, a, sizeof a),
               tk_format_bytes(r->first_step_peak_allocated, b, sizeof b));
    tk_sb_addf(&text, "peak reserved %s\n", tk_format_bytes(r->peak_reserved, a, sizeof a));
    if (r->on_cuda) {
        if (r->n_workspaces || r->lt_workspace_bytes)
            tk_sb_addf(&text, "cuBLAS workspaces: %d x %s kept in the caching allocator (the forward's thread and "
                              "autograd's)%s%s%s\n", r->n_workspaces, tk_format_bytes(r->workspace_bytes, b, sizeof b),
                       r->lt_workspace_bytes ? ", cuBLASLt " : "",
                       r->lt_workspace_bytes ? tk_format_bytes(r->lt_workspace_bytes, c, sizeof c) : "",
                       r->lt_workspace_bytes ? " kept beside them" : "");
        else if (r->outside_bytes)
            tk_sb_addf(&text, "cuBLAS workspaces: cuBLAS's own pools, %s outside the caching allocator\n",
                       tk_format_bytes(r->outside_bytes, b, sizeof b));
        else
            tk_sb_addf(&text, "cuBLAS workspaces: one %s for each GEMM while it runs, from the caching allocator\n",
                       tk_format_bytes(r->workspace_bytes, b, sizeof b));
        tk_sb_addf(&text, "  where this torch keeps them: %s\n", r->workspaces ? r->workspaces : "");
        tk_sb_addf(&text, "device used %s (reserved + %s CUDA context%s%s%s)\n", tk_format_bytes(r->device_used, a, sizeof a),
                   tk_format_bytes(r->context_bytes, b, sizeof b), r->gpu[0] ? "" : ": unknown without a gpu: card",
                   r->outside_bytes ? " + cuBLAS's own pools " : "",
                   r->outside_bytes ? tk_format_bytes(r->outside_bytes, c, sizeof c) : "");
    }
    int fits;
    size_t budget = usable(r, &fits);
    if (budget)
        tk_sb_addf(&text, "%s: %s reserved of %s usable (the %s's %s total less %s for the CUDA context and library "
                          "buffers, the profile's default: the capacity advice uses too)\n",
                   fits ? "FITS" : "DOES NOT FIT", tk_format_bytes(r->peak_reserved, a, sizeof a),
                   tk_format_bytes(budget, b, sizeof b), r->gpu, tk_format_bytes(r->capacity, c, sizeof c),
                   tk_format_bytes(r->capacity - budget, d, sizeof d));
    else if (r->capacity)
        tk_sb_addf(&text, "%s: %s reserved of %s\n", r->fits ? "FITS" : "DOES NOT FIT",
                   tk_format_bytes(r->peak_reserved, a, sizeof a), tk_format_bytes(r->capacity, b, sizeof b));
    tk_sb_addf(&text, "Model states: params %s, grads %s, optimizer %s (%lld parameters, %lld trainable)\n",
               tk_format_bytes(r->param_bytes, a, sizeof a), tk_format_bytes(r->grad_bytes, b, sizeof b),
               tk_format_bytes(r->optim_bytes, c, sizeof c), (long long)r->n_params, (long long)r->n_trainable);
    tk_sb_addf(&html, "<div class=\"txk-plan\"><p><b>engine: pytorch</b> (torch %s + transformers %s, %s) — batch %d "
                      "× seq %d: peak allocated <b>%s</b>, first step %s, reserved %s",
               r->torch_version, r->transformers_version, r->device, r->batch, r->seq,
               tk_format_bytes(r->peak_allocated, a, sizeof a), tk_format_bytes(r->first_step_peak_allocated, b, sizeof b),
               tk_format_bytes(r->peak_reserved, c, sizeof c));
    if (r->on_cuda) tk_sb_addf(&html, ", device used %s", tk_format_bytes(r->device_used, d, sizeof d));
    tk_sb_add(&html, "</p><p>attention: ");
    tk_sb_add_html(&html, r->attention);
    tk_sb_add(&html, "; optimizer: ");
    tk_sb_add_html(&html, r->optimizer);
    tk_sb_add(&html, "; precision: ");
    tk_sb_add_html(&html, r->precision);
    tk_sb_add(&html, "</p>");
    if (r->parallel) {
        tk_sb_addf(&html, "<p>%d GPUs, %s (", r->world_size, r->parallel);
        tk_sb_add_html(&html, r->checked);
        tk_sb_add(&html, "):");
        for (int i = 0; i < r->n_gpu_rows; i++) {
            tk_sb_add(&html, i ? "; " : " ");
            tk_sb_add_html(&html, r->gpu_rows[i].who);
            tk_sb_addf(&html, " peak allocated %s, reserved %s", tk_format_bytes(r->gpu_rows[i].peak_allocated, a, sizeof a),
                       tk_format_bytes(r->gpu_rows[i].peak_reserved, b, sizeof b));
        }
        tk_sb_add(&html, "</p>");
    }
    tk_sb_add(&html, "</div>");
    json_t *j = plan_json(r);
    char *t = tk_sb_take(&text), *h = tk_sb_take(&html);
    json_t *bundle = j && t && h ? json_pack("{s:s, s:s, s:o}", "text/plain", t, "text/html", h, "application/json", j) : NULL;
    if (!bundle) json_decref(j);
    free(t);
    free(h);
    return bundle;
}

tk_status tk_torchplan_gpus_report(const tk_config *c, const char *platform, json_t **out, tk_err *err) {
    *out = NULL;
    const tk_gpu_profile *cards[16];
    int n = tk_gpu_platform_cards(platform, cards, 16);
    if (n < 0) {
        tk_err_set(err, TK_EINVAL, "--gpus %s: expected %s", platform, tk_gpu_platform_names());
        return TK_EINVAL;
    }
    static const char *const h[] = {"card", ">capacity", ">usable", ">device used", ">peak allocated", ">peak reserved",
                                    "attention", "fits"};
    tk_rtable *t = tk_rtable_new("", 8, h);
    json_t *rows = json_array();
    const char *tv = "", *xv = "";
    tk_status st = t && rows ? TK_OK : tk_err_nomem(err, "--gpus report");
    tk_sb notes = {0}; /* the pairs: how they are spread and how that is known */
    char skipped[64] = "", skipped_why[sizeof ((tk_err *)0)->msg] = "";
    for (int i = 0; i < n && st == TK_OK; i++) {
        tk_config one = *c;
        tk_torchplan_result r;
        if ((st = tk_config_set(&one, "gpu", cards[i]->name, err)) != TK_OK) break;
        one.capacity = 0;
        tk_err pe = {0};
        st = tk_torchplan(&one, &r, &pe);
        /* a pair (t4x2) the planner refuses: it plans the split of a step
         * over GPUs (parallel:) only where it models it */
        if (st == TK_EINVAL && cards[i]->gpus > 1) {
            snprintf(skipped, sizeof skipped, "%s", cards[i]->name);
            snprintf(skipped_why, sizeof skipped_why, "%s", pe.msg);
            st = TK_OK;
            continue;
        }
        if (st != TK_OK) {
            if (err) *err = pe;
            break;
        }
        tv = r.torch_version, xv = r.transformers_version;
        char a[32], b[32], d[32], e[32], u[32], name[64];
        snprintf(name, sizeof name, "%s%s%s%s", cards[i]->name, r.parallel ? " (" : "", r.parallel ? r.parallel : "",
                 r.parallel ? ")" : "");
        int full = 0;
        for (int k = 1; k < r.n_gpu_rows; k++)
            if (r.gpu_rows[k].peak_reserved > r.gpu_rows[full].peak_reserved) full = k;
        if (r.parallel)
            tk_sb_addf(&notes, "%s: %d GPUs, %s, batch %d per GPU; the row is the fullest GPU's (%s); %s.\n",
                       cards[i]->name, r.world_size, r.parallel, r.batch, r.gpu_rows[full].who, r.checked);
        int fits;
        size_t budget = usable(&r, &fits);
        tk_rtable_rowf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", name, tk_format_bytes(r.capacity, a, sizeof a),
                       budget ? tk_format_bytes(budget, u, sizeof u) : "-", tk_format_bytes(r.device_used, b, sizeof b),
                       tk_format_bytes(r.peak_allocated, d, sizeof d), tk_format_bytes(r.peak_reserved, e, sizeof e),
                       r.attention, fits ? "yes" : "NO");
        json_t *row = plan_json(&r);
        if (!row || json_array_append_new(rows, row)) st = tk_err_nomem(err, "--gpus report");
    }
    char *text = NULL, *html = NULL;
    if (st == TK_OK) {
        tk_sb sb = {0};
        char *tt = tk_rtable_text(t);
        tk_sb_addf(&sb, "engine: pytorch — the step as torch %s + transformers %s run it, on each %s card "
                        "(device used = peak reserved + PyTorch's CUDA context; fits: peak reserved within the card's "
                        "usable capacity, its total less the context and library buffers, as advice counts it):\n%s",
                   tv, xv, platform, tt ? tt : "");
        char *nt = tk_sb_take(&notes);
        if (nt) tk_sb_add(&sb, nt);
        free(nt);
        if (skipped[0])
            tk_sb_addf(&sb, "%s is not planned: %s\n", skipped, skipped_why);
        free(tt);
        text = tk_sb_take(&sb);
        html = tk_rtable_html(t);
        *out = text && html ? json_pack("{s:s, s:s, s:{s:s, s:s, s:O}}", "text/plain", text, "text/html", html,
                                        "application/json", "engine", "pytorch", "platform", platform, "cards", rows)
                            : NULL;
        if (!*out) st = tk_err_nomem(err, "--gpus report");
    }
    free(text);
    free(html);
    free(tk_sb_take(&notes));
    json_decref(rows);
    tk_rtable_destroy(&t);
    return st;
}
