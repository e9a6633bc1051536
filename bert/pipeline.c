/* pipeline.c — config -> tokenizer, labels, features, epoch-0 batches
 * (tk_pipeline.h says who calls it and what it guarantees).
 *
 * The only unit that speaks both the data module's batch (tk_data.h) and the
 * model's (tk_model.h): it keeps the data batches' arrays and hands out
 * model batches that view them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <errno.h>
#include <unistd.h>

#include "tk_data.h"
#include "tk_files.h"
#include "tk_host_mem.h"
#include "tk_pipeline.h"

typedef struct {
    tk_data_batch *raw[2]; /* train, dev: owned arrays */
    int n[2];
    tk_features *dev_f;    /* the dev features, for mapping rows back to examples */
    tk_squad *dev_sq;      /* qa: the dev examples (contexts, gold answers) */
} owned;

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* FNV-1a, so a learned vocabulary is reused for the same corpus and the data
 * digest does not depend on the C library. */
static uint64_t fnv_bytes(const void *p, size_t n, uint64_t h) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}
static uint64_t fnv(const char *s, uint64_t h) { return fnv_bytes(s, strlen(s), h); }
#define FNV0 1469598103934665603ull

/* Where a vocabulary learned from the data is kept: the user's cache
 * ($XDG_CACHE_HOME, else ~/.cache)/txkernel/vocab, else the temp folder.
 * Never output_dir: a plan must not write over a trained model's vocab.txt,
 * and a run puts its vocabulary there with the model (tk_model_save_hf). */
static void vocab_cache_dir(char *out, size_t n) {
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (x && x[0] == '/') snprintf(out, n, "%s/txkernel/vocab", x);
    else if (home && home[0]) snprintf(out, n, "%s/.cache/txkernel/vocab", home);
    else out[0] = 0;
    tk_err ignore = {0};
    if (!out[0] || tk_mkdirs(out, &ignore) != TK_OK) {
        const char *t = getenv("TMPDIR");
        snprintf(out, n, "%s", t && t[0] == '/' ? t : "/tmp");
    }
}

tk_tokenizer *tk_run_tokenizer(const tk_config *c, const char *corpus, const char *const *texts, int n,
                               char *path, size_t pn, char *note, size_t note_n, tk_err *err) {
    tk_config r = *c;
    tk_err ignore = {0};
    tk_config_resolve_model(&r, &ignore); /* lower-casing and vocab size of a preset, if it is one */
    tk_tokenizer_opts o = {.lowercase = r.lowercase, .strip_accents = -1};
    if (c->vocab[0]) {
        snprintf(path, pn, "%s", c->vocab);
        snprintf(note, note_n, "vocabulary: %s", c->vocab);
        return tk_tokenizer_new(path, &o, err);
    }
    /* a model folder's own: vocab.txt, else tokenizer.json (transformers 5
     * saves only that one) */
    snprintf(path, pn, "%s/vocab.txt", c->model);
    int has_vocab = file_exists(path);
    snprintf(path, pn, "%s/tokenizer.json", c->model);
    if (has_vocab || file_exists(path)) {
        tk_tokenizer *t = tk_tokenizer_from_folder(c->model, &o, path, pn, err);
        if (t) snprintf(note, note_n, "vocabulary: %.600s", path);
        return t;
    }
    /* A preset names a shape, not weights: there is no vocab.txt to read.
     * Learn a WordPiece vocabulary from the data, once per distinct set of
     * texts: the cache file is named by a digest of every text (and the
     * normalizer and size), so the same data finds it again and other data
     * never overwrites it. */
    int size = r.vocab_size > 0 ? r.vocab_size : 30522;
    uint64_t h = FNV0;
    for (int i = 0; i < n; i++) h = fnv_bytes(texts[i], strlen(texts[i]) + 1, h);
    h = fnv(r.lowercase > 0 ? "lc" : "cs", h) * 31 + (uint64_t)size;
    char dir[TK_PATH_MAX];
    vocab_cache_dir(dir, sizeof dir);
    snprintf(path, pn, "%.*s/txk-vocab-%016llx.txt", (int)(pn > 40 ? pn - 40 : 0), dir, (unsigned long long)h);
    if (!file_exists(path)) {
        /* built under a name of this process, then renamed: two commands
         * learning the same vocabulary at once never see half a file */
        char mine[TK_PATH_MAX + 128];
        snprintf(mine, sizeof mine, "%s.%ld", path, (long)getpid());
        if (tk_vocab_build(texts, n, size, r.lowercase > 0, 0, mine, err) != TK_OK) return NULL;
        if (rename(mine, path) != 0) {
            tk_err_set(err, TK_EIO, "%s: cannot rename into place from %s: %s", path, mine, strerror(errno));
            unlink(mine);
            return NULL;
        }
    }
    o.lowercase = r.lowercase > 0;
    snprintf(note, note_n,
             "vocabulary: learned from %.300s (%.300s has no vocab.txt or tokenizer.json here; set vocab: to use "
             "yours) -> %.600s",
             corpus, c->model, path);
    return tk_tokenizer_new(path, &o, err);
}

