/* step_hooks.c — the executor callbacks of a training step and of an
 * evaluation: H2D fills the batch, the step number and the optimizer's
 * scalars; READ takes the losses and squared norms back; HOST turns the
 * norms into the clip scale and the learning rate (docs/bundle.md). */
#include <assert.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strata/base.h"
#include "strata/diag.h"
#include "train/train_internal.h"

static st_status st__scalar_buffer(st__trainer* t, int device, float v, st_buffer** out) {
  st_tensor_type s = {ST_DTYPE_F32, 0, {0}};
  return st_buffer_from_host(t->runtime, device, &s, &v, out);
}

/* The shares of each microbatch: data x fsdp. Mesh index p = (data
 * coordinate * fsdp + fsdp coordinate) * tensor + tensor coordinate takes
 * share p / tensor: a tensor group works on the same rows. */
static int st__shares(const st__trainer* t) {
  int d = t->o->parallel_data > 1 ? t->o->parallel_data : 1;
  int f = t->o->parallel_fsdp > 1 ? t->o->parallel_fsdp : 1;
  return d * f;
}

static int st__tensor(const st__trainer* t) { return t->o->parallel_tensor > 1 ? t->o->parallel_tensor : 1; }

/* Data parallelism: device index d takes rows [d * mb/D, (d+1) * mb/D) of
 * each microbatch (docs/parallelism.md); scalars go to every device. */
static st_status st__h2d(void* user, const st_op* op, int index, int device, st_buffer** out) {
  st__trainer* t = user;
  int64_t D = st__shares(t);
  int64_t rows = t->mb / D;
  int64_t n = t->mb * t->T;
  int64_t at = op->micro * n + (int64_t)(index / st__tensor(t)) * rows * t->T;
  st_tensor_type bt = {ST_DTYPE_S32, 2, {rows, t->T}};
  switch (op->tag) {
    case ST_TAG_TOKENS:
    case ST_TAG_EVAL_TOKENS:
      return st_buffer_from_host(t->runtime, device, &bt, t->tokens + at, out);
    case ST_TAG_TARGETS:
    case ST_TAG_EVAL_TARGETS:
      return st_buffer_from_host(t->runtime, device, &bt, t->targets + at, out);
    case ST_TAG_MASK:
    case ST_TAG_EVAL_MASK:
      bt.dtype = ST_DTYPE_F32;
      return st_buffer_from_host(t->runtime, device, &bt, t->mask + at, out);
    case ST_TAG_POSITIONS:
    case ST_TAG_EVAL_POSITIONS:
      if (!t->positions) return st_status_make(ST_CODE_INTERNAL, "the plan feeds positions, the trainer has none");
      return st_buffer_from_host(t->runtime, device, &bt, t->positions + at, out);
    case ST_TAG_STEP:
      return st__scalar_buffer(t, device, (float)(t->step + 1), out);
    case ST_TAG_LR:
      return st__scalar_buffer(t, device, (float)t->lr, out);
    case ST_TAG_GSCALE:
      return st__scalar_buffer(t, device, (float)t->gscale, out);
    case ST_TAG_HYPER: {
      float h[4] = {(float)t->o->beta1, (float)t->o->beta2, (float)t->o->eps, (float)t->o->weight_decay};
      st_tensor_type ht = {ST_DTYPE_F32, 1, {4}};
      return st_buffer_from_host(t->runtime, device, &ht, h, out);
    }
    default:
      /* The plan builder tags every H2D it emits with one of the cases
       * above: another tag is a bug in strata, not bad input. */
      assert(!"H2D op with a tag the plan builder never emits");
      return st_status_make(ST_CODE_INTERNAL, "H2D op with unknown tag %d", op->tag);
  }
}

/* A loss is each device's mean over its rows: the microbatch's loss is the
 * mean of the devices' (equal row counts, all-ones masks). A squared norm
 * is read after the reductions: every data replica holds the same, so
 * data coordinate 0's is taken, and under fsdp each of its devices holds
 * the norm of its blocks, which add up (mesh indices 0..fsdp-1). */
void st__metrics_reset(st__trainer* t) {
  for (int s = 0; s < t->n_metrics; ++s) {
    t->metric_sum[s] = 0;
    t->metric_reads[s] = 0;
    t->metric_min[s] = INFINITY;
    t->metric_max[s] = -INFINITY;
  }
}

/* A block metric (ST_TAG_METRIC + s): every device's value counts, as
 * every layer's and microbatch's does. */
