/* tk_fix_code.h — the one writer of fix code that the diagnoses (diagnoses.c,
 * which the fuzz targets build without the planner) and the advice's fix
 * code (fix_code.c) both call: TrainingArguments' opening, a plain PyTorch
 * loop's whole body, and a step change (half the batch, shorter sequences,
 * fp16, checkpointing) in each API for a path without a planned config (a
 * pasted message, a snapshot); not part of the advisor's interface. */
#ifndef TK_FIX_CODE_H
#define TK_FIX_CODE_H

#include <stdio.h>
#include <string.h>
#include "tk_config.h"

/* The opening of a TrainingArguments line that constructs as written in the
 * user's transformers: "TrainingArguments(output_dir=\"out\", " with the
 * config's output_dir; without one, transformers 5.x defaults it
 * ("TrainingArguments("), while 4.x requires it, so a named placeholder
 * stands there. Returns buf. */
static inline const char *tk_ta_open(char *buf, size_t n, const char *output_dir, tk_torch_version v) {
    if (output_dir && *output_dir) snprintf(buf, n, "TrainingArguments(output_dir=\"%s\", ", output_dir);
    else if (v == TK_TORCH_2) snprintf(buf, n, "TrainingArguments(");
    else snprintf(buf, n, "TrainingArguments(output_dir=\"YOUR_OUTPUT_DIR\", ");
    return buf;
}

/* A plain PyTorch loop as the fix leaves it. Numbers the user gave, or
 * named placeholders (the *_s strings) where none was given: accum 0 with
 * accum_s "A * 2" writes `accum = A * 2`. */
typedef struct tk_loop_fix {
    int batch;               /* the DataLoader's batch size after the fix; 0: batch_s */
    const char *batch_s;     /* "B // 2" */
    int from_batch, from_accum; /* the user's, for the comment (0: not known) */
    int accum;               /* accumulation steps after the fix (1: none); 0: accum_s */
    const char *accum_s;
    int loader;              /* 1: the DataLoader line (its batch or collate changes) */
    int dynamic;             /* 1: pad each batch to its longest through the collate_fn */
    int max_len;             /* the tokenizer's max_length with dynamic padding; 0: max_len_s */
    const char *max_len_s;
    tk_precision precision;  /* autocast and (fp16) the GradScaler */
    int checkpointing;       /* 1: gradient_checkpointing_enable() on the module that has it */
    tk_torch_version torch;  /* torch.amp.GradScaler("cuda") (2.3+) or torch.cuda.amp.GradScaler() (1.x) */
} tk_loop_fix;

/* 1: torch before 2.3, which has no torch.amp.GradScaler("cuda"). */
static inline int tk_torch_old_scaler(tk_torch_version v) {
    return v == TK_TORCH_1_13 || v == TK_TORCH_1_10 || (v >= TK_TORCH_2_0 && v < TK_TORCH_2_MINOR(3));
}

/* Writes the whole loop body the user's loop maps onto (autocast on the
 * forward, scaler.scale(loss).backward(), scaler.unscale_ before clipping,
 * scaler.step, scaler.update, scheduler.step(), optimizer.zero_grad();
 * accumulation as code: the loss divided by N, the step on (i + 1) % N == 0,
 * the scheduler's total steps divided by N). Names from the user's code:
 * model, optimizer, device, num_epochs, num_warmup_steps, and train_ds (or,
 * with dynamic padding, texts, labels and tokenizer). Returns the length it wanted (snprintf's). */
