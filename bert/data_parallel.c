/* data_parallel.c — data parallelism for the one training step (step.c):
 * which piece of each parameter a rank owns, the backward-stage hooks, and
 * the reductions around the optimizer, for ZeRO 0, 1 and 2.
 *
 *  ZeRO 0: every rank holds all gradients and all AdamW state; after the
 *          micro-batches each gradient is all-reduced.
 *  ZeRO 1: each gradient is reduce-scattered (this rank's piece holds the
 *          sum), AdamW updates and keeps state for the piece only, and the
 *          parameters are all-gathered after the update.
 *  ZeRO 2: as 1, and the model holds no gradients between stages: each
 *          backward stage's gradients are allocated before it, reduce-
 *          scattered after it into this rank's persistent pieces, and freed,
 *          so a rank keeps 1/N of the gradients plus one stage's.
 *
 * Guarantees: a rank's micro-batches after its first write fresh (zeroed)
 * gradients that are then added to the earlier ones, stage by stage, the way
 * a reduction adds two ranks' gradients, so world_size 2 equals world_size
 * 1 with accumulate 2 bit for bit (two-term sums commute exactly). Pieces
 * are whole TK_DP_CHUNKs in rank order; a parameter's chunks that do not
 * split evenly go to the first ranks or the last, whichever hold fewer
 * elements so far, so the ranks' shares stay within a chunk or so. Every scratch buffer goes
 * through the device's allocator (the planner sees it); tk_dp_abandon puts
 * the model back after a failure.
 */
#include <stdlib.h>
#include <string.h>

#include "tk_data_parallel.h"
#include "tk_host_mem.h"

typedef struct dp_param {
    int64_t lo, hi;          /* this rank's piece */
    int64_t *counts;         /* every rank's piece size (world entries) */
    tk_tensor piece;         /* ZeRO 2: the summed gradient of [lo, hi) */
    tk_tensor saved;         /* the model's gradient while a stage writes a scratch one */
    int swapped;             /* 1: saved holds the model's gradient */
} dp_param;

struct tk_dp {
    int np;
    dp_param *p;
    int64_t *counts;         /* np x world */
};

int tk_dp_sharded(const tk_trainer *t) { return t->dp && t->zero >= 1; }

const int64_t *tk_dp_piece(const tk_trainer *t, int i, int64_t *lo, int64_t *hi) {
    *lo = *hi = 0;
    if (!tk_dp_sharded(t)) return NULL;
    *lo = t->dp->p[i].lo;
    *hi = t->dp->p[i].hi;
    return t->dp->p[i].counts;
}

/* Where rank r's chunks start, of nc over w ranks: rounded down (the
 * remainder to the last ranks) or up (to the first), in rank order. */
static int64_t split(int64_t nc, int w, int r, int up) {
    return up ? (nc * r + w - 1) / w : nc * r / w;
}

static void layout(tk_trainer *t) {
    struct tk_dp *dp = t->dp;
    int64_t first = 0, last = 0; /* elements given so far to the first and the last rank */
    for (int i = 0; i < dp->np; i++) {
        const tk_param *mp = tk_model_param(t->m, i);
        dp_param *p = &dp->p[i];
        p->counts = dp->counts + (size_t)i * t->world;
        int64_t n = mp->frozen ? 0 : tk_tensor_numel(mp->w);
        int64_t nc = (n + TK_DP_CHUNK - 1) / TK_DP_CHUNK;
        /* a remainder of chunks goes to the first ranks while they hold no
         * more than the last, else to the last ones */
        int up = first <= last;
        for (int r = 0; r < t->world; r++) {
            int64_t a = split(nc, t->world, r, up) * TK_DP_CHUNK, b = split(nc, t->world, r + 1, up) * TK_DP_CHUNK;
            if (a > n) a = n;
            if (b > n) b = n;
            p->counts[r] = b - a;
            if (r == t->rank) {
                p->lo = a;
                p->hi = b;
            }
        }
        first += p->counts[0];
        last += p->counts[t->world - 1];
    }
}

static tk_status alloc_pieces(tk_trainer *t, tk_err *err) {
    tk_dev *d = tk_model_dev(t->m);
    for (int i = 0; i < t->dp->np; i++) {
        const tk_param *mp = tk_model_param(t->m, i);
        dp_param *p = &t->dp->p[i];
        int64_t n = p->hi - p->lo;
        if (mp->frozen || n == 0) continue;
        tk_status st = tk_tensor_alloc(d, &p->piece, TK_F32, 1, &n, TK_CAT_GRAD, mp->owner, err);
        if (st != TK_OK) return st;
    }
    return TK_OK;
}

/* ---- the stage hooks ------------------------------------------------------ */

/* A zeroed gradient for parameter i in the model's slot, the model's own
 * (if any) kept aside. */
