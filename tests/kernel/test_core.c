/* test_core.c — the protocol core driven through an in-memory transport:
 * signing (RFC 4231 vectors, any key length), verification, replay, malformed
 * input, dispatch, status order, execution count, stop_on_error, completion in
 * code points, history, interrupts, shutdown; and the magic registry. Every
 * message the core sends is decoded here with the same key, so its signatures
 * are checked too. */
#include "tk_history.h"
#include "tk_kernel.h"
#include "tk_magics.h"
#include "tk_test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KEY "a0436f6c-1916-498b-8eb9-e81ab9368e84"

/* ---- in-memory transport: decodes and keeps what the core sends ---------- */
#define MAXSENT 512
typedef struct sent { tk_channel ch; tk_msg *m; } sent;
typedef struct mem { tk_signer *s; sent out[MAXSENT]; int n, bad; pthread_mutex_t lock; } mem;

static void mem_send(void *self, tk_channel ch, const tk_frame *f, size_t n) {
    mem *t = self;
    tk_kerr err;
    tk_msg *m = tk_msg_decode(t->s, f, n, &err);
    pthread_mutex_lock(&t->lock);
    if (!m) { t->bad++; fprintf(stderr, "  core sent an undecodable message: %s\n", err.msg); }
    else if (t->n < MAXSENT) { t->out[t->n].ch = ch; t->out[t->n++].m = m; }
    else tk_msg_destroy(&m);
    pthread_mutex_unlock(&t->lock);
}

static void mem_clear(mem *t) {
    for (int i = 0; i < t->n; i++) tk_msg_destroy(&t->out[i].m);
    t->n = 0;
}

typedef struct fx { mem t; tk_magics *mg; tk_core *c; tk_signer *client; int seq; } fx;
static double g_grace; /* stop_on_error_timeout of the next fx_init */
static size_t g_max_bytes; /* max_message_bytes of the next fx_init (0: the default) */

static void fx_init(fx *x) {
    memset(x, 0, sizeof *x);
    pthread_mutex_init(&x->t.lock, NULL);
    x->t.s = tk_signer_new((const uint8_t *)KEY, strlen(KEY));
    x->client = tk_signer_new((const uint8_t *)KEY, strlen(KEY));
    x->mg = tk_magics_new();
    tk_core_opts o = {.key = (const uint8_t *)KEY, .key_len = strlen(KEY), .interp = tk_magics_interp(x->mg),
                      .transport = {&x->t, mem_send, NULL}, .history_path = "", .stop_on_error_timeout = g_grace,
                      .max_message_bytes = g_max_bytes};
    tk_kerr err;
    x->c = tk_core_new(&o, &err);
}

static void fx_free(fx *x) {
    mem_clear(&x->t);
    tk_core_destroy(&x->c);
    tk_magics_destroy(&x->mg);
    tk_signer_destroy(&x->t.s);
    tk_signer_destroy(&x->client);
    pthread_mutex_destroy(&x->t.lock);
}

/* Builds a signed request; returns frames (free with tk_frames_free). */
static const char *g_date = "2026-01-01T00:00:00.000000Z"; /* header.date of test requests; NULL: none */
static char g_date_buf[48];

/* Dates the next requests `dt` seconds from now on the real clock, as a
 * client's dates are. */
static void date_now_plus(double dt) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + dt;
    time_t whole = (time_t)t;
    struct tm tm;
    gmtime_r(&whole, &tm);
    char ymd[32];
    strftime(ymd, sizeof ymd, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(g_date_buf, sizeof g_date_buf, "%s.%06dZ", ymd, (int)((t - (double)whole) * 1e6));
    g_date = g_date_buf;
}

static tk_frame *req_frames(fx *x, const tk_signer *s, const char *type, json_t *content, size_t *n, char *id_out) {
    char id[64];
    snprintf(id, sizeof id, "test-%d", ++x->seq);
    if (id_out) strcpy(id_out, id);
    json_t *h = json_pack("{s:s,s:s,s:s,s:s?,s:s,s:s}", "msg_id", id, "session", "sess-test", "username", "t",
                          "date", g_date, "msg_type", type, "version", "5.3");
    json_t *p = json_object(), *md = json_object();
    uint8_t ident[] = "client-1";
    uint8_t *ids[1] = {ident};
    size_t lens[1] = {8};
    tk_msg route = {.nids = 1, .ids = ids, .id_lens = lens};
    tk_frame *f = NULL;
    tk_msg_encode(s, &route, h, p, md, content, &f, n);
    json_decref(h); json_decref(p); json_decref(md); json_decref(content);
    return f;
}

static void send_req(fx *x, tk_channel ch, const char *type, json_t *content) {
    size_t n;
    tk_frame *f = req_frames(x, x->client, type, content, &n, NULL);
    tk_core_handle(x->c, ch, f, n);
    tk_frames_free(f, n);
}

static json_t *exec_content(const char *code) {
    return json_pack("{s:s,s:b,s:b,s:{},s:b,s:b}", "code", code, "silent", 0, "store_history", 1,
                     "user_expressions", "allow_stdin", 0, "stop_on_error", 1);
}

/* the i-th sent message of a type on a channel (or NULL) */
static tk_msg *find(fx *x, tk_channel ch, const char *type, int nth) {
    for (int i = 0; i < x->t.n; i++)
        if (x->t.out[i].ch == ch && !strcmp(x->t.out[i].m->msg_type, type) && nth-- == 0) return x->t.out[i].m;
    return NULL;
}
static int count_type(fx *x, const char *type) {
    int k = 0;
    for (int i = 0; i < x->t.n; i++) k += !strcmp(x->t.out[i].m->msg_type, type);
    return k;
}
static const char *cstr(tk_msg *m, const char *k) { return m ? json_string_value(json_object_get(m->content, k)) : NULL; }
static long long cint(tk_msg *m, const char *k) { return m ? json_integer_value(json_object_get(m->content, k)) : -999; }

/* ---- signing and decoding ------------------------------------------------ */

