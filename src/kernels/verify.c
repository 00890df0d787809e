/*
 * verify.c — `strata kernels verify`: every implementation against the
 * reference, through the same plugin and handlers a run uses (docs/kernels.md,
 * "Verification"). The comparison is done here, not in Python, because only
 * strata's runtime has the ffi handlers registered.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/kernels.h"
#include "strata/tensor.h"

#define ST__MAX_IO 8 /* attention's seg backward: q, k, v, segment_ids, do */

typedef struct st__case {
  const char *op, *impl, *dir, *file;
  const char* form; /* "" for the plain form, else an optional input's ("seg": attention with segment_ids) */
  char shape[64];
  int n_in, n_out;
  st_tensor_type in[ST__MAX_IO], out[ST__MAX_IO];
  const char* kinds[ST__MAX_IO];
  double rtol, atol;
  st_program* program;
} st__case;

static st_status st__dims(const json_t* arr, const char* where, st_tensor_type* t) {
  if (!json_is_array(arr) || json_array_size(arr) > ST_MAX_RANK)
    return st_status_make(ST_CODE_RUNTIME, "%s: a shape is not a list of at most %d dims", where, ST_MAX_RANK);
  t->dtype = ST_DTYPE_F32;
  t->rank = (int)json_array_size(arr);
  for (int i = 0; i < t->rank; ++i) {
    int64_t d = -1;
    if (!st_json_as_int(json_array_get(arr, (size_t)i), &d) || d < 1 || d > (1 << 24))
      return st_status_make(ST_CODE_RUNTIME, "%s: dim %d is not in 1..2^24", where, i);
    t->dims[i] = d;
  }
  if (st_tensor_type_elements(t) > (1 << 26))
    return st_status_make(ST_CODE_RUNTIME, "%s: a tensor of more than 2^26 elements", where);
  return ST_OK;
}

static st_status st__parse_case(const json_t* c, const char* where, st__case* k) {
  const json_t *ins = json_object_get(c, "inputs"), *outs = json_object_get(c, "outputs"),
               *kinds = json_object_get(c, "input_kinds");
  ST_RETURN(st_json_get_string(c, "op", where, &k->op));
  ST_RETURN(st_json_get_string(c, "impl", where, &k->impl));
  ST_RETURN(st_json_get_string(c, "dir", where, &k->dir));
  ST_RETURN(st_json_get_string(c, "file", where, &k->file));
  const json_t* form = json_object_get(c, "form"); /* absent: the plain form */
  if (form && !json_is_string(form)) return st_status_make(ST_CODE_RUNTIME, "%s: form is not a name", where);
  k->form = form ? json_string_value(form) : "";
  if (!json_is_array(ins) || !json_is_array(outs) || json_array_size(ins) > ST__MAX_IO ||
      json_array_size(outs) > ST__MAX_IO || json_array_size(kinds) != json_array_size(ins))
    return st_status_make(ST_CODE_RUNTIME, "%s: inputs/outputs/input_kinds are not lists of at most %d", where,
                          ST__MAX_IO);
  k->n_in = (int)json_array_size(ins);
  k->n_out = (int)json_array_size(outs);
  const json_t* dts = json_object_get(c, "input_dtypes"); /* absent: all f32 */
  if (dts && (!json_is_array(dts) || json_array_size(dts) != json_array_size(ins)))
    return st_status_make(ST_CODE_RUNTIME, "%s: input_dtypes is not a list as long as inputs", where);
  for (int i = 0; i < k->n_in; ++i) {
    ST_RETURN(st__dims(json_array_get(ins, (size_t)i), where, &k->in[i]));
    k->kinds[i] = json_string_value(json_array_get(kinds, (size_t)i)) ?: "";
    const char* dt = dts ? json_string_value(json_array_get(dts, (size_t)i)) : "f32";
    if (!dt || (strcmp(dt, "f32") && strcmp(dt, "s32")))
      return st_status_make(ST_CODE_RUNTIME, "%s: input %d has dtype '%s', verify knows f32 and s32", where, i,
                            dt ? dt : "?");
    k->in[i].dtype = st_dtype_parse(dt);
  }
  /* An s32 input holds ids into the first input's last dim (targets), or
   * segment ids along its last dim (segment_ids). */
  for (int i = 0; i < k->n_in; ++i)
    if (k->in[i].dtype == ST_DTYPE_S32 && strcmp(k->kinds[i], "segment_ids") && (i == 0 || k->in[0].rank < 1))
      return st_status_make(ST_CODE_RUNTIME, "%s: an s32 input needs a first input whose last dim it indexes", where);
  for (int i = 0; i < k->n_out; ++i) ST_RETURN(st__dims(json_array_get(outs, (size_t)i), where, &k->out[i]));
  const json_t *rt = json_object_get(c, "rtol"), *at = json_object_get(c, "atol");
  if (!json_is_number(rt) || !json_is_number(at))
    return st_status_make(ST_CODE_RUNTIME, "%s: rtol/atol are not numbers", where);
  k->rtol = json_number_value(rt);
  k->atol = json_number_value(at);
  st_tensor_type_format(&k->in[0], k->shape, sizeof(k->shape));
  if (k->form[0]) /* the label says which form: "f32[2,33,4,8] seg" */
    snprintf(k->shape + strlen(k->shape), sizeof(k->shape) - strlen(k->shape), " %s", k->form);
  return ST_OK;
}

