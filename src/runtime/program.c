/* program.c — compiling StableHLO through PJRT (via the executable cache
 * when enabled), program signatures, and checked execution. */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_internal.h"

/* The first lines of a (often very long) XLA message: enough to see what
 * went wrong without flooding the terminal with the whole module. */
static char* st__head_lines(const char* msg, int max_lines, size_t max_bytes) {
  if (!msg) return st_xstrdup("");
  const char* p = msg;
  int lines = 0;
  while (*p && (size_t)(p - msg) < max_bytes) {
    if (*p == '\n' && ++lines >= max_lines) break;
    ++p;
  }
  if (!*p) return st_xstrdup(msg);
  char* out = st__sprintf("%.*s\n  [... XLA message cut, %zu more bytes]", (int)(p - msg), msg, strlen(p));
  return out;
}

static st_status st__compile_error(const st_runtime* rt, const char* name, pj_error* e) {
  char* msg = st__pj_message(rt->api, e);
  st__pj_error_free(rt->api, e);
  char* head = st__head_lines(msg, 12, 2000);
  st_status s = st_status_make(ST_CODE_RUNTIME, "program '%s': compile failed: %s", name, head ? head : "(no message)");
  free(head);
  free(msg);
  return s;
}

st_status st__xla_compile(st_runtime* rt, const char* name, const void* code, size_t code_size,
                          const uint8_t* options, size_t options_size, pj_loaded_exe** out) {
  *out = NULL;
  /* The plugin's MLIR lexer reads one byte past the end looking for a NUL
   * terminator; without one, truncated text can run off into whatever
   * follows the caller's buffer (observed as an intermittent segfault). So
   * the code always goes in a private, NUL-terminated copy. */
  char* copy = st_xmalloc(code_size + 1);
  memcpy(copy, code, code_size);
  copy[code_size] = '\0';
  pj_program prog = {.struct_size = sizeof(prog)};
  prog.code = copy;
  prog.code_size = code_size;
  prog.format = "mlir";
  prog.format_size = 4;
  pj_compile_args a = {.struct_size = sizeof(a)};
  a.client = rt->client;
  a.program = &prog;
  a.options = (const char*)options;
  a.options_size = options_size;
  pj_error* e = rt->api->client_compile(&a);
  free(copy);
  if (e) return st__compile_error(rt, name, e);
  atomic_fetch_add(&rt->n_compiles, 1);
  *out = a.executable;
  return ST_OK;
}

/* XLA's memory analysis; a plugin without the call, or one that refuses
 * it, leaves the program's temporaries unknown rather than failing it. */
static void st__memory_stats(const pj_api* api, pj_executable* exe, st_program_memory* mem) {
  memset(mem, 0, sizeof(*mem));
  if (offsetof(pj_api, executable_compiled_memory_stats) >= api->struct_size || !api->executable_compiled_memory_stats)
    return;
  pj_compiled_memory_stats_args m;
  memset(&m, 0, sizeof(m));
  m.struct_size = sizeof(m);
  m.executable = exe;
  pj_error* e = api->executable_compiled_memory_stats(&m);
  if (e) {
    st__pj_error_free(api, e);
    return;
  }
  /* Negative counts would be a plugin bug; they must not shrink a peak. */
  mem->known = true;
  mem->temp_bytes = m.temp_bytes > 0 ? m.temp_bytes : 0;
  mem->argument_bytes = m.argument_bytes > 0 ? m.argument_bytes : 0;
  mem->output_bytes = m.output_bytes > 0 ? m.output_bytes : 0;
  mem->alias_bytes = m.alias_bytes > 0 ? m.alias_bytes : 0;
  mem->code_bytes = m.code_bytes > 0 ? m.code_bytes : 0;
  mem->host_temp_bytes = m.host_temp_bytes > 0 ? m.host_temp_bytes : 0;
}

void st_program_memory_stats(const st_program* p, st_program_memory* out) {
  if (!p) {
    memset(out, 0, sizeof(*out));
    return;
  }
  *out = p->memory;
}

bool st_program_from_cache(const st_program* p) { return p && p->from_cache; }

st_status st__num_outputs(st_runtime* rt, const char* name, pj_loaded_exe* exe, int* out, st_program_memory* mem) {
  const pj_api* api = rt->api;
  pj_get_executable_args g = {.struct_size = sizeof(g), .loaded = exe};
  ST_RETURN(st__pj_status(api, api->loaded_get_executable(&g), "program '%s': reading the executable", name));
  pj_num_outputs_args n = {.struct_size = sizeof(n), .executable = g.executable};
  pj_error* e = api->executable_num_outputs(&n);
  st__memory_stats(api, g.executable, mem);
  pj_executable_args d = {.struct_size = sizeof(d), .executable = g.executable};
  st__pj_error_free(api, api->executable_destroy(&d));
  ST_RETURN(st__pj_status(api, e, "program '%s': counting outputs", name));
  *out = (int)n.num_outputs;
  return ST_OK;
}

