/* cmd_analyze.c — `strata analyze BUNDLE_DIR|RUN_DIR [--json]`: what each
 * program of a bundle does (FLOPs, bytes, arithmetic intensity, op counts,
 * collectives, custom calls, hazards; read by src/ir/ from the StableHLO
 * text), and for a run directory the step's totals from its plan and
 * metrics (docs/analysis.md).
 *
 * A run directory is recognised by its config.yaml: the plan is rebuilt
 * from it (as `strata plan` does), so the launches per program are the
 * ones the run executed, and the bundle is the one the run used (the same
 * key; its dir is also in events.jsonl's `bundle` event). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <jansson.h>

#include "cli/analyze_target.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/config.h"
#include "strata/ir.h"
#include "strata/obs.h"
#include "strata/sched.h"
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

/* metrics.jsonl is read up to this many bytes (the step times). */
#define ST__METRICS_MAX ((size_t)64 << 20)

typedef struct st__prog {
  const char* name;      /* borrowed from the bundle */
  const char* kind;      /* "program" or "collective" */
  double manifest_flops; /* the exporter's cost analysis (0 unknown) */
  st_ir_stats st;
  char* error; /* owned; NULL when analyzed */
  double launches; /* per step (run directories) */
  const char* role;   /* forward, backward, loss, optimizer, collective, init, other */
  double measured_us; /* launch time in the run's traces, all launches together */
  double measured_n;  /* launches seen in the traces */
  double bound_us;    /* the roofline bound of one launch on this machine; 0: no peak */
  bool memory_bound;  /* its memory side is the larger */
  bool has_bound;     /* a peak is known (bound_us may be 0: nothing to do) */
  bool has_xla;       /* XLA's optimized program was kept (runtime.keep_optimized_hlo) */
  st_ir_hlo_summary xla;
  char* xla_error;    /* owned: a kept program that did not read */
} st__prog;

