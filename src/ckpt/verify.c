/* verify.c — opening a checkpoint means verifying it: the manifest checks
 * itself, then the model identity, then every file and every tensor. The
 * first problem found is the error, worded for the person who has to decide
 * what to do with the folder: which file, which tensor, what was expected. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"

void st_ckpt_free(st_ckpt* c) {
  if (!c) return;
  for (int i = 0; i < c->tensor_count; ++i) {
    free(c->tensors[i].name);
    free(c->tensors[i].file);
  }
  free(c->tensors);
  for (int i = 0; i < c->whole_count; ++i) {
    free(c->wholes[i].name);
    free(c->wholes[i].file);
    if (c->whole_data) free(c->whole_data[i]);
  }
  free(c->wholes);
  free(c->whole_data);
  for (int i = 0; i < c->file_count; ++i) {
    free(c->files[i].file);
    if (c->loaded) st_safetensors_free(c->loaded[i]);
  }
  free(c->files);
  free(c->loaded);
  free(c->dir);
  free(c->config_hash);
  free(c->bundle_key);
  free(c->tokenizer_hash);
  json_decref(c->model);
  json_decref(c->config);
  json_decref(c->lr_schedule);
  json_decref(c->data);
  json_decref(c->identity_report);
  free(c);
}

static int st__cmp_whole(const void* key, const void* elem) { return strcmp(key, ((const st_ckpt_tensor_info*)elem)->name); }

const void* st_ckpt_tensor_data(const st_ckpt* c, const char* name, const st_ckpt_tensor_info** out_info) {
  if (out_info) *out_info = NULL;
  if (!c->loaded) return NULL;
  if (c->whole_data) {
    /* c->wholes is in name order (st__manifest_wholes). */
    const st_ckpt_tensor_info* w = bsearch(name, c->wholes, (size_t)c->whole_count, sizeof(*c->wholes), st__cmp_whole);
    if (w) {
      if (out_info) *out_info = w;
      return c->whole_data[w - c->wholes];
    }
  }
  for (int i = 0; i < c->tensor_count; ++i) {
    const st_ckpt_tensor_info* t = &c->tensors[i];
    if (t->rows || strcmp(t->name, name)) continue;
    for (int f = 0; f < c->file_count; ++f) {
      if (strcmp(c->files[f].file, t->file) || !c->loaded[f]) continue;
      if (out_info) *out_info = t;
      return c->loaded[f]->data + t->offset;
    }
  }
  return NULL;
}

static bool st__plain_file_name(const char* s) {
  return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 200;
}

static bool st__parse_hex64(const char* s, uint64_t* out) {
  if (strlen(s) != 16) return false;
  uint64_t v = 0;
  for (int i = 0; i < 16; ++i) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return true;
}

static void st__type_str(const st_tensor_type* t, char* buf, size_t n) { st_tensor_type_format(t, buf, n); }

#define ST__FAIL(...)                                    \
  do {                                                   \
    s = st_status_make(ST_CODE_CKPT, __VA_ARGS__);       \
    goto done;                                           \
  } while (0)

/* The manifest: present, self-consistent, readable by this build. */
/* The data contract in "data" (docs/checkpoints.md): optional (written
 * before contracts), else bounded like the rest of the manifest. */
static st_status st__manifest_data(const char* path, const json_t* data) {
  const json_t* packing = json_object_get(data, "packing");
  if (packing && (!json_is_string(packing) || json_string_length(packing) > 16))
    return st_status_make(ST_CODE_CKPT, "'%s': \"data\".\"packing\" must be a string of at most 16 characters", path);
  const json_t* src = json_object_get(data, "sources");
  if (!src) return ST_OK;
  if (!json_is_array(src) || json_array_size(src) < 1 || json_array_size(src) > ST_CKPT_MAX_DATA_SOURCES)
    return st_status_make(ST_CODE_CKPT, "'%s': \"data\".\"sources\" must be an array of 1 to %d sources", path,
                          ST_CKPT_MAX_DATA_SOURCES);
  size_t i;
  const json_t* e;
  json_array_foreach(src, i, e) {
    const json_t* name = json_object_get(e, "name");
    const json_t* hash = json_object_get(e, "content_hash");
    const json_t* docs = json_object_get(e, "documents");
    const json_t* drawn = json_object_get(e, "drawn");
    if (!json_is_object(e) || !json_is_string(name) || json_string_length(name) > 4096 || !json_is_string(hash) ||
        json_string_length(hash) < 1 || json_string_length(hash) > 64 || !json_is_integer(docs) ||
        json_integer_value(docs) < 0 || !json_is_integer(drawn) || json_integer_value(drawn) < 0)
      return st_status_make(ST_CODE_CKPT,
                            "'%s': data source %zu needs a \"name\" (at most 4096 bytes), a \"content_hash\" (1 to 64 "
                            "characters) and whole numbers \"documents\" and \"drawn\" >= 0",
                            path, i);
  }
  return ST_OK;
}

