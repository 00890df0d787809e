/*
 * strata/ckpt.h — tensors on disk. For now: safetensors files (readable by
 * the Python `safetensors` package), written atomically.
 */
#ifndef STRATA_CKPT_H
#define STRATA_CKPT_H

#include "strata/runtime.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_named_tensor {
  const char* name;
  st_tensor_type type;
  const void* data; /* st_tensor_type_bytes(&type) bytes, borrowed */
} st_named_tensor;

/* Writes |count| tensors to |path| in the safetensors format (8-byte
 * little-endian header size, JSON header, raw little-endian data), through
 * a temporary file + fsync + rename. ST_CODE_CKPT on failure. */
st_status st_safetensors_write(const char* path, const st_named_tensor* tensors, int count);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_CKPT_H */