static tk_status scratch(tk_trainer *t, int i, tk_err *err) {
    tk_param *mp = (tk_param *)tk_model_param(t->m, i);
    dp_param *p = &t->dp->p[i];
    tk_dev *d = tk_model_dev(t->m);
    p->saved = *mp->g;
    p->swapped = 1;
    memset(mp->g, 0, sizeof *mp->g);
    tk_status st = tk_tensor_alloc(d, mp->g, TK_F32, mp->w->ndim, mp->w->shape, TK_CAT_GRAD, mp->owner, err);
    if (st == TK_OK) st = tk_op_fill(d, mp->g, 0.0f, tk_tensor_numel(mp->g));
    return st;
}

static void unswap(tk_trainer *t, int i) {
    tk_param *mp = (tk_param *)tk_model_param(t->m, i);
    dp_param *p = &t->dp->p[i];
    if (!p->swapped) return;
    tk_tensor_free(tk_model_dev(t->m), mp->g);
    *mp->g = p->saved;
    memset(&p->saved, 0, sizeof p->saved);
    p->swapped = 0;
}

static tk_status stage_before(void *ud, int p0, int p1, tk_err *err) {
    tk_trainer *t = ud;
    for (int i = p0; i < p1; i++) {
        if (tk_model_param(t->m, i)->frozen) continue;
        tk_status st = scratch(t, i, err);
        if (st != TK_OK) return st;
    }
    return TK_OK;
}

/* After a stage: its fresh gradients added to the earlier ones (ZeRO 0/1,
 * a rank's later micro-batch), or (ZeRO 2, `reduce`) reduce-scattered and
 * this rank's piece added to its sum; the scratch freed either way. */
static tk_status stage_take(tk_trainer *t, int p0, int p1, int reduce, tk_err *err) {
    tk_dev *d = tk_model_dev(t->m);
    for (int i = p0; i < p1; i++) {
        const tk_param *mp = tk_model_param(t->m, i);
        dp_param *p = &t->dp->p[i];
        if (mp->frozen || !p->swapped) continue;
        tk_status st = TK_OK;
        if (!reduce) {
            st = tk_op_add(d, &p->saved, &p->saved, mp->g, tk_tensor_numel(mp->g));
        } else if ((st = tk_coll_reduce_scatter(t->coll, mp->g->data, p->counts, err)) == TK_OK && p->hi > p->lo) {
            tk_tensor v = tk_tensor_view(mp->g, p->lo, p->hi - p->lo);
            st = tk_op_add(d, &p->piece, &p->piece, &v, p->hi - p->lo);
        }
        unswap(t, i);
        if (st != TK_OK) {
            if (err && !err->msg[0])
                tk_err_set(err, st, "%s the gradient of %s failed (%s)", reduce ? "reducing" : "accumulating",
                           mp->name, tk_status_name(st));
            return st;
        }
    }
    return TK_OK;
}
static tk_status stage_add(void *ud, int p0, int p1, tk_err *err) { return stage_take(ud, p0, p1, 0, err); }
static tk_status stage_reduce(void *ud, int p0, int p1, tk_err *err) { return stage_take(ud, p0, p1, 1, err); }

/* ---- open, close, the step's parts --------------------------------------- */

tk_status tk_dp_open(tk_trainer *t, int rank, tk_err *err) {
    const tk_config *c = t->c;
    t->world = tk_config_world_size(c);
    t->zero = c->zero;
    if (!(t->coll = tk_coll_open(tk_model_dev(t->m), t->world, rank, err)))
        return err->status ? err->status : TK_EINVAL;
    t->rank = tk_coll_rank(t->coll);
    int np = tk_model_n_params(t->m);
    struct tk_dp *dp = t->dp = tk_calloc(1, sizeof *dp);
    if (!dp || !(dp->p = tk_calloc(np > 0 ? (size_t)np : 1, sizeof *dp->p)) ||
        !(dp->counts = tk_calloc((size_t)(np > 0 ? np : 1) * (size_t)t->world, sizeof *dp->counts)))
        return tk_err_nomem(err, "the data-parallel layout");
    dp->np = np;
    layout(t);
    if (t->zero < 2) return TK_OK;
    tk_grad_hooks h = { stage_before, stage_reduce, t };
    tk_model_set_grad_hooks(t->m, &h, 1);
    return alloc_pieces(t, err);
}

void tk_dp_fill_params(const tk_trainer *t, tk_optim_param *ps, int n) {
    if (!tk_dp_sharded(t)) return;
    for (int i = 0; i < n && i < t->dp->np; i++) {
        const dp_param *p = &t->dp->p[i];
        ps[i].piece = 1;
        ps[i].lo = p->lo;
        ps[i].hi = p->hi;
        if (t->zero >= 2) {
            ps[i].grad = (tk_tensor *)&p->piece;
            ps[i].grad_is_piece = 1;
        }
    }
}

void tk_dp_close(tk_trainer *t) {
    struct tk_dp *dp = t->dp;
    if (dp) {
        tk_dp_abandon(t);
        for (int i = 0; i < dp->np && dp->p; i++) tk_tensor_free(tk_model_dev(t->m), &dp->p[i].piece);
        free(dp->p);
        free(dp->counts);
        free(dp);
        t->dp = NULL;
    }
    if (t->m) tk_model_set_grad_hooks(t->m, NULL, 0);
    tk_coll_close(&t->coll);
}

