/* safetensors.c — the safetensors file format, written and read by hand:
 *
 *   [u64 little-endian N][N bytes JSON header, space-padded][tensor data]
 *
 * The header maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end)} with offsets relative to the start of the data, plus an
 * optional "__metadata__" object of strings. The reader accepts only files
 * the Python package accepts too (its JSON rules, entries tiling the data
 * region exactly), so a file strata loads is a file every other tool loads. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"

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
  /* Written piece by piece from the caller's buffers: no second copy of
   * the tensors in memory (a model's parameters can be gigabytes). */
  st_fs_piece* pieces = st_xcalloc((size_t)count + 2, sizeof(*pieces));
  pieces[0] = (st_fs_piece){header, header_size};
  for (int i = 0; i < count; ++i) pieces[i + 1] = (st_fs_piece){tensors[i].data, st_tensor_type_bytes(&tensors[i].type)};
  st_status s = st_fs_write_atomic_pieces(path, pieces, count + 1);
  free(pieces);
  free(header);
  return st_status_recode(s, ST_CODE_CKPT, "saving tensors");
}

/*===-------------------------------------------------------------------===*/
/* Reader                                                                   */
/*===-------------------------------------------------------------------===*/

/* The header is read by its own strict parser, not the general JSON reader,
 * because "accepted" must mean exactly what the Python `safetensors`
 * package accepts (serde_json into its Rust structs), and that depends on
 * details a JSON tree does not keep: integer versus float spelling, a
 * duplicate field, a number out of f64 range inside an ignored field, the
 * nesting limit. tests/py/test_safetensors_hostile.py runs both readers on
 * the same files. What the package accepts and strata still refuses is
 * listed in docs/checkpoints.md ("safetensors"): dtypes strata has no type
 * for, rank above ST_MAX_RANK, a NUL in a tensor name, a dimension above
 * INT64_MAX. */

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

/* The package's dtype names; bits 0 marks those strata has no type for. */
static const struct {
  const char* name;
  int bits;
} kAllDtypes[] = {
    {"BOOL", 8},    {"U8", 8},       {"I8", 8},      {"I16", 16},         {"U16", 16},         {"F16", 16},
    {"BF16", 16},   {"I32", 32},     {"U32", 32},    {"F32", 32},         {"F64", 64},         {"I64", 64},
    {"U64", 64},    {"F4", 0},       {"F6_E2M3", 0}, {"F6_E3M2", 0},      {"F8_E5M2", 0},      {"F8_E4M3", 0},
    {"F8_E8M0", 0}, {"C64", 0},      {"F8_E4M3FNUZ", 0}, {"F8_E5M2FNUZ", 0},
};

/* serde_json refuses a value nested deeper than this (the header object is
 * level 1). */
#define ST__SERDE_MAX_DEPTH 127

typedef struct {
  const unsigned char* begin;
  const unsigned char* p;
  const unsigned char* end;
  int depth;
  const char* why; /* first problem; NULL while fine */
  char detail[96];  /* |why| when it names a value */
} st__sp;

typedef struct {
  char* name;
  size_t name_len;
  size_t order; /* position in the header */
  const char* dtype_name; /* static; NULL until parsed */
  st_dtype dtype;         /* ST_DTYPE_INVALID for a package dtype strata lacks */
  size_t rank;            /* may exceed ST_MAX_RANK (refused later) */
  uint64_t dims[ST_MAX_RANK];
  uint64_t begin, end;
} st__sp_tensor;

static bool st__sp_fail(st__sp* sp, const char* why) {
  if (!sp->why) sp->why = why;
  return false;
}

static void st__sp_ws(st__sp* sp) {
  while (sp->p < sp->end && (*sp->p == ' ' || *sp->p == '\t' || *sp->p == '\n' || *sp->p == '\r')) ++sp->p;
}

static bool st__sp_eat(st__sp* sp, char c) {
  st__sp_ws(sp);
  if (sp->p < sp->end && *sp->p == (unsigned char)c) {
    ++sp->p;
    return true;
  }
  return false;
}

