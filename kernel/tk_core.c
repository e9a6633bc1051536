/* tk_core.c — the protocol core: verify and decode, reject replays, dispatch by
 * msg_type through a table, publish status busy/idle around every request,
 * answer, count executions, keep history, abort the executes a client sent
 * before it could have seen an error (stop_on_error).
 *
 * It never touches ZeroMQ: frames go out through a tk_transport table, so unit
 * tests drive it with an in-memory transport exactly as the sockets do.
 *
 * Threads: shell requests run on the shell thread; control requests (only those
 * marked control-safe in the table) on the control thread. Shared state — the
 * replay guard and iopub sends — is guarded by one mutex; the cancel and stop
 * flags are atomics.
 */
#include "tk_history.h"
#include "tk_kernel.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A failing stop_on_error cell's reply is held while requests keep
 * arriving: until none has come for TK_DRAIN_QUIET_S, at most TK_DRAIN_MAX_S.
 * A browser's Run All sends its requests in one pass of its event loop, but
 * a busy page spreads them over milliseconds each; while the reply is held,
 * nothing that arrives can be a reaction to it. */
#define TK_DRAIN_QUIET_S 0.05
#define TK_DRAIN_MAX_S 0.5
#define TK_CLOCK_SAMPLES 16
#define TK_CLOCK_SESSIONS 8

/* What the kernel knows of one client's clock (keyed by header.session):
 * kernel monotonic time minus header.date of its last shell messages. */
typedef struct clock_est {
    char session[64];
    double off[TK_CLOCK_SAMPLES];
    int n, next;
    unsigned long used;     /* LRU stamp */
} clock_est;

struct tk_core {
    tk_signer *signer;
    tk_replay *replay;
    tk_history *hist;
    tk_interp interp;
    tk_transport tr;
    pthread_mutex_t lock;   /* replay + iopub */
    char session[40];
    int exec_count;
    /* stop_on_error, shell thread only: when the last stop_on_error cell
     * published its error (monotonic s), and the clock estimates per client */
    int aborting;
    int draining;           /* draining the shell queue at an error: every execute is aborted */
    double error_at;
    double grace;           /* s: tk_core_opts.stop_on_error_timeout */
    clock_est clocks[TK_CLOCK_SESSIONS];
    unsigned long clock_tick;
    atomic_int cancel;
    atomic_int stop, restart;
    atomic_ulong dropped, refused;
    size_t max_bytes;       /* tk_core_opts.max_message_bytes */
};

typedef struct req { tk_core *c; tk_channel ch; tk_msg *m; } req;

static double now_mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* header.date (ISO 8601 with "Z", an offset, or none: read as UTC) in
 * seconds since 1970 into *t; 0, or -1 when missing or unreadable. Only
 * differences between one client's dates are used, so a wrong zone cancels. */
