/* repro.c — `strata repro DIR`: one program of a non-finite bundle
 * (nonfinite.c writes it: docs/diagnostics.md, "Reading a NaN bundle")
 * replayed alone on its saved inputs, twice, on the runtime the run's
 * config names: does the recorded output come out non-finite again
 * (a deterministic fault of the program or the compiler), or not (a
 * transient one: the device, memory, a race)? Everything in DIR is read
 * as untrusted: the JSON's counts and shapes are bounded, the safetensors
 * reader checks the file, the StableHLO's sha256 must be the recorded one
 * and its @main must have the recorded signature. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/config.h"
#include "strata/kernels.h"
#include "strata/obs.h"
#include "strata/runtime.h"
#include "strata/train.h"
#include "train/train_internal.h"

#define ST__REPRO_MAX_IO 4096
#define ST__REPRO_MAX_BYTES ((int64_t)1 << 36)

/* Non-finite elements among |n| of |dtype| (f32, bf16; else 0). */
static int64_t st__repro_bad(st_dtype dtype, const void* data, int64_t n) {
  int64_t bad = 0;
  if (dtype == ST_DTYPE_F32)
    for (int64_t i = 0; i < n; ++i) bad += !isfinite(((const float*)data)[i]);
  if (dtype == ST_DTYPE_BF16)
    for (int64_t i = 0; i < n; ++i) bad += (((const uint16_t*)data)[i] & 0x7f80u) == 0x7f80u;
  return bad;
}

static st_status st__type_of(const json_t* o, const char* where, st_tensor_type* out) {
  const char* dt = NULL;
  const json_t* shape = NULL;
  ST_RETURN(st_json_get_string(o, "dtype", where, &dt));
  ST_RETURN(st_json_get_array(o, "shape", where, &shape));
  memset(out, 0, sizeof(*out));
  out->dtype = st_safetensors_dtype_parse(dt);
  if (out->dtype == ST_DTYPE_INVALID) return st_status_make(ST_CODE_CONFIG, "%s: unknown dtype '%s'", where, dt);
  size_t rank = json_array_size(shape);
  if (rank > ST_MAX_RANK) return st_status_make(ST_CODE_CONFIG, "%s: rank %zu is above %d", where, rank, ST_MAX_RANK);
  out->rank = (int)rank;
  int64_t elems = 1;
  for (size_t d = 0; d < rank; ++d) {
    const json_t* v = json_array_get(shape, d);
    int64_t x = json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
    if (x < 0 || x > ST__REPRO_MAX_BYTES || (x > 0 && elems > ST__REPRO_MAX_BYTES / x))
      return st_status_make(ST_CODE_CONFIG, "%s: shape dimension %zu is not a size strata replays", where, d);
    out->dims[d] = x;
    elems *= x;
  }
  return ST_OK;
}

void st_repro_result_deinit(st_repro_result* r) {
  if (!r) return;
  json_decref(r->identity);
  r->identity = NULL;
}

/* The tokenizer the replay's config names: a BPE run's tokenizer.json in
 * the bundle (written with it), else beside the run two levels up; NULL
 * when neither (not compared). Caller frees. */
static char* st__bundle_tokenizer(const char* dir) {
  char* p = st_path_join(dir, st_rundir_name(ST_RUNDIR_TOKENIZER));
  if (st_fs_exists(p)) return p;
  free(p);
  p = st_rundir_path_above(dir, ST_RUNDIR_TOKENIZER);
  if (st_fs_exists(p)) return p;
  free(p);
  return NULL;
}

/* What one replay holds between its phases; everything owned, freed by
 * st__replay_free whether or not a phase failed. */
typedef struct {
  char* meta_path;
  json_t* meta;
  const char *program, *output, *sha; /* borrowed from meta */
  int64_t k;                          /* the output recorded non-finite */
  const json_t *inputs, *outputs;     /* borrowed from meta */
  size_t n_in, n_out;
  char* mlir;
  char* in_path;
  st_safetensors* file;
  st_tensor_type* in_types;
  const void** in_data; /* into file */
  st_tensor_type* out_types;
  st_config* cfg;
  st_plan_options o;
  char* cfg_path;
  st_plan_opened opened;
  st_program* prog;
  int stats_checked; /* inputs whose recorded statistics the saved ones have; -1: none recorded */
} st__replay;

