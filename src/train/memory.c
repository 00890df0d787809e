/* memory.c — where the process's memory goes (issue 18, docs/performance.md
 * "Where the memory goes"): the `memory` events at the start of the run
 * and at its largest sampled RSS, by category. The categories are
 * estimates from the kernel's and malloc's counts plus what strata knows
 * it holds; what none of them explains is reported as "other", never
 * hidden. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/obs.h"
#include "train/checkpoint_io.h"
#include "train/train_internal.h"

static int64_t st__pos(int64_t v) { return v > 0 ? v : 0; }

static json_t* st__memory_json(st__trainer* t, const char* at, const st_mem_usage* now) {
  json_t* j = st_json_obj();
  st_json_put_str(j, "at", at);
  st_json_put_int(j, "rss_bytes", now->rss);
  st_json_put_int(j, "rss_anon_bytes", now->rss_anon);
  st_json_put_int(j, "rss_file_bytes", now->rss_file);
  int64_t device = 0, homes = 0;
  if (t->ex) {
    const st_executor_stats* es = st_executor_stats_get(t->ex);
    for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) device += es->live_bytes[k];
    device *= st_executor_devices(t->ex);
    homes = es->host_bytes;
  }
  /* A CPU plugin's device memory is this process's host memory; a GPU's is not. */
  bool host_device = st_runtime_device_memory_is_host(t->runtime);
  st_json_put_int(j, "device_buffers_bytes", device);
  st_json_put_bool(j, "device_memory_is_host", host_device);
  if (!host_device) device = 0;
  bool filled = false;
  int64_t staging = st_train_ckpt_staging_bytes(t->ckpt, &filled);
  int64_t code = 0;
  if (t->compiled && t->bundle)
    for (int i = 0; i < t->bundle->program_count; ++i) {
      st_program_memory m;
      st_program_memory_stats(t->compiled[i], &m);
      code += m.code_bytes;
    }
  json_t* c = st_json_obj();
  int64_t cat[7] = {
      t->mem_base.rss,                                   /* the process before the plugin */
      st__pos(t->mem_plugin.rss - t->mem_base.rss),      /* the PJRT plugin loaded, its client started */
      st__pos(t->mem_compiled.rss - t->mem_plugin.rss),  /* compiling or loading every program */
      device,                                            /* the executor's live buffers: on a CPU plugin host memory */
      homes,                                             /* sched.offload's host homes */
      filled ? staging : 0,                              /* the checkpoint snapshot, once written into */
      now->malloc_known ? now->free_held_bytes : 0,      /* freed, kept by malloc */
  };
  const char* names[7] = {"baseline", "plugin", "executables", "device_buffers", "host_homes", "ckpt_staging",
                          "malloc_free_held"};
  int64_t sum = 0;
  for (int k = 0; k < 7; ++k) {
    st_json_put_int(c, names[k], cat[k]);
    sum += cat[k];
  }
  st_json_put_int(c, "other", now->rss - sum); /* negative: the categories overlap (see docs) */
  st_json_put(j, "categories", c);
  st_json_put_int(j, "ckpt_staging_save_bytes", staging);
  st_json_put_int(j, "executable_code_bytes", code);
  if (now->malloc_known) {
    json_t* m = st_json_obj();
    st_json_put_int(m, "heap_bytes", now->heap_bytes);
    st_json_put_int(m, "mmap_bytes", now->mmap_bytes);
    st_json_put_int(m, "in_use_bytes", now->in_use_bytes);
    st_json_put_int(m, "free_held_bytes", now->free_held_bytes);
    st_json_put(j, "malloc", m);
  }
  st_json_put_bool(j, "malloc_tuning", st_runtime_malloc_tuned());
  return j;
}

void st__memory_sample(st__trainer* t, const char* at) {
  if (t->mem_peak && st_mem_rss() <= t->mem_peak_rss) return; /* the usual case: no mallinfo2 walk */
  st_mem_usage now;
  st_mem_usage_read(&now);
  if (t->mem_peak && now.rss <= t->mem_peak_rss) return;
  json_decref(t->mem_peak);
  t->mem_peak = st__memory_json(t, at, &now);
  t->mem_peak_rss = now.rss;
}

st_status st__memory_event(st__trainer* t, const char* phase) {
  st_mem_usage now;
  st_mem_usage_read(&now);
  json_t* e;
  if (!strcmp(phase, "peak") && t->mem_peak) {
    e = json_deep_copy(t->mem_peak);
  } else {
    e = st__memory_json(t, phase, &now);
  }
  st_json_put_str(e, "phase", phase);
  /* The kernel's peak RSS so far; it updates VmHWM lazily, so a sampled RSS may exceed it. */
  int64_t hwm = now.hwm > t->mem_peak_rss ? now.hwm : t->mem_peak_rss;
  st_json_put_int(e, "hwm_bytes", hwm);
  return st__event(t, "memory", e);
}
