/* tk_session.h — the notebook session: what one kernel remembers between
 * cells, and the run pipeline `%%txtrain` and `txk train` share.
 *
 * A session holds the device (kept between cells so memory figures carry
 * over and an earlier run's leftovers are visible), the last config, the
 * last plan, the last run's result and history, the last OOM record, the
 * memory timeline of the last run, and the token lengths of the last corpus
 * looked at. The advisor (issue 7) reads the last config / plan / OOM from
 * here; it never reaches into the magics.
 *
 * The run: config -> data (bert's one pipeline, tk_pipeline.h: tokenizer,
 * labels, features, batches) -> plan on meta at the worst-case batch -> if the plan does not fit
 * in what the device has free, stop before allocating anything -> model ->
 * tk_train_run -> release the model. Whatever happens, the device's allocated
 * bytes return to what they were before the run (the session baseline).
 *
 * Ownership: the session owns everything it holds; getters return borrowed
 * pointers valid until the next call that changes that part of the session.
 */
#ifndef TK_SESSION_H
#define TK_SESSION_H

#include <stdint.h>
#include "tk_config.h"
#include "tk_gpu.h"
#include "tk_plan.h"
#include "tk_render.h"
#include "tk_train.h" /* tk_progress: what a run's on_progress hook hands a front door */

struct tk_epoch_stats;

/* ---- the session ---------------------------------------------------------- */

typedef struct tk_session tk_session;

tk_session *tk_session_new(void);
void tk_session_destroy(tk_session **ps);

/* The device for config c: kept from an earlier call when it matches (kind
 * and capacity), else the old one is released and a new one opened (auto:
 * cuda when present, else cpu; `note` (may be NULL, 256 bytes) says when it
 * fell back). Borrowed. */
tk_dev *tk_session_device(tk_session *s, const tk_config *c, char *note, tk_err *err);
tk_dev *tk_session_current_device(tk_session *s); /* borrowed; NULL if none yet */
/* The allocator's event history (alloc, free, segments, OOM: what a PyTorch
 * snapshot's trace shows) is off unless asked for, as tk_gpu.h says: it
 * costs a ring of 48-byte events. This asks for the last max_events (0: off,
 * and what was kept is dropped) on the session's device now and on any
 * device it opens later, until asked otherwise; a reset keeps the request.
 * %txmem --record asks (as torch.cuda.memory._record_memory_history does),
 * and so does txk train --snapshot. TK_ENOMEM when the ring cannot be had. */
tk_status tk_session_record_history(tk_session *s, size_t max_events, tk_err *err);
size_t tk_session_recording(const tk_session *s); /* events asked for; 0: off */
/* The platform the user last planned on (%txplan --gpus P; NULL: none):
 * %txadvise and %txfix advise for its smallest card when the config names
 * no card (tk_run_spec_resolve). Cleared by a reset. */
const char *tk_session_platform(const tk_session *s);
void tk_session_set_platform(tk_session *s, const char *platform);
struct tk_traced_model; /* tk_embed_trace.h */
/* The companion's traced model (takes ownership; NULL clears): the
 * session's config becomes its config, and advice on a config it describes
 * is planned by tracing it (app/traced.c). Released by a reset. */
void tk_session_set_traced(tk_session *s, struct tk_traced_model *t);
/* The traced model when it describes `c` (its config, or one a fix of its
 * advice left), else NULL. Borrowed. */
struct tk_traced_model *tk_session_traced(const tk_session *s, const tk_config *c);
struct tk_run_where; /* tk_app.h */
/* Where a request of this session is made: its device when one is open,
 * and its platform. */
void tk_session_where(tk_session *s, struct tk_run_where *w);
/* Capacity a config runs against: capacity, else its GPU profile's, else 0. */
size_t tk_session_capacity_of(const tk_config *c);

