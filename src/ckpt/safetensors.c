/* safetensors.c — the safetensors file format, written by hand:
 *
 *   [u64 little-endian N][N bytes JSON header, space-padded][tensor data]
 *
 * The header maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end)} with offsets relative to the start of the data. */
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/ckpt.h"

static const char* st__safetensors_dtype(st_dtype d) {
  switch (d) {
    case ST_DTYPE_F32: return "F32";
    case ST_DTYPE_BF16: return "BF16";
    case ST_DTYPE_F16: return "F16";
    case ST_DTYPE_F64: return "F64";
    case ST_DTYPE_S32: return "I32";
    case ST_DTYPE_S64: return "I64";
    case ST_DTYPE_U32: return "U32";
    case ST_DTYPE_U8: return "U8";
    case ST_DTYPE_S8: return "I8";
    case ST_DTYPE_PRED: return "BOOL";
    default: return NULL;
  }
}

st_status st_safetensors_write(const char* path, const st_named_tensor* tensors, int count) {
  st_strbuf h = {0};
  st_strbuf_append(&h, "{\"__metadata__\": {\"format\": \"pt\", \"writer\": \"strata\"}");
  size_t offset = 0;
  for (int i = 0; i < count; ++i) {
    const char* dt = st__safetensors_dtype(tensors[i].type.dtype);
    if (!dt) {
      st_strbuf_free(&h);
      return st_status_make(ST_CODE_CKPT, "%s: tensor '%s' has dtype %s, which safetensors cannot hold", path, tensors[i].name,
                            st_dtype_name(tensors[i].type.dtype));
    }
    size_t n = st_tensor_type_bytes(&tensors[i].type);
    st_strbuf_append(&h, ", ");
    st_strbuf_json_string(&h, tensors[i].name);
    st_strbuf_printf(&h, ": {\"dtype\": \"%s\", \"shape\": [", dt);
    for (int d = 0; d < tensors[i].type.rank; ++d) st_strbuf_printf(&h, "%s%lld", d ? ", " : "", (long long)tensors[i].type.dims[d]);
    st_strbuf_printf(&h, "], \"data_offsets\": [%zu, %zu]}", offset, offset + n);
    offset += n;
  }
  st_strbuf_append(&h, "}");
  while (h.len % 8) st_strbuf_append(&h, " ");
  size_t total = 8 + h.len + offset;
  unsigned char* buf = malloc(total);
  if (!buf) {
    st_strbuf_free(&h);
    return st_status_make(ST_CODE_CKPT, "%s: out of memory (%zu bytes)", path, total);
  }
  uint64_t n = h.len;
  for (int i = 0; i < 8; ++i) buf[i] = (unsigned char)(n >> (8 * i));
  memcpy(buf + 8, h.data, h.len);
  size_t at = 8 + h.len;
  for (int i = 0; i < count; ++i) {
    size_t bytes = st_tensor_type_bytes(&tensors[i].type);
    memcpy(buf + at, tensors[i].data, bytes);
    at += bytes;
  }
  st_strbuf_free(&h);
  st_status s = st_fs_write_atomic(path, buf, total);
  free(buf);
  if (s) {
    st_status c = st_status_make(ST_CODE_CKPT, "saving tensors: %s", st_status_message(s));
    st_status_free(s);
    return c;
  }
  return ST_OK;
}
