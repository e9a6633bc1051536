/* tk_facts.h — the one facts record that every reader of the advisor fills,
 * and the one ordered table of diagnoses (diagnoses.c, tk_diagnose) that
 * runs over it: read -> facts -> diagnose -> fixes -> code. The readers are
 * a pasted message (oom_message.c, read_facts), the plan of a config as
 * given (advisor.c, read_plan_facts) and a PyTorch snapshot
 * (snapshot_diagnose.c, read_snap_facts). A reader leaves what it does not
 * read zero or NULL, and a rule that needs those figures does not fire.
 * What the figures prove is computed once, by the reader, so the rules only
 * test it and say it. Not part of the advisor's interface; the fuzz
 * targets, which build the message's and the snapshot's readers without the
 * planner, link diagnoses.c too, so no rule calls the planner. */
#ifndef TK_FACTS_H
#define TK_FACTS_H

#include <stddef.h>
#include <stdint.h>
#include "tk_advisor.h"
#include "tk_oom_message.h"
#include "tk_snapshot.h"

/* The message's reliable figures, the processes it lists, the plan of the
 * user's config on the message's card (when a config was given), the card,
 * the platform in the message's era and the API; the plan of a config as
 * given with what is free, what is held, the session's OOM record, the
 * corpus' lengths and the allocated bytes at step boundaries; then what the
 * figures prove. */
typedef struct tk_facts {
    /* ---- which readers filled it (NULL: not read) */
    const tk_oom_message *msg;    /* a pasted message */
    const tk_snapshot *snap;      /* a PyTorch snapshot */
    /* ---- a pasted message (read_facts) */
    const tk_oommsg_figure *R, *T, *A, *U, *F, *P, *V; /* reliable figures, or NULL */
    int torch;                    /* PyTorch's message (not TensorFlow's) */
    uint64_t ctx;                 /* the card's context and library buffers (its profile's default) */
    int own, other;               /* proc[] of the user's own process and of the largest other one; -1: none */
    /* the plan of the user's config on the message's card */
    int have_plan;
    uint64_t plan;                /* planned peak allocated (engine: pytorch), else reserved */
    const char *plan_what, *engine;
    int plan_on_card;             /* 1: the card's budget and the plan's fit are known */
    int plan_fits;
    uint64_t plan_reserved, budget;
    tk_api api;
    const char *platform;         /* the message's era: a P4 or K80 is 2020's Colab even under --for colab;
                                     a plan's: the one asked for, else the one that hands out its card */
    const tk_card_fit *cards;     /* the config planned on each of the platform's cards */
    int n_cards;
    /* what the message's figures prove */
    int request_over_card;        /* the request alone is larger than the card */
    int held;                     /* allocated exceeds the plan by > 10 % of it and 256 MiB */
    uint64_t held_bytes;
    int step_over_card;           /* the plan exceeds the card's usable memory */
    int frag;                     /* reserved-but-unallocated holds the request, allocated matches the plan */
    int split_or_held;            /* no plan: the unallocated cache holds the request, yet PyTorch's allocated is
                                     half the card or more: a split cache, earlier cells' tensors or the step */
    int outside;                  /* by the card's profile: reserved + request + context below the total */
    int filled;                   /* PyTorch filled the card, no plan says by what */
    int tf_dense, dom_seq, dom_hidden, dom_towers;

    /* ---- the plan of a config as given (read_plan_facts; NULL / 0 for a message) */
    const tk_config *config;
    const tk_plan_result *base;   /* its plan */
    const tk_gpu_profile *gpu;    /* its card's profile, or NULL */
    size_t capacity, available;   /* the device's capacity; what a run may take now */
    size_t held_in_process;       /* PyTorch's caching allocator in this process (the companion's live state) */
    size_t held_by_session;       /* an earlier run in this session */
    const tk_oom *oom;            /* the session's run-time OOM record of this config, or NULL */
    const tk_advise_run *last_run;   /* the session's last run, or NULL */
    const tk_advise_torch *torch_live; /* PyTorch in the user's process, read live, or NULL */
    int ran_out_fits;             /* the last run of this config ran out although the plan fits */
    const int32_t *lengths;       /* the corpus' token lengths, or NULL */
    int n_lengths;
    int p50, p99, len_max;        /* their nearest-rank percentiles; 0 without lengths */
    const size_t *step_allocated; /* allocated at step boundaries, or NULL */
    int n_steps;
    const char *leak_owner;
    /* what the plan's figures prove */
    int over_capacity;            /* the planned peak reserved exceeds the device */
    int over_free;                /* it fits the device but not what is free now */
    int oom_frag;                 /* the OOM record found cached bytes but no block that fits */
    const char *oom_cat;          /* the OOM record's category in words ("act") */
    double top_share;             /* the largest owner's share of the peak allocated; 0: no owners */
    size_t act, states;           /* activations (+ temporaries) and params + grads + optimizer at the peak */
    double act_share, states_share;
    int padded;                   /* fixed padding to a max_len of at least twice the corpus' p99 (rounded) */
    double pad_waste;             /* the share of every batch that is padding */
    int spike;                    /* dynamic or bucketed: the longest batch far above the typical one */
    int spike_cap, spike_typical; /* the longest batch's length and the typical one's */
    int leak;                     /* allocated grows at step boundaries */
    size_t leak_first, leak_last, leak_per;
    int lottery;                  /* fits some of the platform's cards, not this one, or one only just */
    int lottery_near;             /* cards[] it fits within 5 % of the budget; -1: none */
    int head_dominates;           /* a flatten_dense head is the largest owner */
    int head_units;               /* its shape: [head_units x head_in] */
    int64_t head_in;
    size_t head_weight, head_span;/* its fp32 weight; a per-token span head's */

    /* ---- a PyTorch snapshot (read_snap_facts) */
    const char *leak_who;         /* who allocated what stays across iterations, or NULL */
    int leak_graph;               /* many blocks per iteration: a graph kept alive, not outputs kept */
    int snap_pool;                /* an inference engine's pool holds half of what is allocated */
    int snap_frag, snap_cap;      /* the cache split / the device full (see read_snap_facts) */
    int snap_headroom;            /* at the OOM, a tenth of the device is held outside this process's cache */
    size_t snap_need;             /* the failed request, 0 without an OOM */
    const char *snap_pool_name;   /* "small" / "large": the request's pool */
    size_t snap_pool_free, snap_pool_largest;
    size_t snap_reserved, snap_allocated; /* the failing device's when several are recorded */
    int snap_device, snap_devices;/* the failing device and how many; -1: one device */
    int snap_dominant;            /* the largest owner is the user's code and holds 40 % of what is allocated */
    int snap_user;                /* owners[] of the largest owner the user's code keeps; -1: none */
} tk_facts;

