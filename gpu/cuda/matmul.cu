/* matmul.cu — the cuda backend's GEMM: cuBLASLt with its epilogues, cuBLAS
 * and the reference bias kernels.
 *
 * Row-major C (M×N) is column-major C^T (N×M) = op(B)^T op(A)^T, so both
 * libraries get B first with m = N, n = M (tk_gemm_colmajor, cuda_shared.h).
 *
 * A linear layer's GEMMs carry their bias work in the library's epilogue
 * (batch 1, fast kernels on):
 *  - forward: CUBLASLT_EPILOGUE_BIAS adds bias[n] to the f32 product before
 *    C's one rounding (the cpu backend adds it at the same point);
 *  - backward, the weight GEMM dW = dout^T x: CUBLASLT_EPILOGUE_BGRADB sums
 *    op(A)'s rows over k (the bias gradient) into g->bgrad_tmp, which one
 *    small add puts into the accumulated bias gradient (the library writes
 *    its sum; gradients accumulate).
 * GELU stays a kernel of its own (elementwise.cu): cuBLASLt's GELU epilogues
 * compute the tanh approximation, BERT's `gelu` is the erf one, and fp32
 * parity with PyTorch is 1e-4.
 * The model hands a 16-bit GEMM its bias's 16-bit copy (bert/model.c), the
 * output's type, which is what cuBLASLt documents for the bias vector.
 * Where cuBLASLt declines a call (its heuristic has no algorithm, an
 * undocumented combination, a misaligned vector), for batched GEMMs, and
 * when the references are asked for, the fallback path runs: a bias pass
 * writes beta C + bias (k_bias_rows2d on a 2-D grid, the reference
 * k_bias_rows for batches and under the references), cuBLAS adds the
 * product, and the bias gradient is added by a two-pass row split
 * (k_bias_grad_part, k_bias_grad_fin: sums in an order fixed by the shapes)
 * or the references k_bias_grad / k_row_sums. Each decline is counted per
 * (shape, epilogue, dtypes) and its first one said on stderr; the table is
 * printed when the device closes (tk_cuda_lt_declines, tk_cuda.h).
 *
 * fp32 stays fp32 (CUBLAS_COMPUTE_32F, no TF32) unless g->tf32 asks for
 * CUBLAS_COMPUTE_32F_FAST_TF32; 16-bit inputs accumulate in fp32 on tensor
 * cores. Workspace: the context's (c->workspace), never one of our own.
 */
#include "cuda_common.cuh"

/* ---- reference kernels ---------------------------------------------------- */

/* C[at] = bias + beta C[at]: the first half of a biased GEMM whose second
 * half is cuBLAS with beta 1. */
__global__ void k_bias_rows(void *Cm, int dtc, const void *bias, int dtb, int64_t M, int64_t N,
                            int64_t strideC, int64_t total, float beta) {
    GRID_STRIDE(k, total) {
        int64_t bi;
        int64_t at = tk_bias_rows_at(k, M, N, strideC, &bi);
        float v = ld(bias, dtb, bi);
        if (beta != 0.0f) v += beta * ld(Cm, dtc, at);
        st(Cm, dtc, at, v);
    }
}

/* db[c] += sum_n dout[n, c], in the column-sum layout of COL_W columns x
 * COL_H row lanes (cuda_common.cuh). */
__global__ void k_bias_grad(void *db, int dtb, const void *dout, int dtg, int64_t N, int64_t C) {
    __shared__ float part[COL_H][COL_W];
    int64_t c = (int64_t)blockIdx.x * COL_W + threadIdx.x;
    float s = 0.0f;
    if (c < C)
        for (int64_t n = threadIdx.y; n < N; n += COL_H) s += ld(dout, dtg, n * C + c);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < COL_H; y++) s += part[y][threadIdx.x];
    st(db, dtb, c, ld(db, dtb, c) + s);
}

/* The fast fallback of a linear layer's bias add (cuBLASLt declined its
 * epilogue; batch 1): C[r, n] = bias[n] + beta C[r, n] on a 2-D grid,
 * columns in x, rows in y (striding past 65535), 32-bit column math and one
 * 64-bit row offset per row: no division per element. */
