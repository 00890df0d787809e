/* executor.c — runs a plan: issues every op in plan order without blocking,
 * blocks the host only in WAIT and READ ops, timestamps every op (PJRT
 * completion callbacks for device work), and accounts live device bytes by
 * category exactly as st_plan_predict_live predicts. */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched/sched_internal.h"
#include "strata/base.h"
#include "strata/dist.h"
#include "strata/mesh.h"
#include "strata/obs.h"
#include "strata/sched.h"

typedef struct {
  struct st_executor* ex;
  int op;
  int d; /* device index */
} st__cb;

/* One device index's part of an XPROC op on one (input, output) pair: the
 * input's buffer is copied into |host|, handed to the job's collective
 * engine, and the output's part of the result (from element |out_at|) is
 * put into the output by st__xp_settle once the first consumer needs it.
 * In place (an all-reduce) the slot keeps the old buffer until then (the
 * copy reads it); out of place a FREE of the input while the copy may
 * still read it hands the buffer to |held|, freed at the settle. */
typedef struct st__xp {
  int op;
  int in_slot, out_slot;
  st_event* copied; /* the device-to-host copy into |host| */
  float* host;      /* |count| floats: the whole the engine works on */
  size_t count, out_at;
  st_buffer* held;
  st_dist_coll* coll;
} st__xp;

struct st_executor {
  const st_plan* plan;
  st_runtime* runtime;
  st_program* const* programs;
  /* Runtime device of stage 0's data-parallel index 0: stage s's index d
   * runs on device + s * ndev + d (st__dev). */
  int device;
  int ndev;   /* plan->devices: buffers per device slot */
  int stages; /* plan->stages, at least 1 */
  char device_kind[32]; /* the device's default memory space */
  char host_kind[32];   /* where host slots live; "" when the plan has none */
  st_buffer** slots;    /* [slot_count * ndev] (slot-major), owned unless borrowed[] */
  bool* borrowed;
  st_executor_stats stats;
  /* Device bytes live now per stage and category (one device index of the
   * stage); stats.live_bytes is their sum over the stages. */
  int64_t stage_live[ST_PLAN_MAX_STAGES][ST_SLOT_CATEGORY_COUNT];
  /* scratch arrays sized for the widest op */
  st_buffer** in;
  st_buffer** out;

  /* the last run */
  st_op_timing* timings; /* [op_count] */
  st_event** events;     /* [op_count * ndev]: completion of each async op on each device, NULL otherwise */
  st__cb* cbs;           /* [op_count * ndev]: callback contexts */
  /* A SEND of k slots makes k copies per device index: the first's
   * completion is events[], the others' here, at sub_first[op] + (j - 1) *
   * ndev + d for input j >= 1. parts[op * ndev + d]: completions of that
   * SEND still to come before the monitor hears it is done (0: one). */
  st_event** sub_events;
  st__cb* sub_cbs;
  int* sub_first; /* [op_count] */
  int* parts;     /* [op_count * ndev] */
  /* Per device index (op-major, [op_count * ndev]): when the host issued
   * the op's work for that device, when that device's part completed, and
   * the estimated start (st__derive). The per-device trace tracks use them;
   * the op-level timings are their hull. */
  double* dev_issue;
  double* dev_start;
  double* dev_complete;
  int64_t* temps;        /* [program_count]: XLA's temporaries of each program per device */
  int64_t* live_pred;    /* [op_count * categories] */
  int64_t* live_acct;
  double t0;

  /* Completion callbacks run on plugin threads: they write timings[i].
   * complete_s and count down |pending| under |mu|. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool skip_launches; /* st_executor_skip_launches: this run issues no more programs */
  const st_executor_hooks* hooks; /* of the run in progress (borrowed) */
  int pending;
  st_executor_monitor monitor; /* zero: none */
  st_status cb_error; /* first error reported by a callback */

  st_dist* dist;  /* XPROC ops' job (borrowed); NULL: none */
  st__xp** xp;    /* [slot_count * ndev]: the XPROC op in flight into that output slot, NULL: none */
  st__xp** xpin;  /* [slot_count * ndev]: an out-of-place XPROC op whose copy may still read that input slot */
  int* xp_left;   /* [op_count]: parts of that XPROC op not yet settled */
};

static bool st__is_program_op(st_op_kind k) {
  return k == ST_OP_LAUNCH || k == ST_OP_RECOMPUTE || k == ST_OP_COLLECTIVE;
}

static const char* st__op_program(const st_executor* ex, const st_op* op) {
  return st__is_program_op(op->kind) ? ex->plan->programs[op->program] : st_op_kind_name(op->kind);
}

/* The buffer of |slot| on data-parallel index |d|. */
#define ST__SLOT(ex, slot, d) ((ex)->slots[(size_t)(slot) * (size_t)(ex)->ndev + (size_t)(d)])
#define ST__BORROWED(ex, slot, d) ((ex)->borrowed[(size_t)(slot) * (size_t)(ex)->ndev + (size_t)(d)])
#define ST__XP(ex, slot, d) ((ex)->xp[(size_t)(slot) * (size_t)(ex)->ndev + (size_t)(d)])
#define ST__XPIN(ex, slot, d) ((ex)->xpin[(size_t)(slot) * (size_t)(ex)->ndev + (size_t)(d)])

/* Every program op's compiled program fits the plan: SPMD programs run on
 * the devices of the stage they were compiled for, in index order; outputs,
 * inputs and donations as the plan has them. */
static st_status st__exec_check_programs(const st_plan* plan, st_program* const* programs, int device, int ndev) {
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    if (!st__is_program_op(op->kind)) continue;
    const char* name = plan->programs[op->program];
    st_program* p = programs[op->program];
    if (!p) return st_status_make(ST_CODE_INTERNAL, "plan op %d: program '%s' is not compiled", i, name);
    /* A collective runs on every device at once, partition p on index p;
     * a compute program is a one-device program launched on each device,
     * or (tensor parallelism) an SPMD program over all of them. */
    if (op->kind == ST_OP_COLLECTIVE || st_program_device_count(p) > 1) {
      if (st_program_device_count(p) != ndev)
        return st_status_make(ST_CODE_RUNTIME, "plan op %d: %s '%s' runs on %d devices, the plan has %d", i,
                              op->kind == ST_OP_COLLECTIVE ? "collective" : "SPMD program", name,
                              st_program_device_count(p), ndev);
      const int stage = st_plan_program_stage(plan, op->program), base = device + stage * ndev;
      for (int d = 0; d < ndev; ++d) {
        if (st_program_partition_device(p, d) == base + d) continue;
        if (plan->stages > 1)
          return st_status_make(ST_CODE_RUNTIME,
                                "plan op %d: SPMD program '%s' of pipeline stage %d runs partition %d on device %d; stage %d "
                                "runs on devices %d..%d (compile it for that stage's devices)",
                                i, name, stage, d, st_program_partition_device(p, d), stage, base, base + ndev - 1);
        return st_status_make(ST_CODE_RUNTIME, "plan op %d: collective '%s' runs partition %d on device %d, the plan on %d", i,
                              name, d, st_program_partition_device(p, d), base + d);
      }
    }
    if (st_program_output_count(p) != op->output_count)
      return st_status_make(ST_CODE_RUNTIME, "plan op %d: program '%s' has %d outputs, the plan expects %d", i, name,
                            st_program_output_count(p), op->output_count);
    if (st_program_input_count(p) >= 0 && st_program_input_count(p) != op->input_count)
      return st_status_make(ST_CODE_RUNTIME, "plan op %d: program '%s' has %d inputs, the plan passes %d", i, name,
                            st_program_input_count(p), op->input_count);
    /* Liveness prediction relies on a donated slot being refilled by the
     * op that consumed it; a plan that breaks this would be mis-accounted. */
    for (int j = 0; j < op->input_count; ++j) {
      if (!st_program_input_donated(p, j)) continue;
      bool refilled = false;
      for (int k = 0; k < op->output_count; ++k) refilled |= op->outputs[k] == op->inputs[j];
      if (!refilled)
        return st_status_make(ST_CODE_INTERNAL, "plan op %d: program '%s' donates input %d (slot '%s') but does not refill it", i,
                              name, j, plan->slots[op->inputs[j]].name);
    }
  }
  return ST_OK;
}

/* The stages: each slot and op on one of the plan's, and the runtime has
 * every stage's devices. */
static st_status st__exec_check_stages(const st_plan* plan, st_runtime* runtime, int device, int ndev) {
  const int stages = plan->stages > 1 ? plan->stages : 1;
  if (stages > ST_PLAN_MAX_STAGES)
    return st_status_make(ST_CODE_INTERNAL, "plan: %d pipeline stages, more than the %d the executor runs", stages,
                          ST_PLAN_MAX_STAGES);
  for (int i = 0; i < plan->slot_count; ++i)
    if (plan->slots[i].stage < 0 || plan->slots[i].stage >= stages)
      return st_status_make(ST_CODE_INTERNAL, "plan: slot '%s' is on stage %d, the plan has %d", plan->slots[i].name,
                            plan->slots[i].stage, stages);
  for (int i = 0; i < plan->op_count; ++i)
    if (plan->ops[i].stage < 0 || plan->ops[i].stage >= stages)
      return st_status_make(ST_CODE_INTERNAL, "plan op %d is on stage %d, the plan has %d", i, plan->ops[i].stage, stages);
  st_runtime_info info;
  st_runtime_get_info(runtime, &info);
  const int need = device + stages * ndev;
  if (device < 0 || need > info.device_count) {
    if (stages > 1)
      return st_status_make(ST_CODE_RUNTIME,
                            "the plan's %d pipeline stages of %d device(s) each need runtime devices %d..%d; the runtime has "
                            "%d (runtime.cpu_devices sets how many on the CPU plugin)",
                            stages, ndev, device, need - 1, info.device_count);
    for (int d = 0; d < ndev; ++d)
      ST_RETURN_IF_ERROR(st_runtime_device_info(runtime, device + d, &(st_device_info){0}), "data-parallel index %d of %d", d,
                         ndev);
  }
  return ST_OK;
}

/* The host memory space host slots live in (|out| "" when the plan has
 * none): on every device of a stage that has host slots. */
