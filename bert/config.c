/* config.c — the run configuration: defaults, YAML parsing, overrides,
 * validation, YAML output and diffs (implements tk_config.h).
 *
 * Every key is one row of a table (name, section, kind, field offset, range
 * or allowed values, help). Parsing, `key=value` overrides, to_yaml, diff and
 * the key list all walk that table, so they cannot disagree about a key.
 *
 * Guarantees:
 *  - A parse either applies the whole document or leaves the config as it
 *    was (it works on a copy).
 *  - Every error names the source and line (YAML) and the key; an unknown key
 *    suggests the closest known one; an enum lists its allowed values.
 *  - tk_config_to_yaml output parses back to an identical config (floats are
 *    printed with 9 significant digits, which round-trips a float exactly).
 */
#include "tk_config.h"
#include "tk_host_mem.h"
#include "tk_model.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

/* ---- the key table ------------------------------------------------------ */

typedef enum { K_STR, K_INT, K_FLOAT, K_U64, K_BYTES, K_ENUM, K_SPECIAL } key_kind;

typedef struct keydef keydef;
/* Setter for special keys: returns 0, or nonzero with `why` filled. */
typedef int (*key_set_fn)(tk_config *c, const char *val, char *why, size_t n);
typedef void (*key_get_fn)(const tk_config *c, char *buf, size_t n);

struct keydef {
    const char *name;
    const char *section;       /* where to_yaml puts it: model, data, train, device */
    key_kind kind;
    size_t off, size;          /* field offset and size (strings: capacity) */
    double min, max;           /* numeric range, inclusive */
    const char *const *choices;/* K_ENUM: allowed spellings, index = enum value */
    key_set_fn set;            /* K_SPECIAL */
    key_get_fn get;            /* K_SPECIAL; NULL: an input-only key, not written out */
    const char *help;
};

#define OFF(f) offsetof(tk_config, f), sizeof(((tk_config *)0)->f)

static const char *const task_names[] = {"classify", "qa", NULL};
static const char *const head_names[] = {"pooled", "span", "flatten_dense", NULL};
static const char *const prec_names[] = {"fp32", "fp16", "bf16", NULL};
static const char *const optim_names[] = {"adamw", "adamw8bit", "adamw_torch_fused", NULL};
static const char *const save_error_names[] = {"continue", "stop", NULL};
static const char *const attn_names[] = {"standard", "fused", "auto", NULL};
static const char *const batching_names[] = {"fixed", "dynamic", "buckets", NULL};
static const char *const device_names[] = {"auto", "cpu", "cuda", "meta", NULL};
static const char *const schedule_names[] = {"linear", "constant", NULL};
static const char *const init_names[] = {"pretrained", "random", NULL};
static const char *const engine_names[] = {"txkernel", "pytorch", NULL};
static const char *const attn_impl_names[] = {"sdpa", "eager", NULL};
static const char *const torch_version_names[] = {"2", "1.13", "1.10", "2.0", "2.1", "2.2", "2.3", "2.4", "2.5", "2.6",
                                                  "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15",
                                                  NULL};
_Static_assert(sizeof torch_version_names / sizeof *torch_version_names == TK_TORCH_N_VERSIONS + 1,
               "one name per tk_torch_version");

int tk_torch_minor(tk_torch_version v) {
    if (v == TK_TORCH_2) return 11;
    if (v == TK_TORCH_1_13 || v == TK_TORCH_1_10) return -1;
    return (int)v - (int)TK_TORCH_2_0;
}
static const char *const api_names[] = {"auto", "trainer", "loop", "txkernel", "keras", NULL};
static const char *const parallel_names[] = {"dataparallel", "ddp", "zero2", NULL};

/* attention_dropout: a probability, or `dropout` / -1 for the dropout key's */
static int set_attention_dropout(tk_config *c, const char *v, char *why, size_t n) {
    char *end = NULL;
    if (!strcasecmp(v, "dropout")) { c->attention_dropout = -1.0f; return 0; }
    float f = strtof(v, &end);
    if (end == v || *end || !(f == -1.0f || (f >= 0.0f && f < 1.0f))) {
        snprintf(why, n, "'%s' is not a probability 0 <= p < 1 (or `dropout`: the dropout key's value)", v);
        return -1;
    }
    c->attention_dropout = f;
    return 0;
}
static void get_attention_dropout(const tk_config *c, char *b, size_t n) {
    if (c->attention_dropout < 0) snprintf(b, n, "dropout");
    else snprintf(b, n, "%g", (double)c->attention_dropout);
}

/* ---- value parsers ------------------------------------------------------- */

static int parse_long(const char *s, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* YAML 1.1 booleans as users write them; -1 if it is not one. */
static int parse_bool(const char *s) {
    static const char *const t[] = {"true", "yes", "on", "1", NULL};
    static const char *const f[] = {"false", "no", "off", "0", NULL};
    for (int i = 0; t[i]; i++) if (!strcasecmp(s, t[i])) return 1;
    for (int i = 0; f[i]; i++) if (!strcasecmp(s, f[i])) return 0;
    return -1;
}

static void join_choices(const char *const *ch, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; ch[i]; i++)
        used += (size_t)snprintf(buf + used, used < n ? n - used : 0, "%s%s", i ? ", " : "", ch[i]);
}

/* ---- special keys ------------------------------------------------------- */

/* lowercase: true | false | auto (-1 = from the model) */
static int set_lowercase(tk_config *c, const char *v, char *why, size_t n) {
    if (!strcasecmp(v, "auto")) { c->lowercase = -1; return 0; }
    int b = parse_bool(v);
    if (b < 0) { snprintf(why, n, "'%s' is not one of true, false, auto", v); return -1; }
    c->lowercase = b;
    return 0;
}
static void get_lowercase(const tk_config *c, char *b, size_t n) {
    snprintf(b, n, "%s", c->lowercase < 0 ? "auto" : c->lowercase ? "true" : "false");
}
static int set_tf32(tk_config *c, const char *v, char *why, size_t n) {
    int b = parse_bool(v);
    if (b < 0) { snprintf(why, n, "'%s' is not one of true, false", v); return -1; }
    c->tf32 = b;
    return 0;
}
static void get_tf32(const tk_config *c, char *b, size_t n) { snprintf(b, n, "%s", c->tf32 ? "true" : "false"); }