/* ---- the one table ------------------------------------------------------------------ */

#define TK_DIAGNOSIS_MAX 18
#define TK_DIAGNOSIS_MAX_FIXES 16

struct tk_rule;

/* What the table writes: the findings in the order the rules fired (each
 * with the rule that wrote it), the fixes in the order of the findings they
 * answer, and the plan's fix kinds whose cause a finding names. A reader
 * sets its own limits (max_diag, max_fixes) and copies the result out. */
typedef struct tk_diagnosis {
    int max_diag, max_fixes;
    int n_diag;
    tk_finding diag[TK_DIAGNOSIS_MAX];
    char title[TK_DIAGNOSIS_MAX][160]; /* the plan's one-line title of each finding; "" for the others */
    const struct tk_rule *by[TK_DIAGNOSIS_MAX];
    int n_fixes;
    tk_fix_note fixes[TK_DIAGNOSIS_MAX_FIXES];
    unsigned cause;               /* 1u << tk_fix_kind: the plan's fixes that remove a diagnosed cause */
    int shrunk;                   /* the fixes that shrink the step were written once */
} tk_diagnosis;

/* One rule: the diagnosis it makes, the evidence and figures it proves it
 * from (words, for the reader of the table), whether the facts prove it,
 * its sentence (findings are added to d), and the fixes that answer it
 * (NULL: none, or written with the sentence). `last`: nothing after it
 * applies (not an OOM). */
typedef struct tk_rule {
    tk_diag_kind kind;
    const char *evidence;
    int (*proves)(const tk_facts *f, const tk_diagnosis *d);
    void (*say)(tk_diagnosis *d, const tk_facts *f);
    void (*fix)(tk_diagnosis *d, const tk_facts *f, tk_finding *g);
    int last;
} tk_rule;

/* Runs the one table over f into *d (zeroed here but for its limits; 0
 * limits take the table's): the findings each rule the facts prove writes,
 * in the table's order, then the fixes of each finding in that order. */
void tk_diagnose(const tk_facts *f, tk_diagnosis *d);
/* The same into a reader's own arrays (the message's, the snapshot's): at
 * most max_diag findings and max_fixes fixes. Out of host memory, nothing
 * is written (no partial diagnosis) and -1 is returned; else 0. */
int tk_diagnose_into(const tk_facts *f, tk_finding *diag, int max_diag, int *n_diag, tk_fix_note *fixes,
                     int max_fixes, int *n_fixes);
/* The table and its length: for tests and for the reader of the code. */
const tk_rule *tk_diagnosis_rules(int *n);

/* What the readers share with the rules. */
/* The era's platform: a P4 or K80 under "colab" is "colab-2020". */
const char *tk_platform_era(const char *platform, const tk_gpu_profile *card);
/* 1: the platform hands out this card (t4x2's card is the t4). */
int tk_platform_has(const char *platform, const tk_gpu_profile *card);
/* The context and library buffers a card's profile sets aside: its total
 * less its one usable capacity (tk_gpu_profile_budget); 0 without a card. */
uint64_t tk_card_context(const tk_gpu_profile *card);

#endif
