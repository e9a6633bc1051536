/* embedding.cu — row lookups and their backward: the embedding tables,
 * gather_rows ([CLS], SQuAD positions) and scatter_add_rows.
 *
 * Reference backward (k_scatter_add): one thread per column walks the rows
 * in order, so every table row receives its additions in row order, as the
 * cpu backend without groups. A batch's positions that share a row (every
 * token type, [PAD], a position id over the batch) are then added one after
 * another by one thread: 22 ms of a bert-base 32 x 512 step on an H200.
 *
 * Grouped backward (tk_op_embed_bwd with groups, gpu/embed_groups.c): the
 * host sorts the positions by table row and cuts each row's list into
 * chunks of TK_EMBED_CHUNK. k_embed_chunk* sums one chunk per block, eight
 * columns per thread, from zero; a row with one chunk adds its sum to the
 * table directly (its only writer), a row with several leaves its chunk
 * sums in scratch and k_embed_rows adds them to the row in chunk order. No
 * atomics, one writer per table row, the cpu backend's order to the bit.
 */
#include "cuda_common.cuh"

/* ---- lookups ----------------------------------------------------------------------- */

/* out[i, c] = in[idx[i], c] for idx[i] in [0, rows); else zeros and a flag. */
__global__ void k_gather(void *out, int dto, const void *in, int dti, const int32_t *idx, int64_t n,
                         int64_t C, int64_t rows, unsigned *flags) {
    GRID_STRIDE(k, n * C) {
        int64_t i = k / C, c = k % C;
        int32_t r = idx[i];
        if (r < 0 || (rows >= 0 && r >= rows)) {
            st(out, dto, k, 0.0f);
            if (c == 0) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
        } else {
            st(out, dto, k, ld(in, dti, (int64_t)r * C + c));
        }
    }
}

/* ---- reference backward ----------------------------------------------------------- */

/* dst[idx[i], c] += src[i, c], i in order: one thread per column, so every
 * element of dst receives its additions in row order, as on the cpu. Rows go
 * four at a time when their four destinations differ (then the order among
 * them cannot matter), which keeps four loads in flight instead of one. */
#define SCATTER_THREADS 64

__device__ __forceinline__ int bad_row(int32_t r, int64_t rows) { return r < 0 || (rows >= 0 && r >= rows); }

__global__ void k_scatter_add(void *__restrict__ dst, int dtd, const void *__restrict__ src, int dts,
                              const int32_t *__restrict__ idx, int64_t n, int64_t C, int64_t rows,
                              unsigned *flags) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        int32_t r0 = idx[i], r1 = idx[i + 1], r2 = idx[i + 2], r3 = idx[i + 3];
        int ok = !bad_row(r0, rows) && !bad_row(r1, rows) && !bad_row(r2, rows) && !bad_row(r3, rows) &&
                 r0 != r1 && r0 != r2 && r0 != r3 && r1 != r2 && r1 != r3 && r2 != r3;
        if (ok) {
            int64_t k0 = (int64_t)r0 * C + c, k1 = (int64_t)r1 * C + c;
            int64_t k2 = (int64_t)r2 * C + c, k3 = (int64_t)r3 * C + c;
            float d0 = ld(dst, dtd, k0), d1 = ld(dst, dtd, k1), d2 = ld(dst, dtd, k2), d3 = ld(dst, dtd, k3);
            float s0 = ld(src, dts, i * C + c), s1 = ld(src, dts, (i + 1) * C + c);
            float s2 = ld(src, dts, (i + 2) * C + c), s3 = ld(src, dts, (i + 3) * C + c);
            st(dst, dtd, k0, d0 + s0);
            st(dst, dtd, k1, d1 + s1);
            st(dst, dtd, k2, d2 + s2);
            st(dst, dtd, k3, d3 + s3);
            continue;
        }
        for (int64_t j = i; j < i + 4; j++) {
            int32_t r = idx[j];
            if (bad_row(r, rows)) {
                if (c == 0) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
                continue;
            }
            int64_t k = (int64_t)r * C + c;
            st(dst, dtd, k, ld(dst, dtd, k) + ld(src, dts, j * C + c));
        }
    }
    for (; i < n; i++) {
        int32_t r = idx[i];
        if (bad_row(r, rows)) {
            if (c == 0) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
            continue;
        }
        int64_t k = (int64_t)r * C + c;
        st(dst, dtd, k, ld(dst, dtd, k) + ld(src, dts, i * C + c));
    }
}

