/* mlir_sig.c — reads the interface of `func.func public @main` from MLIR
 * text, so programs exported by JAX can be checked before launch without a
 * full MLIR parser. Only what strata needs is understood: ranked tensor
 * types with static dims, argument attributes that mark donation, result
 * types. Anything else makes the signature "unknown" (never an error). */
#include <stdlib.h>
#include <string.h>

#include "runtime/rt_internal.h"
#include "strata/ir.h"

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

/* The scanning is src/ir/'s (include/strata/ir.h), shared with the
 * program analyzer; a signature needs static dims, a dtype strata names
 * and a rank within ST_MAX_RANK. */
static bool st__parse_tensor(const char* p, const char* e, st_tensor_type* t, const char** out_end) {
  st_ir_type it;
  if (!st_ir_parse_type(p, e, &it, out_end) || it.dynamic || it.rank > ST_MAX_RANK ||
      it.dtype == ST_DTYPE_INVALID)
    return false;
  memset(t, 0, sizeof(*t));
  t->dtype = it.dtype;
  t->rank = it.rank;
  for (int i = 0; i < it.rank; ++i) t->dims[i] = it.dims[i];
  return true;
}

static bool st__attrs_donate(const char* p, const char* e) {
  return st_ir_find(p, e, "tf.aliasing_output") != NULL || st_ir_find(p, e, "jax.buffer_donor = true") != NULL;
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
  const char* p = st_ir_find(text, e, "func.func public @main(");
  size_t skip = strlen("func.func public @main(");
  if (!p) {
    p = st_ir_find(text, e, "func.func @main(");
    skip = strlen("func.func @main(");
  }
  if (!p) return false;
  p += skip;
  int n_in = 0;
  /* Arguments: "%name: type {attrs}" separated by top-level commas. */
  for (;;) {
    p = st_ir_skip_ws(p, e);
    if (p >= e) goto fail;
    if (*p == ')') {
      ++p;
      break;
    }
    const char* item_end = st_ir_scan_to(p, e, ',');
    const char* close = st_ir_scan_to(p, e, ')');
    if (close < item_end) item_end = close;
    const char* colon = st_ir_find(p, item_end, ":");
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
  p = st_ir_skip_ws(p, e);
  int n_out = 0;
  if ((size_t)(e - p) >= 2 && p[0] == '-' && p[1] == '>') {
    p = st_ir_skip_ws(p + 2, e);
    if (p < e && *p == '(') {
      ++p;
      for (;;) {
        p = st_ir_skip_ws(p, e);
        if (p >= e) goto fail;
        if (*p == ')') break;
        const char* item_end = st_ir_scan_to(p, e, ',');
        const char* close = st_ir_scan_to(p, e, ')');
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
