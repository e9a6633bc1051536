/* heads.cu — the head layout of attention's tensors: (B,T,NH,HS), what a
 * linear layer writes, to (B,NH,T,HS), what the batched per-head GEMMs and
 * the fused attention read, and back. Pure data movement: the same bytes as
 * the cpu backend. */
#include "cuda_common.cuh"

/* (B,T,NH,HS) <-> (B,NH,T,HS). to_heads: out is (B,NH,T,HS). */
__global__ void k_heads(void *out, int dto, const void *in, int dti, int64_t T, int64_t NH, int64_t HS,
                        int64_t total, int to_heads) {
    GRID_STRIDE(k, total) st(out, dto, k, ld(in, dti, tk_heads_src(k, T, NH, HS, to_heads)));
}

/* Eight elements per thread: HS a multiple of 8, so a run of eight never
 * crosses a head, and one dtype on both sides. */
template <typename T>
__global__ void k_heads8(T *out, const T *in, int64_t T_, int64_t NH, int64_t HS, int64_t total8, int to_heads) {
    GRID_STRIDE(g, total8) {
        float v[8];
        ld8(in + tk_heads_src(g * 8, T_, NH, HS, to_heads), v);
        st8(out + g * 8, v);
    }
}

static tk_status heads(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t B, int64_t T, int64_t NH, int64_t HS,
                       int to_heads) {
    NEED_FLOAT(to_heads ? "split_heads" : "merge_heads", out);
    NEED_FLOAT(to_heads ? "split_heads" : "merge_heads", in);
    int64_t total = B * T * NH * HS;
    if (total == 0) return TK_OK;
    if (FAST() && HS % 8 == 0 && out->dtype == in->dtype && fast8(total, out->data, in->data, NULL)) {
        TK_FLOAT_TYPE(DT(out), TT, TK_LAUNCH(k_heads8<TT>, grid_for(total / 8), THREADS)(
            (TT *)out->data, (const TT *)in->data, T, NH, HS, total / 8, to_heads));
        TK_CU_LAUNCHED("k_heads8");
        return TK_OK;
    }
    TK_LAUNCH(k_heads, grid_for(total), THREADS)(out->data, DT(out), in->data, DT(in), T, NH, HS, total, to_heads);
    TK_CU_LAUNCHED("k_heads");
    return TK_OK;
}

extern "C" {

tk_status tk_cuda_split_heads(void *ctx, tk_tensor *out, const tk_tensor *in,
                              int64_t B, int64_t T, int64_t NH, int64_t HS) {
    return heads(ctx, out, in, B, T, NH, HS, 1);
}

tk_status tk_cuda_merge_heads(void *ctx, tk_tensor *out, const tk_tensor *in,
                              int64_t B, int64_t T, int64_t NH, int64_t HS) {
    return heads(ctx, out, in, B, T, NH, HS, 0);
}

} /* extern "C" */
