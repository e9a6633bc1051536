/* model.c — BERT forward and backward composed from the tk_op_* device ops.
 *
 * Layout and habits (llm.c style): tensors are row-major, a sequence batch
 * is (B, T) with B = examples * towers, hidden states are (B*T, H). A layer
 * is a forward function that fills a struct of saved activations and a
 * backward function that consumes (and frees) them.
 *
 * What it guarantees (see tk_model.h): every tensor is allocated through the
 * device's tagged allocator in an order that depends on the options and the
 * batch shape only — never on the backend — so meta plans the real sequence;
 * a step frees all it allocated, also on error; dropout is regenerated from
 * (seed, step, layer, site), which is also how standard attention's backward
 * gets its dropout mask back without storing it (only the softmax output is
 * kept); fused attention keeps its decisions bit-packed (the op's keep mask).
 *
 * Memory choices (they show in the planner): Q, K, V are kept for
 * backward, head-split (B,NH,T,HS) for standard attention and in the
 * projections' own (B,T,NH,HS) layout for fused, whose op reads that layout
 * (no head transposes); the attention probabilities are kept once (the
 * dropped-out copy is regenerated in backward); GELU's output is recomputed
 * from its input in backward rather than kept; layers whose parameters and
 * inputs need no gradient (frozen prefix) run as in eval, keeping nothing.
 * attention: fused runs tk_op_attention_fwd/bwd, which keep only a per-row
 * log-sum-exp (B,NH,T) instead of the (B,NH,T,T) probabilities, and in
 * training with dropout their keep bits (B,NH,T,T)/8 bytes; recompute:
 * attention keeps nothing and rebuilds the probabilities chunk by chunk.
 */
#include "tk_files.h"
#include "tk_model.h"
#include "tk_host_mem.h"
#include "tk_safetensors.h"
#include "tk_tokenizer.h"
#include "tk_torchbin.h"
#include "tk_ops_spec.h" /* splitmix64, inlined in weight init */

#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define OWN_MAX 96

/* How a parameter starts under tk_model_init_random. */
typedef enum { INIT_NORMAL = 0 /* N(0, 0.02) */, INIT_ONES, INIT_ZEROS } param_init;

/* One parameter as described before anything is allocated: its leaf name
 * under the owner, shape, first values and whether weight decay skips it. */
typedef struct param_desc {
    const char *leaf;      /* "weight", "bias" */
    int ndim;
    int64_t shape[2];
    param_init init;
    int no_decay;          /* biases and LayerNorm: no weight decay (as HF) */
} param_desc;

typedef struct pslot {
    tk_param p;
    tk_tensor w, g;
    tk_tensor w16;         /* 16-bit copy for GEMMs and lookups (precision fp16/bf16, 2-D weights, linear biases) */
    char name[OWN_MAX + 16];
    char owner[OWN_MAX];
    param_init init;
    int ndim;
    int64_t shape[2];      /* the described shape (w is filled by the allocation) */
} pslot;

/* Parameter indices of one encoder layer, in allocation order. */
enum { LQW, LQB, LKW, LKB, LVW, LVB, LAOW, LAOB, LLN1W, LLN1B, LIW, LIB, LOW, LOB, LLN2W, LLN2B,
       LNP };
/* Owners of the activations one layer keeps. */
enum { OQ, OK_, OV, OSELF, OAO, OLN1, OI, OO, OLN2, NOWN };

struct tk_model {
    tk_dev *dev;
    tk_model_opts o;
    int H, NH, HS, I, L;
    int np;                /* parameters described (describe_params counts them) */
    int ps_cap;            /* slots in ps */
    pslot *ps;
    struct {               /* the embeddings' parameters */
        int word, pos, type, ln_w, ln_b;
    } emb;
    int layer0;            /* first param of layer 0; layer l starts at layer0 + l*LNP */
    int pool;              /* pooler w (-1 if no pooler) */
    int head;              /* head w, then b */
    char (*own)[NOWN][OWN_MAX]; /* per layer activation owners */
    tk_dtype adt;          /* activation and GEMM-input dtype: f32, f16 or bf16 */
    int grads;             /* gradients allocated */
    tk_grad_hooks hooks;   /* around each backward stage (tk_model_set_grad_hooks) */
    int has_hooks, lazy_grads;
    /* the card (tk_model_set_card): written beside the weights */
    char **labels;
    int n_labels;
    char *vocab_path;
    int lowercase, max_len;
};

/* A linear layer's bias: the 1-D parameter right after its module's 2-D
 * weight of as many rows (linear_fwd hands the pair to one GEMM). */
static int linear_bias(const tk_model *m, int i) {
    const pslot *s = &m->ps[i], *w = i > 0 ? &m->ps[i - 1] : NULL;
    return s->ndim == 1 && w && w->ndim == 2 && w->shape[0] == s->shape[0] && !strcmp(w->owner, s->owner);
}

/* ---- descriptions ----------------------------------------------------- */

/* Appends one parameter and returns its index. With m->ps NULL it only
 * counts (describe_params' first pass); an index past the slots is a
 * description that changed between the passes, and writes nothing. */
static int add_param(tk_model *m, const char *owner, int frozen, param_desc pd) {
    int i = m->np++;
    if (!m->ps) return i;
    assert(i < m->ps_cap && "describe_params described more parameters than it counted");
    if (i >= m->ps_cap) return i;
    pslot *s = &m->ps[i];
    snprintf(s->owner, sizeof s->owner, "%s", owner);
    snprintf(s->name, sizeof s->name, "%s.%s", owner, pd.leaf);
    s->init = pd.init;
    s->ndim = pd.ndim;
    s->shape[0] = pd.shape[0];
    s->shape[1] = pd.ndim > 1 ? pd.shape[1] : 0;
    s->p.name = s->name;
    s->p.owner = s->owner;
    s->p.w = &s->w;
    s->p.g = &s->g;
    s->p.no_decay = pd.no_decay;
    s->p.frozen = frozen;
    return i;
}

/* weight (out, in), then bias (out); returns the weight's index */
static int add_linear(tk_model *m, const char *owner, int64_t out, int64_t in, int frozen) {
    int w = add_param(m, owner, frozen, (param_desc){ .leaf = "weight", .ndim = 2, .shape = { out, in } });
    add_param(m, owner, frozen,
              (param_desc){ .leaf = "bias", .ndim = 1, .shape = { out }, .init = INIT_ZEROS, .no_decay = 1 });
    return w;
}

/* LayerNorm weight (ones), then bias (zeros); returns the weight's index */
static int add_ln(tk_model *m, const char *owner, int64_t c, int frozen) {
    int w = add_param(m, owner, frozen,
                      (param_desc){ .leaf = "weight", .ndim = 1, .shape = { c }, .init = INIT_ONES, .no_decay = 1 });
    add_param(m, owner, frozen,
              (param_desc){ .leaf = "bias", .ndim = 1, .shape = { c }, .init = INIT_ZEROS, .no_decay = 1 });
    return w;
}

/* Every parameter, in allocation order (llm.c's fill_in_parameter_sizes):
 * called once with m->ps NULL to count them, then again to fill the slots,
 * so the array's size is counted, never written by hand. */
static void describe_params(tk_model *m) {
    const tk_bert_dims *d = &m->o.dims;
    m->np = 0;
    int fe = m->o.freeze_embeddings;
    m->emb.word = add_param(m, "bert.embeddings.word_embeddings", fe,
                            (param_desc){ .leaf = "weight", .ndim = 2, .shape = { d->vocab_size, m->H } });
    m->emb.pos = add_param(m, "bert.embeddings.position_embeddings", fe,
                           (param_desc){ .leaf = "weight", .ndim = 2, .shape = { d->max_position, m->H } });
    m->emb.type = add_param(m, "bert.embeddings.token_type_embeddings", fe,
                            (param_desc){ .leaf = "weight", .ndim = 2, .shape = { d->type_vocab, m->H } });
    m->emb.ln_w = add_ln(m, "bert.embeddings.LayerNorm", m->H, fe);
    m->emb.ln_b = m->emb.ln_w + 1;
    m->layer0 = m->np;
    for (int l = 0; l < m->L; l++) {
        char b[40];
        int fz = l < m->o.freeze_layers;
        snprintf(b, sizeof b, "bert.encoder.layer.%d", l);
#define OWN(ix, suffix) snprintf(m->own[l][ix], OWN_MAX, "%s.%s", b, suffix)
        OWN(OQ, "attention.self.query");
        OWN(OK_, "attention.self.key");
        OWN(OV, "attention.self.value");
        OWN(OSELF, "attention.self");
        OWN(OAO, "attention.output.dense");
        OWN(OLN1, "attention.output.LayerNorm");
        OWN(OI, "intermediate.dense");
        OWN(OO, "output.dense");
        OWN(OLN2, "output.LayerNorm");
#undef OWN
        add_linear(m, m->own[l][OQ], m->H, m->H, fz);
        add_linear(m, m->own[l][OK_], m->H, m->H, fz);
        add_linear(m, m->own[l][OV], m->H, m->H, fz);
        add_linear(m, m->own[l][OAO], m->H, m->H, fz);
        add_ln(m, m->own[l][OLN1], m->H, fz);
        add_linear(m, m->own[l][OI], m->I, m->H, fz);
        add_linear(m, m->own[l][OO], m->H, m->I, fz);
        add_ln(m, m->own[l][OLN2], m->H, fz);
    }
    m->pool = m->o.head == TK_HEAD_POOLED ? add_linear(m, "bert.pooler.dense", m->H, m->H, 0) : -1;
    if (m->o.head == TK_HEAD_POOLED)
        m->head = add_linear(m, "classifier", m->o.num_labels, m->H, 0);
    else if (m->o.head == TK_HEAD_SPAN)
        m->head = add_linear(m, "qa_outputs", 2, m->H, 0);
    else
        m->head = add_linear(m, "classifier", m->o.num_labels, (int64_t)m->o.towers * m->o.max_len * m->H, 0);
}

static tk_status check_opts(const tk_model_opts *o, tk_err *err) {
    tk_status st = tk_bert_dims_check(&o->dims, err);
    if (st != TK_OK) return st;
    if (o->head == TK_HEAD_POOLED && o->num_labels <= 0) {
        tk_err_set(err, TK_EINVAL, "model: num_labels must be > 0 for the pooled head");
        return TK_EINVAL;
    }
    if (o->head == TK_HEAD_FLATTEN_DENSE && (o->num_labels <= 0 || o->towers <= 0 || o->max_len <= 0)) {
        tk_err_set(err, TK_EINVAL, "model: flatten_dense needs head_units > 0, towers > 0 and "
                   "max_len > 0 (got %d, %d, %d)", o->num_labels, o->towers, o->max_len);
        return TK_EINVAL;
    }
    if (o->head == TK_HEAD_FLATTEN_DENSE && o->max_len > o->dims.max_position) {
        tk_err_set(err, TK_EINVAL, "model: max_len %d exceeds max_position_embeddings %d",
                   o->max_len, o->dims.max_position);
        return TK_EINVAL;
    }
    if (o->freeze_layers < 0 || o->freeze_layers > o->dims.layers) {
        tk_err_set(err, TK_EINVAL, "model: freeze_layers %d must be in [0, %d]", o->freeze_layers,
                   o->dims.layers);
        return TK_EINVAL;
    }
    return TK_OK;
}

/* attention: fused needs the backend's fused attention op; ask it with an
 * empty call (the wrapper refuses when the backend has none), so a device
 * that cannot run the config says so at model creation, not mid-step. */
static tk_status check_backend(tk_dev *dev, const tk_model_opts *o, tk_err *err) {
    if (o->attention != TK_ATTN_FUSED) return TK_OK;
    tk_tensor z;
    memset(&z, 0, sizeof z);
    if (tk_op_attention_fwd(dev, &z, &z, NULL, &z, &z, &z, NULL, &(tk_attn){ .scale = 1.0f }) == TK_OK)
        return TK_OK;
    tk_err_set(err, TK_EINVAL, "model: attention: fused is not available here (%s)",
               tk_dev_last_err(dev)->msg);
    return TK_EINVAL;
}

