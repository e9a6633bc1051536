/* collective.c — the collective layer's public wrappers and its two
 * backends that need no library: single (world_size 1) and meta (a plan of
 * one rank of N: no data moves, the bytes are counted).
 *
 * Guarantees: every op checks its arguments and, on failure, returns the
 * backend's status with a message naming the op; the byte counter grows only
 * for ops that succeeded. See tk_collective.h for the layouts.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "tk_backend_impl.h" /* tk_dev_plugin_sym */
#include "tk_collective_impl.h"
#include "tk_host_mem.h"

struct tk_coll {
    const tk_coll_backend *be;
    void *ctx;
    int rank, size;
    uint64_t sent;
};

/* ---- single and meta: nothing to move ------------------------------------ */

static tk_status none_buf(void *ctx, void *buf, int64_t n, tk_err *err) {
    (void)ctx, (void)buf, (void)n, (void)err;
    return TK_OK;
}
static tk_status none_counts(void *ctx, void *buf, const int64_t *counts, tk_err *err) {
    (void)ctx, (void)buf, (void)counts, (void)err;
    return TK_OK;
}
static tk_status none_bcast(void *ctx, void *buf, int64_t n, int root, tk_err *err) {
    (void)ctx, (void)buf, (void)n, (void)root, (void)err;
    return TK_OK;
}
static tk_status none_host(void *ctx, double *vals, int n, tk_err *err) {
    (void)ctx, (void)vals, (void)n, (void)err;
    return TK_OK;
}
static void none_abort(void *ctx, int code) { (void)ctx, (void)code; }
static void none_close(void *ctx) { (void)ctx; }

static const tk_coll_backend SINGLE = { "single", none_buf, none_counts, none_counts, none_counts, none_bcast, none_host,
                                        none_abort, none_close };
/* A plan's rank: its peers' data are not there, so each reduction leaves
 * this rank's values as they are (the planner only needs the allocations). */
static const tk_coll_backend META = { "meta", none_buf, none_counts, none_counts, none_counts, none_bcast, none_host,
                                      none_abort, none_close };

/* ---- the launcher's environment ------------------------------------------ */

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < 0 || x > 1 << 20 ? dflt : (int)x;
}

int tk_coll_env_rank(void) { return env_int("OMPI_COMM_WORLD_RANK", 0); }
int tk_coll_env_size(void) { return env_int("OMPI_COMM_WORLD_SIZE", 1); }

/* ---- cuda: the in-process group (NCCL in the plugin) ---------------------- */

static struct {
    pthread_mutex_t lock;
    void *group;
    int n;
    tk_cuda_nccl_group_destroy_fn destroy;
    tk_cuda_nccl_rank_fn rank;
} G = { PTHREAD_MUTEX_INITIALIZER, NULL, 0, NULL, NULL };
static __thread int thread_rank;

void tk_coll_set_thread_rank(int rank) { thread_rank = rank; }

tk_status tk_coll_group_open(tk_dev *d, int n, const int *ordinals, tk_err *err) {
    tk_cuda_nccl_group_new_fn fnew = (tk_cuda_nccl_group_new_fn)tk_dev_plugin_sym(d, "tk_cuda_nccl_group_new");
    tk_cuda_nccl_group_destroy_fn fdel = (tk_cuda_nccl_group_destroy_fn)tk_dev_plugin_sym(d, "tk_cuda_nccl_group_destroy");
    tk_cuda_nccl_rank_fn frank = (tk_cuda_nccl_rank_fn)tk_dev_plugin_sym(d, "tk_cuda_nccl_rank");
    if (!fnew || !fdel || !frank || n < 1) {
        tk_err_set(err, TK_EINVAL, "collective: %s", n < 1 ? "a group of no GPU"
                   : "the device is not cuda, or its plugin has no NCCL backend (an older build)");
        return TK_EINVAL;
    }
    pthread_mutex_lock(&G.lock);
    tk_status st = TK_OK;
    if (G.group) {
        tk_err_set(err, TK_EINVAL, "collective: a group of %d GPUs is already open in this process", G.n);
        st = TK_EINVAL;
    } else if ((st = fnew(n, ordinals, &G.group, err)) == TK_OK) {
        G.n = n;
        G.destroy = fdel;
        G.rank = frank;
    }
    pthread_mutex_unlock(&G.lock);
    return st;
}

