/* dev.c — devices: the meta backend, the cpu/meta/cuda openers (the cuda
 * backend is a plugin found and loaded with dlopen), and per-device state: the
 * caching allocator, cost counters, the last OOM record and the last error.
 *
 * Guarantees: tk_dev_new never exits or aborts; when the cuda plugin is
 * missing, cannot load (no libcudart, no driver) or finds no GPU it returns
 * NULL and one line in err saying which, so callers can fall back to cpu.
 * Binaries carry no link-time dependency on CUDA.
 *
 * A card's buffers: a cuda device, and a meta or cpu device opened with
 * card_buffers (a plan or a simulation of a card's run), takes the cuda
 * backend's GEMM workspace and kernel scratch through its own allocator as
 * its first two blocks, tag `workspace`, and hands them to the plugin
 * (tk_cuda_bind_buffers). Plan and run therefore hold the same two blocks
 * from the same moment, and the plugin allocates nothing outside the
 * allocator.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tk_backend_impl.h"
#include "tk_host_mem.h"
#include "cuda/tk_cuda.h"
#include "dev_internal.h"

/* ---- meta backend: fake addresses, nothing stored, no arithmetic --------- */

typedef struct meta_ctx {
    uintptr_t next;   /* next fake address */
    size_t live;      /* bytes handed out and not given back */
} meta_ctx;

/* Addresses start high and grow by whole 2 MiB steps so every segment has a
 * distinct, aligned, non-NULL address that no one could mistake for host
 * memory; they are never dereferenced. */
#define META_BASE ((uintptr_t)1 << 44)
#define META_ALIGN ((uintptr_t)2 << 20)

static int meta_seg_alloc(void *vctx, size_t bytes, void **ptr) {
    meta_ctx *c = vctx;
    uintptr_t step = ((uintptr_t)bytes + META_ALIGN - 1) / META_ALIGN * META_ALIGN;
    if (step < bytes || c->next > UINTPTR_MAX - step) return -1;
    *ptr = (void *)c->next;
    c->next += step;
    c->live += bytes;
    return 0;
}

static void meta_seg_free(void *vctx, void *ptr, size_t bytes) {
    meta_ctx *c = vctx;
    (void)ptr;
    c->live -= bytes;
}

static void meta_info(void *vctx, tk_dev_info *out) {
    (void)vctx;
    snprintf(out->name, sizeof out->name, "meta");
}

static void meta_destroy(void *vctx) { free(vctx); }

static const tk_backend meta_backend = {
    .name = "meta",
    .seg_alloc = meta_seg_alloc,
    .seg_free = meta_seg_free,
    .info = meta_info,
    .destroy = meta_destroy,
};

const tk_backend *tk_backend_meta(void) { return &meta_backend; }

void *tk_meta_ctx_new(const tk_dev_opts *opts) {
    (void)opts;
    meta_ctx *c = tk_calloc(1, sizeof *c);
    if (c) c->next = META_BASE;
    return c;
}

/* ---- cuda plugin loading ----------------------------------------------------- */

#define PLUGIN_NAME "libtk_cuda.so"

/* Candidate paths in the order the install layout wants: next to the
 * executable (installed: <prefix>/bin/../lib/txkernel; built: build/), then
 * $TXK_CUDA_PLUGIN, then build/ under the working directory. */
static int plugin_candidates(char out[4][PATH_MAX]) {
    int n = 0;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(out[n++], PATH_MAX, "%.*s/../lib/txkernel/" PLUGIN_NAME, PATH_MAX - 40, exe);
            snprintf(out[n++], PATH_MAX, "%.*s/" PLUGIN_NAME, PATH_MAX - 40, exe);
        }
    }
    const char *env = getenv("TXK_CUDA_PLUGIN");
    if (env && *env) snprintf(out[n++], PATH_MAX, "%s", env);
    snprintf(out[n++], PATH_MAX, "build/" PLUGIN_NAME);
    return n;
}

static tk_status open_cuda(tk_dev *d, const tk_dev_opts *opts, tk_err *err) {
    char cand[4][PATH_MAX];
    int n = plugin_candidates(cand);
    char why[512] = "";
    for (int i = 0; i < n; i++) {
        if (access(cand[i], R_OK) != 0) continue;
        void *h = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            /* present but unloadable: usually libcudart/libcublas missing */
            const char *e = dlerror();
            snprintf(why, sizeof why, "%.500s", e ? e : cand[i]);
            continue;
        }
        tk_cuda_plugin_open_fn open = (tk_cuda_plugin_open_fn)dlsym(h, "tk_cuda_plugin_open");
        if (!open) {
            snprintf(why, sizeof why, "%.300s has no tk_cuda_plugin_open", cand[i]);
            dlclose(h);
            continue;
        }
        tk_err perr = {0};
        const tk_backend *be = NULL;
        void *ctx = NULL;
        tk_status st = open(opts, &be, &ctx, &perr);
        if (st != TK_OK || !be || !ctx) {
            tk_err_set(err, st != TK_OK ? st : TK_EDEVICE, "cuda unavailable: %s",
                       perr.msg[0] ? perr.msg : "the plugin found no usable GPU");
            dlclose(h);
            return st != TK_OK ? st : TK_EDEVICE;
        }
        d->dl = h;
        d->be = be;
        d->ctx = ctx;
        return TK_OK;
    }
    if (why[0])
        tk_err_set(err, TK_EDEVICE, "cuda unavailable: cannot load the plugin: %s", why);
    else
        tk_err_set(err, TK_EDEVICE, "cuda unavailable: " PLUGIN_NAME " not found (looked next "
                   "to the executable, in $TXK_CUDA_PLUGIN and in ./build/)");
    return TK_EDEVICE;
}