/* Fills the program's interface from the caller's signature and/or the
 * MLIR text. The caller's types win; donation can only come from the text
 * (and, after each run, from the plugin itself). */
static st_status st__prog_signature(st_program* p, const void* code, size_t code_size,
                                       const st_program_signature* given) {
  st__signature parsed;
  bool have = st__mlir_parse_main(code, code_size, &parsed);
  p->input_count = -1;
  p->output_count = -1;
  if (given && given->inputs) {
    if (given->input_count < 0) {
      if (have) st__signature_free(&parsed);
      return st_status_make(ST_CODE_INTERNAL, "program '%s': signature has a negative input count", p->name);
    }
    p->input_count = given->input_count;
    p->inputs = st_xcalloc((size_t)given->input_count + 1, sizeof(*p->inputs));
    p->donated = st_xcalloc((size_t)given->input_count + 1, sizeof(*p->donated));
    memcpy(p->inputs, given->inputs, (size_t)given->input_count * sizeof(*p->inputs));
    if (have && parsed.input_count == given->input_count && parsed.donated)
      memcpy(p->donated, parsed.donated, (size_t)given->input_count * sizeof(bool));
  } else if (have) {
    p->input_count = parsed.input_count;
    p->inputs = parsed.inputs;
    p->donated = parsed.donated;
    parsed.inputs = NULL;
    parsed.donated = NULL;
  }
  if (given && given->outputs) {
    p->output_count = given->output_count;
    p->outputs = st_xcalloc((size_t)given->output_count + 1, sizeof(*p->outputs));
    memcpy(p->outputs, given->outputs, (size_t)given->output_count * sizeof(*p->outputs));
  } else if (have) {
    p->output_count = parsed.output_count;
    p->outputs = parsed.outputs;
    parsed.outputs = NULL;
  }
  if (have) st__signature_free(&parsed);
  return ST_OK;
}

st_status st_program_compile(st_runtime* rt, const char* name, const void* code, size_t code_size,
                             const st_program_signature* signature, st_program** out_program) {
  assert(out_program); /* a caller's bug, not bad input */
  *out_program = NULL;
  if (!name || !name[0]) name = "(unnamed)";
  assert(rt); /* a caller's bug, not bad input */
  if (!code || code_size == 0) return st_status_make(ST_CODE_RUNTIME, "program '%s': the program is empty", name);

  st_program* p = st_xcalloc(1, sizeof(*p));
  p->rt = rt;
  p->name = st_xstrdup(name);
  st_status s = st__prog_signature(p, code, code_size, signature);

  char key[65] = {0};
  bool cached = rt->cache_dir != NULL;
  if (!s && cached) {
    st_status ks = st__cache_key(rt, rt->compile_options, rt->compile_options_size, code, code_size, key);
    if (ks) { /* no key, no cache: compiling still works */
      st_status_free(ks);
      cached = false;
    } else {
      st__cache_lookup(rt, key, &p->exe);
      p->from_cache = p->exe != NULL;
    }
  }
  if (!s && !p->exe) {
    s = st__xla_compile(rt, name, code, code_size, rt->compile_options, rt->compile_options_size, &p->exe);
    if (!s && cached) {
      st_status ws = st__cache_store(rt, key, p->exe);
      if (ws) {
        /* A cache that cannot be written costs time, not correctness. */
        fprintf(stderr, "strata: warning: program '%s': executable cache: %s\n", name, st_status_message(ws));
        st_status_free(ws);
      }
    }
  }
  if (!s && cached && rt->keep_optimized_hlo) {
    st_status ws = st__cache_keep_optimized(rt, key, name, code, code_size, p->exe);
    if (ws) { /* an analysis aid: said, never fatal */
      fprintf(stderr, "strata: warning: program '%s': optimized HLO not kept: %s\n", name, st_status_message(ws));
      st_status_free(ws);
    }
  }
  int n_out = -1;
  if (!s) s = st__num_outputs(rt, name, p->exe, &n_out, &p->memory);
  if (!s && p->output_count >= 0 && p->output_count != n_out) {
    if (signature && signature->outputs) {
      s = st_status_make(ST_CODE_RUNTIME, "program '%s': the signature lists %d outputs, the compiled program has %d",
                         name, p->output_count, n_out);
    } else { /* the text was misread: trust the executable */
      free(p->outputs);
      p->outputs = NULL;
    }
  }
  if (!s) p->output_count = n_out;
  if (s) {
    st_program_destroy(p);
    return s;
  }
  *out_program = p;
  return ST_OK;
}

