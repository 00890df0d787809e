/* mesh.c — SPMD programs over a device mesh and sharded tensors
 * (strata/mesh.h, docs/parallelism.md).
 *
 * An SPMD program is compiled once for all the mesh's devices: the compile
 * options carry num_partitions = devices and the device assignment
 * (compile_options.c), and one Execute call takes one argument list per
 * device. The plugin decides the order of those lists (its executable's
 * addressable devices); it is read back after compiling, never assumed. */
#include <assert.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_internal.h"
#include "strata/mesh.h"

/*===-------------------------------------------------------------------===*/
/* Mesh                                                                     */
/*===-------------------------------------------------------------------===*/

static bool st__axis_name_ok(const char* s) {
  if (!s || !s[0] || strlen(s) >= ST_MESH_AXIS_NAME_MAX) return false;
  for (const char* c = s; *c; ++c)
    if (!(isalnum((unsigned char)*c) || *c == '_')) return false;
  return true;
}

st_status st_mesh_make(int axis_count, const char* const* names, const int* sizes, const int* devices, st_mesh* out) {
  assert(out); /* a caller's bug, not bad input */
  memset(out, 0, sizeof(*out));
  if (axis_count < 1 || axis_count > ST_MESH_MAX_AXES || !names || !sizes)
    return st_status_make(ST_CODE_CONFIG, "mesh: %d axes given, a mesh has 1 to %d", axis_count, ST_MESH_MAX_AXES);
  int64_t n = 1;
  for (int a = 0; a < axis_count; ++a) {
    if (!st__axis_name_ok(names[a]))
      return st_status_make(ST_CODE_CONFIG, "mesh: axis %d: name '%s' must be 1 to %d letters, digits or _", a,
                            names[a] ? names[a] : "(null)", ST_MESH_AXIS_NAME_MAX - 1);
    for (int b = 0; b < a; ++b)
      if (!strcmp(names[a], names[b]))
        return st_status_make(ST_CODE_CONFIG, "mesh: axis '%s' appears twice", names[a]);
    if (sizes[a] < 1)
      return st_status_make(ST_CODE_CONFIG, "mesh: axis '%s' has size %d; sizes are >= 1", names[a], sizes[a]);
    n *= sizes[a];
    if (n > ST_MESH_MAX_DEVICES)
      return st_status_make(ST_CODE_CONFIG, "mesh: more than %d devices (axes up to '%s')", ST_MESH_MAX_DEVICES,
                            names[a]);
  }
  out->axis_count = axis_count;
  for (int a = 0; a < axis_count; ++a) {
    snprintf(out->axis_names[a], sizeof(out->axis_names[a]), "%s", names[a]);
    out->axis_sizes[a] = sizes[a];
  }
  out->device_count = (int)n;
  for (int p = 0; p < out->device_count; ++p) {
    int d = devices ? devices[p] : p;
    if (d < 0) {
      memset(out, 0, sizeof(*out));
      return st_status_make(ST_CODE_CONFIG, "mesh: mesh index %d: device %d is negative", p, d);
    }
    for (int q = 0; q < p; ++q)
      if (out->devices[q] == d) {
        memset(out, 0, sizeof(*out));
        return st_status_make(ST_CODE_CONFIG, "mesh: device %d appears twice (mesh indices %d and %d)", d, q, p);
      }
    out->devices[p] = d;
  }
  return ST_OK;
}

int st_mesh_axis(const st_mesh* m, const char* name) {
  if (!m || !name) return -1;
  for (int a = 0; a < m->axis_count; ++a)
    if (!strcmp(m->axis_names[a], name)) return a;
  return -1;
}

int st_mesh_coord(const st_mesh* m, int p, int axis) {
  if (!m || axis < 0 || axis >= m->axis_count || p < 0 || p >= m->device_count) return -1;
  int stride = 1;
  for (int a = m->axis_count - 1; a > axis; --a) stride *= m->axis_sizes[a];
  return (p / stride) % m->axis_sizes[axis];
}

/* The mesh's devices exist in |rt|. */
static st_status st__mesh_check(const st_runtime* rt, const st_mesh* m, const char* what) {
  if (!m || m->device_count < 1 || m->device_count > ST_MESH_MAX_DEVICES)
    return st_status_make(ST_CODE_INTERNAL, "%s: no mesh or an empty one", what);
  for (int p = 0; p < m->device_count; ++p)
    if (m->devices[p] < 0 || m->devices[p] >= rt->device_count)
      return st_status_make(ST_CODE_RUNTIME,
                            "%s: mesh index %d is device %d; the runtime has %d device%s (runtime.cpu_devices)", what,
                            p, m->devices[p], rt->device_count, rt->device_count == 1 ? "" : "s");
  return ST_OK;
}

