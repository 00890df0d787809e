/* plan.c — the plan IR: slots, interned program names, ops, dependencies,
 * validation, liveness prediction and printing. */
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "sched/sched_internal.h"
#include "strata/base.h"
#include "strata/sched.h"

const char* st_slot_category_name(st_slot_category c) {
  switch (c) {
    case ST_SLOT_PARAM: return "params";
    case ST_SLOT_GRAD: return "grads";
    case ST_SLOT_OPT: return "optimizer";
    case ST_SLOT_ACT: return "activations";
    case ST_SLOT_XFER: return "transfer";
    case ST_SLOT_GATHERED: return "gathered";
    case ST_SLOT_UNREDUCED: return "unreduced";
    case ST_SLOT_CATEGORY_COUNT: break;
  }
  return "?";
}

const char* st_op_kind_name(st_op_kind k) {
  switch (k) {
    case ST_OP_LAUNCH: return "LAUNCH";
    case ST_OP_H2D: return "H2D";
    case ST_OP_READ: return "READ";
    case ST_OP_HOST: return "HOST";
    case ST_OP_FREE: return "FREE";
    case ST_OP_D2H: return "D2H";
    case ST_OP_WAIT: return "WAIT";
    case ST_OP_RECOMPUTE: return "RECOMPUTE";
    case ST_OP_COLLECTIVE: return "COLLECTIVE";
    case ST_OP_XPROC: return "XPROC";
    case ST_OP_SEND: return "SEND";
  }
  return "?";
}

const char* st_collective_kind_name(st_collective_kind k) {
  switch (k) {
    case ST_COLL_ALL_REDUCE: return "all_reduce";
    case ST_COLL_ALL_GATHER: return "all_gather";
    case ST_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case ST_COLL_OTHER:
    case ST_COLL_KIND_COUNT: break;
  }
  return "other";
}

const char* st_slot_layout_name(st_slot_layout l) {
  switch (l) {
    case ST_LAYOUT_REPLICATED: return "replicated";
    case ST_LAYOUT_SPLIT: return "split";
    case ST_LAYOUT_PARTIAL: return "partial";
    case ST_LAYOUT_SHARDED: return "sharded";
  }
  return "?";
}

/* Program ops: those whose |program| names one of the plan's programs. */
static bool st__op_has_program(st_op_kind k) {
  return k == ST_OP_LAUNCH || k == ST_OP_RECOMPUTE || k == ST_OP_COLLECTIVE;
}

void st_plan_init(st_plan* plan) {
  memset(plan, 0, sizeof(*plan));
  plan->devices = 1;
  plan->mesh[0] = plan->mesh[1] = plan->mesh[2] = 1;
  plan->stages = 1;
}

void st_plan_deinit(st_plan* plan) {
  for (int i = 0; i < plan->slot_count; ++i) free(plan->slots[i].name);
  free(plan->slots);
  for (int i = 0; i < plan->op_count; ++i) {
    free(plan->ops[i].inputs);
    free(plan->ops[i].outputs);
    free(plan->ops[i].deps);
  }
  free(plan->ops);
  for (int i = 0; i < plan->program_count; ++i) free(plan->programs[i]);
  free(plan->programs);
  free(plan->policy);
  free(plan->program_temps);
  free(plan->program_stage);
  free(plan->pipe_tasks);
  free(plan->pipe_first);
  st_plan_init(plan);
}

static char* st__xstrdup(const char* s) {
  size_t n = strlen(s) + 1;
  return memcpy(st_xrealloc(NULL, n), s, n);
}

int st_plan_slot_find(const st_plan* plan, const char* name) {
  for (int i = 0; i < plan->slot_count; ++i)
    if (!strcmp(plan->slots[i].name, name)) return i;
  return -1;
}

int st_plan_slot(st_plan* plan, const char* name, st_slot_category category, const st_tensor_type* type, bool persistent) {
  int found = st_plan_slot_find(plan, name);
  if (found >= 0) return found;
  plan->slots = st_xrealloc(plan->slots, (size_t)(plan->slot_count + 1) * sizeof(st_slot));
  st_slot* s = &plan->slots[plan->slot_count];
  memset(s, 0, sizeof(*s));
  s->name = st__xstrdup(name);
  s->category = category;
  s->type = *type;
  s->persistent = persistent;
  s->twin = -1;
  return plan->slot_count++;
}

int st_plan_program_stage(const st_plan* plan, int i) {
  return plan->program_stage && i >= 0 && i < plan->program_count ? plan->program_stage[i] : 0;
}

