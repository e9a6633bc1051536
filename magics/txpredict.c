/* txpredict.c — %txpredict / %%txpredict: using a trained model in the
 * notebook. The same engine as `txk predict` (tk_session_predict) and the
 * same report (tk_report_predict).
 *
 * The cell's syntax only: the words are read by the option table and the
 * predictions are app/predict.c's tk_app_predict, which `txk predict` calls.
 *
 * Guarantees: the model is planned before anything is allocated and
 * released afterwards (memory returns to the session baseline); the
 * texts of a %%txpredict body go through a temporary CSV that is removed
 * whatever happens.
 */
#include "tk_app.h"
#include "tk_magics.h"
#include "tk_session.h"
#include "tk_txmagics.h"

#define TXPREDICT_USAGE                                                                                     \
    "%txpredict [MODEL_DIR|ORG/NAME|cfg.yaml] [key=value ...] {flags}\n"                                     \
    "%%txpredict [MODEL_DIR|ORG/NAME|cfg.yaml] [key=value ...] {flags} (not --input)\n<one text per line>"

static int run_txpredict(tk_magic_ctx *m) {
    char **argv = NULL;
    int argc = 0, rc = 0;
    tk_app_args a;
    if (tk_txargs_parse(m, TK_VERB_PREDICT, &argv, &argc, &a)) return -1;
    tk_predict_reply r;
    tk_err err = {0};
    if (tk_app_predict(m->session, &a, m->is_cell ? (m->body ? m->body : "") : NULL, &r, &err) != TK_OK)
        rc = tk_magic_error(m, r.ename, "%s", err.msg);
    else if (r.planned_oom)
        rc = tk_magic_error(m, "PlannedOOM", "%s", r.said);
    if (!rc) tk_txemit(m, r.bundle, tk_app_has(&a, "--json"));
    if (!rc && r.write_failed) rc = tk_magic_error(m, r.ename, "%s", r.said);
    else if (!rc && r.said[0]) tk_magic_printf(m, "stdout", "%s\n", r.said);
    json_decref(r.bundle);
    tk_txargs_free(argv, argc);
    return rc;
}

static const tk_magic_def TXPREDICT[] = {
    {"txpredict", TK_MAGIC_BOTH, run_txpredict, "labels and probabilities (answers for QA) of a trained model",
     TXPREDICT_USAGE "\n\n"
     "Runs a trained model (MODEL_DIR; a hub id ORG/NAME, from the HF cache or downloaded\n"
     "into it; or the output_dir of the session's last config)\n"
     "over a CSV/TSV/JSONL file (SQuAD JSON for a QA model), or over the lines of a\n"
     "%%txpredict cell. Per example: the label (names from the model's id2label) and\n"
     "every class probability, or the answer text and its character span. With a\n"
     "label column: accuracy, macro F1 and the confusion matrix; with SQuAD answers:\n"
     "exact match and F1 (the official v1.1 definitions). Planned first, like a run:\n"
     "the weights and one eval batch (eval_batch_size)."},
};

int tk_magics_register_txpredict(tk_magics *m) { return tk_magics_add_table(m, TXPREDICT, 1); }
