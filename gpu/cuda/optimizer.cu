/* optimizer.cu — the optimizer step's kernels: sums of squares (the
 * gradient norm for clipping), AdamW and 8-bit AdamW.
 *
 * The update itself is tk_ops_spec.h's tk_adamw_update, the cpu backend's
 * too, so both give the same bits (f32 parameters and moments; no FMA).
 * Reference kernels: one parameter per launch (k_sumsq_partial/_final,
 * k_adamw). Parameter tables: every gradient's sum of squares, and every
 * f32 parameter's update, in one launch each (TK_TABLE_MAX tensors per
 * launch: a kernel parameter, no device table to keep in step).
 *  - k_sumsq_table: a fixed grid of TK_CUDA_RED_BLOCKS blocks takes the
 *    tables' tiles round robin, each block's f64 sum goes to the plugin's
 *    reduction scratch, and k_sumsq_final adds the blocks in order: the
 *    same bits for the same tensor sizes on every run.
 *  - k_adamw_table: a block per tile of 1024 elements of one parameter.
 * 8-bit AdamW keeps a launch per parameter: a block per quantisation block.
 */
#include "cuda_common.cuh"

static_assert(TK_Q8_BLOCK == THREADS, "k_adamw8 runs one thread per element of a block");

/* ---- sums of squares ---------------------------------------------------------- */

__global__ void k_sumsq_partial(double *red, const void *x, int dtx, int64_t n) {
    __shared__ double sh[THREADS / 32];
    double s = 0.0;
    GRID_STRIDE(i, n) {
        double v = (double)ld(x, dtx, i);
        s += v * v;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) red[blockIdx.x] = s;
}