static void test_hmac_rfc4231_any_key_length(void) {
    /* RFC 4231 case 2 split over four frames, and case 6 (131-byte key). */
    tk_signer *s = tk_signer_new((const uint8_t *)"Jefe", 4);
    tk_frame p[4] = {{(const uint8_t *)"what do ya", 10}, {(const uint8_t *)" want ", 6},
                     {(const uint8_t *)"for nothing", 11}, {(const uint8_t *)"?", 1}};
    char hex[65];
    tk_signer_sign(s, p, hex);
    TK_CHECK_STR(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    tk_signer_destroy(&s);
    TK_CHECK(s == NULL);
    uint8_t key[131];
    memset(key, 0xaa, sizeof key);
    s = tk_signer_new(key, sizeof key);
    const char *d = "Test Using Larger Than Block-Size Key - Hash Key First";
    tk_frame q[4] = {{(const uint8_t *)d, strlen(d)}, {(const uint8_t *)"", 0}, {(const uint8_t *)"", 0}, {(const uint8_t *)"", 0}};
    tk_signer_sign(s, q, hex);
    TK_CHECK_STR(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    tk_signer_destroy(&s);
    s = tk_signer_new(NULL, 0); /* empty key: empty signature */
    tk_signer_sign(s, q, hex);
    TK_CHECK_STR(hex, "");
    tk_signer_destroy(&s);
    tk_signer_destroy(&s); /* no-op on NULL */
}

static void test_decode_rejects_bad_input(void) {
    fx x; fx_init(&x);
    size_t n;
    tk_kerr err;
    tk_frame *f = req_frames(&x, x.client, "kernel_info_request", json_object(), &n, NULL);
    tk_msg *m = tk_msg_decode(x.t.s, f, n, &err);
    TK_CHECK(m && !strcmp(m->msg_type, "kernel_info_request") && m->nids == 1);
    tk_msg_destroy(&m);
    TK_CHECK(m == NULL);
    tk_frame g[8];
    memcpy(g, f, n * sizeof *f);
    /* wrong signature: flip one hex digit */
    char sig[65];
    memcpy(sig, g[2].data, 64); sig[64] = 0;
    sig[0] = sig[0] == 'a' ? 'b' : 'a';
    g[2].data = (const uint8_t *)sig;
    TK_CHECK(tk_msg_decode(x.t.s, g, n, &err) == NULL && strstr(err.msg, "signature"));
    g[2].len = 0; /* unsigned */
    TK_CHECK(tk_msg_decode(x.t.s, g, n, &err) == NULL && strstr(err.msg, "unsigned"));
    g[2] = f[2];
    TK_CHECK(tk_msg_decode(x.t.s, g, n - 1, &err) == NULL && strstr(err.msg, "missing frames"));
    TK_CHECK(tk_msg_decode(x.t.s, g + 2, n - 2, &err) == NULL && strstr(err.msg, "delimiter"));
    TK_CHECK(tk_msg_decode(x.t.s, g, 0, &err) == NULL);
    /* valid signatures over bad JSON, non-objects, invalid UTF-8, wrong types:
     * signed with the right key so only the parser can refuse them */
    const char *bad_headers[] = {"{\"msg_id\":", "[1,2]", "{\"msg_id\":\"\xff\xfe\",\"msg_type\":\"x\"}",
                                 "{\"msg_id\":5,\"msg_type\":\"execute_request\"}", "{\"msg_id\":\"a\"}",
                                 "{\"msg_id\":\"a\",\"msg_id\":\"b\",\"msg_type\":\"x\"}",
                                 "{\"msg_id\":\"a\",\"msg_type\":\"x\",\"session\":[]}",
                                 "{\"msg_id\":\"a\",\"msg_type\":\"execute_request\\u0000x\"}"};
    for (size_t i = 0; i < sizeof bad_headers / sizeof *bad_headers; i++) {
        g[3].data = (const uint8_t *)bad_headers[i];
        g[3].len = strlen(bad_headers[i]);
        char hex[65];
        tk_signer_sign(x.client, &g[3], hex);
        g[2].data = (const uint8_t *)hex;
        g[2].len = 64;
        m = tk_msg_decode(x.t.s, g, n, &err);
        TK_CHECK_MSG(m == NULL, "header %zu accepted", i);
        tk_msg_destroy(&m);
    }
    /* over the limit: the header is read (and the signature checked over
     * every byte), the rest is not parsed; the message comes back refused,
     * naming both sizes, so the core can answer it */
    tk_frames_free(f, n);
    char big[9000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    f = req_frames(&x, x.client, "execute_request", exec_content(big), &n, NULL);
    m = tk_msg_decode_max(x.t.s, f, n, 4096, &err);
    TK_CHECK(m && m->refused[0] && !m->content && strstr(m->refused, "over the kernel's limit of 4096 bytes"));
    TK_CHECK_MSG(m && strstr(m->refused, "the execute_request message is 9"), "%s", m ? m->refused : "");
    tk_msg_destroy(&m);
    m = tk_msg_decode(x.t.s, f, n, &err); /* under the default 1 GiB: whole */
    TK_CHECK(m && !m->refused[0] && m->content);
    tk_msg_destroy(&m);
    tk_frames_free(f, n);
    fx_free(&x);
}

/* Replaces the content frame of a one-identity request (frames: id,
 * delimiter, signature, header, parent, metadata, content) with raw text and
 * signs it again; sig holds the new signature. */
static void raw_content(fx *x, tk_frame *f, const char *text, char sig[65]) {
    free((void *)f[6].data);
    f[6].data = (const uint8_t *)strdup(text);
    f[6].len = strlen(text);
    tk_signer_sign(x->client, &f[3], sig);
    free((void *)f[2].data);
    f[2].data = (const uint8_t *)strdup(sig);
    f[2].len = 64;
}

static void send_raw(fx *x, tk_channel ch, const char *type, const char *content_text) {
    size_t n;
    char sig[65];
    tk_frame *f = req_frames(x, x->client, type, json_object(), &n, NULL);
    raw_content(x, f, content_text, sig);
    tk_core_handle(x->c, ch, f, n);
    tk_frames_free(f, n);
}

/* Every request with a readable header is answered: too large, a NUL in the
 * code, a lone surrogate, invalid UTF-8, a part that is not JSON. Duplicated
 * keys take the last, as ipykernel does. Only a message without a readable
 * header is dropped. */
static void test_refused_requests_get_error_replies(void) {
    g_max_bytes = 8192;
    fx x; fx_init(&x);
    char big[12000];
    memset(big, '#', sizeof big - 1);
    big[sizeof big - 1] = 0;
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content(big));
    tk_msg *rep = find(&x, TK_CH_SHELL, "execute_reply", 0);
    TK_CHECK_STR(cstr(rep, "status"), "error");
    TK_CHECK_STR(cstr(rep, "ename"), "MessageError");
    TK_CHECK_MSG(cstr(rep, "evalue") && strstr(cstr(rep, "evalue"), "over the kernel's limit of 8192 bytes (8.0 KiB)"),
                 "%s", cstr(rep, "evalue"));
    TK_CHECK_EQ_INT(cint(rep, "execution_count"), 0);
    /* the user sees it as the cell's error, between busy and idle */
    const char *want[] = {"status", "error", "execute_reply", "status"};
    TK_CHECK_EQ_INT(x.t.n, 4);
    for (int i = 0; i < x.t.n && i < 4; i++) TK_CHECK_STR(x.t.out[i].m->msg_type, want[i]);
    TK_CHECK_STR(cstr(find(&x, TK_CH_IOPUB, "error", 0), "evalue"), cstr(rep, "evalue"));
    TK_CHECK_EQ_INT(tk_core_refused(x.c), 1);
    TK_CHECK_EQ_INT(tk_core_dropped(x.c), 0);
    /* under the limit it runs; stop_on_error was in force, so send it dated
     * after the error (date rule) */
    date_now_plus(1.0);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo small"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 1), "status"), "ok");
    TK_CHECK_EQ_INT(cint(find(&x, TK_CH_SHELL, "execute_reply", 1), "execution_count"), 1);
    fx_free(&x);
    g_max_bytes = 0;
    g_date = "2026-01-01T00:00:00.000000Z";

    fx_init(&x);
    /* a NUL: decoded (JSON_ALLOW_NUL), refused where the code is used */
    json_t *c = exec_content("");
    json_object_set_new(c, "code", json_stringn("%echo a\0b", 9));
    send_req(&x, TK_CH_SHELL, "execute_request", c);
    rep = find(&x, TK_CH_SHELL, "execute_reply", 0);
    TK_CHECK_STR(cstr(rep, "status"), "error");
    TK_CHECK_MSG(cstr(rep, "evalue") && strstr(cstr(rep, "evalue"), "NUL character (\\u0000) at code point 7"), "%s",
                 cstr(rep, "evalue"));
    TK_CHECK_EQ_INT(count_type(&x, "stream"), 0); /* nothing ran, not even the part before the NUL */
    fx_free(&x);

    fx_init(&x);
    send_raw(&x, TK_CH_SHELL, "execute_request", "{\"code\":\"%echo \\ud800 lone\",\"silent\":false}");
    rep = find(&x, TK_CH_SHELL, "execute_reply", 0);
    TK_CHECK_STR(cstr(rep, "status"), "error");
    TK_CHECK_MSG(cstr(rep, "evalue") && strstr(cstr(rep, "evalue"), "content frame is not valid JSON") &&
                 strstr(cstr(rep, "evalue"), "lone UTF-16 surrogate"), "%s", cstr(rep, "evalue"));
    fx_free(&x);

    fx_init(&x);
    send_raw(&x, TK_CH_SHELL, "execute_request", "{\"code\":\"%echo \xff\"}");
    rep = find(&x, TK_CH_SHELL, "execute_reply", 0);
    TK_CHECK_MSG(cstr(rep, "evalue") && strstr(cstr(rep, "evalue"), "UTF-8"), "%s", cstr(rep, "evalue"));
    /* duplicated keys: the last one runs, as in ipykernel */
    date_now_plus(1.0);
    send_raw(&x, TK_CH_SHELL, "execute_request", "{\"code\":\"%echo first\",\"code\":\"%echo last\"}");
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 1), "status"), "ok");
    TK_CHECK_STR(cstr(find(&x, TK_CH_IOPUB, "stream", 0), "text"), "last\n");
    g_date = "2026-01-01T00:00:00.000000Z";
    /* other requests: an error reply of their own type */
    send_raw(&x, TK_CH_SHELL, "kernel_info_request", "{not json");
    rep = find(&x, TK_CH_SHELL, "kernel_info_reply", 0);
    TK_CHECK_STR(cstr(rep, "status"), "error");
    TK_CHECK(cstr(rep, "evalue") && strstr(cstr(rep, "evalue"), "content frame is not valid JSON at byte"));
    send_raw(&x, TK_CH_SHELL, "complete_request", "{\"code\":\"%ec\\u0000ho\",\"cursor_pos\":3}");
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "complete_reply", 0), "status"), "error");
    TK_CHECK_EQ_INT(tk_core_dropped(x.c), 0);
    /* a message with no reply type can only be logged */
    send_raw(&x, TK_CH_SHELL, "comm_msg", "{\"comm_id\":\"\\udc00\"}");
    TK_CHECK_EQ_INT(tk_core_dropped(x.c), 1);
    fx_free(&x);
}

