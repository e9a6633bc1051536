/* test_collective.c — the collective layer (gpu/collective.c,
 * gpu/collective_mpi.c).
 *
 * In one process: the single and meta backends (identity, byte counts),
 * argument checks, and the refusal of world_size 2 outside mpirun. Then it
 * starts itself as 2 MPI ranks (tk_coll_mpirun, the launcher txk uses) and
 * each rank checks all-reduce, reduce-scatter (uneven and empty segments,
 * a segment past MPI's small-message algorithms), all-gather, broadcast
 * and the host all-reduce against sums it computes itself; the ranks' exit
 * status is this test's last check. Without mpirun on PATH that check fails
 * naming it. LeakSanitizer is off in the ranks only: OpenMPI keeps its
 * allocations until exit.
 */
#include <sys/wait.h>
#include <unistd.h>

#include "tk_collective.h"
#include "../tk_test.h"

static void test_single(void) {
    tk_err e = {0};
    tk_dev_opts o = {.kind = TK_DEV_CPU, .threads = 1};
    tk_dev *d = tk_dev_new(&o, &e);
    tk_coll *c = tk_coll_open(d, 1, 0, &e);
    TK_CHECK(c != NULL);
    TK_CHECK_STR(tk_coll_backend_name(c), "single");
    float b[4] = {1, 2, 3, 4};
    int64_t counts[1] = {4};
    TK_CHECK(tk_coll_all_reduce(c, b, 4, &e) == TK_OK);
    TK_CHECK(tk_coll_reduce_scatter(c, b, counts, &e) == TK_OK);
    TK_CHECK(tk_coll_all_gather(c, b, counts, &e) == TK_OK);
    TK_CHECK(tk_coll_broadcast(c, b, 4, 0, &e) == TK_OK);
    TK_CHECK(b[0] == 1 && b[3] == 4);
    TK_CHECK_EQ_INT(tk_coll_bytes_sent(c), 0); /* one rank sends nothing */
    TK_CHECK(tk_coll_all_reduce(c, b, -1, &e) == TK_EINVAL);
    TK_CHECK(tk_coll_broadcast(c, b, 4, 1, &e) == TK_EINVAL);
    tk_coll_abort(c, 3); /* one rank: nothing to end */
    tk_coll_close(&c);
    TK_CHECK(c == NULL);
    tk_coll_close(&c);
    /* world_size 2 on the cpu outside mpirun: refused, saying how it runs */
    tk_err e2 = {0};
    if (tk_coll_env_size() == 1) {
        TK_CHECK(tk_coll_open(d, 2, 0, &e2) == NULL);
        TK_CHECK_MSG(strstr(e2.msg, "mpirun") != NULL, "%s", e2.msg);
    }
    tk_dev_destroy(&d);
}

static void test_meta_counts(void) {
    tk_err e = {0};
    tk_coll *c = tk_coll_open(NULL, 4, 3, &e);
    TK_CHECK(c != NULL);
    TK_CHECK_STR(tk_coll_backend_name(c), "meta");
    TK_CHECK_EQ_INT(tk_coll_rank(c), 3);
    TK_CHECK_EQ_INT(tk_coll_size(c), 4);
    int64_t counts[4] = {100, 100, 100, 100};
    TK_CHECK(tk_coll_all_reduce(c, NULL, 400, &e) == TK_OK);
    TK_CHECK_EQ_INT(tk_coll_bytes_sent(c), 2 * 1600 * 3 / 4);
    tk_coll_reset_bytes(c);
    TK_CHECK(tk_coll_reduce_scatter(c, NULL, counts, &e) == TK_OK);
    TK_CHECK(tk_coll_all_gather(c, NULL, counts, &e) == TK_OK);
    TK_CHECK_EQ_INT(tk_coll_bytes_sent(c), 2 * 1600 * 3 / 4);
    TK_CHECK(tk_coll_open(NULL, 2, 2, &e) == NULL); /* rank past the world */
    tk_coll_close(&c);
}

/* ---- in each rank --------------------------------------------------------- */

static float val(int rank, int64_t i) { return (float)(rank + 1) * 1000.0f + (float)(i % 977); }

static int rank_checks(void) {
    tk_err e = {0};
    tk_dev_opts o = {.kind = TK_DEV_CPU, .threads = 1};
    tk_dev *d = tk_dev_new(&o, &e);
    tk_coll *c = tk_coll_open(d, 2, 0, &e);
    if (!c) {
        fprintf(stderr, "rank: %s\n", e.msg);
        return 1;
    }
    int r = tk_coll_rank(c), bad = 0;
    TK_CHECK_STR(tk_coll_backend_name(c), "mpi");
    static const int64_t layouts[][2] = {{2, 4}, {0, 16384}, {16384, 0}, {2031616, 1875968}};
    for (size_t t = 0; t < sizeof layouts / sizeof layouts[0]; t++) {
        const int64_t *k = layouts[t];
        int64_t n = k[0] + k[1], off = r ? k[0] : 0;
        float *b = malloc((size_t)n * sizeof *b);
        for (int64_t i = 0; i < n; i++) b[i] = val(r, i);
        TK_CHECK(tk_coll_reduce_scatter(c, b, k, &e) == TK_OK);
        for (int64_t i = off; i < off + k[r]; i++) bad += b[i] != val(0, i) + val(1, i);
        for (int64_t i = 0; i < n; i++) b[i] = val(r, i);
        TK_CHECK(tk_coll_all_gather(c, b, k, &e) == TK_OK);
        for (int64_t i = 0; i < n; i++) bad += b[i] != val(i < k[0] ? 0 : 1, i);
        for (int64_t i = 0; i < n; i++) b[i] = val(r, i);
        TK_CHECK(tk_coll_all_reduce(c, b, n, &e) == TK_OK);
        for (int64_t i = 0; i < n; i++) bad += b[i] != val(1, i) + val(0, i);
        for (int64_t i = 0; i < n; i++) b[i] = val(r, i);
        TK_CHECK(tk_coll_broadcast(c, b, n, 1, &e) == TK_OK);
        for (int64_t i = 0; i < n; i++) bad += b[i] != val(1, i);
        free(b);
    }
    TK_CHECK_EQ_INT(bad, 0);
    double h[2] = {r + 0.5, 1};
    TK_CHECK(tk_coll_all_reduce_host(c, h, 2, &e) == TK_OK);
    TK_CHECK(h[0] == 2.0 && h[1] == 2.0);
    tk_coll_close(&c);
    tk_dev_destroy(&d);
    return tk_test_cur_failed;
}

static void test_two_ranks(void) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    TK_CHECK(n > 0);
    if (n <= 0) return;
    exe[n] = 0;
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    char *const av[] = {exe, NULL};
    int pid = 0;
    tk_err e = {0};
    tk_status st = tk_coll_mpirun(2, av, &pid, &e);
    TK_CHECK_MSG(st == TK_OK, "%s", e.msg);
    if (st != TK_OK) return;
    int status = 0;
    waitpid(pid, &status, 0);
    TK_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the ranks ended with status %d", status);
}

int main(void) {
    if (tk_coll_env_size() > 1) return rank_checks();
    TK_RUN(test_single);
    TK_RUN(test_meta_counts);
    TK_RUN(test_two_ranks);
    return tk_test_done();
}
