/* parity_main.c — the C side of tests/bert/test_parity_torch.py.
 *
 *   bert_parity MODEL_DIR HEAD NUM_LABELS TOWERS MAX_LEN BATCH.safetensors OUT.safetensors
 *
 * Loads the HF folder (config.json + model.safetensors) on the cpu backend,
 * runs one training step (tk_model_forward_backward, grad_scale 1) on the
 * batch (I64 or I32 tensors input_ids, token_type_ids, attention_mask and
 * labels or start_positions/end_positions), and writes "logits", "loss",
 * "eval_logits", "eval_loss" and "grad.<param name>" for every parameter to
 * OUT. Exit status 0 on success; a message on stderr otherwise.
 */
#include "tk_model.h"
#include "tk_safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int32_t *ints(const tk_st_file *f, const char *name, int64_t *n) {
    const tk_st_entry *e = tk_st_find(f, name);
    if (!e) return NULL;
    *n = tk_st_numel(e);
    int32_t *out = malloc((size_t)(*n ? *n : 1) * sizeof *out);
    const uint8_t *p = tk_st_data(f, e);
    for (int64_t i = 0; out && i < *n; i++) {
        if (e->dtype == TK_ST_I64) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            out[i] = (int32_t)v;
        } else {
            memcpy(&out[i], p + 4 * i, 4);
        }
    }
    return out;
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s MODEL_DIR pooled|span|flatten_dense NUM_LABELS TOWERS MAX_LEN "
                        "BATCH.safetensors OUT.safetensors\n", argv[0]);
        return 2;
    }
    tk_err e = {0};
    tk_model_opts o;
    memset(&o, 0, sizeof o);
    if (tk_bert_dims_from_config_json(argv[1], &o.dims, &e) != TK_OK) goto fail;
    o.head = !strcmp(argv[2], "span") ? TK_HEAD_SPAN
           : !strcmp(argv[2], "flatten_dense") ? TK_HEAD_FLATTEN_DENSE : TK_HEAD_POOLED;
    o.num_labels = atoi(argv[3]);
    o.towers = atoi(argv[4]);
    o.max_len = atoi(argv[5]);
    o.seed = 1;
    tk_dev_opts dopts = {.kind = TK_DEV_CPU};
    tk_dev *d = tk_dev_new(&dopts, &e);
    if (!d) goto fail;
    tk_model *m = tk_model_new(d, &o, &e);
    if (!m) goto fail;
    tk_load_report rep = {0};
    if (tk_model_load_hf(m, argv[1], &rep, &e) != TK_OK) goto fail;
    if (rep.n_new) fprintf(stderr, "newly initialised: %s\n", rep.new_names);
    if (rep.n_unused) fprintf(stderr, "unused: %s\n", rep.unused_names);
    tk_load_report_clear(&rep);
    tk_st_file *bf = tk_st_open(argv[6], &e);
    if (!bf) goto fail;
    int64_t n = 0, nl = 0;
    int32_t *ids = ints(bf, "input_ids", &n), *tt = ints(bf, "token_type_ids", &n),
            *mask = ints(bf, "attention_mask", &n), *labels = ints(bf, "labels", &nl),
            *sp = ints(bf, "start_positions", &nl), *ep = ints(bf, "end_positions", &nl);
    const tk_st_entry *ie = tk_st_find(bf, "input_ids");
    if (!ie || !ids) {
        fprintf(stderr, "%s: no input_ids\n", argv[6]);
        return 1;
    }
    tk_batch b = {.B = (int)ie->shape[0], .T = (int)ie->shape[ie->ndim - 1], .input_ids = ids,
                  .token_type_ids = tt, .attention_mask = mask, .labels = labels,
                  .start_positions = sp, .end_positions = ep};
    int64_t nlog = tk_model_n_logits(m, b.B, b.T);
    float *logits = calloc((size_t)nlog, sizeof(float)), *elogits = calloc((size_t)nlog, sizeof(float));
    float loss = 0, eloss = 0;
    if (tk_model_forward_backward(m, &b, 0, 1.0f, &loss, logits, &e) != TK_OK) goto fail;
    if (tk_model_forward_eval(m, &b, &eloss, elogits, &e) != TK_OK) goto fail;

    tk_st_writer *w = tk_st_writer_new();
    int np = tk_model_n_params(m);
    float **g = calloc((size_t)np, sizeof *g);
    int64_t one = 1, shl = nlog;
    tk_st_writer_add(w, "logits", TK_ST_F32, 1, &shl, logits, &e);
    tk_st_writer_add(w, "loss", TK_ST_F32, 1, &one, &loss, &e);
    tk_st_writer_add(w, "eval_logits", TK_ST_F32, 1, &shl, elogits, &e);
    tk_st_writer_add(w, "eval_loss", TK_ST_F32, 1, &one, &eloss, &e);
    char (*names)[160] = calloc((size_t)np, sizeof *names);
    for (int i = 0; i < np; i++) {
        const tk_param *p = tk_model_param(m, i);
        g[i] = calloc((size_t)tk_tensor_numel(p->g), sizeof(float));
        if (tk_tensor_read_f32(d, p->g, g[i], &e) != TK_OK) goto fail;
        snprintf(names[i], sizeof names[i], "grad.%s", p->name);
        if (tk_st_writer_add(w, names[i], TK_ST_F32, p->g->ndim, p->g->shape, g[i], &e) != TK_OK)
            goto fail;
    }
    if (tk_st_writer_write(w, argv[7], &e) != TK_OK) goto fail;
    tk_st_writer_destroy(&w);
    for (int i = 0; i < np; i++) free(g[i]);
    free(g);
    free(names);
    free(logits);
    free(elogits);
    free(ids);
    free(tt);
    free(mask);
    free(labels);
    free(sp);
    free(ep);
    tk_st_close(&bf);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    return 0;
fail:
    fprintf(stderr, "bert_parity: %s\n", e.msg);
    return 1;
}
