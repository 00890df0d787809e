/* watch.c — the trainer's diagnostics beside the step: the hang watchdog
 * fed by the executors' monitors (every op per device), the compile and
 * the step; the faults.hang_in drill inside a launch; loss spikes
 * (docs/diagnostics.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/diag.h"
#include "strata/obs.h"
#include "train/train_internal.h"

struct st__watch_ex {
  st__trainer* t;
  const st_plan* plan;
  const char* label; /* "step" | "eval" */
  int key_base;
  int ndev;
  int device; /* runtime device of index 0 */
  int* handles; /* [op_count * ndev]: the watchdog's handle of each issued part; -1: none */
};

/* The runtime device of |o|'s part on device index |index|: its pipeline
 * stage's (stage s's index d is device s * ndev + d from the first). */
static int st__watch_device(const st__watch_ex* w, const st_op* o, int index) {
  return w->device + (w->plan->stages > 1 ? o->stage : 0) * w->ndev + index;
}

static void st__mon_issue(void* user, int op, int index) {
  st__watch_ex* w = user;
  const st_op* o = &w->plan->ops[op];
  bool program = o->kind == ST_OP_LAUNCH || o->kind == ST_OP_RECOMPUTE || o->kind == ST_OP_COLLECTIVE;
  const char* name = program ? w->plan->programs[o->program] : st_op_kind_name(o->kind);
  int64_t step = w->t->step + 1;
  if (w->t->watchdog) {
    st_watch_item it = {.phase = ST_WATCH_OP,
                        .key = w->key_base + op,
                        .name = name,
                        .plan = w->label,
                        .kind = st_op_kind_name(o->kind),
                        .op = op,
                        .layer = o->layer,
                        .micro = o->micro,
                        .device = st__watch_device(w, o, index),
                        .step = step};
    w->handles[(size_t)op * (size_t)w->ndev + (size_t)index] = st_watchdog_begin(w->t->watchdog, &it);
  }
  if (o->kind == ST_OP_LAUNCH || o->kind == ST_OP_RECOMPUTE)
    st_faults_in_launch(st_train_ckpt_faults(w->t->ckpt), name, step, o->layer, o->micro, st__watch_device(w, o, index));
}

static void st__mon_done(void* user, int op, int index) {
  st__watch_ex* w = user;
  int* h = &w->handles[(size_t)op * (size_t)w->ndev + (size_t)index];
  st_watchdog_end(w->t->watchdog, *h);
  *h = -1;
}

st__watch_ex* st__watch_executor(st__trainer* t, st_executor* ex, const st_plan* plan, const char* label) {
  st__watch_ex* w = st_xcalloc(1, sizeof(*w));
  w->t = t;
  w->plan = plan;
  w->label = label;
  w->ndev = st_executor_devices(ex);
  w->device = 0;
  w->key_base = t->watchdog ? st_watchdog_keys(t->watchdog, plan->op_count) : 0;
  size_t n = (size_t)plan->op_count * (size_t)w->ndev + 1;
  w->handles = st_xmalloc(n * sizeof(int));
  for (size_t i = 0; i < n; ++i) w->handles[i] = -1;
  st_executor_monitor m = {w, st__mon_issue, st__mon_done};
  st_executor_set_monitor(ex, &m);
  return w;
}

void st__watch_settle(st__watch_ex* w) {
  if (!w) return;
  size_t n = (size_t)w->plan->op_count * (size_t)w->ndev;
  for (size_t i = 0; i < n; ++i) {
    if (w->handles[i] < 0) continue;
    st_watchdog_end(w->t->watchdog, w->handles[i]);
    w->handles[i] = -1;
  }
}

void st__watch_ex_free(st__watch_ex* w) {
  if (!w) return;
  free(w->handles);
  free(w);
}

st_status st__watch_start(st__trainer* t) {
  const st_plan_options* o = t->o;
  t->watch_step_handle = -1;
  t->watch_compile_key = -1;
  t->watch_step_key = -1;
  if (o->spike.z > 0) {
    int64_t win = o->spike.window;
    t->spike = st_spike_create((int)win, (int)(win < 10 ? win : 10));
  }
  if (!(o->hang.timeout_s > 0)) return ST_OK;
  st_watchdog_options wo = {.timeout_s = o->hang.timeout_s,
                            .factor = o->hang.factor,
                            .floor_s = o->hang.floor_s,
                            .compile_s = o->hang.compile_s,
                            .run_dir = t->run_dir,
                            .log = t->log,
                            .dist = t->dist};
  ST_RETURN(st_watchdog_create(&wo, &t->watchdog));
  t->watch_compile_key = st_watchdog_keys(t->watchdog, 1);
  t->watch_step_key = st_watchdog_keys(t->watchdog, 1);
  return ST_OK;
}

