/* oom_message.c — reads a pasted out-of-memory message and fills the facts
 * record from it (read_facts: its figures, its processes, the plan of the
 * user's config on its card when one was given), which the advisor's one
 * table of diagnoses (diagnoses.c) says why from. The diagnosis opens with the seed user's question,
 * why the same code fits on some runs and not others, answered from the
 * message's figures and each card's one usable capacity
 * (tk_gpu_profile_budget); fix code carries only numbers the user gave (a
 * config's, set by the caller) or named placeholders; txkernel's plans are
 * labelled as such beside PyTorch's figures. A "no kernel image" error (or
 * torch's "not compatible" warning) is read too, as not an OOM.
 *
 * The forms PyTorch has printed (c10/cuda/CUDACachingAllocator.cpp, earlier
 * aten/src/THC/THCCachingAllocator.cpp):
 *   1.0-1.3  "Tried to allocate R (GPU n; T total capacity; A already
 *            allocated; F free; C cached)". "cached" there is memory the
 *            allocator holds but no tensor uses, i.e. reserved - allocated
 *            (pytorch/pytorch#13751, 2018-11, which introduced the message:
 *            by the time it prints, the retry has returned every wholly free
 *            segment, so C is free space inside partly used segments).
 *   1.4-2.0  the same with "X reserved in total by PyTorch)" in place of
 *            "cached": reserved = allocated + cached-but-free. 1.10+ append a
 *            max_split_size_mb hint; a per-process memory fraction adds
 *            "L allowed;".
 *   2.1+     "Tried to allocate R. GPU n has a total capacity of T of which F
 *            is free. [Process P has M memory in use.] [Including non-PyTorch
 *            memory, this process has M memory in use.] Of the allocated
 *            memory A is allocated by PyTorch, and U is reserved by PyTorch but
 *            unallocated." (2.1-2.2 spelled it "capacty").
 * TensorFlow's BFC allocator: "OOM when allocating tensor with shape[d0,d1]
 * and type T on /job:.../device:GPU:n by allocator GPU_n_bfc".
 * Sizes print as "N bytes" up to 1024 and then with two decimals in KiB, MiB,
 * GiB; a figure's bytes are the printed number times its unit, computed in
 * integers (hundredths times the unit, rounded), so "7.43 GiB" is
 * 7977901752 bytes on every machine.
 *
 * Depends on diagnoses.c and gpu/profile.c alone (and jansson), so the fuzz
 * target builds it without the planner. Guarantees: reads at most len bytes, never past them; no heap in the
 * parser; any input (empty, binary, 1 MB) returns 0 or -1. A figure that
 * cannot be true (more in use than the card has, more than 64 bits) is
 * flagged unreliable and no diagnosis uses it.
 */
#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tk_oom_message.h"
#include "tk_facts.h"
#include "tk_fix_code.h"

#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)
#define WINDOW 4096 /* a message's figures sit within this many bytes of its start */

static const char *const FIG_NAMES[TK_OOMFIG_COUNT] = {
    "requested", "total", "allocated", "reserved", "reserved_unallocated", "free", "process_in_use",
};

const char *tk_oomfig_name(tk_oomfig f) {
    return (unsigned)f < TK_OOMFIG_COUNT ? FIG_NAMES[f] : "?";
}

/* ---- scanning a bounded buffer ------------------------------------------------ */

/* Last occurrence of needle in [s, s+n), or NULL. */
static const char *find_last(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k == 0 || n < k) return NULL;
    for (size_t i = n - k + 1; i-- > 0;)
        if (s[i] == needle[0] && memcmp(s + i, needle, k) == 0) return s + i;
    return NULL;
}

/* First occurrence of needle in [s, end), or NULL. */
static const char *find_in(const char *s, const char *end, const char *needle) {
    size_t k = strlen(needle);
    for (; s && s + k <= end; s++)
        if (*s == needle[0] && memcmp(s, needle, k) == 0) return s;
    return NULL;
}

static int starts(const char *s, const char *end, const char *word) {
    size_t k = strlen(word);
    return (size_t)(end - s) >= k && memcmp(s, word, k) == 0;
}

/* A small decimal at s (a GPU index), bounded by end; -1 if none. */
static int read_index(const char *s, const char *end) {
    int v = 0, n = 0;
    while (s < end && isdigit((unsigned char)*s) && v < 100000) v = v * 10 + (*s++ - '0'), n++;
    return n ? v : -1;
}

static const char *skip_spaces(const char *s, const char *end) {
    while (s < end && (*s == ' ' || *s == '\t')) s++;
    return s;
}

/* A size as PyTorch prints it at s: "24.00 MiB", "0 bytes", "1024.00 KiB".
 * On success fills f (bytes, text) and returns the end; NULL if s holds none. */
