/* alloc.c — the tagged caching allocator, with the semantics users know from
 * PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp).
 *
 * What it does: requests are rounded up to 512 B; requests of <= 1 MiB are
 * served from the small pool (2 MiB segments), larger ones from the large pool
 * (20 MiB segments, or a segment of their own rounded to 2 MiB when >= 10 MiB).
 * A free block is chosen best-fit by (size, position), split when the
 * remainder is worth keeping (small: >= 512 B; large: > 1 MiB; otherwise the
 * whole block counts as allocated), and merged with free neighbours on free.
 * When a segment cannot be had, every fully free cached segment is released
 * and the request retried once (n_retries); then it is an OOM (n_ooms) with a
 * tk_oom record. One stream only.
 *
 * Chaos switch (tk_alloc_fail_segment_after): the Nth segment request fails,
 * and so does the retry of the malloc call it belongs to, so the failure
 * reaches the caller as an OOM exactly once; later requests succeed again.
 *
 * Guarantees: every live byte is attributed to an (owner, category) and the
 * per-owner and per-category totals equal `allocated` after every event; a
 * failed request changes nothing but the counters; nothing here aborts.
 *
 * Position order: ties between equal-sized free blocks are broken by
 * (segment creation order, offset in segment) instead of the raw device
 * address. Where addresses grow with allocation order (as cudaMalloc's
 * usually do) this is PyTorch's order; unlike raw addresses it is the same on
 * meta, cpu and cuda, which is what makes a planned step replay the real
 * step's allocation sequence exactly.
 *
 * Data structures: free blocks of each pool sit in a treap keyed by
 * (size, segment id, offset), so best fit is one O(log n) descent; live blocks
 * sit in an open-addressing hash map keyed by address for free(); block
 * structs are recycled through a free list so the cached path does not call
 * malloc. Per-owner live bytes are a dense owners x categories array.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tk_gpu.h"
#include "tk_host_mem.h"

#define KMIN_BLOCK   ((size_t)512)
#define KSMALL_SIZE  ((size_t)1 << 20)   /* largest small-pool request */
#define KSMALL_SEG   ((size_t)2 << 20)
#define KLARGE_SEG   ((size_t)20 << 20)
#define KMIN_LARGE_ALLOC ((size_t)10 << 20)
#define KROUND_LARGE ((size_t)2 << 20)

enum { POOL_SMALL = 0, POOL_LARGE = 1 };

typedef struct seg seg;
typedef struct blk blk;

struct blk {
    size_t size;          /* bytes in this block (rounded) */
    size_t req;           /* bytes the caller asked (live blocks) */
    size_t off;           /* offset inside the segment */
    seg *s;
    blk *prev, *next;     /* neighbours inside the segment, address order */
    blk *l, *r;           /* treap children (free blocks only) */
    uint32_t prio;        /* treap priority */
    int live;
    tk_tag tag;
    const char *phase;    /* the allocator's phase when this block was handed out */
};

struct seg {
    char *addr;           /* device address (opaque; never dereferenced here) */
    size_t size;
    uint64_t id;          /* creation order: the position tie-break */
    int pool;
    size_t live_bytes;    /* bytes of live blocks inside */
    size_t n_live;
    blk *first;
    seg *prev, *next;     /* all segments */
};

typedef struct { uintptr_t key; blk *b; } slot;

struct tk_alloc {
    tk_devmem dev;
    size_t capacity;
    blk *pool_root[2];
    seg *segs;
    uint64_t next_seg_id;
    uint32_t rng;

    slot *tab;            /* live blocks by address */
    size_t tab_cap, tab_n;

    blk *spare;           /* recycled block structs (linked through ->next) */

    /* counters */
    size_t allocated, allocated_peak, requested, requested_peak, reserved, reserved_peak;
    uint64_t n_alloc, n_free, n_segments_alloc, n_segments_free, n_retries, n_ooms;
    size_t n_segments;
    size_t by_cat[TK_CAT_COUNT];

    /* owners */
    int n_owners, owners_cap;
    char **owner_names;
    int *owner_index;          /* open addressing by name hash: id + 1, 0 = empty */
    size_t owner_index_cap;
    size_t *owner_live;        /* [owner * TK_CAT_COUNT + cat] */
    size_t *owner_total;       /* [owner] */
    size_t *owner_peak;        /* [owner] */
    size_t *at_peak;           /* [owner * TK_CAT_COUNT + cat] when allocated peaked */
    size_t by_cat_at_peak[TK_CAT_COUNT];
    /* 1: the current state is the peak state and at_peak has not been copied
     * yet. The state at a peak is the state just before the next free (an
     * allocation in between would set a new peak), so the copy is made then:
     * once per peak, not once per allocation. */
    int peak_live;