/* recompute: none | layers | attention, and the HF-style boolean
 * (gradient_checkpointing: true means whole layers). */
static int set_recompute(tk_config *c, const char *v, char *why, size_t n) {
    static const char *const names[] = {"none", "layers", "attention", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcasecmp(v, names[i])) { c->recompute = (tk_recompute)i; return 0; }
    int b = parse_bool(v);
    if (b >= 0) { c->recompute = b ? TK_RECOMPUTE_LAYERS : TK_RECOMPUTE_NONE; return 0; }
    snprintf(why, n, "'%s' is not one of none, layers, attention", v);
    return -1;
}
static void get_recompute(const tk_config *c, char *b, size_t n) {
    static const char *const names[] = {"none", "layers", "attention"};
    snprintf(b, n, "%s", names[c->recompute]);
}

/* empty_cache: never | on_oom | every:N */
static int set_empty_cache(tk_config *c, const char *v, char *why, size_t n) {
    if (!strcasecmp(v, "never")) { c->empty_cache = TK_EMPTY_NEVER; return 0; }
    if (!strcasecmp(v, "on_oom")) { c->empty_cache = TK_EMPTY_ON_OOM; return 0; }
    if (!strncasecmp(v, "every:", 6) || !strncasecmp(v, "every ", 6)) {
        long long k;
        if (parse_long(v + 6, &k) || k < 1 || k > 1000000000) {
            snprintf(why, n, "'%s': every:N needs a whole number of steps N >= 1", v);
            return -1;
        }
        c->empty_cache = TK_EMPTY_EVERY;
        c->empty_cache_every = (int)k;
        return 0;
    }
    snprintf(why, n, "'%s' is not one of never, on_oom, every:N", v);
    return -1;
}
static void get_empty_cache(const tk_config *c, char *b, size_t n) {
    if (c->empty_cache == TK_EMPTY_EVERY) snprintf(b, n, "every:%d", c->empty_cache_every);
    else snprintf(b, n, "%s", c->empty_cache == TK_EMPTY_ON_OOM ? "on_oom" : "never");
}

/* save_every: N (optimizer steps) | Ns | Nmin | Nh (wall time); 0 = each epoch's end */
static int set_save_every(tk_config *c, const char *v, char *why, size_t n) {
    char *end = NULL;
    errno = 0;
    long long k = strtoll(v, &end, 10);
    if (end == v || errno || k < 0 || k > 1000000000) {
        snprintf(why, n, "'%s': save_every needs N steps or a time such as 10min, 30s, 2h", v);
        return -1;
    }
    while (*end == ' ') end++;
    long long mul = 0;
    if (!*end) mul = 0;
    else if (!strcasecmp(end, "s") || !strcasecmp(end, "sec")) mul = 1;
    else if (!strcasecmp(end, "min") || !strcasecmp(end, "m")) mul = 60;
    else if (!strcasecmp(end, "h")) mul = 3600;
    else {
        snprintf(why, n, "'%s': the unit must be s, min or h (or none: steps)", v);
        return -1;
    }
    c->save_every = mul ? 0 : (int)k;
    c->save_every_s = mul ? (int)(k * mul) : 0;
    return 0;
}
static void get_save_every(const tk_config *c, char *b, size_t n) {
    if (c->save_every_s) snprintf(b, n, "%ds", c->save_every_s);
    else snprintf(b, n, "%d", c->save_every);
}

/* freeze: none | embeddings | layers:N | embeddings,layers:N (input only;
 * written out as freeze_embeddings and freeze_layers). */
static int set_freeze(tk_config *c, const char *v, char *why, size_t n) {
    int emb = 0, layers = 0;
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", v);
    char *save = NULL;
    for (char *tok = strtok_r(tmp, ", +", &save); tok; tok = strtok_r(NULL, ", +", &save)) {
        long long k;
        if (!strcasecmp(tok, "none")) continue;
        if (!strcasecmp(tok, "embeddings")) { emb = 1; continue; }
        if (!strncasecmp(tok, "layers:", 7) && !parse_long(tok + 7, &k) && k >= 0 && k <= 1000) {
            layers = (int)k;
            continue;
        }
        snprintf(why, n, "'%s' is not one of none, embeddings, layers:N (or a comma list)", tok);
        return -1;
    }
    c->freeze_embeddings = emb;
    c->freeze_layers = layers;
    return 0;
}

/* gpu: a profile name from tk_gpu_profile_find, or "" for none */
static int set_gpu(tk_config *c, const char *v, char *why, size_t n) {
    if (!*v || !strcasecmp(v, "none")) { memset(c->gpu, 0, sizeof c->gpu); return 0; }
    const tk_gpu_profile *p = tk_gpu_profile_find(v);
    if (!p) {
        char names[512];
        size_t used = 0;
        names[0] = 0;
        for (int i = 0; tk_gpu_profile_at(i); i++)
            used += (size_t)snprintf(names + used, used < sizeof names ? sizeof names - used : 0,
                                     "%s%s", i ? ", " : "", tk_gpu_profile_at(i)->name);
        snprintf(why, n, "'%s' is not a known GPU profile (%s)", v, names);
        return -1;
    }
    memset(c->gpu, 0, sizeof c->gpu);
    snprintf(c->gpu, sizeof c->gpu, "%s", p->name);
    return 0;
}
static void get_gpu(const tk_config *c, char *b, size_t n) { snprintf(b, n, "%s", c->gpu[0] ? c->gpu : "none"); }

/* schedule: linear | constant (kept as a string in the struct) */
static int set_schedule(tk_config *c, const char *v, char *why, size_t n) {
    for (int i = 0; schedule_names[i]; i++)
        if (!strcasecmp(v, schedule_names[i])) {
            memset(c->schedule, 0, sizeof c->schedule);
            snprintf(c->schedule, sizeof c->schedule, "%s", schedule_names[i]);
            return 0;
        }
    snprintf(why, n, "'%s' is not one of linear, constant", v);
    return -1;
}
static void get_schedule(const tk_config *c, char *b, size_t n) { snprintf(b, n, "%s", c->schedule); }

/* ---- the table ------------------------------------------------------------ */

