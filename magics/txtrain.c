/* txtrain.c — `%%txtrain`: a YAML config in, a plan, a live-progress
 * training run, a per-epoch table, or an OOM autopsy out. Also creates the
 * notebook session every txkernel magic shares, and offers config-key
 * completion and help inside the cell body.
 *
 * Guarantees:
 *  - A config error ends the cell before anything runs, naming line and key.
 *  - When the plan does not fit what the device has free, the cell shows the
 *    plan and ends with an error; nothing was allocated on the device.
 *  - A run-time OOM ends the cell with an autopsy (what, for whom, capacity,
 *    free, allocated, reserved, largest free block, top owners); the run's
 *    memory is released and the kernel keeps serving.
 *  - An interrupt stops at the next optimizer step; the last epoch's
 *    checkpoint stays.
 *  - Progress updates are throttled (at most 4 a second, plus the last one).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk_app.h"
#include "tk_magics.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_txmagics.h"


static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    tk_magic_ctx *m;
    char display_id[64];
    int shown;
    double last;
    tk_progress p;
    int have_p;
    char fetch_id[64];       /* the download's own progress line */
    int fetch_shown;
    double fetch_last;
} run_view;

static void fmt_eta(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 1e7) { snprintf(buf, n, "?"); return; }
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%dh%02dm", t / 3600, t / 60 % 60);
    else snprintf(buf, n, "%dm%02ds", t / 60, t % 60);
}

static void show_progress(run_view *v, int final) {
    const tk_progress *p = &v->p;
    char label[512], eta[32], al[32], pk[32], cap[32];
    fmt_eta(p->eta_s, eta, sizeof eta);
    snprintf(label, sizeof label,
             "epoch %d/%d  step %lld/%lld  loss %.4f  %.1f samples/s  ETA %s  mem %s alloc / %s peak / %s",
             p->epoch, p->epochs, (long long)p->step, (long long)p->total_steps, p->loss, p->samples_per_s,
             final ? "0m00s" : eta, tk_format_bytes(p->allocated, al, sizeof al),
             tk_format_bytes(p->peak, pk, sizeof pk),
             p->capacity ? tk_format_bytes(p->capacity, cap, sizeof cap) : "no limit");
    double frac = p->total_steps > 0 ? (double)p->step / (double)p->total_steps : 0;
    json_t *b = tk_bundle_new("");
    tk_bundle_take(b, "text/plain", tk_text_progress(frac, 30, label));
    tk_bundle_take(b, "text/html", tk_html_progress(frac, label));
    json_object_set_new(b, "application/json",
                        json_pack("{s:i, s:i, s:I, s:I, s:f, s:f, s:f, s:I, s:I, s:I}", "epoch", p->epoch, "epochs",
                                  p->epochs, "step", (json_int_t)p->step, "total_steps", (json_int_t)p->total_steps,
                                  "loss", (double)p->loss, "samples_per_s", p->samples_per_s, "eta_s", p->eta_s,
                                  "allocated", (json_int_t)p->allocated, "peak", (json_int_t)p->peak, "capacity",
                                  (json_int_t)p->capacity));
    tk_txshow(v->m, b, "progress", v->display_id, v->shown, 0);
    json_decref(b);
    v->shown = 1;
}

static int on_progress(void *ud, const tk_progress *p) {
    run_view *v = ud;
    v->p = *p;
    v->have_p = 1;
    double t = now_s();
    if (!v->shown || t - v->last >= 0.25) {
        show_progress(v, 0);
        v->last = t;
    }
    return v->m->cancel && atomic_load(v->m->cancel) ? 1 : 0;
}

/* A model file coming from the hub: one progress line per run, updated in
 * place (update_display_data), at most four times a second. */
