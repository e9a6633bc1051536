/* snapshot.c — reads a PyTorch memory snapshot (pickle or JSON), sums its
 * figures (the whole file's and each device's), groups live blocks by owner,
 * hands the trace to snapshot_trace.c and the frames to snapshot_frames.c,
 * diagnoses it, and writes the text and JSON (see tk_snapshot.h).
 *
 * Guarantees: the pickle is read by tk_pickle with no global allowed, so
 * nothing in the file runs; a file of the wrong shape is a one-line error
 * naming the file and the field; byte figures are integer sums, never
 * estimates. The pickle and JSON forms are walked by the same code through
 * a two-backend view (sv), so both give the same numbers.
 */
#include "snapshot_internal.h"
#include "tk_host_mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Snapshots of long runs reach gigabytes, nearly all of it the trace: a
 * pickle's events are streamed into compact records (about 50 bytes each),
 * so only the segments and the values the memo shares stay as a tree,
 * capped here. JSON is parsed whole, so its file is capped. */
#define SNAP_MAX_JSON ((size_t)1 << 30)
#define SNAP_TREE_CAP ((size_t)768 << 20)

/* ---- reading ------------------------------------------------------------------------ */

static tk_snap_device *device_row(tk_snapshot *s, int64_t device) {
    for (int i = 0; i < s->n_device_rows; i++)
        if (s->devices[i].device == device) return &s->devices[i];
    if (s->n_device_rows == TK_SNAP_MAX_DEVICES) return NULL;
    int i = s->n_device_rows++;
    while (i > 0 && s->devices[i - 1].device > device) {
        s->devices[i] = s->devices[i - 1];
        i--;
    }
    memset(&s->devices[i], 0, sizeof s->devices[i]);
    s->devices[i].device = (int)device;
    return &s->devices[i];
}

static int add_owner(snap_ctx *c, const char *owner, size_t bytes, int64_t addr, int pool) {
    tk_snapshot *s = c->s;
    for (int i = 0; i < s->n_owners; i++)
        if (!strcmp(s->owners[i].owner, owner)) {
            s->owners[i].bytes += bytes;
            if (pool) s->owners[i].pool_bytes += bytes;
            s->owners[i].blocks++;
            if (bytes > s->owners[i].largest) s->owners[i].largest = bytes, s->owners[i].largest_addr = addr;
            return 0;
        }
    if (s->n_owners == c->owners_cap) {
        int cap = c->owners_cap ? c->owners_cap * 2 : 16;
        tk_snap_owner *o = tk_realloc(s->owners, (size_t)cap * sizeof *o);
        if (!o) return snap_bad_nomem(c, "owners");
        s->owners = o;
        c->owners_cap = cap;
    }
    tk_snap_owner *o = &s->owners[s->n_owners++];
    snprintf(o->owner, sizeof o->owner, "%s", owner);
    o->bytes = bytes;
    o->blocks = 1;
    o->phase[0] = 0;
    o->largest = bytes;
    o->largest_addr = addr;
    o->pool_bytes = pool ? bytes : 0;
    return 0;
}

static int add_live_size(snap_ctx *c, size_t size) {
    tk_snapshot *s = c->s;
    if (s->n_live_sizes == c->sizes_cap) {
        int cap = c->sizes_cap ? c->sizes_cap * 2 : 256;
        size_t *v = tk_realloc(s->live_sizes, (size_t)cap * sizeof *v);
        if (!v) return snap_bad_nomem(c, "blocks");
        s->live_sizes = v;
        c->sizes_cap = cap;
    }
    s->live_sizes[s->n_live_sizes++] = size;
    return 0;
}

static tk_snap_pool *pool_of(tk_snapshot *s, const char *type, int64_t stream) {
    for (int i = 0; i < s->n_pools; i++)
        if (s->pools[i].stream == stream && !strcmp(s->pools[i].pool, type)) return &s->pools[i];
    /* Past the table's size the last row gathers the rest. */
    if (s->n_pools == TK_SNAP_MAX_POOLS) return &s->pools[TK_SNAP_MAX_POOLS - 1];
    tk_snap_pool *p = &s->pools[s->n_pools++];
    snprintf(p->pool, sizeof p->pool, "%s", type);
    p->stream = stream;
    return p;
}

