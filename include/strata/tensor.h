/*
 * strata/tensor.h — element types and tensor types: what every module that
 * names a tensor (bundle, ckpt, obs, sched, runtime) needs, without
 * depending on the runtime that moves tensors. Base level: nothing but the
 * C library below it (docs/architecture.md, "Modules").
 */
#ifndef STRATA_TENSOR_H
#define STRATA_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*===-------------------------------------------------------------------===*/
/* Element types                                                            */
/*===-------------------------------------------------------------------===*/

typedef enum st_dtype {
  ST_DTYPE_INVALID = 0,
  ST_DTYPE_PRED, /* bool, 1 byte */
  ST_DTYPE_S8,
  ST_DTYPE_S16,
  ST_DTYPE_S32,
  ST_DTYPE_S64,
  ST_DTYPE_U8,
  ST_DTYPE_U16,
  ST_DTYPE_U32,
  ST_DTYPE_U64,
  ST_DTYPE_F16,
  ST_DTYPE_BF16,
  ST_DTYPE_F32,
  ST_DTYPE_F64,
} st_dtype;

size_t st_dtype_size(st_dtype dtype);       /* bytes per element, 0 if invalid */
const char* st_dtype_name(st_dtype dtype);  /* "f32", "bf16", "s32", "pred", ... */
/* Parses the names above, also numpy/JAX spellings ("float32", "int32",
 * "bfloat16", "bool", "uint32"). ST_DTYPE_INVALID when unknown. */
st_dtype st_dtype_parse(const char* name);
/* Parses an MLIR element type ("f32", "i32", "si32", "ui8", "i1") of |n|
 * bytes at |s|. ST_DTYPE_INVALID when unknown. */
st_dtype st_dtype_parse_mlir(const char* s, size_t n);

#define ST_MAX_RANK 8

/* A tensor's type: dtype and dims (row-major, dense). */
typedef struct st_tensor_type {
  st_dtype dtype;
  int rank;
  int64_t dims[ST_MAX_RANK];
} st_tensor_type;

/* Element count; -1 when a dim is negative or the count overflows int64
 * (a type read from a file is checked with these before it is used). */
int64_t st_tensor_type_elements(const st_tensor_type* t);
/* Bytes of the dense tensor; SIZE_MAX when the count is -1 or the bytes
 * overflow size_t. */
size_t st_tensor_type_bytes(const st_tensor_type* t);
/* Formats as "f32[4,8]" into |buf|; returns |buf|. */
char* st_tensor_type_format(const st_tensor_type* t, char* buf, size_t buf_size);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_TENSOR_H */
