/* cmd_train.c — `strata train`: not implemented yet (placeholder so the binary links). */
#include <stdio.h>

#include "cli/commands.h"

int st_cli_train(int argc, char** argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "strata train: not implemented yet\n");
  return 1;
}
