/* explain.c — `strata plan --explain`: what the step plan puts where on
 * the mesh (docs/parallelism.md, "strata plan --explain"). Everything is read
 * off the built plans, so the explanation cannot drift from what runs: the
 * slots (each tensor, its category, per-device type and layout), the
 * COLLECTIVE ops (per layer, with their bytes: what a ring sends), the
 * liveness prediction (per-device memory by category) and their sum
 * (communication per step), and in a job of several processes the XPROC
 * ops with the bytes the MPI engine sends for them (what crosses processes
 * per step). The text form is here too, not in cli/: it
 * groups tensors by the same sharding words and counts the fsdp padding
 * from the plan, which the JSON does not carry. */
#include <ctype.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/dist.h"
#include "strata/plan.h"
#include "strata/sched.h"

static const char* const st__kinds[] = {"all_reduce", "all_gather", "reduce_scatter"};

/* Bytes each device sends in a ring for a message of |bytes| over |n|
 * devices: (n-1)/n of it for a gather or a scatter, twice that for an
 * all-reduce (the manifest's wire_bytes_per_device, docs/parallelism.md). */
static int64_t st__wire_bytes(const char* kind, int64_t bytes, int n) {
  if (n <= 1) return 0;
  int64_t once = bytes * (n - 1) / n;
  return strcmp(kind, "all_reduce") == 0 ? 2 * once : once;
}

/* Axis bits (ST_PLAN_AXIS_*) as words: "data", "fsdp", "data and fsdp",
 * "data, fsdp and tensor". */
static void st__axis_words(uint32_t bits, char* out, size_t n) {
  static const char* const names[3] = {"data", "fsdp", "tensor"};
  int count = 0, seen = 0;
  for (int a = 0; a < 3; ++a) count += (bits >> a) & 1u;
  out[0] = '\0';
  for (int a = 0; a < 3; ++a) {
    if (!((bits >> a) & 1u)) continue;
    ++seen;
    snprintf(out + strlen(out), n - strlen(out), "%s%s", seen == 1 ? "" : seen == count ? " and " : ", ", names[a]);
  }
}

/* The mesh's axes above 1 (the batch shares' axes: data and fsdp only). */
static uint32_t st__mesh_bits(const st_plan* plan, bool with_tensor) {
  uint32_t b = 0;
  if (plan->mesh[0] > 1) b |= ST_PLAN_AXIS_DATA;
  if (plan->mesh[1] > 1) b |= ST_PLAN_AXIS_FSDP;
  if (with_tensor && plan->mesh[2] > 1) b |= ST_PLAN_AXIS_TENSOR;
  return b ? b : ST_PLAN_AXIS_DATA;
}

/* How the devices' buffers of slot |s| make up the logical tensor. The
 * data-only strings are those of the data-parallel plan; under fsdp every
 * batch share is a (data, fsdp) coordinate, the state is cut in fsdp
 * blocks and the whole-tensor categories say when they exist. */
static void st__sharding(const st_plan* plan, const st_slot* s, char* out, size_t n) {
  if (plan->devices <= 1) {
    snprintf(out, n, "whole");
    return;
  }
  char axes[64], all[64];
  st__axis_words(st__mesh_bits(plan, false), axes, sizeof(axes));
  st__axis_words(st__mesh_bits(plan, true), all, sizeof(all));
  const bool data = plan->mesh[0] > 1;
  switch (s->layout) {
    case ST_LAYOUT_REPLICATED:
      if (s->category == ST_SLOT_GATHERED)
        snprintf(out, n, "gathered: %s on every device (all-gathered over fsdp before its use, freed after)",
                 plan->mesh[2] > 1 ? "the tensor-parallel block, whole over fsdp," : "whole");
      else
        snprintf(out, n, "replicated over %s", all);
      return;
    case ST_LAYOUT_SPLIT:
      if (s->type.rank > 0 && plan->mesh[2] > 1)
        /* Tensor parallelism: a tensor group takes the same rows; the
         * block's residuals hold the device's heads or MLP units. */
        snprintf(out, n, "split over %s (dim 0), %s over tensor", axes,
                 !strncmp(s->name, "res[", 4) ? "the device's heads or MLP units" : "the same");
      else if (s->type.rank > 0)
        snprintf(out, n, "split over %s (dim 0)", axes);
      else
        snprintf(out, n, "one per device (%s)", axes);
      return;
    case ST_LAYOUT_PARTIAL:
      if (s->category == ST_SLOT_UNREDUCED)
        snprintf(out, n, "unreduced: %s, partial over %s (sum over devices until reduce-scattered)",
                 plan->mesh[2] > 1 ? "the tensor-parallel block" : "whole", axes);
      else if (s->category == ST_SLOT_XFER) /* a squared norm under fsdp (x tensor: of the device's tensor blocks too) */
        snprintf(out, n, "partial over fsdp%s (the device's blocks; the host adds them)%s",
                 plan->mesh[2] > 1 ? " and tensor" : "", data ? ", replicated over data" : "");
      else if (!data && plan->mesh[2] > 1) /* tensor alone: whole tensors' gradients are equal in a group */
        snprintf(out, n, "replicated over tensor (every device of a group computes the same)");
      else
        snprintf(out, n, "partial over data (sum over devices until all-reduced)%s",
                 plan->mesh[2] > 1 ? ", the same on every device of a tensor group" : "");
      return;
    case ST_LAYOUT_SHARDED: {
      const char* tail = !data ? "" : s->sharding.partial ? ", partial over data until all-reduced" : ", replicated over data";
      if (s->sharding.split[0] == ST_PLAN_AXIS_FSDP) {
        bool other = false;
        for (int d = 1; d < s->logical.rank; ++d) other |= s->sharding.split[d] != 0;
        if (!other) {
          snprintf(out, n, "sharded over fsdp (dim 0, zero-padded)%s", tail);
          return;
        }
      }
      /* Several cuts (tensor, then fsdp): each dimension's axes, outer first. */
      snprintf(out, n, "sharded:");
      for (int d = 0; d < s->logical.rank; ++d) {
        uint32_t bits = s->sharding.split[d];
        if (!bits) continue;
        char w[64];
        st__axis_words(bits, w, sizeof(w));
        snprintf(out + strlen(out), n - strlen(out), " dim %d over %s%s%s", d, w,
                 s->sharding.outer[d] ? " (the tensor block cut again over fsdp, zero-padded)"
                 : (bits & ST_PLAN_AXIS_FSDP) ? " (zero-padded)" : "",
                 ",");
      }
      size_t len = strlen(out);
      if (len && out[len - 1] == ',') out[len - 1] = '\0';
      snprintf(out + strlen(out), n - strlen(out), "%s", tail);
      return;
    }
  }
  snprintf(out, n, "?");
}

