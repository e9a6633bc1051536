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
/* m's argument line split and read as `verb` takes it in a cell
 * (tk_app_args_parse, the door named "%txVERB" or "%%txVERB"): *a points
 * into *argv, which the caller frees with tk_txargs_free. 0, or -1 after a
 * UsageError naming the word (*argv is then NULL). */
int tk_txargs_parse(tk_magic_ctx *m, tk_verb verb, char ***argv, int *argc, tk_app_args *a);

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
/* tk_oom_message_report and the advise verb: app/tk_app.h. */
/* tk_device_report, tk_app_device: app/tk_app.h (the device report's). */

int tk_magics_register_txdata(tk_magics *m);

#endif
