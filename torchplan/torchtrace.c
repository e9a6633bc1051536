/* torchtrace.c — a traced training step (tk_torchtrace.h) replayed through
 * txkernel's caching allocator with PyTorch's rounding, pools and splits.
 *
 * Guarantees: the events are read once, in order; every allocation the
 * trace names is freed at most once (a release of an unknown id is an
 * error naming the event); the first step's peak is step 0's, the steady
 * peak the largest of the later steps', each as max_memory_allocated()
 * reports it with the peak reset at the step's start. Nothing is ever
 * dereferenced: the device is a counter of fake addresses.
 *
 * The card's own rules (what differs from the CPU's trace) are the ones
 * torchplan.c follows for BERT, applied per op event:
 *  - dropout: native_dropout keeps a 1-byte mask per element
 *    (aten/src/ATen/native/cuda/Dropout.cu), where the CPU keeps a noise
 *    tensor of the input's dtype and two scalars;
 *  - scaled_dot_product_attention: the card's choice
 *    (sdp_utils.cpp: flash on sm80+ for 16-bit, head_dim <= 256 and a
 *    multiple of 8, no mask; else memory-efficient from sm50 with head_dim a
 *    multiple of 8; else math, which is the CPU's trace): the fused kernels
 *    keep the output (the model's), logsumexp (B, h, T) fp32 — padded to 32
 *    rows by the efficient kernel — and 16 B of RNG state with dropout, and
 *    in backward a scratch (an fp32 dq accumulator and the row deltas);
 *  - GEMMs: cuBLAS's workspace per (thread, stream) and cuBLASLt's for a
 *    biased one, kept or per call as the torch version does
 *    (tk_torch_blas_rules). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_torchtrace.h"
#include "tk_host_mem.h"

static int fake_seg_alloc(void *ctx, size_t bytes, void **ptr) {
    uintptr_t *next = ctx;
    *ptr = (void *)*next;
    *next += (bytes + 4095) & ~(uintptr_t)4095;
    return 0;
}
static void fake_seg_free(void *ctx, void *ptr, size_t bytes) { (void)ctx, (void)ptr, (void)bytes; }

/* One card-dependent op of the trace, as the card runs it. */
typedef struct {
    int kind;                     /* OP_DROPOUT, OP_SDPA */
    int fused;                    /* sdpa: a fused kernel (flash or efficient) replaces the CPU's buffers */
    size_t mask_bytes;            /* dropout: the 1-byte mask */
    int64_t largest_id;           /* dropout: the CPU noise's storage id (the mask takes its place) */
    size_t saved_bytes[3];        /* sdpa fused: logsumexp, RNG state, the padded additive mask */
    void *saved[3];
    size_t scratch;               /* sdpa fused: backward's scratch */
    int64_t *keep;                /* sdpa fused: the storages the kernel keeps for backward (q, k, v, mask, output) */
    int nkeep;
    int64_t copy, out;            /* sdpa fused: the CPU's contiguous copy of the output (-1 none), and the
                                     output it copies: on the card the copy is a view of it */
    int held;                     /* its keep is held now (between its fwd and bwd_end events) */
    int checkpointed;             /* sdpa: run inside checkpointing (or without grad): the card keeps nothing */
    int of;                       /* sdpa: a recomputation in backward of this checkpointed op (-1 none): it
                                     ends with that op's backward */
    int owner;
} op_rule;
enum { OP_OTHER = 0, OP_DROPOUT, OP_SDPA };

typedef struct {
    tk_alloc *a;
    void **ptr;                   /* by storage id */
    int *skip;                    /* by storage id: the card makes no such storage */
    int *hold;                    /* by storage id: fused attention ops keeping it for their backward */
    char *pending;                /* by storage id: released by the trace while held: freed at the last bwd_end */
    int64_t *alias;               /* by storage id: the fused attention output it is a view of on the card, or -1 */
    int64_t nid;
    op_rule *ops;
    int nops;
    int cuda;
    tk_torch_blas blas;
    void *w[2], *lt[2];           /* the kept workspaces: the forward thread's, autograd's */
    int own_cublas, own_lt;
} replay;