/* The manifest's own checks: its self-checksum (xxh64 of every byte before
 * the line holding it), its format and a version this build reads. First,
 * so nothing of a modified or foreign manifest is believed. */
static st_status st__manifest_header(const char* path, const char* text, size_t size, const json_t* j, st_ckpt* c) {
  st_status s = ST_OK;
  st_status r;
  /* Self-checksum: xxh64 of every byte before the line holding it. */
  const char* mh = json_string_value(json_object_get(j, "manifest_xxh64"));
  const char* mark = NULL;
  static const char kKey[] = "\"manifest_xxh64\"";
  for (const char* p = memmem(text, size, kKey, sizeof(kKey) - 1); p;
       p = memmem(p + 1, size - (size_t)(p + 1 - text), kKey, sizeof(kKey) - 1))
    mark = p;
  uint64_t want = 0;
  if (!mh || !mark || !st__parse_hex64(mh, &want))
    ST__FAIL("'%s' has no valid \"manifest_xxh64\": not written by strata, or damaged", path);
  const char* line = mark;
  while (line > text && line[-1] != '\n') --line;
  uint64_t got = st_hash64(text, (size_t)(line - text), 0);
  if (got != want)
    ST__FAIL("'%s' fails its checksum (xxh64 %016" PRIx64 " recorded, %016" PRIx64 " computed): the manifest was modified or damaged",
             path, want, got);
  const char* fmt = json_string_value(json_object_get(j, "format"));
  if (!fmt || strcmp(fmt, ST_CKPT_FORMAT))
    ST__FAIL("'%s': \"format\" is not \"%s\"", path, ST_CKPT_FORMAT);
  int64_t version = 0;
  if ((r = st_json_get_int(j, "version", path, &version))) {
    st_status_free(r);
    ST__FAIL("'%s': \"version\" is missing or not an integer", path);
  }
  if (version > ST_CKPT_VERSION || version < 1)
    ST__FAIL("'%s': checkpoint format version %lld; this strata reads version %d (written by a %s strata)", path, (long long)version,
             ST_CKPT_VERSION, version > ST_CKPT_VERSION ? "newer" : "broken");
  c->version = (int)version;
done:
  return s;
}

/* The typed scalar fields (steps, data position, seed, schedule, hashes)
 * and the model and config objects; a missing one names itself. */
static st_status st__manifest_fields(const char* path, const json_t* j, st_ckpt* c) {
  st_status s = ST_OK;
  st_status r = ST_OK;
  /* Typed fields; a missing one names itself. */
  const char* ints[] = {"step", "optimizer_step"};
  int64_t* int_dst[] = {&c->step, &c->optimizer_step};
  for (int i = 0; i < 2; ++i) {
    if ((r = st_json_get_int(j, ints[i], path, int_dst[i]))) {
      st_status_free(r);
      ST__FAIL("'%s': \"%s\" is missing or not an integer", path, ints[i]);
    }
  }
  const json_t* data = json_object_get(j, "data");
  const json_t* rng = json_object_get(j, "rng");
  const json_t* lr = json_object_get(j, "lr_schedule");
  int64_t seed = 0;
  if (!data || (r = st_json_get_int(data, "position", path, &c->data_position)) || (r = st_json_get_int(data, "batch_size", path, &c->batch_size))) {
    st_status_free(r);
    ST__FAIL("'%s': \"data\" needs integer \"position\" and \"batch_size\"", path);
  }
  if (!rng || (r = st_json_get_int(rng, "seed", path, &seed))) {
    st_status_free(r);
    ST__FAIL("'%s': \"rng\" needs an integer \"seed\"", path);
  }
  c->seed = (uint64_t)seed;
  const json_t* lrv = json_object_get(lr, "lr");
  if (!lr || !json_is_number(lrv) || (r = st_json_get_int(lr, "total_steps", path, &c->total_steps))) {
    st_status_free(r);
    ST__FAIL("'%s': \"lr_schedule\" needs a number \"lr\" and an integer \"total_steps\"", path);
  }
  c->lr = json_number_value(lrv);
  c->lr_schedule = json_incref((json_t*)lr);
  if ((s = st__manifest_data(path, data))) goto done;
  c->data = json_incref((json_t*)data);
  const json_t* created = json_object_get(j, "created");
  c->created = json_is_number(created) ? json_number_value(created) : 0;
  const char* str;
  if ((r = st_json_get_string(j, "config_hash", path, &str))) {
    st_status_free(r);
    ST__FAIL("'%s': \"config_hash\" is missing", path);
  }
  c->config_hash = st_xstrdup(str);
  if ((r = st_json_get_string(j, "bundle_key", path, &str))) {
    st_status_free(r);
    ST__FAIL("'%s': \"bundle_key\" is missing", path);
  }
  c->bundle_key = st_xstrdup(str);
  const json_t* tok = json_object_get(j, "tokenizer_hash");
  if (tok) {
    if (!json_is_string(tok) || json_string_length(tok) == 0 || json_string_length(tok) > 64)
      ST__FAIL("'%s': \"tokenizer_hash\" must be a string of 1 to 64 characters", path);
    c->tokenizer_hash = st_xstrdup(json_string_value(tok));
  }
  json_t* model = json_object_get(j, "model");
  json_t* config = json_object_get(j, "config");
  if (!json_is_object(model) || !json_is_object(config)) ST__FAIL("'%s': \"model\" and \"config\" must be objects", path);
  c->model = json_incref(model);
  c->config = json_incref(config);
done:
  return s;
}

