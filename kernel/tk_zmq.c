/* tk_zmq.c — the ZeroMQ transport: reads the connection file, binds shell,
 * control and stdin (ROUTER), iopub (XPUB) and heartbeat (REP) over tcp or ipc
 * (ipc://{ip}-{port}), and feeds raw frames to the core.
 *
 * Threads: shell and stdin on the calling thread; control on its own thread so
 * interrupt_request and shutdown_request are answered while a cell runs;
 * heartbeat echo on its own thread. iopub is shared: every use of it (sends from
 * shell or control, subscription reads) happens under iopub_lock, because a
 * ZeroMQ socket must not be used by two threads at once.
 *
 * Signals: SIGINT sets the core's cancel flag (interrupt_mode "signal"); SIGTERM
 * asks for a clean exit. No handler does more than store to an atomic.
 */
#include "tk_kernel.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#define POLL_MS 50
/* stop_on_error: executes sent before an error are aborted; with a grace
 * window, so are those sent (or, undated, taken) that long after it.
 * TXKERNEL_STOP_ON_ERROR_TIMEOUT (seconds, e.g. in the kernelspec's "env")
 * sets it, like ipykernel's stop_on_error_timeout, whose default it keeps:
 * a window also aborts a script's request sent right after it read the
 * error. */
#define STOP_ON_ERROR_TIMEOUT_S 0.0
#define MAX_FRAMES 256
#define TK_TRIM_AFTER_BYTES ((size_t)4 << 20)

typedef struct zt {
    void *ctx;
    void *sock[TK_CH_COUNT];
    void *hb;
    pthread_mutex_t iopub_lock;
    tk_core *core;
    atomic_int quit;
} zt;

static atomic_int *g_cancel;
static atomic_int g_term;

static void on_sigint(int sig) { (void)sig; if (g_cancel) atomic_store(g_cancel, 1); }
static void on_sigterm(int sig) { (void)sig; atomic_store(&g_term, 1); }

static void zt_send(void *self, tk_channel ch, const tk_frame *f, size_t n) {
    zt *t = self;
    if (ch == TK_CH_IOPUB) pthread_mutex_lock(&t->iopub_lock);
    for (size_t i = 0; i < n; i++)
        if (zmq_send(t->sock[ch], f[i].data, f[i].len, i + 1 < n ? ZMQ_SNDMORE : 0) < 0) {
            fprintf(stderr, "txkernel: send failed: %s\n", zmq_strerror(errno));
            break;
        }
    if (ch == TK_CH_IOPUB) pthread_mutex_unlock(&t->iopub_lock);
}

/* Receives one multipart message (non-blocking) and hands it to the core.
 * Returns 1 if a message was read, 0 if none was waiting. */
static int pump(zt *t, tk_channel ch) {
    zmq_msg_t parts[MAX_FRAMES];
    tk_frame frames[MAX_FRAMES];
    size_t n = 0;
    int more = 1, got = 0, too_many = 0;
    while (more) {
        zmq_msg_t tmp, *m = n < MAX_FRAMES ? &parts[n] : &tmp;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, t->sock[ch], got ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            break;
        }
        got = 1;
        more = zmq_msg_more(m);
        if (n < MAX_FRAMES) {
            frames[n].data = zmq_msg_data(m);
            frames[n].len = zmq_msg_size(m);
            n++;
        } else {
            too_many = 1;
            zmq_msg_close(m);
        }
    }
    /* Frames past MAX_FRAMES can only be binary buffers after the content
     * (or routing identities beyond any real proxy chain): the signed parts
     * come first, so the message is still handled, and answered, without them. */
    if (too_many) fprintf(stderr, "txkernel: a message with more than %d frames: the frames after the first %d are "
                          "not read\n", MAX_FRAMES, MAX_FRAMES);
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) bytes += frames[i].len;
    if (n) tk_core_handle(t->core, ch, frames, n);
    for (size_t i = 0; i < n; i++) zmq_msg_close(&parts[i]);
