/* test_embed.c — the embedding API the Python companion binds (tk_embed.h):
 * every kind of output arrives as one JSON object in order; an error is one
 * "error" output and rc -1; tk_embed_cancel and the SIGINT hook stop a cell
 * and the host's SIGINT handler is back afterwards; a nested execute is
 * refused; the magic list has kinds. Also the shell magics' output handling
 * that needs no kernel: a UTF-8 character split across two reads arrives
 * whole, an invalid byte becomes U+FFFD, exit statuses and signals are named. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tk_embed.h"
#include "tk_magics.h"
#include "tk_test.h"

typedef struct rec {
    json_t *msgs;
    tk_embed *e;
    int nested_rc;
} rec;

static void on_emit(void *user, const char *txt) {
    rec *r = user;
    json_error_t err;
    json_t *j = json_loads(txt, 0, &err);
    TK_CHECK_MSG(j != NULL, "not JSON: %s", txt);
    if (j) json_array_append_new(r->msgs, j);
}

static const char *field(json_t *m, const char *k) { return json_string_value(json_object_get(m, k)); }

static json_t *run(tk_embed *e, const char *code, int flags, int *rc) {
    rec r = {.msgs = json_array(), .e = e};
    *rc = tk_embed_execute(e, code, flags, on_emit, &r);
    return r.msgs;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void test_outputs_in_order(void) {
    tk_embed *e = tk_embed_new();
    int rc;
    json_t *m = run(e, "%echo hi\n%echo --display d1 first\n%echo --update d1 second\n%txversion\n%clear --wait", 0, &rc);
    TK_CHECK_EQ_INT(rc, 0);
    TK_CHECK_EQ_INT(json_array_size(m), 5);
    const char *want[] = {"stream", "display_data", "update_display_data", "execute_result", "clear_output"};
    for (size_t i = 0; i < 5 && i < json_array_size(m); i++) TK_CHECK_STR(field(json_array_get(m, i), "msg_type"), want[i]);
    if (json_array_size(m) == 5) {
        TK_CHECK_STR(field(json_array_get(m, 0), "text"), "hi\n");
        TK_CHECK_STR(field(json_array_get(m, 1), "display_id"), "d1");
        TK_CHECK_STR(field(json_array_get(m, 2), "display_id"), "d1");
        TK_CHECK_STR(json_string_value(json_object_get(json_object_get(json_array_get(m, 2), "data"), "text/plain")),
                     "second");
        TK_CHECK(json_is_true(json_object_get(json_array_get(m, 4), "wait")));
    }
    json_decref(m);
    tk_embed_destroy(&e);
    TK_CHECK(e == NULL);
    tk_embed_destroy(&e);
}

static void test_error_is_one_output(void) {
    tk_embed *e = tk_embed_new();
    int rc;
    json_t *m = run(e, "%echo before\n%txplna\n%echo after", 0, &rc);
    TK_CHECK_EQ_INT(rc, -1);
    TK_CHECK_EQ_INT(json_array_size(m), 2);
    json_t *err = json_array_get(m, 1);
    TK_CHECK_STR(field(err, "msg_type"), "error");
    TK_CHECK_STR(field(err, "ename"), "UsageError");
    TK_CHECK(field(err, "evalue") && strstr(field(err, "evalue"), "did you mean %txplan"));
    json_t *tb = json_object_get(err, "traceback");
    TK_CHECK(json_array_size(tb) == 1 && !strncmp(json_string_value(json_array_get(tb, 0)), "UsageError: ", 12));
    json_decref(m);
    tk_embed_destroy(&e);
}

static void *cancel_later(void *p) {
    usleep(150 * 1000);
    tk_embed_cancel(p);
    return NULL;
}

static void *sigint_later(void *p) {
    (void)p;
    usleep(150 * 1000);
    kill(getpid(), SIGINT);
    return NULL;
}

static volatile sig_atomic_t host_sigints;
static void host_handler(int s) { (void)s; host_sigints++; }

static void test_cancel_and_sigint_hook(void) {
    tk_embed *e = tk_embed_new();
    pthread_t th;
    int rc;
    double t0 = now_s();
    pthread_create(&th, NULL, cancel_later, e);
    json_t *m = run(e, "%sleep 10", 0, &rc);
    pthread_join(th, NULL);
    TK_CHECK_EQ_INT(rc, -1);
    TK_CHECK(now_s() - t0 < 2);
    TK_CHECK(json_array_size(m) == 1 && !strcmp(field(json_array_get(m, 0), "ename"), "KeyboardInterrupt"));
    json_decref(m);

    /* the host's own handler, as Python's would be */
    struct sigaction sa, old, cur;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = host_handler;
    sigaction(SIGINT, &sa, &old);
    t0 = now_s();
    pthread_create(&th, NULL, sigint_later, NULL);
    m = run(e, "%sleep 10", TK_EMBED_CATCH_SIGINT, &rc);
    pthread_join(th, NULL);
    TK_CHECK_EQ_INT(rc, -1);
    TK_CHECK(now_s() - t0 < 2);
    TK_CHECK(json_array_size(m) == 1 && !strcmp(field(json_array_get(m, 0), "ename"), "KeyboardInterrupt"));
    TK_CHECK_EQ_INT(host_sigints, 0);
    json_decref(m);
    sigaction(SIGINT, NULL, &cur);
    TK_CHECK(cur.sa_handler == host_handler);
    kill(getpid(), SIGINT);  /* outside an execute: the host's handler again */
    TK_CHECK_EQ_INT(host_sigints, 1);
    /* the next cell starts with the flag cleared */
    m = run(e, "%echo again", 0, &rc);
    TK_CHECK_EQ_INT(rc, 0);
    json_decref(m);
    sigaction(SIGINT, &old, NULL);
    tk_embed_destroy(&e);
}

