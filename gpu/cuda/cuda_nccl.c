/* cuda_nccl.c — the collectives on GPUs: NCCL, loaded with dlopen on first
 * use (only a world_size > 1 run on cuda asks), so the plugin loads where no
 * libnccl.so.2 is installed and one-GPU runs never need it. The toolkit's
 * nccl.h gives the types; torch wheels (Colab, Kaggle) and the toolkit ship
 * the library.
 *
 * One process drives N GPUs (ncclCommInitAll): the caller opens a group for
 * the devices, then each rank's thread takes its communicator, whose ops run
 * on that device's default stream (the stream every kernel of the plugin
 * runs on, so a collective is ordered after the backward that wrote its
 * buffer and before the optimizer that reads it). Uneven reduce-scatter and
 * all-gather (the pieces of tk_data_parallel) are a group of ncclReduce /
 * ncclBroadcast calls, one per rank's segment, all in place. The ranks'
 * host sums (loss, rows, the stop flag) meet at a barrier and are added in
 * rank order, so every rank gets the same bits.
 *
 * Guarantees: every NCCL call's result is checked and said with
 * ncclGetErrorString; an abort (a rank that failed) aborts every
 * communicator, so no rank waits on a dead peer, and releases the barrier.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <nccl.h>

#include "cuda_internal.h"
#include "tk_collective_impl.h"

static struct {
    void *lib;
    ncclResult_t (*CommInitAll)(ncclComm_t *, int, const int *);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*CommAbort)(ncclComm_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    const char *(*GetErrorString)(ncclResult_t);
    int ready;
    char why[512];
} N;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

static void nccl_load(void) {
    const char *names[] = {"libnccl.so.2", "libnccl.so", NULL};
    for (int i = 0; names[i] && !N.lib; i++) N.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!N.lib) {
        snprintf(N.why, sizeof N.why, "world_size > 1 on cuda needs NCCL (libnccl.so.2: %s); it comes with the CUDA "
                 "toolkit and with PyTorch's CUDA wheels (nvidia-nccl-cu12)", dlerror());
        return;
    }
#define SYM(f, name)                                                                              \
    do {                                                                                          \
        *(void **)&N.f = dlsym(N.lib, name);                                                      \
        if (!N.f) {                                                                               \
            snprintf(N.why, sizeof N.why, "libnccl.so.2 lacks %s (NCCL too old)", name);          \
            return;                                                                               \
        }                                                                                         \
    } while (0)
    SYM(CommInitAll, "ncclCommInitAll");
    SYM(CommDestroy, "ncclCommDestroy");
    SYM(CommAbort, "ncclCommAbort");
    SYM(AllReduce, "ncclAllReduce");
    SYM(Reduce, "ncclReduce");
    SYM(Broadcast, "ncclBroadcast");
    SYM(GroupStart, "ncclGroupStart");
    SYM(GroupEnd, "ncclGroupEnd");
    SYM(GetErrorString, "ncclGetErrorString");
#undef SYM
    N.ready = 1;
}

typedef struct nccl_group {
    int n;
    int *devs;
    ncclComm_t *comms;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int arrived, generation, aborted;
    double *host;               /* n x host_cap values the ranks add */
    int host_cap;
    void **ptrs;                /* each rank's host buffer in a host all-gather */
} nccl_group;

typedef struct nccl_rank {
    nccl_group *g;
    int rank;
} nccl_rank;

static tk_status nccl_fail(tk_err *err, const char *op, ncclResult_t r) {
    return tk_cuda_fail(err, TK_EDEVICE, "NCCL %s failed: %s", op, N.GetErrorString ? N.GetErrorString(r) : "?");
}

#define NC(call, op)                                              \
    do {                                                          \
        ncclResult_t r_ = (call);                                 \
        if (r_ != ncclSuccess) return nccl_fail(err, op, r_);     \
    } while (0)