/* The logical (whole-mesh) type: a split slot's dim 0 times the batch
 * shares (data x fsdp), a sharded slot's whole tensor. */
static st_tensor_type st__logical(const st_plan* plan, const st_slot* s) {
  st_tensor_type t = s->type;
  if (plan->devices > 1 && s->layout == ST_LAYOUT_SHARDED) return s->logical;
  /* a tensor group shares its rows: the shares are data x fsdp */
  if (plan->devices > 1 && s->layout == ST_LAYOUT_SPLIT && t.rank > 0) t.dims[0] *= plan->mesh[0] * plan->mesh[1];
  return t;
}

/* A sharded slot's zero rows: the fsdp blocks of dim 0 hold fsdp *
 * ceil(d0 / fsdp) rows of the d0 they cut (the tensor block's, when
 * tensor cuts dim 0 first). */
static int64_t st__pad_rows(const st_plan* plan, const st_slot* s) {
  if (plan->devices <= 1 || s->layout != ST_LAYOUT_SHARDED || s->logical.rank == 0) return 0;
  if (!(s->sharding.split[0] & ST_PLAN_AXIS_FSDP)) return 0;
  int64_t d0 = s->logical.dims[0];
  if (s->sharding.outer[0] & ST_PLAN_AXIS_TENSOR) d0 /= plan->mesh[2];
  return (int64_t)s->type.dims[0] * plan->mesh[1] - d0;
}

/* The mesh axis index of |axis| ("data", "fsdp", "tensor"); -1 if none. */
static int st__axis_index(const char* axis) {
  static const char* const names[3] = {"data", "fsdp", "tensor"};
  for (int k = 0; k < 3; ++k)
    if (!strcmp(axis, names[k])) return k;
  return -1;
}

/* The groups of mesh axis |a|: the mesh indices (row-major over data,
 * fsdp, tensor) that differ only in that axis's coordinate. */
static json_t* st__groups(const st_plan* plan, int a) {
  const int* m = plan->mesh;
  int stride = 1;
  for (int k = a + 1; k < 3; ++k) stride *= m[k];
  json_t* groups = st_json_arr();
  const int nd = m[0] * m[1] * m[2];
  for (int p = 0; p < nd; ++p) {
    if ((p / stride) % m[a] != 0) continue; /* not the first of its group */
    json_t* g = st_json_arr();
    for (int c = 0; c < m[a]; ++c) st_json_push(g, st_json_int(p + c * stride));
    st_json_push(groups, g);
  }
  return groups;
}

/* The mesh: its axes, devices and, per axis above 1, the devices that
 * talk along it. */
static json_t* st__explain_mesh(const st_plan* step, const st_plan_options* o) {
  const int nd = step->devices > 1 ? step->devices : 1;
  json_t* mesh = st_json_obj();
  st_json_put_int(mesh, "data", o->parallel_data);
  st_json_put_int(mesh, "fsdp", o->parallel_fsdp);
  st_json_put_int(mesh, "tensor", o->parallel_tensor);
  st_json_put_int(mesh, "devices", nd);
  json_t* devs = st_json_arr();
  for (int d = 0; d < nd; ++d) st_json_push(devs, st_json_int(d));
  st_json_put(mesh, "runtime_devices", devs);
  /* Per axis above 1: the devices that talk along it. */
  json_t* groups = st_json_obj();
  static const char* const axis_names[3] = {"data", "fsdp", "tensor"};
  for (int a = 0; a < 3 && nd > 1; ++a)
    if (step->mesh[a] > 1) st_json_put(groups, axis_names[a], st__groups(step, a));
  st_json_put(mesh, "groups", groups);
  return mesh;
}

/* Every slot of the step plan: its category, memory, per-device and
 * logical types, bytes, layout and sharding in words. */
static json_t* st__explain_tensors(const st_plan* step) {
  const int nd = step->devices > 1 ? step->devices : 1;
  json_t* tensors = st_json_arr();
  for (int i = 0; i < step->slot_count; ++i) {
    const st_slot* s = &step->slots[i];
    char t[128];
    json_t* e = st_json_obj();
    st_json_put_str(e, "name", s->name);
    st_json_put_str(e, "category", st_slot_category_name(s->category));
    st_json_put_str(e, "memory", s->host ? "host" : "device");
    st_json_put_bool(e, "persistent", s->persistent);
    st_json_put_str(e, "type_per_device", st_tensor_type_format(&s->type, t, sizeof(t)));
    st_tensor_type lt = st__logical(step, s);
    st_json_put_str(e, "type", st_tensor_type_format(&lt, t, sizeof(t)));
    st_json_put_int(e, "bytes_per_device", (int64_t)st_tensor_type_bytes(&s->type));
    st_json_put_str(e, "layout", nd > 1 ? st_slot_layout_name(s->layout) : "whole");
    char sh[160];
    st__sharding(step, s, sh, sizeof(sh));
    st_json_put_str(e, "sharding", sh);
    if (nd > 1 && s->layout == ST_LAYOUT_SHARDED) st_json_put_int(e, "pad_rows", st__pad_rows(step, s));
    st_json_push(tensors, e);
  }
  return tensors;
}

/* Sums of the communication ops of a step, in all and by st__kinds: what
 * "communication_per_step" and "cross_process_per_step" report, per
 * |unit| ("device" or "process"), the ops counted as |count_key|. */
