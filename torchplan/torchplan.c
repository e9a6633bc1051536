/* torchplan.c — a transformers BERT training step as PyTorch allocates it.
 *
 * A small model of PyTorch's autograd drives txkernel's caching allocator:
 *  - a tensor is a block plus a reference count (Python names, autograd's
 *    saved variables and gradient buffers each hold one); it is freed when
 *    the count drops to zero, as PyTorch frees a storage;
 *  - the forward pass is transformers' BertModel written op by op: each op
 *    allocates its output (and its scratch), and records an autograd node
 *    that holds what the op saves for backward and where each input's
 *    gradient goes;
 *  - backward runs the nodes in reverse creation order (the order PyTorch's
 *    engine picks: the highest sequence number among the ready nodes); a
 *    node allocates its inputs' gradients, then releases its saved
 *    tensors and the incoming gradient; gradients meeting at one tensor are
 *    summed in place when the buffer is not shared, else out of place;
 *    AccumulateGrad keeps the first gradient of a parameter as .grad and
 *    adds later ones in place.
 * Sizes are bytes of the real shapes; the allocator rounds them to 512 B and
 * picks pools and segments as PyTorch's CUDA caching allocator does.
 *
 * The per-op facts (which op saves what; what the CPU and the CUDA kernels
 * allocate) were read from PyTorch's allocator events on the CPU
 * (tests/torchplan/torch_reference.py --events) for torch 2.15 +
 * transformers 5.24 and torch 1.13 + transformers 4.40, and from the sources
 * named beside each CUDA choice. TXK_TORCHPLAN_EVENTS=FILE writes the plan's
 * own events in torch_reference's --events form, to diff the two.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_torchplan.h"
#include "tk_host_mem.h"

/* What each `torch_version` follows. */
#define V2(n) [TK_TORCH_2_0 + n] = {"2." #n, "5.x", "engine: pytorch (torch 2." #n " + transformers 5.x)"}
static const struct { const char *torch, *transformers, *label; } VERSIONS[TK_TORCH_N_VERSIONS] = {
    [TK_TORCH_2] = {"2.x", "5.x", "engine: pytorch (torch 2.x + transformers 5.x)"},
    [TK_TORCH_1_13] = {"1.13", "4.40", "engine: pytorch (torch 1.13 + transformers 4.40)"},
    [TK_TORCH_1_10] = {"1.10", "4.15", "engine: pytorch (torch 1.10 + transformers 4.15)"},
    V2(0), V2(1), V2(2), V2(3), V2(4), V2(5), V2(6), V2(7), V2(8), V2(9), V2(10), V2(11), V2(12), V2(13), V2(14),
    V2(15),
};
#undef V2

const char *tk_torchplan_label(tk_torch_version v) { return VERSIONS[v].label; }

/* ---- the simulated device -------------------------------------------------- */

/* Segments get fake, increasing addresses; nothing is ever dereferenced. */
static int fake_seg_alloc(void *ctx, size_t bytes, void **ptr) {
    uintptr_t *next = ctx;
    *ptr = (void *)*next;
    *next += (bytes + 4095) & ~(uintptr_t)4095;
    return 0;
}
static void fake_seg_free(void *ctx, void *ptr, size_t bytes) { (void)ctx, (void)ptr, (void)bytes; }

/* ---- tensors, nodes, parameters ---------------------------------------------- */

typedef struct { void *p; size_t bytes; int refs; } tensor;

#define NSAVED 8
#define NEDGE 3
/* Where one input's gradient goes: a node's gradient buffer, a parameter's
 * .grad, or nowhere (-1, -1); `bytes` are allocated for it, unless `pass`:
 * the node hands its incoming gradient on as is (add, clone, a view). */
typedef struct { int node, param; size_t bytes; int pass; } edge;

typedef struct {
    int saved[NSAVED], nsaved;
    size_t saved_bytes[NSAVED];   /* checkpointed layers: what recompute restores */
    edge e[NEDGE];
    int ne;
    size_t scratch;               /* allocated and freed inside the backward op */
    int gemm;                     /* its backward runs cuBLAS GEMMs (a Linear, a bmm) */
    int64_t bias_rows, bias_out;  /* a Linear's bias: its gradient sums (rows, out) over rows */
    int gbuf;                     /* the gradient arriving here (a tensor, -1 none) */
    int owner;
    int layer;                    /* the checkpointed layer it belongs to, -1 none */
} node;

typedef struct {
    size_t bytes;
    int trainable;
    void *p;
    int owner;
    int grad;                     /* tensor id or -1 */
} param;

typedef struct sim {
    tk_alloc *a;
    tk_status st;
    tensor *t;
    int nt, tcap;
    node *n;
    int nn, ncap;
    param *pr;
    int np, pcap;
    int owner;                    /* tag for allocations now */
    tk_cat cat;
    /* the step's shape and choices */
    int B, T, H, nh, I, V, P, TV, L, labels;
    int qa, cuda, torch1, torch110, eager, sdpa_math, sdpa_eff, bf16, fp16, ckpt, adam8, acc;
    float p_drop, p_attn;
    size_t act;                   /* element size of matmul outputs (4, or 2 under autocast) */
    /* checkpointing: recomputation walks the layer's nodes again */
    int recompute, cursor;
    int layer;                    /* the layer being built, -1 outside */
    int *layer_first, *layer_input, *layer_in_node, *layer_rng;
    const struct params *prm;
    size_t context;
    /* cuBLAS's and cuBLASLt's workspaces (blas_rules.c): the rules, and
     * the ones kept, per thread: [0] the forward's, [1] autograd's (its
     * backward and the recomputed layers) */
    tk_torch_blas blas;
    int on_autograd;              /* the thread running now is autograd's */
    int w[2], lt[2];
    int sms, threads_per_sm;      /* cuda: the card's, for the reductions' grids */
    FILE *trace;                  /* $TXK_TORCHPLAN_EVENTS: each allocation and free, as torch_reference --events */
    int step;
} sim;

static int fail_oom(sim *s) {
    if (s->st == TK_OK) s->st = TK_ENOMEM;
    return -1;
}

/* Allocations from now on belong to `name` (an HF module name). */
static void set_owner(sim *s, const char *name) {
    int id = s->a ? tk_alloc_owner_id(s->a, name) : -1;
    if (id < 0) {
        fail_oom(s);
        id = 0;
    }
    s->owner = id;
}

/* Room for one more element in a growable array *arr of *cap elements
 * (n in use); 0, or -1 with s->st set when the host is out of memory. */
static int grow(sim *s, void **arr, int *cap, int n, size_t elem) {
    if (n < *cap) return 0;
    int c = *cap ? 2 * *cap : 256;
    void *a = tk_realloc(*arr, (size_t)c * elem);
    if (!a) return fail_oom(s);
    *arr = a, *cap = c;
    return 0;
}

/* One line of $TXK_TORCHPLAN_EVENTS, after the allocator has acted: the step,
 * the signed bytes as the allocator rounds them, the live total (weights
 * included, as torch_reference's) and, for an allocation, its owner. */
static void trace(sim *s, int sign, size_t bytes) {
    tk_alloc_stats st;
    tk_alloc_stats_get(s->a, &st);
    fprintf(s->trace, "%d %c%zu %zu", s->step, sign < 0 ? '-' : '+', (bytes + 511) / 512 * 512, st.allocated);
    if (sign > 0) fprintf(s->trace, " %s", tk_alloc_owner_name(s->a, s->owner));
    fputc('\n', s->trace);
}

