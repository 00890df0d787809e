/* cli_util.c — CONFIG [k=v ...] and [--json] ARG... handling, and JSON output, shared by subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

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

st_status st_cli_take_allow(int* argc, char** argv, const char** out_allow) {
  static const char kFlag[] = "--allow-mismatch";
  const size_t n = sizeof(kFlag) - 1;
  *out_allow = NULL;
  int k = 0;
  for (int i = 0; i < *argc; ++i) {
    const char* a = argv[i];
    const char* v = NULL;
    if (!strncmp(a, kFlag, n) && a[n] == '=') {
      v = a + n + 1;
    } else if (!strcmp(a, kFlag)) {
      if (i + 1 >= *argc)
        return st_status_make(ST_CODE_CONFIG, "--allow-mismatch needs the identity fields allowed to differ, e.g. "
                                              "--allow-mismatch=tokenizer or --allow-mismatch=model.rope_theta,model.block");
      v = argv[++i];
    } else {
      argv[k++] = argv[i];
      continue;
    }
    if (*out_allow) return st_status_make(ST_CODE_CONFIG, "--allow-mismatch is given twice; name every field in one list, comma-separated");
    if (!v[0]) return st_status_make(ST_CODE_CONFIG, "--allow-mismatch is empty; name the identity fields allowed to differ");
    *out_allow = v;
  }
  *argc = k;
  return ST_OK;
}

void st_cli_print_json(const json_t* j, int indent) {
  char* text = st_json_dump(j, indent);
  printf("%s\n", text);
  free(text);
}