    tk_alloc_event_fn hook;
    void *hook_ud;
    tk_alloc_event *hist;      /* ring of the last hist_cap events; NULL: not recording */
    size_t hist_cap;
    uint64_t hist_seq;         /* events recorded so far (the ring holds the last hist_cap) */
    const char *phase;         /* tk_alloc_set_phase; borrowed literal */
    uint64_t fail_countdown;   /* chaos: segment requests until one fails */
    int fail_this_call;        /* chaos: the failing malloc call fails its retry too */
    int host_failed;           /* segment_new: the host (not the device) ran out */
};

/* One store in the ring; nothing else runs when history is off. */
static void hist_add(tk_alloc *a, int kind, const void *addr, size_t size, size_t req, tk_tag tag,
                     const char *phase) {
    if (!a->hist) return;
    tk_alloc_event *e = &a->hist[a->hist_seq % a->hist_cap];
    e->addr = (uint64_t)(uintptr_t)addr;
    e->size = size;
    e->req = req;
    e->seq = a->hist_seq++;
    e->kind = (uint8_t)kind;
    int blockish = kind == TK_AEV_ALLOC || kind == TK_AEV_FREE || kind == TK_AEV_OOM;
    e->owner = blockish ? tag.owner : -1;
    e->cat = blockish ? (uint8_t)tag.cat : 0;
    e->phase = blockish ? phase : NULL;
}

/* ---- treap of free blocks, keyed by (size, segment id, offset) ---------- */

static int blk_less(const blk *a, const blk *b) {
    if (a->size != b->size) return a->size < b->size;
    if (a->s->id != b->s->id) return a->s->id < b->s->id;
    return a->off < b->off;
}

static uint32_t next_prio(tk_alloc *a) {
    uint32_t x = a->rng; /* xorshift32: fixed seed keeps runs reproducible */
    x ^= x << 13; x ^= x >> 17; x ^= x << 5;
    return a->rng = x;
}

static blk *rot_right(blk *t) { blk *l = t->l; t->l = l->r; l->r = t; return l; }
static blk *rot_left(blk *t) { blk *r = t->r; t->r = r->l; r->l = t; return r; }

static blk *treap_insert(blk *t, blk *b) {
    if (!t) return b;
    if (blk_less(b, t)) {
        t->l = treap_insert(t->l, b);
        if (t->l->prio > t->prio) t = rot_right(t);
    } else {
        t->r = treap_insert(t->r, b);
        if (t->r->prio > t->prio) t = rot_left(t);
    }
    return t;
}

static blk *treap_merge(blk *l, blk *r) {
    if (!l) return r;
    if (!r) return l;
    if (l->prio > r->prio) { l->r = treap_merge(l->r, r); return l; }
    r->l = treap_merge(l, r->l);
    return r;
}

static blk *treap_erase(blk *t, blk *b) {
    if (!t) return NULL;
    if (t == b) return treap_merge(t->l, t->r);
    if (blk_less(b, t)) t->l = treap_erase(t->l, b);
    else t->r = treap_erase(t->r, b);
    return t;
}

/* First free block with size >= want (smallest, then earliest position). */
static blk *treap_lower_bound(blk *t, size_t want) {
    blk *best = NULL;
    while (t) {
        if (t->size >= want) { best = t; t = t->l; }
        else t = t->r;
    }
    return best;
}

static size_t treap_max(const blk *t) {
    if (!t) return 0;
    while (t->r) t = t->r;
    return t->size;
}

static void pool_insert(tk_alloc *a, blk *b) {
    b->l = b->r = NULL;
    b->prio = next_prio(a);
    a->pool_root[b->s->pool] = treap_insert(a->pool_root[b->s->pool], b);
}

static void pool_erase(tk_alloc *a, blk *b) {
    a->pool_root[b->s->pool] = treap_erase(a->pool_root[b->s->pool], b);
    b->l = b->r = NULL;
}

/* ---- live blocks by address ------------------------------------------------ */

static size_t hash_addr(uintptr_t k, size_t mask) {
    uint64_t h = (uint64_t)k * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 20) & mask;
}

static int tab_grow(tk_alloc *a) {
    size_t ncap = a->tab_cap ? a->tab_cap * 2 : 1024;
    slot *nt = tk_calloc(ncap, sizeof *nt);
    if (!nt) return -1;
    for (size_t i = 0; i < a->tab_cap; i++) {
        if (!a->tab[i].b) continue;
        size_t j = hash_addr(a->tab[i].key, ncap - 1);
        while (nt[j].b) j = (j + 1) & (ncap - 1);
        nt[j] = a->tab[i];
    }
    free(a->tab);
    a->tab = nt;
    a->tab_cap = ncap;
    return 0;
}

