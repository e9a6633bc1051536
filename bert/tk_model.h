/* tk_model.h — the BERT model: dimensions, parameters, forward and backward.
 *
 * What it owns: the model description (HF config.json fields and named
 * presets), the parameters and their gradients on a tk_dev, random init or
 * loading from an HF folder (config.json + model.safetensors), and one
 * training micro-step (forward + backward, gradients accumulated) or one eval
 * step (forward only) for the three heads: pooled, span and flatten_dense.
 *
 * Guarantees:
 *  - Every device byte is allocated through the device's tagged allocator:
 *    parameters TK_CAT_PARAM and gradients TK_CAT_GRAD with the HF module name
 *    as owner ("bert.encoder.layer.7.attention.self.query", "classifier");
 *    activations kept for backward TK_CAT_ACT with the owner of the layer that
 *    produced them; scratch TK_CAT_TEMP; the batch TK_CAT_INPUT (owner
 *    "inputs").
 *  - The allocation sequence depends only on the options and the batch shape,
 *    never on the backend kind, so a step planned on meta makes the same
 *    allocations, in the same order, as the real step on cpu or cuda.
 *  - A step frees everything it allocated before it returns, also on error
 *    (an out-of-memory in the middle of a step leaves the model usable and
 *    the allocator holding only parameters and gradients).
 *  - Dropout masks are a pure function of (seed, step, layer, site), so a
 *    recomputed forward regenerates exactly the same mask.
 *  - Nothing here exits or aborts; errors come back as tk_status + tk_err.
 */
#ifndef TK_MODEL_H
#define TK_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"
#include "tk_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- description ------------------------------------------------------ */

/* The fields of an HF BertConfig that shape the model. */
typedef struct tk_bert_dims {
    int hidden;            /* hidden_size */
    int layers;            /* num_hidden_layers */
    int heads;             /* num_attention_heads */
    int intermediate;      /* intermediate_size */
    int vocab_size;        /* vocab_size */
    int max_position;      /* max_position_embeddings */
    int type_vocab;        /* type_vocab_size */
    float layer_norm_eps;  /* layer_norm_eps */
    float hidden_dropout;  /* hidden_dropout_prob */
    float attn_dropout;    /* attention_probs_dropout_prob */
} tk_bert_dims;

/* A named preset: "bert-tiny", "bert-mini", "bert-small", "bert-medium",
 * "bert-base-cased", "bert-base-uncased", "bert-large-cased",
 * "bert-large-uncased" (plain "bert-base"/"bert-large" are the uncased ones,
 * as the original Google release; "google/bert_uncased_L-2_H-128_A-2" style
 * names map to the small ones). *lowercase (may be NULL) says whether the
 * preset's vocabulary is uncased. Returns 0, or -1 if unknown. */
int tk_bert_preset(const char *name, tk_bert_dims *out, int *lowercase);
/* NULL-terminated list of preset names (borrowed), for help and completion. */
const char *const *tk_bert_preset_names(void);

/* Reads an HF config.json (a file, or a folder holding one). Missing optional
 * fields take BertConfig's defaults; a field of the wrong type is an error
 * naming the file and the key. */
tk_status tk_bert_dims_from_config_json(const char *path, tk_bert_dims *out, tk_err *err);
/* Writes config.json for dims atomically, as transformers writes it for
 * the head: `architectures` BertForSequenceClassification (pooled, with
 * id2label / label2id for num_labels classes: `labels` names them, or NULL
 * for LABEL_i), BertForQuestionAnswering (span), or BertModel with a note
 * that transformers has no class for the flatten_dense head. */
tk_status tk_bert_dims_write_config_json(const char *path, const tk_bert_dims *dims, tk_head_kind head, int num_labels,
                                         const char *const *labels, tk_err *err);
/* What an HF config.json (a folder or the file) says of the head: *head
 * TK_HEAD_POOLED for ...ForSequenceClassification, TK_HEAD_SPAN for
 * ...ForQuestionAnswering, TK_HEAD_FLATTEN_DENSE for txkernel's own, -1
 * otherwise; the id2label names in id order (*labels: new array of new
 * strings, free each and the array; NULL and 0 when absent). */
