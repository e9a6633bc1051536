/* snapshot_plan.c — a PyTorch snapshot's model named with its evidence (a
 * BERT-family encoder, a decoder LM of a named family, or not recognised),
 * the batch shape its activation blocks imply, the user's data file through
 * the pipeline's tokenizer, fixes for weights that fill the card, and the
 * snapshot's fixes planned on the planner (bert/plan.c).
 *
 * Guarantees: a BERT is recognised from block sizes only (its word,
 * position and token-type embeddings beside its layers' weights; the vocab
 * never from a logits-shaped block); frames that pass through a model
 * module (transformers/models/NAME, vllm/model_executor/models/NAME) name a
 * family but never make a BERT. Only a BERT is planned, in one place
 * (plan_as_it_ran), and its plan is shown only when it agrees with the
 * file; a bad --model, --data or shape is one line naming it. Every planned
 * figure comes from tk_plan on the meta device, or, when the caller hands
 * the user's traced model (tk_snap_opts.plan_fn) and the file's batch and
 * length are its config's, from that model's own step traced (each fix its
 * own trace); otherwise model.traced_note says in one line why not.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tk_data.h"
#include "tk_host_mem.h"
#include "tk_hub.h"
#include "tk_model.h"
#include "tk_pipeline.h"
#include "tk_plan.h"
#include "tk_advisor.h"
#include "snapshot_diagnose.h"
#include "tk_fix_code.h"

/* ---- sizes ---------------------------------------------------------------------------- */

typedef struct sizes { const size_t *v; int n; } sizes;   /* ascending */

