/* torchbin.c — a model folder's weights in any form HF ships them
 * (model.safetensors, pytorch_model.bin, a sharded index of either), and
 * pytorch_model.bin (torch.save of a state dict) read in C, with
 * no Python: the zip format torch >= 1.6 writes (ARCHIVE/data.pkl plus one
 * ARCHIVE/data/KEY entry per storage) and the legacy format before it (a
 * magic number, protocol and system-info pickles, the state dict's pickle,
 * the storage keys, then each storage as an 8-byte element count and its
 * bytes).
 *
 * The pickle goes through the restricted reader (tk_pickle.h) with an
 * allow-list of exactly what a state dict uses: collections.OrderedDict,
 * torch._utils._rebuild_tensor_v2 / _rebuild_parameter and the typed
 * storage classes; anything else (os.system, say) is refused before a value
 * is built, and nothing is ever called: a REDUCE node is read as the tensor
 * it describes. The tensors are copied into an in-memory safetensors image
 * (tk_st_image), so the model loads them through the one reader.
 *
 * Guarantees: every offset and size is checked against the file (a storage
 * or a view past its end is an error naming the tensor); errors name the
 * file; the file is mapped read-only and unmapped before returning.
 */
#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tk_config.h" /* TK_PATH_MAX */
#include "tk_pickle.h"
#include "tk_host_mem.h"
#include "tk_safetensors.h"
#include "tk_torchbin.h"

static const char *const STATE_DICT_GLOBALS[] = {
    "collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_parameter",
    "torch.*Storage", NULL};

static const struct { const char *cls; tk_st_dtype dt; } STORAGES[] = {
    {"torch.FloatStorage", TK_ST_F32}, {"torch.HalfStorage", TK_ST_F16}, {"torch.BFloat16Storage", TK_ST_BF16},
    {"torch.DoubleStorage", TK_ST_F64}, {"torch.LongStorage", TK_ST_I64}, {"torch.IntStorage", TK_ST_I32},
    {"torch.ShortStorage", TK_ST_I16}, {"torch.CharStorage", TK_ST_I8}, {"torch.ByteStorage", TK_ST_U8},
    {"torch.BoolStorage", TK_ST_BOOL}};