tk_status tk_hf_head_from_config_json(const char *path, int *head, char ***labels, int *n_labels, tk_err *err);
/* tokenizer_config.json's model_max_length in folder dir, or 0 when absent
 * or unset. */
int tk_hf_model_max_length(const char *dir);
/* `model` is a preset name or an HF folder; fills dims from it. */
tk_status tk_bert_dims_resolve(const char *model, tk_bert_dims *out, int *lowercase, tk_err *err);
/* Checks dims (positive sizes, heads divide hidden, probabilities in [0,1)). */
tk_status tk_bert_dims_check(const tk_bert_dims *d, tk_err *err);

/* Everything that decides which tensors exist and how big they are. */
typedef struct tk_model_opts {
    tk_bert_dims dims;
    tk_head_kind head;     /* pooled | span | flatten_dense */
    int num_labels;        /* pooled: classes; flatten_dense: Dense units N; span: ignored (2) */
    int towers;            /* flatten_dense: sequences per example through the shared BERT (>= 1) */
    int max_len;           /* flatten_dense: the fixed sequence length L (its weight is [N, towers*L*H]) */
    tk_precision precision;/* fp32, or fp16/bf16: 16-bit activations and GEMM inputs, f32 masters and grads */
    int tf32;              /* fp32 GEMMs may use TF32 on cuda (tk_gemm.tf32); no effect on the cpu */
    tk_recompute recompute;/* none | layers (keep each layer's input, rebuild the rest in backward) */
    tk_attention attention;/* standard | fused (tk_op_attention_*: keeps a per-row logsumexp, not the probabilities) */
    size_t attn_chunk_bytes; /* recompute: attention: bytes of scores per chunk (0 = 4 MiB; at least one sequence) */
    int freeze_embeddings; /* 1: embeddings get no gradient */
    int freeze_layers;     /* the first N encoder layers get no gradient */
    uint64_t seed;         /* random init and dropout */
} tk_model_opts;

/* Fills opts from a config: dims from c->model (preset or folder) overridden
 * by the config's non-zero dimension fields, dropout from c->dropout (when
 * >= 0), head, labels, towers, max_len, techniques and seed. num_labels must
 * be known (> 0) for pooled and flatten_dense. */
tk_status tk_model_opts_from_config(tk_model_opts *o, const tk_config *c, tk_err *err);

/* ---- the model -------------------------------------------------------- */

typedef struct tk_model tk_model;

/* One parameter, as the optimizer and the checkpoint writer see it. */
typedef struct tk_param {
    const char *name;      /* HF name: "bert.encoder.layer.0.attention.self.query.weight" */
    const char *owner;     /* HF module name (the allocation tag's owner): "...self.query" */
    tk_tensor *w;          /* borrowed; f32 master weights (fp16/bf16 copies are internal) */
    tk_tensor *g;          /* borrowed; empty (ndim 0, data NULL) while grads are not allocated, or frozen */
    int no_decay;          /* 1 for biases and LayerNorm (HF AdamW grouping) */
    int frozen;            /* 1: no gradient and no optimizer state */
} tk_param;

/* Describes the model and allocates its parameters (TK_CAT_PARAM) on dev, in
 * a fixed order: embeddings, layers 0..L-1, pooler, head. Weights are
 * uninitialised until tk_model_init_random or tk_model_load_hf. `dev` is
 * borrowed and must outlive the model. New reference; NULL on error (an OOM
 * leaves tk_dev_last_oom set and frees what was allocated). attention: fused
 * on a device whose backend has no fused attention op is refused here
 * (TK_EINVAL, the message says to use attention: standard). */
tk_model *tk_model_new(tk_dev *dev, const tk_model_opts *opts, tk_err *err);
void tk_model_destroy(tk_model **pm);

const tk_model_opts *tk_model_opts_of(const tk_model *m); /* borrowed */
tk_dev *tk_model_dev(const tk_model *m);                  /* borrowed */
int64_t tk_model_n_weights(const tk_model *m);            /* total parameter elements */
int64_t tk_model_n_trainable(const tk_model *m);          /* elements not frozen */