__global__ void k_bias_rows2d(void *Cm, int dtc, const void *bias, int dtb, int64_t M, int N, float beta) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float b = ld(bias, dtb, n);
    for (int64_t r = blockIdx.y; r < M; r += gridDim.y) {
        const int64_t at = r * N + n;
        st(Cm, dtc, at, beta != 0.0f ? b + beta * ld(Cm, dtc, at) : b);
    }
}

/* The fast bias gradient (db[c] += sum_n dout[n, c]) in two passes that
 * keep every sum's order fixed by the shapes: pass 1, block (column group,
 * split s) sums rows [s*rows, (s+1)*rows) of its COL_W columns as k_bias_grad
 * does (COL_H lanes, then the lanes in order) into part[s*C + c]; pass 2,
 * a thread per column adds the splits' partials in order to db. Many more
 * blocks than k_bias_grad's C/32 for the N = B*T rows of a step. */
__global__ void k_bias_grad_part(float *part, const void *dout, int dtg, int64_t N, int64_t C, int64_t rows) {
    __shared__ float sh[COL_H][COL_W];
    const int64_t c = (int64_t)blockIdx.x * COL_W + threadIdx.x, r0 = (int64_t)blockIdx.y * rows;
    const int64_t r1 = r0 + rows < N ? r0 + rows : N;
    float s = 0.0f;
    if (c < C)
        for (int64_t n = r0 + threadIdx.y; n < r1; n += COL_H) s += ld(dout, dtg, n * C + c);
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < COL_H; y++) s += sh[y][threadIdx.x];
    part[(int64_t)blockIdx.y * C + c] = s;
}

__global__ void k_bias_grad_fin(void *db, int dtb, const float *part, int splits, int64_t C) {
    GRID_STRIDE(c, C) {
        float s = 0.0f;
        for (int i = 0; i < splits; i++) s += part[(int64_t)i * C + c];
        st(db, dtb, c, ld(db, dtb, c) + s);
    }
}

/* db[r] += sum_k a[r, k]: one block per row (the bias gradient of op(A)
 * when A is not transposed). */
__global__ void k_row_sums(float *db, const void *a, int dta, int64_t K) {
    __shared__ float sh[THREADS / 32];
    const int64_t base = (int64_t)blockIdx.x * K;
    float s = 0.0f;
    for (int64_t k = threadIdx.x; k < K; k += THREADS) s += ld(a, dta, base + k);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) db[blockIdx.x] += s;
}

/* y[i] += x[i] over n f32 elements (the epilogue's bias gradient into the
 * accumulated one). */
__global__ void k_acc_f32(float *y, const float *x, int64_t n) {
    GRID_STRIDE(i, n) y[i] += x[i];
}

static tk_status bias_rows(void *ctx, tk_tensor *C, const tk_tensor *bias, const tk_gemm *g) {
    int64_t total = g->m * g->n * g->batch;
    if (total == 0) return TK_OK;
    if (FAST() && g->batch == 1 && g->n <= INT32_MAX) {
        const unsigned gx = (unsigned)((g->n + THREADS - 1) / THREADS), gy = (unsigned)(g->m < 65535 ? g->m : 65535);
        TK_LAUNCH(k_bias_rows2d, dim3(gx, gy), THREADS)(C->data, DT(C), bias->data, DT(bias), g->m, (int)g->n, g->beta);
        TK_CU_LAUNCHED("k_bias_rows2d");
        return TK_OK;
    }
    TK_LAUNCH(k_bias_rows, grid_for(total), THREADS)(C->data, DT(C), bias->data, DT(bias), g->m, g->n,
                                              g->batch > 1 ? g->stride_c : g->m * g->n, total, g->beta);
    TK_CU_LAUNCHED("k_bias_rows");
    return TK_OK;
}

/* db += column sums of dout (N x C): the two-pass row split in the GEMM
 * workspace (free between GEMMs: one stream) when it runs fast and splits
 * pay, else k_bias_grad. */
