/* trainer.c — `strata train`: the lifecycle, read top to bottom:
 *
 *   init     run directory, resolved config, event log, data
 *   compile  bundle (export if needed), runtime, programs, plans
 *   run      initialise parameters, then step after step: fill the batch,
 *            execute the step plan, record metrics, evaluate now and then
 *   save     final parameters as safetensors
 *
 * The executor callbacks that feed a step live in step_hooks.c, the metrics
 * lines and events in metrics.c. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/diag.h"
#include "strata/dist.h"
#include "strata/mesh.h"
#include "strata/obs.h"
#include "strata/kernels.h"
#include "strata/train.h"
#include "train/checkpoint_io.h"
#include "train/train_internal.h"

/* Parameters one init program may return. */
#define ST__MAX_INIT_OUTPUTS 64


/*===-------------------------------------------------------------------===*/
/* Lifecycle pieces                                                         */
/*===-------------------------------------------------------------------===*/

/* Creates (or, on resume, reopens) the run directory, locks it and writes
 * its config.yaml (st_rundir_claim): a second process training into it is
 * refused with exit 2. */
static st_status st__make_run_dir(st__trainer* t, const st_config* cfg, const st_plan_options* o, char** out_dir,
                                  int* out_lock_fd, bool* out_reused) {
  char* dir = st_rundir_default(o->run_dir, o->run_id);
  st_rundir_claim_options how = {.resume = o->resume, .config = cfg};
  /* A job's ranks: rank 0 claims the job's directory first, the others
   * then their own inside it (job.c). */
  st_status s = o->rank == 0 ? st_rundir_claim(dir, &how, out_lock_fd, out_reused) : ST_OK;
  if (t->dist) {
    st_status js = st__job_run_dir(t, o, s == ST_OK, &dir, &t->job_dir);
    /* Rank 0 told the others it failed: every rank returns its error. */
    if (s && !js) t->failed_together = true;
    if (!s) s = js;
    else st_status_free(js);
    if (!s && o->rank > 0) s = st_rundir_claim(dir, &how, out_lock_fd, out_reused);
  }
  if (s) {
    free(dir);
    return s;
  }
  *out_dir = dir;
  return ST_OK;
}

/* What the runtime says of itself, for context.json. */
static void st__context_runtime(const st_runtime* r, st_context_runtime* out) {
  memset(out, 0, sizeof(*out));
  st_runtime_info info;
  st_runtime_get_info(r, &info);
  out->plugin_path = info.plugin_path;
  out->xla_version = info.xla_version;
  out->platform_name = info.platform_name;
  out->platform_version = info.platform_version;
  out->api_major = info.api_major;
  out->api_minor = info.api_minor;
  for (int i = 0; i < info.device_count && out->device_count < ST_CONTEXT_MAX_DEVICES; ++i) {
    st_device_info d;
    st_status s = st_runtime_device_info(r, i, &d);
    if (s) {
      st_status_free(s);
      continue;
    }
    out->device_ids[out->device_count] = d.id;
    out->device_kinds[out->device_count++] = d.kind;
  }
}

/* A bundle program's signature, for st_program_compile; points into |p|. */
static void st__program_signature(const st_bundle_program* p, st_tensor_type* inputs, st_tensor_type* outputs,
                                  st_program_signature* sig) {
  for (int i = 0; i < p->input_count; ++i) inputs[i] = p->inputs[i].type;
  for (int i = 0; i < p->output_count; ++i) outputs[i] = p->outputs[i].type;
  sig->input_count = p->input_count;
  sig->inputs = inputs;
  sig->output_count = p->output_count;
  sig->outputs = outputs;
}

/* Compiles, as one batch (several at once: st_program_compile_files), every
 * bundle program named by |plans| or |extra| that is not compiled yet. */
st_status st__compile_programs(st__trainer* t, const st_plan* const* plans, int plan_count, const char* const* extra,
                                      int extra_count) {
  const st_bundle* b = t->bundle;
  int n_max = extra_count;
  for (int p = 0; p < plan_count; ++p) n_max += plans[p]->program_count;
  const char** names = st_xcalloc((size_t)n_max + 1, sizeof(*names));
  st_program_compile_job* jobs = st_xcalloc((size_t)n_max + 1, sizeof(*jobs));
  st_program_signature* sigs = st_xcalloc((size_t)n_max + 1, sizeof(*sigs));
  st_tensor_type** types = st_xcalloc((size_t)n_max + 1, sizeof(*types));
  int* index = st_xcalloc((size_t)n_max + 1, sizeof(*index));
  bool* queued = st_xcalloc((size_t)b->program_count + 1, sizeof(bool));
  st_status s = ST_OK;
  int m = 0;
  for (int p = 0; p < plan_count && !s; ++p)
    for (int i = 0; i < plans[p]->program_count; ++i) names[m++] = plans[p]->programs[i];
  for (int i = 0; i < extra_count && !s; ++i) names[m++] = extra[i];
  int n = 0;
  for (int k = 0; k < m && !s; ++k) {
    const char* name = names[k];
    if (st_bundle_collective_find(b, name)) continue; /* SPMD: st__compile_collectives */
    const st_bundle_program* bp = st_bundle_program_find(b, name);
    if (!bp) {
      s = st_status_make(ST_CODE_RUNTIME, "bundle %s has no program '%s'", b->dir, name);
      break;
    }
    int idx = (int)(bp - b->programs);
    if (t->compiled[idx] || queued[idx]) continue;
    queued[idx] = true;
    /* One allocation per job holds its input types, then its output types. */
    types[n] = st_xcalloc((size_t)bp->input_count + (size_t)bp->output_count + 1, sizeof(st_tensor_type));
    st__program_signature(bp, types[n], types[n] + bp->input_count, &sigs[n]);
    jobs[n] = (st_program_compile_job){.path = bp->path, .signature = &sigs[n]};
    index[n++] = idx;
  }
  int watch = n > 0 ? st__watch_compile_begin(t, n) : -1;
  if (!s) s = st_program_compile_files(t->runtime, jobs, n);
  st_watchdog_end(t->watchdog, watch);
  for (int j = 0; j < n; ++j) {
    if (!s) {
      t->compiled[index[j]] = jobs[j].program;
      t->compile_s[index[j]] = jobs[j].seconds;
    }
    free(types[j]);
  }
  free(names);
  free(jobs);
  free(sigs);
  free(types);
  free(index);
  free(queued);
  return s;
}

/* Where the SPMD program of bundle collective |c| compiled for pipeline
 * stage |stage| is kept in t->compiled_coll. */
static st_program** st__coll_at(st__trainer* t, const st_bundle_program* c, int stage) {
  const st_bundle* b = t->bundle;
  return &t->compiled_coll[(size_t)stage * (size_t)b->collective_count + (size_t)(c - b->collectives)];
}

/* The SPMD programs |plan| names (collectives and tensor-parallel compute
 * programs), each compiled once per pipeline stage that runs it
 * (st_plan_program_stage; stage 0 without a pipeline) over the plan's
 * mesh on that stage's devices s * n .. s * n + n - 1, n = plan->devices
 * (docs/parallelism.md), with the per-device signature from the manifest.
 * One-device programs are portable: st__compile_programs compiles each
 * once for every stage. */
static st_status st__compile_collectives(st__trainer* t, const st_plan* plan) {
  const st_bundle* b = t->bundle;
  if (b->collective_count == 0) return ST_OK;
  if (!t->compiled_coll) t->compiled_coll = st_xcalloc((size_t)b->collective_count * ST_PLAN_MAX_STAGES, sizeof(st_program*));
  const char* names[3] = {"data", "fsdp", "tensor"};
  const int sizes[3] = {plan->mesh[0], plan->mesh[1], plan->mesh[2]}, n = plan->devices > 1 ? plan->devices : 1;
  for (int i = 0; i < plan->program_count; ++i) {
    const st_bundle_program* c = st_bundle_collective_find(b, plan->programs[i]);
    const int stage = st_plan_program_stage(plan, i);
    if (!c) continue;
    if (stage < 0 || stage >= ST_PLAN_MAX_STAGES)
      return st_status_make(ST_CODE_INTERNAL, "program '%s' is compiled for stage %d, at most %d stages", c->name, stage,
                            ST_PLAN_MAX_STAGES);
    if (*st__coll_at(t, c, stage)) continue;
    int devices[ST_MESH_MAX_DEVICES];
    for (int d = 0; d < n && d < ST_MESH_MAX_DEVICES; ++d) devices[d] = stage * n + d;
    st_mesh mesh;
    ST_RETURN(st_mesh_make(3, names, sizes, devices, &mesh));
    st_tensor_type* types = st_xcalloc((size_t)c->input_count + (size_t)c->output_count + 1, sizeof(st_tensor_type));
    st_program_signature sig;
    st__program_signature(c, types, types + c->input_count, &sig);
    int watch = st__watch_compile_begin(t, 1);
    st_status s = st_program_compile_spmd_file(t->runtime, c->path, &mesh, &sig, st__coll_at(t, c, stage));
    st_watchdog_end(t->watchdog, watch);
    free(types);
    if (s && plan->stages > 1)
      return st_status_annotate(s, "compiling collective '%s' for pipeline stage %d (devices %d..%d)", c->name, stage,
                                stage * n, stage * n + n - 1);
    if (s) return st_status_annotate(s, "compiling collective '%s'", c->name);
  }
  return ST_OK;
}

