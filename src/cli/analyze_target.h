/* analyze_target.h — what `strata analyze` opens (cmd_analyze.c) and the
 * views of it beside the table (analyze_views.c: --dot, --diff, --lint). */
#ifndef STRATA_CLI_ANALYZE_TARGET_H
#define STRATA_CLI_ANALYZE_TARGET_H

#include <stdbool.h>

#include "strata/bundle.h"
#include "strata/config.h"
#include "strata/sched.h"
#include "strata/train.h"

/* A bundle directory (manifest.json), or a run directory (config.yaml):
 * its bundle (the same key, exported when missing) and its rebuilt step
 * plan. Everything is owned. */
typedef struct st_analyze_target {
  bool is_bundle, is_run;
  st_bundle* bundle;
  st_config* cfg;
  st_plan_options o; /* is_run */
  bool have_opts;
  st_plan step, eval; /* is_run: the plans the run built */
  st_plan_remat_choice remat;
} st_analyze_target;

/* Opens |dir|; a folder that is neither is ST_CODE_CONFIG (exit 2). |t|
 * must be closed either way. */
st_status st_analyze_target_open(const char* dir, st_analyze_target* t);
void st_analyze_target_close(st_analyze_target* t);

/* The views; each returns the process exit code. */
int st_analyze_dot(const char* dir, const char* program /* NULL: the step plan */);
int st_analyze_diff(const char* a, const char* b, bool json);
int st_analyze_lint(const char* path, bool json);

#endif
