/* tk_txmagics.h — what the txkernel magics (%%txtrain, %txplan, %txmem,
 * %txdata, %txdevice, %txreset) share with each other and with `txk`:
 * argument splitting, emitting a MIME bundle, and the report builders that
 * both a cell and a shell command print.
 *
 * Ownership: bundles are new references unless said otherwise; argv arrays
 * from tk_txargs_split are freed with tk_txargs_free.
 */
#ifndef TK_TXMAGICS_H
#define TK_TXMAGICS_H

#include <jansson.h>
#include "tk_config.h"
#include "tk_gpu.h"
#include "tk_advisor.h"
#include "tk_app.h"
#include "tk_magics.h"

/* Splits a magic's argument line like a shell: blanks separate words, single
 * and double quotes group (no expansion). 0, or -1 on unbalanced quotes/OOM. */
int tk_txargs_split(const char *s, char ***argv, int *argc);
void tk_txargs_free(char **argv, int argc);

/* Shows a bundle (borrowed) as display_data. json_only: only its
 * application/json part, with text/plain the same JSON indented (what --json
 * asks for). Otherwise the application/json part goes out as
 * application/vnd.txkernel.<what>+json (tk_bundle_for_notebook), so the
 * notebook renders the HTML; tk_txemit names it after the magic without its
 * "tx" ("plan" for %txplan, "data" for %txdata). */
void tk_txemit(tk_magic_ctx *m, json_t *bundle, int json_only);
void tk_txemit_as(tk_magic_ctx *m, json_t *bundle, int json_only, const char *what);
/* Sends bundle (borrowed) through m's sink as display_data (display_id NULL:
 * a new output; update: update_display_data of display_id) or, result != 0,
 * as execute_result, with its machine-readable part renamed as above. */
void tk_txshow(tk_magic_ctx *m, json_t *bundle, const char *what, const char *display_id, int update, int result);

/* A config from a cell: `base`, then the YAML body (if any), then the
 * `key=value` words of the magic line. skip_flags: words starting with "--"
 * are the caller's (and --gpu/--file take the next word). 0, or -1 after
 * reporting the error (line and key named) through the sink. */
int tk_txconfig_from_cell(tk_magic_ctx *m, const tk_config *base, tk_config *out, int skip_flags);

/* Runs a validated config the way %%txtrain does, through the one train
 * function (app/train.c tk_app_train): plan, train with live progress,
 * per-epoch table or OOM autopsy, reported through m's sink; world_size > 1
 * on the cpu as `txk train` MPI ranks (app/ranks.c), their output streamed
 * into the cell and an interrupt forwarded to every rank. ignore_plan:
 * train even when the plan does not fit. snap: --snapshot FILE (or NULL).
 * json_only: the epochs' JSON (or the plan's) instead of the rich bundles,
 * as `txk train --json` prints it. The run's report stays in the session
 * (tk_session_last_run). 0, or -1 after reporting an error. */
int tk_txtrain_run(tk_magic_ctx *m, const tk_config *c, int ignore_plan, const char *snap, int json_only);
/* tk_txtrain_run without a snapshot (%txfix's run). */
int tk_txtrain_run_config(tk_magic_ctx *m, const tk_config *c, int ignore_plan, int json_only);

/* tk_data_report, tk_vocab_from_file, tk_app_data: app/tk_app.h (the data verb's). */
/* tk_max_batch_report, tk_sweep_report, tk_gpus_report: app/tk_app.h (the plan verb's). */
/* How a pasted message's report is written. */
typedef struct tk_oom_report_opts {
    const char *platform;   /* --for: "colab", "kaggle", "colab-2020"; NULL: what the message's paths show */
    tk_api api;             /* --api; TK_API_AUTO: the config's api, else the traceback's Trainer, else the
                               config's engine (loop for pytorch, txkernel's YAML), else a loop */
    const char *cli_config; /* the config's path when txk prints it (its closing lines name txk's commands);
                               NULL: a notebook's (they name the magics) */
    tk_plan_fn plan_fn;     /* plans the config on the cards and its candidates (a traced model's planner,
                               app/traced.c); NULL: the engine the config names */
    void *plan_ctx;
    const char *plan_name;  /* who plan_fn is, for the report ("tracing clf (SentimentClassifier)") */
} tk_oom_report_opts;

/* A pasted OOM message (any text holding one) read and diagnosed; with a
 * config (c may be NULL), the config is also planned on each of the
 * platform's cards and advised on the card the message names. The bundle's
 * application/json is tk_oom_message_json's object. TK_EFORMAT with
 * "no OOM message found" when the text holds none. opts may be NULL. */
tk_status tk_oom_message_report(const char *text, size_t len, const tk_config *c, const int32_t *lengths,
                                int n_lengths, const tk_oom_report_opts *opts, json_t **bundle, tk_err *err);
/* tk_device_report, tk_app_device: app/tk_app.h (the device report's). */

#define TXDATA_USAGE "%txdata FILE [--text COL] [--pair COL] [--model M] [--vocab FILE] [--max-len N] [--batch N] [--json]"

int tk_magics_register_txdata(tk_magics *m);

#endif
