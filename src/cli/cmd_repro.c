/* cmd_repro.c — `strata repro DIR [--json]`: replays the program of a
 * non-finite bundle (<run>/diag/nonfinite-step<N>/) alone on its saved
 * inputs and says whether the non-finite value reproduces
 * (docs/diagnostics.md, "Reading a NaN bundle"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/train.h"

static const char* kUsage =
    "usage: strata repro DIR [key=value ...] [--allow-mismatch=FIELD[,FIELD...]] [--json]\n"
    "  DIR: a non-finite bundle, <run>/diag/nonfinite-step<N>/; its program runs alone on its saved inputs, twice,\n"
    "  on the runtime of its config.yaml; prints \"reproduces\" (every replay's recorded output is non-finite:\n"
    "  deterministic) or \"does not reproduce\" (transient); exit 0 either way. key=value overrides the config\n"
    "  (runtime.*: replay elsewhere); a tokenizer or model.* other than nonfinite.json records is exit 7 unless\n"
    "  --allow-mismatch names it (the program replayed is the recorded one either way)\n"
    "  --perf[=N]: also N timed launches (default 20, after one untimed), inputs ready to outputs ready: median,\n"
    "  10th-90th percentile and range, against the launch time the bundle records (nonfinite.json launch_time)";

/* --perf or --perf=N (1..100000), taken out of argv; 0 when absent. */
static st_status st__take_perf(int* argc, char** argv, int* out_runs) {
  *out_runs = 0;
  int k = 0;
  for (int i = 0; i < *argc; ++i) {
    const char* a = argv[i];
    if (strcmp(a, "--perf") != 0 && strncmp(a, "--perf=", 7) != 0) {
      argv[k++] = argv[i];
      continue;
    }
    if (*out_runs) return st_status_make(ST_CODE_CONFIG, "--perf is given twice");
    char* end = NULL;
    long n = a[6] == '=' ? strtol(a + 7, &end, 10) : 20;
    if (a[6] == '=' && (!a[7] || *end || n < 1 || n > 100000))
      return st_status_make(ST_CODE_CONFIG, "--perf=%s: expected a count of timed launches in 1..100000, e.g. --perf=20", a + 7);
    *out_runs = (int)n;
  }
  *argc = k;
  return ST_OK;
}

/* --perf's lines: the replays' spread and the recorded figure beside. */
static void st__print_perf(const st_repro_result* r) {
  printf("perf: %s: %d launches: median %.3f ms (10th-90th percentile %.3f-%.3f ms, range %.3f-%.3f ms)\n", r->program,
         r->perf_runs, r->perf_median_s * 1e3, r->perf_p10_s * 1e3, r->perf_p90_s * 1e3, r->perf_min_s * 1e3,
         r->perf_max_s * 1e3);
  if (r->perf_recorded_s > 0)
    printf("perf: recorded %.3f ms (one launch, the run's locator): replay median / recorded = %.2f; the recorded "
           "figure is %s the replays' range\n", r->perf_recorded_s * 1e3, r->perf_median_s / r->perf_recorded_s,
           r->perf_recorded_s < r->perf_min_s ? "below" : r->perf_recorded_s > r->perf_max_s ? "above" : "within");
  else
    printf("perf: recorded: none (this bundle records no launch time: written before strata recorded one)\n");
}

static json_t* st__perf_json(const st_repro_result* r) {
  json_t* p = st_json_obj();
  st_json_put_int(p, "runs", r->perf_runs);
  st_json_put(p, "median_s", st_json_fixed(r->perf_median_s, 9));
  st_json_put(p, "p10_s", st_json_fixed(r->perf_p10_s, 9));
  st_json_put(p, "p90_s", st_json_fixed(r->perf_p90_s, 9));
  st_json_put(p, "min_s", st_json_fixed(r->perf_min_s, 9));
  st_json_put(p, "max_s", st_json_fixed(r->perf_max_s, 9));
  bool rec = r->perf_recorded_s > 0;
  st_json_put(p, "recorded_s", rec ? st_json_fixed(r->perf_recorded_s, 9) : json_null());
  st_json_put(p, "ratio", rec ? st_json_fixed(r->perf_median_s / r->perf_recorded_s, 4) : json_null());
  return p;
}

