/* test_fix_code.c — a fix written in the API the user trains with
 * (advisor/fix_code.c): TrainingArguments and tokenizer lines for the
 * Trainer in the spelling of the user's transformers, loop code, or the
 * YAML keys that change; nothing the config has already; several GPUs with
 * their launcher recipe, txkernel's own labelled plan only on cuda; the
 * two-GPU moves an engine: pytorch config gets on Kaggle. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_test.h"
#include "tk_advisor.h"

static tk_config base_config(const char *api, const char *tv) {
    tk_config c;
    tk_config_defaults(&c);
    tk_err e = {0};
    TK_CHECK(tk_config_set(&c, "engine", "pytorch", &e) == TK_OK);
    TK_CHECK(tk_config_set(&c, "api", api, &e) == TK_OK);
    TK_CHECK(tk_config_set(&c, "torch_version", tv, &e) == TK_OK);
    TK_CHECK(tk_config_set(&c, "max_len", "256", &e) == TK_OK);
    TK_CHECK(tk_config_set(&c, "gpu", "t4", &e) == TK_OK);
    return c;
}

/* code for `to` over `from`, checked to hold each of the NULL-ended needles */
static char *code_has(const tk_config *from, const tk_config *to, tk_api api, const char *const *needles) {
    char *code = tk_fix_code(from, to, api);
    TK_CHECK(code != NULL);
    for (int i = 0; code && needles[i]; i++) TK_CHECK_MSG(strstr(code, needles[i]), "missing \"%s\" in:\n%s", needles[i], code);
    return code;
}

static void test_trainer_lines(void) {
    tk_config from = base_config("trainer", "2"), to = from;
    to.batch_size = 8, to.accumulate = 4;
    const char *const batch[] = {"TrainingArguments(per_device_train_batch_size=8, gradient_accumulation_steps=4)",
                                 "# your 32 x 1 = 32 examples per optimizer step, kept", NULL};
    free(code_has(&from, &to, TK_API_AUTO, batch));
    /* transformers 4.x requires output_dir: the config's, or a named placeholder */
    tk_config f13 = base_config("trainer", "1.13"), t13 = f13;
    t13.batching = TK_BATCH_BUCKETS;
    const char *const v4[] = {"TrainingArguments(output_dir=\"YOUR_OUTPUT_DIR\", group_by_length=True)", NULL};
    free(code_has(&f13, &t13, TK_API_AUTO, v4));
    snprintf(f13.output_dir, sizeof f13.output_dir, "out/run");
    t13 = f13, t13.optimizer = TK_OPTIM_ADAMW8;
    const char *const od[] = {"TrainingArguments(output_dir=\"out/run\", optim=\"adamw_bnb_8bit\")", NULL};
    free(code_has(&f13, &t13, TK_API_AUTO, od));
    /* transformers 5.2+: the sampler by name */
    to = from, to.batching = TK_BATCH_BUCKETS;
    const char *const v5[] = {"TrainingArguments(train_sampling_strategy=\"group_by_length\")", NULL};
    free(code_has(&from, &to, TK_API_AUTO, v5));
    /* the tokenizer's max_length with DataCollatorWithPadding */
    to = from, to.max_len = 128, to.batching = TK_BATCH_DYNAMIC;
    const char *const tok[] = {"enc = tokenizer(texts, truncation=True, max_length=128)",
                               "data_collator=DataCollatorWithPadding(tokenizer)", NULL};
    char *c = code_has(&from, &to, TK_API_AUTO, tok);
    TK_CHECK(c && !strstr(c, "TrainingArguments"));
    free(c);
    to = from, to.precision = TK_PREC_FP16, to.recompute = TK_RECOMPUTE_LAYERS, to.eval_batch_size = 16;
    const char *const prec[] = {"fp16=True", "gradient_checkpointing=True", "per_device_eval_batch_size=16", NULL};
    c = code_has(&from, &to, TK_API_AUTO, prec);
    TK_CHECK(c && !strstr(c, "GradScaler") && !strstr(c, "gradient_checkpointing_enable"));
    free(c);
    /* what is on already is never written again */
    from.precision = TK_PREC_FP16, from.recompute = TK_RECOMPUTE_LAYERS;
    to = from, to.batch_size = 16, to.accumulate = 2;
    c = tk_fix_code(&from, &to, TK_API_AUTO);
    TK_CHECK_MSG(c && !strstr(c, "fp16") && !strstr(c, "gradient_checkpointing"), "%s", c ? c : "");
    free(c);
    c = tk_fix_code(&from, &from, TK_API_AUTO);
    TK_CHECK_STR(c, "");
    free(c);
}

