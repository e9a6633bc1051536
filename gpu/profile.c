/* profile.c — named GPU profiles for planning, the cards each notebook
 * platform hands out, and byte sizes in text.
 *
 * Capacities are "usable bytes as PyTorch reports them" (the total capacity
 * in its OOM message, i.e. cudaMemGetInfo's total), so a plan against "t4"
 * matches what a Colab user sees. Each figure is read off users' pasted
 * PyTorch OOM messages; where this commit re-read one, the thread and its date
 * are given (copies in tests/data/oom_messages/): T4 14.75 GiB
 * (FoundationVision/GenerateU#10, 2024-05-21; 14.73-14.76 with other
 * drivers), P4 7.43 GiB (the seed's Colab message, transformers on Python 3.6),
 * K80 11.17 GiB (shllln/GenerativeGraph#5, 2019-03-21), P100 15.90 GiB
 * (2KangHo/vdsr_pytorch#2, 2020-05-10; 15.89 in 2.x messages). V100-16 15.78,
 * A100-40 39.59, A100-80 79.15, L4 22.03 (22.03-22.07 with other drivers) and
 * H100-80 79.19 GiB (79.14-79.25 with other drivers and board variants) are
 * FACTS.md's and the earlier profiles' figures, also from users' messages,
 * dates not recorded. The driver reserves slightly different amounts per
 * version, so these are good to a few hundredths of a GiB.
 *
 * Throughput is the vendor datasheet's (dense, no sparsity) as a mixed-
 * precision training step gets it: fp16/bf16 GEMMs accumulate in fp32 under
 * autocast (cuBLAS compute type 32F), so on cards without tensor cores the
 * 16-bit path runs at the fp32 rate: the P4 (sm_61: native fp16 is 1/64 rate,
 * cuBLAS converts and computes in fp32) and the P100 (its 2x half2 rate needs
 * fp16 accumulation, which autocast does not use) save memory with fp16 but
 * no time; the K80 has no fp16 arithmetic at all. bf16 has hardware only
 * from Ampere on; elsewhere it is given the fp32 rate (no speed-up). These
 * drive the cost model's relative speed estimates only.
 *
 * Context overhead: the CUDA context plus the kernels of the libraries a
 * fine-tuning process loads (cuBLAS/cuBLASLt), which live outside the
 * allocator. Reported sizes: ~300 MB for a bare primary context (ollama's
 * notes on contexts per GPU), ~700-800 MB for a PyTorch process after its
 * first CUDA call (PyTorch forum answers), ~1.3 GB with cuBLAS and cuDNN
 * kernels on a V100 (HF, quoted in FACTS.md). Cards that only run older,
 * eagerly loading CUDA stacks (K80, P4, P100, V100) get the top of that
 * range; T4 the typical PyTorch figure; Ampere/Ada/Hopper, where CUDA 12+
 * loads kernels lazily by default, the lower middle. These are planning
 * defaults, not our measurements: on a real card the cuda plugin measures the
 * actual outside-allocator bytes with CUPTI.
 *
 * Platforms: the cards Colab and Kaggle have handed to notebooks since 2019.
 * Colab's FAQ (research.google.com/colaboratory/faq.html, 2019-2021) named
 * "K80s, T4s, P4s and P100s" for the free tier; its paid tiers added V100,
 * A100-40 and (2023) L4. Kaggle's notebooks offer a P100 (NVIDIA's developer
 * blog, "How Kaggle Makes GPUs Accessible to 5 Million Data Scientists") and
 * two T4s (Kaggle's accelerator menu, 2023-); its first GPU kernels (2017-2019)
 * ran on K80s, which is kept from memory of its announcement, not re-checked
 * here. Which card a
 * runtime gets is not the user's choice on the free tiers: that is why the
 * same notebook sometimes fits and sometimes does not.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tk_gpu.h"

#define GIB(x) ((size_t)((x) * 1073741824.0))
#define MB(x) ((size_t)(x) * 1000000u)
#define T 1e12
#define G 1e9

static const tk_gpu_profile profiles[] = {
    /* name, long name, capacity, context overhead, fp32, fp16, bf16, bandwidth, cc */
    {"t4", "NVIDIA Tesla T4", GIB(14.75), MB(800), 8.1 * T, 65 * T, 8.1 * T, 320 * G, 7, 5},
    {"k80", "NVIDIA Tesla K80 (one GK210)", GIB(11.17), MB(1300), 4.37 * T, 4.37 * T, 4.37 * T, 240 * G, 3, 7},
    {"p4", "NVIDIA Tesla P4", GIB(7.43), MB(1300), 5.5 * T, 5.5 * T, 5.5 * T, 192 * G, 6, 1},
    {"p100", "NVIDIA Tesla P100-PCIE-16GB", GIB(15.90), MB(1300), 9.3 * T, 9.3 * T, 9.3 * T, 732 * G, 6, 0},
    {"v100-16", "NVIDIA Tesla V100-SXM2-16GB", GIB(15.78), MB(1300), 15.7 * T, 125 * T, 15.7 * T, 900 * G, 7, 0},
    {"l4", "NVIDIA L4", GIB(22.03), MB(600), 30.3 * T, 121 * T, 121 * T, 300 * G, 8, 9},
    {"a100-40", "NVIDIA A100-SXM4-40GB", GIB(39.59), MB(600), 19.5 * T, 312 * T, 312 * T, 1555 * G, 8, 0},
    {"a100-80", "NVIDIA A100-SXM4-80GB", GIB(79.15), MB(600), 19.5 * T, 312 * T, 312 * T, 2039 * G, 8, 0},
    {"h100-80", "NVIDIA H100 80GB HBM3", GIB(79.19), MB(600), 66.9 * T, 989 * T, 989 * T, 3350 * G, 9, 0},
};
#define N_PROFILES ((int)(sizeof profiles / sizeof profiles[0]))

