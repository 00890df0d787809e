/* options.c — typed trainer options from the validated config, and the model
 * JSON that keys the bundle. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/kernels.h"
#include "strata/runtime.h"
#include "strata/plan.h"

st_status st_plan_check_kernel_platform(const st_plan_options* o, const st_runtime* rt) {
  int n_ops;
  const char* const* op_names = st_kernels_op_names(&n_ops);
  st_runtime_info ri;
  st_runtime_get_info(rt, &ri);
  const char* real = ri.platform_name ? ri.platform_name : "";
  if (!strcmp(real, o->kernel_platform)) return ST_OK;
  st_kernel_contract contract;
  ST_RETURN(st_kernel_contract_load(&contract));
  st_status s = ST_OK;
  for (int i = 0; i < n_ops && !s; ++i) {
    if (!o->kernel_auto[i]) continue;
    const char* want = st_kernel_resolve(&contract, op_names[i], "auto", real);
    if (strcmp(want, o->kernel_impl[i]))
      s = st_status_make(ST_CODE_RUNTIME,
                         "kernels.%s=auto was resolved to %s for platform %s (guessed from %s), but the plugin's "
                         "platform is %s, where auto means %s: set kernels.%s=%s (or name the plugin file after its "
                         "platform, e.g. pjrt_c_api_%s_plugin.so)",
                         op_names[i], o->kernel_impl[i], o->kernel_platform, o->kernel_platform_basis,
                         real, want, op_names[i], want, real);
  }
  st_kernel_contract_free(&contract);
  return s;
}

/* The trees behind model_json and model_desc (st_plan_options.model_trees). */
struct st_plan_model_trees {
  json_t* model;
  json_t* desc;
};

static bool st__is_model_key(const st_config_key_info* k) { return !strncmp(k->key, "model.", 6); }

/* A model.* key's value in |obj|, under its name without "model.": an int
 * whose 0 stands for another key's value (model.n_kv_heads) resolved. */
static void st__put_model_key(json_t* obj, const st_config* c, const st_config_key_info* k) {
  const char* name = k->key + strlen("model.");
  switch (k->type) {
    case ST_CONFIG_INT: st_json_put_int(obj, name, st_config_int_resolved(c, k->key)); return;
    case ST_CONFIG_FLOAT: st_json_put_num(obj, name, st_config_float(c, k->key)); return;
    case ST_CONFIG_BOOL: st_json_put_bool(obj, name, st_config_bool(c, k->key)); return;
    case ST_CONFIG_STRING: st_json_put_str(obj, name, st_config_string(c, k->key)); return;
    case ST_CONFIG_LIST: {
      json_t* items = json_array();
      for (int i = 0; i < st_config_list_count(c, k->key); ++i)
        json_array_append_new(items, json_string(st_config_list_item(c, k->key, i)));
      json_object_set_new(obj, name, items);
      return;
    }
  }
}

/* Whether a model.* key holds what its default means: the default itself,
 * or for a key whose 0 stands for another key's value, that value. */
static bool st__model_key_unset(const st_config* c, const st_config_key_info* k) {
  if (st_config_is_default(c, k->key)) return true;
  return k->zero_means && st_config_int(c, k->key) == st_config_int(c, k->zero_means);
}

/* The model.* rows whose bundle use is from |first| to |last|, in schema
 * order; |sparse|: the IF_SET ones only when set (the model JSON). */
static void st__put_model_keys(json_t* obj, const st_config* c, st_config_bundle_use first, st_config_bundle_use last,
                               bool sparse) {
  for (int i = 0; i < st_config_key_count(); ++i) {
    st_config_key_info k = st_config_key_at(i);
    if (!st__is_model_key(&k) || k.bundle < first || k.bundle > last) continue;
    if (sparse && k.bundle != ST_CONFIG_BUNDLE_ALWAYS && st__model_key_unset(c, &k)) continue;
    st__put_model_key(obj, c, &k);
  }
}

