/* tk_magics_basic.c — the magics that need nothing but the kernel: %lsmagic,
 * %txhelp, %echo / %%echo, %sleep, %txversion, %clear. They also show every
 * kind of output a magic can send (stream, display_data with and without a
 * display_id, update_display_data, execute_result, clear_output, error). */
#include "tk_magics.h"
#include "tk_app.h"
#include "tk_host_mem.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static int run_lsmagic(tk_magic_ctx *c) {
    size_t n = tk_magics_count(c->magics);
    size_t cap = 256 + n * 256;
    char *txt = tk_malloc(cap), *html = tk_malloc(cap * 2);
    if (!txt || !html) { free(txt); free(html); return tk_magic_error(c, "MemoryError", "out of memory listing magics"); }
    size_t t = 0, h = 0;
    t += (size_t)snprintf(txt + t, cap - t, "Available magics:\n");
    h += (size_t)snprintf(html + h, cap * 2 - h, "<table><tr><th>magic</th><th>what it does</th></tr>");
    for (size_t i = 0; i < n; i++) {
        const tk_magic_def *d = tk_magics_at(c->magics, i);
        const char *pct = d->kind == TK_MAGIC_CELL ? "%%" : "%";
        t += (size_t)snprintf(txt + t, cap - t, "  %s%-12s %.180s\n", pct, d->name, d->summary);
        /* names and summaries are our own static strings: no HTML to escape */
        h += (size_t)snprintf(html + h, cap * 2 - h, "<tr><td><code>%s%s</code></td><td>%.180s</td></tr>", pct,
                              d->name, d->summary);
    }
    snprintf(txt + t, cap - t, "?name or %%txhelp name shows the help of one magic.\n");
    snprintf(html + h, cap * 2 - h, "</table>");
    json_t *data = json_pack("{s:s,s:s}", "text/plain", txt, "text/html", html);
    c->out->ops->display(c->out, data, NULL, NULL, 0);
    json_decref(data);
    free(txt);
    free(html);
    return 0;
}

/* %txhelp txVERB: the flags the verb takes in a cell, printed from the one
 * option table (app/options.c), so they are the flags the parser takes. */
static void table_flags(tk_magic_ctx *c, const char *name) {
    tk_verb v = strncmp(name, "tx", 2) ? 0 : tk_app_verb_find(name + 2);
    int n = 0, any = 0;
    const tk_option *o = v ? tk_app_options(&n) : NULL;
    for (int i = 0; i < n; i++) {
        if (!tk_app_option_takes(&o[i], v, TK_DOOR_CELL)) continue;
        if (!any++) tk_magic_printf(c, "stdout", "\nFlags (from the option table, as txk %s reads them):\n",
                                    tk_app_verb_name(v));
        int valued = tk_app_option_valued(&o[i], TK_DOOR_CELL);
        tk_magic_printf(c, "stdout", "  %s%s%s  %s\n", o[i].name, valued ? " " : "", valued ? o[i].metavar : "",
                        o[i].help);
    }
}

static int run_txhelp(tk_magic_ctx *c) {
    if (!*c->args) {
        tk_magic_printf(c, "stdout", "txkernel: every cell starts with a magic.\n");
        for (size_t i = 0; i < tk_magics_count(c->magics); i++) {
            const tk_magic_def *d = tk_magics_at(c->magics, i);
            tk_magic_printf(c, "stdout", "  %s%-12s %s\n", d->kind == TK_MAGIC_CELL ? "%%" : "%", d->name, d->summary);
        }
        return 0;
    }
    const char *name = c->args;
    while (*name == '%') name++;
    const tk_magic_def *d = tk_magics_find(c->magics, name);
    if (!d) {
        const char *near = tk_magics_closest(c->magics, name);
        return tk_magic_error(c, "UsageError", "no magic named %s%s%s%s", name,
                              near ? "; did you mean " : "", near ? near : "", near ? "?" : "");
    }
    char *h = tk_magic_help(d);
    tk_magic_printf(c, "stdout", "%s\n", h ? h : d->summary);
    free(h);
    table_flags(c, d->name);
    return 0;
}