/* Destroys every compiled SPMD program (of every stage). */
static void st__free_collectives(st__trainer* t) {
  if (!t->compiled_coll) return;
  for (size_t i = 0; i < (size_t)t->bundle->collective_count * ST_PLAN_MAX_STAGES; ++i) st_program_destroy(t->compiled_coll[i]);
  free(t->compiled_coll);
  t->compiled_coll = NULL;
}

/* Maps a plan's program indices to the compiled programs (all compiled). */
st_status st__plan_programs(st__trainer* t, const st_plan* plan, st_program*** out) {
  st_program** v = st_xcalloc((size_t)plan->program_count + 1, sizeof(st_program*));
  for (int i = 0; i < plan->program_count; ++i) {
    const st_bundle_program* bp = st_bundle_program_find(t->bundle, plan->programs[i]);
    const st_bundle_program* cp = st_bundle_collective_find(t->bundle, plan->programs[i]);
    const int stage = st_plan_program_stage(plan, i);
    v[i] = bp ? t->compiled[bp - t->bundle->programs]
           : (cp && t->compiled_coll && stage >= 0 && stage < ST_PLAN_MAX_STAGES) ? *st__coll_at(t, cp, stage)
                                                                                   : NULL;
    if (!v[i]) {
      /* st__compile_programs compiled every program of this plan first. */
      assert(!"a program of the plan was not compiled");
      free(v);
      return st_status_make(ST_CODE_INTERNAL, "program '%s' of the plan was not compiled", plan->programs[i]);
    }
  }
  *out = v;
  return ST_OK;
}

st_status st_plan_compile_temps(st_runtime* runtime, const st_bundle* bundle, st_plan* const* plans, int plan_count) {
  st__trainer t;
  memset(&t, 0, sizeof(t));
  t.bundle = bundle;
  t.runtime = runtime;
  t.compiled = st_xcalloc((size_t)bundle->program_count + 1, sizeof(st_program*));
  t.compile_s = st_xcalloc((size_t)bundle->program_count + 1, sizeof(double));
  st_status s = st__compile_programs(&t, (const st_plan* const*)plans, plan_count, NULL, 0);
  for (int p = 0; p < plan_count && !s; ++p) s = st__compile_collectives(&t, plans[p]);
  for (int p = 0; p < plan_count && !s; ++p) {
    st_program** progs = NULL;
    s = st__plan_programs(&t, plans[p], &progs);
    if (s) break;
    int64_t* tmp = st_plan_temps_of_programs(plans[p], progs, NULL);
    st_plan_set_program_temps(plans[p], tmp);
    free(tmp);
    free(progs);
  }
  for (int i = 0; i < bundle->program_count; ++i) st_program_destroy(t.compiled[i]);
  st__free_collectives(&t);
  free(t.compiled);
  free(t.compile_s);
  return s;
}

/* The stages in init order: the embedding, blocks 0..L-1, the head. */
static const st_bundle_stage* st__stage(const st_bundle* b, int i) {
  return i == 0 ? &b->embed : i <= b->layer_count ? &b->layers[i - 1] : &b->head;
}

/* The init program names of every stage, in that order (new array, owned
 * by caller; the names are borrowed from the bundle). */
static const char** st__init_programs(const st_bundle* b, int* out_count) {
  int n = b->layer_count + 2;
  const char** v = st_xcalloc((size_t)n, sizeof(*v));
  for (int i = 0; i < n; ++i) v[i] = st__stage(b, i)->init->name;
  *out_count = n;
  return v;
}

/* Runs every stage's init program (seeded; a block's also takes its index
 * and the depth) and zeroes m and v. */
/* A BPE run keeps its tokenizer.json in the run directory, so the run
 * alone decodes its ids (st_tokenizer_open(run_dir), docs/data.md); a byte
 * run writes none. */
static st_status st__copy_tokenizer(st__trainer* t) {
  const char* src = st_dataset_tokenizer_json(t->data);
  if (!src) return ST_OK;
  char* data = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(src, &data, &size);
  if (s) return st_status_recode(s, ST_CODE_DATA, "copying the tokenizer into the run directory");
  char* dst = st_rundir_path(t->run_dir, ST_RUNDIR_TOKENIZER);
  s = st_fs_write_atomic(dst, data, size);
  free(dst);
  free(data);
  return s;
}

static st_status st__init_state(st__trainer* t) {
  const st_bundle* b = t->bundle;
  st_tensor_type s32 = {ST_DTYPE_S32, 0, {0}};
  int32_t seed = (int32_t)t->o->seed;
  int32_t depth = (int32_t)b->model.n_layers;
  st_buffer* seed_buf = NULL;
  st_buffer* depth_buf = NULL;
  ST_RETURN(st_buffer_from_host(t->runtime, 0, &s32, &seed, &seed_buf));
  st_status s = st_buffer_from_host(t->runtime, 0, &s32, &depth, &depth_buf);
  /* Compiled with the step's programs on a fresh start; only a resume that
   * found no checkpoint gets here without them. */
  int n_init = 0;
  const char** init = st__init_programs(b, &n_init);
  if (!s) s = st__compile_programs(t, NULL, 0, init, n_init);
  free(init);
  for (int i = 0; i < b->layer_count + 2 && !s; ++i) {
    const st_bundle_stage* stage = st__stage(b, i);
    const st_bundle_group* grp = stage->group;
    const st_bundle_program* bp = stage->init;
    st_program* p = t->compiled[bp - b->programs];
    bool block = stage->index >= 0;
    /* a block's init(seed, layer, n_layers); the others take the seed alone */
    st_buffer* in[3] = {seed_buf, NULL, depth_buf};
    int32_t layer = stage->index;
    st_buffer* outs[ST__MAX_INIT_OUTPUTS] = {0};
    if (grp->param_count > ST__MAX_INIT_OUTPUTS || bp->output_count != grp->param_count)
      s = st_status_make(ST_CODE_RUNTIME, "bundle %s: '%s' returns %d tensors for the %d parameters of group '%s'", b->dir,
                         bp->name, bp->output_count, grp->param_count, grp->name);
    if (!s && block) s = st_buffer_from_host(t->runtime, 0, &s32, &layer, &in[1]);
    if (!s) s = st_program_execute(p, 0, in, block ? 3 : 1, outs, grp->param_count, NULL);
    st_buffer_destroy(in[1]);
    for (int k = 0; k < grp->param_count && k < ST__MAX_INIT_OUTPUTS; ++k) {
      if (s) {
        st_buffer_destroy(outs[k]);
        continue;
      }
      int pi = st_bundle_param_of(b, grp->name, stage->index, grp->params[k]);
      int slot = pi >= 0 ? st_plan_slot_find(&t->step_plan, b->params[pi].name) : -1;
      if (slot < 0) {
        st_buffer_destroy(outs[k]);
        s = st_status_make(ST_CODE_INTERNAL, "init: no slot for parameter '%s' of group '%s' layer %d", grp->params[k],
                           grp->name, stage->index);
        continue;
      }
      st_executor_set(t->ex, slot, outs[k]);
    }
    if (s) s = st_status_annotate(s, "initialising parameters with %s", bp->name);
  }
  st_buffer_destroy(seed_buf);
  st_buffer_destroy(depth_buf);
  if (s) return s;
  /* Optimizer state starts at zero (every optimizer's: docs/scheduling.md,
   * "Optimizer state"), whatever its shape: a parameter's, or another
   * (Adafactor's factored rows and columns). */
  size_t biggest = 0;
  for (int i = 0; i < b->param_count; ++i) {
    size_t n = st_tensor_type_bytes(&b->params[i].type);
    if (n > biggest) biggest = n;
  }
  for (int i = 0; i < t->step_plan.slot_count; ++i) {
    const st_slot* sl = &t->step_plan.slots[i];
    if (sl->category != ST_SLOT_OPT) continue;
    const st_tensor_type* ty = sl->logical.rank > 0 ? &sl->logical : sl->xblocks > 1 ? &sl->xwhole : &sl->type;
    if (st_tensor_type_bytes(ty) > biggest) biggest = st_tensor_type_bytes(ty);
    if (st_tensor_type_bytes(&sl->type) > biggest) biggest = st_tensor_type_bytes(&sl->type);
  }
  void* zeros = st_xcalloc(1, biggest ? biggest : 1);
  for (int i = 0; i < t->step_plan.slot_count && !s; ++i) {
    const st_slot* sl = &t->step_plan.slots[i];
    /* Persistent slots only: an offloaded slot's value lives in its host home. */
    if (sl->category != ST_SLOT_OPT || !sl->persistent) continue;
    st_buffer* z = NULL;
    /* A sharded slot takes the whole tensor and keeps each device's block
     * (so does a slot cut across processes, of its device's whole). */
    const st_tensor_type* ty = t->step_plan.devices > 1 && sl->layout == ST_LAYOUT_SHARDED ? &sl->logical
                               : sl->xblocks > 1                                          ? &sl->xwhole
                                                                                          : &sl->type;
    /* made on the first device of its pipeline stage, where the slot lives */
    const int dev = sl->stage * (t->step_plan.devices > 1 ? t->step_plan.devices : 1);
    s = st_buffer_from_host(t->runtime, dev, ty, zeros, &z);
    if (!s) st_executor_set(t->ex, i, z);
  }
  free(zeros);
  return s;
}

