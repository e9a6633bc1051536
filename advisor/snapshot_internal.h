/* snapshot_internal.h — what the snapshot reader's three files share
 * (advisor/snapshot.c: segments, diagnoses, entry points and output;
 * snapshot_frames.c: what a stack of frames shows; snapshot_trace.c: the
 * trace as records, the timeline, leak or growth, phases): the one view
 * (sv) over a pickle value or a JSON value, the reading context, the
 * trace's records, and the functions each lends the others. Only those
 * files include it.
 */
#ifndef TK_SNAPSHOT_INTERNAL_H
#define TK_SNAPSHOT_INTERNAL_H

#include <jansson.h>
#include <stdio.h>
#include <stdint.h>

#include "tk_pickle.h"
#include "tk_snapshot.h"

/* ---- one view over a pickle value or a JSON value ----------------------------------- */

typedef struct sv { const tk_pval *p; json_t *j; } sv;

#define SV_NONE ((sv){NULL, NULL})
static inline int sv_ok(sv v) { return v.p || v.j; }

static inline sv sv_get(sv d, const char *k) {
    sv r = SV_NONE;
    if (d.p) r.p = tk_pval_get(d.p, k);
    else if (d.j && json_is_object(d.j)) r.j = json_object_get(d.j, k);
    return r;
}
static inline int sv_is_dict(sv v) { return v.p ? v.p->kind == TK_PV_DICT : json_is_object(v.j); }
static inline int sv_is_list(sv v) {
    return v.p ? (v.p->kind == TK_PV_LIST || v.p->kind == TK_PV_TUPLE) : json_is_array(v.j);
}
static inline size_t sv_len(sv v) { return v.p ? v.p->n : json_array_size(v.j); }
static inline sv sv_at(sv v, size_t i) {
    sv r = SV_NONE;
    if (v.p) r.p = i < v.p->n ? v.p->items[i] : NULL;
    else r.j = json_array_get(v.j, i);
    return r;
}
static inline int sv_int(sv v, int64_t *o) {
    if (v.p) return tk_pval_int(v.p, o);
    if (json_is_integer(v.j)) { *o = json_integer_value(v.j); return 0; }
    return -1;
}
static inline int sv_true(sv v) { return v.p ? v.p->kind == TK_PV_BOOL && v.p->i : json_is_true(v.j); }
static inline const char *sv_str(sv v) { return v.p ? tk_pval_str(v.p) : json_string_value(v.j); }
static inline const char *sv_kind(sv v) {
    if (v.p) return tk_pval_kind_name(v.p->kind);
    if (!v.j) return "nothing";
    static const char *const N[] = {"object", "array", "string", "integer", "real", "true", "false", "null"};
    return N[json_typeof(v.j)];
}

/* ---- reading ------------------------------------------------------------------------ */

typedef struct module_bytes { char name[48], file[160]; size_t bytes; } module_bytes;

typedef struct snap_ctx {
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
} snap_ctx;

enum { EV_OTHER, EV_ALLOC, EV_FREE, EV_SEG_ALLOC, EV_SEG_FREE, EV_OOM };

/* One trace event as the analyses need it: no frames, only what was read
 * from them (an interned owner and phase, the user's outermost line). */
typedef struct snap_ev {
    int64_t addr, size, time_us;
    int32_t owner, phase; /* interned strings, -1 none */
    uint64_t uline;       /* the user's outermost line, hashed; 0 none */
    uint8_t list;         /* index into snap_ctx.lists */
    uint8_t action;
} snap_ev;

/* The owner of a block with no frames at all: PyTorch records frames only
 * while the history is on. */
#define SNAP_BEFORE_HISTORY "no frames (allocated before the history was recorded)"

/* One-line errors naming the file and where (-1 always), and a
 * non-negative integer field (missing_ok keeps *o when absent). */
static inline int snap_bad(snap_ctx *c, const char *where, const char *what) {
    tk_err_set(c->err, TK_EFORMAT, "%s: %s: %s", c->name, where, what);
    return -1;
}

/* A host allocation failed while reading `where`: TK_ENOMEM. -1. */
static inline int snap_bad_nomem(snap_ctx *c, const char *where) {
    tk_err_set(c->err, TK_ENOMEM, "%s: %s: out of host memory", c->name, where);
    return -1;
}

/* A non-negative integer field; missing_ok keeps *o when absent. */
static inline int snap_field_size(snap_ctx *c, sv d, const char *key, const char *where, int missing_ok, int64_t *o) {
    sv v = sv_get(d, key);
    char w[160], m[96];
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (!sv_ok(v)) return missing_ok ? 0 : snap_bad(c, w, "missing");
    if (sv_int(v, o) || *o < 0) {
        snprintf(m, sizeof m, "expected a non-negative integer, found %s", sv_kind(v));
        return snap_bad(c, w, m);
    }
    return 0;
}

/* snapshot_frames.c: what a stack of frames (innermost first) shows. */
/* "train.py, line 40 (step) · torch/nn/modules/linear.py"; returns 1 when the
 * frames are txkernel's own (txk train/plan --snapshot writes one frame,
 * filename "txkernel"), else 0 */
int snap_owner_of(sv frames, char *out, size_t n);
int snap_names_no_code(const char *owner);                   /* 1: native only, no frames, a library, the autograd engine */
int snap_model_module_of(sv frames, char *name, size_t nn, char *file, size_t nf); /* 1: "llama", its modeling file */
int snap_is_engine_pool(sv frames);                          /* 1: vLLM's KV-cache pool */
int snap_outer_user_line(sv frames, uint64_t *key);          /* 1: the user's outermost line, hashed */
int snap_phase_from_frames(sv frames, char *out, size_t n);  /* 1: "backward", "Optimizer.step", "forward (…)" */

/* snapshot_trace.c: each event as a record (streamed: tk_pickle's on_item),
 * then the lists in device order, the timeline, the leak or growth, and the
 * phases at the peak, at the OOM and of each owner. 0, or -1 with c->err. */
int snap_on_event(void *cx, const tk_pval *list, const tk_pval *item, tk_err *err);
int snap_build_trace(snap_ctx *c, sv traces, int streamed);
int snap_find_leak(snap_ctx *c);
int snap_find_phases(snap_ctx *c, sv ann);

#endif
