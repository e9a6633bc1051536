/* tk_msg.c — Jupyter wire format: framing, HMAC-SHA256 signing and verification,
 * JSON decoding with type checks, and the replay (reused msg_id) guard.
 *
 * Guarantees: tk_msg_decode never reads past the given frames, verifies the
 * signature over the raw received bytes with a constant-time compare before
 * parsing anything, and returns NULL (with a reason) for any malformed input.
 * This file is the libFuzzer target's surface (tests/kernel/fuzz_msg.c).
 */
#include "tk_kernel.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static const char DELIM[] = "<IDS|MSG>";
#define DELIM_LEN (sizeof(DELIM) - 1)

struct tk_signer {
    size_t key_len;
    uint8_t key[];
};

tk_signer *tk_signer_new(const uint8_t *key, size_t key_len) {
    if (sodium_init() < 0) return NULL;
    tk_signer *s = malloc(sizeof *s + key_len + 1);
    if (!s) return NULL;
    s->key_len = key_len;
    if (key_len) memcpy(s->key, key, key_len);
    return s;
}

void tk_signer_destroy(tk_signer **ps) {
    if (!ps || !*ps) return;
    sodium_memzero((*ps)->key, (*ps)->key_len);
    free(*ps);
    *ps = NULL;
}

void tk_signer_sign(const tk_signer *s, const tk_frame parts[4], char hex[65]) {
    hex[0] = 0;
    if (!s || s->key_len == 0) return;
    /* The streaming API hashes long keys first, so any key length works (the
     * one-shot crypto_auth_hmacsha256 wants exactly 32 bytes). */
    crypto_auth_hmacsha256_state st;
    uint8_t mac[crypto_auth_hmacsha256_BYTES];
    crypto_auth_hmacsha256_init(&st, s->key, s->key_len);
    for (int i = 0; i < 4; i++)
        crypto_auth_hmacsha256_update(&st, parts[i].data, parts[i].len);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_bin2hex(hex, 65, mac, sizeof mac);
}

void tk_msg_destroy(tk_msg **pm) {
    if (!pm || !*pm) return;
    tk_msg *m = *pm;
    for (size_t i = 0; i < m->nids; i++) free(m->ids[i]);
    free(m->ids);
    free(m->id_lens);
    json_decref(m->header);
    json_decref(m->parent);
    json_decref(m->metadata);
    json_decref(m->content);
    free(m->replay_key);
    free(m);
    *pm = NULL;
}

static void seterr(tk_kerr *err, const char *fmt, const char *a) {
    if (err) snprintf(err->msg, sizeof err->msg, fmt, a ? a : "");
}

/* Parses one frame as a JSON object. flags: jansson decoding flags. NUL
 * characters (\u0000) are accepted and kept (JSON_ALLOW_NUL): a string
 * holding one is refused where it is used, with a reply saying so, not here
 * by dropping the whole message. */
