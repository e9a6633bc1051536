/* diagnoses.c — the one ordered table of diagnoses (RULES) over the one
 * facts record (tk_facts.h), for every reader: a pasted message
 * (oom_message.c), the plan of a config as given (advisor.c) and a PyTorch
 * snapshot (snapshot_diagnose.c). Each reader fills the facts, runs
 * tk_diagnose and copies the findings and fixes out: read -> facts ->
 * diagnose -> fixes -> code. Each rule names the evidence and figures it
 * proves, tests what the reader computed, writes one sentence and, after
 * every rule has spoken, the fixes that answer it, in the order of the
 * findings. Also the names of the diagnosis kinds (the words a report shows
 * and the ids the JSON carries).
 *
 * Guarantees: no rule fires without the figures it says; a rule reads only
 * the facts (never the planner, so the fuzz targets, which build the
 * message's and the snapshot's readers without it, link this file too);
 * fix code carries only numbers the user gave or named placeholders.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tk_advisor.h"
#include "tk_facts.h"
#include "tk_fix_code.h"

#define MIB ((uint64_t)1 << 20)

static const char *const DIAG_NAMES[TK_DIAG_COUNT] = {
    "capacity", "headroom", "fragmentation", "dominant layer", "dominant category",
    "padding", "data spike", "leak", "card lottery", "card choice", "held outside the step",
    "another process", "the step or held memory", "no kernel image", "several GPUs", "platform",
    "growth", "engine pool",
};

static const char *const DIAG_IDS[TK_DIAG_COUNT] = {
    "capacity", "headroom", "fragmentation", "dominant_layer", "dominant_category",
    "padding", "data_spike", "leak", "card_lottery", "card_choice", "held",
    "another_process", "step_or_held", "no_kernel_image", "multi_gpu", "platform",
    "growth", "engine_pool",
};

const char *tk_diag_name(tk_diag_kind k) {
    return (unsigned)k < TK_DIAG_COUNT ? DIAG_NAMES[k] : "?";
}

const char *tk_diag_id(tk_diag_kind k) {
    return (unsigned)k < TK_DIAG_COUNT ? DIAG_IDS[k] : "other";
}

/* ---- what the rules write ------------------------------------------------------------ */

static char *fmt(uint64_t b, char *buf, size_t n) {
    return tk_format_bytes((size_t)b, buf, n);
}

static char *fmtb(size_t b, char buf[32]) { return tk_format_bytes(b, buf, 32); }

static const tk_oommsg_figure *ok_fig(const tk_oom_message *m, tk_oomfig i) {
    const tk_oommsg_figure *f = &m->fig[i];
    return f->present && !f->unreliable ? f : NULL;
}

/* A finding in one sentence; NULL (nothing added) when the reader's list is full. */
static tk_finding *add_diag(tk_diagnosis *o, tk_diag_kind k, const char *f, ...) __attribute__((format(printf, 3, 4)));
static tk_finding *add_diag(tk_diagnosis *o, tk_diag_kind k, const char *f, ...) {
    if (o->n_diag >= o->max_diag) return NULL;
    o->title[o->n_diag][0] = 0;
    tk_finding *d = &o->diag[o->n_diag++];
    d->kind = k;
    va_list ap;
    va_start(ap, f);
    vsnprintf(d->text, sizeof d->text, f, ap);
    va_end(ap);
    return d;
}

/* The plan's finding: a one-line title and the numbers behind it. */
static void add_titled(tk_diagnosis *o, tk_diag_kind k, const char *title, const char *evidence) {
    if (o->n_diag >= o->max_diag) return;
    snprintf(o->title[o->n_diag], sizeof o->title[0], "%s", title);
    tk_finding *d = &o->diag[o->n_diag++];
    d->kind = k;
    snprintf(d->text, sizeof d->text, "%s", evidence);
}

/* A fix with an id (a snapshot's: what it frees, -1 when it cannot tell) at
 * the end of the list; NULL when that id is there already or the list is full. */
static tk_fix_note *add_fix_id(tk_diagnosis *o, const char *id, int64_t saves) {
    for (int i = 0; i < o->n_fixes; i++)
        if (!strcmp(o->fixes[i].id, id)) return NULL;
    if (o->n_fixes >= o->max_fixes) return NULL;
    tk_fix_note *x = &o->fixes[o->n_fixes++];
    memset(x, 0, sizeof *x);
    snprintf(x->id, sizeof x->id, "%s", id);
    x->saves = saves;
    return x;
}

/* A fix in words and code; the same code twice is one fix. */
static void add_fix(tk_diagnosis *o, const char *text, const char *code) {
    for (int i = 0; i < o->n_fixes; i++)
        if (!strcmp(o->fixes[i].code, code)) return;
    if (o->n_fixes >= o->max_fixes) return;
    tk_fix_note *x = &o->fixes[o->n_fixes++];
    memset(x, 0, sizeof *x); /* a message's fix: no id, no saving, no plan */
    snprintf(x->text, sizeof x->text, "%s", text);
    snprintf(x->code, sizeof x->code, "%s", code);
}

/* ---- a pasted message ---------------------------------------------------------------- */

/* The era's platform: Colab's cards of 2020 (K80, P4) are not today's. */
const char *tk_platform_era(const char *platform, const tk_gpu_profile *card) {
    if (platform && !strcmp(platform, "colab") && card && !tk_platform_has("colab", card) &&
        tk_platform_has("colab-2020", card))
        return "colab-2020";
    return platform;
}





static void upper(const char *s, char *out, size_t n) {
    size_t i = 0;
    for (; s[i] && i + 1 < n; i++) out[i] = (char)toupper((unsigned char)s[i]);
    out[i] = 0;
}

/* "a P4", "an L4", "an A100-40", "an RTX-PRO-6000" (upper-case name) */
static const char *a_card(const tk_gpu_profile *p, char *buf, size_t n) {
    char nm[32];
    upper(p->name, nm, sizeof nm);
    int an = nm[0] && strchr("AEFHILMNORSX", nm[0]) != NULL; /* letters read with a vowel: "an L4" */
    snprintf(buf, n, "a%s %s", an ? "n" : "", nm);
    return buf;
}

static int is_colab(const char *platform) {
    return platform && (!strcmp(platform, "colab") || !strcmp(platform, "colab-2020"));
}

static const char *platform_clause(const char *platform) {
    if (!platform) return "";
    if (!strcmp(platform, "colab-2020"))
        return ", one of the cards Colab's runtime was given in 2020 (K80, P4, T4, P100; V100-16 on Colab Pro) without "
               "the notebook choosing";
    if (!strcmp(platform, "colab"))
        return ", one of the cards Colab hands out today (a T4 on the free tier; L4, A100, H100 and RTX PRO 6000 on paid "
               "plans)";
    return "";
}

/* The context and library buffers a card's profile sets aside: its total
 * less its one usable capacity (tk_gpu_profile_budget). */
uint64_t tk_card_context(const tk_gpu_profile *card) {
    return card ? card->capacity - tk_gpu_profile_budget(card) : 0;
}

/* Colab's paragraph, the card lottery: why the same code fits on some runs
 * and not others, from the message's own figures and the one usable
 * capacity of each card (tk_gpu_profile_budget). `here`: what PyTorch had on
 * this run (reserved + free). */
static void why_intermittent(tk_diagnosis *o, const tk_oom_message *m, const char *platform, uint64_t here, int platform_unknown) {
    const tk_gpu_profile *card = m->card, *pool[16], *today[16], *cands[32];
    int np = platform ? tk_gpu_platform_cards(platform, pool, 16) : 0, nt = tk_gpu_platform_cards("colab", today, 16);
    if (np < 0) np = 0;
    /* the platform's cards, then today's Colab cards (T4, L4, A100, ...) not among them */
    int nc = 0, n_pool = 0;
    for (int i = 0; i < np + nt && nc < 32; i++) {
        const tk_gpu_profile *p = i < np ? pool[i] : today[i - np];
        /* a pair of cards gives a one-GPU program no more memory */
        int dup = p == card || p->gpus > 1;
        for (int k = 0; k < nc && !dup; k++) dup = cands[k] == p;
        if (dup || tk_gpu_profile_budget(p) <= here) continue;
        cands[nc++] = p;
        if (i < np) n_pool++;
    }
    /* each group by budget, smallest first */
    for (int g = 0; g < 2; g++) {
        int lo = g ? n_pool : 0, hi = g ? nc : n_pool;
        for (int i = lo + 1; i < hi; i++)
            for (int k = i; k > lo && tk_gpu_profile_budget(cands[k]) < tk_gpu_profile_budget(cands[k - 1]); k--) {
                const tk_gpu_profile *t = cands[k];
                cands[k] = cands[k - 1], cands[k - 1] = t;
            }
    }
    if (n_pool && nc > n_pool + 2) nc = n_pool + 2; /* today's two smallest beside an old pool: L4, A100-40 */
    char c1[40], b1[32], b2[32], b3[32], more[600] = "";
    size_t budget = tk_gpu_profile_budget(card), w = 0;
    /* the card named as "would fit": the first with twice the room, else the largest */
    const tk_gpu_profile *sure = NULL;
    for (int i = 0; i < nc; i++) {
        size_t b = tk_gpu_profile_budget(cands[i]);
        if (b >= 2 * here && (!sure || b < tk_gpu_profile_budget(sure))) sure = cands[i];
        w += (size_t)snprintf(more + w, w < sizeof more ? sizeof more - w : 0, "%s%s on %s%s",
                              i == n_pool && n_pool ? " (and today " : i ? ", " : "", fmt(b, b1, sizeof b1),
                              a_card(cands[i], c1, sizeof c1), i + 1 == nc && n_pool && i >= n_pool ? ")" : "");
        if (w >= sizeof more) w = sizeof more - 1;
    }
    for (int i = 0; !sure && i < nc; i++)
        if (!sure || tk_gpu_profile_budget(cands[i]) > tk_gpu_profile_budget(sure)) sure = cands[i];
    char room[900];
    if (sure)
        snprintf(room, sizeof room,
                 "; PyTorch had %s here and needed more, while a run gets %s, so on %s it would fit unless its step "
                 "needs over %.1fx what it had here",
                 fmt(here, b2, sizeof b2), more, a_card(sure, c1, sizeof c1),
                 (double)tk_gpu_profile_budget(sure) / (double)(here ? here : 1));
    else
        snprintf(room, sizeof room, "; PyTorch had %s here and needed more, and no card in the list leaves more",
                 fmt(here, b2, sizeof b2));
    /* earlier cells' tensors are inside PyTorch's figures; only another
     * process or framework is outside its cache */
    const tk_oommsg_figure *A = ok_fig(m, TK_OOMFIG_ALLOCATED);
    char held[600], inside[160] = "";
    if (A) snprintf(inside, sizeof inside, "tensors earlier cells still hold count in the %s PyTorch had allocated, and ",
                    A->text);
    if (here + 128 * MIB < budget)
        snprintf(held, sizeof held,
                 "; and what else is on the card changes from run to run: %s%s beyond that default was held outside "
                 "PyTorch on this run (another process on the card, such as a second notebook, or another framework "
                 "in this one, such as TensorFlow)",
                 inside, fmt(budget - here, b3, sizeof b3));
    else
        snprintf(held, sizeof held, "; and what else is on the card changes from run to run: %son this run no more "
                 "than the context and buffers were held outside PyTorch", inside);
    char nm[40];
    a_card(card, nm, sizeof nm);
    add_diag(o, TK_DIAG_LOTTERY,
             "card lottery%s: why it fits on some runs and not others: this run got %s (%s total, %s usable after %s "
             "for the CUDA context and library buffers, the profile's default, not measured)%s%s%s.",
             platform_unknown ? " (if this ran on Colab)" : "", nm, m->fig[TK_OOMFIG_TOTAL].text,
             fmt(budget, b1, sizeof b1), fmt(tk_card_context(card), b2, sizeof b2), platform_clause(platform), room, held);
}

