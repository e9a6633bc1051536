/* tk_magics.c — the magic registry and the interpreter that runs cells through
 * it (cell grammar in tk_magics.h).
 *
 * A line starting with `!` runs the `system` magic (magics/shell.c) on the
 * rest of the line, as IPython does.
 *
 * Guarantees: every cell either runs its magics in order or reports exactly one
 * error through the sink (unknown magic with the closest known name, a cell
 * magic used as a line magic, text that is not a magic); the first failing
 * magic stops the cell. Nothing here exits.
 */
#define _GNU_SOURCE /* asprintf, vasprintf */
#include "tk_magics.h"
#include "tk_app.h"
#include "tk_host_mem.h"
#include "tk_render.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_HOOKS 16

struct tk_magics {
    const tk_magic_def **defs;  /* sorted by name */
    size_t n, cap;
    void *session;
    void (*session_destroy)(void *);
    struct { tk_magic_completer fn; void *ctx; } comp[MAX_HOOKS];
    struct { tk_magic_inspector fn; void *ctx; } insp[MAX_HOOKS];
    size_t ncomp, ninsp;
};

/* An empty registry; tk_magics_new (tk_magics_modules.c) fills it with the
 * listed modules, so the registry never calls up into the modules. */
tk_magics *tk_magics_new_empty(void) { return tk_calloc(1, sizeof(tk_magics)); }

void tk_magics_destroy(tk_magics **pm) {
    if (!pm || !*pm) return;
    tk_magics *m = *pm;
    if (m->session_destroy && m->session) m->session_destroy(m->session);
    free(m->defs);
    free(m);
    *pm = NULL;
}

const tk_magic_def *tk_magics_find(const tk_magics *m, const char *name) {
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(m->defs[mid]->name, name);
        if (c == 0) return m->defs[mid];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

int tk_magics_add_table(tk_magics *m, const tk_magic_def *defs, size_t n) {
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (tk_magics_find(m, defs[i].name)) {
            fprintf(stderr, "txkernel: magic %%%s is registered twice; keeping the first\n", defs[i].name);
            rc = -1;
            continue;
        }
        if (m->n == m->cap) {
            size_t cap = m->cap ? m->cap * 2 : 32;
            const tk_magic_def **d = tk_realloc(m->defs, cap * sizeof *d);
            if (!d) return -1;
            m->defs = d;
            m->cap = cap;
        }
        size_t k = m->n;
        while (k > 0 && strcmp(m->defs[k - 1]->name, defs[i].name) > 0) { m->defs[k] = m->defs[k - 1]; k--; }
        m->defs[k] = &defs[i];
        m->n++;
    }
    return rc;
}

size_t tk_magics_count(const tk_magics *m) { return m->n; }
const tk_magic_def *tk_magics_at(const tk_magics *m, size_t i) { return i < m->n ? m->defs[i] : NULL; }

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return (size_t)-1;
    size_t row[65];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *tk_magics_closest(const tk_magics *m, const char *name) {
    const char *best = NULL;
    size_t bd = (size_t)-1, limit = 2 + strlen(name) / 3;
    for (size_t i = 0; i < m->n; i++) {
        size_t d = edit_distance(name, m->defs[i]->name);
        if (d < bd) { bd = d; best = m->defs[i]->name; }
    }
    return bd <= limit ? best : NULL;
}

void tk_magics_set_session(tk_magics *m, void *session, void (*destroy)(void *)) {
    if (m->session_destroy && m->session && m->session != session) m->session_destroy(m->session);
    m->session = session;
    m->session_destroy = destroy;
}
void *tk_magics_session(const tk_magics *m) { return m->session; }

int tk_magics_add_completer(tk_magics *m, tk_magic_completer fn, void *ctx) {
    if (m->ncomp == MAX_HOOKS) return -1;
    m->comp[m->ncomp].fn = fn;
    m->comp[m->ncomp++].ctx = ctx;
    return 0;
}
int tk_magics_add_inspector(tk_magics *m, tk_magic_inspector fn, void *ctx) {
    if (m->ninsp == MAX_HOOKS) return -1;
    m->insp[m->ninsp].fn = fn;
    m->insp[m->ninsp++].ctx = ctx;
    return 0;
}

/* ---- helpers for magic bodies -------------------------------------------- */

void tk_magic_printf(tk_magic_ctx *c, const char *stream, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n >= 0 && s) c->out->ops->stream(c->out, stream, s);
    free(s);
}

