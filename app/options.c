/* options.c — the one option table of txk, the magics and the companion,
 * and the parser both front doors use (issue 39).
 *
 * Each flag is declared once, with the verbs that take it in each door. A
 * front door parses its words with tk_app_args_parse and asks for values by
 * name; usage lines and the reference pages are printed from the table, so
 * a flag a usage line lists is a flag the parser takes (the bug this ends:
 * `%txadvise --api loop` was listed and refused).
 *
 * Guarantees: a flag not in the table for the verb and door is an error
 * naming the flag and the verb; a valued flag without its value is an error
 * naming the flag; nothing here reads a file or changes a config but
 * tk_app_args_apply.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_app.h"
#include "tk_host_mem.h"
#include "tk_render.h"

#define SH TK_DOOR_SHELL
#define CE TK_DOOR_CELL
#define CO TK_DOOR_COMPANION
#define BOTH (SH | CE)

static const tk_option OPTIONS[] = {
    {"--json", NULL, 0, "print (or show) the result's JSON only, the same object in a shell and a cell",
     {{TK_VERB_PLAN | TK_VERB_TRAIN | TK_VERB_ADVISE | TK_VERB_PREDICT | TK_VERB_DATA | TK_VERB_MEM |
       TK_VERB_DEVICE, SH},
      {TK_VERB_PLAN | TK_VERB_TRAIN | TK_VERB_ADVISE | TK_VERB_FIX | TK_VERB_PREDICT | TK_VERB_DATA | TK_VERB_MEM |
       TK_VERB_DEVICE, CE},
      {TK_VERB_PLAN, CO}}},
    {"--file", "CFG.yaml", 0, "read the config from a YAML file (the shell also takes it as the first word)",
     {{TK_VERB_PLAN | TK_VERB_TRAIN | TK_VERB_ADVISE, SH}, {TK_VERB_PLAN | TK_VERB_TRAIN, CE}}},
    {"--gpu", "PROFILE", 0, "plan for this card (t4, l4, a100-40, ...): its capacity, as gpu: in the config",
     {{TK_VERB_PLAN | TK_VERB_ADVISE | TK_VERB_MEM, BOTH}, {TK_VERB_PLAN, CO}}},
    {"--gpus", "PLATFORM", 0, "plan on each card the platform hands out (colab, kaggle, colab-2020, all); the "
     "session then advises for the platform's smallest card", {{TK_VERB_PLAN, BOTH | CO}}},
    {"--snapshot", "FILE", 0, "write the planned step (plan) or the run (train) as a PyTorch memory snapshot "
     "(.pickle); mem: read one", {{TK_VERB_PLAN | TK_VERB_TRAIN | TK_VERB_MEM, BOTH}}},
    {"--max-batch", NULL, 0, "the largest batch per max_len 64..512 that fits the capacity", {{TK_VERB_PLAN, BOTH}}},
    {"--sweep", NULL, 0, "the peak with each memory-saving technique", {{TK_VERB_PLAN, BOTH}}},
    {"--measure", NULL, 0, "with --sweep: run each row two steps and compare", {{TK_VERB_PLAN, BOTH}}},
    {"--epoch", NULL, 0, "plan the run's first epoch, its own batches in order (needs train_file)",
     {{TK_VERB_PLAN, BOTH}}},
    {"--no-plan", NULL, 0, "train even when the plan says it does not fit", {{TK_VERB_TRAIN, BOTH}}},
    {"--top", "N", 0, "advise: show the N best fixes (12); mem: the N largest owners or layers (10)",
     {{TK_VERB_ADVISE | TK_VERB_MEM, BOTH}}},
    {"--margin", "F", 0, "safety margin as a share of capacity, in [0, 0.5) (0.05)", {{TK_VERB_ADVISE, BOTH}}},
    {"--for", "PLATFORM", 0, "advise for the cards this platform hands out (colab, kaggle, colab-2020; fix auto "
     "also all)", {{TK_VERB_ADVISE | TK_VERB_FIX, BOTH}}},
    {"--api", "API", 0, "write the fixes' code for this API: trainer, loop, txkernel or keras",
     {{TK_VERB_ADVISE, BOTH}}},
    {"--fix", "N|auto", 0, "write the config with fix N (or the best that keeps the effective batch)",
     {{TK_VERB_ADVISE, SH}}},
    {"--from-error", "FILE|-", CE, "read a pasted OOM message (a file, - for standard input; in a cell: the body)",
     {{TK_VERB_ADVISE, BOTH}}},
    {"--data", "FILE", 0, "the corpus whose lengths the max_len fix reads (with --from-error); mem --snapshot: "
     "the corpus of the planned batch", {{TK_VERB_ADVISE, SH}, {TK_VERB_MEM, BOTH}}},
    {"--run", NULL, 0, "train the fixed config now and compare the measured peak with the plan",
     {{TK_VERB_FIX, CE}}},
    {"-o", "FILE", 0, "write the result to FILE (predict: every prediction, CSV or .jsonl)",
     {{TK_VERB_ADVISE | TK_VERB_VOCAB, SH}, {TK_VERB_PREDICT, BOTH}}},
    {"--input", "FILE", 0, "the file to predict on", {{TK_VERB_PREDICT, BOTH}}},
    {"--text", "COL", 0, "the text column", {{TK_VERB_PREDICT | TK_VERB_DATA | TK_VERB_MEM, BOTH},
                                             {TK_VERB_VOCAB, SH}}},
    {"--pair", "COL", 0, "the second text column of a pair", {{TK_VERB_PREDICT | TK_VERB_DATA, BOTH}}},
    {"--rows", "N", 0, "rows shown in the table (the file gets every row)", {{TK_VERB_PREDICT, BOTH}}},
    {"--label", "COL", 0, "the label column (scored when present)", {{TK_VERB_PREDICT, BOTH}}},
    {"--id", "COL", 0, "the id column carried into the predictions (-o)", {{TK_VERB_PREDICT, BOTH}}},
    {"--model", "M", 0, "the model whose tokenizer counts tokens (mem --snapshot: the BERT the snapshot ran)",
     {{TK_VERB_DATA | TK_VERB_MEM, BOTH}}},
    {"--vocab", "FILE", 0, "a vocab.txt to count tokens with", {{TK_VERB_DATA, BOTH}}},
    {"--max-len", "N", 0, "the max_len the corpus is cut to (512)", {{TK_VERB_DATA, BOTH}}},
    {"--batch", "N", 0, "the batch size (data: of the padding figures; mem: of the planned step; the companion: "
     "of the model's step)", {{TK_VERB_DATA | TK_VERB_MEM, BOTH}, {TK_VERB_PLAN, CO}}},
    {"--seq", "T", 0, "the sequence length of the planned step", {{TK_VERB_MEM, BOTH}, {TK_VERB_PLAN, CO}}},
    {"--device", "KIND", 0, "cpu, cuda or meta (the companion's traced plan: cpu, the step as PyTorch runs it on "
     "this machine's CPU)", {{TK_VERB_MEM, SH}, {TK_VERB_PLAN, CO}}},
    {"--capacity", "SIZE", 0, "a simulated capacity (7.43GiB); with --snapshot the card's size to judge it against",
     {{TK_VERB_MEM, BOTH}}},
    {"--by", "category|owner|layer", 0, "the live bytes grouped by category, owner (HF module names) or layer "
     "(owner)", {{TK_VERB_MEM, BOTH}}},
    {"--timeline", NULL, 0, "allocated/reserved at each step of the session's last run", {{TK_VERB_MEM, CE}}},
    {"--save", "FILE", 0, "FILE.pickle: the allocator as a PyTorch memory snapshot (with the recorded history as "
     "its trace); another name: txkernel's segments, blocks and owners as JSON", {{TK_VERB_MEM, CE}}},
    {"--record", "N|off", TK_OPTION_VALUE_OPTIONAL, "keep the allocator's last N events (262144 when N is left "
     "out) for --save; off stops",
     {{TK_VERB_MEM, CE}}},
    {"--size", "N", 0, "the vocabulary's size", {{TK_VERB_VOCAB, SH}}},
    {"--lowercase", NULL, 0, "lower-case the corpus first", {{TK_VERB_VOCAB, SH}}},
    {"--torch-model", "NAME", 0, "a transformers BERT model in this notebook, planned as PyTorch runs it",
     {{TK_VERB_PLAN, CO}}},
    {"--trainer", "NAME", 0, "a transformers Trainer in this notebook: its model and TrainingArguments",
     {{TK_VERB_PLAN, CO}}},
    {"--precision", "P", 0, "fp32, fp16 or bf16 (autocast)", {{TK_VERB_PLAN, CO}}},
    {"--optimizer", "O", 0, "adamw, adamw8bit or adamw_torch_fused (the traced plan also adam and sgd)", {{TK_VERB_PLAN, CO}}},
    {"--show-config", NULL, 0, "print the engine: pytorch YAML the model was read into", {{TK_VERB_PLAN, CO}}},
    {"--loss", "L", 0, "the traced step's loss when the model computes none: ce (cross-entropy on the output, the "
     "default), mse or bce", {{TK_VERB_PLAN, CO}}},
    {"--checkpointing", "on|off", 0, "the traced step with gradient checkpointing on or off (default: as the "
     "model is set)", {{TK_VERB_PLAN, CO}}},
    {"--trace", NULL, 0, "trace the model's own step even for a BERT head the YAML route plans",
     {{TK_VERB_PLAN, CO}}},
};

static const char *const VERBS[] = {"plan", "train", "advise", "fix", "predict", "data", "mem", "device", "vocab"};
static const char *const DOORS[] = {"shell", "cell", "companion"};

const tk_option *tk_app_options(int *n) {
    *n = (int)(sizeof OPTIONS / sizeof OPTIONS[0]);
    return OPTIONS;
}

const tk_option *tk_app_option_find(const char *name) {
    for (size_t i = 0; name && i < sizeof OPTIONS / sizeof OPTIONS[0]; i++)
        if (!strcmp(OPTIONS[i].name, name)) return &OPTIONS[i];
    return NULL;
}

int tk_app_option_takes(const tk_option *o, tk_verb verb, tk_door door) {
    for (int k = 0; o && k < 4 && o->use[k].verbs; k++)
        if ((o->use[k].verbs & verb) && (o->use[k].doors & door)) return 1;
    return 0;
}

int tk_app_option_valued(const tk_option *o, tk_door door) { return o && o->metavar && !(o->bare_doors & door); }

const char *tk_app_verb_name(tk_verb verb) {
    for (int i = 0; i < (int)(sizeof VERBS / sizeof VERBS[0]); i++)
        if (verb == 1u << i) return VERBS[i];
    return "?";
}

tk_verb tk_app_verb_find(const char *name) {
    for (int i = 0; name && i < (int)(sizeof VERBS / sizeof VERBS[0]); i++)
        if (!strcmp(VERBS[i], name)) return (tk_verb)(1u << i);
    return (tk_verb)0;
}

static json_t *names_of(unsigned mask, const char *const *names, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (mask & (1u << i)) json_array_append_new(a, json_string(names[i]));
    return a;
}

json_t *tk_app_options_json(void) {
    json_t *out = json_array();
    for (size_t i = 0; out && i < sizeof OPTIONS / sizeof OPTIONS[0]; i++) {
        const tk_option *o = &OPTIONS[i];
        json_t *uses = json_array();
        for (int k = 0; uses && k < 4 && o->use[k].verbs; k++)
            json_array_append_new(uses, json_pack("{s:o, s:o}", "verbs", names_of(o->use[k].verbs, VERBS, 9), "doors",
                                                  names_of(o->use[k].doors, DOORS, 3)));
        json_t *e = json_pack("{s:s, s:o, s:o, s:b, s:s, s:o}", "name", o->name, "metavar",
                              o->metavar ? json_string(o->metavar) : json_null(), "bare_in",
                              names_of(o->bare_doors, DOORS, 3), "optional",
                              (o->bare_doors & TK_OPTION_VALUE_OPTIONAL) != 0, "help", o->help, "uses", uses);
        if (!e || json_array_append_new(out, e)) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

char *tk_app_usage_flags(tk_verb verb, tk_door door) {
    tk_sb sb = {0};
    for (size_t i = 0; i < sizeof OPTIONS / sizeof OPTIONS[0]; i++) {
        const tk_option *o = &OPTIONS[i];
        if (!tk_app_option_takes(o, verb, door)) continue;
        if (tk_app_option_valued(o, door) && (o->bare_doors & TK_OPTION_VALUE_OPTIONAL))
            tk_sb_addf(&sb, "%s[%s [%s]]", sb.p ? " " : "", o->name, o->metavar);
        else if (tk_app_option_valued(o, door)) tk_sb_addf(&sb, "%s[%s %s]", sb.p ? " " : "", o->name, o->metavar);
        else tk_sb_addf(&sb, "%s[%s]", sb.p ? " " : "", o->name);
    }
    if (!sb.p) tk_sb_add(&sb, "");
    return tk_sb_take(&sb);
}

/* "-o" and "--x": flags; "-" alone (standard input) and "-1" are words */
static int flagish(const char *w) { return w[0] == '-' && w[1] && !(w[1] >= '0' && w[1] <= '9') && !strchr(w, '='); }

