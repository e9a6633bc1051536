/* predict.c — predictions and metrics of a model over an evaluation set
 * (tk_predict.h), and the SQuAD v1.1 answer metric.
 *
 * Guarantees: the model's weights are only read; every failure frees what
 * was made and leaves the result cleared; activations are freed after each
 * batch (tk_model_forward_eval), so a prediction's peak is one batch's.
 */
#include "tk_predict.h"
#include "tk_host_mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* HF run_qa.py's max_answer_length */
#define MAX_ANSWER_TOKENS 30

void tk_predict_result_clear(tk_predict_result *r) {
    if (!r) return;
    for (int i = 0; r->answer && i < r->n; i++) free(r->answer[i]);
    for (int i = 0; r->id && i < r->n; i++) free(r->id[i]);
    free(r->answer);
    free(r->pred);
    free(r->probs);
    free(r->logits);
    free(r->gold);
    free(r->char_start);
    free(r->char_end);
    free(r->id);
    free(r->confusion);
    memset(r, 0, sizeof *r);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- classification ------------------------------------------------------- */

static void softmax(const float *l, int k, float *p) {
    float mx = l[0];
    for (int i = 1; i < k; i++) mx = l[i] > mx ? l[i] : mx;
    double s = 0;
    for (int i = 0; i < k; i++) s += exp((double)(l[i] - mx));
    for (int i = 0; i < k; i++) p[i] = (float)(exp((double)(l[i] - mx)) / s);
}

static void classify_metrics(tk_predict_result *r) {
    int K = r->num_labels;
    int64_t correct = 0;
    for (int i = 0; i < r->n; i++) {
        if (r->gold[i] < 0) continue;
        r->n_gold++;
        correct += r->gold[i] == r->pred[i];
        r->confusion[(size_t)r->gold[i] * K + r->pred[i]]++;
    }
    if (!r->n_gold) {
        r->accuracy = r->macro_f1 = NAN;
        return;
    }
    r->accuracy = (double)correct / r->n_gold;
    /* macro F1 over the classes seen in gold or predictions (sklearn's) */
    double f1 = 0;
    int seen = 0;
    for (int k = 0; k < K; k++) {
        int64_t tp = r->confusion[(size_t)k * K + k], fp = 0, fn = 0;
        for (int j = 0; j < K; j++) {
            if (j == k) continue;
            fp += r->confusion[(size_t)j * K + k];
            fn += r->confusion[(size_t)k * K + j];
        }
        if (tp + fp + fn == 0) continue;
        seen++;
        f1 += tp ? 2.0 * tp / (2.0 * tp + fp + fn) : 0.0;
    }
    r->macro_f1 = seen ? f1 / seen : NAN;
}

/* ---- qa --------------------------------------------------------------------- */

typedef struct {
    float score;
    int feature, start, end; /* start < 0: no span found yet */
} best_span;

/* The best span of one feature's logits ([T, 2]: start, end) that starts and
 * ends on context tokens, s <= e < s + 30; better than *b replaces it. */
static void span_of_feature(const tk_run_data *d, int feature, const float *l, int T, const int32_t *mask,
                            best_span *b) {
    for (int s = 1; s < T; s++) {
        if ((mask && !mask[s]) || tk_run_data_token_byte(d, feature, s) < 0) continue;
        for (int e = s; e < T && e < s + MAX_ANSWER_TOKENS; e++) {
            if ((mask && !mask[e]) || tk_run_data_token_byte(d, feature, e) < 0) continue;
            float sc = l[2 * s] + l[2 * e + 1];
            if (b->start < 0 || sc > b->score) *b = (best_span){sc, feature, s, e};
        }
    }
}

/* ---- the run ---------------------------------------------------------------- */

tk_status tk_predict(tk_model *m, const tk_run_data *d, tk_predict_result *r, tk_err *err) {
    memset(r, 0, sizeof *r);
    double t0 = now_s();
    const tk_model_opts *mo = tk_model_opts_of(m);
    r->qa = mo->head == TK_HEAD_SPAN;
    r->num_labels = r->qa ? 0 : mo->num_labels;
    int n = d->n_dev_examples, K = r->num_labels;
    r->n = n;
    int64_t maxl = 0;
    for (int i = 0; i < d->n_dev; i++) {
        int64_t nl = tk_model_n_logits(m, d->dev[i].B, d->dev[i].T);
        maxl = nl > maxl ? nl : maxl;
    }
    float *logits = tk_malloc((size_t)(maxl > 0 ? maxl : 1) * sizeof *logits);
    best_span *best = r->qa ? tk_calloc((size_t)(n > 0 ? n : 1), sizeof *best) : NULL;
    if (r->qa) {
        r->answer = tk_calloc((size_t)(n > 0 ? n : 1), sizeof *r->answer);
        r->char_start = tk_malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
        r->char_end = tk_malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
        r->id = tk_calloc((size_t)(n > 0 ? n : 1), sizeof *r->id);
    } else {
        r->pred = tk_calloc((size_t)(n > 0 ? n : 1), sizeof(int));
        r->gold = tk_malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
        r->probs = tk_calloc((size_t)(n > 0 ? n : 1) * (size_t)(K > 0 ? K : 1), sizeof(float));
        r->logits = tk_calloc((size_t)(n > 0 ? n : 1) * (size_t)(K > 0 ? K : 1), sizeof(float));
        r->confusion = tk_calloc((size_t)(K > 0 ? K * K : 1), sizeof(int64_t));
    }
    tk_status st = TK_OK;
    if (!logits || (r->qa ? !best || !r->answer || !r->char_start || !r->char_end || !r->id
                          : !r->pred || !r->gold || !r->probs || !r->logits || !r->confusion)) {
        tk_err_set(err, TK_ENOMEM, "predict: out of host memory for %d examples", n);
        st = TK_ENOMEM;
        goto out;
    }
    for (int i = 0; r->qa && i < n; i++) best[i].start = -1;
    for (int i = 0; !r->qa && i < n; i++) r->gold[i] = -1;
    double loss_sum = 0;
    int64_t loss_rows = 0;
    for (int i = 0; i < d->n_dev && st == TK_OK; i++) {
        const tk_batch *b = &d->dev[i];
        const int32_t *rows = tk_run_data_rows(d, i);
        float loss = 0;
        if ((st = tk_model_forward_eval(m, b, &loss, logits, err)) != TK_OK) break;
        int labelled = 0;
        for (int row = 0; row < b->B; row++) {
            int ex = tk_run_data_example_of(d, rows ? rows[row] : -1);
            if (ex < 0 || ex >= n) continue;
            if (r->qa) {
                span_of_feature(d, rows[row], logits + (size_t)row * b->T * 2, b->T,
                                b->attention_mask ? b->attention_mask + (size_t)row * b->T : NULL, &best[ex]);
                labelled++;
            } else {
                memcpy(r->logits + (size_t)ex * K, logits + (size_t)row * K, (size_t)K * sizeof(float));
                softmax(logits + (size_t)row * K, K, r->probs + (size_t)ex * K);
                int arg = 0;
                for (int k = 1; k < K; k++)
                    if (r->probs[(size_t)ex * K + k] > r->probs[(size_t)ex * K + arg]) arg = k;
                r->pred[ex] = arg;
                r->gold[ex] = b->labels ? b->labels[row] : -1;
                labelled += r->gold[ex] >= 0;
            }
        }
        loss_sum += (double)loss * labelled;
        loss_rows += labelled;
    }
    if (st != TK_OK) goto out;
    if (r->qa) {
        double em = 0, f1 = 0;
        for (int i = 0; i < n; i++) {
            tk_run_span sp;
            r->char_start[i] = r->char_end[i] = -1;
            if (best[i].start >= 0 && tk_run_data_span(d, best[i].feature, best[i].start, best[i].end, &sp) == 0) {
                size_t k = (size_t)(sp.byte_end - sp.byte_start);
                r->answer[i] = tk_malloc(k + 1);
                if (r->answer[i]) {
                    memcpy(r->answer[i], sp.context + sp.byte_start, k);
                    r->answer[i][k] = 0;
                }
                r->char_start[i] = sp.char_start;
                r->char_end[i] = sp.char_end;
                r->id[i] = sp.id ? tk_strdup(sp.id) : NULL;
                if (sp.n_gold > 0) {
                    r->n_gold++;
                    em += tk_squad_em(r->answer[i] ? r->answer[i] : "", sp.gold, sp.n_gold);
                    f1 += tk_squad_f1(r->answer[i] ? r->answer[i] : "", sp.gold, sp.n_gold);
                }
            }
            if (!r->answer[i]) r->answer[i] = tk_strdup("");
        }
        r->exact_match = r->n_gold ? 100.0 * em / r->n_gold : NAN;
        r->f1 = r->n_gold ? 100.0 * f1 / r->n_gold : NAN;
    } else {
        classify_metrics(r);
    }
    r->loss = loss_rows ? loss_sum / (double)loss_rows : NAN;
    r->seconds = now_s() - t0;
out:
    free(logits);
    free(best);
    if (st != TK_OK) tk_predict_result_clear(r);
    return st;
}

/* ---- the SQuAD v1.1 metric --------------------------------------------------- */

static int is_ascii_punct(int32_t c) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}

