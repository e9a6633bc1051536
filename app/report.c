/* report.c — the reports a notebook cell and `txk` both show: the plan, the
 * OOM autopsy, the per-epoch history, predictions and live memory (text/plain, text/html,
 * SVG, Vega-Lite and application/json in one bundle). The helpers every
 * txkernel magic uses (argument splitting, emitting a bundle) are the cell's,
 * in magics/cell_io.c.
 *
 * Guarantees: numbers shown are the allocator's exact byte counts, formatted
 * as PyTorch formats them; the application/json part carries raw bytes so
 * scripts and tests compare integers, not text. In a notebook that part
 * travels as application/vnd.txkernel.<what>+json (tk_txshow), never as
 * application/json, unless the user asked for --json.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_render.h"
#include "tk_host_mem.h"
#include "tk_session.h"
#include "tk_pipeline.h"
#include "tk_predict.h"
#include "tk_train.h"

static const char *B(size_t n, char buf[32]) { return tk_format_bytes(n, buf, 32); }

static json_t *cats_json(const size_t *by) {
    json_t *o = json_object();
    for (int c = 0; c < TK_CAT_COUNT; c++) json_object_set_new(o, tk_cat_name((tk_cat)c), json_integer((json_int_t)by[c]));
    return o;
}

/* Appends table t as text ("\n" + the table) and HTML, then destroys it
 * (t may be NULL: nothing). */
static void append_table(tk_rtable **t, tk_sb *text, tk_sb *html) {
    if (!*t) return;
    char *x = tk_rtable_text(*t), *y = tk_rtable_html(*t);
    if (x) tk_sb_addf(text, "\n%s", x);
    if (y) tk_sb_add(html, y);
    free(x);
    free(y);
    tk_rtable_destroy(t);
}

/* Category table + SVG bars of bytes per category. */
static void add_cats(tk_sb *text, tk_sb *html, const size_t *by, const char *title, char **svg_out,
                     json_t **vl_out) {
    const char *h[] = {"category", ">bytes", ">MiB"};
    tk_rtable *t = tk_rtable_new(title, 3, h);
    const char *labels[TK_CAT_COUNT];
    double mib[TK_CAT_COUNT];
    char b[32];
    for (int c = 0; c < TK_CAT_COUNT; c++) {
        labels[c] = tk_cat_name((tk_cat)c);
        mib[c] = (double)by[c] / (1 << 20);
        if (t && by[c]) tk_rtable_rowf(t, "%s\t%s\t%.1f", labels[c], B(by[c], b), mib[c]);
    }
    append_table(&t, text, html);
    if (svg_out) *svg_out = tk_svg_bars(title, "MiB", TK_CAT_COUNT, labels, mib);
    if (vl_out) *vl_out = tk_vegalite_bars(title, "category", "MiB", TK_CAT_COUNT, labels, mib);
}

/* "act 75%, temp 25%": an owner's bytes per category, largest first, the
 * categories under 1% left out. */
