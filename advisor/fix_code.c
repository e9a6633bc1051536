/* fix_code.c — a fix written as the code the user changes, in the API they
 * train with (tk_config.api): transformers' Trainer gets TrainingArguments
 * and tokenizer lines, a plain PyTorch loop gets loop code, a txkernel
 * config gets its YAML lines. The code is read off the difference between
 * the config as given and the config after the fix, so a combination of
 * fixes is one piece of code, and a setting the config has already is never
 * written again. Every number in it is the user's (their batch, their
 * max_len, their GPU count) or one the fix computed from them; the versions
 * the user runs (torch_version) pick the spelling: transformers 5.2+ groups
 * by length with train_sampling_strategy="group_by_length", 4.x and
 * 5.0-5.1 with group_by_length=True (their training_args.py).
 *
 * Several GPUs: txkernel plans world_size N on cuda but does not start such
 * a run (tk_config_plan_only), so its code is paired with the PyTorch
 * recipe for the same split (accelerate launch / torchrun / DeepSpeed
 * ZeRO). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_advisor.h"
#include "tk_fix_code.h"

tk_api tk_config_api(const tk_config *c) {
    if (c->api != TK_API_AUTO) return c->api;
    return c->engine == TK_ENGINE_PYTORCH ? TK_API_LOOP : TK_API_TXKERNEL;
}

const char *tk_api_name(tk_api a) {
    switch (a) {
    case TK_API_TRAINER: return "trainer";
    case TK_API_LOOP: return "loop";
    case TK_API_TXKERNEL: return "txkernel";
    case TK_API_KERAS: return "keras";
    default: return "auto";
    }
}

int tk_config_plan_only(const tk_config *c) {
    /* a card's profile or device: cuda is a run on a GPU; several ranks on
     * the cpu are MPI processes, which txk starts */
    return c->engine == TK_ENGINE_TXKERNEL && tk_config_world_size(c) > 1 && (c->device == TK_DEVICE_CUDA || c->gpu[0]);
}

/* A growing text in a memstream; every write checked at the end. */
typedef struct {
    char *buf;
    size_t len;
    FILE *f;
} code_buf;

