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

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/config.h"
#include "strata/kernels.h"
#include "strata/obs.h"
#include "strata/runtime.h"
#include "strata/train.h"

#define ST__REPRO_MAX_IO 4096
#define ST__REPRO_MAX_BYTES ((int64_t)1 << 36)

/* Non-finite elements among |n| of |dtype| (f32, bf16; else 0). */
static int64_t st__bad(st_dtype dtype, const void* data, int64_t n) {
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

st_status st_train_repro(const char* dir, const st_repro_options* ro, st_repro_result* out) {
  memset(out, 0, sizeof(*out));
  st_repro_options none = {0};
  if (!ro) ro = &none;
  char* meta_path = st_path_join(dir, "nonfinite.json");
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(meta_path, &text, &size);
  if (s) s = st_status_recode(s, ST_CODE_CONFIG, "%s is not a non-finite bundle (strata train writes them under <run>/diag/)", dir);
  json_t* meta = NULL;
  if (!s) s = st_json_parse(text, size, meta_path, &meta);
  if (s && st_status_code(s) != ST_CODE_CONFIG) s = st_status_recode(s, ST_CODE_CONFIG, "reading %s", meta_path);
  free(text);
  const char *program = NULL, *output = NULL, *sha = NULL;
  int64_t k = -1;
  const json_t *inputs = NULL, *outputs = NULL;
  if (!s) s = st_json_get_string(meta, "program", meta_path, &program);
  if (!s) s = st_json_get_string(meta, "output", meta_path, &output);
  if (!s) s = st_json_get_string(meta, "program_sha256", meta_path, &sha);
  if (!s) s = st_json_get_int(meta, "output_index", meta_path, &k);
  if (!s) s = st_json_get_array(meta, "inputs", meta_path, &inputs);
  if (!s) s = st_json_get_array(meta, "outputs", meta_path, &outputs);
  size_t n_in = inputs ? json_array_size(inputs) : 0, n_out = outputs ? json_array_size(outputs) : 0;
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
                       dir, program, (long long)json_integer_value(spmd));
  if (!s) {
    snprintf(out->program, sizeof(out->program), "%s", program);
    snprintf(out->output, sizeof(out->output), "%s", output);
    const json_t* inj = json_object_get(meta, "injected");
    out->injected = json_is_object(inj);
    const char* v = out->injected ? json_string_value(json_object_get(inj, "value")) : NULL;
    out->injected_value = v && !strcmp(v, "inf") ? 1 : v && !strcmp(v, "max") ? 2 : 0;
  }
  /* The program, as recorded. */
  char* mlir = st_path_join(dir, "program.mlir");
  if (!s) {
    char got[65];
    s = st_sha256_file_hex(mlir, got);
    if (!s && strcmp(got, sha) != 0)
      s = st_status_make(ST_CODE_CONFIG, "%s: sha256 %s, but nonfinite.json records %s: the program was changed", mlir, got, sha);
  }
  /* The inputs, in the recorded order. */
  char* in_path = st_path_join(dir, "inputs.safetensors");
  st_safetensors* file = NULL;
  if (!s) s = st_safetensors_read(in_path, &file);
  if (s && st_status_code(s) == ST_CODE_CKPT) s = st_status_recode(s, ST_CODE_CONFIG, "reading the saved inputs");
  st_tensor_type* in_types = st_xcalloc(n_in + 1, sizeof(st_tensor_type));
  const void** in_data = st_xcalloc(n_in + 1, sizeof(void*));
  st_tensor_type* out_types = st_xcalloc(n_out + 1, sizeof(st_tensor_type));
  for (size_t j = 0; j < n_in && !s; ++j) {
    const json_t* nm = json_array_get(inputs, j);
    const st_safetensors_entry* e = json_is_string(nm) ? st_safetensors_find(file, json_string_value(nm)) : NULL;
    if (!e) {
      s = st_status_make(ST_CODE_CONFIG, "%s has no tensor for input %zu of %s", in_path, j, program);
      break;
    }
    in_types[j] = e->type;
    in_data[j] = file->data + e->offset;
  }
  for (size_t j = 0; j < n_out && !s; ++j) {
    char where[600];
    snprintf(where, sizeof(where), "%s: outputs[%zu]", meta_path, j);
    s = st__type_of(json_array_get(outputs, j), where, &out_types[j]);
  }
  /* The run's runtime: its plugin, devices and determinism settings. */
  st_config* cfg = NULL;
  st_plan_options o;
  memset(&o, 0, sizeof(o));
  char* cfg_path = st_path_join(dir, st_rundir_name(ST_RUNDIR_CONFIG));
  if (!s) s = st_config_load(cfg_path, ro->n_overrides, ro->overrides, &cfg);
  if (!s) s = st_plan_options_from_config(cfg, &o);
  /* The program replayed is the recorded one whatever the config says: a
   * config of another model or tokenizer would be a false premise. */
  if (!s) {
    st_plan_record rec = {.label = "in nonfinite.json", .fallback_config = cfg_path};
    const json_t* m = json_object_get(meta, "model");
    const char* th = json_string_value(json_object_get(meta, "tokenizer_hash"));
    if (json_is_object(m)) rec.model = (json_t*)m;
    rec.tokenizer_hash = (char*)th;
    rec.source = meta_path;
    char* tj = strcmp(o.data.tokenizer, "bpe") || o.data.synthetic ? NULL : st__bundle_tokenizer(dir);
    char given[65] = "";
    s = st_plan_given_tokenizer(&o, tj, given);
    free(tj);
    if (!s) s = st_plan_check_identity(&rec, &o, given, ro->allow, st_plan_identity_fix, &out->identity);
  }
  st_runtime* rt = NULL;
  st_plan_opened opened;
  memset(&opened, 0, sizeof(opened));
  /* A program of an ffi bundle calls strata's kernels: the opener
   * registers them before the client, as the run did (docs/kernels.md). */
  if (!s) {
    char* text = NULL;
    size_t len = 0;
    if (!st_fs_read_file(mlir, &text, &len) && text && strstr(text, "custom_call @strata_")) {
      opened.calls_kernels = true;
      out->calls_kernels = true;
    }
    free(text);
  }
  if (!s) s = st_plan_open_runtime(&o, NULL, &opened);
  rt = opened.runtime;
  st_program* prog = NULL;
  if (!s) {
    st_program_signature sig = {(int)n_in, in_types, (int)n_out, out_types};
    s = st_program_compile_file(rt, mlir, &sig, &prog);
  }
  st_buffer** ins = st_xcalloc(n_in + 1, sizeof(st_buffer*));
  st_buffer** outs = st_xcalloc(n_out + 1, sizeof(st_buffer*));
  size_t out_bytes = st_tensor_type_bytes(&out_types[k >= 0 && (size_t)k < n_out ? k : 0]);
  unsigned char* first = NULL;
  unsigned char* host = st_xmalloc(out_bytes ? out_bytes : 1);
  const int runs = 2;
  for (int r = 0; r < runs && !s; ++r) {
    /* Donated inputs are consumed: fresh buffers every run. */
    for (size_t j = 0; j < n_in && !s; ++j) s = st_buffer_from_host(rt, 0, &in_types[j], in_data[j], &ins[j]);
    if (!s) s = st_program_execute(prog, 0, ins, (int)n_in, outs, (int)n_out, NULL);
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
    int64_t bad = st__bad(out_types[k].dtype, host, n);
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
  st_program_destroy(prog);
  st_plan_close(&opened);
  st_plan_options_deinit(&o); /* frees runtime.cache_dir too */
  st_config_destroy(cfg);
  free(cfg_path);
  free(in_types);
  free(in_data);
  free(out_types);
  st_safetensors_free(file);
  free(in_path);
  free(mlir);
  json_decref(meta);
  free(meta_path);
  return s;
}