/* Kaggle's paragraph: the accelerator is the notebook's setting, not a
 * lottery; its choices with their usable capacity. */
static void why_kaggle(tk_diagnosis *o, const tk_oom_message *m, uint64_t here, int platform_unknown) {
    const tk_gpu_profile *cards[16];
    int n = tk_gpu_platform_cards("kaggle", cards, 16);
    char list[900] = "", c1[40], b1[32], b2[32], nm[40];
    size_t w = 0;
    for (int i = 0; i < n; i++) {
        const tk_gpu_profile *p = cards[i];
        if (p == m->card) continue;
        upper(p->name, nm, sizeof nm);
        if (p->gpus > 1)
            w += (size_t)snprintf(list + w, w < sizeof list ? sizeof list - w : 0,
                                  "%sGPU T4 x2 (two T4s, %s usable on each: one GPU's step gets no more memory; the "
                                  "Trainer spreads each batch over both with DataParallel by itself, or DDP with "
                                  "accelerate launch or torchrun)", w ? ", " : "", fmt(tk_gpu_profile_budget(p), b1, sizeof b1));
        else if (p->cc_major < 7)
            w += (size_t)snprintf(list + w, w < sizeof list ? sizeof list - w : 0,
                                  "%sGPU %s (%s usable, but Kaggle's cu128 torch has no kernels for its sm_60: "
                                  "Kaggle/docker-python#1546)", w ? ", " : "", nm, fmt(tk_gpu_profile_budget(p), b1, sizeof b1));
        else
            w += (size_t)snprintf(list + w, w < sizeof list ? sizeof list - w : 0, "%s%s (%s usable)", w ? ", " : "",
                                  !strcmp(p->name, "rtx-pro-6000") ? "RTX PRO 6000" : nm,
                                  fmt(tk_gpu_profile_budget(p), b1, sizeof b1));
        if (w >= sizeof list) w = sizeof list - 1;
    }
    char got[300] = "";
    if (m->card && here)
        snprintf(got, sizeof got, ": this run got %s (%s usable) and PyTorch had %s of it", a_card(m->card, c1, sizeof c1),
                 fmt(tk_gpu_profile_budget(m->card), b1, sizeof b1), fmt(here, b2, sizeof b2));
    add_diag(o, TK_DIAG_PLATFORM,
             "kaggle%s: the accelerator is the notebook's own setting (Settings > Accelerator), your choice and not a "
             "lottery%s; the other choices are %s.",
             platform_unknown ? " (if this ran on Kaggle)" : "", got, list);
}

/* With the user's config: its plan on each card (by the engine the caller
 * names, engine: pytorch for a message from PyTorch), and the gap between
 * that plan and the PyTorch run the message comes from. */
static void config_on_cards(tk_diagnosis *o, const tk_oom_message *m, const char *platform, const tk_card_fit *cards, int n) {
    char s[400], nm[32] = "", b1[32], b2[32], b3[32];
    const char *who = m->plan_engine[0] ? m->plan_engine : "txkernel's trainer";
    int pytorch = strncmp(who, "engine: pytorch", 15) == 0;
    tk_cards_sentence(cards, n, platform, s, sizeof s);
    if (m->card) upper(m->card->name, nm, sizeof nm);
    int near = 0, all = n > 0;
    for (int i = 0; i < n; i++) {
        near |= cards[i].fits && cards[i].margin < (int64_t)(cards[i].budget / 20);
        all &= cards[i].fits;
    }
    const tk_oommsg_figure *A = ok_fig(m, TK_OOMFIG_ALLOCATED);
    char gap[900] = "";
    uint64_t planned = m->plan_allocated ? m->plan_allocated : m->plan_peak;
    const char *what = m->plan_allocated ? "allocated" : "reserved";
    if (m->have_plan && A && m->card) {
        if (A->bytes > planned + planned / 4 && pytorch)
            snprintf(gap, sizeof gap,
                     "; whose numbers: your PyTorch run had %s allocated when it failed on the %s, where %s plans a "
                     "peak of %s %s for one training step of this config: %s more, and while a plan of the step "
                     "counts its weights, gradients, optimizer state and activations, the message's figure also counts "
                     "every other tensor your Python process held on the card (an earlier cell's model, optimizer or "
                     "outputs), which is where to look",
                     A->text, nm, who, fmt(planned, b1, sizeof b1), what, fmt(A->bytes - planned, b2, sizeof b2));
        else if (A->bytes > planned + planned / 4)
            snprintf(gap, sizeof gap,
                     "; whose numbers: your PyTorch run had %s allocated when it failed on the %s (its peak was higher "
                     "still), where %s plans a peak of %s for this config: %s more, as the message's figure counts "
                     "every tensor your Python process held on the card (an earlier cell's model or optimizer "
                     "included) and PyTorch's own way of running the step (its attention and optimizer code), which "
                     "txkernel's trainer does not plan: `engine: pytorch` does",
                     A->text, nm, who, fmt(planned, b1, sizeof b1), fmt(A->bytes - planned, b2, sizeof b2));
        else
            snprintf(gap, sizeof gap, "; whose numbers: your PyTorch run had %s allocated when it failed on the %s, "
                     "and %s plans a peak of %s %s for this config", A->text, nm, who, fmt(planned, b3, sizeof b3), what);
    }
    int kaggle = platform && !strcmp(platform, "kaggle");
    add_diag(o, kaggle ? TK_DIAG_PLATFORM : TK_DIAG_LOTTERY, "%s %s, your config as %s plans it: %s%s%s%s%s%s.",
             kaggle ? "kaggle: on the accelerators" : "card lottery on", platform, who, s,
             nm[0] ? "; this message came from a " : "", nm,
             near && !kaggle ? "; within 5% of a card's budget a run can fit one day and not the next" : "",
             all ? "; so the card alone does not explain this failure: what the plan leaves out does" : "", gap);
}

/* What the pasted message's caller knows of the user's run, for the one
 * writer of a step change (tk_step_code): their config's numbers, or none. */
static tk_step_user step_user(const tk_oom_message *m) {
    return (tk_step_user){.batch = m->user_batch, .accumulate = m->user_accumulate, .max_len = m->user_max_len,
                          .p99 = m->user_p99, .have_config = m->have_user_config, .precision = m->user_precision,
                          .torch = m->user_torch, .output_dir = m->user_output_dir,
                          .fill = "txk advise CFG --from-error fills them in"};
}

/* The fixes that make the step itself smaller, as code in the API the user
 * runs (tk_step_code), smallest change first, carrying the user's own
 * numbers when a config gave them and named placeholders otherwise: never
 * an example value. A fix the config has on already is not offered; the
 * diagnosis `d` says so. */
static void capacity_fixes(tk_diagnosis *o, const tk_oom_message *m, tk_api api, tk_finding *d) {
    if (o->shrunk) return; /* once, answering the first diagnosis that calls for them */
    o->shrunk = 1;
    char code[1400], text[240];
    tk_step_user u = step_user(m);
    tk_step_code(code, sizeof code, TK_STEP_HALF_BATCH, api, &u);
    add_fix(o, api == TK_API_TRAINER ? "half the batch per step, same effective batch (transformers)"
                                     : "half the batch per step, same effective batch", code);
    /* dynamic padding on already and nothing shorter to truncate at: nothing to offer */
    int dyn_on = m->have_user_config && m->user_batching != TK_BATCH_FIXED;
    if (!(dyn_on && api != TK_API_TXKERNEL && tk_step_length(&u) == m->user_max_len)) {
        tk_step_code(code, sizeof code, TK_STEP_SHORTER, api, &u);
        add_fix(o, "shorter sequences: pad each batch to its longest text, and truncate at what your texts need", code);
    }
    char on[160] = "";
    size_t w = 0;
    int prec_on = m->have_user_config && m->user_precision != TK_PREC_FP32;
    int ckpt_on = m->have_user_config && m->user_recompute != TK_RECOMPUTE_NONE;
    if (prec_on)
        w += (size_t)snprintf(on + w, sizeof on - w, "%s mixed precision",
                              m->user_precision == TK_PREC_BF16 ? "bf16" : "fp16");
    if (ckpt_on) snprintf(on + w, sizeof on - w, "%sgradient checkpointing", w ? ", " : "");
    if (on[0] && d) { /* a clause of the diagnosis' one sentence */
        size_t l = strlen(d->text);
        if (l && d->text[l - 1] == '.') l--;
        snprintf(d->text + l, sizeof d->text - l, "; what is already on in your config is not offered again: %s.", on);
    }
    if (!prec_on) {
        tk_step_code(code, sizeof code, TK_STEP_FP16, api, &u);
        if (m->card && !tk_gpu_profile_fast_fp16(m->card))
            snprintf(text, sizeof text, "mixed precision: on a %s (no tensor cores) fp16 saves activation memory but no time",
                     m->card->name);
        else
            snprintf(text, sizeof text, "mixed precision (fp16 halves activations and is faster on tensor cores)");
        add_fix(o, text, code);
    }
    if (!ckpt_on && tk_step_code(code, sizeof code, TK_STEP_CHECKPOINTING, api, &u) > 0)
        add_fix(o, "recompute activations in the backward pass (about 30% slower, far less memory)", code);
}

/* The number of GPUs a launcher line names: Kaggle's T4 x2 says 2; else a
 * named placeholder. */
static const char *n_gpus(const tk_oom_message *m) {
    return m->platform[0] && !strcmp(m->platform, "kaggle") && m->card && !strcmp(m->card->name, "t4") ? "2" : "NUM_GPUS";
}