typedef struct st__tally {
  int64_t count, msg, wire;
  int64_t kcount[3], kmsg[3], kwire[3];
} st__tally;

static void st__tally_add(st__tally* t, const char* kind, int64_t bytes, int64_t wire) {
  t->count++;
  t->msg += bytes;
  t->wire += wire;
  for (size_t k = 0; k < sizeof(st__kinds) / sizeof(st__kinds[0]); ++k)
    if (!strcmp(kind, st__kinds[k])) {
      t->kcount[k]++;
      t->kmsg[k] += bytes;
      t->kwire[k] += wire;
    }
}

static json_t* st__tally_json(const st__tally* t, const char* count_key, const char* unit, int64_t units) {
  char bytes_key[48], wire_key[48], all_key[48];
  snprintf(bytes_key, sizeof(bytes_key), "bytes_per_%s", unit);
  snprintf(wire_key, sizeof(wire_key), "wire_bytes_per_%s", unit);
  snprintf(all_key, sizeof(all_key), "wire_bytes_all_%s", strcmp(unit, "device") ? "processes" : "devices");
  json_t* comm = st_json_obj();
  st_json_put_int(comm, count_key, t->count);
  st_json_put_int(comm, bytes_key, t->msg);
  st_json_put_int(comm, wire_key, t->wire);
  st_json_put_int(comm, all_key, t->wire * units);
  json_t* by_kind = st_json_obj();
  for (size_t k = 0; k < sizeof(st__kinds) / sizeof(st__kinds[0]); ++k) {
    if (!t->kcount[k]) continue;
    json_t* o = st_json_obj();
    st_json_put_int(o, count_key, t->kcount[k]);
    st_json_put_int(o, bytes_key, t->kmsg[k]);
    st_json_put_int(o, wire_key, t->kwire[k]);
    st_json_put(by_kind, st__kinds[k], o);
  }
  st_json_put(comm, "by_kind", by_kind);
  return comm;
}

/* Every COLLECTIVE op with its message and ring wire bytes per device
 * (the "collectives" array, returned) and their sums, by kind too
 * (*out_comm, "communication_per_step"). */
static json_t* st__explain_collectives(const st_plan* step, json_t** out_comm) {
  const int nd = step->devices > 1 ? step->devices : 1;
  json_t* colls = st_json_arr();
  st__tally tally = {0};
  for (int i = 0; i < step->op_count; ++i) {
    const st_op* op = &step->ops[i];
    if (op->kind != ST_OP_COLLECTIVE) continue;
    const char* prog = step->programs[op->program];
    /* The kind is the op's tag (the step builder's); the axis follows: the
     * data all-reduce, the fsdp gather and scatter. */
    const char* kind = st_collective_kind_name((st_collective_kind)op->tag);
    const char* axis = op->tag == ST_COLL_ALL_REDUCE ? "data" : "fsdp";
    /* The message (the manifest's bytes_per_device): an all-reduce's
     * tensors as one device holds them; the whole padded tensors (group
     * size x one device's fsdp blocks) of an all-gather or reduce-scatter. */
    const int ax = st__axis_index(axis);
    const int group = ax >= 0 ? step->mesh[ax] : nd;
    const bool blocks_out = !strcmp(kind, "reduce_scatter");
    int64_t bytes = 0;
    json_t* names = st_json_arr();
    for (int k = 0; k < op->input_count; ++k) {
      const int slot = blocks_out ? op->outputs[k] : op->inputs[k];
      bytes += (int64_t)st_tensor_type_bytes(&step->slots[slot].type);
      st_json_push(names, st_json_str(step->slots[op->inputs[k]].name));
    }
    if (strcmp(kind, "all_reduce") != 0) bytes *= group;
    int64_t w = st__wire_bytes(kind, bytes, group);
    json_t* c = st_json_obj();
    st_json_put_int(c, "op", i);
    st_json_put_str(c, "program", prog);
    st_json_put_int(c, "layer", op->layer);
    st_json_put_str(c, "kind", kind);
    st_json_put_str(c, "axis", axis);
    st_json_put_int(c, "devices", nd);
    st_json_put_int(c, "group_size", group);
    st_json_put(c, "tensors", names);
    st_json_put_int(c, "bytes_per_device", bytes);
    st_json_put_int(c, "wire_bytes_per_device", w);
    st_json_push(colls, c);
    st__tally_add(&tally, kind, bytes, w);
  }
  *out_comm = st__tally_json(&tally, "collectives", "device", nd);
  return colls;
}

/* A job of several processes (st_plan_options_span): how many, the job's
 * mesh, and the axis that spans them; NULL for one process. */
static json_t* st__explain_processes(const st_plan* step, const st_plan_options* o) {
  if (o->procs <= 1) return NULL;
  static const char* const names[3] = {"data", "fsdp", "tensor"};
  const int nd = step->devices > 1 ? step->devices : 1;
  json_t* p = st_json_obj();
  st_json_put_int(p, "count", o->procs);
  st_json_put_str(p, "span_axis", o->span_axis >= 0 && o->span_axis < 3 ? names[o->span_axis] : "none");
  json_t* job = st_json_obj();
  st_json_put_int(job, "data", o->global_data);
  st_json_put_int(job, "fsdp", o->global_fsdp);
  st_json_put_int(job, "tensor", o->global_tensor);
  st_json_put(p, "job_mesh", job);
  st_json_put_int(p, "devices_per_process", nd);
  st_json_put_int(p, "devices_in_job", (int64_t)nd * o->procs);
  return p;
}

/* Every XPROC op with the bytes it moves per process (the "cross_process"
 * array, returned) and their sums, by kind too (*out_comm). The executor
 * (st__xproc) starts one engine collective per local device and input
 * slot, of the slot's f32 elements (an all-gather's or reduce-scatter's:
 * the P blocks of the slot cut across processes); what each sends is the engine's own
 * count (st_dist_coll_bytes_sent: alltoall + all-gather for an all-reduce,
 * 2(P-1)/P of the message), so these figures equal the run's xproc_bytes. */