#define STR(n, s, f, h) {n, s, K_STR, OFF(f), 0, 0, NULL, NULL, NULL, h}
#define INT(n, s, f, lo, hi, h) {n, s, K_INT, OFF(f), lo, hi, NULL, NULL, NULL, h}
#define FLT(n, s, f, lo, hi, h) {n, s, K_FLOAT, OFF(f), lo, hi, NULL, NULL, NULL, h}
#define ENUM(n, s, f, ch, h) {n, s, K_ENUM, OFF(f), 0, 0, ch, NULL, NULL, h}
#define SPEC(n, s, st, gt, h) {n, s, K_SPECIAL, 0, 0, 0, 0, NULL, st, gt, h}
#define BIG 1e9

static const keydef KEYS[] = {
    STR("model", "model", model, "a HF model folder, a hub id (org/name, from the HF cache or downloaded) or a preset (bert-tiny, bert-base-cased, ...: aliases of hub ids)"),
    STR("revision", "model", revision, "hub branch, tag or commit of the model; default main"),
    ENUM("init", "model", init, init_names, "pretrained (the model's weights; an error when it has none) or random (the model's shape, random weights)"),
    STR("vocab", "model", vocab, "vocab.txt for the tokenizer; empty = the model folder's"),
    INT("hidden", "model", hidden, 0, 65536, "hidden size; 0 = from the preset or config.json"),
    INT("layers", "model", layers, 0, 1000, "encoder layers; 0 = from the preset or config.json"),
    INT("heads", "model", heads, 0, 1024, "attention heads; 0 = from the preset or config.json"),
    INT("intermediate", "model", intermediate, 0, 1 << 20, "feed-forward size; 0 = from the model"),
    INT("vocab_size", "model", vocab_size, 0, 1 << 24, "vocabulary size; 0 = from the model"),
    INT("max_position", "model", max_position, 0, 1 << 20, "position embeddings; 0 = from the model"),
    INT("type_vocab", "model", type_vocab, 0, 1024, "token type vocabulary; 0 = from the model"),
    SPEC("lowercase", "model", set_lowercase, get_lowercase, "lower-case text: true, false or auto (from the model)"),
    FLT("dropout", "model", dropout, 0, 0.999, "hidden and attention dropout probability, 0 <= p < 1"),

    STR("train_file", "data", train_file, "training data: CSV, TSV, JSONL or SQuAD JSON"),
    STR("dev_file", "data", dev_file, "evaluation data; empty = hold out dev_split of train_file"),
    STR("text_col", "data", text_col, "column with the text"),
    STR("text_pair_col", "data", text_pair_col, "column with the second text of a pair; empty = none"),
    STR("label_col", "data", label_col, "column with the label"),
    FLT("dev_split", "data", dev_split, 0, 0.99, "fraction held out for eval when there is no dev_file"),
    INT("max_examples", "data", max_examples, 0, BIG, "use only the first N examples; 0 = all"),

    ENUM("task", "train", task, task_names, "classify (sequence labels) or qa (SQuAD spans)"),
    ENUM("head", "train", head, head_names, "pooled ([CLS] classifier), span (per-token start/end) or flatten_dense"),
    INT("head_units", "train", head_units, 1, BIG, "flatten_dense: units of the Dense layer over the flattened sequence"),
    INT("towers", "train", towers, 1, 16, "flatten_dense: number of BERT towers"),
    INT("num_labels", "train", num_labels, 0, 1 << 20, "classes; 0 = from the data"),
    INT("max_len", "train", max_len, 8, 1 << 16, "tokens per example (truncate / pad to this)"),
    INT("doc_stride", "train", doc_stride, 0, 1 << 16, "qa: overlap between windows of a long context"),
    INT("batch_size", "train", batch_size, 1, 1 << 20, "examples per micro-batch"),
    INT("eval_batch_size", "train", eval_batch_size, 0, 1 << 20, "examples per eval batch; 0 = batch_size"),
    INT("epochs", "train", epochs, 0, 100000, "passes over the training data"),
    INT("max_steps", "train", max_steps, 0, BIG, "stop after N optimizer steps; 0 = epochs decide"),
    FLT("lr", "train", lr, 1e-12, 10, "peak learning rate"),
    FLT("weight_decay", "train", weight_decay, 0, 10, "AdamW decoupled weight decay"),
    FLT("warmup_ratio", "train", warmup_ratio, 0, 1, "fraction of steps with linear warm-up"),
    FLT("max_grad_norm", "train", max_grad_norm, 0, 1e9, "gradient clipping norm; 0 = no clipping"),
    FLT("adam_beta1", "train", adam_beta1, 0, 0.999999, "AdamW beta1, 0 <= b < 1"),
    FLT("adam_beta2", "train", adam_beta2, 0, 0.999999999, "AdamW beta2, 0 <= b < 1"),
    FLT("adam_eps", "train", adam_eps, 1e-30, 1, "AdamW epsilon"),
    SPEC("schedule", "train", set_schedule, get_schedule, "learning-rate schedule: linear or constant"),
    {"seed", "train", K_U64, OFF(seed), 0, 0, NULL, NULL, NULL, "random seed (weights init, dropout, shuffling)"},

    ENUM("precision", "train", precision, prec_names, "fp32, or mixed precision fp16 (loss scaling) / bf16"),
    SPEC("tf32", "train", set_tf32, get_tf32, "true: fp32 GEMMs may use TF32 tensor cores on cuda (faster, 10-bit mantissa inputs; PyTorch's allow_tf32); false (the default): full fp32"),
    INT("accumulate", "train", accumulate, 1, 1 << 20, "micro-batches per optimizer step (gradient accumulation)"),
    SPEC("recompute", "train", set_recompute, get_recompute, "gradient checkpointing: none, layers or attention"),
    SPEC("freeze", "train", set_freeze, NULL, "freeze parameters: none, embeddings, layers:N or embeddings,layers:N"),
    INT("freeze_embeddings", "train", freeze_embeddings, 0, 1, "1: embeddings get no gradient and no optimizer state"),
    INT("freeze_layers", "train", freeze_layers, 0, 1000, "the first N encoder layers are frozen"),
    ENUM("optimizer", "train", optimizer, optim_names, "adamw, adamw8bit (block-wise 8-bit moments) or adamw_torch_fused (engine pytorch: torch.optim.AdamW(fused=True), transformers 5's Trainer default; txkernel's trainer runs it as adamw)"),
    INT("adamw8_fp32_embeddings", "train", adamw8_fp32_embeddings, 0, 1, "adamw8bit: keep embeddings' state in fp32"),
    ENUM("attention", "train", attention, attn_names, "standard, fused (no LxL probabilities kept for backward) or auto (the default: fused on cuda and for a gpu: card, standard on the cpu)"),
    ENUM("engine", "train", engine, engine_names, "whose training step is planned: txkernel (its own) or pytorch (a transformers BertFor* step as PyTorch runs it, torchplan/)"),
    ENUM("attn_implementation", "train", attn_implementation, attn_impl_names, "engine pytorch: transformers' attention, sdpa (the default, as transformers 5) or eager"),
    SPEC("attention_dropout", "model", set_attention_dropout, get_attention_dropout, "engine pytorch: attention_probs_dropout_prob, 0 <= p < 1, or dropout (the default: the dropout key's value)"),
    ENUM("torch_version", "train", torch_version, torch_version_names, "engine pytorch: the versions followed, 2 (torch 2.x + transformers 5.x, the default; cuBLAS workspaces as torch 2.11 keeps them) or your torch's minor 2.0 .. 2.15 (where cuBLAS's workspaces live changed across them) or 1.13 (torch 1.13 + transformers 4.40, eager only) or 1.10 (torch 1.10 + transformers 4.15: 1.13's rules, and softmax keeps its input for backward)"),
    ENUM("api", "train", api, api_names, "the API advice writes fixes in: trainer (TrainingArguments lines), loop (plain PyTorch), txkernel (this YAML), keras (TensorFlow's Keras) or auto (the default: a pasted traceback's Trainer.train says trainer, a TensorFlow message keras; otherwise loop for engine pytorch, txkernel for engine txkernel)"),
    ENUM("batching", "train", batching, batching_names, "fixed (pad to max_len), dynamic (pad per batch) or buckets"),
    INT("buckets", "train", buckets, 1, 4096, "batching buckets: number of length buckets"),
    SPEC("empty_cache", "train", set_empty_cache, get_empty_cache, "release cached device memory: never, on_oom or every:N steps"),
    INT("empty_cache_every", "train", empty_cache_every, 0, BIG, "with empty_cache every:N, the N"),
    STR("output_dir", "train", output_dir, "where checkpoints go; empty = no checkpoints"),
    STR("resume_from", "train", resume_from, "a checkpoint-STEP folder (exact resume), an HF folder (weights only), or auto: the newest complete checkpoint in output_dir"),
    INT("log_every", "train", log_every, 1, BIG, "progress update every N steps"),
    SPEC("save_every", "train", set_save_every, get_save_every, "checkpoint-STEP in output_dir every N steps, or every 10min / 30s / 2h; 0 = at each epoch's end"),
    INT("keep_checkpoints", "train", keep_checkpoints, 0, BIG, "checkpoint-STEP folders kept (the newest); 0 = all"),
    ENUM("save_error", "train", save_error_stop, save_error_names, "a failed save (disk full): stop the run there (default) or continue training"),
    INT("overwrite", "train", overwrite, 0, 1, "true: write into an output_dir that holds a model or checkpoints txkernel did not write; false (default): refuse it, naming them"),

    ENUM("device", "device", device, device_names, "auto (cuda if present, else cpu), cpu, cuda or meta (plan only)"),
    {"capacity", "device", K_BYTES, OFF(capacity), 0, 0, NULL, NULL, NULL, "simulated device memory (7.43GiB, 800MiB, bytes); 0 = the device's"},
    SPEC("gpu", "device", set_gpu, get_gpu, "a GPU profile (t4, v100-16, a100-40, ...) for capacity and speed estimates"),
    INT("threads", "device", threads, 0, 4096, "cpu threads; 0 = all cores"),
    INT("world_size", "device", world_size, 1, 1024, "data-parallel ranks: N GPUs in this process on cuda, N MPI processes (mpirun) on the cpu; batch_size is per rank"),
    INT("zero", "device", zero, 0, 2, "with world_size > 1: 0 all-reduces the gradients, 1 shards AdamW's state over the ranks, 2 shards the gradients too"),
    ENUM("parallel", "device", parallel, parallel_names, "engine pytorch on two or more GPUs (gpu: t4x2 or world_size): dataparallel (the default: torch.nn.DataParallel, what the Trainer does on two GPUs without a launcher), ddp (DistributedDataParallel: torchrun / accelerate launch) or zero2 (DeepSpeed ZeRO stage 2 through the Trainer's deepspeed=)"),
    INT("bucket_cap_mb", "device", bucket_cap_mb, 0, 1 << 20, "engine pytorch, parallel: ddp: DDP's bucket_cap_mb (TrainingArguments' ddp_bucket_cap_mb); 0 = DDP's default, 25 MiB buckets after a first of 1 MiB"),
};
#define NKEYS (sizeof KEYS / sizeof KEYS[0])