static void test_loop_and_yaml(void) {
    tk_config from = base_config("loop", "2"), to = from;
    TK_CHECK(tk_config_api(&from) == TK_API_LOOP);
    to.precision = TK_PREC_FP16, to.recompute = TK_RECOMPUTE_LAYERS, to.batch_size = 16, to.accumulate = 2;
    /* one whole loop body (issue 40): accumulation as code, autocast, the scaler around clipping, the
     * schedule's steps divided by the accumulation, checkpointing on the module that has it */
    const char *const loop[] = {"loader = DataLoader(train_ds, batch_size=16, shuffle=True, collate_fn=loader.collate_fn)",
                                "accum = 2   # your 32 x 1 examples per optimizer step, kept",
                                "len(loader) * num_epochs // accum)", "scaler = torch.amp.GradScaler(\"cuda\")",
                                "        loss = model(**batch).loss / accum\n    scaler.scale(loss).backward()\n"
                                "    if (i + 1) % accum == 0:\n        scaler.unscale_(optimizer)",
                                "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
                                "        scaler.step(optimizer)\n        scaler.update()\n        scheduler.step()\n"
                                "        optimizer.zero_grad()",
                                "(model if hasattr(model, \"gradient_checkpointing_enable\") else model.bert)"
                                ".gradient_checkpointing_enable()", NULL};
    char *c = code_has(&from, &to, TK_API_AUTO, loop);
    TK_CHECK(c && !strstr(c, "TrainingArguments"));
    free(c);
    /* torch 1.13: the scaler's old spelling; bf16: no scaler */
    tk_config o13 = base_config("loop", "1.13"), t13 = o13;
    t13.precision = TK_PREC_FP16;
    const char *const old[] = {"scaler = torch.cuda.amp.GradScaler()", NULL};
    free(code_has(&o13, &t13, TK_API_AUTO, old));
    t13.precision = TK_PREC_BF16;
    const char *const bf[] = {"with torch.autocast(\"cuda\", dtype=torch.bfloat16):", "    loss.backward()\n", NULL};
    c = code_has(&o13, &t13, TK_API_AUTO, bf);
    TK_CHECK(c && !strstr(c, "scaler"));
    free(c);
    /* dynamic padding through the DataLoader's collate_fn, never the whole corpus padded */
    to = from, to.batching = TK_BATCH_DYNAMIC, to.max_len = 128;
    const char *const dyn[] = {"dict(tokenizer(t, truncation=True, max_length=128), labels=y)",
                               "collate_fn=DataCollatorWithPadding(tokenizer)", NULL};
    c = code_has(&from, &to, TK_API_AUTO, dyn);
    TK_CHECK(c && !strstr(c, "padding=\"longest\"") && !strstr(c, "enc = tokenizer"));
    free(c);
    /* keras: the optimizer's accumulation, the batch, the policy */
    to = from, to.batch_size = 16, to.accumulate = 2, to.precision = TK_PREC_FP16;
    const char *const keras[] = {"tf.keras.mixed_precision.set_global_policy(\"mixed_float16\")",
                                 "gradient_accumulation_steps=2)", "model.fit(x, y, batch_size=16, epochs=epochs)", NULL};
    c = code_has(&from, &to, TK_API_KERAS, keras);
    TK_CHECK(c && !strstr(c, "torch"));
    free(c);
    /* txkernel's YAML: the keys that change, nothing else */
    tk_config y = from;
    y.api = TK_API_AUTO, y.engine = TK_ENGINE_TXKERNEL;
    TK_CHECK(tk_config_api(&y) == TK_API_TXKERNEL);
    tk_config y2 = y;
    y2.batch_size = 8, y2.accumulate = 4;
    c = tk_fix_code(&y, &y2, TK_API_AUTO);
    TK_CHECK_STR(c, "batch_size: 8\naccumulate: 4");
    free(c);
}