static int verror(tk_out *out, const char *ename, const char *fmt, va_list ap) {
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    const char *msg = s ? s : "error (out of memory formatting it)";
    char *line = NULL;
    if (asprintf(&line, "%s: %s", ename, msg) < 0) line = NULL;
    json_t *tb = json_pack("[s]", line ? line : msg);
    out->ops->error(out, ename, msg, tb);
    json_decref(tb);
    free(line);
    free(s);
    return -1;
}

static int out_error(tk_out *out, const char *ename, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(out, ename, fmt, ap);
    va_end(ap);
    return -1;
}

int tk_magic_error(tk_magic_ctx *c, const char *ename, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(c->out, ename, fmt, ap);
    va_end(ap);
    return -1;
}

int tk_magic_interrupted(tk_magic_ctx *c) {
    return tk_magic_error(c, "KeyboardInterrupt", "%%%s was interrupted", c->name);
}

int tk_magic_sleep(tk_magic_ctx *c, double seconds) {
    struct timespec t0, now, tick = {0, 10 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (c->cancel && atomic_load(c->cancel)) return 1;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double el = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) * 1e-9;
        if (el >= seconds) return 0;
        double left = seconds - el;
        struct timespec d = tick;
        if (left < 0.01) d.tv_nsec = (long)(left * 1e9);
        nanosleep(&d, NULL);
    }
}

/* ---- cell grammar ---------------------------------------------------------- */

static int is_name_char(int ch) { return isalnum(ch) || ch == '_' || ch == '-' || ch == '.'; }

/* a line [s, e) without the trailing newline; returns the next line's start */
static const char *next_line(const char *s, const char **e) {
    const char *nl = strchr(s, '\n');
    *e = nl ? nl : s + strlen(s);
    return nl ? nl + 1 : *e;
}

static int blank_or_comment(const char *s, const char *e) {
    while (s < e && isspace((unsigned char)*s)) s++;
    return s == e || *s == '#';
}

static char *trimmed_dup(const char *s, const char *e) {
    while (s < e && isspace((unsigned char)*s)) s++;
    while (e > s && isspace((unsigned char)e[-1])) e--;
    return tk_strndup(s, (size_t)(e - s));
}

/* If [s, e) is a help request (?name, name?, %name?, ??name) returns the
 * name (new string), else NULL. */
static char *help_target(const char *s, const char *e) {
    char *t = trimmed_dup(s, e);
    if (!t) return NULL;
    size_t n = strlen(t);
    char *p = t, *q = t + n;
    int help = 0;
    while (p < q && *p == '?') { p++; help = 1; }
    while (q > p && q[-1] == '?') { q--; help = 1; }
    while (p < q && *p == '%') p++;
    if (!help || p == q) { free(t); return NULL; }
    for (char *k = p; k < q; k++) if (!is_name_char((unsigned char)*k)) { free(t); return NULL; }
    memmove(t, p, (size_t)(q - p));
    t[q - p] = 0;
    return t;
}

char *tk_magic_help(const tk_magic_def *d) {
    const char *h = d->help ? d->help : d->summary, *at;
    tk_verb v = strncmp(d->name, "tx", 2) ? 0 : tk_app_verb_find(d->name + 2);
    char *flags = v ? tk_app_usage_flags(v, TK_DOOR_CELL) : NULL;
    tk_sb sb = {0};
    tk_sb_add(&sb, "");
    while ((at = strstr(h, "{flags}"))) {
        tk_sb_addf(&sb, "%.*s%s", (int)(at - h), h, flags ? flags : "");
        h = at + 7;
    }
    tk_sb_add(&sb, h);
    free(flags);
    return tk_sb_take(&sb);
}

static void page_help(tk_out *out, const tk_magic_def *d) {
    char *h = tk_magic_help(d);
    json_t *data = json_pack("{s:s}", "text/plain", h ? h : d->summary);
    free(h);
    out->ops->page(out, data);
    json_decref(data);
}

static int unknown_magic(tk_magics *m, tk_out *out, const char *pct, const char *name, int line) {
    const char *near = tk_magics_closest(m, name);
    if (near)
        return out_error(out, "UsageError", "unknown magic %s%s (line %d); did you mean %s%s?", pct, name, line, pct, near);
    return out_error(out, "UsageError", "unknown magic %s%s (line %d); %%lsmagic lists the magics", pct, name, line);
}

static int run_magic(tk_magics *m, const tk_magic_def *d, int is_cell, const char *args, const char *body,
                     int line, const tk_exec_opts *opts, tk_out *out, atomic_int *cancel) {
    tk_magic_ctx c = {.name = d->name, .args = args, .body = body, .is_cell = is_cell, .out = out, .line = line,
                      .cancel = cancel, .session = m->session, .magics = m,
                      .execution_count = opts ? opts->execution_count : 0};
    int rc = d->run(&c);
    if (rc == 0 && cancel && atomic_load(cancel)) return tk_magic_interrupted(&c);
    return rc;
}

