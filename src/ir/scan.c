/* scan.c — bounded scanning of MLIR text: the one place both the analyzer
 * (reader.c, cost.c, graph.c) and the runtime's @main signature reader use. */
#include <string.h>

#include "strata/ir.h"

const char* st_ir_find(const char* s, const char* e, const char* needle) {
  size_t n = strlen(needle);
  if (!s || !e || n == 0) return NULL;
  for (const char* p = s; p + n <= e; ++p)
    if (*p == needle[0] && !memcmp(p, needle, n)) return p;
  return NULL;
}

const char* st_ir_skip_ws(const char* p, const char* e) {
  while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
  return p;
}

const char* st_ir_scan_to(const char* p, const char* e, char stop) {
  int depth = 0;
  while (p < e) {
    char c = *p;
    if (depth == 0 && c == stop) return p;
    if (c == '"') {
      ++p;
      while (p < e && *p != '"') p += (*p == '\\' && p + 1 < e) ? 2 : 1;
      if (p < e) ++p;
      continue;
    }
    if (c == '-' && p + 1 < e && p[1] == '>') {
      p += 2;
      continue;
    }
    if (c == '(' || c == '<' || c == '{' || c == '[') ++depth;
    if (c == ')' || c == '>' || c == '}' || c == ']') {
      if (depth == 0) return p; /* unbalanced close: the enclosing list ends */
      --depth;
    }
    ++p;
  }
  return e;
}

bool st_ir_parse_type(const char* p, const char* e, st_ir_type* t, const char** out_end) {
  memset(t, 0, sizeof(*t));
  p = st_ir_skip_ws(p, e);
  if ((size_t)(e - p) < 7 || memcmp(p, "tensor<", 7)) return false;
  const char* close = st_ir_scan_to(p + 7, e, '>');
  if (close >= e) return false;
  const char* q = p + 7;
  for (;;) {
    const char* d = q;
    int64_t v = 0;
    if (d < close && *d == '?') {
      v = -1;
      ++d;
    } else {
      while (d < close && *d >= '0' && *d <= '9') {
        v = v * 10 + (*d - '0');
        if (v > ST_IR_MAX_DIM) return false;
        ++d;
      }
    }
    if (d > q && d < close && *d == 'x') {
      if (t->rank >= ST_IR_MAX_RANK) return false;
      if (v < 0) t->dynamic = true;
      t->dims[t->rank++] = v;
      q = d + 1;
      continue;
    }
    break;
  }
  const char* te = q;
  while (te < close && *te != ',' && *te != ' ') ++te;
  if (te == q) return false;
  t->dtype = st_dtype_parse_mlir(q, (size_t)(te - q));
  *out_end = close + 1;
  return true;
}

double st_ir_type_elements(const st_ir_type* t) {
  double n = 1;
  for (int i = 0; i < t->rank; ++i)
    if (t->dims[i] > 0) n *= (double)t->dims[i];
    else if (t->dims[i] == 0) return 0;
  return n;
}

double st_ir_type_bytes(const st_ir_type* t) {
  return st_ir_type_elements(t) * (double)st_dtype_size(t->dtype);
}