static tk_status n_all_reduce(void *ctx, void *buf, int64_t n, tk_err *err) {
    nccl_rank *r = ctx;
    NC(N.AllReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, r->g->comms[r->rank], 0), "all-reduce");
    return TK_OK;
}

/* one ncclReduce (reduce-scatter) or ncclBroadcast (all-gather) per rank's
 * segment of `es`-byte elements, in one NCCL group */
static tk_status segments(nccl_rank *r, void *buf, const int64_t *counts, size_t es, int reduce, tk_err *err) {
    size_t off = 0;
    NC(N.GroupStart(), "group start");
    for (int q = 0; q < r->g->n; q++) {
        char *p = (char *)buf + off * es;
        size_t c = (size_t)counts[q];
        ncclResult_t res = ncclSuccess;
        if (c)
            res = reduce ? N.Reduce(p, p, c, ncclFloat32, ncclSum, q, r->g->comms[r->rank], 0)
                         : N.Broadcast(p, p, c * es, ncclUint8, q, r->g->comms[r->rank], 0);
        if (res != ncclSuccess) {
            N.GroupEnd();
            return nccl_fail(err, reduce ? "reduce-scatter" : "all-gather", res);
        }
        off += c;
    }
    NC(N.GroupEnd(), "group end");
    return TK_OK;
}

static tk_status n_reduce_scatter(void *ctx, void *buf, const int64_t *counts, tk_err *err) {
    return segments(ctx, buf, counts, sizeof(float), 1, err);
}
static tk_status n_all_gather(void *ctx, void *buf, const int64_t *counts, tk_err *err) {
    return segments(ctx, buf, counts, sizeof(float), 0, err);
}
static tk_status host_all_gather(nccl_rank *r, void *buf, const int64_t *counts, tk_err *err);
/* bytes: on the device through NCCL, in host memory between the threads */
static tk_status n_all_gather_bytes(void *ctx, void *buf, const int64_t *counts, tk_err *err) {
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, buf) != cudaSuccess || at.type != cudaMemoryTypeDevice) {
        cudaGetLastError(); /* an unregistered host pointer is not an error to keep */
        return host_all_gather(ctx, buf, counts, err);
    }
    return segments(ctx, buf, counts, 1, 0, err);
}
static tk_status n_broadcast(void *ctx, void *buf, int64_t n, int root, tk_err *err) {
    nccl_rank *r = ctx;
    NC(N.Broadcast(buf, buf, (size_t)n, ncclFloat32, root, r->g->comms[r->rank], 0), "broadcast");
    return TK_OK;
}

/* The ranks' threads meet (called with the lock held): 1 when the run was
 * aborted meanwhile. */
static int barrier(nccl_group *g) {
    int gen = g->generation;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cond);
    }
    while (gen == g->generation && !g->aborted) pthread_cond_wait(&g->cond, &g->lock);
    return g->aborted;
}

/* The ranks' host values: each puts its own, and after the barrier the sum
 * in rank order is every rank's answer; a second barrier keeps the slots
 * until all have read them. */
static tk_status n_all_reduce_host(void *ctx, double *vals, int n, tk_err *err) {
    nccl_rank *r = ctx;
    nccl_group *g = r->g;
    if (n > g->host_cap) return tk_cuda_fail(err, TK_EINVAL, "host all-reduce of %d values (at most %d)", n, g->host_cap);
    pthread_mutex_lock(&g->lock);
    memcpy(g->host + (size_t)r->rank * g->host_cap, vals, (size_t)n * sizeof *vals);
    int aborted = barrier(g);
    for (int i = 0; i < n && !aborted; i++) {
        double s = 0;
        for (int q = 0; q < g->n; q++) s += g->host[(size_t)q * g->host_cap + i];
        vals[i] = s;
    }
    if (!aborted) aborted = barrier(g);
    pthread_mutex_unlock(&g->lock);
    return aborted ? tk_cuda_fail(err, TK_EDEVICE, "another rank ended the run") : TK_OK;
}