static void put(code_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(code_buf *b, const char *fmt, ...) {
    if (!b->f) return;
    if (ftell(b->f) > 0) fputc('\n', b->f);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(b->f, fmt, ap);
    va_end(ap);
}

static int acc_of(const tk_config *c) { return c->accumulate > 1 ? c->accumulate : 1; }

/* The PyTorch recipe for a split over several GPUs: `ranks` processes (or
 * DataParallel's one), ZeRO stage `zero` under TK_PAR_ZERO2; the lines are
 * tk_launch_code's, the pasted message's too. */
static void gpus_recipe(code_buf *b, tk_api api, tk_parallel how, int zero, int ranks) {
    char r[16], code[600];
    snprintf(r, sizeof r, "%d", ranks);
    tk_launch_code(code, sizeof code, how, zero, api == TK_API_TRAINER, r);
    put(b, "%s", code);
}

static void txkernel_code(code_buf *b, const tk_config *from, const tk_config *to) {
    char *d = tk_config_diff(from, to);
    if (!d) {
        if (b->f) fclose(b->f), b->f = NULL;
        return;
    }
    /* "key: old -> new" lines: the new value is what the user writes */
    for (char *line = d; *line;) {
        char *nl = strchr(line, '\n'), *colon = strchr(line, ':'), *arrow = strstr(line, " -> ");
        size_t k = nl ? (size_t)(nl - line) : strlen(line);
        if (colon && arrow && arrow < line + k)
            put(b, "%.*s: %.*s", (int)(colon - line), line, (int)(line + k - arrow - 4), arrow + 4);
        line += k + (nl ? 1 : 0);
    }
    free(d);
    if (tk_config_plan_only(to)) {
        put(b, "# plan only: txkernel plans %d GPUs on cuda but does not start that run; the same split in PyTorch:",
            tk_config_world_size(to));
        gpus_recipe(b, TK_API_TRAINER, to->zero ? TK_PAR_ZERO2 : TK_PAR_DDP, to->zero, tk_config_world_size(to));
    }
}

/* What the Trainer and the loop share: the tokenizer, frozen weights, the
 * model's attention. */
static void model_lines(code_buf *b, const tk_config *from, const tk_config *to, tk_api api) {
    int dyn = from->batching == TK_BATCH_FIXED && to->batching != TK_BATCH_FIXED;
    if (to->max_len != from->max_len && to->batching == TK_BATCH_FIXED)
        put(b, "enc = tokenizer(texts, truncation=True, padding=\"max_length\", max_length=%d)   # yours: %d",
            to->max_len, from->max_len);
    else if (to->max_len != from->max_len || dyn)
        put(b, "enc = tokenizer(texts, truncation=True, max_length=%d)   # no padding here: the collator pads each "
               "batch to its longest", to->max_len);
    if (dyn && api == TK_API_TRAINER)
        put(b, "trainer = Trainer(model=model, args=args, train_dataset=train_ds, "
               "data_collator=DataCollatorWithPadding(tokenizer))");
    if (to->freeze_embeddings && !from->freeze_embeddings)
        put(b, "for p in model.bert.embeddings.parameters():\n    p.requires_grad_(False)");
    if (to->freeze_layers > from->freeze_layers)
        put(b, "for layer in model.bert.encoder.layer[:%d]:\n    layer.requires_grad_(False)", to->freeze_layers);
    const char *cls = to->task == TK_TASK_QA ? "AutoModelForQuestionAnswering" : "AutoModelForSequenceClassification";
    if (to->attn_implementation != from->attn_implementation || to->attention != from->attention)
        put(b, "model = %s.from_pretrained(\"%s\", attn_implementation=\"sdpa\")   # memory-efficient attention",
            cls, to->model);
    if (to->head != from->head)
        put(b, "model = %s.from_pretrained(\"%s\")   # the task's own head, per token or pooled", cls, to->model);
}

static void trainer_code(code_buf *b, const tk_config *from, const tk_config *to) {
    char kw[600] = "", open[TK_PATH_MAX + 48];
    size_t w = 0;
#define KW(...) (w += (size_t)snprintf(kw + w, w < sizeof kw ? sizeof kw - w : 0, __VA_ARGS__), \
                 w = w < sizeof kw ? w : sizeof kw - 1)
    int batch = to->batch_size != from->batch_size || acc_of(to) != acc_of(from);
    if (batch)
        KW("%sper_device_train_batch_size=%d, gradient_accumulation_steps=%d", w ? ", " : "", to->batch_size, acc_of(to));
    if (to->precision != from->precision)
        KW("%s%s", w ? ", " : "", to->precision == TK_PREC_BF16 ? (from->precision == TK_PREC_FP16 ? "fp16=False, bf16=True"
                                                                                                   : "bf16=True")
                                                                : "fp16=True");
    if (to->recompute != TK_RECOMPUTE_NONE && from->recompute == TK_RECOMPUTE_NONE)
        KW("%sgradient_checkpointing=True", w ? ", " : "");
    if (to->optimizer == TK_OPTIM_ADAMW8 && from->optimizer != TK_OPTIM_ADAMW8) KW("%soptim=\"adamw_bnb_8bit\"", w ? ", " : "");
    if (to->batching == TK_BATCH_BUCKETS && from->batching != TK_BATCH_BUCKETS)
        KW("%s%s", w ? ", " : "", to->torch_version == TK_TORCH_2 ? "train_sampling_strategy=\"group_by_length\""
                                                                  : "group_by_length=True");
    int eb_from = from->eval_batch_size > 0 ? from->eval_batch_size : from->batch_size;
    if (to->eval_batch_size > 0 && to->eval_batch_size != eb_from)
        KW("%sper_device_eval_batch_size=%d", w ? ", " : "", to->eval_batch_size);
    int empty = to->empty_cache == TK_EMPTY_EVERY && !(from->empty_cache == TK_EMPTY_EVERY &&
                                                       from->empty_cache_every == to->empty_cache_every);
    if (empty && to->torch_version == TK_TORCH_2) KW("%storch_empty_cache_steps=%d", w ? ", " : "", to->empty_cache_every);
#undef KW
    if (w) put(b, "%s%s)", tk_ta_open(open, sizeof open, to->output_dir, to->torch_version), kw);
    if (batch)
        put(b, "# your %d x %d = %d examples per optimizer step%s", from->batch_size, acc_of(from),
            from->batch_size * acc_of(from),
            to->batch_size * acc_of(to) * tk_config_world_size(to) == from->batch_size * acc_of(from) * tk_config_world_size(from)
                ? ", kept" : "; this changes it (retune the learning rate)");
    if (empty && to->torch_version != TK_TORCH_2)
        put(b, "# transformers 4.40 has no torch_empty_cache_steps (4.45+): a TrainerCallback whose on_step_end calls "
               "torch.cuda.empty_cache()");
    model_lines(b, from, to, TK_API_TRAINER);
}

/* A plain loop: the lines outside the loop (bucketed sampler, 8-bit AdamW,
 * eval batch, frozen weights, attention), then the whole loop body as the
 * fix leaves it (tk_loop_code) when the batch, the accumulation, the
 * padding, the precision or recompute change. */