static bool st__is_file(const char* path) {
  struct stat s;
  return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

static void st__analyze_one(const st_bundle* bundle, const st_bundle_program* p, const char* kind, st__prog* out) {
  memset(out, 0, sizeof(*out));
  out->name = p->name;
  out->kind = kind;
  out->manifest_flops = p->flops;
  (void)bundle; /* p->path is already joined to the bundle's dir */
  st_status s = st_ir_analyze_file(p->path, &out->st);
  if (s) {
    out->error = st_xstrdup(st_status_message(s));
    st_status_free(s);
  }
}

static double st__ai(const st_ir_stats* s) {
  double b = s->arg_bytes + s->result_bytes;
  return b > 0 ? s->flops / b : 0;
}

/* The roofline bound of one launch: the larger of its FLOPs at the peak
 * FLOP/s and its argument and result bytes (what a perfectly fused program
 * moves at least) at the memory bandwidth; the bandwidth side is left out
 * when it was not measured. */
static void st__bound(st__prog* p, const st_train_peak* peak) {
  if (p->error || peak->flops_per_s <= 0) return;
  double compute = p->st.flops / peak->flops_per_s;
  double memory = peak->bytes_per_s > 0 ? (p->st.arg_bytes + p->st.result_bytes) / peak->bytes_per_s : 0;
  p->has_bound = true;
  p->memory_bound = memory > compute;
  p->bound_us = 1e6 * (p->memory_bound ? memory : compute);
}

/* The optimized programs kept beside the executable cache entries
 * (<cache_root>/executables/<key>.hlo and .hlo.json, runtime.
 * keep_optimized_hlo), matched to the bundle's programs by the sha256 of
 * their StableHLO text; the newest when several were kept (other compile
 * options, devices). At most this many sidecars are read. */
#define ST__MAX_HLO_SIDECARS 100000
#define ST__MAX_HLO_BYTES ((size_t)256 << 20)

static void st__read_xla(const char* cache_root, const st_bundle* bundle, st__prog* progs, int n) {
  char* dir = st_path_join(cache_root, "executables");
  DIR* d = opendir(dir);
  if (!d) {
    free(dir);
    return;
  }
  double* newest = st_xcalloc((size_t)(n > 0 ? n : 1), sizeof(double));
  char** chosen = st_xcalloc((size_t)(n > 0 ? n : 1), sizeof(char*));
  char** formats = st_xcalloc((size_t)(n > 0 ? n : 1), sizeof(char*));
  struct dirent* ent;
  int seen = 0;
  while ((ent = readdir(d)) != NULL && seen < ST__MAX_HLO_SIDECARS) {
    size_t len = strlen(ent->d_name);
    if (len < 10 || strcmp(ent->d_name + len - 9, ".hlo.json")) continue;
    ++seen;
    char* meta = st_path_join(dir, ent->d_name);
    struct stat sm;
    char* data = NULL;
    size_t size = 0;
    json_t* j = NULL;
    if (stat(meta, &sm) == 0 && S_ISREG(sm.st_mode) && sm.st_size < 65536 && !st_fs_read_file(meta, &data, &size)) {
      st_status ps = st_json_parse(data, size, meta, &j);
      st_status_free(ps);
    }
    free(data);
    const char* sha = json_string_value(json_object_get(j, "source_sha256"));
    const char* fmt = json_string_value(json_object_get(j, "format"));
    for (int i = 0; sha && fmt && i < n; ++i) {
      const st_bundle_program* bp = st_bundle_program_find(bundle, progs[i].name);
      if (!bp) bp = st_bundle_collective_find(bundle, progs[i].name);
      if (!bp || strcmp(bp->sha256, sha)) continue;
      double t = (double)sm.st_mtime;
      if (chosen[i] && t <= newest[i]) continue;
      free(chosen[i]);
      free(formats[i]);
      chosen[i] = st_xstrdup(meta);
      chosen[i][strlen(chosen[i]) - 5] = '\0'; /* <key>.hlo */
      formats[i] = st_xstrdup(fmt);
      newest[i] = t;
    }
    json_decref(j);
    free(meta);
  }
  closedir(d);
  for (int i = 0; i < n; ++i) {
    if (!chosen[i]) continue;
    struct stat sh;
    char* bytes = NULL;
    size_t size = 0;
    st_status s = stat(chosen[i], &sh) == 0 && S_ISREG(sh.st_mode) && (size_t)sh.st_size <= ST__MAX_HLO_BYTES
                      ? st_fs_read_file(chosen[i], &bytes, &size)
                      : st_status_make(ST_CODE_RUNTIME, "%s: missing or larger than 256 MiB", chosen[i]);
    if (!s) s = st_ir_hlo_summarize(bytes, size, formats[i], chosen[i], &progs[i].xla);
    if (s) progs[i].xla_error = st_xstrdup(st_status_message(s));
    else progs[i].has_xla = true;
    st_status_free(s);
    free(bytes);
    free(chosen[i]);
    free(formats[i]);
  }
  free(chosen);
  free(formats);
  free(newest);
  free(dir);
}

static json_t* st__prog_json(const st__prog* p) {
  json_t* j = st_json_obj();
  st_json_put_str(j, "name", p->name);
  st_json_put_str(j, "kind", p->kind);
  if (p->error) {
    st_json_put_str(j, "error", p->error);
    return j;
  }
  const st_ir_stats* s = &p->st;
  st_json_put_num(j, "flops", s->flops);
  st_json_put_num(j, "dot_flops", s->dot_flops);
  st_json_put_num(j, "conv_flops", s->conv_flops);
  st_json_put_num(j, "elementwise_flops", s->elementwise_flops);
  st_json_put_num(j, "reduce_flops", s->reduce_flops);
  st_json_put_num(j, "transcendentals", s->transcendentals);
  st_json_put_num(j, "manifest_flops", p->manifest_flops);
  st_json_put_num(j, "arg_bytes", s->arg_bytes);
  st_json_put_num(j, "result_bytes", s->result_bytes);
  st_json_put_num(j, "bytes_accessed", s->bytes_accessed);
  st_json_put_num(j, "arithmetic_intensity", st__ai(s));
  st_json_put_int(j, "args", s->n_args);
  st_json_put_int(j, "results", s->n_results);
  st_json_put_num(j, "elementwise_elements", s->elementwise_elements);
  st_json_put_num(j, "reduce_elements", s->reduce_elements);
  json_t* ops = st_json_obj();
  st_json_put_int(ops, "total", s->ops.total);
  st_json_put_int(ops, "dot", s->ops.dot);
  st_json_put_int(ops, "convolution", s->ops.convolution);
  st_json_put_int(ops, "elementwise", s->ops.elementwise);
  st_json_put_int(ops, "reduce", s->ops.reduce);
  st_json_put_int(ops, "data_movement", s->ops.data_movement);
  st_json_put_int(ops, "constant", s->ops.constant);
  st_json_put_int(ops, "collective", s->ops.collective);
  st_json_put_int(ops, "custom_call", s->ops.custom_call);
  st_json_put_int(ops, "while", s->ops.while_loop);
  st_json_put_int(ops, "call", s->ops.call);
  st_json_put_int(ops, "other", s->ops.other);
  st_json_put(j, "ops", ops);
  st_json_put_int(j, "functions", s->funcs);
  json_t* loops = st_json_obj();
  st_json_put_int(loops, "count", s->while_loops);
  st_json_put_int(loops, "unknown_trip", s->while_unknown_trip);
  st_json_put_num(loops, "max_trip", s->max_trip);
  st_json_put(j, "while", loops);
  json_t* coll = st_json_arr();
  for (int i = 0; i < s->n_collectives; ++i) {
    json_t* c = st_json_obj();
    st_json_put_str(c, "kind", s->collectives[i].kind);
    st_json_put_str(c, "groups", s->collectives[i].groups);
    st_json_put_num(c, "count", s->collectives[i].count);
    st_json_put_num(c, "bytes", s->collectives[i].bytes);
    json_array_append_new(coll, c);
  }
  st_json_put(j, "collectives", coll);
  json_t* cc = st_json_arr();
  for (int i = 0; i < s->n_custom_calls; ++i) {
    json_t* c = st_json_obj();
    st_json_put_str(c, "target", s->custom_calls[i].target);
    st_json_put_num(c, "count", s->custom_calls[i].count);
    json_array_append_new(cc, c);
  }
  st_json_put(j, "custom_calls", cc);
  json_t* hz = st_json_obj();
  st_json_put_bool(hz, "dynamic_shapes", s->dynamic_shapes);
  st_json_put_int(hz, "host_callbacks", s->host_callbacks);
  st_json_put_bool(hz, "f64", s->uses_f64);
  st_json_put(j, "hazards", hz);
  st_json_put_str(j, "role", p->role);
  if (p->launches > 0) st_json_put_num(j, "launches_per_step", p->launches);
  if (p->measured_n > 0) {
    double us = p->measured_us / p->measured_n;
    st_json_put_num(j, "measured_us_per_launch", us);
    st_json_put_int(j, "measured_launches", (int64_t)p->measured_n);
    if (us > 0) st_json_put_num(j, "achieved_flops_per_s", s->flops / (us * 1e-6));
  }
  if (p->has_xla) {
    json_t* x = st_json_obj();
    st_json_put_int(x, "fusions", p->xla.fusions);
    st_json_put_int(x, "instructions", p->xla.instructions);
    st_json_put_int(x, "entry_instructions", p->xla.entry_instructions);
    st_json_put_int(x, "computations", p->xla.computations);
    json_t* top = st_json_arr();
    for (int k = 0; k < p->xla.n_top; ++k) {
      json_t* f = st_json_obj();
      st_json_put_str(f, "name", p->xla.top[k].name);
      st_json_put_str(f, "kind", p->xla.top[k].kind);
      st_json_put_int(f, "ops", p->xla.top[k].ops);
      json_array_append_new(top, f);
    }
    st_json_put(x, "largest_fusions", top);
    st_json_put(j, "xla", x);
  } else if (p->xla_error) {
    json_t* x = st_json_obj();
    st_json_put_str(x, "error", p->xla_error);
    st_json_put(j, "xla", x);
  }
  if (p->has_bound) {
    st_json_put_num(j, "bound_us", p->bound_us);
    st_json_put_str(j, "bound_by", p->memory_bound ? "memory" : "compute");
    if (p->measured_n > 0 && p->bound_us > 0) st_json_put_num(j, "gap", p->measured_us / p->measured_n / p->bound_us);
  }
  return j;
}

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

static void st__print_table(const st__prog* progs, int n, bool per_step, bool measured, bool bound) {
  printf("%-22s %8s %5s %8s %8s %8s %6s %5s %s%s%s%s\n", "program", "FLOPs", "dot%", "read B", "write B", "xla B", "AI",
         "ops", per_step ? "launch " : "", measured ? " us/launch " : "", bound ? (measured ? "  bound us    gap " : "  bound us ") : "",
         "coll/custom/hazards");
  for (int i = 0; i < n; ++i) {
    const st__prog* p = &progs[i];
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
           s->flops > 0 ? 100.0 * (s->dot_flops + s->conv_flops) / s->flops : 0.0, r, w, x, st__ai(s),
           (long long)s->ops.total, launch, us, bd, cw ? coll : "-", hz);
  }
}

