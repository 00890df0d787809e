/* cmd_plan.c — `strata plan`: not implemented yet (placeholder so the binary links). */
#include <stdio.h>

#include "cli/commands.h"

int st_cli_plan(int argc, char** argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "strata plan: not implemented yet\n");
  return 1;
}
