/* nonfinite.c — the first non-finite value of a step, located
 * (docs/diagnostics.md, "The first non-finite value").
 *
 * The step whose loss or gradient norm was not finite is run again from
 * the state before it (the HOST clip op dropped its update, so the
 * parameters and moments are still those), on the same batch, with the
 * executor's launching/launched hooks set: before each launch its inputs
 * are copied to the host, after it its outputs are tested. The first
 * launch, in plan order, with a non-finite output is the culprit: its
 * program, layer, microbatch and output are named, whether its inputs were
 * all finite is said, and its inputs, StableHLO, the run's config and the
 * batch's sample indices go to <run>/diag/nonfinite-step<N>/, which
 * `strata repro` replays (repro.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/obs.h"
#include "train/train_internal.h"

typedef struct st__check {
  /* the current launch's inputs on the host (device index 0) */
  int n_in;
  st_tensor_type* in_types;
  void** in_data;
  /* the result */
  bool found;
  double launch_t0, launch_s; /* the current launch: inputs ready; its duration (<0: not measured) */
  char* dir; /* owned */
  json_t* result; /* the nonfinite.json object (owned) */
} st__check;

static void st__check_free_inputs(st__check* c) {
  for (int j = 0; j < c->n_in; ++j) free(c->in_data[j]);
  free(c->in_data);
  free(c->in_types);
  c->in_data = NULL;
  c->in_types = NULL;
  c->n_in = 0;
}

/* Non-finite elements of |n| elements of |dtype| at |data|; -1 for a
 * dtype that cannot hold one (integers). */
static int64_t st__count_nonfinite(st_dtype dtype, const void* data, int64_t n) {
  int64_t bad = 0;
  if (dtype == ST_DTYPE_F32) {
    const float* f = data;
    for (int64_t i = 0; i < n; ++i) bad += !isfinite(f[i]);
    return bad;
  }
  if (dtype == ST_DTYPE_BF16) {
    const uint16_t* h = data;
    for (int64_t i = 0; i < n; ++i) bad += (h[i] & 0x7f80u) == 0x7f80u; /* exponent all ones: inf or NaN */
    return bad;
  }
  return -1;
}

/* ", layer L, microbatch M", with only the parts that apply: the
 * embedding and the head have no layer, the optimizer's programs (norms,
 * updates) no microbatch (both -1 in the plan). */
static void st__nf_where(int layer, int micro, char* out, size_t size) {
  int n = 0;
  out[0] = '\0';
  if (layer >= 0) n = snprintf(out, size, ", layer %d", layer);
  if (micro >= 0 && n >= 0 && (size_t)n < size) snprintf(out + n, size - (size_t)n, ", microbatch %d", micro);
}

static bool st__program_op(const st_op* op) { return op->kind == ST_OP_LAUNCH || op->kind == ST_OP_RECOMPUTE; }

st_status st__nf_check_inputs(st__trainer* t, const st_op* op, int index, st_buffer* const* inputs) {
  st__check* c = t->check;
  if (!c || c->found || index != 0 || !st__program_op(op)) return ST_OK;
  st__check_free_inputs(c);
  c->in_types = st_xcalloc((size_t)op->input_count + 1, sizeof(st_tensor_type));
  c->in_data = st_xcalloc((size_t)op->input_count + 1, sizeof(void*));
  for (int j = 0; j < op->input_count; ++j) {
    c->in_types[j] = *st_buffer_type(inputs[j]);
    size_t bytes = st_tensor_type_bytes(&c->in_types[j]);
    c->in_data[j] = st_xmalloc(bytes ? bytes : 1);
    c->n_in = j + 1;
    ST_RETURN(st_buffer_to_host(inputs[j], c->in_data[j], bytes));
  }
  /* The copies waited for every input: the launch starts from here. */
  c->launch_t0 = st_now();
  c->launch_s = -1;
  return ST_OK;
}

void st__nf_time_launch(st__trainer* t, const st_op* op, int index, st_buffer** outputs) {
  st__check* c = t->check;
  if (!c || c->found || index != 0 || !st__program_op(op) || op->output_count < 1) return;
  st_event* ev = NULL;
  st_status s = st_buffer_ready_event(outputs[0], &ev);
  if (!s) s = st_event_await(ev);
  st_event_destroy(ev);
  /* Untimed if the wait failed: the output check that follows reports the error. */
  c->launch_s = s ? -1 : st_now() - c->launch_t0;
  st_status_free(s);
}

