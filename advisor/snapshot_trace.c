/* snapshot_trace.c — a PyTorch snapshot's trace (see snapshot_internal.h):
 * each event kept as a 48-byte record as it is read (a pickle's events are
 * streamed by tk_pickle and freed), then the memory over time, the leak or
 * the growth inside one step, and what ran at the peak, at the OOM and when
 * each owner's largest block was allocated.
 *
 * Guarantees: a bad event is a one-line error naming device_traces[d][i]
 * and the field; memory follows the number of events (the records, the
 * points, the interned owners and phases), never the file's bytes.
 */
#include "snapshot_internal.h"
#include "tk_host_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The index of str in the interned strings (added when new), -1 when host
 * memory runs out. */
static int intern(snap_ctx *c, const char *str) {
    uint64_t h = UINT64_C(1469598103934665603);
    for (const char *p = str; *p; p++) h = (h ^ (unsigned char)*p) * UINT64_C(1099511628211);
    if ((size_t)c->n_strs * 2 + 2 > c->str_tab_cap) {
        size_t cap = c->str_tab_cap ? c->str_tab_cap * 2 : 256;
        int32_t *t = tk_calloc(cap, sizeof *t);
        if (!t) return -1;
        for (int i = 0; i < c->n_strs; i++) {
            uint64_t g = UINT64_C(1469598103934665603);
            for (const char *p = c->strs[i]; *p; p++) g = (g ^ (unsigned char)*p) * UINT64_C(1099511628211);
            size_t k = (size_t)g & (cap - 1);
            while (t[k]) k = (k + 1) & (cap - 1);
            t[k] = i + 1;
        }
        free(c->str_tab);
        c->str_tab = t;
        c->str_tab_cap = cap;
    }
    size_t k = (size_t)h & (c->str_tab_cap - 1);
    while (c->str_tab[k]) {
        if (!strcmp(c->strs[c->str_tab[k] - 1], str)) return c->str_tab[k] - 1;
        k = (k + 1) & (c->str_tab_cap - 1);
    }
    if (c->n_strs == c->strs_cap) {
        int cap = c->strs_cap ? c->strs_cap * 2 : 64;
        char **v = tk_realloc(c->strs, (size_t)cap * sizeof *v);
        if (!v) return -1;
        c->strs = v;
        c->strs_cap = cap;
    }
    if (!(c->strs[c->n_strs] = tk_strdup(str))) return -1;
    c->str_tab[k] = ++c->n_strs;
    return c->n_strs - 1;
}

static const char *interned(const snap_ctx *c, int32_t i) { return i >= 0 && i < c->n_strs ? c->strs[i] : ""; }

/* One event of the device list `list` (its identity: the lists are put in
 * order by the caller later): checked, and kept as a record. */
static int ingest_event(snap_ctx *c, sv e, const void *list) {
    tk_snapshot *s = c->s;
    int li = 0;
    while (li < c->n_lists && c->lists[li] != list) li++;
    if (li == c->n_lists) {
        if (li == 64) return snap_bad(c, "device_traces", "more than 64 devices' traces");
        c->lists[c->n_lists++] = list;
    }
    char w[96];
    snprintf(w, sizeof w, "device_traces[%d][%zu]", li, c->list_items[li]++);
    if (!sv_is_dict(e)) return snap_bad(c, w, "expected a dict (a trace event)");
    const char *a = sv_str(sv_get(e, "action"));
    if (!a) return snap_bad(c, w, "'action' missing or not a string");
    snap_ev r = {.owner = -1, .phase = -1, .time_us = -1, .list = (uint8_t)li};
    if (snap_field_size(c, e, "size", w, 1, &r.size)) return -1;
    sv_int(sv_get(e, "time_us"), &r.time_us);
    sv_int(sv_get(e, "addr"), &r.addr);
    r.action = !strcmp(a, "alloc")                                         ? EV_ALLOC
               : !strcmp(a, "free_completed")                              ? EV_FREE
               : !strcmp(a, "segment_alloc") || !strcmp(a, "segment_map")  ? EV_SEG_ALLOC
               : !strcmp(a, "segment_free") || !strcmp(a, "segment_unmap") ? EV_SEG_FREE
               : !strcmp(a, "oom")                                         ? EV_OOM
                                                                           : EV_OTHER;
    sv frames = sv_get(e, "frames");
    char buf[192];
    if (r.action == EV_ALLOC) {
        snap_owner_of(frames, buf, sizeof buf);
        if ((r.owner = intern(c, buf)) < 0) return snap_bad_nomem(c, "device_traces");
        if (snap_outer_user_line(frames, &r.uline) && !r.uline) r.uline = 1;
    }
    if (r.action != EV_OTHER && snap_phase_from_frames(frames, buf, 64) && (r.phase = intern(c, buf)) < 0)
        return snap_bad_nomem(c, "device_traces");
    if (r.action == EV_OOM) {
        int64_t fr = 0;
        if (snap_field_size(c, e, "device_free", w, 1, &fr)) return -1;
        s->has_oom = 1;
        c->oom_list = li;
        s->oom_size = (size_t)r.size;
        s->oom_device_free = (size_t)fr;
        s->oom_time_us = r.time_us;
    }
    if (c->n_ev == c->ev_cap) {
        size_t cap = c->ev_cap ? c->ev_cap * 2 : 1024;
        snap_ev *v = tk_realloc(c->ev, cap * sizeof *v);
        if (!v) return snap_bad_nomem(c, "device_traces");
        c->ev = v;
        c->ev_cap = cap;
    }
    c->ev[c->n_ev++] = r;
    s->n_trace++;
    return 0;
}

