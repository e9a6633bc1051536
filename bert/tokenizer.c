/* tokenizer.c — WordPiece as HF `tokenizers` does it (BertNormalizer,
 * BertPreTokenizer, WordPiece, BERT template), see tk_tokenizer.h.
 *
 * How: one pass over the text decodes UTF-8, normalizes each code point
 * (clean, CJK, accents, case) and builds words; each normalized code point
 * remembers the original character and byte span it came from, so a word
 * piece's offsets are (first piece char's start, last piece char's end), which
 * is what HF's alignment tracking yields. Vocabulary lookups hash byte ranges
 * of the normalized word directly (two tables: whole tokens and "##" pieces),
 * so no string is built per candidate. ASCII takes a table-driven fast path;
 * other code points go through utf8proc (category, NFD, lower-case).
 */
#include "tk_tokenizer.h"
#include "tk_files.h"
#include "tk_host_mem.h"
#include "tk_safetensors.h" /* tk_write_file_atomic */

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

typedef struct {
    uint32_t *slot; /* token id + 1, 0 = empty */
    uint32_t mask;
} tok_table;

struct tk_tokenizer {
    int n;
    char **tok;        /* n tokens, NUL-terminated, into arena */
    uint32_t *toklen;
    char *arena;
    tok_table whole, cont; /* cont keys are tokens without their "##" */
    int max_whole, max_cont; /* longest key in bytes */
    int lowercase, strip_accents, max_word_chars;
    int split_cjk, clean; /* BertNormalizer's handle_chinese_chars and clean_text */
    tk_special_ids sp;
    /* Tokens matched in the raw text before any normalization, as HF's
     * added vocabulary does: "a [SEP] b" has the [SEP] token. vocab.txt:
     * the five BERT specials it holds; tokenizer.json: its added_tokens. */
    int32_t added[32];
    int n_added;
    uint8_t added_first[256]; /* 1 for a byte that starts an added token: the fast no */
};

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* Looks up key in table; tokens store the key at tok[id] + skip. */
static int table_find(const tk_tokenizer *t, const tok_table *tb, int skip, const char *k, size_t n) {
    uint32_t i = hash_bytes(k, n) & tb->mask;
    for (;;) {
        uint32_t v = tb->slot[i];
        if (!v) return -1;
        int id = (int)v - 1;
        if (t->toklen[id] - (uint32_t)skip == n && memcmp(t->tok[id] + skip, k, n) == 0) return id;
        i = (i + 1) & tb->mask;
    }
}

static void table_put(tk_tokenizer *t, tok_table *tb, int skip, int id) {
    const char *k = t->tok[id] + skip;
    size_t n = t->toklen[id] - (uint32_t)skip;
    uint32_t i = hash_bytes(k, n) & tb->mask;
    for (;;) {
        uint32_t v = tb->slot[i];
        if (!v) { tb->slot[i] = (uint32_t)id + 1; return; }
        int o = (int)v - 1;
        /* a duplicate token: the later line wins, as in HF's vocab map */
        if (t->toklen[o] - (uint32_t)skip == n && memcmp(t->tok[o] + skip, k, n) == 0) {
            tb->slot[i] = (uint32_t)id + 1;
            return;
        }
        i = (i + 1) & tb->mask;
    }
}

static int is_upper_token(const char *s, size_t n) {
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') return 0; /* [CLS], [unused1] */
    utf8proc_ssize_t i = 0;
    while (i < (utf8proc_ssize_t)n) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const uint8_t *)s + i, (utf8proc_ssize_t)n - i, &c);
        if (k <= 0) return 0;
        if (utf8proc_category(c) == UTF8PROC_CATEGORY_LU) return 1;
        i += k;
    }
    return 0;
}

void tk_tokenizer_destroy(tk_tokenizer **p) {
    if (!p || !*p) return;
    tk_tokenizer *t = *p;
    free(t->tok);
    free(t->toklen);
    free(t->arena);
    free(t->whole.slot);
    free(t->cont.slot);
    free(t);
    *p = NULL;
}

static void set_added_first(tk_tokenizer *t) {
    memset(t->added_first, 0, sizeof t->added_first);
    for (int a = 0; a < t->n_added; a++) t->added_first[(uint8_t)t->tok[t->added[a]][0]] = 1;
}

/* Builds the tokenizer from `n` tokens laid out NUL-separated in `arena`
 * (takes ownership of arena, even on failure). `unk` is the unknown token's
 * text (tokenizer.json may name another than [UNK]). */