tk_status tk_app_args_parse(tk_verb verb, tk_door door, const char *who, char **argv, int argc, tk_app_args *out,
                            tk_err *err) {
    memset(out, 0, sizeof *out);
    if (argc > TK_APP_MAX_WORDS) {
        tk_err_set(err, TK_EINVAL, "%s: more than %d words", who, TK_APP_MAX_WORDS);
        return TK_EINVAL;
    }
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i];
        if (flagish(w)) {
            const tk_option *o = tk_app_option_find(w);
            if (!o || !tk_app_option_takes(o, verb, door)) {
                char *u = tk_app_usage_flags(verb, door);
                tk_err_set(err, TK_EINVAL, "%s: unknown option %s (%s takes: %s)", who, w, tk_app_verb_name(verb),
                           u && *u ? u : "no flags");
                free(u);
                return TK_EINVAL;
            }
            out->flag[out->n_flags] = o;
            int left_out = (o->bare_doors & TK_OPTION_VALUE_OPTIONAL) &&
                           (i + 1 >= argc || flagish(argv[i + 1]) || strchr(argv[i + 1], '='));
            if (tk_app_option_valued(o, door) && !left_out) {
                if (i + 1 >= argc) {
                    tk_err_set(err, TK_EINVAL, "%s: %s needs a value (%s %s)", who, w, w, o->metavar);
                    return TK_EINVAL;
                }
                out->value[out->n_flags] = argv[++i];
            }
            out->n_flags++;
        } else if (strchr(w, '=') && w[0] != '=' && w[0] != '-') {
            out->kv[out->n_kv++] = w;
        } else {
            out->plain[out->n_plain++] = w;
        }
    }
    return TK_OK;
}

const char *tk_app_arg(const tk_app_args *a, const char *name) {
    const char *v = NULL;
    for (int i = 0; i < a->n_flags; i++)
        if (!strcmp(a->flag[i]->name, name)) v = a->value[i];
    return v;
}

int tk_app_has(const tk_app_args *a, const char *name) {
    for (int i = 0; i < a->n_flags; i++)
        if (!strcmp(a->flag[i]->name, name)) return 1;
    return 0;
}

tk_status tk_app_args_apply(const tk_app_args *a, tk_config *c, tk_err *err) {
    for (int i = 0; i < a->n_kv; i++) {
        char key[128];
        const char *eq = strchr(a->kv[i], '=');
        size_t kn = (size_t)(eq - a->kv[i]);
        if (kn >= sizeof key) {
            tk_err_set(err, TK_EINVAL, "%.60s...: no such config key", a->kv[i]);
            return TK_EINVAL;
        }
        memcpy(key, a->kv[i], kn);
        key[kn] = 0;
        tk_status st = tk_config_set(c, key, eq + 1, err);
        if (st != TK_OK) return st;
    }
    return TK_OK;
}