/* The streaming reader's callback: each trace event as it is read. */
int snap_on_event(void *cx, const tk_pval *list, const tk_pval *item, tk_err *err) {
    (void)err;
    return ingest_event(cx, (sv){item, NULL}, list);
}

/* After the file: the lists in device order (their places in
 * device_traces), the OOM's device, and the memory over time from the
 * records. JSON's events are read here (the pickle's were streamed). */
int snap_build_trace(snap_ctx *c, sv traces, int streamed) {
    tk_snapshot *s = c->s;
    int dev_of[64];
    if (!sv_ok(traces)) return 0;
    if (!sv_is_list(traces)) return snap_bad(c, "device_traces", "expected a list (one per device)");
    for (size_t d = 0; d < sv_len(traces); d++) {
        sv t = sv_at(traces, d);
        if (!sv_is_list(t)) return snap_bad(c, "device_traces", "each device's trace must be a list");
        for (size_t i = 0; !streamed && i < sv_len(t); i++)
            if (ingest_event(c, sv_at(t, i), t.p ? (const void *)t.p : (const void *)t.j)) return -1;
    }
    for (int li = 0; li < c->n_lists; li++) {
        dev_of[li] = li;
        for (size_t d = 0; d < sv_len(traces); d++) {
            sv t = sv_at(traces, d);
            if ((t.p ? (const void *)t.p : (const void *)t.j) == c->lists[li]) dev_of[li] = (int)d;
        }
    }
    if (s->has_oom) s->oom_device = dev_of[c->oom_list];
    for (size_t i = 0; i < c->n_ev; i++) c->ev[i].list = (uint8_t)dev_of[c->ev[i].list];
    s->points = tk_calloc(c->n_ev ? c->n_ev : 1, sizeof *s->points);
    if (!s->points) return snap_bad_nomem(c, "device_traces");
    /* Deltas first; the trace may start after the first allocation, so the
     * curve is anchored at the end, where the snapshot's figures are known. */
    int64_t alloc = 0, res = 0;
    for (size_t i = 0; i < c->n_ev; i++) {
        const snap_ev *r = &c->ev[i];
        if (r->action == EV_ALLOC) alloc += r->size;
        else if (r->action == EV_FREE) alloc -= r->size;
        else if (r->action == EV_SEG_ALLOC) res += r->size;
        else if (r->action == EV_SEG_FREE) res -= r->size;
        else continue;
        tk_snap_point *pt = &s->points[s->n_points++];
        pt->event = (int64_t)i;
        pt->time_us = r->time_us;
        pt->allocated = (size_t)alloc; /* relative for now */
        pt->reserved = (size_t)res;
    }
    int64_t a0 = (int64_t)s->allocated - alloc, r0 = (int64_t)s->reserved - res;
    for (int i = 0; i < s->n_points; i++) {
        int64_t av = a0 + (int64_t)s->points[i].allocated, rv = r0 + (int64_t)s->points[i].reserved;
        s->points[i].allocated = (size_t)(av < 0 ? 0 : av);
        s->points[i].reserved = (size_t)(rv < 0 ? 0 : rv);
        if (s->points[i].allocated > s->trace_peak_allocated) {
            s->trace_peak_allocated = s->points[i].allocated;
            s->peak_time_us = s->points[i].time_us;
        }
    }
    if (s->allocated > s->trace_peak_allocated) s->trace_peak_allocated = s->allocated;
    return 0;
}

