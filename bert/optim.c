/* optim.c — AdamW (32-bit and block-wise 8-bit state), global-norm clipping
 * and HF's learning-rate schedules.
 *
 * Guarantees: the update is torch.optim.AdamW's (decoupled decay
 * p -= lr*wd*p, bias-corrected moments, eps added to sqrt(v_hat)) preceded by
 * torch.nn.utils.clip_grad_norm_ (factor max/(norm+1e-6), applied only when
 * below 1). The clip factor and any loss-scale are folded into the update's
 * grad_scale, so gradients are never rewritten. State is allocated on the
 * first step, parameter by parameter in model order (m then v), as PyTorch
 * does, tagged TK_CAT_OPTIM with the parameter's own owner. An OOM while
 * allocating state frees the partial state and leaves the parameters
 * untouched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tk_train.h"
#include "tk_host_mem.h"

/* bitsandbytes keeps 32-bit state for tensors under 4096 elements
 * (min_8bit_size); we follow it so small biases do not lose precision. */
#define TK_ADAMW8_MIN_NUMEL 4096

typedef struct {
    tk_optim_param p;
    int64_t lo, n;             /* the elements this optimizer updates: [lo, lo + n) */
    int q8;                    /* 1: 8-bit state */
    tk_tensor m, v;            /* f32, or i8 / u8 when q8 */
    tk_tensor mscale, vscale;  /* q8 only: f32 per TK_Q8_BLOCK */
} tk_adamw_slot;

struct tk_adamw {
    tk_dev *d;                 /* borrowed */
    tk_adamw_slot *slots;
    int n;
    float beta1, beta2, eps, weight_decay, max_grad_norm;
    int64_t step;
    int have_state;
    tk_tensor norm;            /* f32 scratch for the global norm (live only inside a step) */
    tk_coll *coll;             /* borrowed: sharded state (tk_adamw_set_coll) */
};

tk_sched tk_sched_from_config(const tk_config *c, int64_t total_steps) {
    tk_sched s;
    s.lr = c->lr;
    s.total_steps = total_steps;
    /* HF TrainingArguments.get_warmup_steps: ceil(total * warmup_ratio).
     * The ratio is a float here and a double there (0.2f*5 = 1.00000001):
     * a product within float precision of an integer is that integer. */
    double w = (double)total_steps * (double)c->warmup_ratio, wr = nearbyint(w);
    if (fabs(w - wr) < 1e-6 * (1.0 + fabs(w)))
        w = wr;
    s.warmup_steps = (int64_t)ceil(w);
    s.constant = strcmp(c->schedule, "constant") == 0;
    return s;
}

float tk_sched_lr(const tk_sched *s, int64_t done) {
    if (done < s->warmup_steps)
        return s->lr * (float)((double)done / (double)(s->warmup_steps > 1 ? s->warmup_steps : 1));
    if (s->constant)
        return s->lr;
    int64_t span = s->total_steps - s->warmup_steps;
    double f = (double)(s->total_steps - done) / (double)(span > 1 ? span : 1);
    if (f < 0)
        f = 0;
    return (float)(s->lr * f);
}

static int is_embedding(const char *name) {
    return name && strncmp(name, "bert.embeddings.", 16) == 0;
}

