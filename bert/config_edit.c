/* config_edit.c — a config file's text with some keys changed in place
 * (implements tk_config_edit.h).
 *
 * The keys that differ come from tk_config_diff; where the text sets each
 * one is found with libyaml's node marks, so a key spelled as an alias
 * (per_device_train_batch_size), dotted (train.batch_size) or inside a
 * section (`train: {batch_size: 32}`) is the line that changes. A key's
 * spelling in the text is matched to the table's key through
 * tk_config_key_help, which resolves aliases and sections the way parsing
 * does. Guarantees: bytes outside the replaced values and the appended
 * lines are the input's; the output parses to the target config or is not
 * returned.
 */
#include "tk_config_edit.h"
#include "tk_host_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define MAX_EDITS 64

typedef struct {
    size_t begin, end;  /* bytes of the input replaced */
    char text[600];     /* by this */
} edit;

/* A key as the text spells it, where its value is, and which of the
 * table's keys it sets (its help string, unique per key). */
typedef struct {
    char name[96];
    const char *help;
    size_t begin, end;  /* the value's bytes */
    int is_scalar;
} place;

/* libyaml counts characters; the input is UTF-8: the byte offset of a mark
 * is its line's start plus `column` characters. */
static size_t byte_of(const char *text, size_t len, yaml_mark_t mk) {
    size_t pos = 0, line = 0;
    while (pos < len && line < mk.line)
        if (text[pos++] == '\n') line++;
    for (size_t col = 0; pos < len && col < mk.column; col++) {
        pos++;
        while (pos < len && ((unsigned char)text[pos] & 0xC0) == 0x80) pos++;
    }
    return pos;
}

static int collect(yaml_document_t *doc, yaml_node_t *map, const char *section, const char *text, size_t len,
                   place *out, int max, int n) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top && n < max; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key), *v = yaml_document_get_node(doc, p->value);
        if (!k || !v || k->type != YAML_SCALAR_NODE) continue;
        const char *name = (const char *)k->data.scalar.value;
        if (v->type == YAML_MAPPING_NODE && !section) {
            n = collect(doc, v, name, text, len, out, max, n);
            continue;
        }
        place *pl = &out[n++];
        snprintf(pl->name, sizeof pl->name, "%s%s%s", section ? section : "", section ? "." : "", name);
        pl->help = tk_config_key_help(pl->name);
        pl->begin = byte_of(text, len, v->start_mark);
        pl->end = byte_of(text, len, v->end_mark);
        pl->is_scalar = v->type == YAML_SCALAR_NODE;
        /* `device: t4` names the gpu profile */
        if (pl->is_scalar && !strcmp(name, "device") && tk_gpu_profile_find((const char *)v->data.scalar.value))
            pl->help = tk_config_key_help("gpu");
    }
    return n;
}

static int cmp_edit(const void *a, const void *b) {
    const edit *x = a, *y = b;
    return x->begin < y->begin ? 1 : x->begin > y->begin ? -1 : 0;
}

