/* snapshot_diagnose.c — the snapshot reader's diagnosis (its sixth layer,
 * after decode, trace, owners and frames, the peak and the leak): the facts
 * record (tk_facts.h) filled from the figures the earlier layers read (a
 * leak and who kept it, growth, an engine's pool, the cache split at the
 * request's pool, a full device, memory outside the cache, a dominant
 * owner), then the advisor's one table of diagnoses (diagnoses.c), whose
 * findings and fixes are copied into the snapshot.
 *
 * Guarantees: no capacity, fragmentation or leak is claimed without the
 * figures that prove it (an OOM, a capacity known, free blocks counted,
 * iterations that keep bytes); a fix's code carries no number the file or
 * the user did not give (B // 2, max_length=N with N their data's p99).
 */
#include "snapshot_diagnose.h"
#include "tk_facts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tk_fix_note *snap_fix_find(tk_snapshot *s, const char *id) {
    for (int i = 0; i < s->n_fixes; i++)
        if (!strcmp(s->fixes[i].id, id)) return &s->fixes[i];
    return NULL;
}

tk_fix_note *snap_fix_insert(tk_snapshot *s, const char *id, int pos) {
    if (snap_fix_find(s, id)) return NULL;
    if (s->n_fixes == TK_SNAP_MAX_FIXES) s->n_fixes--;
    if (pos > s->n_fixes) pos = s->n_fixes;
    memmove(&s->fixes[pos + 1], &s->fixes[pos], (size_t)(s->n_fixes - pos) * sizeof *s->fixes);
    s->n_fixes++;
    tk_fix_note *f = &s->fixes[pos];
    memset(f, 0, sizeof *f);
    snprintf(f->id, sizeof f->id, "%s", id);
    f->saves = -1;
    return f;
}

/* The snapshot's reader: what its figures prove, once; the rules only say it. */
static void read_snap_facts(const tk_snapshot *s, tk_facts *f) {
    memset(f, 0, sizeof *f);
    f->snap = s;
    f->own = f->other = f->lottery_near = f->snap_user = f->snap_device = -1;
    /* the frames show the Trainer: TrainingArguments lines; else a plain loop's */
    f->api = s->trainer ? TK_API_TRAINER : TK_API_LOOP;
    if (s->has_leak) {
        f->leak_who = s->leak_owner[0] && strncmp(s->leak_owner, "no Python frame", 15) &&
                              strcmp(s->leak_owner, SNAP_BEFORE_HISTORY) ? s->leak_owner : NULL;
        int per_iter_blocks = s->leak_owner_iterations ? s->leak_owner_blocks / s->leak_owner_iterations : 0;
        f->leak_graph = per_iter_blocks >= 8 || !f->leak_who;
    }
    f->snap_pool = s->vllm_pool_bytes && s->vllm_pool_bytes >= s->allocated / 2;
    /* At an OOM, the figures that matter are the failing device's. */
    const tk_snap_device *od = NULL;
    for (int i = 0; s->has_oom && s->n_device_rows > 1 && i < s->n_device_rows; i++)
        if (s->devices[i].device == s->oom_device) od = &s->devices[i];
    if (od) f->snap_device = od->device, f->snap_devices = s->n_device_rows;
    f->snap_reserved = od ? od->reserved : s->reserved;
    f->snap_allocated = od ? od->allocated : s->allocated;
    size_t need = f->snap_need = s->has_oom ? s->oom_size : 0;
    /* Fragmentation: enough is free in the cache, in pieces too small. With
     * an OOM that is "free >= request > largest block" in the request's pool
     * (PyTorch serves requests of up to 1 MiB from the small pool only);
     * without one, a cache whose free part is at least a quarter of what is
     * reserved and scattered (no block holds half of it). */
    f->snap_pool_name = need <= ((size_t)1 << 20) ? "small" : "large";
    for (int i = 0; !od && i < s->n_pools; i++)
        if (!strcmp(s->pools[i].pool, f->snap_pool_name)) {
            f->snap_pool_free += s->pools[i].free;
            if (s->pools[i].largest_free > f->snap_pool_largest) f->snap_pool_largest = s->pools[i].largest_free;
        }
    if (od) {
        int small = !strcmp(f->snap_pool_name, "small");
        f->snap_pool_free = small ? od->free_small : od->free_large;
        f->snap_pool_largest = small ? od->largest_small : od->largest_large;
    }
    f->snap_frag = s->has_oom ? (f->snap_pool_free >= need && f->snap_pool_largest < need)
                              : (s->free_in_cache >= s->reserved / 4 && s->free_in_cache >= ((size_t)1 << 20) &&
                                 s->largest_free_block < s->free_in_cache / 2);
    /* Capacity: at an OOM that is not fragmentation, no block of the pool
     * fits and the device cannot give a new segment; without an OOM, only
     * with the device's capacity known: what PyTorch reserved fills it and
     * live tensors fill that (a cache that is merely full of live tensors
     * says nothing of the card). */
    f->snap_cap = s->has_oom ? !f->snap_frag
                             : (s->capacity && s->reserved >= s->capacity / 10 * 9 &&
                                s->allocated >= s->reserved / 10 * 9);
    /* Headroom: with the card's size known, what neither PyTorch holds nor
     * the device reports free is held by someone else. */
    f->snap_headroom = s->has_oom && s->capacity && f->snap_reserved + s->oom_device_free < s->capacity / 100 * 90;
    /* the largest owner of what is live at the end, when it is code of the
     * user's (not a library's workspace, nor blocks with no frame) */
    f->snap_dominant = s->n_owners > 1 && s->allocated && !snap_names_no_code(s->owners[0].owner) &&
                       s->owners[0].bytes >= s->allocated / 5 * 2;
    /* del is for tensors the user's code keeps: not a pool an engine
     * preallocated, nor what only native code or a library holds */
    for (int i = 0; i < s->n_owners && f->snap_user < 0; i++)
        if (!snap_names_no_code(s->owners[i].owner) && s->owners[i].pool_bytes < s->owners[i].bytes / 2)
            f->snap_user = i;
}

/* read -> facts -> diagnose (the one table) -> fixes, copied into s */
void snap_diagnose(tk_snapshot *s) {
    tk_facts f;
    read_snap_facts(s, &f);
    tk_diagnose_into(&f, s->diag, TK_SNAP_MAX_DIAG, &s->n_diag, s->fixes, TK_SNAP_MAX_FIXES, &s->n_fixes);
}