/* The optional mesh record, apart because its axes check each other. */
static st_status st__manifest_mesh(const char* path, const json_t* j, st_ckpt* c) {
  st_status s = ST_OK;
  const json_t* mesh = json_object_get(j, "mesh");
  if (mesh) {
    /* Bounded like every count read from disk; the axes must multiply to
     * the devices, or the record cannot be the mesh that wrote the state. */
    const char* axis_names[4] = {"data", "fsdp", "tensor", "devices"};
    int64_t v[4] = {0, 0, 0, 0};
    for (int a = 0; a < 4; ++a) {
      const json_t* x = json_is_object(mesh) ? json_object_get(mesh, axis_names[a]) : NULL;
      if (!st_json_as_int(x, &v[a]) || v[a] < 1 || v[a] > 65536)
        ST__FAIL("'%s': \"mesh\" needs integer \"data\", \"fsdp\", \"tensor\" and \"devices\" in 1..65536 (\"%s\" is not)", path,
                 axis_names[a]);
    }
    /* Pipeline stages (absent: none), each with the data x fsdp x tensor devices. */
    const json_t* pipe = json_object_get(mesh, "pipeline");
    int64_t stages = 1;
    if (pipe && (!st_json_as_int(pipe, &stages) || stages < 1 || stages > 65536))
      ST__FAIL("'%s': \"mesh\" records \"pipeline\" that is not a stage count in 1..65536", path);
    if (v[0] * v[1] * v[2] * stages != v[3])
      ST__FAIL("'%s': \"mesh\" is data %lld x fsdp %lld x tensor %lld x pipeline %lld = %lld devices, but records devices "
               "%lld: the mesh record is inconsistent",
               path, (long long)v[0], (long long)v[1], (long long)v[2], (long long)stages,
               (long long)(v[0] * v[1] * v[2] * stages), (long long)v[3]);
    c->mesh_pipeline = pipe ? (int)stages : 0;
    c->mesh_data = (int)v[0];
    c->mesh_fsdp = (int)v[1];
    c->mesh_tensor = (int)v[2];
    c->mesh_devices = (int)v[3];
    /* A job's processes (absent: one): each holds the same share of the
     * devices, so their count divides them. */
    const json_t* procs = json_object_get(mesh, "processes");
    int64_t p = 0;
    if (procs && (!st_json_as_int(procs, &p) || p < 1 || p > 65536 || v[3] % p != 0))
      ST__FAIL("'%s': \"mesh\" records \"processes\" that is not a count in 1..65536 dividing its %lld devices", path,
               (long long)v[3]);
    c->mesh_processes = (int)p;
  }
done:
  return s;
}

/* "files" and "tensors" as arrays within their limits, then every file
 * entry (a plain name, a size, an xxh64). */