/* A run on several GPUs: which kind, what GPU 0 (DataParallel) or each rank
 * (DDP) holds, and the move that shares it. */
static void multi_gpu_diagnosis(tk_diagnosis *o, const tk_oom_message *m) {
    char dev[400] = "";
    if (m->parallel == TK_OOMMSG_DATAPARALLEL) {
        if (m->gpu_index >= 0 && m->gpu_index != m->replica_device)
            snprintf(dev, sizeof dev, "; the figures below are GPU %d's, where it ran out", m->gpu_index);
        add_diag(o, TK_DIAG_MULTI_GPU,
                 "multi_gpu: a DataParallel run over several GPUs (replica %d on device %d failed), one process with "
                 "the model copied to each GPU at every step, which the HF Trainer does by itself when it sees two "
                 "GPUs and no launcher (torchrun, accelerate launch), as on Kaggle's T4 x2; GPU 0 holds more than the "
                 "others (the model's own weights with their gradients and the optimizer state, the whole batch "
                 "before it is scattered, and every replica's outputs gathered back for the loss), so GPU 0 runs out "
                 "first%s.",
                 m->replica, m->replica_device, dev);
        return;
    }
    if (m->ddp_rank >= 0 && m->gpu_index >= 0 && m->ddp_rank != m->gpu_index)
        snprintf(dev, sizeof dev, "; rank %d's message names GPU %d: unless each rank sees only its own GPU "
                 "(CUDA_VISIBLE_DEVICES per rank), rank %d put tensors on GPU %d: each rank must use its own "
                 "(torch.cuda.set_device(local_rank); accelerate and the Trainer do it)", m->ddp_rank, m->gpu_index,
                 m->ddp_rank, m->gpu_index);
    char who[48] = "";
    if (m->ddp_rank >= 0) snprintf(who, sizeof who, ", rank %d's message", m->ddp_rank);
    add_diag(o, TK_DIAG_MULTI_GPU,
             "multi_gpu: a DDP run (one process per GPU%s): each rank holds a whole copy of the weights, their "
             "gradients and the optimizer state, plus DDP's gradient buckets (bucket_cap_mb, 25 MB by default) and, "
             "outside PyTorch's cache, NCCL's buffers; a smaller per-GPU batch leaves the copies, ZeRO-2 (DeepSpeed) "
             "shards the gradients and optimizer state over the ranks%s.",
             who, dev);
}

static void multi_gpu_fixes(tk_diagnosis *o, const tk_oom_message *m, tk_api api) {
    char code[600];
    const char *g = n_gpus(m);
    const char *note = strcmp(g, "2") ? "\n# NUM_GPUS: your GPU count (torch.cuda.device_count())" : "";
    int dp = m->parallel == TK_OOMMSG_DATAPARALLEL; /* DataParallel ran: one process per GPU instead */
    int k = tk_launch_code(code, sizeof code, dp ? TK_PAR_DDP : TK_PAR_ZERO2, 2, api != TK_API_LOOP, g);
    if (k > 0 && (size_t)k < sizeof code) snprintf(code + k, sizeof code - (size_t)k, "%s", note);
    if (dp)
        add_fix(o, "DDP instead of DataParallel: one process per GPU, nothing gathered on GPU 0", code);
    else
        add_fix(o, "ZeRO-2: each rank keeps 1/N of the gradients and optimizer state (DeepSpeed, through accelerate)",
                code);
}

/* Not an OOM: the card is older than every kernel the installed torch has
 * (Kaggle's P100 with a cu128 torch: Kaggle/docker-python#1546; Kaggle's
 * answer in Kaggle/kaggle-cli#1151: use a T4 or L4, or install a Pascal
 * build). torch's own warning there asks for CUDA 12.6 builds, whose arch
 * list still has 6.0 (PyTorch 2.9's cu126: 5.0 6.0 7.0 7.5 8.0 8.6 9.0, as
 * Comfy-Org/ComfyUI#16438 lists them). */
static void no_kernel_diagnosis(tk_diagnosis *o, const tk_oom_message *m) {
    char dev[120], code[300];
    if (m->device_name[0])
        snprintf(dev, sizeof dev, " (%s%s%s)", m->device_name, m->device_sm[0] ? ", " : "", m->device_sm);
    else
        dev[0] = 0;
    add_diag(o, TK_DIAG_NO_KERNEL_IMAGE,
             "no_kernel_image: not an out-of-memory error: the installed torch has no GPU code for this card%s%s%s%s, "
             "so memory settings, a smaller batch or a restart cannot help (Kaggle's P100 with its cu128 torch is the "
             "known case, Kaggle/docker-python#1546).",
             dev, m->supported_sm[0] ? "; this torch has kernels for " : "", m->supported_sm,
             m->supported_sm[0] ? " only" : "");
    add_fix(o, "switch the notebook to a T4 (Kaggle: Settings > Accelerator > GPU T4 x2; Colab: Runtime > Change "
               "runtime type), then check the card",
            "!nvidia-smi --query-gpu=name,compute_cap --format=csv   # a T4 says 7.5");
    snprintf(code, sizeof code,
             "!pip install torch --index-url https://download.pytorch.org/whl/cu126\n"
             "import torch; print(torch.cuda.get_arch_list())   # must list %s",
             m->device_sm[0] ? m->device_sm : "your card's sm_NN");
    add_fix(o, "or keep the card and install a torch build with kernels for it (PyTorch's cu126 wheels still have "
               "sm_60; needs the internet, so not in an offline competition)",
            code);
}

/* The platform's paragraphs, after what the figures prove: Colab's card
 * lottery, Kaggle's accelerators, or, when the message does not show where
 * it ran, that said and each platform's line. */
/* 1: the platform hands out this card (t4x2's card is the t4) */
int tk_platform_has(const char *platform, const tk_gpu_profile *card) {
    const tk_gpu_profile *cards[16];
    int n = tk_gpu_platform_cards(platform, cards, 16);
    for (int i = 0; i < n; i++)
        if (cards[i] == card) return 1;
    return 0;
}

static void platform_diagnoses(tk_diagnosis *o, const tk_oom_message *m, const char *platform, uint64_t here) {
    int unknown = !platform[0];
    /* not shown: the platforms whose cards include this one each get a line */
    int colab = unknown ? tk_platform_has("colab", m->card) || tk_platform_has("colab-2020", m->card) : is_colab(platform);
    int kaggle = unknown ? tk_platform_has("kaggle", m->card) : !strcmp(platform, "kaggle");
    if (unknown && (colab || kaggle))
        add_diag(o, TK_DIAG_PLATFORM,
                 "platform: the message does not show where it ran (no /kaggle/ or /content/ path; the dist-packages "
                 "paths are the same on both, as Kaggle's image is built on Colab's), so each platform gets its line "
                 "below; --for colab or --for kaggle keeps one.");
    if (colab) {
        const char *own = tk_platform_has("colab", m->card) ? "colab" : "colab-2020";
        why_intermittent(o, m, platform[0] ? platform : own, here, unknown);
    }
    if (kaggle) why_kaggle(o, m, here, unknown);
}



static void say_no_kernel(tk_diagnosis *o, const tk_facts *f) {
    const tk_oom_message *m = f->msg;
    no_kernel_diagnosis(o, m);
}
static int proves_no_kernel(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    (void)f;
    return m->format == TK_OOMMSG_NO_KERNEL_IMAGE;
}

static int proves_multi_gpu(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    return f->torch && m->parallel != TK_OOMMSG_ONE_GPU;
}
static void say_multi_gpu(tk_diagnosis *o, const tk_facts *f) {
    const tk_oom_message *m = f->msg;
    multi_gpu_diagnosis(o, m);
}
static void fix_multi_gpu(tk_diagnosis *o, const tk_facts *f, tk_finding *d) {
    const tk_oom_message *m = f->msg;
    (void)d;
    multi_gpu_fixes(o, m, f->api);
}

static int proves_request_over(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    return f->request_over_card;
}
static void say_request_over(tk_diagnosis *o, const tk_facts *f) {
    add_diag(o, TK_DIAG_CAPACITY,
             "capacity: the single request (%s) is larger than the whole card (%s), so no setting of the cache and no "
             "restart makes it fit: the tensor itself must shrink (batch, sequence length, precision) or be split.",
             f->R->text, f->T->text);
}

/* the shrinking fixes, once, after the first diagnosis that calls for them */
static void fix_capacity(tk_diagnosis *o, const tk_facts *f, tk_finding *d) {
    const tk_oom_message *m = f->msg;
    if (f->torch) capacity_fixes(o, m, f->api, d);
}

static int proves_other(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    (void)m;
    return f->torch && f->other >= 0 && m->proc[f->other].mem.bytes >= 256 * MIB && !f->request_over_card;
}
static void say_other(tk_diagnosis *o, const tk_facts *f) {
    const tk_oom_message *m = f->msg;
    const tk_oommsg_process *p = &m->proc[f->other];
    char own[200] = "";
    if (f->own >= 0)
        snprintf(own, sizeof own, ", while process %d (%s) is your own kernel, whose figure holds PyTorch's %s reserved "
                 "plus the context", m->proc[f->own].pid, m->proc[f->own].mem.text, f->V ? f->V->text : "?");
    add_diag(o, TK_DIAG_OTHER_PROCESS,
             "another process: process %d held %s of the %s card when yours asked for %s, memory your run could not "
             "use%s.",
             p->pid, p->mem.text, f->T ? f->T->text : "?", f->R ? f->R->text : "more", own);
}
static void fix_other(tk_diagnosis *o, const tk_facts *f, tk_finding *d) {
    const tk_oom_message *m = f->msg;
    (void)d;
    const tk_oommsg_process *p = &m->proc[f->other];
    char text[240], code[600];
    snprintf(text, sizeof text, "stop process %d, which holds %s of the card (another notebook or job), then run again",
             p->pid, p->mem.text);
    snprintf(code, sizeof code,
             "!nvidia-smi --query-compute-apps=pid,used_memory --format=csv   # process %d: %s\n"
             "# end it where it runs: its notebook's Runtime > Manage sessions > Terminate, or kill %d in its shell",
             p->pid, p->mem.text, p->pid);
    add_fix(o, text, code);
}

static const char FREE_CODE[] = "import gc, torch\ndel model, optimizer   # whatever an earlier cell left on the GPU\n"
                                "gc.collect()\ntorch.cuda.empty_cache()";

