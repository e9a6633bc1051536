/* spec.c — a run resolved once (issue 39): config + where it is asked ->
 * device kind, card, capacity, attention and why, world size, labels, api,
 * platform. `txk plan`, `txk train`, %txplan, %%txtrain, %txadvise and
 * %txfix read these figures from here instead of each working them out:
 * the attention rule itself stays in bert (tk_config_attention), called
 * here, never copied.
 *
 * Guarantees: resolving opens no device unless the config says device: auto
 * and the machine has an NVIDIA driver node (then the cuda plugin is asked,
 * as the run would ask it, and closed again); a card taken from a platform
 * is always said (card_why), never silent.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tk_app.h"
#include "tk_advisor.h"
#include "tk_plan.h"

tk_dev_kind tk_app_device_probe(const tk_config *c, size_t *total) {
    *total = 0;
    if (c->device == TK_DEVICE_CPU) return TK_DEV_CPU;
    if (c->device == TK_DEVICE_META) return TK_DEV_META;
    if (c->device == TK_DEVICE_AUTO && access("/dev/nvidiactl", F_OK) != 0) return TK_DEV_CPU;
    tk_dev_opts o = {.kind = TK_DEV_CUDA};
    tk_err e = {0};
    tk_dev *d = tk_dev_new(&o, &e);
    if (!d) return c->device == TK_DEVICE_CUDA ? TK_DEV_CUDA : TK_DEV_CPU;
    tk_dev_info info;
    tk_dev_info_get(d, &info);
    *total = info.total;
    tk_dev_destroy(&d);
    return TK_DEV_CUDA;
}

/* The platform's card with the least memory: the one a fit must survive. */
static const tk_gpu_profile *smallest_card(const char *platform) {
    const tk_gpu_profile *cards[32];
    int n = tk_gpu_platform_cards(platform, cards, 32);
    const tk_gpu_profile *best = NULL;
    for (int i = 0; i < n; i++)
        if (!best || cards[i]->capacity < best->capacity) best = cards[i];
    return best;
}

tk_status tk_run_spec_resolve(const tk_config *c, const tk_run_where *w, tk_run_spec *out, tk_err *err) {
    memset(out, 0, sizeof *out);
    tk_run_where none = {0};
    if (!w) w = &none;
    size_t total = w->device_total;
    if (w->device_known) {
        out->device = w->device;
        snprintf(out->device_why, sizeof out->device_why, "the device this session opened");
    } else {
        out->device = tk_app_device_probe(c, &total);
        snprintf(out->device_why, sizeof out->device_why, "%s",
                 c->device == TK_DEVICE_AUTO ? (out->device == TK_DEV_CUDA ? "device: auto found cuda here"
                                                                           : "device: auto found no GPU here")
                                             : "set in the config");
    }
    /* the card: the config's, else the smallest of a platform the user named */
    const tk_gpu_profile *card = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    if (card) {
        snprintf(out->card, sizeof out->card, "%s", card->name);
        snprintf(out->card_why, sizeof out->card_why, "gpu: %s in the config", card->name);
    } else if (w->platform && w->platform[0] && !c->capacity && out->device != TK_DEV_CUDA) {
        const tk_gpu_profile *sm = smallest_card(w->platform);
        if (!sm) {
            tk_err_set(err, TK_EINVAL, "platform '%s': expected %s", w->platform, tk_gpu_platform_names());
            return TK_EINVAL;
        }
        card = sm;
        snprintf(out->card, sizeof out->card, "%s", sm->name);
        snprintf(out->card_why, sizeof out->card_why, "%s, the smallest card %s hands out (the config names none)",
                 sm->name, w->platform);
    }
    const char *plat = w->platform && w->platform[0] ? w->platform : card ? tk_gpu_platform_of(card) : NULL;
    snprintf(out->platform, sizeof out->platform, "%s", plat ? plat : "");
    /* capacity: the config's, the card's budget, the cuda device's total */
    if (c->capacity) {
        out->capacity = c->capacity;
        snprintf(out->capacity_why, sizeof out->capacity_why, "capacity: in the config");
    } else if (card && out->device != TK_DEV_CUDA) {
        out->capacity = tk_gpu_profile_budget(card);
        snprintf(out->capacity_why, sizeof out->capacity_why, "%s's budget", card->name);
    } else if (out->device == TK_DEV_CUDA && total) {
        out->capacity = total;
        snprintf(out->capacity_why, sizeof out->capacity_why, "the cuda device's total");
    } else {
        snprintf(out->capacity_why, sizeof out->capacity_why, "none known (give gpu: or capacity:)");
    }
    tk_config ac = *c;
    if (card && !ac.gpu[0]) snprintf(ac.gpu, sizeof ac.gpu, "%s", card->name);
    /* attention: auto by the one rule (bert/device_defaults.c), memory
     * included: on a card, fp32 goes standard unless only fused fits the
     * capacity resolved above */
    if (!ac.capacity) ac.capacity = out->capacity;
    tk_err fit_err = {0};
    out->attention = tk_config_attention_fit(&ac, out->device, tk_plan_attention_fits, &fit_err, &out->attention_why);
    if (fit_err.status != TK_OK) {
        if (err) *err = fit_err;
        return fit_err.status;
    }
    out->world_size = tk_config_world_size(c);
    out->labels = c->num_labels;
    out->api = c->api;
    return TK_OK;
}

tk_status tk_run_spec_apply(const tk_run_spec *s, tk_config *c, tk_err *err) {
    if (c->engine != TK_ENGINE_PYTORCH) c->attention = s->attention; /* PyTorch's is attn_implementation */
    if (s->card[0] && !c->gpu[0] && !c->capacity) {
        tk_status st = tk_config_set(c, "gpu", s->card, err);
        if (st != TK_OK) return st;
    }
    if (!c->capacity && !c->gpu[0] && s->device == TK_DEV_CUDA) c->capacity = s->capacity;
    return TK_OK;
}

void tk_run_spec_unapply(tk_config *fixed, const tk_config *resolved, const tk_config *given) {
    if (fixed->attention == resolved->attention) fixed->attention = given->attention;
    if (!strcmp(fixed->gpu, resolved->gpu)) memcpy(fixed->gpu, given->gpu, sizeof fixed->gpu);
    if (fixed->capacity == resolved->capacity) fixed->capacity = given->capacity;
}

static const char *kind_name(tk_dev_kind k) {
    return k == TK_DEV_CUDA ? "cuda" : k == TK_DEV_CPU ? "cpu" : "meta";
}

json_t *tk_run_spec_json(const tk_run_spec *s) {
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:s, s:i, s:i, s:s}", "device", kind_name(s->device),
                     "device_why", s->device_why, "card", s->card, "card_why", s->card_why, "platform", s->platform,
                     "capacity", (json_int_t)s->capacity, "capacity_why", s->capacity_why, "attention",
                     tk_attention_name(s->attention), "attention_why", s->attention_why ? s->attention_why : "",
                     "world_size", s->world_size, "labels", s->labels, "api", tk_api_name(s->api));
}

void tk_run_spec_card_line(const tk_run_spec *s, char *buf, size_t n) {
    if (s->card[0]) snprintf(buf, n, "for %s", s->card_why);
    else if (s->device == TK_DEV_CUDA) snprintf(buf, n, "for this machine's cuda device");
    else snprintf(buf, n, "for no card: %s", s->capacity_why);
}