static const char *read_size(const char *s, const char *end, tk_oommsg_figure *f) {
    const char *p = skip_spaces(s, end), *num = p;
    unsigned __int128 whole = 0;
    int digits = 0, big = 0;
    while (p < end && isdigit((unsigned char)*p)) {
        whole = whole * 10 + (unsigned)(*p++ - '0');
        if (whole > ((unsigned __int128)1 << 100)) big = 1, whole = (unsigned __int128)1 << 100;
        digits++;
    }
    if (!digits) return NULL;
    unsigned frac = 0, fdig = 0;
    if (p + 1 < end && *p == '.' && isdigit((unsigned char)p[1])) {
        p++;
        while (p < end && isdigit((unsigned char)*p)) {
            if (fdig < 2) frac = frac * 10 + (unsigned)(*p - '0'), fdig++;
            p++;
        }
    }
    while (fdig < 2) frac *= 10, fdig++;
    const char *numend = p;
    p = skip_spaces(p, end);
    static const struct { const char *u; uint64_t m; } units[] = {
        {"bytes", 1}, {"KiB", 1024}, {"MiB", MIB}, {"GiB", GIB}, {"TiB", GIB << 10}, {"B", 1},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (!starts(p, end, units[i].u)) continue;
        const char *ue = p + strlen(units[i].u);
        if (ue < end && isalpha((unsigned char)*ue)) continue;
        unsigned __int128 hundredths = whole * 100 + frac;
        unsigned __int128 b = (hundredths * units[i].m + 50) / 100;
        memset(f, 0, sizeof *f);
        f->present = 1;
        if (big || b > (unsigned __int128)INT64_MAX) {
            f->overflow = 1;
            f->bytes = UINT64_MAX;
        } else {
            f->bytes = (uint64_t)b;
        }
        size_t tl = (size_t)(numend - num);
        if (tl > 24) tl = 24;
        snprintf(f->text, sizeof f->text, "%.*s %s", (int)tl, num, units[i].u);
        return ue;
    }
    return NULL;
}

static void derive(tk_oommsg_figure *f, uint64_t bytes) {
    memset(f, 0, sizeof *f);
    f->present = f->derived = 1;
    f->bytes = bytes;
    tk_format_bytes((size_t)bytes, f->text, sizeof f->text);
}

/* ---- PyTorch -------------------------------------------------------------------- */

/* "(GPU n; T total capacity; A already allocated; F free; [L allowed;] X reserved
 * in total by PyTorch)" or "...; C cached)": items between ';' each a size and a
 * label. */
static void parse_torch_paren(const char *p, const char *end, tk_oom_message *m) {
    const char *close = find_in(p, end, ")");
    if (close) end = close;
    p = skip_spaces(p, end);
    if (starts(p, end, "GPU ")) {
        m->gpu_index = read_index(p + 4, end);
        const char *semi = find_in(p, end, ";");
        p = semi ? semi + 1 : end;
    }
    m->format = TK_OOMMSG_TORCH_RESERVED;
    int cached = 0;
    tk_oommsg_figure cached_fig = {0};
    while (p < end) {
        const char *semi = find_in(p, end, ";");
        const char *ie = semi ? semi : end;
        tk_oommsg_figure f;
        const char *after = read_size(p, ie, &f);
        if (after) {
            const char *label = skip_spaces(after, ie);
            if (starts(label, ie, "total capacity")) m->fig[TK_OOMFIG_TOTAL] = f;
            else if (starts(label, ie, "already allocated")) m->fig[TK_OOMFIG_ALLOCATED] = f;
            else if (starts(label, ie, "free")) m->fig[TK_OOMFIG_FREE] = f;
            else if (starts(label, ie, "reserved in total")) m->fig[TK_OOMFIG_RESERVED] = f;
            else if (starts(label, ie, "cached")) cached = 1, cached_fig = f;
        }
        p = semi ? semi + 1 : end;
    }
    if (cached) {
        m->format = TK_OOMMSG_TORCH_CACHED;
        m->fig[TK_OOMFIG_RESERVED_UNALLOCATED] = cached_fig;
    }
}

/* The 2.1+ sentences after "Tried to allocate R." */
static void parse_torch_21(const char *p, const char *end, tk_oom_message *m) {
    m->format = TK_OOMMSG_TORCH_21;
    const char *g = find_in(p, end, "GPU ");
    if (g) m->gpu_index = read_index(g + 4, end);
    const char *t = find_in(p, end, "total capacity of ");
    if (!t) {
        t = find_in(p, end, "total capacty of ");
        if (t) m->spelled_capacty = 1;
    }
    if (t) {
        const char *e = read_size(t + (m->spelled_capacty ? 17 : 18), end, &m->fig[TK_OOMFIG_TOTAL]);
        const char *w = e ? find_in(e, end, "of which ") : NULL;
        if (w) read_size(w + 9, end, &m->fig[TK_OOMFIG_FREE]);
    }
    /* "Process P has M memory in use." per process NVML lists; "this process" is ours */
    const char *q = p;
    while ((q = find_in(q, end, "Process ")) != NULL) {
        const char *r = q + 8;
        int pid = 0;
        while (r < end && isdigit((unsigned char)*r) && pid < 100000000) pid = pid * 10 + (*r++ - '0');
        if (r > q + 8 && starts(r, end, " has ")) {
            tk_oommsg_figure f;
            if (read_size(r + 5, end, &f)) {
                if (m->n_processes < TK_OOMMSG_MAX_PROCS) m->proc[m->n_processes] = (tk_oommsg_process){pid, f};
                if (!m->fig[TK_OOMFIG_PROCESS_IN_USE].present) m->fig[TK_OOMFIG_PROCESS_IN_USE] = f;
                m->n_processes++;
            }
        }
        q += 8;
    }
    const char *tp = find_in(p, end, "this process has ");
    if (tp) read_size(tp + 17, end, &m->fig[TK_OOMFIG_PROCESS_IN_USE]);
    const char *a = find_in(p, end, "Of the allocated memory ");
    if (a) {
        const char *e = read_size(a + 24, end, &m->fig[TK_OOMFIG_ALLOCATED]);
        const char *u = e ? find_in(e, end, ", and ") : NULL;
        if (u) read_size(u + 6, end, &m->fig[TK_OOMFIG_RESERVED_UNALLOCATED]);
    }
}

/* ---- TensorFlow ----------------------------------------------------------------- */

