/* test_alloc_chaos.c — fails the Nth segment request, for every N across a
 * scripted sequence (jansson's test_chaos idea applied to device memory).
 *
 * The script behaves like the trainer: it allocates and frees tagged blocks,
 * empties the cache now and then, and when an allocation fails it releases
 * everything it holds and stops. For each N the run must not crash, must see
 * exactly one OOM (when N is within the script's segment requests), must find
 * the books consistent right after the failure, and must give every segment
 * back (the host backend mallocs them, so ASan reports any leak). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tk_gpu.h"
#include "tk_test.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1 << 20)

typedef struct { size_t live; uint64_t n_alloc; } host_mem;

static int host_seg_alloc(void *ctx, size_t bytes, void **ptr) {
    host_mem *h = ctx;
    *ptr = malloc(bytes);
    if (!*ptr) return -1;
    h->live += bytes;
    h->n_alloc++;
    return 0;
}

static void host_seg_free(void *ctx, void *ptr, size_t bytes) {
    ((host_mem *)ctx)->live -= bytes;
    free(ptr);
}

static int consistent(tk_alloc *a, size_t held) {
    tk_alloc_stats s;
    tk_alloc_stats_get(a, &s);
    size_t own = 0, cat = 0;
    for (int o = 0; o < tk_alloc_n_owners(a); o++)
        for (int c = 0; c < TK_CAT_COUNT; c++) own += tk_alloc_owner_live(a, o, (tk_cat)c);
    for (int c = 0; c < TK_CAT_COUNT; c++) cat += s.by_cat[c];
    return own == s.allocated && cat == s.allocated && s.allocated == held &&
           s.allocated <= s.reserved && s.inactive_split <= s.reserved - s.allocated;
}

#define NSTEP 240
typedef struct { int ooms, bad, steps_done; uint64_t seg_requests; } run_result;

/* One run of the script; fail_at = 0 runs it clean. */
static run_result run_script(uint64_t fail_at) {
    run_result r = {0};
    host_mem h = {0};
    tk_alloc *a = tk_alloc_new((tk_devmem){host_seg_alloc, host_seg_free, &h}, 512 * MiB);
    if (!a) { r.bad++; return r; }
    tk_alloc_fail_segment_after(a, fail_at);
    void *held[NSTEP];
    size_t held_bytes[NSTEP];
    int n = 0;
    size_t total = 0;
    static const char *owners[] = {"bert.embeddings.word_embeddings", "bert.encoder.layer.0.attention.self.query",
                                   "bert.encoder.layer.0.output.dense", "classifier"};
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int step = 0; step < NSTEP; step++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        if (step % 60 == 59) tk_alloc_empty_cache(a);
        if (n > 0 && x % 3 == 0) { /* free the oldest or a middle block */
            int k = (int)((x >> 8) % (uint64_t)n);
            tk_alloc_free(a, held[k]);
            total -= held_bytes[k];
            held[k] = held[n - 1];
            held_bytes[k] = held_bytes[n - 1];
            n--;
            r.steps_done = step + 1;
            continue;
        }
        static const size_t sizes[] = {300, 4 * KiB, 700 * KiB, MiB + 7, 3 * MiB, 12 * MiB, 64 * KiB};
        size_t want = sizes[(x >> 16) % 7];
        tk_tag t = {(tk_cat)((x >> 24) % TK_CAT_COUNT), tk_alloc_owner_id(a, owners[(x >> 32) % 4])};
        tk_alloc_stats before, after;
        tk_alloc_stats_get(a, &before);
        void *p = NULL;
        tk_oom o;
        tk_status st = tk_alloc_malloc(a, want, t, &p, &o);
        tk_alloc_stats_get(a, &after);
        if (st != TK_OK) {
            r.ooms++;
            if (p != NULL || o.requested != want || o.allocated != total) r.bad++;
            if (after.allocated != before.allocated || after.n_alloc != before.n_alloc) r.bad++;
            if (!consistent(a, total)) r.bad++;
            break; /* the caller gives up and releases what it took */
        }
        held[n] = p;
        held_bytes[n] = after.allocated - before.allocated;
        total += held_bytes[n];
        n++;
        if (!consistent(a, total)) r.bad++;
        r.steps_done = step + 1;
    }
    while (n > 0) tk_alloc_free(a, held[--n]);
    if (!consistent(a, 0)) r.bad++;
    r.seg_requests = h.n_alloc;
    tk_alloc_destroy(&a);
    if (h.live != 0) r.bad++;
    return r;
}

static void test_fail_every_segment_request(void) {
    run_result clean = run_script(0);
    TK_CHECK_EQ_INT(clean.bad, 0);
    TK_CHECK_EQ_INT(clean.steps_done, NSTEP);
    TK_CHECK(clean.seg_requests >= 8); /* the script does exercise segments */
    int bad_runs = 0, missing_oom = 0;
    for (uint64_t n = 1; n <= clean.seg_requests + 2; n++) {
        run_result r = run_script(n);
        if (r.bad) bad_runs++;
        /* a capacity OOM in the clean run would end it early; the clean run has
         * none here, so every N within its requests must surface an OOM */
        if (n <= clean.seg_requests && r.ooms != 1) missing_oom++;
        if (n > clean.seg_requests && r.ooms != clean.ooms) missing_oom++;
    }
    TK_CHECK_EQ_INT(clean.ooms, 0);
    TK_CHECK_EQ_INT(bad_runs, 0);
    TK_CHECK_EQ_INT(missing_oom, 0);
}

/* After a chaos failure the allocator keeps working: the switch is one-shot. */
static void test_recovers_after_failure(void) {
    host_mem h = {0};
    tk_alloc *a = tk_alloc_new((tk_devmem){host_seg_alloc, host_seg_free, &h}, 0);
    tk_tag t = {TK_CAT_TEMP, tk_alloc_owner_id(a, "x")};
    tk_alloc_fail_segment_after(a, 1);
    void *p = NULL;
    TK_CHECK(tk_alloc_malloc(a, 5 * MiB, t, &p, NULL) == TK_EOOM);
    tk_alloc_stats s;
    tk_alloc_stats_get(a, &s);
    TK_CHECK_EQ_INT(s.n_ooms, 1);
    TK_CHECK_EQ_INT(s.n_retries, 1);
    TK_CHECK_EQ_INT(s.reserved, 0);
    TK_CHECK(tk_alloc_malloc(a, 5 * MiB, t, &p, NULL) == TK_OK);
    tk_alloc_free(a, p);
    tk_alloc_fail_segment_after(a, 3);
    tk_alloc_fail_segment_after(a, 0); /* disarmed */
    void *q[3];
    for (int i = 0; i < 3; i++) TK_CHECK(tk_alloc_malloc(a, 15 * MiB, t, &q[i], NULL) == TK_OK);
    for (int i = 0; i < 3; i++) tk_alloc_free(a, q[i]);
    tk_alloc_destroy(&a);
    TK_CHECK_EQ_INT(h.live, 0);
}

int main(void) {
    TK_RUN(test_fail_every_segment_request);
    TK_RUN(test_recovers_after_failure);
    return tk_test_done();
}