/* Parameter iteration: 0 <= i < tk_model_n_params(m). Borrowed. */
int tk_model_n_params(const tk_model *m);
const tk_param *tk_model_param(const tk_model *m, int i);
/* By HF name (with the "bert." prefix); NULL if none. */
const tk_param *tk_model_param_find(const tk_model *m, const char *name);

/* Random init as HF: Linear and Embedding weights N(0, 0.02) from a seeded
 * generator, biases 0, LayerNorm weight 1 and bias 0. Same seed, same
 * weights on every backend (no-op on meta). */
tk_status tk_model_init_random(tk_model *m, uint64_t seed, tk_err *err);

/* What loading a checkpoint did, as transformers reports it: the
 * parameters the checkpoint lacks and that were newly initialised (pooler,
 * head), and the checkpoint tensors this model does not use (an MLM head,
 * say), which are ignored. Each list is complete, with names that share a
 * module grouped when there are several ("cls.predictions.* (6 tensors)");
 * NULL when empty. Owned: tk_load_report_clear frees them. */
typedef struct tk_load_report {
    int n_new, n_unused;
    char *new_names;
    char *unused_names;
} tk_load_report;
void tk_load_report_clear(tk_load_report *r);
/* n tensor names as one comma-separated line, complete, with the names of one
 * module grouped when three or more share it ("cls.predictions.* (6
 * tensors)"; each encoder layer is a module). New string (free()); NULL when
 * n is 0 or out of memory. */
char *tk_names_grouped(const char *const *names, int n);

/* Loads weights from an HF folder in any form it ships them
 * (tk_checkpoint_open: model.safetensors, pytorch_model.bin, or a sharded
 * index of either), or such a file. Names with or without "bert."; LayerNorm.gamma/beta accepted;
 * bert.embeddings.position_ids ignored. Pooler and head may be absent: they
 * are then initialised at random and listed in `rep` (may be NULL; cleared
 * first), with the checkpoint's tensors that are not used. Missing encoder
 * weights (all of them named, grouped), wrong shapes and non-float dtypes
 * are errors naming the tensor, the expected and the found shape/dtype. F32,
 * F16 and BF16 are converted to f32. On meta only the names, shapes and
 * dtypes are checked. */
tk_status tk_model_load_hf(tk_model *m, const char *path, tk_load_report *rep, tk_err *err);

/* The model config c describes, on d, with its weights: loaded from the
 * model folder's model.safetensors (or a .safetensors file) — `rep` (may
 * be NULL) says what was newly initialised and what the checkpoint had that
 * is not used — or, only when c->init is random, initialised at random with
 * c's seed (*random_init = 1; may be NULL). A model with no weights to load
 * under init pretrained is an error that says how to get them (c->model is
 * a local path by now: the caller resolves hub ids, tk_hub.h). New model,
 * or NULL with err; on
 * TK_EOOM the device's last OOM record says what was being allocated. */
tk_model *tk_model_from_config(tk_dev *d, const tk_config *c, tk_load_report *rep, int *random_init,
                               tk_err *err);

/* What a saved folder says besides the weights, so that transformers loads
 * it whole: the label names (config.json's id2label) and the tokenizer
 * (vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json). Strings are
 * copied. n_labels 0 / vocab_path NULL leave that part out. */
typedef struct tk_model_card {
    const char *const *labels;
    int n_labels;
    const char *vocab_path;  /* the vocab.txt or tokenizer.json the run's tokenizer read */
    int lowercase;           /* the tokenizer's do_lower_case */
    int max_len;             /* model_max_length; 0 = the model's max positions */
} tk_model_card;
tk_status tk_model_set_card(tk_model *m, const tk_model_card *card, tk_err *err);

/* Writes every parameter under its HF name (with "bert.") to
 * <dir>/model.safetensors, config.json (tk_bert_dims_write_config_json
 * with the card's labels) and, when the card names a vocabulary, vocab.txt,
 * tokenizer.json, tokenizer_config.json and special_tokens_map.json, each
 * atomically (temp file, fsync, rename); creates dir if needed. The folder
 * loads with transformers' (4.40 and 5.x) AutoConfig / AutoTokenizer /
 * AutoModelFor... */