static st_status st__exec_host_kind(const st_plan* plan, st_runtime* runtime, int device, int ndev, char* out, size_t size) {
  out[0] = '\0';
  bool has[ST_PLAN_MAX_STAGES] = {false}, any = false;
  for (int i = 0; i < plan->slot_count; ++i)
    if (plan->slots[i].host) has[plan->slots[i].stage] = any = true;
  if (!any) return ST_OK;
  const char* prefs[2] = {"pinned_host", "unpinned_host"};
  for (int k = 0; k < 2 && !out[0]; ++k)
    if (st_runtime_can_copy_to_memory(runtime, device, prefs[k])) snprintf(out, size, "%s", prefs[k]);
  if (!out[0]) {
    st_device_info di;
    ST_RETURN(st_runtime_device_info(runtime, device, &di));
    char kinds[256] = "";
    for (int k = 0; k < di.memory_count; ++k)
      snprintf(kinds + strlen(kinds), sizeof(kinds) - strlen(kinds), "%s%s", k ? ", " : "", di.memory_kinds[k]);
    return st_status_make(ST_CODE_RUNTIME,
                          "sched.offload needs a host memory space (pinned_host or unpinned_host) that the plugin can copy "
                          "into; device %d has: %s. Set sched.offload=none",
                          device, kinds[0] ? kinds : "none listed");
  }
  const int stages = plan->stages > 1 ? plan->stages : 1;
  for (int s = 0; s < stages; ++s)
    for (int d = 0; has[s] && d < ndev; ++d)
      if (!st_runtime_can_copy_to_memory(runtime, device + s * ndev + d, out))
        return st_status_make(ST_CODE_RUNTIME, "sched.offload: device %d (stage %d) has no '%s' memory space, device %d has",
                              device + s * ndev + d, s, out, device);
  return ST_OK;
}

st_status st_executor_create(const st_plan* plan, st_runtime* runtime, st_program* const* programs, int device,
                             st_executor** out_executor) {
  *out_executor = NULL;
  int widest = 1;
  for (int i = 0; i < plan->op_count; ++i) {
    if (plan->ops[i].input_count > widest) widest = plan->ops[i].input_count;
    if (plan->ops[i].output_count > widest) widest = plan->ops[i].output_count;
  }
  const int ndev = plan->devices > 1 ? plan->devices : 1;
  if (ndev > ST_MESH_MAX_DEVICES)
    return st_status_make(ST_CODE_INTERNAL, "plan: %d devices, more than the %d a mesh has", ndev, ST_MESH_MAX_DEVICES);
  ST_RETURN(st__exec_check_stages(plan, runtime, device, ndev));
  ST_RETURN(st__exec_check_programs(plan, programs, device, ndev));
  st_device_info di;
  ST_RETURN(st_runtime_device_info(runtime, device, &di));
  char host_kind[32];
  ST_RETURN(st__exec_host_kind(plan, runtime, device, ndev, host_kind, sizeof(host_kind)));
  st_executor* ex = st_xcalloc(1, sizeof(*ex));
  ex->plan = plan;
  ex->runtime = runtime;
  ex->programs = programs;
  ex->device = device;
  ex->ndev = ndev;
  ex->stages = plan->stages > 1 ? plan->stages : 1;
  snprintf(ex->device_kind, sizeof(ex->device_kind), "%s",
           di.default_memory < di.memory_count ? di.memory_kinds[di.default_memory] : "device");
  snprintf(ex->host_kind, sizeof(ex->host_kind), "%s", host_kind);
  ex->slots = st_xcalloc(((size_t)plan->slot_count + 1) * (size_t)ndev, sizeof(st_buffer*));
  ex->borrowed = st_xcalloc(((size_t)plan->slot_count + 1) * (size_t)ndev, sizeof(bool));
  ex->xp = st_xcalloc(((size_t)plan->slot_count + 1) * (size_t)ndev, sizeof(st__xp*));
  ex->xpin = st_xcalloc(((size_t)plan->slot_count + 1) * (size_t)ndev, sizeof(st__xp*));
  ex->xp_left = st_xcalloc((size_t)plan->op_count + 1, sizeof(int));
  ex->in = st_xcalloc((size_t)widest * (size_t)ndev, sizeof(st_buffer*));
  ex->out = st_xcalloc((size_t)widest * (size_t)ndev, sizeof(st_buffer*));
  size_t n = (size_t)plan->op_count + 1;
  ex->timings = st_xcalloc(n, sizeof(st_op_timing));
  ex->events = st_xcalloc(n * (size_t)ndev, sizeof(st_event*));
  ex->cbs = st_xcalloc(n * (size_t)ndev, sizeof(st__cb));
  ex->sub_first = st_xcalloc(n, sizeof(int));
  ex->parts = st_xcalloc(n * (size_t)ndev, sizeof(int));
  size_t subs = 0;
  for (int i = 0; i < plan->op_count; ++i) {
    ex->sub_first[i] = (int)subs;
    if (plan->ops[i].kind == ST_OP_SEND && plan->ops[i].input_count > 1)
      subs += (size_t)(plan->ops[i].input_count - 1) * (size_t)ndev;
  }
  ex->sub_first[plan->op_count] = (int)subs;
  ex->sub_events = st_xcalloc(subs + 1, sizeof(st_event*));
  ex->sub_cbs = st_xcalloc(subs + 1, sizeof(st__cb));
  ex->dev_issue = st_xcalloc(n * (size_t)ndev, sizeof(double));
  ex->dev_start = st_xcalloc(n * (size_t)ndev, sizeof(double));
  ex->dev_complete = st_xcalloc(n * (size_t)ndev, sizeof(double));
  ex->live_pred = st_xcalloc(n * ST_SLOT_CATEGORY_COUNT, sizeof(int64_t));
  ex->live_acct = st_xcalloc(n * ST_SLOT_CATEGORY_COUNT, sizeof(int64_t));
  ex->stats.predicted_peak_bytes = st_plan_predict_live(plan, ex->live_pred, ex->stats.predicted_peak_by_category);
  ex->temps = st_plan_temps_of_programs(plan, programs, NULL);
  ex->stats.predicted_peak_with_temps_bytes = st_plan_predict_with_temps(plan, ex->temps, NULL);
  ex->stats.stages = ex->stages;
  pthread_mutex_init(&ex->mu, NULL);
  pthread_cond_init(&ex->cv, NULL);
  *out_executor = ex;
  return ST_OK;
}

/* Blocks until every registered completion callback has run. */
static void st__drain(st_executor* ex) {
  pthread_mutex_lock(&ex->mu);
  while (ex->pending > 0) pthread_cond_wait(&ex->cv, &ex->mu);
  pthread_mutex_unlock(&ex->mu);
}

static void st__events_free(st_executor* ex) {
  for (int i = 0; i < ex->plan->op_count * ex->ndev; ++i) {
    st_event_destroy(ex->events[i]);
    ex->events[i] = NULL;
  }
  const int subs = ex->sub_first[ex->plan->op_count];
  for (int i = 0; i < subs; ++i) {
    st_event_destroy(ex->sub_events[i]);
    ex->sub_events[i] = NULL;
  }
}

static st_status st__xp_settle_all(st_executor* ex);

void st_executor_destroy(st_executor* ex) {
  if (!ex) return;
  st_status_free(st__xp_settle_all(ex)); /* the engine writes into their host copies */
  st__drain(ex);
  st__events_free(ex);
  st_status_free(ex->cb_error);
  for (int i = 0; i < ex->plan->slot_count * ex->ndev; ++i)
    if (!ex->borrowed[i]) st_buffer_destroy(ex->slots[i]);
  pthread_mutex_destroy(&ex->mu);
  pthread_cond_destroy(&ex->cv);
  free(ex->slots);
  free(ex->borrowed);
  free(ex->xp);
  free(ex->xpin);
  free(ex->xp_left);
  free(ex->in);
  free(ex->out);
  free(ex->timings);
  free(ex->events);
  free(ex->cbs);
  free(ex->sub_events);
  free(ex->sub_cbs);
  free(ex->sub_first);
  free(ex->parts);
  free(ex->dev_issue);
  free(ex->dev_start);
  free(ex->dev_complete);
  free(ex->live_pred);
  free(ex->temps);
  free(ex->live_acct);
  free(ex);
}

const char* st_executor_host_memory(const st_executor* ex) { return ex->host_kind; }

void st_executor_set_dist(st_executor* ex, st_dist* dist) { ex->dist = dist; }

void st_executor_set_monitor(st_executor* ex, const st_executor_monitor* m) {
  if (m)
    ex->monitor = *m;
  else
    memset(&ex->monitor, 0, sizeof(ex->monitor));
}

static void st__exec_mon_issue(st_executor* ex, int op, int d) {
  if (ex->monitor.issue) ex->monitor.issue(ex->monitor.user, op, d);
}

/*===-------------------------------------------------------------------===*/
/* Slots                                                                    */
/*===-------------------------------------------------------------------===*/

/* The runtime device of device index |d| of pipeline stage |stage|. */
static int st__dev(const st_executor* ex, int stage, int d) { return ex->device + stage * ex->ndev + d; }

/* ... and of |slot|'s buffer on index |d| (a host slot: its device's). */
static int st__slot_dev(const st_executor* ex, int slot, int d) { return st__dev(ex, ex->plan->slots[slot].stage, d); }

static void st__account(st_executor* ex, int slot, int sign) {
  const st_slot* s = &ex->plan->slots[slot];
  int64_t bytes = sign * (int64_t)st_tensor_type_bytes(&s->type);
  if (s->host) {
    ex->stats.host_bytes += bytes;
  } else {
    ex->stats.live_bytes[s->category] += bytes;
    ex->stage_live[s->stage][s->category] += bytes;
  }
}

/* Live bytes are accounted per device: every device of a stage holds the
 * same slots (data parallelism), so index 0 stands for each of them; a
 * pipeline's stages apart (stage_live). */
static void st__slot_put(st_executor* ex, int slot, int d, st_buffer* buffer) {
  if (ST__SLOT(ex, slot, d) && d == 0) st__account(ex, slot, -1);
  if (!ST__BORROWED(ex, slot, d)) st_buffer_destroy(ST__SLOT(ex, slot, d));
  ST__SLOT(ex, slot, d) = buffer;
  ST__BORROWED(ex, slot, d) = false;
  if (buffer && d == 0) st__account(ex, slot, +1);
}

static st_status st__put_one(st_executor* ex, int slot, int target, int d, st_buffer* buffer) {
  const st_slot* s = &ex->plan->slots[slot];
  if (buffer && ex->plan->slots[target].host && strcmp(st_buffer_memory_kind(buffer), ex->host_kind) != 0) {
    st_buffer* h = NULL;
    st_status st = st_buffer_copy_to_memory(buffer, ex->host_kind, &h);
    st_buffer_destroy(buffer);
    if (st) {
      st__slot_put(ex, target, d, NULL);
      return st_status_annotate(st, "moving slot '%s' to its home in %s memory", s->name, ex->host_kind);
    }
    buffer = h;
  }
  st__slot_put(ex, target, d, buffer);
  return ST_OK;
}