static st_status st__read_metric(st__trainer* t, int s, st_buffer* b) {
  /* The plan reads only the metrics st_plan_block_metrics listed. */
  assert(s >= 0 && s < t->n_metrics);
  if (s < 0 || s >= t->n_metrics) return st_status_make(ST_CODE_INTERNAL, "READ of block metric %d of %d", s, t->n_metrics);
  const st_tensor_type* type = st_buffer_type(b);
  int64_t n = st_tensor_type_elements(type);
  if (type->dtype != ST_DTYPE_F32 || n < 1 || type->rank != t->metric_ranks[s])
    return st_status_make(ST_CODE_INTERNAL, "block metric '%s' is not the f32 tensor its bundle says", t->metric_names[s]);
  float* v = st_xmalloc((size_t)n * sizeof(float));
  st_status st = st_buffer_to_host(b, v, (size_t)n * sizeof(float));
  for (int64_t i = 0; !st && i < n; ++i) {
    t->metric_sum[s] += v[i];
    if (v[i] < t->metric_min[s]) t->metric_min[s] = v[i];
    if (v[i] > t->metric_max[s]) t->metric_max[s] = v[i];
  }
  if (!st) t->metric_reads[s]++;
  free(v);
  return st;
}

/* A largest |x| into a running maximum: NaN wins, so it is seen. */
static double st__max_nan(double acc, double v) { return isnan(acc) || isnan(v) ? NAN : v > acc ? v : acc; }

/* diag.numerics: update_stats of group instance op->micro (device index 0:
 * parameters and reduced gradients are the same on every device). */
static st_status st__read_num_opt(st__trainer* t, const st_op* op, int index, st_buffer* b) {
  int i = op->micro;
  if (i < 0 || i >= t->n_sq || !t->num_opt) return st_status_make(ST_CODE_INTERNAL, "READ of numerics of instance %d", i);
  if (index != 0) return ST_OK;
  const st_tensor_type* type = st_buffer_type(b);
  int64_t n = st_tensor_type_elements(type);
  if (type->dtype != ST_DTYPE_F32 || type->rank != 2 || type->dims[1] != ST_NSTAT_COLUMNS)
    return st_status_make(ST_CODE_INTERNAL, "update_stats output is not f32[n, %d]", ST_NSTAT_COLUMNS);
  float* v = st_xmalloc((size_t)n * sizeof(float));
  st_status s = st_buffer_to_host(b, v, (size_t)n * sizeof(float));
  double* acc = t->num_opt[i];
  for (int c = 0; c < ST_NSTAT_COLUMNS; ++c) acc[c] = 0;
  for (int64_t r = 0; !s && r < type->dims[0]; ++r)
    for (int c = 0; c < ST_NSTAT_COLUMNS; ++c) {
      double x = v[r * ST_NSTAT_COLUMNS + c];
      acc[c] = c == ST_NSTAT_UPDATE_MAX || c == ST_NSTAT_GRAD_MAX ? st__max_nan(acc[c], x) : acc[c] + x;
    }
  if (!s) t->num_opt_read[i] = true;
  free(v);
  return s;
}

/* diag.numerics=layer: act_stats of block op->layer's output or input
 * gradient; every device's rows count. */
static st_status st__read_num_act(st__trainer* t, const st_op* op, st_buffer* b) {
  int l = op->layer;
  if (l < 0 || l >= t->n_sq - 2 || !t->num_act) return st_status_make(ST_CODE_INTERNAL, "READ of numerics of layer %d", l);
  float v[3];
  const st_tensor_type* type = st_buffer_type(b);
  if (type->dtype != ST_DTYPE_F32 || st_tensor_type_elements(type) != 3)
    return st_status_make(ST_CODE_INTERNAL, "act_stats output is not f32[3]");
  ST_RETURN(st_buffer_to_host(b, v, sizeof(v)));
  double* acc = t->num_act[l][op->tag == ST_TAG_NUM_DX];
  acc[0] += v[0];
  acc[1] = st__max_nan(acc[1], v[1]);
  acc[2] += v[2];
  acc[3] += (double)(t->mb / st__shares(t)) * (double)t->T * (double)t->bundle->model.d_model;
  return ST_OK;
}