static bool st__sp_peek(st__sp* sp, char c) {
  st__sp_ws(sp);
  return sp->p < sp->end && *sp->p == (unsigned char)c;
}

/* Rust's str::from_utf8: no overlong forms, no surrogates, <= U+10FFFF. */
static bool st__utf8_valid(const unsigned char* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return false;
    if (n - i < len) return false;
    if (s[i + 1] < lo || s[i + 1] > hi) return false;
    for (size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return false;
    i += len;
  }
  return true;
}

static int st__hex4(const unsigned char* p) {
  int v = 0;
  for (int i = 0; i < 4; ++i) {
    int c = p[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v << 4 | d;
  }
  return v;
}

/* A string at sp->p (its opening quote). With |out|, the decoded bytes
 * (NUL-terminated, may contain NULs: *out_len says) go there, malloc'ed. */
static bool st__sp_string(st__sp* sp, char** out, size_t* out_len) {
  if (!st__sp_eat(sp, '"')) return st__sp_fail(sp, "expected a string");
  st_strbuf b = {0};
  if (out) st_strbuf_append(&b, "");
  while (sp->p < sp->end && *sp->p != '"') {
    unsigned char c = *sp->p;
    if (c < 0x20) {
      st_strbuf_free(&b);
      return st__sp_fail(sp, "control character in a string");
    }
    if (c != '\\') {
      const unsigned char* run = sp->p;
      while (sp->p < sp->end && *sp->p != '"' && *sp->p != '\\' && *sp->p >= 0x20) ++sp->p;
      if (out) st_strbuf_append_n(&b, (const char*)run, (size_t)(sp->p - run));
      continue;
    }
    if (sp->end - sp->p < 2) break;
    unsigned char e = sp->p[1];
    sp->p += 2;
    const char* simple = NULL;
    switch (e) {
      case '"': simple = "\""; break;
      case '\\': simple = "\\"; break;
      case '/': simple = "/"; break;
      case 'b': simple = "\b"; break;
      case 'f': simple = "\f"; break;
      case 'n': simple = "\n"; break;
      case 'r': simple = "\r"; break;
      case 't': simple = "\t"; break;
      case 'u': break;
      default: st_strbuf_free(&b); return st__sp_fail(sp, "invalid escape in a string");
    }
    if (simple) {
      if (out) st_strbuf_append_n(&b, simple, 1);
      continue;
    }
    int cp = sp->end - sp->p >= 4 ? st__hex4(sp->p) : -1;
    if (cp < 0) {
      st_strbuf_free(&b);
      return st__sp_fail(sp, "invalid \\u escape");
    }
    sp->p += 4;
    if (cp >= 0xDC00 && cp <= 0xDFFF) {
      st_strbuf_free(&b);
      return st__sp_fail(sp, "lone surrogate in a \\u escape");
    }
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      int lo = sp->end - sp->p >= 6 && sp->p[0] == '\\' && sp->p[1] == 'u' ? st__hex4(sp->p + 2) : -1;
      if (lo < 0xDC00 || lo > 0xDFFF) {
        st_strbuf_free(&b);
        return st__sp_fail(sp, "lone surrogate in a \\u escape");
      }
      sp->p += 6;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (out) {
      char u[4];
      size_t n;
      if (cp < 0x80) {
        u[0] = (char)cp, n = 1;
      } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
      } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
      } else {
        u[0] = (char)(0xF0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)), u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)),
        u[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
      }
      st_strbuf_append_n(&b, u, n);
    }
  }
  if (sp->p >= sp->end) {
    st_strbuf_free(&b);
    return st__sp_fail(sp, "unterminated string");
  }
  ++sp->p;
  if (out) {
    *out = b.data;
    *out_len = b.len;
  }
  return true;
}

/* A number; *out_u64 is set and true returned in *is_u64 when it is a
 * non-negative integer spelled without fraction or exponent that fits in
 * 64 bits (what serde_json hands a usize). Any other number must still be
 * a finite f64. */