static inline int tk_loop_code(char *buf, size_t n, const tk_loop_fix *o) {
    size_t w = 0;
#define TK_LP(...) (w += (size_t)snprintf(buf + (w < n ? w : n), w < n ? n - w : 0, __VA_ARGS__))
    char acc[96], bs[48], ml[48];
    if (o->accum > 0) snprintf(acc, sizeof acc, "%d", o->accum);
    else snprintf(acc, sizeof acc, "%s", o->accum_s ? o->accum_s : "A");
    if (o->batch > 0) snprintf(bs, sizeof bs, "%d", o->batch);
    else snprintf(bs, sizeof bs, "%s", o->batch_s ? o->batch_s : "B");
    if (o->max_len > 0) snprintf(ml, sizeof ml, "%d", o->max_len);
    else snprintf(ml, sizeof ml, "%s", o->max_len_s ? o->max_len_s : "N");
    int accumulates = o->accum != 1;
    TK_LP("# your loop as the fix leaves it; model, optimizer, %sdevice, num_epochs and num_warmup_steps are yours\n",
          o->dynamic ? "texts, labels, tokenizer, " : "train_ds, ");
    if (o->dynamic)
        TK_LP("train_ds = [dict(tokenizer(t, truncation=True, max_length=%s), labels=y) for t, y in zip(texts, labels)]"
              "   # no padding here\n", ml);
    if (o->loader || o->dynamic)
        TK_LP("loader = DataLoader(train_ds, batch_size=%s, shuffle=True, collate_fn=%s)%s\n", bs,
              o->dynamic ? "DataCollatorWithPadding(tokenizer)" : "loader.collate_fn",
              o->dynamic ? "   # pads each batch to its longest" : "   # your collate_fn kept");
    if (accumulates) {
        if (o->from_batch > 0)
            TK_LP("accum = %s   # your %d x %d examples per optimizer step, kept\n", acc, o->from_batch,
                  o->from_accum > 0 ? o->from_accum : 1);
        else
            TK_LP("accum = %s\n", acc);
    }
    TK_LP("scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps, len(loader) * num_epochs%s)\n",
          accumulates ? " // accum" : "");
    if (o->checkpointing)
        TK_LP("(model if hasattr(model, \"gradient_checkpointing_enable\") else model.bert).gradient_checkpointing_enable()\n");
    int fp16 = o->precision == TK_PREC_FP16, amp = o->precision != TK_PREC_FP32;
    if (fp16)
        TK_LP("scaler = %s\n", tk_torch_old_scaler(o->torch) ? "torch.cuda.amp.GradScaler()" : "torch.amp.GradScaler(\"cuda\")");
    TK_LP("model.train()\nfor i, batch in enumerate(loader):\n");
    TK_LP("    batch = {k: v.to(device) for k, v in batch.items()}\n");
    const char *in = "    ";
    if (amp) {
        TK_LP("    with torch.autocast(\"cuda\", dtype=torch.%s):\n", fp16 ? "float16" : "bfloat16");
        in = "        ";
    }
    TK_LP("%sloss = model(**batch).loss%s\n", in, accumulates ? " / accum" : "");
    TK_LP("    %s.backward()\n", fp16 ? "scaler.scale(loss)" : "loss");
    const char *st = "    ";
    if (accumulates) {
        TK_LP("    if (i + 1) %% accum == 0:\n");
        st = "        ";
    }
    if (fp16) TK_LP("%sscaler.unscale_(optimizer)   # before clipping: the gradients at their true scale\n", st);
    TK_LP("%storch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", st);
    if (fp16) TK_LP("%sscaler.step(optimizer)\n%sscaler.update()\n", st, st);
    else TK_LP("%soptimizer.step()\n", st);
    TK_LP("%sscheduler.step()\n%soptimizer.zero_grad()", st, st);
#undef TK_LP
    return (int)w;
}

/* The four changes to one training step that a path without a planned
 * config offers (a pasted message, a snapshot): half the batch with twice
 * the accumulation, shorter sequences padded per batch, fp16, and
 * gradient checkpointing. */
typedef enum {
    TK_STEP_HALF_BATCH = 0,
    TK_STEP_SHORTER,
    TK_STEP_FP16,
    TK_STEP_CHECKPOINTING,
} tk_step_change;

/* What the code knows of the user's run: their numbers (0: not given: the
 * code names a placeholder), what their config has on, the versions, and
 * where the missing numbers come from. */
typedef struct tk_step_user {
    int batch, accumulate, max_len, p99;
    int have_config;            /* 1: precision and torch are the config's */
    tk_precision precision;
    tk_torch_version torch;     /* TrainingArguments' spelling always; the loop's only with have_config */
    const char *output_dir;     /* TrainingArguments' output_dir, or NULL */
    const char *fill;           /* how the placeholders get numbers ("txk advise CFG --from-error fills them in"), or NULL */
} tk_step_user;

/* The loop the user runs, as a step change leaves it: their own numbers
 * where given, named placeholders otherwise (tk_loop_code). */
static inline void tk_step_loop(const tk_step_user *u, tk_loop_fix *o) {
    memset(o, 0, sizeof *o);
    o->batch = u->batch;
    o->batch_s = "B";
    o->from_batch = u->batch;
    o->from_accum = u->accumulate;
    o->accum = u->batch ? (u->accumulate > 1 ? u->accumulate : 1) : 1;
    o->precision = u->have_config ? u->precision : TK_PREC_FP32;
    o->torch = u->have_config ? u->torch : TK_TORCH_2;
}

