/* vocab_build.c — learns a WordPiece vocabulary from a corpus (tk_vocab_build).
 *
 * Nothing can be downloaded here, so tests, demos and `txk vocab` need a
 * vocabulary learned from the data at hand. Procedure (as HF's
 * WordPieceTrainer does it: BPE-style frequency merges with a "##" prefix for
 * word-inner pieces; simplified):
 *   1. split texts with the tokenizer's own normalizer/pre-tokenizer and count
 *      words (words over 100 characters are skipped: the tokenizer maps them
 *      to [UNK] anyway);
 *   2. start from every character, as a word start "c" and as a continuation
 *      "##c", so every word seen is tokenizable;
 *   3. repeat: count adjacent symbol pairs over the words (weighted by word
 *      count), merge the most frequent pairs (ties: the higher
 *      count(ab)/(count(a)*count(b)), then symbol ids) (in a
 *      round, several pairs that share no symbol, best first, so big corpora
 *      need few rounds), until the vocabulary is full or no pair is seen
 *      min_count times.
 * Guarantees: deterministic (ties broken by symbol ids, which follow first
 * appearance); the written file is [PAD] [UNK] [CLS] [SEP] [MASK], the
 * alphabet, then merges in order of learning; failure leaves no partial file
 * (written to a temp name, then renamed).
 */
#include "tk_tokenizer.h"
#include "tk_host_mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char *s; int len; double freq; } sym;

typedef struct {
    sym *v; int n, cap;
    uint32_t *slot; uint32_t mask; /* index+1 by string */
} symtab;

typedef struct { int32_t *s; int n; double w; } wordrec;

typedef struct {
    char **key; int *klen; double *cnt; uint32_t *slot; uint32_t mask; int n, cap;
    int oom;
} wordmap;

static uint32_t fnv(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static int grow_slots(uint32_t **slot, uint32_t *mask, int n, uint32_t (*hash_of)(void *, int), void *ctx) {
    uint32_t cap = (*mask + 1) * 2;
    uint32_t *ns = tk_calloc(cap, sizeof(uint32_t));
    if (!ns) return -1;
    for (int i = 0; i < n; i++) {
        uint32_t j = hash_of(ctx, i) & (cap - 1);
        while (ns[j]) j = (j + 1) & (cap - 1);
        ns[j] = (uint32_t)i + 1;
    }
    free(*slot);
    *slot = ns;
    *mask = cap - 1;
    return 0;
}

static uint32_t wm_hash(void *c, int i) { wordmap *m = c; return fnv(m->key[i], (size_t)m->klen[i]); }
static uint32_t st_hash(void *c, int i) { symtab *t = c; return fnv(t->v[i].s, (size_t)t->v[i].len); }

static void on_word(const char *w, size_t nb, void *user) {
    wordmap *m = user;
    if (m->oom) return;
    uint32_t j = fnv(w, nb) & m->mask;
    while (m->slot[j]) {
        int i = (int)m->slot[j] - 1;
        if ((size_t)m->klen[i] == nb && memcmp(m->key[i], w, nb) == 0) { m->cnt[i] += 1; return; }
        j = (j + 1) & m->mask;
    }
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 1024;
        char **k = tk_realloc(m->key, sizeof(char *) * (size_t)cap);
        if (k) m->key = k;
        int *kl = tk_realloc(m->klen, sizeof(int) * (size_t)cap);
        if (kl) m->klen = kl;
        double *c = tk_realloc(m->cnt, sizeof(double) * (size_t)cap);
        if (c) m->cnt = c;
        if (!k || !kl || !c) { m->oom = 1; return; }
        m->cap = cap;
    }
    char *s = tk_malloc(nb + 1);
    if (!s) { m->oom = 1; return; }
    memcpy(s, w, nb);
    s[nb] = 0;
    int i = m->n++;
    m->key[i] = s; m->klen[i] = (int)nb; m->cnt[i] = 1;
    m->slot[j] = (uint32_t)i + 1;
    if ((uint32_t)m->n * 2 > m->mask && grow_slots(&m->slot, &m->mask, m->n, wm_hash, m) != 0) m->oom = 1;
}

