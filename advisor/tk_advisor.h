/* tk_advisor.h — why a run does not fit, and which change makes it fit.
 *
 * Inputs: a config, optionally the plan of it (or the record of a run-time
 * OOM), the corpus' token lengths, what the device has free now and what an
 * earlier run in this session still holds, the allocated bytes sampled at
 * step boundaries, the session's last run and the companion's live torch
 * state (both absent by default). Output: diagnoses, each with its evidence in numbers, and
 * a ranked list of candidate fixes, each a config the planner has planned.
 *
 * Every fix is a pure function config -> config (tk_fix_apply) with a one-line
 * reason. A fix the trainer cannot run (the planner rejects the config) is
 * never offered. Ranking: first whether it fits with margin, then whether it
 * removes a diagnosed cause (a cause before a symptom), then fewer changes,
 * then whether more than 2% of results are at risk, then the predicted time
 * per training sample relative to the original config (from the meta
 * FLOP/byte counts and the GPU profile), then the risk to results (examples
 * truncated, effective batch changed, share of the model frozen).
 *
 * Ownership: tk_advise fills a caller-owned tk_advice (plain data, no heap;
 * about 200 KB, so allocate it, do not put it on a thread's stack); inputs are
 * borrowed for the call.
 */
#ifndef TK_ADVISOR_H
#define TK_ADVISOR_H

#include <stddef.h>
#include <stdint.h>
#include "tk_gpu.h"
#include "tk_config.h"
#include "tk_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TK_DIAG_CAPACITY = 0,   /* the run needs more than the card has */
    TK_DIAG_HEADROOM,       /* fits the card, not what is free now */
    TK_DIAG_FRAGMENTATION,  /* enough cached but no block fits */
    TK_DIAG_DOMINANT_LAYER, /* one owner's param+grad+optim state is a large share */
    TK_DIAG_DOMINANT_CATEGORY, /* activations (or model states) dominate the peak */
    TK_DIAG_PADDING,        /* max_len far above what the corpus needs */
    TK_DIAG_DATA_SPIKE,     /* the longest batch is far above the typical one */
    TK_DIAG_LEAK,           /* allocated grows at step boundaries */
    TK_DIAG_LOTTERY,        /* fits some of the platform's cards, not the one the runtime got (Colab) */
    TK_DIAG_CHOICE,         /* fits some of the cards the user chooses from, not the one chosen (Kaggle) */
    TK_DIAG_HELD,           /* allocated exceeds the plan of the step: earlier cells' tensors (or another config) */
    TK_DIAG_OTHER_PROCESS,  /* another process on the card, named with its pid and bytes */
    TK_DIAG_STEP_OR_HELD,   /* the card was full and nothing tells whether the step or earlier cells filled it */
    TK_DIAG_NO_KERNEL_IMAGE, /* not an OOM: the installed torch has no kernels for the card */
    TK_DIAG_MULTI_GPU,      /* a DataParallel or DDP run: one GPU's message of several */
    TK_DIAG_PLATFORM,       /* what the platform (Kaggle, or one the message does not show) means for it */
    TK_DIAG_GROWTH,         /* allocated rises inside one step (a snapshot's trace), not a leak */
    TK_DIAG_ENGINE_POOL,    /* an inference engine's preallocated KV-cache pool (a snapshot) */
    TK_DIAG_COUNT
} tk_diag_kind;

const char *tk_diag_name(tk_diag_kind k); /* "capacity", "headroom", ... */
/* The JSON id of a diagnosis ("capacity", "held", "another_process",
 * "step_or_held", "card_lottery", ...): the one table's ids (diagnoses.c). */
const char *tk_diag_id(tk_diag_kind k);

/* A diagnosis in one readable sentence, each figure with what it means:
 * what the ordered diagnoses write for a pasted message (oom_message.c) and
 * for a snapshot (snapshot_diagnose.c). */
typedef struct tk_finding {
    tk_diag_kind kind;
    char text[1400];
} tk_finding;