static int read_segment(snap_ctx *c, sv seg, size_t si, int64_t *devices_seen) {
    tk_snapshot *s = c->s;
    char where[96];
    snprintf(where, sizeof where, "segments[%zu]", si);
    if (!sv_is_dict(seg)) return snap_bad(c, where, "expected a dict (a segment)");
    int64_t total = 0, stream = 0, device = 0, addr = 0;
    if (snap_field_size(c, seg, "total_size", where, 0, &total) || snap_field_size(c, seg, "device", where, 1, &device))
        return -1;
    sv_int(sv_get(seg, "address"), &addr);
    if (sv_true(sv_get(seg, "is_expandable"))) s->expandable_on = 1;
    tk_snap_device *dv = device_row(s, device);
    sv st = sv_get(seg, "stream");
    if (sv_ok(st) && sv_int(st, &stream)) return snap_bad(c, where, "'stream' is not an integer");
    if (device >= 0 && device < 64) *devices_seen |= (int64_t)(UINT64_C(1) << device);
    const char *type = sv_str(sv_get(seg, "segment_type"));
    int small = type && !strcmp(type, "small");
    tk_snap_pool *p = pool_of(s, type ? type : "?", stream);
    if (dv) dv->segments++, dv->reserved += (size_t)total;
    p->segments++;
    p->reserved += (size_t)total;
    s->reserved += (size_t)total;
    s->n_segments++;
    sv blocks = sv_get(seg, "blocks");
    if (!sv_is_list(blocks)) return snap_bad(c, where, "'blocks' missing or not a list");
    size_t active = 0;
    for (size_t bi = 0; bi < sv_len(blocks); bi++) {
        sv b = sv_at(blocks, bi);
        char bw[128];
        snprintf(bw, sizeof bw, "%s.blocks[%zu]", where, bi);
        if (!sv_is_dict(b)) return snap_bad(c, bw, "expected a dict (a block)");
        int64_t size = 0, req = 0, baddr = addr;
        if (snap_field_size(c, b, "size", bw, 0, &size) || snap_field_size(c, b, "requested_size", bw, 1, &req)) return -1;
        sv_int(sv_get(b, "address"), &baddr);
        const char *state = sv_str(sv_get(b, "state"));
        if (!state) return snap_bad(c, bw, "'state' missing or not a string");
        s->n_blocks++;
        if (!strcmp(state, "active_allocated")) {
            s->allocated += (size_t)size;
            s->requested += (size_t)req;
            p->allocated += (size_t)size;
            s->n_live_blocks++;
            active += (size_t)size;
            sv frames = sv_get(b, "frames");
            sv hist = sv_get(b, "history");
            /* PyTorch 2.0 kept frames in the block's history, newest last. */
            if (!sv_ok(frames) && sv_is_list(hist) && sv_len(hist))
                frames = sv_get(sv_at(hist, sv_len(hist) - 1), "frames");
            char owner[192], mname[48], mfile[160];
            if (snap_owner_of(frames, owner, sizeof owner)) s->by_txkernel = 1;
            int pool = snap_is_engine_pool(frames);
            if (add_owner(c, owner, (size_t)size, baddr, pool)) return -1;
            if (add_live_size(c, (size_t)(req > 0 ? req : size))) return -1;
            if (dv) dv->allocated += (size_t)size;
            if (pool) s->vllm_pool_bytes += (size_t)size, s->vllm_pool_blocks++;
            if (snap_model_module_of(frames, mname, sizeof mname, mfile, sizeof mfile)) {
                int k = 0;
                while (k < c->n_modules && strcmp(c->modules[k].name, mname)) k++;
                if (k == c->n_modules && k < (int)(sizeof c->modules / sizeof *c->modules)) {
                    snprintf(c->modules[k].name, sizeof c->modules[k].name, "%s", mname);
                    snprintf(c->modules[k].file, sizeof c->modules[k].file, "%s", mfile);
                    c->n_modules++;
                }
                if (k < c->n_modules) c->modules[k].bytes += (size_t)size;
            }
        } else if (!strcmp(state, "inactive")) {
            s->free_in_cache += (size_t)size;
            p->free += (size_t)size;
            s->n_free_blocks++;
            if ((size_t)size > s->largest_free_block) s->largest_free_block = (size_t)size;
            if ((size_t)size > p->largest_free) p->largest_free = (size_t)size;
            if (dv) {
                if ((size_t)size > dv->largest_free_block) dv->largest_free_block = (size_t)size;
                size_t *fr = small ? &dv->free_small : &dv->free_large, *lg = small ? &dv->largest_small : &dv->largest_large;
                *fr += (size_t)size;
                if ((size_t)size > *lg) *lg = (size_t)size;
            }
        } else {
            s->pending_free += (size_t)size;
            active += (size_t)size;
        }
    }
    if (!active) s->empty_segments += (size_t)total;
    return 0;
}

static int cmp_owner(const void *a, const void *b) {
    const tk_snap_owner *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return strcmp(x->owner, y->owner);
}

/* ---- diagnoses and fixes -------------------------------------------------------------- */

static const char *fmtb(size_t b, char buf[32]) { return tk_format_bytes(b, buf, 32); }

static tk_snap_diag *diag(tk_snapshot *s, const char *id) {
    if (s->n_diag == TK_SNAP_MAX_DIAG) return NULL;
    tk_snap_diag *d = &s->diag[s->n_diag++];
    snprintf(d->id, sizeof d->id, "%s", id);
    return d;
}

static tk_snap_fix *fix(tk_snapshot *s, const char *id, int64_t saves) {
    for (int i = 0; i < s->n_fixes; i++)
        if (!strcmp(s->fixes[i].id, id)) return NULL;
    if (s->n_fixes == TK_SNAP_MAX_FIXES) return NULL;
    tk_snap_fix *f = &s->fixes[s->n_fixes++];
    snprintf(f->id, sizeof f->id, "%s", id);
    f->saves = saves;
    return f;
}

