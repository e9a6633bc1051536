/* collective_mpi.c — the cpu's collectives: OpenMPI, loaded with dlopen.
 *
 * txk, txkernel and the companion link no MPI library: the first
 * world_size > 1 run on the cpu dlopens libmpi.so.40 (OpenMPI 4 and 5, as
 * Debian's libopenmpi3 ships it) and initialises MPI once for the process;
 * MPI_Finalize runs at exit. OpenMPI's handles (MPI_COMM_WORLD, MPI_FLOAT,
 * MPI_SUM) are addresses of its exported globals (ompi_mpi_comm_world, ...)
 * and MPI_IN_PLACE is (void *)1: that is OpenMPI's ABI, which is why this
 * backend names OpenMPI and no other MPI.
 *
 * Guarantees: each op is one MPI collective on MPI_COMM_WORLD (sum in f32
 * or f64); counts over INT_MAX elements are refused (MPI's counts are int).
 * A rank that dies is MPI's to handle: mpirun stops the others and names it.
 * A rank that hangs (or is stopped) is this file's: each op is MPI's
 * non-blocking form, tested until done, and a rank that has waited
 * TXK_COLL_TIMEOUT_S seconds (default 600: longer than a checkpoint save,
 * when the other ranks wait for rank 0) fails the op with an error saying
 * so; its caller then ends every rank (tk_coll_abort_job).
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tk_collective_impl.h"
#include "tk_host_mem.h"

typedef void *mpi_h; /* MPI_Comm, MPI_Datatype, MPI_Op: pointers in OpenMPI */
#define MPI_IN_PLACE_ ((void *)1)

static struct {
    void *lib;
    int (*Init)(int *, char ***);
    int (*Initialized)(int *);
    int (*Finalized)(int *);
    int (*Finalize)(void);
    int (*Comm_rank)(mpi_h, int *);
    int (*Comm_size)(mpi_h, int *);
    /* the non-blocking forms (MPI_Request is a pointer in OpenMPI) */
    int (*Iallreduce)(const void *, void *, int, mpi_h, mpi_h, mpi_h, mpi_h *);
    int (*Ireduce_scatter)(const void *, void *, const int *, mpi_h, mpi_h, mpi_h, mpi_h *);
    int (*Iallgatherv)(const void *, int, mpi_h, void *, const int *, const int *, mpi_h, mpi_h, mpi_h *);
    int (*Ibcast)(void *, int, mpi_h, int, mpi_h, mpi_h *);
    int (*Test)(mpi_h *, int *, void *);
    int (*Abort)(mpi_h, int);
    int (*Error_string)(int, char *, int *);
    mpi_h world, f32, f64, byte, sum;
    int ready;
    char why[512];
} M;

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void finalize_at_exit(void) {
    int done = 0;
    if (M.Finalized && M.Finalized(&done) == 0 && !done) M.Finalize();
}

static void load(void) {
    const char *names[] = {"libmpi.so.40", "libmpi.so", NULL};
    for (int i = 0; names[i] && !M.lib; i++)
        /* global: OpenMPI's own components (dlopen'd by it) resolve against libmpi */
        M.lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!M.lib) {
        snprintf(M.why, sizeof M.why, "world_size > 1 on the cpu needs OpenMPI (libmpi.so.40: %s); on Debian/Ubuntu: "
                 "apt-get install openmpi-bin libopenmpi3", dlerror());
        return;
    }
#define SYM(field, name)                                                                       \
    do {                                                                                       \
        *(void **)&M.field = dlsym(M.lib, name);                                               \
        if (!M.field) {                                                                        \
            snprintf(M.why, sizeof M.why, "OpenMPI's libmpi lacks %s: not an OpenMPI library", name); \
            return;                                                                            \
        }                                                                                      \
    } while (0)
    SYM(Init, "MPI_Init");
    SYM(Initialized, "MPI_Initialized");
    SYM(Finalized, "MPI_Finalized");
    SYM(Finalize, "MPI_Finalize");
    SYM(Comm_rank, "MPI_Comm_rank");
    SYM(Comm_size, "MPI_Comm_size");
    SYM(Iallreduce, "MPI_Iallreduce");
    SYM(Ireduce_scatter, "MPI_Ireduce_scatter");
    SYM(Iallgatherv, "MPI_Iallgatherv");
    SYM(Ibcast, "MPI_Ibcast");
    SYM(Test, "MPI_Test");
    SYM(Abort, "MPI_Abort");
    SYM(Error_string, "MPI_Error_string");
    SYM(world, "ompi_mpi_comm_world");
    SYM(f32, "ompi_mpi_float");
    SYM(f64, "ompi_mpi_double");
    SYM(byte, "ompi_mpi_byte");
    SYM(sum, "ompi_mpi_op_sum");