/* The saved inputs against nonfinite.json's input_stats (issue 30 item
 * 4b): recomputed from inputs.safetensors, they must be the recorded ones
 * (the same function of the same bytes), or the inputs were changed. A
 * bundle written before they were recorded has none: -1. */
static st_status st__replay_input_stats(st__replay* R, st_status s) {
  const json_t* rec = R->meta ? json_object_get(R->meta, "input_stats") : NULL;
  R->stats_checked = -1;
  if (s || !json_is_array(rec)) return s;
  if (json_array_size(rec) != R->n_in)
    return st_status_make(ST_CODE_CONFIG, "%s: input_stats has %zu entries for %zu inputs: not a bundle strata wrote",
                          R->meta_path, json_array_size(rec), R->n_in);
  R->stats_checked = 0;
  for (size_t j = 0; j < R->n_in; ++j) {
    const json_t* want = json_array_get(rec, j);
    json_t* got = st__tensor_stats_json(R->in_types[j].dtype, R->in_data[j], st_tensor_type_elements(&R->in_types[j]));
    /* read as untrusted: an entry without a name simply differs */
    json_t* nm = json_is_object(want) ? json_object_get(want, "name") : NULL;
    if (nm) st_json_put(got, "name", json_incref(nm));
    bool same = json_equal(got, (json_t*)want);
    if (!same) {
      char* g = st_json_dump(got, 0);
      char* w = st_json_dump(want, 0);
      s = st_status_make(ST_CODE_CONFIG, "%s: input %zu's statistics %s are not those nonfinite.json records (%s): the "
                         "saved inputs were changed", R->in_path, j, g, w);
      free(g);
      free(w);
    }
    json_decref(got);
    if (s) return s;
    R->stats_checked++;
  }
  return s;
}

/* nonfinite.json, read as untrusted: the program, the output, the counts
 * within bounds, not an SPMD program; what the result reports of it
 * (names, the drill's injected value). */
static st_status st__replay_meta(st__replay* R, const char* dir, st_repro_result* out) {
  R->meta_path = st_path_join(dir, "nonfinite.json");
  const char* meta_path = R->meta_path;
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(meta_path, &text, &size);
  if (s) s = st_status_recode(s, ST_CODE_CONFIG, "%s is not a non-finite bundle (strata train writes them under <run>/diag/)", dir);
  if (!s) s = st_json_parse(text, size, meta_path, &R->meta);
  if (s && st_status_code(s) != ST_CODE_CONFIG) s = st_status_recode(s, ST_CODE_CONFIG, "reading %s", meta_path);
  free(text);
  json_t* meta = R->meta;
  R->k = -1;
  if (!s) s = st_json_get_string(meta, "program", meta_path, &R->program);
  if (!s) s = st_json_get_string(meta, "output", meta_path, &R->output);
  if (!s) s = st_json_get_string(meta, "program_sha256", meta_path, &R->sha);
  if (!s) s = st_json_get_int(meta, "output_index", meta_path, &R->k);
  if (!s) s = st_json_get_array(meta, "inputs", meta_path, &R->inputs);
  if (!s) s = st_json_get_array(meta, "outputs", meta_path, &R->outputs);
  R->n_in = R->inputs ? json_array_size(R->inputs) : 0;
  R->n_out = R->outputs ? json_array_size(R->outputs) : 0;
  const size_t n_in = R->n_in, n_out = R->n_out;
  const int64_t k = R->k;
  if (!s && (n_in > ST__REPRO_MAX_IO || n_out > ST__REPRO_MAX_IO || n_out == 0 || k < 0 || (size_t)k >= n_out))
    s = st_status_make(ST_CODE_CONFIG, "%s: %zu inputs, %zu outputs, output_index %lld: not a bundle strata wrote", meta_path, n_in,
                       n_out, (long long)k);
  /* The locator saw device index 0 of an SPMD program: its shards alone
   * are not the program's inputs, and one device cannot run it. */
  const json_t* spmd = meta ? json_object_get(meta, "spmd_devices") : NULL;
  if (!s && json_is_integer(spmd))
    s = st_status_make(ST_CODE_CONFIG,
                       "%s: program %s is a tensor-parallel SPMD program over %lld devices, and inputs.safetensors holds "
                       "device index 0's shards only; strata repro replays one-device programs (docs/diagnostics.md)",
                       dir, R->program, (long long)json_integer_value(spmd));
  if (!s) {
    snprintf(out->program, sizeof(out->program), "%s", R->program);
    snprintf(out->output, sizeof(out->output), "%s", R->output);
    const json_t* inj = json_object_get(meta, "injected");
    out->injected = json_is_object(inj);
    const char* v = out->injected ? json_string_value(json_object_get(inj, "value")) : NULL;
    out->injected_value = v && !strcmp(v, "inf") ? 1 : v && !strcmp(v, "max") ? 2 : 0;
  }
  return s;
}

