/* metrics.c — what a run writes about itself: the metrics line of every
 * step and evaluation (metrics.jsonl, the contract in docs/bundle.md, "Block metrics")
 * and the events of the lifecycle (events.jsonl). Lines are jansson trees
 * (st_json_*), so any path or message in them stays valid JSON. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/kernels.h"
#include "strata/diag.h"
#include "strata/obs.h"
#include "train/train_internal.h"

st_status st__event(st__trainer* t, const char* name, json_t* fields) { return st_runlog_event(t->log, name, fields); }

/* Every metrics line, step or eval: the live sinks see it first (they copy
 * what they keep), then metrics.jsonl takes it. */
static st_status st__metrics_line(st__trainer* t, json_t* m) {
  st_metrics_server_publish(t->metrics, m);
  return st_runlog_metrics(t->log, m);
}

/* The scheduler's accounting of one step (docs/scheduling.md), appended to
 * the metrics line after the contract fields. */
static void st__sched_metrics(const st_executor_stats* es, int devices, json_t* m) {
  st_json_put_int(m, "recomputes", es->recomputes);
  st_json_put(m, "recompute_s", st_json_fixed(es->recompute_s, 6));
  st_json_put_int(m, "waits", es->waits);
  st_json_put_int(m, "waits_blocked", es->waits_blocked);
  st_json_put_int(m, "h2d_bytes", es->h2d_bytes);
  st_json_put_int(m, "d2h_bytes", es->d2h_bytes);
  st_json_put(m, "transfer_s", st_json_fixed(es->transfer_s, 6));
  st_json_put(m, "overlap_ratio", es->transfer_s > 0 ? st_json_fixed(es->transfer_hidden_s / es->transfer_s, 4) : json_null());
  st_json_put_int(m, "max_inflight", es->max_inflight);
  st_json_put_int(m, "peak_live_bytes_predicted", es->predicted_peak_bytes);
  json_t* cats = st_json_obj();
  for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k)
    st_json_put_int(cats, st_slot_category_name((st_slot_category)k), es->peak_by_category[k]);
  st_json_put(m, "peak_live_by_category", cats);
  cats = st_json_obj();
  for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k)
    st_json_put_int(cats, st_slot_category_name((st_slot_category)k), es->predicted_peak_by_category[k]);
  st_json_put(m, "peak_live_by_category_predicted", cats);
  st_json_put_int(m, "host_bytes", es->host_bytes);
  st_json_put_int(m, "live_mismatch_op", es->live_mismatch_op);
  /* With XLA's temporaries of the program running (docs/scheduling.md, "Temporaries"). */
  st_json_put_int(m, "peak_with_temps_bytes", es->peak_with_temps_bytes);
  st_json_put_int(m, "peak_with_temps_bytes_predicted", es->predicted_peak_with_temps_bytes);
  st_json_put_int(m, "peak_temps_bytes", es->peak_temps_bytes);
  if (devices > 1) {
    /* A mesh (docs/parallelism.md): its collectives, by kind too. */
    st_json_put_int(m, "devices", devices);
    st_json_put_int(m, "collectives", es->collectives);
    st_json_put_int(m, "collective_bytes", es->collective_bytes);
    json_t* kinds = st_json_obj();
    for (int k = 0; k < ST_COLL_KIND_COUNT; ++k) {
      if (!es->collectives_by_kind[k]) continue;
      json_t* e = st_json_obj();
      st_json_put_int(e, "count", es->collectives_by_kind[k]);
      st_json_put_int(e, "bytes", es->collective_bytes_by_kind[k]);
      st_json_put(kinds, st_collective_kind_name((st_collective_kind)k), e);
    }
    st_json_put(m, "collectives_by_kind", kinds);
    st_json_put(m, "collective_s", st_json_fixed(es->collective_s, 6));
    st_json_put(m, "comm_overlap_ratio",
                es->collective_s > 0 ? st_json_fixed(es->collective_hidden_s / es->collective_s, 4) : json_null());
    st_json_put(m, "comm_wait_s", st_json_fixed(es->comm_wait_s, 6));
    st_json_put_int(m, "comm_waits", es->comm_waits);
  }
}

