/* compile_options.c — hand-encodes the serialized xla.CompileOptionsProto
 * that PJRT_Client_Compile takes (protobuf wire format; strata links no
 * protobuf library).
 *
 * What is encoded (field numbers from xla/pjrt/proto/compile_options.proto):
 *   CompileOptionsProto
 *     3  executable_build_options (message ExecutableBuildOptionsProto)
 *          1  device_ordinal = -1   (unset: the executable is not tied to a device)
 *          4  num_replicas   = 1
 *          5  num_partitions = 1
 *     4  compile_portable_executable = true  (run on any device via execute_device)
 *     7  env_option_overrides: map<string, OptionOverrideProto>, one entry
 *          per XLA option, sorted by name so equal settings give equal bytes
 *          (the bytes are part of the executable-cache key)
 *          OptionOverrideProto oneof: 1 string, 2 bool, 3 int64, 4 double
 *
 * SPMD programs (mesh.c) get the same bytes with field 3 replaced by an
 * SPMD build (num_partitions = devices, an explicit device assignment, SPMD
 * partitioning with Shardy) and field 4 dropped (not portable):
 * st__compile_options_spmd.
 *
 * Never empty: an empty CompileOptionsProto means 0 replicas, which aborts
 * the CPU plugin inside the default device assignment.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_internal.h"

/*--- a tiny protobuf writer --------------------------------------------------*/

/* Bytes go in base's one growable buffer. */
typedef st_strbuf st__pb;

static void st__pb_put(st__pb* b, const void* data, size_t n) { st_strbuf_append_n(b, (const char*)data, n); }

static void st__pb_varint(st__pb* b, uint64_t v) {
  uint8_t tmp[10];
  size_t n = 0;
  do {
    uint8_t byte = v & 0x7f;
    v >>= 7;
    tmp[n++] = (uint8_t)(byte | (v ? 0x80 : 0));
  } while (v);
  st__pb_put(b, tmp, n);
}

enum { ST__WT_VARINT = 0, ST__WT_I64 = 1, ST__WT_LEN = 2 };

static void st__pb_tag(st__pb* b, int field, int wire) { st__pb_varint(b, ((uint64_t)field << 3) | (uint64_t)wire); }

/* int64/bool fields: negative numbers are 10-byte two's complement varints. */
static void st__pb_int(st__pb* b, int field, int64_t v) {
  st__pb_tag(b, field, ST__WT_VARINT);
  st__pb_varint(b, (uint64_t)v);
}

static void st__pb_bytes(st__pb* b, int field, const void* data, size_t n) {
  st__pb_tag(b, field, ST__WT_LEN);
  st__pb_varint(b, n);
  st__pb_put(b, data, n);
}

static void st__pb_double(st__pb* b, int field, double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof(bits));
  uint8_t le[8];
  for (int i = 0; i < 8; ++i) le[i] = (uint8_t)(bits >> (8 * i));
  st__pb_tag(b, field, ST__WT_I64);
  st__pb_put(b, le, 8);
}

/*--- XLA options -------------------------------------------------------------*/

typedef enum { ST__OPT_STRING = 1, ST__OPT_BOOL = 2, ST__OPT_INT = 3, ST__OPT_DOUBLE = 4 } st__opt_kind;

typedef struct {
  char* name;
  char* text; /* the value as written */
  st__opt_kind kind;
  bool b;
  int64_t i;
  double d;
} st__opt;

/* Settings deterministic mode adds unless the user set the same name. They
 * take XLA's CPU backend off its multi-threaded Eigen paths, whose
 * work-splitting may depend on thread timing (see docs/runtime.md, where the
 * measurements that chose this list are recorded). */
static const char* const kDeterministicOptions[] = {
    "xla_cpu_multi_thread_eigen=false",
};

/* Classifies |value|: true/false -> bool, a whole integer -> int, a finite
 * number -> double, anything else -> string. */
static void st__classify(st__opt* o) {
  const char* v = o->text;
  if (!strcmp(v, "true") || !strcmp(v, "false")) {
    o->kind = ST__OPT_BOOL;
    o->b = v[0] == 't';
    return;
  }
  if (v[0]) {
    char* end = NULL;
    errno = 0;
    long long i = strtoll(v, &end, 10);
    if (errno == 0 && end && *end == '\0') {
      o->kind = ST__OPT_INT;
      o->i = i;
      return;
    }
    errno = 0;
    double d = strtod(v, &end);
    if (errno == 0 && end && *end == '\0' && isfinite(d) && !isspace((unsigned char)v[0])) {
      o->kind = ST__OPT_DOUBLE;
      o->d = d;
      return;
    }
  }
  o->kind = ST__OPT_STRING;
}

