/* tk_test.h — the tiny harness every C unit test uses.
 *
 * A test file defines functions `static void test_xxx(void)` and lists them in
 * main() with TK_RUN(test_xxx); main returns tk_test_done(), which prints the one
 * closing line the runner reads: "N passed, N failed". A check that fails prints
 * file:line and the expression, and marks the current test failed; the test goes
 * on so one run shows every failure. */
#ifndef TK_TEST_H
#define TK_TEST_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tk_test_passed, tk_test_failed, tk_test_cur_failed;

#define TK_CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    tk_test_cur_failed = 1; } } while (0)

#define TK_CHECK_MSG(cond, ...) do { if (!(cond)) { \
    fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
    tk_test_cur_failed = 1; } } while (0)

#define TK_CHECK_EQ_INT(a, b) do { long long _a = (long long)(a), _b = (long long)(b); \
    if (_a != _b) { fprintf(stderr, "  %s:%d: %s == %s: %lld != %lld\n", \
    __FILE__, __LINE__, #a, #b, _a, _b); tk_test_cur_failed = 1; } } while (0)

#define TK_CHECK_STR(a, b) do { const char *_a = (a), *_b = (b); \
    if (!_a || !_b || strcmp(_a, _b) != 0) { fprintf(stderr, \
    "  %s:%d: %s == %s: \"%s\" != \"%s\"\n", __FILE__, __LINE__, #a, #b, \
    _a ? _a : "(null)", _b ? _b : "(null)"); tk_test_cur_failed = 1; } } while (0)

#define TK_CHECK_NEAR(a, b, tol) do { double _a = (a), _b = (b); \
    if (!(fabs(_a - _b) <= (tol))) { fprintf(stderr, "  %s:%d: %s ~ %s: %g vs %g (tol %g)\n", \
    __FILE__, __LINE__, #a, #b, _a, _b, (double)(tol)); tk_test_cur_failed = 1; } } while (0)

/* TK_TEST_ONLY=name (a substring) runs only the tests whose function names
 * hold it: for one test under a slow tool (valgrind, compute-sanitizer). */
static inline int tk_test_selected(const char *name) {
    const char *only = getenv("TK_TEST_ONLY");
    return !only || !*only || strstr(name, only) != NULL;
}

#define TK_RUN(fn) do { if (!tk_test_selected(#fn)) break; tk_test_cur_failed = 0; fn(); \
    if (tk_test_cur_failed) { tk_test_failed++; fprintf(stderr, "FAIL %s\n", #fn); } \
    else { tk_test_passed++; fprintf(stderr, "ok   %s\n", #fn); } } while (0)

static inline int tk_test_done(void) {
    printf("%d passed, %d failed\n", tk_test_passed, tk_test_failed);
    return tk_test_failed ? 1 : 0;
}
/* n floats uniform in [-amp, amp) from a seeded LCG (malloc'd; NULL when
 * out of memory): the same inputs on every run and every machine. */
static inline float *tk_test_uniform(int64_t n, uint64_t seed, float amp) {
    float *x = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof *x); /* a cast: C++ tests include this too */
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; x && i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = amp * ((float)(s >> 40) / 16777216.0f * 2.0f - 1.0f);
    }
    return x;
}

#endif
