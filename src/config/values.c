/* values.c — the syntax of the config values that are more than a type or
 * an enum, and the rules between values, each stated once: the schema's
 * cross-field rules call these, and so do the typed options and the plan
 * builder (src/plan/), which take values that did not come through a
 * config file. Nothing here depends on a module above config. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/config.h"

#define ST__REMAT_HELP "expected auto, none, full, every:K (K >= 1) or a comma-separated list of layers such as 0,2,5"

bool st_config_remat_is_auto(const char* spec) { return !spec || !spec[0] || !strcmp(spec, "auto"); }

st_status st_config_remat_read(const char* spec, int n_layers, st_config_remat* out) {
  memset(out, 0, sizeof(*out));
  out->text = spec;
  if (st_config_remat_is_auto(spec)) return ST_OK;
  if (!strcmp(spec, "full") || !strcmp(spec, "none")) {
    out->kind = !strcmp(spec, "full") ? ST_CONFIG_REMAT_FULL : ST_CONFIG_REMAT_NONE;
    return ST_OK;
  }
  if (!strncmp(spec, "every:", 6)) {
    const char* p = spec + 6;
    char* end = NULL;
    errno = 0;
    long k = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1;
    if (k < 1 || errno || !end || *end)
      return st_status_make(ST_CODE_CONFIG, "sched.remat '%s': K must be a whole number >= 1; " ST__REMAT_HELP, spec);
    out->kind = ST_CONFIG_REMAT_EVERY;
    /* Beyond every layer a model can have, K picks layer 0 alone, as the largest int does. */
    out->every = k > ST_CONFIG_REMAT_MAX_LAYERS ? ST_CONFIG_REMAT_MAX_LAYERS : (int)k;
    return ST_OK;
  }
  out->kind = ST_CONFIG_REMAT_LIST;
  const char* p = spec;
  int count = 0;
  for (;;) {
    while (*p == ' ') ++p;
    if (!isdigit((unsigned char)*p))
      return st_status_make(ST_CODE_CONFIG, "sched.remat '%s': unexpected '%s'; " ST__REMAT_HELP, spec, *p ? p : "end");
    char* end = NULL;
    errno = 0;
    long l = strtol(p, &end, 10);
    if (errno || l > 1000000 || (n_layers > ST_CONFIG_REMAT_MAX_LAYERS && l >= ST_CONFIG_REMAT_MAX_LAYERS))
      return st_status_make(ST_CODE_CONFIG, "sched.remat '%s': layer index out of range; " ST__REMAT_HELP, spec);
    if (n_layers >= 0 && l >= n_layers)
      return st_status_make(ST_CODE_CONFIG, "sched.remat '%s' lists layer %ld, but the model has %d layers (0..%d)", spec,
                            l, n_layers, n_layers - 1);
    if (l < ST_CONFIG_REMAT_MAX_LAYERS) out->list[l / 64] |= (uint64_t)1 << (l % 64);
    ++count;
    p = end;
    while (*p == ' ') ++p;
    if (!*p) break;
    if (*p != ',') return st_status_make(ST_CODE_CONFIG, "sched.remat '%s': unexpected '%s'; " ST__REMAT_HELP, spec, p);
    ++p;
  }
  return count ? ST_OK : st_status_make(ST_CODE_CONFIG, "sched.remat '%s': " ST__REMAT_HELP, spec);
}

st_status st_config_remat_layers(const st_config_remat* r, int n_layers, bool* out) {
  for (int l = 0; l < n_layers; ++l) {
    switch (r->kind) {
      case ST_CONFIG_REMAT_AUTO:
      case ST_CONFIG_REMAT_NONE: out[l] = false; break;
      case ST_CONFIG_REMAT_FULL: out[l] = true; break;
      case ST_CONFIG_REMAT_EVERY: out[l] = l % r->every == 0; break;
      case ST_CONFIG_REMAT_LIST: out[l] = l < ST_CONFIG_REMAT_MAX_LAYERS && (r->list[l / 64] >> (l % 64) & 1); break;
    }
  }
  if (r->kind != ST_CONFIG_REMAT_LIST) return ST_OK;
  /* A list read for more layers than these (options built for another depth). */
  for (int l = n_layers > 0 ? n_layers : 0; l < ST_CONFIG_REMAT_MAX_LAYERS; ++l)
    if (r->list[l / 64] >> (l % 64) & 1)
      return st_status_make(ST_CODE_CONFIG, "sched.remat '%s' lists layer %d, but the model has %d layers (0..%d)",
                            r->text ? r->text : "", l, n_layers, n_layers - 1);
  return ST_OK;
}

st_status st_config_remat_parse(const char* spec, int n_layers, bool* out) {
  st_config_remat r;
  ST_RETURN(st_config_remat_read(spec, n_layers, &r));
  return out && n_layers >= 0 ? st_config_remat_layers(&r, n_layers, out) : ST_OK;
}

#define ST__BUDGET_HELP                                                                                         \
  "expected bytes as a whole number (0: no limit) or a fraction of the device's memory in (0, 1] written with a " \
  "decimal point, such as 0.9"