tk_model *tk_model_new(tk_dev *dev, const tk_model_opts *opts, tk_err *err) {
    if (check_opts(opts, err) != TK_OK || check_backend(dev, opts, err) != TK_OK) return NULL;
    tk_model *m = tk_calloc(1, sizeof *m);
    if (!m) {
        tk_err_set(err, TK_ENOMEM, "model: out of host memory");
        return NULL;
    }
    m->dev = dev;
    m->o = *opts;
    if (m->o.head == TK_HEAD_SPAN) m->o.num_labels = 2;
    if (m->o.head != TK_HEAD_FLATTEN_DENSE) m->o.towers = 1;
    const tk_bert_dims *d = &m->o.dims;
    m->H = d->hidden;
    m->NH = d->heads;
    m->HS = d->hidden / d->heads;
    m->I = d->intermediate;
    m->L = d->layers;
    m->own = tk_calloc((size_t)m->L, sizeof *m->own);
    if (!m->own) {
        tk_err_set(err, TK_ENOMEM, "model: out of host memory");
        tk_model_destroy(&m);
        return NULL;
    }
    describe_params(m); /* counts */
    m->ps_cap = m->np;
    m->ps = tk_calloc((size_t)m->ps_cap, sizeof *m->ps);
    if (!m->ps) {
        m->np = 0;
        tk_err_set(err, TK_ENOMEM, "model: out of host memory");
        tk_model_destroy(&m);
        return NULL;
    }
    describe_params(m); /* fills */
    for (int i = 0; i < m->np; i++) {
        pslot *s = &m->ps[i];
        if (tk_tensor_alloc(dev, &s->w, TK_F32, s->ndim, s->shape, TK_CAT_PARAM, s->owner, err) !=
            TK_OK) {
            tk_model_destroy(&m);
            return NULL;
        }
    }
    /* Mixed precision: f32 masters (what the optimizer updates and
     * checkpoints hold) plus a 16-bit copy of every matrix and of every
     * linear layer's bias, refreshed at the start of each step: cuBLASLt's
     * bias epilogue takes a bias of the output's type (an f32 bias with a
     * 16-bit output may be declined, and its fallback costs a pass over the
     * output; issue 43). LayerNorm stays f32 (its ops take it). */
    m->adt = m->o.precision == TK_PREC_FP16 ? TK_F16 : m->o.precision == TK_PREC_BF16 ? TK_BF16 : TK_F32;
    for (int i = 0; m->adt != TK_F32 && i < m->np; i++) {
        pslot *s = &m->ps[i];
        if ((s->ndim == 2 || linear_bias(m, i)) && tk_tensor_alloc(dev, &s->w16, m->adt, s->ndim, s->shape, TK_CAT_PARAM, s->owner,
                                            err) != TK_OK) {
            tk_model_destroy(&m);
            return NULL;
        }
    }
    return m;
}

void tk_model_destroy(tk_model **pm) {
    if (!pm || !*pm) return;
    tk_model *m = *pm;
    /* Free in reverse order of allocation, gradients (allocated later) first. */
    for (int i = m->np - 1; i >= 0 && m->ps; i--) tk_tensor_free(m->dev, &m->ps[i].g);
    for (int i = m->np - 1; i >= 0 && m->ps; i--) tk_tensor_free(m->dev, &m->ps[i].w16);
    for (int i = m->np - 1; i >= 0 && m->ps; i--) tk_tensor_free(m->dev, &m->ps[i].w);
    free(m->ps);
    free(m->own);
    for (int i = 0; i < m->n_labels; i++) free(m->labels[i]);
    free(m->labels);
    free(m->vocab_path);
    free(m);
    *pm = NULL;
}

tk_status tk_model_set_card(tk_model *m, const tk_model_card *c, tk_err *err) {
    for (int i = 0; i < m->n_labels; i++) free(m->labels[i]);
    free(m->labels);
    free(m->vocab_path);
    m->labels = NULL;
    m->vocab_path = NULL;
    m->n_labels = 0;
    int ok = 1;
    if (c->n_labels > 0 && c->labels) {
        m->labels = tk_calloc((size_t)c->n_labels, sizeof *m->labels);
        ok = m->labels != NULL;
        for (int i = 0; ok && i < c->n_labels; i++) ok = (m->labels[i] = tk_strdup(c->labels[i] ? c->labels[i] : "")) != NULL;
        m->n_labels = m->labels ? c->n_labels : 0;
    }
    if (ok && c->vocab_path) ok = (m->vocab_path = tk_strdup(c->vocab_path)) != NULL;
    m->lowercase = c->lowercase;
    m->max_len = c->max_len;
    if (!ok) {
        tk_err_set(err, TK_ENOMEM, "model: out of host memory for its card");
        return TK_ENOMEM;
    }
    return TK_OK;
}

/* The tokenizer files transformers' AutoTokenizer reads, the set
 * transformers 4.40 saves (5.x reads it too, to the same ids): vocab.txt
 * and tokenizer.json written from the run's tokenizer (read again from the
 * vocab.txt or tokenizer.json it came from), tokenizer_config.json that
 * agrees with its normalizer (transformers rebuilds the normalizer when
 * they differ), and special_tokens_map.json. */
static tk_status save_tokenizer(const tk_model *m, const char *dir, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    char path[TK_PATH_MAX + 64];
    tk_tokenizer_opts to = {.lowercase = m->lowercase >= 0 ? m->lowercase : -1, .strip_accents = -1};
    tk_tokenizer *tok = tk_tokenizer_new(m->vocab_path, &to, err);
    if (!tok) return err->status;
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    tk_status st = tk_tokenizer_write_vocab(tok, path, err);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (st == TK_OK) st = tk_tokenizer_write_json(tok, path, err);
    tk_tokenizer_opts norm = tk_tokenizer_normalizer(tok);
    tk_tokenizer_destroy(&tok);
    static const char *const special[][2] = {{"cls_token", "[CLS]"}, {"mask_token", "[MASK]"}, {"pad_token", "[PAD]"},
                                             {"sep_token", "[SEP]"}, {"unk_token", "[UNK]"}};
    json_t *map = json_object(), *tc = json_object();
    for (int i = 0; i < 5; i++) {
        json_object_set_new(map, special[i][0], json_string(special[i][1]));
        json_object_set_new(tc, special[i][0], json_string(special[i][1]));
    }
    json_object_set_new(tc, "tokenizer_class", json_string("BertTokenizer"));
    json_object_set_new(tc, "do_lower_case", json_boolean(norm.lowercase));
    json_object_set_new(tc, "strip_accents",
                        norm.strip_accents == norm.lowercase ? json_null() : json_boolean(norm.strip_accents));
    json_object_set_new(tc, "tokenize_chinese_chars", json_boolean(!norm.keep_cjk));
    json_object_set_new(tc, "clean_up_tokenization_spaces", json_true());
    json_object_set_new(tc, "model_max_length",
                        json_integer(m->max_len > 0 ? m->max_len : m->o.dims.max_position));
    const char *names[2] = {"special_tokens_map.json", "tokenizer_config.json"};
    json_t *docs[2] = {map, tc};
    for (int i = 0; i < 2 && st == TK_OK; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        st = tk_write_json_atomic(path, docs[i], JSON_INDENT(2) | JSON_SORT_KEYS, err);
    }
    json_decref(map);
    json_decref(tc);
    return st;
}

const tk_model_opts *tk_model_opts_of(const tk_model *m) { return &m->o; }
tk_dev *tk_model_dev(const tk_model *m) { return m->dev; }
int tk_model_n_params(const tk_model *m) { return m->np; }
const tk_param *tk_model_param(const tk_model *m, int i) {
    return (i >= 0 && i < m->np) ? &m->ps[i].p : NULL;
}
const tk_param *tk_model_param_find(const tk_model *m, const char *name) {
    for (int i = 0; i < m->np; i++)
        if (strcmp(m->ps[i].name, name) == 0) return &m->ps[i].p;
    return NULL;
}
int64_t tk_model_n_weights(const tk_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m->np; i++) n += tk_tensor_numel(&m->ps[i].w);
    return n;
}
int64_t tk_model_n_trainable(const tk_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m->np; i++)
        if (!m->ps[i].p.frozen) n += tk_tensor_numel(&m->ps[i].w);
    return n;
}

int64_t tk_model_n_logits(const tk_model *m, int B, int T) {
    return m->o.head == TK_HEAD_SPAN ? (int64_t)B * T * 2 : (int64_t)B * m->o.num_labels;
}

void tk_model_set_grad_hooks(tk_model *m, const tk_grad_hooks *h, int lazy) {
    m->has_hooks = h != NULL;
    m->lazy_grads = h && lazy;
    if (h) m->hooks = *h;
}

tk_status tk_model_alloc_grads(tk_model *m, tk_err *err) {
    if (m->grads || m->lazy_grads) return TK_OK;
    for (int i = 0; i < m->np; i++) {
        pslot *s = &m->ps[i];
        if (s->p.frozen) continue;
        tk_status st = tk_tensor_alloc(m->dev, &s->g, TK_F32, s->ndim, s->shape, TK_CAT_GRAD,
                                       s->owner, err);
        if (st != TK_OK) {
            for (int j = i; j >= 0; j--) tk_tensor_free(m->dev, &m->ps[j].g);
            return st;
        }
    }
    tk_status st = tk_model_zero_grads(m, err);
    if (st != TK_OK) {
        for (int j = m->np - 1; j >= 0; j--) tk_tensor_free(m->dev, &m->ps[j].g);
        return st;
    }
    m->grads = 1;
    return TK_OK;
}

/* Every allocated gradient zeroed by one fill over the list (one launch on cuda). */
tk_status tk_model_zero_grads(tk_model *m, tk_err *err) {
    tk_tensor **gs = tk_malloc((size_t)(m->np ? m->np : 1) * sizeof *gs);
    if (!gs) return tk_err_nomem(err, "model: zeroing the gradients");
    int n = 0;
    for (int i = 0; i < m->np; i++)
        if (m->ps[i].g.ndim) gs[n++] = &m->ps[i].g; /* not frozen, and allocated */
    tk_status st = tk_op_fill_many(m->dev, gs, n, 0.0f);
    free(gs);
    if (st != TK_OK) {
        const tk_err *why = tk_dev_last_err(m->dev);
        tk_err_set(err, st, "model: cannot zero the gradients (%s)", why ? why->msg : tk_status_name(st));
    }
    return st;
}

/* ---- weights ---------------------------------------------------------- */

/* Fills host buffer with the init of slot s: N(0, 0.02) by Box-Muller from a
 * generator keyed by (seed, parameter index), so a parameter's values do not
 * depend on which other parameters exist. */
static void init_values(const pslot *s, int idx, uint64_t seed, float *buf, int64_t n) {
    if (s->init == INIT_ONES || s->init == INIT_ZEROS) {
        float v = s->init == INIT_ONES ? 1.0f : 0.0f;
        for (int64_t i = 0; i < n; i++) buf[i] = v;
        return;
    }
    uint64_t st = seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(idx + 1));
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = ((tk_spec_splitmix64(&st) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
        double u2 = (tk_spec_splitmix64(&st) >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1)) * 0.02;
        buf[i] = (float)(r * cos(2 * M_PI * u2));
        if (i + 1 < n) buf[i + 1] = (float)(r * sin(2 * M_PI * u2));
    }
}

static tk_status init_slot(tk_model *m, int i, uint64_t seed, tk_err *err) {
    pslot *s = &m->ps[i];
    int64_t n = tk_tensor_numel(&s->w);
    float *buf = tk_malloc((size_t)(n ? n : 1) * sizeof *buf);
    if (!buf) {
        tk_err_set(err, TK_ENOMEM, "model: out of host memory initialising %s", s->name);
        return TK_ENOMEM;
    }
    init_values(s, i, seed, buf, n);
    tk_status st = tk_tensor_write_f32(m->dev, &s->w, buf, err);
    free(buf);
    return st;
}

