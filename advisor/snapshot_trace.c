/* snapshot_trace.c — a PyTorch snapshot's trace replayed as its caching
 * allocator ran it (see snapshot_trace.h).
 *
 * PyTorch's trace records each alloc's requested size; the allocator hands
 * out a block of that rounded up to 512 B, taken from the front of a free
 * block and split off only when the rest is worth keeping: 512 B or more in
 * the small pool (rounded requests up to 1 MiB) or with expandable
 * segments, more than 1 MiB in the large pool (and only below
 * max_split_size). Otherwise the whole free block is the allocation, and
 * memory_allocated() counts it. Free blocks merge with their free
 * neighbours inside one segment when a block's free completes. The replay
 * keeps the free blocks by start and by end, so each alloc finds the free
 * block it was carved from at its own address.
 *
 * allocated drops at free_requested (PyTorch's counter does, before the
 * block's streams finish), the block returns to the free pool at
 * free_completed. A txkernel snapshot (txk train/plan --snapshot) records
 * block sizes already, so its sizes are taken as they are.
 *
 * Guarantees: memory follows the number of events; an alloc the replay
 * cannot place (no free block starts at its address: the file and the
 * replay disagree about the layout) takes its rounded request and is
 * counted in s->replay.unplaced.
 */
#include "snapshot_trace.h"
#include "tk_host_mem.h"

#include <stdlib.h>
#include <string.h>

#define MIN_BLOCK ((int64_t)512)
#define SMALL_SIZE ((int64_t)1 << 20)