/* A new tensor of `bytes` with one reference (the Python name that gets it). */
static int tnew(sim *s, size_t bytes) {
    if (s->st != TK_OK || grow(s, (void **)&s->t, &s->tcap, s->nt, sizeof *s->t)) return -1;
    tensor *t = &s->t[s->nt];
    t->bytes = bytes, t->refs = 1, t->p = NULL;
    tk_tag tag = {s->cat, s->owner};
    tk_status st = tk_alloc_malloc(s->a, bytes, tag, &t->p, NULL);
    if (st != TK_OK) {
        /* the plan runs against no capacity: only the host can fail */
        s->st = st;
        return -1;
    }
    if (s->trace) trace(s, 1, bytes);
    return s->nt++;
}
static void tref(sim *s, int id) { if (id >= 0) s->t[id].refs++; }
static void tdrop(sim *s, int id) {
    if (id < 0) return;
    if (--s->t[id].refs == 0) {
        tk_alloc_free(s->a, s->t[id].p);
        s->t[id].p = NULL;
        if (s->trace) trace(s, -1, s->t[id].bytes);
    }
}
/* A tensor allocated and freed at once (scratch inside one op). */
static void ttmp(sim *s, size_t bytes) {
    tk_cat c = s->cat;
    s->cat = TK_CAT_TEMP;
    tdrop(s, tnew(s, bytes));
    s->cat = c;
}

/* A GEMM on the thread running now (lt: cuBLASLt, a Linear with its bias),
 * after its output is allocated: the workspaces it takes as this version
 * keeps them (tk_torch_blas_rules), owners "cublas" and "cublasLt". */
static void blas_gemm(sim *s, int lt) {
    if (!s->cuda || (s->blas.where == TK_BLAS_W_OUTSIDE && s->blas.lt != TK_BLAS_LT_PER_CALL)) return;
    tk_cat cat = s->cat;
    int owner = s->owner, th = s->on_autograd, w = -1;
    s->cat = TK_CAT_WORKSPACE;
    if (s->blas.where != TK_BLAS_W_OUTSIDE && s->w[th] < 0) {
        set_owner(s, "cublas");
        w = tnew(s, s->blas.w_bytes);
        if (s->blas.where == TK_BLAS_W_KEPT) s->w[th] = w, w = -1;
    }
    if (lt && (s->blas.lt == TK_BLAS_LT_PER_CALL || (s->blas.lt == TK_BLAS_LT_KEPT && s->lt[th] < 0))) {
        set_owner(s, "cublasLt");
        int l = tnew(s, s->blas.lt_bytes);
        if (s->blas.lt == TK_BLAS_LT_KEPT) s->lt[th] = l;
        else tdrop(s, l);
    }
    tdrop(s, w); /* a per-GEMM workspace goes back when the call returns */
    s->cat = cat;
    s->owner = owner;
}

static int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t pow2_floor(int64_t n) {
    int64_t p = 1;
    while (p * 2 <= n) p *= 2;
    return p;
}

/* A Linear's bias gradient on CUDA: the sum over the rows of a contiguous
 * (rows, out) gradient, a reduction off the fastest dimension with a float
 * accumulator. When PyTorch's setReduceConfig
 * (aten/src/ATen/native/cuda/Reduce.cuh) splits each output's rows across
 * thread blocks, gpu_reduce_kernel takes a staging buffer
 * (global_memory_size) and semaphores (4 B per block column) from the
 * caching allocator and gives them back after the kernel. The grid follows
 * the card's SMs and resident threads per SM, so the buffer does too
 * (bert-tiny's hidden 128 over 2048 rows on an H200: 2 MiB and 4 B, as its
 * snapshot shows; its intermediate 512: 8 MiB and 16 B). */
static void bias_sum_scratch(sim *s, int64_t rows, int64_t out) {
    if (!s->cuda || rows <= 0 || out <= 0) return;
    int64_t vec = 4; /* get_output_vec_size: 4, halved until the outputs and the row stride divide */
    while (vec > 1 && out % vec) vec /= 2;
    int64_t maxt = 512 / vec, dim0 = out / vec, dim1 = rows;
    int64_t d0 = dim0 < maxt ? pow2_floor(dim0) : maxt, d1 = dim1 < maxt ? pow2_floor(dim1) : maxt;
    int64_t bw = d0 < 32 ? d0 : 32;
    int64_t bh = d1 < maxt / bw ? d1 : maxt / bw;
    bw = d0 < maxt / bh ? d0 : maxt / bh;
    int64_t step_in = 1, step_out = bw; /* the outputs across a warp's lanes */
    int split = div_up(rows, step_in) >= (bh * 16 < 256 ? bh * 16 : 256);
    if (split) step_in *= bh; else step_out *= bh;
    int64_t target = (int64_t)s->sms * (s->threads_per_sm / (bw * bh)), grid = div_up(out / vec, step_out);
    int64_t vpt = div_up(rows, step_in);
    if (!split || vpt < 256 || grid > target) return;
    int64_t c1 = div_up(target, grid), c2 = div_up(vpt, 16), c3 = div_up(vpt, 256);
    int64_t ctas = c1 < c2 ? c1 : c2;
    if (ctas < c3) ctas = c3;
    if (ctas <= 1) return;
    tk_cat cat = s->cat;
    s->cat = TK_CAT_TEMP;
    int buf = tnew(s, (size_t)(4 * out * ctas * bw * vec)), sem = tnew(s, (size_t)(4 * grid));
    tdrop(s, sem);
    tdrop(s, buf);
    s->cat = cat;
}

/* A node; in recomputation, the node the same op made in the forward. */
static int nnew(sim *s) {
    if (s->st != TK_OK) return -1;
    if (s->recompute) return s->cursor++;
    if (grow(s, (void **)&s->n, &s->ncap, s->nn, sizeof *s->n)) return -1;
    node *n = &s->n[s->nn];
    memset(n, 0, sizeof *n);
    n->gbuf = -1;
    n->owner = s->owner;
    n->layer = s->ckpt ? s->layer : -1;
    return s->nn++;
}
/* The node keeps tensor `id` for backward. A checkpointed layer's forward
 * keeps nothing (only the size, for the recomputation to restore). */
static void nsave(sim *s, int n, int id) {
    if (n < 0 || id < 0) return;
    node *x = &s->n[n];
    if (s->recompute) {
        for (int k = 0; k < x->nsaved; k++)
            if (x->saved[k] == -1 && x->saved_bytes[k] == s->t[id].bytes) {
                x->saved[k] = id;
                tref(s, id);
                return;
            }
        return;
    }
    if (x->nsaved == NSAVED) return;
    x->saved_bytes[x->nsaved] = s->t[id].bytes;
    if (x->layer >= 0) {
        x->saved[x->nsaved++] = -1;
        return;
    }
    x->saved[x->nsaved++] = id;
    tref(s, id);
}
static void nedge(sim *s, int n, int to_node, int to_param, size_t bytes, int pass) {
    if (n < 0 || s->recompute) return;
    node *x = &s->n[n];
    if (x->ne == NEDGE || (to_node < 0 && to_param < 0)) return;
    if (to_param >= 0 && !s->pr[to_param].trainable) return;
    x->e[x->ne++] = (edge){to_node, to_param, bytes, pass};
}

/* ---- parameters ------------------------------------------------------------------ */

static int pnew(sim *s, size_t numel, int trainable) {
    if (s->st != TK_OK || grow(s, (void **)&s->pr, &s->pcap, s->np, sizeof *s->pr)) return -1;
    param *p = &s->pr[s->np];
    memset(p, 0, sizeof *p);
    p->bytes = numel * 4;
    p->trainable = trainable;
    p->grad = -1;
    return s->np++;
}

/* The parameters of one model, in model.parameters() order, named as HF
 * names them (owner = the module). */
typedef struct params {
    int word, pos, tt, eln_w, eln_b;
    struct { int q_w, q_b, k_w, k_b, v_w, v_b, ao_w, ao_b, aln_w, aln_b, i_w, i_b, o_w, o_b, oln_w, oln_b; } *l;
    int pool_w, pool_b, head_w, head_b;
} params;

static int param_alloc(sim *s, const char *module, int trainable, size_t numel) {
    set_owner(s, module);
    s->cat = TK_CAT_PARAM;
    int i = pnew(s, numel, trainable);
    if (i < 0) return -1;
    tk_tag tag = {TK_CAT_PARAM, s->owner};
    s->pr[i].owner = s->owner;
    if ((s->st = tk_alloc_malloc(s->a, s->pr[i].bytes, tag, &s->pr[i].p, NULL)) != TK_OK) return -1;
    return i;
}

