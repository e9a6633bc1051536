/* test_alloc_history.c — the allocator's opt-in event history (PyTorch's
 * memory history): off by default, events in order with sizes, owners and
 * phases, the OOM recorded with the device's free bytes, the ring keeping the
 * last N and counting the dropped ones, and the segment/block walk adding up
 * to reserved. */
#include <stdint.h>
#include <stdlib.h>

#include "tk_gpu.h"
#include "tk_test.h"

#define MiB ((size_t)1 << 20)

/* Addresses are never dereferenced: hand out distinct fake ones. */
static int fake_alloc(void *ctx, size_t bytes, void **ptr) {
    uintptr_t *next = ctx;
    *ptr = (void *)*next;
    *next += bytes + (1 << 20);
    return 0;
}
static void fake_free(void *ctx, void *ptr, size_t bytes) { (void)ctx; (void)ptr; (void)bytes; }

static tk_alloc *fresh(uintptr_t *next, size_t cap) {
    *next = (uintptr_t)1 << 32;
    return tk_alloc_new((tk_devmem){fake_alloc, fake_free, next}, cap);
}

static void test_off_by_default_then_in_order(void) {
    uintptr_t next;
    tk_alloc *a = fresh(&next, 0);
    tk_tag t = {TK_CAT_ACT, tk_alloc_owner_id(a, "bert.encoder.layer.0.output")};
    void *p = NULL, *q = NULL;
    TK_CHECK(tk_alloc_malloc(a, 1000, t, &p, NULL) == TK_OK);
    TK_CHECK_EQ_INT(tk_alloc_history_len(a), 0);
    tk_alloc_free(a, p);
    TK_CHECK(tk_alloc_record_history(a, 16) == 0);
    tk_alloc_set_phase(a, "forward");
    TK_CHECK(tk_alloc_malloc(a, 3 * MiB, t, &p, NULL) == TK_OK); /* a 20 MiB segment, then the block */
    tk_alloc_set_phase(a, "backward");
    TK_CHECK(tk_alloc_malloc(a, 100, t, &q, NULL) == TK_OK);    /* from the cached small segment */
    tk_alloc_free(a, p);
    tk_alloc_empty_cache(a);                                    /* the large segment goes back */
    tk_alloc_event ev[16];
    uint64_t dropped = 99;
    size_t n = tk_alloc_history(a, ev, 16, &dropped);
    TK_CHECK_EQ_INT(n, 5);
    TK_CHECK_EQ_INT(dropped, 0);
    int kinds[] = {TK_AEV_SEGMENT_ALLOC, TK_AEV_ALLOC, TK_AEV_ALLOC, TK_AEV_FREE, TK_AEV_SEGMENT_FREE};
    for (size_t i = 0; i < n && i < 5; i++) {
        TK_CHECK_EQ_INT(ev[i].kind, kinds[i]);
        TK_CHECK_EQ_INT(ev[i].seq, i);
    }
    TK_CHECK_EQ_INT(ev[0].size, 20 * MiB);
    TK_CHECK_EQ_INT(ev[1].size, 3 * MiB);
    TK_CHECK_EQ_INT(ev[1].req, 3 * MiB);
    TK_CHECK_EQ_INT(ev[2].size, 512);
    TK_CHECK_EQ_INT(ev[2].req, 100);
    TK_CHECK_STR(ev[1].phase, "forward");
    TK_CHECK_STR(ev[2].phase, "backward");
    TK_CHECK_STR(ev[3].phase, "forward"); /* a free carries its block's phase */
    TK_CHECK_EQ_INT(ev[1].owner, t.owner);
    TK_CHECK_EQ_INT(ev[1].cat, TK_CAT_ACT);
    TK_CHECK(ev[1].addr == (uint64_t)(uintptr_t)p && ev[3].addr == ev[1].addr && ev[4].addr == ev[0].addr);
    tk_alloc_free(a, q);
    tk_alloc_destroy(&a);
}