static st_status st__manifest_files(const char* path, const json_t* j, st_ckpt* c) {
  st_status s = ST_OK;
  st_status r;
  const json_t* files = json_object_get(j, "files");
  const json_t* tensors = json_object_get(j, "tensors");
  if (!json_is_array(files) || !json_is_array(tensors))
    ST__FAIL("'%s': \"files\" and \"tensors\" must be arrays", path);
  if (json_array_size(files) > ST_CKPT_MAX_FILES)
    ST__FAIL("'%s': \"files\" lists %zu files, above the limit of %d (ST_CKPT_MAX_FILES)", path, json_array_size(files),
             ST_CKPT_MAX_FILES);
  if (json_array_size(tensors) > ST_CKPT_MAX_TENSORS)
    ST__FAIL("'%s': \"tensors\" lists %zu tensors, above the limit of %d (ST_CKPT_MAX_TENSORS)", path, json_array_size(tensors),
             ST_CKPT_MAX_TENSORS);
  c->files = st_xcalloc(json_array_size(files) + 1, sizeof(*c->files));
  for (size_t i = 0; i < json_array_size(files); ++i) {
    const json_t* f = json_array_get(files, i);
    const char* name = NULL;
    const char* hash = NULL;
    int64_t bytes = 0;
    r = st_json_get_string(f, "file", path, &name);
    if (!r) r = st_json_get_int(f, "bytes", path, &bytes);
    if (!r) r = st_json_get_string(f, "xxh64", path, &hash);
    if (r) {
      st_status_free(r);
      ST__FAIL("'%s': files[%zu] needs \"file\", \"bytes\" and \"xxh64\"", path, i);
    }
    if (!st__plain_file_name(name)) ST__FAIL("'%s': files[%zu] \"%s\" is not a plain file name", path, i, name);
    st_ckpt_file_info* fi = &c->files[c->file_count++];
    fi->file = st_xstrdup(name);
    fi->bytes = (size_t)bytes;
    if (bytes < 0 || !st__parse_hex64(hash, &fi->xxh64)) ST__FAIL("'%s': files[%zu] has a bad size or xxh64", path, i);
  }
done:
  return s;
}

/* By name, then by first row (a whole tensor's is 0). */
static int st__cmp_name_rows(const void* a, const void* b) {
  const st_ckpt_tensor_info* x = *(const st_ckpt_tensor_info* const*)a;
  const st_ckpt_tensor_info* y = *(const st_ckpt_tensor_info* const*)b;
  int k = strcmp(x->name, y->name);
  if (k) return k;
  return x->row_begin < y->row_begin ? -1 : x->row_begin > y->row_begin;
}

/* Names are unique, but for a tensor stored in rows, whose entries tile
 * its dim 0 exactly (same dtype and other dims, no gap or overlap): each
 * such tensor becomes one whole entry in c->wholes. Sorted, so a crafted
 * manifest costs n log n here. */
static st_status st__manifest_wholes(const char* path, st_ckpt* c) {
  st_status s = ST_OK;
  if (c->tensor_count < 1) return ST_OK;
  const st_ckpt_tensor_info** v = st_xmalloc((size_t)c->tensor_count * sizeof(*v));
  for (int k = 0; k < c->tensor_count; ++k) v[k] = &c->tensors[k];
  qsort(v, (size_t)c->tensor_count, sizeof(*v), st__cmp_name_rows);
  c->wholes = st_xcalloc((size_t)c->tensor_count + 1, sizeof(*c->wholes));
  for (int k = 0; k < c->tensor_count;) {
    int n = 1;
    while (k + n < c->tensor_count && !strcmp(v[k]->name, v[k + n]->name)) ++n;
    const st_ckpt_tensor_info* a = v[k];
    if (!a->rows) {
      if (n > 1) ST__FAIL("'%s': tensor '%s' is listed twice", path, a->name);
      k += n;
      continue;
    }
    int64_t next = 0;
    for (int i = 0; i < n; ++i) {
      const st_ckpt_tensor_info* p = v[k + i];
      if (!p->rows || p->row_begin != next || p->dim0 != a->dim0 || p->type.dtype != a->type.dtype || p->type.rank != a->type.rank ||
          memcmp(p->type.dims + 1, a->type.dims + 1, sizeof(int64_t) * (size_t)(a->type.rank - 1)))
        ST__FAIL("'%s': tensor '%s': its entries do not tile rows 0 to %lld of one tensor (at row %lld: a gap, an overlap, a "
                 "whole entry or another shape)",
                 path, a->name, (long long)a->dim0, (long long)next);
      next = p->row_end;
    }
    if (next != a->dim0) ST__FAIL("'%s': tensor '%s': rows %lld to %lld are in no file", path, a->name, (long long)next, (long long)a->dim0);
    st_ckpt_tensor_info* w = &c->wholes[c->whole_count++];
    w->name = st_xstrdup(a->name);
    w->file = st_xstrdup("(rows)");
    w->type = a->type;
    w->type.dims[0] = a->dim0;
    w->bytes = st_tensor_type_bytes(&w->type);
    k += n;
  }
done:
  free(v);
  return s;
}

