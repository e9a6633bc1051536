/* test_config.c — the config language: defaults, natural spellings, every
 * kind of bad input naming its key and line, overrides, validation,
 * to_yaml round trips and diffs. */
#include <stdlib.h>
#include <string.h>
#include "tk_config.h"
#include "tk_test.h"

static tk_status parse(tk_config *c, const char *yaml, tk_err *err) {
    return tk_config_parse_yaml(c, yaml, strlen(yaml), "cell", err);
}

static void test_defaults(void) {
    tk_config c;
    tk_config_defaults(&c);
    TK_CHECK_STR(c.model, "bert-base-cased");
    TK_CHECK_EQ_INT(c.max_len, 128);
    TK_CHECK_EQ_INT(c.batch_size, 32);
    TK_CHECK_EQ_INT(c.epochs, 3);
    TK_CHECK_NEAR(c.lr, 2e-5, 1e-11);
    TK_CHECK_NEAR(c.weight_decay, 0.01, 1e-8);
    TK_CHECK_NEAR(c.adam_beta2, 0.999, 1e-6);
    TK_CHECK_NEAR(c.adam_eps, 1e-8, 1e-15);
    TK_CHECK_NEAR(c.max_grad_norm, 1.0, 0);
    TK_CHECK_STR(c.schedule, "linear");
    TK_CHECK_EQ_INT(c.precision, TK_PREC_FP32);
    TK_CHECK_EQ_INT(c.optimizer, TK_OPTIM_ADAMW);
    TK_CHECK_EQ_INT(c.device, TK_DEVICE_CPU);
    TK_CHECK_EQ_INT(c.accumulate, 1);
    tk_err err = {0};
    TK_CHECK_EQ_INT(tk_config_validate(&c, &err), TK_OK);
}

