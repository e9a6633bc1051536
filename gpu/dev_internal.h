/* dev_internal.h — the device struct, shared by dev.c, tensor.c and ops.c
 * only (no other module includes it). */
#ifndef TK_DEV_INTERNAL_H
#define TK_DEV_INTERNAL_H

#include "tk_backend_impl.h"

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
};

#endif