tk_adamw *tk_adamw_new(tk_dev *d, const tk_config *c, const tk_optim_param *params, int n,
                       tk_err *err) {
    if (!d || !c || (n > 0 && !params) || n < 0) {
        tk_err_set(err, TK_EINVAL, "optimizer: no device, config or parameters");
        return NULL;
    }
    if (!(c->adam_beta1 >= 0 && c->adam_beta1 < 1) || !(c->adam_beta2 >= 0 && c->adam_beta2 < 1)) {
        tk_err_set(err, TK_EINVAL, "optimizer: adam_beta1 %g / adam_beta2 %g must be in [0, 1)",
                   c->adam_beta1, c->adam_beta2);
        return NULL;
    }
    tk_adamw *o = tk_calloc(1, sizeof *o);
    if (!o || !(o->slots = tk_calloc(n > 0 ? (size_t)n : 1, sizeof *o->slots))) {
        free(o);
        tk_err_set(err, TK_ENOMEM, "optimizer: out of host memory");
        return NULL;
    }
    o->d = d;
    o->n = n;
    o->beta1 = c->adam_beta1;
    o->beta2 = c->adam_beta2;
    o->eps = c->adam_eps;
    o->weight_decay = c->weight_decay;
    o->max_grad_norm = c->max_grad_norm;
    for (int i = 0; i < n; i++) {
        tk_adamw_slot *s = &o->slots[i];
        s->p = params[i];
        if (s->p.frozen)
            continue;
        int64_t numel = tk_tensor_numel(s->p.param);
        s->lo = s->p.piece ? s->p.lo : 0;
        s->n = s->p.piece ? s->p.hi - s->p.lo : numel;
        s->q8 = c->optimizer == TK_OPTIM_ADAMW8 && numel >= TK_ADAMW8_MIN_NUMEL &&
                !(c->adamw8_fp32_embeddings && is_embedding(s->p.name));
    }
    return o;
}

static void free_state(tk_adamw *o) {
    for (int i = 0; i < o->n; i++) {
        tk_adamw_slot *s = &o->slots[i];
        tk_tensor_free(o->d, &s->m);
        tk_tensor_free(o->d, &s->v);
        tk_tensor_free(o->d, &s->mscale);
        tk_tensor_free(o->d, &s->vscale);
    }
    o->have_state = 0;
}

void tk_adamw_destroy(tk_adamw **po) {
    if (!po || !*po)
        return;
    tk_adamw *o = *po;
    free_state(o);
    tk_tensor_free(o->d, &o->norm);
    free(o->slots);
    free(o);
    *po = NULL;
}

int64_t tk_adamw_steps(const tk_adamw *o) { return o ? o->step : 0; }

void tk_adamw_set_coll(tk_adamw *o, tk_coll *coll) {
    if (o) o->coll = coll;
}

static size_t slot_bytes(const tk_adamw_slot *s) {
    if (s->p.frozen || s->n == 0)
        return 0;
    size_t n = (size_t)s->n;
    if (!s->q8)
        return 2 * n * sizeof(float);
    size_t blocks = (n + TK_Q8_BLOCK - 1) / TK_Q8_BLOCK;
    return 2 * n + 2 * blocks * sizeof(float);
}

/* An empty (never allocated) tensor has ndim 0, which tk_tensor_nbytes
 * counts as one scalar; it holds nothing. */
static size_t held(const tk_tensor *t) { return t->data ? tk_tensor_nbytes(t) : 0; }

size_t tk_adamw_state_bytes(const tk_adamw *o) {
    if (!o)
        return 0;
    size_t b = 0;
    for (int i = 0; i < o->n; i++) {
        const tk_adamw_slot *s = &o->slots[i];
        b += held(&s->m) + held(&s->v) + held(&s->mscale) + held(&s->vscale);
    }
    return b;
}

size_t tk_adamw_state_bytes_planned(const tk_adamw *o) {
    if (!o)
        return 0;
    size_t b = 0;
    for (int i = 0; i < o->n; i++)
        b += slot_bytes(&o->slots[i]);
    return b;
}

/* Zeroes an 8-bit moment through a host buffer: fill is defined for float
 * dtypes only. On meta the write is a no-op, the allocation is the same. */
static tk_status zero_bytes(tk_dev *d, tk_tensor *t, tk_err *err) {
    size_t nb = tk_tensor_nbytes(t);
    if (tk_dev_kind_of(d) == TK_DEV_META || nb == 0)
        return TK_OK;
    void *z = tk_calloc(1, nb);
    if (!z) {
        tk_err_set(err, TK_ENOMEM, "optimizer: out of host memory (%zu bytes)", nb);
        return TK_ENOMEM;
    }
    tk_status st = tk_tensor_write(d, t, z, err);
    free(z);
    return st;
}