static json_t* st__explain_xproc(const st_plan* step, const st_plan_options* o, json_t** out_comm) {
  static const char* const names[3] = {"data", "fsdp", "tensor"};
  const int nd = step->devices > 1 ? step->devices : 1;
  const int P = o->procs;
  const char* axis = o->span_axis >= 0 && o->span_axis < 3 ? names[o->span_axis] : "none";
  json_t* ops = st_json_arr();
  st__tally tally = {0};
  for (int i = 0; i < step->op_count; ++i) {
    const st_op* op = &step->ops[i];
    if (op->kind != ST_OP_XPROC) continue;
    const char* kind = st_collective_kind_name((st_collective_kind)op->tag);
    const st_dist_coll_kind dk = op->tag == ST_COLL_REDUCE_SCATTER ? ST_DIST_REDUCE_SCATTER
                                 : op->tag == ST_COLL_ALL_GATHER   ? ST_DIST_ALL_GATHER
                                                                   : ST_DIST_ALL_REDUCE;
    int64_t bytes = 0, w = 0;
    json_t* names_arr = st_json_arr();
    for (int k = 0; k < op->input_count; ++k) {
      /* The engine's message: an all-gather's or reduce-scatter's is the P
       * blocks of the slot cut across the processes (padding included) */
      const int64_t in = st_tensor_type_elements(&step->slots[op->inputs[k]].type);
      const int64_t out = k < op->output_count ? st_tensor_type_elements(&step->slots[op->outputs[k]].type) : in;
      const int64_t n = dk == ST_DIST_ALL_GATHER ? in * P : dk == ST_DIST_REDUCE_SCATTER ? out * P : in;
      const int64_t b = n * (int64_t)sizeof(float);
      bytes += b * nd;
      w += nd * st_dist_coll_bytes_sent(dk, (size_t)n, P);
      st_json_push(names_arr, st_json_str(step->slots[op->inputs[k]].name));
    }
    json_t* c = st_json_obj();
    st_json_put_int(c, "op", i);
    st_json_put_int(c, "layer", op->layer);
    st_json_put_str(c, "kind", kind);
    st_json_put_str(c, "axis", axis);
    st_json_put_int(c, "processes", P);
    st_json_put_int(c, "collectives_per_process", (int64_t)nd * op->input_count);
    st_json_put(c, "tensors", names_arr);
    st_json_put_int(c, "bytes_per_process", bytes);
    st_json_put_int(c, "wire_bytes_per_process", w);
    st_json_push(ops, c);
    st__tally_add(&tally, kind, bytes, w);
  }
  *out_comm = st__tally_json(&tally, "ops", "process", P);
  return ops;
}

/* Memory per device: the persistent state every step starts from, and the
 * categories at the predicted peak of the step and of an evaluation. */
static json_t* st__explain_memory(const st_plan* step, const st_plan* eval) {
  json_t* mem = st_json_obj();
  int64_t state[ST_SLOT_CATEGORY_COUNT] = {0};
  for (int i = 0; i < step->slot_count; ++i)
    if (step->slots[i].persistent && !step->slots[i].host)
      state[step->slots[i].category] += (int64_t)st_tensor_type_bytes(&step->slots[i].type);
  int64_t peak_cat[ST_SLOT_CATEGORY_COUNT];
  int64_t* live = st_xcalloc((size_t)step->op_count * ST_SLOT_CATEGORY_COUNT + 1, sizeof(int64_t));
  int64_t peak = st_plan_predict_live(step, live, peak_cat);
  /* Each category's own largest value over the step (the gathered window
   * under fsdp), which the categories at the peak need not show. */
  int64_t most[ST_SLOT_CATEGORY_COUNT];
  memcpy(most, state, sizeof(most));
  for (int i = 0; i < step->op_count; ++i)
    for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k)
      if (live[(size_t)i * ST_SLOT_CATEGORY_COUNT + (size_t)k] > most[k]) most[k] = live[(size_t)i * ST_SLOT_CATEGORY_COUNT + (size_t)k];
  free(live);
  int64_t eval_cat[ST_SLOT_CATEGORY_COUNT];
  int64_t eval_peak = st_plan_predict_live(eval, NULL, eval_cat);
  json_t* a = st_json_obj();
  json_t* b = st_json_obj();
  json_t* c = st_json_obj();
  json_t* d = st_json_obj();
  for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) {
    const char* name = st_slot_category_name((st_slot_category)k);
    st_json_put_int(a, name, state[k]);
    st_json_put_int(b, name, peak_cat[k]);
    st_json_put_int(c, name, eval_cat[k]);
    st_json_put_int(d, name, most[k]);
  }
  st_json_put(mem, "persistent_by_category", a);
  st_json_put_int(mem, "peak_bytes", peak);
  st_json_put(mem, "peak_by_category", b);
  st_json_put(mem, "max_by_category", d);
  st_json_put_int(mem, "eval_peak_bytes", eval_peak);
  st_json_put(mem, "eval_peak_by_category", c);
  st_json_put_int(mem, "host_bytes", st_plan_host_bytes(step));
  return mem;
}

/* A pipeline (docs/parallelism.md, "Pipeline"): each stage's devices, layers
 * and predicted peak by category, and the schedule's tasks with the times
 * its simulation predicted; the bubble next to its theory for equal
 * stages, (P-1) / (M+P-1), with V chunks per stage (P-1) / (V M + P-1). */