/*===-------------------------------------------------------------------===*/
/* SPMD programs                                                            */
/*===-------------------------------------------------------------------===*/

/* Per-device types from the caller; counts and donation from the text (its
 * types are global, so they are not used). */
static st_status st__spmd_signature(st_program* p, const void* code, size_t code_size,
                                    const st_program_signature* given) {
  st__signature parsed;
  bool have = st__mlir_parse_main(code, code_size, &parsed);
  p->input_count = -1;
  p->output_count = -1;
  if (given && (given->input_count < 0 || given->output_count < 0 || (given->input_count > 0 && !given->inputs) ||
                (given->output_count > 0 && !given->outputs))) {
    if (have) st__signature_free(&parsed);
    return st_status_make(ST_CODE_INTERNAL, "program '%s': malformed local signature", p->name);
  }
  if (given) {
    p->input_count = given->input_count;
    p->inputs = st_xcalloc((size_t)given->input_count + 1, sizeof(*p->inputs));
    memcpy(p->inputs, given->inputs, (size_t)given->input_count * sizeof(*p->inputs));
    p->output_count = given->output_count;
    p->outputs = st_xcalloc((size_t)given->output_count + 1, sizeof(*p->outputs));
    memcpy(p->outputs, given->outputs, (size_t)given->output_count * sizeof(*p->outputs));
    p->donated = st_xcalloc((size_t)given->input_count + 1, sizeof(*p->donated));
    if (have && parsed.input_count == given->input_count && parsed.donated)
      memcpy(p->donated, parsed.donated, (size_t)given->input_count * sizeof(bool));
  } else if (have) {
    p->input_count = parsed.input_count;
    p->donated = parsed.donated;
    parsed.donated = NULL;
  }
  if (have) st__signature_free(&parsed);
  return ST_OK;
}

/* Reads the order in which Execute takes the partitions' argument lists. */
static st_status st__spmd_positions(st_program* p) {
  st_runtime* rt = p->rt;
  pj_loaded_devices_args a = {.struct_size = sizeof(a), .executable = p->exe};
  ST_RETURN(st__pj_status(rt->api, rt->api->loaded_addressable_devices(&a),
                          "program '%s': reading the executable's devices", p->name));
  if ((int)a.num_devices != p->mesh_device_count)
    return st_status_make(ST_CODE_RUNTIME,
                          "program '%s': compiled for %d devices, the executable runs on %zu (is the program exported "
                          "for this mesh? its mhlo.num_partitions must be %d)",
                          p->name, p->mesh_device_count, a.num_devices, p->mesh_device_count);
  for (int part = 0; part < p->mesh_device_count; ++part) {
    pj_device* want = rt->devices[p->mesh_devices[part]].handle;
    p->mesh_positions[part] = -1;
    for (size_t k = 0; k < a.num_devices; ++k)
      if (a.devices[k] == want) p->mesh_positions[part] = (int)k;
    if (p->mesh_positions[part] < 0)
      return st_status_make(ST_CODE_RUNTIME, "program '%s': partition %d's device %d is not among the executable's",
                            p->name, part, p->mesh_devices[part]);
  }
  return ST_OK;
}