/* One line: the three programs with the most fusions after XLA, each with
 * its largest fusion (all of them are in --json). */
static void st__print_xla(const st__prog* progs, int n) {
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

/* ------------------------------------------------------------ run dirs */

typedef struct st__steps {
  int count;         /* step lines read */
  double time_s;     /* mean step_time_s (steps after the first when more than one) */
  double wait_s;     /* mean wait_s: time the host waited for the device */
  double tokens;     /* tokens per step */
} st__steps;

static st_status st__read_metrics(const char* run_dir, st__steps* out) {
  memset(out, 0, sizeof(*out));
  char* path = st_rundir_path(run_dir, ST_RUNDIR_METRICS);
  char* data = NULL;
  size_t size = 0;
  st_status s = st__is_file(path) ? st_fs_read_file(path, &data, &size) : ST_OK;
  free(path);
  if (s || !data) return s;
  if (size > ST__METRICS_MAX) size = ST__METRICS_MAX;
  double t_all = 0, w_all = 0, t_rest = 0, w_rest = 0;
  int n_rest = 0;
  for (size_t p = 0; p < size;) {
    const char* nl = memchr(data + p, '\n', size - p);
    size_t len = nl ? (size_t)(nl - (data + p)) : size - p;
    json_t* j = NULL;
    st_status bad = st_json_parse(data + p, len, "metrics.jsonl", &j);
    st_status_free(bad);
    json_t* step = j ? json_object_get(j, "step") : NULL;
    json_t* t = j ? json_object_get(j, "step_time_s") : NULL;
    if (json_is_integer(step) && json_is_number(t)) {
      double ts = json_number_value(t);
      double ws = json_number_value(json_object_get(j, "wait_s"));
      out->tokens = json_number_value(json_object_get(j, "tokens"));
      t_all += ts;
      w_all += ws;
      if (out->count > 0) {
        t_rest += ts;
        w_rest += ws;
        ++n_rest;
      }
      out->count++;
    }
    json_decref(j);
    p += len + 1;
  }
  free(data);
  if (n_rest > 0) {
    out->time_s = t_rest / n_rest;
    out->wait_s = w_rest / n_rest;
  } else if (out->count > 0) {
    out->time_s = t_all / out->count;
    out->wait_s = w_all / out->count;
  }
  return ST_OK;
}

#define ST__ROLES 7
static const char* const kRoles[ST__ROLES] = {"forward", "backward", "loss", "optimizer", "collective", "init", "other"};

/* The part a program plays in a step (one of kRoles), from the bundle's program tables. */
static const char* st__role(const st_bundle* b, const char* name) {
#define ST__IS(p) ((p) && !strcmp((p)->name, name))
  if (st_bundle_collective_find(b, name)) return "collective";
  const st_bundle_stage* stages[2] = {&b->embed, &b->head};
  for (int k = -2; k < b->layer_count; ++k) {
    const st_bundle_stage* st = k < 0 ? stages[k + 2] : &b->layers[k];
    if (ST__IS(st->init)) return "init";
    if (ST__IS(st->fwd) || ST__IS(st->fwd_res) || ST__IS(st->eval)) return "forward";
    if (ST__IS(st->bwd) || ST__IS(st->bwd_res)) return "backward";
    if (ST__IS(st->loss)) return "loss";
  }
  for (int g = 0; g < b->group_count; ++g) {
    const st_bundle_group* gr = &b->groups[g];
    if (ST__IS(gr->accum) || ST__IS(gr->sqnorm) || ST__IS(gr->adamw) || ST__IS(gr->shard_accum) ||
        ST__IS(gr->shard_sqnorm) || ST__IS(gr->shard_adamw))
      return "optimizer";
  }
#undef ST__IS
  return "other";
}

/* Traces read: files and bytes each (a trace of a big step is large, not huge). */
#define ST__MAX_TRACES 64
#define ST__TRACE_MAX ((size_t)256 << 20)

typedef struct st__trace_sum {
  int files;
  double span_us;   /* summed step spans (first event to last completion) */
  double wait_us;   /* host waits (WAIT, READ): time the host was blocked */
  double host_us;   /* host ops (HOST, FREE) */
  double launch_us; /* device work: launches, recomputes, collectives */
} st__trace_sum;

/* Reads <run>/trace/step_*.json: per program its launch time (Chrome
 * trace complete events of category launch, recompute or collective, named
 * after the program), per step the waits and host ops. */
static st_status st__read_traces(const char* run_dir, st__prog* progs, int n, st__trace_sum* out) {
  memset(out, 0, sizeof(*out));
  char* dir = st_rundir_path(run_dir, ST_RUNDIR_TRACE);
  DIR* d = opendir(dir);
  if (!d) {
    free(dir);
    return ST_OK; /* no trace.steps: no measured times */
  }
  st_status s = ST_OK;
  struct dirent* ent;
  while (!s && (ent = readdir(d)) != NULL) {
    size_t len = strlen(ent->d_name);
    if (strncmp(ent->d_name, "step_", 5) || len < 6 || strcmp(ent->d_name + len - 5, ".json")) continue;
    if (out->files >= ST__MAX_TRACES) break;
    char* path = st_path_join(dir, ent->d_name);
    struct stat stt;
    if (stat(path, &stt) != 0 || !S_ISREG(stt.st_mode) || (size_t)stt.st_size > ST__TRACE_MAX) {
      free(path);
      continue;
    }
    char* data = NULL;
    size_t size = 0;
    json_t* j = NULL;
    s = st_fs_read_file(path, &data, &size);
    if (!s) s = st_json_parse(data, size, path, &j);
    free(data);
    free(path);
    if (s) break;
    json_t* evs = json_object_get(j, "traceEvents");
    double lo = 1e300, hi = 0;
    size_t i;
    json_t* e;
    json_array_foreach(evs, i, e) {
      const char* ph = json_string_value(json_object_get(e, "ph"));
      const char* cat = json_string_value(json_object_get(e, "cat"));
      const char* name = json_string_value(json_object_get(e, "name"));
      json_t* ts = json_object_get(e, "ts");
      json_t* dur = json_object_get(e, "dur");
      if (!ph || strcmp(ph, "X") || !cat || !name || !json_is_number(ts) || !json_is_number(dur)) continue;
      double t0 = json_number_value(ts), dt = json_number_value(dur);
      if (!(dt >= 0) || !(t0 >= 0)) continue;
      if (t0 < lo) lo = t0;
      if (t0 + dt > hi) hi = t0 + dt;
      if (!strcmp(cat, "launch") || !strcmp(cat, "recompute") || !strcmp(cat, "collective")) {
        out->launch_us += dt;
        for (int k = 0; k < n; ++k)
          if (!strcmp(progs[k].name, name)) {
            progs[k].measured_us += dt;
            progs[k].measured_n += 1;
            break;
          }
      } else if (!strcmp(cat, "wait")) {
        out->wait_us += dt;
      } else if (!strcmp(cat, "host")) {
        out->host_us += dt;
      }
    }
    if (hi > lo) out->span_us += hi - lo;
    out->files++;
    json_decref(j);
  }
  closedir(d);
  free(dir);
  return s;
}

/* The peak of the roofline and MFU. A run directory's is the one its
 * context.json names (what its metrics' mfu used); a bundle's, or a run's
 * from before context.json named one, is resolved as a run would resolve
 * it (st_train_peak_resolve: obs.peak_flops, a datasheet, doctor's stored
 * measurement), which needs the plugin's device kind: the runtime is
 * opened for it (about 0.3 s on the CPU plugin) and nothing is measured. */
static void st__peak(const char* run_dir, const st_plan_options* o, st_train_peak* out) {
  memset(out, 0, sizeof(*out));
  snprintf(out->source, sizeof(out->source), "none");
  if (run_dir) {
    char* path = st_rundir_path(run_dir, ST_RUNDIR_CONTEXT);
    char* data = NULL;
    size_t size = 0;
    json_t* j = NULL;
    st_status s = st__is_file(path) ? st_fs_read_file(path, &data, &size) : st_status_make(ST_CODE_DATA, "none");
    if (!s && size <= ST__METRICS_MAX) s = st_json_parse(data, size, path, &j);
    st_status_free(s);
    free(data);
    free(path);
    json_t* pk = json_object_get(j, "peak");
    const char* src = json_string_value(json_object_get(pk, "source"));
    const char* detail = json_string_value(json_object_get(pk, "detail"));
    if (json_is_object(pk) && src && detail) {
      double f = json_number_value(json_object_get(pk, "flops_per_s"));
      double b = json_number_value(json_object_get(pk, "bytes_per_s"));
      out->flops_per_s = isfinite(f) && f > 0 ? f : 0;
      out->bytes_per_s = isfinite(b) && b > 0 ? b : 0;
      snprintf(out->source, sizeof(out->source), "%s", src);
      snprintf(out->detail, sizeof(out->detail), "%s", detail);
      json_decref(j);
      return;
    }
    json_decref(j);
  }
  st_runtime_options ro;
  char* root = NULL;
  if (o) {
    ro = o->runtime;
  } else {
    st_runtime_options_init(&ro);
    root = st_cache_root(NULL);
  }
  st_runtime* rt = NULL;
  st_status s = st_runtime_create(&ro, &rt);
  if (s) {
    snprintf(out->detail, sizeof(out->detail), "no runtime: %s", st_status_message(s));
    st_status_free(s);
  } else {
    st_train_peak_resolve(rt, o ? o->cache_root : root, o ? o->peak_flops : 0, false, out);
    if (out->flops_per_s <= 0) snprintf(out->detail, sizeof(out->detail), "not measured (run strata doctor)");
  }
  st_runtime_destroy(rt);
  free(root);
}

st_status st_analyze_target_open(const char* dir, st_analyze_target* t) {
  memset(t, 0, sizeof(*t));
  st_plan_init(&t->step);
  st_plan_init(&t->eval);
  char* manifest = st_path_join(dir, "manifest.json");
  char* config = st_rundir_path(dir, ST_RUNDIR_CONFIG);
  t->is_bundle = st__is_file(manifest);
  t->is_run = !t->is_bundle && st__is_file(config);
  free(manifest);
  st_status s = ST_OK;
  if (!t->is_bundle && !t->is_run)
    s = st_status_make(ST_CODE_CONFIG,
                       "strata analyze: '%s' holds neither manifest.json (a bundle) nor config.yaml (a run "
                       "directory); pass a bundle folder (~/.cache/strata/bundles/<key>) or a run directory (run.dir)",
                       dir);
  if (!s && t->is_bundle) s = st_bundle_open(dir, &t->bundle);
  if (!s && t->is_run) {
    char* args[1] = {config};
    s = st_cli_load_config("analyze", 1, args, &t->cfg);
    if (!s) {
      s = st_plan_options_from_config(t->cfg, &t->o);
      t->have_opts = true;
    }
    if (!s) {
      st_plan_opened opened;
      memset(&opened, 0, sizeof(opened));
      s = st_plan_open_bundle(&t->o, NULL, &opened);
      t->bundle = opened.bundle; /* owned by the target from here */
    }
    if (!s) s = st_plan_build(t->bundle, &t->o, &t->step, &t->eval, &t->remat);
  }
  free(config);
  return s;
}

void st_analyze_target_close(st_analyze_target* t) {
  st_plan_deinit(&t->step);
  st_plan_deinit(&t->eval);
  st_plan_remat_choice_deinit(&t->remat);
  if (t->have_opts) st_plan_options_deinit(&t->o);
  st_bundle_destroy(t->bundle);
  st_config_destroy(t->cfg);
  memset(t, 0, sizeof(*t));
}

/* A run's step from its plan, measurements and the peak: the sums a
 * screen and --json both show, computed once. */
typedef struct st__step_totals {
  double flops, dot, read, write; /* per device, the step's launches */
  double model_flops;             /* the step's model FLOPs (run directories) */
  double devices;
  double bound_s; /* the launches' roofline bounds, per step */
  double mfu;     /* -1: unknown */
  int furthest;   /* the program furthest above its bound; -1 none */
  double role_us[ST__ROLES]; /* measured launch time by role */
} st__step_totals;

/* Every program and collective of |bundle| analyzed (a new array of *out_n,
 * each with its role); a program that does not read carries its error. */
static st__prog* st__analyze_all(const st_bundle* bundle, int* out_n) {
  int n = bundle->program_count + bundle->collective_count;
  st__prog* progs = st_xcalloc((size_t)(n > 0 ? n : 1), sizeof(*progs));
  for (int i = 0; i < bundle->program_count; ++i) st__analyze_one(bundle, &bundle->programs[i], "program", &progs[i]);
  for (int i = 0; i < bundle->collective_count; ++i)
    st__analyze_one(bundle, &bundle->collectives[i], "collective", &progs[bundle->program_count + i]);
  for (int i = 0; i < n; ++i) progs[i].role = st__role(bundle, progs[i].name);
  *out_n = n;
  return progs;
}

/* A run directory's measurements: the launches per step from its plan,
 * the step lines of metrics.jsonl, the launch times of its traces. */
static st_status st__measure_run(const char* dir, const st_plan* step, st__prog* progs, int n, st__steps* steps,
                                 st__trace_sum* traces) {
  for (int k = 0; k < step->op_count; ++k) {
    const st_op* op = &step->ops[k];
    if (op->kind != ST_OP_LAUNCH && op->kind != ST_OP_RECOMPUTE && op->kind != ST_OP_COLLECTIVE) continue;
    const char* name = step->programs[op->program];
    for (int i = 0; i < n; ++i)
      if (!strcmp(progs[i].name, name)) {
        progs[i].launches += 1;
        break;
      }
  }
  st_status s = st__read_metrics(dir, steps);
  if (!s) s = st__read_traces(dir, progs, n, traces);
  return s;
}

/* The step's sums, its MFU against the peak, the program furthest above
 * its bound and the measured time by role. */
static void st__totals(const st__prog* progs, int n, bool is_run, const st_bundle* bundle, const st_plan* step,
                       const st__steps* steps, const st_train_peak* peak, st__step_totals* t) {
  memset(t, 0, sizeof(*t));
  for (int i = 0; i < n; ++i) {
    if (progs[i].error) continue;
    t->flops += progs[i].launches * progs[i].st.flops;
    t->dot += progs[i].launches * (progs[i].st.dot_flops + progs[i].st.conv_flops);
    t->read += progs[i].launches * progs[i].st.arg_bytes;
    t->write += progs[i].launches * progs[i].st.result_bytes;
  }
  t->model_flops = is_run ? st_train_model_flops_per_token(bundle) * steps->tokens : 0;
  t->devices = step->devices > 1 ? step->devices : 1;
  /* Per device: each device runs the step's launches. */
  t->mfu = -1;
  t->furthest = -1;
  for (int i = 0; i < n; ++i) {
    t->bound_s += progs[i].launches * progs[i].bound_us * 1e-6;
    if (progs[i].bound_us > 0 && progs[i].measured_n > 0 &&
        (t->furthest < 0 || progs[i].measured_us - progs[i].measured_n * progs[i].bound_us >
                                progs[t->furthest].measured_us - progs[t->furthest].measured_n * progs[t->furthest].bound_us))
      t->furthest = i;
  }
  if (peak->flops_per_s > 0 && steps->time_s > 0) t->mfu = t->model_flops / steps->time_s / (peak->flops_per_s * t->devices);
  for (int i = 0; i < n; ++i)
    for (int r = 0; r < ST__ROLES; ++r)
      if (progs[i].role && !strcmp(progs[i].role, kRoles[r])) t->role_us[r] += progs[i].measured_us;
}

/* --json's "step" object of a run directory. */
static json_t* st__step_json(const st__prog* progs, const st__step_totals* t, const st__steps* steps,
                             const st__trace_sum* traces) {
  json_t* sj = st_json_obj();
  st_json_put_int(sj, "devices", (int64_t)t->devices);
  st_json_put_num(sj, "flops", t->flops);
  st_json_put_num(sj, "dot_flops", t->dot);
  st_json_put_num(sj, "arg_bytes", t->read);
  st_json_put_num(sj, "result_bytes", t->write);
  st_json_put_num(sj, "tokens", steps->tokens);
  st_json_put_num(sj, "model_flops", t->model_flops);
  st_json_put_int(sj, "steps_measured", steps->count);
  if (steps->time_s > 0) {
    st_json_put_num(sj, "step_time_s", steps->time_s);
    st_json_put_num(sj, "achieved_flops_per_s", t->flops * t->devices / steps->time_s);
    st_json_put_num(sj, "model_flops_per_s", t->model_flops / steps->time_s);
    st_json_put_num(sj, "wait_s", steps->wait_s);
    st_json_put_num(sj, "host_s", steps->time_s - steps->wait_s);
  }
  st_json_put(sj, "mfu", t->mfu >= 0 ? json_real(t->mfu) : json_null());
  if (t->bound_s > 0) {
    st_json_put_num(sj, "bound_s", t->bound_s);
    if (steps->time_s > 0) st_json_put_num(sj, "bound_share", t->bound_s / steps->time_s);
  }
  /* The program whose measured launches lose the most time to their bound. */
  if (t->furthest >= 0) st_json_put_str(sj, "furthest_from_bound", progs[t->furthest].name);
  if (traces->files > 0) {
    json_t* tj = st_json_obj();
    st_json_put_int(tj, "files", traces->files);
    st_json_put_num(tj, "step_time_s", traces->span_us * 1e-6 / traces->files);
    st_json_put_num(tj, "device_s", traces->launch_us * 1e-6 / traces->files);
    /* Wait slices overlap (each runs from its issue): their sum is not a time. */
    st_json_put_num(tj, "wait_slices_s", traces->wait_us * 1e-6 / traces->files);
    st_json_put_num(tj, "host_ops_s", traces->host_us * 1e-6 / traces->files);
    json_t* share = st_json_obj();
    for (int r = 0; r < ST__ROLES; ++r)
      if (t->role_us[r] > 0) st_json_put_num(share, kRoles[r], traces->launch_us > 0 ? t->role_us[r] / traces->launch_us : 0);
    st_json_put(tj, "share_by_role", share);
    st_json_put(sj, "trace", tj);
  }
  return sj;
}

/* The screen's lines of a run directory's step below the table. */
static void st__print_step(const st__prog* progs, const st__step_totals* t, const st__steps* steps,
                           const st__trace_sum* traces) {
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
    const st__prog* fp = &progs[t->furthest];
    printf("      furthest from its bound: %s, %.1fx its %s bound (%.4f s per step above it)\n", fp->name,
           fp->measured_us / fp->measured_n / fp->bound_us, fp->memory_bound ? "memory" : "compute",
           (fp->measured_us - fp->measured_n * fp->bound_us) * 1e-6 / (traces->files > 0 ? traces->files : 1));
  }
  if (traces->files > 0) {
    printf("trace (%d step%s): device work", traces->files, traces->files > 1 ? "s" : "");
    for (int r = 0; r < ST__ROLES; ++r)
      if (t->role_us[r] > 0 && traces->launch_us > 0) printf(" %s %.0f%%", kRoles[r], 100 * t->role_us[r] / traces->launch_us);
    printf("; host ops %.4f s per step\n", traces->host_us * 1e-6 / traces->files);
  } else {
    printf("trace: none (trace.steps=[N] records one): no time per launch\n");
  }
}

