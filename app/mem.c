/* mem.c — the mem verb of the request layer (issue 39): `txk mem` and
 * `%txmem` call tk_app_mem with their parsed words and print or show what
 * it returns: a PyTorch memory snapshot read and diagnosed (--snapshot, the
 * same in both doors); in a shell, a fresh device for --device/--capacity
 * and its memory; in a cell, the session's device memory by category, owner
 * or layer, the last run's timeline, the allocator saved (--save) and its
 * history recorded (--record). Moved from magics/txmem.c and cli/txk.c.
 *
 * Guarantees: reading memory never allocates on the device; before any run
 * a cell says so instead of opening a device; reading a PyTorch snapshot
 * needs no device and executes nothing from the file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_app.h"
#include "tk_embed_trace.h"
#include "tk_host_mem.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_snapshot.h"

#define TXMEM_RECORD_EVENTS ((size_t)1 << 18) /* %txmem --record: 12 MiB of events */

static json_t *timeline_bundle(const tk_mem_sample *tl, int n) {
    double *x = tk_malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    double *y = tk_malloc((size_t)(n > 0 ? n : 1) * 3 * sizeof *y);
    json_t *b = NULL;
    if (x && y) {
        for (int i = 0; i < n; i++) {
            x[i] = (double)tl[i].step;
            y[i] = (double)tl[i].allocated / (1 << 20);
            y[n + i] = (double)tl[i].reserved / (1 << 20);
            y[2 * n + i] = (double)tl[i].peak / (1 << 20);
        }
        const char *names[] = {"allocated", "reserved", "peak"};
        char txt[256];
        char a[32], r[32];
        snprintf(txt, sizeof txt, "Memory timeline of the last run: %d steps; at the end %s allocated, %s reserved\n", n,
                 n ? tk_format_bytes(tl[n - 1].allocated, a, sizeof a) : "-",
                 n ? tk_format_bytes(tl[n - 1].reserved, r, sizeof r) : "-");
        b = tk_bundle_new(txt);
        char *svg = tk_svg_lines("Device memory per step (at step boundaries)", "step", "MiB", n, x, 3, names, y);
        tk_bundle_take(b, "image/svg+xml", svg);
        tk_bundle_take_json(b, "application/vnd.vegalite.v5+json",
                            tk_vegalite_lines("Device memory per step", "step", "MiB", n, x, 3, names, y));
        json_t *rows = json_array();
        for (int i = 0; i < n; i++)
            json_array_append_new(rows, json_pack("{s:I, s:I, s:I, s:I}", "step", (json_int_t)tl[i].step, "allocated",
                                                  (json_int_t)tl[i].allocated, "reserved", (json_int_t)tl[i].reserved,
                                                  "peak", (json_int_t)tl[i].peak));
        json_object_set_new(b, "application/json", json_pack("{s:o}", "timeline", rows));
    }
    free(x);
    free(y);
    return b;
}

/* The trace's memory over time, at most this many points: the SVG stays
 * small whatever the trace's length (each bucket keeps its highest point). */
#define SNAP_CHART_POINTS 400

/* The trace's memory over time; a snapshot without a trace (or with one
 * event) gets the live bytes by owner instead, so there is always a chart. */
static char *snapshot_chart(const tk_snapshot *s) {
    if (s->n_points < 2) {
        int n = s->n_owners < 10 ? s->n_owners : 10;
        if (!n) return NULL;
        const char *labels[10];
        double mib[10];
        for (int i = 0; i < n; i++) {
            labels[i] = s->owners[i].owner;
            mib[i] = (double)s->owners[i].bytes / (1 << 20);
        }
        return tk_svg_bars("Live at the end, by owner (the snapshot has no trace to chart)", "MiB", n, labels, mib);
    }
    int n = s->n_points < SNAP_CHART_POINTS ? s->n_points : SNAP_CHART_POINTS;
    double *x = tk_calloc((size_t)n, sizeof *x), *y = tk_calloc((size_t)n * 2, sizeof *y);
    char *svg = NULL;
    if (x && y) {
        for (int k = 0; k < n; k++) {
            int lo = (int)((int64_t)k * s->n_points / n), hi = (int)((int64_t)(k + 1) * s->n_points / n);
            x[k] = (double)s->points[lo].event;
            for (int i = lo; i < hi; i++) {
                double a = (double)s->points[i].allocated / (1 << 20), r = (double)s->points[i].reserved / (1 << 20);
                if (a > y[k]) y[k] = a;
                if (r > y[n + k]) y[n + k] = r;
            }
        }
        const char *names[] = {"allocated", "reserved"};
        svg = tk_svg_lines("Memory over the trace (PyTorch snapshot)", "trace event", "MiB", n, x, 2, names, y);
    }
    free(x);
    free(y);
    return svg;
}