tk_status tk_model_init_random(tk_model *m, uint64_t seed, tk_err *err) {
    /* Meta holds no data: skip the arithmetic (allocations are unaffected). */
    if (tk_dev_kind_of(m->dev) == TK_DEV_META) return TK_OK;
    for (int i = 0; i < m->np; i++) {
        tk_status st = init_slot(m, i, seed, err);
        if (st != TK_OK) return st;
    }
    return TK_OK;
}


static void shape_str(char *b, size_t n, int nd, const int64_t *sh) {
    size_t k = (size_t)snprintf(b, n, "[");
    for (int i = 0; i < nd && k < n; i++)
        k += (size_t)snprintf(b + k, n - k, "%s%lld", i ? ", " : "", (long long)sh[i]);
    if (k < n) snprintf(b + k, n - k, "]");
}

/* A list of tensor names for a person: complete, with names of one module
 * grouped ("cls.predictions.* (6 tensors)") when three or more share it. A
 * module is the name up to its second dot, or its fourth for
 * "x.encoder.layer.N.*", so each encoder layer is its own group. New string
 * (free()), or NULL when n is 0 or memory runs out. */
static size_t group_key(const char *name) {
    const char *p = name;
    int dots = 0, want = 2;
    if (!strncmp(name, "bert.encoder.layer.", 19) || !strncmp(name, "encoder.layer.", 14))
        want = name[0] == 'b' ? 4 : 3;
    for (; *p; p++)
        if (*p == '.' && ++dots == want) return (size_t)(p - name);
    return strlen(name);
}

char *tk_names_grouped(const char *const *names, int n) {
    if (n <= 0) return NULL;
    size_t cap = 64;
    for (int i = 0; i < n; i++) cap += strlen(names[i]) + 24;
    char *out = tk_malloc(cap), *done = tk_calloc((size_t)n, 1);
    if (!out || !done) {
        free(out);
        free(done);
        return NULL;
    }
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        size_t kl = group_key(names[i]);
        int count = 0;
        for (int j = i; j < n; j++)
            if (!done[j] && group_key(names[j]) == kl && !strncmp(names[j], names[i], kl)) count++;
        const char *sep = k ? ", " : "";
        if (count >= 3 && kl < strlen(names[i])) {
            k += (size_t)snprintf(out + k, cap - k, "%s%.*s.* (%d tensors)", sep, (int)kl, names[i], count);
            for (int j = i; j < n; j++)
                if (!done[j] && group_key(names[j]) == kl && !strncmp(names[j], names[i], kl)) done[j] = 1;
        } else {
            k += (size_t)snprintf(out + k, cap - k, "%s%s", sep, names[i]);
            done[i] = 1;
        }
    }
    free(done);
    return out;
}

void tk_load_report_clear(tk_load_report *r) {
    if (!r) return;
    free(r->new_names);
    free(r->unused_names);
    memset(r, 0, sizeof *r);
}

/* Finds the checkpoint entry for a parameter: with or without "bert.", and
 * the old LayerNorm.gamma/beta names. */
static const tk_st_entry *find_entry(const tk_st_file *f, const char *name) {
    const tk_st_entry *e = tk_st_find(f, name);
    const char *bare = strncmp(name, "bert.", 5) == 0 ? name + 5 : NULL;
    if (!e && bare) e = tk_st_find(f, bare);
    size_t n = strlen(name);
    if (!e && strstr(name, "LayerNorm.") && n > 7) {
        char alt[OWN_MAX + 16];
        int isw = strcmp(name + n - 7, ".weight") == 0;
        snprintf(alt, sizeof alt, "%.*s.%s", (int)(n - (isw ? 7 : 5)), name, isw ? "gamma" : "beta");
        e = tk_st_find(f, alt);
        if (!e && bare) e = tk_st_find(f, alt + 5);
    }
    return e;
}

tk_status tk_model_load_hf(tk_model *m, const char *path, tk_load_report *rep, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    char file[TK_PATH_MAX + 64];
    tk_load_report_clear(rep);
    tk_st_file *f = tk_checkpoint_open(path, file, sizeof file, err);
    if (!f) return err->status;
    tk_status st = TK_OK;
    float *buf = NULL;
    size_t bufn = 0;
    int is_meta = tk_dev_kind_of(m->dev) == TK_DEV_META;
    int nst = tk_st_count(f);
    char *used = tk_calloc((size_t)nst + 1, 1);
    /* names for the lists: missing required, newly initialised, unused */
    const char **missing = tk_calloc((size_t)m->np + 1, sizeof *missing);
    const char **fresh = tk_calloc((size_t)m->np + 1, sizeof *fresh);
    const char **unused = tk_calloc((size_t)nst + 1, sizeof *unused);
    int n_missing = 0, n_fresh = 0, n_unused = 0;
    if (!used || !missing || !fresh || !unused) {
        tk_err_set(err, TK_ENOMEM, "model: out of host memory");
        st = TK_ENOMEM;
    }
    /* Pass 1: check every name, shape and dtype before touching weights. */
    for (int i = 0; i < m->np && st == TK_OK; i++) {
        pslot *s = &m->ps[i];
        const tk_st_entry *e = find_entry(f, s->name);
        int optional = i >= (m->pool >= 0 ? m->pool : m->head);
        if (!e) {
            if (optional) fresh[n_fresh++] = s->name;
            else missing[n_missing++] = s->name;
            continue;
        }
        used[e - tk_st_at(f, 0)] = 1;
        int same = e->ndim == s->w.ndim;
        for (int k = 0; same && k < e->ndim; k++) same = e->shape[k] == s->w.shape[k];
        if (!same) {
            char want[64], got[64];
            shape_str(want, sizeof want, s->w.ndim, s->w.shape);
            shape_str(got, sizeof got, e->ndim, e->shape);
            tk_err_set(err, TK_EFORMAT, "%s: tensor '%s' has shape %s, the model expects %s%s", file,
                       e->name, got, want,
                       i >= m->head ? " (a head for another number of labels? set num_labels to "
                                      "match, or remove the head's tensors to start it fresh)"
                                    : " (config.json does not match the weights?)");
            st = TK_EFORMAT;
        } else if (e->dtype != TK_ST_F32 && e->dtype != TK_ST_F16 && e->dtype != TK_ST_BF16) {
            tk_err_set(err, TK_EFORMAT, "%s: tensor '%s' has dtype %s, expected F32, F16 or BF16", file,
                       e->name, tk_st_dtype_name(e->dtype));
            st = TK_EFORMAT;
        }
    }
    if (st == TK_OK && n_missing) {
        char *list = tk_names_grouped(missing, n_missing);
        tk_err_set(err, TK_EFORMAT, "%s: %d encoder tensor%s missing: %s", file, n_missing,
                   n_missing == 1 ? " is" : "s are", list ? list : missing[0]);
        free(list);
        st = TK_EFORMAT;
    }
    /* Pass 2: copy (or initialise what is optional and absent). */
    for (int i = 0; i < m->np && st == TK_OK; i++) {
        pslot *s = &m->ps[i];
        const tk_st_entry *e = find_entry(f, s->name);
        if (!e) {
            if (!is_meta) st = init_slot(m, i, m->o.seed, err);
            continue;
        }
        if (is_meta) continue;
        size_t n = (size_t)tk_st_numel(e);
        if (n > bufn) {
            free(buf);
            buf = tk_malloc(n * sizeof *buf);
            bufn = buf ? n : 0;
            if (!buf) {
                tk_err_set(err, TK_ENOMEM, "model: out of host memory loading %s", e->name);
                st = TK_ENOMEM;
                break;
            }
        }
        st = tk_st_read_f32(f, e, buf, err);
        if (st == TK_OK) st = tk_tensor_write_f32(m->dev, &s->w, buf, err);
    }
    /* What the checkpoint has that the model does not use (an MLM head, a
     * head of another task): ignored, as HF does, and reported. */
    for (int i = 0; st == TK_OK && i < nst; i++) {
        const tk_st_entry *e = tk_st_at(f, i);
        if (!used[i] && !strstr(e->name, "position_ids")) unused[n_unused++] = e->name;
    }
    if (st == TK_OK && rep) {
        rep->n_new = n_fresh;
        rep->n_unused = n_unused;
        rep->new_names = tk_names_grouped(fresh, n_fresh);
        rep->unused_names = tk_names_grouped(unused, n_unused);
    }
    free(missing);
    free(fresh);
    free(unused);
    free(used);
    free(buf);
    tk_st_close(&f);
    return st;
}

/* An HF folder with weights in any form it ships them, or such a file. */
static int has_weights(const char *model) {
    char file[TK_PATH_MAX + 64];
    return tk_checkpoint_find(model, file, sizeof file);
}

tk_model *tk_model_from_config(tk_dev *d, const tk_config *c, tk_load_report *rep, int *random_init,
                               tk_err *err) {
    tk_load_report_clear(rep);
    if (random_init) *random_init = 0;
    tk_model_opts mo;
    if (tk_model_opts_from_config(&mo, c, err) != TK_OK) return NULL;
    tk_model *m = tk_model_new(d, &mo, err);
    if (!m) return NULL;
    tk_status st;
    if (c->init == TK_INIT_RANDOM) {
        st = tk_model_init_random(m, c->seed, err);
        if (random_init) *random_init = 1;
    } else if (has_weights(c->model)) {
        st = tk_model_load_hf(m, c->model, rep, err);
    } else {
        /* Nobody fine-tunes from random weights by accident: only init:
         * random asks for them. */
        struct stat sb;
        st = TK_EINVAL;
        if (stat(c->model, &sb) == 0 && S_ISDIR(sb.st_mode))
            tk_err_set(err, st,
                       "model: %s has no weights (model.safetensors, pytorch_model.bin, or a sharded index of "
                       "either): set init: random to train this shape from random weights, or point model: at a "
                       "folder with weights",
                       c->model);
        else
            tk_err_set(err, st,
                       "model: %s names no weights here (a preset or hub id is fetched from the hub by txk train / "
                       "%%%%txtrain); set init: random to train this shape from random weights",
                       c->model);
    }
    if (st != TK_OK) {
        tk_load_report_clear(rep);
        tk_model_destroy(&m);
    }
    return m;
}

tk_status tk_model_save_hf(tk_model *m, const char *dir, tk_err *err) {
    if (tk_mkdirs(dir, err) != TK_OK) return TK_EIO;
    tk_st_writer *w = tk_st_writer_new();
    float **bufs = tk_calloc((size_t)m->np, sizeof *bufs);
    tk_status st = TK_OK;
    if (!w || !bufs) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", dir);
        st = TK_ENOMEM;
    }
    for (int i = 0; i < m->np && st == TK_OK; i++) {
        pslot *s = &m->ps[i];
        int64_t n = tk_tensor_numel(&s->w);
        bufs[i] = tk_calloc((size_t)(n ? n : 1), sizeof(float));
        if (!bufs[i]) {
            tk_err_set(err, TK_ENOMEM, "%s: out of host memory", dir);
            st = TK_ENOMEM;
            break;
        }
        st = tk_tensor_read_f32(m->dev, &s->w, bufs[i], err);
        if (st == TK_OK) st = tk_st_writer_add(w, s->name, TK_ST_F32, s->w.ndim, s->w.shape, bufs[i], err);
    }
    if (st == TK_OK) st = tk_st_writer_metadata(w, "format", "pt", err);
    char path[TK_PATH_MAX + 32];
    if (st == TK_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st = tk_st_writer_write(w, path, err);
    }
    if (st == TK_OK) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        st = tk_bert_dims_write_config_json(path, &m->o.dims, m->o.head, m->o.num_labels,
                                            m->n_labels == m->o.num_labels ? (const char *const *)m->labels : NULL,
                                            err);
    }
    if (st == TK_OK && m->vocab_path) st = save_tokenizer(m, dir, err);
    for (int i = 0; bufs && i < m->np; i++) free(bufs[i]);
    free(bufs);
    tk_st_writer_destroy(&w);
    return st;
}