/* Every tensor entry: typed, its bytes matching its shape, in a listed
 * file, stored whole; then names unique. After the files, which it names. */
static st_status st__manifest_tensors(const char* path, const json_t* j, st_ckpt* c) {
  st_status s = ST_OK;
  st_status r;
  const json_t* tensors = json_object_get(j, "tensors");
  c->tensors = st_xcalloc(json_array_size(tensors) + 1, sizeof(*c->tensors));
  for (size_t i = 0; i < json_array_size(tensors); ++i) {
    const json_t* t = json_array_get(tensors, i);
    const char *name = NULL, *file = NULL, *dtype = NULL, *hash = NULL;
    int64_t offset = 0, bytes = 0;
    const json_t* shape = NULL;
    r = st_json_get_string(t, "name", path, &name);
    if (!r) r = st_json_get_string(t, "file", path, &file);
    if (!r) r = st_json_get_string(t, "dtype", path, &dtype);
    if (!r) r = st_json_get_array(t, "shape", path, &shape);
    if (!r) r = st_json_get_int(t, "offset", path, &offset);
    if (!r) r = st_json_get_int(t, "bytes", path, &bytes);
    if (!r) r = st_json_get_string(t, "xxh64", path, &hash);
    if (r) {
      st_status_free(r);
      ST__FAIL("'%s': tensors[%zu] needs \"name\", \"file\", \"dtype\", \"shape\", \"offset\", \"bytes\", \"xxh64\"", path, i);
    }
    st_ckpt_tensor_info* ti = &c->tensors[c->tensor_count++];
    ti->name = st_xstrdup(name);
    ti->file = st_xstrdup(file);
    if (offset < 0 || bytes < 0) ST__FAIL("'%s': tensor '%s' has a negative offset or size", path, name);
    ti->offset = (size_t)offset;
    ti->bytes = (size_t)bytes;
    ti->type.dtype = st_safetensors_dtype_parse(dtype);
    if (ti->type.dtype == ST_DTYPE_INVALID) ST__FAIL("'%s': tensor '%s' has unknown dtype \"%s\"", path, name, dtype);
    size_t rank = json_array_size(shape);
    if (rank > ST_MAX_RANK) ST__FAIL("'%s': tensor '%s' has rank %zu > %d", path, name, rank, ST_MAX_RANK);
    ti->type.rank = (int)rank;
    for (size_t d = 0; d < rank; ++d) {
      int64_t x = -1;
      if (!st_json_as_int(json_array_get(shape, d), &x) || x < 0 || x > ((int64_t)1 << 53))
        ST__FAIL("'%s': tensor '%s' has a bad shape", path, name);
      ti->type.dims[d] = x;
    }
    if (!st__parse_hex64(hash, &ti->xxh64)) ST__FAIL("'%s': tensor '%s' has a bad xxh64 \"%s\"", path, name, hash);
    /* Absent in checkpoints written before layouts were recorded: those
     * were whole. "rows": one rank's rows of a tensor (per-rank shards). */
    const json_t* layout = json_object_get(t, "layout");
    const bool rows = json_is_string(layout) && !strcmp(json_string_value(layout), "rows");
    if (layout && !rows && (!json_is_string(layout) || strcmp(json_string_value(layout), "whole")))
      ST__FAIL("'%s': tensor '%s' is stored with layout \"%.64s\", which this strata cannot reassemble onto any mesh (it reads "
               "tensors stored whole, \"layout\": \"whole\", or in rows per rank, \"rows\"); resume it with the strata that wrote it",
               path, name, json_is_string(layout) ? json_string_value(layout) : "(not a string)");
    if (rows) {
      const json_t* span = json_object_get(t, "rows");
      int64_t b = -1, e = -1, d0 = -1;
      if (!json_is_array(span) || json_array_size(span) != 2 || !st_json_as_int(json_array_get(span, 0), &b) ||
          !st_json_as_int(json_array_get(span, 1), &e) || !st_json_as_int(json_object_get(t, "dim0"), &d0) || ti->type.rank < 1 ||
          b < 0 || e <= b || e > d0 || d0 > ((int64_t)1 << 53) || ti->type.dims[0] != e - b)
        ST__FAIL("'%s': tensor '%s' in \"%s\": layout \"rows\" needs \"rows\": [begin, end] within \"dim0\", and end - begin "
                 "rows in its shape",
                 path, name, file);
      ti->rows = true;
      ti->row_begin = b;
      ti->row_end = e;
      ti->dim0 = d0;
    }
    if (st_tensor_type_bytes(&ti->type) != ti->bytes) ST__FAIL("'%s': tensor '%s': bytes %zu do not match its shape", path, name, ti->bytes);
    bool known = false;
    for (int f = 0; f < c->file_count; ++f) known |= !strcmp(c->files[f].file, file);
    if (!known) ST__FAIL("'%s': tensor '%s' lives in \"%s\", which \"files\" does not list", path, name, file);
  }
  s = st__manifest_wholes(path, c);
done:
  return s;
}