static json_t* st__explain_pipeline(const st_plan* step) {
  if (step->stages <= 1 || !step->pipe_tasks) return NULL;
  const int P = step->stages, C = step->pipe_chunks, V = C / P;
  int M = 0;
  double* busy = st_xcalloc((size_t)P, sizeof(double));
  json_t* tasks = st_json_arr();
  for (int k = 0; k < step->pipe_task_count; ++k) {
    const st_plan_pipe_task* t = &step->pipe_tasks[k];
    if (t->micro + 1 > M) M = t->micro + 1;
    busy[t->stage] += t->end - t->start;
    json_t* o = st_json_obj();
    st_json_put_int(o, "stage", t->stage);
    st_json_put_int(o, "chunk", t->chunk);
    st_json_put_int(o, "micro", t->micro);
    st_json_put_str(o, "pass", t->backward ? "backward" : "forward");
    st_json_put(o, "start", json_real(t->start));
    st_json_put(o, "end", json_real(t->end));
    st_json_push(tasks, o);
  }
  int64_t* peaks = st_xcalloc((size_t)P * ST_SLOT_CATEGORY_COUNT, sizeof(int64_t));
  st_plan_predict_stage_peaks(step, peaks);
  json_t* stages = st_json_arr();
  for (int st = 0; st < P; ++st) {
    json_t* o = st_json_obj();
    json_t* dev = st_json_arr();
    for (int d = 0; d < step->devices; ++d) st_json_push(dev, st_json_int(st * step->devices + d));
    st_json_put(o, "devices", dev);
    json_t* chunks = st_json_arr();
    for (int c = st; c < C; c += P) {
      json_t* r = st_json_arr();
      st_json_push(r, st_json_int(step->pipe_first[c]));
      st_json_push(r, st_json_int(step->pipe_first[c + 1] - 1));
      st_json_push(chunks, r);
    }
    st_json_put(o, "layers", chunks);
    st_json_put_bool(o, "embedding", st == 0);
    st_json_put_bool(o, "head", st == P - 1);
    json_t* pk = st_json_obj();
    for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k)
      st_json_put_int(pk, st_slot_category_name((st_slot_category)k), peaks[(size_t)st * ST_SLOT_CATEGORY_COUNT + (size_t)k]);
    st_json_put(o, "peak_by_category", pk);
    st_json_put(o, "predicted_busy", json_real(busy[st]));
    st_json_push(stages, o);
  }
  json_t* j = st_json_obj();
  st_json_put_int(j, "stages", P);
  st_json_put_int(j, "chunks_per_stage", V);
  st_json_put_int(j, "microbatches", M);
  st_json_put(j, "stage", stages);
  st_json_put(j, "tasks", tasks);
  double theory = 0, makespan = 0;
  const double bubble = st_plan_pipeline_bubble(step, &theory, &makespan);
  st_json_put(j, "predicted_makespan", json_real(makespan));
  st_json_put(j, "predicted_bubble", json_real(bubble));
  st_json_put(j, "theory_bubble", json_real(theory));
  free(busy);
  free(peaks);
  return j;
}

/* Every slot of the step plan is a tensor of the explanation, batch
 * tensors and scalars ("transfer") and host homes (memory "host")
 * included. */
json_t* st_plan_explain_json(const st_plan* step, const st_plan* eval, const st_plan_options* o) {
  json_t* j = st_json_obj();
  st_json_put(j, "mesh", st__explain_mesh(step, o));
  st_json_put(j, "policy", step->policy ? st_json_str(step->policy) : json_null());
  st_json_put(j, "tensors", st__explain_tensors(step));
  json_t* comm = NULL;
  st_json_put(j, "collectives", st__explain_collectives(step, &comm));
  st_json_put(j, "communication_per_step", comm);
  json_t* procs = st__explain_processes(step, o);
  if (procs) {
    /* Only in a job: one process's explanation stays as it was. */
    st_json_put(j, "processes", procs);
    json_t* xcomm = NULL;
    st_json_put(j, "cross_process", st__explain_xproc(step, o, &xcomm));
    st_json_put(j, "cross_process_per_step", xcomm);
  }
  st_json_put(j, "memory_per_device", st__explain_memory(step, eval));
  json_t* pipe = st__explain_pipeline(step);
  if (pipe) st_json_put(j, "pipeline", pipe); /* only a pipeline's explanation has one */
  return j;
}

/*===-------------------------------------------------------------------===*/
/* Text                                                                     */
/*===-------------------------------------------------------------------===*/

/* The grouping key of a tensor name: every number becomes '*', and
 * whatever follows a block's "layers.*." or a residual's "res[*]." too, so
 * a block's nine parameters (or eight residuals) of every layer are one
 * line. "grad:layers.1.wq" -> "grad:layers.*.*". */
static void st__pattern(const char* name, char* out, size_t n) {
  size_t k = 0;
  for (const char* p = name; *p && k + 1 < n; ++p) {
    if (isdigit((unsigned char)*p)) {
      out[k++] = '*';
      while (isdigit((unsigned char)p[1])) ++p;
    } else {
      out[k++] = *p;
    }
  }
  out[k] = '\0';
  const char* cut[2] = {"layers.*.", "res[*]."};
  for (int c = 0; c < 2; ++c) {
    char* at = strstr(out, cut[c]);
    if (at && (size_t)(at - out) + strlen(cut[c]) + 2 <= n) snprintf(at + strlen(cut[c]), 2, "*");
  }
}

typedef struct {
  char pattern[96];
  int category;
  bool host;
  char sharding[160];
  int count;
  int64_t bytes;
  char type[64]; /* the per-device type when every member has the same, else "" */
  bool mixed;
} st__group;

/* The FSDP categories only where they can be nonzero (as st_plan_print):
 * other meshes' tables stay as they were. */
static int st__columns(const st_plan* step) { return step->mesh[1] > 1 ? ST_SLOT_CATEGORY_COUNT : ST_SLOT_GATHERED; }

/* One row of the memory table; |total| false leaves the total column empty
 * (a row of per-category maxima, which never coexist). */
static void st__print_bytes_by_category(FILE* out, const char* what, const json_t* obj, int columns, bool total_col) {
  fprintf(out, "  %-26s", what);
  int64_t total = 0;
  for (int k = 0; k < columns; ++k) {
    int64_t v = json_integer_value(json_object_get(obj, st_slot_category_name((st_slot_category)k)));
    fprintf(out, " %12lld", (long long)v);
    total += v;
  }
  if (total_col)
    fprintf(out, " %12lld\n", (long long)total);
  else
    fprintf(out, "\n");
}