static const char *const CATS[] = {"param", "grad", "optim", "act", "temp", "workspace", "input"};

static int cat_of(const char *s) {
    for (int c = 0; c < TK_CAT_COUNT; c++)
        if (!strcmp(s, CATS[c])) return c;
    return -1;
}

static size_t numel(const json_t *shape) {
    size_t n = 1, i;
    json_t *v;
    json_array_foreach(shape, i, v) n *= (size_t)json_integer_value(v);
    return n;
}

static size_t dtype_size(const char *d) {
    if (!d) return 4;
    if (!strcmp(d, "float16") || !strcmp(d, "bfloat16")) return 2;
    if (!strcmp(d, "float64") || !strcmp(d, "int64")) return 8;
    return 4;
}

/* Which attention kernel the card runs for one SDPA op, and what it keeps. */
static const char *sdpa_rule(const json_t *op, const tk_gpu_profile *prof, op_rule *r) {
    const json_t *q = json_object_get(op, "shape");
    size_t nd = json_array_size(q);
    if (nd < 3) return "sdpa (math)";
    size_t B = 1;
    for (size_t i = 0; i + 2 < nd; i++) B *= (size_t)json_integer_value(json_array_get(q, i));
    size_t T = (size_t)json_integer_value(json_array_get(q, nd - 2)), D = (size_t)json_integer_value(json_array_get(q, nd - 1));
    size_t esz = dtype_size(json_string_value(json_object_get(op, "dtype")));
    int mask = json_is_true(json_object_get(op, "mask"));
    double p = json_real_value(json_object_get(op, "p"));
    int cc = prof->cc_major;
    int flash = cc >= 8 && esz == 2 && D <= 256 && D % 8 == 0 && !mask;
    int eff = !flash && cc >= 5 && D % 8 == 0;
    if (!flash && !eff) return "sdpa (math)";
    r->fused = 1;
    size_t lse_t = eff ? (T + 31) / 32 * 32 : T;
    r->saved_bytes[0] = B * lse_t * 4;
    r->saved_bytes[1] = p > 0 ? 16 : 0;
    if (mask) { /* the additive mask, its keys padded to 16 (attention.cpp preprocess_mask) */
        const json_t *ms = json_object_get(op, "mask_shape");
        size_t mn = numel(ms), keys = (size_t)json_integer_value(json_array_get(ms, json_array_size(ms) - 1));
        r->saved_bytes[2] = keys ? mn / keys * ((keys + 15) / 16 * 16) * esz : 0;
    }
    r->scratch = (esz == 2 || !eff ? B * T * D * 4 : 0) + B * lse_t * 4;
    return eff ? (mask ? "sdpa (efficient: flash takes no mask)" : "sdpa (efficient)") : "sdpa (flash)";
}

static tk_status new_block(replay *r, size_t bytes, tk_cat cat, int owner, void **p, tk_err *err) {
    tk_tag tag = {cat, owner};
    *p = NULL;
    tk_status st = tk_alloc_malloc(r->a, bytes, tag, p, NULL);
    if (st != TK_OK) tk_err_set(err, st, "engine pytorch (traced): the simulated allocator failed (%s)", tk_status_name(st));
    return st;
}

