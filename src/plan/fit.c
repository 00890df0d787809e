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
#include <jansson.h>

#include "strata/base.h"
#include "strata/plan.h"

/* Bytes of the training state (parameters, optimizer state), whole tensors. */
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
static void st__fit_host(const st_plan_options* o, st_runtime* rt, const st_plan* p, st_plan_fit_candidate* c) {
  c->host_homes = st_plan_host_bytes(p);
  int64_t state = st__state_bytes(p);
  c->ckpt_chunked = st_plan_ckpt_streams(o, rt, state);
  c->ckpt_staging = c->ckpt_chunked ? st__largest_state_tensor(p) : state;
  c->host_bytes = c->host_homes + c->ckpt_staging;
}

static const struct {
  bool remat;        /* true: sched.remat=full; false: the config's */
  int offload;       /* -1: the config's */
  const char* text;
} st__candidates[] = {
    {true, -1, "sched.remat=full"},
    {false, ST_OFFLOAD_OPTIMIZER, "sched.offload=optimizer"},
    {false, ST_OFFLOAD_OPTIMIZER | ST_OFFLOAD_PARAMS, "sched.offload=both"},
    {true, ST_OFFLOAD_OPTIMIZER, "sched.remat=full sched.offload=optimizer"},
    {true, ST_OFFLOAD_OPTIMIZER | ST_OFFLOAD_PARAMS, "sched.remat=full sched.offload=both"},
};
enum { ST__N_CANDIDATES = (int)(sizeof(st__candidates) / sizeof(st__candidates[0])) };

int64_t st_plan_host_kept_free(const st_host_memory* host) {
  const int64_t gib = (int64_t)1 << 30;
  int64_t keep = host->total_bytes / 10 > gib ? host->total_bytes / 10 : gib;
  int64_t half = host->available_bytes / 2;
  return keep < half ? keep : half;
}

/* What |c| asks of the limit: per device, or on the host everything the
 * run holds there (every device's buffers are host memory there too). */
static void st__need(const st_plan_fit_report* r, st_plan_fit_candidate* c) {
  c->need = r->host ? c->peak * (r->devices > 0 ? r->devices : 1) + c->host_bytes : c->peak;
  c->fits = r->limit <= 0 || c->need <= r->limit;
}

static double st__gib(int64_t b) { return (double)b / (double)((int64_t)1 << 30); }

