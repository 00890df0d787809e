/* evaluate.c — the evaluation `strata train` runs every train.eval_every
 * steps, and `strata eval`: the same plan, programs, batches and averaging,
 * so the loss of a run's final parameters read back from disk is the run's
 * own final eval loss. `strata eval` builds the plans on one device
 * (checkpoints hold whole tensors, docs/checkpoints.md) and fills the eval
 * plan's parameter slots from a safetensors file instead of borrowing them
 * from a step executor. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/kernels.h"
#include "strata/obs.h"
#include "strata/train.h"
#include "train/train_internal.h"

st_status st__eval_batches(st__trainer* t, double* out_loss) {
  int64_t em = t->o->eval_batches * t->o->microbatches;
  ST_RETURN(st__fill_share(t, ST_STREAM_EVAL, 0, em));
  st_executor_hooks hooks = st__train_hooks(t);
  hooks.launched = NULL; /* faults.nan_at poisons training steps only */
  hooks.launching = NULL;
  st_status s = st_executor_run(t->eval_ex, &hooks);
  if (s) return st_status_annotate(s, "evaluation");
  ST_RETURN(st__losses_global(t, t->losses, em));
  *out_loss = st__batch_loss(t, ST_STREAM_EVAL, t->losses, em);
  return ST_OK;
}

static bool st__eval_same_type(const st_tensor_type* a, const st_tensor_type* b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int k = 0; k < a->rank; ++k)
    if (a->dims[k] != b->dims[k]) return false;
  return true;
}

/* Every persistent parameter slot of the eval plan from |path|: the
 * tensor of the slot's name, with the slot's dtype and shape. A missing or
 * different tensor is a checkpoint error naming it (the parameters are of
 * another model). */
static st_status st__load_params(st__trainer* t, const char* path) {
  st_safetensors* f = NULL;
  ST_RETURN(st_safetensors_read(path, &f));
  const st_plan* ep = &t->eval_plan;
  st_status s = ST_OK;
  for (int i = 0; i < ep->slot_count && !s; ++i) {
    const st_slot* sl = &ep->slots[i];
    if (sl->category != ST_SLOT_PARAM || !sl->persistent) continue;
    const st_safetensors_entry* e = st_safetensors_find(f, sl->name);
    if (!e) {
      s = st_status_make(ST_CODE_CKPT, "'%s' has no tensor '%s', a parameter of the configured model (another model's parameters?)",
                         path, sl->name);
      break;
    }
    if (!st__eval_same_type(&e->type, &sl->type) || e->bytes != st_tensor_type_bytes(&sl->type)) {
      char want[96], got[96];
      st_tensor_type_format(&sl->type, want, sizeof(want));
      st_tensor_type_format(&e->type, got, sizeof(got));
      s = st_status_make(ST_CODE_CKPT, "'%s': tensor '%s' is %s, the configured model's is %s (another model's parameters?)", path,
                         sl->name, got, want);
      break;
    }
    st_buffer* b = NULL;
    s = st_buffer_from_host(t->runtime, 0, &sl->type, f->data + e->offset, &b);
    if (!s) st_executor_set(t->eval_ex, i, b);
  }
  st_safetensors_free(f);
  return s;
}