static st_status st__fill_train_batch(st__trainer* t) {
  return st__fill_share(t, ST_STREAM_TRAIN, (uint64_t)(t->step * t->o->batch_size), t->o->microbatches);
}

/* Evaluation: the same fixed validation sequences every time. */
static st_status st__evaluate(st__trainer* t, double* out_loss) {
  const st_plan* ep = &t->eval_plan;
  /* The eval executor borrows the current parameters for the run: every
   * one in the step plan, on the same pipeline stage (its devices). */
  for (int i = 0; i < ep->slot_count; ++i) {
    if (ep->slots[i].category != ST_SLOT_PARAM || !ep->slots[i].persistent) continue;
    int src = st_plan_slot_find(&t->step_plan, ep->slots[i].name);
    if (src < 0)
      return st_status_make(ST_CODE_INTERNAL, "evaluation: parameter slot '%s' is not in the step plan", ep->slots[i].name);
    if (t->step_plan.slots[src].stage != ep->slots[i].stage)
      return st_status_make(ST_CODE_INTERNAL, "evaluation: parameter slot '%s' is on stage %d, in the step plan on stage %d",
                            ep->slots[i].name, ep->slots[i].stage, t->step_plan.slots[src].stage);
  }
  for (int i = 0; i < ep->slot_count; ++i) {
    /* Persistent slots only: offloaded parameters are borrowed through their
     * host homes and streamed by the eval plan itself. */
    if (ep->slots[i].category != ST_SLOT_PARAM || !ep->slots[i].persistent) continue;
    int src = st_plan_slot_find(&t->step_plan, ep->slots[i].name);
    for (int d = 0; d < st_executor_devices(t->eval_ex); ++d)
      st_executor_set_borrowed_device(t->eval_ex, i, d, st_executor_get_device(t->ex, src, d));
  }
  st_status s = st__eval_batches(t, out_loss);
  st__watch_settle(t->watch_eval);
  for (int i = 0; i < ep->slot_count; ++i) {
    if (ep->slots[i].category == ST_SLOT_PARAM && ep->slots[i].persistent)
      for (int d = 0; d < st_executor_devices(t->eval_ex); ++d) st_executor_set_borrowed_device(t->eval_ex, i, d, NULL);
  }
  return s;
}

static st_status st__save_params(st__trainer* t, const char* path) {
  const st_bundle* b = t->bundle;
  st_named_tensor* ts = st_xcalloc((size_t)b->param_count + 1, sizeof(*ts));
  void** host = st_xcalloc((size_t)b->param_count + 1, sizeof(void*));
  st_status s = ST_OK;
  for (int i = 0; i < b->param_count && !s; ++i) {
    int slot = st_plan_slot_find(&t->step_plan, b->params[i].name);
    if (slot < 0) {
      s = st_status_make(ST_CODE_INTERNAL, "parameter '%s' has no slot", b->params[i].name);
      break;
    }
    size_t n = st_tensor_type_bytes(&b->params[i].type);
    host[i] = st_xmalloc(n ? n : 1);
    s = st_executor_to_host(t->ex, slot, host[i], n);
    ts[i].name = b->params[i].name;
    ts[i].type = b->params[i].type;
    ts[i].data = host[i];
  }
  if (!s) s = st_safetensors_write(path, ts, b->param_count);
  for (int i = 0; i < b->param_count; ++i) free(host[i]);
  free(host);
  free(ts);
  return s;
}

/* Data parallelism keeps the state replicated: every device applies the
 * same update to the same reduced gradient. Checked bitwise at the end of
 * a run, over every persistent slot (parameters, m, v); a replica that
 * drifted is a bug, never rounding, and fails the run naming the slot.
 * Under FSDP a device holds one fsdp block of the state, replicated over
 * data: mesh index p is compared with p mod fsdp (data coordinate 0, the
 * same block). */
static st_status st__check_replicas(st__trainer* t, int* out_checked) {
  *out_checked = 0;
  const st_plan* p = &t->step_plan;
  int D = st_executor_devices(t->ex);
  const int F = p->mesh[1] * p->mesh[2]; /* devices that hold distinct blocks: fsdp x tensor */
  if (D < 2) return ST_OK;
  st_status s = ST_OK;
  for (int i = 0; i < p->slot_count && !s; ++i) {
    if (!p->slots[i].persistent || p->slots[i].host) continue;
    const bool sharded = p->slots[i].layout == ST_LAYOUT_SHARDED;
    if (sharded && F == D) continue; /* no replicas: every device holds its own block */
    st_buffer* b0 = st_executor_get_device(t->ex, i, 0);
    if (!b0) continue;
    size_t n = st_buffer_bytes(b0);
    unsigned char* h0 = st_xmalloc(n ? n : 1);
    unsigned char* hd = st_xmalloc(n ? n : 1);
    for (int d = 1; d < D && !s; ++d) {
      int ref = sharded ? d % F : 0;
      if (ref == d) continue;
      st_buffer* br = st_executor_get_device(t->ex, i, ref);
      st_buffer* bd = st_executor_get_device(t->ex, i, d);
      if (!br || !bd || st_buffer_bytes(bd) != n || st_buffer_bytes(br) != n) {
        s = st_status_make(ST_CODE_INTERNAL, "slot '%s' on device index %d is missing or of another size", p->slots[i].name, d);
        break;
      }
      s = st_buffer_to_host(br, h0, n);
      if (!s) s = st_buffer_to_host(bd, hd, n);
      if (!s && memcmp(h0, hd, n) != 0)
        s = st_status_make(ST_CODE_INTERNAL,
                           "data parallelism: replicated slot '%s' differs between device index %d and %d after the run; "
                           "replicas must stay bitwise identical",
                           p->slots[i].name, ref, d);
    }
    free(h0);
    free(hd);
    if (!s) ++*out_checked;
  }
  return s;
}

/* The armed drills against the steps this run executes and the
 * checkpoint saves it can begin: those of the schedule (every ckpt.every
 * steps and the last), and one more when a stop signal ends it early. */
static st_status st__check_drills(const st__trainer* t) {
  const st_plan_options* o = t->o;
  const int64_t first = t->start_step + 1, last = o->steps;
  int64_t saves = 0;
  if (first <= last) {
    if (o->ckpt.every > 0) saves = last / o->ckpt.every - t->start_step / o->ckpt.every;
    if (o->ckpt.every <= 0 || last % o->ckpt.every != 0) saves++; /* the last step's */
    saves++;                                                     /* a stop's */
  }
  char why[200];
  snprintf(why, sizeof(why), "steps %lld to %lld with ckpt.every=%lld, the last step's save, and one if a stop signal ends it",
           (long long)first, (long long)last, (long long)o->ckpt.every);
  return st_faults_check_run(st_train_ckpt_faults(t->ckpt), first, last, saves, why);
}

static void st__trainer_free(st__trainer* t) {
  st__dump_discard(t);
  st_kernels_set_wrong(0); /* faults.wrong_kernel is this run's */
  json_decref(t->mem_peak);
  t->mem_peak = NULL;
  json_decref(t->faults_unfired);
  t->faults_unfired = NULL;
  st_executor_destroy(t->eval_ex);
  st_executor_destroy(t->ex);
  free(t->step_programs);
  free(t->eval_programs);
  if (t->compiled) {
    for (int i = 0; i < t->bundle->program_count; ++i) st_program_destroy(t->compiled[i]);
    free(t->compiled);
    free(t->compile_s);
  }
  st__free_collectives(t);
  st_plan_deinit(&t->step_plan);
  st_plan_deinit(&t->eval_plan);
  st_plan_remat_choice_deinit(&t->remat);
  free(t->tokens);
  free(t->targets);
  free(t->mask);
  free(t->positions);
  free(t->losses);
  free(t->sqnorms);
  free(t->num_opt);
  free(t->num_opt_read);
  free(t->num_act);
}

/* A stop signal arrived (docs/checkpoints.md, "Stopping a run"): step
 * |done| is complete and recorded. Saves it unless this attempt ran no
 * step (the newest checkpoint already holds everything), then ends the
 * run with ST_CODE_INTERRUPTED (exit 8). From here on a further signal
 * ends the process at once; the previous checkpoint stays valid, since a
 * save only becomes visible by its final rename. */
