/* snapshot_leak.h — the snapshot reader's fifth layer (after decode, trace,
 * owners and frames, the peak): a leak (allocated memory that stays from
 * one iteration of a loop to the next and grows) or growth inside one step
 * (activations piling up layer by layer, the optimizer state made at its
 * first step), read from the memory over time and who allocated what
 * stays. Only the snapshot reader's files include it.
 */
#ifndef TK_SNAPSHOT_LEAK_H
#define TK_SNAPSHOT_LEAK_H

#include "snapshot_peak.h"

/* Fills s->has_leak, has_growth and the leak_* and growth_* figures. 0, or
 * -1 with d->err (host memory). */
int snap_find_leak(snap_dec *d, const snap_replay *r, const snap_frames *f);

#endif