static uint64_t rd(const uint8_t *p, int n) {
    uint64_t x = 0;
    for (int i = n - 1; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

/* ---- zip (stored entries, zip64 where torch needs it) ---------------------- */

/* n bytes at offset off lie inside a blob of len bytes (no wrap-around) */
static int inside(uint64_t off, uint64_t n, uint64_t len) { return n <= len && off <= len - n; }

typedef struct {
    const uint8_t *base;
    size_t len;
    const char *path;
} blob;

typedef struct {
    const char *name;    /* not NUL-terminated: name_len bytes */
    size_t name_len;
    uint64_t offset, size; /* the entry's bytes within the file */
} zent;

/* The central directory's entries (new array, *n of them), each checked to
 * be stored (torch never compresses) and inside the file. */
static zent *zip_entries(const blob *b, int *n, tk_err *err) {
    *n = 0;
    if (b->len < 22) goto bad;
    size_t eocd = 0;
    int found = 0;
    for (size_t i = b->len - 22 + 1; i-- > 0 && b->len - i <= 22 + 65535;)
        if (rd(b->base + i, 4) == 0x06054b50) {
            eocd = i;
            found = 1;
            break;
        }
    if (!found) goto bad;
    uint64_t count = rd(b->base + eocd + 10, 2), cd = rd(b->base + eocd + 16, 4);
    if ((count == 0xFFFF || cd == 0xFFFFFFFFu) && eocd >= 20 && rd(b->base + eocd - 20, 4) == 0x07064b50) {
        uint64_t z = rd(b->base + eocd - 20 + 8, 8); /* the zip64 end of central directory */
        if (!inside(z, 56, b->len) || rd(b->base + z, 4) != 0x06064b50) goto bad;
        count = rd(b->base + z + 32, 8);
        cd = rd(b->base + z + 48, 8);
    }
    if (cd >= b->len || count > (b->len - cd) / 46) goto bad;
    zent *e = tk_calloc((size_t)count + 1, sizeof *e);
    if (!e) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", b->path);
        return NULL;
    }
    uint64_t p = cd;
    for (uint64_t k = 0; k < count; k++) {
        if (!inside(p, 46, b->len) || rd(b->base + p, 4) != 0x02014b50) goto bad_e;
        const uint8_t *h = b->base + p;
        uint64_t method = rd(h + 10, 2), csize = rd(h + 20, 4), usize = rd(h + 24, 4);
        uint64_t nl = rd(h + 28, 2), xl = rd(h + 30, 2), cl = rd(h + 32, 2), lho = rd(h + 42, 4);
        if (!inside(p, 46 + nl + xl + cl, b->len)) goto bad_e;
        /* zip64 extra: the fields that overflowed, in this order */
        for (uint64_t x = p + 46 + nl; x + 4 <= p + 46 + nl + xl;) {
            uint64_t id = rd(b->base + x, 2), sz = rd(b->base + x + 2, 2), q = x + 4;
            if (x + 4 + sz > p + 46 + nl + xl) goto bad_e;
            if (id == 1) {
                if (usize == 0xFFFFFFFFu && q + 8 <= x + 4 + sz) { usize = rd(b->base + q, 8); q += 8; }
                if (csize == 0xFFFFFFFFu && q + 8 <= x + 4 + sz) { csize = rd(b->base + q, 8); q += 8; }
                if (lho == 0xFFFFFFFFu && q + 8 <= x + 4 + sz) { lho = rd(b->base + q, 8); q += 8; }
            }
            x += 4 + sz;
        }
        if (method != 0 || csize != usize) {
            free(e);
            tk_err_set(err, TK_EFORMAT, "%s: entry '%.*s' is compressed (method %llu); torch.save writes stored "
                       "entries only", b->path, (int)nl, (const char *)h + 46, (unsigned long long)method);
            return NULL;
        }
        if (!inside(lho, 30, b->len) || rd(b->base + lho, 4) != 0x04034b50) goto bad_e;
        uint64_t data = lho + 30 + rd(b->base + lho + 26, 2) + rd(b->base + lho + 28, 2);
        if (!inside(data, usize, b->len)) goto bad_e;
        e[k] = (zent){(const char *)h + 46, (size_t)nl, data, usize};
        p += 46 + nl + xl + cl;
    }
    *n = (int)count;
    return e;
bad_e:
    free(e);
bad:
    tk_err_set(err, TK_EFORMAT, "%s: not a zip archive torch.save wrote (its central directory is missing or "
               "points outside the file)", b->path);
    return NULL;
}

/* ---- the state dict --------------------------------------------------------- */

typedef struct {
    const uint8_t *src;  /* storage bytes */
    uint64_t src_len;
    size_t esize;
    int ndim;
    int64_t shape[TK_ST_MAX_DIMS], stride[TK_ST_MAX_DIMS];
    uint64_t offset;     /* in elements */
} view;

/* Copies a strided view into row-major order. */
static void fill_view(void *ud, uint8_t *dst) {
    const view *v = ud;
    int64_t idx[TK_ST_MAX_DIMS] = {0}, numel = 1;
    for (int k = 0; k < v->ndim; k++) numel *= v->shape[k];
    for (int64_t i = 0; i < numel; i++) {
        int64_t e = (int64_t)v->offset;
        for (int k = 0; k < v->ndim; k++) e += idx[k] * v->stride[k];
        memcpy(dst + (size_t)i * v->esize, v->src + (size_t)e * v->esize, v->esize);
        for (int k = v->ndim - 1; k >= 0; k--) {
            if (++idx[k] < v->shape[k]) break;
            idx[k] = 0;
        }
    }
}

/* Where storage `key` lives: a zip entry ARCHIVE/data/KEY, or (legacy) an
 * entry of the table the caller built. */
typedef struct {
    const char *key;
    const uint8_t *bytes;
    uint64_t len;
} storage;

static const storage *find_storage(const storage *s, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s[i].key, key)) return &s[i];
    return NULL;
}

static int tuple_ints(const tk_pval *t, int64_t *out, int max) {
    if (!t || (t->kind != TK_PV_TUPLE && t->kind != TK_PV_LIST) || (int)t->n > max) return -1;
    for (size_t i = 0; i < t->n; i++)
        if (tk_pval_int(t->items[i], &out[i]) != 0 || out[i] < 0) return -1;
    return (int)t->n;
}

/* One entry of the state dict: a REDUCE of _rebuild_tensor_v2 (or of
 * _rebuild_parameter around one) over a persistent storage id. */