/* A fix written for the user, in the order of the diagnosis it answers:
 * what to change, in words, and the code in the user's API. A snapshot's
 * fixes also carry an id, what the snapshot shows they free, and their plan;
 * a message's leave those zero. */
typedef struct tk_fix_note {
    char id[24];          /* "expandable_segments", "del", "batch", ...; "" for a message's */
    char text[512];
    char code[1400];
    int64_t saves;        /* bytes the snapshot shows it frees, or -1 when it cannot tell */
    int planned;          /* 1: planned on the recognised model (tk_snap_plan) */
    size_t plan_peak;     /* its planned peak reserved bytes */
    int plan_fits;        /* 1: plan_peak fits the capacity (or no capacity is known) */
    char plan_change[96]; /* the planner's keys changed, "precision=bf16" */
} tk_fix_note;

typedef struct tk_diag {
    tk_diag_kind kind;
    char title[160];     /* one line */
    char evidence[768];  /* the numbers behind it */
} tk_diag;

/* The built-in fix kinds, in the order the search proposes them; the
 * catalogue (advisor/fixes.c) is one table with a row per kind, and
 * tk_fix_register adds rows after these. */
typedef enum {
    TK_FIX_RELEASE = 0,     /* release what an earlier run and PyTorch in this process hold */
    TK_FIX_HEAD,            /* span / pooled head instead of flatten_dense */
    TK_FIX_MAX_LEN,         /* max_len from the corpus percentiles */
    TK_FIX_PADDING,         /* dynamic padding or length buckets */
    TK_FIX_PRECISION,       /* fp16 / bf16 mixed precision */
    TK_FIX_ACCUMULATE,      /* smaller micro-batch, same effective batch */
    TK_FIX_RECOMPUTE,       /* gradient checkpointing */
    TK_FIX_ATTENTION,       /* memory-efficient attention */
    TK_FIX_OPTIM8,          /* 8-bit AdamW */
    TK_FIX_FREEZE_EMB,      /* frozen embeddings */
    TK_FIX_FREEZE_LAYERS,   /* frozen lower encoder layers */
    TK_FIX_EMPTY_CACHE,     /* release cached segments between steps */
    TK_FIX_EVAL_BATCH,      /* smaller eval batch */
    TK_FIX_BATCH,           /* smaller batch (changes the effective batch) */
    TK_FIX_DATA_PARALLEL,   /* two GPUs on a platform that has them, same global batch: world_size 2 with ZeRO 1
                               or 2 (engine txkernel, plan only on cuda), or the pair's profile with parallel:
                               dataparallel | ddp | zero2 (engine pytorch) */
    TK_FIX_COUNT            /* built-in kinds; registered ones follow */
} tk_fix_kind;

#define TK_FIX_MAX_KINDS 32 /* built-in and registered */

const char *tk_fix_name(tk_fix_kind k); /* "max_len", "precision", ...; "?" for no such kind */

/* What a release frees (TK_FIX_RELEASE's parameter, a bit set). */
enum {
    TK_RELEASE_SESSION = 1u,    /* an earlier run in this session (%txreset) */
    TK_RELEASE_IN_PROCESS = 2u, /* PyTorch's caching allocator in this process (the user's Python) */
};

/* One fix with its parameter; each kind reads only its own field. */
typedef struct tk_fix {
    tk_fix_kind kind;
    int value;                /* the number the kind sets: max_len, accumulate k, frozen layers,
                                 eval batch, batch */
    tk_precision precision;   /* TK_FIX_PRECISION: TK_PREC_FP16 or TK_PREC_BF16 */
    tk_batching batching;     /* TK_FIX_PADDING: TK_BATCH_DYNAMIC or TK_BATCH_BUCKETS */
    unsigned release;         /* TK_FIX_RELEASE: TK_RELEASE_SESSION | TK_RELEASE_IN_PROCESS */
    int zero;                 /* TK_FIX_DATA_PARALLEL: the ZeRO stage (value: world_size), engine txkernel */
    tk_parallel parallel;     /* TK_FIX_DATA_PARALLEL, engine pytorch: how PyTorch splits the step (value: GPUs) */
} tk_fix;