void st__numerics_reset(st__trainer* t) {
  if (t->num_opt) {
    memset(t->num_opt, 0, (size_t)t->n_sq * sizeof(*t->num_opt));
    memset(t->num_opt_read, 0, (size_t)t->n_sq * sizeof(bool));
  }
  if (t->num_act) memset(t->num_act, 0, (size_t)(t->n_sq - 2) * sizeof(*t->num_act));
}

static st_status st__read(void* user, const st_op* op, int index, st_buffer* b) {
  st__trainer* t = user;
  if (op->tag >= ST_TAG_METRIC) return st__read_metric(t, op->tag - ST_TAG_METRIC, b);
  if (op->tag == ST_TAG_NUM_OPT) return st__read_num_opt(t, op, index, b);
  if (op->tag == ST_TAG_NUM_OUT || op->tag == ST_TAG_NUM_DX) return st__read_num_act(t, op, b);
  float v = 0;
  ST_RETURN(st_buffer_to_host(b, &v, sizeof(v)));
  /* Every device reports its share's loss (a tensor group the same one). */
  int D = st__shares(t) * st__tensor(t);
  int F = t->o->parallel_fsdp > 1 ? t->o->parallel_fsdp : 1;
  /* fsdp across processes: this process's devices hold distinct blocks,
   * like an fsdp group's (the processes' norms are added at the clip) */
  if (t->o->procs > 1 && t->o->span_axis == ST_PLAN_SPAN_FSDP) F *= t->o->procs;
  switch (op->tag) {
    case ST_TAG_LOSS:
    case ST_TAG_EVAL_LOSS:
      if (D == 1) {
        t->losses[op->micro] = v;
      } else {
        if (index == 0) t->losses[op->micro] = 0;
        t->losses[op->micro] += (double)v / D;
      }
      return ST_OK;
    case ST_TAG_SQNORM:
      /* Under fsdp x tensor every device of data coordinate 0 (mesh
       * indices below fsdp x tensor) holds distinct blocks; the programs
       * weigh tensors whole over a tensor group by 1/tensor. Without fsdp
       * the tensor-parallel norm is the group's already. */
      if (index == 0) t->sqnorms[op->micro] = 0;
      if (index < (F > 1 ? F * st__tensor(t) : 1)) t->sqnorms[op->micro] += v;
      return ST_OK;
    default:
      assert(!"READ op with a tag the plan builder never emits");
      return st_status_make(ST_CODE_INTERNAL, "READ op with unknown tag %d", op->tag);
  }
}

/* The shares of each microbatch over the job: a job's processes that span
 * data (or fsdp, which is data parallel in the batch) each hold these
 * shares of their own rows. */
static double st__data(const st__trainer* t) {
  const st_plan_options* o = t->o;
  return (double)st__shares(t) * (o->span_axis != ST_PLAN_SPAN_NONE ? o->procs : 1);
}

double st__loss_divisor(const st__trainer* t, int stream, int64_t n_micro) {
  if (t->o->data.packing == ST_DATA_PACKING_CONCAT) return (double)n_micro * st__data(t);
  /* Each program's loss is sum(ce * w) / (its rows x T) (docs/data.md). */
  const double per_program = (double)(t->mb / st__shares(t)) * (double)t->T;
  return t->weight_sum[stream] / per_program;
}

double st__batch_loss(const st__trainer* t, int stream, const double* losses, int64_t n_micro) {
  double sum = 0;
  for (int64_t m = 0; m < n_micro; ++m) sum += losses[m];
  if (t->o->data.packing == ST_DATA_PACKING_CONCAT) return sum / (double)n_micro;
  /* losses[m] is the mean over the job's devices of their sums: times
   * their number is the sum of every program's. */
  return sum * st__data(t) / st__loss_divisor(t, stream, n_micro);
}

/* The global norm and clip scale (docs/bundle.md): norms are summed in f64
 * in instance order, the mean over microbatches is folded into gscale. */
