/* metrics.c — what a run writes about itself: the metrics line of every
 * step and evaluation (metrics.jsonl, the contract in docs/observability.md)
 * and the events of the lifecycle (events.jsonl). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "strata/base.h"
#include "strata/diag.h"
#include "strata/obs.h"
#include "train/train_internal.h"

st_status st__event(st__trainer* t, const char* name, const char* fmt, ...) {
  char buf[16384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return st_runlog_event(t->log, name, buf);
}

/* The scheduler's accounting of one step (docs/scheduling.md), appended to
 * the metrics line after the contract fields. */
static void st__sched_metrics(const st_executor_stats* es, st_strbuf* m) {
  st_strbuf_printf(m,
                   ", \"recomputes\": %lld, \"recompute_s\": %.6f, \"waits\": %lld, \"waits_blocked\": %lld, "
                   "\"h2d_bytes\": %lld, \"d2h_bytes\": %lld, \"transfer_s\": %.6f, \"overlap_ratio\": ",
                   (long long)es->recomputes, es->recompute_s, (long long)es->waits, (long long)es->waits_blocked,
                   (long long)es->h2d_bytes, (long long)es->d2h_bytes, es->transfer_s);
  if (es->transfer_s > 0)
    st_strbuf_printf(m, "%.4f", es->transfer_hidden_s / es->transfer_s);
  else
    st_strbuf_append(m, "null");
  st_strbuf_printf(m, ", \"max_inflight\": %d, \"peak_live_bytes_predicted\": %lld, \"peak_live_by_category\": {",
                   es->max_inflight, (long long)es->predicted_peak_bytes);
  for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k)
    st_strbuf_printf(m, "%s\"%s\": %lld", k ? ", " : "", st_slot_category_name((st_slot_category)k),
                     (long long)es->peak_by_category[k]);
  st_strbuf_printf(m, "}, \"host_bytes\": %lld, \"live_mismatch_op\": %d", (long long)es->host_bytes,
                   es->live_mismatch_op);
}

/* trace.steps: the step just run as Chrome trace-event JSON under <run>/trace/. */
static st_status st__maybe_trace(st__trainer* t) {
  int64_t step = t->step + 1;
  bool want = false;
  for (int i = 0; i < t->o->trace_step_count; ++i) want |= t->o->trace_steps[i] == step;
  if (!want) return ST_OK;
  char* dir = st_path_join(t->run_dir, "trace");
  st_status s = st_fs_mkdirs(dir);
  char file[64];
  snprintf(file, sizeof(file), "step_%lld.json", (long long)step);
  char* path = st_path_join(dir, file);
  if (!s) s = st_executor_write_trace(t->ex, path, step);
  if (!s) s = st__event(t, "trace", "\"step\": %lld, \"path\": \"%s\"", (long long)step, path);
  free(path);
  free(dir);
  return s;
}

st_status st__plan_event(st__trainer* t) {
  const st_plan* p = &t->step_plan;
  int counts[8] = {0};
  for (int i = 0; i < p->op_count; ++i) counts[p->ops[i].kind]++;
  st_strbuf e = {0};
  st_strbuf_append(&e, "\"policy\": ");
  st_strbuf_json_string(&e, p->policy ? p->policy : "");
  st_strbuf_printf(&e, ", \"ops\": %d, \"op_counts\": {", p->op_count);
  for (int k = 0; k < 8; ++k) st_strbuf_printf(&e, "%s\"%s\": %d", k ? ", " : "", st_op_kind_name((st_op_kind)k), counts[k]);
  st_strbuf_printf(&e, "}, \"predicted_peak_bytes\": %lld, \"host_bytes\": %lld, \"host_memory\": \"%s\"",
                   (long long)st_plan_predict_live(p, NULL, NULL), (long long)st_plan_host_bytes(p),
                   st_executor_host_memory(t->ex));
  st_status s = st_runlog_event(t->log, "plan", e.data);
  st_strbuf_free(&e);
  return s;
}