/* ---- one step ----------------------------------------------------------- */

/* Activations one encoder layer keeps for backward (all tk_tensor, so the
 * cleanup can walk them as an array). */
typedef struct lacts {
    tk_tensor qh, kh, vh;     /* (Bs,NH,T,HS) */
    tk_tensor probs;          /* (Bs,NH,T,T) softmax output, before dropout */
    tk_tensor lse;            /* fused: (Bs,NH,T) f32 log-sum-exp per query row */
    tk_tensor keepm;          /* fused, dropout: the bit-packed keep mask (tk_attn_keep_bytes) */
    tk_tensor ctx;            /* (N,H) merged context */
    tk_tensor r1, mean1, rstd1, a1; /* attention residual sum, its LN stats and output */
    tk_tensor u;              /* (N,I) intermediate before GELU */
    tk_tensor g;              /* (N,I) after GELU: scratch, recomputed in backward */
    tk_tensor r2, mean2, rstd2, out; /* FFN residual sum, LN stats, layer output */
} lacts;
#define LACTS_N ((int)(sizeof(lacts) / sizeof(tk_tensor)))

/* Step-level tensors: inputs, embeddings, head, backward scratch. */
typedef struct stens {
    tk_tensor ids, tt, pos, mask, cidx, labels, starts, ends, ones;
    tk_tensor ex, emean, erstd, h0;
    tk_tensor cls, pooled, pd, logits, losses;
    tk_tensor dlogits, dpd, dcls, dh, dx;
    tk_tensor dr, dtmp, dbig, probs_d, dvh, dprobs, dqh, dkh, dbuf, tmp, ctxh, pchunk;
    tk_tensor dbias, lnscr;   /* a linear's bias-gradient scratch, a LayerNorm backward's partial sums */
    tk_tensor gword, gpos, gtype, escr; /* the embedding backward's row groups and chunk sums */
} stens;
#define STENS_N ((int)(sizeof(stens) / sizeof(tk_tensor)))

typedef struct step {
    tk_model *m;
    tk_dev *d;
    tk_err *err;
    int train;                /* dropout on; activations kept for backward */
    tk_dtype adt;             /* the model's activation dtype */
    int B, Bs, T;
    int64_t N;                /* Bs * T rows */
    uint64_t seed;            /* dropout seed of this step */
    stens s;
    lacts *la;                /* [L] */
    int nvalid, nvalid2;      /* non-ignored rows of the loss(es) */
    int32_t *egroups;         /* host: the embedding backward's three row groupings (inputs()) */
} step;

static void step_cleanup(step *S) {
    /* Reverse order of typical allocation keeps the cache tidy. */
    tk_tensor *st = (tk_tensor *)&S->s;
    for (int i = STENS_N - 1; i >= 0; i--) tk_tensor_free(S->d, &st[i]);
    for (int l = S->m->L - 1; S->la && l >= 0; l--) {
        tk_tensor *t = (tk_tensor *)&S->la[l];
        for (int i = LACTS_N - 1; i >= 0; i--) tk_tensor_free(S->d, &t[i]);
    }
    free(S->la);
    S->la = NULL;
    free(S->egroups);
    S->egroups = NULL;
}

#define TRY(x) do { tk_status _st = (x); if (_st != TK_OK) return fail(S, _st, #x, __LINE__); } while (0)

static tk_status fail(step *S, tk_status st, const char *what, int line) {
    if (S->err && S->err->status == TK_OK) {
        if (st == TK_EOOM) {
            const tk_oom *o = tk_dev_last_oom(S->d);
            char a[32];
            tk_err_set(S->err, st, "out of memory allocating %s for %s (%s)",
                       o ? tk_format_bytes(o->requested, a, sizeof a) : "?",
                       o ? o->owner_name : "?", o ? tk_cat_name(o->tag.cat) : "?");
        } else {
            tk_err_set(S->err, st, "model step failed (%s) in %s [model.c:%d]", tk_status_name(st),
                       what, line);
        }
    }
    return st;
}

static tk_status al(step *S, tk_tensor *t, tk_dtype dt, int nd, int64_t a, int64_t b, int64_t c,
                    int64_t d, tk_cat cat, const char *owner) {
    int64_t sh[4] = {a, b, c, d};
    return tk_tensor_alloc(S->d, t, dt, nd, sh, cat, owner, S->err);
}
static tk_status alf(step *S, tk_tensor *t, int64_t rows, int64_t cols, tk_cat cat, const char *owner) {
    return al(S, t, S->adt, 2, rows, cols, 0, 0, cat, owner);
}

static void fr(step *S, tk_tensor *t) { tk_tensor_free(S->d, t); }

static const tk_tensor *PW(const step *S, int i) { return &S->m->ps[i].w; }
/* The weight (or a linear layer's bias) as GEMMs and lookups read it: the
 * 16-bit copy when there is one. */
static const tk_tensor *PWc(const step *S, int i) {
    const pslot *p = &S->m->ps[i];
    return p->w16.ndim ? &p->w16 : &p->w;
}
static tk_tensor *PG(const step *S, int i) {
    pslot *p = &S->m->ps[i];
    return p->p.frozen ? NULL : &p->g;
}

/* Every GEMM of the step: g with the model's TF32 choice. */
static tk_status mm(step *S, tk_tensor *C, const tk_tensor *A, const tk_tensor *B, const tk_tensor *bias,
                    tk_gemm g) {
    g.tf32 = S->m->o.tf32;
    return tk_op_gemm(S->d, C, A, B, bias, &g);
}

/* out (rows,O) = in (rows,I) @ W(O,I)^T + b (the bias in the GEMM's epilogue on cuda) */
static tk_status linear_fwd(step *S, tk_tensor *out, const tk_tensor *in, int wi, int64_t rows,
                            int64_t O, int64_t I) {
    return mm(S, out, in, PWc(S, wi), PWc(S, wi + 1), (tk_gemm){ .m = rows, .n = O, .k = I, .trans_b = 1, .batch = 1, .alpha = 1.0f });
}

/* dW += dout^T @ in, db += sum dout (in the same GEMM: its bias-gradient
 * epilogue, with an f32 scratch of O the step allocates), and din (=, or +=
 * when acc) dout @ W. din NULL: the input needs no gradient. */
static tk_status linear_bwd(step *S, tk_tensor *din, const tk_tensor *dout, const tk_tensor *in, int wi,
                            int64_t rows, int64_t O, int64_t I, int acc) {
    tk_tensor *dW = PG(S, wi), *db = PG(S, wi + 1);
    tk_status st = TK_OK;
    if (dW && db) st = al(S, &S->s.dbias, TK_F32, 1, O, 0, 0, 0, TK_CAT_TEMP, S->m->ps[wi].owner);
    if (st == TK_OK && dW)
        st = mm(S, dW, dout, in, NULL, (tk_gemm){ .m = O, .n = I, .k = rows, .trans_a = 1, .batch = 1, .alpha = 1.0f, .beta = 1.0f, .bgrad = db, .bgrad_tmp = db ? &S->s.dbias : NULL });
    else if (st == TK_OK && db)
        st = tk_op_bias_grad(S->d, db, dout, rows, O);
    fr(S, &S->s.dbias);
    if (st == TK_OK && din)
        st = mm(S, din, dout, PWc(S, wi), NULL, (tk_gemm){ .m = rows, .n = I, .k = O, .batch = 1, .alpha = 1.0f, .beta = acc ? 1.0f : 0.0f });
    return st;
}

/* Dropout offsets: layer (embeddings -1, head L) and site select disjoint
 * ranges of the counter, so masks never repeat within a step. */
static uint64_t doff(int layer, int site) {
    return ((uint64_t)(layer + 2) << 48) | ((uint64_t)site << 44);
}
enum { SITE_EMB, SITE_PROBS, SITE_ATTN_OUT, SITE_FFN_OUT, SITE_HEAD };

/* Does any parameter at or below layer l (embeddings = -1) take a gradient?
 * Layers >= freeze_layers are trainable. */
static int grads_below(const tk_model *m, int l) {
    return !m->o.freeze_embeddings || l >= m->o.freeze_layers;
}
/* Does layer l's backward have to run (own params trainable, or something
 * below needs the input gradient)? */
static int layer_backward(const tk_model *m, int l) {
    return l >= m->o.freeze_layers || grads_below(m, l - 1);
}

static tk_status embeddings_fwd(step *S, const tk_batch *b, int keep) {
    tk_model *m = S->m;
    const int64_t N = S->N, H = m->H;
    const char *own = "bert.embeddings.LayerNorm";
    tk_cat c = keep ? TK_CAT_ACT : TK_CAT_TEMP;
    stens *s = &S->s;
    TRY(alf(S, &s->ex, N, H, c, "bert.embeddings.word_embeddings"));
    TRY(tk_op_embed_fwd(S->d, &s->ex, &s->ids, PWc(S, m->emb.word), N, H));
    TRY(alf(S, &s->tmp, N, H, TK_CAT_TEMP, "bert.embeddings.position_embeddings"));
    TRY(tk_op_embed_fwd(S->d, &s->tmp, &s->pos, PWc(S, m->emb.pos), N, H));
    TRY(tk_op_add(S->d, &s->ex, &s->ex, &s->tmp, N * H));
    TRY(tk_op_embed_fwd(S->d, &s->tmp, &s->tt, PWc(S, m->emb.type), N, H));
    TRY(tk_op_add(S->d, &s->ex, &s->ex, &s->tmp, N * H));
    fr(S, &s->tmp);
    TRY(al(S, &s->emean, TK_F32, 1, N, 0, 0, 0, c, own));
    TRY(al(S, &s->erstd, TK_F32, 1, N, 0, 0, 0, c, own));
    TRY(alf(S, &s->h0, N, H, TK_CAT_ACT, own));
    TRY(tk_op_layernorm_fwd(S->d, &s->h0, &s->emean, &s->erstd, &s->ex, PW(S, m->emb.ln_w),
                            PW(S, m->emb.ln_b), N, H, m->o.dims.layer_norm_eps));
    if (!keep) {
        fr(S, &s->erstd);
        fr(S, &s->emean);
        fr(S, &s->ex);
    }
    float p = m->o.dims.hidden_dropout;
    if (S->train && p > 0)
        TRY(tk_op_dropout_fwd(S->d, &s->h0, NULL, &s->h0, N * H, p, S->seed, doff(-1, SITE_EMB)));
    (void)b;
    return TK_OK;
}

/* attention: fused — the fused op, no (T,T) matrix in this file's hands. */
static int fused(const tk_model *m) { return m->o.attention == TK_ATTN_FUSED; }

/* Whether backward finds the attention probabilities kept (standard), or
 * rebuilds them from Q and K (recompute: attention, fused attention). */
static int keeps_probs(const tk_model *m) {
    return m->o.attention == TK_ATTN_STANDARD && m->o.recompute != TK_RECOMPUTE_ATTENTION;
}

/* Sequences per attention chunk: all of them when the probabilities are
 * kept, else (recompute: attention) as many as keep one chunk's (NH,T,T)
 * scores within attn_chunk_bytes (default 4 MiB; at least one sequence).
 * Depends on shapes only, so meta plans the same. */
static int64_t attn_chunk(const step *S) {
    if (keeps_probs(S->m)) return S->Bs;
    size_t budget = S->m->o.attn_chunk_bytes ? S->m->o.attn_chunk_bytes : (size_t)4 << 20;
    int64_t per = (int64_t)S->m->NH * S->T * S->T * 4, cs = (int64_t)budget / per;
    return cs < 1 ? 1 : cs > S->Bs ? S->Bs : cs;
}

/* P (nb sequences from b0, laid out (nb,NH,T,T)) = softmax(Q K^T / sqrt(HS)
 * + mask), the softmax in place over the scores, and in the same pass PD =
 * dropout(P) at the step's offset `off` when p > 0 (PD NULL otherwise). */
