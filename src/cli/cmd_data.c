/* cmd_data.c — `strata data CONFIG [k=v ...]`: tokenizes the corpus (or
 * validates the token file) and prints the token file and split sizes. The
 * Python reference trainer uses it to read exactly the same tokens. */
#include <stdio.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/train.h"

int st_cli_data(int argc, char** argv) {
  st_config* cfg = NULL;
  st_status s = st_cli_load_config("data", argc, argv, &cfg);
  if (!s) {
    st_train_options o;
    s = st_train_options_from_config(cfg, &o);
    st_dataset* ds = NULL;
    if (!s) s = st_dataset_open(&o.data, &ds);
    if (!s)
      printf("%s\ntokens %llu train %llu validation %llu\n", st_dataset_token_path(ds),
             (unsigned long long)st_dataset_token_count(ds), (unsigned long long)st_dataset_split_tokens(ds, 0),
             (unsigned long long)st_dataset_split_tokens(ds, 1));
    st_dataset_destroy(ds);
    st_train_options_deinit(&o);
  }
  st_config_destroy(cfg);
  return st_cli_report(s);
}
