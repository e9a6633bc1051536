/* snapshot_peak.h — the snapshot reader's fourth layer (after decode,
 * trace, owners and frames): the trace's peak moment read whole. What was
 * live then, by category (parameters, gradients, optimizer state,
 * activations, temporaries, the batch, library workspaces, blocks from
 * before the recording) and the activations by the forward's layer; the
 * phase and step it fell in; the phase at the OOM; the workspaces the file
 * shows (s->ws); and the sizes live then, from which the model is
 * recognised (snapshot_plan.c).
 *
 * Guarantees: a category comes from when a block was made and when it was
 * freed (its phase and lifetime), never from its size alone; the shares sum
 * to the peak's allocated. Only the snapshot reader's files include it.
 */
#ifndef TK_SNAPSHOT_PEAK_H
#define TK_SNAPSHOT_PEAK_H

#include "snapshot_frames.h"

/* Fills s->peak, s->phase_at_peak, s->phase_at_oom and s->ws. 0, or -1
 * with d->err (host memory). */
int snap_read_peak(snap_dec *d, const snap_replay *r, const snap_frames *f);

#endif