/* Manifest text (|size| bytes, not NUL-terminated) into |c|: self-checksum,
 * format, version, typed fields, every count within its limit. */
static st_status st__parse_manifest(const char* path, const char* text, size_t size, st_ckpt* c, json_t** out_json) {
  *out_json = NULL;
  json_t* j = NULL;
  st_status s = ST_OK;
  st_status r = st_json_parse(text, size, path, &j);
  if (r) {
    s = st_status_recode(r, ST_CODE_CKPT, "'%s' is malformed", path);
    goto done;
  }
  if (!json_is_object(j)) ST__FAIL("'%s' is malformed: not a JSON object", path);
  s = st__manifest_header(path, text, size, j, c);
  if (!s) s = st__manifest_fields(path, j, c);
  if (!s) s = st__manifest_mesh(path, j, c);
  if (!s) s = st__manifest_files(path, j, c);
  if (!s) s = st__manifest_tensors(path, j, c);
done:
  if (s) {
    json_decref(j);
    return s;
  }
  *out_json = j;
  return ST_OK;
}

/* The manifest: present, self-consistent, readable by this build. */
static st_status st__read_manifest(const char* dir, st_ckpt* c, json_t** out_json) {
  *out_json = NULL;
  char* path = st_path_join(dir, ST_CKPT_MANIFEST);
  char* text = NULL;
  size_t size = 0;
  st_status s = ST_OK;
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) ST__FAIL("checkpoint folder '%s' does not exist", dir);
  if (stat(path, &st) != 0)
    ST__FAIL("'%s' is missing: the folder is not a complete checkpoint (manifest.json is written last, so its absence means "
             "the save never finished or the file was deleted)",
             path);
  st_status r = st_fs_read_file(path, &text, &size);
  if (r) {
    s = st_status_set_code(r, ST_CODE_CKPT);
    goto done;
  }
  s = st__parse_manifest(path, text, size, c, out_json);
done:
  free(path);
  free(text);
  return s;
}

st_status st_ckpt_parse_manifest(const char* dir, const char* text, size_t size, st_ckpt** out) {
  *out = NULL;
  st_ckpt* c = st_xcalloc(1, sizeof(*c));
  c->dir = st_xstrdup(dir);
  char* path = st_path_join(dir, ST_CKPT_MANIFEST);
  json_t* manifest = NULL;
  st_status s = st__parse_manifest(path, text, size, c, &manifest);
  json_decref(manifest);
  free(path);
  if (s) {
    st_ckpt_free(c);
    return s;
  }
  *out = c;
  return ST_OK;
}

/* Is this the checkpoint of the model being trained? *out_stop: the
 * tokenizer differs, which every checkpoint of the run shares. */
