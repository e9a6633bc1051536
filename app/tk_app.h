/* tk_app.h — the request layer (issue 39): what a shell line, a magic's
 * argument line and the Python companion all mean by the same words.
 *
 * Two things live here so that no front door keeps its own copy:
 *  - the option table: every flag declared once, with the verbs that take it
 *    in each door (shell `txk VERB`, a txkernel cell `%txVERB`, the Python
 *    companion); one parser reads argv and a magic's split argument line the
 *    same way; the usage lines and the reference pages are generated from it;
 *  - the resolved run spec: a config, the device found and the platform the
 *    user planned on, resolved once into the device kind, card, capacity,
 *    attention (and why), world size, labels, api and platform that the plan,
 *    the run, the advice and the fixes all read.
 *
 * Ownership: tables and option records are static; tk_app_args holds
 * borrowed pointers into the argv it was parsed from.
 */
#ifndef TK_APP_H
#define TK_APP_H

#include <stddef.h>
#include <jansson.h>
#include "tk_config.h"
#include "tk_gpu.h"

/* ---- the option table ------------------------------------------------------ */

typedef enum {
    TK_VERB_PLAN = 1u << 0,
    TK_VERB_TRAIN = 1u << 1,
    TK_VERB_ADVISE = 1u << 2,
    TK_VERB_FIX = 1u << 3,
    TK_VERB_PREDICT = 1u << 4,
    TK_VERB_DATA = 1u << 5,
    TK_VERB_MEM = 1u << 6,
    TK_VERB_DEVICE = 1u << 7,
    TK_VERB_VOCAB = 1u << 8,
} tk_verb;

typedef enum {
    TK_DOOR_SHELL = 1u << 0,     /* txk VERB ... */
    TK_DOOR_CELL = 1u << 1,      /* %txVERB / %%txVERB in txkernel or the companion */
    TK_DOOR_COMPANION = 1u << 2, /* the companion's own flags (python/txkernel/), handled in Python */
} tk_door;

/* One use of a flag: the verbs that take it through these doors. */
typedef struct tk_option_use {
    unsigned verbs, doors;
} tk_option_use;

typedef struct tk_option {
    const char *name;    /* "--gpu", "-o" */
    const char *metavar; /* the value's name ("PROFILE"); NULL: the flag takes no value */
    unsigned bare_doors; /* doors where it takes no value although metavar is set (%%txadvise --from-error:
                            the cell body is the message) */
    const char *help;
    tk_option_use use[4]; /* {0, 0} ends */
} tk_option;
/* In bare_doors: the value may be left out (--record [N|off]): the next
 * word is it unless that word is a flag or a key=value. */
#define TK_OPTION_VALUE_OPTIONAL (1u << 8)

/* The whole table (borrowed, static) and its length. */
const tk_option *tk_app_options(int *n);
/* The entry for `name`, or NULL. */
const tk_option *tk_app_option_find(const char *name);
/* 1 when `name` is taken by `verb` through `door`. */
int tk_app_option_takes(const tk_option *o, tk_verb verb, tk_door door);
/* 1 when the flag reads the next word as its value through `door`. */
int tk_app_option_valued(const tk_option *o, tk_door door);
/* A verb's name ("plan") and the verb a name is (0: none). */
const char *tk_app_verb_name(tk_verb verb);
tk_verb tk_app_verb_find(const char *name);
/* The table as JSON for the companion and the reference pages: [{name,
 * metavar, bare_in: [door...], optional, help, uses: [{verbs: [...], doors:
 * [...]}]}].
 * New reference. */
json_t *tk_app_options_json(void);
/* "[--gpu PROFILE] [--gpus PLATFORM] ..." for a verb through a door (new
 * string, NULL when out of host memory). */
char *tk_app_usage_flags(tk_verb verb, tk_door door);

/* The words of one request: key=value overrides, flags with their values,
 * and plain words (a config path, a fix number), in order. */
