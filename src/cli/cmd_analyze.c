/* cmd_analyze.c — `strata analyze BUNDLE_DIR|RUN_DIR [--json]`: its
 * arguments and its screen. What it shows is computed by src/train/
 * (st_train_analyze: per program of a bundle FLOPs, bytes, arithmetic
 * intensity, op counts, collectives, custom calls, hazards; for a run
 * directory the step's totals from its plan and metrics; docs/analysis.md);
 * the views beside the table are in analyze_views.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "cli/analyze_views.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/ir.h"
#include "strata/train.h"

static const char* kUsage =
    "usage: strata analyze BUNDLE_DIR|RUN_DIR [--json]\n"
    "       strata analyze RUN_DIR --dot          Graphviz DOT of the step plan (launches as nodes, slots as edges)\n"
    "       strata analyze BUNDLE_DIR|RUN_DIR|FILE.mlir --dot=PROGRAM   DOT of one program's @main ops\n"
    "       strata analyze --diff BUNDLE_A BUNDLE_B [--json]   programs added, removed, changed\n"
    "       strata analyze BUNDLE_DIR|RUN_DIR|FILE.mlir --lint [--json]   the compile-contract lint (exit 4 on an error)\n"
    "  per program of a bundle: FLOPs (dot share), bytes read and written, arithmetic intensity,\n"
    "  op counts, collectives, custom calls, hazards (dynamic shapes, host callbacks, f64);\n"
    "  for a run directory also per step: launches, FLOPs, model FLOPs, achieved FLOP/s, host and wait time";

/* "12.3M" style: 4 significant characters for a screen table. */
static void st__si(double v, char* out, size_t cap) {
  const char* u = "";
  double a = fabs(v);
  if (a >= 1e12) v /= 1e12, u = "T";
  else if (a >= 1e9) v /= 1e9, u = "G";
  else if (a >= 1e6) v /= 1e6, u = "M";
  else if (a >= 1e3) v /= 1e3, u = "k";
  if (*u == '\0') snprintf(out, cap, "%.0f", v);
  else snprintf(out, cap, "%.*f%s", fabs(v) >= 100 ? 0 : (fabs(v) >= 10 ? 1 : 2), v, u);
}

static void st__hazards_text(const st_ir_stats* s, char* out, size_t cap) {
  out[0] = '\0';
  size_t w = 0;
  if (s->dynamic_shapes) w += (size_t)snprintf(out + w, cap - w, "dynamic ");
  if (s->host_callbacks && w < cap) w += (size_t)snprintf(out + w, cap - w, "callback ");
  if (s->uses_f64 && w < cap) w += (size_t)snprintf(out + w, cap - w, "f64 ");
  if (s->while_unknown_trip && w < cap) w += (size_t)snprintf(out + w, cap - w, "loop? ");
  if (w == 0) snprintf(out, cap, "-");
}

static void st__print_table(const st_train_analyze_program* progs, int n, bool per_step, bool measured, bool bound) {
  printf("%-22s %8s %5s %8s %8s %8s %6s %5s %s%s%s%s\n", "program", "FLOPs", "dot%", "read B", "write B", "xla B", "AI",
         "ops", per_step ? "launch " : "", measured ? " us/launch " : "", bound ? (measured ? "  bound us    gap " : "  bound us ") : "",
         "coll/custom/hazards");
  for (int i = 0; i < n; ++i) {
    const st_train_analyze_program* p = &progs[i];
    if (p->error) {
      printf("%-22s error: %s\n", p->name, p->error);
      continue;
    }
    const st_ir_stats* s = &p->st;
    char f[16], r[16], w[16], x[16], hz[64], coll[96] = "";
    st__si(s->flops, f, sizeof(f));
    st__si(s->arg_bytes, r, sizeof(r));
    st__si(s->result_bytes, w, sizeof(w));
    st__si(s->bytes_accessed, x, sizeof(x));
    st__hazards_text(s, hz, sizeof(hz));
    size_t cw = 0;
    for (int k = 0; k < s->n_collectives && cw + 1 < sizeof(coll); ++k)
      cw += (size_t)snprintf(coll + cw, sizeof(coll) - cw, "%s%s(%s)x%.0f", k ? "," : "", s->collectives[k].kind,
                             s->collectives[k].groups, s->collectives[k].count);
    for (int k = 0; k < s->n_custom_calls && cw + 1 < sizeof(coll); ++k)
      cw += (size_t)snprintf(coll + cw, sizeof(coll) - cw, "%scc:%s", cw ? "," : "", s->custom_calls[k].target);
    char launch[16] = "", us[24] = "";
    if (per_step) snprintf(launch, sizeof(launch), "%6.0f ", p->launches);
    if (measured && p->measured_n > 0) snprintf(us, sizeof(us), "%10.1f ", p->measured_us / p->measured_n);
    else if (measured) snprintf(us, sizeof(us), "%10s ", "-");
    char bd[40] = "";
    if (bound) {
      size_t bw = (size_t)snprintf(bd, sizeof(bd), "%9.1f%c ", p->bound_us, p->memory_bound ? 'm' : 'c');
      if (measured && p->measured_n > 0 && p->bound_us > 0)
        snprintf(bd + bw, sizeof(bd) - bw, "%6.1fx ", p->measured_us / p->measured_n / p->bound_us);
      else if (measured)
        snprintf(bd + bw, sizeof(bd) - bw, "%7s ", "-");
    }
    printf("%-22.22s %8s %4.0f%% %8s %8s %8s %6.1f %5lld %s%s%s%s %s\n", p->name, f,
           s->flops > 0 ? 100.0 * (s->dot_flops + s->conv_flops) / s->flops : 0.0, r, w, x, st_train_analyze_intensity(s),
           (long long)s->ops.total, launch, us, bd, cw ? coll : "-", hz);
  }
}

