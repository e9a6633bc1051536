/* snapshot_trace.h — the snapshot reader's second layer (after decode): the
 * trace replayed as PyTorch's caching allocator ran it. Each alloc's block
 * is the request rounded and split as the allocator does (512 B rounding,
 * the small pool up to 1 MiB, a block split only when what remains is worth
 * a block), so "allocated" means torch.cuda.memory_allocated(); blocks live
 * before the recording began (freed in the trace with no alloc, or live at
 * the end with none) are put back at the start. Then the memory over time,
 * its peak, and each block's lifetime (which event freed it).
 *
 * Guarantees: figures are integer sums of block sizes; the curve ends at
 * the file's own allocated; what the replay could not place is counted
 * (tk_snap_replay), never hidden. Only the snapshot reader's files include it.
 */
#ifndef TK_SNAPSHOT_TRACE_H
#define TK_SNAPSHOT_TRACE_H

#include "snapshot_decode.h"

/* A block live before the recording began. */
typedef struct snap_pre {
    int64_t addr, size;   /* size: the file's when it is live at the end, else the freed request rounded */
    int32_t stack;        /* its frames (the end block's, or the free's) */
    int64_t freed_at;     /* the event that freed it (allocated drops), -1 live at the end */
    int blk;              /* its block in the end state, -1 none */
} snap_pre;

typedef struct snap_replay {
    int64_t *bsize;       /* per event: an alloc's block size (0 for other events) */
    int64_t *pair;        /* per event: an alloc's freeing event (-1: live at the end); a free's alloc,
                             or -2 - k for the k-th block live before the recording, -1 none */
    snap_pre *pre;
    int n_pre;
    int64_t peak_ev;      /* the alloc at the allocated peak; -1 when the end state is the peak */
} snap_replay;

/* Replays d's trace: r's arrays, and s->points, s->trace_peak_allocated,
 * s->peak_time_us and s->replay. 0, or -1 with d->err (host memory). */
int snap_replay_trace(snap_dec *d, snap_replay *r);
void snap_replay_clear(snap_replay *r);

/* Whether alloc event i, or pre-recording block k, is live right after event e. */
static inline int snap_live_at(const snap_replay *r, int64_t i, int64_t e) {
    return i <= e && (r->pair[i] < 0 || r->pair[i] > e);
}
static inline int snap_pre_live_at(const snap_replay *r, int k, int64_t e) {
    return r->pre[k].freed_at < 0 || r->pre[k].freed_at > e;
}

#endif