/* Last config (NULL before the first). The session keeps a copy. */
const tk_config *tk_session_config(const tk_session *s);
void tk_session_set_config(tk_session *s, const tk_config *c);
const tk_plan_result *tk_session_plan(const tk_session *s);
void tk_session_set_plan(tk_session *s, const tk_plan_result *p);
const tk_oom *tk_session_oom(const tk_session *s);       /* last run-time OOM, or NULL */
/* Corpus lengths from the last %txdata or run (borrowed, may be NULL). */
const int *tk_session_lengths(const tk_session *s, int *n);
void tk_session_set_lengths(tk_session *s, const int *len, int n);

struct tk_run_data;     /* tk_pipeline.h */
/* The data of config *c as its run builds it (bert's one pipeline): when c
 * names a train_file, `out` gets the corpus, the session's lengths become
 * the corpus' and *c becomes the config the run uses (its label count).
 * c->model first becomes a local folder: a hub id's config and tokenizer
 * files come from the HF cache or are downloaded (never its weights:
 * tk_session_train fetches those once the plan fits; offline, a file the
 * cache lacks is named); a preset the cache lacks stays its shape, with no
 * network request. Without a train_file `out` is left zeroed. Every command
 * that plans, advises or trains a config comes through here. */
tk_status tk_session_load_data(tk_session *s, tk_config *c, struct tk_run_data *out, tk_err *err);
struct tk_run_hooks;
/* c->model becomes a local folder (bert/tk_hub.h) for `id`, what the user
 * named: a path as it is; a preset under init: random stays a shape (no
 * weights, no network); anything else from the HF cache, or, when
 * `download`, from the hub (the weights too when `weights` and init is
 * pretrained), with h's on_download progress and a note saying where the
 * model came from (h may be NULL). Without `download` (a preset that plans
 * and advice name) a preset not in the cache stays its shape, which is the
 * hub model's; another id not in the cache is an error naming the file the
 * cache lacks. tk_session_train and tk_session_load_data call it; so does
 * any command that needs a model. */
tk_status tk_session_resolve_model(tk_config *c, const char *id, int download, int weights,
                                   const struct tk_run_hooks *h, tk_err *err);
/* Releases everything: device, last run, timeline (keeps nothing but the
 * holder below, which is the host's to report, and the traced model, which
 * describes the user's model; tk_session_destroy frees it). */
void tk_session_reset(tk_session *s);

/* ---- device memory held by other code in this process ------------------------
 * In the Python companion the user's own PyTorch shares the process, and so
 * the GPU, with the engine: its caching allocator's segments are device
 * memory no plan of ours accounts for. The host (tk_embed_set_holder) reports
 * what it sees before each cell; the txkernel kernel reports nothing. */
typedef enum {
    TK_HOLDER_UNKNOWN = 0, /* nothing reported (the txkernel kernel: no such code) */
    TK_HOLDER_ABSENT,      /* torch is not imported in this process */
    TK_HOLDER_NO_CUDA,     /* torch is imported but sees no CUDA device */
    TK_HOLDER_IDLE,        /* torch has CUDA but has not initialised it: holds nothing */
    TK_HOLDER_HOLDS        /* reserved / allocated as reported */
} tk_holder_state;

typedef struct tk_holder {
    tk_holder_state state;
    size_t reserved, allocated; /* torch.cuda.memory_reserved() / memory_allocated() */
} tk_holder;

void tk_session_set_holder(tk_session *s, const tk_holder *h);
const tk_holder *tk_session_holder(const tk_session *s);
/* Bytes the holder keeps on the device (its reserved; 0 unless it holds). */
size_t tk_session_held_in_process(const tk_session *s);
/* One line on the holder ("PyTorch caching allocator in this process: 1.50
 * GiB reserved, 1.00 GiB allocated"); "" when nothing was reported. */
void tk_holder_line(const tk_holder *h, char *buf, size_t n);
/* What device d has free for a run of this session: the device's free bytes,
 * less the holder's reserved when the device is simulated (a real GPU's free
 * count already excludes it). */
