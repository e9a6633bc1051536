/* cpu_attention.c — the cpu backend's fused (memory-efficient) attention.
 *
 * What it does: tk_op_attention_fwd/bwd on the host. Each (sequence, head)
 * pair is one independent task (OpenMP over B*NH); a task converts its q, k,
 * v (and dout, out) slices to f32 once, then walks query rows: one row of T
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
 *    (B,NH,T,T) probabilities at that offset.
 *  - Deterministic: every sum runs in a fixed order within one thread.
 *  - Scratch is malloc'd per thread (about 9*T*HS + T floats); if the host
 *    has none the op returns TK_EDEVICE and its outputs are undefined.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "tk_backend_impl.h"
#include "tk_ops_spec.h"

static void load(float *dst, const tk_tensor *t, int64_t off, int64_t n) {
    const void *src = t->data;
    switch (t->dtype) {
    case TK_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = tk_f16_to_f32(((const uint16_t *)src)[off + i]);
        break;
    case TK_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = tk_bf16_to_f32(((const uint16_t *)src)[off + i]);
        break;
    default: memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float)); break;
    }
}

static void store(tk_tensor *t, int64_t off, const float *src, int64_t n) {
    void *dst = t->data;
    switch (t->dtype) {
    case TK_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[off + i] = tk_f32_to_f16(src[i]);
        break;
    case TK_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[off + i] = tk_f32_to_bf16(src[i]);
        break;
    default: memcpy((float *)dst + off, src, (size_t)n * sizeof(float)); break;
    }
}

static float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Scores of query row qi against every key into s[T]; masked keys get
 * -INFINITY; a sequence with no kept key gets all zeros (uniform). */
static void scores(float *s, const float *qi, const float *k, const int32_t *mrow, int all_masked,
                   int64_t T, int64_t HS, float scale) {
    for (int64_t j = 0; j < T; j++) {
        if (all_masked) s[j] = 0.0f;
        else if (mrow && mrow[j] == 0) s[j] = -INFINITY;
        else s[j] = scale * dot(qi, k + j * HS, HS);
    }
}

static int seq_all_masked(const int32_t *mrow, int64_t T) {
    if (!mrow) return 0;
    for (int64_t j = 0; j < T; j++)
        if (mrow[j]) return 0;
    return 1;
}

tk_status tk_cpu_attention_fwd(void *ctx, tk_tensor *out, tk_tensor *lse, const tk_tensor *q,
                               const tk_tensor *k, const tk_tensor *v, const tk_tensor *mask,
                               int64_t B, int64_t NH, int64_t T, int64_t HS, float scale, float p,
                               uint64_t seed, uint64_t offset) {
    const int64_t BH = B * NH, TH = T * HS;
    if (BH == 0 || T == 0) return TK_OK;
    const int32_t *mk = mask ? mask->data : NULL;
    const uint64_t key = tk_dropout_key(seed);
    const float keep_scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    float *L = lse->data;
    int failed = 0;
#pragma omp parallel num_threads(tk_cpu_ctx_threads(ctx)) if (BH > 1 && BH * T * TH > 65536)
    {
        float *buf = malloc(((size_t)4 * TH + (size_t)T) * sizeof(float));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        float *qf = buf, *kf = qf + TH, *vf = kf + TH, *of = vf + TH, *s = of + TH;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; bh++) {
            if (!buf) continue;
            const int64_t b = bh / NH, off = bh * TH;
            const int32_t *mrow = mk ? mk + b * T : NULL;
            const int allm = seq_all_masked(mrow, T);
            load(qf, q, off, TH);
            load(kf, k, off, TH);
            load(vf, v, off, TH);
            for (int64_t i = 0; i < T; i++) {
                scores(s, qf + i * HS, kf, mrow, allm, T, HS, scale);
                float mx = -INFINITY;
                for (int64_t j = 0; j < T; j++) mx = s[j] > mx ? s[j] : mx;
                float sum = 0.0f;
                for (int64_t j = 0; j < T; j++) sum += s[j] = expf(s[j] - mx);
                const float inv = 1.0f / sum;
                L[bh * T + i] = mx + logf(sum);
                float *oi = of + i * HS;
                memset(oi, 0, (size_t)HS * sizeof(float));
                const uint64_t row = offset + (uint64_t)((bh * T + i) * T);
                for (int64_t j = 0; j < T; j++) {
                    float pij = s[j] * inv;
                    if (pij == 0.0f) continue;
                    if (p > 0.0f) pij = tk_dropout_keep(key, row + (uint64_t)j, p) ? pij * keep_scale : 0.0f;
                    const float *vj = vf + j * HS;
                    for (int64_t c = 0; c < HS; c++) oi[c] += pij * vj[c];
                }
            }
            store(out, off, of, TH);
        }
        free(buf);
    }
    return failed ? TK_EDEVICE : TK_OK;
}

