/* test_alloc.c — the caching allocator against PyTorch's rules (docs/FACTS.md):
 * rounding, pools, splitting, coalescing, best fit, fragmentation OOMs,
 * empty_cache, the retry after releasing the cache, per-owner/per-category
 * accounting under a seeded random script, the peak breakdown, the event
 * hook and the JSON snapshot. Segments come from a host backend (malloc), so
 * ASan sees every segment the allocator forgets. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tk_gpu.h"
#include "tk_test.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1 << 20)

typedef struct { size_t live, n_alloc, n_free; } host_mem;

static int host_seg_alloc(void *ctx, size_t bytes, void **ptr) {
    host_mem *h = ctx;
    *ptr = malloc(bytes);
    if (!*ptr) return -1;
    h->live += bytes;
    h->n_alloc++;
    return 0;
}

static void host_seg_free(void *ctx, void *ptr, size_t bytes) {
    host_mem *h = ctx;
    free(ptr);
    h->live -= bytes;
    h->n_free++;
}

/* Segments are never dereferenced by the allocator, so for big sizes the
 * tests use a counting source with fake addresses (the meta idea). */
typedef struct { uintptr_t next; size_t live; } fake_mem;

static int fake_seg_alloc(void *ctx, size_t bytes, void **ptr) {
    fake_mem *f = ctx;
    *ptr = (void *)f->next;
    f->next += (bytes + (2 * MiB - 1)) / (2 * MiB) * (2 * MiB);
    f->live += bytes;
    return 0;
}

static void fake_seg_free(void *ctx, void *ptr, size_t bytes) {
    (void)ptr;
    ((fake_mem *)ctx)->live -= bytes;
}

static tk_alloc *fake_alloc(fake_mem *f, size_t cap) {
    f->next = (uintptr_t)1 << 40;
    f->live = 0;
    return tk_alloc_new((tk_devmem){fake_seg_alloc, fake_seg_free, f}, cap);
}

static tk_tag tag(tk_alloc *a, const char *owner, tk_cat c) {
    tk_tag t = {c, tk_alloc_owner_id(a, owner)};
    return t;
}

static void *must_alloc(tk_alloc *a, size_t n, tk_tag t) {
    void *p = NULL;
    TK_CHECK(tk_alloc_malloc(a, n, t, &p, NULL) == TK_OK);
    return p;
}

static tk_alloc_stats stats(tk_alloc *a) {
    tk_alloc_stats s;
    tk_alloc_stats_get(a, &s);
    return s;
}

/* Sum of per-owner and per-category live bytes equals allocated. */
static int accounting_ok(tk_alloc *a) {
    tk_alloc_stats s = stats(a);
    size_t by_owner = 0, by_cat = 0, at_peak = 0, cat_peak = 0;
    for (int o = 0; o < tk_alloc_n_owners(a); o++)
        for (int c = 0; c < TK_CAT_COUNT; c++) {
            by_owner += tk_alloc_owner_live(a, o, (tk_cat)c);
            at_peak += tk_alloc_owner_at_peak(a, o, (tk_cat)c);
        }
    for (int c = 0; c < TK_CAT_COUNT; c++) { by_cat += s.by_cat[c]; cat_peak += s.by_cat_at_peak[c]; }
    return by_owner == s.allocated && by_cat == s.allocated && at_peak == s.allocated_peak &&
           cat_peak == s.allocated_peak && s.allocated <= s.reserved &&
           s.requested <= s.allocated && s.allocated_peak >= s.allocated &&
           (!s.capacity || s.reserved <= s.capacity);
}

