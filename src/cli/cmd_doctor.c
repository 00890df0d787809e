/* cmd_doctor.c — `strata doctor`: not implemented yet (placeholder so the binary links). */
#include <stdio.h>

#include "cli/commands.h"

int st_cli_doctor(int argc, char** argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "strata doctor: not implemented yet\n");
  return 1;
}
