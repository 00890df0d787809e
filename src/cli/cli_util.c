/* cli_util.c — CONFIG [k=v ...] handling shared by subcommands. */
#include <string.h>

#include "cli/cli_util.h"

st_status st_cli_load_config(const char* command, int argc, char** argv, st_config** out_config) {
  *out_config = NULL;
  if (argc < 1 || strchr(argv[0], '=') != NULL)
    return st_status_make(ST_CODE_CONFIG, "usage: strata %s CONFIG [key=value ...] (e.g. strata %s configs/tiny.yml train.steps=10)",
                          command, command);
  return st_config_load(argv[0], argc - 1, argv + 1, out_config);
}