/* The plan's mesh on stage |stage|'s devices (index p on st__dev(stage, p)). */
static st_status st__mesh(const st_executor* ex, int stage, st_mesh* out) {
  static const char* const names[3] = {"data", "fsdp", "tensor"};
  int devices[ST_MESH_MAX_DEVICES];
  for (int d = 0; d < ex->ndev; ++d) devices[d] = st__dev(ex, stage, d);
  ST_RETURN(st_mesh_make(3, names, ex->plan->mesh, devices, out));
  if (out->device_count != ex->ndev)
    return st_status_make(ST_CODE_INTERNAL, "plan: mesh %dx%dx%d is not its %d devices", ex->plan->mesh[0],
                          ex->plan->mesh[1], ex->plan->mesh[2], ex->ndev);
  return ST_OK;
}

/* A sharded slot gets the logical value |buffer| (consumed) cut into each
 * device's zero-padded block. */
static st_status st__put_sharded(st_executor* ex, int slot, int target, st_buffer* buffer) {
  const st_slot* s = &ex->plan->slots[slot];
  size_t n = st_buffer_bytes(buffer);
  if (n != st_tensor_type_bytes(&s->logical)) {
    st_buffer_destroy(buffer);
    return st_status_make(ST_CODE_INTERNAL, "sharded slot '%s': value of %zu bytes, the tensor has %zu", s->name, n,
                          st_tensor_type_bytes(&s->logical));
  }
  void* host = st_xmalloc(n ? n : 1);
  st_status st = st_buffer_to_host(buffer, host, n);
  st_buffer_destroy(buffer);
  st_mesh mesh;
  st_sharded* sh = NULL;
  if (!st) st = st__mesh(ex, s->stage, &mesh);
  if (!st) st = st_sharded_from_host(ex->runtime, &mesh, &s->logical, &s->sharding, host, &sh);
  free(host);
  if (st) return st_status_annotate(st, "sharding slot '%s' over %d devices", s->name, ex->ndev);
  st_buffer* shards[ST_MESH_MAX_DEVICES];
  st_sharded_release(sh, shards);
  for (int d = 0; d < ex->ndev; ++d) {
    st_status e = st__put_one(ex, slot, target, d, shards[d]);
    st = st_status_join(st, e);
  }
  return st;
}

/* A slot cut across processes (st_slot.xblocks): each device's whole
 * (|xwhole|: on several devices a sharded slot's shard of the logical
 * value) is |wholes| + d * bytes(xwhole) on the host. */
static st_status st__xcut_wholes(st_executor* ex, int slot, const void* value, unsigned char* wholes) {
  const st_slot* s = &ex->plan->slots[slot];
  const size_t wb = st_tensor_type_bytes(&s->xwhole);
  if (ex->ndev == 1 || s->layout != ST_LAYOUT_SHARDED) {
    for (int d = 0; d < ex->ndev; ++d) memcpy(wholes + (size_t)d * wb, value, wb);
    return ST_OK;
  }
  st_mesh mesh;
  st_sharded* sh = NULL;
  ST_RETURN(st__mesh(ex, s->stage, &mesh));
  ST_RETURN(st_sharded_from_host(ex->runtime, &mesh, &s->logical, &s->sharding, value, &sh));
  st_buffer* shards[ST_MESH_MAX_DEVICES];
  st_sharded_release(sh, shards);
  st_status st = ST_OK;
  for (int d = 0; d < ex->ndev; ++d) {
    if (!st && st_buffer_bytes(shards[d]) != wb)
      st = st_status_make(ST_CODE_INTERNAL, "slot '%s': a device's shard is %zu bytes, its whole %zu", s->name,
                          st_buffer_bytes(shards[d]), wb);
    if (!st) st = st_buffer_to_host(shards[d], wholes + (size_t)d * wb, wb);
    st_buffer_destroy(shards[d]);
  }
  return st;
}

/* The whole value |buffer| (consumed) into a slot cut across processes:
 * each device keeps rows [rank * b, (rank + 1) * b) of its whole, b its
 * block's rows, zero-padded past the end. */
static st_status st__put_xcut(st_executor* ex, int slot, int target, st_buffer* buffer) {
  const st_slot* s = &ex->plan->slots[slot];
  const bool sharded = ex->ndev > 1 && s->layout == ST_LAYOUT_SHARDED;
  const size_t n = st_buffer_bytes(buffer), want = st_tensor_type_bytes(sharded ? &s->logical : &s->xwhole);
  const size_t wb = st_tensor_type_bytes(&s->xwhole), bb = st_tensor_type_bytes(&s->type);
  if (!ex->dist || n != want || s->xwhole.rank < 1 || s->xwhole.dims[0] < 1) {
    st_buffer_destroy(buffer);
    return st_status_make(ST_CODE_INTERNAL, "slot '%s' cut across processes: value of %zu bytes, the tensor has %zu%s", s->name,
                          n, want, ex->dist ? "" : ", and the executor has no job (st_executor_set_dist)");
  }
  unsigned char* value = st_xmalloc(n ? n : 1);
  unsigned char* wholes = st_xmalloc(wb * (size_t)ex->ndev + 1);
  unsigned char* block = st_xmalloc(bb ? bb : 1);
  st_status st = st_buffer_to_host(buffer, value, n);
  st_buffer_destroy(buffer);
  if (!st) st = st__xcut_wholes(ex, slot, value, wholes);
  const size_t from = (size_t)st_dist_rank(ex->dist) * bb;
  for (int d = 0; d < ex->ndev && !st; ++d) {
    memset(block, 0, bb);
    if (from < wb) memcpy(block, wholes + (size_t)d * wb + from, wb - from < bb ? wb - from : bb);
    st_buffer* b = NULL;
    st = st_buffer_from_host(ex->runtime, st__slot_dev(ex, slot, d), &s->type, block, &b);
    if (!st) st = st__put_one(ex, slot, target, d, b);
  }
  free(block);
  free(wholes);
  free(value);
  return st ? st_status_annotate(st, "cutting slot '%s' across %d processes", s->name, s->xblocks) : ST_OK;
}

/* Every process's blocks of a slot cut across processes, gathered into
 * the whole (a collective: every rank calls it for the same slots in the
 * same order). */
static st_status st__to_host_xcut(st_executor* ex, int slot, void* dst, size_t size) {
  const st_slot* s = &ex->plan->slots[slot];
  if (!ex->dist) return st_status_make(ST_CODE_INTERNAL, "slot '%s' is cut across processes, the executor has no job", s->name);
  const size_t P = (size_t)st_dist_size(ex->dist), rank = (size_t)st_dist_rank(ex->dist);
  const size_t bn = (size_t)st_tensor_type_elements(&s->type), wb = st_tensor_type_bytes(&s->xwhole);
  const bool sharded = ex->ndev > 1 && s->layout == ST_LAYOUT_SHARDED;
  float* all = st_xcalloc(bn * P + 1, sizeof(float));
  st_buffer* wholes[ST_MESH_MAX_DEVICES] = {0};
  st_status st = ST_OK;
  for (int d = 0; d < ex->ndev && !st; ++d) {
    st_buffer* b = st_executor_get_device(ex, slot, d);
    if (!b) st = st_status_make(ST_CODE_INTERNAL, "slot '%s' is empty on device index %d", s->name, d);
    if (!st) st = st_buffer_to_host(b, all + rank * bn, bn * sizeof(float));
    st_dist_coll* c = NULL;
    st_dist_coll_request req = {.kind = ST_DIST_ALL_GATHER, .data = all, .count = bn * P, .name = s->name};
    if (!st) st = st_dist_coll_start(ex->dist, &req, &c);
    if (!st) st = st_dist_coll_wait(c, NULL);
    if (!st && !sharded && d == 0) {
      /* replicated over this process's devices: index 0's is the value */
      if (size != wb) st = st_status_make(ST_CODE_INTERNAL, "slot '%s' holds %zu bytes whole, the destination %zu", s->name, wb, size);
      else memcpy(dst, all, wb);
    } else if (!st && sharded) {
      st = st_buffer_from_host(ex->runtime, st__slot_dev(ex, slot, d), &s->xwhole, all, &wholes[d]);
    }
  }
  if (!st && sharded) {
    st_mesh mesh;
    st = st__mesh(ex, s->stage, &mesh);
    if (!st) st = st_sharding_to_host(&mesh, &s->logical, &s->sharding, wholes, dst, size);
  }
  for (int d = 0; d < ex->ndev; ++d) st_buffer_destroy(wholes[d]);
  free(all);
  return st ? st_status_annotate(st, "gathering slot '%s' from %zu processes", s->name, P) : ST_OK;
}

st_status st_executor_to_host(st_executor* ex, int slot, void* dst, size_t size) {
  const st_slot* s = &ex->plan->slots[slot];
  if (s->xblocks > 1) return st__to_host_xcut(ex, slot, dst, size);
  if (ex->ndev > 1 && s->layout == ST_LAYOUT_SHARDED) {
    st_buffer* shards[ST_MESH_MAX_DEVICES];
    for (int d = 0; d < ex->ndev; ++d) {
      shards[d] = st_executor_get_device(ex, slot, d);
      if (!shards[d]) return st_status_make(ST_CODE_INTERNAL, "slot '%s' is empty on device index %d", s->name, d);
    }
    st_mesh mesh;
    ST_RETURN(st__mesh(ex, s->stage, &mesh));
    return st_sharding_to_host(&mesh, &s->logical, &s->sharding, shards, dst, size);
  }
  st_buffer* b = st_executor_get(ex, slot);
  if (!b) return st_status_make(ST_CODE_INTERNAL, "slot '%s' is empty", s->name);
  if (st_buffer_bytes(b) != size)
    return st_status_make(ST_CODE_INTERNAL, "slot '%s' holds %zu bytes, the destination %zu", s->name, st_buffer_bytes(b), size);
  return st_buffer_to_host(b, dst, size);
}

