/* cmd_doctor.c — `strata doctor`: is the environment usable? Loads the PJRT
 * plugin the way training would, prints what it found (plugin, platform,
 * API version, devices and memory spaces), then compiles a 512x512 f32
 * matmul through the runtime, checks its result, and prints the GFLOP/s of
 * timed runs.
 *
 * Arguments: runtime.plugin=PATH, runtime.cpu_devices=N (default 2),
 * runtime.deterministic=true|false. (Parsed here by hand until the config
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

#define ST__DOCTOR_N 512

/* C[512,512] = A[512,512] . B[512,512], StableHLO as JAX would write it. */
static const char kMatmulProgram[] =
    "module @strata_doctor_matmul {\n"
    "  func.func public @main(%a: tensor<512x512xf32>, %b: tensor<512x512xf32>) -> tensor<512x512xf32> {\n"
    "    %c = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT]\n"
    "        : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>\n"
    "    return %c : tensor<512x512xf32>\n"
    "  }\n"
    "}\n";

static void st__usage(FILE* out) {
  fprintf(out,
          "usage: strata doctor [runtime.plugin=PATH] [runtime.cpu_devices=N] [runtime.deterministic=true|false]\n");
}

static st_status st__parse_args(int argc, char** argv, st_runtime_options* o) {
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    const char* eq = strchr(a, '=');
    if (!eq) return st_status_make(ST_CODE_CONFIG, "doctor: argument '%s' is not key=value", a);
    size_t klen = (size_t)(eq - a);
    const char* v = eq + 1;
    if (klen == strlen("runtime.plugin") && !strncmp(a, "runtime.plugin", klen)) {
      o->plugin_path = v;
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
                            "runtime.deterministic)",
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

static int st__cmp_double(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

#define ST__DOCTOR_MAX_RUNS 200

/* Compiles the matmul, checks the result of a warm-up run, then times up to
 * 200 runs (or ~0.5 s) on device 0, each from launch to completion (no
 * host copies), and reports the median and best rates. */
static st_status st__matmul_bench(st_runtime* rt, double* out_median_gflops, double* out_best_gflops, int* out_runs) {
  st_program* prog = NULL;
  st_status s = st_program_compile(rt, "doctor_matmul", kMatmulProgram, sizeof(kMatmulProgram) - 1, NULL, &prog);
  if (s) return s;
  const int n = ST__DOCTOR_N;
  const size_t bytes = sizeof(float) * (size_t)n * (size_t)n;
  st_tensor_type t = {.dtype = ST_DTYPE_F32, .rank = 2, .dims = {n, n}};
  float* a = st_xmalloc(bytes);
  float* b = st_xmalloc(bytes);
  float* c = st_xmalloc(bytes);
  double* times = st_xmalloc(sizeof(double) * ST__DOCTOR_MAX_RUNS);
  st_buffer* in[2] = {NULL, NULL};
  {
    /* Exact in f32: every product is 1*0.5 and every partial sum a multiple
     * of 0.5, so each element must be exactly n/2. */
    for (int i = 0; i < n * n; ++i) {
      a[i] = 1.0f;
      b[i] = 0.5f;
    }
    s = st_buffer_from_host(rt, 0, &t, a, &in[0]);
  }
  if (!s) s = st_buffer_from_host(rt, 0, &t, b, &in[1]);
  if (!s) { /* warm-up and correctness */
    st_buffer* out = NULL;
    s = st_program_execute(prog, 0, in, 2, &out, 1, NULL);
    if (!s) s = st_buffer_to_host(out, c, bytes);
    st_buffer_destroy(out);
    for (int i = 0; !s && i < n * n; ++i)
      if (c[i] != 0.5f * (float)n)
        s = st_status_make(ST_CODE_RUNTIME, "doctor: matmul gave %g at element %d, expected %g", c[i], i, 0.5 * n);
  }
  int runs = 0;
  double total = 0;
  while (!s && runs < ST__DOCTOR_MAX_RUNS && total < 0.5) {
    st_buffer* out = NULL;
    st_event* done = NULL;
    double t0 = st_now();
    s = st_program_execute(prog, 0, in, 2, &out, 1, &done);
    if (!s) s = st_event_await(done);
    double dt = st_now() - t0;
    st_event_destroy(done);
    st_buffer_destroy(out);
    if (s) break;
    times[runs++] = dt;
    total += dt;
  }
  if (!s && runs > 0) {
    qsort(times, (size_t)runs, sizeof(double), st__cmp_double);
    double flops = 2.0 * n * (double)n * (double)n;
    *out_median_gflops = flops / times[runs / 2] / 1e9;
    *out_best_gflops = flops / times[0] / 1e9;
    *out_runs = runs;
  }
  st_buffer_destroy(in[0]);
  st_buffer_destroy(in[1]);
  st_program_destroy(prog);
  free(a);
  free(b);
  free(c);
  free(times);
  return s;
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
  st_status s = st__parse_args(argc, argv, &o);
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
  double median = 0, best = 0;
  int runs = 0;
  s = st__matmul_bench(rt, &median, &best, &runs);
  if (s) {
    printf("matmul:        FAILED\n");
    fflush(stdout);
    st_runtime_destroy(rt);
    return st_cli_report(st_status_annotate(s, "doctor: matmul check"));
  }
  printf("matmul:        %dx%d f32 on device 0: %.1f GFLOP/s (median of %d runs; best %.1f)\n", ST__DOCTOR_N,
         ST__DOCTOR_N, median, runs, best);
  st_runtime_destroy(rt);
  printf("status:        ok\n");
  return 0;
}
