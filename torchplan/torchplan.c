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
#include "tk_plan.h"

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
    int64_t bias_rows, bias_out;  /* a Linear whose bias gets a gradient (its last edge): the sum of the
                                     (rows, out) gradient over rows; 0 when the bias is frozen */
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
    int qa, cuda, torch1, torch110, eager, sdpa_math, sdpa_eff, bf16, fp16, ckpt, adam8, fused, acc;
    int pad_mask;                 /* the batch has padding: transformers 5 builds a (B, 1, T, T) mask */
    int mask_t;                   /* that mask while BertModel.forward runs (-1 none) */
    int ckpt_mask;                /* checkpointing: the mask as the layers' recomputation holds it */
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
    /* two or more GPUs (the section "two or more GPUs" below): what this GPU holds */
    int role;                     /* ROLE_ONE, ROLE_DDP, ROLE_DP0, ROLE_DP1, ROLE_ZERO2 */
    int world;                    /* GPUs (ranks) */
    int *held;                    /* DataParallel: each parameter's replica gradient, held for the reduce (-1 none) */
    int *chunk, nchunk;           /* DataParallel GPU 1: the replica's flat copies of the parameters */
    int *chunk_of;                /* DataParallel GPU 1: each parameter's copy */
    int buf_chunk;                /* DataParallel GPU 1: the copy of the buffers */
    int *bucket, nbucket;         /* DDP: the reducer's bucket tensors */
    int *ready, nready;           /* DDP: parameters in the order their gradients became ready in step 1 */
    int find_unused;              /* DDP: find_unused_parameters (as the Trainer sets it) */
    int rebuilt;                  /* DDP: the buckets were rebuilt in gradient order */
    size_t bucket_cap, first_bucket_cap;
} sim;

/* What one simulated GPU is in a run over several (tk_parallel). */
enum { ROLE_ONE = 0, ROLE_DDP, ROLE_DP0, ROLE_DP1, ROLE_ZERO2 };

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

/* The bias edge of a Linear's node n (its last), for the (rows, out) sum
 * its gradient is: marked only when nedge added it (a frozen bias adds
 * none), so backward knows the sum runs. */