static void tab_put(tk_alloc *a, uintptr_t key, blk *b) {
    size_t mask = a->tab_cap - 1, j = hash_addr(key, mask);
    while (a->tab[j].b) j = (j + 1) & mask;
    a->tab[j].key = key;
    a->tab[j].b = b;
    a->tab_n++;
}

/* Removes and returns the block at key, or NULL. Backward-shift deletion keeps
 * probe chains intact without tombstones. */
static blk *tab_take(tk_alloc *a, uintptr_t key) {
    if (!a->tab_cap) return NULL;
    size_t mask = a->tab_cap - 1, j = hash_addr(key, mask);
    while (a->tab[j].b && a->tab[j].key != key) j = (j + 1) & mask;
    if (!a->tab[j].b) return NULL;
    blk *b = a->tab[j].b;
    size_t hole = j;
    for (size_t k = (j + 1) & mask; a->tab[k].b; k = (k + 1) & mask) {
        size_t home = hash_addr(a->tab[k].key, mask);
        /* move k into the hole unless its home lies cyclically in (hole, k] */
        int stays = hole <= k ? (home > hole && home <= k) : (home > hole || home <= k);
        if (!stays) { a->tab[hole] = a->tab[k]; hole = k; }
    }
    a->tab[hole].b = NULL;
    a->tab[hole].key = 0;
    a->tab_n--;
    return b;
}

size_t tk_alloc_block_size(const tk_alloc *a, const void *ptr) {
    if (!a || !ptr || !a->tab_cap) return 0;
    uintptr_t key = (uintptr_t)ptr;
    size_t mask = a->tab_cap - 1, j = hash_addr(key, mask);
    while (a->tab[j].b && a->tab[j].key != key) j = (j + 1) & mask;
    return a->tab[j].b ? a->tab[j].b->size : 0;
}

/* ---- block structs ------------------------------------------------------- */

static blk *blk_get(tk_alloc *a) {
    blk *b = a->spare;
    if (b) a->spare = b->next;
    else if (!(b = tk_malloc(sizeof *b))) return NULL;
    memset(b, 0, sizeof *b);
    return b;
}

static void blk_put(tk_alloc *a, blk *b) {
    b->next = a->spare;
    a->spare = b;
}

static char *blk_addr(const blk *b) { return b->s->addr + b->off; }

/* ---- owners ---------------------------------------------------------------- */

static int owners_reserve(tk_alloc *a, int n) {
    if (n <= a->owners_cap) return 0;
    int ncap = a->owners_cap ? a->owners_cap * 2 : 64;
    while (ncap < n) ncap *= 2;
    size_t oc = (size_t)a->owners_cap, nc = (size_t)ncap;
    char **names = tk_realloc(a->owner_names, nc * sizeof *names);
    if (!names) return -1;
    a->owner_names = names;
    size_t *arr[5] = {a->owner_live, a->at_peak, a->owner_total, a->owner_peak, NULL};
    size_t widths[4] = {TK_CAT_COUNT, TK_CAT_COUNT, 1, 1};
    for (int i = 0; i < 4; i++) {
        size_t *p = tk_realloc(arr[i], nc * widths[i] * sizeof *p);
        if (!p) return -1; /* arrays already grown stay valid: caps only move below */
        memset(p + oc * widths[i], 0, (nc - oc) * widths[i] * sizeof *p);
        switch (i) {
        case 0: a->owner_live = p; break;
        case 1: a->at_peak = p; break;
        case 2: a->owner_total = p; break;
        default: a->owner_peak = p; break;
        }
    }
    a->owners_cap = ncap;
    return 0;
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    while (*s) { h ^= (unsigned char)*s++; h *= 1099511628211ull; }
    return h;
}

/* The planner interns every tensor's owner name (thousands per planned step,
 * hundreds of plans per %txadvise), so the lookup is a hash probe. */
static int owner_index_grow(tk_alloc *a) {
    size_t ncap = a->owner_index_cap ? a->owner_index_cap * 2 : 256;
    int *ni = tk_calloc(ncap, sizeof *ni);
    if (!ni) return -1;
    for (int id = 0; id < a->n_owners; id++) {
        size_t j = name_hash(a->owner_names[id]) & (ncap - 1);
        while (ni[j]) j = (j + 1) & (ncap - 1);
        ni[j] = id + 1;
    }
    free(a->owner_index);
    a->owner_index = ni;
    a->owner_index_cap = ncap;
    return 0;
}

