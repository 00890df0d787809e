/* cmd_status.c — `strata status RUN_DIR [--json]`: what a run is doing or
 * how it ended, from its run directory alone (docs/design.md §6). The
 * reading is st_train_run_status's (src/train/run_status.c); this prints
 * its object, for a screen or as JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/train.h"

static const char* kUsage =
    "usage: strata status RUN_DIR [--json]\n"
    "  the state of a run (running with its pid, finished, failed with its exit class, interrupted by a signal),\n"
    "  its step, last loss, tokens/s, ETA, newest valid checkpoint and lock holder";

static void st__human_rate(double v, char* out, size_t n) {
  if (v >= 1e6) snprintf(out, n, "%.1fM", v / 1e6);
  else if (v >= 1e3) snprintf(out, n, "%.1fk", v / 1e3);
  else snprintf(out, n, "%.0f", v);
}

static void st__human_secs(double s, char* out, size_t n) {
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(out, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else if (t >= 60) snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
  else snprintf(out, n, "%lds", t);
}

static void st__print(const json_t* o) {
  const char* state = json_string_value(json_object_get(o, "state"));
  printf("run          %s\n", json_string_value(json_object_get(o, "run_dir")));
  int64_t pid = 0, ec = 0;
  if (!strcmp(state, "running") && st_json_as_int(json_object_get(o, "pid"), &pid))
    printf("state        running (pid %lld)\n", (long long)pid);
  else if (!strcmp(state, "interrupted") && st_json_as_int(json_object_get(o, "exit_code"), &ec))
    printf("state        interrupted by %s (exit %lld)\n",
           json_string_value(json_object_get(o, "signal")) ? json_string_value(json_object_get(o, "signal")) : "a signal", (long long)ec);
  else if (st_json_as_int(json_object_get(o, "exit_code"), &ec) && ec != 0)
    printf("state        %s (exit %lld, %s)\n", state, (long long)ec, json_string_value(json_object_get(o, "exit_class")));
  else
    printf("state        %s\n", state);
  const char* outcome = json_string_value(json_object_get(o, "supervisor_outcome"));
  if (outcome) printf("supervisor   strata run: %s (recovery.json)\n", outcome);
  const char* err = json_string_value(json_object_get(o, "error"));
  if (err) printf("error        %s\n", err);
  int64_t step = 0, total = 0;
  bool has_total = st_json_as_int(json_object_get(o, "total_steps"), &total);
  if (st_json_as_int(json_object_get(o, "step"), &step) && has_total)
    printf("step         %lld/%lld\n", (long long)step, (long long)total);
  else if (has_total)
    printf("step         none recorded (of %lld)\n", (long long)total);
  else
    printf("step         none recorded (starting)\n");
  const json_t* loss = json_object_get(o, "loss");
  if (loss && json_is_number(loss)) printf("loss         %.4f\n", json_number_value(loss));
  else if (loss && json_is_null(loss) && json_is_integer(json_object_get(o, "step"))) printf("loss         non-finite\n");
  const json_t* tps = json_object_get(o, "tokens_per_s");
  char buf[32];
  if (tps && json_is_number(tps)) {
    st__human_rate(json_number_value(tps), buf, sizeof(buf));
    printf("tokens/s     %s\n", buf);
  }
  const json_t* dt = json_object_get(o, "step_time_s");
  int64_t recent = 0;
  st_json_as_int(json_object_get(o, "step_time_steps"), &recent);
  if (dt && json_is_number(dt))
    printf("step time    %.3f s (mean of the last %lld step%s)\n", json_number_value(dt), (long long)recent, recent == 1 ? "" : "s");
  const json_t* eta = json_object_get(o, "eta_s");
  if (eta && json_is_number(eta)) {
    st__human_secs(json_number_value(eta), buf, sizeof(buf));
    printf("ETA          %s\n", buf);
  }
  const char* murl = json_string_value(json_object_get(o, "metrics_url"));
  if (murl) printf("metrics      %s\n", murl);
  const char* ck = json_string_value(json_object_get(o, "checkpoint"));
  int64_t invalid = 0;
  st_json_as_int(json_object_get(o, "checkpoints_invalid"), &invalid);
  if (ck) printf("checkpoint   %s (verified)", ck);
  else printf("checkpoint   none");
  if (invalid) printf(", %lld newer invalid skipped", (long long)invalid);
  printf("\n");
  const json_t* lock = json_object_get(o, "lock");
  int64_t lp = 0;
  if (json_is_true(json_object_get(lock, "held")) && st_json_as_int(json_object_get(lock, "pid"), &lp))
    printf("lock         .lock held by pid %lld\n", (long long)lp);
  else if (json_is_true(json_object_get(lock, "held")))
    printf("lock         .lock held (pid unknown)\n");
  else if (json_object_get(lock, "note"))
    printf("lock         unknown: %s\n", json_string_value(json_object_get(lock, "note")));
  else
    printf("lock         free\n");
}

int st_cli_status(int argc, char** argv) {
  bool json = false;
  const char* dir = NULL;
  int n = 0;
  if (st_cli_json_args(argc, argv, kUsage, &json, &dir, 1, &n)) return 0;
  if (n != 1 || dir[0] == '-') return st_cli_report(st_status_make(ST_CODE_CONFIG, "%s", kUsage));
  char path[4096];
  if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path))
    return st_cli_report(st_status_make(ST_CODE_CONFIG, "strata status: path too long"));
  for (size_t k = strlen(path); k > 1 && path[k - 1] == '/'; --k) path[k - 1] = '\0';
  json_t* o = NULL;
  st_status s = st_train_run_status(path, &o);
  if (s) return st_cli_report(s);
  if (json) {
    st_cli_print_json(o, 2);
  } else {
    st__print(o);
  }
  json_decref(o);
  return 0;
}