static json_t *snapshot_bundle(const tk_snapshot *s, int top) {
    char *text = tk_snap_text(s, top);
    json_t *b = tk_bundle_new(text ? text : "");
    free(text);
    tk_sb h = {0};
    char a[32], r[32], q[32], l[32];
    tk_sb_add(&h, "<div class=\"txk-snapshot\"><p><b>PyTorch memory snapshot</b> <code>");
    tk_sb_add_html(&h, s->path);
    tk_sb_addf(&h, "</code> (%s): reserved <b>%s</b>, allocated <b>%s</b>, requested %s, largest free block %s; "
                   "%d segments, %d blocks.</p>",
               s->form, tk_render_bytes(s->reserved, r), tk_render_bytes(s->allocated, a),
               tk_render_bytes(s->requested, q), tk_render_bytes(s->largest_free_block, l), s->n_segments, s->n_blocks);
    if (s->has_oom) {
        tk_sb_addf(&h, "<p>Out of memory");
        if (s->n_device_rows > 1) tk_sb_addf(&h, " on device %d of %d", s->oom_device, s->n_device_rows);
        tk_sb_addf(&h, ": tried to allocate <b>%s</b> with %s free on the device", tk_render_bytes(s->oom_size, a),
                   tk_render_bytes(s->oom_device_free, r));
        if (s->phase_at_oom[0]) {
            tk_sb_add(&h, ", during ");
            tk_sb_add_html(&h, s->phase_at_oom);
        }
        tk_sb_add(&h, ".</p>");
    }
    if (s->n_points && (s->phase_at_peak[0] || s->peak.have)) {
        tk_sb_addf(&h, "<p>The trace's peak of allocated memory (%s, as PyTorch counts it)",
                   tk_render_bytes(s->trace_peak_allocated, a));
        if (s->phase_at_peak[0]) {
            tk_sb_add(&h, " came during ");
            tk_sb_add_html(&h, s->phase_at_peak);
        }
        if (s->peak.steps) tk_sb_addf(&h, ", step %d of the %d the trace shows", s->peak.step, s->peak.steps);
        tk_sb_add(&h, ".</p>");
    }
    const tk_snap_model *md = &s->model;
    if (!md->recognised && md->family[0]) {
        char line[512];
        tk_snap_model_line(md, line, sizeof line);
        tk_sb_add(&h, "<p><b>Model</b>: ");
        tk_sb_add_html(&h, line);
        tk_sb_add(&h, ". <i>Why:</i> ");
        tk_sb_add_html(&h, md->why);
        tk_sb_add(&h, "</p>");
    }
    if (md->recognised) {
        tk_sb_add(&h, "<p><b>Model</b> (from ");
        tk_sb_add_html(&h, md->from);
        char line[512];
        tk_snap_model_line(md, line, sizeof line);
        tk_sb_add(&h, "): ");
        tk_sb_add_html(&h, line);
        tk_sb_add(&h, ".");
        if (md->batch) tk_sb_addf(&h, " Batch %d &times; sequence %d (from %s).", md->batch, md->seq, md->shape_from);
        else tk_sb_add(&h, " Batch and sequence unknown: give <code>--batch N --seq N</code> to plan the fixes.");
        if (md->planned) {
            tk_sb_addf(&h, " Planned as it ran by %s: peak <b>%s</b>%s%s (%s)%s; ", md->engine_label,
                       tk_render_bytes(md->plan_peak, a), md->plan_capacity ? " of " : "",
                       md->plan_capacity ? tk_render_bytes(md->plan_capacity, r) : "", md->capacity_from,
                       !md->plan_capacity ? "" : md->plan_fits ? ": fits" : ": does not fit");
            tk_sb_add_html(&h, md->plan_note);
            tk_sb_add(&h, ".");
        }
        else if (md->plan_withheld) {
            tk_sb_addf(&h, " Plan as it ran by %s ", md->engine_label);
            tk_sb_add_html(&h, md->plan_note);
            tk_sb_add(&h, ".");
        }
        tk_sb_add(&h, " <i>Why:</i> ");
        tk_sb_add_html(&h, md->why);
        tk_sb_add(&h, "</p>");
    }
    if (md->planned_by[0] || md->traced_note[0]) {
        tk_sb_add(&h, "<p>");
        tk_sb_add_html(&h, md->planned_by[0] ? md->planned_by : md->traced_note);
        tk_sb_add(&h, "</p>");
    }
    if (s->data.have) {
        tk_sb_add(&h, "<p><b>Data</b> <code>");
        tk_sb_add_html(&h, s->data.file);
        tk_sb_addf(&h, "</code>: %d examples, token lengths p50 %d, p95 %d, p99 %d, max %d.</p>", s->data.n,
                   s->data.p50, s->data.p95, s->data.p99, s->data.max);
    }
    static const char *const dh[] = {"diagnosis"};
    tk_rtable *dt = tk_rtable_new("Diagnosis, the cause first", 1, dh);
    for (int i = 0; dt && i < s->n_diag; i++) tk_rtable_rowf(dt, "%s", s->diag[i].text);
    static const char *const oh[] = {"owner (innermost frame of your code)", ">live", ">blocks", "phase"};
    tk_rtable *ot = tk_rtable_new("Live at the end", s->has_annotations ? 4 : 3, oh);
    for (int i = 0; ot && i < s->n_owners && i < top; i++) {
        if (s->has_annotations)
            tk_rtable_rowf(ot, "%s\t%s\t%d\t%s", s->owners[i].owner, tk_render_bytes(s->owners[i].bytes, a),
                           s->owners[i].blocks, s->owners[i].phase[0] ? s->owners[i].phase : "-");
        else
            tk_rtable_rowf(ot, "%s\t%s\t%d", s->owners[i].owner, tk_render_bytes(s->owners[i].bytes, a),
                           s->owners[i].blocks);
    }
    static const char *const kh[] = {"what", ">bytes", ">blocks", ">share"};
    tk_rtable *kt = s->peak.n_parts ? tk_rtable_new("Live at the trace's peak, by category", 4, kh) : NULL;
    for (int i = 0; kt && i < s->peak.n_parts; i++) {
        const tk_snap_part *p = &s->peak.parts[i];
        tk_rtable_rowf(kt, "%s\t%s\t%d\t%.1f%%", p->text, tk_render_bytes(p->bytes, a), p->blocks,
                       s->peak.allocated ? 100.0 * (double)p->bytes / (double)s->peak.allocated : 0.0);
    }
    static const char *const vh[] = {"device", ">reserved", ">allocated", ">largest free block"};
    tk_rtable *vt = s->n_device_rows > 1 ? tk_rtable_new("By device", 4, vh) : NULL;
    for (int i = 0; vt && i < s->n_device_rows; i++) {
        char f[32];
        tk_rtable_rowf(vt, "%d%s\t%s\t%s\t%s", s->devices[i].device,
                       s->has_oom && s->devices[i].device == s->oom_device ? " (the OOM)" : "",
                       tk_render_bytes(s->devices[i].reserved, r), tk_render_bytes(s->devices[i].allocated, a),
                       tk_render_bytes(s->devices[i].largest_free_block, f));
    }
    static const char *const ph[] = {"pool", "stream", ">segments", ">reserved", ">allocated", ">free", ">largest free"};
    tk_rtable *pt = tk_rtable_new("Segments by pool and stream", 7, ph);
    for (int i = 0; pt && i < s->n_pools; i++) {
        char f[32], g[32];
        const tk_snap_pool *p = &s->pools[i];
        tk_rtable_rowf(pt, "%s\t%lld\t%d\t%s\t%s\t%s\t%s", p->pool, (long long)p->stream, p->segments,
                       tk_render_bytes(p->reserved, r), tk_render_bytes(p->allocated, a), tk_render_bytes(p->free, f),
                       tk_render_bytes(p->largest_free, g));
    }
    tk_rtable *tabs[] = {dt, kt, vt, ot, pt};
    for (int i = 0; i < 5; i++) {
        char *t = tabs[i] && tk_rtable_nrows(tabs[i]) ? tk_rtable_html(tabs[i]) : NULL;
        if (t) tk_sb_add(&h, t);
        free(t);
        tk_rtable_destroy(&tabs[i]);
    }
    if (s->n_fixes) tk_sb_add(&h, "<p><b>Fixes, best first</b></p><ol>");
    for (int i = 0; i < s->n_fixes; i++) {
        tk_sb_add(&h, "<li>");
        tk_sb_add_html(&h, s->fixes[i].text);
        if (s->fixes[i].planned) {
            tk_sb_add(&h, " <i>Planned (");
            tk_sb_add_html(&h, s->fixes[i].plan_change);
            tk_sb_addf(&h, "): %s peak %s%s%s.</i>",
                       !md->plan_capacity ? "" : s->fixes[i].plan_fits ? "fits:" : "does not fit:",
                       tk_render_bytes(s->fixes[i].plan_peak, a), md->plan_capacity ? " of " : "",
                       md->plan_capacity ? tk_render_bytes(md->plan_capacity, r) : "");
        }
        tk_sb_add(&h, "<pre><code>");
        tk_sb_add_html(&h, s->fixes[i].code);
        tk_sb_add(&h, "</code></pre></li>");
    }
    if (s->n_fixes) tk_sb_add(&h, "</ol>");
    char *svg = snapshot_chart(s);
    if (svg) tk_sb_add(&h, svg);
    tk_sb_add(&h, "</div>");
    tk_bundle_take(b, "text/html", tk_sb_take(&h));
    tk_bundle_take(b, "image/svg+xml", svg);
    tk_bundle_take_json(b, "application/json", tk_snap_json(s, top));
    return b;
}