int tk_alloc_owner_id(tk_alloc *a, const char *name) {
    if (!a) return -1;
    if (!name || !*name) name = "(unowned)";
    if ((size_t)(a->n_owners + 1) * 2 > a->owner_index_cap && owner_index_grow(a) != 0) return -1;
    size_t mask = a->owner_index_cap - 1, j = name_hash(name) & mask;
    for (; a->owner_index[j]; j = (j + 1) & mask)
        if (strcmp(a->owner_names[a->owner_index[j] - 1], name) == 0) return a->owner_index[j] - 1;
    if (owners_reserve(a, a->n_owners + 1) != 0) return -1;
    char *copy = tk_strdup(name);
    if (!copy) return -1;
    a->owner_names[a->n_owners] = copy;
    a->owner_index[j] = a->n_owners + 1;
    return a->n_owners++;
}

const char *tk_alloc_owner_name(const tk_alloc *a, int id) {
    if (!a || id < 0 || id >= a->n_owners) return "(unowned)";
    return a->owner_names[id];
}

int tk_alloc_n_owners(const tk_alloc *a) { return a ? a->n_owners : 0; }

size_t tk_alloc_owner_live(const tk_alloc *a, int owner, tk_cat cat) {
    if (!a || owner < 0 || owner >= a->n_owners || (unsigned)cat >= TK_CAT_COUNT) return 0;
    return a->owner_live[(size_t)owner * TK_CAT_COUNT + cat];
}

size_t tk_alloc_owner_peak(const tk_alloc *a, int owner) {
    if (!a || owner < 0 || owner >= a->n_owners) return 0;
    return a->owner_peak[owner];
}

size_t tk_alloc_owner_at_peak(const tk_alloc *a, int owner, tk_cat cat) {
    if (!a || owner < 0 || owner >= a->n_owners || (unsigned)cat >= TK_CAT_COUNT) return 0;
    const size_t *src = a->peak_live ? a->owner_live : a->at_peak;
    return src[(size_t)owner * TK_CAT_COUNT + cat];
}

/* Freezes the peak breakdown before the live state moves down. */
static void peak_freeze(tk_alloc *a) {
    if (!a->peak_live) return;
    /* rows past n_owners stay zero: owners interned later had nothing then */
    memcpy(a->at_peak, a->owner_live, (size_t)a->n_owners * TK_CAT_COUNT * sizeof(size_t));
    memcpy(a->by_cat_at_peak, a->by_cat, sizeof a->by_cat);
    a->peak_live = 0;
}

/* ---- segments ---------------------------------------------------------------- */

static size_t round_size(size_t n) {
    if (n < KMIN_BLOCK) return KMIN_BLOCK;
    return (n + KMIN_BLOCK - 1) / KMIN_BLOCK * KMIN_BLOCK;
}

static size_t segment_size(size_t rounded) {
    if (rounded <= KSMALL_SIZE) return KSMALL_SEG;
    if (rounded < KMIN_LARGE_ALLOC) return KLARGE_SEG;
    return (rounded + KROUND_LARGE - 1) / KROUND_LARGE * KROUND_LARGE;
}

/* Asks the device for a segment; NULL when it (or the simulated capacity, or
 * the chaos switch) says no. The new segment holds one free block, not yet in
 * any pool. */
static seg *segment_new(tk_alloc *a, size_t bytes, int pool) {
    if (a->fail_this_call) return NULL;
    if (a->fail_countdown && --a->fail_countdown == 0) {
        a->fail_this_call = 1;
        return NULL;
    }
    if (a->capacity && (a->reserved > a->capacity || bytes > a->capacity - a->reserved))
        return NULL;
    seg *s = tk_calloc(1, sizeof *s);
    blk *b = blk_get(a);
    if (!s || !b) {
        free(s);
        if (b) blk_put(a, b);
        a->host_failed = 1;
        return NULL;
    }
    void *p = NULL;
    if (a->dev.seg_alloc(a->dev.ctx, bytes, &p) != 0 || !p) {
        free(s);
        blk_put(a, b);
        return NULL;
    }
    s->addr = p;
    s->size = bytes;
    s->id = a->next_seg_id++;
    s->pool = pool;
    s->first = b;
    b->s = s;
    b->size = bytes;
    s->next = a->segs;
    if (a->segs) a->segs->prev = s;
    a->segs = s;
    a->reserved += bytes;
    if (a->reserved > a->reserved_peak) a->reserved_peak = a->reserved;
    a->n_segments++;
    a->n_segments_alloc++;
    hist_add(a, TK_AEV_SEGMENT_ALLOC, p, bytes, 0, (tk_tag){0, -1}, NULL);
    return s;
}

