/* passes.c — the policies as plan passes: the offload pass (host homes,
 * prefetch, write-back) and the wait pass (eager or deferred waits, the step
 * barrier). Each pass copies its input plan and inserts ops; none reorders
 * what the builder emitted. */
#include <stdlib.h>
#include <string.h>

#include "sched/sched_internal.h"
#include "strata/base.h"
#include "strata/sched.h"

/*===-------------------------------------------------------------------===*/
/* Offload                                                                  */
/*===-------------------------------------------------------------------===*/

/* A launch that touches offloaded units: which, and whether it writes them. */
typedef struct {
  int op;
  int count;
  int* units;
  bool* writes;
} st__use;

static void st__passes_use_add(st__use* u, int unit, bool write) {
  for (int k = 0; k < u->count; ++k) {
    if (u->units[k] == unit) {
      u->writes[k] |= write;
      return;
    }
  }
  u->units = st_xrealloc(u->units, (size_t)(u->count + 1) * sizeof(int));
  u->writes = st_xrealloc(u->writes, (size_t)(u->count + 1) * sizeof(bool));
  u->units[u->count] = unit;
  u->writes[u->count++] = write;
}

static bool st__use_has(const st__use* u, int unit) {
  for (int k = 0; k < u->count; ++k)
    if (u->units[k] == unit) return true;
  return false;
}

typedef struct {
  st_plan* out;
  const int* unit_of_slot;
  int n_slots; /* of the input plan */
  bool* resident;
  bool* dirty;
} st__offloader;

static void st__fetch(st__offloader* o, int unit, const st_op* user) {
  if (o->resident[unit]) return;
  for (int s = 0; s < o->n_slots; ++s) {
    if (o->unit_of_slot[s] != unit) continue;
    int home = o->out->slots[s].twin;
    st_plan_add(o->out, ST_OP_H2D, -1, user->layer, user->micro, 0, 1, &home, 1, &s);
  }
  o->resident[unit] = true;
  o->dirty[unit] = false;
}

static void st__release(st__offloader* o, int unit, const st_op* user) {
  int* slots = st_xrealloc(NULL, (size_t)o->n_slots * sizeof(int));
  int n = 0;
  for (int s = 0; s < o->n_slots; ++s) {
    if (o->unit_of_slot[s] != unit) continue;
    if (o->dirty[unit]) {
      int home = o->out->slots[s].twin;
      st_plan_add(o->out, ST_OP_D2H, -1, user->layer, user->micro, 0, 1, &s, 1, &home);
    }
    slots[n++] = s;
  }
  st_plan_add(o->out, ST_OP_FREE, -1, user->layer, user->micro, 0, n, slots, 0, NULL);
  free(slots);
  o->resident[unit] = false;
  o->dirty[unit] = false;
}