char *tk_config_edit_yaml(const char *text, size_t len, const char *source, const tk_config *from,
                          const tk_config *to, size_t *out_len, tk_err *err) {
    *out_len = 0;
    char *diff = tk_config_diff(from, to);
    if (!diff) {
        tk_err_nomem(err, "the config's change");
        return NULL;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        free(diff);
        tk_err_nomem(err, "the YAML parser");
        return NULL;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    place *places = tk_calloc(256, sizeof *places);
    edit *edits = tk_calloc(MAX_EDITS, sizeof *edits);
    char *appended = NULL, *out = NULL;
    size_t n_app = 0, n_edits = 0;
    int n_places = 0, loaded = 0;
    FILE *app = NULL;
    if (!places || !edits || !(app = open_memstream(&appended, &n_app))) {
        tk_err_nomem(err, "the config's change");
        goto done;
    }
    if (!yaml_parser_load(&parser, &doc)) {
        tk_err_set(err, TK_EINVAL, "%s: YAML syntax error", source);
        goto done;
    }
    loaded = 1;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root && root->type == YAML_MAPPING_NODE) n_places = collect(&doc, root, NULL, text, len, places, 256, 0);
    /* "key: old -> new", one line per key that differs (read from a copy,
     * cut into pieces as it is read) */
    char *lines = tk_strdup(diff);
    if (!lines) {
        tk_err_nomem(err, "the config's change");
        goto done;
    }
    for (char *line = lines; *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *colon = strstr(line, ": "), *arrow = colon ? strstr(colon, " -> ") : NULL;
        if (colon && arrow) {
            *colon = 0;
            const char *key = line, *val = arrow + 4, *help = tk_config_key_help(key);
            int done_key = 0;
            /* empty_cache: every:N carries its N */
            if (!strcmp(key, "empty_cache_every") && to->empty_cache == TK_EMPTY_EVERY &&
                strstr(diff, "empty_cache: ") != NULL)
                done_key = 1;
            for (int i = 0; i < n_places && !done_key; i++) {
                if (places[i].help != help) continue;
                if (n_edits == MAX_EDITS) break;
                edit *e = &edits[n_edits++];
                e->begin = places[i].begin, e->end = places[i].end;
                snprintf(e->text, sizeof e->text, "%s", val);
                done_key = 1;
            }
            /* freeze: embeddings,layers:N sets both freeze keys: its line says both */
            if (!done_key && (!strcmp(key, "freeze_embeddings") || !strcmp(key, "freeze_layers")))
                for (int i = 0; i < n_places && !done_key; i++) {
                    if (places[i].help != tk_config_key_help("freeze")) continue;
                    done_key = 1;
                    int again = 0;
                    for (size_t k = 0; k < n_edits; k++) again |= edits[k].begin == places[i].begin;
                    if (again || n_edits == MAX_EDITS) break;
                    edit *e = &edits[n_edits++];
                    e->begin = places[i].begin, e->end = places[i].end;
                    if (to->freeze_embeddings && to->freeze_layers)
                        snprintf(e->text, sizeof e->text, "embeddings,layers:%d", to->freeze_layers);
                    else if (to->freeze_embeddings) snprintf(e->text, sizeof e->text, "embeddings");
                    else if (to->freeze_layers) snprintf(e->text, sizeof e->text, "layers:%d", to->freeze_layers);
                    else snprintf(e->text, sizeof e->text, "none");
                }
            if (!done_key) fprintf(app, "%s: %s\n", key, val);
        }
        if (!nl) break;
        line = nl + 1;
    }
    free(lines);
    if (fclose(app)) {
        app = NULL;
        tk_err_nomem(err, "the config's change");
        goto done;
    }
    app = NULL;
    qsort(edits, n_edits, sizeof *edits, cmp_edit);
    size_t cap = len + n_app + 2;
    for (size_t i = 0; i < n_edits; i++) cap += strlen(edits[i].text);
    out = tk_malloc(cap + 1);
    if (!out) {
        tk_err_nomem(err, "the config's change");
        goto done;
    }
    /* the input with each edit put in, from the end (edits sorted by offset, last first) */
    size_t o = 0, from_byte = 0;
    for (size_t i = n_edits; i-- > 0;) {
        memcpy(out + o, text + from_byte, edits[i].begin - from_byte);
        o += edits[i].begin - from_byte;
        size_t k = strlen(edits[i].text);
        memcpy(out + o, edits[i].text, k);
        o += k;
        from_byte = edits[i].end;
    }
    memcpy(out + o, text + from_byte, len - from_byte);
    o += len - from_byte;
    if (n_app && o && out[o - 1] != '\n') out[o++] = '\n';
    memcpy(out + o, appended, n_app);
    o += n_app;
    out[o] = 0;
    /* it must read back as the target, or it is not written */
    tk_config back;
    tk_config_defaults(&back);
    tk_err pe = {0};
    char *left = NULL;
    if (tk_config_parse_yaml(&back, out, o, source, &pe) != TK_OK || !(left = tk_config_diff(&back, to)) || *left) {
        tk_err_set(err, TK_EINVAL, "%s: the change cannot be written into this file as it is (%s%s); the change, "
                   "to make by hand:\n%s", source, pe.msg[0] ? pe.msg : "it would read back differently: ",
                   pe.msg[0] ? "" : left ? left : "", diff);
        free(out);
        out = NULL;
    }
    free(left);
    if (out) *out_len = o;
done:
    if (app) fclose(app);
    free(appended);
    if (loaded) yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    free(places);
    free(edits);
    free(diff);
    return out;
}
