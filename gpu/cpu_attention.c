/* cpu_attention.c — the cpu backend's fused (memory-efficient) attention.
 *
 * What it does: tk_op_attention_fwd/bwd on the host. Each (sequence, head)
 * pair is one independent task (OpenMP over B*NH); a task gathers its q, k,
 * v (and dout, out) rows from the (B,T,NH,HS) tensors (tk_gpu.h's layout,
 * q-like rows ld apart) into f32 once, then walks query rows: one row of T
 * scores lives in a thread-local buffer, never a (T,T) matrix.
 *
 * Guarantees:
 *  - Forward: out = dropout(P) v with P = softmax(scale * q k^T + maskbias),
 *    lse[row] = log-sum-exp of the row's scores. Keys whose mask is 0 get
 *    probability 0, as tk_op_softmax_fwd's -FLT_MAX bias gives; a sequence
 *    with every key masked attends uniformly, as that bias also gives (all
 *    scores round to the same -FLT_MAX).
 *  - Backward rebuilds P[i,j] = exp(score - lse[i]) and uses
 *    dS = P * (dP - D_i), D_i = dout_i . out_i (equal to sum_j P dP, dropout
 *    included), so nothing of size T*T is kept between the two calls.
 *  - Dropout keeps element (b, h, i, j) iff tk_dropout_keep(key, offset +
 *    ((b*NH + h)*T + i)*T + j, p): the mask tk_op_dropout_fwd draws over the
 *    (B,NH,T,T) probabilities at that offset. Forward hashes each element
 *    once, into the keep mask (tk_ops_spec.h's bit order, the tensor-core
 *    kernel's: the same bytes cuda writes), and reads its rows from there;
 *    backward reads the same bits. A forward given no keep tensor (one whose
 *    activations are not kept) puts its sequence*head's bits in scratch.
 *  - Deterministic: every sum runs in a fixed order within one thread.
 *  - Scratch is malloc'd per thread (about 10*T*HS + 3*T floats, and in a
 *    forward without a keep tensor T*T/8 bytes of bits); if the
 *    host has none the op returns TK_ENOMEM and its outputs are undefined.
 *
 * Speed: a task keeps K (and in backward V) transposed, so a row's T scores
 * are HS axpys over the keys, and every inner loop (scores, exp, dropout,
 * the rank-1 updates) is an `omp simd` loop compiled for AVX-512, AVX2 and
 * the baseline (TK_VEC_CLONES), with tk_cpu_vec.h's branch-free exp.
 */
#pragma GCC optimize("no-trapping-math", "no-math-errno")

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "tk_backend_impl.h"
#include "tk_host_mem.h"
#include "tk_ops_spec.h"
#include "tk_cpu_vec.h"

/* The T rows of HS elements of one (sequence, head), `at` the element of
 * (b, 0, h, 0), rows ld apart, as f32 and back (tk_cpu_vec.h: F16C where
 * the CPU has it). */
static void load(float *dst, const tk_tensor *t, int64_t at, int64_t ld, int64_t T, int64_t HS) {
    for (int64_t i = 0; i < T; i++) tk_cpu_to_f32(dst + i * HS, t->data, t->dtype, at + i * ld, HS);
}

static void store(tk_tensor *t, int64_t at, int64_t ld, const float *src, int64_t T, int64_t HS) {
    for (int64_t i = 0; i < T; i++) tk_cpu_from_f32(t->data, t->dtype, at + i * ld, src + i * HS, HS);
}

/* dst (n x m) = src (m x n) transposed */
static void transpose(float *dst, const float *src, int64_t m, int64_t n) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) dst[j * m + i] = src[i * n + j];
}

TK_VEC_CLONES
static float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y += a * x over n */
TK_VEC_CLONES
static void axpy(float *y, float a, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* s[j] = sum_c x[c] * mt[c*T + j] for every key j (mt: a (HS, T) transposed
 * K or V), then times `scale`; masked keys get -INFINITY when `mask_inf`.
 * A sequence with no kept key gets all zeros (uniform attention). */
TK_VEC_CLONES
static void row_dots(float *s, const float *x, const float *mt, const int32_t *mrow, int all_masked, int mask_inf,
                     int64_t T, int64_t HS, float scale) {
    if (all_masked && mask_inf) {
        memset(s, 0, (size_t)T * sizeof(float));
        return;
    }
    memset(s, 0, (size_t)T * sizeof(float));
    for (int64_t c = 0; c < HS; c++) {
        const float a = x[c], *m = mt + c * T;
#pragma omp simd
        for (int64_t j = 0; j < T; j++) s[j] += a * m[j];
    }
    if (mask_inf && mrow) {
#pragma omp simd
        for (int64_t j = 0; j < T; j++) s[j] = mrow[j] == 0 ? -INFINITY : scale * s[j];
    } else {
#pragma omp simd
        for (int64_t j = 0; j < T; j++) s[j] *= scale;
    }
}

TK_VEC_CLONES
static float row_max(const float *s, int64_t T) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < T; j++) mx = s[j] > mx ? s[j] : mx;
    return mx;
}