struct tk_advise_input;

/* A planner in place of tk_plan_engine (tk_advise_input.plan_fn): plans
 * config `c` into *out as tk_plan_engine would, or fails (TK_EINVAL: a
 * candidate it cannot plan, which is then not offered). The companion's
 * traced model (app/traced.c) is one: each candidate is its own step,
 * traced. ctx is the planner's own. */
typedef tk_status (*tk_plan_fn)(void *ctx, const tk_config *c, const int *lengths, int n, tk_plan_result *out,
                                tk_err *err);

/* A row of the catalogue: everything the advisor knows of one kind. Only
 * name and apply are required; the others say their default. */
typedef struct tk_fix_def {
    const char *name;         /* "max_len"; also the label when `label` is NULL */
    /* Applies f to *c (pure; c modified in place): 0 with a one-line reason,
     * or -1 when it does not apply to this config. */
    int (*apply)(tk_config *c, const tk_fix *f, const int32_t *lengths, int n_lengths, char *reason,
                 size_t reason_n);
    /* The fixes of this kind (`self`) worth planning for `in` (at most max,
     * written to out), in the order to try them. NULL: none is proposed. */
    int (*propose)(tk_fix_kind self, const struct tk_advise_input *in, tk_fix *out, int max);
    /* The ranked table's words for f; `fixed` is the config after it. */
    void (*label)(const tk_fix *f, const tk_config *fixed, char *out, size_t n);
    /* The share of results at stake (0..1) and what, in words. NULL: none. */
    double (*risk)(const tk_fix *f, const tk_config *fixed, const int32_t *lengths, int n_lengths, char *what,
                   size_t what_n);
    /* Device bytes the fix frees outside the config (what a release gives
     * back). NULL: none. */
    size_t (*frees)(const tk_fix *f, const struct tk_advise_input *in);
    int combinable;           /* 1: tried in pairs and triples with other kinds */
    int action_only;          /* 1: alone it is an action, not a config change */
    unsigned removes;         /* diagnoses whose cause it removes: bits (1u << tk_diag_kind) */
} tk_fix_def;

/* Adds a row after the built-in ones (the definition is copied; its
 * functions must outlive every tk_advise). Returns the new kind, or -1 when
 * name or apply is missing or TK_FIX_MAX_KINDS are taken. Not thread-safe:
 * register before advising. */
int tk_fix_register(const tk_fix_def *d);
/* The row of kind k, or NULL. */
const tk_fix_def *tk_fix_def_of(tk_fix_kind k);
/* Kinds in the table (built-in + registered). */
int tk_fix_n_kinds(void);
/* The ranked table's words for f (`fixed`: the config after it). */
void tk_fix_label(const tk_fix *f, const tk_config *fixed, char *out, size_t n);
/* f's typed parameter in words ("bf16", "buckets", "session+in_process"; ""
 * for kinds whose parameter is `value`), written to buf. */
const char *tk_fix_param(const tk_fix *f, char *buf, size_t n);

#define TK_ADVICE_MAX_FIXES 4
#define TK_ADVICE_MAX_CANDS 48

typedef struct tk_candidate {
    int n_fixes;
    tk_fix fixes[TK_ADVICE_MAX_FIXES];
    char label[160];       /* "fp16 + accumulate 4" */
    char reason[512];      /* why, one line per fix joined by "; " */
    tk_config config;      /* the config with the fixes applied */
    size_t peak;           /* planned peak reserved bytes */
    int64_t margin;        /* capacity - peak */
    int fits;              /* 1: fits in what is free */
    int fits_margin;       /* 1: fits with the safety margin */
    int addresses_cause;   /* 1: removes a diagnosed cause */
    double slowdown;       /* predicted time per sample / original's (below 1 = faster) */
    double risk;           /* 0 = none; the share of results at stake */
    char risk_text[192];   /* what is at risk, in words ("truncates 0.8% of examples") */
    int action_only;       /* 1: no config change (release the previous run) */
} tk_candidate;