static int tf_dtype_bytes(const char *t) {
    static const struct { const char *n; int b; } types[] = {
        {"float", 4}, {"half", 2}, {"bfloat16", 2}, {"double", 8}, {"int32", 4}, {"int64", 8},
        {"int16", 2}, {"int8", 1}, {"uint8", 1}, {"bool", 1}, {"complex64", 8}, {"complex128", 16},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(t, types[i].n)) return types[i].b;
    return 0;
}

/* A word of ASCII letters, digits and '_' at p (at most n - 1 bytes) into out. */
static void copy_word(char *out, size_t n, const char *p, const char *end) {
    size_t k = 0;
    while (p + k < end && (isalnum((unsigned char)p[k]) || p[k] == '_') && k < n - 1) k++;
    memcpy(out, p, k);
    out[k] = 0;
}

/* The message at p: "shape[d0,d1] and type T on ... by allocator A" in
 * English; in a translation (`translated`), the bracketed shape after p
 * ("在分配形狀為 [786432,1604] 的張量時出現 OOM"), the type after "type" or
 * 類型為/类型为 when given, and the allocator as its name (GPU_0_bfc). */
static int parse_tf_at(const char *p, const char *end, tk_oom_message *m, int translated) {
    const char *s = NULL;
    if (!translated) {
        s = find_in(p, end, "shape[");
        if (s) s += 6;
    } else {
        for (const char *q = p; q < end && !s; q++)
            if (*q == '[' && q + 1 < end && isdigit((unsigned char)q[1])) s = q + 1;
    }
    if (!s) return -1;
    m->rank = 0;
    unsigned __int128 elems = 1;
    int overflow = 0;
    while (s < end && *s != ']') {
        s = skip_spaces(s, end);
        int64_t d = 0;
        int nd = 0;
        while (s < end && isdigit((unsigned char)*s)) {
            if (d > INT64_MAX / 10 - 10) overflow = 1;
            else d = d * 10 + (*s - '0');
            s++;
            nd++;
        }
        if (!nd) return -1;
        if (m->rank < TK_OOMMSG_MAX_DIMS) m->shape[m->rank] = d;
        m->rank++;
        elems *= (unsigned __int128)d;
        if (elems > ((unsigned __int128)1 << 80)) overflow = 1, elems = (unsigned __int128)1 << 80;
        s = skip_spaces(s, end);
        if (s < end && *s == ',') s++;
    }
    if (s >= end || m->rank == 0 || m->rank > TK_OOMMSG_MAX_DIMS) return -1;
    m->format = TK_OOMMSG_TF;
    const char *ty = find_in(s, end, "and type ");
    if (ty) ty += 9;
    else if (translated && (ty = find_in(s, end, "\xe9\xa1\x9e\xe5\x9e\x8b\xe7\x82\xba")) != NULL) ty += 9; /* 類型為 */
    else if (translated && (ty = find_in(s, end, "\xe7\xb1\xbb\xe5\x9e\x8b\xe4\xb8\xba")) != NULL) ty += 9; /* 类型为 */
    else if (translated && (ty = find_in(s, end, "type ")) != NULL) ty += 5;
    if (ty) {
        ty = skip_spaces(ty, end);
        copy_word(m->dtype, sizeof m->dtype, ty, end);
        m->dtype_bytes = tf_dtype_bytes(m->dtype);
    } else if (translated) {
        /* no type in the words: TensorFlow's default, said as assumed */
        snprintf(m->dtype, sizeof m->dtype, "float");
        m->dtype_bytes = 4;
        m->dtype_assumed = 1;
    }
    const char *dev = find_in(s, end, "device:GPU:");
    if (dev) m->gpu_index = read_index(dev + 11, end);
    const char *al = find_in(s, end, "by allocator ");
    if (al) {
        al += 13;
        size_t k = 0;
        while (al + k < end && !isspace((unsigned char)al[k]) && k < sizeof m->allocator - 1) k++;
        memcpy(m->allocator, al, k);
        m->allocator[k] = 0;
    } else if (translated && (al = find_in(s, end, "_bfc")) != NULL) {
        /* the allocator's own name, whatever the words around it */
        const char *b = al;
        while (b > s && (isalnum((unsigned char)b[-1]) || b[-1] == '_')) b--;
        copy_word(m->allocator, sizeof m->allocator, b, end);
        if (m->gpu_index < 0 && starts(b, end, "GPU_")) m->gpu_index = read_index(b + 4, end);
    }
    const char *nd = find_in(s, end, "{{node ");
    if (!nd) nd = find_in(s, end, "[[Node: ");
    if (nd) {
        nd += nd[0] == '{' ? 7 : 8;
        size_t k = 0;
        while (nd + k < end && !isspace((unsigned char)nd[k]) && nd[k] != '}' && k < sizeof m->node - 1) k++;
        memcpy(m->node, nd, k);
        m->node[k] = 0;
    }
    if (m->dtype_bytes) {
        unsigned __int128 b = elems * (unsigned)m->dtype_bytes;
        tk_oommsg_figure *f = &m->fig[TK_OOMFIG_REQUESTED];
        if (overflow || b > (unsigned __int128)INT64_MAX) {
            memset(f, 0, sizeof *f);
            f->present = f->derived = f->overflow = 1;
            f->bytes = UINT64_MAX;
            snprintf(f->text, sizeof f->text, "more than 2^63 bytes");
        } else {
            derive(f, (uint64_t)b);
        }
    }
    return 0;
}

/* ---- the card --------------------------------------------------------------------- */

