/* snapshot_diagnose.c — the snapshot reader's diagnosis (its sixth layer,
 * after decode, trace, owners and frames, the peak and the leak): the
 * advisor's diagnoses (leak, growth, an engine's pool, fragmentation,
 * capacity, headroom, a dominant owner) from the figures the earlier layers
 * read, ranked the cause first, each with the fixes it calls for, written
 * as the PyTorch/transformers code to change.
 *
 * Guarantees: no capacity, fragmentation or leak is claimed without the
 * figures that prove it (an OOM, a capacity known, free blocks counted,
 * iterations that keep bytes); a fix's code carries no number the file or
 * the user did not give (B // 2, max_length=N with N their data's p99).
 */
#include "snapshot_diagnose.h"
#include "tk_fix_code.h"

#include <stdio.h>
#include <string.h>

static const char *fmtb(size_t b, char buf[32]) { return tk_format_bytes(b, buf, 32); }

static tk_finding *diag(tk_snapshot *s, tk_diag_kind kind) {
    if (s->n_diag == TK_SNAP_MAX_DIAG) return NULL;
    tk_finding *d = &s->diag[s->n_diag++];
    d->kind = kind;
    return d;
}

tk_fix_note *snap_fix_find(tk_snapshot *s, const char *id) {
    for (int i = 0; i < s->n_fixes; i++)
        if (!strcmp(s->fixes[i].id, id)) return &s->fixes[i];
    return NULL;
}

tk_fix_note *snap_fix_insert(tk_snapshot *s, const char *id, int pos) {
    if (snap_fix_find(s, id)) return NULL;
    if (s->n_fixes == TK_SNAP_MAX_FIXES) s->n_fixes--;
    if (pos > s->n_fixes) pos = s->n_fixes;
    memmove(&s->fixes[pos + 1], &s->fixes[pos], (size_t)(s->n_fixes - pos) * sizeof *s->fixes);
    s->n_fixes++;
    tk_fix_note *f = &s->fixes[pos];
    memset(f, 0, sizeof *f);
    snprintf(f->id, sizeof f->id, "%s", id);
    f->saves = -1;
    return f;
}

/* A new fix at the end of the list (NULL when it is there already or the
 * list is full). */
static tk_fix_note *fix(tk_snapshot *s, const char *id, int64_t saves) {
    if (s->n_fixes == TK_SNAP_MAX_FIXES) return NULL;
    tk_fix_note *f = snap_fix_insert(s, id, s->n_fixes);
    if (f) f->saves = saves;
    return f;
}

static int has_diag(const tk_snapshot *s, tk_diag_kind kind) {
    for (int i = 0; i < s->n_diag; i++)
        if (s->diag[i].kind == kind) return 1;
    return 0;
}

