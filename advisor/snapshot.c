/* snapshot.c — reads a PyTorch memory snapshot (pickle or JSON), sums its
 * figures, groups live blocks by owner, replays the trace, and diagnoses it
 * (see tk_snapshot.h).
 *
 * Guarantees: the pickle is read by tk_pickle with no global allowed, so
 * nothing in the file runs; a file of the wrong shape is a one-line error
 * naming the file and the field; byte figures are integer sums, never
 * estimates. The pickle and JSON forms are walked by the same code through
 * a two-backend view (sv), so both give the same numbers.
 */
#include "tk_snapshot.h"
#include "tk_host_mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tk_pickle.h"

/* Snapshots of long runs reach gigabytes, nearly all of it the trace: a
 * pickle's events are streamed into compact records (about 50 bytes each),
 * so only the segments and the values the memo shares stay as a tree,
 * capped here. JSON is parsed whole, so its file is capped. */
#define SNAP_MAX_JSON ((size_t)1 << 30)
#define SNAP_TREE_CAP ((size_t)768 << 20)

/* ---- one view over a pickle value or a JSON value ----------------------------------- */

typedef struct sv { const tk_pval *p; json_t *j; } sv;

static const sv SV_NONE = {NULL, NULL};
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
    if (json_is_integer(v.j)) { *o = json_integer_value(v.j); return 0; }
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

/* ---- reading ------------------------------------------------------------------------ */

typedef struct module_bytes { char name[48], file[160]; size_t bytes; } module_bytes;

typedef struct ctx {
    tk_snapshot *s;
    const char *name;
    tk_err *err;
    int owners_cap, sizes_cap;
    module_bytes modules[8];
    int n_modules;
    /* the trace, one record per event, in file order (read as it streams) */
    struct snap_ev *ev;
    size_t n_ev, ev_cap;
    const void *lists[64];       /* the device lists seen, in order (their identity) */
    size_t list_items[64];
    int n_lists;
    char **strs;                 /* interned owners and phases */
    int n_strs, strs_cap;
    int32_t *str_tab;            /* open addressing: index into strs + 1, 0 empty */
    size_t str_tab_cap;
    int oom_list;                /* the list of the last oom event, -1 none */
} ctx;

enum { EV_OTHER, EV_ALLOC, EV_FREE, EV_SEG_ALLOC, EV_SEG_FREE, EV_OOM };

/* One trace event as the analyses need it: no frames, only what was read
 * from them (an interned owner and phase, the user's outermost line). */
typedef struct snap_ev {
    int64_t addr, size, time_us;
    int32_t owner, phase; /* interned strings, -1 none */
    uint64_t uline;       /* the user's outermost line, hashed; 0 none */
    uint8_t list;         /* index into ctx.lists */
    uint8_t action;
} snap_ev;

static int bad(ctx *c, const char *where, const char *what) {
    tk_err_set(c->err, TK_EFORMAT, "%s: %s: %s", c->name, where, what);
    return -1;
}

/* A host allocation failed while reading `where`: TK_ENOMEM. -1. */
static int bad_nomem(ctx *c, const char *where) {
    tk_err_set(c->err, TK_ENOMEM, "%s: %s: out of host memory", c->name, where);
    return -1;
}

/* A non-negative integer field; missing_ok keeps *o when absent. */
static int field_size(ctx *c, sv d, const char *key, const char *where, int missing_ok, int64_t *o) {
    sv v = sv_get(d, key);
    char w[160], m[96];
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (!sv_ok(v)) return missing_ok ? 0 : bad(c, w, "missing");
    if (sv_int(v, o) || *o < 0) {
        snprintf(m, sizeof m, "expected a non-negative integer, found %s", sv_kind(v));
        return bad(c, w, m);
    }
    return 0;
}

static const char *basename_of(const char *p) {
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

static int ends_with(const char *s, const char *t) {
    size_t n = strlen(s), m = strlen(t);
    return n >= m && !strcmp(s + n - m, t);
}

static int is_notebook_frame(const char *f) {
    return (strstr(f, "/ipykernel_") && ends_with(f, ".py")) || strstr(f, "<ipython-input-") != NULL;
}
/* A Python frame is a .py file or a notebook cell; everything else a
 * stacks="all" snapshot records (the allocator's C++, ATen's .cpp, CPython's
 * methodobject.c, "??", "", a thread routine's .o) is native code, never
 * shown as code. */
static int is_python_frame(const char *f) {
    return ends_with(f, ".py") || ends_with(f, ".pyw") || is_notebook_frame(f);
}
static int is_library_frame(const char *f) {
    return strstr(f, "/site-packages/") || strstr(f, "/dist-packages/") || strstr(f, "/lib/python") ||
           strstr(f, "/Lib/") || strstr(f, "/torch/") || strstr(f, "/transformers/");
}
/* The library path from the package on: "torch/nn/modules/linear.py". */
static const char *library_tail(const char *f) {
    const char *k;
    if ((k = strstr(f, "/site-packages/"))) return k + 15;
    if ((k = strstr(f, "/dist-packages/"))) return k + 15;
    if ((k = strstr(f, "/torch/"))) return k + 1;
    if ((k = strstr(f, "/transformers/"))) return k + 1;
    return basename_of(f);
}
/* The library frames worth naming beside the user's line: the module or
 * optimizer that allocated, not torch's dispatch plumbing. */
static int is_named_library(const char *tail) {
    static const char *const P[] = {"torch/nn/modules/", "torch/optim/", "transformers/", "vllm/", "peft/",
                                    "accelerate/", "bitsandbytes/"};
    for (size_t i = 0; i < sizeof P / sizeof *P; i++)
        if (!strncmp(tail, P[i], strlen(P[i]))) return 1;
    return 0;
}

/* A filename with Windows separators read like a POSIX one (C:\a\b.py ->
 * C:/a/b.py), so one set of rules shortens both. */
static void posix_path(const char *f, char *out, size_t n) {
    size_t i = 0;
    for (; f[i] && i + 1 < n; i++) out[i] = f[i] == '\\' ? '/' : f[i];
    out[i] = 0;
}

#define BEFORE_HISTORY "no frames (allocated before the history was recorded)"

/* Owners that name no code of the user's: native code only, no frames, a library. */
static int names_no_code(const char *owner) {
    return !strncmp(owner, "no Python frame", 15) || !strcmp(owner, BEFORE_HISTORY) || !strncmp(owner, "library:", 8) ||
           !strncmp(owner, "backward (", 10);
}

/* The native frames of a block with no Python frame, named by what they
 * show: the autograd engine's worker thread runs backward; otherwise the
 * ATen operator that asked (at::_ops::NAME), else nothing known. */
static void native_owner(sv frames, char *out, size_t n) {
    char op[96] = "";
    if (!sv_is_list(frames) || !sv_len(frames)) {
        /* PyTorch records frames only while the history is on */
        snprintf(out, n, "%s", BEFORE_HISTORY);
        return;
    }
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *file = sv_str(sv_get(f, "filename"));
        const char *fn = sv_str(sv_get(f, "name"));
        if ((fn && (strstr(fn, "torch::autograd::Engine") || strstr(fn, "torch::autograd::python::PythonEngine"))) ||
            (file && !strcmp(file, "engine.cpp"))) {
            snprintf(out, n, "backward (autograd engine)");
            return;
        }
        if (!op[0] && fn && !strncmp(fn, "at::_ops::", 10)) {
            const char *e = strstr(fn + 10, "::");
            snprintf(op, sizeof op, "%.*s", e ? (int)(e - fn - 10) : (int)strlen(fn + 10), fn + 10);
        }
    }
    if (op[0]) snprintf(out, n, "no Python frame (C++: aten::%s)", op);
    else snprintf(out, n, "no Python frame");
}

/* Who holds a block: the innermost frame of the user's code, with the
 * innermost named library frame inside it as the kind; native frames are
 * skipped, and a block with native frames only is named by them. */
