/* test_txtrain_ranks.c — %%txtrain with world_size 2 on the cpu
 * (app/ranks.c, the launcher txk train uses too) through the interpreter: the cell starts two
 * `txk train` MPI ranks (TXK_BIN: this build's txk), streams their output
 * (rank 0's progress, each rank's peak beside its plan) and ends with the
 * weights `txk train` with world_size 1, accumulate 2 ends with, bit for bit
 * (both release builds: this ASan-built kernel's own arithmetic differs in
 * the last bits); an interrupt (the kernel's cancel flag) stops every rank
 * after one step and the cell ends in KeyboardInterrupt, naming the
 * checkpoint. Needs mpirun (scripts/deps.sh). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tk_magics.h"
#include "tk_test.h"

#include "magics_rec.h"

#define CFG                                                                                              \
    "model: bert-tiny\ninit: random\nvocab: tests/data/vocab_uncased.txt\nhidden: 32\nheads: 2\n"          \
    "intermediate: 64\ntrain_file: tests/data/reviews_train.csv\ndev_file: tests/data/reviews_dev.csv\n" \
    "text_col: text\nlabel_col: label\nmax_examples: %d\nmax_len: 32\nbatching: dynamic\nbatch_size: 8\n"  \
    "eval_batch_size: 64\nepochs: 1\nlr: 2e-3\nmax_grad_norm: 0.05\ndropout: 0.0\nseed: 5\nthreads: 1\n"  \
    "device: cpu\noutput_dir: %s\n"

static char dir[] = "/tmp/txk-ranks-test-XXXXXX";

static void test_two_ranks_equal_one_accumulating(void) {
    char cell[2048], out1[512], out2[512], text[65536];
    int rc;
    snprintf(out1, sizeof out1, "%s/one", dir);
    snprintf(out2, sizeof out2, "%s/two", dir);
    char yaml[600], cmd[2048];
    snprintf(yaml, sizeof yaml, "%s/one.yaml", dir);
    FILE *f = fopen(yaml, "w");
    TK_CHECK(f != NULL);
    if (!f) return;
    fprintf(f, CFG, 96, out1);
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' train '%s' accumulate=2 zero=1 --no-plan > /dev/null 2>&1", getenv("TXK_BIN"), yaml);
    TK_CHECK_EQ_INT(system(cmd), 0);
    snprintf(cell, sizeof cell, "%%%%txtrain world_size=2 zero=1\n" CFG, 96, out2);
    json_t *m = run(cell, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    stdout_of(m, text, sizeof text);
    TK_CHECK_MSG(strstr(text, "global batch 16") && strstr(text, "rank 1: peak") && strstr(text, "trained"), "%s", text);
    json_decref(m);
    snprintf(cmd, sizeof cmd, "cmp -s '%s/model.safetensors' '%s/model.safetensors'", out1, out2);
    TK_CHECK_MSG(system(cmd) == 0, "the 2-rank weights differ from accumulate 2's (or one is missing)");
}

static const char *watch_dir;
static void *interrupt_when_saved(void *arg) {
    (void)arg;
    char ck[600];
    snprintf(ck, sizeof ck, "%s/checkpoint-2", watch_dir);
    struct stat st;
    for (int i = 0; i < 3000 && stat(ck, &st) != 0; i++) usleep(10000);
    atomic_store(&cancel_flag, 1);
    return NULL;
}

static void test_interrupt_reaches_every_rank(void) {
    char cell[2048], out[512], text[65536];
    int rc;
    snprintf(out, sizeof out, "%s/interrupted", dir);
    watch_dir = out;
    setenv("TXK_TEST_SAVE_DELAY_MS", "150", 1);
    snprintf(cell, sizeof cell, "%%%%txtrain world_size=2 zero=2 save_every=2\n" CFG, 192, out);
    pthread_t th;
    pthread_create(&th, NULL, interrupt_when_saved, NULL);
    json_t *m = run(cell, &rc);
    pthread_join(th, NULL);
    atomic_store(&cancel_flag, 0);
    unsetenv("TXK_TEST_SAVE_DELAY_MS");
    TK_CHECK_EQ_INT(rc, -1);
    json_t *e = first(m, "error");
    TK_CHECK(e && !strcmp(json_string_value(json_object_get(e, "ename")), "KeyboardInterrupt"));
    stdout_of(m, text, sizeof text);
    TK_CHECK_MSG(strstr(text, "interrupted after step") && strstr(text, "last checkpoint"), "%s", text);
    json_decref(m);
}

int main(void) {
    char txk[4096];
    if (!getcwd(txk, sizeof txk - 16)) return 1;
    strcat(txk, "/build/txk");
    setenv("TXK_BIN", txk, 1);
    setenv("OMP_WAIT_POLICY", "passive", 1);
    if (!mkdtemp(dir)) return 1;
    M = tk_magics_new();
    I = tk_magics_interp(M);
    (void)last_json; /* magics_rec.h's, not needed here */
    TK_RUN(test_two_ranks_equal_one_accumulating);
    TK_RUN(test_interrupt_reaches_every_rank);
    tk_magics_destroy(&M);
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tk_test_done();
}
