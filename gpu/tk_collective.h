/* tk_collective.h — collectives between the ranks of a data-parallel run:
 * all-reduce, reduce-scatter, all-gather, broadcast (sums of f32 device
 * buffers, and f64 host values for the run's loss and row counts).
 *
 * Backends, picked by the device and world_size (tk_coll_open):
 *  - single: world_size 1; every op is the identity (one rank's sum is itself).
 *  - meta:   the planner's; world_size N, this process plays rank r and no
 *            data moves, but every op counts the bytes a ring algorithm sends,
 *            so a plan says what a step communicates.
 *  - mpi:    the cpu; one process per rank started by mpirun. libmpi.so.40
 *            (OpenMPI) is dlopen'd by the first tk_coll_open with world_size
 *            > 1, so txk and the kernel start on machines without MPI; there
 *            the open fails with an error saying what to install.
 *  - nccl:   cuda (in the plugin, libnccl.so.2 dlopen'd on first use).
 *
 * Guarantees: with two ranks every reduction is one IEEE addition per
 * element, so its result does not depend on the order the ranks are added
 * in (a + b == b + a): a 2-rank step equals a 1-rank step that adds the two
 * micro-batches' gradients the same way (step.c does). Errors are statuses
 * with a message; no op aborts the process itself (MPI's own fault handling
 * ends a run whose peer died: mpirun stops every rank and names the dead one;
 * an MPI op that waits TXK_COLL_TIMEOUT_S seconds, 600 by default, for a
 * peer that hung fails saying so, and its caller calls tk_coll_abort).
 *
 * Ownership: buffers are borrowed; a tk_coll is the opener's
 * (tk_coll_close).
 */
#ifndef TK_COLLECTIVE_H
#define TK_COLLECTIVE_H

#include <stdint.h>
#include "tk_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tk_coll tk_coll;

/* A communicator of world_size ranks for device d's kind (see the list
 * above). On the cpu with world_size > 1 the process must be an MPI rank
 * (mpirun sets OMPI_COMM_WORLD_SIZE): otherwise TK_EINVAL says how runs of
 * that size are launched. `rank` is used by meta only (the rank a plan
 * plays); the others take theirs from the launcher. */
tk_coll *tk_coll_open(tk_dev *d, int world_size, int rank, tk_err *err);
void tk_coll_close(tk_coll **pc);

int tk_coll_rank(const tk_coll *c);
int tk_coll_size(const tk_coll *c);
/* "single", "meta", "mpi" or "nccl" */
const char *tk_coll_backend_name(const tk_coll *c);

/* Sums n f32 elements of every rank's buf into every rank's buf. */
tk_status tk_coll_all_reduce(tk_coll *c, void *buf, int64_t n, tk_err *err);
/* buf holds the ranks' segments one after another, counts[r] elements for
 * rank r; afterwards this rank's own segment (at its offset) is the sum of
 * every rank's copy of that segment. The other segments are left undefined. */
tk_status tk_coll_reduce_scatter(tk_coll *c, void *buf, const int64_t *counts, tk_err *err);
/* The same layout; this rank's segment is its input, and afterwards every
 * segment holds its owner's. */
tk_status tk_coll_all_gather(tk_coll *c, void *buf, const int64_t *counts, tk_err *err);
/* The same with counts in bytes, for state of any dtype (8-bit moments) in
 * host or device memory. */
tk_status tk_coll_all_gather_bytes(tk_coll *c, void *buf, const int64_t *counts, tk_err *err);
/* n f32 elements of rank root's buf into every rank's. */
tk_status tk_coll_broadcast(tk_coll *c, void *buf, int64_t n, int root, tk_err *err);
/* Sums n doubles of host memory across the ranks (loss sums, row counts). */
tk_status tk_coll_all_reduce_host(tk_coll *c, double *vals, int n, tk_err *err);

/* A rank that cannot go on (an error, an OOM) calls this after saying why:
 * every rank of the run ends with `code` (MPI_Abort) instead of waiting in
 * its next collective for this one. No-op for one rank and on meta. */
void tk_coll_abort(tk_coll *c, int code);
/* The same without a communicator at hand (the failing rank's command
 * line): ends the process's MPI job if MPI is up here, else does nothing. */
void tk_coll_abort_job(int code);

/* Bytes this rank has sent since the last reset, counted as a ring
 * algorithm sends them (all-reduce 2(N-1)/N of the buffer, reduce-scatter
 * and all-gather (N-1)/N, broadcast the buffer once, as a chain forwards
 * it). Host reductions are not counted. */
uint64_t tk_coll_bytes_sent(const tk_coll *c);
void tk_coll_reset_bytes(tk_coll *c);

/* Starts `world_size` copies of the program argv[0] (argv NULL-terminated)
 * as MPI ranks: mpirun -np N --oversubscribe --bind-to none argv... in a
 * child process of its own process group, its pid in *pid (the caller waits
 * for it, and asks the ranks to stop with kill(pid, SIGUSR1): mpirun passes
 * SIGUSR1 to every rank, where SIGINT would make it kill them). As root,
 * OpenMPI refuses to start unless OMPI_ALLOW_RUN_AS_ROOT=1 and
 * OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are set: they are set in the child's
 * environment only, never in the caller's. TK_EINVAL says what to install
 * when mpirun is not on PATH. */
tk_status tk_coll_mpirun(int world_size, char *const argv[], int *pid, tk_err *err);
/* The same with mpirun's stdout and stderr on out_fd (-1: inherited). */
tk_status tk_coll_mpirun_fd(int world_size, char *const argv[], int out_fd, int *pid, tk_err *err);

/* cuda: N GPUs in this process, one thread per GPU (NCCL's
 * ncclCommInitAll). Whoever starts the threads opens the group once for the
 * GPUs' ordinals (d: any cuda device of this process, to reach the plugin);
 * each thread then calls tk_coll_set_thread_rank(r) before opening its
 * trainer, whose tk_coll_open takes communicator r. libnccl.so.2 is loaded
 * here, on first use. One group per process at a time. */
tk_status tk_coll_group_open(tk_dev *d, int n, const int *ordinals, tk_err *err);
void tk_coll_group_close(void);
void tk_coll_set_thread_rank(int rank);

/* This process's rank and size as the launcher set them (mpirun's
 * OMPI_COMM_WORLD_RANK / _SIZE), without opening anything: rank 0 and size 1
 * outside a launcher. */
int tk_coll_env_rank(void);
int tk_coll_env_size(void);

#ifdef __cplusplus
}
#endif
#endif
