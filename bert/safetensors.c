/* safetensors.c — strict safetensors reader and atomic writer (jansson).
 *
 * The reader maps the file read-only and validates everything before it
 * hands out a single entry (see tk_safetensors.h for the rules), so callers
 * can trust offsets and sizes. The writer lays tensors out in insertion
 * order, pads the JSON header with spaces to a multiple of 8, and writes via
 * a temp file + fsync + rename.
 */
#include "tk_safetensors.h"
#include "tk_host_mem.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { const char *name; size_t size; } st_dtypes[TK_ST_DTYPE_COUNT] = {
    [TK_ST_F64] = {"F64", 8}, [TK_ST_F32] = {"F32", 4}, [TK_ST_F16] = {"F16", 2},
    [TK_ST_BF16] = {"BF16", 2}, [TK_ST_I64] = {"I64", 8}, [TK_ST_I32] = {"I32", 4},
    [TK_ST_I16] = {"I16", 2}, [TK_ST_I8] = {"I8", 1}, [TK_ST_U8] = {"U8", 1},
    [TK_ST_BOOL] = {"BOOL", 1},
};

const char *tk_st_dtype_name(tk_st_dtype dt) {
    return (unsigned)dt < TK_ST_DTYPE_COUNT ? st_dtypes[dt].name : "?";
}
size_t tk_st_dtype_size(tk_st_dtype dt) {
    return (unsigned)dt < TK_ST_DTYPE_COUNT ? st_dtypes[dt].size : 0;
}

struct tk_st_file {
    const uint8_t *base;   /* whole image */
    size_t len;
    const uint8_t *data;   /* data buffer (base + 8 + N) */
    size_t data_len;
    int mapped;            /* 1: base is our mmap */
    int owned;             /* 1: base is our malloc (tk_st_parse_owned) */
    int n;
    tk_st_entry *e;        /* sorted by begin */
    json_t *meta;          /* "__metadata__" object or NULL (own reference) */
};

int tk_st_count(const tk_st_file *f) { return f ? f->n : 0; }
const tk_st_entry *tk_st_at(const tk_st_file *f, int i) {
    return (f && i >= 0 && i < f->n) ? &f->e[i] : NULL;
}
const tk_st_entry *tk_st_find(const tk_st_file *f, const char *name) {
    for (int i = 0; f && i < f->n; i++)
        if (strcmp(f->e[i].name, name) == 0) return &f->e[i];
    return NULL;
}
const void *tk_st_data(const tk_st_file *f, const tk_st_entry *e) { return f->data + e->begin; }
int64_t tk_st_numel(const tk_st_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}
const char *tk_st_metadata(const tk_st_file *f, const char *key) {
    json_t *v = f && f->meta ? json_object_get(f->meta, key) : NULL;
    return v ? json_string_value(v) : NULL;
}

void tk_st_close(tk_st_file **pf) {
    if (!pf || !*pf) return;
    tk_st_file *f = *pf;
    for (int i = 0; i < f->n; i++) free(f->e[i].name);
    free(f->e);
    json_decref(f->meta);
    if (f->mapped && f->base) munmap((void *)f->base, f->len);
    if (f->owned) free((void *)f->base);
    free(f);
    *pf = NULL;
}

