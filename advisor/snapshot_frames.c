/* snapshot_frames.c — what a stack of frames in a PyTorch snapshot shows
 * (see snapshot_internal.h): the owner of a block (the innermost line of
 * the user's code with the innermost named library inside it; native
 * frames never shown as code, a native-only stack named by what it shows),
 * the model module and the inference engine's pool it passes through, the
 * user's outermost line, and the phase the frames themselves show.
 *
 * Guarantees: frames are only read, never trusted for sizes; a Python frame
 * is a .py file or a notebook cell, everything else (C, C++, CPython, "??")
 * is native; Windows paths are read with '/' like POSIX ones.
 */
#include "snapshot_internal.h"

#include <stdio.h>
#include <string.h>

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

/* A filename with Windows separators read like a POSIX one (C:\a\b.py ->
 * C:/a/b.py), so one set of rules shortens both. */
static void posix_path(const char *f, char *out, size_t n) {
    size_t i = 0;
    for (; f[i] && i + 1 < n; i++) out[i] = f[i] == '\\' ? '/' : f[i];
    out[i] = 0;
}

/* Owners that name no code of the user's: native code only, no frames, a library. */
int snap_names_no_code(const char *owner) {
    return !strncmp(owner, "no Python frame", 15) || !strcmp(owner, SNAP_BEFORE_HISTORY) || !strncmp(owner, "library:", 8) ||
           !strncmp(owner, "backward (", 10);
}

/* The native frames of a block with no Python frame, named by what they
 * show: the autograd engine's worker thread runs backward; otherwise the
 * ATen operator that asked (at::_ops::NAME), else nothing known. */
static void native_owner(sv frames, char *out, size_t n) {
    char op[96] = "";
    if (!sv_is_list(frames) || !sv_len(frames)) {
        /* PyTorch records frames only while the history is on */
        snprintf(out, n, "%s", SNAP_BEFORE_HISTORY);
        return;
    }
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *file = sv_str(sv_get(f, "filename"));
        const char *fn = sv_str(sv_get(f, "name"));
        if ((fn && (strstr(fn, "torch::autograd::Engine") || strstr(fn, "torch::autograd::python::PythonEngine"))) ||
            (file && !strcmp(file, "engine.cpp"))) {
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
 * skipped, and a block with native frames only is named by them. */
int snap_owner_of(sv frames, char *out, size_t n) {
    char kind[96] = "", first_py[TK_PATH_MAX] = "", file[TK_PATH_MAX];
    int python = 0;
    int first_line = 0;
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *raw = sv_str(sv_get(f, "filename"));
        const char *fn = sv_str(sv_get(f, "name"));
        int64_t line = 0;
        /* txkernel's own snapshots name the owner and category in the frame */
        if (raw && !strcmp(raw, "txkernel") && fn) {
            snprintf(out, n, "%s", fn);
            return 1;
        }
        if (!raw || !is_python_frame(raw)) continue;
        posix_path(raw, file, sizeof file);
        sv_int(sv_get(f, "line"), &line);
        if (!python) {
            snprintf(first_py, sizeof first_py, "%s", file);
            first_line = (int)line;
        }
        python = 1;
        if (is_notebook_frame(file)) {
            snprintf(out, n, "cell, line %lld%s%s", (long long)line, *kind ? " · " : "", kind);
            return 0;
        }
        if (is_library_frame(file)) {
            const char *t = library_tail(file);
            if (!*kind && is_named_library(t)) snprintf(kind, sizeof kind, "%.95s", t);
            continue;
        }
        snprintf(out, n, "%.80s, line %lld (%.60s)%s%s", basename_of(file), (long long)line, fn ? fn : "?",
                 *kind ? " · " : "", kind);
        return 0;
    }
    if (*kind) snprintf(out, n, "library: %s", kind);
    else if (python) snprintf(out, n, "library: %s, line %d", library_tail(first_py), first_line);
    else native_owner(frames, out, n);
    return 0;
}

/* The model module a block's Python frames pass through, as the library
 * names its files: transformers/models/NAME/modeling_NAME.py,
 * vllm/model_executor/models/NAME.py. 1 with name and file set. */
int snap_model_module_of(sv frames, char *name, size_t nn, char *file, size_t nf) {
    char path[TK_PATH_MAX];
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        const char *raw = sv_str(sv_get(sv_at(frames, i), "filename"));
        if (!raw || !ends_with(raw, ".py")) continue;
        posix_path(raw, path, sizeof path);
        const char *k = strstr(path, "transformers/models/"), *e;
        if (k && (e = strchr(k + 20, '/')) && strstr(e, "/modeling_")) {
            snprintf(name, nn, "%.*s", (int)(e - k - 20), k + 20);
            snprintf(file, nf, "%s", k);
            return 1;
        }
        if ((k = strstr(path, "vllm/model_executor/models/"))) {
            const char *b = k + 27;
            if (!strchr(b, '/')) {
                snprintf(name, nn, "%.*s", (int)(strlen(b) - 3), b);
                snprintf(file, nf, "%s", k);
                return 1;
            }
        }
    }
    return 0;
}