static tk_status alloc_slot(tk_adamw *o, tk_adamw_slot *s, tk_err *err) {
    tk_dev *d = o->d;
    const char *owner = tk_alloc_owner_name(tk_dev_alloc(d), s->p.param->tag.owner);
    /* a piece of a parameter (ZeRO 1/2) is a 1-D run of its elements */
    int sharded = s->p.piece;
    int ndim = sharded ? 1 : s->p.param->ndim;
    const int64_t *shape = sharded ? &s->n : s->p.param->shape;
    int64_t n = s->n;
    tk_status st;
    if (!s->q8) {
        if ((st = tk_tensor_alloc(d, &s->m, TK_F32, ndim, shape, TK_CAT_OPTIM, owner, err)) != TK_OK)
            return st;
        if ((st = tk_op_fill(d, &s->m, 0.0f, n)) != TK_OK)
            return st;
        if ((st = tk_tensor_alloc(d, &s->v, TK_F32, ndim, shape, TK_CAT_OPTIM, owner, err)) != TK_OK)
            return st;
        return tk_op_fill(d, &s->v, 0.0f, n);
    }
    int64_t blocks = (n + TK_Q8_BLOCK - 1) / TK_Q8_BLOCK;
    if ((st = tk_tensor_alloc(d, &s->m, TK_I8, ndim, shape, TK_CAT_OPTIM, owner, err)) != TK_OK ||
        (st = zero_bytes(d, &s->m, err)) != TK_OK)
        return st;
    if ((st = tk_tensor_alloc(d, &s->mscale, TK_F32, 1, &blocks, TK_CAT_OPTIM, owner, err)) != TK_OK ||
        (st = tk_op_fill(d, &s->mscale, 0.0f, blocks)) != TK_OK)
        return st;
    if ((st = tk_tensor_alloc(d, &s->v, TK_U8, ndim, shape, TK_CAT_OPTIM, owner, err)) != TK_OK ||
        (st = zero_bytes(d, &s->v, err)) != TK_OK)
        return st;
    if ((st = tk_tensor_alloc(d, &s->vscale, TK_F32, 1, &blocks, TK_CAT_OPTIM, owner, err)) != TK_OK)
        return st;
    return tk_op_fill(d, &s->vscale, 0.0f, blocks);
}

static tk_status alloc_state(tk_adamw *o, tk_err *err) {
    for (int i = 0; i < o->n; i++) {
        tk_adamw_slot *s = &o->slots[i];
        if (s->p.frozen || s->n == 0)
            continue;
        tk_status st = alloc_slot(o, s, err);
        if (st != TK_OK) {
            free_state(o);
            return st;
        }
    }
    o->have_state = 1;
    return TK_OK;
}

int tk_adamw_n_slots(const tk_adamw *o) { return o ? o->n : 0; }

void tk_adamw_state_at(tk_adamw *o, int i, tk_adamw_state_view *out) {
    tk_adamw_slot *s = &o->slots[i];
    *out = (tk_adamw_state_view){ .name = s->p.name, .q8 = s->q8, .frozen = s->p.frozen,
                                  .m = &s->m, .v = &s->v, .mscale = &s->mscale, .vscale = &s->vscale,
                                  .piece = s->p.piece, .lo = s->lo, .n = s->n,
                                  .numel = tk_tensor_numel(s->p.param), .param = s->p.param };
}

void tk_adamw_moment_layout(const tk_adamw_state_view *v, int j, tk_adamw_moment *out) {
    memset(out, 0, sizeof *out);
    if (v->frozen || (j > 1 && !v->q8))
        return;
    out->present = 1;
    int64_t lo = v->piece ? v->lo : 0, n = v->piece ? v->n : v->numel;
    if (j < 2) {
        out->dtype = !v->q8 ? TK_F32 : j == 0 ? TK_I8 : TK_U8;
        out->ndim = v->param->ndim;
        memcpy(out->shape, v->param->shape, sizeof out->shape);
        out->numel = v->numel;
        out->off = lo;
        out->count = n;
        return;
    }
    /* pieces start on a TK_Q8_BLOCK boundary (TK_DP_CHUNK is a multiple),
     * so a piece's scales are whole blocks of the parameter's */
    out->dtype = TK_F32;
    out->ndim = 1;
    out->numel = out->shape[0] = (v->numel + TK_Q8_BLOCK - 1) / TK_Q8_BLOCK;
    out->off = lo / TK_Q8_BLOCK;
    out->count = n ? (lo + n + TK_Q8_BLOCK - 1) / TK_Q8_BLOCK - out->off : 0;
}