static st_status st__hooks_host(void* user, const st_op* op) {
  st__trainer* t = user;
  if (op->tag == ST_TAG_SCHEDULE) {
    /* sched.optimizer=per_layer (no clipping): known before the backward. */
    t->gscale = 1.0 / st__loss_divisor(t, ST_STREAM_TRAIN, t->o->microbatches);
    t->lr = st_plan_lr(t->o, t->step + 1);
    return ST_OK;
  }
  assert(op->tag == ST_TAG_CLIP); /* the only other HOST op the builder emits */
  if (op->tag != ST_TAG_CLIP) return st_status_make(ST_CODE_INTERNAL, "HOST op with unknown tag %d", op->tag);
  /* The job's losses (a job of several processes): every rank must make
   * the same decision below. The norms are of the reduced gradients, the
   * same on every rank already. */
  ST_RETURN(st__losses_global(t, t->losses, t->o->microbatches));
  t->losses_global = true;
  ST_RETURN(st__sqnorms_global(t)); /* fsdp across processes: each rank's blocks' norms */
  double sum = 0;
  for (int i = 0; i < t->n_sq; ++i) sum += t->sqnorms[i];
  /* The reduced gradient is the sum over microbatches and data-parallel
   * devices of per-device mean gradients: the mean divides by both. */
  double n_micro = st__loss_divisor(t, ST_STREAM_TRAIN, t->o->microbatches);
  t->grad_norm = sqrt(sum) / n_micro;
  /* The losses were read before the norms: either one not finite drops
   * this step's update (whatever diag.on_nonfinite says next, the state
   * stays that of the step before, finite), and the trainer applies the
   * policy once the step returns. With sched.optimizer=per_layer the
   * update has happened already; only stop or rollback apply. */
  t->nonfinite = false;
  for (int64_t m = 0; m < t->o->microbatches && !t->nonfinite; ++m)
    if (!isfinite(t->losses[m])) {
      t->nonfinite = true;
      snprintf(t->nonfinite_what, sizeof(t->nonfinite_what), "loss of microbatch %lld", (long long)m);
      t->nonfinite_value = t->losses[m];
    }
  if (!t->nonfinite && !isfinite(t->grad_norm)) {
    t->nonfinite = true;
    snprintf(t->nonfinite_what, sizeof(t->nonfinite_what), "gradient norm");
    t->nonfinite_value = t->grad_norm;
  }
  if (t->nonfinite) {
    st_executor_skip_launches(t->ex);
    t->gscale = 0;
    t->lr = st_plan_lr(t->o, t->step + 1);
    return ST_OK;
  }
  double clip = 1.0;
  if (t->o->grad_clip > 0) {
    clip = t->o->grad_clip / (t->grad_norm + 1e-6);
    if (clip > 1) clip = 1;
  }
  t->gscale = clip / n_micro;
  t->lr = st_plan_lr(t->o, t->step + 1);
  return ST_OK;
}

/* faults.nan_at: a NaN into the first element of one output of a layer's
 * forward (not its recompute) in the armed step and microbatch; the
 * output is brought to the host, changed and put back as a new buffer.
 * The checking re-execution of that step (nonfinite.c) injects it again,
 * where it fired, and then checks every output. */
static st_status st__inject(st__trainer* t, const st_op* op, st_buffer** outputs) {
  /* The common case first: no drill in this step. */
  if (t->checking ? t->nan_fired_step != t->step + 1 : t->o->faults.nan_at_step != t->step + 1) return ST_OK;
  if (op->kind != ST_OP_LAUNCH || op->layer < 0 || op->layer >= t->bundle->layer_count || op->micro < 0) return ST_OK;
  const st_bundle_stage* st = &t->bundle->layers[op->layer];
  const char* name = t->step_plan.programs[op->program];
  const st_bundle_program* p = st->fwd && !strcmp(name, st->fwd->name) ? st->fwd
                               : st->fwd_res && !strcmp(name, st->fwd_res->name) ? st->fwd_res
                                                                                  : NULL;
  if (!p) return ST_OK;
  const char* tensor = NULL;
  if (t->checking) {
    if (t->nan_fired_step != t->step + 1 || t->nan_fired_layer != op->layer || t->nan_fired_micro != op->micro) return ST_OK;
    tensor = t->nan_fired_tensor;
  } else {
    if (!st_faults_nan_fire(st_train_ckpt_faults(t->ckpt), t->step + 1, op->layer, op->micro, &tensor)) return ST_OK;
    t->nan_fired_step = t->step + 1;
    t->nan_fired_layer = op->layer;
    t->nan_fired_micro = op->micro;
    snprintf(t->nan_fired_tensor, sizeof(t->nan_fired_tensor), "%s", tensor ? tensor : "");
  }
  int k = 0;
  if (tensor && tensor[0]) {
    k = -1;
    for (int j = 0; j < p->output_count && j < op->output_count; ++j)
      if (!strcmp(p->outputs[j].name, tensor)) k = j;
    if (k < 0)
      return st_status_make(ST_CODE_CONFIG, "faults.nan_at: program '%s' has no output '%s'; its outputs are %s%s%s...", p->name,
                            tensor, p->outputs[0].name, p->output_count > 1 ? ", " : "", p->output_count > 1 ? p->outputs[1].name : "");
  }
  snprintf(t->nan_fired_output, sizeof(t->nan_fired_output), "%s", p->outputs[k].name);
  const st_tensor_type* ty = st_buffer_type(outputs[k]);
  size_t bytes = st_tensor_type_bytes(ty);
  if (ty->dtype != ST_DTYPE_F32 && ty->dtype != ST_DTYPE_BF16)
    return st_status_make(ST_CODE_CONFIG, "faults.nan_at: output '%s' of '%s' is not a float tensor", p->outputs[k].name, p->name);
  unsigned char* host = st_xmalloc(bytes ? bytes : 1);
  st_status s = st_buffer_to_host(outputs[k], host, bytes);
  if (!s) {
    const int what = t->o->faults.nan_value;
    if (ty->dtype == ST_DTYPE_F32) {
      float v = what == 1 ? INFINITY : what == 2 ? FLT_MAX : NAN;
      memcpy(host, &v, sizeof(v));
    } else { /* bf16, little-endian: quiet NaN 0x7fc0, +inf 0x7f80, largest finite 0x7f7f */
      host[0] = what == 1 ? 0x80 : what == 2 ? 0x7f : 0xc0;
      host[1] = 0x7f;
    }
    st_tensor_type copy = *ty;
    st_buffer* b = NULL;
    s = st_buffer_from_host(t->runtime, st_buffer_device(outputs[k]), &copy, host, &b);
    if (!s) {
      st_buffer_destroy(outputs[k]);
      outputs[k] = b;
    }
  }
  free(host);
  return s;
}

