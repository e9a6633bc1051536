/* txmem.c — `%txmem`: live device memory of the session, by category, owner
 * or layer; the memory timeline of the last run; the allocator snapshot
 * saved (--save); a PyTorch memory snapshot read and diagnosed (--snapshot).
 *
 * Guarantees: reading memory never allocates on the device; before any run
 * it says so instead of opening a device; reading a PyTorch snapshot needs
 * no device and executes nothing from the file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_magics.h"
#include "tk_host_mem.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_snapshot.h"
#include "tk_txmagics.h"

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
#define TXMEM_RECORD_EVENTS ((size_t)1 << 18) /* %txmem --record: 12 MiB of events */

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

static int txmem_read_snapshot(tk_magic_ctx *m, const char *path, const char *cap, int top, int json_only,
                               const tk_snap_opts *o) {
    tk_err err = {0};
    size_t capacity = 0;
    if (tk_snap_capacity(o->gpu, cap, &capacity, &err)) return tk_magic_error(m, "UsageError", "%%txmem: %s", err.msg);
    tk_snapshot *s = tk_snap_read(path, capacity, &err);
    if (!s) return tk_magic_error(m, "SnapshotError", "%s", err.msg);
    if (tk_snap_plan(s, o, &err)) {
        tk_snap_destroy(&s);
        return tk_magic_error(m, "SnapshotError", "%s", err.msg);
    }
    json_t *b = snapshot_bundle(s, top);
    tk_txemit(m, b, json_only);
    json_decref(b);
    tk_snap_destroy(&s);
    return 0;
}

static int run_txmem(tk_magic_ctx *m) {
    tk_session *s = m->session;
    char **argv = NULL;
    int argc = 0, json_only = 0, timeline = 0, top = 10, rc = 0;
    const char *by = "owner", *save = NULL, *snapshot = NULL, *cap = NULL, *record = NULL;
    tk_snap_opts so = {0};
    if (tk_txargs_split(m->args, &argv, &argc)) return tk_magic_error(m, "UsageError", "unbalanced quotes");
    for (int i = 0; i < argc && !rc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--json")) json_only = 1;
        else if (!strcmp(argv[i], "--timeline")) timeline = 1;
        else if (!strcmp(argv[i], "--by") && v &&
                 (!strcmp(v, "category") || !strcmp(v, "owner") || !strcmp(v, "layer"))) { by = v; i++; }
        else if (!strcmp(argv[i], "--top") && v && atoi(v) > 0) { top = atoi(v); i++; }
        else if (!strcmp(argv[i], "--save") && v) { save = v; i++; }
        else if (!strcmp(argv[i], "--snapshot") && v) { snapshot = v; i++; }
        else if (!strcmp(argv[i], "--gpu") && v) { so.gpu = v; i++; }
        else if (!strcmp(argv[i], "--model") && v) { so.model = v; i++; }
        else if (!strcmp(argv[i], "--data") && v) { so.data = v; i++; }
        else if (!strcmp(argv[i], "--text") && v) { so.text_col = v; i++; }
        else if (!strcmp(argv[i], "--batch") && v && atoi(v) > 0) { so.batch = atoi(v); i++; }
        else if (!strcmp(argv[i], "--seq") && v && atoi(v) > 0) { so.seq = atoi(v); i++; }
        else if (!strcmp(argv[i], "--capacity") && v) { cap = v; i++; }
        else if (!strcmp(argv[i], "--record")) {
            record = "on";
            if (v && (!strcmp(v, "off") || (atol(v) > 0 && strspn(v, "0123456789") == strlen(v)))) { record = v; i++; }
        }
        else
            rc = tk_magic_error(m, "UsageError",
                                "%%txmem: unexpected '%s'\nusage: %%txmem [--by category|owner|layer] [--top N] "
                                "[--timeline] [--json] [--save FILE] [--record [N|off]]\n       %%txmem --snapshot FILE "
                                "[--gpu P | --capacity SIZE] [--model M] [--data FILE [--text COL]] [--batch N --seq N] "
                                "[--top N] [--json]", argv[i]);
    }
    if (!rc && record) {
        /* the allocator's history is off unless asked: a ring of 48-byte events */
        size_t n = !strcmp(record, "off") ? 0 : !strcmp(record, "on") ? TXMEM_RECORD_EVENTS : (size_t)atol(record);
        tk_err err = {0};
        char b[32];
        if (tk_session_record_history(s, n, &err) != TK_OK)
            rc = tk_magic_error(m, "MemoryError", "%s", err.msg);
        else if (n)
            tk_magic_printf(m, "stdout", "Recording the allocator's last %zu events (%s of host memory) from now on: "
                            "the allocations and frees of the runs that follow are the trace %%txmem --save "
                            "FILE.pickle writes. %%txmem --record off stops.\n", n,
                            tk_format_bytes(n * sizeof(tk_alloc_event), b, sizeof b));
        else
            tk_magic_printf(m, "stdout", "The allocator's history is off (what it kept is dropped).\n");
        tk_txargs_free(argv, argc);
        return rc;
    }
    if (!rc && snapshot) {
        rc = txmem_read_snapshot(m, snapshot, cap, top, json_only, &so);
        tk_txargs_free(argv, argc);
        return rc;
    }
    tk_dev *d = tk_session_current_device(s);
    if (!rc && !d) {
        json_t *b = tk_bundle_new("No device opened yet in this session: nothing is allocated. "
                                  "Run %%txtrain (or %txdevice) first.");
        json_object_set_new(b, "application/json", json_pack("{s:s, s:i, s:i}", "device", "none", "allocated", 0,
                                                            "n_alloc", 0));
        tk_report_add_host_rss(b);
        tk_report_add_holder(b, tk_session_holder(s), 0);
        tk_txemit(m, b, json_only);
        json_decref(b);
    } else if (!rc) {
        json_t *b = tk_report_mem(d, by, top);
        tk_report_add_host_rss(b);
        tk_report_add_holder(b, tk_session_holder(s), 0);
        tk_txemit(m, b, json_only);
        json_decref(b);
        if (timeline) {
            int n = 0;
            const tk_mem_sample *tl = tk_session_timeline(s, &n);
            json_t *tb = timeline_bundle(tl, n);
            if (tb) tk_txemit_as(m, tb, json_only, "timeline");
            json_decref(tb);
        }
        size_t sl = save ? strlen(save) : 0;
        if (save && sl > 7 && !strcmp(save + sl - 7, ".pickle")) {
            /* PyTorch's format: the allocator now, and the recent history
             * (the last run's allocations, frees and any OOM) as the trace */
            tk_err err = {0};
            if (tk_snap_write(tk_dev_alloc(d), NULL, save, &err))
                rc = tk_magic_error(m, "IOError", "%s", err.msg);
            else
                tk_magic_printf(m, "stdout", "PyTorch memory snapshot written to %s (open it at "
                                             "https://pytorch.org/memory_viz)%s\n", save,
                                tk_session_recording(s) ? "" : ". It has no trace: the allocator's history is off "
                                "unless asked; %txmem --record before a run records it");
        } else if (save) {
            char *js = tk_alloc_snapshot_json(tk_dev_alloc(d));
            FILE *f = js ? fopen(save, "wb") : NULL;
            if (!f || fputs(js, f) < 0 || fclose(f) != 0)
                rc = tk_magic_error(m, "IOError", "%s: could not write the snapshot", save);
            else
                tk_magic_printf(m, "stdout", "snapshot written to %s\n", save);
            free(js);
        }
    }
    tk_txargs_free(argv, argc);
    return rc;
}