/* Spellings users bring from HF TrainingArguments, Keras and the seed threads. */
static const struct { const char *alias, *key; } ALIASES[] = {
    {"batch", "batch_size"}, {"train_batch_size", "batch_size"},
    {"per_device_train_batch_size", "batch_size"},
    {"per_device_eval_batch_size", "eval_batch_size"},
    {"learning_rate", "lr"}, {"max_length", "max_len"}, {"max_seq_length", "max_len"},
    {"seq_len", "max_len"}, {"num_train_epochs", "epochs"}, {"num_epochs", "epochs"},
    {"gradient_accumulation_steps", "accumulate"}, {"gradient_checkpointing", "recompute"},
    {"optim", "optimizer"}, {"num_layers", "layers"}, {"num_hidden_layers", "layers"},
    {"hidden_size", "hidden"}, {"num_attention_heads", "heads"},
    {"intermediate_size", "intermediate"}, {"warmup", "warmup_ratio"},
    {"lr_scheduler_type", "schedule"}, {"train", "train_file"}, {"dev", "dev_file"},
    {"eval_file", "dev_file"}, {"validation_file", "dev_file"}, {"text", "text_col"},
    {"label", "label_col"}, {"text_pair", "text_pair_col"}, {"profile", "gpu"},
    {"memory", "capacity"}, {"name", "model"}, {"path", "model"},
    {"save_steps", "save_every"}, {"save_total_limit", "keep_checkpoints"},
    {"resume_from_checkpoint", "resume_from"}, {"overwrite_output_dir", "overwrite"},
    {"attention_probs_dropout_prob", "attention_dropout"}, {"hidden_dropout_prob", "dropout"},
    {"ddp_bucket_cap_mb", "bucket_cap_mb"},
};

