/* cmd_train.c — `strata train CONFIG [k=v ...]`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/dist.h"
#include "strata/train.h"

/* One rank of a job started by mpirun or srun: the launcher knows how many
 * processes there are, so parallel.processes comes from it
 * (docs/multiprocess.md) unless the command line sets it, in which case
 * the trainer checks the two agree. */
static char** st__train_args(int* argc, char** argv, char* procs, size_t size) {
  st_dist_launch launch;
  st_status s = st_dist_detect(&launch);
  if (s) {
    st_status_free(s); /* the trainer detects again and reports it */
    return NULL;
  }
  if (!launch.multi || launch.world_size < 2) return NULL;
  for (int i = 1; i < *argc; ++i)
    if (!strncmp(argv[i], "parallel.processes=", 19)) return NULL;
  snprintf(procs, size, "parallel.processes=%d", launch.world_size);
  char** args = st_xcalloc((size_t)*argc + 2, sizeof(char*));
  memcpy(args, argv, (size_t)*argc * sizeof(char*));
  args[(*argc)++] = procs;
  return args;
}

int st_cli_train(int argc, char** argv) {
  char procs[48];
  char** args = st__train_args(&argc, argv, procs, sizeof(procs));
  st_config* cfg = NULL;
  st_status s = st_cli_load_config("train", argc, args ? args : argv, &cfg);
  if (!s) s = st_train_main(cfg);
  st_config_destroy(cfg);
  free(args);
  return st_cli_report(s);
}