static void test_replay_guard_forgets_oldest(void) {
    tk_replay *r = tk_replay_new();
    TK_CHECK_EQ_INT(tk_replay_check(r, (const uint8_t *)"a", 1), 0);
    TK_CHECK_EQ_INT(tk_replay_check(r, (const uint8_t *)"a", 1), 1);
    char k[32];
    for (int i = 0; i < TK_REPLAY_KEEP; i++) {
        int len = snprintf(k, sizeof k, "k%d", i);
        tk_replay_check(r, (const uint8_t *)k, (size_t)len);
    }
    /* "a" fell out of the window; the newest is still remembered */
    TK_CHECK_EQ_INT(tk_replay_check(r, (const uint8_t *)"a", 1), 0);
    int len = snprintf(k, sizeof k, "k%d", TK_REPLAY_KEEP - 1);
    TK_CHECK_EQ_INT(tk_replay_check(r, (const uint8_t *)k, (size_t)len), 1);
    tk_replay_destroy(&r);
    TK_CHECK(r == NULL);
}

/* ---- the core ------------------------------------------------------------- */

static void test_kernel_info_and_status_order(void) {
    fx x; fx_init(&x);
    send_req(&x, TK_CH_SHELL, "kernel_info_request", json_object());
    TK_CHECK_EQ_INT(x.t.bad, 0);
    TK_CHECK_EQ_INT(x.t.n, 3);
    TK_CHECK(x.t.out[0].ch == TK_CH_IOPUB && !strcmp(cstr(x.t.out[0].m, "execution_state"), "busy"));
    TK_CHECK(x.t.out[1].ch == TK_CH_SHELL && !strcmp(x.t.out[1].m->msg_type, "kernel_info_reply"));
    TK_CHECK(x.t.out[2].ch == TK_CH_IOPUB && !strcmp(cstr(x.t.out[2].m, "execution_state"), "idle"));
    tk_msg *r = x.t.out[1].m;
    json_t *li = json_object_get(r->content, "language_info");
    TK_CHECK_STR(json_string_value(json_object_get(li, "name")), "txkernel");
    TK_CHECK_STR(json_string_value(json_object_get(li, "file_extension")), ".txk");
    TK_CHECK_STR(json_string_value(json_object_get(li, "pygments_lexer")), "yaml");
    TK_CHECK_STR(cstr(r, "protocol_version"), "5.3");
    TK_CHECK(json_array_size(json_object_get(r->content, "help_links")) >= 1);
    /* the reply is routed back to the requester and parented on the request */
    TK_CHECK(r->nids == 1 && r->id_lens[0] == 8 && !memcmp(r->ids[0], "client-1", 8));
    TK_CHECK_STR(json_string_value(json_object_get(r->parent, "msg_type")), "kernel_info_request");
    fx_free(&x);
}