static const char *const SECTIONS[] = {"model", "data", "train", "device", NULL};

static const keydef *key_find(const char *name) {
    for (size_t i = 0; i < NKEYS; i++)
        if (!strcmp(KEYS[i].name, name)) return &KEYS[i];
    for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
        if (!strcmp(ALIASES[i].alias, name)) return key_find(ALIASES[i].key);
    return NULL;
}

static int is_section(const char *s) {
    for (int i = 0; SECTIONS[i]; i++) if (!strcmp(SECTIONS[i], s)) return 1;
    return 0;
}

/* "train.batch_size" and "batch_size" are the same key. */
static const keydef *key_find_dotted(const char *name) {
    const char *dot = strrchr(name, '.');
    if (dot) {
        char sec[64];
        size_t n = (size_t)(dot - name);
        if (n >= sizeof sec) return NULL;
        memcpy(sec, name, n);
        sec[n] = 0;
        if (!is_section(sec)) return NULL;
        return key_find(dot + 1);
    }
    return key_find(name);
}

/* Levenshtein distance, capped strings (key names are short). */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            /* a swapped pair of letters is one typo, not two */
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < d[i][j])
                d[i][j] = d[i - 2][j - 2] + 1;
        }
    return d[la][lb];
}

/* The closest known key or alias, or NULL when nothing is close. A key that
 * contains the typed name (or the reverse) counts as close: "batchsize" and
 * "epoch" are what people type. */
static const char *closest_key(const char *name) {
    const char *best = NULL;
    int bestd = 99;
    char squeezed[128];
    size_t k = 0;
    for (const char *p = name; *p && k + 1 < sizeof squeezed; p++)
        if (*p != '_' && *p != '-') squeezed[k++] = (char)tolower((unsigned char)*p);
    squeezed[k] = 0;
    for (size_t i = 0; i < NKEYS + sizeof ALIASES / sizeof ALIASES[0]; i++) {
        const char *cand = i < NKEYS ? KEYS[i].name : ALIASES[i - NKEYS].alias;
        const char *target = i < NKEYS ? cand : ALIASES[i - NKEYS].key;
        char sq[128];
        size_t m = 0;
        for (const char *p = cand; *p && m + 1 < sizeof sq; p++) if (*p != '_') sq[m++] = *p;
        sq[m] = 0;
        int d = strcmp(sq, squeezed) == 0 ? 0 : edit_distance(cand, name);
        if (d < bestd) { bestd = d; best = target; }
    }
    size_t len = strlen(name);
    int limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
    return bestd <= limit ? best : NULL;
}

static void unknown_key_msg(const char *name, char *buf, size_t n) {
    const char *near = closest_key(name);
    if (near) snprintf(buf, n, "unknown key '%s' (did you mean '%s'?)", name, near);
    else snprintf(buf, n, "unknown key '%s' (%%txkeys or `txk keys` lists every key)", name);
}

/* ---- setting one key from text ---------------------------------------- */

static void fmt_num(double v, char *buf, size_t n) {
    if (v == floor(v)) snprintf(buf, n, "%.0f", v);
    else snprintf(buf, n, "%g", v);
}

/* Sets k from `val`; on failure fills why (without the key name) and leaves c alone. */
static int key_set(tk_config *c, const keydef *k, const char *val, char *why, size_t n) {
    char *field = (char *)c + k->off;
    char lo[32], hi[32];
    switch (k->kind) {
    case K_STR: {
        size_t len = strlen(val);
        if (len >= k->size) {
            snprintf(why, n, "value is %zu characters; at most %zu fit", len, k->size - 1);
            return -1;
        }
        memset(field, 0, k->size);
        memcpy(field, val, len);
        return 0;
    }
    case K_INT: {
        long long v;
        double d;
        int b = parse_bool(val);
        /* `freeze_embeddings: true` is an int flag written as a YAML bool */
        if (k->max == 1 && b >= 0) v = b;
        else if (parse_long(val, &v)) {
            if (!parse_double(val, &d)) snprintf(why, n, "'%s' is not a whole number", val);
            else snprintf(why, n, "'%s' is not an integer", val);
            return -1;
        }
        fmt_num(k->min, lo, sizeof lo);
        fmt_num(k->max, hi, sizeof hi);
        if (v < k->min || v > k->max) {
            if (k->max >= BIG) snprintf(why, n, "%lld is out of range (must be >= %s)", v, lo);
            else snprintf(why, n, "%lld is out of range (must be %s..%s)", v, lo, hi);
            return -1;
        }
        *(int *)field = (int)v;
        return 0;
    }
    case K_FLOAT: {
        double v;
        if (parse_double(val, &v)) { snprintf(why, n, "'%s' is not a number", val); return -1; }
        if (v < k->min || v > k->max) {
            fmt_num(k->min, lo, sizeof lo);
            fmt_num(k->max, hi, sizeof hi);
            if (k->min > 0 && k->min < 1e-6) snprintf(why, n, "%g is out of range (must be > 0)", v);
            else snprintf(why, n, "%g is out of range (must be %s..%s)", v, lo, hi);
            return -1;
        }
        *(float *)field = (float)v;
        return 0;
    }
    case K_U64: {
        char *end;
        errno = 0;
        if (val[0] == '-') { snprintf(why, n, "'%s' must not be negative", val); return -1; }
        unsigned long long v = strtoull(val, &end, 10);
        if (errno || end == val || *end) { snprintf(why, n, "'%s' is not a whole number", val); return -1; }
        *(uint64_t *)field = (uint64_t)v;
        return 0;
    }
    case K_BYTES: {
        size_t v;
        if (val[0] == '-') { snprintf(why, n, "'%s' must not be negative", val); return -1; }
        if (tk_parse_bytes(val, &v)) {
            snprintf(why, n, "'%s' is not a size (write e.g. 7.43GiB, 800MiB, 16GB or a byte count)", val);
            return -1;
        }
        *(size_t *)field = v;
        return 0;
    }
    case K_ENUM:
        for (int i = 0; k->choices[i]; i++)
            if (!strcasecmp(val, k->choices[i])) {
                *(int *)field = i;
                return 0;
            }
        {
            char list[256];
            join_choices(k->choices, list, sizeof list);
            snprintf(why, n, "'%s' is not one of %s", val, list);
        }
        return -1;
    case K_SPECIAL: {
        tk_config tmp = *c;
        if (k->set(&tmp, val, why, n)) return -1;
        *c = tmp;
        return 0;
    }
    }
    return -1;
}

