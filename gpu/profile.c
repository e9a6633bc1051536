/* profile.c — named GPU profiles for planning, the cards each notebook
 * platform hands out, and byte sizes in text.
 *
 * One capacity per card, defined here once: `capacity` is the total as
 * PyTorch prints it in an OOM message (cudaMemGetInfo's total), and
 * tk_gpu_profile_budget() is what a training run can use on that card: the
 * total less the CUDA context (`context_overhead`, the profile's planning
 * default, not a measurement) less what the CUDA libraries keep outside the
 * buffers txkernel gives them (tk_cuda_library_own_bytes, below). The cuda
 * backend's own buffers (the 32 MiB GEMM workspace, the kernels' scratch)
 * are inside the budget: they are allocator blocks. Every plan against a
 * profile, the --gpus table, --max-batch and the pasted-message diagnosis
 * use that one budget.
 *
 * Where each capacity was read (copies of the messages in
 * tests/data/oom_messages/ where they are there): T4 14.75 GiB
 * (FoundationVision/GenerateU#10, 2024-05-21; 14.73-14.76 with other
 * drivers), P4 7.43 GiB (the seed's Colab message, transformers on Python 3.6),
 * K80 11.17 GiB (shllln/GenerativeGraph#5, 2019-03-21), P100 15.90 GiB
 * (2KangHo/vdsr_pytorch#2, 2020-05-10; 15.89 in 2.x messages). V100-16 15.78,
 * A100-40 39.59, A100-80 79.15, L4 22.03 (22.03-22.07 with other drivers) and
 * H100-80 79.19 GiB (79.14-79.25 with other drivers and board variants) are
 * docs/FACTS.md's and the earlier profiles' figures, also from users' messages,
 * dates not recorded. RTX PRO 6000 (Blackwell, 96 GB class: Colab's G4 and
 * Kaggle's): 95.59 GiB in a PyTorch 2.x message on an RTX PRO 6000 Blackwell
 * under WSL2 (pytorch/pytorch#182286, 2026-05-04), which is nvidia-smi's
 * 97887 MiB total on the Workstation edition (antirez/ds4#431, 2026-06-16);
 * the Server Edition that Colab and Kaggle run has not been seen in a PyTorch
 * message here, so its figure is the Workstation's. The driver reserves
 * slightly different amounts per version, so these are good to a few
 * hundredths of a GiB.
 *
 * Throughput is the vendor datasheet's (dense, no sparsity: each row's
 * peak_source names the document; its sparse figures are halved) as a mixed-
 * precision training step gets it: fp16/bf16 GEMMs accumulate in fp32 under
 * autocast (cuBLAS compute type 32F), so on cards without tensor cores the
 * 16-bit path runs at the fp32 rate: the P4 (sm_61: native fp16 is 1/64 rate,
 * cuBLAS converts and computes in fp32) and the P100 (its 2x half2 rate needs
 * fp16 accumulation, which autocast does not use) save memory with fp16 but
 * no time; the K80 has no fp16 arithmetic at all. bf16 has hardware only
 * from Ampere on; elsewhere it is given the fp32 rate (no speed-up). The RTX
 * PRO 6000's rates: 125 TFLOPS fp32 and 1792 GB/s (28 Gbps GDDR7 on 512 bits)
 * are NVIDIA's GTC 2025 figures for the Workstation edition as the press
 * reported them (gpu.name / VideoCardz, 2025-03); its fp16/bf16 500 TFLOPS is
 * derived, not read: the announced 4000 AI TOPS (FP4, with sparsity) halved
 * for dense and twice more for FP8 then FP16; no datasheet line for the
 * Server Edition was found. These drive the cost model's relative speed
 * estimates only.
 *
 * Context overhead: the CUDA context plus the kernels of the libraries a
 * fine-tuning process loads (cuBLAS/cuBLASLt), which live outside the
 * allocator. Reported sizes: ~300 MB for a bare primary context (ollama's
 * notes on contexts per GPU), ~700-800 MB for a PyTorch process after its
 * first CUDA call (PyTorch forum answers), ~1.3 GB with cuBLAS and cuDNN
 * kernels on a V100 (HF, quoted in docs/FACTS.md). Cards that only run older,
 * eagerly loading CUDA stacks (K80, P4, P100, V100) get the top of that
 * range; T4 the typical PyTorch figure; Ampere/Ada/Hopper/Blackwell, where
 * CUDA 12+ loads kernels lazily by default, the lower middle. These are
 * planning defaults, not our measurements (output says "the profile's
 * default"): on a real card the cuda plugin measures the actual
 * outside-allocator bytes with CUPTI.
 *
 * SMs and resident threads per SM (PyTorch's CUDA reductions size their
 * grids, and so the scratch they take, by them): threads per SM from the
 * CUDA C Programming Guide's table of compute capabilities (2048 on 3.7,
 * 6.x, 7.0, 8.0 and 9.0; 1024 on 7.5; 1536 on 8.9 and 12.0); SMs from
 * NVIDIA's whitepapers and datasheets: T4 40 (Turing), K80 13 per GK210,
 * P4 20, P100 56, V100 80, L4 58 (Ada), A100 108, H100 SXM 132 (the H200's
 * too), RTX PRO 6000 Blackwell 188 (24,064 CUDA cores, 128 per SM).
 *
 * Platforms. "colab": the cards Colab hands out in 2026: a T4 on the free
 * tier; L4, A100 (40 and 80 GB), H100 and G4 (RTX PRO 6000) on paid plans
 * (mccormickml.com, "Colab GPUs Features & Pricing", updated 2026-03; docs/FACTS.md).
 * "kaggle": T4, and the pair of them Kaggle's "GPU T4 x2" gives (t4x2,
 * planned as world_size 2 with each card's capacity), the P100 that is being retired (its
 * cu128 torch has no sm_60 kernels: Kaggle/docker-python#1546, 2026-03-20;
 * Kaggle/kaggle-cli#1151, 2026-07-30) and the RTX PRO 6000 (kaggle-cli#1151
 * names it). "colab-2020": the cards the seed's free Colab runtime was drawn
 * from: Colab's FAQ (research.google.com/colaboratory/faq.html, 2019-2021)
 * named "K80s, T4s, P4s and P100s"; V100s came with its paid tier. Which card
 * a runtime gets was not the user's choice there: that is why the same
 * notebook sometimes fit and sometimes did not.
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
    /* name, long name, capacity, context overhead, fp32, fp16, bf16, bandwidth, cc, capacity's source, cards,
     * SMs, resident threads per SM */
    {"t4", "NVIDIA Tesla T4", GIB(14.75), MB(800), 8.1 * T, 65 * T, 8.1 * T, 320 * G, 7, 5,
     "a PyTorch OOM message, FoundationVision/GenerateU#10 (2024-05-21)", 1, 40, 1024,
     8.1 * T, "NVIDIA T4 datasheet (nvidia.com/en-us/data-center/tesla-t4): 8.1 TFLOPS fp32, 65 TFLOPS mixed fp16/fp32; Turing has no TF32 (the fp32 rate) and no bf16"},
    /* Kaggle's pair: two T4s in one notebook, planned as world_size 2, each
     * card's figures the T4's above */
    {"t4x2", "NVIDIA Tesla T4 x 2", GIB(14.75), MB(800), 8.1 * T, 65 * T, 8.1 * T, 320 * G, 7, 5,
     "the T4's (per card); two of them in Kaggle's \"GPU T4 x2\" accelerator", 2, 40, 1024,
     8.1 * T, "the T4's, per card"},
    {"k80", "NVIDIA Tesla K80 (one GK210)", GIB(11.17), MB(1300), 4.37 * T, 4.37 * T, 4.37 * T, 240 * G, 3, 7,
     "a PyTorch OOM message, shllln/GenerativeGraph#5 (2019-03-21)", 1, 13, 2048,
     4.37 * T, "NVIDIA Tesla K80 datasheet (one GK210 of two, boost clock); no tensor cores"},
    {"p4", "NVIDIA Tesla P4", GIB(7.43), MB(1300), 5.5 * T, 5.5 * T, 5.5 * T, 192 * G, 6, 1,
     "the seed's Colab OOM message (PyTorch 1.x, Python 3.6)", 1, 20, 2048,
     5.5 * T, "NVIDIA Tesla P4 datasheet; no tensor cores"},
    {"p100", "NVIDIA Tesla P100-PCIE-16GB", GIB(15.90), MB(1300), 9.3 * T, 9.3 * T, 9.3 * T, 732 * G, 6, 0,
     "a PyTorch OOM message, 2KangHo/vdsr_pytorch#2 (2020-05-10)", 1, 56, 2048,
     9.3 * T, "NVIDIA Tesla P100 PCIe datasheet; no tensor cores"},
    {"v100-16", "NVIDIA Tesla V100-SXM2-16GB", GIB(15.78), MB(1300), 15.7 * T, 125 * T, 15.7 * T, 900 * G, 7, 0,
     "users' PyTorch OOM messages (docs/FACTS.md; dates not recorded)", 1, 80, 2048,
     15.7 * T, "NVIDIA V100 datasheet (SXM2): 15.7 TFLOPS fp32, 125 TFLOPS tensor; no TF32 (the fp32 rate)"},
    {"l4", "NVIDIA L4", GIB(22.03), MB(600), 30.3 * T, 121 * T, 121 * T, 300 * G, 8, 9,
     "users' PyTorch OOM messages (docs/FACTS.md; dates not recorded)", 1, 58, 1536,
     60 * T, "NVIDIA L4 datasheet (nvidia.com/en-us/data-center/l4): 30.3 TFLOPS fp32, 120 TF32 and 242 fp16/bf16 with sparsity (halved: dense)"},
    {"a100-40", "NVIDIA A100-SXM4-40GB", GIB(39.59), MB(600), 19.5 * T, 312 * T, 312 * T, 1555 * G, 8, 0,
     "users' PyTorch OOM messages (docs/FACTS.md; dates not recorded)", 1, 108, 2048,
     156 * T, "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100), SXM: 19.5 TFLOPS fp32, 156 TF32, 312 fp16/bf16 (dense)"},
    {"a100-80", "NVIDIA A100-SXM4-80GB", GIB(79.15), MB(600), 19.5 * T, 312 * T, 312 * T, 2039 * G, 8, 0,
     "users' PyTorch OOM messages (docs/FACTS.md; dates not recorded)", 1, 108, 2048,
     156 * T, "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100), SXM: 19.5 TFLOPS fp32, 156 TF32, 312 fp16/bf16 (dense)"},
    {"h100-80", "NVIDIA H100 80GB HBM3", GIB(79.19), MB(600), 66.9 * T, 989 * T, 989 * T, 3350 * G, 9, 0,
     "users' PyTorch OOM messages (docs/FACTS.md; dates not recorded)", 1, 132, 2048,
     494.5 * T, "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100), SXM: 67 TFLOPS fp32, 989 TF32 and 1979 fp16/bf16 with sparsity (halved: dense)"},
    {"rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", GIB(95.59), MB(600), 125 * T, 500 * T, 500 * T, 1792 * G, 12, 0,
     "a PyTorch OOM message on the Workstation edition, pytorch/pytorch#182286 (2026-05-04); the Server Edition Colab and Kaggle run not yet seen in a PyTorch message", 1, 188, 1536,
     125 * T, "NVIDIA's GTC 2025 figures as the press reported them (above); TF32 not published: the fp32 rate"},
    /* the card issue 36's first measurements ran on (tests/data/gpu_h200/first_contact): the
     * H100's silicon with 141 GB of HBM3e */
    {"h200", "NVIDIA H200", (size_t)143771 << 20, MB(600), 66.9 * T, 989.5 * T, 989.5 * T, 4800 * G, 9, 0,
     "nvidia-smi's memory.total on the H200 lent to this project (143771 MiB, 2026-11-27); not yet seen in a PyTorch message", 1, 132, 2048,
     494.5 * T, "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200), SXM: 67 TFLOPS fp32, 989 TF32 and 1979 fp16/bf16 with sparsity (halved: dense), 4.8 TB/s"},
};
#define N_PROFILES ((int)(sizeof profiles / sizeof profiles[0]))

