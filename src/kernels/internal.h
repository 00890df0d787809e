/* internal.h — private to src/kernels. */
#ifndef STRATA_KERNELS_INTERNAL_H
#define STRATA_KERNELS_INTERNAL_H

#include "kernels/contract_ops.h" /* generated from the contract: ST__KERNEL_OPS, ST__KERNEL_FFI_HANDLERS */
#include "kernels/ffi_abi.h"
#include "strata/kernels.h"

/* The FFI handlers: st__ffi_<target> for every FFI target the contract
 * names, each defined beside its kernel (the op's file), registered by
 * handlers.c's table. */
#define ST__FFI_DECLARE(op, version, dir, target) xf_error* st__ffi_##target(xf_call_frame* f);
ST__KERNEL_FFI_HANDLERS(ST__FFI_DECLARE)
#undef ST__FFI_DECLARE

/* handlers.c: what every handler shares. st__ffi_probe answers XLA's
 * metadata probe (true: it was one, return NULL); st__ffi_fail makes the
 * FFI error a handler returns (never an abort); st__ffi_operands_typed
 * checks arity and that every operand is a buffer of its dtype (|dtypes|:
 * one per operand, inputs then results; NULL: all f32) and fills |in| and
 * |out|; st__ffi_operands: all f32. */
int st__ffi_probe(xf_call_frame* f);
xf_error* st__ffi_fail(xf_call_frame* f, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
int64_t st__ffi_count(const xf_buffer* b);
int st__ffi_same_shape(const xf_buffer* a, const xf_buffer* b);
xf_error* st__ffi_operands_typed(xf_call_frame* f, const char* target, int n_in, int n_out, const int* dtypes,
                                 xf_buffer** in, xf_buffer** out);
xf_error* st__ffi_operands(xf_call_frame* f, const char* target, int n_in, int n_out, xf_buffer** in,
                           xf_buffer** out);

/* A handler's first line: XLA's probe and the stages before execution get
 * nothing done. */
#define ST__FFI_PROLOGUE(f)                          \
  do {                                               \
    if (st__ffi_probe(f)) return NULL;               \
    if ((f)->stage != XF_STAGE_EXECUTE) return NULL; \
  } while (0)

extern const st_kernel_handler st__kernel_handlers[];
extern const int st__kernel_handler_count;

/* stats.c: the handler table's index of |target| (-1: none), and one call
 * of handler |handler| from |start_s| to |end_s| (st_now() seconds). */
int st__kernel_handler_index(const char* target);
void st__kernel_stats_record(int handler, double start_s, double end_s);
/* stats.c: faults.wrong_kernel=attention is set (st_kernels_set_wrong). */
bool st__kernel_wrong_attention(void);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* math.c's AVX-512 exp on a row (attention.c): s[j] = exp(s[j] - shift) for
 * j < n, returning their sum. Only to be called when st_kernels_isa() is
 * avx512. */
__attribute__((target("avx512f"))) float st__exp_shift_sum_avx512(float* s, int64_t n, float shift);
#endif

#endif