static tk_status attn_probs(step *S, lacts *A, tk_tensor *P, tk_tensor *PD, int64_t b0, int64_t nb, float p,
                            uint64_t off) {
    const int64_t T = S->T, NH = S->m->NH, HS = S->m->HS, PH = NH * T * HS;
    tk_tensor Q = tk_tensor_view(&A->qh, b0 * PH, nb * PH), K = tk_tensor_view(&A->kh, b0 * PH, nb * PH);
    tk_tensor mask = tk_tensor_view(&S->s.mask, b0 * T, nb * T);
    TRY(mm(S, P, &Q, &K, NULL, (tk_gemm){ .m = T, .n = T, .k = HS, .trans_b = 1, .batch = nb * NH, .stride_a = T * HS, .stride_b = T * HS, .stride_c = T * T, .alpha = 1.0f }));
    TRY(tk_op_softmax_dropout_fwd(S->d, P, p > 0 ? PD : NULL, P, &mask, nb, NH, T, 1.0f / sqrtf((float)HS), p,
                                  S->seed, off));
    return TK_OK;
}

/* The fused attention op's shape for layer l: Q, K, V, their gradients,
 * the context and its gradient all (Bs,T,NH,HS), rows H apart. */
static tk_attn fused_shape(const step *S, int l) {
    const tk_model *m = S->m;
    return (tk_attn){ .B = S->Bs, .NH = m->NH, .T = S->T, .HS = m->HS, .ld = m->H,
                      .scale = 1.0f / sqrtf((float)m->HS), .p = S->train ? m->o.dims.attn_dropout : 0.0f,
                      .seed = S->seed, .offset = doff(l, SITE_PROBS) };
}

/* One encoder layer: A->out from in (N,H). keep: save for backward (else free
 * each activation after its last use). free_in: free `in` after its last use
 * (eval; not when recompute keeps it as the layer's checkpoint). */
static tk_status layer_fwd(step *S, int l, tk_tensor *in, int keep, int free_in) {
    tk_model *m = S->m;
    lacts *A = &S->la[l];
    stens *s = &S->s;
    const int64_t N = S->N, H = m->H, I = m->I, Bs = S->Bs, T = S->T, NH = m->NH, HS = m->HS;
    const int w = m->layer0 + l * LNP;
    char (*own)[OWN_MAX] = m->own[l];
    const float ph = S->train ? m->o.dims.hidden_dropout : 0.0f;
    const float pa = S->train ? m->o.dims.attn_dropout : 0.0f;
    const tk_cat ca = keep ? TK_CAT_ACT : TK_CAT_TEMP;

    /* Q, K, V. fused: each linear writes its (Bs,T,NH,HS) tensor, the
     * layout the fused op reads, and the op writes the (N,H) context
     * itself: no head transposes. standard: linear into one scratch, then
     * split heads into what is kept. */
    tk_tensor *qkv[3] = {&A->qh, &A->kh, &A->vh};
    if (fused(m)) {
        for (int j = 0; j < 3; j++) {
            TRY(al(S, qkv[j], S->adt, 4, Bs, T, NH, HS, ca, own[OQ + j]));
            TRY(linear_fwd(S, qkv[j], in, w + LQW + 2 * j, N, H, H));
        }
        /* ctx = dropout(P) V without P: only the per-row lse is kept, and
         * with dropout the forward's keep bits (T*T/8 bytes a head: backward
         * reads them instead of hashing each element twice more; a recompute
         * rebuilds them with the layer) */
        const int km = keep && pa > 0.0f;
        TRY(al(S, &A->lse, TK_F32, 3, Bs, NH, T, 0, ca, own[OSELF]));
        if (km) TRY(al(S, &A->keepm, TK_U8, 1, tk_attn_keep_bytes(Bs, NH, T), 0, 0, 0, ca, own[OSELF]));
        TRY(alf(S, &A->ctx, N, H, ca, own[OSELF]));
        const tk_attn sh = fused_shape(S, l);
        TRY(tk_op_attention_fwd(S->d, &A->ctx, &A->lse, km ? &A->keepm : NULL, &A->qh, &A->kh, &A->vh, &s->mask,
                                &sh));
        if (!keep) fr(S, &A->lse);
    } else {
        TRY(alf(S, &s->tmp, N, H, TK_CAT_TEMP, own[OQ]));
        for (int j = 0; j < 3; j++) {
            TRY(linear_fwd(S, &s->tmp, in, w + LQW + 2 * j, N, H, H));
            TRY(al(S, qkv[j], S->adt, 4, Bs, NH, T, HS, ca, own[OQ + j]));
            TRY(tk_op_split_heads(S->d, qkv[j], &s->tmp, Bs, T, NH, HS));
        }
        fr(S, &s->tmp);
    }
    /* Attention over chunks of cs sequences (all at once unless recomputed):
     * P = softmax(Q K^T / sqrt(HS) + mask), computed in place over the
     * scores; ctx = dropout(P) V. P is kept for backward only in the
     * standard mode; otherwise backward rebuilds it chunk by chunk. */
    const int kp = keep && keeps_probs(m);
    const int64_t cs = attn_chunk(S), PP = NH * T * T, PH = NH * T * HS;
    if (kp) TRY(al(S, &A->probs, S->adt, 4, Bs, NH, T, T, TK_CAT_ACT, own[OSELF]));
    if (!fused(m)) TRY(al(S, &s->ctxh, S->adt, 4, Bs, NH, T, HS, TK_CAT_TEMP, own[OSELF]));
    if (!kp && !fused(m)) TRY(al(S, &s->pchunk, S->adt, 4, cs, NH, T, T, TK_CAT_TEMP, own[OSELF]));
    if (pa > 0 && !fused(m)) TRY(al(S, &s->probs_d, S->adt, 4, cs, NH, T, T, TK_CAT_TEMP, own[OSELF]));
    for (int64_t b0 = 0; b0 < Bs && !fused(m); b0 += cs) {
        const int64_t nb = Bs - b0 < cs ? Bs - b0 : cs;
        tk_tensor P = kp ? tk_tensor_view(&A->probs, b0 * PP, nb * PP)
                         : tk_tensor_view(&s->pchunk, 0, nb * PP);
        tk_tensor PD = pa > 0 ? tk_tensor_view(&s->probs_d, 0, nb * PP) : P;
        TRY(attn_probs(S, A, &P, &PD, b0, nb, pa, doff(l, SITE_PROBS) + (uint64_t)(b0 * PP)));
        tk_tensor V = tk_tensor_view(&A->vh, b0 * PH, nb * PH), C = tk_tensor_view(&s->ctxh, b0 * PH, nb * PH);
        TRY(mm(S, &C, &PD, &V, NULL, (tk_gemm){ .m = T, .n = HS, .k = T, .batch = nb * NH, .stride_a = T * T, .stride_b = T * HS, .stride_c = T * HS, .alpha = 1.0f }));
    }
    fr(S, &s->probs_d);
    fr(S, &s->pchunk);
    if (!keep) {
        fr(S, &A->vh);
        fr(S, &A->kh);
        fr(S, &A->qh);
    }
    if (!fused(m)) {
        TRY(alf(S, &A->ctx, N, H, ca, own[OSELF]));
        TRY(tk_op_merge_heads(S->d, &A->ctx, &s->ctxh, Bs, T, NH, HS));
        fr(S, &s->ctxh);
    }
    /* r1 = dropout(ctx Wao^T + b) + in; a1 = LN(r1) */
    TRY(alf(S, &A->r1, N, H, ca, own[OLN1]));
    TRY(linear_fwd(S, &A->r1, &A->ctx, w + LAOW, N, H, H));
    if (!keep) fr(S, &A->ctx);
    TRY(al(S, &A->mean1, TK_F32, 1, N, 0, 0, 0, ca, own[OLN1]));
    TRY(al(S, &A->rstd1, TK_F32, 1, N, 0, 0, 0, ca, own[OLN1]));
    TRY(alf(S, &A->a1, N, H, ca, own[OLN1]));
    /* r1 = dropout(r1) + in and a1 = LN(r1), one pass */
    TRY(tk_op_residual_layernorm_fwd(S->d, &A->r1, &A->a1, &A->mean1, &A->rstd1, &A->r1, in, PW(S, w + LLN1W),
                                     PW(S, w + LLN1B), N, H, m->o.dims.layer_norm_eps, ph, S->seed,
                                     doff(l, SITE_ATTN_OUT)));
    if (free_in) fr(S, in);
    if (!keep) {
        fr(S, &A->rstd1);
        fr(S, &A->mean1);
        fr(S, &A->r1);
    }
    /* FFN: g = gelu(a1 Wi^T + b); r2 = dropout(g Wo^T + b) + a1; out = LN(r2) */
    TRY(alf(S, &A->u, N, I, ca, own[OI]));
    TRY(linear_fwd(S, &A->u, &A->a1, w + LIW, N, I, H));
    /* g is not kept: backward recomputes it from u (one cheap elementwise
     * pass saves an (N,I) activation per layer). */
    TRY(alf(S, &A->g, N, I, TK_CAT_TEMP, own[OI]));
    TRY(tk_op_gelu_fwd(S->d, &A->g, &A->u, N * I));
    if (!keep) fr(S, &A->u);
    TRY(alf(S, &A->r2, N, H, ca, own[OLN2]));
    TRY(linear_fwd(S, &A->r2, &A->g, w + LOW, N, H, I));
    fr(S, &A->g);
    TRY(al(S, &A->mean2, TK_F32, 1, N, 0, 0, 0, ca, own[OLN2]));
    TRY(al(S, &A->rstd2, TK_F32, 1, N, 0, 0, 0, ca, own[OLN2]));
    /* The output is always ACT: it is the next layer's input. */
    TRY(alf(S, &A->out, N, H, TK_CAT_ACT, own[OLN2]));
    /* r2 = dropout(r2) + a1 and out = LN(r2), one pass */
    TRY(tk_op_residual_layernorm_fwd(S->d, &A->r2, &A->out, &A->mean2, &A->rstd2, &A->r2, &A->a1,
                                     PW(S, w + LLN2W), PW(S, w + LLN2B), N, H, m->o.dims.layer_norm_eps, ph,
                                     S->seed, doff(l, SITE_FFN_OUT)));
    if (!keep) fr(S, &A->a1);
    if (!keep) {
        fr(S, &A->rstd2);
        fr(S, &A->mean2);
        fr(S, &A->r2);
    }
    return TK_OK;
}

/* din = LayerNorm backward of the LN whose weight is parameter wi (its
 * weight and bias gradients accumulate), with its partial-sum scratch. */
static tk_status ln_bwd(step *S, tk_tensor *din, int wi, const tk_tensor *dout, const tk_tensor *in,
                        const tk_tensor *mean, const tk_tensor *rstd) {
    const int64_t N = S->N, H = S->m->H;
    TRY(al(S, &S->s.lnscr, TK_F32, 1, tk_layernorm_bwd_scratch_numel(N, H), 0, 0, 0, TK_CAT_TEMP,
           S->m->ps[wi].owner));
    TRY(tk_op_layernorm_bwd(S->d, din, PG(S, wi), PG(S, wi + 1), dout, in, PW(S, wi), mean, rstd, N, H, 0,
                            &S->s.lnscr));
    fr(S, &S->s.lnscr);
    return TK_OK;
}

/* Attention's backward, standard: from dr (d ctx, (N,H)) to dq, dk, dv in
 * heads (Bs,NH,T,HS) in s->dqh, dkh, dvh; frees dr, the context, the kept
 * probabilities and Q, K, V. */