/* A job's line under the mesh's: the mesh above is one process's part. */
static void st__print_processes(const json_t* p, FILE* out) {
  const json_t* job = json_object_get(p, "job_mesh");
  const char* axis = json_string_value(json_object_get(p, "span_axis"));
  fprintf(out,
          "# processes: %lld; the job's mesh data=%lld fsdp=%lld tensor=%lld is %lld processes x %lld device%s; %s "
          "spans the processes (the outermost mesh axis above 1), so the mesh above is one process's part of it\n",
          (long long)json_integer_value(json_object_get(p, "count")),
          (long long)json_integer_value(json_object_get(job, "data")),
          (long long)json_integer_value(json_object_get(job, "fsdp")),
          (long long)json_integer_value(json_object_get(job, "tensor")),
          (long long)json_integer_value(json_object_get(p, "count")),
          (long long)json_integer_value(json_object_get(p, "devices_per_process")),
          json_integer_value(json_object_get(p, "devices_per_process")) == 1 ? "" : "s", axis);
}

/* The XPROC ops and their sums: what crosses processes each step. */
static void st__print_xproc(const json_t* j, FILE* out) {
  const json_t* ops = json_object_get(j, "cross_process");
  const json_t* comm = json_object_get(j, "cross_process_per_step");
  fprintf(out, "# cross-process ops, in plan order (bytes per process: the message, and what the MPI engine sends: "
               "an alltoall and an all-gather, 2(P-1)/P of an all-reduce's message)\n");
  if (json_array_size(ops) == 0) fprintf(out, "  none\n");
  for (size_t i = 0; i < json_array_size(ops); ++i) {
    const json_t* c = json_array_get(ops, i);
    const long long layer = (long long)json_integer_value(json_object_get(c, "layer"));
    const json_t* names = json_object_get(c, "tensors");
    char where[48];
    if (layer >= 0)
      snprintf(where, sizeof(where), "layer %lld", layer);
    else /* embed, head: the first tensor says which */
      snprintf(where, sizeof(where), "%s", json_array_size(names) ? json_string_value(json_array_get(names, 0)) : "?");
    fprintf(out, "  op %4lld %-18s %-14s over %-6s across %lld processes %3zu tensors %10lld B  sent %10lld B\n",
            (long long)json_integer_value(json_object_get(c, "op")), where, json_string_value(json_object_get(c, "kind")),
            json_string_value(json_object_get(c, "axis")), (long long)json_integer_value(json_object_get(c, "processes")),
            json_array_size(names), (long long)json_integer_value(json_object_get(c, "bytes_per_process")),
            (long long)json_integer_value(json_object_get(c, "wire_bytes_per_process")));
  }
  fprintf(out, "# across processes per step: %lld ops, %lld B per process (message), %lld B sent per process, %lld B "
               "over all processes\n",
          (long long)json_integer_value(json_object_get(comm, "ops")),
          (long long)json_integer_value(json_object_get(comm, "bytes_per_process")),
          (long long)json_integer_value(json_object_get(comm, "wire_bytes_per_process")),
          (long long)json_integer_value(json_object_get(comm, "wire_bytes_all_processes")));
  const char* kind;
  const json_t* v;
  json_object_foreach((json_t*)json_object_get(comm, "by_kind"), kind, v) {
    fprintf(out, "  %-15s %4lld ops %10lld B per process (message) %10lld B sent per process\n", kind,
            (long long)json_integer_value(json_object_get(v, "ops")),
            (long long)json_integer_value(json_object_get(v, "bytes_per_process")),
            (long long)json_integer_value(json_object_get(v, "wire_bytes_per_process")));
  }
}

/* The stage x time grid: each task drawn over its predicted time, "F3"
 * (microbatch 3's forward, padded with '-') or "B3" (backward, '='), '.'
 * idle; chunk c of an interleaved stage is told by its letter's case: the
 * first chunk's F/B, the next f/b, then F/B again. At most |width|
 * columns. */
static void st__print_pipeline_grid(const json_t* p, FILE* out, int width) {
  const json_t* tasks = json_object_get(p, "tasks");
  const int P = (int)json_integer_value(json_object_get(p, "stages"));
  const double span = json_real_value(json_object_get(p, "predicted_makespan"));
  double shortest = span;
  for (size_t k = 0; k < json_array_size(tasks); ++k) {
    const json_t* t = json_array_get(tasks, k);
    double d = json_real_value(json_object_get(t, "end")) - json_real_value(json_object_get(t, "start"));
    if (d > 0 && d < shortest) shortest = d;
  }
  /* A forward gets at least 3 columns ("F12") when the width allows. */
  double unit = shortest / 3;
  if (span / unit > width) unit = span / width;
  const int cols = (int)ceil(span / unit - 1e-9);
  char* row = st_xmalloc((size_t)cols + 1);
  for (int st = 0; st < P; ++st) {
    memset(row, '.', (size_t)cols);
    row[cols] = '\0';
    for (size_t k = 0; k < json_array_size(tasks); ++k) {
      const json_t* t = json_array_get(tasks, k);
      if (json_integer_value(json_object_get(t, "stage")) != st) continue;
      const bool bwd = !strcmp(json_string_value(json_object_get(t, "pass")), "backward");
      const bool odd = (json_integer_value(json_object_get(t, "chunk")) / P) % 2 == 1;
      int a = (int)floor(json_real_value(json_object_get(t, "start")) / unit + 1e-9);
      int b = (int)floor(json_real_value(json_object_get(t, "end")) / unit + 1e-9);
      if (b <= a) b = a + 1;
      if (b > cols) b = cols;
      char label[16];
      snprintf(label, sizeof(label), "%c%lld", bwd ? (odd ? 'b' : 'B') : (odd ? 'f' : 'F'),
               (long long)json_integer_value(json_object_get(t, "micro")));
      for (int x = a; x < b; ++x) row[x] = x - a < (int)strlen(label) ? label[x - a] : bwd ? '=' : '-';
    }
    fprintf(out, "  stage %-2d |%s|\n", st, row);
  }
  free(row);
}