static void test_rounding_and_pools(void) {
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 0);
    tk_tag t = tag(a, "x", TK_CAT_ACT);
    void *p = NULL;
    TK_CHECK(tk_alloc_malloc(a, 0, t, &p, NULL) == TK_OK && p == NULL);
    void *p1 = must_alloc(a, 1, t);
    tk_alloc_stats s = stats(a);
    TK_CHECK_EQ_INT(s.allocated, 512);
    TK_CHECK_EQ_INT(s.requested, 1);
    TK_CHECK_EQ_INT(s.reserved, 2 * MiB); /* small pool: a 2 MiB segment */
    void *p2 = must_alloc(a, 513, t);
    TK_CHECK_EQ_INT(stats(a).allocated, 512 + 1024);
    TK_CHECK((char *)p2 == (char *)p1 + 512); /* split from the same segment */
    must_alloc(a, MiB, t);                     /* still small: 1 MiB fits the 2 MiB segment */
    TK_CHECK_EQ_INT(stats(a).reserved, 2 * MiB);
    must_alloc(a, MiB + 1, t);                 /* large pool: a 20 MiB segment */
    TK_CHECK_EQ_INT(stats(a).reserved, 22 * MiB);
    TK_CHECK_EQ_INT(stats(a).allocated, 512 + 1024 + MiB + MiB + 512);
    /* a cached large block is reused before any new segment, whatever the size */
    must_alloc(a, 10 * MiB, t);
    TK_CHECK_EQ_INT(stats(a).reserved, 22 * MiB);
    TK_CHECK(accounting_ok(a));
    tk_alloc_destroy(&a);
    a = fake_alloc(&f, 0);
    t = tag(a, "x", TK_CAT_ACT);
    must_alloc(a, 10 * MiB, t); /* >= 10 MiB and nothing cached: its own segment */
    TK_CHECK_EQ_INT(stats(a).reserved, 10 * MiB);
    must_alloc(a, 11 * MiB, t); /* 12 MiB segment, remainder 1 MiB is not > 1 MiB: whole block */
    TK_CHECK_EQ_INT(stats(a).reserved, 22 * MiB);
    TK_CHECK_EQ_INT(stats(a).allocated, 22 * MiB);
    TK_CHECK_EQ_INT(stats(a).requested, 21 * MiB);
    TK_CHECK_EQ_INT(stats(a).n_segments, 2);
    TK_CHECK(accounting_ok(a));
    tk_alloc_destroy(&a);
    TK_CHECK(a == NULL);
    TK_CHECK_EQ_INT(f.live, 0);
    tk_alloc_destroy(&a); /* no-op on NULL */
}

static void test_split_rules(void) {
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 0);
    tk_tag t = tag(a, "x", TK_CAT_ACT);
    /* large pool: 19 MiB from a 20 MiB segment leaves 1 MiB, not split */
    void *p = must_alloc(a, 19 * MiB, t);
    TK_CHECK_EQ_INT(stats(a).allocated, 20 * MiB);
    tk_alloc_free(a, p);
    /* 18.5 MiB leaves 1.5 MiB > 1 MiB: split */
    p = must_alloc(a, 18 * MiB + 512 * KiB, t);
    TK_CHECK_EQ_INT(stats(a).allocated, 18 * MiB + 512 * KiB);
    TK_CHECK_EQ_INT(stats(a).largest_free_block, MiB + 512 * KiB);
    TK_CHECK_EQ_INT(stats(a).inactive_split, MiB + 512 * KiB);
    tk_alloc_free(a, p);
    TK_CHECK_EQ_INT(stats(a).largest_free_block, 20 * MiB);
    TK_CHECK_EQ_INT(stats(a).inactive_split, 0);
    /* small pool: 2 MiB - 512 leaves exactly 512: split */
    void *q = must_alloc(a, 2 * MiB - 1024, t);
    void *r = must_alloc(a, 1024, t); /* 1 MiB limit: this one is small too */
    TK_CHECK_EQ_INT(stats(a).n_segments, 2);
    tk_alloc_free(a, q);
    tk_alloc_free(a, r);
    TK_CHECK(accounting_ok(a));
    tk_alloc_destroy(&a);
}