static int on_download(void *ud, const char *file, int64_t done, int64_t total) {
    run_view *v = ud;
    double t = now_s();
    int end = total > 0 && done >= total;
    if (v->fetch_shown && !end && t - v->fetch_last < 0.25)
        return v->m->cancel && atomic_load(v->m->cancel) ? 1 : 0;
    char label[400], d[32], tt[32];
    snprintf(label, sizeof label, "download %.200s: %s of %s", file, tk_format_bytes((size_t)done, d, sizeof d),
             total > 0 ? tk_format_bytes((size_t)total, tt, sizeof tt) : "?");
    double frac = total > 0 ? (double)done / (double)total : 0;
    json_t *b = tk_bundle_new("");
    tk_bundle_take(b, "text/plain", tk_text_progress(frac, 30, label));
    tk_bundle_take(b, "text/html", tk_html_progress(frac, label));
    json_object_set_new(b, "application/json", json_pack("{s:s, s:I, s:I}", "file", file, "done", (json_int_t)done,
                                                         "total", (json_int_t)total));
    v->m->out->ops->display(v->m->out, b, NULL, v->fetch_id, v->fetch_shown);
    json_decref(b);
    v->fetch_shown = 1;
    v->fetch_last = t;
    return v->m->cancel && atomic_load(v->m->cancel) ? 1 : 0;
}

static void on_note(void *ud, const char *line) {
    run_view *v = ud;
    tk_magic_printf(v->m, "stdout", "%s\n", line);
}

/* The flags of %%txtrain, read by the option table (app/): --no-plan,
 * --json, --snapshot FILE, --file CFG.yaml. 0, or -1 after the error. */
static int txtrain_flags(tk_magic_ctx *m, int *ignore_plan, int *json, char *snap, size_t sn, char *file, size_t fn) {
    char **argv = NULL;
    int argc = 0, rc = 0;
    tk_app_args a;
    if (tk_txargs_parse(m, TK_VERB_TRAIN, &argv, &argc, &a)) return -1;
    if (a.n_plain)
        rc = tk_magic_error(m, "UsageError", "%s%s: expected key=value, got '%s'", m->is_cell ? "%%" : "%", m->name,
                            a.plain[0]);
    if (!rc) {
        *ignore_plan = tk_app_has(&a, "--no-plan");
        *json = tk_app_has(&a, "--json");
        snprintf(snap, sn, "%s", tk_app_arg(&a, "--snapshot") ? tk_app_arg(&a, "--snapshot") : "");
        snprintf(file, fn, "%s", tk_app_arg(&a, "--file") ? tk_app_arg(&a, "--file") : "");
    }
    tk_txargs_free(argv, argc);
    return rc;
}

static void show_result(tk_magic_ctx *m, const tk_run_report *r);
static int run_said(tk_magic_ctx *m, const tk_config *c, run_view *v, const tk_run_report *r, const tk_app_train_result *t,
                    int json_only, const tk_err *err);

static int run_txtrain(tk_magic_ctx *m) {
    tk_config c;
    tk_config base;
    int ignore_plan = 0, json = 0;
    char snap[1024], file[1024];
    if (txtrain_flags(m, &ignore_plan, &json, snap, sizeof snap, file, sizeof file)) return -1;
    tk_err err = {0};
    const tk_config *last = tk_session_config(m->session);
    if (file[0]) {
        /* --file: the YAML file is the base, the cell's body and key=value go over it */
        tk_config_defaults(&base);
        if (tk_app_config_file(&base, file, &err) != TK_OK) return tk_magic_error(m, "ConfigError", "%s", err.msg);
    } else if (!m->is_cell && !last) {
        return tk_magic_error(m, "UsageError", "%%txtrain (the line form) trains the session's last config, and there "
                                               "is none yet: use %%%%txtrain with a YAML body (or --file cfg.yaml)");
    } else if (!m->is_cell) {
        base = *last; /* the line form: the last config (from %%txtrain, %txplan, %txfix) */
    } else {
        tk_config_defaults(&base);
    }
    if (tk_txconfig_from_cell(m, &base, &c, 1)) return -1;
    if (tk_config_validate(&c, &err) != TK_OK) return tk_magic_error(m, "ConfigError", "%s", err.msg);
    if (m->is_cell || file[0]) tk_session_set_platform(m->session, NULL); /* a new config: no planned platform */
    return tk_txtrain_run(m, &c, ignore_plan, snap[0] ? snap : NULL, json);
}