int st_plan_program_at(st_plan* plan, const char* name, int stage) {
  for (int i = 0; i < plan->program_count; ++i)
    if (!strcmp(plan->programs[i], name) && st_plan_program_stage(plan, i) == stage) return i;
  plan->programs = st_xrealloc(plan->programs, (size_t)(plan->program_count + 1) * sizeof(char*));
  plan->programs[plan->program_count] = st__xstrdup(name);
  /* The stages array only once some program is not stage 0's. */
  if (stage != 0 && !plan->program_stage) plan->program_stage = st_xcalloc((size_t)plan->program_count + 1, sizeof(int));
  if (plan->program_stage) {
    plan->program_stage = st_xrealloc(plan->program_stage, (size_t)(plan->program_count + 1) * sizeof(int));
    plan->program_stage[plan->program_count] = stage;
  }
  if (plan->program_temps) { /* a program added after the temporaries were set: none known */
    plan->program_temps = st_xrealloc(plan->program_temps, (size_t)(plan->program_count + 2) * sizeof(int64_t));
    plan->program_temps[plan->program_count] = 0;
  }
  return plan->program_count++;
}

int st_plan_program(st_plan* plan, const char* name) { return st_plan_program_at(plan, name, 0); }

static int* st__ints(const int* v, int n) {
  int* p = st_xrealloc(NULL, (size_t)n * sizeof(int));
  if (n) memcpy(p, v, (size_t)n * sizeof(int));
  return p;
}

st_op* st_plan_add(st_plan* plan, st_op_kind kind, int program, int layer, int micro, int tag, int input_count,
                   const int* inputs, int output_count, const int* outputs) {
  plan->ops = st_xrealloc(plan->ops, (size_t)(plan->op_count + 1) * sizeof(st_op));
  st_op* op = &plan->ops[plan->op_count++];
  memset(op, 0, sizeof(*op));
  op->kind = kind;
  op->program = program;
  op->layer = layer;
  op->micro = micro;
  op->tag = tag;
  op->input_count = input_count;
  op->inputs = st__ints(inputs, input_count);
  op->output_count = output_count;
  op->outputs = st__ints(outputs, output_count);
  op->deps = st__ints(NULL, 0);
  op->task = -1;
  /* Where it runs: its first output's stage (a SEND's destination), else
   * its first input's; the passes copy ops through here and keep it. */
  op->stage = output_count > 0 && outputs[0] >= 0 && outputs[0] < plan->slot_count   ? plan->slots[outputs[0]].stage
              : input_count > 0 && inputs[0] >= 0 && inputs[0] < plan->slot_count ? plan->slots[inputs[0]].stage
                                                                                   : 0;
  return op;
}

void st_plan_set_pipeline(st_plan* plan, const st_plan_pipe_task* tasks, int count, const int* first, int chunks) {
  free(plan->pipe_tasks);
  free(plan->pipe_first);
  plan->pipe_tasks = NULL;
  plan->pipe_first = NULL;
  plan->pipe_task_count = plan->pipe_chunks = 0;
  if (!tasks || count <= 0) return;
  plan->pipe_tasks = st_xcalloc((size_t)count, sizeof(*tasks));
  memcpy(plan->pipe_tasks, tasks, (size_t)count * sizeof(*tasks));
  plan->pipe_task_count = count;
  plan->pipe_first = st_xcalloc((size_t)chunks + 1, sizeof(int));
  memcpy(plan->pipe_first, first, ((size_t)chunks + 1) * sizeof(int));
  plan->pipe_chunks = chunks;
}

void st_plan_set_policy(st_plan* plan, const char* policy) {
  free(plan->policy);
  plan->policy = policy ? st__xstrdup(policy) : NULL;
}

void st_plan_copy(const st_plan* src, st_plan* dst) {
  st_plan_init(dst);
  for (int i = 0; i < src->slot_count; ++i) {
    const st_slot* s = &src->slots[i];
    dst->slots = st_xrealloc(dst->slots, (size_t)(dst->slot_count + 1) * sizeof(st_slot));
    dst->slots[dst->slot_count] = *s;
    dst->slots[dst->slot_count++].name = st__xstrdup(s->name);
  }
  for (int i = 0; i < src->program_count; ++i) st_plan_program_at(dst, src->programs[i], st_plan_program_stage(src, i));
  for (int i = 0; i < src->op_count; ++i) {
    const st_op* o = &src->ops[i];
    st_op* n = st_plan_add(dst, o->kind, o->program, o->layer, o->micro, o->tag, o->input_count, o->inputs,
                           o->output_count, o->outputs);
    free(n->deps);
    n->deps = st__ints(o->deps, o->dep_count);
    n->dep_count = o->dep_count;
    n->task = o->task;
  }
  st_plan_set_policy(dst, src->policy);
  dst->devices = src->devices;
  memcpy(dst->mesh, src->mesh, sizeof(dst->mesh));
  dst->serialize_spmd = src->serialize_spmd;
  dst->procs = src->procs;
  dst->stages = src->stages;
  st_plan_set_pipeline(dst, src->pipe_tasks, src->pipe_task_count, src->pipe_first, src->pipe_chunks);
  /* Program indices are interned in |src|'s order, so they line up. */
  st_plan_set_program_temps(dst, src->program_temps);
}

