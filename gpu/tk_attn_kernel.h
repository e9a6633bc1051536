/* tk_attn_kernel.h — which kernel the cuda backend's fused attention runs.
 *
 * One rule, static inline so that the cuda plugin (gpu/cuda/attention.cu,
 * which links nothing of libtk) applies it and the plan and %txdevice, which
 * say what will run, read the same lines.
 *
 * The tensor-core kernels (attention.cu: FlashAttention-2's recurrence on
 * mma.sync, no (T,T) matrix) take q, k, v and out (in backward also dout,
 * dq, dk, dv) all of one 16-bit dtype and a head size of 64 (every BERT
 * size has it) or 16 (tiny test models), any T:
 *   sm80 and newer   m16n8k16, f16 or bf16                    "mma m16n8k16"
 *   sm75 (T4)        m16n8k8, f16 only                         "mma m16n8k8"
 * Everything else runs the reference kernel (cuda_attention.h, fp32 cores):
 * f32 tensors, mixed dtypes, other head sizes, bf16 on sm75 (its tensor
 * cores take f16 only, and converting bf16 gradients to f16 would flush the
 * small ones), cards below sm75. At run time the plugin also falls back when
 * a tensor's rows are not 16-byte aligned (a row stride or a view offset
 * that is not a multiple of 8 elements); the model's tensors always are.
 *
 * TXK_ATTN_KERNEL (environment) overrides "auto" (unset or empty):
 *   reference   the reference kernel for every call (timing, bisecting);
 *   sm75        the sm75 path (m16n8k8, f16) on any card from sm75 up, so the
 *               GPU suite checks T4's kernel on an H100.
 * Any other value is refused with a message naming the variable.
 */
#ifndef TK_ATTN_KERNEL_H
#define TK_ATTN_KERNEL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "tk_gpu.h"

typedef enum { TK_ATTN_KERNEL_REFERENCE = 0, TK_ATTN_KERNEL_SM75, TK_ATTN_KERNEL_SM80 } tk_attn_kernel;

/* TXK_ATTN_KERNEL's values. */
enum { TK_ATTN_ASK_AUTO = 0, TK_ATTN_ASK_REFERENCE, TK_ATTN_ASK_SM75, TK_ATTN_ASK_BAD = -1 };
#define TK_ATTN_KERNEL_ENV "TXK_ATTN_KERNEL"
#define TK_ATTN_KERNEL_VALUES "auto, reference or sm75"

/* The value of TXK_ATTN_KERNEL (NULL when unset) as TK_ATTN_ASK_*. */
static inline int tk_attn_kernel_ask(const char *v) {
    if (!v || !v[0] || strcmp(v, "auto") == 0) return TK_ATTN_ASK_AUTO;
    if (strcmp(v, "reference") == 0) return TK_ATTN_ASK_REFERENCE;
    if (strcmp(v, "sm75") == 0) return TK_ATTN_ASK_SM75;
    return TK_ATTN_ASK_BAD;
}

/* Head sizes the tensor-core kernels are built for: each is 9 more kernels
 * for each of the plugin's 7 architectures, so only the ones models use.
 * libtk_cuda.so measured 12.0 MB without these kernels and 18.1 MB with
 * head sizes 64 and 16; built with -lineinfo, 33.5 MB, and 44.0 MB with 32
 * as well. */
static inline int tk_attn_kernel_hs_ok(int64_t HS) { return HS == 16 || HS == 64; }

/* The kernel for a card of compute capability cc_major.cc_minor, tensors of
 * dtype dt (TK_F32 when they are not all one dtype), head size HS (0: not
 * known: the rule for 64) and ask (tk_attn_kernel_ask; BAD counts as auto).
 * *why (may be NULL) gets a phrase saying why that kernel (static string). */
static inline tk_attn_kernel tk_attn_kernel_pick(int cc_major, int cc_minor, tk_dtype dt, int64_t HS, int ask,
                                                 const char **why) {
    const char *w;
    tk_attn_kernel k = TK_ATTN_KERNEL_REFERENCE;
    const int cc = cc_major * 10 + cc_minor;
    if (ask == TK_ATTN_ASK_REFERENCE)
        w = "TXK_ATTN_KERNEL=reference";
    else if (cc < 75)
        w = "the card is below sm75 (no mma.sync)";
    else if (dt != TK_F16 && dt != TK_BF16)
        w = "f32 tensors (the tensor-core kernel takes f16 or bf16)";
    else if (HS && !tk_attn_kernel_hs_ok(HS))
        w = "a head size other than 64 or 16";
    else if ((cc < 80 || ask == TK_ATTN_ASK_SM75) && dt == TK_BF16)
        w = cc < 80 ? "bf16 on sm75 (its tensor cores take f16; bf16 needs sm80)"
                    : "bf16 with TXK_ATTN_KERNEL=sm75 (sm75's tensor cores take f16)";
    else if (cc < 80 || ask == TK_ATTN_ASK_SM75) {
        k = TK_ATTN_KERNEL_SM75;
        w = cc < 80 ? "tensor cores, mma.sync m16n8k8 (sm75)" : "TXK_ATTN_KERNEL=sm75: mma.sync m16n8k8";
    } else {
        k = TK_ATTN_KERNEL_SM80;
        w = "tensor cores, mma.sync m16n8k16 (sm80+)";
    }
    if (why) *why = w;
    return k;
}

/* One line saying which kernel runs fused attention on such a card and why:
 * "tensor cores, mma.sync m16n8k16 (sm80+); head size 64, bf16" or "the
 * reference kernel (fp32 cores): f32 tensors (...)". ask as above, with
 * TK_ATTN_ASK_BAD saying that the value is refused. Returns k. */
static inline tk_attn_kernel tk_attn_kernel_line(char *buf, size_t n, int cc_major, int cc_minor, tk_dtype dt,
                                                 int64_t HS, int ask) {
    const char *why;
    if (ask == TK_ATTN_ASK_BAD) {
        snprintf(buf, n, "none: %s has a value it does not take (%s), so fused attention refuses to run",
                 TK_ATTN_KERNEL_ENV, TK_ATTN_KERNEL_VALUES);
        return TK_ATTN_KERNEL_REFERENCE;
    }
    tk_attn_kernel k = tk_attn_kernel_pick(cc_major, cc_minor, dt, HS, ask, &why);
    if (k == TK_ATTN_KERNEL_REFERENCE)
        snprintf(buf, n, "the reference kernel (fp32 cores): %s", why);
    else if (HS)
        snprintf(buf, n, "%s; head size %lld, %s", why, (long long)HS, tk_dtype_name(dt));
    else
        snprintf(buf, n, "%s for %s and head sizes 64 and 16; the reference kernel (fp32 cores) for others",
                 why, tk_dtype_name(dt));
    return k;
}

static inline const char *tk_attn_kernel_name(tk_attn_kernel k) {
    return k == TK_ATTN_KERNEL_SM80 ? "mma m16n8k16" : k == TK_ATTN_KERNEL_SM75 ? "mma m16n8k8" : "reference";
}

#endif