st_status st_config_memory_budget_parse(const char* spec, int64_t* out_bytes, double* out_fraction) {
  int64_t bytes = 0;
  double fraction = 0;
  if (!spec) spec = "";
  const char* p = spec;
  bool digits = isdigit((unsigned char)*p) != 0;
  char* end = NULL;
  errno = 0;
  if (digits && !strchr(spec, '.') && !strchr(spec, 'e') && !strchr(spec, 'E')) {
    long long v = strtoll(p, &end, 10);
    if (errno || *end)
      return st_status_make(ST_CODE_CONFIG, "sched.memory_budget '%s': %s", spec,
                            errno ? "more bytes than a 64-bit count holds" : ST__BUDGET_HELP);
    bytes = v;
  } else {
    double v = digits ? strtod(p, &end) : -1;
    if (!digits || errno || !end || *end || !(v > 0) || v > 1)
      return st_status_make(ST_CODE_CONFIG, "sched.memory_budget '%s': %s", spec, ST__BUDGET_HELP);
    fraction = v;
  }
  if (out_bytes) *out_bytes = bytes;
  if (out_fraction) *out_fraction = fraction;
  return ST_OK;
}

st_status st_config_check_per_layer_clip(bool per_layer, double grad_clip) {
  if (per_layer && grad_clip > 0)
    return st_status_make(ST_CODE_CONFIG,
                          "sched.optimizer=per_layer updates each layer before the global gradient norm is known, so it "
                          "cannot clip (train.grad_clip is %g); set train.grad_clip=0 or sched.optimizer=after_backward",
                          grad_clip);
  return ST_OK;
}

st_status st_config_nan_at_parse(const char* spec, int64_t* out_step, int* out_layer, char* out_tensor, size_t tensor_size) {
  if (out_step) *out_step = 0;
  if (out_layer) *out_layer = 0;
  if (out_tensor && tensor_size) out_tensor[0] = '\0';
  if (!spec || !spec[0]) return ST_OK;
#define ST__NAN_HELP "expected STEP:LAYER or STEP:LAYER:TENSOR, e.g. 7:2 or 7:2:y (STEP from 1, LAYER from 0)"
  const char* p = spec;
  char* end = NULL;
  errno = 0;
  long long step = isdigit((unsigned char)*p) ? strtoll(p, &end, 10) : -1;
  if (step < 1 || errno || !end || *end != ':')
    return st_status_make(ST_CODE_CONFIG, "faults.nan_at '%s': STEP must be a whole number >= 1; " ST__NAN_HELP, spec);
  p = end + 1;
  errno = 0;
  long layer = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1;
  if (layer < 0 || layer > 1000000 || errno || !end || (*end && *end != ':'))
    return st_status_make(ST_CODE_CONFIG, "faults.nan_at '%s': LAYER must be a whole number >= 0; " ST__NAN_HELP, spec);
  const char* tensor = *end == ':' ? end + 1 : "";
  if (*end == ':' && !*tensor)
    return st_status_make(ST_CODE_CONFIG, "faults.nan_at '%s': empty TENSOR after the second ':'; " ST__NAN_HELP, spec);
  for (const char* q = tensor; *q; ++q)
    if (!isalnum((unsigned char)*q) && *q != '_' && *q != '.')
      return st_status_make(ST_CODE_CONFIG, "faults.nan_at '%s': TENSOR is an output name (letters, digits, '_', '.'); " ST__NAN_HELP,
                            spec);
  if (strlen(tensor) >= 64)
    return st_status_make(ST_CODE_CONFIG, "faults.nan_at '%s': TENSOR is longer than 63 characters", spec);
#undef ST__NAN_HELP
  if (out_step) *out_step = step;
  if (out_layer) *out_layer = (int)layer;
  if (out_tensor && tensor_size) snprintf(out_tensor, tensor_size, "%s", tensor);
  return ST_OK;
}

st_status st_config_dump_parse(const char* spec, int64_t* out_step, int* out_lo, int* out_hi) {
  *out_step = 0;
  *out_lo = *out_hi = -1;
  if (!spec || !spec[0]) return ST_OK;
#define ST__DUMP_HELP "expected step:N or step:N,layers:A-B, e.g. step:1 or step:3,layers:0-1 (N from 1, layers from 0)"
  char* end = NULL;
  errno = 0;
  long long step = strncmp(spec, "step:", 5) || !isdigit((unsigned char)spec[5]) ? -1 : strtoll(spec + 5, &end, 10);
  if (step < 1 || errno || !end || (*end && *end != ','))
    return st_status_make(ST_CODE_CONFIG, "diag.dump '%s': " ST__DUMP_HELP, spec);
  if (*end == ',') {
    const char* p = end + 1;
    errno = 0;
    long lo = strncmp(p, "layers:", 7) || !isdigit((unsigned char)p[7]) ? -1 : strtol(p + 7, &end, 10);
    long hi = -1;
    if (lo >= 0 && !errno && end && *end == '-' && isdigit((unsigned char)end[1])) hi = strtol(end + 1, &end, 10);
    if (lo < 0 || hi < lo || hi > 1000000 || errno || !end || *end)
      return st_status_make(ST_CODE_CONFIG, "diag.dump '%s': the layer range must be layers:A-B with 0 <= A <= B; " ST__DUMP_HELP,
                            spec);
    *out_lo = (int)lo;
    *out_hi = (int)hi;
  }
#undef ST__DUMP_HELP
  *out_step = step;
  return ST_OK;
}

st_status st_config_check_skip_per_layer(bool skip, bool per_layer) {
  if (skip && per_layer)
    return st_status_make(ST_CODE_CONFIG,
                          "diag.on_nonfinite=skip drops a step's update once the gradient norm is known, but "
                          "sched.optimizer=per_layer has updated every layer by then; use diag.on_nonfinite=rollback or "
                          "stop, or sched.optimizer=after_backward");
  return ST_OK;
}
