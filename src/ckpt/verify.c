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

#include "strata/base.h"
#include "strata/ckpt.h"

void st_ckpt_free(st_ckpt* c) {
  if (!c) return;
  for (int i = 0; i < c->tensor_count; ++i) {
    free(c->tensors[i].name);
    free(c->tensors[i].file);
  }
  free(c->tensors);
  for (int i = 0; i < c->file_count; ++i) {
    free(c->files[i].file);
    if (c->loaded) st_safetensors_free(c->loaded[i]);
  }
  free(c->files);
  free(c->loaded);
  free(c->dir);
  free(c->config_hash);
  free(c->bundle_key);
  free(c->model_json);
  free(c->config_json);
  free(c);
}

const void* st_ckpt_tensor_data(const st_ckpt* c, const char* name, const st_ckpt_tensor_info** out_info) {
  if (out_info) *out_info = NULL;
  if (!c->loaded) return NULL;
  for (int i = 0; i < c->tensor_count; ++i) {
    const st_ckpt_tensor_info* t = &c->tensors[i];
    if (strcmp(t->name, name)) continue;
    for (int f = 0; f < c->file_count; ++f) {
      if (strcmp(c->files[f].file, t->file) || !c->loaded[f]) continue;
      if (out_info) *out_info = t;
      return c->loaded[f]->data + t->offset;
    }
  }
  return NULL;
}

static json_t* st__to_tree(const st_json* j) {
  switch (j->kind) {
    case ST_JSON_NULL: return json_null();
    case ST_JSON_BOOL: return st_json_bool(j->boolean);
    case ST_JSON_NUMBER:
      return j->number == floor(j->number) && fabs(j->number) < 9e15 ? st_json_int((int64_t)j->number) : st_json_num(j->number);
    case ST_JSON_STRING: return st_json_str(j->string);
    case ST_JSON_ARRAY:
    case ST_JSON_OBJECT: {
      json_t* v = j->kind == ST_JSON_ARRAY ? st_json_arr() : st_json_obj();
      for (size_t i = 0; i < j->count; ++i) {
        if (j->kind == ST_JSON_OBJECT)
          st_json_put(v, j->keys[i], st__to_tree(&j->items[i]));
        else
          st_json_push(v, st__to_tree(&j->items[i]));
      }
      return v;
    }
  }
  return json_null();
}

/* Serializes a parsed JSON value back to text (for the manifest's model and
 * config objects, which st_ckpt exposes as strings). */
static void st__json_write(st_strbuf* b, const st_json* j) {
  json_t* tree = st__to_tree(j);
  char* text = st_json_dump(tree, 0);
  json_decref(tree);
  st_strbuf_append(b, text);
  free(text);
}

static bool st__json_equal(const st_json* a, const st_json* b) {
  if (a->kind != b->kind) return false;
  switch (a->kind) {
    case ST_JSON_NULL: return true;
    case ST_JSON_BOOL: return a->boolean == b->boolean;
    case ST_JSON_NUMBER: return a->number == b->number;
    case ST_JSON_STRING: return !strcmp(a->string, b->string);
    case ST_JSON_ARRAY:
      if (a->count != b->count) return false;
      for (size_t i = 0; i < a->count; ++i)
        if (!st__json_equal(&a->items[i], &b->items[i])) return false;
      return true;
    case ST_JSON_OBJECT:
      if (a->count != b->count) return false;
      for (size_t i = 0; i < a->count; ++i) {
        const st_json* o = st_json_get(b, a->keys[i]);
        if (!o || !st__json_equal(&a->items[i], o)) return false;
      }
      return true;
  }
  return false;
}

