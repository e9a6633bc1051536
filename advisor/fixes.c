/* fixes.c — the catalogue of fixes: one table, one row per kind.
 *
 * A row (tk_fix_def) holds everything the advisor knows of a kind: its name,
 * the pure function config -> config that applies it, which fixes of the
 * kind are worth planning for a given input, its label in the ranked table,
 * the risk to results, what it frees outside the config, whether it is
 * combined with others. Adding a fix is one row here and its functions;
 * tk_fix_register adds a row at run time (a test, an extension), and the
 * search plans and ranks it like the built-in ones.
 *
 * The built-in rows are in tk_fix_kind's order, which is also the order the
 * search proposes them in (it decides which pairs and triples are tried
 * first under the plan budget).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_advisor.h"
#include "tk_attn_kernel.h"
#include "tk_host_mem.h"
#include "tk_advisor_impl.h"

/* ---- corpus and model helpers (shared with advisor.c) ---------------------- */

/* Nearest-rank: the smallest length v with at least ceil(q n) lengths <= v,
 * found by bisection over the values so that it needs no sorted copy (and
 * cannot run out of host memory, which would make a diagnosis quietly 0). */
int tk_adv_quantile(const int32_t *len, int n, double q) {
    if (!len || n <= 0)
        return 0;
    int64_t rank = (int64_t)ceil(q * n);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    int32_t lo = len[0], hi = len[0];
    for (int i = 1; i < n; i++) {
        lo = len[i] < lo ? len[i] : lo;
        hi = len[i] > hi ? len[i] : hi;
    }
    while (lo < hi) {
        int32_t mid = lo + (int32_t)(((int64_t)hi - lo) / 2);
        int64_t k = 0;
        for (int i = 0; i < n; i++)
            k += len[i] <= mid;
        if (k >= rank)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

double tk_adv_share_longer(const int32_t *len, int n, int max_len) {
    int k = 0;
    for (int i = 0; i < n; i++)
        k += len[i] > max_len;
    return n ? (double)k / n : 0.0;
}

int tk_adv_round_up8(int x) { return (x + 7) / 8 * 8; }

tk_config tk_adv_dims_of(const tk_config *c) {
    tk_config d = *c;
    tk_err e;
    if (d.hidden <= 0 || d.layers <= 0 || d.vocab_size <= 0)
        if (tk_config_resolve_model(&d, &e) != TK_OK)
            d = *c;
    return d;
}

/* ---- the rows' functions, kind by kind ------------------------------------- */

#define PROPOSE(F) do { if (n < max) out[n++] = (F); } while (0)

/* release: what an earlier run and PyTorch in this process hold */
static int release_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (f->release & TK_RELEASE_IN_PROCESS)
        snprintf(reason, rn, "%sfree what PyTorch's caching allocator holds in this process: in Python, "
                 "del the models and tensors you no longer need; gc.collect(); torch.cuda.empty_cache()",
                 f->release & TK_RELEASE_SESSION ? "release the earlier run (%txreset) and " : "");
    else
        snprintf(reason, rn, "release what the earlier run still holds (%%txreset) before training");
    return 0;
}
static int release_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0;
    if (in->held_by_session || in->held_in_process)
        PROPOSE(((tk_fix){ .kind = TK_FIX_RELEASE,
                           .release = (in->held_by_session ? TK_RELEASE_SESSION : 0u) |
                                      (in->held_in_process ? TK_RELEASE_IN_PROCESS : 0u) }));
    return n;
}
static void release_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    unsigned both = TK_RELEASE_SESSION | TK_RELEASE_IN_PROCESS;
    snprintf(o, n, "%s", (f->release & both) == both ? "release: %txreset + free PyTorch's cache"
                         : f->release & TK_RELEASE_IN_PROCESS ? "release: free PyTorch's cache" : "release");
}
static size_t release_frees(const tk_fix *f, const tk_advise_input *in) {
    return (f->release & TK_RELEASE_SESSION ? in->held_by_session : 0) +
           (f->release & TK_RELEASE_IN_PROCESS ? in->held_in_process : 0);
}