static void make_params(sim *s, params *p, int freeze_emb) {
    size_t H = (size_t)s->H, I = (size_t)s->I;
    int t = !freeze_emb;
    p->word = param_alloc(s, "bert.embeddings.word_embeddings", t, (size_t)s->V * H);
    p->pos = param_alloc(s, "bert.embeddings.position_embeddings", t, (size_t)s->P * H);
    p->tt = param_alloc(s, "bert.embeddings.token_type_embeddings", t, (size_t)s->TV * H);
    p->eln_w = param_alloc(s, "bert.embeddings.LayerNorm", t, H);
    p->eln_b = param_alloc(s, "bert.embeddings.LayerNorm", t, H);
    /* the two non-persistent buffers: position_ids and token_type_ids, int64 [1, max_position] */
    set_owner(s, "bert.embeddings");
    s->cat = TK_CAT_PARAM;
    tnew(s, (size_t)s->P * 8);
    tnew(s, (size_t)s->P * 8);
    static const char *const names[] = {"attention.self.query", "attention.self.key", "attention.self.value",
                                        "attention.output.dense", "attention.output.LayerNorm",
                                        "intermediate.dense", "output.dense", "output.LayerNorm"};
    for (int l = 0; l < s->L && s->st == TK_OK; l++) {
        char m[8][96];
        for (int k = 0; k < 8; k++) snprintf(m[k], sizeof m[k], "bert.encoder.layer.%d.%s", l, names[k]);
        p->l[l].q_w = param_alloc(s, m[0], 1, H * H);
        p->l[l].q_b = param_alloc(s, m[0], 1, H);
        p->l[l].k_w = param_alloc(s, m[1], 1, H * H);
        p->l[l].k_b = param_alloc(s, m[1], 1, H);
        p->l[l].v_w = param_alloc(s, m[2], 1, H * H);
        p->l[l].v_b = param_alloc(s, m[2], 1, H);
        p->l[l].ao_w = param_alloc(s, m[3], 1, H * H);
        p->l[l].ao_b = param_alloc(s, m[3], 1, H);
        p->l[l].aln_w = param_alloc(s, m[4], 1, H);
        p->l[l].aln_b = param_alloc(s, m[4], 1, H);
        p->l[l].i_w = param_alloc(s, m[5], 1, I * H);
        p->l[l].i_b = param_alloc(s, m[5], 1, I);
        p->l[l].o_w = param_alloc(s, m[6], 1, H * I);
        p->l[l].o_b = param_alloc(s, m[6], 1, H);
        p->l[l].oln_w = param_alloc(s, m[7], 1, H);
        p->l[l].oln_b = param_alloc(s, m[7], 1, H);
    }
    if (s->qa) {
        p->pool_w = p->pool_b = -1;
        p->head_w = param_alloc(s, "qa_outputs", 1, 2 * H);
        p->head_b = param_alloc(s, "qa_outputs", 1, 2);
    } else {
        p->pool_w = param_alloc(s, "bert.pooler.dense", 1, H * H);
        p->pool_b = param_alloc(s, "bert.pooler.dense", 1, H);
        p->head_w = param_alloc(s, "classifier", 1, (size_t)s->labels * H);
        p->head_b = param_alloc(s, "classifier", 1, (size_t)s->labels);
    }
}

/* ---- ops ------------------------------------------------------------------------- */

/* An activation: its tensor and the node its gradient goes to (-1: needs none). */
typedef struct { int t, node; } var;

static size_t tbytes(sim *s, var v) { return v.t >= 0 ? s->t[v.t].bytes : 0; }
static void vdrop(sim *s, var v) { tdrop(s, v.t); }

/* The autocast cast cache: weight and bias copies made once per forward,
 * dropped when the autocast region ends. */
typedef struct { int *t; int n, cap; } cast_cache;

/* A 16-bit copy of a parameter under autocast (ToCopyBackward0 to the param). */
static var cast_param(sim *s, cast_cache *cc, int pi, size_t numel) {
    int t = tnew(s, numel * 2);
    int n = nnew(s);
    nedge(s, n, -1, pi, s->pr[pi].bytes, 0);
    if (t >= 0 && !grow(s, (void **)&cc->t, &cc->cap, cc->n, sizeof *cc->t)) {
        cc->t[cc->n++] = t;
        tref(s, t);
    }
    return (var){t, s->pr[pi].trainable ? n : -1};
}
/* A 16-bit copy of an fp32 activation (not cached). */
static var cast_act(sim *s, var x) {
    int t = tnew(s, tbytes(s, x) / 2);
    int n = x.node >= 0 ? nnew(s) : -1;
    nedge(s, n, x.node, -1, tbytes(s, x), 0);
    return (var){t, n};
}

/* nn.Linear over (rows, in) -> (rows, out), as at::linear runs a 3-D input:
 * addmm(bias, x.view(rows, in), weight.t()). Saves x (and the weight);
 * backward: grad_in = grad.mm(W), grad_W = grad.t().mm(x), grad_b = sum. */
static var linear(sim *s, cast_cache *cc, var x, int pw, int pb, size_t rows, size_t in, size_t out) {
    var w = {-1, -1}, b = {-1, -1}, xin = x;
    if (s->bf16 || s->fp16) {
        b = cast_param(s, cc, pb, out);
        w = cast_param(s, cc, pw, in * out);
        if (tbytes(s, x) == rows * in * 4) xin = cast_act(s, x);
        else tref(s, x.t);
    } else {
        tref(s, x.t);
    }
    int y = tnew(s, rows * out * s->act);
    blas_gemm(s, 1);
    int n = nnew(s);
    if (n >= 0) s->n[n].gemm = 1, s->n[n].bias_rows = (int64_t)rows, s->n[n].bias_out = (int64_t)out;
    nsave(s, n, xin.t);
    if (w.t >= 0) nsave(s, n, w.t);
    nedge(s, n, xin.node, -1, tbytes(s, xin), 0);
    if (w.t >= 0) {
        nedge(s, n, w.node, -1, in * out * 2, 0);
        nedge(s, n, b.node, -1, out * 2, 0);
    } else {
        nedge(s, n, -1, pw, in * out * 4, 0);
        nedge(s, n, -1, pb, out * 4, 0);
    }
    vdrop(s, xin);
    vdrop(s, w);
    vdrop(s, b);
    return (var){y, n};
}

/* Dropout in training. p == 0 returns the input itself. The CPU runs
 * noise = empty_like(x).bernoulli_(1-p).div_(1-p); x * noise, saving the
 * float noise; CUDA runs native_dropout, saving a 1-byte mask. */
static var dropout(sim *s, var x, float p, size_t esz) {
    if (p <= 0.0f) {
        tref(s, x.t);
        return x;
    }
    size_t bytes = tbytes(s, x);
    int keep, y;
    if (s->cuda) {
        y = tnew(s, bytes);
        keep = tnew(s, bytes / esz);
    } else {
        keep = tnew(s, bytes);
        ttmp(s, 4);
        ttmp(s, 4);
        y = tnew(s, bytes);
    }
    int n = nnew(s);
    nsave(s, n, keep);
    nedge(s, n, x.node, -1, bytes, 0);
    tdrop(s, keep);
    return (var){y, n};
}

/* a + b with b's gradient going on as is (residual adds). Under autocast a
 * 16-bit a is first promoted to fp32. */
static var add(sim *s, var a, var b) {
    var ap = a;
    if (tbytes(s, a) * 2 == tbytes(s, b)) {
        ap.t = tnew(s, tbytes(s, b));
        ap.node = a.node >= 0 ? nnew(s) : -1;
        nedge(s, ap.node, a.node, -1, tbytes(s, a), 0);
    } else {
        tref(s, a.t);
    }
    int y = tnew(s, tbytes(s, b));
    int n = nnew(s);
    nedge(s, n, ap.node, -1, tbytes(s, b), 1);
    nedge(s, n, b.node, -1, tbytes(s, b), 1);
    vdrop(s, ap);
    return (var){y, n};
}