/* Epoch 0's batches of f (the trainer shuffles their order per epoch), as
 * owned data batches plus model views of them. */
static tk_status make_batches(const tk_features *f, const tk_config *c, int batch_size, int pad_id,
                              tk_data_batch **raw_out, tk_batch **out, int *nout, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    tk_batching_opts bo = {.strategy = c->head == TK_HEAD_FLATTEN_DENSE ? TK_BATCH_FIXED : c->batching,
                           .batch_size = batch_size, .buckets = c->buckets, .shuffle = 0,
                           .drop_last = 0, .seed = c->seed};
    tk_batches *bs = tk_batches_new(f, &bo, pad_id, err);
    if (!bs) return err->status;
    int n = tk_batches_count(bs);
    tk_data_batch *raw = tk_calloc((size_t)(n > 0 ? n : 1), sizeof *raw);
    tk_batch *mb = tk_calloc((size_t)(n > 0 ? n : 1), sizeof *mb);
    tk_status st = TK_OK;
    if (!raw || !mb) {
        tk_err_set(err, TK_ENOMEM, "data: out of host memory for %d batches", n);
        st = TK_ENOMEM;
    }
    /* a fresh data batch each time: tk_batches_get reuses a batch's memory */
    for (int i = 0; st == TK_OK && i < n; i++) {
        if ((st = tk_batches_get(bs, 0, i, &raw[i], err)) != TK_OK) break;
        const tk_data_batch *b = &raw[i];
        mb[i] = (tk_batch){.B = b->B, .T = b->T, .input_ids = b->input_ids, .token_type_ids = b->token_type_ids,
                           .attention_mask = b->attention_mask, .labels = b->labels,
                           .start_positions = b->start_positions, .end_positions = b->end_positions};
    }
    tk_batches_destroy(&bs);
    if (st != TK_OK) {
        for (int i = 0; raw && i < n; i++) tk_data_batch_clear(&raw[i]);
        free(raw);
        free(mb);
        return st;
    }
    *raw_out = raw;
    *out = mb;
    *nout = n;
    return TK_OK;
}

static tk_status batches_of(const tk_features *ft, const tk_features *fd, const tk_config *c, int pad,
                            tk_run_data *d, tk_err *err) {
    owned *o = d->priv;
    tk_status st = make_batches(ft, c, c->batch_size, pad, &o->raw[0], &d->train, &d->n_train, err);
    if (st != TK_OK) return st;
    o->n[0] = d->n_train;
    if (!fd) return TK_OK;
    st = make_batches(fd, c, c->eval_batch_size > 0 ? c->eval_batch_size : c->batch_size, pad, &o->raw[1],
                      &d->dev, &d->n_dev, err);
    if (st == TK_OK) o->n[1] = d->n_dev;
    return st;
}

static tk_status lengths_of(const tk_features *f, tk_run_data *d, tk_err *err) {
    d->lengths = tk_malloc((size_t)(f->n > 0 ? f->n : 1) * sizeof *d->lengths);
    if (!d->lengths) {
        tk_err_set(err, TK_ENOMEM, "data: out of host memory");
        return TK_ENOMEM;
    }
    memcpy(d->lengths, f->len, (size_t)f->n * sizeof *d->lengths);
    d->n_lengths = f->n;
    return TK_OK;
}

static tk_status tokenizer_facts(const tk_tokenizer *tok, tk_run_data *d) {
    d->vocab_size = tk_tokenizer_vocab_size(tok);
    d->lowercase = tk_tokenizer_lowercase(tok);
    return TK_OK;
}

