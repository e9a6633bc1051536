/* tk_history.c — execution history persisted per user (see tk_history.h).
 *
 * Queries follow IPython's history_request semantics: tail (last n), range
 * (session, [start, stop)), search (glob pattern, newest first for n and
 * unique, answered in chronological order).
 */
#define _GNU_SOURCE /* memrchr */
#include "tk_history.h"
#include "tk_kernel.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct entry { int session, line; char *input, *output; } entry;

struct tk_history {
    char *path;
    FILE *f;            /* append handle; NULL when memory only */
    int session;
    entry ring[TK_HIST_KEEP];
    size_t count, head; /* head: slot of the next insert */
    size_t bytes;       /* strlen of every kept input and output */
};

static size_t entry_bytes(const entry *e) {
    return (e->input ? strlen(e->input) : 0) + (e->output ? strlen(e->output) : 0);
}

/* i-th oldest entry in memory */
static entry *at(tk_history *h, size_t i) {
    return &h->ring[(h->head + TK_HIST_KEEP - h->count + i) % TK_HIST_KEEP];
}

static void drop_oldest(tk_history *h) {
    entry *e = at(h, 0);
    h->bytes -= entry_bytes(e);
    free(e->input);
    free(e->output);
    e->input = e->output = NULL;
    h->count--;
}

/* Takes ownership of in and out (already cut). */
static void put_owned(tk_history *h, int s, int l, char *in, char *out) {
    if (h->count == TK_HIST_KEEP) drop_oldest(h);
    entry *e = &h->ring[h->head];
    e->session = s;
    e->line = l;
    e->input = in;
    e->output = out;
    h->bytes += entry_bytes(e);
    h->head = (h->head + 1) % TK_HIST_KEEP;
    h->count++;
    while (h->bytes > TK_HIST_MAX_BYTES && h->count > 1) drop_oldest(h);
}

/* A UTF-8 boundary at or before i (never splits a character). */
static size_t back_to_char(const char *t, size_t i) {
    while (i > 0 && ((unsigned char)t[i] & 0xC0) == 0x80) i--;
    return i;
}

char *tk_history_cut(const char *t, size_t len) {
    if (len <= TK_HIST_CELL_MAX) {
        char *c = malloc(len + 1);
        if (c) { memcpy(c, t, len); c[len] = 0; }
        return c;
    }
    /* the first lines: up to TK_HIST_CUT_LINES newlines, at most CUT_SIDE bytes */
    size_t head = 0;
    for (int k = 0; k < TK_HIST_CUT_LINES && head < TK_HIST_CUT_SIDE; k++) {
        const char *nl = memchr(t + head, '\n', TK_HIST_CUT_SIDE - head);
        if (!nl) { head = back_to_char(t, TK_HIST_CUT_SIDE); break; }
        head = (size_t)(nl - t) + 1;
    }
    /* the last lines, the same way from the end (a final newline ends the
     * last line, it does not start one) */
    size_t lim = len - TK_HIST_CUT_SIDE, i = len - (t[len - 1] == '\n');
    for (int k = 0; i > lim; i--)
        if (t[i - 1] == '\n' && ++k == TK_HIST_CUT_LINES) break;
    size_t tail = i;
    while (tail < len && ((unsigned char)t[tail] & 0xC0) == 0x80) tail++;
    size_t lines = 0;
    for (const char *p = t + head; (p = memchr(p, '\n', (size_t)(t + tail - p))); p++) lines++;
    char mark[200];
    int ml = snprintf(mark, sizeof mark, "%s# [txkernel history: %zu of this cell's %zu bytes (about %zu lines) are "
                      "not kept here; the cell ran whole]\n", head && t[head - 1] == '\n' ? "" : "\n",
                      tail - head, len, lines);
    char *c = malloc(head + (size_t)ml + (len - tail) + 1);
    if (!c) return NULL;
    memcpy(c, t, head);
    memcpy(c + head, mark, (size_t)ml);
    memcpy(c + head + ml, t + tail, len - tail);
    c[head + (size_t)ml + (len - tail)] = 0;
    return c;
}

