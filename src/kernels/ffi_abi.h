/*
 * ffi_abi.h — strata's own declarations of the part of the XLA FFI C ABI
 * (API 0.x, handlers declare 0.4) that its C kernels use.
 *
 * Not upstream's xla/ffi/api/c_api.h: written for strata from that header's
 * documented layout (read, not copied). Only what a handler touches is
 * declared: the call frame, buffers, the metadata probe and error creation.
 * Names use an xf_ prefix so they never clash with upstream's.
 *
 * What the layouts rely on:
 *   - every struct begins {size_t struct_size; void* extension_start;}
 *     except the metadata extension, whose header is the internal extension
 *     {size_t struct_size; int type; next};
 *   - the XLA_FFI_Api table starts with its size, extension, version and an
 *     internal pointer, then Error_Create is its first entry point;
 *   - new fields are appended only.
 */
#ifndef STRATA_KERNELS_FFI_ABI_H
#define STRATA_KERNELS_FFI_ABI_H

#include <stddef.h>
#include <stdint.h>

/* The FFI API version the handlers declare in the metadata probe. The
 * plugin accepts a handler version from 0.1 up to its own (0.4 in the
 * jaxlib 0.11.2 era plugin), so this must not be newer than the plugin. */
#define XF_API_MAJOR 0
#define XF_API_MINOR 4

typedef struct xf_error xf_error; /* opaque, created by the API */

typedef struct xf_ext {
  size_t struct_size;
  int type; /* 1: the metadata probe */
  struct xf_ext* next;
} xf_ext;

#define XF_EXT_METADATA 1

typedef struct xf_api_version {
  size_t struct_size;
  xf_ext* extension_start;
  int major;
  int minor;
} xf_api_version;

/* What the probe asks for. Declared up to traits: the plugin's struct may
 * be larger (later fields), so a handler writes only these. */
typedef struct xf_metadata {
  size_t struct_size;
  xf_api_version api_version;
  uint32_t traits;
} xf_metadata;

typedef struct xf_metadata_ext {
  xf_ext base;
  xf_metadata* metadata;
} xf_metadata_ext;

/* Element types: xla::PrimitiveType's numbers. */
enum { XF_S32 = 4, XF_F32 = 11 };

typedef struct xf_buffer {
  size_t struct_size;
  xf_ext* extension_start;
  int dtype;
  void* data;
  int64_t rank;
  int64_t* dims;
} xf_buffer;

typedef struct xf_list { /* args and rets share this layout */
  size_t struct_size;
  xf_ext* extension_start;
  int64_t size;
  int* types;   /* 1: buffer */
  void** items; /* xf_buffer* each */
} xf_list;

typedef struct xf_attrs {
  size_t struct_size;
  xf_ext* extension_start;
  int64_t size;
  int* types;
  void** names;
  void** attrs;
} xf_attrs;

enum { XF_STAGE_EXECUTE = 3 };

typedef struct xf_api xf_api;

typedef struct xf_call_frame {
  size_t struct_size;
  xf_ext* extension_start;
  const xf_api* api;
  void* ctx;
  int stage;
  xf_list args;
  xf_list rets;
  xf_attrs attrs;
} xf_call_frame;

typedef xf_error* (*xf_handler)(xf_call_frame* frame);

/* absl status codes. */
enum { XF_INVALID_ARGUMENT = 3 };

typedef struct xf_error_create_args {
  size_t struct_size;
  xf_ext* extension_start;
  const char* message;
  int errc;
} xf_error_create_args;

struct xf_api {
  size_t struct_size;
  xf_ext* extension_start;
  xf_api_version api_version;
  const void* internal_api;
  xf_error* (*error_create)(xf_error_create_args* args);
  /* Later entries are not used. */
};

#endif /* STRATA_KERNELS_FFI_ABI_H */