/* The spellings users write, flat and nested. */
static void test_natural_spellings(void) {
    tk_config c;
    tk_err err = {0};
    tk_config_defaults(&c);
    const char *y =
        "model: bert-base-cased\n"
        "max_len: 512\n"
        "batch_size: 16\n"
        "lr: 3e-5\n"
        "device: {gpu: t4}\n"
        "capacity: 7.43GiB\n"
        "precision: fp16\n"
        "accumulate: 4\n"
        "recompute: layers\n"
        "freeze: layers:6\n"
        "optimizer: adamw8bit\n"
        "attention: fused\n"
        "batching: buckets\n"
        "empty_cache: every:50\n"
        "head: flatten_dense\n"
        "head_units: 1604\n";
    TK_CHECK_EQ_INT(parse(&c, y, &err), TK_OK);
    TK_CHECK_MSG(err.msg[0] == 0, "%s", err.msg);
    TK_CHECK_EQ_INT(c.max_len, 512);
    TK_CHECK_EQ_INT(c.batch_size, 16);
    TK_CHECK_NEAR(c.lr, 3e-5, 1e-11);
    TK_CHECK_STR(c.gpu, "t4");
    size_t cap;
    TK_CHECK(tk_parse_bytes("7.43GiB", &cap) == 0);
    TK_CHECK_EQ_INT(c.capacity, cap);
    TK_CHECK_EQ_INT(c.precision, TK_PREC_FP16);
    TK_CHECK_EQ_INT(c.accumulate, 4);
    TK_CHECK_EQ_INT(c.recompute, TK_RECOMPUTE_LAYERS);
    TK_CHECK_EQ_INT(c.freeze_layers, 6);
    TK_CHECK_EQ_INT(c.freeze_embeddings, 0);
    TK_CHECK_EQ_INT(c.optimizer, TK_OPTIM_ADAMW8);
    TK_CHECK_EQ_INT(c.attention, TK_ATTN_FUSED);
    TK_CHECK_EQ_INT(c.batching, TK_BATCH_BUCKETS);
    TK_CHECK_EQ_INT(c.empty_cache, TK_EMPTY_EVERY);
    TK_CHECK_EQ_INT(c.empty_cache_every, 50);
    TK_CHECK_EQ_INT(c.head, TK_HEAD_FLATTEN_DENSE);
    TK_CHECK_EQ_INT(c.head_units, 1604);

    tk_config_defaults(&c);
    const char *nested =
        "model:\n"
        "  name: bert-tiny\n"
        "  hidden: 128\n"
        "data:\n"
        "  train: data/train.csv\n"
        "  dev: data/dev.csv\n"
        "  text_col: sentence\n"
        "train:\n"
        "  learning_rate: 5e-5\n"
        "  num_train_epochs: 2\n"
        "  per_device_train_batch_size: 8\n"
        "  gradient_checkpointing: true\n"
        "  freeze: [embeddings, layers:2]\n"
        "device:\n"
        "  device: cpu\n"
        "  capacity: 800MiB\n";
    TK_CHECK_EQ_INT(parse(&c, nested, &err), TK_OK);
    TK_CHECK_MSG(1, "%s", err.msg);
    TK_CHECK_STR(c.model, "bert-tiny");
    TK_CHECK_EQ_INT(c.hidden, 128);
    TK_CHECK_STR(c.train_file, "data/train.csv");
    TK_CHECK_STR(c.dev_file, "data/dev.csv");
    TK_CHECK_STR(c.text_col, "sentence");
    TK_CHECK_NEAR(c.lr, 5e-5, 1e-11);
    TK_CHECK_EQ_INT(c.epochs, 2);
    TK_CHECK_EQ_INT(c.batch_size, 8);
    TK_CHECK_EQ_INT(c.recompute, TK_RECOMPUTE_LAYERS);
    TK_CHECK_EQ_INT(c.freeze_embeddings, 1);
    TK_CHECK_EQ_INT(c.freeze_layers, 2);
    TK_CHECK_EQ_INT(c.device, TK_DEVICE_CPU);
    TK_CHECK_EQ_INT(c.capacity, 800u << 20);

    /* `gpu: t4` flat, `device: t4` as a profile, `device: meta` as a device */
    tk_config_defaults(&c);
    TK_CHECK_EQ_INT(parse(&c, "gpu: T4\n", &err), TK_OK);
    TK_CHECK_STR(c.gpu, "t4");
    tk_config_defaults(&c);
    TK_CHECK_EQ_INT(parse(&c, "device: t4\n", &err), TK_OK);
    TK_CHECK_STR(c.gpu, "t4");
    TK_CHECK_EQ_INT(parse(&c, "device: meta\nfreeze: embeddings\n", &err), TK_OK);
    TK_CHECK_EQ_INT(c.device, TK_DEVICE_META);
    TK_CHECK_EQ_INT(c.freeze_embeddings, 1);
    TK_CHECK_EQ_INT(c.freeze_layers, 0);
    /* an empty document and a comment-only cell change nothing */
    tk_config before = c;
    TK_CHECK_EQ_INT(parse(&c, "", &err), TK_OK);
    TK_CHECK_EQ_INT(parse(&c, "# just a comment\n", &err), TK_OK);
    char *d = tk_config_diff(&before, &c);
    TK_CHECK_STR(d, "");
    free(d);
}

/* One bad config, the line the error must name, and the exact text that must
 * follow "cell:LINE: ". */
typedef struct { const char *yaml; int line; const char *expect; } bad_case;

