/* policy.c — sched.offload's names as ST_OFFLOAD_* bits. (sched.remat's
 * syntax is config's: st_config_remat_parse, src/config/values.c.) */
#include <string.h>

#include "strata/sched.h"

int st_sched_offload_parse(const char* name) {
  if (!name) return -1;
  if (!strcmp(name, "none")) return 0;
  if (!strcmp(name, "optimizer")) return ST_OFFLOAD_OPTIMIZER;
  if (!strcmp(name, "params")) return ST_OFFLOAD_PARAMS;
  if (!strcmp(name, "both")) return ST_OFFLOAD_OPTIMIZER | ST_OFFLOAD_PARAMS;
  return -1;
}
