/* train_config.c — one run from a config: data, model, loop (tk_train_config).
 *
 * The model side of the glue: it sees the data only as tk_hostbatch arrays
 * (tk_trainset.h) and hands them to tk_train_run as the model's tk_batch.
 * Guarantees: whatever happens, the data and every device tensor the run
 * took are released, except the model when the caller asks for it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tk_train.h"
#include "tk_trainset.h"

static int file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static tk_batch *to_batches(const tk_trainset *ts, int dev, int *n) {
    *n = tk_trainset_n_batches(ts, dev);
    tk_batch *b = calloc((size_t)(*n > 0 ? *n : 1), sizeof *b);
    for (int i = 0; b && i < *n; i++) {
        const tk_hostbatch *h = tk_trainset_batch(ts, dev, i);
        b[i] = (tk_batch){ .B = h->B, .T = h->T, .input_ids = h->input_ids,
                           .token_type_ids = h->token_type_ids, .attention_mask = h->attention_mask,
                           .labels = h->labels, .start_positions = h->start_positions,
                           .end_positions = h->end_positions };
    }
    return b;
}

tk_status tk_train_config(const tk_config *c, tk_dev *d, const tk_train_callbacks *cb,
                          tk_model **model_out, tk_train_result *r, tk_err *err) {
    memset(r, 0, sizeof *r);
    if (model_out)
        *model_out = NULL;
    tk_trainset *ts = tk_trainset_load(c, err);
    if (!ts)
        return r->status = err && err->status ? err->status : TK_EINVAL;
    tk_config cc = *c;
    struct stat st_model;
    int folder = stat(c->model, &st_model) == 0 && S_ISDIR(st_model.st_mode);
    if (cc.num_labels <= 0)
        cc.num_labels = tk_trainset_num_labels(ts);
    if (!folder && cc.vocab_size <= 0)
        cc.vocab_size = tk_trainset_vocab_size(ts);
    tk_status st;
    tk_model *m = NULL;
    tk_batch *train = NULL, *dev = NULL;
    int n_train = 0, n_dev = 0;
    tk_model_opts mo;
    if ((st = tk_model_opts_from_config(&mo, &cc, err)) != TK_OK)
        goto out;
    if (!(m = tk_model_new(d, &mo, err))) {
        st = err && err->status ? err->status : TK_EOOM;
        if (st == TK_EOOM && tk_dev_last_oom(d)) {
            r->have_oom = 1;
            r->oom = *tk_dev_last_oom(d);
        }
        goto out;
    }
    char weights[TK_PATH_MAX + 32];
    snprintf(weights, sizeof weights, "%s/model.safetensors", c->model);
    if (folder && file_exists(weights))
        st = tk_model_load_hf(m, c->model, NULL, NULL, 0, err);
    else
        st = tk_model_init_random(m, cc.seed, err);
    if (st != TK_OK)
        goto out;
    train = to_batches(ts, 0, &n_train);
    dev = to_batches(ts, 1, &n_dev);
    if (!train || !dev) {
        tk_err_set(err, TK_EINVAL, "train: out of host memory");
        st = TK_EINVAL;
        goto out;
    }
    st = tk_train_run(&cc, m, train, n_train, dev, n_dev, cb, r, err);
    free(train);
    free(dev);
    tk_trainset_destroy(&ts);
    if (model_out)
        *model_out = m;
    else
        tk_model_destroy(&m);
    return st;
out:
    free(train);
    free(dev);
    tk_model_destroy(&m);
    tk_trainset_destroy(&ts);
    return r->status = st;
}
