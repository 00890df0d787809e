/* cmd_config.c — `strata config`: the resolved config with the source of
 * every value, or as YAML / JSON, or the schema reference as Markdown. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "strata/config.h"

static void st__config_usage(FILE* out) {
  fprintf(out,
          "usage: strata config [--yaml | --json] CONFIG [key=value ...]\n"
          "       strata config --schema\n"
          "\n"
          "  (default)  every key, its value and where it came from (default, file:line, command line)\n"
          "  --yaml     the resolved config as YAML (what a run writes to <run>/config.yaml)\n"
          "  --json     the resolved config as nested JSON\n"
          "  --schema   the reference of every key as Markdown (docs/config.md)\n");
}

int st_cli_config(int argc, char** argv) {
  enum { kSources, kYaml, kJson, kSchema } mode = kSources;
  int i = 0;
  /* Options come before CONFIG; after it everything is key=value. */
  for (; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; ++i) {
    const char* a = argv[i];
    if (!strcmp(a, "--yaml")) {
      mode = kYaml;
    } else if (!strcmp(a, "--json")) {
      mode = kJson;
    } else if (!strcmp(a, "--schema")) {
      mode = kSchema;
    } else if (!strcmp(a, "--help")) {
      st__config_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--")) {
      ++i;
      break;
    } else {
      return st_cli_report(st_status_make(ST_CODE_CONFIG, "unknown option '%s' (see strata config --help)", a));
    }
  }
  if (i < argc && !strcmp(argv[i], "-h")) {
    st__config_usage(stdout);
    return 0;
  }
  if (mode == kSchema) {
    if (i < argc) return st_cli_report(st_status_make(ST_CODE_CONFIG, "--schema takes no other arguments"));
    return st_cli_report(st_config_write_schema_markdown(stdout));
  }
  if (i >= argc)
    return st_cli_report(st_status_make(ST_CODE_CONFIG,
                                        "missing CONFIG (a YAML file, e.g. configs/tiny.yml; "
                                        "see strata config --help)"));
  const char* path = argv[i++];
  /* `strata config train.steps=5`: an override where the file should be. */
  if (strchr(path, '=') && access(path, F_OK) != 0)
    return st_cli_report(
        st_status_make(ST_CODE_CONFIG, "missing CONFIG before '%s' (strata config CONFIG [key=value ...])", path));
  st_config* config = NULL;
  st_status s = st_config_load(path, argc - i, argv + i, &config);
  if (!s) {
    switch (mode) {
      case kYaml: s = st_config_write_yaml(config, stdout); break;
      case kJson: s = st_config_write_json(config, stdout); break;
      default: s = st_config_print_sources(config, stdout); break;
    }
  }
  st_config_destroy(config);
  return st_cli_report(s);
}