json_t* st_plan_model_implied(void) {
  int n_ops;
  const char* const* op_names = st_kernels_op_names(&n_ops);
  /* The sparse model object (st_plan_options_from_config's model_json),
   * which checkpoints recorded before the description, left the IF_SET
   * keys out at their default: that is what their absence means. */
  json_t* j = st_json_obj();
  st_config* d = NULL;
  st_status s = st_config_load(NULL, 0, NULL, &d); /* the schema's defaults: reads no file */
  for (int i = 0; !s && i < st_config_key_count(); ++i) {
    st_config_key_info k = st_config_key_at(i);
    if (!st__is_model_key(&k) || k.bundle == ST_CONFIG_BUNDLE_ALWAYS) continue;
    if (k.zero_means) {
      json_t* same = st_json_obj();
      st_json_put_str(same, "same_as", k.zero_means + strlen("model."));
      st_json_put(j, k.key + strlen("model."), same);
    } else {
      st__put_model_key(j, d, &k);
    }
  }
  st_status_free(s); /* the schema's defaults always load (test_config loads them) */
  st_config_destroy(d);
  for (int i = 0; i < n_ops; ++i) {
    char key[64];
    snprintf(key, sizeof(key), "kernels.%s", op_names[i]);
    st_json_put_str(j, key, "xla");
  }
  /* Before the description named the optimizer, adamw was every
   * parameter's; momentum and nesterov were not used by it, so they imply
   * nothing (not compared). */
  st_json_put_str(j, "optimizer.default", "adamw");
  st_json_put(j, "optimizer.groups", json_array());
  return j;
}

json_t* st_plan_model_json(const st_plan_options* o) {
  return o->model_trees ? json_deep_copy(o->model_trees->model) : NULL;
}

json_t* st_plan_model_desc(const st_plan_options* o) {
  return o->model_trees ? json_deep_copy(o->model_trees->desc) : NULL;
}

json_t* st_plan_kernel_selection_json(const st_plan_options* o) {
  int n_ops;
  const char* const* op_names = st_kernels_op_names(&n_ops);
  json_t* j = st_json_obj();
  st_json_put_str(j, "platform", o->kernel_platform);
  st_json_put_str(j, "basis", o->kernel_platform_basis);
  json_t* a = json_array();
  for (int i = 0; i < n_ops; ++i)
    if (o->kernel_auto[i]) json_array_append_new(a, json_string(op_names[i]));
  json_object_set_new(j, "auto", a);
  return j;
}

void st_plan_kernel_selection_note(const st_plan_options* o, FILE* out) {
  int n_ops;
  const char* const* op_names = st_kernels_op_names(&n_ops);
  bool any = false;
  for (int i = 0; i < n_ops; ++i) any = any || o->kernel_auto[i];
  if (!any) return;
  fprintf(out, "kernels: auto resolved for platform %s (guessed from %s):", o->kernel_platform, o->kernel_platform_basis);
  for (int i = 0; i < n_ops; ++i)
    if (o->kernel_auto[i]) fprintf(out, " %s=%s", op_names[i], o->kernel_impl[i]);
  fprintf(out, "\n");
}

/* train.*, run.*, bundle.dir, the cache: the keys the rest derive from. */
static void st__options_train(const st_config* c, st_plan_options* o) {
  o->steps = st_config_int(c, "train.steps");
  o->batch_size = st_config_int(c, "train.batch_size");
  o->microbatches = st_config_int(c, "train.microbatches");
  o->warmup_steps = st_config_int(c, "train.warmup_steps");
  o->eval_every = st_config_int(c, "train.eval_every");
  o->eval_batches = st_config_int(c, "train.eval_batches");
  o->lr = st_config_float(c, "train.lr");
  o->min_lr_ratio = st_config_float(c, "train.min_lr_ratio");
  const char* sched = st_config_string(c, "train.lr_schedule");
  o->lr_schedule = !strcmp(sched, "constant") ? ST_PLAN_LR_CONSTANT
                   : !strcmp(sched, "linear") ? ST_PLAN_LR_LINEAR
                   : !strcmp(sched, "wsd")    ? ST_PLAN_LR_WSD
                                              : ST_PLAN_LR_COSINE;
  o->decay_fraction = st_config_float(c, "train.decay_fraction");
  o->weight_decay = st_config_float(c, "train.weight_decay");
  o->beta1 = st_config_float(c, "train.beta1");
  o->beta2 = st_config_float(c, "train.beta2");
  o->eps = st_config_float(c, "train.eps");
  o->grad_clip = st_config_float(c, "train.grad_clip");
  o->seed = (uint64_t)st_config_int(c, "seed");
  o->run_dir = st_config_string(c, "run.dir");
  o->run_id = st_config_string(c, "run.id");
  const char* progress = st_config_string(c, "run.progress");
  o->progress = !strcmp(progress, "on") ? 1 : !strcmp(progress, "off") ? 0 : 2;
  o->long_progress.on = o->progress == 1 || (o->progress == 2 && isatty(2));
  o->long_progress.min_size = st_config_int(c, "run.progress_min_bytes");
  o->bundle_dir = st_config_string(c, "bundle.dir");
  o->tensorboard = st_config_bool(c, "obs.tensorboard");
  o->cache_root = st_cache_root(st_config_string(c, "runtime.cache_dir"));
}