size_t tk_session_free(const tk_session *s, tk_dev *d);
/* What a run of config c could have now: *free_now, the device's free bytes
 * plus what this session caches without using (0: no limit known), and
 * *held, what an earlier run of the session still has allocated; with no
 * device yet, c's capacity less the holder's reserved (when it holds). */
void tk_session_device_now(tk_session *s, const tk_config *c, size_t *free_now, size_t *held);

/* A sample of the memory timeline (one per optimizer step of the last run). */
typedef struct tk_mem_sample { int64_t step; size_t allocated, reserved, peak; } tk_mem_sample;
const tk_mem_sample *tk_session_timeline(const tk_session *s, int *n);

/* ---- a run ------------------------------------------------------------------- */

typedef enum {
    TK_RUN_DONE = 0,     /* trained to the end */
    TK_RUN_PLANNED_OOM,  /* the plan did not fit; nothing was allocated on the device */
    TK_RUN_OOM,          /* ran out at run time; memory released; oom holds the record */
    TK_RUN_CANCELLED,    /* interrupted at a step boundary */
    TK_RUN_FAILED        /* a config, data or device error; err says which */
} tk_run_end;

typedef struct tk_run_hooks {
    void (*on_note)(void *ud, const char *line);                  /* one-line status messages */
    int (*on_progress)(void *ud, const struct tk_progress *p);   /* every step; nonzero cancels */
    void (*on_epoch)(void *ud, const struct tk_epoch_stats *e);
    /* a model file being downloaded: `done` of `total` bytes (0 = unknown);
     * nonzero cancels (the partial file is resumed next time); may be NULL */
    int (*on_download)(void *ud, const char *file, int64_t done, int64_t total);
    void *ud;
    /* 1: train even when the plan says it will not fit (as a plain PyTorch
     * loop would), to see the run-time OOM and its autopsy */
    int ignore_plan;
} tk_run_hooks;

typedef struct tk_run_report {
    tk_run_end end;
    tk_plan_result plan;        /* the plan made before the run */
    size_t free_before;         /* device bytes free when the run started */
    size_t baseline, allocated_after;
    int have_oom;
    tk_oom oom;
    char oom_phase[32];         /* "model", "training" */
    int64_t steps;
    int epochs_done, n_history;
    struct tk_epoch_stats *history; /* owned (tk_run_report_clear) */
    size_t peak_allocated, peak_reserved;
    double seconds;
    char checkpoint[TK_PATH_MAX];
    int failed_saves;           /* saves that failed (checkpoints, the model folder) */
    int save_stopped;           /* 1: output_dir could not be made, or a save failed and ended the run */
    char device_note[256];
    /* cuda: CUPTI's peak of every device allocation in the process over the
     * run (segments + the plugin's buffers + libraries), and the plugin's
     * fixed buffers; have_device_peak 0 elsewhere or with CUPTI off */
    int have_device_peak;
    size_t device_peak, plugin_bytes;
} tk_run_report;
void tk_run_report_clear(tk_run_report *r);

/* The last run's report without its history (NULL before the first run):
 * the advisor compares its measured peak with the plan. Borrowed. */
const tk_run_report *tk_session_last_run(const tk_session *s);

/* The advisor's optional inputs from the session (issue 40): the last run
 * and its OOM record (same_config: it ran the config being advised) into
 * *run, the companion's live torch state (the holder, when it was read)
 * into *live; in->last_run / in->torch_live point at them, or stay NULL
 * when the session has neither. */
struct tk_advise_input;
struct tk_advise_run;
struct tk_advise_torch;
void tk_session_advise_facts(const tk_session *s, int same_config, struct tk_advise_input *in,
                             struct tk_advise_run *run, struct tk_advise_torch *live);

/* The last advice of %txadvise (NULL before one), which %txfix picks from.
 * take_advice hands the session a malloc'd tk_advice (it frees the old one;
 * %txreset frees it too). */