#define TK_APP_MAX_WORDS 64
typedef struct tk_app_args {
    int n_kv, n_flags, n_plain;
    const char *kv[TK_APP_MAX_WORDS];          /* "key=value", borrowed */
    const tk_option *flag[TK_APP_MAX_WORDS];   /* in the order given */
    const char *value[TK_APP_MAX_WORDS];       /* the flag's value, NULL for a bare flag */
    const char *plain[TK_APP_MAX_WORDS];
} tk_app_args;

/* Reads argv as `verb` through `door` takes it: each flag must be in the
 * table for that verb and door (else TK_EINVAL naming the flag and the
 * verb's flags), a valued flag takes the next word (TK_EINVAL when there is
 * none; an optional value is left out when there is none or it is a flag or
 * key=value: the flag is then bare, its value NULL); a word with '=' that is not a flag's value is a key=value override;
 * anything else is plain. `who` names the front door in errors ("txk plan",
 * "%txadvise"). */
tk_status tk_app_args_parse(tk_verb verb, tk_door door, const char *who, char **argv, int argc, tk_app_args *out,
                            tk_err *err);
/* The last value given for `name`, or NULL (also NULL for a bare flag). */
const char *tk_app_arg(const tk_app_args *a, const char *name);
/* 1 when `name` was given. */
int tk_app_has(const tk_app_args *a, const char *name);
/* Applies the key=value overrides to *c in order; TK_OK or the key's error. */
tk_status tk_app_args_apply(const tk_app_args *a, tk_config *c, tk_err *err);

/* A YAML config file read over *c (its defaults, or a base): --file and
 * `txk VERB cfg.yaml` read it the same way. TK_EIO naming the file when it
 * cannot be read; the parser's error (file, line, key) otherwise. */
tk_status tk_app_config_file(tk_config *c, const char *path, tk_err *err);
/* The config of a request that names a file (`txk VERB cfg.yaml`, `txk
 * predict cfg.yaml`): the defaults, the file, a's key=value words, then
 * validated (an error there names the file). TK_OK or the error. */
tk_status tk_app_config_load(tk_config *c, const char *path, const tk_app_args *a, tk_err *err);

/* ---- the run resolved once ------------------------------------------------- */

/* Where a request is made: the device a run has (or would get) and what the
 * user said about the card beyond the config. */
typedef struct tk_run_where {
    int device_known;      /* 1: `device` below is the device the run has or gets; 0: not opened, probe it */
    tk_dev_kind device;    /* meta, cpu or cuda */
    size_t device_total;   /* that device's total bytes (cuda: the card's) */
    const char *platform;  /* a platform the user planned on (%txplan --gpus P) or named (--for P); NULL */
} tk_run_where;

typedef struct tk_run_spec {
    tk_dev_kind device;          /* where the run trains (device: auto resolved) */
    char device_why[96];
    char card[32];               /* the GPU profile planned for: gpu:, else the platform's smallest card; "" */
    char card_why[160];
    char platform[16];           /* "colab", "kaggle", ...; "" when none */
    size_t capacity;             /* usable bytes the plan fits against; 0: no limit known */
    char capacity_why[96];
    tk_attention attention;      /* standard or fused, as tk_config_attention decides it */
    const char *attention_why;   /* static */
    int world_size;
    int labels;                  /* num_labels (0: from the data) */
    tk_api api;                  /* as given (TK_API_AUTO: the advisor picks by engine) */
} tk_run_spec;

/* What device: auto finds here without training: cuda when the NVIDIA
 * driver's device node is present and the cuda plugin opens a device (its
 * total in *total), else the cpu. device: cpu/cuda/meta are taken as set. */
tk_dev_kind tk_app_device_probe(const tk_config *c, size_t *total);
/* Resolves c (validated) where it is asked. TK_OK, or TK_EINVAL when the
 * platform is unknown. */
