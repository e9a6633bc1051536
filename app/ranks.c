/* ranks.c — the one rank launcher (issue 39): `txk train` and `%%txtrain`
 * with world_size > 1 on the cpu both start the run as `txk train` MPI ranks
 * (tk_coll_mpirun) through tk_app_ranks, and wait for them.
 *
 * The program started is this process when it is txk itself, else $TXK_BIN,
 * the txk beside this executable, or `txk` on PATH (the kernel cannot be N
 * MPI processes). The ranks read the caller's own arguments when it has a
 * config file (a shell's `txk train CFG key=value ...`), or the config
 * written to a temporary YAML file (a cell's config; relative paths resolve
 * from the working directory, which the ranks inherit). Their output is
 * inherited, or streamed to the caller (a cell) as it comes. A cancel flag
 * seen set is forwarded once as SIGUSR1 to mpirun, which passes it to every
 * rank: they agree on the step to stop after.
 *
 * Guarantees: the temporary file is removed; tk_app_ranks returns only after
 * mpirun has ended; its exit status (128 + signal when killed) is in
 * r->code, and r->asked says whether a stop was asked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tk_app.h"
#include "tk_collective.h"

/* The txk to start: this program when it is txk, $TXK_BIN, the one beside
 * this executable, or PATH's. */
static void find_txk(char *out, size_t n) {
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = 0;
        char *slash = strrchr(exe, '/');
        if (slash && !strcmp(slash + 1, "txk")) {
            snprintf(out, n, "%s", exe);
            return;
        }
    }
    const char *env = getenv("TXK_BIN");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return;
    }
    if (k > 0) {
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

/* The config as a temporary YAML file, its path in path (n >= 32). */
static tk_status write_config(const tk_config *c, char *path, size_t n, tk_err *err) {
    char *yaml = tk_config_to_yaml(c);
    snprintf(path, n, "/tmp/txk-ranks-XXXXXX.yaml");
    int fd = yaml ? mkstemps(path, 5) : -1;
    int bad = fd < 0 || write(fd, yaml, strlen(yaml)) != (ssize_t)strlen(yaml);
    int e = errno;
    if (fd >= 0) close(fd);
    free(yaml);
    if (!bad) return TK_OK;
    if (fd >= 0) unlink(path);
    path[0] = 0;
    tk_err_set(err, TK_EINVAL, "world_size %d: cannot write the ranks' config (%s)", tk_config_world_size(c),
               yaml ? strerror(e) : "out of host memory");
    return TK_EINVAL;
}

tk_status tk_app_ranks(const tk_config *c, char *const args[], int nargs, int ignore_plan, const tk_ranks_io *io, tk_ranks_result *r,
                       tk_err *err) {
    memset(r, 0, sizeof *r);
    r->world = tk_config_world_size(c);
    find_txk(r->txk, sizeof r->txk);
    char path[64] = "";
    char **av = calloc((size_t)nargs + 5, sizeof *av);
    if (!av) {
        tk_err_set(err, TK_ENOMEM, "out of host memory to start %d ranks", r->world);
        return TK_ENOMEM;
    }
    int n = 0;
    av[n++] = r->txk;
    av[n++] = "train";
    if (!args) {
        if (write_config(c, path, sizeof path, err) != TK_OK) {
            free(av);
            return TK_EINVAL;
        }
        av[n++] = path;
        if (ignore_plan) av[n++] = "--no-plan";
    } else {
        for (int i = 0; i < nargs; i++) av[n++] = args[i];
    }
    int pipefd[2] = {-1, -1};
    if (io->on_output && pipe2(pipefd, O_CLOEXEC) != 0) {
        int e = errno;
        free(av);
        if (path[0]) unlink(path);
        tk_err_set(err, TK_EINVAL, "cannot start the ranks: %s", strerror(e));
        return TK_EINVAL;
    }
    int pid = 0;
    tk_status st = tk_coll_mpirun_fd(r->world, av, pipefd[1], &pid, err);
    free(av);
    if (pipefd[1] >= 0) close(pipefd[1]);
    if (st != TK_OK) {
        if (pipefd[0] >= 0) close(pipefd[0]);
        if (path[0]) unlink(path);
        return st;
    }
    if (io->on_note) {
        char line[4300];
        snprintf(line, sizeof line, "world_size %d: %d MPI ranks of %s (mpirun), batch_size %d per rank, global batch %d "
                 "(batch_size x world_size x accumulate), zero %d", r->world, r->world, r->txk, c->batch_size,
                 c->batch_size * r->world * (c->accumulate > 1 ? c->accumulate : 1), c->zero);
        io->on_note(io->ud, line);
    }
    int status = 0, done = 0;
    char buf[4096];
    while (!done) {
        if (!r->asked && io->cancel && atomic_load(io->cancel)) {
            kill(pid, SIGUSR1); /* mpirun passes it to every rank */
            r->asked = 1;
        }
        if (pipefd[0] >= 0) {
            struct pollfd p = {.fd = pipefd[0], .events = POLLIN};
            int k = poll(&p, 1, 50);
            if (k <= 0) continue; /* a timeout or a signal: look at the cancel flag again */
            ssize_t got = read(pipefd[0], buf, sizeof buf - 1);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) break; /* mpirun and the ranks closed it: they ended */
            buf[got] = 0;
            io->on_output(io->ud, buf);
        } else {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid || (w < 0 && errno != EINTR)) done = 1;
            else poll(NULL, 0, 50);
        }
    }
    if (pipefd[0] >= 0) {
        close(pipefd[0]);
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    }
    if (path[0]) unlink(path);
    r->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return TK_OK;
}