static void owner_of(sv frames, char *out, size_t n) {
    char kind[96] = "", first_py[TK_PATH_MAX] = "", file[TK_PATH_MAX];
    int python = 0;
    int first_line = 0;
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *raw = sv_str(sv_get(f, "filename"));
        const char *fn = sv_str(sv_get(f, "name"));
        int64_t line = 0;
        /* txkernel's own snapshots name the owner and category in the frame */
        if (raw && !strcmp(raw, "txkernel") && fn) {
            snprintf(out, n, "%s", fn);
            return;
        }
        if (!raw || !is_python_frame(raw)) continue;
        posix_path(raw, file, sizeof file);
        sv_int(sv_get(f, "line"), &line);
        if (!python) {
            snprintf(first_py, sizeof first_py, "%s", file);
            first_line = (int)line;
        }
        python = 1;
        if (is_notebook_frame(file)) {
            snprintf(out, n, "cell, line %lld%s%s", (long long)line, *kind ? " · " : "", kind);
            return;
        }
        if (is_library_frame(file)) {
            const char *t = library_tail(file);
            if (!*kind && is_named_library(t)) snprintf(kind, sizeof kind, "%.95s", t);
            continue;
        }
        snprintf(out, n, "%.80s, line %lld (%.60s)%s%s", basename_of(file), (long long)line, fn ? fn : "?",
                 *kind ? " · " : "", kind);
        return;
    }
    if (*kind) snprintf(out, n, "library: %s", kind);
    else if (python) snprintf(out, n, "library: %s, line %d", library_tail(first_py), first_line);
    else native_owner(frames, out, n);
}

/* The model module a block's Python frames pass through, as the library
 * names its files: transformers/models/NAME/modeling_NAME.py,
 * vllm/model_executor/models/NAME.py. 1 with name and file set. */
static int model_module_of(sv frames, char *name, size_t nn, char *file, size_t nf) {
    char path[TK_PATH_MAX];
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        const char *raw = sv_str(sv_get(sv_at(frames, i), "filename"));
        if (!raw || !ends_with(raw, ".py")) continue;
        posix_path(raw, path, sizeof path);
        const char *k = strstr(path, "transformers/models/"), *e;
        if (k && (e = strchr(k + 20, '/')) && strstr(e, "/modeling_")) {
            snprintf(name, nn, "%.*s", (int)(e - k - 20), k + 20);
            snprintf(file, nf, "%s", k);
            return 1;
        }
        if ((k = strstr(path, "vllm/model_executor/models/"))) {
            const char *b = k + 27;
            if (!strchr(b, '/')) {
                snprintf(name, nn, "%.*s", (int)(strlen(b) - 3), b);
                snprintf(file, nf, "%s", k);
                return 1;
            }
        }
    }
    return 0;
}

/* A block an inference engine preallocated as its KV-cache pool: vLLM's
 * cache engine (v0) or its model runner's initialize_kv_cache (v1). */
static int is_engine_pool(sv frames) {
    char path[TK_PATH_MAX];
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *raw = sv_str(sv_get(f, "filename")), *fn = sv_str(sv_get(f, "name"));
        if (!raw || !ends_with(raw, ".py")) continue;
        posix_path(raw, path, sizeof path);
        if (strstr(path, "vllm/") && (strstr(path, "/cache_engine.py") || (fn && strstr(fn, "kv_cache")))) return 1;
    }
    return 0;
}

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

static int add_owner(ctx *c, const char *owner, size_t bytes, int64_t addr, int pool) {
    tk_snapshot *s = c->s;
    for (int i = 0; i < s->n_owners; i++)
        if (!strcmp(s->owners[i].owner, owner)) {
            s->owners[i].bytes += bytes;
            if (pool) s->owners[i].pool_bytes += bytes;
            s->owners[i].blocks++;
            if (bytes > s->owners[i].largest) s->owners[i].largest = bytes, s->owners[i].largest_addr = addr;
            return 0;
        }
    if (s->n_owners == c->owners_cap) {
        int cap = c->owners_cap ? c->owners_cap * 2 : 16;
        tk_snap_owner *o = tk_realloc(s->owners, (size_t)cap * sizeof *o);
        if (!o) return bad_nomem(c, "owners");
        s->owners = o;
        c->owners_cap = cap;
    }
    tk_snap_owner *o = &s->owners[s->n_owners++];
    snprintf(o->owner, sizeof o->owner, "%s", owner);
    o->bytes = bytes;
    o->blocks = 1;
    o->phase[0] = 0;
    o->largest = bytes;
    o->largest_addr = addr;
    o->pool_bytes = pool ? bytes : 0;
    return 0;
}