static int proves_held(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    return f->torch && f->held;
}
static void torch_live_words(const tk_advise_torch *l, char *buf, size_t n);
static void say_held(tk_diagnosis *o, const tk_facts *f) {
    char b1[32], b2[32], live[320];
    torch_live_words(f->torch_live, live, sizeof live);
    add_diag(o, TK_DIAG_HELD,
             "held outside the step: your run had %s allocated by PyTorch when it failed, while one training step of "
             "this config needs %s %s as %s plans it, so %s was held by something other than the step: tensors that "
             "earlier cells still hold (a model and optimizer from a run before this one), or a config different from "
             "the one given%s.",
             f->A->text, fmt(f->plan, b1, sizeof b1), f->plan_what, f->engine, fmt(f->held_bytes, b2, sizeof b2), live);
}
static void fix_held(tk_diagnosis *o, const tk_facts *f, tk_finding *d) {
    (void)d;
    char text[240], b1[32];
    snprintf(text, sizeof text, "free what earlier cells hold on the card (%s more than the step needs), or restart "
             "the runtime, then run the training cell once", fmt(f->held_bytes, b1, sizeof b1));
    add_fix(o, text, FREE_CODE);
}

static int proves_step_over(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    (void)m;
    return f->torch && f->step_over_card && !f->request_over_card;
}
static void say_step_over(tk_diagnosis *o, const tk_facts *f) {
    const tk_oom_message *m = f->msg;
    char b1[32], b2[32], nm[32] = "card";
    if (m->card) upper(m->card->name, nm, sizeof nm);
    add_diag(o, TK_DIAG_CAPACITY,
             "capacity: one training step of this config needs %s reserved as %s plans it, more than the %s that the "
             "%s leaves usable after its context and library buffers, so the step itself does not fit this card.",
             fmt(f->plan_reserved, b1, sizeof b1), f->engine, fmt(f->budget, b2, sizeof b2), nm);
}

static int proves_frag(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    return f->frag;
}
static void say_frag(tk_diagnosis *o, const tk_facts *f) {
    char b1[32];
    if (f->have_plan)
        add_diag(o, TK_DIAG_FRAGMENTATION,
                 "fragmentation: PyTorch held %s reserved but unallocated, enough for the %s request, while the %s it "
                 "had allocated matches the %s one step of this config needs, so the cache was split into pieces "
                 "smaller than the request.",
                 f->U->text, f->R->text, f->A ? f->A->text : "?", fmt(f->plan, b1, sizeof b1));
    else
        add_diag(o, TK_DIAG_FRAGMENTATION,
                 "fragmentation: PyTorch holds %s reserved but unallocated, enough for the %s request, yet no cached "
                 "block is that large, so the cache is split into pieces.",
                 f->U->text, f->R->text);
}
/* 1: the user's torch is known to be older than 2.9 (no PYTORCH_ALLOC_CONF) */
static int torch_before_2_9(const tk_oom_message *m) {
    if (!m->have_user_config) return 0;
    tk_torch_version v = m->user_torch;
    return v == TK_TORCH_1_13 || v == TK_TORCH_1_10 || (v >= TK_TORCH_2_0 && v < TK_TORCH_2_MINOR(9));
}
static void fix_frag(tk_diagnosis *o, const tk_facts *f, tk_finding *d) {
    const tk_oom_message *m = f->msg;
    (void)f, (void)d;
    if (m->format == TK_OOMMSG_TORCH_21)
        add_fix(o, "let the cache grow segments instead of splitting them (first cell, before torch is imported)",
                torch_before_2_9(m)
                    ? "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"\nimport torch"
                    : "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"   # still "
                      "read by torch 2.9+, only deprecated\nos.environ[\"PYTORCH_ALLOC_CONF\"] = "
                      "\"expandable_segments:True\"   # torch 2.9+'s name (2.9.1 ignored it alone: pytorch#183387)\n"
                      "import torch");
    else if (m->format == TK_OOMMSG_TORCH_RESERVED)
        add_fix(o, "stop the cache from splitting large blocks (PyTorch 1.10+; first cell, before torch is imported)",
                "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"max_split_size_mb:128\"\nimport torch");
    else
        add_fix(o, "return the split cache between steps (PyTorch <= 1.3 has no allocator settings)",
                "optimizer.step()\noptimizer.zero_grad()\ntorch.cuda.empty_cache()");
}

/* Without a plan, the unallocated cache would hold the request while
 * PyTorch's allocated is half the card or more: the cache split, or
 * tensors that earlier cells hold, or the step itself; all are named, none
 * as a verdict, and the config's plan tells which. */
static int proves_split_or_held(const tk_facts *f, const tk_diagnosis *o) {
    return f->msg && f->split_or_held;
}
static void say_split_or_held(tk_diagnosis *o, const tk_facts *f) {
    add_diag(o, TK_DIAG_STEP_OR_HELD,
             "the step, held memory or a split cache: PyTorch held %s reserved but unallocated, more than the %s "
             "request, while %s of the %s card was allocated, so either the cache was split into pieces smaller than "
             "the request (fragmentation), or tensors that earlier cells still hold or one training step took the "
             "room, and your config tells which (txk advise CFG --from-error MSG).",
             f->U->text, f->R->text, f->A->text, f->T->text);
}
static void fix_split_or_held(tk_diagnosis *o, const tk_facts *f, tk_finding *d) {
    /* freeing costs nothing and the allocator's setting needs a restart too: both before a smaller step */
    add_fix(o, "if an earlier cell's model or optimizer is still on the card: free it (or restart the runtime), then "
               "run the training cell once",
            FREE_CODE);
    fix_frag(o, f, d);
    fix_capacity(o, f, d);
}

static int proves_outside(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    (void)m;
    return f->outside && !proves_other(f, o) && !f->held;
}
static void say_outside(tk_diagnosis *o, const tk_facts *f) {
    const tk_oom_message *m = f->msg;
    char b1[32], b2[32], b3[32], b4[32], cname[32];
    if (m->card) {
        upper(m->card->name, cname, sizeof cname);
        add_diag(o, TK_DIAG_HEADROOM,
                 "headroom: PyTorch held less than the card: reserved %s + the request %s + %s for the %s's context "
                 "and library buffers (the profile's default, not measured) come to %s, below the total %s; %s of "
                 "the card is held outside PyTorch's cache (total %s - reserved %s - free %s), %s beyond that "
                 "default: another process on the card (a second notebook, a run still alive) or another framework "
                 "in this one (TensorFlow loaded by an earlier cell).",
                 f->V->text, f->R->text, fmt(f->ctx, b1, sizeof b1), cname,
                 fmt(f->V->bytes + f->R->bytes + f->ctx, b2, sizeof b2), f->T->text,
                 fmt(m->have_outside ? m->outside : 0, b3, sizeof b3), f->T->text, f->V->text, f->F ? f->F->text : "?",
                 fmt(m->have_outside && m->outside > f->ctx ? m->outside - f->ctx : 0, b4, sizeof b4));
    } else {
        add_diag(o, TK_DIAG_HEADROOM,
                 "headroom: %s of the card is held outside PyTorch's cache (total %s - reserved %s - free %s): the "
                 "CUDA context and library kernels, and whatever else runs on the card.",
                 fmt(m->outside, b1, sizeof b1), f->T->text, f->V ? f->V->text : "?", f->F ? f->F->text : "?");
    }
}
static void fix_outside(tk_diagnosis *o, const tk_facts *f, tk_finding *d) {
    char code[sizeof FREE_CODE + 48];
    snprintf(code, sizeof code, "%s\n!nvidia-smi   # any other process on the card?", FREE_CODE);
    add_fix(o, "free what earlier cells hold on the card before building the model (or restart the runtime)", code);
    /* for when what is held outside cannot be freed */
    fix_capacity(o, f, d);
}

/* Without a plan and without proof: the card was full, and either the
 * step or what earlier cells hold filled it; both are named. */
static int proves_filled(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    (void)m;
    return f->filled && !f->have_plan && !proves_other(f, o);
}
static void say_filled(tk_diagnosis *o, const tk_facts *f) {
    const tk_oom_message *m = f->msg;
    char b1[32], b2[32], cname[32];
    char figs[400];
    if (m->card && f->V && f->R) {
        upper(m->card->name, cname, sizeof cname);
        snprintf(figs, sizeof figs, "PyTorch's reserved %s + the request %s + %s for the %s's context and library "
                 "buffers (the profile's default, not measured) come to %s, at least the total %s",
                 f->V->text, f->R->text, fmt(f->ctx, b1, sizeof b1), cname,
                 fmt(f->V->bytes + f->R->bytes + f->ctx, b2, sizeof b2), f->T->text);
    } else if (f->A && f->A->bytes * 2 >= f->T->bytes) {
        snprintf(figs, sizeof figs, "your run had %s allocated by PyTorch when it failed, %.0f%% of the card (%s)",
                 f->A->text, 100.0 * (double)f->A->bytes / (double)f->T->bytes, f->T->text);
    } else {
        snprintf(figs, sizeof figs, "live tensors (%s) plus the request (%s) come to %s, more than the whole card (%s)",
                 f->A->text, f->R ? f->R->text : "?", fmt(f->A->bytes + (f->R ? f->R->bytes : 0), b1, sizeof b1),
                 f->T->text);
    }
    add_diag(o, TK_DIAG_STEP_OR_HELD,
             "the step or held memory: %s, so PyTorch filled the card; either one training step needs more than this "
             "card, or tensors that earlier cells still hold take the room, and your config tells which (txk advise "
             "CFG --from-error MSG).",
             figs);
}
static void fix_filled(tk_diagnosis *o, const tk_facts *f, tk_finding *d) {
    add_fix(o, "if an earlier cell's model or optimizer is still on the card: free it (or restart the runtime), then "
               "run the training cell once",
            FREE_CODE);
    fix_capacity(o, f, d);
}

/* figures that cannot be true: only free against the request is left */
static int proves_unreadable(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    int bad = 0;
    for (int i = 0; i < TK_OOMFIG_COUNT; i++) bad |= m->fig[i].present && m->fig[i].unreliable;
    return bad && o->n_diag == 0 && f->R && f->F && f->F->bytes < f->R->bytes;
}
static void say_unreadable(tk_diagnosis *o, const tk_facts *f) {
    add_diag(o, TK_DIAG_STEP_OR_HELD,
             "the step or held memory: the card had %s free for a %s request, and the message's in-use figures cannot "
             "be true, so who holds the memory cannot be read from it (check with nvidia-smi or "
             "torch.cuda.memory_summary()).",
             f->F->text, f->R->text);
}

