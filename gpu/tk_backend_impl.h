/* tk_backend_impl.h — the backend interface; only implementations include it.
 *
 * A backend is a table of function pointers plus a context pointer (as in
 * ggml-backend-impl.h). The public wrappers in tk_gpu.h validate arguments,
 * add each op's FLOPs and bytes to the device's cost counters, and then call
 * the backend's function; an op left NULL is a no-op (the meta backend leaves
 * every op NULL and so does no arithmetic). Memory functions are required for
 * every backend except read/write/sync, whose default is a no-op.
 *
 * The cuda backend lives in a plugin (build/libtk_cuda.so) that exports
 *   tk_status tk_cuda_plugin_open(const tk_dev_opts *opts, const tk_backend **be,
 *                                 void **ctx, tk_err *err);
 * and is loaded with dlopen so that binaries run where no CUDA library is.
 */
#ifndef TK_BACKEND_IMPL_H
#define TK_BACKEND_IMPL_H

#include "tk_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tk_backend {
    const char *name;

    /* memory: segments for the caching allocator (see tk_devmem) */
    int  (*seg_alloc)(void *ctx, size_t bytes, void **ptr);
    void (*seg_free)(void *ctx, void *ptr, size_t bytes);
    /* host <-> device; default no-op */
    tk_status (*write)(void *ctx, void *dev_dst, const void *host_src, size_t bytes, tk_err *err);
    tk_status (*read)(void *ctx, void *host_dst, const void *dev_src, size_t bytes, tk_err *err);
    tk_status (*sync)(void *ctx, tk_err *err);
    void (*info)(void *ctx, tk_dev_info *out);
    void (*destroy)(void *ctx);

    /* ops: the same arguments as the tk_op_* wrappers, ctx instead of the device */
    tk_status (*gemm)(void *ctx, tk_tensor *C, const tk_tensor *A, const tk_tensor *B,
                      const tk_tensor *bias, const tk_gemm *g);
    tk_status (*embed_fwd)(void *ctx, tk_tensor *out, const tk_tensor *ids, const tk_tensor *table,
                           int64_t n, int64_t C);
    tk_status (*embed_bwd)(void *ctx, tk_tensor *dtable, const tk_tensor *ids, const tk_tensor *dout,
                           int64_t n, int64_t C, const tk_tensor *groups, tk_tensor *scratch);
    tk_status (*add)(void *ctx, tk_tensor *out, const tk_tensor *a, const tk_tensor *b, int64_t n);
    tk_status (*axpby)(void *ctx, tk_tensor *y, float alpha, const tk_tensor *x, float beta, int64_t n);
    tk_status (*fill)(void *ctx, tk_tensor *t, float value, int64_t n);
    tk_status (*fill_many)(void *ctx, tk_tensor *const *ts, int n, float value);
    tk_status (*cast)(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n);
    tk_status (*layernorm_fwd)(void *ctx, tk_tensor *out, tk_tensor *mean, tk_tensor *rstd,
                               const tk_tensor *in, const tk_tensor *w, const tk_tensor *b,
                               int64_t N, int64_t C, float eps);
    tk_status (*residual_layernorm_fwd)(void *ctx, tk_tensor *r, tk_tensor *out, tk_tensor *mean,
                                        tk_tensor *rstd, const tk_tensor *x, const tk_tensor *res,
                                        const tk_tensor *w, const tk_tensor *b, int64_t N, int64_t C,
                                        float eps, float p, uint64_t seed, uint64_t offset);
    tk_status (*layernorm_bwd)(void *ctx, tk_tensor *din, tk_tensor *dw, tk_tensor *db,
                               const tk_tensor *dout, const tk_tensor *in, const tk_tensor *w,
                               const tk_tensor *mean, const tk_tensor *rstd,
                               int64_t N, int64_t C, int accumulate, tk_tensor *scratch);
    tk_status (*gelu_fwd)(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n);
    tk_status (*gelu_bwd)(void *ctx, tk_tensor *din, const tk_tensor *in, const tk_tensor *dout, int64_t n);
    tk_status (*tanh_fwd)(void *ctx, tk_tensor *out, const tk_tensor *in, int64_t n);
    tk_status (*tanh_bwd)(void *ctx, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout, int64_t n);
    tk_status (*softmax_fwd)(void *ctx, tk_tensor *out, const tk_tensor *in, const tk_tensor *mask,
                             int64_t B, int64_t NH, int64_t T, float scale);
    tk_status (*softmax_bwd)(void *ctx, tk_tensor *din, const tk_tensor *out, const tk_tensor *dout,
                             int64_t rows, int64_t T, float scale);
    tk_status (*softmax_dropout_fwd)(void *ctx, tk_tensor *P, tk_tensor *PD, const tk_tensor *in,
                                     const tk_tensor *mask, int64_t B, int64_t NH, int64_t T, float scale,
                                     float p, uint64_t seed, uint64_t offset);
    tk_status (*softmax_dropout_bwd)(void *ctx, tk_tensor *din, const tk_tensor *P, const tk_tensor *dPD,
                                     int64_t rows, int64_t T, float scale, float p, uint64_t seed,
                                     uint64_t offset);
    tk_status (*dropout_fwd)(void *ctx, tk_tensor *out, tk_tensor *mask, const tk_tensor *in,
                             int64_t n, float p, uint64_t seed, uint64_t offset);
    tk_status (*dropout_bwd)(void *ctx, tk_tensor *din, const tk_tensor *dout, int64_t n,
                             float p, uint64_t seed, uint64_t offset);
    tk_status (*xent_fwd)(void *ctx, tk_tensor *losses, tk_tensor *probs, const tk_tensor *logits,
                          const tk_tensor *labels, int64_t N, int64_t V);
    tk_status (*xent_bwd)(void *ctx, tk_tensor *dlogits, const tk_tensor *logits,
                          const tk_tensor *labels, int64_t N, int64_t V, float scale);
    tk_status (*bias_grad)(void *ctx, tk_tensor *db, const tk_tensor *dout, int64_t N, int64_t C);
    tk_status (*split_heads)(void *ctx, tk_tensor *out, const tk_tensor *in,
                             int64_t B, int64_t T, int64_t NH, int64_t HS);
    tk_status (*merge_heads)(void *ctx, tk_tensor *out, const tk_tensor *in,
                             int64_t B, int64_t T, int64_t NH, int64_t HS);
    tk_status (*gather_rows)(void *ctx, tk_tensor *out, const tk_tensor *in, const tk_tensor *idx,
                             int64_t n, int64_t C);
    tk_status (*scatter_add_rows)(void *ctx, tk_tensor *din, const tk_tensor *dout,
                                  const tk_tensor *idx, int64_t n, int64_t C);
    tk_status (*sumsq)(void *ctx, tk_tensor *out, const tk_tensor *x, int64_t n, int accumulate);
    tk_status (*sumsq_many)(void *ctx, tk_tensor *out, const tk_tensor *const *xs, int n);
    tk_status (*adamw)(void *ctx, tk_tensor *param, const tk_tensor *grad, tk_tensor *m, tk_tensor *v,
                       int64_t n, const tk_adamw_hp *hp);
    tk_status (*adamw_many)(void *ctx, const tk_adamw_item *items, int n_items, const tk_adamw_hp *hp);
    tk_status (*adamw8)(void *ctx, tk_tensor *param, const tk_tensor *grad,
                        tk_tensor *m, tk_tensor *mscale, tk_tensor *v, tk_tensor *vscale,
                        int64_t n, const tk_adamw_hp *hp);
    /* optional: a backend without them cannot run attention: fused. a->ld
     * is never 0 here (tk_op_attention_* fill in NH*HS). */
    tk_status (*attention_fwd)(void *ctx, tk_tensor *out, tk_tensor *lse, tk_tensor *keep,
                               const tk_tensor *q, const tk_tensor *k, const tk_tensor *v,
                               const tk_tensor *mask, const tk_attn *a);
    tk_status (*attention_bwd)(void *ctx, tk_tensor *dq, tk_tensor *dk, tk_tensor *dv,
                               const tk_tensor *dout, const tk_tensor *q, const tk_tensor *k,
                               const tk_tensor *v, const tk_tensor *out, const tk_tensor *lse,
                               const tk_tensor *keep, const tk_tensor *mask, const tk_attn *a);
} tk_backend;