static void st__print_pipeline(const json_t* p, FILE* out) {
  const json_t* stages = json_object_get(p, "stage");
  fprintf(out, "# pipeline: %lld stages x %lld chunk(s), %lld microbatches; per stage: devices, layers, predicted peak "
               "bytes per device (params/grads/optimizer/activations/transfer), predicted busy time\n",
          (long long)json_integer_value(json_object_get(p, "stages")),
          (long long)json_integer_value(json_object_get(p, "chunks_per_stage")),
          (long long)json_integer_value(json_object_get(p, "microbatches")));
  for (size_t st = 0; st < json_array_size(stages); ++st) {
    const json_t* s = json_array_get(stages, st);
    st_strbuf b = {0};
    const json_t* dev = json_object_get(s, "devices");
    for (size_t d = 0; d < json_array_size(dev); ++d)
      st_strbuf_printf(&b, "%s%lld", d ? "," : "", (long long)json_integer_value(json_array_get(dev, d)));
    st_strbuf_append(&b, "  layers");
    const json_t* ch = json_object_get(s, "layers");
    for (size_t c = 0; c < json_array_size(ch); ++c)
      st_strbuf_printf(&b, " %lld-%lld", (long long)json_integer_value(json_array_get(json_array_get(ch, c), 0)),
                       (long long)json_integer_value(json_array_get(json_array_get(ch, c), 1)));
    if (json_is_true(json_object_get(s, "embedding"))) st_strbuf_append(&b, " +embedding");
    if (json_is_true(json_object_get(s, "head"))) st_strbuf_append(&b, " +head");
    const json_t* pk = json_object_get(s, "peak_by_category");
    fprintf(out, "  stage %-2zu devices %s  peak %lld/%lld/%lld/%lld/%lld  busy %.4g\n", st, b.data,
            (long long)json_integer_value(json_object_get(pk, "params")),
            (long long)json_integer_value(json_object_get(pk, "grads")),
            (long long)json_integer_value(json_object_get(pk, "optimizer")),
            (long long)json_integer_value(json_object_get(pk, "activations")),
            (long long)json_integer_value(json_object_get(pk, "transfer")),
            json_real_value(json_object_get(s, "predicted_busy")));
    st_strbuf_free(&b);
  }
  fprintf(out, "# schedule, stage x predicted time (F3 / B3: microbatch 3's forward / backward; f, b: the next chunk "
               "of an interleaved stage; '.': idle)\n");
  st__print_pipeline_grid(p, out, 160);
  fprintf(out, "# predicted bubble %.4f (idle share of the stages' time over the step; theory for equal stages %.4f)\n",
          json_real_value(json_object_get(p, "predicted_bubble")), json_real_value(json_object_get(p, "theory_bubble")));
}

/* Tensors, grouped: one line per category, memory, sharding and name pattern. */
static void st__print_tensors(const st_plan* step, FILE* out) {
  st__group* g = st_xcalloc((size_t)step->slot_count + 1, sizeof(st__group));
  int ng = 0;
  for (int i = 0; i < step->slot_count; ++i) {
    const st_slot* s = &step->slots[i];
    char pat[96], t[64];
    st__pattern(s->name, pat, sizeof(pat));
    char sh[160];
    st__sharding(step, s, sh, sizeof(sh));
    st_tensor_type_format(&s->type, t, sizeof(t));
    int k = 0;
    while (k < ng && !(g[k].category == (int)s->category && g[k].host == s->host && strcmp(g[k].sharding, sh) == 0 &&
                       strcmp(g[k].pattern, pat) == 0))
      ++k;
    if (k == ng) {
      snprintf(g[k].pattern, sizeof(g[k].pattern), "%s", pat);
      g[k].category = (int)s->category;
      g[k].host = s->host;
      snprintf(g[k].sharding, sizeof(g[k].sharding), "%s", sh);
      snprintf(g[k].type, sizeof(g[k].type), "%s", t);
      ++ng;
    } else if (strcmp(g[k].type, t) != 0) {
      g[k].mixed = true;
    }
    g[k].count++;
    g[k].bytes += (int64_t)st_tensor_type_bytes(&s->type);
  }
  fprintf(out, "# tensors: %d (grouped: '*' is any number, 'layers.*.*' every block parameter of every layer, 'res[*].*' "
               "every residual; --json lists each)\n",
          step->slot_count);
  fprintf(out, "  %-12s %-6s %-24s %5s %12s  %-18s %s\n", "category", "memory", "tensors", "count", "bytes/device",
          "type/device", "sharding");
  for (int c = 0; c < ST_SLOT_CATEGORY_COUNT; ++c)
    for (int k = 0; k < ng; ++k) {
      if (g[k].category != c) continue;
      fprintf(out, "  %-12s %-6s %-24s %5d %12lld  %-18s %s\n", st_slot_category_name((st_slot_category)c),
              g[k].host ? "host" : "device", g[k].pattern, g[k].count, (long long)g[k].bytes, g[k].mixed ? "(various)" : g[k].type,
              g[k].sharding);
    }
  free(g);
}