static void ranks_note(void *ud, const char *line) {
    tk_magic_printf(ud, "stderr", "%s\n", line);
}

static void ranks_output(void *ud, const char *text) {
    tk_magic_printf(ud, "stdout", "%s", text);
}

/* world_size N on the cpu ran as N MPI ranks (app/ranks.c): their output
 * was streamed into the cell; the trained model is in output_dir (rank 0
 * writes it) and the session holds no weights of the run, so %txmem shows
 * none. A non-zero status is one error naming it. */
static int ranks_said(tk_magic_ctx *m, const tk_ranks_result *r) {
    if (r->code == 0) return 0;
    if (r->asked && r->code == 130) return tk_magic_interrupted(m);
    return tk_magic_error(m, r->code == 4 ? "OutOfMemoryError" : r->code == 3 ? "PlannedOOM" : "RunError",
                          "the %d-rank run ended with status %d (the output above names the rank and the reason)",
                          r->world, r->code);
}

int tk_txtrain_run_config(tk_magic_ctx *m, const tk_config *cfg, int ignore_plan, int json_only) {
    return tk_txtrain_run(m, cfg, ignore_plan, NULL, json_only);
}

int tk_txtrain_run(tk_magic_ctx *m, const tk_config *cfg, int ignore_plan, const char *snap, int json_only) {
    tk_session *s = m->session;
    tk_config c = *cfg;
    tk_err err = {0};
    run_view v;
    memset(&v, 0, sizeof v);
    v.m = m;
    snprintf(v.display_id, sizeof v.display_id, "txtrain-%d-%lld", m->execution_count, (long long)time(NULL));
    snprintf(v.fetch_id, sizeof v.fetch_id, "txfetch-%d-%lld", m->execution_count, (long long)time(NULL));
    tk_run_hooks h = {.on_note = on_note, .on_progress = on_progress, .on_download = on_download, .ud = &v,
                      .ignore_plan = ignore_plan};
    tk_ranks_io io = {.cancel = m->cancel, .on_note = ranks_note, .on_output = ranks_output, .ud = m};
    tk_app_train_request rq = {.config = &c, .snapshot = snap, .ranks = &io};
    if (tk_config_world_size(&c) > 1) tk_session_set_config(s, &c); /* the ranks' config is the session's */
    tk_run_report r;
    tk_app_train_result t;
    tk_status st = tk_app_train(s, &rq, &h, &r, &t, &err);
    int rc = st != TK_OK ? tk_magic_error(m, t.ename, "%s", err.msg) : t.launched ? ranks_said(m, &t.ranks)
                                                                                 : run_said(m, &c, &v, &r, &t, json_only, &err);
    if (t.snapshot_rc == 0) tk_magic_printf(m, "stdout", "%s\n", t.said);
    if (t.snapshot_rc < 0 && !rc) rc = tk_magic_error(m, "SnapshotError", "%s", t.said);
    json_decref(t.bundle);
    tk_run_report_clear(&r);
    return rc;
}

/* What a run that ended shows: the plan (it did not fit), the autopsy, the
 * interrupt, or the epochs and the result. */