tk_status tk_run_spec_resolve(const tk_config *c, const tk_run_where *w, tk_run_spec *out, tk_err *err);
/* The config as the spec resolved it: attention: auto replaced by the
 * spec's, the platform's card set as gpu: when the config named none, and
 * a cuda device's total as capacity: when nothing else gives one. */
tk_status tk_run_spec_apply(const tk_run_spec *s, tk_config *c, tk_err *err);
/* A fixed config planned from `resolved` (the config after
 * tk_run_spec_apply) brought back to the config as the user gave it
 * (`given`): what no fix changed (attention, gpu, capacity) goes back to
 * the user's own setting, so a fix's diff and its YAML hold the fix only. */
void tk_run_spec_unapply(tk_config *fixed, const tk_config *resolved, const tk_config *given);
/* The spec as JSON {device, device_why, card, card_why, platform, capacity,
 * capacity_why, attention, attention_why, world_size, labels, api}: the same
 * object in every verb's --json. New reference. */
json_t *tk_run_spec_json(const tk_run_spec *s);
/* One line a person reads: "for t4, the smallest card colab hands out (...)". */
void tk_run_spec_card_line(const tk_run_spec *s, char *buf, size_t n);

/* ---- the plan verb ----------------------------------------------------------- */

struct tk_session; /* tk_session.h */
typedef struct tk_plan_request {
    tk_config config;      /* the file or the cell, then key=value (validated here, after --gpu) */
    const char *gpu;       /* --gpu PROFILE, or NULL */
    const char *gpus;      /* --gpus PLATFORM: each card the platform hands out, or NULL */
    int max_batch, sweep, measure, epoch;
    const char *snapshot;  /* --snapshot FILE, or NULL */
    int new_config;        /* a new config (a cell body, a file): the session forgets the platform it planned on */
} tk_plan_request;

typedef struct tk_plan_reply {
    json_t *bundle;        /* new reference: text/plain, text/html, ..., application/json */
    int fits;              /* 0: the plan does not fit (txk exits 3); 1 for the tables */
    const char *ename;     /* on error: UsageError, ConfigError, DataError, PlanError, SnapshotError */
    char said[1200];       /* the --snapshot sentence; "" without one */
} tk_plan_reply;

/* The plan verb for both front doors: the session's plan and config (and
 * platform, for --gpus) are set as %txadvise reads them. TK_OK with
 * out->bundle, or the error (out->ename says which kind). */
tk_status tk_app_plan(struct tk_session *s, const tk_plan_request *rq, tk_plan_reply *out, tk_err *err);
/* --gpus PLATFORM's value checked (NULL is fine): TK_EINVAL naming the
 * accepted platforms. A cell checks it before it reads its config, so a bad
 * flag is named even when that config would fail. */
tk_status tk_app_check_platform(const char *gpus, tk_err *err);

struct tk_run_report; /* tk_session.h */
/* The plan a run stopped at (TK_RUN_PLANNED_OOM), as `txk train` and
 * %%txtrain both show it: the plan against what was free, the head note,
 * the largest tensors at the peak. New reference. */
json_t *tk_app_planned_oom_report(struct tk_session *s, const tk_config *c, const struct tk_run_report *r);

/* Largest batch size per sequence length (64..512) that fits the config's
 * capacity, found by bisection over plans on meta. A table bundle. */
tk_status tk_max_batch_report(const tk_config *c, json_t **bundle, tk_err *err);
/* The planned peak, and its categories at the peak, of config c with each
 * memory-saving technique and a few combinations (recompute layers/attention,
 * fused attention, fp16, bf16, 8-bit AdamW, frozen embeddings, accumulate x4
 * at a quarter of the batch, ...): a table bundle; application/json is one
 * row per technique with peak_reserved, peak_allocated, at_peak per
 * category, optim_bytes, grad_bytes, n_params. measure: also run each row
 * for two optimizer steps (+ one eval batch) of synthetic data on a fresh
 * cpu device: measured peaks, whether they equal the plan, and ms per step
 * (rows gain measured_peak_allocated/_reserved, measured_equals_plan,
 * ms_per_step). */
