/* test_data.c — CSV/JSONL readers, datasets and their errors, split,
 * features, batching (fixed/dynamic/buckets), statistics, SQuAD windows. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "tk_data.h"
#include "tk_test.h"

static char dir[64];

/* Writes `body` to dir/name; returns the path (static buffer rotates 4). */
static const char *put(const char *name, const char *body) {
    static char paths[4][256];
    static int k;
    char *p = paths[k++ & 3];
    snprintf(p, 256, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    fputs(body, f);
    fclose(f);
    return p;
}

static void test_csv_quoting(void) {
    const char *csv = "id,text,label\r\n"
                      "1,\"hello, world\",pos\r\n"
                      "2,\"she said \"\"hi\"\"\",neg\r\n"
                      "3,\"two\nlines\",pos\n"
                      "\n"
                      "4,,neg\n"
                      "5,last,pos";
    tk_table *t = NULL;
    tk_err err = {0};
    TK_CHECK(tk_csv_parse(csv, strlen(csv), ',', "x.csv", &t, &err) == TK_OK);
    TK_CHECK_MSG(t != NULL, "%s", err.msg);
    if (!t) return;
    TK_CHECK_EQ_INT(t->ncols, 3);
    TK_CHECK_EQ_INT(t->nrows, 5);
    TK_CHECK_STR(t->cells[1 * 3 + 1 - 3], "hello, world");
    TK_CHECK_STR(t->cells[1 * 3 + 1], "she said \"hi\"");
    TK_CHECK_STR(t->cells[2 * 3 + 1], "two\nlines");
    TK_CHECK_STR(t->cells[3 * 3 + 1], "");
    TK_CHECK_STR(t->cells[4 * 3 + 2], "pos");
    TK_CHECK_EQ_INT(t->line[2], 4);
    TK_CHECK_EQ_INT(t->line[3], 7); /* after the embedded newline and a blank line */
    TK_CHECK_EQ_INT(tk_table_col(t, "label"), 2);
    TK_CHECK_EQ_INT(tk_table_col(t, "nope"), -1);
    tk_table_destroy(&t);
    TK_CHECK(t == NULL);
    /* TSV */
    const char *tsv = "text\tlabel\na, b\tx\n";
    TK_CHECK(tk_csv_parse(tsv, strlen(tsv), '\t', "x.tsv", &t, &err) == TK_OK);
    if (t) TK_CHECK_STR(t->cells[0], "a, b");
    tk_table_destroy(&t);
}

static void test_csv_errors(void) {
    tk_table *t = NULL;
    tk_err err = {0};
    const char *a = "text,label\nok,pos\n\"never closed,pos\nmore,neg\n";
    TK_CHECK(tk_csv_parse(a, strlen(a), ',', "train.csv", &t, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "train.csv:3:1: unterminated quoted field (a quote opens here and never closes)");
    const char *b = "text,label\nab\"c,pos\n";
    TK_CHECK(tk_csv_parse(b, strlen(b), ',', "train.csv", &t, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "train.csv:2:3: quote inside an unquoted field (quote the whole field and write inner "
                          "quotes as \"\")");
    const char *c = "text,label\n\"abc\"d,pos\n";
    TK_CHECK(tk_csv_parse(c, strlen(c), ',', "train.csv", &t, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "train.csv:2:6: unexpected 'd' after a closing quote (inside a quoted field write a quote "
                          "as \"\")");
    const char *d = "text,label\na,b,c\n";
    TK_CHECK(tk_csv_parse(d, strlen(d), ',', "train.csv", &t, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "train.csv:2: 3 fields, the header has 2 (quote fields that contain ',')");
    TK_CHECK(tk_csv_parse("", 0, ',', "e.csv", &t, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "e.csv: empty file (no header line)");
    TK_CHECK(t == NULL);
}

/* Seeded random CSV-ish text: each parse either succeeds or fails with a
 * message naming the file; ASan sees no overflow and no leak. */
static void test_csv_random(void) {
    static const char *frag[] = {"a", ",", "\"", "\"\"", "\n", "\r\n", "\r", " ", "x,y", "\xC3\xA9", "\t"};
    uint64_t s = 7;
    int ok = 0, bad = 0;
    for (int it = 0; it < 3000; it++) {
        char buf[256] = "text,label\n";
        size_t n = strlen(buf);
        int parts = 1 + (int)(s % 40);
        for (int k = 0; k < parts; k++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            const char *f = frag[(s >> 33) % 11];
            memcpy(buf + n, f, strlen(f));
            n += strlen(f);
        }
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        tk_table *t = NULL;
        tk_err err = {0};
        tk_status st = tk_csv_parse(buf, n, ',', "r.csv", &t, &err);
        if (st == TK_OK) {
            ok++;
            if (t->nrows > 0 && t->ncols != 2) bad++;
        } else if (strncmp(err.msg, "r.csv:", 6) != 0 || t != NULL) {
            bad++;
        }
        tk_table_destroy(&t);
    }
    TK_CHECK_EQ_INT(bad, 0);
    TK_CHECK(ok > 0);
}

static void test_dataset_errors(void) {
    tk_dataset *d = NULL;
    tk_err err = {0};
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing.csv", dir);
    TK_CHECK(tk_dataset_load(missing, NULL, &d, &err) == TK_EIO);
    char want[400];
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", missing);
    TK_CHECK_STR(err.msg, want);
    const char *p = put("train.csv", "text,label\nhi,pos\n");
    tk_data_cols cols = {.text = "txt"};
    TK_CHECK(tk_dataset_load(p, &cols, &d, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "train.csv: no column 'txt' for the text (columns: text, label; did you mean 'text'? "
                          "set text_col: text)");
    cols = (tk_data_cols){.label = "category"};
    TK_CHECK(tk_dataset_load(p, &cols, &d, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "train.csv: no column 'category' for the label (columns: text, label; set label_col: to "
                          "one of them)");
    p = put("empty.csv", "text,label\n");
    TK_CHECK(tk_dataset_load(p, NULL, &d, &err) == TK_EINVAL);
    TK_CHECK_STR(err.msg, "empty.csv: no examples (only a header)");
    p = put("nolabel.csv", "text,label\na,x\nb,\n");
    TK_CHECK(tk_dataset_load(p, NULL, &d, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "nolabel.csv:3: empty label in column 'label'");
    p = put("data.txt", "x");
    TK_CHECK(tk_dataset_load(p, NULL, &d, &err) == TK_EINVAL);
    TK_CHECK(strstr(err.msg, "unknown data format (use .csv, .tsv or .jsonl)") != NULL);
    TK_CHECK(d == NULL);
}

static void test_labels_and_dev(void) {
    tk_dataset *tr = NULL, *dv = NULL;
    tk_err err = {0};
    TK_CHECK(tk_dataset_load(put("train.csv", "text,label\na,pos\nb,neg\nc,pos\nd,mixed\n"), NULL, &tr, &err) == TK_OK);
    if (!tr) return;
    TK_CHECK_EQ_INT(tr->num_labels, 3);
    TK_CHECK_STR(tr->labels[0], "mixed");
    TK_CHECK_STR(tr->labels[1], "neg");
    TK_CHECK_STR(tr->labels[2], "pos");
    TK_CHECK_EQ_INT(tr->label[0], 2);
    TK_CHECK_EQ_INT(tr->label[3], 0);
    TK_CHECK(tk_dataset_load(put("dev.csv", "text,label\nx,neg\ny,neutral\n"), NULL, &dv, &err) == TK_OK);
    TK_CHECK(tk_dataset_use_labels(dv, tr->labels, tr->num_labels, &err) == TK_EINVAL);
    TK_CHECK_STR(err.msg, "dev.csv:3: unknown label 'neutral' (train labels: mixed, neg, pos)");
    tk_dataset_destroy(&dv);
    TK_CHECK(tk_dataset_load(put("dev.csv", "text,label\nx,neg\ny,pos\n"), NULL, &dv, &err) == TK_OK);
    TK_CHECK(tk_dataset_use_labels(dv, tr->labels, tr->num_labels, &err) == TK_OK);
    TK_CHECK_EQ_INT(dv->num_labels, 3);
    TK_CHECK_EQ_INT(dv->label[0], 1);
    TK_CHECK_EQ_INT(dv->label[1], 2);
    tk_dataset_destroy(&dv);
    tk_dataset_destroy(&tr);
}

static void test_jsonl(void) {
    tk_dataset *d = NULL;
    tk_err err = {0};
    const char *p = put("a.jsonl", "{\"text\": \"hi\", \"label\": 1}\n\n{\"text\": \"yo\", \"label\": 0, \"x\": null}\n");
    TK_CHECK(tk_dataset_load(p, NULL, &d, &err) == TK_OK);
    if (d) {
        TK_CHECK_EQ_INT(d->n, 2);
        TK_CHECK_STR(d->labels[0], "0");
        TK_CHECK_EQ_INT(d->label[0], 1);
        TK_CHECK_EQ_INT(d->line[1], 3);
    }
    tk_dataset_destroy(&d);
    p = put("b.jsonl", "{\"text\": \"hi\", \"label\": 1}\n{\"text\": \"hi\" \"label\": 1}\n");
    TK_CHECK(tk_dataset_load(p, NULL, &d, &err) == TK_EFORMAT);
    TK_CHECK(strncmp(err.msg, "b.jsonl:2:", 10) == 0 && strstr(err.msg, "invalid JSON") != NULL);
    p = put("c.jsonl", "[1,2]\n");
    TK_CHECK(tk_dataset_load(p, NULL, &d, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "c.jsonl:1:1: each line must be a JSON object ({\"text\": ..., \"label\": ...})");
}

static void test_split(void) {
    char body[4096] = "text,label\n";
    for (int i = 0; i < 100; i++) sprintf(body + strlen(body), "t%d,%s\n", i, i % 3 ? "a" : "b");
    tk_dataset *all = NULL, *tr = NULL, *dv = NULL, *tr2 = NULL, *dv2 = NULL;
    tk_err err = {0};
    TK_CHECK(tk_dataset_load(put("all.csv", body), NULL, &all, &err) == TK_OK);
    if (!all) return;
    TK_CHECK(tk_dataset_split(all, 0.2, 7, &tr, &dv, &err) == TK_OK);
    TK_CHECK(tk_dataset_split(all, 0.2, 7, &tr2, &dv2, &err) == TK_OK);
    TK_CHECK_EQ_INT(dv->n, 20);
    TK_CHECK_EQ_INT(tr->n, 80);
    TK_CHECK_EQ_INT(dv->num_labels, 2);
    int same = 1;
    for (int i = 0; i < 20; i++) same &= strcmp(dv->text[i], dv2->text[i]) == 0;
    TK_CHECK(same); /* deterministic under a seed */
    for (int i = 1; i < 20; i++) TK_CHECK(dv->line[i] > dv->line[i - 1]); /* file order kept */
    tk_dataset_destroy(&tr2);
    tk_dataset_destroy(&dv2);
    TK_CHECK(tk_dataset_split(all, 0.2, 8, &tr2, &dv2, &err) == TK_OK);
    int differ = 0;
    for (int i = 0; i < 20; i++) differ |= strcmp(dv->text[i], dv2->text[i]) != 0;
    TK_CHECK(differ);
    tk_dataset_destroy(&tr);
    tk_dataset_destroy(&dv);
    TK_CHECK(tk_dataset_split(all, 0.001, 8, &tr, &dv, &err) == TK_EINVAL);
    TK_CHECK_STR(err.msg, "all.csv: dev_split 0.001 of 100 examples leaves an empty dev set");
    TK_CHECK(tr == NULL && dv == NULL);
    tk_dataset_destroy(&tr2);
    tk_dataset_destroy(&dv2);
    tk_dataset_destroy(&all);
}

static const char *VOC[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "the", "city", "was",
                            "founded", "in", "by", "who", "when", "?", ".", "ada", "marlow", "1200", "x"};

static void test_features_and_batches(void) {
    tk_tokenizer *t = tk_tokenizer_from_tokens(VOC, (int)(sizeof VOC / sizeof VOC[0]), "voc", NULL, NULL);
    char body[8192] = "text,label\n";
    /* lengths 1..40 words (+2 specials) */
    for (int i = 0; i < 40; i++) {
        strcat(body, "\"");
        for (int k = 0; k <= i; k++) strcat(body, "a ");
        strcat(body, i % 2 ? "\",p\n" : "\",q\n");
    }
    tk_dataset *d = NULL;
    tk_features *f = NULL;
    tk_err err = {0};
    TK_CHECK(tk_dataset_load(put("len.csv", body), NULL, &d, &err) == TK_OK);
    TK_CHECK(tk_features_classify(t, d, 32, TK_TRUNC_LONGEST_FIRST, &f, &err) == TK_OK);
    if (!f) { tk_dataset_destroy(&d); tk_tokenizer_destroy(&t); return; }
    TK_CHECK_EQ_INT(f->n, 40);
    TK_CHECK_EQ_INT(f->len[0], 3);
    TK_CHECK_EQ_INT(f->len[39], 32);
    TK_CHECK_EQ_INT(f->full_len[39], 42);
    TK_CHECK_EQ_INT(f->n_truncated, 10); /* full lengths 33..42 */
    TK_CHECK_EQ_INT(f->label[1], 0);     /* "p" sorts first */

    tk_batching_opts o = {.strategy = TK_BATCH_FIXED, .batch_size = 8, .shuffle = 1, .seed = 3};
    tk_batches *b = tk_batches_new(f, &o, 0, &err);
    TK_CHECK_EQ_INT(tk_batches_count(b), 5);
    TK_CHECK_EQ_INT(tk_batches_max_T(b), 32);
    tk_data_batch bt = {0};
    TK_CHECK(tk_batches_get(b, 0, 0, &bt, &err) == TK_OK);
    TK_CHECK_EQ_INT(bt.B, 8);
    TK_CHECK_EQ_INT(bt.T, 32);
    int row = bt.index[0];
    TK_CHECK_EQ_INT(bt.input_ids[0], 2);                      /* [CLS] */
    TK_CHECK_EQ_INT(bt.attention_mask[f->len[row] - 1], 1);
    if (f->len[row] < 32) {
        TK_CHECK_EQ_INT(bt.attention_mask[f->len[row]], 0);
        TK_CHECK_EQ_INT(bt.input_ids[f->len[row]], 0);        /* [PAD] */
    }
    TK_CHECK_EQ_INT(bt.labels[0], f->label[row]);
    TK_CHECK(bt.start_positions == NULL);
    /* every feature appears once per epoch, order differs across epochs but
     * repeats for the same (seed, epoch) */
    int seen[40] = {0}, first0[2] = {-1, -2};
    for (int i = 0; i < 5; i++) {
        TK_CHECK(tk_batches_get(b, 1, i, &bt, &err) == TK_OK);
        for (int r = 0; r < bt.B; r++) seen[bt.index[r]]++;
        if (i == 0) first0[0] = bt.index[0];
    }
    for (int i = 0; i < 40; i++) TK_CHECK_EQ_INT(seen[i], 1);
    TK_CHECK(tk_batches_get(b, 0, 0, &bt, &err) == TK_OK);
    TK_CHECK_EQ_INT(bt.index[0], row);
    TK_CHECK(tk_batches_get(b, 1, 0, &bt, &err) == TK_OK);
    first0[1] = bt.index[0];
    TK_CHECK_EQ_INT(first0[0], first0[1]);
    TK_CHECK(tk_batches_get(b, 0, 5, &bt, &err) == TK_EINVAL);
    tk_batches_destroy(&b);

    /* dynamic: T is the batch's longest */
    o.strategy = TK_BATCH_DYNAMIC;
    b = tk_batches_new(f, &o, 0, &err);
    int64_t padded_dyn = 0;
    for (int i = 0; i < tk_batches_count(b); i++) {
        tk_batches_get(b, 0, i, &bt, &err);
        int mx = 0;
        for (int r = 0; r < bt.B; r++) mx = f->len[bt.index[r]] > mx ? f->len[bt.index[r]] : mx;
        TK_CHECK_EQ_INT(bt.T, mx);
        padded_dyn += (int64_t)bt.B * bt.T;
    }
    tk_batches_destroy(&b);
    /* buckets: less padding than dynamic, every row once */
    o.strategy = TK_BATCH_BUCKETS;
    o.buckets = 5;
    b = tk_batches_new(f, &o, 0, &err);
    int64_t padded_b = 0;
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < tk_batches_count(b); i++) {
        tk_batches_get(b, 2, i, &bt, &err);
        padded_b += (int64_t)bt.B * bt.T;
        for (int r = 0; r < bt.B; r++) seen[bt.index[r]]++;
    }
    for (int i = 0; i < 40; i++) TK_CHECK_EQ_INT(seen[i], 1);
    TK_CHECK(padded_b < padded_dyn);
    tk_batches_destroy(&b);
    /* eval order: no shuffle keeps file order */
    o = (tk_batching_opts){.strategy = TK_BATCH_DYNAMIC, .batch_size = 16, .shuffle = 0};
    b = tk_batches_new(f, &o, 0, &err);
    TK_CHECK_EQ_INT(tk_batches_count(b), 3);
    tk_batches_get(b, 0, 2, &bt, &err);
    TK_CHECK_EQ_INT(bt.B, 8);
    TK_CHECK_EQ_INT(bt.index[0], 32);
    tk_batches_destroy(&b);
    o.batch_size = 0;
    TK_CHECK(tk_batches_new(f, &o, 0, &err) == NULL);
    TK_CHECK_STR(err.msg, "batch_size must be at least 1");
    tk_data_batch_clear(&bt);

    /* statistics and padding waste */
    tk_length_stats s;
    tk_length_stats_compute(f->full_len, f->n, &s);
    TK_CHECK_EQ_INT(s.min, 3);
    TK_CHECK_EQ_INT(s.max, 42);
    TK_CHECK_EQ_INT(s.p50, 22);
    TK_CHECK_EQ_INT(s.p90, 38);
    TK_CHECK_EQ_INT(s.p99, 42);
    TK_CHECK_NEAR(s.mean, 22.5, 1e-9);
    int tot = 0;
    for (int k = 0; k < TK_LEN_HIST_BINS; k++) tot += s.hist[k];
    TK_CHECK_EQ_INT(tot, 40);
    TK_CHECK_NEAR(s.pct_truncated[0], 0.0, 1e-9);
    int32_t lens[4] = {10, 70, 130, 600};
    tk_length_stats_compute(lens, 4, &s);
    TK_CHECK_NEAR(s.pct_truncated[0], 75.0, 1e-9); /* > 64 */
    TK_CHECK_NEAR(s.pct_truncated[1], 50.0, 1e-9); /* > 128 */
    TK_CHECK_NEAR(s.pct_truncated[5], 25.0, 1e-9); /* > 512 */
    tk_padding_report rep[3];
    TK_CHECK(tk_padding_waste(f->full_len, f->n, 32, 8, 5, 3, rep, &err) == TK_OK);
    TK_CHECK_EQ_INT(rep[0].padded_tokens, 40 * 32);
    TK_CHECK(rep[0].waste > rep[1].waste && rep[1].waste > rep[2].waste);
    TK_CHECK_EQ_INT(rep[2].max_T, 32);
    TK_CHECK_EQ_INT(rep[0].real_tokens, rep[2].real_tokens);
    tk_features_destroy(&f);
    tk_dataset_destroy(&d);
    tk_tokenizer_destroy(&t);
}

static void test_squad(void) {
    tk_tokenizer *t = tk_tokenizer_from_tokens(VOC, (int)(sizeof VOC / sizeof VOC[0]), "voc", NULL, NULL);
    /* context: 12 filler words then the facts; answer "ada marlow" */
    const char *js =
        "{\"version\":\"1.1\",\"data\":[{\"title\":\"t\",\"paragraphs\":[{\"context\":"
        "\"x x x x x x x x x x x x The city was founded in 1200 by Ada Marlow. x x x x x x\","
        "\"qas\":[{\"id\":\"q1\",\"question\":\"Who founded the city?\",\"answers\":[{\"text\":\"Ada Marlow\","
        "\"answer_start\":56}]},{\"id\":\"q2\",\"question\":\"When?\",\"answers\":[{\"text\":\"1200\","
        "\"answer_start\":48}]}]}]}]}";
    tk_squad *sq = NULL;
    tk_err err = {0};
    TK_CHECK(tk_squad_parse(js, strlen(js), "sq.json", &sq, &err) == TK_OK);
    TK_CHECK_MSG(sq != NULL, "%s", err.msg);
    if (!sq) { tk_tokenizer_destroy(&t); return; }
    TK_CHECK_EQ_INT(sq->n, 2);
    tk_features *f = NULL;
    /* question "who founded the city ?" = 5 tokens; max_len 16: window 8, stride 3 */
    TK_CHECK(tk_features_squad(t, sq, 16, 3, &f, &err) == TK_OK);
    TK_CHECK_MSG(f != NULL, "%s", err.msg);
    if (f) {
        int found = 0;
        for (int i = 0; i < f->n; i++) {
            TK_CHECK(f->len[i] <= 16);
            const tk_squad_example *e = &sq->ex[f->example[i]];
            if (f->start_pos[i] == 0) continue;
            int64_t o = f->off[i];
            int bs = f->ctx_bstart[o + f->start_pos[i]], be = f->ctx_bend[o + f->end_pos[i]];
            char got[64];
            snprintf(got, sizeof got, "%.*s", be - bs, e->context + bs);
            TK_CHECK_STR(got, e->answer_text[0]); /* the span maps back to the exact text */
            found++;
        }
        TK_CHECK(found >= 2);
        TK_CHECK(f->n > 2); /* the context needed several windows */
        /* windows overlap by 3 context tokens */
        TK_CHECK_EQ_INT(f->ids[f->off[0] + 7 + 5], f->ids[f->off[1] + 7]);
    }
    tk_features_destroy(&f);
    TK_CHECK(tk_features_squad(t, sq, 16, 8, &f, &err) == TK_EINVAL);
    TK_CHECK_STR(err.msg, "sq.json: question 'q1' has 5 tokens: with max_len 16 that leaves 8 for the context, not "
                          "more than doc_stride 8 (raise max_len or lower doc_stride)");
    tk_squad_destroy(&sq);
    const char *bad = "{\"data\":[{\"paragraphs\":[{\"context\":\"abc def\",\"qas\":[{\"id\":\"q9\",\"question\":\"?\","
                      "\"answers\":[{\"text\":\"def\",\"answer_start\":3}]}]}]}]}";
    TK_CHECK(tk_squad_parse(bad, strlen(bad), "sq.json", &sq, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "sq.json: question 'q9': answer 'def' not at answer_start 3 (context has ' de' there)");
    /* v2.0: an impossible question labels every window (0, 0) */
    const char *v2 = "{\"version\":\"v2.0\",\"data\":[{\"paragraphs\":[{\"context\":\"the city was founded\",\"qas\":["
                     "{\"id\":\"i1\",\"question\":\"who?\",\"answers\":[],\"is_impossible\":true}]}]}]}";
    TK_CHECK(tk_squad_parse(v2, strlen(v2), "v2.json", &sq, &err) == TK_OK);
    if (sq) {
        TK_CHECK(sq->ex[0].is_impossible == 1 && sq->ex[0].nanswers == 0);
        TK_CHECK(tk_features_squad(t, sq, 32, 8, &f, &err) == TK_OK);
        if (f) TK_CHECK(f->n == 1 && f->start_pos[0] == 0 && f->end_pos[0] == 0);
        tk_features_destroy(&f);
    }
    tk_squad_destroy(&sq);
    const char *v1bad = "{\"data\":[{\"paragraphs\":[{\"context\":\"abc\",\"qas\":[{\"id\":\"n1\",\"question\":\"?\","
                        "\"answers\":[]}]}]}]}";
    TK_CHECK(tk_squad_parse(v1bad, strlen(v1bad), "sq.json", &sq, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "sq.json: question 'n1': no answers (SQuAD v2.0 marks such questions \"is_impossible\": true)");
    TK_CHECK(tk_squad_parse("{\"data\": 1}", 11, "sq.json", &sq, &err) == TK_EFORMAT);
    TK_CHECK_STR(err.msg, "sq.json: not SQuAD JSON: no \"data\" list at the top level");
    TK_CHECK(tk_squad_parse("{\"data\": [", 10, "sq.json", &sq, &err) == TK_EFORMAT);
    TK_CHECK(strncmp(err.msg, "sq.json:1:", 10) == 0);
    TK_CHECK(sq == NULL);
    tk_tokenizer_destroy(&t);
}

/* The project's generated sets (tests/data, run from the repository root):
 * realistic lengths, and every SQuAD answer recoverable from its features. */
static void test_generated_sets(void) {
    tk_err err = {0};
    tk_tokenizer *t = tk_tokenizer_new("tests/data/vocab_uncased.txt", NULL, &err);
    TK_CHECK_MSG(t != NULL, "%s", err.msg);
    if (!t) return;
    tk_dataset *d = NULL;
    tk_features *f = NULL;
    TK_CHECK(tk_dataset_load("tests/data/reviews_train.csv", NULL, &d, &err) == TK_OK);
    TK_CHECK(d && tk_features_classify(t, d, 512, TK_TRUNC_LONGEST_FIRST, &f, &err) == TK_OK);
    if (f) {
        tk_length_stats s;
        tk_length_stats_compute(f->full_len, f->n, &s);
        fprintf(stderr, "  reviews_train: n=%d p50=%d p90=%d p99=%d max=%d >128: %.1f%% >512: %.1f%%\n", s.n, s.p50,
                s.p90, s.p99, s.max, s.pct_truncated[1], s.pct_truncated[5]);
        TK_CHECK_EQ_INT(d->num_labels, 3);
        TK_CHECK(s.p99 > 100 && s.p99 < 250); /* long tail as generated */
        TK_CHECK(s.max > 512);                /* a few outliers */
        TK_CHECK(s.p50 < 60);
    }
    tk_features_destroy(&f);
    tk_dataset_destroy(&d);
    tk_squad *sq = NULL;
    TK_CHECK(tk_squad_load("tests/data/squad_dev.json", &sq, &err) == TK_OK);
    TK_CHECK(sq && tk_features_squad(t, sq, 128, 32, &f, &err) == TK_OK);
    if (f) {
        int *hit = calloc((size_t)sq->n, sizeof(int)), bad = 0, missing = 0;
        for (int i = 0; i < f->n; i++) {
            if (f->start_pos[i] == 0) continue;
            const tk_squad_example *e = &sq->ex[f->example[i]];
            int64_t o = f->off[i];
            int bs = f->ctx_bstart[o + f->start_pos[i]], be = f->ctx_bend[o + f->end_pos[i]];
            size_t al = strlen(e->answer_text[0]);
            /* lower-casing does not change these ASCII answers' byte spans */
            if ((size_t)(be - bs) != al || strncmp(e->context + bs, e->answer_text[0], al) != 0) bad++;
            hit[f->example[i]] = 1;
        }
        for (int i = 0; i < sq->n; i++) missing += !hit[i];
        fprintf(stderr, "  squad_dev: %d questions, %d features, %d contexts split\n", sq->n, f->n, f->n_truncated);
        TK_CHECK_EQ_INT(bad, 0);
        TK_CHECK_EQ_INT(missing, 0); /* stride 32 keeps every short answer whole in some window */
        free(hit);
    }
    tk_features_destroy(&f);
    tk_squad_destroy(&sq);
    tk_tokenizer_destroy(&t);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/tk_data_XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    TK_RUN(test_csv_quoting);
    TK_RUN(test_csv_errors);
    TK_RUN(test_csv_random);
    TK_RUN(test_dataset_errors);
    TK_RUN(test_labels_and_dev);
    TK_RUN(test_jsonl);
    TK_RUN(test_split);
    TK_RUN(test_features_and_batches);
    TK_RUN(test_squad);
    TK_RUN(test_generated_sets);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tk_test_done();
}