static void name_card(tk_oom_message *m) {
    const tk_oommsg_figure *t = &m->fig[TK_OOMFIG_TOTAL];
    if (!t->present || t->unreliable) return;
    const tk_gpu_profile *hit[8];
    int n = 0;
    /* a driver change moves the total by a few hundredths of a GiB */
    uint64_t tol = 3 * GIB / 100;
    for (int i = 0; tk_gpu_profile_at(i) && n < 8; i++) {
        const tk_gpu_profile *p = tk_gpu_profile_at(i);
        uint64_t cap = p->capacity;
        if (p->gpus > 1) continue; /* a message is one GPU's: t4x2 is two t4s */
        if ((t->bytes > cap ? t->bytes - cap : cap - t->bytes) <= tol) hit[n++] = p;
    }
    if (n == 1) {
        m->card = hit[0];
        snprintf(m->card_text, sizeof m->card_text, "%s", hit[0]->name);
        return;
    }
    /* the marketing size just above what the driver leaves usable */
    static const int classes[] = {1, 2, 3, 4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 80, 94, 96, 141, 192};
    int cls = 0;
    for (size_t i = 0; i < sizeof classes / sizeof classes[0] && !cls; i++)
        if (t->bytes <= (uint64_t)classes[i] * GIB) cls = classes[i];
    if (!cls) return;
    int w = snprintf(m->card_text, sizeof m->card_text, "a%s %d GB-class card", cls == 8 || cls == 11 || cls == 80 ? "n" : "",
                     cls);
    for (int i = 0; i < n && w > 0 && (size_t)w < sizeof m->card_text; i++)
        w += snprintf(m->card_text + w, sizeof m->card_text - (size_t)w, "%s%s%s", i ? (i + 1 == n ? " or " : ", ") : " (",
                      hit[i]->name, i + 1 == n ? ")" : "");
}

/* ---- not an OOM: the installed torch has no kernels for the card ------------------------ */

/* The line holding s, from its start to s: [*b, s). */
static const char *line_start(const char *text, const char *s) {
    while (s > text && s[-1] != '\n' && s[-1] != '\r') s--;
    return s;
}

static void copy_trimmed(char *out, size_t n, const char *b, const char *e) {
    while (b < e && isspace((unsigned char)*b)) b++;
    while (e > b && isspace((unsigned char)e[-1])) e--;
    size_t k = (size_t)(e - b) < n - 1 ? (size_t)(e - b) : n - 1;
    for (size_t i = 0; i < k; i++) out[i] = isprint((unsigned char)b[i]) ? b[i] : '?';
    out[k] = 0;
}

/* The profile's words in a device name: "p100" in "Tesla P100-PCIE-16GB",
 * "rtx-pro-6000" in "NVIDIA RTX PRO 6000 Blackwell ..." ('-' matches a space
 * or '-'); a trailing memory size ("-16", "-80") is left out, as device
 * names spell it differently. Case-insensitive, on word boundaries. */
static int names_card(const char *dev, const char *name) {
    size_t k = strlen(name);
    const char *dash = strrchr(name, '-');
    if (dash && dash[1] && strspn(dash + 1, "0123456789") == strlen(dash + 1)) k = (size_t)(dash - name);
    for (const char *q = dev; *q; q++) {
        if (q > dev && isalnum((unsigned char)q[-1])) continue;
        size_t i = 0;
        for (; i < k && q[i]; i++) {
            if (name[i] == '-' ? (q[i] != ' ' && q[i] != '-') : tolower((unsigned char)q[i]) != name[i]) break;
        }
        if (i == k && !isalnum((unsigned char)q[k])) return 1;
    }
    return 0;
}

/* The one card (A100-40 and -80 count as one) the device name names, or NULL. */
static const tk_gpu_profile *card_of_device(const char *dev) {
    const tk_gpu_profile *hit = NULL;
    int n = 0;
    for (int i = 0; tk_gpu_profile_at(i); i++) {
        const tk_gpu_profile *p = tk_gpu_profile_at(i);
        if (p->gpus > 1 || !names_card(dev, p->name)) continue;
        if (!hit || strncmp(hit->name, p->name, 4)) n++;
        if (!hit) hit = p;
    }
    return n == 1 ? hit : NULL;
}

/* "CUDA error: no kernel image is available for execution on the device"
 * (cudaErrorNoKernelImageForDevice), and the warning torch prints when the
 * card is first used: "Tesla P100-PCIE-16GB with CUDA capability sm_60 is not
 * compatible with the current PyTorch installation. The current PyTorch
 * install supports CUDA capabilities sm_70 ... sm_120." */
static int parse_no_kernel(const char *text, size_t len, tk_oom_message *m) {
    if (!text) return -1;
    const char *end = text + len;
    const char *err = find_last(text, len, "no kernel image is available for execution on the device");
    const char *warn = find_last(text, len, " is not compatible with the current PyTorch installation");
    if (!err && !warn) return -1;
    m->format = TK_OOMMSG_NO_KERNEL_IMAGE;
    if (warn) {
        const char *cap = NULL;
        for (const char *q = line_start(text, warn); q && q < warn;) {
            const char *f = find_in(q, warn, " with CUDA capability ");
            if (!f) break;
            cap = f;
            q = f + 1;
        }
        if (cap) {
            copy_trimmed(m->device_name, sizeof m->device_name, line_start(text, cap), cap);
            copy_trimmed(m->device_sm, sizeof m->device_sm, cap + 22, warn);
        }
        const char *sup = find_in(warn, end, "supports CUDA capabilities ");
        if (sup) {
            sup += 27;
            const char *e = sup;
            while (e < end && *e != '.' && *e != '\n' && *e != '\r') e++;
            copy_trimmed(m->supported_sm, sizeof m->supported_sm, sup, e);
        }
    }
    if (!m->device_name[0]) {
        /* "Found GPU0 Tesla P100-PCIE-16GB which is of cuda capability 6.0." */
        const char *f = find_last(text, len, "Found GPU");
        const char *w = f ? find_in(f, end, " which is of cuda capability") : NULL;
        if (w) {
            const char *b = f + 9;
            while (b < w && isdigit((unsigned char)*b)) b++;
            copy_trimmed(m->device_name, sizeof m->device_name, b, w);
        }
    }
    m->card = m->device_name[0] ? card_of_device(m->device_name) : NULL;
    if (m->card) snprintf(m->card_text, sizeof m->card_text, "%s", m->card->name);
    else if (m->device_name[0]) snprintf(m->card_text, sizeof m->card_text, "%s", m->device_name);
    return 0;
}