st_status st_plan_offload(const st_plan* in, const int* unit_of_slot, int prefetch_depth, st_plan* out) {
  st_plan_copy(in, out);
  if (prefetch_depth < 0) prefetch_depth = 0;
  int n_units = 0;
  for (int s = 0; s < in->slot_count; ++s) {
    if (unit_of_slot[s] < 0) continue;
    if (in->slots[s].host || in->slots[s].twin >= 0) {
      st_plan_deinit(out);
      return st_status_make(ST_CODE_INTERNAL, "offload: slot '%s' is already offloaded", in->slots[s].name);
    }
    if (unit_of_slot[s] + 1 > n_units) n_units = unit_of_slot[s] + 1;
  }
  if (n_units == 0) return ST_OK;
  /* Homes go after the existing slots so every slot keeps its number. */
  for (int s = 0; s < in->slot_count; ++s) {
    if (unit_of_slot[s] < 0) continue;
    char name[512];
    snprintf(name, sizeof(name), "host:%s", in->slots[s].name);
    int h = st_plan_slot(out, name, in->slots[s].category, &in->slots[s].type, true);
    out->slots[h].host = true;
    out->slots[h].stage = in->slots[s].stage;
    out->slots[h].layout = in->slots[s].layout;
    out->slots[h].logical = in->slots[s].logical;
    out->slots[h].sharding = in->slots[s].sharding;
    out->slots[h].xblocks = in->slots[s].xblocks;
    out->slots[h].xwhole = in->slots[s].xwhole;
    out->slots[h].twin = s;
    out->slots[s].twin = h;
    out->slots[s].persistent = false;
  }
  /* Which launches use which units, in plan order. */
  st__use* uses = st_xcalloc((size_t)in->op_count + 1, sizeof(st__use));
  int n_uses = 0;
  st_status status = ST_OK;
  for (int i = 0; i < in->op_count && !status; ++i) {
    const st_op* op = &in->ops[i];
    st__use u = {.op = i};
    for (int j = 0; j < op->input_count; ++j)
      if (unit_of_slot[op->inputs[j]] >= 0) st__passes_use_add(&u, unit_of_slot[op->inputs[j]], false);
    for (int j = 0; j < op->output_count; ++j)
      if (unit_of_slot[op->outputs[j]] >= 0) st__passes_use_add(&u, unit_of_slot[op->outputs[j]], true);
    if (u.count == 0) continue;
    if (op->kind != ST_OP_LAUNCH && op->kind != ST_OP_RECOMPUTE) {
      int slot = -1;
      for (int j = 0; j < op->input_count && slot < 0; ++j)
        if (unit_of_slot[op->inputs[j]] >= 0) slot = op->inputs[j];
      for (int j = 0; j < op->output_count && slot < 0; ++j)
        if (unit_of_slot[op->outputs[j]] >= 0) slot = op->outputs[j];
      status = st_status_make(ST_CODE_INTERNAL, "offload: plan op %d (%s) touches offloaded slot '%s'; only launches may", i,
                              st_op_kind_name(op->kind), in->slots[slot].name);
    }
    uses[n_uses++] = u;
  }
  st__offloader o = {out, unit_of_slot, in->slot_count, st_xcalloc((size_t)n_units, sizeof(bool)),
                     st_xcalloc((size_t)n_units, sizeof(bool))};
  if (!status) {
    /* Rebuild the op list with transfers woven in. */
    st_op* ops = out->ops;
    int op_count = out->op_count;
    out->ops = NULL;
    out->op_count = 0;
    int j = 0;
    for (int i = 0; i < op_count; ++i) {
      const st_op* op = &ops[i];
      bool is_use = j < n_uses && uses[j].op == i;
      if (is_use) {
        for (int t = j; t < n_uses && t <= j + prefetch_depth; ++t)
          for (int k = 0; k < uses[t].count; ++k) st__fetch(&o, uses[t].units[k], &ops[uses[t].op]);
      }
      st_plan_add(out, op->kind, op->program, op->layer, op->micro, op->tag, op->input_count, op->inputs,
                  op->output_count, op->outputs)->task = op->task;
      if (!is_use) continue;
      for (int k = 0; k < uses[j].count; ++k) {
        int unit = uses[j].units[k];
        if (uses[j].writes[k]) o.dirty[unit] = true;
        /* Keep it when a launch inside the prefetch window needs it again:
         * releasing would only fetch it straight back. */
        int next = -1;
        for (int t = j + 1; t < n_uses && next < 0; ++t)
          if (st__use_has(&uses[t], unit)) next = t;
        if (next < 0 || next > j + 1 + prefetch_depth) st__release(&o, unit, op);
      }
      ++j;
    }
    for (int i = 0; i < op_count; ++i) {
      free(ops[i].inputs);
      free(ops[i].outputs);
      free(ops[i].deps);
    }
    free(ops);
  }
  for (int i = 0; i < n_uses; ++i) {
    free(uses[i].units);
    free(uses[i].writes);
  }
  free(uses);
  free(o.resident);
  free(o.dirty);
  if (status) st_plan_deinit(out);
  return status;
}

/*===-------------------------------------------------------------------===*/
/* Waits                                                                    */
/*===-------------------------------------------------------------------===*/

void st_plan_add_waits(const st_plan* in, bool eager, st_plan* out) {
  st_plan_copy(in, out);
  st_op* ops = out->ops;
  int op_count = out->op_count;
  out->ops = NULL;
  out->op_count = 0;
  for (int i = 0; i < op_count; ++i) {
    const st_op* op = &ops[i];
    /* The host is about to consume a value: wait for its producer first,
     * so the wait (the unhidden part) and the copy are timed apart. */
    if (op->kind == ST_OP_READ) st_plan_add(out, ST_OP_WAIT, -1, op->layer, op->micro, 0, op->input_count, op->inputs, 0, NULL);
    st_plan_add(out, op->kind, op->program, op->layer, op->micro, op->tag, op->input_count, op->inputs, op->output_count,
                op->outputs)->task = op->task;
    if (eager && st__op_is_async(op->kind))
      st_plan_add(out, ST_OP_WAIT, -1, op->layer, op->micro, 0, op->output_count, op->outputs, 0, NULL);
  }
  st_plan_add(out, ST_OP_WAIT, -1, -1, -1, 0, 0, NULL, 0, NULL);
  for (int i = 0; i < op_count; ++i) {
    free(ops[i].inputs);
    free(ops[i].outputs);
    free(ops[i].deps);
  }
  free(ops);
}