static void owner_split(const size_t *by, size_t total, char *buf, size_t n) {
    int order[TK_CAT_COUNT];
    for (int c = 0; c < TK_CAT_COUNT; c++) order[c] = c;
    for (int i = 1; i < TK_CAT_COUNT; i++)
        for (int j = i; j > 0 && by[order[j]] > by[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    size_t len = 0;
    buf[0] = 0;
    for (int k = 0; k < TK_CAT_COUNT && len < n; k++) {
        int c = order[k];
        if (!total || by[c] * 100 < total) continue;
        len += (size_t)snprintf(buf + len, n - len, "%s%s %.0f%%", len ? ", " : "", tk_cat_name((tk_cat)c),
                                100.0 * (double)by[c] / (double)total);
    }
}

/* A report with a chart (the plan's, the device's): its text, HTML, SVG,
 * Vega-Lite spec and JSON, each taken. */
static json_t *chart_bundle(tk_sb *text, tk_sb *html, char *svg, json_t *vl, json_t *j) {
    json_t *bundle = tk_bundle_new("");
    tk_bundle_take(bundle, "text/plain", tk_sb_take(text));
    tk_bundle_take(bundle, "text/html", tk_sb_take(html));
    tk_bundle_take(bundle, "image/svg+xml", svg);
    tk_bundle_take_json(bundle, "application/vnd.vegalite.v5+json", vl);
    tk_bundle_take_json(bundle, "application/json", j);
    return bundle;
}

/* ---- plan ------------------------------------------------------------------ */

json_t *tk_report_plan(const tk_plan_result *p, size_t free_bytes) {
    tk_sb text = {0}, html = {0};
    char a[32], b[32], c[32], d[32], e[32];
    size_t limit = free_bytes ? free_bytes : p->capacity;
    int fits = p->fits && (!limit || p->peak_reserved <= limit);
    int64_t margin = limit ? (int64_t)limit - (int64_t)p->peak_reserved : 0;
    size_t amargin = (size_t)(margin < 0 ? -margin : margin);
    if (p->epoch_steps)
        tk_sb_addf(&text, "Plan of the first epoch as the run makes it: %d steps over its own batches (largest "
                   "batch %d x seq %d), then its dev set; %lld parameters (%lld trainable)\n", p->epoch_steps,
                   p->batch, p->seq, (long long)p->n_params, (long long)p->n_trainable);
    else
        tk_sb_addf(&text, "Plan: batch %d x seq %d, %lld parameters (%lld trainable)\n", p->batch, p->seq,
                   (long long)p->n_params, (long long)p->n_trainable);
    if (limit)
        tk_sb_addf(&text, "Predicted peak %s reserved (%s allocated) vs %s %s: %s (%s %s)\n", B(p->peak_reserved, a),
                   B(p->peak_allocated, b), B(limit, c), free_bytes ? "free" : "capacity",
                   fits ? "FITS" : "DOES NOT FIT", fits ? "margin" : "short by", B(amargin, d));
    else
        tk_sb_addf(&text, "Predicted peak %s reserved (%s allocated); no capacity limit set\n",
                   B(p->peak_reserved, a), B(p->peak_allocated, b));
    if (limit && !free_bytes && p->context_bytes)
        tk_sb_addf(&text, "(capacity: the %s card less %s for the CUDA context, library kernels and what the libraries "
                          "keep outside their workspaces; txkernel's cuBLAS workspace and kernel scratch are in the "
                          "plan, category workspace)\n", p->profile, B(p->context_bytes, a));
    tk_sb_addf(&html, "<div class=\"txk-plan\"><p><b style=\"color:%s\">%s</b> — batch %d × seq %d, predicted peak "
                      "<b>%s</b> reserved (%s allocated)",
               limit ? (fits ? "#2e7d32" : "#c62828") : "#333", limit ? (fits ? "Fits" : "Does not fit") : "Plan",
               p->batch, p->seq, B(p->peak_reserved, a), B(p->peak_allocated, b));
    if (limit)
        tk_sb_addf(&html, " of %s %s (%s %s)", B(limit, c), free_bytes ? "free" : "capacity",
                   fits ? "margin" : "short by", B(amargin, d));
    tk_sb_add(&html, "</p>");
    if (p->oom) {
        tk_sb_addf(&text, "The planned step runs out during %s: %s for %s (%s)\n", p->oom_phase,
                   B(p->oom_record.requested, a), p->oom_record.owner_name, tk_cat_name(p->oom_record.tag.cat));
        tk_sb_addf(&html, "<p>The planned step runs out during <b>%s</b>: %s for <code>", p->oom_phase,
                   B(p->oom_record.requested, a));
        tk_sb_add_html(&html, p->oom_record.owner_name);
        tk_sb_addf(&html, "</code> (%s)</p>", tk_cat_name(p->oom_record.tag.cat));
    }
    tk_sb_addf(&text, "Model states: params %s, grads %s, optimizer %s\n", B(p->param_bytes, a), B(p->grad_bytes, b),
               B(p->optim_bytes, c));
    if (p->world_size > 1) {
        /* each rank planned on its own: its pieces of the state, its micro-batches */
        tk_sb_addf(&text, "Data parallel: world_size %d, zero %d, global batch %d per step; the figures above are "
                   "rank %d's, the largest\n", p->world_size, p->zero, p->global_batch, p->peak_rank);
        for (int i = 0; i < p->n_ranks; i++)
            tk_sb_addf(&text, "  rank %-3d peak %s allocated, %s reserved; its shard: params %s, grads %s, optimizer %s\n",
                       p->rank_of[i], B(p->rank[i].peak_allocated, a), B(p->rank[i].peak_reserved, b),
                       B(p->rank[i].param_bytes, c), B(p->rank[i].grad_bytes, d), B(p->rank[i].optim_bytes, e));
        tk_sb_addf(&text, "  communication: %s sent per rank per step (%s); the collectives run in place on the "
                   "gradients and weights, with no buffers of their own%s\n", B((size_t)p->comm_bytes, a),
                   p->zero == 0 ? "all-reduce of the gradients" : p->zero == 1
                   ? "reduce-scatter of the gradients, all-gather of the weights"
                   : "reduce-scatter of each backward stage's gradients, all-gather of the weights",
                   p->zero == 2 ? "; one backward stage's full gradients live at a time" : "");
        tk_sb_addf(&html, "<p>world_size %d, zero %d: the largest rank (%d) is shown; %s sent per rank per step</p>",
                   p->world_size, p->zero, p->peak_rank, B((size_t)p->comm_bytes, a));
    }
    /* which attention was planned, and whether the user or the default chose it */
    tk_sb_addf(&text, "attention: %s (%s)\n", tk_attention_name(p->attention), p->attention_why);
    tk_sb_addf(&html, "<p>attention: <b>%s</b> (%s)</p>", tk_attention_name(p->attention), p->attention_why);
    if (p->attention_kernel[0]) { /* fused on a named card: which cuda kernel runs it */
        tk_sb_addf(&text, "attention kernel on %s: %s\n", p->profile, p->attention_kernel);
        tk_sb_addf(&html, "<p>attention kernel on %s: %s</p>", p->profile, p->attention_kernel);
    }
    char *svg = NULL;
    tk_sb_add(&html, "<div style=\"display:flex;gap:24px;align-items:flex-start\">");
    json_t *vl = NULL;
    add_cats(&text, &html, p->by_cat_at_peak, "At the peak, by category", &svg, &vl);
    const char *h[] = {"owner", ">bytes", ">% of peak", "by category"};
    tk_rtable *t = tk_rtable_new("Top owners at the peak", 4, h);
    for (int i = 0; t && i < p->n_top; i++) {
        char split[160];
        owner_split(p->top[i].by_cat, p->top[i].bytes, split, sizeof split);
        tk_rtable_rowf(t, "%s\t%s\t%.1f\t%s", p->top[i].owner, B(p->top[i].bytes, a),
                       p->peak_allocated ? 100.0 * (double)p->top[i].bytes / (double)p->peak_allocated : 0, split);
    }
    append_table(&t, &text, &html);
    tk_sb_add(&html, "</div>");
    if (svg) tk_sb_add(&html, svg);
    tk_sb_addf(&text, "\nOne optimizer step: %.3g GFLOP", p->train_step.flops / 1e9);
    if (p->profile[0]) tk_sb_addf(&text, "; about %.3g s on %s (roofline estimate)", p->step_seconds, p->profile);
    tk_sb_addf(&text, "\nPlanned on the meta device in %.1f ms; nothing was allocated on the device.\n", p->plan_ms);
    tk_sb_addf(&html, "<p><small>Planned on the meta device in %.1f ms; nothing was allocated on the device.</small></p></div>",
               p->plan_ms);

    json_t *top = json_array();
    for (int i = 0; i < p->n_top; i++)
        json_array_append_new(top, json_pack("{s:s, s:I, s:o}", "owner", p->top[i].owner, "bytes",
                                             (json_int_t)p->top[i].bytes, "by_category", cats_json(p->top[i].by_cat)));
    json_t *j = json_pack("{s:i, s:i, s:I, s:I, s:I, s:I, s:b, s:I, s:I, s:o, s:o, s:I, s:I, s:I, s:I, s:I, s:b, s:f, s:f, s:s}",
                          "batch", p->batch, "seq", p->seq, "capacity", (json_int_t)p->capacity, "free",
                          (json_int_t)free_bytes, "peak_allocated", (json_int_t)p->peak_allocated, "peak_reserved",
                          (json_int_t)p->peak_reserved, "fits", fits, "margin", (json_int_t)margin, "limit",
                          (json_int_t)limit, "by_category_at_peak", cats_json(p->by_cat_at_peak), "top", top,
                          "param_bytes", (json_int_t)p->param_bytes, "grad_bytes", (json_int_t)p->grad_bytes,
                          "optim_bytes", (json_int_t)p->optim_bytes, "n_params", (json_int_t)p->n_params,
                          "n_trainable", (json_int_t)p->n_trainable, "oom", p->oom, "step_gflop",
                          p->train_step.flops / 1e9, "plan_ms", p->plan_ms, "profile", p->profile);
    json_object_set_new(j, "attention", json_string(tk_attention_name(p->attention)));
    json_object_set_new(j, "attention_why", json_string(p->attention_why));
    if (p->attention_kernel[0]) json_object_set_new(j, "attention_kernel", json_string(p->attention_kernel));
    if (p->epoch_steps) json_object_set_new(j, "epoch_steps", json_integer(p->epoch_steps));
    json_object_set_new(j, "world_size", json_integer(p->world_size > 1 ? p->world_size : 1));
    json_object_set_new(j, "zero", json_integer(p->zero));
    if (p->world_size > 1) {
        json_t *ranks = json_array();
        for (int i = 0; i < p->n_ranks; i++)
            json_array_append_new(ranks, json_pack("{s:i, s:I, s:I, s:I, s:I, s:I}", "rank", p->rank_of[i],
                                                   "peak_allocated", (json_int_t)p->rank[i].peak_allocated,
                                                   "peak_reserved", (json_int_t)p->rank[i].peak_reserved,
                                                   "param_bytes", (json_int_t)p->rank[i].param_bytes,
                                                   "grad_bytes", (json_int_t)p->rank[i].grad_bytes,
                                                   "optim_bytes", (json_int_t)p->rank[i].optim_bytes));
        json_object_set_new(j, "ranks", ranks);
        json_object_set_new(j, "peak_rank", json_integer(p->peak_rank));
        json_object_set_new(j, "comm_bytes_per_step", json_integer((json_int_t)p->comm_bytes));
        json_object_set_new(j, "global_batch", json_integer(p->global_batch));
    }
    if (p->oom) json_object_set_new(j, "oom_record", tk_report_oom_json(&p->oom_record, p->oom_phase));
    return chart_bundle(&text, &html, svg, vl, j);
}

/* Appends "Largest tensors at the peak" (owner, category, dtype, shape,
 * bytes) to a plan bundle: text, HTML, and application/json
 * "tensors_at_peak". */
void tk_report_add_tensors(json_t *bundle, const tk_tensor_info *t, int n) {
    if (!bundle || !t || n <= 0) return;
    const char *h[] = {"owner", "category", "tensor", ">bytes"};
    tk_rtable *tb = tk_rtable_new("Largest tensors at the peak", 4, h);
    json_t *arr = json_array();
    char b[32];
    for (int i = 0; tb && i < n; i++) {
        char shape[96];
        size_t len = (size_t)snprintf(shape, sizeof shape, "%s [", tk_dtype_name(t[i].dtype));
        json_t *dims = json_array();
        for (int k = 0; k < t[i].ndim && len < sizeof shape; k++) {
            len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%lld", k ? ", " : "", (long long)t[i].shape[k]);
            json_array_append_new(dims, json_integer(t[i].shape[k]));
        }
        if (len < sizeof shape) snprintf(shape + len, sizeof shape - len, "]");
        tk_rtable_rowf(tb, "%s\t%s\t%s\t%s", t[i].owner, tk_cat_name(t[i].cat), shape,
                       tk_format_bytes(t[i].bytes, b, sizeof b));
        json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:o, s:I}", "owner", t[i].owner, "category",
                                             tk_cat_name(t[i].cat), "dtype", tk_dtype_name(t[i].dtype), "shape", dims,
                                             "bytes", (json_int_t)t[i].bytes));
    }
    char *x = tb ? tk_rtable_text(tb) : NULL, *y = tb ? tk_rtable_html(tb) : NULL;
    const char *pt = json_string_value(json_object_get(bundle, "text/plain"));
    tk_sb sb = {0};
    tk_sb_add(&sb, pt ? pt : "");
    if (x) tk_sb_addf(&sb, "\n%s", x);
    tk_bundle_take(bundle, "text/plain", tk_sb_take(&sb));
    const char *ph = json_string_value(json_object_get(bundle, "text/html"));
    tk_sb hb = {0};
    tk_sb_add(&hb, ph ? ph : "");
    if (y) tk_sb_add(&hb, y);
    tk_bundle_take(bundle, "text/html", tk_sb_take(&hb));
    json_t *j = json_object_get(bundle, "application/json");
    if (json_is_object(j)) json_object_set_new(j, "tensors_at_peak", arr);
    else json_decref(arr);
    free(x);
    free(y);
    tk_rtable_destroy(&tb);
}