static int put_cut(tk_history *h, int s, int l, const char *in, size_t in_len, const char *out, size_t out_len) {
    char *ci = tk_history_cut(in, in_len);
    char *co = out ? tk_history_cut(out, out_len) : NULL;
    if (!ci || (out && !co)) { free(ci); free(co); return -1; }
    put_owned(h, s, l, ci, co);
    return 0;
}

static void write_entry(FILE *f, const entry *e) {
    json_t *j = json_pack("{s:i,s:i,s:s,s:s?}", "s", e->session, "l", e->line, "i", e->input,
                          "o", e->output);
    if (!j) return;
    char *t = json_dumps(j, JSON_COMPACT);
    if (t) { fputs(t, f); fputc('\n', f); free(t); }
    json_decref(j);
}

static void mkdirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(buf, 0700); *p = '/'; }
}

void tk_history_default_path(char *buf, size_t n) {
    const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(buf, n, "%s/txkernel/history.jsonl", xdg);
    else if (home && *home) snprintf(buf, n, "%s/.local/share/txkernel/history.jsonl", home);
    else if (n) buf[0] = 0;
}

/* ---- start-up: the file's tail, read backwards ------------------------------ */

typedef struct tail_load {
    entry *e;           /* newest first */
    size_t n, bytes;    /* entries and their bytes, as memory keeps them */
    size_t file_bytes;  /* bytes of the file lines they came from */
    size_t skipped;     /* lines over TK_HIST_LINE_MAX */
    size_t cut;         /* lines kept cut (an older kernel wrote them whole) */
    int max_session, full;
} tail_load;

/* One line of the file (without its newline). */
static void load_line(tail_load *L, const char *t, size_t len) {
    if (!len) return;
    json_t *j = json_loadb(t, len, 0, NULL);
    json_t *s = json_object_get(j, "s"), *l = json_object_get(j, "l");
    json_t *i = json_object_get(j, "i"), *o = json_object_get(j, "o");
    if (json_is_integer(s) && json_is_integer(l) && json_is_string(i)) {
        int si = (int)json_integer_value(s);
        if (si > L->max_session) L->max_session = si;
        entry *e = &L->e[L->n];
        e->session = si;
        e->line = (int)json_integer_value(l);
        e->input = tk_history_cut(json_string_value(i), json_string_length(i));
        e->output = json_is_string(o) ? tk_history_cut(json_string_value(o), json_string_length(o)) : NULL;
        if (json_string_length(i) > TK_HIST_CELL_MAX || (json_is_string(o) && json_string_length(o) > TK_HIST_CELL_MAX))
            L->cut++;
        if (e->input && (e->output || !json_is_string(o))) {
            L->n++;
            L->bytes += entry_bytes(e);
            L->file_bytes += len + 1;
            if (L->n == TK_HIST_KEEP || L->bytes >= TK_HIST_MAX_BYTES) L->full = 1;
        } else {
            free(e->input);
            free(e->output);
        }
    }
    json_decref(j);
}

/* The start of a line too long to read: its session, for the numbering. */
static void skipped_line(tail_load *L, const char *t, size_t len) {
    int s;
    char buf[32];
    size_t k = len < sizeof buf - 1 ? len : sizeof buf - 1;
    memcpy(buf, t, k);
    buf[k] = 0;
    if (sscanf(buf, "{\"s\":%d", &s) == 1 && s > L->max_session) L->max_session = s;
    L->skipped++;
}

/* Reads fd (size bytes) backwards in blocks: each complete line, newest
 * first, until memory is full, the file's start, or TK_HIST_SCAN_MAX bytes
 * read. The part of a line not yet complete is carried to the next (earlier)
 * block, up to TK_HIST_LINE_MAX; a longer line is skipped. Returns 0, or -1
 * when memory for the read runs out. */