/* Blocks the trace allocated, by address: an open-addressing table with no
 * deletion (a free marks its entry), enough for one pass over the trace. */
typedef struct live_ent {
    int64_t addr;
    int event, iteration;
    size_t size;
    unsigned char used, freed;
} live_ent;

static live_ent *live_slot(live_ent *t, size_t mask, int64_t addr) {
    size_t h = (size_t)(((uint64_t)addr * UINT64_C(0x9E3779B97F4A7C15)) >> 17) & mask;
    while (t[h].used && t[h].addr != addr) h = (h + 1) & mask;
    return &t[h];
}

static int cmp_ent_event(const void *a, const void *b) {
    const live_ent *x = *(live_ent *const *)a, *y = *(live_ent *const *)b;
    return (x->event > y->event) - (x->event < y->event);
}

typedef struct leak_owner {
    char owner[192];
    size_t bytes;
    int blocks, iterations, last_iteration;
} leak_owner;

/* Iterations are the trace's peaks of allocated: a zigzag over the curve
 * with a reversal of a third of its largest fall, so a leak's rising
 * baseline does not hide the iterations. A leak is either the troughs
 * between peaks rising in at least three of four iterations (by at least
 * 1 MiB and 1% of the peak in all), or blocks still live at the end that
 * one frame allocated in at least four iterations, half of them or more.
 * Only a trace of one device is read this way. */