static int read_tensor(const tk_pval *v, const storage *st, int nst, const char *name, view *out, tk_st_dtype *dt,
                       const char *path, tk_err *err) {
    if (v && v->kind == TK_PV_REDUCE && v->n >= 2 && v->items[0] && v->items[0]->s &&
        !strcmp(v->items[0]->s, "torch._utils._rebuild_parameter") && v->items[1] && v->items[1]->n >= 1)
        v = v->items[1]->items[0];
    if (!v || v->kind != TK_PV_REDUCE || v->n < 2 || !v->items[0] || !v->items[0]->s ||
        strcmp(v->items[0]->s, "torch._utils._rebuild_tensor_v2") || !v->items[1] ||
        v->items[1]->kind != TK_PV_TUPLE || v->items[1]->n < 4) {
        tk_err_set(err, TK_EFORMAT, "%s: '%s' is not a tensor torch.save wrote (expected _rebuild_tensor_v2)", path,
                   name);
        return -1;
    }
    const tk_pval *a = v->items[1], *pid = a->items[0];
    const tk_pval *id = pid && pid->kind == TK_PV_PERSID && pid->n == 1 ? pid->items[0] : NULL;
    /* ('storage', StorageClass, key, location, numel) */
    if (!id || id->kind != TK_PV_TUPLE || id->n < 5 || !tk_pval_str(id->items[0]) ||
        strcmp(tk_pval_str(id->items[0]), "storage") || !id->items[1] || id->items[1]->kind != TK_PV_GLOBAL ||
        !tk_pval_str(id->items[2])) {
        tk_err_set(err, TK_EFORMAT, "%s: '%s': its storage id is not ('storage', class, key, location, size)", path,
                   name);
        return -1;
    }
    int known = 0;
    for (size_t k = 0; k < sizeof STORAGES / sizeof STORAGES[0]; k++)
        if (!strcmp(id->items[1]->s, STORAGES[k].cls)) {
            *dt = STORAGES[k].dt;
            known = 1;
        }
    if (!known) {
        tk_err_set(err, TK_EFORMAT, "%s: '%s': storage class %s is not one txkernel reads", path, name, id->items[1]->s);
        return -1;
    }
    const storage *s = find_storage(st, nst, tk_pval_str(id->items[2]));
    int64_t off = 0;
    memset(out, 0, sizeof *out);
    out->esize = tk_st_dtype_size(*dt);
    int nd = tuple_ints(a->items[2], out->shape, TK_ST_MAX_DIMS), ns = tuple_ints(a->items[3], out->stride, TK_ST_MAX_DIMS);
    if (!s || tk_pval_int(a->items[1], &off) != 0 || off < 0 || nd < 0 || ns != nd) {
        tk_err_set(err, TK_EFORMAT, "%s: '%s': %s", path, name,
                   !s ? "its storage is missing from the file" : "offset, size or stride is not a tuple of ints");
        return -1;
    }
    out->ndim = nd;
    out->offset = (uint64_t)off;
    out->src = s->bytes;
    out->src_len = s->len;
    /* the last element the view touches must lie inside the storage */
    uint64_t last = (uint64_t)off, numel = 1;
    for (int k = 0; k < nd; k++) {
        numel *= (uint64_t)out->shape[k];
        if (out->shape[k] > 0) last += (uint64_t)(out->shape[k] - 1) * (uint64_t)out->stride[k];
    }
    if (numel > 0 && (last + 1) * out->esize > s->len) {
        tk_err_set(err, TK_EFORMAT, "%s: '%s': its view (offset %lld, %llu elements) runs past its storage (%llu bytes)",
                   path, name, (long long)off, (unsigned long long)numel, (unsigned long long)s->len);
        return -1;
    }
    return 0;
}

/* The state dict (an OrderedDict REDUCE with its SETITEMS, or a plain dict)
 * as tensors, then the image. */
