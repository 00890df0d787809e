/* kernels.h — strata's kernels: the contract table (one source of truth,
 * python/strata_jax/kernel_contract.json, compiled into strata), the C
 * kernels and the XLA FFI handlers that serve their custom calls, and the
 * check that a bundle's kernels are the ones this strata registers
 * (docs/kernels.md). */
#ifndef STRATA_KERNELS_H
#define STRATA_KERNELS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/obs.h"
#include "strata/runtime.h"
#include "strata/status.h"

/*--- the contract --------------------------------------------------------*/

typedef struct st_kernel_tolerance {
  char dtype[8];
  double fwd_rtol, fwd_atol, bwd_rtol, bwd_atol;
} st_kernel_tolerance;

#define ST_KERNEL_MAX_TOLERANCES 4
#define ST_KERNEL_MAX_IMPLS 4
#define ST_KERNEL_MAX_DEFAULTS 8
#define ST_KERNEL_MAX_TARGETS 8

/* One row of the contract; every string is owned by the contract. */
typedef struct st_kernel_op {
  char* name;
  int version;
  char* math;
  char* inputs;  /* "x [..., D] f32; gain [D] f32" */
  char* outputs; /* "y like x f32" */
  char* layout;
  char* sharding;
  char* accumulator;
  char* padding;
  char* tile;
  bool has_backward;
  int tolerance_count;
  st_kernel_tolerance tolerances[ST_KERNEL_MAX_TOLERANCES];
  char* fallback;
  char* profile_label;
  int impl_count;
  char* impls[ST_KERNEL_MAX_IMPLS];
  /* "default": {platform: impl, ...}: what kernels.<op>=auto resolves to
   * on each PJRT platform ("cpu", ...); "other" serves every platform not
   * named. The fastest verified implementation there (docs/kernels.md). */
  int default_count;
  char default_platform[ST_KERNEL_MAX_DEFAULTS][16];
  char* default_impl[ST_KERNEL_MAX_DEFAULTS];
  char* ffi_fwd; /* FFI target names; "" when the op has no ffi implementation */
  char* ffi_bwd;
  /* Every FFI target of the row, fwd and bwd first, then an optional
   * operand's form (attention's seg_fwd, seg_bwd): its key in ffi_targets
   * (the handler's direction) and the target. */
  int target_count;
  char target_dir[ST_KERNEL_MAX_TARGETS][16];
  char* targets[ST_KERNEL_MAX_TARGETS];
} st_kernel_op;

typedef struct st_kernel_contract {
  int contract_version;
  int op_count;
  st_kernel_op* ops;
} st_kernel_contract;

#define ST_KERNEL_MAX_OPS 64

/* Parses contract JSON text (bounded: at most ST_KERNEL_MAX_OPS ops).
 * |where| names the source in errors. Free with st_kernel_contract_free. */
st_status st_kernel_contract_parse(const char* text, size_t size, const char* where, st_kernel_contract* out);
/* The contract compiled into this strata. */
st_status st_kernel_contract_load(st_kernel_contract* out);
/* Its op names, in its order (static storage, generated from the contract
 * at build time: the list every kernels.<op> loop walks); |count| gets
 * their number, at most ST_KERNEL_MAX_OPS. */
const char* const* st_kernels_op_names(int* count);
void st_kernel_contract_free(st_kernel_contract* c);
const st_kernel_op* st_kernel_contract_find(const st_kernel_contract* c, const char* name);
/* The tolerance row of |dtype|, or NULL. */
const st_kernel_tolerance* st_kernel_op_tolerance(const st_kernel_op* op, const char* dtype);
/* The implementation kernels.<op>=auto takes on PJRT platform |platform|
 * ("cpu", "cuda", ...; NULL or "" as "other"): the row's entry for that
 * platform, else its "other" entry, else "xla" (the reference, always
 * available). Owned by the contract. */
const char* st_kernel_op_default(const st_kernel_op* op, const char* platform);
/* kernels.<op> as configured (xla|ffi|pallas|auto) -> the implementation
 * used on |platform|: |configured| unless it is "auto". An op the contract
 * lacks resolves auto to "xla". Static or contract-owned string. */