static int cmp_begin(const void *a, const void *b) {
    const tk_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Parses one entry's object into e; returns 0 or fills err. */
static int parse_entry(const char *what, const char *name, json_t *v, tk_st_entry *e, tk_err *err) {
    if (!json_is_object(v)) {
        tk_err_set(err, TK_EFORMAT, "%s: tensor '%s': header entry is not an object", what, name);
        return -1;
    }
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) || json_array_size(off) != 2) {
        tk_err_set(err, TK_EFORMAT, "%s: tensor '%s': needs \"dtype\" (string), \"shape\" (array) "
                   "and \"data_offsets\" ([begin, end])", what, name);
        return -1;
    }
    int k;
    for (k = 0; k < TK_ST_DTYPE_COUNT; k++)
        if (strcmp(json_string_value(dt), st_dtypes[k].name) == 0) break;
    if (k == TK_ST_DTYPE_COUNT) {
        tk_err_set(err, TK_EFORMAT, "%s: tensor '%s': unsupported dtype \"%s\"", what, name,
                   json_string_value(dt));
        return -1;
    }
    e->dtype = (tk_st_dtype)k;
    if (json_array_size(sh) > TK_ST_MAX_DIMS) {
        tk_err_set(err, TK_EFORMAT, "%s: tensor '%s': %zu dims (at most %d supported)", what, name,
                   json_array_size(sh), TK_ST_MAX_DIMS);
        return -1;
    }
    e->ndim = (int)json_array_size(sh);
    uint64_t numel = 1;
    for (int i = 0; i < e->ndim; i++) {
        json_t *d = json_array_get(sh, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0) {
            tk_err_set(err, TK_EFORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                       what, name, i);
            return -1;
        }
        e->shape[i] = json_integer_value(d);
        if (e->shape[i] && numel > UINT64_MAX / 16 / (uint64_t)e->shape[i]) {
            tk_err_set(err, TK_EFORMAT, "%s: tensor '%s': shape too large", what, name);
            return -1;
        }
        numel *= (uint64_t)e->shape[i];
    }
    json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (!json_is_integer(b) || !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b)) {
        tk_err_set(err, TK_EFORMAT, "%s: tensor '%s': data_offsets must be [begin, end] with "
                   "0 <= begin <= end", what, name);
        return -1;
    }
    e->begin = (uint64_t)json_integer_value(b);
    e->end = (uint64_t)json_integer_value(en);
    uint64_t want = numel * st_dtypes[k].size;
    if (e->end - e->begin != want) {
        tk_err_set(err, TK_EFORMAT, "%s: tensor '%s': data_offsets span %llu bytes but shape and "
                   "dtype %s need %llu", what, name, (unsigned long long)(e->end - e->begin),
                   st_dtypes[k].name, (unsigned long long)want);
        return -1;
    }
    return 0;
}

tk_st_file *tk_st_parse(const void *buf, size_t len, const char *what, tk_err *err) {
    const uint8_t *p = buf;
    if (len < 8) {
        tk_err_set(err, TK_EFORMAT, "%s: %zu bytes is too short for a safetensors file "
                   "(8-byte header length missing)", what, len);
        return NULL;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | p[i];
    if (n > TK_ST_MAX_HEADER) {
        tk_err_set(err, TK_EFORMAT, "%s: header length %llu exceeds the 100 MB limit", what,
                   (unsigned long long)n);
        return NULL;
    }
    if (n > len - 8) {
        tk_err_set(err, TK_EFORMAT, "%s: header length %llu runs past the end of the file "
                   "(%zu bytes)", what, (unsigned long long)n, len);
        return NULL;
    }
    if (n < 2 || p[8] != '{') {
        tk_err_set(err, TK_EFORMAT, "%s: header does not start with '{'", what);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        tk_err_set(err, TK_EFORMAT, "%s: header JSON: %s (at byte %d)", what, je.text, je.position);
        return NULL;
    }
    tk_st_file *f = tk_calloc(1, sizeof *f);
    if (!f || !json_is_object(root)) {
        if (f) tk_err_set(err, TK_EFORMAT, "%s: header is not a JSON object", what);
        else tk_err_set(err, TK_ENOMEM, "%s: out of host memory", what);
        json_decref(root);
        free(f);
        return NULL;
    }
    f->base = p;
    f->len = len;
    f->data = p + 8 + n;
    f->data_len = len - 8 - (size_t)n;
    size_t cap = json_object_size(root);
    f->e = tk_calloc(cap ? cap : 1, sizeof *f->e);
    const char *key;
    json_t *v;
    int bad = !f->e;
    if (bad) tk_err_set(err, TK_ENOMEM, "%s: out of host memory", what);
    json_object_foreach(root, key, v) {
        if (bad) break;
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) {
                tk_err_set(err, TK_EFORMAT, "%s: __metadata__ is not an object", what);
                bad = 1;
                break;
            }
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    tk_err_set(err, TK_EFORMAT, "%s: __metadata__ value of '%s' is not a string",
                               what, mk);
                    bad = 1;
                    break;
                }
            }
            f->meta = json_incref(v);
            continue;
        }
        tk_st_entry *e = &f->e[f->n];
        if (parse_entry(what, key, v, e, err)) { bad = 1; break; }
        e->name = tk_strdup(key);
        if (!e->name) { tk_err_set(err, TK_ENOMEM, "%s: out of host memory", what); bad = 1; break; }
        f->n++;
    }
    json_decref(root);
    if (!bad) {
        qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_begin);
        uint64_t pos = 0;
        for (int i = 0; i < f->n && !bad; i++) {
            tk_st_entry *e = &f->e[i];
            if (e->begin > pos) {
                tk_err_set(err, TK_EFORMAT, "%s: tensor '%s': gap of %llu bytes before its data "
                           "(offset %llu, previous data ends at %llu)", what, e->name,
                           (unsigned long long)(e->begin - pos), (unsigned long long)e->begin,
                           (unsigned long long)pos);
                bad = 1;
            } else if (e->begin < pos) {
                tk_err_set(err, TK_EFORMAT, "%s: tensor '%s': data [%llu, %llu) overlaps the "
                           "previous tensor '%s'", what, e->name, (unsigned long long)e->begin,
                           (unsigned long long)e->end, i ? f->e[i - 1].name : "?");
                bad = 1;
            }
            pos = e->end;
        }
        if (!bad && pos != f->data_len) {
            if (pos > f->data_len)
                tk_err_set(err, TK_EFORMAT, "%s: tensors need %llu data bytes but the file has %zu "
                           "(truncated?)", what, (unsigned long long)pos, f->data_len);
            else
                tk_err_set(err, TK_EFORMAT, "%s: %zu trailing bytes after the last tensor's data",
                           what, f->data_len - (size_t)pos);
            bad = 1;
        }
    }
    if (bad) {
        tk_st_close(&f);
        return NULL;
    }
    return f;
}