static int is_space(int32_t c) {
    if (c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f) || c == 0x85) return 1;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

/* Python's \w: letters, digits (any script) and '_' */
static int is_word(int32_t c) {
    if (c == '_') return 1;
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO ? 1
         : k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}

/* Normalised answer as tokens: decoded to code points, lower-cased,
 * punctuation dropped, articles dropped (a word of a/an/the between
 * non-word characters), split on whitespace. *ntok tokens, each [start,
 * len) into the returned code point array (new; free()). */
typedef struct { int start, len; } span;
static int32_t *normalise(const char *s, span **toks, int *ntok) {
    size_t n = strlen(s);
    int32_t *cp = tk_malloc((n + 1) * sizeof *cp);
    *toks = NULL;
    *ntok = 0;
    if (!cp) return NULL;
    int k = 0, m = 0;
    for (size_t i = 0; i < n;) { /* decode */
        int32_t c;
        utf8proc_ssize_t w = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
        if (w <= 0) { /* not UTF-8: keep the byte */
            c = (unsigned char)s[i];
            w = 1;
        }
        i += (size_t)w;
        cp[m++] = c;
    }
    for (int i = 0; i < m; i++) { /* lower case (Python's, with its final sigma), drop punctuation */
        int32_t c = cp[i];
        int final_sigma = c == 0x03A3 && i > 0 && is_word(cp[i - 1]) && !(i + 1 < m && is_word(cp[i + 1]));
        c = final_sigma ? 0x03C2 : utf8proc_tolower(c);
        if (!is_ascii_punct(c)) cp[k++] = c;
    }
    /* articles: word runs equal to a / an / the become a space */
    for (int i = 0; i < k;) {
        if (!is_word(cp[i])) {
            i++;
            continue;
        }
        int j = i;
        while (j < k && is_word(cp[j])) j++;
        int L = j - i;
        if ((L == 1 && cp[i] == 'a') || (L == 2 && cp[i] == 'a' && cp[i + 1] == 'n') ||
            (L == 3 && cp[i] == 't' && cp[i + 1] == 'h' && cp[i + 2] == 'e'))
            for (int t = i; t < j; t++) cp[t] = ' ';
        i = j;
    }
    *toks = tk_malloc((size_t)(k + 1) * sizeof **toks);
    if (!*toks) {
        free(cp);
        return NULL;
    }
    for (int i = 0; i < k;) {
        if (is_space(cp[i])) {
            i++;
            continue;
        }
        int j = i;
        while (j < k && !is_space(cp[j])) j++;
        (*toks)[(*ntok)++] = (span){i, j - i};
        i = j;
    }
    return cp;
}