static void fixes_fragmentation(tk_snapshot *s) {
    char a[32], b[32];
    /* what allocator_settings (or the segments) show is on is not advised again */
    tk_fix_note *f = s->expandable_on ? NULL : fix(s, "expandable_segments", (int64_t)(s->free_in_cache - s->largest_free_block));
    if (f) {
        snprintf(f->text, sizeof f->text,
                 "Let the allocator grow segments instead of stranding free blocks: %s of free cache is in blocks "
                 "smaller than the largest (%s) and becomes usable. Set it before the first CUDA call "
                 "(restart the runtime).",
                 fmtb(s->free_in_cache - s->largest_free_block, a), fmtb(s->largest_free_block, b));
        snprintf(f->code, sizeof f->code,
                 "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"\nimport torch");
    }
    if (s->empty_segments && (f = fix(s, "empty_cache", (int64_t)s->empty_segments))) {
        snprintf(f->text, sizeof f->text,
                 "Return the cached segments that hold no live tensor (%s) to the device, e.g. between "
                 "evaluation and training.",
                 fmtb(s->empty_segments, a));
        snprintf(f->code, sizeof f->code, "torch.cuda.empty_cache()");
    }
}

/* An inference engine's KV-cache pool, preallocated at its start to a
 * fraction of the card: the setting is that fraction. */
static void fixes_engine_pool(tk_snapshot *s) {
    char a[32], b[32];
    tk_fix_note *f = fix(s, "memory_fraction", -1);
    if (!f) return;
    snprintf(f->text, sizeof f->text,
             "vLLM preallocated its KV-cache pool at start-up: %s in %d blocks, %.0f%% of what is allocated (%s). "
             "It takes gpu_memory_utilization of the card whatever the requests need; lower it to leave room for the "
             "rest of the process (each 0.1 less frees a tenth of the card).",
             fmtb(s->vllm_pool_bytes, a), s->vllm_pool_blocks, 100.0 * (double)s->vllm_pool_bytes / (double)s->allocated,
             fmtb(s->allocated, b));
    snprintf(f->code, sizeof f->code,
             "llm = LLM(model=name, gpu_memory_utilization=0.5)   # vLLM's default is 0.9\n"
             "# verl: actor_rollout_ref.rollout.gpu_memory_utilization=0.5");
}

static void fixes_capacity(tk_snapshot *s) {
    char a[32];
    tk_fix_note *f;
    const tk_snap_owner *user = NULL;
    /* del is for tensors the user's code keeps: not a pool an engine
     * preallocated, nor what only native code or a library holds */
    for (int i = 0; i < s->n_owners && !user; i++)
        if (!snap_names_no_code(s->owners[i].owner) && s->owners[i].pool_bytes < s->owners[i].bytes / 2)
            user = &s->owners[i];
    if (user && (f = fix(s, "del", (int64_t)user->bytes))) {
        snprintf(f->text, sizeof f->text,
                 "Drop the references made at %s once they are no longer needed (%s live in %d blocks), "
                 "then collect and release the cache.",
                 user->owner, fmtb(user->bytes, a), user->blocks);
        snprintf(f->code, sizeof f->code,
                 "del outputs, loss  # the tensors created at %s\nimport gc; gc.collect()\ntorch.cuda.empty_cache()",
                 user->owner);
    }
    if ((f = fix(s, "batch", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Halve the micro-batch and accumulate twice as many steps: the effective batch stays, the "
                 "activations halve (this snapshot does not separate activations from weights, so it cannot "
                 "say how many bytes that is).");
        if (s->trainer)
            snprintf(f->code, sizeof f->code,
                     "# B, k: your current per_device_train_batch_size and gradient_accumulation_steps\n"
                     "TrainingArguments(..., per_device_train_batch_size=B // 2, gradient_accumulation_steps=2 * k)");
        else /* a plain loop (no Trainer in the frames): its whole body */
            tk_loop_code(f->code, sizeof f->code,
                         &(tk_loop_fix){.batch_s = "B // 2", .accum_s = "2 * A   # B, A: your batch size and accumulation now",
                                        .loader = 1, .precision = TK_PREC_FP32, .torch = TK_TORCH_2});
    }
    if ((f = fix(s, "precision", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Mixed precision keeps activations in 16 bits, about half their bytes (bf16 on Ampere or newer, "
                 "fp16 on a T4 or V100).");
        if (s->trainer)
            snprintf(f->code, sizeof f->code, "TrainingArguments(..., bf16=True)  # or fp16=True");
        else
            tk_loop_code(f->code, sizeof f->code,
                         &(tk_loop_fix){.batch_s = "B", .accum = 1, .precision = TK_PREC_FP16, .torch = TK_TORCH_2});
    }
    if ((f = fix(s, "checkpointing", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Gradient checkpointing keeps one activation per layer and recomputes the rest in backward "
                 "(about 30%% more compute).");
        snprintf(f->code, sizeof f->code, "%s",
                 s->trainer ? "TrainingArguments(..., gradient_checkpointing=True)"
                            : "(model if hasattr(model, \"gradient_checkpointing_enable\") else model.bert)"
                              ".gradient_checkpointing_enable()");
    }
    if ((f = fix(s, "max_length", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Shorter sequences shrink every activation (attention scores quadratically); pick max_length from "
                 "the data's token lengths (txk data FILE shows the percentiles).");
        snprintf(f->code, sizeof f->code,
                 "tokenizer(texts, truncation=True, max_length=N)  # N: your data's p99 token length (txk data FILE)");
    }
}

/* A leak is the cause when there is one: whatever else the end shows, it
 * would have grown into it. */
static void diagnose_leak(tk_snapshot *s) {
    char a[32], b[32], c[32];
    tk_finding *g = diag(s, TK_DIAG_LEAK);
    tk_fix_note *f;
    const char *who = s->leak_owner[0] && strncmp(s->leak_owner, "no Python frame", 15) &&
                              strcmp(s->leak_owner, SNAP_BEFORE_HISTORY) ? s->leak_owner : NULL;
    int per_iter_blocks = s->leak_owner_iterations ? s->leak_owner_blocks / s->leak_owner_iterations : 0;
    if (!g) return;
    int m = snprintf(g->text, sizeof g->text,
                     "leak: allocated memory that stays from one iteration to the next grows by %s per iteration "
                     "(%s over the %d iterations the trace shows)",
                     fmtb(s->leak_per_iteration, a), fmtb(s->leak_total, b), s->leak_iterations);
    if (m > 0 && (size_t)m < sizeof g->text) {
        if (who)
            snprintf(g->text + m, sizeof g->text - (size_t)m,
                     "; still live at the end: %s in %d blocks allocated at %s in %d different iterations.",
                     fmtb(s->leak_owner_bytes, c), s->leak_owner_blocks, who, s->leak_owner_iterations);
        else
            snprintf(g->text + m, sizeof g->text - (size_t)m,
                     "; the trace's frames do not say who allocated what stays%s.",
                     s->leak_owner[0] ? " (no Python frame)" : "");
    }
    if (!(f = fix(s, "leak", (int64_t)s->leak_total))) return;
    /* Many blocks kept per iteration is a graph kept alive; one or two are
     * outputs kept in a list or dict. */
    if (per_iter_blocks >= 8 || !who)
        snprintf(f->text, sizeof f->text,
                 "Stop keeping each iteration's autograd graph: accumulate Python numbers, not tensors, and run "
                 "evaluation without a graph. The snapshot says this frees the %s that piled up (%s per "
                 "iteration)%s%s.",
                 fmtb(s->leak_total, a), fmtb(s->leak_per_iteration, b), who ? "; the code at " : "", who ? who : "");
    else
        snprintf(f->text, sizeof f->text,
                 "Keep copies off the device and without their graph: what is appended or stored each iteration "
                 "at %s stays on the GPU. The snapshot says this frees the %s that piled up (%s per iteration).",
                 who, fmtb(s->leak_total, a), fmtb(s->leak_per_iteration, b));
    snprintf(f->code, sizeof f->code,
             "%s"
             "total_loss += loss.item()                  # not total_loss += loss: that keeps every step's graph\n"
             "preds.append(logits.detach().cpu())        # not the CUDA tensor with its graph\n"
             "del outputs, loss                          # at the end of each step\n"
             "with torch.no_grad():                      # around evaluation: no graph is built\n"
             "    outputs = model(**batch)",
             per_iter_blocks >= 8 || !who ? "" : "# the tensors kept at the line above\n");
}

void snap_diagnose(tk_snapshot *s) {
    char a[32], b[32], c[32], d[32];
    tk_finding *g;
    size_t need = s->has_oom ? s->oom_size : 0;
    if (s->has_leak) diagnose_leak(s);
    if (s->has_growth && (g = diag(s, TK_DIAG_GROWTH)))
        snprintf(g->text, sizeof g->text,
                 "growth, not a leak: allocated rises by %s inside one step (%d rises that keep most of what they "
                 "took: activations kept layer by layer for backward, the optimizer state created at its first "
                 "step); no repeating loop leaves bytes behind in this trace.",
                 fmtb(s->growth_bytes, a), s->growth_rises);
    if (s->vllm_pool_bytes && s->vllm_pool_bytes >= s->allocated / 2 && (g = diag(s, TK_DIAG_ENGINE_POOL))) {
        snprintf(g->text, sizeof g->text,
                 "engine_pool: an inference engine's KV-cache pool (vLLM's cache engine, allocated at its __init__) "
                 "holds %s of the %s allocated.",
                 fmtb(s->vllm_pool_bytes, a), fmtb(s->allocated, b));
        fixes_engine_pool(s);
    }
    /* At an OOM, the figures that matter are the failing device's. */
    const tk_snap_device *od = NULL;
    for (int i = 0; s->has_oom && s->n_device_rows > 1 && i < s->n_device_rows; i++)
        if (s->devices[i].device == s->oom_device) od = &s->devices[i];
    char on[48] = "";
    if (od) snprintf(on, sizeof on, " on device %d (of %d)", od->device, s->n_device_rows);
    size_t reserved = od ? od->reserved : s->reserved, allocated = od ? od->allocated : s->allocated;
    /* Fragmentation: enough is free in the cache, in pieces too small. With
     * an OOM that is "free >= request > largest block" in the request's pool
     * (PyTorch serves requests of up to 1 MiB from the small pool only);
     * without one, a cache whose free part is at least a quarter of what is
     * reserved and scattered (no block holds half of it). */
    const char *pool = need <= ((size_t)1 << 20) ? "small" : "large";
    size_t pool_free = 0, pool_largest = 0;
    for (int i = 0; !od && i < s->n_pools; i++)
        if (!strcmp(s->pools[i].pool, pool)) {
            pool_free += s->pools[i].free;
            if (s->pools[i].largest_free > pool_largest) pool_largest = s->pools[i].largest_free;
        }
    if (od) {
        int small = !strcmp(pool, "small");
        pool_free = small ? od->free_small : od->free_large;
        pool_largest = small ? od->largest_small : od->largest_large;
    }
    int frag = s->has_oom ? (pool_free >= need && pool_largest < need)
                          : (s->free_in_cache >= s->reserved / 4 && s->free_in_cache >= ((size_t)1 << 20) &&
                             s->largest_free_block < s->free_in_cache / 2);
    /* Capacity: at an OOM that is not fragmentation, no block of the pool
     * fits and the device cannot give a new segment; without an OOM, only
     * with the device's capacity known: what PyTorch reserved fills it and
     * live tensors fill that (a cache that is merely full of live tensors
     * says nothing of the card). */
    int cap = s->has_oom ? !frag
                         : (s->capacity && s->reserved >= s->capacity / 10 * 9 &&
                            s->allocated >= s->reserved / 10 * 9);
    if (frag && (g = diag(s, TK_DIAG_FRAGMENTATION))) {
        int m = snprintf(g->text, sizeof g->text,
                 "fragmentation: %s of the %s PyTorch reserved is free, in %d blocks, but the largest is %s%s%s.",
                 fmtb(s->free_in_cache, a), fmtb(s->reserved, b), s->n_free_blocks, fmtb(s->largest_free_block, c),
                 need ? " and the failed request was " : "", need ? fmtb(need, d) : "");
        if (s->expandable_on && m > 0 && (size_t)m < sizeof g->text)
            snprintf(g->text + m, sizeof g->text - (size_t)m,
                     " Expandable segments are already on (allocator_settings), so that setting is not advised.");
    }
    if (cap && (g = diag(s, TK_DIAG_CAPACITY))) {
        if (s->has_oom) {
            char e[32], f[32];
            snprintf(g->text, sizeof g->text,
                     "capacity: tried to allocate %s%s; no free block of the %s pool fits it (%s free there, largest "
                     "%s) and the device has only %s free for a new segment; live tensors hold %s of the %s "
                     "reserved%s.",
                     fmtb(need, a), on, pool, fmtb(pool_free, b), fmtb(pool_largest, c), fmtb(s->oom_device_free, d),
                     fmtb(allocated, e), fmtb(reserved, f), od ? " there" : "");
        } else
            snprintf(g->text, sizeof g->text,
                     "capacity: live tensors fill the device: %s of its %s is allocated, the cache holds only %s "
                     "free (largest block %s).",
                     fmtb(s->allocated, a), fmtb(s->capacity, b), fmtb(s->free_in_cache, c),
                     fmtb(s->largest_free_block, d));
    }
    /* Headroom: with the card's size known, what neither PyTorch holds nor
     * the device reports free is held by someone else. */
    if (s->has_oom && s->capacity && reserved + s->oom_device_free < s->capacity / 100 * 90 &&
        (g = diag(s, TK_DIAG_HEADROOM))) {
        size_t other = s->capacity - reserved - s->oom_device_free;
        snprintf(g->text, sizeof g->text,
                 "headroom: %s of the %s device is held outside this process's cache (another process, an earlier "
                 "run, or the CUDA context).",
                 fmtb(other, a), fmtb(s->capacity, b));
    }
    /* the largest owner of what is live at the end, when it is code of the
     * user's (not a library's workspace, nor blocks with no frame) */
    if (s->n_owners && s->allocated && !snap_names_no_code(s->owners[0].owner) &&
        s->owners[0].bytes >= s->allocated / 5 * 2 && s->n_owners > 1 && (g = diag(s, TK_DIAG_DOMINANT_LAYER))) {
        snprintf(g->text, sizeof g->text, "dominant_layer: %s holds %s, %.0f%% of what is allocated.",
                 s->owners[0].owner, fmtb(s->owners[0].bytes, a), 100.0 * (double)s->owners[0].bytes / (double)s->allocated);
    }
    if (has_diag(s, TK_DIAG_FRAGMENTATION)) fixes_fragmentation(s);
    if (has_diag(s, TK_DIAG_CAPACITY) || has_diag(s, TK_DIAG_DOMINANT_LAYER)) fixes_capacity(s);
    if (has_diag(s, TK_DIAG_HEADROOM)) {
        tk_fix_note *f = fix(s, "release", -1);
        if (f) {
            snprintf(f->text, sizeof f->text,
                     "Free the device of the other holder: restart the runtime (or the process shown by nvidia-smi).");
            snprintf(f->code, sizeof f->code, "!nvidia-smi --query-compute-apps=pid,used_memory --format=csv");
        }
    }
}

/* ---- entry points --------------------------------------------------------------------- */

