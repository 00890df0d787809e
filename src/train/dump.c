/* dump.c — diag.dump=step:N: every program's inputs and outputs of one step
 * (docs/diagnostics.md, "Dump and compare"; the format is
 * "strata-dump/1").
 *
 * The executor's launching/launched hooks (the ones the non-finite
 * locator uses) copy each LAUNCH's and RECOMPUTE's tensors to the host,
 * device index by device index; once the op's last device index has been
 * seen, the devices' copies become one logical tensor: split batch rows
 * concatenated, partial sums summed, fsdp blocks reassembled without
 * their padding (st_sharding_assemble), replicated values taken from
 * device index 0. Tensors with the same bytes are stored once (a
 * parameter is an input of its forward, backward and update), so entries
 * may share a key. After the step, <run>/dump/step_<N>/ is written
 * atomically: index.json (entries in plan order) and tensors.safetensors.
 *
 * Copying to the host waits for each launch's inputs and outputs, which
 * changes when the host issues work, never what a program computes: the
 * dump step's numbers are those of a run without the dump
 * (tests/py/test_compare.py checks the losses bitwise). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/kernels.h"
#include "strata/obs.h"
#include "train/train_internal.h"

#define ST__DUMP_FORMAT "strata-dump/1"

typedef struct st__dump_tensor {
  char* key;
  st_tensor_type type;
  void* data;
  uint64_t hash;
} st__dump_tensor;

/* The op being copied: per device index, its inputs' (or outputs') host
 * copies. Apart, since a one-device program on several devices sees
 * launching(0), launched(0), launching(1), ... */
typedef struct st__dump_io {
  void** host; /* [ndev * count] */
  st_tensor_type* types;
  int count;
} st__dump_io;

struct st__dump {
  int ndev;
  st__dump_io io[2]; /* inputs, outputs */
  json_t* entry;      /* the op's entry while it is being filled (owned) */
  const st_op* entry_op;
  json_t* entries;    /* the index's entries (owned) */
  int seq;
  st__dump_tensor* tensors;
  int n_tensors, cap_tensors;
  int64_t bytes;      /* the unique tensors' bytes */
};

static void st__dump_host_free(st__dump* d, int which) {
  st__dump_io* io = &d->io[which];
  if (io->host)
    for (int i = 0; i < d->ndev * io->count; ++i) free(io->host[i]);
  free(io->host);
  free(io->types);
  io->host = NULL;
  io->types = NULL;
  io->count = 0;
}

static void st__dump_free(st__dump* d) {
  if (!d) return;
  st__dump_host_free(d, 0);
  st__dump_host_free(d, 1);
  json_decref(d->entry);
  json_decref(d->entries);
  for (int i = 0; i < d->n_tensors; ++i) {
    free(d->tensors[i].key);
    free(d->tensors[i].data);
  }
  free(d->tensors);
  free(d);
}

/* What a program does in the step, from the bundle's program tables:
 * "fwd", "recompute" (a RECOMPUTE op), "loss" (the head's loss and
 * gradients), "bwd", "accum", "norm", "update", "stats", else "other";
 * |stage| gets "embed", "block" or "head" (the matching key of
 * strata compare, with layer, microbatch and tensor name). */
static const char* st__dump_phase(const st__trainer* t, const st_op* op, const char* name, const char** stage) {
  const st_bundle* b = t->bundle;
#define ST__IS(p) ((p) && !strcmp((p)->name, name))
  const st_bundle_stage* stages[3] = {&b->embed, NULL, &b->head};
  const char* stage_names[3] = {"embed", "block", "head"};
  for (int k = 0; k < 3; ++k) {
    int n = k == 1 ? b->layer_count : 1;
    for (int i = 0; i < n; ++i) {
      const st_bundle_stage* s = k == 1 ? &b->layers[i] : stages[k];
      const st_bundle_group* g = s->group;
      *stage = stage_names[k];
      if (ST__IS(s->fwd) || ST__IS(s->fwd_res)) return op->kind == ST_OP_RECOMPUTE ? "recompute" : "fwd";
      if (ST__IS(s->loss) || ST__IS(s->eval)) return "loss";
      if (ST__IS(s->bwd) || ST__IS(s->bwd_res)) return "bwd";
      if (ST__IS(s->act_stats)) return "stats";
      if (ST__IS(s->accum_tied)) return "accum";
      if (!g) continue;
      if (ST__IS(g->accum) || ST__IS(g->shard_accum)) return "accum";
      if (ST__IS(g->sqnorm) || ST__IS(g->shard_sqnorm)) return "norm";
      if (ST__IS(g->update) || ST__IS(g->update_stats) || ST__IS(g->shard_update)) return "update";
    }
  }
#undef ST__IS
  *stage = op->layer >= 0 ? "block" : "";
  return "other";
}