static bool st__sp_number(st__sp* sp, uint64_t* out_u64, bool* is_u64) {
  st__sp_ws(sp);
  const unsigned char* s = sp->p;
  const unsigned char* q = s;
  bool neg = false, integer = true;
  if (q < sp->end && *q == '-') neg = true, ++q;
  if (q >= sp->end || *q < '0' || *q > '9') return st__sp_fail(sp, "invalid number");
  if (*q == '0') {
    ++q;
  } else {
    while (q < sp->end && *q >= '0' && *q <= '9') ++q;
  }
  if (q < sp->end && *q == '.') {
    integer = false;
    ++q;
    if (q >= sp->end || *q < '0' || *q > '9') return st__sp_fail(sp, "invalid number");
    while (q < sp->end && *q >= '0' && *q <= '9') ++q;
  }
  if (q < sp->end && (*q == 'e' || *q == 'E')) {
    integer = false;
    ++q;
    if (q < sp->end && (*q == '+' || *q == '-')) ++q;
    if (q >= sp->end || *q < '0' || *q > '9') return st__sp_fail(sp, "invalid number");
    while (q < sp->end && *q >= '0' && *q <= '9') ++q;
  }
  if (q < sp->end && *q >= '0' && *q <= '9') return st__sp_fail(sp, "invalid number"); /* "00" */
  sp->p = q;
  *is_u64 = false;
  if (integer) {
    uint64_t v = 0;
    bool fits = true;
    for (const unsigned char* d = s + neg; d < q && fits; ++d) {
      unsigned digit = (unsigned)(*d - '0');
      if (v > (UINT64_MAX - digit) / 10) fits = false;
      else v = v * 10 + digit;
    }
    if (fits && !neg) {
      *out_u64 = v;
      *is_u64 = true;
      return true;
    }
    if (fits && v <= (uint64_t)INT64_MAX + 1) return true; /* an i64 */
  }
  size_t n = (size_t)(q - s);
  char small[64];
  char* buf = n < sizeof(small) ? small : st_xmalloc(n + 1);
  memcpy(buf, s, n);
  buf[n] = '\0';
  double d = strtod(buf, NULL);
  if (buf != small) free(buf);
  if (!isfinite(d)) return st__sp_fail(sp, "number out of range");
  return true;
}

static bool st__sp_lit(st__sp* sp, const char* lit) {
  st__sp_ws(sp);
  size_t n = strlen(lit);
  if ((size_t)(sp->end - sp->p) < n || memcmp(sp->p, lit, n)) return false;
  sp->p += n;
  return true;
}

static bool st__sp_enter(st__sp* sp) {
  if (++sp->depth > ST__SERDE_MAX_DEPTH) return st__sp_fail(sp, "nesting deeper than 127 (serde_json's limit)");
  return true;
}

/* Any JSON value, checked and dropped (a field the package ignores). */
static bool st__sp_skip(st__sp* sp) {
  st__sp_ws(sp);
  if (sp->p >= sp->end) return st__sp_fail(sp, "unexpected end of the header");
  unsigned char c = *sp->p;
  if (c == '"') return st__sp_string(sp, NULL, NULL);
  if (c == '-' || (c >= '0' && c <= '9')) {
    uint64_t u;
    bool is_u;
    return st__sp_number(sp, &u, &is_u);
  }
  if (st__sp_lit(sp, "true") || st__sp_lit(sp, "false") || st__sp_lit(sp, "null")) return true;
  if (c != '[' && c != '{') return st__sp_fail(sp, "expected a value");
  bool object = c == '{';
  ++sp->p;
  if (!st__sp_enter(sp)) return false;
  if (!st__sp_eat(sp, object ? '}' : ']')) {
    do {
      if (object && (!st__sp_string(sp, NULL, NULL) || !st__sp_eat(sp, ':'))) return st__sp_fail(sp, "expected \"key\":");
      if (!st__sp_skip(sp)) return false;
    } while (st__sp_eat(sp, ','));
    if (!st__sp_eat(sp, object ? '}' : ']')) return st__sp_fail(sp, "expected ',' or a closing bracket");
  }
  --sp->depth;
  return true;
}