st_status st_executor_put(st_executor* ex, int slot, st_buffer* buffer) {
  const st_slot* s = &ex->plan->slots[slot];
  int target = (!s->host && s->twin >= 0) ? s->twin : slot;
  if (buffer && s->xblocks > 1) return st__put_xcut(ex, slot, target, buffer);
  if (buffer && ex->ndev > 1 && s->layout == ST_LAYOUT_SHARDED) return st__put_sharded(ex, slot, target, buffer);
  /* Index 0 of the slot's stage holds it: a buffer made elsewhere (stage
   * 0's device, by an init program) is moved there. */
  const int home = st__slot_dev(ex, slot, 0);
  if (buffer && st_buffer_device(buffer) != home) {
    st_buffer* moved = NULL;
    st_status ms = st_buffer_copy_to_device(buffer, home, &moved);
    st_buffer_destroy(buffer);
    if (ms) return st_status_annotate(ms, "moving slot '%s' to its stage %d's device %d", s->name, s->stage, home);
    buffer = moved;
  }
  /* Between steps, state is replicated: every other device gets a copy
   * (through the host: init and restore only). */
  st_status st = ST_OK;
  if (buffer && ex->ndev > 1) {
    size_t n = st_buffer_bytes(buffer);
    void* host = st_xmalloc(n ? n : 1);
    st = st_buffer_to_host(buffer, host, n);
    for (int d = 1; d < ex->ndev && !st; ++d) {
      st_buffer* b = NULL;
      st = st_buffer_from_host(ex->runtime, st__slot_dev(ex, slot, d), st_buffer_type(buffer), host, &b);
      if (!st) st = st__put_one(ex, slot, target, d, b);
    }
    free(host);
    if (st) {
      st_buffer_destroy(buffer);
      return st_status_annotate(st, "replicating slot '%s' to %d devices", s->name, ex->ndev);
    }
  } else if (ex->ndev > 1) {
    for (int d = 1; d < ex->ndev; ++d) st__slot_put(ex, target, d, NULL);
  }
  return st__put_one(ex, slot, target, 0, buffer);
}

void st_executor_set(st_executor* ex, int slot, st_buffer* buffer) {
  st_status s = st_executor_put(ex, slot, buffer);
  if (s) {
    fprintf(stderr, "strata: %s\n", st_status_message(s));
    st_status_free(s);
  }
}

void st_executor_set_borrowed_device(st_executor* ex, int slot, int d, st_buffer* buffer) {
  st__slot_put(ex, slot, d, NULL);
  ST__SLOT(ex, slot, d) = buffer;
  ST__BORROWED(ex, slot, d) = buffer != NULL;
  if (buffer && d == 0) st__account(ex, slot, +1);
}

void st_executor_set_borrowed(st_executor* ex, int slot, st_buffer* buffer) {
  st_executor_set_borrowed_device(ex, slot, 0, buffer);
}

st_buffer* st_executor_get_device(st_executor* ex, int slot, int d) {
  if (d < 0 || d >= ex->ndev) return NULL;
  const st_slot* s = &ex->plan->slots[slot];
  if (!ST__SLOT(ex, slot, d) && !s->host && s->twin >= 0) return ST__SLOT(ex, s->twin, d);
  return ST__SLOT(ex, slot, d);
}

st_buffer* st_executor_get(st_executor* ex, int slot) { return st_executor_get_device(ex, slot, 0); }

int st_executor_devices(const st_executor* ex) { return ex->ndev; }

const st_executor_stats* st_executor_stats_get(const st_executor* ex) { return &ex->stats; }
const st_op_timing* st_executor_timings(const st_executor* ex) { return ex->timings; }
const int64_t* st_executor_live_predicted(const st_executor* ex) { return ex->live_pred; }
const int64_t* st_executor_live_accounted(const st_executor* ex) { return ex->live_acct; }

/*===-------------------------------------------------------------------===*/
/* Running                                                                  */
/*===-------------------------------------------------------------------===*/

static void st__on_complete(st_status status, void* user) {
  st__cb* cb = user;
  st_executor* ex = cb->ex;
  double t = st_now();
  pthread_mutex_lock(&ex->mu);
  /* The op is complete when its last device is. */
  if (t - ex->t0 > ex->timings[cb->op].complete_s) ex->timings[cb->op].complete_s = t - ex->t0;
  size_t at = (size_t)cb->op * (size_t)ex->ndev + (size_t)cb->d;
  if (t - ex->t0 > ex->dev_complete[at]) ex->dev_complete[at] = t - ex->t0;
  /* A SEND of several slots is done on |d| once its last copy is. */
  bool last = ex->parts[at] == 0 || --ex->parts[at] == 0;
  if (last && ex->monitor.done) ex->monitor.done(ex->monitor.user, cb->op, cb->d);
  if (status && !ex->cb_error) {
    const st_op* op = &ex->plan->ops[cb->op];
    ex->cb_error = st_status_annotate(status, "plan op %d (%s, layer %d, microbatch %d)", cb->op, st__op_program(ex, op),
                                      op->layer, op->micro);
  } else {
    st_status_free(status);
  }
  ex->pending--;
  pthread_cond_broadcast(&ex->cv);
  pthread_mutex_unlock(&ex->mu);
}

/* Keeps |ev| in *|slot| as a completion event of op |i| on device index
 * |d| and timestamps it when it fires (|cb|: its callback's context). */
static st_status st__track_in(st_executor* ex, int i, int d, st_event* ev, st_event** slot, st__cb* cb) {
  *slot = ev;
  cb->ex = ex;
  cb->op = i;
  cb->d = d;
  pthread_mutex_lock(&ex->mu);
  ex->pending++;
  pthread_mutex_unlock(&ex->mu);
  st_status s = st_event_on_ready(ev, st__on_complete, cb);
  if (s) {
    pthread_mutex_lock(&ex->mu);
    ex->pending--;
    pthread_mutex_unlock(&ex->mu);
  }
  return s;
}

/* Op |i|'s completion event on device index |d|. */
static st_status st__track(st_executor* ex, int i, int d, st_event* ev) {
  size_t at = (size_t)i * (size_t)ex->ndev + (size_t)d;
  return st__track_in(ex, i, d, ev, &ex->events[at], &ex->cbs[at]);
}

/* Where op |i|'s part |j| on device index |d| keeps its event: part 0 is
 * events[]; a SEND's input j >= 1 has one of its own. */
static st_event** st__part_event(st_executor* ex, int i, int j, int d) {
  if (j == 0) return &ex->events[(size_t)i * (size_t)ex->ndev + (size_t)d];
  return &ex->sub_events[(size_t)ex->sub_first[i] + (size_t)(j - 1) * (size_t)ex->ndev + (size_t)d];
}

/* How many parts op |i| has per device index (st__part_event). */
static int st__parts(const st_executor* ex, int i) {
  const st_op* op = &ex->plan->ops[i];
  return op->kind == ST_OP_SEND && op->input_count > 1 ? op->input_count : 1;
}

/* Tracks part |j| of op |i| on index |d| by |b|'s readiness. */
static st_status st__track_buffer_part(st_executor* ex, int i, int j, int d, st_buffer* b) {
  st_event* ev = NULL;
  ST_RETURN(st_buffer_ready_event(b, &ev));
  if (j == 0) return st__track(ex, i, d, ev);
  size_t at = (size_t)ex->sub_first[i] + (size_t)(j - 1) * (size_t)ex->ndev + (size_t)d;
  return st__track_in(ex, i, d, ev, &ex->sub_events[at], &ex->sub_cbs[at]);
}

static st_status st__track_buffer(st_executor* ex, int i, int d, st_buffer* b) { return st__track_buffer_part(ex, i, 0, d, b); }

static bool st__has_event(const st_executor* ex, int i) { return ex->events[(size_t)i * (size_t)ex->ndev] != NULL; }

static st_status st__spmd(st_executor* ex, int index, const st_op* op, bool hooked);

/* A compute program: launched once per device on that device's buffers
 * (an SPMD one once over all of them). */
static st_status st__exec_launch(st_executor* ex, int index, const st_op* op) {
  const st_plan* plan = ex->plan;
  st_program* prog = ex->programs[op->program];
  if (st_program_device_count(prog) > 1) {
    ST_RETURN(st__spmd(ex, index, op, true));
    ex->stats.launches++;
    if (op->kind == ST_OP_RECOMPUTE) ex->stats.recomputes++;
    return ST_OK;
  }
  for (int d = 0; d < ex->ndev; ++d) {
    for (int j = 0; j < op->input_count; ++j) {
      ex->in[j] = ST__SLOT(ex, op->inputs[j], d);
      if (!ex->in[j])
        return st_status_make(ST_CODE_INTERNAL, "plan op %d (%s layer %d): input slot '%s' is empty on device index %d", index,
                              plan->programs[op->program], op->layer, plan->slots[op->inputs[j]].name, d);
    }
    st_event* done = NULL;
    if (ex->hooks && ex->hooks->launching)
      ST_RETURN_IF_ERROR(ex->hooks->launching(ex->hooks->user, op, d, ex->in), "before launching %s (layer %d, microbatch %d)",
                         plan->programs[op->program], op->layer, op->micro);
    st__exec_mon_issue(ex, index, d);
    ex->dev_issue[(size_t)index * (size_t)ex->ndev + (size_t)d] = st_now() - ex->t0;
    st_status s = st_program_execute(prog, st__dev(ex, op->stage, d), ex->in, op->input_count, ex->out, op->output_count, &done);
    if (s) {
      return st_status_annotate(s, "launching %s (layer %d, microbatch %d, device %d)", plan->programs[op->program],
                                op->layer, op->micro, st__dev(ex, op->stage, d));
    }
    /* The hook's error is returned once the outputs are in their slots
     * (then freed with the executor, not leaked). */
    st_status hs = ex->hooks && ex->hooks->launched ? ex->hooks->launched(ex->hooks->user, op, d, ex->out) : ST_OK;
    /* Donated inputs now hold nothing: drop them from their slots before the
     * outputs (which alias them) take their place. */
    for (int j = 0; j < op->input_count; ++j) {
      if (st_buffer_is_consumed(ex->in[j])) st__slot_put(ex, op->inputs[j], d, NULL);
    }
    for (int j = 0; j < op->output_count; ++j) st__slot_put(ex, op->outputs[j], d, ex->out[j]);
    st_status ts = st__track(ex, index, d, done);
    if (hs) {
      st_status_free(ts);
      return st_status_annotate(hs, "after launching %s (layer %d, microbatch %d)", plan->programs[op->program], op->layer,
                                op->micro);
    }
    ST_RETURN(ts);
  }
  ex->stats.launches++;
  if (op->kind == ST_OP_RECOMPUTE) ex->stats.recomputes++;
  return ST_OK;
}