size_t tk_gpu_profile_budget(const tk_gpu_profile *p) {
    size_t outside = p ? p->context_overhead + TK_CUDA_PLUGIN_BYTES : 0;
    return p && p->capacity > outside ? p->capacity - outside : 0;
}

const tk_gpu_profile *tk_gpu_profile_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < N_PROFILES; i++)
        if (strcasecmp(name, profiles[i].name) == 0) return &profiles[i];
    return NULL;
}

const tk_gpu_profile *tk_gpu_profile_at(int i) {
    return i >= 0 && i < N_PROFILES ? &profiles[i] : NULL;
}

static const char *const colab_cards[] = {"k80", "p4", "t4", "p100", "v100-16", "l4", "a100-40", NULL};
static const char *const kaggle_cards[] = {"k80", "p100", "t4", NULL};

int tk_gpu_platform_cards(const char *platform, const tk_gpu_profile **out, int max) {
    if (!platform || !out) return -1;
    const char *const *names = NULL;
    if (!strcasecmp(platform, "colab")) names = colab_cards;
    else if (!strcasecmp(platform, "kaggle")) names = kaggle_cards;
    else if (strcasecmp(platform, "all")) return -1;
    int n = 0;
    for (int i = 0; n < max && (names ? names[i] != NULL : i < N_PROFILES); i++)
        out[n++] = names ? tk_gpu_profile_find(names[i]) : &profiles[i];
    return n;
}

const char *tk_gpu_platform_of(const tk_gpu_profile *card) {
    for (int i = 0; card && colab_cards[i]; i++)
        if (!strcmp(colab_cards[i], card->name)) return "colab";
    for (int i = 0; card && kaggle_cards[i]; i++)
        if (!strcmp(kaggle_cards[i], card->name)) return "kaggle";
    return NULL;
}

int tk_gpu_profile_fast_fp16(const tk_gpu_profile *p) {
    return p && p->fp16_flops > 1.5 * p->fp32_flops;
}

/* Units: B, K/KB=1e3 .. T/TB=1e12 (SI, as disk and marketing sizes are) and
 * KiB .. TiB (binary, as PyTorch and nvidia-smi print). Case-insensitive,
 * spaces allowed between number and unit. */
int tk_parse_bytes(const char *s, size_t *out) {
    if (!s || !out) return -1;
    while (isspace((unsigned char)*s)) s++;
    if (!*s || *s == '-' || *s == '+') return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0) return -1;
    while (isspace((unsigned char)*end)) end++;
    char unit[8] = {0};
    size_t ul = 0;
    while (*end && !isspace((unsigned char)*end) && ul < sizeof unit - 1) unit[ul++] = *end++;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return -1;
    static const struct { const char *u; double m; } units[] = {
        {"", 1}, {"b", 1}, {"k", 1e3}, {"kb", 1e3}, {"m", 1e6}, {"mb", 1e6}, {"g", 1e9},
        {"gb", 1e9}, {"t", 1e12}, {"tb", 1e12}, {"kib", 1024.0}, {"mib", 1048576.0},
        {"gib", 1073741824.0}, {"tib", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(unit, units[i].u) != 0) continue;
        double b = v * units[i].m;
        if (b >= 18446744073709551615.0) return -1;
        *out = (size_t)(b + 0.5);
        return 0;
    }
    return -1;
}

/* PyTorch's format_size: <= 1024 as bytes, then KiB/MiB/GiB with two decimals,
 * each unit used up to and including 1024 of it. */
char *tk_format_bytes(size_t bytes, char *buf, size_t n) {
    if (!buf || !n) return buf;
    if (bytes <= 1024)
        snprintf(buf, n, "%zu bytes", bytes);
    else if (bytes <= 1048576)
        snprintf(buf, n, "%.2f KiB", bytes / 1024.0);
    else if (bytes <= 1073741824ull)
        snprintf(buf, n, "%.2f MiB", bytes / 1048576.0);
    else
        snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
    return buf;
}
