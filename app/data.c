/* data.c — the data verb (issue 39): the corpus report behind `%txdata
 * FILE` and `txk data FILE` (token lengths, truncation at candidate
 * max_len, padding waste), moved from magics/txdata.c, and the one function
 * both doors call (tk_app_data). The file is read and tokenized by bert/'s
 * pipeline (tk_run_text_lengths), as a run reads it; this file only reports.
 * `txk vocab`'s WordPiece learner (tk_vocab_from_file) is here too.
 *
 * Guarantees: every failure names the file (and line/column where the data
 * module knows it) and frees what was built; a corpus report never touches
 * a device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tk_data.h"
#include "tk_host_mem.h"
#include "tk_pipeline.h"
#include "tk_render.h"
#include "tk_session.h"
#include "tk_app.h"

/* ---- the corpus report -------------------------------------------------------- */

tk_status tk_data_report(const tk_data_report_opts *o, json_t **bundle, int **lengths_out, int *n_out,
                         tk_err *err) {
    tk_rtable *tp = NULL, *tt = NULL, *tw = NULL;
    tk_status st;
    *bundle = NULL;
    tk_config c;
    tk_config_defaults(&c);
    if (o->model && *o->model) snprintf(c.model, sizeof c.model, "%s", o->model);
    if (o->vocab && *o->vocab) snprintf(c.vocab, sizeof c.vocab, "%s", o->vocab);
    /* the file read and tokenized as a run reads it: the pipeline's */
    tk_run_lengths rl;
    if ((st = tk_run_text_lengths(&c, o->path, o->text_col, o->pair_col, &rl, err)) != TK_OK) return st;
    const char *name = rl.name, *col = rl.column, *vnote = rl.vocab_note;
    const int32_t *len = rl.len;
    int nrows = rl.n;
    tk_length_stats ls;
    tk_length_stats_compute(len, nrows, &ls);
    int max_len = o->max_len > 0 ? o->max_len : 512;
    int batch = o->batch_size > 0 ? o->batch_size : 32;
    tk_padding_report pr[3];
    if ((st = tk_padding_waste(len, nrows, max_len, batch, o->buckets > 0 ? o->buckets : 8, 42, pr, err)) !=
        TK_OK)
        goto out;

    /* percentiles, truncation and padding tables */
    const char *hp[] = {"statistic", ">tokens"};
    tp = tk_rtable_new("Token lengths (with [CLS]/[SEP])", 2, hp);
    tk_rtable_rowf(tp, "examples\t%d", ls.n);
    tk_rtable_rowf(tp, "mean\t%.1f", ls.mean);
    tk_rtable_rowf(tp, "min\t%d", ls.min);
    tk_rtable_rowf(tp, "p50\t%d", ls.p50);
    tk_rtable_rowf(tp, "p90\t%d", ls.p90);
    tk_rtable_rowf(tp, "p95\t%d", ls.p95);
    tk_rtable_rowf(tp, "p99\t%d", ls.p99);
    tk_rtable_rowf(tp, "max\t%d", ls.max);
    const char *ht[] = {">max_len", ">% truncated"};
    tt = tk_rtable_new("Examples cut at each max_len", 2, ht);
    for (int k = 0; k < TK_LEN_CANDIDATES; k++) tk_rtable_rowf(tt, "%d\t%.2f", ls.cand[k], ls.pct_truncated[k]);
    const char *hw[] = {"batching", ">batches", ">longest batch", ">real tokens", ">padded tokens", ">% padding"};
    char title[128];
    snprintf(title, sizeof title, "Padding at max_len %d, batch %d", max_len, batch);
    tw = tk_rtable_new(title, 6, hw);
    static const char *const names[] = {"fixed", "dynamic", "buckets"};
    for (int k = 0; k < 3; k++)
        tk_rtable_rowf(tw, "%s\t%d\t%d\t%lld\t%lld\t%.1f", names[k], pr[k].num_batches, pr[k].max_T,
                       (long long)pr[k].real_tokens, (long long)pr[k].padded_tokens, 100 * pr[k].waste);
    if (!tp || !tt || !tw) {
        tk_err_set(err, TK_ENOMEM, "out of host memory");
        st = TK_ENOMEM;
        goto out;
    }
    char labels[TK_LEN_HIST_BINS][32];
    const char *lp[TK_LEN_HIST_BINS];
    double hv[TK_LEN_HIST_BINS];
    for (int k = 0; k < TK_LEN_HIST_BINS; k++) {
        snprintf(labels[k], sizeof labels[k], "%d-%d", ls.hist_edge[k], ls.hist_edge[k + 1] - 1);
        lp[k] = labels[k];
        hv[k] = ls.hist[k];
    }
    char htitle[480];
    snprintf(htitle, sizeof htitle, "Token lengths of %s (%s)", name, col);

    tk_sb text = {0}, html = {0};
    char *a = tk_rtable_text(tp), *b2 = tk_rtable_text(tt), *c2 = tk_rtable_text(tw);
    tk_sb_addf(&text, "%s: %d examples, column '%s'\n%s\n\n%s\n%s\n%s", name, ls.n, col, vnote, a ? a : "",
               b2 ? b2 : "", c2 ? c2 : "");
    free(a);
    free(b2);
    free(c2);
    tk_sb_add(&html, "<div class=\"txk-data\"><p>");
    tk_sb_add_html(&html, name);
    tk_sb_addf(&html, ": %d examples, column '", ls.n);
    tk_sb_add_html(&html, col);
    tk_sb_add(&html, "'<br><small>");
    tk_sb_add_html(&html, vnote);
    tk_sb_add(&html, "</small></p>");
    char *svg = tk_svg_bars(htitle, "examples", TK_LEN_HIST_BINS, lp, hv);
    if (svg) tk_sb_add(&html, svg);
    tk_sb_add(&html, "<div style=\"display:flex;gap:24px;align-items:flex-start\">");
    char *h1 = tk_rtable_html(tp), *h2 = tk_rtable_html(tt), *h3 = tk_rtable_html(tw);
    tk_sb_addf(&html, "%s%s%s</div></div>", h1 ? h1 : "", h2 ? h2 : "", h3 ? h3 : "");
    free(h1);
    free(h2);
    free(h3);

    json_t *out = tk_bundle_new("");
    json_object_set_new(out, "text/plain", json_string(text.p ? text.p : ""));
    tk_sb_clear(&text);
    tk_bundle_take(out, "text/html", tk_sb_take(&html));
    tk_bundle_take(out, "image/svg+xml", svg);
    tk_bundle_take_json(out, "application/vnd.vegalite.v5+json",
                        tk_vegalite_bars(htitle, "tokens", "examples", TK_LEN_HIST_BINS, lp, hv));
    json_t *pj = json_array();
    for (int k = 0; k < 3; k++)
        json_array_append_new(pj, json_pack("{s:s, s:i, s:i, s:I, s:I, s:f}", "batching", names[k], "batches",
                                            pr[k].num_batches, "max_T", pr[k].max_T, "real_tokens",
                                            (json_int_t)pr[k].real_tokens, "padded_tokens",
                                            (json_int_t)pr[k].padded_tokens, "waste", pr[k].waste));
    json_t *tj = json_object();
    for (int k = 0; k < TK_LEN_CANDIDATES; k++) {
        char key[16];
        snprintf(key, sizeof key, "%d", ls.cand[k]);
        json_object_set_new(tj, key, json_real(ls.pct_truncated[k]));
    }
    json_object_set_new(out, "application/json",
                        json_pack("{s:s, s:s, s:i, s:f, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:o, s:s}", "file", name,
                                  "column", col, "examples", ls.n, "mean", ls.mean, "min", ls.min, "p50", ls.p50,
                                  "p90", ls.p90, "p95", ls.p95, "p99", ls.p99, "max", ls.max, "pct_truncated", tj,
                                  "padding", pj, "vocabulary", vnote));
    *bundle = out;
    if (lengths_out) {
        int *copy = tk_malloc((size_t)(nrows > 0 ? nrows : 1) * sizeof *copy);
        if (copy)
            for (int i = 0; i < nrows; i++) copy[i] = len[i] < max_len ? len[i] : max_len;
        *lengths_out = copy;
        *n_out = copy ? nrows : 0;
    }
out:
    tk_rtable_destroy(&tp);
    tk_rtable_destroy(&tt);
    tk_rtable_destroy(&tw);
    tk_run_lengths_clear(&rl);
    return st;
}