/* ---- impossible figures and derived ones -------------------------------------------- */

static void check_and_derive(tk_oom_message *m) {
    tk_oommsg_figure *f = m->fig;
    for (int i = 0; i < TK_OOMFIG_COUNT; i++)
        if (f[i].present && f[i].overflow) f[i].unreliable = 1;
    if (f[TK_OOMFIG_TOTAL].present && f[TK_OOMFIG_TOTAL].bytes == 0) f[TK_OOMFIG_TOTAL].unreliable = 1;
    if (f[TK_OOMFIG_TOTAL].present && !f[TK_OOMFIG_TOTAL].unreliable) {
        /* two-decimal rounding of each figure: allow 1% + 16 MiB */
        uint64_t total = f[TK_OOMFIG_TOTAL].bytes, lim = total + total / 100 + 16 * MIB;
        for (int i = TK_OOMFIG_ALLOCATED; i < TK_OOMFIG_COUNT; i++)
            if (f[i].present && f[i].bytes > lim) f[i].unreliable = 1;
    }
    tk_oommsg_figure *a = &f[TK_OOMFIG_ALLOCATED], *r = &f[TK_OOMFIG_RESERVED], *u = &f[TK_OOMFIG_RESERVED_UNALLOCATED];
    int ok_a = a->present && !a->unreliable, ok_r = r->present && !r->unreliable, ok_u = u->present && !u->unreliable;
    if (ok_r && ok_a && !u->present) {
        if (r->bytes >= a->bytes) derive(u, r->bytes - a->bytes);
        else r->unreliable = 1; /* the allocator never holds less than it hands out */
    } else if (ok_a && ok_u && !r->present) {
        derive(r, a->bytes + u->bytes);
    }
    const tk_oommsg_figure *t = &f[TK_OOMFIG_TOTAL], *fr = &f[TK_OOMFIG_FREE];
    if (t->present && !t->unreliable && r->present && !r->unreliable && fr->present && !fr->unreliable &&
        t->bytes >= r->bytes + fr->bytes) {
        m->have_outside = 1;
        m->outside = t->bytes - r->bytes - fr->bytes;
    }
}

/* ---- what the rest of the text shows: GPUs, Trainer, platform ----------------------- */

/* "in replica N on device D": DataParallel re-raises a replica's error as
 * "Caught OutOfMemoryError in replica 1 on device 1." (torch 2.x) or
 * "Caught RuntimeError in replica ..." (1.x, where an OOM was a RuntimeError).
 * DDP: each rank is its own process; torch 2.4+ prefixes a rank's traceback
 * with "[rankN]:", torchrun's agent names the failed "local_rank: N", and the
 * frames are torch/nn/parallel/distributed.py's. */
static void read_parallel(const char *text, size_t len, tk_oom_message *m) {
    const char *end = text + len;
    m->replica = m->replica_device = m->ddp_rank = -1;
    const char *c = find_last(text, len, " in replica ");
    if (c && find_last(text, (size_t)(c - text), "Caught ") && c - find_last(text, (size_t)(c - text), "Caught ") < 40) {
        m->parallel = TK_OOMMSG_DATAPARALLEL;
        m->replica = read_index(c + 12, end);
        const char *d = find_in(c, c + 40 < end ? c + 40 : end, " on device ");
        if (d) m->replica_device = read_index(d + 11, end);
        return;
    }
    /* the [rankN]: nearest before the OOM line, else the last one */
    const char *oom = find_last(text, len, "Tried to allocate ");
    const char *r = find_last(text, oom ? (size_t)(oom - text) : len, "[rank");
    if (!r) r = find_last(text, len, "[rank");
    if (r) {
        int k = read_index(r + 5, end);
        if (k >= 0 && find_in(r + 5, r + 12 < end ? r + 12 : end, "]:")) {
            m->parallel = TK_OOMMSG_DDP;
            m->ddp_rank = k;
            return;
        }
    }
    const char *lr = find_last(text, len, "local_rank: ");
    if (lr || find_last(text, len, "torch/nn/parallel/distributed.py") || find_last(text, len, "torch.distributed.elastic")) {
        m->parallel = TK_OOMMSG_DDP;
        if (lr) m->ddp_rank = read_index(lr + 12, end);
    }
}

static void read_context(const char *text, size_t len, tk_oom_message *m) {
    read_parallel(text, len, m);
    m->trainer = find_last(text, len, "Trainer.train") || find_last(text, len, "trainer.train(") ||
                 find_last(text, len, "transformers/trainer.py") || find_last(text, len, "_inner_training_loop");
    /* a notebook's own folders; Kaggle's image is built on Colab's, so the
     * library paths (/usr/local/lib/python3.x/dist-packages) are the same */
    int kaggle = find_last(text, len, "/kaggle/") != NULL, colab = find_last(text, len, "/content/") != NULL;
    if (kaggle != colab) {
        snprintf(m->platform, sizeof m->platform, "%s", kaggle ? "kaggle" : "colab");
        m->platform_from_path = 1;
    }
}

