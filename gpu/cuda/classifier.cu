/* classifier.cu — the loss: softmax cross-entropy over rows of logits
 * (the classifier's labels, a span head's start and end positions), forward
 * and backward.
 *
 * One block per row; the row's exponentials are summed in f64 (a 29k-word
 * row of f32 terms would lose digits), the max and sums by block reduction.
 * A label < 0 is ignored (HF's -100); a label past the row sets the sticky
 * bad-index flag the next sync reports. The rows are few (a batch's
 * examples or positions), so these kernels have no fast twin.
 */
#include "cuda_common.cuh"

/* Per row: loss = logsumexp(x) - x[label]. */
__global__ void k_xent_fwd(float *losses, void *probs, int dtp, const void *logits, int dtl,
                           const int32_t *labels, int64_t V, unsigned *flags) {
    __shared__ float sh[THREADS / 32];
    __shared__ double shd[THREADS / 32];
    int64_t row = blockIdx.x;
    const int64_t base = row * V;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += THREADS) mx = fmaxf(mx, ld(logits, dtl, base + j));
    mx = block_max(mx, sh);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += THREADS) s += (double)expf(ld(logits, dtl, base + j) - mx);
    s = block_sum(s, shd);
    float inv = (float)(1.0 / s);
    if (probs)
        for (int64_t j = threadIdx.x; j < V; j += THREADS)
            st(probs, dtp, base + j, expf(ld(logits, dtl, base + j) - mx) * inv);
    if (threadIdx.x == 0) {
        int32_t y = labels[row];
        float loss = 0.0f;
        if (y >= V) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
        else if (y >= 0) loss = (mx + (float)log(s)) - ld(logits, dtl, base + y);
        losses[row] = loss;
    }
}

__global__ void k_xent_bwd(void *dlogits, int dtd, const void *logits, int dtl, const int32_t *labels,
                           int64_t V, float scale, unsigned *flags) {
    __shared__ float sh[THREADS / 32];
    __shared__ double shd[THREADS / 32];
    int64_t row = blockIdx.x;
    const int64_t base = row * V;
    int32_t y = labels[row];
    if (y < 0 || y >= V) {
        if (y >= V && threadIdx.x == 0) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
        for (int64_t j = threadIdx.x; j < V; j += THREADS) st(dlogits, dtd, base + j, 0.0f);
        return;
    }
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += THREADS) mx = fmaxf(mx, ld(logits, dtl, base + j));
    mx = block_max(mx, sh);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += THREADS) s += (double)expf(ld(logits, dtl, base + j) - mx);
    s = block_sum(s, shd);
    float inv = (float)(1.0 / s);
    for (int64_t j = threadIdx.x; j < V; j += THREADS) {
        float pr = expf(ld(logits, dtl, base + j) - mx) * inv;
        st(dlogits, dtd, base + j, (j == y ? pr - 1.0f : pr) * scale);
    }
}

/* ---- launchers ---- */

extern "C" {

tk_status tk_cuda_xent_fwd(void *ctx, tk_tensor *losses, tk_tensor *probs, const tk_tensor *logits,
                           const tk_tensor *labels, int64_t N, int64_t V) {
    NEED_FLOAT("xent_fwd", logits); NEED_I32("xent_fwd", labels);
    if (losses->dtype != TK_F32) return bad("xent_fwd", "losses must be f32");
    if (probs) NEED_FLOAT("xent_fwd", probs);
    if (N == 0) return TK_OK;
    if (N > INT32_MAX) return bad("xent_fwd", "more than 2^31 rows");
    TK_LAUNCH(k_xent_fwd, (unsigned)N, THREADS)((float *)losses->data, probs ? probs->data : NULL,
                                         probs ? DT(probs) : 0, logits->data, DT(logits),
                                         (const int32_t *)labels->data, V, CTX->flags);
    TK_CU_LAUNCHED("k_xent_fwd");
    return TK_OK;
}

tk_status tk_cuda_xent_bwd(void *ctx, tk_tensor *dlogits, const tk_tensor *logits,
                           const tk_tensor *labels, int64_t N, int64_t V, float scale) {
    NEED_FLOAT("xent_bwd", dlogits); NEED_FLOAT("xent_bwd", logits); NEED_I32("xent_bwd", labels);
    if (N == 0) return TK_OK;
    if (N > INT32_MAX) return bad("xent_bwd", "more than 2^31 rows");
    TK_LAUNCH(k_xent_bwd, (unsigned)N, THREADS)(dlogits->data, DT(dlogits), logits->data, DT(logits),
                                         (const int32_t *)labels->data, V, scale, CTX->flags);
    TK_CU_LAUNCHED("k_xent_bwd");
    return TK_OK;
}

} /* extern "C" */
