/* predict.c — the predict verb of the request layer (issue 39): `txk
 * predict` and `%txpredict` / `%%txpredict` call tk_app_predict with their
 * parsed words and print or show what it returns: a trained model (a
 * folder, a hub id, a config whose output_dir holds one, or the session's
 * last config) run over a file, or over the lines of a cell, with metrics
 * when the input has gold labels; -o writes every prediction. Moved from
 * cli/txk.c and magics/txpredict.c, where each door built the request.
 *
 * Guarantees: the model is planned before anything is allocated
 * (tk_session_predict) and a plan that does not fit stops there; a cell's
 * texts go through a temporary CSV that is removed whatever happens.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tk_app.h"
#include "tk_data.h"
#include "tk_host_mem.h"
#include "tk_hub.h"
#include "tk_predict.h"
#include "tk_render.h"
#include "tk_session.h"

static int is_dir_path(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A folder beside the missing `path` whose name starts with its name or is
 * the start of it ("out/review" -> "out/reviews"), into near; 1 if found. */
static int nearby_folder(const char *path, char *near, size_t n) {
    near[0] = 0;
    char dir[TK_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    size_t l = strlen(dir);
    while (l > 1 && dir[l - 1] == '/') dir[--l] = 0;
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : dir;
    const char *parent = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
    size_t bl = strlen(base);
    DIR *d = bl ? opendir(parent) : NULL;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        size_t el = strlen(e->d_name);
        if (strncmp(e->d_name, base, el < bl ? el : bl) != 0) continue;
        char p[TK_PATH_MAX * 2];
        snprintf(p, sizeof p, "%s%s%s", slash ? parent : "", slash && strcmp(parent, "/") ? "/" : "", e->d_name);
        if (is_dir_path(p)) {
            snprintf(near, n, "%s", p);
            break;
        }
    }
    if (d) closedir(d);
    return near[0] != 0;
}

/* A model named directly: a folder, or a hub id ("org/name" that is no
 * file here and no YAML config). */
static int is_model_ref(const char *p) {
    struct stat st;
    if (is_dir_path(p)) return 1;
    size_t n = strlen(p);
    int yaml = (n > 5 && !strcmp(p + n - 5, ".yaml")) || (n > 4 && !strcmp(p + n - 4, ".yml"));
    return stat(p, &st) != 0 && !yaml && tk_hub_is_repo_id(p);
}

/* A CSV field, quoted when it must be. */
static void csv_field(FILE *f, const char *v) {
    if (!strpbrk(v, ",\"\n\r")) {
        fputs(v, f);
        return;
    }
    fputc('"', f);
    for (const char *c = v; *c; c++) fprintf(f, *c == '"' ? "\"\"" : "%c", *c);
    fputc('"', f);
}

/* The input's id column (--id COL, else one named id or ID) for a
 * classification input: its index into *col and the table (new; NULL when
 * the input has none). TK_EINVAL with *ename "UsageError" when --id names
 * no column (the columns listed); TK_EIO when the file cannot be read
 * again. */
static tk_status id_column(const char *input, const char *want, tk_table **t, int *col, const char **ename,
                           tk_err *err) {
    *t = NULL, *col = -1;
    tk_err e = {0};
    if (tk_table_read(input, t, &e) != TK_OK) {
        if (!want) return TK_OK; /* not a table (SQuAD JSON): its ids are its own */
        *ename = "DataError";
        tk_err_set(err, TK_EIO, "--id %s: %s", want, e.msg);
        return TK_EIO;
    }
    *col = want ? tk_table_col(*t, want) : tk_table_col(*t, "id");
    if (*col < 0 && !want) *col = tk_table_col(*t, "ID");
    if (*col < 0 && want) {
        tk_sb sb = {0};
        for (int k = 0; k < (*t)->ncols; k++) tk_sb_addf(&sb, " %s", (*t)->cols[k]);
        char *cols = tk_sb_take(&sb);
        *ename = "UsageError";
        tk_err_set(err, TK_EINVAL, "--id %s: %s has no such column (its columns:%s)", want, input, cols ? cols : "");
        free(cols);
        tk_table_destroy(t);
        return TK_EINVAL;
    }
    if (*col < 0) tk_table_destroy(t);
    return TK_OK;
}

/* Every prediction to FILE: JSON Lines for *.jsonl, else CSV with a header.
 * A classification row starts with the input's id column (`ids`, column
 * `idc`) when it has one, else the row's index. */