/* A GEMM on thread th (1: autograd's): its workspaces as this torch keeps them. */
static tk_status gemm(replay *r, int th, int lt, tk_err *err) {
    if (!r->cuda || (r->blas.where == TK_BLAS_W_OUTSIDE && r->blas.lt != TK_BLAS_LT_PER_CALL)) return TK_OK;
    void *w = NULL;
    tk_status st = TK_OK;
    if (r->blas.where != TK_BLAS_W_OUTSIDE && !r->w[th]) {
        if ((st = new_block(r, r->blas.w_bytes, TK_CAT_WORKSPACE, r->own_cublas, &w, err)) != TK_OK) return st;
        if (r->blas.where == TK_BLAS_W_KEPT) r->w[th] = w, w = NULL;
    }
    if (lt && (r->blas.lt == TK_BLAS_LT_PER_CALL || (r->blas.lt == TK_BLAS_LT_KEPT && !r->lt[th]))) {
        void *l;
        if ((st = new_block(r, r->blas.lt_bytes, TK_CAT_WORKSPACE, r->own_lt, &l, err)) != TK_OK) return st;
        if (r->blas.lt == TK_BLAS_LT_KEPT) r->lt[th] = l;
        else tk_alloc_free(r->a, l);
    }
    tk_alloc_free(r->a, w);
    return TK_OK;
}

/* The replay up to event `stop` (-1: all): peaks per step into out->plan;
 * with stop >= 0 the allocator is left as it was just after that event. */
/* A fused attention op's backward is done: what it kept for it goes. */
static void end_op(replay *r, op_rule *o) {
    for (int j = 0; j < 3; j++) tk_alloc_free(r->a, o->saved[j]), o->saved[j] = NULL;
    for (int j = 0; j < o->nkeep && o->held; j++) {
        int64_t id = o->keep[j];
        if (id < 0 || id >= r->nid || !r->hold[id] || --r->hold[id] || !r->pending[id]) continue;
        tk_alloc_free(r->a, r->ptr[id]);
        r->ptr[id] = NULL;
        r->pending[id] = 0;
    }
    o->held = 0;
}