static tk_status col_sums(void *ctx, tk_tensor *db, const void *dout, int dtg, int64_t N, int64_t C) {
    tk_cuda_ctx *c = CTX;
    const int64_t rows = 256, cap = c->workspace ? (int64_t)(c->workspace_bytes / sizeof(float)) / (C ? C : 1) : 0;
    int64_t splits = (N + rows - 1) / rows;
    splits = splits < cap ? splits : cap;
    splits = splits < 65535 ? splits : 65535;
    if (FAST() && splits > 1) {
        const int64_t per = (N + splits - 1) / splits;
        splits = (N + per - 1) / per;
        float *part = (float *)c->workspace;
        TK_LAUNCH(k_bias_grad_part, dim3((unsigned)((C + COL_W - 1) / COL_W), (unsigned)splits), dim3(COL_W, COL_H))(
            part, dout, dtg, N, C, per);
        TK_CU_LAUNCHED("k_bias_grad_part");
        TK_LAUNCH(k_bias_grad_fin, grid_for(C), THREADS)(db->data, DT(db), part, (int)splits, C);
        TK_CU_LAUNCHED("k_bias_grad_fin");
        return TK_OK;
    }
    TK_LAUNCH(k_bias_grad, (unsigned)((C + COL_W - 1) / COL_W), dim3(COL_W, COL_H))(db->data, DT(db), dout, dtg, N, C);
    TK_CU_LAUNCHED("k_bias_grad");
    return TK_OK;
}

/* g->bgrad += sum_k op(A)[i, k]: a column sum of A stored K x M, else row sums. */
static tk_status bias_grad_ref(void *ctx, const tk_tensor *A, const tk_gemm *g) {
    if (g->m == 0) return TK_OK;
    if (g->trans_a) return col_sums(ctx, g->bgrad, A->data, DT(A), g->k, g->m);
    if (g->m > INT32_MAX) return bad("gemm", "more than 2^31 bias-gradient rows");
    TK_LAUNCH(k_row_sums, (unsigned)g->m, THREADS)((float *)g->bgrad->data, A->data, DT(A), g->k);
    TK_CU_LAUNCHED("k_row_sums (gemm bias gradient)");
    return TK_OK;
}

extern "C" {

tk_status tk_cuda_bias_grad(void *ctx, tk_tensor *db, const tk_tensor *dout, int64_t N, int64_t C) {
    NEED_FLOAT("bias_grad", db); NEED_FLOAT("bias_grad", dout);
    if (C == 0) return TK_OK;
    return col_sums(ctx, db, dout->data, DT(dout), N, C);
}

#define OP_FAIL(...) (fprintf(stderr, "txkernel cuda: " __VA_ARGS__), fputc('\n', stderr), TK_EINVAL)

} /* extern "C" */

/* ---- cuBLASLt's declines, counted ----------------------------------------
 * Every GEMM that asks cuBLASLt for an epilogue is counted per (shape,
 * epilogue, dtypes), and so is each one the reference path ran instead
 * (tk_cuda_lt_gemm's `declined`, a TK_LT_* reason). The first decline of a
 * key says so on stderr; the table's declined keys are printed when the
 * device closes (tk_cuda_lt_stats_close); tk_cuda_lt_declines reads the
 * totals (the GPU tests hold the model's combinations to 0 from sm80). */
#define LT_KEYS 64
typedef struct lt_count {
    int64_t m, n, k;
    int epi, dta, dtc, dtb, why; /* epi: 1 bias, 2 bias gradient; why: the first decline's */
    uint64_t calls, declined;
} lt_count;
typedef struct lt_stats {
    int n;
    uint64_t calls, declined; /* all keys, those past LT_KEYS too */
    lt_count e[LT_KEYS];
} lt_stats;

static const char *lt_why(int why) {
    switch (why) {
    case TK_LT_BOTH: return "bias and bias gradient in one GEMM: no single epilogue does both";
    case TK_LT_ALIGN: return "the bias vector is not 16-byte aligned";
    case TK_LT_DTYPE: return "a bias dtype other than the output's (cuBLASLt documents the output's)";
    case TK_LT_NO_LT: return "no cuBLASLt handle";
    case TK_LT_NO_ALGO: return "cuBLASLt's heuristic has no algorithm for it";
    case TK_LT_REFUSED: return "cublasLtMatmul refused the algorithm its heuristic offered";
    default: return "declined";
    }
}

