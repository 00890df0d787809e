/* analyze.c — what `strata analyze` computes (src/cli/cmd_analyze.c and
 * analyze_views.c print it): per program of a bundle its FLOPs, bytes,
 * arithmetic intensity, op counts, collectives, custom calls and hazards
 * (read by src/ir/ from the StableHLO text), XLA's optimized programs when
 * kept, and for a run directory the step's totals from its plan, metrics
 * and traces; beside them the DOT graphs, the diff of two bundles and the
 * lint of a target (docs/analysis.md).
 *
 * A run directory is recognised by its config.yaml: the plan is rebuilt
 * from it (as `strata plan` does), so the launches per program are the
 * ones the run executed, and the bundle is the one the run used (the same
 * key; its dir is also in events.jsonl's `bundle` event). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/config.h"
#include "strata/ir.h"
#include "strata/obs.h"
#include "strata/plan.h"
#include "strata/runtime.h"
#include "strata/sched.h"
#include "strata/train.h"

/* metrics.jsonl is read up to this many bytes (the step times). */
#define ST__METRICS_MAX ((size_t)64 << 20)

static bool st__is_file(const char* path) {
  struct stat s;
  return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

static void st__analyze_one(const st_bundle* bundle, const st_bundle_program* p, const char* kind, st_train_analyze_program* out) {
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

double st_train_analyze_intensity(const st_ir_stats* s) {
  double b = s->arg_bytes + s->result_bytes;
  return b > 0 ? s->flops / b : 0;
}

/* The roofline bound of one launch: the larger of its FLOPs at the peak
 * FLOP/s and its argument and result bytes (what a perfectly fused program
 * moves at least) at the memory bandwidth; the bandwidth side is left out
 * when it was not measured. */
static void st__bound(st_train_analyze_program* p, const st_train_peak* peak) {
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

static void st__read_xla(const char* cache_root, const st_bundle* bundle, st_train_analyze_program* progs, int n) {
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

static json_t* st__prog_json(const st_train_analyze_program* p) {
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
  st_json_put_num(j, "arithmetic_intensity", st_train_analyze_intensity(s));
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

/* ------------------------------------------------------------ run dirs */

static st_status st__read_metrics(const char* run_dir, st_train_analyze_steps* out) {
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

static const char* const kRoles[ST_TRAIN_ANALYZE_ROLES] = {"forward", "backward", "loss", "optimizer", "collective", "init", "other"};

const char* st_train_analyze_role(int r) { return r >= 0 && r < ST_TRAIN_ANALYZE_ROLES ? kRoles[r] : NULL; }

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
    if (ST__IS(gr->accum) || ST__IS(gr->sqnorm) || ST__IS(gr->update) || ST__IS(gr->shard_accum) ||
        ST__IS(gr->shard_sqnorm) || ST__IS(gr->shard_update))
      return "optimizer";
  }
#undef ST__IS
  return "other";
}

/* Traces read: files and bytes each (a trace of a big step is large, not huge). */
#define ST__MAX_TRACES 64
#define ST__TRACE_MAX ((size_t)256 << 20)

/* Reads <run>/trace/step_*.json: per program its launch time (Chrome
 * trace complete events of category launch, recompute or collective, named
 * after the program), per step the waits and host ops. */
static st_status st__read_traces(const char* run_dir, st_train_analyze_program* progs, int n, st_train_analyze_traces* out) {
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

st_status st_train_analyze_target_open(const char* dir, st_train_analyze_target* t) {
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
    /* As `strata CMD CONFIG` loads it: a path holding '=' reads as an override. */
    if (strchr(config, '=') != NULL)
      s = st_status_make(ST_CODE_CONFIG, "usage: strata %s CONFIG [key=value ...] (e.g. strata %s configs/tiny.yml train.steps=10)",
                         "analyze", "analyze");
    else
      s = st_config_load(config, 0, NULL, &t->cfg);
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

void st_train_analyze_target_close(st_train_analyze_target* t) {
  st_plan_deinit(&t->step);
  st_plan_deinit(&t->eval);
  st_plan_remat_choice_deinit(&t->remat);
  if (t->have_opts) st_plan_options_deinit(&t->o);
  st_bundle_destroy(t->bundle);
  st_config_destroy(t->cfg);
  memset(t, 0, sizeof(*t));
}

/* Every program and collective of |bundle| analyzed (a new array of *out_n,
 * each with its role); a program that does not read carries its error. */
static st_train_analyze_program* st__analyze_all(const st_bundle* bundle, int* out_n) {
  int n = bundle->program_count + bundle->collective_count;
  st_train_analyze_program* progs = st_xcalloc((size_t)(n > 0 ? n : 1), sizeof(*progs));
  for (int i = 0; i < bundle->program_count; ++i) st__analyze_one(bundle, &bundle->programs[i], "program", &progs[i]);
  for (int i = 0; i < bundle->collective_count; ++i)
    st__analyze_one(bundle, &bundle->collectives[i], "collective", &progs[bundle->program_count + i]);
  for (int i = 0; i < n; ++i) progs[i].role = st__role(bundle, progs[i].name);
  *out_n = n;
  return progs;
}

/* A run directory's measurements: the launches per step from its plan,
 * the step lines of metrics.jsonl, the launch times of its traces. */
static st_status st__measure_run(const char* dir, const st_plan* step, st_train_analyze_program* progs, int n, st_train_analyze_steps* steps,
                                 st_train_analyze_traces* traces) {
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
static void st__totals(const st_train_analyze_program* progs, int n, bool is_run, const st_bundle* bundle, const st_plan* step,
                       const st_train_analyze_steps* steps, const st_train_peak* peak, st_train_analyze_totals* t) {
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
    for (int r = 0; r < ST_TRAIN_ANALYZE_ROLES; ++r)
      if (progs[i].role && !strcmp(progs[i].role, kRoles[r])) t->role_us[r] += progs[i].measured_us;
}

/* --json's "step" object of a run directory. */
static json_t* st__step_json(const st_train_analyze_program* progs, const st_train_analyze_totals* t, const st_train_analyze_steps* steps,
                             const st_train_analyze_traces* traces) {
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
    for (int r = 0; r < ST_TRAIN_ANALYZE_ROLES; ++r)
      if (t->role_us[r] > 0) st_json_put_num(share, kRoles[r], traces->launch_us > 0 ? t->role_us[r] / traces->launch_us : 0);
    st_json_put(tj, "share_by_role", share);
    st_json_put(sj, "trace", tj);
  }
  return sj;
}

/* ---------------------------------------------------------------- views */

static bool st__is_mlir_file(const char* path) {
  struct stat s;
  size_t n = strlen(path);
  return n > 5 && !strcmp(path + n - 5, ".mlir") && stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

/* A DOT string: quotes and backslashes escaped, newlines as \n. */
static void st__dot_str(st_strbuf* b, const char* s) {
  st_strbuf_append(b, "\"");
  for (; *s; ++s) {
    if (*s == '"' || *s == '\\') st_strbuf_printf(b, "\\%c", *s);
    else if (*s == '\n') st_strbuf_append(b, "\\n");
    else st_strbuf_append_n(b, s, 1);
  }
  st_strbuf_append(b, "\"");
}

/* ---------------------------------------------------------- --dot=PROGRAM */

static st_status st__program_dot(const char* path, const char* name, st_strbuf* out) {
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &text, &size);
  st_ir_graph g;
  memset(&g, 0, sizeof(g));
  if (!s) s = st_ir_main_graph(text, size, path, &g);
  free(text);
  if (s) return s;
  st_strbuf_append(out, "digraph ");
  st__dot_str(out, name);
  st_strbuf_append(out, " {\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
  for (int i = 0; i < g.n_nodes; ++i) {
    const st_ir_node* nd = &g.nodes[i];
    st_strbuf label = {0};
    st_strbuf_printf(&label, "%s%s%s\n%s", nd->op, nd->value[0] ? " " : "", nd->value, nd->type);
    st_strbuf_printf(out, "  n%d [label=", i);
    st__dot_str(out, label.data ? label.data : "");
    st_strbuf_free(&label);
    if (nd->collective) st_strbuf_append(out, ", shape=hexagon, style=filled, fillcolor=\"#f4a582\"");
    else if (nd->custom_call) st_strbuf_append(out, ", shape=octagon, style=filled, fillcolor=\"#fddbc7\"");
    else if (!strcmp(nd->op, "arg") || !strcmp(nd->op, "return")) st_strbuf_append(out, ", shape=ellipse");
    else if (!strcmp(nd->op, "dot_general") || !strcmp(nd->op, "dot") || !strcmp(nd->op, "convolution"))
      st_strbuf_append(out, ", style=filled, fillcolor=\"#92c5de\"");
    st_strbuf_append(out, "];\n");
  }
  for (int i = 0; i < g.n_edges; ++i) st_strbuf_printf(out, "  n%d -> n%d;\n", g.edges[i].from, g.edges[i].to);
  st_strbuf_append(out, "}\n");
  st_ir_graph_free(&g);
  return ST_OK;
}

/* ---------------------------------------------------------- --dot (plan) */

/* One node per launch, recompute or collective op of the step (an H2D
 * source "host" and a READ sink "read" beside them); an edge per slot
 * handed from the op that last wrote it to an op that reads it, labelled
 * with the slot (the first one, "+N" more). Persistent slots (parameters,
 * optimizer state) read before the step writes them are not drawn: they
 * would tie every launch to the state. */
static void st__plan_dot(const st_plan* p, st_strbuf* out) {
  int n = p->op_count;
  int* node = st_xcalloc((size_t)n + 1, sizeof(int)); /* op -> node id, -1 none */
  int* writer = st_xcalloc((size_t)p->slot_count + 1, sizeof(int));
  for (int i = 0; i < p->slot_count; ++i) writer[i] = -1;
  /* edges: (from, to) -> first slot, count */
  int cap = 64, ne = 0;
  int(*edges)[4] = st_xcalloc((size_t)cap, sizeof(*edges));
  const int HOST = -2, READ = -3;
  bool used_host = false, used_read = false;
  st_strbuf_append(out, "digraph \"step\" {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
  for (int k = 0; k < n; ++k) {
    const st_op* op = &p->ops[k];
    node[k] = -1;
    bool launch = op->kind == ST_OP_LAUNCH || op->kind == ST_OP_RECOMPUTE || op->kind == ST_OP_COLLECTIVE;
    int self = -1;
    if (launch) {
      self = k;
      node[k] = k;
      st_strbuf label = {0};
      st_strbuf_printf(&label, "%s%s", op->kind == ST_OP_RECOMPUTE ? "recompute " : "", p->programs[op->program]);
      if (op->layer >= 0) st_strbuf_printf(&label, "\nl=%d", op->layer);
      if (op->micro >= 0) st_strbuf_printf(&label, "%sm=%d", op->layer >= 0 ? " " : "\n", op->micro);
      st_strbuf_printf(out, "  op%d [label=", k);
      st__dot_str(out, label.data);
      st_strbuf_free(&label);
      if (op->kind == ST_OP_COLLECTIVE)
        st_strbuf_append(out, ", shape=hexagon, style=filled, fillcolor=\"#f4a582\"");
      else if (op->kind == ST_OP_RECOMPUTE)
        st_strbuf_append(out, ", style=\"filled,dashed\", fillcolor=\"#e0e0e0\"");
      st_strbuf_append(out, "];\n");
    } else if (op->kind == ST_OP_READ || op->kind == ST_OP_D2H) {
      self = READ;
    } else if (op->kind != ST_OP_H2D) {
      continue;
    }
    if (op->kind != ST_OP_H2D) {
      for (int i = 0; i < op->input_count; ++i) {
        int slot = op->inputs[i];
        if (slot < 0 || slot >= p->slot_count) continue;
        int from = writer[slot];
        if (from == -1) continue; /* state from the step before */
        int e = 0;
        while (e < ne && !(edges[e][0] == from && edges[e][1] == self)) ++e;
        if (e == ne) {
          if (ne == cap) {
            cap *= 2;
            edges = st_xrealloc(edges, (size_t)cap * sizeof(*edges));
          }
          edges[ne][0] = from;
          edges[ne][1] = self;
          edges[ne][2] = slot;
          edges[ne][3] = 0;
          ++ne;
        }
        edges[e][3]++;
        used_host |= from == HOST;
        used_read |= self == READ;
      }
    }
    for (int i = 0; i < op->output_count; ++i) {
      int slot = op->outputs[i];
      if (slot >= 0 && slot < p->slot_count) writer[slot] = op->kind == ST_OP_H2D ? HOST : self;
    }
  }
  if (used_host) st_strbuf_append(out, "  host [label=\"host (H2D)\", shape=ellipse];\n");
  if (used_read) st_strbuf_append(out, "  read [label=\"host (READ)\", shape=ellipse];\n");
  for (int e = 0; e < ne; ++e) {
    char from[24], to[24];
    if (edges[e][0] == HOST) snprintf(from, sizeof(from), "host");
    else snprintf(from, sizeof(from), "op%d", edges[e][0]);
    if (edges[e][1] == READ) snprintf(to, sizeof(to), "read");
    else snprintf(to, sizeof(to), "op%d", edges[e][1]);
    st_strbuf label = {0};
    st_strbuf_append(&label, p->slots[edges[e][2]].name);
    if (edges[e][3] > 1) st_strbuf_printf(&label, " +%d", edges[e][3] - 1);
    st_strbuf_printf(out, "  %s -> %s [label=", from, to);
    st__dot_str(out, label.data);
    st_strbuf_free(&label);
    st_strbuf_append(out, ", fontsize=8];\n");
  }
  st_strbuf_append(out, "}\n");
  free(edges);
  free(writer);
  free(node);
}

/* The DOT of one program of a bundle or run (or of an .mlir file), or of
 * a run's step plan. */
st_status st_train_analyze_dot(const char* path, const char* program, st_strbuf* out) {
  st_status s = ST_OK;
  if (st__is_mlir_file(path)) {
    if (program && program[0]) {
      s = st__program_dot(path, program, out);
    } else {
      const char* slash = strrchr(path, '/');
      s = st__program_dot(path, slash ? slash + 1 : path, out);
    }
    return s;
  }
  st_train_analyze_target t;
  s = st_train_analyze_target_open(path, &t);
  if (!s && program && program[0]) {
    const st_bundle_program* bp = st_bundle_program_find(t.bundle, program);
    if (!bp) bp = st_bundle_collective_find(t.bundle, program);
    if (!bp)
      s = st_status_make(ST_CODE_CONFIG, "strata analyze --dot=%s: the bundle %s has no such program", program,
                         t.bundle->dir);
    else
      s = st__program_dot(bp->path, program, out);
  } else if (!s) {
    if (!t.is_run)
      s = st_status_make(ST_CODE_CONFIG,
                         "strata analyze --dot: a bundle has no step plan; pass a run directory, or name a "
                         "program (--dot=PROGRAM)");
    else
      st__plan_dot(&t.step, out);
  }
  st_train_analyze_target_close(&t);
  return s;
}

/* --------------------------------------------------------------- --diff */

static const st_bundle_program* st__find_any(const st_bundle* b, const char* name) {
  const st_bundle_program* p = st_bundle_program_find(b, name);
  return p ? p : st_bundle_collective_find(b, name);
}

static void st__pair(json_t* j, const char* key, double a, double b) {
  if (a == b) return;
  json_t* p = st_json_arr();
  json_array_append_new(p, json_real(a));
  json_array_append_new(p, json_real(b));
  st_json_put(j, key, p);
}

/* What changed between two analyses of one program: the counts that
 * differ as [a, b], the collectives and custom calls whose counts differ. */
static json_t* st__prog_diff(const char* name, const st_bundle_program* pa, const st_bundle_program* pb,
                             const st_ir_stats* a, const st_ir_stats* b) {
  json_t* j = st_json_obj();
  st_json_put_str(j, "name", name);
  st_json_put_bool(j, "text_changed", strcmp(pa->sha256, pb->sha256) != 0);
  st_json_put_bool(j, "signature_changed", !st_bundle_same_signature(pa, pb));
  st__pair(j, "flops", a->flops, b->flops);
  st__pair(j, "dot_flops", a->dot_flops, b->dot_flops);
  st__pair(j, "transcendentals", a->transcendentals, b->transcendentals);
  st__pair(j, "arg_bytes", a->arg_bytes, b->arg_bytes);
  st__pair(j, "result_bytes", a->result_bytes, b->result_bytes);
  st__pair(j, "bytes_accessed", a->bytes_accessed, b->bytes_accessed);
  json_t* ops = st_json_obj();
  const char* names[] = {"total", "dot", "convolution", "elementwise", "reduce", "data_movement", "constant",
                         "collective", "custom_call", "while", "call", "other"};
  const st_ir_op_counts *x = &a->ops, *y = &b->ops;
  const int64_t va[] = {x->total, x->dot, x->convolution, x->elementwise, x->reduce, x->data_movement,
                        x->constant, x->collective, x->custom_call, x->while_loop, x->call, x->other};
  const int64_t vb[] = {y->total, y->dot, y->convolution, y->elementwise, y->reduce, y->data_movement,
                        y->constant, y->collective, y->custom_call, y->while_loop, y->call, y->other};
  for (int k = 0; k < 12; ++k) st__pair(ops, names[k], (double)va[k], (double)vb[k]);
  st_json_put(j, "ops", ops);
  json_t* coll = st_json_arr();
  for (int side = 0; side < 2; ++side) {
    const st_ir_stats* x = side ? b : a;
    const st_ir_stats* y = side ? a : b;
    for (int i = 0; i < x->n_collectives; ++i) {
      const st_ir_collective* c = &x->collectives[i];
      const st_ir_collective* d = NULL;
      for (int k = 0; k < y->n_collectives && !d; ++k)
        if (!strcmp(y->collectives[k].kind, c->kind) && !strcmp(y->collectives[k].groups, c->groups))
          d = &y->collectives[k];
      if (side && d) continue; /* listed from a's side */
      double ca = side ? 0 : c->count, cb = side ? c->count : (d ? d->count : 0);
      double ba = side ? 0 : c->bytes, bb = side ? c->bytes : (d ? d->bytes : 0);
      if (ca == cb && ba == bb) continue;
      json_t* e = st_json_obj();
      st_json_put_str(e, "kind", c->kind);
      st_json_put_str(e, "groups", c->groups);
      st__pair(e, "count", ca, cb);
      st__pair(e, "bytes", ba, bb);
      json_array_append_new(coll, e);
    }
  }
  st_json_put(j, "collectives", coll);
  json_t* cc = st_json_arr();
  for (int side = 0; side < 2; ++side) {
    const st_ir_stats* x = side ? b : a;
    const st_ir_stats* y = side ? a : b;
    for (int i = 0; i < x->n_custom_calls; ++i) {
      const st_ir_custom_call* c = &x->custom_calls[i];
      const st_ir_custom_call* d = NULL;
      for (int k = 0; k < y->n_custom_calls && !d; ++k)
        if (!strcmp(y->custom_calls[k].target, c->target)) d = &y->custom_calls[k];
      if (side && d) continue;
      double ca = side ? 0 : c->count, cb = side ? c->count : (d ? d->count : 0);
      if (ca == cb) continue;
      json_t* e = st_json_obj();
      st_json_put_str(e, "target", c->target);
      st__pair(e, "count", ca, cb);
      json_array_append_new(cc, e);
    }
  }
  st_json_put(j, "custom_calls", cc);
  return j;
}

/* The names of both bundles' programs and collectives, a's order first. */
static int st__union_names(const st_bundle* a, const st_bundle* b, const char*** out) {
  int cap = a->program_count + a->collective_count + b->program_count + b->collective_count;
  const char** names = st_xcalloc((size_t)(cap > 0 ? cap : 1), sizeof(char*));
  int n = 0;
  const st_bundle* both[2] = {a, b};
  for (int s = 0; s < 2; ++s) {
    const st_bundle* x = both[s];
    for (int i = 0; i < x->program_count + x->collective_count; ++i) {
      const char* nm = i < x->program_count ? x->programs[i].name : x->collectives[i - x->program_count].name;
      bool seen = false;
      for (int k = 0; k < n && !seen; ++k) seen = !strcmp(names[k], nm);
      if (!seen) names[n++] = nm;
    }
  }
  *out = names;
  return n;
}

st_status st_train_analyze_diff(const char* dir_a, const char* dir_b, st_json** out) {
  *out = NULL;
  st_train_analyze_target ta, tb;
  st_status s = st_train_analyze_target_open(dir_a, &ta);
  memset(&tb, 0, sizeof(tb));
  if (!s) s = st_train_analyze_target_open(dir_b, &tb);
  if (!s) {
    const st_bundle* a = ta.bundle;
    const st_bundle* b = tb.bundle;
    const char** names = NULL;
    int n = st__union_names(a, b, &names);
    json_t* added = st_json_arr();
    json_t* removed = st_json_arr();
    json_t* changed = st_json_arr();
    int same = 0;
    for (int i = 0; i < n && !s; ++i) {
      const st_bundle_program* pa = st__find_any(a, names[i]);
      const st_bundle_program* pb = st__find_any(b, names[i]);
      if (!pa) {
        json_array_append_new(added, json_string(names[i]));
        continue;
      }
      if (!pb) {
        json_array_append_new(removed, json_string(names[i]));
        continue;
      }
      if (!strcmp(pa->sha256, pb->sha256) && st_bundle_same_signature(pa, pb)) {
        ++same;
        continue;
      }
      st_ir_stats sa, sb;
      s = st_ir_analyze_file(pa->path, &sa);
      if (!s) {
        s = st_ir_analyze_file(pb->path, &sb);
        if (!s) json_array_append_new(changed, st__prog_diff(names[i], pa, pb, &sa, &sb));
        st_ir_stats_free(&sb);
      }
      st_ir_stats_free(&sa);
    }
    free(names);
    json_t* j = st_json_obj();
    st_json_put_str(j, "a", a->dir);
    st_json_put_str(j, "b", b->dir);
    st_json_put_bool(j, "same_key", !strcmp(a->key, b->key));
    st_json_put(j, "added", added);
    st_json_put(j, "removed", removed);
    st_json_put(j, "changed", changed);
    st_json_put_int(j, "unchanged", same);
    if (s) json_decref(j);
    else *out = j;
  }
  st_train_analyze_target_close(&ta);
  st_train_analyze_target_close(&tb);
  return s;
}

/* --------------------------------------------------------------- --lint */

/* A bundle against the cache's bundle of the same key, when that is another. */
static void st__lint_bundle(const char* path, st_bundle* b, st_lint_report* r) {
  st_bundle* prev = NULL;
  char* root = st_cache_root(NULL);
  st_strbuf other = {0};
  st_strbuf_printf(&other, "%s/bundles/%s", root, b->key);
  char* a = realpath(other.data, NULL);
  char* c = realpath(path, NULL);
  if (a && c && strcmp(a, c)) {
    st_status ps = st_bundle_open(other.data, &prev);
    st_status_free(ps);
  }
  free(a);
  free(c);
  st_strbuf_free(&other);
  free(root);
  st_lint_bundle(b, prev, r);
  st_bundle_destroy(prev);
}

st_status st_train_analyze_lint(const char* path, st_lint_report* r, char** what) {
  memset(r, 0, sizeof(*r));
  st_status s = ST_OK;
  *what = NULL;
  if (st__is_mlir_file(path)) {
    char* text = NULL;
    size_t size = 0;
    s = st_fs_read_file(path, &text, &size);
    const char* slash = strrchr(path, '/');
    if (!s) st_lint_program_text(slash ? slash + 1 : path, text, size, r);
    free(text);
    *what = st_xstrdup(path);
    return s;
  }
  char* manifest = st_path_join(path, "manifest.json");
  bool is_bundle = st_fs_exists(manifest);
  free(manifest);
  if (is_bundle) {
    st_bundle* b = NULL;
    s = st_bundle_open(path, &b);
    if (!s) st__lint_bundle(path, b, r);
    *what = st_xstrdup(s ? path : b->dir);
    st_bundle_destroy(b);
    return s;
  }
  /* A run directory: its bundle through st_bundle_ensure, which lints it
   * (an error fails the open, naming program and op). */
  st_train_analyze_target t;
  s = st_train_analyze_target_open(path, &t);
  if (!s) {
    *r = t.bundle->lint;
    memset(&t.bundle->lint, 0, sizeof(t.bundle->lint));
  }
  *what = st_xstrdup(s ? path : t.bundle->dir);
  st_train_analyze_target_close(&t);
  return s;
}

/* ------------------------------------------------------------- analyze */

st_status st_train_analyze(const st_train_analyze_options* options, st_train_analyze_result* r) {
  memset(r, 0, sizeof(*r));
  const char* dir = options->dir;
  r->dir = dir;
  st_status s = st_train_analyze_target_open(dir, &r->target);
  bool is_run = r->target.is_run;
  st_bundle* bundle = r->target.bundle;
  const st_plan_options* o = &r->target.o;
  if (!s) r->programs = st__analyze_all(bundle, &r->program_count);
  if (!s && is_run) s = st__measure_run(dir, &r->target.step, r->programs, r->program_count, &r->steps, &r->traces);
  if (!s) {
    char* root = is_run ? NULL : st_cache_root(NULL);
    st__read_xla(is_run ? o->cache_root : root, bundle, r->programs, r->program_count);
    free(root);
  }
  if (!s) {
    st__peak(is_run ? dir : NULL, is_run ? o : NULL, &r->peak);
    for (int i = 0; i < r->program_count; ++i) st__bound(&r->programs[i], &r->peak);
  }
  if (!s) st__totals(r->programs, r->program_count, is_run, bundle, &r->target.step, &r->steps, &r->peak, &r->totals);
  return s;
}

st_json* st_train_analyze_json(const st_train_analyze_result* r) {
  json_t* j = st_json_obj();
  st_json_put_str(j, "bundle", r->target.bundle->dir);
  if (r->target.is_run) st_json_put_str(j, "run_dir", r->dir);
  json_t* arr = st_json_arr();
  for (int i = 0; i < r->program_count; ++i) json_array_append_new(arr, st__prog_json(&r->programs[i]));
  st_json_put(j, "programs", arr);
  st_json_put(j, "peak", st_train_peak_json(&r->peak, (int)r->totals.devices));
  if (r->target.is_run) st_json_put(j, "step", st__step_json(r->programs, &r->totals, &r->steps, &r->traces));
  return j;
}

void st_train_analyze_result_free(st_train_analyze_result* r) {
  for (int i = 0; i < r->program_count; ++i) {
    st_ir_stats_free(&r->programs[i].st);
    free(r->programs[i].error);
    free(r->programs[i].xla_error);
  }
  free(r->programs);
  st_train_analyze_target_close(&r->target);
  memset(r, 0, sizeof(*r));
}