/* Appends `text` to a bundle's text/plain and `html_text` (escaped) as a
 * paragraph opened by `p_open` to its text/html. */
static void bundle_append(json_t *bundle, const char *text, const char *html_text, const char *p_open) {
    const char *t = json_string_value(json_object_get(bundle, "text/plain"));
    tk_sb sb = {0};
    tk_sb_add(&sb, t ? t : "");
    tk_sb_add(&sb, text);
    tk_bundle_take(bundle, "text/plain", tk_sb_take(&sb));
    const char *h = json_string_value(json_object_get(bundle, "text/html"));
    tk_sb hb = {0};
    tk_sb_add(&hb, h ? h : "");
    tk_sb_add(&hb, p_open);
    tk_sb_add_html(&hb, html_text);
    tk_sb_add(&hb, "</p>");
    tk_bundle_take(bundle, "text/html", tk_sb_take(&hb));
}

void tk_report_add_holder(json_t *bundle, const tk_holder *h, int always) {
    if (!bundle || !h || h->state == TK_HOLDER_UNKNOWN || (!always && (h->state != TK_HOLDER_HOLDS || !h->reserved))) return;
    char line[256];
    tk_holder_line(h, line, sizeof line - 1);
    strcat(line, "\n");
    bundle_append(bundle, line, line, h->state == TK_HOLDER_HOLDS ? "<p style=\"color:#c62828\">" : "<p>");
    static const char *names[] = {"unknown", "absent", "no_cuda", "idle", "holds"};
    json_t *j = json_object_get(bundle, "application/json");
    if (j)
        json_object_set_new(j, "in_process", json_pack("{s:s, s:s, s:I, s:I}", "holder", "PyTorch caching allocator",
                                                      "state", names[h->state], "reserved", (json_int_t)h->reserved,
                                                      "allocated", (json_int_t)h->allocated));
}