__global__ void k_sumsq_final(float *out, const double *red, int nblocks, int accumulate) {
    __shared__ double sh[THREADS / 32];
    double s = 0.0;
    for (int i = threadIdx.x; i < nblocks; i += THREADS) s += red[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = (float)(accumulate ? (double)out[0] + s : s);
}

/* ---- AdamW ---------------------------------------------------------------------- */

__global__ void k_adamw(float *param, const void *grad, int dtg, float *m, float *v, int64_t n,
                        tk_adamw_coef k) {
    GRID_STRIDE(i, n) {
        float g = ld(grad, dtg, i) * k.grad_scale;
        float p = param[i], mi = m[i], vi = v[i];
        tk_adamw_update(&p, &mi, &vi, g, &k);
        param[i] = p;
        m[i] = mi;
        v[i] = vi;
    }
}

/* One block per quantisation block of TK_Q8_BLOCK elements (== THREADS). */
__global__ void k_adamw8(float *param, const void *grad, int dtg, int8_t *mq, float *mscale,
                         uint8_t *vq, float *vscale, int64_t n, tk_adamw_coef k) {
    __shared__ float sh[THREADS / 32];
    int64_t blk = blockIdx.x;
    int64_t i = blk * TK_Q8_BLOCK + threadIdx.x;
    int live = i < n;
    float p = 0.0f, mi = 0.0f, vi = 0.0f;
    if (live) {
        float g = ld(grad, dtg, i) * k.grad_scale;
        p = param[i];
        mi = tk_q8_decode_m(mq[i], mscale[blk]);
        vi = tk_q8_decode_v(vq[i], vscale[blk]);
        tk_adamw_update(&p, &mi, &vi, g, &k);
        param[i] = p;
    }
    /* New absmax scales over the block, then re-quantise against them. */
    float am = block_max(live ? fabsf(mi) : 0.0f, sh);
    float av = block_max(live ? vi : 0.0f, sh);
    if (live) {
        mq[i] = tk_q8_encode_m(mi, am);
        vq[i] = tk_q8_encode_v(vi, av);
    }
    if (threadIdx.x == 0) {
        mscale[blk] = am;
        vscale[blk] = av;
    }
}

/* ---- parameter tables --------------------------------------------------------- */

#define OPT_TILE (THREADS * 4)

/* Entry i owns tiles [first[i], first[i+1]) of OPT_TILE elements. */
typedef struct sumsq_table {
    int n;
    int64_t first[TK_TABLE_MAX + 1];
    const void *x[TK_TABLE_MAX];
    int64_t numel[TK_TABLE_MAX];
    int dt[TK_TABLE_MAX];
} sumsq_table;

/* red[b] (+)= the f64 sum of squares of tiles b, b + gridDim.x, ... */
__global__ void k_sumsq_table(double *red, TK_TABLE_PARAM(sumsq_table, t), int accumulate) {
    __shared__ double sh[THREADS / 32];
    double s = 0.0;
    for (int64_t tile = blockIdx.x; tile < t.first[t.n]; tile += gridDim.x) {
        int i = table_find(t.first, t.n, tile);
        int64_t e0 = (tile - t.first[i]) * OPT_TILE;
        for (int64_t e = e0 + threadIdx.x; e < e0 + OPT_TILE && e < t.numel[i]; e += THREADS) {
            double v = (double)ld(t.x[i], t.dt[i], e);
            s += v * v;
        }
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) red[blockIdx.x] = accumulate ? red[blockIdx.x] + s : s;
}

typedef struct adamw_table {
    int n;
    int64_t first[TK_TABLE_MAX + 1];
    float *p[TK_TABLE_MAX], *m[TK_TABLE_MAX], *v[TK_TABLE_MAX];
    const void *g[TK_TABLE_MAX];
    int64_t numel[TK_TABLE_MAX];
    float decay[TK_TABLE_MAX];   /* 1 - lr * weight decay, as tk_adamw_coef_of computes it */
    int gdt[TK_TABLE_MAX];
} adamw_table;

/* tk_adamw_update per element, each entry with its own weight decay. */
__global__ void k_adamw_table(TK_TABLE_PARAM(adamw_table, t), tk_adamw_coef k) {
    int i = table_find(t.first, t.n, blockIdx.x);
    int64_t e0 = (blockIdx.x - t.first[i]) * OPT_TILE;
    tk_adamw_coef ki = k;
    ki.decay = t.decay[i];
    float *p = t.p[i], *m = t.m[i], *v = t.v[i];
    for (int64_t e = e0 + threadIdx.x; e < e0 + OPT_TILE && e < t.numel[i]; e += THREADS) {
        float g = ld(t.g[i], t.gdt[i], e) * ki.grad_scale;
        float pe = p[e], me = m[e], ve = v[e];
        tk_adamw_update(&pe, &me, &ve, g, &ki);
        p[e] = pe;
        m[e] = me;
        v[e] = ve;
    }
}

/* ---- launchers ------------------------------------------------------------------ */

extern "C" {

tk_status tk_cuda_sumsq(void *ctx, tk_tensor *out, const tk_tensor *x, int64_t n, int accumulate) {
    NEED_FLOAT("sumsq", x);
    if (out->dtype != TK_F32) return bad("sumsq", "out must be f32");
    unsigned nb = grid_for(n);
    if (nb > TK_CUDA_RED_BLOCKS) nb = TK_CUDA_RED_BLOCKS;
    if (n > 0) {
        TK_LAUNCH(k_sumsq_partial, nb, THREADS)(CTX->red, x->data, DT(x), n);
        TK_CU_LAUNCHED("k_sumsq_partial");
    } else {
        nb = 0;
    }
    TK_LAUNCH(k_sumsq_final, 1, THREADS)((float *)out->data, CTX->red, (int)nb, accumulate);
    TK_CU_LAUNCHED("k_sumsq_final");
    return TK_OK;
}

tk_status tk_cuda_adamw(void *ctx, tk_tensor *param, const tk_tensor *grad, tk_tensor *m, tk_tensor *v,
                        int64_t n, const tk_adamw_hp *hp) {
    NEED_FLOAT("adamw", grad);
    if (param->dtype != TK_F32 || m->dtype != TK_F32 || v->dtype != TK_F32)
        return bad("adamw", "param, m and v must be f32");
    if (n == 0) return TK_OK;
    tk_adamw_coef k = tk_adamw_coef_of(hp);
    TK_LAUNCH(k_adamw, grid_for(n), THREADS)((float *)param->data, grad->data, DT(grad), (float *)m->data,
                                      (float *)v->data, n, k);
    TK_CU_LAUNCHED("k_adamw");
    return TK_OK;
}

tk_status tk_cuda_adamw8(void *ctx, tk_tensor *param, const tk_tensor *grad,
                         tk_tensor *m, tk_tensor *mscale, tk_tensor *v, tk_tensor *vscale,
                         int64_t n, const tk_adamw_hp *hp) {
    NEED_FLOAT("adamw8", grad);
    if (param->dtype != TK_F32 || m->dtype != TK_I8 || v->dtype != TK_U8 || mscale->dtype != TK_F32 ||
        vscale->dtype != TK_F32)
        return bad("adamw8", "param f32, m i8, v u8, mscale and vscale f32 expected");
    if (n == 0) return TK_OK;
    int64_t nblk = (n + TK_Q8_BLOCK - 1) / TK_Q8_BLOCK;
    if (nblk > INT32_MAX) return bad("adamw8", "too many quantisation blocks");
    tk_adamw_coef k = tk_adamw_coef_of(hp);
    TK_LAUNCH(k_adamw8, (unsigned)nblk, TK_Q8_BLOCK)((float *)param->data, grad->data, DT(grad),
                                              (int8_t *)m->data, (float *)mscale->data,
                                              (uint8_t *)v->data, (float *)vscale->data, n, k);
    TK_CU_LAUNCHED("k_adamw8");
    return TK_OK;
}

tk_status tk_cuda_sumsq_many(void *ctx, tk_tensor *out, const tk_tensor *const *xs, int n) {
    if (out->dtype != TK_F32) return bad("sumsq_many", "out must be f32");
    sumsq_table *t = (sumsq_table *)malloc(sizeof *t);
    if (!t) return TK_ENOMEM;
    int launched = 0;
    for (int i0 = 0; i0 < n; i0 += TK_TABLE_MAX) {
        memset(t, 0, sizeof *t);
        for (int i = i0; i < n && i < i0 + TK_TABLE_MAX; i++) {
            int64_t e = tensor_numel(xs[i]);
            if (e == 0) continue;
            if (!is_float(xs[i]->dtype)) {
                free(t);
                return bad("sumsq_many", "every tensor must be f32, f16 or bf16");
            }
            t->x[t->n] = xs[i]->data;
            t->numel[t->n] = e;
            t->dt[t->n] = DT(xs[i]);
            t->first[t->n + 1] = t->first[t->n] + (e + OPT_TILE - 1) / OPT_TILE;
            t->n++;
        }
        if (t->n == 0) continue;
        TK_LAUNCH(k_sumsq_table, TK_CUDA_RED_BLOCKS, THREADS)(CTX->red, *t, launched);
        tk_status ls = LAUNCH_STATUS("k_sumsq_table");
        if (ls != TK_OK) {
            free(t);
            return ls;
        }
        launched = 1;
    }
    free(t);
    TK_LAUNCH(k_sumsq_final, 1, THREADS)((float *)out->data, CTX->red, launched ? TK_CUDA_RED_BLOCKS : 0, 0);
    TK_CU_LAUNCHED("k_sumsq_final");
    return TK_OK;
}

tk_status tk_cuda_adamw_many(void *ctx, const tk_adamw_item *items, int n_items, const tk_adamw_hp *hp) {
    if (!FAST()) return tk_adamw_many_each(ctx, tk_cuda_adamw, items, n_items, hp);
    tk_adamw_coef k = tk_adamw_coef_of(hp);
    adamw_table *t = (adamw_table *)malloc(sizeof *t);
    if (!t) return TK_ENOMEM;
    for (int i0 = 0; i0 < n_items; i0 += TK_TABLE_MAX) {
        memset(t, 0, sizeof *t);
        for (int i = i0; i < n_items && i < i0 + TK_TABLE_MAX; i++) {
            const tk_adamw_item *it = &items[i];
            if (it->n == 0) continue;
            if (!is_float(it->grad.dtype) || it->param.dtype != TK_F32 || it->m.dtype != TK_F32 ||
                it->v.dtype != TK_F32) {
                free(t);
                return bad("adamw_many", "param, m and v must be f32, grad a float dtype");
            }
            t->p[t->n] = (float *)it->param.data;
            t->m[t->n] = (float *)it->m.data;
            t->v[t->n] = (float *)it->v.data;
            t->g[t->n] = it->grad.data;
            t->gdt[t->n] = (int)it->grad.dtype;
            t->numel[t->n] = it->n;
            tk_adamw_hp h = *hp;
            if (it->no_decay) h.weight_decay = 0.0f;
            t->decay[t->n] = tk_adamw_coef_of(&h).decay;
            t->first[t->n + 1] = t->first[t->n] + (it->n + OPT_TILE - 1) / OPT_TILE;
            t->n++;
        }
        if (t->n == 0) continue;
        if (t->first[t->n] > INT32_MAX) {
            free(t);
            return bad("adamw_many", "more than 2^31 blocks");
        }
        TK_LAUNCH(k_adamw_table, (unsigned)t->first[t->n], THREADS)(*t, k);
        tk_status ls = LAUNCH_STATUS("k_adamw_table");
        if (ls != TK_OK) {
            free(t);
            return ls;
        }
    }
    free(t);
    return TK_OK;
}

} /* extern "C" */