bool st__op_is_async(st_op_kind k) {
  return k == ST_OP_LAUNCH || k == ST_OP_RECOMPUTE || k == ST_OP_H2D || k == ST_OP_D2H || k == ST_OP_COLLECTIVE ||
         k == ST_OP_XPROC || k == ST_OP_SEND;
}

/*===-------------------------------------------------------------------===*/
/* Dependencies and validation                                              */
/*===-------------------------------------------------------------------===*/

static st_status st__plan_bad(const st_plan* plan, int i, const char* what, int slot) {
  const st_op* op = &plan->ops[i];
  return st_status_make(ST_CODE_INTERNAL, "plan op %d (%s%s%s, layer %d): %s slot '%s'", i, st_op_kind_name(op->kind),
                        op->program >= 0 && op->program < plan->program_count ? " " : "",
                        op->program >= 0 && op->program < plan->program_count ? plan->programs[op->program] : "",
                        op->layer, what, slot >= 0 ? plan->slots[slot].name : "?");
}

/* One slot's dim 0 cut across the processes into the other (whole). */
static bool st__xproc_cut_of(const st_plan* plan, const st_slot* cut, const st_slot* whole) {
  const st_tensor_type *c = &cut->type, *w = &whole->type;
  if (cut->xblocks != plan->procs || c->rank < 1 || c->rank != w->rank) return false;
  if (c->dims[0] != (w->dims[0] + plan->procs - 1) / plan->procs) return false;
  for (int d = 1; d < c->rank; ++d)
    if (c->dims[d] != w->dims[d]) return false;
  return true;
}

/* An XPROC op moves f32 device slots (what st_dist_coll sums): an
 * all-reduce in place, an all-gather from a slot cut across the processes
 * to its whole, a reduce-scatter from a whole slot to its cut. */
static st_status st__check_xproc(const st_plan* plan, int i) {
  const st_op* op = &plan->ops[i];
  if (op->input_count < 1 || op->input_count != op->output_count)
    return st__plan_bad(plan, i, "must have as many outputs as inputs; first input", op->input_count ? op->inputs[0] : -1);
  for (int j = 0; j < op->input_count; ++j) {
    const st_slot *in = &plan->slots[op->inputs[j]], *out = &plan->slots[op->outputs[j]];
    if (in->host || out->host) return st__plan_bad(plan, i, "communicates the host-memory", op->inputs[j]);
    if (in->type.dtype != ST_DTYPE_F32 || out->type.dtype != ST_DTYPE_F32)
      return st__plan_bad(plan, i, "communicates a non-f32", op->inputs[j]);
    if (op->tag == ST_COLL_ALL_GATHER) {
      if (!st__xproc_cut_of(plan, in, out))
        return st__plan_bad(plan, i, "must gather a slot cut across the processes into its whole; input", op->inputs[j]);
    } else if (op->tag == ST_COLL_REDUCE_SCATTER) {
      if (!st__xproc_cut_of(plan, out, in))
        return st__plan_bad(plan, i, "must reduce-scatter a whole slot into its cut across the processes; input", op->inputs[j]);
    } else if (op->outputs[j] != op->inputs[j]) {
      return st__plan_bad(plan, i, "is not in place on", op->inputs[j]);
    }
  }
  return ST_OK;
}

static bool st__same_type(const st_tensor_type* a, const st_tensor_type* b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int d = 0; d < a->rank; ++d)
    if (a->dims[d] != b->dims[d]) return false;
  return true;
}

/* A SEND copies device slots of one stage into same-typed device slots of
 * another (op->stage, its outputs' stage). */
static st_status st__check_send(const st_plan* plan, int i) {
  const st_op* op = &plan->ops[i];
  if (plan->stages < 2) return st__plan_bad(plan, i, "is a SEND in a plan without pipeline stages; first input", -1);
  if (op->input_count < 1 || op->input_count != op->output_count)
    return st__plan_bad(plan, i, "must have as many outputs as inputs; first input", op->input_count ? op->inputs[0] : -1);
  for (int j = 0; j < op->input_count; ++j) {
    const st_slot *in = &plan->slots[op->inputs[j]], *out = &plan->slots[op->outputs[j]];
    if (in->host || out->host) return st__plan_bad(plan, i, "sends the host-memory", op->inputs[j]);
    if (!st__same_type(&in->type, &out->type)) return st__plan_bad(plan, i, "sends into a slot of another type than", op->inputs[j]);
    if (in->stage == out->stage) return st__plan_bad(plan, i, "sends within one stage", op->inputs[j]);
    if (out->stage != op->stage) return st__plan_bad(plan, i, "sends to slots of two stages; second", op->outputs[j]);
  }
  return ST_OK;
}

/* Pipeline: every slot is one stage's, and an op other than a SEND, a WAIT
 * or a HOST op touches slots and programs of its own stage only. */
