/* matmul_peak.c — how fast this machine multiplies matrices, measured once
 * and kept: `strata doctor` prints it and stores it, the end-of-run summary
 * reads it back (or measures once and stores it) to say what share of it
 * the model's FLOP/s are (docs/performance.md); doctor also measures the
 * memory bandwidth, the roofline's other side (`strata analyze`, MFU). Keyed by the plugin and
 * the device kind: another plugin or accelerator is another machine. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/runtime.h"

#define ST__PEAK_N 512
#define ST__PEAK_MAX_RUNS 200
#define ST__PEAK_MAX_FILE 65536

/* C[512,512] = A[512,512] . B[512,512], StableHLO as JAX would write it. */
static const char kMatmulProgram[] =
    "module @strata_doctor_matmul {\n"
    "  func.func public @main(%a: tensor<512x512xf32>, %b: tensor<512x512xf32>) -> tensor<512x512xf32> {\n"
    "    %c = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT]\n"
    "        : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>\n"
    "    return %c : tensor<512x512xf32>\n"
    "  }\n"
    "}\n";

static int st__peak_cmp_double(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

/* Times up to ST__PEAK_MAX_RUNS runs of |prog| (two inputs, one output)
 * or about |max_seconds|, each from launch to completion; |times| sorted. */
static st_status st__time_runs(st_program* prog, st_buffer* const* in, double max_seconds, double* times, int* out_runs) {
  st_status s = ST_OK;
  int runs = 0;
  double total = 0;
  while (runs < ST__PEAK_MAX_RUNS && total < max_seconds) {
    st_buffer* o = NULL;
    st_event* done = NULL;
    double t0 = st_now();
    s = st_program_execute(prog, 0, in, 2, &o, 1, &done);
    if (!s) s = st_event_await(done);
    double dt = st_now() - t0;
    st_event_destroy(done);
    st_buffer_destroy(o);
    if (s) break;
    times[runs++] = dt;
    total += dt;
  }
  if (runs > 0) qsort(times, (size_t)runs, sizeof(double), st__peak_cmp_double);
  *out_runs = runs;
  return s;
}

st_status st_runtime_matmul_measure(st_runtime* rt, double max_seconds, st_matmul_peak* out) {
  memset(out, 0, sizeof(*out));
  st_program* prog = NULL;
  st_status s = st_program_compile(rt, "doctor_matmul", kMatmulProgram, sizeof(kMatmulProgram) - 1, NULL, &prog);
  if (s) return s;
  const int n = ST__PEAK_N;
  const size_t bytes = sizeof(float) * (size_t)n * (size_t)n;
  st_tensor_type t = {.dtype = ST_DTYPE_F32, .rank = 2, .dims = {n, n}};
  float* a = st_xmalloc(bytes);
  float* b = st_xmalloc(bytes);
  float* c = st_xmalloc(bytes);
  double* times = st_xmalloc(sizeof(double) * ST__PEAK_MAX_RUNS);
  st_buffer* in[2] = {NULL, NULL};
  /* Exact in f32: every product is 1*0.5 and every partial sum a multiple
   * of 0.5, so each element must be exactly n/2. */
  for (int i = 0; i < n * n; ++i) {
    a[i] = 1.0f;
    b[i] = 0.5f;
  }
  s = st_buffer_from_host(rt, 0, &t, a, &in[0]);
  if (!s) s = st_buffer_from_host(rt, 0, &t, b, &in[1]);
  if (!s) { /* warm-up and correctness */
    st_buffer* o = NULL;
    s = st_program_execute(prog, 0, in, 2, &o, 1, NULL);
    if (!s) s = st_buffer_to_host(o, c, bytes);
    st_buffer_destroy(o);
    for (int i = 0; !s && i < n * n; ++i)
      if (c[i] != 0.5f * (float)n)
        s = st_status_make(ST_CODE_RUNTIME, "matmul check: element %d is %g, expected %g", i, c[i], 0.5 * n);
  }
  int runs = 0;
  if (!s) s = st__time_runs(prog, in, max_seconds, times, &runs);
  if (!s && runs > 0) {
    double flops = 2.0 * n * (double)n * (double)n;
    out->n = n;
    out->runs = runs;
    out->median_gflops = flops / times[runs / 2] / 1e9;
    out->best_gflops = flops / times[0] / 1e9;
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


/* c[N] = a[N] + b[N], N = 8M f32: 96 MiB moved a run, far above any
 * cache, and one flop per 12 bytes, so the memory is the bound. */
#define ST__BW_N 8388608
static const char kAddProgram[] =
    "module @strata_doctor_bandwidth {\n"
    "  func.func public @main(%a: tensor<8388608xf32>, %b: tensor<8388608xf32>) -> tensor<8388608xf32> {\n"
    "    %c = stablehlo.add %a, %b : tensor<8388608xf32>\n"
    "    return %c : tensor<8388608xf32>\n"
    "  }\n"
    "}\n";

st_status st_runtime_bandwidth_measure(st_runtime* rt, double max_seconds, st_matmul_peak* out) {
  out->bw_bytes = 0;
  out->bw_runs = 0;
  out->median_gbps = out->best_gbps = 0;
  st_program* prog = NULL;
  st_status s = st_program_compile(rt, "doctor_bandwidth", kAddProgram, sizeof(kAddProgram) - 1, NULL, &prog);
  if (s) return s;
  const int64_t n = ST__BW_N;
  const size_t bytes = sizeof(float) * (size_t)n;
  st_tensor_type t = {.dtype = ST_DTYPE_F32, .rank = 1, .dims = {n}};
  float* a = st_xmalloc(bytes);
  float* b = st_xmalloc(bytes);
  float* c = st_xmalloc(bytes);
  double* times = st_xmalloc(sizeof(double) * ST__PEAK_MAX_RUNS);
  st_buffer* in[2] = {NULL, NULL};
  for (int64_t i = 0; i < n; ++i) {
    a[i] = (float)(i & 1023);
    b[i] = 0.5f;
  }
  s = st_buffer_from_host(rt, 0, &t, a, &in[0]);
  if (!s) s = st_buffer_from_host(rt, 0, &t, b, &in[1]);
  if (!s) { /* warm-up and correctness: every sum is exact in f32 */
    st_buffer* o = NULL;
    s = st_program_execute(prog, 0, in, 2, &o, 1, NULL);
    if (!s) s = st_buffer_to_host(o, c, bytes);
    st_buffer_destroy(o);
    for (int64_t i = 0; !s && i < n; ++i)
      if (c[i] != a[i] + 0.5f)
        s = st_status_make(ST_CODE_RUNTIME, "bandwidth check: element %lld is %g, expected %g", (long long)i, c[i],
                           (double)a[i] + 0.5);
  }
  int runs = 0;
  if (!s) s = st__time_runs(prog, in, max_seconds, times, &runs);
  if (!s && runs > 0) {
    double moved = 3.0 * (double)bytes;
    out->bw_bytes = (int64_t)moved;
    out->bw_runs = runs;
    out->median_gbps = moved / times[runs / 2] / 1e9;
    out->best_gbps = moved / times[0] / 1e9;
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

/* <cache_root>/matmul_peak/<xxh64 of plugin path and device 0's kind>.json,
 * and the two strings it was keyed by (borrowed from the runtime). */
static char* st__peak_path(const st_runtime* rt, const char* cache_root, const char** out_plugin, const char** out_kind) {
  st_runtime_info info;
  st_runtime_get_info(rt, &info);
  const char* kind = "";
  st_device_info d;
  st_status s = st_runtime_device_info(rt, 0, &d);
  if (!s) kind = d.kind;
  st_status_free(s);
  st_strbuf key = {0};
  st_strbuf_printf(&key, "%s\n%s", info.plugin_path ? info.plugin_path : "", kind);
  st_strbuf p = {0};
  st_strbuf_printf(&p, "%s/matmul_peak/%016llx.json", cache_root, (unsigned long long)st_hash64(key.data, key.len, 0));
  st_strbuf_free(&key);
  *out_plugin = info.plugin_path ? info.plugin_path : "";
  *out_kind = kind;
  return st_strbuf_take(&p);
}

bool st_runtime_matmul_peak_load(const st_runtime* rt, const char* cache_root, st_matmul_peak* out) {
  memset(out, 0, sizeof(*out));
  const char *plugin, *kind;
  char* path = st__peak_path(rt, cache_root, &plugin, &kind);
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &text, &size);
  free(path);
  if (s || size > ST__PEAK_MAX_FILE) {
    st_status_free(s);
    free(text);
    return false;
  }
  json_t* j = json_loadb(text, size, 0, NULL);
  free(text);
  const char* jp = json_string_value(json_object_get(j, "plugin"));
  const char* jk = json_string_value(json_object_get(j, "device_kind"));
  const char* by = json_string_value(json_object_get(j, "by"));
  double best = json_number_value(json_object_get(j, "best_gflops"));
  double median = json_number_value(json_object_get(j, "median_gflops"));
  int64_t n = 0, runs = 0;
  /* The key is a hash: the strings confirm it; a rate must be a rate. */
  bool ok = jp && jk && by && !strcmp(jp, plugin) && !strcmp(jk, kind) && isfinite(best) && best > 0 && best < 1e9 &&
            isfinite(median) && median > 0 && median <= best && st_json_as_int(json_object_get(j, "n"), &n) && n > 0 &&
            n <= 1 << 20 && st_json_as_int(json_object_get(j, "runs"), &runs) && runs > 0 && runs <= ST__PEAK_MAX_RUNS;
  if (ok) {
    out->n = (int)n;
    out->runs = (int)runs;
    out->best_gflops = best;
    out->median_gflops = median;
    snprintf(out->by, sizeof(out->by), "%s", by);
    /* The bandwidth is optional (files from before it, or a summary's
     * matmul-only measurement): kept only when plausible. */
    double bm = json_number_value(json_object_get(j, "median_gbps"));
    double bb = json_number_value(json_object_get(j, "best_gbps"));
    int64_t bytes = 0, bruns = 0;
    if (isfinite(bb) && bb > 0 && bb < 1e7 && isfinite(bm) && bm > 0 && bm <= bb &&
        st_json_as_int(json_object_get(j, "bandwidth_bytes"), &bytes) && bytes > 0 &&
        st_json_as_int(json_object_get(j, "bandwidth_runs"), &bruns) && bruns > 0 && bruns <= ST__PEAK_MAX_RUNS) {
      out->bw_bytes = bytes;
      out->bw_runs = (int)bruns;
      out->median_gbps = bm;
      out->best_gbps = bb;
    }
  }
  json_decref(j);
  return ok;
}

st_status st_runtime_matmul_peak_store(const st_runtime* rt, const char* cache_root, const st_matmul_peak* p) {
  const char *plugin, *kind;
  char* path = st__peak_path(rt, cache_root, &plugin, &kind);
  char* dir = st_path_join(cache_root, "matmul_peak");
  json_t* j = st_json_obj();
  st_json_put_str(j, "plugin", plugin);
  st_json_put_str(j, "device_kind", kind);
  st_json_put_int(j, "n", p->n);
  st_json_put_int(j, "runs", p->runs);
  st_json_put_num(j, "median_gflops", p->median_gflops);
  st_json_put_num(j, "best_gflops", p->best_gflops);
  st_json_put_str(j, "by", p->by);
  if (p->best_gbps > 0) {
    st_json_put_int(j, "bandwidth_bytes", p->bw_bytes);
    st_json_put_int(j, "bandwidth_runs", p->bw_runs);
    st_json_put_num(j, "median_gbps", p->median_gbps);
    st_json_put_num(j, "best_gbps", p->best_gbps);
  }
  st_status s = st_fs_mkdirs(dir);
  if (!s) s = st_json_write_file(path, j, 2);
  json_decref(j);
  free(dir);
  free(path);
  return s;
}
