/* train_cpu.c — whole training steps of a BERT classifier on the cpu
 * backend: forward, backward, zero_grad, AdamW with weight decay and
 * clipping at 1.0 (HF Trainer defaults), timed per step, with the peak
 * memory the step needs.
 *
 *   train_cpu [--model bert-mini] [--batch 16] [--seq 128] [--threads N] [--steps S]
 *             [--device cpu|cuda] [--data FILE.csv --vocab vocab.txt] [key=value ...]
 *
 * --data: real lengths instead of the synthetic full batch: the file's
 * first (S + 1) * B examples (text, label columns) in file order, tokenized
 * with --vocab (lower-cased) and truncated to --seq, in batches of B padded
 * to each batch's longest (batching: dynamic, as a run with that key); step
 * s takes batch s. The JSON then lists each timed step's padded length
 * (seq_lens) and the real tokens. train_gpu/train_hf.py --data does the
 * same examples with HF's tokenizer and DataCollatorWithPadding.
 *
 * On cuda the JSON also gives the step's FLOPs (6 N B T + 12 L B T^2 H, N
 * the parameters outside the embeddings; summed over the timed steps'
 * lengths), the card's dense peak for the precision (gpu/profile.c, by the
 * device's name; tf32 when the tf32 key is on and the precision fp32) and
 * the MFU, or null where the card has no profile.
 *
 * --device cuda runs the same steps on the GPU (bench/train_gpu/run.py):
 * each step ends with a device sync before it is timed, and the JSON adds
 * CUPTI's device peak (every device allocation in the process) and the
 * plugin's fixed buffers; the RSS figures then describe the host side only.
 *
 * Each step is tk_train_step, the step tk_train_run and the planner run.
 * One warm-up step (it allocates the AdamW moments), then S steps. Prints one
 * JSON line: step times (min, mean), samples/s from the mean, the allocator's
 * peak allocated/reserved bytes, and the process' peak RSS growth over its
 * RSS before the model was built. train_torch.py does the same in torch;
 * run.py runs both and prints ratios. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "tk_data.h"
#include "tk_model.h"
#include "tk_train.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Current and peak resident set, bytes (from /proc/self/status). */
static void rss(size_t *cur, size_t *peak) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    *cur = *peak = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long kb;
        if (sscanf(line, "VmRSS: %lu kB", &kb) == 1) *cur = kb * 1024;
        if (sscanf(line, "VmHWM: %lu kB", &kb) == 1) *peak = kb * 1024;
    }
    if (f) fclose(f);
}