/* The optimizer assignment (docs/scheduling.md, "Optimizer state"): train.optimizer,
 * its overrides in order, and the constants baked into the update
 * programs. *out_adamw: adamw for every parameter (no override names
 * another), today's programs. */
static json_t* st__optimizer_json(const st_config* c, bool* out_adamw) {
  const char* def = st_config_string(c, "train.optimizer");
  bool adamw = !strcmp(def, "adamw");
  json_t* j = st_json_obj();
  st_json_put_str(j, "default", def);
  st_json_put_num(j, "momentum", st_config_float(c, "train.momentum"));
  st_json_put_bool(j, "nesterov", st_config_bool(c, "train.nesterov"));
  json_t* groups = json_array();
  for (int i = 0; i < st_config_list_count(c, "train.optimizer_groups"); ++i) {
    const char* e = st_config_list_item(c, "train.optimizer_groups", i);
    const char* eq = strchr(e, '='); /* the schema's rule checked the form */
    adamw = adamw && eq && !strcmp(eq + 1, "adamw");
    json_array_append_new(groups, json_string(e));
  }
  /* adamw everywhere is one assignment however it is spelled: the
   * description compares it as such (an override naming adamw changes
   * nothing). */
  if (adamw) json_array_clear(groups);
  json_object_set_new(j, "groups", groups);
  *out_adamw = adamw;
  return j;
}

/* The model JSON that keys the bundle and the model description a
 * checkpoint records, both from the schema's model.* rows, with the
 * kernels.<op> selection resolved for the platform. */