static void key_get(const tk_config *c, const keydef *k, char *buf, size_t n) {
    const char *field = (const char *)c + k->off;
    switch (k->kind) {
    case K_STR: snprintf(buf, n, "%s", field); break;
    case K_INT: snprintf(buf, n, "%d", *(const int *)field); break;
    case K_FLOAT: snprintf(buf, n, "%.9g", (double)*(const float *)field); break;
    case K_U64: snprintf(buf, n, "%" PRIu64, *(const uint64_t *)field); break;
    case K_BYTES: snprintf(buf, n, "%zu", *(const size_t *)field); break;
    case K_ENUM: snprintf(buf, n, "%s", k->choices[*(const int *)field]); break;
    case K_SPECIAL: k->get(c, buf, n); break;
    }
}

tk_status tk_config_set(tk_config *c, const char *key, const char *value, tk_err *err) {
    const keydef *k = key_find_dotted(key);
    char why[600];
    if (!k) {
        unknown_key_msg(key, why, sizeof why);
        tk_err_set(err, TK_EINVAL, "%s", why);
        return TK_EINVAL;
    }
    if (key_set(c, k, value, why, sizeof why)) {
        tk_err_set(err, TK_EINVAL, "%s: %s", key, why);
        return TK_EINVAL;
    }
    return TK_OK;
}

/* ---- defaults ------------------------------------------------------------ */

void tk_config_defaults(tk_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->model, sizeof c->model, "bert-base-cased");
    snprintf(c->revision, sizeof c->revision, "main");
    c->lowercase = -1;
    c->dropout = 0.1f;
    snprintf(c->text_col, sizeof c->text_col, "text");
    snprintf(c->label_col, sizeof c->label_col, "label");
    c->dev_split = 0.1f;
    c->task = TK_TASK_CLASSIFY;
    c->head = TK_HEAD_POOLED;
    c->head_units = 1604;
    c->towers = 1;
    c->max_len = 128;
    c->doc_stride = 128 / 4;
    c->batch_size = 32;
    c->epochs = 3;
    c->lr = 2e-5f;
    c->weight_decay = 0.01f;
    c->max_grad_norm = 1.0f;
    c->adam_beta1 = 0.9f;
    c->adam_beta2 = 0.999f;
    c->adam_eps = 1e-8f;
    snprintf(c->schedule, sizeof c->schedule, "linear");
    c->seed = 42;
    c->device = TK_DEVICE_CPU;
    c->precision = TK_PREC_FP32;
    c->attention = TK_ATTN_AUTO;
    c->attention_dropout = -1.0f;
    c->accumulate = 1;
    c->world_size = 1;
    c->buckets = 8;
    c->log_every = 10;
    c->keep_checkpoints = 3;
    c->save_error_stop = 1; /* a run never ends "ok" without its results */
}

const char *tk_attention_name(tk_attention a) {
    return a >= TK_ATTN_STANDARD && a <= TK_ATTN_AUTO ? attn_names[a] : "?";
}

/* ---- YAML ------------------------------------------------------------------ */

typedef struct {
    const char *source;
    int line0;       /* added to YAML line numbers: where the document starts in its source */
    char msg[1024];
    int line;
    /* keys already set in this document, to catch duplicates */
    const keydef *seen[128];
    int nseen;
} parse_ctx;