/* A positive whole number, or -1. */
static long positive(const char *v) {
    char *end = NULL;
    long n = v ? strtol(v, &end, 10) : -1;
    return v && *v && !*end && n > 0 ? n : -1;
}

/* tk_snap_opts.describe: the traced model's line, as its advice says it. */
static void traced_summary(void *ctx, char *buf, size_t n) { tk_traced_summary(ctx, buf, n); }

/* --snapshot FILE: a PyTorch memory snapshot read and diagnosed, with no
 * device opened. In a session holding the companion's traced model (issue
 * 41 point 6: %%txwatch's OOM, %txmem --snapshot), the file's step is
 * planned by tracing that model when its batch and length are the traced
 * config's (tk_snap_plan says why not otherwise). */
static tk_status mem_snapshot(tk_session *ss, const tk_app_args *w, int top, tk_mem_reply *out, tk_err *err) {
    const char *b = tk_app_arg(w, "--batch"), *q = tk_app_arg(w, "--seq");
    tk_snap_opts o = {.model = tk_app_arg(w, "--model"), .data = tk_app_arg(w, "--data"),
                      .text_col = tk_app_arg(w, "--text"), .gpu = tk_app_arg(w, "--gpu"),
                      .batch = b ? (int)positive(b) : 0, .seq = q ? (int)positive(q) : 0};
    if ((b && o.batch < 1) || (q && o.seq < 1)) {
        tk_err_set(err, TK_EINVAL, "--batch/--seq: expected a positive number, found '%s'", b && o.batch < 1 ? b : q);
        return TK_EINVAL;
    }
    size_t cap = 0;
    if (tk_snap_capacity(o.gpu, tk_app_arg(w, "--capacity"), &cap, err)) return TK_EINVAL;
    out->ename = "SnapshotError";
    tk_snapshot *s = tk_snap_read(tk_app_arg(w, "--snapshot"), cap, err);
    if (!s) return TK_EINVAL;
    tk_traced_model *tm = tk_session_traced(ss, tk_session_config(ss));
    if (tm) {
        tk_traced_begin(tm);
        o.plan_fn = tk_traced_plan, o.plan_ctx = tm, o.describe = traced_summary;
        o.traced = tk_traced_config(tm), o.traced_label = tk_traced_label(tm);
    }
    tk_status st = tk_snap_plan(s, &o, err) ? TK_EINVAL : TK_OK;
    if (st == TK_OK && !(out->bundle = snapshot_bundle(s, top))) st = tk_err_nomem(err, "the snapshot's report");
    tk_snap_destroy(&s);
    return st;
}

