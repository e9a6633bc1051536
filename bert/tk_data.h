/* tk_data.h — data readers, features and batching for the fine-tuner.
 *
 * What it owns:
 *   - readers: CSV/TSV (RFC 4180: quoted fields, doubled quotes, embedded
 *     newlines, CRLF), JSONL (one object per line), SQuAD v1.1/v2.0 JSON;
 *   - datasets: columns picked by name, the label set from the data (sorted by
 *     byte order, so stable across runs), a seeded train/dev split, dev labels
 *     checked against the train labels;
 *   - features: tokenized examples (classification) or SQuAD windows with
 *     doc_stride and answer start/end token positions;
 *   - batching: fixed padding to max_len, dynamic padding to the batch's
 *     longest, length buckets with shuffled bucket order; deterministic for a
 *     seed and epoch;
 *   - statistics for %txdata: token-length histogram and percentiles, %
 *     truncated at candidate max_len values, padding waste per strategy.
 *
 * Errors: every reader error names the file, and where it applies the line and
 * column: "train.csv:17:3: unterminated quoted field",
 * "train.csv: no column 'txt' for the text (columns: text, label; did you mean
 * 'text'? set text_col: text)",
 * "dev.csv:4: unknown label 'neutral' (train labels: neg, pos)",
 * "train.csv: no examples". Nothing exits; every failure frees what it made.
 *
 * Ownership: *_new/_load return new objects the caller destroys with the
 * matching *_destroy(T **p) (no-op on NULL, sets *p = NULL). Pointers into an
 * object are borrowed and live as long as it.
 */
#ifndef TK_DATA_H
#define TK_DATA_H

#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"
#include "tk_config.h"    /* tk_batching */
#include "tk_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- raw tables (CSV/TSV/JSONL) ---------------------------------------- */

typedef struct tk_table {
    int ncols, nrows;
    char **cols;     /* ncols header names */
    char **cells;    /* nrows*ncols, row-major; a missing JSONL key is "" */
    int *line;       /* nrows: 1-based line where the row starts in the file */
    char name[256];  /* file name used in errors (basename of the path) */
} tk_table;

/* Parses CSV/TSV text. delim ',' or '\t'; `name` goes into errors. The first
 * record is the header. Rows with a different field count are errors
 * ("x.csv:9: 3 fields, header has 2"). */
tk_status tk_csv_parse(const char *buf, size_t len, char delim, const char *name, tk_table **out,
                       tk_err *err);
/* Parses JSON Lines: each non-blank line an object; columns are the union of
 * keys in order of first appearance; strings as is, numbers/bools as text. */
tk_status tk_jsonl_parse(const char *buf, size_t len, const char *name, tk_table **out, tk_err *err);
/* Reads a file by extension: .csv → ',', .tsv/.tab → '\t', .jsonl/.json → JSONL. */
tk_status tk_table_read(const char *path, tk_table **out, tk_err *err);
/* Column index by name, or -1. */
int tk_table_col(const tk_table *t, const char *name);
void tk_table_destroy(tk_table **p);

/* ---- classification datasets ------------------------------------------- */

typedef struct tk_dataset {
    int n;
    char **text;       /* n, owned */
    char **text_pair;  /* n or NULL when no pair column */
    char **label_str;  /* n or NULL when no label column */
    int32_t *label;    /* n: index into labels, -1 when unlabelled */
    int32_t *line;     /* n: source line */
    int num_labels;
    char **labels;     /* num_labels, sorted; owned */
    char name[256];
} tk_dataset;

typedef struct tk_data_cols {
    const char *text;       /* required; NULL/"" = "text" */
    const char *text_pair;  /* NULL/"" = none */
    const char *label;      /* NULL/"" = "label"; a missing label column is an error */
    int label_optional;     /* 1: no label column is fine (prediction input): every label -1 */
} tk_data_cols;