static st_status st__check_stages(const st_plan* plan, int i) {
  const st_op* op = &plan->ops[i];
  for (int j = 0; j < op->input_count + op->output_count; ++j) {
    int x = j < op->input_count ? op->inputs[j] : op->outputs[j - op->input_count];
    if (plan->slots[x].stage < 0 || plan->slots[x].stage >= plan->stages)
      return st__plan_bad(plan, i, "uses a slot of no stage of the plan:", x);
  }
  if (op->kind == ST_OP_SEND || op->kind == ST_OP_WAIT || op->kind == ST_OP_HOST) return ST_OK;
  if (st__op_has_program(op->kind) && st_plan_program_stage(plan, op->program) != op->stage)
    return st__plan_bad(plan, i, "runs a program compiled for another stage; first input", op->input_count ? op->inputs[0] : -1);
  for (int j = 0; j < op->input_count + op->output_count; ++j) {
    int x = j < op->input_count ? op->inputs[j] : op->outputs[j - op->input_count];
    if (plan->slots[x].stage != op->stage) return st__plan_bad(plan, i, "touches another stage's", x);
  }
  return ST_OK;
}

st_status st_plan_finalize(st_plan* plan) {
  const int n = plan->slot_count;
  int* writer = st_xmalloc(((size_t)n + 1) * sizeof(int));
  bool* live = st_xcalloc((size_t)n + 1, sizeof(bool));
  int* deps = st_xmalloc(((size_t)plan->op_count + 1) * sizeof(int));
  st_status s = ST_OK;
  for (int k = 0; k < n; ++k) {
    writer[k] = -1;
    live[k] = plan->slots[k].persistent;
    const st_slot* sl = &plan->slots[k];
    if (sl->twin >= 0 && (sl->twin >= n || plan->slots[sl->twin].twin != k || plan->slots[sl->twin].host == sl->host))
      s = st_status_make(ST_CODE_INTERNAL, "plan slot '%s': its twin is not a slot in the other memory", sl->name);
  }
  for (int i = 0; i < plan->op_count && !s; ++i) {
    st_op* op = &plan->ops[i];
    int nd = 0;
    /* Inputs must hold something; their writers become deps. */
    for (int j = 0; j < op->input_count && !s; ++j) {
      int x = op->inputs[j];
      if (x < 0 || x >= n) {
        s = st_status_make(ST_CODE_INTERNAL, "plan op %d: input slot %d out of range", i, x);
        break;
      }
      if (!live[x]) s = st__plan_bad(plan, i, "reads the empty", x);
      if (writer[x] >= 0) {
        bool seen = false;
        for (int d = 0; d < nd; ++d) seen |= deps[d] == writer[x];
        if (!seen) deps[nd++] = writer[x];
      }
    }
    for (int j = 0; j < op->output_count && !s; ++j)
      if (op->outputs[j] < 0 || op->outputs[j] >= n)
        s = st_status_make(ST_CODE_INTERNAL, "plan op %d: output slot %d out of range", i, op->outputs[j]);
    if (s) break;
    switch (op->kind) {
      case ST_OP_LAUNCH:
      case ST_OP_RECOMPUTE:
      case ST_OP_COLLECTIVE:
        if (op->kind == ST_OP_COLLECTIVE && plan->devices < 2) s = st__plan_bad(plan, i, "is a collective in a one-device plan; first input", -1);
        if (op->program < 0 || op->program >= plan->program_count) s = st__plan_bad(plan, i, "names no program; first input", -1);
        for (int j = 0; j < op->input_count && !s; ++j)
          if (plan->slots[op->inputs[j]].host) s = st__plan_bad(plan, i, "passes a program the host-memory", op->inputs[j]);
        for (int j = 0; j < op->output_count && !s; ++j)
          if (plan->slots[op->outputs[j]].host) s = st__plan_bad(plan, i, "writes program output into the host-memory", op->outputs[j]);
        break;
      case ST_OP_H2D:
        if (op->output_count != 1 || op->input_count > 1) {
          s = st__plan_bad(plan, i, "needs one output (and at most one input); first output", op->output_count ? op->outputs[0] : -1);
        } else if (plan->slots[op->outputs[0]].host) {
          s = st__plan_bad(plan, i, "fills the host-memory", op->outputs[0]);
        } else if (op->input_count == 1 && plan->slots[op->inputs[0]].twin != op->outputs[0]) {
          s = st__plan_bad(plan, i, "copies from a slot that is not the home of", op->outputs[0]);
        }
        break;
      case ST_OP_D2H:
        if (op->input_count != 1 || op->output_count != 1 || plan->slots[op->inputs[0]].twin != op->outputs[0] ||
            !plan->slots[op->outputs[0]].host)
          s = st__plan_bad(plan, i, "must copy a device slot to its host home; input", op->input_count ? op->inputs[0] : -1);
        break;
      case ST_OP_READ:
        if (op->input_count != 1 || op->output_count != 0) s = st__plan_bad(plan, i, "reads exactly one slot; first", -1);
        else if (plan->slots[op->inputs[0]].host) s = st__plan_bad(plan, i, "reads the host-memory", op->inputs[0]);
        break;
      case ST_OP_FREE:
        for (int j = 0; j < op->input_count && !s; ++j)
          if (plan->slots[op->inputs[j]].persistent) s = st__plan_bad(plan, i, "frees the persistent", op->inputs[j]);
        break;
      case ST_OP_WAIT:
        if (op->input_count == 0) { /* the barrier: everything issued so far */
          nd = 0;
          for (int k = 0; k < i; ++k)
            if (st__op_is_async(plan->ops[k].kind)) deps[nd++] = k;
        }
        break;
      case ST_OP_HOST:
        break;
      case ST_OP_XPROC:
        s = st__check_xproc(plan, i);
        break;
      case ST_OP_SEND:
        s = st__check_send(plan, i);
        break;
    }
    if (!s && plan->stages > 1) s = st__check_stages(plan, i);
    if (s) break;
    free(op->deps);
    op->deps = st__ints(deps, nd);
    op->dep_count = nd;
    if (op->kind == ST_OP_FREE)
      for (int j = 0; j < op->input_count; ++j) live[op->inputs[j]] = false;
    for (int j = 0; j < op->output_count; ++j) {
      live[op->outputs[j]] = true;
      writer[op->outputs[j]] = i;
    }
  }
  for (int k = 0; k < n && !s; ++k)
    if (live[k] && !plan->slots[k].persistent)
      s = st_status_make(ST_CODE_INTERNAL, "plan leaves slot '%s' filled at the end of the step; add a FREE",
                         plan->slots[k].name);
  free(writer);
  free(live);
  free(deps);
  return s;
}

