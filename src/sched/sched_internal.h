/* sched_internal.h — private to src/sched: helpers shared by its files. */
#ifndef STRATA_SCHED_INTERNAL_H
#define STRATA_SCHED_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "strata/sched.h"

/* LAUNCH, RECOMPUTE, H2D and D2H: ops that complete on the device later. */
bool st__op_is_async(st_op_kind kind);

#endif /* STRATA_SCHED_INTERNAL_H */