int main(int argc, char **argv) {
    const char *model = "bert-mini";
    int B = 16, T = 128, threads = 1, steps = 5, cuda = 0;
    const char *data = NULL, *vocab = NULL;
    for (int i = 1; i < argc; i += 2) {
        if (strchr(argv[i], '=') && argv[i][0] != '-') { i--; continue; } /* key=value: below */
        if (i + 1 >= argc) { fprintf(stderr, "train_cpu: %s needs a value\n", argv[i]); return 2; }
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--data")) data = argv[i + 1];
        else if (!strcmp(argv[i], "--vocab")) vocab = argv[i + 1];
        else if (!strcmp(argv[i], "--device") && (!strcmp(argv[i + 1], "cpu") || !strcmp(argv[i + 1], "cuda")))
            cuda = !strcmp(argv[i + 1], "cuda");
        else { fprintf(stderr, "train_cpu: unknown option %s\n", argv[i]); return 2; }
    }
    if (B < 1 || T < 2 || steps < 1) { fprintf(stderr, "train_cpu: bad sizes\n"); return 2; }
    if (!data != !vocab) { fprintf(stderr, "train_cpu: --data and --vocab go together\n"); return 2; }
    size_t rss0, hwm0;
    rss(&rss0, &hwm0);
    tk_err err = {0};
    tk_config c;
    tk_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "%s", model);
    c.num_labels = 2;
    c.batch_size = B;
    c.max_len = T;
    c.threads = threads;
    c.device = cuda ? TK_DEVICE_CUDA : TK_DEVICE_CPU;
    /* key=value words set config keys: the memory-saving techniques
     * (precision=fp16 recompute=layers attention=fused optimizer=adamw8bit
     * freeze_embeddings=true ...) */
    char tech[512] = "";
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') { i++; continue; }
        char kv[256];
        snprintf(kv, sizeof kv, "%s", argv[i]);
        char *eq = strchr(kv, '=');
        if (!eq) { fprintf(stderr, "train_cpu: unexpected '%s'\n", argv[i]); return 2; }
        *eq = 0;
        if (tk_config_set(&c, kv, eq + 1, &err) != TK_OK) { fprintf(stderr, "train_cpu: %s\n", err.msg); return 2; }
        size_t l = strlen(tech);
        snprintf(tech + l, sizeof tech - l, "%s%s", l ? " " : "", argv[i]);
    }
    /* --data: the batches a run with batching: dynamic makes of the file's
     * first (steps + 1) * B examples, in file order */
    int nb = steps + 1;
    tk_data_batch *db = calloc((size_t)nb, sizeof *db);
    if (data) {
        tk_dataset *ds = NULL;
        tk_features *f = NULL;
        tk_batches *bs = NULL;
        tk_data_cols cols = {.text = "text", .label = "label"};
        tk_tokenizer_opts to = {.lowercase = 1, .strip_accents = -1};
        tk_tokenizer *tok = tk_tokenizer_new(vocab, &to, &err);
        tk_batching_opts bo = {.strategy = TK_BATCH_DYNAMIC, .batch_size = B, .drop_last = 1};
        if (!tok || tk_dataset_load(data, &cols, &ds, &err) != TK_OK) { fprintf(stderr, "train_cpu: %s\n", err.msg); return 1; }
        if (ds->n < nb * B) { fprintf(stderr, "train_cpu: %s has %d examples, %d steps of %d need %d\n", data, ds->n, nb, B, nb * B); return 2; }
        if (tk_features_classify(tok, ds, T, TK_TRUNC_LONGEST_FIRST, &f, &err) != TK_OK ||
            !(bs = tk_batches_new(f, &bo, tk_tokenizer_special(tok).pad, &err))) { fprintf(stderr, "train_cpu: %s\n", err.msg); return 1; }
        for (int i = 0; i < nb; i++)
            if (tk_batches_get(bs, 0, i, &db[i], &err) != TK_OK) { fprintf(stderr, "train_cpu: %s\n", err.msg); return 1; }
        c.num_labels = ds->num_labels;
        c.batching = TK_BATCH_DYNAMIC;
        tk_batches_destroy(&bs);
        tk_features_destroy(&f);
        tk_dataset_destroy(&ds);
        tk_tokenizer_destroy(&tok);
    }
    tk_model_opts o;
    if (tk_config_resolve_model(&c, &err) != TK_OK || tk_model_opts_from_config(&o, &c, &err) != TK_OK) {
        fprintf(stderr, "train_cpu: %s\n", err.msg);
        return 1;
    }
    o.seed = 1;
    tk_dev_opts dopts = {.kind = cuda ? TK_DEV_CUDA : TK_DEV_CPU, .threads = threads};
    tk_dev *d = tk_dev_new(&dopts, &err);
    tk_model *m = d ? tk_model_new(d, &o, &err) : NULL;
    if (!m || tk_model_init_random(m, 1, &err) != TK_OK) { fprintf(stderr, "train_cpu: %s\n", err.msg); return 1; }
    /* the run's own step (tk_train_step) at a constant 2e-5 */
    c.lr = 2e-5f;
    c.warmup_ratio = 0;
    snprintf(c.schedule, sizeof c.schedule, "constant");
    tk_trainer tr;
    if (tk_trainer_open(&tr, &c, m, steps + 1, &err) != TK_OK) {
        fprintf(stderr, "train_cpu: %s\n", err.msg[0] ? err.msg : "no optimizer");
        return 1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)B * T), *mask = malloc(sizeof(int32_t) * (size_t)B * T);
    int32_t *types = calloc((size_t)B * T, sizeof(int32_t)), *labels = malloc(sizeof(int32_t) * (size_t)B);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)(1000 + (i * 7919) % 20000);
        mask[i] = 1;
    }
    for (int i = 0; i < B; i++) labels[i] = i % 2;
    /* accumulate=k: k micro-batches of B/k rows per optimizer step */
    int k = c.accumulate > 1 ? c.accumulate : 1;
    if (B % k) { fprintf(stderr, "train_cpu: batch %d is not a multiple of accumulate %d\n", B, k); return 2; }
    tk_batch b = {.B = B / k, .T = T, .input_ids = ids, .token_type_ids = types, .attention_mask = mask, .labels = labels};
    int *order = calloc((size_t)k, sizeof *order); /* k times the one batch */
    float loss = 0;
    double best = 1e30, sum = 0, flops = 0;
    int64_t tokens = 0;
    char lens[4096] = "";
    /* N: the parameters outside the embeddings (issue 36's MFU) */
    double n_body = 0;
    for (int i = 0; i < tk_model_n_params(m); i++) {
        const tk_param *p = tk_model_param(m, i);
        if (strncmp(p->name, "bert.embeddings.", 16)) n_body += (double)tk_tensor_numel(p->w);
    }
    for (int s = 0; s <= steps; s++) {
        if (data) {
            if (k != 1) { fprintf(stderr, "train_cpu: --data takes no accumulate\n"); return 2; }
            b = (tk_batch){.B = db[s].B, .T = db[s].T, .input_ids = db[s].input_ids,
                           .token_type_ids = db[s].token_type_ids, .attention_mask = db[s].attention_mask,
                           .labels = db[s].labels};
        }
        double t0 = now();
        tk_step_out so;
        tk_status st = tk_train_step(&tr, &b, order, 0, k, &so, &err);
        loss = so.rows ? (float)(so.loss_sum / (double)so.rows) : 0.0f;
        if (st != TK_OK || tk_dev_sync(d, &err) != TK_OK) {
            fprintf(stderr, "train_cpu: %s\n", err.msg);
            return 1;
        }
        double dt = now() - t0;
        if (s == 0) continue;
        best = dt < best ? dt : best;
        sum += dt;
        double bt = (double)B * b.T;
        flops += 6.0 * n_body * bt + 12.0 * o.dims.layers * bt * b.T * o.dims.hidden;
        tokens += data ? db[s].real_tokens : (int64_t)B * T;
        size_t l = strlen(lens);
        snprintf(lens + l, sizeof lens - l, "%s%d", l ? ", " : "", b.T);
    }
    tk_alloc_stats st;
    tk_alloc_stats_get(tk_dev_alloc(d), &st);
    size_t rss1, hwm1;
    rss(&rss1, &hwm1);
    tk_cuda_mem_totals tot = {0};
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    if (cuda && tk_dev_cuda_mem_totals(d, &tot, &err) != TK_OK) { fprintf(stderr, "train_cpu: %s\n", err.msg); return 1; }
    /* MFU against the card's dense peak for this step's precision */
    const char *prec = c.precision == TK_PREC_FP16 ? "fp16" : c.precision == TK_PREC_BF16 ? "bf16" : c.tf32 ? "tf32" : "fp32";
    const tk_gpu_profile *card = cuda ? tk_gpu_profile_by_device(info.name) : NULL;
    double peak = tk_gpu_profile_peak(card, prec);
    char mfu[64] = "null", peak_s[64] = "null";
    if (peak > 0) {
        snprintf(mfu, sizeof mfu, "%.4f", flops / (sum * peak));
        snprintf(peak_s, sizeof peak_s, "%.4g", peak);
    }
    printf("{\"impl\": \"txkernel\", \"device\": \"%s\", \"config\": \"%s\", \"model\": \"%s\", \"batch\": %d, \"seq\": %d, "
           "\"threads\": %d, \"steps\": %d, "
           "\"min_ms\": %.2f, \"mean_ms\": %.2f, \"samples_per_s\": %.2f, \"loss\": %.5f, "
           "\"alloc_peak\": %zu, \"reserved_peak\": %zu, \"rss_growth_peak\": %zu, "
           "\"cupti_active\": %d, \"device_peak\": %zu, \"plugin_bytes\": %zu, "
           "\"precision\": \"%s\", \"flops\": %.6g, \"peak_flops\": %s, \"card\": \"%s\", \"mfu\": %s, "
           "\"n_body\": %.0f, \"tokens\": %lld, \"seq_lens\": [%s]}\n",
           info.name, tech, model, B, T, threads, steps, best * 1e3, sum / steps * 1e3, B / (sum / steps), loss,
           st.allocated_peak, st.reserved_peak, hwm1 > rss0 ? hwm1 - rss0 : 0, tot.cupti_active, tot.device_peak,
           tot.plugin_bytes, prec, flops, peak_s, card ? card->name : "", mfu, n_body, (long long)tokens, lens);
    free(ids); free(mask); free(types); free(labels); free(order);
    for (int i = 0; i < nb; i++) tk_data_batch_clear(&db[i]);
    free(db);
    tk_trainer_close(&tr);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    return 0;
}
