/* fuzz_msg.c — libFuzzer target over the message decoder and verifier, and
 * over the core that receives what it accepts.
 *
 * Input layout: the fuzz bytes are split into frames at each 0x00 0xFF pair,
 * so the fuzzer can explore frame counts, the <IDS|MSG> delimiter and every
 * part. Half the time the four parts after the signature get a correct HMAC,
 * so the fuzzer reaches the JSON parser and the dispatch table instead of
 * stopping at the signature check. The interpreter is a small local one that
 * echoes the cell and exercises every output kind, so this target depends on
 * kernel/ alone. The core's message limit is 2048 bytes, so inputs reach both
 * the refused path (an error reply naming the size) and the whole one. */
#include "tk_kernel.h"

#include <stdlib.h>
#include <string.h>

#define KEY "fuzz-key"
static tk_core *g_core;

static int f_execute(void *self, const char *code, const tk_exec_opts *o, tk_out *out, atomic_int *cancel) {
    (void)self; (void)o; (void)cancel;
    json_t *b = json_pack("{s:s}", "text/plain", code);
    out->ops->stream(out, "stdout", code);
    out->ops->display(out, b, NULL, "d", code[0] == 'u');
    out->ops->result(out, b, NULL);
    out->ops->page(out, b);
    if (code[0] == 'c') out->ops->clear(out, 1);
    json_decref(b);
    if (code[0] == 'e') { out->ops->error(out, "E", code, NULL); return -1; }
    return 0;
}
static void f_complete(void *self, const char *code, size_t cur, json_t *m, size_t *s, size_t *e) {
    (void)self;
    json_array_append_new(m, json_string("x"));
    *s = cur ? cur - 1 : 0;
    *e = cur;
    (void)code;
}
static int f_inspect(void *self, const char *code, size_t cur, int d, json_t *data) {
    (void)self; (void)cur; (void)d;
    json_object_set_new(data, "text/plain", json_string(code));
    return 1;
}
static const char *f_is_complete(void *self, const char *code, const char **indent) {
    (void)self;
    *indent = "  ";
    return code[0] ? "incomplete" : "complete";
}

static void drop(void *self, tk_channel ch, const tk_frame *f, size_t n) { (void)self; (void)ch; (void)f; (void)n; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_core) {
        tk_interp it = {NULL, f_execute, f_complete, f_inspect, f_is_complete, NULL};
        tk_core_opts o = {.key = (const uint8_t *)KEY, .key_len = strlen(KEY), .interp = it,
                          .transport = {NULL, drop, NULL}, .history_path = "",
                          .max_message_bytes = 2048}; /* inputs go to 4096: both sides of the limit */
        g_core = tk_core_new(&o, NULL);
    }
    if (size < 1) return 0;
    int fix_sig = data[0] & 1;
    data++, size--;
    tk_frame f[64];
    size_t n = 0, start = 0;
    for (size_t i = 0; i + 1 < size && n < 63; i++)
        if (data[i] == 0x00 && data[i + 1] == 0xFF) {
            f[n].data = data + start; f[n++].len = i - start;
            start = i + 2;
            i++;
        }
    f[n].data = data + start; f[n++].len = size - start;
    char hex[65];
    if (fix_sig) {
        for (size_t d = 0; d + 6 <= n; d++)
            if (f[d].len == 9 && !memcmp(f[d].data, "<IDS|MSG>", 9)) {
                tk_signer *s = tk_signer_new((const uint8_t *)KEY, strlen(KEY));
                tk_signer_sign(s, &f[d + 2], hex);
                tk_signer_destroy(&s);
                f[d + 1].data = (const uint8_t *)hex;
                f[d + 1].len = 64;
                break;
            }
    }
    tk_kerr err;
    tk_msg *m = tk_msg_decode(NULL, f, n, &err);
    tk_msg_destroy(&m);
    tk_core_handle(g_core, size ? (tk_channel)(data[0] % TK_CH_COUNT) : TK_CH_SHELL, f, n);
    return 0;
}