double tk_gpu_profile_peak(const tk_gpu_profile *p, const char *precision) {
    if (!p || !precision) return 0;
    if (!strcasecmp(precision, "fp32")) return p->fp32_flops;
    if (!strcasecmp(precision, "tf32")) return p->tf32_flops;
    if (!strcasecmp(precision, "fp16")) return p->fp16_flops;
    if (!strcasecmp(precision, "bf16")) return p->bf16_flops;
    return 0;
}

/* Names compared without a leading "NVIDIA " (the driver says "Tesla T4"). */
static const char *bare_name(const char *s) { return strncasecmp(s, "NVIDIA ", 7) ? s : s + 7; }

const tk_gpu_profile *tk_gpu_profile_by_device(const char *device_name) {
    if (!device_name) return NULL;
    for (int i = 0; i < N_PROFILES; i++)
        if (profiles[i].gpus == 1 && !strcasecmp(bare_name(device_name), bare_name(profiles[i].long_name)))
            return &profiles[i];
    return NULL;
}

/* What the CUDA libraries keep on the card outside every buffer given to
 * them, where a card showed it. One card has: an H200 (sm90, CUDA 13.0,
 * driver 580) running bert-tiny with CUBLAS_WORKSPACE_CONFIG=:0:0, so that
 * cuBLAS kept no workspace pool of its own, held 1024 B beyond the
 * allocator's segments and the plugin's buffers in CUPTI's device peak
 * (tests/data/gpu_h200/first_contact/cublas_outside_allocator.txt: 117449732 =
 * 83886080 + 33562628 + 1024). Which library holds it CUPTI's record names
 * (tk_cuda_mem_totals.sources), printed by tests/gpu_cuda/gpu_alloc.c on
 * the next card. Other architectures have not been measured: they get the
 * H200's figure, and the source line says so. */