static void nested_emit(void *user, const char *txt) {
    rec *r = user;
    (void)txt;
    r->nested_rc = tk_embed_execute(r->e, "%echo inner", 0, on_emit, r);
}

static void test_nested_execute_refused(void) {
    tk_embed *e = tk_embed_new();
    rec r = {.msgs = json_array(), .e = e};
    TK_CHECK_EQ_INT(tk_embed_execute(e, "%echo outer", 0, nested_emit, &r), 0);
    TK_CHECK_EQ_INT(r.nested_rc, -2);
    TK_CHECK_EQ_INT(json_array_size(r.msgs), 0);
    json_decref(r.msgs);
    tk_embed_destroy(&e);
}

static void test_magic_list_and_completion(void) {
    tk_embed *e = tk_embed_new();
    char *s = tk_embed_magics_json(e);
    json_t *arr = s ? json_loads(s, 0, NULL) : NULL;
    tk_embed_free(s);
    int found = 0;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *d = json_array_get(arr, i);
        const char *n = field(d, "name"), *k = field(d, "kind");
        if (!strcmp(n, "txtrain")) found += !strcmp(k, "both");
        if (!strcmp(n, "bash")) found += !strcmp(k, "cell");
        if (!strcmp(n, "cd")) found += !strcmp(k, "line");
    }
    TK_CHECK_EQ_INT(found, 3);
    json_decref(arr);
    s = tk_embed_complete_json(e, "%txpl", 5);
    json_t *c = s ? json_loads(s, 0, NULL) : NULL;
    tk_embed_free(s);
    TK_CHECK(c && json_array_size(json_object_get(c, "matches")) == 1);
    TK_CHECK_STR(json_string_value(json_array_get(json_object_get(c, "matches"), 0)), "%txplan");
    TK_CHECK_EQ_INT(json_integer_value(json_object_get(c, "start")), 0);
    json_decref(c);
    tk_embed_destroy(&e);
}

