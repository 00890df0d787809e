/* plan_internal.h — what the plan module's files share and nobody else
 * sees: the pipeline schedules (pipeline.c) that step_plan.c emits and
 * explain.c draws. */
#ifndef STRATA_PLAN_INTERNAL_H
#define STRATA_PLAN_INTERNAL_H

#include <stdbool.h>

#include "strata/plan.h"
#include "strata/sched.h"
#include "strata/status.h"

/* One unit of pipeline work: microbatch |micro|'s forward or backward
 * through model chunk |chunk|, which lies on stage chunk % P, with its
 * simulated start and end in the cost unit of st_pipe_schedule_make. */
typedef st_plan_pipe_task st_pipe_task;

/* A schedule: every stage's task sequence (1F1B, GPipe or interleaved
 * 1F1B), and one global order consistent with each stage's sequence and
 * with the data dependencies (a chunk's forward after the previous chunk's;
 * its backward after the next chunk's backward and its own forward),
 * ordered by simulated start time: the order the plan issues them in. */
typedef struct st_pipe_schedule {
  int P, V, M, C; /* stages, chunks per stage, microbatches, chunks (P x V) */
  int n;          /* tasks: 2 x M x C */
  st_pipe_task* tasks; /* owned: the global order */
  double makespan;     /* simulated step time */
  double busy;         /* summed task time over all stages */
  double bubble;       /* 1 - busy / (P x makespan) */
  double theory;       /* (P-1) / (M+P-1); interleaved: (P-1) / (V M + P-1) */
} st_pipe_schedule;

/* Builds the schedule |kind| (ST_PLAN_PIPE_*) for P stages, V chunks per
 * stage and M microbatches, simulating each task's time from the chunk's
 * forward and backward cost (|fwd|, |bwd|: C entries each; NULL: 1 and 2,
 * equal chunks). Transfers take no time in the simulation. Errors
 * (ST_CODE_CONFIG) for shapes the schedule cannot take. */
st_status st_pipe_schedule_make(int kind, int P, int V, int M, const double* fwd, const double* bwd,
                                st_pipe_schedule* out);
void st_pipe_schedule_free(st_pipe_schedule* s);

/* Splits |L| layers into |C| contiguous chunks of at least one layer,
 * minimising the largest chunk's cost: layer l costs cost[l], chunk 0 adds
 * |first_extra| (the embedding) and chunk C-1 |last_extra| (the head and
 * loss). |out_first| receives C + 1 entries: chunk c is layers
 * [out_first[c], out_first[c+1]). */
void st_pipe_balance(int L, int C, const double* cost, double first_extra, double last_extra, int* out_first);

/* A pipeline's chunk table (parallel.pipeline_layers, or balanced by
 * st_pipe_balance on the programs' FLOPs) and each chunk's forward and
 * backward cost for the schedule's simulation: |first| has C + 1 entries,
 * |fwd| and |bwd| C (C = parallel.pipeline x the chunks per stage).
 * |remat| (may be NULL: none) says which layers recompute (step_plan.c). */
st_status st_plan_pipeline_layout(const st_bundle* b, const st_plan_options* o, const bool* remat, int* first,
                                  double* fwd, double* bwd);

#endif /* STRATA_PLAN_INTERNAL_H */