/* The program as recorded (its sha256), the saved inputs in the recorded
 * order and the outputs' types: the signature the program compiles to.
 * |s| is the status so far: the paths and arrays exist either way. */
static st_status st__replay_inputs(st__replay* R, const char* dir, st_status s) {
  /* The program, as recorded. */
  R->mlir = st_path_join(dir, "program.mlir");
  if (!s) {
    char got[65];
    s = st_sha256_file_hex(R->mlir, got);
    if (!s && strcmp(got, R->sha) != 0)
      s = st_status_make(ST_CODE_CONFIG, "%s: sha256 %s, but nonfinite.json records %s: the program was changed", R->mlir, got, R->sha);
  }
  /* The inputs, in the recorded order. */
  R->in_path = st_path_join(dir, "inputs.safetensors");
  if (!s) s = st_safetensors_read(R->in_path, &R->file);
  if (s && st_status_code(s) == ST_CODE_CKPT) s = st_status_recode(s, ST_CODE_CONFIG, "reading the saved inputs");
  R->in_types = st_xcalloc(R->n_in + 1, sizeof(st_tensor_type));
  R->in_data = st_xcalloc(R->n_in + 1, sizeof(void*));
  R->out_types = st_xcalloc(R->n_out + 1, sizeof(st_tensor_type));
  for (size_t j = 0; j < R->n_in && !s; ++j) {
    const json_t* nm = json_array_get(R->inputs, j);
    const st_safetensors_entry* e = json_is_string(nm) ? st_safetensors_find(R->file, json_string_value(nm)) : NULL;
    if (!e) {
      s = st_status_make(ST_CODE_CONFIG, "%s has no tensor for input %zu of %s", R->in_path, j, R->program);
      break;
    }
    R->in_types[j] = e->type;
    R->in_data[j] = R->file->data + e->offset;
  }
  for (size_t j = 0; j < R->n_out && !s; ++j) {
    char where[600];
    snprintf(where, sizeof(where), "%s: outputs[%zu]", R->meta_path, j);
    s = st__type_of(json_array_get(R->outputs, j), where, &R->out_types[j]);
  }
  return st__replay_input_stats(R, s);
}

/* The run's config (its runtime: plugin, devices, determinism settings),
 * checked against the identity nonfinite.json records. */
static st_status st__replay_config(st__replay* R, const char* dir, const st_repro_options* ro, st_repro_result* out, st_status s) {
  out->input_stats_checked = R->stats_checked;
  R->cfg_path = st_path_join(dir, st_rundir_name(ST_RUNDIR_CONFIG));
  if (!s) s = st_config_load(R->cfg_path, ro->n_overrides, ro->overrides, &R->cfg);
  if (!s) s = st_plan_options_from_config(R->cfg, &R->o);
  /* The program replayed is the recorded one whatever the config says: a
   * config of another model or tokenizer would be a false premise. */
  if (!s) {
    st_plan_record rec = {.label = "in nonfinite.json", .fallback_config = R->cfg_path};
    const json_t* m = json_object_get(R->meta, "model");
    const char* th = json_string_value(json_object_get(R->meta, "tokenizer_hash"));
    if (json_is_object(m)) rec.model = (json_t*)m;
    rec.tokenizer_hash = (char*)th;
    rec.source = R->meta_path;
    char* tj = strcmp(R->o.data.tokenizer, "bpe") || R->o.data.synthetic ? NULL : st__bundle_tokenizer(dir);
    char given[65] = "";
    s = st_plan_given_tokenizer(&R->o, tj, given);
    free(tj);
    if (!s) s = st_plan_check_identity(&rec, &R->o, given, ro->allow, st_plan_identity_fix, &out->identity);
  }
  return s;
}

