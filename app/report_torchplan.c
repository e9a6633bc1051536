/* report_torchplan.c — an `engine: pytorch` plan (torchplan/) as text, HTML
 * and JSON, for `txk plan` and `%txplan`: it names the engine and the torch
 * and transformers versions it follows, so a number is never read as
 * txkernel's own. Against a card's profile, fits is the card's one usable
 * capacity (tk_gpu_profile_budget, the figure advice uses too), said beside
 * the total it comes from. The --gpus table's frame (tk_gpus_table) is
 * here, with engine: pytorch's card planner; the traced plan's is in
 * report_torchtrace.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_host_mem.h"
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
json_t *tk_plan_json_against(json_t *j, size_t usable, int fits) {
    if (j && usable && (json_object_set_new(j, "usable", json_integer((json_int_t)usable)) ||
                        json_object_set_new(j, "fits", json_boolean(fits)))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static json_t *plan_json(const tk_torchplan_result *r) {
    int fits;
    size_t b = usable(r, &fits);
    return tk_plan_json_against(tk_torchplan_json(r), b, fits);
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

tk_status tk_gpus_table(const char *platform, tk_gpus_plan_fn plan, tk_gpus_head_fn head, void *ctx, json_t *meta,
                        json_t **out, tk_err *err) {
    *out = NULL;
    const tk_gpu_profile *cards[16];
    int n = tk_gpu_platform_cards(platform, cards, 16);
    if (n < 0) {
        json_decref(meta);
        tk_err_set(err, TK_EINVAL, "--gpus %s: expected %s", platform, tk_gpu_platform_names());
        return TK_EINVAL;
    }
    static const char *const h[] = {"card", ">capacity", ">usable", ">device used", ">peak allocated", ">peak reserved",
                                    "attention", "fits"};
    tk_rtable *t = tk_rtable_new("", 8, h);
    json_t *rows = json_array();
    tk_status st = t && rows && meta ? TK_OK : tk_err_nomem(err, "--gpus report");
    tk_sb notes = {0};
    for (int i = 0; i < n && st == TK_OK; i++) {
        tk_gpus_row row = {0};
        if ((st = plan(ctx, cards[i], &row, err)) != TK_OK) break;
        if (row.note[0]) tk_sb_addf(&notes, "%s\n", row.note);
        if (!row.plan) continue;
        const tk_torchplan_result *r = row.plan;
        char a[32], b[32], d[32], e[32], u[32];
        tk_rtable_rowf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", row.label[0] ? row.label : cards[i]->name,
                       tk_format_bytes(r->capacity, a, sizeof a), row.usable ? tk_format_bytes(row.usable, u, sizeof u) : "-",
                       tk_format_bytes(r->device_used, b, sizeof b), tk_format_bytes(r->peak_allocated, d, sizeof d),
                       tk_format_bytes(r->peak_reserved, e, sizeof e), r->attention, row.fits ? "yes" : "NO");
        if (!row.json || json_array_append_new(rows, row.json)) st = tk_err_nomem(err, "--gpus report");
    }
    char *text = NULL, *html = NULL;
    if (st == TK_OK) {
        tk_sb sb = {0};
        char *tt = tk_rtable_text(t), *nt = tk_sb_take(&notes);
        head(ctx, platform, &sb);
        tk_sb_addf(&sb, "%s%s", tt ? tt : "", nt ? nt : "");
        free(tt);
        free(nt);
        text = tk_sb_take(&sb);
        html = tk_rtable_html(t);
        if (text && html && !json_object_set(meta, "cards", rows))
            *out = json_pack("{s:s, s:s, s:O}", "text/plain", text, "text/html", html, "application/json", meta);
        if (!*out) st = tk_err_nomem(err, "--gpus report");
    }
    free(text);
    free(html);
    free(tk_sb_take(&notes));
    json_decref(rows);
    json_decref(meta);
    tk_rtable_destroy(&t);
    return st;
}

/* engine: pytorch's card planner for tk_gpus_table: the config on each
 * card; a pair the planner does not split is left out with its reason. */
typedef struct {
    const tk_config *c;
    tk_torchplan_result r;
    const char *tv, *xv;      /* the versions the plans follow */
} torchplan_cards;

static tk_status torchplan_card(void *ctx, const tk_gpu_profile *card, tk_gpus_row *row, tk_err *err) {
    torchplan_cards *x = ctx;
    tk_config one = *x->c;
    tk_status st = tk_config_set(&one, "gpu", card->name, err);
    if (st != TK_OK) return st;
    one.capacity = 0;
    tk_err pe = {0};
    st = tk_torchplan(&one, &x->r, &pe);
    /* a pair (t4x2) the planner refuses: it plans the split of a step over
     * GPUs (parallel:) only where it models it */
    if (st == TK_EINVAL && card->gpus > 1) {
        snprintf(row->note, sizeof row->note, "%s is not planned: %s", card->name, pe.msg);
        return TK_OK;
    }
    if (st != TK_OK) {
        if (err) *err = pe;
        return st;
    }
    const tk_torchplan_result *r = &x->r;
    x->tv = r->torch_version, x->xv = r->transformers_version;
    if (r->parallel) {
        int full = 0;
        for (int k = 1; k < r->n_gpu_rows; k++)
            if (r->gpu_rows[k].peak_reserved > r->gpu_rows[full].peak_reserved) full = k;
        snprintf(row->label, sizeof row->label, "%s (%s)", card->name, r->parallel);
        snprintf(row->note, sizeof row->note, "%s: %d GPUs, %s, batch %d per GPU; the row is the fullest GPU's (%s); %s.",
                 card->name, r->world_size, r->parallel, r->batch, r->gpu_rows[full].who, r->checked);
    }
    row->plan = r;
    row->usable = usable(r, &row->fits);
    row->json = plan_json(r);
    return TK_OK;
}

static void torchplan_head(void *ctx, const char *platform, tk_sb *sb) {
    const torchplan_cards *x = ctx;
    tk_sb_addf(sb, "engine: pytorch — the step as torch %s + transformers %s run it, on each %s card "
                   "(device used = peak reserved + PyTorch's CUDA context; fits: peak reserved within the card's "
                   "usable capacity, its total less the context and library buffers, as advice counts it):\n",
               x->tv, x->xv, platform);
}

tk_status tk_torchplan_gpus_report(const tk_config *c, const char *platform, json_t **out, tk_err *err) {
    torchplan_cards *x = tk_calloc(1, sizeof *x);
    if (!x) return tk_err_nomem(err, "--gpus report");
    x->c = c, x->tv = "", x->xv = "";
    tk_status st = tk_gpus_table(platform, torchplan_card, torchplan_head, x,
                                 json_pack("{s:s, s:s}", "engine", "pytorch", "platform", platform), out, err);
    free(x);
    return st;
}
