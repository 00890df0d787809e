/* fit.c — will it fit (issue 18, docs/scheduling.md "Will it fit"): the
 * predicted peak device bytes of the step (live slots plus the running
 * program's XLA temporaries) and the host bytes strata itself holds,
 * against the device's memory, and the policies that would fit. The
 * candidates are plans of the same bundle (remat, offload), so their
 * programs are compiled once, through the executable cache. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/train.h"
#include "train/checkpoint_io.h"

/* Bytes of the training state (parameters, m, v), whole tensors. */
static int64_t st__state_bytes(const st_plan* p) {
  int64_t n = 0;
  for (int i = 0; i < p->slot_count; ++i) {
    const st_slot* s = &p->slots[i];
    if (!s->persistent || (s->category != ST_SLOT_PARAM && s->category != ST_SLOT_OPT)) continue;
    if (!s->host && s->twin >= 0) continue; /* an offloaded slot: its home counts */
    n += (int64_t)st_tensor_type_bytes(p->devices > 1 && s->layout == ST_LAYOUT_SHARDED ? &s->logical : &s->type);
  }
  return n;
}

static int64_t st__largest_state_tensor(const st_plan* p) {
  int64_t most = 0;
  for (int i = 0; i < p->slot_count; ++i) {
    const st_slot* s = &p->slots[i];
    if (!s->persistent || (s->category != ST_SLOT_PARAM && s->category != ST_SLOT_OPT)) continue;
    int64_t n = (int64_t)st_tensor_type_bytes(p->devices > 1 && s->layout == ST_LAYOUT_SHARDED ? &s->logical : &s->type);
    if (n > most) most = n;
  }
  return most;
}

/* Host bytes strata holds for |plan|: offload homes and checkpoint staging. */
static void st__host(const st_train_options* o, st_runtime* rt, const st_plan* p, st_fit_candidate* c) {
  c->host_homes = st_plan_host_bytes(p);
  int64_t state = st__state_bytes(p);
  c->ckpt_chunked = st_train_ckpt_streams(o, rt, state);
  c->ckpt_staging = c->ckpt_chunked ? st__largest_state_tensor(p) : state;
  c->host_bytes = c->host_homes + c->ckpt_staging;
}

static const struct {
  const char* remat; /* NULL: the config's */
  int offload;       /* -1: the config's */
  const char* text;
} st__candidates[] = {
    {"full", -1, "sched.remat=full"},
    {NULL, ST_OFFLOAD_OPTIMIZER, "sched.offload=optimizer"},
    {NULL, ST_OFFLOAD_OPTIMIZER | ST_OFFLOAD_PARAMS, "sched.offload=both"},
    {"full", ST_OFFLOAD_OPTIMIZER, "sched.remat=full sched.offload=optimizer"},
    {"full", ST_OFFLOAD_OPTIMIZER | ST_OFFLOAD_PARAMS, "sched.remat=full sched.offload=both"},
};
enum { ST__N_CANDIDATES = (int)(sizeof(st__candidates) / sizeof(st__candidates[0])) };

st_status st_train_fit(st_runtime* runtime, const st_bundle* bundle, const st_train_options* options,
                       const st_plan* step, bool candidates, st_fit_report* out) {
  memset(out, 0, sizeof(*out));
  int64_t plugin = st_runtime_device_memory(runtime, 0);
  if (plugin > 0) {
    out->limit = plugin;
    snprintf(out->limit_source, sizeof(out->limit_source), "the PJRT plugin (bytes_limit)");
  } else if (options->device_memory_config > 0) {
    out->limit = options->device_memory_config;
    snprintf(out->limit_source, sizeof(out->limit_source), "runtime.device_memory_bytes");
  }
  st_plan_temps_peak tp;
  st_plan_predict_with_temps(step, NULL, &tp);
  st_fit_candidate* me = &out->current;
  snprintf(me->policy, sizeof(me->policy), "%s", step->policy ? step->policy : "");
  me->peak = tp.peak;
  me->slots_peak = tp.slots_peak;
  me->temps = tp.temps;
  st__host(options, runtime, step, me);
  me->fits = out->limit <= 0 || me->peak <= out->limit;
  out->fits = me->fits;
  if (!candidates || out->limit <= 0 || me->fits || step->devices > 1) return ST_OK;

  /* Same bundle, other policies: every candidate's plans, then one compile
   * of the programs they use (the cache has most of them). */
  st_plan plans[ST__N_CANDIDATES], evals[ST__N_CANDIDATES];
  st_plan* ptrs[ST__N_CANDIDATES];
  int built = 0;
  st_status s = ST_OK;
  for (int k = 0; k < ST__N_CANDIDATES && !s; ++k) {
    st_train_options o = *options;
    if (st__candidates[k].remat) o.sched.remat = st__candidates[k].remat;
    if (st__candidates[k].offload >= 0) o.sched.offload = st__candidates[k].offload;
    st_plan_init(&plans[built]);
    st_plan_init(&evals[built]);
    s = st_train_build_plans(bundle, &o, &plans[built], &evals[built]);
    if (s) {
      st_plan_deinit(&plans[built]);
      st_plan_deinit(&evals[built]);
      break;
    }
    ptrs[built] = &plans[built];
    st_fit_candidate* c = &out->candidates[built];
    snprintf(c->policy, sizeof(c->policy), "%s", st__candidates[k].text);
    ++built;
  }
  if (!s) s = st_train_plan_temps(runtime, bundle, ptrs, built);
  for (int k = 0; k < built; ++k) {
    if (!s) {
      st_fit_candidate* c = &out->candidates[k];
      st_train_options o = *options;
      st_plan_predict_with_temps(&plans[k], NULL, &tp);
      c->peak = tp.peak;
      c->slots_peak = tp.slots_peak;
      c->temps = tp.temps;
      st__host(&o, runtime, &plans[k], c);
      c->fits = c->peak <= out->limit;
    }
    st_plan_deinit(&plans[k]);
    st_plan_deinit(&evals[k]);
  }
  if (!s) out->candidate_count = built;
  return s;
}

