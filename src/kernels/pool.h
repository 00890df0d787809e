/* pool.h — private to src/kernels: splitting a kernel's rows over threads. */
#ifndef STRATA_KERNELS_POOL_H
#define STRATA_KERNELS_POOL_H

#include <stdint.h>

/* fn(ctx, begin, end) over [0, n) in contiguous ranges. */
typedef void (*st__range_fn)(void* ctx, int64_t begin, int64_t end);

/* The number of threads a kernel may use: STRATA_KERNELS_THREADS when set
 * (1..64), else the CPUs online, at most 16. Asked once. */
int st__kernels_threads(void);

/* Runs fn over [0, n), split into at most st__kernels_threads() ranges of at
 * least |grain| items each; the calling thread runs one range. Work below
 * two grains runs inline. A thread that cannot be created is no error: its
 * range runs on the calling thread. */
void st__parallel_for(int64_t n, int64_t grain, st__range_fn fn, void* ctx);
/* The same on at most |threads| threads (attention.c: its callers, tests
 * among them, choose the count). */
void st__parallel_for_threads(int64_t n, int64_t grain, int threads, st__range_fn fn, void* ctx);

#endif
