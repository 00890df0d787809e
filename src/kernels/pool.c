/*
 * pool.c — a kernel's rows over threads (pool.h).
 *
 * Threads are created per call and joined before it returns, not kept in a
 * pool: a handler has no place to keep a pool (the FFI calls it without a
 * context of strata's) and the callers only split work of a millisecond or
 * more, against some 20 us per pthread_create. The FFI's own intra-op
 * thread pool (XLA_FFI_ThreadPool_Schedule) would avoid both; strata does
 * not declare that part of the FFI ABI yet (docs/kernels.md, "Threads").
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/pool.h"

#define ST__MAX_THREADS 64

static _Atomic int g_threads = 0; /* 0: not asked yet */

int st__kernels_threads(void) {
  int v = atomic_load(&g_threads);
  if (v > 0) return v;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  v = n < 1 ? 1 : n > 16 ? 16 : (int)n;
  const char* e = getenv("STRATA_KERNELS_THREADS");
  if (e && *e) {
    char* end = NULL;
    long t = strtol(e, &end, 10);
    if (end && !*end && t >= 1 && t <= ST__MAX_THREADS) v = (int)t;
  }
  atomic_store(&g_threads, v);
  return v;
}

typedef struct st__range {
  st__range_fn fn;
  void* ctx;
  int64_t begin, end;
} st__range;

static void* st__range_main(void* p) {
  st__range* r = p;
  r->fn(r->ctx, r->begin, r->end);
  return NULL;
}

void st__parallel_for(int64_t n, int64_t grain, st__range_fn fn, void* ctx) {
  st__parallel_for_threads(n, grain, st__kernels_threads(), fn, ctx);
}

void st__parallel_for_threads(int64_t n, int64_t grain, int t, st__range_fn fn, void* ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t parts = n / grain;
  if (t > ST__MAX_THREADS) t = ST__MAX_THREADS;
  if (parts > t) parts = t;
  if (parts < 2) {
    fn(ctx, 0, n);
    return;
  }
  st__range r[ST__MAX_THREADS];
  pthread_t th[ST__MAX_THREADS];
  int started[ST__MAX_THREADS] = {0};
  for (int64_t i = 0; i < parts; ++i) {
    r[i] = (st__range){fn, ctx, n * i / parts, n * (i + 1) / parts};
    if (i > 0) started[i] = pthread_create(&th[i], NULL, st__range_main, &r[i]) == 0;
  }
  fn(ctx, r[0].begin, r[0].end);
  for (int64_t i = 1; i < parts; ++i) {
    if (started[i]) pthread_join(th[i], NULL);
    else fn(ctx, r[i].begin, r[i].end);
  }
}