static int fail(parse_ctx *px, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(parse_ctx *px, int line, const char *fmt, ...) {
    char body[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    if (line > 0) line += px->line0;
    snprintf(px->msg, sizeof px->msg, "%s:%d: %s", px->source, line, body);
    px->line = line;
    return -1;
}

static const char *node_kind(yaml_node_t *n) {
    return n->type == YAML_MAPPING_NODE ? "a map" : n->type == YAML_SEQUENCE_NODE ? "a list" : "a value";
}

static int apply_mapping(tk_config *c, yaml_document_t *doc, yaml_node_t *map, const char *section,
                         parse_ctx *px);

/* A scalar node's text: `~`, `null` and an empty plain scalar are "no value". */
static int scalar_is_null(yaml_node_t *v) {
    if (v->type != YAML_SCALAR_NODE || v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *s = (const char *)v->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcasecmp(s, "null");
}

static int apply_pair(tk_config *c, yaml_document_t *doc, yaml_node_t *kn, yaml_node_t *vn,
                      const char *section, parse_ctx *px) {
    int line = (int)kn->start_mark.line + 1;
    if (kn->type != YAML_SCALAR_NODE) return fail(px, line, "a key must be a plain name, not %s", node_kind(kn));
    const char *name = (const char *)kn->data.scalar.value;

    /* A nested section: `model: {...}`, `train: {...}`, `data:`, `device:`. */
    if (vn->type == YAML_MAPPING_NODE) {
        if (is_section(name) && !section) return apply_mapping(c, doc, vn, name, px);
        if (!key_find(name)) {
            char why[300];
            unknown_key_msg(name, why, sizeof why);
            return fail(px, line, "%s", why);
        }
        return fail(px, line, "%s: expected a value, got a map", name);
    }

    char full[160];
    snprintf(full, sizeof full, "%s", name);
    const keydef *k = NULL;
    /* Inside a section, section-qualified aliases first ("data: {train: x}"). */
    if (section && !strcmp(section, "data")) {
        if (!strcmp(name, "train")) k = key_find("train_file");
        else if (!strcmp(name, "dev") || !strcmp(name, "eval")) k = key_find("dev_file");
    }
    if (!k) k = key_find_dotted(name);
    if (!k) {
        char why[300];
        unknown_key_msg(name, why, sizeof why);
        return fail(px, line, "%s", why);
    }
    for (int i = 0; i < px->nseen; i++)
        if (px->seen[i] == k && k->kind != K_SPECIAL)
            return fail(px, line, "%s: set twice in this document", name);
    if (px->nseen < (int)(sizeof px->seen / sizeof px->seen[0])) px->seen[px->nseen++] = k;

    int vline = (int)vn->start_mark.line + 1;
    if (vn->type == YAML_SEQUENCE_NODE) {
        /* Only `freeze: [embeddings, layers:6]` takes a list: join it. */
        if (strcmp(k->name, "freeze") != 0) return fail(px, vline, "%s: expected a value, got a list", name);
        char joined[256] = "";
        size_t used = 0;
        for (yaml_node_item_t *it = vn->data.sequence.items.start; it < vn->data.sequence.items.top; it++) {
            yaml_node_t *item = yaml_document_get_node(doc, *it);
            if (!item || item->type != YAML_SCALAR_NODE)
                return fail(px, vline, "%s: list items must be values", name);
            used += (size_t)snprintf(joined + used, used < sizeof joined ? sizeof joined - used : 0, "%s%s",
                                     used ? "," : "", (const char *)item->data.scalar.value);
        }
        char why[600];
        if (key_set(c, k, joined, why, sizeof why)) return fail(px, vline, "%s: %s", name, why);
        return 0;
    }
    if (scalar_is_null(vn)) {
        /* an empty string key may be cleared with `key: ""`; a bare `key:` is a slip */
        return fail(px, vline, "%s: has no value", name);
    }
    const char *val = (const char *)vn->data.scalar.value;
    /* `device: {gpu: t4}` is handled as a section; `device: t4` means the profile. */
    if (!strcmp(k->name, "device") && tk_gpu_profile_find(val)) k = key_find("gpu");
    char why[600];
    if (key_set(c, k, val, why, sizeof why)) return fail(px, vline, "%s: %s", name, why);
    return 0;
}

static int apply_mapping(tk_config *c, yaml_document_t *doc, yaml_node_t *map, const char *section,
                         parse_ctx *px) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(doc, p->value);
        if (!kn || !vn) return fail(px, 0, "malformed document");
        if (apply_pair(c, doc, kn, vn, section, px)) return -1;
    }
    return 0;
}

tk_status tk_config_parse_yaml(tk_config *c, const char *yaml, size_t len, const char *source,
                               tk_err *err) {
    return tk_config_parse_yaml_at(c, yaml, len, source, 1, err);
}

tk_status tk_config_parse_yaml_at(tk_config *c, const char *yaml, size_t len, const char *source,
                                  int first_line, tk_err *err) {
    parse_ctx px;
    memset(&px, 0, sizeof px);
    px.source = source ? source : "config";
    px.line0 = first_line > 0 ? first_line - 1 : 0;
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        tk_err_set(err, TK_EINVAL, "%s: could not start the YAML parser", px.source);
        return TK_EINVAL;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        int line = (int)parser.problem_mark.line + 1 + px.line0;
        tk_err_set(err, TK_EINVAL, "%s:%d: YAML syntax error: %s%s%s", px.source, line,
                   parser.problem ? parser.problem : "malformed",
                   parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return TK_EINVAL;
    }
    tk_config work = *c;
    int rc = 0;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        if (root->type == YAML_MAPPING_NODE) rc = apply_mapping(&work, &doc, root, NULL, &px);
        else if (!scalar_is_null(root))
            rc = fail(&px, (int)root->start_mark.line + 1,
                      "expected `key: value` lines, got %s", node_kind(root));
    }
    /* A second document (`---`) would be silently ignored; say so instead. */
    if (!rc) {
        yaml_document_t more;
        if (yaml_parser_load(&parser, &more)) {
            if (yaml_document_get_root_node(&more))
                rc = fail(&px, (int)yaml_document_get_root_node(&more)->start_mark.line + 1,
                          "only one YAML document is allowed (remove the second '---')");
            yaml_document_delete(&more);
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    if (rc) {
        tk_err_set(err, TK_EINVAL, "%s", px.msg);
        return TK_EINVAL;
    }
    *c = work;
    return TK_OK;
}

/* ---- model dimensions ------------------------------------------------------ */

tk_status tk_config_resolve_model(tk_config *c, tk_err *err) {
    tk_bert_dims d;
    int lower = -1;
    tk_status st = tk_bert_dims_resolve(c->model, &d, &lower, err);
    if (st != TK_OK) return st;
    /* Non-zero fields are the user's overrides of the preset; keep them. */
    if (!c->hidden) c->hidden = d.hidden;
    if (!c->layers) c->layers = d.layers;
    if (!c->heads) c->heads = d.heads;
    if (!c->intermediate) c->intermediate = d.intermediate;
    if (!c->vocab_size) c->vocab_size = d.vocab_size;
    if (!c->max_position) c->max_position = d.max_position;
    if (!c->type_vocab) c->type_vocab = d.type_vocab;
    if (c->lowercase < 0 && lower >= 0) c->lowercase = lower;
    return TK_OK;
}

/* ---- validation --------------------------------------------------------- */

tk_status tk_config_validate(const tk_config *c, tk_err *err) {
#define BAD(...) do { tk_err_set(err, TK_EINVAL, __VA_ARGS__); return TK_EINVAL; } while (0)
    if (!c->model[0]) BAD("model: is empty (name a preset such as bert-base-cased, or a model folder)");
    if (c->batch_size < 1) BAD("batch_size: must be >= 1 (got %d)", c->batch_size);
    if (c->accumulate < 1) BAD("accumulate: must be >= 1 (got %d)", c->accumulate);
    if (c->eval_batch_size < 0) BAD("eval_batch_size: must be >= 0 (got %d)", c->eval_batch_size);
    if (c->max_len < 8) BAD("max_len: must be >= 8 (got %d)", c->max_len);
    if (c->epochs < 1 && c->max_steps < 1)
        BAD("epochs: is 0 and max_steps is 0, so nothing would train (set epochs >= 1 or max_steps)");
    if (!(c->lr > 0)) BAD("lr: must be > 0 (got %g)", (double)c->lr);
    if (c->hidden && c->heads && c->hidden % c->heads)
        BAD("heads: %d does not divide hidden %d", c->heads, c->hidden);
    if (c->max_position && c->max_len > c->max_position)
        BAD("max_len: %d exceeds the model's max_position %d (BERT has no positions past it)",
            c->max_len, c->max_position);
    if (c->layers && c->freeze_layers > c->layers)
        BAD("freeze_layers: %d but the model has %d layers", c->freeze_layers, c->layers);
    if (c->task == TK_TASK_QA && c->head == TK_HEAD_POOLED)
        BAD("head: pooled does not predict answer spans; task qa needs head span or flatten_dense");
    if (c->task == TK_TASK_CLASSIFY && c->head == TK_HEAD_SPAN)
        BAD("head: span predicts answer spans; task classify needs head pooled or flatten_dense");
    if (c->head == TK_HEAD_FLATTEN_DENSE && c->head_units < 1)
        BAD("head_units: flatten_dense needs head_units >= 1 (got %d)", c->head_units);
    if (c->towers < 1) BAD("towers: must be >= 1 (got %d)", c->towers);
    if (c->towers > 1 && c->head != TK_HEAD_FLATTEN_DENSE)
        BAD("towers: %d towers are only used with head flatten_dense", c->towers);
    if (c->task == TK_TASK_QA && c->doc_stride >= c->max_len)
        BAD("doc_stride: %d must be smaller than max_len %d", c->doc_stride, c->max_len);
    if (c->empty_cache == TK_EMPTY_EVERY && c->empty_cache_every < 1)
        BAD("empty_cache: every:N needs N >= 1 (got %d)", c->empty_cache_every);
    if (c->batching == TK_BATCH_BUCKETS && c->buckets < 1)
        BAD("buckets: must be >= 1 with batching buckets (got %d)", c->buckets);
    if (!(c->dropout >= 0 && c->dropout < 1)) BAD("dropout: must be 0 <= p < 1 (got %g)", (double)c->dropout);
    if (!(c->dev_split >= 0 && c->dev_split < 1)) BAD("dev_split: must be 0 <= f < 1 (got %g)", (double)c->dev_split);
    if (strcmp(c->schedule, "linear") && strcmp(c->schedule, "constant"))
        BAD("schedule: '%s' is not one of linear, constant", c->schedule);
    if (c->gpu[0] && !tk_gpu_profile_find(c->gpu)) BAD("gpu: '%s' is not a known GPU profile", c->gpu);
    if (c->adamw8_fp32_embeddings && c->optimizer != TK_OPTIM_ADAMW8)
        BAD("adamw8_fp32_embeddings: only applies with optimizer adamw8bit");
    return TK_OK;
#undef BAD
}

/* ---- output --------------------------------------------------------------- */

/* A YAML scalar that reads back as the same string. */
static void yaml_quote(const char *s, char *buf, size_t n) {
    size_t o = 0;
    if (n < 3) { if (n) buf[0] = 0; return; }
    buf[o++] = '"';
    for (const char *p = s; *p && o + 7 < n; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '"' || ch == '\\') { buf[o++] = '\\'; buf[o++] = (char)ch; }
        else if (ch < 0x20) o += (size_t)snprintf(buf + o, n - o, "\\x%02x", ch);
        else buf[o++] = (char)ch;
    }
    buf[o++] = '"';
    buf[o] = 0;
}

static void key_get_yaml(const tk_config *c, const keydef *k, char *buf, size_t n) {
    char raw[TK_PATH_MAX + 8];
    key_get(c, k, raw, sizeof raw);
    if (k->kind == K_STR) yaml_quote(raw, buf, n);
    else snprintf(buf, n, "%s", raw);
}

typedef struct { char *p; size_t len, cap; int oom; } sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int w = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (w < 0) { b->oom = 1; return; }
        if (b->p && (size_t)w < room) { b->len += (size_t)w; return; }
        size_t ncap = (b->cap ? b->cap * 2 : 1024) + (size_t)w;
        char *np = tk_realloc(b->p, ncap);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = ncap;
    }
}

