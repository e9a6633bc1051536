/* cuda_emu_backend.cpp — a "cuda" device whose ops are the plugin's kernel
 * files (every .cu file of gpu/cuda) themselves, compiled for the host into this one
 * translation unit and run on threads by cuda_emu.h.
 *
 * Memory is host memory. GEMM is the plugin's cu_gemm (matmul.cu: its
 * refusals, its choice between the epilogue path and the reference bias
 * kernels) with the two library calls under it swapped for the cpu
 * backend's GEMM (cuBLAS and cuBLASLt are not ours to emulate): "cuBLASLt"
 * here adds the bias to the f32 product and writes the bias gradient's sum,
 * as the library's epilogues do. Every other op, fused attention included,
 * is the plugin's launcher and kernel with its launch shape, fast or
 * reference (tk_cuda_set_reference). The device says it is compute
 * capability 8.0, so fused attention picks the sm80 tensor-core kernel for
 * f16/bf16 (TXK_ATTN_KERNEL=sm75 or reference pick the others, as on a card). tk_cuda_emu_open() gives the device;
 * tests/gpu_cuda/gpu_ops.c and gpu_model.c built with -DTK_CUDA_EMU compare
 * it with the cpu backend during `make test`.
 */
#include <new>
#include "cuda_emu.h"
/* every kernel file of the plugin (a file missing here leaves its
 * launchers undefined and the link fails) */
#include "../../gpu/cuda/classifier.cu"
#include "../../gpu/cuda/elementwise.cu"
#include "../../gpu/cuda/embedding.cu"
#include "../../gpu/cuda/heads.cu"
#include "../../gpu/cuda/layernorm.cu"
#include "../../gpu/cuda/matmul.cu"
#include "../../gpu/cuda/optimizer.cu"
#include "../../gpu/cuda/softmax_dropout.cu"
#include "../../gpu/cuda/cuda_reference.c"
#include "../../gpu/cuda/attention.cu"

namespace {

enum { TK_EMU_CC_MAJOR = 8, TK_EMU_CC_MINOR = 0 };

struct emu_ctx {
    tk_cuda_ctx cu;   /* first: the wrappers cast ctx to tk_cuda_ctx */
    void *cpu;        /* the cpu backend's context, for GEMM */
    unsigned flags;   /* the kernels' sticky error word */
    double red[TK_CUDA_RED_BLOCKS];
    alignas(256) float ws[1 << 16]; /* the GEMM workspace: 256 KiB (the fast bias gradient's partial sums) */
};

int emu_seg_alloc(void *, size_t bytes, void **ptr) {
    *ptr = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    return *ptr ? 0 : 1;
}

void emu_seg_free(void *, void *ptr, size_t) { free(ptr); }

tk_status emu_copy(void *, void *dst, const void *src, size_t bytes, tk_err *) {
    if (bytes) memcpy(dst, src, bytes);
    return TK_OK;
}

tk_status emu_sync(void *vctx, tk_err *err) {
    emu_ctx *c = (emu_ctx *)vctx;
    unsigned f = __atomic_exchange_n(&c->flags, 0u, __ATOMIC_SEQ_CST);
    if (f & TK_CUDA_FLAG_BAD_INDEX)
        return tk_cuda_fail(err, TK_EINVAL, "an op read an index outside its table (emulated cuda)");
    return TK_OK;
}

void emu_info(void *, tk_dev_info *out) {
    memset(out, 0, sizeof *out);
    out->kind = TK_DEV_CUDA;
    snprintf(out->name, sizeof out->name, "cuda kernels emulated on host threads");
    out->cc_major = TK_EMU_CC_MAJOR;
    out->cc_minor = TK_EMU_CC_MINOR;
    out->total = out->free_bytes = (size_t)1 << 30;
}

void emu_destroy(void *vctx) {
    emu_ctx *c = (emu_ctx *)vctx;
    tk_cuda_lt_stats_close(&c->cu);
    const tk_backend *cpu = tk_backend_cpu();
    if (c->cpu && cpu->destroy) cpu->destroy(c->cpu);
    delete c;
}

} /* namespace */