static bool st__sp_u64(st__sp* sp, uint64_t* out) {
  bool is_u = false;
  if (!st__sp_peek(sp, '-') && !(sp->p < sp->end && *sp->p >= '0' && *sp->p <= '9'))
    return st__sp_fail(sp, "expected a non-negative integer");
  if (!st__sp_number(sp, out, &is_u)) return false;
  return is_u || st__sp_fail(sp, "expected a non-negative integer (no sign, fraction or exponent)");
}

/* "dtype": a variant name, or serde's enum-as-map form {"F32": null}. */
static bool st__sp_dtype(st__sp* sp, st__sp_tensor* t) {
  bool map = st__sp_eat(sp, '{');
  if (map && !st__sp_enter(sp)) return false;
  char* name = NULL;
  size_t len = 0;
  if (!st__sp_string(sp, &name, &len)) return st__sp_fail(sp, "\"dtype\" is not a string");
  t->dtype_name = NULL;
  for (size_t i = 0; i < sizeof(kAllDtypes) / sizeof(kAllDtypes[0]); ++i)
    if (strlen(kAllDtypes[i].name) == len && !memcmp(kAllDtypes[i].name, name, len)) t->dtype_name = kAllDtypes[i].name;
  if (!t->dtype_name && !sp->why) {
    snprintf(sp->detail, sizeof(sp->detail), "unknown dtype \"%.40s\"", name);
    sp->why = sp->detail;
  }
  free(name);
  if (!t->dtype_name) return false;
  t->dtype = st_safetensors_dtype_parse(t->dtype_name);
  if (map) {
    if (!st__sp_eat(sp, ':') || !st__sp_lit(sp, "null") || !st__sp_eat(sp, '}'))
      return st__sp_fail(sp, "\"dtype\" as a map must be {\"NAME\": null}");
    --sp->depth;
  }
  return true;
}

static bool st__sp_shape(st__sp* sp, st__sp_tensor* t) {
  if (!st__sp_eat(sp, '[') || !st__sp_enter(sp)) return st__sp_fail(sp, "\"shape\" is not an array");
  t->rank = 0;
  if (!st__sp_eat(sp, ']')) {
    do {
      uint64_t d;
      if (!st__sp_u64(sp, &d)) return false;
      if (t->rank < ST_MAX_RANK) t->dims[t->rank] = d;
      t->rank++;
    } while (st__sp_eat(sp, ','));
    if (!st__sp_eat(sp, ']')) return st__sp_fail(sp, "expected ',' or ']' in \"shape\"");
  }
  --sp->depth;
  return true;
}

static bool st__sp_offsets(st__sp* sp, st__sp_tensor* t) {
  if (!st__sp_eat(sp, '[') || !st__sp_enter(sp)) return st__sp_fail(sp, "\"data_offsets\" is not an array");
  if (!st__sp_u64(sp, &t->begin) || !st__sp_eat(sp, ',') || !st__sp_u64(sp, &t->end) || !st__sp_eat(sp, ']'))
    return st__sp_fail(sp, "\"data_offsets\" must be [begin, end]");
  --sp->depth;
  return true;
}

/* A tensor entry: {"dtype", "shape", "data_offsets", others ignored}, each
 * field once, or the same three as an array (serde's sequence form). */