/* Copies |src| (a file) to |dst|. */
static st_status st__copy_file(const char* src, const char* dst) {
  char* data = NULL;
  size_t size = 0;
  ST_RETURN(st_fs_read_file(src, &data, &size));
  st_status s = st_fs_write_atomic(dst, data, size);
  free(data);
  return s;
}

/* The first training sequence of |op|'s batch (its microbatch's under
 * accumulation): nonfinite.json's "samples" and the README say the same. */
static int64_t st__first_sample(const st__trainer* t, const st_op* op) {
  return t->step * t->o->batch_size + (op->micro >= 0 ? op->micro * t->mb : 0);
}

/* The inputs, named as the program names them (an index added to a
 * repeated name), written as inputs.safetensors unless |s| already failed;
 * every name goes to |inputs|, a non-finite one's to |bad_inputs| too. */
static st_status st__bundle_inputs(const st__check* c, const st_op* op, const st_bundle_program* bp, const char* dir,
                                   json_t* inputs, json_t* bad_inputs, json_t* stats, st_status s) {
  st_named_tensor* nt = st_xcalloc((size_t)op->input_count + 1, sizeof(*nt));
  char** names = st_xcalloc((size_t)op->input_count + 1, sizeof(char*));
  for (int j = 0; j < op->input_count; ++j) {
    bool repeated = false;
    for (int i = 0; i < j; ++i) repeated = repeated || !strcmp(bp->inputs[i].name, bp->inputs[j].name);
    st_strbuf nb = {0};
    st_strbuf_printf(&nb, repeated ? "%s.%d" : "%s", bp->inputs[j].name, j);
    names[j] = nb.data;
    nt[j] = (st_named_tensor){names[j], c->in_types[j], c->in_data[j]};
    json_array_append_new(inputs, st_json_str(names[j]));
    int64_t nb_bad = st__count_nonfinite(c->in_types[j].dtype, c->in_data[j], st_tensor_type_elements(&c->in_types[j]));
    if (nb_bad > 0) json_array_append_new(bad_inputs, st_json_str(names[j]));
    /* strata repro recomputes these from inputs.safetensors: the replay's
     * inputs are the recorded ones (issue 30 item 4b) */
    json_t* st1 = st__tensor_stats_json(c->in_types[j].dtype, c->in_data[j], st_tensor_type_elements(&c->in_types[j]));
    st_json_put_str(st1, "name", names[j]);
    json_array_append_new(stats, st1);
  }
  char* path = st_path_join(dir, "inputs.safetensors");
  if (!s) s = st_safetensors_write(path, nt, op->input_count);
  free(path);
  for (int j = 0; j < op->input_count; ++j) free(names[j]);
  free(names);
  free(nt);
  return s;
}

/* The files copied beside the inputs: the program's StableHLO, the run's
 * config and (a BPE run) its tokenizer, which the bundle's identity names. */
static st_status st__bundle_copies(const st__trainer* t, const st_bundle_program* bp, const char* dir, st_status s) {
  char* path = NULL;
  if (!s) {
    path = st_path_join(dir, "program.mlir");
    s = st__copy_file(bp->path, path);
    free(path);
  }
  if (!s) {
    char* src = st_rundir_path(t->run_dir, ST_RUNDIR_CONFIG);
    path = st_path_join(dir, st_rundir_name(ST_RUNDIR_CONFIG));
    s = st__copy_file(src, path);
    free(src);
    free(path);
  }
  /* A BPE run's tokenizer goes along: the bundle's identity names it. */
  char* tok_src = st_rundir_path(t->run_dir, ST_RUNDIR_TOKENIZER);
  if (!s && st_fs_exists(tok_src)) {
    path = st_path_join(dir, st_rundir_name(ST_RUNDIR_TOKENIZER));
    s = st__copy_file(tok_src, path);
    free(path);
  }
  free(tok_src);
  return s;
}

/* nonfinite.json's object (returned, owned): where the value came out,
 * the inputs (|inputs| and |bad_inputs| stolen), the outputs' types, the
 * batch, the bundle, the run's identity and the drill's injection if any;
 * what strata repro reads back. */