/* Gives a fully free segment back; its single block must be out of the pool. */
static void segment_release(tk_alloc *a, seg *s) {
    hist_add(a, TK_AEV_SEGMENT_FREE, s->addr, s->size, 0, (tk_tag){0, -1}, NULL);
    a->dev.seg_free(a->dev.ctx, s->addr, s->size);
    if (s->prev) s->prev->next = s->next;
    else a->segs = s->next;
    if (s->next) s->next->prev = s->prev;
    a->reserved -= s->size;
    a->n_segments--;
    a->n_segments_free++;
    for (blk *b = s->first, *n; b; b = n) { n = b->next; blk_put(a, b); }
    free(s);
}

static int release_cached(tk_alloc *a) {
    int n = 0;
    for (seg *s = a->segs, *nx; s; s = nx) {
        nx = s->next;
        if (s->n_live == 0) {
            pool_erase(a, s->first);
            segment_release(a, s);
            n++;
        }
    }
    return n;
}

void tk_alloc_empty_cache(tk_alloc *a) {
    if (a) release_cached(a);
}

/* ---- life cycle ------------------------------------------------------------ */

tk_alloc *tk_alloc_new(tk_devmem dev, size_t capacity) {
    if (!dev.seg_alloc || !dev.seg_free) return NULL;
    tk_alloc *a = tk_calloc(1, sizeof *a);
    if (!a) return NULL;
    a->dev = dev;
    a->capacity = capacity;
    a->rng = 0x2545f491u;
    a->peak_live = 1;
    if (tab_grow(a) != 0 || owners_reserve(a, 1) != 0) {
        tk_alloc_destroy(&a);
        return NULL;
    }
    return a;
}

void tk_alloc_destroy(tk_alloc **pa) {
    if (!pa || !*pa) return;
    tk_alloc *a = *pa;
    while (a->segs) {
        seg *s = a->segs;
        a->segs = s->next;
        a->dev.seg_free(a->dev.ctx, s->addr, s->size);
        for (blk *b = s->first, *n; b; b = n) { n = b->next; free(b); }
        free(s);
    }
    while (a->spare) { blk *b = a->spare; a->spare = b->next; free(b); }
    for (int i = 0; i < a->n_owners; i++) free(a->owner_names[i]);
    free(a->owner_names);
    free(a->owner_index);
    free(a->owner_live);
    free(a->at_peak);
    free(a->owner_total);
    free(a->owner_peak);
    free(a->tab);
    free(a->hist);
    free(a);
    *pa = NULL;
}

/* ---- malloc / free ----------------------------------------------------------- */

static size_t largest_free(const tk_alloc *a) {
    size_t s = treap_max(a->pool_root[POOL_SMALL]), l = treap_max(a->pool_root[POOL_LARGE]);
    return s > l ? s : l;
}

static void fill_oom(tk_alloc *a, tk_oom *o, size_t bytes, size_t rounded, tk_tag tag) {
    memset(o, 0, sizeof *o);
    o->requested = bytes;
    o->rounded = rounded;
    o->tag = tag;
    snprintf(o->owner_name, sizeof o->owner_name, "%s", tk_alloc_owner_name(a, tag.owner));
    o->capacity = a->capacity;
    o->free_bytes = a->capacity > a->reserved ? a->capacity - a->reserved : 0;
    o->allocated = a->allocated;
    o->reserved = a->reserved;
    o->largest_free_block = largest_free(a);
    o->fragmentation = a->reserved - a->allocated >= rounded && o->largest_free_block < rounded;
    memcpy(o->by_cat, a->by_cat, sizeof o->by_cat);
    /* The TK_OOM_TOP largest owners (bytes descending, owner id ascending),
     * by insertion into a fixed array: the record of a device OOM needs no
     * host memory, so it is whole even when the host is short too. */
    int top[TK_OOM_TOP], nt = 0;
    for (int i = 0; i < a->n_owners; i++) {
        size_t b = a->owner_total[i];
        if (!b || (nt == TK_OOM_TOP && b <= a->owner_total[top[nt - 1]])) continue;
        int pos = nt < TK_OOM_TOP ? nt++ : nt - 1;
        while (pos > 0 && a->owner_total[top[pos - 1]] < b) {
            top[pos] = top[pos - 1];
            pos--;
        }
        top[pos] = i;
    }
    for (int i = 0; i < nt; i++) {
        snprintf(o->top[i].owner, sizeof o->top[i].owner, "%s", a->owner_names[top[i]]);
        o->top[i].bytes = a->owner_total[top[i]];
    }
    o->n_top = nt;
}