/* The table's entries as lists, one X(name) each, so that a backend fills
 * its table from them (`#define K(op) .op = cpu_##op,`) and adding an op is
 * a line here, a field above and a function per backend. The device half
 * (memory, copies, GEMM) is named with each backend's private prefix, the
 * kernels with its public one; attention is named in each table by hand. */
#define TK_BACKEND_DEVICE(X) \
    X(seg_alloc) X(seg_free) X(write) X(read) X(sync) X(info) X(destroy) X(gemm)
#define TK_BACKEND_KERNELS(X) \
    X(embed_fwd) X(embed_bwd) X(add) X(axpby) X(fill) X(fill_many) X(cast) \
    X(layernorm_fwd) X(residual_layernorm_fwd) X(layernorm_bwd) X(gelu_fwd) X(gelu_bwd) \
    X(tanh_fwd) X(tanh_bwd) X(softmax_fwd) X(softmax_bwd) X(softmax_dropout_fwd) \
    X(softmax_dropout_bwd) X(dropout_fwd) X(dropout_bwd) X(xent_fwd) X(xent_bwd) \
    X(bias_grad) X(split_heads) X(merge_heads) X(gather_rows) X(scatter_add_rows) \
    X(sumsq) X(sumsq_many) X(adamw) X(adamw_many) X(adamw8)

