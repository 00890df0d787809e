/* runtime.c — plugin discovery and loading, the PJRT client, devices, facts
 * and counters, and the plugin-error -> st_status bridge. */
#include <assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/rt_internal.h"

/*===-------------------------------------------------------------------===*/
/* Small helpers                                                            */
/*===-------------------------------------------------------------------===*/


char* st__sprintf(const char* fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char* p = st_xmalloc(n < 0 ? 1 : (size_t)n + 1);
  if (n < 0) p[0] = '\0'; /* an encoding error: nothing sensible to show */
  else vsnprintf(p, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return p;
}


/*===-------------------------------------------------------------------===*/
/* Plugin errors                                                            */
/*===-------------------------------------------------------------------===*/

void st__pj_error_free(const pj_api* api, pj_error* error) {
  if (!error) return;
  pj_error_destroy_args a = {.struct_size = sizeof(a), .error = error};
  api->error_destroy(&a);
}

char* st__pj_message(const pj_api* api, const pj_error* error) {
  if (!error) return st_xstrdup("");
  pj_error_message_args a = {.struct_size = sizeof(a), .error = error};
  api->error_message(&a);
  return st_xstrndup(a.message ? a.message : "", a.message ? a.message_size : 0);
}

st_status st__pj_status(const pj_api* api, pj_error* error, const char* fmt, ...) {
  if (!error) return ST_OK;
  char* msg = st__pj_message(api, error);
  char context[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(context, sizeof(context), fmt, ap);
  va_end(ap);
  /* RESOURCE_EXHAUSTED (absl code 8): a buffer the plugin could not
   * allocate is out of memory, which `strata run` does not restart. */
  int code = 0;
  if (offsetof(pj_api, error_get_code) < api->struct_size && api->error_get_code) {
    pj_error_code_args ca = {.struct_size = sizeof(ca), .error = error};
    pj_error* ce = api->error_get_code(&ca);
    if (ce) st__pj_error_free(api, ce);
    else code = ca.code;
  }
  st_status s = st_status_make(code == PJ_CODE_RESOURCE_EXHAUSTED ? ST_CODE_MEMORY : ST_CODE_RUNTIME, "%s: %s", context, msg ? msg : "(no message)");
  free(msg);
  st__pj_error_free(api, error);
  return s;
}

void st__pj_event_free(const pj_api* api, pj_event* event) {
  if (!event) return;
  pj_event_args a = {.struct_size = sizeof(a), .event = event};
  st__pj_error_free(api, api->event_destroy(&a));
}

/*===-------------------------------------------------------------------===*/
/* Discovery                                                                */
/*===-------------------------------------------------------------------===*/

/* Growing text of the places searched, for the not-found message. */
typedef struct {
  char buf[4096];
  size_t n;
} st__searched;

static void st__searched_add(st__searched* s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void st__searched_add(st__searched* s, const char* fmt, ...) {
  if (s->n >= sizeof(s->buf) - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(s->buf + s->n, sizeof(s->buf) - s->n, fmt, ap);
  va_end(ap);
  if (k > 0) s->n += (size_t)k;
  if (s->n >= sizeof(s->buf)) s->n = sizeof(s->buf) - 1;
}

static bool st__rt_is_file(const char* path) {
  struct stat st;
  return path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The last existing file matching |pattern|: glob sorts its matches, so
 * with several python3.N folders the highest-sorting one wins. */
static char* st__glob_last(const char* pattern) {
  glob_t g;
  memset(&g, 0, sizeof(g));
  char* found = NULL;
  if (glob(pattern, 0, NULL, &g) == 0) {
    for (size_t i = g.gl_pathc; i-- > 0;) {
      if (st__rt_is_file(g.gl_pathv[i])) {
        found = st_xstrdup(g.gl_pathv[i]);
        break;
      }
    }
  }
  globfree(&g);
  return found;
}

/* The Python-wheel layouts strata knows, relative to a virtualenv. The
 * first is lammps-jax-pjrt-cpu (checked); the second is a best guess at the
 * xla-cpu-pjrt wheel (any *pjrt*.so inside its package folder). */
static const char* const kVenvLayouts[] = {
    "lib/python3*/site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
    "lib/python3*/site-packages/xla_cpu_pjrt/*pjrt*.so",
};

static char* st__search_venv(const char* venv, st__searched* searched) {
  for (size_t i = 0; i < sizeof(kVenvLayouts) / sizeof(kVenvLayouts[0]); ++i) {
    char pattern[PATH_MAX];
    snprintf(pattern, sizeof(pattern), "%s/%s", venv, kVenvLayouts[i]);
    st__searched_add(searched, "\n  %s", pattern);
    char* hit = st__glob_last(pattern);
    if (hit) return hit;
  }
  return NULL;
}

/* The virtualenv of $STRATA_PYTHON (V/bin/python -> V), or NULL. The path
 * is not resolved: a venv's python is a symlink out of the venv. */
static char* st__python_venv(void) {
  const char* py = getenv("STRATA_PYTHON");
  if (!py || !py[0]) return NULL;
  char* v = st_xstrdup(py);
  for (int up = 0; up < 2; ++up) {
    char* slash = strrchr(v, '/');
    if (!slash) {
      free(v);
      return NULL;
    }
    *slash = '\0';
  }
  if (!v[0]) {
    free(v);
    return NULL;
  }
  return v;
}

/* Finds the plugin file. Explicit settings (config, then environment) are
 * final: when set but missing, that is the error, so a typo never silently
 * falls back to another plugin. */
static st_status st__find_plugin(const st_runtime_options* o, char** out_path) {
  *out_path = NULL;
  if (o->plugin_path && o->plugin_path[0]) {
    if (!st__rt_is_file(o->plugin_path))
      return st_status_make(ST_CODE_RUNTIME,
                            "PJRT plugin not found: runtime.plugin=%s does not name a file "
                            "(set runtime.plugin=PATH to an existing pjrt_c_api_*_plugin.so)",
                            o->plugin_path);
    *out_path = st_xstrdup(o->plugin_path);
    return ST_OK;
  }
  const char* env = getenv("STRATA_PJRT_PLUGIN");
  if (env && env[0]) {
    if (!st__rt_is_file(env))
      return st_status_make(ST_CODE_RUNTIME,
                            "PJRT plugin not found: STRATA_PJRT_PLUGIN=%s does not name a file "
                            "(set STRATA_PJRT_PLUGIN or runtime.plugin=PATH to an existing plugin)",
                            env);
    *out_path = st_xstrdup(env);
    return ST_OK;
  }
  st__searched searched = {.n = 0};
  st__searched_add(&searched, "\n  runtime.plugin (not set)\n  $STRATA_PJRT_PLUGIN (not set)");
  char cwd[PATH_MAX];
  const char* cwd_ok = getcwd(cwd, sizeof(cwd));
  char* hit = st__search_venv(".venv", &searched);
  if (!hit) {
    /* The venv of the exporter's Python: an installed strata whose plugin
     * came with the front-end's environment (docs/install.md). */
    char* venv = st__python_venv();
    if (venv) hit = st__search_venv(venv, &searched);
    free(venv);
  }
  if (!hit) {
    /* The repository's own .venv; STRATA_SOURCE_DIR in the environment
     * replaces the compiled-in path (relocated trees, tests). */
    const char* src = st_source_dir();
    if (src[0]) {
      char* venv = st__sprintf("%s/.venv", src);
      hit = st__search_venv(venv, &searched);
      free(venv);
    }
  }
  if (hit && cwd_ok && hit[0] != '/') {
    /* Keep an absolute path: the cwd may change before cache keys use it. */
    char* abs = st__sprintf("%s/%s", cwd, hit);
    free(hit);
    hit = abs;
  }
  if (hit) {
    *out_path = hit;
    return ST_OK;
  }
  return st_status_make(ST_CODE_RUNTIME,
                        "no PJRT plugin found (current directory %s). Searched:%s\n"
                        "To fix: set runtime.plugin=PATH or STRATA_PJRT_PLUGIN=PATH to a PJRT plugin "
                        "(e.g. pjrt_c_api_cpu_plugin.so), or run `make setup` to install the CPU plugin in .venv",
                        cwd_ok ? cwd : "?", searched.buf);
}

void st_runtime_guess_platform(const st_runtime_options* o, char* platform, size_t platform_size, char* basis,
                               size_t basis_size) {
  bool explicit_path = (o->plugin_path && o->plugin_path[0]) || (getenv("STRATA_PJRT_PLUGIN") && getenv("STRATA_PJRT_PLUGIN")[0]);
  char* path = NULL;
  st_status s = st__find_plugin(o, &path);
  if (s) {
    st_status_free(s);
    snprintf(platform, platform_size, "cpu");
    snprintf(basis, basis_size, "no PJRT plugin found; assumed the CPU plugin strata searches for");
    return;
  }
  if (!explicit_path) {
    snprintf(platform, platform_size, "cpu");
    snprintf(basis, basis_size, "the CPU plugin found in a virtualenv (%s)", path);
    free(path);
    return;
  }
  const char* base = strrchr(path, '/');
  base = base ? base + 1 : path;
  char low[256];
  size_t n = 0;
  for (; base[n] && n + 1 < sizeof(low); ++n) low[n] = (char)((base[n] >= 'A' && base[n] <= 'Z') ? base[n] + 32 : base[n]);
  low[n] = '\0';
  /* The first name the file name carries; cpu last, so that a name like
   * "cuda_cpu_fallback" does not pass for a CPU plugin. */
  static const char* const kNames[] = {"cuda", "rocm", "gpu", "tpu", "cpu"};
  const char* guess = "unknown";
  for (size_t i = 0; i < sizeof(kNames) / sizeof(kNames[0]); ++i)
    if (strstr(low, kNames[i])) {
      guess = kNames[i];
      break;
    }
  snprintf(platform, platform_size, "%s", guess);
  snprintf(basis, basis_size, "the file name of the configured plugin %s", path);
  free(path);
}

/*===-------------------------------------------------------------------===*/
/* Loading                                                                  */
/*===-------------------------------------------------------------------===*/

/* Plugins loaded by this process, by path: PJRT_Plugin_Initialize runs once
 * per plugin, and dlclose is never called (plugins keep threads and
 * registries that do not survive unloading). */
typedef struct {
  char* path;
  const pj_api* api;
} st__loaded_plugin;

/* Host allocator policy. XLA's CPU client allocates every program's outputs
 * and its temporary buffer with malloc on the executing (worker) thread.
 * glibc serves those from per-thread arenas, whose heaps cannot grow past
 * 64 MiB, and from fresh mmaps above the dynamic mmap threshold; freed, they
 * go back to the kernel (munmap, heap trim). The next launch faults the same
 * amount in again and the kernel zeroes every page: measured with the
 * small preset on 2 cores, 260k minor faults and 0.5 s of system CPU per
 * 1.6 s step (docs/performance.md). One arena with no mmap/trim below 1 GiB
 * keeps the freed blocks for reuse: ~0 faults per step, at the price of RSS
 * staying at its high-water mark (the step needs that memory again anyway). */
bool st__malloc_tuning_wanted(bool option, const char* strata_malloc_tuning, const char* glibc_tunables,
                              bool malloc_env_set) {
  if (!option || malloc_env_set) return false;
  if (strata_malloc_tuning && !strcmp(strata_malloc_tuning, "0")) return false;
  if (glibc_tunables && strstr(glibc_tunables, "glibc.malloc.")) return false; /* the user's own policy */
  return true;
}

/* Whether st__tune_host_malloc set the policy in this process. */
static _Atomic bool g_malloc_tuned;

bool st_runtime_malloc_tuned(void) { return atomic_load(&g_malloc_tuned); }

void st_runtime_release_host_memory(void) {
#if defined(__GLIBC__)
  /* Not only the heap's top: malloc_trim also gives back the free pages
   * inside it (madvise), which the 1 GiB trim threshold never does. */
  malloc_trim(0);
#endif
}

static void st__tune_host_malloc(bool option) {
  bool env = getenv("MALLOC_ARENA_MAX") || getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_") ||
             getenv("MALLOC_TOP_PAD_");
  if (!st__malloc_tuning_wanted(option, getenv("STRATA_MALLOC_TUNING"), getenv("GLIBC_TUNABLES"), env)) return;
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ST__ASAN 1
#endif
#endif
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(ST__ASAN)
  /* Before the client starts its threads: M_ARENA_MAX only limits arenas
   * created from now on. Under ASan the sanitizer's allocator is in charge. */
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  atomic_store(&g_malloc_tuned, true);
#endif
}

static pthread_mutex_t g_plugins_mu = PTHREAD_MUTEX_INITIALIZER;
static st__loaded_plugin g_plugins[8];
static int g_plugin_count;

static st_status st__load_plugin_locked(const char* path, const pj_api** out_api) {
  *out_api = NULL;
  char real[PATH_MAX];
  const char* key = realpath(path, real) ? real : path;
  for (int i = 0; i < g_plugin_count; ++i) {
    if (!strcmp(g_plugins[i].path, key)) {
      *out_api = g_plugins[i].api;
      return ST_OK;
    }
  }
  dlerror();
  /* XLA's INFO lines ("cpu_device_count set via create_options") would
   * interleave with strata's own output on every run. Keep warnings and
   * errors; a user who wants the INFO lines sets TF_CPP_MIN_LOG_LEVEL=0
   * (we never overwrite a value already set). Read once, at plugin load. */
  setenv("TF_CPP_MIN_LOG_LEVEL", "1", 0);
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    return st_status_make(ST_CODE_RUNTIME, "cannot load PJRT plugin %s: %s", path, why ? why : "dlopen failed");
  }
  dlerror();
  void* sym = dlsym(handle, "GetPjrtApi");
  if (!sym) {
    /* Deliberately not dlclosed: some libraries misbehave when unloaded. */
    return st_status_make(ST_CODE_RUNTIME, "%s is not a PJRT plugin: it has no GetPjrtApi symbol", path);
  }
  pj_get_api_fn get_api;
  memcpy(&get_api, &sym, sizeof(get_api)); /* object -> function pointer */
  const pj_api* api = get_api();
  if (!api) return st_status_make(ST_CODE_RUNTIME, "PJRT plugin %s: GetPjrtApi returned NULL", path);
  if (api->struct_size < offsetof(pj_api, error_destroy))
    return st_status_make(ST_CODE_RUNTIME, "PJRT plugin %s: implausible API table size %zu", path, api->struct_size);
  int major = api->version.major, minor = api->version.minor;
  if (major != PJ_ABI_MAJOR || minor < PJ_ABI_MIN_MINOR)
    return st_status_make(ST_CODE_RUNTIME,
                          "PJRT plugin %s has C API version %d.%d; strata needs %d.%d or a later 0.x "
                          "(use a plugin built from a newer XLA, e.g. lammps-jax-pjrt-cpu>=0.11.2)",
                          path, major, minor, PJ_ABI_MAJOR, PJ_ABI_MIN_MINOR);
  /* Every slot strata calls must be inside the plugin's table. */
  if (api->struct_size < PJ_SIZE(pj_api, buffer_ready_event))
    return st_status_make(ST_CODE_RUNTIME,
                          "PJRT plugin %s (API %d.%d): function table too short (%zu bytes, need %zu)", path,
                          major, minor, api->struct_size, PJ_SIZE(pj_api, buffer_ready_event));
  pj_plugin_init_args ia = {.struct_size = sizeof(ia)};
  st_status s = st__pj_status(api, api->plugin_initialize(&ia), "PJRT plugin %s: initialization failed", path);
  if (s) return s;
  if (g_plugin_count < (int)(sizeof(g_plugins) / sizeof(g_plugins[0]))) {
    char* copy = st_xstrdup(key);
    if (copy) {
      g_plugins[g_plugin_count].path = copy;
      g_plugins[g_plugin_count].api = api;
      ++g_plugin_count;
    }
  }
  *out_api = api;
  return ST_OK;
}

static st_status st__load_plugin(const char* path, bool tune_malloc, const pj_api** out_api) {
  pthread_mutex_lock(&g_plugins_mu);
  if (g_plugin_count == 0) st__tune_host_malloc(tune_malloc); /* before any plugin thread exists */
  st_status s = st__load_plugin_locked(path, out_api);
  pthread_mutex_unlock(&g_plugins_mu);
  return s;
}

/*===-------------------------------------------------------------------===*/
/* Client                                                                   */
/*===-------------------------------------------------------------------===*/

void st_runtime_options_init(st_runtime_options* options) {
  if (!options) return;
  memset(options, 0, sizeof(*options));
  options->cpu_devices = 2;
  options->tune_host_malloc = true;
}

static st_status st__read_attributes(st_runtime* rt) {
  const pj_api* api = rt->api;
  pj_plugin_attrs_args a = {.struct_size = sizeof(a)};
  st_status s = st__pj_status(api, api->plugin_attributes(&a), "PJRT plugin %s: reading attributes", rt->plugin_path);
  if (s) return s;
  for (size_t i = 0; i < a.num_attrs; ++i) {
    const pj_named_value* v = &a.attrs[i];
    if (!v->name || v->name_size != strlen("xla_version") || memcmp(v->name, "xla_version", v->name_size)) continue;
    free(rt->xla_version);
    if (v->type == PJ_NV_STRING)
      rt->xla_version = st_xstrndup(v->v.s ? v->v.s : "", v->v.s ? v->value_size : 0);
    else if (v->type == PJ_NV_INT64)
      rt->xla_version = st__sprintf("%lld", (long long)v->v.i64);
    else
      rt->xla_version = st_xstrdup("");
  }
  if (!rt->xla_version) rt->xla_version = st_xstrdup("");
  return ST_OK;
}

static st_status st__client_string(st_runtime* rt, bool version, char** out) {
  const pj_api* api = rt->api;
  pj_client_string_args a = {.struct_size = sizeof(a), .client = rt->client};
  pj_error* e = version ? api->client_platform_version(&a) : api->client_platform_name(&a);
  ST_RETURN(st__pj_status(api, e, "PJRT client: reading platform %s", version ? "version" : "name"));
  *out = st_xstrndup(a.str ? a.str : "", a.str ? a.str_size : 0);
  return ST_OK;
}

static st_status st__read_devices(st_runtime* rt) {
  const pj_api* api = rt->api;
  pj_client_devices_args a = {.struct_size = sizeof(a), .client = rt->client};
  ST_RETURN(st__pj_status(api, api->client_addressable_devices(&a), "PJRT client: listing addressable devices"));
  if (a.num_devices == 0) return st_status_make(ST_CODE_RUNTIME, "PJRT plugin %s has no addressable devices", rt->plugin_path);
  rt->devices = st_xcalloc(a.num_devices, sizeof(*rt->devices));
  rt->device_count = (int)a.num_devices;
  for (size_t i = 0; i < a.num_devices; ++i) {
    st__device* d = &rt->devices[i];
    d->handle = a.devices[i];
    pj_device_desc_args da = {.struct_size = sizeof(da), .device = d->handle};
    ST_RETURN(st__pj_status(api, api->device_get_description(&da), "device %zu: description", i));
    pj_desc_id_args ia = {.struct_size = sizeof(ia), .desc = da.desc};
    ST_RETURN(st__pj_status(api, api->desc_id(&ia), "device %zu: id", i));
    d->id = ia.id;
    pj_desc_string_args ka = {.struct_size = sizeof(ka), .desc = da.desc};
    ST_RETURN(st__pj_status(api, api->desc_kind(&ka), "device %zu: kind", i));
    d->kind = st_xstrndup(ka.str ? ka.str : "", ka.str ? ka.str_size : 0);
    pj_desc_string_args ta = {.struct_size = sizeof(ta), .desc = da.desc};
    ST_RETURN(st__pj_status(api, api->desc_to_string(&ta), "device %zu: description", i));
    d->description = st_xstrndup(ta.str ? ta.str : "", ta.str ? ta.str_size : 0);

    pj_device_memories_args ma = {.struct_size = sizeof(ma), .device = d->handle};
    ST_RETURN(st__pj_status(api, api->device_addressable_memories(&ma), "device %zu: memory spaces", i));
    pj_device_default_memory_args dm = {.struct_size = sizeof(dm), .device = d->handle};
    pj_error* e = api->device_default_memory(&dm);
    /* Some plugins have no default memory; that is not fatal. */
    st__pj_error_free(api, e);
    if (e) dm.memory = NULL;
    d->default_memory = 0;
    for (size_t j = 0; j < ma.num_memories && j < ST__MAX_MEMORIES; ++j) {
      pj_memory_kind_args mk = {.struct_size = sizeof(mk), .memory = ma.memories[j]};
      ST_RETURN(st__pj_status(api, api->memory_kind(&mk), "device %zu: memory %zu kind", i, j));
      d->memory_kinds[j] = st_xstrndup(mk.kind ? mk.kind : "", mk.kind ? mk.kind_size : 0);
      d->memories[j] = ma.memories[j];
      d->memory_count = (int)j + 1;
      if (ma.memories[j] == dm.memory) d->default_memory = (int)j;
    }
  }
  return ST_OK;
}

static void st__plugin_file_facts(st_runtime* rt) {
  struct stat st;
  if (stat(rt->plugin_path, &st) == 0) {
    rt->plugin_size = (int64_t)st.st_size;
    rt->plugin_mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
  }
}

/* Creates the client. The CPU plugin takes `cpu_device_count`; other
 * plugins may reject it, so a creation that fails naming the option is
 * retried without it. A client across processes (rt->kv) also gets
 * node_id and num_nodes and the key-value callbacks: the plugin then
 * exchanges its topology with the other processes inside this call, which
 * returns once all of them have made theirs (or fails when one does not
 * come within the plugin's own timeout).
 *
 * Deterministic mode pins the CPU intra-op pool to one thread by setting
 * PJRT_NPROC=1 for the duration of the create call (the CPU client sizes its
 * pool from it at creation), then restores the previous value. */
static pj_error* st__try_create(st_runtime* rt, const pj_named_value* opts, size_t n, pj_client** out) {
  pj_client_create_args a = {.struct_size = sizeof(a), .options = n ? opts : NULL, .num_options = n};
  if (rt->kv.put) {
    a.kv_get = st__pjrt_kv_get;
    a.kv_get_user = &rt->kv;
    a.kv_put = st__pjrt_kv_put;
    a.kv_put_user = &rt->kv;
    a.kv_try_get = st__pjrt_kv_try_get;
    a.kv_try_get_user = &rt->kv;
  }
  pj_error* e = rt->api->client_create(&a);
  *out = e ? NULL : a.client;
  return e;
}

static pj_named_value st__int_option(const char* name, int64_t value) {
  pj_named_value v = {.struct_size = sizeof(v), .name = name, .name_size = strlen(name), .type = PJ_NV_INT64};
  v.v.i64 = value;
  v.value_size = 1;
  return v;
}

static st_status st__create_client(st_runtime* rt, const st_runtime_options* o) {
  const pj_api* api = rt->api;
  pj_named_value opts[3];
  size_t n = 0;
  opts[n++] = st__int_option("cpu_device_count", o->cpu_devices > 0 ? o->cpu_devices : 2);
  if (rt->kv.put) {
    opts[n++] = st__int_option("node_id", rt->kv.node_id);
    opts[n++] = st__int_option("num_nodes", rt->kv.num_nodes);
  }

  char* saved_nproc = NULL;
  if (rt->deterministic) {
    const char* cur = getenv("PJRT_NPROC");
    if (cur) saved_nproc = st_xstrdup(cur);
    setenv("PJRT_NPROC", "1", 1);
  }
  pj_error* e = st__try_create(rt, opts, n, &rt->client);
  if (e) {
    char* msg = st__pj_message(api, e);
    if (msg && strstr(msg, "cpu_device_count")) {
      st__pj_error_free(api, e);
      e = st__try_create(rt, opts + 1, n - 1, &rt->client);
    }
    free(msg);
  }
  if (rt->deterministic) {
    if (saved_nproc)
      setenv("PJRT_NPROC", saved_nproc, 1);
    else
      unsetenv("PJRT_NPROC");
    free(saved_nproc);
  }
  if (rt->kv.put)
    return st__pj_status(api, e, "PJRT plugin %s: creating one client across %d processes (this one node %d)",
                         rt->plugin_path, rt->kv.num_nodes, rt->kv.node_id);
  return st__pj_status(api, e, "PJRT plugin %s: creating the client", rt->plugin_path);
}

/* XLA checks option overrides only when compiling. A tiny probe compile at
 * creation reports a misspelled or mistyped runtime.xla_options entry right
 * away, naming it, instead of at the first real program. The probe is not
 * counted in the stats (it is not a user program). */
static st_status st__validate_overrides(st_runtime* rt) {
  static const char kProbe[] =
      "module @strata_option_probe {\n"
      "  func.func public @main(%arg0: tensor<f32>) -> tensor<f32> {\n"
      "    return %arg0 : tensor<f32>\n"
      "  }\n"
      "}\n";
  pj_program prog = {.struct_size = sizeof(prog), .code = kProbe, .code_size = sizeof(kProbe) - 1,
                     .format = "mlir", .format_size = 4};
  pj_compile_args a = {.struct_size = sizeof(a), .client = rt->client, .program = &prog,
                       .options = (const char*)rt->compile_options, .options_size = rt->compile_options_size};
  pj_error* e = rt->api->client_compile(&a);
  if (e) return st__pj_status(rt->api, e, "runtime.xla_options rejected by XLA");
  pj_loaded_args d = {.struct_size = sizeof(d), .executable = a.executable};
  st__pj_error_free(rt->api, rt->api->loaded_destroy(&d));
  return ST_OK;
}

#define ST__AUTOTUNE_OPTION "xla_gpu_per_fusion_autotune_cache_dir"

/* A GPU plugin autotunes every fusion of every program it compiles (which
 * kernel, which tiling), and strata's per-layer programs repeat the same
 * fusions across programs (a block's forward inside its backward, every
 * layer kind's matmuls): the first GPU run spent most of its 92 s cold
 * start there (docs/performance.md, "GPU"). XLA keeps those results in a
 * per-fusion cache directory when asked, shared by the programs of a run
 * and by later runs (the executable cache only helps an identical program),
 * so with runtime.cache_dir a GPU plugin gets <cache_dir>/xla_autotune
 * unless runtime.xla_options names one. A CPU plugin does not autotune: its
 * options stay as they were, byte for byte (they are in every cache key). */
st_status st__gpu_compile_defaults(st_runtime* rt, const st_runtime_options* o) {
  if (!rt->platform_name || !strcmp(rt->platform_name, "cpu")) return ST_OK;
  const size_t n = strlen(ST__AUTOTUNE_OPTION);
  for (int i = 0; i < o->xla_option_count; ++i) {
    const char* v = o->xla_options[i];
    while (*v == ' ') ++v;
    if (!strncmp(v, ST__AUTOTUNE_OPTION, n) && strchr(v, '=')) {
      const char* val = strchr(v, '=') + 1;
      while (*val == ' ') ++val;
      free(rt->autotune_dir);
      rt->autotune_dir = st_xstrdup(val); /* the user's, the last one given */
    }
  }
  if (rt->autotune_dir || !rt->cache_dir) return ST_OK;
  char* dir = st_path_join(rt->cache_dir, "xla_autotune");
  st_status s = st_fs_mkdirs(dir);
  if (s) { /* no directory, no cache: compiling still works */
    fprintf(stderr, "strata: warning: XLA autotuning cache %s: %s\n", dir, st_status_message(s));
    st_status_free(s);
    free(dir);
    return ST_OK;
  }
  const char** opts = st_xcalloc((size_t)o->xla_option_count + 2, sizeof(char*));
  for (int i = 0; i < o->xla_option_count; ++i) opts[i] = o->xla_options[i];
  st_strbuf eb = {0};
  st_strbuf_printf(&eb, "%s=%s", ST__AUTOTUNE_OPTION, dir);
  char* extra = st_strbuf_take(&eb);
  opts[o->xla_option_count] = extra;
  uint8_t* bytes = NULL;
  size_t size = 0;
  s = st__compile_options_build(opts, o->xla_option_count + 1, o->deterministic, &bytes, &size);
  free(extra);
  free(opts);
  if (s) {
    free(dir);
    return s;
  }
  free(rt->compile_options);
  rt->compile_options = bytes;
  rt->compile_options_size = size;
  rt->autotune_dir = dir;
  return ST_OK;
}


st_status st_runtime_create(const st_runtime_options* options, st_runtime** out_runtime) {
  assert(out_runtime); /* a caller's bug, not bad input */
  *out_runtime = NULL;
  st_runtime_options defaults;
  if (!options) {
    st_runtime_options_init(&defaults);
    options = &defaults;
  }
  if (options->cpu_devices < 0 || options->cpu_devices > 4096)
    return st_status_make(ST_CODE_CONFIG, "runtime.cpu_devices=%d is out of range (1..4096)", options->cpu_devices);
  if (options->xla_option_count < 0 || (options->xla_option_count > 0 && !options->xla_options))
    return st_status_make(ST_CODE_CONFIG, "runtime.xla_options: bad option list");
  if (options->compile_threads < 0 || options->compile_threads > 1024)
    return st_status_make(ST_CODE_CONFIG, "runtime.compile_threads=%d is out of range (0..1024; 0: one per CPU)",
                          options->compile_threads);
  const st_runtime_kv* kv = &options->kv;
  if ((kv->put || kv->get || kv->try_get) &&
      (!kv->put || !kv->get || !kv->try_get || kv->num_nodes < 1 || kv->node_id < 0 || kv->node_id >= kv->num_nodes))
    return st_status_make(ST_CODE_INTERNAL,
                          "st_runtime_create: a key-value store needs put, get and try_get and 0 <= node_id (%d) < "
                          "num_nodes (%d)",
                          kv->node_id, kv->num_nodes);

  st_runtime* rt = st_xcalloc(1, sizeof(*rt));
  rt->deterministic = options->deterministic;
  rt->compile_threads = options->compile_threads;
  rt->progress = options->progress;
  if (options->kv.put) rt->kv = options->kv;
  st_status s = st__find_plugin(options, &rt->plugin_path);
  /* Options are validated before the plugin is touched, so a typo in an XLA
   * option is reported even when the plugin is slow to load. */
  if (!s)
    s = st__compile_options_build(options->xla_options, options->xla_option_count, options->deterministic,
                                  &rt->compile_options, &rt->compile_options_size);
  if (!s && options->cache_dir && options->cache_dir[0]) {
    rt->cache_dir = st_xstrdup(options->cache_dir);
    rt->keep_optimized_hlo = options->keep_optimized_hlo;
  }
  if (!s) s = st__load_plugin(rt->plugin_path, options->tune_host_malloc, &rt->api);
  if (!s) {
    rt->api_major = rt->api->version.major;
    rt->api_minor = rt->api->version.minor;
    st__plugin_file_facts(rt);
    s = st__read_attributes(rt);
  }
  if (!s) s = st__register_ffi_targets(rt, options);
  if (!s) s = st__create_client(rt, options);
  if (!s) s = st__client_string(rt, false, &rt->platform_name);
  if (!s) s = st__client_string(rt, true, &rt->platform_version);
  if (!s) s = st__read_devices(rt);
  if (!s) s = st__gpu_compile_defaults(rt, options);
  if (!s && (options->xla_option_count > 0 || options->deterministic)) s = st__validate_overrides(rt);
  if (s) {
    st_runtime_destroy(rt);
    return s;
  }
  *out_runtime = rt;
  return ST_OK;
}

void st_runtime_destroy(st_runtime* rt) {
  if (!rt) return;
  if (rt->client) {
    pj_client_args a = {.struct_size = sizeof(a), .client = rt->client};
    st__pj_error_free(rt->api, rt->api->client_destroy(&a));
  }
  for (int i = 0; i < rt->device_count; ++i) {
    st__device* d = &rt->devices[i];
    free(d->kind);
    free(d->description);
    for (int j = 0; j < d->memory_count; ++j) free(d->memory_kinds[j]);
  }
  free(rt->devices);
  free(rt->plugin_path);
  free(rt->platform_name);
  free(rt->platform_version);
  free(rt->xla_version);
  free(rt->cache_dir);
  free(rt->autotune_dir);
  free(rt->compile_options);
  for (int i = 0; i < rt->ffi_target_count; ++i) free(rt->ffi_targets[i]);
  free(rt->ffi_targets);
  free(rt);
}

void st_runtime_get_info(const st_runtime* rt, st_runtime_info* out) {
  if (!out) return;
  memset(out, 0, sizeof(*out));
  if (!rt) return;
  out->plugin_path = rt->plugin_path;
  out->platform_name = rt->platform_name;
  out->platform_version = rt->platform_version;
  out->xla_version = rt->xla_version;
  out->api_major = rt->api_major;
  out->api_minor = rt->api_minor;
  out->device_count = rt->device_count;
  out->autotune_cache_dir = rt->autotune_dir ? rt->autotune_dir : "";
}

st_status st_runtime_device_info(const st_runtime* rt, int device, st_device_info* out) {
  assert(rt && out); /* a caller's bug, not bad input */
  memset(out, 0, sizeof(*out));
  if (device < 0 || device >= rt->device_count)
    return st_status_make(ST_CODE_RUNTIME, "device %d does not exist (the runtime has %d device%s)", device,
                          rt->device_count, rt->device_count == 1 ? "" : "s");
  const st__device* d = &rt->devices[device];
  out->id = d->id;
  out->kind = d->kind;
  out->description = d->description;
  out->memory_count = d->memory_count;
  for (int j = 0; j < d->memory_count; ++j) out->memory_kinds[j] = d->memory_kinds[j];
  out->default_memory = d->default_memory;
  return ST_OK;
}

int64_t st_runtime_device_memory(const st_runtime* rt, int device) {
  if (!rt || device < 0 || device >= rt->device_count) return 0;
  const pj_api* api = rt->api;
  /* An older plugin's table may end before the slot. */
  if (offsetof(pj_api, device_memory_stats) >= api->struct_size || !api->device_memory_stats) return 0;
  pj_device_memory_stats_args ms = {.struct_size = sizeof(ms), .device = rt->devices[device].handle};
  pj_error* e = api->device_memory_stats(&ms);
  if (e) {
    /* Unimplemented (the CPU plugin) or refused: not reported. */
    st__pj_error_free(api, e);
    return 0;
  }
  return ms.bytes_limit_is_set && ms.bytes_limit > 0 ? ms.bytes_limit : 0;
}

bool st_runtime_device_memory_is_host(const st_runtime* rt) {
  st_runtime_info ri;
  memset(&ri, 0, sizeof(ri));
  if (rt) st_runtime_get_info(rt, &ri);
  return ri.platform_name && !strcmp(ri.platform_name, "cpu");
}

void st_runtime_get_stats(const st_runtime* rt, st_runtime_stats* out) {
  if (!out) return;
  memset(out, 0, sizeof(*out));
  if (!rt) return;
  /* Each counter is read atomically; the set is not a snapshot. */
  st_runtime* m = (st_runtime*)rt;
  out->compiles = atomic_load(&m->n_compiles);
  out->cache_hits = atomic_load(&m->n_cache_hits);
  out->cache_misses = atomic_load(&m->n_cache_misses);
  out->cache_corrupt = atomic_load(&m->n_cache_corrupt);
  out->executions = atomic_load(&m->n_executions);
  out->h2d_bytes = atomic_load(&m->n_h2d_bytes);
  out->d2h_bytes = atomic_load(&m->n_d2h_bytes);
  out->live_buffers = atomic_load(&m->n_live_buffers);
}
