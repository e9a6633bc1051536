/* tk_data_internal.h — private helpers shared by data.c, batch.c and squad.c
 * (not part of the public API). */
#ifndef TK_DATA_INTERNAL_H
#define TK_DATA_INTERNAL_H
#include "tk_data.h"

/* Appends one feature (n tokens) to f, growing its arrays. `ctx_b*` may be
 * NULL (classification). Returns 0, or -1 on out-of-memory (f stays valid). */
int tk_features_push(tk_features *f, int *cap_feat, int64_t *cap_tok, const int32_t *ids,
                     const int32_t *type_ids, int n, int full_len, int32_t label, int32_t start,
                     int32_t end, int32_t example, const int32_t *ctx_bstart, const int32_t *ctx_bend);
/* A new, empty feature set (off[0] = 0); NULL on out-of-memory. */
tk_features *tk_features_alloc(int max_len, int qa);
/* Fisher-Yates with tk_rand_next. */
void tk_shuffle_i32(int32_t *a, int n, uint64_t *rng);
#endif