#ifdef __GLIBC__
    /* a large message (a huge cell, its parse, its execute_input) leaves
     * freed heap that glibc would keep at that size: give it back */
    if (bytes > TK_TRIM_AFTER_BYTES) malloc_trim(0);
#endif
    return got;
}

/* XPUB delivers subscriptions as messages: answer each with iopub_welcome
 * (JEP 65) so a client knows its subscription is live. */
static void iopub_subscriptions(zt *t) {
    for (;;) {
        char buf[512];
        pthread_mutex_lock(&t->iopub_lock);
        int n = zmq_recv(t->sock[TK_CH_IOPUB], buf, sizeof buf, ZMQ_DONTWAIT);
        pthread_mutex_unlock(&t->iopub_lock);
        if (n < 0) return;
        if (n >= 1 && buf[0] == 1) {
            size_t len = (size_t)n > sizeof buf ? sizeof buf - 1 : (size_t)n - 1;
            json_t *sub = json_stringn(buf + 1, len); /* NULL when not UTF-8 */
            json_t *c = json_pack("{s:o}", "subscription", sub ? sub : json_string(""));
            tk_core_publish(t->core, "iopub_welcome", c);
            json_decref(c);
        }
    }
}

static int stopping(zt *t) {
    return atomic_load(&t->quit) || atomic_load(&g_term) || tk_core_should_stop(t->core, NULL);
}

/* tk_transport.drain: the messages waiting on ch, then those arriving until
 * none has come for quiet_s, for at most max_s, so a client that never
 * stops sending cannot hold the shell thread here. */
static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void zt_drain(void *self, tk_channel ch, double quiet_s, double max_s) {
    zt *t = self;
    double start = mono_s(), last = start;
    zmq_pollitem_t it = {t->sock[ch], 0, ZMQ_POLLIN, 0};
    for (;;) {
        while (pump(t, ch)) last = mono_s();
        double now = mono_s();
        double left = last + quiet_s - now;
        if (now - start + left > max_s) left = start + max_s - now;
        if (left <= 0 || stopping(t)) return;
        zmq_poll(&it, 1, (long)(left * 1000) + 1);
    }
}

static void *control_main(void *arg) {
    zt *t = arg;
    zmq_pollitem_t it = {t->sock[TK_CH_CONTROL], 0, ZMQ_POLLIN, 0};
    while (!stopping(t)) {
        if (zmq_poll(&it, 1, POLL_MS) > 0)
            while (pump(t, TK_CH_CONTROL)) {}
    }
    return NULL;
}

static void *hb_main(void *arg) {
    zt *t = arg;
    zmq_pollitem_t it = {t->hb, 0, ZMQ_POLLIN, 0};
    while (!stopping(t)) {
        if (zmq_poll(&it, 1, POLL_MS) <= 0) continue;
        /* echo every frame back unchanged; REP needs the whole request read */
        zmq_msg_t m[8];
        size_t n = 0;
        int more = 1;
        while (more) {
            zmq_msg_t tmp, *p = n < 8 ? &m[n] : &tmp;
            zmq_msg_init(p);
            if (zmq_msg_recv(p, t->hb, n ? 0 : ZMQ_DONTWAIT) < 0) { zmq_msg_close(p); break; }
            more = zmq_msg_more(p);
            if (n < 8) n++; else zmq_msg_close(p);
        }
        for (size_t i = 0; i < n; i++) zmq_msg_send(&m[i], t->hb, i + 1 < n ? ZMQ_SNDMORE : 0);
        for (size_t i = 0; i < n; i++) zmq_msg_close(&m[i]);
    }
    return NULL;
}

/* ---- connection file and sockets ---------------------------------------- */

typedef struct conn {
    char transport[16], ip[1024], key[1024];
    int port[TK_CH_COUNT], hb_port;
} conn;

