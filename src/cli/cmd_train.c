/* cmd_train.c — `strata train CONFIG [k=v ...]`. */
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/train.h"

int st_cli_train(int argc, char** argv) {
  st_config* cfg = NULL;
  st_status s = st_cli_load_config("train", argc, argv, &cfg);
  if (!s) s = st_train_main(cfg);
  st_config_destroy(cfg);
  return st_cli_report(s);
}
