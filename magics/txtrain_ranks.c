/* txtrain_ranks.c — %%txtrain with world_size > 1 on the cpu: the cell's
 * config run as `txk train` MPI ranks (tk_coll_mpirun), as a shell would.
 *
 * The kernel process cannot be N MPI processes, so the ranks are separate
 * processes: the config is written to a temporary YAML file (relative paths
 * resolve from the kernel's working directory, which the ranks inherit),
 * `txk` is the one beside the kernel's executable, $TXK_BIN, or `txk` on
 * PATH. mpirun's output — rank 0's progress lines and results, each rank's
 * peak beside its plan, any rank's error — is streamed into the cell as it
 * comes. An interrupt is forwarded once as SIGUSR1 to mpirun, which passes
 * it to every rank: they agree on the step to stop after, rank 0 names the
 * checkpoint, and the cell ends with KeyboardInterrupt. The trained model is
 * in output_dir (rank 0 writes it); the kernel's session holds no weights of
 * the run, so %txmem shows none.
 *
 * Guarantees: the temporary file is removed; the cell waits for mpirun to
 * end (a rank that dies ends it: mpirun's message names the rank); a
 * non-zero status is one error naming it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tk_magics.h"
#include "tk_host_mem.h"
#include "tk_session.h"
#include "tk_train.h"
#include "tk_txmagics.h"

/* The txk to start: $TXK_BIN, the one beside this executable, or PATH's. */
static void find_txk(char *out, size_t n) {
    const char *env = getenv("TXK_BIN");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return;
    }
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            snprintf(slash + 1, sizeof exe - (size_t)(slash + 1 - exe), "txk");
            if (access(exe, X_OK) == 0) {
                snprintf(out, n, "%s", exe);
                return;
            }
        }
    }
    snprintf(out, n, "txk");
}

int tk_txtrain_ranks(tk_magic_ctx *m, const tk_config *c, int ignore_plan) {
    char *yaml = tk_config_to_yaml(c);
    char path[] = "/tmp/txk-ranks-XXXXXX.yaml";
    int fd = yaml ? mkstemps(path, 5) : -1;
    if (fd < 0 || write(fd, yaml, strlen(yaml)) != (ssize_t)strlen(yaml)) {
        if (fd >= 0) {
            close(fd);
            unlink(path);
        }
        free(yaml);
        return tk_magic_error(m, "RunError", "world_size %d: cannot write the ranks' config (%s)",
                              tk_config_world_size(c), yaml ? strerror(errno) : "out of host memory");
    }
    close(fd);
    free(yaml);
    tk_session_set_config(m->session, c);
    char txk[4096];
    find_txk(txk, sizeof txk);
    char *argv[] = {txk, "train", path, ignore_plan ? "--no-plan" : NULL, NULL};
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        unlink(path);
        return tk_magic_error(m, "RunError", "cannot start the ranks: %s", strerror(errno));
    }
    int pid = 0;
    tk_err err = {0};
    int world = tk_config_world_size(c);
    tk_status st = tk_coll_mpirun_fd(world, argv, pipefd[1], &pid, &err);
    close(pipefd[1]);
    if (st != TK_OK) {
        close(pipefd[0]);
        unlink(path);
        return tk_magic_error(m, "RunError", "%s", err.msg);
    }
    tk_magic_printf(m, "stderr", "world_size %d: %d MPI ranks of %s (mpirun), batch_size %d per rank, global batch %d, "
                                 "zero %d\n", world, world, txk, c->batch_size,
                    c->batch_size * world * (c->accumulate > 1 ? c->accumulate : 1), c->zero);
    int asked = 0;
    char buf[4096];
    for (;;) {
        if (!asked && m->cancel && atomic_load(m->cancel)) {
            kill(pid, SIGUSR1); /* mpirun passes it to every rank */
            asked = 1;
        }
        struct pollfd p = {.fd = pipefd[0], .events = POLLIN};
        int r = poll(&p, 1, 50);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        ssize_t k = read(pipefd[0], buf, sizeof buf - 1);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break; /* mpirun and the ranks closed it: they ended */
        buf[k] = 0;
        tk_magic_printf(m, "stdout", "%s", buf);
    }
    close(pipefd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    unlink(path);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 0) return 0;
    if (asked && code == 130) return tk_magic_interrupted(m);
    return tk_magic_error(m, code == 4 ? "OutOfMemoryError" : code == 3 ? "PlannedOOM" : "RunError",
                          "the %d-rank run ended with status %d (the output above names the rank and the reason)",
                          world, code);
}