/* The session's last run, as the advisor reads it (tk_advise_input.last_run;
 * NULL: none, or not known here). */
typedef struct tk_advise_run {
    int ran_out;                  /* 1: it ended out of device memory */
    int same_config;              /* 1: it ran the config being advised */
    const tk_oom *oom;            /* its OOM record, or NULL */
    const char *oom_phase;        /* "model", "training"; NULL: not said */
    size_t peak_allocated, peak_reserved; /* measured over the run */
    size_t free_before;           /* device bytes free when it started */
} tk_advise_run;

/* PyTorch in the user's own process, as the companion reads it live
 * (tk_advise_input.torch_live; NULL: not read, e.g. from a shell). */
typedef enum {
    TK_TORCH_LIVE_NOT_IMPORTED = 1, /* torch is not imported: it holds no device memory */
    TK_TORCH_LIVE_NO_CUDA,          /* torch.cuda.is_available() is False */
    TK_TORCH_LIVE_IDLE,             /* CUDA not initialised yet */
    TK_TORCH_LIVE_HOLDS,            /* allocated / reserved as read */
} tk_torch_live_state;

typedef struct tk_advise_torch {
    tk_torch_live_state state;
    size_t allocated, reserved;   /* torch.cuda.memory_allocated() / memory_reserved() */
} tk_advise_torch;

typedef struct tk_advise_input {
    const tk_config *config;      /* required */
    const tk_plan_result *plan;   /* plan of config; NULL: the advisor plans it */
    const tk_oom *oom;            /* a run-time OOM record, or NULL */
    const int32_t *lengths;       /* corpus token lengths (special tokens included), or NULL */
    int n_lengths;
    size_t free_now;              /* what the device has free now; 0: its capacity */
    size_t held_by_session;       /* bytes an earlier run in this session still holds */
    size_t held_in_process;       /* bytes other code in this process keeps on the device: the user's
                                     PyTorch caching allocator (its reserved), in the Python companion */
    const size_t *step_allocated; /* allocated at step boundaries, or NULL */
    int n_steps;
    const char *leak_owner;       /* the owner that grew, if the caller knows */
    double margin_frac;           /* safety margin as a share of capacity (default 0.05) */
    int max_plans;                /* budget of plans for the search (default 400) */
    const char *platform;         /* "colab", "kaggle": the cards for the lottery diagnosis; NULL: the
                                     platform that hands out the config's gpu profile, if one does */
    tk_api api;                   /* the API the fixes' code is written in; TK_API_AUTO: tk_config_api */
    const tk_advise_run *last_run;   /* the session's last run and its OOM record; NULL: absent */
    const tk_advise_torch *torch_live; /* the companion's live torch state; NULL: absent */
    tk_plan_fn plan_fn;           /* plans the config, each candidate and each card of the platform; NULL:
                                     tk_plan_engine */
    void *plan_ctx;               /* plan_fn's own, borrowed */
} tk_advise_input;

typedef struct tk_advice {
    tk_plan_result base;          /* the plan of the config as given */
    tk_config given;              /* the config as given: the fixes' code is what changes it */
    tk_api api;                   /* the API the fixes' code is written in (resolved) */
    size_t capacity, free_now;
    int n_diag;
    tk_diag diag[TK_DIAG_COUNT];
    int n_cand;
    tk_candidate cand[TK_ADVICE_MAX_CANDS]; /* ranked, best first */
    int base_effective_batch;     /* batch_size x accumulate as given */
    int n_planned;                /* configs planned to get here */
    double ms;                    /* time the advice took */
} tk_advice;

/* Applies one fix to *c (pure; c is modified in place). Returns 0 and writes a
 * one-line reason, or -1 if the fix does not apply to this config (already so,
 * nothing to gain, needs corpus lengths that are missing). */
int tk_fix_apply(tk_config *c, const tk_fix *f, const int32_t *lengths, int n_lengths,
                 char *reason, size_t reason_n);