static tk_status run(replay *r, const json_t *events, long stop, int steps, tk_torchtrace_result *out,
                     long *steady_peak_at, tk_err *err) {
    size_t n = json_array_size(events);
    tk_alloc_stats stats;
    int step = -1;
    size_t best = 0;
    for (size_t i = 0; i < n && (stop < 0 || (long)i <= stop); i++) {
        const json_t *ev = json_array_get(events, i);
        const char *k = json_string_value(json_array_get(ev, 0));
        if (!k) goto bad;
        if (!strcmp(k, "a")) {
            int64_t id = json_integer_value(json_array_get(ev, 1));
            size_t bytes = (size_t)json_integer_value(json_array_get(ev, 2));
            int cat = cat_of(json_string_value(json_array_get(ev, 3)) ? json_string_value(json_array_get(ev, 3)) : "");
            int owner = (int)json_integer_value(json_array_get(ev, 4));
            int op = (int)json_integer_value(json_array_get(ev, 5));
            if (id < 0 || id >= r->nid || cat < 0 || owner < 0) goto bad;
            if (r->ptr[id]) goto bad;
            if (r->cuda && op >= 0 && op < r->nops) {
                op_rule *o = &r->ops[op];
                if (o->kind == OP_DROPOUT) {
                    if (id != o->largest_id) { r->skip[id] = 1; continue; }
                    bytes = o->mask_bytes;
                } else if (o->kind == OP_SDPA && o->fused) {
                    r->skip[id] = 1;
                    continue;
                }
            }
            if (r->alias && r->alias[id] >= 0) { /* a view of a fused attention output on the card */
                int64_t of = r->alias[id];
                if (of >= 0 && of < r->nid && r->ptr[of]) {
                    r->hold[of]++;
                    r->skip[id] = 2;
                    continue;
                }
            }
            /* the cpu has no caching allocator: a storage is its bytes, rounded to 512 as the reference
             * rounds them (counted by the allocator's requested bytes) */
            if (!r->cuda) bytes = bytes <= 512 ? 512 : (bytes + 511) / 512 * 512;
            tk_status st = new_block(r, bytes, (tk_cat)cat, owner, &r->ptr[id], err);
            if (st != TK_OK) return st;
            if (bytes == 0) r->skip[id] = 1;
        } else if (!strcmp(k, "f")) {
            int64_t id = json_integer_value(json_array_get(ev, 1));
            if (id < 0 || id >= r->nid) goto bad;
            if (r->skip[id] == 2) { /* the view goes: the output it kept may go too */
                int64_t of = r->alias[id];
                if (r->hold[of] && !--r->hold[of] && r->pending[of]) {
                    tk_alloc_free(r->a, r->ptr[of]);
                    r->ptr[of] = NULL;
                    r->pending[of] = 0;
                }
                continue;
            }
            if (r->skip[id]) continue;
            if (!r->ptr[id]) goto bad;
            if (r->hold[id]) {
                r->pending[id] = 1;
                continue;
            }
            tk_alloc_free(r->a, r->ptr[id]);
            r->ptr[id] = NULL;
        } else if (!strcmp(k, "s")) {
            int s = (int)json_integer_value(json_array_get(ev, 1));
            tk_alloc_stats_get(r->a, &stats);
            size_t peak = r->cuda ? stats.allocated_peak : stats.requested_peak;
            if (step == 0) out->plan.first_step_peak_allocated = peak;
            if (step >= 1 && peak > out->plan.peak_allocated) {
                out->plan.peak_allocated = peak;
                memcpy(out->plan.by_cat_at_peak, stats.by_cat_at_peak, sizeof stats.by_cat_at_peak);
            }
            if (step >= 0 && stats.reserved_peak > out->plan.peak_reserved) out->plan.peak_reserved = stats.reserved_peak;
            step = s;
            if (s < steps) tk_alloc_reset_peak(r->a); /* the end mark keeps the last step's peak state */
        } else if (!strcmp(k, "g")) {
            tk_status st = gemm(r, json_integer_value(json_array_get(ev, 1)) != 0,
                                json_integer_value(json_array_get(ev, 2)) != 0, err);
            if (st != TK_OK) return st;
        } else if (!strcmp(k, "op")) {
            int op = (int)json_integer_value(json_array_get(ev, 1));
            const char *ph = json_string_value(json_array_get(ev, 2));
            if (op < 0 || op >= r->nops || !ph) goto bad;
            op_rule *o = &r->ops[op];
            if (!r->cuda || o->kind != OP_SDPA || !o->fused) continue;
            if (!strcmp(ph, "fwd")) {
                if (o->checkpointed) continue; /* its recomputation keeps what the backward needs */
                for (int j = 0; j < o->nkeep && !o->held; j++)
                    if (o->keep[j] >= 0 && o->keep[j] < r->nid && r->ptr[o->keep[j]]) r->hold[o->keep[j]]++;
                o->held = 1;
                for (int j = 0; j < 3; j++) {
                    if (!o->saved_bytes[j] || o->saved[j]) continue;
                    tk_status st = new_block(r, o->saved_bytes[j], TK_CAT_ACT, o->owner, &o->saved[j], err);
                    if (st != TK_OK) return st;
                }
            } else if (!strcmp(ph, "bwd")) {
                void *sc = NULL;
                tk_status st = new_block(r, o->scratch, TK_CAT_TEMP, o->owner, &sc, err);
                if (st != TK_OK) return st;
                tk_alloc_free(r->a, sc);
            } else if (!strcmp(ph, "bwd_end")) {
                end_op(r, o);
                for (int j = op + 1; j < r->nops; j++) /* its recomputation (non-reentrant checkpointing) ends here */
                    if (r->ops[j].of == op) end_op(r, &r->ops[j]);
            }
        } else {
            goto bad;
        }
        if (step >= 1 && steady_peak_at) {
            tk_alloc_stats_get(r->a, &stats);
            size_t now = r->cuda ? stats.allocated : stats.requested;
            if (now > best) best = now, *steady_peak_at = (long)i;
        }
        continue;
    bad:
        tk_err_set(err, TK_EINVAL, "trace: event %zu is not an event this engine reads (expected [\"a\", id, bytes, cat, "
                                   "owner, op], [\"f\", id] of a live id, [\"s\", step], [\"g\", backward, bias] or "
                                   "[\"op\", op, phase])", i);
        return TK_EINVAL;
    }
    if (stop < 0 && step < 1) {
        tk_err_set(err, TK_EINVAL, "trace: \"events\" holds no steady step (two step marks and an end mark expected)");
        return TK_EINVAL;
    }
    return TK_OK;
}