static int tok_eq(const int32_t *a, span x, const int32_t *b, span y) {
    return x.len == y.len && !memcmp(a + x.start, b + y.start, (size_t)x.len * sizeof *a);
}

/* f1 (em = 0) or exact match (em = 1) of one pair */
static double score_one(const char *pred, const char *gold, int em) {
    span *pt = NULL, *gt = NULL;
    int np = 0, ng = 0;
    int32_t *p = normalise(pred, &pt, &np), *g = normalise(gold, &gt, &ng);
    double out = 0;
    if (p && g) {
        if (em) {
            out = np == ng;
            for (int i = 0; out && i < np; i++) out = tok_eq(p, pt[i], g, gt[i]);
        } else {
            /* common tokens as multisets (Counter & Counter) */
            char *used = tk_calloc((size_t)(ng + 1), 1);
            int common = 0;
            for (int i = 0; used && i < np; i++)
                for (int j = 0; j < ng; j++)
                    if (!used[j] && tok_eq(p, pt[i], g, gt[j])) {
                        used[j] = 1;
                        common++;
                        break;
                    }
            free(used);
            if (common > 0) {
                double prec = (double)common / np, rec = (double)common / ng;
                out = 2 * prec * rec / (prec + rec);
            }
        }
    }
    free(p);
    free(g);
    free(pt);
    free(gt);
    return out;
}

/* the best score over the gold answers (0 when there are none) */
static double best_over(const char *pred, const char *const *gold, int n_gold, int em) {
    double best = 0;
    for (int i = 0; i < n_gold; i++) {
        double s = score_one(pred, gold[i], em);
        best = s > best ? s : best;
    }
    return best;
}

double tk_squad_em(const char *pred, const char *const *gold, int n_gold) { return best_over(pred, gold, n_gold, 1); }
double tk_squad_f1(const char *pred, const char *const *gold, int n_gold) { return best_over(pred, gold, n_gold, 0); }
