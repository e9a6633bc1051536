/* tk_advisor_impl.h — helpers the advisor's files share (advisor.c, fixes.c);
 * not part of the advisor's interface. */
#ifndef TK_ADVISOR_IMPL_H
#define TK_ADVISOR_IMPL_H

#include <stdint.h>
#include "tk_config.h"

/* The q-quantile (0..1) of the n lengths, nearest-rank (0 when none). */
int tk_adv_quantile(const int32_t *len, int n, double q);
/* The share of the lengths above max_len. */
double tk_adv_share_longer(const int32_t *len, int n, int max_len);
int tk_adv_round_up8(int x);
/* The config with its model's dimensions filled in (hidden, layers, vocab,
 * ... from a preset or config.json) when they were left to the model: the
 * numbers in diagnoses, risks and the freeze-layers fix need them. The
 * config itself keeps what the user wrote. */
tk_config tk_adv_dims_of(const tk_config *c);

#endif