static void test_execute_outputs_then_idle(void) {
    fx x; fx_init(&x);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo hi\n%echo --stderr err\n%txversion"));
    const char *want[] = {"status", "execute_input", "stream", "stream", "execute_result", "execute_reply", "status"};
    TK_CHECK_EQ_INT(x.t.n, 7);
    for (int i = 0; i < x.t.n && i < 7; i++) TK_CHECK_STR(x.t.out[i].m->msg_type, want[i]);
    TK_CHECK_STR(cstr(find(&x, TK_CH_IOPUB, "stream", 0), "text"), "hi\n");
    TK_CHECK_STR(cstr(find(&x, TK_CH_IOPUB, "stream", 1), "name"), "stderr");
    TK_CHECK_EQ_INT(cint(find(&x, TK_CH_IOPUB, "execute_input", 0), "execution_count"), 1);
    TK_CHECK_EQ_INT(cint(find(&x, TK_CH_IOPUB, "execute_result", 0), "execution_count"), 1);
    tk_msg *rep = find(&x, TK_CH_SHELL, "execute_reply", 0);
    TK_CHECK_STR(cstr(rep, "status"), "ok");
    TK_CHECK_EQ_INT(cint(rep, "execution_count"), 1);
    TK_CHECK_STR(cstr(x.t.out[6].m, "execution_state"), "idle");
    fx_free(&x);
}

static void test_execution_count_rules(void) {
    fx x; fx_init(&x);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo 1"));
    json_t *c = exec_content("%echo 2");
    json_object_set_new(c, "store_history", json_false());
    send_req(&x, TK_CH_SHELL, "execute_request", c);
    TK_CHECK_EQ_INT(tk_core_execution_count(x.c), 1);
    c = exec_content("%txversion");
    json_object_set_new(c, "silent", json_true());
    mem_clear(&x.t);
    send_req(&x, TK_CH_SHELL, "execute_request", c);
    TK_CHECK_EQ_INT(tk_core_execution_count(x.c), 1);
    TK_CHECK(find(&x, TK_CH_IOPUB, "execute_input", 0) == NULL);   /* silent: no broadcast */
    TK_CHECK(find(&x, TK_CH_IOPUB, "execute_result", 0) == NULL);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%nosuch"));
    TK_CHECK_EQ_INT(tk_core_execution_count(x.c), 2);               /* errors count too */
    fx_free(&x);
}

static void test_error_is_one_reply_and_one_iopub_error(void) {
    fx x; fx_init(&x);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%ecoh hi"));
    TK_CHECK_EQ_INT(count_type(&x, "error"), 1);
    tk_msg *rep = find(&x, TK_CH_SHELL, "execute_reply", 0);
    TK_CHECK_STR(cstr(rep, "status"), "error");
    TK_CHECK_STR(cstr(rep, "ename"), "UsageError");
    TK_CHECK(cstr(rep, "evalue") && strstr(cstr(rep, "evalue"), "did you mean %echo?"));
    TK_CHECK(json_is_array(json_object_get(rep->content, "traceback")));
    mem_clear(&x.t);
    g_date = "2999-01-01T00:00:00.000000Z"; /* sent after the error was seen */
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("model: bert-base-cased"));
    g_date = "2026-01-01T00:00:00.000000Z";
    rep = find(&x, TK_CH_SHELL, "execute_reply", 0);
    TK_CHECK(cstr(rep, "evalue") && strstr(cstr(rep, "evalue"), "Cells start with a magic"));
    fx_free(&x);
}

static int run_two_errors(tk_magic_ctx *c) {
    tk_magic_error(c, "FirstError", "first");
    return tk_magic_error(c, "SecondError", "second");
}
static const tk_magic_def TWO[] = {{"twoerrors", TK_MAGIC_LINE, run_two_errors, "errs twice", NULL}};

