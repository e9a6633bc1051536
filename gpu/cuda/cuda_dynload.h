/* cuda_dynload.h — cuBLAS, cuBLASLt and CUPTI found and opened at run time
 * (cuda_dynload.c says where it looks and why). The plugin calls these
 * libraries under their own names; cuda_dynload.c defines each of those
 * names and forwards to the function it resolved. */
#ifndef TK_CUDA_DYNLOAD_H
#define TK_CUDA_DYNLOAD_H
#include <stddef.h>

/* Opens cuBLASLt and cuBLAS (one CUDA major, 13 before 12) and resolves every
 * function the plugin calls in them. Once per process; later calls return
 * the first answer. 0 on success; else -1 with one line in why naming the
 * library that is missing (or the function it lacks) and where it looked. */
int tk_cuda_blas_open(char *why, size_t n);

/* The same for CUPTI (CUDA 13's first: the runtime linked in). 0 or -1 with why;
 * without CUPTI the plugin runs with its tracing off. */
int tk_cuda_cupti_open(char *why, size_t n);

/* What was opened, from where: "cuBLAS 13 (/path/libcublas.so.13), ...". */
const char *tk_cuda_libs_where(void);

#endif
