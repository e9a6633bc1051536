/* host_mem.c — the counting host allocator of test builds (tk_host_mem.h),
 * and the process's resident set: read it, give freed heap back.
 *
 * The counting part compiles to nothing in release builds, where tk_malloc
 * and friends are the C library's, inlined. With TK_HOST_CHAOS every call
 * bumps one atomic counter (OpenMP threads allocate scratch too) and the
 * armed call returns NULL, so a test can fail each host allocation a run
 * makes in turn. */
#include "tk_host_mem.h"

#ifdef TK_HOST_CHAOS

#include <sanitizer/common_interface_defs.h>

static uint64_t calls, fail_at;
static int fired;

void tk_host_chaos_arm(uint64_t nth) {
    __atomic_store_n(&calls, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fired, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fail_at, nth, __ATOMIC_SEQ_CST);
}

uint64_t tk_host_chaos_calls(void) { return __atomic_load_n(&calls, __ATOMIC_SEQ_CST); }
int tk_host_chaos_fired(void) { return __atomic_load_n(&fired, __ATOMIC_SEQ_CST); }

/* 1 when this call is the one to fail. */
static int fail_now(void) {
    uint64_t k = __atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST);
    uint64_t at = __atomic_load_n(&fail_at, __ATOMIC_SEQ_CST);
    if (at == 0 || k != at) return 0;
    __atomic_store_n(&fired, 1, __ATOMIC_SEQ_CST);
    if (getenv("TK_CHAOS_TRACE")) __sanitizer_print_stack_trace(); /* where a misreported failure starts */
    return 1;
}

void *tk_malloc(size_t n) { return fail_now() ? NULL : malloc(n); }
void *tk_calloc(size_t n, size_t size) { return fail_now() ? NULL : calloc(n, size); }
void *tk_realloc(void *p, size_t n) { return fail_now() ? NULL : realloc(p, n); }

char *tk_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = tk_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

char *tk_strndup(const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *d = tk_malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

#endif

#include <malloc.h>
#include <stdio.h>
#include <unistd.h>

size_t tk_host_rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, resident = 0;
    int ok = fscanf(f, "%llu %llu", &size, &resident) == 2;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return ok && page > 0 ? (size_t)(resident * (unsigned long long)page) : 0;
}

size_t tk_host_trim(void) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    return tk_host_rss();
}