/* Symbol id of string s (len bytes), added when new; -1 on out-of-memory. */
static int sym_get(symtab *t, const char *s, int len) {
    uint32_t j = fnv(s, (size_t)len) & t->mask;
    while (t->slot[j]) {
        int i = (int)t->slot[j] - 1;
        if (t->v[i].len == len && memcmp(t->v[i].s, s, (size_t)len) == 0) return i;
        j = (j + 1) & t->mask;
    }
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 256;
        sym *v = tk_realloc(t->v, sizeof(sym) * (size_t)cap);
        if (!v) return -1;
        t->v = v;
        t->cap = cap;
    }
    char *c = tk_malloc((size_t)len + 1);
    if (!c) return -1;
    memcpy(c, s, (size_t)len);
    c[len] = 0;
    int i = t->n++;
    t->v[i] = (sym){c, len, 0};
    t->slot[j] = (uint32_t)i + 1;
    if ((uint32_t)t->n * 2 > t->mask && grow_slots(&t->slot, &t->mask, t->n, st_hash, t) != 0) return -1;
    return i;
}

/* pair counts keyed by (a,b) */
typedef struct { uint64_t *key; double *cnt; uint32_t mask; int n; } pairmap;

static uint32_t mix64(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33;
    return (uint32_t)k;
}

static int pm_add(pairmap *p, uint64_t k, double w) {
    uint32_t j = mix64(k) & p->mask;
    while (p->key[j] != UINT64_MAX) {
        if (p->key[j] == k) { p->cnt[j] += w; return 0; }
        j = (j + 1) & p->mask;
    }
    p->key[j] = k;
    p->cnt[j] = w;
    p->n++;
    if ((uint32_t)p->n * 2 > p->mask) {
        uint32_t cap = (p->mask + 1) * 2;
        uint64_t *nk = tk_malloc(sizeof(uint64_t) * cap);
        double *nc = tk_malloc(sizeof(double) * cap);
        if (!nk || !nc) { free(nk); free(nc); return -1; }
        memset(nk, 0xff, sizeof(uint64_t) * cap);
        for (uint32_t i = 0; i <= p->mask; i++) {
            if (p->key[i] == UINT64_MAX) continue;
            uint32_t q = mix64(p->key[i]) & (cap - 1);
            while (nk[q] != UINT64_MAX) q = (q + 1) & (cap - 1);
            nk[q] = p->key[i];
            nc[q] = p->cnt[i];
        }
        free(p->key); free(p->cnt);
        p->key = nk; p->cnt = nc; p->mask = cap - 1;
    }
    return 0;
}

typedef struct { int a, b; double cnt, score; } cand;

static int cand_cmp(const void *x, const void *y) {
    const cand *p = x, *q = y;
    if (p->cnt != q->cnt) return p->cnt > q->cnt ? -1 : 1;
    if (p->score != q->score) return p->score > q->score ? -1 : 1;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return p->b < q->b ? -1 : p->b > q->b;
}

