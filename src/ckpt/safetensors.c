/* safetensors.c — the safetensors file format, written and read by hand:
 *
 *   [u64 little-endian N][N bytes JSON header, space-padded][tensor data]
 *
 * The header maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end)} with offsets relative to the start of the data, plus an
 * optional "__metadata__" object of strings. The reader accepts only files
 * the Python package would accept too (entries tiling the data region
 * exactly), so a file strata loads is a file every other tool loads. */
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/ckpt.h"

/* Headers of real checkpoints are kilobytes; anything near this is damage. */
#define ST__MAX_HEADER (100u << 20)

static const struct {
  st_dtype dtype;
  const char* name;
} kDtypes[] = {
    {ST_DTYPE_F32, "F32"},  {ST_DTYPE_BF16, "BF16"}, {ST_DTYPE_F16, "F16"}, {ST_DTYPE_F64, "F64"},
    {ST_DTYPE_S32, "I32"},  {ST_DTYPE_S64, "I64"},   {ST_DTYPE_S16, "I16"}, {ST_DTYPE_S8, "I8"},
    {ST_DTYPE_U32, "U32"},  {ST_DTYPE_U64, "U64"},   {ST_DTYPE_U16, "U16"}, {ST_DTYPE_U8, "U8"},
    {ST_DTYPE_PRED, "BOOL"},
};

const char* st_safetensors_dtype_name(st_dtype d) {
  for (size_t i = 0; i < sizeof(kDtypes) / sizeof(kDtypes[0]); ++i)
    if (kDtypes[i].dtype == d) return kDtypes[i].name;
  return NULL;
}

st_dtype st_safetensors_dtype_parse(const char* name) {
  for (size_t i = 0; i < sizeof(kDtypes) / sizeof(kDtypes[0]); ++i)
    if (!strcmp(kDtypes[i].name, name)) return kDtypes[i].dtype;
  return ST_DTYPE_INVALID;
}

st_status st_safetensors_header(const st_named_tensor* tensors, int count, const char* origin, char** out_header,
                                size_t* out_header_size, size_t* out_data_size) {
  *out_header = NULL;
  json_t* j = st_json_obj();
  json_t* meta = st_json_obj();
  st_json_put_str(meta, "format", "pt");
  st_json_put_str(meta, "writer", "strata");
  st_json_put(j, "__metadata__", meta);
  size_t offset = 0;
  for (int i = 0; i < count; ++i) {
    const char* dt = st_safetensors_dtype_name(tensors[i].type.dtype);
    st_status s = ST_OK;
    if (!dt)
      s = st_status_make(ST_CODE_CKPT, "%s: tensor '%s' has dtype %s, which safetensors cannot hold", origin, tensors[i].name,
                         st_dtype_name(tensors[i].type.dtype));
    else if (!tensors[i].name || !strcmp(tensors[i].name, "__metadata__") || json_object_get(j, tensors[i].name))
      s = st_status_make(ST_CODE_CKPT, "%s: tensor name '%s' is reserved or given twice", origin,
                         tensors[i].name ? tensors[i].name : "(null)");
    if (s) {
      json_decref(j);
      return s;
    }
    size_t n = st_tensor_type_bytes(&tensors[i].type);
    json_t* t = st_json_obj();
    st_json_put_str(t, "dtype", dt);
    json_t* shape = st_json_arr();
    for (int d = 0; d < tensors[i].type.rank; ++d) st_json_push(shape, st_json_int(tensors[i].type.dims[d]));
    st_json_put(t, "shape", shape);
    json_t* offsets = st_json_arr();
    st_json_push(offsets, st_json_int((int64_t)offset));
    st_json_push(offsets, st_json_int((int64_t)(offset + n)));
    st_json_put(t, "data_offsets", offsets);
    st_json_put(j, tensors[i].name, t);
    offset += n;
  }
  char* text = st_json_dump(j, 0);
  json_decref(j);
  st_strbuf h = {0};
  st_strbuf_append(&h, text);
  free(text);
  /* Data starts 8-byte aligned, so a reader may map it as f64/i64. */
  while ((8 + h.len) % 8) st_strbuf_append(&h, " ");
  char* out = st_xmalloc(8 + h.len);
  uint64_t n = h.len;
  for (int i = 0; i < 8; ++i) out[i] = (char)(unsigned char)(n >> (8 * i));
  memcpy(out + 8, h.data, h.len);
  *out_header = out;
  *out_header_size = 8 + h.len;
  *out_data_size = offset;
  st_strbuf_free(&h);
  return ST_OK;
}

st_status st_safetensors_write(const char* path, const st_named_tensor* tensors, int count) {
  char* header = NULL;
  size_t header_size = 0, data_size = 0;
  ST_RETURN(st_safetensors_header(tensors, count, path, &header, &header_size, &data_size));
  size_t total = header_size + data_size;
  unsigned char* buf = st_xmalloc(total);
  memcpy(buf, header, header_size);
  free(header);
  size_t at = header_size;
  for (int i = 0; i < count; ++i) {
    size_t bytes = st_tensor_type_bytes(&tensors[i].type);
    memcpy(buf + at, tensors[i].data, bytes);
    at += bytes;
  }
  st_status s = st_fs_write_atomic(path, buf, total);
  free(buf);
  return st_status_recode(s, ST_CODE_CKPT, "saving tensors");
}

/*===-------------------------------------------------------------------===*/
/* Reader                                                                   */
/*===-------------------------------------------------------------------===*/

void st_safetensors_free(st_safetensors* f) {
  if (!f) return;
  for (int i = 0; i < f->count; ++i) free(f->entries[i].name);
  free(f->entries);
  free(f->data);
  free(f->path);
  free(f);
}