tk_status tk_model_save_hf(tk_model *m, const char *dir, tk_err *err);

/* Allocates the gradients (TK_CAT_GRAD, same owners as the parameters) of
 * every parameter that is not frozen, in parameter order, and zeroes them.
 * Idempotent. tk_model_forward_backward calls it if needed; a trainer that
 * wants gradients allocated before its optimizer state calls it first. */
tk_status tk_model_alloc_grads(tk_model *m, tk_err *err);
/* Zeroes every allocated gradient. */
tk_status tk_model_zero_grads(tk_model *m, tk_err *err);

/* Hooks around each backward stage: the head (pooler included), each
 * encoder layer from the last down, the embeddings. A stage writes the
 * gradients of parameters [p0, p1) (tk_model_param order) and of no others.
 * `before` may point those parameters' gradient tensors (tk_param.g) at
 * zeroed buffers of their shape (or allocate them, when the model holds
 * none); `after` takes what the stage wrote and puts tk_param.g back as it
 * wants it. A data-parallel trainer reduces a stage's gradients there, and
 * gradient accumulation adds a micro-batch's fresh gradients to the ones
 * before it there, so both add alike (tk_collective.h). */
typedef struct tk_grad_hooks {
    tk_status (*before)(void *ud, int p0, int p1, tk_err *err);
    tk_status (*after)(void *ud, int p0, int p1, tk_err *err);
    void *ud;
} tk_grad_hooks;
/* Installs hooks for the following tk_model_forward_backward calls (NULL:
 * none). With `lazy` = 1 the model holds no gradients of its own
 * (tk_model_alloc_grads allocates nothing): the hooks provide each stage's. */
void tk_model_set_grad_hooks(tk_model *m, const tk_grad_hooks *h, int lazy);

/* ---- steps ------------------------------------------------------------ */

/* One batch, in host memory (borrowed for the duration of the call).
 * Shapes: pooled and span: sequences are [B, T]; flatten_dense: [B, towers, T]
 * (T must equal opts.max_len). */
typedef struct tk_batch {
    int B, T;
    const int32_t *input_ids;       /* [B(*towers), T] */
    const int32_t *token_type_ids;  /* same shape, or NULL = all 0 */
    const int32_t *attention_mask;  /* same shape (1 keep, 0 pad), or NULL = all 1 */
    const int32_t *labels;          /* pooled, flatten_dense: [B]; < 0 ignored (HF's -100) */
    const int32_t *start_positions; /* span: [B] */
    const int32_t *end_positions;   /* span: [B] */
} tk_batch;

/* Logits per batch: pooled [B, num_labels]; flatten_dense [B, num_labels];
 * span [B, T, 2] (start logit, end logit per token, as qa_outputs' output). */
int64_t tk_model_n_logits(const tk_model *m, int B, int T);

/* One training micro-step: forward in train mode (dropout on), loss, then
 * backward accumulating into the gradients (allocated on first use) the
 * gradient of (loss * grad_scale) — grad_scale carries 1/accumulate and the
 * fp16 loss scale. `step` seeds dropout together with opts.seed. *loss (may
 * be NULL) gets the unscaled mean loss; logits (may be NULL, host f32 of
 * tk_model_n_logits) gets the logits. Every activation is freed before it
 * returns, so a step's peak is released. */
tk_status tk_model_forward_backward(tk_model *m, const tk_batch *b, uint64_t step, float grad_scale,
                                    float *loss, float *logits, tk_err *err);

/* Forward in eval mode: no dropout, no activation kept past its last use.
 * logits as above (may be NULL); *loss (may be NULL) is computed when the
 * batch has labels (pooled/flatten_dense) or positions (span), else 0. */
tk_status tk_model_forward_eval(tk_model *m, const tk_batch *b, float *loss, float *logits,
                                tk_err *err);

#ifdef __cplusplus
}
#endif
#endif
