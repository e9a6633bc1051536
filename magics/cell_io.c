/* cell_io.c — what every txkernel magic does with its cell: split the
 * argument line as a shell would (and read it by the option table), and show a bundle through the cell's sink
 * (moved out of report.c when the reports went to app/, issue 39).
 *
 * Guarantees: in a notebook the machine-readable part travels as
 * application/vnd.txkernel.<what>+json (tk_bundle_for_notebook), never as
 * application/json, unless the user asked for --json.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_host_mem.h"
#include "tk_render.h"
#include "tk_txmagics.h"

int tk_txargs_split(const char *s, char ***argv, int *argc) {
    char **v = NULL;
    int n = 0, cap = 0;
    size_t len = strlen(s);
    char *word = tk_malloc(len + 1);
    if (!word) return -1;
    const char *p = s;
    for (;;) {
        while (*p && isspace((unsigned char)*p)) p++;
        if (!*p) break;
        size_t w = 0;
        char q = 0;
        while (*p && (q || !isspace((unsigned char)*p))) {
            if (!q && (*p == '"' || *p == '\'')) q = *p;
            else if (q && *p == q) q = 0;
            else word[w++] = *p;
            p++;
        }
        if (q) goto fail;
        word[w] = 0;
        if (n + 1 >= cap) {
            cap = cap ? cap * 2 : 8;
            char **nv = tk_realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) goto fail;
            v = nv;
        }
        if (!(v[n] = tk_strdup(word))) goto fail;
        n++;
    }
    free(word);
    if (!v && !(v = tk_calloc(1, sizeof *v))) return -1;
    v[n] = NULL;
    *argv = v;
    *argc = n;
    return 0;
fail:
    free(word);
    tk_txargs_free(v, n);
    return -1;
}

int tk_txargs_parse(tk_magic_ctx *m, tk_verb verb, char ***argv, int *argc, tk_app_args *a) {
    *argv = NULL;
    *argc = 0;
    if (tk_txargs_split(m->args ? m->args : "", argv, argc)) return tk_magic_error(m, "UsageError", "unbalanced quotes");
    char who[64];
    snprintf(who, sizeof who, "%s%s", m->is_cell ? "%%" : "%", m->name);
    tk_err err = {0};
    if (tk_app_args_parse(verb, TK_DOOR_CELL, who, *argv, *argc, a, &err) == TK_OK) return 0;
    tk_txargs_free(*argv, *argc);
    *argv = NULL;
    *argc = 0;
    return tk_magic_error(m, "UsageError", "%s", err.msg);
}

void tk_txargs_free(char **argv, int argc) {
    for (int i = 0; argv && i < argc; i++) free(argv[i]);
    free(argv);
}

void tk_txemit_as(tk_magic_ctx *m, json_t *bundle, int json_only, const char *what) {
    if (json_only) {
        json_t *j = json_object_get(bundle, "application/json");
        char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        json_t *b = json_pack("{s:s}", "text/plain", s ? s : "{}");
        if (j) json_object_set(b, "application/json", j);
        m->out->ops->display(m->out, b, NULL, NULL, 0);
        json_decref(b);
        free(s);
        return;
    }
    tk_txshow(m, bundle, what, NULL, 0, 0);
}

void tk_txemit(tk_magic_ctx *m, json_t *bundle, int json_only) {
    tk_txemit_as(m, bundle, json_only, strncmp(m->name, "tx", 2) ? m->name : m->name + 2);
}

void tk_txshow(tk_magic_ctx *m, json_t *bundle, const char *what, const char *display_id, int update, int result) {
    json_t *b = tk_bundle_for_notebook(bundle, what);
    if (!b) {
        tk_magic_printf(m, "stderr", "txkernel: out of host memory showing the %s report\n", what);
        return;
    }
    if (result) m->out->ops->result(m->out, b, NULL);
    else m->out->ops->display(m->out, b, NULL, display_id, update);
    json_decref(b);
}