static tk_tokenizer *build(char *arena, int n, const char *name, const char *unk, const tk_tokenizer_opts *opts,
                           tk_err *err) {
    tk_tokenizer *t = tk_calloc(1, sizeof *t);
    if (!t) { free(arena); tk_err_set(err, TK_ENOMEM, "%s: out of host memory", name); return NULL; }
    t->arena = arena;
    t->n = n;
    t->tok = tk_malloc(sizeof(char *) * (size_t)(n ? n : 1));
    t->toklen = tk_malloc(sizeof(uint32_t) * (size_t)(n ? n : 1));
    uint32_t cap = 16;
    while (cap < (uint32_t)n * 2u + 2u) cap <<= 1;
    t->whole.slot = tk_calloc(cap, sizeof(uint32_t));
    t->cont.slot = tk_calloc(cap, sizeof(uint32_t));
    t->whole.mask = t->cont.mask = cap - 1;
    if (!t->tok || !t->toklen || !t->whole.slot || !t->cont.slot) {
        tk_tokenizer_destroy(&t);
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", name);
        return NULL;
    }
    char *s = arena;
    int upper = 0;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(s);
        t->tok[i] = s;
        t->toklen[i] = (uint32_t)len;
        s += len + 1;
    }
    for (int i = 0; i < n; i++) {
        size_t len = t->toklen[i];
        table_put(t, &t->whole, 0, i);
        if ((int)len > t->max_whole) t->max_whole = (int)len;
        if (len > 2 && t->tok[i][0] == '#' && t->tok[i][1] == '#') {
            table_put(t, &t->cont, 2, i);
            if ((int)len - 2 > t->max_cont) t->max_cont = (int)len - 2;
        }
        if (!upper) upper = is_upper_token(t->tok[i], len);
    }
    t->sp.pad = table_find(t, &t->whole, 0, "[PAD]", 5);
    t->sp.unk = table_find(t, &t->whole, 0, unk, strlen(unk));
    t->sp.cls = table_find(t, &t->whole, 0, "[CLS]", 5);
    t->sp.sep = table_find(t, &t->whole, 0, "[SEP]", 5);
    t->sp.mask = table_find(t, &t->whole, 0, "[MASK]", 6);
    const char *missing = t->sp.unk < 0 ? unk : t->sp.cls < 0 ? "[CLS]" : t->sp.sep < 0 ? "[SEP]"
                        : t->sp.pad < 0 ? "[PAD]" : NULL;
    if (missing) {
        tk_err_set(err, TK_EFORMAT, "%s: no %s token (a BERT vocab.txt needs [PAD] [UNK] [CLS] [SEP])",
                   name, missing);
        tk_tokenizer_destroy(&t);
        return NULL;
    }
    int lc = opts ? opts->lowercase : -1;
    t->lowercase = lc < 0 ? !upper : lc != 0;
    int sa = opts ? opts->strip_accents : -1;
    t->strip_accents = sa < 0 ? t->lowercase : sa != 0;
    t->max_word_chars = opts && opts->max_word_chars > 0 ? opts->max_word_chars : 100;
    t->split_cjk = !(opts && opts->keep_cjk);
    t->clean = !(opts && opts->keep_control);
    const int32_t sp5[5] = {t->sp.pad, t->sp.unk, t->sp.cls, t->sp.sep, t->sp.mask};
    for (int i = 0; i < 5; i++)
        if (sp5[i] >= 0) t->added[t->n_added++] = sp5[i];
    set_added_first(t);
    return t;
}

tk_tokenizer *tk_tokenizer_from_tokens(const char *const *tokens, int n, const char *name,
                                       const tk_tokenizer_opts *opts, tk_err *err) {
    if (!name) name = "vocab";
    size_t total = 1;
    for (int i = 0; i < n; i++) total += strlen(tokens[i]) + 1;
    char *arena = tk_malloc(total);
    if (!arena) { tk_err_set(err, TK_ENOMEM, "%s: out of host memory", name); return NULL; }
    char *s = arena;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(tokens[i]);
        if (len == 0) {
            free(arena);
            tk_err_set(err, TK_EFORMAT, "%s: token %d is empty", name, i);
            return NULL;
        }
        memcpy(s, tokens[i], len + 1);
        s += len + 1;
    }
    return build(arena, n, name, "[UNK]", opts, err);
}

static tk_tokenizer *from_json(const char *path, const tk_tokenizer_opts *opts, tk_err *err);

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

tk_tokenizer *tk_tokenizer_new(const char *path, const tk_tokenizer_opts *opts, tk_err *err) {
    if (!path || !*path) { tk_err_set(err, TK_EINVAL, "vocab: no vocab.txt path given"); return NULL; }
    if (ends_with(path, ".json")) return from_json(path, opts, err);
    FILE *f = fopen(path, "rb");
    if (!f) { tk_err_set(err, TK_EIO, "%s: cannot open vocabulary: %s", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, len = 0;
    char *buf = tk_malloc(cap + 1);
    while (buf) {
        size_t k = fread(buf + len, 1, cap - len, f);
        len += k;
        if (len < cap) break;
        cap *= 2;
        char *nb = tk_realloc(buf, cap + 1);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
    }
    int rd_err = ferror(f);
    fclose(f);
    if (!buf) { tk_err_set(err, TK_ENOMEM, "%s: out of host memory", path); return NULL; }
    if (rd_err) { free(buf); tk_err_set(err, TK_EIO, "%s: read error", path); return NULL; }
    buf[len] = '\0';
    /* Lines become NUL-separated tokens in place; trailing white space is
     * trimmed as HF's reader does. */
    int n = 0, line = 0;
    char *w = buf;
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && buf[j] != '\n') j++;
        line++;
        size_t e = j;
        while (e > i && (buf[e - 1] == '\r' || buf[e - 1] == ' ' || buf[e - 1] == '\t')) e--;
        if (e == i) {
            if (j >= len) break; /* a blank last line is just the file's end */
            free(buf);
            tk_err_set(err, TK_EFORMAT, "%s:%d: empty token (each line of vocab.txt is one token)", path, line);
            return NULL;
        }
        memmove(w, buf + i, e - i);
        w += e - i;
        *w++ = '\0';
        n++;
        i = j + 1;
    }
    if (n == 0) { free(buf); tk_err_set(err, TK_EFORMAT, "%s: empty vocabulary", path); return NULL; }
    const char *base = strrchr(path, '/');
    return build(buf, n, base ? base + 1 : path, "[UNK]", opts, err);
}