static const struct { int cc_major; size_t bytes; const char *source; } library_own[] = {
    {9, 1024, "measured on an H200 (sm90, CUDA 13.0): 1 KiB outside every workspace"},
};

size_t tk_cuda_library_own_bytes(int cc_major, int cc_minor, const char **source) {
    (void)cc_minor;
    for (size_t i = 0; i < sizeof library_own / sizeof library_own[0]; i++)
        if (library_own[i].cc_major == cc_major) {
            if (source) *source = library_own[i].source;
            return library_own[i].bytes;
        }
    if (source) *source = "not measured on this architecture: the H200's 1 KiB (sm90, CUDA 13.0)";
    return library_own[0].bytes;
}

size_t tk_gpu_profile_budget(const tk_gpu_profile *p) {
    size_t outside = p ? p->context_overhead + tk_cuda_library_own_bytes(p->cc_major, p->cc_minor, NULL) : 0;
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

static const char *const colab_cards[] = {"t4", "l4", "a100-40", "a100-80", "h100-80", "rtx-pro-6000", NULL};
static const char *const kaggle_cards[] = {"t4", "t4x2", "p100", "rtx-pro-6000", NULL};
static const char *const colab_2020_cards[] = {"k80", "p4", "t4", "p100", "v100-16", NULL};

static const struct {
    const char *name;
    const char *const *cards;
} platforms[] = {{"colab", colab_cards}, {"kaggle", kaggle_cards}, {"colab-2020", colab_2020_cards}};
#define N_PLATFORMS ((int)(sizeof platforms / sizeof platforms[0]))

int tk_gpu_platform_cards(const char *platform, const tk_gpu_profile **out, int max) {
    if (!platform || !out) return -1;
    const char *const *names = NULL;
    for (int i = 0; i < N_PLATFORMS && !names; i++)
        if (!strcasecmp(platform, platforms[i].name)) names = platforms[i].cards;
    if (!names && strcasecmp(platform, "all")) return -1;
    int n = 0;
    for (int i = 0; n < max && (names ? names[i] != NULL : i < N_PROFILES); i++)
        out[n++] = names ? tk_gpu_profile_find(names[i]) : &profiles[i];
    return n;
}

const char *tk_gpu_platform_of(const tk_gpu_profile *card) {
    for (int p = 0; card && p < N_PLATFORMS; p++)
        for (int i = 0; platforms[p].cards[i]; i++)
            if (!strcmp(platforms[p].cards[i], card->name)) return platforms[p].name;
    return NULL;
}

const char *tk_gpu_platform_names(void) {
    return "colab, kaggle, colab-2020 or all";
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
