/* jsonlib.c — strata's thin layer over jansson (docs/architecture.md,
 * "JSON is jansson"): builders that never return NULL, strings that are
 * always valid UTF-8, numbers that are always valid JSON and read back
 * exactly, and one dump function every writer of JSON goes through. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"

/* Length of the valid UTF-8 sequence at |p| (|n| bytes left), 0 if none:
 * overlong forms, surrogates and values past U+10FFFF are not UTF-8. */
static size_t st__utf8_seq(const unsigned char* p, size_t n) {
  unsigned c = p[0];
  size_t extra;
  unsigned min;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) {
    extra = 1, min = 0x80, c &= 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    extra = 2, min = 0x800, c &= 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    extra = 3, min = 0x10000, c &= 0x07;
  } else {
    return 0;
  }
  if (extra >= n) return 0;
  for (size_t k = 1; k <= extra; ++k) {
    if ((p[k] & 0xc0) != 0x80) return 0;
    c = (c << 6) | (p[k] & 0x3f);
  }
  if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
  return extra + 1;
}

bool st_utf8_valid(const char* s, size_t n) {
  const unsigned char* p = (const unsigned char*)s;
  for (size_t i = 0; i < n;) {
    size_t k = st__utf8_seq(p + i, n - i);
    if (!k) return false;
    i += k;
  }
  return true;
}

static json_t* st__checked(json_t* v, const char* what) {
  if (!v) st_oom(what); /* jansson returns NULL only when it cannot allocate here */
  return v;
}

json_t* st_json_strn(const char* s, size_t n) {
  if (!s) return st__checked(json_string(""), "JSON string");
  if (st_utf8_valid(s, n) && !memchr(s, '\0', n)) return st__checked(json_stringn_nocheck(s, n), "JSON string");
  /* Paths are bytes on Linux: a byte that is not UTF-8 becomes U+FFFD so
   * the document stays valid JSON (the text is then lossy, never invalid). */
  st_strbuf b = {0};
  const unsigned char* p = (const unsigned char*)s;
  for (size_t i = 0; i < n;) {
    size_t k = p[i] ? st__utf8_seq(p + i, n - i) : 0;
    if (k) {
      st_strbuf_append_n(&b, s + i, k);
      i += k;
    } else {
      st_strbuf_append(&b, "\xef\xbf\xbd");
      ++i;
    }
  }
  json_t* v = st__checked(json_stringn_nocheck(st_strbuf_cstr(&b), b.len), "JSON string");
  st_strbuf_free(&b);
  return v;
}

json_t* st_json_str(const char* s) { return st_json_strn(s, s ? strlen(s) : 0); }

json_t* st_json_num(double v) {
  /* JSON has no NaN or infinity; a non-finite loss is reported as null. */
  if (!isfinite(v)) return json_null();
  return st__checked(json_real(v), "JSON number");
}

json_t* st_json_fixed(double v, int decimals) {
  if (!isfinite(v)) return json_null();
  double scale = pow(10.0, decimals);
  double r = round(v * scale) / scale;
  return st_json_num(isfinite(r) ? r : v);
}

json_t* st_json_int(int64_t v) { return st__checked(json_integer((json_int_t)v), "JSON integer"); }
json_t* st_json_bool(bool v) { return json_boolean(v); }
json_t* st_json_obj(void) { return st__checked(json_object(), "JSON object"); }
json_t* st_json_arr(void) { return st__checked(json_array(), "JSON array"); }

void st_json_put(json_t* obj, const char* key, json_t* value) {
  json_t* k = st_json_str(key); /* the key made valid UTF-8 */
  int rc = json_object_set_new_nocheck(obj, json_string_value(k), value);
  json_decref(k);
  if (rc != 0) st_oom("JSON object member");
}

void st_json_put_str(json_t* obj, const char* key, const char* s) { st_json_put(obj, key, st_json_str(s)); }
void st_json_put_int(json_t* obj, const char* key, int64_t v) { st_json_put(obj, key, st_json_int(v)); }
void st_json_put_num(json_t* obj, const char* key, double v) { st_json_put(obj, key, st_json_num(v)); }
void st_json_put_bool(json_t* obj, const char* key, bool v) { st_json_put(obj, key, st_json_bool(v)); }

void st_json_push(json_t* arr, json_t* value) {
  if (json_array_append_new(arr, value) != 0) st_oom("JSON array item");
}

void st_json_merge(json_t* obj, json_t* other) {
  if (!other) return;
  const char* key;
  json_t* value;
  json_object_foreach(other, key, value) st_json_put(obj, key, json_incref(value));
  json_decref(other);
}

/* Digits %g needs for |x| to read back exactly (1..17). */
static int st__digits(double x) {
  char buf[40];
  for (int p = 1; p < 17; ++p) {
    snprintf(buf, sizeof(buf), "%.*g", p, x);
    if (strtod(buf, NULL) == x) return p;
  }
  return 17;
}

