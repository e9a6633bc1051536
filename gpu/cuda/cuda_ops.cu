/* cuda_ops.cu — the fused attention's kernel and launchers
 * (tk_op_attention_fwd/bwd): cuda_attention.h's phases, one block per
 * (sequence * head, tile). The other op families have a file each
 * (README.md here).
 */
#include "cuda_common.cuh"
#include "cuda_attention.h"

/* ---- fused attention (cuda_attention.h) ------------------------------------ */

/* One block per (sequence*head, tile); the phases of cuda_attention.h with a
 * barrier after each. The phase count depends only on T and the tiles, so
 * every thread reaches every barrier. */
template <int KIND> __global__ void __launch_bounds__(TK_FA_THREADS) k_attn(tk_fa_args a) {
#ifdef TK_CUDA_EMU
    float *fa_smem = tk_emu_dyn_smem; /* cuda_emu.h: the launch's buffer */
#else
    extern __shared__ float fa_smem[];
#endif
    tk_fa_smem sh;
    tk_fa_carve(&sh, fa_smem, KIND, a.HS, a.qt, a.kt);
    for (int ph = 0;; ph++) {
        int more = tk_fa_phase(KIND, &a, &sh, blockIdx.x, blockIdx.y, ph, threadIdx.x, blockDim.x);
        __syncthreads();
        if (!more) break;
    }
}

/* ---- launchers ---------------------------------------------------------------- */

extern "C" {

/* Arguments common to both directions; checks the grid fits. */
static tk_status fa_setup(tk_fa_args *a, const char *op, const tk_tensor *q, const tk_tensor *k,
                          const tk_tensor *v, const tk_tensor *mask, int64_t B, int64_t NH, int64_t T,
                          int64_t HS, float scale, float p, uint64_t seed, uint64_t offset, dim3 *gq, dim3 *gk) {
    NEED_FLOAT(op, q); NEED_FLOAT(op, k); NEED_FLOAT(op, v);
    if (mask) NEED_I32(op, mask);
    memset(a, 0, sizeof *a);
    if (!tk_fa_tiles(HS, &a->qt, &a->kt)) return bad(op, "head size too large for a block's shared memory");
    int64_t BH = B * NH, nq = (T + a->qt - 1) / a->qt, nk = (T + a->kt - 1) / a->kt;
    if (BH > INT32_MAX || nq > 65535) return bad(op, "more than 2^31 heads or 65535 query tiles");
    a->q = q->data; a->k = k->data; a->v = v->data;
    a->dtq = DT(q); a->dtk = DT(k); a->dtv = DT(v);
    a->mask = mask ? (const int32_t *)mask->data : NULL;
    a->NH = NH; a->T = T; a->HS = HS;
    a->scale = scale; a->p = p; a->keep_scale = tk_dropout_scale(p);
    a->key = tk_dropout_key(seed); a->offset = offset;
    *gq = dim3((unsigned)BH, (unsigned)nq);
    *gk = dim3((unsigned)BH, (unsigned)nk);
    return TK_OK;
}

tk_status tk_cuda_attention_fwd(void *ctx, tk_tensor *out, tk_tensor *lse, const tk_tensor *q,
                                const tk_tensor *k, const tk_tensor *v, const tk_tensor *mask,
                                int64_t B, int64_t NH, int64_t T, int64_t HS, float scale, float p,
                                uint64_t seed, uint64_t offset) {
    (void)ctx;
    if (B * NH == 0 || T == 0 || HS == 0) return TK_OK;
    NEED_FLOAT("attention_fwd", out);
    if (lse->dtype != TK_F32) return bad("attention_fwd", "lse must be f32");
    tk_fa_args a;
    dim3 gq, gk;
    tk_status st = fa_setup(&a, "attention_fwd", q, k, v, mask, B, NH, T, HS, scale, p, seed, offset, &gq, &gk);
    if (st != TK_OK) return st;
    a.out = out->data; a.dt_out = DT(out);
    a.lse_out = (float *)lse->data;
    TK_LAUNCH(k_attn<TK_FA_FWD>, gq, TK_FA_THREADS, tk_fa_smem_bytes(TK_FA_FWD, HS, a.qt, a.kt))(a);
    TK_CU_LAUNCHED("k_attn_fwd");
    return TK_OK;
}

tk_status tk_cuda_attention_bwd(void *ctx, tk_tensor *dq, tk_tensor *dk, tk_tensor *dv,
                                const tk_tensor *dout, const tk_tensor *q, const tk_tensor *k,
                                const tk_tensor *v, const tk_tensor *out, const tk_tensor *lse,
                                const tk_tensor *mask, int64_t B, int64_t NH, int64_t T, int64_t HS,
                                float scale, float p, uint64_t seed, uint64_t offset) {
    (void)ctx;
    if (B * NH == 0 || T == 0 || HS == 0) return TK_OK;
    NEED_FLOAT("attention_bwd", dq); NEED_FLOAT("attention_bwd", dk); NEED_FLOAT("attention_bwd", dv);
    NEED_FLOAT("attention_bwd", dout); NEED_FLOAT("attention_bwd", out);
    if (lse->dtype != TK_F32) return bad("attention_bwd", "lse must be f32");
    tk_fa_args a;
    dim3 gq, gk;
    tk_status st = fa_setup(&a, "attention_bwd", q, k, v, mask, B, NH, T, HS, scale, p, seed, offset, &gq, &gk);
    if (st != TK_OK) return st;
    a.o = out->data; a.dto = DT(out);
    a.dout = dout->data; a.dtg = DT(dout);
    a.lse_in = (const float *)lse->data;
    a.dq = dq->data; a.dt_dq = DT(dq);
    a.dk = dk->data; a.dt_dk = DT(dk);
    a.dv = dv->data; a.dt_dv = DT(dv);
    TK_LAUNCH(k_attn<TK_FA_BWD_KV>, gk, TK_FA_THREADS, tk_fa_smem_bytes(TK_FA_BWD_KV, HS, a.qt, a.kt))(a);
    TK_CU_LAUNCHED("k_attn_bwd_kv");
    TK_LAUNCH(k_attn<TK_FA_BWD_Q>, gq, TK_FA_THREADS, tk_fa_smem_bytes(TK_FA_BWD_Q, HS, a.qt, a.kt))(a);
    TK_CU_LAUNCHED("k_attn_bwd_q");
    return TK_OK;
}

} /* extern "C" */
