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
  st_trace_lanes groups[6] = {{.base_tid = 1000, .name = "launches"},
                               {.base_tid = 2000, .name = "transfers"},
                               {.base_tid = 3000, .name = "host waits"},
                               {.base_tid = 4000, .name = "host ops"},
                               {.base_tid = 5000, .name = "collectives"},
                               {.base_tid = 7000, .name = "cross-process"}};
  /* Data parallelism: launches and collectives run on every device, so each
   * device gets a compute track and a communication track of its own,
   * named by its runtime device, in place of "launches" and "collectives". */
  const int nd = ex->ndev;
  st_trace_lanes* dev_groups = st_xcalloc((size_t)nd * 2, sizeof(st_trace_lanes));
  char (*dev_names)[48] = st_xcalloc((size_t)nd * 2, sizeof(*dev_names));
  for (int d = 0; d < nd && nd > 1; ++d) {
    snprintf(dev_names[2 * d], sizeof(dev_names[0]), "device %d compute", ex->device + d);
    snprintf(dev_names[2 * d + 1], sizeof(dev_names[0]), "device %d communication", ex->device + d);
    dev_groups[2 * d] = (st_trace_lanes){.base_tid = 10000 + 2000 * d, .name = dev_names[2 * d]};
    dev_groups[2 * d + 1] = (st_trace_lanes){.base_tid = 11000 + 2000 * d, .name = dev_names[2 * d + 1]};
  }
  st_strbuf name = {0};
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    const st_op_timing* t = &ex->timings[i];
    int g = 3;
    switch (op->kind) {
      case ST_OP_LAUNCH:
      case ST_OP_RECOMPUTE: g = 0; break;
      case ST_OP_H2D:
      case ST_OP_D2H: g = 1; break;
      case ST_OP_WAIT:
      case ST_OP_READ: g = 2; break;
      case ST_OP_HOST:
      case ST_OP_FREE: g = 3; break;
      case ST_OP_COLLECTIVE: g = 4; break;
      case ST_OP_XPROC: g = 5; break; /* drawn from issue to the result's arrival */
      case ST_OP_SEND: g = 1; break;
    }
    /* Device work is drawn from when it could start; host work from when
     * the host issued it. */
    double ts = (g <= 1 || g >= 4) ? t->start_s : t->issue_s;
    st_strbuf_reset(&name);
    if (g == 0 || g == 4) {
      st_strbuf_append(&name, plan->programs[op->program]);
    } else {
      st_strbuf_append(&name, st_op_kind_name(op->kind));
      int slot = op->input_count ? op->inputs[0] : op->output_count ? op->outputs[0] : -1;
      if (op->kind == ST_OP_H2D || op->kind == ST_OP_D2H) slot = op->kind == ST_OP_H2D ? op->outputs[0] : op->inputs[0];
      if (slot >= 0) st_strbuf_printf(&name, " %s%s", plan->slots[slot].name, op->input_count > 1 ? " ..." : "");
      if (op->kind == ST_OP_WAIT && op->input_count == 0) st_strbuf_append(&name, " all (step barrier)");
    }
    json_t* args = st_json_obj();
    st_json_put_int(args, "op", i);
    st_json_put_str(args, "kind", st_op_kind_name(op->kind));
    st_json_put_int(args, "layer", op->layer);
    st_json_put_int(args, "micro", op->micro);
    st_json_put(args, "issue_us", st_json_fixed(t->issue_s * 1e6, 3));
    st_json_put(args, "start_us", st_json_fixed(t->start_s * 1e6, 3));
    st_json_put(args, "complete_us", st_json_fixed(t->complete_s * 1e6, 3));
    json_t* deps = st_json_arr();
    for (int d = 0; d < op->dep_count; ++d) st_json_push(deps, st_json_int(op->deps[d]));
    st_json_put(args, "deps", deps);
    if (g == 4 || g == 5) {
      int64_t bytes = 0;
      for (int j = 0; j < op->input_count; ++j) bytes += (int64_t)st_tensor_type_bytes(&plan->slots[op->inputs[j]].type);
      st_json_put_int(args, "bytes", bytes);
      st_json_put_int(args, "devices", ex->ndev);
      if (g == 5) st_json_put_str(args, "collective_kind", st_collective_kind_name((st_collective_kind)op->tag));
    }
    if (g == 1) {
      int slot = op->kind == ST_OP_H2D ? op->outputs[0] : op->inputs[0];
      st_json_put_int(args, "bytes", (int64_t)st_tensor_type_bytes(&plan->slots[slot].type));
    }
    if (op->kind == ST_OP_WAIT) st_json_put_bool(args, "blocked", t->blocked);
    if (op->kind == ST_OP_WAIT || op->kind == ST_OP_READ) st_json_put(args, "blocked_us", st_json_fixed(t->blocked_s * 1e6, 3));
    const char* cat = g == 0 ? (op->kind == ST_OP_RECOMPUTE ? "recompute" : "launch")
                             : g == 1 ? "transfer" : g == 2 ? "wait" : g == 4 ? "collective" : g == 5 ? "xproc" : "host";
    if (nd > 1 && (g == 0 || g == 4)) {
      /* one slice per device, drawn from that device's own start and completion */
      for (int d = 0; d < nd; ++d) {
        size_t at = (size_t)i * (size_t)nd + (size_t)d;
        json_t* a = d + 1 < nd ? json_deep_copy(args) : args;
        st_json_put_int(a, "device", ex->device + d);
        st_json_put(a, "device_start_us", st_json_fixed(ex->dev_start[at] * 1e6, 3));
        st_json_put(a, "device_complete_us", st_json_fixed(ex->dev_complete[at] * 1e6, 3));
        int tid = st_trace_lane(tr, &dev_groups[2 * d + (g == 4)], ex->dev_start[at], ex->dev_complete[at]);
        st_trace_slice(tr, tid, name.data, cat, ex->dev_start[at] * 1e6, (ex->dev_complete[at] - ex->dev_start[at]) * 1e6, a);
      }
    } else {
      int tid = st_trace_lane(tr, &groups[g], ts, t->complete_s);
      st_trace_slice(tr, tid, name.data, cat, ts * 1e6, (t->complete_s - ts) * 1e6, args);
    }
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
  /* Spans from outside the plan (the FFI kernels' calls, inside their
   * programs' launches: the handlers timed them on the same clock,
   * docs/kernels.md). */
  st_trace_add_spans(tr, spans, 6000, ex->t0);
  const st_executor_stats* s = ex->stats;
  st_trace_meta(tr, "step", st_json_int(step));
  st_trace_meta(tr, "policy", plan->policy ? st_json_str(plan->policy) : json_null());
  st_trace_meta(tr, "time_origin", st_json_str("the start of the step, in microseconds"));
  st_trace_meta(tr, "op_count", st_json_int(plan->op_count));
  st_trace_meta(tr, "predicted_peak_bytes", st_json_int(s->predicted_peak_bytes));
  st_trace_meta(tr, "peak_live_bytes", st_json_int(s->peak_live_bytes));
  st_trace_meta(tr, "host_memory", st_json_str(ex->host_kind));
  if (nd > 1) {
    json_t* devs = st_json_arr();
    for (int d = 0; d < nd; ++d) st_json_push(devs, st_json_int(ex->device + d));
    st_trace_meta(tr, "devices", devs);
  }
  st_strbuf_free(&name);
  for (int g = 0; g < 6; ++g) st_trace_lanes_free(&groups[g]);
  for (int g = 0; g < 2 * nd; ++g) st_trace_lanes_free(&dev_groups[g]);
  free(dev_groups);
  free(dev_names);
  st_status st = st_trace_write(tr, path);
  st_trace_free(tr);
  return st;
}