/* A pipeline's step (docs/parallelism.md, "Pipeline"): the sends, each
 * stage's busy time (the union of its launches, from the executor's
 * timestamps), the measured bubble next to the plan's predicted one and
 * the theory for equal stages, and each stage's accounted peak by
 * category next to the prediction. */
static void st__pipeline_metrics(const st_plan* p, const st_executor_stats* es, const st_op_timing* tm, json_t* m) {
  if (p->stages <= 1) return;
  json_t* pm = st_json_obj();
  st_json_put_int(pm, "stages", p->stages);
  st_json_put_int(pm, "sends", es->sends);
  st_json_put_int(pm, "send_bytes", es->send_bytes);
  st_json_put(pm, "send_s", st_json_fixed(es->send_s, 6));
  st_json_put(pm, "send_overlap_ratio", es->send_s > 0 ? st_json_fixed(es->send_hidden_s / es->send_s, 4) : json_null());
  st_json_put(pm, "span_s", st_json_fixed(es->span_s, 6));
  st_json_put(pm, "bubble", st_json_fixed(es->bubble_fraction, 4));
  /* The schedule replayed with each task's measured run time (its
   * launches' start..complete, summed): the bubble of one device per stage
   * at these speeds, which the shared CPU cannot show directly. */
  if (tm && p->pipe_task_count > 0) {
    double* secs = st_xcalloc((size_t)p->pipe_task_count, sizeof(double));
    for (int i = 0; i < p->op_count; ++i) {
      const st_op* op = &p->ops[i];
      const bool compute = op->kind == ST_OP_LAUNCH || op->kind == ST_OP_RECOMPUTE || op->kind == ST_OP_COLLECTIVE;
      if (compute && op->task >= 0 && op->task < p->pipe_task_count && tm[i].complete_s > tm[i].start_s)
        secs[op->task] += tm[i].complete_s - tm[i].start_s;
    }
    st_json_put(pm, "bubble_replayed", st_json_fixed(st_plan_pipeline_replay(p, secs, NULL), 4));
    free(secs);
  }
  const int P = p->stages;
  double theory = 0;
  const double predicted_bubble = st_plan_pipeline_bubble(p, &theory, NULL);
  st_json_put(pm, "bubble_predicted", st_json_fixed(predicted_bubble, 4));
  st_json_put(pm, "bubble_theory", st_json_fixed(theory, 4));
  int64_t* predicted = st_xcalloc((size_t)P * ST_SLOT_CATEGORY_COUNT, sizeof(int64_t));
  st_plan_predict_stage_peaks(p, predicted);
  json_t* stages = st_json_arr();
  for (int st = 0; st < P && st < ST_PLAN_MAX_STAGES; ++st) {
    json_t* o = st_json_obj();
    st_json_put(o, "busy_s", st_json_fixed(es->stage_busy_s[st], 6));
    json_t* a = st_json_obj();
    json_t* b = st_json_obj();
    for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) {
      st_json_put_int(a, st_slot_category_name((st_slot_category)k), es->stage_peak_by_category[st][k]);
      st_json_put_int(b, st_slot_category_name((st_slot_category)k), predicted[(size_t)st * ST_SLOT_CATEGORY_COUNT + (size_t)k]);
    }
    st_json_put(o, "peak_by_category", a);
    st_json_put(o, "peak_by_category_predicted", b);
    st_json_push(stages, o);
  }
  free(predicted);
  st_json_put(pm, "stage", stages);
  st_json_put(m, "pipeline", pm);
}

/* Per-kernel observability (docs/kernels.md, "Observability"): on when
 * trace.steps lists any step and the bundle calls FFI kernels. */
static bool st__kernel_obs(const st__trainer* t) {
  return t->o->trace_step_count > 0 && st_kernels_bundle_uses_ffi(t->bundle);
}

static bool st__traced(const st__trainer* t, int64_t step) {
  bool want = false;
  for (int i = 0; i < t->o->trace_step_count; ++i) want |= t->o->trace_steps[i] == step;
  return want;
}