/* --record [N|off]: the allocator's history kept from now on, or dropped. */
static tk_status mem_record(tk_session *s, const char *v, tk_mem_reply *out, tk_err *err) {
    long k = v && strcmp(v, "off") ? positive(v) : 0;
    if (v && strcmp(v, "off") && k < 1) {
        tk_err_set(err, TK_EINVAL, "--record %s: expected a number of events or off", v);
        return TK_EINVAL;
    }
    /* the allocator's history is off unless asked: a ring of 48-byte events */
    size_t n = !v ? TXMEM_RECORD_EVENTS : (size_t)k;
    char b[32];
    out->ename = "MemoryError";
    if (tk_session_record_history(s, n, err) != TK_OK) return TK_ENOMEM;
    if (n)
        snprintf(out->said, sizeof out->said, "Recording the allocator's last %zu events (%s of host memory) from "
                 "now on: the allocations and frees of the runs that follow are the trace %%txmem --save "
                 "FILE.pickle writes. %%txmem --record off stops.\n", n,
                 tk_format_bytes(n * sizeof(tk_alloc_event), b, sizeof b));
    else
        snprintf(out->said, sizeof out->said, "The allocator's history is off (what it kept is dropped).\n");
    return TK_OK;
}

/* txk mem: a fresh device of --device / --capacity, reported with its
 * memory; application/json is {device, memory}. */
