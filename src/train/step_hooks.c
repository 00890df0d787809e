/* step_hooks.c — the executor callbacks of a training step and of an
 * evaluation: H2D fills the batch, the step number and the optimizer's
 * scalars; READ takes the losses and squared norms back; HOST turns the
 * norms into the clip scale and the learning rate (docs/bundle.md). */
#include <math.h>

#include "strata/base.h"
#include "train/train_internal.h"

static st_status st__scalar_buffer(st__trainer* t, float v, st_buffer** out) {
  st_tensor_type s = {ST_DTYPE_F32, 0, {0}};
  return st_buffer_from_host(t->runtime, 0, &s, &v, out);
}

static st_status st__h2d(void* user, const st_op* op, st_buffer** out) {
  st__trainer* t = user;
  int64_t n = t->mb * t->T;
  st_tensor_type bt = {ST_DTYPE_S32, 2, {t->mb, t->T}};
  switch (op->tag) {
    case ST_TAG_TOKENS:
    case ST_TAG_EVAL_TOKENS:
      return st_buffer_from_host(t->runtime, 0, &bt, t->tokens + op->micro * n, out);
    case ST_TAG_TARGETS:
    case ST_TAG_EVAL_TARGETS:
      return st_buffer_from_host(t->runtime, 0, &bt, t->targets + op->micro * n, out);
    case ST_TAG_MASK:
    case ST_TAG_EVAL_MASK:
      bt.dtype = ST_DTYPE_F32;
      return st_buffer_from_host(t->runtime, 0, &bt, t->mask + op->micro * n, out);
    case ST_TAG_STEP:
      return st__scalar_buffer(t, (float)(t->step + 1), out);
    case ST_TAG_LR:
      return st__scalar_buffer(t, (float)t->lr, out);
    case ST_TAG_GSCALE:
      return st__scalar_buffer(t, (float)t->gscale, out);
    case ST_TAG_HYPER: {
      float h[4] = {(float)t->o->beta1, (float)t->o->beta2, (float)t->o->eps, (float)t->o->weight_decay};
      st_tensor_type ht = {ST_DTYPE_F32, 1, {4}};
      return st_buffer_from_host(t->runtime, 0, &ht, h, out);
    }
    default:
      return st_status_make(ST_CODE_INTERNAL, "H2D op with unknown tag %d", op->tag);
  }
}

static st_status st__read(void* user, const st_op* op, st_buffer* b) {
  st__trainer* t = user;
  float v = 0;
  ST_RETURN(st_buffer_to_host(b, &v, sizeof(v)));
  switch (op->tag) {
    case ST_TAG_LOSS:
    case ST_TAG_EVAL_LOSS:
      t->losses[op->micro] = v;
      return ST_OK;
    case ST_TAG_SQNORM:
      t->sqnorms[op->micro] = v;
      return ST_OK;
    default:
      return st_status_make(ST_CODE_INTERNAL, "READ op with unknown tag %d", op->tag);
  }
}

/* The global norm and clip scale (docs/bundle.md): norms are summed in f64
 * in instance order, the mean over microbatches is folded into gscale. */
static st_status st__host(void* user, const st_op* op) {
  st__trainer* t = user;
  if (op->tag == ST_TAG_SCHEDULE) {
    /* sched.optimizer=per_layer (no clipping): known before the backward. */
    t->gscale = 1.0 / (double)t->o->microbatches;
    t->lr = st_train_lr(t->o, t->step + 1);
    return ST_OK;
  }
  if (op->tag != ST_TAG_CLIP) return st_status_make(ST_CODE_INTERNAL, "HOST op with unknown tag %d", op->tag);
  double sum = 0;
  for (int i = 0; i < t->n_sq; ++i) sum += t->sqnorms[i];
  double n_micro = (double)t->o->microbatches;
  t->grad_norm = sqrt(sum) / n_micro;
  if (!isfinite(t->grad_norm))
    return st_status_make(ST_CODE_NUMERICS, "step %lld: gradient norm is not finite (%g); stopping before the update", (long long)t->step + 1,
                          t->grad_norm);
  double clip = 1.0;
  if (t->o->grad_clip > 0) {
    clip = t->o->grad_clip / (t->grad_norm + 1e-6);
    if (clip > 1) clip = 1;
  }
  t->gscale = clip / n_micro;
  t->lr = st_train_lr(t->o, t->step + 1);
  return ST_OK;
}

st_executor_hooks st__train_hooks(st__trainer* t) {
  return (st_executor_hooks){t, st__h2d, st__read, st__host};
}
