/* internal.h — private to src/kernels. */
#ifndef STRATA_KERNELS_INTERNAL_H
#define STRATA_KERNELS_INTERNAL_H

#include "strata/kernels.h"

extern const st_kernel_handler st__kernel_handlers[];
extern const int st__kernel_handler_count;

/* stats.c: the handler table's index of |target| (-1: none), and one call
 * of handler |handler| from |start_s| to |end_s| (st_now() seconds). */
int st__kernel_handler_index(const char* target);
void st__kernel_stats_record(int handler, double start_s, double end_s);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* math.c's AVX-512 exp on a row (attention.c): s[j] = exp(s[j] - shift) for
 * j < n, returning their sum. Only to be called when st_kernels_isa() is
 * avx512. */
__attribute__((target("avx512f"))) float st__exp_shift_sum_avx512(float* s, int64_t n, float shift);
#endif

#endif
