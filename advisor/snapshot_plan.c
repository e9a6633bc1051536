/* snapshot_plan.c — a PyTorch snapshot's model recognised as a BERT from
 * the sizes of its live blocks (or named by --model), the batch shape its
 * activation blocks imply, the user's data file through the pipeline's
 * tokenizer, and the snapshot's fixes planned on the planner (bert/plan.c).
 *
 * Guarantees: recognition uses block sizes only (never frame names, so
 * txkernel's own snapshots are recognised the way anyone's are); a size that
 * matches no BERT leaves the model unrecognised, which is not an error; a
 * bad --model, --data or shape is one line naming it. Every planned figure
 * comes from tk_plan on the meta device.
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
#include "tk_snapshot.h"

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

static int imin(int a, int b) { return a < b ? a : b; }

/* Bytes of one copy of a BERT's parameters with a pooler and a 2-class head
 * (the head is too small to see). */
static size_t bert_params(const tk_snap_model *m) {
    size_t H = (size_t)m->hidden, I = (size_t)m->intermediate;
    size_t per_layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H;
    return ((size_t)m->vocab * H + (size_t)m->max_position * H + 2 * H + 2 * H + (size_t)m->layers * per_layer +
            H * H + H) * (size_t)m->elem;
}

/* A BERT in parameters of elem bytes: a hidden size H whose H x H weights
 * come at least 4 to a layer, the H x I weights 2 to a layer, the H-sized
 * vectors 9 to a layer, and word embeddings V x H (V in 1000..1000000, the
 * largest such block that comes at most 4 times): the number of those is
 * the copies (weights, gradients, AdamW's two states). Each count can only
 * be inflated by an activation that happens to have the same size, so the
 * layers are the smallest count's. Returns the recognised bytes (0: none). */