st_status st__step_metrics(st__trainer* t, double loss, double dt) {
  int64_t tokens = t->o->batch_size * t->T;
  const st_executor_stats* es = st_executor_stats_get(t->ex);
  st_strbuf m = {0};
  st_strbuf_printf(&m, "{\"step\": %lld, \"loss\": ", (long long)t->step + 1);
  st_strbuf_json_number(&m, loss);
  st_strbuf_append(&m, ", \"lr\": ");
  st_strbuf_json_number(&m, t->lr);
  st_strbuf_append(&m, ", \"grad_norm\": ");
  st_strbuf_json_number(&m, t->grad_norm);
  st_strbuf_printf(&m, ", \"tokens\": %lld, \"step_time_s\": %.6f, \"tokens_per_s\": %.1f, \"launches\": %lld, "
                       "\"wait_s\": %.6f, \"peak_live_bytes\": %lld",
                   (long long)tokens, dt, (double)tokens / dt, (long long)es->launches, es->wait_s,
                   (long long)es->peak_live_bytes);
  st__sched_metrics(es, &m);
  st_strbuf_append(&m, "}");
  st_status s = st_runlog_metrics(t->log, m.data);
  if (!s) s = st__maybe_trace(t);
  st_strbuf_free(&m);
  return s;
}

st_status st__eval_metrics(st__trainer* t, double eval_loss) {
  st_strbuf e = {0};
  st_strbuf_printf(&e, "{\"step\": %lld, \"eval_loss\": ", (long long)t->step + 1);
  st_strbuf_json_number(&e, eval_loss);
  st_strbuf_append(&e, "}");
  st_status s = st_runlog_metrics(t->log, e.data);
  st_strbuf_free(&e);
  return s;
}

st_status st__compile_event(st__trainer* t, double seconds) {
  const st_bundle* bundle = t->bundle;
  st_runtime_stats rs;
  st_runtime_get_stats(t->runtime, &rs);
  /* Per program: where a cold start's seconds go (docs/performance.md). */
  st_strbuf per = {0};
  for (int i = 0; i < bundle->program_count; ++i) {
    if (!t->compiled[i]) continue;
    st_strbuf_printf(&per, "%s\"%s\": %.3f", per.len ? ", " : "", bundle->programs[i].name, t->compile_s[i]);
  }
  st_status s = st__event(t, "compile",
                          "\"seconds\": %.3f, \"compiled\": %lld, \"cache_hits\": %lld, \"plan_ops\": %d, \"threads\": %d, "
                          "\"program_seconds\": {%s}",
                          seconds, (long long)rs.compiles, (long long)rs.cache_hits, t->step_plan.op_count,
                          st_runtime_compile_threads(t->runtime), per.data ? per.data : "");
  st_strbuf_free(&per);
  return s;
}

void st__failed_event(st__trainer* t, st_status s) {
  st_strbuf e = {0};
  st_strbuf_append(&e, "\"error\": ");
  st_strbuf_json_string(&e, st_status_message(s));
  st_strbuf_printf(&e, ", \"exit_code\": %d", st_status_exit_code(s));
  st_status_free(st_runlog_event(t->log, "failed", e.data));
  st_strbuf_free(&e);
}

void st__interrupted_event(st__trainer* t, st_status s) {
  st_strbuf e = {0};
  st_strbuf_printf(&e, "\"signal\": %d, \"signal_name\": ", t->stop_signal);
  st_strbuf_json_string(&e, st_signal_name(t->stop_signal));
  st_strbuf_printf(&e, ", \"step\": %lld, \"checkpoint\": ", (long long)t->stop_step);
  if (t->stop_saved) {
    char name[40];
    snprintf(name, sizeof(name), "step_%lld", (long long)t->stop_step);
    st_strbuf_json_string(&e, name);
  } else {
    st_strbuf_append(&e, "null");
  }
  st_strbuf_printf(&e, ", \"exit_code\": %d", st_status_exit_code(s));
  st_status_free(st_runlog_event(t->log, "interrupted", e.data));
  st_strbuf_free(&e);
}
