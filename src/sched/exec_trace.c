/* exec_trace.c — an executor's last run as Chrome trace-event JSON
 * (docs/scheduling.md, "Traces"): which op goes on which track, named how,
 * with which args; obs/trace.c writes the document. */
#include <stdio.h>
#include <stdlib.h>
#include <jansson.h>

#include "sched/sched_internal.h"
#include "strata/base.h"
#include "strata/obs.h"
#include "strata/sched.h"

/* An op's slice args: its timings and deps, and per kind its bytes. */
static json_t* st__trace_args(const st__exec_record* ex, int i, int g) {
  const st_plan* plan = ex->plan;
  const st_op* op = &plan->ops[i];
  const st_op_timing* t = &ex->timings[i];
  json_t* args = st_json_obj();
  st_json_put_int(args, "op", i);
  st_json_put_str(args, "kind", st_op_kind_name(op->kind));
  st_json_put_int(args, "layer", op->layer);
  st_json_put_int(args, "micro", op->micro);
  if (ex->stages > 1) st_json_put_int(args, "stage", op->stage);
  st_json_put(args, "issue_us", st_json_fixed(t->issue_s * 1e6, 3));
  st_json_put(args, "start_us", st_json_fixed(t->start_s * 1e6, 3));
  st_json_put(args, "complete_us", st_json_fixed(t->complete_s * 1e6, 3));
  json_t* deps = st_json_arr();
  for (int d = 0; d < op->dep_count; ++d) st_json_push(deps, st_json_int(op->deps[d]));
  st_json_put(args, "deps", deps);
  if (g == 4 || g == 5 || g == 6) {
    int64_t bytes = 0;
    for (int j = 0; j < op->input_count; ++j) bytes += (int64_t)st_tensor_type_bytes(&plan->slots[op->inputs[j]].type);
    st_json_put_int(args, "bytes", bytes);
    st_json_put_int(args, "devices", ex->ndev);
    if (g == 5) st_json_put_str(args, "collective_kind", st_collective_kind_name((st_collective_kind)op->tag));
    if (g == 6 && op->input_count > 0) st_json_put_int(args, "from_stage", plan->slots[op->inputs[0]].stage);
  }
  if (g == 1) {
    int slot = op->kind == ST_OP_H2D ? op->outputs[0] : op->inputs[0];
    st_json_put_int(args, "bytes", (int64_t)st_tensor_type_bytes(&plan->slots[slot].type));
  }
  if (op->kind == ST_OP_WAIT) st_json_put_bool(args, "blocked", t->blocked);
  if (op->kind == ST_OP_WAIT || op->kind == ST_OP_READ) st_json_put(args, "blocked_us", st_json_fixed(t->blocked_s * 1e6, 3));
  return args;
}

/* The track group of an op: 0 launches, 1 transfers, 2 host waits, 3 host
 * ops, 4 collectives, 5 cross-process, 6 pipeline sends. */
static int st__trace_group(st_op_kind kind) {
  switch (kind) {
    case ST_OP_LAUNCH:
    case ST_OP_RECOMPUTE: return 0;
    case ST_OP_H2D:
    case ST_OP_D2H: return 1;
    case ST_OP_WAIT:
    case ST_OP_READ: return 2;
    case ST_OP_HOST:
    case ST_OP_FREE: return 3;
    case ST_OP_COLLECTIVE: return 4;
    case ST_OP_XPROC: return 5; /* drawn from issue to the result's arrival */
    case ST_OP_SEND: return 6;
  }
  return 3;
}

/* The slice's name: the program, else the kind and its first slot. */
static void st__trace_name(const st_plan* plan, const st_op* op, int g, st_strbuf* name) {
  st_strbuf_reset(name);
  if (g == 0 || g == 4) {
    st_strbuf_append(name, plan->programs[op->program]);
    return;
  }
  st_strbuf_append(name, st_op_kind_name(op->kind));
  int slot = op->input_count ? op->inputs[0] : op->output_count ? op->outputs[0] : -1;
  if (op->kind == ST_OP_H2D || op->kind == ST_OP_D2H) slot = op->kind == ST_OP_H2D ? op->outputs[0] : op->inputs[0];
  if (slot >= 0) st_strbuf_printf(name, " %s%s", plan->slots[slot].name, op->input_count > 1 ? " ..." : "");
  if (op->kind == ST_OP_SEND) st_strbuf_printf(name, " -> stage %d", op->stage);
  if (op->kind == ST_OP_WAIT && op->input_count == 0) st_strbuf_append(name, " all (step barrier)");
}