static json_t *parse_obj(const tk_frame *f, const char *what, size_t flags, tk_kerr *err) {
    json_error_t je;
    json_t *j = json_loadb((const char *)f->data, f->len, flags | JSON_ALLOW_NUL, &je);
    if (!j) {
        if (err) snprintf(err->msg, sizeof err->msg, "%s frame is not valid JSON at byte %d of %zu: %s", what,
                          je.position, f->len, je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        seterr(err, "%s frame is not a JSON object", what);
        json_decref(j);
        return NULL;
    }
    return j;
}

/* A header string field that must be a non-empty string without NULs. */
static int header_str(json_t *v) {
    return json_is_string(v) && json_string_length(v) > 0 && strlen(json_string_value(v)) == json_string_length(v);
}

tk_msg *tk_msg_decode(const tk_signer *s, const tk_frame *frames, size_t n, tk_kerr *err) {
    return tk_msg_decode_max(s, frames, n, TK_MSG_MAX_BYTES, err);
}

tk_msg *tk_msg_decode_max(const tk_signer *s, const tk_frame *frames, size_t n, size_t max_bytes, tk_kerr *err) {
    size_t d = n, total = 0;
    for (size_t i = 0; i < n; i++) {
        total += frames[i].len;
        if (d == n && frames[i].len == DELIM_LEN && memcmp(frames[i].data, DELIM, DELIM_LEN) == 0)
            d = i;
    }
    if (d == n) { seterr(err, "no <IDS|MSG> delimiter frame%s", ""); return NULL; }
    if (n - d < 6) { seterr(err, "missing frames after <IDS|MSG> (need signature, header, parent, metadata, content)%s", ""); return NULL; }
    const tk_frame *sig = &frames[d + 1];
    const tk_frame *parts = &frames[d + 2];
    if (s && s->key_len) {
        char want[65];
        tk_signer_sign(s, parts, want);
        if (sig->len != 64 || sodium_memcmp(want, sig->data, 64) != 0) {
            seterr(err, sig->len ? "bad message signature%s" : "unsigned message%s", "");
            return NULL;
        }
    }
    if (parts[0].len > TK_HEADER_MAX_BYTES) {
        if (err) snprintf(err->msg, sizeof err->msg, "header frame of %zu bytes (a header is a few hundred; over %u "
                          "it is not read)", parts[0].len, (unsigned)TK_HEADER_MAX_BYTES);
        return NULL;
    }
    tk_msg *m = calloc(1, sizeof *m);
    if (!m) { seterr(err, "out of memory%s", ""); return NULL; }
    m->nids = d;
    if (d) {
        m->ids = calloc(d, sizeof *m->ids);
        m->id_lens = calloc(d, sizeof *m->id_lens);
        if (!m->ids || !m->id_lens) goto oom;
        for (size_t i = 0; i < d; i++) {
            m->ids[i] = malloc(frames[i].len ? frames[i].len : 1);
            if (!m->ids[i]) goto oom;
            memcpy(m->ids[i], frames[i].data, frames[i].len);
            m->id_lens[i] = frames[i].len;
        }
    }
    /* JSON_REJECT_DUPLICATES in the header: a header with two msg_ids is not
     * something to guess at. The other parts take the last of duplicated
     * keys, as Python's json (and so ipykernel) does. */
    if (!(m->header = parse_obj(&parts[0], "header", JSON_REJECT_DUPLICATES, err))) goto bad;
    json_t *id = json_object_get(m->header, "msg_id");
    json_t *ty = json_object_get(m->header, "msg_type");
    if (!header_str(id)) { seterr(err, "header.msg_id is missing, empty, not a string or holds a NUL%s", ""); goto bad; }
    if (!header_str(ty)) { seterr(err, "header.msg_type is missing, empty, not a string or holds a NUL%s", ""); goto bad; }
    json_t *sess = json_object_get(m->header, "session");
    if (sess && !(json_is_string(sess) && strlen(json_string_value(sess)) == json_string_length(sess))) {
        seterr(err, "header.session is not a string without NULs%s", "");
        goto bad;
    }
    const tk_frame *rk = (s && s->key_len) ? sig : &parts[0];
    if (!(m->replay_key = malloc(rk->len ? rk->len : 1))) goto oom;
    memcpy(m->replay_key, rk->data, rk->len);
    m->replay_key_len = rk->len;
    m->msg_id = json_string_value(id);
    m->msg_type = json_string_value(ty);
    /* The header is readable: from here on a fault is the message's, said
     * in m->refused for the reply, and the message is not dropped. */
    if (total > max_bytes) {
        char a[32], b[32];
        tk_msg_format_bytes(total, a, sizeof a);
        tk_msg_format_bytes(max_bytes, b, sizeof b);
        snprintf(m->refused, sizeof m->refused, "the %s message is %zu bytes (%s), over the kernel's limit of %zu "
                 "bytes (%s); it was not run", m->msg_type, total, a, max_bytes, b);
        return m;
    }
    tk_kerr perr = {{0}};
    if (!(m->parent = parse_obj(&parts[1], "parent_header", 0, &perr)) ||
        !(m->metadata = parse_obj(&parts[2], "metadata", 0, &perr)) ||
        !(m->content = parse_obj(&parts[3], "content", 0, &perr))) {
        snprintf(m->refused, sizeof m->refused, "%s", perr.msg);
        size_t l = strlen(m->refused);
        if (strstr(m->refused, "invalid Unicode '\\uD") || strstr(m->refused, "invalid Unicode '\\ud"))
            snprintf(m->refused + l, sizeof m->refused - l, " (a lone UTF-16 surrogate: half of a pair, which "
                     "is no character; txkernel takes text as valid Unicode)");
        else if (strstr(m->refused, "unable to decode byte"))
            snprintf(m->refused + l, sizeof m->refused - l, " (the frame is not valid UTF-8)");
        return m;
    }
    return m;
oom:
    seterr(err, "out of memory%s", "");
bad:
    tk_msg_destroy(&m);
    return NULL;
}

void tk_msg_format_bytes(size_t n, char *buf, size_t len) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) { v /= 1024; u++; }
    if (u == 0) snprintf(buf, len, "%zu B", n);
    else snprintf(buf, len, "%.1f %s", v, unit[u]);
}

void tk_frames_free(tk_frame *frames, size_t n) {
    if (!frames) return;
    for (size_t i = 0; i < n; i++) free((void *)frames[i].data);
    free(frames);
}