const char* st_kernel_resolve(const st_kernel_contract* c, const char* op, const char* configured, const char* platform);
/* `strata kernels list`: the table, one block per op. */
void st_kernel_contract_print(const st_kernel_contract* c, FILE* out);
/* The contract as JSON (`strata kernels list --json`); caller decrefs. */
st_json* st_kernel_contract_json(const st_kernel_contract* c);

/*--- handlers ------------------------------------------------------------*/

#define ST_KERNEL_RMSNORM_FWD "strata_rmsnorm_fwd_v1"
#define ST_KERNEL_RMSNORM_BWD "strata_rmsnorm_bwd_v1"
#define ST_KERNEL_SWIGLU_FWD "strata_swiglu_fwd_v1"
#define ST_KERNEL_SWIGLU_BWD "strata_swiglu_bwd_v1"
#define ST_KERNEL_CROSS_ENTROPY_FWD "strata_cross_entropy_fwd_v1"
#define ST_KERNEL_CROSS_ENTROPY_BWD "strata_cross_entropy_bwd_v1"
#define ST_KERNEL_ATTENTION_FWD "strata_attention_fwd_v1"
#define ST_KERNEL_ATTENTION_BWD "strata_attention_bwd_v1"
#define ST_KERNEL_ATTENTION_SEG_FWD "strata_attention_seg_fwd_v1" /* the form with segment_ids */
#define ST_KERNEL_ATTENTION_SEG_BWD "strata_attention_seg_bwd_v1"

/* A handler compiled into strata: the op, the contract version its code
 * implements, the direction ("fwd"/"bwd") and the target it serves. */
typedef struct st_kernel_handler {
  const char* op;
  int version;
  const char* direction;
  const char* target;
  void* fn; /* XLA FFI handler (src/kernels/ffi_abi.h) */
} st_kernel_handler;

/* Every handler; |count| gets their number. Static storage. */
const st_kernel_handler* st_kernels_handlers(int* count);
/* Every handler as st_runtime_options.ffi_targets wants them (static
 * storage); |count| gets their number. */
const st_ffi_target* st_kernels_ffi_target_table(int* count);
/* True when |bundle|'s programs call FFI kernels (some op at ffi): its
 * runtime must register the handlers. */
bool st_kernels_bundle_uses_ffi(const st_bundle* bundle);
/* {"<op>": "<impl>", ..., "isa": "avx512"|"portable"}: the kernels a run
 * uses, for context.json and the bundle event. Caller decrefs. */
st_json* st_kernels_bundle_json(const st_bundle* bundle);
/* Holds the handlers to the contract: every op with an ffi implementation
 * has a fwd (and a bwd when it has a backward) handler of the contract's
 * version and target names, and no handler serves an op the contract
 * lacks. A mismatch is a build defect (ST_CODE_INTERNAL). */
st_status st_kernels_check_contract(const st_kernel_contract* c);
/* The bundle's kernels against the handlers this strata registers, before
 * any compile: an ffi op the handlers do not serve, a contract version
 * other than the handler's, or a target no handler serves, is a runtime
 * error (exit 4) naming the kernel and both versions. xla and pallas ops
 * need no handler. */
st_status st_kernels_check_bundle(const st_bundle* bundle);

/*--- the C kernels (f32, dense row-major) --------------------------------*/

typedef enum { ST_KERNEL_ISA_PORTABLE = 0, ST_KERNEL_ISA_AVX512 = 1 } st_kernel_isa;

/* The vector path this CPU gets: AVX-512 when it has avx512f (asked once),
 * else portable; STRATA_KERNELS_ISA=portable forces portable. */
st_kernel_isa st_kernels_isa(void);
const char* st_kernels_isa_name(st_kernel_isa isa);

