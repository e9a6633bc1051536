/* tk_data_parallel.h — the trainer's data-parallel part (data_parallel.c),
 * for step.c and the checkpoint code only: which piece of each parameter
 * this rank owns, ZeRO 2's gradient pieces, the hooks that add or reduce a
 * backward stage's gradients, and the reductions around the optimizer.
 */
#ifndef TK_DATA_PARALLEL_H
#define TK_DATA_PARALLEL_H

#include "tk_train.h"

/* Opens t->coll for c->world_size (`rank` only on meta), lays out the
 * pieces (ZeRO 1/2) and, for ZeRO 2, tells the model to hold no gradients
 * and allocates this rank's gradient pieces. Before the optimizer. */
tk_status tk_dp_open(tk_trainer *t, int rank, tk_err *err);
/* Points the optimizer's table at this rank's pieces (ZeRO 1/2). */
void tk_dp_fill_params(const tk_trainer *t, tk_optim_param *ps, int n);
void tk_dp_close(tk_trainer *t);

/* Before a step's first micro-batch: ZeRO 2's pieces zeroed. */
tk_status tk_dp_begin(tk_trainer *t, tk_err *err);
/* Before this rank's nth micro-batch of a step: the stage hooks it needs. */
void tk_dp_micro(tk_trainer *t, int nth);
/* After the micro-batches: the gradients summed over the ranks (ZeRO 0:
 * all of them; 1: this rank's pieces; 2: done stage by stage already). */
tk_status tk_dp_reduce(tk_trainer *t, tk_err *err);
/* After an optimizer update (ZeRO 1/2): every rank gets every piece. */
tk_status tk_dp_gather(tk_trainer *t, tk_err *err);
/* After a failed step: scratch released, the model's gradients put back. */
void tk_dp_abandon(tk_trainer *t);
/* ZeRO 1/2: every slot's moments, whole, in host memory, gathered from
 * every rank (all ranks call it): *out gets 4 x slots buffers for
 * tk_train_state.optim_full (free with tk_dp_free_state). *out = NULL when
 * the state is not sharded or not allocated yet. */
tk_status tk_dp_gather_state(tk_trainer *t, void ***out, tk_err *err);
void tk_dp_free_state(const tk_trainer *t, void **bufs);
/* 1 when the optimizer's state is split over the ranks */
int tk_dp_sharded(const tk_trainer *t);
/* This rank's piece [lo, hi) of parameter i, and every rank's count (the
 * collectives' layout); lo = hi = 0 and NULL counts when not sharded. */
const int64_t *tk_dp_piece(const tk_trainer *t, int i, int64_t *lo, int64_t *hi);

#endif