static int dup_frame(tk_frame *f, const void *data, size_t len) {
    uint8_t *p = malloc(len ? len : 1);
    if (!p) return -1;
    if (len) memcpy(p, data, len);
    f->data = p;
    f->len = len;
    return 0;
}

int tk_msg_encode(const tk_signer *s, const tk_msg *route, json_t *header, json_t *parent,
                  json_t *metadata, json_t *content, tk_frame **out, size_t *n) {
    size_t nids = route ? route->nids : 0;
    size_t total = nids + 6;
    tk_frame *f = calloc(total, sizeof *f);
    if (!f) return -1;
    size_t k = 0;
    for (size_t i = 0; i < nids; i++, k++)
        if (dup_frame(&f[k], route->ids[i], route->id_lens[i])) goto oom;
    if (dup_frame(&f[k++], DELIM, DELIM_LEN)) goto oom;
    size_t sig_at = k++;
    json_t *parts[4] = {header, parent, metadata, content};
    for (int i = 0; i < 4; i++, k++) {
        char *txt = json_dumps(parts[i], JSON_COMPACT);
        if (!txt) goto oom;
        f[k].data = (const uint8_t *)txt;
        f[k].len = strlen(txt);
    }
    char hex[65];
    tk_signer_sign(s, &f[sig_at + 1], hex);
    if (dup_frame(&f[sig_at], hex, strlen(hex))) goto oom;
    *out = f;
    *n = total;
    return 0;
oom:
    tk_frames_free(f, total);
    return -1;
}

json_t *tk_msg_header_new(const char *session, const char *msg_type) {
    uint8_t r[16];
    randombytes_buf(r, sizeof r);
    r[6] = (uint8_t)((r[6] & 0x0f) | 0x40); /* uuid version 4 */
    r[8] = (uint8_t)((r[8] & 0x3f) | 0x80);
    char id[37];
    snprintf(id, sizeof id, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12],
             r[13], r[14], r[15]);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char date[40], ymd[24];
    strftime(ymd, sizeof ymd, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(date, sizeof date, "%s.%06ldZ", ymd, (long)tv.tv_usec);
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "msg_id", id, "session", session,
                     "username", "txkernel", "date", date, "msg_type", msg_type,
                     "version", TK_PROTOCOL_VERSION);
}

/* ---- replay guard --------------------------------------------------------
 * A ring of the last TK_REPLAY_KEEP hashes plus chained buckets over it, all
 * allocated and touched once at creation so the kernel's memory stays flat no
 * matter how many messages it serves. SipHash with a random per-process key
 * keeps crafted msg_ids from colliding on purpose. */
#define NBUCKET (TK_REPLAY_KEEP * 2)
struct tk_replay {
    uint8_t key[crypto_shorthash_KEYBYTES];
    uint64_t hash[TK_REPLAY_KEEP];
    int32_t next[TK_REPLAY_KEEP];
    int32_t bucket[NBUCKET];
    size_t count, head; /* head: the slot the next insert overwrites */
};

tk_replay *tk_replay_new(void) {
    if (sodium_init() < 0) return NULL;
    tk_replay *r = malloc(sizeof *r);
    if (!r) return NULL;
    memset(r, 0, sizeof *r);
    for (size_t i = 0; i < NBUCKET; i++) r->bucket[i] = -1;
    randombytes_buf(r->key, sizeof r->key);
    return r;
}

void tk_replay_destroy(tk_replay **pr) {
    if (!pr || !*pr) return;
    free(*pr);
    *pr = NULL;
}

int tk_replay_check(tk_replay *r, const uint8_t *key, size_t len) {
    uint64_t h;
    crypto_shorthash((unsigned char *)&h, key, len, r->key);
    size_t b = (size_t)(h % NBUCKET);
    for (int32_t i = r->bucket[b]; i >= 0; i = r->next[i])
        if (r->hash[i] == h) return 1;
    size_t slot = r->head;
    if (r->count == TK_REPLAY_KEEP) { /* forget the oldest: unlink it from its chain */
        size_t ob = (size_t)(r->hash[slot] % NBUCKET);
        int32_t *pp = &r->bucket[ob];
        while (*pp >= 0 && (size_t)*pp != slot) pp = &r->next[*pp];
        if (*pp >= 0) *pp = r->next[slot];
    } else {
        r->count++;
    }
    r->hash[slot] = h;
    r->next[slot] = r->bucket[b];
    r->bucket[b] = (int32_t)slot;
    r->head = (slot + 1) % TK_REPLAY_KEEP;
    return 0;
}