static int proves_dominant(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    (void)m;
    return f->R && (!f->torch || (f->T && !f->request_over_card && f->R->bytes * 4 >= f->T->bytes));
}
static void say_dominant(tk_diagnosis *o, const tk_facts *f) {
    const tk_oom_message *m = f->msg;
    char b1[32], b2[32];
    const tk_oommsg_figure *R = f->R;
    if (f->tf_dense) {
        uint64_t train = R->overflow ? 0 : R->bytes * 4;
        add_diag(o, TK_DIAG_DOMINANT_LAYER,
                 "dominant_layer: the tensor [%lld,%lld] of %s is a Dense kernel%s%s%s over %lld = %d x %d x %d inputs, "
                 "that is %d flattened tower%s of %d tokens x %d hidden units, into %lld units: %s of weights alone%s, "
                 "and training adds its gradient and Adam's two moments (%s in fp32), more than a 16 GB card holds.",
                 (long long)m->shape[0], (long long)m->shape[1], R->text, m->node[0] ? " (node " : "", m->node,
                 m->node[0] ? ")" : "", (long long)m->shape[0], f->dom_seq, f->dom_hidden, f->dom_towers, f->dom_towers,
                 f->dom_towers > 1 ? "s" : "", f->dom_seq, f->dom_hidden, (long long)m->shape[1],
                 fmt(R->bytes, b1, sizeof b1), m->dtype_assumed ? " (float32 assumed: the message names no type)" : "",
                 fmt(train, b2, sizeof b2));
    } else if (!f->torch) {
        add_diag(o, TK_DIAG_DOMINANT_LAYER, "dominant_layer: one tensor of shape [%lld%s] and type %s needs %s.",
                 (long long)m->shape[0], m->rank > 1 ? ",..." : "", m->dtype, R->text);
    } else {
        add_diag(o, TK_DIAG_DOMINANT_LAYER, "dominant_layer: one tensor of %s is %.0f%% of the card.", R->text,
                 100.0 * (double)R->bytes / (double)f->T->bytes);
    }
}
static void fix_dominant(tk_diagnosis *o, const tk_facts *f, tk_finding *d) {
    const tk_oom_message *m = f->msg;
    (void)d;
    if (f->tf_dense) {
        add_fix(o, "a per-token span head instead of Dense over the flattened towers (768 x 2 weights, not "
                   "786432 x 1604)",
                "start_end = tf.keras.layers.Dense(2)(context_bert_layer)   # [batch, 512, 2]\n"
                "start_logits, end_logits = tf.unstack(start_end, axis=-1)");
        add_fix(o, "or pool the towers before the classifier",
                "q = tf.keras.layers.GlobalAveragePooling1D()(questions_bert_layer)\n"
                "c = tf.keras.layers.GlobalAveragePooling1D()(context_bert_layer)\n"
                "out = tf.keras.layers.Dense(1604, activation=\"softmax\")(tf.keras.layers.Concatenate()([q, c]))");
    } else if (!f->torch) {
        /* the tensor's two halvings in Keras, from the one writer: the policy, then half the batch */
        char code[1400];
        tk_step_user u = step_user(m);
        int k = tk_step_code(code, sizeof code, TK_STEP_FP16, TK_API_KERAS, &u);
        if (k >= 0 && (size_t)k + 1 < sizeof code) {
            code[k] = '\n';
            tk_step_code(code + k + 1, sizeof code - (size_t)k - 1, TK_STEP_HALF_BATCH, TK_API_KERAS, &u);
        }
        add_fix(o, "halve the tensor: a smaller batch or mixed precision", code);
    }
}

/* the user's config planned on the platform's cards */
static int proves_cards(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    (void)m;
    return f->platform && f->n_cards > 0;
}
static void say_cards(tk_diagnosis *o, const tk_facts *f) {
    const tk_oom_message *m = f->msg;
    config_on_cards(o, m, f->platform, f->cards, f->n_cards);
}

/* the platform's paragraphs from the figures alone; with a plan only when
 * the plan shows a lottery too (the config fits some of the platform's cards
 * and not others): never contradicting it */
static int proves_platform(const tk_facts *f, const tk_diagnosis *o) {
    const tk_oom_message *m = f->msg;
    if (!m) return 0;
    if (!(f->torch && m->card && f->T && m->have_outside)) return 0;
    if (!f->have_plan) return 1;
    int fit = 0, not_fit = 0;
    for (int i = 0; i < f->n_cards; i++) fit |= f->cards[i].fits, not_fit |= !f->cards[i].fits;
    return fit && not_fit;
}
static void say_platform(tk_diagnosis *o, const tk_facts *f) {
    const tk_oom_message *m = f->msg;
    /* a P4 or K80 message under --for colab is 2020's Colab */
    platform_diagnoses(o, m, m->platform[0] ? tk_platform_era(m->platform, m->card) : "", f->T->bytes - m->outside);
}
static void fix_platform(tk_diagnosis *o, const tk_facts *f, tk_finding *d) {
    const tk_oom_message *m = f->msg;
    if (d->kind == TK_DIAG_LOTTERY) {
        add_fix(o, "on Colab: see which card the runtime got before training, and plan for the smallest one",
                "!nvidia-smi --query-gpu=name,memory.total --format=csv");
        return;
    }
    if (d->kind != TK_DIAG_PLATFORM || strncmp(d->text, "kaggle", 6)) return;
    add_fix(o, "on Kaggle: choose the accelerator in the notebook's Settings > Accelerator (GPU T4 x2, "
               "GPU P100, RTX PRO 6000); the session restarts on it",
            "!nvidia-smi --query-gpu=name,memory.total --format=csv   # what the session has");
    /* one T4 of a pair, or the pair chosen: both cards, each with half the batch */
    if (m->card && !strcmp(m->card->name, "t4") && m->parallel == TK_OOMMSG_ONE_GPU) {
        char code[600];
        tk_launch_code(code, sizeof code, TK_PAR_DDP, 0, f->api != TK_API_LOOP, "2");
        add_fix(o, "on Kaggle's GPU T4 x2: both T4s with DDP, each holding the model and half of each batch "
                   "(not planned from the message alone: txk advise CFG --from-error M --for kaggle plans it "
                   "for your config)",
                code);
    }
}


char *tk_cards_sentence(const tk_card_fit *cards, int n, const char *platform, char *buf, size_t buf_n) {
    char yes[200] = "", no[200] = "", nm[32];
    size_t wy = 0, wn = 0;
    int ny = 0, nn = 0;
    for (int i = 0; i < n; i++) {
        upper(cards[i].card->name, nm, sizeof nm);
        if (cards[i].fits) {
            wy += (size_t)snprintf(yes + wy, wy < sizeof yes ? sizeof yes - wy : 0, "%s%s", wy ? ", " : "", nm);
            if (wy >= sizeof yes) wy = sizeof yes - 1;
            ny++;
        } else {
            nn++;
            /* "P4 or K80": the last of the list joins with "or" */
            int last = 1;
            for (int k = i + 1; k < n; k++) last &= cards[k].fits;
            wn += (size_t)snprintf(no + wn, wn < sizeof no ? sizeof no - wn : 0, "%s%s", wn ? (last ? " or " : ", ") : "", nm);
            if (wn >= sizeof no) wn = sizeof no - 1;
        }
    }
    int kaggle = platform && !strcmp(platform, "kaggle");
    if (!nn) snprintf(buf, buf_n, "fits on every card (%s)", yes);
    else if (!ny) snprintf(buf, buf_n, "fits on none of them (%s): change the config before %s a bigger card", no,
                           kaggle ? "choosing" : "hoping for");
    else if (kaggle) snprintf(buf, buf_n, "fits on %s; not on %s: choose one it fits in Settings > Accelerator", yes, no);
    else snprintf(buf, buf_n, "fits on %s; not on %s: which card the runtime gets decides", yes, no);
    return buf;
}

/* ---- the plan of a config as given -------------------------------------------------- */

/* The companion's live torch state as a clause: what PyTorch in the user's
 * process holds, or why it holds nothing; "" when it was not read. */
static void torch_live_words(const tk_advise_torch *l, char *buf, size_t n) {
    char a[32], r[32], c[32];
    buf[0] = 0;
    if (!l) return;
    switch (l->state) {
    case TK_TORCH_LIVE_HOLDS:
        snprintf(buf, n, " (read live: torch.cuda.memory_reserved() %s, memory_allocated() %s: %s is cache "
                 "empty_cache() returns, the rest live tensors only del frees)",
                 fmtb(l->reserved, r), fmtb(l->allocated, a), fmtb(l->reserved > l->allocated ? l->reserved - l->allocated : 0, c));
        break;
    case TK_TORCH_LIVE_NOT_IMPORTED:
        snprintf(buf, n, "; PyTorch is not imported in this process, so it holds none of it");
        break;
    case TK_TORCH_LIVE_NO_CUDA:
        snprintf(buf, n, "; PyTorch in this process sees no CUDA device, so it holds none of it");
        break;
    case TK_TORCH_LIVE_IDLE:
        snprintf(buf, n, "; PyTorch in this process has not initialised CUDA, so it holds none of it");
        break;
    }
}

/* capacity: the run needs more than the card */
static int proves_capacity(const tk_facts *f, const tk_diagnosis *o) { return f->base && f->over_capacity; }
static void say_capacity(tk_diagnosis *o, const tk_facts *f) {
    const tk_plan_result *p = f->base;
    char b1[32], b2[32], b3[32], b4[32], t[160], e[768];
    size_t need = p->peak_reserved;
    snprintf(t, sizeof t, "the run needs %s; the device has %s", fmtb(need, b1), fmtb(f->capacity, b2));
    snprintf(e, sizeof e, "planned peak %s reserved (%s allocated) at batch %d x %d tokens; capacity %s; short by %s",
             fmtb(need, b1), fmtb(p->peak_allocated, b2), p->batch, p->seq, fmtb(f->capacity, b3),
             fmtb(need - f->capacity, b4));
    add_titled(o, TK_DIAG_CAPACITY, t, e);
}

/* headroom: it fits the card but not what is free now (an earlier run,
 * PyTorch in this process, another process) */
static int proves_headroom(const tk_facts *f, const tk_diagnosis *o) { return f->base && f->over_free; }
static void say_headroom(tk_diagnosis *o, const tk_facts *f) {
    char b1[32], b2[32], b3[32], t[160], e[768];
    snprintf(t, sizeof t, "the run fits the device (%s of %s) but only %s is free now",
             fmtb(f->base->peak_reserved, b1), fmtb(f->capacity, b2), fmtb(f->available, b3));
    char live[320];
    torch_live_words(f->torch_live, live, sizeof live);
    if (f->held_in_process)
        snprintf(e, sizeof e, "PyTorch's caching allocator in this process holds %s of it%s%s%s%s: "
                 "del what you no longer need, gc.collect(), torch.cuda.empty_cache()",
                 fmtb(f->held_in_process, b1), live, f->held_by_session ? " and an earlier run in this session " : "",
                 f->held_by_session ? fmtb(f->held_by_session, b2) : "", f->held_by_session ? " (%txreset)" : "");
    else if (f->held_by_session)
        snprintf(e, sizeof e, "an earlier run in this session still holds %s; %%txreset releases it%s",
                 fmtb(f->held_by_session, b1), live);
    else
        snprintf(e, sizeof e, "%s of the device is taken outside this run (another process or the CUDA context)%s",
                 fmtb(f->capacity - f->available, b1), live);
    add_titled(o, TK_DIAG_HEADROOM, t, e);
}

