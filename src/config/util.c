/* util.c — small string helpers for src/config/: display forms of floats
 * (over base's st_format_double), message quoting, edit distance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/internal.h"

/* Replaces an exponent form with plain digits when |x| lies in [lo, hi):
 * "10000.0" and "10" read better than "1e4" and "1e1". */
static void st__plain_between(double x, double lo, double hi, char out[40]) {
  double ax = fabs(x);
  if (!strchr(out, 'e') || ax < lo || ax >= hi) return;
  for (int d = 0; d <= 20; ++d) {
    char tmp[40];
    snprintf(tmp, sizeof(tmp), "%.*f", d, x);
    if (strtod(tmp, NULL) == x) {
      memcpy(out, tmp, sizeof(tmp));
      return;
    }
  }
}

void st__cfg_fmt_bound(double x, char out[40]) {
  st_format_double(x, out);
  st__plain_between(x, 1e-4, 1e6, out);
}

void st__cfg_fmt_float(double x, char out[40]) {
  if (!isfinite(x)) {
    /* Never stored (the loader rejects them), but keep the output readable. */
    snprintf(out, 40, "%s", isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf"));
    return;
  }
  st_format_double(x, out);
  st__plain_between(x, 1e-5, 1e16, out);
  if (!strpbrk(out, ".e")) {
    size_t n = strlen(out);
    if (n + 2 < 40) memcpy(out + n, ".0", 3);
  }
}

void st__cfg_quote(const char* s, size_t n, char* out, size_t cap) {
  /* Messages go to a terminal: escape control bytes, cut very long values. */
  const size_t max_shown = 80;
  size_t o = 0;
  for (size_t i = 0; i < n && o + 8 < cap; ++i) {
    if (i == max_shown) {
      memcpy(out + o, "...", 3);
      o += 3;
      break;
    }
    unsigned char c = (unsigned char)s[i];
    if (c == '\n') {
      out[o++] = '\\';
      out[o++] = 'n';
    } else if (c == '\t') {
      out[o++] = '\\';
      out[o++] = 't';
    } else if (c < 0x20 || c == 0x7f) {
      o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    } else {
      out[o++] = (char)c;
    }
  }
  out[o] = '\0';
}

int st__cfg_edit_distance(const char* a, size_t an, const char* b, size_t bn) {
  /* Keys are short; anything long is not worth a suggestion. */
  enum { kMax = 128 };
  if (an >= kMax || bn >= kMax) return 1 << 20;
  int d[kMax + 1][kMax + 1];
  for (size_t i = 0; i <= an; ++i) d[i][0] = (int)i;
  for (size_t j = 0; j <= bn; ++j) d[0][j] = (int)j;
  for (size_t i = 1; i <= an; ++i) {
    for (size_t j = 1; j <= bn; ++j) {
      int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      int best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + cost < best) best = d[i - 1][j - 1] + cost;
      /* "setps" vs "steps" is one slip of the fingers, not two. */
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  }
  return d[an][bn];
}

void st__cfg_die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "strata: internal error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  abort();
}

void st__cfg_quote_json(st_strbuf* b, const char* s) {
  st_strbuf_append_n(b, "\"", 1);
  for (const unsigned char* p = (const unsigned char*)s; *p; ++p) {
    switch (*p) {
      case '"': st_strbuf_append_n(b, "\\\"", 2); break;
      case '\\': st_strbuf_append_n(b, "\\\\", 2); break;
      case '\n': st_strbuf_append_n(b, "\\n", 2); break;
      case '\r': st_strbuf_append_n(b, "\\r", 2); break;
      case '\t': st_strbuf_append_n(b, "\\t", 2); break;
      default:
        if (*p < 0x20 || *p == 0x7f)
          st_strbuf_printf(b, "\\u%04x", *p);
        else
          st_strbuf_append_n(b, (const char*)p, 1);
    }
  }
  st_strbuf_append_n(b, "\"", 1);
}
