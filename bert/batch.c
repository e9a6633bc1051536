/* batch.c — features (tokenized classification examples), batching and
 * length statistics (see tk_data.h).
 *
 * Batching plans an epoch as an order of feature indices cut into batches:
 *   fixed    order (shuffled when training), every batch padded to max_len;
 *   dynamic  the same order, each batch padded to its longest row;
 *   buckets  rows sorted by length (ties in seeded random order) and cut into
 *            `buckets` equal-size buckets; each bucket shuffled and cut into
 *            batches; then the order of all batches is shuffled. Rows of a
 *            batch have similar lengths, so little padding, while the model
 *            still sees lengths in random order.
 * The plan depends only on (seed, epoch): epoch e uses seed ^ (e * golden).
 * The number of batches per epoch does not depend on the epoch.
 */
#include "tk_data_internal.h"
#include "tk_host_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tk_features *tk_features_alloc(int max_len, int qa) {
    tk_features *f = tk_calloc(1, sizeof *f);
    if (!f) return NULL;
    f->max_len = max_len;
    f->off = tk_calloc(1, sizeof(int64_t));
    if (!f->off) { free(f); return NULL; }
    (void)qa;
    return f;
}

void tk_features_destroy(tk_features **p) {
    if (!p || !*p) return;
    tk_features *f = *p;
    free(f->off); free(f->ids); free(f->type_ids); free(f->len); free(f->full_len);
    free(f->label); free(f->start_pos); free(f->end_pos); free(f->example);
    free(f->ctx_bstart); free(f->ctx_bend);
    free(f);
    *p = NULL;
}

static int grow(void **p, size_t elem, size_t n) {
    void *q = tk_realloc(*p, elem * (n ? n : 1));
    if (!q) return -1;
    *p = q;
    return 0;
}

int tk_features_push(tk_features *f, int *cap_feat, int64_t *cap_tok, const int32_t *ids,
                     const int32_t *type_ids, int n, int full_len, int32_t label, int32_t start,
                     int32_t end, int32_t example, const int32_t *ctx_bstart, const int32_t *ctx_bend) {
    int qa = ctx_bstart != NULL;
    if (f->n + 1 > *cap_feat) {
        int c = *cap_feat ? *cap_feat * 2 : 256;
        if (grow((void **)&f->off, sizeof(int64_t), (size_t)c + 1) || grow((void **)&f->len, 4, (size_t)c) ||
            grow((void **)&f->full_len, 4, (size_t)c) || grow((void **)&f->example, 4, (size_t)c) ||
            (!qa && grow((void **)&f->label, 4, (size_t)c)) ||
            (qa && (grow((void **)&f->start_pos, 4, (size_t)c) || grow((void **)&f->end_pos, 4, (size_t)c))))
            return -1;
        *cap_feat = c;
    }
    int64_t base = f->off[f->n];
    if (base + n > *cap_tok) {
        int64_t c = *cap_tok ? *cap_tok * 2 : 4096;
        while (c < base + n) c *= 2;
        if (grow((void **)&f->ids, 4, (size_t)c) || grow((void **)&f->type_ids, 4, (size_t)c) ||
            (qa && (grow((void **)&f->ctx_bstart, 4, (size_t)c) || grow((void **)&f->ctx_bend, 4, (size_t)c))))
            return -1;
        *cap_tok = c;
    }
    memcpy(f->ids + base, ids, sizeof(int32_t) * (size_t)n);
    memcpy(f->type_ids + base, type_ids, sizeof(int32_t) * (size_t)n);
    if (qa) {
        memcpy(f->ctx_bstart + base, ctx_bstart, sizeof(int32_t) * (size_t)n);
        memcpy(f->ctx_bend + base, ctx_bend, sizeof(int32_t) * (size_t)n);
        f->start_pos[f->n] = start;
        f->end_pos[f->n] = end;
    } else {
        f->label[f->n] = label;
    }
    f->len[f->n] = n;
    f->full_len[f->n] = full_len;
    f->example[f->n] = example;
    f->off[f->n + 1] = base + n;
    f->n++;
    return 0;
}