void tk_report_add_host_rss(json_t *bundle) {
    size_t rss = tk_host_rss();
    if (!bundle || !rss) return;
    char line[256], b[32];
    snprintf(line, sizeof line, "Host: this process's resident set is %s (RSS; freed heap goes back to the system "
             "after each run and at %%txreset)\n", B(rss, b));
    bundle_append(bundle, line, line, "<p>");
    json_t *j = json_object_get(bundle, "application/json");
    if (j) json_object_set_new(j, "host_rss", json_integer((json_int_t)rss));
}

void tk_report_add_data(json_t *bundle, const tk_run_data *d) {
    if (!d || !d->n_train) return;
    char line[512];
    snprintf(line, sizeof line,
             "Data: %d training examples in %d batches, %d dev examples, %d labels (digest %016llx)\n",
             d->n_examples, d->n_train, d->n_dev_examples, d->num_labels, (unsigned long long)d->digest);
    bundle_append(bundle, line, line, "<p>");
    char dg[20];
    snprintf(dg, sizeof dg, "%016llx", (unsigned long long)d->digest);
    json_t *j = json_object_get(bundle, "application/json");
    if (j)
        json_object_set_new(j, "data", json_pack("{s:i, s:i, s:i, s:i, s:s}", "examples", d->n_examples, "batches",
                                                 d->n_train, "dev_examples", d->n_dev_examples, "num_labels",
                                                 d->num_labels, "digest", dg));
}

void tk_report_add_head_note(json_t *bundle, const tk_config *c, const tk_plan_result *p) {
    if (c->head != TK_HEAD_FLATTEN_DENSE) return;
    tk_config d = *c;
    tk_err err = {0};
    if (tk_config_resolve_model(&d, &err) != TK_OK) return;
    int towers = d.towers > 0 ? d.towers : 1;
    long long in = (long long)towers * d.max_len * d.hidden;
    size_t wbytes = (size_t)in * (size_t)d.head_units * 4;
    size_t owner_bytes = 0;
    for (int i = 0; i < p->n_top; i++)
        if (!strcmp(p->top[i].owner, "classifier")) owner_bytes = p->top[i].bytes;
    size_t span = (size_t)2 * d.hidden * 4 + 2 * 4;
    char a[32], b[32], e[32], line[1024];
    snprintf(line, sizeof line,
             "\nThe culprit: the head is a Dense(%d) over the flattened %d tower%s x %d tokens x %d hidden, so its "
             "weight classifier.weight is [%d x %lld] = %s in fp32%s%s%s. A per-token span head (head: span, "
             "[2 x %d] + bias) needs %s.\n",
             d.head_units, towers, towers == 1 ? "" : "s", d.max_len, d.hidden, d.head_units, in, tk_format_bytes(wbytes, a, sizeof a),
             owner_bytes ? "; with its gradient, AdamW state and activations 'classifier' holds " : "",
             owner_bytes ? tk_format_bytes(owner_bytes, b, sizeof b) : "", owner_bytes ? " at the peak" : "",
             d.hidden, tk_format_bytes(span, e, sizeof e));
    bundle_append(bundle, line, line + 1, "<p style=\"color:#c62828\">");
    json_t *j = json_object_get(bundle, "application/json");
    if (j)
        json_object_set_new(j, "head", json_pack("{s:s, s:[i, I], s:I, s:I, s:I}", "owner", "classifier", "weight_shape",
                                                 d.head_units, (json_int_t)in, "weight_bytes", (json_int_t)wbytes,
                                                 "owner_bytes_at_peak", (json_int_t)owner_bytes, "span_head_bytes",
                                                 (json_int_t)span));
}

/* ---- OOM autopsy ------------------------------------------------------------ */

/* The next things to try, from what holds the memory; the advisor
 * (%txadvise) ranks real fixes, these are the plain first steps. */
static void oom_hints(tk_sb *b, const tk_oom *o) {
    size_t states = o->by_cat[TK_CAT_PARAM] + o->by_cat[TK_CAT_GRAD] + o->by_cat[TK_CAT_OPTIM];
    size_t acts = o->by_cat[TK_CAT_ACT] + o->by_cat[TK_CAT_TEMP];
    char a[32];
    if (o->allocated == 0) {
        tk_sb_addf(b, "  - nothing else was live: this allocation alone does not fit in %s (the allocator asks the "
                      "device for whole segments: 2 MiB below 1 MiB, 20 MiB below 10 MiB); a smaller model, or "
                      "more capacity\n", B(o->capacity, a));
        tk_sb_add(b, "  - %txadvise ranks the fixes for this OOM by predicted memory and speed\n");
        return;
    }
    if (o->fragmentation)
        tk_sb_addf(b, "  - the cache is fragmented (%s reserved but unallocated, no block large enough): "
                      "empty_cache: every:50 or on_oom\n", B(o->reserved - o->allocated, a));
    if (o->n_top > 0 && o->allocated && o->top[0].bytes * 2 > o->allocated)
        tk_sb_addf(b, "  - %s alone holds %s: a smaller head or freezing it (head: span / pooled)\n", o->top[0].owner,
                   B(o->top[0].bytes, a));
    if (acts >= states)
        tk_sb_add(b, "  - activations dominate: smaller batch_size with accumulate (same effective batch), "
                     "shorter max_len, recompute: layers, precision: fp16/bf16, attention: fused\n");
    else
        tk_sb_add(b, "  - weights, gradients and optimizer state dominate: optimizer: adamw8bit, "
                     "freeze: embeddings or layers:N, precision: fp16/bf16\n");
    tk_sb_add(b, "  - %txadvise ranks the fixes for this OOM by predicted memory and speed\n");
}