static tk_status attn_bwd_standard(step *S, int l) {
    tk_model *m = S->m;
    lacts *A = &S->la[l];
    stens *s = &S->s;
    const int64_t Bs = S->Bs, T = S->T, NH = m->NH, HS = m->HS;
    char (*own)[OWN_MAX] = m->own[l];
    const float pa = S->train ? m->o.dims.attn_dropout : 0.0f;
    tk_dev *d = S->d;
    fr(S, &A->ctx);
    /* back to heads */
    TRY(al(S, &s->dbuf, S->adt, 4, Bs, NH, T, HS, TK_CAT_TEMP, own[OSELF]));
    TRY(tk_op_split_heads(d, &s->dbuf, &s->dr, Bs, T, NH, HS));
    fr(S, &s->dr);
    /* Per chunk: P (kept, or rebuilt from Q and K), dropout(P) regenerated
     * from the step's seed, then dV = PD^T dC, dPD = dC V^T, dropout and
     * softmax backward in place (the softmax scale folds 1/sqrt(HS) in),
     * dQ = dS K, dK = dS^T Q. */
    const int kp = keeps_probs(m);
    const int64_t cs = attn_chunk(S), PP = NH * T * T, PH = NH * T * HS;
    TRY(al(S, &s->dvh, S->adt, 4, Bs, NH, T, HS, TK_CAT_TEMP, own[OV]));
    TRY(al(S, &s->dqh, S->adt, 4, Bs, NH, T, HS, TK_CAT_TEMP, own[OQ]));
    TRY(al(S, &s->dkh, S->adt, 4, Bs, NH, T, HS, TK_CAT_TEMP, own[OK_]));
    if (!kp) TRY(al(S, &s->pchunk, S->adt, 4, cs, NH, T, T, TK_CAT_TEMP, own[OSELF]));
    if (pa > 0) TRY(al(S, &s->probs_d, S->adt, 4, cs, NH, T, T, TK_CAT_TEMP, own[OSELF]));
    TRY(al(S, &s->dprobs, S->adt, 4, cs, NH, T, T, TK_CAT_TEMP, own[OSELF]));
    for (int64_t b0 = 0; b0 < Bs; b0 += cs) {
        const int64_t nb = Bs - b0 < cs ? Bs - b0 : cs;
        tk_tensor P = kp ? tk_tensor_view(&A->probs, b0 * PP, nb * PP)
                         : tk_tensor_view(&s->pchunk, 0, nb * PP);
        const uint64_t off = doff(l, SITE_PROBS) + (uint64_t)(b0 * PP);
        tk_tensor PD = pa > 0 ? tk_tensor_view(&s->probs_d, 0, nb * PP) : P;
        if (!kp) TRY(attn_probs(S, A, &P, &PD, b0, nb, pa, off));
        else if (pa > 0) TRY(tk_op_dropout_fwd(d, &PD, NULL, &P, nb * PP, pa, S->seed, off));
        tk_tensor dC = tk_tensor_view(&s->dbuf, b0 * PH, nb * PH);
        tk_tensor V = tk_tensor_view(&A->vh, b0 * PH, nb * PH), dV = tk_tensor_view(&s->dvh, b0 * PH, nb * PH);
        tk_tensor Q = tk_tensor_view(&A->qh, b0 * PH, nb * PH), dQ = tk_tensor_view(&s->dqh, b0 * PH, nb * PH);
        tk_tensor K = tk_tensor_view(&A->kh, b0 * PH, nb * PH), dK = tk_tensor_view(&s->dkh, b0 * PH, nb * PH);
        tk_tensor dP = tk_tensor_view(&s->dprobs, 0, nb * PP);
        const int64_t bh = nb * NH;
        TRY(mm(S, &dV, &PD, &dC, NULL, (tk_gemm){ .m = T, .n = HS, .k = T, .trans_a = 1, .batch = bh, .stride_a = T * T, .stride_b = T * HS, .stride_c = T * HS, .alpha = 1.0f }));
        TRY(mm(S, &dP, &dC, &V, NULL, (tk_gemm){ .m = T, .n = T, .k = HS, .trans_b = 1, .batch = bh, .stride_a = T * HS, .stride_b = T * HS, .stride_c = T * T, .alpha = 1.0f }));
        TRY(tk_op_softmax_dropout_bwd(d, &dP, &P, &dP, nb * NH * T, T, 1.0f / sqrtf((float)HS), pa, S->seed, off));
        TRY(mm(S, &dQ, &dP, &K, NULL, (tk_gemm){ .m = T, .n = HS, .k = T, .batch = bh, .stride_a = T * T, .stride_b = T * HS, .stride_c = T * HS, .alpha = 1.0f }));
        TRY(mm(S, &dK, &dP, &Q, NULL, (tk_gemm){ .m = T, .n = HS, .k = T, .trans_a = 1, .batch = bh, .stride_a = T * T, .stride_b = T * HS, .stride_c = T * HS, .alpha = 1.0f }));
    }
    fr(S, &s->dprobs);
    fr(S, &s->probs_d);
    fr(S, &s->pchunk);
    fr(S, &s->dbuf);
    fr(S, &A->probs);
    fr(S, &A->vh);
    fr(S, &A->kh);
    fr(S, &A->qh);
    return TK_OK;
}

/* Attention's backward, fused: the op reads Q, K, V, the context and dr in
 * their (Bs,T,NH,HS) layout and writes dq, dk, dv in it; frees dr, the
 * context, lse and Q, K, V. */
static tk_status attn_bwd_fused(step *S, int l) {
    tk_model *m = S->m;
    lacts *A = &S->la[l];
    stens *s = &S->s;
    const int64_t Bs = S->Bs, T = S->T, NH = m->NH, HS = m->HS;
    char (*own)[OWN_MAX] = m->own[l];
    TRY(al(S, &s->dvh, S->adt, 4, Bs, T, NH, HS, TK_CAT_TEMP, own[OV]));
    TRY(al(S, &s->dqh, S->adt, 4, Bs, T, NH, HS, TK_CAT_TEMP, own[OQ]));
    TRY(al(S, &s->dkh, S->adt, 4, Bs, T, NH, HS, TK_CAT_TEMP, own[OK_]));
    const tk_attn sh = fused_shape(S, l);
    TRY(tk_op_attention_bwd(S->d, &s->dqh, &s->dkh, &s->dvh, &s->dr, &A->qh, &A->kh, &A->vh, &A->ctx, &A->lse,
                            sh.p > 0.0f ? &A->keepm : NULL, &s->mask, &sh));
    fr(S, &s->dr);
    fr(S, &A->ctx);
    fr(S, &A->lse);
    fr(S, &A->keepm);
    fr(S, &A->vh);
    fr(S, &A->kh);
    fr(S, &A->qh);
    return TK_OK;
}

/* Backward of layer l. dout (N,H) is the gradient of A->out; it is consumed.
 * On return s->dh holds the gradient of the layer's input `in` (when
 * need_din), and the layer's activations and `in` are freed. */
static tk_status layer_bwd(step *S, int l, tk_tensor *in, int need_din) {
    tk_model *m = S->m;
    lacts *A = &S->la[l];
    stens *s = &S->s;
    const int64_t N = S->N, H = m->H, I = m->I, Bs = S->Bs, T = S->T, NH = m->NH, HS = m->HS;
    const int w = m->layer0 + l * LNP;
    char (*own)[OWN_MAX] = m->own[l];
    const float ph = S->train ? m->o.dims.hidden_dropout : 0.0f;
    tk_dev *d = S->d;

    /* LN2: dr (= d r2) from dh (= d out) */
    fr(S, &A->out);
    TRY(alf(S, &s->dr, N, H, TK_CAT_TEMP, own[OLN2]));
    TRY(ln_bwd(S, &s->dr, w + LLN2W, &s->dh, &A->r2, &A->mean2, &A->rstd2));
    fr(S, &s->dh);
    fr(S, &A->rstd2);
    fr(S, &A->mean2);
    fr(S, &A->r2);
    /* FFN output dense (through its dropout) */
    tk_tensor *dO = &s->dr;
    if (ph > 0) {
        TRY(alf(S, &s->dtmp, N, H, TK_CAT_TEMP, own[OO]));
        TRY(tk_op_dropout_bwd(d, &s->dtmp, &s->dr, N * H, ph, S->seed, doff(l, SITE_FFN_OUT)));
        dO = &s->dtmp;
    }
    TRY(alf(S, &A->g, N, I, TK_CAT_TEMP, own[OI]));
    TRY(tk_op_gelu_fwd(d, &A->g, &A->u, N * I));
    TRY(alf(S, &s->dbig, N, I, TK_CAT_TEMP, own[OO]));
    TRY(linear_bwd(S, &s->dbig, dO, &A->g, w + LOW, N, H, I, 0));
    fr(S, &s->dtmp);
    fr(S, &A->g);
    /* GELU, in place on the (N,I) gradient */
    TRY(tk_op_gelu_bwd(d, &s->dbig, &A->u, &s->dbig, N * I));
    fr(S, &A->u);
    /* intermediate dense; its input gradient joins the residual in dr (= d a1) */
    TRY(linear_bwd(S, &s->dr, &s->dbig, &A->a1, w + LIW, N, I, H, 1));
    fr(S, &s->dbig);
    fr(S, &A->a1);
    /* LN1: dh (= d r1) */
    TRY(alf(S, &s->dh, N, H, TK_CAT_TEMP, own[OLN1]));
    TRY(ln_bwd(S, &s->dh, w + LLN1W, &s->dr, &A->r1, &A->mean1, &A->rstd1));
    fr(S, &s->dr);
    fr(S, &A->rstd1);
    fr(S, &A->mean1);
    fr(S, &A->r1);
    /* attention output dense (through its dropout): dctx in dr */
    dO = &s->dh;
    if (ph > 0) {
        TRY(alf(S, &s->dtmp, N, H, TK_CAT_TEMP, own[OAO]));
        TRY(tk_op_dropout_bwd(d, &s->dtmp, &s->dh, N * H, ph, S->seed, doff(l, SITE_ATTN_OUT)));
        dO = &s->dtmp;
    }
    TRY(alf(S, &s->dr, N, H, TK_CAT_TEMP, own[OAO]));
    TRY(linear_bwd(S, &s->dr, dO, &A->ctx, w + LAOW, N, H, H, 0));
    fr(S, &s->dtmp);
    TRY(fused(m) ? attn_bwd_fused(S, l) : attn_bwd_standard(S, l));
    /* Q, K, V linears: the input gradient is the residual path (dh = d r1)
     * plus the three projections (fused: from dq, dk, dv as they are;
     * standard: merged back from heads). */
    tk_tensor *dheads[3] = {&s->dqh, &s->dkh, &s->dvh};
    if (!fused(m)) TRY(alf(S, &s->dbuf, N, H, TK_CAT_TEMP, own[OQ]));
    for (int j = 0; j < 3; j++) {
        if (fused(m)) {
            TRY(linear_bwd(S, need_din ? &s->dh : NULL, dheads[j], in, w + LQW + 2 * j, N, H, H, 1));
            fr(S, dheads[j]);
            continue;
        }
        TRY(tk_op_merge_heads(d, &s->dbuf, dheads[j], Bs, T, NH, HS));
        fr(S, dheads[j]);
        TRY(linear_bwd(S, need_din ? &s->dh : NULL, &s->dbuf, in, w + LQW + 2 * j, N, H, H, 1));
    }
    fr(S, &s->dbuf);
    fr(S, in);
    if (!need_din) fr(S, &s->dh);
    return TK_OK;
}