static tk_st_file *image_of(const tk_pval *root, const storage *st, int nst, const char *path, tk_err *err) {
    const tk_pval *const *kv = NULL;
    size_t n = 0;
    if (root && root->kind == TK_PV_DICT) {
        kv = (const tk_pval *const *)root->items;
        n = root->n / 2; /* n counts items: key, value, key, value, ... */
    } else if (root && root->kind == TK_PV_REDUCE && root->items[0] && root->items[0]->s &&
               !strcmp(root->items[0]->s, "collections.OrderedDict") && root->n >= 3) {
        kv = (const tk_pval *const *)root->items + 3;
        n = (root->n - 3) / 2;
    } else {
        tk_err_set(err, TK_EFORMAT, "%s: not a state dict (the pickle's top level is no dict of tensors)", path);
        return NULL;
    }
    tk_st_part *parts = tk_calloc(n + 1, sizeof *parts);
    view *views = tk_calloc(n + 1, sizeof *views);
    int np = 0;
    tk_st_file *f = NULL;
    if (!parts || !views) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", path);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const char *name = tk_pval_str(kv[2 * i]);
        if (!name) {
            tk_err_set(err, TK_EFORMAT, "%s: a state dict key is not a string", path);
            goto out;
        }
        tk_st_dtype dt = TK_ST_F32;
        if (read_tensor(kv[2 * i + 1], st, nst, name, &views[np], &dt, path, err) != 0) goto out;
        tk_st_part *p = &parts[np];
        p->name = name;
        p->dtype = dt;
        p->ndim = views[np].ndim;
        uint64_t numel = 1;
        for (int k = 0; k < p->ndim; k++) numel *= (uint64_t)(p->shape[k] = views[np].shape[k]);
        p->nbytes = numel * views[np].esize;
        p->fill = fill_view;
        p->ud = &views[np];
        np++;
    }
    f = tk_st_image(parts, np, path, err);
out:
    free(parts);
    free(views);
    return f;
}

static tk_st_file *load_zip(const blob *b, tk_err *err) {
    int n = 0;
    zent *e = zip_entries(b, &n, err);
    if (!e) return NULL;
    const zent *pkl = NULL;
    for (int i = 0; i < n; i++)
        if (e[i].name_len >= 9 && !memcmp(e[i].name + e[i].name_len - 9, "/data.pkl", 9)) pkl = &e[i];
    storage *st = tk_calloc((size_t)n + 1, sizeof *st);
    char *keys = tk_calloc((size_t)n + 1, 64);
    int nst = 0;
    tk_st_file *f = NULL;
    if (!pkl || !st || !keys) {
        tk_err_set(err, pkl ? TK_EINVAL : TK_EFORMAT, "%s: %s", b->path,
                   pkl ? "out of host memory" : "no ARCHIVE/data.pkl in the zip: not a torch.save file");
        goto out;
    }
    size_t prefix = pkl->name_len - 8; /* "ARCHIVE/" */
    for (int i = 0; i < n; i++) {
        /* ARCHIVE/data/KEY */
        if (e[i].name_len > prefix + 5 && !memcmp(e[i].name, pkl->name, prefix) &&
            !memcmp(e[i].name + prefix, "data/", 5) && e[i].name_len - prefix - 5 < 63) {
            char *k = keys + 64 * nst;
            memcpy(k, e[i].name + prefix + 5, e[i].name_len - prefix - 5);
            st[nst++] = (storage){k, b->base + e[i].offset, e[i].size};
        }
    }
    tk_pickle_opts o = {.name = b->path, .allowed_globals = STATE_DICT_GLOBALS, .allow_persid = 1};
    tk_pickle *p = tk_pickle_load(b->base + pkl->offset, (size_t)pkl->size, &o, err);
    if (p) f = image_of(tk_pickle_root(p), st, nst, b->path, err);
    tk_pickle_destroy(&p);
out:
    free(keys);
    free(st);
    free(e);
    return f;
}

/* The legacy format: pickles one after another, then the storages. */
static tk_pickle *load_at(const blob *b, size_t *pos, const tk_pickle_opts *o, tk_err *err) {
    tk_pickle *p = tk_pickle_load(b->base + *pos, b->len - *pos, o, err);
    if (p) *pos += tk_pickle_used(p);
    return p;
}

/* pickle.dump(0x1950a86a20f9469cfc6c, protocol=2): an int wider than the
 * reader's 64 bits, so it is compared as bytes */
static const uint8_t LEGACY_MAGIC[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                       0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e};

