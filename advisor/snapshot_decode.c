/* snapshot_decode.c — a PyTorch memory snapshot file read into plain
 * records (see snapshot_decode.h): the pickle's trace streamed event by
 * event (tk_pickle's on_item), the rest walked as a tree; JSON parsed whole
 * and walked by the same code through a two-backend view (sv), so both
 * forms give the same records and the same figures.
 *
 * Guarantees: the pickle is read with no global allowed, so nothing in the
 * file runs; a bad field is one line naming the file and where
 * (segments[3].blocks[0].size, device_traces[0][12]); byte figures are
 * integer sums over the file, never estimates.
 */
#include "snapshot_decode.h"
#include "tk_host_mem.h"
#include "tk_pickle.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Snapshots of long runs reach gigabytes, nearly all of it the trace: a
 * pickle's events are streamed into compact records, so only the segments
 * and the values the memo shares stay as a tree, capped here. JSON is
 * parsed whole, so its file is capped. */
#define SNAP_MAX_JSON ((size_t)1 << 30)
#define SNAP_TREE_CAP ((size_t)768 << 20)

/* ---- one view over a pickle value or a JSON value ----------------------------------- */

typedef struct sv { const tk_pval *p; json_t *j; } sv;

#define SV_NONE ((sv){NULL, NULL})
static int sv_ok(sv v) { return v.p || v.j; }

static sv sv_get(sv d, const char *k) {
    sv r = SV_NONE;
    if (d.p) r.p = tk_pval_get(d.p, k);
    else if (d.j && json_is_object(d.j)) r.j = json_object_get(d.j, k);
    return r;
}
static int sv_is_dict(sv v) { return v.p ? v.p->kind == TK_PV_DICT : json_is_object(v.j); }
static int sv_is_list(sv v) {
    return v.p ? (v.p->kind == TK_PV_LIST || v.p->kind == TK_PV_TUPLE) : json_is_array(v.j);
}
static size_t sv_len(sv v) { return v.p ? v.p->n : json_array_size(v.j); }
static sv sv_at(sv v, size_t i) {
    sv r = SV_NONE;
    if (v.p) r.p = i < v.p->n ? v.p->items[i] : NULL;
    else r.j = json_array_get(v.j, i);
    return r;
}
static int sv_int(sv v, int64_t *o) {
    if (v.p) return tk_pval_int(v.p, o);
    if (json_is_integer(v.j)) {
        *o = json_integer_value(v.j);
        return 0;
    }
    return -1;
}
static int sv_true(sv v) { return v.p ? v.p->kind == TK_PV_BOOL && v.p->i : json_is_true(v.j); }
static const char *sv_str(sv v) { return v.p ? tk_pval_str(v.p) : json_string_value(v.j); }
static const char *sv_kind(sv v) {
    if (v.p) return tk_pval_kind_name(v.p->kind);
    if (!v.j) return "nothing";
    static const char *const N[] = {"object", "array", "string", "integer", "real", "true", "false", "null"};
    return N[json_typeof(v.j)];
}
static const void *sv_id(sv v) { return v.p ? (const void *)v.p : (const void *)v.j; }

/* ---- errors ----------------------------------------------------------------------------- */

int snap_bad(snap_dec *d, const char *where, const char *what) {
    tk_err_set(d->err, TK_EFORMAT, "%s: %s: %s", d->name, where, what);
    return -1;
}

int snap_bad_nomem(snap_dec *d, const char *where) {
    tk_err_set(d->err, TK_ENOMEM, "%s: %s: out of host memory", d->name, where);
    return -1;
}

/* A non-negative integer field; missing_ok keeps *o when absent. */
static int field_size(snap_dec *d, sv obj, const char *key, const char *where, int missing_ok, int64_t *o) {
    sv v = sv_get(obj, key);
    char w[160], m[96];
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (!sv_ok(v)) return missing_ok ? 0 : snap_bad(d, w, "missing");
    if (sv_int(v, o) || *o < 0) {
        snprintf(m, sizeof m, "expected a non-negative integer, found %s", sv_kind(v));
        return snap_bad(d, w, m);
    }
    return 0;
}

/* ---- interning: strings, frames, stacks ----------------------------------------------- */

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * UINT64_C(1099511628211);
    return h;
}
#define FNV0 UINT64_C(1469598103934665603)

typedef uint64_t (*hash_of_fn)(const snap_dec *d, int32_t i);

