/* lr_schedule.c — the learning-rate schedules (train.lr_schedule): the lr
 * of every optimizer step as a pure function of the step and the options,
 * and the record of a schedule that a checkpoint keeps (docs/model.md,
 * "Learning-rate schedules"; docs/checkpoints.md). */
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "strata/base.h"
#include "strata/plan.h"

const char* st_plan_lr_schedule_name(int schedule) {
  switch (schedule) {
    case ST_PLAN_LR_CONSTANT: return "constant";
    case ST_PLAN_LR_LINEAR: return "linear";
    case ST_PLAN_LR_WSD: return "wsd";
    default: return "cosine";
  }
}

int64_t st_plan_lr_decay_steps(const st_plan_options* o) {
  int64_t span = o->steps - o->warmup_steps;
  if (span < 1) span = 1; /* every step is warm-up: the decay is past the end, as cosine's p = 1 */
  if (o->lr_schedule == ST_PLAN_LR_LINEAR) return span;
  if (o->lr_schedule != ST_PLAN_LR_WSD) return 0;
  /* Rounded to nearest rather than up: 0.1 * 30 is 3.0000000000000004 in
   * doubles, and three steps is what was asked. */
  int64_t d = (int64_t)llround(o->decay_fraction * (double)span);
  return d < 1 ? 1 : d > span ? span : d;
}

double st_plan_lr(const st_plan_options* o, int64_t t) {
  if (o->warmup_steps > 0 && t <= o->warmup_steps) return o->lr * (double)t / (double)o->warmup_steps;
  if (o->lr_schedule == ST_PLAN_LR_CONSTANT) return o->lr;
  double min_lr = o->lr * o->min_lr_ratio;
  if (o->lr_schedule == ST_PLAN_LR_COSINE) {
    /* The default: these operations, in this order, are the ones every
     * run before train.lr_schedule trained with, so its losses stay bitwise. */
    int64_t span = o->steps - o->warmup_steps;
    double p = (double)(t - o->warmup_steps) / (double)(span > 1 ? span : 1);
    if (p > 1) p = 1;
    return min_lr + (o->lr - min_lr) * 0.5 * (1.0 + cos(M_PI * p));
  }
  /* linear and wsd: lr until the last d steps, then a straight line to
   * min_lr at train.steps (linear is wsd with every step decaying). k / d
   * is exact at the ends: lr at k = 0, min_lr at k = d. */
  int64_t d = st_plan_lr_decay_steps(o);
  int64_t k = t - (o->steps - d);
  if (k <= 0) return o->lr;
  if (k > d) k = d;
  return min_lr + (o->lr - min_lr) * ((double)(d - k) / (double)d);
}

st_json* st_plan_lr_schedule_json(const st_plan_options* o) {
  st_json* j = st_json_obj();
  st_json_put_str(j, "schedule", st_plan_lr_schedule_name(o->lr_schedule));
  st_json_put_num(j, "peak_lr", o->lr);
  st_json_put_int(j, "warmup_steps", o->warmup_steps);
  st_json_put_int(j, "total_steps", o->steps);
  if (o->lr_schedule != ST_PLAN_LR_CONSTANT) st_json_put_num(j, "min_lr_ratio", o->min_lr_ratio);
  if (o->lr_schedule == ST_PLAN_LR_WSD) st_json_put_num(j, "decay_fraction", o->decay_fraction);
  if (o->lr_schedule == ST_PLAN_LR_WSD || o->lr_schedule == ST_PLAN_LR_LINEAR)
    st_json_put_int(j, "decay_steps", st_plan_lr_decay_steps(o));
  return j;
}

/* A number member of |j| into |out|; false when absent or not a number. */
static bool st__lr_num(const st_json* j, const char* key, double* out) {
  const json_t* v = json_object_get(j, key);
  if (!json_is_number(v)) return false;
  *out = json_number_value(v);
  return isfinite(*out);
}

bool st_plan_lr_schedule_from_json(const st_json* record, const st_plan_options* base, st_plan_options* out) {
  *out = *base;
  const json_t* name = json_object_get(record, "schedule");
  if (!json_is_string(name)) return false;
  const char* n = json_string_value(name);
  int kinds[] = {ST_PLAN_LR_CONSTANT, ST_PLAN_LR_LINEAR, ST_PLAN_LR_COSINE, ST_PLAN_LR_WSD};
  int kind = -1;
  for (int i = 0; i < 4; ++i)
    if (!strcmp(n, st_plan_lr_schedule_name(kinds[i]))) kind = kinds[i];
  if (kind < 0) return false;
  out->lr_schedule = kind;
  if (!st__lr_num(record, "peak_lr", &out->lr) || !st_json_as_int(json_object_get(record, "warmup_steps"), &out->warmup_steps) ||
      !st_json_as_int(json_object_get(record, "total_steps"), &out->steps) || out->warmup_steps < 0 || out->steps < 1)
    return false;
  if (kind != ST_PLAN_LR_CONSTANT && !st__lr_num(record, "min_lr_ratio", &out->min_lr_ratio)) return false;
  if (kind == ST_PLAN_LR_WSD && (!st__lr_num(record, "decay_fraction", &out->decay_fraction) || out->decay_fraction <= 0))
    return false;
  return true;
}
