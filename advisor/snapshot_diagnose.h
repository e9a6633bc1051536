/* snapshot_diagnose.h — the snapshot reader's sixth layer (after decode,
 * trace, owners and frames, the peak, the leak): the diagnoses and their
 * fixes, and the fix list's two helpers snapshot_plan.c uses too. Only the
 * snapshot reader's files include it.
 */
#ifndef TK_SNAPSHOT_DIAGNOSE_H
#define TK_SNAPSHOT_DIAGNOSE_H

#include "snapshot_leak.h"

/* Fills the facts record from the figures read and runs the advisor's one
 * table (diagnoses.c): s->diag (the cause first) and s->fixes. */
void snap_diagnose(tk_snapshot *s);

/* The fix with this id, or NULL. */
tk_fix_note *snap_fix_find(tk_snapshot *s, const char *id);
/* A new fix (saves -1) at position pos, later ones moved down (past the
 * table's size the last is dropped); NULL when the id is there already. */
tk_fix_note *snap_fix_insert(tk_snapshot *s, const char *id, int pos);

#endif