int tk_adamw_has_state(const tk_adamw *o) { return o && o->have_state; }

tk_status tk_adamw_alloc_state(tk_adamw *o, tk_err *err) {
    return o->have_state ? TK_OK : alloc_state(o, err);
}

void tk_adamw_set_steps(tk_adamw *o, int64_t steps) { o->step = steps; }

/* The end of both norms: the scratch released, the norm (sqrt of the sum
 * of squares, rounded once to float as sqrtf would) times |grad_scale|. */
static tk_status norm_done(tk_adamw *o, tk_status st, double sq, float grad_scale, float *norm, tk_err *err) {
    tk_tensor_free(o->d, &o->norm);
    if (st != TK_OK) {
        if (err && err->msg[0] == '\0')
            tk_err_set(err, st, "optimizer: gradient norm failed (%s)", tk_status_name(st));
        return st;
    }
    *norm = (float)sqrt(sq) * fabsf(grad_scale);
    return TK_OK;
}

/* Global L2 norm of all gradients times grad_scale (meta: 0). */
static tk_status global_norm(tk_adamw *o, float grad_scale, float *norm, tk_err *err) {
    tk_dev *d = o->d;
    int64_t one = 1;
    tk_status st = tk_tensor_alloc(d, &o->norm, TK_F32, 1, &one, TK_CAT_TEMP, "optimizer", err);
    if (st != TK_OK)
        return st;
    /* every gradient in one sum (one launch on cuda) */
    const tk_tensor **gs = tk_malloc((size_t)(o->n ? o->n : 1) * sizeof *gs);
    if (!gs) {
        tk_tensor_free(d, &o->norm);
        return tk_err_nomem(err, "the gradient norm");
    }
    int ng = 0;
    for (int i = 0; i < o->n; i++) {
        tk_adamw_slot *s = &o->slots[i];
        if (!s->p.frozen && s->p.grad && s->p.grad->data)
            gs[ng++] = s->p.grad;
    }
    st = tk_op_sumsq_many(d, &o->norm, gs, ng);
    free(gs);
    float sq = 0.0f;
    if (st == TK_OK && tk_dev_kind_of(d) != TK_DEV_META)
        st = tk_tensor_read(d, &o->norm, &sq, err);
    return norm_done(o, st, sq, grad_scale, norm, err);
}

/* The sharded norm: one sum of squares per TK_DP_CHUNK of every trainable
 * parameter (this rank's chunks filled, the others 0), summed over the
 * ranks, then added up in chunk order on the host: the same sum whatever
 * the ranks (meta: 0). */
static tk_status chunked_norm(tk_adamw *o, float grad_scale, float *norm, tk_err *err) {
    tk_dev *d = o->d;
    int64_t nc = 0;
    for (int i = 0; i < o->n; i++)
        if (!o->slots[i].p.frozen)
            nc += (tk_tensor_numel(o->slots[i].p.param) + TK_DP_CHUNK - 1) / TK_DP_CHUNK;
    if (nc == 0) nc = 1;
    tk_status st = tk_tensor_alloc(d, &o->norm, TK_F32, 1, &nc, TK_CAT_TEMP, "optimizer", err);
    if (st == TK_OK)
        st = tk_op_fill(d, &o->norm, 0.0f, nc);
    int64_t base = 0;
    for (int i = 0; i < o->n && st == TK_OK; i++) {
        tk_adamw_slot *s = &o->slots[i];
        if (s->p.frozen)
            continue;
        int64_t total = tk_tensor_numel(s->p.param);
        for (int64_t e = s->lo; e < s->lo + s->n && st == TK_OK && s->p.grad && s->p.grad->data; e += TK_DP_CHUNK) {
            int64_t len = s->lo + s->n - e < TK_DP_CHUNK ? s->lo + s->n - e : TK_DP_CHUNK;
            tk_tensor g = tk_tensor_view(s->p.grad, s->p.grad_is_piece ? e - s->lo : e, len);
            tk_tensor out = tk_tensor_view(&o->norm, base + e / TK_DP_CHUNK, 1);
            st = tk_op_sumsq(d, &out, &g, len, 0);
        }
        base += (total + TK_DP_CHUNK - 1) / TK_DP_CHUNK;
    }
    if (st == TK_OK)
        st = tk_coll_all_reduce(o->coll, o->norm.data, nc, err);
    double sq = 0.0;
    if (st == TK_OK && tk_dev_kind_of(d) != TK_DEV_META) {
        float *h = tk_malloc((size_t)nc * sizeof *h);
        if (!h) {
            tk_tensor_free(d, &o->norm);
            return tk_err_nomem(err, "the gradient norm");
        }
        if ((st = tk_tensor_read(d, &o->norm, h, err)) == TK_OK)
            for (int64_t k = 0; k < nc; k++) sq += (double)h[k];
        free(h);
    }
    return norm_done(o, st, sq, grad_scale, norm, err);
}

