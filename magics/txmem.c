/* txmem.c — `%txmem`: live device memory of the session, by category, owner
 * or layer; the memory timeline of the last run; the allocator snapshot.
 *
 * Guarantees: reading memory never allocates on the device; before any run
 * it says so instead of opening a device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_magics.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_txmagics.h"

static json_t *timeline_bundle(const tk_mem_sample *tl, int n) {
    double *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    double *y = malloc((size_t)(n > 0 ? n : 1) * 3 * sizeof *y);
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

static int run_txmem(tk_magic_ctx *m) {
    tk_session *s = m->session;
    char **argv = NULL;
    int argc = 0, json_only = 0, timeline = 0, top = 10, rc = 0;
    const char *by = "owner", *snapshot = NULL;
    if (tk_txargs_split(m->args, &argv, &argc)) return tk_magic_error(m, "UsageError", "unbalanced quotes");
    for (int i = 0; i < argc && !rc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--json")) json_only = 1;
        else if (!strcmp(argv[i], "--timeline")) timeline = 1;
        else if (!strcmp(argv[i], "--by") && v &&
                 (!strcmp(v, "category") || !strcmp(v, "owner") || !strcmp(v, "layer"))) { by = v; i++; }
        else if (!strcmp(argv[i], "--top") && v && atoi(v) > 0) { top = atoi(v); i++; }
        else if (!strcmp(argv[i], "--snapshot") && v) { snapshot = v; i++; }
        else
            rc = tk_magic_error(m, "UsageError",
                                "%%txmem: unexpected '%s'\nusage: %%txmem [--by category|owner|layer] [--top N] "
                                "[--timeline] [--json] [--snapshot FILE]", argv[i]);
    }
    tk_dev *d = tk_session_current_device(s);
    if (!rc && !d) {
        json_t *b = tk_bundle_new("No device opened yet in this session: nothing is allocated. "
                                  "Run %%txtrain (or %txdevice) first.");
        json_object_set_new(b, "application/json", json_pack("{s:s, s:i, s:i}", "device", "none", "allocated", 0,
                                                            "n_alloc", 0));
        tk_txemit(m, b, json_only);
        json_decref(b);
    } else if (!rc) {
        json_t *b = tk_report_mem(d, by, top);
        tk_txemit(m, b, json_only);
        json_decref(b);
        if (timeline) {
            int n = 0;
            const tk_mem_sample *tl = tk_session_timeline(s, &n);
            json_t *tb = timeline_bundle(tl, n);
            if (tb) tk_txemit_as(m, tb, json_only, "timeline");
            json_decref(tb);
        }
        if (snapshot) {
            char *js = tk_alloc_snapshot_json(tk_dev_alloc(d));
            FILE *f = js ? fopen(snapshot, "wb") : NULL;
            if (!f || fputs(js, f) < 0 || fclose(f) != 0)
                rc = tk_magic_error(m, "IOError", "%s: could not write the snapshot", snapshot);
            else
                tk_magic_printf(m, "stdout", "snapshot written to %s\n", snapshot);
            free(js);
        }
    }
    tk_txargs_free(argv, argc);
    return rc;
}

static const tk_magic_def TXMEM[] = {
    {"txmem", TK_MAGIC_LINE, run_txmem, "live device memory: by category, owner or layer; timeline; snapshot",
     "%txmem [--by category|owner|layer] [--top N] [--timeline] [--json] [--snapshot FILE]\n\n"
     "Capacity, free, allocated, reserved and peaks of the session's device (exact bytes\n"
     "from the caching allocator), the live bytes per category, and the top owners (HF\n"
     "module names) or layers. --timeline charts allocated/reserved at each step of the\n"
     "last run. --json prints the same as JSON. --snapshot writes segments, blocks and\n"
     "owners to FILE."},
};

int tk_magics_register_txmem(tk_magics *m) { return tk_magics_add_table(m, TXMEM, 1); }