/* LayerNorm over the last dim (fp32 under autocast too): saves the input,
 * mean and rstd; backward: grad_in, grad_w, grad_b. */
static var layer_norm(sim *s, var x, int pw, int pb, size_t rows) {
    var xin = x;
    if (tbytes(s, x) == rows * (size_t)s->H * 2) {  /* a 16-bit input is normed in fp32 */
        xin.t = tnew(s, rows * (size_t)s->H * 4);
        xin.node = x.node >= 0 ? nnew(s) : -1;
        nedge(s, xin.node, x.node, -1, tbytes(s, x), 0);
    } else {
        tref(s, x.t);
    }
    int y = tnew(s, rows * (size_t)s->H * 4);
    int mean = tnew(s, rows * 4), rstd = tnew(s, rows * 4);
    int n = nnew(s);
    nsave(s, n, xin.t);
    nsave(s, n, mean);
    nsave(s, n, rstd);
    nedge(s, n, xin.node, -1, tbytes(s, xin), 0);
    nedge(s, n, -1, pw, (size_t)s->H * 4, 0);
    nedge(s, n, -1, pb, (size_t)s->H * 4, 0);
    tdrop(s, mean);
    tdrop(s, rstd);
    vdrop(s, xin);
    return (var){y, n};
}

/* An elementwise op whose backward needs one saved tensor (its input for
 * GELU, its output for tanh and softmax). */
static var unary(sim *s, var x, int save_output) {
    int y = tnew(s, tbytes(s, x));
    int n = nnew(s);
    nsave(s, n, save_output ? y : x.t);
    nedge(s, n, x.node, -1, tbytes(s, x), 0);
    return (var){y, n};
}

/* softmax / log_softmax: saves its output; up to torch 1.10 its input too
 * (the backward's signature took the input until pytorch/pytorch#66018,
 * first in 1.11; the cause named in pytorch/pytorch#49600). */
static var softmax(sim *s, var x) {
    var y = unary(s, x, 1);
    if (s->torch110) nsave(s, y.node, x.t);
    return y;
}

/* ---- the model --------------------------------------------------------------------- */

/* A node whose backward only moves the gradient on: a view that aliases it
 * (pass) or one that must copy it (reshape of a transposed gradient). */
static var view_node(sim *s, var x, int copy) {
    int n = x.node >= 0 ? nnew(s) : -1;
    nedge(s, n, x.node, -1, tbytes(s, x), !copy);
    tref(s, x.t);
    return (var){x.t, n};
}

/* A contiguous copy (matmul's reshape of a transposed operand, .contiguous()):
 * CloneBackward hands the gradient on. */
static var clone(sim *s, var x) {
    int t = tnew(s, tbytes(s, x));
    int n = x.node >= 0 ? nnew(s) : -1;
    nedge(s, n, x.node, -1, tbytes(s, x), 1);
    return (var){t, n};
}

/* bmm(a, b) -> out_bytes; saves both; backward: grads of both. */
static var bmm(sim *s, var a, var b, size_t out_bytes) {
    int y = tnew(s, out_bytes);
    blas_gemm(s, 0);
    int n = nnew(s);
    if (n >= 0) s->n[n].gemm = 1;
    nsave(s, n, a.t);
    nsave(s, n, b.t);
    nedge(s, n, a.node, -1, tbytes(s, a), 0);
    nedge(s, n, b.node, -1, tbytes(s, b), 0);
    return (var){y, n};
}

/* x * python scalar: nothing saved (the scalar is wrapped for the call). */
static var scale(sim *s, var x) {
    if (!s->cuda) ttmp(s, 4);
    int y = tnew(s, tbytes(s, x));
    int n = nnew(s);
    nedge(s, n, x.node, -1, tbytes(s, x), 0);
    return (var){y, n};
}

/* The self-attention of one layer from hidden states x; returns the context
 * (B, T, H) ready for the output dense. */
static var attention(sim *s, cast_cache *cc, var x, const params *p, int l) {
    size_t rows = (size_t)s->B * s->T, H = (size_t)s->H;
    size_t act_bth = rows * H * s->act;
    size_t scores = (size_t)s->B * s->nh * s->T * s->T * s->act;
    var q = linear(s, cc, x, p->l[l].q_w, p->l[l].q_b, rows, H, H);
    var qv = view_node(s, q, s->eager || s->sdpa_math);
    var k = linear(s, cc, x, p->l[l].k_w, p->l[l].k_b, rows, H, H);
    var kv = view_node(s, k, s->eager || s->sdpa_math);
    var v = linear(s, cc, x, p->l[l].v_w, p->l[l].v_b, rows, H, H);
    var vv = view_node(s, v, s->eager || s->sdpa_math);
    var ctx;
    if (!s->eager && !s->sdpa_math) {
        /* SDPA's fused kernel: saves q, k, v, its output and logsumexp
         * (B, nh, T) fp32 (CUDA's efficient kernel pads T to 32) */
        size_t lse_t = s->cuda && s->sdpa_eff ? ((size_t)s->T + 31) / 32 * 32 : (size_t)s->T;
        int out = tnew(s, act_bth);
        int lse = tnew(s, (size_t)s->B * s->nh * lse_t * 4);
        int rng = s->cuda && s->p_attn > 0 ? tnew(s, 16) : -1;
        int n = nnew(s);
        nsave(s, n, qv.t);
        nsave(s, n, kv.t);
        nsave(s, n, vv.t);
        nsave(s, n, out);
        nsave(s, n, lse);
        if (rng >= 0) nsave(s, n, rng);
        nedge(s, n, qv.node, -1, act_bth, 0);
        nedge(s, n, kv.node, -1, act_bth, 0);
        nedge(s, n, vv.node, -1, act_bth, 0);
        /* backward's own buffers: CUDA flash keeps an fp32 dq accumulator
         * and softmax_d; efficient a delta (and an fp32 dq for 16-bit) */
        if (s->cuda && n >= 0) s->n[n].scratch = (s->act == 2 || !s->sdpa_eff ? rows * H * 4 : 0) + (size_t)s->B * s->nh * lse_t * 4;
        tdrop(s, lse);
        tdrop(s, rng);
        ctx = (var){out, n};
    } else {
        var qs = qv, ks = kv;
        if (s->sdpa_math) { /* math SDPA scales q and k by sqrt(scale) first */
            qs = scale(s, qv);
            ks = scale(s, kv);
        } else {
            tref(s, qs.t);
            tref(s, ks.t);
        }
        var cq = clone(s, qs), ck = clone(s, ks);
        vdrop(s, qs);
        vdrop(s, ks);
        var sc = bmm(s, cq, ck, scores);
        vdrop(s, cq);
        vdrop(s, ck);
        var w = sc;
        if (!s->sdpa_math) {
            w = scale(s, sc);
            vdrop(s, sc);
        }
        if (s->torch1) {
            /* transformers 4.x adds the extended attention mask, fp32 (the
             * model's dtype) even when all ones: under autocast the sum is
             * fp32, and the CPU's mixed-dtype add first copies the 16-bit
             * scores to fp32 (torch 1.13's allocator events) */
            size_t sum = tbytes(s, w) / s->act * 4;
            int tmp = !s->cuda && s->act == 2 ? tnew(s, sum) : -1;
            var m = {tnew(s, sum), nnew(s)};
            tdrop(s, tmp);
            nedge(s, m.node, w.node, -1, tbytes(s, w), s->act == 4);
            vdrop(s, w);
            w = m;
        }
        var w32 = w;
        if (s->cuda && s->act == 2 && tbytes(s, w) == scores) { /* CUDA autocast runs softmax in fp32 */
            w32.t = tnew(s, tbytes(s, w) * 2);
            w32.node = nnew(s);
            nedge(s, w32.node, w.node, -1, tbytes(s, w), 0);
            vdrop(s, w);
        }
        var pr = softmax(s, w32);
        vdrop(s, w32);
        var pd = dropout(s, pr, s->p_attn, tbytes(s, pr) == scores ? s->act : 4);
        vdrop(s, pr);
        if (tbytes(s, pd) != scores) { /* autocast casts the fp32 probabilities back for the matmul */
            var c = cast_act(s, pd);
            vdrop(s, pd);
            pd = c;
        }
        var cv = clone(s, vv);
        var o = bmm(s, pd, cv, act_bth);
        vdrop(s, pd);
        vdrop(s, cv);
        var u = view_node(s, o, 1);
        vdrop(s, o);
        ctx = clone(s, u);
        vdrop(s, u);
    }
    vdrop(s, q), vdrop(s, k), vdrop(s, v);
    vdrop(s, qv), vdrop(s, kv), vdrop(s, vv);
    return ctx;
}

