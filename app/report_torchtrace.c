/* report_torchtrace.c — a traced plan (torchplan/tk_torchtrace.h) as text,
 * HTML and JSON, and the companion's entry to it (tk_embed_trace.h).
 *
 * It reads like engine: pytorch's report (report_torchplan.c) and says what
 * differs: the step is the user's own module as traced, with the loss and
 * optimizer it ran, and it adds where the peak is: by category, by module,
 * the largest storages. Against a card's profile fits is the card's usable
 * capacity (tk_gpu_profile_budget), the figure advice uses too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_embed_trace.h"
#include "tk_host_mem.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_torchtrace.h"

static size_t usable(const tk_torchplan_result *p, int *fits) {
    const tk_gpu_profile *card = p->gpu[0] ? tk_gpu_profile_find(p->gpu) : NULL;
    size_t b = card ? tk_gpu_profile_budget(card) : 0;
    *fits = b ? p->peak_reserved <= b : p->fits;
    return b;
}

static json_t *plan_json(const tk_torchtrace_result *r) {
    int fits;
    size_t b = usable(&r->plan, &fits);
    return tk_plan_json_against(tk_torchtrace_json(r), b, fits);
}

json_t *tk_report_torchtrace(const tk_torchtrace_result *r) {
    const tk_torchplan_result *p = &r->plan;
    char a[32], b[32], c[32], d[32];
    tk_sb text = {0}, html = {0};
    tk_sb_addf(&text, "Plan (%s, traced — %s's own training step, on %s%s%s): batch %d x seq %d\n",
               p->torch_version, r->model, p->device, p->gpu[0] ? " " : "", p->gpu, p->batch, p->seq);
    tk_sb_addf(&text, "loss: %s; attention: %s (%d calls over the two steps); optimizer: %s; precision: %s\n", r->loss, p->attention,
               r->n_sdpa, p->optimizer, p->precision);
    tk_sb_addf(&text, "peak allocated %s (steady step: torch.cuda.max_memory_allocated() after a reset before it); "
                      "first step %s\n", tk_format_bytes(p->peak_allocated, a, sizeof a),
               tk_format_bytes(p->first_step_peak_allocated, b, sizeof b));
    tk_sb_addf(&text, "peak reserved %s\n", tk_format_bytes(p->peak_reserved, a, sizeof a));
    if (p->on_cuda) {
        if (!p->n_workspaces && !p->outside_bytes)
            tk_sb_addf(&text, "cuBLAS workspaces: one %s for each GEMM while it runs%s%s%s\n",
                       tk_format_bytes(p->workspace_bytes, b, sizeof b), p->lt_workspace_bytes ? ", cuBLASLt " : "",
                       p->lt_workspace_bytes ? tk_format_bytes(p->lt_workspace_bytes, c, sizeof c) : "",
                       p->lt_workspace_bytes ? " kept" : "");
        else if (p->n_workspaces)
            tk_sb_addf(&text, "cuBLAS workspaces: %d x %s kept in the caching allocator%s%s%s\n", p->n_workspaces,
                       tk_format_bytes(p->workspace_bytes, b, sizeof b), p->lt_workspace_bytes ? ", cuBLASLt " : "",
                       p->lt_workspace_bytes ? tk_format_bytes(p->lt_workspace_bytes, c, sizeof c) : "",
                       p->lt_workspace_bytes ? " beside them" : "");
        else if (p->outside_bytes)
            tk_sb_addf(&text, "cuBLAS workspaces: cuBLAS's own pools, %s outside the caching allocator\n",
                       tk_format_bytes(p->outside_bytes, b, sizeof b));
        tk_sb_addf(&text, "device used %s (reserved + %s CUDA context%s%s)\n", tk_format_bytes(p->device_used, a, sizeof a),
                   tk_format_bytes(p->context_bytes, b, sizeof b), p->outside_bytes ? " + cuBLAS's own pools " : "",
                   p->outside_bytes ? tk_format_bytes(p->outside_bytes, c, sizeof c) : "");
    }
    int fits;
    size_t budget = usable(p, &fits);
    if (budget)
        tk_sb_addf(&text, "%s: %s reserved of %s usable (the %s's %s total less %s for the CUDA context and library "
                          "buffers)\n", fits ? "FITS" : "DOES NOT FIT", tk_format_bytes(p->peak_reserved, a, sizeof a),
                   tk_format_bytes(budget, b, sizeof b), p->gpu, tk_format_bytes(p->capacity, c, sizeof c),
                   tk_format_bytes(p->capacity - budget, d, sizeof d));
    tk_sb_addf(&text, "Model states: params %s, grads %s, optimizer %s (%lld parameters, %lld trainable)\n",
               tk_format_bytes(p->param_bytes, a, sizeof a), tk_format_bytes(p->grad_bytes, b, sizeof b),
               tk_format_bytes(p->optim_bytes, c, sizeof c), (long long)p->n_params, (long long)p->n_trainable);
    tk_sb_add(&text, "At the steady peak, by category:");
    for (int k = 0; k < TK_CAT_COUNT; k++)
        if (p->by_cat_at_peak[k])
            tk_sb_addf(&text, " %s %s", tk_cat_name((tk_cat)k), tk_format_bytes(p->by_cat_at_peak[k], a, sizeof a));
    tk_sb_add(&text, "\nby module:\n");
    for (int i = 0; i < r->n_modules; i++)
        tk_sb_addf(&text, "  %-48s %s\n", r->modules[i].name, tk_format_bytes(r->modules[i].bytes, a, sizeof a));
    tk_sb_add(&text, "largest tensors:\n");
    for (int i = 0; i < r->n_largest; i++)
        tk_sb_addf(&text, "  %-48s %-9s %s\n", r->largest[i].owner, tk_cat_name(r->largest[i].cat),
                   tk_format_bytes(r->largest[i].bytes, a, sizeof a));
    tk_sb_addf(&text, "how it is known: %s\n", p->checked);
    tk_sb_add(&html, "<div class=\"txk-plan\"><p><b>engine: pytorch, traced</b> (");
    tk_sb_add_html(&html, r->model);
    tk_sb_addf(&html, ", %s, %s%s%s) — batch %d × seq %d: peak allocated <b>%s</b>, first step %s, reserved %s",
               p->torch_version, p->device, p->gpu[0] ? " " : "", p->gpu, p->batch, p->seq,
               tk_format_bytes(p->peak_allocated, a, sizeof a), tk_format_bytes(p->first_step_peak_allocated, b, sizeof b),
               tk_format_bytes(p->peak_reserved, c, sizeof c));
    if (p->on_cuda) tk_sb_addf(&html, ", device used %s", tk_format_bytes(p->device_used, d, sizeof d));
    if (budget) tk_sb_addf(&html, ": <b>%s</b>", fits ? "fits" : "does not fit");
    tk_sb_add(&html, "</p><p>attention: ");
    tk_sb_add_html(&html, p->attention);
    tk_sb_add(&html, "; optimizer: ");
    tk_sb_add_html(&html, p->optimizer);
    tk_sb_add(&html, "</p></div>");
    json_t *j = plan_json(r);
    char *t = tk_sb_take(&text), *h = tk_sb_take(&html);
    json_t *bundle = j && t && h ? json_pack("{s:s, s:s, s:o}", "text/plain", t, "text/html", h, "application/json", j) : NULL;
    if (!bundle) json_decref(j);
    free(t);
    free(h);
    return bundle;
}

/* The traced plan's card planner for tk_gpus_table: the trace replayed on
 * each one-GPU card; a pair is left out (the traced step is one GPU's). */
