/* tensor.c — tensors: allocation through the device's tagged allocator, views,
 * and host <-> device copies (with fp32 conversion for 16-bit dtypes).
 *
 * Guarantees: a failed tk_tensor_alloc leaves the tensor empty, the device's
 * last OOM record filled and a one-line message in err naming the owner,
 * category, size and the device's state; copies on meta do nothing and
 * succeed, so planning code runs the same calls as training code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_internal.h"
#include "tk_host_mem.h"

size_t tk_tensor_nbytes(const tk_tensor *t) {
    return t ? (size_t)tk_tensor_numel(t) * tk_dtype_size(t->dtype) : 0;
}

/* The same facts PyTorch's message gives, plus who asked and what kind of
 * memory it was: "CUDA out of memory: tried to allocate 24.00 MiB for
 * bert.encoder.layer.7.output.dense (act). Device NVIDIA T4 has a capacity of
 * 14.75 GiB of which 8.00 MiB is free; 13.10 GiB is allocated and 13.50 GiB
 * reserved (...)". */
/* "f32 [32, 12, 512, 512]" */
static void describe(tk_dtype dt, const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t len = (size_t)snprintf(buf, n, "%s [", tk_dtype_name(dt));
    for (int i = 0; i < ndim && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < n) snprintf(buf + len, n - len, "]");
}

static void track_alloc(tk_dev *d, const tk_tensor *t, size_t bytes, size_t peak_before);

static void oom_message(tk_dev *d, const tk_oom *o, tk_err *err) {
    char req[32], cap[32], fr[32], al[32], rs[32], gap[32], lf[32], where[200];
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    tk_format_bytes(o->requested, req, sizeof req);
    tk_format_bytes(o->capacity, cap, sizeof cap);
    tk_format_bytes(o->free_bytes, fr, sizeof fr);
    tk_format_bytes(o->allocated, al, sizeof al);
    tk_format_bytes(o->reserved, rs, sizeof rs);
    tk_format_bytes(o->reserved - o->allocated, gap, sizeof gap);
    tk_format_bytes(o->largest_free_block, lf, sizeof lf);
    if (o->capacity)
        snprintf(where, sizeof where, "Device %.80s has a %scapacity of %s of which %s is free",
                 info.name, d->capacity && d->kind != TK_DEV_CUDA ? "simulated " : "", cap, fr);
    else
        snprintf(where, sizeof where, "Device %.80s (no capacity limit set) refused more memory",
                 info.name);
    tk_err_set(err, TK_EOOM,
               "%s out of memory: tried to allocate %s for %s (%s%s%s). %s; %s is allocated and %s "
               "reserved (%s reserved but unallocated, largest free block %s).%s",
               d->kind == TK_DEV_CUDA ? "CUDA" : "Device", req, o->owner_name,
               tk_cat_name(o->tag.cat), o->tensor[0] ? ", " : "", o->tensor, where, al, rs, gap, lf,
               o->fragmentation ? " The cache is fragmented: enough is reserved but no free block "
                                  "is large enough; emptying the cache would let it start over." : "");
}

tk_status tk_tensor_alloc(tk_dev *d, tk_tensor *t, tk_dtype dt, int ndim, const int64_t *shape,
                          tk_cat cat, const char *owner, tk_err *err) {
    if (!t) { tk_err_set(err, TK_EINVAL, "tk_tensor_alloc: no tensor"); return TK_EINVAL; }
    memset(t, 0, sizeof *t);
    if (!d) { tk_err_set(err, TK_EINVAL, "tk_tensor_alloc: no device"); return TK_EINVAL; }
    const char *who = owner && *owner ? owner : "(unowned)";
    if ((unsigned)dt >= TK_DTYPE_COUNT || (unsigned)cat >= TK_CAT_COUNT ||
        ndim < 0 || ndim > TK_MAX_DIMS || (ndim > 0 && !shape)) {
        tk_err_set(err, TK_EINVAL, "tensor for %s: bad dtype %d, category %d or ndim %d",
                   who, (int)dt, (int)cat, ndim);
        return TK_EINVAL;
    }
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] > 0 && n > SIZE_MAX / 16 / (size_t)shape[i])) {
            tk_err_set(err, TK_EINVAL, "tensor for %s: dimension %d is %lld", who, i,
                       (long long)shape[i]);
            return TK_EINVAL;
        }
        n *= (size_t)shape[i];
        t->shape[i] = shape[i];
    }
    t->ndim = ndim;
    t->dtype = dt;
    int id = tk_alloc_owner_id(d->alloc, who);
    if (id < 0) {
        memset(t, 0, sizeof *t);
        tk_err_set(err, TK_ENOMEM, "out of host memory naming owner %s", who);
        return TK_ENOMEM;
    }
    t->tag.cat = cat;
    t->tag.owner = id;
    size_t bytes = n * tk_dtype_size(dt);
    void *p = NULL;
    size_t peak_before = 0;
    if (d->track) {
        tk_alloc_stats st0;
        tk_alloc_stats_get(d->alloc, &st0);
        peak_before = st0.allocated_peak;
    }
    tk_status st = tk_alloc_malloc(d->alloc, bytes, t->tag, &p, &d->last_oom);
    if (st != TK_OK) {
        d->has_oom = st == TK_EOOM;
        if (st == TK_EOOM) {
            describe(dt, shape, ndim, d->last_oom.tensor, sizeof d->last_oom.tensor);
            oom_message(d, &d->last_oom, err);
        }
        else if (st == TK_ENOMEM) tk_err_nomem(err, who);
        else tk_err_set(err, st, "tensor for %s: allocator refused the tag", who);
        memset(t, 0, sizeof *t);
        return st;
    }
    t->data = p;
    t->owns = p != NULL;
    if (d->track && p) track_alloc(d, t, bytes, peak_before);
    return TK_OK;
}

