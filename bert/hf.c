/* hf.c — the model description: presets, HF config.json, options from a config.
 *
 * Presets are the sizes Google released (Turc et al. small BERTs, base,
 * large); config.json follows HF BertConfig's field names and defaults, so a
 * folder saved by HF transformers (4.x or 5.x: "dtype" or "torch_dtype", no
 * position_embedding_type) loads here and one written here loads there.
 * Errors name the file and the key.
 */
#include "tk_files.h"
#include "tk_model.h"
#include "tk_host_mem.h"
#include "tk_safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

typedef struct preset {
    const char *name;
    int layers, hidden, heads, inter, vocab, lowercase;
} preset;

/* Small BERTs were released uncased only (vocab 30522). */
static const preset presets[] = {
    {"bert-tiny", 2, 128, 2, 512, 30522, 1},
    {"bert-mini", 4, 256, 4, 1024, 30522, 1},
    {"bert-small", 4, 512, 8, 2048, 30522, 1},
    {"bert-medium", 8, 512, 8, 2048, 30522, 1},
    {"bert-base-cased", 12, 768, 12, 3072, 28996, 0},
    {"bert-base-uncased", 12, 768, 12, 3072, 30522, 1},
    {"bert-base", 12, 768, 12, 3072, 30522, 1},
    {"bert-large-cased", 24, 1024, 16, 4096, 28996, 0},
    {"bert-large-uncased", 24, 1024, 16, 4096, 30522, 1},
    {"bert-large", 24, 1024, 16, 4096, 30522, 1},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

static const char *const preset_names[] = {
    "bert-tiny", "bert-mini", "bert-small", "bert-medium", "bert-base-cased", "bert-base-uncased",
    "bert-base", "bert-large-cased", "bert-large-uncased", "bert-large", NULL};

const char *const *tk_bert_preset_names(void) { return preset_names; }

static void dims_defaults(tk_bert_dims *d) {
    /* HF BertConfig() defaults. */
    d->hidden = 768;
    d->layers = 12;
    d->heads = 12;
    d->intermediate = 3072;
    d->vocab_size = 30522;
    d->max_position = 512;
    d->type_vocab = 2;
    d->layer_norm_eps = 1e-12f;
    d->hidden_dropout = 0.1f;
    d->attn_dropout = 0.1f;
}

int tk_bert_preset(const char *name, tk_bert_dims *out, int *lowercase) {
    const char *n = name;
    /* Accept hub-style names: "google-bert/bert-base-cased", "prajjwal1/bert-tiny". */
    const char *slash = strrchr(name, '/');
    if (slash) n = slash + 1;
    int L = 0, H = 0, A = 0;
    const preset *p = NULL;
    for (int i = 0; i < N_PRESETS && !p; i++)
        if (strcasecmp(n, presets[i].name) == 0) p = &presets[i];
    if (!p && sscanf(n, "bert_uncased_L-%d_H-%d_A-%d", &L, &H, &A) == 3) {
        for (int i = 0; i < N_PRESETS && !p; i++)
            if (presets[i].layers == L && presets[i].hidden == H && presets[i].heads == A &&
                presets[i].lowercase)
                p = &presets[i];
    }
    if (!p) return -1;
    tk_bert_dims d;
    dims_defaults(&d);
    d.layers = p->layers;
    d.hidden = p->hidden;
    d.heads = p->heads;
    d.intermediate = p->inter;
    d.vocab_size = p->vocab;
    *out = d;
    if (lowercase) *lowercase = p->lowercase;
    return 0;
}

tk_status tk_bert_dims_check(const tk_bert_dims *d, tk_err *err) {
    const struct { const char *k; int v; } pos[] = {
        {"hidden_size", d->hidden}, {"num_hidden_layers", d->layers},
        {"num_attention_heads", d->heads}, {"intermediate_size", d->intermediate},
        {"vocab_size", d->vocab_size}, {"max_position_embeddings", d->max_position},
        {"type_vocab_size", d->type_vocab}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0) {
            tk_err_set(err, TK_EINVAL, "model: %s must be positive (got %d)", pos[i].k, pos[i].v);
            return TK_EINVAL;
        }
    if (d->hidden % d->heads) {
        tk_err_set(err, TK_EINVAL, "model: hidden_size %d is not a multiple of num_attention_heads %d",
                   d->hidden, d->heads);
        return TK_EINVAL;
    }
    if (!(d->hidden_dropout >= 0 && d->hidden_dropout < 1) ||
        !(d->attn_dropout >= 0 && d->attn_dropout < 1)) {
        tk_err_set(err, TK_EINVAL, "model: dropout probabilities must be in [0, 1) (got %g, %g)",
                   (double)d->hidden_dropout, (double)d->attn_dropout);
        return TK_EINVAL;
    }
    if (!(d->layer_norm_eps > 0)) {
        tk_err_set(err, TK_EINVAL, "model: layer_norm_eps must be positive (got %g)",
                   (double)d->layer_norm_eps);
        return TK_EINVAL;
    }
    return TK_OK;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

tk_status tk_bert_dims_from_config_json(const char *path, tk_bert_dims *out, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    char file[TK_PATH_MAX + 16];
    if (is_dir(path)) snprintf(file, sizeof file, "%s/config.json", path);
    else snprintf(file, sizeof file, "%s", path);
    json_error_t je;
    json_t *root = json_load_file(file, 0, &je);
    if (!root) {
        tk_err_set(err, errno == ENOENT || je.line < 0 ? TK_EIO : TK_EFORMAT, "%s:%d: %s", file,
                   je.line, je.text);
        return err->status;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        tk_err_set(err, TK_EFORMAT, "%s: not a JSON object", file);
        return TK_EFORMAT;
    }
    tk_bert_dims d;
    dims_defaults(&d);
    const struct { const char *k; int *v; } ints[] = {
        {"hidden_size", &d.hidden}, {"num_hidden_layers", &d.layers},
        {"num_attention_heads", &d.heads}, {"intermediate_size", &d.intermediate},
        {"vocab_size", &d.vocab_size}, {"max_position_embeddings", &d.max_position},
        {"type_vocab_size", &d.type_vocab}};
    const struct { const char *k; float *v; } flts[] = {
        {"layer_norm_eps", &d.layer_norm_eps}, {"hidden_dropout_prob", &d.hidden_dropout},
        {"attention_probs_dropout_prob", &d.attn_dropout}};
    tk_status st = TK_OK;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && st == TK_OK; i++) {
        json_t *v = json_object_get(root, ints[i].k);
        if (!v) continue;
        if (!json_is_integer(v) || json_integer_value(v) > 1000000000) {
            tk_err_set(err, TK_EFORMAT, "%s: \"%s\" must be an integer", file, ints[i].k);
            st = TK_EFORMAT;
        } else {
            *ints[i].v = (int)json_integer_value(v);
        }
    }
    for (size_t i = 0; i < sizeof flts / sizeof flts[0] && st == TK_OK; i++) {
        json_t *v = json_object_get(root, flts[i].k);
        if (!v) continue;
        if (!json_is_number(v)) {
            tk_err_set(err, TK_EFORMAT, "%s: \"%s\" must be a number", file, flts[i].k);
            st = TK_EFORMAT;
        } else {
            *flts[i].v = (float)json_number_value(v);
        }
    }
    json_t *act = json_object_get(root, "hidden_act");
    if (st == TK_OK && act && (!json_is_string(act) || strcmp(json_string_value(act), "gelu") != 0)) {
        tk_err_set(err, TK_EFORMAT, "%s: \"hidden_act\" is %s; only \"gelu\" (erf) is supported", file,
                   json_is_string(act) ? json_string_value(act) : "not a string");
        st = TK_EFORMAT;
    }
    /* transformers 5 writes "dtype" where 4.x wrote "torch_dtype": the
     * dtype the weights were saved in. Ours are read as whatever dtype the
     * weights file says, so only a dtype we cannot read, or two keys that
     * disagree, is an error. */
    const char *dt[2] = {NULL, NULL};
    static const char *const dt_keys[2] = {"dtype", "torch_dtype"};
    for (int i = 0; i < 2 && st == TK_OK; i++) {
        json_t *v = json_object_get(root, dt_keys[i]);
        if (!v || json_is_null(v)) continue;
        dt[i] = json_string_value(v);
        if (dt[i] && !strncmp(dt[i], "torch.", 6)) dt[i] += 6;
        if (!dt[i] || (strcmp(dt[i], "float32") && strcmp(dt[i], "float16") && strcmp(dt[i], "bfloat16") &&
                       strcmp(dt[i], "auto"))) {
            tk_err_set(err, TK_EFORMAT, "%s: \"%s\" is %s; only float32, float16 and bfloat16 weights are read", file,
                       dt_keys[i], dt[i] ? dt[i] : "not a string");
            st = TK_EFORMAT;
        }
    }
    if (st == TK_OK && dt[0] && dt[1] && strcmp(dt[0], dt[1])) {
        tk_err_set(err, TK_EFORMAT, "%s: \"dtype\" is %s but \"torch_dtype\" is %s; keep one", file, dt[0], dt[1]);
        st = TK_EFORMAT;
    }
    /* a decoder (causal attention, cross-attention) is not this encoder */
    static const char *const enc_only[] = {"is_decoder", "add_cross_attention"};
    for (int i = 0; i < 2 && st == TK_OK; i++)
        if (json_is_true(json_object_get(root, enc_only[i]))) {
            tk_err_set(err, TK_EFORMAT, "%s: \"%s\" is true; only BERT as an encoder is supported", file, enc_only[i]);
            st = TK_EFORMAT;
        }
    json_t *pe = json_object_get(root, "position_embedding_type");
    if (st == TK_OK && pe && (!json_is_string(pe) || strcmp(json_string_value(pe), "absolute") != 0)) {
        tk_err_set(err, TK_EFORMAT, "%s: \"position_embedding_type\" must be \"absolute\"", file);
        st = TK_EFORMAT;
    }
    json_decref(root);
    if (st == TK_OK) {
        tk_err sub;
        if (tk_bert_dims_check(&d, &sub) != TK_OK) {
            tk_err_set(err, TK_EFORMAT, "%s: %s", file, sub.msg);
            return TK_EFORMAT;
        }
        *out = d;
    }
    return st;
}

tk_status tk_bert_dims_write_config_json(const char *path, const tk_bert_dims *d, tk_head_kind head, int num_labels,
                                         const char *const *labels, tk_err *err) {
    const char *arch = head == TK_HEAD_POOLED ? "BertForSequenceClassification"
                     : head == TK_HEAD_SPAN ? "BertForQuestionAnswering" : "BertModel";
    json_t *o = json_pack("{s:[s], s:s, s:f, s:s, s:f, s:i, s:f, s:i, s:f, s:i, s:s, s:i, s:i, s:i, "
                          "s:i, s:s, s:i}",
                          "architectures", arch, "model_type", "bert",
                          "attention_probs_dropout_prob", (double)d->attn_dropout,
                          "hidden_act", "gelu", "hidden_dropout_prob", (double)d->hidden_dropout,
                          "hidden_size", d->hidden, "initializer_range", 0.02,
                          "intermediate_size", d->intermediate,
                          "layer_norm_eps", (double)d->layer_norm_eps,
                          "max_position_embeddings", d->max_position,
                          "position_embedding_type", "absolute",
                          "num_attention_heads", d->heads, "num_hidden_layers", d->layers,
                          "type_vocab_size", d->type_vocab, "vocab_size", d->vocab_size,
                          "torch_dtype", "float32", "pad_token_id", 0);
    /* transformers 5's name for torch_dtype; 4.x keeps it as a plain attribute */
    if (o) json_object_set_new(o, "dtype", json_string("float32"));
    if (!o) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", path);
        return TK_ENOMEM;
    }
    if (head == TK_HEAD_FLATTEN_DENSE)
        json_object_set_new(o, "txkernel_head",
                            json_string("flatten_dense: a Dense layer over the flattened token sequence "
                                        "(classifier.*); transformers has no class for it, so this folder loads "
                                        "there as a BertModel (the encoder) and classifier.* is unused"));
    if (head == TK_HEAD_POOLED && num_labels > 0) {
        json_t *id2label = json_object(), *label2id = json_object();
        for (int i = 0; i < num_labels; i++) {
            char k[32], v[40];
            snprintf(k, sizeof k, "%d", i);
            snprintf(v, sizeof v, "LABEL_%d", i);
            const char *name = labels && labels[i] ? labels[i] : v;
            json_object_set_new(id2label, k, json_string(name));
            json_object_set_new(label2id, name, json_integer(i));
        }
        json_object_set_new(o, "id2label", id2label);
        json_object_set_new(o, "label2id", label2id);
    }
    tk_status st = tk_write_json_atomic(path, o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9), err);
    json_decref(o);
    return st;
}