static int run_said(tk_magic_ctx *m, const tk_config *c, run_view *v, const tk_run_report *r, const tk_app_train_result *t,
                    int json_only, const tk_err *err) {
    char b1[32], b2[32], b3[32];
    if (v->have_p && (r->end == TK_RUN_OOM || r->end == TK_RUN_CANCELLED || r->end == TK_RUN_DONE))
        show_progress(v, r->end == TK_RUN_DONE);
    if (t->bundle && json_only) tk_txemit_as(m, t->bundle, 1, t->kind); /* what `txk train --json` prints */
    else if (t->bundle) tk_txshow(m, t->bundle, t->kind, NULL, 0, 0);
    switch (r->end) {
    case TK_RUN_PLANNED_OOM: {
        size_t held = tk_session_held_in_process(m->session);
        return tk_magic_error(m, "OutOfMemoryPlanned",
                              "the plan needs %s at its peak but the device has %s free%s%s%s: stopped before "
                              "allocating anything (see the plan above; %%txadvise ranks fixes)",
                              tk_format_bytes(r->plan.peak_reserved, b1, sizeof b1),
                              tk_format_bytes(r->free_before, b2, sizeof b2),
                              held ? " (PyTorch's caching allocator in this process holds " : "",
                              held ? tk_format_bytes(held, b3, sizeof b3) : "",
                              held ? " of it: del what you no longer need; gc.collect(); torch.cuda.empty_cache())" : "");
    }
    case TK_RUN_OOM: {
        char *txt = r->have_oom ? tk_report_oom_text(&r->oom, r->oom_phase) : NULL;
        int rc = tk_magic_error(m, "OutOfMemoryError",
                                "%s%sAll memory of this run was released: allocated is back to %s (baseline %s); "
                                "the kernel is still running.",
                                txt ? txt : err->msg, txt ? "" : "\n", tk_format_bytes(r->allocated_after, b1, sizeof b1),
                                tk_format_bytes(r->baseline, b2, sizeof b2));
        free(txt);
        return rc;
    }
    case TK_RUN_CANCELLED:
        tk_magic_printf(m, "stdout", "Interrupted after step %lld (%d complete epoch%s). %s%s\n", (long long)r->steps,
                        r->epochs_done, r->epochs_done == 1 ? "" : "s",
                        r->checkpoint[0] ? "Last checkpoint: " : "No checkpoint written.", r->checkpoint);
        return tk_magic_interrupted(m);
    case TK_RUN_DONE:
        if (!json_only) show_result(m, r);
        /* save_error: continue went on past a failed save: the cell still
         * fails, so Run All stops and nobody takes the run as saved */
        if (r->failed_saves)
            return tk_magic_error(m, "SaveError", "%d save%s into %s failed during the run (save_error: continue; the "
                                  "messages above say why); %s%s", r->failed_saves, r->failed_saves == 1 ? "" : "s",
                                  c->output_dir, r->checkpoint[0] ? "the last one saved: " : "nothing was saved",
                                  r->checkpoint);
        return 0;
    default:
        return tk_magic_error(m, "RunError", "%s", err->msg[0] ? err->msg : "the run failed");
    }
}

