/* strbuf.c — the growable buffer and the one float formatter. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"

static void st__strbuf_reserve(st_strbuf* b, size_t extra) {
  if (extra >= SIZE_MAX - b->len) st_oom("a buffer larger than the address space");
  size_t need = b->len + extra + 1;
  if (need <= b->cap) return;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
  b->data = st_xrealloc(b->data, cap);
  b->cap = cap;
}

void st_strbuf_append_n(st_strbuf* b, const char* s, size_t n) {
  st__strbuf_reserve(b, n);
  if (n) memcpy(b->data + b->len, s, n);
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

/* Words made only of these need no quotes; anything else is wrapped in
 * single quotes, the one quoting in which no character is special to sh
 * (a ' inside becomes '\'' ). */
static bool st__shell_plain(const char* s) {
  if (!*s) return false;
  for (const char* p = s; *p; ++p)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%", *p)) return false;
  return true;
}

void st_strbuf_append_shell(st_strbuf* b, const char* word) {
  if (st__shell_plain(word)) {
    st_strbuf_append(b, word);
    return;
  }
  st_strbuf_append(b, "'");
  for (const char* p = word; *p; ++p) {
    if (*p == '\'')
      st_strbuf_append(b, "'\\''");
    else
      st_strbuf_append_n(b, p, 1);
  }
  st_strbuf_append(b, "'");
}

char* st_shell_quote(const char* word) {
  st_strbuf b = {0};
  st_strbuf_append_shell(&b, word);
  return st_strbuf_take(&b);
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

char* st_strbuf_take(st_strbuf* b) {
  char* p = b->data ? b->data : st_xstrdup("");
  b->data = NULL;
  b->len = b->cap = 0;
  return p;
}

/* "1e+09" -> "1e9", "1e-08" -> "1e-8": the C exponent padding is noise. */
static void st__tidy_exponent(char* s) {
  char* e = strchr(s, 'e');
  if (!e) return;
  char* src = e + 1;
  char* dst = e + 1;
  if (*src == '+') ++src;
  if (*src == '-') *dst++ = *src++;
  while (*src == '0' && src[1]) ++src;
  memmove(dst, src, strlen(src) + 1);
}

void st_format_double(double x, char out[ST_DOUBLE_CHARS]) {
  if (!isfinite(x)) {
    snprintf(out, ST_DOUBLE_CHARS, "%s", isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf"));
    return;
  }
  for (int p = 1; p <= 17; ++p) {
    snprintf(out, ST_DOUBLE_CHARS, "%.*g", p, x);
    if (strtod(out, NULL) == x) break;
  }
  st__tidy_exponent(out);
}