static int64_t round_size(int64_t n) {
    return n < MIN_BLOCK ? MIN_BLOCK : n > INT64_MAX - MIN_BLOCK ? n : (n + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

/* Addresses and sizes come from the file: their sums and differences wrap
 * (as the device's addresses would) instead of overflowing. */
static int64_t add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }

/* The free pool: free blocks by start and by end, and where segments start
 * (free blocks never merge across a segment's start). */
typedef struct pool { snap_map by_start, by_end, seg_start; int expandable; int64_t max_split; } pool;

static int add_free(pool *p, int64_t a, int64_t n) {
    if (n <= 0) return 0;
    return snap_map_put(&p->by_start, a, n) || snap_map_put(&p->by_end, add(a, n), a);
}

static void take_free(pool *p, int64_t a, int64_t n) {
    snap_map_del(&p->by_start, a);
    snap_map_del(&p->by_end, add(a, n));
}

/* [a, a + n) becomes free, merged with its free neighbours in its segment. */
static int release(pool *p, int64_t a, int64_t n) {
    int64_t start = a, end = add(a, n), v, g;
    if (!snap_map_get(&p->seg_start, end, &v) && snap_map_get(&p->by_start, end, &g)) {
        take_free(p, end, g);
        end = add(end, g);
    }
    if (!snap_map_get(&p->seg_start, a, &v) && snap_map_get(&p->by_end, a, &g)) {
        take_free(p, g, sub(a, g));
        start = g;
    }
    return add_free(p, start, sub(end, start));
}

/* The block an alloc of `size` at addr takes, carved from the free block
 * that starts there; -1 when none does. */
static int64_t carve(pool *p, int64_t addr, int64_t size, int *err) {
    int64_t rs = round_size(size), g;
    if (!snap_map_get(&p->by_start, addr, &g) || g < rs) return -1;
    take_free(p, addr, g);
    int64_t rem = g - rs;
    int split = rs <= SMALL_SIZE || p->expandable ? rem >= MIN_BLOCK
                                                  : (p->max_split < 0 || rs < p->max_split) && rem > SMALL_SIZE;
    if (!split) return g;
    if (add_free(p, add(addr, rs), rem)) *err = 1;
    return rs;
}

/* Removes [a, a + n) from the free pool (a segment unmapped or freed): the
 * free block that holds it shrinks. */
static int unmap(pool *p, int64_t a, int64_t n) {
    int64_t g, st;
    if (snap_map_get(&p->by_start, a, &g)) {
        take_free(p, a, g);
        return add_free(p, add(a, n), g - n);
    }
    if (snap_map_get(&p->by_end, add(a, n), &st)) {
        take_free(p, st, sub(add(a, n), st));
        return add_free(p, st, sub(a, st));
    }
    return 0;
}

static int cmp_pre_addr(const void *x, const void *y) {
    const snap_pre *a = x, *b = y;
    return (a->addr > b->addr) - (a->addr < b->addr);
}

static int add_pre(snap_dec *d, snap_replay *r, int *cap, snap_pre p) {
    if (r->n_pre == *cap) {
        int c = *cap ? *cap * 2 : 64;
        snap_pre *v = tk_realloc(r->pre, (size_t)c * sizeof *v);
        if (!v) return snap_bad_nomem(d, "device_traces");
        r->pre = v;
        *cap = c;
    }
    r->pre[r->n_pre++] = p;
    return 0;
}

/* Pass 1: each alloc paired with its free; frees with no alloc and end
 * blocks with none are the blocks live before the recording; segments the
 * trace did not create were there before it too (seg: their starts). */
static int pair_events(snap_dec *d, snap_replay *r, snap_map *seg_pre, int *pre_cap) {
    snap_map live = {0}, open_pre = {0}, segs = {0};
    int64_t v;
    int rc = -1;
    for (size_t i = 0; i < d->n_ev; i++) {
        const snap_ev *e = &d->ev[i];
        switch (e->action) {
        case EV_ALLOC:
            if (snap_map_put(&live, e->addr, (int64_t)i)) goto oom;
            break;
        case EV_FREE_REQ:
        case EV_FREE:
            if (snap_map_get(&live, e->addr, &v)) {
                if (r->pair[v] < 0) r->pair[v] = (int64_t)i;
                r->pair[i] = v;
                if (e->action == EV_FREE) snap_map_del(&live, e->addr);
            } else if (snap_map_get(&open_pre, e->addr, &v)) {
                r->pair[i] = -2 - v; /* the completion of a pre-recording block's free */
                if (e->action == EV_FREE) snap_map_del(&open_pre, e->addr);
            } else {
                snap_pre p = {e->addr, d->by_txkernel ? e->size : round_size(e->size), e->stack, (int64_t)i, -1};
                if (add_pre(d, r, pre_cap, p)) goto out;
                r->pair[i] = -2 - (r->n_pre - 1);
                if (e->action == EV_FREE_REQ && snap_map_put(&open_pre, e->addr, r->n_pre - 1)) goto oom;
            }
            break;
        case EV_SEG_ALLOC:
        case EV_SEG_MAP:
            if (snap_map_put(&segs, e->addr, e->size)) goto oom;
            break;
        case EV_SEG_FREE:
            if (!snap_map_del(&segs, e->addr) && snap_map_put(seg_pre, e->addr, e->size)) goto oom;
            break;
        default:
            break;
        }
    }
    for (int k = 0; k < d->n_segs; k++)
        if (!snap_map_get(&segs, d->segs[k].addr, &v) && snap_map_put(seg_pre, d->segs[k].addr, d->segs[k].size))
            goto oom;
    for (int k = 0; k < d->n_blks; k++) {
        const snap_blk *b = &d->blks[k];
        if (b->state != BLK_LIVE || snap_map_get(&live, b->addr, &v)) continue;
        if (add_pre(d, r, pre_cap, (snap_pre){b->addr, b->size, b->stack, -1, k})) goto out;
    }
    rc = 0;
    goto out;
oom:
    snap_bad_nomem(d, "device_traces");
out:
    snap_map_clear(&live);
    snap_map_clear(&open_pre);
    snap_map_clear(&segs);
    return rc;
}

/* The free blocks of the segments that were there before the recording:
 * each one less the blocks live in it then. */
static int seed_pool(snap_dec *d, snap_replay *r, snap_map *seg_pre, pool *p) {
    int n = 0;
    for (size_t h = 0; h < seg_pre->cap; h++) n += seg_pre->used[h];
    snap_pre *segs = tk_malloc((size_t)(n ? n : 1) * sizeof *segs), *pre = tk_malloc((size_t)(r->n_pre ? r->n_pre : 1) * sizeof *pre);
    if (!segs || !pre) {
        free(segs);
        free(pre);
        return snap_bad_nomem(d, "device_traces");
    }
    n = 0;
    for (size_t h = 0; h < seg_pre->cap; h++)
        if (seg_pre->used[h]) segs[n++] = (snap_pre){.addr = seg_pre->key[h], .size = seg_pre->val[h]};
    if (r->n_pre) memcpy(pre, r->pre, (size_t)r->n_pre * sizeof *pre);
    qsort(segs, (size_t)n, sizeof *segs, cmp_pre_addr);
    qsort(pre, (size_t)r->n_pre, sizeof *pre, cmp_pre_addr);
    int rc = 0, j = 0;
    for (int k = 0; k < n && !rc; k++) {
        int64_t at = segs[k].addr, end = add(segs[k].addr, segs[k].size);
        rc |= snap_map_put(&p->seg_start, at, segs[k].size);
        while (j < r->n_pre && pre[j].addr < at) j++;
        for (; j < r->n_pre && pre[j].addr < end; j++) {
            if (pre[j].addr > at) rc |= add_free(p, at, sub(pre[j].addr, at));
            if (add(pre[j].addr, pre[j].size) > at) at = add(pre[j].addr, pre[j].size);
        }
        if (at < end) rc |= add_free(p, at, sub(end, at));
    }
    free(segs);
    free(pre);
    return rc ? snap_bad_nomem(d, "device_traces") : 0;
}

/* Pass 2: block sizes, the curve and its peak. */
static int replay(snap_dec *d, snap_replay *r, pool *p) {
    tk_snapshot *s = d->s;
    int64_t alloc = 0, res = 0;
    int err = 0;
    s->points = tk_calloc(d->n_ev ? d->n_ev : 1, sizeof *s->points);
    if (!s->points) return snap_bad_nomem(d, "device_traces");
    for (size_t i = 0; i < d->n_ev && !err; i++) {
        const snap_ev *e = &d->ev[i];
        int64_t a = r->pair[i], before = add(alloc, res);
        switch (e->action) {
        case EV_ALLOC:
            if (d->by_txkernel) r->bsize[i] = e->size;
            else if ((r->bsize[i] = carve(p, e->addr, e->size, &err)) < 0) {
                r->bsize[i] = round_size(e->size);
                unmap(p, e->addr, r->bsize[i]);
                s->replay.unplaced++;
            }
            alloc = add(alloc, r->bsize[i]);
            break;
        case EV_FREE_REQ:
        case EV_FREE:
            if (a >= 0) {
                if (r->pair[a] == (int64_t)i) alloc = sub(alloc, r->bsize[a]);
                if (e->action == EV_FREE && !d->by_txkernel) err |= release(p, e->addr, r->bsize[a]);
            } else if (a <= -2) {
                const snap_pre *q = &r->pre[-2 - a];
                if (q->freed_at == (int64_t)i) alloc = sub(alloc, q->size);
                if (e->action == EV_FREE && !d->by_txkernel) err |= release(p, e->addr, q->size);
            }
            break;
        case EV_SEG_ALLOC:
            res = add(res, e->size);
            err |= snap_map_put(&p->seg_start, e->addr, e->size) || add_free(p, e->addr, e->size);
            break;
        case EV_SEG_MAP:
            res = add(res, e->size);
            err |= release(p, e->addr, e->size);
            break;
        case EV_SEG_FREE:
            res = sub(res, e->size);
            snap_map_del(&p->seg_start, e->addr);
            err |= unmap(p, e->addr, e->size);
            break;
        case EV_SEG_UNMAP:
            res = sub(res, e->size);
            err |= unmap(p, e->addr, e->size);
            break;
        default:
            continue;
        }
        if (add(alloc, res) == before && e->action != EV_ALLOC) continue;
        tk_snap_point *pt = &s->points[s->n_points++];
        pt->event = (int64_t)i;
        pt->time_us = e->time_us;
        pt->allocated = (size_t)alloc; /* relative for now */
        pt->reserved = (size_t)res;
    }
    if (err) return snap_bad_nomem(d, "device_traces");
    /* Anchored at the end, where the file's figures are known: the start
     * then holds what was live before the recording. */
    int64_t a0 = sub((int64_t)s->allocated, alloc), r0 = sub((int64_t)s->reserved, res);
    r->peak_ev = -1;
    for (int i = 0; i < s->n_points; i++) {
        int64_t av = add(a0, (int64_t)s->points[i].allocated), rv = add(r0, (int64_t)s->points[i].reserved);
        s->points[i].allocated = (size_t)(av < 0 ? 0 : av);
        s->points[i].reserved = (size_t)(rv < 0 ? 0 : rv);
        if (s->points[i].allocated > s->trace_peak_allocated) {
            s->trace_peak_allocated = s->points[i].allocated;
            s->peak_time_us = s->points[i].time_us;
            r->peak_ev = s->points[i].event;
        }
    }
    if (s->allocated > s->trace_peak_allocated) {
        s->trace_peak_allocated = s->allocated;
        r->peak_ev = -1;
        s->peak_time_us = -1;
    }
    s->replay.before_bytes = a0 < 0 ? 0 : (size_t)a0;
    return 0;
}

int snap_replay_trace(snap_dec *d, snap_replay *r) {
    tk_snapshot *s = d->s;
    memset(r, 0, sizeof *r);
    r->peak_ev = -1;
    if (!d->n_ev) return 0;
    r->bsize = tk_calloc(d->n_ev, sizeof *r->bsize);
    r->pair = tk_malloc(d->n_ev * sizeof *r->pair);
    if (!r->bsize || !r->pair) return snap_bad_nomem(d, "device_traces");
    for (size_t i = 0; i < d->n_ev; i++) r->pair[i] = -1;
    snap_map seg_pre = {0};
    pool p = {.expandable = s->expandable_on, .max_split = d->max_split};
    int pre_cap = 0;
    int rc = pair_events(d, r, &seg_pre, &pre_cap);
    if (!rc && !d->by_txkernel) rc = seed_pool(d, r, &seg_pre, &p);
    if (!rc) rc = replay(d, r, &p);
    snap_map_clear(&seg_pre);
    snap_map_clear(&p.by_start);
    snap_map_clear(&p.by_end);
    snap_map_clear(&p.seg_start);
    if (rc) return -1;
    s->replay.rounded = !d->by_txkernel;
    s->replay.rounding_unknown = d->rounding_divisions && !d->by_txkernel;
    s->replay.before_blocks = r->n_pre;
    /* the blocks live at the end that the trace allocated: their replayed
     * sizes against the file's */
    snap_map live = {0};
    for (size_t i = 0; i < d->n_ev; i++)
        if (d->ev[i].action == EV_ALLOC && r->pair[i] < 0 && snap_map_put(&live, d->ev[i].addr, (int64_t)i)) {
            snap_map_clear(&live);
            return snap_bad_nomem(d, "device_traces");
        }
    for (int k = 0; k < d->n_blks; k++) {
        int64_t a;
        if (d->blks[k].state != BLK_LIVE || !snap_map_get(&live, d->blks[k].addr, &a)) continue;
        s->replay.end_checked++;
        s->replay.end_mismatch += r->bsize[a] != d->blks[k].size;
    }
    snap_map_clear(&live);
    return 0;
}

void snap_replay_clear(snap_replay *r) {
    free(r->bsize);
    free(r->pair);
    free(r->pre);
    memset(r, 0, sizeof *r);
}
