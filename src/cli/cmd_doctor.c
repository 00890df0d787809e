/* cmd_doctor.c — `strata doctor`: is the environment usable? Loads the PJRT
 * plugin the way training would, prints what it found (plugin, platform,
 * API version, devices and memory spaces), then compiles a 512x512 f32
 * matmul through the runtime, checks its result, prints the GFLOP/s of
 * timed runs, then the same for a large elementwise add (memory bandwidth,
 * GB/s), and stores both in the cache for the end-of-run summary, MFU and
 * `strata analyze`'s roofline (st_runtime_matmul_peak_store).
 *
 * Arguments: runtime.plugin=PATH, runtime.cpu_devices=N (default 2),
 * runtime.deterministic=true|false, runtime.cache_dir=DIR. (Parsed here by hand until the config
 * module offers a k=v parser doctor can share.) Exit 0 when all is well,
 * 2 for bad arguments, 4 when the runtime fails. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "strata/base.h"
#include "strata/runtime.h"

static void st__usage(FILE* out) {
  fprintf(out,
          "usage: strata doctor [runtime.plugin=PATH] [runtime.cpu_devices=N] [runtime.deterministic=true|false] "
          "[runtime.cache_dir=DIR]\n");
}

static st_status st__parse_args(int argc, char** argv, st_runtime_options* o, const char** cache_dir) {
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    const char* eq = strchr(a, '=');
    if (!eq) return st_status_make(ST_CODE_CONFIG, "doctor: argument '%s' is not key=value", a);
    size_t klen = (size_t)(eq - a);
    const char* v = eq + 1;
    if (klen == strlen("runtime.plugin") && !strncmp(a, "runtime.plugin", klen)) {
      o->plugin_path = v;
    } else if (klen == strlen("runtime.cache_dir") && !strncmp(a, "runtime.cache_dir", klen)) {
      *cache_dir = v;
    } else if (klen == strlen("runtime.cpu_devices") && !strncmp(a, "runtime.cpu_devices", klen)) {
      char* end = NULL;
      errno = 0;
      long n = strtol(v, &end, 10);
      if (errno || !end || *end || n < 1 || n > 4096)
        return st_status_make(ST_CODE_CONFIG, "doctor: runtime.cpu_devices=%s is not an integer in 1..4096", v);
      o->cpu_devices = (int)n;
    } else if (klen == strlen("runtime.deterministic") && !strncmp(a, "runtime.deterministic", klen)) {
      if (strcmp(v, "true") && strcmp(v, "false"))
        return st_status_make(ST_CODE_CONFIG, "doctor: runtime.deterministic=%s is not true or false", v);
      o->deterministic = !strcmp(v, "true");
    } else {
      return st_status_make(ST_CODE_CONFIG,
                            "doctor: unknown key '%.*s' (doctor takes runtime.plugin, runtime.cpu_devices, "
                            "runtime.deterministic, runtime.cache_dir)",
                            (int)klen, a);
    }
  }
  return ST_OK;
}

static void st__print_runtime(st_runtime* rt) {
  st_runtime_info info;
  st_runtime_get_info(rt, &info);
  printf("plugin:        %s\n", info.plugin_path);
  printf("platform:      %s (version %s)\n", info.platform_name, info.platform_version);
  printf("xla version:   %s\n", info.xla_version[0] ? info.xla_version : "(not reported)");
  printf("PJRT C API:    %d.%d\n", info.api_major, info.api_minor);
  printf("compile:       %d program%s at once (runtime.compile_threads; 0 = one per two CPUs)\n",
         st_runtime_compile_threads(rt), st_runtime_compile_threads(rt) == 1 ? "" : "s");
  printf("devices:       %d\n", info.device_count);
  for (int d = 0; d < info.device_count; ++d) {
    st_device_info di;
    st_status s = st_runtime_device_info(rt, d, &di);
    if (s) {
      printf("  [%d] (unavailable: %s)\n", d, st_status_message(s));
      st_status_free(s);
      continue;
    }
    printf("  [%d] %s  kind=%s id=%d  memories:", d, di.description, di.kind, di.id);
    for (int m = 0; m < di.memory_count; ++m)
      printf(" %s%s", di.memory_kinds[m], m == di.default_memory ? " (default)" : "");
    printf("\n");
  }
}

int st_cli_doctor(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      st__usage(stdout);
      return 0;
    }
  }
  st_runtime_options o;
  st_runtime_options_init(&o);
  const char* cache_dir = NULL;
  st_status s = st__parse_args(argc, argv, &o, &cache_dir);
  if (s) {
    st__usage(stderr);
    return st_cli_report(s);
  }
  printf("strata doctor\n");
  st_runtime* rt = NULL;
  s = st_runtime_create(&o, &rt);
  if (s) {
    printf("runtime:       FAILED\n");
    fflush(stdout);
    return st_cli_report(st_status_annotate(s, "doctor"));
  }
  st__print_runtime(rt);
  fflush(stdout);
  st_matmul_peak peak;
  s = st_runtime_matmul_measure(rt, 0.5, &peak);
  if (s) {
    printf("matmul:        FAILED\n");
    fflush(stdout);
    st_runtime_destroy(rt);
    return st_cli_report(st_status_annotate(s, "doctor: matmul check"));
  }
  printf("matmul:        %dx%d f32 on device 0: %.1f GFLOP/s (median of %d runs; best %.1f)\n", peak.n, peak.n,
         peak.median_gflops, peak.runs, peak.best_gflops);
  s = st_runtime_bandwidth_measure(rt, 0.5, &peak);
  if (s) {
    printf("bandwidth:     FAILED\n");
    fflush(stdout);
    st_runtime_destroy(rt);
    return st_cli_report(st_status_annotate(s, "doctor: bandwidth check"));
  }
  printf("bandwidth:     %.0f MiB f32 add on device 0: %.1f GB/s (median of %d runs; best %.1f)\n",
         (double)peak.bw_bytes / 3 / 1048576.0, peak.median_gbps, peak.bw_runs, peak.best_gbps);
  /* Kept for the end-of-run summary's share of the peak; a cache, so a
   * failure to write it is said, not fatal. */
  snprintf(peak.by, sizeof(peak.by), "doctor");
  char* cache_root = st_cache_root(cache_dir);
  st_status ws = st_runtime_matmul_peak_store(rt, cache_root, &peak);
  if (ws) printf("matmul peak:   not stored (%s)\n", st_status_message(ws));
  st_status_free(ws);
  free(cache_root);
  st_runtime_destroy(rt);
  printf("status:        ok\n");
  return 0;
}