tk_status tk_features_classify(const tk_tokenizer *t, const tk_dataset *ds, int max_len,
                               tk_truncation strategy, tk_features **out, tk_err *err) {
    *out = NULL;
    if (max_len < 3) {
        tk_err_set(err, TK_EINVAL, "max_len %d is too small (at least 3: [CLS] text [SEP])", max_len);
        return TK_EINVAL;
    }
    tk_features *f = tk_features_alloc(max_len, 0);
    if (!f) goto oom;
    f->num_labels = ds->num_labels;
    tk_encoding e = {0};
    int capf = 0;
    int64_t capt = 0;
    for (int i = 0; i < ds->n; i++) {
        const char *b = ds->text_pair ? ds->text_pair[i] : NULL;
        tk_status st = tk_encode(t, ds->text[i], b, 0, TK_TRUNC_NONE, &e, NULL, err);
        if (st != TK_OK) { tk_encoding_clear(&e); tk_features_destroy(&f); return st; }
        int full = e.n;
        if (full > max_len) {
            st = tk_encode(t, ds->text[i], b, max_len, strategy, &e, NULL, err);
            if (st != TK_OK) {
                char m[sizeof err->msg];
                snprintf(m, sizeof m, "%s", err ? err->msg : "");
                tk_err_set(err, st, "%s:%d: %s", ds->name, ds->line[i], m);
                tk_encoding_clear(&e);
                tk_features_destroy(&f);
                return st;
            }
            f->n_truncated++;
        }
        if (tk_features_push(f, &capf, &capt, e.ids, e.type_ids, e.n, full, ds->label[i], 0, 0, i, NULL, NULL)) {
            tk_encoding_clear(&e);
            tk_features_destroy(&f);
            goto oom;
        }
    }
    tk_encoding_clear(&e);
    *out = f;
    return TK_OK;
oom:
    tk_err_set(err, TK_ENOMEM, "%s: out of host memory while tokenizing", ds->name);
    return TK_ENOMEM;
}

/* ---- batch planning ------------------------------------------------- */

struct tk_batches {
    const tk_features *f;
    tk_batching_opts o;
    int pad_id;
    int nb, max_T;
    /* cache of the last planned epoch (hence not thread-safe) */
    int epoch;
    int32_t *order, *bstart; /* order: n; batch i = order[bstart[i] .. bstart[i+1]) */
    int32_t *tmp;
};

typedef struct { int32_t len, key, idx; } lenkey;
static int cmp_lenkey(const void *a, const void *b) {
    const lenkey *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return (x->key > y->key) - (x->key < y->key);
}

/* Plans one epoch over lengths len[0..n): fills order (n) and bstart (nb+1);
 * returns the number of batches, or -1 on out-of-memory. */
