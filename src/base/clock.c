/* clock.c — the monotonic clock every module times durations with. */
#include <time.h>

#include "strata/base.h"

double st_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