static void test_coalesce_and_best_fit(void) {
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 0);
    tk_tag t = tag(a, "x", TK_CAT_TEMP);
    char *b[6];
    for (int i = 0; i < 6; i++) b[i] = must_alloc(a, 4 * KiB, t);
    for (int i = 1; i < 6; i++) TK_CHECK(b[i] == b[i - 1] + 4 * KiB);
    tk_alloc_free(a, b[1]);
    tk_alloc_free(a, b[3]);
    tk_alloc_free(a, b[2]); /* merges with both neighbours: 12 KiB at b[1] */
    char *c = must_alloc(a, 12 * KiB, t);
    TK_CHECK(c == b[1]);
    /* best fit: a 4 KiB hole (b[4]) and the rest of the segment; 4 KiB goes to b[4] */
    tk_alloc_free(a, b[4]);
    char *d = must_alloc(a, 4 * KiB, t);
    TK_CHECK(d == b[4]);
    /* between equal holes (b[0] and b[4]), the earlier position wins */
    tk_alloc_free(a, b[0]);
    tk_alloc_free(a, d);
    char *e = must_alloc(a, 4 * KiB, t);
    TK_CHECK(e == b[0]);
    tk_alloc_free(a, e);
    tk_alloc_free(a, c);
    tk_alloc_free(a, b[5]);
    tk_alloc_stats s = stats(a);
    TK_CHECK_EQ_INT(s.allocated, 0);
    TK_CHECK_EQ_INT(s.largest_free_block, 2 * MiB); /* everything merged back */
    TK_CHECK_EQ_INT(s.n_alloc, s.n_free);
    tk_alloc_destroy(&a);
}

static void test_fragmentation_oom(void) {
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 20 * MiB);
    tk_tag t = tag(a, "bert.encoder.layer.3.output.dense", TK_CAT_ACT);
    void *p[5];
    for (int i = 0; i < 5; i++) p[i] = must_alloc(a, 4 * MiB, t);
    TK_CHECK_EQ_INT(stats(a).reserved, 20 * MiB);
    tk_alloc_free(a, p[1]);
    tk_alloc_free(a, p[3]);
    tk_oom o;
    void *q = (void *)1;
    TK_CHECK(tk_alloc_malloc(a, 6 * MiB, t, &q, &o) == TK_EOOM);
    TK_CHECK(q == NULL);
    TK_CHECK_EQ_INT(o.requested, 6 * MiB);
    TK_CHECK_EQ_INT(o.rounded, 6 * MiB);
    TK_CHECK_EQ_INT(o.capacity, 20 * MiB);
    TK_CHECK_EQ_INT(o.reserved, 20 * MiB);
    TK_CHECK_EQ_INT(o.allocated, 12 * MiB);
    TK_CHECK_EQ_INT(o.free_bytes, 0);
    TK_CHECK_EQ_INT(o.largest_free_block, 4 * MiB);
    TK_CHECK_EQ_INT(o.fragmentation, 1);
    TK_CHECK_STR(o.owner_name, "bert.encoder.layer.3.output.dense");
    TK_CHECK_EQ_INT(o.by_cat[TK_CAT_ACT], 12 * MiB);
    TK_CHECK_EQ_INT(o.n_top, 1);
    TK_CHECK_EQ_INT(o.top[0].bytes, 12 * MiB);
    tk_alloc_stats s = stats(a);
    TK_CHECK_EQ_INT(s.n_ooms, 1);
    TK_CHECK_EQ_INT(s.n_retries, 1);
    TK_CHECK_EQ_INT(s.allocated, 12 * MiB); /* nothing changed */
    /* a request larger than all free memory is not fragmentation */
    TK_CHECK(tk_alloc_malloc(a, 9 * MiB, t, &q, &o) == TK_EOOM);
    TK_CHECK_EQ_INT(o.fragmentation, 0);
    /* 4 MiB still fits in a hole */
    void *r = must_alloc(a, 4 * MiB, t);
    TK_CHECK(r == p[1]);
    tk_alloc_free(a, r);
    TK_CHECK(accounting_ok(a));
    tk_alloc_destroy(&a);
    TK_CHECK_EQ_INT(f.live, 0);
}