static int plan_epoch(const int32_t *len, int n, const tk_batching_opts *o, int epoch, int32_t *order,
                      int32_t *bstart) {
    uint64_t rng = o->seed ^ ((uint64_t)(epoch + 1) * 0x9E3779B97F4A7C15ULL);
    int B = o->batch_size, nb = 0;
    for (int i = 0; i < n; i++) order[i] = i;
    if (o->strategy != TK_BATCH_BUCKETS) {
        if (o->shuffle) tk_shuffle_i32(order, n, &rng);
        for (int s = 0; s < n; s += B) {
            if (o->drop_last && s + B > n) break;
            bstart[nb++] = s;
        }
        bstart[nb] = nb ? (bstart[nb - 1] + B < n ? bstart[nb - 1] + B : n) : 0;
        return nb;
    }
    int K = o->buckets > 0 ? o->buckets : 8;
    if (K > n) K = n > 0 ? n : 1;
    lenkey *lk = tk_malloc(sizeof(lenkey) * (n > 0 ? (size_t)n : 1));
    if (!lk) return -1;
    for (int i = 0; i < n; i++) lk[i] = (lenkey){len[i], o->shuffle ? (int32_t)(tk_rand_next(&rng) >> 33) : i, i};
    qsort(lk, (size_t)n, sizeof(lenkey), cmp_lenkey);
    for (int i = 0; i < n; i++) order[i] = lk[i].idx;
    free(lk);
    /* batches inside each bucket; bucket k is [k*n/K, (k+1)*n/K) */
    int maxb = n / B + K + 1;
    int32_t *bs = tk_malloc(sizeof(int32_t) * (size_t)maxb * 2);
    if (!bs) return -1;
    for (int k = 0; k < K; k++) {
        int lo = (int)((int64_t)k * n / K), hi = (int)((int64_t)(k + 1) * n / K);
        if (o->shuffle) tk_shuffle_i32(order + lo, hi - lo, &rng);
        for (int s = lo; s < hi; s += B) {
            int e = s + B < hi ? s + B : hi;
            if (o->drop_last && e - s < B) break;
            bs[2 * nb] = s;
            bs[2 * nb + 1] = e;
            nb++;
        }
    }
    /* shuffle batch order, then lay rows out batch after batch */
    int32_t *perm = tk_malloc(sizeof(int32_t) * (size_t)(nb ? nb : 1));
    int32_t *neworder = tk_malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!perm || !neworder) { free(bs); free(perm); free(neworder); return -1; }
    for (int i = 0; i < nb; i++) perm[i] = i;
    if (o->shuffle) tk_shuffle_i32(perm, nb, &rng);
    int w = 0;
    for (int i = 0; i < nb; i++) {
        int s = bs[2 * perm[i]], e = bs[2 * perm[i] + 1];
        bstart[i] = w;
        for (int r = s; r < e; r++) neworder[w++] = order[r];
    }
    bstart[nb] = w;
    memcpy(order, neworder, sizeof(int32_t) * (size_t)w);
    free(bs); free(perm); free(neworder);
    return nb;
}

tk_batches *tk_batches_new(const tk_features *f, const tk_batching_opts *o, int pad_id, tk_err *err) {
    if (!o || o->batch_size < 1) {
        tk_err_set(err, TK_EINVAL, "batch_size must be at least 1");
        return NULL;
    }
    if (o->strategy != TK_BATCH_FIXED && o->strategy != TK_BATCH_DYNAMIC && o->strategy != TK_BATCH_BUCKETS) {
        tk_err_set(err, TK_EINVAL, "batching: unknown strategy %d (fixed, dynamic, buckets)", (int)o->strategy);
        return NULL;
    }
    if (f->n == 0) {
        tk_err_set(err, TK_EINVAL, "batching: no examples to batch");
        return NULL;
    }
    tk_batches *b = tk_calloc(1, sizeof *b);
    if (!b) goto oom;
    b->f = f;
    b->o = *o;
    b->pad_id = pad_id;
    int maxb = f->n / o->batch_size + (o->buckets > 0 ? o->buckets : 8) + 2;
    b->order = tk_malloc(sizeof(int32_t) * (size_t)f->n);
    b->bstart = tk_malloc(sizeof(int32_t) * (size_t)maxb);
    if (!b->order || !b->bstart) goto oom_b;
    b->nb = plan_epoch(f->len, f->n, o, 0, b->order, b->bstart);
    if (b->nb < 0) goto oom_b;
    if (b->nb == 0) {
        tk_err_set(err, TK_EINVAL, "batching: %d examples and drop_last with batch_size %d leave no batch", f->n,
                   o->batch_size);
        tk_batches_destroy(&b);
        return NULL;
    }
    b->epoch = 0;
    if (o->strategy == TK_BATCH_FIXED) {
        b->max_T = f->max_len;
    } else {
        for (int i = 0; i < f->n; i++)
            if (f->len[i] > b->max_T) b->max_T = f->len[i];
    }
    return b;
oom_b:
    tk_batches_destroy(&b);
oom:
    tk_err_set(err, TK_ENOMEM, "batching: out of host memory");
    return NULL;
}

void tk_batches_destroy(tk_batches **p) {
    if (!p || !*p) return;
    free((*p)->order);
    free((*p)->bstart);
    free(*p);
    *p = NULL;
}