/* head: the task's per-token or pooled head instead of flatten_dense */
static int head_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (c->head != TK_HEAD_FLATTEN_DENSE)
        return -1;
    c->head = c->task == TK_TASK_QA ? TK_HEAD_SPAN : TK_HEAD_POOLED;
    snprintf(reason, rn, "%s head instead of a Dense layer over the flattened sequence",
             c->task == TK_TASK_QA ? "per-token span (start/end)" : "pooled [CLS]");
    return 0;
}
static int head_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0;
    if (in->config->head == TK_HEAD_FLATTEN_DENSE)
        PROPOSE(((tk_fix){ .kind = TK_FIX_HEAD }));
    return n;
}
static void head_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    snprintf(o, n, "%s head", fixed->head == TK_HEAD_SPAN ? "span" : "pooled");
}
/* the per-token head is the task's standard one, and a fine-tune trains the
 * head from scratch either way: little at stake */
static double head_risk(const tk_fix *f, const tk_config *fixed, const int32_t *len, int nl, char *w, size_t wn) {
    snprintf(w, wn, "a different head (the task's standard one)");
    return 0.01;
}

/* max_len: from the corpus percentiles */
static int max_len_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (!len || nl <= 0 || f->value <= 0 || f->value >= c->max_len)
        return -1;
    double cut = 100.0 * tk_adv_share_longer(len, nl, f->value);
    snprintf(reason, rn, "max_len %d -> %d: truncates %.1f%% of the %d examples", c->max_len, f->value, cut, nl);
    c->max_len = f->value;
    return 0;
}
static int max_len_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0;
    if (!in->lengths || in->n_lengths <= 0)
        return 0;
    int p99 = tk_adv_round_up8(tk_adv_quantile(in->lengths, in->n_lengths, 0.99));
    int p95 = tk_adv_round_up8(tk_adv_quantile(in->lengths, in->n_lengths, 0.95));
    if (p99 < in->config->max_len)
        PROPOSE(((tk_fix){ .kind = TK_FIX_MAX_LEN, .value = p99 }));
    if (p95 < p99)
        PROPOSE(((tk_fix){ .kind = TK_FIX_MAX_LEN, .value = p95 }));
    return n;
}
static void max_len_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    snprintf(o, n, "max_len %d", f->value);
}
static double max_len_risk(const tk_fix *f, const tk_config *fixed, const int32_t *len, int nl, char *w, size_t wn) {
    double r = tk_adv_share_longer(len, nl, f->value);
    snprintf(w, wn, "truncates %.1f%% of examples", 100 * r);
    return r;
}

/* padding: dynamic padding or length buckets */
static int padding_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (c->batching != TK_BATCH_FIXED || !len || nl <= 0 || f->batching == TK_BATCH_FIXED)
        return -1;
    c->batching = f->batching;
    if (f->batching == TK_BATCH_BUCKETS && c->buckets <= 0)
        c->buckets = 8;
    snprintf(reason, rn, "%s: pad each batch to its longest example, not to max_len",
             f->batching == TK_BATCH_BUCKETS ? "length buckets" : "dynamic padding");
    return 0;
}
static int padding_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0;
    if (in->lengths && in->n_lengths > 0 && in->config->batching == TK_BATCH_FIXED) {
        PROPOSE(((tk_fix){ .kind = TK_FIX_PADDING, .batching = TK_BATCH_DYNAMIC }));
        PROPOSE(((tk_fix){ .kind = TK_FIX_PADDING, .batching = TK_BATCH_BUCKETS }));
    }
    return n;
}
static void padding_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    snprintf(o, n, "%s", f->batching == TK_BATCH_BUCKETS ? "length buckets" : "dynamic padding");
}