/* the last run of this config ran out although the plan fits what is free:
 * what the plan does not count held the rest when it ran */
static int proves_ran_out_fits(const tk_facts *f, const tk_diagnosis *o) { return f->base && f->ran_out_fits; }
static void say_ran_out_fits(tk_diagnosis *o, const tk_facts *f) {
    const tk_advise_run *r = f->last_run;
    char b1[32], b2[32], b3[32], b4[32], b5[32], t[160], e[1400], rec[300] = "", live[320];
    snprintf(t, sizeof t, "the last run of this config ran out of memory; the plan (%s) fits the %s available",
             fmtb(f->base->peak_reserved, b1), fmtb(f->available, b2));
    if (r->oom)
        snprintf(rec, sizeof rec, "its OOM record%s%s: %s asked for %s with %s allocated and %s reserved; ",
                 r->oom_phase && r->oom_phase[0] ? " in " : "", r->oom_phase && r->oom_phase[0] ? r->oom_phase : "",
                 r->oom->owner_name[0] ? r->oom->owner_name : "a tensor", fmtb(r->oom->requested, b1),
                 fmtb(r->oom->allocated, b2), fmtb(r->oom->reserved, b3));
    torch_live_words(f->torch_live, live, sizeof live);
    snprintf(e, sizeof e, "%sthe run started with %s free and measured a peak of %s reserved, against the plan's %s, "
             "so memory the plan does not count was taken while it ran (another process, or tensors this process "
             "keeps)%s",
             rec, fmtb(r->free_before, b4), fmtb(r->peak_reserved, b5), fmtb(f->base->peak_reserved, b1), live);
    add_titled(o, TK_DIAG_HEADROOM, t, e);
}
static void fix_headroom(tk_diagnosis *o, const tk_facts *f, tk_finding *g) {
    (void)g;
    if (f->held_by_session || f->held_in_process) o->cause |= 1u << TK_FIX_RELEASE;
}

/* fragmentation: the session's OOM record found enough cached bytes but no block that fits */
static int proves_oom_frag(const tk_facts *f, const tk_diagnosis *o) { return f->base && f->oom_frag; }
static void say_oom_frag(tk_diagnosis *o, const tk_facts *f) {
    const tk_oom *r = f->oom;
    char b1[32], b2[32], b3[32], b4[32], t[160], e[768];
    snprintf(t, sizeof t, "fragmentation: %s cached but no free block of %s", fmtb(r->reserved - r->allocated, b1),
             fmtb(r->rounded, b2));
    snprintf(e, sizeof e, "asked %s for %s (%s); reserved %s, allocated %s, largest free block %s",
             fmtb(r->requested, b1), r->owner_name, f->oom_cat, fmtb(r->reserved, b2),
             fmtb(r->allocated, b3), fmtb(r->largest_free_block, b4));
    add_titled(o, TK_DIAG_FRAGMENTATION, t, e);
}
static void fix_oom_frag(tk_diagnosis *o, const tk_facts *f, tk_finding *g) {
    (void)f, (void)g;
    o->cause |= 1u << TK_FIX_EMPTY_CACHE;
}

/* dominant layer: one owner's bytes at the peak (params, grads, state) */
static int proves_dominant_layer(const tk_facts *f, const tk_diagnosis *o) {

    return f->base && f->top_share >= 0.25;
}
static void say_dominant_layer(tk_diagnosis *o, const tk_facts *f) {
    const tk_plan_result *p = f->base;
    char b1[32], b2[32], b3[32], t[160], e[768];
    snprintf(t, sizeof t, "%s holds %.0f%% of the peak (%s)", p->top[0].owner, 100 * f->top_share,
             fmtb(p->top[0].bytes, b1));
    if (f->head_dominates)
        snprintf(e, sizeof e,
                 "the flatten_dense head's weight is [%d x %lld] = %s in fp32; with its gradient and "
                 "two Adam moments %s. A per-token span head needs %s",
                 f->head_units, (long long)f->head_in, fmtb(f->head_weight, b1), fmtb(4 * f->head_weight, b2),
                 fmtb(f->head_span, b3));
    else
        snprintf(e, sizeof e, "%s of %s allocated at the peak belong to %s", fmtb(p->top[0].bytes, b1),
                 fmtb(p->peak_allocated, b2), p->top[0].owner);
    add_titled(o, TK_DIAG_DOMINANT_LAYER, t, e);
}
static void fix_dominant_layer(tk_diagnosis *o, const tk_facts *f, tk_finding *g) {
    (void)g;
    if (f->head_dominates) o->cause |= 1u << TK_FIX_HEAD;
}

/* dominant category: activations, or the model states */
static int proves_dominant_category(const tk_facts *f, const tk_diagnosis *o) {

    return f->base && (f->act_share >= 0.5 || f->states_share >= 0.6);
}
static void say_dominant_category(tk_diagnosis *o, const tk_facts *f) {
    const tk_plan_result *p = f->base;
    char b1[32], b2[32], b3[32], b4[32], t[160], e[768];
    if (f->act_share >= 0.5) {
        snprintf(t, sizeof t, "activations are %.0f%% of the peak (%s)", 100 * f->act_share, fmtb(f->act, b1));
        snprintf(e, sizeof e,
                 "batch %d x %d tokens: activations %s vs params+grads+optimizer %s; they scale "
                 "with batch x max_len (attention with max_len squared)",
                 p->batch, p->seq, fmtb(f->act, b1), fmtb(f->states, b2));
    } else {
        snprintf(t, sizeof t, "model states are %.0f%% of the peak (%s)", 100 * f->states_share, fmtb(f->states, b1));
        snprintf(e, sizeof e, "params %s, grads %s, optimizer %s; activations %s",
                 fmtb(p->by_cat_at_peak[TK_CAT_PARAM], b1), fmtb(p->by_cat_at_peak[TK_CAT_GRAD], b2),
                 fmtb(p->by_cat_at_peak[TK_CAT_OPTIM], b3), fmtb(f->act, b4));
    }
    add_titled(o, TK_DIAG_DOMINANT_CATEGORY, t, e);
}

/* padding: fixed padding to a max_len far above what the corpus needs */
static int proves_padding(const tk_facts *f, const tk_diagnosis *o) { return f->base && f->padded; }
static void say_padding(tk_diagnosis *o, const tk_facts *f) {
    char t[160], e[768];
    snprintf(t, sizeof t, "99%% of examples are at most %d tokens; max_len %d pads them", f->p99, f->config->max_len);
    snprintf(e, sizeof e,
             "%d examples: p50 %d, p99 %d, max %d tokens; with fixed padding %.0f%% of every "
             "batch is padding",
             f->n_lengths, f->p50, f->p99, f->len_max, 100 * f->pad_waste);
    add_titled(o, TK_DIAG_PADDING, t, e);
}
static void fix_padding(tk_diagnosis *o, const tk_facts *f, tk_finding *g) {
    (void)f, (void)g;
    o->cause |= 1u << TK_FIX_MAX_LEN | 1u << TK_FIX_PADDING;
}

/* data spike: under dynamic padding or buckets the longest batch is far
 * above the typical one */
static int proves_spike(const tk_facts *f, const tk_diagnosis *o) { return f->base && f->spike; }
static void say_spike(tk_diagnosis *o, const tk_facts *f) {
    char t[160], e[768];
    snprintf(t, sizeof t, "the longest batch pads to %d tokens; the typical one to about %d", f->spike_cap,
             f->spike_typical);
    snprintf(e, sizeof e,
             "with %s batching memory follows the longest batch: p50 %d, p99 %d, max %d; the "
             "peak comes only when that batch comes, so the OOM looks intermittent",
             f->config->batching == TK_BATCH_BUCKETS ? "bucketed" : "dynamic", f->p50, f->p99, f->len_max);
    add_titled(o, TK_DIAG_DATA_SPIKE, t, e);
}
static void fix_spike(tk_diagnosis *o, const tk_facts *f, tk_finding *g) {
    (void)f, (void)g;
    o->cause |= 1u << TK_FIX_MAX_LEN;
}

/* leak: allocated at step boundaries keeps growing */
static int proves_step_leak(const tk_facts *f, const tk_diagnosis *o) { return f->base && f->leak; }
static void say_step_leak(tk_diagnosis *o, const tk_facts *f) {
    char b1[32], b2[32], t[160], e[768];
    snprintf(t, sizeof t, "allocated grows by %s per step%s%s", fmtb(f->leak_per, b1), f->leak_owner ? " in " : "",
             f->leak_owner ? f->leak_owner : "");
    snprintf(e, sizeof e,
             "allocated at step boundaries went from %s to %s over %d steps; something keeps a "
             "reference each step%s%s",
             fmtb(f->leak_first, b1), fmtb(f->leak_last, b2), f->n_steps, f->leak_owner ? ": " : "",
             f->leak_owner ? f->leak_owner : "");
    add_titled(o, TK_DIAG_LEAK, t, e);
}

/* the card lottery: the same config on each card the platform hands out;
 * on Kaggle the card is the notebook's setting, so the same plans say which
 * to choose (card choice) */
static int proves_lottery(const tk_facts *f, const tk_diagnosis *o) { return f->base && f->lottery; }
static void say_lottery(tk_diagnosis *o, const tk_facts *f) {
    char b1[32], t[160], e[768];
    const tk_card_fit *cards = f->cards;
    int nc = f->n_cards, near = f->lottery_near;
    tk_cards_sentence(cards, nc, f->platform, t, sizeof t);
    size_t w = (size_t)snprintf(e, sizeof e, "planned on each card %s hands out (its capacity less its context):",
                                f->platform);
    for (int i = 0; i < nc && w < sizeof e; i++) {
        int64_t mg = cards[i].margin;
        w += (size_t)snprintf(e + w, sizeof e - w, " %s %s%s%s", cards[i].card->name, mg < 0 ? "short by " : "margin ",
                              fmtb((size_t)(mg < 0 ? -mg : mg), b1), i + 1 < nc ? ";" : "");
    }
    if (near >= 0 && w < sizeof e)
        snprintf(e + w, sizeof e - w, "; on the %s it fits within 5%% of the budget, so a little more memory "
                 "held elsewhere (an earlier cell, a longer batch) makes it fail",
                 cards[near].card->name);
    add_titled(o, strcmp(f->platform, "kaggle") ? TK_DIAG_LOTTERY : TK_DIAG_CHOICE, t, e);
}

