/* advisor_bench.c — how fast the advisor plans candidate configs.
 *
 * Two figures for bert-base-cased on the t4 profile:
 *  1. tk_advise on the seed scenario with a long-tailed corpus of 20,000
 *     lengths (max_len 512, batch 32) on three card sizes (the smallest makes
 *     the search run through pairs and triples): configs planned, wall time.
 *  2. 240 distinct configs (batch x max_len x accumulate x freeze) planned
 *     one after another with tk_plan: configs per second.
 * The target: at least 200 candidate configs in under 1 s.
 * Run: make bench-advisor
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tk_advisor.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
    tk_config c;
    tk_err e;
    tk_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "bert-base-cased");
    snprintf(c.gpu, sizeof c.gpu, "t4");
    c.device = TK_DEVICE_META;
    c.max_len = 512;
    c.batch_size = 32;
    if (tk_config_resolve_model(&c, &e) != TK_OK) {
        fprintf(stderr, "advisor_bench: %s\n", e.msg);
        return 1;
    }
    int n = 20000;
    int32_t *len = malloc((size_t)n * sizeof *len);
    uint64_t s = 7;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        int r = (int)((s >> 33) % 1000);
        len[i] = r < 995 ? 16 + (int)((s >> 13) % 140) : 200 + r / 3;
    }
    tk_advice *a = malloc(sizeof *a);
    /* the seed on a T4, on the seed's 7.43 GiB card, and on a card so small
     * that no single fix is enough and the search goes through pairs and
     * triples up to its budget of 400 plans */
    static const struct { const char *name; size_t cap; } cards[] = {
        {"t4 (14.75 GiB)", 0}, {"7.43 GiB", 7977901752u}, {"2.5 GiB", 2684354560u}};
    for (int k = 0; k < 3; k++) {
        tk_config ck = c;
        ck.capacity = cards[k].cap;
        tk_advise_input in = { .config = &ck, .lengths = len, .n_lengths = n, .max_plans = 400 };
        double t0 = now_s();
        if (tk_advise(&in, a, &e) != TK_OK) {
            fprintf(stderr, "advisor_bench: %s\n", e.msg);
            return 1;
        }
        double t1 = now_s();
        int au = tk_advice_auto(a);
        printf("tk_advise (bert-base-cased, 512 x 32, %s, 20000-example corpus): %d configs planned in %.1f ms "
               "(%.2f ms each), %d candidates ranked; auto: %s\n",
               cards[k].name, a->n_planned, 1e3 * (t1 - t0), 1e3 * (t1 - t0) / a->n_planned, a->n_cand,
               au >= 0 ? a->cand[au].label : "none fits with margin");
    }
    int planned = 0;
    static const int batches[] = { 8, 16, 32, 64 };
    static const int lens[] = { 64, 128, 256, 384, 512 };
    double t0 = now_s();
    for (int bi = 0; bi < 4; bi++)
        for (int li = 0; li < 5; li++)
            for (int acc = 1; acc <= 4; acc *= 2)
                for (int fz = 0; fz < 4; fz++) {
                    tk_config k = c;
                    k.batch_size = batches[bi];
                    k.max_len = lens[li];
                    k.accumulate = acc;
                    k.freeze_embeddings = fz & 1;
                    k.freeze_layers = (fz & 2) ? 6 : 0;
                    tk_plan_result p;
                    if (tk_plan(&k, NULL, 0, &p, &e) == TK_OK)
                        planned++;
                }
    double t1 = now_s();
    printf("tk_plan sweep (bert-base-cased): %d configs in %.1f ms = %.0f configs/s; 200 configs take %.0f ms\n",
           planned, 1e3 * (t1 - t0), planned / (t1 - t0), 200e3 * (t1 - t0) / planned);
    free(a);
    free(len);
    return 0;
}