/* ---- grouped backward --------------------------------------------------------------- */

/* The groups tensor's arrays (tk_embed_groups_build). */
struct egroups {
    int G, NC, NM, GM;
    const int32_t *row, *first, *start, *owner, *order;
};

__device__ __forceinline__ egroups egroups_of(const int32_t *gr) {
    egroups e;
    e.G = gr[0]; e.NC = gr[1]; e.NM = gr[2]; e.GM = gr[3];
    e.row = gr + 4;
    e.first = e.row + e.G;
    e.start = e.first + e.G + 1;
    e.owner = e.start + e.NC + 1;
    e.order = e.owner + e.NC;
    return e;
}

#define EMB_THREADS 128

/* The sum s (8 columns from c) of chunk ch: into scratch row ch when its
 * table row has several chunks, else added to the table row. */
__device__ __forceinline__ void chunk_done(const egroups &e, int ch, const float *s, int n, void *dtable, int dtd,
                                           float *scratch, int64_t C, int64_t c, int64_t rows, unsigned *flags) {
    if (ch < e.NM) {
        for (int j = 0; j < n; j++) scratch[(int64_t)ch * C + c + j] = s[j];
        return;
    }
    int32_t r = e.row[e.owner[ch]];
    if (bad_row(r, rows)) {
        if (c == 0) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
        return;
    }
    for (int j = 0; j < n; j++) {
        int64_t k = (int64_t)r * C + c + j;
        st(dtable, dtd, k, ld(dtable, dtd, k) + s[j]);
    }
}

/* One block per chunk, eight columns per thread (C a multiple of 8, rows
 * 16-byte aligned). */
template <typename TS>
__global__ void k_embed_chunk8(void *dtable, int dtd, float *scratch, const TS *dout, const int32_t *gr, int64_t C,
                               int64_t rows, unsigned *flags) {
    const egroups e = egroups_of(gr);
    const int ch = blockIdx.x;
    if (ch >= e.NC) return;
    const int k0 = e.start[ch], k1 = e.start[ch + 1];
    for (int64_t c = (int64_t)threadIdx.x * 8; c < C; c += (int64_t)blockDim.x * 8) {
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int k = k0; k < k1; k++) {
            float v[8];
            ld8(dout + (int64_t)e.order[k] * C + c, v);
            for (int j = 0; j < 8; j++) s[j] += v[j];
        }
        chunk_done(e, ch, s, 8, dtable, dtd, scratch, C, c, rows, flags);
    }
}

/* The same sums a column per thread, for any C and alignment. */
__global__ void k_embed_chunk(void *dtable, int dtd, float *scratch, const void *dout, int dts, const int32_t *gr,
                              int64_t C, int64_t rows, unsigned *flags) {
    const egroups e = egroups_of(gr);
    const int ch = blockIdx.x;
    if (ch >= e.NC) return;
    const int k0 = e.start[ch], k1 = e.start[ch + 1];
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        for (int k = k0; k < k1; k++) s += ld(dout, dts, (int64_t)e.order[k] * C + c);
        chunk_done(e, ch, &s, 1, dtable, dtd, scratch, C, c, rows, flags);
    }
}

/* One block per table row with several chunks: its chunk sums added to the
 * row in chunk order, each addition rounded to the table's dtype. */
__global__ void k_embed_rows(void *dtable, int dtd, const float *scratch, const int32_t *gr, int64_t C, int64_t rows,
                             unsigned *flags) {
    const egroups e = egroups_of(gr);
    const int g = blockIdx.x;
    if (g >= e.GM) return;
    const int32_t r = e.row[g];
    if (bad_row(r, rows)) {
        if (threadIdx.x == 0) atomicOr(flags, TK_CUDA_FLAG_BAD_INDEX);
        return;
    }
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const int64_t k = (int64_t)r * C + c;
        float v = ld(dtable, dtd, k);
        for (int ch = e.first[g]; ch < e.first[g + 1]; ch++) v = round_to(dtd, v + scratch[(int64_t)ch * C + c]);
        st(dtable, dtd, k, v);
    }
}

/* ---- launchers ------------------------------------------------------------------------ */

