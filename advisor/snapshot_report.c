/* snapshot_report.c — a read snapshot (tk_snapshot.h) as text for a
 * reader and as JSON: the figures, the segments by pool, the owners live at
 * the end, the trace's peak with what was live then by category and layer,
 * the library workspaces, the model recognised and its plan as it ran, the
 * diagnoses and the fixes with their code.
 *
 * Guarantees: only what the tk_snapshot holds is written; a figure the
 * file could not give is null in JSON and left out of the text, never
 * filled in.
 */
#include "tk_snapshot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *fmtb(size_t b, char buf[32]) { return tk_format_bytes(b, buf, 32); }

/* The model in one line: what it is and its sizes. Sizes cannot show the
 * head count: a preset or --model gives it, otherwise it is BERT's
 * hidden / 64 and said to be assumed. */
void tk_snap_model_line(const tk_snap_model *md, char *buf, size_t n) {
    char a[32];
    if (!md->recognised) {
        if (md->hidden)
            snprintf(buf, n, "%s (not a BERT: not planned), hidden %d, %d layers, intermediate %d, vocab %d; %s weights, "
                             "%s of parameter-shaped blocks",
                     md->family, md->hidden, md->layers, md->intermediate, md->vocab,
                     md->mixed ? "fp32 and 16-bit" : md->elem == 2 ? "16-bit (fp16/bf16)" : "fp32",
                     tk_format_bytes(md->param_bytes, a, sizeof a));
        else
            snprintf(buf, n, "%s (not recognised)", md->family[0] ? md->family : "unknown");
        return;
    }
    snprintf(buf, n, "BERT%s%s%s, hidden %d, %d layers, %d heads%s, intermediate %d, vocab %d, %d positions; "
                     "%s weights, %d cop%s of each parameter (%s)",
             md->preset[0] ? " = " : "", md->preset,
             md->preset[0] ? "" : "-shaped (a transformer whose layers have BERT's parameter shapes)", md->hidden,
             md->layers, md->heads, md->preset[0] || strncmp(md->from, "--model", 7) == 0 ? "" : " (assumed: hidden / 64)",
             md->intermediate, md->vocab, md->max_position,
             md->mixed ? "fp32 and 16-bit" : md->elem == 2 ? "16-bit (fp16/bf16)" : "fp32", md->copies,
             md->copies == 1 ? "y" : "ies", tk_format_bytes(md->param_bytes, a, sizeof a));
}

/* What "allocated" is in the trace's figures: block sizes as the
 * allocator rounded them, and the blocks from before the recording. */
static void allocated_as(const tk_snapshot *s, char *out, size_t n) {
    char a[32];
    const tk_snap_replay *r = &s->replay;
    int m = snprintf(out, n, "%s; %d block%s live before the recording began (%s at its start)",
                     r->rounded ? "each request rounded and split into the block the caching allocator gave it"
                                : "the block sizes the file records",
                     r->before_blocks, r->before_blocks == 1 ? "" : "s", fmtb(r->before_bytes, a));
    if (m > 0 && (size_t)m < n && r->rounding_unknown)
        m += snprintf(out + m, n - (size_t)m, "; roundup_power2_divisions was set, which this replay does not "
                                              "apply: rounded to 512 B only");
    if (m > 0 && (size_t)m < n && (r->unplaced || r->end_mismatch))
        snprintf(out + m, n - (size_t)m, "; %d alloc%s the replay could not place, %d of %d blocks live at the end "
                                         "sized otherwise than the file says",
                 r->unplaced, r->unplaced == 1 ? "" : "s", r->end_mismatch, r->end_checked);
}

