/* tk_oom_message.h — the out-of-memory message a user pasted, read and
 * diagnosed: every figure PyTorch (each form it has printed since 1.0) or
 * TensorFlow put in it, the card its total names, what the figures imply, and
 * fixes written as the code the user would change.
 *
 * Ownership: everything here is plain data in caller-owned structs (no heap);
 * tk_oom_message_json returns a new string (free()). Inputs are borrowed.
 */
#ifndef TK_OOM_MESSAGE_H
#define TK_OOM_MESSAGE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "tk_advisor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TK_OOMMSG_NONE = 0,
    TK_OOMMSG_TORCH_CACHED,   /* <= 1.3: "(GPU n; T total capacity; A already allocated; F free; C cached)" */
    TK_OOMMSG_TORCH_RESERVED, /* 1.4-2.0: "...; F free; X reserved in total by PyTorch)" */
    TK_OOMMSG_TORCH_21,       /* 2.1+: "GPU n has a total capacity of T of which F is free. ..." */
    TK_OOMMSG_TF,             /* "OOM when allocating tensor with shape[..] and type T on .. by allocator .." */
    TK_OOMMSG_NO_KERNEL_IMAGE, /* not an OOM: "no kernel image is available for execution on the device", or
                                * PyTorch's warning "<card> with CUDA capability sm_NN is not compatible ..." */
} tk_oommsg_format;

/* How the run that failed spread over GPUs, as the message shows it. */
typedef enum {
    TK_OOMMSG_ONE_GPU = 0,
    TK_OOMMSG_DATAPARALLEL, /* "Caught OutOfMemoryError in replica N on device D" (torch.nn.DataParallel) */
    TK_OOMMSG_DDP,          /* "[rankN]:" lines, torchrun's "local_rank: N" or DistributedDataParallel frames */
} tk_oommsg_parallel;

/* The figures, in the order the JSON lists them. */
typedef enum {
    TK_OOMFIG_REQUESTED = 0,
    TK_OOMFIG_TOTAL,
    TK_OOMFIG_ALLOCATED,
    TK_OOMFIG_RESERVED,
    TK_OOMFIG_RESERVED_UNALLOCATED,
    TK_OOMFIG_FREE,
    TK_OOMFIG_PROCESS_IN_USE,
    TK_OOMFIG_COUNT
} tk_oomfig;

const char *tk_oomfig_name(tk_oomfig f); /* "requested", "total", ... (the JSON keys) */

typedef struct tk_oommsg_figure {
    int present;       /* printed in the message, or derived from printed ones */
    int derived;       /* 1: computed (reserved = allocated + cached, ...) */
    int unreliable;    /* 1: cannot be true; left out of every conclusion */
    int overflow;      /* 1: the printed figure does not fit in 64 bits */
    uint64_t bytes;    /* the printed figure times its unit, rounded to a byte */
    char text[40];     /* as printed ("5.42 GiB"), or formatted when derived */
} tk_oommsg_figure;

#define TK_OOMMSG_MAX_DIMS 8
#define TK_OOMMSG_MAX_DIAG 10
#define TK_OOMMSG_MAX_FIXES 10

#define TK_OOMMSG_MAX_PROCS 8

/* A "Process P has M memory in use." line (2.1+). */
typedef struct tk_oommsg_process {
    int pid;
    tk_oommsg_figure mem;
} tk_oommsg_process;

