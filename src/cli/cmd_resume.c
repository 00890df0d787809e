/* cmd_resume.c — `strata resume RUN_DIR [k=v ...]`: continue a run from its
 * newest valid checkpoint, with the config snapshot the run wrote
 * (<RUN_DIR>/config.yaml); overrides apply on top (e.g. train.steps=2000
 * to extend it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "strata/base.h"
#include "strata/dist.h"
#include "strata/obs.h"
#include "strata/train.h"

/* How many processes this resume runs in: the launcher's count (1 without
 * one), not the count in config.yaml, which is how the run was started
 * last time; a job saved on 2 processes resumes on 1 or 4
 * (docs/multiprocess.md, "Checkpoints"). "" when the command line sets
 * parallel.processes itself or the launch cannot be read (the trainer
 * reports that). */
static void st__resume_processes(int argc, char** argv, char* out, size_t size) {
  out[0] = '\0';
  for (int i = 1; i < argc; ++i)
    if (!strncmp(argv[i], "parallel.processes=", 19)) return;
  st_dist_launch launch;
  st_status s = st_dist_detect(&launch);
  if (s) {
    st_status_free(s);
    return;
  }
  snprintf(out, size, "parallel.processes=%d", launch.multi && launch.world_size > 1 ? launch.world_size : 1);
}

int st_cli_resume(int argc, char** argv) {
  if (argc < 1 || strchr(argv[0], '=') != NULL)
    return st_cli_report(st_status_make(ST_CODE_CONFIG, "usage: strata resume RUN_DIR [key=value ...] (e.g. strata resume runs/my-run)"));
  const char* dir = argv[0];
  char* yaml = st_rundir_path(dir, ST_RUNDIR_CONFIG);
  if (!st_fs_exists(yaml)) {
    st_status s = st_status_make(ST_CODE_CONFIG, "'%s' is not a run directory: it has no config.yaml (strata train writes it first)", dir);
    free(yaml);
    return st_cli_report(s);
  }
  /* The user's overrides, then the two that make this a resume of |dir|. */
  char** ov = st_xcalloc((size_t)argc + 3, sizeof(char*));
  int n = 0;
  char procs[48];
  st__resume_processes(argc, argv, procs, sizeof(procs));
  if (procs[0]) ov[n++] = procs;
  for (int i = 1; i < argc; ++i) ov[n++] = argv[i];
  st_strbuf d = {0};
  st_strbuf_printf(&d, "run.dir=%s", dir);
  ov[n++] = d.data;
  ov[n++] = "run.resume=true";
  st_config* cfg = NULL;
  st_status s = st_config_load(yaml, n, ov, &cfg);
  if (!s) s = st_train_main(cfg);
  st_config_destroy(cfg);
  st_strbuf_free(&d);
  free(ov);
  free(yaml);
  return st_cli_report(s);
}
