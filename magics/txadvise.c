/* txadvise.c — `%txadvise`: why the session's config does not fit (or just
 * ran out of memory) and a ranked list of fixes, each planned; `%%txadvise
 * --from-error`: a pasted OOM message read; `%txfix`: take one of the fixes
 * (or the best that keeps the effective batch), make it the session's
 * config, show what changed, and with --run train it and compare the
 * measured peak with the predicted one.
 *
 * The cell's syntax only: the words are read by the option table and the
 * advice, the message's report and the fix are app/advise.c's (tk_app_advise,
 * tk_app_advise_error, tk_app_fix), the functions `txk advise` calls too.
 *
 * Guarantees: advising plans on private meta devices only; the session's
 * device is not touched. A fix is applied only to the session's config;
 * nothing trains without --run.
 */
#include <stdlib.h>
#include <string.h>

#include "tk_app.h"
#include "tk_magics.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_txmagics.h"

#define TXADVISE_USAGE "%txadvise [key=value ...] {flags}\n%%txadvise --from-error [--for P] [--api A] [--json] + the pasted message"
#define TXFIX_USAGE "%txfix N|auto|FIX-NAME {flags}"

/* %%txadvise --from-error [--for P] [--api A] [--json]: the cell body is the
 * pasted message; the session's last config, when there is one, is planned
 * on its card. */
static int txadvise_from_error(tk_magic_ctx *m, tk_advise_request *rq, int json) {
    if (!m->is_cell)
        return tk_magic_error(m, "UsageError", "--from-error reads the cell body: %%%%txadvise --from-error, then "
                                               "the pasted message on the next lines");
    const tk_config *last = tk_session_config(m->session);
    if ((rq->have_config = last != NULL)) rq->config = *last;
    const char *body = m->body ? m->body : "", *ename = NULL;
    json_t *b = NULL;
    tk_err err = {0};
    tk_status st = tk_app_advise_error(m->session, rq, body, strlen(body), &b, &ename, &err);
    if (st == TK_EFORMAT) b = tk_bundle_new("no OOM message found\n");
    else if (st != TK_OK) return tk_magic_error(m, ename, "%s", err.msg);
    tk_txemit(m, b, st == TK_OK && json);
    json_decref(b);
    return 0;
}

/* %txadvise [key=value ...] (the session's config) or %%txadvise (the
 * cell's): the advice shown, the session keeping it for %txfix. */
static int txadvise_plan(tk_magic_ctx *m, tk_advise_request *rq, int json) {
    const tk_config *last = tk_session_config(m->session);
    if (!last && !m->is_cell)
        return tk_magic_error(m, "UsageError",
                              "%%txadvise needs a config: run %%%%txtrain or %%txplan first, or give one as a "
                              "%%%%txadvise cell body (%%txhelp txadvise)");
    tk_config base;
    if (last && !m->is_cell) base = *last;
    else tk_config_defaults(&base);
    if (tk_txconfig_from_cell(m, &base, &rq->config, 1)) return -1;
    rq->from_session = !m->is_cell;
    tk_advise_reply r;
    tk_err err = {0};
    if (tk_app_advise(m->session, rq, &r, &err) != TK_OK) return tk_magic_error(m, r.ename, "%s", err.msg);
    tk_txemit(m, r.bundle, json);
    json_decref(r.bundle);
    free(r.yaml);
    return 0;
}

static int run_txadvise(tk_magic_ctx *m) {
    char **argv = NULL;
    int argc = 0, rc = 0;
    tk_app_args a;
    if (tk_txargs_parse(m, TK_VERB_ADVISE, &argv, &argc, &a)) return -1;
    tk_advise_request rq = {0};
    tk_err err = {0};
    if (tk_app_advise_flags(&a, TK_DOOR_CELL, &rq, &err) != TK_OK) rc = tk_magic_error(m, "UsageError", "%s", err.msg);
    else if (rq.from_error) rc = txadvise_from_error(m, &rq, tk_app_has(&a, "--json"));
    else rc = txadvise_plan(m, &rq, tk_app_has(&a, "--json"));
    tk_txargs_free(argv, argc);
    return rc;
}

