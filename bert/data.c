/* data.c — CSV/TSV/JSONL readers, classification datasets, features,
 * batching and length statistics (see tk_data.h).
 *
 * Guarantees: every reader error names the file (basename), and the line and
 * column where it applies; nothing exits; every failure path frees what it
 * made. Splits and shuffles use tk_rand_next (splitmix64) only, so a seed
 * gives the same result on every machine and C library.
 */
#include "tk_data_internal.h"
#include "tk_host_mem.h"
#include "tk_ops_spec.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t tk_rand_next(uint64_t *s) { return tk_spec_splitmix64(s); }

void tk_shuffle_i32(int32_t *a, int n, uint64_t *rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(tk_rand_next(rng) % (uint64_t)(i + 1));
        int32_t t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

static const char *base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

/* Reads a whole file (NUL-terminated copy; *len excludes the NUL). */
static char *read_file(const char *path, size_t *len, tk_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) { tk_err_set(err, TK_EIO, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = tk_malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        char *nb = tk_realloc(buf, cap + 1);
        if (!nb) { free(buf); buf = NULL; }
        else buf = nb;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf) { tk_err_set(err, TK_ENOMEM, "%s: out of host memory", path); return NULL; }
    if (bad) { free(buf); tk_err_set(err, TK_EIO, "%s: read error", path); return NULL; }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---- tables --------------------------------------------------------- */

void tk_table_destroy(tk_table **p) {
    if (!p || !*p) return;
    tk_table *t = *p;
    for (int i = 0; i < t->ncols; i++) free(t->cols[i]);
    for (long i = 0; i < (long)t->nrows * t->ncols; i++) free(t->cells[i]);
    free(t->cols); free(t->cells); free(t->line); free(t);
    *p = NULL;
}

int tk_table_col(const tk_table *t, const char *name) {
    for (int i = 0; i < t->ncols; i++)
        if (strcmp(t->cols[i], name) == 0) return i;
    return -1;
}

/* growable list of strings */
typedef struct { char **v; int n, cap; } strv;
static int strv_push(strv *s, char *x) {
    if (!x) return -1;
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 16;
        char **nv = tk_realloc(s->v, sizeof(char *) * (size_t)cap);
        if (!nv) { free(x); return -1; }
        s->v = nv;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}
static void strv_free(strv *s) {
    for (int i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}
static char *dupn(const char *s, size_t n) {
    char *p = tk_malloc(n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

/* 1-based character column of byte `pos` in its line starting at `ls`. */
static int char_col(const char *buf, size_t ls, size_t pos) {
    int c = 1;
    for (size_t i = ls; i < pos; i++) c += ((uint8_t)buf[i] & 0xC0) != 0x80;
    return c;
}

tk_status tk_csv_parse(const char *buf, size_t len, char delim, const char *name, tk_table **out,
                       tk_err *err) {
    *out = NULL;
    strv cells = {0};
    int32_t *lines = NULL;
    int nrec = 0, lcap = 0, ncols = -1;
    char *fb = tk_malloc(len + 1); /* field buffer: a field is never longer than the input */
    if (!fb) goto oom;
    size_t i = 0;
    int line = 1;
    size_t ls = 0; /* start of the current line */
    if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) i = ls = 3;
    while (i < len) {
        /* one record */
        int rec_line = line, nf = 0;
        if (buf[i] == '\n' || buf[i] == '\r') { /* blank line */
            if (buf[i] == '\r' && i + 1 < len && buf[i + 1] == '\n') i++;
            i++; line++; ls = i;
            continue;
        }
        for (;;) {
            size_t fl = 0;
            if (i < len && buf[i] == '"') {
                size_t qpos = i;
                int qline = line;
                size_t qls = ls;
                i++;
                for (;;) {
                    if (i >= len) {
                        free(fb); strv_free(&cells); free(lines);
                        tk_err_set(err, TK_EFORMAT, "%s:%d:%d: unterminated quoted field (a quote opens here "
                                   "and never closes)", name, qline, char_col(buf, qls, qpos));
                        return TK_EFORMAT;
                    }
                    char c = buf[i];
                    if (c == '"') {
                        if (i + 1 < len && buf[i + 1] == '"') { fb[fl++] = '"'; i += 2; continue; }
                        i++;
                        break;
                    }
                    if (c == '\n') { line++; ls = i + 1; }
                    fb[fl++] = c;
                    i++;
                }
                if (i < len && buf[i] != delim && buf[i] != '\n' && buf[i] != '\r') {
                    free(fb); strv_free(&cells); free(lines);
                    tk_err_set(err, TK_EFORMAT, "%s:%d:%d: unexpected '%c' after a closing quote (inside a "
                               "quoted field write a quote as \"\")", name, line, char_col(buf, ls, i), buf[i]);
                    return TK_EFORMAT;
                }
            } else {
                while (i < len && buf[i] != delim && buf[i] != '\n' && buf[i] != '\r') {
                    if (buf[i] == '"') {
                        free(fb); strv_free(&cells); free(lines);
                        tk_err_set(err, TK_EFORMAT, "%s:%d:%d: quote inside an unquoted field (quote the whole "
                                   "field and write inner quotes as \"\")", name, line, char_col(buf, ls, i));
                        return TK_EFORMAT;
                    }
                    fb[fl++] = buf[i++];
                }
            }
            if (strv_push(&cells, dupn(fb, fl)) != 0) goto oom;
            nf++;
            if (i < len && buf[i] == delim) { i++; continue; }
            /* end of record */
            if (i < len && buf[i] == '\r') i++;
            if (i < len && buf[i] == '\n') i++;
            line++;
            ls = i;
            break;
        }
        if (ncols < 0) ncols = nf;
        else if (nf != ncols) {
            free(fb); strv_free(&cells); free(lines);
            tk_err_set(err, TK_EFORMAT, "%s:%d: %d field%s, the header has %d (quote fields that contain '%s')",
                       name, rec_line, nf, nf == 1 ? "" : "s", ncols, delim == '\t' ? "\\t" : ",");
            return TK_EFORMAT;
        }
        if (nrec == lcap) {
            lcap = lcap ? lcap * 2 : 256;
            int32_t *nl = tk_realloc(lines, sizeof(int32_t) * (size_t)lcap);
            if (!nl) goto oom;
            lines = nl;
        }
        lines[nrec++] = rec_line;
    }
    free(fb);
    fb = NULL;
    if (ncols < 0) {
        strv_free(&cells); free(lines);
        tk_err_set(err, TK_EFORMAT, "%s: empty file (no header line)", name);
        return TK_EFORMAT;
    }
    tk_table *t = tk_calloc(1, sizeof *t);
    if (!t) goto oom;
    t->ncols = ncols;
    t->nrows = nrec - 1;
    /* header and rows were parsed into one list; the table keeps them apart */
    t->cols = tk_malloc(sizeof(char *) * (size_t)ncols);
    t->cells = tk_malloc(sizeof(char *) * (size_t)(t->nrows ? (long)t->nrows * ncols : 1));
    t->line = tk_malloc(sizeof(int) * (size_t)(t->nrows ? t->nrows : 1));
    if (!t->cols || !t->cells || !t->line) {
        free(t->cols); free(t->cells); free(t->line); free(t);
        goto oom;
    }
    memcpy(t->cols, cells.v, sizeof(char *) * (size_t)ncols);
    memcpy(t->cells, cells.v + ncols, sizeof(char *) * (size_t)((long)t->nrows * ncols));
    for (int r = 0; r < t->nrows; r++) t->line[r] = lines[r + 1];
    free(cells.v);
    free(lines);
    snprintf(t->name, sizeof t->name, "%s", name);
    *out = t;
    return TK_OK;
oom:
    free(fb); strv_free(&cells); free(lines);
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory", name);
    return TK_ENOMEM;
}

tk_status tk_jsonl_parse(const char *buf, size_t len, const char *name, tk_table **out, tk_err *err) {
    *out = NULL;
    strv cols = {0}, cells = {0};  /* cells grow by rows; a row is filled per line */
    int32_t *lines = NULL;
    int nrows = 0;
    json_t **objs = NULL;
    int nobj = 0, ocap = 0;
    tk_status st = TK_OK;
    size_t i = 0;
    int line = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && buf[j] != '\n') j++;
        line++;
        size_t e = j;
        while (e > i && (buf[e - 1] == '\r' || isspace((unsigned char)buf[e - 1]))) e--;
        size_t s = i;
        while (s < e && isspace((unsigned char)buf[s])) s++;
        i = j + 1;
        if (s == e) continue;
        json_error_t je;
        json_t *o = json_loadb(buf + s, e - s, JSON_REJECT_DUPLICATES, &je);
        if (!o) {
            tk_err_set(err, TK_EFORMAT, "%s:%d:%d: invalid JSON: %s", name, line, je.column > 0 ? je.column : 1, je.text);
            st = TK_EFORMAT;
            goto done;
        }
        if (!json_is_object(o)) {
            json_decref(o);
            tk_err_set(err, TK_EFORMAT, "%s:%d:1: each line must be a JSON object ({\"text\": ..., \"label\": ...})",
                       name, line);
            st = TK_EFORMAT;
            goto done;
        }
        const char *k;
        json_t *v;
        json_object_foreach(o, k, v) {
            int found = 0;
            for (int c = 0; c < cols.n && !found; c++) found = strcmp(cols.v[c], k) == 0;
            if (!found && strv_push(&cols, tk_strdup(k)) != 0) { json_decref(o); goto oom; }
        }
        if (nobj == ocap) {
            ocap = ocap ? ocap * 2 : 256;
            json_t **no = tk_realloc(objs, sizeof(json_t *) * (size_t)ocap);
            int32_t *nl = tk_realloc(lines, sizeof(int32_t) * (size_t)ocap);
            if (no) objs = no;
            if (nl) lines = nl;
            if (!no || !nl) { json_decref(o); goto oom; }
        }
        objs[nobj] = o;
        lines[nobj++] = line;
    }
    if (cols.n == 0) {
        tk_err_set(err, TK_EFORMAT, "%s: no examples (empty file)", name);
        st = TK_EFORMAT;
        goto done;
    }
    for (int r = 0; r < nobj; r++) {
        for (int c = 0; c < cols.n; c++) {
            json_t *v = json_object_get(objs[r], cols.v[c]);
            char *x;
            if (!v || json_is_null(v)) x = tk_strdup("");
            else if (json_is_string(v)) x = dupn(json_string_value(v), json_string_length(v));
            else x = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            if (strv_push(&cells, x) != 0) goto oom;
        }
        nrows++;
    }
    tk_table *t = tk_calloc(1, sizeof *t);
    if (!t) goto oom;
    t->ncols = cols.n;
    t->nrows = nrows;
    t->cols = cols.v;
    t->cells = cells.v ? cells.v : tk_calloc(1, sizeof(char *));
    t->line = lines;
    lines = NULL;
    memset(&cols, 0, sizeof cols);
    memset(&cells, 0, sizeof cells);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!t->cells) { tk_table_destroy(&t); goto oom; }
    *out = t;
    goto done;
oom:
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory", name);
    st = TK_ENOMEM;
done:
    for (int r = 0; r < nobj; r++) json_decref(objs[r]);
    free(objs);
    free(lines);
    strv_free(&cols);
    strv_free(&cells);
    return st;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcasecmp(s + a - b, suf) == 0;
}

tk_status tk_table_read(const char *path, tk_table **out, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    *out = NULL;
    const char *name = base_name(path);
    int kind = ends_with(path, ".csv") ? 1 : (ends_with(path, ".tsv") || ends_with(path, ".tab")) ? 2
             : (ends_with(path, ".jsonl") || ends_with(path, ".json") || ends_with(path, ".ndjson")) ? 3 : 0;
    if (!kind) {
        tk_err_set(err, TK_EINVAL, "%s: unknown data format (use .csv, .tsv or .jsonl)", path);
        return TK_EINVAL;
    }
    size_t len;
    char *buf = read_file(path, &len, err);
    if (!buf) return err->status;
    tk_status st = kind == 3 ? tk_jsonl_parse(buf, len, name, out, err)
                             : tk_csv_parse(buf, len, kind == 1 ? ',' : '\t', name, out, err);
    free(buf);
    return st;
}

/* ---- datasets ------------------------------------------------------ */

void tk_dataset_destroy(tk_dataset **p) {
    if (!p || !*p) return;
    tk_dataset *d = *p;
    for (int i = 0; i < d->n; i++) {
        free(d->text[i]);
        if (d->text_pair) free(d->text_pair[i]);
        if (d->label_str) free(d->label_str[i]);
    }
    for (int i = 0; i < d->num_labels; i++) free(d->labels[i]);
    free(d->text); free(d->text_pair); free(d->label_str); free(d->label);
    free(d->line); free(d->labels); free(d);
    *p = NULL;
}

static int lev(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int c = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int m = d[i - 1][j - 1] + c;
            if (d[i - 1][j] + 1 < m) m = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < m) m = d[i][j - 1] + 1;
            d[i][j] = m;
        }
    return d[la][lb];
}