/* Grows an index table (ids + 1, 0 empty) to hold n + 1 at most half full. */
static int tab_room(const snap_dec *d, int32_t **tab, size_t *cap, int n, hash_of_fn hf) {
    if ((size_t)n * 2 + 2 <= *cap) return 0;
    size_t c = *cap ? *cap * 2 : 256;
    while ((size_t)n * 2 + 2 > c) c *= 2;
    int32_t *t = tk_calloc(c, sizeof *t);
    if (!t) return -1;
    for (int i = 0; i < n; i++) {
        size_t k = (size_t)hf(d, i) & (c - 1);
        while (t[k]) k = (k + 1) & (c - 1);
        t[k] = i + 1;
    }
    free(*tab);
    *tab = t;
    *cap = c;
    return 0;
}

static int grow(void **v, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    void *p = tk_realloc(*v, (size_t)c * elem);
    if (!p) return -1;
    *v = p;
    *cap = c;
    return 0;
}

static uint64_t str_hash(const snap_dec *d, int32_t i) { return fnv(d->strs[i], strlen(d->strs[i]), FNV0); }

const char *snap_str(const snap_dec *d, int32_t i) { return i >= 0 && i < d->n_strs ? d->strs[i] : ""; }

int32_t snap_intern(snap_dec *d, const char *str) {
    if (tab_room(d, &d->str_tab, &d->str_tab_cap, d->n_strs, str_hash)) return -1;
    size_t mask = d->str_tab_cap - 1, k = (size_t)fnv(str, strlen(str), FNV0) & mask;
    for (; d->str_tab[k]; k = (k + 1) & mask)
        if (!strcmp(d->strs[d->str_tab[k] - 1], str)) return d->str_tab[k] - 1;
    if (grow((void **)&d->strs, &d->strs_cap, d->n_strs + 1, sizeof *d->strs)) return -1;
    if (!(d->strs[d->n_strs] = tk_strdup(str))) return -1;
    d->str_tab[k] = ++d->n_strs;
    return d->n_strs - 1;
}

static uint64_t frame_hash(const snap_dec *d, int32_t i) { return fnv(&d->frames[i], sizeof *d->frames, FNV0); }

static int32_t intern_frame(snap_dec *d, snap_frame f) {
    if (tab_room(d, &d->frame_tab, &d->frame_tab_cap, d->n_frames, frame_hash)) return -1;
    size_t mask = d->frame_tab_cap - 1, k = (size_t)fnv(&f, sizeof f, FNV0) & mask;
    for (; d->frame_tab[k]; k = (k + 1) & mask) {
        const snap_frame *g = &d->frames[d->frame_tab[k] - 1];
        if (g->file == f.file && g->name == f.name && g->line == f.line) return d->frame_tab[k] - 1;
    }
    if (grow((void **)&d->frames, &d->frames_cap, d->n_frames + 1, sizeof *d->frames)) return -1;
    d->frames[d->n_frames] = f;
    d->frame_tab[k] = ++d->n_frames;
    return d->n_frames - 1;
}

static uint64_t stack_hash(const snap_dec *d, int32_t i) {
    return fnv(d->stack_items + d->stack_off[i], (d->stack_off[i + 1] - d->stack_off[i]) * sizeof(int32_t), FNV0);
}

/* The stack whose frames were just appended at stack_items[from..]: an
 * existing one (the appended items dropped again) or a new one. */
static int32_t intern_stack(snap_dec *d, size_t from) {
    size_t n = d->n_stack_items - from;
    if (!n) return 0;
    if (tab_room(d, &d->stack_tab, &d->stack_tab_cap, d->n_stacks, stack_hash)) return -1;
    size_t mask = d->stack_tab_cap - 1, k = (size_t)fnv(d->stack_items + from, n * sizeof(int32_t), FNV0) & mask;
    for (; d->stack_tab[k]; k = (k + 1) & mask) {
        int32_t s = d->stack_tab[k] - 1;
        if (d->stack_off[s + 1] - d->stack_off[s] == n &&
            !memcmp(d->stack_items + d->stack_off[s], d->stack_items + from, n * sizeof(int32_t))) {
            d->n_stack_items = from;
            return s;
        }
    }
    if (grow((void **)&d->stack_off, &d->stacks_cap, d->n_stacks + 2, sizeof *d->stack_off)) return -1;
    d->stack_off[d->n_stacks + 1] = (uint32_t)d->n_stack_items;
    d->stack_tab[k] = ++d->n_stacks;
    return d->n_stacks - 1;
}