/* ---- tensor tracking ---------------------------------------------------- */

tk_status tk_dev_track_tensors(tk_dev *d, tk_err *err) {
    if (!d) {
        tk_err_set(err, TK_EINVAL, "tk_dev_track_tensors: no device");
        return TK_EINVAL;
    }
    d->track = 1;
    return TK_OK;
}

static int grow_list(tk_live_tensor **v, int *cap, int need) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    tk_live_tensor *n = tk_realloc(*v, (size_t)nc * sizeof *n);
    if (!n) return -1;
    *v = n;
    *cap = nc;
    return 0;
}

/* After an allocation: remember the tensor; a new peak arms the copy. A
 * tracking list that cannot grow stops tracking (the report then says
 * nothing rather than something wrong). */
static void track_alloc(tk_dev *d, const tk_tensor *t, size_t bytes, size_t peak_before) {
    if (grow_list(&d->live, &d->cap_live, d->n_live + 1)) {
        d->track = 0;
        return;
    }
    tk_live_tensor *e = &d->live[d->n_live++];
    e->ptr = t->data;
    e->owner = t->tag.owner;
    e->cat = t->tag.cat;
    e->dtype = t->dtype;
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof e->shape);
    e->bytes = bytes;
    e->block = tk_alloc_block_size(d->alloc, t->data);
    tk_alloc_stats st;
    tk_alloc_stats_get(d->alloc, &st);
    if (st.allocated_peak > peak_before) d->peak_armed = 1;
}

/* Before a free: the first free after a new peak copies the live list (it
 * is the peak's), then the tensor leaves the list. */
static void track_free(tk_dev *d, const void *ptr) {
    if (d->peak_armed) {
        if (grow_list(&d->snap, &d->cap_snap, d->n_live)) {
            d->track = 0;
            return;
        }
        memcpy(d->snap, d->live, (size_t)d->n_live * sizeof *d->snap);
        d->n_snap = d->n_live;
        d->peak_armed = 0;
    }
    for (int i = d->n_live - 1; i >= 0; i--) /* frees are mostly of recent tensors */
        if (d->live[i].ptr == ptr) {
            d->live[i] = d->live[--d->n_live];
            return;
        }
}

static int cmp_info_bytes(const void *a, const void *b) {
    const tk_tensor_info *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    int c = strcmp(x->owner, y->owner);
    return c ? c : (int)x->cat - (int)y->cat;
}

int tk_dev_tensors_at_peak(const tk_dev *d, tk_tensor_info *out, int max) {
    if (!d || !d->track || !out || max <= 0) return 0;
    const tk_live_tensor *v = d->peak_armed ? d->live : d->snap;
    int n = d->peak_armed ? d->n_live : d->n_snap;
    tk_tensor_info *all = tk_malloc((size_t)(n > 0 ? n : 1) * sizeof *all);
    if (!all) return 0;
    for (int i = 0; i < n; i++) {
        const char *name = tk_alloc_owner_name(d->alloc, v[i].owner);
        snprintf(all[i].owner, sizeof all[i].owner, "%s", name ? name : "(unowned)");
        all[i].cat = v[i].cat;
        all[i].dtype = v[i].dtype;
        all[i].ndim = v[i].ndim;
        memcpy(all[i].shape, v[i].shape, sizeof all[i].shape);
        all[i].bytes = v[i].bytes;
        all[i].block = v[i].block;
    }
    qsort(all, (size_t)n, sizeof *all, cmp_info_bytes);
    int k = n < max ? n : max;
    memcpy(out, all, (size_t)k * sizeof *out);
    free(all);
    return k;
}