/* The column named `col` (the config's `key`), or -1 with an error naming
 * the file, the column, the columns it has and the key to set. TK_EFORMAT:
 * the file is not shaped as the config says, a data error like its bad
 * rows. */
static int need_col(const tk_table *t, const char *col, const char *what, const char *key, tk_err *err) {
    int c = tk_table_col(t, col);
    if (c >= 0) return c;
    char list[512] = "";
    size_t used = 0;
    int best = -1, bd = 1 << 30;
    for (int i = 0; i < t->ncols; i++) {
        int n = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", t->cols[i]);
        if (n > 0 && used + (size_t)n < sizeof list) used += (size_t)n;
        int d = lev(col, t->cols[i]);
        if (d < bd) { bd = d; best = i; }
    }
    int lim = (int)strlen(col) / 3 > 2 ? (int)strlen(col) / 3 : 2;
    if (best >= 0 && bd <= lim)
        tk_err_set(err, TK_EFORMAT, "%s: no column '%s' for %s (columns: %s; did you mean '%s'? set %s: %s)",
                   t->name, col, what, list, t->cols[best], key, t->cols[best]);
    else
        tk_err_set(err, TK_EFORMAT, "%s: no column '%s' for %s (columns: %s; set %s: to one of them)", t->name, col,
                   what, list, key);
    return -1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted unique labels of ds into ds->labels and indices into ds->label. */
static tk_status build_labels(tk_dataset *d, tk_err *err) {
    char **tmp = tk_malloc(sizeof(char *) * (size_t)d->n);
    if (!tmp) goto oom;
    memcpy(tmp, d->label_str, sizeof(char *) * (size_t)d->n);
    qsort(tmp, (size_t)d->n, sizeof(char *), cmp_str);
    int u = 0;
    for (int i = 0; i < d->n; i++)
        if (u == 0 || strcmp(tmp[u - 1], tmp[i]) != 0) tmp[u++] = tmp[i];
    d->labels = tk_calloc((size_t)u, sizeof(char *));
    if (!d->labels) { free(tmp); goto oom; }
    for (int i = 0; i < u; i++) {
        d->labels[i] = tk_strdup(tmp[i]);
        if (!d->labels[i]) { d->num_labels = i; free(tmp); goto oom; }
    }
    d->num_labels = u;
    free(tmp);
    return tk_dataset_use_labels(d, d->labels, d->num_labels, err);
oom:
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory", d->name);
    return TK_ENOMEM;
}

tk_status tk_dataset_from_table(const tk_table *t, const tk_data_cols *cols, tk_dataset **out,
                                tk_err *err) {
    *out = NULL;
    const char *tc = cols && cols->text && *cols->text ? cols->text : "text";
    const char *pc = cols && cols->text_pair && *cols->text_pair ? cols->text_pair : NULL;
    const char *lc = cols && cols->label && *cols->label ? cols->label : "label";
    int ct = need_col(t, tc, "the text", "text_col", err);
    if (ct < 0) return TK_EFORMAT;
    int cp = -1;
    if (pc && (cp = need_col(t, pc, "the text pair", "text_pair_col", err)) < 0) return TK_EFORMAT;
    int unlabelled = cols && cols->label_optional && tk_table_col(t, lc) < 0;
    int cl = unlabelled ? -1 : need_col(t, lc, "the label", "label_col", err);
    if (cl < 0 && !unlabelled) return TK_EFORMAT;
    if (t->nrows == 0) {
        tk_err_set(err, TK_EINVAL, "%s: no examples (only a header)", t->name);
        return TK_EINVAL;
    }
    tk_dataset *d = tk_calloc(1, sizeof *d);
    if (!d) goto oom;
    snprintf(d->name, sizeof d->name, "%s", t->name);
    size_t n = (size_t)t->nrows;
    d->text = tk_calloc(n, sizeof(char *));
    d->text_pair = cp >= 0 ? tk_calloc(n, sizeof(char *)) : NULL;
    d->label_str = tk_calloc(n, sizeof(char *));
    d->label = tk_malloc(sizeof(int32_t) * n);
    d->line = tk_malloc(sizeof(int32_t) * n);
    if (!d->text || (cp >= 0 && !d->text_pair) || !d->label_str || !d->label || !d->line) goto oom_d;
    for (int r = 0; r < t->nrows; r++) {
        char *const *row = t->cells + (long)r * t->ncols;
        if (cl >= 0 && !row[cl][0]) {
            int line = t->line[r];
            d->n = r;
            tk_dataset_destroy(&d);
            tk_err_set(err, TK_EFORMAT, "%s:%d: empty label in column '%s'", t->name, line, lc);
            return TK_EFORMAT;
        }
        d->n = r + 1;
        d->text[r] = tk_strdup(row[ct]);
        if (cp >= 0) d->text_pair[r] = tk_strdup(row[cp]);
        d->label_str[r] = tk_strdup(cl >= 0 ? row[cl] : "");
        d->line[r] = t->line[r];
        if (!d->text[r] || (cp >= 0 && !d->text_pair[r]) || !d->label_str[r]) goto oom_d;
    }
    if (cl < 0) { /* unlabelled: no label set, every label -1 */
        for (int r = 0; r < d->n; r++) d->label[r] = -1;
        *out = d;
        return TK_OK;
    }
    tk_status st = build_labels(d, err);
    if (st != TK_OK) { tk_dataset_destroy(&d); return st; }
    *out = d;
    return TK_OK;
oom_d:
    tk_dataset_destroy(&d);
oom:
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory", t->name);
    return TK_ENOMEM;
}

tk_status tk_dataset_load(const char *path, const tk_data_cols *cols, tk_dataset **out, tk_err *err) {
    tk_table *t = NULL;
    *out = NULL;
    tk_status st = tk_table_read(path, &t, err);
    if (st != TK_OK) return st;
    st = tk_dataset_from_table(t, cols, out, err);
    tk_table_destroy(&t);
    return st;
}

tk_status tk_dataset_use_labels(tk_dataset *d, char *const *labels, int num_labels, tk_err *err) {
    for (int i = 0; i < d->n; i++) {
        char *key = d->label_str[i];
        char *const *hit = bsearch(&key, labels, (size_t)num_labels, sizeof(char *), cmp_str);
        if (!hit) {
            char list[400] = "";
            size_t used = 0;
            for (int k = 0; k < num_labels; k++) {
                int m = snprintf(list + used, sizeof list - used, "%s%s", k ? ", " : "", labels[k]);
                if (m < 0 || used + (size_t)m >= sizeof list) break;
                used += (size_t)m;
            }
            tk_err_set(err, TK_EINVAL, "%s:%d: unknown label '%s' (train labels: %s)", d->name, d->line[i], key, list);
            return TK_EINVAL;
        }
        d->label[i] = (int32_t)(hit - labels);
    }
    if (labels == d->labels) return TK_OK;
    char **nl = tk_calloc((size_t)num_labels, sizeof(char *));
    if (!nl) goto oom;
    for (int k = 0; k < num_labels; k++)
        if (!(nl[k] = tk_strdup(labels[k]))) {
            for (int j = 0; j < k; j++) free(nl[j]);
            free(nl);
            goto oom;
        }
    for (int k = 0; k < d->num_labels; k++) free(d->labels[k]);
    free(d->labels);
    d->labels = nl;
    d->num_labels = num_labels;
    return TK_OK;
oom:
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory", d->name);
    return TK_ENOMEM;
}

/* New dataset with the rows idx[0..n) of src (copies strings and labels). */
static tk_dataset *subset(const tk_dataset *s, const int32_t *idx, int n) {
    tk_dataset *d = tk_calloc(1, sizeof *d);
    if (!d) return NULL;
    memcpy(d->name, s->name, sizeof d->name);
    d->text = tk_calloc((size_t)n, sizeof(char *));
    d->text_pair = s->text_pair ? tk_calloc((size_t)n, sizeof(char *)) : NULL;
    d->label_str = tk_calloc((size_t)n, sizeof(char *));
    d->label = tk_malloc(sizeof(int32_t) * (size_t)n);
    d->line = tk_malloc(sizeof(int32_t) * (size_t)n);
    d->labels = tk_calloc((size_t)s->num_labels, sizeof(char *));
    if (!d->text || (s->text_pair && !d->text_pair) || !d->label_str || !d->label || !d->line || !d->labels) {
        tk_dataset_destroy(&d);
        return NULL;
    }
    for (int k = 0; k < s->num_labels; k++, d->num_labels++)
        if (!(d->labels[k] = tk_strdup(s->labels[k]))) { tk_dataset_destroy(&d); return NULL; }
    for (int i = 0; i < n; i++) {
        int r = idx[i];
        d->n = i + 1;
        d->text[i] = tk_strdup(s->text[r]);
        if (s->text_pair) d->text_pair[i] = tk_strdup(s->text_pair[r]);
        d->label_str[i] = tk_strdup(s->label_str[r]);
        d->label[i] = s->label[r];
        d->line[i] = s->line[r];
        if (!d->text[i] || (s->text_pair && !d->text_pair[i]) || !d->label_str[i]) { tk_dataset_destroy(&d); return NULL; }
    }
    return d;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

tk_status tk_dataset_split(const tk_dataset *all, double f, uint64_t seed, tk_dataset **train,
                           tk_dataset **dev, tk_err *err) {
    *train = *dev = NULL;
    int ndev = (int)(all->n * f + 0.5);
    if (!(f > 0 && f < 1) || ndev < 1 || ndev >= all->n) {
        tk_err_set(err, TK_EINVAL, "%s: dev_split %g of %d examples leaves an empty %s set", all->name, f, all->n,
                   ndev < 1 ? "dev" : "train");
        return TK_EINVAL;
    }
    int32_t *idx = tk_malloc(sizeof(int32_t) * (size_t)all->n);
    if (!idx) goto oom;
    for (int i = 0; i < all->n; i++) idx[i] = i;
    uint64_t rng = seed;
    tk_shuffle_i32(idx, all->n, &rng);
    /* each side keeps file order, so a split reads like the file */
    qsort(idx, (size_t)ndev, sizeof(int32_t), cmp_i32);
    qsort(idx + ndev, (size_t)(all->n - ndev), sizeof(int32_t), cmp_i32);
    *dev = subset(all, idx, ndev);
    *train = subset(all, idx + ndev, all->n - ndev);
    free(idx);
    if (!*dev || !*train) { tk_dataset_destroy(dev); tk_dataset_destroy(train); goto oom; }
    return TK_OK;
oom:
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory", all->name);
    return TK_ENOMEM;
}