/* The peak: when, in which phase, what was live by category and layer. */
static void text_peak(FILE *f, const tk_snapshot *s) {
    const tk_snap_peak *pk = &s->peak;
    char a[32], b[32];
    if (pk->have) {
        char step[64] = "";
        if (pk->steps) snprintf(step, sizeof step, ", step %d of the %d the trace shows", pk->step, pk->steps);
        fprintf(f, "\nThe peak: %s allocated at trace event %lld, %s%s%s\n", fmtb(pk->allocated, a), (long long)pk->event,
                pk->phase[0] ? "during " : "in a phase the file does not show", pk->phase, step);
        fprintf(f, "  live then, by category:\n");
        for (int i = 0; i < pk->n_parts; i++)
            fprintf(f, "    %12s %5d blocks  %4.1f%%  %s\n", fmtb(pk->parts[i].bytes, a), pk->parts[i].blocks,
                    pk->allocated ? 100.0 * (double)pk->parts[i].bytes / (double)pk->allocated : 0.0, pk->parts[i].text);
        if (pk->n_layers) {
            fprintf(f, "  activations live then, by the forward's layer");
            if (pk->layers_seen) fprintf(f, " (its layer loop ran %d times a forward pass)", pk->layers_seen);
            fprintf(f, ":\n");
            for (int i = 0; i < pk->n_layers; i++)
                fprintf(f, "    %12s %5d blocks  %s\n", fmtb(pk->layers[i].bytes, a), pk->layers[i].blocks, pk->layers[i].text);
        }
        if (pk->tokens)
            fprintf(f, "  the batch your code made (live in the step's forward and backward): %d tokens (int64 blocks "
                       "of %d B), %d block%s of %d labels\n", pk->tokens,
                    pk->tokens * 8, pk->label_blocks, pk->label_blocks == 1 ? "" : "s", pk->batch);
    }
    if (s->n_ws) {
        fprintf(f, "\nLibrary workspaces (not your tensors: each library handle keeps one):\n");
        for (int i = 0; i < s->n_ws; i++)
            fprintf(f, "  %12s  %s%s\n", fmtb(s->ws[i].bytes, b), s->ws[i].name + (strncmp(s->ws[i].name, "library: ", 9) ? 0 : 9),
                    s->ws[i].at_peak ? "; live at the peak" : "");
    }
}