static tk_status load_classify(const tk_config *c, tk_run_data *d, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    tk_data_cols cols = {.text = c->text_col, .text_pair = c->text_pair_col, .label = c->label_col};
    tk_dataset *all = NULL, *train = NULL, *dev = NULL;
    tk_tokenizer *tok = NULL;
    tk_features *ft = NULL, *fd = NULL;
    tk_status st;
    if ((st = tk_dataset_load(c->train_file, &cols, &all, err)) != TK_OK) goto out;
    if (c->dev_file[0]) {
        if ((st = tk_dataset_load(c->dev_file, &cols, &dev, err)) != TK_OK) goto out;
        if ((st = tk_dataset_use_labels(dev, all->labels, all->num_labels, err)) != TK_OK) goto out;
        train = all;
        all = NULL;
    } else if (c->dev_split > 0) {
        if ((st = tk_dataset_split(all, c->dev_split, c->seed, &train, &dev, err)) != TK_OK) goto out;
    } else {
        train = all;
        all = NULL;
    }
    /* max_examples: a view of the first N (the dataset keeps its size, so
     * destroying it frees every row) */
    tk_dataset head = *train;
    if (c->max_examples > 0 && head.n > c->max_examples) head.n = c->max_examples;
    if (!(tok = tk_run_tokenizer(c, c->train_file, (const char *const *)head.text, head.n, d->vocab_path,
                                sizeof d->vocab_path, d->vocab_note, sizeof d->vocab_note, err))) {
        st = err->status;
        goto out;
    }
    tokenizer_facts(tok, d);
    if ((st = tk_features_classify(tok, &head, c->max_len, TK_TRUNC_LONGEST_FIRST, &ft, err)) != TK_OK) goto out;
    if (dev && (st = tk_features_classify(tok, dev, c->max_len, TK_TRUNC_LONGEST_FIRST, &fd, err)) != TK_OK)
        goto out;
    d->num_labels = train->num_labels;
    d->labels = tk_calloc((size_t)(train->num_labels + 1), sizeof *d->labels);
    for (int i = 0; d->labels && i < train->num_labels; i++) d->labels[i] = tk_strdup(train->labels[i]);
    d->n_examples = head.n;
    d->n_dev_examples = dev ? dev->n : 0;
    d->n_truncated = ft->n_truncated;
    if ((st = lengths_of(ft, d, err)) != TK_OK) goto out;
    st = batches_of(ft, fd, c, tk_tokenizer_special(tok).pad, d, err);
    ((owned *)d->priv)->dev_f = fd;
    fd = NULL;
out:
    tk_features_destroy(&ft);
    tk_features_destroy(&fd);
    tk_tokenizer_destroy(&tok);
    tk_dataset_destroy(&all);
    tk_dataset_destroy(&train);
    tk_dataset_destroy(&dev);
    return st;
}

static tk_status load_squad(const tk_config *c, tk_run_data *d, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    tk_squad *train = NULL, *dev = NULL;
    tk_tokenizer *tok = NULL;
    tk_features *ft = NULL, *fd = NULL;
    const char **texts = NULL;
    tk_status st;
    if ((st = tk_squad_load(c->train_file, &train, err)) != TK_OK) goto out;
    if (c->dev_file[0] && (st = tk_squad_load(c->dev_file, &dev, err)) != TK_OK) goto out;
    tk_squad head = *train;
    if (c->max_examples > 0 && head.n > c->max_examples) head.n = c->max_examples;
    texts = tk_malloc((size_t)(2 * head.n + 1) * sizeof *texts);
    if (!texts) {
        tk_err_set(err, TK_ENOMEM, "data: out of host memory");
        st = TK_ENOMEM;
        goto out;
    }
    for (int i = 0; i < head.n; i++) {
        texts[2 * i] = head.ex[i].question;
        texts[2 * i + 1] = head.ex[i].context;
    }
    if (!(tok = tk_run_tokenizer(c, c->train_file, texts, 2 * head.n, d->vocab_path, sizeof d->vocab_path,
                                d->vocab_note, sizeof d->vocab_note, err))) {
        st = err->status;
        goto out;
    }
    tokenizer_facts(tok, d);
    if ((st = tk_features_squad(tok, &head, c->max_len, c->doc_stride, &ft, err)) != TK_OK) goto out;
    if (dev && (st = tk_features_squad(tok, dev, c->max_len, c->doc_stride, &fd, err)) != TK_OK) goto out;
    d->num_labels = 2;
    d->n_examples = head.n;
    d->n_dev_examples = dev ? dev->n : 0;
    if ((st = lengths_of(ft, d, err)) != TK_OK) goto out;
    st = batches_of(ft, fd, c, tk_tokenizer_special(tok).pad, d, err);
    ((owned *)d->priv)->dev_f = fd;
    ((owned *)d->priv)->dev_sq = dev;
    fd = NULL;
    dev = NULL;
out:
    free(texts);
    tk_features_destroy(&ft);
    tk_features_destroy(&fd);
    tk_tokenizer_destroy(&tok);
    tk_squad_destroy(&train);
    tk_squad_destroy(&dev);
    return st;
}