static tk_status mem_shell(tk_session *s, const tk_app_args *w, const char *by, int top, tk_mem_reply *out,
                           tk_err *err) {
    tk_config c;
    tk_config_defaults(&c);
    const char *dev = tk_app_arg(w, "--device"), *cap = tk_app_arg(w, "--capacity");
    tk_status st;
    out->ename = "ConfigError";
    if ((dev && (st = tk_config_set(&c, "device", dev, err)) != TK_OK) ||
        (cap && (st = tk_config_set(&c, "capacity", cap, err)) != TK_OK))
        return st;
    char note[256];
    out->ename = "DeviceError";
    tk_dev *d = tk_session_device(s, &c, note, err);
    if (!d) return TK_EINVAL;
    json_t *b = tk_device_report(d, &c), *m = tk_report_mem(d, by, top);
    const char *t1 = json_string_value(json_object_get(b, "text/plain")), *t2 = json_string_value(json_object_get(m, "text/plain"));
    tk_sb sb = {0};
    tk_sb_addf(&sb, "%s%s", t1 ? t1 : "", t2 ? t2 : "");
    char *text = tk_sb_take(&sb);
    out->bundle = text ? tk_bundle_new(text) : NULL;
    free(text);
    json_t *both = json_pack("{s:O, s:O}", "device", json_object_get(b, "application/json"), "memory",
                             json_object_get(m, "application/json"));
    if (out->bundle && both) json_object_set_new(out->bundle, "application/json", both);
    else json_decref(both);
    json_decref(b);
    json_decref(m);
    return out->bundle && both ? TK_OK : (out->ename = "MemoryError", tk_err_nomem(err, "the memory report"));
}

