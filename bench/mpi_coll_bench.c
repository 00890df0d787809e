/* mpi_coll_bench.c — the dist engine's all-reduce time against message size,
 * for the alpha-beta model of docs/multiprocess.md ("Scaling estimate") and
 * `make bench`'s multiprocess section, which fits it.
 *
 *   mpirun -np P build/mpi_coll_bench [MAX_BYTES]
 *
 * Sizes 4 B, 16 B, ... (x4) up to MAX_BYTES (default 64 MiB). Each size:
 * two untimed all-reduces, then |iters| timed ones (more for small
 * messages), each queued and waited at once (st_dist_coll_start, then
 * st_dist_coll_wait: what a step does when nothing else runs), timed on
 * every rank. The figure of a size is the median over iterations of the
 * slowest rank's time. Rank 0 prints one JSON line per size:
 *   {"bytes": B, "iters": K, "median_s": T, "min_s": T0, "bytes_sent": S}
 * bytes_sent: what one rank sent for one all-reduce (the engine's count).
 * Exit 1 on any failure, with the message on stderr. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/dist.h"

static int st__cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Iterations of a size: about 64 MiB moved per size, at least 5, at most 400. */
static int st__iters(size_t bytes) {
  size_t k = ((size_t)64 << 20) / (bytes ? bytes : 1);
  return k < 5 ? 5 : k > 400 ? 400 : (int)k;
}

/* One all-reduce of |count| floats, queued and waited; its seconds. */
static st_status st__once(st_dist* d, float* data, size_t count, double* secs) {
  st_dist_coll_request req = {.kind = ST_DIST_ALL_REDUCE, .data = data, .count = count, .name = "bench"};
  st_dist_coll* c = NULL;
  double t0 = st_now();
  ST_RETURN(st_dist_coll_start(d, &req, &c));
  st_status s = st_dist_coll_wait(c, NULL);
  *secs = st_now() - t0;
  return s;
}

/* Every size: the slowest rank's time per iteration, its median and least. */
static st_status st__sweep(st_dist* d, size_t max_bytes) {
  const int P = st_dist_size(d);
  float* data = st_xcalloc(max_bytes / sizeof(float) + 1, sizeof(float));
  double* mine = st_xcalloc(400, sizeof(double));
  double* all = st_xcalloc((size_t)400 * (size_t)P, sizeof(double));
  st_status s = ST_OK;
  for (size_t bytes = 4; bytes <= max_bytes && !s; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    const int iters = st__iters(bytes);
    double t;
    for (int w = 0; w < 2 && !s; ++w) s = st__once(d, data, count, &t);
    for (int i = 0; i < iters && !s; ++i) s = st__once(d, data, count, &mine[i]);
    if (!s) s = st_dist_allgather_f64(d, mine, (size_t)iters, all);
    if (s) break;
    for (int i = 0; i < iters; ++i)
      for (int r = 1; r < P; ++r)
        if (all[(size_t)r * (size_t)iters + (size_t)i] > all[i]) all[i] = all[(size_t)r * (size_t)iters + (size_t)i];
    qsort(all, (size_t)iters, sizeof(double), st__cmp_double);
    if (st_dist_rank(d) == 0) {
      printf("{\"bytes\": %zu, \"iters\": %d, \"median_s\": %.9f, \"min_s\": %.9f, \"bytes_sent\": %lld}\n", bytes, iters,
             all[iters / 2], all[0], (long long)st_dist_coll_bytes_sent(ST_DIST_ALL_REDUCE, count, P));
      fflush(stdout);
    }
  }
  free(all);
  free(mine);
  free(data);
  return s;
}

int main(int argc, char** argv) {
  size_t max_bytes = (size_t)64 << 20;
  if (argc > 1) {
    char* end = NULL;
    unsigned long long v = strtoull(argv[1], &end, 10);
    if (!end || *end || v < 4) {
      fprintf(stderr, "usage: mpirun -np P %s [MAX_BYTES >= 4]\n", argv[0]);
      return 2;
    }
    max_bytes = (size_t)v;
  }
  st_dist* d = NULL;
  st_status s = st_dist_init(NULL, &d);
  if (!s) s = st__sweep(d, max_bytes);
  st_status f = st_dist_finalize(d);
  if (s)
    st_status_free(f);
  else
    s = f;
  if (s) {
    fprintf(stderr, "mpi_coll_bench: %s\n", st_status_message(s));
    st_status_free(s);
    return 1;
  }
  return 0;
}
