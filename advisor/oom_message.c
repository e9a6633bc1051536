/* oom_message.c — reads a pasted out-of-memory message and says why it
 * happened, from the figures in it alone (or with the user's config planned
 * on a platform's cards). The diagnosis opens with the seed user's question,
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
 * Depends on gpu/profile.c alone (and jansson), so the fuzz target builds it
 * without the planner. Guarantees: reads at most len bytes, never past them; no heap in the
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

static void add_diag(tk_oom_message *m, tk_diag_kind k, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void add_diag(tk_oom_message *m, tk_diag_kind k, const char *f, ...) {
    if (m->n_diag >= TK_OOMMSG_MAX_DIAG) return;
    tk_finding *d = &m->diag[m->n_diag++];
    d->kind = k;
    va_list ap;
    va_start(ap, f);
    vsnprintf(d->text, sizeof d->text, f, ap);
    va_end(ap);
}

static void add_fix(tk_oom_message *m, const char *text, const char *code) {
    for (int i = 0; i < m->n_fixes; i++)
        if (!strcmp(m->fixes[i].code, code)) return;
    if (m->n_fixes >= TK_OOMMSG_MAX_FIXES) return;
    tk_fix_note *x = &m->fixes[m->n_fixes++];
    snprintf(x->text, sizeof x->text, "%s", text);
    snprintf(x->code, sizeof x->code, "%s", code);
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
static uint64_t card_outside(const tk_gpu_profile *card) {
    return card ? card->capacity - tk_gpu_profile_budget(card) : 0;
}

/* Colab's paragraph, the card lottery: why the same code fits on some runs
 * and not others, from the message's own figures and the one usable
 * capacity of each card (tk_gpu_profile_budget). `here`: what PyTorch had on
 * this run (reserved + free). */
static void why_intermittent(tk_oom_message *m, const char *platform, uint64_t here, int platform_unknown) {
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
    add_diag(m, TK_DIAG_LOTTERY,
             "card lottery%s: why it fits on some runs and not others: this run got %s (%s total, %s usable after %s "
             "for the CUDA context and library buffers, the profile's default, not measured)%s%s%s.",
             platform_unknown ? " (if this ran on Colab)" : "", nm, m->fig[TK_OOMFIG_TOTAL].text,
             fmt(budget, b1, sizeof b1), fmt(card_outside(card), b2, sizeof b2), platform_clause(platform), room, held);
}

/* Kaggle's paragraph: the accelerator is the notebook's setting, not a
 * lottery; its choices with their usable capacity. */
static void why_kaggle(tk_oom_message *m, uint64_t here, int platform_unknown) {
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
    add_diag(m, TK_DIAG_PLATFORM,
             "kaggle%s: the accelerator is the notebook's own setting (Settings > Accelerator), your choice and not a "
             "lottery%s; the other choices are %s.",
             platform_unknown ? " (if this ran on Kaggle)" : "", got, list);
}

/* With the user's config: its plan on each card (by the engine the caller
 * names, engine: pytorch for a message from PyTorch), and the gap between
 * that plan and the PyTorch run the message comes from. */
static void config_on_cards(tk_oom_message *m, const char *platform, const tk_card_fit *cards, int n) {
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
    add_diag(m, kaggle ? TK_DIAG_PLATFORM : TK_DIAG_LOTTERY, "%s %s, your config as %s plans it: %s%s%s%s%s%s.",
             kaggle ? "kaggle: on the accelerators" : "card lottery on", platform, who, s,
             nm[0] ? "; this message came from a " : "", nm,
             near && !kaggle ? "; within 5% of a card's budget a run can fit one day and not the next" : "",
             all ? "; so the card alone does not explain this failure: what the plan leaves out does" : "", gap);
}

/* What a fix's code opens with when the user runs the Trainer: a
 * TrainingArguments line that constructs as written (tk_ta_open). */
static const char *ta(const tk_oom_message *m, char *buf, size_t n) {
    return tk_ta_open(buf, n, m->user_output_dir, m->user_torch);
}

/* The loop the user runs, as a fix leaves it: their own numbers where a
 * config gave them, named placeholders otherwise (tk_loop_code). */
static void loop_fix(const tk_oom_message *m, tk_loop_fix *o) {
    memset(o, 0, sizeof *o);
    o->batch = m->user_batch;
    o->batch_s = "B";
    o->from_batch = m->user_batch;
    o->from_accum = m->user_accumulate;
    o->accum = m->user_batch ? (m->user_accumulate > 1 ? m->user_accumulate : 1) : 1;
    o->precision = m->have_user_config ? m->user_precision : TK_PREC_FP32;
    o->checkpointing = 0;
    o->torch = m->have_user_config ? m->user_torch : TK_TORCH_2;
}

/* The fixes that make the step itself smaller, as code in the API the user
 * runs (the Trainer's TrainingArguments, a plain loop's whole body, Keras,
 * or txkernel's YAML), smallest change first, carrying the user's own
 * numbers when a config gave them and named placeholders otherwise: never
 * an example value. A fix the config has on already is not offered; the
 * diagnosis `d` says so. */