static json_t* st__bundle_record(const st__trainer* t, const st_op* op, const st_bundle_program* bp, int k, int64_t bad,
                                 int64_t n, bool spmd, bool injected, json_t* inputs, json_t* bad_inputs) {
  int64_t step = t->step + 1;
  bool inputs_finite = json_array_size(bad_inputs) == 0;
  json_t* r = st_json_obj();
  st_json_put_int(r, "step", step);
  st_json_put_str(r, "program", bp->name);
  st_json_put_str(r, "op_kind", st_op_kind_name(op->kind));
  st_json_put_int(r, "plan_op", (int64_t)(op - t->step_plan.ops));
  st_json_put_int(r, "layer", op->layer);
  st_json_put_int(r, "microbatch", op->micro);
  st_json_put_str(r, "output", bp->outputs[k].name);
  st_json_put_int(r, "output_index", k);
  st_json_put_int(r, "nonfinite", bad);
  st_json_put_int(r, "elements", n);
  st_json_put_bool(r, "inputs_finite", inputs_finite);
  st_json_put(r, "nonfinite_inputs", bad_inputs);
  st_json_put(r, "inputs", inputs);
  json_t* outs = json_array();
  for (int j = 0; j < bp->output_count; ++j) {
    json_t* o = st_json_obj();
    st_json_put_str(o, "name", bp->outputs[j].name);
    st_json_put_str(o, "dtype", st_safetensors_dtype_name(bp->outputs[j].type.dtype));
    json_t* shape = json_array();
    for (int d = 0; d < bp->outputs[j].type.rank; ++d) json_array_append_new(shape, json_integer(bp->outputs[j].type.dims[d]));
    st_json_put(o, "shape", shape);
    json_array_append_new(outs, o);
  }
  st_json_put(r, "outputs", outs);
  /* The batch: training sequences of this microbatch (all devices' rows). */
  json_t* samples = st_json_obj();
  st_json_put_int(samples, "first", st__first_sample(t, op));
  st_json_put_int(samples, "count", op->micro >= 0 ? t->mb : t->o->batch_size);
  st_json_put_str(samples, "stream", "train");
  st_json_put(r, "samples", samples);
  st_json_put_str(r, "bundle_key", t->bundle->key);
  st_json_put_str(r, "bundle_dir", t->bundle->dir);
  st_json_put_str(r, "program_sha256", bp->sha256);
  /* The hooks see device index 0: with an SPMD program its inputs and
   * outputs are that device's shards, which strata repro cannot replay. */
  st_json_put_int(r, "device_index", 0);
  if (spmd) st_json_put_int(r, "spmd_devices", t->step_plan.devices);
  else st_json_put(r, "spmd_devices", json_null());
  /* What the run was (docs/checkpoints.md, "Identity"): strata repro
   * checks the config it is given against it. */
  json_t* desc = st_plan_model_desc(t->o);
  st_json_put(r, "model", desc ? desc : json_null());
  const char* tok_hash = st_dataset_tokenizer_hash(t->data);
  st_json_put(r, "tokenizer_hash", tok_hash ? st_json_str(tok_hash) : json_null());
  if (injected) {
    /* Not the program's doing: faults.nan_at put it there after the
     * launch. strata repro puts it there again, and says so. */
    json_t* f = st_json_obj();
    st_json_put_str(f, "fault", "faults.nan_at");
    st_json_put_str(f, "output", bp->outputs[k].name);
    st_json_put_int(f, "element", 0);
    const int v = t->o->faults.nan_value;
    st_json_put_str(f, "value", v == 1 ? "inf" : v == 2 ? "max" : "nan");
    st_json_put(r, "injected", f);
  } else {
    st_json_put(r, "injected", json_null());
  }
  return r;
}

/* The bundle's README.md: the same facts as nonfinite.json in words, and
 * how to replay it (or why strata repro cannot: an SPMD program). */