void st__kernels_step_begin(st__trainer* t) {
  if (!st__kernel_obs(t)) return;
  st_kernels_stats_take(NULL, 0);
  st_kernels_spans_record(st__traced(t, t->step + 1));
}

/* "kernels": {"<op>.<fwd|bwd>": {"calls": n, "time_s": s}} of the handlers
 * that ran in the step (time: summed over calls, on XLA's threads). */
static void st__kernel_metrics(st__trainer* t, json_t* m) {
  if (!st__kernel_obs(t)) return;
  st_kernel_stat rows[64];
  int n = st_kernels_stats_take(rows, 64);
  json_t* k = st_json_obj();
  for (int i = 0; i < n; ++i) {
    if (rows[i].calls == 0) continue;
    char key[96];
    snprintf(key, sizeof(key), "%s.%s", rows[i].op, rows[i].direction);
    json_t* e = st_json_obj();
    st_json_put_int(e, "calls", rows[i].calls);
    st_json_put(e, "time_s", st_json_fixed(rows[i].seconds, 6));
    st_json_put(k, key, e);
  }
  st_json_put(m, "kernels", k);
}

/* trace.steps: the step just run as Chrome trace-event JSON under <run>/trace/. */
static st_status st__maybe_trace(st__trainer* t) {
  int64_t step = t->step + 1;
  if (!st__traced(t, step)) return ST_OK;
  char* dir = st_rundir_path(t->run_dir, ST_RUNDIR_TRACE);
  st_status s = st_fs_mkdirs(dir);
  char file[64];
  snprintf(file, sizeof(file), "step_%lld.json", (long long)step);
  char* path = st_path_join(dir, file);
  st_trace_spans spans = {0};
  if (st__kernel_obs(t)) {
    st_kernels_spans_take_trace(&spans);
    st_kernels_spans_record(false);
  }
  if (!s) s = st_executor_write_trace(t->ex, path, step, &spans);
  st_trace_spans_free(&spans);
  if (!s) {
    json_t* f = st_json_obj();
    st_json_put_int(f, "step", step);
    st_json_put_str(f, "path", path);
    s = st__event(t, "trace", f);
  }
  free(path);
  free(dir);
  return s;
}

st_status st__plan_event(st__trainer* t) {
  const st_plan* p = &t->step_plan;
  int counts[ST_OP_SEND + 1] = {0};
  for (int i = 0; i < p->op_count; ++i) counts[p->ops[i].kind]++;
  /* COLLECTIVE is listed only for a data-parallel plan, XPROC only for a
   * job's, SEND only for a pipeline's: one-device runs keep their event. */
  int kinds = t->o->procs > 1 ? ST_OP_XPROC + 1 : p->devices > 1 ? ST_OP_COLLECTIVE + 1 : ST_OP_COLLECTIVE;
  json_t* e = st_json_obj();
  st_json_put_str(e, "policy", p->policy ? p->policy : "");
  st_json_put_int(e, "ops", p->op_count);
  json_t* c = st_json_obj();
  for (int k = 0; k < kinds; ++k) st_json_put_int(c, st_op_kind_name((st_op_kind)k), counts[k]);
  if (p->stages > 1) st_json_put_int(c, st_op_kind_name(ST_OP_SEND), counts[ST_OP_SEND]);
  st_json_put(e, "op_counts", c);
  st_json_put_int(e, "predicted_peak_bytes", st_plan_predict_live(p, NULL, NULL));
  if (p->program_temps) {
    st_plan_temps_peak tp;
    st_plan_predict_with_temps(p, NULL, &tp);
    st_json_put_int(e, "predicted_peak_with_temps_bytes", tp.peak);
    json_t* tj = st_json_obj();
    for (int i = 0; i < p->program_count; ++i) st_json_put_int(tj, p->programs[i], p->program_temps[i]);
    st_json_put(e, "program_temp_bytes", tj);
  }
  st_json_put(e, "remat", st_plan_remat_choice_json(&t->remat));
  st_json_put_int(e, "host_bytes", st_plan_host_bytes(p));
  st_json_put_str(e, "host_memory", st_executor_host_memory(t->ex));
  if (p->devices > 1) st_json_put_int(e, "devices", p->devices);
  if (t->o->procs > 1) {
    st_json_put_int(e, "processes", t->o->procs);
    st_json_put_int(e, "rank", t->o->rank);
  }
  return st__event(t, "plan", e);
}

