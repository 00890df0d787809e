/* sched_internal.h — private to src/sched: helpers shared by its files. */
#ifndef STRATA_SCHED_INTERNAL_H
#define STRATA_SCHED_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "strata/sched.h"

/* LAUNCH, RECOMPUTE, H2D and D2H: ops that complete on the device later. */
bool st__op_is_async(st_op_kind kind);

/* What the last run of an executor recorded (executor.c), for its trace
 * (exec_trace.c). Borrowed from the executor: valid until its next run. */
typedef struct st__exec_record {
  const st_plan* plan;
  int device; /* runtime device of data-parallel index 0 */
  int ndev;   /* buffers per slot: the per-device arrays' stride */
  int stages; /* pipeline stages (1: none); stage s's index d is runtime device device + s * ndev + d */
  const char* host_kind;
  const st_op_timing* timings; /* [op_count] */
  /* [op_count * ndev], op-major: when each device's part could start and completed */
  const double* dev_start;
  const double* dev_complete;
  const int64_t* live_pred; /* [op_count * ST_SLOT_CATEGORY_COUNT] */
  const int64_t* live_acct;
  double t0; /* the run's start on the st_now() clock: every time above is relative to it */
  const st_executor_stats* stats;
} st__exec_record;

void st__executor_record(const st_executor* executor, st__exec_record* out);

#endif /* STRATA_SCHED_INTERNAL_H */