int snap_find_leak(snap_ctx *c) {
    tk_snapshot *s = c->s;
    /* the lists with events: one device's trace only */
    if (s->n_points < 8 || c->n_lists != 1) return 0;
    int n = s->n_points, np = 0, nt = 0, rc = -1;
    size_t drop = 0, runmax = 0;
    for (int i = 0; i < n; i++) {
        size_t v = s->points[i].allocated;
        if (v > runmax) runmax = v;
        if (runmax - v > drop) drop = runmax - v;
    }
    if (!drop) return 0;
    size_t thr = drop / 3;
    int *peak = tk_malloc((size_t)n * sizeof *peak);
    size_t *trough = tk_malloc((size_t)n * sizeof *trough);
    live_ent *tab = NULL, **surv = NULL;
    leak_owner *own = NULL;
    if (!peak || !trough) goto oom;
    int rising = 1, hi_i = 0;
    size_t hi = s->points[0].allocated, lo = hi;
    for (int i = 0; i < n; i++) {
        size_t v = s->points[i].allocated;
        if (rising) {
            if (v >= hi) hi = v, hi_i = i;
            else if (hi - v > thr) peak[np++] = hi_i, rising = 0, lo = v;
        } else {
            if (v <= lo) lo = v;
            else if (v - lo > thr) trough[nt++] = lo, rising = 1, hi = v, hi_i = i;
        }
    }
    s->leak_iterations = np;
    int first = nt >= 5 ? 1 : 0, pairs = nt - 1 - first, rises = 0;
    for (int k = first + 1; k < nt; k++) rises += trough[k] > trough[k - 1];
    size_t total = nt >= 4 && trough[nt - 1] > trough[first] ? trough[nt - 1] - trough[first] : 0;
    int steady = nt >= 4 && rises * 4 >= pairs * 3 && total >= ((size_t)1 << 20) &&
                 total >= s->trace_peak_allocated / 100;

    /* the blocks the trace allocated and never freed, with the iteration
     * (peaks before them) each was allocated in */
    size_t cap = 16;
    while (cap < 2 * c->n_ev + 2) cap <<= 1;
    tab = tk_calloc(cap, sizeof *tab);
    if (!tab) goto oom;
    int pt = -1, it = 0, nsurv = 0, rounds = -1, nlines = 0, several = 0;
    uint64_t first_line = 0;
    uint64_t lines[64];
    for (size_t i = 0; i < c->n_ev; i++) {
        const snap_ev *e = &c->ev[i];
        int64_t addr = e->addr, size = e->size;
        int is_alloc = e->action == EV_ALLOC, is_free = e->action == EV_FREE;
        uint64_t key = e->uline;
        if (is_alloc && key) {
            if (rounds < 0) rounds = 0;
            /* the lines inside the iterations (after the first peak): one line there tells nothing */
            if (it >= 1) {
                if (!first_line) first_line = key;
                several |= key != first_line;
            }
            if (!nlines || lines[nlines - 1] != key) {
                int k = 0;
                while (k < nlines && lines[k] != key) k++;
                if (k < nlines) {
                    rounds++;          /* back to a line this round already ran: the loop's next round */
                    nlines = 0;
                }
                if (nlines < 64) lines[nlines++] = key;
            }
        }
        if (e->action != EV_OTHER && e->action != EV_OOM) pt++;
        while (it < np && peak[it] < pt) it++;
        if (!is_alloc && !is_free) continue;
        live_ent *l = live_slot(tab, cap - 1, addr);
        if (is_alloc)
            *l = (live_ent){addr, (int)i, it, (size_t)(size > 0 ? size : 0), 1, 0};
        else if (l->used)
            l->freed = 1;
    }
    for (size_t h = 0; h < cap; h++) nsurv += tab[h].used && !tab[h].freed && tab[h].iteration >= 1;
    surv = tk_malloc((size_t)(nsurv ? nsurv : 1) * sizeof *surv);
    own = tk_calloc(64, sizeof *own);
    if (!surv || !own) goto oom;
    nsurv = 0;
    for (size_t h = 0; h < cap; h++)
        if (tab[h].used && !tab[h].freed && tab[h].iteration >= 1) surv[nsurv++] = &tab[h];
    qsort(surv, (size_t)nsurv, sizeof *surv, cmp_ent_event);
    int nown = 0;
    for (int k = 0; k < nsurv; k++) {
        const char *o = interned(c, c->ev[surv[k]->event].owner);
        int j = 0;
        while (j < nown && strcmp(own[j].owner, o)) j++;
        if (j == nown) {
            if (nown == 64) continue;
            snprintf(own[nown].owner, sizeof own[nown].owner, "%s", o);
            own[nown++].last_iteration = -1;
        }
        own[j].bytes += surv[k]->size;
        own[j].blocks++;
        if (surv[k]->iteration != own[j].last_iteration) own[j].iterations++, own[j].last_iteration = surv[k]->iteration;
    }
    const leak_owner *best = NULL;
    for (int j = 0; j < nown; j++)
        if (own[j].iterations >= 3 && (!best || own[j].bytes > best->bytes)) best = &own[j];
    int kept = best && best->iterations >= 4 && best->iterations * 2 >= np && best->bytes >= ((size_t)1 << 20);
    /* A repeating loop shows in the user's outermost frame going back to a
     * line it left (the loop's body starting again); one step runs its
     * lines once (forward, backward, optimizer step), however many layers
     * pile activations up inside the forward. Without a Python frame in
     * the trace, or when all of the iterations' come from one line (a
     * one-line loop body looks like one step there), a loop's iteration is one that gives back at
     * least half of what it took before the next (its trough halfway down
     * from its peak); rises that keep most of what they took are one step
     * growing. */
    int loop;
    if (rounds >= 0 && several)
        loop = rounds >= 3;
    else {
        int returns = 0;
        for (int k = 0; k < nt && k < np; k++) {
            size_t prev = k ? trough[k - 1] : s->points[0].allocated, top = s->points[peak[k]].allocated;
            if (top > prev && trough[k] <= prev + (top - prev) / 2) returns++;
        }
        loop = nt >= 4 && returns * 4 >= nt * 3;
    }
    if ((steady || kept) && !loop) {
        s->has_growth = 1;
        s->growth_rises = np;
        s->growth_bytes = s->trace_peak_allocated > s->points[0].allocated
                              ? s->trace_peak_allocated - s->points[0].allocated : 0;
    } else if (steady || kept) {
        s->has_leak = 1;
        s->leak_total = steady ? total : best->bytes;
        s->leak_per_iteration = steady ? total / (size_t)pairs : best->bytes / (size_t)best->iterations;
    }
    if (best) {
        snprintf(s->leak_owner, sizeof s->leak_owner, "%s", best->owner);
        s->leak_owner_bytes = best->bytes;
        s->leak_owner_iterations = best->iterations;
        s->leak_owner_blocks = best->blocks;
    }
    rc = 0;
    goto out;
oom:
    snap_bad_nomem(c, "device_traces");
out:
    free(peak);
    free(trough);
    free(tab);
    free(surv);
    free(own);
    return rc;
}

/* An annotation's name as a phase: "Optimizer.step#AdamW.step" ->
 * "Optimizer.step (AdamW)", "enumerate(DataLoader)#..." -> "DataLoader",
 * anything else (a user's record_function) as it is. */
static void phase_name(const char *name, char *out, size_t n) {
    const char *h = strchr(name, '#');
    if (!strncmp(name, "enumerate(DataLoader)", 21)) snprintf(out, n, "DataLoader");
    else if (!strncmp(name, "Optimizer.", 10) && h) {
        const char *k = strchr(h + 1, '.');
        snprintf(out, n, "%.*s (%.*s)", (int)(h - name), name, k ? (int)(k - h - 1) : (int)strlen(h + 1), h + 1);
    } else
        snprintf(out, n, "%.*s", h ? (int)(h - name) : (int)strlen(name), name);
}