/* ---- a PyTorch snapshot ------------------------------------------------------------- */

static void fixes_fragmentation(tk_diagnosis *o, const tk_facts *f) {
    const tk_snapshot *s = f->snap;
    char a[32], b[32];
    /* what allocator_settings (or the segments) show is on is not advised again */
    tk_fix_note *x = s->expandable_on ? NULL
                                      : add_fix_id(o, "expandable_segments", (int64_t)(s->free_in_cache - s->largest_free_block));
    if (x) {
        snprintf(x->text, sizeof x->text,
                 "Let the allocator grow segments instead of stranding free blocks: %s of free cache is in blocks "
                 "smaller than the largest (%s) and becomes usable. Set it before the first CUDA call "
                 "(restart the runtime).",
                 fmtb(s->free_in_cache - s->largest_free_block, a), fmtb(s->largest_free_block, b));
        snprintf(x->code, sizeof x->code,
                 "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"\nimport torch");
    }
    if (s->empty_segments && (x = add_fix_id(o, "empty_cache", (int64_t)s->empty_segments))) {
        snprintf(x->text, sizeof x->text,
                 "Return the cached segments that hold no live tensor (%s) to the device, e.g. between "
                 "evaluation and training.",
                 fmtb(s->empty_segments, a));
        snprintf(x->code, sizeof x->code, "torch.cuda.empty_cache()");
    }
}

/* the fixes that shrink what the snapshot's code keeps: drop what the user's
 * code holds, then the step's own size */
static void fixes_capacity(tk_diagnosis *o, const tk_facts *f) {
    const tk_snapshot *s = f->snap;
    char a[32];
    tk_fix_note *x;
    const tk_snap_owner *user = f->snap_user >= 0 ? &s->owners[f->snap_user] : NULL;
    if (user && (x = add_fix_id(o, "del", (int64_t)user->bytes))) {
        snprintf(x->text, sizeof x->text,
                 "Drop the references made at %s once they are no longer needed (%s live in %d blocks), "
                 "then collect and release the cache.",
                 user->owner, fmtb(user->bytes, a), user->blocks);
        snprintf(x->code, sizeof x->code,
                 "del outputs, loss  # the tensors created at %s\nimport gc; gc.collect()\ntorch.cuda.empty_cache()",
                 user->owner);
    }
    /* the step's own size, through the one writer of a step change: a
     * snapshot gives no numbers, so every one is a named placeholder */
    tk_step_user u = {.torch = TK_TORCH_2};
    if ((x = add_fix_id(o, "batch", -1))) {
        snprintf(x->text, sizeof x->text,
                 "Halve the micro-batch and accumulate twice as many steps: the effective batch stays, the "
                 "activations halve (this snapshot does not separate activations from weights, so it cannot "
                 "say how many bytes that is).");
        tk_step_code(x->code, sizeof x->code, TK_STEP_HALF_BATCH, f->api, &u);
    }
    if ((x = add_fix_id(o, "precision", -1))) {
        snprintf(x->text, sizeof x->text,
                 "Mixed precision keeps activations in 16 bits, about half their bytes (bf16 on Ampere or newer, "
                 "fp16 on a T4 or V100).");
        tk_step_code(x->code, sizeof x->code, TK_STEP_FP16, f->api, &u);
    }
    if ((x = add_fix_id(o, "checkpointing", -1))) {
        snprintf(x->text, sizeof x->text,
                 "Gradient checkpointing keeps one activation per layer and recomputes the rest in backward "
                 "(about 30%% more compute).");
        tk_step_code(x->code, sizeof x->code, TK_STEP_CHECKPOINTING, f->api, &u);
    }
    if ((x = add_fix_id(o, "max_length", -1))) {
        snprintf(x->text, sizeof x->text,
                 "Shorter sequences shrink every activation (attention scores quadratically); pick max_length from "
                 "the data's token lengths (txk data FILE shows the percentiles) and pad each batch to its longest.");
        tk_step_code(x->code, sizeof x->code, TK_STEP_SHORTER, f->api, &u);
    }
}

/* A leak is the cause when there is one: whatever else the end shows, it
 * would have grown into it. */
static int proves_snap_leak(const tk_facts *f, const tk_diagnosis *o) { return f->snap && f->snap->has_leak; }
static void say_snap_leak(tk_diagnosis *o, const tk_facts *f) {
    const tk_snapshot *s = f->snap;
    char a[32], b[32], c[32], who[600];
    if (f->leak_who)
        snprintf(who, sizeof who, "; still live at the end: %s in %d blocks allocated at %s in %d different iterations.",
                 fmtb(s->leak_owner_bytes, c), s->leak_owner_blocks, f->leak_who, s->leak_owner_iterations);
    else
        snprintf(who, sizeof who, "; the trace's frames do not say who allocated what stays%s.",
                 s->leak_owner[0] ? " (no Python frame)" : "");
    add_diag(o, TK_DIAG_LEAK,
             "leak: allocated memory that stays from one iteration to the next grows by %s per iteration "
             "(%s over the %d iterations the trace shows)%s",
             fmtb(s->leak_per_iteration, a), fmtb(s->leak_total, b), s->leak_iterations, who);
}
static void fix_snap_leak(tk_diagnosis *o, const tk_facts *f, tk_finding *g) {
    (void)g;
    const tk_snapshot *s = f->snap;
    const char *who = f->leak_who;
    char a[32], b[32];
    tk_fix_note *x = add_fix_id(o, "leak", (int64_t)s->leak_total);
    if (!x) return;
    /* Many blocks kept per iteration is a graph kept alive; one or two are
     * outputs kept in a list or dict. */
    if (f->leak_graph)
        snprintf(x->text, sizeof x->text,
                 "Stop keeping each iteration's autograd graph: accumulate Python numbers, not tensors, and run "
                 "evaluation without a graph. The snapshot says this frees the %s that piled up (%s per "
                 "iteration)%s%s.",
                 fmtb(s->leak_total, a), fmtb(s->leak_per_iteration, b), who ? "; the code at " : "", who ? who : "");
    else
        snprintf(x->text, sizeof x->text,
                 "Keep copies off the device and without their graph: what is appended or stored each iteration "
                 "at %s stays on the GPU. The snapshot says this frees the %s that piled up (%s per iteration).",
                 who, fmtb(s->leak_total, a), fmtb(s->leak_per_iteration, b));
    snprintf(x->code, sizeof x->code,
             "%s"
             "total_loss += loss.item()                  # not total_loss += loss: that keeps every step's graph\n"
             "preds.append(logits.detach().cpu())        # not the CUDA tensor with its graph\n"
             "del outputs, loss                          # at the end of each step\n"
             "with torch.no_grad():                      # around evaluation: no graph is built\n"
             "    outputs = model(**batch)",
             f->leak_graph ? "" : "# the tensors kept at the line above\n");
}

static int proves_growth(const tk_facts *f, const tk_diagnosis *o) { return f->snap && f->snap->has_growth; }
static void say_growth(tk_diagnosis *o, const tk_facts *f) {
    char a[32];
    add_diag(o, TK_DIAG_GROWTH,
             "growth, not a leak: allocated rises by %s inside one step (%d rises that keep most of what they "
             "took: activations kept layer by layer for backward, the optimizer state created at its first "
             "step); no repeating loop leaves bytes behind in this trace.",
             fmtb(f->snap->growth_bytes, a), f->snap->growth_rises);
}

/* An inference engine's KV-cache pool, preallocated at its start to a
 * fraction of the card: the setting is that fraction. */
static int proves_engine_pool(const tk_facts *f, const tk_diagnosis *o) { return f->snap && f->snap_pool; }
static void say_engine_pool(tk_diagnosis *o, const tk_facts *f) {
    char a[32], b[32];
    add_diag(o, TK_DIAG_ENGINE_POOL,
             "engine_pool: an inference engine's KV-cache pool (vLLM's cache engine, allocated at its __init__) "
             "holds %s of the %s allocated.",
             fmtb(f->snap->vllm_pool_bytes, a), fmtb(f->snap->allocated, b));
}
static void fix_engine_pool(tk_diagnosis *o, const tk_facts *f, tk_finding *g) {
    (void)g;
    const tk_snapshot *s = f->snap;
    char a[32], b[32];
    tk_fix_note *x = add_fix_id(o, "memory_fraction", -1);
    if (!x) return;
    snprintf(x->text, sizeof x->text,
             "vLLM preallocated its KV-cache pool at start-up: %s in %d blocks, %.0f%% of what is allocated (%s). "
             "It takes gpu_memory_utilization of the card whatever the requests need; lower it to leave room for the "
             "rest of the process (each 0.1 less frees a tenth of the card).",
             fmtb(s->vllm_pool_bytes, a), s->vllm_pool_blocks, 100.0 * (double)s->vllm_pool_bytes / (double)s->allocated,
             fmtb(s->allocated, b));
    snprintf(x->code, sizeof x->code,
             "llm = LLM(model=name, gpu_memory_utilization=0.5)   # vLLM's default is 0.9\n"
             "# verl: actor_rollout_ref.rollout.gpu_memory_utilization=0.5");
}

/* Fragmentation: enough is free in the cache, in pieces too small (the
 * reader decided it from the request's pool at an OOM, or from the cache's
 * shape without one). */
static int proves_snap_frag(const tk_facts *f, const tk_diagnosis *o) { return f->snap && f->snap_frag; }
static void say_snap_frag(tk_diagnosis *o, const tk_facts *f) {
    const tk_snapshot *s = f->snap;
    char a[32], b[32], c[32], d[32];
    add_diag(o, TK_DIAG_FRAGMENTATION,
             "fragmentation: %s of the %s PyTorch reserved is free, in %d blocks, but the largest is %s%s%s.%s",
             fmtb(s->free_in_cache, a), fmtb(s->reserved, b), s->n_free_blocks, fmtb(s->largest_free_block, c),
             f->snap_need ? " and the failed request was " : "", f->snap_need ? fmtb(f->snap_need, d) : "",
             s->expandable_on ? " Expandable segments are already on (allocator_settings), so that setting is not "
                                "advised." : "");
}
static void fix_snap_frag(tk_diagnosis *o, const tk_facts *f, tk_finding *g) {
    (void)g;
    fixes_fragmentation(o, f);
}

/* Capacity: at an OOM that is not fragmentation, no block of the pool fits
 * and the device cannot give a new segment; without an OOM, only with the
 * device's capacity known and live tensors filling it. */
static int proves_snap_cap(const tk_facts *f, const tk_diagnosis *o) { return f->snap && f->snap_cap; }
static void say_snap_cap(tk_diagnosis *o, const tk_facts *f) {
    const tk_snapshot *s = f->snap;
    char a[32], b[32], c[32], d[32], e[32], g[32], on[48] = "";
    if (f->snap_device >= 0) snprintf(on, sizeof on, " on device %d (of %d)", f->snap_device, f->snap_devices);
    if (s->has_oom)
        add_diag(o, TK_DIAG_CAPACITY,
                 "capacity: tried to allocate %s%s; no free block of the %s pool fits it (%s free there, largest "
                 "%s) and the device has only %s free for a new segment; live tensors hold %s of the %s "
                 "reserved%s.",
                 fmtb(f->snap_need, a), on, f->snap_pool_name, fmtb(f->snap_pool_free, b), fmtb(f->snap_pool_largest, c),
                 fmtb(s->oom_device_free, d), fmtb(f->snap_allocated, e), fmtb(f->snap_reserved, g),
                 f->snap_device >= 0 ? " there" : "");
    else
        add_diag(o, TK_DIAG_CAPACITY,
                 "capacity: live tensors fill the device: %s of its %s is allocated, the cache holds only %s "
                 "free (largest block %s).",
                 fmtb(s->allocated, a), fmtb(s->capacity, b), fmtb(s->free_in_cache, c), fmtb(s->largest_free_block, d));
}
static void fix_snap_cap(tk_diagnosis *o, const tk_facts *f, tk_finding *g) {
    (void)g;
    fixes_capacity(o, f);
}

/* Headroom: with the card's size known, what neither PyTorch holds nor the
 * device reports free is held by someone else. */
static int proves_snap_headroom(const tk_facts *f, const tk_diagnosis *o) { return f->snap && f->snap_headroom; }
static void say_snap_headroom(tk_diagnosis *o, const tk_facts *f) {
    const tk_snapshot *s = f->snap;
    char a[32], b[32];
    add_diag(o, TK_DIAG_HEADROOM,
             "headroom: %s of the %s device is held outside this process's cache (another process, an earlier "
             "run, or the CUDA context).",
             fmtb(s->capacity - f->snap_reserved - s->oom_device_free, a), fmtb(s->capacity, b));
}
static void fix_snap_headroom(tk_diagnosis *o, const tk_facts *f, tk_finding *g) {
    (void)f, (void)g;
    tk_fix_note *x = add_fix_id(o, "release", -1);
    if (!x) return;
    snprintf(x->text, sizeof x->text,
             "Free the device of the other holder: restart the runtime (or the process shown by nvidia-smi).");
    snprintf(x->code, sizeof x->code, "!nvidia-smi --query-compute-apps=pid,used_memory --format=csv");
}

/* the largest owner of what is live at the end, when it is code of the
 * user's (not a library's workspace, nor blocks with no frame) */
static int proves_snap_dominant(const tk_facts *f, const tk_diagnosis *o) { return f->snap && f->snap_dominant; }
static void say_snap_dominant(tk_diagnosis *o, const tk_facts *f) {
    const tk_snapshot *s = f->snap;
    char a[32];
    add_diag(o, TK_DIAG_DOMINANT_LAYER, "dominant_layer: %s holds %s, %.0f%% of what is allocated.", s->owners[0].owner,
             fmtb(s->owners[0].bytes, a), 100.0 * (double)s->owners[0].bytes / (double)s->allocated);
}

/* ---- the one table -------------------------------------------------------------------- */

/* The diagnosis the figures prove first: not an OOM, or a run on several
 * GPUs, before any figure; a leak before what it grew into; a request or a
 * step larger than the card, another process and memory held outside the
 * step before the cache's shape; the cache before what merely fills the
 * card; owners and categories, the data, then the platform's cards last. A
 * rule fires only with its reader's figures (the evidence it names). */
static const tk_rule RULES[] = {
    {TK_DIAG_NO_KERNEL_IMAGE, "message: \"no kernel image\" or torch's \"not compatible\" warning",
     proves_no_kernel, say_no_kernel, NULL, 1},
    {TK_DIAG_MULTI_GPU, "message: DataParallel's replica, DDP's rank", proves_multi_gpu, say_multi_gpu, fix_multi_gpu, 0},
    {TK_DIAG_LEAK, "snapshot: allocated between iterations rising, and who allocated what stays", proves_snap_leak,
     say_snap_leak, fix_snap_leak, 0},
    {TK_DIAG_GROWTH, "snapshot: allocated rising inside one step", proves_growth, say_growth, NULL, 0},
    {TK_DIAG_ENGINE_POOL, "snapshot: an inference engine's pool, half of what is allocated", proves_engine_pool,
     say_engine_pool, fix_engine_pool, 0},
    {TK_DIAG_CAPACITY, "message: the request against the card's total", proves_request_over, say_request_over,
     fix_capacity, 0},
    {TK_DIAG_CAPACITY, "plan: the planned peak reserved against the device's capacity", proves_capacity, say_capacity,
     NULL, 0},
    {TK_DIAG_OTHER_PROCESS, "message: a listed process whose bytes cannot hold PyTorch's reserved", proves_other,
     say_other, fix_other, 0},
    {TK_DIAG_HELD, "message's allocated against the plan's peak allocated (by 10 % and 256 MiB)", proves_held,
     say_held, fix_held, 0},
    {TK_DIAG_HEADROOM, "plan: the planned peak against what is free now, and who holds the rest", proves_headroom,
     say_headroom, fix_headroom, 0},
    {TK_DIAG_HEADROOM, "the session's last run of this config and its OOM record against the plan", proves_ran_out_fits,
     say_ran_out_fits, fix_headroom, 0},
    {TK_DIAG_CAPACITY, "plan on the message's card: its peak reserved against the card's budget", proves_step_over,
     say_step_over, fix_capacity, 0},
    {TK_DIAG_FRAGMENTATION, "the session's OOM record: cached bytes without a block that fits", proves_oom_frag,
     say_oom_frag, fix_oom_frag, 0},
    {TK_DIAG_FRAGMENTATION, "message: reserved-but-unallocated against the request; allocated against the plan",
     proves_frag, say_frag, fix_frag, 0},
    {TK_DIAG_STEP_OR_HELD, "message without a plan: reserved-but-unallocated against the request, allocated "
     "against the card", proves_split_or_held, say_split_or_held, fix_split_or_held, 0},
    {TK_DIAG_FRAGMENTATION, "snapshot: free blocks of the request's pool against the request", proves_snap_frag,
     say_snap_frag, fix_snap_frag, 0},
    {TK_DIAG_CAPACITY, "snapshot: no block fits and the device has no room for a segment", proves_snap_cap,
     say_snap_cap, fix_snap_cap, 0},
    {TK_DIAG_HEADROOM, "snapshot: the device's capacity less reserved and free", proves_snap_headroom,
     say_snap_headroom, fix_snap_headroom, 0},
    {TK_DIAG_STEP_OR_HELD, "message without a plan: reserved + request + context reach the total", proves_filled,
     say_filled, fix_filled, 0},
    {TK_DIAG_HEADROOM, "message: total less reserved and free, beyond the card's context", proves_outside,
     say_outside, fix_outside, 0},
    {TK_DIAG_STEP_OR_HELD, "message: in-use figures that cannot be true; free against the request",
     proves_unreadable, say_unreadable, fix_filled, 0},
    {TK_DIAG_DOMINANT_LAYER, "message: one tensor's share of the card, or TensorFlow's shape", proves_dominant,
     say_dominant, fix_dominant, 0},
    {TK_DIAG_DOMINANT_LAYER, "plan: the largest owner's share of the peak", proves_dominant_layer, say_dominant_layer,
     fix_dominant_layer, 0},
    {TK_DIAG_DOMINANT_LAYER, "snapshot: the largest owner of live bytes, the user's code", proves_snap_dominant,
     say_snap_dominant, fix_snap_cap, 0},
    {TK_DIAG_DOMINANT_CATEGORY, "plan: activations' or model states' share of the peak", proves_dominant_category,
     say_dominant_category, NULL, 0},
    {TK_DIAG_PADDING, "plan and corpus: max_len against the lengths' p99", proves_padding, say_padding, fix_padding, 0},
    {TK_DIAG_DATA_SPIKE, "plan and corpus: the longest batch against the typical one", proves_spike, say_spike,
     fix_spike, 0},
    {TK_DIAG_LEAK, "allocated at step boundaries rising", proves_step_leak, say_step_leak, NULL, 0},
    {TK_DIAG_LOTTERY, "message and config: the config planned on each of the platform's cards", proves_cards,
     say_cards, fix_platform, 0},
    {TK_DIAG_PLATFORM, "message: its card, the platform in its era, the room it had", proves_platform, say_platform,
     fix_platform, 0},
    {TK_DIAG_LOTTERY, "plan: the config planned on each of the platform's cards", proves_lottery, say_lottery, NULL, 0},
};

const tk_rule *tk_diagnosis_rules(int *n) {
    if (n) *n = (int)(sizeof RULES / sizeof RULES[0]);
    return RULES;
}

void tk_diagnose(const tk_facts *f, tk_diagnosis *d) {
    int md = d->max_diag > 0 && d->max_diag < TK_DIAGNOSIS_MAX ? d->max_diag : TK_DIAGNOSIS_MAX;
    int mf = d->max_fixes > 0 && d->max_fixes < TK_DIAGNOSIS_MAX_FIXES ? d->max_fixes : TK_DIAGNOSIS_MAX_FIXES;
    memset(d, 0, sizeof *d);
    d->max_diag = md, d->max_fixes = mf;
    for (size_t r = 0; r < sizeof RULES / sizeof RULES[0]; r++) {
        if (!RULES[r].proves(f, d)) continue;
        int before = d->n_diag;
        RULES[r].say(d, f);
        for (int i = before; i < d->n_diag; i++) d->by[i] = &RULES[r];
        if (RULES[r].last) break;
    }
    /* the fixes in the order of the findings they answer */
    for (int i = 0; i < d->n_diag; i++)
        if (d->by[i] && d->by[i]->fix) d->by[i]->fix(d, f, &d->diag[i]);
}

int tk_diagnose_into(const tk_facts *f, tk_finding *diag, int max_diag, int *n_diag, tk_fix_note *fixes,
                     int max_fixes, int *n_fixes) {
    tk_diagnosis *d = malloc(sizeof *d); /* malloc: the fuzz targets link this file without the host allocator */
    if (!d) return -1;
    d->max_diag = max_diag, d->max_fixes = max_fixes;
    tk_diagnose(f, d);
    *n_diag = d->n_diag;
    memcpy(diag, d->diag, (size_t)d->n_diag * sizeof *diag);
    *n_fixes = d->n_fixes;
    memcpy(fixes, d->fixes, (size_t)d->n_fixes * sizeof *fixes);
    free(d);
    return 0;
}