/* ---- %txfix -------------------------------------------------------------------- */

static int run_txfix(tk_magic_ctx *m) {
    char **argv = NULL;
    int argc = 0, rc = 0;
    tk_app_args a;
    if (tk_txargs_parse(m, TK_VERB_FIX, &argv, &argc, &a)) return -1;
    tk_fix_reply r;
    tk_err err = {0};
    if (tk_app_fix(m->session, &a, &r, &err) != TK_OK) rc = tk_magic_error(m, r.ename, "%s", err.msg);
    if (!rc && r.said[0]) tk_magic_printf(m, "stdout", "%s", r.said);
    if (!rc && r.bundle) tk_txemit(m, r.bundle, tk_app_has(&a, "--json"));
    json_decref(r.bundle);
    tk_txargs_free(argv, argc);
    /* --run: train the fixed config and hold the plan to account */
    if (!rc && r.run && tk_txtrain_run_config(m, &r.after, 0, 0)) rc = -1;
    char *t = !rc && r.run ? tk_app_fix_measured(m->session, r.predicted) : NULL;
    if (t) tk_magic_printf(m, "stdout", "%s", t);
    free(t);
    return rc;
}

static const tk_magic_def TXADVISE[] = {
    {"txadvise", TK_MAGIC_BOTH, run_txadvise, "why a run does not fit, and fixes ranked by what they cost",
     TXADVISE_USAGE "\n%%txadvise [key=value ...]\n<YAML config>\n\n"
     "Diagnoses the session's last config (or the cell's): more than the card has, memory\n"
     "another run still holds, fragmentation, one layer or one category that dominates the\n"
     "peak, max_len far above what the corpus needs, a long batch that only sometimes comes,\n"
     "memory that grows step after step. Then plans candidate fixes on the meta device -\n"
     "single changes, pairs and triples: max_len from the corpus, a span head instead of a\n"
     "flatten Dense head, fp16/bf16, gradient accumulation, recompute, fused attention,\n"
     "8-bit AdamW, frozen embeddings, dynamic padding or length buckets, emptying the cache\n"
     "- and ranks them: fits with margin, removes a cause, fewer changes, results at risk,\n"
     "time per sample. --margin is the safety margin as a share of capacity (0.05).\n"
     "When the config fits some of the cards its platform hands out (Colab, Kaggle) but\n"
     "not its own, or fits one within 5%, it adds the card lottery. Pick one with %txfix.\n\n"
     "%%txadvise --from-error [--json]\n<the pasted OOM message or traceback>\n"
     "Reads PyTorch's OOM message (1.0-1.3 \"cached\", 1.4-2.0 \"reserved in total\", 2.1+)\n"
     "or TensorFlow's (\"OOM when allocating tensor with shape[...]\"): every figure in\n"
     "bytes, the card its total names, impossible figures left out, the diagnoses and the\n"
     "fixes as code. With a session config, that config is planned on each card of the\n"
     "platform and advised on the message's card."},
    {"txfix", TK_MAGIC_LINE, run_txfix, "apply a fix from %txadvise to the session's config (--run trains it)",
     TXFIX_USAGE "\n\n"
     "N: the candidate numbered N in the last %txadvise table. auto: the best candidate\n"
     "that fits with margin and keeps the effective batch (batch_size x accumulate).\n"
     "A label from the table (\"fp16 + accumulate 4\") or a fix name (max_len, head, ...)\n"
     "picks that row. Shows what changed and the new plan; the fixed config becomes the\n"
     "session's: %txtrain (the line form) trains it, %txplan plans it with overrides.\n"
     "--run trains it now and compares the measured peak with the planned one.\n"
     "auto --for colab|kaggle|colab-2020|all: the best candidate that also fits with a 5% margin on\n"
     "every card the platform hands out, so the card the runtime gets does not matter."},
};

int tk_magics_register_txadvise(tk_magics *m) { return tk_magics_add_table(m, TXADVISE, 2); }
