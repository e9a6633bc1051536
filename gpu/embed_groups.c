/* embed_groups.c — the grouping of a batch's token ids that the embedding
 * backward sums by (tk_op_embed_bwd with groups, tk_gpu.h).
 *
 * Each table row that occurs gets one writer: its positions in the batch,
 * in order, cut into chunks of TK_EMBED_CHUNK. A chunk is summed from zero
 * and the chunk sums are added to the row in chunk order, so a row that a
 * whole batch points at (a token type, [PAD]) is summed by many chunks in
 * parallel and still in one fixed order: no atomics, the same bits on every
 * run and every backend. Built on the host from the ids the step uploads
 * anyway, so the plan only sees the tensor's size.
 */
#include <stdlib.h>

#include "tk_gpu.h"
#include "tk_host_mem.h"

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int tk_embed_groups_build(int32_t *out, const int32_t *ids, int64_t n, int64_t rows) {
    const int64_t K = TK_EMBED_CHUNK;
    uint64_t *key = tk_malloc((size_t)(n > 0 ? n : 1) * sizeof *key);
    int64_t *gsize = tk_malloc((size_t)(n > 0 ? n : 1) * sizeof *gsize);
    int64_t *gbeg = tk_malloc((size_t)(n > 0 ? n : 1) * sizeof *gbeg);
    if (!key || !gsize || !gbeg) {
        free(key);
        free(gsize);
        free(gbeg);
        return -2;
    }
    int rc = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (rows >= 0 && ids[i] >= rows)) rc = -1;
        key[i] = ((uint64_t)(uint32_t)ids[i] << 32) | (uint64_t)i; /* by id, then position */
    }
    if (rc == 0) {
        qsort(key, (size_t)n, sizeof *key, cmp_u64);
        int64_t G = 0;
        for (int64_t i = 0; i < n; i++) {
            if (i == 0 || (key[i] >> 32) != (key[i - 1] >> 32)) gbeg[G++] = i;
            gsize[G - 1] = i - gbeg[G - 1] + 1;
        }
        int64_t NC = 0, NM = 0, GM = 0;
        for (int64_t g = 0; g < G; g++) {
            int64_t nc = (gsize[g] + K - 1) / K;
            NC += nc;
            if (nc > 1) NM += nc, GM++;
        }
        int32_t *row = out + 4, *first = row + G, *start = first + G + 1, *owner = start + NC + 1;
        int32_t *order = owner + NC;
        out[0] = (int32_t)G;
        out[1] = (int32_t)NC;
        out[2] = (int32_t)NM;
        out[3] = (int32_t)GM;
        /* groups with several chunks first (their chunks then own scratch
         * rows 0..NM-1), each part in table-row order */
        int64_t gi = 0, ci = 0, pos = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int64_t g = 0; g < G; g++) {
                int64_t s = gsize[g], nc = (s + K - 1) / K;
                if ((nc > 1) != (pass == 0)) continue;
                row[gi] = (int32_t)(key[gbeg[g]] >> 32);
                first[gi] = (int32_t)ci;
                for (int64_t c = 0; c < nc; c++, ci++) {
                    start[ci] = (int32_t)(pos + c * K);
                    owner[ci] = (int32_t)gi;
                }
                for (int64_t k = 0; k < s; k++) order[pos + k] = (int32_t)(key[gbeg[g] + k] & 0xFFFFFFFFu);
                pos += s;
                gi++;
            }
        first[G] = (int32_t)NC;
        start[NC] = (int32_t)n;
    }
    free(key);
    free(gsize);
    free(gbeg);
    return rc;
}
