/* exe_cache.c — the on-disk executable cache.
 *
 * Key: SHA-256 over length-prefixed fields — program bytes, compile-options
 * bytes, plugin path, plugin file size and mtime, platform name and version,
 * xla_version — so any change of program, XLA option, plugin build or
 * platform misses instead of loading a stale or foreign executable.
 *
 * Entry: <cache_dir>/<key hex>.xexe, a 32-byte little-endian header
 *   0  8  magic "STXEXE\r\n" (the \r\n catches text-mode mangling)
 *   8  4  format version (1)
 *  12  4  reserved, 0
 *  16  8  payload size in bytes
 *  24  8  XXH64(payload, seed 0)
 * followed by the payload from PJRT_Executable_Serialize. Entries are
 * written to a temporary file, fsynced and renamed into place, so readers
 * never see a partial entry; anything that fails validation or
 * deserialization is counted as corrupt, removed, and recompiled.
 */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <jansson.h>

#include "runtime/rt_internal.h"

#define ST__CACHE_MAGIC "STXEXE\r\n"
#define ST__CACHE_VERSION 1u
#define ST__CACHE_HEADER 32
/* A cap on what is read back, so a damaged size field cannot ask for an
 * absurd allocation. */
#define ST__CACHE_MAX_PAYLOAD ((uint64_t)4 << 30)

static void st__exe_put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
static void st__exe_put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t st__exe_get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
static uint64_t st__exe_get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/*--- key ----------------------------------------------------------------------*/

static int st__digest_field(EVP_MD_CTX* ctx, const void* data, size_t n) {
  uint8_t len[8];
  st__exe_put_u64(len, (uint64_t)n);
  return EVP_DigestUpdate(ctx, len, sizeof(len)) && (n == 0 || EVP_DigestUpdate(ctx, data, n));
}

static int st__digest_str(EVP_MD_CTX* ctx, const char* s) { return st__digest_field(ctx, s ? s : "", s ? strlen(s) : 0); }

/* A client across processes (st_runtime_options.kv) keys its executables
 * apart by the job's process count: what a client of one process
 * serialized is never loaded into one spanning several, nor the reverse.
 * A client of its own process adds nothing, so its keys are as before. */
static int st__digest_shared(EVP_MD_CTX* ctx, const st_runtime* rt) {
  if (!rt->kv.put) return 1;
  char buf[48];
  snprintf(buf, sizeof(buf), "shared-client:%d", rt->kv.num_nodes);
  return st__digest_str(ctx, buf);
}

/* XLA reads XLA_FLAGS from the environment at compile time (e.g.
 * --xla_cpu_max_isa=AVX2, how the tests check another CPU's code paths):
 * an executable compiled under other flags is another program. Unset or
 * empty adds nothing, so the keys of ordinary runs are as before. */
static int st__digest_xla_flags(EVP_MD_CTX* ctx) {
  const char* flags = getenv("XLA_FLAGS");
  if (!flags || !*flags) return 1;
  return st__digest_str(ctx, "xla-flags:") && st__digest_str(ctx, flags);
}

st_status st__cache_key(const st_runtime* rt, const uint8_t* options, size_t options_size, const void* code,
                        size_t code_size, char out_hex[65]) {
  out_hex[0] = '\0';
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx) return st_status_make(ST_CODE_INTERNAL, "executable cache: cannot create a SHA-256 context");
  uint8_t nums[16];
  st__exe_put_u64(nums, (uint64_t)rt->plugin_size);
  st__exe_put_u64(nums + 8, (uint64_t)rt->plugin_mtime_ns);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  int ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) && st__digest_str(ctx, "strata-xexe-key-v1") &&
           st__digest_field(ctx, code, code_size) &&
           st__digest_field(ctx, options, options_size) &&
           st__digest_str(ctx, rt->plugin_path) && st__digest_field(ctx, nums, sizeof(nums)) &&
           st__digest_str(ctx, rt->platform_name) && st__digest_str(ctx, rt->platform_version) &&
           st__digest_str(ctx, rt->xla_version) && st__digest_shared(ctx, rt) && st__digest_xla_flags(ctx) &&
           EVP_DigestFinal_ex(ctx, md, &md_len);
  EVP_MD_CTX_free(ctx);
  if (!ok || md_len != 32) return st_status_make(ST_CODE_INTERNAL, "executable cache: SHA-256 failed");
  static const char kHex[] = "0123456789abcdef";
  for (unsigned i = 0; i < 32; ++i) {
    out_hex[2 * i] = kHex[md[i] >> 4];
    out_hex[2 * i + 1] = kHex[md[i] & 15];
  }
  out_hex[64] = '\0';
  return ST_OK;
}

