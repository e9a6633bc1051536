/* tk_host_mem.h — host memory for every module above the device backends
 * (gpu/, bert/, advisor/, magics/): tk_malloc, tk_calloc, tk_realloc,
 * tk_strdup, tk_strndup, released with free().
 *
 * Why one seam: a host allocation that fails must come back as TK_ENOMEM
 * ("out of host memory"), and the only way to know every such path does is
 * to fail each allocation in turn, as jansson's test_chaos does. Release
 * builds get the C library's functions inlined (no cost); the test build
 * (libtk_asan.a, compiled with -DTK_HOST_CHAOS) counts each call, and
 * tk_host_chaos_arm(n) makes the n-th call from then on return NULL.
 * Device memory (the cpu backend's segments) does not come through here: its
 * failures are the allocator's TK_EOOM, with a tk_oom record.
 */
#ifndef TK_HOST_MEM_H
#define TK_HOST_MEM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef TK_HOST_CHAOS

void *tk_malloc(size_t n);
void *tk_calloc(size_t n, size_t size);
void *tk_realloc(void *p, size_t n);
char *tk_strdup(const char *s);
char *tk_strndup(const char *s, size_t n);

/* Test hooks: count calls from now; the nth (1-based) fails, and every one
 * after it succeeds again. n = 0 disarms. */
void tk_host_chaos_arm(uint64_t nth);
uint64_t tk_host_chaos_calls(void);  /* calls since the last arm */
int tk_host_chaos_fired(void);       /* whether the armed call has failed */

#else

static inline void *tk_malloc(size_t n) { return malloc(n); }
static inline void *tk_calloc(size_t n, size_t size) { return calloc(n, size); }
static inline void *tk_realloc(void *p, size_t n) { return realloc(p, n); }
static inline char *tk_strdup(const char *s) { return strdup(s); }
static inline char *tk_strndup(const char *s, size_t n) { return strndup(s, n); }

#endif

/* The process's resident set size now, in bytes (/proc/self/statm); 0 where
 * it cannot be read. What Colab's RAM gauge and `ps` show. */
size_t tk_host_rss(void);
/* Gives the heap that was freed back to the system: glibc keeps freed
 * memory in its arenas (the main one and one per thread that allocated,
 * OpenMP workers included), so after a run the process would stay as large
 * as the run's peak; malloc_trim(0) releases the free pages of every arena.
 * Called where a run ends and at a session reset. Returns the RSS after. */
size_t tk_host_trim(void);

#endif