static void capacity_fixes(tk_oom_message *m, tk_api api, tk_finding *d) {
    char code[1400], text[240], op[TK_PATH_MAX + 48];
    int B = m->user_batch, A = m->user_accumulate > 1 ? m->user_accumulate : 1;
    tk_loop_fix lf;
    if (api == TK_API_TXKERNEL && B >= 2)
        snprintf(code, sizeof code, "batch_size: %d\naccumulate: %d   # your %d x %d: the same effective batch of %d",
                 B / 2, 2 * A, B, A, B * A);
    else if (api == TK_API_TXKERNEL)
        snprintf(code, sizeof code, "batch_size: B / 2\naccumulate: A * 2   # B, A: your batch_size and accumulate now");
    else if (api == TK_API_TRAINER && B >= 2)
        snprintf(code, sizeof code, "%sper_device_train_batch_size=%d, gradient_accumulation_steps=%d)\n"
                 "# your batch %d x accumulation %d: the same effective batch of %d", ta(m, op, sizeof op), B / 2, 2 * A,
                 B, A, B * A);
    else if (api == TK_API_TRAINER)
        snprintf(code, sizeof code, "TrainingArguments(..., per_device_train_batch_size=B // 2, "
                 "gradient_accumulation_steps=A * 2)\n"
                 "# B, A: your batch size and accumulation now (txk advise CFG --from-error fills them in)");
    else if (api == TK_API_KERAS && B >= 2)
        snprintf(code, sizeof code, "optimizer = keras.optimizers.AdamW(learning_rate=lr, gradient_accumulation_steps=%d)"
                 "   # Keras 3\nmodel.fit(x, y, batch_size=%d)   # your %d x %d examples per step, kept", 2 * A, B / 2, B, A);
    else if (api == TK_API_KERAS)
        snprintf(code, sizeof code, "optimizer = keras.optimizers.AdamW(learning_rate=lr, gradient_accumulation_steps=2)"
                 "   # Keras 3\nmodel.fit(x, y, batch_size=B // 2)   # B: your batch size now");
    else {
        loop_fix(m, &lf);
        lf.loader = 1;
        if (B >= 2) lf.batch = B / 2, lf.accum = 2 * A;
        else lf.batch = 0, lf.batch_s = "B // 2", lf.accum = 0, lf.accum_s = "2 * A   # B, A: your batch size and "
                                                                            "accumulation now";
        tk_loop_code(code, sizeof code, &lf);
    }
    add_fix(m, api == TK_API_TRAINER ? "half the batch per step, same effective batch (transformers)"
                                     : "half the batch per step, same effective batch", code);
    /* the length: the corpus' p99 when given, else the config's max_len, else a named placeholder */
    char len_s[16], why[200];
    int L = m->user_p99 > 0 && (m->user_max_len <= 0 || m->user_p99 < m->user_max_len) ? m->user_p99 : m->user_max_len;
    if (L > 0) snprintf(len_s, sizeof len_s, "%d", L);
    else snprintf(len_s, sizeof len_s, "N");
    if (m->user_p99 > 0 && L == m->user_p99)
        snprintf(why, sizeof why, "# %d: the p99 token length of your training examples (your config's max_len: %d)",
                 L, m->user_max_len);
    else if (m->user_p99 > 0)
        snprintf(why, sizeof why, "# %d: your config's max_len; your training examples' p99 is %d, so a shorter max_length "
                 "truncates more: padding each batch to its longest is the saving here", L, m->user_p99);
    else if (L > 0)
        snprintf(why, sizeof why, "# %d: your config's max_len; lower it to your data's p99 (txk data FILE prints it)", L);
    else
        snprintf(why, sizeof why, "# N: your data's p99 token length (txk data FILE prints it)");
    int dyn_on = m->have_user_config && m->user_batching != TK_BATCH_FIXED;
    if (api == TK_API_TXKERNEL)
        snprintf(code, sizeof code, "max_len: %s\nbatching: dynamic\n%s", len_s, why);
    else if (api == TK_API_TRAINER)
        snprintf(code, sizeof code, "enc = tokenizer(texts, truncation=True, max_length=%s)   # no padding here\n"
                 "trainer = Trainer(model=model, args=args, train_dataset=train_ds, "
                 "data_collator=DataCollatorWithPadding(tokenizer))\n%s", len_s, why);
    else if (api == TK_API_KERAS)
        snprintf(code, sizeof code, "enc = tokenizer(texts, truncation=True, padding=\"max_length\", max_length=%s, "
                 "return_tensors=\"tf\")\n%s", len_s, why);
    else {
        loop_fix(m, &lf);
        lf.dynamic = 1;
        if (L > 0) lf.max_len = L;
        else lf.max_len_s = "N";
        int k = tk_loop_code(code, sizeof code, &lf);
        if (k >= 0 && (size_t)k < sizeof code) snprintf(code + k, sizeof code - (size_t)k, "\n%s", why);
    }
    if (!(dyn_on && api != TK_API_TXKERNEL && L == m->user_max_len))
        add_fix(m, "shorter sequences: pad each batch to its longest text, and truncate at what your texts need", code);
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
        if (api == TK_API_TXKERNEL) snprintf(code, sizeof code, "precision: fp16");
        else if (api == TK_API_TRAINER) snprintf(code, sizeof code, "%sfp16=True)", ta(m, op, sizeof op));
        else if (api == TK_API_KERAS)
            snprintf(code, sizeof code, "tf.keras.mixed_precision.set_global_policy(\"mixed_float16\")   # before the "
                     "model is built");
        else {
            loop_fix(m, &lf);
            lf.precision = TK_PREC_FP16;
            tk_loop_code(code, sizeof code, &lf);
        }
        if (m->card && !tk_gpu_profile_fast_fp16(m->card))
            snprintf(text, sizeof text, "mixed precision: on a %s (no tensor cores) fp16 saves activation memory but no time",
                     m->card->name);
        else
            snprintf(text, sizeof text, "mixed precision (fp16 halves activations and is faster on tensor cores)");
        add_fix(m, text, code);
    }
    if (!ckpt_on && api != TK_API_KERAS) {
        if (api == TK_API_TXKERNEL) snprintf(code, sizeof code, "recompute: layers");
        else if (api == TK_API_TRAINER) snprintf(code, sizeof code, "%sgradient_checkpointing=True)", ta(m, op, sizeof op));
        else snprintf(code, sizeof code, "(model if hasattr(model, \"gradient_checkpointing_enable\") else model.bert)"
                      ".gradient_checkpointing_enable()   # the module that has it: model.bert inside a wrapper");
        add_fix(m, "recompute activations in the backward pass (about 30% slower, far less memory)", code);
    }
}