typedef struct tk_oom_message {
    tk_oommsg_format format;
    int gpu_index;                /* -1 when the message names none */
    int spelled_capacty;          /* 1: the 2.1-2.2 misspelling "total capacty" */
    tk_oommsg_figure fig[TK_OOMFIG_COUNT];
    int n_processes;              /* "Process P has M memory in use." lines (2.1+) */
    tk_oommsg_process proc[TK_OOMMSG_MAX_PROCS]; /* the first TK_OOMMSG_MAX_PROCS of them, as listed */
    /* TensorFlow */
    int rank;
    int64_t shape[TK_OOMMSG_MAX_DIMS];
    char dtype[24];               /* "float", "half", ... */
    int dtype_bytes;              /* 0 when the type is unknown */
    int dtype_assumed;            /* 1: a translation named no type; float (TensorFlow's default) assumed */
    int translated;               /* 1: TensorFlow's message in another language (ResourceExhaustedError ... OOM) */
    char node[160];               /* the graph node, when the message names it */
    char allocator[40];
    /* the card */
    const tk_gpu_profile *card;   /* the one profile whose capacity matches the total, or NULL */
    char card_text[96];           /* "p4" / "an 80 GB-class card (a100-80 or h100-80)" / "" */
    /* no kernel image: what the warning says, when it is there */
    char device_name[64];         /* "Tesla P100-PCIE-16GB" */
    char device_sm[16];           /* "sm_60" */
    char supported_sm[160];       /* "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120" */
    /* several GPUs */
    tk_oommsg_parallel parallel;
    int replica, replica_device;  /* DataParallel: "in replica N on device D"; -1 when not shown */
    int ddp_rank;                 /* DDP: the rank that failed ("[rank1]:", "local_rank: 1"); -1 when not shown */
    /* who ran it and where */
    int trainer;                  /* 1: the traceback shows transformers' Trainer (Trainer.train, trainer.py) */
    char platform[16];            /* "colab" / "kaggle" (or "colab-2020"): from a path the text shows (/content/,
                                   * /kaggle/), or set by the caller (--for) before diagnosing; "": not known */
    int platform_from_path;       /* 1: read from a path in the text */
    /* the user's own numbers, set by the caller before diagnosing (0: not
     * given): fix code carries them, or named placeholders without them */
    int user_batch, user_accumulate, user_max_len, user_p99;
    /* what the user's config has on already (have_user_config 1), so no fix
     * offers it again; and the API and versions the fix code is written in
     * (api TK_API_AUTO: the traceback's Trainer says trainer, else a loop) */
    int have_user_config;
    tk_precision user_precision;
    tk_recompute user_recompute;
    tk_optim user_optimizer;
    tk_batching user_batching;
    char user_output_dir[TK_PATH_MAX];
    tk_api api;
    tk_torch_version user_torch;  /* with have_user_config; otherwise 2.x's for a 2.1+ message */
    /* the plan of the user's config on the message's card, set by the caller
     * (have_plan 0: none): the diagnosis labels it against the message's
     * PyTorch figures and names the gap */
    int have_plan;
    uint64_t plan_peak;           /* planned peak reserved */
    uint64_t plan_allocated;      /* planned peak allocated (0: not given) */
    char plan_engine[160];        /* who planned it (tk_plan_engine_name, or "engine: pytorch, traced clf (...)"); "": txkernel's trainer */
    /* what the user's session knows, set by the caller after parsing (NULL:
     * absent): the companion's live torch state and the session's last run */
    const tk_advise_torch *torch_live;
    const tk_advise_run *last_run;
    /* derived */
    int have_outside;             /* total - reserved - free, from reliable figures */
    uint64_t outside;
    /* diagnosis */
    int n_diag;
    tk_finding diag[TK_OOMMSG_MAX_DIAG];
    int n_fixes;
    tk_fix_note fixes[TK_OOMMSG_MAX_FIXES];
} tk_oom_message;

/* Finds the last OOM message in text[0..len) (a whole traceback is fine; the
 * text need not be NUL-terminated) and reads its figures, flags impossible
 * ones and names the card; from the whole text, whether it was a
 * DataParallel or DDP run, whether the Trainer ran it, and the platform a
 * path shows (/kaggle/ or /content/; dist-packages paths prove nothing:
 * Kaggle's image is built on Colab's). Without one, a "no kernel image" error or
 * PyTorch's "not compatible" warning is read instead (format
 * NO_KERNEL_IMAGE, no figures). 0, or -1 when there is neither (*m is then
 * zeroed with format NONE). */
int tk_oom_message_parse(const char *text, size_t len, tk_oom_message *m);