static int load_tail(tail_load *L, int fd, size_t size) {
    const size_t B = (size_t)1 << 20;
    char *buf = NULL;
    size_t cap = 0, carry = 0, scanned = 0, off = size;
    int skipping = 0, rc = 0;
    while (off > 0 && !L->full && scanned < TK_HIST_SCAN_MAX) {
        size_t want = off >= B ? B : off;
        off -= want;
        scanned += want;
        if (want + carry > cap) {
            size_t ncap = want + carry;
            char *nb = malloc(ncap);
            if (!nb) { rc = -1; break; }
            if (carry) memcpy(nb + want, buf, carry);
            free(buf);
            buf = nb;
            cap = ncap;
        } else if (carry) {
            memmove(buf + want, buf, carry);
        }
        size_t got = 0;
        while (got < want) {
            ssize_t r = pread(fd, buf + got, want - got, (off_t)(off + got));
            if (r <= 0) break;
            got += (size_t)r;
        }
        if (got < want) { rc = 0; break; } /* the file shrank under us: keep what was read */
        size_t end = want + carry;
        const char *nl;
        /* the carried part holds no newline: look for one in the new block */
        while (!L->full && end > 0 && (nl = memrchr(buf, '\n', end < want ? end : want))) {
            size_t q = (size_t)(nl - buf);
            if (skipping) skipped_line(L, buf + q + 1, end - q - 1);
            else load_line(L, buf + q + 1, end - q - 1);
            skipping = 0;
            end = q;
        }
        if (L->full) break;
        if (off == 0) { /* the file's first line */
            if (skipping) skipped_line(L, buf, end);
            else load_line(L, buf, end);
            end = 0;
        }
        if (end > TK_HIST_LINE_MAX) skipping = 1;
        carry = skipping ? 0 : end; /* buf[0, end) is the end of a line whose start is earlier */
    }
    free(buf);
    return rc;
}

tk_history *tk_history_open(const char *path) {
    tk_history *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    int max_session = 0;
    if (path && *path) {
        h->path = strdup(path);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0) {
            tail_load L = {0};
            L.e = calloc(TK_HIST_KEEP, sizeof *L.e);
            if (L.e) {
                if (load_tail(&L, fd, (size_t)st.st_size))
                    fprintf(stderr, "txkernel: out of memory reading the history file %s; older entries not loaded\n", path);
                for (size_t k = L.n; k-- > 0;) put_owned(h, L.e[k].session, L.e[k].line, L.e[k].input, L.e[k].output);
                max_session = L.max_session;
                if (L.skipped)
                    fprintf(stderr, "txkernel: history file %s: %zu line%s over %zu bytes (whole cells an older kernel "
                            "kept) skipped\n", path, L.skipped, L.skipped == 1 ? "" : "s", (size_t)TK_HIST_LINE_MAX);
                /* compact to what memory holds when the file is over four times
                 * it, or holds whole cells that memory keeps cut */
                if (L.skipped || L.cut || (size_t)st.st_size > 4 * L.file_bytes + ((size_t)1 << 20) ||
                    (L.full && (size_t)st.st_size > 4 * L.file_bytes)) {
                    char tmp[4200];
                    snprintf(tmp, sizeof tmp, "%s.tmp", path);
                    FILE *w = fopen(tmp, "w");
                    if (w) {
                        for (size_t k = 0; k < h->count; k++) write_entry(w, at(h, k));
                        if (fclose(w) == 0) rename(tmp, path);
                    }
                }
                free(L.e);
            }
        }
        if (fd >= 0) close(fd);
        mkdirs(path);
        h->f = fopen(path, "a");
        if (!h->f)
            fprintf(stderr, "txkernel: history file %s cannot be opened (%s); history kept in memory only\n",
                    path, strerror(errno));
    }
    h->session = max_session + 1;
    return h;
}

void tk_history_close(tk_history **ph) {
    if (!ph || !*ph) return;
    tk_history *h = *ph;
    if (h->f) fclose(h->f);
    for (size_t i = 0; i < TK_HIST_KEEP; i++) { free(h->ring[i].input); free(h->ring[i].output); }
    free(h->path);
    free(h);
    *ph = NULL;
}

