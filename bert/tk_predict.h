/* tk_predict.h — using a fine-tuned model: predictions and metrics over a set.
 *
 * tk_predict runs the model in eval mode (no dropout, no gradients) over an
 * evaluation set from the pipeline (tk_run_data_load_eval) and gives, per
 * example, what transformers' pipelines give: for classification the label
 * (names from the model's id2label) and every class probability; for qa the
 * answer text with its character span in the context. With gold labels:
 * accuracy, macro F1 (over classes seen in gold or predictions, as sklearn)
 * and the confusion matrix; with gold answers: exact match and F1 as the
 * official SQuAD v1.1 script defines them (tk_squad_em / tk_squad_f1).
 *
 * Ownership: the result owns its arrays (tk_predict_result_clear).
 */
#ifndef TK_PREDICT_H
#define TK_PREDICT_H

#include "tk_model.h"
#include "tk_pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tk_predict_result {
    int n;                   /* examples */
    int qa;                  /* 1: span answers, 0: classes */
    int num_labels;
    int *pred;               /* n: class id (classification) */
    float *probs;            /* n * num_labels */
    float *logits;           /* n * num_labels: the head's output, before the softmax */
    int *gold;               /* n: gold class id, -1 when the example has none */
    char **answer;           /* n (qa): answer text, "" for none */
    int *char_start, *char_end; /* n (qa): [start, end) in the context's characters, -1 for none */
    char **id;               /* n (qa): the example ids */
    int n_gold;              /* examples with a gold label / gold answers */
    double accuracy, macro_f1;
    int64_t *confusion;      /* num_labels^2, row = gold, column = predicted */
    double exact_match, f1;  /* qa, in percent */
    double loss;             /* mean loss over examples with gold (NAN when none) */
    double seconds;
} tk_predict_result;

tk_status tk_predict(tk_model *m, const tk_run_data *d, tk_predict_result *r, tk_err *err);
void tk_predict_result_clear(tk_predict_result *r);

/* SQuAD v1.1: answers normalised (lower case, ASCII punctuation removed,
 * articles a/an/the removed, whitespace collapsed); EM is 1 when the
 * normalised strings are equal; F1 is the token overlap's harmonic mean of
 * precision and recall. Both take the best over the gold answers (0 when
 * there are none). */
double tk_squad_em(const char *pred, const char *const *gold, int n_gold);
double tk_squad_f1(const char *pred, const char *const *gold, int n_gold);

#ifdef __cplusplus
}
#endif
#endif