/* What a run on the card of the message does on each of a platform's cards:
 * filled by the caller from plans (txk advise CFG --from-error), or left
 * n = 0 to reason from the message's figures alone. */
typedef struct tk_card_fit {
    const tk_gpu_profile *card;
    int fits;
    int64_t margin;               /* budget - planned peak */
    size_t peak;                  /* planned peak reserved */
    size_t peak_allocated;        /* planned peak allocated */
    size_t budget;                /* what the allocator can take on that card */
    double step_seconds;          /* predicted, 0 if unknown */
} tk_card_fit;

/* Diagnoses a parsed message through the advisor's one ordered table
 * (diagnoses.c, tk_diagnose): the facts record is filled once (the message's figures, its
 * processes, the plan of the user's config on its card, the card, the
 * platform in the message's era, the API), then each rule the facts prove
 * writes one sentence, and the fixes follow the diagnoses in order. First
 * a run on several GPUs; then a request larger than the card (capacity);
 * another process (named with pid and bytes; the user's own kernel never);
 * memory held outside the step (allocated above the plan by > 10 % of it
 * and 256 MiB: its first fix frees it); the plan above the card's usable
 * memory (capacity); fragmentation (the unallocated cache holds the request,
 * allocated matches the plan); memory outside PyTorch (headroom); without a
 * plan, a full card names both causes (step_or_held); then the platform:
 * the user's config on each card, or without a plan Colab's card lottery in
 * the message's era and Kaggle's accelerators. `cards` (may be NULL, n 0):
 * planned fits of the user's config on a platform's cards; `platform`
 * names those cards ("colab-2020"). */
void tk_oom_message_diagnose(tk_oom_message *m, const tk_card_fit *cards, int n, const char *platform);

/* The platform whose cards a config is planned on for this message: the
 * one set (--for) or shown, else the one that hands out its card, else
 * Colab; in the message's era: a P4 or K80 is 2020's Colab ("colab-2020")
 * even under --for colab. A static string or m->platform. */
const char *tk_oom_message_platform(const tk_oom_message *m);

/* Text report (new string, free()). */
char *tk_oom_message_format(const tk_oom_message *m);
/* The JSON object: requested, total, allocated, reserved, reserved_unallocated,
 * free, process_in_use (integer bytes, null when absent or too large),
 * card, unreliable, diagnoses [{id, text}], fixes [{text, code}]. New string. */
char *tk_oom_message_json(const tk_oom_message *m);
/* The same object as a JSON value (new reference), NULL when out of host
 * memory: for callers that put it in a bundle without a text round trip. */
json_t *tk_oom_message_to_json(const tk_oom_message *m);

/* Plans config c on each of a platform's cards (capacity cleared, gpu set to
 * the card), as `gpu: CARD` would. out gets at most max rows; *n_out their
 * count. */
tk_status tk_plan_cards(const tk_config *c, const int32_t *lengths, int n_lengths, const char *platform,
                        tk_card_fit *out, int max, int *n_out, tk_err *err);
/* The same, each card planned by `fn` (a traced model's planner; NULL:
 * tk_plan_engine). A pair the planner refuses is not a row. */
tk_status tk_plan_cards_by(tk_plan_fn fn, void *ctx, const tk_config *c, const int32_t *lengths, int n_lengths,
                           const char *platform, tk_card_fit *out, int max, int *n_out, tk_err *err);
/* NULL when `value` names a platform advice knows ("colab", "kaggle",
 * "colab-2020"; "all" too with allow_all); otherwise the error, naming
 * colab and kaggle, written to buf and returned. */
const char *tk_platform_check(const char *value, int allow_all, char *buf, size_t n);

/* "fits on T4, P100, L4, A100-40; not on P4 or K80: which card the runtime
 * gets decides" (or "fits on every card" / "fits on none"); on "kaggle" the
 * card is the user's choice ("choose one it fits in Settings >
 * Accelerator"). Returns buf. */
char *tk_cards_sentence(const tk_card_fit *cards, int n, const char *platform, char *buf, size_t buf_n);

#ifdef __cplusplus
}
#endif
#endif