static st_status st__check_expect(st_ckpt* c, const st_ckpt_expect* e, bool* out_stop) {
  st_status s = ST_OK;
  char* mpath = st_path_join(c->dir, ST_CKPT_MANIFEST);
  if (e->identity.model || e->identity.tokenizer_hash) {
    st_ckpt_identity rec = {c->model, c->tokenizer_hash};
    st_ckpt_identity_options o = e->identity_options;
    o.where = mpath;
    if (!o.recorded) o.recorded = "in the checkpoint";
    json_decref(c->identity_report);
    c->identity_report = NULL;
    s = st_ckpt_identity_check(&rec, &e->identity, &o, &c->identity_report, out_stop);
    if (s) goto done;
  }
  if (e->bundle_key && strcmp(e->bundle_key, c->bundle_key))
    ST__FAIL("'%s': written with bundle %s, this run uses bundle %s (same model config, different exporter or bundle schema)", mpath,
             c->bundle_key, e->bundle_key);
  /* The tensors as the model sees them: whole entries, and those stored in
   * rows as their assembled whole. */
  const int n = c->tensor_count + c->whole_count;
  for (int i = 0; i < e->count; ++i) {
    const st_ckpt_tensor_info* t = NULL;
    for (int k = 0; k < n && !t; ++k) {
      const st_ckpt_tensor_info* x = k < c->tensor_count ? &c->tensors[k] : &c->wholes[k - c->tensor_count];
      if (!x->rows && !strcmp(x->name, e->names[i])) t = x;
    }
    if (!t) ST__FAIL("'%s': has no tensor '%s', which the model needs", mpath, e->names[i]);
    if (t->type.dtype != e->types[i].dtype || t->type.rank != e->types[i].rank ||
        memcmp(t->type.dims, e->types[i].dims, sizeof(int64_t) * (size_t)t->type.rank)) {
      char a[96], b[96];
      st__type_str(&t->type, a, sizeof(a));
      st__type_str(&e->types[i], b, sizeof(b));
      ST__FAIL("%s/%s: tensor '%s' is %s in the checkpoint, the model needs %s (shape/dtype mismatch)", c->dir, t->file, t->name, a, b);
    }
  }
  int logical = c->whole_count;
  for (int k = 0; k < c->tensor_count; ++k) logical += !c->tensors[k].rows;
  if (e->count > 0 && logical != e->count) {
    for (int k = 0; k < n; ++k) {
      const st_ckpt_tensor_info* x = k < c->tensor_count ? &c->tensors[k] : &c->wholes[k - c->tensor_count];
      bool needed = x->rows;
      for (int i = 0; i < e->count && !needed; ++i) needed = !strcmp(x->name, e->names[i]);
      if (!needed) ST__FAIL("%s/%s: tensor '%s' is not part of the model", c->dir, x->file, x->name);
    }
  }
done:
  free(mpath);
  return s;
}

/* One file: size, structure, every tensor against the manifest, checksums. */
static st_status st__check_file(st_ckpt* c, int fi, st_safetensors** out) {
  *out = NULL;
  const st_ckpt_file_info* f = &c->files[fi];
  char* path = st_path_join(c->dir, f->file);
  st_status s = ST_OK;
  st_safetensors* sf = NULL;
  struct stat st;
  if (stat(path, &st) != 0) ST__FAIL("%s: tensor file is missing (%s)", path, strerror(errno));
  if ((size_t)st.st_size < f->bytes)
    ST__FAIL("%s: truncated: %lld of %zu bytes (the tensors from byte %lld on are lost)", path, (long long)st.st_size, f->bytes,
             (long long)st.st_size);
  if ((size_t)st.st_size > f->bytes) ST__FAIL("%s: %lld bytes, the manifest says %zu (appended to or replaced)", path, (long long)st.st_size, f->bytes);
  st_status r = st_safetensors_read(path, &sf);
  if (r) {
    s = r;
    goto done;
  }
  for (int i = 0; i < c->tensor_count; ++i) {
    const st_ckpt_tensor_info* t = &c->tensors[i];
    if (strcmp(t->file, f->file)) continue;
    const st_safetensors_entry* e = st_safetensors_find(sf, t->name);
    if (!e) ST__FAIL("%s: tensor '%s' is in the manifest but not in the file", path, t->name);
    if (e->type.dtype != t->type.dtype || e->type.rank != t->type.rank ||
        memcmp(e->type.dims, t->type.dims, sizeof(int64_t) * (size_t)t->type.rank)) {
      char a[96], b[96];
      st__type_str(&e->type, a, sizeof(a));
      st__type_str(&t->type, b, sizeof(b));
      ST__FAIL("%s: tensor '%s' is %s in the file but %s in the manifest (shape/dtype mismatch)", path, t->name, a, b);
    }
    if (e->offset != t->offset) ST__FAIL("%s: tensor '%s' is at byte %zu in the file but %zu in the manifest", path, t->name, e->offset, t->offset);
    uint64_t h = st_hash64(sf->data + e->offset, e->bytes, 0);
    if (h != t->xxh64)
      ST__FAIL("%s: tensor '%s': checksum mismatch (xxh64 %016" PRIx64 " in the manifest, %016" PRIx64 " of the data): corrupt data", path,
               t->name, t->xxh64, h);
  }
  for (int k = 0; k < sf->count; ++k) {
    bool listed = false;
    for (int i = 0; i < c->tensor_count && !listed; ++i) listed = !strcmp(c->tensors[i].file, f->file) && !strcmp(c->tensors[i].name, sf->entries[k].name);
    if (!listed) ST__FAIL("%s: tensor '%s' is in the file but not in the manifest", path, sf->entries[k].name);
  }
  /* Catches what the tensor checks cannot see (the header's padding). */
  uint64_t h = st_hash64(sf->data, sf->size, 0);
  if (h != f->xxh64)
    ST__FAIL("%s: file checksum mismatch (xxh64 %016" PRIx64 " in the manifest, %016" PRIx64 " on disk) although every tensor matches: "
             "the header was altered",
             path, f->xxh64, h);
done:
  free(path);
  if (s) {
    st_safetensors_free(sf);
    return s;
  }
  *out = sf;
  return ST_OK;
}

