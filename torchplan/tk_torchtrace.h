/* tk_torchtrace.h — engine: pytorch for any model: a traced training step
 * (the companion's python/txkernel/trace.py) replayed through the model of
 * PyTorch's CUDA caching allocator.
 *
 * torchplan.c writes BERT's step out by hand; here the step is what the
 * user's own nn.Module did, op by op, on fake tensors: every storage's
 * allocation and release with its bytes, module and category, and the ops
 * whose memory depends on the card (dropout, scaled_dot_product_attention,
 * GEMMs) as op events with their shapes. The replay:
 *  - device cpu (no card): every storage as the CPU made it; peak allocated
 *    is the live sum of their bytes rounded to 512 (the CPU has no caching
 *    allocator: what the tests hold against PyTorch's own CPU allocator
 *    events), reserved as the caching allocator would pool them;
 *  - a card: the same, except what the card's kernels make differently —
 *    a dropout keeps a 1-byte mask, not the CPU's noise of the input's
 *    dtype; SDPA runs the kernel the card would pick (flash, efficient, or
 *    the math path the CPU traced) with its logsumexp, RNG state and
 *    backward scratch instead of the CPU's own buffers (one run inside
 *    checkpointing keeps nothing; its recomputation in backward keeps q,
 *    k, v and the output until the original's backward ends); cuBLAS and cuBLASLt
 *    take their workspaces as the torch version keeps them on that
 *    architecture (blas_rules.c); the CUDA context is added to what the
 *    card holds.
 * The trace format (JSON) is written by trace.py and documented there:
 * {"events": [["a", id, bytes, cat, owner, op] | ["f", id] | ["s", step] |
 *  ["g", backward, bias] | ["op", op, "fwd"|"bwd"|"bwd_end"]], "ops": [...],
 *  "owners": [...], "batch", "seq", "precision", "optimizer", "target", ...}.
 */
#ifndef TK_TORCHTRACE_H
#define TK_TORCHTRACE_H

#include <jansson.h>
#include "tk_torchplan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TK_TRACE_TOP 8
typedef struct tk_torchtrace_result {
    tk_torchplan_result plan;       /* the figures engine: pytorch reports (attention, optimizer, peaks, card) */
    char model[96];                 /* the traced module's class */
    char loss[32];                  /* "the model's own" | "cross-entropy" | "mse" | "bce" */
    int n_sdpa, n_dropout;          /* card-dependent op calls over the steps traced */
    int n_modules;                  /* live bytes by module at the steady step's peak, largest first */
    struct { char name[128]; size_t bytes; } modules[TK_TRACE_TOP];
    int n_largest;                  /* the largest storages live at that peak */
    struct { char owner[128]; size_t bytes; tk_cat cat; } largest[TK_TRACE_TOP];
} tk_torchtrace_result;

/* Replays `trace` (borrowed) on card `gpu` (a profile name; NULL or "" plans
 * the step as the CPU ran it) with `torch_version`'s cuBLAS rules. Errors
 * (TK_EINVAL) name the trace's key or event index that is wrong, or the
 * card. */
tk_status tk_torchtrace_plan(const json_t *trace, const char *gpu, tk_torch_version torch_version,
                             tk_torchtrace_result *out, tk_err *err);

/* The plan as data (new reference; NULL when out of host memory):
 * tk_torchplan_json's keys plus model, loss, by_module and largest. */
json_t *tk_torchtrace_json(const tk_torchtrace_result *r);

#ifdef __cplusplus
}
#endif
#endif