/* BertSelfOutput / BertOutput: LayerNorm(dropout(dense(x)) + residual),
 * dense from `in` features to H. */
static var dense_dropout_add_norm(sim *s, cast_cache *cc, var x, var residual, int pw, int pb, int lnw, int lnb,
                                  size_t in) {
    size_t rows = (size_t)s->B * s->T;
    var o = linear(s, cc, x, pw, pb, rows, in, (size_t)s->H);
    var d = dropout(s, o, s->p_drop, s->act);
    vdrop(s, o);
    var h = add(s, d, residual);
    var out = layer_norm(s, h, lnw, lnb, rows);
    vdrop(s, h);
    vdrop(s, d);
    return out;
}

/* One BertLayer: returns its output (B, T, H) fp32. */
static var bert_layer(sim *s, cast_cache *cc, var x, const params *p, int l) {
    size_t rows = (size_t)s->B * s->T, H = (size_t)s->H, I = (size_t)s->I;
    var ctx = attention(s, cc, x, p, l);
    var a = dense_dropout_add_norm(s, cc, ctx, x, p->l[l].ao_w, p->l[l].ao_b, p->l[l].aln_w, p->l[l].aln_b, H);
    vdrop(s, ctx);
    var i = linear(s, cc, a, p->l[l].i_w, p->l[l].i_b, rows, H, I);
    var g = unary(s, i, 0);
    vdrop(s, i);
    var out = dense_dropout_add_norm(s, cc, g, a, p->l[l].o_w, p->l[l].o_b, p->l[l].oln_w, p->l[l].oln_b, I);
    vdrop(s, g);
    vdrop(s, a);
    return out;
}

/* nn.Embedding lookup: backward makes a zeroed gradient of the whole table. */
static var embedding(sim *s, int pi, size_t rows) {
    int y = tnew(s, rows * (size_t)s->H * 4);
    int n = s->pr[pi].trainable ? nnew(s) : -1;
    nedge(s, n, -1, pi, s->pr[pi].bytes, 0);
    return (var){y, n};
}

static var embeddings(sim *s, const params *p) {
    size_t rows = (size_t)s->B * s->T;
    var we = embedding(s, p->word, rows);
    var te = embedding(s, p->tt, rows);
    var e1 = {tnew(s, rows * (size_t)s->H * 4), -1};
    if (we.node >= 0) {
        e1.node = nnew(s);
        nedge(s, e1.node, we.node, -1, tbytes(s, e1), 1);
        nedge(s, e1.node, te.node, -1, tbytes(s, e1), 1);
    }
    var pe = embedding(s, p->pos, (size_t)s->T);
    var e2 = {tnew(s, rows * (size_t)s->H * 4), -1};
    if (we.node >= 0) {
        e2.node = nnew(s);
        nedge(s, e2.node, e1.node, -1, tbytes(s, e2), 1);
        nedge(s, e2.node, pe.node, -1, tbytes(s, pe), 0); /* sum_to the broadcast shape */
    }
    vdrop(s, e1);
    var ln = layer_norm(s, e2, p->eln_w, p->eln_b, rows);
    if (!s->pr[p->eln_w].trainable) ln.node = -1;
    vdrop(s, e2);
    var d = dropout(s, ln, s->p_drop, 4);
    vdrop(s, ln);
    vdrop(s, we), vdrop(s, te), vdrop(s, pe);
    return d;
}

/* cross_entropy(logits (rows, classes)): log_softmax (kept) and nll_loss
 * (output and total_weight); under autocast the logits are cast to fp32. */
static var cross_entropy(sim *s, var logits, size_t rows, size_t classes) {
    var x = logits;
    if (tbytes(s, logits) == rows * classes * 2) {
        x.t = tnew(s, rows * classes * 4);
        x.node = nnew(s);
        nedge(s, x.node, logits.node, -1, tbytes(s, logits), 0);
    } else {
        tref(s, x.t);
    }
    var ls = softmax(s, x);
    vdrop(s, x);
    int out = tnew(s, 4), tw = tnew(s, 4);
    int n = nnew(s);
    nsave(s, n, tw);
    nedge(s, n, ls.node, -1, tbytes(s, ls), 0);
    tdrop(s, tw);
    vdrop(s, ls);
    return (var){out, n};
}

/* The head and the loss; returns the loss divided by `accumulate`. */
static var head_loss(sim *s, cast_cache *cc, var seq_out, var emb_out, const params *p) {
    size_t B = (size_t)s->B, T = (size_t)s->T, H = (size_t)s->H;
    var loss;
    if (s->qa) {
        vdrop(s, emb_out); /* BertModel.forward has returned */
        var lg = linear(s, cc, seq_out, p->head_w, p->head_b, B * T, H, 2);
        /* split into start/end, each squeezed and made contiguous (copies);
         * SplitBackward stacks their gradients */
        int sn = nnew(s);
        nedge(s, sn, lg.node, -1, tbytes(s, lg), 0);
        var st = {tnew(s, tbytes(s, lg) / 2), nnew(s)}, en = {tnew(s, tbytes(s, lg) / 2), nnew(s)};
        nedge(s, st.node, sn, -1, tbytes(s, lg) / 2, 1);
        nedge(s, en.node, sn, -1, tbytes(s, lg) / 2, 1);
        vdrop(s, lg);
        var l1 = cross_entropy(s, st, B, T), l2 = cross_entropy(s, en, B, T);
        vdrop(s, st), vdrop(s, en);
        int y = tnew(s, 4);
        int n = nnew(s);
        nedge(s, n, l1.node, -1, 4, 0);
        nedge(s, n, l2.node, -1, 4, 0);
        vdrop(s, l1), vdrop(s, l2);
        loss = (var){y, n};
    } else {
        int sel = nnew(s); /* first token: SelectBackward zero-fills (B, T, H) */
        nedge(s, sel, seq_out.node, -1, B * T * H * 4, 0);
        var first = {seq_out.t, sel};
        var pl;
        if (s->act == 2) {
            var c = {tnew(s, B * H * 2), nnew(s)};
            nedge(s, c.node, sel, -1, B * H * 4, 0);
            pl = linear(s, cc, c, p->pool_w, p->pool_b, B, H, H);
            vdrop(s, c);
        } else {
            /* the pooler keeps the whole sequence output alive through its view */
            tref(s, first.t);
            int y = tnew(s, B * H * 4);
            blas_gemm(s, 1);
            int n = nnew(s);
            if (n >= 0) s->n[n].gemm = 1, s->n[n].bias_rows = (int64_t)B, s->n[n].bias_out = (int64_t)H;
            nsave(s, n, first.t);
            nedge(s, n, sel, -1, B * H * 4, 0);
            nedge(s, n, -1, p->pool_w, H * H * 4, 0);
            nedge(s, n, -1, p->pool_b, H * 4, 0);
            tdrop(s, first.t);
            pl = (var){y, n};
        }
        var th = unary(s, pl, 1);
        vdrop(s, pl);
        vdrop(s, emb_out); /* BertModel.forward returns after the pooler */
        var d = dropout(s, th, s->p_drop, s->act);
        vdrop(s, th);
        var lg = linear(s, cc, d, p->head_w, p->head_b, B, H, (size_t)s->labels);
        vdrop(s, d);
        loss = cross_entropy(s, lg, B, (size_t)s->labels);
        vdrop(s, lg);
    }
    if (s->acc > 1) {
        var l2 = scale(s, loss);
        vdrop(s, loss);
        loss = l2;
    }
    return loss;
}

