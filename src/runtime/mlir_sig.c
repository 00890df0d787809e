/* mlir_sig.c — reads the interface of `func.func public @main` from MLIR
 * text, so programs exported by JAX can be checked before launch without a
 * full MLIR parser. Only what strata needs is understood: ranked tensor
 * types with static dims, argument attributes that mark donation, result
 * types. Anything else makes the signature "unknown" (never an error). */
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_internal.h"

bool st__mlir_is_bytecode(const void* code, size_t size) {
  static const unsigned char kMagic[4] = {'M', 'L', 0xEF, 'R'};
  return code && size >= 4 && !memcmp(code, kMagic, 4);
}

void st__signature_free(st__signature* sig) {
  if (!sig) return;
  free(sig->inputs);
  free(sig->donated);
  free(sig->outputs);
  memset(sig, 0, sizeof(*sig));
}

static const char* st__find(const char* s, const char* e, const char* needle) {
  size_t n = strlen(needle);
  for (const char* p = s; p + n <= e; ++p)
    if (*p == needle[0] && !memcmp(p, needle, n)) return p;
  return NULL;
}

static const char* st__skip_ws(const char* p, const char* e) {
  while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) ++p;
  return p;
}

/* Returns the position of the first top-level |stop| character at or after
 * |p| (or |e|), treating (), <>, {}, [] and "strings" as nesting. An "->"
 * arrow is not a closing '>'. */
static const char* st__scan_to(const char* p, const char* e, char stop) {
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

/* Parses "tensor<4x8xf32>" (optionally with ", encoding") at |p|. */
static bool st__parse_tensor(const char* p, const char* e, st_tensor_type* t, const char** out_end) {
  p = st__skip_ws(p, e);
  if ((size_t)(e - p) < 7 || memcmp(p, "tensor<", 7)) return false;
  const char* close = st__scan_to(p + 7, e, '>');
  if (close >= e) return false;
  const char* q = p + 7;
  memset(t, 0, sizeof(*t));
  for (;;) {
    const char* d = q;
    int64_t v = 0;
    while (d < close && *d >= '0' && *d <= '9') {
      v = v * 10 + (*d - '0');
      if (v > ((int64_t)1 << 48)) return false;
      ++d;
    }
    if (d > q && d < close && *d == 'x') {
      if (t->rank >= ST_MAX_RANK) return false;
      t->dims[t->rank++] = v;
      q = d + 1;
      continue;
    }
    if (*q == '?') return false; /* dynamic dims are not supported */
    break;
  }
  const char* te = q;
  while (te < close && *te != ',' && *te != ' ') ++te;
  t->dtype = st_dtype_parse_mlir(q, (size_t)(te - q));
  if (t->dtype == ST_DTYPE_INVALID) return false;
  *out_end = close + 1;
  return true;
}

static bool st__attrs_donate(const char* p, const char* e) {
  return st__find(p, e, "tf.aliasing_output") != NULL || st__find(p, e, "jax.buffer_donor = true") != NULL;
}

static void st__push(st_tensor_type** arr, int* n, const st_tensor_type* t) {
  *arr = st_xrealloc(*arr, (size_t)(*n + 1) * sizeof(**arr));
  (*arr)[(*n)++] = *t;
}

static void st__push_bool(bool** arr, int n, bool v) {
  *arr = st_xrealloc(*arr, (size_t)(n + 1) * sizeof(**arr));
  (*arr)[n] = v;
}

bool st__mlir_parse_main(const char* text, size_t size, st__signature* sig) {
  memset(sig, 0, sizeof(*sig));
  if (!text || size == 0 || st__mlir_is_bytecode(text, size)) return false;
  const char* e = text + size;
  const char* p = st__find(text, e, "func.func public @main(");
  size_t skip = strlen("func.func public @main(");
  if (!p) {
    p = st__find(text, e, "func.func @main(");
    skip = strlen("func.func @main(");
  }
  if (!p) return false;
  p += skip;
  int n_in = 0;
  /* Arguments: "%name: type {attrs}" separated by top-level commas. */
  for (;;) {
    p = st__skip_ws(p, e);
    if (p >= e) goto fail;
    if (*p == ')') {
      ++p;
      break;
    }
    const char* item_end = st__scan_to(p, e, ',');
    const char* close = st__scan_to(p, e, ')');
    if (close < item_end) item_end = close;
    const char* colon = st__find(p, item_end, ":");
    if (*p != '%' || !colon) goto fail;
    st_tensor_type t;
    const char* after;
    if (!st__parse_tensor(colon + 1, item_end, &t, &after)) goto fail;
    bool donated = st__attrs_donate(after, item_end);
    st__push(&sig->inputs, &n_in, &t);
    st__push_bool(&sig->donated, n_in - 1, donated);
    p = item_end;
    if (p < e && *p == ',') ++p;
  }
  sig->input_count = n_in;
  /* Results: "-> type", "-> (type {attrs}, ...)" or nothing. */
  p = st__skip_ws(p, e);
  int n_out = 0;
  if ((size_t)(e - p) >= 2 && p[0] == '-' && p[1] == '>') {
    p = st__skip_ws(p + 2, e);
    if (p < e && *p == '(') {
      ++p;
      for (;;) {
        p = st__skip_ws(p, e);
        if (p >= e) goto fail;
        if (*p == ')') break;
        const char* item_end = st__scan_to(p, e, ',');
        const char* close = st__scan_to(p, e, ')');
        if (close < item_end) item_end = close;
        st_tensor_type t;
        const char* after;
        if (!st__parse_tensor(p, item_end, &t, &after)) goto fail;
        st__push(&sig->outputs, &n_out, &t);
        p = item_end;
        if (p < e && *p == ',') ++p;
      }
    } else {
      st_tensor_type t;
      const char* after;
      if (!st__parse_tensor(p, e, &t, &after)) goto fail;
      st__push(&sig->outputs, &n_out, &t);
    }
  }
  sig->output_count = n_out;
  return true;
fail:
  st__signature_free(sig);
  return false;
}