char *tk_report_oom_text(const tk_oom *o, const char *phase) {
    tk_sb b = {0};
    char r[32], cap[32], fr[32], al[32], rs[32], lf[32];
    tk_sb_addf(&b, "Out of device memory%s%s: tried to allocate %s (rounded %s) for %s (%s%s%s).\n",
               phase && *phase ? " during " : "", phase ? phase : "", B(o->requested, r), B(o->rounded, lf),
               o->owner_name[0] ? o->owner_name : "(unowned)", tk_cat_name(o->tag.cat), o->tensor[0] ? ", " : "",
               o->tensor);
    tk_sb_addf(&b, "Capacity %s, free %s, allocated %s, reserved %s, largest free block %s.\n", B(o->capacity, cap),
               B(o->free_bytes, fr), B(o->allocated, al), B(o->reserved, rs), B(o->largest_free_block, lf));
    tk_sb_add(&b, "Live memory by category:");
    for (int c = 0; c < TK_CAT_COUNT; c++)
        if (o->by_cat[c]) tk_sb_addf(&b, " %s %s;", tk_cat_name((tk_cat)c), B(o->by_cat[c], r));
    tk_sb_add(&b, "\nTop owners:\n");
    for (int i = 0; i < o->n_top; i++) tk_sb_addf(&b, "  %-60s %s\n", o->top[i].owner, B(o->top[i].bytes, r));
    tk_sb_add(&b, "What to try:\n");
    oom_hints(&b, o);
    return tk_sb_take(&b);
}

json_t *tk_report_oom_json(const tk_oom *o, const char *phase) {
    json_t *top = json_array();
    for (int i = 0; i < o->n_top; i++)
        json_array_append_new(top, json_pack("{s:s, s:I}", "owner", o->top[i].owner, "bytes", (json_int_t)o->top[i].bytes));
    return json_pack("{s:s, s:I, s:I, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:b, s:o, s:o, s:s}", "phase", phase ? phase : "",
                     "requested", (json_int_t)o->requested, "rounded", (json_int_t)o->rounded, "owner", o->owner_name,
                     "category", tk_cat_name(o->tag.cat), "capacity", (json_int_t)o->capacity, "free",
                     (json_int_t)o->free_bytes, "allocated", (json_int_t)o->allocated, "reserved",
                     (json_int_t)o->reserved, "largest_free_block", (json_int_t)o->largest_free_block,
                     "fragmentation", o->fragmentation, "by_category", cats_json(o->by_cat), "top", top,
                     "tensor", o->tensor);
}

/* ---- history ------------------------------------------------------------------ */

json_t *tk_report_history(const tk_epoch_stats *h, int n, int task) {
    const char *hc[] = {">epoch", ">train loss", ">dev loss", ">accuracy", ">macro F1", ">samples/s", ">seconds", ">peak allocated"};
    const char *hq[] = {">epoch", ">train loss", ">dev loss", ">exact match", ">F1", ">samples/s", ">seconds", ">peak allocated"};
    tk_rtable *t = tk_rtable_new("Per epoch", 8, task == TK_TASK_QA ? hq : hc);
    json_t *rows = json_array();
    char b[32];
    for (int i = 0; t && i < n; i++) {
        float m1 = task == TK_TASK_QA ? h[i].dev_em : h[i].dev_acc, m2 = task == TK_TASK_QA ? h[i].dev_span_f1 : h[i].dev_f1;
        char dl[32];
        if (h[i].dev_loss == h[i].dev_loss) snprintf(dl, sizeof dl, "%.4f", h[i].dev_loss);
        else snprintf(dl, sizeof dl, "-");
        tk_rtable_rowf(t, "%d\t%.4f\t%s\t%.4f\t%.4f\t%.1f\t%.2f\t%s", h[i].epoch, h[i].train_loss, dl, m1, m2,
                       h[i].samples_per_s, h[i].seconds, B(h[i].peak_allocated, b));
        json_t *r = json_pack("{s:i, s:f, s:f, s:I, s:I}", "epoch", h[i].epoch, "samples_per_s", h[i].samples_per_s,
                              "seconds", h[i].seconds, "peak_allocated", (json_int_t)h[i].peak_allocated,
                              "peak_reserved", (json_int_t)h[i].peak_reserved);
        /* NaN (no dev set) has no JSON spelling: null */
        json_object_set_new(r, "train_loss", isfinite(h[i].train_loss) ? json_real(h[i].train_loss) : json_null());
        json_object_set_new(r, task == TK_TASK_QA ? "dev_em" : "dev_acc", isfinite(m1) ? json_real(m1) : json_null());
        json_object_set_new(r, task == TK_TASK_QA ? "dev_f1" : "dev_macro_f1", isfinite(m2) ? json_real(m2) : json_null());
        json_object_set_new(r, "dev_loss", h[i].dev_loss == h[i].dev_loss ? json_real(h[i].dev_loss) : json_null());
        json_array_append_new(rows, r);
    }
    json_t *bundle = tk_bundle_new("");
    if (t) {
        tk_bundle_take(bundle, "text/plain", tk_rtable_text(t));
        tk_bundle_take(bundle, "text/html", tk_rtable_html(t));
        tk_rtable_destroy(&t);
    }
    json_object_set_new(bundle, "application/json", rows);
    return bundle;
}