/* ---- autograd ---------------------------------------------------------------------- */

/* A gradient arriving over edge e. */
static void send(sim *s, edge e, int g) {
    if (g < 0) return;
    if (e.param >= 0) {
        param *p = &s->pr[e.param];
        if (p->grad < 0) {
            if (s->t[g].refs > 1) { /* AccumulateGrad clones a gradient someone else holds */
                s->cat = TK_CAT_GRAD, s->owner = p->owner;
                int c = tnew(s, p->bytes);
                tdrop(s, g);
                g = c;
            }
            p->grad = g;
        } else {
            tdrop(s, g); /* .grad += g, in place */
        }
        return;
    }
    if (e.node < 0) {
        tdrop(s, g);
        return;
    }
    node *y = &s->n[e.node];
    if (y->gbuf < 0) {
        y->gbuf = g;
    } else if (!s->torch1 && s->t[y->gbuf].refs == 1) {
        tdrop(s, g); /* torch 2 sums into the buffer in place when no one else holds it */
    } else {
        s->cat = TK_CAT_TEMP;
        int c = tnew(s, s->t[y->gbuf].bytes);
        tdrop(s, s->n[e.node].gbuf);
        tdrop(s, g);
        s->n[e.node].gbuf = c;
    }
}

static var bert_layer(sim *s, cast_cache *cc, var x, const params *p, int l);

/* Non-reentrant checkpointing: the layer's forward again, its saved tensors
 * handed to the nodes the first forward made. */
static void recompute_layer(sim *s, int l, cast_cache *cc) {
    s->recompute = 1;
    s->cursor = s->layer_first[l];
    s->layer = l;
    s->cat = TK_CAT_ACT;
    cc->n = 0;
    var x = {s->layer_input[l], s->layer_in_node[l]};
    var y = bert_layer(s, cc, x, s->prm, l);
    vdrop(s, y);
    for (int i = 0; i < cc->n; i++) tdrop(s, cc->t[i]);
    cc->n = 0;
    s->recompute = 0;
    s->layer = -1;
}

static void run_node(sim *s, int i) {
    node *x = &s->n[i];
    int g = x->gbuf, outs[NEDGE];
    x->gbuf = -1;
    for (int k = 0; k < x->ne; k++) {
        outs[k] = -1;
        if (g < 0) continue;
        if (x->e[k].pass) {
            tref(s, g);
            outs[k] = g;
            continue;
        }
        if (x->e[k].param >= 0) s->cat = TK_CAT_GRAD, s->owner = s->pr[x->e[k].param].owner;
        else s->cat = TK_CAT_TEMP, s->owner = x->owner;
        outs[k] = tnew(s, x->e[k].bytes);
        x = &s->n[i];
    }
    if (g >= 0 && x->gemm) blas_gemm(s, 0);
    x = &s->n[i];
    /* the bias's gradient, when one was asked for: its edge is the last */
    if (g >= 0 && x->bias_out && x->ne > 0 && outs[x->ne - 1] >= 0 &&
        s->t[outs[x->ne - 1]].bytes <= (size_t)x->bias_out * 4)
        bias_sum_scratch(s, x->bias_rows, x->bias_out);
    x = &s->n[i];
    if (g >= 0 && x->scratch) ttmp(s, x->scratch);
    for (int k = 0; k < x->nsaved; k++) {
        tdrop(s, x->saved[k]);
        x->saved[k] = -1;
    }
    tdrop(s, g);
    for (int k = 0; k < x->ne; k++) send(s, x->e[k], outs[k]);
}

static void backward(sim *s, var loss, int first, cast_cache *cc) {
    s->cat = TK_CAT_TEMP;
    int g = tnew(s, 4); /* ones_like(loss) */
    if (loss.node < 0 || s->st != TK_OK) {
        tdrop(s, g);
        return;
    }
    s->n[loss.node].gbuf = g;
    s->on_autograd = 1; /* CUDA backward runs on autograd's device thread */
    int done = s->L; /* layers below this one are recomputed */
    for (int i = s->nn - 1; i >= first && s->st == TK_OK; i--) {
        int l = s->n[i].layer;
        if (l >= 0 && l < done) {
            recompute_layer(s, l, cc);
            done = l;
        }
        run_node(s, i);
        if (l >= 0 && i == s->layer_first[l]) {
            tdrop(s, s->layer_input[l]);
            tdrop(s, s->layer_rng[l]);
            s->layer_input[l] = s->layer_rng[l] = -1;
        }
    }
    s->nn = first;
    s->on_autograd = 0;
}

/* ---- the training step ----------------------------------------------------------------- */

static var forward(sim *s, const params *p, cast_cache *cc) {
    s->cat = TK_CAT_ACT;
    set_owner(s, "bert.embeddings");
    var x = embeddings(s, p);
    /* BertModel.forward's embedding_output lives until it returns */
    var emb_out = x;
    tref(s, emb_out.t);
    for (int l = 0; l < s->L && s->st == TK_OK; l++) {
        char name[64];
        snprintf(name, sizeof name, "bert.encoder.layer.%d", l);
        set_owner(s, name);
        var y;
        if (s->ckpt) {
            s->layer_first[l] = s->nn;
            tref(s, x.t);
            s->layer_input[l] = x.t;
            s->layer_in_node[l] = x.node;
            /* preserve_rng_state: torch.get_rng_state(), a CPU tensor (on
             * the device only when the device is the CPU) */
            s->layer_rng[l] = s->cuda ? -1 : tnew(s, 5056);
            s->layer = l;
            y = bert_layer(s, cc, x, p, l);
            s->layer = -1;
        } else {
            y = bert_layer(s, cc, x, p, l);
        }
        vdrop(s, x);
        x = y;
    }
    set_owner(s, s->qa ? "qa_outputs" : "classifier");
    var loss = head_loss(s, cc, x, emb_out, p);
    vdrop(s, x);
    /* leaving autocast clears the cast cache */
    for (int i = 0; i < cc->n; i++) tdrop(s, cc->t[i]);
    cc->n = 0;
    return loss;
}

static void optimizer_step(sim *s, int first) {
    s->cat = TK_CAT_OPTIM;
    for (int i = 0; i < s->np && first; i++) {
        param *p = &s->pr[i];
        if (!p->trainable || p->grad < 0) continue;
        s->owner = p->owner;
        size_t numel = p->bytes / 4;
        if (!s->cuda && !s->torch110) tnew(s, 4); /* state['step'] = torch.tensor(0.), on the CPU */
        if (s->adam8 && numel >= 4096) {
            /* bitsandbytes: uint8 state1/state2 and fp32 absmax per 256-block */
            size_t blocks = (numel + 255) / 256;
            tnew(s, numel);
            tnew(s, numel);
            tnew(s, blocks * 4);
            tnew(s, blocks * 4);
        } else {
            tnew(s, p->bytes);
            tnew(s, p->bytes);
        }
    }
    if (first && s->adam8) { /* the shared quantisation maps */
        set_owner(s, "optimizer");
        tnew(s, 256 * 4);
        tnew(s, 256 * 4);
    }
    if (s->adam8) return; /* one fused kernel per tensor, in place */
    s->cat = TK_CAT_TEMP;
    if (s->cuda && !s->torch1) {
        /* foreach: exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs), divided
         * and added to in place, used by _foreach_addcdiv_, then dropped */
        int *tmp = tk_calloc((size_t)s->np, sizeof *tmp);
        if (!tmp) {
            fail_oom(s);
            return;
        }
        for (int i = 0; i < s->np; i++) {
            tmp[i] = -1;
            if (!s->pr[i].trainable || s->pr[i].grad < 0) continue;
            s->owner = s->pr[i].owner;
            tmp[i] = tnew(s, s->pr[i].bytes);
        }
        for (int i = 0; i < s->np; i++) tdrop(s, tmp[i]);
        free(tmp);
        return;
    }
    /* single-tensor: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps);
     * transformers 4.15's Trainer steps its own AdamW instead, whose
     * denom = exp_avg_sq.sqrt().add_(eps) is the one temporary */
    for (int i = 0; i < s->np; i++) {
        if (!s->pr[i].trainable || s->pr[i].grad < 0) continue;
        s->owner = s->pr[i].owner;
        if (s->torch110) {
            tdrop(s, tnew(s, s->pr[i].bytes));
            continue;
        }
        int sq = tnew(s, s->pr[i].bytes);
        if (!s->cuda) ttmp(s, 4);
        int dn = tnew(s, s->pr[i].bytes);
        tdrop(s, sq);
        tdrop(s, dn);
    }
}