static void test_empty_cache(void) {
    host_mem h = {0};
    tk_alloc *a = tk_alloc_new((tk_devmem){host_seg_alloc, host_seg_free, &h}, 0);
    tk_tag t = tag(a, "x", TK_CAT_PARAM);
    void *s1 = must_alloc(a, 100 * KiB, t);      /* small segment A */
    void *l1 = must_alloc(a, 3 * MiB, t);        /* large segment B */
    void *l2 = must_alloc(a, 3 * MiB, t);        /* same segment B */
    void *big = must_alloc(a, 15 * MiB, t);      /* does not fit B's 14 MiB: own 16 MiB segment C */
    TK_CHECK_EQ_INT(stats(a).n_segments, 3);
    tk_alloc_free(a, l1);
    tk_alloc_free(a, big);
    tk_alloc_empty_cache(a); /* only C is fully free; B keeps a live block */
    tk_alloc_stats s = stats(a);
    TK_CHECK_EQ_INT(s.n_segments, 2);
    TK_CHECK_EQ_INT(s.reserved, 22 * MiB);
    TK_CHECK_EQ_INT(s.n_segments_free, 1);
    TK_CHECK_EQ_INT(h.live, 22 * MiB);
    tk_alloc_free(a, l2);
    tk_alloc_free(a, s1);
    tk_alloc_empty_cache(a);
    s = stats(a);
    TK_CHECK_EQ_INT(s.reserved, 0);
    TK_CHECK_EQ_INT(s.n_segments, 0);
    TK_CHECK_EQ_INT(h.live, 0);
    TK_CHECK_EQ_INT(s.reserved_peak, 38 * MiB);
    tk_alloc_destroy(&a);
    TK_CHECK_EQ_INT(h.n_alloc, h.n_free);
}

static void test_retry_after_release(void) {
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 17 * MiB);
    tk_tag t = tag(a, "x", TK_CAT_ACT);
    void *s = must_alloc(a, 1000, t);
    tk_alloc_free(a, s); /* a cached, fully free 2 MiB small segment */
    void *p = NULL;
    TK_CHECK(tk_alloc_malloc(a, 15 * MiB, t, &p, NULL) == TK_OK);
    tk_alloc_stats st = stats(a);
    TK_CHECK_EQ_INT(st.n_retries, 1);
    TK_CHECK_EQ_INT(st.n_ooms, 0);
    TK_CHECK_EQ_INT(st.reserved, 16 * MiB); /* 2 MiB cache released, 16 MiB segment */
    TK_CHECK_EQ_INT(st.n_segments, 1);
    TK_CHECK_EQ_INT(st.n_segments_free, 1);
    tk_alloc_free(a, p);
    tk_alloc_destroy(&a);
}

/* A device that itself runs out (capacity 0 = no simulated limit). */
typedef struct { size_t live, limit; } tight_mem;
static int tight_alloc(void *ctx, size_t bytes, void **ptr) {
    tight_mem *m = ctx;
    if (m->live + bytes > m->limit) return 2;
    *ptr = malloc(bytes);
    if (!*ptr) return 1;
    m->live += bytes;
    return 0;
}
static void tight_free(void *ctx, void *ptr, size_t bytes) {
    ((tight_mem *)ctx)->live -= bytes;
    free(ptr);
}

static void test_device_failure_is_oom(void) {
    tight_mem m = {0, 4 * MiB};
    tk_alloc *a = tk_alloc_new((tk_devmem){tight_alloc, tight_free, &m}, 0);
    tk_tag t = tag(a, "y", TK_CAT_GRAD);
    void *p1 = must_alloc(a, 600 * KiB, t), *p2 = must_alloc(a, 600 * KiB, t);
    void *p3 = must_alloc(a, 600 * KiB, t);
    void *q = NULL;
    tk_oom o;
    TK_CHECK(tk_alloc_malloc(a, 2 * MiB, t, &q, &o) == TK_EOOM); /* needs 20 MiB */
    TK_CHECK_EQ_INT(o.capacity, 0);
    TK_CHECK_EQ_INT(o.reserved, 2 * MiB); /* the three share one small segment */
    tk_alloc_free(a, p1);
    tk_alloc_free(a, p2);
    tk_alloc_free(a, p3);
    TK_CHECK(accounting_ok(a));
    tk_alloc_destroy(&a);
    TK_CHECK_EQ_INT(m.live, 0);
}

/* Mirrors the allocator's owner x category books and its peak breakdown from
 * the outside, over thousands of seeded random events. */
#define NOWN 13
typedef struct { void *p; size_t bytes; int owner; tk_cat cat; } live_t;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

