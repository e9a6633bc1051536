/* tk_magics.h — the cell language: a registry of magics and the interpreter
 * (a tk_interp, see kernel/tk_kernel.h) that runs cells through it.
 *
 * A cell is a sequence of line magics, one per line (`%echo hi`), or one cell
 * magic on its first line followed by a body (`%%txtrain` then YAML). `?name`
 * or `name?` pages the help of a magic. Blank lines and lines starting with `#`
 * are skipped. A line starting with `!` is `%system` on the rest of the line
 * (a shell command). Anything else is an error that says cells start with a
 * magic.
 *
 * ---- How to add magics (other modules: read this) ------------------------
 * 1. Write magics/<yours>.c with a table and a register function:
 *
 *      static int run_txmem(tk_magic_ctx *c) {
 *          tk_magic_printf(c, "stdout", "%s\n", c->args);
 *          return 0;                       // or tk_magic_error(c, ...) => -1
 *      }
 *      static const tk_magic_def MINE[] = {
 *          {"txmem", TK_MAGIC_LINE, run_txmem, "show live device memory",
 *           "%txmem [--by layer|category]\n\nLonger help shown by %txhelp txmem."},
 *      };
 *      int tk_magics_register_txmem(tk_magics *m) {
 *          return tk_magics_add_table(m, MINE, sizeof MINE / sizeof *MINE);
 *      }
 *
 * 2. Add one line to magics/tk_magics_modules.def:
 *      TK_MAGIC_MODULE(tk_magics_register_txmem)
 *    (nothing else: tk_magics_modules.c declares and calls each listed function).
 *
 * A magic gets (tk_magic_ctx): its name, the args string (rest of the line,
 * trimmed), the cell body (%% magics; "" for line magics), the output sink
 * (stream, display_data with a MIME bundle and optional display_id,
 * update_display_data, execute_result, clear_output, error, pager), a cancel
 * flag to poll (set by interrupts; return after tk_magic_interrupted(c)), and
 * the session pointer (opaque; a module that needs notebook-wide state sets it
 * once with tk_magics_set_session, and every magic sees it).
 *
 * Completion and inspect: a module may add a completer (called for every
 * complete_request with the code and cursor; it appends matches for its own
 * context, e.g. config keys inside a %%txtrain body) and an inspector (returns
 * help text for a word it knows). Magic names and their help are built in.
 *
 * Ownership: strings in tk_magic_ctx are borrowed for the call. Bundles passed
 * to the sink are borrowed (the caller still owns them).
 */
#ifndef TK_MAGICS_H
#define TK_MAGICS_H

#include "tk_kernel.h"
#include <stdarg.h>

typedef struct tk_magics tk_magics;

typedef enum {
    TK_MAGIC_LINE = 1,   /* %name args */
    TK_MAGIC_CELL = 2,   /* %%name args \n body */
    TK_MAGIC_BOTH = 3
} tk_magic_kind;

typedef struct tk_magic_ctx {
    const char *name;      /* without % */
    const char *args;      /* the rest of the magic's line, trimmed */
    const char *body;      /* cell body after the %% line; "" for line magics */
    int is_cell;           /* invoked as %%name */
    tk_out *out;           /* output sink (borrowed) */
    atomic_int *cancel;    /* nonzero once the user interrupted */
    void *session;         /* tk_magics_set_session's pointer, or NULL */
    tk_magics *magics;     /* the registry (for %lsmagic, %txhelp) */
    int execution_count;
    int line;              /* the cell line (1-based) of the magic; a body starts on line + 1 */
} tk_magic_ctx;

/* Returns 0 on success, -1 after reporting an error through the sink. */
typedef int (*tk_magic_fn)(tk_magic_ctx *c);

typedef struct tk_magic_def {
    const char *name;      /* without %, e.g. "txmem" */
    int kind;              /* tk_magic_kind */
    tk_magic_fn run;
    const char *summary;   /* one line, for %lsmagic and completion */
    const char *help;      /* full help: usage line first, for %txhelp / ?name / inspect */
} tk_magic_def;

/* Appends completions for the code at byte offset cursor to matches (borrowed
 * array of strings); sets [*start, *end) when it added any. */
typedef void (*tk_magic_completer)(void *ctx, const char *code, size_t cursor, json_t *matches,
                                   size_t *start, size_t *end);
/* Writes help for word into data (MIME bundle, borrowed); returns 1 if known. */
typedef int (*tk_magic_inspector)(void *ctx, const char *word, int detail, json_t *data);

tk_magics *tk_magics_new(void);                 /* new; all listed modules registered */
tk_magics *tk_magics_new_empty(void);           /* new; nothing registered */
void tk_magics_destroy(tk_magics **pm);          /* also calls the session's destroy fn */
/* Adds a table (borrowed; must outlive the registry, e.g. static const).
 * Returns -1 if a name is already taken (the earlier one stays). */
int tk_magics_add_table(tk_magics *m, const tk_magic_def *defs, size_t n);
const tk_magic_def *tk_magics_find(const tk_magics *m, const char *name);
/* d's help as %txhelp, ?name and inspect show it: each "{flags}" in it
 * replaced by the flags its verb takes in a cell, from the option table
 * (app/options.c), so a usage line lists exactly what the parser takes.
 * New string (NULL when out of host memory). */
char *tk_magic_help(const tk_magic_def *d);
size_t tk_magics_count(const tk_magics *m);
const tk_magic_def *tk_magics_at(const tk_magics *m, size_t i);  /* sorted by name */
/* The known name closest to name (edit distance), or NULL if none is close. */
const char *tk_magics_closest(const tk_magics *m, const char *name);

/* Session: opaque state shared by all magics; destroy (may be NULL) runs at
 * tk_magics_destroy or when replaced. Takes ownership of session. */
void tk_magics_set_session(tk_magics *m, void *session, void (*destroy)(void *session));
void *tk_magics_session(const tk_magics *m);

int tk_magics_add_completer(tk_magics *m, tk_magic_completer fn, void *ctx);
int tk_magics_add_inspector(tk_magics *m, tk_magic_inspector fn, void *ctx);

/* The interpreter the kernel core calls (its self is m, borrowed). */
tk_interp tk_magics_interp(tk_magics *m);

/* Helpers for magic bodies. */
void tk_magic_printf(tk_magic_ctx *c, const char *stream, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tk_magic_error(tk_magic_ctx *c, const char *ename, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));          /* always returns -1 */
int tk_magic_interrupted(tk_magic_ctx *c);         /* reports KeyboardInterrupt, returns -1 */
/* Sleeps up to seconds, waking every 10 ms to poll the cancel flag; returns 1
 * if cancelled. */
int tk_magic_sleep(tk_magic_ctx *c, double seconds);

#endif
