/* cuda_attention.h — the cuda backend's reference fused (memory-efficient)
 * attention, written once for the GPU kernels and for a host emulation of
 * them. It runs wherever attention.cu's tensor-core kernels do not (f32, a
 * head size they do not cover, a card below sm75, TXK_ATTN_KERNEL=reference:
 * gpu/tk_attn_kernel.h) and is what those are checked against on a card.
 *
 * What it does: tk_op_attention_fwd/bwd (tk_gpu.h) by query and key tiles
 * that live in a thread block's shared memory. No (T,T) matrix exists at any
 * time: a block holds at most a (qt x kt) tile of scores.
 *
 *   forward   one block per (sequence*head, tile of qt query rows); pass 1
 *             walks the key tiles for each row's running max and sum (the
 *             log-sum-exp, written to lse), pass 2 walks them again and
 *             accumulates out += P V with P = exp(score - lse) * dropout.
 *   dK, dV    one block per (sequence*head, tile of kt keys), walking the
 *             query tiles: dV += (P*M)^T dO, dK += dS^T Q.
 *   dQ        one block per (sequence*head, tile of qt query rows), walking
 *             the key tiles: dQ += dS K.
 *   with dS = scale * P * (dP*M - D), dP = dO V^T, D_i = dO_i . O_i and M
 *   the dropout keep factor — the recurrence of the cpu backend
 *   (gpu/cpu_attention.c). Splitting dQ from dK/dV costs the scores twice
 *   but needs no atomics: every output element has one owner thread, so a
 *   run repeats bit for bit.
 *
 * How it is shared: a block's work is a sequence of phases separated by
 * barriers. tk_fa_*_phase(args, smem, block, phase, tid, nthreads) runs one
 * thread's share of one phase and says whether another phase follows; within
 * a phase no thread reads what another writes (the one exception, the
 * "some key kept" flag, is only ever set to 1). The kernel in attention.cu
 * runs phase after phase with __syncthreads() between; the host test
 * (tests/gpu_cuda_host/test_cuda_attention.c) runs every thread of a phase
 * in turn, block after block, and compares the result with the cpu backend
 * — so the tiling, masking, dropout indexing and edge tiles are checked on a
 * machine without a GPU; the GPU suite checks the device build.
 *
 * Numbers: masked keys score -inf (probability 0); a sequence with no kept
 * key scores 0 everywhere (uniform), as tk_op_softmax_fwd's -FLT_MAX bias
 * and the cpu backend give. Dropout keeps (b, h, i, j) iff tk_dropout_keep
 * at offset + ((b*NH + h)*T + i)*T + j. Inputs of any float dtype are read
 * to f32, outputs rounded once.
 *
 * Shared memory (floats): tk_fa_smem_floats(). Key and value rows are kept
 * with a stride of HS+1 so that threads reading one column of consecutive
 * rows hit distinct banks. The host picks the tile sizes (tk_fa_tiles) so
 * that a block fits in 48 KiB, the limit every supported GPU gives without
 * opting in.
 */
#ifndef TK_CUDA_ATTENTION_H
#define TK_CUDA_ATTENTION_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"
#include "tk_ops_spec.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define TK_FA static __host__ __device__ __forceinline__
#else
#define TK_FA static inline
#endif

#define TK_FA_THREADS 128
#define TK_FA_SMEM_LIMIT (48 * 1024)

typedef struct tk_fa_args {
    /* inputs (q, k, v always; o, dout and lse in backward) */
    const void *q, *k, *v, *o, *dout;
    int dtq, dtk, dtv, dto, dtg;
    const float *lse_in;
    const int32_t *mask; /* [B, T] or NULL */
    /* outputs: out and lse in forward; dq, dk, dv in backward */
    void *out, *dq, *dk, *dv;
    int dt_out, dt_dq, dt_dk, dt_dv;
    float *lse_out;
    int64_t NH, T, HS;
    int64_t ld;  /* row stride of q, k, v, dq, dk, dv (tk_attn's) */
    int64_t ldo; /* row stride of out, dout: NH*HS */
    int qt, kt; /* tile sizes: query rows, keys */
    float scale, p, keep_scale;
    uint64_t key, offset;
} tk_fa_args;

