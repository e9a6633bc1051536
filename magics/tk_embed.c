/* tk_embed.c — the magics interpreter for a host process (see tk_embed.h):
 * a tk_out sink that turns every output into one JSON object for the host's
 * callback, a cancel flag, and an optional SIGINT hook for the duration of a
 * call.
 *
 * Guarantees: as in tk_embed.h. The SIGINT hook is process-wide, so only one
 * execute at a time may hold it; a second concurrent one runs without it.
 */
#define _GNU_SOURCE
#include "tk_embed.h"
#include "tk_app.h"
#include "tk_embed_trace.h"
#include "tk_host_mem.h"
#include "tk_magics.h"
#include "tk_session.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tk_embed {
    tk_magics *magics;
    tk_interp interp;
    atomic_int cancel;
    atomic_int busy;
    int count;               /* execution count, for magics that show it */
};

typedef struct sink {
    tk_out out;              /* first: the sink's ops get a tk_out * */
    tk_embed_emit_fn emit;
    void *user;
    pthread_mutex_t lock;
} sink;

/* Sends msg (taken) to the host as JSON. */
static void send_json(tk_out *o, json_t *msg) {
    sink *s = (sink *)o;
    if (!msg) return;
    char *txt = json_dumps(msg, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(msg);
    if (!txt) return;
    pthread_mutex_lock(&s->lock);
    s->emit(s->user, txt);
    pthread_mutex_unlock(&s->lock);
    free(txt);
}

static void o_stream(tk_out *o, const char *name, const char *text) {
    send_json(o, json_pack("{s:s,s:s,s:s}", "msg_type", "stream", "name", name, "text", text));
}

static void o_display(tk_out *o, json_t *data, json_t *metadata, const char *display_id, int update) {
    json_t *m = json_pack("{s:s,s:O,s:o}", "msg_type", update ? "update_display_data" : "display_data", "data", data,
                          "metadata", metadata ? json_incref(metadata) : json_object());
    if (m) json_object_set_new(m, "display_id", display_id ? json_string(display_id) : json_null());
    send_json(o, m);
}

static void o_result(tk_out *o, json_t *data, json_t *metadata) {
    send_json(o, json_pack("{s:s,s:O,s:o}", "msg_type", "execute_result", "data", data, "metadata",
                           metadata ? json_incref(metadata) : json_object()));
}

static void o_clear(tk_out *o, int wait) {
    send_json(o, json_pack("{s:s,s:b}", "msg_type", "clear_output", "wait", wait));
}

static void o_error(tk_out *o, const char *ename, const char *evalue, json_t *traceback) {
    send_json(o, json_pack("{s:s,s:s,s:s,s:o}", "msg_type", "error", "ename", ename, "evalue", evalue, "traceback",
                           traceback ? json_incref(traceback) : json_array()));
}

static void o_page(tk_out *o, json_t *data) {
    send_json(o, json_pack("{s:s,s:O}", "msg_type", "page", "data", data));
}

static const tk_out_ops SINK_OPS = {o_stream, o_display, o_result, o_clear, o_error, o_page};

const char *tk_embed_version(void) { return TK_KERNEL_VERSION; }

tk_embed *tk_embed_new(void) {
    tk_embed *e = tk_calloc(1, sizeof *e);
    if (!e) return NULL;
    if (!(e->magics = tk_magics_new())) { free(e); return NULL; }
    e->interp = tk_magics_interp(e->magics);
    return e;
}

void tk_embed_destroy(tk_embed **pe) {
    if (!pe || !*pe) return;
    tk_magics_destroy(&(*pe)->magics);
    free(*pe);
    *pe = NULL;
}

/* The flag SIGINT sets while an execute holds the hook; NULL otherwise. */
static atomic_int *_Atomic g_sigint_flag;
static atomic_int g_hook_taken;

static void on_sigint(int sig) {
    (void)sig;
    atomic_int *f = atomic_load(&g_sigint_flag);
    if (f) atomic_store(f, 1);
}

int tk_embed_execute(tk_embed *e, const char *code, int flags, tk_embed_emit_fn emit, void *user) {
    int expect = 0;
    if (!atomic_compare_exchange_strong(&e->busy, &expect, 1)) return -2;
    atomic_store(&e->cancel, 0);
    sink s = {.out = {&SINK_OPS, NULL}, .emit = emit, .user = user};
    pthread_mutex_init(&s.lock, NULL);

    struct sigaction old;
    int hooked = 0, free_hook = 0;
    if ((flags & TK_EMBED_CATCH_SIGINT) && atomic_compare_exchange_strong(&g_hook_taken, &free_hook, 1)) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint;
        sigemptyset(&sa.sa_mask);
        atomic_store(&g_sigint_flag, &e->cancel);
        hooked = sigaction(SIGINT, &sa, &old) == 0;
        if (!hooked) atomic_store(&g_hook_taken, 0);
    }
    tk_exec_opts opts = {.silent = 0, .store_history = 1, .allow_stdin = 0, .execution_count = ++e->count};
    int rc = e->interp.execute(e->interp.self, code ? code : "", &opts, &s.out, &e->cancel);
    if (hooked) {
        sigaction(SIGINT, &old, NULL);
        atomic_store(&g_sigint_flag, NULL);
        atomic_store(&g_hook_taken, 0);
    }
    pthread_mutex_destroy(&s.lock);
    atomic_store(&e->busy, 0);
    return rc ? -1 : 0;
}