static tk_st_file *load_legacy(const blob *b, tk_err *err) {
    if (b->len < sizeof LEGACY_MAGIC || memcmp(b->base, LEGACY_MAGIC, sizeof LEGACY_MAGIC)) {
        tk_err_set(err, TK_EFORMAT, "%s: neither a zip archive nor a legacy torch.save file (no magic number)",
                   b->path);
        return NULL;
    }
    size_t pos = sizeof LEGACY_MAGIC;
    tk_pickle_opts plain = {.name = b->path};
    tk_pickle_opts sd = {.name = b->path, .allowed_globals = STATE_DICT_GLOBALS, .allow_persid = 1};
    tk_pickle *proto = NULL, *info = NULL, *root = NULL, *keys = NULL;
    tk_st_file *f = NULL;
    storage *st = NULL;
    if (!(proto = load_at(b, &pos, &plain, err)) || !(info = load_at(b, &pos, &plain, err)) ||
        !(root = load_at(b, &pos, &sd, err)) || !(keys = load_at(b, &pos, &plain, err)))
        goto out;
    int64_t version = 0;
    if (tk_pval_int(tk_pickle_root(proto), &version) != 0 || version != 1001) {
        tk_err_set(err, TK_EFORMAT, "%s: legacy torch.save protocol %lld; txkernel reads 1001", b->path,
                   (long long)version);
        goto out;
    }
    const tk_pval *kl = tk_pickle_root(keys);
    if (!kl || kl->kind != TK_PV_LIST) {
        tk_err_set(err, TK_EFORMAT, "%s: the storage key list is missing", b->path);
        goto out;
    }
    /* each storage: element count (8 bytes) and its bytes; the element size
     * comes from the storage class the state dict names for that key */
    st = tk_calloc(kl->n + 1, sizeof *st);
    if (!st) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", b->path);
        goto out;
    }
    const tk_pval *r = tk_pickle_root(root);
    for (size_t i = 0; i < kl->n; i++) {
        const char *key = tk_pval_str(kl->items[i]);
        size_t esize = 0;
        /* find the storage class of this key among the tensors */
        const tk_pval *const *kv = r && r->kind == TK_PV_DICT ? (const tk_pval *const *)r->items
                                 : r && r->kind == TK_PV_REDUCE ? (const tk_pval *const *)r->items + 3 : NULL;
        size_t nkv = r && r->kind == TK_PV_DICT ? r->n / 2 : r && r->kind == TK_PV_REDUCE && r->n >= 3 ? (r->n - 3) / 2 : 0;
        for (size_t j = 0; key && j < nkv && !esize; j++) {
            const tk_pval *t = kv[2 * j + 1];
            if (t && t->kind == TK_PV_REDUCE && t->n >= 2 && t->items[1] && t->items[1]->n >= 1) {
                const tk_pval *pid = t->items[1]->items[0];
                const tk_pval *id = pid && pid->kind == TK_PV_PERSID && pid->n == 1 ? pid->items[0] : NULL;
                if (id && id->kind == TK_PV_TUPLE && id->n >= 3 && tk_pval_str(id->items[2]) &&
                    !strcmp(tk_pval_str(id->items[2]), key) && id->items[1] && id->items[1]->s)
                    for (size_t k = 0; k < sizeof STORAGES / sizeof STORAGES[0]; k++)
                        if (!strcmp(id->items[1]->s, STORAGES[k].cls)) esize = tk_st_dtype_size(STORAGES[k].dt);
            }
        }
        if (!key || !esize || pos + 8 > b->len) {
            tk_err_set(err, TK_EFORMAT, "%s: storage %zu of %zu cannot be read (no tensor names its class, or the "
                       "file ends)", b->path, i + 1, kl->n);
            goto out;
        }
        uint64_t count = rd(b->base + pos, 8);
        pos += 8;
        if (count > (b->len - pos) / esize) {
            tk_err_set(err, TK_EFORMAT, "%s: storage '%s' claims %llu elements, past the end of the file", b->path, key,
                       (unsigned long long)count);
            goto out;
        }
        st[i] = (storage){key, b->base + pos, count * esize};
        pos += count * esize;
    }
    f = image_of(r, st, (int)kl->n, b->path, err);
out:
    free(st);
    tk_pickle_destroy(&proto);
    tk_pickle_destroy(&info);
    tk_pickle_destroy(&root);
    tk_pickle_destroy(&keys);
    return f;
}


tk_st_file *tk_torch_bin_open(const char *path, tk_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tk_err_set(err, TK_EIO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < 8) {
        close(fd);
        tk_err_set(err, TK_EFORMAT, "%s: too short to be a torch.save file", path);
        return NULL;
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        tk_err_set(err, TK_EIO, "%s: cannot map: %s", path, strerror(errno));
        return NULL;
    }
    tk_st_file *f = tk_torch_bin_parse(m, (size_t)sb.st_size, path, err);
    munmap(m, (size_t)sb.st_size);
    return f;
}