char *tk_snap_text(const tk_snapshot *s, int top) {
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f) return NULL;
    char a[32], b[32], c[32], d[32];
    fprintf(f, "PyTorch memory snapshot %s (%s): %d segments, %d blocks\n", s->path, s->form, s->n_segments,
            s->n_blocks);
    fprintf(f, "  reserved %s (%zu B) · allocated %s (%zu B) · requested %s (%zu B)\n", fmtb(s->reserved, a),
            s->reserved, fmtb(s->allocated, b), s->allocated, fmtb(s->requested, c), s->requested);
    fprintf(f, "  free in the cache %s in %d blocks, largest free block %s (%zu B)\n", fmtb(s->free_in_cache, a),
            s->n_free_blocks, fmtb(s->largest_free_block, b), s->largest_free_block);
    if (s->capacity) fprintf(f, "  device capacity %s\n", fmtb(s->capacity, a));
    if (s->n_device_rows > 1) {
        fprintf(f, "  %d devices:\n", s->n_device_rows);
        for (int i = 0; i < s->n_device_rows; i++)
            fprintf(f, "    device %d: reserved %s, allocated %s, largest free block %s%s\n", s->devices[i].device,
                    fmtb(s->devices[i].reserved, a), fmtb(s->devices[i].allocated, b),
                    fmtb(s->devices[i].largest_free_block, c),
                    s->has_oom && s->devices[i].device == s->oom_device ? "  <- the OOM" : "");
    }
    if (s->has_oom) {
        char on[32] = "";
        if (s->n_device_rows > 1) snprintf(on, sizeof on, " on device %d", s->oom_device);
        fprintf(f, "  out of memory%s: tried to allocate %s with %s free on the device%s%s\n", on, fmtb(s->oom_size, a),
                fmtb(s->oom_device_free, b), s->phase_at_oom[0] ? ", during " : "", s->phase_at_oom);
    }
    if (s->expandable_on) fprintf(f, "  expandable segments: on\n");
    if (s->n_points)
        fprintf(f, "  trace: %d events, allocated peaks at %s (%zu B)%s%s\n", s->n_trace, fmtb(s->trace_peak_allocated, a),
                s->trace_peak_allocated, s->phase_at_peak[0] ? ", during " : "", s->phase_at_peak);
    if (s->n_points) {
        char how[320];
        allocated_as(s, how, sizeof how);
        fprintf(f, "    (allocated as PyTorch counts it: %s)\n", how);
    }
    fprintf(f, "\nSegments by pool and stream:\n  %-6s %-8s %8s %12s %12s %12s %12s\n", "pool", "stream", "segments",
            "reserved", "allocated", "free", "largest free");
    for (int i = 0; i < s->n_pools; i++) {
        const tk_snap_pool *p = &s->pools[i];
        fprintf(f, "  %-6s %-8lld %8d %12s %12s %12s %12s\n", p->pool, (long long)p->stream, p->segments,
                fmtb(p->reserved, a), fmtb(p->allocated, b), fmtb(p->free, c), fmtb(p->largest_free, d));
    }
    fprintf(f, "\nLive at the end, by owner (innermost frame of your code):\n");
    if (s->has_annotations) fprintf(f, "  %12s %12s  %-28s %s\n", "bytes", "blocks", "phase", "owner");
    for (int i = 0; i < s->n_owners && i < top; i++) {
        if (s->has_annotations)
            fprintf(f, "  %12s %5d blocks  %-28s %s\n", fmtb(s->owners[i].bytes, a), s->owners[i].blocks,
                    s->owners[i].phase[0] ? s->owners[i].phase : "-", s->owners[i].owner);
        else
            fprintf(f, "  %12s %5d blocks  %s\n", fmtb(s->owners[i].bytes, a), s->owners[i].blocks, s->owners[i].owner);
    }
    if (s->n_owners > top) fprintf(f, "  ... %d more owners\n", s->n_owners - top);
    text_peak(f, s);
    const tk_snap_model *md = &s->model;
    if (!md->recognised && md->family[0]) {
        char line[512];
        tk_snap_model_line(md, line, sizeof line);
        fprintf(f, "\nModel: %s\n  why: %s\n", line, md->why);
    }
    if (md->recognised) {
        char line[512];
        tk_snap_model_line(md, line, sizeof line);
        fprintf(f, "\nModel (from %s): %s\n  why: %s\n", md->from, line, md->why);
        if (md->batch)
            fprintf(f, "  batch %d x sequence %d (from %s)\n", md->batch, md->seq, md->shape_from);
        else
            fprintf(f, "  batch and sequence length unknown: give --batch N --seq N to plan the fixes\n");
        if (md->planned)
            fprintf(f, "  planned as it ran by %s: peak reserved %s%s%s (%s)%s; %s\n", md->engine_label,
                    fmtb(md->plan_peak, a), md->plan_capacity ? " of " : "", md->plan_capacity ? fmtb(md->plan_capacity, b) : "",
                    md->capacity_from, !md->plan_capacity ? "" : md->plan_fits ? " -> fits" : " -> does not fit",
                    md->plan_note);
        else if (md->plan_withheld)
            fprintf(f, "  plan as it ran by %s %s\n", md->engine_label, md->plan_note);
    }
    /* the user's traced model: what it planned, or in one line why it did not */
    if (md->planned_by[0]) fprintf(f, "  %s\n", md->planned_by);
    if (md->traced_note[0]) fprintf(f, "  %s\n", md->traced_note);
    if (s->data.have)
        fprintf(f, "\nData %s: %d examples, token lengths p50 %d, p95 %d, p99 %d, max %d (%s)\n", s->data.file,
                s->data.n, s->data.p50, s->data.p95, s->data.p99, s->data.max, s->data.vocab_note);
    fprintf(f, "\nDiagnosis:\n");
    if (!s->n_diag && !s->n_points && !s->has_oom && !s->capacity && s->reserved &&
        s->allocated >= s->reserved / 10 * 9)
        fprintf(f, "  nothing this snapshot proves: live tensors fill what PyTorch reserved (%s of %s), but the file "
                   "holds no OOM and no device capacity was given to judge that against (--gpu NAME or --capacity SIZE).\n",
                fmtb(s->allocated, a), fmtb(s->reserved, b));
    else if (!s->n_diag)
        fprintf(f, "  nothing wrong that this snapshot shows.\n");
    for (int i = 0; i < s->n_diag; i++) fprintf(f, "  %d. %s\n", i + 1, s->diag[i].text);
    if (s->n_fixes) fprintf(f, "\nFixes, best first:\n");
    for (int i = 0; i < s->n_fixes; i++) {
        fprintf(f, "  %d. [%s] %s\n", i + 1, s->fixes[i].id, s->fixes[i].text);
        if (s->fixes[i].planned)
            fprintf(f, "       planned (%s): %s peak %s%s%s\n", s->fixes[i].plan_change,
                    !md->plan_capacity ? "" : s->fixes[i].plan_fits ? "fits:" : "does not fit:", fmtb(s->fixes[i].plan_peak, a),
                    md->plan_capacity ? " of " : "", md->plan_capacity ? fmtb(md->plan_capacity, b) : "");
        const char *line = s->fixes[i].code;
        while (*line) {
            const char *e = strchr(line, '\n');
            int len = e ? (int)(e - line) : (int)strlen(line);
            fprintf(f, "       %.*s\n", len, line);
            line += len + (e ? 1 : 0);
        }
    }
    fclose(f);
    return out;
}

