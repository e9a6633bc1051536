/* checkpoint_bench.c — what a checkpoint-STEP of bert-base-cased costs on
 * this machine: bytes on disk, save time (read tensors to host, write every
 * file with fsync, checksum them, rename the folder) and load time (verify
 * sizes and checksums, then weights and moments onto the device), for fp32
 * AdamW and 8-bit AdamW state.
 *
 * The model is randomly initialised (classification head, 2 labels) and the
 * moments filled with the weights' own values, so the files hold realistic
 * non-zero data; the run itself is not trained (a bert-base step on 2 cores
 * takes longer than the save). Each save and load is timed `reps` times.
 * Run: make bench-checkpoint [CKPT_DIR=/tmp] (default 2 reps)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tk_checkpoint.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long long folder_bytes(const char *dir) {
    static const char *const files[] = {"model.safetensors", "config.json", "optimizer.safetensors", "vocab.txt",
                                        "trainer_state.json"};
    long long n = 0;
    char p[1024];
    struct stat sb;
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (stat(p, &sb) == 0) {
            n += sb.st_size;
            printf("    %-22s %12lld bytes\n", files[i], (long long)sb.st_size);
        }
    }
    return n;
}

/* Fills every moment with bytes of the parameter it belongs to. */
static int fill_moments(tk_dev *d, tk_adamw *o, tk_err *e) {
    for (int i = 0; i < tk_adamw_n_slots(o); i++) {
        tk_adamw_state_view v;
        tk_adamw_state_at(o, i, &v);
        tk_tensor *t[4] = {v.m, v.v, v.q8 ? v.mscale : NULL, v.q8 ? v.vscale : NULL};
        for (int j = 0; j < 4; j++) {
            if (!t[j] || !t[j]->data) continue;
            size_t nb = tk_tensor_nbytes(t[j]);
            unsigned char *h = malloc(nb);
            if (!h) return -1;
            for (size_t k = 0; k < nb; k++) h[k] = (unsigned char)(k * 2654435761u >> 13);
            if (j == 1 || j == 3)
                for (size_t k = 0; k < nb; k += 4) h[k + 3] &= 0x3f; /* v and the scales stay positive floats */
            tk_status st = tk_tensor_write(d, t[j], h, e);
            free(h);
            if (st != TK_OK) return -1;
        }
    }
    return 0;
}

static int bench(tk_optim optim, const char *root, int reps) {
    tk_config c;
    tk_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "bert-base-cased");
    c.num_labels = 2;
    c.optimizer = optim;
    c.keep_checkpoints = 0;
    tk_err e = {0};
    tk_model_opts mo;
    tk_dev_opts dopts = {.kind = TK_DEV_CPU};
    tk_dev *d = tk_dev_new(&dopts, &e);
    tk_model *m = NULL;
    tk_adamw *o = NULL;
    tk_optim_param *ps = NULL;
    int np = 0, rc = 1;
    if (!d || tk_model_opts_from_config(&mo, &c, &e) != TK_OK || !(m = tk_model_new(d, &mo, &e)) ||
        tk_model_init_random(m, 1, &e) != TK_OK || tk_model_alloc_grads(m, &e) != TK_OK ||
        !(ps = tk_train_optim_params(m, &np)) || !(o = tk_adamw_new(d, &c, ps, np, &e)) ||
        tk_adamw_alloc_state(o, &e) != TK_OK || fill_moments(d, o, &e) != 0) {
        fprintf(stderr, "checkpoint_bench: %s\n", e.msg);
        goto out;
    }
    tk_adamw_set_steps(o, 1000);
    tk_train_state s = {.step = 1000, .epoch = 1, .position = 7, .micro = 1000, .n_train = 1};
    tk_loss_scaler_init(&s.scaler, TK_PREC_FP32);
    s.sched = tk_sched_from_config(&c, 3000);
    char out[600], path[700];
    snprintf(out, sizeof out, "%s/txk_ckpt_bench_%s", root, optim == TK_OPTIM_ADAMW8 ? "adamw8bit" : "adamw");
    printf("bert-base-cased, %s, %lld parameters\n", optim == TK_OPTIM_ADAMW8 ? "adamw8bit" : "adamw",
           (long long)tk_model_n_weights(m));
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        if (tk_ckpt_save(out, m, o, &c, "tests/data/vocab_cased.txt", &s, path, sizeof path, &e) != TK_OK) {
            fprintf(stderr, "checkpoint_bench: %s\n", e.msg);
            goto out;
        }
        double t1 = now_s();
        tk_train_state ls;
        if (tk_ckpt_load(path, m, o, &c, 1, 0, &ls, &e) != TK_OK) {
            fprintf(stderr, "checkpoint_bench: %s\n", e.msg);
            goto out;
        }
        double t2 = now_s();
        tk_train_state_clear(&ls);
        printf("  rep %d: save %.2f s, load (verify + weights + moments) %.2f s\n", r + 1, t1 - t0, t2 - t1);
    }
    printf("  total %lld bytes\n", folder_bytes(path));
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", out);
    rc = system(cmd) != 0;
out:
    tk_adamw_destroy(&o);
    free(ps);
    tk_model_destroy(&m);
    tk_dev_destroy(&d);
    return rc;
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "/tmp";
    int reps = argc > 2 ? atoi(argv[2]) : 2;
    int rc = bench(TK_OPTIM_ADAMW, root, reps);
    rc |= bench(TK_OPTIM_ADAMW8, root, reps);
    return rc;
}