/* The number of GPUs a launcher line names: Kaggle's T4 x2 says 2; else a
 * named placeholder. */
static const char *n_gpus(const tk_oom_message *m) {
    return m->platform[0] && !strcmp(m->platform, "kaggle") && m->card && !strcmp(m->card->name, "t4") ? "2" : "NUM_GPUS";
}

/* A run on several GPUs: which kind, what GPU 0 (DataParallel) or each rank
 * (DDP) holds, and the move that shares it. */
static void multi_gpu_diagnosis(tk_oom_message *m) {
    char dev[400] = "";
    if (m->parallel == TK_OOMMSG_DATAPARALLEL) {
        if (m->gpu_index >= 0 && m->gpu_index != m->replica_device)
            snprintf(dev, sizeof dev, "; the figures below are GPU %d's, where it ran out", m->gpu_index);
        add_diag(m, TK_DIAG_MULTI_GPU,
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
    add_diag(m, TK_DIAG_MULTI_GPU,
             "multi_gpu: a DDP run (one process per GPU%s): each rank holds a whole copy of the weights, their "
             "gradients and the optimizer state, plus DDP's gradient buckets (bucket_cap_mb, 25 MB by default) and, "
             "outside PyTorch's cache, NCCL's buffers; a smaller per-GPU batch leaves the copies, ZeRO-2 (DeepSpeed) "
             "shards the gradients and optimizer state over the ranks%s.",
             who, dev);
}

static void multi_gpu_fixes(tk_oom_message *m, tk_api api) {
    char code[400];
    const char *g = n_gpus(m);
    const char *note = strcmp(g, "2") ? "\n# NUM_GPUS: your GPU count (torch.cuda.device_count())" : "";
    if (m->parallel == TK_OOMMSG_DATAPARALLEL) {
        if (api == TK_API_LOOP)
            snprintf(code, sizeof code, "!torchrun --nproc_per_node %s train.py   # the training cell saved as train.py\n"
                     "# in it: model = DistributedDataParallel(model, device_ids=[local_rank])%s", g, note);
        else
            snprintf(code, sizeof code, "!accelerate launch --multi_gpu --num_processes %s train.py   # the training "
                     "cell saved as train.py\n# or in the notebook: from accelerate import notebook_launcher; "
                     "notebook_launcher(train, num_processes=%s)%s", g, g, note);
        add_fix(m, "DDP instead of DataParallel: one process per GPU, nothing gathered on GPU 0", code);
        return;
    }
    snprintf(code, sizeof code, "!accelerate launch --use_deepspeed --zero_stage 2 --num_processes %s train.py%s%s", g,
             api == TK_API_LOOP ? "\n# the loop through accelerate: model, optimizer, loader = "
                                  "accelerator.prepare(model, optimizer, loader); accelerator.backward(loss)" : "",
             note);
    add_fix(m, "ZeRO-2: each rank keeps 1/N of the gradients and optimizer state (DeepSpeed, through accelerate)", code);
}

/* Not an OOM: the card is older than every kernel the installed torch has
 * (Kaggle's P100 with a cu128 torch: Kaggle/docker-python#1546; Kaggle's
 * answer in Kaggle/kaggle-cli#1151: use a T4 or L4, or install a Pascal
 * build). torch's own warning there asks for CUDA 12.6 builds, whose arch
 * list still has 6.0 (PyTorch 2.9's cu126: 5.0 6.0 7.0 7.5 8.0 8.6 9.0, as
 * Comfy-Org/ComfyUI#16438 lists them). */
static void no_kernel_diagnosis(tk_oom_message *m) {
    char dev[120], code[300];
    if (m->device_name[0])
        snprintf(dev, sizeof dev, " (%s%s%s)", m->device_name, m->device_sm[0] ? ", " : "", m->device_sm);
    else
        dev[0] = 0;
    add_diag(m, TK_DIAG_NO_KERNEL_IMAGE,
             "no_kernel_image: not an out-of-memory error: the installed torch has no GPU code for this card%s%s%s%s, "
             "so memory settings, a smaller batch or a restart cannot help (Kaggle's P100 with its cu128 torch is the "
             "known case, Kaggle/docker-python#1546).",
             dev, m->supported_sm[0] ? "; this torch has kernels for " : "", m->supported_sm,
             m->supported_sm[0] ? " only" : "");
    add_fix(m, "switch the notebook to a T4 (Kaggle: Settings > Accelerator > GPU T4 x2; Colab: Runtime > Change "
               "runtime type), then check the card",
            "!nvidia-smi --query-gpu=name,compute_cap --format=csv   # a T4 says 7.5");
    snprintf(code, sizeof code,
             "!pip install torch --index-url https://download.pytorch.org/whl/cu126\n"
             "import torch; print(torch.cuda.get_arch_list())   # must list %s",
             m->device_sm[0] ? m->device_sm : "your card's sm_NN");
    add_fix(m, "or keep the card and install a torch build with kernels for it (PyTorch's cu126 wheels still have "
               "sm_60; needs the internet, so not in an offline competition)",
            code);
}

/* The platform's paragraphs, after what the figures prove: Colab's card
 * lottery, Kaggle's accelerators, or, when the message does not show where
 * it ran, that said and each platform's line. */
/* 1: the platform hands out this card (t4x2's card is the t4) */
static int platform_has(const char *platform, const tk_gpu_profile *card) {
    const tk_gpu_profile *cards[16];
    int n = tk_gpu_platform_cards(platform, cards, 16);
    for (int i = 0; i < n; i++)
        if (cards[i] == card) return 1;
    return 0;
}

static void platform_diagnoses(tk_oom_message *m, uint64_t here) {
    int unknown = !m->platform[0];
    /* not shown: the platforms whose cards include this one each get a line */
    int colab = unknown ? platform_has("colab", m->card) || platform_has("colab-2020", m->card) : is_colab(m->platform);
    int kaggle = unknown ? platform_has("kaggle", m->card) : !strcmp(m->platform, "kaggle");
    if (unknown && (colab || kaggle))
        add_diag(m, TK_DIAG_PLATFORM,
                 "platform: the message does not show where it ran (no /kaggle/ or /content/ path; the dist-packages "
                 "paths are the same on both, as Kaggle's image is built on Colab's), so each platform gets its line "
                 "below; --for colab or --for kaggle keeps one.");
    if (colab) {
        const char *own = platform_has("colab", m->card) ? "colab" : "colab-2020";
        why_intermittent(m, m->platform[0] ? m->platform : own, here, unknown);
    }
    if (kaggle) why_kaggle(m, here, unknown);
}

/* ---- the facts and the one ordered table of diagnoses ------------------------------- */


/* The era's platform: Colab's cards of 2020 (K80, P4) are not today's. */
static const char *platform_era(const char *platform, const tk_gpu_profile *card) {
    if (platform && !strcmp(platform, "colab") && card && !platform_has("colab", card) && platform_has("colab-2020", card))
        return "colab-2020";
    return platform;
}

const char *tk_oom_message_platform(const tk_oom_message *m) {
    const char *own = tk_gpu_platform_of(m->card);
    if (own && !strcmp(own, "colab") && m->card && !platform_has("colab", m->card)) own = "colab-2020";
    return platform_era(m->platform[0] ? m->platform : own ? own : "colab", m->card);
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
    f->R = ok_fig(m, TK_OOMFIG_REQUESTED), f->T = ok_fig(m, TK_OOMFIG_TOTAL), f->A = ok_fig(m, TK_OOMFIG_ALLOCATED);
    f->U = ok_fig(m, TK_OOMFIG_RESERVED_UNALLOCATED), f->F = ok_fig(m, TK_OOMFIG_FREE);
    f->P = ok_fig(m, TK_OOMFIG_PROCESS_IN_USE), f->V = ok_fig(m, TK_OOMFIG_RESERVED);
    f->torch = m->format != TK_OOMMSG_TF;
    f->ctx = card_outside(m->card);
    /* the API: the caller's (a config's api:), else a TensorFlow message's
     * Keras, the traceback's Trainer, else a plain loop */
    f->api = m->api != TK_API_AUTO ? m->api : !f->torch ? TK_API_KERAS : m->trainer ? TK_API_TRAINER : TK_API_LOOP;
    f->platform = platform_era(platform, m->card);
    f->cards = cards, f->n_cards = n;
    read_processes(m, f);
    f->have_plan = m->have_plan;
    f->plan = m->plan_allocated ? m->plan_allocated : m->plan_peak;
    f->plan_what = m->plan_allocated ? "allocated" : "reserved";
    f->engine = m->plan_engine[0] ? m->plan_engine : "txkernel's trainer";
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
    else f->frag = frag_fits && (!m->have_outside || f->U->bytes >= m->outside);
    /* without a plan, the split cache as the larger loss stands alone (its own rule decided that) */
    int frag_alone = f->frag && !f->have_plan;
    if (f->torch && m->card && f->T && f->V && f->R && !f->request_over_card && !frag_alone)
        f->outside = f->V->bytes + f->R->bytes + f->ctx < f->T->bytes;
    else if (f->torch && m->have_outside && m->outside >= 256 * MIB && f->T && m->outside * 20 >= f->T->bytes &&
             !(m->card && m->outside <= f->ctx + 128 * MIB) && !f->request_over_card && !frag_alone)
        f->outside = 1;
    if (f->torch && !f->request_over_card && !f->frag && f->T) {
        if (m->card && f->V && f->R) f->filled = !f->outside; /* the profile's sum reached the total */
        else if (f->A && (f->A->bytes * 2 >= f->T->bytes || (f->R && f->A->bytes + f->R->bytes > f->T->bytes))) f->filled = 1;
    }
    f->tf_dense = !f->torch && flattened_dense(m, &f->dom_seq, &f->dom_hidden, &f->dom_towers);
}

/* One rule of the table: whether the facts prove it, its sentence, and its
 * fixes (the first rule's fixes come first). */
typedef struct tk_rule {
    tk_diag_kind kind;
    int (*proves)(const tk_oom_message *m, const tk_facts *f);
    void (*say)(tk_oom_message *m, const tk_facts *f);
    void (*fix)(tk_oom_message *m, const tk_facts *f, tk_finding *d);
} tk_rule;

static void say_no_kernel(tk_oom_message *m, const tk_facts *f) { (void)f; no_kernel_diagnosis(m); }
static int proves_no_kernel(const tk_oom_message *m, const tk_facts *f) {
    (void)f;
    return m->format == TK_OOMMSG_NO_KERNEL_IMAGE;
}

static int proves_multi_gpu(const tk_oom_message *m, const tk_facts *f) { return f->torch && m->parallel != TK_OOMMSG_ONE_GPU; }
static void say_multi_gpu(tk_oom_message *m, const tk_facts *f) { (void)f; multi_gpu_diagnosis(m); }
static void fix_multi_gpu(tk_oom_message *m, const tk_facts *f, tk_finding *d) { (void)d; multi_gpu_fixes(m, f->api); }

static int proves_request_over(const tk_oom_message *m, const tk_facts *f) { (void)m; return f->request_over_card; }
static void say_request_over(tk_oom_message *m, const tk_facts *f) {
    add_diag(m, TK_DIAG_CAPACITY,
             "capacity: the single request (%s) is larger than the whole card (%s), so no setting of the cache and no "
             "restart makes it fit: the tensor itself must shrink (batch, sequence length, precision) or be split.",
             f->R->text, f->T->text);
}

/* the shrinking fixes, once, after the first diagnosis that calls for them */
static void fix_capacity(tk_oom_message *m, const tk_facts *f, tk_finding *d) {
    if (f->torch) capacity_fixes(m, f->api, d);
}

static int proves_other(const tk_oom_message *m, const tk_facts *f) {
    (void)m;
    return f->torch && f->other >= 0 && m->proc[f->other].mem.bytes >= 256 * MIB && !f->request_over_card;
}
static void say_other(tk_oom_message *m, const tk_facts *f) {
    const tk_oommsg_process *o = &m->proc[f->other];
    char own[200] = "";
    if (f->own >= 0)
        snprintf(own, sizeof own, ", while process %d (%s) is your own kernel, whose figure holds PyTorch's %s reserved "
                 "plus the context", m->proc[f->own].pid, m->proc[f->own].mem.text, f->V ? f->V->text : "?");
    add_diag(m, TK_DIAG_OTHER_PROCESS,
             "another process: process %d held %s of the %s card when yours asked for %s, memory your run could not "
             "use%s.",
             o->pid, o->mem.text, f->T ? f->T->text : "?", f->R ? f->R->text : "more", own);
}
static void fix_other(tk_oom_message *m, const tk_facts *f, tk_finding *d) {
    (void)d;
    const tk_oommsg_process *o = &m->proc[f->other];
    char text[240], code[600];
    snprintf(text, sizeof text, "stop process %d, which holds %s of the card (another notebook or job), then run again",
             o->pid, o->mem.text);
    snprintf(code, sizeof code,
             "!nvidia-smi --query-compute-apps=pid,used_memory --format=csv   # process %d: %s\n"
             "# end it where it runs: its notebook's Runtime > Manage sessions > Terminate, or kill %d in its shell",
             o->pid, o->mem.text, o->pid);
    add_fix(m, text, code);
}

static const char FREE_CODE[] = "import gc, torch\ndel model, optimizer   # whatever an earlier cell left on the GPU\n"
                                "gc.collect()\ntorch.cuda.empty_cache()";

static int proves_held(const tk_oom_message *m, const tk_facts *f) { (void)m; return f->torch && f->held; }
static void say_held(tk_oom_message *m, const tk_facts *f) {
    char b1[32], b2[32];
    add_diag(m, TK_DIAG_HELD,
             "held outside the step: your run had %s allocated by PyTorch when it failed, while one training step of "
             "this config needs %s %s as %s plans it, so %s was held by something other than the step: tensors that "
             "earlier cells still hold (a model and optimizer from a run before this one), or a config different from "
             "the one given.",
             f->A->text, fmt(f->plan, b1, sizeof b1), f->plan_what, f->engine, fmt(f->held_bytes, b2, sizeof b2));
}
static void fix_held(tk_oom_message *m, const tk_facts *f, tk_finding *d) {
    (void)d;
    char text[240], b1[32];
    snprintf(text, sizeof text, "free what earlier cells hold on the card (%s more than the step needs), or restart "
             "the runtime, then run the training cell once", fmt(f->held_bytes, b1, sizeof b1));
    add_fix(m, text, FREE_CODE);
}

static int proves_step_over(const tk_oom_message *m, const tk_facts *f) {
    (void)m;
    return f->torch && f->step_over_card && !f->request_over_card;
}
static void say_step_over(tk_oom_message *m, const tk_facts *f) {
    char b1[32], b2[32], nm[32] = "card";
    if (m->card) upper(m->card->name, nm, sizeof nm);
    add_diag(m, TK_DIAG_CAPACITY,
             "capacity: one training step of this config needs %s reserved as %s plans it, more than the %s that the "
             "%s leaves usable after its context and library buffers, so the step itself does not fit this card.",
             fmt(f->plan_reserved, b1, sizeof b1), f->engine, fmt(f->budget, b2, sizeof b2), nm);
}

static int proves_frag(const tk_oom_message *m, const tk_facts *f) { (void)m; return f->frag; }
static void say_frag(tk_oom_message *m, const tk_facts *f) {
    char b1[32];
    if (f->have_plan)
        add_diag(m, TK_DIAG_FRAGMENTATION,
                 "fragmentation: PyTorch held %s reserved but unallocated, enough for the %s request, while the %s it "
                 "had allocated matches the %s one step of this config needs, so the cache was split into pieces "
                 "smaller than the request.",
                 f->U->text, f->R->text, f->A ? f->A->text : "?", fmt(f->plan, b1, sizeof b1));
    else
        add_diag(m, TK_DIAG_FRAGMENTATION,
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
static void fix_frag(tk_oom_message *m, const tk_facts *f, tk_finding *d) {
    (void)f, (void)d;
    if (m->format == TK_OOMMSG_TORCH_21)
        add_fix(m, "let the cache grow segments instead of splitting them (first cell, before torch is imported)",
                torch_before_2_9(m)
                    ? "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"\nimport torch"
                    : "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"   # still "
                      "read by torch 2.9+, only deprecated\nos.environ[\"PYTORCH_ALLOC_CONF\"] = "
                      "\"expandable_segments:True\"   # torch 2.9+'s name (2.9.1 ignored it alone: pytorch#183387)\n"
                      "import torch");
    else if (m->format == TK_OOMMSG_TORCH_RESERVED)
        add_fix(m, "stop the cache from splitting large blocks (PyTorch 1.10+; first cell, before torch is imported)",
                "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"max_split_size_mb:128\"\nimport torch");
    else
        add_fix(m, "return the split cache between steps (PyTorch <= 1.3 has no allocator settings)",
                "optimizer.step()\noptimizer.zero_grad()\ntorch.cuda.empty_cache()");
}

static int proves_outside(const tk_oom_message *m, const tk_facts *f) {
    (void)m;
    return f->outside && !proves_other(m, f) && !f->held;
}
static void say_outside(tk_oom_message *m, const tk_facts *f) {
    char b1[32], b2[32], b3[32], b4[32], cname[32];
    if (m->card) {
        upper(m->card->name, cname, sizeof cname);
        add_diag(m, TK_DIAG_HEADROOM,
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
        add_diag(m, TK_DIAG_HEADROOM,
                 "headroom: %s of the card is held outside PyTorch's cache (total %s - reserved %s - free %s): the "
                 "CUDA context and library kernels, and whatever else runs on the card.",
                 fmt(m->outside, b1, sizeof b1), f->T->text, f->V ? f->V->text : "?", f->F ? f->F->text : "?");
    }
}
static void fix_outside(tk_oom_message *m, const tk_facts *f, tk_finding *d) {
    add_fix(m, "free what earlier cells hold on the card before building the model (or restart the runtime)",
            "import gc, torch\ndel model, optimizer   # whatever an earlier cell left on the GPU\ngc.collect()\n"
            "torch.cuda.empty_cache()\n!nvidia-smi   # any other process on the card?");
    /* for when what is held outside cannot be freed */
    fix_capacity(m, f, d);
}

/* Without a plan and without proof: the card was full, and either the
 * step or what earlier cells hold filled it; both are named. */
static int proves_filled(const tk_oom_message *m, const tk_facts *f) {
    (void)m;
    return f->filled && !f->have_plan && !proves_other(m, f);
}
static void say_filled(tk_oom_message *m, const tk_facts *f) {
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
    add_diag(m, TK_DIAG_STEP_OR_HELD,
             "the step or held memory: %s, so PyTorch filled the card; either one training step needs more than this "
             "card, or tensors that earlier cells still hold take the room, and your config tells which (txk advise "
             "CFG --from-error MSG).",
             figs);
}
static void fix_filled(tk_oom_message *m, const tk_facts *f, tk_finding *d) {
    add_fix(m, "if an earlier cell's model or optimizer is still on the card: free it (or restart the runtime), then "
               "run the training cell once",
            FREE_CODE);
    fix_capacity(m, f, d);
}

/* figures that cannot be true: only free against the request is left */
static int proves_unreadable(const tk_oom_message *m, const tk_facts *f) {
    int bad = 0;
    for (int i = 0; i < TK_OOMFIG_COUNT; i++) bad |= m->fig[i].present && m->fig[i].unreliable;
    return bad && m->n_diag == 0 && f->R && f->F && f->F->bytes < f->R->bytes;
}
static void say_unreadable(tk_oom_message *m, const tk_facts *f) {
    add_diag(m, TK_DIAG_STEP_OR_HELD,
             "the step or held memory: the card had %s free for a %s request, and the message's in-use figures cannot "
             "be true, so who holds the memory cannot be read from it (check with nvidia-smi or "
             "torch.cuda.memory_summary()).",
             f->F->text, f->R->text);
}

static int proves_dominant(const tk_oom_message *m, const tk_facts *f) {
    (void)m;
    return f->R && (!f->torch || (f->T && !f->request_over_card && f->R->bytes * 4 >= f->T->bytes));
}
static void say_dominant(tk_oom_message *m, const tk_facts *f) {
    char b1[32], b2[32];
    const tk_oommsg_figure *R = f->R;
    if (f->tf_dense) {
        uint64_t train = R->overflow ? 0 : R->bytes * 4;
        add_diag(m, TK_DIAG_DOMINANT_LAYER,
                 "dominant_layer: the tensor [%lld,%lld] of %s is a Dense kernel%s%s%s over %lld = %d x %d x %d inputs, "
                 "that is %d flattened tower%s of %d tokens x %d hidden units, into %lld units: %s of weights alone%s, "
                 "and training adds its gradient and Adam's two moments (%s in fp32), more than a 16 GB card holds.",
                 (long long)m->shape[0], (long long)m->shape[1], R->text, m->node[0] ? " (node " : "", m->node,
                 m->node[0] ? ")" : "", (long long)m->shape[0], f->dom_seq, f->dom_hidden, f->dom_towers, f->dom_towers,
                 f->dom_towers > 1 ? "s" : "", f->dom_seq, f->dom_hidden, (long long)m->shape[1],
                 fmt(R->bytes, b1, sizeof b1), m->dtype_assumed ? " (float32 assumed: the message names no type)" : "",
                 fmt(train, b2, sizeof b2));
    } else if (!f->torch) {
        add_diag(m, TK_DIAG_DOMINANT_LAYER, "dominant_layer: one tensor of shape [%lld%s] and type %s needs %s.",
                 (long long)m->shape[0], m->rank > 1 ? ",..." : "", m->dtype, R->text);
    } else {
        add_diag(m, TK_DIAG_DOMINANT_LAYER, "dominant_layer: one tensor of %s is %.0f%% of the card.", R->text,
                 100.0 * (double)R->bytes / (double)f->T->bytes);
    }
}
static void fix_dominant(tk_oom_message *m, const tk_facts *f, tk_finding *d) {
    (void)d;
    if (f->tf_dense) {
        add_fix(m, "a per-token span head instead of Dense over the flattened towers (768 x 2 weights, not "
                   "786432 x 1604)",
                "start_end = tf.keras.layers.Dense(2)(context_bert_layer)   # [batch, 512, 2]\n"
                "start_logits, end_logits = tf.unstack(start_end, axis=-1)");
        add_fix(m, "or pool the towers before the classifier",
                "q = tf.keras.layers.GlobalAveragePooling1D()(questions_bert_layer)\n"
                "c = tf.keras.layers.GlobalAveragePooling1D()(context_bert_layer)\n"
                "out = tf.keras.layers.Dense(1604, activation=\"softmax\")(tf.keras.layers.Concatenate()([q, c]))");
    } else if (!f->torch) {
        char code[200];
        if (m->user_batch >= 2)
            snprintf(code, sizeof code, "tf.keras.mixed_precision.set_global_policy(\"mixed_float16\")\n"
                     "model.fit(x, y, batch_size=%d)   # half your %d", m->user_batch / 2, m->user_batch);
        else
            snprintf(code, sizeof code, "tf.keras.mixed_precision.set_global_policy(\"mixed_float16\")\n"
                     "model.fit(x, y, batch_size=B // 2)   # B: your batch size now");
        add_fix(m, "halve the tensor: a smaller batch or mixed precision", code);
    }
}

/* the user's config planned on the platform's cards */
static int proves_cards(const tk_oom_message *m, const tk_facts *f) {
    (void)m;
    return f->platform && f->n_cards > 0;
}
static void say_cards(tk_oom_message *m, const tk_facts *f) { config_on_cards(m, f->platform, f->cards, f->n_cards); }

/* the platform's paragraphs from the figures alone; with a plan only when
 * the plan shows a lottery too (the config fits some of the platform's cards
 * and not others): never contradicting it */
static int proves_platform(const tk_oom_message *m, const tk_facts *f) {
    if (!(f->torch && m->card && f->T && m->have_outside)) return 0;
    if (!f->have_plan) return 1;
    int fit = 0, not_fit = 0;
    for (int i = 0; i < f->n_cards; i++) fit |= f->cards[i].fits, not_fit |= !f->cards[i].fits;
    return fit && not_fit;
}
static void say_platform(tk_oom_message *m, const tk_facts *f) {
    char era[16] = "";
    /* a P4 or K80 message under --for colab is 2020's Colab */
    if (m->platform[0]) {
        snprintf(era, sizeof era, "%s", m->platform);
        snprintf(m->platform, sizeof m->platform, "%s", platform_era(era, m->card));
    }
    platform_diagnoses(m, f->T->bytes - m->outside);
    if (era[0]) snprintf(m->platform, sizeof m->platform, "%s", era);
}
static void fix_platform(tk_oom_message *m, const tk_facts *f, tk_finding *d) {
    if (d->kind == TK_DIAG_LOTTERY) {
        add_fix(m, "on Colab: see which card the runtime got before training, and plan for the smallest one",
                "!nvidia-smi --query-gpu=name,memory.total --format=csv");
        return;
    }
    if (d->kind != TK_DIAG_PLATFORM || strncmp(d->text, "kaggle", 6)) return;
    add_fix(m, "on Kaggle: choose the accelerator in the notebook's Settings > Accelerator (GPU T4 x2, "
               "GPU P100, RTX PRO 6000); the session restarts on it",
            "!nvidia-smi --query-gpu=name,memory.total --format=csv   # what the session has");
    /* one T4 of a pair, or the pair chosen: both cards, each with half the batch */
    if (m->card && !strcmp(m->card->name, "t4") && m->parallel == TK_OOMMSG_ONE_GPU)
        add_fix(m, "on Kaggle's GPU T4 x2: both T4s with DDP, each holding the model and half of each batch "
                   "(not planned from the message alone: txk advise CFG --from-error M --for kaggle plans it "
                   "for your config)",
                f->api == TK_API_LOOP ? "!torchrun --nproc_per_node 2 train.py   # the training cell saved as "
                                        "train.py, with DistributedDataParallel(model, device_ids=[local_rank])"
                                      : "!accelerate launch --multi_gpu --num_processes 2 train.py   # the "
                                        "training cell saved as train.py");
}

/* The one ordered table: the diagnosis the figures prove first. A run on
 * several GPUs comes before any figure; a request larger than the card,
 * another process and memory held outside the step before the step's own
 * size; the platform's paragraphs last. */
static const tk_rule RULES[] = {
    {TK_DIAG_NO_KERNEL_IMAGE, proves_no_kernel, say_no_kernel, NULL},
    {TK_DIAG_MULTI_GPU, proves_multi_gpu, say_multi_gpu, fix_multi_gpu},
    {TK_DIAG_CAPACITY, proves_request_over, say_request_over, fix_capacity},
    {TK_DIAG_OTHER_PROCESS, proves_other, say_other, fix_other},
    {TK_DIAG_HELD, proves_held, say_held, fix_held},
    {TK_DIAG_CAPACITY, proves_step_over, say_step_over, fix_capacity},
    {TK_DIAG_FRAGMENTATION, proves_frag, say_frag, fix_frag},
    {TK_DIAG_STEP_OR_HELD, proves_filled, say_filled, fix_filled},
    {TK_DIAG_HEADROOM, proves_outside, say_outside, fix_outside},
    {TK_DIAG_STEP_OR_HELD, proves_unreadable, say_unreadable, fix_filled},
    {TK_DIAG_DOMINANT_LAYER, proves_dominant, say_dominant, fix_dominant},
    {TK_DIAG_LOTTERY, proves_cards, say_cards, fix_platform},
    {TK_DIAG_PLATFORM, proves_platform, say_platform, fix_platform},
};

void tk_oom_message_diagnose(tk_oom_message *m, const tk_card_fit *cards, int n, const char *platform) {
    if (!m || m->format == TK_OOMMSG_NONE) return;
    m->n_diag = m->n_fixes = 0;
    if (!m->have_user_config) m->user_torch = m->format == TK_OOMMSG_TORCH_21 ? TK_TORCH_2 : TK_TORCH_1_13;
    tk_facts f;
    read_facts(m, n > 0 ? cards : NULL, n > 0 ? n : 0, platform, &f);
    /* which rule wrote each diagnosis, for its fixes */
    const tk_rule *by[TK_OOMMSG_MAX_DIAG] = {0};
    for (size_t r = 0; r < sizeof RULES / sizeof RULES[0]; r++) {
        if (!RULES[r].proves(m, &f)) continue;
        int before = m->n_diag;
        RULES[r].say(m, &f);
        for (int i = before; i < m->n_diag; i++) by[i] = &RULES[r];
        if (RULES[r].kind == TK_DIAG_NO_KERNEL_IMAGE) break; /* not an OOM: nothing else applies */
    }
    /* fixes in the order of the diagnoses they answer; the shrinking ones
     * once, answering the first diagnosis that calls for them */
    int shrunk = 0;
    for (int i = 0; i < m->n_diag; i++) {
        if (m->diag[i].kind == TK_DIAG_NO_KERNEL_IMAGE) continue; /* its fixes come with its sentence */
        if (!by[i] || !by[i]->fix) continue;
        int shrinks = by[i]->fix == fix_capacity || by[i]->fix == fix_outside || by[i]->fix == fix_filled;
        if (shrinks && shrunk) {
            if (by[i]->fix == fix_outside)
                add_fix(m, "free what earlier cells hold on the card before building the model (or restart the "
                           "runtime)",
                        "import gc, torch\ndel model, optimizer   # whatever an earlier cell left on the GPU\n"
                        "gc.collect()\ntorch.cuda.empty_cache()\n!nvidia-smi   # any other process on the card?");
            continue;
        }
        by[i]->fix(m, &f, &m->diag[i]);
        shrunk |= shrinks;
    }
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