/*===-------------------------------------------------------------------===*/
/* Liveness                                                                 */
/*===-------------------------------------------------------------------===*/

/* Follows the executor's rules exactly: an output slot becomes live when
 * written (replacing what it held), FREE empties a slot, and a donated
 * input's memory is reused by the output that aliases it — which the slot
 * model captures because the executor requires donated slots to be
 * refilled by the same op. Persistent device slots start live; host slots
 * are not device memory. Each stage's devices are counted apart (one
 * stage without a pipeline). |stage_peaks| (stages * categories, may be
 * NULL) receives each stage's per-category maxima. */
static int64_t st__predict(const st_plan* plan, int64_t* out, int64_t* out_peak_by_category, int64_t* stage_peaks) {
  enum { C = ST_SLOT_CATEGORY_COUNT };
  const int S = plan->stages > 1 ? plan->stages : 1;
  bool* live = st_xcalloc((size_t)plan->slot_count + 1, sizeof(bool));
  int64_t* cat = st_xcalloc((size_t)S * C, sizeof(int64_t)); /* [stage][category] */
  for (int i = 0; i < plan->slot_count; ++i) {
    const st_slot* sl = &plan->slots[i];
    if (sl->persistent && !sl->host) {
      live[i] = true;
      cat[(size_t)sl->stage * C + sl->category] += (int64_t)st_tensor_type_bytes(&sl->type);
    }
  }
  int64_t peak = 0;
  for (int st = 0; st < S; ++st) {
    int64_t total = 0;
    for (int k = 0; k < C; ++k) total += cat[(size_t)st * C + k];
    if (total > peak || st == 0) {
      peak = total;
      if (out_peak_by_category) memcpy(out_peak_by_category, cat + (size_t)st * C, C * sizeof(int64_t));
    }
  }
  if (stage_peaks) memcpy(stage_peaks, cat, (size_t)S * C * sizeof(int64_t));
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    if (op->kind == ST_OP_FREE) {
      for (int j = 0; j < op->input_count; ++j) {
        int s = op->inputs[j];
        const st_slot* sl = &plan->slots[s];
        if (live[s]) cat[(size_t)sl->stage * C + sl->category] -= (int64_t)st_tensor_type_bytes(&sl->type);
        live[s] = false;
      }
    }
    for (int j = 0; j < op->output_count; ++j) {
      int s = op->outputs[j];
      const st_slot* sl = &plan->slots[s];
      if (sl->host) continue;
      if (!live[s]) cat[(size_t)sl->stage * C + sl->category] += (int64_t)st_tensor_type_bytes(&sl->type);
      live[s] = true;
    }
    const int64_t* here = cat + (size_t)(S > 1 ? op->stage : 0) * C;
    int64_t total = 0;
    for (int k = 0; k < C; ++k) {
      total += here[k];
      if (out) out[(size_t)i * C + (size_t)k] = here[k];
    }
    if (total > peak) {
      peak = total;
      if (out_peak_by_category) memcpy(out_peak_by_category, here, C * sizeof(int64_t));
    }
    for (int k = 0; stage_peaks && k < S * C; ++k)
      if (cat[k] > stage_peaks[k]) stage_peaks[k] = cat[k];
  }
  free(live);
  free(cat);
  return peak;
}

int64_t st_plan_predict_live(const st_plan* plan, int64_t* out, int64_t* out_peak_by_category) {
  return st__predict(plan, out, out_peak_by_category, NULL);
}