static char* st__entry_path(const st_runtime* rt, const char* key) { return st__sprintf("%s/%s.xexe", rt->cache_dir, key); }

/*--- lookup -------------------------------------------------------------------*/

/* Reads and validates an entry. Returns 0 and the payload on success, 1 when
 * there is no entry, 2 when the entry is damaged (|why| says how). */
static int st__read_entry(const char* path, uint8_t** out, size_t* out_size, char* why, size_t why_size) {
  *out = NULL;
  *out_size = 0;
  FILE* f = fopen(path, "rb");
  if (!f) {
    if (errno == ENOENT) return 1;
    snprintf(why, why_size, "cannot open: %s", strerror(errno));
    return 2;
  }
  uint8_t h[ST__CACHE_HEADER];
  int rc = 2;
  uint8_t* payload = NULL;
  struct stat st;
  if (fread(h, 1, sizeof(h), f) != sizeof(h)) {
    snprintf(why, why_size, "truncated header");
  } else if (memcmp(h, ST__CACHE_MAGIC, 8)) {
    snprintf(why, why_size, "bad magic");
  } else if (st__exe_get_u32(h + 8) != ST__CACHE_VERSION) {
    snprintf(why, why_size, "format version %u, expected %u", st__exe_get_u32(h + 8), ST__CACHE_VERSION);
  } else if (fstat(fileno(f), &st) != 0) {
    snprintf(why, why_size, "cannot stat: %s", strerror(errno));
  } else {
    uint64_t size = st__exe_get_u64(h + 16);
    uint64_t sum = st__exe_get_u64(h + 24);
    if (size == 0 || size > ST__CACHE_MAX_PAYLOAD || (uint64_t)st.st_size != ST__CACHE_HEADER + size) {
      snprintf(why, why_size, "payload size %llu does not match the file size %lld", (unsigned long long)size,
               (long long)st.st_size);
    } else if (fread((payload = st_xmalloc((size_t)size)), 1, (size_t)size, f) != (size_t)size) {
      snprintf(why, why_size, "truncated payload");
    } else if (XXH64(payload, (size_t)size, 0) != sum) {
      snprintf(why, why_size, "checksum mismatch");
    } else {
      *out = payload;
      *out_size = (size_t)size;
      payload = NULL;
      rc = 0;
    }
  }
  free(payload);
  fclose(f);
  return rc;
}

void st__cache_lookup(st_runtime* rt, const char* key, pj_loaded_exe** out) {
  *out = NULL;
  char* path = st__entry_path(rt, key);
  if (!path) {
    atomic_fetch_add(&rt->n_cache_misses, 1);
    return;
  }
  uint8_t* payload = NULL;
  size_t size = 0;
  char why[256] = {0};
  int rc = st__read_entry(path, &payload, &size, why, sizeof(why));
  if (rc == 0) {
    const pj_api* api = rt->api;
    pj_deserialize_args a = {.struct_size = sizeof(a)};
    a.client = rt->client;
    a.bytes = (const char*)payload;
    a.bytes_size = size;
    pj_error* e = api->executable_deserialize_and_load(&a);
    free(payload);
    if (!e && a.executable) {
      atomic_fetch_add(&rt->n_cache_hits, 1);
      *out = a.executable;
      free(path);
      return;
    }
    char* msg = st__pj_message(api, e);
    st__pj_error_free(api, e);
    snprintf(why, sizeof(why), "the plugin cannot load it: %.200s", msg ? msg : "?");
    free(msg);
    rc = 2;
  }
  if (rc == 2) {
    /* Damaged entries are dropped so the recompiled one replaces them. */
    atomic_fetch_add(&rt->n_cache_corrupt, 1);
    fprintf(stderr, "strata: warning: executable cache entry %s is damaged (%s); recompiling\n", path, why);
    unlink(path);
  }
  atomic_fetch_add(&rt->n_cache_misses, 1);
  free(path);
}

/*--- store --------------------------------------------------------------------*/

static st_status st__write_entry(const st_runtime* rt, const char* key, const void* payload, size_t size) {
  ST_RETURN(st_fs_mkdirs(rt->cache_dir));
  char* final_path = st__entry_path(rt, key);
  uint8_t h[ST__CACHE_HEADER] = {0};
  memcpy(h, ST__CACHE_MAGIC, 8);
  st__exe_put_u32(h + 8, ST__CACHE_VERSION);
  st__exe_put_u64(h + 16, (uint64_t)size);
  st__exe_put_u64(h + 24, XXH64(payload, size, 0));
  st_fs_piece pieces[2] = {{h, sizeof(h)}, {payload, size}};
  st_status s = st_fs_write_atomic_pieces(final_path, pieces, 2);
  free(final_path);
  return s;
}