/* precision: fp16 or bf16 mixed precision */
static int precision_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (c->precision != TK_PREC_FP32 || f->precision == TK_PREC_FP32)
        return -1;
    int bf16 = f->precision == TK_PREC_BF16;
    c->precision = f->precision;
    /* without tensor cores (K80, P4, P100) 16-bit GEMMs still run at the fp32 rate */
    const tk_gpu_profile *gp = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    int slow = gp && (bf16 ? gp->bf16_flops <= 1.5 * gp->fp32_flops : !tk_gpu_profile_fast_fp16(gp));
    snprintf(reason, rn, "%s mixed precision: 16-bit activations, fp32 master weights%s%s%s%s",
             bf16 ? "bf16" : "fp16", bf16 ? "" : ", dynamic loss scaling", slow ? "; on a " : "",
             slow ? gp->name : "", slow ? " it saves memory but no time (no tensor cores)" : "");
    return 0;
}
static int precision_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0;
    const tk_config *c = in->config;
    if (c->precision != TK_PREC_FP32)
        return 0;
    PROPOSE(((tk_fix){ .kind = TK_FIX_PRECISION, .precision = TK_PREC_FP16 }));
    const tk_gpu_profile *g = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    if (!g || g->cc_major >= 8) /* bf16 tensor cores need Ampere or newer */
        PROPOSE(((tk_fix){ .kind = TK_FIX_PRECISION, .precision = TK_PREC_BF16 }));
    return n;
}
static void precision_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    snprintf(o, n, "%s", f->precision == TK_PREC_BF16 ? "bf16" : "fp16");
}
static double precision_risk(const tk_fix *f, const tk_config *fixed, const int32_t *len, int nl, char *w,
                             size_t wn) {
    snprintf(w, wn, "%s rounding", f->precision == TK_PREC_BF16 ? "bf16" : "fp16 range and");
    return f->precision == TK_PREC_BF16 ? 0.01 : 0.02;
}

/* accumulate: k micro-batches of batch/k, the same effective batch */
static int accumulate_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    int k = f->value;
    int acc = c->accumulate > 1 ? c->accumulate : 1;
    if (k < 2 || c->batch_size % k != 0 || c->batch_size / k < 1)
        return -1;
    snprintf(reason, rn, "batch %d -> %d micro-batches of %d, accumulate %d: same effective batch %d",
             c->batch_size, k, c->batch_size / k, acc * k, c->batch_size * acc);
    c->batch_size /= k;
    c->accumulate = acc * k;
    return 0;
}
static int accumulate_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0;
    for (int k = 2; k <= 8; k *= 2)
        if (in->config->batch_size % k == 0)
            PROPOSE(((tk_fix){ .kind = TK_FIX_ACCUMULATE, .value = k }));
    return n;
}
static void accumulate_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    snprintf(o, n, "accumulate x%d", f->value);
}

/* switches: one config setting from its default to the saving one */
static int recompute_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (c->recompute != TK_RECOMPUTE_NONE)
        return -1;
    c->recompute = TK_RECOMPUTE_LAYERS;
    snprintf(reason, rn, "recompute each encoder layer in backward, keeping only its input");
    return 0;
}
static int attention_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (c->engine == TK_ENGINE_PYTORCH) { /* transformers' attn_implementation, not txkernel's attention key */
        if (c->attn_implementation != TK_ATTN_IMPL_EAGER)
            return -1;
        c->attn_implementation = TK_ATTN_IMPL_SDPA;
        snprintf(reason, rn, "SDPA attention (attn_implementation sdpa): no L x L probabilities kept for backward "
                 "where its memory-efficient kernel runs");
        return 0;
    }
    /* auto on a card is fused already; on the cpu it is standard */
    if (tk_config_attention(c, TK_DEV_META, NULL) != TK_ATTN_STANDARD)
        return -1;
    c->attention = TK_ATTN_FUSED;
    /* on a named card: the kernel that will run it (gpu/tk_attn_kernel.h), as the plan says */
    const tk_gpu_profile *p = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    char k[192] = "";
    if (p)
        tk_attn_kernel_line(k, sizeof k, p->cc_major, p->cc_minor,
                            c->precision == TK_PREC_FP16 ? TK_F16 : c->precision == TK_PREC_BF16 ? TK_BF16 : TK_F32,
                            c->hidden > 0 && c->heads > 0 ? c->hidden / c->heads : 0,
                            tk_attn_kernel_ask(getenv(TK_ATTN_KERNEL_ENV)));
    snprintf(reason, rn, "memory-efficient attention: no L x L probabilities kept for backward%s%s%s%s",
             p ? "; on " : "", p ? p->name : "", p ? " it runs on " : "", k);
    return 0;
}
static void attention_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    snprintf(o, n, "%s", fixed->engine == TK_ENGINE_PYTORCH ? "sdpa attention" : "fused attention");
}
static int optim8_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (c->optimizer == TK_OPTIM_ADAMW8)
        return -1;
    c->optimizer = TK_OPTIM_ADAMW8;
    snprintf(reason, rn, "8-bit AdamW: block-quantised moments, about 6 bytes less per parameter");
    return 0;
}
static double optim8_risk(const tk_fix *f, const tk_config *fixed, const int32_t *len, int nl, char *w, size_t wn) {
    snprintf(w, wn, "quantised optimizer state");
    return 0.02;
}
static int freeze_emb_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (c->freeze_embeddings)
        return -1;
    c->freeze_embeddings = 1;
    snprintf(reason, rn, "freeze the embeddings: no gradient or optimizer state for them");
    return 0;
}
static int empty_cache_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (c->empty_cache == TK_EMPTY_EVERY && c->empty_cache_every == 1)
        return -1;
    c->empty_cache = TK_EMPTY_EVERY;
    c->empty_cache_every = 1;
    snprintf(reason, rn, "return cached free segments to the device after every step");
    return 0;
}
/* proposes the kind's one fix, no parameter */
#define ALWAYS(NAME, KIND) \
    static int NAME(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) { \
        (void)self, (void)in; \
        if (max < 1) return 0; \
        out[0] = (tk_fix){ .kind = (KIND) }; \
        return 1; \
    }