st_status st_program_compile_file(st_runtime* rt, const char* path, const st_program_signature* signature,
                                  st_program** out_program) {
  assert(out_program); /* a caller's bug, not bad input */
  *out_program = NULL;
  assert(path); /* a caller's bug, not bad input */
  char* data = NULL;
  size_t n = 0;
  ST_RETURN_IF_ERROR(st_fs_read_file(path, &data, &n), "program %s", path);
  st_status s = st_program_compile(rt, path, data, n, signature, out_program);
  free(data);
  return s;
}

void st_program_destroy(st_program* p) {
  if (!p) return;
  if (p->exe) {
    pj_loaded_args a = {.struct_size = sizeof(a), .executable = p->exe};
    st__pj_error_free(p->rt->api, p->rt->api->loaded_destroy(&a));
  }
  free(p->name);
  free(p->mesh_devices);
  free(p->mesh_positions);
  free(p->inputs);
  free(p->donated);
  free(p->outputs);
  free(p);
}

const char* st_program_name(const st_program* p) { return p ? p->name : ""; }
int st_program_input_count(const st_program* p) { return p ? p->input_count : -1; }
int st_program_output_count(const st_program* p) { return p ? p->output_count : -1; }

const st_tensor_type* st_program_input_type(const st_program* p, int i) {
  if (!p || !p->inputs || i < 0 || i >= p->input_count) return NULL;
  return &p->inputs[i];
}

const st_tensor_type* st_program_output_type(const st_program* p, int i) {
  if (!p || !p->outputs || i < 0 || i >= p->output_count) return NULL;
  return &p->outputs[i];
}

bool st_program_input_donated(const st_program* p, int i) {
  if (!p || !p->donated || i < 0 || i >= p->input_count) return false;
  return p->donated[i];
}

/*===-------------------------------------------------------------------===*/
/* Execution                                                                */
/*===-------------------------------------------------------------------===*/

static bool st__prog_same_type(const st_tensor_type* a, const st_tensor_type* b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; ++i)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

st_status st__check_inputs(const st_program* p, int device, st_buffer* const* inputs, int input_count) {
  if (input_count < 0 || (input_count > 0 && !inputs))
    return st_status_make(ST_CODE_INTERNAL, "program '%s': bad input list", p->name);
  if (p->input_count >= 0 && input_count != p->input_count)
    return st_status_make(ST_CODE_RUNTIME, "program '%s': expected %d input%s, given %d", p->name, p->input_count,
                          p->input_count == 1 ? "" : "s", input_count);
  for (int i = 0; i < input_count; ++i) {
    const st_buffer* b = inputs[i];
    char given[128], want[128];
    if (!b) return st_status_make(ST_CODE_RUNTIME, "program '%s': input %d: buffer is NULL", p->name, i);
    st_tensor_type_format(&b->type, given, sizeof(given));
    if (b->rt != p->rt)
      return st_status_make(ST_CODE_RUNTIME, "program '%s': input %d: buffer %s belongs to another runtime", p->name, i,
                            given);
    if (b->consumed)
      return st_status_make(ST_CODE_RUNTIME,
                            "program '%s': input %d: buffer %s was consumed (donated to program '%s'); it holds no data",
                            p->name, i, given, b->consumed_by);
    if (b->device != device)
      return st_status_make(ST_CODE_RUNTIME, "program '%s': input %d: buffer %s is on device %d, the program runs on device %d",
                            p->name, i, given, b->device, device);
    for (int j = 0; j < i; ++j) {
      if (inputs[j] == b && ((p->donated && (p->donated[i] || p->donated[j]))))
        return st_status_make(ST_CODE_RUNTIME,
                              "program '%s': input %d: the same buffer is also input %d and one of them is donated",
                              p->name, i, j);
    }
    if (p->inputs && !st__prog_same_type(&p->inputs[i], &b->type))
      return st_status_make(ST_CODE_RUNTIME, "program '%s': input %d: expected %s, given %s", p->name, i,
                            st_tensor_type_format(&p->inputs[i], want, sizeof(want)), given);
  }
  return ST_OK;
}

/* The type of an output buffer as the plugin sees it; falls back to the
 * signature's when the plugin cannot say. */