/* One line: the three programs with the most fusions after XLA, each with
 * its largest fusion (all of them are in --json). */
static void st__print_xla(const st_train_analyze_program* progs, int n) {
  int kept = 0, shown[3] = {-1, -1, -1};
  for (int i = 0; i < n; ++i) {
    if (!progs[i].has_xla) continue;
    ++kept;
    for (int k = 0; k < 3; ++k) {
      if (shown[k] >= 0 && progs[shown[k]].xla.fusions >= progs[i].xla.fusions) continue;
      for (int m = 2; m > k; --m) shown[m] = shown[m - 1];
      shown[k] = i;
      break;
    }
  }
  if (!kept) {
    printf("xla: no optimized program kept (runtime.keep_optimized_hlo=true keeps them)\n");
    return;
  }
  printf("xla: %d program%s kept; most fusions:", kept, kept == 1 ? "" : "s");
  for (int k = 0; k < 3 && shown[k] >= 0; ++k) {
    const st_ir_hlo_summary* x = &progs[shown[k]].xla;
    printf("%s %s %lld", k ? "," : "", progs[shown[k]].name, (long long)x->fusions);
    if (x->n_top > 0) printf(" (largest %s %s, %lld ops)", x->top[0].name, x->top[0].kind, (long long)x->top[0].ops);
  }
  printf("\n");
}

/* The screen's lines of a run directory's step below the table. */
static void st__print_step(const st_train_analyze_program* progs, const st_train_analyze_totals* t, const st_train_analyze_steps* steps,
                           const st_train_analyze_traces* traces) {
  char f[16], m[16], a[16];
  st__si(t->flops * t->devices, f, sizeof(f));
  st__si(t->model_flops, m, sizeof(m));
  printf("step: %s FLOPs (%.0f%% dot) on %.0f device(s), model FLOPs %s (%.0f tokens)\n", f,
         t->flops > 0 ? 100 * t->dot / t->flops : 0.0, t->devices, m, steps->tokens);
  if (steps->time_s > 0) {
    st__si(t->flops * t->devices / steps->time_s, a, sizeof(a));
    printf("      %.4f s per step (mean of %d), %s FLOP/s achieved, host %.4f s, waiting on the device %.4f s\n",
           steps->time_s, steps->count > 1 ? steps->count - 1 : steps->count, a, steps->time_s - steps->wait_s,
           steps->wait_s);
  } else {
    printf("      no step in metrics.jsonl: no achieved FLOP/s\n");
  }
  if (t->mfu >= 0)
    printf("      MFU %.4g%% (model FLOP/s over %.0f x the peak); the bound is %.4f s per step (%.1f%% of the step)\n",
           100 * t->mfu, t->devices, t->bound_s, steps->time_s > 0 ? 100 * t->bound_s / steps->time_s : 0.0);
  if (t->furthest >= 0) {
    const st_train_analyze_program* fp = &progs[t->furthest];
    printf("      furthest from its bound: %s, %.1fx its %s bound (%.4f s per step above it)\n", fp->name,
           fp->measured_us / fp->measured_n / fp->bound_us, fp->memory_bound ? "memory" : "compute",
           (fp->measured_us - fp->measured_n * fp->bound_us) * 1e-6 / (traces->files > 0 ? traces->files : 1));
  }
  if (traces->files > 0) {
    printf("trace (%d step%s): device work", traces->files, traces->files > 1 ? "s" : "");
    for (int r = 0; r < ST_TRAIN_ANALYZE_ROLES; ++r)
      if (t->role_us[r] > 0 && traces->launch_us > 0) printf(" %s %.0f%%", st_train_analyze_role(r), 100 * t->role_us[r] / traces->launch_us);
    printf("; host ops %.4f s per step\n", traces->host_us * 1e-6 / traces->files);
  } else {
    printf("trace: none (trace.steps=[N] records one): no time per launch\n");
  }
}

