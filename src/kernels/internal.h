/* internal.h — private to src/kernels. */
#ifndef STRATA_KERNELS_INTERNAL_H
#define STRATA_KERNELS_INTERNAL_H

#include "strata/kernels.h"

extern const st_kernel_handler st__kernel_handlers[];
extern const int st__kernel_handler_count;

#endif
