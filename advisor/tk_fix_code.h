/* tk_fix_code.h — the one writer of fix code that the pasted-message reader
 * (oom_message.c, which builds alone for its fuzz target) and the advice's
 * fix code (fix_code.c) both call: TrainingArguments' opening and a plain
 * PyTorch loop's whole body; not part of the advisor's interface. */
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
    char acc[48], bs[48], ml[48];
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

#endif