static void account(tk_alloc *a, const blk *b, int sign) {
    size_t k = (size_t)b->tag.owner * TK_CAT_COUNT + b->tag.cat;
    if (sign > 0) {
        a->allocated += b->size;
        a->requested += b->req;
        a->by_cat[b->tag.cat] += b->size;
        a->owner_live[k] += b->size;
        a->owner_total[b->tag.owner] += b->size;
        if (a->owner_total[b->tag.owner] > a->owner_peak[b->tag.owner])
            a->owner_peak[b->tag.owner] = a->owner_total[b->tag.owner];
        if (a->requested > a->requested_peak) a->requested_peak = a->requested;
        /* only a new peak arms a copy, so alloc/free cycles at a steady peak
         * (every training step) copy nothing */
        if (a->allocated > a->allocated_peak) { a->allocated_peak = a->allocated; a->peak_live = 1; }
    } else {
        peak_freeze(a);
        a->allocated -= b->size;
        a->requested -= b->req;
        a->by_cat[b->tag.cat] -= b->size;
        a->owner_live[k] -= b->size;
        a->owner_total[b->tag.owner] -= b->size;
    }
}

tk_status tk_alloc_malloc(tk_alloc *a, size_t bytes, tk_tag tag, void **ptr, tk_oom *oom) {
    if (ptr) *ptr = NULL;
    if (!a || !ptr) return TK_EINVAL;
    if (bytes == 0) return TK_OK;
    if ((unsigned)tag.cat >= TK_CAT_COUNT || tag.owner >= a->n_owners) return TK_EINVAL;
    if (tag.owner < 0 && (tag.owner = tk_alloc_owner_id(a, NULL)) < 0) return TK_ENOMEM;
    size_t rounded = bytes > SIZE_MAX - KROUND_LARGE ? bytes : round_size(bytes);
    if (bytes > SIZE_MAX - KROUND_LARGE) goto oom; /* no device has that much */
    int pool = rounded <= KSMALL_SIZE ? POOL_SMALL : POOL_LARGE;
    /* The host side first: the address table's room and two spare block
     * structs (a new segment's and a split's), so that past this point only
     * the device can refuse, and a host failure is TK_ENOMEM, never a
     * device OOM nor a silently unsplit block. */
    if (a->tab_n + 1 > a->tab_cap / 2 && tab_grow(a) != 0) return TK_ENOMEM;
    if (!a->spare || !a->spare->next) {
        blk *x = blk_get(a), *y = x ? blk_get(a) : NULL;
        if (x) blk_put(a, x);
        if (y) blk_put(a, y);
        if (!y) return TK_ENOMEM;
    }
    a->host_failed = 0;

    blk *b = treap_lower_bound(a->pool_root[pool], rounded);
    if (b) {
        pool_erase(a, b);
    } else {
        size_t segbytes = segment_size(rounded);
        seg *s = segment_new(a, segbytes, pool);
        if (!s && a->host_failed) return TK_ENOMEM;
        if (!s) {
            release_cached(a);
            a->n_retries++;
            s = segment_new(a, segbytes, pool);
        }
        a->fail_this_call = 0;
        if (!s && a->host_failed) return TK_ENOMEM;
        if (!s) goto oom;
        b = s->first;
    }

    size_t rest = b->size - rounded;
    if (pool == POOL_SMALL ? rest >= KMIN_BLOCK : rest > KSMALL_SIZE) {
        blk *r = blk_get(a); /* a spare, reserved above */
        if (r) {
            r->s = b->s;
            r->off = b->off + rounded;
            r->size = rest;
            r->prev = b;
            r->next = b->next;
            if (b->next) b->next->prev = r;
            b->next = r;
            b->size = rounded;
            pool_insert(a, r);
        }
    }
    b->live = 1;
    b->req = bytes;
    b->tag = tag;
    b->s->n_live++;
    b->s->live_bytes += b->size;
    tab_put(a, (uintptr_t)blk_addr(b), b);
    account(a, b, +1);
    a->n_alloc++;
    *ptr = blk_addr(b);
    b->phase = a->phase;
    hist_add(a, TK_AEV_ALLOC, *ptr, b->size, bytes, tag, b->phase);
    if (a->hook) a->hook(a->hook_ud, 1, b->size, tag);
    return TK_OK;

oom:
    a->n_ooms++;
    hist_add(a, TK_AEV_OOM, NULL, bytes,
             a->capacity > a->reserved ? a->capacity - a->reserved : 0, tag, a->phase);
    if (oom) fill_oom(a, oom, bytes, rounded, tag);
    return TK_EOOM;
}