/* ---- predictions ---------------------------------------------------------------- */

static json_t *num_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

json_t *tk_report_predict(const tk_predict_report *r, int rows) {
    const tk_predict_result *p = r->res;
    json_t *bundle = tk_bundle_new("");
    tk_sb text = {0}, html = {0};
    char b1[32];
    if (!p) return bundle;
    tk_sb_addf(&text, "Predictions of %s: %d examples in %.2f s (planned peak %s)\n", r->model, p->n, p->seconds,
               tk_format_bytes(r->plan.peak_reserved, b1, sizeof b1));
    json_t *j = json_pack("{s:s, s:i, s:f, s:I}", "model", r->model, "examples", p->n, "seconds", p->seconds,
                          "planned_peak_reserved", (json_int_t)r->plan.peak_reserved);
    json_object_set_new(j, "loss", num_or_null(p->loss));
    json_object_set_new(j, "with_gold", json_integer(p->n_gold));
    if (p->qa) {
        if (p->n_gold) tk_sb_addf(&text, "exact match %.2f, F1 %.2f (SQuAD v1.1, %d questions with answers)\n",
                                  p->exact_match, p->f1, p->n_gold);
        json_object_set_new(j, "exact_match", num_or_null(p->exact_match));
        json_object_set_new(j, "f1", num_or_null(p->f1));
    } else if (p->n_gold) {
        tk_sb_addf(&text, "accuracy %.4f, macro F1 %.4f, loss %.4f (%d examples with a label)\n", p->accuracy,
                   p->macro_f1, p->loss, p->n_gold);
        json_object_set_new(j, "accuracy", num_or_null(p->accuracy));
        json_object_set_new(j, "macro_f1", num_or_null(p->macro_f1));
    }
    char *head = tk_sb_take(&text);
    tk_sb_add(&html, "<p>");
    tk_sb_add_html(&html, head ? head : "");
    tk_sb_add(&html, "</p>");
    tk_sb_add(&text, head ? head : "");
    free(head);
    int K = p->num_labels;
    if (!p->qa && p->n_gold && K > 0) {
        /* the confusion matrix: rows are the gold labels */
        const char **hdr = tk_calloc((size_t)K + 1, sizeof *hdr);
        char **names = tk_calloc((size_t)K + 1, sizeof *names);
        json_t *cm = json_array();
        for (int k = 0; hdr && names && k <= K; k++) {
            if (k == 0) hdr[0] = "gold \\ predicted";
            else {
                const char *nm = r->labels ? r->labels[k - 1] : "?";
                if ((names[k] = tk_malloc(strlen(nm) + 2))) snprintf(names[k], strlen(nm) + 2, ">%s", nm);
                hdr[k] = names[k] ? names[k] : ">?";
            }
        }
        tk_rtable *t = hdr ? tk_rtable_new("Confusion matrix", K + 1, hdr) : NULL;
        for (int g = 0; g < K; g++) {
            tk_sb row = {0};
            tk_sb_add(&row, r->labels ? r->labels[g] : "?");
            json_t *jr = json_array();
            for (int q = 0; q < K; q++) {
                tk_sb_addf(&row, "\t%lld", (long long)p->confusion[(size_t)g * K + q]);
                json_array_append_new(jr, json_integer(p->confusion[(size_t)g * K + q]));
            }
            char *line = tk_sb_take(&row);
            if (t && line) tk_rtable_rowf(t, "%s", line);
            free(line);
            json_array_append_new(cm, jr);
        }
        json_object_set_new(j, "confusion", cm);
        if (t) {
            char *tt = tk_rtable_text(t), *th = tk_rtable_html(t);
            tk_sb_add(&text, tt ? tt : "");
            tk_sb_add(&html, th ? th : "");
            free(tt);
            free(th);
            tk_rtable_destroy(&t);
        }
        for (int k = 0; names && k <= K; k++) free(names[k]);
        free(names);
        free(hdr);
    }
    /* per example: every one in the JSON, the first `rows` in the tables */
    json_t *all = json_array();
    const char *hc[] = {">#", "label", ">score", "gold"};
    const char *hq[] = {">#", "id", "answer", ">chars", "gold?"};
    tk_rtable *t = tk_rtable_new("Predictions", p->qa ? 5 : 4, p->qa ? hq : hc);
    for (int i = 0; i < p->n; i++) {
        if (p->qa) {
            json_array_append_new(all, json_pack("{s:s?, s:s, s:i, s:i}", "id", p->id[i], "answer", p->answer[i],
                                                 "start", p->char_start[i], "end", p->char_end[i]));
            if (t && i < rows)
                tk_rtable_rowf(t, "%d\t%s\t%s\t%d-%d\t%s", i, p->id[i] ? p->id[i] : "", p->answer[i],
                               p->char_start[i], p->char_end[i], "");
        } else {
            int k = p->pred[i];
            const char *name = r->labels && k < r->n_labels ? r->labels[k] : "?";
            json_t *probs = json_object(), *logits = json_array();
            for (int q = 0; q < K; q++) {
                json_object_set_new(probs, r->labels && q < r->n_labels ? r->labels[q] : "?",
                                    json_real(p->probs[(size_t)i * K + q]));
                json_array_append_new(logits, json_real(p->logits[(size_t)i * K + q]));
            }
            json_t *e = json_pack("{s:i, s:s, s:f, s:o, s:o}", "index", i, "label", name, "score",
                                  (double)p->probs[(size_t)i * K + k], "probs", probs, "logits", logits);
            if (p->gold[i] >= 0 && r->labels && p->gold[i] < r->n_labels)
                json_object_set_new(e, "gold", json_string(r->labels[p->gold[i]]));
            json_array_append_new(all, e);
            if (t && i < rows)
                tk_rtable_rowf(t, "%d\t%s\t%.4f\t%s", i, name, (double)p->probs[(size_t)i * K + k],
                               p->gold[i] >= 0 && r->labels && p->gold[i] < r->n_labels ? r->labels[p->gold[i]] : "");
        }
    }
    json_object_set_new(j, "predictions", all);
    if (t) {
        char *tt = tk_rtable_text(t), *th = tk_rtable_html(t);
        tk_sb_add(&text, tt ? tt : "");
        tk_sb_add(&html, th ? th : "");
        if (p->n > rows) tk_sb_addf(&text, "(%d more; --json or -o FILE for all)\n", p->n - rows);
        free(tt);
        free(th);
        tk_rtable_destroy(&t);
    }
    tk_bundle_take(bundle, "text/plain", tk_sb_take(&text));
    tk_bundle_take(bundle, "text/html", tk_sb_take(&html));
    json_object_set_new(bundle, "application/json", j);
    return bundle;
}

