/* tk_facts.h — the one facts record that every reader of the advisor fills
 * before its ordered diagnoses run: a pasted message (oom_message.c,
 * read_facts) and the plan of a config as given (advisor.c,
 * read_plan_facts). A reader leaves what it does not read zero or NULL, and
 * a rule that needs those figures does not fire. What the figures prove is
 * computed once, by the reader, so the rules only test it and say it.
 * Not part of the advisor's interface; header-only so that the pasted
 * message's fuzz target, which builds oom_message.c without the planner,
 * includes it too. */
#ifndef TK_FACTS_H
#define TK_FACTS_H

#include <stddef.h>
#include <stdint.h>
#include "tk_advisor.h"
#include "tk_oom_message.h"

/* The message's reliable figures, the processes it lists, the plan of the
 * user's config on the message's card (when a config was given), the card,
 * the platform in the message's era and the API; the plan of a config as
 * given with what is free, what is held, the session's OOM record, the
 * corpus' lengths and the allocated bytes at step boundaries; then what the
 * figures prove. */
typedef struct tk_facts {
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
    const tk_oom *oom;            /* the session's run-time OOM record, or NULL */
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
} tk_facts;

#endif
