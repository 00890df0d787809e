/* strbuf.c — growable strings and JSON string/number formatting. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"

static void st__strbuf_reserve(st_strbuf* b, size_t extra) {
  if (b->len + extra + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + extra + 1) cap *= 2;
  char* p = realloc(b->data, cap);
  if (!p) {
    fprintf(stderr, "strata: out of memory growing a string to %zu bytes\n", cap);
    abort();
  }
  b->data = p;
  b->cap = cap;
}

void st_strbuf_append_n(st_strbuf* b, const char* s, size_t n) {
  st__strbuf_reserve(b, n);
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void st_strbuf_append(st_strbuf* b, const char* s) { st_strbuf_append_n(b, s, strlen(s)); }

void st_strbuf_printf(st_strbuf* b, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n > 0) {
    st__strbuf_reserve(b, (size_t)n);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
  }
  va_end(ap);
}

void st_strbuf_json_string(st_strbuf* b, const char* s) {
  st_strbuf_append_n(b, "\"", 1);
  for (const unsigned char* p = (const unsigned char*)s; *p; ++p) {
    switch (*p) {
      case '"': st_strbuf_append_n(b, "\\\"", 2); break;
      case '\\': st_strbuf_append_n(b, "\\\\", 2); break;
      case '\n': st_strbuf_append_n(b, "\\n", 2); break;
      case '\r': st_strbuf_append_n(b, "\\r", 2); break;
      case '\t': st_strbuf_append_n(b, "\\t", 2); break;
      default:
        if (*p < 0x20) {
          st_strbuf_printf(b, "\\u%04x", *p);
        } else {
          st_strbuf_append_n(b, (const char*)p, 1);
        }
    }
  }
  st_strbuf_append_n(b, "\"", 1);
}

void st_strbuf_json_number(st_strbuf* b, double v) {
  if (!isfinite(v)) {
    st_strbuf_append(b, "null");
  } else if (v == (double)(int64_t)v && fabs(v) < 9e15) {
    st_strbuf_printf(b, "%lld", (long long)v);
  } else {
    /* %.17g round-trips every double. */
    st_strbuf_printf(b, "%.17g", v);
  }
}

const char* st_strbuf_cstr(const st_strbuf* b) { return b->data ? b->data : ""; }

void st_strbuf_reset(st_strbuf* b) {
  b->len = 0;
  if (b->data) b->data[0] = '\0';
}

void st_strbuf_free(st_strbuf* b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

char* st_strndup(const char* s, size_t n) {
  char* p = malloc(n + 1);
  if (!p) return NULL;
  if (n) memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

char* st_strdup(const char* s) { return s ? st_strndup(s, strlen(s)) : st_strndup("", 0); }