/* An SPMD program over every device's buffers at once. |hooked|: a
 * compute program, whose launching/launched hooks run per device index as
 * a one-device launch's do (the faults.nan_at drill and the non-finite
 * locator work under tensor parallelism too); a collective has none. */
static st_status st__spmd(st_executor* ex, int index, const st_op* op, bool hooked) {
  const st_plan* plan = ex->plan;
  st_program* prog = ex->programs[op->program];
  const int ni = op->input_count, no = op->output_count, nd = ex->ndev;
  for (int d = 0; d < nd; ++d)
    for (int j = 0; j < ni; ++j) {
      ex->in[(size_t)d * (size_t)ni + (size_t)j] = ST__SLOT(ex, op->inputs[j], d);
      if (!ex->in[(size_t)d * (size_t)ni + (size_t)j])
        return st_status_make(ST_CODE_INTERNAL, "plan op %d (%s layer %d): input slot '%s' is empty on device index %d", index,
                              plan->programs[op->program], op->layer, plan->slots[op->inputs[j]].name, d);
    }
  const st_executor_hooks* hooks = hooked ? ex->hooks : NULL;
  if (hooks && hooks->launching)
    for (int d = 0; d < nd; ++d)
      ST_RETURN_IF_ERROR(hooks->launching(hooks->user, op, d, ex->in + (size_t)d * (size_t)ni),
                         "before launching %s (layer %d, microbatch %d)", plan->programs[op->program], op->layer, op->micro);
  st_event* done[ST_MESH_MAX_DEVICES] = {0};
  for (int d = 0; d < nd; ++d) st__exec_mon_issue(ex, index, d);
  double now = st_now() - ex->t0;
  for (int d = 0; d < nd; ++d) ex->dev_issue[(size_t)index * (size_t)nd + (size_t)d] = now;
  st_status s = st_program_execute_spmd(prog, ex->in, ni, ex->out, no, done);
  if (s) return st_status_annotate(s, "%s %s (layer %d, microbatch %d)", op->kind == ST_OP_COLLECTIVE ? "collective" : "launching",
                                   plan->programs[op->program], op->layer, op->micro);
  /* The hook's error is returned once the outputs are in their slots (then
   * freed with the executor, not leaked), as in st__exec_launch. */
  st_status hs = ST_OK;
  if (hooks && hooks->launched)
    for (int d = 0; d < nd && !hs; ++d) hs = hooks->launched(hooks->user, op, d, ex->out + (size_t)d * (size_t)no);
  for (int d = 0; d < nd; ++d) {
    for (int j = 0; j < ni; ++j)
      if (st_buffer_is_consumed(ex->in[(size_t)d * (size_t)ni + (size_t)j])) st__slot_put(ex, op->inputs[j], d, NULL);
    for (int j = 0; j < no; ++j) st__slot_put(ex, op->outputs[j], d, ex->out[(size_t)d * (size_t)no + (size_t)j]);
  }
  for (int d = 0; d < nd; ++d) {
    st_status ts = st__track(ex, index, d, done[d]);
    if (ts) {
      for (int k = d + 1; k < nd; ++k) st_event_destroy(done[k]);
      st_status_free(hs);
      return ts;
    }
  }
  if (hs)
    return st_status_annotate(hs, "after launching %s (layer %d, microbatch %d)", plan->programs[op->program], op->layer, op->micro);
  return ST_OK;
}

static st_status st__collective(st_executor* ex, int index, const st_op* op) {
  int64_t in = 0, out = 0;
  for (int j = 0; j < op->input_count; ++j) in += (int64_t)st_tensor_type_bytes(&ex->plan->slots[op->inputs[j]].type);
  for (int j = 0; j < op->output_count; ++j) out += (int64_t)st_tensor_type_bytes(&ex->plan->slots[op->outputs[j]].type);
  ST_RETURN(st__spmd(ex, index, op, false));
  const int64_t bytes = in > out ? in : out;
  const int kind = op->tag > 0 && op->tag < ST_COLL_KIND_COUNT ? op->tag : ST_COLL_OTHER;
  ex->stats.collectives++;
  ex->stats.collective_bytes += bytes;
  ex->stats.collectives_by_kind[kind]++;
  ex->stats.collective_bytes_by_kind[kind] += bytes;
  return ST_OK;
}

/*===-------------------------------------------------------------------===*/
/* Cross-process ops (XPROC)                                                */
/*===-------------------------------------------------------------------===*/

/* On the engine's progress thread, right before MPI is asked: the copy to
 * the host must be complete. */
static st_status st__xp_before(void* user) {
  st__xp* x = user;
  return st_event_await(x->copied);
}

/* The op's part into (|slot|, |d|) is needed: wait for it, put the
 * result into the output (in place of the old buffer for an all-reduce).
 * Host time blocked here is communication the plan did not hide. */
static st_status st__xp_settle(st_executor* ex, int slot, int d) {
  st__xp* x = ST__XP(ex, slot, d);
  if (!x) return ST_OK;
  ST__XP(ex, slot, d) = NULL;
  if (x->in_slot != slot && ST__XPIN(ex, x->in_slot, d) == x) ST__XPIN(ex, x->in_slot, d) = NULL;
  double t0 = st_now();
  st_dist_coll_timing tm = {0};
  st_status s = st_dist_coll_wait(x->coll, &tm);
  double now = st_now();
  ex->stats.xproc_wait_s += now - t0;
  ex->stats.xproc_bytes += tm.bytes_sent;
  st_op_timing* t = &ex->timings[x->op];
  double done = (tm.completed_s > 0 ? tm.completed_s : now) - ex->t0;
  if (done > t->complete_s) t->complete_s = done;
  size_t at = (size_t)x->op * (size_t)ex->ndev + (size_t)d;
  if (done > ex->dev_complete[at]) ex->dev_complete[at] = done;
  if (!s) {
    st_buffer* old = ST__SLOT(ex, slot, d);
    st_tensor_type type = old && x->in_slot == slot ? *st_buffer_type(old) : ex->plan->slots[slot].type;
    st_buffer* b = NULL;
    s = st_buffer_from_host(ex->runtime, st__slot_dev(ex, slot, d), &type, x->host + x->out_at, &b);
    if (!s) st__slot_put(ex, slot, d, b);
  }
  if (--ex->xp_left[x->op] == 0 && ex->monitor.done) ex->monitor.done(ex->monitor.user, x->op, 0);
  if (s) {
    const st_op* op = &ex->plan->ops[x->op];
    s = st_status_annotate(s, "plan op %d (cross-process %s of '%s', layer %d, device index %d)", x->op,
                           st_collective_kind_name((st_collective_kind)op->tag), ex->plan->slots[x->in_slot].name, op->layer, d);
  }
  st_event_destroy(x->copied);
  st_buffer_destroy(x->held);
  free(x->host);
  free(x);
  return s;
}

/* Every part still in flight (the end of a run, an error, destroy): the
 * engine must be done with the host copies before they are freed. */
static st_status st__xp_settle_all(st_executor* ex) {
  st_status first = ST_OK;
  for (int k = 0; k < ex->plan->slot_count; ++k)
    for (int d = 0; d < ex->ndev; ++d) {
      st_status s = st__xp_settle(ex, k, d);
      if (s && !first) first = s;
      else st_status_free(s);
    }
  return first;
}

/* What op |op| reads or writes must not be in flight across processes: an
 * output of one is settled; an input one still copies from is settled too,
 * except that a FREE hands that buffer to the op (so a whole gradient's
 * FREE right after its reduce-scatter does not wait for it). */
static st_status st__xp_settle_slot(st_executor* ex, const st_op* op, int slot) {
  for (int d = 0; d < ex->ndev; ++d) {
    ST_RETURN(st__xp_settle(ex, slot, d));
    st__xp* x = ST__XPIN(ex, slot, d);
    if (!x) continue;
    ST__XPIN(ex, slot, d) = NULL;
    if (op->kind == ST_OP_FREE) {
      if (!ST__BORROWED(ex, slot, d) && ST__SLOT(ex, slot, d)) {
        if (d == 0) st__account(ex, slot, -1);
        x->held = ST__SLOT(ex, slot, d);
        ST__SLOT(ex, slot, d) = NULL;
      }
    } else {
      ST_RETURN(st__xp_settle(ex, x->out_slot, d));
    }
  }
  return ST_OK;
}

static st_status st__xp_settle_op(st_executor* ex, const st_op* op) {
  for (int j = 0; j < op->input_count; ++j) ST_RETURN(st__xp_settle_slot(ex, op, op->inputs[j]));
  for (int j = 0; j < op->output_count; ++j) ST_RETURN(st__xp_settle_slot(ex, op, op->outputs[j]));
  return ST_OK;
}

/* Starts one part of XPROC op |i|: input |in| of device index |d| copied
 * to the host, where the engine works on the whole: an all-gather's block
 * goes to this rank's place in the P blocks, a reduce-scatter's whole is
 * zero-padded to P blocks of the output's size, whose block |rank| is the
 * result. */
static st_status st__xp_start(st_executor* ex, int i, const st_op* op, int in, int out, int d) {
  st_dist_coll_kind kind = op->tag == ST_COLL_REDUCE_SCATTER ? ST_DIST_REDUCE_SCATTER
                           : op->tag == ST_COLL_ALL_GATHER  ? ST_DIST_ALL_GATHER
                                                            : ST_DIST_ALL_REDUCE;
  st_buffer* b = ST__SLOT(ex, in, d);
  if (!b) return st_status_make(ST_CODE_INTERNAL, "plan op %d: cross-process op on empty slot '%s'", i, ex->plan->slots[in].name);
  const size_t P = (size_t)st_dist_size(ex->dist), rank = (size_t)st_dist_rank(ex->dist);
  const size_t n_in = st_buffer_bytes(b) / sizeof(float);
  const size_t n_out = (size_t)st_tensor_type_elements(&ex->plan->slots[out].type);
  st__xp* x = st_xcalloc(1, sizeof(*x));
  x->op = i;
  x->in_slot = in;
  x->out_slot = out;
  x->count = kind == ST_DIST_ALL_GATHER ? n_in * P : kind == ST_DIST_REDUCE_SCATTER ? n_out * P : n_in;
  x->out_at = kind == ST_DIST_REDUCE_SCATTER ? rank * n_out : 0;
  x->host = st_xcalloc(x->count ? x->count : 1, sizeof(float)); /* zeros: a reduce-scatter's padding */
  float* into = x->host + (kind == ST_DIST_ALL_GATHER ? rank * n_in : 0);
  st_status s = st_buffer_to_host_async(b, into, n_in * sizeof(float), &x->copied);
  if (!s) {
    st_dist_coll_request req = {.kind = kind, .data = x->host, .count = x->count, .before = st__xp_before, .user = x,
                                .name = ex->plan->slots[in].name};
    s = st_dist_coll_start(ex->dist, &req, &x->coll);
  }
  if (s) {
    if (x->copied) st_status_free(st_event_await(x->copied));
    st_event_destroy(x->copied);
    free(x->host);
    free(x);
    return st_status_annotate(s, "plan op %d: cross-process %s of '%s'", i, st_collective_kind_name((st_collective_kind)op->tag),
                              ex->plan->slots[in].name);
  }
  ST__XP(ex, out, d) = x;
  if (in != out) ST__XPIN(ex, in, d) = x;
  ex->xp_left[i]++;
  return ST_OK;
}