static tk_status embeddings_bwd(step *S) {
    tk_model *m = S->m;
    stens *s = &S->s;
    const int64_t N = S->N, H = m->H;
    const float ph = S->train ? m->o.dims.hidden_dropout : 0.0f;
    if (ph > 0)
        TRY(tk_op_dropout_bwd(S->d, &s->dh, &s->dh, N * H, ph, S->seed, doff(-1, SITE_EMB)));
    TRY(alf(S, &s->dx, N, H, TK_CAT_TEMP, "bert.embeddings.LayerNorm"));
    TRY(ln_bwd(S, &s->dx, m->emb.ln_w, &s->dh, &s->ex, &s->emean, &s->erstd));
    fr(S, &s->dh);
    fr(S, &s->erstd);
    fr(S, &s->emean);
    fr(S, &s->ex);
    /* each table row summed by its own chunks (the groups inputs() built) */
    tk_tensor *gt[3] = {&s->gword, &s->gpos, &s->gtype};
    const int64_t ng = tk_embed_groups_numel(N);
    for (int k = 0; k < 3; k++) {
        TRY(al(S, gt[k], TK_I32, 1, ng, 0, 0, 0, TK_CAT_INPUT, "inputs"));
        TRY(tk_tensor_write(S->d, gt[k], S->egroups + k * ng, S->err));
    }
    TRY(al(S, &s->escr, TK_F32, 1, tk_embed_bwd_scratch_numel(N, H), 0, 0, 0, TK_CAT_TEMP, "bert.embeddings"));
    TRY(tk_op_embed_bwd(S->d, PG(S, m->emb.word), &s->ids, &s->dx, N, H, &s->gword, &s->escr));
    TRY(tk_op_embed_bwd(S->d, PG(S, m->emb.pos), &s->pos, &s->dx, N, H, &s->gpos, &s->escr));
    TRY(tk_op_embed_bwd(S->d, PG(S, m->emb.type), &s->tt, &s->dx, N, H, &s->gtype, &s->escr));
    fr(S, &s->escr);
    fr(S, &s->gtype);
    fr(S, &s->gpos);
    fr(S, &s->gword);
    fr(S, &s->dx);
    return TK_OK;
}

/* Copies the host batch to INPUT tensors, checking ids against the tables. */
static tk_status inputs(step *S, const tk_batch *b) {
    tk_model *m = S->m;
    stens *s = &S->s;
    const int64_t N = S->N;
    const tk_bert_dims *dm = &m->o.dims;
    int32_t *host = tk_malloc((size_t)N * sizeof *host);
    if (!host) {
        tk_err_set(S->err, TK_ENOMEM, "model: out of host memory");
        return TK_ENOMEM;
    }
    tk_status st = TK_OK;
    for (int64_t i = 0; i < N && st == TK_OK; i++)
        if (b->input_ids[i] < 0 || b->input_ids[i] >= dm->vocab_size) {
            tk_err_set(S->err, TK_EINVAL, "batch: input_ids[%lld] = %d is outside the vocabulary "
                       "(0..%d)", (long long)i, b->input_ids[i], dm->vocab_size - 1);
            st = TK_EINVAL;
        } else if (b->token_type_ids && (b->token_type_ids[i] < 0 ||
                                         b->token_type_ids[i] >= dm->type_vocab)) {
            tk_err_set(S->err, TK_EINVAL, "batch: token_type_ids[%lld] = %d is outside 0..%d",
                       (long long)i, b->token_type_ids[i], dm->type_vocab - 1);
            st = TK_EINVAL;
        }
    if (st == TK_OK && m->o.head != TK_HEAD_SPAN && b->labels)
        for (int i = 0; i < S->B && st == TK_OK; i++)
            if (b->labels[i] >= m->o.num_labels) {
                tk_err_set(S->err, TK_EINVAL, "batch: label %d of example %d is outside 0..%d",
                           b->labels[i], i, m->o.num_labels - 1);
                st = TK_EINVAL;
            }
    const char *own = "inputs";
#define IN_TENSOR(t, n) do { if (st == TK_OK) st = al(S, t, TK_I32, 1, n, 0, 0, 0, TK_CAT_INPUT, own); } while (0)
#define WR(t, src) do { if (st == TK_OK) st = tk_tensor_write(S->d, t, src, S->err); } while (0)
    IN_TENSOR(&s->ids, N);
    WR(&s->ids, b->input_ids);
    IN_TENSOR(&s->tt, N);
    if (b->token_type_ids) {
        WR(&s->tt, b->token_type_ids);
    } else if (st == TK_OK) {
        memset(host, 0, (size_t)N * sizeof *host);
        WR(&s->tt, host);
    }
    IN_TENSOR(&s->pos, N);
    for (int64_t i = 0; i < N; i++) host[i] = (int32_t)(i % S->T);
    WR(&s->pos, host);
    IN_TENSOR(&s->mask, N);
    if (b->attention_mask) {
        WR(&s->mask, b->attention_mask);
    } else {
        for (int64_t i = 0; i < N; i++) host[i] = 1;
        WR(&s->mask, host);
    }
    if (m->o.head == TK_HEAD_POOLED) {
        IN_TENSOR(&s->cidx, S->B);
        for (int i = 0; i < S->B; i++) host[i] = i * S->T;
        WR(&s->cidx, host);
    }
    if (m->o.head != TK_HEAD_SPAN) {
        IN_TENSOR(&s->labels, S->B);
        S->nvalid = 0;
        for (int i = 0; i < S->B; i++) {
            host[i] = b->labels ? (b->labels[i] < 0 ? -1 : b->labels[i]) : -1;
            S->nvalid += host[i] >= 0;
        }
        WR(&s->labels, host);
    } else {
        /* As HF: positions are clamped to [0, T] and T is ignored. */
        tk_tensor *pt[2] = {&s->starts, &s->ends};
        const int32_t *src[2] = {b->start_positions, b->end_positions};
        int *nv[2] = {&S->nvalid, &S->nvalid2};
        for (int k = 0; k < 2; k++) {
            IN_TENSOR(pt[k], S->B);
            *nv[k] = 0;
            for (int i = 0; i < S->B; i++) {
                int32_t p = src[k] ? src[k][i] : S->T;
                if (p < 0) p = 0;
                host[i] = p >= S->T ? -1 : p;
                *nv[k] += host[i] >= 0;
            }
            WR(pt[k], host);
        }
        /* A column of ones: qa_outputs' bias as a rank-1 GEMM update. In the
         * activations' dtype: cuBLAS takes both GEMM inputs in one dtype, and
         * the backward GEMM pairs it with the 16-bit dlogits. */
        if (st == TK_OK) st = al(S, &s->ones, S->adt, 1, N, 0, 0, 0, TK_CAT_TEMP, "qa_outputs");
        if (st == TK_OK) st = tk_op_fill(S->d, &s->ones, 1.0f, N);
    }
    /* The embedding backward's row groups (tk_embed_groups_build) of the
     * word, position and type ids, built on the host now, uploaded by
     * embeddings_bwd when most activations are gone (so the step's peak does
     * not carry them). */
    if (st == TK_OK && S->train && grads_below(m, -1)) {
        const int64_t ng = tk_embed_groups_numel(N);
        const int64_t rows[3] = {dm->vocab_size, dm->max_position, dm->type_vocab};
        S->egroups = tk_malloc((size_t)(3 * ng) * sizeof *S->egroups);
        if (!S->egroups) st = tk_err_nomem(S->err, "model: the embedding groups");
        for (int k = 0; k < 3 && st == TK_OK; k++) {
            for (int64_t i = 0; i < N; i++)
                host[i] = k == 0 ? b->input_ids[i] : k == 1 ? (int32_t)(i % S->T)
                        : b->token_type_ids ? b->token_type_ids[i] : 0;
            int rc = tk_embed_groups_build(S->egroups + k * ng, host, N, rows[k]);
            if (rc == -2) st = tk_err_nomem(S->err, "model: the embedding groups");
            else if (rc != 0) st = (tk_err_set(S->err, TK_EINVAL, "batch: an id is outside its embedding table"), TK_EINVAL);
        }
    }
#undef IN_TENSOR
#undef WR
    free(host);
    if (st != TK_OK) return fail(S, st, "inputs", __LINE__);
    return TK_OK;
}

/* *out = the sum of the n per-example losses over nvalid (0 when none is
 * valid). A failed read is the step's error, never a made-up loss. */
static tk_status mean_loss(step *S, const tk_tensor *losses, int n, int nvalid, double *out) {
    float *h = tk_calloc((size_t)n, sizeof *h);
    double sum = 0;
    *out = 0.0;
    if (!h) return tk_err_nomem(S->err, "model: reading the loss");
    tk_status st = tk_tensor_read_f32(S->d, losses, h, S->err);
    for (int i = 0; st == TK_OK && i < n; i++) sum += h[i];
    free(h);
    if (st == TK_OK && nvalid) *out = sum / nvalid;
    return st;
}

/* Head forward from hL (N,H); fills logits, losses. `keep` saves for backward
 * (else hL is freed once read). */
static tk_status head_fwd(step *S, tk_tensor *hL, int keep, int want_loss, double *loss) {
    tk_model *m = S->m;
    stens *s = &S->s;
    const int64_t H = m->H, B = S->B, N = S->N, V = m->o.num_labels;
    const tk_cat ca = keep ? TK_CAT_ACT : TK_CAT_TEMP;
    *loss = 0;
    if (m->o.head == TK_HEAD_POOLED) {
        TRY(alf(S, &s->cls, B, H, ca, "bert.pooler.dense"));
        TRY(tk_op_gather_rows(S->d, &s->cls, hL, &s->cidx, B, H));
        if (!keep) fr(S, hL);
        TRY(alf(S, &s->pooled, B, H, ca, "bert.pooler.dense"));
        TRY(linear_fwd(S, &s->pooled, &s->cls, m->pool, B, H, H));
        if (!keep) fr(S, &s->cls);
        TRY(tk_op_tanh_fwd(S->d, &s->pooled, &s->pooled, B * H));
        tk_tensor *x = &s->pooled;
        float p = S->train ? m->o.dims.hidden_dropout : 0.0f;
        if (p > 0) {
            TRY(alf(S, &s->pd, B, H, ca, "classifier"));
            TRY(tk_op_dropout_fwd(S->d, &s->pd, NULL, &s->pooled, B * H, p, S->seed,
                                  doff(m->L, SITE_HEAD)));
            x = &s->pd;
        }
        TRY(alf(S, &s->logits, B, V, ca, "classifier"));
        TRY(linear_fwd(S, &s->logits, x, m->head, B, V, H));
        if (!keep) {
            fr(S, &s->pd);
            fr(S, &s->pooled);
        }
    } else if (m->o.head == TK_HEAD_FLATTEN_DENSE) {
        /* (B, towers*T*H) is exactly hL's memory: each example's towers are adjacent. */
        const int64_t K = (int64_t)m->o.towers * S->T * H;
        TRY(alf(S, &s->logits, B, V, ca, "classifier"));
        TRY(linear_fwd(S, &s->logits, hL, m->head, B, V, K));
        if (!keep) fr(S, hL);
    } else {
        /* logits^T (2, N) = Wqa (2,H) @ hL^T, bias as a rank-1 update, so that
         * start and end logits are each a contiguous (B,T) block. */
        TRY(alf(S, &s->logits, 2, N, ca, "qa_outputs"));
        TRY(mm(S, &s->logits, PWc(S, m->head), hL, NULL, (tk_gemm){ .m = 2, .n = N, .k = H, .trans_b = 1, .batch = 1, .alpha = 1.0f }));
        /* 16-bit: the bias's copy, rounded to the activations' dtype to
         * pair with the ones (as autocast does for a Linear's bias). */
        TRY(mm(S, &s->logits, PWc(S, m->head + 1), &s->ones, NULL, (tk_gemm){ .m = 2, .n = N, .k = 1, .batch = 1, .alpha = 1.0f, .beta = 1.0f }));
        if (!keep) fr(S, hL);
    }
    if (!want_loss) return TK_OK;
    if (m->o.head != TK_HEAD_SPAN) {
        TRY(al(S, &s->losses, TK_F32, 1, B, 0, 0, 0, TK_CAT_TEMP, "classifier"));
        TRY(tk_op_xent_fwd(S->d, &s->losses, NULL, &s->logits, &s->labels, B, V));
        TRY(mean_loss(S, &s->losses, (int)B, S->nvalid, loss));
        fr(S, &s->losses);
    } else {
        tk_tensor ls = tk_tensor_view(&s->logits, 0, N), le = tk_tensor_view(&s->logits, N, N);
        TRY(al(S, &s->losses, TK_F32, 1, B, 0, 0, 0, TK_CAT_TEMP, "qa_outputs"));
        TRY(tk_op_xent_fwd(S->d, &s->losses, NULL, &ls, &s->starts, B, S->T));
        double l1, l2;
        TRY(mean_loss(S, &s->losses, (int)B, S->nvalid, &l1));
        TRY(tk_op_xent_fwd(S->d, &s->losses, NULL, &le, &s->ends, B, S->T));
        TRY(mean_loss(S, &s->losses, (int)B, S->nvalid2, &l2));
        fr(S, &s->losses);
        *loss = (l1 + l2) / 2;
    }
    return TK_OK;
}

