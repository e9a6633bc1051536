/* cards.c — one config planned on each card a platform hands out, and the
 * sentence that says where it fits (tk_cards_sentence, in oom_message.c).
 *
 * Each card is planned exactly as `gpu: CARD` without `capacity:` plans it
 * (same config, same planner), so a row equals that plan byte for byte.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_oom_message.h"

tk_status tk_plan_cards(const tk_config *c, const int32_t *lengths, int n_lengths, const char *platform,
                        tk_card_fit *out, int max, int *n_out, tk_err *err) {
    *n_out = 0;
    const tk_gpu_profile *cards[16];
    int n = tk_gpu_platform_cards(platform, cards, 16);
    if (n < 0) {
        tk_err_set(err, TK_EINVAL, "--gpus %s: expected colab, kaggle or all", platform ? platform : "(none)");
        return TK_EINVAL;
    }
    tk_plan_result *p = malloc(sizeof *p);
    if (!p) {
        tk_err_set(err, TK_EOOM, "out of host memory planning %s's cards", platform);
        return TK_EOOM;
    }
    for (int i = 0; i < n && *n_out < max; i++) {
        tk_config cc = *c;
        cc.capacity = 0; /* the card's own capacity, as `gpu: NAME` alone gives */
        tk_status st = tk_config_set(&cc, "gpu", cards[i]->name, err);
        if (st == TK_OK) st = tk_plan(&cc, (const int *)lengths, n_lengths, p, err);
        if (st != TK_OK) {
            free(p);
            return st;
        }
        tk_card_fit *r = &out[(*n_out)++];
        r->card = cards[i];
        r->fits = p->fits;
        r->margin = p->margin;
        r->peak = p->peak_reserved;
        r->budget = p->capacity;
        r->step_seconds = p->step_seconds;
    }
    free(p);
    return TK_OK;
}