st_status st__check_nan_at(const st__trainer* t) {
  const st_faults_options* fo = &t->o->faults;
  if (fo->nan_at_step <= 0) return ST_OK;
  const int L = fo->nan_layer, M = fo->nan_micro;
  char spec[160];
  snprintf(spec, sizeof(spec), "faults.nan_at=%lld:%d%s%s", (long long)fo->nan_at_step, L, fo->nan_tensor[0] ? ":" : "",
           fo->nan_tensor);
  if (L < 0 || L >= t->bundle->layer_count)
    return st_status_make(ST_CODE_CONFIG, "%s: the model has %d layers (0 to %d): layer %d does not exist", spec,
                          t->bundle->layer_count, t->bundle->layer_count - 1, L);
  const st_bundle_stage* st = &t->bundle->layers[L];
  const st_bundle_program* p = NULL;
  for (int i = 0; i < t->step_plan.op_count && !p; ++i) {
    const st_op* op = &t->step_plan.ops[i];
    if (op->kind != ST_OP_LAUNCH || op->layer != L || op->micro != M) continue;
    const char* name = t->step_plan.programs[op->program];
    if (st->fwd && !strcmp(name, st->fwd->name)) p = st->fwd;
    else if (st->fwd_res && !strcmp(name, st->fwd_res->name)) p = st->fwd_res;
  }
  /* What st__inject poisons: a drill this plan never reaches would be
   * armed and silent. */
  if (!p)
    return st_status_make(ST_CODE_CONFIG,
                          "%s (faults.nan_micro=%d) cannot fire: the step plan launches no training forward of layer %d (%s%s%s) "
                          "in microbatch %d; see strata plan",
                          spec, M, L, st->fwd ? st->fwd->name : "", st->fwd && st->fwd_res ? " or " : "",
                          st->fwd_res ? st->fwd_res->name : "", M);
  int k = 0;
  if (fo->nan_tensor[0]) {
    k = -1;
    for (int j = 0; j < p->output_count; ++j)
      if (!strcmp(p->outputs[j].name, fo->nan_tensor)) k = j;
    if (k < 0) {
      st_strbuf names = {0};
      for (int j = 0; j < p->output_count; ++j) st_strbuf_printf(&names, "%s%s", j ? ", " : "", p->outputs[j].name);
      st_status s = st_status_make(ST_CODE_CONFIG, "%s: program '%s' has no output '%s' (it is layer %d's training forward); its outputs are %s",
                                   spec, p->name, fo->nan_tensor, L, st_strbuf_cstr(&names));
      st_strbuf_free(&names);
      return s;
    }
  }
  if (p->output_count < 1 || (p->outputs[k].type.dtype != ST_DTYPE_F32 && p->outputs[k].type.dtype != ST_DTYPE_BF16))
    return st_status_make(ST_CODE_CONFIG, "%s: output '%s' of '%s' is not a float tensor (f32 or bf16): it cannot hold a NaN", spec,
                          p->output_count > 0 ? p->outputs[k].name : "", p->name);
  return ST_OK;
}