static st_status st__stop_save(st__trainer* t, int64_t done, bool progress) {
  st_stop_signals_default();
  st_progress_end(progress);
  t->stop_signal = st_stop_signal();
  t->stop_step = done;
  const char* sig = st_signal_name(t->stop_signal);
  if (done > t->start_step) {
    fprintf(stderr, "strata: %s: stopping after step %lld; writing its checkpoint (a second signal aborts the save)\n", sig,
            (long long)done);
    ST_RETURN_IF_ERROR(st_train_ckpt_save_now(t->ckpt, done), "stopping on %s after step %lld", sig, (long long)done);
    t->stop_saved = true;
  }
  /* A job continues as it was started, by its launcher (each rank names
   * the job's directory, which rank 0's checkpoint is in). */
  char* q = st_shell_quote(t->job_dir ? t->job_dir : t->run_dir);
  char how[4400];
  if (t->job_dir) snprintf(how, sizeof(how), "the same launcher command with run.resume=true (run.dir=%s)", q);
  else snprintf(how, sizeof(how), "`strata resume %s`", q);
  st_status s = done > t->start_step
                    ? st_status_make(ST_CODE_INTERRUPTED, "stopped by %s after step %lld, checkpoint step_%lld written; continue with %s",
                                     sig, (long long)done, (long long)done, how)
                    : st_status_make(ST_CODE_INTERRUPTED,
                                     "stopped by %s before the first step of this attempt (nothing new to save); continue with %s", sig, how);
  free(q);
  return s;
}

static st_status st__stop(st__trainer* t, int64_t done, bool progress) {
  st_status s = st__stop_save(t, done, progress);
  /* Every rank of a job stops here at the same step (t->stop_any): they
   * end together, unless this rank's save failed. */
  if (t->dist && st_status_code(s) == ST_CODE_INTERRUPTED) t->failed_together = true;
  return s;
}

/* The end-of-run summary on the console (run.progress: a terminal, or
 * on): what was trained, how fast, how well, where it is. Model FLOP/s
 * count 6 per parameter and token plus attention's 12 x layers x d_model
 * x seq_len per token (the PaLM convention), not the programs' own
 * counts; bits per byte divide by the validation split's bytes per
 * token (1 for the byte tokenizer; none for synthetic data). */
static void st__summary(const st__trainer* t) {
  const st_plan_options* o = t->o;
  int64_t n_params = 0;
  for (int i = 0; i < t->bundle->param_count; ++i) n_params += st_tensor_type_elements(&t->bundle->params[i].type);
  const double tokens = (double)t->steps_run * (double)o->batch_size * (double)t->T;
  const double tps = t->train_s > 0 ? tokens / t->train_s : 0;
  const double flop_per_token = t->model_flops_per_token;
  fprintf(stderr, "strata: trained %lld step%s in %.1f s of steps (%lld this run, %lld parameters)\n", (long long)o->steps,
          o->steps == 1 ? "" : "s", t->train_s, (long long)t->steps_run, (long long)n_params);
  if (isfinite(t->last_loss)) fprintf(stderr, "  final train loss %.4f", t->last_loss);
  if (isfinite(t->last_eval_loss)) {
    fprintf(stderr, ", eval loss %.4f", t->last_eval_loss);
    double bpt = st_dataset_bytes_per_token(t->data, ST_STREAM_EVAL);
    if (bpt > 0) fprintf(stderr, " (%.3f bits per byte)", t->last_eval_loss / log(2.0) / bpt);
  }
  fprintf(stderr, "\n  %.0f tokens/s (%.3g model FLOP per token)\n", tps, flop_per_token);
  st__summary_peak(t, tps * flop_per_token / 1e9);
  int devices = st_executor_devices(t->ex) * st_executor_stats_get(t->ex)->stages; /* every pipeline stage's */
  fprintf(stderr, "  peak device memory %.1f MiB%s (accounted by the plan's executor)\n", (double)t->peak_bytes / 1048576.0,
          devices > 1 ? " per device" : "");
  char* root = st_rundir_path(t->run_dir, ST_RUNDIR_CHECKPOINTS);
  char* latest = st_ckpt_read_latest(root);
  if (latest) fprintf(stderr, "  checkpoint %s/%s\n", root, latest);
  free(latest);
  free(root);
}

/* The short sample after the summary (docs/using.md, "Summary and sample
 * at the end of a run"): 128 bytes (BPE: 128 tokens; 32 ids on synthetic data) after a
 * newline, temperature 0.8, the run's seed, from params.safetensors just
 * written, kept in <run>/sample.txt as UTF-8 (a byte that does not start a
 * UTF-8 sequence becomes U+FFFD) and printed on stderr the same way. What `strata
 * sample RUN_DIR --tokens 128 --seed <seed>` prints. It never fails the
 * run: a problem is a warning. */
static st_status st__end_sample_try(st__trainer* t, double* out_seconds, double* out_compile_s) {
  const st_plan_options* o = t->o;
  const st_bundle* b = t->bundle;
  double t0 = st_now();
  char* path = st_rundir_path(t->run_dir, ST_RUNDIR_PARAMS);
  st_safetensors* file = NULL;
  st_infer_sampler* sm = NULL;
  const void** data = st_xcalloc((size_t)b->param_count + 1, sizeof(void*));
  st_status s = st_safetensors_read(path, &file);
  for (int i = 0; i < b->param_count && !s; ++i) {
    const st_safetensors_entry* e = st_safetensors_find(file, b->params[i].name);
    if (!e || st_tensor_type_bytes(&e->type) != st_tensor_type_bytes(&b->params[i].type))
      s = st_status_make(ST_CODE_CKPT, "%s: tensor '%s' is missing or of another size", path, b->params[i].name);
    else
      data[i] = file->data + e->offset;
  }
  if (!s) s = st_infer_sampler_create(t->runtime, b, data, &sm);
  const bool bytes = !o->data.synthetic;
  /* BPE: 128 tokens decoded through the run's tokenizer, from its newline. */
  st_tokenizer* tok = NULL;
  if (!s && st_dataset_tokenizer_json(t->data)) s = st_tokenizer_open(st_dataset_token_path(t->data), &tok);
  st_infer_sample_options so = {.tokens = bytes ? 128 : 32, .temperature = 0.8, .top_k = 0, .top_p = 1.0,
                                .seed = o->seed, .byte_text = bytes, .tokenizer = tok, .out = NULL};
  int32_t prompt = bytes ? '\n' : 0;
  if (tok) {
    int32_t nl = st_tokenizer_find(tok, "\n", 1);
    prompt = nl >= 0 ? nl : 0;
  }
  int32_t* ids = st_xcalloc((size_t)so.tokens, sizeof(int32_t));
  if (!s) s = st_infer_generate(sm, &prompt, 1, &so, ids);
  if (!s) {
    st_strbuf text = {0};
    if (bytes) {
      st_strbuf bytes_out = {0};
      st_strbuf_append(&bytes_out, "\n");
      for (int64_t i = 0; i < so.tokens; ++i) {
        size_t len = 1;
        char one = (char)ids[i];
        const unsigned char* tb = tok ? st_tokenizer_token(tok, ids[i], &len) : (const unsigned char*)&one;
        if (tb) st_strbuf_append_n(&bytes_out, (const char*)tb, len);
      }
      const char* raw = bytes_out.data;
      const size_t n = bytes_out.len;
      for (size_t i = 0; i < n;) {
        size_t k = 1;
        while (k <= 4 && (i + k > n || !st_utf8_valid(raw + i, k))) ++k;
        if (k <= 4) {
          st_strbuf_append_n(&text, raw + i, k);
          i += k;
        } else {
          st_strbuf_append(&text, "\xef\xbf\xbd");
          ++i;
        }
      }
      st_strbuf_free(&bytes_out);
    } else {
      st_strbuf_printf(&text, "%d", (int)prompt);
      for (int64_t i = 0; i < so.tokens; ++i) st_strbuf_printf(&text, " %d", (int)ids[i]);
      st_strbuf_append(&text, "\n");
    }
    /* The text as written, not the raw bytes: a byte the model drew could
     * be half of a terminal's escape sequence. */
    char* q = st_shell_quote(t->run_dir);
    fprintf(stderr, "  sample (temperature %.1f, seed %llu; `strata sample %s` for more)%s:\n%s%s", so.temperature,
            (unsigned long long)so.seed, q, bytes ? "" : ", synthetic data (no text): token ids",
            text.data ? text.data : "", bytes ? "\n" : "");
    free(q);
    char* out = st_rundir_path(t->run_dir, ST_RUNDIR_SAMPLE);
    s = st_fs_write_atomic(out, text.data ? text.data : "", text.len);
    free(out);
    st_strbuf_free(&text);
  }
  if (sm) *out_compile_s = st_infer_sampler_compile_seconds(sm);
  *out_seconds = st_now() - t0;
  free(ids);
  st_infer_sampler_destroy(sm);
  st_tokenizer_destroy(tok);
  st_safetensors_free(file);
  free(data);
  free(path);
  return s;
}

