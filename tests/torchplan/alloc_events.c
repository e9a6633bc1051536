/* alloc_events.c — PyTorch's CPU allocator's events without its profiler.
 *
 * LD_PRELOAD'ed into a Python that runs torch on the CPU. c10's CPU
 * allocator takes every tensor's storage from posix_memalign() (alignment
 * 64; c10/core/impl/alloc_cpu.cpp) and gives it back with free(), so this
 * library records each posix_memalign (address, bytes) and each free() of an
 * address it handed out, in order, in memory of its own (mmap, never
 * malloc). Python reads them with ctypes after the run
 * (tests/torchplan/torch_reference.py --shim): the torch 1.13 row's profiler
 * has no kineto and reports no addresses, so this is how that row's
 * allocator events are read. Only calls made from libc10 are c10's: oneDNN
 * takes its own per-thread scratch and reordered weights from
 * posix_memalign too (on a CPU with AVX512-BF16, a bf16 step's oneDNN
 * matmuls held 742 KiB of them at the peak), which no allocator event of
 * PyTorch's shows and the profiler does not count. Everything else (malloc,
 * calloc, Python's own objects) is left alone.
 *
 *   int64_t ae_count(void);        events recorded so far
 *   const ae_event *ae_events(void);
 *   void ae_reset(void);           forget them (the live table is kept)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

typedef struct { uint64_t addr; int64_t bytes; } ae_event; /* bytes < 0: freed */

#define EV_CAP (1 << 24)      /* 16M events, 256 MiB of address space, touched as used */
#define TAB_BITS 22           /* live addresses: open addressing, 4M slots */
#define TAB_SIZE (1u << TAB_BITS)
#define TOMB ((uint64_t)1)

static ae_event *ev;
static uint64_t *tab_key;
static int64_t *tab_val;
static int64_t n_ev;
static atomic_flag lock = ATOMIC_FLAG_INIT;
static int (*real_pm)(void **, size_t, size_t);
extern void __libc_free(void *);

static int setup(void) {
    if (ev) return 1;
    void *a = mmap(NULL, sizeof(ae_event) * EV_CAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *k = mmap(NULL, sizeof(uint64_t) * TAB_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *v = mmap(NULL, sizeof(int64_t) * TAB_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (a == MAP_FAILED || k == MAP_FAILED || v == MAP_FAILED) return 0;
    tab_key = k, tab_val = v, ev = a;
    return 1;
}

static uint32_t slot_of(uint64_t p) { return (uint32_t)((p * 0x9E3779B97F4A7C15ULL) >> (64 - TAB_BITS)); }

static void record(uint64_t addr, int64_t bytes) {
    if (n_ev < EV_CAP) ev[n_ev].addr = addr, ev[n_ev].bytes = bytes;
    n_ev++; /* past the cap: counted, and ae_count() says so */
}

/* 1 when the code at `ra` is in libc10 (c10's CPU allocator). */
static int from_c10(const void *ra) {
    Dl_info info;
    if (!dladdr(ra, &info) || !info.dli_fname) return 0;
    const char *base = info.dli_fname, *s;
    for (s = base; *s; s++)
        if (*s == '/') base = s + 1;
    return base[0] == 'l' && base[1] == 'i' && base[2] == 'b' && base[3] == 'c' && base[4] == '1' && base[5] == '0' &&
           (base[6] == '.' || base[6] == '_');
}

int posix_memalign(void **out, size_t align, size_t size) {
    if (!real_pm) real_pm = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    int r = real_pm(out, align, size);
    if (r != 0 || !*out || !from_c10(__builtin_return_address(0))) return r;
    while (atomic_flag_test_and_set_explicit(&lock, memory_order_acquire)) {}
    if (setup()) {
        uint64_t p = (uint64_t)*out;
        uint32_t i = slot_of(p);
        for (uint32_t n = 0; n < TAB_SIZE; n++, i = (i + 1) & (TAB_SIZE - 1))
            if (tab_key[i] == 0 || tab_key[i] == TOMB || tab_key[i] == p) {
                tab_key[i] = p, tab_val[i] = (int64_t)size;
                record(p, (int64_t)size);
                break;
            }
    }
    atomic_flag_clear_explicit(&lock, memory_order_release);
    return r;
}

void free(void *ptr) {
    if (ptr && ev) {
        uint64_t p = (uint64_t)ptr;
        while (atomic_flag_test_and_set_explicit(&lock, memory_order_acquire)) {}
        uint32_t i = slot_of(p);
        for (uint32_t n = 0; n < TAB_SIZE && tab_key[i] != 0; n++, i = (i + 1) & (TAB_SIZE - 1))
            if (tab_key[i] == p) {
                record(p, -tab_val[i]);
                tab_key[i] = TOMB;
                break;
            }
        atomic_flag_clear_explicit(&lock, memory_order_release);
    }
    __libc_free(ptr);
}

int64_t ae_count(void) { return n_ev; }
const ae_event *ae_events(void) { return ev; }
void ae_reset(void) {
    while (atomic_flag_test_and_set_explicit(&lock, memory_order_acquire)) {}
    n_ev = 0;
    atomic_flag_clear_explicit(&lock, memory_order_release);
}