static void test_second_error_in_a_cell_is_dropped(void) {
    fx x; fx_init(&x);
    tk_magics_add_table(x.mg, TWO, 1);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%twoerrors"));
    TK_CHECK_EQ_INT(count_type(&x, "error"), 1);
    TK_CHECK_STR(cstr(find(&x, TK_CH_IOPUB, "error", 0), "ename"), "FirstError");
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 0), "ename"), "FirstError");
    fx_free(&x);
}

static void test_stop_on_error_aborts_queued(void) {
    fx x; fx_init(&x);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%nosuch"));
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo queued"));  /* already queued */
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 1), "status"), "aborted");
    TK_CHECK(find(&x, TK_CH_IOPUB, "stream", 0) == NULL);
    /* sent after the error (a later date): a client that saw the error and
     * goes on; it runs even before the queue drained */
    g_date = "2999-01-01T00:00:00.000000+02:00";
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo sent after the error"));
    g_date = "2026-01-01T00:00:00.000000Z";
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 2), "status"), "ok");
    mem_clear(&x.t);
    /* once a request has run, the abort is over */
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo later"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 0), "status"), "ok");
    /* with stop_on_error false nothing is aborted */
    mem_clear(&x.t);
    json_t *c = exec_content("%nosuch");
    json_object_set_new(c, "stop_on_error", json_false());
    send_req(&x, TK_CH_SHELL, "execute_request", c);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo next"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 1), "status"), "ok");
    fx_free(&x);
}

/* The rule by dates on a real clock: a cell fails after 0.3 s; requests the
 * client dated 0..200 ms after that cell (before the error could reach it)
 * are aborted even though they arrive after the error reply left, as a
 * request stuck in a proxy would; one dated after the error runs. */
static void test_stop_on_error_by_client_dates(void) {
    fx x; fx_init(&x);
    date_now_plus(0);
    send_req(&x, TK_CH_SHELL, "kernel_info_request", json_object());
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%sleep 0.3\n%nosuch"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 0), "status"), "error");
    static const double later[] = {0, 0.002, 0.010, 0.050, 0.200};
    for (int i = 0; i < 5; i++) {
        date_now_plus(later[i] - 0.3);
        send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo must not run"));
        TK_CHECK_MSG(!strcmp(cstr(find(&x, TK_CH_SHELL, "execute_reply", 1 + i), "status") ?: "", "aborted"),
                     "sent %.3f s after the failing cell", later[i]);
    }
    TK_CHECK(find(&x, TK_CH_IOPUB, "stream", 0) == NULL);
    TK_CHECK_EQ_INT(count_type(&x, "execute_input"), 1);
    /* each aborted request still gets busy/idle, as ipykernel sends them */
    TK_CHECK_EQ_INT(count_type(&x, "status"), 2 * 7);
    date_now_plus(0.001);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo runs"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 6), "status"), "ok");
    fx_free(&x);
    g_date = "2026-01-01T00:00:00.000000Z";
}

/* The grace window: requests sent (undated: taken) within it after the
 * error are aborted too, later ones run. */
static void test_stop_on_error_grace_window(void) {
    g_grace = 0.2;
    fx x; fx_init(&x);
    date_now_plus(0);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%nosuch"));
    date_now_plus(0.1);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo sent 0.1 s after"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 1), "status"), "aborted");
    g_date = NULL;
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo undated, at once"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 2), "status"), "aborted");
    usleep(300000);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo undated, later"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 3), "status"), "ok");
    fx_free(&x);
    g_grace = 0;
    /* without a window an undated request runs: its send time is unknown */
    fx_init(&x);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%nosuch"));
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo undated"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 1), "status"), "ok");
    g_date = "2026-01-01T00:00:00.000000Z";
    fx_free(&x);
}

static void test_bad_messages_never_run(void) {
    fx x; fx_init(&x);
    size_t n;
    tk_signer *wrong = tk_signer_new((const uint8_t *)"not-the-key", 11);
    tk_frame *f = req_frames(&x, wrong, "execute_request", exec_content("%echo evil"), &n, NULL);
    tk_core_handle(x.c, TK_CH_SHELL, f, n);
    tk_frames_free(f, n);
    tk_signer_destroy(&wrong);
    tk_signer *none = tk_signer_new(NULL, 0);
    f = req_frames(&x, none, "execute_request", exec_content("%echo unsigned"), &n, NULL);
    tk_core_handle(x.c, TK_CH_SHELL, f, n);
    tk_frames_free(f, n);
    tk_signer_destroy(&none);
    TK_CHECK_EQ_INT(x.t.n, 0);
    TK_CHECK_EQ_INT(tk_core_dropped(x.c), 2);
    /* a valid request right after is answered */
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo fine"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 0), "status"), "ok");
    TK_CHECK_EQ_INT(tk_core_execution_count(x.c), 1);
    fx_free(&x);
}

static void test_replayed_message_runs_once(void) {
    fx x; fx_init(&x);
    size_t n;
    tk_frame *f = req_frames(&x, x.client, "execute_request", exec_content("%echo once"), &n, NULL);
    tk_core_handle(x.c, TK_CH_SHELL, f, n);
    tk_core_handle(x.c, TK_CH_SHELL, f, n);
    tk_core_handle(x.c, TK_CH_CONTROL, f, n);
    tk_frames_free(f, n);
    TK_CHECK_EQ_INT(count_type(&x, "execute_reply"), 1);
    TK_CHECK_EQ_INT(count_type(&x, "stream"), 1);
    TK_CHECK_EQ_INT(tk_core_dropped(x.c), 2);
    fx_free(&x);
}