static void replay_free(replay *r) {
    tk_alloc_destroy(&r->a);
    for (int i = 0; r->ops && i < r->nops; i++) free(r->ops[i].keep);
    free(r->ptr), free(r->skip), free(r->hold), free(r->pending), free(r->alias), free(r->ops);
    memset(r, 0, sizeof *r);
}

/* A fresh allocator and the op rules for the card (prof NULL: the cpu). */
static tk_status replay_init(replay *r, const json_t *trace, const tk_gpu_profile *prof, tk_torch_version tv,
                             uintptr_t *next_addr, tk_torchtrace_result *out, tk_err *err) {
    memset(r, 0, sizeof *r);
    const json_t *events = json_object_get(trace, "events"), *ops = json_object_get(trace, "ops");
    const json_t *owners = json_object_get(trace, "owners");
    tk_devmem dm = {fake_seg_alloc, fake_seg_free, next_addr};
    r->a = tk_alloc_new(dm, 0);
    if (!r->a) return tk_err_nomem(err, "traced plan");
    size_t i;
    json_t *v;
    json_array_foreach(owners, i, v) {
        const char *name = json_string_value(v);
        if (tk_alloc_owner_id(r->a, name && *name ? name : "(model)") != (int)i) return tk_err_nomem(err, "traced plan");
    }
    r->own_cublas = tk_alloc_owner_id(r->a, "cublas");
    r->own_lt = tk_alloc_owner_id(r->a, "cublasLt");
    json_array_foreach(events, i, v) {
        const char *k = json_string_value(json_array_get(v, 0));
        if (k && !strcmp(k, "a") && json_integer_value(json_array_get(v, 1)) >= r->nid)
            r->nid = json_integer_value(json_array_get(v, 1)) + 1;
    }
    r->nops = (int)json_array_size(ops);
    r->ptr = tk_calloc((size_t)r->nid + 1, sizeof *r->ptr);
    r->skip = tk_calloc((size_t)r->nid + 1, sizeof *r->skip);
    r->ops = tk_calloc((size_t)r->nops + 1, sizeof *r->ops);
    r->hold = tk_calloc((size_t)r->nid + 1, sizeof *r->hold);
    r->pending = tk_calloc((size_t)r->nid + 1, 1);
    r->alias = tk_calloc((size_t)r->nid + 1, sizeof *r->alias);
    if (!r->alias) return tk_err_nomem(err, "traced plan");
    for (int64_t id = 0; id <= r->nid; id++) r->alias[id] = -1;
    if (!r->ptr || !r->skip || !r->ops || !r->hold || !r->pending) return tk_err_nomem(err, "traced plan");
    r->cuda = prof != NULL;
    if (r->cuda) tk_torch_blas_rules(tv, prof->cc_major, prof->cc_minor, &r->blas);
    const char *attention = NULL;
    json_array_foreach(ops, i, v) {
        const char *kind = json_string_value(json_object_get(v, "kind"));
        op_rule *o = &r->ops[i];
        const char *mod = json_string_value(json_object_get(v, "module"));
        o->owner = tk_alloc_owner_id(r->a, mod && *mod ? mod : "(model)");
        o->largest_id = -1;
        o->checkpointed = json_is_true(json_object_get(v, "checkpointed"));
        const json_t *of = json_object_get(v, "of");
        o->of = json_is_integer(of) && json_integer_value(of) >= 0 && json_integer_value(of) < (json_int_t)i
                    ? (int)json_integer_value(of) : -1;
        if (kind && !strcmp(kind, "dropout")) {
            o->kind = OP_DROPOUT;
            o->mask_bytes = numel(json_object_get(v, "shape"));
            out->n_dropout++;
        } else if (kind && !strcmp(kind, "sdpa")) {
            o->kind = OP_SDPA;
            const char *a = r->cuda ? sdpa_rule(v, prof, o) : NULL;
            const json_t *keep = json_object_get(v, "keep");
            if (o->fused && json_array_size(keep)) {
                o->keep = tk_calloc(json_array_size(keep), sizeof *o->keep);
                if (!o->keep) return tk_err_nomem(err, "traced plan");
                for (size_t j = 0; j < json_array_size(keep); j++) o->keep[j] = json_integer_value(json_array_get(keep, j));
                o->nkeep = (int)json_array_size(keep);
                /* the output is the keep's last; its first contiguous copy becomes a view of it */
                const json_t *copies = json_object_get(v, "copies");
                int64_t c = json_array_size(copies) ? json_integer_value(json_array_get(copies, 0)) : -1;
                if (c >= 0 && c < r->nid) r->alias[c] = o->keep[o->nkeep - 1];
            }
            if (!attention) attention = a;
            out->n_sdpa++;
        }
    }
    /* a dropout's mask takes the place of the largest storage the CPU made for it (its noise) */
    size_t best_bytes = 0;
    json_array_foreach(events, i, v) {
        const char *k = json_string_value(json_array_get(v, 0));
        if (!k || strcmp(k, "a")) continue;
        int op = (int)json_integer_value(json_array_get(v, 5));
        if (op < 0 || op >= r->nops || r->ops[op].kind != OP_DROPOUT) continue;
        size_t b = (size_t)json_integer_value(json_array_get(v, 2));
        if (r->ops[op].largest_id < 0 || b > best_bytes) {
            r->ops[op].largest_id = json_integer_value(json_array_get(v, 1));
            best_bytes = b;
        }
    }
    if (out->n_sdpa)
        out->plan.attention = r->cuda ? (attention ? attention : "sdpa") : "sdpa (as the CPU ran it)";
    else
        out->plan.attention = "eager or none (no scaled_dot_product_attention in the step)";
    return TK_OK;
}