st_status st_program_compile_spmd(st_runtime* rt, const char* name, const void* code, size_t code_size,
                                  const st_mesh* mesh, const st_program_signature* local_signature,
                                  st_program** out_program) {
  assert(out_program); /* a caller's bug, not bad input */
  *out_program = NULL;
  if (!name || !name[0]) name = "(unnamed)";
  assert(rt); /* a caller's bug, not bad input */
  if (!code || code_size == 0) return st_status_make(ST_CODE_RUNTIME, "program '%s': the program is empty", name);
  char what[160];
  snprintf(what, sizeof(what), "program '%s'", name);
  ST_RETURN(st__mesh_check(rt, mesh, what));

  st_program* p = st_xcalloc(1, sizeof(*p));
  p->rt = rt;
  p->name = st_xstrdup(name);
  p->mesh_device_count = mesh->device_count;
  p->mesh_devices = st_xcalloc((size_t)mesh->device_count, sizeof(int));
  p->mesh_positions = st_xcalloc((size_t)mesh->device_count, sizeof(int));
  int64_t* ids = st_xcalloc((size_t)mesh->device_count, sizeof(int64_t));
  for (int i = 0; i < mesh->device_count; ++i) {
    p->mesh_devices[i] = mesh->devices[i];
    ids[i] = rt->devices[mesh->devices[i]].id;
  }
  uint8_t* opts = NULL;
  size_t opts_size = 0;
  st_status s = st__spmd_signature(p, code, code_size, local_signature);
  if (!s) s = st__compile_options_spmd(rt->compile_options, rt->compile_options_size, ids, mesh->device_count, &opts,
                                       &opts_size);
  free(ids);

  char key[65] = {0};
  bool cached = rt->cache_dir != NULL;
  if (!s && cached) {
    st_status ks = st__cache_key(rt, opts, opts_size, code, code_size, key);
    if (ks) {
      st_status_free(ks);
      cached = false;
    } else {
      st__cache_lookup(rt, key, &p->exe);
      p->from_cache = p->exe != NULL;
    }
  }
  if (!s && !p->exe) {
    s = st__xla_compile(rt, name, code, code_size, opts, opts_size, &p->exe);
    if (!s && cached) {
      st_status ws = st__cache_store(rt, key, p->exe);
      if (ws) {
        fprintf(stderr, "strata: warning: program '%s': executable cache: %s\n", name, st_status_message(ws));
        st_status_free(ws);
      }
    }
  }
  free(opts);
  int n_out = -1;
  if (!s) s = st__num_outputs(rt, name, p->exe, &n_out, &p->memory);
  if (!s && p->output_count >= 0 && p->output_count != n_out)
    s = st_status_make(ST_CODE_RUNTIME, "program '%s': the signature lists %d outputs, the compiled program has %d",
                       name, p->output_count, n_out);
  if (!s) p->output_count = n_out;
  if (!s) s = st__spmd_positions(p);
  if (s) {
    st_program_destroy(p);
    return s;
  }
  *out_program = p;
  return ST_OK;
}

st_status st_program_compile_spmd_file(st_runtime* rt, const char* path, const st_mesh* mesh,
                                       const st_program_signature* local_signature, st_program** out_program) {
  assert(out_program); /* a caller's bug, not bad input */
  *out_program = NULL;
  assert(path); /* a caller's bug, not bad input */
  char* data = NULL;
  size_t n = 0;
  ST_RETURN_IF_ERROR(st_fs_read_file(path, &data, &n), "program %s", path);
  st_status s = st_program_compile_spmd(rt, path, data, n, mesh, local_signature, out_program);
  free(data);
  return s;
}

int st_program_device_count(const st_program* p) {
  if (!p) return 0;
  return p->mesh_device_count > 0 ? p->mesh_device_count : 1;
}

int st_program_partition_device(const st_program* p, int part) {
  if (!p || p->mesh_device_count <= 0 || part < 0 || part >= p->mesh_device_count) return -1;
  return p->mesh_devices[part];
}