static void nedge_bias(sim *s, int n, int to_node, int to_param, size_t rows, size_t out, size_t esz) {
    if (n < 0 || s->recompute) return;
    int ne = s->n[n].ne;
    nedge(s, n, to_node, to_param, out * esz, 0);
    if (s->n[n].ne > ne) s->n[n].bias_rows = (int64_t)rows, s->n[n].bias_out = (int64_t)out;
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
    /* DataParallel's GPU 1 gets copies each forward (dp_replicate); ZeRO-2's
     * model states are DeepSpeed's (zero2_states) */
    if (s->role == ROLE_DP1 || s->role == ROLE_ZERO2) return i;
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
    if (s->role != ROLE_DP1) {
        tnew(s, (size_t)s->P * 8);
        tnew(s, (size_t)s->P * 8);
    }
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

/* The section "two or more GPUs": a node keeps parameter `pi` for backward;
 * a parameter's gradient g arrives (1: taken there, 0: AccumulateGrad's). */
static void psave(sim *s, int n, int pi);
static int par_grad(sim *s, int pi, int g);
/* ... and what a data-parallel forward adds before and after the model's
 * (loss: the one backward starts from), and what its backward ends with */
static void par_forward_start(sim *s);
static void par_forward_end(sim *s, var *loss);
static void par_backward_end(sim *s);

static size_t tbytes(sim *s, var v) { return v.t >= 0 ? s->t[v.t].bytes : 0; }
static void vdrop(sim *s, var v) { tdrop(s, v.t); }

/* The autocast cast cache: weight and bias copies made once per forward,
 * dropped when the autocast region ends. */
typedef struct { int *t; int n, cap; } cast_cache;

/* A 16-bit copy of a parameter under autocast (ToCopyBackward0 to the param). */
static var cast_param(sim *s, cast_cache *cc, int pi, size_t numel) {
    if (s->role == ROLE_ZERO2) {
        /* DeepSpeed's fp16/bf16 engine holds the weights in 16 bits: no
         * copy; the 16-bit gradient goes on to DeepSpeed's hook as it is */
        int n = nnew(s);
        nedge(s, n, -1, pi, numel * 2, 1);
        return (var){-1, s->pr[pi].trainable ? n : -1};
    }
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
    if (n >= 0) s->n[n].gemm = 1;
    nsave(s, n, xin.t);
    if (w.t >= 0) nsave(s, n, w.t);
    else if (!s->bf16 && !s->fp16) psave(s, n, pw); /* addmm keeps weight.t() */
    nedge(s, n, xin.node, -1, tbytes(s, xin), 0);
    if (s->bf16 || s->fp16) {
        nedge(s, n, w.node, -1, in * out * 2, 0);
        nedge_bias(s, n, b.node, -1, rows, out, 2);
    } else {
        nedge(s, n, -1, pw, in * out * 4, 0);
        nedge_bias(s, n, -1, pb, rows, out, 4);
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
    psave(s, n, pw); /* native_layer_norm's backward takes the weight and the bias */
    psave(s, n, pb);
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

/* SDPA given transformers 5's boolean padding mask: it converts it to an
 * additive one of the query's dtype, (B, 1, T, T), which the kernel keeps for
 * backward (the CPU flash kernel: torch 2.15's allocator events); CUDA's
 * efficient kernel takes it padded to a multiple of 16 keys (PyTorch's
 * attention.cpp preprocess_mask / pad_bias). -1 without padding. */
static int sdpa_bias(sim *s) {
    if (!s->pad_mask) return -1;
    size_t rows = (size_t)s->B * s->T, keys = (size_t)s->T;
    if (!s->cuda || !s->sdpa_eff) return tnew(s, rows * keys * s->act);
    int conv = tnew(s, rows * keys * s->act);
    int padded = tnew(s, rows * ((keys + 15) / 16 * 16) * s->act);
    tdrop(s, conv);
    return padded;
}

/* transformers 5's mask for a padded batch (masking_utils.py sdpa_mask:
 * bool (B, 1, T, T); eager_mask: then fp32 0 / -inf), made after the
 * embeddings and kept until BertModel.forward returns. */
static void padding_mask(sim *s) {
    s->mask_t = -1;
    if (!s->pad_mask) return;
    size_t n = (size_t)s->B * s->T * s->T;
    int b = tnew(s, n);
    if (!s->eager) {
        s->mask_t = b;
        return;
    }
    s->mask_t = tnew(s, n * 4);
    tdrop(s, b);
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
        int bias = sdpa_bias(s);
        int n = nnew(s);
        nsave(s, n, qv.t);
        nsave(s, n, kv.t);
        nsave(s, n, vv.t);
        nsave(s, n, out);
        nsave(s, n, lse);
        if (rng >= 0) nsave(s, n, rng);
        nsave(s, n, bias);
        tdrop(s, bias);
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
        /* math SDPA given the padding mask: its additive copy for the call
         * (added in place), and _safe_softmax's isneginf (torch 2.15's events) */
        int mb = s->sdpa_math && s->pad_mask ? tnew(s, (size_t)s->B * s->T * s->T * s->act) : -1;
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
        if (s->torch1 || (s->pad_mask && !s->sdpa_math)) {
            /* transformers 4.x adds the extended attention mask, fp32 (the
             * model's dtype) even when all ones, transformers 5 its padding
             * mask: under autocast the sum is
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
        if (mb >= 0) ttmp(s, (size_t)s->B * s->nh * s->T * s->T);
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
        tdrop(s, mb);
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
        tdrop(s, s->mask_t);
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
            if (n >= 0) s->n[n].gemm = 1;
            nsave(s, n, first.t);
            psave(s, n, p->pool_w);
            nedge(s, n, sel, -1, B * H * 4, 0);
            nedge(s, n, -1, p->pool_w, H * H * 4, 0);
            nedge_bias(s, n, -1, p->pool_b, B, H, 4);
            tdrop(s, first.t);
            pl = (var){y, n};
        }
        var th = unary(s, pl, 1);
        vdrop(s, pl);
        vdrop(s, emb_out); /* BertModel.forward returns after the pooler */
        tdrop(s, s->mask_t);
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
    if (e.param >= 0 && s->role != ROLE_ONE && par_grad(s, e.param, g)) return;
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
    if (g >= 0 && x->bias_out && outs[x->ne - 1] >= 0) bias_sum_scratch(s, x->bias_rows, x->bias_out);
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
            if (l == 0) tdrop(s, s->ckpt_mask), s->ckpt_mask = -1;
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
    padding_mask(s);
    s->ckpt_mask = -1;
    if (s->ckpt && s->mask_t >= 0) { /* each checkpointed layer's recomputation keeps its inputs */
        tref(s, s->mask_t);
        s->ckpt_mask = s->mask_t;
    }
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
    if (s->role == ROLE_DP1 || s->role == ROLE_ZERO2) return; /* GPU 0's optimizer; DeepSpeed's states */
    s->cat = TK_CAT_OPTIM;
    for (int i = 0; i < s->np && first; i++) {
        param *p = &s->pr[i];
        if (!p->trainable || p->grad < 0) continue;
        s->owner = p->owner;
        size_t numel = p->bytes / 4;
        /* state['step']: a CPU tensor, or (fused) a float32 one on the
         * parameter's device (torch/optim/adam.py _init_group) */
        if ((!s->cuda || s->fused) && !s->torch110) tnew(s, 4);
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
    if (s->fused) {
        /* _fused_adam: torch._foreach_add_(state_steps, 1), then one
         * _fused_adamw_ kernel over all the tensors, in place. On the CPU the
         * foreach add runs tensor by tensor, each add_ taking two small
         * blocks (the allocator events of torch 2.15); on CUDA the foreach
         * kernel takes the scalar as an argument and allocates nothing. */
        for (int i = 0; i < s->np && !s->cuda; i++) {
            if (!s->pr[i].trainable || s->pr[i].grad < 0) continue;
            s->owner = s->pr[i].owner;
            int a = tnew(s, 4), b = tnew(s, 4);
            tdrop(s, a);
            tdrop(s, b);
        }
        return;
    }
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
    if (s->torch1 || s->role == ROLE_DP1 || s->role == ROLE_ZERO2) return;
    for (int i = 0; i < s->np; i++) {
        tdrop(s, s->pr[i].grad);
        s->pr[i].grad = -1;
    }
}

/* One optimizer step: zero_grad, `acc` micro-batches, optimizer.step(). */
static void train_step(sim *s, const params *p, cast_cache *cc, int first) {
    /* GradScaler lives where the loss and the optimizer are: GPU 0 of
     * DataParallel; DeepSpeed scales the loss itself */
    int scaler = s->fp16 && s->role != ROLE_DP1 && s->role != ROLE_ZERO2;
    zero_grad(s);
    for (int m = 0; m < s->acc && s->st == TK_OK; m++) {
        size_t bt = (size_t)s->B * s->T;
        s->cat = TK_CAT_INPUT;
        set_owner(s, "inputs");
        /* DataParallel: the Trainer moves the whole batch to GPU 0, whose
         * chunk of the scatter is a view of it; GPU 1's is a copy */
        size_t k = s->role == ROLE_DP0 ? (size_t)s->world : 1;
        int in[5], nin = 0;
        in[nin++] = tnew(s, k * bt * 8);               /* input_ids */
        in[nin++] = tnew(s, k * bt * 8);               /* token_type_ids */
        in[nin++] = tnew(s, k * bt * 8);               /* attention_mask */
        in[nin++] = tnew(s, k * (size_t)s->B * 8);     /* labels / start_positions */
        if (s->qa) in[nin++] = tnew(s, k * (size_t)s->B * 8); /* end_positions */
        int first_node = s->nn;
        par_forward_start(s);
        var loss = forward(s, p, cc);
        par_forward_end(s, &loss);
        if (scaler) { /* GradScaler: scaler.scale(loss) */
            s->cat = TK_CAT_TEMP;
            var sl = scale(s, loss);
            vdrop(s, loss);
            loss = sl;
        }
        backward(s, loss, first_node, cc);
        par_backward_end(s);
        vdrop(s, loss);
        for (int k = 0; k < nin; k++) tdrop(s, in[k]);
    }
    if (scaler) { /* unscale_: found_inf and inv_scale */
        s->cat = TK_CAT_TEMP;
        int f = tnew(s, 4), iv = tnew(s, 4);
        optimizer_step(s, first);
        tdrop(s, f);
        tdrop(s, iv);
    } else {
        optimizer_step(s, first);
    }
}

/* ---- two or more GPUs ----------------------------------------------------------------- */

/* Groups n sizes (bytes[i] of item i, in order) into chunks as PyTorch groups
 * tensors to flatten or bucket them. The C++ rule (torch/csrc/utils/
 * tensor_flatten.cpp take_tensors; c10d's compute_bucket_assignment_by_size):
 * a chunk takes tensors until its bytes reach the limit, that tensor
 * included, and the next chunk has the next limit (the last one repeats).
 * The Python rule (before = 1; torch/_utils.py _take_tensors): a tensor that
 * would take a non-empty chunk past the limit starts the next chunk.
 * chunk[i] gets item i's chunk; returns the number of chunks. */
static int group_sizes(const size_t *bytes, int n, const size_t *limits, int nlimits, int before, int *chunk) {
    int c = 0, li = 0;
    size_t sum = 0;
    for (int i = 0; i < n; i++) {
        if (before && sum > 0 && sum + bytes[i] > limits[li]) c++, sum = 0;
        chunk[i] = c;
        sum += bytes[i];
        if (!before && sum >= limits[li]) {
            c++, sum = 0;
            if (li + 1 < nlimits) li++;
        }
    }
    return sum > 0 ? c + 1 : c;
}

/* Every parameter's index in model.parameters() order (trainable: only
 * those that require grad); new array, *n of them. */
static int *param_ids(sim *s, int trainable, int *n) {
    int *ids = tk_calloc((size_t)s->np + 1, sizeof *ids);
    if (!ids) {
        fail_oom(s);
        return NULL;
    }
    *n = 0;
    for (int i = 0; i < s->np; i++)
        if (!trainable || s->pr[i].trainable) ids[(*n)++] = i;
    return ids;
}

/* Parameters grouped into chunks by group_sizes: ids[i] (n, in order),
 * chunk[i] of each, and of each of the nc chunks its bytes and tensors. */
typedef struct {
    int *ids, *chunk, *count, n, nc;
    size_t *sums;
} grouping;

static void grouping_free(grouping *g) {
    free(g->ids), free(g->chunk), free(g->count), free(g->sums);
    memset(g, 0, sizeof *g);
}

/* Groups the parameters `order` (n of them; NULL: all of them in model
 * order) under `limits` by the C++ rule, or the Python one (`before`).
 * Returns nc, or -1 out of host memory (g then empty). */
static int group_params(sim *s, const int *order, int n, const size_t *limits, int nlimits, int before, grouping *g) {
    memset(g, 0, sizeof *g);
    g->ids = order ? tk_calloc((size_t)n + 1, sizeof *g->ids) : param_ids(s, 0, &n);
    g->n = n;
    g->chunk = tk_calloc((size_t)n + 1, sizeof *g->chunk);
    g->count = tk_calloc((size_t)n + 1, sizeof *g->count);
    g->sums = tk_calloc((size_t)n + 1, sizeof *g->sums);
    if (!g->ids || !g->chunk || !g->count || !g->sums) {
        grouping_free(g);
        return fail_oom(s);
    }
    if (order) memcpy(g->ids, order, (size_t)n * sizeof *order);
    for (int i = 0; i < n; i++) g->sums[i] = s->pr[g->ids[i]].bytes;
    g->nc = group_sizes(g->sums, n, limits, nlimits, before, g->chunk);
    memset(g->sums, 0, ((size_t)n + 1) * sizeof *g->sums);
    for (int i = 0; i < n; i++) g->sums[g->chunk[i]] += s->pr[g->ids[i]].bytes, g->count[g->chunk[i]]++;
    return g->nc;
}

/* DDP: the reducer's buckets over the trainable parameters `ids` (n, in the
 * order given) under `limits`, one tensor each, kept while DDP lives
 * (reducer.cpp initialize_buckets: bucket.gradients = at::empty(...)); with
 * gradient_as_bucket_view=False (DDP's and accelerate's default, which the
 * Trainer keeps) the gradients are tensors of their own beside them. */
static void ddp_buckets(sim *s, const int *ids, int n, const size_t *limits, int nlimits) {
    grouping g;
    if (group_params(s, ids, n, limits, nlimits, 0, &g) < 0) return;
    if (!(s->bucket = tk_calloc((size_t)g.nc + 1, sizeof *s->bucket))) fail_oom(s);
    s->cat = TK_CAT_GRAD;
    set_owner(s, "DDP reducer buckets");
    /* DDP hands the reducer the buckets reversed (the order gradients come) */
    for (int b = g.nc - 1; b >= 0 && s->bucket; b--) s->bucket[s->nbucket++] = tnew(s, g.sums[b]);
    grouping_free(&g);
}

/* DDP(model) (torch/nn/parallel/distributed.py), before the first step:
 * rank 0's parameters and buffers are broadcast (c10d broadcast_coalesced
 * with 250 MiB buckets per dtype, each bucket flattened into one tensor, a
 * view when it holds one tensor, two buckets in flight), then the reducer's
 * buckets: with find_unused_parameters, 1 MiB then bucket_cap_mb (25 MiB)
 * over the parameters in reverse; without it, one bucket of all of them
 * until the first backward has shown the order gradients come in. */
static void ddp_init(sim *s) {
    grouping g;
    size_t lim = (size_t)250 << 20;
    int nc = group_params(s, NULL, 0, &lim, 1, 0, &g);
    s->cat = TK_CAT_TEMP;
    set_owner(s, "DDP broadcast");
    int fly[2] = {-1, -1};
    for (int c = 0; c <= nc && nc >= 0; c++) { /* the parameters' buckets, then the int64 buffers' */
        tdrop(s, fly[0]);
        fly[0] = fly[1];
        fly[1] = c < nc ? (g.count[c] > 1 ? tnew(s, g.sums[c]) : -1) : tnew(s, (size_t)s->P * 8 * 2);
    }
    tdrop(s, fly[0]);
    tdrop(s, fly[1]);
    grouping_free(&g);
    int nt = 0, *t = param_ids(s, 1, &nt);
    if (!t) return;
    s->cat = TK_CAT_GRAD;
    set_owner(s, "DDP reducer buckets");
    if (s->find_unused) { /* the reducer's per-parameter used map: the CPU's, and the device's copy */
        if (!s->cuda) tnew(s, (size_t)nt * 4);
        tnew(s, (size_t)nt * 4);
    }
    size_t all = SIZE_MAX, lims[2] = {s->first_bucket_cap, s->bucket_cap};
    ddp_buckets(s, t, nt, s->find_unused ? lims : &all, s->find_unused ? 2 : 1);
    free(t);
}

/* DataParallel's replicate on this GPU: the parameters, then the buffers,
 * broadcast from GPU 0 in 10 MiB chunks (torch/nn/parallel/replicate.py ->
 * torch/csrc/cuda/comm.cpp broadcast_coalesced): GPU 0 flattens each chunk
 * of more than one tensor into a temporary and keeps its own tensors as the
 * first replica; GPU 1 receives each chunk into one new tensor, which its
 * replica's parameters are views of. */
static void dp_replicate(sim *s) {
    grouping g;
    size_t lim = (size_t)10 << 20;
    int nc = group_params(s, NULL, 0, &lim, 1, 0, &g);
    set_owner(s, "DataParallel replica");
    if (s->role == ROLE_DP1) {
        free(s->chunk);
        s->chunk = tk_calloc((size_t)nc + 1, sizeof *s->chunk);
        if (!s->chunk) fail_oom(s);
        s->nchunk = 0;
    }
    for (int c = 0; c < nc && s->st == TK_OK; c++) {
        if (s->role == ROLE_DP0) {
            if (g.count[c] > 1) ttmp(s, g.sums[c]);
            continue;
        }
        s->cat = TK_CAT_PARAM;
        s->chunk[s->nchunk++] = tnew(s, g.sums[c]);
        for (int i = 0; i < g.n; i++)
            if (g.chunk[i] == c) s->chunk_of[g.ids[i]] = s->nchunk - 1;
    }
    /* the two int64 buffers, one chunk */
    if (s->role == ROLE_DP0) ttmp(s, (size_t)s->P * 8 * 2);
    else s->cat = TK_CAT_PARAM, s->buf_chunk = tnew(s, (size_t)s->P * 8 * 2);
    grouping_free(&g);
}

static void psave(sim *s, int n, int pi) {
    /* GPU 1's replica parameters live as long as a node keeps them (or, under
     * checkpointing, the layer's recomputation holds the replica) */
    if (s->role != ROLE_DP1 || s->ckpt || pi < 0 || !s->chunk || s->recompute || s->chunk_of[pi] >= s->nchunk) return;
    nsave(s, n, s->chunk[s->chunk_of[pi]]);
}

static int par_grad(sim *s, int pi, int g) {
    if (s->role == ROLE_ZERO2) { /* DeepSpeed's hook copies it into its reduce bucket */
        tdrop(s, g);
        return 1;
    }
    if (s->role == ROLE_DDP) {
        /* the reducer's hook after AccumulateGrad: step 1 records the order
         * (for the rebuild); on the CPU the copy into the bucket divides by
         * a wrapped scalar tensor (reducer.cpp mark_variable_ready_dense) */
        if (s->step == 0 && s->ready && s->pr[pi].grad < 0 && s->nready < s->np) s->ready[s->nready++] = pi;
        if (!s->cuda) ttmp(s, 8);
        return 0;
    }
    /* DataParallel: a replica parameter's gradient waits in the input buffer
     * of Broadcast's backward for the reduce (summed in place there) */
    if (s->held[pi] < 0) s->held[pi] = g;
    else tdrop(s, g);
    return 1;
}

static void par_forward_start(sim *s) {
    if (s->role == ROLE_DDP) {
        if (!s->find_unused && s->nready > 0 && !s->rebuilt) {
            /* the first forward after a backward rebuilds the buckets in the
             * order the gradients came (reducer.cpp rebuild_buckets): the
             * old ones go first */
            for (int b = 0; b < s->nbucket; b++) tdrop(s, s->bucket[b]);
            free(s->bucket);
            s->bucket = NULL;
            s->nbucket = 0;
            size_t lims[2] = {s->first_bucket_cap, s->bucket_cap};
            ddp_buckets(s, s->ready, s->nready, lims, 2);
            s->rebuilt = 1;
        }
        /* broadcast_buffers: the buffers flattened and broadcast each forward */
        set_owner(s, "DDP broadcast");
        ttmp(s, (size_t)s->P * 8 * 2);
    } else if (s->role == ROLE_DP0 || s->role == ROLE_DP1) {
        dp_replicate(s);
    }
    s->cat = TK_CAT_ACT;
}

static void par_forward_end(sim *s, var *loss) {
    if (s->role == ROLE_DP0) {
        /* Gather: each replica's loss (a vector of them) and logits onto GPU 0;
         * the Trainer takes loss.mean() and drops the outputs */
        s->cat = TK_CAT_ACT;
        set_owner(s, "DataParallel gather");
        size_t W = (size_t)s->world, B = (size_t)s->B;
        int vec = tnew(s, W * 4);
        if (s->qa) {
            int a = tnew(s, W * B * (size_t)s->T * s->act), b = tnew(s, W * B * (size_t)s->T * s->act);
            tdrop(s, a);
            tdrop(s, b);
        } else {
            ttmp(s, W * B * (size_t)s->labels * s->act);
        }
        int mean = tnew(s, 4);
        tdrop(s, vec);
        tdrop(s, loss->t);
        loss->t = mean;
    } else if (s->role == ROLE_DP1 && !s->ckpt) {
        /* the replica module is gone: its copies live on in the nodes that
         * keep them */
        for (int c = 0; c < s->nchunk; c++) tdrop(s, s->chunk[c]);
    }
}

/* DataParallel's reduce at the end of backward (torch/nn/parallel/
 * _functions.py Broadcast.backward -> comm.py reduce_add_coalesced): every
 * replica gradient (zeros for the frozen parameters: autograd materialises
 * them) in 10 MiB chunks; each GPU flattens its chunk (a copy when it holds
 * more than one tensor; the previous chunk's copies go when the next ones
 * exist); GPU 0 gets each chunk's sum (NCCL reduce into empty_like), which
 * its parameters' .grad become views of. */
static void dp_reduce(sim *s) {
    grouping g;
    size_t lim = (size_t)10 << 20;
    int nc = group_params(s, NULL, 0, &lim, 1, 1, &g);
    s->cat = TK_CAT_GRAD;
    set_owner(s, "DataParallel reduce");
    for (int i = 0; i < g.n && s->st == TK_OK; i++)
        if (s->held[g.ids[i]] < 0) s->held[g.ids[i]] = tnew(s, s->pr[g.ids[i]].bytes);
    int prev = -1;
    for (int c = 0, first = 0; c < nc && s->st == TK_OK; first += g.count[c++]) {
        s->cat = TK_CAT_TEMP;
        int flat = g.count[c] > 1 ? tnew(s, g.sums[c]) : -1;
        tdrop(s, prev);
        prev = flat;
        if (s->role != ROLE_DP0) continue;
        s->cat = TK_CAT_GRAD;
        int sum = tnew(s, g.sums[c]);
        for (int i = first; i < first + g.count[c]; i++) {
            param *p = &s->pr[g.ids[i]];
            if (!p->trainable) continue;
            tref(s, sum); /* .grad: a view of the chunk's sum, or added into the .grad it has */
            if (p->grad < 0) p->grad = sum;
            else tdrop(s, sum);
        }
        tdrop(s, sum);
    }
    tdrop(s, prev);
    for (int i = 0; i < g.n; i++) {
        tdrop(s, s->held[g.ids[i]]);
        s->held[g.ids[i]] = -1;
    }
    grouping_free(&g);
}

static void par_backward_end(sim *s) {
    if (s->role != ROLE_DP0 && s->role != ROLE_DP1) return;
    dp_reduce(s);
    if (s->role == ROLE_DP1) {
        for (int c = 0; c < s->nchunk && s->ckpt; c++) tdrop(s, s->chunk[c]);
        s->nchunk = 0;
        tdrop(s, s->buf_chunk);
        s->buf_chunk = -1;
    }
}

/* DeepSpeed ZeRO-2's model states on each GPU, by its own estimate
 * (deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs,
 * the figures of DeepSpeed's "Memory Requirements" page): 4 bytes per
 * parameter on every GPU (the 16-bit weights and gradients) and 16 per
 * parameter over the GPUs (fp32 weights, Adam's two moments and fp32
 * gradients, partitioned). Allocated before the first step. */
static void zero2_states(sim *s) {
    size_t psi = 0;
    for (int i = 0; i < s->np; i++) psi += s->pr[i].bytes / 4;
    set_owner(s, "DeepSpeed ZeRO-2");
    s->cat = TK_CAT_PARAM;
    tnew(s, 2 * psi);
    s->cat = TK_CAT_GRAD;
    tnew(s, 2 * psi);
    s->cat = TK_CAT_OPTIM;
    tnew(s, 16 * psi / (size_t)s->world);
}

/* ---- the plan ---------------------------------------------------------------------------- */

/* The CUDA context PyTorch itself takes on a card (its kernels, cuBLAS and
 * cuDNN loaded), where it was measured; else the profile's estimate. */
size_t tk_torchplan_context(const tk_gpu_profile *prof) {
    if (!prof) return 0;
    /* HF's "Model training anatomy" (transformers docs, model_memory_anatomy):
     * nvidia-smi showed 1343 MiB on its V100 after torch.ones((1, 1)).to("cuda"),
     * which includes that tensor's 2 MiB segment */
    if (!strcmp(prof->name, "v100-16")) return (size_t)(1343 - 2) << 20;
    return prof->context_overhead;
}

static tk_status check_config(const tk_config *c, int cuda, int world, tk_err *err) {
    if (c->head == TK_HEAD_FLATTEN_DENSE || c->towers > 1) {
        tk_err_set(err, TK_EINVAL, "head: flatten_dense is txkernel's own head; engine: pytorch plans transformers' "
                                   "BertForSequenceClassification (task: classify) and BertForQuestionAnswering (task: qa)");
        return TK_EINVAL;
    }
    if (c->zero > 0) {
        tk_err_set(err, TK_EINVAL, "zero: %d is txkernel's own sharding; with engine: pytorch, DeepSpeed's ZeRO stage 2 "
                                   "is parallel: zero2", c->zero);
        return TK_EINVAL;
    }
    if (world > 1 && !cuda && c->parallel != TK_PAR_DDP) {
        tk_err_set(err, TK_EINVAL, "parallel: %s runs on CUDA GPUs (a gpu: card, or device: cuda); on the cpu, "
                                   "parallel: ddp plans each gloo rank", c->parallel == TK_PAR_ZERO2 ? "zero2" : "dataparallel");
        return TK_EINVAL;
    }
    if (world > 1 && c->parallel == TK_PAR_ZERO2 && c->precision == TK_PREC_FP32) {
        tk_err_set(err, TK_EINVAL, "parallel: zero2 is planned from DeepSpeed's estimate for mixed precision: set "
                                   "precision: fp16 or bf16 (the Trainer's fp16=True / bf16=True)");
        return TK_EINVAL;
    }
    if (world > 1 && c->parallel == TK_PAR_ZERO2 && c->optimizer == TK_OPTIM_ADAMW8) {
        tk_err_set(err, TK_EINVAL, "optimizer: adamw8bit with parallel: zero2: DeepSpeed steps its own Adam over its "
                                   "partitioned state");
        return TK_EINVAL;
    }
    if (c->optimizer == TK_OPTIM_ADAMW_FUSED && tk_torch_minor(c->torch_version) < 0) {
        tk_err_set(err, TK_EINVAL, "optimizer: adamw_torch_fused is torch.optim.AdamW(fused=True), which torch %s does "
                                   "not have (torch 2.0 added it): use optimizer: adamw", VERSIONS[c->torch_version].torch);
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

/* One device's two steps as `proto` describes the step, in `role`: its
 * figures. freeze_emb: the embeddings are frozen. */
typedef struct {
    size_t peak_allocated, first_step_peak_allocated, peak_reserved;
    size_t param_bytes, grad_bytes, optim_bytes;
    int n_workspaces;             /* cuBLAS workspaces kept (this device's forward thread's and autograd's) */
    size_t lt_workspace_bytes, outside_bytes;
    size_t by_cat_at_peak[TK_CAT_COUNT];
    int64_t n_params, n_trainable;
} gpu_figures;

static tk_status simulate(const sim *proto, int role, int freeze_emb, gpu_figures *f, tk_err *err) {
    memset(f, 0, sizeof *f);
    sim s = *proto;
    s.role = role;
    s.buf_chunk = -1;
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
    if (events && *events && role <= ROLE_DDP && !(s.trace = fopen(events, "w"))) {
        tk_err_set(err, TK_EIO, "TXK_TORCHPLAN_EVENTS: cannot write %s", events);
        s.st = TK_EIO;
        goto done;
    }
    make_params(&s, &p, freeze_emb);
    /* cuBLAS's workspaces per (handle, stream): this device's forward
     * thread's (a DataParallel replica's forward runs on a thread of its own,
     * one per device, whose handle the pool hands back each step) and its
     * autograd device thread's */
    s.w[0] = s.w[1] = s.lt[0] = s.lt[1] = -1;
    if (s.st == TK_OK && role != ROLE_ONE) {
        s.held = tk_calloc((size_t)s.np + 1, sizeof *s.held);
        s.chunk_of = tk_calloc((size_t)s.np + 1, sizeof *s.chunk_of);
        s.ready = tk_calloc((size_t)s.np + 1, sizeof *s.ready);
        if (!s.held || !s.chunk_of || !s.ready) fail_oom(&s);
        for (int i = 0; s.held && i < s.np; i++) s.held[i] = -1;
    }
    if (role == ROLE_DDP) ddp_init(&s);
    if (role == ROLE_ZERO2) zero2_states(&s);
    if (s.fp16 && role != ROLE_DP1 && role != ROLE_ZERO2) { /* GradScaler's scale and growth tracker, on GPU 0 */
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
    f->first_step_peak_allocated = stats.allocated_peak;
    tk_alloc_reset_peak(s.a);
    s.step = 1;
    train_step(&s, &p, cc, 0);
    tk_alloc_stats_get(s.a, &stats);
    f->peak_allocated = stats.allocated_peak;
    f->peak_reserved = stats.reserved_peak;
    {
        tk_alloc_stats all;
        tk_alloc_stats_get(s.a, &all);
        if (all.reserved_peak > f->peak_reserved) f->peak_reserved = all.reserved_peak;
    }
    memcpy(f->by_cat_at_peak, stats.by_cat_at_peak, sizeof f->by_cat_at_peak);
    f->param_bytes = stats.by_cat[TK_CAT_PARAM];
    f->grad_bytes = stats.by_cat[TK_CAT_GRAD];
    f->optim_bytes = stats.by_cat[TK_CAT_OPTIM];
    for (int i = 0; i < s.np; i++) {
        f->n_params += (int64_t)(s.pr[i].bytes / 4);
        if (s.pr[i].trainable) f->n_trainable += (int64_t)(s.pr[i].bytes / 4);
    }
    for (int th = 0; th < 2; th++) {
        f->n_workspaces += s.w[th] >= 0;
        if (s.lt[th] >= 0) f->lt_workspace_bytes += s.blas.lt_bytes;
    }
    /* torch 1.x: cuBLAS's own pools, one per thread that ran a GEMM, on the
     * card beside the allocator */
    if (s.cuda && s.blas.where == TK_BLAS_W_OUTSIDE) f->outside_bytes = 2 * s.blas.w_bytes;
done:;
    tk_status st = s.st;
    if (s.trace) fclose(s.trace);
    if (st == TK_ENOMEM) tk_err_nomem(err, "engine pytorch plan");
    else if (st == TK_EIO) { /* err already names the file */ }
    else if (st != TK_OK) tk_err_set(err, st, "engine pytorch plan: the simulated allocator failed (%s)", tk_status_name(st));
    tk_alloc_destroy(&s.a);
    free(s.t), free(s.n), free(s.pr), free(p.l), free(cc ? cc->t : NULL), free(cc);
    free(s.layer_first), free(s.layer_input), free(s.layer_in_node), free(s.layer_rng);
    free(s.held), free(s.chunk), free(s.chunk_of), free(s.bucket), free(s.ready);
    return st;
}

/* What a run over several GPUs plans, and how it is known. */
static const struct { const char *name, *checked; } PARALLEL[] = {
    [TK_PAR_DATAPARALLEL] = {"DataParallel", "not measured: planned from torch.nn.DataParallel's sources (replicate, "
                                             "scatter, gather, reduce_add_coalesced); no two GPUs here to run it on"},
    [TK_PAR_DDP] = {"DDP", "each rank as PyTorch's DistributedDataParallel allocates it: checked on the CPU against "
                           "two gloo ranks of PyTorch itself; NCCL's own buffers (outside the caching allocator) "
                           "are not in it"},
    [TK_PAR_ZERO2] = {"DeepSpeed ZeRO-2", "not measured: model states by DeepSpeed's own estimate (4 bytes per "
                                          "parameter on every GPU + 16 per parameter over the GPUs), the step's "
                                          "activations as planned here; DeepSpeed cannot run here"},
};

tk_status tk_torchplan(const tk_config *c, tk_torchplan_result *out, tk_err *err) {
    return tk_torchplan_data(c, NULL, 0, out, err);
}

tk_status tk_torchplan_data(const tk_config *c0, const int *lengths, int nlen, tk_torchplan_result *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    tk_config c = *c0;
    tk_status st = tk_config_resolve_model(&c, err);
    if (st != TK_OK) return st;
    const tk_gpu_profile *prof = c.gpu[0] ? tk_gpu_profile_find(c.gpu) : NULL;
    int cuda = c.device == TK_DEVICE_CUDA || prof != NULL;
    int world = tk_config_world_size(&c);
    if ((st = check_config(&c, cuda, world, err)) != TK_OK) return st;

    sim s;
    memset(&s, 0, sizeof s);
    s.B = c.batch_size, s.H = c.hidden, s.nh = c.heads, s.I = c.intermediate;
    s.V = c.vocab_size, s.P = c.max_position, s.TV = c.type_vocab, s.L = c.layers;
    s.T = tk_plan_worst_len(&c, lengths, nlen);
    if (c.batching == TK_BATCH_FIXED)
        snprintf(out->seq_from, sizeof out->seq_from, "max_len (fixed padding)");
    else if (lengths && nlen > 0)
        snprintf(out->seq_from, sizeof out->seq_from, "the data's longest example of %d%s (batching: %s)", nlen,
                 s.T == c.max_len ? ", capped at max_len" : "", c.batching == TK_BATCH_DYNAMIC ? "dynamic" : "buckets");
    else
        snprintf(out->seq_from, sizeof out->seq_from, "max_len: batching: %s without data (give --data or train_file "
                 "to plan the longest batch)", c.batching == TK_BATCH_DYNAMIC ? "dynamic" : "buckets");
    s.labels = c.num_labels > 0 ? c.num_labels : 2;
    s.qa = c.task == TK_TASK_QA;
    s.cuda = cuda;
    s.torch1 = tk_torch_minor(c.torch_version) < 0; /* torch 1.13 and 1.10 share these rules */
    /* data with an example shorter than the batch: its batches are padded,
     * and transformers 5 then builds an attention mask (an all-ones one it
     * drops; transformers 4 adds its small mask either way) */
    for (int i = 0; i < nlen && lengths && !s.torch1; i++) s.pad_mask |= lengths[i] < s.T;
    s.mask_t = s.ckpt_mask = -1;
    s.torch110 = c.torch_version == TK_TORCH_1_10;
    s.eager = s.torch1 || c.attn_implementation == TK_ATTN_IMPL_EAGER;
    s.p_drop = c.dropout;
    s.p_attn = c.attention_dropout < 0 ? c.dropout : c.attention_dropout;
    s.bf16 = c.precision == TK_PREC_BF16;
    s.fp16 = c.precision == TK_PREC_FP16;
    s.act = s.bf16 || s.fp16 ? 2 : 4;
    s.ckpt = c.recompute == TK_RECOMPUTE_LAYERS;
    s.adam8 = c.optimizer == TK_OPTIM_ADAMW8;
    s.fused = c.optimizer == TK_OPTIM_ADAMW_FUSED;
    s.acc = c.accumulate > 0 ? c.accumulate : 1;
    s.layer = -1;
    s.world = world;
    /* DDP as the Trainer wraps it (accelerate's DistributedDataParallelKwargs):
     * find_unused_parameters unless gradient checkpointing is on; buckets of
     * bucket_cap_mb, the first one 1 MiB when bucket_cap_mb is DDP's default */
    s.find_unused = !s.ckpt;
    s.bucket_cap = (size_t)(c.bucket_cap_mb > 0 ? c.bucket_cap_mb : 25) << 20;
    s.first_bucket_cap = c.bucket_cap_mb > 0 ? s.bucket_cap : (size_t)1 << 20;
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
                                                   : "eager (transformers 4.40 runs BERT's attention eagerly only)"
                             : s.pad_mask ? "eager (with the padding mask)" : "eager";
    } else if (!cuda) {
        s.sdpa_math = s.p_attn > 0;
        out->attention = s.sdpa_math  ? s.pad_mask ? "sdpa (math: the CPU's flash kernel takes no dropout; with the padding mask)"
                                                   : "sdpa (math: the CPU's flash kernel takes no dropout)"
                         : s.pad_mask ? "sdpa (cpu flash, with the padding mask)" : "sdpa (cpu flash)";
    } else if (cc_major >= 8 && s.act == 2 && head_dim <= 256 && head_dim % 8 == 0 && !s.pad_mask) {
        out->attention = "sdpa (flash)";
    } else if (cc_major >= 5 && head_dim % 8 == 0) {
        s.sdpa_eff = 1;
        out->attention = s.pad_mask ? "sdpa (efficient: flash takes no padding mask)" : "sdpa (efficient)";
    } else {
        s.sdpa_math = 1;
        out->attention = "sdpa (math)";
    }
    out->optimizer = s.adam8                ? "AdamW8bit (bitsandbytes)"
                     : s.fused              ? "AdamW (fused)"
                     : cuda && !s.torch1  ? "AdamW (foreach)"
                     : s.torch110           ? "AdamW (transformers' own, Trainer's default in 4.15)"
                                            : "AdamW (single-tensor)";
    if (world > 1 && c.parallel == TK_PAR_ZERO2) out->optimizer = "DeepSpeed's Adam (ZeRO-2: its state partitioned)";
    out->precision = s.bf16 ? "bf16 autocast" : s.fp16 ? "fp16 autocast + GradScaler" : "fp32";
    out->device = cuda ? "cuda" : "cpu";
    out->torch_version = VERSIONS[c.torch_version].torch;
    out->transformers_version = VERSIONS[c.torch_version].transformers;
    out->batch = s.B, out->seq = s.T, out->accumulate = s.acc, out->on_cuda = cuda;
    if (prof) snprintf(out->gpu, sizeof out->gpu, "%s", prof->name);
    if (cuda) {
        tk_torch_blas_rules(c.torch_version, cc_major, prof ? prof->cc_minor : 0, &s.blas);
        /* no card named: an A100's (the sm80 the attention choice assumes too) */
        s.sms = prof ? prof->sm_count : 108;
        s.threads_per_sm = prof ? prof->threads_per_sm : 2048;
        out->workspace_bytes = s.blas.w_bytes;
        out->workspaces = s.blas.source;
    }

    /* the GPUs planned: one; each DDP rank (all alike); DataParallel's GPU 0
     * and a replica GPU (the others are alike); each ZeRO-2 GPU (alike) */
    int roles[2] = {ROLE_ONE, -1};
    out->world_size = world;
    if (world > 1) {
        out->parallel = PARALLEL[c.parallel].name;
        out->checked = PARALLEL[c.parallel].checked;
        roles[0] = c.parallel == TK_PAR_DDP ? ROLE_DDP : c.parallel == TK_PAR_ZERO2 ? ROLE_ZERO2 : ROLE_DP0;
        if (c.parallel == TK_PAR_DATAPARALLEL) roles[1] = ROLE_DP1;
    }
    out->context_bytes = tk_torchplan_context(prof);
    out->capacity = prof ? prof->capacity : c.capacity;
    gpu_figures f[2];
    int fullest = 0;
    for (int r = 0; r < 2 && roles[r] >= 0; r++) {
        if ((st = simulate(&s, roles[r], c.freeze_embeddings, &f[r], err)) != TK_OK) return st;
        if (f[r].peak_reserved > f[fullest].peak_reserved) fullest = r;
        if (world == 1) continue;
        tk_torchplan_gpu *g = &out->gpu_rows[out->n_gpu_rows++];
        if (roles[r] == ROLE_DP0) snprintf(g->who, sizeof g->who, "GPU 0");
        else if (roles[r] == ROLE_DP1 && world == 2) snprintf(g->who, sizeof g->who, "GPU 1");
        else if (roles[r] == ROLE_DP1) snprintf(g->who, sizeof g->who, "GPUs 1-%d (each)", world - 1);
        else snprintf(g->who, sizeof g->who, "each of the %d %s", world, roles[r] == ROLE_DDP ? "ranks" : "GPUs");
        g->peak_allocated = f[r].peak_allocated;
        g->first_step_peak_allocated = f[r].first_step_peak_allocated;
        g->peak_reserved = f[r].peak_reserved;
        g->device_used = g->peak_reserved + out->context_bytes + f[r].outside_bytes;
        g->n_workspaces = f[r].n_workspaces;
        g->fits = !out->capacity || g->device_used <= out->capacity;
    }
    const gpu_figures *w = &f[fullest];
    out->peak_allocated = w->peak_allocated;
    out->first_step_peak_allocated = w->first_step_peak_allocated;
    out->peak_reserved = w->peak_reserved;
    out->n_workspaces = w->n_workspaces;
    out->lt_workspace_bytes = w->lt_workspace_bytes;
    out->outside_bytes = w->outside_bytes;
    memcpy(out->by_cat_at_peak, w->by_cat_at_peak, sizeof out->by_cat_at_peak);
    out->param_bytes = w->param_bytes, out->grad_bytes = w->grad_bytes, out->optim_bytes = w->optim_bytes;
    out->n_params = f[0].n_params, out->n_trainable = f[0].n_trainable;
    out->device_used = out->peak_reserved + out->context_bytes + out->outside_bytes;
    out->fits = !out->capacity || out->device_used <= out->capacity;
    return TK_OK;
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
    if (j) json_object_set_new(j, "seq_from", json_string(r->seq_from));
    if (j) json_object_set_new(j, "world_size", json_integer(r->world_size));
    if (j && r->parallel) {
        json_t *rows = json_array();
        for (int i = 0; rows && i < r->n_gpu_rows; i++) {
            const tk_torchplan_gpu *g = &r->gpu_rows[i];
            json_array_append_new(rows, json_pack("{s:s, s:I, s:I, s:I, s:I, s:i, s:b}", "gpu", g->who, "peak_allocated",
                                                  (json_int_t)g->peak_allocated, "first_step_peak_allocated",
                                                  (json_int_t)g->first_step_peak_allocated, "peak_reserved",
                                                  (json_int_t)g->peak_reserved, "device_used", (json_int_t)g->device_used,
                                                  "n_workspaces", g->n_workspaces, "fits", g->fits));
        }
        json_object_set_new(j, "parallel", json_string(r->parallel));
        json_object_set_new(j, "checked", json_string(r->checked));
        json_object_set_new(j, "gpus", rows ? rows : json_null());
    }
    if (j && r->on_cuda) {
        json_object_set_new(j, "n_workspaces", json_integer(r->n_workspaces));
        json_object_set_new(j, "lt_workspace_bytes", json_integer((json_int_t)r->lt_workspace_bytes));
        json_object_set_new(j, "outside_bytes", json_integer((json_int_t)r->outside_bytes));
        json_object_set_new(j, "workspaces", json_string(r->workspaces ? r->workspaces : ""));
    }
    return j;
}
