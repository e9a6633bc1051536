/* snapshot_decode.h — the first of the snapshot reader's layers, which go
 * one way: decode (this), trace (snapshot_trace.h), owners and frames
 * (snapshot_frames.h), the peak (snapshot_peak.h), the leak
 * (snapshot_leak.h), then the diagnosis (snapshot_diagnose.h); each file
 * uses only those before it (tests/house/test_layers.py holds the order).
 *
 * Decode reads the file (a pickle, streamed, or JSON) into plain records:
 * the segments and their blocks, the trace's events in file order, the
 * annotations and the allocator's settings; every stack of frames is
 * interned once (a stack id per block and event), so the later layers read
 * frames without the file. It also sums the figures PyTorch's own counters
 * give (reserved, allocated, ... per pool and device) into the tk_snapshot.
 * The address table (snap_map) every later layer uses lives here too.
 *
 * Guarantees: nothing in the file runs (tk_pickle with no global allowed);
 * a file of the wrong shape is one line naming the file and the field;
 * memory follows the number of events and of distinct stacks, never the
 * file's bytes. Only the snapshot reader's files include this header.
 */
#ifndef TK_SNAPSHOT_DECODE_H
#define TK_SNAPSHOT_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "tk_snapshot.h"

/* ---- the records ---------------------------------------------------------------------- */

enum { EV_OTHER, EV_ALLOC, EV_FREE_REQ, EV_FREE, EV_SEG_ALLOC, EV_SEG_FREE, EV_SEG_MAP, EV_SEG_UNMAP, EV_OOM };
enum { BLK_LIVE, BLK_FREE, BLK_PENDING };

/* One frame: interned filename and function name, and the line. */
typedef struct snap_frame { int32_t file, name, line; } snap_frame;

/* One trace event, as read. size: what the file says (PyTorch's requested
 * size); stack: its frames (0: none). list: its device (after decoding). */
typedef struct snap_ev {
    int64_t addr, size, time_us; /* time_us -1 when the file has none */
    int32_t stack;
    uint8_t list, action;
} snap_ev;

typedef struct snap_seg {
    int64_t addr, size;
    int device, small, expandable;
    int first_blk, n_blk;        /* its blocks in snap_dec.blks */
} snap_seg;

typedef struct snap_blk {
    int64_t addr, size, requested;
    int32_t stack;
    int seg;
    uint8_t state;               /* BLK_LIVE (active_allocated), BLK_FREE (inactive), BLK_PENDING (the rest) */
} snap_blk;

/* One external_annotations entry: a record_function range's START or END. */
typedef struct snap_ann { int64_t time_us; int32_t name; int device; uint8_t start; } snap_ann;

typedef struct snap_dec {
    tk_snapshot *s;
    const char *name;
    tk_err *err;
    /* interned strings */
    char **strs;
    int n_strs, strs_cap;
    int32_t *str_tab;
    size_t str_tab_cap;
    /* frames, and stacks of them (innermost first); stack 0 is the empty one */
    snap_frame *frames;
    int n_frames, frames_cap;
    int32_t *frame_tab;
    size_t frame_tab_cap;
    int32_t *stack_items;
    size_t n_stack_items, stack_items_cap;
    uint32_t *stack_off;         /* stack i: stack_items[stack_off[i] .. stack_off[i + 1]) */
    int n_stacks, stacks_cap;
    int32_t *stack_tab;
    size_t stack_tab_cap;
    /* the end state */
    snap_seg *segs;
    int n_segs, segs_cap;
    snap_blk *blks;
    int n_blks, blks_cap;
    /* the trace, in file order */
    snap_ev *ev;
    size_t n_ev, ev_cap;
    const void *lists[64];       /* the device lists seen, in order (their identity) */
    size_t list_items[64];
    int n_lists;
    int oom_list;                /* the list of the last oom event, -1 none */
    snap_ann *ann;
    int n_ann, ann_cap;
    /* the allocator's settings, as allocator_settings gives them */
    int64_t max_split;           /* max_split_size; -1 unlimited */
    int rounding_divisions;      /* roundup_power2_divisions above 1 somewhere: PyTorch rounded otherwise */
    int by_txkernel;             /* frames named "txkernel": txk train/plan --snapshot wrote it, sizes are blocks' */
    int has_frames;              /* some block or event carries a frame */
} snap_dec;

/* Reads the file at path (a pickle of any size, streamed; JSON up to 1 GiB)
 * or buf (name used in messages) into d, whose s, name and err the caller
 * set. 0, or -1 with d->err naming the file. */
int snap_decode_file(snap_dec *d, const char *path);
int snap_decode_buf(snap_dec *d, const uint8_t *buf, size_t len);
void snap_dec_clear(snap_dec *d);

/* The interned string i ("" for -1), the index of str (added when new; -1
 * when host memory runs out). */
const char *snap_str(const snap_dec *d, int32_t i);
int32_t snap_intern(snap_dec *d, const char *str);

/* The frames of stack st, innermost first: *n of them. */
static inline const int32_t *snap_stack(const snap_dec *d, int32_t st, int *n) {
    if (st <= 0 || st >= d->n_stacks) {
        *n = 0;
        return NULL;
    }
    *n = (int)(d->stack_off[st + 1] - d->stack_off[st]);
    return d->stack_items + d->stack_off[st];
}

/* One-line errors naming the file and where (-1 always). */
int snap_bad(snap_dec *d, const char *where, const char *what);
int snap_bad_nomem(snap_dec *d, const char *where);

/* ---- the address table ---------------------------------------------------------------- */

/* int64 key -> int64 value, open addressing with deletion (backward shift);
 * keys are device addresses. */
typedef struct snap_map { int64_t *key, *val; unsigned char *used; size_t cap, n; } snap_map;

int snap_map_put(snap_map *m, int64_t key, int64_t val); /* 0, or -1 when host memory runs out */
int snap_map_get(const snap_map *m, int64_t key, int64_t *val); /* 1 found */
int snap_map_del(snap_map *m, int64_t key);                     /* 1 removed */
void snap_map_clear(snap_map *m);

#endif