int tk_oom_message_parse(const char *text, size_t len, tk_oom_message *m) {
    if (!m) return -1;
    memset(m, 0, sizeof *m);
    m->gpu_index = -1;
    if (!text || !len) return -1;
    const char *torch = find_last(text, len, "Tried to allocate ");
    const char *tf = find_last(text, len, "OOM when allocating tensor");
    const char *end_all = text + len;
    /* TensorFlow's message in a translation: its error's name, then a
     * bracketed shape and "OOM" in the words that follow */
    int translated = 0;
    const char *rx = tf ? NULL : find_last(text, len, "ResourceExhaustedError");
    if (rx && (!torch || rx > torch)) {
        const char *w = (size_t)(end_all - rx) > WINDOW ? rx + WINDOW : end_all;
        const char *eol = find_in(rx, w, "\n");
        if (find_in(rx, eol ? eol : w, "OOM")) tf = rx, translated = 1;
    }
    if (torch && (!tf || torch > tf)) {
        const char *p = torch + 18, *end = (size_t)(end_all - p) > WINDOW ? p + WINDOW : end_all;
        const char *e = read_size(p, end, &m->fig[TK_OOMFIG_REQUESTED]);
        if (e) {
            const char *q = skip_spaces(e, end);
            if (q < end && *q == '(') parse_torch_paren(q + 1, end, m);
            else parse_torch_21(q, end, m);
        }
    } else if (tf) {
        const char *end = (size_t)(end_all - tf) > WINDOW ? tf + WINDOW : end_all;
        if (parse_tf_at(tf, end, m, translated)) m->format = TK_OOMMSG_NONE;
        m->translated = translated;
    }
    int any = 0;
    for (int i = 0; i < TK_OOMFIG_COUNT; i++) any |= m->fig[i].present;
    if (m->format == TK_OOMMSG_NONE || (!any && m->format != TK_OOMMSG_TF)) {
        memset(m, 0, sizeof *m);
        m->gpu_index = -1;
        if (parse_no_kernel(text, len, m)) return -1;
        read_context(text, len, m);
        return 0;
    }
    check_and_derive(m);
    name_card(m);
    read_context(text, len, m);
    return 0;
}

/* ---- diagnosis ---------------------------------------------------------------------- */

static const tk_oommsg_figure *ok_fig(const tk_oom_message *m, tk_oomfig i) {
    const tk_oommsg_figure *f = &m->fig[i];
    return f->present && !f->unreliable ? f : NULL;
}

static char *fmt(uint64_t b, char *buf, size_t n) {
    return tk_format_bytes((size_t)b, buf, n);
}

/* A Dense kernel [in, out] whose `in` is a flattened sequence: seq x hidden x
 * towers for BERT-like encoders. 0 if the shape does not read that way. */
static int flattened_dense(const tk_oom_message *m, int *seq, int *hidden, int *towers) {
    if (m->rank != 2 || m->shape[0] < 4096) return 0;
    static const int hs[] = {768, 1024, 512, 384, 256, 128, 312};
    static const int ls[] = {512, 384, 256, 128, 64};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        for (size_t j = 0; j < sizeof ls / sizeof ls[0]; j++) {
            int64_t per = (int64_t)hs[i] * ls[j];
            if (m->shape[0] % per == 0 && m->shape[0] / per >= 1 && m->shape[0] / per <= 4) {
                *hidden = hs[i], *seq = ls[j], *towers = (int)(m->shape[0] / per);
                return 1;
            }
        }
    return 0;
}

/* ---- the facts and the one ordered table of diagnoses ------------------------------- */


const char *tk_oom_message_platform(const tk_oom_message *m) {
    const char *own = tk_gpu_platform_of(m->card);
    if (own && !strcmp(own, "colab") && m->card && !tk_platform_has("colab", m->card)) own = "colab-2020";
    return tk_platform_era(m->platform[0] ? m->platform : own ? own : "colab", m->card);
}

/* Which listed process is the user's own: the one whose bytes hold
 * PyTorch's reserved plus the card's context (in Colab's and Kaggle's
 * containers the user's kernel appears as "Process P has ..."). Another
 * process is one whose bytes cannot contain the reserved memory, or, with
 * several listed, any but the one that matches. */
static void read_processes(const tk_oom_message *m, tk_facts *f) {
    f->own = f->other = -1;
    int n = m->n_processes < TK_OOMMSG_MAX_PROCS ? m->n_processes : TK_OOMMSG_MAX_PROCS;
    uint64_t lim = f->T ? f->T->bytes + f->T->bytes / 100 + 16 * MIB : UINT64_MAX;
    uint64_t want = (f->V ? f->V->bytes : 0) + f->ctx, best = UINT64_MAX;
    for (int i = 0; i < n; i++) {
        const tk_oommsg_figure *b = &m->proc[i].mem;
        if (b->overflow || b->bytes > lim || !f->V || b->bytes < f->V->bytes) continue;
        uint64_t d = b->bytes > want ? b->bytes - want : want - b->bytes;
        if (d < best) best = d, f->own = i;
    }
    for (int i = 0; i < n; i++) {
        const tk_oommsg_figure *b = &m->proc[i].mem;
        if (i == f->own || b->overflow || b->bytes > lim) continue;
        if (f->other < 0 || b->bytes > m->proc[f->other].mem.bytes) f->other = i;
    }
}