tk_st_file *tk_st_open(const char *path, tk_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        tk_err_set(err, TK_EIO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        tk_err_set(err, TK_EIO, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    void *base = NULL;
    if (len > 0) {
        base = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (base == MAP_FAILED) {
            tk_err_set(err, TK_EIO, "%s: cannot map: %s", path, strerror(errno));
            close(fd);
            return NULL;
        }
    }
    close(fd);
    static const uint8_t empty[1];
    tk_st_file *f = tk_st_parse(base ? base : empty, len, path, err);
    if (!f) {
        if (base) munmap(base, len);
        return NULL;
    }
    f->mapped = base != NULL;
    return f;
}

static float f16_to_f32(uint16_t h) { return tk_f16_to_f32(h); }
static float bf16_to_f32(uint16_t h) { return tk_bf16_to_f32(h); }

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

tk_st_file *tk_st_open_index(const char *index_path, tk_err *err) {
    json_error_t je;
    json_t *root = json_load_file(index_path, 0, &je);
    json_t *map = root ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(map) || json_object_size(map) == 0) {
        tk_err_set(err, TK_EFORMAT, "%s: %s", index_path, root ? "no \"weight_map\" object" : je.text);
        json_decref(root);
        return NULL;
    }
    /* the shards, each once, in name order (model-00001-of-N first) */
    size_t nmap = json_object_size(map);
    char **shards = tk_calloc(nmap, sizeof *shards);
    tk_st_file **fs = tk_calloc(nmap, sizeof *fs);
    size_t *at = tk_calloc(nmap, sizeof *at);
    int ns = 0, ok = shards && fs && at;
    const char *k;
    json_t *v;
    json_object_foreach(map, k, v) {
        const char *sh = json_string_value(v);
        if (!ok) break;
        if (!sh || !*sh || strchr(sh, '/')) {
            tk_err_set(err, TK_EFORMAT, "%s: weight_map[\"%s\"] is not a shard file name", index_path, k);
            ok = 0;
            break;
        }
        int seen = 0;
        for (int i = 0; i < ns && !seen; i++) seen = !strcmp(shards[i], sh);
        if (!seen) shards[ns++] = (char *)sh;
    }
    if (ok) qsort(shards, (size_t)ns, sizeof *shards, cmp_str);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", index_path);
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = 0;
    else dir[0] = 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), total = 0;
    int nent = 0;
    for (int i = 0; ok && i < ns; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s%s", dir, shards[i]);
        if (!(fs[i] = tk_st_open(path, err))) ok = 0;
        else {
            at[i] = total;
            total += (fs[i]->len + page - 1) / page * page;
            nent += fs[i]->n;
        }
    }
    tk_st_file *f = ok ? tk_calloc(1, sizeof *f) : NULL;
    uint8_t *base = MAP_FAILED;
    if (f) {
        f->e = tk_calloc((size_t)(nent > 0 ? nent : 1), sizeof *f->e);
        base = total ? mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
        if (!f->e || base == MAP_FAILED) {
            tk_err_set(err, TK_EIO, "%s: cannot map %zu bytes of shards", index_path, total);
            ok = 0;
        } else {
            f->base = f->data = base;
            f->len = f->data_len = total;
            f->mapped = 1;
        }
    }
    /* each shard's pages at its place in the range, its entries shifted there */
    for (int i = 0; ok && i < ns; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s%s", dir, shards[i]);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        void *p = fd >= 0 ? mmap(base + at[i], fs[i]->len, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) : MAP_FAILED;
        if (fd >= 0) close(fd);
        if (p == MAP_FAILED) {
            tk_err_set(err, TK_EIO, "%s: cannot map: %s", path, strerror(errno));
            ok = 0;
            break;
        }
        uint64_t shift = at[i] + (uint64_t)(fs[i]->data - fs[i]->base);
        for (int j = 0; j < fs[i]->n && ok; j++) {
            tk_st_entry e = fs[i]->e[j];
            if (tk_st_find(f, e.name)) {
                tk_err_set(err, TK_EFORMAT, "%s: tensor '%s' is in two shards (the second: %s)", index_path, e.name,
                           shards[i]);
                ok = 0;
                break;
            }
            e.name = tk_strdup(e.name);
            e.begin += shift;
            e.end += shift;
            if (!e.name) ok = 0;
            else f->e[f->n++] = e;
        }
    }
    /* what the index promises, each shard must hold */
    json_object_foreach(map, k, v) {
        if (!ok) break;
        int i = 0;
        while (i < ns && strcmp(shards[i], json_string_value(v))) i++;
        if (i == ns || !tk_st_find(fs[i], k)) {
            tk_err_set(err, TK_EFORMAT, "%s: tensor '%s' is not in %s, where the index puts it", index_path, k,
                       json_string_value(v));
            ok = 0;
        }
    }
    for (int i = 0; fs && i < ns; i++) tk_st_close(&fs[i]);
    free(fs);
    free(at);
    free(shards);
    json_decref(root);
    if (!ok) tk_st_close(&f);
    return f;
}