void tk_embed_cancel(tk_embed *e) {
    if (e) atomic_store(&e->cancel, 1);
}

void tk_embed_reset(tk_embed *e) {
    tk_session *s = tk_magics_session(e->magics);
    if (s) tk_session_reset(s);
}

int tk_embed_set_holder(tk_embed *e, int state, unsigned long long reserved, unsigned long long allocated) {
    tk_session *s = e ? tk_magics_session(e->magics) : NULL;
    if (!s || state < TK_HOLDER_UNKNOWN || state > TK_HOLDER_HOLDS || allocated > reserved) return -1;
    tk_holder h = {.state = (tk_holder_state)state};
    if (state == TK_HOLDER_HOLDS) {
        h.reserved = (size_t)reserved;
        h.allocated = (size_t)allocated;
    }
    tk_session_set_holder(s, &h);
    return 0;
}

int tk_embed_set_traced(tk_embed *e, const char *config_yaml, const char *label, const char *note,
                        const char *trace_path, tk_trace_fn trace, void *user, double budget_s, const char *platform,
                        char *errbuf, size_t errlen) {
    tk_session *s = e ? tk_magics_session(e->magics) : NULL;
    tk_err err = {0};
    tk_config c;
    tk_config_defaults(&c);
    tk_traced_model *t = NULL;
    if (!s || !config_yaml || !trace) tk_err_set(&err, TK_EINVAL, "tk_embed_set_traced: a config and a tracer are required");
    else if (tk_config_parse_yaml(&c, config_yaml, strlen(config_yaml), "the traced model's config", &err) == TK_OK &&
             tk_config_validate(&c, &err) == TK_OK) {
        if (!(t = tk_traced_new(&c, label, note, trace, user, budget_s))) tk_err_nomem(&err, "the traced model");
        else if (trace_path && *trace_path && tk_traced_seed(t, trace_path, &err) != TK_OK) tk_traced_destroy(&t);
    }
    if (!t) {
        if (errbuf && errlen) snprintf(errbuf, errlen, "%s", err.msg[0] ? err.msg : "out of host memory");
        return -1;
    }
    tk_session_set_traced(s, t);
    if (platform && *platform) tk_session_set_platform(s, platform);
    return 0;
}

char *tk_embed_magics_json(tk_embed *e) {
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < tk_magics_count(e->magics); i++) {
        const tk_magic_def *d = tk_magics_at(e->magics, i);
        const char *kind = d->kind == TK_MAGIC_BOTH ? "both" : d->kind == TK_MAGIC_CELL ? "cell" : "line";
        char *h = tk_magic_help(d);
        json_array_append_new(arr, json_pack("{s:s,s:s,s:s,s:s}", "name", d->name, "kind", kind, "summary",
                                             d->summary, "help", h ? h : d->summary));
        free(h);
    }
    char *txt = arr ? json_dumps(arr, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(arr);
    return txt;
}

char *tk_embed_options_json(void) {
    json_t *arr = tk_app_options_json();
    char *txt = arr ? json_dumps(arr, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(arr);
    return txt;
}

char *tk_embed_complete_json(tk_embed *e, const char *code, int cursor) {
    json_t *matches = json_array();
    size_t start = (size_t)(cursor < 0 ? 0 : cursor), end = start;
    if (matches && e->interp.complete) e->interp.complete(e->interp.self, code, start, matches, &start, &end);
    json_t *r = matches ? json_pack("{s:o,s:I,s:I}", "matches", matches, "start", (json_int_t)start, "end",
                                    (json_int_t)end) : NULL;
    char *txt = r ? json_dumps(r, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(r);
    return txt;
}

void tk_embed_free(void *p) { free(p); }
