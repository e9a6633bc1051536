/* magics_rec.h — a recording output sink for driving the magics through the
 * interpreter interface in C tests: every stream, display, update, result and
 * error becomes a JSON object in an array the test inspects. Static, header
 * only: each test binary includes it once. Needs M, I, cancel_flag set up by
 * the test (tk_magics_new, tk_magics_interp). */
#ifndef MAGICS_REC_H
#define MAGICS_REC_H
#include <jansson.h>
#include <string.h>
#include "tk_magics.h"

typedef struct {
    json_t *msgs; /* [{"type":..., "data"|"text"|"ename"/"evalue"}] */
} rec;

static void rec_stream(tk_out *o, const char *name, const char *text) {
    rec *r = o->impl;
    json_array_append_new(r->msgs, json_pack("{s:s, s:s, s:s}", "type", "stream", "name", name, "text", text));
}
static void rec_display(tk_out *o, json_t *data, json_t *md, const char *id, int update) {
    (void)md;
    rec *r = o->impl;
    json_array_append_new(r->msgs, json_pack("{s:s, s:O, s:s}", "type", update ? "update" : "display", "data", data,
                                             "id", id ? id : ""));
}
static void rec_result(tk_out *o, json_t *data, json_t *md) {
    (void)md;
    rec *r = o->impl;
    json_array_append_new(r->msgs, json_pack("{s:s, s:O}", "type", "result", "data", data));
}
static void rec_clear(tk_out *o, int wait) { (void)o; (void)wait; }
static void rec_error(tk_out *o, const char *ename, const char *evalue, json_t *tb) {
    (void)tb;
    rec *r = o->impl;
    json_array_append_new(r->msgs, json_pack("{s:s, s:s, s:s}", "type", "error", "ename", ename, "evalue", evalue));
}
static void rec_page(tk_out *o, json_t *data) { (void)o; (void)data; }
static const tk_out_ops REC_OPS = {rec_stream, rec_display, rec_result, rec_clear, rec_error, rec_page};

static tk_magics *M;
static tk_interp I;
static atomic_int cancel_flag;

/* Runs a cell; returns the recorded messages (new reference) and *rc. */
static json_t *run(const char *code, int *rc) {
    rec r = {json_array()};
    tk_out out = {&REC_OPS, &r};
    tk_exec_opts o = {0, 1, 0, 1};
    *rc = I.execute(I.self, code, &o, &out, &cancel_flag);
    return r.msgs;
}

static json_t *first(json_t *msgs, const char *type) {
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) if (!strcmp(json_string_value(json_object_get(m, "type")), type)) return m;
    return NULL;
}

static const char *evalue(json_t *msgs) {
    json_t *e = first(msgs, "error");
    return e ? json_string_value(json_object_get(e, "evalue")) : "";
}

/* The machine-readable part of a bundle (borrowed): application/json (what
 * --json sends) or application/vnd.txkernel.<what>+json (what a notebook
 * gets otherwise); NULL if it has neither. */
static json_t *bundle_json(json_t *data) {
    json_t *j = json_object_get(data, "application/json");
    const char *k;
    json_t *v;
    if (j) return j;
    json_object_foreach(data, k, v) {
        size_t n = strlen(k);
        if (!strncmp(k, "application/vnd.txkernel.", 25) && n > 5 && !strcmp(k + n - 5, "+json")) return v;
    }
    return NULL;
}

/* The machine-readable part of the last display or result in msgs (borrowed). */
static json_t *last_json(json_t *msgs) {
    json_t *found = NULL;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        json_t *d = json_object_get(m, "data");
        if (d && bundle_json(d)) found = bundle_json(d);
    }
    return found;
}

/* Every stdout stream text in msgs, joined into buf (truncated to n);
 * returns msgs. */
static inline json_t *stdout_of(json_t *msgs, char *buf, size_t n) {
    size_t i, len = 0;
    json_t *m;
    buf[0] = 0;
    json_array_foreach(msgs, i, m) {
        if (strcmp(json_string_value(json_object_get(m, "type")), "stream")) continue;
        const char *t = json_string_value(json_object_get(m, "text"));
        len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s", t ? t : "");
        if (len >= n) break;
    }
    return msgs;
}

#endif