void tk_alloc_free(tk_alloc *a, void *ptr) {
    if (!a || !ptr) return;
    blk *b = tab_take(a, (uintptr_t)ptr);
    assert(b && "tk_alloc_free: pointer not from this allocator");
    if (!b) return;
    account(a, b, -1);
    a->n_free++;
    b->live = 0;
    b->s->n_live--;
    b->s->live_bytes -= b->size;
    hist_add(a, TK_AEV_FREE, ptr, b->size, 0, b->tag, b->phase);
    if (a->hook) a->hook(a->hook_ud, 0, b->size, b->tag);
    blk *p = b->prev, *n = b->next;
    if (p && !p->live) { /* absorb b into its free predecessor */
        pool_erase(a, p);
        p->size += b->size;
        p->next = n;
        if (n) n->prev = p;
        blk_put(a, b);
        b = p;
    }
    if (n && !n->live) {
        pool_erase(a, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        blk_put(a, n);
    }
    pool_insert(a, b);
}

/* ---- stats, hooks, snapshot ------------------------------------------------ */

void tk_alloc_stats_get(const tk_alloc *a, tk_alloc_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!a) return;
    out->capacity = a->capacity;
    out->allocated = a->allocated;
    out->allocated_peak = a->allocated_peak;
    out->requested = a->requested;
    out->requested_peak = a->requested_peak;
    out->reserved = a->reserved;
    out->reserved_peak = a->reserved_peak;
    for (const seg *s = a->segs; s; s = s->next)
        if (s->n_live) out->inactive_split += s->size - s->live_bytes;
    out->largest_free_block = largest_free(a);
    out->n_alloc = a->n_alloc;
    out->n_free = a->n_free;
    out->n_segments_alloc = a->n_segments_alloc;
    out->n_segments_free = a->n_segments_free;
    out->n_retries = a->n_retries;
    out->n_ooms = a->n_ooms;
    out->n_segments = a->n_segments;
    memcpy(out->by_cat, a->by_cat, sizeof out->by_cat);
    memcpy(out->by_cat_at_peak, a->peak_live ? a->by_cat : a->by_cat_at_peak, sizeof out->by_cat);
}

void tk_alloc_reset_peak(tk_alloc *a) {
    if (!a) return;
    a->allocated_peak = a->allocated;
    a->requested_peak = a->requested;
    a->reserved_peak = a->reserved;
    for (int i = 0; i < a->n_owners; i++) a->owner_peak[i] = a->owner_total[i];
    a->peak_live = 1;
}

void tk_alloc_set_event_hook(tk_alloc *a, tk_alloc_event_fn fn, void *ud) {
    if (!a) return;
    a->hook = fn;
    a->hook_ud = ud;
}

void tk_alloc_fail_segment_after(tk_alloc *a, uint64_t n) {
    if (!a) return;
    a->fail_countdown = n;
    a->fail_this_call = 0;
}

int tk_alloc_record_history(tk_alloc *a, size_t max_events) {
    if (!a) return -1;
    free(a->hist);
    a->hist = NULL;
    a->hist_cap = 0;
    a->hist_seq = 0;
    if (!max_events) return 0;
    a->hist = tk_calloc(max_events, sizeof *a->hist);
    if (!a->hist) return -1;
    a->hist_cap = max_events;
    return 0;
}

void tk_alloc_set_phase(tk_alloc *a, const char *phase) {
    if (a) a->phase = phase;
}

size_t tk_alloc_history_len(const tk_alloc *a) {
    if (!a || !a->hist) return 0;
    return a->hist_seq < a->hist_cap ? (size_t)a->hist_seq : a->hist_cap;
}

size_t tk_alloc_history(const tk_alloc *a, tk_alloc_event *out, size_t max, uint64_t *dropped) {
    size_t n = tk_alloc_history_len(a);
    uint64_t first = a && a->hist ? a->hist_seq - n : 0;
    if (dropped) *dropped = first;
    if (n > max) n = max;
    for (size_t i = 0; i < n; i++) out[i] = a->hist[(first + i) % a->hist_cap];
    return n;
}

void tk_alloc_walk(const tk_alloc *a, void (*seg_fn)(void *ud, const tk_alloc_seg_info *s),
                   void (*blk_fn)(void *ud, const tk_alloc_blk_info *b), void *ud) {
    if (!a) return;
    const seg *last = a->segs;
    while (last && last->next) last = last->next;
    for (const seg *s = last; s; s = s->prev) { /* the list is newest first */
        tk_alloc_seg_info si = {(uint64_t)(uintptr_t)s->addr, s->size, s->pool == POOL_SMALL, s->live_bytes};
        if (seg_fn) seg_fn(ud, &si);
        for (const blk *b = s->first; b && blk_fn; b = b->next) {
            tk_alloc_blk_info bi = {(uint64_t)(uintptr_t)blk_addr(b), b->size, b->live ? b->req : 0, b->live,
                                    b->tag, b->live ? b->phase : NULL};
            blk_fn(ud, &bi);
        }
    }
}

