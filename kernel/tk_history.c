/* tk_history.c — execution history persisted per user (see tk_history.h).
 *
 * Queries follow IPython's history_request semantics: tail (last n), range
 * (session, [start, stop)), search (glob pattern, newest first for n and
 * unique, answered in chronological order).
 */
#include "tk_history.h"
#include "tk_kernel.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct entry { int session, line; char *input, *output; } entry;

struct tk_history {
    char *path;
    FILE *f;            /* append handle; NULL when memory only */
    int session;
    entry ring[TK_HIST_KEEP];
    size_t count, head; /* head: slot of the next insert */
    size_t file_lines;
};

static void put(tk_history *h, int s, int l, const char *in, const char *out) {
    entry *e = &h->ring[h->head];
    free(e->input);
    free(e->output);
    e->session = s;
    e->line = l;
    e->input = strdup(in);
    e->output = out ? strdup(out) : NULL;
    h->head = (h->head + 1) % TK_HIST_KEEP;
    if (h->count < TK_HIST_KEEP) h->count++;
}

/* i-th oldest entry in memory */
static entry *at(tk_history *h, size_t i) {
    return &h->ring[(h->head + TK_HIST_KEEP - h->count + i) % TK_HIST_KEEP];
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

tk_history *tk_history_open(const char *path) {
    tk_history *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    int max_session = 0;
    if (path && *path) {
        h->path = strdup(path);
        FILE *r = fopen(path, "r");
        if (r) {
            char *line = NULL;
            size_t cap = 0;
            while (getline(&line, &cap, r) > 0) {
                json_t *j = json_loads(line, 0, NULL);
                json_t *s = json_object_get(j, "s"), *l = json_object_get(j, "l");
                json_t *i = json_object_get(j, "i"), *o = json_object_get(j, "o");
                if (json_is_integer(s) && json_is_integer(l) && json_is_string(i)) {
                    int si = (int)json_integer_value(s);
                    if (si > max_session) max_session = si;
                    put(h, si, (int)json_integer_value(l), json_string_value(i),
                        json_is_string(o) ? json_string_value(o) : NULL);
                    h->file_lines++;
                }
                json_decref(j);
            }
            free(line);
            fclose(r);
        }
        mkdirs(path);
        if (h->file_lines > 4 * TK_HIST_KEEP) { /* compact to what memory holds */
            char tmp[4200];
            snprintf(tmp, sizeof tmp, "%s.tmp", path);
            FILE *w = fopen(tmp, "w");
            if (w) {
                for (size_t k = 0; k < h->count; k++) write_entry(w, at(h, k));
                if (fclose(w) == 0) rename(tmp, path);
            }
        }
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

void tk_history_add(tk_history *h, int line, const char *input, const char *output) {
    put(h, h->session, line, input, output);
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
