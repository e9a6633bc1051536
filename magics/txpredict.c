/* txpredict.c — %txpredict / %%txpredict: using a trained model in the
 * notebook. The same engine as `txk predict` (tk_session_predict) and the
 * same report (tk_report_predict).
 *
 * Guarantees: the model is planned before anything is allocated and
 * released afterwards (memory returns to the session baseline); the
 * texts of a %%txpredict body go through a temporary CSV that is removed
 * whatever happens.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tk_magics.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_txmagics.h"

#define TXPREDICT_USAGE                                                                                     \
    "%txpredict [MODEL_DIR|ORG/NAME] --input FILE [--text COL] [--pair COL] [--label COL] [--rows N] [--json]\n"       \
    "%%txpredict [MODEL_DIR|ORG/NAME] [--rows N] [--json]\n<one text per line>"

/* The body's lines as a one-column CSV (quotes doubled); path in `path`. */
static int body_to_csv(const char *body, char *path, size_t n) {
    snprintf(path, n, "/tmp/txpredict-XXXXXX.csv");
    int fd = mkstemps(path, 4);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(path);
        return -1;
    }
    int rows = 0;
    fputs("text\n", f);
    for (const char *p = body; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len && p[len - 1] == '\r') len--;
        int blank = 1;
        for (size_t i = 0; i < len; i++) blank &= p[i] == ' ' || p[i] == '\t';
        if (!blank) {
            fputc('"', f);
            for (size_t i = 0; i < len; i++) {
                if (p[i] == '"') fputc('"', f);
                fputc(p[i], f);
            }
            fputs("\"\n", f);
            rows++;
        }
        p = e ? e + 1 : p + len;
    }
    if (fclose(f) != 0 || rows == 0) {
        unlink(path);
        return rows == 0 ? -2 : -1;
    }
    return 0;
}

static int run_txpredict(tk_magic_ctx *m) {
    tk_session *s = m->session;
    char **argv = NULL;
    int argc = 0, json_only = 0, rows = 10, rc = 0;
    if (tk_txargs_split(m->args, &argv, &argc)) return tk_magic_error(m, "UsageError", "unbalanced quotes");
    const char *folder = NULL, *input = NULL, *text = NULL, *pair = NULL, *label = NULL;
    for (int i = 0; i < argc && !rc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) json_only = 1;
        else if (!strcmp(a, "--input") && v) { input = v; i++; }
        else if (!strcmp(a, "--text") && v) { text = v; i++; }
        else if (!strcmp(a, "--pair") && v) { pair = v; i++; }
        else if (!strcmp(a, "--label") && v) { label = v; i++; }
        else if (!strcmp(a, "--rows") && v) { rows = atoi(v); i++; }
        else if (a[0] != '-' && !folder) folder = a;
        else rc = tk_magic_error(m, "UsageError", "%%txpredict: unexpected '%s'\nusage: %s", a, TXPREDICT_USAGE);
    }
    char tmp[64] = "";
    tk_config c;
    tk_err err = {0};
    const tk_config *last = tk_session_config(s);
    if (!rc && m->is_cell) {
        if (input) rc = tk_magic_error(m, "UsageError", "%%%%txpredict takes its texts from the cell, not --input");
        else if ((rc = body_to_csv(m->body, tmp, sizeof tmp)) != 0)
            rc = tk_magic_error(m, "UsageError", rc == -2 ? "%%%%txpredict: the cell has no text (one per line)"
                                                          : "%%%%txpredict: cannot write a temporary file in /tmp");
        input = tmp;
    } else if (!rc && !input) {
        rc = tk_magic_error(m, "UsageError", "%%txpredict: which file? (--input FILE)\nusage: %s", TXPREDICT_USAGE);
    }
    if (!rc && !folder && !last)
        rc = tk_magic_error(m, "UsageError", "%%txpredict: which model? Give MODEL_DIR, or train one with "
                                             "%%%%txtrain (its output_dir) first");
    if (!rc) {
        if (!folder) c = *last;
        if (tk_session_predict_config(folder, &c, &err) != TK_OK) rc = tk_magic_error(m, "ModelError", "%s", err.msg);
    }
    if (!rc) {
        snprintf(c.train_file, sizeof c.train_file, "%s", input);
        if (tmp[0]) {
            snprintf(c.text_col, sizeof c.text_col, "text");
            c.text_pair_col[0] = 0;
        }
        const char *cols[3][2] = {{"text_col", text}, {"text_pair_col", pair}, {"label_col", label}};
        for (int k = 0; k < 3 && !rc; k++)
            if (cols[k][1] && tk_config_set(&c, cols[k][0], cols[k][1], &err) != TK_OK)
                rc = tk_magic_error(m, "UsageError", "%s", err.msg);
    }
    if (!rc) {
        tk_predict_report r;
        if (tk_session_predict(s, &c, &r, &err) != TK_OK) {
            rc = tk_magic_error(m, "PredictError", "%s", err.msg);
        } else if (r.planned_oom) {
            char b1[32], b2[32];
            rc = tk_magic_error(m, "PlannedOOM",
                                "the prediction plan needs %s but %s is free: stopped before allocating anything "
                                "(set eval_batch_size smaller)",
                                tk_format_bytes(r.plan.peak_reserved, b1, sizeof b1),
                                tk_format_bytes(r.free_before, b2, sizeof b2));
        } else {
            json_t *b = tk_report_predict(&r, rows > 0 ? rows : 0);
            tk_txemit(m, b, json_only);
            json_decref(b);
        }
        tk_predict_report_clear(&r);
    }
    if (tmp[0]) unlink(tmp);
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
