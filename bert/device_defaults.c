/* device_defaults.c — the config defaults that depend on the device a run
 * gets: attention: auto (fused on cuda and for a gpu: card, standard on
 * the cpu), the world_size a multi-GPU profile implies (gpu: t4x2), whether
 * a run takes a card's library buffers, and the capacity the allocator works
 * against. One rule in one place: the planner, the model options, the
 * session, the measurements and the advisor's fixes all ask it, so a plan
 * and its run agree.
 * Kept apart from config.c (which reads config.json through hf.c) so hf.c
 * can ask it without a circle between the two files. */
#include "tk_config.h"

int tk_config_world_size(const tk_config *c) {
    if (c->world_size > 1)
        return c->world_size;
    const tk_gpu_profile *p = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    return p && p->gpus > 1 ? p->gpus : 1;
}

tk_attention tk_config_attention(const tk_config *c, tk_dev_kind on, const char **why) {
    if (c->attention != TK_ATTN_AUTO) {
        if (why) *why = "set in the config";
        return c->attention;
    }
    /* On a GPU the T x T probabilities are most of the activations at long
     * sequences (bert-base-cased, 512 tokens: about 380 MiB saved per example
     * with them, 226 MiB without; PyTorch 2's SDPA keeps about 333). */
    if (on == TK_DEV_CUDA || c->device == TK_DEVICE_CUDA || c->gpu[0]) {
        if (why) *why = "default on cuda";
        return TK_ATTN_FUSED;
    }
    /* The cpu: standard attention's BLAS GEMMs beat the fused kernel's rows
     * (measured at 128 and 512 tokens, bench/RESULTS.md). */
    if (why) *why = "default on the cpu";
    return TK_ATTN_STANDARD;
}

int tk_config_on_card(const tk_config *c) { return c->device == TK_DEVICE_CUDA || c->gpu[0]; }

size_t tk_config_capacity(const tk_config *c) {
    if (c->capacity) return c->capacity;
    const tk_gpu_profile *p = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    return p ? tk_gpu_profile_budget(p) : 0;
}