tk_status tk_vocab_build(const char *const *texts, int n, int vocab_size, int lowercase,
                         int min_count, const char *out_path, tk_err *err) {
    static const char *specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    const int nspec = 5;
    if (min_count <= 0) min_count = 2;
    tk_status st = TK_OK;
    wordmap wm = {0};
    symtab syms = {0};
    wordrec *words = NULL;
    int nwords = 0;
    int *order = NULL; /* symbols in the order they join the vocabulary */
    int norder = 0;
    pairmap pm = {0};
    cand *cands = NULL;
    FILE *f = NULL;
    char tmp[4096 + 16];
    tmp[0] = 0;

    if (n <= 0) { tk_err_set(err, TK_EINVAL, "vocab: no texts to learn from"); return TK_EINVAL; }
    wm.mask = 1023;
    wm.slot = tk_calloc(1024, sizeof(uint32_t));
    syms.mask = 1023;
    syms.slot = tk_calloc(1024, sizeof(uint32_t));
    if (!wm.slot || !syms.slot) goto oom;
    for (int i = 0; i < n && !wm.oom; i++)
        if (texts[i] && tk_pretokenize(texts[i], (size_t)-1, lowercase, on_word, &wm) != TK_OK) wm.oom = 1;
    if (wm.oom) goto oom;
    if (wm.n == 0) { tk_err_set(err, TK_EINVAL, "vocab: the texts hold no words"); st = TK_EINVAL; goto done; }

    words = tk_calloc((size_t)wm.n, sizeof(wordrec));
    order = tk_malloc(sizeof(int) * (size_t)(vocab_size > 0 ? vocab_size : 1) * 2 + 64);
    if (!words || !order) goto oom;
    /* Alphabet in order of first appearance; words as symbol sequences. */
    for (int i = 0; i < wm.n; i++) {
        const char *w = wm.key[i];
        int len = wm.klen[i], nc = 0;
        for (int k = 0; k < len; k++) nc += ((uint8_t)w[k] & 0xC0) != 0x80;
        if (nc > 100) continue;
        wordrec *r = &words[nwords];
        r->s = tk_malloc(sizeof(int32_t) * (size_t)nc);
        if (!r->s) goto oom;
        r->w = wm.cnt[i];
        nwords++;
        char buf[8] = "##";
        for (int k = 0; k < len;) {
            int cl = 1;
            while (k + cl < len && ((uint8_t)w[k + cl] & 0xC0) == 0x80) cl++;
            int id;
            if (k == 0) id = sym_get(&syms, w, cl);
            else { memcpy(buf + 2, w + k, (size_t)cl); id = sym_get(&syms, buf, cl + 2); }
            if (id < 0) goto oom;
            r->s[r->n++] = id;
            k += cl;
        }
    }
    /* Every character both ways, so every seen word is tokenizable. */
    int nalpha0 = syms.n;
    for (int i = 0; i < nalpha0; i++) {
        char buf[8];
        const sym *s = &syms.v[i];
        int id;
        if (s->s[0] == '#' && s->len > 2 && s->s[1] == '#') id = sym_get(&syms, s->s + 2, s->len - 2);
        else { buf[0] = buf[1] = '#'; memcpy(buf + 2, s->s, (size_t)s->len); id = sym_get(&syms, buf, s->len + 2); }
        if (id < 0) goto oom;
    }
    if (syms.n + nspec > vocab_size) {
        tk_err_set(err, TK_EINVAL, "vocab: vocab_size %d is smaller than the %d characters (x2 for ##) plus %d "
                   "special tokens the corpus needs", vocab_size, syms.n / 2, nspec);
        st = TK_EINVAL;
        goto done;
    }
    order = tk_realloc(order, sizeof(int) * (size_t)vocab_size);
    if (!order) goto oom;
    for (int i = 0; i < syms.n; i++) order[norder++] = i;

    pm.mask = 4095;
    pm.key = tk_malloc(sizeof(uint64_t) * 4096);
    pm.cnt = tk_malloc(sizeof(double) * 4096);
    if (!pm.key || !pm.cnt) goto oom;
    int *used = NULL;
    while (norder + nspec < vocab_size) {
        memset(pm.key, 0xff, sizeof(uint64_t) * (pm.mask + 1));
        pm.n = 0;
        for (int i = 0; i < syms.n; i++) syms.v[i].freq = 0;
        for (int i = 0; i < nwords; i++) {
            wordrec *r = &words[i];
            for (int k = 0; k < r->n; k++) {
                syms.v[r->s[k]].freq += r->w;
                if (k + 1 < r->n && pm_add(&pm, ((uint64_t)(uint32_t)r->s[k] << 32) | (uint32_t)r->s[k + 1], r->w) != 0)
                    goto oom;
            }
        }
        free(cands);
        cands = tk_malloc(sizeof(cand) * (size_t)(pm.n ? pm.n : 1));
        if (!cands) goto oom;
        int nc = 0;
        for (uint32_t j = 0; j <= pm.mask; j++) {
            if (pm.key[j] == UINT64_MAX || pm.cnt[j] < min_count) continue;
            int a = (int)(pm.key[j] >> 32), b = (int)(pm.key[j] & 0xffffffffu);
            cands[nc++] = (cand){a, b, pm.cnt[j], pm.cnt[j] / (syms.v[a].freq * syms.v[b].freq)};
        }
        if (nc == 0) break;
        qsort(cands, (size_t)nc, sizeof(cand), cand_cmp);
        int room = vocab_size - nspec - norder;
        int batch = 1 + room / 32;
        used = tk_calloc((size_t)syms.n, sizeof(int));
        if (!used) goto oom;
        int merged = 0;
        /* new symbol per chosen pair; then rewrite the words */
        int *ma = tk_malloc(sizeof(int) * (size_t)batch * 3);
        if (!ma) { free(used); goto oom; }
        for (int c = 0; c < nc && merged < batch; c++) {
            int a = cands[c].a, b = cands[c].b;
            if (used[a] || used[b]) continue;
            const sym *sa = &syms.v[a], *sb = &syms.v[b];
            int bl = sb->len - 2; /* b is always a continuation */
            char *buf = tk_malloc((size_t)(sa->len + bl) + 1);
            if (!buf) { free(ma); free(used); goto oom; }
            memcpy(buf, sa->s, (size_t)sa->len);
            memcpy(buf + sa->len, syms.v[b].s + 2, (size_t)bl);
            int before = syms.n;
            int id = sym_get(&syms, buf, sa->len + bl);
            free(buf);
            if (id < 0) { free(ma); free(used); goto oom; }
            used[a] = used[b] = 1;
            ma[merged * 3] = a; ma[merged * 3 + 1] = b; ma[merged * 3 + 2] = id;
            merged++;
            if (syms.n > before) order[norder++] = id;
        }
        free(used);
        used = NULL;
        for (int i = 0; i < nwords; i++) {
            wordrec *r = &words[i];
            int o = 0;
            for (int k = 0; k < r->n; k++) {
                int rep = -1;
                if (k + 1 < r->n)
                    for (int m = 0; m < merged; m++)
                        if (ma[m * 3] == r->s[k] && ma[m * 3 + 1] == r->s[k + 1]) { rep = ma[m * 3 + 2]; break; }
                if (rep >= 0) { r->s[o++] = rep; k++; }
                else r->s[o++] = r->s[k];
            }
            r->n = o;
        }
        free(ma);
        if (merged == 0) break;
    }

    snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
    f = fopen(tmp, "wb");
    if (!f) { tk_err_set(err, TK_EIO, "%s: cannot write: %s", out_path, strerror(errno)); st = TK_EIO; tmp[0] = 0; goto done; }
    for (int i = 0; i < nspec; i++) fprintf(f, "%s\n", specials[i]);
    for (int i = 0; i < norder; i++) fprintf(f, "%s\n", syms.v[order[i]].s);
    if (fclose(f) != 0) { f = NULL; tk_err_set(err, TK_EIO, "%s: write failed: %s", out_path, strerror(errno)); st = TK_EIO; goto done; }
    f = NULL;
    if (rename(tmp, out_path) != 0) { tk_err_set(err, TK_EIO, "%s: cannot rename from %s: %s", out_path, tmp, strerror(errno)); st = TK_EIO; goto done; }
    tmp[0] = 0;
    goto done;
oom:
    tk_err_set(err, TK_ENOMEM, "vocab: out of host memory");
    st = TK_ENOMEM;
done:
    if (f) fclose(f);
    if (tmp[0]) remove(tmp);
    for (int i = 0; i < wm.n; i++) free(wm.key[i]);
    free(wm.key); free(wm.klen); free(wm.cnt); free(wm.slot);
    for (int i = 0; i < syms.n; i++) free(syms.v[i].s);
    free(syms.v); free(syms.slot);
    for (int i = 0; i < nwords; i++) free(words[i].s);
    free(words); free(order); free(pm.key); free(pm.cnt); free(cands);
    return st;
}