int st_plan_predict_stage_peaks(const st_plan* plan, int64_t* out_stage_peaks) {
  st__predict(plan, NULL, NULL, out_stage_peaks);
  return plan->stages > 1 ? plan->stages : 1;
}

void st_plan_set_program_temps(st_plan* plan, const int64_t* temps) {
  free(plan->program_temps);
  plan->program_temps = NULL;
  if (!temps) return;
  plan->program_temps = st_xcalloc((size_t)plan->program_count + 1, sizeof(int64_t));
  memcpy(plan->program_temps, temps, (size_t)plan->program_count * sizeof(int64_t));
}

int64_t* st_plan_temps_of_programs(const st_plan* plan, st_program* const* programs, bool* out_known) {
  int64_t* t = st_xcalloc((size_t)plan->program_count + 1, sizeof(int64_t));
  bool known = true;
  for (int i = 0; i < plan->program_count; ++i) {
    st_program_memory m;
    st_program_memory_stats(programs ? programs[i] : NULL, &m);
    if (!m.known) known = false;
    t[i] = m.temp_bytes;
  }
  if (out_known) *out_known = known;
  return t;
}

int64_t st_plan_predict_with_temps(const st_plan* plan, const int64_t* temps, st_plan_temps_peak* out) {
  if (!temps) temps = plan->program_temps;
  int64_t* live = st_xcalloc((size_t)plan->op_count * ST_SLOT_CATEGORY_COUNT + 1, sizeof(int64_t));
  int64_t slots_peak = st_plan_predict_live(plan, live, NULL);
  /* The start: the persistent state alone (st_plan_predict_live's floor). */
  int64_t start_total = 0;
  for (int st = 0; st < (plan->stages > 1 ? plan->stages : 1); ++st) { /* the fullest stage's */
    int64_t n = 0;
    for (int i = 0; i < plan->slot_count; ++i)
      if (plan->slots[i].persistent && !plan->slots[i].host && plan->slots[i].stage == st)
        n += (int64_t)st_tensor_type_bytes(&plan->slots[i].type);
    if (n > start_total) start_total = n;
  }
  st_plan_temps_peak r = {.peak = start_total, .op = -1, .temps = 0, .slots = start_total, .slots_peak = slots_peak};
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    int64_t slots = 0;
    for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) slots += live[(size_t)i * ST_SLOT_CATEGORY_COUNT + (size_t)k];
    int64_t tb = (temps && st__op_has_program(op->kind)) ? temps[op->program] : 0;
    if (slots + tb > r.peak) r = (st_plan_temps_peak){slots + tb, i, tb, slots, slots_peak};
  }
  free(live);
  if (out) *out = r;
  return r.peak;
}

int64_t st_plan_host_bytes(const st_plan* plan) {
  int64_t n = 0;
  for (int i = 0; i < plan->slot_count; ++i)
    if (plan->slots[i].host) n += (int64_t)st_tensor_type_bytes(&plan->slots[i].type);
  return n;
}

/*===-------------------------------------------------------------------===*/
/* Printing                                                                 */
/*===-------------------------------------------------------------------===*/

static void st__slot_list(const st_plan* plan, const int* slots, int n, st_strbuf* b) {
  st_strbuf_append(b, "[");
  for (int i = 0; i < n; ++i) st_strbuf_printf(b, "%s%s", i ? " " : "", plan->slots[slots[i]].name);
  st_strbuf_append(b, "]");
}