/* The frames of a block or an event as one stack id (0: none). */
static int32_t read_stack(snap_dec *d, sv frames) {
    size_t from = d->n_stack_items;
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *file = sv_str(sv_get(f, "filename")), *name = sv_str(sv_get(f, "name"));
        int64_t line = 0;
        sv_int(sv_get(f, "line"), &line);
        snap_frame fr = {file ? snap_intern(d, file) : -1, name ? snap_intern(d, name) : -1,
                         (int32_t)(line < 0 || line > INT32_MAX ? 0 : line)};
        if ((file && fr.file < 0) || (name && fr.name < 0)) return -1;
        if (file && !strcmp(file, "txkernel")) d->by_txkernel = 1;
        int32_t id = intern_frame(d, fr);
        if (id < 0) return -1;
        if (d->n_stack_items == d->stack_items_cap) {
            size_t c = d->stack_items_cap ? d->stack_items_cap * 2 : 1024;
            int32_t *v = tk_realloc(d->stack_items, c * sizeof *v);
            if (!v) return -1;
            d->stack_items = v;
            d->stack_items_cap = c;
        }
        d->stack_items[d->n_stack_items++] = id;
    }
    if (d->n_stack_items > from) d->has_frames = 1;
    return intern_stack(d, from);
}

/* ---- segments and their blocks: the end state and its figures --------------------------- */

static tk_snap_device *device_row(tk_snapshot *s, int64_t device) {
    for (int i = 0; i < s->n_device_rows; i++)
        if (s->devices[i].device == device) return &s->devices[i];
    if (s->n_device_rows == TK_SNAP_MAX_DEVICES) return NULL;
    int i = s->n_device_rows++;
    while (i > 0 && s->devices[i - 1].device > device) {
        s->devices[i] = s->devices[i - 1];
        i--;
    }
    memset(&s->devices[i], 0, sizeof s->devices[i]);
    s->devices[i].device = (int)device;
    return &s->devices[i];
}

static tk_snap_pool *pool_of(tk_snapshot *s, const char *type, int64_t stream) {
    for (int i = 0; i < s->n_pools; i++)
        if (s->pools[i].stream == stream && !strcmp(s->pools[i].pool, type)) return &s->pools[i];
    /* Past the table's size the last row gathers the rest. */
    if (s->n_pools == TK_SNAP_MAX_POOLS) return &s->pools[TK_SNAP_MAX_POOLS - 1];
    tk_snap_pool *p = &s->pools[s->n_pools++];
    snprintf(p->pool, sizeof p->pool, "%s", type);
    p->stream = stream;
    return p;
}

static int add_live_size(snap_dec *d, size_t size) {
    tk_snapshot *s = d->s;
    if (s->n_live_sizes == s->live_sizes_cap) {
        int cap = s->live_sizes_cap ? s->live_sizes_cap * 2 : 256;
        size_t *v = tk_realloc(s->live_sizes, (size_t)cap * sizeof *v);
        if (!v) return snap_bad_nomem(d, "blocks");
        s->live_sizes = v;
        s->live_sizes_cap = cap;
    }
    s->live_sizes[s->n_live_sizes++] = size;
    return 0;
}