static bool st__sp_tensor_info(st__sp* sp, st__sp_tensor* t) {
  if (st__sp_eat(sp, '[')) {
    if (!st__sp_enter(sp)) return false;
    if (!st__sp_dtype(sp, t) || !st__sp_eat(sp, ',') || !st__sp_shape(sp, t) || !st__sp_eat(sp, ',') || !st__sp_offsets(sp, t) ||
        !st__sp_eat(sp, ']'))
      return st__sp_fail(sp, "a tensor entry as an array must be [dtype, shape, data_offsets]");
    --sp->depth;
    return true;
  }
  if (!st__sp_eat(sp, '{')) return st__sp_fail(sp, "a tensor entry must be an object");
  if (!st__sp_enter(sp)) return false;
  bool seen[3] = {false, false, false};
  if (!st__sp_eat(sp, '}')) {
    do {
      char* key = NULL;
      size_t len = 0;
      if (!st__sp_string(sp, &key, &len) || !st__sp_eat(sp, ':')) {
        free(key);
        return st__sp_fail(sp, "expected \"key\":");
      }
      int field = len == 5 && !memcmp(key, "dtype", 5) ? 0 : len == 5 && !memcmp(key, "shape", 5) ? 1
                  : len == 12 && !memcmp(key, "data_offsets", 12) ? 2 : -1;
      free(key);
      if (field >= 0 && seen[field]) return st__sp_fail(sp, "a tensor entry repeats a field");
      if (field >= 0) seen[field] = true;
      bool ok = field == 0 ? st__sp_dtype(sp, t) : field == 1 ? st__sp_shape(sp, t) : field == 2 ? st__sp_offsets(sp, t) : st__sp_skip(sp);
      if (!ok) return false;
    } while (st__sp_eat(sp, ','));
    if (!st__sp_eat(sp, '}')) return st__sp_fail(sp, "expected ',' or '}' in a tensor entry");
  }
  --sp->depth;
  if (!seen[0] || !seen[1] || !seen[2]) return st__sp_fail(sp, "a tensor entry needs \"dtype\", \"shape\" and \"data_offsets\"");
  return true;
}

/* "__metadata__": null or an object of strings. */
static bool st__sp_metadata(st__sp* sp) {
  if (st__sp_lit(sp, "null")) return true;
  if (!st__sp_eat(sp, '{') || !st__sp_enter(sp)) return st__sp_fail(sp, "\"__metadata__\" must be an object of strings");
  if (!st__sp_eat(sp, '}')) {
    do {
      if (!st__sp_string(sp, NULL, NULL) || !st__sp_eat(sp, ':')) return false;
      if (!st__sp_peek(sp, '"')) return st__sp_fail(sp, "\"__metadata__\" must be an object of strings");
      if (!st__sp_string(sp, NULL, NULL)) return false;
    } while (st__sp_eat(sp, ','));
    if (!st__sp_eat(sp, '}')) return st__sp_fail(sp, "expected ',' or '}' in \"__metadata__\"");
  }
  --sp->depth;
  return true;
}

