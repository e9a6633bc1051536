/* trainset.c — loads, tokenizes and batches the data a config names, through
 * the data engineer's readers (tk_data.h), into plain host batches for the
 * training loop (tk_trainset.h says why the two sides are kept apart).
 *
 * Guarantees: every failure frees what was made and returns NULL with the
 * reader's message (file, line, column) or the config key to fix. The dev
 * set uses the train label set (an unknown dev label is an error naming it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tk_data.h"
#include "tk_trainset.h"

typedef struct {
    tk_features *f;
    tk_batches *bs;
    tk_batch *raw;      /* n batches, owned (tk_batch_clear) */
    tk_hostbatch *hb;   /* views of raw */
    int n;
} split;

struct tk_trainset {
    tk_tokenizer *tok;
    tk_dataset *train_ds, *dev_ds;
    tk_squad *train_sq, *dev_sq;
    split s[2];
    int num_labels;
};

static void split_free(split *p) {
    for (int i = 0; i < p->n && p->raw; i++)
        tk_batch_clear(&p->raw[i]);
    free(p->raw);
    free(p->hb);
    tk_batches_destroy(&p->bs);
    tk_features_destroy(&p->f);
    memset(p, 0, sizeof *p);
}

void tk_trainset_destroy(tk_trainset **pp) {
    if (!pp || !*pp)
        return;
    tk_trainset *s = *pp;
    split_free(&s->s[0]);
    split_free(&s->s[1]);
    tk_dataset_destroy(&s->train_ds);
    tk_dataset_destroy(&s->dev_ds);
    tk_squad_destroy(&s->train_sq);
    tk_squad_destroy(&s->dev_sq);
    tk_tokenizer_destroy(&s->tok);
    free(s);
    *pp = NULL;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Batches features f (owned by p from now on) and materialises one epoch. */
static tk_status split_make(split *p, tk_features *f, const tk_config *c, int dev, int pad_id,
                            tk_err *err) {
    p->f = f;
    tk_batching_opts o = {
        .strategy = c->batching, .batch_size = dev && c->eval_batch_size > 0 ? c->eval_batch_size
                                                                            : c->batch_size,
        .buckets = c->buckets, .shuffle = !dev, .drop_last = 0, .seed = c->seed,
    };
    if (!(p->bs = tk_batches_new(f, &o, pad_id, err)))
        return err && err->status ? err->status : TK_EINVAL;
    int n = tk_batches_count(p->bs);
    p->raw = calloc((size_t)(n > 0 ? n : 1), sizeof *p->raw);
    p->hb = calloc((size_t)(n > 0 ? n : 1), sizeof *p->hb);
    if (!p->raw || !p->hb) {
        tk_err_set(err, TK_EINVAL, "data: out of host memory");
        return TK_EINVAL;
    }
    for (int i = 0; i < n; i++) {
        tk_status st = tk_batches_get(p->bs, 0, i, &p->raw[i], err);
        p->n = i + 1;
        if (st != TK_OK)
            return st;
        const tk_batch *b = &p->raw[i];
        p->hb[i] = (tk_hostbatch){ .B = b->B, .T = b->T, .input_ids = b->input_ids,
                                   .token_type_ids = b->token_type_ids,
                                   .attention_mask = b->attention_mask, .labels = b->labels,
                                   .start_positions = b->start_positions,
                                   .end_positions = b->end_positions, .feature = b->index };
    }
    return TK_OK;
}

tk_trainset *tk_trainset_load(const tk_config *c, tk_err *err) {
    if (!c->train_file[0]) {
        tk_err_set(err, TK_EINVAL, "train_file: not set (the training data: CSV, TSV, JSONL or SQuAD JSON)");
        return NULL;
    }
    char vocab[TK_PATH_MAX + 16];
    if (c->vocab[0])
        snprintf(vocab, sizeof vocab, "%s", c->vocab);
    else if (is_dir(c->model))
        snprintf(vocab, sizeof vocab, "%s/vocab.txt", c->model);
    else {
        tk_err_set(err, TK_EINVAL, "vocab: not set, and model '%s' is a preset without a vocabulary "
                   "(give vocab: path/to/vocab.txt, or build one with `txk vocab`)", c->model);
        return NULL;
    }
    tk_trainset *s = calloc(1, sizeof *s);
    if (!s) {
        tk_err_set(err, TK_EINVAL, "data: out of host memory");
        return NULL;
    }
    tk_tokenizer_opts to = { .lowercase = c->lowercase, .strip_accents = -1 };
    tk_status st = TK_OK;
    tk_features *ft = NULL, *fd = NULL;
    if (!(s->tok = tk_tokenizer_new(vocab, &to, err)))
        goto fail;
    int pad = tk_tokenizer_special(s->tok).pad;
    if (c->task == TK_TASK_QA) {
        if ((st = tk_squad_load(c->train_file, &s->train_sq, err)) != TK_OK ||
            (st = tk_features_squad(s->tok, s->train_sq, c->max_len, c->doc_stride, &ft, err)) != TK_OK)
            goto fail;
        if (c->dev_file[0] &&
            ((st = tk_squad_load(c->dev_file, &s->dev_sq, err)) != TK_OK ||
             (st = tk_features_squad(s->tok, s->dev_sq, c->max_len, c->doc_stride, &fd, err)) != TK_OK))
            goto fail;
        s->num_labels = 2;
    } else {
        tk_data_cols cols = { .text = c->text_col, .text_pair = c->text_pair_col, .label = c->label_col };
        tk_dataset *all = NULL;
        if ((st = tk_dataset_load(c->train_file, &cols, &all, err)) != TK_OK)
            goto fail;
        if (c->dev_file[0]) {
            s->train_ds = all;
            if ((st = tk_dataset_load(c->dev_file, &cols, &s->dev_ds, err)) != TK_OK ||
                (st = tk_dataset_use_labels(s->dev_ds, s->train_ds->labels, s->train_ds->num_labels,
                                            err)) != TK_OK)
                goto fail;
        } else if (c->dev_split > 0) {
            st = tk_dataset_split(all, c->dev_split, c->seed, &s->train_ds, &s->dev_ds, err);
            tk_dataset_destroy(&all);
            if (st != TK_OK)
                goto fail;
        } else {
            s->train_ds = all;
        }
        s->num_labels = c->num_labels > 0 ? c->num_labels : s->train_ds->num_labels;
        if ((st = tk_features_classify(s->tok, s->train_ds, c->max_len, TK_TRUNC_LONGEST_FIRST, &ft,
                                       err)) != TK_OK)
            goto fail;
        if (s->dev_ds && (st = tk_features_classify(s->tok, s->dev_ds, c->max_len,
                                                    TK_TRUNC_LONGEST_FIRST, &fd, err)) != TK_OK)
            goto fail;
    }
    /* max_examples keeps the first features (arrays are freed whole, so a
     * smaller count is safe) */
    if (c->max_examples > 0 && ft->n > c->max_examples)
        ft->n = c->max_examples;
    st = split_make(&s->s[0], ft, c, 0, pad, err);
    ft = NULL;
    if (st != TK_OK)
        goto fail;
    if (fd) {
        st = split_make(&s->s[1], fd, c, 1, pad, err);
        fd = NULL;
        if (st != TK_OK)
            goto fail;
    }
    return s;
fail:
    tk_features_destroy(&ft);
    tk_features_destroy(&fd);
    tk_trainset_destroy(&s);
    return NULL;
}

int tk_trainset_num_labels(const tk_trainset *s) { return s->num_labels; }
const char *tk_trainset_label(const tk_trainset *s, int i) {
    return s->train_ds && i >= 0 && i < s->train_ds->num_labels ? s->train_ds->labels[i] : NULL;
}
int tk_trainset_vocab_size(const tk_trainset *s) { return tk_tokenizer_vocab_size(s->tok); }
int tk_trainset_n_examples(const tk_trainset *s, int dev) {
    return s->s[dev ? 1 : 0].f ? s->s[dev ? 1 : 0].f->n : 0;
}
int tk_trainset_n_batches(const tk_trainset *s, int dev) { return s->s[dev ? 1 : 0].n; }
const tk_hostbatch *tk_trainset_batch(const tk_trainset *s, int dev, int i) {
    const split *p = &s->s[dev ? 1 : 0];
    return i >= 0 && i < p->n ? &p->hb[i] : NULL;
}
const int32_t *tk_trainset_lengths(const tk_trainset *s, int *n) {
    *n = s->s[0].f ? s->s[0].f->n : 0;
    return s->s[0].f ? s->s[0].f->len : NULL;
}

int tk_trainset_span_text(const tk_trainset *s, int feature, int start, int end, char *buf,
                          size_t n, const char *const **gold, int *n_gold) {
    const tk_features *f = s->s[1].f;
    if (!s->dev_sq || !f || feature < 0 || feature >= f->n || n == 0)
        return -1;
    const tk_squad_example *ex = &s->dev_sq->ex[f->example[feature]];
    *gold = (const char *const *)ex->answer_text;
    *n_gold = ex->nanswers;
    buf[0] = '\0';
    int64_t t0 = f->off[feature];
    int len = f->len[feature];
    if (start <= 0 || end < start || end >= len)
        return 0;
    int32_t b0 = f->ctx_bstart[t0 + start], b1 = f->ctx_bend[t0 + end];
    if (b0 < 0 || b1 <= b0)
        return 0;
    size_t k = (size_t)(b1 - b0) < n - 1 ? (size_t)(b1 - b0) : n - 1;
    memcpy(buf, ex->context + b0, k);
    buf[k] = '\0';
    return 0;
}