static void test_wrong_types_get_error_replies(void) {
    fx x; fx_init(&x);
    send_req(&x, TK_CH_SHELL, "execute_request", json_pack("{s:i}", "code", 5));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 0), "ename"), "ProtocolError");
    send_req(&x, TK_CH_SHELL, "complete_request", json_pack("{s:s,s:s}", "code", "%e", "cursor_pos", "x"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "complete_reply", 0), "status"), "error");
    send_req(&x, TK_CH_SHELL, "history_request", json_pack("{s:s}", "hist_access_type", "sideways"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "history_reply", 0), "status"), "error");
    TK_CHECK_EQ_INT(tk_core_execution_count(x.c), 0);
    /* execute on control is not served (it would race the shell thread) */
    mem_clear(&x.t);
    send_req(&x, TK_CH_CONTROL, "execute_request", exec_content("%echo x"));
    send_req(&x, TK_CH_SHELL, "no_such_request", json_object());
    TK_CHECK_EQ_INT(x.t.n, 0);
    fx_free(&x);
}

static void test_complete_counts_code_points(void) {
    fx x; fx_init(&x);
    /* "ü" and "é" are two bytes each; positions are in code points */
    send_req(&x, TK_CH_SHELL, "complete_request", json_pack("{s:s,s:i}", "code", "# üé\n%ec", "cursor_pos", 8));
    tk_msg *r = find(&x, TK_CH_SHELL, "complete_reply", 0);
    json_t *mt = json_object_get(r->content, "matches");
    TK_CHECK_EQ_INT(json_array_size(mt), 1);
    TK_CHECK_STR(json_string_value(json_array_get(mt, 0)), "%echo");
    TK_CHECK_EQ_INT(cint(r, "cursor_start"), 5);
    TK_CHECK_EQ_INT(cint(r, "cursor_end"), 8);
    send_req(&x, TK_CH_SHELL, "complete_request", json_pack("{s:s,s:i}", "code", "%txhelp sle", "cursor_pos", 11));
    r = find(&x, TK_CH_SHELL, "complete_reply", 1);
    TK_CHECK_STR(json_string_value(json_array_get(json_object_get(r->content, "matches"), 0)), "sleep");
    TK_CHECK_EQ_INT(cint(r, "cursor_start"), 8);
    send_req(&x, TK_CH_SHELL, "inspect_request", json_pack("{s:s,s:i,s:i}", "code", "%slee", "cursor_pos", 3, "detail_level", 0));
    TK_CHECK(json_is_false(json_object_get(find(&x, TK_CH_SHELL, "inspect_reply", 0)->content, "found")));
    send_req(&x, TK_CH_SHELL, "inspect_request", json_pack("{s:s,s:i,s:i}", "code", "%sleep 3", "cursor_pos", 2, "detail_level", 0));
    tk_msg *ir = find(&x, TK_CH_SHELL, "inspect_reply", 1);
    TK_CHECK(json_is_true(json_object_get(ir->content, "found")));
    const char *help = json_string_value(json_object_get(json_object_get(ir->content, "data"), "text/plain"));
    TK_CHECK(help && strstr(help, "%sleep SECONDS"));
    fx_free(&x);
}

static void test_history_tail_range_search(void) {
    fx x; fx_init(&x);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo a"));
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%txversion"));
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo a"));
    mem_clear(&x.t);
    send_req(&x, TK_CH_SHELL, "history_request", json_pack("{s:s,s:i,s:b,s:b}", "hist_access_type", "tail", "n", 2, "output", 1, "raw", 1));
    json_t *h = json_object_get(find(&x, TK_CH_SHELL, "history_reply", 0)->content, "history");
    TK_CHECK_EQ_INT(json_array_size(h), 2);
    json_t *e = json_array_get(h, 0); /* [session, 2, ["%txversion", "txkernel ..."]] */
    TK_CHECK_EQ_INT(json_integer_value(json_array_get(e, 1)), 2);
    TK_CHECK_STR(json_string_value(json_array_get(json_array_get(e, 2), 0)), "%txversion");
    TK_CHECK(strstr(json_string_value(json_array_get(json_array_get(e, 2), 1)) ?: "", "txkernel"));
    send_req(&x, TK_CH_SHELL, "history_request", json_pack("{s:s,s:i,s:i,s:i}", "hist_access_type", "range", "session", 0, "start", 1, "stop", 3));
    TK_CHECK_EQ_INT(json_array_size(json_object_get(find(&x, TK_CH_SHELL, "history_reply", 1)->content, "history")), 2);
    send_req(&x, TK_CH_SHELL, "history_request", json_pack("{s:s,s:s,s:b}", "hist_access_type", "search", "pattern", "%echo*", "unique", 1));
    TK_CHECK_EQ_INT(json_array_size(json_object_get(find(&x, TK_CH_SHELL, "history_reply", 2)->content, "history")), 1);
    send_req(&x, TK_CH_SHELL, "history_request", json_pack("{s:s,s:s}", "hist_access_type", "search", "pattern", "%echo*"));
    TK_CHECK_EQ_INT(json_array_size(json_object_get(find(&x, TK_CH_SHELL, "history_reply", 3)->content, "history")), 2);
    fx_free(&x);
}

static void test_history_survives_restart(void) {
    char path[] = "/tmp/txk-hist-XXXXXX";
    int fd = mkstemp(path);
    TK_CHECK(fd >= 0);
    close(fd);
    for (int round = 0; round < 2; round++) {
        fx x; fx_init(&x);
        tk_core_destroy(&x.c);
        tk_core_opts o = {.key = (const uint8_t *)KEY, .key_len = strlen(KEY), .interp = tk_magics_interp(x.mg),
                          .transport = {&x.t, mem_send, NULL}, .history_path = path};
        x.c = tk_core_new(&o, NULL);
        send_req(&x, TK_CH_SHELL, "execute_request", exec_content(round ? "%echo second" : "%echo first"));
        send_req(&x, TK_CH_SHELL, "history_request", json_pack("{s:s,s:i}", "hist_access_type", "tail", "n", 10));
        json_t *h = json_object_get(find(&x, TK_CH_SHELL, "history_reply", 0)->content, "history");
        TK_CHECK_EQ_INT(json_array_size(h), round + 1);
        if (round) {  /* the first kernel's cell, from an earlier session number */
            TK_CHECK_STR(json_string_value(json_array_get(json_array_get(h, 0), 2)), "%echo first");
            TK_CHECK(json_integer_value(json_array_get(json_array_get(h, 0), 0)) <
                     json_integer_value(json_array_get(json_array_get(h, 1), 0)));
        }
        fx_free(&x);
    }
    unlink(path);
}