st_status st_plan_fit(st_runtime* runtime, const st_bundle* bundle, const st_plan_options* options,
                       const st_plan* step, bool candidates, st_plan_fit_report* out) {
  memset(out, 0, sizeof(*out));
  out->devices = step->devices > 0 ? step->devices : 1;
  int64_t plugin = st_runtime_device_memory(runtime, 0);
  if (plugin > 0) {
    out->limit = plugin;
    snprintf(out->limit_source, sizeof(out->limit_source), "the PJRT plugin (bytes_limit)");
  } else if (options->device_memory_config > 0) {
    out->limit = options->device_memory_config;
    snprintf(out->limit_source, sizeof(out->limit_source), "runtime.device_memory_bytes");
  } else if (st_runtime_device_memory_is_host(runtime)) {
    /* The CPU plugin's devices are this host's memory: unknown would let a
     * run far too large take the host down (the kernel's OOM killer picks
     * any process, not only this one). Read now, after the plugin started
     * and the programs compiled, so what they took is not counted twice. */
    st_host_memory_read(&out->host_memory);
    if (out->host_memory.known && out->host_memory.available_bytes > 0) {
      out->host = true;
      out->kept_free = st_plan_host_kept_free(&out->host_memory);
      out->limit = out->host_memory.available_bytes - out->kept_free;
      snprintf(out->limit_source, sizeof(out->limit_source),
               "the host's available memory: %s%.2f GiB less %.2f GiB kept free", out->host_memory.cgroup_limited
                   ? "cgroup-limited, " : "MemAvailable ",
               st__gib(out->host_memory.available_bytes), st__gib(out->kept_free));
    }
  }
  st_plan_temps_peak tp;
  st_plan_predict_with_temps(step, NULL, &tp);
  st_plan_fit_candidate* me = &out->current;
  snprintf(me->policy, sizeof(me->policy), "%s", step->policy ? step->policy : "");
  me->peak = tp.peak;
  me->slots_peak = tp.slots_peak;
  me->temps = tp.temps;
  st__fit_host(options, runtime, step, me);
  st__need(out, me);
  out->fits = me->fits;
  if (!candidates || out->limit <= 0 || me->fits || step->devices > 1) return ST_OK;

  /* Same bundle, other policies: every candidate's plans, then one compile
   * of the programs they use (the cache has most of them). */
  st_plan plans[ST__N_CANDIDATES], evals[ST__N_CANDIDATES];
  st_plan* ptrs[ST__N_CANDIDATES];
  int built = 0;
  st_status s = ST_OK;
  for (int k = 0; k < ST__N_CANDIDATES && !s; ++k) {
    st_plan_options o = *options;
    if (st__candidates[k].remat) o.sched.remat = (st_config_remat){.kind = ST_CONFIG_REMAT_FULL, .text = "full"};
    if (st__candidates[k].offload >= 0) o.sched.offload = st__candidates[k].offload;
    st_plan_init(&plans[built]);
    st_plan_init(&evals[built]);
    s = st_plan_build(bundle, &o, &plans[built], &evals[built], NULL);
    if (s) {
      st_plan_deinit(&plans[built]);
      st_plan_deinit(&evals[built]);
      break;
    }
    ptrs[built] = &plans[built];
    st_plan_fit_candidate* c = &out->candidates[built];
    snprintf(c->policy, sizeof(c->policy), "%s", st__candidates[k].text);
    ++built;
  }
  if (!s) s = st_plan_compile_temps(runtime, bundle, ptrs, built);
  for (int k = 0; k < built; ++k) {
    if (!s) {
      st_plan_fit_candidate* c = &out->candidates[k];
      st_plan_options o = *options;
      st_plan_predict_with_temps(&plans[k], NULL, &tp);
      c->peak = tp.peak;
      c->slots_peak = tp.slots_peak;
      c->temps = tp.temps;
      st__fit_host(&o, runtime, &plans[k], c);
      st__need(out, c);
    }
    st_plan_deinit(&plans[k]);
    st_plan_deinit(&evals[k]);
  }
  if (!s) out->candidate_count = built;
  return s;
}

static json_t* st__cand_json(const st_plan_fit_candidate* c) {
  json_t* j = st_json_obj();
  st_json_put_str(j, "policy", c->policy);
  st_json_put_int(j, "predicted_peak_bytes", c->peak);
  st_json_put_int(j, "predicted_slots_peak_bytes", c->slots_peak);
  st_json_put_int(j, "temps_at_peak_bytes", c->temps);
  st_json_put_int(j, "host_bytes", c->host_bytes);
  st_json_put_int(j, "host_homes_bytes", c->host_homes);
  st_json_put_int(j, "ckpt_staging_bytes", c->ckpt_staging);
  st_json_put_str(j, "ckpt_staging", c->ckpt_chunked ? "chunked" : "full");
  st_json_put_int(j, "need_bytes", c->need);
  st_json_put_bool(j, "fits", c->fits);
  return j;
}

json_t* st_plan_fit_json(const st_plan_fit_report* r) {
  json_t* j = st__cand_json(&r->current);
  st_json_put(j, "device_memory_bytes", r->limit > 0 ? st_json_int(r->limit) : json_null());
  st_json_put_str(j, "device_memory_source", r->limit > 0 ? r->limit_source : "unknown");
  /* "host": the limit is what this run may take of the host (need_bytes:
   * every device's peak plus host_bytes), else per device (need_bytes: the peak). */
  st_json_put_str(j, "limit_scope", r->host ? "host" : "device");
  if (r->host) {
    json_t* h = st_json_obj();
    st_json_put_int(h, "total_bytes", r->host_memory.total_bytes);
    st_json_put_int(h, "available_bytes", r->host_memory.available_bytes);
    st_json_put_int(h, "meminfo_available_bytes", r->host_memory.meminfo_available_bytes);
    st_json_put_bool(h, "cgroup_limited", r->host_memory.cgroup_limited);
    st_json_put_int(h, "kept_free_bytes", r->kept_free);
    st_json_put_int(h, "devices", r->devices);
    st_json_put(j, "host_memory", h);
  }
  json_t* a = st_json_arr();
  for (int k = 0; k < r->candidate_count; ++k) st_json_push(a, st__cand_json(&r->candidates[k]));
  st_json_put(j, "alternatives", a);
  return j;
}