tk_status tk_torchtrace_plan(const json_t *trace, const char *gpu, tk_torch_version tv, tk_torchtrace_result *out,
                             tk_err *err) {
    memset(out, 0, sizeof *out);
    const json_t *events = json_object_get(trace, "events");
    if (!json_is_object(trace) || !json_is_array(events) || !json_is_array(json_object_get(trace, "owners")) ||
        !json_is_array(json_object_get(trace, "ops"))) {
        tk_err_set(err, TK_EINVAL, "trace: expected an object with \"events\", \"ops\" and \"owners\" arrays "
                                   "(python/txkernel/trace.py writes it)");
        return TK_EINVAL;
    }
    const tk_gpu_profile *prof = NULL;
    if (gpu && *gpu && !(prof = tk_gpu_profile_find(gpu))) {
        tk_err_set(err, TK_EINVAL, "gpu: '%s' is not a known GPU profile", gpu);
        return TK_EINVAL;
    }
    tk_torchplan_result *p = &out->plan;
    const char *model = json_string_value(json_object_get(trace, "model"));
    snprintf(out->model, sizeof out->model, "%s", model ? model : "the model");
    const char *loss = json_string_value(json_object_get(trace, "loss"));
    snprintf(out->loss, sizeof out->loss, "%s", !loss ? "?" : !strcmp(loss, "model") ? "the model's own"
                                                 : !strcmp(loss, "ce") ? "cross-entropy" : loss);
    p->batch = (int)json_integer_value(json_object_get(trace, "batch"));
    p->seq = (int)json_integer_value(json_object_get(trace, "seq"));
    p->accumulate = 1;
    p->on_cuda = prof != NULL;
    p->device = prof ? "cuda" : "cpu";
    p->torch_version = tk_torchplan_label(tv);
    p->transformers_version = "";
    const char *prec = json_string_value(json_object_get(trace, "precision"));
    p->precision = prec && !strcmp(prec, "bf16") ? "bf16 autocast" : prec && !strcmp(prec, "fp16") ? "fp16 autocast" : "fp32";
    const char *opt = json_string_value(json_object_get(trace, "optimizer"));
    /* "foreach": as the tracer ran it (torch 1.13 runs single-tensor on a card too); a trace without it: on a card */
    const json_t *fe = json_object_get(trace, "foreach");
    int foreach = fe ? json_is_true(fe) : prof != NULL;
    p->optimizer = opt && !strcmp(opt, "adamw_torch_fused") ? "AdamW (fused)"
                   : opt && !strcmp(opt, "sgd")             ? "SGD"
                   : opt && !strcmp(opt, "adam")            ? (foreach ? "Adam (foreach)" : "Adam (single-tensor)")
                   : foreach                                ? "AdamW (foreach)"
                                                            : "AdamW (single-tensor)";
    p->n_params = json_integer_value(json_object_get(trace, "n_params"));
    p->n_trainable = json_integer_value(json_object_get(trace, "n_trainable"));
    p->world_size = 1;
    p->checked = prof ? "the step traced on the CPU, the card's kernels sized by their CUDA rules"
                      : "the step as PyTorch's CPU allocator runs it";
    snprintf(p->seq_from, sizeof p->seq_from, "the traced batch");
    if (prof) snprintf(p->gpu, sizeof p->gpu, "%s", prof->name);

    replay r;
    uintptr_t next_addr = 1 << 20;
    long peak_at = -1;
    int steps = (int)json_integer_value(json_object_get(trace, "steps"));
    if (steps < 2) {
        tk_err_set(err, TK_EINVAL, "trace: \"steps\" is %d: a first and a steady step are needed", steps);
        return TK_EINVAL;
    }
    tk_status st = replay_init(&r, trace, prof, tv, &next_addr, out, err);
    if (st == TK_OK) st = run(&r, events, -1, steps, out, &peak_at, err);
    if (st == TK_OK && prof) {
        p->workspace_bytes = r.blas.w_bytes;
        p->workspaces = r.blas.source;
        for (int th = 0; th < 2; th++) {
            p->n_workspaces += r.w[th] != NULL;
            if (r.lt[th]) p->lt_workspace_bytes += r.blas.lt_bytes;
        }
        if (r.blas.where == TK_BLAS_W_OUTSIDE) p->outside_bytes = 2 * r.blas.w_bytes;
    }
    if (st == TK_OK) {
        tk_alloc_stats all;
        tk_alloc_stats_get(r.a, &all);
        p->param_bytes = all.by_cat[TK_CAT_PARAM];
        p->grad_bytes = all.by_cat[TK_CAT_GRAD];
        p->optim_bytes = all.by_cat[TK_CAT_OPTIM];
        /* by module at the steady peak */
        int no = tk_alloc_n_owners(r.a);
        for (int o = 0; o < no; o++) {
            size_t b = 0;
            for (int c = 0; c < TK_CAT_COUNT; c++) b += tk_alloc_owner_at_peak(r.a, o, (tk_cat)c);
            if (!b) continue;
            int k = out->n_modules < TK_TRACE_TOP ? out->n_modules++ : TK_TRACE_TOP - 1;
            if (k == TK_TRACE_TOP - 1 && out->n_modules == TK_TRACE_TOP && out->modules[k].bytes >= b) continue;
            snprintf(out->modules[k].name, sizeof out->modules[k].name, "%s", tk_alloc_owner_name(r.a, o));
            out->modules[k].bytes = b;
            for (; k > 0 && out->modules[k].bytes > out->modules[k - 1].bytes; k--) {
                typeof(out->modules[0]) t = out->modules[k];
                out->modules[k] = out->modules[k - 1], out->modules[k - 1] = t;
            }
        }
    }
    replay_free(&r);
    /* the largest storages at the steady peak: the replay again, stopped there */
    if (st == TK_OK && peak_at >= 0) {
        tk_torchtrace_result scratch;
        memset(&scratch, 0, sizeof scratch);
        next_addr = 1 << 20;
        st = replay_init(&r, trace, prof, tv, &next_addr, &scratch, err);
        if (st == TK_OK) st = run(&r, events, peak_at, steps, &scratch, NULL, err);
        for (int64_t id = 0; st == TK_OK && id < r.nid; id++) {
            if (!r.ptr[id]) continue;
            size_t b = tk_alloc_block_size(r.a, r.ptr[id]);
            int k = out->n_largest < TK_TRACE_TOP ? out->n_largest++ : TK_TRACE_TOP - 1;
            if (k == TK_TRACE_TOP - 1 && out->n_largest == TK_TRACE_TOP && out->largest[k].bytes >= b) continue;
            /* the block's tag: found again from the event that made it */
            out->largest[k].bytes = b;
            out->largest[k].cat = TK_CAT_ACT;
            out->largest[k].owner[0] = 0;
            size_t i;
            json_t *v;
            json_array_foreach(events, i, v) {
                const char *kk = json_string_value(json_array_get(v, 0));
                if (kk && !strcmp(kk, "a") && json_integer_value(json_array_get(v, 1)) == id) {
                    int c = cat_of(json_string_value(json_array_get(v, 3)));
                    out->largest[k].cat = c < 0 ? TK_CAT_ACT : (tk_cat)c;
                    snprintf(out->largest[k].owner, sizeof out->largest[k].owner, "%s",
                             tk_alloc_owner_name(r.a, (int)json_integer_value(json_array_get(v, 4))));
                    break;
                }
            }
            for (; k > 0 && out->largest[k].bytes > out->largest[k - 1].bytes; k--) {
                typeof(out->largest[0]) t = out->largest[k];
                out->largest[k] = out->largest[k - 1], out->largest[k - 1] = t;
            }
        }
        replay_free(&r);
    }
    if (st != TK_OK) return st;
    p->context_bytes = tk_torchplan_context(prof);
    p->capacity = prof ? prof->capacity : 0;
    p->device_used = p->peak_reserved + p->context_bytes + p->outside_bytes;
    p->fits = !p->capacity || p->device_used <= p->capacity;
    return TK_OK;
}