int tk_tokenizer_vocab_size(const tk_tokenizer *t) { return t->n; }
int tk_tokenizer_lowercase(const tk_tokenizer *t) { return t->lowercase; }
int tk_tokenizer_token_to_id(const tk_tokenizer *t, const char *token) {
    return table_find(t, &t->whole, 0, token, strlen(token));
}
const char *tk_tokenizer_id_to_token(const tk_tokenizer *t, int id) {
    return id >= 0 && id < t->n ? t->tok[id] : NULL;
}
tk_special_ids tk_tokenizer_special(const tk_tokenizer *t) { return t->sp; }

void tk_encoding_clear(tk_encoding *e) {
    if (!e) return;
    free(e->ids); free(e->type_ids); free(e->seq);
    free(e->start); free(e->end); free(e->bstart); free(e->bend);
    memset(e, 0, sizeof *e);
}

static int enc_reserve(tk_encoding *e, int need) {
    if (need <= e->cap) return 0;
    int cap = e->cap ? e->cap : 64;
    while (cap < need) cap *= 2;
    int32_t **arr[] = {&e->ids, &e->type_ids, &e->seq, &e->start, &e->end, &e->bstart, &e->bend};
    for (size_t k = 0; k < sizeof arr / sizeof arr[0]; k++) {
        int32_t *p = tk_realloc(*arr[k], sizeof(int32_t) * (size_t)cap);
        if (!p) return -1; /* arrays already grown stay valid; cap is unchanged */
        *arr[k] = p;
    }
    e->cap = cap;
    return 0;
}

static void enc_push(tk_encoding *e, int32_t id, int32_t type, int32_t seq, int32_t s, int32_t en,
                     int32_t bs, int32_t be) {
    int i = e->n++;
    e->ids[i] = id; e->type_ids[i] = type; e->seq[i] = seq;
    e->start[i] = s; e->end[i] = en; e->bstart[i] = bs; e->bend[i] = be;
}

/* ---- character classes (HF BertNormalizer / BertPreTokenizer) --------- */