static st_status st__bundle_readme(const st__trainer* t, const st_op* op, const st_bundle_program* bp, int k, int64_t bad,
                                   int64_t n, bool spmd, bool injected, bool inputs_finite, const char* dir) {
  int64_t step = t->step + 1;
  int64_t first = st__first_sample(t, op);
  char where[64];
  st__nf_where(op->layer, op->micro, where, sizeof(where));
  char replay[4200];
  if (spmd)
    snprintf(replay, sizeof(replay),
             "The program is a tensor-parallel SPMD program over %d devices and `inputs.safetensors` holds device "
             "index 0's shards: `strata repro` replays one-device programs only, not this one.\n\n",
             t->step_plan.devices);
  else
    snprintf(replay, sizeof(replay), "Replay the program alone on these inputs:\n\n    strata repro %s\n\n", dir);
  st_strbuf rd = {0};
  st_strbuf_printf(&rd,
                   "# Non-finite value at step %lld\n\n"
                   "The first non-finite value of step %lld of run %s came out of program `%s` (%s, plan op %lld)%s: "
                   "output `%s` (index %d), %lld of %lld elements not finite. Its inputs "
                   "were %s.%s\n\n"
                   "Files: `inputs.safetensors` (the program's inputs, in order: nonfinite.json \"inputs\"), "
                   "`program.mlir` (its StableHLO, sha256 %s, bundle %s), `config.yaml` (the run's resolved config), "
                   "`nonfinite.json` (all of the above, and the batch: training sequences %lld..%lld).\n\n"
                   "%s"
                   "(docs/diagnostics.md, \"Reading a NaN bundle\").\n",
                   (long long)step, (long long)step, t->run_dir, bp->name, st_op_kind_name(op->kind),
                   (long long)(op - t->step_plan.ops), where, bp->outputs[k].name, k, (long long)bad,
                   (long long)n, inputs_finite ? "all finite" : "not all finite (nonfinite.json \"nonfinite_inputs\")",
                   injected ? " The value was injected by faults.nan_at (a drill), not produced by the program." : "",
                   bp->sha256, t->bundle->key, (long long)first,
                   (long long)(first + (op->micro >= 0 ? t->mb : t->o->batch_size) - 1), replay);
  char* path = st_path_join(dir, "README.md");
  st_status s = st_fs_write_atomic(path, rd.data, rd.len);
  free(path);
  st_strbuf_free(&rd);
  return s;
}

/* The folder of the first non-finite output: output |k| of |op|, which
 * has |bad| non-finite elements of |n|. */
static st_status st__write_bundle(st__trainer* t, const st_op* op, int k, int64_t bad, int64_t n) {
  st__check* c = t->check;
  const char* name = t->step_plan.programs[op->program];
  /* A tensor-parallel block's programs are the bundle's SPMD programs;
   * their tensor types are the per-device ones, as the hooks saw them. */
  const st_bundle_program* bp = st_bundle_program_find(t->bundle, name);
  const bool spmd = !bp && (bp = st_bundle_collective_find(t->bundle, name)) != NULL;
  if (!bp || bp->input_count != op->input_count || bp->output_count != op->output_count || c->n_in != op->input_count)
    return st_status_make(ST_CODE_INTERNAL, "locating: program '%s' of the plan is not the bundle's", name);
  int64_t step = t->step + 1;
  char leaf[64];
  snprintf(leaf, sizeof(leaf), "nonfinite-step%lld", (long long)step);
  char* dir = st_rundir_path_in(t->run_dir, ST_RUNDIR_DIAG, leaf);
  st_status s = st_fs_mkdirs(dir);
  json_t* inputs = json_array();
  json_t* bad_inputs = json_array();
  json_t* stats = json_array();
  s = st__bundle_inputs(c, op, bp, dir, inputs, bad_inputs, stats, s);
  s = st__bundle_copies(t, bp, dir, s);
  bool inputs_finite = json_array_size(bad_inputs) == 0;
  bool injected = t->nan_fired_step == step && op->kind == ST_OP_LAUNCH && op->layer == t->nan_fired_layer &&
                  op->micro == t->nan_fired_micro && !strcmp(bp->outputs[k].name, t->nan_fired_output);
  json_t* r = st__bundle_record(t, op, bp, k, bad, n, spmd, injected, inputs, bad_inputs);
  st_json_put(r, "input_stats", stats);
  /* The launch's time as the locator measured it, for `strata repro --perf`. */
  json_t* lt = st_json_obj();
  st_json_put(lt, "seconds", c->launch_s >= 0 ? st_json_fixed(c->launch_s, 9) : json_null());
  st_json_put_int(lt, "launches", c->launch_s >= 0 ? 1 : 0);
  st_json_put_str(lt, "measured", "the locator's re-execution, device index 0: inputs ready (copied to the host) to outputs ready");
  st_json_put(r, "launch_time", lt);
  if (!s) {
    char* path = st_path_join(dir, "nonfinite.json");
    s = st_json_write_file(path, r, 0);
    free(path);
  }
  if (!s) s = st__bundle_readme(t, op, bp, k, bad, n, spmd, injected, inputs_finite, dir);
  if (s) {
    json_decref(r);
    free(dir);
    return st_status_annotate(s, "writing the non-finite bundle");
  }
  c->dir = dir;
  c->result = r;
  return ST_OK;
}