/* The screen: the table, the peak and bound legend, XLA's fusions and,
 * for a run directory, its step. */
static void st__print_text(const st_bundle* bundle, const st_train_analyze_program* progs, int n, bool is_run, const st_train_peak* peak,
                           const st_train_analyze_totals* t, const st_train_analyze_steps* steps, const st_train_analyze_traces* traces) {
  printf("bundle %s: %d programs, %d collectives\n", bundle->dir, bundle->program_count,
         bundle->collective_count);
  st__print_table(progs, n, is_run, traces->files > 0, peak->flops_per_s > 0);
  if (peak->flops_per_s > 0) {
    char pf[16], pb[16] = "-";
    st__si(peak->flops_per_s, pf, sizeof(pf));
    if (peak->bytes_per_s > 0) st__si(peak->bytes_per_s, pb, sizeof(pb));
    printf("peak: %s FLOP/s, %sB/s per device (%s: %s)\n", pf, pb, peak->source, peak->detail);
    printf("      bound = max(FLOPs / peak, (read + write B) / bandwidth): c compute, m memory; gap = measured / bound\n");
  } else {
    printf("peak: %s; no roofline bound\n", peak->detail[0] ? peak->detail : "not measured (run strata doctor)");
  }
  st__print_xla(progs, n);
  if (is_run) st__print_step(progs, t, steps, traces);
}

/* The views' flags taken out of |argv|, the rest [--json] DIR parsed.
 * Returns -1 to go on, else the exit code (help, a usage error). */
static int st__analyze_args(int argc, char** argv, bool* json, bool* lint, bool* dot, const char** dot_program,
                            const char** diff_a, const char** dir) {
  /* The views' flags first; the rest is [--json] DIR. */
  char** rest = st_xcalloc((size_t)argc + 1, sizeof(char*));
  int nrest = 0;
  for (int i = 0; i < argc; ++i) {
    if (!strcmp(argv[i], "--lint")) {
      *lint = true;
    } else if (!strcmp(argv[i], "--dot")) {
      *dot = true;
    } else if (!strncmp(argv[i], "--dot=", 6)) {
      *dot = true;
      *dot_program = argv[i] + 6;
    } else if (!strcmp(argv[i], "--diff") && i + 1 < argc) {
      *diff_a = argv[++i];
    } else {
      rest[nrest++] = argv[i];
    }
  }
  const char* pos[1];
  int npos = 0;
  bool help = st_cli_json_args(nrest, rest, kUsage, json, pos, 1, &npos);
  free(rest);
  if (help) return 0;
  if (npos != 1 || (*dot + *lint + (*diff_a != NULL)) > 1) {
    fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  *dir = pos[0];
  return -1;
}

int st_cli_analyze(int argc, char** argv) {
  bool json = false, lint = false, dot = false;
  const char* dot_program = NULL;
  const char* diff_a = NULL;
  const char* dir = NULL;
  int rc = st__analyze_args(argc, argv, &json, &lint, &dot, &dot_program, &diff_a, &dir);
  if (rc >= 0) return rc;
  if (dot) return st_analyze_dot(dir, dot_program);
  if (diff_a) return st_analyze_diff(diff_a, dir, json);
  if (lint) return st_analyze_lint(dir, json);
  st_train_analyze_options o = {.dir = dir};
  st_train_analyze_result r;
  st_status s = st_train_analyze(&o, &r);
  if (!s && json) {
    st_json* j = st_train_analyze_json(&r);
    st_cli_print_json(j, 0);
    json_decref(j);
  } else if (!s) {
    st__print_text(r.target.bundle, r.programs, r.program_count, r.target.is_run, &r.peak, &r.totals, &r.steps,
                   &r.traces);
  }
  st_train_analyze_result_free(&r);
  return st_cli_report(s);
}