#undef SYM
    int inited = 0;
    M.Initialized(&inited);
    if (!inited && M.Init(NULL, NULL) != 0) {
        snprintf(M.why, sizeof M.why, "MPI_Init failed");
        return;
    }
    if (!inited) atexit(finalize_at_exit);
    M.ready = 1;
}

static tk_status mpi_fail(const char *op, int rc, tk_err *err) {
    char s[256] = "";
    int n = 0;
    if (M.Error_string) M.Error_string(rc, s, &n);
    tk_err_set(err, TK_EIO, "MPI %s failed: %s (code %d)", op, s[0] ? s : "?", rc);
    return TK_EIO;
}

static tk_status too_big(const char *op, tk_err *err) {
    tk_err_set(err, TK_EINVAL, "MPI %s: more than %d elements in one call", op, INT_MAX);
    return TK_EINVAL;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits for a started op (rc: what starting it returned): spinning first
 * (most ops end within microseconds), then sleeping up to 1 ms between
 * tests, until TXK_COLL_TIMEOUT_S. */
static tk_status finish(const char *op, int rc, mpi_h *req, tk_err *err) {
    if (rc) return mpi_fail(op, rc, err);
    const char *env = getenv("TXK_COLL_TIMEOUT_S");
    double limit = env && atof(env) > 0 ? atof(env) : 600.0, t0 = mono_s();
    long nap = 0;
    for (long i = 0;; i++) {
        int done = 0;
        if ((rc = M.Test(req, &done, NULL))) return mpi_fail(op, rc, err);
        if (done) return TK_OK;
        if (i < 2000) {
            sched_yield();
            continue;
        }
        if (mono_s() - t0 > limit) {
            int rank = -1;
            M.Comm_rank(M.world, &rank);
            tk_err_set(err, TK_EIO, "MPI %s: rank %d waited %.0f s for the other ranks: one of them hung or stopped "
                       "(TXK_COLL_TIMEOUT_S=%g); ending the run", op, rank, mono_s() - t0, limit);
            return TK_EIO;
        }
        nap = nap < 1000000 ? nap + 50000 : nap;
        struct timespec ts = {0, nap};
        nanosleep(&ts, NULL);
    }
}

static tk_status m_all_reduce(void *ctx, void *buf, int64_t n, tk_err *err) {
    (void)ctx;
    if (n > INT_MAX) return too_big("all-reduce", err);
    mpi_h req = NULL;
    return finish("all-reduce", M.Iallreduce(MPI_IN_PLACE_, buf, (int)n, M.f32, M.sum, M.world, &req), &req, err);
}

/* counts as int, and this rank's offset; NULL on a count over INT_MAX */
static int *int_counts(const int64_t *counts, int size, int rank, int64_t *offset, int **displs) {
    int *ic = tk_malloc(2 * (size_t)size * sizeof *ic);
    if (!ic) return NULL;
    int64_t off = 0;
    for (int r = 0; r < size; r++) {
        if (counts[r] > INT_MAX || off > INT_MAX) {
            free(ic);
            return NULL;
        }
        if (r == rank) *offset = off;
        ic[r] = (int)counts[r];
        ic[size + r] = (int)off;
        off += counts[r];
    }
    *displs = ic + size;
    return ic;
}

static tk_status m_reduce_scatter(void *ctx, void *buf, const int64_t *counts, tk_err *err) {
    int *size_rank = ctx;
    int64_t off = 0;
    int *displs = NULL, *ic = int_counts(counts, size_rank[0], size_rank[1], &off, &displs);
    if (!ic) return too_big("reduce-scatter", err);
    /* In place, MPI leaves this rank's sum at the start of the buffer;
     * it belongs at the rank's own offset. */
    mpi_h req = NULL;
    tk_status st = finish("reduce-scatter", M.Ireduce_scatter(MPI_IN_PLACE_, buf, ic, M.f32, M.sum, M.world, &req),
                          &req, err);
    int mine = ic[size_rank[1]];
    free(ic);
    if (st != TK_OK) return st;
    if (off) memmove((float *)buf + off, buf, (size_t)mine * sizeof(float));
    return TK_OK;
}

/* in place: this rank's segment is already at its displacement */
static tk_status gatherv(void *ctx, void *buf, const int64_t *counts, mpi_h type, tk_err *err) {
    int *size_rank = ctx;
    int64_t off = 0;
    int *displs = NULL, *ic = int_counts(counts, size_rank[0], size_rank[1], &off, &displs);
    if (!ic) return too_big("all-gather", err);
    mpi_h req = NULL;
    tk_status st = finish("all-gather", M.Iallgatherv(MPI_IN_PLACE_, 0, type, buf, ic, displs, type, M.world, &req),
                          &req, err);
    free(ic); /* the counts must outlive the op: freed after it */
    return st;
}
static tk_status m_all_gather(void *ctx, void *buf, const int64_t *counts, tk_err *err) {
    return gatherv(ctx, buf, counts, M.f32, err);
}
static tk_status m_all_gather_bytes(void *ctx, void *buf, const int64_t *counts, tk_err *err) {
    return gatherv(ctx, buf, counts, M.byte, err);
}

static tk_status m_broadcast(void *ctx, void *buf, int64_t n, int root, tk_err *err) {
    (void)ctx;
    if (n > INT_MAX) return too_big("broadcast", err);
    mpi_h req = NULL;
    return finish("broadcast", M.Ibcast(buf, (int)n, M.f32, root, M.world, &req), &req, err);
}

static tk_status m_all_reduce_host(void *ctx, double *vals, int n, tk_err *err) {
    (void)ctx;
    mpi_h req = NULL;
    return finish("all-reduce (host)", M.Iallreduce(MPI_IN_PLACE_, vals, n, M.f64, M.sum, M.world, &req), &req, err);
}

static void m_abort(void *ctx, int code) {
    (void)ctx;
    fflush(NULL);
    M.Abort(M.world, code);
}

static void m_close(void *ctx) { free(ctx); } /* MPI itself stays up until exit */

static const tk_coll_backend MPI_BE = { "mpi", m_all_reduce, m_reduce_scatter, m_all_gather, m_all_gather_bytes, m_broadcast,
                                        m_all_reduce_host, m_abort, m_close };

void *tk_coll_mpi_open(const tk_coll_backend **be, int *rank, int *size, tk_err *err) {
    pthread_once(&once, load);
    if (!M.ready) {
        tk_err_set(err, TK_EINVAL, "%s", M.why);
        return NULL;
    }
    int *size_rank = tk_malloc(2 * sizeof *size_rank);
    if (!size_rank) {
        tk_err_nomem(err, "the MPI backend");
        return NULL;
    }
    M.Comm_size(M.world, &size_rank[0]);
    M.Comm_rank(M.world, &size_rank[1]);
    *size = size_rank[0];
    *rank = size_rank[1];
    *be = &MPI_BE;
    return size_rank;
}


void tk_coll_mpi_abort_job(int code) {
    if (!M.ready) return;
    fflush(NULL);
    M.Abort(M.world, code);
}

/* 1 when `prog` is an executable file in a PATH directory */
static int on_path(const char *prog) {
    const char *path = getenv("PATH");
    char dir[4096];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(dir, sizeof dir, "%.*s/%s", (int)n, path, prog);
        if (n && access(dir, X_OK) == 0) return 1;
        path += n + (path[n] == ':');
    }
    return 0;
}

