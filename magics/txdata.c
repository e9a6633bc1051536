/* txdata.c — `%txdata FILE`: the corpus report (token lengths, truncation,
 * padding waste) of app/data.c's tk_app_data, the function `txk data`
 * calls too; the flags are the option table's. Defaults (max_len, batch,
 * buckets, model) are the session's last config's; the lengths are kept
 * for %txplan's dynamic-padding worst case.
 */
#include <stdlib.h>

#include "tk_app.h"
#include "tk_magics.h"
#include "tk_session.h"
#include "tk_txmagics.h"

/* the words, not the file, were wrong */
#define USAGE_ERR(a) ((a).n_plain != 1 || (a).n_kv)

static int run_txdata(tk_magic_ctx *m) {
    char **argv = NULL;
    int argc = 0;
    tk_app_args a;
    if (tk_txargs_parse(m, TK_VERB_DATA, &argv, &argc, &a)) return -1;
    tk_err err = {0};
    json_t *bundle = NULL;
    int *len = NULL, n = 0, rc = 0;
    if (tk_app_data(&a, tk_session_config(m->session), &bundle, &len, &n, &err) != TK_OK) {
        char *u = USAGE_ERR(a) ? tk_app_usage_flags(TK_VERB_DATA, TK_DOOR_CELL) : NULL;
        rc = tk_magic_error(m, USAGE_ERR(a) ? "UsageError" : "DataError", "%s%s%s", err.msg,
                            USAGE_ERR(a) ? "\nusage: %txdata FILE " : "", u ? u : "");
        free(u);
    }
    if (!rc) {
        tk_session_set_lengths(m->session, len, n);
        tk_txemit(m, bundle, tk_app_has(&a, "--json"));
    }
    json_decref(bundle);
    free(len);
    tk_txargs_free(argv, argc);
    return rc;
}

static const tk_magic_def TXDATA[] = {
    {"txdata", TK_MAGIC_LINE, run_txdata, "token lengths, truncation and padding waste of a data file",
     "%txdata FILE {flags}\n\n"
     "Tokenizes the text column of a CSV/TSV/JSONL file and shows the token-length\n"
     "histogram, percentiles (p50/p90/p95/p99/max), the share of examples cut at\n"
     "max_len 64..512, and the padding waste of fixed, dynamic and bucketed batching\n"
     "at the given max_len and batch size (default: the last %txtrain config's).\n"
     "The lengths are kept for %txplan's dynamic-padding worst case."},
};

int tk_magics_register_txdata(tk_magics *m) { return tk_magics_add_table(m, TXDATA, 1); }