/* The tensor class compare budgets by: from the manifest role and, for a
 * parameter, whether the update wrote it. */
static const char* st__dump_class(const char* role, bool out, const char* phase) {
  if (!role) return "other";
  if (!strcmp(role, "param")) return out && !strcmp(phase, "update") ? "param_updated" : "param";
  if (!strncmp(role, "opt_", 4)) return "optimizer";
  if (!strcmp(role, "grad")) return "gradient";
  if (!strcmp(role, "activation_grad")) return "activation_grad";
  if (!strcmp(role, "activation") || !strcmp(role, "residual")) return "activation";
  if (!strcmp(role, "loss")) return "loss";
  if (!strcmp(role, "batch")) return "batch";
  if (!strcmp(role, "scalar")) return "scalar";
  if (!strcmp(role, "metric")) return "metric";
  return "other";
}

/* Whether slot |slot| was last written, before op |k|, by an in-place
 * all-reduce (a COLLECTIVE or XPROC): its devices then hold the sum, not
 * their parts. */
static bool st__dump_reduced(const st_plan* plan, int k, int slot) {
  for (int i = k - 1; i >= 0; --i) {
    const st_op* op = &plan->ops[i];
    for (int j = 0; j < op->output_count; ++j)
      if (op->outputs[j] == slot)
        return (op->kind == ST_OP_COLLECTIVE || op->kind == ST_OP_XPROC) && op->tag == ST_COLL_ALL_REDUCE;
  }
  return false;
}

/* The logical tensor of |slot| from its devices' copies |parts| (ndev of
 * type |local|): *out (owned) and its type. */
static st_status st__dump_logical(const st__trainer* t, int k, int slot, const st_tensor_type* local, void* const* parts,
                                  int ndev, st_tensor_type* out_type, void** out) {
  const st_plan* plan = &t->step_plan;
  const st_slot* s = &plan->slots[slot];
  const size_t lb = st_tensor_type_bytes(local);
  if (ndev == 1 || s->layout == ST_LAYOUT_REPLICATED ||
      (s->layout == ST_LAYOUT_PARTIAL && st__dump_reduced(plan, k, slot))) {
    *out_type = *local;
    *out = st_xmalloc(lb ? lb : 1);
    memcpy(*out, parts[0], lb);
    return ST_OK;
  }
  st_tensor_type g = *local;
  st_sharding sh;
  memset(&sh, 0, sizeof(sh));
  const uint32_t rows = (plan->mesh[0] > 1 ? ST_PLAN_AXIS_DATA : 0) | (plan->mesh[1] > 1 ? ST_PLAN_AXIS_FSDP : 0);
  if (s->layout == ST_LAYOUT_SPLIT && local->rank == 0) {
    /* A device's loss is the mean over its rows: the microbatch's is the
     * mean over the devices (equal rows), as the trainer reads it. */
    if (local->dtype != ST_DTYPE_F32) return st_status_make(ST_CODE_INTERNAL, "dump: split scalar '%s' is not f32", s->name);
    double sum = 0;
    int n = 0;
    for (int p = 0; p < ndev; p += plan->mesh[2] > 0 ? plan->mesh[2] : 1, ++n) sum += *(const float*)parts[p];
    float v = (float)(sum / (n > 0 ? n : 1));
    *out_type = *local;
    *out = st_xmalloc(sizeof(float));
    memcpy(*out, &v, sizeof(v));
    return ST_OK;
  }
  if (s->layout == ST_LAYOUT_SPLIT) {
    sh.split[0] = rows;
    g.dims[0] *= (int64_t)plan->mesh[0] * plan->mesh[1];
  } else if (s->layout == ST_LAYOUT_PARTIAL) {
    /* Under fsdp a squared norm is of the device's blocks (summed over
     * fsdp; the data replicas hold the same); a gradient is partial over
     * every batch-splitting axis. */
    sh.partial = !strncmp(s->name, "sq[", 3) ? ST_PLAN_AXIS_FSDP : rows;
  } else {
    g = s->logical;
    sh = s->sharding;
    if (sh.partial && st__dump_reduced(plan, k, slot)) sh.partial = 0;
  }
  static const char* const names[3] = {"data", "fsdp", "tensor"};
  int devices[ST_MESH_MAX_DEVICES];
  for (int p = 0; p < ndev && p < ST_MESH_MAX_DEVICES; ++p) devices[p] = p;
  st_mesh mesh;
  ST_RETURN(st_mesh_make(3, names, plan->mesh, devices, &mesh));
  size_t gb = st_tensor_type_bytes(&g);
  void* data = st_xmalloc(gb ? gb : 1);
  st_status st = st_sharding_assemble(&mesh, &g, &sh, (const void* const*)parts, data, gb);
  if (st) {
    free(data);
    return st_status_annotate(st, "dump: gathering slot '%s'", s->name);
  }
  *out_type = g;
  *out = data;
  return ST_OK;
}