/* Head backward: leaves d hL (N,H) in s->dh. */
static tk_status head_bwd(step *S, tk_tensor *hL, float grad_scale) {
    tk_model *m = S->m;
    stens *s = &S->s;
    tk_dev *d = S->d;
    const int64_t H = m->H, B = S->B, N = S->N, V = m->o.num_labels;
    if (m->o.head == TK_HEAD_SPAN) {
        TRY(alf(S, &s->dlogits, 2, N, TK_CAT_TEMP, "qa_outputs"));
        tk_tensor ls = tk_tensor_view(&s->logits, 0, N), le = tk_tensor_view(&s->logits, N, N);
        tk_tensor ds = tk_tensor_view(&s->dlogits, 0, N), de = tk_tensor_view(&s->dlogits, N, N);
        TRY(tk_op_xent_bwd(d, &ds, &ls, &s->starts, B, S->T,
                           S->nvalid ? 0.5f * grad_scale / S->nvalid : 0.0f));
        TRY(tk_op_xent_bwd(d, &de, &le, &s->ends, B, S->T,
                           S->nvalid2 ? 0.5f * grad_scale / S->nvalid2 : 0.0f));
        fr(S, &s->logits);
        tk_tensor *dW = PG(S, m->head), *db = PG(S, m->head + 1);
        TRY(mm(S, dW, &s->dlogits, hL, NULL, (tk_gemm){ .m = 2, .n = H, .k = N, .batch = 1, .alpha = 1.0f, .beta = 1.0f }));
        TRY(mm(S, db, &s->dlogits, &s->ones, NULL, (tk_gemm){ .m = 2, .n = 1, .k = N, .batch = 1, .alpha = 1.0f, .beta = 1.0f }));
        TRY(alf(S, &s->dh, N, H, TK_CAT_TEMP, "qa_outputs"));
        TRY(mm(S, &s->dh, &s->dlogits, PWc(S, m->head), NULL, (tk_gemm){ .m = N, .n = H, .k = 2, .trans_a = 1, .batch = 1, .alpha = 1.0f }));
        fr(S, &s->dlogits);
        return TK_OK;
    }
    TRY(alf(S, &s->dlogits, B, V, TK_CAT_TEMP, "classifier"));
    TRY(tk_op_xent_bwd(d, &s->dlogits, &s->logits, &s->labels, B, V,
                       S->nvalid ? grad_scale / S->nvalid : 0.0f));
    fr(S, &s->logits);
    if (m->o.head == TK_HEAD_FLATTEN_DENSE) {
        const int64_t K = (int64_t)m->o.towers * S->T * H;
        TRY(alf(S, &s->dh, N, H, TK_CAT_TEMP, "classifier"));
        TRY(linear_bwd(S, &s->dh, &s->dlogits, hL, m->head, B, V, K, 0));
        fr(S, &s->dlogits);
        return TK_OK;
    }
    float p = S->train ? m->o.dims.hidden_dropout : 0.0f;
    tk_tensor *x = p > 0 ? &s->pd : &s->pooled;
    TRY(alf(S, &s->dpd, B, H, TK_CAT_TEMP, "classifier"));
    TRY(linear_bwd(S, &s->dpd, &s->dlogits, x, m->head, B, V, H, 0));
    fr(S, &s->dlogits);
    fr(S, &s->pd);
    if (p > 0)
        TRY(tk_op_dropout_bwd(d, &s->dpd, &s->dpd, B * H, p, S->seed, doff(m->L, SITE_HEAD)));
    TRY(tk_op_tanh_bwd(d, &s->dpd, &s->pooled, &s->dpd, B * H));
    fr(S, &s->pooled);
    TRY(alf(S, &s->dcls, B, H, TK_CAT_TEMP, "bert.pooler.dense"));
    TRY(linear_bwd(S, &s->dcls, &s->dpd, &s->cls, m->pool, B, H, H, 0));
    fr(S, &s->dpd);
    fr(S, &s->cls);
    TRY(alf(S, &s->dh, N, H, TK_CAT_TEMP, "bert.pooler.dense"));
    TRY(tk_op_fill(d, &s->dh, 0.0f, N * H));
    TRY(tk_op_scatter_add_rows(d, &s->dh, &s->dcls, &s->cidx, B, H));
    fr(S, &s->dcls);
    return TK_OK;
}

static tk_status read_logits(step *S, float *logits) {
    tk_model *m = S->m;
    int64_t n = tk_model_n_logits(m, S->B, S->T);
    float *h = tk_calloc((size_t)n, sizeof *h);
    if (!h) {
        tk_err_set(S->err, TK_ENOMEM, "model: out of host memory");
        return TK_ENOMEM;
    }
    tk_status st = tk_tensor_read_f32(S->d, &S->s.logits, h, S->err);
    if (st == TK_OK && m->o.head == TK_HEAD_SPAN) {
        for (int64_t i = 0; i < S->N; i++) {
            logits[2 * i] = h[i];
            logits[2 * i + 1] = h[S->N + i];
        }
    } else if (st == TK_OK) {
        memcpy(logits, h, (size_t)n * sizeof *h);
    }
    free(h);
    return st;
}

static tk_status step_begin(step *S, tk_model *m, const tk_batch *b, int train, uint64_t stepno,
                            tk_err *err) {
    memset(S, 0, sizeof *S);
    S->m = m;
    S->d = m->dev;
    S->err = err;
    S->train = train;
    S->adt = m->adt;
    S->B = b->B;
    S->T = b->T;
    S->Bs = b->B * m->o.towers;
    S->N = (int64_t)S->Bs * b->T;
    S->seed = m->o.seed ^ (0x9E3779B97F4A7C15ull * (stepno + 1));
    if (err) err->status = TK_OK, err->msg[0] = 0;
    if (b->B <= 0 || b->T <= 0 || !b->input_ids) {
        tk_err_set(err, TK_EINVAL, "batch: needs B > 0, T > 0 and input_ids (got B=%d, T=%d)", b->B,
                   b->T);
        return TK_EINVAL;
    }
    if (b->T > m->o.dims.max_position) {
        tk_err_set(err, TK_EINVAL, "batch: sequence length %d exceeds max_position_embeddings %d",
                   b->T, m->o.dims.max_position);
        return TK_EINVAL;
    }
    if (m->o.head == TK_HEAD_FLATTEN_DENSE && b->T != m->o.max_len) {
        tk_err_set(err, TK_EINVAL, "batch: flatten_dense needs every batch padded to max_len %d "
                   "(got %d); use batching: fixed", m->o.max_len, b->T);
        return TK_EINVAL;
    }
    S->la = tk_calloc((size_t)m->L, sizeof *S->la);
    if (!S->la) {
        tk_err_set(err, TK_ENOMEM, "model: out of host memory");
        return TK_ENOMEM;
    }
    return inputs(S, b);
}

/* Copies the f32 masters into their 16-bit copies (the optimizer changed
 * the masters since the last step). */
static tk_status refresh_copies(step *S) {
    for (int i = 0; i < S->m->np; i++) {
        pslot *p = &S->m->ps[i];
        if (p->w16.ndim) TRY(tk_op_cast(S->d, &p->w16, &p->w, tk_tensor_numel(&p->w)));
    }
    return TK_OK;
}

/* One backward stage between the hooks (tk_grad_hooks) on parameters [p0, p1). */
#define STAGE(p0, p1, call)                                                           \
    do {                                                                              \
        const tk_grad_hooks *hk_ = m->has_hooks ? &m->hooks : NULL;                   \
        if (hk_) TRY(hk_->before(hk_->ud, (p0), (p1), S->err));                        \
        TRY(call);                                                                    \
        if (hk_) TRY(hk_->after(hk_->ud, (p0), (p1), S->err));                         \
    } while (0)

static tk_status fwd_bwd(step *S, const tk_batch *b, float grad_scale, float *loss, float *logits) {
    tk_model *m = S->m;
    const int L = m->L;
    TRY(refresh_copies(S));
    TRY(embeddings_fwd(S, b, grads_below(m, -1)));
    tk_tensor *h = &S->s.h0;
    for (int l = 0; l < L; l++) {
        /* Under recompute only each layer's input is kept (it is the
         * previous layer's output, always kept); the rest is rebuilt in
         * backward with the same dropout masks. */
        int bw = layer_backward(m, l), rc = bw && m->o.recompute == TK_RECOMPUTE_LAYERS;
        TRY(layer_fwd(S, l, h, bw && !rc, !bw));
        h = &S->la[l].out;
    }
    double lo;
    TRY(head_fwd(S, h, 1, 1, &lo));
    if (loss) *loss = (float)lo;
    if (logits) TRY(read_logits(S, logits));
    tk_alloc_set_phase(tk_dev_alloc(m->dev), "backward");
    int p_head = m->layer0 + L * LNP;
    STAGE(p_head, m->np, head_bwd(S, h, grad_scale));
    for (int l = L - 1; l >= 0; l--) {
        if (!layer_backward(m, l)) break;
        tk_tensor *in = l ? &S->la[l - 1].out : &S->s.h0;
        if (m->o.recompute == TK_RECOMPUTE_LAYERS) {
            /* The output is no longer needed (the head or layer l+1 is done
             * with it); the recomputed forward allocates it anew. */
            fr(S, &S->la[l].out);
            TRY(layer_fwd(S, l, in, 1, 0));
        }
        STAGE(m->layer0 + l * LNP, m->layer0 + (l + 1) * LNP, layer_bwd(S, l, in, grads_below(m, l - 1)));
    }
    if (grads_below(m, -1)) STAGE(0, m->layer0, embeddings_bwd(S));
    return TK_OK;
}
#undef STAGE

tk_status tk_model_forward_backward(tk_model *m, const tk_batch *b, uint64_t stepno, float grad_scale,
                                    float *loss, float *logits, tk_err *err) {
    step S;
    /* Gradients outlive the step: allocate them before its inputs so they
     * do not sit between freed step blocks. The phase labels what the
     * allocator hands out (its history and snapshots show it). */
    tk_alloc_set_phase(tk_dev_alloc(m->dev), "forward");
    tk_status st = tk_model_alloc_grads(m, err);
    if (st != TK_OK) return st;
    st = step_begin(&S, m, b, 1, stepno, err);
    if (st == TK_OK) st = fwd_bwd(&S, b, grad_scale, loss, logits);
    step_cleanup(&S);
    return st;
}

static tk_status fwd_eval(step *S, const tk_batch *b, float *loss, float *logits) {
    tk_model *m = S->m;
    TRY(refresh_copies(S));
    TRY(embeddings_fwd(S, b, 0));
    tk_tensor *h = &S->s.h0;
    for (int l = 0; l < m->L; l++) {
        TRY(layer_fwd(S, l, h, 0, 1));
        h = &S->la[l].out;
    }
    int want = m->o.head == TK_HEAD_SPAN ? (b->start_positions && b->end_positions) : !!b->labels;
    double lo;
    TRY(head_fwd(S, h, 0, want, &lo));
    if (loss) *loss = (float)lo;
    if (logits) TRY(read_logits(S, logits));
    return TK_OK;
}

tk_status tk_model_forward_eval(tk_model *m, const tk_batch *b, float *loss, float *logits,
                                tk_err *err) {
    step S;
    tk_alloc_set_phase(tk_dev_alloc(m->dev), "eval");
    tk_status st = step_begin(&S, m, b, 0, 0, err);
    if (st == TK_OK) st = fwd_eval(&S, b, loss, logits);
    step_cleanup(&S);
    return st;
}