static uint64_t digest_arr(const int32_t *p, size_t n, uint64_t h) {
    return p ? fnv_bytes(p, n * sizeof *p, h) : fnv("-", h);
}

static uint64_t digest_of(const tk_batch *b, int n, uint64_t h) {
    for (int i = 0; i < n; i++) {
        int32_t shape[2] = {b[i].B, b[i].T};
        size_t bt = (size_t)b[i].B * (size_t)b[i].T;
        h = fnv_bytes(shape, sizeof shape, h);
        h = digest_arr(b[i].input_ids, bt, h);
        h = digest_arr(b[i].token_type_ids, bt, h);
        h = digest_arr(b[i].attention_mask, bt, h);
        h = digest_arr(b[i].labels, (size_t)b[i].B, h);
        h = digest_arr(b[i].start_positions, (size_t)b[i].B, h);
        h = digest_arr(b[i].end_positions, (size_t)b[i].B, h);
    }
    return h;
}

tk_status tk_run_data_load(const tk_config *c, tk_run_data *d, tk_err *err) {
    memset(d, 0, sizeof *d);
    if (!c->train_file[0]) {
        tk_err_set(err, TK_EINVAL, "train_file: not set (name a CSV, TSV, JSONL or SQuAD JSON file)");
        return TK_EINVAL;
    }
    /* a file that cannot be opened is named with the key that names it, so
     * the user knows which line of the config to fix */
    const char *const keys[2] = {"train_file", "dev_file"};
    const char *const files[2] = {c->train_file, c->dev_file};
    for (int i = 0; i < 2; i++) {
        if (files[i][0] && access(files[i], R_OK) != 0) {
            tk_err_set(err, TK_EIO, "%s: %s: cannot open: %s", keys[i], files[i], strerror(errno));
            return TK_EIO;
        }
    }
    if (c->head == TK_HEAD_FLATTEN_DENSE && c->towers > 1) {
        tk_err_set(err, TK_EINVAL,
                   "towers: %d-tower training from a data file is not supported; plan it with %%txplan "
                   "(or train with towers: 1)", c->towers);
        return TK_EINVAL;
    }
    if (!(d->priv = tk_calloc(1, sizeof(owned)))) {
        tk_err_set(err, TK_ENOMEM, "data: out of host memory");
        return TK_ENOMEM;
    }
    tk_status st = c->task == TK_TASK_QA ? load_squad(c, d, err) : load_classify(c, d, err);
    if (st != TK_OK) {
        tk_run_data_clear(d);
        return st;
    }
    d->digest = digest_of(d->dev, d->n_dev, digest_of(d->train, d->n_train, FNV0));
    return TK_OK;
}

void tk_run_data_clear(tk_run_data *d) {
    if (!d) return;
    owned *o = d->priv;
    for (int k = 0; o && k < 2; k++) {
        for (int i = 0; i < o->n[k]; i++) tk_data_batch_clear(&o->raw[k][i]);
        free(o->raw[k]);
    }
    if (o) {
        tk_features_destroy(&o->dev_f);
        tk_squad_destroy(&o->dev_sq);
    }
    free(o);
    for (int i = 0; d->labels && i < d->num_labels; i++) free(d->labels[i]);
    free(d->labels);
    free(d->train);
    free(d->dev);
    free(d->lengths);
    memset(d, 0, sizeof *d);
}