static bool st__valid_name(const char* s, size_t n) {
  if (n == 0) return false;
  for (size_t i = 0; i < n; ++i)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) return false;
  return true;
}

static st_status st__parse_opt(const char* spec, st__opt* o) {
  memset(o, 0, sizeof(*o));
  const char* eq = spec ? strchr(spec, '=') : NULL;
  if (!eq)
    return st_status_make(ST_CODE_CONFIG, "runtime.xla_options: '%s' is not of the form name=value", spec ? spec : "(null)");
  /* Spaces around the name and the value are forgiven ("a = b"). */
  const char* start = spec;
  while (start < eq && *start == ' ') ++start;
  const char* end = eq;
  while (end > start && end[-1] == ' ') --end;
  size_t n = (size_t)(end - start);
  if (!st__valid_name(start, n))
    return st_status_make(ST_CODE_CONFIG, "runtime.xla_options: '%s': option name must be letters, digits and _",
                          spec);
  const char* val = eq + 1;
  while (*val == ' ') ++val;
  o->name = st_xstrndup(start, n);
  o->text = st_xstrdup(val);
  size_t tl = strlen(o->text);
  while (tl > 0 && o->text[tl - 1] == ' ') o->text[--tl] = '\0';
  st__classify(o);
  return ST_OK;
}

static int st__opt_cmp(const void* a, const void* b) {
  return strcmp(((const st__opt*)a)->name, ((const st__opt*)b)->name);
}

static void st__encode_override(st__pb* b, const st__opt* o) {
  st__pb val = {0};
  switch (o->kind) {
    case ST__OPT_STRING: st__pb_bytes(&val, 1, o->text, strlen(o->text)); break;
    case ST__OPT_BOOL: st__pb_int(&val, 2, o->b ? 1 : 0); break;
    case ST__OPT_INT: st__pb_int(&val, 3, o->i); break;
    case ST__OPT_DOUBLE: st__pb_double(&val, 4, o->d); break;
  }
  st__pb entry = {0};
  st__pb_bytes(&entry, 1, o->name, strlen(o->name));
  st__pb_bytes(&entry, 2, val.data, val.len);
  st__pb_bytes(b, 7, entry.data, entry.len);
  st_strbuf_free(&val);
  st_strbuf_free(&entry);
}

st_status st__compile_options_build(const char* const* xla_options, int count, bool deterministic,
                                    uint8_t** out_bytes, size_t* out_size) {
  *out_bytes = NULL;
  *out_size = 0;
  int extra = deterministic ? (int)(sizeof(kDeterministicOptions) / sizeof(kDeterministicOptions[0])) : 0;
  st__opt* opts = st_xcalloc((size_t)(count + extra) + 1, sizeof(*opts));
  int n = 0;
  st_status s = ST_OK;
  for (int i = 0; i < count && !s; ++i) {
    st__opt o;
    s = st__parse_opt(xla_options[i], &o);
    if (s) {
      free(o.name);
      free(o.text);
      break;
    }
    /* A repeated name: the last setting wins, as with command-line flags. */
    int j = 0;
    while (j < n && strcmp(opts[j].name, o.name)) ++j;
    if (j < n) {
      free(opts[j].name);
      free(opts[j].text);
      opts[j] = o;
    } else {
      opts[n++] = o;
    }
  }
  for (int k = 0; k < extra && !s; ++k) {
    st__opt o;
    s = st__parse_opt(kDeterministicOptions[k], &o);
    if (s) break;
    int j = 0;
    while (j < n && strcmp(opts[j].name, o.name)) ++j;
    if (j < n) { /* the user's explicit setting wins */
      free(o.name);
      free(o.text);
    } else {
      opts[n++] = o;
    }
  }
  if (!s) {
    qsort(opts, (size_t)n, sizeof(*opts), st__opt_cmp);
    st__pb build = {0};
    st__pb_int(&build, 1, -1); /* device_ordinal: unset */
    st__pb_int(&build, 4, 1);  /* num_replicas */
    st__pb_int(&build, 5, 1);  /* num_partitions */
    st__pb out = {0};
    st__pb_bytes(&out, 3, build.data, build.len);
    st__pb_int(&out, 4, 1); /* compile_portable_executable */
    for (int i = 0; i < n; ++i) st__encode_override(&out, &opts[i]);
    st_strbuf_free(&build);
    *out_size = out.len;
    *out_bytes = (uint8_t*)st_strbuf_take(&out);
  }
  for (int i = 0; i < n; ++i) {
    free(opts[i].name);
    free(opts[i].text);
  }
  free(opts);
  return s;
}

