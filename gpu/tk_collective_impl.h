/* tk_collective_impl.h — the collective backend table, for implementations
 * only (collective.c: single and meta; collective_mpi.c; the cuda plugin's
 * NCCL). The public wrappers in collective.c check arguments, count bytes
 * and fill the error message; a backend only moves data.
 */
#ifndef TK_COLLECTIVE_IMPL_H
#define TK_COLLECTIVE_IMPL_H

#include "tk_collective.h"

typedef struct tk_coll_backend {
    const char *name;
    /* in place; see tk_collective.h for each op's layout */
    tk_status (*all_reduce)(void *ctx, void *buf, int64_t n, tk_err *err);
    tk_status (*reduce_scatter)(void *ctx, void *buf, const int64_t *counts, tk_err *err);
    tk_status (*all_gather)(void *ctx, void *buf, const int64_t *counts, tk_err *err);
    tk_status (*all_gather_bytes)(void *ctx, void *buf, const int64_t *counts, tk_err *err);
    tk_status (*broadcast)(void *ctx, void *buf, int64_t n, int root, tk_err *err);
    tk_status (*all_reduce_host)(void *ctx, double *vals, int n, tk_err *err);
    /* ends every rank of the run (a peer that failed must not leave the
     * others waiting in a collective); single and meta: nothing */
    void (*abort)(void *ctx, int code);
    void (*close)(void *ctx);
} tk_coll_backend;

/* The MPI backend (collective_mpi.c): dlopens OpenMPI, initialises MPI once
 * per process, and fills rank and size. NULL with err on failure. */
void *tk_coll_mpi_open(const tk_coll_backend **be, int *rank, int *size, tk_err *err);

/* The cuda plugin's NCCL entry points (gpu/cuda/cuda_nccl.c), found with
 * tk_dev_plugin_sym. */
typedef tk_status (*tk_cuda_nccl_group_new_fn)(int n, const int *devs, void **group, tk_err *err);
typedef void (*tk_cuda_nccl_group_destroy_fn)(void *group);
typedef tk_status (*tk_cuda_nccl_rank_fn)(void *group, int rank, const tk_coll_backend **be, void **ctx,
                                          tk_err *err);

/* MPI_Abort on MPI_COMM_WORLD when this process initialised MPI. */
void tk_coll_mpi_abort_job(int code);

#endif