void tk_tensor_free(tk_dev *d, tk_tensor *t) {
    if (!t) return;
    if (d && t->owns && t->data) {
        if (d->track) track_free(d, t->data);
        tk_alloc_free(d->alloc, t->data);
    }
    memset(t, 0, sizeof *t);
}

tk_tensor tk_tensor_view(const tk_tensor *t, int64_t offset, int64_t numel) {
    tk_tensor v;
    memset(&v, 0, sizeof v);
    if (!t) return v;
    v.dtype = t->dtype;
    v.tag = t->tag;
    v.ndim = 1;
    v.shape[0] = numel;
    v.data = t->data ? (char *)t->data + offset * (int64_t)tk_dtype_size(t->dtype) : NULL;
    return v;
}

static tk_status copy_check(tk_dev *d, const tk_tensor *t, const void *host, const char *fn,
                            tk_err *err) {
    if (!d || !t || (!host && tk_tensor_nbytes(t))) {
        tk_err_set(err, TK_EINVAL, "%s: missing device, tensor or host buffer", fn);
        return TK_EINVAL;
    }
    if (!t->data && tk_tensor_nbytes(t)) {
        tk_err_set(err, TK_EINVAL, "%s: tensor of %s has no data (freed or never allocated)",
                   fn, tk_alloc_owner_name(d->alloc, t->tag.owner));
        return TK_EINVAL;
    }
    return TK_OK;
}

tk_status tk_tensor_write(tk_dev *d, tk_tensor *t, const void *host, tk_err *err) {
    tk_status st = copy_check(d, t, host, "tk_tensor_write", err);
    if (st != TK_OK || !d->be->write || !tk_tensor_nbytes(t)) return st;
    return d->be->write(d->ctx, t->data, host, tk_tensor_nbytes(t), err);
}

tk_status tk_tensor_read(tk_dev *d, const tk_tensor *t, void *host, tk_err *err) {
    tk_status st = copy_check(d, t, host, "tk_tensor_read", err);
    if (st != TK_OK || !d->be->read || !tk_tensor_nbytes(t)) return st;
    return d->be->read(d->ctx, host, t->data, tk_tensor_nbytes(t), err);
}

static int is_float(tk_dtype dt) { return dt == TK_F32 || dt == TK_F16 || dt == TK_BF16; }

tk_status tk_tensor_read_f32(tk_dev *d, const tk_tensor *t, float *host, tk_err *err) {
    if (t && !is_float(t->dtype)) {
        tk_err_set(err, TK_EINVAL, "tk_tensor_read_f32: dtype %s is not a float type",
                   tk_dtype_name(t->dtype));
        return TK_EINVAL;
    }
    if (!t || t->dtype == TK_F32) return tk_tensor_read(d, t, host, err);
    tk_status st = copy_check(d, t, host, "tk_tensor_read_f32", err);
    if (st != TK_OK || !d->be->read) return st;
    int64_t n = tk_tensor_numel(t);
    uint16_t *tmp = tk_malloc((size_t)n * 2 + 1);
    if (!tmp) { tk_err_set(err, TK_ENOMEM, "tk_tensor_read_f32: out of host memory"); return TK_ENOMEM; }
    st = tk_tensor_read(d, t, tmp, err);
    for (int64_t i = 0; st == TK_OK && i < n; i++)
        host[i] = t->dtype == TK_F16 ? tk_f16_to_f32(tmp[i]) : tk_bf16_to_f32(tmp[i]);
    free(tmp);
    return st;
}

tk_status tk_tensor_write_f32(tk_dev *d, tk_tensor *t, const float *host, tk_err *err) {
    if (t && !is_float(t->dtype)) {
        tk_err_set(err, TK_EINVAL, "tk_tensor_write_f32: dtype %s is not a float type",
                   tk_dtype_name(t->dtype));
        return TK_EINVAL;
    }
    if (!t || t->dtype == TK_F32) return tk_tensor_write(d, t, host, err);
    tk_status st = copy_check(d, t, host, "tk_tensor_write_f32", err);
    if (st != TK_OK || !d->be->write) return st;
    int64_t n = tk_tensor_numel(t);
    uint16_t *tmp = tk_malloc((size_t)n * 2 + 1);
    if (!tmp) { tk_err_set(err, TK_ENOMEM, "tk_tensor_write_f32: out of host memory"); return TK_ENOMEM; }
    for (int64_t i = 0; i < n; i++)
        tmp[i] = t->dtype == TK_F16 ? tk_f32_to_f16(host[i]) : tk_f32_to_bf16(host[i]);
    st = tk_tensor_write(d, t, tmp, err);
    free(tmp);
    return st;
}