/* The live-bytes counters after op |i| (its stage's, with a pipeline). */
static void st__trace_live(st_trace* tr, const st__exec_record* ex, int i) {
  const st_op_timing* t = &ex->timings[i];
  const int64_t* l = &ex->live_acct[(size_t)i * ST_SLOT_CATEGORY_COUNT];
  json_t* live = st_json_obj();
  for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) st_json_put_int(live, st_slot_category_name((st_slot_category)k), l[k]);
  st_trace_counter(tr, "live device bytes", t->issue_s * 1e6, live);
  int64_t pred = 0;
  for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) pred += ex->live_pred[(size_t)i * ST_SLOT_CATEGORY_COUNT + (size_t)k];
  json_t* predicted = st_json_obj();
  st_json_put_int(predicted, "bytes", pred);
  st_trace_counter(tr, "predicted live device bytes", t->issue_s * 1e6, predicted);
}

/* Data parallelism or a pipeline: each device of each stage gets a compute
 * and a communication track, named by its runtime device (and stage). */
static void st__trace_dev_groups(const st__exec_record* ex, st_trace_lanes* groups, char (*names)[64]) {
  const int nd = ex->ndev;
  for (int s = 0; s < ex->stages; ++s)
    for (int d = 0; d < nd; ++d) {
      const int k = s * nd + d, dev = ex->device + k;
      if (ex->stages > 1 && nd > 1) {
        snprintf(names[2 * k], sizeof(names[0]), "stage %d device %d compute", s, dev);
        snprintf(names[2 * k + 1], sizeof(names[0]), "stage %d device %d communication", s, dev);
      } else if (ex->stages > 1) {
        snprintf(names[2 * k], sizeof(names[0]), "stage %d compute", s);
        snprintf(names[2 * k + 1], sizeof(names[0]), "stage %d communication", s);
      } else {
        snprintf(names[2 * k], sizeof(names[0]), "device %d compute", dev);
        snprintf(names[2 * k + 1], sizeof(names[0]), "device %d communication", dev);
      }
      groups[2 * k] = (st_trace_lanes){.base_tid = 10000 + 2000 * k, .name = names[2 * k]};
      groups[2 * k + 1] = (st_trace_lanes){.base_tid = 11000 + 2000 * k, .name = names[2 * k + 1]};
    }
}

static void st__trace_meta(st_trace* tr, const st__exec_record* ex, int64_t step) {
  const st_plan* plan = ex->plan;
  const st_executor_stats* s = ex->stats;
  st_trace_meta(tr, "step", st_json_int(step));
  st_trace_meta(tr, "policy", plan->policy ? st_json_str(plan->policy) : json_null());
  st_trace_meta(tr, "time_origin", st_json_str("the start of the step, in microseconds"));
  st_trace_meta(tr, "op_count", st_json_int(plan->op_count));
  st_trace_meta(tr, "predicted_peak_bytes", st_json_int(s->predicted_peak_bytes));
  st_trace_meta(tr, "peak_live_bytes", st_json_int(s->peak_live_bytes));
  st_trace_meta(tr, "host_memory", st_json_str(ex->host_kind));
  if (ex->ndev > 1 || ex->stages > 1) {
    json_t* devs = st_json_arr();
    for (int d = 0; d < ex->ndev * ex->stages; ++d) st_json_push(devs, st_json_int(ex->device + d));
    st_trace_meta(tr, "devices", devs);
  }
  if (ex->stages > 1) {
    st_trace_meta(tr, "stages", st_json_int(ex->stages));
    st_trace_meta(tr, "bubble_fraction", st_json_fixed(s->bubble_fraction, 4));
  }
}