struct tk_advice;
const struct tk_advice *tk_session_advice(const tk_session *s);
void tk_session_take_advice(tk_session *s, struct tk_advice *a);
/* The config the last advice was asked for, as the user gave it (before
 * tk_run_spec_apply gave it the platform's card and the device's
 * attention): %txfix brings a fixed config back to it
 * (tk_run_spec_unapply). NULL without advice. */
const tk_config *tk_session_advice_config(const tk_session *s);
void tk_session_set_advice_config(tk_session *s, const tk_config *as_given);

/* Runs config c (already parsed and validated) in the session. Returns TK_OK
 * when the pipeline ran to an end described in r->end (including planned and
 * run-time OOM and cancel); another status when it could not start (err). */
tk_status tk_session_train(tk_session *s, const tk_config *c, const tk_run_hooks *h,
                           tk_run_report *r, tk_err *err);

/* ---- using a trained model ---------------------------------------------------- */

struct tk_predict_result;   /* tk_predict.h */
typedef struct tk_predict_report {
    int planned_oom;            /* 1: the inference plan did not fit: nothing ran */
    tk_plan_result plan;        /* tk_plan_inference of the prediction */
    size_t free_before;
    char **labels;              /* the model's id2label names (owned), NULL for qa */
    int n_labels;
    char model[TK_PATH_MAX];    /* the folder the model came from */
    uint64_t digest;            /* the input data's (tk_pipeline.h) */
    struct tk_predict_result *res; /* owned; NULL when nothing ran */
} tk_predict_report;
void tk_predict_report_clear(tk_predict_report *r);

/* The config to predict with. With `folder` (a trained output_dir, any HF
 * BERT folder, or a hub id "org/name", fetched into the HF cache or found
 * there): the defaults, model = the folder, max_len from its
 * tokenizer_config.json, and the text, pair and label columns the run was
 * trained with (its checkpoint's trainer_state.json) when it has them. With folder NULL, *c is a txkernel config already
 * parsed: the model becomes its output_dir when that holds a trained model. */
tk_status tk_session_predict_config(const char *folder, tk_config *c, tk_err *err);

/* Predictions of the model in c->model over the file c->train_file (the
 * pipeline's evaluation set: columns text_col / text_pair_col / label_col,
 * SQuAD JSON for a qa model), planned first like a run (tk_plan_inference):
 * a plan that does not fit what the device has free stops before allocating
 * (r->planned_oom). The head and labels come from the model's config.json.
 * Memory returns to the session baseline afterwards. */
tk_status tk_session_predict(tk_session *s, const tk_config *c, tk_predict_report *r, tk_err *err);

/* ---- reports shared by the magics and `txk` (text + HTML + JSON) ----------- */

/* The plan: peak vs capacity/free, category breakdown, top owners. `free`
 * is what the device has free (0 = unknown: compare with capacity). */
json_t *tk_report_plan(const tk_plan_result *p, size_t free_bytes);
/* An engine: pytorch plan (torchplan/tk_torchplan.h), naming the engine and
 * the versions it follows. New reference; NULL when out of host memory. */
struct tk_torchplan_result;
json_t *tk_report_torchplan(const struct tk_torchplan_result *r);
/* A plan's JSON j with the card's usable capacity and the verdict against
 * it ("usable", "fits"; unchanged when usable is 0): j, or NULL (j
 * released) when out of host memory. For engine: pytorch's and the traced
 * plan's reports. */
json_t *tk_plan_json_against(json_t *j, size_t usable, int fits);
/* engine: pytorch on each card of a platform (colab, kaggle, colab-2020,
 * all): device used, peaks, attention kernel, fits. *out: a new bundle. */