/* The screen: the table, the peak and bound legend, XLA's fusions and,
 * for a run directory, its step. */
static void st__print_text(const st_bundle* bundle, const st__prog* progs, int n, bool is_run, const st_train_peak* peak,
                           const st__step_totals* t, const st__steps* steps, const st__trace_sum* traces) {
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
  st_analyze_target tg;
  st_status s = st_analyze_target_open(dir, &tg);
  bool is_run = tg.is_run;
  st_bundle* bundle = tg.bundle;
  st_plan_options o = tg.o;
  st_plan step = tg.step;
  int n = 0;
  st__prog* progs = NULL;
  st__steps steps;
  memset(&steps, 0, sizeof(steps));
  if (!s) progs = st__analyze_all(bundle, &n);
  st__trace_sum traces;
  memset(&traces, 0, sizeof(traces));
  if (!s && is_run) s = st__measure_run(dir, &step, progs, n, &steps, &traces);
  if (!s) {
    char* root = is_run ? NULL : st_cache_root(NULL);
    st__read_xla(is_run ? o.cache_root : root, bundle, progs, n);
    free(root);
  }
  st_train_peak peak;
  memset(&peak, 0, sizeof(peak));
  if (!s) {
    st__peak(is_run ? dir : NULL, is_run ? &o : NULL, &peak);
    for (int i = 0; i < n; ++i) st__bound(&progs[i], &peak);
  }
  if (!s) {
    st__step_totals t;
    st__totals(progs, n, is_run, bundle, &step, &steps, &peak, &t);
    if (json) {
      json_t* j = st_json_obj();
      st_json_put_str(j, "bundle", bundle->dir);
      if (is_run) st_json_put_str(j, "run_dir", dir);
      json_t* arr = st_json_arr();
      for (int i = 0; i < n; ++i) json_array_append_new(arr, st__prog_json(&progs[i]));
      st_json_put(j, "programs", arr);
      st_json_put(j, "peak", st_train_peak_json(&peak, (int)t.devices));
      if (is_run) st_json_put(j, "step", st__step_json(progs, &t, &steps, &traces));
      st_cli_print_json(j, 0);
      json_decref(j);
    } else {
      st__print_text(bundle, progs, n, is_run, &peak, &t, &steps, &traces);
    }
  }
  for (int i = 0; i < n; ++i) {
    st_ir_stats_free(&progs[i].st);
    free(progs[i].error);
    free(progs[i].xla_error);
  }
  free(progs);
  st_analyze_target_close(&tg);
  return st_cli_report(s);
}
