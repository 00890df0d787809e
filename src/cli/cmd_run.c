/* cmd_run.c — `strata run [--np N | --launcher CMD] CONFIG [k=v ...]`:
 * training under the supervisor (src/diag/supervisor.c), which restarts
 * the trainer after crashes and hangs and records every incident in
 * recovery.json; with --np or --launcher, a job of several processes
 * (docs/multiprocess.md, "Failures"). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/diag.h"
#include "strata/train.h"

/* The job from the leading options: `--np N` the process count, launched
 * as `mpirun -np N` unless `--launcher CMD` gives the command (split at
 * spaces, e.g. "mpirun --oversubscribe -np 2", "srun -n 4 --mpi=pmix"),
 * which must start N processes. *io_argc / *io_argv are advanced past
 * them; *out_words (the caller's, free each word and the array) and
 * *out_count are the launcher, *out_np the count; none (0) without --np. */
static st_status st__run_launcher(int* io_argc, char*** io_argv, char*** out_words, int* out_count, int* out_np) {
  *out_words = NULL;
  *out_count = 0;
  *out_np = 0;
  const char* launcher = NULL;
  long np = 0;
  while (*io_argc >= 2 && (!strcmp((*io_argv)[0], "--np") || !strcmp((*io_argv)[0], "--launcher"))) {
    const char* val = (*io_argv)[1];
    if (!strcmp((*io_argv)[0], "--np")) {
      char* end = NULL;
      np = strtol(val, &end, 10);
      if (!*val || *end || np < 1 || np > 1 << 20)
        return st_status_make(ST_CODE_CONFIG, "strata run: --np %s: want a process count of at least 1", val);
    } else {
      launcher = val;
    }
    *io_argc -= 2;
    *io_argv += 2;
  }
  if (launcher && np == 0)
    return st_status_make(ST_CODE_CONFIG, "strata run: --launcher '%s' needs --np N, the number of processes it starts", launcher);
  if (np <= 1) return ST_OK; /* one process: as without the option */
  char* text = NULL;
  if (launcher) {
    text = st_xstrdup(launcher);
  } else {
    st_strbuf b = {0};
    st_strbuf_printf(&b, "mpirun -np %ld", np);
    text = st_xstrdup(st_strbuf_cstr(&b));
    st_strbuf_free(&b);
  }
  char** words = st_xcalloc(strlen(text) / 2 + 2, sizeof(char*));
  int n = 0;
  for (char* tok = strtok(text, " \t"); tok; tok = strtok(NULL, " \t")) words[n++] = st_xstrdup(tok);
  free(text);
  if (n == 0) {
    free(words);
    return st_status_make(ST_CODE_CONFIG, "strata run: --launcher: an empty command");
  }
  *out_words = words;
  *out_count = n;
  *out_np = (int)np;
  return ST_OK;
}

int st_cli_run(int argc, char** argv) {
  char** launcher = NULL;
  int launcher_count = 0, np = 0;
  st_status s = st__run_launcher(&argc, &argv, &launcher, &launcher_count, &np);
  /* The config as each rank will resolve it: with the job's process count
   * (the supervisor passes it to every rank, which checks the launcher's). */
  char procs[48];
  snprintf(procs, sizeof(procs), "parallel.processes=%d", np);
  char** args = NULL;
  if (!s && np > 1 && argc >= 1) {
    args = st_xcalloc((size_t)argc + 2, sizeof(char*));
    memcpy(args, argv, (size_t)argc * sizeof(char*));
    args[argc] = procs;
  }
  st_config* cfg = NULL;
  if (!s) s = st_cli_load_config("run", args ? argc + 1 : argc, args ? args : argv, &cfg);
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
        st_supervisor_request req = {exe,      argv[0],   args ? argc : argc - 1, args ? args + 1 : argv + 1, o.run_dir,
                                     o.run_id, o.resume, o.recovery,            launcher_count,            launcher};
        s = st_supervise(&req, &code);
      }
      st_plan_options_deinit(&o);
    }
  }
  st_config_destroy(cfg);
  free(args);
  for (int i = 0; i < launcher_count; ++i) free(launcher[i]);
  free(launcher);
  if (s) return st_cli_report(s);
  return code;
}