/* cuBLAS: the cpu backend's GEMM with g's shape and the given beta. */
extern "C" tk_status tk_cuda_blas_gemm(tk_cuda_ctx *c, tk_tensor *C, const tk_tensor *A, const tk_tensor *B,
                                       const tk_gemm *g, float beta) {
    tk_gemm plain = *g;
    plain.beta = beta;
    plain.bgrad = plain.bgrad_tmp = NULL;
    return tk_backend_cpu()->gemm(((emu_ctx *)c)->cpu, C, A, B, NULL, &plain);
}

/* cuBLASLt's epilogues: the cpu backend adds the bias to the f32 product
 * (as the BIAS epilogue), and the bias gradient's sum goes to bgrad_tmp,
 * written, not added (as BGRADB). Declined as the plugin declines (both at
 * once, a misaligned vector) and as cuBLASLt documents: the bias (or bias
 * gradient) vector's type is the output's (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
 * "default: the same as the matrix D data type"; its tables list no other
 * for f16/bf16/f32 outputs), so a GEMM that hands a 16-bit output an f32
 * bias runs the reference path here as it may on a card. */
extern "C" tk_status tk_cuda_lt_gemm(tk_cuda_ctx *c, tk_tensor *C, const tk_tensor *A, const tk_tensor *B,
                                     const tk_tensor *bias, const tk_gemm *g, int *declined) {
    emu_ctx *e = (emu_ctx *)c;
    const tk_tensor *vec = bias ? bias : g->bgrad ? g->bgrad_tmp : NULL;
    *declined = bias && g->bgrad ? TK_LT_BOTH
              : vec && (uintptr_t)vec->data % 16 ? TK_LT_ALIGN
              : vec && vec->dtype != C->dtype ? TK_LT_DTYPE : 0;
    if (*declined) return TK_OK;
    tk_gemm lt = *g;
    if (g->bgrad) {
        memset(g->bgrad_tmp->data, 0, (size_t)g->m * sizeof(float));
        lt.bgrad = g->bgrad_tmp;
    }
    return tk_backend_cpu()->gemm(e->cpu, C, A, B, bias, &lt);
}

void tk_cuda_matmul_release(tk_cuda_ctx *) {}

namespace {

tk_backend make_table() {
    tk_backend b;
    memset(&b, 0, sizeof b);
    b.name = "cuda-emu";
    b.seg_alloc = emu_seg_alloc;
    b.seg_free = emu_seg_free;
    b.write = emu_copy;
    b.read = emu_copy;
    b.sync = emu_sync;
    b.info = emu_info;
    b.destroy = emu_destroy;
    b.gemm = cu_gemm;
#define EMU_KERNEL(op) b.op = tk_cuda_##op;
    TK_BACKEND_KERNELS(EMU_KERNEL)
#undef EMU_KERNEL
    b.attention_fwd = tk_cuda_attention_fwd;
    b.attention_bwd = tk_cuda_attention_bwd;
    return b;
}

const tk_backend emu_backend = make_table();

} /* namespace */

extern "C" tk_dev *tk_cuda_emu_open(tk_err *err) {
    emu_ctx *c = new (std::nothrow) emu_ctx();
    if (!c) {
        tk_err_set(err, TK_ENOMEM, "out of host memory for the emulated cuda device");
        return NULL;
    }
    tk_dev_opts cpu_opts = {};
    cpu_opts.kind = TK_DEV_CPU;
    c->cpu = tk_cpu_ctx_new(&cpu_opts);
    c->cu.cc_major = TK_EMU_CC_MAJOR;
    c->cu.cc_minor = TK_EMU_CC_MINOR;
    c->cu.flags = &c->flags;
    c->cu.red = c->red;
    c->cu.workspace = c->ws;
    c->cu.workspace_bytes = sizeof c->ws;
    tk_dev_opts opts = {};
    opts.kind = TK_DEV_CUDA;
    return tk_dev_new_backend(&opts, &emu_backend, c, err);
}