ALWAYS(recompute_propose, TK_FIX_RECOMPUTE)
ALWAYS(attention_propose, TK_FIX_ATTENTION)
ALWAYS(optim8_propose, TK_FIX_OPTIM8)
ALWAYS(freeze_emb_propose, TK_FIX_FREEZE_EMB)
#undef ALWAYS
static int empty_cache_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0;
    if (in->oom) /* the cache matters only once a run has met it */
        PROPOSE(((tk_fix){ .kind = TK_FIX_EMPTY_CACHE }));
    return n;
}

/* freeze layers: the lower half of the encoder */
static int freeze_layers_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    int layers = tk_adv_dims_of(c).layers;
    if (f->value <= c->freeze_layers || f->value >= layers)
        return -1;
    c->freeze_layers = f->value;
    snprintf(reason, rn, "freeze the first %d of %d encoder layers", f->value, layers);
    return 0;
}
static int freeze_layers_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0, layers = tk_adv_dims_of(in->config).layers;
    if (layers >= 2)
        PROPOSE(((tk_fix){ .kind = TK_FIX_FREEZE_LAYERS, .value = layers / 2 }));
    return n;
}
static void freeze_layers_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    snprintf(o, n, "freeze %d layers", f->value);
}
/* the share of the weights frozen (embeddings or f->value layers) */
static double freeze_risk(const tk_fix *f, const tk_config *fixed, const int32_t *len, int nl, char *w, size_t wn) {
    tk_config d = tk_adv_dims_of(fixed);
    double H = d.hidden, L = d.layers;
    double emb = (d.vocab_size + d.max_position + d.type_vocab + 2) * H;
    double layer = 4 * H * H + 2 * H * d.intermediate + 9 * H + d.intermediate;
    double total = emb + L * layer;
    double frozen = f->kind == TK_FIX_FREEZE_EMB ? emb : f->value * layer;
    double r = total > 0 ? frozen / total : 0;
    snprintf(w, wn, "%.0f%% of weights frozen", 100 * r);
    return r;
}

