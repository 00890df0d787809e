/* json.c — a small recursive-descent JSON reader for manifests and
 * checkpoints. Input is trusted to be modest in size but not in content:
 * every malformed input is an error with line:column, never a crash. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"

typedef struct {
  const char* p;
  const char* end;
  const char* begin;
  const char* origin;
  int depth;
} st__jp;

#define ST__JSON_MAX_DEPTH 64

static st_status st__jp_error(const st__jp* jp, const char* what) {
  int line = 1, col = 1;
  for (const char* q = jp->begin; q < jp->p; ++q) {
    if (*q == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return st_status_make(ST_CODE_RUNTIME, "%s:%d:%d: invalid JSON: %s", jp->origin ? jp->origin : "<json>", line, col, what);
}

static void st__jp_ws(st__jp* jp) {
  while (jp->p < jp->end && (*jp->p == ' ' || *jp->p == '\t' || *jp->p == '\n' || *jp->p == '\r')) ++jp->p;
}

static void st__json_clear(st_json* j) {
  if (!j) return;
  free(j->string);
  for (size_t i = 0; i < j->count; ++i) {
    st__json_clear(&j->items[i]);
    if (j->keys) free(j->keys[i]);
  }
  free(j->items);
  free(j->keys);
  memset(j, 0, sizeof(*j));
}

static void st__utf8(st_strbuf* b, unsigned cp) {
  char out[4];
  size_t n;
  if (cp < 0x80) {
    out[0] = (char)cp;
    n = 1;
  } else if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    n = 4;
  }
  st_strbuf_append_n(b, out, n);
}

static st_status st__jp_string(st__jp* jp, char** out) {
  /* jp->p is at the opening quote. */
  ++jp->p;
  st_strbuf b = {0};
  st_strbuf_append(&b, "");
  while (jp->p < jp->end && *jp->p != '"') {
    char c = *jp->p++;
    if ((unsigned char)c < 0x20) {
      st_strbuf_free(&b);
      return st__jp_error(jp, "control character in string");
    }
    if (c != '\\') {
      st_strbuf_append_n(&b, &c, 1);
      continue;
    }
    if (jp->p >= jp->end) break;
    char e = *jp->p++;
    switch (e) {
      case '"': st_strbuf_append_n(&b, "\"", 1); break;
      case '\\': st_strbuf_append_n(&b, "\\", 1); break;
      case '/': st_strbuf_append_n(&b, "/", 1); break;
      case 'b': st_strbuf_append_n(&b, "\b", 1); break;
      case 'f': st_strbuf_append_n(&b, "\f", 1); break;
      case 'n': st_strbuf_append_n(&b, "\n", 1); break;
      case 'r': st_strbuf_append_n(&b, "\r", 1); break;
      case 't': st_strbuf_append_n(&b, "\t", 1); break;
      case 'u': {
        if (jp->end - jp->p < 4) {
          st_strbuf_free(&b);
          return st__jp_error(jp, "truncated \\u escape");
        }
        unsigned cp = 0;
        for (int i = 0; i < 4; ++i) {
          char h = *jp->p++;
          cp <<= 4;
          if (h >= '0' && h <= '9') cp |= (unsigned)(h - '0');
          else if (h >= 'a' && h <= 'f') cp |= (unsigned)(h - 'a' + 10);
          else if (h >= 'A' && h <= 'F') cp |= (unsigned)(h - 'A' + 10);
          else {
            st_strbuf_free(&b);
            return st__jp_error(jp, "bad hex digit in \\u escape");
          }
        }
        st__utf8(&b, cp);
        break;
      }
      default:
        st_strbuf_free(&b);
        return st__jp_error(jp, "bad escape in string");
    }
  }
  if (jp->p >= jp->end) {
    st_strbuf_free(&b);
    return st__jp_error(jp, "unterminated string");
  }
  ++jp->p; /* closing quote */
  *out = b.data;
  return ST_OK;
}

static st_status st__jp_value(st__jp* jp, st_json* out);

static st_status st__jp_push(st_json* j, const st_json* item, char* key) {
  j->items = st_xrealloc(j->items, (j->count + 1) * sizeof(*j->items));
  if (j->kind == ST_JSON_OBJECT) {
    j->keys = st_xrealloc(j->keys, (j->count + 1) * sizeof(*j->keys));
    j->keys[j->count] = key;
  }
  j->items[j->count++] = *item;
  return ST_OK;
}