void st_plan_print(const st_plan* plan, FILE* out) {
  int64_t* live = st_xcalloc((size_t)plan->op_count * ST_SLOT_CATEGORY_COUNT + 1, sizeof(int64_t));
  int64_t peak = st_plan_predict_live(plan, live, NULL);
  fprintf(out, "# %d ops, %d slots, %d programs; predicted peak live device bytes %lld; host-memory bytes %lld\n",
          plan->op_count, plan->slot_count, plan->program_count, (long long)peak, (long long)st_plan_host_bytes(plan));
  if (plan->program_temps) {
    /* Only once the programs are compiled (strata plan --compile, a run). */
    st_plan_temps_peak tp;
    st_plan_predict_with_temps(plan, NULL, &tp);
    fprintf(out, "# predicted peak with XLA's temporaries %lld (live slots %lld + temporaries %lld of %s at op %d)\n",
            (long long)tp.peak, (long long)tp.slots, (long long)tp.temps,
            tp.op >= 0 && st__op_has_program(plan->ops[tp.op].kind) ? plan->programs[plan->ops[tp.op].program] : "none",
            tp.op);
    fprintf(out, "# temporaries per program (bytes per device):");
    for (int i = 0; i < plan->program_count; ++i)
      fprintf(out, " %s=%lld", plan->programs[i], (long long)plan->program_temps[i]);
    fprintf(out, "\n");
  }
  if (plan->policy) fprintf(out, "# policy: %s\n", plan->policy);
  if (plan->devices > 1) {
    /* Only a multi-device plan says so: the one-device text stays as it was. */
    int n[4] = {0, 0, 0, 0};
    for (int k = 0; k < plan->slot_count; ++k)
      if (!plan->slots[k].host) n[plan->slots[k].layout]++;
    if (plan->mesh[1] <= 1) {
      fprintf(out, "# data-parallel over %d devices: every device slot is one buffer per device; live bytes are per device\n",
              plan->devices);
      /* Counts only: --json gives every slot's layout. */
      fprintf(out, "# slot layouts: %d replicated (state, scalars), %d split (batch rows, activations, losses), %d partial "
                   "(gradients until their COLLECTIVE)\n",
              n[ST_LAYOUT_REPLICATED], n[ST_LAYOUT_SPLIT], n[ST_LAYOUT_PARTIAL]);
    } else {
      fprintf(out, "# mesh data=%d fsdp=%d over %d devices: every device slot is one buffer per device; live bytes are per "
                   "device\n",
              plan->mesh[0], plan->mesh[1], plan->devices);
      fprintf(out, "# slot layouts: %d sharded (fsdp blocks of the parameters, gradients, m and v), %d replicated "
                   "(gathered parameters, scalars), %d split (batch rows, activations, losses), %d partial (whole "
                   "gradients until their reduce-scatter, squared norms of blocks)\n",
              n[ST_LAYOUT_SHARDED], n[ST_LAYOUT_REPLICATED], n[ST_LAYOUT_SPLIT], n[ST_LAYOUT_PARTIAL]);
    }
  }
  if (plan->stages > 1)
    fprintf(out, "# pipeline of %d stages, each on %d device(s) of its own: live bytes are the op's stage's, per device\n",
            plan->stages, plan->devices);
  /* The FSDP categories only where they can be nonzero: other texts stay as they were. */
  const bool fsdp = plan->mesh[1] > 1;
  fprintf(out, "# live bytes after each op: params/grads/optimizer/activations/transfer%s\n", fsdp ? "/gathered/unreduced" : "");
  st_strbuf b = {0};
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    st_strbuf_reset(&b);
    st_strbuf_printf(&b, "%5d %-9s", i, st_op_kind_name(op->kind));
    if (plan->stages > 1) st_strbuf_printf(&b, " stage=%d", op->stage);
    if (st__op_has_program(op->kind)) st_strbuf_printf(&b, " %s", plan->programs[op->program]);
    if (op->layer >= 0) st_strbuf_printf(&b, " layer=%d", op->layer);
    if (op->micro >= 0) st_strbuf_printf(&b, " micro=%d", op->micro);
    if (op->input_count) {
      st_strbuf_append(&b, " in=");
      st__slot_list(plan, op->inputs, op->input_count, &b);
    }
    if (op->output_count) {
      st_strbuf_append(&b, " out=");
      st__slot_list(plan, op->outputs, op->output_count, &b);
    }
    if (op->dep_count) {
      st_strbuf_append(&b, " deps=[");
      for (int j = 0; j < op->dep_count; ++j) st_strbuf_printf(&b, "%s%d", j ? " " : "", op->deps[j]);
      st_strbuf_append(&b, "]");
    }
    const int64_t* l = &live[(size_t)i * ST_SLOT_CATEGORY_COUNT];
    fprintf(out, "%s  live=%lld/%lld/%lld/%lld/%lld", b.data, (long long)l[0], (long long)l[1], (long long)l[2],
            (long long)l[3], (long long)l[4]);
    if (fsdp) fprintf(out, "/%lld/%lld", (long long)l[ST_SLOT_GATHERED], (long long)l[ST_SLOT_UNREDUCED]);
    if (plan->program_temps && st__op_has_program(op->kind)) fprintf(out, " temp=%lld", (long long)plan->program_temps[op->program]);
    fprintf(out, "\n");
  }
  st_strbuf_free(&b);
  free(live);
}