tk_status tk_sweep_report(const tk_config *c, int measure, json_t **bundle, tk_err *err);
/* Config c planned on each card a platform ("colab", "kaggle", "all") hands
 * out, each as `gpu: CARD` without `capacity:` plans it: a table (card,
 * capacity, budget, planned peak, fits, margin, predicted step) and one
 * sentence; application/json is {platform, cards: [{card, long_name,
 * capacity, budget, peak_reserved, fits, margin, step_seconds}], sentence}. */
tk_status tk_gpus_report(const tk_config *c, const char *platform, json_t **bundle, tk_err *err);

/* ---- --snapshot on plan and train, the same in a shell and a cell ---------- */

struct tk_plan_watch; /* tk_plan.h */
/* The allocator history kept for --snapshot: the last this many events
 * (32 bytes each, 32 MiB at most), as PyTorch's max_entries bounds its own. */
#define TK_APP_SNAPSHOT_EVENTS ((size_t)1 << 20)
/* plan --snapshot FILE: the planned step's meta allocator recorded and
 * written as a PyTorch snapshot when the plan closes it. */
typedef struct tk_plan_snapshot {
    const char *path;
    int rc, oom;
    size_t reserved, allocated, peak;
    tk_err err;
} tk_plan_snapshot;
/* Fills *w so that a plan given it records and writes ps->path. */
void tk_plan_snapshot_watch(tk_plan_snapshot *ps, struct tk_plan_watch *w);
/* The sentence a front door prints after the plan: where it was written and
 * what it holds (exact bytes), or the error. 0, or -1 when writing failed
 * (the sentence is the error). */
int tk_plan_snapshot_said(const tk_plan_snapshot *ps, char *buf, size_t n);
/* train --snapshot FILE: the run's device allocator as a PyTorch snapshot
 * (with the OOM event when the run ran out); *said gets the sentence. */
tk_status tk_run_snapshot_write(tk_dev *d, const tk_oom *oom, const char *path, char *said, size_t n, tk_err *err);

/* ---- the one rank launcher (app/ranks.c) ----------------------------------- */

/* world_size N on the cpu, from a shell or a cell: the run as N `txk train`
 * MPI ranks under mpirun, waited for. */
typedef struct {
    const _Atomic int *cancel;                     /* seen set: the ranks are asked once to stop (SIGUSR1) */
    void (*on_note)(void *ud, const char *line);   /* the launch line, once mpirun started */
    void (*on_output)(void *ud, const char *text); /* the ranks' output as it comes; NULL: inherited */
    void *ud;
} tk_ranks_io;
typedef struct {
    int world;
    int code;  /* mpirun's exit status; 128 + signal when killed */
    int asked; /* a stop was asked (the cancel flag) */
    char txk[4096];
} tk_ranks_result;
/* Starts c's world size ranks of txk (this program when it is txk, else
 * $TXK_BIN, the txk beside this executable, or PATH's). args (nargs of them)
 * follow `txk train`: a shell passes its own; NULL writes c as a temporary
 * YAML file (removed after) and passes it, with --no-plan when ignore_plan.
 * TK_OK once mpirun ended (r->code says how); an error when it could not
 * start (err says what to install when mpirun is missing). */
tk_status tk_app_ranks(const tk_config *c, char *const args[], int nargs, int ignore_plan, const tk_ranks_io *io,
                       tk_ranks_result *r, tk_err *err);

/* ---- the train verb (app/train.c) ------------------------------------------ */