static void st__end_sample(st__trainer* t) {
  double seconds = 0, compile_s = 0;
  st_status s = st__end_sample_try(t, &seconds, &compile_s);
  if (s) {
    fprintf(stderr, "strata: warning: no sample at the end of the run (%s); the run itself succeeded\n", st_status_message(s));
    st_status_free(s);
    return;
  }
  fprintf(stderr, "  (sample.txt in the run directory; %.2f s, of which %.2f s compiling)\n", seconds, compile_s);
}

/* diag.on_nonfinite (docs/diagnostics.md, "Policies"), after step t->step
 * + 1 found a non-finite loss or gradient norm (|loss| is the step's mean
 * loss). With sched.optimizer=after_backward the step's update was not
 * applied (step_hooks.c); per_layer applied it. Returns ST_OK when the run
 * goes on (skip, rollback), else the exit-5 status; each action is a
 * "nonfinite" event. */
static st_status st__nonfinite(st__trainer* t, double loss) {
  const st_plan_options* o = t->o;
  int64_t step = t->step + 1;
  if (!t->nonfinite) {
    snprintf(t->nonfinite_what, sizeof(t->nonfinite_what), "loss");
    t->nonfinite_value = loss;
  }
  bool applied = o->sched.per_layer_optimizer; /* the update happened before the norm was known */
  int policy = o->nonfinite.policy;
  const char* stop_why = NULL;
  char why[160] = "";
  if (policy == ST_NONFINITE_SKIP && t->skipped_steps + 1 > o->nonfinite.max_skipped) {
    snprintf(why, sizeof(why), "diag.max_skipped=%lld steps were skipped already", (long long)o->nonfinite.max_skipped);
    stop_why = why;
  }
  if (policy == ST_NONFINITE_ROLLBACK && t->rollbacks + 1 > o->nonfinite.max_rollbacks) {
    snprintf(why, sizeof(why), "diag.max_rollbacks=%lld rollbacks were made already", (long long)o->nonfinite.max_rollbacks);
    stop_why = why;
  }
  /* Located first, while the state is still the one before the step
   * (nonfinite.c); per_layer has updated it already. */
  char* located = NULL;
  if (!applied) ST_RETURN(st__locate_nonfinite(t, &located));
  int64_t restored = -1;
  char* dir = NULL;
  if (!stop_why && policy == ST_NONFINITE_ROLLBACK) {
    st_status rs = st_train_ckpt_rollback(t->ckpt, step, &restored, &dir);
    if (rs) {
      free(located);
      return st_status_annotate(rs, "step %lld: rolling back after a non-finite %s", (long long)step, t->nonfinite_what);
    }
    if (restored < 0) stop_why = "no checkpoint to roll back to (ckpt.every saves one every N steps)";
  }
  json_t* e = st_json_obj();
  st_json_put_int(e, "step", step);
  st_json_put_str(e, "what", t->nonfinite_what);
  st_json_put_num(e, "value", t->nonfinite_value); /* null: NaN or inf */
  st_json_put_str(e, "value_text", isnan(t->nonfinite_value) ? "nan" : t->nonfinite_value > 0 ? "inf" : "-inf");
  st_json_put_str(e, "policy", st_plan_nonfinite_name(policy));
  st_json_put_bool(e, "update_applied", applied);
  /* The batch that led to it: training sequences [first, first + batch_size). */
  st_json_put_int(e, "first_sample", t->step * o->batch_size);
  st_json_put_int(e, "samples", o->batch_size);
  st_json_put(e, "located", located ? st_json_str(located) : json_null());
  /* A job: the rank whose event this is (each rank locates in its own rows). */
  if (t->o->procs > 1) st_json_put_int(e, "rank", t->o->rank);
  free(located);
  if (stop_why || policy == ST_NONFINITE_STOP) {
    st_json_put_str(e, "action", "stop");
    if (stop_why) st_json_put_str(e, "reason", stop_why);
    st_status_free(st__event(t, "nonfinite", e));
    free(dir);
    return st_status_make(ST_CODE_NUMERICS,
                          "step %lld: %s is not finite (%s); %s; stopped (diag.on_nonfinite=%s%s%s). Try a lower train.lr, "
                          "or see docs/diagnostics.md",
                          (long long)step, t->nonfinite_what, isnan(t->nonfinite_value) ? "nan" : "inf",
                          applied ? "the update was applied (sched.optimizer=per_layer)" : "the update was not applied",
                          st_plan_nonfinite_name(policy), stop_why ? ": " : "", stop_why ? stop_why : "");
  }
  if (policy == ST_NONFINITE_SKIP) {
    t->skipped_steps++;
    st_json_put_str(e, "action", "skip");
    st_json_put_int(e, "skipped_steps", t->skipped_steps);
    st_json_put_int(e, "max_skipped", o->nonfinite.max_skipped);
    fprintf(stderr, "strata: step %lld: %s is not finite; its update is dropped (diag.on_nonfinite=skip, %lld of %lld)\n",
            (long long)step, t->nonfinite_what, (long long)t->skipped_steps, (long long)o->nonfinite.max_skipped);
  } else {
    /* PaLM-style: back to the checkpoint, and the batches since it (those
     * of steps restored+1 .. step) are never trained on: the run goes on
     * with step + 1's batch, so the step count keeps indexing the data. */
    t->rollbacks++;
    t->skipped_steps += step - restored;
    st_json_put_str(e, "action", "rollback");
    st_json_put_str(e, "checkpoint", dir);
    st_json_put_int(e, "restored_step", restored);
    st_json_put_int(e, "skipped_from_step", restored + 1);
    st_json_put_int(e, "skipped_to_step", step);
    st_json_put_int(e, "skipped_first_sample", restored * o->batch_size);
    st_json_put_int(e, "skipped_samples", (step - restored) * o->batch_size);
    st_json_put_int(e, "rollbacks", t->rollbacks);
    st_json_put_int(e, "max_rollbacks", o->nonfinite.max_rollbacks);
    fprintf(stderr,
            "strata: step %lld: %s is not finite; rolled back to %s (step %lld); steps %lld..%lld's data is skipped "
            "(diag.on_nonfinite=rollback, %lld of %lld)\n",
            (long long)step, t->nonfinite_what, dir, (long long)restored, (long long)restored + 1, (long long)step,
            (long long)t->rollbacks, (long long)o->nonfinite.max_rollbacks);
  }
  free(dir);
  return st__event(t, "nonfinite", e);
}