static int st__max_digits(const json_t* v, int best) {
  if (best >= 17) return best;
  if (json_is_real(v)) {
    int d = st__digits(json_real_value(v));
    return d > best ? d : best;
  }
  if (json_is_object(v)) {
    const char* key;
    json_t* item;
    json_object_foreach((json_t*)v, key, item) best = st__max_digits(item, best);
  } else if (json_is_array(v)) {
    size_t i;
    json_t* item;
    json_array_foreach(v, i, item) best = st__max_digits(item, best);
  }
  return best;
}

char* st_json_dump(const json_t* v, int indent) {
  /* jansson writes every real with one %.{p}g precision per document
   * (JSON_REAL_PRECISION). The smallest p with which every real reads back
   * exactly is the largest of their shortest digit counts; the correctly
   * rounded p-digit form of a value is at least as close to it as its
   * shortest form, so every value round-trips. p is at least 15 so that
   * 10000.0 is not written 1e4; while p is 15 every value also comes out
   * in its shortest form (%g drops trailing zeros): "lr": 0.0003, not
   * 0.00029999999999999997. */
  int p = st__max_digits(v, 15);
  size_t flags = JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(p) | (indent > 0 ? JSON_INDENT(indent) : 0);
  char* s = json_dumps(v, flags);
  if (!s) st_oom("JSON text");
  return s;
}

st_status st_json_write_file(const char* path, const json_t* v, int indent) {
  char* text = st_json_dump(v, indent);
  st_strbuf b = {0};
  st_strbuf_append(&b, text);
  st_strbuf_append(&b, "\n");
  free(text);
  st_status s = st_fs_write_atomic(path, b.data, b.len);
  st_strbuf_free(&b);
  return s;
}

/*--- reading ---------------------------------------------------------------*/

/* 1-based line and column (in bytes) of |at| in |text|. */
static void st__line_col(const char* text, size_t at, int* line, int* col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < at; ++i) {
    if (text[i] == '\n') {
      ++*line;
      *col = 1;
    } else {
      ++*col;
    }
  }
}

/* Offset of the first bracket that nests deeper than |max|, or SIZE_MAX.
 * jansson's own limit (2048) is a recursion limit, not a content limit. */
static size_t st__too_deep(const char* text, size_t size, int max) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < size; ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return SIZE_MAX;
}

st_status st_json_parse(const char* text, size_t size, const char* origin, json_t** out_json) {
  *out_json = NULL;
  if (!origin) origin = "<json>";
  size_t deep = st__too_deep(text, size, ST_JSON_MAX_DEPTH);
  if (deep != SIZE_MAX) {
    int line, col;
    st__line_col(text, deep, &line, &col);
    return st_status_make(ST_CODE_RUNTIME, "%s:%d:%d: invalid JSON: nested deeper than %d levels", origin, line, col,
                          ST_JSON_MAX_DEPTH);
  }
  json_error_t err;
  json_t* j = json_loadb(text, size, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &err);
  if (!j) {
    if (json_error_code(&err) == json_error_out_of_memory) st_oom("parsing JSON");
    return st_status_make(ST_CODE_RUNTIME, "%s:%d:%d: invalid JSON: %s", origin, err.line, err.column, err.text);
  }
  *out_json = j;
  return ST_OK;
}

bool st_json_as_int(const json_t* v, int64_t* out) {
  if (json_is_integer(v)) {
    *out = (int64_t)json_integer_value(v);
    return true;
  }
  if (!json_is_real(v)) return false;
  double d = json_real_value(v);
  if (d != floor(d) || fabs(d) > 9.007199254740992e15) return false;
  *out = (int64_t)d;
  return true;
}

st_status st_json_get_int(const json_t* obj, const char* key, const char* origin, int64_t* out) {
  if (!st_json_as_int(json_object_get(obj, key), out))
    return st_status_make(ST_CODE_RUNTIME, "%s: '%s' is missing or not an integer", origin, key);
  return ST_OK;
}

st_status st_json_get_string(const json_t* obj, const char* key, const char* origin, const char** out) {
  const json_t* v = json_object_get(obj, key);
  if (!json_is_string(v)) return st_status_make(ST_CODE_RUNTIME, "%s: '%s' is missing or not a string", origin, key);
  *out = json_string_value(v);
  return ST_OK;
}

st_status st_json_get_array(const json_t* obj, const char* key, const char* origin, const json_t** out) {
  const json_t* v = json_object_get(obj, key);
  if (!json_is_array(v)) return st_status_make(ST_CODE_RUNTIME, "%s: '%s' is missing or not an array", origin, key);
  *out = v;
  return ST_OK;
}

bool st_json_same(const json_t* a, const json_t* b) {
  if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
  if (json_is_object(a) && json_is_object(b)) {
    if (json_object_size(a) != json_object_size(b)) return false;
    const char* key;
    json_t* v;
    json_object_foreach((json_t*)a, key, v) if (!st_json_same(v, json_object_get(b, key))) return false;
    return true;
  }
  if (json_is_array(a) && json_is_array(b)) {
    if (json_array_size(a) != json_array_size(b)) return false;
    for (size_t i = 0; i < json_array_size(a); ++i)
      if (!st_json_same(json_array_get(a, i), json_array_get(b, i))) return false;
    return true;
  }
  return json_equal((json_t*)a, (json_t*)b);
}