static const bad_case BAD[] = {
    {"batchsize: 32\n", 1, "unknown key 'batchsize' (did you mean 'batch_size'?)"},
    {"model: bert-base-cased\nmax_len: 512\nbatch_sise: 8\n", 3, "unknown key 'batch_sise' (did you mean 'batch_size'?)"},
    {"epoch: 3\n", 1, "unknown key 'epoch' (did you mean 'epochs'?)"},
    {"max_lenght: 256\n", 1, "unknown key 'max_lenght' (did you mean 'max_len'?)"},
    {"learnig_rate: 1e-4\n", 1, "unknown key 'learnig_rate' (did you mean 'lr'?)"},
    {"train:\n  lr: 1e-5\n  warmpu_ratio: 0.1\n", 3, "unknown key 'warmpu_ratio' (did you mean 'warmup_ratio'?)"},
    {"flux_capacitor: 1\n", 1, "unknown key 'flux_capacitor' (%txkeys or `txk keys` lists every key)"},
    {"model: bert-tiny\n\n# the batch\n\nbatch_size: x\n", 5, "batch_size: 'x' is not an integer"},
    {"model: bert-base-cased\nmax_len: 512\nbatch_size: 32\nlr: 2e-5\nprecision: fp8\n", 5, "precision: 'fp8' is not one of fp32, fp16, bf16"},
    {"optimizer: sgd\n", 1, "optimizer: 'sgd' is not one of adamw, adamw8bit, adamw_torch_fused"},
    {"attention: flash\n", 1, "attention: 'flash' is not one of standard, fused, auto"},
    {"batching: random\n", 1, "batching: 'random' is not one of fixed, dynamic, buckets"},
    {"head: mlp\n", 1, "head: 'mlp' is not one of pooled, span, flatten_dense"},
    {"task: ner\n", 1, "task: 'ner' is not one of classify, qa"},
    {"device: tpu\n", 1, "device: 'tpu' is not one of auto, cpu, cuda, meta"},
    {"recompute: some\n", 1, "recompute: 'some' is not one of none, layers, attention"},
    {"schedule: cosine\n", 1, "schedule: 'cosine' is not one of linear, constant"},
    {"empty_cache: sometimes\n", 1, "empty_cache: 'sometimes' is not one of never, on_oom, every:N"},
    {"empty_cache: every:0\n", 1, "empty_cache: 'every:0': every:N needs a whole number of steps N >= 1"},
    {"freeze: bottom\n", 1, "freeze: 'bottom' is not one of none, embeddings, layers:N (or a comma list)"},
    {"batch_size: 0\n", 1, "batch_size: 0 is out of range (must be 1..1048576)"},
    {"batch_size: -4\n", 1, "batch_size: -4 is out of range (must be 1..1048576)"},
    {"batch_size: lots\n", 1, "batch_size: 'lots' is not an integer"},
    {"batch_size: 2.5\n", 1, "batch_size: '2.5' is not a whole number"},
    {"accumulate: 0\n", 1, "accumulate: 0 is out of range (must be 1..1048576)"},
    {"lr: -1e-5\n", 1, "lr: -1e-05 is out of range (must be > 0)"},
    {"lr: fast\n", 1, "lr: 'fast' is not a number"},
    {"dropout: 1.5\n", 1, "dropout: 1.5 is out of range (must be 0..0.999)"},
    {"max_len: 4\n", 1, "max_len: 4 is out of range (must be 8..65536)"},
    {"capacity: lots\n", 1, "capacity: 'lots' is not a size (write e.g. 7.43GiB, 800MiB, 16GB or a byte count)"},
    {"capacity: -2GiB\n", 1, "capacity: '-2GiB' must not be negative"},
    {"seed: -1\n", 1, "seed: '-1' must not be negative"},
    {"batch_size: [8, 16]\n", 1, "batch_size: expected a value, got a list"},
    {"max_len:\n  a: 1\n", 1, "max_len: expected a value, got a map"},
    {"epochs:\n", 1, "epochs: has no value"},
    {"lr: 1e-5\nlr: 2e-5\n", 2, "lr: set twice in this document"},
    {"- batch_size: 8\n", 1, "expected `key: value` lines, got a list"},
    {"data:\n  train: x.csv\n  txt_col: body\n", 3, "unknown key 'txt_col' (did you mean 'text_col'?)"},
    {"device:\n  gpu: t5\n", 2, "gpu: 't5' is not a known GPU profile"},
    {"freeze_embeddings: maybe\n", 1, "freeze_embeddings: 'maybe' is not an integer"},
    {"engine: jax\n", 1, "engine: 'jax' is not one of txkernel, pytorch"},
    {"attn_implementation: flash_attention_2\n", 1, "attn_implementation: 'flash_attention_2' is not one of sdpa, eager"},
    {"attention_dropout: 1.5\n", 1, "attention_dropout: '1.5' is not a probability 0 <= p < 1 (or `dropout`: the dropout key's value)"},
    {"torch_version: 2.16\n", 1, "torch_version: '2.16' is not one of 2, 1.13, 1.10, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, "
                                  "2.6, 2.7, 2.8, 2.9, 2.10, 2.11, 2.12, 2.13, 2.14, 2.15"},
};

