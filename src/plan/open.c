/* open.c — the one way a command opens what a run needs: the bundle
 * (exported when missing or stale), its kernels checked against the
 * handlers strata registers, those handlers registered with the client
 * when its programs call them, the runtime, and the checks that need the
 * runtime (the kernel platform guessed before it existed, the mesh against
 * the plugin's devices). train, eval, sample, plan, analyze and repro
 * differ only in what they do after. The order matters: the FFI handlers
 * must be known before the client exists (the CPU plugin registers them at
 * client creation), and a kernel/handler mismatch must fail before any
 * compile (exit 4 naming kernel and versions, docs/kernels.md). */
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/kernels.h"
#include "strata/plan.h"

st_status st_plan_open_bundle(st_plan_options* o, const st_plan_open_options* how, st_plan_opened* out) {
  st_bundle_request req = {o->model_json, o->cache_root, o->bundle_dir, o->mesh, how ? how->stop : NULL,
                           how && how->progress ? o->long_progress.on : false,
                           o->span_axis == ST_PLAN_SPAN_FSDP ? o->procs : 0};
  ST_RETURN(st_bundle_ensure(&req, &out->bundle, &out->exported));
  ST_RETURN(st_kernels_check_bundle(out->bundle));
  out->calls_kernels = st_kernels_bundle_uses_ffi(out->bundle);
  return ST_OK;
}

/* The mesh the config asks for against the devices the plugin exposes:
 * the config checks it against runtime.cpu_devices, but a GPU plugin's
 * device count is only known once the client exists. */
static st_status st__open_check_mesh(const st_plan_options* o, const st_runtime* rt) {
  st_runtime_info ri;
  st_runtime_get_info(rt, &ri);
  int64_t want = (int64_t)o->parallel_data * o->parallel_fsdp * o->parallel_tensor;
  if (want <= ri.device_count) return ST_OK;
  return st_status_make(ST_CODE_CONFIG,
                        "parallel.data=%d x parallel.fsdp=%d x parallel.tensor=%d needs %lld devices; the plugin "
                        "exposes %d. Shrink the mesh",
                        o->parallel_data, o->parallel_fsdp, o->parallel_tensor, (long long)want, ri.device_count);
}

st_status st_plan_open_runtime(st_plan_options* o, const st_plan_open_options* how, st_plan_opened* out) {
  if (out->calls_kernels) o->runtime.ffi_targets = st_kernels_ffi_target_table(&o->runtime.ffi_target_count);
  /* runtime.cache_dir is ours to set (st_plan_options_deinit frees it); a
   * second open of the same options keeps the first. */
  if (!o->runtime.cache_dir) o->runtime.cache_dir = st_path_join(o->cache_root, "executables");
  st_mem_usage_read(&out->mem_before_runtime);
  ST_RETURN(st_runtime_create(&o->runtime, &out->runtime));
  st_mem_usage_read(&out->mem_after_runtime);
  ST_RETURN(st_plan_check_kernel_platform(o, out->runtime));
  if (how && how->check_mesh) ST_RETURN(st__open_check_mesh(o, out->runtime));
  return ST_OK;
}

st_status st_plan_open(st_plan_options* o, const st_plan_open_options* how, st_plan_opened* out) {
  memset(out, 0, sizeof(*out));
  ST_RETURN(st_plan_open_bundle(o, how, out));
  return st_plan_open_runtime(o, how, out);
}

void st_plan_close(st_plan_opened* opened) {
  if (!opened) return;
  st_runtime_destroy(opened->runtime);
  st_bundle_destroy(opened->bundle);
  memset(opened, 0, sizeof(*opened));
}