/* One block of a segment: its record and its share of the figures. */
static int read_block(snap_dec *d, sv b, const char *bw, snap_seg *g, tk_snap_pool *p, tk_snap_device *dv,
                      size_t *active) {
    tk_snapshot *s = d->s;
    if (!sv_is_dict(b)) return snap_bad(d, bw, "expected a dict (a block)");
    int64_t size = 0, req = 0, addr = g->addr;
    if (field_size(d, b, "size", bw, 0, &size) || field_size(d, b, "requested_size", bw, 1, &req)) return -1;
    sv_int(sv_get(b, "address"), &addr);
    const char *state = sv_str(sv_get(b, "state"));
    if (!state) return snap_bad(d, bw, "'state' missing or not a string");
    sv frames = sv_get(b, "frames"), hist = sv_get(b, "history");
    /* PyTorch 2.0 kept frames in the block's history, newest last. */
    if (!sv_ok(frames) && sv_is_list(hist) && sv_len(hist)) frames = sv_get(sv_at(hist, sv_len(hist) - 1), "frames");
    if (grow((void **)&d->blks, &d->blks_cap, d->n_blks + 1, sizeof *d->blks)) return snap_bad_nomem(d, bw);
    snap_blk *k = &d->blks[d->n_blks];
    *k = (snap_blk){addr, size, req, 0, (int)(g - d->segs), BLK_PENDING};
    if ((k->stack = read_stack(d, frames)) < 0) return snap_bad_nomem(d, bw);
    d->n_blks++;
    g->n_blk++;
    s->n_blocks++;
    if (!strcmp(state, "active_allocated")) {
        k->state = BLK_LIVE;
        s->allocated += (size_t)size;
        s->requested += (size_t)req;
        p->allocated += (size_t)size;
        s->n_live_blocks++;
        *active += (size_t)size;
        if (dv) dv->allocated += (size_t)size;
        return add_live_size(d, (size_t)(req > 0 ? req : size));
    }
    if (!strcmp(state, "inactive")) {
        k->state = BLK_FREE;
        s->free_in_cache += (size_t)size;
        p->free += (size_t)size;
        s->n_free_blocks++;
        if ((size_t)size > s->largest_free_block) s->largest_free_block = (size_t)size;
        if ((size_t)size > p->largest_free) p->largest_free = (size_t)size;
        if (dv) {
            if ((size_t)size > dv->largest_free_block) dv->largest_free_block = (size_t)size;
            size_t *fr = g->small ? &dv->free_small : &dv->free_large, *lg = g->small ? &dv->largest_small : &dv->largest_large;
            *fr += (size_t)size;
            if ((size_t)size > *lg) *lg = (size_t)size;
        }
        return 0;
    }
    s->pending_free += (size_t)size;
    *active += (size_t)size;
    return 0;
}

static int read_segment(snap_dec *d, sv seg, size_t si, int64_t *devices_seen) {
    tk_snapshot *s = d->s;
    char where[96];
    snprintf(where, sizeof where, "segments[%zu]", si);
    if (!sv_is_dict(seg)) return snap_bad(d, where, "expected a dict (a segment)");
    int64_t total = 0, stream = 0, device = 0, addr = 0;
    if (field_size(d, seg, "total_size", where, 0, &total) || field_size(d, seg, "device", where, 1, &device))
        return -1;
    sv_int(sv_get(seg, "address"), &addr);
    sv st = sv_get(seg, "stream");
    if (sv_ok(st) && sv_int(st, &stream)) return snap_bad(d, where, "'stream' is not an integer");
    if (grow((void **)&d->segs, &d->segs_cap, d->n_segs + 1, sizeof *d->segs)) return snap_bad_nomem(d, where);
    const char *type = sv_str(sv_get(seg, "segment_type"));
    snap_seg *g = &d->segs[d->n_segs++];
    *g = (snap_seg){addr, total, (int)device, type && !strcmp(type, "small"), sv_true(sv_get(seg, "is_expandable")),
                    d->n_blks, 0};
    if (g->expandable) s->expandable_on = 1;
    tk_snap_device *dv = device_row(s, device);
    if (device >= 0 && device < 64) *devices_seen |= (int64_t)(UINT64_C(1) << device);
    tk_snap_pool *p = pool_of(s, type ? type : "?", stream);
    if (dv) dv->segments++, dv->reserved += (size_t)total;
    p->segments++;
    p->reserved += (size_t)total;
    s->reserved += (size_t)total;
    s->n_segments++;
    sv blocks = sv_get(seg, "blocks");
    if (!sv_is_list(blocks)) return snap_bad(d, where, "'blocks' missing or not a list");
    size_t active = 0;
    for (size_t bi = 0; bi < sv_len(blocks); bi++) {
        char bw[128];
        snprintf(bw, sizeof bw, "%s.blocks[%zu]", where, bi);
        if (read_block(d, sv_at(blocks, bi), bw, g, p, dv, &active)) return -1;
    }
    if (!active) s->empty_segments += (size_t)total;
    return 0;
}

/* ---- the trace ------------------------------------------------------------------------- */

static uint8_t action_of(const char *a) {
    static const struct { const char *name; uint8_t ev; } T[] = {
        {"alloc", EV_ALLOC},           {"free_requested", EV_FREE_REQ}, {"free_completed", EV_FREE},
        {"segment_alloc", EV_SEG_ALLOC}, {"segment_free", EV_SEG_FREE},   {"segment_map", EV_SEG_MAP},
        {"segment_unmap", EV_SEG_UNMAP}, {"oom", EV_OOM}};
    for (size_t i = 0; i < sizeof T / sizeof *T; i++)
        if (!strcmp(a, T[i].name)) return T[i].ev;
    return EV_OTHER;
}