st_status st_train_evaluate(const st_config* cfg, const st_plan_trained_ref* ref, const char* allow, st_eval_result* out) {
  memset(out, 0, sizeof(*out));
  out->loss = NAN;
  const char* params_path = ref->params_path;
  char* tokenizer_json = st_rundir_path(ref->run_dir, ST_RUNDIR_TOKENIZER);
  st_plan_options o;
  st_status s = st_plan_options_from_config(cfg, &o);
  /* A BPE model is evaluated on its own tokenizer's ids, whatever the corpus. */
  if (!s && !strcmp(o.data.tokenizer, "bpe")) o.data.tokenizer_from = tokenizer_json;
  if (!s && (o.parallel_data > 1 || o.parallel_fsdp > 1 || o.parallel_tensor > 1 || o.parallel_pipeline > 1))
    s = st_status_make(ST_CODE_CONFIG, "evaluation runs on one device: set parallel.data, parallel.fsdp, parallel.tensor "
                       "and parallel.pipeline to 1");
  /* The model about to be evaluated is the one the parameters were trained
   * as, and its tokens mean the same text: checked before anything is read. */
  char given_tok[65] = "";
  if (!s) s = st_plan_given_tokenizer(&o, o.data.tokenizer_from, given_tok);
  if (!s) {
    st_plan_record rec = ref->record;
    rec.fallback_config = ref->config_path;
    s = st_plan_check_identity(&rec, &o, given_tok, allow, st_plan_identity_fix, &out->identity);
  }
  /* Parameters come whole from a file into device slots: no host homes
   * (sched.offload is a training-memory policy; the loss is the same). */
  o.sched.offload = 0;
  st__trainer t;
  memset(&t, 0, sizeof(t));
  t.o = &o;
  st_bundle* bundle = NULL;
  st_plan step_plan;
  memset(&step_plan, 0, sizeof(step_plan));
  double t0 = st_now();
  if (!s) s = st_dataset_open(&o.data, &t.data);
  if (!s) {
    st_plan_open_options how = {.progress = true};
    s = st_plan_open(&o, &how, &t.opened);
    bundle = t.opened.bundle;
    t.bundle = bundle;
    t.runtime = t.opened.runtime;
  }
  if (!s) {
    o.device_memory = st_runtime_device_memory(t.runtime, 0);
    s = st_plan_build(bundle, &o, &step_plan, &t.eval_plan, NULL);
  }
  if (!s) {
    t.compiled = st_xcalloc((size_t)bundle->program_count + 1, sizeof(st_program*));
    t.compile_s = st_xcalloc((size_t)bundle->program_count + 1, sizeof(double));
    const st_plan* plans[1] = {&t.eval_plan};
    s = st__compile_programs(&t, plans, 1, NULL, 0);
  }
  if (!s) s = st__plan_programs(&t, &t.eval_plan, &t.eval_programs);
  if (!s) s = st_executor_create(&t.eval_plan, t.runtime, t.eval_programs, 0, &t.eval_ex);
  if (!s) s = st__load_params(&t, params_path);
  if (!s) {
    t.mb = o.batch_size / o.microbatches;
    t.T = o.data.seq_len;
    int64_t rows = o.batch_size * o.eval_batches;
    t.tokens = st_xcalloc((size_t)(rows * t.T), sizeof(int32_t));
    t.targets = st_xcalloc((size_t)(rows * t.T), sizeof(int32_t));
    t.mask = st_xcalloc((size_t)(rows * t.T), sizeof(float));
    if (o.data.packing == ST_DATA_PACKING_PACK) t.positions = st_xcalloc((size_t)(rows * t.T), sizeof(int32_t));
    t.losses = st_xcalloc((size_t)(o.microbatches * o.eval_batches), sizeof(double));
    s = st__eval_batches(&t, &out->loss);
  }
  if (!s) {
    out->sequences = o.eval_batches * o.batch_size;
    out->tokens = out->sequences * t.T;
    out->eval_batches = o.eval_batches;
    out->batch_size = o.batch_size;
    out->seq_len = t.T;
    out->bytes_per_token = st_dataset_bytes_per_token(t.data, ST_STREAM_EVAL);
    out->bytes = out->bytes_per_token > 0;
    out->data_path = st_xstrdup(o.data.path);
    out->token_file = st_xstrdup(st_dataset_token_path(t.data));
    out->split_tokens = (int64_t)st_dataset_split_tokens(t.data, ST_STREAM_EVAL);
    out->seconds = st_now() - t0;
  }
  st_executor_destroy(t.eval_ex);
  free(t.eval_programs);
  if (t.compiled) {
    for (int i = 0; i < bundle->program_count; ++i) st_program_destroy(t.compiled[i]);
    free(t.compiled);
    free(t.compile_s);
  }
  st_plan_deinit(&step_plan);
  st_plan_deinit(&t.eval_plan);
  free(t.tokens);
  free(t.targets);
  free(t.mask);
  free(t.positions);
  free(t.losses);
  st_plan_close(&t.opened);
  st_dataset_destroy(t.data);
  st_plan_options_deinit(&o);
  free(tokenizer_json);
  return s;
}

void st_eval_result_deinit(st_eval_result* r) {
  if (!r) return;
  free(r->data_path);
  free(r->token_file);
  json_decref(r->identity);
  memset(r, 0, sizeof(*r));
}