/*--- SPMD ----------------------------------------------------------------------*/

/* The ExecutableBuildOptionsProto of an SPMD program: |device_count|
 * partitions of one replica, partition p on plugin device |device_ids[p]|
 * (DeviceAssignmentProto, xla_data.proto: 1 replica_count, 2
 * computation_count, 3 computation_devices{1 replica_device_ids, packed}),
 * SPMD partitioning (6) with the Shardy partitioner (19), which the
 * exporter's `sdy` annotations need (docs/parallelism.md). */
static void st__encode_spmd_build(st__pb* build, const int64_t* device_ids, int device_count) {
  st__pb_int(build, 1, -1); /* device_ordinal: unset */
  st__pb_int(build, 4, 1);  /* num_replicas */
  st__pb_int(build, 5, device_count);
  st__pb_int(build, 6, 1); /* use_spmd_partitioning */
  st__pb assign = {0};
  st__pb_int(&assign, 1, 1);
  st__pb_int(&assign, 2, device_count);
  for (int p = 0; p < device_count; ++p) {
    st__pb ids = {0};
    st__pb_varint(&ids, (uint64_t)device_ids[p]);
    st__pb comp = {0};
    st__pb_bytes(&comp, 1, ids.data, ids.len);
    st__pb_bytes(&assign, 3, comp.data, comp.len);
    st_strbuf_free(&ids);
    st_strbuf_free(&comp);
  }
  st__pb_bytes(build, 9, assign.data, assign.len);
  st_strbuf_free(&assign);
  st__pb_int(build, 19, 1); /* use_shardy_partitioner */
}

/* Reads a varint at *pos; false past |n| or beyond 10 bytes. */
static bool st__pb_read_varint(const uint8_t* b, size_t n, size_t* pos, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (*pos >= n) return false;
    uint8_t byte = b[(*pos)++];
    v |= (uint64_t)(byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false;
}

st_status st__compile_options_spmd(const uint8_t* base, size_t base_size, const int64_t* device_ids, int device_count,
                                   uint8_t** out_bytes, size_t* out_size) {
  *out_bytes = NULL;
  *out_size = 0;
  if (!device_ids || device_count < 1)
    return st_status_make(ST_CODE_INTERNAL, "SPMD compile options: no devices");
  st__pb out = {0};
  st__pb build = {0};
  st__encode_spmd_build(&build, device_ids, device_count);
  st__pb_bytes(&out, 3, build.data, build.len);
  st_strbuf_free(&build);
  /* Copy every other top-level field of the base options (the XLA option
   * overrides) unchanged; only varint and length-delimited fields occur in
   * what st__compile_options_build writes. */
  size_t pos = 0;
  while (pos < base_size) {
    size_t start = pos;
    uint64_t tag = 0, v = 0;
    bool ok = st__pb_read_varint(base, base_size, &pos, &tag);
    int field = (int)(tag >> 3), wire = (int)(tag & 7);
    if (ok && wire == ST__WT_VARINT) {
      ok = st__pb_read_varint(base, base_size, &pos, &v);
    } else if (ok && wire == ST__WT_LEN) {
      ok = st__pb_read_varint(base, base_size, &pos, &v) && v <= base_size - pos;
      if (ok) pos += (size_t)v;
    } else {
      ok = false;
    }
    if (!ok) {
      st_strbuf_free(&out);
      return st_status_make(ST_CODE_INTERNAL, "SPMD compile options: cannot read the base options at byte %zu", start);
    }
    if (field != 3 && field != 4) st__pb_put(&out, base + start, pos - start);
  }
  *out_size = out.len;
  *out_bytes = (uint8_t*)st_strbuf_take(&out);
  return ST_OK;
}