static st_status st__options_model(const st_config* c, st_plan_options* o) {
  /* Canonical order: the exporter reads this object and the bundle key
   * hashes its values in order (docs/bundle.md): the ALWAYS rows, the
   * IF_SET rows, the kernels, the IF_SET_AFTER_KERNELS rows, each in schema
   * order (moving a model.* row in the schema changes bundle keys). */
  json_t* m = st_json_obj();
  st__put_model_keys(m, c, ST_CONFIG_BUNDLE_ALWAYS, ST_CONFIG_BUNDLE_ALWAYS, true);
  /* The keys added later only when set, so that a config without them
   * keeps its bundle key (and its cached bundle); the front-end's
   * ModelConfig has the schema's defaults. */
  st__put_model_keys(m, c, ST_CONFIG_BUNDLE_IF_SET, ST_CONFIG_BUNDLE_IF_SET, true);
  /* kernels.<op> likewise, only the ops not at xla (docs/kernels.md): the
   * selection is part of the model JSON, so of the bundle key. auto is
   * resolved here, for the platform the configured plugin is expected to
   * serve: the bundle (exported before the runtime exists, which registers
   * the ffi handlers a bundle needs at its creation) carries what runs. */
  st_runtime_options probe;
  st_runtime_options_init(&probe);
  probe.plugin_path = st_config_string(c, "runtime.plugin");
  st_runtime_guess_platform(&probe, o->kernel_platform, sizeof(o->kernel_platform), o->kernel_platform_basis,
                            sizeof(o->kernel_platform_basis));
  st_kernel_contract contract;
  st_status cs = st_kernel_contract_load(&contract);
  if (cs) {
    json_decref(m);
    return cs;
  }
  int n_ops;
  const char* const* op_names = st_kernels_op_names(&n_ops);
  json_t* kern = json_object();
  for (int i = 0; i < n_ops; ++i) {
    char key[64];
    snprintf(key, sizeof(key), "kernels.%s", op_names[i]);
    const char* impl = st_config_string(c, key);
    o->kernel_auto[i] = !strcmp(impl, "auto");
    impl = st_kernel_resolve(&contract, op_names[i], impl, o->kernel_platform);
    /* A static name: the contract is freed below. */
    o->kernel_impl[i] = !strcmp(impl, "ffi") ? "ffi" : !strcmp(impl, "pallas") ? "pallas" : "xla";
    if (strcmp(o->kernel_impl[i], "xla")) json_object_set_new(kern, op_names[i], json_string(o->kernel_impl[i]));
  }
  st_kernel_contract_free(&contract);
  if (json_object_size(kern) > 0) json_object_set_new(m, "kernels", kern);
  else json_decref(kern);
  st__put_model_keys(m, c, ST_CONFIG_BUNDLE_IF_SET_AFTER_KERNELS, ST_CONFIG_BUNDLE_IF_SET_AFTER_KERNELS, true);
  /* Compute programs see one device's share of a microbatch (the config
   * rules make it divide evenly; docs/parallelism.md). */
  int64_t shares = st_config_int(c, "parallel.data") * st_config_int(c, "parallel.fsdp");
  st_json_put_int(m, "microbatch_size", o->batch_size / o->microbatches / shares);
  /* data.packing shapes the programs (none, pack: the loss is a sum over
   * the batch's weights; pack: positions enter the blocks, docs/data.md),
   * so it is part of the model; concat, the default, leaves the object as
   * it was. */
  const char* packing = st_config_string(c, "data.packing");
  if (strcmp(packing, "concat")) st_json_put_str(m, "packing", packing);
  /* The optimizer: in the model JSON (so the bundle key) only when it is
   * not adamw everywhere, so that every existing bundle keeps its key and
   * its programs; in the description always, so that a resume with
   * another assignment is refused naming both (a checkpoint without it
   * meant adamw everywhere: st_plan_model_implied). */
  bool adamw_everywhere = true;
  json_t* opt = st__optimizer_json(c, &adamw_everywhere);
  if (!adamw_everywhere) st_json_put(m, "optimizer", json_deep_copy(opt));

  /* The model description: every model.* key, at its default too, so that
   * a checkpoint names its block kind and kernels instead of leaving them
   * out (the bundle key keeps hashing the sparse object above, unchanged). */
  json_t* d = st_json_obj();
  st__put_model_keys(d, c, ST_CONFIG_BUNDLE_ALWAYS, ST_CONFIG_BUNDLE_ALWAYS, false);
  st__put_model_keys(d, c, ST_CONFIG_BUNDLE_IF_SET, ST_CONFIG_BUNDLE_IF_SET_AFTER_KERNELS, false);
  json_t* all = json_object();
  for (int i = 0; i < n_ops; ++i) json_object_set_new(all, op_names[i], json_string(o->kernel_impl[i]));
  json_object_set_new(d, "kernels", all);
  st_json_put_int(d, "microbatch_size", o->batch_size / o->microbatches / shares);
  if (strcmp(packing, "concat")) st_json_put_str(d, "packing", packing);
  st_json_put(d, "optimizer", opt);
  o->model_trees = st_xmalloc(sizeof(*o->model_trees));
  o->model_trees->model = m;
  o->model_trees->desc = d;
  o->model_json = st_json_dump(m, 0);
  o->model_desc = st_json_dump(d, 0);
  return ST_OK;
}

/* data.* and runtime.* (the data and the runtime take their own option structs). */
static void st__options_data_runtime(const st_config* c, st_plan_options* o) {
  o->data.path = st_config_string(c, "data.path");
  o->data.synthetic = st_config_bool(c, "data.synthetic");
  o->data.tokenizer = st_config_string(c, "data.tokenizer");
  /* data.vocab_size 0 is the model's vocabulary (the schema's rule bounds both). */
  o->data.tokenizer_vocab = !strcmp(o->data.tokenizer, "bpe") ? (uint32_t)st_config_int_resolved(c, "data.vocab_size") : 256u;
  o->data.vocab_size = (uint32_t)st_config_int(c, "model.vocab_size");
  o->data.val_fraction = st_config_float(c, "data.val_fraction");
  o->data.seq_len = st_config_int(c, "model.seq_len");
  o->data.seed = o->seed;
  o->data.progress = o->long_progress;
  o->data.cache_dir = o->cache_root;
  const char* packing = st_config_string(c, "data.packing");
  o->data.packing = !strcmp(packing, "pack") ? ST_DATA_PACKING_PACK
                    : !strcmp(packing, "none") ? ST_DATA_PACKING_NONE
                                               : ST_DATA_PACKING_CONCAT;
  o->data.separator = st_config_string(c, "data.separator");
  o->data.jsonl_field = st_config_string(c, "data.jsonl_field");
  o->data.prompt_marker = st_config_string(c, "data.prompt_marker");
  o->data_allow_changed = st_config_bool(c, "data.allow_changed");
  /* The schema's rule bounds the count and checks every weight. */
  o->data.n_sources = st_config_list_count(c, "data.sources");
  for (int i = 0; i < o->data.n_sources && i < ST_DATA_MAX_SOURCES; ++i) {
    o->data.sources[i] = st_config_list_item(c, "data.sources", i);
    o->data.weights[i] = strtod(st_config_list_item(c, "data.weights", i), NULL);
  }

  st_runtime_options_init(&o->runtime);
  o->runtime.plugin_path = st_config_string(c, "runtime.plugin");
  o->runtime.cpu_devices = (int)st_config_int(c, "runtime.cpu_devices");
  o->runtime.deterministic = st_config_bool(c, "runtime.deterministic");
  o->runtime.compile_threads = (int)st_config_int(c, "runtime.compile_threads");
  o->runtime.keep_optimized_hlo = st_config_bool(c, "runtime.keep_optimized_hlo");
  o->runtime.progress = o->long_progress.on;
  const char* shared = st_config_string(c, "runtime.shared_client");
  o->shared_client = !strcmp(shared, "on") ? 1 : !strcmp(shared, "off") ? 0 : -1;
}