static int write_predictions(const char *path, const json_t *preds, int qa, const tk_predict_report *r,
                             const tk_table *ids, int idc) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int jsonl = strlen(path) > 6 && !strcmp(path + strlen(path) - 6, ".jsonl");
    size_t i;
    json_t *e;
    /* one id per prediction, or none */
    if (ids && (qa || (size_t)ids->nrows != json_array_size(preds))) ids = NULL;
    if (!jsonl) {
        if (ids) csv_field(f, ids->cols[idc]);
        fputs(qa ? "index,id,answer,start,end" : ids ? ",label,score" : "index,label,score", f);
        for (int k = 0; !qa && k < r->n_labels; k++) fprintf(f, ",p_%s", r->labels[k]);
        fputs(qa ? "\n" : ",gold\n", f);
    }
    json_array_foreach(preds, i, e) {
        if (jsonl) {
            json_t *row = ids ? json_deep_copy(e) : json_incref((json_t *)e);
            if (ids && row) json_object_set_new(row, ids->cols[idc], json_string(ids->cells[i * (size_t)ids->ncols + (size_t)idc]));
            char *line = row ? json_dumps(row, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
            if (line) fprintf(f, "%s\n", line);
            free(line);
            json_decref(row);
            continue;
        }
        if (ids) csv_field(f, ids->cells[i * (size_t)ids->ncols + (size_t)idc]);
        else fprintf(f, "%zu", i);
        if (qa) {
            const char *ans = json_string_value(json_object_get(e, "answer"));
            fprintf(f, ",%s,\"", json_string_value(json_object_get(e, "id")) ? json_string_value(json_object_get(e, "id")) : "");
            for (const char *c = ans ? ans : ""; *c; c++) fprintf(f, *c == '"' ? "\"\"" : "%c", *c);
            fprintf(f, "\",%lld,%lld\n", json_integer_value(json_object_get(e, "start")),
                    json_integer_value(json_object_get(e, "end")));
        } else {
            fprintf(f, ",%s,%.6f", json_string_value(json_object_get(e, "label")),
                    json_real_value(json_object_get(e, "score")));
            json_t *probs = json_object_get(e, "probs");
            for (int k = 0; k < r->n_labels; k++)
                fprintf(f, ",%.6f", json_real_value(json_object_get(probs, r->labels[k])));
            const char *g = json_string_value(json_object_get(e, "gold"));
            fprintf(f, ",%s\n", g ? g : "");
        }
    }
    return fclose(f) == 0 ? 0 : -1;
}

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

/* The config to predict with: the model word (a folder, a hub id, or a
 * config file: then its key=value words apply before the folder's columns
 * are read), else the session's last config; then --input and the
 * columns. The words' key=value apply after a folder's settings. 0, or an
 * error with *ename. */
static tk_status predict_config(tk_session *s, const tk_app_args *w, const char *input, int body, tk_config *c,
                                const char **ename, tk_err *err) {
    const char *model = w->n_plain ? w->plain[0] : NULL;
    const tk_config *last = tk_session_config(s);
    *ename = "UsageError";
    if (w->n_plain > 1) {
        tk_err_set(err, TK_EINVAL, "predict: unexpected '%s' (one model: MODEL_DIR, ORG/NAME or cfg.yaml)", w->plain[1]);
        return TK_EINVAL;
    }
    if (!model && !last) {
        tk_err_set(err, TK_EINVAL, "predict: which model? Give MODEL_DIR, ORG/NAME or cfg.yaml, or train one with "
                   "%%%%txtrain (its output_dir) first");
        return TK_EINVAL;
    }
    /* a missing path beside a near folder is a mistyped run folder, not a hub id */
    char near[TK_PATH_MAX * 2 + 8];
    int missing = model && access(model, F_OK) != 0;
    int have = missing && nearby_folder(model, near, sizeof near);
    int folder = model && !have && is_model_ref(model);
    *ename = "ModelError";
    if (model && !folder && missing) {
        tk_err_set(err, TK_EINVAL, "%s: no such folder (nor a config file); predict takes a trained model's folder "
                   "(a run's output_dir), a hub id (ORG/NAME) or a config whose output_dir holds one%s%s%s", model,
                   have ? "; did you mean " : "", have ? near : "", have ? "?" : "");
        return TK_EINVAL;
    }
    tk_status st;
    *ename = "ConfigError";
    if (!model) *c = *last;
    else if (!folder && (st = tk_app_config_load(c, model, w, err)) != TK_OK)
        return st;
    *ename = "ModelError";
    if ((st = tk_session_predict_config(folder ? model : NULL, c, err)) != TK_OK) return st;
    *ename = "ConfigError";
    if ((folder || !model) && (st = tk_app_args_apply(w, c, err)) != TK_OK) return st;
    snprintf(c->train_file, sizeof c->train_file, "%s", input);
    if (body) { /* the cell's lines: one text column */
        snprintf(c->text_col, sizeof c->text_col, "text");
        c->text_pair_col[0] = 0;
    }
    const char *cols[3][2] = {{"--text", "text_col"}, {"--pair", "text_pair_col"}, {"--label", "label_col"}};
    for (int k = 0; k < 3; k++) {
        const char *v = tk_app_arg(w, cols[k][0]);
        if (v && (st = tk_config_set(c, cols[k][1], v, err)) != TK_OK) return st;
    }
    return TK_OK;
}

