/* report_torchplan.c — an `engine: pytorch` plan (torchplan/) as text, HTML
 * and JSON, for `txk plan` and `%txplan`: it names the engine and the torch
 * and transformers versions it follows, so a number is never read as
 * txkernel's own. */
#include <stdio.h>
#include <stdlib.h>

#include "tk_render.h"
#include "tk_session.h"
#include "tk_torchplan.h"

json_t *tk_report_torchplan(const tk_torchplan_result *r) {
    char a[32], b[32], c[32], d[32];
    tk_sb text = {0}, html = {0};
    tk_sb_addf(&text, "Plan (engine: pytorch — a transformers %s training step as torch %s + transformers %s run it, "
                      "on %s%s%s): batch %d x seq %d%s\n",
               r->batch ? "BERT" : "BERT", r->torch_version, r->transformers_version, r->device,
               r->gpu[0] ? " " : "", r->gpu, r->batch, r->seq, r->accumulate > 1 ? " (accumulated)" : "");
    if (r->accumulate > 1) tk_sb_addf(&text, "accumulate: %d micro-batches per optimizer step\n", r->accumulate);
    tk_sb_addf(&text, "attention: %s; optimizer: %s; precision: %s\n", r->attention, r->optimizer, r->precision);
    tk_sb_addf(&text, "peak allocated %s (steady step: torch.cuda.max_memory_allocated() after a reset before it); "
                      "first step %s\n", tk_format_bytes(r->peak_allocated, a, sizeof a),
               tk_format_bytes(r->first_step_peak_allocated, b, sizeof b));
    tk_sb_addf(&text, "peak reserved %s", tk_format_bytes(r->peak_reserved, a, sizeof a));
    if (r->workspace_bytes) tk_sb_addf(&text, " (with the cuBLAS workspace, %s)", tk_format_bytes(r->workspace_bytes, b, sizeof b));
    tk_sb_add(&text, "\n");
    if (r->on_cuda)
        tk_sb_addf(&text, "device used %s (reserved + %s CUDA context%s)\n", tk_format_bytes(r->device_used, a, sizeof a),
                   tk_format_bytes(r->context_bytes, b, sizeof b), r->gpu[0] ? "" : ": unknown without a gpu: card");
    if (r->capacity)
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
    tk_sb_add(&html, "</p></div>");
    json_t *j = tk_torchplan_json(r);
    char *t = tk_sb_take(&text), *h = tk_sb_take(&html);
    json_t *bundle = j && t && h ? json_pack("{s:s, s:s, s:o}", "text/plain", t, "text/html", h, "application/json", j) : NULL;
    if (!bundle) json_decref(j);
    free(t);
    free(h);
    return bundle;
}