/* Every tensor stored in rows, assembled whole from its verified pieces
 * (st__manifest_wholes checked that they tile it). */
static void st__assemble(st_ckpt* c) {
  c->whole_data = st_xcalloc((size_t)c->whole_count + 1, sizeof(void*));
  for (int w = 0; w < c->whole_count; ++w) c->whole_data[w] = st_xcalloc(c->wholes[w].bytes + 1, 1);
  for (int k = 0; k < c->tensor_count; ++k) {
    const st_ckpt_tensor_info* p = &c->tensors[k];
    if (!p->rows) continue;
    /* c->wholes is in name order (st__manifest_wholes). */
    const st_ckpt_tensor_info* t = bsearch(p->name, c->wholes, (size_t)c->whole_count, sizeof(*c->wholes), st__cmp_whole);
    if (!t) continue;
    const size_t row = t->type.dims[0] > 0 ? t->bytes / (size_t)t->type.dims[0] : 0;
    unsigned char* data = c->whole_data[t - c->wholes];
    for (int f = 0; f < c->file_count; ++f)
      if (!strcmp(c->files[f].file, p->file) && c->loaded[f])
        memcpy(data + (size_t)p->row_begin * row, c->loaded[f]->data + p->offset, p->bytes);
  }
}

static st_status st__ckpt_verify_open(const char* dir, const st_ckpt_expect* expect, const char* only, st_ckpt** out, bool* out_stop) {
  *out = NULL;
  *out_stop = false;
  st_ckpt* c = st_xcalloc(1, sizeof(*c));
  c->dir = st_xstrdup(dir);
  size_t n = strlen(c->dir);
  while (n > 1 && c->dir[n - 1] == '/') c->dir[--n] = '\0';
  json_t* manifest = NULL;
  st_status s = st__read_manifest(c->dir, c, &manifest);
  if (!s && expect) s = st__check_expect(c, expect, out_stop);
  if (!s) {
    c->loaded = st_xcalloc((size_t)c->file_count + 1, sizeof(st_safetensors*));
    for (int f = 0; f < c->file_count && !s; ++f)
      if (!only || !strcmp(c->files[f].file, only)) s = st__check_file(c, f, &c->loaded[f]);
  }
  if (!s && c->whole_count > 0) st__assemble(c);
  json_decref(manifest);
  if (s) {
    st_ckpt_free(c);
    return s;
  }
  *out = c;
  return ST_OK;
}

st_status st_ckpt_open(const char* dir, const st_ckpt_expect* expect, st_ckpt** out) {
  bool stop = false;
  return st__ckpt_verify_open(dir, expect, NULL, out, &stop);
}

st_status st_ckpt_open_file(const char* dir, const st_ckpt_expect* expect, const char* file, st_ckpt** out) {
  bool stop = false;
  return st__ckpt_verify_open(dir, expect, file, out, &stop);
}

st_status st_ckpt_find_valid(const char* root, const st_ckpt_expect* expect, st_ckpt_skip_fn on_skip, void* user, st_ckpt** out,
                             int* out_skipped) {
  *out = NULL;
  if (out_skipped) *out_skipped = 0;
  st_ckpt_entry* v = NULL;
  int n = 0;
  ST_RETURN(st_ckpt_list(root, &v, &n));
  for (int i = 0; i < n && !*out; ++i) {
    st_ckpt* c = NULL;
    bool stop = false;
    st_status s = st__ckpt_verify_open(v[i].dir, expect, NULL, &c, &stop);
    /* Another tokenizer is no corruption to skip past: every checkpoint of
     * the run has it, and the fix is in the config. */
    if (s && stop) {
      st_ckpt_entries_free(v, n);
      return s;
    }
    if (s) {
      if (on_skip) on_skip(user, &v[i], s);
      if (out_skipped) ++*out_skipped;
      st_status_free(s);
      continue;
    }
    *out = c;
  }
  st_ckpt_entries_free(v, n);
  return ST_OK;
}
