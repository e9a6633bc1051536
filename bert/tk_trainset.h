/* tk_trainset.h — the data of one run, ready for the training loop.
 *
 * Reads what the config names (train_file, dev_file or a dev_split; text /
 * pair / label columns, or SQuAD JSON for task qa), tokenizes with the
 * config's vocabulary (vocab, or the model folder's vocab.txt), makes
 * features (max_len, doc_stride) and batches them (fixed, dynamic or
 * buckets; eval_batch_size for dev), all through bert/tk_data.h. The batches
 * of one epoch are materialised once; the loop reshuffles their order.
 *
 * This header includes neither tk_data.h nor tk_model.h, so code on the
 * model side (tk_train_config) can use it: the batches come out as plain
 * host arrays (tk_hostbatch), borrowed from the tk_trainset.
 */
#ifndef TK_TRAINSET_H
#define TK_TRAINSET_H

#include <stdint.h>
#include "tk_gpu.h"
#include "tk_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One batch, host int32 row-major [B, T] (labels / positions [B]). */
typedef struct tk_hostbatch {
    int B, T;
    const int32_t *input_ids, *token_type_ids, *attention_mask;
    const int32_t *labels;                          /* classification, or NULL */
    const int32_t *start_positions, *end_positions; /* qa, or NULL */
    const int32_t *feature;                         /* [B]: feature index of each row */
} tk_hostbatch;

typedef struct tk_trainset tk_trainset;

/* Loads and batches the config's data. New object or NULL with err (which
 * names the file, line and column the data engineer's readers report, or the
 * config key that is missing). */
tk_trainset *tk_trainset_load(const tk_config *c, tk_err *err);
void tk_trainset_destroy(tk_trainset **p);

int tk_trainset_num_labels(const tk_trainset *s);   /* classification; 2 for qa */
const char *tk_trainset_label(const tk_trainset *s, int i); /* borrowed */
int tk_trainset_vocab_size(const tk_trainset *s);
int tk_trainset_n_examples(const tk_trainset *s, int dev);
/* Batches per epoch of train (dev = 0) or dev (dev = 1), and batch i. */
int tk_trainset_n_batches(const tk_trainset *s, int dev);
const tk_hostbatch *tk_trainset_batch(const tk_trainset *s, int dev, int i);
/* Token lengths of the training features (for the planner's worst case). */
const int32_t *tk_trainset_lengths(const tk_trainset *s, int *n);

/* QA: the text of a predicted span [start, end] (token positions) of dev
 * feature `feature`, copied into buf (""-terminated; "" for no answer), and
 * the gold answers of its example: *gold (borrowed) and *n_gold. Returns 0,
 * or -1 when not a QA set. */
int tk_trainset_span_text(const tk_trainset *s, int feature, int start, int end, char *buf,
                          size_t n, const char *const **gold, int *n_gold);

#ifdef __cplusplus
}
#endif
#endif