static inline int is_cjk(int32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Rust's char::is_whitespace beyond ASCII (U+0085 is Cc and dropped before). */
static inline int is_space_u(int32_t c) {
    return c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static inline int is_ascii_punct(int32_t c) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}

static inline int is_punct_u(int32_t c) {
    if (c < 128) return is_ascii_punct(c);
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* Category C (Cc Cf Cs Co Cn): removed by cleaning. */
static inline int is_other_u(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF ||
           k == UTF8PROC_CATEGORY_CS || k == UTF8PROC_CATEGORY_CO;
}

/* ---- the word buffer: normalized bytes plus per-code-point origins ----- */

typedef struct {
    char *b; int blen, bcap;
    int32_t *cpb;            /* n+1: byte offset of each normalized code point in b */
    int32_t *cs, *ce, *bs, *be; /* n: original char and byte span */
    int n, cap;
} word_buf;

static void word_free(word_buf *w) {
    free(w->b); free(w->cpb); free(w->cs); free(w->ce); free(w->bs); free(w->be);
}

static int word_push(word_buf *w, int32_t c, int32_t cs, int32_t bs, int32_t be) {
    if (w->n + 1 >= w->cap) {
        int cap = w->cap ? w->cap * 2 : 64;
        int32_t **arr[] = {&w->cpb, &w->cs, &w->ce, &w->bs, &w->be};
        for (int k = 0; k < 5; k++) {
            int32_t *p = tk_realloc(*arr[k], sizeof(int32_t) * (size_t)cap);
            if (!p) return -1;
            *arr[k] = p;
        }
        w->cap = cap;
    }
    if (w->blen + 4 > w->bcap) {
        int cap = w->bcap ? w->bcap * 2 : 256;
        char *p = tk_realloc(w->b, (size_t)cap);
        if (!p) return -1;
        w->b = p;
        w->bcap = cap;
    }
    int i = w->n++;
    w->cpb[i] = w->blen;
    w->cs[i] = cs; w->ce[i] = cs + 1; w->bs[i] = bs; w->be[i] = be;
    if (c < 0x80) w->b[w->blen++] = (char)c;
    else w->blen += (int)utf8proc_encode_char(c, (uint8_t *)w->b + w->blen);
    w->cpb[w->n] = w->blen;
    return 0;
}

typedef struct {
    const tk_tokenizer *t;   /* NULL for pre-tokenizing only */
    tk_encoding *enc;        /* encoding sink, or NULL */
    int seq;
    long count;              /* counting sink */
    tk_word_fn fn; void *user; /* word sink */
} sink;

/* WordPiece over the buffered word, then empties it. */
static int word_flush(sink *s, word_buf *w) {
    if (w->n == 0) return 0;
    int n = w->n;
    if (s->fn) { s->fn(w->b, (size_t)w->blen, s->user); w->n = 0; w->blen = 0; return 0; }
    const tk_tokenizer *t = s->t;
    tk_encoding *e = s->enc;
    int base = e ? e->n : 0;
    if (e && enc_reserve(e, e->n + n) != 0) return -1;
    long pieces = 0;
    int ok = n <= t->max_word_chars;
    int st = 0;
    while (ok && st < n) {
        const tok_table *tb = st ? &t->cont : &t->whole;
        int maxb = st ? t->max_cont : t->max_whole;
        int en = n, id = -1;
        while (en > st && w->cpb[en] - w->cpb[st] > maxb) en--;
        for (; en > st; en--) {
            id = table_find(t, tb, st ? 2 : 0, w->b + w->cpb[st], (size_t)(w->cpb[en] - w->cpb[st]));
            if (id >= 0) break;
        }
        if (id < 0) { ok = 0; break; }
        if (e) enc_push(e, id, s->seq, s->seq, w->cs[st], w->ce[en - 1], w->bs[st], w->be[en - 1]);
        pieces++;
        st = en;
    }
    if (!ok) {
        pieces = 1;
        if (e) {
            e->n = base;
            enc_push(e, t->sp.unk, s->seq, s->seq, w->cs[0], w->ce[n - 1], w->bs[0], w->be[n - 1]);
        }
    }
    s->count += pieces;
    w->n = 0;
    w->blen = 0;
    return 0;
}

/* The normalizer and pre-tokenizer in one pass; words go to the sink. */
/* The added token that starts text[i..len) (the longest, as HF's
 * leftmost-longest matcher takes), or -1. */
static int added_at(const tk_tokenizer *t, const char *text, size_t i, size_t len) {
    int best = -1;
    uint32_t best_len = 0;
    for (int a = 0; a < t->n_added; a++) {
        int32_t id = t->added[a];
        uint32_t n = t->toklen[id];
        if (n > best_len && n <= len - i && memcmp(text + i, t->tok[id], n) == 0) {
            best = id;
            best_len = n;
        }
    }
    return best;
}

static int run(sink *s, const char *text, size_t len, int lower, int strip, int split_cjk, int clean) {
    word_buf w = {0};
    const uint8_t *p = (const uint8_t *)text;
    int32_t ci = 0;
    int rc = 0;
    size_t i = 0;
    const tk_tokenizer *t = s->t;
    while (i < len && rc == 0) {
        int32_t c;
        size_t k;
        int id = t && t->added_first[p[i]] ? added_at(t, text, i, len) : -1;
        if (id >= 0) { /* an added token: a word of its own, never normalized */
            if ((rc = word_flush(s, &w)) != 0) break;
            size_t nb = t->toklen[id];
            int32_t nc = 0; /* its characters: the bytes that start one */
            for (size_t j = 0; j < nb; j++) nc += (p[i + j] & 0xC0) != 0x80;
            if (s->enc) {
                if (enc_reserve(s->enc, s->enc->n + 1) != 0) { rc = -1; break; }
                enc_push(s->enc, id, s->seq, s->seq, ci, ci + nc, (int32_t)i, (int32_t)(i + nb));
            }
            s->count++;
            i += nb;
            ci += nc;
            continue;
        }
        if (p[i] < 0x80) {
            c = p[i];
            k = 1;
        } else {
            utf8proc_ssize_t r = utf8proc_iterate(p + i, (utf8proc_ssize_t)(len - i), &c);
            if (r <= 0) { c = 0xFFFD; k = 1; } else k = (size_t)r;
        }
        int32_t bs = (int32_t)i, be = (int32_t)(i + k), cs = ci;
        i += k;
        ci++;
        if (c < 0x80) {
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') { rc = word_flush(s, &w); continue; }
            /* without cleaning, control characters stay in words, and the
             * pre-tokenizer still splits on the two it counts as space */
            if (!clean && (c == 0x0B || c == 0x0C)) { rc = word_flush(s, &w); continue; }
            if (clean && (c < 32 || c == 127)) continue;
            if (is_ascii_punct(c)) {
                if ((rc = word_flush(s, &w)) != 0) break;
                if (word_push(&w, c, cs, bs, be) != 0) { rc = -1; break; }
                rc = word_flush(s, &w);
                continue;
            }
            if (lower && c >= 'A' && c <= 'Z') c += 32;
            if (word_push(&w, c, cs, bs, be) != 0) rc = -1;
            continue;
        }
        if (clean && (c == 0xFFFD || is_other_u(c))) continue;
        if (is_space_u(c) || (!clean && c == 0x85)) { rc = word_flush(s, &w); continue; }
        int cjk = split_cjk && is_cjk(c);
        if (cjk && (rc = word_flush(s, &w)) != 0) break;
        utf8proc_int32_t nb[16];
        int nn = 1;
        nb[0] = c;
        if (strip) {
            int bc = 0;
            utf8proc_ssize_t r = utf8proc_decompose_char(c, nb, 16, UTF8PROC_DECOMPOSE, &bc);
            nn = r > 0 && r <= 16 ? (int)r : 1;
            if (nn == 1 && r <= 0) nb[0] = c;
        }
        for (int j = 0; j < nn && rc == 0; j++) {
            int32_t d = nb[j];
            if (strip && utf8proc_category(d) == UTF8PROC_CATEGORY_MN) continue;
            if (lower) d = utf8proc_tolower(d);
            if (is_punct_u(d)) {
                if ((rc = word_flush(s, &w)) != 0) break;
                if (word_push(&w, d, cs, bs, be) != 0) { rc = -1; break; }
                rc = word_flush(s, &w);
                continue;
            }
            if (word_push(&w, d, cs, bs, be) != 0) rc = -1;
        }
        if (cjk && rc == 0) rc = word_flush(s, &w);
    }
    if (rc == 0) rc = word_flush(s, &w);
    word_free(&w);
    return rc;
}

tk_status tk_tokenize_append(const tk_tokenizer *t, const char *text, size_t len, int seq,
                             tk_encoding *out, tk_err *err) {
    if (len == (size_t)-1) len = text ? strlen(text) : 0;
    sink s = {.t = t, .enc = out, .seq = seq};
    if (run(&s, text, len, t->lowercase, t->strip_accents, t->split_cjk, t->clean) != 0) {
        tk_err_set(err, TK_ENOMEM, "tokenizer: out of host memory");
        return TK_ENOMEM;
    }
    return TK_OK;
}

int tk_count_tokens(const tk_tokenizer *t, const char *text, size_t len) {
    if (len == (size_t)-1) len = text ? strlen(text) : 0;
    sink s = {.t = t};
    if (run(&s, text, len, t->lowercase, t->strip_accents, t->split_cjk, t->clean) != 0) return -1;
    return (int)s.count;
}

tk_status tk_pretokenize(const char *text, size_t len, int lowercase, tk_word_fn fn, void *user) {
    if (len == (size_t)-1) len = text ? strlen(text) : 0;
    sink s = {.fn = fn, .user = user};
    return run(&s, text, len, lowercase != 0, lowercase != 0, 1, 1) == 0 ? TK_OK : TK_ENOMEM; /* run fails only for host memory */
}

static const char *trunc_name(tk_truncation s) {
    return s == TK_TRUNC_ONLY_FIRST ? "only_first" : s == TK_TRUNC_ONLY_SECOND ? "only_second" : "longest_first";
}

tk_status tk_encode(const tk_tokenizer *t, const char *a, const char *b, int max_len,
                    tk_truncation strategy, tk_encoding *out, int *truncated, tk_err *err) {
    if (truncated) *truncated = 0;
    out->n = 0;
    if (enc_reserve(out, 4) != 0) goto oom;
    enc_push(out, t->sp.cls, 0, -1, 0, 0, 0, 0);
    tk_status ast = tk_tokenize_append(t, a ? a : "", (size_t)-1, 0, out, err);
    if (ast != TK_OK) return ast;
    int na = out->n - 1;
    if (enc_reserve(out, out->n + 1) != 0) goto oom;
    enc_push(out, t->sp.sep, 0, -1, 0, 0, 0, 0);
    int nb = 0;
    if (b) {
        tk_status bst = tk_tokenize_append(t, b, (size_t)-1, 1, out, err);
        if (bst != TK_OK) return bst;
        nb = out->n - na - 2;
        if (enc_reserve(out, out->n + 1) != 0) goto oom;
        enc_push(out, t->sp.sep, 1, -1, 0, 0, 0, 0);
    }
    if (max_len <= 0 || strategy == TK_TRUNC_NONE || out->n <= max_len) return TK_OK;
    int added = b ? 3 : 2;
    int m = max_len - added;
    if (m < 0) {
        tk_err_set(err, TK_EINVAL, "max_len %d is shorter than the %d special tokens", max_len, added);
        return TK_EINVAL;
    }
    int ta = na, tb = nb, remove = na + nb - m;
    if (!b || strategy == TK_TRUNC_ONLY_FIRST || strategy == TK_TRUNC_ONLY_SECOND) {
        int second = b && strategy == TK_TRUNC_ONLY_SECOND;
        if (!b && strategy == TK_TRUNC_ONLY_SECOND) {
            tk_err_set(err, TK_EINVAL, "truncation only_second needs a text pair (text_pair_col)");
            return TK_EINVAL;
        }
        int have = second ? nb : na;
        if (have <= remove) {
            tk_err_set(err, TK_EINVAL,
                       "truncation %s cannot fit max_len %d: the %s text has %d tokens, %d must go "
                       "(use longest_first or a larger max_len)",
                       trunc_name(strategy), max_len, second ? "second" : "first", have, remove);
            return TK_EINVAL;
        }
        if (second) tb = nb - remove; else ta = na - remove;
    } else {
        /* HF tokenizers' longest_first: the shorter keeps its length when
         * the longer can take the rest; otherwise both get half. */
        int n1 = na, n2 = nb, swap = 0;
        if (n1 > n2) { swap = 1; int x = n1; n1 = n2; n2 = x; }
        if (n1 > m) n2 = n1; else n2 = n1 > m - n1 ? n1 : m - n1;
        if (n1 + n2 > m) { n1 = m / 2; n2 = n1 + m % 2; }
        if (swap) { int x = n1; n1 = n2; n2 = x; }
        ta = n1 < na ? n1 : na;
        tb = n2 < nb ? n2 : nb;
    }
    /* Compact in place: [CLS] A[0,ta) [SEP] B[0,tb) [SEP]; moves only left. */
    int dst = 1 + ta, src = 1 + na;
    int32_t **arr[] = {&out->ids, &out->type_ids, &out->seq, &out->start, &out->end, &out->bstart, &out->bend};
    int count = 1 + (b ? tb + 1 : 0);
    for (size_t k = 0; k < sizeof arr / sizeof arr[0]; k++) {
        int32_t *v = *arr[k];
        v[dst] = v[src];                                       /* first [SEP] */
        if (b) {
            memmove(v + dst + 1, v + src + 1, sizeof(int32_t) * (size_t)tb); /* B prefix */
            v[dst + 1 + tb] = v[src + 1 + nb];                 /* last [SEP] */
        }
    }
    out->n = dst + count;
    if (truncated) *truncated = 1;
    return TK_OK;
oom:
    tk_err_set(err, TK_ENOMEM, "tokenizer: out of host memory");
    return TK_ENOMEM;
}

/* ---- tokenizer.json (HF tokenizers' own file) ------------------------------ */

/* A tokenizer.json error: the file and the key, then what is wrong. */
#define JSON_FAIL(code, ...)                         \
    do {                                             \
        tk_err_set(err, code, __VA_ARGS__);          \
        goto fail;                                   \
    } while (0)

/* A boolean field of an object; `dflt` when absent; -1 for null when
 * `null_ok`; -2 when it is something else. */
static int json_flag(const json_t *o, const char *key, int dflt, int null_ok) {
    json_t *v = json_object_get(o, key);
    if (!v) return dflt;
    if (json_is_boolean(v)) return json_is_true(v);
    if (null_ok && json_is_null(v)) return -1;
    return -2;
}

static tk_tokenizer *from_json(const char *path, const tk_tokenizer_opts *opts, tk_err *err) {
    json_error_t je;
    char **by_id = NULL;
    char *arena = NULL;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        tk_err_set(err, je.line < 0 || strstr(je.text, "unable to open") ? TK_EIO : TK_EFORMAT, "%s:%d: %s", path,
                   je.line, je.text);
        return NULL;
    }
    if (!json_is_object(root)) JSON_FAIL(TK_EFORMAT, "%s: not a JSON object", path);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) JSON_FAIL(TK_EFORMAT, "%s: \"model\" must be an object", path);
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "WordPiece"))
        JSON_FAIL(TK_EFORMAT, "%s: \"model.type\" is %s%s%s; only WordPiece (BERT's tokenizer) is supported", path,
                  type ? "\"" : "", type ? type : "missing", type ? "\"" : "");
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab) || json_object_size(vocab) == 0)
        JSON_FAIL(TK_EFORMAT, "%s: \"model.vocab\" must be a non-empty object of token: id", path);
    json_t *unk_v = json_object_get(model, "unk_token");
    if (unk_v && !json_is_string(unk_v)) JSON_FAIL(TK_EFORMAT, "%s: \"model.unk_token\" must be a string", path);
    const char *unk = unk_v ? json_string_value(unk_v) : "[UNK]";
    json_t *pre = json_object_get(model, "continuing_subword_prefix");
    if (pre && (!json_is_string(pre) || strcmp(json_string_value(pre), "##")))
        JSON_FAIL(TK_EFORMAT, "%s: \"model.continuing_subword_prefix\" must be \"##\" (BERT's); other prefixes are "
                  "not supported", path);
    int max_word = 100;
    json_t *mw = json_object_get(model, "max_input_chars_per_word");
    if (mw) {
        if (!json_is_integer(mw) || json_integer_value(mw) <= 0 || json_integer_value(mw) > 1 << 20)
            JSON_FAIL(TK_EFORMAT, "%s: \"model.max_input_chars_per_word\" must be a positive integer", path);
        max_word = (int)json_integer_value(mw);
    }
    /* tokens in id order; every id 0..n-1 must be someone's */
    int n = (int)json_object_size(vocab);
    by_id = tk_calloc((size_t)n, sizeof *by_id);
    if (!by_id) JSON_FAIL(TK_ENOMEM, "%s: out of host memory", path);
    size_t total = 1;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= n)
            JSON_FAIL(TK_EFORMAT, "%s: \"model.vocab\": \"%s\" has id %s; ids must be 0..%d", path, k,
                      json_is_integer(v) ? "out of range" : "that is not an integer", n - 1);
        if (!*k) JSON_FAIL(TK_EFORMAT, "%s: \"model.vocab\": an empty token (id %d)", path, (int)id);
        if (by_id[id]) JSON_FAIL(TK_EFORMAT, "%s: \"model.vocab\": id %d is both \"%s\" and \"%s\"", path, (int)id,
                                 by_id[id], k);
        by_id[id] = (char *)k;
        total += strlen(k) + 1;
    }
    /* n distinct ids in 0..n-1 cover every id, so no gap is possible here */
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added)) JSON_FAIL(TK_EFORMAT, "%s: \"added_tokens\" must be an array", path);
    if (json_array_size(added) > 32)
        JSON_FAIL(TK_EFORMAT, "%s: \"added_tokens\" has %zu entries; at most 32 are supported", path,
                  json_array_size(added));
    int32_t added_ids[32];
    int n_added = 0;
    size_t ai;
    json_array_foreach(added, ai, v) {
        json_t *idv = json_object_get(v, "id");
        const char *content = json_string_value(json_object_get(v, "content"));
        if (!json_is_integer(idv) || !content)
            JSON_FAIL(TK_EFORMAT, "%s: \"added_tokens[%zu]\" needs an integer \"id\" and a string \"content\"", path,
                      ai);
        json_int_t id = json_integer_value(idv);
        if (id < 0 || id >= n)
            JSON_FAIL(TK_EFORMAT, "%s: \"added_tokens[%zu]\": \"%s\" (id %lld) is not in \"model.vocab\"; tokens "
                      "added beyond the WordPiece vocabulary are not supported", path, ai, content, (long long)id);
        if (strcmp(by_id[id], content))
            JSON_FAIL(TK_EFORMAT, "%s: \"added_tokens[%zu]\": id %lld is \"%s\" here but \"%s\" in \"model.vocab\"",
                      path, ai, (long long)id, content, by_id[id]);
        /* matched in the raw text; one matched after normalization, or only as a whole word or with its
         * spaces, is another matcher */
        static const char *const flags[] = {"normalized", "single_word", "lstrip", "rstrip"};
        for (int f = 0; f < 4; f++)
            if (json_is_true(json_object_get(v, flags[f])))
                JSON_FAIL(TK_EFORMAT, "%s: \"added_tokens[%zu]\" (\"%s\"): \"%s\": true is not supported", path, ai,
                          content, flags[f]);
        added_ids[n_added++] = (int32_t)id;
    }
    /* the normalizer: BertNormalizer, or none at all */
    tk_tokenizer_opts o = {.lowercase = 0, .strip_accents = 0, .max_word_chars = max_word, .keep_cjk = 1,
                           .keep_control = 1};
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        const char *nt = json_string_value(json_object_get(norm, "type"));
        if (!nt || strcmp(nt, "BertNormalizer"))
            JSON_FAIL(TK_EFORMAT, "%s: \"normalizer.type\" is %s%s%s; only BertNormalizer is supported", path,
                      nt ? "\"" : "", nt ? nt : "missing", nt ? "\"" : "");
        int lc = json_flag(norm, "lowercase", 1, 0), sa = json_flag(norm, "strip_accents", -1, 1);
        int cjk = json_flag(norm, "handle_chinese_chars", 1, 0), clean = json_flag(norm, "clean_text", 1, 0);
        const char *bad = lc == -2 ? "lowercase" : sa == -2 ? "strip_accents" : cjk == -2 ? "handle_chinese_chars"
                        : clean == -2 ? "clean_text" : NULL;
        if (bad) JSON_FAIL(TK_EFORMAT, "%s: \"normalizer.%s\" must be true or false%s", path, bad,
                           strcmp(bad, "strip_accents") ? "" : " (or null: follow lowercase)");
        o.lowercase = lc;
        o.strip_accents = sa; /* null: as lowercase, which build() applies */
        o.keep_cjk = !cjk;
        o.keep_control = !clean;
    }
    json_t *pt = json_object_get(root, "pre_tokenizer");
    const char *ptt = json_string_value(json_object_get(pt, "type"));
    if (!ptt || strcmp(ptt, "BertPreTokenizer"))
        JSON_FAIL(TK_EFORMAT, "%s: \"pre_tokenizer.type\" is %s%s%s; only BertPreTokenizer is supported", path,
                  ptt ? "\"" : "", ptt ? ptt : "missing", ptt ? "\"" : "");
    json_t *pp = json_object_get(root, "post_processor");
    const char *ppt = json_string_value(json_object_get(pp, "type"));
    if (pp && !json_is_null(pp) && (!ppt || (strcmp(ppt, "TemplateProcessing") && strcmp(ppt, "BertProcessing"))))
        JSON_FAIL(TK_EFORMAT, "%s: \"post_processor.type\" is %s%s%s; only BERT's template ([CLS] A [SEP] B [SEP]) "
                  "is supported", path, ppt ? "\"" : "", ppt ? ppt : "missing", ppt ? "\"" : "");
    /* what the caller forces wins over the file */
    if (opts && opts->lowercase >= 0) o.lowercase = opts->lowercase;
    if (opts && opts->strip_accents >= 0) o.strip_accents = opts->strip_accents;
    if (opts && opts->max_word_chars > 0) o.max_word_chars = opts->max_word_chars;
    arena = tk_malloc(total);
    if (!arena) JSON_FAIL(TK_ENOMEM, "%s: out of host memory", path);
    char *s = arena;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(by_id[i]);
        memcpy(s, by_id[i], len + 1);
        s += len + 1;
    }
    char unk_copy[256];
    snprintf(unk_copy, sizeof unk_copy, "%s", unk);
    int has_added = added != NULL;
    free(by_id);
    json_decref(root);
    const char *base = strrchr(path, '/');
    tk_tokenizer *t = build(arena, n, base ? base + 1 : path, unk_copy, &o, err);
    if (t && has_added) { /* the file's list, not the five BERT names */
        memcpy(t->added, added_ids, sizeof(int32_t) * (size_t)n_added);
        t->n_added = n_added;
        set_added_first(t);
    }
    return t;