/* |v| to 9 significant digits: a rate from a measured time written with
 * few digits, so it does not raise the line's real precision (base.h: one
 * precision per document, the most any real needs) and two runs with the
 * same losses write the same loss text. */
static json_t* st__sig9(double v) {
  if (!isfinite(v)) return json_null();
  if (v == 0) return st_json_num(0);
  int e = (int)floor(log10(fabs(v)));
  double r = e <= 8 ? round(v * pow(10.0, 8 - e)) / pow(10.0, 8 - e) : round(v / pow(10.0, e - 8)) * pow(10.0, e - 8);
  return st_json_num(isfinite(r) ? r : v);
}

/* RMS from a sum of squares over |n| elements; NaN (null) when unknown. */
static double st__rms(double sumsq, double n) { return n > 0 ? sqrt(sumsq / n) : NAN; }

/* diag.numerics (docs/diagnostics.md, "What is measured"): step level
 * param_norm, update_norm, update_ratio; layer level one key a statistic,
 * numerics/<stage>/<tensor>_<stat>, stage embed | layer<l> | head, tensor
 * out | dx (blocks) | grad | update, stat rms | maxabs | nonfinite.
 * Nothing of the update when the step's update was dropped. */
static void st__numerics_metrics(st__trainer* t, json_t* m) {
  const int numerics = t->o->numerics;
  if (numerics == ST_NUMERICS_OFF) return;
  double p_sq = 0, u_sq = 0;
  bool all = true;
  for (int i = 0; i < t->n_sq; ++i) {
    all = all && t->num_opt_read[i];
    p_sq += t->num_opt[i][ST_NSTAT_PARAM_SQ];
    u_sq += t->num_opt[i][ST_NSTAT_UPDATE_SQ];
  }
  if (all) {
    st_json_put_num(m, "param_norm", sqrt(p_sq));
    st_json_put_num(m, "update_norm", sqrt(u_sq));
    st_json_put_num(m, "update_ratio", p_sq > 0 ? sqrt(u_sq / p_sq) : NAN);
  }
  st_json_put_int(m, "skipped_steps", t->skipped_steps);
  if (numerics < ST_NUMERICS_LAYER) return;
  /* Gradients as the programs hold them are sums over microbatches (and
   * data-parallel devices) of means: scaled to the mean, as grad_norm is. */
  const double gmean = t->o->data.packing == ST_DATA_PACKING_CONCAT
                          ? 1.0 / ((double)t->o->microbatches * (double)(t->o->parallel_data > 1 ? t->o->parallel_data : 1))
                          : 1.0 / st__loss_divisor(t, ST_STREAM_TRAIN, t->o->microbatches);
  char key[96];
  for (int s = 0; s < t->n_sq; ++s) {
    char stage[32];
    if (s == 0)
      snprintf(stage, sizeof(stage), "embed");
    else if (s == t->n_sq - 1)
      snprintf(stage, sizeof(stage), "head");
    else
      snprintf(stage, sizeof(stage), "layer%d", s - 1);
    if (s > 0 && s < t->n_sq - 1) {
      const char* what[2] = {"out", "dx"};
      for (int k = 0; k < 2; ++k) {
        const double* a = t->num_act[s - 1][k];
        if (a[3] <= 0) continue;
        snprintf(key, sizeof(key), "numerics/%s/%s_rms", stage, what[k]);
        st_json_put_num(m, key, st__rms(a[0], a[3]));
        snprintf(key, sizeof(key), "numerics/%s/%s_maxabs", stage, what[k]);
        st_json_put_num(m, key, a[1]);
        snprintf(key, sizeof(key), "numerics/%s/%s_nonfinite", stage, what[k]);
        st_json_put_int(m, key, (int64_t)a[2]);
      }
    }
    if (!t->num_opt_read[s]) continue;
    const double* o = t->num_opt[s];
    const double n = o[ST_NSTAT_NUMEL];
    snprintf(key, sizeof(key), "numerics/%s/grad_rms", stage);
    st_json_put_num(m, key, st__rms(o[ST_NSTAT_GRAD_SQ], n) * gmean);
    snprintf(key, sizeof(key), "numerics/%s/grad_maxabs", stage);
    st_json_put_num(m, key, o[ST_NSTAT_GRAD_MAX] * gmean);
    snprintf(key, sizeof(key), "numerics/%s/grad_nonfinite", stage);
    st_json_put_int(m, key, (int64_t)o[ST_NSTAT_GRAD_BAD]);
    snprintf(key, sizeof(key), "numerics/%s/update_rms", stage);
    st_json_put_num(m, key, st__rms(o[ST_NSTAT_UPDATE_SQ], n));
    snprintf(key, sizeof(key), "numerics/%s/update_maxabs", stage);
    st_json_put_num(m, key, o[ST_NSTAT_UPDATE_MAX]);
    snprintf(key, sizeof(key), "numerics/%s/update_nonfinite", stage);
    st_json_put_int(m, key, (int64_t)o[ST_NSTAT_UPDATE_BAD]);
    snprintf(key, sizeof(key), "numerics/%s/param_rms", stage);
    st_json_put_num(m, key, st__rms(o[ST_NSTAT_PARAM_SQ], n));
  }
}