/* Loads a CSV/TSV/JSONL file into a dataset with its own sorted label set.
 * Errors: cannot open, parse errors, unknown column (TK_EFORMAT, with the
 * list, the closest name and the config key to set), empty label cell ("x.csv:5: empty label"), no examples. */
tk_status tk_dataset_load(const char *path, const tk_data_cols *cols, tk_dataset **out, tk_err *err);
/* Same from a parsed table (borrowed). */
tk_status tk_dataset_from_table(const tk_table *t, const tk_data_cols *cols, tk_dataset **out,
                                tk_err *err);
/* Re-indexes ds's labels against `labels` (e.g. train's): a label not in
 * the set is an error naming line and label and listing the set. */
tk_status tk_dataset_use_labels(tk_dataset *ds, char *const *labels, int num_labels, tk_err *err);
/* Seeded split: a fraction `dev_fraction` (0 < f < 1) of `all` goes to dev,
 * the rest to train; each keeps all's label set. Both new. Fails when either
 * side would be empty. */
tk_status tk_dataset_split(const tk_dataset *all, double dev_fraction, uint64_t seed,
                           tk_dataset **train, tk_dataset **dev, tk_err *err);
void tk_dataset_destroy(tk_dataset **p);

/* ---- SQuAD ----------------------------------------------------------- */

typedef struct tk_squad_example {
    char *id, *question, *context;  /* owned by the tk_squad */
    int nanswers;
    char **answer_text;             /* nanswers */
    int32_t *answer_start;          /* nanswers: character offset in context */
    int32_t *answer_bstart;         /* nanswers: byte offset in context */
    int is_impossible;              /* v2.0 */
} tk_squad_example;

typedef struct tk_squad {
    int n;
    tk_squad_example *ex;
    char name[256];
} tk_squad;

/* Reads SQuAD v1.1 / v2.0 JSON ({"data":[{"paragraphs":[{"context","qas":[...]}]}]}).
 * Checks each answer: answer_start inside the context and the context text
 * there equal to answer text ("train.json: question 'q12': answer 'Paris' not
 * at answer_start 40 (context has 'Lyon ')"). */
tk_status tk_squad_load(const char *path, tk_squad **out, tk_err *err);
tk_status tk_squad_parse(const char *buf, size_t len, const char *name, tk_squad **out, tk_err *err);
void tk_squad_destroy(tk_squad **p);

/* ---- features: tokenized examples ---------------------------------------- */

typedef struct tk_features {
    int n;                 /* features (QA: windows; one example may give several) */
    int max_len;
    int64_t *off;          /* n+1: feature i's tokens are [off[i], off[i+1]) */
    int32_t *ids, *type_ids;
    int32_t *len;          /* n: tokens incl. specials (<= max_len) */
    int32_t *full_len;     /* n: tokens before truncation (for statistics) */
    int32_t *label;        /* n (classification) or NULL */
    int32_t *start_pos, *end_pos; /* n (QA): answer token positions, 0 = [CLS] (no answer here) */
    int32_t *example;      /* n: source example index */
    int n_truncated;       /* examples that lost tokens (classification) */
    /* QA only, for mapping predictions back to text: per token the byte span
     * in the example's context, -1 for question/special tokens. */
    int32_t *ctx_bstart, *ctx_bend;
    int num_labels;
} tk_features;

/* Encodes a classification dataset ([CLS] text [SEP] (pair [SEP])), truncated
 * to max_len with `strategy`. */
tk_status tk_features_classify(const tk_tokenizer *t, const tk_dataset *ds, int max_len,
                               tk_truncation strategy, tk_features **out, tk_err *err);
/* SQuAD windows as HF run_qa.py makes them: question first (never cut), the
 * context cut into windows of max_len tokens that overlap by `doc_stride`
 * tokens; an answer not wholly inside a window gets start = end = 0. */
tk_status tk_features_squad(const tk_tokenizer *t, const tk_squad *sq, int max_len, int doc_stride,
                            tk_features **out, tk_err *err);
void tk_features_destroy(tk_features **p);