static int m_execute(void *self, const char *code, const tk_exec_opts *opts, tk_out *out, atomic_int *cancel) {
    tk_magics *m = self;
    const char *s = code, *e;
    int lineno = 0, seen = 0;
    for (const char *nx; *s; s = nx) {
        nx = next_line(s, &e);
        lineno++;
        if (blank_or_comment(s, e)) continue;
        const char *p = s;
        while (p < e && isspace((unsigned char)*p)) p++;
        char *help = help_target(p, e);
        if (help) {
            const tk_magic_def *d = tk_magics_find(m, help);
            int rc = 0;
            if (d) page_help(out, d);
            else rc = unknown_magic(m, out, "%", help, lineno);
            free(help);
            if (rc) return rc;
            seen = 1;
            continue;
        }
        const tk_magic_def *sys = *p == '!' ? tk_magics_find(m, "system") : NULL;
        if (sys) {
            /* !CMD is IPython's spelling of %system CMD */
            char *args = trimmed_dup(p + 1, e);
            int rc = args ? run_magic(m, sys, 0, args, "", lineno, opts, out, cancel)
                          : out_error(out, "MemoryError", "out of memory reading line %d", lineno);
            free(args);
            if (rc) return rc;
            seen = 1;
            continue;
        }
        if (*p != '%') {
            char *t = trimmed_dup(p, e);
            int rc = out_error(out, "SyntaxError",
                               "line %d: \"%.60s\" is not a magic. Cells start with a magic: put %%%%txtrain "
                               "on the first line above a YAML config, !CMD runs a shell command, %%lsmagic lists the magics",
                               lineno, t ? t : "");
            free(t);
            return rc;
        }
        int is_cell = p + 1 < e && p[1] == '%';
        const char *n0 = p + (is_cell ? 2 : 1), *n1 = n0;
        while (n1 < e && is_name_char((unsigned char)*n1)) n1++;
        char *name = tk_strndup(n0, (size_t)(n1 - n0));
        char *args = trimmed_dup(n1, e);
        int rc = 0;
        const tk_magic_def *d = name ? tk_magics_find(m, name) : NULL;
        if (!name || !args) rc = out_error(out, "MemoryError", "out of memory reading line %d", lineno);
        else if (!d) rc = unknown_magic(m, out, is_cell ? "%%" : "%", name, lineno);
        else if (is_cell && seen)
            rc = out_error(out, "UsageError", "cell magic %%%%%s must be on the first line of the cell (it is on line %d)", name, lineno);
        else if (is_cell && !(d->kind & TK_MAGIC_CELL))
            rc = out_error(out, "UsageError", "%%%s is a line magic; write it with one %%: %%%s %s", name, name, args);
        else if (!is_cell && !(d->kind & TK_MAGIC_LINE))
            rc = out_error(out, "UsageError", "%%%%%s is a cell magic: put it on the first line and its body below", name);
        else if (is_cell) {
            rc = run_magic(m, d, 1, args, nx, lineno, opts, out, cancel);
            free(name);
            free(args);
            return rc; /* the body is the rest of the cell */
        } else
            rc = run_magic(m, d, 0, args, "", lineno, opts, out, cancel);
        free(name);
        free(args);
        if (rc) return rc;
        seen = 1;
    }
    return 0;
}

static void m_complete(void *self, const char *code, size_t cursor, json_t *matches, size_t *start, size_t *end) {
    tk_magics *m = self;
    size_t len = strlen(code);
    if (cursor > len) cursor = len;
    size_t b = cursor;
    while (b > 0 && !isspace((unsigned char)code[b - 1])) b--;
    size_t pct = 0;
    while (b + pct < cursor && code[b + pct] == '%' && pct < 2) pct++;
    /* the argument of %txhelp is a magic name too */
    size_t ls = b;
    while (ls > 0 && code[ls - 1] != '\n') ls--;
    const char *lp = code + ls;
    while (*lp == ' ' || *lp == '\t') lp++;
    int help_arg = !pct && !strncmp(lp, "%txhelp", 7) && lp + 7 < code + b;
    if (help_arg) {
        for (size_t i = 0; i < m->n; i++)
            if (!strncmp(m->defs[i]->name, code + b, cursor - b))
                json_array_append_new(matches, json_string(m->defs[i]->name));
        *start = b;
        *end = cursor;
    }
    if (pct) {
        const char *pre = code + b + pct;
        size_t pl = cursor - b - pct;
        for (size_t i = 0; i < m->n; i++) {
            const tk_magic_def *d = m->defs[i];
            if (strncmp(d->name, pre, pl)) continue;
            if (pct == 2 && !(d->kind & TK_MAGIC_CELL)) continue;
            if (pct == 1 && !(d->kind & TK_MAGIC_LINE)) continue;
            char buf[256];
            snprintf(buf, sizeof buf, "%s%s", pct == 2 ? "%%" : "%", d->name);
            json_array_append_new(matches, json_string(buf));
        }
        *start = b;
        *end = cursor;
    }
    for (size_t i = 0; i < m->ncomp; i++) {
        size_t s2 = cursor, e2 = cursor, before = json_array_size(matches);
        m->comp[i].fn(m->comp[i].ctx, code, cursor, matches, &s2, &e2);
        if (json_array_size(matches) > before && before == 0) { *start = s2; *end = e2; }
    }
}