st_status st__step_metrics(st__trainer* t, double loss, double dt) {
  int64_t tokens = t->o->batch_size * t->T;
  const st_executor_stats* es = st_executor_stats_get(t->ex);
  json_t* m = st_json_obj();
  st_json_put_int(m, "step", t->step + 1);
  st_json_put_num(m, "loss", loss); /* null when not finite */
  st_json_put_num(m, "lr", t->lr);
  st_json_put_num(m, "grad_norm", t->grad_norm);
  st_json_put_int(m, "tokens", tokens);
  st_json_put(m, "step_time_s", st_json_fixed(dt, 6));
  st_json_put(m, "data_s", st_json_fixed(t->data_s, 6));
  /* none, pack: the targets that count (padding and prompts weigh 0). */
  if (t->o->data.packing != ST_DATA_PACKING_CONCAT) st_json_put_num(m, "loss_weight", t->weight_sum[ST_STREAM_TRAIN]);
  st_json_put(m, "tokens_per_s", st_json_fixed((double)tokens / dt, 1));
  /* MFU against the peak context.json names (mfu.c), times the devices. */
  double model_fps = t->model_flops_per_token * (double)tokens / dt;
  /* A job's tokens are every process's: so are its devices. */
  int devices = st_executor_devices(t->ex) * es->stages * (t->o->procs > 1 ? t->o->procs : 1); /* every stage's */
  double peak = t->peak.flops_per_s * (devices > 1 ? devices : 1);
  st_json_put(m, "model_flops_per_s", st__sig9(model_fps));
  st_json_put(m, "mfu", peak > 0 ? st__sig9(model_fps / peak) : json_null());
  st_json_put_int(m, "launches", es->launches);
  st_json_put(m, "wait_s", st_json_fixed(es->wait_s, 6));
  st_json_put_int(m, "peak_live_bytes", es->peak_live_bytes);
  if (t->o->nonfinite.policy != ST_NONFINITE_STOP) {
    /* diag.on_nonfinite: whether this step's update was dropped, and how
     * many steps' were so far (docs/diagnostics.md). */
    st_json_put_bool(m, "update_skipped", t->update_dropped);
    st_json_put_int(m, "skipped_steps", t->skipped_steps);
  }
  st__numerics_metrics(t, m);
  /* The blocks' metrics: a scalar's mean over layers, microbatches and
   * devices; a vector's least and largest element (docs/bundle.md, "Block metrics"). */
  for (int s = 0; s < t->n_metrics; ++s) {
    if (t->metric_reads[s] == 0) continue;
    if (t->metric_ranks[s] == 0) {
      st_json_put_num(m, t->metric_names[s], t->metric_sum[s] / (double)t->metric_reads[s]);
      continue;
    }
    char key[96];
    snprintf(key, sizeof(key), "%s_min", t->metric_names[s]);
    st_json_put_num(m, key, t->metric_min[s]);
    snprintf(key, sizeof(key), "%s_max", t->metric_names[s]);
    st_json_put_num(m, key, t->metric_max[s]);
  }
  st__sched_metrics(es, t->step_plan.devices, m);
  st__pipeline_metrics(&t->step_plan, es, st_executor_timings(t->ex), m);
  st__kernel_metrics(t, m);
  st_status s = st__job_step_metrics(t, dt, m);
  if (s) {
    json_decref(m);
    return s;
  }
  s = st__metrics_line(t, m);
  if (!s) s = st__maybe_trace(t);
  return s;
}

