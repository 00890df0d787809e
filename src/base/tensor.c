/* tensor.c — element types and tensor types: sizes, names, and parsing
 * of strata's, numpy's and MLIR's spellings. (PJRT's numbering is the
 * runtime's: src/runtime/dtype.c.) */
#include <stdio.h>
#include <string.h>

#include "strata/tensor.h"

typedef struct {
  st_dtype dtype;
  const char* name;   /* strata's canonical name */
  const char* numpy;  /* numpy/JAX spelling */
  const char* mlir;   /* MLIR element type */
  size_t size;
} st__dtype_row;

static const st__dtype_row kRows[] = {
    {ST_DTYPE_PRED, "pred", "bool", "i1", 1},
    {ST_DTYPE_S8, "s8", "int8", "i8", 1},
    {ST_DTYPE_S16, "s16", "int16", "i16", 2},
    {ST_DTYPE_S32, "s32", "int32", "i32", 4},
    {ST_DTYPE_S64, "s64", "int64", "i64", 8},
    {ST_DTYPE_U8, "u8", "uint8", "ui8", 1},
    {ST_DTYPE_U16, "u16", "uint16", "ui16", 2},
    {ST_DTYPE_U32, "u32", "uint32", "ui32", 4},
    {ST_DTYPE_U64, "u64", "uint64", "ui64", 8},
    {ST_DTYPE_F16, "f16", "float16", "f16", 2},
    {ST_DTYPE_BF16, "bf16", "bfloat16", "bf16", 2},
    {ST_DTYPE_F32, "f32", "float32", "f32", 4},
    {ST_DTYPE_F64, "f64", "float64", "f64", 8},
};
#define ST__NROWS (sizeof(kRows) / sizeof(kRows[0]))

static const st__dtype_row* st__tensor_row(st_dtype dtype) {
  for (size_t i = 0; i < ST__NROWS; ++i)
    if (kRows[i].dtype == dtype) return &kRows[i];
  return NULL;
}

size_t st_dtype_size(st_dtype dtype) {
  const st__dtype_row* r = st__tensor_row(dtype);
  return r ? r->size : 0;
}

const char* st_dtype_name(st_dtype dtype) {
  const st__dtype_row* r = st__tensor_row(dtype);
  return r ? r->name : "invalid";
}

st_dtype st_dtype_parse(const char* name) {
  if (!name) return ST_DTYPE_INVALID;
  for (size_t i = 0; i < ST__NROWS; ++i) {
    if (!strcmp(name, kRows[i].name) || !strcmp(name, kRows[i].numpy)) return kRows[i].dtype;
  }
  /* MLIR spellings that do not collide with the above ("i32", "ui8"...). */
  return st_dtype_parse_mlir(name, strlen(name));
}

st_dtype st_dtype_parse_mlir(const char* s, size_t n) {
  for (size_t i = 0; i < ST__NROWS; ++i) {
    if (strlen(kRows[i].mlir) == n && !memcmp(s, kRows[i].mlir, n)) return kRows[i].dtype;
  }
  /* Signless and signed integers mean the same to PJRT. */
  if (n > 2 && s[0] == 's' && s[1] == 'i') {
    char buf[8];
    if (n - 1 >= sizeof(buf)) return ST_DTYPE_INVALID;
    memcpy(buf, s + 1, n - 1);
    buf[n - 1] = '\0';
    for (size_t i = 0; i < ST__NROWS; ++i)
      if (!strcmp(buf, kRows[i].mlir) && buf[0] == 'i' && strcmp(buf, "i1")) return kRows[i].dtype;
  }
  return ST_DTYPE_INVALID;
}

int64_t st_tensor_type_elements(const st_tensor_type* t) {
  if (!t || t->rank < 0 || t->rank > ST_MAX_RANK) return 0;
  for (int i = 0; i < t->rank; ++i) {
    if (t->dims[i] < 0) return -1;
    if (t->dims[i] == 0) return 0;
  }
  int64_t n = 1;
  for (int i = 0; i < t->rank; ++i) {
    if (n > INT64_MAX / t->dims[i]) return -1;
    n *= t->dims[i];
  }
  return n;
}

size_t st_tensor_type_bytes(const st_tensor_type* t) {
  if (!t) return 0;
  int64_t n = st_tensor_type_elements(t);
  size_t size = st_dtype_size(t->dtype);
  if (n < 0 || (size && (uint64_t)n > SIZE_MAX / size)) return SIZE_MAX;
  return (size_t)n * size;
}

char* st_tensor_type_format(const st_tensor_type* t, char* buf, size_t buf_size) {
  if (!buf || buf_size == 0) return buf;
  if (!t) {
    snprintf(buf, buf_size, "(null)");
    return buf;
  }
  size_t n = (size_t)snprintf(buf, buf_size, "%s[", st_dtype_name(t->dtype));
  for (int i = 0; i < t->rank && i < ST_MAX_RANK && n < buf_size; ++i)
    n += (size_t)snprintf(buf + n, buf_size - n, i ? ",%lld" : "%lld", (long long)t->dims[i]);
  if (n < buf_size) snprintf(buf + n, buf_size - n, "]");
  return buf;
}