/* Inputs: uniform in [-2, 2) from a fixed LCG, except a norm's gain, which
 * is near 1 (as trained gains are); seeded by the input's position so every
 * implementation of a case sees the same values. */
static void st__kverify_fill(float* v, int64_t n, uint64_t seed, const char* kind) {
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  bool gain = !strcmp(kind, "gain");
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    float u = (float)((s >> 40) & 0xFFFFFF) / 16777216.0f; /* [0, 1) */
    v[i] = gain ? 0.5f + u : 4.0f * u - 2.0f;
  }
}

/* Segment ids along the last dim of [rows, T] (per row its own layout, from
 * the same LCG): ids 0, 1, 2, ... in runs whose lengths mix single tokens
 * (a quarter of the segments), short runs and long ones that cross the C
 * kernel's 64-token tiles and pallas' 32, so every kind of tile (one
 * segment, several, none in common) occurs at the verify shapes. */
static void st__kverify_segments(int32_t* ids, int64_t n, int64_t T, uint64_t seed) {
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t r = 0; r * T < n; ++r) {
    int32_t id = 0;
    for (int64_t t = 0; t < T;) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      uint64_t u = (s >> 33) % 8;
      int64_t len = u < 2 ? 1 : u < 5 ? 1 + (int64_t)((s >> 20) % 8) : 1 + (int64_t)((s >> 20) % (uint64_t)T);
      for (int64_t e = 0; e < len && t < T; ++e, ++t) ids[r * T + t] = id;
      ++id;
    }
  }
}

/* Input |i| of |k| on the device: f32 by st__kverify_fill, s32 ids in [0, V) for
 * V the first input's last dim (cross_entropy's targets), or segment ids
 * (st__kverify_segments: attention's segment_ids). */
static st_status st__input(const st__case* k, st_runtime* rt, int i, st_buffer** out) {
  int64_t n = st_tensor_type_elements(&k->in[i]);
  float* v = st_xmalloc((size_t)(n ? n : 1) * sizeof(float));
  st__kverify_fill(v, n, (uint64_t)(i + 1), k->kinds[i]);
  void* host = v;
  int32_t* ids = NULL;
  if (k->in[i].dtype == ST_DTYPE_S32 && !strcmp(k->kinds[i], "segment_ids")) {
    ids = st_xmalloc((size_t)(n ? n : 1) * sizeof(int32_t));
    st__kverify_segments(ids, n, k->in[i].dims[k->in[i].rank - 1], (uint64_t)(i + 1));
    host = ids;
  } else if (k->in[i].dtype == ST_DTYPE_S32) {
    int64_t vocab = k->in[0].dims[k->in[0].rank - 1];
    ids = st_xmalloc((size_t)(n ? n : 1) * sizeof(int32_t));
    for (int64_t e = 0; e < n; ++e) {
      int64_t id = (int64_t)((v[e] + 2.0f) / 4.0f * (float)vocab); /* [-2, 2) back to [0, 1), times V */
      ids[e] = (int32_t)(id < 0 ? 0 : id >= vocab ? vocab - 1 : id);
    }
    host = ids;
  }
  st_status s = st_buffer_from_host(rt, 0, &k->in[i], host, out);
  free(ids);
  free(v);
  return s;
}