int tk_batches_count(const tk_batches *b) { return b->nb; }
int tk_batches_max_T(const tk_batches *b) { return b->max_T; }
const tk_features *tk_batches_features(const tk_batches *b) { return b->f; }

void tk_data_batch_clear(tk_data_batch *b) {
    if (!b) return;
    free(b->input_ids); /* one block carries every array */
    memset(b, 0, sizeof *b);
}

tk_status tk_batches_get(const tk_batches *cb, int epoch, int i, tk_data_batch *out, tk_err *err) {
    tk_batches *b = (tk_batches *)cb; /* the epoch cache is the only state changed */
    if (i < 0 || i >= b->nb || epoch < 0) {
        tk_err_set(err, TK_EINVAL, "batch %d of epoch %d out of range (%d batches)", i, epoch, b->nb);
        return TK_EINVAL;
    }
    if (epoch != b->epoch) {
        int nb = plan_epoch(b->f->len, b->f->n, &b->o, epoch, b->order, b->bstart);
        if (nb < 0) {
            b->epoch = -1;
            tk_err_set(err, TK_ENOMEM, "batching: out of host memory");
            return TK_ENOMEM;
        }
        b->epoch = epoch;
    }
    const tk_features *f = b->f;
    int s = b->bstart[i], e = b->bstart[i + 1], B = e - s, T = 0;
    if (b->o.strategy == TK_BATCH_FIXED) T = f->max_len;
    else
        for (int r = s; r < e; r++)
            if (f->len[b->order[r]] > T) T = f->len[b->order[r]];
    int need = B * T > B ? B * T : B;
    if (need > out->cap) {
        int32_t *blk = tk_malloc(sizeof(int32_t) * (size_t)need * 7);
        if (!blk) { tk_err_set(err, TK_ENOMEM, "batching: out of host memory"); return TK_ENOMEM; }
        free(out->input_ids);
        out->input_ids = blk;
        out->cap = need;
    }
    int32_t *blk = out->input_ids;
    int cap = out->cap;
    out->token_type_ids = blk + cap;
    out->attention_mask = blk + 2 * (size_t)cap;
    out->labels = f->label ? blk + 3 * (size_t)cap : NULL;
    out->start_positions = f->start_pos ? blk + 4 * (size_t)cap : NULL;
    out->end_positions = f->end_pos ? blk + 5 * (size_t)cap : NULL;
    out->index = blk + 6 * (size_t)cap;
    out->B = B;
    out->T = T;
    out->real_tokens = 0;
    for (int r = 0; r < B; r++) {
        int k = b->order[s + r], n = f->len[k];
        const int32_t *ids = f->ids + f->off[k], *tt = f->type_ids + f->off[k];
        int32_t *oi = out->input_ids + (size_t)r * T, *ot = out->token_type_ids + (size_t)r * T;
        int32_t *om = out->attention_mask + (size_t)r * T;
        memcpy(oi, ids, sizeof(int32_t) * (size_t)n);
        memcpy(ot, tt, sizeof(int32_t) * (size_t)n);
        for (int c = 0; c < n; c++) om[c] = 1;
        for (int c = n; c < T; c++) { oi[c] = b->pad_id; ot[c] = 0; om[c] = 0; }
        if (out->labels) out->labels[r] = f->label[k];
        if (out->start_positions) { out->start_positions[r] = f->start_pos[k]; out->end_positions[r] = f->end_pos[k]; }
        out->index[r] = k;
        out->real_tokens += n;
    }
    return TK_OK;
}

/* ---- statistics ------------------------------------------------------ */