tk_status tk_dp_begin(tk_trainer *t, tk_err *err) {
    if (t->zero < 2) return TK_OK;
    tk_dev *d = tk_model_dev(t->m);
    for (int i = 0; i < t->dp->np; i++) {
        tk_tensor *pc = &t->dp->p[i].piece;
        if (!pc->data) continue;
        tk_status st = tk_op_fill(d, pc, 0.0f, tk_tensor_numel(pc));
        if (st != TK_OK) {
            tk_err_set(err, st, "zeroing a gradient piece failed (%s)", tk_status_name(st));
            return st;
        }
    }
    return TK_OK;
}

void tk_dp_micro(tk_trainer *t, int nth) {
    if (t->zero >= 2) return; /* its hooks stay installed */
    tk_grad_hooks h = { stage_before, stage_add, t };
    tk_model_set_grad_hooks(t->m, nth > 0 ? &h : NULL, 0);
}

tk_status tk_dp_reduce(tk_trainer *t, tk_err *err) {
    if (t->world == 1 || t->zero >= 2) return TK_OK;
    for (int i = 0; i < t->dp->np; i++) {
        const tk_param *mp = tk_model_param(t->m, i);
        if (mp->frozen || !mp->g->data) continue;
        tk_status st = t->zero == 0 ? tk_coll_all_reduce(t->coll, mp->g->data, tk_tensor_numel(mp->g), err)
                                    : tk_coll_reduce_scatter(t->coll, mp->g->data, t->dp->p[i].counts, err);
        if (st != TK_OK) return st;
    }
    return TK_OK;
}

tk_status tk_dp_gather(tk_trainer *t, tk_err *err) {
    if (!tk_dp_sharded(t)) return TK_OK;
    for (int i = 0; i < t->dp->np; i++) {
        const tk_param *mp = tk_model_param(t->m, i);
        if (mp->frozen) continue;
        tk_status st = tk_coll_all_gather(t->coll, mp->w->data, t->dp->p[i].counts, err);
        if (st != TK_OK) return st;
    }
    return TK_OK;
}

void tk_dp_abandon(tk_trainer *t) {
    if (!t->dp) return;
    for (int i = 0; i < t->dp->np; i++) unswap(t, i);
    tk_dp_micro(t, 0);
}

/* ---- the consolidated state for checkpoints ----------------------------- */

void tk_dp_free_state(const tk_trainer *t, void **bufs) {
    if (!bufs) return;
    for (int i = 0; i < 4 * tk_adamw_n_slots(t->opt); i++) free(bufs[i]);
    free(bufs);
}

tk_status tk_dp_gather_state(tk_trainer *t, void ***out, tk_err *err) {
    *out = NULL;
    if (!tk_dp_sharded(t) || !tk_adamw_has_state(t->opt)) return TK_OK;
    tk_dev *d = tk_model_dev(t->m);
    int n = tk_adamw_n_slots(t->opt);
    void **bufs = tk_calloc(4 * (size_t)(n > 0 ? n : 1), sizeof *bufs);
    int64_t *bytes = tk_calloc((size_t)t->world, sizeof *bytes);
    tk_status st = bufs && bytes ? TK_OK : tk_err_nomem(err, "the checkpoint's optimizer state");
    for (int i = 0; i < n && st == TK_OK; i++) {
        tk_adamw_state_view v;
        tk_adamw_state_at(t->opt, i, &v);
        tk_tensor *mine[4] = { v.m, v.v, v.mscale, v.vscale };
        for (int j = 0; j < 4 && st == TK_OK; j++) {
            tk_adamw_moment mo;
            tk_adamw_moment_layout(&v, j, &mo);
            if (!mo.present) continue;
            size_t es = tk_dtype_size(mo.dtype);
            if (!(bufs[4 * i + j] = tk_calloc((size_t)(mo.numel > 0 ? mo.numel : 1), es))) {
                st = tk_err_nomem(err, "the checkpoint's optimizer state");
                break;
            }
            char *whole = bufs[4 * i + j];
            if (mo.count > 0 && tk_dev_kind_of(d) != TK_DEV_META)
                st = tk_tensor_read(d, mine[j], whole + (size_t)mo.off * es, err);
            /* every rank's part of this moment, in bytes, in rank order */
            tk_adamw_state_view pv = v;
            for (int r = 0; r < t->world && st == TK_OK; r++) {
                const dp_param *p = &t->dp->p[i];
                int64_t lo = 0;
                for (int q = 0; q < r; q++) lo += p->counts[q];
                pv.lo = lo;
                pv.n = p->counts[r];
                tk_adamw_moment pm;
                tk_adamw_moment_layout(&pv, j, &pm);
                bytes[r] = pm.count * (int64_t)es;
            }
            if (st == TK_OK) st = tk_coll_all_gather_bytes(t->coll, whole, bytes, err);
        }
    }
    free(bytes);
    if (st != TK_OK) {
        tk_dp_free_state(t, bufs);
        return st;
    }
    *out = bufs;
    return TK_OK;
}