/* The innermost external_annotations range open at time t on device d
 * (the annotations are in time order: a START opens, its END closes). 1
 * with out set. */
static int phase_from_annotations(sv ann, int device, int64_t t, char *out, size_t n) {
    enum { DEPTH = 16 };
    const char *open[DEPTH];
    int depth = 0;
    if (t < 0 || !sv_is_list(ann)) return 0;
    for (size_t i = 0; i < sv_len(ann); i++) {
        sv a = sv_at(ann, i);
        int64_t tus = -1, dev = device;
        const char *name = sv_str(sv_get(a, "name")), *stage = sv_str(sv_get(a, "stage"));
        if (!name || !stage || sv_int(sv_get(a, "time_us"), &tus)) continue;
        sv_int(sv_get(a, "device"), &dev);
        if (dev != device) continue;
        if (tus > t) break;
        if (!strcmp(stage, "START")) {
            if (depth < DEPTH) open[depth++] = name;
        } else if (!strcmp(stage, "END")) {
            for (int k = depth - 1; k >= 0; k--)
                if (!strcmp(open[k], name)) {
                    memmove(&open[k], &open[k + 1], (size_t)(depth - k - 1) * sizeof *open);
                    depth--;
                    break;
                }
        }
    }
    if (!depth) return 0;
    phase_name(open[depth - 1], out, n);
    return 1;
}

/* The phase at time t on a device: the annotations' innermost open range,
 * else what the event's own frames showed (phase, interned; -1 none). */
static void phase_at(const snap_ctx *c, sv ann, int device, int64_t t, int32_t phase, char *out, size_t n) {
    if (!phase_from_annotations(ann, device, t, out, n)) snprintf(out, n, "%s", interned(c, phase));
}

/* The phase at the peak, at the OOM, and for each owner at the allocation
 * of its largest live block (the trace's last alloc at that address). */
int snap_find_phases(snap_ctx *c, sv ann) {
    tk_snapshot *s = c->s;
    size_t best = 0;
    int64_t peak_ev = -1;
    for (int i = 0; i < s->n_points; i++)
        if (s->points[i].allocated > best) best = s->points[i].allocated, peak_ev = s->points[i].event;
    if (peak_ev >= 0) {
        const snap_ev *e = &c->ev[peak_ev];
        phase_at(c, ann, e->list, s->peak_time_us, e->phase, s->phase_at_peak, sizeof s->phase_at_peak);
    }
    for (size_t i = c->n_ev; s->has_oom && i-- > 0;)
        if (c->ev[i].action == EV_OOM) {
            phase_at(c, ann, s->oom_device, s->oom_time_us, c->ev[i].phase, s->phase_at_oom, sizeof s->phase_at_oom);
            break;
        }
    if (!s->has_annotations || !s->n_owners) return 0;
    /* the last alloc of each address, in a table sized for the trace */
    size_t cap = 16;
    while (cap < 2 * c->n_ev + 2) cap <<= 1;
    struct slot { int64_t addr; size_t event; int used; } *tab = tk_calloc(cap, sizeof *tab);
    if (!tab) return snap_bad_nomem(c, "device_traces");
    for (size_t i = 0; i < c->n_ev; i++) {
        if (c->ev[i].action != EV_ALLOC) continue;
        int64_t addr = c->ev[i].addr;
        size_t h = (size_t)(((uint64_t)addr * UINT64_C(0x9E3779B97F4A7C15)) >> 17) & (cap - 1);
        while (tab[h].used && tab[h].addr != addr) h = (h + 1) & (cap - 1);
        tab[h] = (struct slot){addr, i, 1};
    }
    for (int k = 0; k < s->n_owners; k++) {
        int64_t addr = s->owners[k].largest_addr;
        size_t h = (size_t)(((uint64_t)addr * UINT64_C(0x9E3779B97F4A7C15)) >> 17) & (cap - 1);
        while (tab[h].used && tab[h].addr != addr) h = (h + 1) & (cap - 1);
        if (!tab[h].used) continue;
        const snap_ev *e = &c->ev[tab[h].event];
        phase_at(c, ann, e->list, e->time_us, e->phase, s->owners[k].phase, sizeof s->owners[k].phase);
    }
    free(tab);
    return 0;
}
