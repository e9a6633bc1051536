/* snapshot_write.c — txkernel's allocator written as a PyTorch memory
 * snapshot, so PyTorch's viewer (pytorch.org/memory_viz) and tk_snap_read
 * open a txkernel run or plan.
 *
 * Guarantees: segments and blocks come from tk_alloc_walk (the allocator's
 * real state: each segment's blocks add up to its total_size); the trace is
 * the allocator's own history, so replaying alloc/free_completed reaches the
 * allocator's peak; only the writer's viewer-safe opcodes are used; the file
 * is written to a temporary name and renamed, so a failed write leaves no
 * half file.
 */
#include "tk_snapshot.h"
#include "tk_host_mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_pickle.h"

/* The one frame every block and event gets: the viewer shows it as
 * "txkernel:0:bert.encoder.layer.3.attention.self · act · forward". */
static void frame(tk_pickle_w *w, const tk_alloc *a, tk_tag tag, const char *phase) {
    char name[224];
    const char *owner = tag.owner >= 0 ? tk_alloc_owner_name(a, tag.owner) : NULL;
    snprintf(name, sizeof name, "%s · %s%s%s", owner && *owner ? owner : "(unnamed)", tk_cat_name(tag.cat),
             phase ? " · " : "", phase ? phase : "");
    tk_pickle_w_list_begin(w);
    tk_pickle_w_dict_begin(w);
    tk_pickle_w_str(w, "filename");
    tk_pickle_w_str(w, "txkernel");
    tk_pickle_w_str(w, "line");
    tk_pickle_w_int(w, 0);
    tk_pickle_w_str(w, "name");
    tk_pickle_w_str(w, name);
    tk_pickle_w_dict_end(w);
    tk_pickle_w_list_end(w);
}

static void empty_list(tk_pickle_w *w) {
    tk_pickle_w_list_begin(w);
    tk_pickle_w_list_end(w);
}

/* The segments and blocks to write, from the allocator's walk or from a
 * replay of its history. */
typedef struct layout {
    tk_alloc_seg_info *segs;
    size_t ns, cs;
    tk_alloc_blk_info *blks;
    size_t nb, cb;
    size_t *seg_first;    /* index of each segment's first block */
    int failed;
} layout;

static void lay_seg(void *ud, const tk_alloc_seg_info *s) {
    layout *l = ud;
    if (l->failed) return;
    if (l->ns == l->cs) {
        size_t cap = l->cs ? l->cs * 2 : 64;
        tk_alloc_seg_info *v = tk_realloc(l->segs, cap * sizeof *v);
        size_t *f = tk_realloc(l->seg_first, cap * sizeof *f);
        if (v) l->segs = v;
        if (f) l->seg_first = f;
        if (!v || !f) { l->failed = 1; return; }
        l->cs = cap;
    }
    l->seg_first[l->ns] = l->nb;
    l->segs[l->ns++] = *s;
}

static void lay_blk(void *ud, const tk_alloc_blk_info *b) {
    layout *l = ud;
    if (l->failed) return;
    if (l->nb == l->cb) {
        size_t cap = l->cb ? l->cb * 2 : 256;
        tk_alloc_blk_info *v = tk_realloc(l->blks, cap * sizeof *v);
        if (!v) { l->failed = 1; return; }
        l->blks = v;
        l->cb = cap;
    }
    l->blks[l->nb++] = *b;
}

/* Replays events [0, n) into the state they leave: the segments held and
 * the blocks live then, the gaps between live blocks inactive. For each
 * address the last event before n decides (sorted by address, then order). */