static void read_facts(const tk_oom_message *m, const tk_card_fit *cards, int n, const char *platform, tk_facts *f) {
    memset(f, 0, sizeof *f);
    f->msg = m;
    f->R = ok_fig(m, TK_OOMFIG_REQUESTED), f->T = ok_fig(m, TK_OOMFIG_TOTAL), f->A = ok_fig(m, TK_OOMFIG_ALLOCATED);
    f->U = ok_fig(m, TK_OOMFIG_RESERVED_UNALLOCATED), f->F = ok_fig(m, TK_OOMFIG_FREE);
    f->P = ok_fig(m, TK_OOMFIG_PROCESS_IN_USE), f->V = ok_fig(m, TK_OOMFIG_RESERVED);
    f->torch = m->format != TK_OOMMSG_TF;
    f->ctx = tk_card_context(m->card);
    /* the API: the caller's (a config's api:), else a TensorFlow message's
     * Keras, the traceback's Trainer, else a plain loop */
    f->api = m->api != TK_API_AUTO ? m->api : !f->torch ? TK_API_KERAS : m->trainer ? TK_API_TRAINER : TK_API_LOOP;
    f->platform = tk_platform_era(platform, m->card);
    f->cards = cards, f->n_cards = n;
    read_processes(m, f);
    f->have_plan = m->have_plan;
    f->plan = m->plan_allocated ? m->plan_allocated : m->plan_peak;
    f->plan_what = m->plan_allocated ? "allocated" : "reserved";
    f->engine = m->plan_engine[0] ? m->plan_engine : "txkernel's trainer";
    f->torch_live = m->torch_live, f->last_run = m->last_run;
    for (int i = 0; i < n; i++)
        if (m->have_plan && cards[i].card == m->card && cards[i].budget) {
            f->plan_on_card = 1, f->plan_fits = cards[i].fits;
            f->plan_reserved = cards[i].peak, f->budget = cards[i].budget;
        }
    f->request_over_card = f->R && f->T && f->R->bytes > f->T->bytes;
    if (f->have_plan && f->A && f->plan) {
        uint64_t slack = f->plan / 10 > 256 * MIB ? f->plan / 10 : 256 * MIB;
        f->held = f->A->bytes > f->plan + slack;
        f->held_bytes = f->held ? f->A->bytes - f->plan : 0;
    }
    f->step_over_card = f->plan_on_card && !f->plan_fits;
    int frag_fits = f->torch && f->R && f->U && f->U->bytes >= f->R->bytes && !f->request_over_card;
    if (f->have_plan) f->frag = frag_fits && !f->held && !f->step_over_card;
    else if (frag_fits && (!m->have_outside || f->U->bytes >= m->outside)) {
        /* without a plan the split cache is a verdict only when PyTorch's
         * allocated is under half the card: then neither the step nor what
         * earlier cells hold took the room; otherwise both are named */
        if (f->A && f->T && f->A->bytes * 2 >= f->T->bytes) f->split_or_held = 1;
        else f->frag = 1;
    }
    /* without a plan, the split cache as the larger loss stands alone (its own rule decided that) */
    int frag_alone = (f->frag || f->split_or_held) && !f->have_plan;
    if (f->torch && m->card && f->T && f->V && f->R && !f->request_over_card && !frag_alone)
        f->outside = f->V->bytes + f->R->bytes + f->ctx < f->T->bytes;
    else if (f->torch && m->have_outside && m->outside >= 256 * MIB && f->T && m->outside * 20 >= f->T->bytes &&
             !(m->card && m->outside <= f->ctx + 128 * MIB) && !f->request_over_card && !frag_alone)
        f->outside = 1;
    if (f->torch && !f->request_over_card && !f->frag && !f->split_or_held && f->T) {
        if (m->card && f->V && f->R) f->filled = !f->outside; /* the profile's sum reached the total */
        else if (f->A && (f->A->bytes * 2 >= f->T->bytes || (f->R && f->A->bytes + f->R->bytes > f->T->bytes))) f->filled = 1;
    }
    f->tf_dense = !f->torch && flattened_dense(m, &f->dom_seq, &f->dom_hidden, &f->dom_towers);
}

/* read -> facts -> diagnose (the one table, diagnoses.c) -> fixes, copied
 * into the message's own lists */
void tk_oom_message_diagnose(tk_oom_message *m, const tk_card_fit *cards, int n, const char *platform) {
    if (!m || m->format == TK_OOMMSG_NONE) return;
    m->n_diag = m->n_fixes = 0;
    if (!m->have_user_config) m->user_torch = m->format == TK_OOMMSG_TORCH_21 ? TK_TORCH_2 : TK_TORCH_1_13;
    tk_facts f;
    read_facts(m, n > 0 ? cards : NULL, n > 0 ? n : 0, platform, &f);
    tk_diagnose_into(&f, m->diag, TK_OOMMSG_MAX_DIAG, &m->n_diag, m->fixes, TK_OOMMSG_MAX_FIXES, &m->n_fixes);
}

/* ---- reports ---------------------------------------------------------------------------- */

static const char *format_name(tk_oommsg_format f) {
    switch (f) {
    case TK_OOMMSG_TORCH_CACHED: return "PyTorch <= 1.3 (\"cached\" = reserved but unallocated)";
    case TK_OOMMSG_TORCH_RESERVED: return "PyTorch 1.4-2.0";
    case TK_OOMMSG_TORCH_21: return "PyTorch 2.1+";
    case TK_OOMMSG_TF: return "TensorFlow";
    case TK_OOMMSG_NO_KERNEL_IMAGE: return "not an OOM: no kernel image for the device";
    default: return "none";
    }
}