static int m_inspect(void *self, const char *code, size_t cursor, int detail, json_t *data) {
    tk_magics *m = self;
    size_t len = strlen(code);
    if (cursor > len) cursor = len;
    size_t b = cursor, e = cursor;
    while (b > 0 && (is_name_char((unsigned char)code[b - 1]) || code[b - 1] == '%')) b--;
    while (e < len && is_name_char((unsigned char)code[e])) e++;
    while (b < e && code[b] == '%') b++;
    char *word = tk_strndup(code + b, e - b);
    if (!word) return 0;
    int found = 0;
    const tk_magic_def *d = *word ? tk_magics_find(m, word) : NULL;
    if (d) {
        char *h = tk_magic_help(d);
        json_object_set_new(data, "text/plain", json_string(h ? h : d->summary));
        free(h);
        found = 1;
    }
    for (size_t i = 0; !found && *word && i < m->ninsp; i++) found = m->insp[i].fn(m->insp[i].ctx, word, detail, data);
    free(word);
    return found;
}

static const char *m_is_complete(void *self, const char *code, const char **indent) {
    tk_magics *m = self;
    *indent = "";
    size_t len = strlen(code);
    if (len && len >= 2 && code[len - 1] == '\\') return "incomplete";
    const char *s = code, *e;
    int first = 1;
    for (const char *nx; *s; s = nx) {
        nx = next_line(s, &e);
        if (blank_or_comment(s, e)) continue;
        const char *p = s;
        while (p < e && isspace((unsigned char)*p)) p++;
        char *help = help_target(p, e);
        if (help) { int ok = tk_magics_find(m, help) != NULL; free(help); if (!ok) return "invalid"; first = 0; continue; }
        if (*p == '!' && tk_magics_find(m, "system")) { first = 0; continue; }
        if (*p != '%') return "invalid";
        int is_cell = p + 1 < e && p[1] == '%';
        const char *n0 = p + (is_cell ? 2 : 1), *n1 = n0;
        while (n1 < e && is_name_char((unsigned char)*n1)) n1++;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(n1 - n0), n0);
        const tk_magic_def *d = tk_magics_find(m, name);
        if (!d) return "invalid";
        if (is_cell) {
            if (!first || !(d->kind & TK_MAGIC_CELL)) return "invalid";
            /* like IPython: a cell magic's body ends at a blank last line */
            if (blank_or_comment(nx, nx + strlen(nx))) return "incomplete";
            return len && code[len - 1] == '\n' ? "complete" : "incomplete";
        }
        if (!(d->kind & TK_MAGIC_LINE)) return "invalid";
        first = 0;
    }
    return "complete";
}

static void m_kernel_info(void *self, json_t *ct) {
    (void)self;
    json_object_set_new(ct, "language_info",
                        json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "name", "txkernel", "version", TK_KERNEL_VERSION,
                                  "mimetype", "text/x-txkernel", "file_extension", ".txk",
                                  "codemirror_mode", "yaml", "pygments_lexer", "yaml"));
    json_object_set_new(ct, "banner",
                        json_string("txkernel " TK_KERNEL_VERSION " - fine-tune BERT and see where the device "
                                    "memory goes.\nCells start with a magic: %lsmagic lists them, ?name shows help.\n"));
    json_object_set_new(ct, "help_links",
                        json_pack("[{s:s,s:s},{s:s,s:s}]", "text", "YAML 1.2 (cell bodies)", "url",
                                  "https://yaml.org/spec/1.2.2/", "text", "Jupyter messaging protocol", "url",
                                  "https://jupyter-client.readthedocs.io/en/stable/messaging.html"));
}

tk_interp tk_magics_interp(tk_magics *m) {
    tk_interp it = {.self = m, .execute = m_execute, .complete = m_complete, .inspect = m_inspect,
                    .is_complete = m_is_complete, .kernel_info = m_kernel_info};
    return it;
}