static json_t* st__cand_json(const st_fit_candidate* c) {
  json_t* j = st_json_obj();
  st_json_put_str(j, "policy", c->policy);
  st_json_put_int(j, "predicted_peak_bytes", c->peak);
  st_json_put_int(j, "predicted_slots_peak_bytes", c->slots_peak);
  st_json_put_int(j, "temps_at_peak_bytes", c->temps);
  st_json_put_int(j, "host_bytes", c->host_bytes);
  st_json_put_int(j, "host_homes_bytes", c->host_homes);
  st_json_put_int(j, "ckpt_staging_bytes", c->ckpt_staging);
  st_json_put_str(j, "ckpt_staging", c->ckpt_chunked ? "chunked" : "full");
  st_json_put_bool(j, "fits", c->fits);
  return j;
}

json_t* st_train_fit_json(const st_fit_report* r) {
  json_t* j = st__cand_json(&r->current);
  st_json_put(j, "device_memory_bytes", r->limit > 0 ? st_json_int(r->limit) : json_null());
  st_json_put_str(j, "device_memory_source", r->limit > 0 ? r->limit_source : "unknown");
  json_t* a = st_json_arr();
  for (int k = 0; k < r->candidate_count; ++k) st_json_push(a, st__cand_json(&r->candidates[k]));
  st_json_put(j, "alternatives", a);
  return j;
}

void st_train_fit_print(const st_fit_report* r, FILE* out) {
  const st_fit_candidate* c = &r->current;
  fprintf(out, "# fit: predicted peak device bytes %" PRId64 " (live slots %" PRId64 " + XLA temporaries %" PRId64
               " at the peak); host bytes %" PRId64 " (offload homes %" PRId64 ", checkpoint staging %" PRId64 ", %s)\n",
          c->peak, c->peak - c->temps, c->temps, c->host_bytes, c->host_homes, c->ckpt_staging,
          c->ckpt_chunked ? "chunked" : "full");
  if (r->limit <= 0)
    fprintf(out, "# fit: device memory unknown (the plugin reports none): give runtime.device_memory_bytes to check\n");
  else
    fprintf(out, "# fit: %s: %" PRId64 " %s %" PRId64 " bytes of device memory (%s)\n", c->fits ? "fits" : "DOES NOT FIT",
            c->peak, c->fits ? "<=" : ">", r->limit, r->limit_source);
  for (int k = 0; k < r->candidate_count; ++k)
    fprintf(out, "# fit: with %-40s predicted peak %" PRId64 "%s\n", r->candidates[k].policy, r->candidates[k].peak,
            r->candidates[k].fits ? "  fits" : "  does not fit");
}

st_status st_train_fit_status(const st_fit_report* r, const st_train_options* options) {
  if (r->fits || r->limit <= 0) return ST_OK;
  st_strbuf b = {0};
  int fitting = 0;
  for (int k = 0; k < r->candidate_count; ++k) {
    if (!r->candidates[k].fits) continue;
    st_strbuf_printf(&b, "%s%s (predicted peak %" PRId64 " B)", fitting++ ? "; " : "", r->candidates[k].policy,
                     r->candidates[k].peak);
  }
  st_status s = st_status_make(
      ST_CODE_RUNTIME,
      "the step is predicted not to fit: predicted peak %" PRId64 " B (live buffers + XLA's temporaries) > device memory "
      "%" PRId64 " B (%s). %s%s. Or set sched.allow_overcommit=true to train anyway",
      r->current.peak, r->limit, r->limit_source, fitting ? "Policies that fit: " : "No single-device policy tried fits "
      "(sched.remat=full, sched.offload=optimizer/both); try more train.microbatches or a mesh",
      fitting ? b.data : "");
  (void)options;
  st_strbuf_free(&b);
  return s;
}