/* One event of the device list `list` (its identity: the lists are put in
 * order after the file): checked, and kept as a record. */
static int ingest_event(snap_dec *d, sv e, const void *list) {
    tk_snapshot *s = d->s;
    int li = 0;
    while (li < d->n_lists && d->lists[li] != list) li++;
    if (li == d->n_lists) {
        if (li == 64) return snap_bad(d, "device_traces", "more than 64 devices' traces");
        d->lists[d->n_lists++] = list;
    }
    char w[96];
    snprintf(w, sizeof w, "device_traces[%d][%zu]", li, d->list_items[li]++);
    if (!sv_is_dict(e)) return snap_bad(d, w, "expected a dict (a trace event)");
    const char *a = sv_str(sv_get(e, "action"));
    if (!a) return snap_bad(d, w, "'action' missing or not a string");
    snap_ev r = {.time_us = -1, .list = (uint8_t)li, .action = action_of(a)};
    if (field_size(d, e, "size", w, 1, &r.size)) return -1;
    sv_int(sv_get(e, "time_us"), &r.time_us);
    sv_int(sv_get(e, "addr"), &r.addr);
    if (r.action != EV_OTHER && (r.stack = read_stack(d, sv_get(e, "frames"))) < 0) return snap_bad_nomem(d, w);
    if (r.action == EV_OOM) {
        int64_t fr = 0;
        if (field_size(d, e, "device_free", w, 1, &fr)) return -1;
        s->has_oom = 1;
        d->oom_list = li;
        s->oom_size = (size_t)r.size;
        s->oom_device_free = (size_t)fr;
        s->oom_time_us = r.time_us;
    }
    if (d->n_ev == d->ev_cap) {
        size_t cap = d->ev_cap ? d->ev_cap * 2 : 1024;
        snap_ev *v = tk_realloc(d->ev, cap * sizeof *v);
        if (!v) return snap_bad_nomem(d, "device_traces");
        d->ev = v;
        d->ev_cap = cap;
    }
    d->ev[d->n_ev++] = r;
    s->n_trace++;
    return 0;
}

/* The streaming reader's callback: each trace event as it is read. */
static int on_event(void *cx, const tk_pval *list, const tk_pval *item, tk_err *err) {
    (void)err;
    return ingest_event(cx, (sv){item, NULL}, list);
}

/* After the file: the lists in device order (their places in
 * device_traces) and the OOM's device. JSON's events are read here (the
 * pickle's were streamed). */
static int read_traces(snap_dec *d, sv traces, int streamed) {
    tk_snapshot *s = d->s;
    int dev_of[64];
    if (!sv_ok(traces)) return 0;
    if (!sv_is_list(traces)) return snap_bad(d, "device_traces", "expected a list (one per device)");
    for (size_t t = 0; t < sv_len(traces); t++) {
        sv l = sv_at(traces, t);
        if (!sv_is_list(l)) return snap_bad(d, "device_traces", "each device's trace must be a list");
        for (size_t i = 0; !streamed && i < sv_len(l); i++)
            if (ingest_event(d, sv_at(l, i), sv_id(l))) return -1;
    }
    for (int li = 0; li < d->n_lists; li++) {
        dev_of[li] = li;
        for (size_t t = 0; t < sv_len(traces); t++)
            if (sv_id(sv_at(traces, t)) == d->lists[li]) dev_of[li] = (int)t;
    }
    if (s->has_oom) s->oom_device = dev_of[d->oom_list];
    for (size_t i = 0; i < d->n_ev; i++) d->ev[i].list = (uint8_t)dev_of[d->ev[i].list];
    return 0;
}

static int read_annotations(snap_dec *d, sv ann) {
    for (size_t i = 0; sv_is_list(ann) && i < sv_len(ann); i++) {
        sv a = sv_at(ann, i);
        int64_t t = -1, dev = 0;
        const char *name = sv_str(sv_get(a, "name")), *stage = sv_str(sv_get(a, "stage"));
        if (!name || !stage || sv_int(sv_get(a, "time_us"), &t)) continue;
        sv_int(sv_get(a, "device"), &dev);
        if (grow((void **)&d->ann, &d->ann_cap, d->n_ann + 1, sizeof *d->ann)) return snap_bad_nomem(d, "external_annotations");
        int32_t nm = snap_intern(d, name);
        if (nm < 0) return snap_bad_nomem(d, "external_annotations");
        d->ann[d->n_ann++] = (snap_ann){t, nm, (int)dev, !strcmp(stage, "START")};
        if (!strcmp(stage, "START")) d->s->has_annotations = 1;
    }
    return 0;
}