/* optimizer.zero_grad() as the version's default does it: torch 2 sets the
 * gradients to None (freed); torch 1.13 fills them with zeros in place, so
 * they stay allocated through the next forward. */
static void zero_grad(sim *s) {
    if (s->torch1) return;
    for (int i = 0; i < s->np; i++) {
        tdrop(s, s->pr[i].grad);
        s->pr[i].grad = -1;
    }
}

/* One optimizer step: zero_grad, `acc` micro-batches, optimizer.step(). */
static void train_step(sim *s, const params *p, cast_cache *cc, int first) {
    zero_grad(s);
    for (int m = 0; m < s->acc && s->st == TK_OK; m++) {
        size_t bt = (size_t)s->B * s->T;
        s->cat = TK_CAT_INPUT;
        set_owner(s, "inputs");
        int in[5], nin = 0;
        in[nin++] = tnew(s, bt * 8);               /* input_ids */
        in[nin++] = tnew(s, bt * 8);               /* token_type_ids */
        in[nin++] = tnew(s, bt * 8);               /* attention_mask */
        in[nin++] = tnew(s, (size_t)s->B * 8);     /* labels / start_positions */
        if (s->qa) in[nin++] = tnew(s, (size_t)s->B * 8); /* end_positions */
        int first_node = s->nn;
        var loss = forward(s, p, cc);
        if (s->fp16) { /* GradScaler: scaler.scale(loss) */
            s->cat = TK_CAT_TEMP;
            var sl = scale(s, loss);
            vdrop(s, loss);
            loss = sl;
        }
        backward(s, loss, first_node, cc);
        vdrop(s, loss);
        for (int k = 0; k < nin; k++) tdrop(s, in[k]);
    }
    if (s->fp16) { /* unscale_: found_inf and inv_scale */
        s->cat = TK_CAT_TEMP;
        int f = tnew(s, 4), iv = tnew(s, 4);
        optimizer_step(s, first);
        tdrop(s, f);
        tdrop(s, iv);
    } else {
        optimizer_step(s, first);
    }
}

/* ---- the plan ---------------------------------------------------------------------------- */

/* The CUDA context PyTorch itself takes on a card (its kernels, cuBLAS and
 * cuDNN loaded), where it was measured; else the profile's estimate. */
static size_t pytorch_context(const tk_gpu_profile *prof) {
    if (!prof) return 0;
    /* HF's "Model training anatomy" (transformers docs, model_memory_anatomy):
     * nvidia-smi showed 1343 MiB on its V100 after torch.ones((1, 1)).to("cuda"),
     * which includes that tensor's 2 MiB segment */
    if (!strcmp(prof->name, "v100-16")) return (size_t)(1343 - 2) << 20;
    return prof->context_overhead;
}

static tk_status check_config(const tk_config *c, int cuda, tk_err *err) {
    if (c->head == TK_HEAD_FLATTEN_DENSE || c->towers > 1) {
        tk_err_set(err, TK_EINVAL, "head: flatten_dense is txkernel's own head; engine: pytorch plans transformers' "
                                   "BertForSequenceClassification (task: classify) and BertForQuestionAnswering (task: qa)");
        return TK_EINVAL;
    }
    if (tk_config_world_size(c) > 1) {
        char key[64];
        if (c->world_size > 1) snprintf(key, sizeof key, "world_size: %d", c->world_size);
        else snprintf(key, sizeof key, "gpu: %s is %d GPUs", c->gpu, tk_config_world_size(c));
        tk_err_set(err, TK_EINVAL, "%s: engine: pytorch plans one GPU's step; a data-parallel PyTorch run (DDP, "
                                   "DeepSpeed ZeRO, FSDP) adds buffers it does not model yet", key);
        return TK_EINVAL;
    }
    if (c->freeze_layers > 0) {
        tk_err_set(err, TK_EINVAL, "freeze_layers: engine: pytorch does not model frozen encoder layers yet "
                                   "(freeze: embeddings is modelled)");
        return TK_EINVAL;
    }
    if (c->recompute == TK_RECOMPUTE_ATTENTION) {
        tk_err_set(err, TK_EINVAL, "recompute: attention is txkernel's own; with engine: pytorch, recompute: layers "
                                   "is transformers' gradient_checkpointing_enable(use_reentrant=False)");
        return TK_EINVAL;
    }
    if (!cuda && c->precision == TK_PREC_FP16) {
        tk_err_set(err, TK_EINVAL, "precision: fp16 with GradScaler is planned on cuda (device: cuda or a gpu: card); "
                                   "on the cpu, torch.autocast runs bf16");
        return TK_EINVAL;
    }
    if (!cuda && c->optimizer == TK_OPTIM_ADAMW8) {
        tk_err_set(err, TK_EINVAL, "optimizer: adamw8bit (bitsandbytes' AdamW8bit) is planned on cuda (device: cuda or "
                                   "a gpu: card)");
        return TK_EINVAL;
    }
    return TK_OK;
}