static void test_ring_keeps_the_last_and_counts_dropped(void) {
    uintptr_t next;
    tk_alloc *a = fresh(&next, 0);
    tk_tag t = {TK_CAT_TEMP, tk_alloc_owner_id(a, "x")};
    TK_CHECK(tk_alloc_record_history(a, 4) == 0);
    void *p = NULL;
    for (int i = 0; i < 5; i++) { /* 1 segment + 10 block events */
        TK_CHECK(tk_alloc_malloc(a, 4096, t, &p, NULL) == TK_OK);
        tk_alloc_free(a, p);
    }
    tk_alloc_event ev[8];
    uint64_t dropped = 0;
    size_t n = tk_alloc_history(a, ev, 8, &dropped);
    TK_CHECK_EQ_INT(n, 4);
    TK_CHECK_EQ_INT(dropped, 7);
    TK_CHECK_EQ_INT(ev[0].seq, 7);
    TK_CHECK_EQ_INT(ev[3].seq, 10);
    TK_CHECK_EQ_INT(ev[3].kind, TK_AEV_FREE);
    TK_CHECK(tk_alloc_record_history(a, 0) == 0);
    TK_CHECK_EQ_INT(tk_alloc_history_len(a), 0);
    tk_alloc_destroy(&a);
}

static void test_oom_event(void) {
    uintptr_t next;
    tk_alloc *a = fresh(&next, 24 * MiB);
    tk_tag t = {TK_CAT_PARAM, tk_alloc_owner_id(a, "w")};
    TK_CHECK(tk_alloc_record_history(a, 64) == 0);
    void *p = NULL, *q = NULL, *r = NULL;
    TK_CHECK(tk_alloc_malloc(a, 5 * MiB, t, &p, NULL) == TK_OK);
    TK_CHECK(tk_alloc_malloc(a, 2000, t, &q, NULL) == TK_OK);
    /* 22 MiB reserved, 2 MiB free on the device, 15 MiB free in the large segment */
    TK_CHECK(tk_alloc_malloc(a, 16 * MiB, t, &r, NULL) == TK_EOOM);
    tk_alloc_event ev[64];
    size_t n = tk_alloc_history(a, ev, 64, NULL);
    TK_CHECK(n >= 1 && ev[n - 1].kind == TK_AEV_OOM);
    if (n) {
        TK_CHECK_EQ_INT(ev[n - 1].size, 16 * MiB);
        TK_CHECK_EQ_INT(ev[n - 1].req, 2 * MiB);
    }
    tk_alloc_free(a, p);
    tk_alloc_free(a, q);
    tk_alloc_destroy(&a);
}

typedef struct { size_t seg, blk, live; } walk_sum;
static void seg_sum(void *ud, const tk_alloc_seg_info *s) { ((walk_sum *)ud)->seg += s->size; }
static void blk_sum(void *ud, const tk_alloc_blk_info *b) {
    walk_sum *w = ud;
    w->blk += b->size;
    if (b->live) w->live += b->size;
}

static void test_walk_adds_up(void) {
    uintptr_t next;
    tk_alloc *a = fresh(&next, 0);
    tk_tag t = {TK_CAT_ACT, tk_alloc_owner_id(a, "y")};
    void *p[6];
    size_t sizes[6] = {100, 700000, 3 * MiB, 11 * MiB, 512, 5 * MiB};
    for (int i = 0; i < 6; i++) TK_CHECK(tk_alloc_malloc(a, sizes[i], t, &p[i], NULL) == TK_OK);
    tk_alloc_free(a, p[1]);
    tk_alloc_free(a, p[3]);
    tk_alloc_stats st;
    tk_alloc_stats_get(a, &st);
    walk_sum w = {0, 0, 0};
    tk_alloc_walk(a, seg_sum, blk_sum, &w);
    TK_CHECK_EQ_INT(w.seg, st.reserved);
    TK_CHECK_EQ_INT(w.blk, st.reserved);
    TK_CHECK_EQ_INT(w.live, st.allocated);
    for (int i = 0; i < 6; i++)
        if (i != 1 && i != 3) tk_alloc_free(a, p[i]);
    tk_alloc_destroy(&a);
}

int main(void) {
    TK_RUN(test_off_by_default_then_in_order);
    TK_RUN(test_ring_keeps_the_last_and_counts_dropped);
    TK_RUN(test_oom_event);
    TK_RUN(test_walk_adds_up);
    return tk_test_done();
}