/* eval batch and batch: halved */
static int eval_batch_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    int eb = c->eval_batch_size > 0 ? c->eval_batch_size : c->batch_size;
    if (f->value <= 0 || f->value >= eb)
        return -1;
    snprintf(reason, rn, "eval batch %d -> %d", eb, f->value);
    c->eval_batch_size = f->value;
    return 0;
}
static int eval_batch_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0;
    const tk_config *c = in->config;
    int eb = c->eval_batch_size > 0 ? c->eval_batch_size : c->batch_size;
    if (eb > 1)
        PROPOSE(((tk_fix){ .kind = TK_FIX_EVAL_BATCH, .value = eb / 2 }));
    return n;
}
static void eval_batch_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    snprintf(o, n, "eval batch %d", f->value);
}
static int batch_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    if (f->value <= 0 || f->value >= c->batch_size)
        return -1;
    snprintf(reason, rn, "batch %d -> %d (changes the effective batch; retune lr)", c->batch_size, f->value);
    c->batch_size = f->value;
    return 0;
}
static int batch_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0;
    if (in->config->batch_size > 1)
        PROPOSE(((tk_fix){ .kind = TK_FIX_BATCH, .value = in->config->batch_size / 2 }));
    return n;
}
static void batch_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    snprintf(o, n, "batch %d", f->value);
}
static double batch_risk(const tk_fix *f, const tk_config *fixed, const int32_t *len, int nl, char *w, size_t wn) {
    snprintf(w, wn, "effective batch changes");
    return 0.10;
}
/* data parallel: the config's platform has two of its card (gpu: t4x2, or
 * --for kaggle with gpu: t4): the global batch kept by halving the
 * per-rank batch (or accumulate). Engine txkernel: world_size with AdamW's
 * state (zero 1) or the gradients too (zero 2) sharded; txkernel plans it
 * but does not start several GPUs on cuda (plan only, with the PyTorch
 * recipe in its code). Engine pytorch: the pair's profile and how PyTorch
 * splits the step (parallel: dataparallel, ddp, zero2). */
static const tk_gpu_profile *pair_on_platform(const tk_advise_input *in) {
    const tk_config *c = in->config;
    const tk_gpu_profile *card = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    if (!card)
        return NULL;
    if (card->gpus > 1)
        return card;
    const char *plat = in->platform ? in->platform : tk_gpu_platform_of(card);
    const tk_gpu_profile *cards[32], *best = NULL;
    int n = plat ? tk_gpu_platform_cards(plat, cards, 32) : 0;
    size_t len = strlen(card->name);
    for (int i = 0; i < n; i++) /* the same card, several of it: "t4" -> "t4x2" */
        if (cards[i]->gpus > (best ? best->gpus : 1) && strncmp(cards[i]->name, card->name, len) == 0 &&
            cards[i]->name[len] == 'x')
            best = cards[i];
    return best;
}
/* More ranks keep the global batch: accumulate or the batch divided. */
static int keep_global_batch(tk_config *c, int more) {
    int acc = c->accumulate > 1 ? c->accumulate : 1;
    if (acc % more == 0)
        c->accumulate = acc / more;
    else if (c->batch_size % more == 0)
        c->batch_size /= more;
    else if (more > 1)
        return -1; /* the global batch could not be kept */
    return 0;
}
static const char *const PARALLEL_WORDS[] = {"DataParallel", "DDP", "ZeRO-2"};
static int data_parallel_apply(tk_config *c, const tk_fix *f, const int32_t *len, int nl, char *reason, size_t rn) {
    int w = f->value, w0 = tk_config_world_size(c);
    if (c->engine == TK_ENGINE_PYTORCH) {
        /* the pair's profile, named by value; already on it with this split: nothing to do */
        const tk_gpu_profile *card = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL, *pair = NULL;
        for (int i = 0; card && tk_gpu_profile_at(i); i++) {
            const tk_gpu_profile *p = tk_gpu_profile_at(i);
            size_t l = strlen(card->name);
            if (p->gpus == w && !strncmp(p->name, card->name, l) && p->name[l] == 'x') pair = p;
        }
        if (card && card->gpus == w) pair = card;
        if (!pair || w < 2 || (unsigned)f->parallel > TK_PAR_ZERO2 || (w == w0 && f->parallel == c->parallel) ||
            w % w0 || keep_global_batch(c, w / w0))
            return -1;
        memset(c->gpu, 0, sizeof c->gpu);
        snprintf(c->gpu, sizeof c->gpu, "%s", pair->name);
        c->parallel = f->parallel;
        snprintf(reason, rn, "%s on %d GPUs (%s): per-GPU batch %d x accumulate %d x %d GPUs keeps the global batch %d",
                 PARALLEL_WORDS[f->parallel], w, pair->name, c->batch_size, c->accumulate > 1 ? c->accumulate : 1, w,
                 c->batch_size * (c->accumulate > 1 ? c->accumulate : 1) * w);
        return 0;
    }
    if (w < 2 || f->zero < 0 || f->zero > 2 || (w == w0 && f->zero <= c->zero) || w % w0)
        return -1;
    if (keep_global_batch(c, w / w0))
        return -1;
    c->world_size = w;
    c->zero = f->zero;
    snprintf(reason, rn, "world_size %d, zero %d: each GPU holds %s; batch_size %d per rank x accumulate %d x %d "
             "ranks keeps the global batch %d%s", w, f->zero,
             f->zero == 1 ? "1/2 of AdamW's state" : "1/2 of AdamW's state and of the gradients", c->batch_size,
             c->accumulate > 1 ? c->accumulate : 1, w, c->batch_size * (c->accumulate > 1 ? c->accumulate : 1) * w,
             tk_config_plan_only(c) ? "; plan only: txkernel does not start several GPUs on cuda, its code gives the "
                                      "PyTorch recipe for the same split" : "");
    return 0;
}
static int data_parallel_propose(tk_fix_kind self, const tk_advise_input *in, tk_fix *out, int max) {
    int n = 0;
    const tk_gpu_profile *pair = pair_on_platform(in);
    if (!pair || pair->gpus < 2)
        return 0;
    if (in->config->engine == TK_ENGINE_PYTORCH)
        for (int p = TK_PAR_DATAPARALLEL; p <= TK_PAR_ZERO2; p++)
            PROPOSE(((tk_fix){ .kind = TK_FIX_DATA_PARALLEL, .value = pair->gpus, .parallel = (tk_parallel)p }));
    else
        for (int z = 1; z <= 2; z++)
            PROPOSE(((tk_fix){ .kind = TK_FIX_DATA_PARALLEL, .value = pair->gpus, .zero = z }));
    return n;
}
static void data_parallel_label(const tk_fix *f, const tk_config *fixed, char *o, size_t n) {
    if (fixed->engine == TK_ENGINE_PYTORCH)
        snprintf(o, n, "%d GPUs, %s", f->value, PARALLEL_WORDS[(unsigned)f->parallel <= 2 ? f->parallel : 0]);
    else
        snprintf(o, n, "world_size %d, zero %d%s", f->value, f->zero, tk_config_plan_only(fixed) ? " (plan only on cuda)" : "");
}
#undef PROPOSE