static int cmp_i32s(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void tk_length_stats_compute(const int32_t *len, int n, tk_length_stats *o) {
    static const int cand[TK_LEN_CANDIDATES] = {64, 128, 192, 256, 384, 512};
    memset(o, 0, sizeof *o);
    memcpy(o->cand, cand, sizeof cand);
    if (n <= 0 || !len) return;
    int32_t *s = tk_malloc(sizeof(int32_t) * (size_t)n);
    o->n = n;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += len[i];
    o->mean = sum / n;
    if (s) {
        memcpy(s, len, sizeof(int32_t) * (size_t)n);
        qsort(s, (size_t)n, sizeof(int32_t), cmp_i32s);
        /* nearest-rank percentiles */
#define PCT(q) s[(int)((q) * n + 0.999999) - 1 < 0 ? 0 : (int)((q) * n + 0.999999) - 1]
        o->min = s[0];
        o->max = s[n - 1];
        o->p50 = PCT(0.50); o->p90 = PCT(0.90); o->p95 = PCT(0.95); o->p99 = PCT(0.99);
#undef PCT
        free(s);
    } else {
        o->min = o->max = len[0];
        for (int i = 0; i < n; i++) {
            if (len[i] < o->min) o->min = len[i];
            if (len[i] > o->max) o->max = len[i];
        }
        o->p50 = o->p90 = o->p95 = o->p99 = o->max; /* no memory to sort: a safe upper bound */
    }
    int width = (o->max + 1 + TK_LEN_HIST_BINS - 1) / TK_LEN_HIST_BINS;
    if (width < 1) width = 1;
    for (int k = 0; k <= TK_LEN_HIST_BINS; k++) o->hist_edge[k] = k * width;
    for (int i = 0; i < n; i++) {
        int k = len[i] / width;
        if (k >= TK_LEN_HIST_BINS) k = TK_LEN_HIST_BINS - 1;
        o->hist[k]++;
        for (int c = 0; c < TK_LEN_CANDIDATES; c++)
            if (len[i] > cand[c]) o->pct_truncated[c] += 1;
    }
    for (int c = 0; c < TK_LEN_CANDIDATES; c++) o->pct_truncated[c] *= 100.0 / n;
}

tk_status tk_padding_waste(const int32_t *len, int n, int max_len, int batch_size, int buckets, uint64_t seed,
                           tk_padding_report out[3], tk_err *err) {
    memset(out, 0, sizeof(tk_padding_report) * 3);
    if (batch_size < 1 || max_len < 1) {
        tk_err_set(err, TK_EINVAL, "padding report: batch_size and max_len must be at least 1");
        return TK_EINVAL;
    }
    int32_t *cl = tk_malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int32_t *order = tk_malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int32_t *bstart = tk_malloc(sizeof(int32_t) * (size_t)(n / batch_size + (buckets > 0 ? buckets : 8) + 2));
    if (!cl || !order || !bstart) {
        free(cl); free(order); free(bstart);
        tk_err_set(err, TK_ENOMEM, "padding report: out of host memory");
        return TK_ENOMEM;
    }
    int64_t real = 0;
    for (int i = 0; i < n; i++) {
        cl[i] = len[i] < max_len ? len[i] : max_len;
        real += cl[i];
    }
    static const tk_batching kinds[3] = {TK_BATCH_FIXED, TK_BATCH_DYNAMIC, TK_BATCH_BUCKETS};
    for (int k = 0; k < 3; k++) {
        tk_batching_opts o = {.strategy = kinds[k], .batch_size = batch_size, .buckets = buckets, .shuffle = 1,
                              .seed = seed};
        int nb = plan_epoch(cl, n, &o, 0, order, bstart);
        if (nb < 0) {
            free(cl); free(order); free(bstart);
            tk_err_set(err, TK_ENOMEM, "padding report: out of host memory");
            return TK_ENOMEM;
        }
        tk_padding_report *r = &out[k];
        r->strategy = kinds[k];
        r->num_batches = nb;
        r->real_tokens = real;
        for (int i = 0; i < nb; i++) {
            int T = 0;
            if (kinds[k] == TK_BATCH_FIXED) T = max_len;
            else
                for (int j = bstart[i]; j < bstart[i + 1]; j++)
                    if (cl[order[j]] > T) T = cl[order[j]];
            if (T > r->max_T) r->max_T = T;
            r->padded_tokens += (int64_t)T * (bstart[i + 1] - bstart[i]);
        }
        r->waste = r->padded_tokens ? 1.0 - (double)real / (double)r->padded_tokens : 0.0;
    }
    free(cl); free(order); free(bstart);
    return TK_OK;
}