/* The run itself, once everything is compiled. */
static st_status st__run(st__trainer* t, bool progress) {
  const st_plan_options* o = t->o;
  st_executor_hooks hooks = st__train_hooks(t);
  double t_start = st_now();
  double last_loss = NAN;
  /* A job agrees on a stop before its first step too: a rank stopping
   * alone would leave the others in the step's first collective. */
  if (t->dist) {
    double none = 0;
    ST_RETURN(st__losses_global(t, &none, 0));
  }
  if ((t->dist ? t->stop_any : st_stop_signal() != 0) && t->start_step < o->steps) return st__stop(t, t->start_step, progress);
  for (t->step = t->start_step; t->step < o->steps; ++t->step) {
    double t0 = st_now();
    st__watch_step_begin(t);
    ST_RETURN(st__fill_train_batch(t));
    t->data_s = st_now() - t0;
    t->losses_global = false;
    st__metrics_reset(t);
    st__numerics_reset(t);
    st__kernels_step_begin(t);
    st__dump_begin(t);
    st_status run = st_executor_run(t->ex, &hooks);
    st__watch_settle(t->watch_step);
    if (run) st__dump_discard(t);
    ST_RETURN_IF_ERROR(run, "step %lld", (long long)t->step + 1);
    ST_RETURN(st__dump_end(t));
    st_train_ckpt_step_ran(t->ckpt, t->step + 1);
    if (!t->losses_global) ST_RETURN(st__losses_global(t, t->losses, o->microbatches));
    double loss = st__batch_loss(t, ST_STREAM_TRAIN, t->losses, o->microbatches);
    bool dropped = false;
    if (t->nonfinite || !isfinite(loss)) {
      ST_RETURN(st__nonfinite(t, loss));
      dropped = true;
    } else {
      last_loss = loss;
    }
    t->update_dropped = dropped;
    double dt = st_now() - t0;
    t->steps_run++;
    t->train_s += dt;
    if (!dropped) {
      t->last_loss = loss;
      ST_RETURN(st__loss_spike(t, loss));
    }
    const st_executor_stats* es = st_executor_stats_get(t->ex);
    if (es->peak_live_bytes > t->peak_bytes) t->peak_bytes = es->peak_live_bytes;
    int64_t tokens = o->batch_size * t->T;
    ST_RETURN(st__step_metrics(t, loss, dt));
    double elapsed = st_now() - t_start;
    double eta = elapsed / (double)(t->step + 1) * (double)(o->steps - t->step - 1);
    st_progress_print(progress, t->step + 1, o->steps, loss, (double)tokens / dt, eta);
    /* The step as the watchdog sees it ends here: the evaluation's ops and
     * the checkpoint write are watched on their own, and a rare slow
     * evaluation or final save must not look like a hung step. */
    st__watch_step_end(t);

    bool last = t->step + 1 == o->steps;
    if ((o->eval_every > 0 && (t->step + 1) % o->eval_every == 0) || last) {
      double eval_loss = 0;
      ST_RETURN(st__evaluate(t, &eval_loss));
      ST_RETURN(st__eval_metrics(t, eval_loss));
      t->last_eval_loss = eval_loss;
      if (progress) {
        st_progress_end(true);
        fprintf(stderr, "eval at step %lld: loss %.4f\n", (long long)t->step + 1, eval_loss);
      }
      json_t* f = st_json_obj();
      st_json_put_int(f, "step", t->step + 1);
      st_json_put(f, "eval_loss", st_json_fixed(eval_loss, 6));
      ST_RETURN(st__event(t, "eval", f));
    }
    /* Before a checkpoint save and after an evaluation: what malloc holds
     * for the step's buffers goes back to the kernel, so the save's
     * staging comes on top of the state, not of the step's high-water mark
     * (the next step faults its buffers in once more). */
    if (last || (o->eval_every > 0 && (t->step + 1) % o->eval_every == 0) || (o->ckpt.every > 0 && (t->step + 1) % o->ckpt.every == 0))
      st_runtime_release_host_memory();
    ST_RETURN(st_train_ckpt_step_done(t->ckpt, t->step + 1));
    char at[48];
    snprintf(at, sizeof(at), "step %lld", (long long)t->step + 1);
    st__memory_sample(t, at);
    /* Polled once a step: the handler only sets a flag. After the last
     * step the run is complete anyway. */
    /* A job stops when any rank was asked to, all at the same step. */
    if ((t->dist ? t->stop_any : st_stop_signal() != 0) && t->step + 1 < o->steps) return st__stop(t, t->step + 1, progress);
  }
  st_progress_end(progress);
  /* A resume at the last step runs no step: no loss to report. */
  json_t* f = st_json_obj();
  st_json_put_int(f, "steps", o->steps);
  st_json_put(f, "final_loss", st_json_fixed(last_loss, 6)); /* null when not finite */
  if (o->nonfinite.policy != ST_NONFINITE_STOP) {
    st_json_put_int(f, "skipped_steps", t->skipped_steps);
    st_json_put_int(f, "rollbacks", t->rollbacks);
  }
  st_json_put(f, "seconds", st_json_fixed(st_now() - t_start, 3));
  /* Every save of the run is done (the last one is synchronous): a drill
   * still unfired never will fire in this process. */
  st_faults* faults = st_train_ckpt_faults(t->ckpt);
  if (st_faults_any_armed(faults)) {
    json_decref(t->faults_unfired);
    t->faults_unfired = st_faults_unfired(faults);
    st_json_put(f, "faults_unfired", json_incref(t->faults_unfired));
  }
  ST_RETURN(st__event(t, "run_done", f));
  return ST_OK;
}

/* An allocation that failed after all (st_xmalloc & co, strata/base.h):
 * the run's final event, then base exits 4. Runs in the failing thread:
 * t->log is NULL until the run log is open (then stderr alone says it),
 * is closed only after the hook is removed, and each event is one
 * write(2) of its own, so another thread's event cannot be torn by it. */
static void st__on_oom(void* ctx, size_t bytes, const char* what) {
  st__trainer* t = ctx;
  st_status s = st_status_make(
      ST_CODE_MEMORY,
      "allocating %zu bytes of host memory failed%s%s%s. The memory check before the run (docs/scheduling.md, \"Will it "
      "fit\") predicts strata's buffers, not every allocation, and reads neither ulimit -v nor a cgroup v1 limit: set "
      "runtime.device_memory_bytes to what this run may really use, or see strata plan --fit for policies that need less",
      bytes, what[0] ? " (" : "", what, what[0] ? ")" : "");
  fprintf(stderr, "strata: %s: %s\n", st_code_name(st_status_code(s)), st_status_message(s));
  if (t->log) st__failed_event(t, s);
  st_status_free(s);
}

/* --- init: the run directory, its log, the metrics endpoint, the data --- */
static st_status st__train_init(st__trainer* t, const st_config* cfg, st_plan_options* o, int* lock_fd) {
  bool reused = false;
  ST_RETURN(st__make_run_dir(t, cfg, o, &t->run_dir, lock_fd, &reused));
  ST_RETURN(st_runlog_open(t->run_dir, &t->log));
  if (o->tensorboard) {
    char* tb = st_rundir_path(t->run_dir, ST_RUNDIR_TB);
    st_status s = st_runlog_tensorboard(t->log, tb);
    free(tb);
    ST_RETURN(s);
  }
  if (reused && !o->resume) {
    json_t* f = st_json_obj();
    st_json_put_str(f, "reason", "an earlier attempt in this directory stopped before its first step");
    ST_RETURN(st_runlog_event(t->log, "run_dir_reused", f));
  }
  /* The endpoint first: a port in use fails the run (exit 2) before any
   * data, compile, step or checkpoint. */
  if (o->metrics_port > 0) {
    ST_RETURN(st_metrics_server_start(o->metrics_port, st_rundir_id(t->run_dir), &t->metrics));
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", o->metrics_port);
    json_t* f = st_json_obj();
    st_json_put_str(f, "url", url);
    st_json_put_int(f, "port", o->metrics_port);
    ST_RETURN(st__event(t, "metrics_endpoint", f));
    fprintf(stderr, "metrics at %s\n", url);
  }
  ST_RETURN(st_dataset_open(&o->data, &t->data));
  return st__watch_start(t);
}

/* context.json, and the same facts as the init event. */
static st_status st__context_event(st__trainer* t, const st_config* cfg) {
  const st_plan_options* o = t->o;
  char hash[17];
  st_config_hash(cfg, NULL, 0, hash);
  st_context_runtime rt;
  st__context_runtime(t->runtime, &rt);
  int mesh_devices = o->parallel_data * o->parallel_fsdp * o->parallel_tensor;
  st_context_facts facts = {.run_id = st_rundir_id(t->run_dir),
                            .config_hash = hash,
                            .bundle_key = t->bundle->key,
                            .tokenizer_hash = st_dataset_tokenizer_hash(t->data),
                            .jax_version = t->bundle->jax_version,
                            .jaxlib_version = t->bundle->jaxlib_version,
                            .runtime = &rt,
                            .peak = st_train_peak_json(&t->peak, mesh_devices),
                            .kernels = st_kernels_bundle_json(t->bundle),
                            .model = st_plan_model_desc(o),
                            .author = o->author};
  /* The sources as this process found them (written before a resume's
   * restore: "drawn" counts from the stream's start; checkpoints record
   * the position they were taken at). */
  json_t* data = NULL;
  st_status s = st_train_data_contract(t->data, 0, &data);
  facts.data = data;
  json_t* ctx = NULL;
  if (!s) s = st_rundir_write_context(t->run_dir, &facts, &ctx);
  json_decref(data);
  json_decref(facts.peak);
  json_decref(facts.kernels);
  json_decref(facts.model);
  if (!s) {
    json_t* f = st_json_obj();
    st_json_put_str(f, "run_dir", t->run_dir);
    st_json_put_int(f, "steps", o->steps);
    st_json_put(f, "context", json_incref(ctx));
    s = st__event(t, "init", f);
  }
  json_decref(ctx);
  return s;
}

/* The bundle event: where it is, its lint warnings (its errors stopped the
 * run before here), its kernels and any fallback the exporter took
 * (docs/kernels.md, "Selection and fallback"), how auto was resolved. */
static st_status st__bundle_event(st__trainer* t, bool exported) {
  const st_bundle* bundle = t->bundle;
  json_t* f = st_json_obj();
  st_json_put_str(f, "dir", bundle->dir);
  st_json_put_str(f, "key", bundle->key);
  st_json_put_bool(f, "exported", exported);
  st_json_put(f, "lint", st_lint_json(&bundle->lint));
  st_json_put(f, "kernels", st_kernels_bundle_json(bundle));
  st_json_put(f, "kernel_selection", st_plan_kernel_selection_json(t->o));
  json_t* fb = json_array();
  for (int i = 0; i < bundle->kernel_count; ++i)
    if (bundle->kernels[i].fallback[0]) {
      json_t* e = st_json_obj();
      st_json_put_str(e, "op", bundle->kernels[i].name);
      st_json_put_str(e, "asked", bundle->kernels[i].impl);
      st_json_put_str(e, "fallback", bundle->kernels[i].fallback);
      json_array_append_new(fb, e);
    }
  if (json_array_size(fb) > 0) st_json_put(f, "kernel_fallbacks", fb);
  else json_decref(fb);
  return st__event(t, "bundle", f);
}