/* ---- the table --------------------------------------------------------------- */

/* A kind that stands alone (not combined): release is an action, batch and
 * eval_batch change what is trained or measured, empty_cache only reorders
 * the cache. */
static tk_fix_def FIXES[TK_FIX_MAX_KINDS] = {
    [TK_FIX_RELEASE] = { .name = "release", .apply = release_apply, .propose = release_propose,
                         .label = release_label, .frees = release_frees, .action_only = 1 },
    [TK_FIX_HEAD] = { .name = "head", .apply = head_apply, .propose = head_propose, .label = head_label,
                      .risk = head_risk, .combinable = 1 },
    [TK_FIX_MAX_LEN] = { .name = "max_len", .apply = max_len_apply, .propose = max_len_propose,
                         .label = max_len_label, .risk = max_len_risk, .combinable = 1 },
    [TK_FIX_PADDING] = { .name = "padding", .apply = padding_apply, .propose = padding_propose,
                         .label = padding_label, .combinable = 1 },
    [TK_FIX_PRECISION] = { .name = "precision", .apply = precision_apply, .propose = precision_propose,
                           .label = precision_label, .risk = precision_risk, .combinable = 1 },
    [TK_FIX_ACCUMULATE] = { .name = "accumulate", .apply = accumulate_apply, .propose = accumulate_propose,
                            .label = accumulate_label, .combinable = 1 },
    [TK_FIX_RECOMPUTE] = { .name = "recompute", .apply = recompute_apply, .propose = recompute_propose,
                           .combinable = 1 },
    [TK_FIX_ATTENTION] = { .name = "attention", .apply = attention_apply, .propose = attention_propose,
                           .label = attention_label, .combinable = 1 },
    [TK_FIX_OPTIM8] = { .name = "adamw8bit", .apply = optim8_apply, .propose = optim8_propose,
                        .risk = optim8_risk, .combinable = 1 },
    [TK_FIX_FREEZE_EMB] = { .name = "freeze embeddings", .apply = freeze_emb_apply,
                            .propose = freeze_emb_propose, .risk = freeze_risk, .combinable = 1 },
    [TK_FIX_FREEZE_LAYERS] = { .name = "freeze layers", .apply = freeze_layers_apply,
                               .propose = freeze_layers_propose, .label = freeze_layers_label,
                               .risk = freeze_risk, .combinable = 1 },
    [TK_FIX_EMPTY_CACHE] = { .name = "empty_cache", .apply = empty_cache_apply, .propose = empty_cache_propose },
    [TK_FIX_EVAL_BATCH] = { .name = "eval_batch_size", .apply = eval_batch_apply, .propose = eval_batch_propose,
                            .label = eval_batch_label },
    [TK_FIX_BATCH] = { .name = "batch_size", .apply = batch_apply, .propose = batch_propose,
                       .label = batch_label, .risk = batch_risk },
    [TK_FIX_DATA_PARALLEL] = { .name = "data_parallel", .apply = data_parallel_apply,
                               .propose = data_parallel_propose, .label = data_parallel_label, .combinable = 1 },
};
static int n_fixes = TK_FIX_COUNT;