/* The runtime the run used (with strata's kernels when the program calls
 * them) and the program compiled on it. */
static st_status st__replay_compile(st__replay* R, st_repro_result* out, st_status s) {
  /* A program of an ffi bundle calls strata's kernels: the opener
   * registers them before the client, as the run did (docs/kernels.md). */
  if (!s) {
    char* text = NULL;
    size_t len = 0;
    if (!st_fs_read_file(R->mlir, &text, &len) && text && strstr(text, "custom_call @strata_")) {
      R->opened.calls_kernels = true;
      out->calls_kernels = true;
    }
    free(text);
  }
  if (!s) s = st_plan_open_runtime(&R->o, NULL, &R->opened);
  if (!s) {
    st_program_signature sig = {(int)R->n_in, R->in_types, (int)R->n_out, R->out_types};
    s = st_program_compile_file(R->opened.runtime, R->mlir, &sig, &R->prog);
  }
  return s;
}

/* The replays: the program run twice on fresh copies of the inputs, the
 * recorded output counted for non-finite elements and compared between
 * runs (reproduces, repeatable). */
static st_status st__replay_runs(st__replay* R, st_repro_result* out, st_status s) {
  const size_t n_in = R->n_in, n_out = R->n_out;
  const int64_t k = R->k;
  st_runtime* rt = R->opened.runtime;
  st_tensor_type* out_types = R->out_types;
  st_buffer** ins = st_xcalloc(n_in + 1, sizeof(st_buffer*));
  st_buffer** outs = st_xcalloc(n_out + 1, sizeof(st_buffer*));
  size_t out_bytes = st_tensor_type_bytes(&out_types[k >= 0 && (size_t)k < n_out ? k : 0]);
  unsigned char* first = NULL;
  unsigned char* host = st_xmalloc(out_bytes ? out_bytes : 1);
  const int runs = 2;
  for (int r = 0; r < runs && !s; ++r) {
    /* Donated inputs are consumed: fresh buffers every run. */
    for (size_t j = 0; j < n_in && !s; ++j) s = st_buffer_from_host(rt, 0, &R->in_types[j], R->in_data[j], &ins[j]);
    if (!s) s = st_program_execute(R->prog, 0, ins, (int)n_in, outs, (int)n_out, NULL);
    if (!s) s = st_buffer_to_host(outs[k], host, out_bytes);
    for (size_t j = 0; j < n_in; ++j) {
      st_buffer_destroy(ins[j]);
      ins[j] = NULL;
    }
    for (size_t j = 0; j < n_out; ++j) {
      st_buffer_destroy(outs[j]);
      outs[j] = NULL;
    }
    if (s) break;
    if (out->injected) {
      /* The drill's value, put where faults.nan_at put it (element 0):
       * the program itself did not produce it. */
      const int what = out->injected_value;
      if (out_types[k].dtype == ST_DTYPE_F32) {
        float v = what == 1 ? INFINITY : what == 2 ? FLT_MAX : NAN;
        memcpy(host, &v, sizeof(v));
      } else if (out_bytes >= 2) {
        host[0] = what == 1 ? 0x80 : what == 2 ? 0x7f : 0xc0;
        host[1] = 0x7f;
      }
    }
    int64_t n = st_tensor_type_elements(&out_types[k]);
    int64_t bad = st__repro_bad(out_types[k].dtype, host, n);
    out->runs++;
    out->elements = n;
    if (bad > 0) out->runs_nonfinite++;
    if (bad > out->nonfinite) out->nonfinite = bad;
    if (!first) {
      first = st_xmalloc(out_bytes ? out_bytes : 1);
      memcpy(first, host, out_bytes);
      out->repeatable = true;
    } else if (memcmp(first, host, out_bytes) != 0) {
      out->repeatable = false;
    }
  }
  if (!s) out->reproduces = out->runs_nonfinite == out->runs;
  free(first);
  free(host);
  free(ins);
  free(outs);
  return s;
}

