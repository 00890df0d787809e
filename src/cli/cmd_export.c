/* cmd_export.c — `strata export CONFIG [k=v ...]`: writes (or validates)
 * the program bundle for the config and prints its folder. */
#include <stdio.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/train.h"

int st_cli_export(int argc, char** argv) {
  st_config* cfg = NULL;
  st_status s = st_cli_load_config("export", argc, argv, &cfg);
  if (!s) {
    st_train_options o;
    s = st_train_options_from_config(cfg, &o);
    st_bundle_request req = {o.model_json, o.cache_root, o.bundle_dir, o.mesh, NULL, o.long_progress.on};
    st_bundle* bundle = NULL;
    bool exported = false;
    if (!s) st_train_kernel_selection_note(&o, stderr);
    if (!s) s = st_bundle_ensure(&req, &bundle, &exported);
    if (!s) printf("%s (%s, %d programs)\n", bundle->dir, exported ? "exported" : "up to date", bundle->program_count);
    st_bundle_destroy(bundle);
    st_train_options_deinit(&o);
  }
  st_config_destroy(cfg);
  return st_cli_report(s);
}
