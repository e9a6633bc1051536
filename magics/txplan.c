/* txplan.c — `%txplan` / `%%txplan`: the cell's syntax for the plan verb.
 * The line form starts from the session's last config (from %%txtrain,
 * %txplan or %txfix), so `%txplan batch_size=8` asks "and with batch 8?";
 * the cell form from its YAML body; --file from a YAML file. The words are
 * read by the option table and the plan is app/'s (tk_app_plan), the same
 * function `txk plan` calls.
 */
#include <stdio.h>
#include <string.h>

#include "tk_app.h"
#include "tk_magics.h"
#include "tk_session.h"
#include "tk_txmagics.h"

/* The request of a %txplan cell: config (base, --file, body, key=value) and
 * flags. 0, or -1 after the error. */
static int plan_request(tk_magic_ctx *m, tk_plan_request *rq, int *json, const tk_app_args *args) {
    tk_err err = {0};
    if (tk_app_check_platform(tk_app_arg(args, "--gpus"), &err))
        return tk_magic_error(m, "UsageError", "%s", err.msg);
    *json = tk_app_has(args, "--json");
    const tk_config *last = tk_session_config(m->session);
    const char *file = tk_app_arg(args, "--file");
    tk_config base;
    tk_config_defaults(&base);
    if (file && tk_app_config_file(&base, file, &err) != TK_OK) return tk_magic_error(m, "ConfigError", "%s", err.msg);
    if (!file && last && !m->is_cell) base = *last;
    if (tk_txconfig_from_cell(m, &base, &rq->config, 1)) return -1;
    rq->gpu = tk_app_arg(args, "--gpu");
    rq->gpus = tk_app_arg(args, "--gpus");
    rq->snapshot = tk_app_arg(args, "--snapshot");
    rq->max_batch = tk_app_has(args, "--max-batch");
    rq->measure = tk_app_has(args, "--measure");
    rq->sweep = rq->measure || tk_app_has(args, "--sweep");
    rq->epoch = tk_app_has(args, "--epoch");
    rq->new_config = m->is_cell || file;
    return 0;
}

static int run_txplan(tk_magic_ctx *m) {
    char **argv = NULL;
    int argc = 0;
    tk_app_args a;
    if (tk_txargs_parse(m, TK_VERB_PLAN, &argv, &argc, &a)) return -1;
    tk_plan_request rq = {0};
    int json = 0;
    int rc = plan_request(m, &rq, &json, &a); /* rq's strings point into argv */
    tk_plan_reply r;
    tk_err err = {0};
    if (!rc && tk_app_plan(m->session, &rq, &r, &err) != TK_OK) rc = tk_magic_error(m, r.ename, "%s", err.msg);
    if (!rc && r.said[0]) tk_magic_printf(m, "stdout", "%s\n", r.said);
    if (!rc) tk_txemit(m, r.bundle, json);
    if (!rc) json_decref(r.bundle);
    tk_txargs_free(argv, argc);
    return rc;
}

static const tk_magic_def TXPLAN[] = {
    {"txplan", TK_MAGIC_BOTH, run_txplan, "predicted peak memory of a run and who takes it, without training",
     "%txplan [key=value ...] {flags}\n"
     "%%txplan [key=value ...] {flags}\n<YAML config>\n\n"
     "Runs one training step (and an eval step) of the config on the meta device: no\n"
     "arithmetic, same allocator, same allocation order as a real run. Shows the peak\n"
     "(allocated and reserved) against the capacity, the bytes per category at the peak\n"
     "and the top owners (HF module names). The line form starts from the last config of\n"
     "the session and applies key=value overrides: %txplan batch_size=8 precision=fp16.\n"
     "--epoch: the run's first epoch instead of the worst-case batch: its own batches in the\n"
     "run's order through the run's step (empty_cache, the on_oom retry), then every dev\n"
     "batch, so the cache that dynamic padding fragments is planned too (needs train_file).\n"
     "--max-batch: the largest batch for max_len 64..512 that fits the capacity.\n"
     "--sweep: the peak (and its categories) with each memory-saving technique and a few\n"
     "combinations: recompute, fused attention, fp16/bf16, 8-bit AdamW, frozen embeddings,\n"
     "accumulation. --measure also runs each row for two steps on the config's device\n"
     "(the cpu: keep the model small; cuda for device: cuda) and shows the measured\n"
     "peak, whether it equals the plan, and ms/step; on cuda ten more steps are timed\n"
     "and CUPTI's device peak is set against the plan plus the plugin's own buffers.\n"
     "--gpus colab|kaggle|colab-2020|all: the config planned on each card the platform hands out\n"
     "(its capacity, as `gpu: CARD` gives): fits, margin, predicted step time, and one\n"
     "sentence saying on which cards it fits; %txadvise and %txfix then advise for the\n"
     "platform's smallest card when the config names none, and say so.\n"
     "--snapshot FILE: the planned step's allocations written as a PyTorch memory snapshot\n"
     "(.pickle), as `txk plan --snapshot` writes it.\n"
     "engine: pytorch in the config plans the user's transformers BERT step as PyTorch runs\n"
     "it instead (torchplan/): peak allocated, first step, reserved, device used (alone or\n"
     "with --gpus); in the companion, %txplan --torch-model NAME / --trainer NAME reads a\n"
     "live model or Trainer [--batch B --seq T --gpu P --precision P --optimizer O --show-config]."},
};

int tk_magics_register_txplan(tk_magics *m) { return tk_magics_add_table(m, TXPLAN, 1); }