st_status st__cache_store(st_runtime* rt, const char* key, pj_loaded_exe* exe) {
  const pj_api* api = rt->api;
  pj_get_executable_args g = {.struct_size = sizeof(g), .loaded = exe};
  ST_RETURN(st__pj_status(api, api->loaded_get_executable(&g), "reading the executable"));
  pj_serialize_args sa = {.struct_size = sizeof(sa), .executable = g.executable};
  pj_error* e = api->executable_serialize(&sa);
  st_status s = ST_OK;
  uint8_t* copy = NULL;
  size_t size = 0;
  if (e) {
    s = st__pj_status(api, e, "serializing the executable");
  } else {
    size = sa.bytes_size;
    copy = size ? st_xmalloc(size) : NULL;
    if (copy) memcpy(copy, sa.bytes, size);
    if (sa.deleter) sa.deleter(sa.serialized);
    if (!copy) s = st_status_make(ST_CODE_RUNTIME, "the plugin serialized the executable to 0 bytes");
  }
  pj_executable_args d = {.struct_size = sizeof(d), .executable = g.executable};
  st__pj_error_free(api, api->executable_destroy(&d));
  if (!s) s = st__write_entry(rt, key, copy, size);
  free(copy);
  return s;
}

/*--- the optimized program (runtime.keep_optimized_hlo) ------------------------*/

/* The plugin's optimized program of |exe| (owned by the caller) and its
 * format. Bounded: a program of more than 1 GiB is refused. */
static st_status st__optimized(st_runtime* rt, pj_loaded_exe* exe, char** out, size_t* out_size, char* format,
                               size_t format_cap) {
  const pj_api* api = rt->api;
  *out = NULL;
  *out_size = 0;
  if (offsetof(pj_api, executable_optimized_program) >= api->struct_size || !api->executable_optimized_program)
    return st_status_make(ST_CODE_RUNTIME, "the plugin has no PJRT_Executable_OptimizedProgram");
  pj_get_executable_args g = {.struct_size = sizeof(g), .loaded = exe};
  ST_RETURN(st__pj_status(api, api->loaded_get_executable(&g), "reading the executable"));
  pj_program prog = {.struct_size = sizeof(prog)};
  pj_optimized_program_args a = {.struct_size = sizeof(a), .executable = g.executable, .program = &prog};
  st_status s = st__pj_status(api, api->executable_optimized_program(&a), "asking for the optimized program");
  if (!s && (prog.code_size == 0 || prog.code_size > ((size_t)1 << 30)))
    s = st_status_make(ST_CODE_RUNTIME, "the optimized program is %zu bytes", prog.code_size);
  char* buf = NULL;
  if (!s) {
    buf = st_xmalloc(prog.code_size);
    prog.code = buf;
    s = st__pj_status(api, api->executable_optimized_program(&a), "reading the optimized program");
  }
  if (!s) {
    snprintf(format, format_cap, "%.*s", (int)(prog.format && prog.format_size < 64 ? prog.format_size : 0),
             prog.format ? prog.format : "");
    *out = buf;
    *out_size = prog.code_size;
    buf = NULL;
  }
  free(buf);
  pj_executable_args d = {.struct_size = sizeof(d), .executable = g.executable};
  st__pj_error_free(api, api->executable_destroy(&d));
  return s;
}

st_status st__cache_keep_optimized(st_runtime* rt, const char* key, const char* name, const void* code,
                                   size_t code_size, pj_loaded_exe* exe) {
  char* path = st__sprintf("%s/%s.hlo", rt->cache_dir, key);
  char* meta = st__sprintf("%s/%s.hlo.json", rt->cache_dir, key);
  st_status s = ST_OK;
  if (!st_fs_exists(path) || !st_fs_exists(meta)) {
    char* bytes = NULL;
    size_t size = 0;
    char format[64] = "";
    s = st__optimized(rt, exe, &bytes, &size, format, sizeof(format));
    if (!s) s = st_fs_mkdirs(rt->cache_dir);
    if (!s) s = st_fs_write_atomic(path, bytes, size);
    if (!s) {
      char sha[65];
      st_sha256_hex(code, code_size, sha);
      json_t* j = st_json_obj();
      st_json_put_str(j, "program", name);
      st_json_put_str(j, "source_sha256", sha);
      st_json_put_str(j, "format", format);
      st_json_put_int(j, "bytes", (int64_t)size);
      s = st_json_write_file(meta, j, 2);
      json_decref(j);
    }
    free(bytes);
  }
  free(path);
  free(meta);
  return s;
}