/* fsdp across processes (docs/multiprocess.md, "fsdp across processes"):
 * one fsdp block per process, so parallel.fsdp must equal the process
 * count; and each rank holds other blocks, which today's checkpoint (rank
 * 0's state, whole) cannot hold: periodic saves and resuming are refused
 * rather than written or read wrong. */
static st_status st__options_fsdp_span(const st_config* c, st_plan_options* o) {
  if (o->parallel_fsdp != o->procs)
    return st_status_make(ST_CODE_CONFIG,
                          "parallel.fsdp=%d (%s) spans the %d processes, leaving fsdp=%d inside each: fsdp across "
                          "processes is built with one block per process; set parallel.fsdp=%d (docs/multiprocess.md)",
                          o->parallel_fsdp, st_config_source(c, "parallel.fsdp"), o->procs, o->parallel_fsdp / o->procs,
                          o->procs);
  /* Per-rank checkpoints are built for one device per process. */
  if (o->parallel_tensor == 1) return ST_OK;
  const int64_t every = st_config_int(c, "ckpt.every"), steps = st_config_int(c, "train.steps");
  if (every > 0 && every < steps)
    return st_status_make(ST_CODE_CONFIG,
                          "ckpt.every=%lld (%s) with parallel.fsdp=%d across %d processes and parallel.tensor=%d inside: "
                          "per-rank checkpoints are built for one device per process; set ckpt.every=0 (the final "
                          "parameters are still written whole to params.safetensors; docs/multiprocess.md)",
                          (long long)every, st_config_source(c, "ckpt.every"), o->parallel_fsdp, o->procs, o->parallel_tensor);
  if (st_config_bool(c, "run.resume"))
    return st_status_make(ST_CODE_CONFIG,
                          "run.resume with parallel.fsdp=%d across %d processes and parallel.tensor=%d inside: per-rank "
                          "checkpoints are built for one device per process (docs/multiprocess.md)",
                          o->parallel_fsdp, o->procs, o->parallel_tensor);
  return ST_OK;
}

/* parallel.processes > 1 (docs/multiprocess.md, "Which axis spans
 * processes"): the processes take the outermost mesh axis above 1, in the
 * mesh's order data, fsdp, tensor, each process keeping its 1/procs of it;
 * everything else (bundle, plan, executor) then sees this process's part.
 * Refused, exit 2: an axis that does not divide, no axis to span, tensor
 * (its collectives are inside XLA's programs), and what fsdp across
 * processes does not do (st__options_fsdp_span). */