static size_t rand_size(uint64_t *s) {
    switch (rng_next(s) % 6) {
    case 0: return 1 + rng_next(s) % 512;
    case 1: return 1 + rng_next(s) % (64 * KiB);
    case 2: return 1 + rng_next(s) % MiB;
    case 3: return MiB + rng_next(s) % (9 * MiB);
    case 4: return 10 * MiB + rng_next(s) % (30 * MiB);
    default: return 512 * (1 + rng_next(s) % 64);
    }
}

static void test_random_accounting(void) {
    uint64_t seed = 0x5eed1234abcdull;
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 400 * MiB);
    int own[NOWN];
    char name[32];
    for (int i = 0; i < NOWN; i++) {
        snprintf(name, sizeof name, "bert.encoder.layer.%d", i);
        own[i] = tk_alloc_owner_id(a, name);
    }
    TK_CHECK_EQ_INT(tk_alloc_owner_id(a, "bert.encoder.layer.4"), own[4]); /* interned once */
    static live_t live[4096];
    int nlive = 0, bad = 0, ooms = 0;
    static size_t mine[NOWN][TK_CAT_COUNT], mine_peak[NOWN][TK_CAT_COUNT], owner_peak[NOWN];
    memset(mine, 0, sizeof mine);
    memset(mine_peak, 0, sizeof mine_peak);
    memset(owner_peak, 0, sizeof owner_peak);
    size_t alloc_now = 0, alloc_peak = 0;
    for (int ev = 0; ev < 6000; ev++) {
        int do_free = nlive > 0 && (nlive >= 4000 || rng_next(&seed) % 100 < 45);
        if (do_free) {
            int k = (int)(rng_next(&seed) % (uint64_t)nlive);
            tk_alloc_free(a, live[k].p);
            mine[live[k].owner][live[k].cat] -= live[k].bytes;
            alloc_now -= live[k].bytes;
            live[k] = live[--nlive];
        } else {
            size_t n = rand_size(&seed);
            int o = (int)(rng_next(&seed) % NOWN);
            tk_cat c = (tk_cat)(rng_next(&seed) % TK_CAT_COUNT);
            size_t before = stats(a).allocated;
            void *p = NULL;
            tk_status st = tk_alloc_malloc(a, n, (tk_tag){c, own[o]}, &p, NULL);
            if (st == TK_EOOM) { ooms++; if (stats(a).allocated != before) bad++; continue; }
            size_t got = stats(a).allocated - before;
            if (got < n || got % 512) bad++;
            live[nlive++] = (live_t){p, got, o, c};
            mine[o][c] += got;
            alloc_now += got;
            size_t tot = 0;
            for (int cc = 0; cc < TK_CAT_COUNT; cc++) tot += mine[o][cc];
            if (tot > owner_peak[o]) owner_peak[o] = tot;
            if (alloc_now > alloc_peak) { alloc_peak = alloc_now; memcpy(mine_peak, mine, sizeof mine); }
        }
        if (!accounting_ok(a)) bad++;
        if (stats(a).allocated != alloc_now) bad++;
        if (ev % 97 == 0) {
            for (int o = 0; o < NOWN; o++)
                for (int c = 0; c < TK_CAT_COUNT; c++)
                    if (tk_alloc_owner_live(a, own[o], (tk_cat)c) != mine[o][c]) bad++;
        }
        if (ev == 3000) tk_alloc_empty_cache(a);
    }
    TK_CHECK_EQ_INT(bad, 0);
    TK_CHECK(ooms > 0); /* the script does reach the capacity */
    TK_CHECK_EQ_INT(stats(a).allocated_peak, alloc_peak);
    int peak_bad = 0;
    for (int o = 0; o < NOWN; o++) {
        if (tk_alloc_owner_peak(a, own[o]) != owner_peak[o]) peak_bad++;
        for (int c = 0; c < TK_CAT_COUNT; c++)
            if (tk_alloc_owner_at_peak(a, own[o], (tk_cat)c) != mine_peak[o][c]) peak_bad++;
    }
    TK_CHECK_EQ_INT(peak_bad, 0);
    while (nlive) tk_alloc_free(a, live[--nlive].p);
    tk_alloc_stats s = stats(a);
    TK_CHECK_EQ_INT(s.allocated, 0);
    TK_CHECK_EQ_INT(s.requested, 0);
    TK_CHECK_EQ_INT(s.inactive_split, 0);
    TK_CHECK_EQ_INT(s.n_ooms, (uint64_t)ooms);
    tk_alloc_empty_cache(a);
    TK_CHECK_EQ_INT(stats(a).reserved, 0);
    TK_CHECK_EQ_INT(f.live, 0);
    tk_alloc_destroy(&a);
}