/* The length a shorter-sequences change truncates at: the corpus' p99 when
 * given and below max_len, else max_len; 0: not known (placeholder N). */
static inline int tk_step_length(const tk_step_user *u) {
    return u->p99 > 0 && (u->max_len <= 0 || u->p99 < u->max_len) ? u->p99 : u->max_len;
}

/* Several GPUs as launcher lines, for a planned config (fix_code.c) and a
 * pasted message (diagnoses.c) alike. how: DataParallel (one process), DDP
 * or ZeRO (stage `zero`, 2 when 0) through DeepSpeed; accelerate: 1 writes accelerate's launcher and
 * notebook_launcher (a Trainer's way), 0 torchrun and the model wrapped by
 * hand (a loop's); ranks: the GPU count as the user writes it ("2", or
 * "NUM_GPUS" when the input gave none). Returns snprintf's length. */
static inline int tk_launch_code(char *code, size_t n, tk_parallel how, int zero, int accelerate, const char *ranks) {
    if (how == TK_PAR_DATAPARALLEL)
        return accelerate ? snprintf(code, n, "# with the %s GPUs visible and no launcher, trainer.train() wraps the "
                                              "model in DataParallel itself", ranks)
                          : snprintf(code, n, "model = torch.nn.DataParallel(model)   # one process; GPU 0 gathers "
                                              "the %s replicas' outputs", ranks);
    if (how == TK_PAR_DDP)
        return accelerate ? snprintf(code, n, "!accelerate launch --multi_gpu --num_processes %s train.py   # the "
                                              "training cell saved as train.py\n# or in the notebook: from accelerate "
                                              "import notebook_launcher; notebook_launcher(train, num_processes=%s)",
                                     ranks, ranks)
                          : snprintf(code, n, "!torchrun --nproc_per_node %s train.py   # the training cell saved as "
                                              "train.py\n# in it: model = DistributedDataParallel(model, "
                                              "device_ids=[local_rank])", ranks);
    return snprintf(code, n, "!accelerate launch --use_deepspeed --zero_stage %d --num_processes %s train.py%s",
                    zero > 0 ? zero : 2, ranks,
                    accelerate ? "" : "\n# the loop through accelerate: model, optimizer, loader = "
                                      "accelerator.prepare(model, optimizer, loader); accelerator.backward(loss)");
}

/* The one writer of a step change as code in the user's API (the Trainer's
 * TrainingArguments, a plain loop's whole body, Keras, txkernel's YAML),
 * for the paths without a planned config; fix_code.c writes a planned
 * config's. Returns the length it wanted (snprintf's); 0 when the change
 * has no code in that API (checkpointing in Keras). */