void st_plan_explain_print(const st_plan* step, const json_t* j, FILE* out) {
  const json_t* mesh = json_object_get(j, "mesh");
  const int nd = (int)json_integer_value(json_object_get(mesh, "devices"));
  fprintf(out, "# mesh: data=%lld fsdp=%lld tensor=%lld: %d device%s (runtime device%s",
          (long long)json_integer_value(json_object_get(mesh, "data")),
          (long long)json_integer_value(json_object_get(mesh, "fsdp")),
          (long long)json_integer_value(json_object_get(mesh, "tensor")), nd, nd == 1 ? "" : "s", nd == 1 ? "" : "s");
  for (int d = 0; d < nd; ++d) fprintf(out, " %d", d);
  fprintf(out, ")");
  /* Each axis's groups, as st__groups listed them. */
  const json_t* groups = json_object_get(mesh, "groups");
  const char* axis;
  const json_t* list;
  json_object_foreach((json_t*)groups, axis, list) {
    fprintf(out, "; %s groups [", axis);
    for (size_t i = 0; i < json_array_size(list); ++i) {
      const json_t* one = json_array_get(list, i);
      fprintf(out, "%s[", i ? " " : "");
      for (size_t k = 0; k < json_array_size(one); ++k)
        fprintf(out, "%s%lld", k ? " " : "", (long long)json_integer_value(json_array_get(one, k)));
      fprintf(out, "]");
    }
    fprintf(out, "]");
  }
  if (step->stages > 1)
    fprintf(out, "; per pipeline stage: %d stages, each on a mesh of its own (%d devices in all)", step->stages,
            step->stages * nd);
  fprintf(out, "\n");
  const json_t* procs = json_object_get(j, "processes");
  if (procs) st__print_processes(procs, out);
  if (step->policy) fprintf(out, "# policy: %s\n", step->policy);

  st__print_tensors(step, out);
  if (step->mesh[1] > 1) {
    /* The zero rows a block carries (docs/parallelism.md, "Padding"). */
    int sharded = 0, padded = 0;
    int64_t pad_bytes = 0;
    for (int i = 0; i < step->slot_count; ++i) {
      const st_slot* s = &step->slots[i];
      if (s->layout != ST_LAYOUT_SHARDED || s->host) continue;
      ++sharded;
      int64_t rows = st__pad_rows(step, s);
      if (rows == 0) continue;
      ++padded;
      /* On the last device(s): every block holds ceil(d0 / fsdp) rows. */
      pad_bytes += rows * (int64_t)(st_tensor_type_bytes(&s->type) / (size_t)(s->type.dims[0] ? s->type.dims[0] : 1));
    }
    fprintf(out, "# fsdp blocks: dim 0 cut in ceil(d0 / %d) rows per device; %d of %d sharded tensors padded, %lld B of "
                 "zero rows over the fsdp group\n",
            step->mesh[1], padded, sharded, (long long)pad_bytes);
  }

  const json_t* colls = json_object_get(j, "collectives");
  const json_t* comm = json_object_get(j, "communication_per_step");
  fprintf(out, "# collectives per layer, in plan order (bytes per device: the message, and what a ring sends)\n");
  if (json_array_size(colls) == 0) fprintf(out, "  none: %s\n", nd == 1 ? "one device" : "no COLLECTIVE op in the plan");
  int kw = 10; /* "all_reduce"; wider when a reduce_scatter is listed */
  for (size_t i = 0; i < json_array_size(colls); ++i) {
    int n = (int)strlen(json_string_value(json_object_get(json_array_get(colls, i), "kind")));
    if (n > kw) kw = n;
  }
  for (size_t i = 0; i < json_array_size(colls); ++i) {
    const json_t* c = json_array_get(colls, i);
    long long layer = (long long)json_integer_value(json_object_get(c, "layer"));
    char where[32];
    const char* prog = json_string_value(json_object_get(c, "program"));
    if (layer >= 0)
      snprintf(where, sizeof(where), "layer %lld", layer);
    else /* embed, head: the group the exporter named the program after */
      snprintf(where, sizeof(where), "%.*s", (int)strcspn(prog, "_"), prog);
    fprintf(out, "  op %4lld %-9s %-26s %-*s over %-6s %3zu tensors %10lld B  wire %10lld B\n",
            (long long)json_integer_value(json_object_get(c, "op")), where, prog, kw, json_string_value(json_object_get(c, "kind")),
            json_string_value(json_object_get(c, "axis")), json_array_size(json_object_get(c, "tensors")),
            (long long)json_integer_value(json_object_get(c, "bytes_per_device")),
            (long long)json_integer_value(json_object_get(c, "wire_bytes_per_device")));
  }
  fprintf(out, "# communication per step: %lld collectives, %lld B per device (message), %lld B sent per device, %lld B "
               "over all devices\n",
          (long long)json_integer_value(json_object_get(comm, "collectives")),
          (long long)json_integer_value(json_object_get(comm, "bytes_per_device")),
          (long long)json_integer_value(json_object_get(comm, "wire_bytes_per_device")),
          (long long)json_integer_value(json_object_get(comm, "wire_bytes_all_devices")));
  const json_t* by_kind = json_object_get(comm, "by_kind");
  if (json_object_size(by_kind) > 1) {
    const char* kind;
    const json_t* v;
    json_object_foreach((json_t*)by_kind, kind, v) {
      fprintf(out, "  %-15s %4lld collectives %10lld B per device (message) %10lld B sent per device\n", kind,
              (long long)json_integer_value(json_object_get(v, "collectives")),
              (long long)json_integer_value(json_object_get(v, "bytes_per_device")),
              (long long)json_integer_value(json_object_get(v, "wire_bytes_per_device")));
    }
  }

  if (procs) st__print_xproc(j, out);

  const json_t* mem = json_object_get(j, "memory_per_device");
  fprintf(out, "# predicted memory per device, bytes\n");
  fprintf(out, "  %-26s", "");
  const int cols = st__columns(step);
  for (int k = 0; k < cols; ++k) fprintf(out, " %12s", st_slot_category_name((st_slot_category)k));
  fprintf(out, " %12s\n", "total");
  st__print_bytes_by_category(out, "persistent state", json_object_get(mem, "persistent_by_category"), cols, true);
  st__print_bytes_by_category(out, "training step peak", json_object_get(mem, "peak_by_category"), cols, true);
  st__print_bytes_by_category(out, "evaluation peak", json_object_get(mem, "eval_peak_by_category"), cols, true);
  /* Under fsdp the gathered window and the unreduced gradients peak at
   * other ops than the total does. */
  if (cols > ST_SLOT_GATHERED)
    st__print_bytes_by_category(out, "largest in the step", json_object_get(mem, "max_by_category"), cols, false);
  fprintf(out, "  host memory (offloaded homes): %lld\n", (long long)json_integer_value(json_object_get(mem, "host_bytes")));
  const json_t* pipe = json_object_get(j, "pipeline");
  if (pipe) st__print_pipeline(pipe, out);
}