/* -o FILE: every prediction written, keyed by the input's id column. */
static tk_status predict_write(const tk_app_args *w, const char *input, const tk_predict_report *r, const json_t *b,
                               tk_predict_reply *out, tk_err *err) {
    const char *path = tk_app_arg(w, "-o");
    tk_table *ids = NULL;
    int idc = -1;
    const json_t *preds = json_object_get(json_object_get(b, "application/json"), "predictions");
    tk_status st = id_column(input, tk_app_arg(w, "--id"), &ids, &idc, &out->ename, err);
    if (st == TK_OK && write_predictions(path, preds, r->res && r->res->qa, r, ids, idc) != 0) {
        out->ename = "IOError";
        tk_err_set(err, st = TK_EIO, "%s: cannot write the predictions", path);
    }
    if (st == TK_OK)
        snprintf(out->said, sizeof out->said, "wrote %d predictions to %s%s%s%s", r->res ? r->res->n : 0, path,
                 ids ? " (each with its " : "", ids ? ids->cols[idc] : "", ids ? ")" : "");
    tk_table_destroy(&ids);
    return st;
}

tk_status tk_app_predict(tk_session *s, const tk_app_args *w, const char *texts, tk_predict_reply *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    out->ename = "UsageError";
    const char *input = tk_app_arg(w, "--input"), *rows_s = tk_app_arg(w, "--rows");
    char *end = NULL;
    long rows = rows_s ? strtol(rows_s, &end, 10) : 10;
    if (rows_s && (!*rows_s || *end || rows < 0)) {
        tk_err_set(err, TK_EINVAL, "--rows: expected 0 or more, got '%s'", rows_s);
        return TK_EINVAL;
    }
    if (texts && input) {
        tk_err_set(err, TK_EINVAL, "%%%%txpredict takes its texts from the cell, not --input");
        return TK_EINVAL;
    }
    if (!texts && !input) {
        tk_err_set(err, TK_EINVAL, "predict needs --input FILE (CSV, TSV, JSONL, or SQuAD JSON for a QA model)");
        return TK_EINVAL;
    }
    char tmp[64] = "";
    int bc = texts ? body_to_csv(texts, tmp, sizeof tmp) : 0;
    if (bc) {
        tk_err_set(err, TK_EINVAL, bc == -2 ? "%%%%txpredict: the cell has no text (one per line)"
                                            : "%%%%txpredict: cannot write a temporary file in /tmp");
        return TK_EINVAL;
    }
    if (texts) input = tmp;
    tk_config c;
    tk_predict_report r;
    tk_status st = predict_config(s, w, input, texts != NULL, &c, &out->ename, err);
    if (st == TK_OK && (st = tk_session_predict(s, &c, &r, err)) != TK_OK) out->ename = "PredictError";
    int have_report = st == TK_OK;
    if (st == TK_OK && r.planned_oom) {
        char b1[32], b2[32];
        out->planned_oom = 1;
        snprintf(out->said, sizeof out->said, "the prediction plan needs %s but %s is free: stopped before allocating "
                 "anything (set eval_batch_size smaller)", tk_format_bytes(r.plan.peak_reserved, b1, sizeof b1),
                 tk_format_bytes(r.free_before, b2, sizeof b2));
    } else if (st == TK_OK) {
        out->bundle = tk_report_predict(&r, (int)rows);
        if (!out->bundle) {
            out->ename = "MemoryError";
            st = tk_err_nomem(err, "the predictions' report");
        } else if (tk_app_arg(w, "-o") && predict_write(w, input, &r, out->bundle, out, err) != TK_OK) {
            out->write_failed = 1; /* the predictions are shown; the file is not written */
            snprintf(out->said, sizeof out->said, "%s", err->msg);
        }
    }
    if (have_report) tk_predict_report_clear(&r);
    if (tmp[0]) unlink(tmp);
    return st;
}