/* ---- live memory ---------------------------------------------------------------- */

/* "bert.encoder.layer.7.attention.self.query" -> "bert.encoder.layer.7";
 * "bert.embeddings.word_embeddings" -> "bert.embeddings"; others stay. */
static void layer_of(const char *owner, char *out, size_t n) {
    const char *p = strstr(owner, "encoder.layer.");
    if (p) {
        p += strlen("encoder.layer.");
        while (isdigit((unsigned char)*p)) p++;
        snprintf(out, n, "%.*s", (int)(p - owner), owner);
        return;
    }
    p = strstr(owner, "embeddings");
    if (p) {
        snprintf(out, n, "%.*s", (int)(p - owner) + (int)strlen("embeddings"), owner);
        return;
    }
    p = strstr(owner, "pooler");
    if (p) {
        snprintf(out, n, "%.*s", (int)(p - owner) + (int)strlen("pooler"), owner);
        return;
    }
    snprintf(out, n, "%s", owner);
}

typedef struct { char name[128]; size_t live, peak; size_t by[TK_CAT_COUNT]; } mem_row;

static int row_cmp(const void *a, const void *b) {
    const mem_row *x = a, *y = b;
    if (x->live != y->live) return x->live < y->live ? 1 : -1;
    return strcmp(x->name, y->name);
}

/* On cuda: what CUPTI saw of device memory, reconciled with the allocator
 * (every allocation in the process, library ones included), and what no
 * allocation record covers. NULL on other devices. */
static json_t *add_device_records(tk_dev *d, tk_sb *text, tk_sb *html) {
    if (tk_dev_kind_of(d) != TK_DEV_CUDA) return NULL;
    tk_cuda_mem_totals t;
    tk_err e = {0};
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    if (tk_dev_cuda_mem_totals(d, &t, &e) != TK_OK) {
        tk_sb_addf(text, "device memory records unavailable: %s\n", e.msg);
        return json_pack("{s:b, s:s}", "cupti_active", 0, "error", e.msg);
    }
    size_t used = t.device_total > t.device_free ? t.device_total - t.device_free : 0;
    /* without CUPTI, what the plugin itself knows it allocated stands in */
    size_t recorded = t.cupti_active ? t.device_live : t.segments_live + t.plugin_bytes;
    size_t unrecorded = used > recorded ? used - recorded : 0;
    if (t.cupti_active) {
        tk_sb_addf(text, "CUPTI: %s live on the device (peak %s) = allocator segments %s + outside the allocator %s "
                   "(plugin's cuBLAS workspace and scratch %s)\n", B(t.device_live, b1), B(t.device_peak, b2),
                   B(t.segments_live, b3), B(t.outside_allocator, b4), B(t.plugin_bytes, b5));
        tk_sb_addf(html, "<p>CUPTI: <b>%s</b> live on the device (peak %s) = allocator segments %s + outside the "
                   "allocator <b>%s</b> (cuBLAS workspace and plugin scratch %s)", B(t.device_live, b1),
                   B(t.device_peak, b2), B(t.segments_live, b3), B(t.outside_allocator, b4), B(t.plugin_bytes, b5));
        for (int i = 0; i < t.n_sources; i++)
            if (t.sources[i].live || t.sources[i].peak) {
                tk_sb_addf(text, "  allocated by %s: %s live, peak %s\n", t.sources[i].name, B(t.sources[i].live, b1),
                           B(t.sources[i].peak, b2));
                tk_sb_add(html, "<br>allocated by ");
                tk_sb_add_html(html, t.sources[i].name);
                tk_sb_addf(html, ": %s live, peak %s", B(t.sources[i].live, b1), B(t.sources[i].peak, b2));
            }
        tk_sb_add(html, "</p>");
    } else {
        tk_sb_addf(text, "CUPTI tracing off (%s): outside the allocator only the plugin's own buffers are known, %s\n",
                   t.cupti_error, B(t.plugin_bytes, b1));
        tk_sb_add(html, "<p>CUPTI tracing off (");
        tk_sb_add_html(html, t.cupti_error);
        tk_sb_addf(html, "): outside the allocator only the plugin's own buffers are known, %s</p>", B(t.plugin_bytes, b1));
    }
    tk_sb_addf(text, "in use on the GPU but in no allocation record (CUDA context, module code, other processes): %s\n",
               B(unrecorded, b1));
    tk_sb_addf(html, "<p>In use on the GPU but in no allocation record (CUDA context, module code, other processes): "
               "%s</p>", B(unrecorded, b1));
    json_t *src = json_array();
    for (int i = 0; i < t.n_sources; i++)
        json_array_append_new(src, json_pack("{s:s, s:I, s:I}", "name", t.sources[i].name, "live",
                                             (json_int_t)t.sources[i].live, "peak", (json_int_t)t.sources[i].peak));
    return json_pack("{s:b, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "cupti_active", t.cupti_active,
                     "error", t.cupti_error, "device_live", (json_int_t)t.device_live, "device_peak",
                     (json_int_t)t.device_peak, "segments_live", (json_int_t)t.segments_live, "outside_allocator",
                     (json_int_t)t.outside_allocator, "plugin_bytes", (json_int_t)t.plugin_bytes, "workspace_bytes",
                     (json_int_t)t.workspace_bytes, "unrecorded", (json_int_t)unrecorded, "dropped_records",
                     (json_int_t)t.dropped_records, "sources", src);
}