/* (the plugin links nothing of libtk: no tk_dtype_name) */
static const char *lt_dt(int dt) { return dt == TK_F32 ? "f32" : dt == TK_F16 ? "f16" : dt == TK_BF16 ? "bf16" : "?"; }

static void lt_note(tk_cuda_ctx *c, const tk_tensor *A, const tk_tensor *C, const tk_tensor *bias, const tk_gemm *g,
                    int why) {
    if (!c->lt_stats && !(c->lt_stats = calloc(1, sizeof(lt_stats)))) return;
    lt_stats *s = (lt_stats *)c->lt_stats;
    const int epi = bias ? 1 : 2, dtb = bias ? (int)bias->dtype : g->bgrad_tmp ? (int)g->bgrad_tmp->dtype : -1;
    s->calls++;
    s->declined += why != 0;
    lt_count *e = NULL;
    for (int i = 0; i < s->n && !e; i++)
        if (s->e[i].m == g->m && s->e[i].n == g->n && s->e[i].k == g->k && s->e[i].epi == epi &&
            s->e[i].dta == (int)A->dtype && s->e[i].dtc == (int)C->dtype && s->e[i].dtb == dtb)
            e = &s->e[i];
    if (!e && s->n < LT_KEYS) {
        e = &s->e[s->n++];
        *e = (lt_count){ g->m, g->n, g->k, epi, (int)A->dtype, (int)C->dtype, dtb, 0, 0, 0 };
    }
    if (!e) return;
    e->calls++;
    if (why && !e->declined++) {
        e->why = why;
        fprintf(stderr, "txkernel cuda: cuBLASLt declined the %s epilogue of GEMM M=%lld N=%lld K=%lld (A %s, C %s, "
                "%s %s): %s; the reference path runs it (counted; the table prints when the device closes)\n",
                epi == 1 ? "bias" : "bias-gradient", (long long)g->m, (long long)g->n, (long long)g->k,
                lt_dt(A->dtype), lt_dt(C->dtype), epi == 1 ? "bias" : "bias gradient", lt_dt(dtb), lt_why(why));
    }
}

extern "C" {

void tk_cuda_lt_declines(void *ctx, uint64_t *calls, uint64_t *declined, char *report, size_t n) {
    const lt_stats *s = (const lt_stats *)((tk_cuda_ctx *)ctx)->lt_stats;
    *calls = s ? s->calls : 0;
    *declined = s ? s->declined : 0;
    if (!report || !n) return;
    size_t at = (size_t)snprintf(report, n, "cuBLASLt epilogues: %llu GEMMs of %d shapes, %llu declined",
                                 (unsigned long long)*calls, s ? s->n : 0, (unsigned long long)*declined);
    for (int i = 0; s && i < s->n && at < n; i++) {
        const lt_count *e = &s->e[i];
        if (!e->declined) continue;
        at += (size_t)snprintf(report + at, n - at, "\n  M=%lld N=%lld K=%lld %s (A %s, C %s, %s): %llu of %llu "
                               "declined: %s", (long long)e->m, (long long)e->n, (long long)e->k,
                               e->epi == 1 ? "bias" : "bias gradient", lt_dt(e->dta), lt_dt(e->dtc), lt_dt(e->dtb),
                               (unsigned long long)e->declined, (unsigned long long)e->calls, lt_why(e->why));
    }
}

void tk_cuda_lt_reset(void *ctx) {
    tk_cuda_ctx *c = (tk_cuda_ctx *)ctx;
    free(c->lt_stats);
    c->lt_stats = NULL;
}

void tk_cuda_lt_stats_close(tk_cuda_ctx *c) {
    uint64_t calls, declined;
    char buf[2048];
    tk_cuda_lt_declines(c, &calls, &declined, buf, sizeof buf);
    if (calls) fprintf(stderr, "txkernel cuda: %s\n", buf);
    tk_cuda_lt_reset(c);
}

tk_status cu_gemm(void *ctx, tk_tensor *C, const tk_tensor *A, const tk_tensor *B, const tk_tensor *bias,
                  const tk_gemm *g) {
    tk_cuda_ctx *c = CTX;
    const int64_t M = g->m, N = g->n, K = g->k, batch = g->batch;
    if (M == 0 || N == 0 || batch == 0) return TK_OK;
    const char *why = tk_cuda_gemm_refusal(A, B, C, M, N, K, batch);
    if (why)
        return OP_FAIL("gemm (M=%lld N=%lld K=%lld batch=%lld, dtypes A %d B %d C %d): %s", (long long)M,
                       (long long)N, (long long)K, (long long)batch, (int)A->dtype, (int)B->dtype,
                       (int)C->dtype, why);
    tk_status st;
    if (FAST() && batch == 1 && (bias || g->bgrad)) {
        int declined = 0;
        st = tk_cuda_lt_gemm(c, C, A, B, bias, g, &declined);
        if (st != TK_OK) return st;
        lt_note(c, A, C, bias, g, declined);
        if (!declined) {
            if (!g->bgrad) return TK_OK;
            TK_LAUNCH(k_acc_f32, grid_for(M), THREADS)((float *)g->bgrad->data, (const float *)g->bgrad_tmp->data, M);
            TK_CU_LAUNCHED("k_acc_f32 (gemm bias gradient)");
            return TK_OK;
        }
    }
    float beta = g->beta;
    if (bias) {
        if ((st = bias_rows(ctx, C, bias, g)) != TK_OK) return st;
        beta = 1.0f;
    }
    if ((st = tk_cuda_blas_gemm(c, C, A, B, g, beta)) != TK_OK) return st;
    return g->bgrad ? bias_grad_ref(ctx, A, g) : TK_OK;
}

} /* extern "C" */

