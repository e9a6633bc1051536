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

/* The same on a cpu device through tensors: every failure leaves an empty
 * tensor, a record and a one-line message; the script frees what it holds. */
static int tensor_script(tk_dev *d, int *n_oom, int *bad) {
    static const int64_t rows[] = {1, 300, 4096, 70000, 2, 9000, 128, 50000};
    tk_tensor t[8];
    memset(t, 0, sizeof t);
    tk_err err = {0};
    int held = 0, st = 0;
    for (int i = 0; i < 8; i++) {
        int64_t shape[2] = {rows[i], 64};
        tk_status s = tk_tensor_alloc(d, &t[held], i % 2 ? TK_F16 : TK_F32, 2, shape,
                                      (tk_cat)(i % TK_CAT_COUNT), i % 3 ? "encoder" : "head", &err);
        if (s != TK_OK) {
            (*n_oom)++;
            if (s != TK_EOOM || t[held].data || !tk_dev_last_oom(d) || strchr(err.msg, '\n') ||
                !strstr(err.msg, "out of memory: tried to allocate"))
                (*bad)++;
            st = 1;
            break;
        }
        if (tk_op_fill(d, &t[held], 1.0f, tk_tensor_numel(&t[held])) != TK_OK) (*bad)++;
        held++;
        if (i == 4) { tk_tensor_free(d, &t[1]); t[1] = t[--held]; memset(&t[held], 0, sizeof t[held]); }
    }
    for (int i = 0; i < held; i++) tk_tensor_free(d, &t[i]);
    return st;
}

static void test_tensor_chaos_on_cpu(void) {
    tk_dev_opts o = {.kind = TK_DEV_CPU, .threads = 1};
    tk_err err = {0};
    int bad = 0, missing = 0;
    uint64_t clean_segments = 0;
    for (uint64_t n = 0; n <= clean_segments + 1; n++) { /* n = 0: the clean run */
        tk_dev *d = tk_dev_new(&o, &err);
        TK_CHECK_MSG(d != NULL, "%s", err.msg);
        if (!d) return;
        tk_alloc_fail_segment_after(tk_dev_alloc(d), n);
        int ooms = 0;
        tensor_script(d, &ooms, &bad);
        tk_alloc_stats s;
        tk_alloc_stats_get(tk_dev_alloc(d), &s);
        if (s.allocated != 0) bad++;
        if (n == 0) clean_segments = s.n_segments_alloc;
        if (ooms != (n >= 1 && n <= clean_segments)) missing++;
        tk_dev_destroy(&d);
    }
    TK_CHECK(clean_segments >= 2); /* a small and a large segment */
    TK_CHECK_EQ_INT(bad, 0);
    TK_CHECK_EQ_INT(missing, 0);
}

int main(void) {
    TK_RUN(test_fail_every_segment_request);
    TK_RUN(test_recovers_after_failure);
    TK_RUN(test_tensor_chaos_on_cpu);
    return tk_test_done();
}
