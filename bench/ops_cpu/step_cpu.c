/* step_cpu.c — forward + backward of a randomly initialised BERT classifier
 * (pooled head, 2 labels, dropout 0.1) on the cpu backend, timed per step.
 *
 *   step_cpu [--model bert-mini] [--batch B] [--seq T] [--threads N] [--steps S]
 *
 * One warm-up step, then S steps; prints the minimum and mean wall time and
 * sequences per second. step_torch.py does the same computation in torch. */
#include "tk_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *model = "bert-mini";
    int B = 32, T = 128, threads = 1, steps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else { fprintf(stderr, "step_cpu: unknown option %s\n", argv[i]); return 2; }
    }
    if (B < 1 || T < 2 || steps < 1) { fprintf(stderr, "step_cpu: bad sizes\n"); return 2; }
    tk_err err = {0};
    tk_model_opts o;
    memset(&o, 0, sizeof o);
    int lower = 1;
    if (tk_bert_dims_resolve(model, &o.dims, &lower, &err) != TK_OK) { fprintf(stderr, "step_cpu: %s\n", err.msg); return 1; }
    o.head = TK_HEAD_POOLED;
    o.num_labels = 2;
    o.towers = 1;
    o.seed = 1;
    tk_dev_opts dopts = {.kind = TK_DEV_CPU, .threads = threads};
    tk_dev *d = tk_dev_new(&dopts, &err);
    tk_model *m = d ? tk_model_new(d, &o, &err) : NULL;
    if (!m || tk_model_init_random(m, 1, &err) != TK_OK) { fprintf(stderr, "step_cpu: %s\n", err.msg); return 1; }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)B * T), *mask = malloc(sizeof(int32_t) * (size_t)B * T);
    int32_t *labels = malloc(sizeof(int32_t) * (size_t)B);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)(1000 + (i * 7919) % 20000);
        mask[i] = 1;
    }
    for (int i = 0; i < B; i++) labels[i] = i % 2;
    tk_batch b = {.B = B, .T = T, .input_ids = ids, .attention_mask = mask, .labels = labels};
    float loss = 0;
    double best = 1e30, sum = 0;
    for (int s = 0; s <= steps; s++) {
        double t0 = now();
        if (tk_model_forward_backward(m, &b, (uint64_t)s, 1.0f, &loss, NULL, &err) != TK_OK) {
            fprintf(stderr, "step_cpu: %s\n", err.msg);
            return 1;
        }
        double dt = now() - t0;
        if (s == 0) continue;
        best = dt < best ? dt : best;
        sum += dt;
    }
    printf("c   %s fwd+bwd B=%d T=%d threads=%d: min %.1f ms, mean %.1f ms, %.1f seq/s (loss %.4f)\n", model, B, T,
           threads, best * 1e3, sum / steps * 1e3, B / best, loss);
    free(ids); free(mask); free(labels);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    return 0;
}