void tk_run_config(const tk_run_data *d, tk_config *c) {
    if (c->task == TK_TASK_CLASSIFY && c->head == TK_HEAD_POOLED && c->num_labels == 0 && d->num_labels > 0)
        c->num_labels = d->num_labels;
}

/* ---- evaluation and prediction sets --------------------------------------- */

/* Labels of ds mapped onto the model's (in its id order, which need not be
 * sorted): a label outside them is an error naming the line. */
static tk_status map_labels(tk_dataset *ds, const char *const *labels, int n_labels, tk_err *err) {
    for (int i = 0; i < ds->n; i++) {
        int k = 0;
        while (k < n_labels && strcmp(ds->label_str[i], labels[k])) k++;
        if (k == n_labels) {
            char list[400] = "";
            size_t used = 0;
            for (int j = 0; j < n_labels; j++) {
                int m = snprintf(list + used, sizeof list - used, "%s%s", j ? ", " : "", labels[j]);
                if (m < 0 || used + (size_t)m >= sizeof list) break;
                used += (size_t)m;
            }
            tk_err_set(err, TK_EINVAL, "%s:%d: label '%s' is not one the model knows (its labels: %s)", ds->name,
                       ds->line[i], ds->label_str[i], list);
            return TK_EINVAL;
        }
        ds->label[i] = k;
    }
    return TK_OK;
}

static tk_status eval_classify(const tk_config *c, const char *const *labels, int n_labels, tk_run_data *d,
                               tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    tk_data_cols cols = {.text = c->text_col, .text_pair = c->text_pair_col, .label = c->label_col,
                         .label_optional = 1};
    tk_dataset *ds = NULL;
    tk_tokenizer *tok = NULL;
    tk_features *f = NULL;
    tk_status st;
    if ((st = tk_dataset_load(c->train_file, &cols, &ds, err)) != TK_OK) goto out;
    if (ds->n > 0 && ds->num_labels > 0 && (st = map_labels(ds, labels, n_labels, err)) != TK_OK) goto out;
    if (c->max_examples > 0 && ds->n > c->max_examples) ds->n = c->max_examples;
    if (!(tok = tk_run_tokenizer(c, c->train_file, (const char *const *)ds->text, ds->n, d->vocab_path,
                                 sizeof d->vocab_path, d->vocab_note, sizeof d->vocab_note, err))) {
        st = err->status;
        goto out;
    }
    tokenizer_facts(tok, d);
    if ((st = tk_features_classify(tok, ds, c->max_len, TK_TRUNC_LONGEST_FIRST, &f, err)) != TK_OK) goto out;
    d->num_labels = ds->num_labels > 0 ? n_labels : 0;
    d->n_dev_examples = ds->n;
    d->n_truncated = f->n_truncated;
    if ((st = lengths_of(f, d, err)) != TK_OK) goto out;
    st = batches_of(f, NULL, c, tk_tokenizer_special(tok).pad, d, err);
    if (st == TK_OK) { /* the set goes to dev: it is evaluated, never trained on */
        owned *o = d->priv;
        d->dev = d->train;
        d->n_dev = d->n_train;
        d->train = NULL;
        d->n_train = 0;
        o->raw[1] = o->raw[0];
        o->n[1] = o->n[0];
        o->raw[0] = NULL;
        o->n[0] = 0;
        o->dev_f = f;
        f = NULL;
    }
out:
    tk_features_destroy(&f);
    tk_tokenizer_destroy(&tok);
    tk_dataset_destroy(&ds);
    return st;
}

