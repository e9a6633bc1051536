/* oom_message.c — reads a pasted out-of-memory message and says why it
 * happened, from the figures in it alone (or with the user's config planned
 * on a platform's cards).
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
                if (!m->n_processes) m->other_processes_pid = pid;
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

static int parse_tf(const char *p, const char *end, tk_oom_message *m) {
    const char *s = find_in(p, end, "shape[");
    if (!s) return -1;
    s += 6;
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
    if (ty) {
        ty += 9;
        size_t k = 0;
        while (ty + k < end && (isalnum((unsigned char)ty[k]) || ty[k] == '_') && k < sizeof m->dtype - 1) k++;
        memcpy(m->dtype, ty, k);
        m->dtype[k] = 0;
        m->dtype_bytes = tf_dtype_bytes(m->dtype);
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

int tk_oom_message_parse(const char *text, size_t len, tk_oom_message *m) {
    if (!m) return -1;
    memset(m, 0, sizeof *m);
    m->gpu_index = -1;
    if (!text || !len) return -1;
    const char *torch = find_last(text, len, "Tried to allocate ");
    const char *tf = find_last(text, len, "OOM when allocating tensor");
    const char *end_all = text + len;
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
        if (parse_tf(tf, end, m)) m->format = TK_OOMMSG_NONE;
    }
    int any = 0;
    for (int i = 0; i < TK_OOMFIG_COUNT; i++) any |= m->fig[i].present;
    if (m->format == TK_OOMMSG_NONE || (!any && m->format != TK_OOMMSG_TF)) {
        memset(m, 0, sizeof *m);
        m->gpu_index = -1;
        return -1;
    }
    check_and_derive(m);
    name_card(m);
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
    tk_oommsg_diag *d = &m->diag[m->n_diag++];
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
    tk_oommsg_fix *x = &m->fixes[m->n_fixes++];
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

/* The lottery from the message alone: on its card PyTorch could use `here`
 * (the total less what was held outside its cache) and the run needed more;
 * which of the platform's cards leave it more room than that? */
static void lottery_from_figures(tk_oom_message *m, const char *platform, uint64_t held) {
    const tk_gpu_profile *cards[16];
    int n = tk_gpu_platform_cards(platform, cards, 16);
    uint64_t here = m->have_outside ? m->fig[TK_OOMFIG_TOTAL].bytes - m->outside : tk_gpu_profile_budget(m->card);
    char more[400] = "", less[200] = "", nm[32], b1[32], b2[32], b3[32];
    size_t wm = 0, wl = 0;
    for (int i = 0; i < n; i++) {
        if (cards[i] == m->card) continue;
        upper(cards[i]->name, nm, sizeof nm);
        size_t budget = tk_gpu_profile_budget(cards[i]);
        if (budget > here)
            wm += (size_t)snprintf(more + wm, wm < sizeof more ? sizeof more - wm : 0, "%s%s (%s for PyTorch)",
                                   wm ? ", " : "", nm, fmt(budget, b1, sizeof b1));
        else
            wl += (size_t)snprintf(less + wl, wl < sizeof less ? sizeof less - wl : 0, "%s%s", wl ? ", " : "", nm);
        if (wm >= sizeof more) wm = sizeof more - 1;
        if (wl >= sizeof less) wl = sizeof less - 1;
    }
    if (!more[0]) return;
    upper(m->card->name, nm, sizeof nm);
    add_diag(m, TK_DIAG_LOTTERY,
             "card lottery: this message comes from a %s (%s total), one of the cards %s hands out; there PyTorch could "
             "use %s and the run, holding %s, needed more. %s leave PyTorch more room (after the context), so the same "
             "notebook gets further there and may fit%s%s: which card the runtime gets decides. Plan the config on "
             "each card to know: txk plan CFG --gpus %s",
             nm, m->fig[TK_OOMFIG_TOTAL].text, platform, fmt(here, b2, sizeof b2), fmt(held, b3, sizeof b3), more,
             less[0] ? "; no more room on " : "", less, platform);
}