struct tk_run_hooks;
struct tk_run_report; /* tk_session.h */
typedef struct {
    const tk_config *config;
    const char *snapshot;     /* --snapshot FILE, or NULL */
    char *const *rank_args;   /* world_size > 1 on the cpu: what follows `txk train` for the ranks (a shell's */
    int n_rank_args;          /* own arguments); NULL: the config, written as YAML */
    const tk_ranks_io *ranks; /* the ranks' output and interrupt */
} tk_app_train_request;
typedef struct {
    int launched;             /* 1: the run went to MPI ranks; ranks says how it ended, the run report is empty */
    tk_ranks_result ranks;
    json_t *bundle;           /* owned: the plan (kind "plan", it did not fit) or the epochs ("epochs"); or NULL */
    const char *kind;
    const char *ename;        /* on an error: its class (UsageError, DeviceError, DataError, SaveError, RunError...) */
    int snapshot_rc;          /* --snapshot: 0 written, -1 failed (said is the error); 1: none written */
    char said[1400];
} tk_app_train_result;
/* Trains rq->config in session s with hooks h (h->ignore_plan: --no-plan),
 * or starts its ranks. TK_OK when it ran, whatever the run's end (run->end);
 * otherwise err and out->ename say why. Clear *run (tk_run_report_clear)
 * and free out->bundle after, either way. */
tk_status tk_app_train(struct tk_session *s, const tk_app_train_request *rq, const struct tk_run_hooks *h,
                       struct tk_run_report *run, tk_app_train_result *out, tk_err *err);

/* ---- the data verb (app/data.c) ------------------------------------------- */

/* The corpus report of %txdata / `txk data`: a CSV/TSV/JSONL column (and an
 * optional pair column), or a SQuAD .json file's question + context pairs. */
typedef struct tk_data_report_opts {
    const char *path, *text_col, *pair_col, *model, *vocab;
    int max_len, batch_size, buckets; /* 0 = 512, 32, 8 */
} tk_data_report_opts;
/* On success *bundle holds text/plain, text/html, image/svg+xml, Vega-Lite and
 * application/json; *lengths (may be NULL) gets a new array of n token
 * lengths capped at max_len. */
tk_status tk_data_report(const tk_data_report_opts *o, json_t **bundle, int **lengths, int *n,
                         tk_err *err);

/* Learns a WordPiece vocabulary of at most `size` tokens from column
 * text_col (NULL = "text") of a CSV/TSV/JSONL file into out_path; says how
 * many texts were read and how many tokens the vocabulary has. */
tk_status tk_vocab_from_file(const char *path, const char *text_col, int size, int lowercase,
                             const char *out_path, int *n_texts, int *n_tokens, tk_err *err);

/* `txk data FILE` and `%txdata FILE` (a: the request's parsed words, one
 * plain word, the file): the corpus report with the table's --text, --pair,
 * --model, --vocab, --max-len, --batch; what they leave out is last's (a
 * cell's session config; NULL: the defaults). *lengths (may be NULL) as
 * tk_data_report. TK_EINVAL with no file or two; the report's error. */
tk_status tk_app_data(const tk_app_args *a, const tk_config *last, json_t **bundle, int **lengths, int *n,
                      tk_err *err);

/* ---- the advise verb (app/advise.c) ------------------------------------------ */

/* How a pasted message's report is written. */
typedef struct tk_oom_report_opts {
    const char *platform;   /* --for: "colab", "kaggle", "colab-2020"; NULL: what the message's paths show */
    tk_api api;             /* --api; TK_API_AUTO: the config's api, else the traceback's Trainer, else the
                               config's engine (loop for pytorch, txkernel's YAML), else a loop */
    const char *cli_config; /* the config's path when txk prints it (its closing lines name txk's commands);
                               NULL: a notebook's (they name the magics) */
    struct tk_traced_model *traced; /* the companion's traced model (app/traced.c): the config and its
                               candidates are its own step, traced; NULL: the engine the config names */
    const struct tk_advise_torch *torch_live; /* the companion's live torch state; NULL: absent */
    const struct tk_advise_run *last_run;     /* the session's last run; NULL: absent */
} tk_oom_report_opts;

/* A pasted OOM message (any text holding one) read and diagnosed; with a
 * config (c may be NULL), the config is also planned on each of the
 * platform's cards and advised on the card the message names. The bundle's
 * application/json is tk_oom_message_json's object. TK_EFORMAT with
 * "no OOM message found" when the text holds none. opts may be NULL. */