/* A block an inference engine preallocated as its KV-cache pool: vLLM's
 * cache engine (v0) or its model runner's initialize_kv_cache (v1). */
int snap_is_engine_pool(sv frames) {
    char path[TK_PATH_MAX];
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *raw = sv_str(sv_get(f, "filename")), *fn = sv_str(sv_get(f, "name"));
        if (!raw || !ends_with(raw, ".py")) continue;
        posix_path(raw, path, sizeof path);
        if (strstr(path, "vllm/") && (strstr(path, "/cache_engine.py") || (fn && strstr(fn, "kv_cache")))) return 1;
    }
    return 0;
}

/* The user's outermost frame (a line of their code that is not a library's)
 * as one number: file and line hashed. 0 when the stack has none. */
int snap_outer_user_line(sv frames, uint64_t *key) {
    int found = 0;
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *raw = sv_str(sv_get(f, "filename"));
        char path[TK_PATH_MAX];
        int64_t line = 0;
        if (!raw || !is_python_frame(raw)) continue;
        posix_path(raw, path, sizeof path);
        if (is_library_frame(path) && !is_notebook_frame(path)) continue;
        sv_int(sv_get(f, "line"), &line);
        uint64_t h = UINT64_C(1469598103934665603);
        for (const char *p = path; *p; p++) h = (h ^ (unsigned char)*p) * UINT64_C(1099511628211);
        *key = h ^ (uint64_t)line * UINT64_C(0x9E3779B97F4A7C15);
        found = 1;
    }
    return found;
}

/* The phase an allocation's own frames show: the autograd engine or
 * torch.autograd -> backward; torch/optim -> Optimizer.step; the
 * DataLoader; a module's forward (the innermost forward frame). */
int snap_phase_from_frames(sv frames, char *out, size_t n) {
    char path[TK_PATH_MAX], fwd[160] = "";
    for (size_t i = 0; sv_is_list(frames) && i < sv_len(frames); i++) {
        sv f = sv_at(frames, i);
        const char *raw = sv_str(sv_get(f, "filename")), *fn = sv_str(sv_get(f, "name"));
        if (fn && (strstr(fn, "torch::autograd::Engine") || strstr(fn, "torch::autograd::python::PythonEngine"))) {
            snprintf(out, n, "backward");
            return 1;
        }
        if (!raw || !is_python_frame(raw)) continue;
        posix_path(raw, path, sizeof path);
        if (strstr(path, "/torch/autograd/")) {
            snprintf(out, n, "backward");
            return 1;
        }
        if (strstr(path, "/torch/optim/")) {
            snprintf(out, n, "Optimizer.step");
            return 1;
        }
        if (strstr(path, "/torch/utils/data/")) {
            snprintf(out, n, "DataLoader");
            return 1;
        }
        if (!fwd[0] && fn && !strcmp(fn, "forward") && !strstr(path, "/torch/nn/modules/module.py")) {
            int64_t line = 0;
            sv_int(sv_get(f, "line"), &line);
            snprintf(fwd, sizeof fwd, "forward (%.100s, line %lld)", basename_of(path), (long long)line);
        }
    }
    if (!fwd[0]) return 0;
    snprintf(out, n, "%.63s", fwd);
    return 1;
}