/* CPU seconds of this process: what opening a history costs, whatever else
 * the shared cores run meanwhile */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A cell over TK_HIST_CELL_MAX is kept as its first and last lines around a
 * marker; memory holds at most TK_HIST_MAX_BYTES; a file an older kernel
 * filled with whole huge cells is read from its tail only, its huge lines
 * skipped (their sessions still counted), and compacted. */
static void test_history_bounded_by_bytes(void) {
    size_t len = 3u << 20;
    char *cell = malloc(len + 1);
    size_t k = 0;
    for (int i = 0; k + 32 < len; i++) k += (size_t)sprintf(cell + k, "# line %d of a big cell\n", i);
    memcpy(cell + k, "%echo end\n", 10);
    k += 10;
    cell[k] = 0;
    char *cut = tk_history_cut(cell, k);
    TK_CHECK(cut && strlen(cut) < 2 * TK_HIST_CUT_SIDE + 200);
    TK_CHECK(cut && !strncmp(cut, "# line 0 of a big cell\n# line 1 of", 34));
    TK_CHECK(cut && strlen(cut) > 10 && !strcmp(cut + strlen(cut) - 10, "%echo end\n"));
    TK_CHECK_MSG(cut && strstr(cut, "\n# [txkernel history: ") && strstr(cut, " bytes (about "), "%.300s", cut);
    int first = 0, last = 0, lines = 0;
    for (const char *p = cut; p && *p; p = strchr(p, '\n') + 1) {
        lines++;
        if (!strncmp(p, "# line 4 of", 11)) first = 1;
        if (!strncmp(p, "# line 5 of", 11)) first = 0; /* only the first five */
        if (!strncmp(p, "%echo end", 9)) last = 1;
        if (!strchr(p, '\n')) break;
    }
    TK_CHECK(first && last && lines == 11);
    free(cut);
    cut = tk_history_cut("%echo small\n", 12);
    TK_CHECK_STR(cut, "%echo small\n");
    free(cut);

    /* memory: cells under the cut size, more than the byte bound in all */
    tk_history *h = tk_history_open("");
    char *mid = malloc(TK_HIST_CELL_MAX);
    memset(mid, '#', TK_HIST_CELL_MAX - 1);
    mid[TK_HIST_CELL_MAX - 1] = 0;
    for (int i = 0; i < 40; i++) tk_history_add(h, i + 1, mid, NULL);
    TK_CHECK(tk_history_bytes(h) <= TK_HIST_MAX_BYTES && tk_history_count(h) >= 15);
    tk_history_add(h, 41, cell, cell);
    TK_CHECK(tk_history_bytes(h) <= TK_HIST_MAX_BYTES);
    tk_history_close(&h);
    free(mid);

    /* a file as an older kernel left it: two whole 20 MiB cells (session 7)
     * among 3000 small ones */
    char path[] = "/tmp/txk-hist-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    size_t gl = (size_t)20 << 20;
    char *giant = malloc(gl + 1);
    memset(giant, 'x', gl);
    giant[gl] = 0;
    for (int i = 0; i < 3000; i++) {
        if (i == 1000 || i == 2990) fprintf(f, "{\"s\":7,\"l\":%d,\"i\":\"%s\"}\n", i, giant);
        fprintf(f, "{\"s\":%d,\"l\":%d,\"i\":\"%%echo %d\"}\n", i < 2995 ? 3 : 5, i, i);
    }
    fclose(f);
    free(giant);
    struct stat st;
    stat(path, &st);
    double t0 = cpu_s();
    h = tk_history_open(path);
    double took = cpu_s() - t0;
    TK_CHECK_MSG(took < 1.0, "opening a %lld-byte history took %.2f s of CPU", (long long)st.st_size, took);
    TK_CHECK_EQ_INT(tk_history_count(h), TK_HIST_KEEP);
    TK_CHECK(tk_history_bytes(h) < ((size_t)1 << 20));
    TK_CHECK_EQ_INT(tk_history_session(h), 8); /* after the skipped lines' session 7 */
    json_t *q = json_pack("{s:s,s:i}", "hist_access_type", "tail", "n", 1);
    const char *why = NULL;
    json_t *got = tk_history_query(h, q, &why);
    TK_CHECK_STR(json_string_value(json_array_get(json_array_get(got, 0), 2)), "%echo 2999");
    json_decref(got);
    json_decref(q);
    tk_history_close(&h);
    struct stat st2;
    stat(path, &st2);
    TK_CHECK_MSG(st2.st_size < st.st_size / 100, "not compacted: %lld -> %lld bytes", (long long)st.st_size,
                 (long long)st2.st_size);
    h = tk_history_open(path); /* the compacted file reads back the same */
    TK_CHECK_EQ_INT(tk_history_count(h), TK_HIST_KEEP);
    TK_CHECK_EQ_INT(tk_history_session(h), 6); /* the compacted file's newest session is 5 */
    tk_history_close(&h);
    unlink(path);
    free(cell);
}

static void *interrupt_later(void *arg) {
    fx *x = arg;
    struct timespec d = {0, 100 * 1000 * 1000};
    nanosleep(&d, NULL);
    send_req(x, TK_CH_CONTROL, "interrupt_request", json_object());
    return NULL;
}