tk_status tk_st_read_f32(const tk_st_file *f, const tk_st_entry *e, float *out, tk_err *err) {
    int64_t n = tk_st_numel(e);
    const uint8_t *src = tk_st_data(f, e);
    switch (e->dtype) {
    case TK_ST_F32:
        memcpy(out, src, (size_t)n * 4);
        return TK_OK;
    case TK_ST_F16:
    case TK_ST_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
            out[i] = e->dtype == TK_ST_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        return TK_OK;
    default:
        tk_err_set(err, TK_EFORMAT, "tensor '%s': dtype %s is not a float type (F32, F16, BF16)",
                   e->name, tk_st_dtype_name(e->dtype));
        return TK_EFORMAT;
    }
}

/* ---- writer ---------------------------------------------------------- */

typedef struct wentry {
    char *name;
    tk_st_dtype dtype;
    int ndim;
    int64_t shape[TK_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
} wentry;

struct tk_st_writer {
    wentry *e;
    int n, cap;
    json_t *meta;
};

tk_st_writer *tk_st_writer_new(void) { return tk_calloc(1, sizeof(tk_st_writer)); }

void tk_st_writer_destroy(tk_st_writer **pw) {
    if (!pw || !*pw) return;
    tk_st_writer *w = *pw;
    for (int i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    json_decref(w->meta);
    free(w);
    *pw = NULL;
}

tk_status tk_st_writer_add(tk_st_writer *w, const char *name, tk_st_dtype dt, int ndim,
                           const int64_t *shape, const void *data, tk_err *err) {
    if ((unsigned)dt >= TK_ST_DTYPE_COUNT || ndim < 0 || ndim > TK_ST_MAX_DIMS ||
        strcmp(name, "__metadata__") == 0) {
        tk_err_set(err, TK_EINVAL, "safetensors writer: tensor '%s': bad dtype, dims or name", name);
        return TK_EINVAL;
    }
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0) {
            tk_err_set(err, TK_EINVAL, "safetensors writer: tensor '%s' added twice", name);
            return TK_EINVAL;
        }
    if (w->n == w->cap) {
        int nc = w->cap ? 2 * w->cap : 64;
        wentry *ne = tk_realloc(w->e, (size_t)nc * sizeof *ne);
        if (!ne) {
            tk_err_set(err, TK_ENOMEM, "safetensors writer: out of host memory");
            return TK_ENOMEM;
        }
        w->e = ne;
        w->cap = nc;
    }
    wentry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = tk_strdup(name);
    if (!e->name) {
        tk_err_set(err, TK_ENOMEM, "safetensors writer: out of host memory");
        return TK_ENOMEM;
    }
    e->dtype = dt;
    e->ndim = ndim;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        e->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    e->data = data;
    e->nbytes = numel * st_dtypes[dt].size;
    w->n++;
    return TK_OK;
}

tk_status tk_st_writer_metadata(tk_st_writer *w, const char *key, const char *value, tk_err *err) {
    if (!w->meta) w->meta = json_object();
    if (!w->meta || json_object_set_new(w->meta, key, json_string(value)) != 0) {
        tk_err_set(err, TK_EINVAL, "safetensors writer: metadata '%s' must be UTF-8", key);
        return TK_EINVAL;
    }
    return TK_OK;
}

tk_status tk_write_file_atomic(const char *path, const void *const *parts, const size_t *sizes,
                               int nparts, tk_err *err) {
    size_t plen = strlen(path);
    char *tmp = tk_malloc(plen + 32);
    char *dircopy = tk_strdup(path);
    if (!tmp || !dircopy) {
        free(tmp);
        free(dircopy);
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", path);
        return TK_ENOMEM;
    }
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    tk_status st = TK_OK;
    if (fd < 0) {
        tk_err_set(err, TK_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        st = TK_EIO;
        goto done;
    }
    for (int i = 0; i < nparts && st == TK_OK; i++) {
        const char *p = parts[i];
        size_t left = sizes[i];
        while (left > 0) {
            ssize_t k = write(fd, p, left);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                tk_err_set(err, TK_EIO, "%s: write failed: %s", tmp, strerror(errno));
                st = TK_EIO;
                break;
            }
            p += k;
            left -= (size_t)k;
        }
    }
    if (st == TK_OK && fsync(fd) != 0) {
        tk_err_set(err, TK_EIO, "%s: fsync failed: %s", tmp, strerror(errno));
        st = TK_EIO;
    }
    if (close(fd) != 0 && st == TK_OK) {
        tk_err_set(err, TK_EIO, "%s: close failed: %s", tmp, strerror(errno));
        st = TK_EIO;
    }
    if (st == TK_OK && rename(tmp, path) != 0) {
        tk_err_set(err, TK_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
        st = TK_EIO;
    }
    if (st != TK_OK) {
        unlink(tmp);
    } else {
        /* Make the rename itself durable. */
        int dfd = open(dirname(dircopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
done:
    free(tmp);
    free(dircopy);
    return st;
}

tk_status tk_st_writer_write(tk_st_writer *w, const char *path, tk_err *err) {
    json_t *root = json_object();
    uint64_t off = 0;
    if (!root) goto oom;
    if (w->meta && json_object_set(root, "__metadata__", w->meta) != 0) goto oom;
    for (int i = 0; i < w->n; i++) {
        wentry *e = &w->e[i];
        json_t *o = json_object(), *sh = json_array();
        if (!o || !sh) {
            json_decref(o);
            json_decref(sh);
            goto oom;
        }
        for (int d = 0; d < e->ndim; d++) json_array_append_new(sh, json_integer(e->shape[d]));
        json_object_set_new(o, "dtype", json_string(st_dtypes[e->dtype].name));
        json_object_set_new(o, "shape", sh);
        json_object_set_new(o, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)(off + e->nbytes)));
        if (json_object_set_new(root, e->name, o) != 0) goto oom;
        off += e->nbytes;
    }
    char *js = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    root = NULL;
    if (!js) goto oom;
    size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7;
    char *hdr = tk_malloc(8 + padded);
    if (!hdr) {
        free(js);
        goto oom;
    }
    for (int i = 0; i < 8; i++) hdr[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
    memcpy(hdr + 8, js, jl);
    memset(hdr + 8 + jl, ' ', padded - jl);
    free(js);
    int np = 1 + w->n;
    const void **parts = tk_malloc((size_t)np * sizeof *parts);
    size_t *sizes = tk_malloc((size_t)np * sizeof *sizes);
    tk_status st;
    if (!parts || !sizes) {
        free(parts);
        free(sizes);
        free(hdr);
        goto oom;
    }
    parts[0] = hdr;
    sizes[0] = 8 + padded;
    for (int i = 0; i < w->n; i++) {
        parts[1 + i] = w->e[i].data;
        sizes[1 + i] = w->e[i].nbytes;
    }
    st = tk_write_file_atomic(path, parts, sizes, np, err);
    free(parts);
    free(sizes);
    free(hdr);
    return st;
oom:
    json_decref(root);
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory while building the header", path);
    return TK_ENOMEM;
}

tk_st_file *tk_st_parse_owned(void *buf, size_t len, const char *what, tk_err *err) {
    tk_st_file *f = tk_st_parse(buf, len, what, err);
    if (!f) {
        free(buf);
        return NULL;
    }
    f->owned = 1;
    return f;
}

/* ---- an image from tensors held elsewhere ---- */

tk_st_file *tk_st_image(const tk_st_part *parts, int n, const char *what, tk_err *err) {
    json_t *hdr = json_object();
    uint64_t off = 0;
    for (int i = 0; hdr && i < n; i++) {
        json_t *shape = json_array();
        for (int k = 0; k < parts[i].ndim; k++) json_array_append_new(shape, json_integer(parts[i].shape[k]));
        json_object_set_new(hdr, parts[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", tk_st_dtype_name(parts[i].dtype), "shape",
                                      shape, "data_offsets", (json_int_t)off, (json_int_t)(off + parts[i].nbytes)));
        off += parts[i].nbytes;
    }
    char *h = hdr ? json_dumps(hdr, JSON_COMPACT) : NULL;
    json_decref(hdr);
    size_t hl = h ? strlen(h) : 0, hp = (hl + 7) / 8 * 8;
    uint8_t *buf = h ? tk_malloc(8 + hp + (size_t)off) : NULL;
    if (!buf) {
        free(h);
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory for %llu bytes of tensors", what, (unsigned long long)off);
        return NULL;
    }
    for (int k = 0; k < 8; k++) buf[k] = (uint8_t)((uint64_t)hp >> (8 * k));
    memcpy(buf + 8, h, hl);
    memset(buf + 8 + hl, ' ', hp - hl);
    free(h);
    uint8_t *d = buf + 8 + hp;
    for (int i = 0; i < n; i++) {
        if (parts[i].fill) parts[i].fill(parts[i].ud, d);
        else memcpy(d, parts[i].data, parts[i].nbytes);
        d += parts[i].nbytes;
    }
    return tk_st_parse_owned(buf, 8 + hp + (size_t)off, what, err);
}