/* y = x * rsqrt(mean(x^2) + 1e-6) * gain over rows of d. */
void st_kernel_rmsnorm_fwd(st_kernel_isa isa, const float* x, const float* gain, float* y, int64_t rows, int64_t d);
/* dx [rows, d] and dgain [d] (summed over rows; overwritten). */
void st_kernel_rmsnorm_bwd(st_kernel_isa isa, const float* x, const float* gain, const float* dy, float* dx,
                           float* dgain, int64_t rows, int64_t d);
/* h = silu(gate) * up over n elements. */
void st_kernel_swiglu_fwd(st_kernel_isa isa, const float* gate, const float* up, float* h, int64_t n);
void st_kernel_swiglu_bwd(st_kernel_isa isa, const float* gate, const float* up, const float* dh, float* dgate,
                          float* dup, int64_t n);

/* Softmax cross-entropy over the vocabulary (contract row cross_entropy):
 * logits [rows, v] f32, targets [rows] (each in [0, v): the caller checks,
 * st_kernel_cross_entropy_bad_target) -> ce [rows] = lse - logits[target]
 * and lse [rows] = log(sum(exp(logits))). Rows may run on several threads. */
void st_kernel_cross_entropy_fwd(st_kernel_isa isa, const float* logits, const int32_t* targets, float* ce,
                                 float* lse, int64_t rows, int64_t v);
/* dlogits [rows, v] = dce[row] * (exp(logits - lse[row]) - onehot(target)). */
void st_kernel_cross_entropy_bwd(st_kernel_isa isa, const float* logits, const int32_t* targets, const float* lse,
                                 const float* dce, float* dlogits, int64_t rows, int64_t v);
/* The first row whose target is outside [0, v), or -1 when none is. */
int64_t st_kernel_cross_entropy_bad_target(const int32_t* targets, int64_t rows, int64_t v);

/* Causal attention v1 (src/kernels/attention.c): q, o, dout, dq [b, t, h, dh];
 * k, v, dk, dv [b, t, kv, dh] (kv divides h; query head i reads key/value
 * head i / (h / kv)); lse [b, h, t]. Scale 1/sqrt(dh). Every output is
 * overwritten. Flash-style tiles, no [t, t] buffer; the work is split over
 * up to |threads| threads started and joined within the call (the handlers
 * pass the kernels' thread count, src/kernels/pool.h); each thread's
 * scratch (a few hundred KiB) comes from st_xmalloc. Returns 0; -2 for
 * sizes outside the contract (a size below 1, or kv not dividing h).
 * Buffers are borrowed. */
int st_kernel_attention_fwd(st_kernel_isa isa, int threads, const float* q, const float* k, const float* v, float* o,
                            float* lse, int64_t b, int64_t t, int64_t h, int64_t kv, int64_t dh);
int st_kernel_attention_bwd(st_kernel_isa isa, int threads, const float* q, const float* k, const float* v,
                            const float* o, const float* lse, const float* dout, float* dq, float* dk, float* dv,
                            int64_t b, int64_t t, int64_t h, int64_t kv, int64_t dh);
/* The same with segment ids |seg| [b, t] (the contract's seg form): query i
 * attends key j iff j <= i and seg[i] == seg[j] within its sequence. Any
 * ids work; key tiles whose ids cannot meet a query tile's are skipped.
 * |seg| NULL is the plain form above. */
int st_kernel_attention_seg_fwd(st_kernel_isa isa, int threads, const float* q, const float* k, const float* v,
                                const int32_t* seg, float* o, float* lse, int64_t b, int64_t t, int64_t h, int64_t kv,
                                int64_t dh);
int st_kernel_attention_seg_bwd(st_kernel_isa isa, int threads, const float* q, const float* k, const float* v,
                                const int32_t* seg, const float* o, const float* lse, const float* dout, float* dq,
                                float* dk, float* dv, int64_t b, int64_t t, int64_t h, int64_t kv, int64_t dh);

/*--- observability: calls and time per kernel (docs/kernels.md) ----------
 * The handlers count every call they serve in one process-wide table
 * (src/kernels/stats.c says why the FFI ABI forces it): calls and time per
 * handler, and, while recording is on, each call's span. */