static const tk_magic_def TXMEM[] = {
    {"txmem", TK_MAGIC_LINE, run_txmem, "live device memory: by category, owner or layer; timeline; a PyTorch snapshot diagnosed",
     "%txmem [--by category|owner|layer] [--top N] [--timeline] [--json] [--save FILE]\n"
     "%txmem --record [N|off]\n"
     "%txmem --snapshot FILE [--gpu P | --capacity SIZE] [--model M] [--data FILE [--text COL]]\n"
     "       [--batch N --seq N] [--top N] [--json]\n\n"
     "Capacity, free, allocated, reserved and peaks of the session's device (exact bytes\n"
     "from the caching allocator), the live bytes per category, and the top owners (HF\n"
     "module names) or layers. --timeline charts allocated/reserved at each step of the\n"
     "last run. --json prints the same as JSON. --save FILE.pickle writes a PyTorch memory\n"
     "snapshot (the allocator now, and as its trace the allocations and frees recorded\n"
     "since --record: the allocator's history is off unless asked, as in PyTorch's\n"
     "torch.cuda.memory._record_memory_history; --record keeps the last N events, 262144\n"
     "by default, 48 bytes each; --record off stops);\n"
     "--save FILE (another name) writes txkernel's segments, blocks\n"
     "and owners to FILE (JSON).\n\n"
     "--snapshot FILE reads a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's\n"
     "pickle, or its JSON form; nothing in it is executed) and shows reserved, allocated,\n"
     "requested, the largest free block, segments by pool and stream, who holds the live\n"
     "memory (innermost frame of your code: \"cell, line N\"; C++ frames are never shown as\n"
     "code), each device when there are several, the memory over the trace, what ran at\n"
     "the peak and at the OOM (external_annotations, else the frames), the diagnosis (a\n"
     "leak: memory kept from one loop iteration to the next; growth inside one step is\n"
     "not one) and fixes as PyTorch code. --gpu/--capacity give the card's size to judge\n"
     "it against. The model is named with its evidence (bert, llama, qwen, mistral, gpt2,\n"
     "opt, decoder or unknown); only a BERT (from its blocks' sizes, or --model NAME|DIR)\n"
     "is planned, at the batch x seq the activations show (or --batch/--seq), and its plan\n"
     "shown only when it agrees with the file; --data FILE gives the token lengths and\n"
     "the max_length fix."},
};

int tk_magics_register_txmem(tk_magics *m) { return tk_magics_add_table(m, TXMEM, 1); }