static tk_status eval_squad(const tk_config *c, tk_run_data *d, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    tk_squad *sq = NULL;
    tk_tokenizer *tok = NULL;
    tk_features *f = NULL;
    const char **texts = NULL;
    tk_status st;
    if ((st = tk_squad_load(c->train_file, &sq, err)) != TK_OK) goto out;
    if (c->max_examples > 0 && sq->n > c->max_examples) sq->n = c->max_examples;
    texts = tk_malloc((size_t)(2 * sq->n + 1) * sizeof *texts);
    if (!texts) {
        tk_err_set(err, TK_ENOMEM, "data: out of host memory");
        st = TK_ENOMEM;
        goto out;
    }
    for (int i = 0; i < sq->n; i++) {
        texts[2 * i] = sq->ex[i].question;
        texts[2 * i + 1] = sq->ex[i].context;
    }
    if (!(tok = tk_run_tokenizer(c, c->train_file, texts, 2 * sq->n, d->vocab_path, sizeof d->vocab_path,
                                 d->vocab_note, sizeof d->vocab_note, err))) {
        st = err->status;
        goto out;
    }
    tokenizer_facts(tok, d);
    if ((st = tk_features_squad(tok, sq, c->max_len, c->doc_stride, &f, err)) != TK_OK) goto out;
    d->num_labels = 2;
    d->n_dev_examples = sq->n;
    if ((st = lengths_of(f, d, err)) != TK_OK) goto out;
    owned *o = d->priv;
    st = make_batches(f, c, c->eval_batch_size > 0 ? c->eval_batch_size : c->batch_size,
                      tk_tokenizer_special(tok).pad, &o->raw[1], &d->dev, &d->n_dev, err);
    if (st == TK_OK) {
        o->n[1] = d->n_dev;
        o->dev_f = f;
        o->dev_sq = sq;
        f = NULL;
        sq = NULL;
    }
out:
    free(texts);
    tk_features_destroy(&f);
    tk_tokenizer_destroy(&tok);
    tk_squad_destroy(&sq);
    return st;
}

tk_status tk_run_data_load_eval(const tk_config *c0, const char *const *labels, int n_labels, tk_run_data *d,
                                tk_err *err) {
    memset(d, 0, sizeof *d);
    if (!c0->train_file[0]) {
        tk_err_set(err, TK_EINVAL, "no input file (a CSV, TSV, JSONL or SQuAD JSON file)");
        return TK_EINVAL;
    }
    /* file order, each batch padded to its longest: the fastest exact way */
    tk_config c = *c0;
    if (c.head != TK_HEAD_FLATTEN_DENSE) c.batching = TK_BATCH_DYNAMIC;
    if (!(d->priv = tk_calloc(1, sizeof(owned)))) {
        tk_err_set(err, TK_ENOMEM, "data: out of host memory");
        return TK_ENOMEM;
    }
    tk_status st = c.task == TK_TASK_QA ? eval_squad(&c, d, err) : eval_classify(&c, labels, n_labels, d, err);
    if (st != TK_OK) {
        tk_run_data_clear(d);
        return st;
    }
    d->digest = digest_of(d->dev, d->n_dev, FNV0);
    return TK_OK;
}

const int32_t *tk_run_data_rows(const tk_run_data *d, int i) {
    const owned *o = d->priv;
    return o && i >= 0 && i < o->n[1] ? o->raw[1][i].index : NULL;
}

int tk_run_data_example_of(const tk_run_data *d, int feature) {
    const owned *o = d->priv;
    return o && o->dev_f && feature >= 0 && feature < o->dev_f->n ? o->dev_f->example[feature] : -1;
}

int tk_run_data_span(const tk_run_data *d, int feature, int start, int end, tk_run_span *out) {
    const owned *o = d->priv;
    memset(out, 0, sizeof *out);
    out->char_start = out->char_end = -1;
    const tk_features *f = o ? o->dev_f : NULL;
    if (!o || !o->dev_sq || !f || feature < 0 || feature >= f->n) return -1;
    const tk_squad_example *ex = &o->dev_sq->ex[f->example[feature]];
    out->context = ex->context;
    out->gold = (const char *const *)ex->answer_text;
    out->n_gold = ex->nanswers;
    out->id = ex->id;
    int64_t t0 = f->off[feature];
    int len = f->len[feature];
    if (start <= 0 || end < start || end >= len) return 0;
    int32_t b0 = f->ctx_bstart[t0 + start], b1 = f->ctx_bend[t0 + end];
    if (b0 < 0 || b1 <= b0) return 0;
    out->byte_start = b0;
    out->byte_end = b1;
    /* character offsets, as SQuAD's answer_start counts them (UTF-8 lead bytes) */
    int ch = 0;
    for (int32_t b = 0; b < b1; b++) {
        if (b == b0) out->char_start = ch;
        if (((unsigned char)ex->context[b] & 0xC0) != 0x80) ch++;
    }
    out->char_end = ch;
    return 0;
}