tk_status tk_torchplan(const tk_config *c0, tk_torchplan_result *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    tk_config c = *c0;
    tk_status st = tk_config_resolve_model(&c, err);
    if (st != TK_OK) return st;
    const tk_gpu_profile *prof = c.gpu[0] ? tk_gpu_profile_find(c.gpu) : NULL;
    int cuda = c.device == TK_DEVICE_CUDA || prof != NULL;
    if ((st = check_config(&c, cuda, err)) != TK_OK) return st;

    sim s;
    memset(&s, 0, sizeof s);
    s.B = c.batch_size, s.T = c.max_len, s.H = c.hidden, s.nh = c.heads, s.I = c.intermediate;
    s.V = c.vocab_size, s.P = c.max_position, s.TV = c.type_vocab, s.L = c.layers;
    s.labels = c.num_labels > 0 ? c.num_labels : 2;
    s.qa = c.task == TK_TASK_QA;
    s.cuda = cuda;
    s.torch1 = tk_torch_minor(c.torch_version) < 0; /* torch 1.13 and 1.10 share these rules */
    s.torch110 = c.torch_version == TK_TORCH_1_10;
    s.eager = s.torch1 || c.attn_implementation == TK_ATTN_IMPL_EAGER;
    s.p_drop = c.dropout;
    s.p_attn = c.attention_dropout < 0 ? c.dropout : c.attention_dropout;
    s.bf16 = c.precision == TK_PREC_BF16;
    s.fp16 = c.precision == TK_PREC_FP16;
    s.act = s.bf16 || s.fp16 ? 2 : 4;
    s.ckpt = c.recompute == TK_RECOMPUTE_LAYERS;
    s.adam8 = c.optimizer == TK_OPTIM_ADAMW8;
    s.acc = c.accumulate > 0 ? c.accumulate : 1;
    s.layer = -1;
    if (s.T > s.P) {
        tk_err_set(err, TK_EINVAL, "max_len: %d is more than the model's %d position embeddings", s.T, s.P);
        return TK_EINVAL;
    }
    /* which attention kernel runs */
    int cc_major = prof ? prof->cc_major : 8;
    int head_dim = s.H / s.nh;
    if (s.eager) {
        out->attention = s.torch1 && c.attn_implementation == TK_ATTN_IMPL_SDPA
                             ? s.torch110 ? "eager (transformers 4.15 runs BERT's attention eagerly only)"
                                                   : "eager (transformers 4.40 runs BERT's attention eagerly only)" : "eager";
    } else if (!cuda) {
        s.sdpa_math = s.p_attn > 0;
        out->attention = s.sdpa_math ? "sdpa (math: the CPU's flash kernel takes no dropout)" : "sdpa (cpu flash)";
    } else if (cc_major >= 8 && s.act == 2 && head_dim <= 256 && head_dim % 8 == 0) {
        out->attention = "sdpa (flash)";
    } else if (cc_major >= 5 && head_dim % 8 == 0) {
        s.sdpa_eff = 1;
        out->attention = "sdpa (efficient)";
    } else {
        s.sdpa_math = 1;
        out->attention = "sdpa (math)";
    }
    out->optimizer = s.adam8                ? "AdamW8bit (bitsandbytes)"
                     : cuda && !s.torch1  ? "AdamW (foreach)"
                     : s.torch110           ? "AdamW (transformers' own, Trainer's default in 4.15)"
                                            : "AdamW (single-tensor)";
    out->precision = s.bf16 ? "bf16 autocast" : s.fp16 ? "fp16 autocast + GradScaler" : "fp32";
    out->device = cuda ? "cuda" : "cpu";
    out->torch_version = VERSIONS[c.torch_version].torch;
    out->transformers_version = VERSIONS[c.torch_version].transformers;
    out->batch = s.B, out->seq = s.T, out->accumulate = s.acc, out->on_cuda = cuda;
    if (prof) snprintf(out->gpu, sizeof out->gpu, "%s", prof->name);

    uintptr_t next_addr = 1 << 20;
    tk_devmem dm = {fake_seg_alloc, fake_seg_free, &next_addr};
    s.a = tk_alloc_new(dm, 0);
    params p;
    memset(&p, 0, sizeof p);
    p.l = tk_calloc((size_t)s.L, sizeof *p.l);
    s.layer_first = tk_calloc((size_t)s.L + 1, sizeof(int));
    s.layer_input = tk_calloc((size_t)s.L + 1, sizeof(int));
    s.layer_in_node = tk_calloc((size_t)s.L + 1, sizeof(int));
    s.layer_rng = tk_calloc((size_t)s.L + 1, sizeof(int));
    cast_cache *cc = tk_calloc(1, sizeof *cc);
    if (!s.a || !p.l || !s.layer_first || !s.layer_input || !s.layer_in_node || !s.layer_rng || !cc) {
        s.st = TK_ENOMEM;
        goto done;
    }
    for (int l = 0; l <= s.L; l++) s.layer_input[l] = s.layer_rng[l] = -1;
    s.prm = &p;
    s.step = -1;
    const char *events = getenv("TXK_TORCHPLAN_EVENTS"); /* a developer's diff against torch_reference --events */
    if (events && *events && !(s.trace = fopen(events, "w"))) {
        tk_err_set(err, TK_EIO, "TXK_TORCHPLAN_EVENTS: cannot write %s", events);
        s.st = TK_EIO;
        goto done;
    }
    make_params(&s, &p, c.freeze_embeddings);
    s.w[0] = s.w[1] = s.lt[0] = s.lt[1] = -1;
    if (cuda) {
        tk_torch_blas_rules(c.torch_version, cc_major, prof ? prof->cc_minor : 0, &s.blas);
        /* no card named: an A100's (the sm80 the attention choice assumes too) */
        s.sms = prof ? prof->sm_count : 108;
        s.threads_per_sm = prof ? prof->threads_per_sm : 2048;
        out->workspace_bytes = s.blas.w_bytes;
        out->workspaces = s.blas.source;
    }
    if (s.fp16) { /* GradScaler's scale and growth tracker */
        s.cat = TK_CAT_OPTIM;
        set_owner(&s, "GradScaler");
        tnew(&s, 4);
        tnew(&s, 4);
    }
    tk_alloc_stats stats;
    tk_alloc_reset_peak(s.a);
    s.step = 0;
    train_step(&s, &p, cc, 1);
    tk_alloc_stats_get(s.a, &stats);
    out->first_step_peak_allocated = stats.allocated_peak;
    tk_alloc_reset_peak(s.a);
    s.step = 1;
    train_step(&s, &p, cc, 0);
    tk_alloc_stats_get(s.a, &stats);
    out->peak_allocated = stats.allocated_peak;
    out->peak_reserved = stats.reserved_peak;
    {
        tk_alloc_stats all;
        tk_alloc_stats_get(s.a, &all);
        if (all.reserved_peak > out->peak_reserved) out->peak_reserved = all.reserved_peak;
    }
    memcpy(out->by_cat_at_peak, stats.by_cat_at_peak, sizeof out->by_cat_at_peak);
    out->param_bytes = stats.by_cat[TK_CAT_PARAM];
    out->grad_bytes = stats.by_cat[TK_CAT_GRAD];
    out->optim_bytes = stats.by_cat[TK_CAT_OPTIM];
    for (int i = 0; i < s.np; i++) {
        out->n_params += (int64_t)(s.pr[i].bytes / 4);
        if (s.pr[i].trainable) out->n_trainable += (int64_t)(s.pr[i].bytes / 4);
    }
    for (int th = 0; th < 2; th++) {
        out->n_workspaces += s.w[th] >= 0;
        if (s.lt[th] >= 0) out->lt_workspace_bytes += s.blas.lt_bytes;
    }
    /* torch 1.x: cuBLAS's own pools, one per thread that ran a GEMM, on the
     * card beside the allocator */
    if (cuda && s.blas.where == TK_BLAS_W_OUTSIDE) out->outside_bytes = 2 * s.blas.w_bytes;
    out->context_bytes = pytorch_context(prof);
    out->capacity = prof ? prof->capacity : c.capacity;
    out->device_used = out->peak_reserved + out->context_bytes + out->outside_bytes;
    out->fits = !out->capacity || out->device_used <= out->capacity;
done:
    st = s.st;
    if (s.trace) fclose(s.trace);
    if (st == TK_ENOMEM) tk_err_nomem(err, "engine pytorch plan");
    else if (st == TK_EIO) { /* err already names the file */ }
    else if (st != TK_OK) tk_err_set(err, st, "engine pytorch plan: the simulated allocator failed (%s)", tk_status_name(st));
    tk_alloc_destroy(&s.a);
    free(s.t), free(s.n), free(s.pr), free(p.l), free(cc ? cc->t : NULL), free(cc);
    free(s.layer_first), free(s.layer_input), free(s.layer_in_node), free(s.layer_rng);
    return st;
}

json_t *tk_torchplan_json(const tk_torchplan_result *r) {
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, "
                          "s:I, s:I, s:I, s:I, s:I}",
                          "engine", "pytorch", "torch_version", r->torch_version, "transformers_version",
                          r->transformers_version, "device", r->device, "attention", r->attention, "optimizer",
                          r->optimizer, "precision", r->precision, "batch", r->batch, "seq", r->seq, "accumulate",
                          r->accumulate, "peak_allocated", (json_int_t)r->peak_allocated, "first_step_peak_allocated",
                          (json_int_t)r->first_step_peak_allocated, "peak_reserved", (json_int_t)r->peak_reserved,
                          "device_used", (json_int_t)r->device_used, "context_bytes", (json_int_t)r->context_bytes,
                          "workspace_bytes", (json_int_t)r->workspace_bytes, "capacity", (json_int_t)r->capacity,
                          "fits", r->fits, "param_bytes", (json_int_t)r->param_bytes, "grad_bytes",
                          (json_int_t)r->grad_bytes, "optim_bytes", (json_int_t)r->optim_bytes, "n_params",
                          (json_int_t)r->n_params, "n_trainable", (json_int_t)r->n_trainable);
    if (j && r->gpu[0]) json_object_set_new(j, "gpu", json_string(r->gpu));
    if (j && r->on_cuda) {
        json_object_set_new(j, "n_workspaces", json_integer(r->n_workspaces));
        json_object_set_new(j, "lt_workspace_bytes", json_integer((json_int_t)r->lt_workspace_bytes));
        json_object_set_new(j, "outside_bytes", json_integer((json_int_t)r->outside_bytes));
        json_object_set_new(j, "workspaces", json_string(r->workspaces ? r->workspaces : ""));
    }
    return j;
}