/* ---- devices ------------------------------------------------------------------ */

static tk_dev *dev_finish(tk_dev *d, const tk_dev_opts *opts, tk_err *err);

tk_dev *tk_dev_new(const tk_dev_opts *opts, tk_err *err) {
    tk_dev_opts def = {0};
    if (!opts) opts = &def;
    tk_dev *d = tk_calloc(1, sizeof *d);
    if (!d) { tk_err_set(err, TK_ENOMEM, "out of host memory opening a device"); return NULL; }
    d->kind = opts->kind;
    d->opts = *opts;
    switch (opts->kind) {
    case TK_DEV_META:
        d->be = tk_backend_meta();
        d->ctx = tk_meta_ctx_new(opts);
        break;
    case TK_DEV_CPU:
        d->be = tk_backend_cpu();
        d->ctx = tk_cpu_ctx_new(opts);
        break;
    case TK_DEV_CUDA:
        if (open_cuda(d, opts, err) != TK_OK) { free(d); return NULL; }
        break;
    default:
        tk_err_set(err, TK_EINVAL, "unknown device kind %d", (int)opts->kind);
        free(d);
        return NULL;
    }
    return dev_finish(d, opts, err);
}

tk_dev *tk_dev_new_backend(const tk_dev_opts *opts, const tk_backend *be, void *ctx, tk_err *err) {
    tk_dev_opts def = {0};
    if (!opts) opts = &def;
    tk_dev *d = tk_calloc(1, sizeof *d);
    if (!d) {
        if (be && ctx && be->destroy) be->destroy(ctx);
        tk_err_set(err, TK_ENOMEM, "out of host memory opening a device");
        return NULL;
    }
    d->kind = opts->kind;
    d->opts = *opts;
    d->be = be;
    d->ctx = ctx;
    return dev_finish(d, opts, err);
}

/* The card's two buffers, first in the allocator (see the header), bound to
 * the plugin when there is one. */
static tk_status take_card_buffers(tk_dev *d, tk_err *err) {
    const struct { size_t bytes; const char *owner; } buf[2] = {
        {TK_CUDA_WORKSPACE_BYTES, "cublas"},
        {TK_CUDA_SCRATCH_BYTES, "cuda.scratch"},
    };
    void *ptr[2] = {NULL, NULL};
    tk_alloc_stats before, after;
    tk_alloc_stats_get(d->alloc, &before);
    for (int i = 0; i < 2; i++) {
        int owner = tk_alloc_owner_id(d->alloc, buf[i].owner);
        tk_oom oom;
        tk_status st = owner < 0 ? TK_ENOMEM
                                 : tk_alloc_malloc(d->alloc, buf[i].bytes, (tk_tag){TK_CAT_WORKSPACE, owner}, &ptr[i], &oom);
        if (st == TK_EOOM) {
            char b1[32], b2[32];
            tk_err_set(err, TK_EOOM, "the card's %s buffer (%s) does not fit in the device's capacity of %s",
                       buf[i].owner, tk_format_bytes(buf[i].bytes, b1, sizeof b1),
                       tk_format_bytes(d->capacity, b2, sizeof b2));
            return st;
        }
        if (st != TK_OK) return tk_err_nomem(err, "the card's buffers");
    }
    tk_alloc_stats_get(d->alloc, &after);
    d->card_allocated = after.allocated - before.allocated;
    d->card_reserved = after.reserved - before.reserved;
    tk_cuda_bind_buffers_fn bind = (tk_cuda_bind_buffers_fn)tk_dev_plugin_sym(d, "tk_cuda_bind_buffers");
    return bind ? bind(d->ctx, ptr[0], TK_CUDA_WORKSPACE_BYTES, ptr[1], TK_CUDA_SCRATCH_BYTES, err) : TK_OK;
}