json_t *tk_report_mem(tk_dev *d, const char *by, int top) {
    tk_alloc *a = tk_dev_alloc(d);
    tk_alloc_stats st;
    tk_alloc_stats_get(a, &st);
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    if (top <= 0) top = 10;
    int by_owner = by && !strcmp(by, "owner"), by_layer = by && !strcmp(by, "layer");
    tk_sb text = {0}, html = {0};
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
    tk_sb_addf(&text, "%s (%s): capacity %s%s, free %s, allocated %s (peak %s), reserved %s (peak %s)\n", info.name,
               tk_dev_kind_of(d) == TK_DEV_CUDA ? "cuda" : tk_dev_kind_of(d) == TK_DEV_CPU ? "cpu" : "meta",
               B(info.total, b1), info.simulated ? " (simulated)" : "", B(info.free_bytes, b2), B(st.allocated, b3),
               B(st.allocated_peak, b4), B(st.reserved, b5), B(st.reserved_peak, b6));
    tk_sb_addf(&text, "allocations %llu, frees %llu, segments %zu, alloc retries %llu, OOMs %llu\n",
               (unsigned long long)st.n_alloc, (unsigned long long)st.n_free, st.n_segments,
               (unsigned long long)st.n_retries, (unsigned long long)st.n_ooms);
    tk_sb_add(&html, "<div class=\"txk-mem\"><p><b>");
    tk_sb_add_html(&html, info.name);
    tk_sb_addf(&html, "</b>: capacity %s%s, free %s, allocated <b>%s</b> (peak %s), reserved %s (peak %s)</p>",
               B(info.total, b1), info.simulated ? " (simulated)" : "", B(info.free_bytes, b2), B(st.allocated, b3),
               B(st.allocated_peak, b4), B(st.reserved, b5), B(st.reserved_peak, b6));
    json_t *records = add_device_records(d, &text, &html);
    tk_sb_add(&html, "<div style=\"display:flex;gap:24px;align-items:flex-start\">");
    char *svg = NULL;
    json_t *vl = NULL;
    add_cats(&text, &html, st.by_cat, "Live bytes by category", &svg, &vl);

    /* owners (or layers): live bytes now and peak */
    int no = tk_alloc_n_owners(a);
    mem_row *rows = tk_calloc((size_t)(no > 0 ? no : 1), sizeof *rows);
    int nr = 0;
    for (int id = 0; rows && id < no; id++) {
        char name[128];
        const char *on = tk_alloc_owner_name(a, id);
        if (by_layer) layer_of(on ? on : "?", name, sizeof name);
        else snprintf(name, sizeof name, "%s", on ? on : "?");
        int k = 0;
        while (k < nr && strcmp(rows[k].name, name)) k++;
        if (k == nr) snprintf(rows[nr++].name, sizeof rows[0].name, "%s", name);
        for (int c = 0; c < TK_CAT_COUNT; c++) {
            size_t v = tk_alloc_owner_live(a, id, (tk_cat)c);
            rows[k].by[c] += v;
            rows[k].live += v;
        }
        rows[k].peak += tk_alloc_owner_peak(a, id);
    }
    json_t *jrows = json_array();
    if (rows && (by_owner || by_layer)) {
        qsort(rows, (size_t)nr, sizeof *rows, row_cmp);
        const char *h[] = {by_layer ? "layer" : "owner", ">live", ">param", ">grad", ">optim", ">act", ">peak"};
        tk_rtable *t = tk_rtable_new(by_layer ? "Live bytes by layer" : "Top owners (live bytes)", 7, h);
        for (int i = 0; t && i < nr && i < top; i++) {
            char c1[32], c2[32], c3[32], c4[32], c5[32], c6[32];
            tk_rtable_rowf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s", rows[i].name, B(rows[i].live, c1), B(rows[i].by[TK_CAT_PARAM], c2),
                           B(rows[i].by[TK_CAT_GRAD], c3), B(rows[i].by[TK_CAT_OPTIM], c4), B(rows[i].by[TK_CAT_ACT], c5),
                           B(rows[i].peak, c6));
        }
        append_table(&t, &text, &html);
    }
    for (int i = 0; rows && i < nr; i++)
        if (rows[i].live || rows[i].peak)
            json_array_append_new(jrows, json_pack("{s:s, s:I, s:I, s:o}", "name", rows[i].name, "live",
                                                   (json_int_t)rows[i].live, "peak", (json_int_t)rows[i].peak,
                                                   "by_category", cats_json(rows[i].by)));
    free(rows);
    tk_sb_add(&html, "</div>");
    if (svg) tk_sb_add(&html, svg);
    tk_sb_add(&html, "</div>");
    json_t *j = json_pack("{s:s, s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o}",
                          "device", info.name, "kind",
                          tk_dev_kind_of(d) == TK_DEV_CUDA ? "cuda" : tk_dev_kind_of(d) == TK_DEV_CPU ? "cpu" : "meta",
                          "simulated", info.simulated, "capacity", (json_int_t)info.total, "free",
                          (json_int_t)info.free_bytes, "allocated", (json_int_t)st.allocated, "allocated_peak",
                          (json_int_t)st.allocated_peak, "reserved", (json_int_t)st.reserved, "reserved_peak",
                          (json_int_t)st.reserved_peak, "n_alloc", (json_int_t)st.n_alloc, "n_free",
                          (json_int_t)st.n_free, "n_segments_alloc", (json_int_t)st.n_segments_alloc, "n_ooms",
                          (json_int_t)st.n_ooms, "n_retries", (json_int_t)st.n_retries, "largest_free_block",
                          (json_int_t)st.largest_free_block, "by_category", cats_json(st.by_cat),
                          by_layer ? "layers" : "owners", jrows);
    if (records) json_object_set_new(j, "device_records", records);
    return chart_bundle(&text, &html, svg, vl, j);
}