typedef struct { uint64_t addr; size_t i; } ev_ref;
static int cmp_ref(const void *x, const void *y) {
    const ev_ref *a = x, *b = y;
    if (a->addr != b->addr) return a->addr < b->addr ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

static void replay(layout *l, const tk_alloc_event *ev, size_t n) {
    ev_ref *segr = tk_malloc((n ? n : 1) * sizeof *segr), *blkr = tk_malloc((n ? n : 1) * sizeof *blkr);
    size_t ns = 0, nb = 0;
    if (!segr || !blkr) { l->failed = 1; free(segr); free(blkr); return; }
    for (size_t i = 0; i < n; i++) {
        if (ev[i].kind == TK_AEV_SEGMENT_ALLOC || ev[i].kind == TK_AEV_SEGMENT_FREE) segr[ns++] = (ev_ref){ev[i].addr, i};
        else if (ev[i].kind == TK_AEV_ALLOC || ev[i].kind == TK_AEV_FREE) blkr[nb++] = (ev_ref){ev[i].addr, i};
    }
    qsort(segr, ns, sizeof *segr, cmp_ref);
    qsort(blkr, nb, sizeof *blkr, cmp_ref);
    size_t bj = 0; /* live blocks, in address order, are consumed segment by segment */
    for (size_t k = 0; k < ns && !l->failed; k++) {
        if (k + 1 < ns && segr[k + 1].addr == segr[k].addr) continue; /* not the last event of this address */
        const tk_alloc_event *se = &ev[segr[k].i];
        if (se->kind != TK_AEV_SEGMENT_ALLOC) continue;
        /* Small-pool segments are the only 2 MiB ones (large ones are >= 10 MiB). */
        tk_alloc_seg_info si = {se->addr, se->size, se->size == ((size_t)2 << 20), 0};
        lay_seg(l, &si);
        uint64_t at = se->addr, end = se->addr + se->size;
        while (bj < nb && blkr[bj].addr < se->addr) bj++;
        for (; bj < nb && blkr[bj].addr < end; bj++) {
            if (bj + 1 < nb && blkr[bj + 1].addr == blkr[bj].addr) continue;
            const tk_alloc_event *be = &ev[blkr[bj].i];
            if (be->kind != TK_AEV_ALLOC) continue;
            if (be->addr > at) lay_blk(l, &(tk_alloc_blk_info){at, (size_t)(be->addr - at), 0, 0, {0, -1}, NULL});
            lay_blk(l, &(tk_alloc_blk_info){be->addr, be->size, be->req, 1, {(tk_cat)be->cat, be->owner}, be->phase});
            l->segs[l->ns - 1].live_bytes += be->size;
            at = be->addr + be->size;
        }
        if (at < end) lay_blk(l, &(tk_alloc_blk_info){at, (size_t)(end - at), 0, 0, {0, -1}, NULL});
    }
    free(segr);
    free(blkr);
}

static void emit_segments(tk_pickle_w *w, const tk_alloc *a, const layout *l) {
    tk_pickle_w_list_begin(w);
    for (size_t k = 0; k < l->ns; k++) {
        const tk_alloc_seg_info *s = &l->segs[k];
        size_t b0 = l->seg_first[k], b1 = k + 1 < l->ns ? l->seg_first[k + 1] : l->nb;
        size_t alloc = 0, req = 0;
        for (size_t i = b0; i < b1; i++)
            if (l->blks[i].live) { alloc += l->blks[i].size; req += l->blks[i].requested; }
        tk_pickle_w_dict_begin(w);
        static const char *const keys[] = {"device", "address", "total_size", "allocated_size", "active_size",
                                           "requested_size", "stream"};
        int64_t vals[] = {0, (int64_t)s->addr, (int64_t)s->size, (int64_t)alloc, (int64_t)alloc, (int64_t)req, 0};
        for (int j = 0; j < 7; j++) {
            tk_pickle_w_str(w, keys[j]);
            tk_pickle_w_int(w, vals[j]);
        }
        tk_pickle_w_str(w, "segment_type");
        tk_pickle_w_str(w, s->small_pool ? "small" : "large");
        tk_pickle_w_str(w, "segment_pool_id");
        tk_pickle_w_int(w, 0);
        tk_pickle_w_int(w, 0);
        tk_pickle_w_tuple2(w);
        tk_pickle_w_str(w, "is_expandable");
        tk_pickle_w_bool(w, 0);
        tk_pickle_w_str(w, "frames");
        empty_list(w);
        tk_pickle_w_str(w, "blocks");
        tk_pickle_w_list_begin(w);
        for (size_t i = b0; i < b1; i++) {
            const tk_alloc_blk_info *b = &l->blks[i];
            tk_pickle_w_dict_begin(w);
            tk_pickle_w_str(w, "address");
            tk_pickle_w_int(w, (int64_t)b->addr);
            tk_pickle_w_str(w, "size");
            tk_pickle_w_int(w, (int64_t)b->size);
            tk_pickle_w_str(w, "requested_size");
            tk_pickle_w_int(w, (int64_t)b->requested);
            tk_pickle_w_str(w, "state");
            tk_pickle_w_str(w, b->live ? "active_allocated" : "inactive");
            tk_pickle_w_str(w, "frames");
            if (b->live) frame(w, a, b->tag, b->phase);
            else empty_list(w);
            tk_pickle_w_dict_end(w);
        }
        tk_pickle_w_list_end(w);
        tk_pickle_w_dict_end(w);
    }
    tk_pickle_w_list_end(w);
}

static void event(tk_pickle_w *w, const tk_alloc *a, const char *action, uint64_t addr, uint64_t size, uint64_t t,
                  const tk_tag *tag, const char *phase, const size_t *device_free) {
    tk_pickle_w_dict_begin(w);
    tk_pickle_w_str(w, "action");
    tk_pickle_w_str(w, action);
    tk_pickle_w_str(w, "addr");
    tk_pickle_w_int(w, (int64_t)addr);
    tk_pickle_w_str(w, "size");
    tk_pickle_w_int(w, (int64_t)size);
    tk_pickle_w_str(w, "stream");
    tk_pickle_w_int(w, 0);
    tk_pickle_w_str(w, "time_us");
    tk_pickle_w_int(w, (int64_t)t);
    if (device_free) {
        tk_pickle_w_str(w, "device_free");
        tk_pickle_w_int(w, (int64_t)*device_free);
    }
    tk_pickle_w_str(w, "frames");
    if (tag) frame(w, a, *tag, phase);
    else empty_list(w);
    tk_pickle_w_dict_end(w);
}

int tk_snap_write(const tk_alloc *a, const tk_oom *oom, const char *path, tk_err *err) {
    size_t nh = tk_alloc_history_len(a);
    uint64_t dropped = 0;
    tk_alloc_event *ev = tk_malloc((nh ? nh : 1) * sizeof *ev);
    tk_pickle_w *w = tk_pickle_w_new();
    layout l = {0};
    if (ev) nh = tk_alloc_history(a, ev, nh, &dropped);
    /* At an OOM with the whole history kept, the state written is the one at
     * the OOM (a replay up to it), not what is left after the run released
     * its memory; otherwise it is the allocator's state now. */
    size_t cut = nh, k_oom = nh;
    for (size_t i = 0; ev && oom && i < nh; i++)
        if (ev[i].kind == TK_AEV_OOM) k_oom = i;
    if (ev && oom && !dropped && k_oom < nh) {
        cut = k_oom + 1;
        replay(&l, ev, k_oom);
    } else {
        tk_alloc_walk(a, lay_seg, lay_blk, &l);
    }
    if (l.failed || !ev || !w) {
        free(l.segs);
        free(l.blks);
        free(l.seg_first);
        free(ev);
        tk_pickle_w_destroy(&w);
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory while writing the snapshot", path);
        return -1;
    }
    tk_pickle_w_dict_begin(w);
    tk_pickle_w_str(w, "segments");
    emit_segments(w, a, &l);
    tk_pickle_w_str(w, "device_traces");
    tk_pickle_w_list_begin(w);
    tk_pickle_w_list_begin(w);
    int oom_written = 0;
    for (size_t i = 0; i < cut; i++) {
        const tk_alloc_event *x = &ev[i];
        tk_tag tag = {(tk_cat)x->cat, x->owner};
        size_t device_free = (size_t)x->req;
        switch (x->kind) {
        case TK_AEV_ALLOC: event(w, a, "alloc", x->addr, x->size, x->seq, &tag, x->phase, NULL); break;
        case TK_AEV_FREE:
            /* PyTorch records the request and its completion; one stream, so both at once */
            event(w, a, "free_requested", x->addr, x->size, x->seq, &tag, x->phase, NULL);
            event(w, a, "free_completed", x->addr, x->size, x->seq, &tag, x->phase, NULL);
            break;
        case TK_AEV_SEGMENT_ALLOC: event(w, a, "segment_alloc", x->addr, x->size, x->seq, NULL, NULL, NULL); break;
        case TK_AEV_SEGMENT_FREE: event(w, a, "segment_free", x->addr, x->size, x->seq, NULL, NULL, NULL); break;
        default:
            if (!oom) break; /* an OOM the run recovered from is not this snapshot's OOM */
            event(w, a, "oom", 0, x->size, x->seq, &tag, x->phase, &device_free);
            oom_written = i == k_oom;
            break;
        }
    }
    if (oom && !oom_written) event(w, a, "oom", 0, oom->requested, nh ? ev[nh - 1].seq + 1 : 0, &oom->tag, NULL, &oom->free_bytes);
    tk_pickle_w_list_end(w);
    tk_pickle_w_list_end(w);
    tk_pickle_w_dict_end(w);
    free(l.segs);
    free(l.blks);
    free(l.seg_first);
    free(ev);
    size_t len = 0;
    uint8_t *buf = tk_pickle_w_finish(&w, &len);
    if (!buf) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory while writing the snapshot", path);
        return -1;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(buf, 1, len, f) == len;
    if (f && fclose(f) != 0) ok = 0;
    free(buf);
    if (!ok || rename(tmp, path) != 0) {
        tk_err_set(err, TK_EIO, "%s: could not write the snapshot: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}