int st_cli_repro(int argc, char** argv) {
  bool json = false;
  int npos = 0;
  const char* allow = NULL;
  st_status ts = st_cli_take_allow(&argc, argv, &allow);
  if (ts) return st_cli_report(ts);
  int perf = 0;
  ts = st__take_perf(&argc, argv, &perf);
  if (ts) return st_cli_report(ts);
  const char** pos = st_xcalloc((size_t)argc + 1, sizeof(char*));
  if (st_cli_json_args(argc, argv, kUsage, &json, pos, argc, &npos)) {
    free(pos);
    return 0;
  }
  bool overrides_only = npos >= 1;
  for (int i = 1; i < npos; ++i) overrides_only = overrides_only && strchr(pos[i], '=') != NULL;
  if (npos < 1 || strchr(pos[0], '=') != NULL || !overrides_only) {
    free(pos);
    return st_cli_report(st_status_make(ST_CODE_CONFIG, "%s", kUsage));
  }
  st_repro_result r;
  st_repro_options ro = {npos - 1, (char**)(pos + 1), allow, perf};
  st_status s = st_train_repro(pos[0], &ro, &r);
  char* notes = r.identity ? st_ckpt_identity_notes(r.identity, "in nonfinite.json") : NULL;
  if (notes && notes[0]) fprintf(stderr, "strata: note: %s\n", notes);
  free(notes);
  if (!s) {
    const char* verdict = r.reproduces ? "reproduces" : "does not reproduce";
    if (json) {
      json_t* j = st_json_obj();
      st_json_put_str(j, "dir", pos[0]);
      st_json_put_str(j, "program", r.program);
      st_json_put_str(j, "output", r.output);
      st_json_put_str(j, "verdict", verdict);
      st_json_put_bool(j, "reproduces", r.reproduces);
      st_json_put_int(j, "runs", r.runs);
      st_json_put_int(j, "runs_nonfinite", r.runs_nonfinite);
      st_json_put_int(j, "nonfinite", r.nonfinite);
      st_json_put_int(j, "elements", r.elements);
      st_json_put_bool(j, "bitwise_repeatable", r.repeatable);
      st_json_put(j, "input_stats_checked", r.input_stats_checked >= 0 ? st_json_int(r.input_stats_checked) : json_null());
      st_json_put_bool(j, "injected", r.injected);
      st_json_put_bool(j, "calls_kernels", r.calls_kernels);
      st_json_put(j, "reference", json_null());
      st_json_put(j, "identity", r.identity ? json_incref(r.identity) : json_null());
      st_json_put(j, "perf", perf ? st__perf_json(&r) : json_null());
      st_cli_print_json(j, 2);
      json_decref(j);
    } else {
      printf("%s: program %s, output %s: %d of %d replays non-finite (%lld of %lld elements); outputs %s across replays\n",
             verdict, r.program, r.output, r.runs_nonfinite, r.runs, (long long)r.nonfinite, (long long)r.elements,
             r.repeatable ? "bitwise equal" : "differ");
      if (r.input_stats_checked >= 0)
        printf("inputs: all %d have the statistics the bundle records (norm, max |x|, fixed-index values, bf16 hash)\n",
               r.input_stats_checked);
      else
        printf("inputs: no recorded statistics to check (a bundle written before strata recorded them)\n");
      if (r.injected)
        printf("note: the value was injected by faults.nan_at (a drill) and is injected again after each replay; the program "
               "itself did not produce it\n");
      if (r.calls_kernels)
        printf("reference: not compared (the program calls strata's ffi kernels; their xla reference is the same "
               "program exported with kernels.<op>=xla, which repro does not build yet: `strata kernels verify` "
               "checks the kernels against it on the contract's shapes)\n");
      else
        printf("reference: none (no kernel replaces this XLA program, so there is no other implementation to compare "
               "with)\n");
      if (perf) st__print_perf(&r);
    }
  }
  st_repro_result_deinit(&r);
  free(pos);
  return st_cli_report(s);
}
