/* cuda_emu_backend.cpp — a "cuda" device whose ops are gpu/cuda/'s kernel
 * files themselves (cuda_ops.cu, attention.cu), compiled for the host and
 * run on fibers by cuda_emu.h.
 *
 * Memory is host memory. GEMM is the plugin's cu_gemm with cuBLAS swapped
 * for the cpu backend's GEMM (cuBLAS is not ours to emulate): the same
 * refusals (tk_cuda_gemm_refusal: one dtype for A and B, ...) and the bias
 * added first by the plugin's own k_bias_rows. Every other op, fused
 * attention included, is the plugin's wrapper and kernel with its launch
 * shape. The device says it is compute capability 8.0, so fused attention
 * picks the sm80 tensor-core kernel for f16/bf16 (TXK_ATTN_KERNEL=sm75 or
 * reference pick the others, as on a card). tk_cuda_emu_open() gives the device; tests/gpu_cuda/gpu_ops.c and
 * gpu_model.c built with -DTK_CUDA_EMU compare it with the cpu backend
 * during `make test`.
 */
#include <new>
#include "cuda_emu.h"
#include "../../gpu/cuda/cuda_ops.cu"
#include "../../gpu/cuda/attention.cu"

namespace {

enum { TK_EMU_CC_MAJOR = 8, TK_EMU_CC_MINOR = 0 };

struct emu_ctx {
    tk_cuda_ctx cu;   /* first: the wrappers cast ctx to tk_cuda_ctx */
    void *cpu;        /* the cpu backend's context, for GEMM */
    unsigned flags;   /* the kernels' sticky error word */
    double red[TK_CUDA_RED_BLOCKS];
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
    const tk_backend *cpu = tk_backend_cpu();
    if (c->cpu && cpu->destroy) cpu->destroy(c->cpu);
    delete c;
}

tk_status emu_gemm(void *vctx, tk_tensor *C, const tk_tensor *A, const tk_tensor *B, const tk_tensor *bias,
                   int transA, int transB, int64_t M, int64_t N, int64_t K, int64_t batch, int64_t strideA,
                   int64_t strideB, int64_t strideC, float alpha, float beta) {
    emu_ctx *c = (emu_ctx *)vctx;
    if (M == 0 || N == 0 || batch == 0) return TK_OK;
    const char *why = tk_cuda_gemm_refusal(A, B, C, M, N, K, batch);
    if (why) {
        fprintf(stderr, "txkernel cuda (emulated): gemm (M=%lld N=%lld K=%lld): %s\n", (long long)M,
                (long long)N, (long long)K, why);
        return TK_EINVAL;
    }
    if (bias) {
        tk_status st = tk_cuda_bias_rows(c, C, bias, M, N, batch, strideC, beta);
        if (st != TK_OK) return st;
        beta = 1.0f;
    }
    return tk_backend_cpu()->gemm(c->cpu, C, A, B, NULL, transA, transB, M, N, K, batch, strideA, strideB,
                                  strideC, alpha, beta);
}

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
    b.gemm = emu_gemm;
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
    tk_dev_opts opts = {};
    opts.kind = TK_DEV_CUDA;
    return tk_dev_new_backend(&opts, &emu_backend, c, err);
}
