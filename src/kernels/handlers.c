/*
 * handlers.c — what the XLA FFI handlers that serve the kernels' custom
 * calls share (ffi_abi.h; docs/kernels.md, "Registration"), and their table.
 * Each handler, st__ffi_<target> beside its kernel (math.c, xent.c,
 * attention.c), answers XLA's metadata probe, checks what it is handed
 * against the contract (dtypes, matching shapes) and runs its kernel on the
 * calling thread (attention.c: on threads started and joined within the
 * call). The table is generated from the contract (ST__KERNEL_FFI_HANDLERS,
 * cmake/KernelContract.cmake): a handler the contract names but no file
 * defines is a link error.
 *
 * A handler returns an error, never aborts: a wrong shape reaches it only if
 * a bundle was hand-made or the exporter broke its contract, and the run
 * should stop with a message, not a crash.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#include "kernels/ffi_abi.h"
#include "kernels/internal.h"
#include "strata/base.h"
#include "strata/kernels.h"

/* XLA calls each handler once at registration with a metadata extension in
 * the frame: the handler must say which FFI API version it was built for. */
int st__ffi_probe(xf_call_frame* f) {
  for (xf_ext* e = f->extension_start; e; e = e->next) {
    if (e->type != XF_EXT_METADATA) continue;
    xf_metadata* m = ((xf_metadata_ext*)e)->metadata;
    m->api_version.struct_size = sizeof(xf_api_version);
    m->api_version.extension_start = NULL;
    m->api_version.major = XF_API_MAJOR;
    m->api_version.minor = XF_API_MINOR;
    m->traits = 0;
    return 1;
  }
  return 0;
}

xf_error* st__ffi_fail(xf_call_frame* f, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  xf_error_create_args a = {.struct_size = sizeof(a), .message = msg, .errc = XF_INVALID_ARGUMENT};
  return f->api->error_create(&a);
}

int64_t st__ffi_count(const xf_buffer* b) {
  int64_t n = 1;
  for (int64_t i = 0; i < b->rank; ++i) n *= b->dims[i];
  return n;
}

int st__ffi_same_shape(const xf_buffer* a, const xf_buffer* b) {
  if (a->rank != b->rank) return 0;
  for (int64_t i = 0; i < a->rank; ++i)
    if (a->dims[i] != b->dims[i]) return 0;
  return 1;
}

static const char* st__dtype_name(int dtype) { return dtype == XF_F32 ? "f32" : dtype == XF_S32 ? "s32" : "?"; }

xf_error* st__ffi_operands_typed(xf_call_frame* f, const char* target, int n_in, int n_out, const int* dtypes,
                                    xf_buffer** in, xf_buffer** out) {
  if (f->args.size != n_in || f->rets.size != n_out)
    return st__ffi_fail(f, "%s: expected %d operands and %d results, got %lld and %lld", target, n_in, n_out,
                    (long long)f->args.size, (long long)f->rets.size);
  for (int i = 0; i < n_in + n_out; ++i) {
    const xf_list* l = i < n_in ? &f->args : &f->rets;
    int j = i < n_in ? i : i - n_in;
    if (l->types[j] != 1) return st__ffi_fail(f, "%s: operand %d is not a buffer", target, i);
    xf_buffer* b = l->items[j];
    int want = dtypes ? dtypes[i] : XF_F32;
    if (b->dtype != want)
      return st__ffi_fail(f, "%s: operand %d has dtype %d, the contract allows %s only", target, i, b->dtype,
                      st__dtype_name(want));
    if (i < n_in) in[j] = b;
    else out[j] = b;
  }
  return NULL;
}

xf_error* st__ffi_operands(xf_call_frame* f, const char* target, int n_in, int n_out, xf_buffer** in,
                           xf_buffer** out) {
  return st__ffi_operands_typed(f, target, n_in, n_out, NULL, in, out);
}

/* Every handler as the plugin calls it: the call counted and timed
 * (stats.c) when it runs a kernel, not when XLA probes or prepares it. */
static int st__is_probe(const xf_call_frame* f) {
  for (const xf_ext* e = f->extension_start; e; e = e->next)
    if (e->type == XF_EXT_METADATA) return 1;
  return 0;
}

#define ST__TIMED(op, version, dir, target)                                    \
  static xf_error* st__ffi_##target##_timed(xf_call_frame* f) {                \
    if (st__is_probe(f) || f->stage != XF_STAGE_EXECUTE)                       \
      return st__ffi_##target(f);                                              \
    static _Atomic int index = -2; /* -2: not looked up yet */                 \
    int i = atomic_load_explicit(&index, memory_order_relaxed);                \
    if (i == -2) atomic_store(&index, i = st__kernel_handler_index(#target));  \
    double t0 = st_now();                                                      \
    xf_error* e = st__ffi_##target(f);                                         \
    st__kernel_stats_record(i, t0, st_now());                                  \
    return e;                                                                  \
  }

ST__KERNEL_FFI_HANDLERS(ST__TIMED)

/* The handlers compiled into strata, one per FFI target of the contract.
 * The version is the contract's; the code's own is in its name (the
 * target, ..._v1), so a contract that moves to v2 without new code does not
 * link. st_kernels_check_contract still holds the table to the contract,
 * and a bundle naming another version is refused (exit 4). */
#define ST__HANDLER_ROW(op, version, dir, target) {#op, version, #dir, #target, (void*)st__ffi_##target##_timed},
const st_kernel_handler st__kernel_handlers[] = {ST__KERNEL_FFI_HANDLERS(ST__HANDLER_ROW)};
const int st__kernel_handler_count = (int)(sizeof(st__kernel_handlers) / sizeof(st__kernel_handlers[0]));

/* The same, as the runtime's registration list (static: the runtime only
 * borrows it during creation, the plugin keeps the function pointers). */
#define ST__TARGET_ROW(op, version, dir, target) {#target, (void*)st__ffi_##target##_timed},
static const st_ffi_target kTargets[] = {ST__KERNEL_FFI_HANDLERS(ST__TARGET_ROW)};

const st_ffi_target* st_kernels_ffi_target_table(int* count) {
  if (count) *count = (int)(sizeof(kTargets) / sizeof(kTargets[0]));
  return kTargets;
}