static int has_diag(const tk_snapshot *s, const char *id) {
    for (int i = 0; i < s->n_diag; i++)
        if (!strcmp(s->diag[i].id, id)) return 1;
    return 0;
}

static void fixes_fragmentation(tk_snapshot *s) {
    char a[32], b[32];
    /* what allocator_settings (or the segments) show is on is not advised again */
    tk_snap_fix *f = s->expandable_on ? NULL : fix(s, "expandable_segments", (int64_t)(s->free_in_cache - s->largest_free_block));
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
    tk_snap_fix *f = fix(s, "memory_fraction", -1);
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
    tk_snap_fix *f;
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
        snprintf(f->code, sizeof f->code,
                 "# B, k: your current per_device_train_batch_size and gradient_accumulation_steps\n"
                 "TrainingArguments(..., per_device_train_batch_size=B // 2, gradient_accumulation_steps=2 * k)");
    }
    if ((f = fix(s, "precision", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Mixed precision keeps activations in 16 bits, about half their bytes (bf16 on Ampere or newer, "
                 "fp16 on a T4 or V100).");
        snprintf(f->code, sizeof f->code, "TrainingArguments(..., bf16=True)  # or fp16=True");
    }
    if ((f = fix(s, "checkpointing", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Gradient checkpointing keeps one activation per layer and recomputes the rest in backward "
                 "(about 30%% more compute).");
        snprintf(f->code, sizeof f->code, "model.gradient_checkpointing_enable()");
    }
    if ((f = fix(s, "max_length", -1))) {
        snprintf(f->text, sizeof f->text,
                 "Shorter sequences shrink every activation (attention scores quadratically); pick max_length from "
                 "the data's token lengths (txk data FILE shows the percentiles).");
        snprintf(f->code, sizeof f->code, "tokenizer(texts, truncation=True, max_length=128)");
    }
}

/* A leak is the cause when there is one: whatever else the end shows, it
 * would have grown into it. */
static void diagnose_leak(tk_snapshot *s) {
    char a[32], b[32], c[32];
    tk_snap_diag *g = diag(s, "leak");
    tk_snap_fix *f;
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

static void diagnose(tk_snapshot *s) {
    char a[32], b[32], c[32], d[32];
    tk_snap_diag *g;
    size_t need = s->has_oom ? s->oom_size : 0;
    if (s->has_leak) diagnose_leak(s);
    if (s->has_growth && (g = diag(s, "growth")))
        snprintf(g->text, sizeof g->text,
                 "growth, not a leak: allocated rises by %s inside one step (%d rises that keep most of what they "
                 "took: activations kept layer by layer for backward, the optimizer state created at its first "
                 "step); no repeating loop leaves bytes behind in this trace.",
                 fmtb(s->growth_bytes, a), s->growth_rises);
    if (s->vllm_pool_bytes && s->vllm_pool_bytes >= s->allocated / 2 && (g = diag(s, "engine_pool"))) {
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
     * fits and the device cannot give a new segment; without an OOM, the
     * live tensors fill the device or, without a capacity, what PyTorch
     * reserved. */
    int cap = s->has_oom ? !frag
                         : (s->reserved && s->allocated >= s->reserved / 10 * 9 &&
                            (!s->capacity || s->reserved >= s->capacity / 10 * 9));
    if (frag && (g = diag(s, "fragmentation"))) {
        int m = snprintf(g->text, sizeof g->text,
                 "fragmentation: %s of the %s PyTorch reserved is free, in %d blocks, but the largest is %s%s%s.",
                 fmtb(s->free_in_cache, a), fmtb(s->reserved, b), s->n_free_blocks, fmtb(s->largest_free_block, c),
                 need ? " and the failed request was " : "", need ? fmtb(need, d) : "");
        if (s->expandable_on && m > 0 && (size_t)m < sizeof g->text)
            snprintf(g->text + m, sizeof g->text - (size_t)m,
                     " Expandable segments are already on (allocator_settings), so that setting is not advised.");
    }
    if (cap && (g = diag(s, "capacity"))) {
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
                     "capacity: live tensors fill %s: %s of %s is allocated, the cache holds only %s free "
                     "(largest block %s).",
                     s->capacity ? "the device" : "what PyTorch reserved", fmtb(s->allocated, a),
                     fmtb(s->capacity ? s->capacity : s->reserved, b), fmtb(s->free_in_cache, c),
                     fmtb(s->largest_free_block, d));
    }
    /* Headroom: with the card's size known, what neither PyTorch holds nor
     * the device reports free is held by someone else. */
    if (s->has_oom && s->capacity && reserved + s->oom_device_free < s->capacity / 100 * 90 &&
        (g = diag(s, "headroom"))) {
        size_t other = s->capacity - reserved - s->oom_device_free;
        snprintf(g->text, sizeof g->text,
                 "headroom: %s of the %s device is held outside this process's cache (another process, an earlier "
                 "run, or the CUDA context).",
                 fmtb(other, a), fmtb(s->capacity, b));
    }
    if (s->n_owners && s->allocated && strncmp(s->owners[0].owner, "no Python frame", 15) &&
        strcmp(s->owners[0].owner, SNAP_BEFORE_HISTORY) &&
        s->owners[0].bytes >= s->allocated / 5 * 2 && s->n_owners > 1 && (g = diag(s, "dominant_layer"))) {
        snprintf(g->text, sizeof g->text, "dominant_layer: %s holds %s, %.0f%% of what is allocated.",
                 s->owners[0].owner, fmtb(s->owners[0].bytes, a), 100.0 * (double)s->owners[0].bytes / (double)s->allocated);
    }
    if (has_diag(s, "fragmentation")) fixes_fragmentation(s);
    if (has_diag(s, "capacity") || has_diag(s, "dominant_layer")) fixes_capacity(s);
    if (has_diag(s, "headroom")) {
        tk_snap_fix *f = fix(s, "release", -1);
        if (f) {
            snprintf(f->text, sizeof f->text,
                     "Free the device of the other holder: restart the runtime (or the process shown by nvidia-smi).");
            snprintf(f->code, sizeof f->code, "!nvidia-smi --query-compute-apps=pid,used_memory --format=csv");
        }
    }
}

/* ---- entry points --------------------------------------------------------------------- */

/* The snapshot's tree (a pickle's trace events already streamed through
 * snap_on_event when streamed is 1). */
static int read_tree(snap_ctx *c, sv root, int streamed) {
    tk_snapshot *s = c->s;
    sv segs = root;
    if (sv_is_dict(root)) {
        s->form = s->form ? s->form : "pickle (dict)";
        segs = sv_get(root, "segments");
        if (!sv_is_list(segs)) return snap_bad(c, "segments", "missing or not a list: not a PyTorch memory snapshot");
    } else if (sv_is_list(root)) {
        s->form = s->form ? s->form : "pickle (list of segments)";
    } else {
        char m[128];
        snprintf(m, sizeof m, "expected a dict with 'segments' or a list of segments, found %s", sv_kind(root));
        return snap_bad(c, "top level", m);
    }
    int64_t devices = 0;
    for (size_t i = 0; i < sv_len(segs); i++)
        if (read_segment(c, sv_at(segs, i), i, &devices)) return -1;
    for (int d = 0; d < 64; d++) s->n_devices += (int)((devices >> d) & 1);
    for (int k = 0; k < c->n_modules; k++)
        if (c->modules[k].bytes > s->model_module_bytes) {
            s->model_module_bytes = c->modules[k].bytes;
            snprintf(s->model_module, sizeof s->model_module, "%s", c->modules[k].name);
            snprintf(s->model_module_file, sizeof s->model_module_file, "%s", c->modules[k].file);
        }
    if (sv_is_dict(root)) {
        sv traces = sv_get(root, "device_traces"), ann = sv_get(root, "external_annotations");
        if (sv_true(sv_get(sv_get(root, "allocator_settings"), "expandable_segments"))) s->expandable_on = 1;
        s->has_annotations = sv_is_list(ann) && sv_len(ann) > 0;
        if (snap_build_trace(c, traces, streamed) || snap_find_leak(c) || snap_find_phases(c, ann)) return -1;
    }
    if (s->n_owners) qsort(s->owners, (size_t)s->n_owners, sizeof *s->owners, cmp_owner);
    diagnose(s);
    return 0;
}

static void ctx_clear(snap_ctx *c) {
    for (int i = 0; i < c->n_strs; i++) free(c->strs[i]);
    free(c->strs);
    free(c->str_tab);
    free(c->ev);
}

static tk_snapshot *snap_new(const char *name, size_t capacity, tk_err *err) {
    tk_snapshot *s = tk_calloc(1, sizeof *s);
    if (!s) {
        tk_err_set(err, TK_ENOMEM, "%s: out of host memory", name);
        return NULL;
    }
    snprintf(s->path, sizeof s->path, "%s", name);
    s->capacity = capacity;
    s->oom_time_us = s->peak_time_us = -1;
    return s;
}

/* A pickle, from memory (buf) or from the file at path: its trace events
 * streamed into records as they are read, the rest as a tree. */
static int read_pickle(snap_ctx *c, const uint8_t *buf, size_t len, const char *path) {
    tk_pickle_opts o = {.name = c->name, .max_bytes = SNAP_TREE_CAP, .stream_key = "action", .on_item = snap_on_event,
                        .item_ctx = c};
    tk_pickle *p = path ? tk_pickle_load_file(path, &o, c->err) : tk_pickle_load(buf, len, &o, c->err);
    int rc = p ? read_tree(c, (sv){tk_pickle_root(p), NULL}, 1) : -1;
    tk_pickle_destroy(&p);
    return rc;
}

static int read_json(snap_ctx *c, const uint8_t *buf, size_t len) {
    json_error_t je;
    json_t *j = json_loadb((const char *)buf, len, 0, &je);
    if (!j) {
        tk_err_set(c->err, TK_EFORMAT, "%s: line %d: not valid JSON: %s", c->name, je.line, je.text);
        return -1;
    }
    c->s->form = "json";
    int rc = read_tree(c, (sv){NULL, j}, 0);
    json_decref(j);
    return rc;
}

static int not_a_snapshot(snap_ctx *c) {
    tk_err_set(c->err, TK_EFORMAT,
               "%s: not a PyTorch memory snapshot (neither a pickle of protocol 2 or newer nor JSON)", c->name);
    return -1;
}

tk_snapshot *tk_snap_read_buf(const uint8_t *buf, size_t len, const char *name, size_t capacity, tk_err *err) {
    tk_snapshot *s = snap_new(name, capacity, err);
    if (!s) return NULL;
    snap_ctx c = {.s = s, .name = name, .err = err};
    size_t i = 0;
    while (i < len && (buf[i] == ' ' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t')) i++;
    int rc = i < len && (buf[i] == '{' || buf[i] == '[') ? read_json(&c, buf, len)
             : len && buf[0] == 0x80                       ? read_pickle(&c, buf, len, NULL)
                                                           : not_a_snapshot(&c);
    ctx_clear(&c);
    if (rc) tk_snap_destroy(&s);
    return s;
}

tk_snapshot *tk_snap_read(const char *path, size_t capacity, tk_err *err) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        tk_err_set(err, TK_EIO, "%s: %s", path, f ? "not a regular file" : strerror(errno));
        if (f) fclose(f);
        return NULL;
    }
    uint8_t head[64];
    size_t nh = fread(head, 1, sizeof head, f), i = 0;
    while (i < nh && (head[i] == ' ' || head[i] == '\n' || head[i] == '\r' || head[i] == '\t')) i++;
    if (nh && head[0] == 0x80) {
        /* a pickle of any size: mapped, its events streamed */
        fclose(f);
        tk_snapshot *s = snap_new(path, capacity, err);
        if (!s) return NULL;
        snap_ctx c = {.s = s, .name = path, .err = err};
        int rc = read_pickle(&c, NULL, 0, path);
        ctx_clear(&c);
        if (rc) tk_snap_destroy(&s);
        return s;
    }
    /* JSON is parsed whole: it stays within the 1 GiB this reader takes in memory */
    if ((size_t)st.st_size > SNAP_MAX_JSON) {
        tk_err_set(err, TK_EFORMAT, "%s: %lld bytes of JSON, larger than the 1 GiB this reader takes as JSON "
                                    "(a pickle of any size is read as it streams)",
                   path, (long long)st.st_size);
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = tk_malloc(n ? n : 1);
    if (!buf || fseek(f, 0, SEEK_SET) || fread(buf, 1, n, f) != n) {
        tk_err_set(err, TK_EIO, "%s: could not read the file", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    tk_snapshot *s = tk_snap_read_buf(buf, n, path, capacity, err);
    free(buf);
    return s;
}

void tk_snap_destroy(tk_snapshot **ps) {
    if (!ps || !*ps) return;
    free((*ps)->owners);
    free((*ps)->points);
    free((*ps)->live_sizes);
    free(*ps);
    *ps = NULL;
}

int tk_snap_capacity(const char *gpu, const char *size, size_t *out, tk_err *err) {
    *out = 0;
    if (gpu) {
        const tk_gpu_profile *p = tk_gpu_profile_find(gpu);
        if (!p) {
            tk_err_set(err, TK_EINVAL, "--gpu %s: unknown GPU profile (t4, p4, a100-40, ...)", gpu);
            return -1;
        }
        *out = p->capacity;
    }
    if (size && tk_parse_bytes(size, out)) {
        tk_err_set(err, TK_EINVAL, "--capacity %s: not a size (e.g. 14.75GiB)", size);
        return -1;
    }
    return 0;
}

/* ---- output --------------------------------------------------------------------------- */

/* The model in one line: what it is and its sizes. Sizes cannot show the
 * head count: a preset or --model gives it, otherwise it is BERT's
 * hidden / 64 and said to be assumed. */
void tk_snap_model_line(const tk_snap_model *md, char *buf, size_t n) {
    char a[32];
    if (!md->recognised) {
        if (md->hidden)
            snprintf(buf, n, "%s (not a BERT: not planned), hidden %d, %d layers, intermediate %d, vocab %d; %s weights, "
                             "%s of parameter-shaped blocks",
                     md->family, md->hidden, md->layers, md->intermediate, md->vocab,
                     md->mixed ? "fp32 and 16-bit" : md->elem == 2 ? "16-bit (fp16/bf16)" : "fp32",
                     tk_format_bytes(md->param_bytes, a, sizeof a));
        else
            snprintf(buf, n, "%s (not recognised)", md->family[0] ? md->family : "unknown");
        return;
    }
    snprintf(buf, n, "BERT%s%s%s, hidden %d, %d layers, %d heads%s, intermediate %d, vocab %d, %d positions; "
                     "%s weights, %d cop%s of each parameter (%s)",
             md->preset[0] ? " = " : "", md->preset,
             md->preset[0] ? "" : "-shaped (a transformer whose layers have BERT's parameter shapes)", md->hidden,
             md->layers, md->heads, md->preset[0] || strncmp(md->from, "--model", 7) == 0 ? "" : " (assumed: hidden / 64)",
             md->intermediate, md->vocab, md->max_position,
             md->mixed ? "fp32 and 16-bit" : md->elem == 2 ? "16-bit (fp16/bf16)" : "fp32", md->copies,
             md->copies == 1 ? "y" : "ies", tk_format_bytes(md->param_bytes, a, sizeof a));
}

char *tk_snap_text(const tk_snapshot *s, int top) {
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f) return NULL;
    char a[32], b[32], c[32], d[32];
    fprintf(f, "PyTorch memory snapshot %s (%s): %d segments, %d blocks\n", s->path, s->form, s->n_segments,
            s->n_blocks);
    fprintf(f, "  reserved %s (%zu B) · allocated %s (%zu B) · requested %s (%zu B)\n", fmtb(s->reserved, a),
            s->reserved, fmtb(s->allocated, b), s->allocated, fmtb(s->requested, c), s->requested);
    fprintf(f, "  free in the cache %s in %d blocks, largest free block %s (%zu B)\n", fmtb(s->free_in_cache, a),
            s->n_free_blocks, fmtb(s->largest_free_block, b), s->largest_free_block);
    if (s->capacity) fprintf(f, "  device capacity %s\n", fmtb(s->capacity, a));
    if (s->n_device_rows > 1) {
        fprintf(f, "  %d devices:\n", s->n_device_rows);
        for (int i = 0; i < s->n_device_rows; i++)
            fprintf(f, "    device %d: reserved %s, allocated %s, largest free block %s%s\n", s->devices[i].device,
                    fmtb(s->devices[i].reserved, a), fmtb(s->devices[i].allocated, b),
                    fmtb(s->devices[i].largest_free_block, c),
                    s->has_oom && s->devices[i].device == s->oom_device ? "  <- the OOM" : "");
    }
    if (s->has_oom) {
        char on[32] = "";
        if (s->n_device_rows > 1) snprintf(on, sizeof on, " on device %d", s->oom_device);
        fprintf(f, "  out of memory%s: tried to allocate %s with %s free on the device%s%s\n", on, fmtb(s->oom_size, a),
                fmtb(s->oom_device_free, b), s->phase_at_oom[0] ? ", during " : "", s->phase_at_oom);
    }
    if (s->expandable_on) fprintf(f, "  expandable segments: on\n");
    if (s->n_points)
        fprintf(f, "  trace: %d events, allocated peaks at %s%s%s\n", s->n_trace, fmtb(s->trace_peak_allocated, a),
                s->phase_at_peak[0] ? ", during " : "", s->phase_at_peak);
    fprintf(f, "\nSegments by pool and stream:\n  %-6s %-8s %8s %12s %12s %12s %12s\n", "pool", "stream", "segments",
            "reserved", "allocated", "free", "largest free");
    for (int i = 0; i < s->n_pools; i++) {
        const tk_snap_pool *p = &s->pools[i];
        fprintf(f, "  %-6s %-8lld %8d %12s %12s %12s %12s\n", p->pool, (long long)p->stream, p->segments,
                fmtb(p->reserved, a), fmtb(p->allocated, b), fmtb(p->free, c), fmtb(p->largest_free, d));
    }
    fprintf(f, "\nLive at the end, by owner (innermost frame of your code):\n");
    if (s->has_annotations) fprintf(f, "  %12s %12s  %-28s %s\n", "bytes", "blocks", "phase", "owner");
    for (int i = 0; i < s->n_owners && i < top; i++) {
        if (s->has_annotations)
            fprintf(f, "  %12s %5d blocks  %-28s %s\n", fmtb(s->owners[i].bytes, a), s->owners[i].blocks,
                    s->owners[i].phase[0] ? s->owners[i].phase : "-", s->owners[i].owner);
        else
            fprintf(f, "  %12s %5d blocks  %s\n", fmtb(s->owners[i].bytes, a), s->owners[i].blocks, s->owners[i].owner);
    }
    if (s->n_owners > top) fprintf(f, "  ... %d more owners\n", s->n_owners - top);
    const tk_snap_model *md = &s->model;
    if (!md->recognised && md->family[0]) {
        char line[512];
        tk_snap_model_line(md, line, sizeof line);
        fprintf(f, "\nModel: %s\n  why: %s\n", line, md->why);
    }
    if (md->recognised) {
        char line[512];
        tk_snap_model_line(md, line, sizeof line);
        fprintf(f, "\nModel (from %s): %s\n  why: %s\n", md->from, line, md->why);
        if (md->batch)
            fprintf(f, "  batch %d x sequence %d (from %s)\n", md->batch, md->seq, md->shape_from);
        else
            fprintf(f, "  batch and sequence length unknown: give --batch N --seq N to plan the fixes\n");
        if (md->planned)
            fprintf(f, "  planned as it ran by %s: peak %s%s%s (%s) -> %s; %s\n", md->engine_label, fmtb(md->plan_peak, a),
                    md->plan_capacity ? " of " : "", md->plan_capacity ? fmtb(md->plan_capacity, b) : "",
                    md->capacity_from, md->plan_fits ? "fits" : "does not fit", md->plan_note);
        else if (md->plan_withheld)
            fprintf(f, "  plan as it ran by %s %s\n", md->engine_label, md->plan_note);
    }
    if (s->data.have)
        fprintf(f, "\nData %s: %d examples, token lengths p50 %d, p95 %d, p99 %d, max %d (%s)\n", s->data.file,
                s->data.n, s->data.p50, s->data.p95, s->data.p99, s->data.max, s->data.vocab_note);
    fprintf(f, "\nDiagnosis:\n");
    if (!s->n_diag) fprintf(f, "  nothing wrong that this snapshot shows.\n");
    for (int i = 0; i < s->n_diag; i++) fprintf(f, "  %d. %s\n", i + 1, s->diag[i].text);
    if (s->n_fixes) fprintf(f, "\nFixes, best first:\n");
    for (int i = 0; i < s->n_fixes; i++) {
        fprintf(f, "  %d. [%s] %s\n", i + 1, s->fixes[i].id, s->fixes[i].text);
        if (s->fixes[i].planned)
            fprintf(f, "       planned (%s): %s peak %s%s%s\n", s->fixes[i].plan_change,
                    s->fixes[i].plan_fits ? "fits:" : "does not fit:", fmtb(s->fixes[i].plan_peak, a),
                    md->plan_capacity ? " of " : "", md->plan_capacity ? fmtb(md->plan_capacity, b) : "");
        const char *line = s->fixes[i].code;
        while (*line) {
            const char *e = strchr(line, '\n');
            int len = e ? (int)(e - line) : (int)strlen(line);
            fprintf(f, "       %.*s\n", len, line);
            line += len + (e ? 1 : 0);
        }
    }
    fclose(f);
    return out;
}

json_t *tk_snap_json(const tk_snapshot *s, int top) {
    json_t *o = json_object();
    json_object_set_new(o, "file", json_string(s->path));
    json_object_set_new(o, "form", json_string(s->form));
    json_object_set_new(o, "reserved", json_integer((json_int_t)s->reserved));
    json_object_set_new(o, "allocated", json_integer((json_int_t)s->allocated));
    json_object_set_new(o, "requested", json_integer((json_int_t)s->requested));
    json_object_set_new(o, "pending_free", json_integer((json_int_t)s->pending_free));
    json_object_set_new(o, "largest_free_block", json_integer((json_int_t)s->largest_free_block));
    json_object_set_new(o, "free_in_cache", json_integer((json_int_t)s->free_in_cache));
    json_object_set_new(o, "empty_segments", json_integer((json_int_t)s->empty_segments));
    json_object_set_new(o, "n_segments", json_integer(s->n_segments));
    json_object_set_new(o, "n_blocks", json_integer(s->n_blocks));
    json_object_set_new(o, "n_devices", json_integer(s->n_devices));
    json_object_set_new(o, "capacity", s->capacity ? json_integer((json_int_t)s->capacity) : json_null());
    json_t *pools = json_array();
    for (int i = 0; i < s->n_pools; i++) {
        const tk_snap_pool *p = &s->pools[i];
        json_array_append_new(pools, json_pack("{s:s, s:I, s:i, s:I, s:I, s:I, s:I}", "pool", p->pool, "stream",
                                               (json_int_t)p->stream, "segments", p->segments, "reserved",
                                               (json_int_t)p->reserved, "allocated", (json_int_t)p->allocated, "free",
                                               (json_int_t)p->free, "largest_free", (json_int_t)p->largest_free));
    }
    json_object_set_new(o, "segments", pools);
    json_t *devs = json_array();
    for (int i = 0; i < s->n_device_rows; i++)
        json_array_append_new(devs, json_pack("{s:i, s:I, s:I, s:I}", "device", s->devices[i].device, "reserved",
                                              (json_int_t)s->devices[i].reserved, "allocated",
                                              (json_int_t)s->devices[i].allocated, "largest_free_block",
                                              (json_int_t)s->devices[i].largest_free_block));
    json_object_set_new(o, "devices", devs);
    json_object_set_new(o, "expandable_segments", json_boolean(s->expandable_on));
    json_t *t = json_array();
    for (int i = 0; i < s->n_owners && i < top; i++) {
        json_t *r = json_pack("{s:s, s:I, s:i}", "owner", s->owners[i].owner, "bytes", (json_int_t)s->owners[i].bytes,
                              "blocks", s->owners[i].blocks);
        if (s->has_annotations)
            json_object_set_new(r, "phase", s->owners[i].phase[0] ? json_string(s->owners[i].phase) : json_null());
        json_array_append_new(t, r);
    }
    json_object_set_new(o, "top", t);
    json_object_set_new(o, "oom", s->has_oom ? json_pack("{s:I, s:I, s:i, s:o}", "size", (json_int_t)s->oom_size,
                                                         "device_free", (json_int_t)s->oom_device_free, "device",
                                                         s->oom_device, "phase",
                                                         s->phase_at_oom[0] ? json_string(s->phase_at_oom) : json_null())
                                             : json_null());
    json_object_set_new(o, "phase_at_peak", s->phase_at_peak[0] ? json_string(s->phase_at_peak) : json_null());
    json_object_set_new(o, "growth", json_pack("{s:b, s:I, s:i}", "found", s->has_growth, "bytes",
                                               (json_int_t)s->growth_bytes, "rises", s->growth_rises));
    json_object_set_new(o, "timeline", json_pack("{s:i, s:i, s:I}", "events", s->n_trace, "points", s->n_points,
                                                 "peak_allocated", (json_int_t)s->trace_peak_allocated));
    json_t *dg = json_array();
    for (int i = 0; i < s->n_diag; i++)
        json_array_append_new(dg, json_pack("{s:s, s:s}", "id", s->diag[i].id, "text", s->diag[i].text));
    json_object_set_new(o, "diagnoses", dg);
    json_t *fx = json_array();
    for (int i = 0; i < s->n_fixes; i++) {
        const tk_snap_fix *f = &s->fixes[i];
        json_t *x = json_pack("{s:s, s:s, s:s, s:o}", "id", f->id, "text", f->text, "code", f->code, "saves",
                              f->saves >= 0 ? json_integer(f->saves) : json_null());
        if (f->planned)
            json_object_set_new(x, "plan", json_pack("{s:I, s:b, s:s}", "peak", (json_int_t)f->plan_peak, "fits",
                                                     f->plan_fits, "change", f->plan_change));
        json_array_append_new(fx, x);
    }
    json_object_set_new(o, "fixes", fx);
    json_object_set_new(o, "leak",
                        json_pack("{s:b, s:i, s:I, s:I, s:o, s:I, s:i}", "found", s->has_leak, "iterations",
                                  s->leak_iterations, "per_iteration", (json_int_t)s->leak_per_iteration, "total",
                                  (json_int_t)s->leak_total, "owner",
                                  s->leak_owner[0] ? json_string(s->leak_owner) : json_null(), "owner_bytes",
                                  (json_int_t)s->leak_owner_bytes, "owner_iterations", s->leak_owner_iterations));
    const tk_snap_model *md = &s->model;
    json_t *mj = json_null();
    if (!md->recognised && md->family[0]) {
        mj = json_pack("{s:s, s:s, s:b}", "family", md->family, "why", md->why, "planned", 0);
        if (md->hidden) {
            json_object_set_new(mj, "hidden", json_integer(md->hidden));
            json_object_set_new(mj, "layers", json_integer(md->layers));
            json_object_set_new(mj, "intermediate", json_integer(md->intermediate));
            json_object_set_new(mj, "vocab", json_integer(md->vocab));
            json_object_set_new(mj, "max_position", md->max_position ? json_integer(md->max_position) : json_null());
            json_object_set_new(mj, "dtype", json_string(md->mixed ? "mixed (fp32 and 16-bit copies)"
                                                         : md->elem == 2 ? "fp16/bf16" : "fp32"));
            json_object_set_new(mj, "copies", json_integer(md->copies));
            json_object_set_new(mj, "param_bytes", json_integer((json_int_t)md->param_bytes));
        }
    }
    if (md->recognised) {
        mj = json_pack("{s:s, s:o, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:I}", "recognised_from", md->from, "preset",
                       md->preset[0] ? json_string(md->preset) : json_null(), "hidden", md->hidden, "layers",
                       md->layers, "heads", md->heads, "intermediate", md->intermediate, "vocab", md->vocab,
                       "max_position", md->max_position, "dtype",
                       md->mixed ? "mixed (fp32 and 16-bit copies)" : md->elem == 2 ? "fp16/bf16" : "fp32", "copies",
                       md->copies, "param_bytes", (json_int_t)md->param_bytes);
        json_object_set_new(mj, "batch", md->batch ? json_integer(md->batch) : json_null());
        json_object_set_new(mj, "seq", md->seq ? json_integer(md->seq) : json_null());
        json_object_set_new(mj, "shape_from", md->shape_from[0] ? json_string(md->shape_from) : json_null());
        json_object_set_new(mj, "family", json_string(md->family));
        json_object_set_new(mj, "why", json_string(md->why));
        json_object_set_new(mj, "planned", json_boolean(md->planned));
        if (md->planned)
            json_object_set_new(mj, "plan", json_pack("{s:I, s:o, s:b, s:s, s:s, s:s}", "peak", (json_int_t)md->plan_peak,
                                                      "capacity",
                                                      md->plan_capacity ? json_integer((json_int_t)md->plan_capacity)
                                                                        : json_null(),
                                                      "fits", md->plan_fits, "capacity_from", md->capacity_from,
                                                      "engine", md->engine, "agreement", md->plan_note));
        else if (md->plan_withheld)
            json_object_set_new(mj, "plan_withheld", json_pack("{s:s, s:s}", "engine", md->engine, "reason", md->plan_note));
    }
    json_object_set_new(o, "model", mj);
    const tk_snap_data *dt = &s->data;
    json_object_set_new(o, "data", dt->have ? json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s}", "file", dt->file,
                                                        "examples", dt->n, "max", dt->max, "p50", dt->p50, "p95",
                                                        dt->p95, "p99", dt->p99, "max_length", dt->max_length,
                                                        "vocabulary", dt->vocab_note)
                                            : json_null());
    return o;
}