st_status st_program_execute_spmd(st_program* p, st_buffer* const* inputs, int input_count, st_buffer** outputs,
                                  int output_count, st_event** out_done) {
  assert(p); /* a caller's bug, not bad input */
  int n = p->mesh_device_count;
  if (out_done)
    for (int d = 0; d < n; ++d) out_done[d] = NULL;
  if (outputs && output_count > 0)
    for (int i = 0; i < n * output_count; ++i) outputs[i] = NULL;
  if (n <= 0)
    return st_status_make(ST_CODE_RUNTIME, "program '%s' is a one-device program; run it with st_program_execute",
                          p->name);
  st_runtime* rt = p->rt;
  const pj_api* api = rt->api;
  if (output_count != p->output_count || (output_count > 0 && !outputs))
    return st_status_make(ST_CODE_RUNTIME, "program '%s': has %d output%s per device, the caller provided room for %d",
                          p->name, p->output_count, p->output_count == 1 ? "" : "s", output_count);
  if (input_count < 0 || (input_count > 0 && !inputs))
    return st_status_make(ST_CODE_INTERNAL, "program '%s': bad input list", p->name);
  for (int part = 0; part < n; ++part) {
    st_status c = st__check_inputs(p, p->mesh_devices[part], inputs + (size_t)part * (size_t)input_count, input_count);
    if (c) {
      st_status w = st_status_make(st_status_code(c), "partition %d: %s", part, st_status_message(c));
      st_status_free(c);
      return w;
    }
  }

  pj_buffer** args = st_xcalloc((size_t)n * (size_t)input_count + 1, sizeof(*args));
  pj_buffer** outs = st_xcalloc((size_t)n * (size_t)output_count + 1, sizeof(*outs));
  pj_buffer* const** arg_lists = st_xcalloc((size_t)n, sizeof(*arg_lists));
  pj_buffer*** out_lists = st_xcalloc((size_t)n, sizeof(*out_lists));
  pj_event** done = st_xcalloc((size_t)n, sizeof(*done));
  for (int part = 0; part < n; ++part) {
    int k = p->mesh_positions[part];
    pj_buffer** a = args + (size_t)k * (size_t)input_count;
    for (int i = 0; i < input_count; ++i) a[i] = inputs[(size_t)part * (size_t)input_count + (size_t)i]->handle;
    arg_lists[k] = a;
    out_lists[k] = outs + (size_t)k * (size_t)output_count;
  }
  pj_execute_options opts = {.struct_size = sizeof(opts)};
  pj_execute_args a = {.struct_size = sizeof(a)};
  a.executable = p->exe;
  a.options = &opts;
  a.argument_lists = (pj_buffer* const* const*)arg_lists;
  a.num_devices = (size_t)n;
  a.num_args = (size_t)input_count;
  a.output_lists = (pj_buffer** const*)out_lists;
  a.device_complete_events = out_done ? done : NULL;
  a.execute_device = NULL; /* the compiled device assignment */
  pj_error* e = api->loaded_execute(&a);
  free(args);
  free(arg_lists);
  free(out_lists);
  if (e) {
    free(outs);
    free(done);
    return st__pj_status(api, e, "program '%s': launch on %d devices", p->name, n);
  }
  atomic_fetch_add(&rt->n_executions, 1);

  for (int part = 0; part < n; ++part)
    for (int i = 0; i < input_count; ++i) {
      st_buffer* b = inputs[(size_t)part * (size_t)input_count + (size_t)i];
      if ((p->donated && p->donated[i]) || st__plugin_deleted(api, b->handle)) {
        b->consumed = true;
        snprintf(b->consumed_by, sizeof(b->consumed_by), "%s", p->name);
      }
    }

  st_status s = ST_OK;
  for (int part = 0; part < n; ++part) {
    int k = p->mesh_positions[part];
    for (int i = 0; i < output_count; ++i) {
      pj_buffer** h = &outs[(size_t)k * (size_t)output_count + (size_t)i];
      st_tensor_type t = st__output_type(p, i, *h);
      st_buffer** slot = &outputs[(size_t)part * (size_t)output_count + (size_t)i];
      st_status w = st__buffer_wrap(rt, *h, p->mesh_devices[part], &t, slot);
      *h = NULL;
      if (w && !s) s = w;
      else st_status_free(w);
    }
  }
  free(outs);
  for (int part = 0; part < n && out_done; ++part) {
    int k = p->mesh_positions[part];
    if (!s) {
      s = st__event_make(api, done[k], st__sprintf("program '%s' on device %d (partition %d)", p->name,
                                                   p->mesh_devices[part], part),
                         &out_done[part]);
      done[k] = NULL;
    }
  }
  for (int k = 0; k < n; ++k) st__pj_event_free(api, done[k]);
  free(done);
  if (s) {
    for (int i = 0; i < n * output_count; ++i) {
      st_buffer_destroy(outputs[i]);
      outputs[i] = NULL;
    }
    for (int d = 0; out_done && d < n; ++d) {
      st_event_destroy(out_done[d]);
      out_done[d] = NULL;
    }
  }
  return s;
}

/*===-------------------------------------------------------------------===*/
/* Sharded tensors                                                          */
/*===-------------------------------------------------------------------===*/

struct st_sharded {
  st_runtime* rt;
  st_mesh mesh;
  st_tensor_type global, local;
  st_sharding sharding;
  st_buffer** shards; /* mesh.device_count, owned */
};

static int st__ways(const st_mesh* m, uint32_t axes) {
  int k = 1;
  for (int a = 0; a < m->axis_count; ++a)
    if (axes & (1u << a)) k *= m->axis_sizes[a];
  return k;
}

/* Row-major index of device |p| over the axes in |axes| (mesh order). */
static int st__index_over(const st_mesh* m, uint32_t axes, int p) {
  int idx = 0;
  for (int a = 0; a < m->axis_count; ++a)
    if (axes & (1u << a)) idx = idx * m->axis_sizes[a] + st_mesh_coord(m, p, a);
  return idx;
}