/* s[j] = exp(s[j] - sub) in place; returns the sum */
TK_VEC_CLONES
static float row_exp(float *s, float sub, int64_t T) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < T; j++) {
        s[j] = v_exp(s[j] - sub);
        sum += s[j];
    }
    return sum;
}

/* kw (tk_attn_keep_words(T) words) = sequence*head bh's keep bits */
static void keep_fill(uint32_t *kw, uint64_t key, uint64_t offset, float p, int64_t T, int64_t bh) {
    const int64_t nw = tk_attn_keep_words(T);
    for (int64_t w = 0; w < nw; w++) kw[w] = tk_attn_keep_word(key, offset, p, T, bh, w);
}

/* m[j] = keep_scale where query i's bit of key j is set in kw, else 0 */
static void row_keep(float *m, const uint32_t *kw, int64_t T, int64_t i, float keep_scale) {
    for (int64_t j = 0; j < T; j++) {
        int bit;
        const int64_t w = tk_attn_keep_at(T, i, j, &bit);
        m[j] = kw[w] >> bit & 1u ? keep_scale : 0.0f;
    }
}

static int seq_all_masked(const int32_t *mrow, int64_t T) {
    if (!mrow) return 0;
    for (int64_t j = 0; j < T; j++)
        if (mrow[j]) return 0;
    return 1;
}

tk_status tk_cpu_attention_fwd(void *ctx, tk_tensor *out, tk_tensor *lse, tk_tensor *keep,
                               const tk_tensor *q, const tk_tensor *k, const tk_tensor *v,
                               const tk_tensor *mask, const tk_attn *a) {
    const int64_t NH = a->NH, T = a->T, HS = a->HS, ld = a->ld, C = NH * HS;
    const int64_t BH = a->B * NH, TH = T * HS;
    const float scale = a->scale, p = a->p;
    const uint64_t offset = a->offset;
    if (BH == 0 || T == 0) return TK_OK;
    const int32_t *mk = mask ? mask->data : NULL;
    const uint64_t key = tk_dropout_key(a->seed);
    const float keep_scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    float *L = lse->data;
    const int64_t nw = p > 0.0f ? tk_attn_keep_words(T) : 0; /* per sequence*head */
    uint32_t *kall = p > 0.0f && keep ? keep->data : NULL;
    int failed = 0;
#pragma omp parallel num_threads(tk_cpu_ctx_threads(ctx)) if (BH > 1 && BH * T * TH > 65536)
    {
        const size_t nf = (size_t)5 * TH + (size_t)2 * T;
        float *buf = tk_malloc(nf * sizeof(float) + (kall ? 0 : (size_t)nw * sizeof(uint32_t)));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        float *qf = buf, *kf = qf + TH, *vf = kf + TH, *of = vf + TH, *kt = of + TH, *s = kt + TH, *m = s + T;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; bh++) {
            if (!buf) continue;
            uint32_t *kw = kall ? kall + bh * nw : (uint32_t *)(buf + nf);
            if (p > 0.0f) keep_fill(kw, key, offset, p, T, bh);
            const int64_t b = bh / NH, h = bh % NH, at = b * T * ld + h * HS, ato = b * T * C + h * HS;
            const int32_t *mrow = mk ? mk + b * T : NULL;
            const int allm = seq_all_masked(mrow, T);
            load(qf, q, at, ld, T, HS);
            load(kf, k, at, ld, T, HS);
            load(vf, v, at, ld, T, HS);
            transpose(kt, kf, T, HS);
            for (int64_t i = 0; i < T; i++) {
                row_dots(s, qf + i * HS, kt, mrow, allm, 1, T, HS, scale);
                const float mx = row_max(s, T);
                const float sum = row_exp(s, mx, T), inv = 1.0f / sum;
                L[bh * T + i] = mx + logf(sum);
                if (p > 0.0f) {
                    row_keep(m, kw, T, i, keep_scale);
                    for (int64_t j = 0; j < T; j++) s[j] *= inv * m[j];
                } else {
                    for (int64_t j = 0; j < T; j++) s[j] *= inv;
                }
                float *oi = of + i * HS;
                memset(oi, 0, (size_t)HS * sizeof(float));
                for (int64_t j = 0; j < T; j++)
                    if (s[j] != 0.0f) axpy(oi, s[j], vf + j * HS, HS);
            }
            store(out, ato, C, of, T, HS);
        }
        free(buf);
    }
    return failed ? TK_ENOMEM : TK_OK;
}