tk_status tk_vocab_from_file(const char *path, const char *text_col, int size, int lowercase,
                             const char *out_path, int *n_texts, int *n_tokens, tk_err *err) {
    tk_err local_err = { 0 };
    if (!err) err = &local_err; /* a callee's failure is read from it, never guessed */
    tk_table *t = NULL;
    tk_status st = tk_table_read(path, &t, err);
    if (st != TK_OK) return st;
    const char *col = text_col && *text_col ? text_col : "text";
    int ci = tk_table_col(t, col);
    const char **texts = ci >= 0 ? tk_malloc((size_t)(t->nrows > 0 ? t->nrows : 1) * sizeof *texts) : NULL;
    if (ci < 0) {
        tk_err_set(err, TK_EINVAL, "%s: no column '%s' (use --text COL)", t->name, col);
        st = TK_EINVAL;
    } else if (!texts) {
        tk_err_set(err, TK_ENOMEM, "out of host memory");
        st = TK_ENOMEM;
    } else {
        for (int i = 0; i < t->nrows; i++) texts[i] = t->cells[(size_t)i * t->ncols + ci];
        st = tk_vocab_build(texts, t->nrows, size, lowercase, 0, out_path, err);
    }
    if (st == TK_OK) {
        tk_tokenizer *tok = tk_tokenizer_new(out_path, NULL, err);
        *n_texts = t->nrows;
        *n_tokens = tok ? tk_tokenizer_vocab_size(tok) : 0;
        if (!tok) st = err->status;
        tk_tokenizer_destroy(&tok);
    }
    free(texts);
    tk_table_destroy(&t);
    return st;
}

/* ---- %txdata ------------------------------------------------------------------- */


tk_status tk_app_data(const tk_app_args *a, const tk_config *last, json_t **bundle, int **lengths, int *n,
                      tk_err *err) {
    *bundle = NULL;
    if (a->n_plain != 1) {
        tk_err_set(err, TK_EINVAL, a->n_plain ? "data: one file, got '%s' too" : "data: which file?",
                   a->n_plain ? a->plain[1] : "");
        return TK_EINVAL;
    }
    if (a->n_kv) {
        tk_err_set(err, TK_EINVAL, "data takes no key=value, got '%s'", a->kv[0]);
        return TK_EINVAL;
    }
    const char *ml = tk_app_arg(a, "--max-len"), *bs = tk_app_arg(a, "--batch");
    tk_data_report_opts o = {.path = a->plain[0], .text_col = tk_app_arg(a, "--text"), .pair_col = tk_app_arg(a, "--pair"),
                             .model = tk_app_arg(a, "--model"), .vocab = tk_app_arg(a, "--vocab"),
                             .max_len = ml ? atoi(ml) : last ? last->max_len : 0,
                             .batch_size = bs ? atoi(bs) : last ? last->batch_size : 0,
                             .buckets = last ? last->buckets : 0};
    if (!o.model && last) o.model = last->model;
    return tk_data_report(&o, bundle, lengths, n, err);
}