/* Diagnoses and ranks fixes. TK_OK even when nothing fits (then the best
 * candidates are those that come closest); errors are bad configs. The
 * config and every candidate are planned by the engine the config names
 * (tk_plan_engine). */
tk_status tk_advise(const tk_advise_input *in, tk_advice *out, tk_err *err);

/* Plans `c` by its engine (engine_plan.c): txkernel's trainer (tk_plan), or
 * with engine: pytorch the step as PyTorch allocates it (torchplan), its
 * memory in a tk_plan_result (no owner table) and its costs from txkernel's
 * plan of the same config. */
tk_status tk_plan_engine(const tk_config *c, const int *lengths, int n, tk_plan_result *out, tk_err *err);
/* The engine: pytorch figures of `r` (a tk_torchplan_result, torchplan's
 * or a traced step's) as tk_plan_engine reports them, with the costs from
 * txkernel's plan of the same config `c` (no costs when txkernel's trainer
 * refuses it). TK_ENOMEM only. */
struct tk_torchplan_result;
tk_status tk_plan_from_torchplan(const tk_config *c, const int *lengths, int n, const struct tk_torchplan_result *r,
                                 tk_plan_result *out, tk_err *err);
/* Who planned it, for the reader: "txkernel's trainer" or "engine: pytorch
 * (torch 2.x + transformers 5.x)" (a static string). */
const char *tk_plan_engine_name(const tk_config *c);

/* The API fixes are written in for `c`: its api key, or by default loop
 * for engine: pytorch and txkernel for engine: txkernel (a pasted
 * traceback's Trainer is the caller's to read). */
tk_api tk_config_api(const tk_config *c);
const char *tk_api_name(tk_api a); /* "trainer", "loop", "txkernel", "auto" */
/* The code that turns config `from` into `to` in the API (fix_code.c):
 * TrainingArguments and tokenizer lines, loop code, or YAML lines; several
 * GPUs with their launcher recipe. New string, NULL when out of host memory. */
char *tk_fix_code(const tk_config *from, const tk_config *to, tk_api api);
/* 1: txkernel plans `c` but does not run it (several GPUs on cuda): its fix
 * is labelled "plan only" and paired with the PyTorch recipe. */
int tk_config_plan_only(const tk_config *c);

/* The index of the cheapest candidate that fits with margin and keeps the
 * effective batch (and that txkernel can run: not plan only), or -1. */
int tk_advice_auto(const tk_advice *a);

/* Like tk_advice_auto, but the candidate must also fit with a 5% margin on
 * every card the platform hands out ("colab", "kaggle", "all"), each planned
 * as `gpu: CARD`: the config that no card lottery can break. -1 if none does,
 * -2 for an unknown platform. */
int tk_advice_auto_for(const tk_advice *a, const char *platform, const int32_t *lengths, int n_lengths);
/* The same, each card planned by `fn` (a traced model's planner,
 * tk_advise_input.plan_fn's; NULL: tk_plan_engine) through tk_plan_cards_by. */
int tk_advice_auto_for_by(tk_plan_fn fn, void *ctx, const tk_advice *a, const char *platform, const int32_t *lengths,
                          int n_lengths);

/* Text report: diagnoses, the ranked table, the leading fixes as code in
 * the advice's API, and closing lines that name the notebook's magics
 * (%txfix N). New string, free(). */
char *tk_advice_format(const tk_advice *a, int top);
/* The same for a shell: the closing lines name txk's commands (`txk advise
 * CFG --fix N -o FILE`), never a magic. */
char *tk_advice_format_cli(const tk_advice *a, int top, const char *cfg_path);
/* A fix as JSON: {kind, value, param} (param: tk_fix_param's words). New
 * reference, NULL when out of memory. */
struct json_t;
struct json_t *tk_fix_json(const tk_fix *f);

/* JSON object of the advice (new string, free()). */
char *tk_advice_json(const tk_advice *a);

#ifdef __cplusplus
}
#endif
#endif