/* --- open: bundle and runtime (st_plan_open), MFU's peak, the context --- */
static st_status st__train_open(st__trainer* t, const st_config* cfg, st_plan_options* o) {
  /* A stop signal during a cold export ends the exporter at once (exit 8,
   * nothing saved: no step has run). */
  st_plan_open_options how = {.progress = true, .stop = st_stop_signal, .check_mesh = true};
  st_plan_opened* op = &t->opened;
  st_status s = st_plan_open_bundle(o, &how, op);
  t->bundle = op->bundle;
  /* A client shared by the job's processes forms only when every rank
   * creates it at once: rank 0 lets the others go now, not after it has
   * compiled (st__job_rank0_first). */
  st__job_runtime_kv(t, o);
  if (!s && t->shared_client) {
    t->rank0_released = true;
    s = st__job_rank0_first(t, false);
  }
  /* The data are open: what the plugin adds comes next (the memory events). */
  if (!s) s = st_plan_open_runtime(o, &how, op);
  if (s && t->shared_client && st_status_code(s) == ST_CODE_RUNTIME)
    s = st_status_annotate(s, "runtime.shared_client=%s: one PJRT client across the job's %d processes (off: one "
                              "client per process)",
                           o->shared_client == 1 ? "on" : "auto", o->procs);
  t->runtime = op->runtime;
  t->mem_base = op->mem_before_runtime;
  t->mem_plugin = op->mem_after_runtime;
  ST_RETURN(s);
  /* MFU's peak (mfu.c), named in context.json; measured now only when
   * nothing better is known and nothing is stored. */
  st_train_peak_resolve(t->runtime, o->cache_root, o->peak_flops, true, &t->peak);
  t->model_flops_per_token = st_train_model_flops_per_token(t->bundle);
  ST_RETURN(st__context_event(t, cfg));
  json_t* f = st_json_obj();
  st_json_put_str(f, "token_file", st_dataset_token_path(t->data));
  st_json_put_int(f, "tokens", (int64_t)st_dataset_token_count(t->data));
  st_json_put_int(f, "train_tokens", (int64_t)st_dataset_split_tokens(t->data, 0));
  st_json_put_int(f, "val_tokens", (int64_t)st_dataset_split_tokens(t->data, 1));
  ST_RETURN(st__event(t, "data", f));
  return st__bundle_event(t, op->exported);
}

/* Will it fit: the predicted peak with temporaries against the device's
 * memory, before anything runs (docs/scheduling.md, "Will it fit"). */
static st_status st__train_fit(st__trainer* t) {
  const st_plan_options* o = t->o;
  st_plan_fit_report fr;
  ST_RETURN(st_plan_fit(t->runtime, t->bundle, o, &t->step_plan, true, &fr));
  st_status nofit = st_plan_fit_status(&fr, o);
  if (fr.limit > 0) {
    json_t* f = st_plan_fit_json(&fr);
    st_json_put_bool(f, "allow_overcommit", o->allow_overcommit);
    st_status_free(st__event(t, "fit", f));
  }
  if (nofit && o->allow_overcommit) {
    fprintf(stderr, "strata: warning: %s (sched.allow_overcommit=true: going on)\n", st_status_message(nofit));
    st_status_free(nofit);
    return ST_OK;
  }
  return nofit;
}

/* --- compile: the plans, every program they launch, the executors ------ */
static st_status st__train_compile(st__trainer* t, st_plan_options* o) {
  double t_compile = st_now();
  st_runtime_stats rs;
  st_runtime_get_stats(t->runtime, &rs);
  t->compiles_before = rs.compiles;
  t->cache_hits_before = rs.cache_hits;
  /* A fractional sched.memory_budget is of the least memory among the
   * devices the plan uses (0 when the plugin reports none). */
  int used = (o->parallel_data > 1 ? o->parallel_data : 1) * (o->parallel_fsdp > 1 ? o->parallel_fsdp : 1) *
             (o->parallel_tensor > 1 ? o->parallel_tensor : 1);
  o->device_memory = 0;
  for (int d = 0; d < used; ++d) {
    int64_t m = st_runtime_device_memory(t->runtime, d);
    if (d == 0 || m < o->device_memory) o->device_memory = m;
  }
  ST_RETURN(st_plan_build(t->bundle, o, &t->step_plan, &t->eval_plan, &t->remat));
  /* Before anything is compiled: a drill the plan never reaches is refused. */
  ST_RETURN(st__check_nan_at(t));
  ST_RETURN(st__check_slow_program(t));
  /* Every program the run needs, compiled as one batch. A resume usually
   * restores every parameter from a checkpoint, so it leaves the init
   * programs out and compiles them later only if no checkpoint is found. */
  t->compiled = st_xcalloc((size_t)t->bundle->program_count + 1, sizeof(st_program*));
  t->compile_s = st_xcalloc((size_t)t->bundle->program_count + 1, sizeof(double));
  const st_plan* plans[2] = {&t->step_plan, &t->eval_plan};
  int n_init = 0;
  const char** init = st__init_programs(t->bundle, &n_init);
  st_status s = st__compile_programs(t, plans, 2, init, o->resume ? 0 : n_init);
  free(init);
  ST_RETURN(s);
  ST_RETURN(st__compile_collectives(t, &t->step_plan));
  ST_RETURN(st__compile_collectives(t, &t->eval_plan)); /* its SPMD programs may differ (tensor: block fwd) */
  ST_RETURN(st__plan_programs(t, &t->step_plan, &t->step_programs));
  ST_RETURN(st__plan_programs(t, &t->eval_plan, &t->eval_programs));
  /* XLA's temporaries of each program, now that they are compiled: the
   * plan event and strata plan --compile show the same peak. */
  int64_t* tmp = st_plan_temps_of_programs(&t->step_plan, t->step_programs, NULL);
  st_plan_set_program_temps(&t->step_plan, tmp);
  free(tmp);
  tmp = st_plan_temps_of_programs(&t->eval_plan, t->eval_programs, NULL);
  st_plan_set_program_temps(&t->eval_plan, tmp);
  free(tmp);
  ST_RETURN(st__train_fit(t));
  ST_RETURN(st_executor_create(&t->step_plan, t->runtime, t->step_programs, 0, &t->ex));
  ST_RETURN(st_executor_create(&t->eval_plan, t->runtime, t->eval_programs, 0, &t->eval_ex));
  st_executor_set_dist(t->ex, t->dist);
  st_executor_set_dist(t->eval_ex, t->dist);
  ST_RETURN(st__check_hang_in(t));
  t->watch_step = st__watch_executor(t, t->ex, &t->step_plan, "step");
  t->watch_eval = st__watch_executor(t, t->eval_ex, &t->eval_plan, "eval");
  ST_RETURN(st__plan_event(t));
  return st__compile_event(t, st_now() - t_compile);
}

/* The host buffers of a step: batch, losses, norms, block metrics and, with
 * diag.numerics, the statistics read back. */
static st_status st__train_buffers(st__trainer* t) {
  const st_plan_options* o = t->o;
  const st_bundle* bundle = t->bundle;
  /* data or fsdp across processes: each process trains on its rows */
  t->mb = o->batch_size / o->microbatches / (o->span_axis != ST_PLAN_SPAN_NONE ? o->procs : 1);
  t->T = o->data.seq_len;
  int64_t rows = o->batch_size * (o->eval_batches > 1 ? o->eval_batches : 1);
  t->tokens = st_xcalloc((size_t)(rows * t->T), sizeof(int32_t));
  t->targets = st_xcalloc((size_t)(rows * t->T), sizeof(int32_t));
  t->mask = st_xcalloc((size_t)(rows * t->T), sizeof(float));
  if (o->data.packing == ST_DATA_PACKING_PACK) t->positions = st_xcalloc((size_t)(rows * t->T), sizeof(int32_t));
  t->losses = st_xcalloc((size_t)(o->microbatches * (o->eval_batches > 1 ? o->eval_batches : 1)), sizeof(double));
  t->n_sq = (int)bundle->model.n_layers + 2;
  t->sqnorms = st_xcalloc((size_t)t->n_sq, sizeof(double));
  t->n_metrics = st_plan_block_metrics(bundle, t->metric_names, t->metric_ranks);
  if (o->numerics == ST_NUMERICS_OFF) return ST_OK;
  t->num_opt = st_xcalloc((size_t)t->n_sq, sizeof(*t->num_opt));
  t->num_opt_read = st_xcalloc((size_t)t->n_sq, sizeof(bool));
  if (o->numerics == ST_NUMERICS_LAYER) t->num_act = st_xcalloc((size_t)t->n_sq, sizeof(*t->num_act));
  if (!bundle->groups[0].update_stats || !bundle->layers[0].act_stats)
    return st_status_make(ST_CODE_RUNTIME,
                          "diag.numerics=%s: bundle %s has no update_stats (adamw_stats)/act_stats programs (exported by an older "
                          "strata_jax, or for a mesh); re-export it, or set diag.numerics=off",
                          o->numerics == ST_NUMERICS_LAYER ? "layer" : "step", bundle->dir);
  return ST_OK;
}