char *tk_oom_message_format(const tk_oom_message *m) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    if (!m || m->format == TK_OOMMSG_NONE) {
        fputs("no OOM message found\n", f);
        fclose(f);
        return buf;
    }
    fprintf(f, "%s: %s%s%s", m->format == TK_OOMMSG_NO_KERNEL_IMAGE ? "Message" : "OOM message", format_name(m->format),
            m->translated ? " (in translation: ResourceExhaustedError ... OOM)" : "",
            m->spelled_capacty ? ", spelled \"capacty\"" : "");
    if (m->gpu_index >= 0) fprintf(f, ", GPU %d", m->gpu_index);
    fputc('\n', f);
    if (m->format == TK_OOMMSG_TF) {
        fputs("  tensor                shape [", f);
        for (int i = 0; i < m->rank && i < TK_OOMMSG_MAX_DIMS; i++) fprintf(f, "%s%lld", i ? "," : "", (long long)m->shape[i]);
        fprintf(f, "] type %s%s%s%s%s%s\n", m->dtype[0] ? m->dtype : "?", m->dtype_assumed ? " (assumed: no type named)" : "",
                m->node[0] ? ", node " : "", m->node, m->allocator[0] ? ", allocator " : "", m->allocator);
    }
    static const char *const labels[TK_OOMFIG_COUNT] = {
        "requested", "total capacity", "allocated", "reserved", "reserved-unallocated", "free", "process in use",
    };
    for (int i = 0; i < TK_OOMFIG_COUNT; i++) {
        const tk_oommsg_figure *g = &m->fig[i];
        if (!g->present) continue;
        fprintf(f, "  %-21s %-14s", labels[i], g->text);
        if (!g->overflow) fprintf(f, " %20llu bytes", (unsigned long long)g->bytes);
        if (g->derived) fputs("  (derived)", f);
        if (g->unreliable) fputs("  UNRELIABLE: cannot be true, left out", f);
        fputc('\n', f);
    }
    if (m->have_outside) {
        char b[32];
        fprintf(f, "  %-21s %-14s (total - reserved - free)\n", "outside PyTorch", fmt(m->outside, b, sizeof b));
    }
    if (m->card) fprintf(f, "  card                  %s (%s)\n", m->card->long_name, m->card->name);
    else if (m->card_text[0]) fprintf(f, "  card                  %s\n", m->card_text);
    if (m->n_diag) fputs("Why\n", f);
    for (int i = 0; i < m->n_diag; i++) fprintf(f, "  %d. %s\n", i + 1, m->diag[i].text);
    if (m->n_fixes) fputs("What to change\n", f);
    for (int i = 0; i < m->n_fixes; i++) {
        fprintf(f, "  %d. %s\n", i + 1, m->fixes[i].text);
        const char *c = m->fixes[i].code;
        while (*c) {
            const char *nl = strchr(c, '\n');
            int k = nl ? (int)(nl - c) : (int)strlen(c);
            fprintf(f, "       %.*s\n", k, c);
            c += k + (nl ? 1 : 0);
        }
    }
    fclose(f);
    return buf;
}

/* Every set and append is checked: a part that could not be built (out of
 * host memory) makes the whole answer NULL, never a shorter object. */
json_t *tk_oom_message_to_json(const tk_oom_message *m) {
    json_t *o = json_object();
    json_t *unrel = json_array(), *diags = json_array(), *fixes = json_array();
    int bad = !o || !unrel || !diags || !fixes;
    for (int i = 0; !bad && m && i < TK_OOMFIG_COUNT; i++) {
        const tk_oommsg_figure *g = &m->fig[i];
        bad |= json_object_set_new(o, FIG_NAMES[i], g->present && !g->overflow ? json_integer((json_int_t)g->bytes) : json_null());
        if (g->present && g->unreliable) bad |= json_array_append_new(unrel, json_string(FIG_NAMES[i]));
    }
    for (int i = 0; !bad && m && i < m->n_diag; i++)
        bad |= json_array_append_new(diags, json_pack("{s:s, s:s}", "id", tk_diag_id(m->diag[i].kind), "text", m->diag[i].text));
    for (int i = 0; !bad && m && i < m->n_fixes; i++)
        bad |= json_array_append_new(fixes, json_pack("{s:s, s:s}", "text", m->fixes[i].text, "code", m->fixes[i].code));
    if (!bad) bad |= json_object_set_new(o, "card", m && m->card_text[0] ? json_string(m->card_text) : json_null());
    /* the plan of the user's config on the message's card, when a config was given */
    if (!bad && m && m->have_plan)
        bad |= json_object_set_new(o, "plan", json_pack("{s:s, s:I, s:I}", "engine",
                                                        m->plan_engine[0] ? m->plan_engine : "txkernel's trainer",
                                                        "peak_reserved", (json_int_t)m->plan_peak, "peak_allocated",
                                                        (json_int_t)m->plan_allocated));
    /* set_new takes each array's reference, whatever it returns */
    bad |= o ? json_object_set_new(o, "unreliable", unrel) : (json_decref(unrel), -1);
    bad |= o ? json_object_set_new(o, "diagnoses", diags) : (json_decref(diags), -1);
    bad |= o ? json_object_set_new(o, "fixes", fixes) : (json_decref(fixes), -1);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *tk_oom_message_json(const tk_oom_message *m) {
    json_t *o = tk_oom_message_to_json(m);
    char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return s;
}