tk_status tk_cpu_attention_bwd(void *ctx, tk_tensor *dq, tk_tensor *dk, tk_tensor *dv,
                               const tk_tensor *dout, const tk_tensor *q, const tk_tensor *k,
                               const tk_tensor *v, const tk_tensor *out, const tk_tensor *lse,
                               const tk_tensor *mask, int64_t B, int64_t NH, int64_t T, int64_t HS,
                               float scale, float p, uint64_t seed, uint64_t offset) {
    const int64_t BH = B * NH, TH = T * HS;
    if (BH == 0 || T == 0) return TK_OK;
    const int32_t *mk = mask ? mask->data : NULL;
    const uint64_t key = tk_dropout_key(seed);
    const float keep_scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    const float *L = lse->data;
    int failed = 0;
#pragma omp parallel num_threads(tk_cpu_ctx_threads(ctx)) if (BH > 1 && BH * T * TH > 65536)
    {
        float *buf = malloc(((size_t)8 * TH + (size_t)T) * sizeof(float));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        float *qf = buf, *kf = qf + TH, *vf = kf + TH, *of = vf + TH, *gf = of + TH;
        float *dqf = gf + TH, *dkf = dqf + TH, *dvf = dkf + TH, *s = dvf + TH;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; bh++) {
            if (!buf) continue;
            const int64_t b = bh / NH, off = bh * TH;
            const int32_t *mrow = mk ? mk + b * T : NULL;
            const int allm = seq_all_masked(mrow, T);
            load(qf, q, off, TH);
            load(kf, k, off, TH);
            load(vf, v, off, TH);
            load(of, out, off, TH);
            load(gf, dout, off, TH);
            memset(dqf, 0, (size_t)3 * TH * sizeof(float));
            for (int64_t i = 0; i < T; i++) {
                const float *qi = qf + i * HS, *gi = gf + i * HS;
                float *dqi = dqf + i * HS;
                scores(s, qi, kf, mrow, allm, T, HS, scale);
                const float li = L[bh * T + i], Di = dot(gi, of + i * HS, HS);
                const uint64_t row = offset + (uint64_t)((bh * T + i) * T);
                for (int64_t j = 0; j < T; j++) {
                    const float pij = expf(s[j] - li);
                    if (pij == 0.0f) continue;
                    float kf_j = 1.0f;
                    if (p > 0.0f) kf_j = tk_dropout_keep(key, row + (uint64_t)j, p) ? keep_scale : 0.0f;
                    const float *vj = vf + j * HS, *kj = kf + j * HS;
                    float *dvj = dvf + j * HS, *dkj = dkf + j * HS;
                    const float dp = kf_j != 0.0f ? dot(gi, vj, HS) * kf_j : 0.0f;
                    const float pd = pij * kf_j, ds = scale * pij * (dp - Di);
                    for (int64_t c = 0; c < HS; c++) {
                        dvj[c] += pd * gi[c];
                        dqi[c] += ds * kj[c];
                        dkj[c] += ds * qi[c];
                    }
                }
            }
            store(dq, off, dqf, TH);
            store(dk, off, dkf, TH);
            store(dv, off, dvf, TH);
        }
        free(buf);
    }
    return failed ? TK_EDEVICE : TK_OK;
}