static int header_date(const tk_msg *m, double *t) {
    const char *d = json_string_value(json_object_get(m->header, "date"));
    struct tm tm = {0};
    double sec = 0;
    int n = 0;
    if (!d || sscanf(d, "%4d-%2d-%2dT%2d:%2d:%lf%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                     &tm.tm_min, &sec, &n) != 6)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    double off = 0;
    const char *z = d + n;
    int oh, om;
    if (*z == '+' || *z == '-') {
        if (sscanf(z + 1, "%2d:%2d", &oh, &om) != 2) return -1;
        off = (*z == '+' ? 1 : -1) * (oh * 3600.0 + om * 60.0);
    } else if (*z != 'Z' && *z != 0) {
        return -1;
    }
    *t = (double)timegm(&tm) + sec - off;
    return 0;
}

/* The clock of the client that sent m: the session's estimate, taken over
 * when the session is new (least recently used one). */
static clock_est *client_clock(tk_core *c, const tk_msg *m) {
    const char *sid = json_string_value(json_object_get(m->header, "session"));
    if (!sid) sid = "";
    clock_est *e = &c->clocks[0];
    for (int i = 0; i < TK_CLOCK_SESSIONS; i++) {
        if (!strncmp(c->clocks[i].session, sid, sizeof c->clocks[i].session - 1)) { e = &c->clocks[i]; goto found; }
        if (c->clocks[i].used < e->used) e = &c->clocks[i];
    }
    memset(e, 0, sizeof *e);
    snprintf(e->session, sizeof e->session, "%s", sid);
found:
    e->used = ++c->clock_tick;
    return e;
}

/* Records when a dated shell message was taken off the queue: offset =
 * kernel monotonic time - client date = clock difference + the message's
 * delay, so the smallest recent offset bounds the clock difference from
 * above. The last TK_CLOCK_SAMPLES only, so a client's clock stepped back
 * is forgotten after that many messages. */
static void clock_sample(tk_core *c, const tk_msg *m) {
    double d;
    if (header_date(m, &d)) return;
    clock_est *e = client_clock(c, m);
    e->off[e->next] = now_mono() - d;
    e->next = (e->next + 1) % TK_CLOCK_SAMPLES;
    if (e->n < TK_CLOCK_SAMPLES) e->n++;
}

/* Whether the client sent execute request m before it could have seen the
 * error published at c->error_at. The request was sent, in kernel time, at
 * date + clock difference <= date + smallest offset; if that is before the
 * error went out, the client cannot have known of it, however long the
 * request then took to arrive. A request sent after the client received the
 * error has date + smallest offset >= error_at. Between the two, while the
 * error is on its way, a burst member and a script's immediate follow-up
 * look alike: the grace window (ipykernel's stop_on_error_timeout, 0 by
 * default as there) aborts what was sent within it. Undated requests are
 * judged by when they are taken off the queue instead. */
static int sent_before_error(tk_core *c, const tk_msg *m, double *after) {
    double d;
    if (header_date(m, &d)) {
        *after = now_mono() - c->error_at;
        return *after < c->grace;
    }
    clock_est *e = client_clock(c, m);
    double best = 0;
    for (int i = 0; i < e->n; i++)
        if (i == 0 || e->off[i] < best) best = e->off[i];
    *after = d + best - c->error_at;
    return e->n > 0 && *after < c->grace;
}

static void logbad(tk_core *c, tk_channel ch, const char *why) {
    static const char *names[] = {"shell", "control", "stdin", "iopub"};
    atomic_fetch_add(&c->dropped, 1);
    fprintf(stderr, "txkernel: dropped a message on %s: %s\n", names[ch], why);
}

/* Sends msg_type with content (borrowed) on ch; route gives identities. */
static void send_msg(tk_core *c, tk_channel ch, const tk_msg *route, json_t *parent,
                     const char *msg_type, json_t *content, json_t *metadata) {
    json_t *h = tk_msg_header_new(c->session, msg_type);
    json_t *md = metadata ? json_incref(metadata) : json_object();
    json_t *empty = parent ? NULL : json_object();
    tk_frame *f = NULL;
    size_t n = 0;
    int rc = h && md ? tk_msg_encode(c->signer, route, h, parent ? parent : empty, md, content, &f, &n) : -1;
    if (rc == 0) {
        if (ch == TK_CH_IOPUB) pthread_mutex_lock(&c->lock);
        c->tr.send(c->tr.self, ch, f, n);
        if (ch == TK_CH_IOPUB) pthread_mutex_unlock(&c->lock);
    } else {
        fprintf(stderr, "txkernel: out of memory encoding %s\n", msg_type);
    }
    tk_frames_free(f, n);
    json_decref(h);
    json_decref(md);
    json_decref(empty);
}

static void publish(tk_core *c, json_t *parent, const char *msg_type, json_t *content) {
    char topic[96];
    snprintf(topic, sizeof topic, "kernel.%s.%s", c->session, msg_type);
    uint8_t *ids[1] = {(uint8_t *)topic};
    size_t lens[1] = {strlen(topic)};
    tk_msg route = {.nids = 1, .ids = ids, .id_lens = lens};
    send_msg(c, TK_CH_IOPUB, &route, parent, msg_type, content, NULL);
}

static void publish_new(tk_core *c, json_t *parent, const char *msg_type, json_t *content) {
    if (content) publish(c, parent, msg_type, content);
    json_decref(content);
}

static void status(tk_core *c, json_t *parent, const char *state) {
    publish_new(c, parent, "status", json_pack("{s:s}", "execution_state", state));
}

/* reply content is stolen */
static void reply(req *r, const char *type, json_t *content) {
    json_t *md = json_pack("{s:s}", "status", json_string_value(json_object_get(content, "status")) ?: "ok");
    send_msg(r->c, r->ch, r->m, r->m->header, type, content, md);
    json_decref(md);
    json_decref(content);
}

static void reply_error(req *r, const char *type, const char *evalue) {
    fprintf(stderr, "txkernel: bad %s: %s\n", r->m->msg_type, evalue);
    reply(r, type, json_pack("{s:s,s:s,s:s,s:[]}", "status", "error", "ename", "ProtocolError",
                             "evalue", evalue, "traceback"));
}

/* ---- the output sink given to the interpreter ---------------------------- */

typedef struct exec_out {
    tk_out base;
    req *r;
    int count, silent;
    json_t *payload;     /* array */
    json_t *error;       /* {ename, evalue, traceback} of the first error, or NULL */
    double error_at;     /* monotonic s when that error was published */
    char *result_text;   /* text/plain of the last execute_result, for history */
} exec_out;

static void o_stream(tk_out *o, const char *name, const char *text) {
    exec_out *x = (exec_out *)o;
    publish_new(x->r->c, x->r->m->header, "stream", json_pack("{s:s,s:s}", "name", name, "text", text));
}

static void o_display(tk_out *o, json_t *data, json_t *metadata, const char *display_id, int update) {
    exec_out *x = (exec_out *)o;
    json_t *c = json_pack("{s:O,s:o}", "data", data, "metadata", metadata ? json_incref(metadata) : json_object());
    if (c && display_id) json_object_set_new(c, "transient", json_pack("{s:s}", "display_id", display_id));
    publish_new(x->r->c, x->r->m->header, update && display_id ? "update_display_data" : "display_data", c);
}

static void o_result(tk_out *o, json_t *data, json_t *metadata) {
    exec_out *x = (exec_out *)o;
    const char *t = json_string_value(json_object_get(data, "text/plain"));
    if (t) { free(x->result_text); x->result_text = strdup(t); }
    if (x->silent) return;
    publish_new(x->r->c, x->r->m->header, "execute_result",
                json_pack("{s:i,s:O,s:o}", "execution_count", x->count, "data", data, "metadata",
                          metadata ? json_incref(metadata) : json_object()));
}

static void o_clear(tk_out *o, int wait) {
    exec_out *x = (exec_out *)o;
    publish_new(x->r->c, x->r->m->header, "clear_output", json_pack("{s:b}", "wait", wait));
}

static void o_error(tk_out *o, const char *ename, const char *evalue, json_t *tb) {
    exec_out *x = (exec_out *)o;
    if (x->error) { /* one cell, one error: the reply can carry only one */
        fprintf(stderr, "txkernel: a second error in one cell was not sent: %s: %s\n", ename, evalue);
        return;
    }
    json_t *e = json_pack("{s:s,s:s,s:o}", "ename", ename, "evalue", evalue, "traceback",
                          tb ? json_incref(tb) : json_pack("[s]", evalue));
    if (!e) return;
    json_decref(x->error);
    x->error = e;
    x->error_at = now_mono();
    publish(x->r->c, x->r->m->header, "error", e);
}

static void o_page(tk_out *o, json_t *data) {
    exec_out *x = (exec_out *)o;
    json_array_append_new(x->payload, json_pack("{s:s,s:O,s:i}", "source", "page", "data", data, "start", 0));
}

static const tk_out_ops exec_out_ops = {o_stream, o_display, o_result, o_clear, o_error, o_page};

/* ---- handlers ------------------------------------------------------------ */

static int want_bool(json_t *content, const char *key, int dflt) {
    json_t *v = json_object_get(content, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* code-point offset -> byte offset in UTF-8 text (clamped to the end) */
static size_t cp_to_byte(const char *s, long cp) {
    size_t b = 0;
    for (long k = 0; s[b] && k < cp; k++) {
        b++;
        while (s[b] && ((unsigned char)s[b] & 0xC0) == 0x80) b++;
    }
    return b;
}

static long byte_to_cp(const char *s, size_t b) {
    long k = 0;
    for (size_t i = 0; i < b && s[i]; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

/* stop_on_error: 1 after answering r "aborted" when the client sent it
 * before it could have seen the last error; 0 when it is to run. */
static int aborted_by_error(req *r) {
    tk_core *c = r->c;
    if (!c->aborting) return 0;
    double after = 0;
    if (c->draining) {
        fprintf(stderr, "txkernel: aborted an execute that was waiting when the last error went out (stop_on_error)\n");
        reply(r, "execute_reply", json_pack("{s:s}", "status", "aborted"));
        return 1;
    }
    if (sent_before_error(c, r->m, &after)) {
        fprintf(stderr, "txkernel: aborted an execute sent %+.3f s from the last error (stop_on_error)\n", after);
        /* no execution_count, as the spec says for aborted replies and
         * ipykernel does: JupyterLab would show the count on the cell */
        reply(r, "execute_reply", json_pack("{s:s}", "status", "aborted"));
        return 1;
    }
    /* the client has gone on after the error */
    fprintf(stderr, "txkernel: ran an execute sent %+.3f s from the last error (stop_on_error ends)\n", after);
    c->aborting = 0;
    return 0;
}

/* The error reply of an execute that failed: error is {ename, evalue,
 * traceback} (borrowed), published on iopub at error_at. With stop_on_error
 * what waits on the queue is aborted first. */
static void execute_failed(req *r, json_t *error, double error_at, int stop_on_error, int count) {
    tk_core *c = r->c;
    json_t *rep = json_deep_copy(error);
    json_object_set_new(rep, "status", json_string("error"));
    json_object_set_new(rep, "execution_count", json_integer(count));
    if (stop_on_error) {
        c->aborting = 1;
        c->error_at = error_at;
        /* What waits on the queue before this reply goes out was sent
         * before the client could have read it (ipykernel aborts the
         * same: its queue at the error). Dates judge what comes later.
         * The drained requests are answered first, each with its own
         * busy/idle; clients match replies by msg_id. */
        if (c->tr.drain && r->ch == TK_CH_SHELL && !c->draining) {
            c->draining = 1;
            c->tr.drain(c->tr.self, TK_CH_SHELL, TK_DRAIN_QUIET_S, TK_DRAIN_MAX_S);
            c->draining = 0;
        }
    }
    reply(r, "execute_reply", rep);
}

/* An execute the kernel cannot take (too large, undecodable, a NUL in its
 * code): nothing runs; the client sees the reason as the cell's error, on
 * iopub and in the reply, as it would see a cell's own error, and
 * stop_on_error (the default when the content cannot be read) applies. */
static void refuse_execute(req *r, const char *why) {
    tk_core *c = r->c;
    fprintf(stderr, "txkernel: refused execute_request %.64s: %s\n", r->m->msg_id, why);
    atomic_fetch_add(&c->refused, 1);
    if (aborted_by_error(r)) return;
    json_t *e = json_pack("{s:s,s:s,s:[s]}", "ename", "MessageError", "evalue", why, "traceback", why);
    if (!e) return;
    publish(c, r->m->header, "error", e);
    execute_failed(r, e, now_mono(), r->m->content ? want_bool(r->m->content, "stop_on_error", 1) : 1,
                   c->exec_count);
    json_decref(e);
}

static void h_execute(req *r) {
    tk_core *c = r->c;
    json_t *ct = r->m->content;
    json_t *cv = json_object_get(ct, "code");
    const char *code = json_string_value(cv);
    if (!code) { reply_error(r, "execute_reply", "content.code must be a string"); return; }
    if (strlen(code) != json_string_length(cv)) {
        char why[256];
        snprintf(why, sizeof why, "content.code holds a NUL character (\\u0000) at code point %ld: a cell is text "
                 "without NULs (Python refuses them too: source code cannot contain null bytes)",
                 byte_to_cp(code, strlen(code)));
        refuse_execute(r, why);
        return;
    }
    if (aborted_by_error(r)) return;
    int silent = want_bool(ct, "silent", 0);
    int store = silent ? 0 : want_bool(ct, "store_history", 1);
    int stop_on_error = want_bool(ct, "stop_on_error", 1);
    tk_exec_opts eo = {.silent = silent, .store_history = store,
                       .allow_stdin = want_bool(ct, "allow_stdin", 0),
                       .execution_count = store ? c->exec_count + 1 : c->exec_count};
    if (store) c->exec_count++;
    if (!silent)
        publish_new(c, r->m->header, "execute_input",
                    json_pack("{s:s,s:i}", "code", code, "execution_count", eo.execution_count));
    exec_out x = {.base = {&exec_out_ops, NULL}, .r = r, .count = eo.execution_count,
                  .silent = silent, .payload = json_array()};
    atomic_store(&c->cancel, 0);
    int rc = c->interp.execute ? c->interp.execute(c->interp.self, code, &eo, &x.base, &c->cancel) : 0;
    if (rc != 0 && !x.error)
        o_error(&x.base, "Error", "the cell failed without saying why", NULL);
    if (store && c->hist) tk_history_add(c->hist, eo.execution_count, code, x.result_text);
    if (x.error)
        execute_failed(r, x.error, x.error_at, stop_on_error, eo.execution_count);
    else
        reply(r, "execute_reply", json_pack("{s:s,s:i,s:O,s:{}}", "status", "ok", "execution_count",
                                            eo.execution_count, "payload", x.payload, "user_expressions"));
    json_decref(x.payload);
    json_decref(x.error);
    free(x.result_text);
}

static int get_code_cursor(req *r, const char *reply_type, const char **code, size_t *cursor) {
    json_t *ct = r->m->content, *cp = json_object_get(ct, "cursor_pos");
    json_t *cv = json_object_get(ct, "code");
    *code = json_string_value(cv);
    if (!*code) { reply_error(r, reply_type, "content.code must be a string"); return -1; }
    if (strlen(*code) != json_string_length(cv)) {
        reply_error(r, reply_type, "content.code holds a NUL character (\\u0000)");
        return -1;
    }
    if (cp && !json_is_null(cp) && !json_is_integer(cp)) {
        reply_error(r, reply_type, "content.cursor_pos must be an integer");
        return -1;
    }
    long pos = json_is_integer(cp) ? (long)json_integer_value(cp) : (long)strlen(*code);
    *cursor = cp_to_byte(*code, pos < 0 ? 0 : pos);
    return 0;
}

static void h_complete(req *r) {
    const char *code;
    size_t cur;
    if (get_code_cursor(r, "complete_reply", &code, &cur)) return;
    json_t *matches = json_array();
    size_t start = cur, end = cur;
    if (r->c->interp.complete) r->c->interp.complete(r->c->interp.self, code, cur, matches, &start, &end);
    reply(r, "complete_reply", json_pack("{s:s,s:o,s:i,s:i,s:{}}", "status", "ok", "matches", matches,
                                         "cursor_start", (int)byte_to_cp(code, start), "cursor_end",
                                         (int)byte_to_cp(code, end), "metadata"));
}

static void h_inspect(req *r) {
    const char *code;
    size_t cur;
    if (get_code_cursor(r, "inspect_reply", &code, &cur)) return;
    json_t *dl = json_object_get(r->m->content, "detail_level");
    json_t *data = json_object();
    int found = r->c->interp.inspect
                    ? r->c->interp.inspect(r->c->interp.self, code, cur, json_is_integer(dl) ? (int)json_integer_value(dl) : 0, data)
                    : 0;
    reply(r, "inspect_reply", json_pack("{s:s,s:b,s:o,s:{}}", "status", "ok", "found", found, "data", data, "metadata"));
}

static void h_is_complete(req *r) {
    const char *code = json_string_value(json_object_get(r->m->content, "code"));
    if (!code) { reply_error(r, "is_complete_reply", "content.code must be a string"); return; }
    const char *indent = "";
    const char *st = r->c->interp.is_complete ? r->c->interp.is_complete(r->c->interp.self, code, &indent) : "unknown";
    json_t *rep = json_pack("{s:s}", "status", st);
    if (!strcmp(st, "incomplete")) json_object_set_new(rep, "indent", json_string(indent ? indent : ""));
    reply(r, "is_complete_reply", rep);
}

static void h_history(req *r) {
    const char *why = "history is off";
    json_t *h = r->c->hist ? tk_history_query(r->c->hist, r->m->content, &why) : NULL;
    if (!h) { reply_error(r, "history_reply", why); return; }
    reply(r, "history_reply", json_pack("{s:s,s:o}", "status", "ok", "history", h));
}

static void h_kernel_info(req *r) {
    json_t *ct = json_pack("{s:s,s:s,s:s,s:s,s:b}", "status", "ok", "protocol_version", TK_PROTOCOL_VERSION,
                           "implementation", "txkernel", "implementation_version", TK_KERNEL_VERSION,
                           "debugger", 0);
    if (r->c->interp.kernel_info) r->c->interp.kernel_info(r->c->interp.self, ct);
    if (!json_object_get(ct, "language_info"))
        json_object_set_new(ct, "language_info", json_pack("{s:s,s:s,s:s}", "name", "txkernel",
                                                           "version", TK_KERNEL_VERSION, "file_extension", ".txk"));
    if (!json_object_get(ct, "banner")) json_object_set_new(ct, "banner", json_string("txkernel"));
    reply(r, "kernel_info_reply", ct);
}

static void h_comm_info(req *r) {
    reply(r, "comm_info_reply", json_pack("{s:s,s:{}}", "status", "ok", "comms"));
}

static void h_comm_open(req *r) {
    /* No comm targets exist: close it at once so the frontend does not wait. */
    const char *id = json_string_value(json_object_get(r->m->content, "comm_id"));
    const char *target = json_string_value(json_object_get(r->m->content, "target_name"));
    fprintf(stderr, "txkernel: no comm target \"%s\"; closing comm\n", target ? target : "?");
    if (id) publish_new(r->c, r->m->header, "comm_close", json_pack("{s:s,s:{}}", "comm_id", id, "data"));
}

static void h_comm_ignore(req *r) { (void)r; }

static void h_shutdown(req *r) {
    int restart = want_bool(r->m->content, "restart", 0);
    json_t *ct = json_pack("{s:s,s:b}", "status", "ok", "restart", restart);
    publish(r->c, r->m->header, "shutdown_reply", ct); /* protocol 5.4 also broadcasts it */
    reply(r, "shutdown_reply", ct);
    atomic_store(&r->c->restart, restart);
    atomic_store(&r->c->cancel, 1);
    atomic_store(&r->c->stop, 1);
}

static void h_interrupt(req *r) {
    atomic_store(&r->c->cancel, 1);
    reply(r, "interrupt_reply", json_pack("{s:s}", "status", "ok"));
}

typedef struct handler {
    const char *type;
    void (*fn)(req *r);
    int control_ok;   /* safe to run on the control thread while a cell runs */
    int status;       /* publish busy/idle around it */
} handler;

static const handler HANDLERS[] = {
    {"execute_request", h_execute, 0, 1},
    {"complete_request", h_complete, 0, 1},
    {"inspect_request", h_inspect, 0, 1},
    {"is_complete_request", h_is_complete, 0, 1},
    {"history_request", h_history, 0, 1},
    {"kernel_info_request", h_kernel_info, 1, 1},
    {"comm_info_request", h_comm_info, 1, 1},
    {"comm_open", h_comm_open, 0, 1},
    {"comm_msg", h_comm_ignore, 0, 1},
    {"comm_close", h_comm_ignore, 0, 1},
    {"shutdown_request", h_shutdown, 1, 1},
    {"interrupt_request", h_interrupt, 1, 1},
};

/* A request whose header was read but whose rest cannot be taken
 * (m->refused says why): its reply says so; a message type with no reply
 * (comm_msg, comm_close) can only be logged. */
static void refuse(req *r) {
    const char *type = r->m->msg_type;
    size_t tl = strlen(type);
    if (!strcmp(type, "execute_request")) { refuse_execute(r, r->m->refused); return; }
    if (tl <= 8 || strcmp(type + tl - 8, "_request")) {
        char why[800];
        snprintf(why, sizeof why, "%.64s has no reply to carry the reason: %s", type, r->m->refused);
        logbad(r->c, r->ch, why);
        return;
    }
    char rt[96];
    snprintf(rt, sizeof rt, "%.*s_reply", (int)(tl - 8 < 80 ? tl - 8 : 80), type);
    atomic_fetch_add(&r->c->refused, 1);
    fprintf(stderr, "txkernel: refused %s %.64s: %s\n", type, r->m->msg_id, r->m->refused);
    reply(r, rt, json_pack("{s:s,s:s,s:s,s:[s]}", "status", "error", "ename", "MessageError", "evalue",
                           r->m->refused, "traceback", r->m->refused));
}

void tk_core_handle(tk_core *c, tk_channel ch, const tk_frame *frames, size_t n) {
    tk_kerr err = {{0}};
    tk_msg *m = tk_msg_decode_max(c->signer, frames, n, c->max_bytes, &err);
    if (!m) { logbad(c, ch, err.msg); return; }
    pthread_mutex_lock(&c->lock);
    int replayed = tk_replay_check(c->replay, m->replay_key, m->replay_key_len);
    pthread_mutex_unlock(&c->lock);
    if (replayed) {
        snprintf(err.msg, sizeof err.msg, "message %.64s was received before (replayed signature); not run again", m->msg_id);
        logbad(c, ch, err.msg);
        tk_msg_destroy(&m);
        return;
    }
    const handler *h = NULL;
    for (size_t i = 0; i < sizeof HANDLERS / sizeof *HANDLERS; i++)
        if (!strcmp(HANDLERS[i].type, m->msg_type)) { h = &HANDLERS[i]; break; }
    if (!h || (ch == TK_CH_CONTROL && !h->control_ok) || ch == TK_CH_STDIN || ch == TK_CH_IOPUB) {
        snprintf(err.msg, sizeof err.msg, "message type \"%.64s\" is not served on this channel", m->msg_type);
        logbad(c, ch, err.msg);
        tk_msg_destroy(&m);
        return;
    }
    /* drained messages are judged without their dates, and their offsets
     * hold the time they waited: they teach the clock estimate nothing */
    if (ch == TK_CH_SHELL && !c->draining) clock_sample(c, m);
    req r = {c, ch, m};
    if (h->status) status(c, m->header, "busy");
    if (m->refused[0]) refuse(&r);
    else h->fn(&r);
    if (h->status) status(c, m->header, "idle");
    tk_msg_destroy(&m);
}

int tk_core_aborting(tk_core *c) { return c->aborting; }

void tk_core_starting(tk_core *c) { status(c, NULL, "starting"); }

void tk_core_publish(tk_core *c, const char *msg_type, json_t *content) { publish(c, NULL, msg_type, content); }

atomic_int *tk_core_cancel_flag(tk_core *c) { return &c->cancel; }

int tk_core_should_stop(tk_core *c, int *restart) {
    if (restart) *restart = atomic_load(&c->restart);
    return atomic_load(&c->stop);
}

unsigned long tk_core_dropped(tk_core *c) { return atomic_load(&c->dropped); }
unsigned long tk_core_refused(tk_core *c) { return atomic_load(&c->refused); }
int tk_core_execution_count(tk_core *c) { return c->exec_count; }
const char *tk_core_session(tk_core *c) { return c->session; }

tk_core *tk_core_new(const tk_core_opts *o, tk_kerr *err) {
    tk_core *c = calloc(1, sizeof *c);
    if (!c) goto oom;
    pthread_mutex_init(&c->lock, NULL);
    c->interp = o->interp;
    c->grace = o->stop_on_error_timeout;
    c->max_bytes = o->max_message_bytes ? o->max_message_bytes : TK_MSG_MAX_BYTES;
    c->tr = o->transport;
    c->signer = tk_signer_new(o->key, o->key_len);
    c->replay = tk_replay_new();
    if (!c->signer || !c->replay) goto oom;
    char path[4096];
    if (o->history_path) snprintf(path, sizeof path, "%s", o->history_path);
    else tk_history_default_path(path, sizeof path);
    c->hist = tk_history_open(path);
    if (!c->hist) goto oom;
    json_t *h = tk_msg_header_new("", "x"); /* borrow its uuid as our session id */
    snprintf(c->session, sizeof c->session, "%s", json_string_value(json_object_get(h, "msg_id")));
    json_decref(h);
    return c;
oom:
    if (err) snprintf(err->msg, sizeof err->msg, "out of memory creating the kernel core");
    tk_core_destroy(&c);
    return NULL;
}

void tk_core_destroy(tk_core **pc) {
    if (!pc || !*pc) return;
    tk_core *c = *pc;
    tk_signer_destroy(&c->signer);
    tk_replay_destroy(&c->replay);
    tk_history_close(&c->hist);
    pthread_mutex_destroy(&c->lock);
    free(c);
    *pc = NULL;
}
