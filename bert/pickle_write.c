/* pickle_write.c — the streaming pickle writer of tk_pickle.h.
 *
 * Guarantees: only the opcodes listed in tk_pickle.h are emitted; a repeated
 * string costs 2-5 bytes (BINGET/LONG_BINGET of its first copy, memoized
 * with MEMOIZE); ints take the shortest of BININT1/BININT2/BININT/LONG1 that
 * holds them, as Python's pickle chooses; nothing is written to a file here.
 */
#include "tk_pickle.h"
#include "tk_host_mem.h"

#include <stdlib.h>
#include <string.h>

typedef struct { char *s; uint32_t idx; } memo_slot;

struct tk_pickle_w {
    uint8_t *buf;
    size_t len, cap;
    int failed;
    memo_slot *memo;      /* open addressing by string hash */
    size_t memo_cap, memo_n;
};

static void put(tk_pickle_w *w, const void *p, size_t n) {
    if (w->failed) return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->len + n) cap *= 2;
        uint8_t *b = tk_realloc(w->buf, cap);
        if (!b) { w->failed = 1; return; }
        w->buf = b;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}
static void op(tk_pickle_w *w, uint8_t o) { put(w, &o, 1); }
static void le(tk_pickle_w *w, uint64_t x, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(x >> (8 * i));
    put(w, b, (size_t)n);
}

tk_pickle_w *tk_pickle_w_new(void) {
    tk_pickle_w *w = tk_calloc(1, sizeof *w);
    if (!w) return NULL;
    op(w, 0x80);
    op(w, 4);
    return w;
}

void tk_pickle_w_dict_begin(tk_pickle_w *w) { op(w, '}'); op(w, '('); }
void tk_pickle_w_dict_end(tk_pickle_w *w) { op(w, 'u'); }
void tk_pickle_w_list_begin(tk_pickle_w *w) { op(w, ']'); op(w, '('); }
void tk_pickle_w_list_end(tk_pickle_w *w) { op(w, 'e'); }
void tk_pickle_w_none(tk_pickle_w *w) { op(w, 'N'); }
void tk_pickle_w_bool(tk_pickle_w *w, int b) { op(w, b ? 0x88 : 0x89); }
void tk_pickle_w_tuple2(tk_pickle_w *w) { op(w, 0x86); }

void tk_pickle_w_int(tk_pickle_w *w, int64_t x) {
    if (x >= 0 && x < 256) { op(w, 'K'); le(w, (uint64_t)x, 1); }
    else if (x >= 0 && x < 65536) { op(w, 'M'); le(w, (uint64_t)x, 2); }
    else if (x >= INT32_MIN && x <= INT32_MAX) { op(w, 'J'); le(w, (uint64_t)(uint32_t)(int32_t)x, 4); }
    else {
        /* LONG1: the fewest little-endian two's-complement bytes that keep the sign */
        int n = 8;
        while (n > 1) {
            int64_t hi = x >> (8 * (n - 1) - 1);
            if (hi != 0 && hi != -1) break;
            n--;
        }
        op(w, 0x8a);
        le(w, (uint64_t)n, 1);
        le(w, (uint64_t)x, n);
    }
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int memo_grow(tk_pickle_w *w) {
    size_t cap = w->memo_cap ? w->memo_cap * 2 : 256;
    memo_slot *m = tk_calloc(cap, sizeof *m);
    if (!m) return -1;
    for (size_t i = 0; i < w->memo_cap; i++)
        if (w->memo[i].s) {
            size_t j = hash_str(w->memo[i].s) & (cap - 1);
            while (m[j].s) j = (j + 1) & (cap - 1);
            m[j] = w->memo[i];
        }
    free(w->memo);
    w->memo = m;
    w->memo_cap = cap;
    return 0;
}

void tk_pickle_w_str(tk_pickle_w *w, const char *s) {
    if (w->failed) return;
    if ((w->memo_n + 1) * 2 > w->memo_cap && memo_grow(w)) { w->failed = 1; return; }
    size_t j = hash_str(s) & (w->memo_cap - 1);
    while (w->memo[j].s && strcmp(w->memo[j].s, s)) j = (j + 1) & (w->memo_cap - 1);
    if (w->memo[j].s) {
        uint32_t i = w->memo[j].idx;
        if (i < 256) { op(w, 'h'); le(w, i, 1); }
        else { op(w, 'j'); le(w, i, 4); }
        return;
    }
    size_t n = strlen(s);
    if (n < 256) { op(w, 0x8c); le(w, n, 1); }
    else { op(w, 'X'); le(w, n, 4); }
    put(w, s, n);
    op(w, 0x94);
    char *c = tk_strdup(s);
    if (!c) { w->failed = 1; return; }
    w->memo[j].s = c;
    w->memo[j].idx = (uint32_t)w->memo_n++;
}

void tk_pickle_w_destroy(tk_pickle_w **pw) {
    if (!pw || !*pw) return;
    for (size_t i = 0; i < (*pw)->memo_cap; i++) free((*pw)->memo[i].s);
    free((*pw)->memo);
    free((*pw)->buf);
    free(*pw);
    *pw = NULL;
}

uint8_t *tk_pickle_w_finish(tk_pickle_w **pw, size_t *len) {
    tk_pickle_w *w = pw ? *pw : NULL;
    if (!w) return NULL;
    op(w, '.');
    uint8_t *b = NULL;
    if (!w->failed) {
        b = w->buf;
        *len = w->len;
        w->buf = NULL;
    }
    tk_pickle_w_destroy(pw);
    return b;
}