static inline int tk_step_code(char *code, size_t n, tk_step_change ch, tk_api api, const tk_step_user *u) {
    char op[TK_PATH_MAX + 48], fill[160] = "";
    int B = u->batch, A = u->accumulate > 1 ? u->accumulate : 1;
    tk_loop_fix lf;
    if (u->fill && *u->fill) snprintf(fill, sizeof fill, " (%s)", u->fill);
    tk_ta_open(op, sizeof op, u->output_dir, u->torch); /* the message's era without a config: 4.x needs output_dir */
    switch (ch) {
    case TK_STEP_HALF_BATCH:
        if (api == TK_API_TXKERNEL && B >= 2)
            return snprintf(code, n, "batch_size: %d\naccumulate: %d   # your %d x %d: the same effective batch of %d",
                            B / 2, 2 * A, B, A, B * A);
        if (api == TK_API_TXKERNEL)
            return snprintf(code, n, "batch_size: B / 2\naccumulate: A * 2   # B, A: your batch_size and accumulate now");
        if (api == TK_API_TRAINER && B >= 2)
            return snprintf(code, n, "%sper_device_train_batch_size=%d, gradient_accumulation_steps=%d)\n"
                            "# your batch %d x accumulation %d: the same effective batch of %d", op, B / 2, 2 * A, B, A,
                            B * A);
        if (api == TK_API_TRAINER)
            return snprintf(code, n, "TrainingArguments(..., per_device_train_batch_size=B // 2, "
                            "gradient_accumulation_steps=A * 2)\n# B, A: your batch size and accumulation now%s", fill);
        if (api == TK_API_KERAS && B >= 2)
            return snprintf(code, n, "optimizer = keras.optimizers.AdamW(learning_rate=lr, gradient_accumulation_steps=%d)"
                            "   # Keras 3\nmodel.fit(x, y, batch_size=%d)   # your %d x %d examples per step, kept", 2 * A,
                            B / 2, B, A);
        if (api == TK_API_KERAS)
            return snprintf(code, n, "optimizer = keras.optimizers.AdamW(learning_rate=lr, gradient_accumulation_steps=2)"
                            "   # Keras 3\nmodel.fit(x, y, batch_size=B // 2)   # B: your batch size now");
        tk_step_loop(u, &lf);
        lf.loader = 1;
        if (B >= 2) lf.batch = B / 2, lf.accum = 2 * A;
        else lf.batch = 0, lf.batch_s = "B // 2", lf.accum = 0, lf.accum_s = "2 * A   # B, A: your batch size and "
                                                                            "accumulation now";
        return tk_loop_code(code, n, &lf);
    case TK_STEP_SHORTER: {
        char len_s[16], why[200];
        int L = tk_step_length(u);
        if (L > 0) snprintf(len_s, sizeof len_s, "%d", L);
        else snprintf(len_s, sizeof len_s, "N");
        if (u->p99 > 0 && L == u->p99 && u->max_len > 0)
            snprintf(why, sizeof why, "# %d: the p99 token length of your training examples (your config's max_len: %d)",
                     L, u->max_len);
        else if (u->p99 > 0 && L == u->p99) /* no config: a snapshot's data alone */
            snprintf(why, sizeof why, "# %d: the p99 token length of your training examples", L);
        else if (u->p99 > 0)
            snprintf(why, sizeof why, "# %d: your config's max_len; your training examples' p99 is %d, so a shorter "
                     "max_length truncates more: padding each batch to its longest is the saving here", L, u->p99);
        else if (L > 0)
            snprintf(why, sizeof why, "# %d: your config's max_len; lower it to your data's p99 (txk data FILE prints it)",
                     L);
        else
            snprintf(why, sizeof why, "# N: your data's p99 token length (txk data FILE prints it)");
        if (api == TK_API_TXKERNEL) return snprintf(code, n, "max_len: %s\nbatching: dynamic\n%s", len_s, why);
        if (api == TK_API_TRAINER)
            return snprintf(code, n, "enc = tokenizer(texts, truncation=True, max_length=%s)   # no padding here\n"
                            "trainer = Trainer(model=model, args=args, train_dataset=train_ds, "
                            "data_collator=DataCollatorWithPadding(tokenizer))\n%s", len_s, why);
        if (api == TK_API_KERAS)
            return snprintf(code, n, "enc = tokenizer(texts, truncation=True, padding=\"max_length\", max_length=%s, "
                            "return_tensors=\"tf\")\n%s", len_s, why);
        tk_step_loop(u, &lf);
        lf.dynamic = 1;
        if (L > 0) lf.max_len = L;
        else lf.max_len_s = "N";
        int k = tk_loop_code(code, n, &lf);
        if (k >= 0 && (size_t)k < n) k += snprintf(code + k, n - (size_t)k, "\n%s", why);
        return k;
    }
    case TK_STEP_FP16:
        if (api == TK_API_TXKERNEL) return snprintf(code, n, "precision: fp16");
        if (api == TK_API_TRAINER) return snprintf(code, n, "%sfp16=True)", op);
        if (api == TK_API_KERAS)
            return snprintf(code, n, "tf.keras.mixed_precision.set_global_policy(\"mixed_float16\")   # before the "
                            "model is built");
        tk_step_loop(u, &lf);
        lf.precision = TK_PREC_FP16;
        return tk_loop_code(code, n, &lf);
    case TK_STEP_CHECKPOINTING:
        if (api == TK_API_KERAS) {
            if (n) code[0] = 0;
            return 0;
        }
        if (api == TK_API_TXKERNEL) return snprintf(code, n, "recompute: layers");
        if (api == TK_API_TRAINER) return snprintf(code, n, "%sgradient_checkpointing=True)", op);
        return snprintf(code, n, "(model if hasattr(model, \"gradient_checkpointing_enable\") else model.bert)"
                        ".gradient_checkpointing_enable()   # the module that has it: model.bert inside a wrapper");
    }
    if (n) code[0] = 0;
    return 0;
}

#endif