/* Host buffers (a checkpoint's state): the ranks are threads of this
 * process, so each copies the others' segments from their buffers. */
static tk_status host_all_gather(nccl_rank *r, void *buf, const int64_t *counts, tk_err *err) {
    nccl_group *g = r->g;
    pthread_mutex_lock(&g->lock);
    g->ptrs[r->rank] = buf;
    int aborted = barrier(g);
    pthread_mutex_unlock(&g->lock);
    size_t off = 0;
    for (int q = 0; q < g->n && !aborted; q++) {
        if (q != r->rank && counts[q]) memcpy((char *)buf + off, (char *)g->ptrs[q] + off, (size_t)counts[q]);
        off += (size_t)counts[q];
    }
    pthread_mutex_lock(&g->lock);
    if (!aborted) aborted = barrier(g);
    pthread_mutex_unlock(&g->lock);
    return aborted ? tk_cuda_fail(err, TK_EDEVICE, "another rank ended the run") : TK_OK;
}

static void n_abort(void *ctx, int code) {
    (void)code;
    nccl_rank *r = ctx;
    nccl_group *g = r->g;
    pthread_mutex_lock(&g->lock);
    if (!g->aborted)
        for (int q = 0; q < g->n; q++) N.CommAbort(g->comms[q]);
    g->aborted = 1;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

static void n_close(void *ctx) { free(ctx); }

static const tk_coll_backend NCCL_BE = { "nccl", n_all_reduce, n_reduce_scatter, n_all_gather, n_all_gather_bytes,
                                         n_broadcast, n_all_reduce_host, n_abort, n_close };

__attribute__((visibility("default")))
tk_status tk_cuda_nccl_group_new(int n, const int *devs, void **group, tk_err *err) {
    *group = NULL;
    pthread_once(&nccl_once, nccl_load);
    if (!N.ready) return tk_cuda_fail(err, TK_EINVAL, "%s", N.why);
    nccl_group *g = calloc(1, sizeof *g);
    if (!g || !(g->devs = malloc((size_t)n * sizeof *g->devs)) || !(g->comms = calloc((size_t)n, sizeof *g->comms)) ||
        !(g->host = calloc((size_t)n * 8, sizeof *g->host)) || !(g->ptrs = calloc((size_t)n, sizeof *g->ptrs))) {
        if (g) free(g->devs), free(g->comms), free(g->host), free(g);
        return tk_cuda_fail(err, TK_ENOMEM, "out of host memory for the NCCL group");
    }
    g->n = n;
    g->host_cap = 8;
    memcpy(g->devs, devs, (size_t)n * sizeof *devs);
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    ncclResult_t r = N.CommInitAll(g->comms, n, devs);
    if (r != ncclSuccess) {
        tk_status st = nccl_fail(err, "ncclCommInitAll", r);
        free(g->host), free(g->ptrs), free(g->devs), free(g->comms), free(g);
        return st;
    }
    *group = g;
    return TK_OK;
}

__attribute__((visibility("default")))
void tk_cuda_nccl_group_destroy(void *group) {
    nccl_group *g = group;
    if (!g) return;
    for (int q = 0; q < g->n; q++)
        if (!g->aborted) N.CommDestroy(g->comms[q]);
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cond);
    free(g->host), free(g->ptrs), free(g->devs), free(g->comms), free(g);
}

__attribute__((visibility("default")))
tk_status tk_cuda_nccl_rank(void *group, int rank, const tk_coll_backend **be, void **ctx, tk_err *err) {
    nccl_group *g = group;
    if (!g || rank < 0 || rank >= g->n) return tk_cuda_fail(err, TK_EINVAL, "NCCL: rank %d of a group of %d", rank, g ? g->n : 0);
    nccl_rank *r = calloc(1, sizeof *r);
    if (!r) return tk_cuda_fail(err, TK_ENOMEM, "out of host memory for an NCCL rank");
    r->g = g;
    r->rank = rank;
    *be = &NCCL_BE;
    *ctx = r;
    return TK_OK;
}