tk_status tk_bert_dims_resolve(const char *model, tk_bert_dims *out, int *lowercase, tk_err *err) {
    if (is_dir(model)) {
        tk_status st = tk_bert_dims_from_config_json(model, out, err);
        if (st == TK_OK && lowercase) *lowercase = -1; /* the tokenizer decides from the vocab */
        return st;
    }
    if (tk_bert_preset(model, out, lowercase) == 0) return TK_OK;
    char list[512] = "";
    for (int i = 0; preset_names[i]; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, preset_names[i], sizeof list - strlen(list) - 1);
    }
    tk_err_set(err, TK_EINVAL, "model: '%s' is neither a folder with config.json nor a preset (%s)",
               model, list);
    return TK_EINVAL;
}

tk_status tk_model_opts_from_config(tk_model_opts *o, const tk_config *c, tk_err *err) {
    memset(o, 0, sizeof *o);
    tk_status st = tk_bert_dims_resolve(c->model, &o->dims, NULL, err);
    if (st != TK_OK) return st;
    if (c->hidden > 0) o->dims.hidden = c->hidden;
    if (c->layers > 0) o->dims.layers = c->layers;
    if (c->heads > 0) o->dims.heads = c->heads;
    if (c->intermediate > 0) o->dims.intermediate = c->intermediate;
    if (c->vocab_size > 0) o->dims.vocab_size = c->vocab_size;
    if (c->max_position > 0) o->dims.max_position = c->max_position;
    if (c->type_vocab > 0) o->dims.type_vocab = c->type_vocab;
    if (c->dropout >= 0) o->dims.hidden_dropout = o->dims.attn_dropout = c->dropout;
    if ((st = tk_bert_dims_check(&o->dims, err)) != TK_OK) return st;
    o->head = c->head;
    o->towers = c->towers > 0 ? c->towers : 1;
    o->max_len = c->max_len;
    o->num_labels = c->head == TK_HEAD_FLATTEN_DENSE ? c->head_units
                  : c->head == TK_HEAD_SPAN ? 2 : c->num_labels;
    if (o->num_labels <= 0) {
        tk_err_set(err, TK_EINVAL, "%s: must be known (> 0) to build the head",
                   c->head == TK_HEAD_FLATTEN_DENSE ? "head_units" : "num_labels");
        return TK_EINVAL;
    }
    o->precision = c->precision;
    o->tf32 = c->tf32;
    o->recompute = c->recompute;
    /* auto is decided from the config here (a plan, a device named in it);
     * a session that opened device: auto's device decides first */
    o->attention = tk_config_attention(c, TK_DEV_META, NULL);
    o->freeze_embeddings = c->freeze_embeddings;
    o->freeze_layers = c->freeze_layers;
    o->seed = c->seed;
    return TK_OK;
}

