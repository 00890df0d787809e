/* cmd_export.c — `strata export CONFIG [k=v ...]`: writes (or validates)
 * the program bundle for the config and prints its folder. */
#include <stdio.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/train.h"

int st_cli_export(int argc, char** argv) {
  st_config* cfg = NULL;
  st_status s = st_cli_load_config("export", argc, argv, &cfg);
  if (!s) {
    st_plan_options o;
    s = st_plan_options_from_config(cfg, &o);
    st_plan_open_options how = {.progress = true};
    st_plan_opened opened;
    memset(&opened, 0, sizeof(opened));
    if (!s) st_plan_kernel_selection_note(&o, stderr);
    if (!s) s = st_plan_open_bundle(&o, &how, &opened);
    if (!s)
      printf("%s (%s, %d programs)\n", opened.bundle->dir, opened.exported ? "exported" : "up to date",
             opened.bundle->program_count);
    st_plan_close(&opened);
    st_plan_options_deinit(&o);
  }
  st_config_destroy(cfg);
  return st_cli_report(s);
}