TK_FA float tk_fa_ld(const void *p, int dt, int64_t i) {
#ifdef __CUDACC__
    switch (dt) {
    case TK_F16: return __half2float(((const __half *)p)[i]);
    case TK_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
#else
    switch (dt) {
    case TK_F16: return tk_f16_to_f32(((const uint16_t *)p)[i]);
    case TK_BF16: return tk_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
#endif
}

TK_FA void tk_fa_st(void *p, int dt, int64_t i, float v) {
#ifdef __CUDACC__
    switch (dt) {
    case TK_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case TK_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v; break;
    }
#else
    switch (dt) {
    case TK_F16: ((uint16_t *)p)[i] = tk_f32_to_f16(v); break;
    case TK_BF16: ((uint16_t *)p)[i] = tk_f32_to_bf16(v); break;
    default: ((float *)p)[i] = v; break;
    }
#endif
}

/* ---- shared memory layout ------------------------------------------------ */

/* Pieces of a block's shared memory; unused ones have 0 floats. */
typedef struct tk_fa_smem {
    float *q;   /* qt x HS   query rows (forward, dQ) or query tile (dK/dV) */
    float *g;   /* qt x HS   dout rows (backward) */
    float *k;   /* kt x HS+1 keys */
    float *v;   /* kt x HS+1 values (all but pass 1 of forward) */
    float *s;   /* qt x kt   scores / probabilities (P*M in dK/dV) */
    float *ds;  /* qt x kt   dS (backward) */
    float *acc; /* forward out, dQ: qt x HS; dK/dV: 2 x kt x (HS+1) */
    float *m, *l, *lse, *dd; /* qt each: running max, running sum, lse, D */
    float *flag; /* 1: set to 1 when some key of the sequence is kept */
} tk_fa_smem;

enum { TK_FA_FWD = 0, TK_FA_BWD_KV = 1, TK_FA_BWD_Q = 2 };

/* Carves `base` (NULL: only counts) into the pieces `kind` uses; returns the
 * float count. */
TK_FA size_t tk_fa_carve(tk_fa_smem *sh, float *base, int kind, int64_t HS, int qt, int kt) {
    size_t n = 0;
    const size_t qh = (size_t)qt * (size_t)HS, kh = (size_t)kt * (size_t)(HS + 1), qk = (size_t)qt * kt;
#define TK_FA_TAKE(field, count) do { sh->field = base ? base + n : NULL; n += (count); } while (0)
    TK_FA_TAKE(q, qh);
    TK_FA_TAKE(g, kind == TK_FA_FWD ? 0 : qh);
    TK_FA_TAKE(k, kh);
    TK_FA_TAKE(v, kh);
    TK_FA_TAKE(s, qk);
    TK_FA_TAKE(ds, kind == TK_FA_FWD ? 0 : qk);
    TK_FA_TAKE(acc, kind == TK_FA_BWD_KV ? 2 * kh : qh);
    TK_FA_TAKE(m, (size_t)qt);
    TK_FA_TAKE(l, (size_t)qt);
    TK_FA_TAKE(lse, (size_t)qt);
    TK_FA_TAKE(dd, (size_t)qt);
    TK_FA_TAKE(flag, 1);
#undef TK_FA_TAKE
    return n;
}

TK_FA size_t tk_fa_smem_bytes(int kind, int64_t HS, int qt, int kt) {
    tk_fa_smem sh;
    return tk_fa_carve(&sh, NULL, kind, HS, qt, kt) * sizeof(float);
}

/* Tile sizes for head size HS: 16 query rows and 32 keys, halved (keys
 * first, down to 8) until every kernel's block fits TK_FA_SMEM_LIMIT.
 * Returns 0 when even 4 x 8 does not fit (HS in the thousands). */
TK_FA int tk_fa_tiles(int64_t HS, int *qt, int *kt) {
    int a = 16, b = 32;
    for (;;) {
        size_t need = tk_fa_smem_bytes(TK_FA_FWD, HS, a, b);
        size_t kv = tk_fa_smem_bytes(TK_FA_BWD_KV, HS, a, b), dq = tk_fa_smem_bytes(TK_FA_BWD_Q, HS, a, b);
        if (kv > need) need = kv;
        if (dq > need) need = dq;
        if (need <= TK_FA_SMEM_LIMIT) break;
        if (b > 8) b /= 2;
        else if (a > 4) a /= 2;
        else return 0;
    }
    *qt = a;
    *kt = b;
    return 1;
}

/* ---- pieces of phases ------------------------------------------------------ */

/* rows [r0, r0+n) of sequence*head bh of x (a (B, T, NH, HS) tensor whose
 * rows are ldx elements apart) into dst with row stride ld; rows past T are
 * zeros. */
TK_FA int64_t tk_fa_base(const tk_fa_args *a, int64_t bh, int64_t ldx) {
    return bh / a->NH * a->T * ldx + bh % a->NH * a->HS;
}

TK_FA void tk_fa_load_rows(float *dst, int64_t ld, const void *x, int dt, int64_t ldx, const tk_fa_args *a,
                           int64_t bh, int64_t r0, int n, int tid, int nt) {
    const int64_t HS = a->HS, base = tk_fa_base(a, bh, ldx);
    for (int64_t e = tid; e < (int64_t)n * HS; e += nt) {
        int64_t r = e / HS, c = e % HS;
        dst[r * ld + c] = r0 + r < a->T ? tk_fa_ld(x, dt, base + (r0 + r) * ldx + c) : 0.0f;
    }
}

TK_FA void tk_fa_store_rows(void *x, int dt, int64_t ldx, const float *src, int64_t ld, const tk_fa_args *a,
                            int64_t bh, int64_t r0, int n, int tid, int nt) {
    const int64_t HS = a->HS, base = tk_fa_base(a, bh, ldx);
    for (int64_t e = tid; e < (int64_t)n * HS; e += nt) {
        int64_t r = e / HS, c = e % HS;
        if (r0 + r < a->T) tk_fa_st(x, dt, base + (r0 + r) * ldx + c, src[r * ld + c]);
    }
}

/* Keys and values [k0, k0+kt) of sequence*head bh into sh->k, sh->v. */
TK_FA void tk_fa_load_kv(const tk_fa_args *a, const tk_fa_smem *sh, int64_t bh, int64_t k0, int tid, int nt) {
    tk_fa_load_rows(sh->k, a->HS + 1, a->k, a->dtk, a->ld, a, bh, k0, a->kt, tid, nt);
    tk_fa_load_rows(sh->v, a->HS + 1, a->v, a->dtv, a->ld, a, bh, k0, a->kt, tid, nt);
}

/* The scaled, masked score of query row r (sh->q) and key j (sh->k) of the
 * tiles starting at q0 and k0; -inf for a masked key; 0 when the sequence
 * has no kept key. */
TK_FA float tk_fa_score(const tk_fa_args *a, const tk_fa_smem *sh, int64_t b, int r, int j, int64_t k0) {
    if (a->mask) {
        if (sh->flag[0] == 0.0f) return 0.0f;
        if (a->mask[b * a->T + k0 + j] == 0) return -INFINITY;
    }
    const int64_t HS = a->HS;
    const float *qr = sh->q + (int64_t)r * HS, *kj = sh->k + (int64_t)j * (HS + 1);
    float s = 0.0f;
    for (int64_t c = 0; c < HS; c++) s += qr[c] * kj[c];
    return a->scale * s;
}

/* The dropout factor of (bh, i, j): 1/(1-p) kept, 0 dropped; 1 without dropout. */
TK_FA float tk_fa_keep(const tk_fa_args *a, int64_t bh, int64_t i, int64_t j) {
    if (!(a->p > 0.0f)) return 1.0f;
    uint64_t idx = a->offset + (uint64_t)((bh * a->T + i) * a->T + j);
    return tk_dropout_keep(a->key, idx, a->p) ? a->keep_scale : 0.0f;
}

TK_FA int tk_fa_ntiles(int64_t T, int t) { return (int)((T + t - 1) / t); }

/* Phase 0 of every kernel: clear the flag (thread 0). Phase 1: set it when a
 * kept key exists (always "kept" without a mask). */
TK_FA void tk_fa_flag_phase(const tk_fa_args *a, const tk_fa_smem *sh, int64_t b, int phase, int tid, int nt) {
    if (phase == 0) {
        if (tid == 0) sh->flag[0] = a->mask ? 0.0f : 1.0f;
        return;
    }
    if (!a->mask) return;
    for (int64_t j = tid; j < a->T; j += nt)
        if (a->mask[b * a->T + j]) sh->flag[0] = 1.0f;
}

/* Backward: P and dS for the (qt x kt) tile at (q0, k0) into sh->s (P*M)
 * and sh->ds, from sh->q, sh->k, sh->v, sh->g, sh->lse, sh->dd. Rows or
 * keys past T get 0. */
TK_FA void tk_fa_bwd_tile(const tk_fa_args *a, const tk_fa_smem *sh, int64_t bh, int64_t q0, int64_t k0,
                          int want_pm, int tid, int nt) {
    const int64_t HS = a->HS, b = bh / a->NH;
    const int qt = a->qt, kt = a->kt;
    for (int e = tid; e < qt * kt; e += nt) {
        int r = e / kt, j = e % kt;
        float pm = 0.0f, ds = 0.0f;
        if (q0 + r < a->T && k0 + j < a->T) {
            float s = tk_fa_score(a, sh, b, r, j, k0);
            float pij = expf(s - sh->lse[r]);
            if (pij != 0.0f) {
                const float *gr = sh->g + (int64_t)r * HS, *vj = sh->v + (int64_t)j * (HS + 1);
                float dp = 0.0f;
                for (int64_t c = 0; c < HS; c++) dp += gr[c] * vj[c];
                float kf = tk_fa_keep(a, bh, q0 + r, k0 + j);
                pm = pij * kf;
                ds = a->scale * pij * (dp * kf - sh->dd[r]);
            }
        }
        if (want_pm) sh->s[e] = pm;
        sh->ds[e] = ds;
    }
}

/* Backward setup for the query tile at q0: q and dout rows, lse, and
 * D_i = dout_i . out_i (rows past T: 0). Two phases: 0 loads, 1 reduces. */
TK_FA void tk_fa_bwd_rows(const tk_fa_args *a, const tk_fa_smem *sh, int64_t bh, int64_t q0, int step, int tid,
                          int nt) {
    const int64_t HS = a->HS;
    if (step == 0) {
        tk_fa_load_rows(sh->q, HS, a->q, a->dtq, a->ld, a, bh, q0, a->qt, tid, nt);
        tk_fa_load_rows(sh->g, HS, a->dout, a->dtg, a->ldo, a, bh, q0, a->qt, tid, nt);
        return;
    }
    for (int r = tid; r < a->qt; r += nt) {
        float d = 0.0f, lse = 0.0f;
        if (q0 + r < a->T) {
            const int64_t at = tk_fa_base(a, bh, a->ldo) + (q0 + r) * a->ldo;
            for (int64_t c = 0; c < HS; c++) d += sh->g[(int64_t)r * HS + c] * tk_fa_ld(a->o, a->dto, at + c);
            lse = a->lse_in[bh * a->T + q0 + r];
        }
        sh->dd[r] = d;
        sh->lse[r] = lse;
    }
}

/* ---- forward ------------------------------------------------------------- */

/* One thread's share of phase `ph` of the forward block (bh, tile qb).
 * Phases: 0, 1 flag and rows; per key tile (pass 1): load K, scores, row
 * statistics; lse; per key tile (pass 2): load K and V, probabilities,
 * accumulate; store. Returns 1 while phases follow. */
TK_FA int tk_fa_fwd_phase(const tk_fa_args *a, const tk_fa_smem *sh, int64_t bh, int64_t qb, int ph, int tid,
                          int nt) {
    const int64_t HS = a->HS, b = bh / a->NH, q0 = qb * a->qt;
    const int qt = a->qt, kt = a->kt, nk = tk_fa_ntiles(a->T, kt);
    if (ph == 0) {
        tk_fa_flag_phase(a, sh, b, 0, tid, nt);
        tk_fa_load_rows(sh->q, HS, a->q, a->dtq, a->ld, a, bh, q0, qt, tid, nt);
        for (int64_t e = tid; e < (int64_t)qt * HS; e += nt) sh->acc[e] = 0.0f;
        for (int r = tid; r < qt; r += nt) {
            sh->m[r] = -INFINITY;
            sh->l[r] = 0.0f;
        }
        return 1;
    }
    if (ph == 1) {
        tk_fa_flag_phase(a, sh, b, 1, tid, nt);
        return 1;
    }
    int x = ph - 2;
    if (x < 3 * nk) { /* pass 1 */
        const int64_t k0 = (int64_t)(x / 3) * kt;
        const int nkv = (int)(a->T - k0 < kt ? a->T - k0 : kt);
        if (x % 3 == 0) {
            tk_fa_load_rows(sh->k, HS + 1, a->k, a->dtk, a->ld, a, bh, k0, kt, tid, nt);
        } else if (x % 3 == 1) {
            for (int e = tid; e < qt * kt; e += nt)
                sh->s[e] = e % kt < nkv ? tk_fa_score(a, sh, b, e / kt, e % kt, k0) : -INFINITY;
        } else {
            for (int r = tid; r < qt; r += nt) {
                const float *sr = sh->s + r * kt;
                float mx = sh->m[r];
                for (int j = 0; j < nkv; j++) mx = sr[j] > mx ? sr[j] : mx;
                if (mx == -INFINITY) continue; /* every key so far masked */
                float sum = sh->l[r] * expf(sh->m[r] - mx);
                for (int j = 0; j < nkv; j++) sum += expf(sr[j] - mx);
                sh->m[r] = mx;
                sh->l[r] = sum;
            }
        }
        return 1;
    }
    x -= 3 * nk;
    if (x == 0) {
        for (int r = tid; r < qt; r += nt) {
            float lse = sh->m[r] + logf(sh->l[r]);
            sh->lse[r] = lse;
            if (q0 + r < a->T) a->lse_out[bh * a->T + q0 + r] = lse;
        }
        return 1;
    }
    x -= 1;
    if (x < 3 * nk) { /* pass 2 */
        const int64_t k0 = (int64_t)(x / 3) * kt;
        const int nkv = (int)(a->T - k0 < kt ? a->T - k0 : kt);
        if (x % 3 == 0) {
            tk_fa_load_kv(a, sh, bh, k0, tid, nt);
        } else if (x % 3 == 1) {
            for (int e = tid; e < qt * kt; e += nt) {
                int r = e / kt, j = e % kt;
                float pij = 0.0f;
                if (j < nkv && q0 + r < a->T) {
                    pij = expf(tk_fa_score(a, sh, b, r, j, k0) - sh->lse[r]);
                    if (pij != 0.0f) pij *= tk_fa_keep(a, bh, q0 + r, k0 + j);
                }
                sh->s[e] = pij;
            }
        } else {
            for (int64_t e = tid; e < (int64_t)qt * HS; e += nt) {
                int64_t r = e / HS, c = e % HS;
                const float *sr = sh->s + r * kt;
                float acc = sh->acc[e];
                for (int j = 0; j < nkv; j++) acc += sr[j] * sh->v[(int64_t)j * (HS + 1) + c];
                sh->acc[e] = acc;
            }
        }
        return 1;
    }
    tk_fa_store_rows(a->out, a->dt_out, a->ldo, sh->acc, HS, a, bh, q0, qt, tid, nt);
    return 0;
}

/* ---- backward: dK, dV ------------------------------------------------------ */

/* Block (bh, key tile kb). Phases: 0, 1 flag, keys and values; per query
 * tile: rows, D and lse, P and dS, accumulate; store. */
TK_FA int tk_fa_bwd_kv_phase(const tk_fa_args *a, const tk_fa_smem *sh, int64_t bh, int64_t kb, int ph, int tid,
                             int nt) {
    const int64_t HS = a->HS, b = bh / a->NH, k0 = kb * a->kt, kh = (int64_t)a->kt * (HS + 1);
    const int qt = a->qt, kt = a->kt, nq = tk_fa_ntiles(a->T, qt);
    float *dk = sh->acc, *dv = sh->acc + kh;
    if (ph == 0) {
        tk_fa_flag_phase(a, sh, b, 0, tid, nt);
        tk_fa_load_kv(a, sh, bh, k0, tid, nt);
        for (int64_t e = tid; e < 2 * kh; e += nt) sh->acc[e] = 0.0f;
        return 1;
    }
    if (ph == 1) {
        tk_fa_flag_phase(a, sh, b, 1, tid, nt);
        return 1;
    }
    int x = ph - 2;
    if (x < 4 * nq) {
        const int64_t q0 = (int64_t)(x / 4) * qt;
        const int nqv = (int)(a->T - q0 < qt ? a->T - q0 : qt);
        switch (x % 4) {
        case 0: tk_fa_bwd_rows(a, sh, bh, q0, 0, tid, nt); break;
        case 1: tk_fa_bwd_rows(a, sh, bh, q0, 1, tid, nt); break;
        case 2: tk_fa_bwd_tile(a, sh, bh, q0, k0, 1, tid, nt); break;
        default:
            for (int64_t e = tid; e < (int64_t)kt * HS; e += nt) {
                int64_t j = e / HS, c = e % HS, at = j * (HS + 1) + c;
                float gv = dv[at], gk = dk[at];
                for (int r = 0; r < nqv; r++) {
                    gv += sh->s[r * kt + j] * sh->g[(int64_t)r * HS + c];
                    gk += sh->ds[r * kt + j] * sh->q[(int64_t)r * HS + c];
                }
                dv[at] = gv;
                dk[at] = gk;
            }
            break;
        }
        return 1;
    }
    tk_fa_store_rows(a->dk, a->dt_dk, a->ld, dk, HS + 1, a, bh, k0, kt, tid, nt);
    tk_fa_store_rows(a->dv, a->dt_dv, a->ld, dv, HS + 1, a, bh, k0, kt, tid, nt);
    return 0;
}

/* ---- backward: dQ ------------------------------------------------------------ */

/* Block (bh, query tile qb). Phases: 0, 1 flag and rows; 2 D and lse; per
 * key tile: keys and values, dS, accumulate; store. */
TK_FA int tk_fa_bwd_q_phase(const tk_fa_args *a, const tk_fa_smem *sh, int64_t bh, int64_t qb, int ph, int tid,
                            int nt) {
    const int64_t HS = a->HS, b = bh / a->NH, q0 = qb * a->qt;
    const int qt = a->qt, kt = a->kt, nk = tk_fa_ntiles(a->T, kt);
    if (ph == 0) {
        tk_fa_flag_phase(a, sh, b, 0, tid, nt);
        tk_fa_bwd_rows(a, sh, bh, q0, 0, tid, nt);
        for (int64_t e = tid; e < (int64_t)qt * HS; e += nt) sh->acc[e] = 0.0f;
        return 1;
    }
    if (ph == 1) {
        tk_fa_flag_phase(a, sh, b, 1, tid, nt);
        return 1;
    }
    if (ph == 2) {
        tk_fa_bwd_rows(a, sh, bh, q0, 1, tid, nt);
        return 1;
    }
    int x = ph - 3;
    if (x < 3 * nk) {
        const int64_t k0 = (int64_t)(x / 3) * kt;
        const int nkv = (int)(a->T - k0 < kt ? a->T - k0 : kt);
        if (x % 3 == 0) {
            tk_fa_load_kv(a, sh, bh, k0, tid, nt);
        } else if (x % 3 == 1) {
            tk_fa_bwd_tile(a, sh, bh, q0, k0, 0, tid, nt);
        } else {
            for (int64_t e = tid; e < (int64_t)qt * HS; e += nt) {
                int64_t r = e / HS, c = e % HS;
                float acc = sh->acc[e];
                for (int j = 0; j < nkv; j++) acc += sh->ds[r * kt + j] * sh->k[(int64_t)j * (HS + 1) + c];
                sh->acc[e] = acc;
            }
        }
        return 1;
    }
    tk_fa_store_rows(a->dq, a->dt_dq, a->ld, sh->acc, HS, a, bh, q0, qt, tid, nt);
    return 0;
}

/* One thread's share of phase `ph` of block (bh, tile) of kernel `kind`;
 * 1 while phases follow. */
TK_FA int tk_fa_phase(int kind, const tk_fa_args *a, const tk_fa_smem *sh, int64_t bh, int64_t tile, int ph, int tid,
                      int nt) {
    switch (kind) {
    case TK_FA_FWD: return tk_fa_fwd_phase(a, sh, bh, tile, ph, tid, nt);
    case TK_FA_BWD_KV: return tk_fa_bwd_kv_phase(a, sh, bh, tile, ph, tid, nt);
    default: return tk_fa_bwd_q_phase(a, sh, bh, tile, ph, tid, nt);
    }
}

#endif