/* ---- the libraries (the emulation supplies its own) ----------------------- */

#ifndef TK_CUDA_EMU

static int blas_dtype(tk_dtype dt, cudaDataType_t *out) {
    switch (dt) {
    case TK_F32: *out = CUDA_R_32F; return 0;
    case TK_F16: *out = CUDA_R_16F; return 0;
    case TK_BF16: *out = CUDA_R_16BF; return 0;
    default: return -1;
    }
}

static cublasComputeType_t compute_type(const tk_tensor *A, const tk_gemm *g) {
    return A->dtype == TK_F32 && g->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

extern "C" tk_status tk_cuda_blas_gemm(tk_cuda_ctx *c, tk_tensor *C, const tk_tensor *A, const tk_tensor *B,
                                       const tk_gemm *g, float beta) {
    cudaDataType_t ta, tb, tc;
    if (blas_dtype(A->dtype, &ta) || blas_dtype(B->dtype, &tb) || blas_dtype(C->dtype, &tc))
        return OP_FAIL("gemm: A, B and C must be f32, f16 or bf16");
    tk_gemm_cm cm = tk_gemm_colmajor(g->trans_a, g->trans_b, g->m, g->n, g->k);
    float alpha = g->alpha;
    cublasStatus_t s = cublasGemmStridedBatchedEx(
        c->blas, cm.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N, cm.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N,
        (int)cm.m, (int)cm.n, (int)cm.k, &alpha,
        B->data, tb, (int)cm.ld_first, (long long)g->stride_b,
        A->data, ta, (int)cm.ld_second, (long long)g->stride_a, &beta,
        C->data, tc, (int)cm.ldc, (long long)g->stride_c, (int)g->batch,
        compute_type(A, g), CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "txkernel cuda: %s:%d: cublasGemmStridedBatchedEx(M=%lld N=%lld K=%lld "
                "batch=%lld) failed: %s\n", __FILE__, __LINE__, (long long)g->m, (long long)g->n,
                (long long)g->k, (long long)g->batch, tk_cublas_status_str(s));
        return TK_EDEVICE;
    }
    return TK_OK;
}

/* The workspace cuBLASLt may use: the one the device bound to the context
 * (tk_cuda_bind_buffers), which cuBLAS works in too. */
static size_t lt_workspace_bytes(const tk_cuda_ctx *c) { return c->workspace ? c->workspace_bytes : 0; }

/* Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic
 * must only offer algorithms that work at that alignment. */
static uint32_t align_of(const void *p) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p % a)) a >>= 1;
    return a;
}