tk_status tk_adamw_step(tk_adamw *o, float lr, float grad_scale, float *grad_norm, int *skipped,
                        tk_err *err) {
    if (skipped)
        *skipped = 0;
    if (grad_norm)
        *grad_norm = 0.0f;
    if (!o) {
        tk_err_set(err, TK_EINVAL, "optimizer: NULL");
        return TK_EINVAL;
    }
    /* the allocator's history says which step part made a tensor */
    tk_alloc_set_phase(tk_dev_alloc(o->d), "optimizer");
    tk_status st;
    if (!o->have_state && (st = alloc_state(o, err)) != TK_OK)
        return st;

    float norm = 0.0f;
    if ((st = o->coll ? chunked_norm(o, grad_scale, &norm, err) : global_norm(o, grad_scale, &norm, err)) != TK_OK)
        return st;
    if (grad_norm)
        *grad_norm = norm;
    if (!isfinite(norm)) {
        /* An fp16 overflow (or a NaN loss): torch's GradScaler skips the step. */
        if (skipped)
            *skipped = 1;
        return TK_OK;
    }
    float clip = 1.0f;
    if (o->max_grad_norm > 0) {
        float coef = o->max_grad_norm / (norm + 1e-6f);
        if (coef < 1.0f)
            clip = coef;
    }

    o->step++;
    /* f32 state: one table for all of it (one launch on cuda); 8-bit state:
     * a call per parameter */
    tk_adamw_item *items = tk_malloc((size_t)(o->n ? o->n : 1) * sizeof *items);
    if (!items)
        return tk_err_nomem(err, "optimizer: the parameter table");
    int ni = 0;
    const tk_adamw_hp hp = {
        .lr = lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps, .weight_decay = o->weight_decay,
        .grad_scale = grad_scale * clip, .step = o->step,
    };
    for (int i = 0; i < o->n && st == TK_OK; i++) {
        tk_adamw_slot *s = &o->slots[i];
        if (s->p.frozen || !s->p.grad || !s->p.grad->data || s->n == 0)
            continue;
        int64_t n = s->n;
        tk_tensor pv = tk_tensor_view(s->p.param, s->lo, n);
        tk_tensor gv = tk_tensor_view(s->p.grad, s->p.grad_is_piece ? 0 : s->lo, n);
        if (!s->q8) {
            items[ni++] = (tk_adamw_item){ .param = pv, .grad = gv, .m = s->m, .v = s->v, .n = n,
                                           .no_decay = s->p.no_decay };
            continue;
        }
        tk_adamw_hp h = hp;
        if (s->p.no_decay)
            h.weight_decay = 0.0f;
        st = tk_op_adamw8(o->d, &pv, &gv, &s->m, &s->mscale, &s->v, &s->vscale, n, &h);
        if (st != TK_OK)
            tk_err_set(err, st, "optimizer: update of %s failed (%s)", s->p.name ? s->p.name : "?",
                       tk_dev_last_err(o->d) ? tk_dev_last_err(o->d)->msg : tk_status_name(st));
    }
    if (st == TK_OK && (st = tk_op_adamw_many(o->d, items, ni, &hp)) != TK_OK)
        tk_err_set(err, st, "optimizer: the AdamW update failed (%s)",
                   tk_dev_last_err(o->d) ? tk_dev_last_err(o->d)->msg : tk_status_name(st));
    free(items);
    return st;
}