/* all stdout text of a cell, joined */
static char *stdout_of(json_t *m) {
    size_t cap = 1, n = 0;
    for (size_t i = 0; i < json_array_size(m); i++)
        if (!strcmp(field(json_array_get(m, i), "msg_type"), "stream")) cap += strlen(field(json_array_get(m, i), "text"));
    char *s = calloc(1, cap);
    for (size_t i = 0; s && i < json_array_size(m); i++)
        if (!strcmp(field(json_array_get(m, i), "msg_type"), "stream")) {
            const char *t = field(json_array_get(m, i), "text");
            memcpy(s + n, t, strlen(t));
            n += strlen(t);
        }
    return s;
}

static void test_shell_utf8_and_status(void) {
    tk_embed *e = tk_embed_new();
    int rc;
    /* é (C3 A9) split across two writes with a pause between; FF is invalid */
    json_t *m = run(e, "!printf 'caf\\303'; sleep 0.2; printf '\\251 \\377\\n'", 0, &rc);
    TK_CHECK_EQ_INT(rc, 0);
    char *s = stdout_of(m);
    TK_CHECK_STR(s, "caf\xc3\xa9 \xef\xbf\xbd\n");
    TK_CHECK(json_array_size(m) >= 2);  /* streamed: "caf" came before the rest */
    free(s);
    json_decref(m);
    m = run(e, "!exit 3", 0, &rc);
    TK_CHECK_EQ_INT(rc, -1);
    TK_CHECK(json_array_size(m) == 1 && strstr(field(json_array_get(m, 0), "evalue"), "exited with status 3"));
    json_decref(m);
    m = run(e, "!kill -TERM $$", 0, &rc);
    TK_CHECK_EQ_INT(rc, -1);
    TK_CHECK(json_array_size(m) == 1 && strstr(field(json_array_get(m, 0), "evalue"), "killed by signal 15"));
    json_decref(m);
    m = run(e, "%%sh\necho a\necho b >&2\n", 0, &rc);
    TK_CHECK_EQ_INT(rc, 0);
    TK_CHECK_EQ_INT(json_array_size(m), 2);
    json_decref(m);
    tk_embed_destroy(&e);
}

/* The host's report of what PyTorch in its process holds: checked, shown by
 * %txdevice, kept across a reset (it is the host's), replaced by the next. */
static void test_holder_report(void) {
    tk_embed *e = tk_embed_new();
    TK_CHECK_EQ_INT(tk_embed_set_holder(e, 4, 1ull << 30, 2ull << 30), -1); /* allocated > reserved */
    TK_CHECK_EQ_INT(tk_embed_set_holder(e, 5, 0, 0), -1);
    TK_CHECK_EQ_INT(tk_embed_set_holder(e, -1, 0, 0), -1);
    TK_CHECK_EQ_INT(tk_embed_set_holder(e, 4, 3ull << 30, 1ull << 29), 0);
    tk_embed_reset(e);
    int rc;
    json_t *m = run(e, "%txdevice", 0, &rc);
    TK_CHECK_EQ_INT(rc, 0);
    char *all = json_dumps(m, 0);
    TK_CHECK_MSG(all && strstr(all, "PyTorch caching allocator in this process: 3.00 GiB reserved, 512.00 MiB allocated"),
                 "%s", all ? all : "(null)");
    free(all);
    json_decref(m);
    TK_CHECK_EQ_INT(tk_embed_set_holder(e, 2, 0, 0), 0);
    m = run(e, "%txdevice", 0, &rc);
    all = json_dumps(m, 0);
    TK_CHECK_MSG(all && strstr(all, "sees no CUDA device") && !strstr(all, "3.00 GiB reserved"), "%s", all ? all : "(null)");
    free(all);
    json_decref(m);
    tk_embed_destroy(&e);
}

int main(void) {
    TK_RUN(test_holder_report);
    TK_RUN(test_outputs_in_order);
    TK_RUN(test_error_is_one_output);
    TK_RUN(test_cancel_and_sigint_hook);
    TK_RUN(test_nested_execute_refused);
    TK_RUN(test_magic_list_and_completion);
    TK_RUN(test_shell_utf8_and_status);
    return tk_test_done();
}
