/* snapshot.c — `--snapshot FILE` on plan and train, one implementation for
 * `txk` and the cells (issue 39): the planned step's meta allocator, or the
 * run's device allocator, written as a PyTorch memory snapshot that
 * PyTorch's own viewer opens.
 *
 * Guarantees: the file is written whole or not at all (tk_snap_write); the
 * sentence says exact bytes so scripts and tests can hold it to the plan.
 */
#include <stdio.h>

#include "tk_app.h"
#include "tk_plan.h"
#include "tk_snapshot.h"

static void opened(tk_alloc *a, void *ud) {
    (void)ud;
    tk_alloc_record_history(a, TK_APP_SNAPSHOT_EVENTS);
}

static void closing(tk_alloc *a, const tk_oom *oom, void *ud) {
    tk_plan_snapshot *ps = ud;
    ps->rc = tk_snap_write(a, oom, ps->path, &ps->err);
    tk_alloc_stats st;
    tk_alloc_stats_get(a, &st);
    ps->reserved = st.reserved;
    ps->allocated = st.allocated;
    ps->peak = st.allocated_peak;
    ps->oom = oom != NULL;
}

void tk_plan_snapshot_watch(tk_plan_snapshot *ps, tk_plan_watch *w) {
    *w = (tk_plan_watch){.opened = opened, .closing = closing, .ud = ps};
}

int tk_plan_snapshot_said(const tk_plan_snapshot *ps, char *buf, size_t n) {
    if (ps->rc) {
        snprintf(buf, n, "%s", ps->err.msg);
        return -1;
    }
    snprintf(buf, n, "PyTorch snapshot of the planned step written to %s: reserved %zu B, allocated %zu B, peak "
             "allocated %zu B%s", ps->path, ps->reserved, ps->allocated, ps->peak, ps->oom ? ", with the oom event" : "");
    return 0;
}

tk_status tk_run_snapshot_write(tk_dev *d, const tk_oom *oom, const char *path, char *said, size_t n, tk_err *err) {
    if (!d) {
        tk_err_set(err, TK_EINVAL, "%s: no device was opened, no snapshot written", path);
        return TK_EINVAL;
    }
    tk_alloc *a = tk_dev_alloc(d);
    if (tk_snap_write(a, oom, path, err)) return err && err->status ? err->status : TK_EIO;
    tk_alloc_stats st;
    tk_alloc_stats_get(a, &st);
    uint64_t dropped = 0;
    tk_alloc_history(a, NULL, 0, &dropped);
    snprintf(said, n, "PyTorch snapshot written to %s: reserved %zu B, allocated %zu B, peak allocated %zu B, %zu "
             "trace events%s%s", path, st.reserved, st.allocated, st.allocated_peak, tk_alloc_history_len(a),
             dropped ? " (the oldest dropped)" : "", oom ? ", with the oom event" : "");
    return TK_OK;
}