json_t* st_plan_json(const st_plan* plan) {
  int64_t* live = st_xcalloc((size_t)plan->op_count * ST_SLOT_CATEGORY_COUNT + 1, sizeof(int64_t));
  int64_t by_cat[ST_SLOT_CATEGORY_COUNT];
  int64_t peak = st_plan_predict_live(plan, live, by_cat);
  json_t* j = st_json_obj();
  st_json_put_int(j, "predicted_peak_bytes", peak);
  json_t* cats = st_json_obj();
  for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) st_json_put_int(cats, st_slot_category_name((st_slot_category)k), by_cat[k]);
  st_json_put(j, "predicted_peak_by_category", cats);
  st_json_put_int(j, "host_bytes", st_plan_host_bytes(plan));
  st_json_put(j, "policy", plan->policy ? st_json_str(plan->policy) : json_null());
  if (plan->devices > 1) {
    st_json_put_int(j, "devices", plan->devices);
    json_t* mesh = st_json_obj();
    st_json_put_int(mesh, "data", plan->mesh[0]);
    st_json_put_int(mesh, "fsdp", plan->mesh[1]);
    st_json_put_int(mesh, "tensor", plan->mesh[2]);
    st_json_put(j, "mesh", mesh);
    st_json_put_bool(j, "serialize_spmd", plan->serialize_spmd);
  }
  json_t* programs = st_json_arr();
  for (int i = 0; i < plan->program_count; ++i) st_json_push(programs, st_json_str(plan->programs[i]));
  st_json_put(j, "programs", programs);
  if (plan->stages > 1) {
    st_json_put_int(j, "stages", plan->stages);
    json_t* ps = st_json_arr();
    for (int i = 0; i < plan->program_count; ++i) st_json_push(ps, st_json_int(st_plan_program_stage(plan, i)));
    st_json_put(j, "program_stages", ps);
    int64_t* sp = st_xcalloc((size_t)plan->stages * ST_SLOT_CATEGORY_COUNT, sizeof(int64_t));
    st_plan_predict_stage_peaks(plan, sp);
    json_t* stages = st_json_arr();
    for (int st = 0; st < plan->stages; ++st) {
      json_t* o = st_json_obj();
      for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k)
        st_json_put_int(o, st_slot_category_name((st_slot_category)k), sp[(size_t)st * ST_SLOT_CATEGORY_COUNT + (size_t)k]);
      st_json_push(stages, o);
    }
    st_json_put(j, "stage_peak_by_category", stages);
    free(sp);
  }
  if (plan->program_temps) {
    st_plan_temps_peak tp;
    st_plan_predict_with_temps(plan, NULL, &tp);
    json_t* t = st_json_obj();
    for (int i = 0; i < plan->program_count; ++i) st_json_put_int(t, plan->programs[i], plan->program_temps[i]);
    st_json_put(j, "program_temp_bytes", t);
    st_json_put_int(j, "predicted_peak_with_temps_bytes", tp.peak);
    st_json_put_int(j, "peak_with_temps_op", tp.op);
    st_json_put_int(j, "peak_temps_bytes", tp.temps);
  }
  json_t* slots = st_json_arr();
  for (int i = 0; i < plan->slot_count; ++i) {
    const st_slot* s = &plan->slots[i];
    char t[128];
    json_t* o = st_json_obj();
    st_json_put_str(o, "name", s->name);
    st_json_put_str(o, "category", st_slot_category_name(s->category));
    st_json_put_str(o, "type", st_tensor_type_format(&s->type, t, sizeof(t)));
    st_json_put_int(o, "bytes", (int64_t)st_tensor_type_bytes(&s->type));
    st_json_put_bool(o, "persistent", s->persistent);
    st_json_put_str(o, "memory", s->host ? "host" : "device");
    st_json_put_int(o, "twin", s->twin);
    if (plan->stages > 1) st_json_put_int(o, "stage", s->stage);
    if (plan->devices > 1) st_json_put_str(o, "layout", st_slot_layout_name(s->layout));
    if (plan->devices > 1 && s->layout == ST_LAYOUT_SHARDED) {
      st_json_put_str(o, "logical_type", st_tensor_type_format(&s->logical, t, sizeof(t)));
      json_t* split = st_json_arr();
      for (int d = 0; d < s->logical.rank; ++d) st_json_push(split, st_json_int((int64_t)s->sharding.split[d]));
      st_json_put(o, "split_axes", split);
    }
    st_json_push(slots, o);
  }
  st_json_put(j, "slots", slots);
  json_t* ops = st_json_arr();
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    json_t* o = st_json_obj();
    st_json_put_int(o, "index", i);
    st_json_put_str(o, "kind", st_op_kind_name(op->kind));
    if (st__op_has_program(op->kind)) st_json_put_str(o, "program", plan->programs[op->program]);
    if (op->kind == ST_OP_COLLECTIVE || op->kind == ST_OP_XPROC)
      st_json_put_str(o, "collective_kind", st_collective_kind_name((st_collective_kind)op->tag));
    st_json_put_int(o, "layer", op->layer);
    st_json_put_int(o, "micro", op->micro);
    if (plan->stages > 1) st_json_put_int(o, "stage", op->stage);
    json_t* v = st_json_arr();
    for (int k = 0; k < op->input_count; ++k) st_json_push(v, st_json_int(op->inputs[k]));
    st_json_put(o, "inputs", v);
    v = st_json_arr();
    for (int k = 0; k < op->output_count; ++k) st_json_push(v, st_json_int(op->outputs[k]));
    st_json_put(o, "outputs", v);
    v = st_json_arr();
    for (int k = 0; k < op->dep_count; ++k) st_json_push(v, st_json_int(op->deps[k]));
    st_json_put(o, "deps", v);
    json_t* lb = st_json_obj();
    for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k)
      st_json_put_int(lb, st_slot_category_name((st_slot_category)k), live[(size_t)i * ST_SLOT_CATEGORY_COUNT + (size_t)k]);
    st_json_put(o, "live_bytes", lb);
    st_json_push(ops, o);
  }
  st_json_put(j, "ops", ops);
  free(live);
  return j;
}