static void test_reset_peak(void) {
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 0);
    tk_tag t1 = tag(a, "a", TK_CAT_ACT), t2 = tag(a, "b", TK_CAT_GRAD);
    void *p = must_alloc(a, 8 * MiB, t1);
    tk_alloc_free(a, p);
    void *q = must_alloc(a, 2 * MiB, t2);
    TK_CHECK_EQ_INT(stats(a).allocated_peak, 8 * MiB);
    TK_CHECK_EQ_INT(tk_alloc_owner_at_peak(a, t1.owner, TK_CAT_ACT), 8 * MiB);
    TK_CHECK_EQ_INT(tk_alloc_owner_at_peak(a, t2.owner, TK_CAT_GRAD), 0);
    tk_alloc_reset_peak(a);
    TK_CHECK_EQ_INT(stats(a).allocated_peak, 2 * MiB);
    TK_CHECK_EQ_INT(tk_alloc_owner_at_peak(a, t1.owner, TK_CAT_ACT), 0);
    TK_CHECK_EQ_INT(tk_alloc_owner_at_peak(a, t2.owner, TK_CAT_GRAD), 2 * MiB);
    TK_CHECK_EQ_INT(tk_alloc_owner_peak(a, t1.owner), 0);
    TK_CHECK_EQ_INT(stats(a).by_cat_at_peak[TK_CAT_GRAD], 2 * MiB);
    tk_alloc_free(a, q);
    TK_CHECK_EQ_INT(tk_alloc_owner_at_peak(a, t2.owner, TK_CAT_GRAD), 2 * MiB);
    TK_CHECK_STR(tk_alloc_owner_name(a, t2.owner), "b");
    tk_alloc_destroy(&a);
}

typedef struct { int n; int is_alloc[16]; size_t bytes[16]; tk_tag tag[16]; } evlog;
static void on_event(void *ud, int is_alloc, size_t bytes, tk_tag t) {
    evlog *l = ud;
    if (l->n < 16) { l->is_alloc[l->n] = is_alloc; l->bytes[l->n] = bytes; l->tag[l->n] = t; }
    l->n++;
}

static void test_event_hook(void) {
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 0);
    evlog l = {0};
    tk_alloc_set_event_hook(a, on_event, &l);
    tk_tag t = tag(a, "x", TK_CAT_INPUT);
    void *p = must_alloc(a, 100, t);
    tk_alloc_free(a, p);
    TK_CHECK_EQ_INT(l.n, 2);
    TK_CHECK(l.is_alloc[0] == 1 && l.bytes[0] == 512 && l.tag[0].cat == TK_CAT_INPUT);
    TK_CHECK(l.is_alloc[1] == 0 && l.bytes[1] == 512 && l.tag[1].owner == t.owner);
    tk_alloc_set_event_hook(a, NULL, NULL);
    p = must_alloc(a, 100, t);
    tk_alloc_free(a, p);
    TK_CHECK_EQ_INT(l.n, 2);
    tk_alloc_destroy(&a);
}

static void test_bad_tags(void) {
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 0);
    void *p = (void *)1;
    TK_CHECK(tk_alloc_malloc(a, 10, (tk_tag){TK_CAT_COUNT, 0}, &p, NULL) == TK_EINVAL);
    TK_CHECK(p == NULL);
    TK_CHECK(tk_alloc_malloc(a, 10, (tk_tag){TK_CAT_ACT, 99}, &p, NULL) == TK_EINVAL);
    /* a negative owner is booked under "(unowned)" */
    TK_CHECK(tk_alloc_malloc(a, 10, (tk_tag){TK_CAT_ACT, -1}, &p, NULL) == TK_OK);
    int id = tk_alloc_owner_id(a, NULL);
    TK_CHECK_STR(tk_alloc_owner_name(a, id), "(unowned)");
    TK_CHECK_EQ_INT(tk_alloc_owner_live(a, id, TK_CAT_ACT), 512);
    tk_alloc_free(a, p);
    tk_alloc_free(a, NULL);
    TK_CHECK(tk_alloc_new((tk_devmem){0}, 0) == NULL);
    tk_alloc_destroy(&a);
}