/* "d_model 64 in the checkpoint, 32 now; n_layers ..." for the keys that differ. */
static void st__model_diff(const st_json* have, const st_json* want, st_strbuf* out) {
  st_strbuf a = {0}, b = {0};
  for (size_t i = 0; i < want->count; ++i) {
    const st_json* h = st_json_get(have, want->keys[i]);
    if (h && st__json_equal(h, &want->items[i])) continue;
    st_strbuf_reset(&a);
    st_strbuf_reset(&b);
    if (h) st__json_write(&a, h);
    st__json_write(&b, &want->items[i]);
    if (out->len) st_strbuf_append(out, ", ");
    st_strbuf_printf(out, "model.%s %s in the checkpoint, %s now", want->keys[i], h ? a.data : "(absent)", b.data);
  }
  for (size_t i = 0; i < have->count; ++i) {
    if (st_json_get(want, have->keys[i])) continue;
    if (out->len) st_strbuf_append(out, ", ");
    st_strbuf_printf(out, "model.%s only in the checkpoint", have->keys[i]);
  }
  st_strbuf_free(&a);
  st_strbuf_free(&b);
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
static st_status st__read_manifest(const char* dir, st_ckpt* c, st_json** out_json) {
  *out_json = NULL;
  char* path = st_path_join(dir, ST_CKPT_MANIFEST);
  char* text = NULL;
  size_t size = 0;
  st_json* j = NULL;
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
  r = st_json_parse(text, size, path, &j);
  if (r) {
    s = st_status_recode(r, ST_CODE_CKPT, "'%s' is malformed", path);
    goto done;
  }
  if (j->kind != ST_JSON_OBJECT) ST__FAIL("'%s' is malformed: not a JSON object", path);
  /* Self-checksum: xxh64 of every byte before the line holding it. */
  const st_json* mh = st_json_get(j, "manifest_xxh64");
  const char* mark = NULL;
  for (const char* p = strstr(text, "\"manifest_xxh64\""); p; p = strstr(p + 1, "\"manifest_xxh64\"")) mark = p;
  uint64_t want = 0;
  if (!mh || mh->kind != ST_JSON_STRING || !mark || !st__parse_hex64(mh->string, &want))
    ST__FAIL("'%s' has no valid \"manifest_xxh64\": not written by strata, or damaged", path);
  const char* line = mark;
  while (line > text && line[-1] != '\n') --line;
  uint64_t got = st_hash64(text, (size_t)(line - text), 0);
  if (got != want)
    ST__FAIL("'%s' fails its checksum (xxh64 %016" PRIx64 " recorded, %016" PRIx64 " computed): the manifest was modified or damaged",
             path, want, got);
  const st_json* fmt = st_json_get(j, "format");
  if (!fmt || fmt->kind != ST_JSON_STRING || strcmp(fmt->string, ST_CKPT_FORMAT))
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

  /* Typed fields; a missing one names itself. */
  const char* ints[] = {"step", "optimizer_step"};
  int64_t* int_dst[] = {&c->step, &c->optimizer_step};
  for (int i = 0; i < 2; ++i) {
    if ((r = st_json_get_int(j, ints[i], path, int_dst[i]))) {
      st_status_free(r);
      ST__FAIL("'%s': \"%s\" is missing or not an integer", path, ints[i]);
    }
  }
  const st_json* data = st_json_get(j, "data");
  const st_json* rng = st_json_get(j, "rng");
  const st_json* lr = st_json_get(j, "lr_schedule");
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
  const st_json* lrv = lr ? st_json_get(lr, "lr") : NULL;
  if (!lr || !lrv || lrv->kind != ST_JSON_NUMBER || (r = st_json_get_int(lr, "total_steps", path, &c->total_steps))) {
    st_status_free(r);
    ST__FAIL("'%s': \"lr_schedule\" needs a number \"lr\" and an integer \"total_steps\"", path);
  }
  c->lr = lrv->number;
  const st_json* created = st_json_get(j, "created");
  c->created = created && created->kind == ST_JSON_NUMBER ? created->number : 0;
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
  const st_json* model = st_json_get(j, "model");
  const st_json* config = st_json_get(j, "config");
  if (!model || model->kind != ST_JSON_OBJECT || !config || config->kind != ST_JSON_OBJECT)
    ST__FAIL("'%s': \"model\" and \"config\" must be objects", path);
  st_strbuf b = {0};
  st__json_write(&b, model);
  c->model_json = b.data;
  st_strbuf b2 = {0};
  st__json_write(&b2, config);
  c->config_json = b2.data;

  const st_json* files = st_json_get(j, "files");
  const st_json* tensors = st_json_get(j, "tensors");
  if (!files || files->kind != ST_JSON_ARRAY || !tensors || tensors->kind != ST_JSON_ARRAY)
    ST__FAIL("'%s': \"files\" and \"tensors\" must be arrays", path);
  c->files = st_xcalloc(files->count + 1, sizeof(*c->files));
  for (size_t i = 0; i < files->count; ++i) {
    const st_json* f = &files->items[i];
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
  c->tensors = st_xcalloc(tensors->count + 1, sizeof(*c->tensors));
  for (size_t i = 0; i < tensors->count; ++i) {
    const st_json* t = &tensors->items[i];
    const char *name = NULL, *file = NULL, *dtype = NULL, *hash = NULL;
    int64_t offset = 0, bytes = 0;
    const st_json* shape = NULL;
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
    ti->offset = (size_t)offset;
    ti->bytes = (size_t)bytes;
    ti->type.dtype = st_safetensors_dtype_parse(dtype);
    if (ti->type.dtype == ST_DTYPE_INVALID) ST__FAIL("'%s': tensor '%s' has unknown dtype \"%s\"", path, name, dtype);
    if (shape->count > ST_MAX_RANK) ST__FAIL("'%s': tensor '%s' has rank %zu > %d", path, name, shape->count, ST_MAX_RANK);
    ti->type.rank = (int)shape->count;
    for (size_t d = 0; d < shape->count; ++d) {
      double x = shape->items[d].number;
      if (shape->items[d].kind != ST_JSON_NUMBER || x < 0 || x != floor(x) || x > 9e15)
        ST__FAIL("'%s': tensor '%s' has a bad shape", path, name);
      ti->type.dims[d] = (int64_t)x;
    }
    if (!st__parse_hex64(hash, &ti->xxh64)) ST__FAIL("'%s': tensor '%s' has a bad xxh64 \"%s\"", path, name, hash);
    if (st_tensor_type_bytes(&ti->type) != ti->bytes) ST__FAIL("'%s': tensor '%s': bytes %zu do not match its shape", path, name, ti->bytes);
    bool known = false;
    for (int f = 0; f < c->file_count; ++f) known |= !strcmp(c->files[f].file, file);
    if (!known) ST__FAIL("'%s': tensor '%s' lives in \"%s\", which \"files\" does not list", path, name, file);
    for (int k = 0; k + 1 < c->tensor_count; ++k)
      if (!strcmp(c->tensors[k].name, name)) ST__FAIL("'%s': tensor '%s' is listed twice", path, name);
  }
done:
  free(path);
  free(text);
  if (s) {
    st_json_free(j);
    return s;
  }
  *out_json = j;
  return ST_OK;
}

/* Is this the checkpoint of the model being trained? */
static st_status st__check_expect(const st_ckpt* c, const st_json* manifest, const st_ckpt_expect* e) {
  st_status s = ST_OK;
  char* mpath = st_path_join(c->dir, ST_CKPT_MANIFEST);
  st_json* want = NULL;
  if (e->model_json) {
    st_status r = st_json_parse(e->model_json, strlen(e->model_json), "model", &want);
    if (r) {
      s = st_status_recode(r, ST_CODE_INTERNAL, "expected model JSON does not parse");
      goto done;
    }
    const st_json* have = st_json_get(manifest, "model");
    if (!st__json_equal(have, want)) {
      st_strbuf d = {0};
      st__model_diff(have, want, &d);
      s = st_status_make(ST_CODE_CKPT, "'%s': written for a different model config (%s)", mpath, d.data ? d.data : "?");
      st_strbuf_free(&d);
      goto done;
    }
  }
  if (e->bundle_key && strcmp(e->bundle_key, c->bundle_key))
    ST__FAIL("'%s': written with bundle %s, this run uses bundle %s (same model config, different exporter or bundle schema)", mpath,
             c->bundle_key, e->bundle_key);
  for (int i = 0; i < e->count; ++i) {
    const st_ckpt_tensor_info* t = NULL;
    for (int k = 0; k < c->tensor_count && !t; ++k)
      if (!strcmp(c->tensors[k].name, e->names[i])) t = &c->tensors[k];
    if (!t) ST__FAIL("'%s': has no tensor '%s', which the model needs", mpath, e->names[i]);
    if (t->type.dtype != e->types[i].dtype || t->type.rank != e->types[i].rank ||
        memcmp(t->type.dims, e->types[i].dims, sizeof(int64_t) * (size_t)t->type.rank)) {
      char a[96], b[96];
      st__type_str(&t->type, a, sizeof(a));
      st__type_str(&e->types[i], b, sizeof(b));
      ST__FAIL("%s/%s: tensor '%s' is %s in the checkpoint, the model needs %s (shape/dtype mismatch)", c->dir, t->file, t->name, a, b);
    }
  }
  if (e->count > 0 && c->tensor_count != e->count) {
    for (int k = 0; k < c->tensor_count; ++k) {
      bool needed = false;
      for (int i = 0; i < e->count && !needed; ++i) needed = !strcmp(c->tensors[k].name, e->names[i]);
      if (!needed) ST__FAIL("%s/%s: tensor '%s' is not part of the model", c->dir, c->tensors[k].file, c->tensors[k].name);
    }
  }
done:
  st_json_free(want);
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

st_status st_ckpt_open(const char* dir, const st_ckpt_expect* expect, st_ckpt** out) {
  *out = NULL;
  st_ckpt* c = st_xcalloc(1, sizeof(*c));
  c->dir = st_xstrdup(dir);
  size_t n = strlen(c->dir);
  while (n > 1 && c->dir[n - 1] == '/') c->dir[--n] = '\0';
  st_json* manifest = NULL;
  st_status s = st__read_manifest(c->dir, c, &manifest);
  if (!s && expect) s = st__check_expect(c, manifest, expect);
  if (!s) {
    c->loaded = st_xcalloc((size_t)c->file_count + 1, sizeof(st_safetensors*));
    for (int f = 0; f < c->file_count && !s; ++f) s = st__check_file(c, f, &c->loaded[f]);
  }
  st_json_free(manifest);
  if (s) {
    st_ckpt_free(c);
    return s;
  }
  *out = c;
  return ST_OK;
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
    st_status s = st_ckpt_open(v[i].dir, expect, &c);
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