st_status st__nf_check_outputs(st__trainer* t, const st_op* op, int index, st_buffer** outputs) {
  st__check* c = t->check;
  if (!c || c->found || index != 0 || !st__program_op(op)) return ST_OK;
  for (int k = 0; k < op->output_count && !c->found; ++k) {
    const st_tensor_type* ty = st_buffer_type(outputs[k]);
    if (ty->dtype != ST_DTYPE_F32 && ty->dtype != ST_DTYPE_BF16) continue;
    size_t bytes = st_tensor_type_bytes(ty);
    int64_t n = st_tensor_type_elements(ty);
    void* host = st_xmalloc(bytes ? bytes : 1);
    st_status s = st_buffer_to_host(outputs[k], host, bytes);
    int64_t bad = s ? 0 : st__count_nonfinite(ty->dtype, host, n);
    free(host);
    ST_RETURN(s);
    if (bad > 0) {
      c->found = true;
      ST_RETURN(st__write_bundle(t, op, k, bad, n));
    }
  }
  return ST_OK;
}

st_status st__locate_nonfinite(st__trainer* t, char** out_dir) {
  *out_dir = NULL;
  st__check c = {0};
  t->check = &c;
  t->checking = true;
  /* The re-execution reads the losses and norms again: keep what the step
   * itself found. */
  bool nonfinite = t->nonfinite;
  char what[sizeof(t->nonfinite_what)];
  memcpy(what, t->nonfinite_what, sizeof(what));
  double value = t->nonfinite_value, grad_norm = t->grad_norm;
  st__metrics_reset(t);
  st__numerics_reset(t);
  double t0 = st_now();
  st_executor_hooks hooks = st__train_hooks(t);
  st_status s = st_executor_run(t->ex, &hooks);
  t->checking = false;
  t->check = NULL;
  bool reproduced = t->nonfinite;
  t->nonfinite = nonfinite;
  memcpy(t->nonfinite_what, what, sizeof(what));
  t->nonfinite_value = value;
  t->grad_norm = grad_norm;
  st__check_free_inputs(&c);
  if (s) {
    json_decref(c.result);
    free(c.dir);
    return st_status_annotate(s, "re-executing step %lld to locate its non-finite value", (long long)t->step + 1);
  }
  json_t* e = c.result ? json_deep_copy(c.result) : st_json_obj();
  if (!c.result) {
    st_json_put_int(e, "step", t->step + 1);
    st_json_put(e, "program", json_null());
  }
  st_json_put_bool(e, "reexecution_nonfinite", reproduced);
  st_json_put(e, "seconds", st_json_fixed(st_now() - t0, 3));
  st_json_put(e, "dir", c.dir ? st_json_str(c.dir) : json_null());
  if (c.result) {
    char where[64];
    st__nf_where((int)json_integer_value(json_object_get(c.result, "layer")),
                 (int)json_integer_value(json_object_get(c.result, "microbatch")), where, sizeof(where));
    fprintf(stderr, "strata: step %lld: the first non-finite value: %s%s, output %s (inputs %s); %s\n", (long long)t->step + 1,
            json_string_value(json_object_get(c.result, "program")), where, json_string_value(json_object_get(c.result, "output")),
            json_is_true(json_object_get(c.result, "inputs_finite")) ? "finite" : "not finite", c.dir);
  } else
    fprintf(stderr, "strata: step %lld: re-executed from the state before it, no program produced a non-finite value "
                    "(transient: not reproduced)\n", (long long)t->step + 1);
  json_decref(c.result);
  *out_dir = c.dir;
  return st__event(t, "nonfinite_located", e);
}