/* Issues op |i|: for each device index and slot pair, a copy to the host
 * and a collective queued behind it, in plan order on every process (the
 * engine issues them to MPI in queue order, which must be the same
 * everywhere). */
static st_status st__xproc(st_executor* ex, int i, const st_op* op) {
  if (!ex->dist)
    return st_status_make(ST_CODE_INTERNAL, "plan op %d: a cross-process op, but the executor has no job (st_executor_set_dist)", i);
  st__exec_mon_issue(ex, i, 0);
  ex->xp_left[i] = 0;
  ex->stats.xprocs++;
  for (int d = 0; d < ex->ndev; ++d)
    for (int j = 0; j < op->input_count; ++j) ST_RETURN(st__xp_start(ex, i, op, op->inputs[j], op->outputs[j], d));
  return ST_OK;
}

static st_status st__exec_wait(st_executor* ex, int i, const st_op* op) {
  st_op_timing* t = &ex->timings[i];
  for (int d = 0; d < op->dep_count; ++d) {
    const st_op* dep = &ex->plan->ops[op->deps[d]];
    if (dep->kind != ST_OP_XPROC) continue;
    for (int k = 0; k < dep->output_count; ++k)
      for (int x = 0; x < ex->ndev; ++x) {
        if (ST__XP(ex, dep->outputs[k], x)) t->blocked = true;
        ST_RETURN(st__xp_settle(ex, dep->outputs[k], x));
      }
  }
  for (int d = 0; d < op->dep_count; ++d)
    for (int k = 0; k < ex->ndev * st__parts(ex, op->deps[d]); ++k) {
      st_event* ev = *st__part_event(ex, op->deps[d], k / ex->ndev, k % ex->ndev);
      if (!ev) continue;
      if (!st_event_is_ready(ev)) t->blocked = true;
      st_status s = st_event_await(ev);
      if (s) {
        const st_op* dep = &ex->plan->ops[op->deps[d]];
        return st_status_annotate(s, "plan op %d (%s, layer %d, microbatch %d, device index %d)", op->deps[d],
                                  st__op_program(ex, dep), dep->layer, dep->micro, k % ex->ndev);
      }
    }
  ex->stats.waits++;
  if (t->blocked) ex->stats.waits_blocked++;
  return ST_OK;
}

static bool st__is_spmd_op(const st_executor* ex, const st_op* op) {
  if (op->kind == ST_OP_COLLECTIVE) return true;
  return (op->kind == ST_OP_LAUNCH || op->kind == ST_OP_RECOMPUTE) && st_program_device_count(ex->programs[op->program]) > 1;
}

/* plan->serialize_spmd: the host waits for the previous SPMD op on every
 * device before it issues the next one (counted as a blocked wait). */
static st_status st__spmd_barrier(st_executor* ex, int i) {
  int prev = -1;
  for (int k = i - 1; k >= 0 && prev < 0; --k)
    if (st__is_spmd_op(ex, &ex->plan->ops[k])) prev = k;
  if (prev < 0) return ST_OK;
  double t0 = st_now();
  bool blocked = false;
  for (int d = 0; d < ex->ndev; ++d) {
    st_event* ev = ex->events[(size_t)prev * (size_t)ex->ndev + (size_t)d];
    if (!ev) continue;
    if (!st_event_is_ready(ev)) blocked = true;
    ST_RETURN(st_event_await(ev));
  }
  ex->stats.waits++;
  if (blocked) ex->stats.waits_blocked++;
  ex->stats.wait_s += st_now() - t0;
  return ST_OK;
}

/* A SEND: every input's buffer on each device index copied device to
 * device to the same index of the destination stage, into its output.
 * Nothing blocks: PJRT orders the copy after the input's producer and the
 * output's readers after the copy. The input stays in its slot; a FREE of
 * it right after is safe, as PJRT keeps a buffer alive until the copies
 * reading it are done (the CPU plugin holds a usage event on the source:
 * tests/c/test_runtime.c frees it at once). */
static st_status st__send(st_executor* ex, int i, const st_op* op) {
  const st_plan* plan = ex->plan;
  /* After st_executor_skip_launches an input whose producer was skipped
   * is empty: it is not sent (nor waited for). */
  int parts = 0;
  for (int j = 0; j < op->input_count; ++j) parts += !ex->skip_launches || ST__SLOT(ex, op->inputs[j], 0);
  if (parts == 0) { /* nothing to send: done at once on every index (the monitor heard of each) */
    for (int d = 0; d < ex->ndev && ex->monitor.done; ++d) ex->monitor.done(ex->monitor.user, i, d);
    return ST_OK;
  }
  pthread_mutex_lock(&ex->mu);
  for (int d = 0; d < ex->ndev; ++d) ex->parts[(size_t)i * (size_t)ex->ndev + (size_t)d] = parts;
  pthread_mutex_unlock(&ex->mu);
  int64_t bytes = 0;
  for (int d = 0; d < ex->ndev; ++d) {
    const int to = st__dev(ex, op->stage, d);
    for (int j = 0; j < op->input_count; ++j) {
      const st_slot *in = &plan->slots[op->inputs[j]], *out = &plan->slots[op->outputs[j]];
      st_buffer* src = ST__SLOT(ex, op->inputs[j], d);
      if (!src && ex->skip_launches && !ST__SLOT(ex, op->inputs[j], 0)) continue;
      if (!src)
        return st_status_make(ST_CODE_INTERNAL, "plan op %d: SEND of empty slot '%s' (stage %d, device index %d)", i, in->name,
                              in->stage, d);
      st_buffer* b = NULL;
      ST_RETURN_IF_ERROR(st_buffer_copy_to_device(src, to, &b), "plan op %d: sending '%s' from stage %d to '%s' on stage %d", i,
                         in->name, in->stage, out->name, op->stage);
      if (d == 0) bytes += (int64_t)st_buffer_bytes(b);
      st__slot_put(ex, op->outputs[j], d, b);
      ST_RETURN(st__track_buffer_part(ex, i, j, d, b));
    }
  }
  ex->stats.sends++;
  ex->stats.send_bytes += bytes;
  return ST_OK;
}

static st_status st__run_op(st_executor* ex, const st_executor_hooks* hooks, int i) {
  const st_plan* plan = ex->plan;
  const st_op* op = &plan->ops[i];
  if (ex->skip_launches) {
    /* st_executor_skip_launches: programs are not issued; what reads or
     * moves their outputs finds an empty slot and does nothing. */
    if (st__is_program_op(op->kind)) return ST_OK;
    if (op->kind == ST_OP_READ || op->kind == ST_OP_D2H)
      for (int j = 0; j < op->input_count; ++j)
        if (!ST__SLOT(ex, op->inputs[j], 0)) return ST_OK;
  }
  if (plan->serialize_spmd && st__is_spmd_op(ex, op)) ST_RETURN(st__spmd_barrier(ex, i));
  if (op->kind != ST_OP_WAIT) ST_RETURN(st__xp_settle_op(ex, op));
  switch (op->kind) {
    case ST_OP_LAUNCH:
    case ST_OP_RECOMPUTE:
      return st__exec_launch(ex, i, op);
    case ST_OP_COLLECTIVE:
      return st__collective(ex, i, op);
    case ST_OP_H2D:
      for (int d = 0; d < ex->ndev; ++d) {
        st_buffer* b = NULL;
        if (op->input_count == 0) {
          ST_RETURN(hooks->h2d(hooks->user, op, d, st__dev(ex, op->stage, d), &b));
        } else {
          st_buffer* home = ST__SLOT(ex, op->inputs[0], d);
          if (!home) return st_status_make(ST_CODE_INTERNAL, "plan op %d: H2D from empty slot '%s'", i, plan->slots[op->inputs[0]].name);
          ST_RETURN_IF_ERROR(st_buffer_copy_to_memory(home, ex->device_kind, &b), "plan op %d: bringing '%s' back to the device",
                             i, plan->slots[op->outputs[0]].name);
        }
        ex->stats.h2d_bytes += (int64_t)st_buffer_bytes(b);
        st__slot_put(ex, op->outputs[0], d, b);
        ST_RETURN(st__track_buffer(ex, i, d, b));
      }
      return ST_OK;
    case ST_OP_D2H:
      for (int d = 0; d < ex->ndev; ++d) {
        st_buffer* src = ST__SLOT(ex, op->inputs[0], d);
        if (!src) return st_status_make(ST_CODE_INTERNAL, "plan op %d: D2H of empty slot '%s'", i, plan->slots[op->inputs[0]].name);
        st_buffer* b = NULL;
        ST_RETURN_IF_ERROR(st_buffer_copy_to_memory(src, ex->host_kind, &b), "plan op %d: offloading '%s' to %s memory", i,
                           plan->slots[op->inputs[0]].name, ex->host_kind);
        ex->stats.d2h_bytes += (int64_t)st_buffer_bytes(b);
        st__slot_put(ex, op->outputs[0], d, b);
        ST_RETURN(st__track_buffer(ex, i, d, b));
      }
      return ST_OK;
    case ST_OP_READ:
      for (int d = 0; d < ex->ndev; ++d) {
        st_buffer* b = ST__SLOT(ex, op->inputs[0], d);
        if (!b) return st_status_make(ST_CODE_INTERNAL, "plan op %d: READ of empty slot '%s'", i, plan->slots[op->inputs[0]].name);
        ST_RETURN(hooks->read(hooks->user, op, d, b));
        ex->stats.d2h_bytes += (int64_t)st_buffer_bytes(b);
      }
      ex->stats.reads++;
      return ST_OK;
    case ST_OP_HOST:
      return hooks->host(hooks->user, op);
    case ST_OP_FREE:
      for (int j = 0; j < op->input_count; ++j)
        for (int d = 0; d < ex->ndev; ++d) st__slot_put(ex, op->inputs[j], d, NULL);
      return ST_OK;
    case ST_OP_WAIT:
      return st__exec_wait(ex, i, op);
    case ST_OP_XPROC:
      return st__xproc(ex, i, op);
    case ST_OP_SEND:
      return st__send(ex, i, op);
  }
  assert(!"an op kind the switch above does not know"); /* st_op_kind is closed */
  return st_status_make(ST_CODE_INTERNAL, "plan op %d has unknown kind %d", i, (int)op->kind);
}

