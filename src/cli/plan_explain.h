/* plan_explain.h — `strata plan --explain` (docs/parallelism.md): the mesh,
 * every tensor of the step plan with its sharding, the collectives per layer
 * with their bytes, predicted per-device memory by category and the
 * communication volume per step. */
#ifndef STRATA_CLI_PLAN_EXPLAIN_H
#define STRATA_CLI_PLAN_EXPLAIN_H

#include <stdio.h>

#include "strata/base.h"
#include "strata/sched.h"
#include "strata/train.h"

/* Everything, every tensor listed (returned, owned by the caller). |step|
 * and |eval| are the finalized plans built from |o|. */
json_t* st_plan_explain_json(const st_plan* step, const st_plan* eval, const st_plan_options* o);
/* The same for a screen: tensors grouped by category, sharding and name
 * pattern. |j| is st_plan_explain_json's result for |step|. */
void st_plan_explain_print(const st_plan* step, const json_t* j, FILE* out);

#endif