static int add_live_size(ctx *c, size_t size) {
    tk_snapshot *s = c->s;
    if (s->n_live_sizes == c->sizes_cap) {
        int cap = c->sizes_cap ? c->sizes_cap * 2 : 256;
        size_t *v = tk_realloc(s->live_sizes, (size_t)cap * sizeof *v);
        if (!v) return bad_nomem(c, "blocks");
        s->live_sizes = v;
        c->sizes_cap = cap;
    }
    s->live_sizes[s->n_live_sizes++] = size;
    return 0;
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

static int read_segment(ctx *c, sv seg, size_t si, int64_t *devices_seen) {
    tk_snapshot *s = c->s;
    char where[96];
    snprintf(where, sizeof where, "segments[%zu]", si);
    if (!sv_is_dict(seg)) return bad(c, where, "expected a dict (a segment)");
    int64_t total = 0, stream = 0, device = 0, addr = 0;
    if (field_size(c, seg, "total_size", where, 0, &total) || field_size(c, seg, "device", where, 1, &device))
        return -1;
    sv_int(sv_get(seg, "address"), &addr);
    if (sv_true(sv_get(seg, "is_expandable"))) s->expandable_on = 1;
    tk_snap_device *dv = device_row(s, device);
    sv st = sv_get(seg, "stream");
    if (sv_ok(st) && sv_int(st, &stream)) return bad(c, where, "'stream' is not an integer");
    if (device >= 0 && device < 64) *devices_seen |= (int64_t)(UINT64_C(1) << device);
    const char *type = sv_str(sv_get(seg, "segment_type"));
    int small = type && !strcmp(type, "small");
    tk_snap_pool *p = pool_of(s, type ? type : "?", stream);
    if (dv) dv->segments++, dv->reserved += (size_t)total;
    p->segments++;
    p->reserved += (size_t)total;
    s->reserved += (size_t)total;
    s->n_segments++;
    sv blocks = sv_get(seg, "blocks");
    if (!sv_is_list(blocks)) return bad(c, where, "'blocks' missing or not a list");
    size_t active = 0;
    for (size_t bi = 0; bi < sv_len(blocks); bi++) {
        sv b = sv_at(blocks, bi);
        char bw[128];
        snprintf(bw, sizeof bw, "%s.blocks[%zu]", where, bi);
        if (!sv_is_dict(b)) return bad(c, bw, "expected a dict (a block)");
        int64_t size = 0, req = 0, baddr = addr;
        if (field_size(c, b, "size", bw, 0, &size) || field_size(c, b, "requested_size", bw, 1, &req)) return -1;
        sv_int(sv_get(b, "address"), &baddr);
        const char *state = sv_str(sv_get(b, "state"));
        if (!state) return bad(c, bw, "'state' missing or not a string");
        s->n_blocks++;
        if (!strcmp(state, "active_allocated")) {
            s->allocated += (size_t)size;
            s->requested += (size_t)req;
            p->allocated += (size_t)size;
            s->n_live_blocks++;
            active += (size_t)size;
            sv frames = sv_get(b, "frames");
            sv hist = sv_get(b, "history");
            /* PyTorch 2.0 kept frames in the block's history, newest last. */
            if (!sv_ok(frames) && sv_is_list(hist) && sv_len(hist))
                frames = sv_get(sv_at(hist, sv_len(hist) - 1), "frames");
            char owner[192], mname[48], mfile[160];
            owner_of(frames, owner, sizeof owner);
            int pool = is_engine_pool(frames);
            if (add_owner(c, owner, (size_t)size, baddr, pool)) return -1;
            if (add_live_size(c, (size_t)(req > 0 ? req : size))) return -1;
            if (dv) dv->allocated += (size_t)size;
            if (pool) s->vllm_pool_bytes += (size_t)size, s->vllm_pool_blocks++;
            if (model_module_of(frames, mname, sizeof mname, mfile, sizeof mfile)) {
                int k = 0;
                while (k < c->n_modules && strcmp(c->modules[k].name, mname)) k++;
                if (k == c->n_modules && k < (int)(sizeof c->modules / sizeof *c->modules)) {
                    snprintf(c->modules[k].name, sizeof c->modules[k].name, "%s", mname);
                    snprintf(c->modules[k].file, sizeof c->modules[k].file, "%s", mfile);
                    c->n_modules++;
                }
                if (k < c->n_modules) c->modules[k].bytes += (size_t)size;
            }
        } else if (!strcmp(state, "inactive")) {
            s->free_in_cache += (size_t)size;
            p->free += (size_t)size;
            s->n_free_blocks++;
            if ((size_t)size > s->largest_free_block) s->largest_free_block = (size_t)size;
            if ((size_t)size > p->largest_free) p->largest_free = (size_t)size;
            if (dv) {
                if ((size_t)size > dv->largest_free_block) dv->largest_free_block = (size_t)size;
                size_t *fr = small ? &dv->free_small : &dv->free_large, *lg = small ? &dv->largest_small : &dv->largest_large;
                *fr += (size_t)size;
                if ((size_t)size > *lg) *lg = (size_t)size;
            }
        } else {
            s->pending_free += (size_t)size;
            active += (size_t)size;
        }
    }
    if (!active) s->empty_segments += (size_t)total;
    return 0;
}

/* ---- the trace, one event at a time ------------------------------------------------------ */

static int phase_from_frames(sv frames, char *out, size_t n);
static int outer_user_line(sv frames, uint64_t *key);

/* The index of str in the interned strings (added when new), -1 when host
 * memory runs out. */
static int intern(ctx *c, const char *str) {
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

static const char *interned(const ctx *c, int32_t i) { return i >= 0 && i < c->n_strs ? c->strs[i] : ""; }

/* One event of the device list `list` (its identity: the lists are put in
 * order by the caller later): checked, and kept as a record. */
static int ingest_event(ctx *c, sv e, const void *list) {
    tk_snapshot *s = c->s;
    int li = 0;
    while (li < c->n_lists && c->lists[li] != list) li++;
    if (li == c->n_lists) {
        if (li == 64) return bad(c, "device_traces", "more than 64 devices' traces");
        c->lists[c->n_lists++] = list;
    }
    char w[96];
    snprintf(w, sizeof w, "device_traces[%d][%zu]", li, c->list_items[li]++);
    if (!sv_is_dict(e)) return bad(c, w, "expected a dict (a trace event)");
    const char *a = sv_str(sv_get(e, "action"));
    if (!a) return bad(c, w, "'action' missing or not a string");
    snap_ev r = {.owner = -1, .phase = -1, .time_us = -1, .list = (uint8_t)li};
    if (field_size(c, e, "size", w, 1, &r.size)) return -1;
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
        owner_of(frames, buf, sizeof buf);
        if ((r.owner = intern(c, buf)) < 0) return bad_nomem(c, "device_traces");
        if (outer_user_line(frames, &r.uline) && !r.uline) r.uline = 1;
    }
    if (r.action != EV_OTHER && phase_from_frames(frames, buf, 64) && (r.phase = intern(c, buf)) < 0)
        return bad_nomem(c, "device_traces");
    if (r.action == EV_OOM) {
        int64_t fr = 0;
        if (field_size(c, e, "device_free", w, 1, &fr)) return -1;
        s->has_oom = 1;
        c->oom_list = li;
        s->oom_size = (size_t)r.size;
        s->oom_device_free = (size_t)fr;
        s->oom_time_us = r.time_us;
    }
    if (c->n_ev == c->ev_cap) {
        size_t cap = c->ev_cap ? c->ev_cap * 2 : 1024;
        snap_ev *v = tk_realloc(c->ev, cap * sizeof *v);
        if (!v) return bad_nomem(c, "device_traces");
        c->ev = v;
        c->ev_cap = cap;
    }
    c->ev[c->n_ev++] = r;
    s->n_trace++;
    return 0;
}

/* The streaming reader's callback: each trace event as it is read. */
static int on_event(void *cx, const tk_pval *list, const tk_pval *item, tk_err *err) {
    (void)err;
    return ingest_event(cx, (sv){item, NULL}, list);
}

/* After the file: the lists in device order (their places in
 * device_traces), the OOM's device, and the memory over time from the
 * records. JSON's events are read here (the pickle's were streamed). */
static int build_trace(ctx *c, sv traces, int streamed) {
    tk_snapshot *s = c->s;
    int dev_of[64];
    if (!sv_ok(traces)) return 0;
    if (!sv_is_list(traces)) return bad(c, "device_traces", "expected a list (one per device)");
    for (size_t d = 0; d < sv_len(traces); d++) {
        sv t = sv_at(traces, d);
        if (!sv_is_list(t)) return bad(c, "device_traces", "each device's trace must be a list");
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
    if (!s->points) return bad_nomem(c, "device_traces");
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

static int cmp_owner(const void *a, const void *b) {
    const tk_snap_owner *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return strcmp(x->owner, y->owner);
}

/* ---- the leak --------------------------------------------------------------------------- */

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

/* The user's outermost frame (a line of their code that is not a library's)
 * as one number: file and line hashed. 0 when the stack has none. */
static int outer_user_line(sv frames, uint64_t *key) {
    int found = 0;
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *raw = sv_str(sv_get(f, "filename"));
        char path[TK_PATH_MAX];
        int64_t line = 0;
        if (!raw || !is_python_frame(raw)) continue;
        posix_path(raw, path, sizeof path);
        if (is_library_frame(path) && !is_notebook_frame(path)) continue;
        sv_int(sv_get(f, "line"), &line);
        uint64_t h = UINT64_C(1469598103934665603);
        for (const char *p = path; *p; p++) h = (h ^ (unsigned char)*p) * UINT64_C(1099511628211);
        *key = h ^ (uint64_t)line * UINT64_C(0x9E3779B97F4A7C15);
        found = 1;
    }
    return found;
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
static int find_leak(ctx *c) {
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
    int pt = -1, it = 0, nsurv = 0, rounds = -1, nlines = 0;
    uint64_t lines[64];
    for (size_t i = 0; i < c->n_ev; i++) {
        const snap_ev *e = &c->ev[i];
        int64_t addr = e->addr, size = e->size;
        int is_alloc = e->action == EV_ALLOC, is_free = e->action == EV_FREE;
        uint64_t key = e->uline;
        if (is_alloc && key) {
            if (rounds < 0) rounds = 0;
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
     * the trace, a loop's iteration is one that gives back at least half of
     * what it took before the next (its trough halfway down from its peak);
     * rises that keep most of what they took are one step growing. */
    int loop;
    if (rounds >= 0)
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
    bad_nomem(c, "device_traces");
out:
    free(peak);
    free(trough);
    free(tab);
    free(surv);
    free(own);
    return rc;
}

/* ---- diagnoses and fixes -------------------------------------------------------------- */

static const char *fmtb(size_t b, char buf[32]) { return tk_format_bytes(b, buf, 32); }

static tk_snap_diag *diag(tk_snapshot *s, const char *id) {
    if (s->n_diag == TK_SNAP_MAX_DIAG) return NULL;
    tk_snap_diag *d = &s->diag[s->n_diag++];
    snprintf(d->id, sizeof d->id, "%s", id);
    return d;
}

static tk_snap_fix *fix(tk_snapshot *s, const char *id, int64_t saves) {
    for (int i = 0; i < s->n_fixes; i++)
        if (!strcmp(s->fixes[i].id, id)) return NULL;
    if (s->n_fixes == TK_SNAP_MAX_FIXES) return NULL;
    tk_snap_fix *f = &s->fixes[s->n_fixes++];
    snprintf(f->id, sizeof f->id, "%s", id);
    f->saves = saves;
    return f;
}

static int has_diag(const tk_snapshot *s, const char *id) {
    for (int i = 0; i < s->n_diag; i++)
        if (!strcmp(s->diag[i].id, id)) return 1;
    return 0;
}

static void fixes_fragmentation(tk_snapshot *s) {
    char a[32], b[32];
    /* what allocator_settings (or the segments) show is on is not advised again */
    tk_snap_fix *f = s->expandable_on ? NULL : fix(s, "expandable_segments", (int64_t)(s->free_in_cache - s->largest_free_block));
    if (f) {
        snprintf(f->text, sizeof f->text,
                 "Let the allocator grow segments instead of stranding free blocks: %s of free cache is in blocks "
                 "smaller than the largest (%s) and becomes usable. Set it before the first CUDA call "
                 "(restart the runtime).",
                 fmtb(s->free_in_cache - s->largest_free_block, a), fmtb(s->largest_free_block, b));
        snprintf(f->code, sizeof f->code,
                 "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"\nimport torch");
    }
    if (s->empty_segments && (f = fix(s, "empty_cache", (int64_t)s->empty_segments))) {
        snprintf(f->text, sizeof f->text,
                 "Return the cached segments that hold no live tensor (%s) to the device, e.g. between "
                 "evaluation and training.",
                 fmtb(s->empty_segments, a));
        snprintf(f->code, sizeof f->code, "torch.cuda.empty_cache()");
    }
}

/* An inference engine's KV-cache pool, preallocated at its start to a
 * fraction of the card: the setting is that fraction. */
static void fixes_engine_pool(tk_snapshot *s) {
    char a[32], b[32];
    tk_snap_fix *f = fix(s, "memory_fraction", -1);
    if (!f) return;
    snprintf(f->text, sizeof f->text,
             "vLLM preallocated its KV-cache pool at start-up: %s in %d blocks, %.0f%% of what is allocated (%s). "
             "It takes gpu_memory_utilization of the card whatever the requests need; lower it to leave room for the "
             "rest of the process (each 0.1 less frees a tenth of the card).",
             fmtb(s->vllm_pool_bytes, a), s->vllm_pool_blocks, 100.0 * (double)s->vllm_pool_bytes / (double)s->allocated,
             fmtb(s->allocated, b));
    snprintf(f->code, sizeof f->code,
             "llm = LLM(model=name, gpu_memory_utilization=0.5)   # vLLM's default is 0.9\n"
             "# verl: actor_rollout_ref.rollout.gpu_memory_utilization=0.5");
}

static void fixes_capacity(tk_snapshot *s) {
    char a[32];
    tk_snap_fix *f;
    const tk_snap_owner *user = NULL;
    /* del is for tensors the user's code keeps: not a pool an engine
     * preallocated, nor what only native code or a library holds */
    for (int i = 0; i < s->n_owners && !user; i++)
        if (!names_no_code(s->owners[i].owner) && s->owners[i].pool_bytes < s->owners[i].bytes / 2)
            user = &s->owners[i];
    if (user && (f = fix(s, "del", (int64_t)user->bytes))) {
        snprintf(f->text, sizeof f->text,
                 "Drop the references made at %s once they are no longer needed (%s live in %d blocks), "
                 "then collect and release the cache.",
                 user->owner, fmtb(user->bytes, a), user->blocks);
        snprintf(f->code, sizeof f->code,
                 "del outputs, loss  # the tensors created at %s\nimport gc; gc.collect()\ntorch.cuda.empty_cache()",
                 user->owner);
    }
    if ((f = fix(s, "batch", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Halve the micro-batch and accumulate twice as many steps: the effective batch stays, the "
                 "activations halve (this snapshot does not separate activations from weights, so it cannot "
                 "say how many bytes that is).");
        snprintf(f->code, sizeof f->code,
                 "# B, k: your current per_device_train_batch_size and gradient_accumulation_steps\n"
                 "TrainingArguments(..., per_device_train_batch_size=B // 2, gradient_accumulation_steps=2 * k)");
    }
    if ((f = fix(s, "precision", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Mixed precision keeps activations in 16 bits, about half their bytes (bf16 on Ampere or newer, "
                 "fp16 on a T4 or V100).");
        snprintf(f->code, sizeof f->code, "TrainingArguments(..., bf16=True)  # or fp16=True");
    }
    if ((f = fix(s, "checkpointing", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Gradient checkpointing keeps one activation per layer and recomputes the rest in backward "
                 "(about 30%% more compute).");
        snprintf(f->code, sizeof f->code, "model.gradient_checkpointing_enable()");
    }
    if ((f = fix(s, "max_length", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Shorter sequences shrink every activation (attention scores quadratically); pick max_length from "
                 "the data's token lengths (txk data FILE shows the percentiles).");
        snprintf(f->code, sizeof f->code, "tokenizer(texts, truncation=True, max_length=128)");
    }
}

/* A leak is the cause when there is one: whatever else the end shows, it
 * would have grown into it. */
static void diagnose_leak(tk_snapshot *s) {
    char a[32], b[32], c[32];
    tk_snap_diag *g = diag(s, "leak");
    tk_snap_fix *f;
    const char *who = s->leak_owner[0] && strncmp(s->leak_owner, "no Python frame", 15) &&
                              strcmp(s->leak_owner, BEFORE_HISTORY) ? s->leak_owner : NULL;
    int per_iter_blocks = s->leak_owner_iterations ? s->leak_owner_blocks / s->leak_owner_iterations : 0;
    if (!g) return;
    int m = snprintf(g->text, sizeof g->text,
                     "leak: allocated memory that stays from one iteration to the next grows by %s per iteration "
                     "(%s over the %d iterations the trace shows)",
                     fmtb(s->leak_per_iteration, a), fmtb(s->leak_total, b), s->leak_iterations);
    if (m > 0 && (size_t)m < sizeof g->text) {
        if (who)
            snprintf(g->text + m, sizeof g->text - (size_t)m,
                     "; still live at the end: %s in %d blocks allocated at %s in %d different iterations.",
                     fmtb(s->leak_owner_bytes, c), s->leak_owner_blocks, who, s->leak_owner_iterations);
        else
            snprintf(g->text + m, sizeof g->text - (size_t)m,
                     "; the trace's frames do not say who allocated what stays%s.",
                     s->leak_owner[0] ? " (no Python frame)" : "");
    }
    if (!(f = fix(s, "leak", (int64_t)s->leak_total))) return;
    /* Many blocks kept per iteration is a graph kept alive; one or two are
     * outputs kept in a list or dict. */
    if (per_iter_blocks >= 8 || !who)
        snprintf(f->text, sizeof f->text,
                 "Stop keeping each iteration's autograd graph: accumulate Python numbers, not tensors, and run "
                 "evaluation without a graph. The snapshot says this frees the %s that piled up (%s per "
                 "iteration)%s%s.",
                 fmtb(s->leak_total, a), fmtb(s->leak_per_iteration, b), who ? "; the code at " : "", who ? who : "");
    else
        snprintf(f->text, sizeof f->text,
                 "Keep copies off the device and without their graph: what is appended or stored each iteration "
                 "at %s stays on the GPU. The snapshot says this frees the %s that piled up (%s per iteration).",
                 who, fmtb(s->leak_total, a), fmtb(s->leak_per_iteration, b));
    snprintf(f->code, sizeof f->code,
             "%s"
             "total_loss += loss.item()                  # not total_loss += loss: that keeps every step's graph\n"
             "preds.append(logits.detach().cpu())        # not the CUDA tensor with its graph\n"
             "del outputs, loss                          # at the end of each step\n"
             "with torch.no_grad():                      # around evaluation: no graph is built\n"
             "    outputs = model(**batch)",
             per_iter_blocks >= 8 || !who ? "" : "# the tensors kept at the line above\n");
}

static void diagnose(tk_snapshot *s) {
    char a[32], b[32], c[32], d[32];
    tk_snap_diag *g;
    size_t need = s->has_oom ? s->oom_size : 0;
    if (s->has_leak) diagnose_leak(s);
    if (s->has_growth && (g = diag(s, "growth")))
        snprintf(g->text, sizeof g->text,
                 "growth, not a leak: allocated rises by %s inside one step (%d rises that keep most of what they "
                 "took: activations kept layer by layer for backward, the optimizer state created at its first "
                 "step); no repeating loop leaves bytes behind in this trace.",
                 fmtb(s->growth_bytes, a), s->growth_rises);
    if (s->vllm_pool_bytes && s->vllm_pool_bytes >= s->allocated / 2 && (g = diag(s, "engine_pool"))) {
        snprintf(g->text, sizeof g->text,
                 "engine_pool: an inference engine's KV-cache pool (vLLM's cache engine, allocated at its __init__) "
                 "holds %s of the %s allocated.",
                 fmtb(s->vllm_pool_bytes, a), fmtb(s->allocated, b));
        fixes_engine_pool(s);
    }
    /* At an OOM, the figures that matter are the failing device's. */
    const tk_snap_device *od = NULL;
    for (int i = 0; s->has_oom && s->n_device_rows > 1 && i < s->n_device_rows; i++)
        if (s->devices[i].device == s->oom_device) od = &s->devices[i];
    char on[48] = "";
    if (od) snprintf(on, sizeof on, " on device %d (of %d)", od->device, s->n_device_rows);
    size_t reserved = od ? od->reserved : s->reserved, allocated = od ? od->allocated : s->allocated;
    /* Fragmentation: enough is free in the cache, in pieces too small. With
     * an OOM that is "free >= request > largest block" in the request's pool
     * (PyTorch serves requests of up to 1 MiB from the small pool only);
     * without one, a cache whose free part is at least a quarter of what is
     * reserved and scattered (no block holds half of it). */
    const char *pool = need <= ((size_t)1 << 20) ? "small" : "large";
    size_t pool_free = 0, pool_largest = 0;
    for (int i = 0; !od && i < s->n_pools; i++)
        if (!strcmp(s->pools[i].pool, pool)) {
            pool_free += s->pools[i].free;
            if (s->pools[i].largest_free > pool_largest) pool_largest = s->pools[i].largest_free;
        }
    if (od) {
        int small = !strcmp(pool, "small");
        pool_free = small ? od->free_small : od->free_large;
        pool_largest = small ? od->largest_small : od->largest_large;
    }
    int frag = s->has_oom ? (pool_free >= need && pool_largest < need)
                          : (s->free_in_cache >= s->reserved / 4 && s->free_in_cache >= ((size_t)1 << 20) &&
                             s->largest_free_block < s->free_in_cache / 2);
    /* Capacity: at an OOM that is not fragmentation, no block of the pool
     * fits and the device cannot give a new segment; without an OOM, the
     * live tensors fill the device or, without a capacity, what PyTorch
     * reserved. */
    int cap = s->has_oom ? !frag
                         : (s->reserved && s->allocated >= s->reserved / 10 * 9 &&
                            (!s->capacity || s->reserved >= s->capacity / 10 * 9));
    if (frag && (g = diag(s, "fragmentation"))) {
        int m = snprintf(g->text, sizeof g->text,
                 "fragmentation: %s of the %s PyTorch reserved is free, in %d blocks, but the largest is %s%s%s.",
                 fmtb(s->free_in_cache, a), fmtb(s->reserved, b), s->n_free_blocks, fmtb(s->largest_free_block, c),
                 need ? " and the failed request was " : "", need ? fmtb(need, d) : "");
        if (s->expandable_on && m > 0 && (size_t)m < sizeof g->text)
            snprintf(g->text + m, sizeof g->text - (size_t)m,
                     " Expandable segments are already on (allocator_settings), so that setting is not advised.");
    }
    if (cap && (g = diag(s, "capacity"))) {
        if (s->has_oom) {
            char e[32], f[32];
            snprintf(g->text, sizeof g->text,
                     "capacity: tried to allocate %s%s; no free block of the %s pool fits it (%s free there, largest "
                     "%s) and the device has only %s free for a new segment; live tensors hold %s of the %s "
                     "reserved%s.",
                     fmtb(need, a), on, pool, fmtb(pool_free, b), fmtb(pool_largest, c), fmtb(s->oom_device_free, d),
                     fmtb(allocated, e), fmtb(reserved, f), od ? " there" : "");
        } else
            snprintf(g->text, sizeof g->text,
                     "capacity: live tensors fill %s: %s of %s is allocated, the cache holds only %s free "
                     "(largest block %s).",
                     s->capacity ? "the device" : "what PyTorch reserved", fmtb(s->allocated, a),
                     fmtb(s->capacity ? s->capacity : s->reserved, b), fmtb(s->free_in_cache, c),
                     fmtb(s->largest_free_block, d));
    }
    /* Headroom: with the card's size known, what neither PyTorch holds nor
     * the device reports free is held by someone else. */
    if (s->has_oom && s->capacity && reserved + s->oom_device_free < s->capacity / 100 * 90 &&
        (g = diag(s, "headroom"))) {
        size_t other = s->capacity - reserved - s->oom_device_free;
        snprintf(g->text, sizeof g->text,
                 "headroom: %s of the %s device is held outside this process's cache (another process, an earlier "
                 "run, or the CUDA context).",
                 fmtb(other, a), fmtb(s->capacity, b));
    }
    if (s->n_owners && s->allocated && strncmp(s->owners[0].owner, "no Python frame", 15) &&
        strcmp(s->owners[0].owner, BEFORE_HISTORY) &&
        s->owners[0].bytes >= s->allocated / 5 * 2 && s->n_owners > 1 && (g = diag(s, "dominant_layer"))) {
        snprintf(g->text, sizeof g->text, "dominant_layer: %s holds %s, %.0f%% of what is allocated.",
                 s->owners[0].owner, fmtb(s->owners[0].bytes, a), 100.0 * (double)s->owners[0].bytes / (double)s->allocated);
    }
    if (has_diag(s, "fragmentation")) fixes_fragmentation(s);
    if (has_diag(s, "capacity") || has_diag(s, "dominant_layer")) fixes_capacity(s);
    if (has_diag(s, "headroom")) {
        tk_snap_fix *f = fix(s, "release", -1);
        if (f) {
            snprintf(f->text, sizeof f->text,
                     "Free the device of the other holder: restart the runtime (or the process shown by nvidia-smi).");
            snprintf(f->code, sizeof f->code, "!nvidia-smi --query-compute-apps=pid,used_memory --format=csv");
        }
    }
}

/* ---- phases: what ran at a moment of the trace ------------------------------------------- */

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

/* The phase an allocation's own frames show: the autograd engine or
 * torch.autograd -> backward; torch/optim -> Optimizer.step; the
 * DataLoader; a module's forward (the innermost forward frame). */
static int phase_from_frames(sv frames, char *out, size_t n) {
    char path[TK_PATH_MAX], fwd[160] = "";
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *raw = sv_str(sv_get(f, "filename")), *fn = sv_str(sv_get(f, "name"));
        if (fn && (strstr(fn, "torch::autograd::Engine") || strstr(fn, "torch::autograd::python::PythonEngine"))) {
            snprintf(out, n, "backward");
            return 1;
        }
        if (!raw || !is_python_frame(raw)) continue;
        posix_path(raw, path, sizeof path);
        if (strstr(path, "/torch/autograd/")) {
            snprintf(out, n, "backward");
            return 1;
        }
        if (strstr(path, "/torch/optim/")) {
            snprintf(out, n, "Optimizer.step");
            return 1;
        }
        if (strstr(path, "/torch/utils/data/")) {
            snprintf(out, n, "DataLoader");
            return 1;
        }
        if (!fwd[0] && fn && !strcmp(fn, "forward") && !strstr(path, "/torch/nn/modules/module.py")) {
            int64_t line = 0;
            sv_int(sv_get(f, "line"), &line);
            snprintf(fwd, sizeof fwd, "forward (%.100s, line %lld)", basename_of(path), (long long)line);
        }
    }
    if (!fwd[0]) return 0;
    snprintf(out, n, "%.63s", fwd);
    return 1;
}

/* The phase at time t on a device: the annotations' innermost open range,
 * else what the event's own frames showed (phase, interned; -1 none). */
static void phase_at(const ctx *c, sv ann, int device, int64_t t, int32_t phase, char *out, size_t n) {
    if (!phase_from_annotations(ann, device, t, out, n)) snprintf(out, n, "%s", interned(c, phase));
}

/* The phase at the peak, at the OOM, and for each owner at the allocation
 * of its largest live block (the trace's last alloc at that address). */
static int find_phases(ctx *c, sv ann) {
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
    if (!tab) return bad_nomem(c, "device_traces");
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

/* ---- entry points --------------------------------------------------------------------- */

/* The snapshot's tree (a pickle's trace events already streamed through
 * on_event when streamed is 1). */
static int read_tree(ctx *c, sv root, int streamed) {
    tk_snapshot *s = c->s;
    sv segs = root;
    if (sv_is_dict(root)) {
        s->form = s->form ? s->form : "pickle (dict)";
        segs = sv_get(root, "segments");
        if (!sv_is_list(segs)) return bad(c, "segments", "missing or not a list: not a PyTorch memory snapshot");
    } else if (sv_is_list(root)) {
        s->form = s->form ? s->form : "pickle (list of segments)";
    } else {
        char m[128];
        snprintf(m, sizeof m, "expected a dict with 'segments' or a list of segments, found %s", sv_kind(root));
        return bad(c, "top level", m);
    }
    int64_t devices = 0;
    for (size_t i = 0; i < sv_len(segs); i++)
        if (read_segment(c, sv_at(segs, i), i, &devices)) return -1;
    for (int d = 0; d < 64; d++) s->n_devices += (int)((devices >> d) & 1);
    for (int k = 0; k < c->n_modules; k++)
        if (c->modules[k].bytes > s->model_module_bytes) {
            s->model_module_bytes = c->modules[k].bytes;
            snprintf(s->model_module, sizeof s->model_module, "%s", c->modules[k].name);
            snprintf(s->model_module_file, sizeof s->model_module_file, "%s", c->modules[k].file);
        }
    if (sv_is_dict(root)) {
        sv traces = sv_get(root, "device_traces"), ann = sv_get(root, "external_annotations");
        if (sv_true(sv_get(sv_get(root, "allocator_settings"), "expandable_segments"))) s->expandable_on = 1;
        s->has_annotations = sv_is_list(ann) && sv_len(ann) > 0;
        if (build_trace(c, traces, streamed) || find_leak(c) || find_phases(c, ann)) return -1;
    }
    if (s->n_owners) qsort(s->owners, (size_t)s->n_owners, sizeof *s->owners, cmp_owner);
    diagnose(s);
    return 0;
}

static void ctx_clear(ctx *c) {
    for (int i = 0; i < c->n_strs; i++) free(c->strs[i]);
    free(c->strs);
    free(c->str_tab);
    free(c->ev);
}

static tk_snapshot *snap_new(const char *name, size_t capacity, tk_err *err) {
    tk_snapshot *s = tk_calloc(1, sizeof *s);
    if (!s) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", name);
        return NULL;
    }
    snprintf(s->path, sizeof s->path, "%s", name);
    s->capacity = capacity;
    s->oom_time_us = s->peak_time_us = -1;
    return s;
}

/* A pickle, from memory (buf) or from the file at path: its trace events
 * streamed into records as they are read, the rest as a tree. */
static int read_pickle(ctx *c, const uint8_t *buf, size_t len, const char *path) {
    tk_pickle_opts o = {.name = c->name, .max_bytes = SNAP_TREE_CAP, .stream_key = "action", .on_item = on_event,
                        .item_ctx = c};
    tk_pickle *p = path ? tk_pickle_load_file(path, &o, c->err) : tk_pickle_load(buf, len, &o, c->err);
    int rc = p ? read_tree(c, (sv){tk_pickle_root(p), NULL}, 1) : -1;
    tk_pickle_destroy(&p);
    return rc;
}

static int read_json(ctx *c, const uint8_t *buf, size_t len) {
    json_error_t je;
    json_t *j = json_loadb((const char *)buf, len, 0, &je);
    if (!j) {
        tk_err_set(c->err, TK_EFORMAT, "%s: line %d: not valid JSON: %s", c->name, je.line, je.text);
        return -1;
    }
    c->s->form = "json";
    int rc = read_tree(c, (sv){NULL, j}, 0);
    json_decref(j);
    return rc;
}

static int not_a_snapshot(ctx *c) {
    tk_err_set(c->err, TK_EFORMAT,
               "%s: not a PyTorch memory snapshot (neither a pickle of protocol 2 or newer nor JSON)", c->name);
    return -1;
}

tk_snapshot *tk_snap_read_buf(const uint8_t *buf, size_t len, const char *name, size_t capacity, tk_err *err) {
    tk_snapshot *s = snap_new(name, capacity, err);
    if (!s) return NULL;
    ctx c = {.s = s, .name = name, .err = err};
    size_t i = 0;
    while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t')) i++;
    int rc = i < len && (buf[i] == '{' || buf[i] == '[') ? read_json(&c, buf, len)
             : len && buf[0] == 0x80                       ? read_pickle(&c, buf, len, NULL)
                                                           : not_a_snapshot(&c);
    ctx_clear(&c);
    if (rc) tk_snap_destroy(&s);
    return s;
}

tk_snapshot *tk_snap_read(const char *path, size_t capacity, tk_err *err) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        tk_err_set(err, TK_EIO, "%s: %s", path, f ? "not a regular file" : strerror(errno));
        if (f) fclose(f);
        return NULL;
    }
    uint8_t head[64];
    size_t nh = fread(head, 1, sizeof head, f), i = 0;
    while (i < nh && (head[i] == ' ' || head[i] == '\n' || head[i] == '\r' || head[i] == '\t')) i++;
    if (nh && head[0] == 0x80) {
        /* a pickle of any size: mapped, its events streamed */
        fclose(f);
        tk_snapshot *s = snap_new(path, capacity, err);
        if (!s) return NULL;
        ctx c = {.s = s, .name = path, .err = err};
        int rc = read_pickle(&c, NULL, 0, path);
        ctx_clear(&c);
        if (rc) tk_snap_destroy(&s);
        return s;
    }
    /* JSON is parsed whole: it stays within the 1 GiB this reader takes in memory */
    if ((size_t)st.st_size > SNAP_MAX_JSON) {
        tk_err_set(err, TK_EFORMAT, "%s: %lld bytes of JSON, larger than the 1 GiB this reader takes as JSON "
                                    "(a pickle of any size is read as it streams)",
                   path, (long long)st.st_size);
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = tk_malloc(n ? n : 1);
    if (!buf || fseek(f, 0, SEEK_SET) || fread(buf, 1, n, f) != n) {
        tk_err_set(err, TK_EIO, "%s: could not read the file", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    tk_snapshot *s = tk_snap_read_buf(buf, n, path, capacity, err);
    free(buf);
    return s;
}

void tk_snap_destroy(tk_snapshot **ps) {
    if (!ps || !*ps) return;
    free((*ps)->owners);
    free((*ps)->points);
    free((*ps)->live_sizes);
    free(*ps);
    *ps = NULL;
}

int tk_snap_capacity(const char *gpu, const char *size, size_t *out, tk_err *err) {
    *out = 0;
    if (gpu) {
        const tk_gpu_profile *p = tk_gpu_profile_find(gpu);
        if (!p) {
            tk_err_set(err, TK_EINVAL, "--gpu %s: unknown GPU profile (t4, p4, a100-40, ...)", gpu);
            return -1;
        }
        *out = p->capacity;
    }
    if (size && tk_parse_bytes(size, out)) {
        tk_err_set(err, TK_EINVAL, "--capacity %s: not a size (e.g. 14.75GiB)", size);
        return -1;
    }
    return 0;
}

/* ---- output --------------------------------------------------------------------------- */

/* The model in one line: what it is and its sizes. Sizes cannot show the
 * head count: a preset or --model gives it, otherwise it is BERT's
 * hidden / 64 and said to be assumed. */
void tk_snap_model_line(const tk_snap_model *md, char *buf, size_t n) {
    char a[32];
    if (!md->recognised) {
        if (md->hidden)
            snprintf(buf, n, "%s (not a BERT: not planned), hidden %d, %d layers, intermediate %d, vocab %d; %s weights, "
                             "%s of parameter-shaped blocks",
                     md->family, md->hidden, md->layers, md->intermediate, md->vocab,
                     md->mixed ? "fp32 and 16-bit" : md->elem == 2 ? "16-bit (fp16/bf16)" : "fp32",
                     tk_format_bytes(md->param_bytes, a, sizeof a));
        else
            snprintf(buf, n, "%s (not recognised)", md->family[0] ? md->family : "unknown");
        return;
    }
    snprintf(buf, n, "BERT%s%s%s, hidden %d, %d layers, %d heads%s, intermediate %d, vocab %d, %d positions; "
                     "%s weights, %d cop%s of each parameter (%s)",
             md->preset[0] ? " = " : "", md->preset,
             md->preset[0] ? "" : "-shaped (a transformer whose layers have BERT's parameter shapes)", md->hidden,
             md->layers, md->heads, md->preset[0] || strncmp(md->from, "--model", 7) == 0 ? "" : " (assumed: hidden / 64)",
             md->intermediate, md->vocab, md->max_position,
             md->mixed ? "fp32 and 16-bit" : md->elem == 2 ? "16-bit (fp16/bf16)" : "fp32", md->copies,
             md->copies == 1 ? "y" : "ies", tk_format_bytes(md->param_bytes, a, sizeof a));
}

char *tk_snap_text(const tk_snapshot *s, int top) {
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f) return NULL;
    char a[32], b[32], c[32], d[32];
    fprintf(f, "PyTorch memory snapshot %s (%s): %d segments, %d blocks\n", s->path, s->form, s->n_segments,
            s->n_blocks);
    fprintf(f, "  reserved %s (%zu B) · allocated %s (%zu B) · requested %s (%zu B)\n", fmtb(s->reserved, a),
            s->reserved, fmtb(s->allocated, b), s->allocated, fmtb(s->requested, c), s->requested);
    fprintf(f, "  free in the cache %s in %d blocks, largest free block %s (%zu B)\n", fmtb(s->free_in_cache, a),
            s->n_free_blocks, fmtb(s->largest_free_block, b), s->largest_free_block);
    if (s->capacity) fprintf(f, "  device capacity %s\n", fmtb(s->capacity, a));
    if (s->n_device_rows > 1) {
        fprintf(f, "  %d devices:\n", s->n_device_rows);
        for (int i = 0; i < s->n_device_rows; i++)
            fprintf(f, "    device %d: reserved %s, allocated %s, largest free block %s%s\n", s->devices[i].device,
                    fmtb(s->devices[i].reserved, a), fmtb(s->devices[i].allocated, b),
                    fmtb(s->devices[i].largest_free_block, c),
                    s->has_oom && s->devices[i].device == s->oom_device ? "  <- the OOM" : "");
    }
    if (s->has_oom) {
        char on[32] = "";
        if (s->n_device_rows > 1) snprintf(on, sizeof on, " on device %d", s->oom_device);
        fprintf(f, "  out of memory%s: tried to allocate %s with %s free on the device%s%s\n", on, fmtb(s->oom_size, a),
                fmtb(s->oom_device_free, b), s->phase_at_oom[0] ? ", during " : "", s->phase_at_oom);
    }
    if (s->expandable_on) fprintf(f, "  expandable segments: on\n");
    if (s->n_points)
        fprintf(f, "  trace: %d events, allocated peaks at %s%s%s\n", s->n_trace, fmtb(s->trace_peak_allocated, a),
                s->phase_at_peak[0] ? ", during " : "", s->phase_at_peak);
    fprintf(f, "\nSegments by pool and stream:\n  %-6s %-8s %8s %12s %12s %12s %12s\n", "pool", "stream", "segments",
            "reserved", "allocated", "free", "largest free");
    for (int i = 0; i < s->n_pools; i++) {
        const tk_snap_pool *p = &s->pools[i];
        fprintf(f, "  %-6s %-8lld %8d %12s %12s %12s %12s\n", p->pool, (long long)p->stream, p->segments,
                fmtb(p->reserved, a), fmtb(p->allocated, b), fmtb(p->free, c), fmtb(p->largest_free, d));
    }
    fprintf(f, "\nLive at the end, by owner (innermost frame of your code):\n");
    if (s->has_annotations) fprintf(f, "  %12s %12s  %-28s %s\n", "bytes", "blocks", "phase", "owner");
    for (int i = 0; i < s->n_owners && i < top; i++) {
        if (s->has_annotations)
            fprintf(f, "  %12s %5d blocks  %-28s %s\n", fmtb(s->owners[i].bytes, a), s->owners[i].blocks,
                    s->owners[i].phase[0] ? s->owners[i].phase : "-", s->owners[i].owner);
        else
            fprintf(f, "  %12s %5d blocks  %s\n", fmtb(s->owners[i].bytes, a), s->owners[i].blocks, s->owners[i].owner);
    }
    if (s->n_owners > top) fprintf(f, "  ... %d more owners\n", s->n_owners - top);
    const tk_snap_model *md = &s->model;
    if (!md->recognised && md->family[0]) {
        char line[512];
        tk_snap_model_line(md, line, sizeof line);
        fprintf(f, "\nModel: %s\n  why: %s\n", line, md->why);
    }
    if (md->recognised) {
        char line[512];
        tk_snap_model_line(md, line, sizeof line);
        fprintf(f, "\nModel (from %s): %s\n  why: %s\n", md->from, line, md->why);
        if (md->batch)
            fprintf(f, "  batch %d x sequence %d (from %s)\n", md->batch, md->seq, md->shape_from);
        else
            fprintf(f, "  batch and sequence length unknown: give --batch N --seq N to plan the fixes\n");
        if (md->planned)
            fprintf(f, "  planned as it ran (engine %s): peak %s%s%s (%s) -> %s; %s\n", md->engine, fmtb(md->plan_peak, a),
                    md->plan_capacity ? " of " : "", md->plan_capacity ? fmtb(md->plan_capacity, b) : "",
                    md->capacity_from, md->plan_fits ? "fits" : "does not fit", md->plan_note);
        else if (md->plan_withheld)
            fprintf(f, "  plan as it ran (engine %s) %s\n", md->engine, md->plan_note);
    }
    if (s->data.have)
        fprintf(f, "\nData %s: %d examples, token lengths p50 %d, p95 %d, p99 %d, max %d (%s)\n", s->data.file,
                s->data.n, s->data.p50, s->data.p95, s->data.p99, s->data.max, s->data.vocab_note);
    fprintf(f, "\nDiagnosis:\n");
    if (!s->n_diag) fprintf(f, "  nothing wrong that this snapshot shows.\n");
    for (int i = 0; i < s->n_diag; i++) fprintf(f, "  %d. %s\n", i + 1, s->diag[i].text);
    if (s->n_fixes) fprintf(f, "\nFixes, best first:\n");
    for (int i = 0; i < s->n_fixes; i++) {
        fprintf(f, "  %d. [%s] %s\n", i + 1, s->fixes[i].id, s->fixes[i].text);
        if (s->fixes[i].planned)
            fprintf(f, "       planned (%s): %s peak %s%s%s\n", s->fixes[i].plan_change,
                    s->fixes[i].plan_fits ? "fits:" : "does not fit:", fmtb(s->fixes[i].plan_peak, a),
                    md->plan_capacity ? " of " : "", md->plan_capacity ? fmtb(md->plan_capacity, b) : "");
        const char *line = s->fixes[i].code;
        while (*line) {
            const char *e = strchr(line, '\n');
            int len = e ? (int)(e - line) : (int)strlen(line);
            fprintf(f, "       %.*s\n", len, line);
            line += len + (e ? 1 : 0);
        }
    }
    fclose(f);
    return out;
}

json_t *tk_snap_json(const tk_snapshot *s, int top) {
    json_t *o = json_object();
    json_object_set_new(o, "file", json_string(s->path));
    json_object_set_new(o, "form", json_string(s->form));
    json_object_set_new(o, "reserved", json_integer((json_int_t)s->reserved));
    json_object_set_new(o, "allocated", json_integer((json_int_t)s->allocated));
    json_object_set_new(o, "requested", json_integer((json_int_t)s->requested));
    json_object_set_new(o, "pending_free", json_integer((json_int_t)s->pending_free));
    json_object_set_new(o, "largest_free_block", json_integer((json_int_t)s->largest_free_block));
    json_object_set_new(o, "free_in_cache", json_integer((json_int_t)s->free_in_cache));
    json_object_set_new(o, "empty_segments", json_integer((json_int_t)s->empty_segments));
    json_object_set_new(o, "n_segments", json_integer(s->n_segments));
    json_object_set_new(o, "n_blocks", json_integer(s->n_blocks));
    json_object_set_new(o, "n_devices", json_integer(s->n_devices));
    json_object_set_new(o, "capacity", s->capacity ? json_integer((json_int_t)s->capacity) : json_null());
    json_t *pools = json_array();
    for (int i = 0; i < s->n_pools; i++) {
        const tk_snap_pool *p = &s->pools[i];
        json_array_append_new(pools, json_pack("{s:s, s:I, s:i, s:I, s:I, s:I, s:I}", "pool", p->pool, "stream",
                                               (json_int_t)p->stream, "segments", p->segments, "reserved",
                                               (json_int_t)p->reserved, "allocated", (json_int_t)p->allocated, "free",
                                               (json_int_t)p->free, "largest_free", (json_int_t)p->largest_free));
    }
    json_object_set_new(o, "segments", pools);
    json_t *devs = json_array();
    for (int i = 0; i < s->n_device_rows; i++)
        json_array_append_new(devs, json_pack("{s:i, s:I, s:I, s:I}", "device", s->devices[i].device, "reserved",
                                              (json_int_t)s->devices[i].reserved, "allocated",
                                              (json_int_t)s->devices[i].allocated, "largest_free_block",
                                              (json_int_t)s->devices[i].largest_free_block));
    json_object_set_new(o, "devices", devs);
    json_object_set_new(o, "expandable_segments", json_boolean(s->expandable_on));
    json_t *t = json_array();
    for (int i = 0; i < s->n_owners && i < top; i++) {
        json_t *r = json_pack("{s:s, s:I, s:i}", "owner", s->owners[i].owner, "bytes", (json_int_t)s->owners[i].bytes,
                              "blocks", s->owners[i].blocks);
        if (s->has_annotations)
            json_object_set_new(r, "phase", s->owners[i].phase[0] ? json_string(s->owners[i].phase) : json_null());
        json_array_append_new(t, r);
    }
    json_object_set_new(o, "top", t);
    json_object_set_new(o, "oom", s->has_oom ? json_pack("{s:I, s:I, s:i, s:o}", "size", (json_int_t)s->oom_size,
                                                         "device_free", (json_int_t)s->oom_device_free, "device",
                                                         s->oom_device, "phase",
                                                         s->phase_at_oom[0] ? json_string(s->phase_at_oom) : json_null())
                                             : json_null());
    json_object_set_new(o, "phase_at_peak", s->phase_at_peak[0] ? json_string(s->phase_at_peak) : json_null());
    json_object_set_new(o, "growth", json_pack("{s:b, s:I, s:i}", "found", s->has_growth, "bytes",
                                               (json_int_t)s->growth_bytes, "rises", s->growth_rises));
    json_object_set_new(o, "timeline", json_pack("{s:i, s:i, s:I}", "events", s->n_trace, "points", s->n_points,
                                                 "peak_allocated", (json_int_t)s->trace_peak_allocated));
    json_t *dg = json_array();
    for (int i = 0; i < s->n_diag; i++)
        json_array_append_new(dg, json_pack("{s:s, s:s}", "id", s->diag[i].id, "text", s->diag[i].text));
    json_object_set_new(o, "diagnoses", dg);
    json_t *fx = json_array();
    for (int i = 0; i < s->n_fixes; i++) {
        const tk_snap_fix *f = &s->fixes[i];
        json_t *x = json_pack("{s:s, s:s, s:s, s:o}", "id", f->id, "text", f->text, "code", f->code, "saves",
                              f->saves >= 0 ? json_integer(f->saves) : json_null());
        if (f->planned)
            json_object_set_new(x, "plan", json_pack("{s:I, s:b, s:s}", "peak", (json_int_t)f->plan_peak, "fits",
                                                     f->plan_fits, "change", f->plan_change));
        json_array_append_new(fx, x);
    }
    json_object_set_new(o, "fixes", fx);
    json_object_set_new(o, "leak",
                        json_pack("{s:b, s:i, s:I, s:I, s:o, s:I, s:i}", "found", s->has_leak, "iterations",
                                  s->leak_iterations, "per_iteration", (json_int_t)s->leak_per_iteration, "total",
                                  (json_int_t)s->leak_total, "owner",
                                  s->leak_owner[0] ? json_string(s->leak_owner) : json_null(), "owner_bytes",
                                  (json_int_t)s->leak_owner_bytes, "owner_iterations", s->leak_owner_iterations));
    const tk_snap_model *md = &s->model;
    json_t *mj = json_null();
    if (!md->recognised && md->family[0]) {
        mj = json_pack("{s:s, s:s, s:b}", "family", md->family, "why", md->why, "planned", 0);
        if (md->hidden) {
            json_object_set_new(mj, "hidden", json_integer(md->hidden));
            json_object_set_new(mj, "layers", json_integer(md->layers));
            json_object_set_new(mj, "intermediate", json_integer(md->intermediate));
            json_object_set_new(mj, "vocab", json_integer(md->vocab));
            json_object_set_new(mj, "max_position", md->max_position ? json_integer(md->max_position) : json_null());
            json_object_set_new(mj, "dtype", json_string(md->mixed ? "mixed (fp32 and 16-bit copies)"
                                                         : md->elem == 2 ? "fp16/bf16" : "fp32"));
            json_object_set_new(mj, "copies", json_integer(md->copies));
            json_object_set_new(mj, "param_bytes", json_integer((json_int_t)md->param_bytes));
        }
    }
    if (md->recognised) {
        mj = json_pack("{s:s, s:o, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:I}", "recognised_from", md->from, "preset",
                       md->preset[0] ? json_string(md->preset) : json_null(), "hidden", md->hidden, "layers",
                       md->layers, "heads", md->heads, "intermediate", md->intermediate, "vocab", md->vocab,
                       "max_position", md->max_position, "dtype",
                       md->mixed ? "mixed (fp32 and 16-bit copies)" : md->elem == 2 ? "fp16/bf16" : "fp32", "copies",
                       md->copies, "param_bytes", (json_int_t)md->param_bytes);
        json_object_set_new(mj, "batch", md->batch ? json_integer(md->batch) : json_null());
        json_object_set_new(mj, "seq", md->seq ? json_integer(md->seq) : json_null());
        json_object_set_new(mj, "shape_from", md->shape_from[0] ? json_string(md->shape_from) : json_null());
        json_object_set_new(mj, "family", json_string(md->family));
        json_object_set_new(mj, "why", json_string(md->why));
        json_object_set_new(mj, "planned", json_boolean(md->planned));
        if (md->planned)
            json_object_set_new(mj, "plan", json_pack("{s:I, s:o, s:b, s:s, s:s, s:s}", "peak", (json_int_t)md->plan_peak,
                                                      "capacity",
                                                      md->plan_capacity ? json_integer((json_int_t)md->plan_capacity)
                                                                        : json_null(),
                                                      "fits", md->plan_fits, "capacity_from", md->capacity_from,
                                                      "engine", md->engine, "agreement", md->plan_note));
        else if (md->plan_withheld)
            json_object_set_new(mj, "plan_withheld", json_pack("{s:s, s:s}", "engine", md->engine, "reason", md->plan_note));
    }
    json_object_set_new(o, "model", mj);
    const tk_snap_data *dt = &s->data;
    json_object_set_new(o, "data", dt->have ? json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s}", "file", dt->file,
                                                        "examples", dt->n, "max", dt->max, "p50", dt->p50, "p95",
                                                        dt->p95, "p99", dt->p99, "max_length", dt->max_length,
                                                        "vocabulary", dt->vocab_note)
                                            : json_null());
    return o;
}
