/* cmd_config.c — `strata config`: not implemented yet (placeholder so the binary links). */
#include <stdio.h>

#include "cli/commands.h"

int st_cli_config(int argc, char** argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "strata config: not implemented yet\n");
  return 1;
}