/* attention: auto, the default, is decided by one rule (tk_config_attention):
 * on a card (cuda, or gpu: PROFILE on any device) fused where a tensor-core
 * kernel runs it for the precision, head size and card, else standard
 * unless only fused fits (the `fits` callback); standard on the cpu; a
 * config that names one keeps it on every device. */
static int fits_fused_only(const tk_config *c, void *u) {
    ++*(int *)u;
    return c->attention == TK_ATTN_FUSED;
}
static int fits_both(const tk_config *c, void *u) {
    (void)c;
    ++*(int *)u;
    return 1;
}

static void test_attention_default(void) {
    tk_config c;
    tk_err err = {0};
    const char *why = NULL;
    int asked = 0;
    tk_config_defaults(&c);
    TK_CHECK_EQ_INT(c.attention, TK_ATTN_AUTO);
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_META, &why), TK_ATTN_STANDARD); /* device: cpu */
    TK_CHECK_STR(why, "default on the cpu");
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_CPU, NULL), TK_ATTN_STANDARD);
    /* device: auto found cuda; fp32 (the default): only the reference kernel would run fused */
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_CUDA, &why), TK_ATTN_STANDARD);
    TK_CHECK_STR(why, TK_ATTN_WHY_SLOW);
    TK_CHECK_EQ_INT(tk_config_set(&c, "precision", "bf16", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_CUDA, &why), TK_ATTN_FUSED); /* a card not named: sm80 */
    TK_CHECK_STR(why, TK_ATTN_WHY_FAST);
    TK_CHECK_EQ_INT(tk_config_set(&c, "device", "cuda", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_META, NULL), TK_ATTN_FUSED);
    TK_CHECK_EQ_INT(tk_config_set(&c, "heads", "24", &err), TK_OK); /* bert-base's 768 / 24: head size 32 */
    TK_CHECK_EQ_INT(tk_config_set(&c, "hidden", "768", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_META, NULL), TK_ATTN_STANDARD);
    tk_config_defaults(&c); /* a plan for a t4, made on a machine without one */
    TK_CHECK_EQ_INT(tk_config_set(&c, "gpu", "t4", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_META, &why), TK_ATTN_STANDARD);
    TK_CHECK_STR(why, TK_ATTN_WHY_SLOW);
    /* memory: the t4's capacity is known; fused only when standard does not fit and fused does */
    TK_CHECK_EQ_INT(tk_config_attention_fit(&c, TK_DEV_META, fits_fused_only, &asked, &why), TK_ATTN_FUSED);
    TK_CHECK_STR(why, TK_ATTN_WHY_FITS);
    TK_CHECK_EQ_INT(asked, 2);
    TK_CHECK_EQ_INT(tk_config_attention_fit(&c, TK_DEV_META, fits_both, &asked, &why), TK_ATTN_STANDARD);
    TK_CHECK_EQ_INT(asked, 3); /* standard fits: fused is not asked */
    TK_CHECK_EQ_INT(tk_config_set(&c, "precision", "fp16", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_attention_fit(&c, TK_DEV_META, fits_both, &asked, &why), TK_ATTN_FUSED);
    TK_CHECK_STR(why, TK_ATTN_WHY_FAST);
    TK_CHECK_EQ_INT(asked, 3); /* a fast kernel: memory is not asked */
    TK_CHECK_EQ_INT(tk_config_set(&c, "precision", "bf16", &err), TK_OK); /* the t4 has no bf16 tensor-core kernel */
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_META, NULL), TK_ATTN_STANDARD);
    TK_CHECK_EQ_INT(tk_config_set(&c, "gpu", "h100-80", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_META, NULL), TK_ATTN_FUSED);
    tk_config_defaults(&c); /* device: cuda without a capacity: memory is not known, not asked */
    TK_CHECK_EQ_INT(tk_config_set(&c, "device", "cuda", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_attention_fit(&c, TK_DEV_META, fits_fused_only, &asked, &why), TK_ATTN_STANDARD);
    TK_CHECK_EQ_INT(asked, 3);
    TK_CHECK_EQ_INT(tk_config_set(&c, "gpu", "t4", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_set(&c, "attention", "fused", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_META, &why), TK_ATTN_FUSED);
    TK_CHECK_STR(why, "set in the config");
    TK_CHECK_EQ_INT(tk_config_set(&c, "attention", "standard", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_CUDA, &why), TK_ATTN_STANDARD);
    TK_CHECK_STR(why, "set in the config");
    tk_config_defaults(&c);
    TK_CHECK_EQ_INT(tk_config_set(&c, "attention", "fused", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_attention(&c, TK_DEV_CPU, NULL), TK_ATTN_FUSED);
    TK_CHECK_EQ_INT(tk_config_set(&c, "attention", "auto", &err), TK_OK);
    TK_CHECK_EQ_INT(c.attention, TK_ATTN_AUTO);
    char *y = tk_config_to_yaml(&c);
    TK_CHECK(y && strstr(y, "attention: auto\n"));
    free(y);
}

static void test_bad_configs(void) {
    int n = (int)(sizeof BAD / sizeof BAD[0]);
    TK_CHECK(n >= 25);
    for (int i = 0; i < n; i++) {
        tk_config c, orig;
        tk_config_defaults(&c);
        c.batch_size = 7; /* a previous value the failed parse must keep */
        orig = c;
        tk_err err = {0};
        tk_status st = parse(&c, BAD[i].yaml, &err);
        TK_CHECK_MSG(st == TK_EINVAL, "case %d accepted: %s", i, BAD[i].yaml);
        char want[1100];
        snprintf(want, sizeof want, "cell:%d: %s", BAD[i].line, BAD[i].expect);
        /* the profile list after "profile" depends on the runtime's table */
        if (strstr(BAD[i].expect, "GPU profile"))
            TK_CHECK_MSG(strncmp(err.msg, want, strlen(want)) == 0, "case %d: got \"%s\" want \"%s...\"", i,
                         err.msg, want);
        else
            TK_CHECK_MSG(strcmp(err.msg, want) == 0, "case %d: got \"%s\" want \"%s\"", i, err.msg, want);
        char *d = tk_config_diff(&orig, &c);
        TK_CHECK_MSG(d && !d[0], "case %d changed the config: %s", i, d ? d : "(null)");
        free(d);
    }
}

static void test_yaml_syntax_error(void) {
    tk_config c;
    tk_err err = {0};
    tk_config_defaults(&c);
    TK_CHECK_EQ_INT(parse(&c, "model: bert\nmax_len: 512\nbatch_size: [32\nlr: 1\n", &err), TK_EINVAL);
    TK_CHECK_MSG(strncmp(err.msg, "cell:", 5) == 0 && strstr(err.msg, "YAML syntax error"), "%s", err.msg);
    int line = atoi(err.msg + 5);
    TK_CHECK_MSG(line >= 3 && line <= 5, "line %d: %s", line, err.msg);
    TK_CHECK_EQ_INT(parse(&c, "a: 1\n  b: 2\n", &err), TK_EINVAL);
    TK_CHECK_MSG(strstr(err.msg, "cell:2: YAML syntax error") != NULL, "%s", err.msg);
    TK_CHECK_EQ_INT(parse(&c, "lr: 1e-5\n---\nlr: 2e-5\n", &err), TK_EINVAL);
    TK_CHECK_MSG(strstr(err.msg, "cell:3: only one YAML document") != NULL, "%s", err.msg);
    /* a body that starts on line 2 of its cell: every line number moves by one */
    TK_CHECK_EQ_INT(tk_config_parse_yaml_at(&c, "lr: 1e-5\nbatchsize: 8\n", 21, "cell", 2, &err), TK_EINVAL);
    TK_CHECK_MSG(!strncmp(err.msg, "cell:3: unknown key 'batchsize'", 31), "%s", err.msg);
    TK_CHECK_EQ_INT(tk_config_parse_yaml_at(&c, "a: 1\n  b: 2\n", 12, "cell", 2, &err), TK_EINVAL);
    TK_CHECK_MSG(strstr(err.msg, "cell:3: YAML syntax error") != NULL, "%s", err.msg);
    TK_CHECK_EQ_INT(tk_config_parse_yaml_at(&c, "lr: 1e-5\n---\nlr: 2e-5\n", 22, "cell", 2, &err), TK_EINVAL);
    TK_CHECK_MSG(strstr(err.msg, "cell:4: only one YAML document") != NULL, "%s", err.msg);
}

static void test_set_and_dotted(void) {
    tk_config c;
    tk_err err = {0};
    tk_config_defaults(&c);
    TK_CHECK_EQ_INT(tk_config_set(&c, "batch_size", "16", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_set(&c, "train.max_len", "256", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_set(&c, "device.gpu", "t4", &err), TK_OK);
    TK_CHECK_EQ_INT(c.batch_size, 16);
    TK_CHECK_EQ_INT(c.max_len, 256);
    TK_CHECK_STR(c.gpu, "t4");
    TK_CHECK_EQ_INT(tk_config_set(&c, "batchsize", "16", &err), TK_EINVAL);
    TK_CHECK_STR(err.msg, "unknown key 'batchsize' (did you mean 'batch_size'?)");
    TK_CHECK_EQ_INT(tk_config_set(&c, "precision", "fp8", &err), TK_EINVAL);
    TK_CHECK_STR(err.msg, "precision: 'fp8' is not one of fp32, fp16, bf16");
    TK_CHECK_EQ_INT(tk_config_set(&c, "nosuch.batch_size", "1", &err), TK_EINVAL);
    TK_CHECK_EQ_INT(c.batch_size, 16);
    TK_CHECK(tk_config_key_help("batch_size") != NULL);
    TK_CHECK(tk_config_key_help("train.lr") != NULL);
    TK_CHECK(tk_config_key_help("nope") == NULL);
    int n = 0, has_freeze = 0;
    for (const char *const *k = tk_config_keys(); *k; k++, n++) {
        TK_CHECK_MSG(tk_config_key_help(*k) != NULL, "no help for %s", *k);
        has_freeze |= !strcmp(*k, "freeze");
    }
    TK_CHECK(n > 50);
    TK_CHECK(has_freeze);
    /* an over-long string is refused, not truncated */
    char longv[TK_PATH_MAX + 10];
    memset(longv, 'x', sizeof longv - 1);
    longv[sizeof longv - 1] = 0;
    TK_CHECK_EQ_INT(tk_config_set(&c, "model", longv, &err), TK_EINVAL);
    TK_CHECK(strstr(err.msg, "model: value is") == err.msg);
}

/* engine: pytorch's keys (issue 26): defaults, transformers' own spellings,
 * and attention_dropout following `dropout` until it is set. */
static void test_engine_keys(void) {
    tk_config c;
    tk_err err = {0};
    tk_config_defaults(&c);
    TK_CHECK_EQ_INT(c.engine, TK_ENGINE_TXKERNEL);
    TK_CHECK_EQ_INT(c.attn_implementation, TK_ATTN_IMPL_SDPA);
    TK_CHECK_EQ_INT(c.torch_version, TK_TORCH_2);
    TK_CHECK(c.attention_dropout < 0);
    const char *y = "engine: pytorch\nattn_implementation: eager\nattention_probs_dropout_prob: 0\n"
                    "hidden_dropout_prob: 0.2\ntorch_version: 1.13\n";
    TK_CHECK_EQ_INT(tk_config_parse_yaml(&c, y, strlen(y), "cell", &err), TK_OK);
    TK_CHECK_EQ_INT(c.engine, TK_ENGINE_PYTORCH);
    TK_CHECK_EQ_INT(c.attn_implementation, TK_ATTN_IMPL_EAGER);
    TK_CHECK_EQ_INT(c.torch_version, TK_TORCH_1_13);
    TK_CHECK(c.attention_dropout == 0.0f && c.dropout > 0.19f && c.dropout < 0.21f);
    char *out = tk_config_to_yaml(&c);
    TK_CHECK(out && strstr(out, "engine: pytorch\n") && strstr(out, "attention_dropout: 0\n") &&
             strstr(out, "torch_version: 1.13\n"));
    const char *y10 = "torch_version: 1.10\n";
    TK_CHECK_EQ_INT(tk_config_parse_yaml(&c, y10, strlen(y10), "cell", &err), TK_OK);
    TK_CHECK_EQ_INT(c.torch_version, TK_TORCH_1_10);
    free(out);
    TK_CHECK_EQ_INT(tk_config_set(&c, "attention_dropout", "dropout", &err), TK_OK);
    TK_CHECK(c.attention_dropout < 0);
    /* two GPUs (issue 34): DataParallel by default, as the Trainer; the
     * Trainer's own spellings of DDP's bucket size and of fused AdamW */
    TK_CHECK_EQ_INT(c.parallel, TK_PAR_DATAPARALLEL);
    const char *yp = "parallel: ddp\nddp_bucket_cap_mb: 50\noptim: adamw_torch_fused\n";
    TK_CHECK_EQ_INT(tk_config_parse_yaml(&c, yp, strlen(yp), "cell", &err), TK_OK);
    TK_CHECK(c.parallel == TK_PAR_DDP && c.bucket_cap_mb == 50 && c.optimizer == TK_OPTIM_ADAMW_FUSED);
    TK_CHECK_EQ_INT(tk_config_set(&c, "parallel", "fsdp", &err), TK_EINVAL);
    TK_CHECK_MSG(strstr(err.msg, "parallel: 'fsdp' is not one of dataparallel, ddp, zero2") != NULL, "%s", err.msg);
}

static void test_validate(void) {
    static const struct { const char *yaml, *expect_prefix; } V[] = {
        {"hidden: 100\nheads: 12\n", "heads: 12 does not divide hidden 100"},
        {"max_position: 128\nmax_len: 512\n", "max_len: 512 exceeds"},
        {"task: qa\nhead: pooled\n", "head: pooled does not predict"},
        {"task: classify\nhead: span\n", "head: span predicts"},
        {"towers: 2\n", "towers: 2 towers"},
        {"epochs: 0\n", "epochs: is 0"},
        {"layers: 4\nfreeze_layers: 6\n", "freeze_layers: 6 but the model has 4"},
        {"task: qa\nhead: span\nmax_len: 64\ndoc_stride: 64\n", "doc_stride: 64 must be smaller"},
        {"adamw8_fp32_embeddings: 1\n", "adamw8_fp32_embeddings: only applies"},
    };
    for (size_t i = 0; i < sizeof V / sizeof V[0]; i++) {
        tk_config c;
        tk_err err = {0};
        tk_config_defaults(&c);
        TK_CHECK_MSG(parse(&c, V[i].yaml, &err) == TK_OK, "%s", err.msg);
        TK_CHECK_EQ_INT(tk_config_validate(&c, &err), TK_EINVAL);
        TK_CHECK_MSG(strncmp(err.msg, V[i].expect_prefix, strlen(V[i].expect_prefix)) == 0,
                     "case %zu: got \"%s\"", i, err.msg);
    }
}

/* parse -> to_yaml -> parse gives the same config, for defaults and for a
 * config that moves every kind of key off its default. */
static void roundtrip(const tk_config *c) {
    char *y = tk_config_to_yaml(c);
    TK_CHECK(y != NULL);
    tk_config back;
    tk_err err = {0};
    tk_config_defaults(&back);
    back.batch_size = 999;
    TK_CHECK_MSG(tk_config_parse_yaml(&back, y, strlen(y), "to_yaml", &err) == TK_OK, "%s\n%s", err.msg, y);
    char *d = tk_config_diff(c, &back);
    TK_CHECK_MSG(d && !d[0], "round trip differs:\n%s", d ? d : "(null)");
    TK_CHECK(memcmp(c->model, back.model, sizeof c->model) == 0);
    TK_CHECK(c->lr == back.lr && c->adam_eps == back.adam_eps && c->dropout == back.dropout);
    TK_CHECK(c->capacity == back.capacity && c->seed == back.seed);
    free(d);
    free(y);
}

static void test_roundtrip(void) {
    tk_config c;
    tk_err err = {0};
    tk_config_defaults(&c);
    roundtrip(&c);
    const char *y =
        "model: ./models/my \"quoted\" bert\n"
        "vocab: 'vocab: with colon.txt'\n"
        "hidden: 256\nlayers: 4\nheads: 4\nlowercase: true\ndropout: 0.123456789\n"
        "train_file: a.csv\ntext_pair_col: q\nmax_examples: 1000\n"
        "task: qa\nhead: flatten_dense\nhead_units: 1604\ntowers: 2\nmax_len: 384\ndoc_stride: 128\n"
        "batch_size: 3\neval_batch_size: 64\nepochs: 1\nmax_steps: 77\nlr: 3.3e-5\n"
        "warmup_ratio: 0.06\nschedule: constant\nseed: 18446744073709551615\n"
        "precision: bf16\naccumulate: 8\nrecompute: attention\nfreeze: embeddings,layers:3\n"
        "optimizer: adamw8bit\nadamw8_fp32_embeddings: 1\nattention: fused\nbatching: dynamic\n"
        "buckets: 5\nempty_cache: every:25\ndevice: meta\ncapacity: 7.43GiB\ngpu: t4\nthreads: 2\n"
        "output_dir: /tmp/ck\nlog_every: 3\n";
    TK_CHECK_MSG(parse(&c, y, &err) == TK_OK, "%s", err.msg);
    TK_CHECK_STR(c.model, "./models/my \"quoted\" bert");
    TK_CHECK_STR(c.vocab, "vocab: with colon.txt");
    TK_CHECK_EQ_INT(tk_config_validate(&c, &err), TK_OK);
    roundtrip(&c);
    TK_CHECK_EQ_INT(tk_config_set(&c, "empty_cache", "on_oom", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_set(&c, "lowercase", "auto", &err), TK_OK);
    roundtrip(&c);
}

static void test_diff(void) {
    tk_config a, b;
    tk_err err = {0};
    tk_config_defaults(&a);
    b = a;
    TK_CHECK_EQ_INT(parse(&b, "max_len: 256\nprecision: fp16\nfreeze: embeddings\n", &err), TK_OK);
    char *d = tk_config_diff(&a, &b);
    TK_CHECK_STR(d, "max_len: 128 -> 256\nprecision: fp32 -> fp16\nfreeze_embeddings: 0 -> 1\n");
    free(d);
    TK_CHECK_EQ_INT(tk_config_set(&b, "model", "bert-tiny", &err), TK_OK);
    d = tk_config_diff(&a, &b);
    TK_CHECK(strncmp(d, "model: \"bert-base-cased\" -> \"bert-tiny\"\n", 40) == 0);
    free(d);
}

static void test_resolve_model(void) {
    tk_config c;
    tk_err err = {0};
    tk_config_defaults(&c);
    TK_CHECK_EQ_INT(tk_config_resolve_model(&c, &err), TK_OK);
    TK_CHECK_EQ_INT(c.hidden, 768);
    TK_CHECK_EQ_INT(c.layers, 12);
    TK_CHECK_EQ_INT(c.heads, 12);
    TK_CHECK_EQ_INT(c.intermediate, 3072);
    TK_CHECK_EQ_INT(c.vocab_size, 28996);
    TK_CHECK_EQ_INT(c.max_position, 512);
    TK_CHECK_EQ_INT(c.lowercase, 0);
    /* an explicit dimension survives resolution */
    tk_config_defaults(&c);
    TK_CHECK_EQ_INT(tk_config_set(&c, "layers", "2", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_resolve_model(&c, &err), TK_OK);
    TK_CHECK_EQ_INT(c.layers, 2);
    TK_CHECK_EQ_INT(c.hidden, 768);
    TK_CHECK_EQ_INT(tk_config_set(&c, "model", "no-such-model", &err), TK_OK);
    TK_CHECK_EQ_INT(tk_config_resolve_model(&c, &err), TK_EINVAL);
    TK_CHECK(strstr(err.msg, "no-such-model") != NULL);
}

int main(void) {
    TK_RUN(test_defaults);
    TK_RUN(test_natural_spellings);
    TK_RUN(test_attention_default);
    TK_RUN(test_bad_configs);
    TK_RUN(test_yaml_syntax_error);
    TK_RUN(test_set_and_dotted);
    TK_RUN(test_engine_keys);
    TK_RUN(test_validate);
    TK_RUN(test_roundtrip);
    TK_RUN(test_diff);
    TK_RUN(test_resolve_model);
    return tk_test_done();
}
