/* alloc_bench.c — the caching allocator's cached path against glibc
 * malloc/free, in the same process and run.
 *
 * For each size: after one warm-up pair (so the allocator has the segment
 * cached), time `batch` alloc/free pairs at a time with CLOCK_MONOTONIC, many
 * batches; report pairs per second over all batches and the median ns per
 * pair across batches. A "mixed" workload keeps 256 live blocks of sizes from
 * 512 B to 8 MiB and replaces a random one per pair, so the free-block tree and
 * the address map hold real populations. The allocator runs over a counting
 * device (fake addresses, like meta): what is measured is its own
 * bookkeeping, which is all a cached CUDA allocation costs too.
 *
 *   build/bench/alloc_bench [seconds-per-case]     (default 0.3)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tk_gpu.h"

typedef struct { uintptr_t next; } fake_dev;

static int fake_seg_alloc(void *ctx, size_t bytes, void **ptr) {
    fake_dev *f = ctx;
    *ptr = (void *)f->next;
    f->next += (bytes + ((2u << 20) - 1)) / (2u << 20) * (2u << 20);
    return 0;
}
static void fake_seg_free(void *ctx, void *ptr, size_t bytes) { (void)ctx; (void)ptr; (void)bytes; }

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct { double pairs_per_s, median_ns; } result;

#define BATCH 1000
#define MAXB 100000
static double batch_ns[MAXB];
static void *volatile sink;

/* kind 0: tk_alloc, 1: glibc. size 0: the mixed workload. */
static result run(int kind, size_t size, double seconds) {
    fake_dev f = {(uintptr_t)1 << 40};
    tk_alloc *a = tk_alloc_new((tk_devmem){fake_seg_alloc, fake_seg_free, &f}, 0);
    tk_tag tag = {TK_CAT_ACT, tk_alloc_owner_id(a, "bench")};
    enum { NLIVE = 256 };
    void *live[NLIVE] = {0};
    size_t live_sz[NLIVE];
    uint64_t x = 88172645463325252ull;
    if (size == 0) {
        for (int i = 0; i < NLIVE; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            live_sz[i] = (size_t)512 << (x % 15); /* 512 B .. 8 MiB */
            if (kind == 0) tk_alloc_malloc(a, live_sz[i], tag, &live[i], NULL);
            else live[i] = malloc(live_sz[i]);
        }
    } else { /* warm up: the segment (or glibc's arena) is in place */
        void *p = NULL;
        if (kind == 0) { tk_alloc_malloc(a, size, tag, &p, NULL); tk_alloc_free(a, p); }
        else free(malloc(size));
    }
    int nb = 0;
    double total = 0, t_end = now_ns() + seconds * 1e9;
    while (nb < MAXB && now_ns() < t_end) {
        double t0 = now_ns();
        for (int i = 0; i < BATCH; i++) {
            if (size == 0) {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                int k = (int)(x % NLIVE);
                size_t s = (size_t)512 << ((x >> 20) % 15);
                if (kind == 0) {
                    tk_alloc_free(a, live[k]);
                    tk_alloc_malloc(a, s, tag, &live[k], NULL);
                } else {
                    free(live[k]);
                    live[k] = malloc(s);
                }
                sink = live[k];
            } else if (kind == 0) {
                void *p = NULL;
                tk_alloc_malloc(a, size, tag, &p, NULL);
                sink = p;
                tk_alloc_free(a, p);
            } else {
                void *p = malloc(size);
                sink = p;
                free(p);
            }
        }
        double dt = now_ns() - t0;
        batch_ns[nb++] = dt / BATCH;
        total += dt;
    }
    if (size == 0)
        for (int i = 0; i < NLIVE; i++) { if (kind == 0) tk_alloc_free(a, live[i]); else free(live[i]); }
    tk_alloc_destroy(&a);
    qsort(batch_ns, (size_t)nb, sizeof batch_ns[0], cmp_d);
    result r = {nb * (double)BATCH / (total * 1e-9), batch_ns[nb / 2]};
    return r;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 0.3;
    if (secs <= 0) secs = 0.3;
    static const size_t sizes[] = {512, 4096, 65536, 1u << 20, 4u << 20, 32u << 20, 0};
    printf("%-10s %16s %10s %16s %10s %10s\n", "size", "tk_alloc pairs/s", "median ns",
           "glibc pairs/s", "median ns", "speedup");
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        result t = run(0, sizes[i], secs), g = run(1, sizes[i], secs);
        char name[32];
        if (sizes[i]) tk_format_bytes(sizes[i], name, sizeof name);
        else snprintf(name, sizeof name, "mixed");
        printf("%-10s %16.3e %10.1f %16.3e %10.1f %9.2fx\n", name, t.pairs_per_s, t.median_ns,
               g.pairs_per_s, g.median_ns, g.median_ns / t.median_ns);
    }
    return 0;
}