extern "C" {

/* out[i,:] = in[idx[i],:] for n rows of C: embed_fwd's and gather_rows'
 * kernel, `op` naming the caller in errors. */
static tk_status gather(void *ctx, const char *op, tk_tensor *out, const tk_tensor *in, const tk_tensor *idx,
                        int64_t n, int64_t C) {
    NEED_FLOAT(op, out); NEED_FLOAT(op, in); NEED_I32(op, idx);
    if (n * C == 0) return TK_OK;
    int64_t rows = rows_of(in, C);
    TK_LAUNCH(k_gather, grid_for(n * C), THREADS)(out->data, DT(out), in->data, DT(in), (const int32_t *)idx->data,
                                                  n, C, rows, CTX->flags);
    TK_CU_LAUNCHED(op);
    return TK_OK;
}

/* din[idx[i],:] += dout[i,:], one thread per column walking the rows in
 * order: scatter_add_rows' kernel and embed_bwd's reference. */
static tk_status scatter_add(void *ctx, const char *op, tk_tensor *din, const tk_tensor *dout, const tk_tensor *idx,
                             int64_t n, int64_t C) {
    NEED_FLOAT(op, din); NEED_FLOAT(op, dout); NEED_I32(op, idx);
    if (n * C == 0) return TK_OK;
    int64_t rows = rows_of(din, C);
    TK_LAUNCH(k_scatter_add, (unsigned)((C + SCATTER_THREADS - 1) / SCATTER_THREADS), SCATTER_THREADS)(
        din->data, DT(din), dout->data, DT(dout), (const int32_t *)idx->data, n, C, rows, CTX->flags);
    TK_CU_LAUNCHED(op);
    return TK_OK;
}

tk_status tk_cuda_embed_fwd(void *ctx, tk_tensor *out, const tk_tensor *ids, const tk_tensor *table,
                            int64_t n, int64_t C) {
    return gather(ctx, "embed_fwd", out, table, ids, n, C);
}

tk_status tk_cuda_embed_bwd(void *ctx, tk_tensor *dtable, const tk_tensor *ids, const tk_tensor *dout,
                            int64_t n, int64_t C, const tk_tensor *groups, tk_tensor *scratch) {
    NEED_FLOAT("embed_bwd", dtable); NEED_FLOAT("embed_bwd", dout); NEED_I32("embed_bwd", ids);
    if (n * C == 0) return TK_OK;
    int64_t rows = rows_of(dtable, C);
    if (groups && FAST()) {
        if (groups->dtype != TK_I32 || scratch->dtype != TK_F32) return bad("embed_bwd", "groups i32, scratch f32");
        if (n > INT32_MAX) return bad("embed_bwd", "more than 2^31 ids");
        const int32_t *gr = (const int32_t *)groups->data;
        float *sc = (float *)scratch->data;
        /* every position could be its own chunk: n blocks, those past NC return at once */
        if (C % 8 == 0 && aligned16(dout->data)) {
            TK_FLOAT_TYPE(DT(dout), TS,
                TK_LAUNCH(k_embed_chunk8<TS>, (unsigned)n, EMB_THREADS)(dtable->data, DT(dtable), sc,
                                                                      (const TS *)dout->data, gr, C, rows, CTX->flags));
            TK_CU_LAUNCHED("k_embed_chunk8");
        } else {
            TK_LAUNCH(k_embed_chunk, (unsigned)n, EMB_THREADS)(dtable->data, DT(dtable), sc, dout->data, DT(dout), gr,
                                                             C, rows, CTX->flags);
            TK_CU_LAUNCHED("k_embed_chunk");
        }
        TK_LAUNCH(k_embed_rows, (unsigned)(tk_embed_bwd_scratch_numel(n, C) / C), EMB_THREADS)(
            dtable->data, DT(dtable), sc, gr, C, rows, CTX->flags);
        TK_CU_LAUNCHED("k_embed_rows");
        return TK_OK;
    }
    return scatter_add(ctx, "embed_bwd", dtable, dout, ids, n, C);
}

tk_status tk_cuda_gather_rows(void *ctx, tk_tensor *out, const tk_tensor *in, const tk_tensor *idx,
                              int64_t n, int64_t C) {
    return gather(ctx, "gather_rows", out, in, idx, n, C);
}

tk_status tk_cuda_scatter_add_rows(void *ctx, tk_tensor *din, const tk_tensor *dout,
                                   const tk_tensor *idx, int64_t n, int64_t C) {
    return scatter_add(ctx, "scatter_add_rows", din, dout, idx, n, C);
}

} /* extern "C" */