int tk_history_session(const tk_history *h) { return h->session; }
size_t tk_history_count(const tk_history *h) { return h->count; }
size_t tk_history_bytes(const tk_history *h) { return h->bytes; }

void tk_history_add(tk_history *h, int line, const char *input, const char *output) {
    if (put_cut(h, h->session, line, input, strlen(input), output, output ? strlen(output) : 0)) {
        fprintf(stderr, "txkernel: out of memory keeping cell %d in history\n", line);
        return;
    }
    if (h->f) {
        write_entry(h->f, at(h, h->count - 1));
        fflush(h->f);
    }
}

static json_t *item(const entry *e, int output) {
    if (output)
        return json_pack("[i,i,[s,s?]]", e->session, e->line, e->input, e->output);
    return json_pack("[i,i,s]", e->session, e->line, e->input);
}

static int get_int(json_t *c, const char *k, int dflt, int *ok) {
    json_t *v = json_object_get(c, k);
    if (!v || json_is_null(v)) return dflt;
    if (!json_is_integer(v)) { *ok = 0; return dflt; }
    return (int)json_integer_value(v);
}

json_t *tk_history_query(tk_history *h, json_t *content, const char **why) {
    int ok = 1;
    const char *type = json_string_value(json_object_get(content, "hist_access_type"));
    int output = json_is_true(json_object_get(content, "output"));
    json_t *out = json_array();
    if (!type) { *why = "content.hist_access_type must be \"tail\", \"range\" or \"search\""; goto bad; }
    if (!strcmp(type, "tail")) {
        int n = get_int(content, "n", 10, &ok);
        if (!ok || n < 0) { *why = "content.n must be a non-negative integer"; goto bad; }
        size_t first = (size_t)n >= h->count ? 0 : h->count - (size_t)n;
        for (size_t i = first; i < h->count; i++) json_array_append_new(out, item(at(h, i), output));
    } else if (!strcmp(type, "range")) {
        int s = get_int(content, "session", 0, &ok);
        int start = get_int(content, "start", 0, &ok);
        int stop = get_int(content, "stop", 0, &ok);
        if (!ok) { *why = "content.session, start and stop must be integers"; goto bad; }
        if (s <= 0) s += h->session; /* 0 = this session, -1 = the one before */
        for (size_t i = 0; i < h->count; i++) {
            entry *e = at(h, i);
            if (e->session == s && e->line >= start && (stop <= 0 || e->line < stop))
                json_array_append_new(out, item(e, output));
        }
    } else if (!strcmp(type, "search")) {
        const char *pat = json_string_value(json_object_get(content, "pattern"));
        int n = get_int(content, "n", 0, &ok);
        int unique = json_is_true(json_object_get(content, "unique"));
        if (!pat || !ok) { *why = "content.pattern must be a string and content.n an integer"; goto bad; }
        json_t *rev = json_array(); /* newest first */
        for (size_t k = h->count; k-- > 0 && (n <= 0 || json_array_size(rev) < (size_t)n);) {
            entry *e = at(h, k);
            if (fnmatch(pat, e->input, 0) != 0) continue;
            if (unique) {
                int dup = 0;
                for (size_t j = 0; j < json_array_size(rev) && !dup; j++) {
                    json_t *it = json_array_get(rev, j);
                    json_t *in = json_array_get(it, 2);
                    if (json_is_array(in)) in = json_array_get(in, 0);
                    dup = !strcmp(json_string_value(in), e->input);
                }
                if (dup) continue;
            }
            json_array_append_new(rev, item(e, output));
        }
        for (size_t j = json_array_size(rev); j-- > 0;) json_array_append(out, json_array_get(rev, j));
        json_decref(rev);
    } else {
        *why = "content.hist_access_type must be \"tail\", \"range\" or \"search\"";
        goto bad;
    }
    return out;
bad:
    json_decref(out);
    return NULL;
}