fail:
    free(by_id);
    free(arena);
    json_decref(root);
    return NULL;
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

tk_tokenizer *tk_tokenizer_from_folder(const char *dir, const tk_tokenizer_opts *opts, char *used, size_t un,
                                       tk_err *err) {
    char vt[4096], tj[4096];
    snprintf(vt, sizeof vt, "%s/vocab.txt", dir);
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    int has_vt = is_file(vt), has_tj = is_file(tj);
    if (used && un) used[0] = 0;
    if (!has_vt && !has_tj) {
        tk_err_set(err, TK_EIO, "%s: no tokenizer: neither vocab.txt nor tokenizer.json is there", dir);
        return NULL;
    }
    if (!has_vt) {
        if (used && un) snprintf(used, un, "%s", tj);
        return from_json(tj, opts, err);
    }
    if (used && un) snprintf(used, un, "%s", vt);
    if (!has_tj) return tk_tokenizer_new(vt, opts, err);
    /* Both: transformers' fast tokenizer reads tokenizer.json, so its
     * normalizer decides what the caller left open; the vocabularies must be
     * the same list. */
    tk_tokenizer *j = from_json(tj, opts, err);
    if (!j) return NULL;
    tk_tokenizer_opts o = opts ? *opts : (tk_tokenizer_opts){.lowercase = -1, .strip_accents = -1};
    if (o.lowercase < 0) o.lowercase = j->lowercase;
    if (o.strip_accents < 0) o.strip_accents = j->strip_accents;
    if (o.max_word_chars <= 0) o.max_word_chars = j->max_word_chars;
    o.keep_cjk = !j->split_cjk;
    o.keep_control = !j->clean;
    tk_tokenizer *t = tk_tokenizer_new(vt, &o, err);
    if (t) {
        int diff = -1, common = t->n < j->n ? t->n : j->n;
        for (int i = 0; diff < 0 && i < common; i++)
            if (strcmp(t->tok[i], j->tok[i])) diff = i;
        if (diff < 0 && t->n != j->n) diff = common;
        if (diff >= 0 || t->sp.unk != j->sp.unk) {
            if (diff >= 0)
                tk_err_set(err, TK_EFORMAT,
                           "%s and %s disagree: %d and %d tokens, first difference at id %d (\"%s\" vs \"%s\"); "
                           "remove the one that does not belong to this model",
                           vt, tj, t->n, j->n, diff, diff < t->n ? t->tok[diff] : "(none)",
                           diff < j->n ? j->tok[diff] : "(none)");
            else
                tk_err_set(err, TK_EFORMAT, "%s and %s disagree: the unknown token is \"%s\" in one and \"%s\" in "
                           "the other", vt, tj, t->tok[t->sp.unk], j->tok[j->sp.unk]);
            tk_tokenizer_destroy(&t);
        }
    }
    tk_tokenizer_destroy(&j);
    return t;
}