static int count_of(sizes z, size_t x) {
    int lo = 0, hi = z.n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (z.v[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    int k = 0;
    while (lo + k < z.n && z.v[lo + k] == x) k++;
    return k;
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

static int isqrt_exact(size_t q) {
    size_t r = 0;
    while ((r + 1) * (r + 1) <= q && r < 100000) r++;
    return r * r == q ? (int)r : -1;
}

/* Bytes of one copy of a BERT's parameters with a pooler and a 2-class head
 * (the head is too small to see). */
static size_t bert_params(const tk_snap_model *m) {
    size_t H = (size_t)m->hidden, I = (size_t)m->intermediate;
    size_t per_layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H;
    return ((size_t)m->vocab * H + (size_t)m->max_position * H + 2 * H + 2 * H + (size_t)m->layers * per_layer +
            H * H + H) * (size_t)m->elem;
}

/* What the parameter-shaped blocks of one hidden size show: the evidence a
 * family is named from. */
typedef struct shapes {
    tk_snap_model m;      /* hidden, layers, intermediate, vocab, max_position, elem, copies, param_bytes */
    int gated;            /* three H x I weights a layer (gate/up/down), no learned positions */
    int positions;        /* a P x H block beside the word embeddings: P, or 0 */
    int token_types;      /* a 2 x H block (BERT's token-type embeddings) */
    int c_hh, c_hi, c_v;  /* counts of H x H, H x I and V x H blocks */
    int logits_rows;      /* a V x H-divisible block skipped as logits-shaped (batch x seq x vocab), or 0 */
} shapes;

/* A block of X elements is logits-shaped (batch*seq x vocab) when another
 * candidate vocabulary V divides it with a quotient other than H, and V's
 * rows are fewer: the real word embeddings are the smaller table. */
static int logits_shaped(size_t X, const int *cand, int nc, int H) {
    for (int k = 0; k < nc; k++) {
        size_t V = (size_t)cand[k];
        if (V < X / (size_t)H && X % V == 0 && X / V != (size_t)H && X / V >= 2) return 1;
    }
    return 0;
}

/* The parameter blocks of elem-byte elements around the hidden size whose
 * H x H weights come most: returns the parameter bytes recognised (0:
 * none). Each count can only be inflated by an activation of the same size,
 * so the layers are the smallest count's. */
static size_t read_shapes(sizes z, int elem, shapes *out) {
    size_t best = 0;
    int best_rank = -1;
    for (int i = 0; i < z.n;) {
        size_t S = z.v[i];
        int c_hh = count_of(z, S);
        i += c_hh;
        if (c_hh < 4 || S % (size_t)elem) continue;
        int H = isqrt_exact(S / (size_t)elem);
        if (H < 16 || H % 16 || H > 16384) continue;
        size_t row = (size_t)H * (size_t)elem;
        /* the intermediate size: the I in (H, 8H] whose H x I blocks come most often */
        int I = 0, c_hi = 0;
        for (int cand_i = H + 16; cand_i <= 8 * H; cand_i += 16) {
            int c = count_of(z, (size_t)cand_i * row);
            if (c > c_hi || (c == c_hi && c && cand_i == 4 * H)) I = cand_i, c_hi = c;
        }
        if (!I) continue;
        /* the word embeddings: the largest V x H block seen 1..12 times
         * (weights, gradients, AdamW's two states, an untied LM head), with
         * activation-shaped blocks aside: logits (batch*seq x vocab) and a
         * batch*seq x I block beside a batch*seq x H one */
        int cand[256], nc = 0;
        for (int k = 0; k < z.n && nc < 256;) {
            size_t x = z.v[k];
            int c = count_of(z, x);
            k += c;
            /* rows of H or I are the layers' own weights */
            if (x % row || x / row < 1000 || x / row > 1000000 || c > 12 || x / row == (size_t)I ||
                x / row == (size_t)H)
                continue;
            cand[nc++] = (int)(x / row);
        }
        int V = 0, c_v = 0, skipped = 0;
        for (int k = nc - 1; k >= 0 && !V; k--) {
            size_t X = (size_t)cand[k] * (size_t)H;
            if (logits_shaped(X, cand, nc, H)) {
                skipped = cand[k];
                continue;
            }
            if (X % (size_t)I == 0 && count_of(z, X / (size_t)I * row)) continue;
            V = cand[k];
            c_v = count_of(z, (size_t)V * row);
        }
        if (!V) continue;
        /* learned positions: P x H with P a power of two (BERT 512, GPT-2
         * 1024) or two more (OPT's offset: 2050); a P equal to H or I
         * shares its size with those weights, so it needs more than they take */
        int copies = c_v <= 4 ? c_v : c_v / 2;
        if (copies > 4) copies = 4;
        /* An embedding table comes once a copy (twice with a head of its
         * shape); a size seen more often is something else's. */
        int P = 0, L2 = c_hi / (2 * copies);
        for (int k = 0; k < 17 && !P; k++) {
            /* 512 first (BERT's), then 64..16384, then each of those plus two */
            int e = k < 9 ? k : k - 8, base = e == 0 ? 512 : e <= 3 ? 32 << e : 512 << (e - 3);
            int p = base + (k < 9 ? 0 : 2);
            int taken = (p == I ? 2 * L2 * copies : 0) + (p == H ? (4 * L2 + 1) * copies : 0);
            int c = count_of(z, (size_t)p * row) - taken;
            if (p != V && c > 0 && c <= 2 * copies) P = p;
        }
        /* 2 x H: the token-type embeddings, and a 2-label classifier's
         * weight beside them (each with its gradient and optimizer state) */
        int c_2h = count_of(z, 2 * row);
        int types = c_2h > 0 && c_2h <= 3 * copies;
        /* gate/up/down: 3 H x I weights to 4 H x H (q, k, v, o) or, with
         * grouped k/v heads, to 2 */
        int gated = !P && c_hi * 4 >= c_hh * 3 && c_hi * 2 <= c_hh * 3;
        int L = c_hi / ((gated ? 3 : 2) * copies);
        if (L < 1) continue;
        if (types && P && !gated) {
            /* a BERT layer: 4 H x H weights, 2 H x I, 9 H-sized vectors */
            int c_h = count_of(z, row), Lb = c_hh / (4 * copies), Lv = (c_h - 2 * copies) / (9 * copies);
            if (Lb < L) L = Lb;
            if (Lv < L) L = Lv;
            if (L < 1) types = 0, L = c_hi / (2 * copies); /* not a BERT's layers: no BERT evidence */
        }
        shapes sh = {0};
        tk_snap_model *m = &sh.m;
        m->hidden = H, m->layers = L, m->intermediate = I, m->vocab = V, m->max_position = P, m->elem = elem;
        m->copies = copies;
        m->heads = H >= 64 ? H / 64 : 1;
        sh.gated = gated, sh.positions = P, sh.token_types = types, sh.c_hh = c_hh, sh.c_hi = c_hi, sh.c_v = c_v;
        sh.logits_rows = skipped;
        if (types && P && !gated) {
            m->param_bytes = bert_params(m) * (size_t)copies;
        } else {
            /* the blocks of parameter shape as they are, all copies */
            m->param_bytes = (size_t)c_hh * S + (size_t)c_hi * (size_t)I * row + (size_t)c_v * (size_t)V * row +
                             (P ? (size_t)count_of(z, (size_t)P * row) * (size_t)P * row : 0);
        }
        /* the fullest evidence first (a BERT's three embeddings, then a
         * decoder's positions or gated MLP), then the most bytes */
        int rank = types && P && !gated ? 2 : P || gated ? 1 : 0;
        if (rank > best_rank || (rank == best_rank && m->param_bytes > best)) {
            best = m->param_bytes;
            best_rank = rank;
            *out = sh;
        }
    }
    return best;
}

/* The shapes of a BERT: its three embeddings beside 2 H x I weights a layer. */
static int is_bert(size_t bytes, const shapes *sh) { return bytes && sh->token_types && sh->positions && !sh->gated; }

/* The family a model module's name says ("llama", "qwen2", "opt", ...), or NULL. */
static const char *family_of_module(const char *name) {
    static const struct { const char *prefix, *family; } T[] = {
        {"bert", "bert"}, {"llama", "llama"}, {"qwen", "qwen"}, {"mistral", "mistral"}, {"mixtral", "mistral"},
        {"gpt2", "gpt2"}, {"opt", "opt"}};
    for (size_t i = 0; i < sizeof T / sizeof *T; i++)
        if (!strncmp(name, T[i].prefix, strlen(T[i].prefix)) &&
            (strlen(name) == strlen(T[i].prefix) || strcmp(T[i].prefix, "opt") != 0))
            return T[i].family;
    return NULL;
}

/* The family the shapes show, with why (sh may be NULL: no parameter set). */
static const char *family_of_shapes(const shapes *sh, char *why, size_t n) {
    if (!sh) {
        snprintf(why, n, "no set of parameter-shaped blocks (H x H weights several to a layer, V x H word "
                         "embeddings) among the live blocks");
        return "unknown";
    }
    const tk_snap_model *m = &sh->m;
    int V = m->vocab;
    int m_len = snprintf(why, n, "hidden %d: %d blocks of H x H, %d of H x %d, word embeddings %d x H%s",
                         m->hidden, sh->c_hh, sh->c_hi, m->intermediate, V,
                         sh->logits_rows ? " (a logits-shaped block skipped)" : "");
    char *w = why + (m_len > 0 && (size_t)m_len < n ? m_len : 0);
    size_t left = n - (size_t)(w - why);
    if (sh->token_types && sh->positions && !sh->gated) {
        snprintf(w, left, ", position embeddings %d x H, token-type embeddings 2 x H, 2 H x I weights a layer: "
                          "a BERT-family encoder", sh->positions);
        return "bert";
    }
    if (sh->positions) {
        int q = sh->positions - 2;
        if (q >= 1024 && (q & (q - 1)) == 0) {
            snprintf(w, left, ", learned positions %d x H (2 more than a power of two: OPT's offset), no "
                              "token-type embeddings: an OPT decoder", sh->positions);
            return "opt";
        }
        if (V == 50257) {
            snprintf(w, left, ", learned positions %d x H, vocab 50257, no token-type embeddings: GPT-2",
                     sh->positions);
            return "gpt2";
        }
        snprintf(w, left, ", learned positions %d x H, no token-type embeddings: a decoder LM of no named family",
                 sh->positions);
        return "decoder";
    }
    if (sh->gated) {
        const char *f = "decoder";
        if (V == 151646 || V == 151669 || V == 151936 || V == 152064) f = "qwen";
        else if (V == 32000 || V == 128256) f = "llama";
        else if (V == 32768 || V == 131072) f = "mistral";
        snprintf(w, left, ", 3 H x I weights a layer (gate/up/down MLP), no position embeddings: %s%s",
                 !strcmp(f, "decoder") ? "a decoder LM; its vocab names no family" : f,
                 !strcmp(f, "decoder") ? "" : "'s vocab");
        return f;
    }
    snprintf(w, left, "; no position or token-type embeddings and 2 H x I weights a layer: not a BERT (no "
                      "embeddings beside the words), no gated MLP of a Llama-style decoder");
    return "unknown";
}

/* The preset with these dimensions, if any (heads follow it). */
static void match_preset(tk_snap_model *m) {
    for (const char *const *p = tk_bert_preset_names(); *p; p++) {
        tk_bert_dims d;
        if (tk_bert_preset(*p, &d, NULL)) continue;
        if (d.hidden == m->hidden && d.layers == m->layers && d.intermediate == m->intermediate &&
            d.vocab_size == m->vocab && d.max_position == m->max_position) {
            snprintf(m->preset, sizeof m->preset, "%s", *p);
            m->heads = d.heads;
            return;
        }
    }
}

/* The batch shape: activation blocks of B*T x H (or x I) elements and
 * attention scores of B x heads x T x T, in 4 or 2 bytes; the (B, T) that
 * both kinds agree on with the most bytes (per-token statistics such as
 * LayerNorm's B*T means are many blocks but few bytes). */
static int is_param_size(const tk_snap_model *m, size_t S) {
    size_t H = (size_t)m->hidden, I = (size_t)m->intermediate;
    const size_t shapes[] = {H, I, 2 * H, H * H, H * I, (size_t)m->vocab * H, (size_t)m->max_position * H};
    for (int e = 2; e <= 4; e += 2)
        for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
            if (S == shapes[k] * (size_t)e) return 1;
    return 0;
}

static void infer_shape(sizes z, tk_snap_model *m, size_t tokens) {
    size_t best = 0;
    size_t H = (size_t)m->hidden, I = (size_t)m->intermediate, A = (size_t)m->heads;
    /* activations are in the weights' dtype, or 16-bit under autocast */
    for (int e = m->elem == 4 && !m->mixed ? 4 : 2; e <= 4; e += 2)
        for (int i = 0; i < z.n;) {
            size_t S = z.v[i];
            int c = count_of(z, S);
            i += c;
            size_t N = S % (H * (size_t)e) == 0 ? S / (H * (size_t)e) : 0;
            if (is_param_size(m, S)) continue;
            if (!N || N < 2 || N == (size_t)m->vocab || N == (size_t)m->max_position || N == H || N == I) continue;
            if (tokens && N != tokens) continue; /* the batch's own blocks say how many tokens */
            size_t c_n = (size_t)c * S + (size_t)count_of(z, N * I * (size_t)e) * N * I * (size_t)e;
            /* scores in the activations' dtype first: a tie keeps it */
            for (int r = 0, ea = e; r < 2; r++, ea = 6 - e)
                for (int k = 0; k < z.n;) {
                    size_t Sa = z.v[k];
                    int ca = count_of(z, Sa);
                    k += ca;
                    /* a block is read as one kind only */
                    if (Sa == S || Sa == N * I * (size_t)e || Sa % (N * A * (size_t)ea) || is_param_size(m, Sa))
                        continue;
                    /* B x T x H and B x T x I blocks in bytes (dropout's masks) or in the activations'
                     * element size are not scores */
                    if (Sa == N * H || Sa == N * I || Sa == N * H * (size_t)e || Sa == N * I * (size_t)e) continue;
                    size_t T = Sa / (N * A * (size_t)ea);
                    if (T < 8 || T > (size_t)m->max_position || N % T) continue;
                    if (c_n + (size_t)ca * Sa > best) {
                        best = c_n + (size_t)ca * Sa;
                        m->batch = (int)(N / T);
                        m->seq = (int)T;
                    }
                }
        }
    if (best) snprintf(m->shape_from, sizeof m->shape_from, "the activation blocks' sizes");
}

/* The batch shape from the batch the user's code made (snapshot_peak.c:
 * int64 token blocks of B x T, label blocks of B), taken only when
 * activation blocks of B x T x H elements show the same tokens. */
static void batch_shape(const tk_snapshot *s, sizes z, tk_snap_model *m) {
    const tk_snap_peak *pk = &s->peak;
    if (!pk->tokens || !pk->batch || pk->tokens % pk->batch) return;
    size_t N = (size_t)pk->tokens, H = (size_t)m->hidden;
    int T = pk->tokens / pk->batch;
    if (T < 2 || (m->max_position && T > m->max_position)) return;
    if (!count_of(z, N * H * 4) && !count_of(z, N * H * 2)) return;
    m->batch = pk->batch;
    m->seq = T;
    snprintf(m->shape_from, sizeof m->shape_from, "the batch's int64 blocks (%d tokens, %d labels) and B x T x H activations",
             pk->tokens, pk->batch);
}

/* A profile of the compute capability the file's cuBLAS workspaces imply
 * (32 MiB: major 9, as torch 2.x sizes it there), or NULL. */
static const tk_gpu_profile *hopper_class(const tk_snapshot *s) {
    int seen = 0;
    for (int i = 0; i < s->n_ws; i++) seen |= s->ws[i].bytes == (size_t)32 << 20;
    for (int i = 0; seen && tk_gpu_profile_at(i); i++)
        if (tk_gpu_profile_at(i)->cc_major == 9 && tk_gpu_profile_at(i)->gpus <= 1) return tk_gpu_profile_at(i);
    return NULL;
}

static const char *tk_snap_basename(const char *p) {
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

/* ---- planning --------------------------------------------------------------------------- */

/* What plans a setting: the traced model's planner, or (fn NULL)
 * tk_plan_engine. capacity: the file's, which the traced planner's plans
 * are held to in place of its card's (0: the card's): the device's total
 * given (less the card's CUDA context, total 1), or reserved + device free
 * at its OOM (what PyTorch could hold, total 0). */
typedef struct snap_planner { tk_plan_fn fn; void *ctx; size_t capacity; int total; } snap_planner;

static tk_status plan_one(const snap_planner *pl, const tk_config *base, const char *change, tk_plan_result *p,
                          tk_err *err) {
    tk_config c = *base;
    if (change && *change) {
        char key[48], val[48];
        const char *eq = strchr(change, '=');
        snprintf(key, sizeof key, "%.*s", (int)(eq - change), change);
        snprintf(val, sizeof val, "%s", eq + 1);
        if (!strcmp(key, "batch_size")) {
            /* halve the batch, double the accumulation: one change */
            c.batch_size = atoi(val);
            c.accumulate *= 2;
        } else {
            tk_status st = tk_config_set(&c, key, val, err);
            if (st != TK_OK) return st;
        }
    }
    tk_status st = pl && pl->fn ? pl->fn(pl->ctx, &c, NULL, 0, p, err) : tk_plan_engine(&c, NULL, 0, p, err);
    if (st == TK_OK && pl && pl->capacity) {
        if (pl->total) p->capacity = pl->capacity > p->context_bytes ? pl->capacity - p->context_bytes : 0;
        else p->capacity = pl->capacity, p->context_bytes = 0;
        p->fits = p->peak_reserved <= p->capacity;
        p->margin = (int64_t)p->capacity - (int64_t)p->peak_reserved;
    }
    return st;
}

static void set_plan(tk_fix_note *f, const char *change, const tk_plan_result *p) {
    f->planned = 1;
    f->plan_peak = p->peak_reserved;
    f->plan_fits = p->fits;
    snprintf(f->plan_change, sizeof f->plan_change, "%s", change);
}


/* --model as a local name: a path or a preset as it is; a hub id becomes
 * its snapshot folder in the HF cache, with config.json and the tokenizer
 * files fetched when the cache lacks them (never the weights; offline, the
 * error names the file missing). */
static int local_model(const char *name, char *out, size_t n, tk_err *err) {
    struct stat st;
    tk_bert_dims d;
    if (stat(name, &st) == 0 || tk_bert_preset(name, &d, NULL) == 0 || !tk_hub_is_repo_id(name)) {
        snprintf(out, n, "%s", name);
        return 0;
    }
    tk_hub_opts ho = {.weights = 0};
    tk_err e = {0};
    if (tk_hub_resolve(name, NULL, &ho, out, n, NULL, &e) != TK_OK) {
        tk_err_set(err, e.status, "--model %.200s: %.800s", name, e.msg);
        return -1;
    }
    return 0;
}

static int read_data(tk_snapshot *s, const tk_snap_opts *o, const char *model, tk_err *err) {
    tk_config c;
    tk_config_defaults(&c);
    /* the tokenizer of the given model (its folder's vocab.txt or
     * tokenizer.json); else the pipeline's default for a preset */
    if (model[0]) snprintf(c.model, sizeof c.model, "%s", model);
    else if (s->model.preset[0]) snprintf(c.model, sizeof c.model, "%s", s->model.preset);
    tk_run_lengths rl;
    if (tk_run_text_lengths(&c, o->data, o->text_col, NULL, &rl, err) != TK_OK) {
        if (!strstr(err->msg, o->data)) {
            char m[sizeof err->msg];
            snprintf(m, sizeof m, "--data %.200s: %.800s", o->data, err->msg);
            snprintf(err->msg, sizeof err->msg, "%s", m);
        }
        return -1;
    }
    if (!rl.n) {
        tk_err_set(err, TK_EINVAL, "--data %s: no examples in the file", o->data);
        tk_run_lengths_clear(&rl);
        return -1;
    }
    tk_length_stats ls;
    tk_length_stats_compute(rl.len, rl.n, &ls);
    tk_snap_data *d = &s->data;
    d->have = 1;
    snprintf(d->file, sizeof d->file, "%s", o->data);
    d->n = ls.n, d->max = ls.max, d->p50 = ls.p50, d->p95 = ls.p95, d->p99 = ls.p99;
    int ml = (ls.p99 + 7) / 8 * 8;
    int cap = s->model.max_position ? s->model.max_position : 512;
    d->max_length = ml > cap ? cap : ml;
    snprintf(d->vocab_note, sizeof d->vocab_note, "%.250s", rl.vocab_note);
    tk_run_lengths_clear(&rl);
    return 0;
}

/* The one place the run "as it ran" is planned (the engine named in
 * m->engine), and checked against the file: with a trace, the planned peak
 * allocated within 15 % of the trace's peak (alloc and free_completed
 * replayed); a trace with an oom event ran out before its own peak, so there
 * the plan must not fit and must reach at least 85 % of the trace's peak
 * plus the failed request; without a trace, at least the allocated bytes.
 * A plan that disagrees is withheld (m->planned 0, m->plan_withheld 1) with
 * the reason in m->plan_note. -1 only when the planner fails. */
static int plan_as_it_ran(tk_snapshot *s, const snap_planner *pl, const char *traced_label, const tk_config *c,
                          tk_plan_result *p, tk_err *err) {
    tk_snap_model *m = &s->model;
    char a[32], b[32];
    snprintf(m->engine, sizeof m->engine, "%s", c->engine == TK_ENGINE_PYTORCH ? "pytorch" : "txkernel");
    if (pl && pl->fn) /* as the pasted message's report names the traced planner */
        snprintf(m->engine_label, sizeof m->engine_label, "engine: pytorch, traced %.100s", traced_label);
    else
        snprintf(m->engine_label, sizeof m->engine_label, "%s", tk_plan_engine_name(c));
    if (plan_one(pl, c, NULL, p, err) != TK_OK) return -1;
    m->plan_peak = p->peak_reserved;
    m->plan_capacity = p->capacity;
    m->plan_fits = p->fits;
    size_t planned = p->peak_allocated, target;
    const char *against;
    int agree;
    if (s->has_oom) {
        target = s->trace_peak_allocated + s->oom_size;
        against = "the trace's peak plus the failed request";
        agree = !p->fits && (double)planned >= 0.85 * (double)target;
    } else if (s->n_points) {
        target = s->trace_peak_allocated;
        against = "the trace's peak";
        agree = (double)planned >= 0.85 * (double)target && (double)planned <= 1.15 * (double)target;
    } else {
        target = s->allocated;
        against = "what the file has allocated";
        agree = planned >= target;
    }
    m->plan_allocated = planned;
    m->plan_against = target;
    if (agree) {
        m->planned = 1;
        snprintf(m->plan_note, sizeof m->plan_note, "planned peak allocated %s against %s, %s",
                 tk_format_bytes(planned, a, sizeof a), against, tk_format_bytes(target, b, sizeof b));
    } else {
        m->plan_withheld = 1;
        snprintf(m->plan_note, sizeof m->plan_note,
                 "withheld: that plan's peak allocated %s disagrees with %s, %s%s",
                 tk_format_bytes(planned, a, sizeof a), against, tk_format_bytes(target, b, sizeof b),
                 s->has_oom && p->fits ? " (the file ran out of memory; the plan fits)"
                 : s->has_oom           ? " (it should be at least 85 % of it)"
                 : s->n_points          ? " (more than 15 % apart)"
                                        : " (below it)");
    }
    return 0;
}

/* Whether the file's step is the traced model's (o->traced): its batch and
 * length against the traced config's. 1, or 0 with m->traced_note saying in
 * one line which figures differ or what could not be read. */
static int traced_step(tk_snap_model *m, const tk_snap_opts *o) {
    const tk_config *t = o->traced;
    const char *who = o->traced_label && *o->traced_label ? o->traced_label : "the traced model";
    int tb = t->batch_size, tl = tk_plan_worst_len(t, NULL, 0);
    char *w = m->traced_note;
    size_t n = sizeof m->traced_note;
    if (!m->recognised) {
        snprintf(w, n, "Not planned by tracing %.60s: the snapshot's batch and length cannot be read (its blocks show "
                       "no BERT-family encoder), so its step cannot be matched with the traced one.", who);
        return 0;
    }
    if (!m->batch) {
        snprintf(w, n, "Not planned by tracing %.60s: the snapshot's batch and length cannot be read from its blocks "
                       "(--batch N --seq N gives them).", who);
        return 0;
    }
    if (m->batch == tb && m->seq == tl) return 1;
    int k = snprintf(w, n, "Not planned by tracing %.60s: the snapshot's step is not the traced one:", who);
    if (k > 0 && (size_t)k < n && m->batch != tb)
        k += snprintf(w + k, n - (size_t)k, " batch %d here, %d traced%s", m->batch, tb, m->seq != tl ? ";" : "");
    if (k > 0 && (size_t)k < n && m->seq != tl)
        k += snprintf(w + k, n - (size_t)k, " length %d here, %d traced", m->seq, tl);
    if (k > 0 && (size_t)k < n) snprintf(w + k, n - (size_t)k, " (the snapshot's from %.80s).", m->shape_from);
    return 0;
}

/* Weights that fill the device: fixes that shrink or move the weights, put
 * first; freeing a tensor the run still needs (del) is not one of them. */
static void weight_fixes(tk_snapshot *s) {
    const tk_snap_model *m = &s->model;
    size_t w = m->param_bytes, w1 = m->copies ? w / (size_t)m->copies : w, need;
    char a[32], b[32], c[32];
    int at_capacity = 0;
    for (int i = 0; i < s->n_diag; i++) at_capacity |= s->diag[i].kind == TK_DIAG_CAPACITY;
    /* "most of the card": the capacity given, else what the process had */
    size_t held = s->capacity ? s->capacity : s->has_oom ? s->reserved + s->oom_device_free : s->reserved;
    if (!at_capacity || !w || !s->allocated || w < s->allocated / 2 || w < held / 2 || !strcmp(m->family, "unknown"))
        return;
    /* what the run held, and a quarter more for what the snapshot cannot
     * show (the rest of a model still loading, the next step's activations) */
    need = s->allocated + (s->has_oom ? s->oom_size : 0);
    size_t want = need + need / 4;
    int elem = m->elem ? m->elem : 2, pos = snap_fix_find(s, "leak") ? 1 : 0; /* a leak stays the first fix */
    tk_fix_note *del = snap_fix_find(s, "del");
    if (del) {
        int k = (int)(del - s->fixes);
        memmove(&s->fixes[k], &s->fixes[k + 1], (size_t)(s->n_fixes - k - 1) * sizeof *s->fixes);
        s->n_fixes--;
    }
    tk_fix_note *f;
    const char *fam = m->family[0] ? m->family : "the model";
    if ((f = snap_fix_insert(s, "quantize", pos))) {
        pos++;
        f->saves = (int64_t)(w1 - w1 * 4 / 8 / (size_t)elem);
        snprintf(f->text, sizeof f->text,
                 "The parameter-shaped blocks of the %s model (%s) are %.0f%% of what is allocated (%s): "
                 "loaded in 4 bits, one copy of the weights takes about %s, freeing %s (8 bits frees half "
                 "as much from 16-bit weights).",
                 fam, m->copies > 1 ? "weights, gradients and optimizer states" : "its weights", 100.0 * (double)w / (double)s->allocated, tk_format_bytes(s->allocated, a, sizeof a),
                 tk_format_bytes(w1 / 2 / (size_t)elem, b, sizeof b), tk_format_bytes((size_t)f->saves, c, sizeof c));
        snprintf(f->code, sizeof f->code,
                 "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
                 "model = AutoModelForCausalLM.from_pretrained(name, device_map=\"auto\",\n"
                 "    quantization_config=BitsAndBytesConfig(load_in_4bit=True))  # or load_in_8bit=True");
    }
    if (m->copies >= 2 && (f = snap_fix_insert(s, "lora", pos))) {
        pos++;
        f->saves = (int64_t)(w - w1);
        snprintf(f->text, sizeof f->text,
                 "Train low-rank adapters instead of every weight: the %d copies of each parameter (weights, "
                 "gradients, optimizer states) become one frozen copy plus small adapters, freeing about %s.",
                 m->copies, tk_format_bytes(w - w1, a, sizeof a));
        snprintf(f->code, sizeof f->code,
                 "from peft import LoraConfig, get_peft_model\n"
                 "model = get_peft_model(model, LoraConfig(r=8, target_modules=\"all-linear\"))");
    }
    if ((f = snap_fix_insert(s, "offload", pos))) {
        pos++;
        snprintf(f->text, sizeof f->text,
                 "Keep only the layers in use on the GPU and the rest in CPU memory (slower: each step copies "
                 "them over).");
        snprintf(f->code, sizeof f->code,
                 "model = AutoModelForCausalLM.from_pretrained(name, device_map=\"auto\",\n"
                 "    max_memory={0: \"%zuGiB\", \"cpu\": \"64GiB\"})",
                 s->capacity ? s->capacity * 9 / 10 >> 30 : (size_t)8);
    }
    if ((f = snap_fix_insert(s, "smaller_model", pos))) {
        pos++;
        snprintf(f->text, sizeof f->text,
                 "A smaller model of the same family: the weights scale with hidden^2 x layers (here hidden %d, "
                 "%d layers seen).",
                 m->hidden, m->layers);
        snprintf(f->code, sizeof f->code, "model = AutoModelForCausalLM.from_pretrained(smaller_name)");
    }
    /* the smallest card whose usable memory holds what the run needed */
    const tk_gpu_profile *card = NULL;
    for (int i = 0; tk_gpu_profile_at(i); i++) {
        const tk_gpu_profile *g = tk_gpu_profile_at(i);
        if (tk_gpu_profile_budget(g) >= want && (!card || g->capacity < card->capacity)) card = g;
    }
    if (card && (!s->capacity || card->capacity > s->capacity) && (f = snap_fix_insert(s, "gpu", pos))) {
        snprintf(f->text, sizeof f->text,
                 "A card that holds it: the run held %s when it stopped (needing more); the %s has %s, %s of it "
                 "usable after the CUDA context, a quarter more than that.",
                 tk_format_bytes(need, a, sizeof a), card->long_name, tk_format_bytes(card->capacity, b, sizeof b),
                 tk_format_bytes(tk_gpu_profile_budget(card), c, sizeof c));
        snprintf(f->code, sizeof f->code, "# run on a %s (%s)", card->long_name, tk_format_bytes(card->capacity, a, sizeof a));
    }
}

int tk_snap_plan(tk_snapshot *s, const tk_snap_opts *o, tk_err *err) {
    tk_snap_model *m = &s->model;
    if (o->batch < 0 || o->seq < 0 || (!o->batch) != (!o->seq)) {
        tk_err_set(err, TK_EINVAL, "--batch and --seq: give both, as positive numbers");
        return -1;
    }
    size_t *v = tk_malloc((size_t)(s->n_live_sizes ? s->n_live_sizes : 1) * sizeof *v);
    if (!v) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", s->path);
        return -1;
    }
    memcpy(v, s->live_sizes, (size_t)s->n_live_sizes * sizeof *v);
    qsort(v, (size_t)s->n_live_sizes, sizeof *v, cmp_size);
    /* the blocks left at the end first (a snapshot taken at an OOM holds
     * the whole step there); when they show no BERT (one dumped after
     * training holds little), the parameter, gradient and optimizer blocks
     * live at the trace's peak, with the activations of the step's high
     * point for the batch shape */
    shapes s4 = {0}, s2 = {0};
    sizes z = {v, s->n_live_sizes}, za = z;
    size_t b4 = read_shapes(z, 4, &s4), b2 = read_shapes(z, 2, &s2);
    const char *from = "the live blocks' sizes";
    if (!is_bert(b4, &s4) && !is_bert(b2, &s2) && s->peak.n_state_sizes) {
        shapes p4 = {0}, p2 = {0};
        sizes zp = {s->peak.state_sizes, s->peak.n_state_sizes};
        size_t c4 = read_shapes(zp, 4, &p4), c2 = read_shapes(zp, 2, &p2);
        if (is_bert(c4, &p4) || is_bert(c2, &p2) || (!(b4 || b2) && (c4 || c2))) {
            z = zp, za = (sizes){s->peak.act_sizes, s->peak.n_act_sizes};
            s4 = p4, s2 = p2, b4 = c4, b2 = c2;
            from = "the parameter, gradient and optimizer blocks live at the trace's peak";
        }
    }
    const shapes *seen = b4 || b2 ? (b4 >= b2 ? &s4 : &s2) : NULL;
    int mixed = b4 && b2 && s4.m.hidden == s2.m.hidden;
    char model[TK_PATH_MAX] = "";
    if (o->model && *o->model && local_model(o->model, model, sizeof model, err)) {
        free(v);
        return -1;
    }
    /* the family: the model module the frames pass through, else the shapes */
    char why_shapes[384];
    const char *fam_shapes = family_of_shapes(seen, why_shapes, sizeof why_shapes);
    const char *fam_frames = s->model_module[0] ? family_of_module(s->model_module) : NULL;
    memset(m, 0, sizeof *m);
    if (seen) *m = seen->m;
    m->mixed = mixed;
    if (fam_frames) {
        snprintf(m->family, sizeof m->family, "%s", fam_frames);
        snprintf(m->why, sizeof m->why, "the live blocks' frames pass through %.100s; shapes: %.220s",
                 s->model_module_file, why_shapes);
    } else {
        snprintf(m->family, sizeof m->family, "%s", fam_shapes);
        snprintf(m->why, sizeof m->why, "%s", why_shapes);
    }
    /* only a BERT is planned: its own shapes make it one */
    int bert_shapes = !strcmp(fam_shapes, "bert") && (!fam_frames || !strcmp(fam_frames, "bert"));
    if (model[0]) {
        tk_bert_dims d;
        if (tk_bert_dims_resolve(model, &d, NULL, err) != TK_OK) {
            if (!strstr(err->msg, o->model)) {
                char msg[sizeof err->msg];
                snprintf(msg, sizeof msg, "--model %.200s: %.800s", o->model, err->msg);
                snprintf(err->msg, sizeof err->msg, "%s", msg);
            }
            free(v);
            return -1;
        }
        /* --model names a BERT; the blocks must not show another family */
        if (strcmp(m->family, "bert") && strcmp(m->family, "unknown")) {
            size_t k = strlen(m->why);
            snprintf(m->why + k, sizeof m->why - k, "; --model %.60s is a BERT, which the blocks do not show: not planned",
                     o->model);
        } else {
            int same = seen && bert_shapes && seen->m.hidden == d.hidden;
            memset(m, 0, sizeof *m);
            m->hidden = d.hidden, m->layers = d.layers, m->heads = d.heads, m->intermediate = d.intermediate;
            m->vocab = d.vocab_size, m->max_position = d.max_position;
            /* the sizes still tell the dtype and copies when they show this model */
            m->elem = same ? seen->m.elem : 4;
            m->copies = same ? seen->m.copies : 0;
            m->mixed = same && mixed;
            m->param_bytes = same ? seen->m.param_bytes : 0;
            snprintf(m->from, sizeof m->from, "--model %s", o->model);
            snprintf(m->family, sizeof m->family, "bert");
            snprintf(m->why, sizeof m->why, "--model %.100s; %s", o->model,
                     same ? "the live blocks show its shapes" : bert_shapes ? "the live blocks show a BERT of another size"
                                                                           : "the live blocks show no BERT's shapes");
            m->recognised = 1;
            match_preset(m);
        }
    } else if (bert_shapes) {
        snprintf(m->from, sizeof m->from, "%s", from);
        m->recognised = 1;
        match_preset(m);
    } else if (seen)
        snprintf(m->from, sizeof m->from, "%s", from);
    if (m->recognised) infer_shape(za, m, (size_t)s->peak.tokens);
    if (m->recognised && !m->batch) batch_shape(s, za, m);
    free(v);
    if (o->batch) {
        m->batch = o->batch, m->seq = o->seq;
        snprintf(m->shape_from, sizeof m->shape_from, "--batch/--seq");
    }
    if (o->data && *o->data && read_data(s, o, model, err)) return -1;
    /* the user's traced model plans the file's step when it is its own */
    int by_trace = o->plan_fn && o->traced && traced_step(m, o);
    tk_api api = s->trainer ? TK_API_TRAINER : TK_API_LOOP;
    tk_torch_version torch = TK_TORCH_2;
    if (by_trace) { /* the fixes' code in the traced model's API, as its advice writes them */
        if (tk_config_api(o->traced) != TK_API_TXKERNEL) api = tk_config_api(o->traced);
        torch = o->traced->torch_version;
    }

    tk_fix_note *ml = snap_fix_find(s, "max_length");
    if (s->data.have && !ml && (ml = snap_fix_insert(s, "max_length", s->n_fixes)))
        ml->saves = -1;
    if (ml && s->data.have)
        snprintf(ml->text, sizeof ml->text,
                 "Cut sequences at the data's 99th percentile: %d tokens (%.120s: %d examples, p95 %d, p99 %d, max %d), "
                 "and pad each batch only to its longest.",
                 s->data.max_length, tk_snap_basename(s->data.file), s->data.n, s->data.p95, s->data.p99, s->data.max);
    if (ml && (s->data.have || m->batch)) /* the one writer of a step change, in the API the snapshot's frames
                                           * show, with the length the data gives and the batch the blocks show */
        tk_step_code(ml->code, sizeof ml->code, TK_STEP_SHORTER, api,
                     &(tk_step_user){.p99 = s->data.have ? s->data.max_length : 0, .batch = m->batch, .torch = torch});
    weight_fixes(s);
    if (!m->recognised || !m->batch) return 0;

    /* the setting as it ran, then each fix, on the planner */
    tk_config c;
    tk_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "%s", model[0] ? model : m->preset[0] ? m->preset : "bert-base-uncased");
    c.init = TK_INIT_RANDOM;
    c.hidden = m->hidden, c.layers = m->layers, c.heads = m->heads, c.intermediate = m->intermediate;
    c.vocab_size = m->vocab, c.max_position = m->max_position;
    c.batch_size = m->batch, c.max_len = m->seq;
    c.precision = m->elem == 2 || m->mixed ? TK_PREC_FP16 : TK_PREC_FP32;
    /* A PyTorch run on a CUDA card, planned as PyTorch runs the step
     * (engine: pytorch, torchplan/). A shape read from the T x T score
     * blocks the run kept means eager attention; else transformers 5's
     * default, SDPA. A file txkernel wrote (txk train/plan --snapshot) is
     * planned as txkernel ran it, by its own trainer. */
    if (s->by_txkernel) {
        if (strstr(m->shape_from, "activation blocks")) c.attention = TK_ATTN_STANDARD;
    } else {
        c.engine = TK_ENGINE_PYTORCH;
        c.device = TK_DEVICE_CUDA;
        if (strstr(m->shape_from, "activation blocks")) c.attn_implementation = TK_ATTN_IMPL_EAGER;
        /* two label blocks of B beside the tokens: a span task's start and end positions */
        if (s->peak.label_blocks == 2 && s->peak.batch == m->batch) c.task = TK_TASK_QA, c.head = TK_HEAD_SPAN;
    }
    if (o->gpu && *o->gpu) {
        snprintf(c.gpu, sizeof c.gpu, "%s", o->gpu);
        snprintf(m->capacity_from, sizeof m->capacity_from, "the %s profile, less its CUDA context", o->gpu);
    } else if (s->capacity) {
        c.capacity = s->capacity;
        snprintf(m->capacity_from, sizeof m->capacity_from, "the capacity given");
    } else if (s->has_oom) {
        c.capacity = s->reserved + s->oom_device_free;
        snprintf(m->capacity_from, sizeof m->capacity_from, "reserved + device free at the OOM");
    } else
        snprintf(m->capacity_from, sizeof m->capacity_from, "no capacity known: --gpu or --capacity");
    /* No card named: the kernels and cuBLAS's workspaces follow the
     * compute capability, and a 32 MiB cuBLAS workspace in the file is
     * torch's size for the Hopper-class majors: planned on such a profile
     * for them, never for its capacity */
    const tk_gpu_profile *like = NULL;
    if (c.engine == TK_ENGINE_PYTORCH && !c.gpu[0] && (like = hopper_class(s))) {
        snprintf(c.gpu, sizeof c.gpu, "%s", like->name);
        if (!c.capacity) c.capacity = SIZE_MAX / 4; /* not the card's: no capacity is known */
    }
    /* the traced model's own step on the card the file shows (else the one it
     * was planned on), against the file's capacity; a trace it cannot make
     * leaves the BERT's plan, with the reason */
    snap_planner pl = {0};
    tk_config tc = c;
    const tk_config *pc = &c;
    const char *who = o->traced_label && *o->traced_label ? o->traced_label : "the traced model";
    tk_plan_result p;
    if (by_trace) {
        tc = *o->traced;
        if (c.gpu[0]) snprintf(tc.gpu, sizeof tc.gpu, "%s", c.gpu);
        if (c.capacity) tc.capacity = c.capacity;
        if (!tc.gpu[0]) {
            by_trace = 0;
            snprintf(m->traced_note, sizeof m->traced_note,
                     "Not planned by tracing %.60s: no card to replay its trace on (the file names none, nor was the "
                     "model planned on one): --gpu NAME.", who);
        } else {
            pl = (snap_planner){o->plan_fn, o->plan_ctx,
                                s->capacity ? s->capacity : s->has_oom ? s->reserved + s->oom_device_free : 0,
                                s->capacity != 0};
            if (!c.gpu[0] && !pl.capacity) /* the card's own capacity, then */
                snprintf(m->capacity_from, sizeof m->capacity_from, "the %.40s profile the traced model was planned on",
                         tc.gpu);
            pc = &tc;
            if (plan_as_it_ran(s, &pl, who, pc, &p, err)) {
                snprintf(m->traced_note, sizeof m->traced_note, "Not planned by tracing %.60s: %.230s", who, err->msg);
                memset(err, 0, sizeof *err);
                by_trace = 0, pl = (snap_planner){0}, pc = &c;
            }
        }
    }
    if (by_trace)
        snprintf(m->planned_by, sizeof m->planned_by, "Planned by tracing %.60s: the run as it ran and each fix, each "
                 "its own training step traced with its settings and replayed on the %.40s profile.", who, tc.gpu);
    else {
        /* a profile chosen for its kernels alone (like): the file's capacity
         * holds, as the traced plans' does, never the profile's */
        if (like && (s->capacity || s->has_oom))
            pl = (snap_planner){NULL, NULL, s->capacity ? s->capacity : s->reserved + s->oom_device_free,
                                s->capacity != 0};
        if (plan_as_it_ran(s, &pl, NULL, &c, &p, err)) return -1;
    }
    if (like) {
        if (!s->capacity && !s->has_oom) m->plan_capacity = 0;
        size_t k = strlen(m->plan_note);
        snprintf(m->plan_note + k, sizeof m->plan_note - k,
                 "; kernels and workspaces as on compute capability %d.%d (the %s profile's), which the file's "
                 "32 MiB cuBLAS workspaces show", like->cc_major, like->cc_minor, like->name);
    }
    if (!m->planned) {
        if (by_trace && o->describe) o->describe(o->plan_ctx, m->planned_by, sizeof m->planned_by);
        memset(err, 0, sizeof *err);
        return 0;
    }
    size_t current = p.peak_reserved;
    tk_fix_note *f;
    tk_step_user tu = {.torch = torch}; /* the traced model's: its API and torch (the diagnosis wrote the file's) */
    if ((f = snap_fix_find(s, "precision")) && pc->precision == TK_PREC_FP32 &&
        plan_one(&pl, pc, "precision=fp16", &p, err) == TK_OK) {
        set_plan(f, "precision=fp16", &p);
        if (by_trace) tk_step_code(f->code, sizeof f->code, TK_STEP_FP16, api, &tu);
    }
    if ((f = snap_fix_find(s, "checkpointing")) && plan_one(&pl, pc, "recompute=layers", &p, err) == TK_OK) {
        set_plan(f, "recompute=layers", &p);
        if (by_trace) tk_step_code(f->code, sizeof f->code, TK_STEP_CHECKPOINTING, api, &tu);
    }
    char ch[48];
    snprintf(ch, sizeof ch, "batch_size=%d", m->batch / 2);
    if ((f = snap_fix_find(s, "batch")) && m->batch >= 2 && plan_one(&pl, pc, ch, &p, err) == TK_OK) {
        set_plan(f, ch, &p);
        snprintf(f->plan_change, sizeof f->plan_change, "batch_size=%d, gradient_accumulation_steps x2", m->batch / 2);
        snprintf(f->text, sizeof f->text,
                 "Halve the micro-batch (%d -> %d) and accumulate twice as many steps: the effective batch stays, "
                 "the activations halve.", m->batch, m->batch / 2);
        /* the one writer of a step change (a loop: its whole body at the planned batch) */
        tk_step_code(f->code, sizeof f->code, TK_STEP_HALF_BATCH, api,
                     &(tk_step_user){.batch = m->batch, .accumulate = pc->accumulate > 1 ? pc->accumulate : 1,
                                     .torch = torch});
    }
    if (ml && s->data.have && s->data.max_length < m->seq) {
        snprintf(ch, sizeof ch, "max_len=%d", s->data.max_length);
        if (plan_one(&pl, pc, ch, &p, err) == TK_OK) {
            set_plan(ml, ch, &p);
            size_t n = strlen(ml->text);
            char a[32];
            snprintf(ml->text + n, sizeof ml->text - n, " Planned: %s less at the peak than at %d tokens.",
                     tk_format_bytes(current > p.peak_reserved ? current - p.peak_reserved : 0, a, sizeof a), m->seq);
        }
    }
    /* the planner's own account, once every plan is made (how many traced,
     * what its budget left out, the model's own calls) */
    if (by_trace && o->describe) o->describe(o->plan_ctx, m->planned_by, sizeof m->planned_by);
    memset(err, 0, sizeof *err);
    return 0;
}