static char *sb_take(sbuf *b) {
    if (b->oom) { free(b->p); return NULL; }
    if (!b->p) { b->p = tk_malloc(1); if (b->p) b->p[0] = 0; }
    return b->p;
}

char *tk_config_to_yaml(const tk_config *c) {
    sbuf b = {0};
    for (int s = 0; SECTIONS[s]; s++) {
        sb_add(&b, "%s:\n", SECTIONS[s]);
        for (size_t i = 0; i < NKEYS; i++) {
            const keydef *k = &KEYS[i];
            if (strcmp(k->section, SECTIONS[s]) || (k->kind == K_SPECIAL && !k->get)) continue;
            char val[TK_PATH_MAX * 2 + 16];
            key_get_yaml(c, k, val, sizeof val);
            sb_add(&b, "  %s: %s\n", k->name, val);
        }
    }
    return sb_take(&b);
}

char *tk_config_diff(const tk_config *a, const tk_config *b) {
    sbuf out = {0};
    for (size_t i = 0; i < NKEYS; i++) {
        const keydef *k = &KEYS[i];
        if (k->kind == K_SPECIAL && !k->get) continue;
        char va[TK_PATH_MAX + 8], vb[TK_PATH_MAX + 8];
        key_get(a, k, va, sizeof va);
        key_get(b, k, vb, sizeof vb);
        if (strcmp(va, vb)) {
            char qa[TK_PATH_MAX * 2 + 16], qb[TK_PATH_MAX * 2 + 16];
            key_get_yaml(a, k, qa, sizeof qa);
            key_get_yaml(b, k, qb, sizeof qb);
            sb_add(&out, "%s: %s -> %s\n", k->name, qa, qb);
        }
    }
    return sb_take(&out);
}

static const char *key_names[NKEYS + 1];
static void key_names_fill(void) {
    for (size_t i = 0; i < NKEYS; i++) key_names[i] = KEYS[i].name;
}

const char *const *tk_config_keys(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, key_names_fill);
    return key_names;
}

const char *tk_config_key_help(const char *key) {
    const keydef *k = key ? key_find_dotted(key) : NULL;
    return k ? k->help : NULL;
}