static int st__perf_cmp(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

/* --perf: the program launched 1 + |runs| times on fresh copies of the
 * inputs, every input ready before the clock starts, the first launch
 * untimed (first-touch of the output memory); the outputs awaited. The
 * recorded figure is the locator's (nonfinite.json launch_time), measured
 * the same way. */
static st_status st__replay_perf(st__replay* R, int runs, st_repro_result* out, st_status s) {
  const json_t* lt = R->meta ? json_object_get(R->meta, "launch_time") : NULL;
  const json_t* rec = json_is_object(lt) ? json_object_get(lt, "seconds") : NULL;
  out->perf_recorded_s = json_is_number(rec) && json_number_value(rec) > 0 ? json_number_value(rec) : -1;
  if (s || runs <= 0) return s;
  st_runtime* rt = R->opened.runtime;
  st_buffer** ins = st_xcalloc(R->n_in + 1, sizeof(st_buffer*));
  st_buffer** outs = st_xcalloc(R->n_out + 1, sizeof(st_buffer*));
  double* times = st_xcalloc((size_t)runs + 1, sizeof(double));
  int timed = 0;
  for (int r = 0; r <= runs && !s; ++r) {
    for (size_t j = 0; j < R->n_in && !s; ++j) {
      s = st_buffer_from_host(rt, 0, &R->in_types[j], R->in_data[j], &ins[j]);
      st_event* ev = NULL;
      if (!s) s = st_buffer_ready_event(ins[j], &ev);
      if (!s) s = st_event_await(ev);
      st_event_destroy(ev);
    }
    st_event* done = NULL;
    double t0 = st_now();
    if (!s) s = st_program_execute(R->prog, 0, ins, (int)R->n_in, outs, (int)R->n_out, &done);
    if (!s) s = st_event_await(done);
    double dt = st_now() - t0;
    st_event_destroy(done);
    for (size_t j = 0; j < R->n_in; ++j) {
      st_buffer_destroy(ins[j]);
      ins[j] = NULL;
    }
    for (size_t j = 0; j < R->n_out; ++j) {
      st_buffer_destroy(outs[j]);
      outs[j] = NULL;
    }
    if (!s && r > 0) times[timed++] = dt;
  }
  if (!s && timed > 0) {
    qsort(times, (size_t)timed, sizeof(double), st__perf_cmp);
    out->perf_runs = timed;
    out->perf_min_s = times[0];
    out->perf_max_s = times[timed - 1];
    out->perf_median_s = timed % 2 ? times[timed / 2] : 0.5 * (times[timed / 2 - 1] + times[timed / 2]);
    out->perf_p10_s = times[(int)(0.1 * (timed - 1) + 0.5)];
    out->perf_p90_s = times[(int)(0.9 * (timed - 1) + 0.5)];
  }
  free(times);
  free(ins);
  free(outs);
  return s;
}

static void st__replay_free(st__replay* R) {
  st_program_destroy(R->prog);
  st_plan_close(&R->opened);
  st_plan_options_deinit(&R->o); /* frees runtime.cache_dir too */
  st_config_destroy(R->cfg);
  free(R->cfg_path);
  free(R->in_types);
  free(R->in_data);
  free(R->out_types);
  st_safetensors_free(R->file);
  free(R->in_path);
  free(R->mlir);
  json_decref(R->meta);
  free(R->meta_path);
}

st_status st_train_repro(const char* dir, const st_repro_options* ro, st_repro_result* out) {
  memset(out, 0, sizeof(*out));
  st_repro_options none = {0};
  if (!ro) ro = &none;
  st__replay R;
  memset(&R, 0, sizeof(R));
  st_status s = st__replay_meta(&R, dir, out);
  s = st__replay_inputs(&R, dir, s);
  s = st__replay_config(&R, dir, ro, out, s);
  s = st__replay_compile(&R, out, s);
  s = st__replay_runs(&R, out, s);
  s = st__replay_perf(&R, ro->perf_runs, out, s);
  st__replay_free(&R);
  return s;
}
