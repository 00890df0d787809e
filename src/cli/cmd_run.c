/* cmd_run.c — `strata run CONFIG [k=v ...]`: training under the supervisor
 * (src/diag/supervisor.c), which restarts the trainer after crashes and
 * hangs and records every incident in recovery.json. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/diag.h"
#include "strata/train.h"

int st_cli_run(int argc, char** argv) {
  st_config* cfg = NULL;
  st_status s = st_cli_load_config("run", argc, argv, &cfg);
  int code = 0;
  if (!s) {
    /* Children run this very binary, wherever it was started from. */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
      s = st_status_make(ST_CODE_IO, "strata run: cannot find its own executable (/proc/self/exe)");
    } else {
      exe[n] = '\0';
      st_plan_options o;
      s = st_plan_options_from_config(cfg, &o);
      if (!s) {
        st_supervisor_request req = {exe,      argv[0],   argc - 1, argv + 1,
                                     o.run_dir, o.run_id, o.resume, o.recovery};
        s = st_supervise(&req, &code);
      }
      st_plan_options_deinit(&o);
    }
  }
  st_config_destroy(cfg);
  if (s) return st_cli_report(s);
  return code;
}