static bool st__dump_same_type(const st_tensor_type* a, const st_tensor_type* b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int r = 0; r < a->rank; ++r)
    if (a->dims[r] != b->dims[r]) return false;
  return true;
}

/* Multiplies |n| elements of |type| at |data| by |k| (f32, bf16 through
 * f32 rounded to nearest even; other dtypes are left alone). */
static void st__dump_scale(const st_tensor_type* type, void* data, double k) {
  const int64_t n = st_tensor_type_elements(type);
  if (type->dtype == ST_DTYPE_F32) {
    float* f = data;
    for (int64_t i = 0; i < n; ++i) f[i] = (float)((double)f[i] * k);
  } else if (type->dtype == ST_DTYPE_BF16) {
    uint16_t* h = data;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u = (uint32_t)h[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      f = (float)((double)f * k);
      memcpy(&u, &f, 4);
      h[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
}

/* A program's loss is the mean over its own rows, so with D devices
 * sharing each microbatch's rows (data x fsdp) every gradient of it is D
 * times the one-device run's (docs/bundle.md: gscale divides by D). The
 * logical tensors are those of one device's run: gradients and
 * activation gradients over D, squared norms over D^2, gscale times D
 * (exact for D a power of two). */
static void st__dump_normalize(double D, const char* cls, const char* name, const st_tensor_type* type, void* data) {
  if (D == 1) return;
  if (!strcmp(cls, "gradient") || !strcmp(cls, "activation_grad")) st__dump_scale(type, data, 1.0 / D);
  else if (!strcmp(cls, "metric") && !strcmp(name, "sqnorm")) st__dump_scale(type, data, 1.0 / (D * D));
  else if (!strcmp(cls, "scalar") && !strcmp(name, "gscale")) st__dump_scale(type, data, D);
}

/* The devices sharing each microbatch's rows in this process (data x fsdp). */
static double st__dump_shares(const st__trainer* t) {
  return (double)(t->step_plan.mesh[0] > 0 ? t->step_plan.mesh[0] : 1) *
         (double)(t->step_plan.mesh[1] > 0 ? t->step_plan.mesh[1] : 1);
}

/* How a job's ranks' tensors (data across the processes: each rank holds
 * its rows of every microbatch, rank 0's first) make the job's logical
 * one: "concat" (rows), "mean" (a loss or a block metric: each rank's is a
 * mean over its rows), "sum" (a gradient before the cross-process
 * all-reduce), "first" (the same on every rank: state, scalars, reduced
 * gradients and their norms). Recorded in one process too. */
static const char* st__dump_combine(const st__trainer* t, int k, int slot, const char* cls, const char* name,
                                    const st_tensor_type* lt) {
  if (!strcmp(cls, "batch") || !strcmp(cls, "activation") || !strcmp(cls, "activation_grad"))
    return lt->rank > 0 ? "concat" : "mean";
  if (!strcmp(cls, "loss")) return "mean";
  if (!strcmp(cls, "gradient")) return st__dump_reduced(&t->step_plan, k, slot) ? "first" : "sum";
  if (!strcmp(cls, "metric") && strcmp(name, "sqnorm") && strcmp(name, "stats")) return "mean";
  return "first";
}

/* The key of a tensor with these bytes: an earlier one's when the bytes
 * and type are the same, else |key| (data and key taken over). */
static const char* st__dump_store(st__dump* d, const st_tensor_type* type, void* data, const char* key) {
  size_t n = st_tensor_type_bytes(type);
  uint64_t h = st_hash64(data, n, (uint64_t)type->dtype * 1000003u + (uint64_t)type->rank);
  for (int i = 0; i < d->n_tensors; ++i) {
    const st__dump_tensor* e = &d->tensors[i];
    if (e->hash == h && st__dump_same_type(&e->type, type) && !memcmp(e->data, data, n)) {
      free(data);
      return e->key;
    }
  }
  if (d->n_tensors == d->cap_tensors) {
    d->cap_tensors = d->cap_tensors ? 2 * d->cap_tensors : 256;
    d->tensors = st_xrealloc(d->tensors, (size_t)d->cap_tensors * sizeof(*d->tensors));
  }
  d->tensors[d->n_tensors++] = (st__dump_tensor){st_xstrdup(key), *type, data, h};
  d->bytes += (int64_t)n;
  return d->tensors[d->n_tensors - 1].key;
}

/* Whether |op| goes into the dump: a program launch, of a block layer in
 * diag.dump's range when it has one. */
static bool st__dump_wanted(const st__trainer* t, const st_op* op) {
  if (op->kind != ST_OP_LAUNCH && op->kind != ST_OP_RECOMPUTE) return false;
  if (t->o->dump.layer_lo < 0) return true;
  return op->layer >= t->o->dump.layer_lo && op->layer <= t->o->dump.layer_hi;
}

static json_t* st__dump_entry(st__trainer* t, const st_op* op) {
  st__dump* d = t->dump;
  const char* name = t->step_plan.programs[op->program];
  const char* stage = "";
  const char* phase = st__dump_phase(t, op, name, &stage);
  json_t* e = st_json_obj();
  st_json_put_int(e, "seq", d->seq++);
  st_json_put_int(e, "op", (int64_t)(op - t->step_plan.ops));
  st_json_put_str(e, "kind", st_op_kind_name(op->kind));
  st_json_put_str(e, "program", name);
  st_json_put_int(e, "layer", op->layer);
  st_json_put_int(e, "micro", op->micro);
  st_json_put_str(e, "phase", phase);
  st_json_put_str(e, "stage", stage);
  st_json_put(e, "tensors", st_json_arr());
  return e;
}

/* The copies of the op's |io| tensors (|count|) on device index |index|;
 * at the last index they become logical tensors in the op's entry. */
static st_status st__dump_take(st__trainer* t, const st_op* op, int index, st_buffer* const* bufs, int count, bool out) {
  st__dump* d = t->dump;
  st__dump_io* io = &d->io[out];
  if (index == 0) {
    st__dump_host_free(d, out);
    io->count = count;
    io->host = st_xcalloc((size_t)d->ndev * (size_t)count + 1, sizeof(void*));
    io->types = st_xcalloc((size_t)count + 1, sizeof(st_tensor_type));
  }
  if (index < 0 || index >= d->ndev || io->count != count || !io->host)
    return st_status_make(ST_CODE_INTERNAL, "dump: device index %d of %d", index, d->ndev);
  for (int j = 0; j < count; ++j) {
    const st_tensor_type* ty = st_buffer_type(bufs[j]);
    if (index == 0) io->types[j] = *ty;
    size_t n = st_tensor_type_bytes(ty);
    void** slot = &io->host[(size_t)index * (size_t)count + (size_t)j];
    *slot = st_xmalloc(n ? n : 1);
    ST_RETURN(st_buffer_to_host(bufs[j], *slot, n));
  }
  if (index != d->ndev - 1) return ST_OK;
  const char* name = t->step_plan.programs[op->program];
  const st_bundle_program* bp = st_bundle_program_find(t->bundle, name);
  if (!bp) bp = st_bundle_collective_find(t->bundle, name);
  const char* stage = "";
  const char* phase = st__dump_phase(t, op, name, &stage);
  json_t* list = json_object_get(d->entry, "tensors");
  const int seq = (int)json_integer_value(json_object_get(d->entry, "seq"));
  void** parts = st_xcalloc((size_t)d->ndev + 1, sizeof(void*));
  st_status st = ST_OK;
  for (int j = 0; j < count && !st; ++j) {
    const st_bundle_tensor* bt = bp && j < (out ? bp->output_count : bp->input_count) ? &(out ? bp->outputs : bp->inputs)[j] : NULL;
    const int slot = out ? op->outputs[j] : op->inputs[j];
    for (int p = 0; p < d->ndev; ++p) parts[p] = io->host[(size_t)p * (size_t)count + (size_t)j];
    st_tensor_type lt;
    void* data = NULL;
    st = st__dump_logical(t, (int)(op - t->step_plan.ops), slot, &io->types[j], parts, d->ndev, &lt, &data);
    if (st) break;
    char tname[32], key[256];
    if (!bt) snprintf(tname, sizeof(tname), "%s%d", out ? "out" : "in", j);
    snprintf(key, sizeof(key), "%d.%s%d.%s", seq, out ? "out" : "in", j, bt ? bt->name : tname);
    const char* cls = st__dump_class(bt ? bt->role : NULL, out, phase);
    st__dump_normalize(st__dump_shares(t), cls, bt ? bt->name : tname, &lt, data);
    const char* dt = st_safetensors_dtype_name(lt.dtype);
    json_t* e = st_json_obj();
    st_json_put_str(e, "io", out ? "out" : "in");
    st_json_put_int(e, "index", j);
    st_json_put_str(e, "name", bt ? bt->name : tname);
    st_json_put_str(e, "role", bt ? bt->role : "");
    st_json_put_str(e, "class", cls);
    st_json_put_str(e, "slot", t->step_plan.slots[slot].name);
    st_json_put_str(e, "layout", d->ndev > 1 ? st_slot_layout_name(t->step_plan.slots[slot].layout) : "replicated");
    st_json_put_str(e, "combine", st__dump_combine(t, (int)(op - t->step_plan.ops), slot, cls, bt ? bt->name : tname, &lt));
    st_json_put_str(e, "dtype", st_dtype_name(lt.dtype));
    json_t* shape = st_json_arr();
    for (int r = 0; r < lt.rank; ++r) st_json_push(shape, st_json_int(lt.dims[r]));
    st_json_put(e, "shape", shape);
    if (!dt) {
      free(data);
      st_json_put(e, "key", json_null()); /* a dtype safetensors cannot hold: listed, not stored */
    } else {
      st_json_put_str(e, "key", st__dump_store(d, &lt, data, key));
    }
    st_json_push(list, e);
  }
  free(parts);
  st__dump_host_free(d, out);
  return st;
}

st_status st__dump_inputs(st__trainer* t, const st_op* op, int index, st_buffer* const* inputs) {
  st__dump* d = t->dump;
  if (!d || !st__dump_wanted(t, op)) return ST_OK;
  if (index == 0) {
    json_decref(d->entry);
    d->entry = st__dump_entry(t, op);
    d->entry_op = op;
  }
  if (d->entry_op != op) return st_status_make(ST_CODE_INTERNAL, "dump: inputs of another op than the one begun");
  return st_status_annotate(st__dump_take(t, op, index, inputs, op->input_count, false), "diag.dump: the inputs of %s",
                            t->step_plan.programs[op->program]);
}

st_status st__dump_outputs(st__trainer* t, const st_op* op, int index, st_buffer** outputs) {
  st__dump* d = t->dump;
  if (!d || !st__dump_wanted(t, op)) return ST_OK;
  if (d->entry_op != op || !d->entry) return st_status_make(ST_CODE_INTERNAL, "dump: outputs of an op whose inputs were not seen");
  ST_RETURN(st_status_annotate(st__dump_take(t, op, index, outputs, op->output_count, true), "diag.dump: the outputs of %s",
                               t->step_plan.programs[op->program]));
  if (index == d->ndev - 1) {
    st_json_push(d->entries, d->entry);
    d->entry = NULL;
    d->entry_op = NULL;
  }
  return ST_OK;
}

void st__dump_begin(st__trainer* t) {
  if (t->o->dump.step != t->step + 1 || t->checking) return;
  st__dump_free(t->dump);
  t->dump = st_xcalloc(1, sizeof(st__dump));
  t->dump->ndev = t->step_plan.devices > 1 ? t->step_plan.devices : 1;
  t->dump->entries = st_json_arr();
}

void st__dump_discard(st__trainer* t) {
  st__dump_free(t->dump);
  t->dump = NULL;
}

/* index.json's object (entries stolen from |d|). */
static json_t* st__dump_index(st__trainer* t, st__dump* d) {
  const st_plan_options* o = t->o;
  json_t* j = st_json_obj();
  st_json_put_str(j, "format", ST__DUMP_FORMAT);
  st_json_put_int(j, "step", t->step + 1);
  st_json_put_int(j, "processes", o->procs > 1 ? o->procs : 1);
  st_json_put_int(j, "rank", t->dist ? st_dist_rank(t->dist) : 0);
  json_t* mesh = st_json_obj();
  st_json_put_int(mesh, "data", t->step_plan.mesh[0] > 0 ? t->step_plan.mesh[0] : 1);
  st_json_put_int(mesh, "fsdp", t->step_plan.mesh[1] > 0 ? t->step_plan.mesh[1] : 1);
  st_json_put_int(mesh, "tensor", t->step_plan.mesh[2] > 0 ? t->step_plan.mesh[2] : 1);
  st_json_put_int(mesh, "pipeline", t->step_plan.stages > 0 ? t->step_plan.stages : 1);
  st_json_put(j, "mesh", mesh);
  json_t* cfg = st_json_obj();
  json_t* kern = st_kernels_bundle_json(t->bundle);
  st_json_put(cfg, "kernels", kern ? kern : st_json_obj());
  st_json_put(j, "config", cfg);
  if (o->dump.layer_lo >= 0) {
    json_t* r = st_json_arr();
    st_json_push(r, st_json_int(o->dump.layer_lo));
    st_json_push(r, st_json_int(o->dump.layer_hi));
    st_json_put(j, "layers", r);
  } else {
    st_json_put(j, "layers", json_null());
  }
  /* What strata compare sizes its budgets by (docs/diagnostics.md). */
  const st_bundle_model* bm = &t->bundle->model;
  json_t* model = st_json_obj();
  st_json_put_int(model, "n_layers", bm->n_layers);
  st_json_put_int(model, "d_model", bm->d_model);
  st_json_put_int(model, "d_ff", bm->d_ff);
  st_json_put_int(model, "seq_len", bm->seq_len);
  st_json_put_int(model, "vocab_size", bm->vocab_size);
  st_json_put_int(model, "microbatch_rows", t->o->microbatches > 0 ? t->o->batch_size / t->o->microbatches : t->o->batch_size);
  st_json_put_str(model, "compute_dtype", bm->compute_dtype[0] ? bm->compute_dtype : "f32");
  st_json_put(j, "model", model);
  st_json_put_str(j, "bundle_key", t->bundle->key);
  st_json_put_int(j, "tensors_stored", d->n_tensors);
  st_json_put_int(j, "bytes", d->bytes);
  st_json_put(j, "entries", d->entries);
  d->entries = NULL;
  return j;
}

/* Writes |d| (consumed) as <run_dir>/dump/step_<N>/, atomically, and the
 * "dump" event. */
static st_status st__dump_write(st__trainer* t, st__dump* d) {
  char leaf[64], tmp_leaf[96];
  snprintf(leaf, sizeof(leaf), "step_%lld", (long long)t->step + 1);
  snprintf(tmp_leaf, sizeof(tmp_leaf), ".step_%lld.tmp-%ld", (long long)t->step + 1, (long)getpid());
  char* dir = st_rundir_path_in(t->run_dir, ST_RUNDIR_DUMP, leaf);
  char* tmp = st_rundir_path_in(t->run_dir, ST_RUNDIR_DUMP, tmp_leaf);
  st_status s = st_fs_exists(tmp) ? st_fs_remove_tree(tmp) : ST_OK;
  if (!s) s = st_fs_mkdirs(tmp);
  int64_t stored = d->n_tensors, bytes = d->bytes;
  if (!s) {
    st_named_tensor* nt = st_xcalloc((size_t)d->n_tensors + 1, sizeof(*nt));
    for (int i = 0; i < d->n_tensors; ++i) nt[i] = (st_named_tensor){d->tensors[i].key, d->tensors[i].type, d->tensors[i].data};
    char* path = st_path_join(tmp, "tensors.safetensors");
    s = st_safetensors_write(path, nt, d->n_tensors);
    free(path);
    free(nt);
  }
  json_t* index = st__dump_index(t, d);
  int64_t n_entries = (int64_t)json_array_size(json_object_get(index, "entries"));
  if (!s) {
    char* path = st_path_join(tmp, "index.json");
    s = st_json_write_file(path, index, 1);
    free(path);
  }
  json_decref(index);
  st__dump_free(d);
  /* A dump of the same step from an earlier attempt is replaced whole. */
  if (!s && st_fs_exists(dir)) s = st_fs_remove_tree(dir);
  if (!s && rename(tmp, dir) != 0)
    s = st_status_make(ST_CODE_IO, "renaming %s to %s failed; check the file system under %s", tmp, dir, t->run_dir);
  if (!s) {
    json_t* f = st_json_obj();
    st_json_put_int(f, "step", t->step + 1);
    st_json_put_str(f, "dir", dir);
    st_json_put_int(f, "entries", n_entries);
    st_json_put_int(f, "tensors", stored);
    st_json_put_int(f, "bytes", bytes);
    s = st__event(t, "dump", f);
  }
  free(tmp);
  free(dir);
  return s;
}

/* One rank's dump as rank 0 reads it back (a job; its own files). */
typedef struct st__dump_rank {
  json_t* index;
  st_safetensors* st;
} st__dump_rank;

static st_status st__dump_rank_read(const st__trainer* t, int r, st__dump_rank* out) {
  char leaf[96];
  snprintf(leaf, sizeof(leaf), "ranks/%d/dump/step_%lld", r, (long long)t->step + 1);
  char* dir = st_path_join(t->job_dir, leaf);
  char* ipath = st_path_join(dir, "index.json");
  char* tpath = st_path_join(dir, "tensors.safetensors");
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(ipath, &text, &size);
  if (!s) s = st_json_parse(text, size, ipath, &out->index);
  if (!s) s = st_safetensors_read(tpath, &out->st);
  free(text);
  free(ipath);
  free(tpath);
  if (s) s = st_status_annotate(s, "rank 0 merging rank %d's part of the dump (%s)", r, dir);
  free(dir);
  return s;
}

/* Tensor |j| of entry |i| of rank |r|'s dump: its bytes and type. */
static st_status st__dump_rank_tensor(const st__dump_rank* rk, int r, size_t i, size_t j, const void** data,
                                      st_tensor_type* type) {
  const json_t* e = json_array_get(json_object_get(rk->index, "entries"), i);
  const json_t* x = json_array_get(json_object_get(e, "tensors"), j);
  const json_t* key = json_object_get(x, "key");
  const st_safetensors_entry* se = json_is_string(key) ? st_safetensors_find(rk->st, json_string_value(key)) : NULL;
  if (!se) return st_status_make(ST_CODE_INTERNAL, "dump: rank %d has no tensor %zu of entry %zu", r, j, i);
  *data = rk->st->data + se->offset;
  *type = se->type;
  return ST_OK;
}

/* The job's tensor from the ranks' |parts| (|P| of type |type|, rank 0's
 * first) as |how| says: a new buffer, its type in *out_type. */
static st_status st__dump_join(const char* how, int P, const void* const* parts, const st_tensor_type* type,
                               st_tensor_type* out_type, void** out) {
  const size_t n = st_tensor_type_bytes(type);
  const int64_t el = st_tensor_type_elements(type);
  *out_type = *type;
  if (!strcmp(how, "concat") && type->rank > 0) {
    out_type->dims[0] *= P;
    unsigned char* b = st_xmalloc(n * (size_t)P + 1);
    for (int r = 0; r < P; ++r) memcpy(b + (size_t)r * n, parts[r], n);
    *out = b;
    return ST_OK;
  }
  unsigned char* b = st_xmalloc(n + 1);
  memcpy(b, parts[0], n);
  *out = b;
  const bool sum = !strcmp(how, "sum"), mean = !strcmp(how, "mean");
  if (!sum && !mean) return ST_OK;
  if (type->dtype != ST_DTYPE_F32)
    return st_status_make(ST_CODE_INTERNAL, "dump: cannot %s %s tensors over ranks", how, st_dtype_name(type->dtype));
  float* f = (float*)b;
  for (int64_t i = 0; i < el; ++i) {
    double acc = 0; /* in rank order, as the cross-process sums are */
    for (int r = 0; r < P; ++r) acc += (double)((const float*)parts[r])[i];
    f[i] = (float)(mean ? acc / P : acc);
  }
  return ST_OK;
}

/* Rank 0 of a job (data across the processes): |d|, its own part, joined
 * with every other rank's written one into the job's dump (*out, owned). */
static st_status st__dump_merge(st__trainer* t, st__dump* d, st__dump** out) {
  const int P = t->o->procs;
  st__dump_rank* rk = st_xcalloc((size_t)P, sizeof(*rk));
  st_status s = ST_OK;
  for (int r = 1; r < P && !s; ++r) s = st__dump_rank_read(t, r, &rk[r]);
  st__dump* m = st_xcalloc(1, sizeof(st__dump));
  m->ndev = d->ndev;
  m->entries = st_json_arr();
  json_t* keys = st_json_obj(); /* rank 0's key -> its tensor */
  for (int i = 0; i < d->n_tensors; ++i) st_json_put_int(keys, d->tensors[i].key, i);
  const void** parts = st_xcalloc((size_t)P, sizeof(void*));
  for (size_t i = 0; !s && i < json_array_size(d->entries); ++i) {
    json_t* e = json_deep_copy(json_array_get(d->entries, i));
    json_array_append_new(m->entries, e);
    json_t* list = json_object_get(e, "tensors");
    for (size_t j = 0; !s && j < json_array_size(list); ++j) {
      json_t* x = json_array_get(list, j);
      const json_t* at = json_object_get(keys, json_string_value(json_object_get(x, "key")));
      if (!at) continue; /* not stored */
      const st__dump_tensor* own = &d->tensors[json_integer_value(at)];
      parts[0] = own->data;
      for (int r = 1; r < P && !s; ++r) {
        st_tensor_type ty;
        s = st__dump_rank_tensor(&rk[r], r, i, j, &parts[r], &ty);
        if (!s && (ty.dtype != own->type.dtype || st_tensor_type_bytes(&ty) != st_tensor_type_bytes(&own->type)))
          s = st_status_make(ST_CODE_INTERNAL, "dump: rank %d's tensor %zu of entry %zu is not rank 0's type", r, j, i);
      }
      st_tensor_type jt;
      void* data = NULL;
      if (!s) s = st__dump_join(json_string_value(json_object_get(x, "combine")), P, parts, &own->type, &jt, &data);
      if (s) {
        free(data);
        break;
      }
      /* Each rank's part is normalised to its own devices; the job's
       * gradients are P times more (st__dump_normalize). */
      st__dump_normalize((double)P, json_string_value(json_object_get(x, "class")), json_string_value(json_object_get(x, "name")),
                         &jt, data);
      json_t* shape = st_json_arr();
      for (int r = 0; r < jt.rank; ++r) st_json_push(shape, st_json_int(jt.dims[r]));
      st_json_put(x, "shape", shape);
      st_json_put_str(x, "key", st__dump_store(m, &jt, data, own->key));
    }
  }
  free(parts);
  json_decref(keys);
  for (int r = 1; r < P; ++r) {
    json_decref(rk[r].index);
    st_safetensors_free(rk[r].st);
  }
  free(rk);
  if (s) {
    st__dump_free(m);
    return s;
  }
  *out = m;
  return ST_OK;
}

st_status st__dump_end(st__trainer* t) {
  st__dump* d = t->dump;
  if (!d) return ST_OK;
  t->dump = NULL;
  st_status s = ST_OK;
  if (t->dist && t->o->procs > 1) {
    /* Every rank writes its part into its own folder (rank 0 keeps its
     * own in memory); once all have (the barrier), rank 0 joins them into
     * the job's dump. A rank that failed to write still meets the barrier:
     * rank 0 then fails naming its folder. */
    const bool rank0 = st_dist_rank(t->dist) == 0;
    if (!rank0) s = st__dump_write(t, d);
    st_status b = st_dist_barrier(t->dist);
    s = s ? (st_status_free(b), s) : b;
    if (rank0 && !s) {
      st__dump* m = NULL;
      s = st__dump_merge(t, d, &m);
      st__dump_free(d);
      if (!s) s = st__dump_write(t, m);
    } else if (rank0) {
      st__dump_free(d);
    }
  } else {
    s = st__dump_write(t, d);
  }
  return s ? st_status_annotate(s, "diag.dump: writing the dump of step %lld", (long long)t->step + 1) : ST_OK;
}

static st_status st__dump_refusals(st__trainer* t);

st_status st__dump_check(st__trainer* t) {
  /* Every refusal follows from the config and the plan, the same on every
   * rank of a job: the ranks end together. */
  st_status s = st__dump_refusals(t);
  if (s) t->failed_together = true;
  return s;
}

static st_status st__dump_refusals(st__trainer* t) {
  const st_plan_options* o = t->o;
  if (o->faults.wrong_kernel == ST_FAULT_WRONG_ATTENTION) {
    const char* impl = NULL;
    for (int i = 0; i < t->bundle->kernel_count; ++i)
      if (!strcmp(t->bundle->kernels[i].name, "attention")) impl = t->bundle->kernels[i].impl;
    if (!impl || strcmp(impl, "ffi"))
      return st_status_make(ST_CODE_CONFIG,
                            "faults.wrong_kernel=attention perturbs the ffi attention kernel, but this run's programs use "
                            "attention=%s: set kernels.attention=ffi or faults.wrong_kernel=off",
                            impl ? impl : "(none: the bundle names no attention kernel)");
    st_kernels_set_wrong(ST_KERNEL_WRONG_ATTENTION);
    /* Loud, like every armed drill: a run with it is wrong on purpose. */
    if (!t->dist || st_dist_rank(t->dist) == 0)
      fprintf(stderr, "strata: faults.wrong_kernel=attention is armed: the ffi attention kernel's output is scaled by "
                      "1 + 2^-10 in every call (a test-only drill; docs/diagnostics.md)\n");
    json_t* f = st_json_obj();
    st_json_put_str(f, "fault", "faults.wrong_kernel");
    st_json_put_str(f, "kernel", "attention");
    ST_RETURN(st__event(t, "fault_armed", f));
  }
  if (o->dump.step <= 0) return ST_OK;
  if (o->parallel_tensor > 1)
    return st_status_make(ST_CODE_CONFIG,
                          "diag.dump with parallel.tensor=%d: gathering tensor-parallel programs' shards into logical "
                          "tensors is not built (docs/diagnostics.md, \"Dump and compare\"); dump a run with "
                          "parallel.tensor=1",
                          o->parallel_tensor);
  if (o->procs > 1 && o->span_axis != ST_PLAN_SPAN_DATA)
    return st_status_make(ST_CODE_CONFIG,
                          "diag.dump in a job of %d processes spanning %s: the dump is built for jobs whose processes "
                          "span parallel.data (each rank holds its rows), not fsdp or tensor blocks across processes "
                          "(docs/diagnostics.md, \"Dump and compare\"); dump a one-process run with the same mesh on "
                          "runtime.cpu_devices",
                          o->procs, o->span_axis == ST_PLAN_SPAN_FSDP ? "parallel.fsdp" : "parallel.tensor");
  if (o->dump.step <= t->start_step)
    return st_status_make(ST_CODE_CONFIG,
                          "diag.dump=step:%lld, but this run resumes after step %lld: the step will not run again; dump a "
                          "step after it, or a fresh run",
                          (long long)o->dump.step, (long long)t->start_step);
  return ST_OK;
}