static void test_gpus(void) {
    /* engine: pytorch on Kaggle's pair: each split with its recipe, two GPUs from the profile */
    tk_config from = base_config("trainer", "2"), to = from;
    snprintf(to.gpu, sizeof to.gpu, "t4x2");
    static const struct { tk_parallel p; const char *want; } R[] = {
        {TK_PAR_DATAPARALLEL, "trainer.train() wraps the model in DataParallel itself"},
        {TK_PAR_DDP, "!accelerate launch --multi_gpu --num_processes 2 train.py"},
        {TK_PAR_ZERO2, "!accelerate launch --use_deepspeed --zero_stage 2 --num_processes 2 train.py"},
    };
    for (size_t i = 0; i < sizeof R / sizeof R[0]; i++) {
        to.parallel = R[i].p;
        const char *const w[] = {R[i].want, NULL};
        free(code_has(&from, &to, TK_API_AUTO, w));
    }
    to.parallel = TK_PAR_DDP;
    const char *const ddp_loop[] = {"!torchrun --nproc_per_node 2 train.py", "DistributedDataParallel", NULL};
    free(code_has(&from, &to, TK_API_LOOP, ddp_loop));
    /* txkernel's own two GPUs on a card: plan only, with the PyTorch recipe */
    tk_config tx;
    tk_config_defaults(&tx);
    snprintf(tx.gpu, sizeof tx.gpu, "t4");
    tk_config tx2 = tx;
    tx2.world_size = 2, tx2.zero = 1, tx2.batch_size = 16;
    TK_CHECK(tk_config_plan_only(&tx2) && !tk_config_plan_only(&tx));
    const char *const po[] = {"world_size: 2", "zero: 1", "# plan only: txkernel plans 2 GPUs on cuda",
                              "--zero_stage 1 --num_processes 2", NULL};
    free(code_has(&tx, &tx2, TK_API_AUTO, po));
    /* on the cpu several ranks are MPI processes txk starts: not plan only */
    tx2.gpu[0] = 0;
    TK_CHECK(!tk_config_plan_only(&tx2));
}

/* engine: pytorch with one T4 --for kaggle: the pair's three splits are
 * proposed, each applied as the pair's profile and parallel:, the global
 * batch kept. Each is offered where the engine: pytorch planner plans it
 * (DataParallel and DDP here; ZeRO-2 is refused fp32 weights and so never
 * offered for this config). */
static void test_kaggle_pair_moves(void) {
    tk_config c = base_config("trainer", "2");
    c.batch_size = 64;
    tk_advise_input in = {.config = &c, .platform = "kaggle", .margin_frac = 0.05};
    const tk_fix_def *d = tk_fix_def_of(TK_FIX_DATA_PARALLEL);
    tk_fix f[8];
    int n = d->propose(TK_FIX_DATA_PARALLEL, &in, f, 8);
    TK_CHECK_EQ_INT(n, 3);
    for (int i = 0; i < n; i++) {
        tk_config cc = c;
        char reason[256], label[64];
        TK_CHECK(f[i].value == 2 && f[i].parallel == (tk_parallel)i);
        TK_CHECK(tk_fix_apply(&cc, &f[i], NULL, 0, reason, sizeof reason) == 0);
        TK_CHECK(!strcmp(cc.gpu, "t4x2") && cc.parallel == (tk_parallel)i && cc.batch_size == 32);
        tk_fix_label(&f[i], &cc, label, sizeof label);
        TK_CHECK(!strncmp(label, "2 GPUs, ", 8));
    }
    /* one T4 with no platform: none */
    in.platform = "colab";
    TK_CHECK_EQ_INT(d->propose(TK_FIX_DATA_PARALLEL, &in, f, 8), 0);
    in.platform = "kaggle";
    tk_plan_result *p = malloc(sizeof *p);
    tk_advice *a = malloc(sizeof *a);
    tk_err e = {0};
    /* the moves the engine: pytorch planner plans (ZeRO-2 needs 16-bit
     * weights: this fp32 config is refused it, with the reason) */
    int plannable = 0;
    for (int i = 0; i < 3 && p; i++) {
        tk_config pair = c;
        TK_CHECK(tk_fix_apply(&pair, &f[i], NULL, 0, (char[256]){0}, 256) == 0);
        tk_status planned = tk_plan_engine(&pair, NULL, 0, p, &e);
        TK_CHECK_MSG(planned == TK_OK || (i == TK_PAR_ZERO2 && planned == TK_EINVAL), "%d: %s", i, e.msg);
        plannable += planned == TK_OK;
    }
    TK_CHECK(plannable >= 2);
    TK_CHECK(a && tk_advise(&in, a, &e) == TK_OK);
    int offered = 0;
    for (int i = 0; a && i < a->n_cand; i++) {
        if (strncmp(a->cand[i].label, "2 GPUs", 6)) continue;
        offered++;
        char *code = tk_fix_code(&a->given, &a->cand[i].config, a->api);
        TK_CHECK_MSG(code && (strstr(code, "accelerate launch") || strstr(code, "DataParallel")), "%s", code ? code : "");
        free(code);
    }
    /* on Kaggle the card is chosen, not drawn: no lottery */
    for (int i = 0; a && i < a->n_diag; i++) TK_CHECK(a->diag[i].kind != TK_DIAG_LOTTERY);
    TK_CHECK_EQ_INT(offered, plannable);
    free(p);
    free(a);
}

int main(void) {
    TK_RUN(test_trainer_lines);
    TK_RUN(test_loop_and_yaml);
    TK_RUN(test_gpus);
    TK_RUN(test_kaggle_pair_moves);
    return tk_test_done();
}