static st_status st__options_span(const st_config* c, st_plan_options* o) {
  o->procs = (int)st_config_int(c, "parallel.processes");
  o->rank = 0;
  o->span_axis = ST_PLAN_SPAN_NONE;
  if (o->procs <= 1) return ST_OK;
  int* axes[3] = {&o->parallel_data, &o->parallel_fsdp, &o->parallel_tensor};
  static const char* const names[3] = {"parallel.data", "parallel.fsdp", "parallel.tensor"};
  int a = 0;
  while (a < 3 && *axes[a] <= 1) ++a;
  if (a == 3)
    return st_status_make(ST_CODE_CONFIG,
                          "parallel.processes=%d (%s) but every mesh axis is 1: each process would train alone; set "
                          "parallel.data (or parallel.fsdp) to a multiple of %d",
                          o->procs, st_config_source(c, "parallel.processes"), o->procs);
  if (*axes[a] % o->procs != 0)
    return st_status_make(ST_CODE_CONFIG,
                          "%s=%d (%s) is the outermost mesh axis above 1, so it spans the %d processes, but is not "
                          "divisible by %d; make it a multiple of parallel.processes",
                          names[a], *axes[a], st_config_source(c, names[a]), o->procs, o->procs);
  if (a == ST_PLAN_SPAN_TENSOR)
    return st_status_make(ST_CODE_CONFIG,
                          "parallel.tensor=%d would span the %d processes: tensor parallelism needs XLA collectives "
                          "inside its programs across processes, which the CPU plugin has none of (and the cross-process "
                          "GPU client is not built); put parallel.data or parallel.fsdp across processes",
                          o->parallel_tensor, o->procs);
  if (a == ST_PLAN_SPAN_FSDP) ST_RETURN(st__options_fsdp_span(c, o));
  o->span_axis = a;
  *axes[a] /= o->procs;
  return ST_OK;
}

/* sched.* and parallel.*: the policies the plan builder reads, typed once,
 * and the mesh the bundle is exported for. */
static st_status st__options_sched(const st_config* c, st_plan_options* o) {
  /* sched.remat and sched.memory_budget read once: the plan builder takes
   * the typed values (the schema's rules have checked both). */
  st_status ss = st_config_remat_read(st_config_string(c, "sched.remat"), (int)st_config_int(c, "model.n_layers"),
                                      &o->sched.remat);
  if (ss) return st_status_annotate(ss, "sched.remat (%s)", st_config_source(c, "sched.remat"));
  o->sched.memory_budget_text = st_config_string(c, "sched.memory_budget");
  o->sched.memory_budget_source = st_config_source(c, "sched.memory_budget");
  ss = st_config_memory_budget_parse(o->sched.memory_budget_text, &o->sched.memory_budget_bytes,
                                     &o->sched.memory_budget_fraction);
  if (ss) return st_status_annotate(ss, "sched.memory_budget (%s)", o->sched.memory_budget_source);
  o->sched.offload = st_sched_offload_parse(st_config_string(c, "sched.offload")); /* the schema admits only its names */
  o->sched.prefetch_depth = (int)st_config_int(c, "sched.prefetch_depth");
  o->sched.eager = !strcmp(st_config_string(c, "sched.wait"), "eager");
  o->sched.per_layer_optimizer = !strcmp(st_config_string(c, "sched.optimizer"), "per_layer");
  o->sched.bucketed_grad_reduce = !strcmp(st_config_string(c, "sched.grad_reduce"), "bucketed");
  o->sched.grad_bucket_bytes = st_config_int(c, "sched.grad_bucket_bytes");
  o->sched.gather_prefetch = (int)st_config_int(c, "sched.gather_prefetch");
  o->sched.reshard_after_forward = st_config_bool(c, "sched.reshard_after_forward");
  o->allow_overcommit = st_config_bool(c, "sched.allow_overcommit");
  o->device_memory_config = st_config_int(c, "runtime.device_memory_bytes");
  o->parallel_data = o->global_data = (int)st_config_int(c, "parallel.data");
  o->parallel_fsdp = o->global_fsdp = (int)st_config_int(c, "parallel.fsdp");
  o->parallel_tensor = o->global_tensor = (int)st_config_int(c, "parallel.tensor");
  o->parallel_pipeline = (int)st_config_int(c, "parallel.pipeline");
  const char* ps = st_config_string(c, "sched.pipeline_schedule");
  o->sched.pipeline_schedule = !strcmp(ps, "gpipe")         ? ST_PLAN_PIPE_GPIPE
                               : !strcmp(ps, "interleaved") ? ST_PLAN_PIPE_INTERLEAVED
                                                            : ST_PLAN_PIPE_1F1B;
  o->sched.pipeline_virtual = (int)st_config_int(c, "sched.pipeline_virtual");
  const int npl = st_config_list_count(c, "parallel.pipeline_layers");
  if (npl > 0) { /* the schema's rule checked every entry */
    o->pipeline_layers = st_xcalloc((size_t)npl, sizeof(int));
    for (int i = 0; i < npl; ++i) o->pipeline_layers[i] = atoi(st_config_list_item(c, "parallel.pipeline_layers", i));
  }
  ST_RETURN(st__options_span(c, o));
  /* The exporter's --mesh: the axes above 1 ("data=2,fsdp=2"), "" on one device. */
  o->mesh[0] = '\0';
  const char* axis_names[3] = {"data", "fsdp", "tensor"};
  const int axis_sizes[3] = {o->parallel_data, o->parallel_fsdp, o->parallel_tensor};
  for (int a = 0; a < 3; ++a)
    if (axis_sizes[a] > 1)
      snprintf(o->mesh + strlen(o->mesh), sizeof(o->mesh) - strlen(o->mesh), "%s%s=%d", o->mesh[0] ? "," : "",
               axis_names[a], axis_sizes[a]);
  return ST_OK;
}