static int st__kverify_cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* The median wall time of one call (launch to the last output ready), over
 * |runs| runs after two warm-up runs; the inputs stay on the device. */
static st_status st__time(st__case* k, st_runtime* rt, int runs, double* out_s) {
  st_buffer* in[ST__MAX_IO] = {0};
  st_status s = ST_OK;
  for (int i = 0; i < k->n_in && !s; ++i) s = st__input(k, rt, i, &in[i]);
  double* t = st_xcalloc((size_t)runs + 2, sizeof(double));
  for (int r = 0; r < runs + 2 && !s; ++r) {
    st_buffer* out[ST__MAX_IO] = {0};
    st_event* done = NULL;
    double t0 = st_now();
    s = st_program_execute(k->program, 0, in, k->n_in, out, k->n_out, &done);
    if (!s) s = st_event_await(done);
    t[r] = st_now() - t0;
    st_event_destroy(done);
    for (int i = 0; i < k->n_out; ++i) st_buffer_destroy(out[i]);
  }
  if (!s) {
    qsort(t + 2, (size_t)runs, sizeof(double), st__kverify_cmp_double);
    *out_s = t[2 + runs / 2];
  }
  free(t);
  for (int i = 0; i < k->n_in; ++i) st_buffer_destroy(in[i]);
  return s;
}

/* Same inputs and outputs, every shape: the label (the first input's shape)
 * does not tell apart cases with per-input shapes (attention's k and v). */
static bool st__same_io(const st__case* a, const st__case* b) {
  if (a->n_in != b->n_in || a->n_out != b->n_out) return false;
  for (int i = 0; i < a->n_in + a->n_out; ++i) {
    const st_tensor_type *x = i < a->n_in ? &a->in[i] : &a->out[i - a->n_in],
                         *y = i < a->n_in ? &b->in[i] : &b->out[i - a->n_in];
    if (x->rank != y->rank) return false;
    for (int d = 0; d < x->rank; ++d)
      if (x->dims[d] != y->dims[d]) return false;
  }
  return true;
}

static st_status st__bench(st__case* ks, size_t n, st_runtime* rt, const st_kernels_verify_options* o) {
  int runs = o->bench_runs > 0 ? o->bench_runs : 20;
  double* secs = st_xcalloc(n + 1, sizeof(double));
  st_status s = ST_OK;
  /* pallas runs in interpret mode on CPU: a verification aid, not timed
   * (its loop copies whole buffers per grid step: minutes per call here). */
  for (size_t i = 0; i < n && !s; ++i)
    if (strcmp(ks[i].impl, "pallas")) s = st__time(&ks[i], rt, runs, &secs[i]);
  for (size_t i = 0; i < n && !s; ++i) {
    if (!strcmp(ks[i].impl, "pallas")) continue;
    double ref = 0;
    for (size_t j = 0; j < n; ++j)
      if (!strcmp(ks[j].impl, "xla") && !strcmp(ks[j].op, ks[i].op) && !strcmp(ks[j].dir, ks[i].dir) &&
          !strcmp(ks[j].shape, ks[i].shape) && !strcmp(ks[j].form, ks[i].form) && st__same_io(&ks[j], &ks[i]))
        ref = secs[j];
    if (o->out)
      fprintf(o->out, "%-8s %s %-18s %-7s %10.1f us  %5.2fx xla\n", ks[i].op, ks[i].dir, ks[i].shape, ks[i].impl,
              secs[i] * 1e6, ref > 0 ? secs[i] / ref : 0.0);
  }
  free(secs);
  return s;
}