static void loop_code(code_buf *b, const tk_config *from, const tk_config *to) {
    int dyn = to->batching != TK_BATCH_FIXED && from->batching == TK_BATCH_FIXED;
    int batch = to->batch_size != from->batch_size || acc_of(to) != acc_of(from);
    int buckets = to->batching == TK_BATCH_BUCKETS && from->batching != TK_BATCH_BUCKETS;
    int prec = to->precision != from->precision;
    int ckpt = to->recompute != TK_RECOMPUTE_NONE && from->recompute == TK_RECOMPUTE_NONE;
    if (buckets)
        put(b, "sampler = LengthGroupedSampler(%d, lengths=lengths)   # transformers.trainer_pt_utils; lengths: each "
               "example's token count\nloader = DataLoader(train_ds, batch_size=%d, sampler=sampler, "
               "collate_fn=DataCollatorWithPadding(tokenizer))", to->batch_size, to->batch_size);
    if (to->optimizer == TK_OPTIM_ADAMW8 && from->optimizer != TK_OPTIM_ADAMW8)
        put(b, "import bitsandbytes as bnb\noptimizer = bnb.optim.AdamW8bit(model.parameters(), lr=%g, weight_decay=%g)",
            (double)to->lr, (double)to->weight_decay);
    int eb_from = from->eval_batch_size > 0 ? from->eval_batch_size : from->batch_size;
    if (to->eval_batch_size > 0 && to->eval_batch_size != eb_from)
        put(b, "eval_loader = DataLoader(eval_ds, batch_size=%d)", to->eval_batch_size);
    if (to->empty_cache == TK_EMPTY_EVERY && from->empty_cache != TK_EMPTY_EVERY)
        put(b, "torch.cuda.empty_cache()   # after every %d optimizer.step()", to->empty_cache_every);
    /* the tokenizer line only when the loop does not write its own */
    tk_config mto = *to;
    if (dyn && !buckets) mto.max_len = from->max_len, mto.batching = from->batching;
    model_lines(b, from, &mto, TK_API_LOOP);
    if (!(batch || (dyn && !buckets) || prec || ckpt)) return;
    char body[2400];
    tk_loop_fix o = {.batch = to->batch_size, .from_batch = from->batch_size, .from_accum = acc_of(from),
                     .accum = acc_of(to), .loader = batch && !buckets, .dynamic = dyn && !buckets,
                     .max_len = to->max_len, .precision = to->precision, .checkpointing = ckpt,
                     .torch = to->torch_version};
    if (tk_loop_code(body, sizeof body, &o) >= (int)sizeof body) {
        if (b->f) fclose(b->f), b->f = NULL; /* never a cut snippet */
        return;
    }
    put(b, "%s", body);
}

/* Keras (api: keras): model.fit's batch, Keras 3's accumulation on the
 * optimizer, the global mixed-precision policy, the tokenizer's length. */
static void keras_code(code_buf *b, const tk_config *from, const tk_config *to) {
    int batch = to->batch_size != from->batch_size || acc_of(to) != acc_of(from);
    if (to->precision != from->precision)
        put(b, "tf.keras.mixed_precision.set_global_policy(\"%s\")   # before the model is built",
            to->precision == TK_PREC_BF16 ? "mixed_bfloat16" : "mixed_float16");
    if (to->max_len != from->max_len)
        put(b, "enc = tokenizer(texts, truncation=True, padding=\"max_length\", max_length=%d, return_tensors=\"tf\")"
               "   # yours: %d", to->max_len, from->max_len);
    if (batch && acc_of(to) > 1)
        put(b, "optimizer = keras.optimizers.AdamW(learning_rate=%g, gradient_accumulation_steps=%d)   # Keras 3: %d x %d "
               "examples per step (yours: %d x %d)", (double)to->lr, acc_of(to), to->batch_size, acc_of(to),
            from->batch_size, acc_of(from));
    if (batch) put(b, "model.fit(x, y, batch_size=%d, epochs=epochs)", to->batch_size);
    if (to->freeze_embeddings && !from->freeze_embeddings)
        put(b, "model.layers[0].trainable = False   # the embeddings; compile again after changing trainable");
}

char *tk_fix_code(const tk_config *from, const tk_config *to, tk_api api) {
    code_buf b = {0};
    b.f = open_memstream(&b.buf, &b.len);
    if (!b.f) return NULL;
    if (api == TK_API_AUTO) api = tk_config_api(to);
    if (api == TK_API_TXKERNEL) {
        txkernel_code(&b, from, to);
    } else if (api == TK_API_KERAS) {
        keras_code(&b, from, to);
    } else {
        if (api == TK_API_TRAINER) trainer_code(&b, from, to);
        else loop_code(&b, from, to);
        int ranks = tk_config_world_size(to);
        if (ranks > 1 && (ranks != tk_config_world_size(from) || to->parallel != from->parallel || to->zero != from->zero)) {
            if (to->engine == TK_ENGINE_PYTORCH) gpus_recipe(&b, api, to->parallel, 2, ranks);
            else gpus_recipe(&b, api, to->zero ? TK_PAR_ZERO2 : TK_PAR_DDP, to->zero, ranks); /* txkernel's own split as PyTorch runs it */
        }
    }
    if (!b.f) {
        free(b.buf);
        return NULL;
    }
    int bad = ferror(b.f);
    if (fclose(b.f) || bad) {
        free(b.buf);
        return NULL;
    }
    return b.buf;
}