static st_status st__jp_container(st__jp* jp, st_json* out, bool object) {
  out->kind = object ? ST_JSON_OBJECT : ST_JSON_ARRAY;
  char close = object ? '}' : ']';
  ++jp->p;
  st__jp_ws(jp);
  if (jp->p < jp->end && *jp->p == close) {
    ++jp->p;
    return ST_OK;
  }
  for (;;) {
    char* key = NULL;
    st__jp_ws(jp);
    if (object) {
      if (jp->p >= jp->end || *jp->p != '"') return st__jp_error(jp, "expected a string key");
      ST_RETURN(st__jp_string(jp, &key));
      st__jp_ws(jp);
      if (jp->p >= jp->end || *jp->p != ':') {
        free(key);
        return st__jp_error(jp, "expected ':'");
      }
      ++jp->p;
    }
    st_json item = {0};
    st_status s = st__jp_value(jp, &item);
    if (!s) s = st__jp_push(out, &item, key);
    if (s) {
      free(key);
      st__json_clear(&item);
      return s;
    }
    st__jp_ws(jp);
    if (jp->p < jp->end && *jp->p == ',') {
      ++jp->p;
      continue;
    }
    if (jp->p < jp->end && *jp->p == close) {
      ++jp->p;
      return ST_OK;
    }
    return st__jp_error(jp, object ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static bool st__jp_lit(st__jp* jp, const char* lit) {
  size_t n = strlen(lit);
  if ((size_t)(jp->end - jp->p) < n || memcmp(jp->p, lit, n) != 0) return false;
  jp->p += n;
  return true;
}

static st_status st__jp_value(st__jp* jp, st_json* out) {
  memset(out, 0, sizeof(*out));
  st__jp_ws(jp);
  if (jp->p >= jp->end) return st__jp_error(jp, "unexpected end of input");
  if (++jp->depth > ST__JSON_MAX_DEPTH) return st__jp_error(jp, "nesting too deep");
  st_status s = ST_OK;
  char c = *jp->p;
  if (c == '{' || c == '[') {
    s = st__jp_container(jp, out, c == '{');
  } else if (c == '"') {
    out->kind = ST_JSON_STRING;
    s = st__jp_string(jp, &out->string);
  } else if (st__jp_lit(jp, "true")) {
    out->kind = ST_JSON_BOOL;
    out->boolean = true;
  } else if (st__jp_lit(jp, "false")) {
    out->kind = ST_JSON_BOOL;
  } else if (st__jp_lit(jp, "null")) {
    out->kind = ST_JSON_NULL;
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    /* strtod needs a terminated buffer; copy the number's characters. */
    char num[64];
    size_t n = 0;
    while (jp->p + n < jp->end && n < sizeof(num) - 1 && strchr("+-0123456789.eE", jp->p[n])) ++n;
    memcpy(num, jp->p, n);
    num[n] = '\0';
    char* endp = NULL;
    errno = 0;
    out->number = strtod(num, &endp);
    if (endp == num || (size_t)(endp - num) != n) return st__jp_error(jp, "malformed number");
    out->kind = ST_JSON_NUMBER;
    jp->p += n;
  } else {
    s = st__jp_error(jp, "unexpected character");
  }
  --jp->depth;
  if (s) st__json_clear(out);
  return s;
}

st_status st_json_parse(const char* text, size_t size, const char* origin, st_json** out_json) {
  *out_json = NULL;
  st__jp jp = {text, text + size, text, origin, 0};
  st_json* root = st_xcalloc(1, sizeof(*root));
  st_status s = st__jp_value(&jp, root);
  if (!s) {
    st__jp_ws(&jp);
    if (jp.p != jp.end) s = st__jp_error(&jp, "trailing characters after the value");
  }
  if (s) {
    st_json_free(root);
    return s;
  }
  *out_json = root;
  return ST_OK;
}

void st_json_free(st_json* json) {
  if (!json) return;
  st__json_clear(json);
  free(json);
}

const st_json* st_json_get(const st_json* obj, const char* key) {
  if (!obj || obj->kind != ST_JSON_OBJECT) return NULL;
  for (size_t i = 0; i < obj->count; ++i)
    if (!strcmp(obj->keys[i], key)) return &obj->items[i];
  return NULL;
}

st_status st_json_get_int(const st_json* obj, const char* key, const char* origin, int64_t* out) {
  const st_json* v = st_json_get(obj, key);
  if (!v || v->kind != ST_JSON_NUMBER || v->number != floor(v->number) || fabs(v->number) > 9.007199254740992e15)
    return st_status_make(ST_CODE_RUNTIME, "%s: '%s' is missing or not an integer", origin, key);
  *out = (int64_t)v->number;
  return ST_OK;
}

st_status st_json_get_string(const st_json* obj, const char* key, const char* origin, const char** out) {
  const st_json* v = st_json_get(obj, key);
  if (!v || v->kind != ST_JSON_STRING) return st_status_make(ST_CODE_RUNTIME, "%s: '%s' is missing or not a string", origin, key);
  *out = v->string;
  return ST_OK;
}

st_status st_json_get_array(const st_json* obj, const char* key, const char* origin, const st_json** out) {
  const st_json* v = st_json_get(obj, key);
  if (!v || v->kind != ST_JSON_ARRAY) return st_status_make(ST_CODE_RUNTIME, "%s: '%s' is missing or not an array", origin, key);
  *out = v;
  return ST_OK;
}