static st_status st__kverify_run(st__case* k, st_runtime* rt, float** outs) {
  st_buffer* in[ST__MAX_IO] = {0};
  st_buffer* out[ST__MAX_IO] = {0};
  st_status s = ST_OK;
  for (int i = 0; i < k->n_in && !s; ++i) s = st__input(k, rt, i, &in[i]);
  if (!s) s = st_program_execute(k->program, 0, in, k->n_in, out, k->n_out, NULL);
  for (int i = 0; i < k->n_out && !s; ++i) {
    size_t bytes = st_tensor_type_bytes(&k->out[i]);
    outs[i] = st_xmalloc(bytes);
    s = st_buffer_to_host(out[i], outs[i], bytes);
  }
  for (int i = 0; i < ST__MAX_IO; ++i) {
    st_buffer_destroy(in[i]);
    st_buffer_destroy(out[i]);
  }
  return s;
}

static st_status st__export(const st_kernels_verify_options* o) {
  const char* args[7] = {o->workdir, NULL, NULL, NULL, NULL, NULL, NULL};
  int n = 1;
  if (o->op && o->op[0]) {
    args[n++] = "--op";
    args[n++] = o->op;
  }
  if (o->impl && o->impl[0]) {
    args[n++] = "--impl";
    args[n++] = o->impl;
  }
  if (o->bench) args[n++] = "--bench";
  char* log = st_path_join(o->workdir, "export.log");
  st_python_job job = {.what = "exporting the kernel verification programs",
                       .module = o->exporter_module ? o->exporter_module : "strata_jax.kernel_verify",
                       .args = args,
                       .log_path = log,
                       .code = ST_CODE_RUNTIME,
                       .code_on_exit2 = ST_CODE_CONFIG,
                       .jax_platforms = "cpu"};
  st_status s = st_fs_mkdirs(o->workdir);
  if (!s) s = st_python_run(&job);
  free(log);
  return s;
}