typedef struct st_kernel_stat {
  const char* op;        /* static storage, like the handler table */
  const char* direction; /* "fwd" | "bwd" */
  const char* target;
  int64_t calls;
  double seconds; /* summed over calls (threads of one call not added twice) */
} st_kernel_stat;

/* One row per handler (at most |cap|; |out| NULL: none written) with the
 * calls since the last take; the counters are reset. Returns the rows. */
int st_kernels_stats_take(st_kernel_stat* out, int cap);

/* faults.wrong_kernel (test-only; docs/diagnostics.md, "Dump and compare"):
 * ST_KERNEL_WRONG_ATTENTION makes the attention forward handlers scale
 * their output o by 1 + 2^-10 after computing it, a kernel bug small
 * enough to pass a loss check and large enough for strata compare; 0 (the
 * default) turns it off. Process-wide, like the counters. */
#define ST_KERNEL_WRONG_ATTENTION 1
void st_kernels_set_wrong(int what);

#define ST_KERNEL_MAX_SPANS 4096

typedef struct st_kernel_span {
  int handler;    /* index into st_kernels_handlers() */
  double start_s; /* st_now() clock */
  double dur_s;
} st_kernel_span;

/* Starts (on) or stops recording spans; either way the recorded ones are
 * dropped. At most ST_KERNEL_MAX_SPANS are kept until the next take. */
void st_kernels_spans_record(bool on);
/* The spans recorded since recording started or the last take, in no
 * particular order (at most |cap|); |dropped| gets those beyond
 * ST_KERNEL_MAX_SPANS. Call when no kernel runs (after a step). */
int st_kernels_spans_take(st_kernel_span* out, int cap, int64_t* dropped);
/* The same spans for a trace (st_executor_write_trace): each named
 * kernel.<op> <fwd|bwd> with its target in args, on lanes named "kernels
 * (FFI handlers)", those beyond the bound counted as kernel_spans_dropped.
 * Free with st_trace_spans_free. */
void st_kernels_spans_take_trace(st_trace_spans* out);

/*--- verification (`strata kernels verify`) -------------------------------*/

typedef struct st_kernels_verify_options {
  const char* op;         /* one op, or NULL/"" for all */
  const char* impl;       /* one implementation (ffi, pallas) against the xla reference, or NULL/"" for all */
  double tolerance_scale; /* multiplies every tolerance (1: the contract's; 0: exact agreement) */
  const char* workdir;    /* where the exporter writes the programs (created; removed unless keep) */
  bool keep;              /* keep |workdir| */
  /* The runtime to use; NULL: one is created with 1 CPU device, every
   * handler registered. Borrowed. */
  st_runtime* runtime;
  FILE* out; /* one line per case; NULL: silent */
  /* `strata kernels bench`: the contract's bench_shapes, each program run
   * |bench_runs| times (after 2 warm-up runs), the median time per call
   * and its ratio to xla printed; no comparison. */
  bool bench;
  int bench_runs;
  /* The Python module that writes the programs (python -m MODULE WORKDIR
   * [--op OP] [--impl IMPL] [--bench]); NULL: strata_jax.kernel_verify. A
   * test fixture names its own, which adds its op first
   * (tests/fixtures/kernel_op). */
  const char* exporter_module;
} st_kernels_verify_options;

typedef struct st_kernels_verify_result {
  int cases;           /* compared (xla references not counted) */
  int ffi_cases;       /* of them, ffi: each compiled and ran a custom call */
  double worst_ratio;  /* largest |err| / (atol + rtol |ref|) over all cases */
} st_kernels_verify_result;

/* Every implementation of every op (or |op|) against the xla reference on
 * the contract's verify shapes, forward and backward: the programs come
 * from `python -m strata_jax.kernel_verify`, the inputs are made here
 * (seeded, the same for every implementation). A case outside tolerance is
 * a runtime error (exit 4) naming op, implementation, direction, shape and
 * the largest error; so is a program that does not compile (an
 * unregistered FFI target). */
st_status st_kernels_verify(const st_kernels_verify_options* options, st_kernels_verify_result* result);

#endif /* STRATA_KERNELS_H */
