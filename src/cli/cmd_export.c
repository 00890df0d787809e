/* cmd_export.c — `strata export`: not implemented yet (placeholder so the binary links). */
#include <stdio.h>

#include "cli/commands.h"

int st_cli_export(int argc, char** argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "strata export: not implemented yet\n");
  return 1;
}