static void test_many_owners(void) {
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 0);
    char name[64];
    int bad = 0;
    for (int i = 0; i < 1500; i++) {
        snprintf(name, sizeof name, "bert.encoder.layer.%d.attention.self.query", i);
        if (tk_alloc_owner_id(a, name) != i) bad++;
    }
    for (int i = 1499; i >= 0; i--) {
        snprintf(name, sizeof name, "bert.encoder.layer.%d.attention.self.query", i);
        if (tk_alloc_owner_id(a, name) != i) bad++;
        if (strcmp(tk_alloc_owner_name(a, i), name) != 0) bad++;
    }
    TK_CHECK_EQ_INT(bad, 0);
    TK_CHECK_EQ_INT(tk_alloc_n_owners(a), 1500);
    void *p = must_alloc(a, 4096, (tk_tag){TK_CAT_OPTIM, 1234});
    TK_CHECK_EQ_INT(tk_alloc_owner_live(a, 1234, TK_CAT_OPTIM), 4096);
    TK_CHECK_EQ_INT(tk_alloc_owner_at_peak(a, 1234, TK_CAT_OPTIM), 4096);
    tk_alloc_free(a, p);
    TK_CHECK(accounting_ok(a));
    tk_alloc_destroy(&a);
}

static void test_snapshot_json(void) {
    fake_mem f;
    tk_alloc *a = fake_alloc(&f, 64 * MiB);
    tk_tag t = tag(a, "classifier", TK_CAT_PARAM);
    void *p = must_alloc(a, 1000, t);
    void *q = must_alloc(a, 5 * MiB, tag(a, "bert.pooler.dense", TK_CAT_GRAD));
    char *s = tk_alloc_snapshot_json(a);
    TK_CHECK(s != NULL);
    json_error_t je;
    json_t *j = s ? json_loads(s, 0, &je) : NULL;
    TK_CHECK(j != NULL);
    if (j) {
        json_t *c = json_object_get(j, "counters");
        TK_CHECK_EQ_INT(json_integer_value(json_object_get(c, "allocated")), 1024 + 5 * MiB);
        TK_CHECK_EQ_INT(json_integer_value(json_object_get(c, "reserved")), 22 * MiB);
        TK_CHECK_EQ_INT(json_integer_value(json_object_get(c, "capacity")), 64 * MiB);
        json_t *segs = json_object_get(j, "segments");
        TK_CHECK_EQ_INT(json_array_size(segs), 2);
        json_t *b0 = json_array_get(json_object_get(json_array_get(segs, 0), "blocks"), 0);
        TK_CHECK_STR(json_string_value(json_object_get(b0, "owner")), "classifier");
        TK_CHECK_STR(json_string_value(json_object_get(b0, "category")), "param");
        TK_CHECK_EQ_INT(json_integer_value(json_object_get(b0, "requested")), 1000);
        json_t *ow = json_object_get(j, "owners");
        TK_CHECK_EQ_INT(json_array_size(ow), 2);
        TK_CHECK_EQ_INT(json_integer_value(json_object_get(
            json_object_get(json_array_get(ow, 1), "by_cat"), "grad")), 5 * MiB);
        json_decref(j);
    }
    free(s);
    tk_alloc_free(a, p);
    tk_alloc_free(a, q);
    tk_alloc_destroy(&a);
}

int main(void) {
    TK_RUN(test_rounding_and_pools);
    TK_RUN(test_split_rules);
    TK_RUN(test_coalesce_and_best_fit);
    TK_RUN(test_fragmentation_oom);
    TK_RUN(test_empty_cache);
    TK_RUN(test_retry_after_release);
    TK_RUN(test_device_failure_is_oom);
    TK_RUN(test_random_accounting);
    TK_RUN(test_reset_peak);
    TK_RUN(test_event_hook);
    TK_RUN(test_bad_tags);
    TK_RUN(test_many_owners);
    TK_RUN(test_snapshot_json);
    return tk_test_done();
}