static int read_conn(const char *path, conn *cf, tk_kerr *err) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        snprintf(err->msg, sizeof err->msg, "connection file %s: %s (line %d)", path, je.text, je.line);
        return -1;
    }
    static const char *ports[] = {"shell_port", "control_port", "stdin_port", "iopub_port"};
    int rc = -1;
    const char *tr = json_string_value(json_object_get(j, "transport"));
    const char *ip = json_string_value(json_object_get(j, "ip"));
    const char *key = json_string_value(json_object_get(j, "key"));
    const char *scheme = json_string_value(json_object_get(j, "signature_scheme"));
    snprintf(cf->transport, sizeof cf->transport, "%s", tr ? tr : "tcp");
    snprintf(cf->ip, sizeof cf->ip, "%s", ip ? ip : "127.0.0.1");
    snprintf(cf->key, sizeof cf->key, "%s", key ? key : "");
    if (strcmp(cf->transport, "tcp") && strcmp(cf->transport, "ipc")) {
        snprintf(err->msg, sizeof err->msg, "connection file %s: key \"transport\" is \"%s\"; txkernel serves \"tcp\" and \"ipc\"", path, cf->transport);
        goto out;
    }
    if (key && *key && scheme && strcmp(scheme, "hmac-sha256")) {
        snprintf(err->msg, sizeof err->msg, "connection file %s: key \"signature_scheme\" is \"%s\"; only \"hmac-sha256\" is supported", path, scheme);
        goto out;
    }
    for (int i = 0; i < TK_CH_COUNT; i++) {
        json_t *p = json_object_get(j, ports[i]);
        if (!json_is_integer(p)) {
            snprintf(err->msg, sizeof err->msg, "connection file %s: key \"%s\" is missing or not an integer", path, ports[i]);
            goto out;
        }
        cf->port[i] = (int)json_integer_value(p);
    }
    json_t *hb = json_object_get(j, "hb_port");
    if (!json_is_integer(hb)) {
        snprintf(err->msg, sizeof err->msg, "connection file %s: key \"hb_port\" is missing or not an integer", path);
        goto out;
    }
    cf->hb_port = (int)json_integer_value(hb);
    rc = 0;
out:
    json_decref(j);
    return rc;
}