static void test_interrupt_ends_sleep(void) {
    fx x; fx_init(&x);
    pthread_t th;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_create(&th, NULL, interrupt_later, &x);
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%sleep 30"));
    pthread_join(th, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double el = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    TK_CHECK_MSG(el < 1.0, "took %.2fs", el);
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 0), "ename"), "KeyboardInterrupt");
    TK_CHECK_STR(cstr(find(&x, TK_CH_CONTROL, "interrupt_reply", 0), "status"), "ok");
    /* the next cell, sent after the interrupt's error, runs */
    g_date = "2999-01-01T00:00:00.000000Z";
    send_req(&x, TK_CH_SHELL, "execute_request", exec_content("%echo after"));
    g_date = "2026-01-01T00:00:00.000000Z";
    TK_CHECK_STR(cstr(find(&x, TK_CH_SHELL, "execute_reply", 1), "status"), "ok");
    fx_free(&x);
}

static void test_comm_open_closed_and_shutdown(void) {
    fx x; fx_init(&x);
    send_req(&x, TK_CH_SHELL, "comm_open", json_pack("{s:s,s:s,s:{}}", "comm_id", "c1", "target_name", "nope", "data"));
    TK_CHECK_STR(cstr(find(&x, TK_CH_IOPUB, "comm_close", 0), "comm_id"), "c1");
    send_req(&x, TK_CH_SHELL, "comm_info_request", json_object());
    TK_CHECK(json_is_object(json_object_get(find(&x, TK_CH_SHELL, "comm_info_reply", 0)->content, "comms")));
    int restart = 0;
    TK_CHECK_EQ_INT(tk_core_should_stop(x.c, &restart), 0);
    send_req(&x, TK_CH_CONTROL, "shutdown_request", json_pack("{s:b}", "restart", 1));
    tk_msg *r = find(&x, TK_CH_CONTROL, "shutdown_reply", 0);
    TK_CHECK(r && json_is_true(json_object_get(r->content, "restart")));
    TK_CHECK(find(&x, TK_CH_IOPUB, "shutdown_reply", 0) != NULL);
    TK_CHECK_EQ_INT(tk_core_should_stop(x.c, &restart), 1);
    TK_CHECK_EQ_INT(restart, 1);
    fx_free(&x);
}

/* ---- the magic registry -------------------------------------------------- */

static int run_dummy(tk_magic_ctx *c) { (void)c; return 0; }
static const tk_magic_def DUP[] = {{"echo", TK_MAGIC_LINE, run_dummy, "dup", NULL},
                                   {"zzextra", TK_MAGIC_CELL, run_dummy, "extra", NULL}};

static void test_registry_table_and_closest(void) {
    tk_magics *m = tk_magics_new();
    TK_CHECK(tk_magics_find(m, "lsmagic") && tk_magics_find(m, "sleep") && tk_magics_find(m, "clear"));
    size_t before = tk_magics_count(m);
    TK_CHECK_EQ_INT(tk_magics_add_table(m, DUP, 2), -1);    /* duplicate refused ... */
    TK_CHECK_EQ_INT(tk_magics_count(m), before + 1);         /* ... the new one kept */
    TK_CHECK(tk_magics_find(m, "echo")->run != run_dummy);
    for (size_t i = 1; i < tk_magics_count(m); i++)
        TK_CHECK(strcmp(tk_magics_at(m, i - 1)->name, tk_magics_at(m, i)->name) < 0);
    TK_CHECK_STR(tk_magics_closest(m, "txverison"), "txversion");
    TK_CHECK_STR(tk_magics_closest(m, "lsmagc"), "lsmagic");
    TK_CHECK(tk_magics_closest(m, "completelydifferent") == NULL);
    tk_interp it = tk_magics_interp(m);
    const char *ind;
    TK_CHECK_STR(it.is_complete(m, "%%zzextra", &ind), "incomplete");
    TK_CHECK_STR(it.is_complete(m, "%%zzextra\nbody\n", &ind), "complete");
    TK_CHECK_STR(it.is_complete(m, "%zzextra", &ind), "invalid");
    TK_CHECK_STR(it.is_complete(m, "%echo x", &ind), "complete");
    TK_CHECK_STR(it.is_complete(m, "plain text", &ind), "invalid");
    tk_magics_destroy(&m);
    TK_CHECK(m == NULL);
}

static int g_sess_destroyed;
static void sess_destroy(void *p) { free(p); g_sess_destroyed++; }

static void test_session_pointer_owned(void) {
    tk_magics *m = tk_magics_new();
    tk_magics_set_session(m, malloc(16), sess_destroy);
    TK_CHECK(tk_magics_session(m) != NULL);
    tk_magics_set_session(m, malloc(16), sess_destroy);   /* replacing frees the old one */
    TK_CHECK_EQ_INT(g_sess_destroyed, 1);
    tk_magics_destroy(&m);
    TK_CHECK_EQ_INT(g_sess_destroyed, 2);
}

int main(void) {
    TK_RUN(test_hmac_rfc4231_any_key_length);
    TK_RUN(test_decode_rejects_bad_input);
    TK_RUN(test_refused_requests_get_error_replies);
    TK_RUN(test_replay_guard_forgets_oldest);
    TK_RUN(test_kernel_info_and_status_order);
    TK_RUN(test_execute_outputs_then_idle);
    TK_RUN(test_execution_count_rules);
    TK_RUN(test_error_is_one_reply_and_one_iopub_error);
    TK_RUN(test_second_error_in_a_cell_is_dropped);
    TK_RUN(test_stop_on_error_aborts_queued);
    TK_RUN(test_stop_on_error_by_client_dates);
    TK_RUN(test_stop_on_error_grace_window);
    TK_RUN(test_bad_messages_never_run);
    TK_RUN(test_replayed_message_runs_once);
    TK_RUN(test_wrong_types_get_error_replies);
    TK_RUN(test_complete_counts_code_points);
    TK_RUN(test_history_tail_range_search);
    TK_RUN(test_history_survives_restart);
    TK_RUN(test_history_bounded_by_bytes);
    TK_RUN(test_interrupt_ends_sleep);
    TK_RUN(test_comm_open_closed_and_shutdown);
    TK_RUN(test_registry_table_and_closest);
    TK_RUN(test_session_pointer_owned);
    return tk_test_done();
}