tk_status tk_cpu_attention_bwd(void *ctx, tk_tensor *dq, tk_tensor *dk, tk_tensor *dv,
                               const tk_tensor *dout, const tk_tensor *q, const tk_tensor *k,
                               const tk_tensor *v, const tk_tensor *out, const tk_tensor *lse,
                               const tk_tensor *keep, const tk_tensor *mask, const tk_attn *a) {
    const int64_t NH = a->NH, T = a->T, HS = a->HS, ld = a->ld, C = NH * HS;
    const int64_t BH = a->B * NH, TH = T * HS;
    const float scale = a->scale, p = a->p;
    if (BH == 0 || T == 0) return TK_OK;
    const int32_t *mk = mask ? mask->data : NULL;
    const float keep_scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    const float *L = lse->data;
    const int64_t nw = p > 0.0f ? tk_attn_keep_words(T) : 0;
    const uint32_t *kall = p > 0.0f ? keep->data : NULL; /* tk_op_attention_bwd: present when p > 0 */
    int failed = 0;
#pragma omp parallel num_threads(tk_cpu_ctx_threads(ctx)) if (BH > 1 && BH * T * TH > 65536)
    {
        float *buf = tk_malloc(((size_t)10 * TH + (size_t)3 * T) * sizeof(float));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        float *qf = buf, *kf = qf + TH, *vf = kf + TH, *of = vf + TH, *gf = of + TH;
        float *dqf = gf + TH, *dkf = dqf + TH, *dvf = dkf + TH, *kt = dvf + TH, *vt = kt + TH;
        float *s = vt + TH, *m = s + T, *dp = m + T;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; bh++) {
            if (!buf) continue;
            const int64_t b = bh / NH, h = bh % NH, at = b * T * ld + h * HS, ato = b * T * C + h * HS;
            const int32_t *mrow = mk ? mk + b * T : NULL;
            const int allm = seq_all_masked(mrow, T);
            load(qf, q, at, ld, T, HS);
            load(kf, k, at, ld, T, HS);
            load(vf, v, at, ld, T, HS);
            load(of, out, ato, C, T, HS);
            load(gf, dout, ato, C, T, HS);
            transpose(kt, kf, T, HS);
            transpose(vt, vf, T, HS);
            memset(dqf, 0, (size_t)3 * TH * sizeof(float));
            for (int64_t i = 0; i < T; i++) {
                const float *qi = qf + i * HS, *gi = gf + i * HS;
                float *dqi = dqf + i * HS;
                row_dots(s, qi, kt, mrow, allm, 1, T, HS, scale);
                const float li = L[bh * T + i], Di = dot(gi, of + i * HS, HS);
                row_exp(s, li, T); /* s = P */
                row_dots(dp, gi, vt, NULL, 0, 0, T, HS, 1.0f);
                if (p > 0.0f) row_keep(m, kall + bh * nw, T, i, keep_scale);
                for (int64_t j = 0; j < T; j++) {
                    const float pij = s[j];
                    if (pij == 0.0f) continue;
                    const float kf_j = p > 0.0f ? m[j] : 1.0f;
                    const float pd = pij * kf_j, ds = scale * pij * (dp[j] * kf_j - Di);
                    if (pd != 0.0f) axpy(dvf + j * HS, pd, gi, HS);
                    axpy(dqi, ds, kf + j * HS, HS);
                    axpy(dkf + j * HS, ds, qi, HS);
                }
            }
            store(dq, at, ld, dqf, T, HS);
            store(dk, at, ld, dkf, T, HS);
            store(dv, at, ld, dvf, T, HS);
        }
        free(buf);
    }
    return failed ? TK_ENOMEM : TK_OK;
}