/* The allocator over the backend's segments; takes d (destroyed on failure). */
static tk_dev *dev_finish(tk_dev *d, const tk_dev_opts *opts, tk_err *err) {
    if (!d->be || !d->ctx) {
        tk_err_set(err, TK_ENOMEM, "could not create the %s backend (out of host memory)",
                   d->be ? d->be->name : "device");
        tk_dev_destroy(&d);
        return NULL;
    }
    size_t cap = opts->capacity;
    if (opts->kind == TK_DEV_CUDA && cap == 0 && d->be->info) {
        /* the real free memory, measured after the context exists */
        tk_dev_info info = {0};
        d->be->info(d->ctx, &info);
        cap = info.free_bytes;
    }
    d->capacity = cap;
    tk_devmem mem = {d->be->seg_alloc, d->be->seg_free, d->ctx};
    d->alloc = tk_alloc_new(mem, cap);
    if (!d->alloc) {
        tk_err_set(err, TK_ENOMEM, "out of host memory creating the allocator");
        tk_dev_destroy(&d);
        return NULL;
    }
    if ((opts->kind == TK_DEV_CUDA || opts->card_buffers) && take_card_buffers(d, err) != TK_OK) {
        tk_dev_destroy(&d);
        return NULL;
    }
    return d;
}

void tk_dev_destroy(tk_dev **pd) {
    if (!pd || !*pd) return;
    tk_dev *d = *pd;
    tk_alloc_destroy(&d->alloc); /* segments go back before the backend goes */
    free(d->live);
    free(d->snap);
    if (d->be && d->ctx && d->be->destroy) d->be->destroy(d->ctx);
    if (d->dl) dlclose(d->dl);
    free(d);
    *pd = NULL;
}

tk_dev_kind tk_dev_kind_of(const tk_dev *d) { return d ? d->kind : TK_DEV_META; }
tk_alloc *tk_dev_alloc(tk_dev *d) { return d ? d->alloc : NULL; }

void tk_dev_info_get(tk_dev *d, tk_dev_info *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!d) return;
    out->kind = d->kind;
    if (d->be->info) d->be->info(d->ctx, out);
    out->kind = d->kind;
    if (!out->name[0]) snprintf(out->name, sizeof out->name, "%s", d->be->name);
    tk_alloc_stats st;
    tk_alloc_stats_get(d->alloc, &st);
    if (d->kind != TK_DEV_CUDA || d->opts.capacity) {
        /* simulated: what the allocator works against is the device */
        out->simulated = 1;
        out->total = d->capacity;
        out->free_bytes = d->capacity > st.reserved ? d->capacity - st.reserved : 0;
        if (d->capacity == 0 && d->kind == TK_DEV_CPU) {
            long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
            if (pages > 0 && psz > 0) {
                out->total = (size_t)pages * (size_t)psz;
                out->free_bytes = out->total > st.reserved ? out->total - st.reserved : 0;
            }
        }
    }
}

void tk_dev_card_buffers(const tk_dev *d, size_t *allocated, size_t *reserved) {
    if (allocated) *allocated = d ? d->card_allocated : 0;
    if (reserved) *reserved = d ? d->card_reserved : 0;
}

const tk_oom *tk_dev_last_oom(const tk_dev *d) { return d && d->has_oom ? &d->last_oom : NULL; }
const tk_err *tk_dev_last_err(const tk_dev *d) { return d && d->last_err.status ? &d->last_err : NULL; }

void tk_dev_cost_get(const tk_dev *d, tk_cost *out) {
    if (!out) return;
    if (!d) { memset(out, 0, sizeof *out); return; }
    *out = d->cost;
}

void tk_dev_cost_reset(tk_dev *d) {
    if (d) memset(&d->cost, 0, sizeof d->cost);
}

tk_status tk_dev_sync(tk_dev *d, tk_err *err) {
    if (!d) { tk_err_set(err, TK_EINVAL, "tk_dev_sync: no device"); return TK_EINVAL; }
    return d->be->sync ? d->be->sync(d->ctx, err) : TK_OK;
}

void *tk_dev_backend_ctx(tk_dev *d) { return d ? d->ctx : NULL; }

void *tk_dev_plugin_sym(tk_dev *d, const char *name) {
    if (!d || !d->dl || !name) return NULL;
    return dlsym(d->dl, name);
}

/* The plugin's function `name`, or NULL with err saying why. */
static void *cuda_fn(tk_dev *d, const char *name, tk_err *err) {
    void *fn = tk_dev_plugin_sym(d, name);
    if (!d || tk_dev_kind_of(d) != TK_DEV_CUDA || !fn) {
        tk_err_set(err, TK_EINVAL, "device memory records need a cuda device (this one is %s)",
                   !d ? "missing" : tk_dev_kind_of(d) == TK_DEV_CPU ? "cpu" : tk_dev_kind_of(d) == TK_DEV_META ? "meta" : "cuda without its plugin");
        return NULL;
    }
    return fn;
}

tk_status tk_dev_cuda_mem_totals(tk_dev *d, tk_cuda_mem_totals *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    tk_cuda_mem_totals_get_fn fn = (tk_cuda_mem_totals_get_fn)cuda_fn(d, "tk_cuda_mem_totals_get", err);
    return fn ? fn(d->ctx, out, err) : TK_EINVAL;
}

tk_status tk_dev_cuda_mem_reset_peak(tk_dev *d, tk_err *err) {
    tk_cuda_mem_reset_peak_fn fn = (tk_cuda_mem_reset_peak_fn)cuda_fn(d, "tk_cuda_mem_reset_peak", err);
    return fn ? fn(d->ctx, err) : TK_EINVAL;
}