/* trace.*, obs.* and runtime.xla_options: lists and observability. */
static void st__options_obs(const st_config* c, st_plan_options* o) {
  int nt = st_config_list_count(c, "trace.steps");
  if (nt > 0) {
    o->trace_steps = st_xcalloc((size_t)nt, sizeof(int64_t));
    for (int i = 0; i < nt; ++i) o->trace_steps[i] = strtoll(st_config_list_item(c, "trace.steps", i), NULL, 10);
    o->trace_step_count = nt;
  }

  o->metrics_port = (int)st_config_int(c, "obs.metrics_port");
  o->peak_flops = st_config_float(c, "obs.peak_flops");
  o->author = st_config_string(c, "obs.author");

  int nx = st_config_list_count(c, "runtime.xla_options");
  if (nx > 0) {
    const char** xs = st_xcalloc((size_t)nx, sizeof(char*));
    for (int i = 0; i < nx; ++i) xs[i] = st_config_list_item(c, "runtime.xla_options", i);
    o->runtime.xla_options = xs;
    o->runtime.xla_option_count = nx;
  }

}

/* ckpt.*, faults.*, diag.*, recovery.*: checkpoints and what watches a run. */
/* faults.slow_program=PROGRAM:FRACTION (the bench drill, docs/performance.md
 * "Baselines"): a name and a fraction in (0, 10]; "" is off. Whether a
 * plan launches PROGRAM is the trainer's check (it knows the plans). */
static st_status st__options_slow_program(const st_config* c, st_faults_options* f) {
  const char* v = st_config_string(c, "faults.slow_program");
  f->slow_program[0] = '\0';
  f->slow_fraction = 0;
  if (!v || !v[0]) return ST_OK;
  const char* colon = strrchr(v, ':');
  char* end = NULL;
  errno = 0;
  double frac = colon && colon[1] ? strtod(colon + 1, &end) : -1;
  size_t n = colon ? (size_t)(colon - v) : 0;
  if (!colon || n == 0 || n >= sizeof(f->slow_program) || errno || !end || *end || !(frac > 0 && frac <= 10))
    return st_status_make(ST_CODE_CONFIG,
                          "faults.slow_program=%s (%s): expected PROGRAM:FRACTION with FRACTION in (0, 10], e.g. "
                          "block_fwd_res:0.3 (each launch of block_fwd_res takes 30 %% longer); empty: off",
                          v, st_config_source(c, "faults.slow_program"));
  memcpy(f->slow_program, v, n);
  f->slow_program[n] = '\0';
  f->slow_fraction = frac;
  return ST_OK;
}