/* The run's one-line summary and its figures as the cell's result. */
static void show_result(tk_magic_ctx *m, const tk_run_report *rp) {
    const tk_run_report r = *rp;
    char b1[32], b2[32], b3[32], b4[32];
    char line[1024];
    snprintf(line, sizeof line,
             "Trained %lld steps in %.1f s. Peak %s allocated, %s reserved (planned %s). Allocated now %s.%s%s",
             (long long)r.steps, r.seconds, tk_format_bytes(r.peak_allocated, b1, sizeof b1),
             tk_format_bytes(r.peak_reserved, b2, sizeof b2),
             tk_format_bytes(r.plan.peak_allocated, b3, sizeof b3),
             tk_format_bytes(r.allocated_after, b4, sizeof b4), r.checkpoint[0] ? " Checkpoint: " : "",
             r.checkpoint);
    if (r.have_device_peak) {
        size_t l = strlen(line);
        snprintf(line + l, sizeof line - l, " Device peak (CUPTI) %s, of which outside the allocator at least "
                 "the plugin's %s.", tk_format_bytes(r.device_peak, b1, sizeof b1),
                 tk_format_bytes(r.plugin_bytes, b2, sizeof b2));
    }
    json_t *res = tk_bundle_new(line);
    const tk_epoch_stats *last = r.n_history ? &r.history[r.n_history - 1] : NULL;
    json_t *rj = json_pack("{s:I, s:f, s:I, s:I, s:I, s:I, s:s}", "steps", (json_int_t)r.steps, "seconds",
                           r.seconds, "peak_allocated", (json_int_t)r.peak_allocated, "peak_reserved",
                           (json_int_t)r.peak_reserved, "planned_peak_allocated",
                           (json_int_t)r.plan.peak_allocated, "allocated_after", (json_int_t)r.allocated_after,
                           "checkpoint", r.checkpoint);
    /* metrics are NaN when there is no dev set: JSON has no NaN, say null */
    if (r.have_device_peak) {
        json_object_set_new(rj, "device_peak", json_integer((json_int_t)r.device_peak));
        json_object_set_new(rj, "plugin_bytes", json_integer((json_int_t)r.plugin_bytes));
    }
    json_object_set_new(rj, "train_loss", last && isfinite(last->train_loss) ? json_real(last->train_loss) : json_null());
    json_object_set_new(rj, "dev_loss", last && isfinite(last->dev_loss) ? json_real(last->dev_loss) : json_null());
    json_object_set_new(rj, "dev_acc", last && isfinite(last->dev_acc) ? json_real(last->dev_acc) : json_null());
    json_object_set_new(res, "application/json", rj);
    tk_txshow(m, res, "result", NULL, 0, 1);
    json_decref(res);
}

/* ---- config from a cell ------------------------------------------------------- */

int tk_txconfig_from_cell(tk_magic_ctx *m, const tk_config *base, tk_config *out, int skip_flags) {
    tk_err err = {0};
    *out = *base;
    if (m->body && *m->body &&
        tk_config_parse_yaml_at(out, m->body, strlen(m->body), "cell", m->line + 1, &err) != TK_OK)
        return tk_magic_error(m, "ConfigError", "%s", err.msg);
    char **argv = NULL;
    int argc = 0;
    if (tk_txargs_split(m->args, &argv, &argc)) return tk_magic_error(m, "UsageError", "unbalanced quotes");
    int rc = 0;
    for (int i = 0; i < argc && !rc; i++) {
        if (skip_flags && !strncmp(argv[i], "--", 2)) {
            /* the caller's flags: the option table says which read the next word */
            if (tk_app_option_valued(tk_app_option_find(argv[i]), TK_DOOR_CELL)) i++;
            continue;
        }
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            rc = tk_magic_error(m, "UsageError", "%s%s: expected key=value, got '%s'", m->is_cell ? "%%" : "%",
                                m->name, argv[i]);
            break;
        }
        *eq = 0;
        if (tk_config_set(out, argv[i], eq + 1, &err) != TK_OK) rc = tk_magic_error(m, "ConfigError", "%s", err.msg);
    }
    tk_txargs_free(argv, argc);
    return rc;
}

/* ---- completion and help of config keys ----------------------------------------- */

/* Inside a %%txtrain/%%txplan body, a word at the start of a line (after
 * indentation) completes to config keys. */
static void complete_keys(void *ctx, const char *code, size_t cursor, json_t *matches, size_t *start,
                          size_t *end) {
    (void)ctx;
    if (strncmp(code, "%%txtrain", 9) && strncmp(code, "%%txplan", 8)) return;
    size_t ls = cursor;
    while (ls > 0 && code[ls - 1] != '\n') ls--;
    if (ls == 0) return; /* the magic line itself */
    size_t ws = ls;
    while (ws < cursor && (code[ws] == ' ' || code[ws] == '\t')) ws++;
    for (size_t i = ws; i < cursor; i++)
        if (code[i] == ':' || code[i] == ' ') return;
    size_t n = cursor - ws;
    int added = 0;
    for (const char *const *k = tk_config_keys(); *k; k++)
        if (!strncmp(*k, code + ws, n)) {
            json_array_append_new(matches, json_string(*k));
            added = 1;
        }
    if (added) {
        *start = ws;
        *end = cursor;
    }
}