/* ---- batching ------------------------------------------------------------ */

/* One batch as host int32 arrays, row-major [B, T]. Start from a zeroed
 * tk_data_batch; tk_batches_get fills it, growing its one block of memory when a
 * batch needs more; the arrays are owned by the tk_data_batch (tk_data_batch_clear). */
typedef struct tk_data_batch {
    int B, T;                  /* rows and padded length */
    int32_t *input_ids, *token_type_ids, *attention_mask; /* B*T; pad id, 0, 0 in padding */
    int32_t *labels;           /* B (classification) or NULL */
    int32_t *start_positions, *end_positions; /* B (QA) or NULL */
    int32_t *index;            /* B: feature index of each row */
    int64_t real_tokens;       /* sum of lengths (non-pad) */
    int cap;                   /* allocated B*T */
} tk_data_batch;
void tk_data_batch_clear(tk_data_batch *b);

typedef struct tk_batches tk_batches;

typedef struct tk_batching_opts {
    tk_batching strategy;  /* TK_BATCH_FIXED, _DYNAMIC, _BUCKETS */
    int batch_size;
    int buckets;           /* buckets strategy: number of length buckets (0 = 8) */
    int shuffle;           /* 1: shuffle each epoch (train); 0: keep order (eval) */
    int drop_last;         /* 1: drop a final short batch */
    uint64_t seed;
} tk_batching_opts;

/* Plans batches over `f` (borrowed: must outlive the tk_batches). New object. */
tk_batches *tk_batches_new(const tk_features *f, const tk_batching_opts *o, int pad_id, tk_err *err);
void tk_batches_destroy(tk_batches **p);
int tk_batches_count(const tk_batches *b);          /* batches per epoch */
int tk_batches_max_T(const tk_batches *b);          /* longest padded length of any batch */
const tk_features *tk_batches_features(const tk_batches *b);
/* Fills `out` with batch i of epoch `epoch` (0-based). The order of an epoch
 * depends only on (seed, epoch). Not thread-safe (caches the epoch's order). */
tk_status tk_batches_get(const tk_batches *b, int epoch, int i, tk_data_batch *out, tk_err *err);

/* ---- statistics ---------------------------------------------------------- */

#define TK_LEN_HIST_BINS 16
#define TK_LEN_CANDIDATES 6
typedef struct tk_length_stats {
    int n;
    int min, max, p50, p90, p95, p99;
    double mean;
    int hist_edge[TK_LEN_HIST_BINS + 1]; /* bin k counts lengths in [edge[k], edge[k+1]) */
    int hist[TK_LEN_HIST_BINS];
    int cand[TK_LEN_CANDIDATES];         /* 64 128 192 256 384 512 */
    double pct_truncated[TK_LEN_CANDIDATES]; /* % of examples longer than cand[k] */
} tk_length_stats;
/* Statistics of n token lengths (with special tokens). n == 0 gives zeros. */
void tk_length_stats_compute(const int32_t *len, int n, tk_length_stats *out);

typedef struct tk_padding_report {
    tk_batching strategy;
    int num_batches, max_T;
    int64_t real_tokens, padded_tokens; /* padded = sum of B*T over batches */
    double waste;                        /* 1 - real/padded */
} tk_padding_report;
/* Padding waste of fixed, dynamic and bucketed batching (out[0..2], in that
 * order) for lengths `len` capped at max_len, batch size B, `buckets` buckets,
 * over one epoch with `seed`. */
tk_status tk_padding_waste(const int32_t *len, int n, int max_len, int batch_size, int buckets,
                           uint64_t seed, tk_padding_report out[3], tk_err *err);

/* A seeded generator (splitmix64, gpu/tk_ops_spec.h's rule) shared by
 * split, shuffles, the data generators, weight init and the batch order, so
 * results do not depend on the C library. */
uint64_t tk_rand_next(uint64_t *state);

#ifdef __cplusplus
}
#endif
#endif