int tk_fix_register(const tk_fix_def *d) {
    if (!d || !d->name || !d->apply || n_fixes >= TK_FIX_MAX_KINDS)
        return -1;
    FIXES[n_fixes] = *d;
    return n_fixes++;
}

int tk_fix_n_kinds(void) { return n_fixes; }

const tk_fix_def *tk_fix_def_of(tk_fix_kind k) {
    return (unsigned)k < (unsigned)n_fixes ? &FIXES[k] : NULL;
}

const char *tk_fix_name(tk_fix_kind k) {
    const tk_fix_def *d = tk_fix_def_of(k);
    return d ? d->name : "?";
}

int tk_fix_apply(tk_config *c, const tk_fix *f, const int32_t *lengths, int n_lengths, char *reason, size_t rn) {
    const tk_fix_def *d = tk_fix_def_of(f->kind);
    return d ? d->apply(c, f, lengths, n_lengths, reason, rn) : -1;
}

void tk_fix_label(const tk_fix *f, const tk_config *fixed, char *out, size_t n) {
    const tk_fix_def *d = tk_fix_def_of(f->kind);
    if (d && d->label)
        d->label(f, fixed, out, n);
    else
        snprintf(out, n, "%s", d ? d->name : "?");
}

const char *tk_fix_param(const tk_fix *f, char *buf, size_t n) {
    buf[0] = 0;
    switch (f->kind) {
    case TK_FIX_PRECISION: snprintf(buf, n, "%s", f->precision == TK_PREC_BF16 ? "bf16" : "fp16"); break;
    case TK_FIX_PADDING: snprintf(buf, n, "%s", f->batching == TK_BATCH_BUCKETS ? "buckets" : "dynamic"); break;
    case TK_FIX_DATA_PARALLEL:
        if (f->parallel != TK_PAR_DATAPARALLEL || !f->zero)
            snprintf(buf, n, "%s", f->parallel == TK_PAR_DDP ? "ddp" : f->parallel == TK_PAR_ZERO2 ? "zero2"
                                                                                                           : "dataparallel");
        if (f->zero)
            snprintf(buf, n, "zero%d", f->zero);
        break;
    case TK_FIX_RELEASE:
        snprintf(buf, n, "%s%s%s", f->release & TK_RELEASE_SESSION ? "session" : "",
                 (f->release & TK_RELEASE_SESSION) && (f->release & TK_RELEASE_IN_PROCESS) ? "+" : "",
                 f->release & TK_RELEASE_IN_PROCESS ? "in_process" : "");
        break;
    default: break;
    }
    return buf;
}