tk_status tk_torchplan_gpus_report(const tk_config *c, const char *platform, json_t **out, tk_err *err);
/* One card of a --gpus table, as the table's planner fills it. */
typedef struct tk_gpus_row {
    const struct tk_torchplan_result *plan; /* the card's figures (borrowed for the call); NULL: not planned */
    size_t usable;            /* the card's usable capacity for the plan (0: none known) */
    int fits;                 /* the plan's verdict against it */
    char label[64];           /* the row's card column; "": the card's name */
    char note[1536];          /* a line under the table (how a pair splits, why a card is left out); "" none */
    json_t *json;             /* the row's JSON (new reference, taken by the table) */
} tk_gpus_row;
/* Plans the step on `card` into *row (TK_OK with plan NULL and a note:
 * the card is left out). */
typedef tk_status (*tk_gpus_plan_fn)(void *ctx, const tk_gpu_profile *card, tk_gpus_row *row, tk_err *err);
/* The line above a --gpus table, written once every card is planned (it
 * may name what planning found: the versions, the model). */
typedef void (*tk_gpus_head_fn)(void *ctx, const char *platform, tk_sb *sb);
/* The one --gpus table frame engine: pytorch's plan and the traced plan
 * share: each card of `platform` planned by `plan`, a row each (card,
 * capacity, usable, device used, peaks, attention, fits), the notes under
 * it; the bundle's application/json is `meta` (taken, even on failure)
 * with "cards", the rows' JSON. *out: a new bundle. */
tk_status tk_gpus_table(const char *platform, tk_gpus_plan_fn plan, tk_gpus_head_fn head, void *ctx, json_t *meta,
                        json_t **out, tk_err *err);
/* Appends the in-process holder's line (tk_holder_line) and its JSON
 * ("in_process") to a bundle: when it holds device memory, or with `always`
 * whatever the host reported; nothing when the host reported nothing. */
void tk_report_add_holder(json_t *bundle, const tk_holder *h, int always);
/* One line on this process's host memory beside the device figures ("Host:
 * this process's resident set is 41.2 MiB (RSS) ..."), and "host_rss" (bytes)
 * in the bundle's JSON (tk_host_rss). */
void tk_report_add_host_rss(json_t *bundle);
/* For head flatten_dense: appends to a plan bundle (text/plain, text/html,
 * application/json "head") the head's weight shape and bytes, its share of
 * the peak, and what a per-token span head would take instead. No-op for
 * other heads. */
void tk_report_add_head_note(json_t *bundle, const tk_config *c, const tk_plan_result *p);
/* Appends the largest tensors at the planned peak (tk_plan_tensors_at_peak)
 * to a plan bundle: a table in text and HTML, and "tensors_at_peak" in its
 * application/json. No-op when n is 0. */
void tk_report_add_tensors(json_t *bundle, const tk_tensor_info *t, int n);
/* Appends what the plan was made from to a plan bundle: examples, labels,
 * batches and the data digest (a line of text, and "data" in its
 * application/json). No-op when d holds no data. */
void tk_report_add_data(json_t *bundle, const struct tk_run_data *d);
/* A prediction: the metrics (accuracy, macro F1 and the confusion matrix;
 * exact match and F1 for qa) when the input had gold labels, and the first
 * `rows` examples' predictions (label and probabilities, or the answer and
 * its span); `all` (JSON) holds every example. */
json_t *tk_report_predict(const tk_predict_report *r, int rows);
/* An OOM autopsy: what was being allocated, for which layer and category,
 * capacity, free, allocated, reserved, largest free block, top owners, and
 * the next things to try. `phase` may be NULL. */
char *tk_report_oom_text(const tk_oom *o, const char *phase);
json_t *tk_report_oom_json(const tk_oom *o, const char *phase);
/* The per-epoch table of a run. */
json_t *tk_report_history(const struct tk_epoch_stats *h, int n, int task);

/* Live memory of a device: `by` is "category", "owner" or "layer". */
json_t *tk_report_mem(tk_dev *d, const char *by, int top);
/* The bundle's "application/json" part is what --json prints. */

#endif