void tk_coll_group_close(void) {
    pthread_mutex_lock(&G.lock);
    if (G.group) G.destroy(G.group);
    G.group = NULL;
    G.n = 0;
    pthread_mutex_unlock(&G.lock);
}

/* ---- open and close ------------------------------------------------------- */

tk_coll *tk_coll_open(tk_dev *d, int world_size, int rank, tk_err *err) {
    if (world_size < 1 || rank < 0 || rank >= world_size) {
        tk_err_set(err, TK_EINVAL, "collective: rank %d of world_size %d", rank, world_size);
        return NULL;
    }
    tk_coll *c = tk_calloc(1, sizeof *c);
    if (!c) {
        tk_err_nomem(err, "the collective's handle");
        return NULL;
    }
    tk_dev_kind kind = d ? tk_dev_kind_of(d) : TK_DEV_META;
    c->size = world_size;
    if (kind == TK_DEV_META) {
        c->be = &META;
        c->rank = rank;
        return c;
    }
    if (world_size == 1) {
        c->be = &SINGLE;
        return c;
    }
    if (kind == TK_DEV_CUDA) {
        pthread_mutex_lock(&G.lock);
        tk_status st = TK_EINVAL;
        if (G.group && G.n == world_size)
            st = G.rank(G.group, thread_rank, &c->be, &c->ctx, err);
        else
            tk_err_set(err, TK_EINVAL, "world_size: %d on cuda runs %d GPUs in this process, one thread each, in a "
                       "group their launcher opens (tk_coll_group_open); %s", world_size, world_size,
                       G.group ? "the group open here is of another size"
                               : "txk train and %%txtrain do not start such threads yet (make test-gpu's "
                                 "gpu_data_parallel does); use device: cpu (MPI ranks) or world_size: 1");
        pthread_mutex_unlock(&G.lock);
        if (st != TK_OK) {
            free(c);
            return NULL;
        }
        c->rank = thread_rank;
        return c;
    }
    int env = tk_coll_env_size();
    if (env != world_size) {
        tk_err_set(err, TK_EINVAL, "world_size: %d on the cpu runs as %d MPI processes, %s; `txk train "
                   "cfg.yaml` and %%%%txtrain start them with mpirun", world_size, world_size,
                   env > 1 ? "but mpirun started a different number here" : "and this process is not one of them");
        free(c);
        return NULL;
    }
    int size = 0;
    if (!(c->ctx = tk_coll_mpi_open(&c->be, &c->rank, &size, err))) {
        free(c);
        return NULL;
    }
    if (size != world_size) {
        tk_err_set(err, TK_EINVAL, "world_size: %d, but MPI_COMM_WORLD has %d ranks", world_size, size);
        c->be->close(c->ctx);
        free(c);
        return NULL;
    }
    return c;
}

void tk_coll_close(tk_coll **pc) {
    if (!pc || !*pc) return;
    (*pc)->be->close((*pc)->ctx);
    free(*pc);
    *pc = NULL;
}

int tk_coll_rank(const tk_coll *c) { return c ? c->rank : 0; }
int tk_coll_size(const tk_coll *c) { return c ? c->size : 1; }
const char *tk_coll_backend_name(const tk_coll *c) { return c ? c->be->name : "single"; }
void tk_coll_abort(tk_coll *c, int code) {
    if (c && c->size > 1) c->be->abort(c->ctx, code);
}
void tk_coll_abort_job(int code) { tk_coll_mpi_abort_job(code); }

uint64_t tk_coll_bytes_sent(const tk_coll *c) { return c ? c->sent : 0; }
void tk_coll_reset_bytes(tk_coll *c) {
    if (c) c->sent = 0;
}