/* What the heuristic chose, by everything it was asked (a step asks the same
 * few shapes every time, and asking costs tens of microseconds of host
 * time), with the descriptors it was asked with: the matmul descriptor and
 * the three layouts are made once per key and kept (only the bias pointer
 * changes between calls: set on each), so a step's GEMMs create and destroy
 * nothing (issue 43). */
typedef struct lt_key {
    int64_t m, n, k;
    int ta, tb, dta, dtc, dtbias, epi, beta0, tf32;
    uint32_t al[4];
} lt_key;
typedef struct lt_entry {
    lt_key key;
    int found;                   /* 0: the library has no algorithm (declined) */
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
} lt_entry;
#define LT_CACHE 64
typedef struct lt_cache {
    int n, next;
    lt_entry e[LT_CACHE];
} lt_cache;

static void lt_entry_clear(lt_entry *e) {
    if (e->lc) cublasLtMatrixLayoutDestroy(e->lc);
    if (e->lb) cublasLtMatrixLayoutDestroy(e->lb);
    if (e->la) cublasLtMatrixLayoutDestroy(e->la);
    if (e->op) cublasLtMatmulDescDestroy(e->op);
    memset(e, 0, sizeof *e);
}

extern "C" void tk_cuda_matmul_release(tk_cuda_ctx *c) {
    lt_cache *cache = (lt_cache *)c->lt_cache;
    for (int i = 0; cache && i < cache->n; i++) lt_entry_clear(&cache->e[i]);
    if (c->lt) cublasLtDestroy(c->lt);
    c->lt = NULL;
    free(c->lt_cache);
    c->lt_cache = NULL;
}

#define LT_TRY(call) do { cublasStatus_t _s = (call); if (_s != CUBLAS_STATUS_SUCCESS) { \
    fprintf(stderr, "txkernel cuda: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
            tk_cublas_status_str(_s)); st = TK_EDEVICE; goto out; } } while (0)

/* A new entry's descriptors and algorithm (e->found 0: none). */
static tk_status lt_entry_make(tk_cuda_ctx *c, lt_entry *e, const tk_gemm *g, const tk_tensor *A,
                               cudaDataType_t ta, cudaDataType_t tb, cudaDataType_t tc, cudaDataType_t tbias,
                               cublasLtEpilogue_t epi, int has_vec, size_t ws) {
    tk_status st = TK_OK;
    cublasLtMatmulPreference_t pref = NULL;
    tk_gemm_cm cm = tk_gemm_colmajor(g->trans_a, g->trans_b, g->m, g->n, g->k);
    cublasOperation_t opa = cm.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N, opb = cm.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_TRY(cublasLtMatmulDescCreate(&e->op, compute_type(A, g), CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    LT_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (has_vec)
        LT_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &tbias, sizeof tbias));
    /* the first operand is our B (cm.m x cm.k after op), the second our A */
    LT_TRY(cublasLtMatrixLayoutCreate(&e->la, tb, cm.trans_first ? cm.k : cm.m, cm.trans_first ? cm.m : cm.k,
                                      cm.ld_first));
    LT_TRY(cublasLtMatrixLayoutCreate(&e->lb, ta, cm.trans_second ? cm.n : cm.k, cm.trans_second ? cm.k : cm.n,
                                      cm.ld_second));
    LT_TRY(cublasLtMatrixLayoutCreate(&e->lc, tc, cm.m, cm.n, cm.ldc));
    {
        const lt_key *key = &e->key;
        LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->al[1],
                                                    sizeof key->al[1]));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->al[0],
                                                    sizeof key->al[0]));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->al[2],
                                                    sizeof key->al[2]));
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->al[2],
                                                    sizeof key->al[2]));
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        memset(&res, 0, sizeof res);
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(c->lt, e->op, e->la, e->lb, e->lc, e->lc, pref, 1, &res,
                                                           &found);
        e->found = hs == CUBLAS_STATUS_SUCCESS && found > 0;
        if (e->found) e->algo = res.algo;
    }
out:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