tk_status tk_hf_head_from_config_json(const char *path, int *head, char ***labels, int *n_labels, tk_err *err) {
    *head = -1;
    *labels = NULL;
    *n_labels = 0;
    char file[TK_PATH_MAX + 16];
    if (is_dir(path)) snprintf(file, sizeof file, "%s/config.json", path);
    else snprintf(file, sizeof file, "%s", path);
    json_error_t je;
    json_t *root = json_load_file(file, 0, &je);
    if (!root || !json_is_object(root)) {
        tk_err_set(err, TK_EFORMAT, "%s:%d: %s", file, je.line, root ? "not a JSON object" : je.text);
        json_decref(root);
        return TK_EFORMAT;
    }
    json_t *arch = json_object_get(root, "architectures");
    const char *a = json_is_array(arch) ? json_string_value(json_array_get(arch, 0)) : NULL;
    if (a && strstr(a, "QuestionAnswering")) *head = TK_HEAD_SPAN;
    else if (a && strstr(a, "SequenceClassification")) *head = TK_HEAD_POOLED;
    else if (json_object_get(root, "txkernel_head")) *head = TK_HEAD_FLATTEN_DENSE;
    json_t *id2label = json_object_get(root, "id2label");
    tk_status st = TK_OK;
    if (json_is_object(id2label) && json_object_size(id2label) > 0) {
        int n = (int)json_object_size(id2label);
        char **names = tk_calloc((size_t)n, sizeof *names);
        const char *k;
        json_t *v;
        if (!names) st = TK_EINVAL;
        json_object_foreach(id2label, k, v) {
            char *end = NULL;
            long id = strtol(k, &end, 10);
            if (st != TK_OK) break;
            if (*end || id < 0 || id >= n || !json_is_string(v) || names[id]) {
                tk_err_set(err, TK_EFORMAT, "%s: id2label: key '%s' is not one of 0..%d with a label name", file, k,
                           n - 1);
                st = TK_EFORMAT;
            } else if (!(names[id] = tk_strdup(json_string_value(v)))) {
                st = TK_EINVAL;
            }
        }
        if (st == TK_EINVAL) tk_err_set(err, TK_ENOMEM, "%s: out of host memory", file);
        if (st != TK_OK) {
            for (int i = 0; names && i < n; i++) free(names[i]);
            free(names);
        } else {
            *labels = names;
            *n_labels = n;
        }
    }
    json_decref(root);
    return st;
}

int tk_hf_model_max_length(const char *dir) {
    char file[TK_PATH_MAX + 32];
    snprintf(file, sizeof file, "%s/tokenizer_config.json", dir);
    json_t *root = json_load_file(file, 0, NULL);
    json_t *v = root ? json_object_get(root, "model_max_length") : NULL;
    /* transformers writes a huge sentinel when the length is unknown */
    int n = json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) <= 1 << 20
                ? (int)json_integer_value(v) : 0;
    json_decref(root);
    return n;
}
