/* train.c — the train verb (issue 39): one typed request, one function,
 * which `txk train` (cli/txk.c cmd_train) and `%%txtrain` (magics/txtrain.c)
 * both call. world_size N on the cpu goes to the one rank launcher
 * (app/ranks.c); otherwise the session trains, with the allocator history
 * recorded for --snapshot from before the model loads, and the bundle the
 * door shows is made here: the plan when it did not fit, the epochs' table
 * when the run ended.
 *
 * Guarantees: *run is always safe to tk_run_report_clear; out->bundle is
 * owned by the caller; an error names its class in out->ename.
 */
#include <stdio.h>
#include <string.h>

#include "tk_app.h"
#include "tk_collective.h"
#include "tk_session.h"

static tk_status fail(tk_app_train_result *out, const char *ename, tk_status st) {
    out->ename = ename;
    return st;
}

tk_status tk_app_train(tk_session *s, const tk_app_train_request *rq, const tk_run_hooks *h, tk_run_report *run,
                       tk_app_train_result *out, tk_err *err) {
    memset(run, 0, sizeof *run);
    memset(out, 0, sizeof *out);
    out->snapshot_rc = 1;
    tk_config c = *rq->config;
    int world = tk_config_world_size(&c);
    if (rq->snapshot && world > 1) {
        tk_err_set(err, TK_EINVAL, "--snapshot records one device: not with world_size %d", world);
        return fail(out, "UsageError", TK_EINVAL);
    }
    if (world > 1 && c.device != TK_DEVICE_CUDA && tk_coll_env_size() == 1) {
        out->launched = 1;
        tk_status st = tk_app_ranks(&c, rq->rank_args, rq->n_rank_args, h->ignore_plan, rq->ranks, &out->ranks, err);
        return st == TK_OK ? TK_OK : fail(out, "RunError", st);
    }
    if (rq->snapshot) {
        /* The run reuses the session's device for this config, so recording
         * switched on here covers the whole run, model load included. */
        tk_dev *d = tk_session_device(s, &c, NULL, err);
        if (!d) return fail(out, "DeviceError", TK_EINVAL);
        if (tk_alloc_record_history(tk_dev_alloc(d), TK_APP_SNAPSHOT_EVENTS)) {
            tk_err_set(err, TK_ENOMEM, "out of host memory for the allocator history");
            return fail(out, "MemoryError", TK_ENOMEM);
        }
    }
    tk_status st = tk_session_train(s, &c, h, run, err);
    if (st != TK_OK)
        return fail(out, run->save_stopped ? "SaveError" : st == TK_EFORMAT || st == TK_EIO ? "DataError" : "RunError",
                    st);
    if (run->end == TK_RUN_PLANNED_OOM) {
        out->bundle = tk_app_planned_oom_report(s, &c, run);
        out->kind = "plan";
        return TK_OK; /* nothing ran: no snapshot to write */
    }
    if (run->end == TK_RUN_DONE) {
        out->bundle = tk_report_history(run->history, run->n_history, c.task);
        out->kind = "epochs";
    }
    if (rq->snapshot) {
        tk_err serr = {0};
        out->snapshot_rc = 0;
        if (tk_run_snapshot_write(tk_session_current_device(s), run->end == TK_RUN_OOM && run->have_oom ? &run->oom : NULL,
                                  rq->snapshot, out->said, sizeof out->said, &serr) != TK_OK) {
            snprintf(out->said, sizeof out->said, "%s", serr.msg);
            out->snapshot_rc = -1;
        }
    }
    return TK_OK;
}