void st__watch_stop(st__trainer* t) {
  st_watchdog_end(t->watchdog, t->watch_step_handle);
  t->watch_step_handle = -1;
  st_watchdog_destroy(t->watchdog);
  t->watchdog = NULL;
  st__watch_ex_free(t->watch_step);
  st__watch_ex_free(t->watch_eval);
  t->watch_step = t->watch_eval = NULL;
  st_spike_destroy(t->spike);
  t->spike = NULL;
}

int st__watch_compile_begin(st__trainer* t, int programs) {
  if (!t->watchdog) return -1;
  char name[64];
  snprintf(name, sizeof(name), "%d programs", programs);
  st_watch_item it = {.phase = ST_WATCH_COMPILE, .key = t->watch_compile_key, .name = name, .op = -1, .layer = -1, .micro = -1, .device = -1};
  return st_watchdog_begin(t->watchdog, &it);
}

void st__watch_step_begin(st__trainer* t) {
  if (!t->watchdog) return;
  st_watchdog_end(t->watchdog, t->watch_step_handle);
  char name[48];
  snprintf(name, sizeof(name), "step_%lld", (long long)t->step + 1);
  st_watch_item it = {.phase = ST_WATCH_STEP, .key = t->watch_step_key, .name = name, .op = -1, .layer = -1, .micro = -1,
                      .device = -1, .step = t->step + 1};
  t->watch_step_handle = st_watchdog_begin(t->watchdog, &it);
}

void st__watch_step_end(st__trainer* t) {
  st_watchdog_end(t->watchdog, t->watch_step_handle);
  t->watch_step_handle = -1;
}

st_status st__check_hang_in(const st__trainer* t) {
  const char* v = t->o->faults.hang_in;
  if (!v || !v[0]) return ST_OK;
  char prog[128];
  snprintf(prog, sizeof(prog), "%s", v);
  char* colon = strrchr(prog, ':');
  if (colon) {
    char* end = NULL;
    long long step = strtoll(colon + 1, &end, 10);
    if (!colon[1] || *end || step < 1)
      return st_status_make(ST_CODE_CONFIG, "faults.hang_in=%s: the part after ':' must be a step (1-based), e.g. %.*s:3", v,
                            (int)(colon - prog), prog);
    *colon = '\0';
  }
  const st_plan* plans[2] = {&t->step_plan, &t->eval_plan};
  for (int p = 0; p < 2; ++p)
    for (int i = 0; i < plans[p]->op_count; ++i) {
      const st_op* op = &plans[p]->ops[i];
      if ((op->kind == ST_OP_LAUNCH || op->kind == ST_OP_RECOMPUTE) && !strcmp(plans[p]->programs[op->program], prog))
        return ST_OK;
    }
  st_strbuf names = {0};
  for (int i = 0; i < t->step_plan.program_count; ++i)
    st_strbuf_printf(&names, "%s%s", i ? ", " : "", t->step_plan.programs[i]);
  st_status s = st_status_make(ST_CODE_CONFIG, "faults.hang_in=%s: no plan launches a program '%s'; the step plan's programs: %s",
                               v, prog, st_strbuf_cstr(&names));
  st_strbuf_free(&names);
  return s;
}

st_status st__loss_spike(st__trainer* t, double loss) {
  if (!t->spike) return ST_OK;
  st_spike_result r;
  if (!st_spike_push(t->spike, loss, t->o->spike.z, &r)) return ST_OK;
  const int64_t step = t->step + 1;
  const uint64_t first = (uint64_t)(t->step * t->o->batch_size);
  json_t* f = st_json_obj();
  st_json_put_int(f, "step", step);
  st_json_put_num(f, "loss", loss);
  st_json_put_num(f, "z", r.z);
  st_json_put_num(f, "mean", r.mean);
  st_json_put_num(f, "std", r.std);
  st_json_put_int(f, "window", r.count);
  st_json_put_num(f, "threshold", t->o->spike.z);
  /* The batch: sequences first..first+batch_size-1 of the training
   * stream's sampler (the indices st_dataset_fill took). */
  json_t* samples = st_json_obj();
  st_json_put_str(samples, "stream", "train");
  st_json_put_int(samples, "first", (int64_t)first);
  st_json_put_int(samples, "count", t->o->batch_size);
  json_t* idx = st_json_arr();
  for (int64_t i = 0; i < t->o->batch_size; ++i) json_array_append_new(idx, json_integer((json_int_t)(first + (uint64_t)i)));
  st_json_put(samples, "indices", idx);
  st_json_put(f, "samples", samples);
  /* Below the progress line, not into it. */
  st_progress_end(t->o->progress == 1 || (t->o->progress == 2 && isatty(2)));
  fprintf(stderr, "strata: loss spike at step %lld: loss %.4f is %.1f standard deviations above the mean %.4f of the last %d steps\n",
          (long long)step, loss, r.z, r.mean, r.count);
  return st__event(t, "loss_spike", f);
}
