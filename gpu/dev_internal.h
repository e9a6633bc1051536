/* dev_internal.h — the device struct, shared by dev.c, tensor.c and ops.c
 * only (no other module includes it). */
#ifndef TK_DEV_INTERNAL_H
#define TK_DEV_INTERNAL_H

#include "tk_backend_impl.h"

typedef struct tk_live_tensor {
    const void *ptr;
    int owner;
    tk_cat cat;
    tk_dtype dtype;
    int ndim;
    int64_t shape[TK_MAX_DIMS];
    size_t bytes, block;
} tk_live_tensor;

struct tk_dev {
    tk_dev_kind kind;
    tk_dev_opts opts;
    const tk_backend *be;   /* borrowed: static table (meta, cpu) or the plugin's */
    void *ctx;              /* owned: destroyed with be->destroy */
    void *dl;               /* owned: the cuda plugin handle, or NULL */
    tk_alloc *alloc;        /* owned */
    size_t capacity;        /* what the allocator works against (0: unlimited) */
    tk_cost cost;
    tk_oom last_oom;
    int has_oom;
    tk_err last_err;        /* the last op's argument error (ops take no tk_err) */
    size_t card_allocated;  /* the card's buffers (take_card_buffers): their blocks */
    size_t card_reserved;   /* and the segments taken for them */
    /* tensor tracking (tk_dev_track_tensors): live owning tensors, and a
     * copy of them taken at the first free after a new peak (the allocator
     * freezes its own breakdown at the same moment) */
    int track;
    int peak_armed;         /* the live list is the peak's; no free since */
    tk_live_tensor *live, *snap;
    int n_live, cap_live, n_snap, cap_snap;
};

#endif