static void *bind_sock(zt *t, const conn *cf, int type, int port, const char *what, tk_kerr *err) {
    void *s = zmq_socket(t->ctx, type);
    if (!s) {
        snprintf(err->msg, sizeof err->msg, "cannot create the %s socket: %s", what, zmq_strerror(errno));
        return NULL;
    }
    /* No ZMQ_MAXMSGSIZE: libzmq drops the connection of a larger message
     * without a word, and the client waits forever. The core answers a
     * message over the kernel's limit with an error instead. */
    int linger = 1000, one = 1;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (type == ZMQ_ROUTER) zmq_setsockopt(s, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    if (type == ZMQ_XPUB) zmq_setsockopt(s, ZMQ_XPUB_VERBOSE, &one, sizeof one);
    if (strchr(cf->ip, ':')) zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof one);
    char ep[1100];
    if (!strcmp(cf->transport, "ipc")) snprintf(ep, sizeof ep, "ipc://%s-%d", cf->ip, port);
    else snprintf(ep, sizeof ep, "tcp://%s:%d", cf->ip, port);
    if (zmq_bind(s, ep) != 0) {
        snprintf(err->msg, sizeof err->msg, "cannot bind the %s socket to %.400s: %s (is another kernel using this connection file?)",
                 what, ep, zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

int tk_kernel_serve(const char *connection_file, const tk_interp *interp, tk_kerr *err) {
    conn cf;
    if (read_conn(connection_file, &cf, err)) return -1;
    zt t = {0};
    int rc = -1, threads = 0;
    pthread_t th_ctl, th_hb;
    pthread_mutex_init(&t.iopub_lock, NULL);
    t.ctx = zmq_ctx_new();
    static const char *names[] = {"shell", "control", "stdin", "iopub"};
    static const int types[] = {ZMQ_ROUTER, ZMQ_ROUTER, ZMQ_ROUTER, ZMQ_XPUB};
    for (int i = 0; i < TK_CH_COUNT; i++)
        if (!(t.sock[i] = bind_sock(&t, &cf, types[i], cf.port[i], names[i], err))) goto out;
    if (!(t.hb = bind_sock(&t, &cf, ZMQ_REP, cf.hb_port, "heartbeat", err))) goto out;
    double grace = STOP_ON_ERROR_TIMEOUT_S;
    const char *gs = getenv("TXKERNEL_STOP_ON_ERROR_TIMEOUT");
    if (gs && *gs) {
        char *end;
        double v = strtod(gs, &end);
        if (*end || !(v >= 0) || v > 3600) {
            snprintf(err->msg, sizeof err->msg, "TXKERNEL_STOP_ON_ERROR_TIMEOUT=\"%.100s\": want seconds between 0 and 3600", gs);
            goto out;
        }
        grace = v;
    }
    size_t max_bytes = TK_MSG_MAX_BYTES;
    const char *ms = getenv("TXKERNEL_MAX_MESSAGE_BYTES");
    if (ms && *ms) {
        char *end;
        unsigned long long v = strtoull(ms, &end, 10);
        if (*end || *ms == '-' || v < 4096 || v > ((unsigned long long)1 << 40)) {
            snprintf(err->msg, sizeof err->msg, "TXKERNEL_MAX_MESSAGE_BYTES=\"%.100s\": want bytes between 4096 and 2^40", ms);
            goto out;
        }
        max_bytes = (size_t)v;
    }
    tk_core_opts co = {.key = (const uint8_t *)cf.key, .key_len = strlen(cf.key), .interp = *interp,
                       .transport = {&t, zt_send, zt_drain}, .stop_on_error_timeout = grace,
                       .max_message_bytes = max_bytes};
    if (!(t.core = tk_core_new(&co, err))) goto out;

    g_cancel = tk_core_cancel_flag(t.core);
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_sigterm;
    sigaction(SIGTERM, &sa, NULL);

    if (pthread_create(&th_ctl, NULL, control_main, &t)) { snprintf(err->msg, sizeof err->msg, "cannot start the control thread"); goto out; }
    threads |= 1;
    if (pthread_create(&th_hb, NULL, hb_main, &t)) { snprintf(err->msg, sizeof err->msg, "cannot start the heartbeat thread"); goto out; }
    threads |= 2;
    tk_core_starting(t.core);

    zmq_pollitem_t items[2] = {{t.sock[TK_CH_SHELL], 0, ZMQ_POLLIN, 0}, {t.sock[TK_CH_STDIN], 0, ZMQ_POLLIN, 0}};
    while (!stopping(&t)) {
        int n = zmq_poll(items, 2, POLL_MS);
        if (n > 0 && (items[0].revents & ZMQ_POLLIN)) {
            while (!stopping(&t) && pump(&t, TK_CH_SHELL)) {}
        }
        if (n > 0 && (items[1].revents & ZMQ_POLLIN))
            while (pump(&t, TK_CH_STDIN)) {}
        iopub_subscriptions(&t);
    }
    rc = 0;
out:
    atomic_store(&t.quit, 1);
    if (threads & 1) pthread_join(th_ctl, NULL);
    if (threads & 2) pthread_join(th_hb, NULL);
    g_cancel = NULL;
    signal(SIGINT, SIG_DFL);
    tk_core_destroy(&t.core);
    for (int i = 0; i < TK_CH_COUNT; i++) if (t.sock[i]) zmq_close(t.sock[i]);
    if (t.hb) zmq_close(t.hb);
    zmq_ctx_term(t.ctx);
    pthread_mutex_destroy(&t.iopub_lock);
    return rc;
}