/* --save FILE: FILE.pickle in PyTorch's format (the allocator now, and the
 * recent history as its trace), another name txkernel's own JSON. */
static void mem_save(tk_session *s, tk_dev *d, const char *save, tk_mem_reply *out) {
    size_t sl = strlen(save);
    tk_err err = {0};
    if (sl > 7 && !strcmp(save + sl - 7, ".pickle")) {
        if (tk_snap_write(tk_dev_alloc(d), NULL, save, &err)) {
            out->failed = 1;
            snprintf(out->said, sizeof out->said, "%s", err.msg);
        } else {
            snprintf(out->said, sizeof out->said, "PyTorch memory snapshot written to %s (open it at "
                     "https://pytorch.org/memory_viz)%s\n", save, tk_session_recording(s) ? "" : ". It has no trace: "
                     "the allocator's history is off unless asked; %txmem --record before a run records it");
        }
        return;
    }
    char *js = tk_alloc_snapshot_json(tk_dev_alloc(d));
    FILE *f = js ? fopen(save, "wb") : NULL;
    int bad = !f || fputs(js, f) < 0;
    if (f && fclose(f) != 0) bad = 1;
    if (bad) snprintf(out->said, sizeof out->said, "%s: could not write the snapshot", save);
    else snprintf(out->said, sizeof out->said, "snapshot written to %s\n", save);
    out->failed = bad;
    free(js);
}

/* %txmem: the session's device memory (or none opened yet), its timeline,
 * --save. */
static tk_status mem_cell(tk_session *s, const tk_app_args *w, const char *by, int top, tk_mem_reply *out,
                          tk_err *err) {
    tk_dev *d = tk_session_current_device(s);
    if (!d) {
        out->bundle = tk_bundle_new("No device opened yet in this session: nothing is allocated. "
                                    "Run %%txtrain (or %txdevice) first.");
        json_object_set_new(out->bundle, "application/json", json_pack("{s:s, s:i, s:i}", "device", "none",
                                                                       "allocated", 0, "n_alloc", 0));
    } else {
        out->bundle = tk_report_mem(d, by, top);
    }
    if (!out->bundle) return (out->ename = "MemoryError", tk_err_nomem(err, "the memory report"));
    tk_report_add_host_rss(out->bundle);
    tk_report_add_holder(out->bundle, tk_session_holder(s), 0);
    if (!d) return TK_OK;
    if (tk_app_has(w, "--timeline")) {
        int n = 0;
        const tk_mem_sample *tl = tk_session_timeline(s, &n);
        out->timeline = timeline_bundle(tl, n);
    }
    out->ename = "IOError";
    if (tk_app_arg(w, "--save")) mem_save(s, d, tk_app_arg(w, "--save"), out);
    return TK_OK;
}

tk_status tk_app_mem(tk_session *s, const tk_app_args *w, tk_door door, tk_mem_reply *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    out->ename = "UsageError";
    const char *by = tk_app_arg(w, "--by") ? tk_app_arg(w, "--by") : "owner", *top_s = tk_app_arg(w, "--top");
    long top = top_s ? positive(top_s) : 10;
    if (w->n_plain || w->n_kv) {
        tk_err_set(err, TK_EINVAL, "mem: unexpected '%s'", w->n_plain ? w->plain[0] : w->kv[0]);
        return TK_EINVAL;
    }
    if (strcmp(by, "category") && strcmp(by, "owner") && strcmp(by, "layer")) {
        tk_err_set(err, TK_EINVAL, "--by %s: expected category, owner or layer", by);
        return TK_EINVAL;
    }
    if (top < 1) {
        tk_err_set(err, TK_EINVAL, "--top: expected a positive number, got '%s'", top_s);
        return TK_EINVAL;
    }
    if (tk_app_has(w, "--record")) return mem_record(s, tk_app_arg(w, "--record"), out, err);
    if (tk_app_arg(w, "--snapshot")) return mem_snapshot(s, w, (int)top, out, err);
    return door == TK_DOOR_SHELL ? mem_shell(s, w, by, (int)top, out, err) : mem_cell(s, w, by, (int)top, out, err);
}