tk_status tk_tokenizer_write_vocab(const tk_tokenizer *t, const char *path, tk_err *err) {
    size_t total = 0;
    for (int i = 0; i < t->n; i++) total += t->toklen[i] + 1;
    char *buf = tk_malloc(total ? total : 1);
    if (!buf) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", path);
        return TK_ENOMEM;
    }
    char *s = buf;
    for (int i = 0; i < t->n; i++) {
        memcpy(s, t->tok[i], t->toklen[i]);
        s += t->toklen[i];
        *s++ = '\n';
    }
    const void *parts[1] = {buf};
    size_t sizes[1] = {total};
    tk_status st = tk_write_file_atomic(path, parts, sizes, 1, err);
    free(buf);
    return st;
}

/* One TemplateProcessing piece: {"SpecialToken"|"Sequence": {"id", "type_id"}}. */
static json_t *piece(const char *kind, const char *id, int type_id) {
    return json_pack("{s:{s:s, s:i}}", kind, "id", id, "type_id", type_id);
}

tk_status tk_tokenizer_write_json(const tk_tokenizer *t, const char *path, tk_err *err) {
    json_t *root = json_object(), *added = json_array(), *vocab = json_object();
    const int32_t sp[5] = {t->sp.pad, t->sp.unk, t->sp.cls, t->sp.sep, t->sp.mask};
    int32_t sorted[5];
    int ns = 0;
    for (int i = 0; i < 5; i++) /* added_tokens in id order, as tokenizers writes them */
        if (sp[i] >= 0) {
            int j = ns++;
            while (j > 0 && sorted[j - 1] > sp[i]) { sorted[j] = sorted[j - 1]; j--; }
            sorted[j] = sp[i];
        }
    for (int i = 0; i < ns; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", sorted[i], "content",
                                               t->tok[sorted[i]], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                               "normalized", 0, "special", 1));
    for (int i = 0; i < t->n; i++) json_object_set_new(vocab, t->tok[i], json_integer(i));
    const char *cls = t->tok[t->sp.cls], *sep = t->tok[t->sp.sep];
    json_t *single = json_pack("[o, o, o]", piece("SpecialToken", cls, 0), piece("Sequence", "A", 0),
                               piece("SpecialToken", sep, 0));
    json_t *pair = json_pack("[o, o, o, o, o]", piece("SpecialToken", cls, 0), piece("Sequence", "A", 0),
                             piece("SpecialToken", sep, 0), piece("Sequence", "B", 1), piece("SpecialToken", sep, 1));
    json_t *specials = json_object();
    json_object_set_new(specials, cls, json_pack("{s:s, s:[i], s:[s]}", "id", cls, "ids", t->sp.cls, "tokens", cls));
    json_object_set_new(specials, sep, json_pack("{s:s, s:[i], s:[s]}", "id", sep, "ids", t->sp.sep, "tokens", sep));
    json_t *strip = t->strip_accents == t->lowercase ? json_null() : json_boolean(t->strip_accents);
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "normalizer",
                        json_pack("{s:s, s:b, s:b, s:o, s:b}", "type", "BertNormalizer", "clean_text", t->clean,
                                  "handle_chinese_chars", t->split_cjk, "strip_accents", strip, "lowercase",
                                  t->lowercase));
    json_object_set_new(root, "pre_tokenizer", json_pack("{s:s}", "type", "BertPreTokenizer"));
    json_object_set_new(root, "post_processor",
                        json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single, "pair", pair,
                                  "special_tokens", specials));
    json_object_set_new(root, "decoder", json_pack("{s:s, s:s, s:b}", "type", "WordPiece", "prefix", "##",
                                                   "cleanup", 1));
    json_object_set_new(root, "model",
                        json_pack("{s:s, s:s, s:s, s:i, s:o}", "type", "WordPiece", "unk_token", t->tok[t->sp.unk],
                                  "continuing_subword_prefix", "##", "max_input_chars_per_word", t->max_word_chars,
                                  "vocab", vocab));
    tk_status st = tk_write_json_atomic(path, root, JSON_INDENT(2), err);
    json_decref(root);
    return st;
}

tk_tokenizer_opts tk_tokenizer_normalizer(const tk_tokenizer *t) {
    return (tk_tokenizer_opts){.lowercase = t->lowercase, .strip_accents = t->strip_accents,
                               .max_word_chars = t->max_word_chars, .keep_cjk = !t->split_cjk,
                               .keep_control = !t->clean};
}