st_status st_executor_write_trace(const st_executor* executor, const char* path, int64_t step,
                                  const st_trace_spans* spans) {
  st__exec_record rec;
  st__executor_record(executor, &rec);
  const st__exec_record* ex = &rec;
  const st_plan* plan = ex->plan;
  char title[64];
  snprintf(title, sizeof(title), "strata step %lld", (long long)step);
  st_trace* tr = st_trace_new(title);
  /* tids: 1000 per group leaves room for any number of lanes */
  st_trace_lanes groups[7] = {{.base_tid = 1000, .name = "launches"},
                               {.base_tid = 2000, .name = "transfers"},
                               {.base_tid = 3000, .name = "host waits"},
                               {.base_tid = 4000, .name = "host ops"},
                               {.base_tid = 5000, .name = "collectives"},
                               {.base_tid = 7000, .name = "cross-process"},
                               {.base_tid = 8000, .name = "pipeline sends"}};
  /* Several devices: launches and collectives are drawn once per device
   * of their stage, in place of "launches" and "collectives". */
  const int nd = ex->ndev, per_dev = nd > 1 || ex->stages > 1;
  const size_t nk = (size_t)nd * (size_t)ex->stages * 2;
  st_trace_lanes* dev_groups = st_xcalloc(nk, sizeof(st_trace_lanes));
  char (*dev_names)[64] = st_xcalloc(nk, sizeof(*dev_names));
  if (per_dev) st__trace_dev_groups(ex, dev_groups, dev_names);
  st_strbuf name = {0};
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    const st_op_timing* t = &ex->timings[i];
    const int g = st__trace_group(op->kind);
    /* Device work is drawn from when it could start; host work from when
     * the host issued it. */
    double ts = (g <= 1 || g >= 4) ? t->start_s : t->issue_s;
    st__trace_name(plan, op, g, &name);
    json_t* args = st__trace_args(ex, i, g);
    const char* cat = g == 0 ? (op->kind == ST_OP_RECOMPUTE ? "recompute" : "launch")
                      : g == 1 ? "transfer" : g == 2 ? "wait" : g == 4 ? "collective" : g == 5 ? "xproc"
                      : g == 6 ? "send" : "host";
    if (per_dev && (g == 0 || g == 4)) {
      /* one slice per device, drawn from that device's own start and completion */
      const int k0 = (ex->stages > 1 ? op->stage : 0) * nd;
      for (int d = 0; d < nd; ++d) {
        size_t at = (size_t)i * (size_t)nd + (size_t)d;
        json_t* a = d + 1 < nd ? json_deep_copy(args) : args;
        st_json_put_int(a, "device", ex->device + k0 + d);
        st_json_put(a, "device_start_us", st_json_fixed(ex->dev_start[at] * 1e6, 3));
        st_json_put(a, "device_complete_us", st_json_fixed(ex->dev_complete[at] * 1e6, 3));
        int tid = st_trace_lane(tr, &dev_groups[2 * (k0 + d) + (g == 4)], ex->dev_start[at], ex->dev_complete[at]);
        st_trace_slice(tr, tid, name.data, cat, ex->dev_start[at] * 1e6, (ex->dev_complete[at] - ex->dev_start[at]) * 1e6, a);
      }
    } else {
      int tid = st_trace_lane(tr, &groups[g], ts, t->complete_s);
      st_trace_slice(tr, tid, name.data, cat, ts * 1e6, (t->complete_s - ts) * 1e6, args);
    }
    st__trace_live(tr, ex, i);
  }
  /* Spans from outside the plan (the FFI kernels' calls, inside their
   * programs' launches: the handlers timed them on the same clock,
   * docs/kernels.md). */
  st_trace_add_spans(tr, spans, 6000, ex->t0);
  st__trace_meta(tr, ex, step);
  st_strbuf_free(&name);
  for (int g = 0; g < 7; ++g) st_trace_lanes_free(&groups[g]);
  for (size_t g = 0; g < nk; ++g) st_trace_lanes_free(&dev_groups[g]);
  free(dev_groups);
  free(dev_names);
  st_status st = st_trace_write(tr, path);
  st_trace_free(tr);
  return st;
}