tk_status tk_coll_mpirun(int world_size, char *const argv[], int *pid, tk_err *err) {
    return tk_coll_mpirun_fd(world_size, argv, -1, pid, err);
}

tk_status tk_coll_mpirun_fd(int world_size, char *const argv[], int out_fd, int *pid, tk_err *err) {
    if (!on_path("mpirun")) {
        tk_err_set(err, TK_EINVAL, "world_size: %d on the cpu runs %d MPI processes, started by mpirun, which is not "
                   "on PATH: install OpenMPI (Debian/Ubuntu: apt-get install openmpi-bin libopenmpi3), or set "
                   "world_size: 1", world_size, world_size);
        return TK_EINVAL;
    }
    int n = 0;
    while (argv[n]) n++;
    char np[16];
    snprintf(np, sizeof np, "%d", world_size);
    char **av = tk_calloc((size_t)n + 8, sizeof *av);
    if (!av) return tk_err_nomem(err, "mpirun's arguments");
    int k = 0;
    av[k++] = "mpirun";
    av[k++] = "-np";
    av[k++] = np;
    av[k++] = "--oversubscribe"; /* N ranks on fewer cores: slower, still right */
    av[k++] = "--bind-to";
    av[k++] = "none";            /* each rank's threads may use every core */
    for (int i = 0; i < n; i++) av[k++] = argv[i];
    av[k] = NULL;
    fflush(NULL);
    pid_t p = fork();
    if (p < 0) {
        free(av);
        tk_err_set(err, TK_EIO, "cannot start mpirun: %s", strerror(errno));
        return TK_EIO;
    }
    if (p == 0) {
        /* a group of its own: the terminal's Ctrl-C reaches the caller,
         * which forwards it as SIGUSR1 (mpirun passes that to every rank;
         * a SIGINT would make mpirun kill them mid-step) */
        setpgid(0, 0);
        if (out_fd >= 0 && (dup2(out_fd, 1) < 0 || dup2(out_fd, 2) < 0)) _exit(127);
        if (geteuid() == 0) {
            setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
            setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        }
        execvp("mpirun", av);
        fprintf(stderr, "txk: cannot run mpirun: %s\n", strerror(errno));
        _exit(127);
    }
    free(av);
    *pid = (int)p;
    return TK_OK;
}