tk_st_file *tk_torch_bin_parse(const uint8_t *buf, size_t len, const char *name, tk_err *err) {
    blob b = {buf, len, name};
    if (len < 8) {
        tk_err_set(err, TK_EFORMAT, "%s: too short to be a torch.save file", name);
        return NULL;
    }
    return rd(b.base, 4) == 0x04034b50 ? load_zip(&b, err) : load_legacy(&b, err);
}

/* ---- a model folder's weights, whatever form they take ---------------------- */

static int file_ok(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

static tk_st_file *open_one(const char *path, tk_err *err) {
    return ends_with(path, ".safetensors") ? tk_st_open(path, err) : tk_torch_bin_open(path, err);
}

/* A sharded checkpoint: the index's weight_map names each tensor's shard;
 * every shard is opened, its tensors copied into one image. */
static tk_st_file *open_sharded(const char *dir, const char *index, tk_err *err) {
    json_error_t je;
    json_t *root = json_load_file(index, 0, &je);
    json_t *map = root ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(map)) {
        tk_err_set(err, TK_EFORMAT, "%s:%d: %s", index, root ? 0 : je.line,
                   root ? "no \"weight_map\" object" : je.text);
        json_decref(root);
        return NULL;
    }
    /* the distinct shard files, in order of first mention */
    size_t nmap = json_object_size(map);
    const char **names = tk_calloc(nmap + 1, sizeof *names);
    tk_st_file **shards = tk_calloc(nmap + 1, sizeof *shards);
    int ns = 0, total = 0;
    tk_st_file *f = NULL;
    tk_st_part *parts = NULL;
    const char *k;
    json_t *v;
    if (!names || !shards) goto oom;
    json_object_foreach(map, k, v) {
        const char *s = json_string_value(v);
        int seen = 0;
        if (!s || strchr(s, '/')) {
            tk_err_set(err, TK_EFORMAT, "%s: weight_map['%s'] is not a file name in the folder", index, k);
            goto out;
        }
        for (int i = 0; i < ns; i++) seen |= !strcmp(names[i], s);
        if (!seen) names[ns++] = s;
    }
    for (int i = 0; i < ns; i++) {
        char p[TK_PATH_MAX + 256];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (!(shards[i] = open_one(p, err))) goto out;
        total += tk_st_count(shards[i]);
    }
    if (!(parts = tk_calloc((size_t)total + 1, sizeof *parts))) goto oom;
    int np = 0;
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < tk_st_count(shards[i]); j++) {
            const tk_st_entry *e = tk_st_at(shards[i], j);
            tk_st_part *p = &parts[np++];
            p->name = e->name;
            p->dtype = e->dtype;
            p->ndim = e->ndim;
            memcpy(p->shape, e->shape, sizeof p->shape);
            p->nbytes = e->end - e->begin;
            p->data = tk_st_data(shards[i], e);
        }
    f = tk_st_image(parts, np, index, err);
    goto out;
oom:
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory", index);
out:
    for (int i = 0; shards && i < ns; i++) tk_st_close(&shards[i]);
    free(shards);
    free(names);
    free(parts);
    json_decref(root);
    return f;
}

static const char *const WEIGHT_FILES[] = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                                           "pytorch_model.bin.index.json", NULL};

int tk_checkpoint_find(const char *path, char *file, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
        (ends_with(path, ".safetensors") || ends_with(path, ".bin") || ends_with(path, ".index.json"))) {
        snprintf(file, n, "%s", path);
        return 1;
    }
    for (int i = 0; WEIGHT_FILES[i]; i++) {
        snprintf(file, n, "%s/%s", path, WEIGHT_FILES[i]);
        if (file_ok(file)) return 1;
    }
    return 0;
}

tk_st_file *tk_checkpoint_open(const char *path, char *file, size_t n, tk_err *err) {
    if (!tk_checkpoint_find(path, file, n)) {
        snprintf(file, n, "%s", path);
        tk_err_set(err, TK_EIO, "%s: no weights (model.safetensors, pytorch_model.bin, or a sharded index of either)",
                   path);
        return NULL;
    }
    /* safetensors shards are mapped side by side (tk_st_open_index, no
     * copy); pytorch_model.bin shards are read and copied into one image */
    if (ends_with(file, "model.safetensors.index.json")) return tk_st_open_index(file, err);
    if (ends_with(file, ".index.json")) {
        char dir[TK_PATH_MAX + 64];
        snprintf(dir, sizeof dir, "%s", file);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        return open_sharded(dir, file, err);
    }
    return open_one(file, err);
}