typedef struct {
    const json_t *trace;
    tk_torch_version v;
    tk_torchtrace_result r;
} trace_cards;

static tk_status trace_card(void *ctx, const tk_gpu_profile *card, tk_gpus_row *row, tk_err *err) {
    trace_cards *x = ctx;
    if (card->gpus > 1) {
        snprintf(row->note, sizeof row->note, "%s: the traced step is one GPU's; two-GPU runs are planned with the "
                 "YAML route", card->name);
        return TK_OK;
    }
    tk_status st = tk_torchtrace_plan(x->trace, card->name, x->v, &x->r, err);
    if (st != TK_OK) return st;
    row->plan = &x->r.plan;
    row->usable = usable(&x->r.plan, &row->fits);
    row->json = plan_json(&x->r);
    return TK_OK;
}

static void trace_head(void *ctx, const char *platform, tk_sb *sb) {
    const trace_cards *x = ctx;
    tk_sb_addf(sb, "engine: pytorch, traced — %s's own training step on each %s card (device used = peak reserved + "
                   "PyTorch's CUDA context; fits: peak reserved within the card's usable capacity):\n",
               x->r.model, platform);
}

tk_status tk_torchtrace_gpus_report(const json_t *trace, tk_torch_version v, const char *platform, json_t **out,
                                    tk_err *err) {
    trace_cards *x = tk_calloc(1, sizeof *x);
    if (!x) return tk_err_nomem(err, "--gpus report");
    x->trace = trace, x->v = v;
    tk_status st = tk_gpus_table(platform, trace_card, trace_head, x,
                                 json_pack("{s:s, s:b, s:s}", "engine", "pytorch", "traced", 1, "platform", platform), out,
                                 err);
    free(x);
    return st;
}

char *tk_embed_plan_trace(const char *trace_path, const char *gpu, const char *gpus, const char *torch_version,
                          char *errbuf, size_t errlen) {
    tk_err err = {0};
    json_error_t je;
    char *out = NULL;
    json_t *bundle = NULL;
    tk_config c;
    tk_config_defaults(&c);
    json_t *trace = trace_path ? json_load_file(trace_path, 0, &je) : NULL;
    if (!trace) {
        tk_err_set(&err, TK_EINVAL, "%s:%d: %s", trace_path ? trace_path : "(no trace file)", trace_path ? je.line : 0,
                   trace_path ? je.text : "give the trace's path");
    } else if (tk_config_set(&c, "torch_version", torch_version && *torch_version ? torch_version : "2", &err) == TK_OK) {
        if (gpus && *gpus) {
            tk_torchtrace_gpus_report(trace, c.torch_version, gpus, &bundle, &err);
        } else {
            tk_torchtrace_result *r = tk_calloc(1, sizeof *r);
            if (!r) tk_err_nomem(&err, "traced plan");
            else if (tk_torchtrace_plan(trace, gpu, c.torch_version, r, &err) == TK_OK && !(bundle = tk_report_torchtrace(r)))
                tk_err_nomem(&err, "traced plan");
            free(r);
        }
    }
    if (bundle) out = json_dumps(bundle, JSON_COMPACT);
    else if (errbuf && errlen) snprintf(errbuf, errlen, "%s", err.msg[0] ? err.msg : "out of host memory");
    json_decref(bundle);
    json_decref(trace);
    return out;
}