static int inspect_key(void *ctx, const char *word, int detail, json_t *data) {
    (void)ctx;
    (void)detail;
    const char *h = tk_config_key_help(word);
    if (!h) return 0;
    char buf[600];
    snprintf(buf, sizeof buf, "%s: %s", word, h);
    json_object_set_new(data, "text/plain", json_string(buf));
    return 1;
}

static int run_txkeys(tk_magic_ctx *m) {
    const char *h[] = {"key", "what it sets"};
    tk_rtable *t = tk_rtable_new("Config keys (YAML in %%txtrain, key=value in %txplan)", 2, h);
    if (!t) return tk_magic_error(m, "MemoryError", "out of host memory");
    for (const char *const *k = tk_config_keys(); *k; k++) {
        const char *row[2] = {*k, tk_config_key_help(*k)};
        tk_rtable_row(t, row);
    }
    json_t *b = tk_bundle_new("");
    tk_bundle_take(b, "text/plain", tk_rtable_text(t));
    tk_bundle_take(b, "text/html", tk_rtable_html(t));
    tk_bundle_take_json(b, "application/json", tk_rtable_json(t));
    tk_rtable_destroy(&t);
    tk_txshow(m, b, "keys", NULL, 0, 0);
    json_decref(b);
    return 0;
}

static void session_free(void *p) {
    tk_session *s = p;
    tk_session_destroy(&s);
}

static const tk_magic_def TXTRAIN[] = {
    {"txtrain", TK_MAGIC_BOTH, run_txtrain, "plan, then fine-tune BERT from a YAML config (live progress, OOM autopsy)",
     "%%txtrain [key=value ...] {flags}\n<YAML config>\n"
     "%txtrain [key=value ...] {flags}   (the session's last config, e.g. after %txfix)\n\n"
     "Example:\n  %%txtrain\n  model: bert-mini\n  train_file: train.csv\n  max_len: 128\n  batch_size: 16\n"
     "  epochs: 2\n  device: {capacity: 800MiB}\n\n"
     "First plans the run on the meta device at the worst-case batch. If the predicted\n"
     "peak exceeds what the device has free, stops before allocating anything and shows\n"
     "where the memory would go. Else trains with a live progress bar (epoch, step, loss,\n"
     "samples/s, ETA, memory), then shows a per-epoch table. A run-time OOM ends the cell\n"
     "with an autopsy and releases the run's memory. Interrupt stops at the next step.\n"
     "--no-plan trains even when the plan says it will not fit (to see where it breaks).\n"
     "--snapshot FILE writes the run's allocations as a PyTorch memory snapshot (.pickle);\n"
     "--file cfg.yaml trains that file's config (the body and key=value go over it).\n"
     "--json shows the epochs' JSON (or the plan's, when it does not fit), as `txk train --json`.\n"
     "Keys: %txkeys, or Tab inside the body; Shift-Tab on a key shows its help."},
    {"txkeys", TK_MAGIC_LINE, run_txkeys, "every config key of %%txtrain with its help",
     "%txkeys\n\nThe keys a %%txtrain body (YAML) or a %txplan key=value override can set, with\n"
     "what each does. Nested sections model:, data:, train:, device: hold the same keys."},
};

int tk_magics_register_txtrain(tk_magics *m) {
    if (!tk_magics_session(m)) {
        tk_session *s = tk_session_new();
        if (!s) return -1;
        tk_magics_set_session(m, s, session_free);
    }
    tk_magics_add_completer(m, complete_keys, NULL);
    tk_magics_add_inspector(m, inspect_key, NULL);
    return tk_magics_add_table(m, TXTRAIN, sizeof TXTRAIN / sizeof TXTRAIN[0]);
}