st_status st_sharding_local_type(const st_mesh* m, const st_tensor_type* g, const st_sharding* sh,
                                 st_tensor_type* out) {
  assert(m && g && sh && out); /* a caller's bug, not bad input */
  if (g->rank < 0 || g->rank > ST_MAX_RANK || st_dtype_size(g->dtype) == 0)
    return st_status_make(ST_CODE_INTERNAL, "sharding: bad tensor type");
  uint32_t all = m->axis_count >= 32 ? 0xffffffffu : ((1u << m->axis_count) - 1u);
  uint32_t seen = sh->partial;
  if (sh->partial & ~all)
    return st_status_make(ST_CODE_INTERNAL, "sharding: partial names an axis the mesh lacks (mask %#x)", sh->partial);
  *out = *g;
  for (int d = 0; d < ST_MAX_RANK; ++d) {
    uint32_t s = sh->split[d];
    if (!s) continue;
    if (d >= g->rank)
      return st_status_make(ST_CODE_INTERNAL, "sharding: dimension %d is split but the tensor has rank %d", d, g->rank);
    if (s & ~all) return st_status_make(ST_CODE_INTERNAL, "sharding: dimension %d names an axis the mesh lacks", d);
    if (s & seen) return st_status_make(ST_CODE_INTERNAL, "sharding: dimension %d reuses a mesh axis", d);
    seen |= s;
    uint32_t o = sh->outer[d];
    if (o & ~s) return st_status_make(ST_CODE_INTERNAL, "sharding: dimension %d's outer axes are not among its split axes", d);
    int ko = st__ways(m, o), k = st__ways(m, s & ~o);
    if (g->dims[d] % ko)
      return st_status_make(ST_CODE_INTERNAL, "sharding: dimension %d of %lld does not divide in %d outer blocks", d,
                            (long long)g->dims[d], ko);
    int64_t block = g->dims[d] / ko;
    out->dims[d] = (block + k - 1) / k;
  }
  for (int d = g->rank; d < ST_MAX_RANK; ++d)
    if (sh->outer[d]) return st_status_make(ST_CODE_INTERNAL, "sharding: dimension %d has outer axes but the tensor has rank %d", d, g->rank);
  return ST_OK;
}

/* Calls |fn| for every run of contiguous elements (along the last
 * dimension) of device |p|'s shard that maps into the logical tensor:
 * local element offset, global element offset, run length. */
typedef void (*st__run_fn)(void* ctx, int64_t local_off, int64_t global_off, int64_t n);

