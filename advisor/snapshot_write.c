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

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_pickle.h"

typedef struct wctx {
    tk_pickle_w *w;
    const tk_alloc *a;
    int open_seg;         /* 1: a segment's blocks list is open */
} wctx;

/* The one frame every block and event gets: the viewer shows it as
 * "txkernel:0:bert.encoder.layer.3.attention.self · act". */
static void frame(tk_pickle_w *w, const tk_alloc *a, tk_tag tag) {
    char name[192];
    const char *owner = tag.owner >= 0 ? tk_alloc_owner_name(a, tag.owner) : NULL;
    snprintf(name, sizeof name, "%s · %s", owner && *owner ? owner : "(unnamed)", tk_cat_name(tag.cat));
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

/* Segment totals need a pass over its blocks first. */
typedef struct { uint64_t addr; size_t alloc, req; } seg_sum;
typedef struct { seg_sum *v; size_t n, cap; int failed; } sums;

static void sum_seg(void *ud, const tk_alloc_seg_info *s) {
    sums *u = ud;
    if (u->failed) return;
    if (u->n == u->cap) {
        size_t cap = u->cap ? u->cap * 2 : 64;
        seg_sum *v = realloc(u->v, cap * sizeof *v);
        if (!v) { u->failed = 1; return; }
        u->v = v;
        u->cap = cap;
    }
    u->v[u->n++] = (seg_sum){s->addr, 0, 0};
}
static void sum_blk(void *ud, const tk_alloc_blk_info *b) {
    sums *u = ud;
    if (u->failed || !u->n || !b->live) return;
    u->v[u->n - 1].alloc += b->size;
    u->v[u->n - 1].req += b->requested;
}

typedef struct { wctx *c; sums *s; size_t i; } emit_ctx;

static void emit_seg(void *ud, const tk_alloc_seg_info *s) {
    emit_ctx *e = ud;
    tk_pickle_w *w = e->c->w;
    if (e->c->open_seg) { /* close the previous segment's blocks and dict */
        tk_pickle_w_list_end(w);
        tk_pickle_w_dict_end(w);
    }
    const seg_sum *sum = &e->s->v[e->i++];
    tk_pickle_w_dict_begin(w);
    static const char *const keys[] = {"device", "address", "total_size", "allocated_size", "active_size",
                                       "requested_size", "stream"};
    int64_t vals[] = {0, (int64_t)s->addr, (int64_t)s->size, (int64_t)sum->alloc, (int64_t)sum->alloc,
                      (int64_t)sum->req, 0};
    for (int k = 0; k < 7; k++) {
        tk_pickle_w_str(w, keys[k]);
        tk_pickle_w_int(w, vals[k]);
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
    e->c->open_seg = 1;
}

static void emit_blk(void *ud, const tk_alloc_blk_info *b) {
    emit_ctx *e = ud;
    tk_pickle_w *w = e->c->w;
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
    if (b->live) frame(w, e->c->a, b->tag);
    else empty_list(w);
    tk_pickle_w_dict_end(w);
}

static void event(tk_pickle_w *w, const tk_alloc *a, const char *action, uint64_t addr, uint64_t size, uint64_t t,
                  const tk_tag *tag, const size_t *device_free) {
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
    if (tag) frame(w, a, *tag);
    else empty_list(w);
    tk_pickle_w_dict_end(w);
}

int tk_snap_write(const tk_alloc *a, const tk_oom *oom, const char *path, tk_err *err) {
    sums s = {0};
    tk_alloc_walk(a, sum_seg, sum_blk, &s);
    size_t nh = tk_alloc_history_len(a);
    tk_alloc_event *ev = malloc((nh ? nh : 1) * sizeof *ev);
    tk_pickle_w *w = tk_pickle_w_new();
    if (s.failed || !ev || !w) {
        free(s.v);
        free(ev);
        tk_pickle_w_destroy(&w);
        tk_err_set(err, TK_EIO, "%s: out of host memory while writing the snapshot", path);
        return -1;
    }
    nh = tk_alloc_history(a, ev, nh, NULL);
    wctx c = {w, a, 0};
    emit_ctx e = {&c, &s, 0};
    tk_pickle_w_dict_begin(w);
    tk_pickle_w_str(w, "segments");
    tk_pickle_w_list_begin(w);
    tk_alloc_walk(a, emit_seg, emit_blk, &e);
    if (c.open_seg) {
        tk_pickle_w_list_end(w);
        tk_pickle_w_dict_end(w);
    }
    tk_pickle_w_list_end(w);
    tk_pickle_w_str(w, "device_traces");
    tk_pickle_w_list_begin(w);
    tk_pickle_w_list_begin(w);
    uint64_t t = 0;
    for (size_t i = 0; i < nh; i++) {
        const tk_alloc_event *x = &ev[i];
        tk_tag tag = {(tk_cat)x->cat, x->owner};
        t = x->seq;
        switch (x->kind) {
        case TK_AEV_ALLOC: event(w, a, "alloc", x->addr, x->size, t, &tag, NULL); break;
        case TK_AEV_FREE:
            /* PyTorch records the request and its completion; one stream, so both at once */
            event(w, a, "free_requested", x->addr, x->size, t, &tag, NULL);
            event(w, a, "free_completed", x->addr, x->size, t, &tag, NULL);
            break;
        case TK_AEV_SEGMENT_ALLOC: event(w, a, "segment_alloc", x->addr, x->size, t, NULL, NULL); break;
        default: event(w, a, "segment_free", x->addr, x->size, t, NULL, NULL); break;
        }
    }
    if (oom) event(w, a, "oom", 0, oom->requested, t + 1, &oom->tag, &oom->free_bytes);
    tk_pickle_w_list_end(w);
    tk_pickle_w_list_end(w);
    tk_pickle_w_dict_end(w);
    free(s.v);
    free(ev);
    size_t len = 0;
    uint8_t *buf = tk_pickle_w_finish(&w, &len);
    if (!buf) {
        tk_err_set(err, TK_EIO, "%s: out of host memory while writing the snapshot", path);
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