extern "C" tk_status tk_cuda_lt_gemm(tk_cuda_ctx *c, tk_tensor *C, const tk_tensor *A, const tk_tensor *B,
                                     const tk_tensor *bias, const tk_gemm *g, int *declined) {
    cudaDataType_t ta, tb, tc, tbias = CUDA_R_32F;
    *declined = 0;
    if (blas_dtype(A->dtype, &ta) || blas_dtype(B->dtype, &tb) || blas_dtype(C->dtype, &tc) ||
        (bias && blas_dtype(bias->dtype, &tbias))) {
        *declined = TK_LT_DTYPE;
        return TK_OK;
    }
    if (!c->lt && cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
        c->lt = NULL;
        *declined = TK_LT_NO_LT; /* no cuBLASLt here: the cuBLAS path computes the same */
        return TK_OK;
    }
    if (!c->lt_cache && !(c->lt_cache = calloc(1, sizeof(lt_cache)))) {
        *declined = TK_LT_NO_LT;
        return TK_OK;
    }
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (g->bgrad) epi = bias ? CUBLASLT_EPILOGUE_DEFAULT : CUBLASLT_EPILOGUE_BGRADB;
    const void *bptr = bias ? bias->data : g->bgrad ? g->bgrad_tmp->data : NULL;
    if ((bias && g->bgrad) || (bptr && !aligned16(bptr))) { /* no single epilogue does both; a vector
                                                             * cuBLASLt may not take: the reference path */
        *declined = bias && g->bgrad ? TK_LT_BOTH : TK_LT_ALIGN;
        return TK_OK;
    }
    lt_key key;
    memset(&key, 0, sizeof key);
    key.m = g->m; key.n = g->n; key.k = g->k; key.ta = g->trans_a; key.tb = g->trans_b;
    key.dta = A->dtype; key.dtc = C->dtype; key.dtbias = bptr ? (int)tbias : -1; key.epi = (int)epi;
    key.beta0 = g->beta == 0.0f; key.tf32 = g->tf32 && A->dtype == TK_F32;
    key.al[0] = align_of(A->data); key.al[1] = align_of(B->data); key.al[2] = align_of(C->data);
    key.al[3] = bptr ? align_of(bptr) : 0;

    tk_status st = TK_OK;
    const size_t ws = lt_workspace_bytes(c);
    float alpha = g->alpha, beta = g->beta;
    lt_cache *cache = (lt_cache *)c->lt_cache;
    lt_entry *hit = NULL;
    for (int i = 0; i < cache->n && !hit; i++)
        if (!memcmp(&cache->e[i].key, &key, sizeof key)) hit = &cache->e[i];
    if (!hit) {
        hit = &cache->e[cache->n < LT_CACHE ? cache->n++ : (cache->next++ % LT_CACHE)];
        lt_entry_clear(hit);
        hit->key = key;
        st = lt_entry_make(c, hit, g, A, ta, tb, tc, tbias, epi, bptr != NULL, ws);
        if (st != TK_OK) {
            lt_entry_clear(hit); /* its key is zeroed: no GEMM matches it */
            return st;
        }
    }
    if (!hit->found) {
        *declined = TK_LT_NO_ALGO;
        return TK_OK;
    }
    if (bptr) LT_TRY(cublasLtMatmulDescSetAttribute(hit->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bptr, sizeof bptr));
    {
        cublasStatus_t ms = cublasLtMatmul(c->lt, hit->op, &alpha, B->data, hit->la, A->data, hit->lb, &beta, C->data,
                                           hit->lc, C->data, hit->lc, &hit->algo, c->workspace, ws, 0);
        if (ms == CUBLAS_STATUS_NOT_SUPPORTED || ms == CUBLAS_STATUS_INVALID_VALUE) {
            /* an algorithm the heuristic offered that refuses these pointers
             * (the bias's alignment is not in the preference): not again */
            hit->found = 0;
            *declined = TK_LT_REFUSED;
        } else if (ms != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "txkernel cuda: %s:%d: cublasLtMatmul(M=%lld N=%lld K=%lld) failed: %s\n", __FILE__,
                    __LINE__, (long long)g->m, (long long)g->n, (long long)g->k, tk_cublas_status_str(ms));
            st = TK_EDEVICE;
        }
    }
out:
    return st;
}

#endif /* !TK_CUDA_EMU */
