/* sched_internal.h — private to src/sched: helpers shared by its files. */
#ifndef STRATA_SCHED_INTERNAL_H
#define STRATA_SCHED_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "strata/sched.h"

/* realloc that aborts on out of memory (plan building never fails softly). */
void* st__sched_xrealloc(void* p, size_t n);
/* LAUNCH, RECOMPUTE, H2D and D2H: ops that complete on the device later. */
bool st__op_is_async(st_op_kind kind);

#endif /* STRATA_SCHED_INTERNAL_H */