st_tensor_type st__output_type(const st_program* p, int i, pj_buffer* h) {
  const pj_api* api = p->rt->api;
  st_tensor_type t;
  memset(&t, 0, sizeof(t));
  bool ok = false;
  pj_buffer_type_args ta = {.struct_size = sizeof(ta), .buffer = h};
  pj_error* e = api->buffer_element_type(&ta);
  if (!e) {
    pj_buffer_dims_args da = {.struct_size = sizeof(da), .buffer = h};
    e = api->buffer_dimensions(&da);
    if (!e && da.num_dims <= ST_MAX_RANK) {
      t.dtype = st__dtype_from_pj(ta.type);
      t.rank = (int)da.num_dims;
      for (size_t k = 0; k < da.num_dims; ++k) t.dims[k] = da.dims[k];
      ok = t.dtype != ST_DTYPE_INVALID;
    }
  }
  st__pj_error_free(api, e);
  if (!ok && p->outputs) t = p->outputs[i];
  return t;
}

bool st__plugin_deleted(const pj_api* api, pj_buffer* h) {
  pj_buffer_bool_args a = {.struct_size = sizeof(a), .buffer = h};
  pj_error* e = api->buffer_is_deleted(&a);
  if (e) {
    st__pj_error_free(api, e);
    return false;
  }
  return a.value;
}

st_status st_program_execute(st_program* p, int device, st_buffer* const* inputs, int input_count,
                             st_buffer** outputs, int output_count, st_event** out_done) {
  if (out_done) *out_done = NULL;
  if (outputs)
    for (int i = 0; i < output_count; ++i) outputs[i] = NULL;
  assert(p); /* a caller's bug, not bad input */
  st_runtime* rt = p->rt;
  const pj_api* api = rt->api;
  if (device < 0 || device >= rt->device_count)
    return st_status_make(ST_CODE_RUNTIME, "program '%s': device %d does not exist (the runtime has %d)", p->name,
                          device, rt->device_count);
  if (p->mesh_device_count > 0)
    return st_status_make(ST_CODE_RUNTIME,
                          "program '%s' is compiled for %d devices (SPMD); run it with st_program_execute_spmd", p->name,
                          p->mesh_device_count);
  if (output_count != p->output_count || (output_count > 0 && !outputs))
    return st_status_make(ST_CODE_RUNTIME, "program '%s': has %d output%s, the caller provided room for %d", p->name,
                          p->output_count, p->output_count == 1 ? "" : "s", output_count);
  ST_RETURN(st__check_inputs(p, device, inputs, input_count));

  pj_buffer** args = st_xcalloc((size_t)input_count + 1, sizeof(*args));
  pj_buffer** outs = st_xcalloc((size_t)output_count + 1, sizeof(*outs));
  for (int i = 0; i < input_count; ++i) args[i] = inputs[i]->handle;
  pj_buffer* const* arg_lists[1] = {args};
  pj_buffer** out_lists[1] = {outs};
  pj_event* done[1] = {NULL};

  pj_execute_options opts = {.struct_size = sizeof(opts)};
  pj_execute_args a = {.struct_size = sizeof(a)};
  a.executable = p->exe;
  a.options = &opts;
  a.argument_lists = arg_lists;
  a.num_devices = 1;
  a.num_args = (size_t)input_count;
  a.output_lists = out_lists;
  a.device_complete_events = out_done ? done : NULL;
  /* Portable executables run wherever execute_device says. */
  a.execute_device = rt->devices[device].handle;
  pj_error* e = api->loaded_execute(&a);
  free(args);
  if (e) {
    free(outs);
    return st__pj_status(api, e, "program '%s': launch on device %d", p->name, device);
  }
  atomic_fetch_add(&rt->n_executions, 1);

  /* Donated inputs now hold nothing; the plugin is asked too, so donation
   * the text did not declare (bytecode programs) is still recorded. */
  for (int i = 0; i < input_count; ++i) {
    st_buffer* b = inputs[i];
    if ((p->donated && p->donated[i]) || st__plugin_deleted(api, b->handle)) {
      b->consumed = true;
      snprintf(b->consumed_by, sizeof(b->consumed_by), "%s", p->name);
    }
  }

  st_status s = ST_OK;
  for (int i = 0; i < output_count; ++i) {
    st_tensor_type t = st__output_type(p, i, outs[i]);
    st_status w = st__buffer_wrap(rt, outs[i], device, &t, &outputs[i]);
    outs[i] = NULL;
    if (w && !s) s = w;
    else st_status_free(w);
  }
  free(outs);
  if (!s && out_done) {
    s = st__event_make(api, done[0], st__sprintf("program '%s' on device %d", p->name, device), out_done);
    done[0] = NULL;
  }
  st__pj_event_free(api, done[0]);
  if (s) {
    for (int i = 0; i < output_count; ++i) {
      st_buffer_destroy(outputs[i]);
      outputs[i] = NULL;
    }
  }
  return s;
}