/* --- start: checkpoints, restore or init, the drills, the run event ---- */
static st_status st__train_start(st__trainer* t, const st_config* cfg, double t0) {
  const st_plan_options* o = t->o;
  ST_RETURN(st__train_buffers(t));
  /* fsdp across processes: no rank holds the whole state. With one device
   * per process each rank saves its rows (per-rank shards); with tensor
   * parallelism inside, per-rank checkpoints are not built: the options
   * refuse periodic saves and resuming, and the final parameters go whole
   * to params.safetensors. */
  const bool xfsdp = o->procs > 1 && o->span_axis == ST_PLAN_SPAN_FSDP;
  const bool shards = xfsdp && t->step_plan.devices == 1;
  if (xfsdp && !shards && o->rank == 0)
    fprintf(stderr, "strata: parallel.fsdp=%d spans the %d processes with %d devices each: no checkpoint is written (per-rank "
                    "checkpoints are built for one device per process; docs/multiprocess.md); the final parameters go to "
                    "params.safetensors\n",
            o->global_fsdp, o->procs, t->step_plan.devices);
  st_train_ckpt_init ci = {cfg, o, t->run_dir, t->bundle, &t->step_plan, t->ex, t->runtime, t->log, t->data,
                           t->job_dir, o->rank > 0 && !shards, t->dist, xfsdp && !shards, shards};
  ST_RETURN(st_train_ckpt_create(&ci, &t->ckpt));
  st_train_ckpt_set_watchdog(t->ckpt, t->watchdog);
  /* Restore first: a checkpoint sets every parameter and optimizer slot, so
   * a resume that finds one skips the init programs altogether. */
  bool restored = false;
  ST_RETURN(st_train_ckpt_restore(t->ckpt, &t->start_step, &restored));
  /* After the restore, which refuses a checkpoint of another tokenizer
   * (exit 3) before this could replace the run's tokenizer.json. */
  ST_RETURN(st__copy_tokenizer(t));
  if (o->resume) ST_RETURN(st_rundir_write_config(t->run_dir, cfg));
  if (!restored) ST_RETURN(st__init_state(t));
  /* Now the first step is known: every armed drill can fire in this run. */
  ST_RETURN(st__check_drills(t));
  ST_RETURN(st__dump_check(t));
  st_runtime_release_host_memory(); /* init's host buffers (zeroed m, v) are not needed again */
  st__memory_sample(t, "start");
  ST_RETURN(st__memory_event(t, "start"));
  json_t* f = st_json_obj();
  st_json_put(f, "startup_seconds", st_json_fixed(st_now() - t0, 3));
  return st__event(t, "run", f);
}

/* The run completed but a drill never fired: it drilled nothing, and a
 * zero exit would read as a pass (exit 2: the drill does not fit this
 * run; a restart would not fire it either). */
static st_status st__check_unfired(st__trainer* t) {
  if (!t->faults_unfired || json_array_size(t->faults_unfired) == 0) return ST_OK;
  const int64_t saves = st_faults_saves(st_train_ckpt_faults(t->ckpt));
  st_strbuf b = {0};
  for (size_t i = 0; i < json_array_size(t->faults_unfired); ++i)
    st_strbuf_printf(&b, "%s%s", i ? ", " : "", json_string_value(json_array_get(t->faults_unfired, i)));
  st_status s = st_status_make(
      ST_CODE_CONFIG,
      "the run completed (steps %lld to %lld, %lld checkpoint save%s) but %s never fired: the drill tested "
      "nothing; make it name a step or save this run reaches (docs/checkpoints.md, \"Fault injection\")",
      (long long)t->start_step + 1, (long long)t->o->steps, (long long)saves, saves == 1 ? "" : "s", st_strbuf_cstr(&b));
  st_strbuf_free(&b);
  return s;
}

/* --- save: the final parameters, the peak memory event ----------------- */
static st_status st__train_save(st__trainer* t) {
  int replicas_checked = 0;
  ST_RETURN(st__check_replicas(t, &replicas_checked));
  char* path = st_rundir_path(t->run_dir, ST_RUNDIR_PARAMS);
  st_status s = st__save_params(t, path);
  if (!s) {
    json_t* f = st_json_obj();
    st_json_put_str(f, "path", path);
    /* Data parallelism: how many replicated slots were found bitwise equal on every device. */
    if (replicas_checked > 0) st_json_put_int(f, "replicas_bitwise_equal", replicas_checked);
    s = st__event(t, "saved", f);
  }
  free(path);
  st__memory_sample(t, "final save");
  st_runtime_release_host_memory();
  if (!s) s = st__memory_event(t, "peak");
  if (!s) s = st__check_unfired(t);
  return s;
}

/* `strata train`, top to bottom: init -> open -> compile -> start -> run
 * -> save, then the final event, the summary and a sample. Each phase
 * returns at its first error; what was created is released here, in
 * reverse order. */
st_status st_train_main(const st_config* cfg) {
  st_plan_options o;
  st__trainer t;
  memset(&t, 0, sizeof(t));
  st_status s = st_plan_options_from_config(cfg, &o);
  if (!s) s = st__job_init(&t, &o);
  if (!s) s = st__job_agree(&t, cfg);
  if (s) {
    st_status_free(st_dist_finalize(t.dist));
    st_plan_options_deinit(&o);
    return s;
  }
  t.last_loss = t.last_eval_loss = NAN;
  t.o = &o;
  bool progress = o.progress == 1 || (o.progress == 2 && isatty(2));
  double t0 = st_now();
  /* SIGTERM, SIGINT, SIGHUP: finish the step, checkpoint, exit 8. */
  st_stop_guard stop_guard;
  st_stop_signals_install(&stop_guard);
  /* A job: SIGUSR1 too, which mpirun forwards to every rank (on SIGTERM it
   * kills them; docs/multiprocess.md, "Failures"). */
  if (t.dist) st_stop_signals_add_usr1(&stop_guard);
  /* An allocation failure from here on writes the failed event and exits 4
   * instead of aborting without one (docs/architecture.md). */
  st_oom_hook oom_hook;
  st_oom_hook_install(&oom_hook, st__on_oom, &t);
  int lock_fd = -1;

  s = st__train_init(&t, cfg, &o, &lock_fd);
  if (!s) s = st__job_rank0_first(&t, true);
  if (!s) s = st__train_open(&t, cfg, &o);
  if (!s) s = st__train_compile(&t, &o);
  if (t.dist) {
    st_status js = t.rank0_released ? ST_OK : st__job_rank0_first(&t, false);
    if (!s) s = js;
    else st_status_free(js);
    if (!s) {
      s = st__job_agree(&t, NULL);
      /* Every rank got the same mismatch; an MPI failure is no verdict. */
      if (st_status_code(s) == ST_CODE_CONFIG) t.failed_together = true;
    }
  }
  st_mem_usage_read(&t.mem_compiled);
  if (!s) s = st__train_start(&t, cfg, t0);
  if (!s) s = st__run(&t, progress);
  st__watch_step_end(&t); /* a step that failed */
  if (!s) s = st__train_save(&t);

  if (s && t.log && st_status_code(s) == ST_CODE_INTERRUPTED) {
    st__interrupted_event(&t, s);
  } else if (s && t.log) {
    st__failed_event(&t, s);
  }
  /* A rank failing alone ends the job here, before the clean-up below:
   * freeing the executor settles its cross-process ops, which the other
   * ranks will never join. */
  if (s) st__job_fail(&t, s);
  if (!s) {
    st_status_free(st_runlog_event(t.log, "done", NULL));
    if (progress) {
      st__summary(&t);
      st__end_sample(&t);
    }
    printf("run directory: %s\n", t.run_dir);
  }
  st_train_ckpt_destroy(t.ckpt);
  st__watch_stop(&t); /* after the checkpoints: their last write is watched */
  st__trainer_free(&t);
  st_plan_close(&t.opened);
  st_dataset_destroy(t.data);
  st_metrics_server_stop(t.metrics);
  st_oom_hook_remove(&oom_hook); /* before the log it writes to is closed */
  st_runlog_close(t.log);
  if (lock_fd >= 0) close(lock_fd); /* last: everything the run writes is written */
  free(t.run_dir);
  free(t.job_dir);
  /* Every rank, failed or not: finalize waits for all of them. */
  st_status fs = st_dist_finalize(t.dist);
  if (!s) s = fs;
  else st_status_free(fs);
  st_plan_options_deinit(&o);
  st_stop_signals_restore(&stop_guard);
  return s;
}
