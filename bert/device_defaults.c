/* device_defaults.c — the config defaults that depend on the device a run
 * gets: attention: auto (on a card fused where a tensor-core kernel runs it
 * or where only fused fits, else standard; standard on the cpu), the world_size a multi-GPU profile implies (gpu: t4x2), whether
 * a run takes a card's library buffers, and the capacity the allocator works
 * against. One rule in one place: the planner, the model options, the
 * session, the measurements and the advisor's fixes all ask it, so a plan
 * and its run agree.
 * Kept apart from config.c (which reads config.json through hf.c) so hf.c
 * can ask it without a circle between the two files. */
#include "tk_attn_kernel.h"
#include "tk_config.h"

int tk_config_world_size(const tk_config *c) {
    if (c->world_size > 1)
        return c->world_size;
    const tk_gpu_profile *p = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    return p && p->gpus > 1 ? p->gpus : 1;
}

/* The card a run of `c` is for: its gpu: profile's compute capability, else
 * (device: cuda, the card not known from the config) sm80, what every card
 * sold since 2020 has. */
static void attention_card(const tk_config *c, int *cc_major, int *cc_minor) {
    const tk_gpu_profile *p = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    *cc_major = p ? p->cc_major : 8;
    *cc_minor = p ? p->cc_minor : 0;
}

tk_attention tk_config_attention_fit(const tk_config *c, tk_dev_kind on, tk_attention_fits fits, void *u,
                                     const char **why) {
    if (c->attention != TK_ATTN_AUTO) {
        if (why) *why = "set in the config";
        return c->attention;
    }
    /* The cpu: standard attention's BLAS GEMMs beat the fused kernel's rows
     * (measured at 128 and 512 tokens, bench/RESULTS.md). */
    if (!(on == TK_DEV_CUDA || c->device == TK_DEVICE_CUDA || c->gpu[0])) {
        if (why) *why = "default on the cpu";
        return TK_ATTN_STANDARD;
    }
    /* A card: fused where one of the cuda backend's tensor-core kernels runs
     * it (gpu/tk_attn_kernel.h: fp16 from sm75, bf16 from sm80, head size 64
     * or 16): it keeps no T x T probabilities and is the faster one there.
     * Where only its reference kernel would run (fp32 above all), standard
     * attention's cuBLAS GEMMs are faster (H200, bert-base 32 x 512 fp32: 312
     * ms/step against 661, bench/RESULTS.md), unless memory forces fused:
     * standard keeps the T x T probabilities for backward (the same run:
     * 14.55 GB peak against 9.53 GB fused, measured before fused attention
     * kept its dropout bits: they add T x T / 8 bytes a head and layer, 151
     * MB there), so a run that fits only fused stays fused. */
    int cc_major, cc_minor;
    attention_card(c, &cc_major, &cc_minor);
    const tk_dtype dt = c->precision == TK_PREC_FP16 ? TK_F16 : c->precision == TK_PREC_BF16 ? TK_BF16 : TK_F32;
    const int64_t hs = c->hidden > 0 && c->heads > 0 ? c->hidden / c->heads : 0; /* 0: the model's (64 for BERT) */
    if (tk_attn_kernel_pick(cc_major, cc_minor, dt, hs, TK_ATTN_ASK_AUTO, NULL) != TK_ATTN_KERNEL_REFERENCE) {
        if (why) *why = TK_ATTN_WHY_FAST;
        return TK_ATTN_FUSED;
    }
    if (fits && tk_config_capacity(c)) {
        tk_config t = *c;
        t.attention = TK_ATTN_STANDARD;
        if (!fits(&t, u)) {
            t.attention = TK_ATTN_FUSED;
            if (fits(&t, u)) {
                if (why) *why = TK_ATTN_WHY_FITS;
                return TK_ATTN_FUSED;
            }
        }
    }
    if (why) *why = TK_ATTN_WHY_SLOW;
    return TK_ATTN_STANDARD;
}

tk_attention tk_config_attention(const tk_config *c, tk_dev_kind on, const char **why) {
    return tk_config_attention_fit(c, on, NULL, NULL, why);
}

int tk_config_on_card(const tk_config *c) { return c->device == TK_DEVICE_CUDA || c->gpu[0]; }

size_t tk_config_capacity(const tk_config *c) {
    if (c->capacity) return c->capacity;
    const tk_gpu_profile *p = c->gpu[0] ? tk_gpu_profile_find(c->gpu) : NULL;
    return p ? tk_gpu_profile_budget(p) : 0;
}