/* A compute backend's whole table: DEVICE(op) and KERNEL(op) name the
 * functions for TK_BACKEND_DEVICE's and TK_BACKEND_KERNELS' entries. */
#define TK_BACKEND_TABLE(var, name_str, DEVICE, KERNEL, attn_fwd, attn_bwd) \
    static const tk_backend var = {                                   \
        .name = name_str,                                             \
        TK_BACKEND_DEVICE(DEVICE) TK_BACKEND_KERNELS(KERNEL)          \
        .attention_fwd = attn_fwd,                                    \
        .attention_bwd = attn_bwd,                                    \
    }

/* The table ops as one call of the single op per tensor: what a backend
 * without a kernel for a table does (cpu), and a table kernel's reference
 * path (cuda). Inline: the cuda plugin links nothing from libtk. */
typedef tk_status (*tk_fill_fn)(void *ctx, tk_tensor *t, float value, int64_t n);
typedef tk_status (*tk_adamw_fn)(void *ctx, tk_tensor *param, const tk_tensor *grad, tk_tensor *m, tk_tensor *v,
                                 int64_t n, const tk_adamw_hp *hp);
static inline tk_status tk_fill_many_each(void *ctx, tk_fill_fn fill, tk_tensor *const *ts, int n, float value) {
    for (int i = 0; i < n; i++) {
        int64_t e = ts[i]->ndim > 0 ? 1 : 0;
        for (int k = 0; k < ts[i]->ndim; k++) e *= ts[i]->shape[k];
        tk_status st = fill(ctx, ts[i], value, e);
        if (st != TK_OK) return st;
    }
    return TK_OK;
}
static inline tk_status tk_adamw_many_each(void *ctx, tk_adamw_fn adamw, const tk_adamw_item *items, int n,
                                           const tk_adamw_hp *hp) {
    for (int i = 0; i < n; i++) {
        tk_adamw_hp h = *hp;
        tk_adamw_item it = items[i];
        if (it.no_decay) h.weight_decay = 0.0f;
        tk_status st = adamw(ctx, &it.param, &it.grad, &it.m, &it.v, it.n, &h);
        if (st != TK_OK) return st;
    }
    return TK_OK;
}

/* The host backend (OpenBLAS + OpenMP). ctx from tk_cpu_ctx_new. */
const tk_backend *tk_backend_cpu(void);
void *tk_cpu_ctx_new(const tk_dev_opts *opts);

/* The cpu backend's context starts with its thread count, so the units that
 * make up the backend (cpu_backend.c, cpu_attention.c) read it without
 * calling each other. */
typedef struct tk_cpu_ctx_head {
    int threads;         /* for OpenMP regions and OpenBLAS */
} tk_cpu_ctx_head;
static inline int tk_cpu_ctx_threads(void *ctx) { return ((const tk_cpu_ctx_head *)ctx)->threads; }
/* Its fused attention (gpu/cpu_attention.c), registered in the cpu table. */
tk_status tk_cpu_attention_fwd(void *ctx, tk_tensor *out, tk_tensor *lse, tk_tensor *keep,
                               const tk_tensor *q, const tk_tensor *k, const tk_tensor *v,
                               const tk_tensor *mask, const tk_attn *a);
tk_status tk_cpu_attention_bwd(void *ctx, tk_tensor *dq, tk_tensor *dk, tk_tensor *dv,
                               const tk_tensor *dout, const tk_tensor *q, const tk_tensor *k,
                               const tk_tensor *v, const tk_tensor *out, const tk_tensor *lse,
                               const tk_tensor *keep, const tk_tensor *mask, const tk_attn *a);

/* The counting backend: no data, fake addresses, NULL ops. */
const tk_backend *tk_backend_meta(void);
void *tk_meta_ctx_new(const tk_dev_opts *opts);

/* A device over a backend the caller made (tests: the cuda kernels emulated
 * on host threads). Takes ctx: the device destroys it, also on failure. The
 * device's kind is opts->kind. */
tk_dev *tk_dev_new_backend(const tk_dev_opts *opts, const tk_backend *be, void *ctx, tk_err *err);

/* The backend context a device opened (borrowed), for a backend's extra
 * functions such as tk_cuda_mem_totals_get; and a symbol of the loaded cuda
 * plugin (NULL on other devices or when absent). */
void *tk_dev_backend_ctx(tk_dev *d);
void *tk_dev_plugin_sym(tk_dev *d, const char *name);

/* Signature the cuda plugin exports (resolved with dlsym). */
typedef tk_status (*tk_cuda_plugin_open_fn)(const tk_dev_opts *opts, const tk_backend **be,
                                            void **ctx, tk_err *err);

#ifdef __cplusplus
}
#endif
#endif