/* %echo [--stderr] [--display ID | --update ID] TEXT; %%echo prints its body */
static int run_echo(tk_magic_ctx *c) {
    const char *p = c->args, *stream = "stdout";
    char id[128] = "";
    int update = 0;
    for (;;) {
        if (!strncmp(p, "--stderr", 8) && (p[8] == 0 || isspace((unsigned char)p[8]))) {
            stream = "stderr";
            p += 8;
        } else if ((!strncmp(p, "--display ", 10) || !strncmp(p, "--update ", 9))) {
            update = p[2] == 'u';
            p += update ? 9 : 10;
            while (isspace((unsigned char)*p)) p++;
            size_t k = 0;
            while (*p && !isspace((unsigned char)*p) && k + 1 < sizeof id) id[k++] = *p++;
            id[k] = 0;
            if (!k) return tk_magic_error(c, "UsageError", "%%echo --%s needs an ID", update ? "update" : "display");
        } else {
            break;
        }
        while (isspace((unsigned char)*p)) p++;
    }
    const char *text = c->is_cell ? c->body : p;
    if (*id) {
        json_t *data = json_pack("{s:s}", "text/plain", text);
        c->out->ops->display(c->out, data, NULL, id, update);
        json_decref(data);
        return 0;
    }
    size_t n = strlen(text);
    tk_magic_printf(c, stream, "%s%s", text, n && text[n - 1] == '\n' ? "" : "\n");
    return 0;
}

static int run_sleep(tk_magic_ctx *c) {
    char *end;
    double s = strtod(c->args, &end);
    while (isspace((unsigned char)*end)) end++;
    if (!*c->args || *end || !(s >= 0) || s > 86400)
        return tk_magic_error(c, "UsageError", "%%sleep wants a number of seconds between 0 and 86400, got \"%s\"", c->args);
    if (tk_magic_sleep(c, s)) return tk_magic_interrupted(c);
    return 0;
}

static int run_txversion(tk_magic_ctx *c) {
    json_t *data = json_pack("{s:s,s:{s:s,s:s}}", "text/plain", "txkernel " TK_KERNEL_VERSION " (Jupyter protocol " TK_PROTOCOL_VERSION ")",
                             "application/vnd.txkernel.version+json", "version", TK_KERNEL_VERSION, "protocol_version", TK_PROTOCOL_VERSION);
    c->out->ops->result(c->out, data, NULL);
    json_decref(data);
    return 0;
}

static int run_clear(tk_magic_ctx *c) {
    int wait = strstr(c->args, "--wait") != NULL;
    c->out->ops->clear(c->out, wait);
    return 0;
}

static int run_pass(tk_magic_ctx *c) { (void)c; return 0; }

static const tk_magic_def BASIC[] = {
    {"pass", TK_MAGIC_LINE, run_pass, "do nothing",
     "%pass\n\nDoes nothing and outputs nothing: the cheapest cell, for latency benchmarks."},
    {"lsmagic", TK_MAGIC_LINE, run_lsmagic, "list every magic",
     "%lsmagic\n\nLists every magic with a one-line summary (as text and as an HTML table)."},
    {"txhelp", TK_MAGIC_LINE, run_txhelp, "help on txkernel or on one magic",
     "%txhelp [NAME]\n\nWithout NAME: how cells work and the list of magics. With NAME: the help of\n"
     "that magic. ?NAME (or NAME?) shows the same help in the pager."},
    {"echo", TK_MAGIC_BOTH, run_echo, "print text (stdout, stderr or a display)",
     "%echo [--stderr] [--display ID | --update ID] TEXT\n%%echo (prints the cell body)\n\n"
     "Prints TEXT on stdout, or on stderr with --stderr. --display ID shows TEXT as a\n"
     "display with that display_id; --update ID replaces what that display shows."},
    {"sleep", TK_MAGIC_LINE, run_sleep, "wait SECONDS (interruptible)",
     "%sleep SECONDS\n\nWaits SECONDS (a decimal number); an interrupt ends it at once with a\n"
     "KeyboardInterrupt error."},
    {"txversion", TK_MAGIC_LINE, run_txversion, "the kernel and protocol version",
     "%txversion\n\nReturns the txkernel version and the Jupyter protocol version as the cell's result."},
    {"clear", TK_MAGIC_LINE, run_clear, "clear this cell's output",
     "%clear [--wait]\n\nClears the output shown so far; with --wait, only when new output arrives."},
};

int tk_magics_register_basic(tk_magics *m);
int tk_magics_register_basic(tk_magics *m) { return tk_magics_add_table(m, BASIC, sizeof BASIC / sizeof *BASIC); }