void st_plan_fit_print(const st_plan_fit_report* r, FILE* out) {
  const st_plan_fit_candidate* c = &r->current;
  fprintf(out, "# fit: predicted peak device bytes %" PRId64 " (live slots %" PRId64 " + XLA temporaries %" PRId64
               " at the peak); host bytes %" PRId64 " (offload homes %" PRId64 ", checkpoint staging %" PRId64 ", %s)\n",
          c->peak, c->peak - c->temps, c->temps, c->host_bytes, c->host_homes, c->ckpt_staging,
          c->ckpt_chunked ? "chunked" : "full");
  if (r->limit <= 0)
    fprintf(out, "# fit: device memory unknown (the plugin reports none): give runtime.device_memory_bytes to check\n");
  else if (r->host)
    fprintf(out, "# fit: %s: %" PRId64 " (%d x %" PRId64 " device + %" PRId64 " host) %s %" PRId64
                 " bytes of host memory (%s; the CPU plugin's devices are host memory)\n",
            c->fits ? "fits" : "DOES NOT FIT", c->need, r->devices, c->peak, c->host_bytes, c->fits ? "<=" : ">", r->limit,
            r->limit_source);
  else
    fprintf(out, "# fit: %s: %" PRId64 " %s %" PRId64 " bytes of device memory (%s)\n", c->fits ? "fits" : "DOES NOT FIT",
            c->peak, c->fits ? "<=" : ">", r->limit, r->limit_source);
  for (int k = 0; k < r->candidate_count; ++k) {
    fprintf(out, "# fit: with %-40s predicted peak %" PRId64, r->candidates[k].policy, r->candidates[k].peak);
    if (r->host) fprintf(out, " (host %" PRId64 ")", r->candidates[k].need);
    fprintf(out, "%s\n", r->candidates[k].fits ? "  fits" : "  does not fit");
  }
}

st_status st_plan_fit_status(const st_plan_fit_report* r, const st_plan_options* options) {
  if (r->fits || r->limit <= 0) return ST_OK;
  st_strbuf b = {0};
  int fitting = 0;
  for (int k = 0; k < r->candidate_count; ++k) {
    if (!r->candidates[k].fits) continue;
    st_strbuf_printf(&b, "%s%s (predicted %s %" PRId64 " B)", fitting++ ? "; " : "", r->candidates[k].policy,
                     r->host ? "host bytes" : "peak", r->candidates[k].need);
  }
  const char* advice = fitting ? "Policies that fit: " : "No single-device policy tried fits "
                                 "(sched.remat=full, sched.offload=optimizer/both); try more train.microbatches or a mesh";
  st_status s;
  if (r->host)
    s = st_status_make(
        ST_CODE_MEMORY,
        "the step is predicted not to fit in this host's memory: predicted %" PRId64 " B (%d device%s x peak %" PRId64
        " B of live buffers + XLA's temporaries, + %" PRId64 " B strata holds on the host) > %" PRId64
        " B (%s; the CPU plugin's device memory is host memory). %s%s. Or give runtime.device_memory_bytes to set the "
        "limit yourself, or set sched.allow_overcommit=true to train anyway",
        r->current.need, r->devices, r->devices == 1 ? "" : "s", r->current.peak, r->current.host_bytes, r->limit,
        r->limit_source, advice, fitting ? b.data : "");
  else
    s = st_status_make(
        ST_CODE_MEMORY,
        "the step is predicted not to fit: predicted peak %" PRId64 " B (live buffers + XLA's temporaries) > device memory "
        "%" PRId64 " B (%s). %s%s. Or set sched.allow_overcommit=true to train anyway",
        r->current.peak, r->limit, r->limit_source, advice, fitting ? b.data : "");
  (void)options;
  st_strbuf_free(&b);
  return s;
}

bool st_plan_ckpt_streams(const st_plan_options* o, st_runtime* runtime, int64_t state_bytes) {
  if (o->ckpt.staging != ST_CKPT_STAGING_AUTO) return o->ckpt.staging == ST_CKPT_STAGING_CHUNKED;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t ram = pages > 0 && page > 0 ? (int64_t)pages * (int64_t)page : 0;
  return st_runtime_device_memory_is_host(runtime) || (ram > 0 && state_bytes > ram / 4);
}