static void read_settings(snap_dec *d, sv set) {
    int64_t v;
    if (sv_true(sv_get(set, "expandable_segments"))) d->s->expandable_on = 1;
    if (!sv_int(sv_get(set, "max_split_size"), &v)) d->max_split = v > 0 ? v : -1;
    sv div = sv_get(set, "roundup_power2_divisions");
    if (sv_is_dict(div) && div.p)
        for (size_t i = 1; i < div.p->n; i += 2) d->rounding_divisions |= tk_pval_int(div.p->items[i], &v) == 0 && v > 1;
    if (sv_is_dict(div) && div.j) {
        const char *k;
        json_t *x;
        json_object_foreach(div.j, k, x) d->rounding_divisions |= json_is_integer(x) && json_integer_value(x) > 1;
    }
}

/* The snapshot's tree (a pickle's trace events already streamed through
 * on_event when streamed is 1). */
static int read_tree(snap_dec *d, sv root, int streamed) {
    tk_snapshot *s = d->s;
    sv segs = root;
    if (sv_is_dict(root)) {
        s->form = s->form ? s->form : "pickle (dict)";
        segs = sv_get(root, "segments");
        if (!sv_is_list(segs)) return snap_bad(d, "segments", "missing or not a list: not a PyTorch memory snapshot");
    } else if (sv_is_list(root)) {
        s->form = s->form ? s->form : "pickle (list of segments)";
    } else {
        char m[128];
        snprintf(m, sizeof m, "expected a dict with 'segments' or a list of segments, found %s", sv_kind(root));
        return snap_bad(d, "top level", m);
    }
    int64_t devices = 0;
    for (size_t i = 0; i < sv_len(segs); i++)
        if (read_segment(d, sv_at(segs, i), i, &devices)) return -1;
    for (int k = 0; k < 64; k++) s->n_devices += (int)((devices >> k) & 1);
    if (!sv_is_dict(root)) return 0;
    read_settings(d, sv_get(root, "allocator_settings"));
    return read_traces(d, sv_get(root, "device_traces"), streamed) ||
           read_annotations(d, sv_get(root, "external_annotations"));
}

/* ---- the file -------------------------------------------------------------------------- */

static int start(snap_dec *d) {
    d->oom_list = -1;
    d->max_split = -1;
    /* stack 0: no frames */
    if (grow((void **)&d->stack_off, &d->stacks_cap, 2, sizeof *d->stack_off)) return snap_bad_nomem(d, "frames");
    d->stack_off[0] = d->stack_off[1] = 0;
    d->n_stacks = 1;
    return 0;
}

/* A pickle, from memory (buf) or from the file at path: its trace events
 * streamed into records as they are read, the rest as a tree. */
static int read_pickle(snap_dec *d, const uint8_t *buf, size_t len, const char *path) {
    tk_pickle_opts o = {.name = d->name, .max_bytes = SNAP_TREE_CAP, .stream_key = "action", .on_item = on_event,
                        .item_ctx = d};
    tk_pickle *p = path ? tk_pickle_load_file(path, &o, d->err) : tk_pickle_load(buf, len, &o, d->err);
    int rc = p ? read_tree(d, (sv){tk_pickle_root(p), NULL}, 1) : -1;
    tk_pickle_destroy(&p);
    return rc;
}

static int read_json(snap_dec *d, const uint8_t *buf, size_t len) {
    json_error_t je;
    json_t *j = json_loadb((const char *)buf, len, 0, &je);
    if (!j) {
        tk_err_set(d->err, TK_EFORMAT, "%s: line %d: not valid JSON: %s", d->name, je.line, je.text);
        return -1;
    }
    d->s->form = "json";
    int rc = read_tree(d, (sv){NULL, j}, 0);
    json_decref(j);
    return rc;
}