static void lottery_from_plans(tk_oom_message *m, const char *platform, const tk_card_fit *cards, int n) {
    int fits_here = -1, any_fit = 0, near = 0;
    for (int i = 0; i < n; i++) {
        if (cards[i].card == m->card) fits_here = cards[i].fits;
        any_fit |= cards[i].fits;
        if (cards[i].fits && cards[i].margin < (int64_t)(cards[i].budget / 20)) near = 1;
    }
    if (!any_fit || (fits_here == 1 && !near)) return;
    char s[320], nm[32] = "";
    tk_cards_sentence(cards, n, s, sizeof s);
    if (m->card) upper(m->card->name, nm, sizeof nm);
    add_diag(m, TK_DIAG_LOTTERY, "card lottery on %s: the config %s%s%s%s.", platform, s,
             nm[0] ? "; this message came from a " : "", nm,
             near ? "; within 5% of a card's budget a run can fit one day and not the next" : "");
}

void tk_oom_message_diagnose(tk_oom_message *m, const tk_card_fit *cards, int n, const char *platform) {
    if (!m || m->format == TK_OOMMSG_NONE) return;
    m->n_diag = m->n_fixes = 0;
    char b1[32], b2[32], b3[32];
    const tk_oommsg_figure *R = ok_fig(m, TK_OOMFIG_REQUESTED), *T = ok_fig(m, TK_OOMFIG_TOTAL),
                           *A = ok_fig(m, TK_OOMFIG_ALLOCATED), *U = ok_fig(m, TK_OOMFIG_RESERVED_UNALLOCATED),
                           *F = ok_fig(m, TK_OOMFIG_FREE), *P = ok_fig(m, TK_OOMFIG_PROCESS_IN_USE),
                           *V = ok_fig(m, TK_OOMFIG_RESERVED);
    int torch = m->format != TK_OOMMSG_TF;
    int cap_first = R && T && R->bytes > T->bytes;
    /* fragmentation ranks first only when the split cache is the larger loss:
     * 379 MiB of scraps beside 1.6 GiB held outside the cache is not the cause */
    int frag = torch && R && U && U->bytes >= R->bytes && !cap_first;
    int frag_first = frag && (!m->have_outside || U->bytes >= m->outside);
    if (cap_first)
        add_diag(m, TK_DIAG_CAPACITY,
                 "capacity: the single request (%s) is larger than the whole card (%s): no setting of the cache or "
                 "restart makes it fit; the tensor itself must shrink (batch, sequence length, precision) or be split",
                 R->text, T->text);
    if (frag_first)
        add_diag(m, TK_DIAG_FRAGMENTATION,
                 "fragmentation: PyTorch holds %s reserved but unallocated, enough for the %s request, yet no cached "
                 "block is that large: the cache is split into pieces",
                 U->text, R->text);
    int dom_seq = 0, dom_hidden = 0, dom_towers = 0;
    int tf_dense = !torch && flattened_dense(m, &dom_seq, &dom_hidden, &dom_towers);
    if (tf_dense && R) {
        uint64_t train = R->overflow ? 0 : R->bytes * 4;
        add_diag(m, TK_DIAG_DOMINANT_LAYER,
                 "dominant_layer: the tensor [%lld,%lld] of %s is a Dense kernel%s%s%s over %lld = %d x %d x %d inputs, "
                 "i.e. %d flattened tower%s of %d tokens x %d hidden units, into %lld units: %s of weights alone; "
                 "training adds its gradient and Adam's two moments (%s in fp32), more than a 16 GB card holds",
                 (long long)m->shape[0], (long long)m->shape[1], R->text, m->node[0] ? " (node " : "", m->node,
                 m->node[0] ? ")" : "",
                 (long long)m->shape[0], dom_seq, dom_hidden, dom_towers, dom_towers, dom_towers > 1 ? "s" : "", dom_seq,
                 dom_hidden, (long long)m->shape[1], fmt(R->bytes, b1, sizeof b1), fmt(train, b2, sizeof b2));
    } else if (!torch && R) {
        add_diag(m, TK_DIAG_DOMINANT_LAYER, "dominant_layer: one tensor of shape [%lld%s] and type %s needs %s",
                 (long long)m->shape[0], m->rank > 1 ? ",..." : "", m->dtype, R->text);
    }
    if (torch && A && T && !cap_first && A->bytes * 2 >= T->bytes)
        add_diag(m, TK_DIAG_CAPACITY,
                 "capacity: live tensors (%s allocated by PyTorch) fill %.0f%% of the card (%s): the step needs more "
                 "than this card has",
                 A->text, 100.0 * (double)A->bytes / (double)T->bytes, T->text);
    else if (torch && A && T && R && !cap_first && A->bytes + R->bytes > T->bytes)
        add_diag(m, TK_DIAG_CAPACITY,
                 "capacity: live tensors (%s) plus the request (%s) come to %s, more than the whole card (%s)",
                 A->text, R->text, fmt(A->bytes + R->bytes, b1, sizeof b1), T->text);
    uint64_t ctx = m->card ? m->card->context_overhead : 0;
    if (torch && m->have_outside && m->outside >= 256 * MIB && T && m->outside * 20 >= T->bytes) {
        if (m->card && m->outside > ctx + 128 * MIB)
            add_diag(m, TK_DIAG_HEADROOM,
                     "headroom: %s of the card is held outside PyTorch's cache (total %s - reserved %s - free %s). The "
                     "CUDA context and library kernels take about %s on a %s; the other %s is another process or "
                     "another framework in this runtime (an earlier cell's model, TensorFlow, a second kernel)",
                     fmt(m->outside, b1, sizeof b1), T->text, V ? V->text : "?", F ? F->text : "?",
                     fmt(ctx, b2, sizeof b2), m->card->name, fmt(m->outside - ctx, b3, sizeof b3));
        else
            add_diag(m, TK_DIAG_HEADROOM,
                     "headroom: %s of the card is held outside PyTorch's cache (total %s - reserved %s - free %s): the "
                     "CUDA context and library kernels, and whatever else runs on the card",
                     fmt(m->outside, b1, sizeof b1), T->text, V ? V->text : "?", F ? F->text : "?");
    } else if (torch && P && T && F && V && m->format == TK_OOMMSG_TORCH_21) {
        uint64_t used = T->bytes > F->bytes ? T->bytes - F->bytes : 0;
        if (used > P->bytes + 256 * MIB && m->n_processes == 0)
            add_diag(m, TK_DIAG_HEADROOM,
                     "headroom: this process uses %s but %s of the card is in use: %s belongs to other processes",
                     P->text, fmt(used, b1, sizeof b1), fmt(used - P->bytes, b2, sizeof b2));
    }
    if (frag && !frag_first)
        add_diag(m, TK_DIAG_FRAGMENTATION,
                 "fragmentation: %s is reserved by PyTorch but unallocated, enough for the %s request, yet no cached "
                 "block is that large; less than what is held outside the cache, so not the main loss",
                 U->text, R->text);
    int any_unreliable = 0;
    for (int i = 0; i < TK_OOMFIG_COUNT; i++) any_unreliable |= m->fig[i].present && m->fig[i].unreliable;
    if (!m->n_diag && any_unreliable && R && F && F->bytes < R->bytes)
        add_diag(m, TK_DIAG_CAPACITY,
                 "capacity: the card had %s free for a %s request; the message's in-use figures cannot be true, so "
                 "who holds the memory cannot be read from it (check with nvidia-smi or torch.cuda.memory_summary())",
                 F->text, R->text);
    if (torch && R && T && !cap_first && R->bytes * 4 >= T->bytes)
        add_diag(m, TK_DIAG_DOMINANT_LAYER, "dominant_layer: one tensor of %s is %.0f%% of the card", R->text,
                 100.0 * (double)R->bytes / (double)T->bytes);
    const char *plat = platform ? platform : tk_gpu_platform_of(m->card);
    if (plat && n > 0) lottery_from_plans(m, plat, cards, n);
    else if (plat && m->card && torch && A && R) lottery_from_figures(m, plat, A->bytes);

    /* fixes, in the order of the diagnoses they answer */
    for (int i = 0; i < m->n_diag; i++) {
        switch (m->diag[i].kind) {
        case TK_DIAG_FRAGMENTATION:
            if (m->format == TK_OOMMSG_TORCH_21)
                add_fix(m, "let the cache grow segments instead of splitting them (first cell, before torch is imported)",
                        "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"\nimport torch");
            else if (m->format == TK_OOMMSG_TORCH_RESERVED)
                add_fix(m, "stop the cache from splitting large blocks (PyTorch 1.10+; first cell, before torch is imported)",
                        "import os\nos.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"max_split_size_mb:128\"\nimport torch");
            else
                add_fix(m, "return the split cache between steps (PyTorch <= 1.3 has no allocator settings)",
                        "optimizer.step()\noptimizer.zero_grad()\ntorch.cuda.empty_cache()");
            break;
        case TK_DIAG_HEADROOM:
            add_fix(m, "free what earlier cells hold on the card before building the model (or restart the runtime)",
                    "import gc, torch\ndel model, optimizer   # whatever an earlier cell left on the GPU\ngc.collect()\n"
                    "torch.cuda.empty_cache()\n!nvidia-smi   # any other process on the card?");
            break;
        case TK_DIAG_DOMINANT_LAYER:
            if (tf_dense) {
                add_fix(m, "a per-token span head instead of Dense over the flattened towers (768 x 2 weights, not "
                           "786432 x 1604)",
                        "start_end = tf.keras.layers.Dense(2)(context_bert_layer)   # [batch, 512, 2]\n"
                        "start_logits, end_logits = tf.unstack(start_end, axis=-1)");
                add_fix(m, "or pool the towers before the classifier",
                        "q = tf.keras.layers.GlobalAveragePooling1D()(questions_bert_layer)\n"
                        "c = tf.keras.layers.GlobalAveragePooling1D()(context_bert_layer)\n"
                        "out = tf.keras.layers.Dense(1604, activation=\"softmax\")(tf.keras.layers.Concatenate()([q, c]))");
            } else if (!torch) {
                add_fix(m, "halve the tensor: a smaller batch or mixed precision",
                        "tf.keras.mixed_precision.set_global_policy(\"mixed_float16\")\nmodel.fit(x, y, batch_size=8)");
            }
            break;
        case TK_DIAG_CAPACITY:
            if (!torch) break;
            add_fix(m, "half the batch per step, same effective batch (transformers)",
                    "TrainingArguments(..., per_device_train_batch_size=8, gradient_accumulation_steps=4)");
            add_fix(m, "shorter sequences: most texts need far fewer than 512 tokens",
                    "enc = tokenizer(texts, truncation=True, max_length=256, padding=\"longest\")");
            if (m->card && !tk_gpu_profile_fast_fp16(m->card)) {
                char t[240];
                snprintf(t, sizeof t, "mixed precision: on a %s (no tensor cores) fp16 saves activation memory but no "
                         "time", m->card->name);
                add_fix(m, t, "scaler = torch.cuda.amp.GradScaler()\nwith torch.autocast(\"cuda\", dtype=torch.float16):\n"
                              "    loss = model(**batch).loss\nscaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()");
            } else {
                add_fix(m, "mixed precision (fp16 halves activations and is faster on tensor cores)",
                        "scaler = torch.cuda.amp.GradScaler()\nwith torch.autocast(\"cuda\", dtype=torch.float16):\n"
                        "    loss = model(**batch).loss\nscaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()");
            }
            add_fix(m, "recompute activations in the backward pass (about 30% slower, far less memory)",
                    "model.gradient_checkpointing_enable()");
            break;
        case TK_DIAG_LOTTERY:
            add_fix(m, "see which card the runtime got before training, and plan for the smallest one",
                    "!nvidia-smi --query-gpu=name,memory.total --format=csv");
            break;
        default:
            break;
        }
    }
}

/* ---- reports ---------------------------------------------------------------------------- */

static const char *format_name(tk_oommsg_format f) {
    switch (f) {
    case TK_OOMMSG_TORCH_CACHED: return "PyTorch <= 1.3 (\"cached\" = reserved but unallocated)";
    case TK_OOMMSG_TORCH_RESERVED: return "PyTorch 1.4-2.0";
    case TK_OOMMSG_TORCH_21: return "PyTorch 2.1+";
    case TK_OOMMSG_TF: return "TensorFlow";
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
    fprintf(f, "OOM message: %s%s", format_name(m->format), m->spelled_capacty ? ", spelled \"capacty\"" : "");
    if (m->gpu_index >= 0) fprintf(f, ", GPU %d", m->gpu_index);
    fputc('\n', f);
    if (m->format == TK_OOMMSG_TF) {
        fputs("  tensor                shape [", f);
        for (int i = 0; i < m->rank && i < TK_OOMMSG_MAX_DIMS; i++) fprintf(f, "%s%lld", i ? "," : "", (long long)m->shape[i]);
        fprintf(f, "] type %s%s%s\n", m->dtype[0] ? m->dtype : "?", m->node[0] ? ", node " : "", m->node);
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

static const char *diag_id(tk_diag_kind k) {
    switch (k) {
    case TK_DIAG_DOMINANT_LAYER: return "dominant_layer";
    case TK_DIAG_DOMINANT_CATEGORY: return "dominant_category";
    case TK_DIAG_DATA_SPIKE: return "data_spike";
    case TK_DIAG_LOTTERY: return "card_lottery";
    case TK_DIAG_CAPACITY: return "capacity";
    case TK_DIAG_HEADROOM: return "headroom";
    case TK_DIAG_FRAGMENTATION: return "fragmentation";
    default: return "other";
    }
}

/* Every set and append is checked: a part that could not be built (out of
 * host memory) makes the whole answer NULL, never a shorter object. */
char *tk_oom_message_json(const tk_oom_message *m) {
    json_t *o = json_object();
    json_t *unrel = json_array(), *diags = json_array(), *fixes = json_array();
    int bad = !o || !unrel || !diags || !fixes;
    for (int i = 0; !bad && m && i < TK_OOMFIG_COUNT; i++) {
        const tk_oommsg_figure *g = &m->fig[i];
        bad |= json_object_set_new(o, FIG_NAMES[i], g->present && !g->overflow ? json_integer((json_int_t)g->bytes) : json_null());
        if (g->present && g->unreliable) bad |= json_array_append_new(unrel, json_string(FIG_NAMES[i]));
    }
    for (int i = 0; !bad && m && i < m->n_diag; i++)
        bad |= json_array_append_new(diags, json_pack("{s:s, s:s}", "id", diag_id(m->diag[i].kind), "text", m->diag[i].text));
    for (int i = 0; !bad && m && i < m->n_fixes; i++)
        bad |= json_array_append_new(fixes, json_pack("{s:s, s:s}", "text", m->fixes[i].text, "code", m->fixes[i].code));
    if (!bad) bad |= json_object_set_new(o, "card", m && m->card_text[0] ? json_string(m->card_text) : json_null());
    /* set_new takes each array's reference, whatever it returns */
    bad |= o ? json_object_set_new(o, "unreliable", unrel) : (json_decref(unrel), -1);
    bad |= o ? json_object_set_new(o, "diagnoses", diags) : (json_decref(diags), -1);
    bad |= o ? json_object_set_new(o, "fixes", fixes) : (json_decref(fixes), -1);
    char *s = bad ? NULL : json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

char *tk_cards_sentence(const tk_card_fit *cards, int n, char *buf, size_t buf_n) {
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
    if (!nn) snprintf(buf, buf_n, "fits on every card (%s): the runtime's card does not matter", yes);
    else if (!ny) snprintf(buf, buf_n, "fits on none of them (%s): change the config before hoping for a bigger card", no);
    else snprintf(buf, buf_n, "fits on %s; not on %s: which card the runtime gets decides", yes, no);
    return buf;
}