static st_status st__options_ckpt_diag(const st_config* c, st_plan_options* o) {
  o->resume = st_config_bool(c, "run.resume");
  o->ckpt.every = st_config_int(c, "ckpt.every");
  o->ckpt.keep = st_config_int(c, "ckpt.keep");
  o->ckpt.keep_every = st_config_int(c, "ckpt.keep_every");
  o->ckpt.async = st_config_bool(c, "ckpt.async");
  o->ckpt.stop_on_error = !strcmp(st_config_string(c, "ckpt.on_error"), "stop");
  o->ckpt.allow_bundle_change = st_config_bool(c, "ckpt.allow_bundle_change");
  const char* staging = st_config_string(c, "ckpt.staging");
  o->ckpt.staging = !strcmp(staging, "full") ? ST_CKPT_STAGING_FULL
                    : !strcmp(staging, "chunked") ? ST_CKPT_STAGING_CHUNKED : ST_CKPT_STAGING_AUTO;
  o->faults.crash_at_step = st_config_int(c, "faults.crash_at_step");
  o->faults.crash_in_save = st_config_int(c, "faults.crash_in_save");
  o->faults.corrupt_latest = st_config_int(c, "faults.corrupt_latest");
  o->faults.io_error_at_save = st_config_int(c, "faults.io_error_at_save");
  o->faults.hang_at_step = st_config_int(c, "faults.hang_at_step");
  o->faults.hang_in_save = st_config_int(c, "faults.hang_in_save");
  o->faults.io_errno = !strcmp(st_config_string(c, "faults.io_error"), "EIO") ? EIO : ENOSPC;
  o->faults.repeat = st_config_bool(c, "faults.repeat");
  ST_RETURN(st_config_nan_at_parse(st_config_string(c, "faults.nan_at"), &o->faults.nan_at_step, &o->faults.nan_layer,
                                   o->faults.nan_tensor, sizeof(o->faults.nan_tensor)));
  o->faults.nan_micro = (int)st_config_int(c, "faults.nan_micro");
  const char* nv = st_config_string(c, "faults.nan_value");
  o->faults.nan_value = !strcmp(nv, "inf") ? 1 : !strcmp(nv, "max") ? 2 : 0;
  o->faults.wrong_kernel = st_kernels_wrong_drill(st_config_string(c, "faults.wrong_kernel")) ? ST_FAULT_WRONG_ATTENTION : 0;
  ST_RETURN(st_config_dump_parse(st_config_string(c, "diag.dump"), &o->dump.step, &o->dump.layer_lo, &o->dump.layer_hi));
  ST_RETURN(st__options_slow_program(c, &o->faults));
  const char* nf = st_config_string(c, "diag.on_nonfinite");
  o->nonfinite.policy = !strcmp(nf, "skip") ? ST_NONFINITE_SKIP : !strcmp(nf, "rollback") ? ST_NONFINITE_ROLLBACK : ST_NONFINITE_STOP;
  o->nonfinite.max_skipped = st_config_int(c, "diag.max_skipped");
  o->nonfinite.max_rollbacks = st_config_int(c, "diag.max_rollbacks");
  const char* nm = st_config_string(c, "diag.numerics");
  o->numerics = !strcmp(nm, "layer") ? ST_NUMERICS_LAYER : !strcmp(nm, "step") ? ST_NUMERICS_STEP : ST_NUMERICS_OFF;
  o->recovery.max_restarts = st_config_int(c, "recovery.max_restarts");
  o->recovery.backoff_s = st_config_float(c, "recovery.backoff_s");
  o->recovery.backoff_max_s = st_config_float(c, "recovery.backoff_max_s");
  o->recovery.hang_timeout_s = st_config_float(c, "recovery.hang_timeout_s");
  o->faults.hang_in = st_config_string(c, "faults.hang_in");
  o->hang.timeout_s = st_config_float(c, "diag.hang_timeout_s");
  o->hang.factor = st_config_float(c, "diag.hang_factor");
  o->hang.floor_s = st_config_float(c, "diag.hang_floor_s");
  o->hang.compile_s = st_config_float(c, "diag.hang_compile_s");
  o->spike.z = st_config_float(c, "diag.spike_z");
  o->spike.window = st_config_int(c, "diag.spike_window");

  return ST_OK;
}

st_status st_plan_options_from_config(const st_config* c, st_plan_options* o) {
  memset(o, 0, sizeof(*o));
  st__options_train(c, o);
  ST_RETURN(st__options_model(c, o));
  st__options_data_runtime(c, o);
  ST_RETURN(st__options_sched(c, o));
  st__options_obs(c, o);
  return st__options_ckpt_diag(c, o);
}

void st_plan_options_deinit(st_plan_options* o) {
  free(o->cache_root);
  free(o->model_json);
  free(o->model_desc);
  if (o->model_trees) {
    json_decref(o->model_trees->model);
    json_decref(o->model_trees->desc);
    free(o->model_trees);
  }
  free((void*)o->runtime.xla_options);
  free((void*)o->runtime.cache_dir);
  free(o->trace_steps);
  free(o->pipeline_layers);
  memset(o, 0, sizeof(*o));
}

const char* st_plan_nonfinite_name(int policy) {
  return policy == ST_NONFINITE_SKIP ? "skip" : policy == ST_NONFINITE_ROLLBACK ? "rollback" : "stop";
}