static int st__by_name_then_order(const void* a, const void* b) {
  const st__sp_tensor* x = a;
  const st__sp_tensor* y = b;
  size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
  int c = memcmp(x->name, y->name, n);
  if (c) return c;
  if (x->name_len != y->name_len) return x->name_len < y->name_len ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

static int st__by_offsets(const void* a, const void* b) {
  const st__sp_tensor* x = a;
  const st__sp_tensor* y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

static int st__by_order(const void* a, const void* b) {
  const st__sp_tensor* x = a;
  const st__sp_tensor* y = b;
  return x->order < y->order ? -1 : x->order > y->order;
}

static void st__sp_tensors_free(st__sp_tensor* v, size_t n) {
  for (size_t i = 0; i < n; ++i) free(v[i].name);
  free(v);
}

/* Parses the header into |*out| (|*out_count| entries, duplicates resolved
 * as serde does: the last one wins). */
static st_status st__parse_header(const char* path, const unsigned char* h, size_t n, st__sp_tensor** out, size_t* out_count) {
  *out = NULL;
  *out_count = 0;
  if (!st__utf8_valid(h, n)) return st_status_make(ST_CODE_CKPT, "%s: header is not valid UTF-8", path);
  st__sp sp = {h, h, h + n, 0, NULL, {0}};
  st__sp_tensor* v = NULL;
  size_t count = 0, cap = 0;
  bool metadata = false;
  if (!st__sp_eat(&sp, '{')) {
    st__sp_fail(&sp, "header is not a JSON object");
  } else if (st__sp_enter(&sp) && !st__sp_eat(&sp, '}')) {
    do {
      char* key = NULL;
      size_t len = 0;
      if (!st__sp_string(&sp, &key, &len) || !st__sp_eat(&sp, ':')) {
        free(key);
        st__sp_fail(&sp, "expected \"name\":");
        break;
      }
      if (len == 12 && !memcmp(key, "__metadata__", 12)) {
        free(key);
        if (metadata) {
          st__sp_fail(&sp, "\"__metadata__\" appears twice");
          break;
        }
        metadata = true;
        if (!st__sp_metadata(&sp)) break;
        continue;
      }
      if (count == cap) {
        cap = cap ? 2 * cap : 16;
        v = st_xrealloc(v, cap * sizeof(*v));
      }
      st__sp_tensor* t = &v[count++];
      memset(t, 0, sizeof(*t));
      t->name = key;
      t->name_len = len;
      t->order = count - 1;
      if (!st__sp_tensor_info(&sp, t)) break;
    } while (st__sp_eat(&sp, ','));
    if (!sp.why && !st__sp_eat(&sp, '}')) st__sp_fail(&sp, "expected ',' or '}' after a tensor entry");
  }
  if (!sp.why) {
    st__sp_ws(&sp);
    if (sp.p != sp.end) st__sp_fail(&sp, "trailing characters after the header object");
  }
  if (sp.why) {
    st__sp_tensors_free(v, count);
    return st_status_make(ST_CODE_CKPT, "%s: header is not what the safetensors format allows: %s (header byte %zu)", path, sp.why,
                          (size_t)(sp.p - sp.begin));
  }
  /* A repeated name: the last entry wins, as in serde's map. */
  if (count > 1) {
    qsort(v, count, sizeof(*v), st__by_name_then_order);
    size_t k = 0;
    for (size_t i = 0; i < count; ++i) {
      bool superseded = i + 1 < count && v[i + 1].name_len == v[i].name_len && !memcmp(v[i + 1].name, v[i].name, v[i].name_len);
      if (superseded) free(v[i].name);
      else v[k++] = v[i];
    }
    count = k;
  }
  *out = v;
  *out_count = count;
  return ST_OK;
}

/* The package's layout check: entries sorted by (begin, end) tile
 * [0, end) with each span exactly the size of its shape (the element count
 * and bit count must not overflow 64 bits). Then strata's own limits. */
static st_status st__check_layout(const char* path, st__sp_tensor* v, size_t count, size_t data_size) {
  if (count > 1) qsort(v, count, sizeof(*v), st__by_offsets);
  uint64_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    const st__sp_tensor* t = &v[i];
    const char* name = t->name;
    if (t->rank > ST_MAX_RANK)
      return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': rank %zu exceeds strata's %d", path, name, t->rank, ST_MAX_RANK);
    if (t->end > data_size && t->begin == at)
      return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': data_offsets end %llu is past the end of the data (%zu bytes): truncated file?",
                            path, name, (unsigned long long)t->end, data_size);
    if (t->begin != at || t->end < t->begin)
      return st_status_make(ST_CODE_CKPT, "%s: tensor '%s' spans data bytes [%llu, %llu), expected to start at %llu (%s)", path, name,
                            (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)at,
                            t->end < t->begin ? "end before begin" : t->begin > at ? "gap" : "overlap");
    at = t->end;
    uint64_t elements = 1;
    bool overflow = false;
    for (size_t d = 0; d < t->rank && !overflow; ++d) {
      if (t->dims[d] && elements > UINT64_MAX / t->dims[d]) overflow = true;
      else elements *= t->dims[d];
    }
    int bits = 0;
    for (size_t k = 0; k < sizeof(kAllDtypes) / sizeof(kAllDtypes[0]); ++k)
      if (kAllDtypes[k].name == t->dtype_name) bits = kAllDtypes[k].bits;
    if (t->dtype == ST_DTYPE_INVALID || bits == 0)
      return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': unknown dtype \"%s\" (valid safetensors, but strata has no such type)", path,
                            name, t->dtype_name);
    if (overflow || elements > UINT64_MAX / (uint64_t)bits)
      return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': its shape's size overflows 64 bits", path, name);
    for (size_t d = 0; d < t->rank; ++d)
      if (t->dims[d] > (uint64_t)INT64_MAX)
        return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': dimension %zu is %llu, above strata's limit of 2^63-1", path, name, d,
                              (unsigned long long)t->dims[d]);
    if (memchr(t->name, '\0', t->name_len))
      return st_status_make(ST_CODE_CKPT, "%s: a tensor name contains a NUL character ('%s\\u0000...'): strata names are C strings", path,
                            name);
    uint64_t want = elements * (uint64_t)bits / 8;
    if (t->end - t->begin != want) {
      char ty[96];
      st_tensor_type tt = {t->dtype, (int)t->rank, {0}};
      for (size_t d = 0; d < t->rank; ++d) tt.dims[d] = (int64_t)t->dims[d];
      return st_status_make(ST_CODE_CKPT, "%s: tensor '%s': %s needs %llu bytes but data_offsets span %llu", path, name,
                            st_tensor_type_format(&tt, ty, sizeof(ty)), (unsigned long long)want,
                            (unsigned long long)(t->end - t->begin));
    }
  }
  if (at != data_size)
    return st_status_make(ST_CODE_CKPT, "%s: tensors cover %llu data bytes but the file holds %zu (%s)", path, (unsigned long long)at,
                          data_size, at < data_size ? "trailing bytes" : "truncated");
  return ST_OK;
}

