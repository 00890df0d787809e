/* cli_util.c — CONFIG [k=v ...] and [--json] ARG... handling, and JSON output, shared by subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"

#include "cli/cli_util.h"

st_status st_cli_load_config(const char* command, int argc, char** argv, st_config** out_config) {
  *out_config = NULL;
  if (argc < 1 || strchr(argv[0], '=') != NULL)
    return st_status_make(ST_CODE_CONFIG, "usage: strata %s CONFIG [key=value ...] (e.g. strata %s configs/tiny.yml train.steps=10)",
                          command, command);
  return st_config_load(argv[0], argc - 1, argv + 1, out_config);
}

bool st_cli_json_args(int argc, char** argv, const char* usage, bool* out_json, const char** pos, int max, int* out_count) {
  *out_json = false;
  *out_count = 0;
  for (int i = 0; i < argc; ++i) {
    if (!strcmp(argv[i], "--json")) {
      *out_json = true;
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("%s\n", usage);
      return true;
    } else if (*out_count < max) {
      pos[(*out_count)++] = argv[i];
    } else {
      *out_count = max + 1;
    }
  }
  return false;
}

void st_cli_print_json(const json_t* j, int indent) {
  char* text = st_json_dump(j, indent);
  printf("%s\n", text);
  free(text);
}