int snap_decode_buf(snap_dec *d, const uint8_t *buf, size_t len) {
    if (start(d)) return -1;
    size_t i = 0;
    while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t')) i++;
    if (i < len && (buf[i] == '{' || buf[i] == '[')) return read_json(d, buf, len);
    if (len && buf[0] == 0x80) return read_pickle(d, buf, len, NULL);
    tk_err_set(d->err, TK_EFORMAT,
               "%s: not a PyTorch memory snapshot (neither a pickle of protocol 2 or newer nor JSON)", d->name);
    return -1;
}

int snap_decode_file(snap_dec *d, const char *path) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        tk_err_set(d->err, TK_EIO, "%s: %s", path, f ? "not a regular file" : strerror(errno));
        if (f) fclose(f);
        return -1;
    }
    uint8_t head[1];
    size_t nh = fread(head, 1, sizeof head, f);
    if (nh && head[0] == 0x80) {
        /* a pickle of any size: mapped, its events streamed */
        fclose(f);
        return start(d) ? -1 : read_pickle(d, NULL, 0, path);
    }
    /* JSON is parsed whole: it stays within the 1 GiB this reader takes in memory */
    if ((size_t)st.st_size > SNAP_MAX_JSON) {
        tk_err_set(d->err, TK_EFORMAT,
                   "%s: %lld bytes of JSON, larger than the 1 GiB this reader takes as JSON "
                   "(a pickle of any size is read as it streams)",
                   path, (long long)st.st_size);
        fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = tk_malloc(n ? n : 1);
    if (!buf || fseek(f, 0, SEEK_SET) || fread(buf, 1, n, f) != n) {
        tk_err_set(d->err, TK_EIO, "%s: could not read the file", path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    int rc = snap_decode_buf(d, buf, n);
    free(buf);
    return rc;
}

void snap_dec_clear(snap_dec *d) {
    for (int i = 0; i < d->n_strs; i++) free(d->strs[i]);
    free(d->strs);
    free(d->str_tab);
    free(d->frames);
    free(d->frame_tab);
    free(d->stack_items);
    free(d->stack_off);
    free(d->stack_tab);
    free(d->segs);
    free(d->blks);
    free(d->ev);
    free(d->ann);
}

/* ---- the address table ------------------------------------------------------------------ */

static size_t slot_of(const snap_map *m, int64_t key) {
    return (size_t)(((uint64_t)key * UINT64_C(0x9E3779B97F4A7C15)) >> 17) & (m->cap - 1);
}

int snap_map_put(snap_map *m, int64_t key, int64_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        snap_map g = {0};
        g.cap = m->cap ? m->cap * 2 : 64;
        g.key = tk_malloc(g.cap * sizeof *g.key);
        g.val = tk_malloc(g.cap * sizeof *g.val);
        g.used = tk_calloc(g.cap, 1);
        if (!g.key || !g.val || !g.used) {
            snap_map_clear(&g);
            return -1;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->used[i]) snap_map_put(&g, m->key[i], m->val[i]);
        snap_map_clear(m);
        *m = g;
    }
    size_t h = slot_of(m, key);
    while (m->used[h] && m->key[h] != key) h = (h + 1) & (m->cap - 1);
    if (!m->used[h]) m->n++;
    m->used[h] = 1;
    m->key[h] = key;
    m->val[h] = val;
    return 0;
}

int snap_map_get(const snap_map *m, int64_t key, int64_t *val) {
    if (!m->cap) return 0;
    for (size_t h = slot_of(m, key); m->used[h]; h = (h + 1) & (m->cap - 1))
        if (m->key[h] == key) {
            *val = m->val[h];
            return 1;
        }
    return 0;
}

int snap_map_del(snap_map *m, int64_t key) {
    if (!m->cap) return 0;
    size_t h = slot_of(m, key), mask = m->cap - 1;
    while (m->used[h] && m->key[h] != key) h = (h + 1) & mask;
    if (!m->used[h]) return 0;
    /* backward shift: later entries of the run move into the hole when their home allows */
    size_t hole = h;
    for (size_t j = (h + 1) & mask; m->used[j]; j = (j + 1) & mask) {
        size_t home = slot_of(m, m->key[j]);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            m->key[hole] = m->key[j];
            m->val[hole] = m->val[j];
            hole = j;
        }
    }
    m->used[hole] = 0;
    m->n--;
    return 1;
}

void snap_map_clear(snap_map *m) {
    free(m->key);
    free(m->val);
    free(m->used);
    memset(m, 0, sizeof *m);
}
