/* engine_plan.c — a config planned by the engine it names, in the one shape
 * the advisor ranks and reports (tk_plan_result): txkernel's own trainer
 * (bert/tk_plan.h) or, with `engine: pytorch`, the transformers step as
 * PyTorch allocates it (torchplan/tk_torchplan.h).
 *
 * For engine: pytorch the memory figures (peaks, categories at the peak,
 * parameter/gradient/optimizer bytes) are torchplan's; the capacity is the
 * card's one budget (tk_gpu_profile_budget), as for every plan against it.
 * The FLOP/byte counts and the predicted step time, which the advisor ranks
 * slowdowns by, come from txkernel's plan of the same config: the same
 * matrix products, counted once. Both engines take the worst batch from the
 * corpus lengths the same way (tk_plan_worst_len: batching: dynamic and
 * buckets plan the longest example). On two or more GPUs (`parallel`) the
 * figures are the fullest GPU's; txkernel's own `zero:` key is refused
 * (TK_EINVAL), so those candidates are never offered for engine: pytorch.
 * tk_plan_from_torchplan is that conversion alone, for a step planned
 * another way (the companion's traced model, app/traced.c). */
#include <string.h>

#include "tk_advisor.h"
#include "tk_host_mem.h"
#include "tk_torchplan.h"

tk_status tk_plan_engine(const tk_config *c, const int *lengths, int n, tk_plan_result *out, tk_err *err) {
    if (c->engine != TK_ENGINE_PYTORCH) return tk_plan(c, lengths, n, out, err);
    tk_torchplan_result *r = tk_malloc(sizeof *r);
    if (!r) return tk_err_nomem(err, "an engine: pytorch plan");
    tk_status st = tk_torchplan_data(c, lengths, n, r, err);
    if (st == TK_OK) st = tk_plan_from_torchplan(c, lengths, n, r, out, err);
    free(r);
    return st;
}

tk_status tk_plan_from_torchplan(const tk_config *c, const int *lengths, int n, const tk_torchplan_result *r,
                                 tk_plan_result *out, tk_err *err) {
    /* the costs from txkernel's plan of the same step; its memory is replaced below */
    tk_config tc = *c;
    tc.engine = TK_ENGINE_TXKERNEL;
    tk_err ce = {0};
    tk_status st = tk_plan(&tc, lengths, n, out, &ce);
    if (st == TK_ENOMEM) { /* the host's fault, not the config's: the whole plan fails */
        if (err) *err = ce;
        return st;
    }
    if (st != TK_OK) memset(out, 0, sizeof *out); /* a config txkernel's trainer refuses: no costs */
    out->batch = r->batch, out->seq = r->seq, out->epoch_steps = 0;
    /* one capacity per card: the budget every plan against the card uses
     * (its total less the context, less 32 MiB of txkernel's plugin buffers,
     * which for PyTorch's run is a small margin: its cuBLAS workspace is
     * planned inside the allocator) */
    const tk_gpu_profile *card = r->gpu[0] ? tk_gpu_profile_find(r->gpu) : NULL;
    out->context_bytes = r->context_bytes;
    out->capacity = card && !c->capacity ? tk_gpu_profile_budget(card)
                                         : r->capacity > r->context_bytes ? r->capacity - r->context_bytes : 0;
    out->peak_allocated = r->peak_allocated;
    out->peak_reserved = r->peak_reserved;
    memcpy(out->by_cat_at_peak, r->by_cat_at_peak, sizeof out->by_cat_at_peak);
    out->n_top = 0; /* torchplan keeps no owner table */
    out->param_bytes = r->param_bytes, out->grad_bytes = r->grad_bytes, out->optim_bytes = r->optim_bytes;
    out->n_params = r->n_params, out->n_trainable = r->n_trainable;
    out->fits = !out->capacity || out->peak_reserved <= out->capacity;
    out->margin = (int64_t)out->capacity - (int64_t)out->peak_reserved;
    out->oom = 0; /* planned whole, against no capacity */
    memset(&out->oom_record, 0, sizeof out->oom_record);
    out->oom_phase[0] = 0;
    return TK_OK;
}

const char *tk_plan_engine_name(const tk_config *c) {
    if (c->engine != TK_ENGINE_PYTORCH) return "txkernel's trainer";
    return tk_torchplan_label(c->torch_version);
}
