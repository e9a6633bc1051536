/* cuda_reference.c — the switch between each op's fast kernel and its
 * reference (cuda_common.cuh explains the pair): exported so that the GPU
 * tests hold every fast kernel against its reference on the same card. */
#include "cuda_internal.h"

__attribute__((visibility("default")))
void tk_cuda_set_reference(void *ctx, int on) {
    ((tk_cuda_ctx *)ctx)->reference = on != 0;
}
