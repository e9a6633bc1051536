/* cards.c — one config planned on each card a platform hands out, and the
 * sentence that says where it fits (tk_cards_sentence, in oom_message.c);
 * and the advice candidate that fits on every card of a platform (each card
 * planned by the advice's planner: a traced model's for its advice).
 *
 * Each card is planned exactly as `gpu: CARD` without `capacity:` plans it
 * (same config, same planner), so a row equals that plan byte for byte.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tk_oom_message.h"
#include "tk_host_mem.h"

tk_status tk_plan_cards(const tk_config *c, const int32_t *lengths, int n_lengths, const char *platform,
                        tk_card_fit *out, int max, int *n_out, tk_err *err) {
    return tk_plan_cards_by(NULL, NULL, c, lengths, n_lengths, platform, out, max, n_out, err);
}

tk_status tk_plan_cards_by(tk_plan_fn fn, void *ctx, const tk_config *c, const int32_t *lengths, int n_lengths,
                           const char *platform, tk_card_fit *out, int max, int *n_out, tk_err *err) {
    *n_out = 0;
    const tk_gpu_profile *cards[16];
    int n = tk_gpu_platform_cards(platform, cards, 16);
    if (n < 0) {
        tk_err_set(err, TK_EINVAL, "--gpus %s: expected colab, kaggle, colab-2020 or all", platform ? platform : "(none)");
        return TK_EINVAL;
    }
    tk_plan_result *p = tk_malloc(sizeof *p);
    if (!p) {
        tk_err_set(err, TK_ENOMEM, "out of host memory planning %s's cards", platform);
        return TK_ENOMEM;
    }
    for (int i = 0; i < n && *n_out < max; i++) {
        tk_config cc = *c;
        cc.capacity = 0; /* the card's own capacity, as `gpu: NAME` alone gives */
        tk_err pe = {0};
        tk_status st = tk_config_set(&cc, "gpu", cards[i]->name, err);
        if (st == TK_OK) st = fn ? fn(ctx, &cc, (const int *)lengths, n_lengths, p, &pe)
                                 : tk_plan_engine(&cc, (const int *)lengths, n_lengths, p, &pe);
        /* a pair (t4x2) the engine: pytorch planner refuses (it plans the
         * split of a step over GPUs, parallel:, only where it models it):
         * not a row, not an error */
        if (st == TK_EINVAL && (fn || c->engine == TK_ENGINE_PYTORCH) && cards[i]->gpus > 1) continue;
        if (st != TK_OK && err && pe.msg[0]) *err = pe;
        if (st != TK_OK) {
            free(p);
            return st;
        }
        tk_card_fit *r = &out[(*n_out)++];
        r->card = cards[i];
        r->fits = p->fits;
        r->margin = p->margin;
        r->peak = p->peak_reserved;
        r->peak_allocated = p->peak_allocated;
        r->budget = p->capacity;
        r->step_seconds = p->step_seconds;
    }
    free(p);
    return TK_OK;
}

const char *tk_platform_check(const char *value, int allow_all, char *buf, size_t n) {
    const tk_gpu_profile *probe[16];
    if (value && (allow_all || strcasecmp(value, "all")) && tk_gpu_platform_cards(value, probe, 16) >= 0) return NULL;
    snprintf(buf, n, "--for %s: expected colab or kaggle (or colab-2020: the cards Colab handed out in 2020%s)",
             value ? value : "(nothing)", allow_all ? "; all: every GPU profile" : "");
    return buf;
}

int tk_advice_auto_for(const tk_advice *a, const char *platform, const int32_t *lengths, int n_lengths) {
    return tk_advice_auto_for_by(NULL, NULL, a, platform, lengths, n_lengths);
}

int tk_advice_auto_for_by(tk_plan_fn fn, void *ctx, const tk_advice *a, const char *platform, const int32_t *lengths,
                          int n_lengths) {
    const tk_gpu_profile *probe[16];
    if (tk_gpu_platform_cards(platform, probe, 16) < 0) return -2;
    for (int i = 0; i < a->n_cand; i++) {
        const tk_candidate *c = &a->cand[i];
        /* the same rule as auto (keeps the effective batch), on every card */
        const tk_config *cc = &c->config;
        /* ... and that txkernel can run (not a plan of several GPUs on cuda) */
        if (c->action_only || tk_config_plan_only(cc) ||
            cc->batch_size * (cc->accumulate > 1 ? cc->accumulate : 1) * tk_config_world_size(cc) != a->base_effective_batch)
            continue;
        int ok = 1;
        for (int k = 0; k < c->n_fixes; k++) ok &= c->fixes[k].kind != TK_FIX_BATCH;
        tk_card_fit cards[16];
        int n = 0;
        if (!ok || tk_plan_cards_by(fn, ctx, cc, lengths, n_lengths, platform, cards, 16, &n, NULL) != TK_OK) continue;
        for (int k = 0; k < n && ok; k++) ok = cards[k].margin >= (int64_t)(cards[k].budget / 20);
        if (ok) return i;
    }
    return -1;
}