int tk_run_data_token_byte(const tk_run_data *d, int feature, int pos) {
    const owned *o = d->priv;
    const tk_features *f = o ? o->dev_f : NULL;
    if (!f || !f->ctx_bstart || feature < 0 || feature >= f->n || pos < 0 || pos >= f->len[feature]) return -1;
    return f->ctx_bstart[f->off[feature] + pos];
}

/* ---- token lengths of a data file --------------------------------------------- */

/* A SQuAD file: a .json whose top level has "data" (else NULL, and the
 * caller reads a table). */
static tk_squad *lengths_try_squad(const char *path) {
    size_t n = strlen(path);
    if (n < 5 || strcmp(path + n - 5, ".json")) return NULL;
    tk_squad *sq = NULL;
    tk_err e = {0};
    return tk_squad_load(path, &sq, &e) == TK_OK ? sq : NULL;
}

tk_status tk_run_text_lengths(const tk_config *c, const char *path, const char *text_col, const char *pair_col,
                              tk_run_lengths *out, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    tk_table *t = NULL;
    tk_squad *sq = lengths_try_squad(path);
    tk_tokenizer *tok = NULL;
    const char **texts = NULL;
    tk_status st = TK_OK;
    int nrows, ci = -1, pi = -1;
    memset(out, 0, sizeof *out);
    if (sq) {
        snprintf(out->name, sizeof out->name, "%s", sq->name);
        snprintf(out->column, sizeof out->column, "question + context");
        nrows = sq->n;
    } else {
        if ((st = tk_table_read(path, &t, err)) != TK_OK) return st;
        const char *col = text_col && *text_col ? text_col : "text";
        ci = tk_table_col(t, col);
        pi = pair_col && *pair_col ? tk_table_col(t, pair_col) : -1;
        if (ci < 0 || (pair_col && *pair_col && pi < 0)) {
            char list[512] = "";
            size_t k = 0;
            for (int i = 0; i < t->ncols && k < sizeof list; i++)
                k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", t->cols[i]);
            tk_err_set(err, TK_EINVAL, "%s: no column '%s' (columns: %s; pick one with --text COL)", t->name,
                       ci < 0 ? col : pair_col, list);
            st = TK_EINVAL;
            goto out;
        }
        snprintf(out->name, sizeof out->name, "%s", t->name);
        snprintf(out->column, sizeof out->column, "%s", col);
        nrows = t->nrows;
    }
    texts = tk_malloc((size_t)(nrows > 0 ? 2 * nrows : 1) * sizeof *texts);
    out->len = tk_malloc((size_t)(nrows > 0 ? nrows : 1) * sizeof *out->len);
    if (!texts || !out->len) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", path);
        st = TK_ENOMEM;
        goto out;
    }
    for (int i = 0; i < nrows; i++) {
        texts[i] = sq ? sq->ex[i].context : t->cells[(size_t)i * t->ncols + ci];
        texts[nrows + i] = sq ? sq->ex[i].question : pi >= 0 ? t->cells[(size_t)i * t->ncols + pi] : NULL;
    }
    if (!(tok = tk_run_tokenizer(c, path, texts, nrows, out->vocab_path, sizeof out->vocab_path, out->vocab_note,
                                 sizeof out->vocab_note, err))) {
        st = err->status;
        goto out;
    }
    for (int i = 0; i < nrows; i++) {
        const char *pair = texts[nrows + i];
        int n = tk_count_tokens(tok, texts[i], (size_t)-1);
        int np = pair ? tk_count_tokens(tok, pair, (size_t)-1) : 0;
        if (n < 0 || np < 0) {
            tk_err_set(err, TK_ENOMEM, "%s: out of host memory while tokenizing", path);
            st = TK_ENOMEM;
            goto out;
        }
        out->len[i] = n + np + (pair ? 3 : 2); /* [CLS] a [SEP] (b [SEP]) */
    }
    out->n = nrows;
out:
    free(texts);
    tk_tokenizer_destroy(&tok);
    tk_table_destroy(&t);
    tk_squad_destroy(&sq);
    if (st != TK_OK) tk_run_lengths_clear(out);
    return st;
}

void tk_run_lengths_clear(tk_run_lengths *l) {
    free(l->len);
    memset(l, 0, sizeof *l);
}
