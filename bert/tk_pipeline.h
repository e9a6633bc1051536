/* tk_pipeline.h — the one data pipeline: a config in, what a run needs out.
 *
 * Every command that needs a corpus calls tk_run_data_load: `txk train`,
 * `txk plan`, `txk advise`, `%%txtrain`, `%%txplan`, `%txadvise`, and the
 * tests. It reads what the config names (train_file, dev_file or dev_split,
 * the text / pair / label columns, or SQuAD JSON for task qa), picks the
 * tokenizer (the config's vocab, else the model folder's vocab.txt, else a
 * WordPiece vocabulary learned from the training texts), makes features
 * (max_len, doc_stride) and materialises epoch 0's batches (fixed, dynamic
 * padding or length buckets; eval_batch_size for dev) as the model's
 * tk_batch, so callers hand them straight to tk_train_run. The training loop
 * reshuffles the batches' order per epoch.
 *
 * tk_run_config then gives the config the run will use (the label count from
 * the data), so a plan of a config with a train_file plans the model the run
 * builds.
 *
 * Guarantees: every failure names the file (and line/column where the data
 * module knows it) or the config key, and frees what was built. The same
 * config gives the same token ids, labels and batch boundaries on every call;
 * `digest` fingerprints them so callers can show (and tests can compare)
 * that two commands saw the same data.
 *
 * Ownership: tk_run_data owns everything it points to; tk_run_data_clear
 * frees it (safe on a zeroed or cleared struct).
 */
#ifndef TK_PIPELINE_H
#define TK_PIPELINE_H

#include <stdint.h>
#include "tk_config.h"
#include "tk_gpu.h"
#include "tk_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tk_run_data {
    tk_batch *train, *dev;   /* epoch-0 batches (arrays owned through `priv`) */
    int n_train, n_dev;
    int num_labels;          /* classification: classes in the training data; qa: 2 */
    char **labels;           /* num_labels names in label-id order (classification), or NULL */
    int n_examples, n_dev_examples, n_truncated;
    int32_t *lengths;        /* token length (incl. specials, capped at max_len) per training feature */
    int n_lengths;
    int vocab_size;          /* the tokenizer's */
    int lowercase;           /* the tokenizer lower-cases (and strips accents) */
    char vocab_path[TK_PATH_MAX + 64]; /* the vocab.txt the tokenizer read */
    char vocab_note[1400];   /* where the vocabulary came from, for the user */
    uint64_t digest;         /* FNV-1a over every batch's shape, ids, types, mask, labels, positions */
    void *priv;
} tk_run_data;

/* Builds the data for a run from config `c`. A preset model without a
 * vocabulary gets one learned from the training texts, kept in the user's
 * cache (tk_run_tokenizer; said in vocab_note). Writes nothing the user
 * owns: plans call it too, so output_dir is neither created nor touched.
 * On failure `out` is left cleared. */
tk_status tk_run_data_load(const tk_config *c, tk_run_data *out, tk_err *err);
void tk_run_data_clear(tk_run_data *d);

/* The tokenizer a run of config c uses: c->vocab, else the model folder's
 * vocab.txt, else a WordPiece vocabulary learned from `texts` (n of them,
 * from the file `corpus`), kept as $XDG_CACHE_HOME (else ~/.cache)
 * /txkernel/vocab/txk-vocab-DIGEST.txt (the temp folder when that cannot be
 * made), named by a digest of the texts, the normalizer and the size, and
 * reused. Never written into output_dir: a run's model save copies it there. `path` (pn bytes) gets the vocab.txt read,
 * `note` (note_n bytes) a line for the user. New object or NULL with err.
 * %txdata's report uses it, so its lengths are the run's. */
struct tk_tokenizer;
struct tk_tokenizer *tk_run_tokenizer(const tk_config *c, const char *corpus, const char *const *texts, int n,
                                      char *path, size_t pn, char *note, size_t note_n, tk_err *err);

/* The token lengths of a data file as a run of c tokenizes it: a CSV/TSV/
 * JSONL table's text_col (NULL or "": "text", with pair_col when given), or
 * SQuAD JSON's question + context pairs; the tokenizer is tk_run_tokenizer's
 * for c (c->vocab, the model folder's, or one learned from the texts).
 * Lengths count [CLS]/[SEP] and are not capped. %txdata and the snapshot
 * advisor read data files through it. On failure `out` is left cleared and
 * err names the file (and the missing column with the columns there are). */
typedef struct tk_run_lengths {
    int32_t *len;                      /* n lengths (owned) */
    int n;
    char name[256];                    /* the file as its reader names it */
    char column[160];                  /* "text", or "question + context" */
    char vocab_path[TK_PATH_MAX + 64]; /* the vocab.txt the tokenizer read */
    char vocab_note[1400];             /* where the vocabulary came from */
} tk_run_lengths;
tk_status tk_run_text_lengths(const tk_config *c, const char *path, const char *text_col, const char *pair_col,
                              tk_run_lengths *out, tk_err *err);
void tk_run_lengths_clear(tk_run_lengths *l);

/* The config the run uses: c with the label count taken from the data when
 * the config leaves it to the data (pooled classification, num_labels 0). */
void tk_run_config(const tk_run_data *d, tk_config *c);

/* An evaluation or prediction set: c->train_file read whole (no split;
 * max_examples kept), tokenized as a run of c would be, batched in file
 * order (each batch padded to its longest; eval_batch_size, else
 * batch_size) into d->dev. Classification: when the file has the label
 * column, its labels map onto `labels` (n_labels names in the model's id
 * order; a label outside them is an error naming file and line) and
 * d->num_labels = n_labels; without it every label is -1. qa: SQuAD JSON.
 * On failure `d` is left cleared. */
tk_status tk_run_data_load_eval(const tk_config *c, const char *const *labels, int n_labels, tk_run_data *d,
                                tk_err *err);
/* The feature index of each row of dev batch i (borrowed; NULL out of range),
 * and the example a dev feature comes from (-1 out of range). */
const int32_t *tk_run_data_rows(const tk_run_data *d, int i);
int tk_run_data_example_of(const tk_run_data *d, int feature);

/* qa: a predicted span [start, end] (token positions) of dev feature
 * `feature`, as text of its example's context. */
typedef struct tk_run_span {
    const char *id, *context;    /* the example's (borrowed) */
    int byte_start, byte_end;    /* [start, end) in context; 0, 0 when no answer */
    int char_start, char_end;    /* the same in characters (SQuAD's answer_start); -1 when none */
    const char *const *gold;     /* the example's answers (borrowed) */
    int n_gold;
} tk_run_span;
/* Returns 0 (span filled; an empty span when start/end do not fall on
 * context tokens), or -1 when d is not a qa set or feature is out of range. */
int tk_run_data_span(const tk_run_data *d, int feature, int start, int end, tk_run_span *out);
/* qa: the context byte where token `pos` of dev feature `feature` starts, or
 * -1 for question and special tokens (an answer must start and end on
 * context tokens). */
int tk_run_data_token_byte(const tk_run_data *d, int feature, int pos);

#ifdef __cplusplus
}
#endif
#endif