static int st__exec_cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* Merges |n| [start, end] pairs in place into disjoint sorted intervals;
 * returns how many remain. */
static int st__union(double* iv, int n) {
  qsort(iv, (size_t)n, 2 * sizeof(double), st__exec_cmp_double); /* by start */
  int m = 0;
  for (int k = 0; k < n; ++k) {
    if (m > 0 && iv[2 * k] <= iv[2 * (m - 1) + 1]) {
      if (iv[2 * k + 1] > iv[2 * (m - 1) + 1]) iv[2 * (m - 1) + 1] = iv[2 * k + 1];
    } else {
      iv[2 * m] = iv[2 * k];
      iv[2 * m + 1] = iv[2 * k + 1];
      ++m;
    }
  }
  return m;
}

static bool st__kind_is_launch(st_op_kind k) { return k == ST_OP_LAUNCH || k == ST_OP_RECOMPUTE; }
static bool st__kind_is_transfer(st_op_kind k) { return k == ST_OP_H2D || k == ST_OP_D2H; }
static bool st__kind_is_collective(st_op_kind k) { return k == ST_OP_COLLECTIVE; }
static bool st__kind_is_xproc(st_op_kind k) { return k == ST_OP_XPROC; }
static bool st__kind_is_send(st_op_kind k) { return k == ST_OP_SEND; }
static bool st__kind_is_compute(st_op_kind k) { return st__is_program_op(k); } /* a stage's busy time */

/* The union of [start, complete] over the first |ran| ops whose kind
 * |pick| accepts (and, |stage| >= 0, that run on that stage), into |iv|
 * (two doubles an interval, room for ran + 1 intervals); returns how many
 * intervals. */
static int st__busy(const st_executor* ex, int ran, bool (*pick)(st_op_kind), int stage, double* iv) {
  int n = 0;
  for (int i = 0; i < ran; ++i) {
    if (!pick(ex->plan->ops[i].kind)) continue;
    if (stage >= 0 && ex->plan->ops[i].stage != stage) continue;
    iv[2 * n] = ex->timings[i].start_s;
    iv[2 * n + 1] = ex->timings[i].complete_s;
    ++n;
  }
  return st__union(iv, n);
}

/* Adds to *total the length of the disjoint intervals |a| and to *hidden
 * the part of it the disjoint intervals |b| cover. */
static void st__overlap(const double* a, int na, const double* b, int nb, double* total, double* hidden) {
  for (int j = 0; j < na; ++j) {
    *total += a[2 * j + 1] - a[2 * j];
    for (int k = 0; k < nb; ++k) {
      double lo = a[2 * j] > b[2 * k] ? a[2 * j] : b[2 * k];
      double hi = a[2 * j + 1] < b[2 * k + 1] ? a[2 * j + 1] : b[2 * k + 1];
      if (hi > lo) *hidden += hi - lo;
    }
  }
}

typedef struct {
  double t;
  int delta;
} st__edge;

static int st__cmp_edge(const void* a, const void* b) {
  const st__edge *x = a, *y = b;
  if (x->t != y->t) return x->t < y->t ? -1 : 1;
  return x->delta - y->delta; /* completions before issues at the same instant */
}

/* The pipeline's statistics: each stage's busy time (the union of its
 * programs' start..complete), the span from the first issue to the last
 * completion, the bubble fraction. |iv|: scratch for ran + 1 intervals. */
static void st__derive_stages(st_executor* ex, int ran, double* iv) {
  st_executor_stats* st = &ex->stats;
  double first = 0, last = 0, busy = 0;
  for (int i = 0; i < ran; ++i) {
    if (i == 0 || ex->timings[i].issue_s < first) first = ex->timings[i].issue_s;
    if (ex->timings[i].complete_s > last) last = ex->timings[i].complete_s;
  }
  st->span_s = ran > 0 ? last - first : 0;
  for (int s = 0; s < ex->stages; ++s) {
    int n = st__busy(ex, ran, st__kind_is_compute, ex->stages > 1 ? s : -1, iv);
    for (int k = 0; k < n; ++k) st->stage_busy_s[s] += iv[2 * k + 1] - iv[2 * k];
    busy += st->stage_busy_s[s];
  }
  double f = st->span_s > 0 ? 1.0 - busy / ((double)ex->stages * st->span_s) : 0;
  st->bubble_fraction = f < 0 ? 0 : f > 1 ? 1 : f;
}

/* A WAIT's host saw every dep of it done when it resumed (it awaited
 * their events), so none completed later than that, whatever its
 * completion callback says: callbacks can come late (on the CPU plugin a
 * copy's comes after the launch that consumed it has run on the thread
 * that finished the copy), and a late one would otherwise push the start
 * of every consumer past its real start. */
static void st__derive_waited(st_executor* ex, int ran) {
  const st_plan* plan = ex->plan;
  for (int i = 0; i < ran; ++i) {
    const st_op* op = &plan->ops[i];
    if (op->kind != ST_OP_WAIT) continue;
    const double seen = ex->timings[i].issue_s + ex->timings[i].blocked_s; /* as the host measured it */
    for (int k = 0; k < op->dep_count; ++k) {
      const int dep = op->deps[k];
      if (!st__op_is_async(plan->ops[dep].kind) || plan->ops[dep].kind == ST_OP_XPROC) continue;
      st_op_timing* t = &ex->timings[dep];
      if (t->complete_s > seen) t->complete_s = seen;
      for (int d = 0; d < ex->ndev; ++d) {
        double* c = &ex->dev_complete[(size_t)dep * (size_t)ex->ndev + (size_t)d];
        if (*c > seen) *c = seen;
      }
    }
  }
}

/* Start times, causal clean-up and the derived statistics of a run. */
static void st__derive(st_executor* ex, int ran) {
  const st_plan* plan = ex->plan;
  st_executor_stats* st = &ex->stats;
  st__derive_waited(ex, ran);
  /* PJRT reports when work completes, not when it starts. An op can start
   * once it is issued and its deps are complete; a launch also waits for
   * the launch before it (one execution queue per device, as a GPU stream;
   * on the CPU plugin executions use every core, so they barely overlap
   * either). Callbacks of different ops can be delivered out of order, and
   * a callback may run after a waiter has already resumed: clamp so that no
   * op starts before its deps complete nor completes before it starts. */
  double prev_launch[ST_PLAN_MAX_STAGES] = {0}; /* per stage: its devices' queue */
  /* Unhidden communication wait: [when op i could have started but for its
   * COLLECTIVE deps, when such a dep completed], cut to the collective's own
   * start..complete (so the union never exceeds collective_s). */
  double* wv = st_xmalloc(((size_t)ran + 1) * 2 * sizeof(double));
  int nw = 0;
  for (int i = 0; i < ran; ++i) {
    st_op_timing* t = &ex->timings[i];
    const st_op* op = &plan->ops[i];
    double start = t->issue_s;
    double ready = t->issue_s; /* the same without the COLLECTIVE deps */
    bool on_comm = false;
    for (int d = 0; d < op->dep_count; ++d) {
      double c = ex->timings[op->deps[d]].complete_s;
      if (c > start) start = c;
      if (plan->ops[op->deps[d]].kind == ST_OP_COLLECTIVE || plan->ops[op->deps[d]].kind == ST_OP_XPROC)
        on_comm = true;
      else if (c > ready)
        ready = c;
    }
    bool launch = op->kind == ST_OP_LAUNCH || op->kind == ST_OP_RECOMPUTE;
    const int os = ex->stages > 1 ? op->stage : 0;
    if (launch && prev_launch[os] > start) start = prev_launch[os];
    if (launch && prev_launch[os] > ready) ready = prev_launch[os];
    if (on_comm) {
      bool waited = false;
      for (int d = 0; d < op->dep_count; ++d) {
        const st_op_timing* k = &ex->timings[op->deps[d]];
        if (plan->ops[op->deps[d]].kind != ST_OP_COLLECTIVE && plan->ops[op->deps[d]].kind != ST_OP_XPROC) continue;
        double lo = ready > k->start_s ? ready : k->start_s;
        if (k->complete_s <= lo) continue;
        wv[2 * nw] = lo;
        wv[2 * nw + 1] = k->complete_s;
        ++nw;
        waited = true;
      }
      if (waited) st->comm_waits++;
    }
    if (op->kind == ST_OP_HOST || op->kind == ST_OP_FREE) {
      /* host work that waits for nothing: as the host saw it (a FREE only
       * drops a reference; PJRT releases the memory once its users are done) */
      t->start_s = t->issue_s;
    } else if (op->kind == ST_OP_WAIT || op->kind == ST_OP_READ) {
      /* the host resumes no earlier than what it waited for */
      t->start_s = t->issue_s;
      if (t->complete_s < start) t->complete_s = start;
    } else {
      t->start_s = start;
    }
    if (t->complete_s < t->start_s) t->complete_s = t->start_s;
    if (launch) prev_launch[os] = t->complete_s;
    if (op->kind == ST_OP_WAIT || op->kind == ST_OP_READ) st->wait_s += t->blocked_s;
    if (op->kind == ST_OP_RECOMPUTE) st->recompute_s += t->complete_s - t->start_s;
  }
  nw = st__union(wv, nw);
  for (int j = 0; j < nw; ++j) st->comm_wait_s += wv[2 * j + 1] - wv[2 * j];
  free(wv);
  /* The same estimate per device index, for the per-device trace tracks:
   * device d's part of an op starts once the host issued it to d and its
   * deps' parts on d are done (and, for a launch, d's previous launch on
   * its stage). */
  const int nd = ex->ndev;
  double* prev_on = st_xcalloc((size_t)nd * (size_t)ex->stages, sizeof(double));
  for (int i = 0; i < ran; ++i) {
    const st_op* op = &plan->ops[i];
    const st_op_timing* t = &ex->timings[i];
    bool launch = op->kind == ST_OP_LAUNCH || op->kind == ST_OP_RECOMPUTE;
    for (int d = 0; d < nd; ++d) {
      size_t at = (size_t)i * (size_t)nd + (size_t)d;
      if (!st__op_is_async(op->kind) || !ex->events[at]) {
        ex->dev_start[at] = t->start_s;
        ex->dev_complete[at] = t->complete_s;
        continue;
      }
      double start = ex->dev_issue[at] > t->issue_s ? ex->dev_issue[at] : t->issue_s;
      for (int k = 0; k < op->dep_count; ++k) {
        double c = ex->dev_complete[(size_t)op->deps[k] * (size_t)nd + (size_t)d];
        if (c > start) start = c;
      }
      double* q = &prev_on[(size_t)(ex->stages > 1 ? op->stage : 0) * (size_t)nd + (size_t)d];
      if (launch && *q > start) start = *q;
      ex->dev_start[at] = start;
      if (ex->dev_complete[at] < start) ex->dev_complete[at] = start;
      if (ex->dev_complete[at] > t->complete_s) ex->dev_complete[at] = t->complete_s;
      if (ex->dev_start[at] > ex->dev_complete[at]) ex->dev_start[at] = ex->dev_complete[at];
      if (launch) *q = ex->dev_complete[at];
    }
  }
  free(prev_on);
  /* Communication: the time some collective was in flight, and how much of
   * it some launch was running too (collectives do not queue behind
   * launches on the CPU plugin: docs/parallelism.md, "Measured"). Then
   * the same for transfers. Unions, so concurrent ops count once. */
  double* lv = st_xmalloc(((size_t)ran + 1) * 2 * sizeof(double));
  double* ov = st_xmalloc(((size_t)ran + 1) * 2 * sizeof(double));
  int nl = st__busy(ex, ran, st__kind_is_launch, -1, lv);
  int nc = st__busy(ex, ran, st__kind_is_collective, -1, ov);
  st__overlap(ov, nc, lv, nl, &st->collective_s, &st->collective_hidden_s);
  int nx = st__busy(ex, ran, st__kind_is_xproc, -1, ov);
  st__overlap(ov, nx, lv, nl, &st->xproc_s, &st->xproc_hidden_s);
  int nt = st__busy(ex, ran, st__kind_is_transfer, -1, ov);
  st__overlap(ov, nt, lv, nl, &st->transfer_s, &st->transfer_hidden_s);
  int ns = st__busy(ex, ran, st__kind_is_send, -1, ov);
  st__overlap(ov, ns, lv, nl, &st->send_s, &st->send_hidden_s);
  st__derive_stages(ex, ran, ov);
  free(lv);
  free(ov);
  /* Queue depth: device ops issued and not yet complete. */
  st__edge* e = st_xmalloc(((size_t)ran + 1) * 2 * sizeof(st__edge));
  int ne = 0;
  for (int i = 0; i < ran; ++i) {
    if (!st__op_is_async(plan->ops[i].kind)) continue;
    e[ne++] = (st__edge){ex->timings[i].issue_s, +1};
    e[ne++] = (st__edge){ex->timings[i].complete_s, -1};
  }
  qsort(e, (size_t)ne, sizeof(st__edge), st__cmp_edge);
  int depth = 0;
  for (int k = 0; k < ne; ++k) {
    depth += e[k].delta;
    if (depth > st->max_inflight) st->max_inflight = depth;
  }
  free(e);
}