static size_t recognise_elem(sizes z, int elem, tk_snap_model *out) {
    size_t best = 0;
    for (int i = 0; i < z.n;) {
        size_t S = z.v[i];
        int c_hh = count_of(z, S);
        i += c_hh;
        if (c_hh < 4 || S % (size_t)elem) continue;
        int H = isqrt_exact(S / (size_t)elem);
        if (H < 16 || H % 16 || H > 16384) continue;
        size_t row = (size_t)H * (size_t)elem;
        /* the word embeddings: the largest V x H block seen 1..4 times */
        int V = 0, copies = 0;
        for (int k = z.n - 1; k >= 0 && !V; k--) {
            size_t x = z.v[k];
            if (x % row || x / row < 1000 || x / row > 1000000) continue;
            int c = count_of(z, x);
            if (c >= 1 && c <= 4) V = (int)(x / row), copies = c;
        }
        if (!V) continue;
        /* the intermediate size: the I in (H, 8H] whose H x I blocks come most often */
        int I = 0, c_hi = 0;
        for (int cand = H + 16; cand <= 8 * H; cand += 16) {
            int c = count_of(z, (size_t)cand * row);
            if (c > c_hi || (c == c_hi && c && cand == 4 * H)) I = cand, c_hi = c;
        }
        if (!I) continue;
        int c_h = count_of(z, row);
        int L = imin(c_hi / (2 * copies), imin(c_hh / (4 * copies), (c_h - 2 * copies) / (9 * copies)));
        if (L < 1) continue;
        /* position embeddings P x H (512 unless another power of two shows):
         * a P equal to H or I shares its size with those weights, whose
         * blocks are counted first */
        int P = 0;
        for (int p = 512, k = 0; k < 9 && !P; p = k < 3 ? 64 << k : 1024 << (k - 3), k++) {
            int taken = (p == I ? 2 * L * copies : 0) + (p == H ? (4 * L + 1) * copies : 0);
            if (count_of(z, (size_t)p * row) >= copies + taken) P = p;
        }
        if (!P) P = 512;
        tk_snap_model m = {0};
        m.hidden = H, m.layers = L, m.intermediate = I, m.vocab = V, m.max_position = P, m.elem = elem;
        m.copies = copies;
        m.heads = H >= 64 ? H / 64 : 1;
        m.param_bytes = bert_params(&m) * (size_t)copies;
        if (m.param_bytes > best) {
            best = m.param_bytes;
            *out = m;
        }
    }
    return best;
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

static void infer_shape(sizes z, tk_snap_model *m) {
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

static const char *tk_snap_basename(const char *p) {
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

/* ---- planning --------------------------------------------------------------------------- */

static tk_status plan_one(const tk_config *base, const char *change, tk_plan_result *p, tk_err *err) {
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
    return tk_plan(&c, NULL, 0, p, err);
}

static void set_plan(tk_snap_fix *f, const char *change, const tk_plan_result *p) {
    f->planned = 1;
    f->plan_peak = p->peak_reserved;
    f->plan_fits = p->fits;
    snprintf(f->plan_change, sizeof f->plan_change, "%s", change);
}

static tk_snap_fix *find_fix(tk_snapshot *s, const char *id) {
    for (int i = 0; i < s->n_fixes; i++)
        if (!strcmp(s->fixes[i].id, id)) return &s->fixes[i];
    return NULL;
}

static tk_snap_fix *add_fix(tk_snapshot *s, const char *id) {
    if (s->n_fixes == TK_SNAP_MAX_FIXES) return NULL;
    tk_snap_fix *f = &s->fixes[s->n_fixes++];
    memset(f, 0, sizeof *f);
    snprintf(f->id, sizeof f->id, "%s", id);
    f->saves = -1;
    return f;
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
    sizes z = {v, s->n_live_sizes};
    tk_snap_model m4 = {0}, m2 = {0};
    size_t b4 = recognise_elem(z, 4, &m4), b2 = recognise_elem(z, 2, &m2);
    char model[TK_PATH_MAX] = "";
    if (o->model && *o->model && local_model(o->model, model, sizeof model, err)) {
        free(v);
        return -1;
    }
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
        const tk_snap_model *seen = b4 >= b2 ? &m4 : &m2;
        memset(m, 0, sizeof *m);
        m->hidden = d.hidden, m->layers = d.layers, m->heads = d.heads, m->intermediate = d.intermediate;
        m->vocab = d.vocab_size, m->max_position = d.max_position;
        /* the sizes still tell the dtype and copies when they show this model */
        int same = (b4 || b2) && seen->hidden == d.hidden;
        m->elem = same ? seen->elem : 4;
        m->copies = same ? seen->copies : 0;
        m->mixed = same && b4 && b2 && m4.hidden == m2.hidden;
        m->param_bytes = same ? seen->param_bytes : 0;
        snprintf(m->from, sizeof m->from, "--model %s", o->model);
        m->recognised = 1;
        match_preset(m);
    } else if (b4 || b2) {
        *m = b4 >= b2 ? m4 : m2;
        m->mixed = b4 && b2 && m4.hidden == m2.hidden;
        snprintf(m->from, sizeof m->from, "the live blocks' sizes");
        m->recognised = 1;
        match_preset(m);
    }
    if (m->recognised) infer_shape(z, m);
    free(v);
    if (o->batch) {
        m->batch = o->batch, m->seq = o->seq;
        snprintf(m->shape_from, sizeof m->shape_from, "--batch/--seq");
    }
    if (o->data && *o->data && read_data(s, o, model, err)) return -1;

    tk_snap_fix *ml = find_fix(s, "max_length");
    if (s->data.have && !ml && (ml = add_fix(s, "max_length")))
        ml->saves = -1;
    if (ml && s->data.have) {
        snprintf(ml->text, sizeof ml->text,
                 "Cut sequences at the data's 99th percentile: %d tokens (%.120s: %d examples, p95 %d, p99 %d, max %d), "
                 "and pad each batch only to its longest.",
                 s->data.max_length, tk_snap_basename(s->data.file), s->data.n, s->data.p95, s->data.p99, s->data.max);
        snprintf(ml->code, sizeof ml->code,
                 "tokenizer(texts, truncation=True, max_length=%d)\n"
                 "collator = DataCollatorWithPadding(tokenizer)   # or tokenizer(..., padding=\"longest\") per batch",
                 s->data.max_length);
    }
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
    /* The shape read from the blocks came from the T x T score blocks the
     * run kept (eager attention): plan it as it ran, not with the fused
     * attention txkernel's own default gives a card. */
    if (strstr(m->shape_from, "activation blocks")) c.attention = TK_ATTN_STANDARD;
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
    tk_plan_result p;
    if (plan_one(&c, NULL, &p, err) != TK_OK) return -1;
    m->planned = 1;
    m->plan_peak = p.peak_reserved;
    m->plan_capacity = p.capacity;
    m->plan_fits = p.fits;
    size_t current = p.peak_reserved;
    tk_snap_fix *f;
    if ((f = find_fix(s, "precision")) && c.precision == TK_PREC_FP32 && plan_one(&c, "precision=bf16", &p, err) == TK_OK)
        set_plan(f, "precision=bf16", &p);
    if ((f = find_fix(s, "checkpointing")) && plan_one(&c, "recompute=layers", &p, err) == TK_OK)
        set_plan(f, "recompute=layers", &p);
    char ch[48];
    snprintf(ch, sizeof ch, "batch_size=%d", m->batch / 2);
    if ((f = find_fix(s, "batch")) && m->batch >= 2 && plan_one(&c, ch, &p, err) == TK_OK) {
        set_plan(f, ch, &p);
        snprintf(f->plan_change, sizeof f->plan_change, "batch_size=%d, gradient_accumulation_steps x2", m->batch / 2);
        snprintf(f->text, sizeof f->text,
                 "Halve the micro-batch (%d -> %d) and accumulate twice as many steps: the effective batch stays, "
                 "the activations halve.", m->batch, m->batch / 2);
        snprintf(f->code, sizeof f->code,
                 "TrainingArguments(..., per_device_train_batch_size=%d, gradient_accumulation_steps=2)  "
                 "# was %d: the effective batch stays", m->batch / 2, m->batch);
    }
    if (ml && s->data.have && s->data.max_length < m->seq) {
        snprintf(ch, sizeof ch, "max_len=%d", s->data.max_length);
        if (plan_one(&c, ch, &p, err) == TK_OK) {
            set_plan(ml, ch, &p);
            size_t n = strlen(ml->text);
            char a[32];
            snprintf(ml->text + n, sizeof ml->text - n, " Planned: %s less at the peak than at %d tokens.",
                     tk_format_bytes(current > p.peak_reserved ? current - p.peak_reserved : 0, a, sizeof a), m->seq);
        }
    }
    memset(err, 0, sizeof *err);
    return 0;
}