const st_safetensors_entry* st_safetensors_find(const st_safetensors* f, const char* name) {
  for (int i = 0; i < f->count; ++i)
    if (!strcmp(f->entries[i].name, name)) return &f->entries[i];
  return NULL;
}

static int st__by_offset(const void* a, const void* b) {
  const st_safetensors_entry* x = a;
  const st_safetensors_entry* y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static st_status st__parse_entry(const char* path, const char* name, const json_t* v, size_t data_size,
                                 st_safetensors_entry* e) {
  const json_t* dt = json_object_get(v, "dtype");
  const json_t* shape = json_object_get(v, "shape");
  const json_t* off = json_object_get(v, "data_offsets");
  if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(off) || json_array_size(off) != 2)
    return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': header entry needs \"dtype\", \"shape\" and \"data_offsets\": [begin, end]",
                          path, name);
  e->type.dtype = st_safetensors_dtype_parse(json_string_value(dt));
  if (e->type.dtype == ST_DTYPE_INVALID)
    return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': unknown dtype \"%s\"", path, name, json_string_value(dt));
  size_t rank = json_array_size(shape);
  if (rank > ST_MAX_RANK) return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': rank %zu exceeds %d", path, name, rank, ST_MAX_RANK);
  e->type.rank = (int)rank;
  for (size_t d = 0; d < rank; ++d) {
    int64_t x = -1;
    if (!st_json_as_int(json_array_get(shape, d), &x) || x < 0 || x > ((int64_t)1 << 53))
      return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': shape dimension %zu is not a non-negative integer", path, name, d);
    e->type.dims[d] = x;
  }
  int64_t b = -1, en = -1;
  if (!st_json_as_int(json_array_get(off, 0), &b) || !st_json_as_int(json_array_get(off, 1), &en) || b < 0 || en < b)
    return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': data_offsets are not integers begin <= end", path, name);
  if ((uint64_t)en > data_size)
    return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': data_offsets end %lld is past the end of the data (%zu bytes): truncated file?",
                          path, name, (long long)en, data_size);
  size_t want = st_tensor_type_bytes(&e->type);
  if ((size_t)(en - b) != want) {
    char t[96];
    return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': %s needs %zu bytes but data_offsets span %lld", path, name,
                          st_tensor_type_format(&e->type, t, sizeof(t)), want, (long long)(en - b));
  }
  e->offset = (size_t)b;
  e->bytes = want;
  return ST_OK;
}

st_status st_safetensors_parse(const char* path, unsigned char* data, size_t size, st_safetensors** out) {
  *out = NULL;
  st_safetensors* f = st_xcalloc(1, sizeof(*f));
  f->path = st_xstrdup(path);
  f->data = data;
  f->size = size;
  st_status s = ST_OK;
  json_t* h = NULL;
  uint64_t n = 0;
  if (size < 8) {
    s = st_status_make(ST_CODE_CKPT, "%s: %zu bytes is too short for a safetensors file (truncated?)", path, size);
    goto done;
  }
  for (int i = 0; i < 8; ++i) n |= (uint64_t)data[i] << (8 * i);
  if (n > size - 8 || n > ST__MAX_HEADER) {
    s = st_status_make(ST_CODE_CKPT, "%s: header length %llu does not fit in the file's %zu bytes (truncated or not safetensors)",
                       path, (unsigned long long)n, size);
    goto done;
  }
  f->data_start = 8 + (size_t)n;
  s = st_json_parse((const char*)data + 8, (size_t)n, path, &h);
  if (s) {
    s = st_status_recode(s, ST_CODE_CKPT, "%s: header", path);
    goto done;
  }
  if (!json_is_object(h)) {
    s = st_status_make(ST_CODE_CKPT, "%s: header is not a JSON object", path);
    goto done;
  }
  f->entries = st_xcalloc(json_object_size(h) + 1, sizeof(*f->entries));
  size_t data_size = size - f->data_start;
  const char* key;
  json_t* v;
  json_object_foreach(h, key, v) {
    if (!strcmp(key, "__metadata__")) continue;
    st_safetensors_entry* e = &f->entries[f->count];
    s = st__parse_entry(path, key, v, data_size, e);
    if (s) break;
    e->name = st_xstrdup(key);
    f->count++;
  }
  if (s) goto done;
  /* The entries must cover [0, data_size) without gaps or overlaps. */
  st_safetensors_entry* sorted = st_xmalloc(((size_t)f->count + 1) * sizeof(*sorted));
  memcpy(sorted, f->entries, (size_t)f->count * sizeof(*sorted));
  qsort(sorted, (size_t)f->count, sizeof(*sorted), st__by_offset);
  size_t at = 0;
  for (int i = 0; i < f->count && !s; ++i) {
    if (sorted[i].offset != at)
      s = st_status_make(ST_CODE_CKPT, "%s: tensor '%s' starts at data offset %zu, expected %zu (%s)", path, sorted[i].name,
                         sorted[i].offset, at, sorted[i].offset > at ? "gap" : "overlap");
    at = sorted[i].offset + sorted[i].bytes;
  }
  free(sorted);
  if (!s && at != data_size)
    s = st_status_make(ST_CODE_CKPT, "%s: tensors cover %zu data bytes but the file holds %zu (%s)", path, at, data_size,
                       at < data_size ? "trailing bytes" : "truncated");
  for (int i = 0; i < f->count; ++i) f->entries[i].offset += f->data_start;
done:
  json_decref(h);
  if (s) {
    st_safetensors_free(f);
    return s;
  }
  *out = f;
  return ST_OK;
}

st_status st_safetensors_read(const char* path, st_safetensors** out) {
  *out = NULL;
  char* data = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &data, &size);
  if (s) return st_status_set_code(s, ST_CODE_CKPT);
  return st_safetensors_parse(path, (unsigned char*)data, size, out);
}