tk_status tk_oom_message_report(const char *text, size_t len, const tk_config *c, const int32_t *lengths,
                                int n_lengths, const tk_oom_report_opts *opts, json_t **bundle, tk_err *err);

/* One advise request, from `txk advise` or `%txadvise` / `%%txadvise`. */
typedef struct tk_advise_request {
    tk_config config;            /* the config as given: a file, the session's or a cell's, then key=value */
    int have_config;             /* --from-error: 0 when there is none (the message alone) */
    int from_session;            /* the config is the session's last (the line form): its run's OOM record counts */
    const char *cli_config;      /* the config's path when txk prints the advice (the text names txk's commands,
                                    --fix rewrites the file); NULL in a cell (the text names the magics) */
    tk_door door;
    const char *gpu;             /* --gpu PROFILE, or NULL */
    const char *platform;        /* --for PLATFORM, or NULL */
    tk_api api;                  /* --api; TK_API_AUTO when not given */
    int top;                     /* --top (12) */
    double margin;               /* --margin (0.05) */
    const char *fix, *out;       /* txk advise --fix N|auto [-o FILE], or NULL */
    int from_error;              /* --from-error given */
    const char *from_error_path; /* its file (- for standard input) in a shell; NULL in a cell (the body) */
    const char *data;            /* --data FILE (a shell's --from-error), or NULL */
} tk_advise_request;

/* An advise request's flags read from its words (a: parsed by the option
 * table for TK_VERB_ADVISE through `door`) and checked: --gpu, --for,
 * --api, --top, --margin, --fix, -o, --from-error, --data. Sets every field
 * but config, have_config, from_session and cli_config, which are the
 * door's. TK_EINVAL naming the flag. */
tk_status tk_app_advise_flags(const tk_app_args *a, tk_door door, tk_advise_request *rq, tk_err *err);

typedef struct tk_advise_reply {
    json_t *bundle;    /* new reference: the advice (text, HTML, application/json with the run spec as "run") */
    char *yaml;        /* --fix without -o: the fixed config file (new string; txk prints it); NULL */
    int no_fix;        /* --fix auto found no candidate (txk exits 3): said says so */
    int fix_failed;    /* the fixed config could not be read or written: said says why */
    const char *ename; /* on error: UsageError, ConfigError, DataError, AdviseError or MemoryError */
    char said[1400];   /* the sentence after the advice: the file --fix -o wrote, or why none; "" */
} tk_advise_reply;

/* Diagnoses and ranked fixes of rq's config, advised for its card, else the
 * smallest card of --for or of the platform the session planned on (said in
 * the first line); the session's device, OOM record (from_session), corpus
 * lengths and timeline are read. The config, its plan and the advice become
 * the session's (for %txfix). With --fix the candidate is picked and the
 * config file rewritten with it. TK_OK with out->bundle, or the error
 * (out->ename says which kind). */
tk_status tk_app_advise(struct tk_session *s, const tk_advise_request *rq, tk_advise_reply *out, tk_err *err);

/* --from-error: the pasted message (text, len; NULL text: read
 * rq->from_error_path, - for standard input) diagnosed with rq's --for and
 * --api; with a config (rq->have_config, and --data in a shell), the config
 * is planned on the message's card. A shell reads the config's corpus
 * untruncated; a cell uses the session's lengths. TK_EFORMAT "no OOM
 * message found" when the text holds none; *ename names any other error. */
tk_status tk_app_advise_error(struct tk_session *s, const tk_advise_request *rq, const char *text, size_t len,
                              json_t **bundle, const char **ename, tk_err *err);

