/* gpu_session.c — the notebook path on a GPU: %%txtrain with device: cuda,
 * then %txadvise and %txfix --run, through the interpreter.
 *
 *  - bert-mini on the generated reviews (batch 32 x 128, a peak of a few
 *    hundred MiB, so 3% is not lost in a library's own few MiB) trains on cuda; its run
 *    report's allocator peak equals the plan, byte for byte, and CUPTI's
 *    device peak over the run (the session resets it when the run starts)
 *    is within 1.5% of the plan plus what the libraries keep outside the
 *    allocator (gpu/profile.c's figure for the card); the result
 *    line says the device peak;
 *  - %txmem on the session's cuda device carries the CUPTI reconciliation;
 *  - with a capacity under the plan, %txadvise offers fixes and
 *    %txfix auto --run trains the chosen one on cuda and prints the device
 *    peak against the plan, within 1.5%.
 * The GPU suite runs from the repository root (tests/data is read).
 */
#include "gpu_common.h"
#include "tk_magics.h"
#include "tk_session.h"

#include "magics/magics_rec.h"

#define SMALL                                                                                  \
    "model: bert-mini\ninit: random\nvocab: tests/data/vocab_cased.txt\n"                       \
    "train_file: tests/data/reviews_train.csv\ndev_file: tests/data/reviews_dev.csv\n"          \
    "max_examples: 256\nmax_len: 128\nbatch_size: 32\nbatching: fixed\nepochs: 1\ndevice: cuda\n"

/* The session's last run: allocator == plan, CUPTI within 1.5% of the plan
 * and what the libraries keep outside the allocator. */
static void check_last_run(const char *what) {
    const tk_run_report *r = tk_session_last_run(tk_magics_session(M));
    TK_CHECK_MSG(r != NULL, "%s: no run report", what);
    if (!r) return;
    TK_CHECK_MSG(r->peak_reserved == r->plan.peak_reserved && r->peak_allocated == r->plan.peak_allocated,
                 "%s: measured %zu reserved / %zu allocated, planned %zu / %zu", what, r->peak_reserved,
                 r->peak_allocated, r->plan.peak_reserved, r->plan.peak_allocated);
    TK_CHECK_MSG(r->have_device_peak, "%s: no CUPTI device peak (tracing off?)", what);
    if (!r->have_device_peak) return;
    size_t outside = card_outside(r->plugin_bytes);
    double off = cupti_apart(r->device_peak, r->plan.peak_reserved, outside);
    fprintf(stderr, "  %s: CUPTI device peak %zu, plan %zu + outside the allocator %zu: %.2f%% apart\n", what,
            r->device_peak, r->plan.peak_reserved, outside, 100.0 * off);
    TK_CHECK_MSG(off <= CUPTI_BOUND, "%s: %.2f%% apart", what, 100.0 * off);
}

static void test_txtrain_on_cuda(void) {
    int rc;
    json_t *m = run("%txreset", &rc);
    json_decref(m);
    m = run("%%txtrain\n" SMALL, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_t *res = first(m, "result");
    const char *line = res ? json_string_value(json_object_get(json_object_get(res, "data"), "text/plain")) : NULL;
    TK_CHECK_MSG(line && strstr(line, "Device peak (CUPTI)"), "result: %s", line ? line : "(none)");
    json_decref(m);
    check_last_run("%%txtrain");
    m = run("%txmem --json", &rc);
    json_t *j = last_json(m);
    TK_CHECK(j && json_object_get(j, "device_records") != NULL);
    json_decref(m);
}

static void test_txfix_run_on_cuda(void) {
    int rc;
    const tk_run_report *r = tk_session_last_run(tk_magics_session(M));
    if (!r) return;
    /* a capacity 30% under what the run needed: the advice must cut */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%%txadvise capacity=%zu", r->plan.peak_reserved * 7 / 10);
    json_t *m = run(cmd, &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    json_decref(m);
    m = run("%txfix auto --run", &rc);
    TK_CHECK_MSG(rc == 0, "%s", evalue(m));
    char out[8192];
    stdout_of(m, out, sizeof out);
    TK_CHECK_MSG(strstr(out, "Device peak (CUPTI") != NULL, "%s", out);
    json_decref(m);
    check_last_run("%txfix auto --run");
}

int main(void) {
    if (!gpu_probe()) return 1;
    M = tk_magics_new();
    I = tk_magics_interp(M);
    TK_RUN(test_txtrain_on_cuda);
    TK_RUN(test_txfix_run_on_cuda);
    tk_magics_destroy(&M);
    return tk_test_done();
}