st_status st__check_slow_program(st__trainer* t) {
  const st_faults_options* fo = &t->o->faults;
  t->slow_on = false;
  t->slow_program = -1;
  if (!fo->slow_program[0]) return ST_OK;
  for (int i = 0; i < t->step_plan.program_count; ++i)
    if (!strcmp(t->step_plan.programs[i], fo->slow_program)) t->slow_program = i;
  if (t->slow_program < 0) {
    st_strbuf names = {0};
    for (int i = 0; i < t->step_plan.program_count; ++i)
      st_strbuf_printf(&names, "%s%s", i ? ", " : "", t->step_plan.programs[i]);
    st_status s = st_status_make(ST_CODE_CONFIG, "faults.slow_program=%s:%g: the step plan launches no program '%s'; its programs: %s",
                                 fo->slow_program, fo->slow_fraction, fo->slow_program, st_strbuf_cstr(&names));
    st_strbuf_free(&names);
    return s;
  }
  t->slow_on = true;
  fprintf(stderr, "strata: FAULT ARMED: faults.slow_program=%s:%g: every training launch of %s waits %g x its own duration "
                  "after it completes (a performance drill)\n", fo->slow_program, fo->slow_fraction, fo->slow_program,
          fo->slow_fraction);
  return ST_OK;
}

/* Waits until |b|'s producer is done. */
static st_status st__slow_await(st_buffer* b) {
  st_event* ev = NULL;
  ST_RETURN(st_buffer_ready_event(b, &ev));
  st_status s = st_event_await(ev);
  st_event_destroy(ev);
  return s;
}

/* faults.slow_program, before a launch of the program (device index 0):
 * its inputs awaited first, so that the duration measured after it is its
 * own and not that of the launches queued before it. */
static st_status st__slow_begin(st__trainer* t, const st_op* op, int index, st_buffer* const* inputs) {
  if (!t->slow_on || index != 0 || op->program != t->slow_program || (op->kind != ST_OP_LAUNCH && op->kind != ST_OP_RECOMPUTE))
    return ST_OK;
  for (int j = 0; j < op->input_count; ++j) ST_RETURN(st__slow_await(inputs[j]));
  t->slow_t0 = st_now();
  return ST_OK;
}

/* ... and after it: its outputs awaited, then the drill's share of the
 * measured duration slept, before the executor hears of its completion
 * (its timing and the step's both carry the delay). */
static st_status st__slow_end(st__trainer* t, const st_op* op, int index, st_buffer** outputs) {
  if (!t->slow_on || index != 0 || op->program != t->slow_program || (op->kind != ST_OP_LAUNCH && op->kind != ST_OP_RECOMPUTE))
    return ST_OK;
  if (op->output_count > 0) ST_RETURN(st__slow_await(outputs[0]));
  double wait = t->o->faults.slow_fraction * (st_now() - t->slow_t0);
  if (wait > 0) {
    struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  return ST_OK;
}

static st_status st__launched(void* user, const st_op* op, int index, st_buffer** outputs) {
  st__trainer* t = user;
  ST_RETURN(st__slow_end(t, op, index, outputs));
  if (t->checking) st__nf_time_launch(t, op, index, outputs);
  if (index == 0) ST_RETURN(st__inject(t, op, outputs));
  if (t->dump) ST_RETURN(st__dump_outputs(t, op, index, outputs));
  return t->checking ? st__nf_check_outputs(t, op, index, outputs) : ST_OK;
}

static st_status st__launching(void* user, const st_op* op, int index, st_buffer* const* inputs) {
  st__trainer* t = user;
  if (t->dump) ST_RETURN(st__dump_inputs(t, op, index, inputs));
  if (t->checking) ST_RETURN(st__nf_check_inputs(t, op, index, inputs));
  /* Last: the drill's clock starts right before the launch. */
  return st__slow_begin(t, op, index, inputs);
}

st_executor_hooks st__train_hooks(st__trainer* t) {
  return (st_executor_hooks){t, st__h2d, st__read, st__hooks_host, st__launched, st__launching};
}