/* What %txfix did. */
typedef struct tk_fix_reply {
    json_t *bundle;     /* a config fix: the diff, the new plan, the YAML, the code (new reference); NULL for a
                           release */
    char said[1600];    /* the lines shown before it (a release's, why --run does not train); "" */
    tk_config after;    /* the session's config now */
    size_t predicted;   /* the candidate's planned peak */
    int run;            /* --run, and the fixed config can train here: the door trains it, then
                           tk_app_fix_measured */
    const char *ename;  /* on error: UsageError or NoFixError */
} tk_fix_reply;
/* `%txfix N|auto|LABEL [--for P] [--run]` (w: its words parsed for
 * TK_VERB_FIX): the candidate of the session's last advice applied to the
 * session's config, or the memory it names released. TK_EINVAL with
 * out->ename when the words name none. */
tk_status tk_app_fix(struct tk_session *s, const tk_app_args *w, tk_fix_reply *out, tk_err *err);
/* After %txfix --run: the run's measured peaks against the plan's (and the
 * advice's `predicted`). New string; NULL with no run. */
char *tk_app_fix_measured(const struct tk_session *s, size_t predicted);

/* ---- the predict verb (app/predict.c) -------------------------------------- */

typedef struct tk_predict_reply {
    json_t *bundle;     /* new reference: the predictions (text, HTML, application/json); NULL when none ran */
    int planned_oom;    /* the prediction's plan did not fit: nothing ran (txk exits 3); said says so */
    int write_failed;   /* -o: the predictions are in the bundle, the file was not written; said is why */
    const char *ename;  /* on an error (or write_failed): UsageError, ModelError, ConfigError, PredictError,
                           DataError, IOError, MemoryError */
    char said[1400];    /* what -o wrote, the planned OOM, or why the file was not written; "" */
} tk_predict_reply;
/* `txk predict MODEL ...` and `%txpredict [MODEL] ...` / `%%txpredict`
 * (w: the words parsed for TK_VERB_PREDICT; texts: a %%txpredict body, one
 * text per line, instead of --input; else NULL): the model word (a trained
 * folder, a hub id, or a config whose output_dir holds one; none: the
 * session's last config) over --input with the table's --text, --pair,
 * --label, --rows, --id, -o and key=value. TK_OK when it ran or its plan did
 * not fit (out says which); otherwise the error (out->ename). */
tk_status tk_app_predict(struct tk_session *s, const tk_app_args *w, const char *texts, tk_predict_reply *out,
                         tk_err *err);

/* ---- the mem verb (app/mem.c) --------------------------------------------- */

typedef struct tk_mem_reply {
    json_t *bundle;     /* new reference: the memory report or the snapshot's; NULL after --record */
    json_t *timeline;   /* --timeline (a cell): the last run's memory per step, or NULL */
    int failed;         /* --save could not write: said is why (out->ename) */
    const char *ename;  /* on an error (or failed): UsageError, ConfigError, DeviceError, SnapshotError,
                           MemoryError, IOError */
    char said[1200];    /* what --record or --save did; "" */
} tk_mem_reply;
/* `txk mem` and `%txmem` (w: the words parsed for TK_VERB_MEM): --snapshot
 * FILE read and diagnosed (the same in both doors, with --gpu/--capacity,
 * --model, --data, --text, --batch, --seq, --top); otherwise a shell's fresh
 * device of --device/--capacity with its memory (application/json {device,
 * memory}), a cell's session device by --by/--top (--timeline, --save), or
 * --record [N|off]. TK_OK, or the error (out->ename). */
tk_status tk_app_mem(struct tk_session *s, const tk_app_args *w, tk_door door, tk_mem_reply *out, tk_err *err);

/* ---- the device report (app/device.c) ------------------------------------- */

/* The device: kind, name, capacity, free, other processes (NVML when the
 * driver has it), driver/CUDA versions; on cpu and meta the capacity is said
 * to be simulated. `d` may be NULL (no device opened yet: describes what a
 * run would get from config c). */
json_t *tk_device_report(tk_dev *d, const tk_config *c);
/* `%txdevice`: the session's device (or none yet) reported with its config,
 * the process's RSS and what PyTorch's allocator holds. New reference. */
struct tk_session;
json_t *tk_app_device(struct tk_session *s);

#endif