static json_t *json_parts(const tk_snap_part *p, int n, size_t total) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_pack("{s:s, s:s, s:I, s:i, s:f}", "id", p[i].id, "text", p[i].text, "bytes",
                                           (json_int_t)p[i].bytes, "blocks", p[i].blocks, "share",
                                           total ? (double)p[i].bytes / (double)total : 0.0));
    return a;
}

static json_t *json_peak(const tk_snapshot *s) {
    const tk_snap_peak *pk = &s->peak;
    if (!pk->have) return json_null();
    json_t *o = json_pack("{s:I, s:I, s:o, s:o, s:o}", "allocated", (json_int_t)pk->allocated, "event",
                          (json_int_t)pk->event, "time_us", pk->time_us >= 0 ? json_integer(pk->time_us) : json_null(),
                          "phase", pk->phase[0] ? json_string(pk->phase) : json_null(), "where",
                          pk->where[0] ? json_string(pk->where) : json_null());
    json_object_set_new(o, "step", pk->steps ? json_integer(pk->step) : json_null());
    json_object_set_new(o, "steps", json_integer(pk->steps));
    json_object_set_new(o, "by_category", json_parts(pk->parts, pk->n_parts, pk->allocated));
    json_object_set_new(o, "by_layer", json_parts(pk->layers, pk->n_layers, pk->allocated));
    json_object_set_new(o, "layers_seen", pk->layers_seen ? json_integer(pk->layers_seen) : json_null());
    json_object_set_new(o, "batch", pk->tokens ? json_pack("{s:i, s:i, s:i}", "tokens", pk->tokens, "batch", pk->batch,
                                                           "label_blocks", pk->label_blocks)
                                               : json_null());
    return o;
}