json_t *tk_torchtrace_json(const tk_torchtrace_result *r) {
    json_t *j = tk_torchplan_json(&r->plan);
    json_t *mods = json_array(), *big = json_array();
    if (!j || !mods || !big) goto fail;
    for (int i = 0; i < r->n_modules; i++)
        if (json_array_append_new(mods, json_pack("{s:s, s:I}", "module", r->modules[i].name, "bytes",
                                                  (json_int_t)r->modules[i].bytes)))
            goto fail;
    for (int i = 0; i < r->n_largest; i++)
        if (json_array_append_new(big, json_pack("{s:s, s:s, s:I}", "module", r->largest[i].owner, "category",
                                                 tk_cat_name(r->largest[i].cat), "bytes", (json_int_t)r->largest[i].bytes)))
            goto fail;
    json_t *by_cat = json_object();
    for (int c = 0; by_cat && c < TK_CAT_COUNT; c++)
        json_object_set_new(by_cat, tk_cat_name((tk_cat)c), json_integer((json_int_t)r->plan.by_cat_at_peak[c]));
    if (json_object_set_new(j, "traced", json_true()) || json_object_set_new(j, "model", json_string(r->model)) ||
        json_object_set_new(j, "loss", json_string(r->loss)) || json_object_set_new(j, "by_module", mods) ||
        json_object_set_new(j, "largest", big) || json_object_set_new(j, "by_category_at_peak", by_cat ? by_cat : json_null()) ||
        json_object_set_new(j, "sdpa_ops", json_integer(r->n_sdpa)) ||
        json_object_set_new(j, "dropout_ops", json_integer(r->n_dropout)))
        goto fail_j;
    return j;
fail:
    json_decref(mods), json_decref(big);
fail_j:
    json_decref(j);
    return NULL;
}