st_status st_safetensors_parse(const char* path, unsigned char* data, size_t size, st_safetensors** out) {
  *out = NULL;
  st_safetensors* f = st_xcalloc(1, sizeof(*f));
  f->path = st_xstrdup(path);
  f->data = data;
  f->size = size;
  st_status s = ST_OK;
  st__sp_tensor* v = NULL;
  size_t count = 0;
  uint64_t n = 0;
  if (size < 8) {
    s = st_status_make(ST_CODE_CKPT, "%s: %zu bytes is too short for a safetensors file (truncated?)", path, size);
    goto done;
  }
  for (int i = 0; i < 8; ++i) n |= (uint64_t)data[i] << (8 * i);
  if (n > ST_SAFETENSORS_MAX_HEADER || n > size - 8) {
    s = st_status_make(ST_CODE_CKPT, "%s: header length %llu does not fit in the file's %zu bytes or exceeds %u (truncated or not safetensors)",
                       path, (unsigned long long)n, size, (unsigned)ST_SAFETENSORS_MAX_HEADER);
    goto done;
  }
  f->data_start = 8 + (size_t)n;
  s = st__parse_header(path, data + 8, (size_t)n, &v, &count);
  if (!s) s = st__check_layout(path, v, count, size - f->data_start);
  if (!s && count > (size_t)INT32_MAX) s = st_status_make(ST_CODE_CKPT, "%s: %zu tensors is too many", path, count);
  if (s) goto done;
  if (count > 1) qsort(v, count, sizeof(*v), st__by_order);
  f->entries = st_xcalloc(count + 1, sizeof(*f->entries));
  for (size_t i = 0; i < count; ++i) {
    st_safetensors_entry* e = &f->entries[f->count++];
    e->name = v[i].name;
    v[i].name = NULL;
    e->type.dtype = v[i].dtype;
    e->type.rank = (int)v[i].rank;
    for (size_t d = 0; d < v[i].rank; ++d) e->type.dims[d] = (int64_t)v[i].dims[d];
    e->offset = f->data_start + (size_t)v[i].begin;
    e->bytes = (size_t)(v[i].end - v[i].begin);
  }
done:
  st__sp_tensors_free(v, count);
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