/* ---- the ops ----------------------------------------------------------- */

static tk_status failed(const tk_coll *c, const char *op, tk_status st, tk_err *err) {
    if (err && !err->msg[0])
        tk_err_set(err, st, "collective %s (%s backend, rank %d of %d) failed", op, c->be->name, c->rank,
                   c->size);
    return st;
}

static tk_status bad(const char *op, tk_err *err) {
    tk_err_set(err, TK_EINVAL, "collective %s: no communicator, or a negative count", op);
    return TK_EINVAL;
}

/* A ring's share: (N-1)/N of `bytes`, times `times`. */
static uint64_t ring(const tk_coll *c, uint64_t bytes, int times) {
    return (uint64_t)times * (bytes * (uint64_t)(c->size - 1) / (uint64_t)c->size);
}

tk_status tk_coll_all_reduce(tk_coll *c, void *buf, int64_t n, tk_err *err) {
    if (!c || n < 0) return bad("all-reduce", err);
    if (n == 0) return TK_OK;
    tk_status st = c->be->all_reduce(c->ctx, buf, n, err);
    if (st != TK_OK) return failed(c, "all-reduce", st, err);
    c->sent += ring(c, (uint64_t)n * 4, 2);
    return TK_OK;
}

static int64_t total_of(const tk_coll *c, const int64_t *counts) {
    int64_t t = 0;
    for (int r = 0; r < c->size; r++) {
        if (counts[r] < 0) return -1;
        t += counts[r];
    }
    return t;
}

tk_status tk_coll_reduce_scatter(tk_coll *c, void *buf, const int64_t *counts, tk_err *err) {
    int64_t t = c && counts ? total_of(c, counts) : -1;
    if (t < 0) return bad("reduce-scatter", err);
    if (t == 0) return TK_OK;
    tk_status st = c->be->reduce_scatter(c->ctx, buf, counts, err);
    if (st != TK_OK) return failed(c, "reduce-scatter", st, err);
    c->sent += ring(c, (uint64_t)t * 4, 1);
    return TK_OK;
}

/* The all-gathers: counts of f32 elements (bytes 4) or of bytes (1). */
static tk_status gather(tk_coll *c, void *buf, const int64_t *counts, int bytes, tk_err *err) {
    int64_t t = c && counts ? total_of(c, counts) : -1;
    if (t < 0) return bad("all-gather", err);
    if (t == 0) return TK_OK;
    tk_status st = bytes == 1 ? c->be->all_gather_bytes(c->ctx, buf, counts, err)
                              : c->be->all_gather(c->ctx, buf, counts, err);
    if (st != TK_OK) return failed(c, "all-gather", st, err);
    c->sent += ring(c, (uint64_t)t * (uint64_t)bytes, 1);
    return TK_OK;
}

tk_status tk_coll_all_gather(tk_coll *c, void *buf, const int64_t *counts, tk_err *err) {
    return gather(c, buf, counts, 4, err);
}

tk_status tk_coll_all_gather_bytes(tk_coll *c, void *buf, const int64_t *counts, tk_err *err) {
    return gather(c, buf, counts, 1, err);
}

tk_status tk_coll_broadcast(tk_coll *c, void *buf, int64_t n, int root, tk_err *err) {
    if (!c || n < 0 || root < 0 || root >= c->size) return bad("broadcast", err);
    if (n == 0) return TK_OK;
    tk_status st = c->be->broadcast(c->ctx, buf, n, root, err);
    if (st != TK_OK) return failed(c, "broadcast", st, err);
    if (c->size > 1) c->sent += (uint64_t)n * 4;
    return TK_OK;
}

tk_status tk_coll_all_reduce_host(tk_coll *c, double *vals, int n, tk_err *err) {
    if (!c || n < 0) return bad("all-reduce (host)", err);
    if (n == 0) return TK_OK;
    tk_status st = c->be->all_reduce_host(c->ctx, vals, n, err);
    return st == TK_OK ? TK_OK : failed(c, "all-reduce (host)", st, err);
}