static void st__for_runs(const st_sharded* t, int p, st__run_fn fn, void* ctx) {
  const st_tensor_type* g = &t->global;
  const st_tensor_type* l = &t->local;
  if (st_tensor_type_elements(l) == 0) return; /* empty: and the odometer below would never wrap */
  if (g->rank == 0) {
    fn(ctx, 0, 0, 1);
    return;
  }
  /* Per dimension: where the device's block starts and where the part of
   * the logical tensor it may cover ends (its outer block's end: the rest
   * is padding). */
  int64_t start[ST_MAX_RANK], limit[ST_MAX_RANK];
  for (int d = 0; d < g->rank; ++d) {
    const uint32_t s = t->sharding.split[d], o = t->sharding.outer[d];
    const int64_t block = g->dims[d] / st__ways(&t->mesh, o);
    const int64_t base = o ? (int64_t)st__index_over(&t->mesh, o, p) * block : 0;
    start[d] = base + (s & ~o ? (int64_t)st__index_over(&t->mesh, s & ~o, p) * l->dims[d] : 0);
    limit[d] = o ? base + block : g->dims[d];
  }
  int last = g->rank - 1;
  int64_t run = limit[last] - start[last];
  if (run > l->dims[last]) run = l->dims[last];
  if (run <= 0) return;
  int64_t idx[ST_MAX_RANK] = {0}; /* local index over dims 0..last-1 */
  for (;;) {
    bool inside = true;
    int64_t loff = 0, goff = 0;
    for (int d = 0; d < last; ++d) {
      int64_t gi = start[d] + idx[d];
      if (gi >= limit[d]) inside = false;
      loff = loff * l->dims[d] + idx[d];
      goff = goff * g->dims[d] + gi;
    }
    if (inside) fn(ctx, loff * l->dims[last], goff * g->dims[last] + start[last], run);
    int d = last - 1;
    while (d >= 0 && ++idx[d] == l->dims[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

/* Whether device |p| holds the copy that counts: coordinate 0 on every
 * replicated axis (and, for partial, on every partial axis when filling). */
static bool st__is_first(const st_sharded* t, int p, uint32_t axes) {
  for (int a = 0; a < t->mesh.axis_count; ++a)
    if ((axes & (1u << a)) && st_mesh_coord(&t->mesh, p, a) != 0) return false;
  return true;
}

static uint32_t st__replicated_axes(const st_sharded* t) {
  uint32_t used = t->sharding.partial;
  for (int d = 0; d < ST_MAX_RANK; ++d) used |= t->sharding.split[d];
  uint32_t all = (1u << t->mesh.axis_count) - 1u;
  return all & ~used;
}

static st_sharded* st__sharded_new(st_runtime* rt, const st_mesh* m, const st_tensor_type* g, const st_sharding* sh,
                                   const st_tensor_type* local) {
  st_sharded* t = st_xcalloc(1, sizeof(*t));
  t->rt = rt;
  t->mesh = *m;
  t->global = *g;
  t->local = *local;
  t->sharding = *sh;
  t->shards = st_xcalloc((size_t)m->device_count, sizeof(*t->shards));
  return t;
}

typedef struct {
  uint8_t* dst;
  const uint8_t* src;
  size_t es;
  bool to_global; /* copy local->global instead of global->local */
  bool add;       /* accumulate (to_global only) */
  st_dtype dtype;
} st__copy_ctx;

static void st__copy_run(void* vctx, int64_t loff, int64_t goff, int64_t n) {
  st__copy_ctx* c = vctx;
  if (!c->to_global) {
    memcpy(c->dst + (size_t)loff * c->es, c->src + (size_t)goff * c->es, (size_t)n * c->es);
    return;
  }
  uint8_t* d = c->dst + (size_t)goff * c->es;
  const uint8_t* s = c->src + (size_t)loff * c->es;
  if (!c->add) {
    memcpy(d, s, (size_t)n * c->es);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    switch (c->dtype) {
      case ST_DTYPE_F32: {
        float x, y;
        memcpy(&x, d + i * 4, 4);
        memcpy(&y, s + i * 4, 4);
        x += y;
        memcpy(d + i * 4, &x, 4);
        break;
      }
      case ST_DTYPE_F64: {
        double x, y;
        memcpy(&x, d + i * 8, 8);
        memcpy(&y, s + i * 8, 8);
        x += y;
        memcpy(d + i * 8, &x, 8);
        break;
      }
      default: { /* S32, checked by the caller; wraps like XLA's add */
        uint32_t x, y;
        memcpy(&x, d + i * 4, 4);
        memcpy(&y, s + i * 4, 4);
        x += y;
        memcpy(d + i * 4, &x, 4);
        break;
      }
    }
  }
}

st_status st_sharded_from_host(st_runtime* rt, const st_mesh* m, const st_tensor_type* g, const st_sharding* sh,
                               const void* data, st_sharded** out) {
  assert(out); /* a caller's bug, not bad input */
  *out = NULL;
  assert(rt && data); /* a caller's bug, not bad input */
  ST_RETURN(st__mesh_check(rt, m, "sharded tensor"));
  st_tensor_type local;
  ST_RETURN(st_sharding_local_type(m, g, sh, &local));
  st_sharded* t = st__sharded_new(rt, m, g, sh, &local);
  size_t bytes = st_tensor_type_bytes(&local);
  uint8_t* buf = st_xmalloc(bytes ? bytes : 1);
  st_status s = ST_OK;
  for (int p = 0; p < m->device_count && !s; ++p) {
    memset(buf, 0, bytes);
    if (st__is_first(t, p, sh->partial)) {
      st__copy_ctx c = {.dst = buf, .src = data, .es = st_dtype_size(g->dtype)};
      st__for_runs(t, p, st__copy_run, &c);
    }
    s = st_buffer_from_host(rt, m->devices[p], &local, buf, &t->shards[p]);
  }
  free(buf);
  if (s) {
    st_sharded_destroy(t);
    return s;
  }
  *out = t;
  return ST_OK;
}

static bool st__same(const st_tensor_type* a, const st_tensor_type* b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; ++i)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

st_status st_sharded_wrap(st_runtime* rt, const st_mesh* m, const st_tensor_type* g, const st_sharding* sh,
                          st_buffer** shards, st_sharded** out) {
  st_status s = ST_OK;
  if (!out || !rt || !m || !shards) s = st_status_make(ST_CODE_INTERNAL, "st_sharded_wrap: NULL argument");
  if (out) *out = NULL;
  if (!s) s = st__mesh_check(rt, m, "sharded tensor");
  st_tensor_type local;
  if (!s) s = st_sharding_local_type(m, g, sh, &local);
  for (int p = 0; !s && p < m->device_count; ++p) {
    char want[96], got[96];
    if (!shards[p]) s = st_status_make(ST_CODE_INTERNAL, "sharded tensor: shard %d is NULL", p);
    else if (shards[p]->device != m->devices[p])
      s = st_status_make(ST_CODE_RUNTIME, "sharded tensor: shard %d is on device %d, mesh index %d is device %d", p,
                         shards[p]->device, p, m->devices[p]);
    else if (!st__same(&shards[p]->type, &local))
      s = st_status_make(ST_CODE_RUNTIME, "sharded tensor: shard %d is %s, the sharding gives %s", p,
                         st_tensor_type_format(&shards[p]->type, got, sizeof(got)),
                         st_tensor_type_format(&local, want, sizeof(want)));
  }
  if (s) {
    if (shards && m)
      for (int p = 0; p < m->device_count && p < ST_MESH_MAX_DEVICES; ++p) {
        st_buffer_destroy(shards[p]);
        shards[p] = NULL;
      }
    return s;
  }
  st_sharded* t = st__sharded_new(rt, m, g, sh, &local);
  for (int p = 0; p < m->device_count; ++p) {
    t->shards[p] = shards[p];
    shards[p] = NULL;
  }
  *out = t;
  return ST_OK;
}

st_status st_sharded_to_host(st_sharded* t, void* dst, size_t dst_size) {
  assert(t && dst); /* a caller's bug, not bad input */
  size_t gbytes = st_tensor_type_bytes(&t->global);
  if (dst_size != gbytes)
    return st_status_make(ST_CODE_INTERNAL, "sharded tensor: destination has %zu bytes, the tensor %zu", dst_size,
                          gbytes);
  st_dtype dt = t->global.dtype;
  if (t->sharding.partial && dt != ST_DTYPE_F32 && dt != ST_DTYPE_F64 && dt != ST_DTYPE_S32)
    return st_status_make(ST_CODE_RUNTIME, "sharded tensor: cannot sum partial shards of %s on the host",
                          st_dtype_name(dt));
  memset(dst, 0, dst_size);
  size_t lbytes = st_tensor_type_bytes(&t->local);
  uint8_t* buf = st_xmalloc(lbytes ? lbytes : 1);
  uint32_t repl = st__replicated_axes(t);
  st_status s = ST_OK;
  for (int p = 0; p < t->mesh.device_count && !s; ++p) {
    if (!st__is_first(t, p, repl)) continue;
    s = st_buffer_to_host(t->shards[p], buf, lbytes);
    if (s) break;
    st__copy_ctx c = {.dst = dst, .src = buf, .es = st_dtype_size(dt), .to_global = true,
                      .add = t->sharding.partial != 0, .dtype = dt};
    st__for_runs(t, p, st__copy_run, &c);
  }
  free(buf);
  return s;
}

const st_tensor_type* st_sharded_type(const st_sharded* t) { return t ? &t->global : NULL; }
const st_tensor_type* st_sharded_local_type(const st_sharded* t) { return t ? &t->local : NULL; }
const st_sharding* st_sharded_sharding(const st_sharded* t) { return t ? &t->sharding : NULL; }
const st_mesh* st_sharded_mesh(const st_sharded* t) { return t ? &t->mesh : NULL; }

st_buffer* st_sharded_shard(const st_sharded* t, int p) {
  if (!t || p < 0 || p >= t->mesh.device_count) return NULL;
  return t->shards[p];
}

size_t st_sharded_bytes_per_device(const st_sharded* t) { return t ? st_tensor_type_bytes(&t->local) : 0; }

bool st_sharded_is_consumed(const st_sharded* t) {
  if (!t) return false;
  for (int p = 0; p < t->mesh.device_count; ++p)
    if (t->shards[p] && st_buffer_is_consumed(t->shards[p])) return true;
  return false;
}

void st_sharded_release(st_sharded* t, st_buffer** out_shards) {
  if (!t) return;
  for (int p = 0; p < t->mesh.device_count; ++p) out_shards[p] = t->shards[p];
  free(t->shards);
  free(t);
}

st_status st_sharding_assemble(const st_mesh* m, const st_tensor_type* g, const st_sharding* sh, const void* const* shards,
                               void* dst, size_t dst_size) {
  assert(m && g && sh && shards && dst); /* a caller's bug, not bad input */
  st_sharded t = {.mesh = *m, .global = *g, .sharding = *sh};
  ST_RETURN(st_sharding_local_type(m, g, sh, &t.local));
  if (dst_size != st_tensor_type_bytes(g))
    return st_status_make(ST_CODE_INTERNAL, "sharded tensor: destination has %zu bytes, the tensor %zu", dst_size,
                          st_tensor_type_bytes(g));
  const st_dtype dt = g->dtype;
  if (sh->partial && dt != ST_DTYPE_F32 && dt != ST_DTYPE_F64 && dt != ST_DTYPE_S32)
    return st_status_make(ST_CODE_RUNTIME, "sharded tensor: cannot sum partial shards of %s on the host", st_dtype_name(dt));
  memset(dst, 0, dst_size);
  const uint32_t repl = st__replicated_axes(&t);
  for (int p = 0; p < m->device_count; ++p) {
    if (!st__is_first(&t, p, repl)) continue;
    st__copy_ctx c = {.dst = dst, .src = shards[p], .es = st_dtype_size(dt), .to_global = true, .add = sh->partial != 0,
                      .dtype = dt};
    st__for_runs(&t, p, st__copy_run, &c);
  }
  return ST_OK;
}

st_status st_sharding_to_host(const st_mesh* m, const st_tensor_type* g, const st_sharding* sh,
                              st_buffer* const* shards, void* dst, size_t dst_size) {
  assert(m && g && sh && shards); /* a caller's bug, not bad input */
  st_sharded t = {.mesh = *m, .global = *g, .sharding = *sh, .shards = (st_buffer**)shards};
  ST_RETURN(st_sharding_local_type(m, g, sh, &t.local));
  for (int p = 0; p < m->device_count; ++p)
    assert(shards[p]); /* a caller's bug, not bad input */
  return st_sharded_to_host(&t, dst, dst_size);
}

void st_sharded_destroy(st_sharded* t) {
  if (!t) return;
  for (int p = 0; p < t->mesh.device_count; ++p) st_buffer_destroy(t->shards[p]);
  free(t->shards);
  free(t);
}

st_status st_program_execute_sharded(st_program* prog, st_sharded* const* inputs, int input_count,
                                     const st_tensor_type* out_global, const st_sharding* out_shardings,
                                     st_sharded** outputs, int output_count, st_event** out_done) {
  if (outputs)
    for (int i = 0; i < output_count; ++i) outputs[i] = NULL;
  if (!prog || prog->mesh_device_count <= 0)
    return st_status_make(ST_CODE_RUNTIME, "st_program_execute_sharded: '%s' is not an SPMD program",
                          prog ? prog->name : "(null)");
  if (input_count < 0 || (input_count > 0 && !inputs) || output_count < 0 ||
      (output_count > 0 && (!outputs || !out_global || !out_shardings)))
    return st_status_make(ST_CODE_INTERNAL, "program '%s': bad sharded argument lists", prog->name);
  int n = prog->mesh_device_count;
  for (int i = 0; i < input_count; ++i) {
    const st_sharded* t = inputs[i];
    if (!t) return st_status_make(ST_CODE_RUNTIME, "program '%s': input %d is NULL", prog->name, i);
    bool same = t->mesh.device_count == n;
    for (int p = 0; same && p < n; ++p) same = t->mesh.devices[p] == prog->mesh_devices[p];
    if (!same)
      return st_status_make(ST_CODE_RUNTIME, "program '%s': input %d lies on another mesh than the program's",
                            prog->name, i);
  }
  st_buffer** in = st_xcalloc((size_t)n * (size_t)input_count + 1, sizeof(*in));
  st_buffer** out = st_xcalloc((size_t)n * (size_t)output_count + 1, sizeof(*out));
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < input_count; ++i) in[(size_t)p * (size_t)input_count + (size_t)i] = inputs[i]->shards[p];
  st_status s = st_program_execute_spmd(prog, in, input_count, out, output_count, out_done);
  free(in);
  const st_mesh* m = input_count > 0 ? &inputs[0]->mesh : NULL;
  st_mesh made;
  if (!s && !m) { /* no inputs: the program's devices as a one-axis mesh */
    const char* name = "devices";
    s = st_mesh_make(1, &name, &n, prog->mesh_devices, &made);
    m = &made;
  }
  st_buffer** shards = st_xcalloc((size_t)n + 1, sizeof(*shards));
  for (int i = 0; i < output_count && !s; ++i) {
    for (int p = 0; p < n; ++p) {
      shards[p] = out[(size_t)p * (size_t)output_count + (size_t)i];
      out[(size_t)p * (size_t)output_count + (size_t)i] = NULL;
    }
    st_status w = st_sharded_wrap(prog->rt, m, &out_global[i], &out_shardings[i], shards, &outputs[i]);
    if (w) {
      s = st_status_make(st_status_code(w), "program '%s': output %d: %s", prog->name, i, st_status_message(w));
      st_status_free(w);
    }
  }
  free(shards);
  for (int i = 0; i < n * output_count; ++i) st_buffer_destroy(out[i]);
  free(out);
  if (s) {
    for (int i = 0; i < output_count; ++i) {
      st_sharded_destroy(outputs[i]);
      outputs[i] = NULL;
    }
    if (out_done)
      for (int p = 0; p < n; ++p) {
        st_event_destroy(out_done[p]);
        out_done[p] = NULL;
      }
  }
  return s;
}