st_status st__eval_metrics(st__trainer* t, double eval_loss) {
  json_t* e = st_json_obj();
  st_json_put_int(e, "step", t->step + 1);
  st_json_put_num(e, "eval_loss", eval_loss);
  return st__metrics_line(t, e);
}

st_status st__compile_event(st__trainer* t, double seconds) {
  const st_bundle* bundle = t->bundle;
  st_runtime_stats rs;
  st_runtime_get_stats(t->runtime, &rs);
  /* Per program: where a cold start's seconds go (docs/performance.md). */
  json_t* per = st_json_obj();
  json_t* loaded = st_json_obj(); /* per program: loaded from the executable cache (true) or compiled */
  for (int i = 0; i < bundle->program_count; ++i)
    if (t->compiled[i]) {
      st_json_put(per, bundle->programs[i].name, st_json_fixed(t->compile_s[i], 3));
      st_json_put_bool(loaded, bundle->programs[i].name, st_program_from_cache(t->compiled[i]));
    }
  st_runtime_info ri;
  st_runtime_get_info(t->runtime, &ri);
  json_t* f = st_json_obj();
  st_json_put(f, "seconds", st_json_fixed(seconds, 3));
  st_json_put_int(f, "compiled", rs.compiles - t->compiles_before);
  st_json_put_int(f, "cache_hits", rs.cache_hits - t->cache_hits_before);
  st_json_put_int(f, "plan_ops", t->step_plan.op_count);
  st_json_put_int(f, "threads", st_runtime_compile_threads(t->runtime));
  st_json_put(f, "program_seconds", per);
  st_json_put(f, "program_from_cache", loaded);
  st_json_put_str(f, "autotune_cache_dir", ri.autotune_cache_dir);
  return st__event(t, "compile", f);
}

void st__failed_event(st__trainer* t, st_status s) {
  json_t* f = st_json_obj();
  st_json_put_str(f, "error", st_status_message(s));
  st_json_put_int(f, "exit_code", st_status_exit_code(s));
  /* The failure class, for readers that need more than the exit code:
   * `strata run` does not restart "memory" (exit 4 like "runtime"). */
  st_json_put_str(f, "class", st_code_key(st_status_code(s)));
  if (t->faults_unfired && json_array_size(t->faults_unfired) > 0)
    st_json_put(f, "faults_unfired", json_incref(t->faults_unfired));
  st_status_free(st_runlog_event(t->log, "failed", f));
}

void st__interrupted_event(st__trainer* t, st_status s) {
  /* Stopped before the step loop (an export the signal ended): the signal
   * is still the one recorded. */
  if (!t->stop_signal) t->stop_signal = st_stop_signal();
  json_t* f = st_json_obj();
  st_json_put_int(f, "signal", t->stop_signal);
  st_json_put_str(f, "signal_name", st_signal_name(t->stop_signal));
  st_json_put_int(f, "step", t->stop_step);
  if (t->stop_saved) {
    char name[40];
    snprintf(name, sizeof(name), "step_%lld", (long long)t->stop_step);
    st_json_put_str(f, "checkpoint", name);
  } else {
    st_json_put(f, "checkpoint", json_null());
  }
  st_json_put_int(f, "exit_code", st_status_exit_code(s));
  st_status_free(st_runlog_event(t->log, "interrupted", f));
}
