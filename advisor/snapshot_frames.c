/* snapshot_frames.c — owners and frames (see snapshot_frames.h): what each
 * stack shows, read once per stack; the phase, layer and step of each
 * event; the library workspaces; the owners of the blocks live at the end.
 *
 * The phase: an external_annotations range open at the event's time
 * (Optimizer.step, zero_grad, the DataLoader) names it; else its frames do
 * (the autograd engine or torch/autograd: backward; torch/optim: the
 * optimizer; a module's forward: forward; module._apply/.to/.cuda: the
 * model's loading); an event with no frames at all inside backward (the
 * trace records Python frames, the autograd engine's device thread has
 * none) is backward's.
 *
 * The layer: inside one forward pass, a call site whose callee starts over
 * (the same function at a lower line than the last allocation reached in
 * it) is a loop calling one layer after another; the call site that starts
 * over most is the model's layer loop, and each allocation under it gets
 * the loop's count so far.
 */
#include "snapshot_frames.h"
#include "tk_host_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- one frame --------------------------------------------------------------------------- */

static const char *basename_of(const char *p) {
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

static int ends_with(const char *s, const char *t) {
    size_t n = strlen(s), m = strlen(t);
    return n >= m && !strcmp(s + n - m, t);
}

static int is_notebook_frame(const char *f) {
    return (strstr(f, "/ipykernel_") && ends_with(f, ".py")) || strstr(f, "<ipython-input-") != NULL;
}

/* A Python frame is a .py file or a notebook cell; everything else a
 * stacks="all" snapshot records (the allocator's C++, ATen's .cpp, CPython's
 * methodobject.c, "??", "", a thread routine's .o) is native code, never
 * shown as code. */
static int is_python_frame(const char *f) {
    return ends_with(f, ".py") || ends_with(f, ".pyw") || is_notebook_frame(f);
}

static int is_library_frame(const char *f) {
    return strstr(f, "/site-packages/") || strstr(f, "/dist-packages/") || strstr(f, "/lib/python") ||
           strstr(f, "/Lib/") || strstr(f, "/torch/") || strstr(f, "/transformers/");
}

/* The library path from the package on: "torch/nn/modules/linear.py". */
static const char *library_tail(const char *f) {
    const char *k;
    if ((k = strstr(f, "/site-packages/"))) return k + 15;
    if ((k = strstr(f, "/dist-packages/"))) return k + 15;
    if ((k = strstr(f, "/torch/"))) return k + 1;
    if ((k = strstr(f, "/transformers/"))) return k + 1;
    return basename_of(f);
}

/* The library frames worth naming beside the user's line: the module or
 * optimizer that allocated, not torch's dispatch plumbing. */
static int is_named_library(const char *tail) {
    static const char *const P[] = {"torch/nn/modules/", "torch/optim/", "transformers/", "vllm/", "peft/",
                                    "accelerate/", "bitsandbytes/"};
    for (size_t i = 0; i < sizeof P / sizeof *P; i++)
        if (!strncmp(tail, P[i], strlen(P[i]))) return 1;
    return 0;
}

/* A frame's filename with Windows separators read like a POSIX one
 * (C:\a\b.py -> C:/a/b.py), so one set of rules shortens both; NULL when
 * the frame has none. */
static const char *frame_path(const snap_dec *d, int32_t fid, char *out, size_t n) {
    const snap_frame *fr = &d->frames[fid];
    if (fr->file < 0) return NULL;
    const char *f = snap_str(d, fr->file);
    size_t i = 0;
    for (; f[i] && i + 1 < n; i++) out[i] = f[i] == '\\' ? '/' : f[i];
    out[i] = 0;
    return out;
}

static const char *frame_fn(const snap_dec *d, int32_t fid) {
    return d->frames[fid].name >= 0 ? snap_str(d, d->frames[fid].name) : NULL;
}

/* ---- what a stack shows ----------------------------------------------------------------- */

int snap_names_no_code(const char *owner) {
    return !strncmp(owner, "no Python frame", 15) || !strcmp(owner, SNAP_BEFORE_HISTORY) ||
           !strncmp(owner, "library:", 8) || !strncmp(owner, "backward (", 10);
}

static int is_autograd_engine(const snap_dec *d, int32_t fid) {
    const char *fn = frame_fn(d, fid), *file = d->frames[fid].file >= 0 ? snap_str(d, d->frames[fid].file) : NULL;
    return (fn && (strstr(fn, "torch::autograd::Engine") || strstr(fn, "torch::autograd::python::PythonEngine"))) ||
           (file && !strcmp(file, "engine.cpp"));
}

/* The native frames of a block with no Python frame, named by what they
 * show: the autograd engine's worker thread runs backward; otherwise the
 * ATen operator that asked (at::_ops::NAME), else nothing known. */
static void native_owner(const snap_dec *d, int32_t st, char *out, size_t n) {
    int nf;
    const int32_t *fs = snap_stack(d, st, &nf);
    char op[96] = "";
    if (!nf) {
        /* PyTorch records frames only while the history is on */
        snprintf(out, n, "%s", SNAP_BEFORE_HISTORY);
        return;
    }
    for (int i = 0; i < nf; i++) {
        const char *fn = frame_fn(d, fs[i]);
        if (is_autograd_engine(d, fs[i])) {
            snprintf(out, n, "backward (autograd engine)");
            return;
        }
        if (!op[0] && fn && !strncmp(fn, "at::_ops::", 10)) {
            const char *e = strstr(fn + 10, "::");
            snprintf(op, sizeof op, "%.*s", e ? (int)(e - fn - 10) : (int)strlen(fn + 10), fn + 10);
        }
    }
    if (op[0]) snprintf(out, n, "no Python frame (C++: aten::%s)", op);
    else snprintf(out, n, "no Python frame");
}

/* Who holds a block: the innermost frame of the user's code, with the
 * innermost named library frame inside it as the kind; native frames are
 * skipped, and a block with native frames only is named by them. 1 when
 * the frames are txkernel's own (txk train/plan --snapshot writes one
 * frame, filename "txkernel", that names the owner). */
static int owner_of(const snap_dec *d, int32_t st, char *out, size_t n) {
    char kind[96] = "", first_py[TK_PATH_MAX] = "", file[TK_PATH_MAX];
    int python = 0, first_line = 0, nf;
    const int32_t *fs = snap_stack(d, st, &nf);
    for (int i = 0; i < nf; i++) {
        const char *fn = frame_fn(d, fs[i]);
        int line = d->frames[fs[i]].line;
        if (!frame_path(d, fs[i], file, sizeof file)) continue;
        if (!strcmp(file, "txkernel") && fn) {
            snprintf(out, n, "%s", fn);
            return 1;
        }
        if (!is_python_frame(file)) continue;
        if (!python) {
            snprintf(first_py, sizeof first_py, "%s", file);
            first_line = line;
        }
        python = 1;
        if (is_notebook_frame(file)) {
            snprintf(out, n, "cell, line %d%s%s", line, *kind ? " · " : "", kind);
            return 0;
        }
        if (is_library_frame(file)) {
            const char *t = library_tail(file);
            if (!*kind && is_named_library(t)) snprintf(kind, sizeof kind, "%.95s", t);
            continue;
        }
        char whole[320]; /* cut to the owner's size as a whole */
        snprintf(whole, sizeof whole, "%.80s, line %d (%.60s)%s%s", basename_of(file), line, fn ? fn : "?",
                 *kind ? " · " : "", kind);
        snprintf(out, n, "%.*s", (int)(n - 1), whole);
        return 0;
    }
    if (*kind) snprintf(out, n, "library: %s", kind);
    else if (python) snprintf(out, n, "library: %s, line %d", library_tail(first_py), first_line);
    else native_owner(d, st, out, n);
    return 0;
}

/* The model module a stack passes through, as the library names its files:
 * transformers/models/NAME/modeling_NAME.py, vllm/model_executor/models/NAME.py.
 * 1 with name and file set. */
static int model_module_of(const snap_dec *d, int32_t st, char *name, size_t nn, char *file, size_t nf) {
    char path[TK_PATH_MAX];
    int n;
    const int32_t *fs = snap_stack(d, st, &n);
    for (int i = 0; i < n; i++) {
        if (!frame_path(d, fs[i], path, sizeof path) || !ends_with(path, ".py")) continue;
        const char *k = strstr(path, "transformers/models/"), *e;
        if (k && (e = strchr(k + 20, '/')) && strstr(e, "/modeling_")) {
            snprintf(name, nn, "%.*s", (int)(e - k - 20), k + 20);
            snprintf(file, nf, "%s", k);
            return 1;
        }
        if ((k = strstr(path, "vllm/model_executor/models/")) && !strchr(k + 27, '/')) {
            snprintf(name, nn, "%.*s", (int)(strlen(k + 27) - 3), k + 27);
            snprintf(file, nf, "%s", k);
            return 1;
        }
    }
    return 0;
}

/* 1: the stack passes through transformers' Trainer (trainer.py). */
static int is_trainer_stack(const snap_dec *d, int32_t st) {
    char path[TK_PATH_MAX];
    int n;
    const int32_t *fs = snap_stack(d, st, &n);
    for (int i = 0; i < n; i++)
        if (frame_path(d, fs[i], path, sizeof path) && ends_with(path, "transformers/trainer.py")) return 1;
    return 0;
}

/* A block an inference engine preallocated as its KV-cache pool: vLLM's
 * cache engine (v0) or its model runner's initialize_kv_cache (v1). */
static int is_engine_pool(const snap_dec *d, int32_t st) {
    char path[TK_PATH_MAX];
    int n;
    const int32_t *fs = snap_stack(d, st, &n);
    for (int i = 0; i < n; i++) {
        const char *fn = frame_fn(d, fs[i]);
        if (!frame_path(d, fs[i], path, sizeof path) || !ends_with(path, ".py")) continue;
        if (strstr(path, "vllm/") && (strstr(path, "/cache_engine.py") || (fn && strstr(fn, "kv_cache")))) return 1;
    }
    return 0;
}

/* The user's outermost frame (a line of their code that is not a
 * library's) as one number: file and line hashed; 0 when none. */
static uint64_t outer_user_line(const snap_dec *d, int32_t st) {
    char path[TK_PATH_MAX];
    uint64_t key = 0;
    int n;
    const int32_t *fs = snap_stack(d, st, &n);
    for (int i = 0; i < n; i++) {
        if (!frame_path(d, fs[i], path, sizeof path) || !is_python_frame(path)) continue;
        if (is_library_frame(path) && !is_notebook_frame(path)) continue;
        uint64_t h = UINT64_C(1469598103934665603);
        for (const char *p = path; *p; p++) h = (h ^ (unsigned char)*p) * UINT64_C(1099511628211);
        key = (h ^ (uint64_t)d->frames[fs[i]].line * UINT64_C(0x9E3779B97F4A7C15)) | 1;
    }
    return key;
}

/* The phase a stack's own frames show, innermost first: the autograd
 * engine or torch/autograd (or checkpointing's recomputation) -> backward;
 * torch/optim -> the optimizer; the DataLoader; else the innermost
 * module forward; else the model being loaded or moved (module._apply);
 * else the user's own code. text: "backward", "Optimizer.step",
 * "forward (linear.py, line 116)", or "" for the last two. */
static int kind_of(const snap_dec *d, int32_t st, char *text, size_t n) {
    char path[TK_PATH_MAX], fwd[160] = "";
    int nf, python = 0, load = 0;
    const int32_t *fs = snap_stack(d, st, &nf);
    text[0] = 0;
    for (int i = 0; i < nf; i++) {
        const char *fn = frame_fn(d, fs[i]);
        if (is_autograd_engine(d, fs[i]) && fn && strstr(fn, "torch::autograd::")) {
            snprintf(text, n, "backward");
            return PH_BACKWARD;
        }
        if (!frame_path(d, fs[i], path, sizeof path) || !is_python_frame(path)) continue;
        python = 1;
        if (strstr(path, "/torch/autograd/") ||
            (strstr(path, "/torch/utils/checkpoint.py") && fn && (strstr(fn, "unpack") || strstr(fn, "recompute")))) {
            snprintf(text, n, "backward");
            return PH_BACKWARD;
        }
        if (strstr(path, "/torch/optim/")) {
            snprintf(text, n, "Optimizer.step");
            return PH_OPTIMIZER;
        }
        if (strstr(path, "/torch/utils/data/")) {
            snprintf(text, n, "DataLoader");
            return PH_DATA;
        }
        int plumbing = ends_with(path, "/torch/nn/modules/module.py");
        if (!fwd[0] && fn && !strcmp(fn, "forward") && !plumbing)
            snprintf(fwd, sizeof fwd, "forward (%.100s, line %d)", basename_of(path), d->frames[fs[i]].line);
        if (plumbing && fn && (!strcmp(fn, "_apply") || !strcmp(fn, "to") || !strcmp(fn, "cuda") ||
                               !strcmp(fn, "_load_from_state_dict")))
            load = 1;
    }
    if (fwd[0]) {
        snprintf(text, n, "%.63s", fwd);
        return PH_FORWARD;
    }
    return load ? PH_LOAD : python ? PH_CODE : PH_NONE;
}

/* txkernel's own snapshots (txk train/plan --snapshot) give every block one
 * frame named "OWNER · CATEGORY · PHASE": the category (a tk_cat, -1 none)
 * and the phase as written. */
static int txkernel_tag(const snap_dec *d, int32_t st, char *phase, size_t n) {
    int nf;
    const int32_t *fs = snap_stack(d, st, &nf);
    phase[0] = 0;
    if (nf != 1 || d->frames[fs[0]].file < 0 || strcmp(snap_str(d, d->frames[fs[0]].file), "txkernel")) return -1;
    const char *name = frame_fn(d, fs[0]), *a = name ? strstr(name, " · ") : NULL;
    if (!a) return -1;
    a += strlen(" · ");
    const char *b = strstr(a, " · ");
    if (b) snprintf(phase, n, "%s", b + strlen(" · "));
    size_t len = b ? (size_t)(b - a) : strlen(a);
    for (int k = 0; k < TK_CAT_COUNT; k++)
        if (strlen(tk_cat_name((tk_cat)k)) == len && !strncmp(a, tk_cat_name((tk_cat)k), len)) return k;
    return -1;
}

static int read_stack_info(snap_dec *d, snap_frames *f, int32_t st) {
    if (f->owner[st] != -2) return 0;
    char buf[192], ph[64];
    f->cat[st] = (int8_t)txkernel_tag(d, st, ph, sizeof ph);
    owner_of(d, st, buf, sizeof buf);
    if ((f->owner[st] = snap_intern(d, buf)) < 0) return -1;
    f->kind[st] = (uint8_t)kind_of(d, st, buf, 64);
    if (f->cat[st] >= 0 || ph[0]) { /* txkernel's phase, as its trainer set it */
        static const struct { const char *name; uint8_t ph; } T[] = {
            {"forward", PH_FORWARD}, {"backward", PH_BACKWARD}, {"optimizer", PH_OPTIMIZER}};
        f->kind[st] = PH_NONE;
        for (size_t k = 0; k < sizeof T / sizeof *T; k++)
            if (!strcmp(ph, T[k].name)) f->kind[st] = T[k].ph;
        snprintf(buf, 64, "%s", ph);
    }
    f->kind_text[st] = -1;
    if (buf[0] && (f->kind_text[st] = snap_intern(d, buf)) < 0) return -1;
    f->uline[st] = outer_user_line(d, st);
    return 0;
}

const char *snap_owner(snap_dec *d, snap_frames *f, int32_t st) {
    if (read_stack_info(d, f, st)) return "";
    return snap_str(d, f->owner[st]);
}

const char *snap_event_owner(const snap_dec *d, const snap_frames *f, int64_t ev) {
    int32_t st = d->ev[ev].stack;
    if (st > 0) return snap_str(d, f->owner[st]); /* read with the event's phase */
    if (!d->has_frames) return SNAP_BEFORE_HISTORY;
    return f->phase[ev] == PH_BACKWARD ? "backward (autograd engine)" : "no Python frame";
}

const char *snap_phase_name(int ph) {
    static const char *const N[PH_N] = {"", "loading the model", "your code", "forward", "backward",
                                        "optimizer step", "zero_grad", "data loading"};
    return ph >= 0 && ph < PH_N ? N[ph] : "";
}

/* ---- phases and steps ---------------------------------------------------------------------- */

/* An annotation's name as a phase: "Optimizer.step#AdamW.step" ->
 * "Optimizer.step (AdamW)", "enumerate(DataLoader)#..." -> "DataLoader",
 * anything else (a user's record_function) as it is. */
static void ann_text(const char *name, char *out, size_t n) {
    const char *h = strchr(name, '#');
    if (!strncmp(name, "enumerate(DataLoader)", 21)) snprintf(out, n, "DataLoader");
    else if (!strncmp(name, "Optimizer.", 10) && h) {
        const char *k = strchr(h + 1, '.');
        snprintf(out, n, "%.*s (%.*s)", (int)(h - name), name, k ? (int)(k - h - 1) : (int)strlen(h + 1), h + 1);
    } else
        snprintf(out, n, "%.*s", h ? (int)(h - name) : (int)strlen(name), name);
}

static int ann_kind(const char *name) {
    if (!strncmp(name, "Optimizer.step", 14)) return PH_OPTIMIZER;
    if (!strncmp(name, "Optimizer.zero_grad", 19)) return PH_ZERO_GRAD;
    if (!strncmp(name, "enumerate(DataLoader)", 21)) return PH_DATA;
    return PH_NONE;
}

void snap_phase_text(const snap_dec *d, const snap_frames *f, int64_t ev, char *out, size_t n) {
    out[0] = 0;
    if (ev < 0 || (size_t)ev >= d->n_ev) return;
    int32_t st = d->ev[ev].stack;
    if (f->ann[ev] >= 0) ann_text(snap_str(d, f->ann[ev]), out, n);
    else if (st > 0 && f->owner[st] != -2 && f->kind_text[st] >= 0) snprintf(out, n, "%s", snap_str(d, f->kind_text[st]));
    else if (f->phase[ev] == PH_BACKWARD) snprintf(out, n, "backward");
}

/* Each event's phase, innermost open annotation and step, walking the
 * annotations beside the events in time order (each device's list alone). */
static int read_phases(snap_dec *d, snap_frames *f) {
    enum { DEPTH = 16 };
    int32_t open[DEPTH];
    int depth = 0, last = PH_NONE, in_opt = 0, list = -1;
    size_t ak = 0;
    int64_t t_prev = -1;
    for (size_t i = 0; i < d->n_ev; i++) {
        const snap_ev *e = &d->ev[i];
        if (e->list != list || e->time_us < t_prev) depth = 0, ak = 0, list = e->list;
        t_prev = e->time_us;
        for (; e->time_us >= 0 && ak < (size_t)d->n_ann && d->ann[ak].time_us <= e->time_us; ak++) {
            const snap_ann *a = &d->ann[ak];
            if (a->device != e->list) continue;
            if (a->start) {
                if (depth < DEPTH) open[depth++] = a->name;
            } else
                for (int k = depth - 1; k >= 0; k--)
                    if (open[k] == a->name) {
                        memmove(&open[k], &open[k + 1], (size_t)(depth - k - 1) * sizeof *open);
                        depth--;
                        break;
                    }
        }
        f->ann[i] = depth ? open[depth - 1] : -1;
        /* An alloc's (and an OOM's) frames are where the program is; a
         * free carries the frames its block was allocated with, so it runs
         * in the phase the last alloc showed. */
        int ph = PH_NONE, now = e->action == EV_ALLOC || e->action == EV_OOM || e->action == EV_SEG_ALLOC;
        if (e->stack > 0 && read_stack_info(d, f, e->stack)) return snap_bad_nomem(d, "device_traces");
        if (!now)
            ph = last;
        else if (e->stack > 0) {
            ph = f->kind[e->stack];
            if (ph != PH_NONE) last = ph;
        } else if (d->has_frames && last == PH_BACKWARD)
            ph = PH_BACKWARD; /* the autograd engine's device thread records no Python frame */
        for (int k = depth - 1; k >= 0; k--)
            if (ann_kind(snap_str(d, open[k])) != PH_NONE) {
                ph = ann_kind(snap_str(d, open[k]));
                break;
            }
        if (ph == PH_OPTIMIZER) in_opt = 1;
        else if (in_opt && ph != PH_NONE) in_opt = 0, f->steps++;
        f->phase[i] = (uint8_t)ph;
        f->step[i] = (int16_t)(f->steps + 1 > INT16_MAX ? INT16_MAX : f->steps + 1);
    }
    f->steps += in_opt;
    return 0;
}

/* ---- layers --------------------------------------------------------------------------------- */

#define CHAIN_MAX 256

/* The Python frames of stack st, outermost first, without torch's module
 * call plumbing; each prefix's hash in pre[j] (the first j + 1 frames). */
static int py_chain(const snap_dec *d, int32_t st, int32_t *out, uint64_t *pre) {
    char path[TK_PATH_MAX];
    int nf, n = 0;
    const int32_t *fs = snap_stack(d, st, &nf);
    for (int i = nf - 1; i >= 0 && n < CHAIN_MAX; i--) {
        if (!frame_path(d, fs[i], path, sizeof path) || !is_python_frame(path) ||
            ends_with(path, "/torch/nn/modules/module.py"))
            continue;
        out[n] = fs[i];
        pre[n] = ((n ? pre[n - 1] : UINT64_C(1469598103934665603)) ^ (uint64_t)fs[i]) * UINT64_C(1099511628211);
        n++;
    }
    return n;
}

/* Where cur starts over against prev: the depth k >= 1 at which the same
 * function runs again at a lower line, under the same frames; 0 none. */
static int restart_depth(const snap_dec *d, const int32_t *prev, int np, const int32_t *cur, int nc) {
    int k = 0;
    while (k < np && k < nc && prev[k] == cur[k]) k++;
    if (k < 1 || k >= np || k >= nc) return 0;
    const snap_frame *a = &d->frames[prev[k]], *b = &d->frames[cur[k]];
    return a->file == b->file && a->name == b->name && b->line < a->line ? k : 0;
}

/* One forward pass ended with `calls` calls of the layer loop: the passes
 * agree on a count, or the count is unknown (0). */
static void end_pass(snap_frames *f, int *passes, int calls) {
    f->layers_seen = !(*passes)++ || f->layers_seen == calls ? calls : 0;
}

/* txkernel's own snapshot names each block's module (bert.encoder.layer.3.
 * attention.self): the layer from the name, the embeddings before the
 * layers, the rest (pooler, head, loss) after. */
static void read_named_layers(const snap_dec *d, snap_frames *f) {
    int top = -1;
    for (size_t i = 0; i < d->n_ev; i++) {
        int32_t st = d->ev[i].stack;
        if (d->ev[i].action != EV_ALLOC || st <= 0 || f->cat[st] < 0) continue;
        const char *o = snap_str(d, f->owner[st]), *k = strstr(o, "layer.");
        int l = -1;
        if (k && sscanf(k + 6, "%d", &l) == 1 && l >= 0 && l < INT16_MAX) f->layer[i] = (int16_t)l;
        else f->layer[i] = strstr(o, "embeddings") ? LAYER_BEFORE : LAYER_AFTER;
        if (l > top) top = l;
    }
    f->layers_seen = top + 1;
}

static int read_layers(snap_dec *d, snap_frames *f) {
    if (d->by_txkernel) {
        for (size_t i = 0; i < d->n_ev; i++) f->layer[i] = LAYER_NONE;
        read_named_layers(d, f);
        return 0;
    }
    int32_t *prev = tk_malloc(2 * CHAIN_MAX * sizeof *prev), *cur = prev ? prev + CHAIN_MAX : NULL;
    uint64_t *pre = tk_malloc(CHAIN_MAX * sizeof *pre);
    snap_map counts = {0};
    int rc = -1, np = -1;
    int64_t best = 0, key = 0, v;
    if (!prev || !pre) goto out;
    /* the call site that starts its callee over most */
    for (size_t i = 0; i < d->n_ev; i++) {
        f->layer[i] = LAYER_NONE;
        if (d->ev[i].action != EV_ALLOC) continue;
        if (f->phase[i] != PH_FORWARD) {
            np = -1;
            continue;
        }
        int nc = py_chain(d, d->ev[i].stack, cur, pre);
        int k = np >= 0 ? restart_depth(d, prev, np, cur, nc) : 0;
        if (k) {
            int64_t site = (int64_t)pre[k - 1], c = snap_map_get(&counts, site, &v) ? v + 1 : 1;
            if (snap_map_put(&counts, site, c)) goto out;
            if (c > best) best = c, key = site;
        }
        memcpy(prev, cur, (size_t)nc * sizeof *cur);
        np = nc;
    }
    /* each forward allocation's place against that loop */
    int idx = -1, passes = 0, seen = 0, in_pass = 0;
    np = -1;
    for (size_t i = 0; best && i < d->n_ev; i++) {
        if (d->ev[i].action != EV_ALLOC) continue;
        if (f->phase[i] != PH_FORWARD) {
            if (in_pass) end_pass(f, &passes, idx + 1);
            in_pass = 0, np = -1, idx = -1, seen = 0;
            continue;
        }
        in_pass = 1;
        int nc = py_chain(d, d->ev[i].stack, cur, pre), under = 0;
        for (int j = 0; j + 1 < nc && !under; j++) under = (int64_t)pre[j] == key;
        int k = np >= 0 ? restart_depth(d, prev, np, cur, nc) : 0;
        if (k && (int64_t)pre[k - 1] == key) idx++;
        if (under && idx < 0) idx = 0;
        seen |= under;
        f->layer[i] = (int16_t)(under ? (idx > INT16_MAX ? INT16_MAX : idx) : seen ? LAYER_AFTER : LAYER_BEFORE);
        memcpy(prev, cur, (size_t)nc * sizeof *cur);
        np = nc;
    }
    if (in_pass) end_pass(f, &passes, idx + 1);
    rc = 0;
out:
    if (rc) snap_bad_nomem(d, "device_traces");
    free(prev);
    free(pre);
    snap_map_clear(&counts);
    return rc;
}

/* ---- library workspaces --------------------------------------------------------------------- */

/* cuBLAS's default workspace as torch allocates it through the caching
 * allocator, one per handle (a handle per thread and stream): 4096 KiB x 8
 * on compute capability 9.x and 10.x, else 4096 KiB x 2 + 16 KiB x 8. */
static int cublas_size(int64_t n) { return n == (int64_t)32 << 20 || n == ((int64_t)8 << 20) + ((int64_t)128 << 10); }

/* A workspace's frames: none at all, or a matmul's (nn.Linear,
 * F.linear, torch.matmul's Python wrappers) as the innermost Python frame. */
static int matmul_frames(const snap_dec *d, int32_t st) {
    char path[TK_PATH_MAX];
    int n;
    const int32_t *fs = snap_stack(d, st, &n);
    for (int i = 0; i < n; i++) {
        if (!frame_path(d, fs[i], path, sizeof path) || !is_python_frame(path)) continue;
        return ends_with(path, "/torch/nn/modules/linear.py") || ends_with(path, "/torch/nn/functional.py") ||
               ends_with(path, "/torch/functional.py");
    }
    return n == 0;
}

void snap_ws_name(int ws, int phase, int pre, char *out, size_t n) {
    if (ws == WS_BESIDE)
        snprintf(out, n, "library: 1 MiB the same matmul allocated right after its cuBLAS workspace, never freed "
                         "(cuBLASLt's default workspace size)");
    else if (pre)
        snprintf(out, n, "library: cuBLAS workspace (held from before the recording to the end)");
    else if (phase == PH_BACKWARD)
        snprintf(out, n, "library: cuBLAS workspace (the autograd thread's handle, made in backward)");
    else
        snprintf(out, n, "library: cuBLAS workspace (the handle of the thread that ran the forward)");
}

/* Blocks never freed whose size is cuBLAS's workspace: allocated by a
 * matmul (or by the autograd thread, which records no frames), or held
 * from before the recording with such frames or none; and a 1 MiB block
 * never freed that the same call allocated right after one. */
static void read_workspaces(const snap_dec *d, const snap_replay *r, snap_frames *f) {
    int64_t last_alloc = -1;
    for (size_t i = 0; i < d->n_ev; i++) {
        const snap_ev *e = &d->ev[i];
        if (e->action != EV_ALLOC) continue;
        if (r->pair[i] < 0 && cublas_size(e->size) && matmul_frames(d, e->stack) &&
            (e->stack > 0 ? f->phase[i] == PH_FORWARD || f->phase[i] == PH_BACKWARD : f->phase[i] == PH_BACKWARD))
            f->ws[i] = WS_CUBLAS;
        else if (r->pair[i] < 0 && e->size == (int64_t)1 << 20 && last_alloc >= 0 && f->ws[last_alloc] == WS_CUBLAS &&
                 d->ev[last_alloc].stack == e->stack)
            f->ws[i] = WS_BESIDE;
        last_alloc = (int64_t)i;
    }
    for (int k = 0; k < r->n_pre; k++) {
        const snap_pre *p = &r->pre[k];
        int64_t req = p->blk >= 0 && d->blks[p->blk].requested ? d->blks[p->blk].requested : p->size;
        if (p->freed_at < 0 && cublas_size(req) && req == p->size && matmul_frames(d, p->stack)) f->pre_ws[k] = WS_CUBLAS;
    }
    for (int k = 0; k < r->n_pre; k++) {
        const snap_pre *p = &r->pre[k];
        if (f->pre_ws[k] || p->freed_at >= 0 || p->size != (int64_t)1 << 20 || p->stack <= 0) continue;
        for (int j = 0; j < r->n_pre && !f->pre_ws[k]; j++)
            if (f->pre_ws[j] == WS_CUBLAS && r->pre[j].stack == p->stack) f->pre_ws[k] = WS_BESIDE;
    }
}

/* ---- the owners of the blocks live at the end -------------------------------------------- */

typedef struct module_bytes { char name[48], file[160]; size_t bytes; } module_bytes;

static int add_owner(snap_dec *d, int *cap, const char *owner, size_t bytes, int64_t addr, int pool) {
    tk_snapshot *s = d->s;
    for (int i = 0; i < s->n_owners; i++)
        if (!strcmp(s->owners[i].owner, owner)) {
            tk_snap_owner *o = &s->owners[i];
            o->bytes += bytes;
            if (pool) o->pool_bytes += bytes;
            o->blocks++;
            if (bytes > o->largest) o->largest = bytes, o->largest_addr = addr;
            return 0;
        }
    if (s->n_owners == *cap) {
        int c = *cap ? *cap * 2 : 16;
        tk_snap_owner *o = tk_realloc(s->owners, (size_t)c * sizeof *o);
        if (!o) return snap_bad_nomem(d, "owners");
        s->owners = o;
        *cap = c;
    }
    tk_snap_owner *o = &s->owners[s->n_owners++];
    memset(o, 0, sizeof *o);
    snprintf(o->owner, sizeof o->owner, "%s", owner);
    o->bytes = bytes;
    o->blocks = 1;
    o->largest = bytes;
    o->largest_addr = addr;
    o->pool_bytes = pool ? bytes : 0;
    return 0;
}

static int cmp_owner(const void *a, const void *b) {
    const tk_snap_owner *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return strcmp(x->owner, y->owner);
}

static int read_owners(snap_dec *d, const snap_replay *r, snap_frames *f) {
    tk_snapshot *s = d->s;
    module_bytes mods[8];
    int n_mods = 0, cap = 0, rc = -1;
    snap_map alloc_of = {0}, pre_of = {0};
    int64_t v;
    for (size_t i = 0; i < d->n_ev; i++)
        if (d->ev[i].action == EV_ALLOC && r->pair[i] < 0 && snap_map_put(&alloc_of, d->ev[i].addr, (int64_t)i)) goto oom;
    for (int k = 0; k < r->n_pre; k++)
        if (r->pre[k].blk >= 0 && snap_map_put(&pre_of, r->pre[k].blk, k)) goto oom;
    for (int b = 0; b < d->n_blks; b++) {
        const snap_blk *k = &d->blks[b];
        if (k->state != BLK_LIVE) continue;
        char owner[192], mname[48], mfile[160];
        int64_t ev = snap_map_get(&alloc_of, k->addr, &v) ? v : -1, pk = snap_map_get(&pre_of, b, &v) ? v : -1;
        int ws = ev >= 0 ? f->ws[ev] : pk >= 0 ? f->pre_ws[pk] : WS_NONE;
        if (read_stack_info(d, f, k->stack)) goto oom;
        if (ws) snap_ws_name(ws, ev >= 0 ? f->phase[ev] : PH_NONE, ev < 0, owner, sizeof owner);
        else snprintf(owner, sizeof owner, "%s", ev >= 0 ? snap_event_owner(d, f, ev) : snap_owner(d, f, k->stack));
        int pool = is_engine_pool(d, k->stack);
        if (!s->trainer && is_trainer_stack(d, k->stack)) s->trainer = 1;
        if (add_owner(d, &cap, owner, (size_t)k->size, k->addr, pool)) goto out;
        if (pool) s->vllm_pool_bytes += (size_t)k->size, s->vllm_pool_blocks++;
        if (model_module_of(d, k->stack, mname, sizeof mname, mfile, sizeof mfile)) {
            int m = 0;
            while (m < n_mods && strcmp(mods[m].name, mname)) m++;
            if (m == n_mods && m < (int)(sizeof mods / sizeof *mods)) {
                snprintf(mods[m].name, sizeof mods[m].name, "%s", mname);
                snprintf(mods[m].file, sizeof mods[m].file, "%s", mfile);
                mods[m].bytes = 0;
                n_mods++;
            }
            if (m < n_mods) mods[m].bytes += (size_t)k->size;
        }
    }
    for (int m = 0; m < n_mods; m++)
        if (mods[m].bytes > s->model_module_bytes) {
            s->model_module_bytes = mods[m].bytes;
            snprintf(s->model_module, sizeof s->model_module, "%.47s", mods[m].name);
            snprintf(s->model_module_file, sizeof s->model_module_file, "%.159s", mods[m].file);
        }
    /* each owner's phase: when its largest block was allocated (the trace's last alloc there) */
    for (int o = 0; s->has_annotations && o < s->n_owners; o++)
        if (snap_map_get(&alloc_of, s->owners[o].largest_addr, &v))
            snap_phase_text(d, f, v, s->owners[o].phase, sizeof s->owners[o].phase);
    if (s->n_owners) qsort(s->owners, (size_t)s->n_owners, sizeof *s->owners, cmp_owner);
    rc = 0;
    goto out;
oom:
    snap_bad_nomem(d, "owners");
out:
    snap_map_clear(&alloc_of);
    snap_map_clear(&pre_of);
    return rc;
}

/* ---- the layer's entry ---------------------------------------------------------------------- */

int snap_read_frames(snap_dec *d, const snap_replay *r, snap_frames *f) {
    memset(f, 0, sizeof *f);
    size_t ns = (size_t)d->n_stacks, ne = d->n_ev ? d->n_ev : 1;
    f->owner = tk_malloc(ns * sizeof *f->owner);
    f->kind = tk_calloc(ns, 1);
    f->kind_text = tk_malloc(ns * sizeof *f->kind_text);
    f->uline = tk_calloc(ns, sizeof *f->uline);
    f->cat = tk_malloc(ns);
    f->phase = tk_calloc(ne, 1);
    f->ann = tk_malloc(ne * sizeof *f->ann);
    f->layer = tk_malloc(ne * sizeof *f->layer);
    f->step = tk_calloc(ne, sizeof *f->step);
    f->ws = tk_calloc(ne, 1);
    f->pre_ws = tk_calloc((size_t)(r->n_pre ? r->n_pre : 1), 1);
    if (!f->owner || !f->kind || !f->kind_text || !f->uline || !f->cat || !f->phase || !f->ann || !f->layer || !f->step || !f->ws ||
        !f->pre_ws)
        return snap_bad_nomem(d, "frames");
    for (size_t i = 0; i < ns; i++) f->owner[i] = -2, f->cat[i] = -1;
    d->s->by_txkernel = d->by_txkernel;
    if (read_phases(d, f) || read_layers(d, f)) return -1;
    read_workspaces(d, r, f);
    return read_owners(d, r, f);
}

void snap_frames_clear(snap_frames *f) {
    free(f->owner);
    free(f->kind);
    free(f->kind_text);
    free(f->uline);
    free(f->cat);
    free(f->phase);
    free(f->ann);
    free(f->layer);
    free(f->step);
    free(f->ws);
    free(f->pre_ws);
    memset(f, 0, sizeof *f);
}