json_t *tk_snap_json(const tk_snapshot *s, int top) {
    json_t *o = json_object();
    json_object_set_new(o, "file", json_string(s->path));
    json_object_set_new(o, "form", json_string(s->form));
    json_object_set_new(o, "reserved", json_integer((json_int_t)s->reserved));
    json_object_set_new(o, "allocated", json_integer((json_int_t)s->allocated));
    json_object_set_new(o, "requested", json_integer((json_int_t)s->requested));
    json_object_set_new(o, "pending_free", json_integer((json_int_t)s->pending_free));
    json_object_set_new(o, "largest_free_block", json_integer((json_int_t)s->largest_free_block));
    json_object_set_new(o, "free_in_cache", json_integer((json_int_t)s->free_in_cache));
    json_object_set_new(o, "empty_segments", json_integer((json_int_t)s->empty_segments));
    json_object_set_new(o, "n_segments", json_integer(s->n_segments));
    json_object_set_new(o, "n_blocks", json_integer(s->n_blocks));
    json_object_set_new(o, "n_devices", json_integer(s->n_devices));
    json_object_set_new(o, "capacity", s->capacity ? json_integer((json_int_t)s->capacity) : json_null());
    json_t *pools = json_array();
    for (int i = 0; i < s->n_pools; i++) {
        const tk_snap_pool *p = &s->pools[i];
        json_array_append_new(pools, json_pack("{s:s, s:I, s:i, s:I, s:I, s:I, s:I}", "pool", p->pool, "stream",
                                               (json_int_t)p->stream, "segments", p->segments, "reserved",
                                               (json_int_t)p->reserved, "allocated", (json_int_t)p->allocated, "free",
                                               (json_int_t)p->free, "largest_free", (json_int_t)p->largest_free));
    }
    json_object_set_new(o, "segments", pools);
    json_t *devs = json_array();
    for (int i = 0; i < s->n_device_rows; i++)
        json_array_append_new(devs, json_pack("{s:i, s:I, s:I, s:I}", "device", s->devices[i].device, "reserved",
                                              (json_int_t)s->devices[i].reserved, "allocated",
                                              (json_int_t)s->devices[i].allocated, "largest_free_block",
                                              (json_int_t)s->devices[i].largest_free_block));
    json_object_set_new(o, "devices", devs);
    json_object_set_new(o, "expandable_segments", json_boolean(s->expandable_on));
    json_t *t = json_array();
    for (int i = 0; i < s->n_owners && i < top; i++) {
        json_t *r = json_pack("{s:s, s:I, s:i}", "owner", s->owners[i].owner, "bytes", (json_int_t)s->owners[i].bytes,
                              "blocks", s->owners[i].blocks);
        if (s->has_annotations)
            json_object_set_new(r, "phase", s->owners[i].phase[0] ? json_string(s->owners[i].phase) : json_null());
        json_array_append_new(t, r);
    }
    json_object_set_new(o, "top", t);
    json_object_set_new(o, "oom", s->has_oom ? json_pack("{s:I, s:I, s:i, s:o}", "size", (json_int_t)s->oom_size,
                                                         "device_free", (json_int_t)s->oom_device_free, "device",
                                                         s->oom_device, "phase",
                                                         s->phase_at_oom[0] ? json_string(s->phase_at_oom) : json_null())
                                             : json_null());
    json_object_set_new(o, "phase_at_peak", s->phase_at_peak[0] ? json_string(s->phase_at_peak) : json_null());
    json_object_set_new(o, "growth", json_pack("{s:b, s:I, s:i}", "found", s->has_growth, "bytes",
                                               (json_int_t)s->growth_bytes, "rises", s->growth_rises));
    json_t *tl = json_pack("{s:i, s:i, s:I}", "events", s->n_trace, "points", s->n_points, "peak_allocated",
                           (json_int_t)s->trace_peak_allocated);
    if (s->n_points) {
        char how[320];
        allocated_as(s, how, sizeof how);
        json_object_set_new(tl, "allocated_as", json_string(how));
        const tk_snap_replay *r = &s->replay;
        json_object_set_new(tl, "replay", json_pack("{s:b, s:b, s:i, s:I, s:i, s:i, s:i}", "rounded", r->rounded,
                                                    "rounding_unknown", r->rounding_unknown, "before_blocks",
                                                    r->before_blocks, "before_bytes", (json_int_t)r->before_bytes,
                                                    "unplaced", r->unplaced, "end_checked", r->end_checked,
                                                    "end_mismatch", r->end_mismatch));
    }
    json_object_set_new(o, "timeline", tl);
    json_object_set_new(o, "peak", json_peak(s));
    json_t *ws = json_array();
    for (int i = 0; i < s->n_ws; i++)
        json_array_append_new(ws, json_pack("{s:s, s:s, s:I, s:b}", "library", "cuBLAS", "name", s->ws[i].name, "bytes",
                                            (json_int_t)s->ws[i].bytes, "at_peak", s->ws[i].at_peak));
    json_object_set_new(o, "workspaces", ws);
    json_t *dg = json_array();
    for (int i = 0; i < s->n_diag; i++)
        json_array_append_new(dg, json_pack("{s:s, s:s}", "id", tk_diag_id(s->diag[i].kind), "text", s->diag[i].text));
    json_object_set_new(o, "diagnoses", dg);
    json_t *fx = json_array();
    for (int i = 0; i < s->n_fixes; i++) {
        const tk_fix_note *f = &s->fixes[i];
        json_t *x = json_pack("{s:s, s:s, s:s, s:o}", "id", f->id, "text", f->text, "code", f->code, "saves",
                              f->saves >= 0 ? json_integer(f->saves) : json_null());
        if (f->planned)
            json_object_set_new(x, "plan", json_pack("{s:I, s:o, s:s}", "peak", (json_int_t)f->plan_peak, "fits",
                                                     s->model.plan_capacity ? json_boolean(f->plan_fits) : json_null(),
                                                     "change", f->plan_change));
        json_array_append_new(fx, x);
    }
    json_object_set_new(o, "fixes", fx);
    json_object_set_new(o, "leak",
                        json_pack("{s:b, s:i, s:I, s:I, s:o, s:I, s:i}", "found", s->has_leak, "iterations",
                                  s->leak_iterations, "per_iteration", (json_int_t)s->leak_per_iteration, "total",
                                  (json_int_t)s->leak_total, "owner",
                                  s->leak_owner[0] ? json_string(s->leak_owner) : json_null(), "owner_bytes",
                                  (json_int_t)s->leak_owner_bytes, "owner_iterations", s->leak_owner_iterations));
    const tk_snap_model *md = &s->model;
    json_t *mj = json_null();
    if (!md->recognised && md->family[0]) {
        mj = json_pack("{s:s, s:s, s:b}", "family", md->family, "why", md->why, "planned", 0);
        if (md->hidden) {
            json_object_set_new(mj, "hidden", json_integer(md->hidden));
            json_object_set_new(mj, "layers", json_integer(md->layers));
            json_object_set_new(mj, "intermediate", json_integer(md->intermediate));
            json_object_set_new(mj, "vocab", json_integer(md->vocab));
            json_object_set_new(mj, "max_position", md->max_position ? json_integer(md->max_position) : json_null());
            json_object_set_new(mj, "dtype", json_string(md->mixed ? "mixed (fp32 and 16-bit copies)"
                                                         : md->elem == 2 ? "fp16/bf16" : "fp32"));
            json_object_set_new(mj, "copies", json_integer(md->copies));
            json_object_set_new(mj, "param_bytes", json_integer((json_int_t)md->param_bytes));
        }
    }
    if (md->recognised) {
        mj = json_pack("{s:s, s:o, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:I}", "recognised_from", md->from, "preset",
                       md->preset[0] ? json_string(md->preset) : json_null(), "hidden", md->hidden, "layers",
                       md->layers, "heads", md->heads, "intermediate", md->intermediate, "vocab", md->vocab,
                       "max_position", md->max_position, "dtype",
                       md->mixed ? "mixed (fp32 and 16-bit copies)" : md->elem == 2 ? "fp16/bf16" : "fp32", "copies",
                       md->copies, "param_bytes", (json_int_t)md->param_bytes);
        json_object_set_new(mj, "batch", md->batch ? json_integer(md->batch) : json_null());
        json_object_set_new(mj, "seq", md->seq ? json_integer(md->seq) : json_null());
        json_object_set_new(mj, "shape_from", md->shape_from[0] ? json_string(md->shape_from) : json_null());
        json_object_set_new(mj, "family", json_string(md->family));
        json_object_set_new(mj, "why", json_string(md->why));
        json_object_set_new(mj, "planned", json_boolean(md->planned));
        /* the plan beside the file's figure it was held to; "fits" only against a known capacity */
        if (md->planned)
            json_object_set_new(mj, "plan", json_pack("{s:I, s:I, s:I, s:o, s:o, s:s, s:s, s:s, s:s}", "peak",
                                                      (json_int_t)md->plan_peak, "peak_allocated",
                                                      (json_int_t)md->plan_allocated, "against",
                                                      (json_int_t)md->plan_against, "capacity",
                                                      md->plan_capacity ? json_integer((json_int_t)md->plan_capacity)
                                                                        : json_null(),
                                                      "fits", md->plan_capacity ? json_boolean(md->plan_fits) : json_null(),
                                                      "capacity_from", md->capacity_from, "engine", md->engine,
                                                      "engine_label", md->engine_label, "agreement", md->plan_note));
        else if (md->plan_withheld)
            json_object_set_new(mj, "plan_withheld", json_pack("{s:s, s:s, s:I, s:I, s:s}", "engine", md->engine,
                                                               "engine_label", md->engine_label, "peak_allocated",
                                                               (json_int_t)md->plan_allocated, "against",
                                                               (json_int_t)md->plan_against, "reason", md->plan_note));
    }
    json_object_set_new(o, "model", mj);
    if (md->planned_by[0]) json_object_set_new(o, "planned_by", json_string(md->planned_by));
    if (md->traced_note[0]) json_object_set_new(o, "traced_note", json_string(md->traced_note));
    const tk_snap_data *dt = &s->data;
    json_object_set_new(o, "data", dt->have ? json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s}", "file", dt->file,
                                                        "examples", dt->n, "max", dt->max, "p50", dt->p50, "p95",
                                                        dt->p95, "p99", dt->p99, "max_length", dt->max_length,
                                                        "vocabulary", dt->vocab_note)
                                            : json_null());
    return o;
}