static json_t *json_size(size_t v) { return json_integer((json_int_t)v); }

char *tk_alloc_snapshot_json(const tk_alloc *a) {
    if (!a) return NULL;
    tk_alloc_stats st;
    tk_alloc_stats_get(a, &st);
    json_t *root = json_object(), *c = json_object(), *segs = json_array(),
           *owners = json_array(), *cats = json_object(), *catsp = json_object();
    json_object_set_new(root, "counters", c);
    json_object_set_new(c, "capacity", json_size(st.capacity));
    json_object_set_new(c, "allocated", json_size(st.allocated));
    json_object_set_new(c, "allocated_peak", json_size(st.allocated_peak));
    json_object_set_new(c, "requested", json_size(st.requested));
    json_object_set_new(c, "requested_peak", json_size(st.requested_peak));
    json_object_set_new(c, "reserved", json_size(st.reserved));
    json_object_set_new(c, "reserved_peak", json_size(st.reserved_peak));
    json_object_set_new(c, "inactive_split", json_size(st.inactive_split));
    json_object_set_new(c, "largest_free_block", json_size(st.largest_free_block));
    json_object_set_new(c, "n_alloc", json_size(st.n_alloc));
    json_object_set_new(c, "n_free", json_size(st.n_free));
    json_object_set_new(c, "n_segments", json_size(st.n_segments));
    json_object_set_new(c, "n_segments_alloc", json_size(st.n_segments_alloc));
    json_object_set_new(c, "n_segments_free", json_size(st.n_segments_free));
    json_object_set_new(c, "n_retries", json_size(st.n_retries));
    json_object_set_new(c, "n_ooms", json_size(st.n_ooms));
    for (int k = 0; k < TK_CAT_COUNT; k++) {
        json_object_set_new(cats, tk_cat_name((tk_cat)k), json_size(st.by_cat[k]));
        json_object_set_new(catsp, tk_cat_name((tk_cat)k), json_size(st.by_cat_at_peak[k]));
    }
    json_object_set_new(root, "by_cat", cats);
    json_object_set_new(root, "by_cat_at_peak", catsp);
    /* oldest segment first, so the listing reads in allocation order */
    const seg *last = a->segs;
    while (last && last->next) last = last->next;
    for (const seg *s = last; s; s = s->prev) {
        json_t *js = json_object(), *blocks = json_array();
        json_object_set_new(js, "id", json_size(s->id));
        json_object_set_new(js, "address", json_size((size_t)(uintptr_t)s->addr));
        json_object_set_new(js, "size", json_size(s->size));
        json_object_set_new(js, "pool", json_string(s->pool == POOL_SMALL ? "small" : "large"));
        json_object_set_new(js, "allocated", json_size(s->live_bytes));
        for (const blk *b = s->first; b; b = b->next) {
            json_t *jb = json_object();
            json_object_set_new(jb, "offset", json_size(b->off));
            json_object_set_new(jb, "size", json_size(b->size));
            json_object_set_new(jb, "state", json_string(b->live ? "active" : "inactive"));
            if (b->live) {
                json_object_set_new(jb, "requested", json_size(b->req));
                json_object_set_new(jb, "owner", json_string(tk_alloc_owner_name(a, b->tag.owner)));
                json_object_set_new(jb, "category", json_string(tk_cat_name(b->tag.cat)));
            }
            json_array_append_new(blocks, jb);
        }
        json_object_set_new(js, "blocks", blocks);
        json_array_append_new(segs, js);
    }
    json_object_set_new(root, "segments", segs);
    for (int i = 0; i < a->n_owners; i++) {
        json_t *jo = json_object(), *live = json_object(), *atp = json_object();
        json_object_set_new(jo, "name", json_string(a->owner_names[i]));
        json_object_set_new(jo, "live", json_size(a->owner_total[i]));
        json_object_set_new(jo, "peak", json_size(a->owner_peak[i]));
        for (int k = 0; k < TK_CAT_COUNT; k++) {
            size_t v = tk_alloc_owner_live(a, i, (tk_cat)k), p = tk_alloc_owner_at_peak(a, i, (tk_cat)k);
            if (v) json_object_set_new(live, tk_cat_name((tk_cat)k), json_size(v));
            if (p) json_object_set_new(atp, tk_cat_name((tk_cat)k), json_size(p));
        }
        json_object_set_new(jo, "by_cat", live);
        json_object_set_new(jo, "at_peak", atp);
        json_array_append_new(owners, jo);
    }
    json_object_set_new(root, "owners", owners);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}
