/* snapshot_leak.c — a leak or growth in a snapshot's trace (see
 * snapshot_leak.h).
 *
 * Iterations are the trace's peaks of allocated: a zigzag over the curve
 * with a reversal of a third of its largest fall, so a leak's rising
 * baseline does not hide the iterations. A leak is either the troughs
 * between peaks rising in at least three of four iterations (by at least
 * 1 MiB and 1% of the peak in all), or blocks still live at the end that
 * one frame allocated in at least four iterations, half of them or more.
 * Only a trace of one device is read this way.
 *
 * Guarantees: nothing is called a leak without those figures; rises inside
 * one step that are not a loop's iterations are growth, said as such.
 */
#include "snapshot_leak.h"
#include "tk_host_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct leak_owner {
    char owner[192];
    size_t bytes;
    int blocks, iterations, last_iteration;
} leak_owner;

int snap_find_leak(snap_dec *d, const snap_replay *r, const snap_frames *f) {
    tk_snapshot *s = d->s;
    /* the lists with events: one device's trace only */
    if (s->n_points < 8 || d->n_lists != 1) return 0;
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
    leak_owner *own = tk_calloc(64, sizeof *own);
    if (!peak || !trough || !own) goto oom;
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

    /* the blocks the trace allocated and never freed, by owner, with the
     * iteration (peaks before them) each was allocated in; and the rounds
     * of the user's outermost lines */
    int pt = 0, it = 0, nown = 0, rounds = -1, nlines = 0, several = 0;
    uint64_t first_line = 0, lines[64];
    for (size_t i = 0; i < d->n_ev; i++) {
        const snap_ev *e = &d->ev[i];
        while (pt < n && s->points[pt].event <= (int64_t)i) pt++;
        while (it < np && peak[it] < pt - 1) it++;
        if (e->action != EV_ALLOC) continue;
        uint64_t key = e->stack > 0 ? f->uline[e->stack] : 0;
        if (key) {
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
                    rounds++; /* back to a line this round already ran: the loop's next round */
                    nlines = 0;
                }
                if (nlines < 64) lines[nlines++] = key;
            }
        }
        if (r->pair[i] >= 0 || it < 1) continue;
        const char *o = snap_event_owner(d, f, (int64_t)i);
        int j = 0;
        while (j < nown && strcmp(own[j].owner, o)) j++;
        if (j == nown) {
            if (nown == 64) continue;
            snprintf(own[nown].owner, sizeof own[nown].owner, "%s", o);
            own[nown++].last_iteration = -1;
        }
        own[j].bytes += (size_t)r->bsize[i];
        own[j].blocks++;
        if (it != own[j].last_iteration) own[j].iterations++, own[j].last_iteration = it;
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
     * one-line loop body looks like one step there), a loop's iteration is
     * one that gives back at least half of what it took before the next
     * (its trough halfway down from its peak); rises that keep most of what
     * they took are one step growing. */
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
    snap_bad_nomem(d, "device_traces");
out:
    free(peak);
    free(trough);
    free(own);
    return rc;
}