static st_status st__kverify_op(const st_kernels_verify_options* o, st_runtime* rt, st_kernels_verify_result* r) {
  ST_RETURN(st__export(o));
  char* index_path = st_path_join(o->workdir, "index.json");
  char* text = NULL;
  size_t size = 0;
  json_t* index = NULL;
  st_status s = st_fs_read_file(index_path, &text, &size);
  if (!s) s = st_json_parse(text, size, index_path, &index);
  free(text);
  const json_t* cases = json_object_get(index, "cases");
  if (!s && (!json_is_array(cases) || json_array_size(cases) > 4096))
    s = st_status_make(ST_CODE_RUNTIME, "%s: cases is not a list of at most 4096", index_path);
  size_t n = s ? 0 : json_array_size(cases);
  st__case* ks = st_xcalloc(n + 1, sizeof(st__case));
  st_program_compile_job* jobs = st_xcalloc(n + 1, sizeof(*jobs));
  char** paths = st_xcalloc(n + 1, sizeof(char*));
  size_t kept = 0; /* with options->impl: that implementation's cases and the xla references */
  for (size_t i = 0; i < n && !s; ++i) {
    char where[300];
    snprintf(where, sizeof(where), "%s: cases[%zu]", index_path, i);
    s = st__parse_case(json_array_get(cases, i), where, &ks[kept]);
    if (s) break;
    if (o->impl && o->impl[0] && strcmp(ks[kept].impl, "xla") && strcmp(ks[kept].impl, o->impl)) {
      memset(&ks[kept], 0, sizeof(ks[kept]));
      continue;
    }
    paths[kept] = st_path_join(o->workdir, ks[kept].file);
    jobs[kept].path = paths[kept];
    ++kept;
  }
  n = kept;
  /* Every program at once: an unregistered target fails here, naming the
   * program, before anything runs. */
  if (!s) s = st_program_compile_files(rt, jobs, (int)n);
  for (size_t i = 0; i < n && !s; ++i) ks[i].program = jobs[i].program;

  if (!s && o->bench) s = st__bench(ks, n, rt, o);
  double scale = o->tolerance_scale;
  for (size_t i = 0; i < n && !s && !o->bench; ++i) {
    st__case* k = &ks[i];
    if (!strcmp(k->impl, "xla")) continue;
    const st__case* ref = NULL;
    for (size_t j = 0; j < n; ++j)
      if (!strcmp(ks[j].impl, "xla") && !strcmp(ks[j].op, k->op) && !strcmp(ks[j].dir, k->dir) &&
          !strcmp(ks[j].shape, k->shape) && !strcmp(ks[j].form, k->form) && st__same_io(&ks[j], k))
        ref = &ks[j];
    if (!ref) {
      s = st_status_make(ST_CODE_RUNTIME, "kernel '%s' %s %s %s: no xla reference case", k->op, k->impl, k->dir,
                         k->shape);
      break;
    }
    float *got[ST__MAX_IO] = {0}, *want[ST__MAX_IO] = {0};
    s = st__kverify_run(k, rt, got);
    if (!s) s = st__kverify_run((st__case*)ref, rt, want);
    double worst = 0, worst_err = 0;
    int worst_out = 0;
    int64_t worst_at = 0;
    for (int t = 0; t < k->n_out && !s; ++t) {
      int64_t m = st_tensor_type_elements(&k->out[t]);
      for (int64_t e = 0; e < m; ++e) {
        double d = fabs((double)got[t][e] - (double)want[t][e]);
        double lim = scale * (k->atol + k->rtol * fabs((double)want[t][e]));
        double ratio = d == 0 ? 0 : (lim > 0 ? d / lim : INFINITY);
        if (isnan(d)) ratio = INFINITY;
        if (ratio > worst || (worst == 0 && d > worst_err)) {
          worst = ratio;
          worst_err = d;
          worst_out = t;
          worst_at = e;
        }
      }
    }
    if (!s) {
      r->cases++;
      if (!strcmp(k->impl, "ffi")) r->ffi_cases++;
      if (worst > r->worst_ratio) r->worst_ratio = worst;
      if (o->out)
        fprintf(o->out, "%-8s %-7s %s %-16s max |err| %.3g (%.3g of the tolerance)  %s\n", k->op, k->impl, k->dir,
                k->shape, worst_err, scale > 0 ? worst : worst_err > 0 ? INFINITY : 0, worst <= 1 ? "ok" : "FAIL");
      if (worst > 1)
        s = st_status_make(ST_CODE_RUNTIME,
                           "kernel '%s', implementation %s, %s, shape %s: largest error %.6g at output %d element "
                           "%lld (got %.9g, reference %.9g; tolerance rtol %g atol %g%s)",
                           k->op, k->impl, k->dir, k->shape, worst_err, worst_out, (long long)worst_at,
                           (double)got[worst_out][worst_at], (double)want[worst_out][worst_at], k->rtol * scale,
                           k->atol * scale, scale != 1 ? ", scaled" : "");
    }
    for (int t = 0; t < ST__MAX_IO; ++t) {
      free(got[t]);
      free(want[t]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    st_program_destroy(jobs[i].program);
    free(paths[i]);
  }
  free(paths);
  free(jobs);
  free(ks);
  json_decref(index);
  free(index_path);
  return s;
}

st_status st_kernels_verify(const st_kernels_verify_options* o, st_kernels_verify_result* r) {
  memset(r, 0, sizeof(*r));
  if (!o || !o->workdir || !o->workdir[0]) return st_status_make(ST_CODE_INTERNAL, "st_kernels_verify: no workdir");
  st_runtime* rt = o->runtime;
  st_status s = ST_OK;
  if (!rt) {
    st_runtime_options ro;
    st_runtime_options_init(&ro);
    ro.cpu_devices = 1;
    ro.ffi_targets = st_kernels_ffi_target_table(&ro.ffi_target_count);
    s = st_runtime_create(&ro, &rt);
  }
  if (!s) s = st__kverify_op(o, rt, r);
  if (!o->runtime) st_runtime_destroy(rt);
  if (!o->keep) st_status_free(st_fs_remove_tree(o->workdir));
  return s;
}