void st_executor_skip_launches(st_executor* ex) { ex->skip_launches = true; }
bool st_executor_skipped(const st_executor* ex) { return ex->skip_launches; }

/* The stats of a new run: the live bytes carried over, the predictions
 * kept, the peaks starting from the persistent state (the fullest stage's,
 * as st_plan_predict_live starts). */
static void st__run_reset(st_executor* ex) {
  const st_plan* plan = ex->plan;
  enum { C = ST_SLOT_CATEGORY_COUNT };
  const st_executor_stats old = ex->stats;
  memset(&ex->stats, 0, sizeof(ex->stats));
  memcpy(ex->stats.live_bytes, old.live_bytes, sizeof(old.live_bytes));
  ex->stats.host_bytes = old.host_bytes;
  ex->stats.predicted_peak_bytes = old.predicted_peak_bytes;
  memcpy(ex->stats.predicted_peak_by_category, old.predicted_peak_by_category, sizeof(old.predicted_peak_by_category));
  ex->stats.predicted_peak_with_temps_bytes = old.predicted_peak_with_temps_bytes;
  ex->stats.live_mismatch_op = -1;
  ex->stats.stages = ex->stages;
  for (int st = 0; st < ex->stages; ++st) {
    int64_t total = 0;
    for (int k = 0; k < C; ++k) total += ex->stage_live[st][k];
    if (total > ex->stats.peak_live_bytes || st == 0) {
      ex->stats.peak_live_bytes = total;
      memcpy(ex->stats.peak_by_category, ex->stage_live[st], sizeof(ex->stats.peak_by_category));
    }
    memcpy(ex->stats.stage_peak_by_category[st], ex->stage_live[st], sizeof(ex->stats.stage_peak_by_category[st]));
  }
  ex->stats.peak_with_temps_bytes = ex->stats.peak_live_bytes;
  ex->stats.peak_with_temps_op = -1;
  memset(ex->timings, 0, (size_t)plan->op_count * sizeof(st_op_timing));
  size_t nd = (size_t)plan->op_count * (size_t)ex->ndev;
  memset(ex->dev_issue, 0, nd * sizeof(double));
  memset(ex->dev_start, 0, nd * sizeof(double));
  memset(ex->dev_complete, 0, nd * sizeof(double));
  memset(ex->parts, 0, nd * sizeof(int));
}

/* The live bytes after op |i| (its stage's, as st_plan_predict_live
 * counts them), the peaks and the temporaries. */
static void st__run_account(st_executor* ex, int i) {
  const st_op* op = &ex->plan->ops[i];
  const int64_t* here = ex->stage_live[ex->stages > 1 ? op->stage : 0];
  int64_t total = 0;
  for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) {
    size_t at = (size_t)i * ST_SLOT_CATEGORY_COUNT + (size_t)k;
    ex->live_acct[at] = here[k];
    total += here[k];
    if (ex->live_acct[at] != ex->live_pred[at] && ex->stats.live_mismatch_op < 0) ex->stats.live_mismatch_op = i;
  }
  if (total > ex->stats.peak_live_bytes) {
    ex->stats.peak_live_bytes = total;
    memcpy(ex->stats.peak_by_category, here, sizeof(ex->stats.peak_by_category));
  }
  for (int st = 0; st < ex->stages; ++st)
    for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k)
      if (ex->stage_live[st][k] > ex->stats.stage_peak_by_category[st][k])
        ex->stats.stage_peak_by_category[st][k] = ex->stage_live[st][k];
  /* The running program's temporaries, on top of what the op left live
   * (its inputs are not freed before a later FREE op). */
  int64_t tb = st__is_program_op(op->kind) ? ex->temps[op->program] : 0;
  if (tb > ex->stats.max_temps_bytes) ex->stats.max_temps_bytes = tb;
  if (total + tb > ex->stats.peak_with_temps_bytes) {
    ex->stats.peak_with_temps_bytes = total + tb;
    ex->stats.peak_temps_bytes = tb;
    ex->stats.peak_with_temps_op = i;
  }
}

st_status st_executor_run(st_executor* ex, const st_executor_hooks* hooks) {
  const st_plan* plan = ex->plan;
  ex->skip_launches = false;
  ex->hooks = hooks;
  st__drain(ex);
  st__events_free(ex);
  st_status_free(ex->cb_error);
  ex->cb_error = NULL;
  st__run_reset(ex);
  ex->t0 = st_now();
  st_status s = ST_OK;
  int i = 0;
  for (; i < plan->op_count && !s; ++i) {
    st_op_timing* t = &ex->timings[i];
    t->issue_s = st_now() - ex->t0;
    for (int d = 0; d < ex->ndev; ++d) ex->dev_issue[(size_t)i * (size_t)ex->ndev + (size_t)d] = t->issue_s;
    const st_op_kind kind = plan->ops[i].kind;
    const bool per_device = kind == ST_OP_H2D || kind == ST_OP_D2H || kind == ST_OP_SEND;
    /* An XPROC op tells the monitor itself: it is done when settled. */
    const bool host_op = !per_device && !st__is_program_op(kind) && kind != ST_OP_XPROC;
    if (per_device)
      for (int d = 0; d < ex->ndev; ++d) st__exec_mon_issue(ex, i, d);
    if (host_op) st__exec_mon_issue(ex, i, 0);
    s = st__run_op(ex, hooks, i);
    if (host_op && ex->monitor.done) ex->monitor.done(ex->monitor.user, i, 0);
    if (!st__has_event(ex, i)) t->complete_s = st_now() - ex->t0;
    /* As the host saw it, before any causal clean-up of the timestamps. */
    if (plan->ops[i].kind == ST_OP_WAIT || plan->ops[i].kind == ST_OP_READ) t->blocked_s = t->complete_s - t->issue_s;
    st__run_account(ex, i);
  }
  /* The plan's last WAIT settles every XPROC op; after an error some may
   * still be in flight, and the engine writes into their host copies. */
  st_status xs = st__xp_settle_all(ex);
  if (!s) s = xs;
  else st_status_free(xs);
  /* Callbacks still reference this run's timings: never return before they
   * have all run, error or not. */
  st__drain(ex);
  ex->hooks = NULL;
  /* A run whose launches were skipped leaves what they would have consumed
   * (gradients, scalars): the next run must start from the persistent
   * state alone. */
  if (ex->skip_launches)
    for (int k = 0; k < plan->slot_count; ++k)
      if (!plan->slots[k].persistent)
        for (int d = 0; d < ex->ndev; ++d) st__slot_put(ex, k, d, NULL);
  if (!s && ex->cb_error) {
    s = ex->cb_error;
    ex->cb_error = NULL;
  }
  st__derive(ex, i);
  return s;
}

void st__executor_record(const st_executor* ex, st__exec_record* out) {
  *out = (st__exec_record){.plan = ex->plan, .device = ex->device, .ndev = ex->ndev, .stages = ex->stages,
                           .host_kind = ex->host_kind, .timings = ex->timings, .dev_start = ex->dev_start, .dev_complete = ex->dev_complete,
                           .live_pred = ex->live_pred, .live_acct = ex->live_acct, .t0 = ex->t0, .stats = &ex->stats};
}
