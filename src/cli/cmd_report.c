/* cmd_report.c — `strata report RUN_DIR [--out FILE]`: one self-contained
 * HTML page about a run (st_report_write, docs/using.md "strata report").
 * Reads the run directory only; safe while the run is being trained. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "strata/base.h"
#include "strata/obs.h"

static const char* kUsage =
    "usage: strata report RUN_DIR [--out FILE]\n"
    "  writes RUN_DIR/report.html (or FILE): one self-contained page with the run's plots (loss, eval loss, lr,\n"
    "  grad norm, tokens/s, step time, memory, events), sample, checkpoints, context and resolved config";

int st_cli_make_report(int argc, char** argv) {
  const char* dir = NULL;
  const char* out = NULL;
  for (int i = 0; i < argc; ++i) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("%s\n", kUsage);
      return 0;
    }
    if (!strcmp(argv[i], "--out") && i + 1 < argc && !out) {
      out = argv[++i];
    } else if (!strncmp(argv[i], "--out=", 6) && !out) {
      out = argv[i] + 6;
    } else if (argv[i][0] == '-' || dir) {
      return st_cli_report(st_status_make(ST_CODE_CONFIG, "%s", kUsage));
    } else {
      dir = argv[i];
    }
  }
  if (!dir || (out && !out[0])) return st_cli_report(st_status_make(ST_CODE_CONFIG, "%s", kUsage));
  if (!st_fs_exists(dir))
    return st_cli_report(
        st_status_make(ST_CODE_CONFIG, "strata report: '%s' does not exist; give the run directory strata train printed", dir));
  char* path = out ? st_xstrdup(out) : st_rundir_path(dir, ST_RUNDIR_REPORT);
  st_report_stats stats;
  st_status s = st_report_write(dir, path, &stats);
  if (!s) {
    printf("report: %s (%lld steps, %lld evaluations, %lld events", path, (long long)stats.step_lines, (long long)stats.eval_lines,
           (long long)stats.events);
    if (stats.bad_lines) printf(", %lld bad log lines skipped", (long long)stats.bad_lines);
    printf(")\n");
  }
  free(path);
  return st_cli_report(s);
}
