/*
 * handlers.c — the XLA FFI handlers that serve the kernels' custom calls
 * (ffi_abi.h; docs/kernels.md, "Registration"). Each answers XLA's metadata
 * probe, checks what it is handed against the contract (f32, matching
 * shapes) and runs math.c on the calling thread (attention.c: on threads
 * started and joined within the call).
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
#include "kernels/pool.h"
#include "strata/base.h"
#include "strata/kernels.h"

/* XLA calls each handler once at registration with a metadata extension in
 * the frame: the handler must say which FFI API version it was built for. */
static int st__probe(xf_call_frame* f) {
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

static xf_error* st__fail(xf_call_frame* f, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static xf_error* st__fail(xf_call_frame* f, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  xf_error_create_args a = {.struct_size = sizeof(a), .message = msg, .errc = XF_INVALID_ARGUMENT};
  return f->api->error_create(&a);
}

static int64_t st__handlers_count(const xf_buffer* b) {
  int64_t n = 1;
  for (int64_t i = 0; i < b->rank; ++i) n *= b->dims[i];
  return n;
}

static int st__same_shape(const xf_buffer* a, const xf_buffer* b) {
  if (a->rank != b->rank) return 0;
  for (int64_t i = 0; i < a->rank; ++i)
    if (a->dims[i] != b->dims[i]) return 0;
  return 1;
}

static const char* st__dtype_name(int dtype) { return dtype == XF_F32 ? "f32" : dtype == XF_S32 ? "s32" : "?"; }

/* Checks arity and that every operand is a buffer of its dtype (|dtypes|:
 * one per operand, inputs then results; NULL: all f32); fills |in|/|out|. */
static xf_error* st__operands_typed(xf_call_frame* f, const char* target, int n_in, int n_out, const int* dtypes,
                                    xf_buffer** in, xf_buffer** out) {
  if (f->args.size != n_in || f->rets.size != n_out)
    return st__fail(f, "%s: expected %d operands and %d results, got %lld and %lld", target, n_in, n_out,
                    (long long)f->args.size, (long long)f->rets.size);
  for (int i = 0; i < n_in + n_out; ++i) {
    const xf_list* l = i < n_in ? &f->args : &f->rets;
    int j = i < n_in ? i : i - n_in;
    if (l->types[j] != 1) return st__fail(f, "%s: operand %d is not a buffer", target, i);
    xf_buffer* b = l->items[j];
    int want = dtypes ? dtypes[i] : XF_F32;
    if (b->dtype != want)
      return st__fail(f, "%s: operand %d has dtype %d, the contract allows %s only", target, i, b->dtype,
                      st__dtype_name(want));
    if (i < n_in) in[j] = b;
    else out[j] = b;
  }
  return NULL;
}

/* Checks arity and that every operand is an f32 buffer; fills |in|/|out|. */
static xf_error* st__operands(xf_call_frame* f, const char* target, int n_in, int n_out, xf_buffer** in,
                              xf_buffer** out) {
  return st__operands_typed(f, target, n_in, n_out, NULL, in, out);
}

#define ST__HANDLER_PROLOGUE(f)                       \
  do {                                                \
    if (st__probe(f)) return NULL;                    \
    if ((f)->stage != XF_STAGE_EXECUTE) return NULL;  \
  } while (0)

/* rmsnorm fwd: (x [..., D], gain [D]) -> y like x. */
static xf_error* st__rmsnorm_fwd(xf_call_frame* f) {
  ST__HANDLER_PROLOGUE(f);
  xf_buffer *in[2], *out[1];
  xf_error* e = st__operands(f, ST_KERNEL_RMSNORM_FWD, 2, 1, in, out);
  if (e) return e;
  xf_buffer *x = in[0], *g = in[1];
  if (x->rank < 1 || g->rank != 1 || g->dims[0] != x->dims[x->rank - 1] || !st__same_shape(x, out[0]))
    return st__fail(f, "%s: shapes outside the contract (x [..., D], gain [D], y like x)", ST_KERNEL_RMSNORM_FWD);
  int64_t d = g->dims[0];
  st_kernel_rmsnorm_fwd(st_kernels_isa(), x->data, g->data, out[0]->data, d ? st__handlers_count(x) / d : 0, d);
  return NULL;
}

/* rmsnorm bwd: (x, gain, dy) -> (dx like x, dgain [D]). */
static xf_error* st__rmsnorm_bwd(xf_call_frame* f) {
  ST__HANDLER_PROLOGUE(f);
  xf_buffer *in[3], *out[2];
  xf_error* e = st__operands(f, ST_KERNEL_RMSNORM_BWD, 3, 2, in, out);
  if (e) return e;
  xf_buffer *x = in[0], *g = in[1], *dy = in[2];
  if (x->rank < 1 || g->rank != 1 || g->dims[0] != x->dims[x->rank - 1] || !st__same_shape(x, dy) ||
      !st__same_shape(x, out[0]) || !st__same_shape(g, out[1]))
    return st__fail(f, "%s: shapes outside the contract (x, dy, dx [..., D]; gain, dgain [D])", ST_KERNEL_RMSNORM_BWD);
  int64_t d = g->dims[0];
  st_kernel_rmsnorm_bwd(st_kernels_isa(), x->data, g->data, dy->data, out[0]->data, out[1]->data,
                        d ? st__handlers_count(x) / d : 0, d);
  return NULL;
}

static xf_error* st__swiglu_fwd(xf_call_frame* f) {
  ST__HANDLER_PROLOGUE(f);
  xf_buffer *in[2], *out[1];
  xf_error* e = st__operands(f, ST_KERNEL_SWIGLU_FWD, 2, 1, in, out);
  if (e) return e;
  if (!st__same_shape(in[0], in[1]) || !st__same_shape(in[0], out[0]))
    return st__fail(f, "%s: gate, up and h must have one shape", ST_KERNEL_SWIGLU_FWD);
  st_kernel_swiglu_fwd(st_kernels_isa(), in[0]->data, in[1]->data, out[0]->data, st__handlers_count(in[0]));
  return NULL;
}

static xf_error* st__swiglu_bwd(xf_call_frame* f) {
  ST__HANDLER_PROLOGUE(f);
  xf_buffer *in[3], *out[2];
  xf_error* e = st__operands(f, ST_KERNEL_SWIGLU_BWD, 3, 2, in, out);
  if (e) return e;
  for (int i = 1; i < 3; ++i)
    if (!st__same_shape(in[0], in[i])) return st__fail(f, "%s: gate, up and dh must have one shape", ST_KERNEL_SWIGLU_BWD);
  if (!st__same_shape(in[0], out[0]) || !st__same_shape(in[0], out[1]))
    return st__fail(f, "%s: dgate and dup must have gate's shape", ST_KERNEL_SWIGLU_BWD);
  st_kernel_swiglu_bwd(st_kernels_isa(), in[0]->data, in[1]->data, in[2]->data, out[0]->data, out[1]->data,
                       st__handlers_count(in[0]));
  return NULL;
}

/* cross_entropy fwd: (logits [N, V] f32, targets [N] s32) -> (ce [N], lse [N]). */
static xf_error* st__check_targets(xf_call_frame* f, const char* target, const xf_buffer* t, int64_t v) {
  int64_t bad = st_kernel_cross_entropy_bad_target(t->data, t->dims[0], v);
  if (bad < 0) return NULL;
  return st__fail(f, "%s: target %d (row %lld) is outside the vocabulary [0, %lld): the data has a token id the "
                  "model's vocabulary does not (model.vocab_size)",
                  target, (int)((const int32_t*)t->data)[bad], (long long)bad, (long long)v);
}

static xf_error* st__cross_entropy_fwd(xf_call_frame* f) {
  ST__HANDLER_PROLOGUE(f);
  static const int kTypes[] = {XF_F32, XF_S32, XF_F32, XF_F32};
  xf_buffer *in[2], *out[2];
  xf_error* e = st__operands_typed(f, ST_KERNEL_CROSS_ENTROPY_FWD, 2, 2, kTypes, in, out);
  if (e) return e;
  xf_buffer *x = in[0], *t = in[1];
  if (x->rank != 2 || t->rank != 1 || t->dims[0] != x->dims[0] || !st__same_shape(t, out[0]) ||
      !st__same_shape(t, out[1]) || x->dims[1] < 1)
    return st__fail(f, "%s: shapes outside the contract (logits [N, V >= 1]; targets, ce, lse [N])",
                    ST_KERNEL_CROSS_ENTROPY_FWD);
  if ((e = st__check_targets(f, ST_KERNEL_CROSS_ENTROPY_FWD, t, x->dims[1]))) return e;
  st_kernel_cross_entropy_fwd(st_kernels_isa(), x->data, t->data, out[0]->data, out[1]->data, x->dims[0],
                              x->dims[1]);
  return NULL;
}

/* cross_entropy bwd: (logits, targets, lse, dce) -> dlogits like logits. */
static xf_error* st__cross_entropy_bwd(xf_call_frame* f) {
  ST__HANDLER_PROLOGUE(f);
  static const int kTypes[] = {XF_F32, XF_S32, XF_F32, XF_F32, XF_F32};
  xf_buffer *in[4], *out[1];
  xf_error* e = st__operands_typed(f, ST_KERNEL_CROSS_ENTROPY_BWD, 4, 1, kTypes, in, out);
  if (e) return e;
  xf_buffer *x = in[0], *t = in[1];
  if (x->rank != 2 || t->rank != 1 || t->dims[0] != x->dims[0] || !st__same_shape(t, in[2]) ||
      !st__same_shape(t, in[3]) || !st__same_shape(x, out[0]) || x->dims[1] < 1)
    return st__fail(f, "%s: shapes outside the contract (logits, dlogits [N, V >= 1]; targets, lse, dce [N])",
                    ST_KERNEL_CROSS_ENTROPY_BWD);
  if ((e = st__check_targets(f, ST_KERNEL_CROSS_ENTROPY_BWD, t, x->dims[1]))) return e;
  st_kernel_cross_entropy_bwd(st_kernels_isa(), x->data, t->data, in[2]->data, in[3]->data, out[0]->data,
                              x->dims[0], x->dims[1]);
  return NULL;
}

/* attention fwd: (q [B, T, H, Dh], k [B, T, KV, Dh], v like k) -> (o like q,
 * lse [B, H, T]); KV divides H. */
static xf_error* st__attention_shapes(xf_call_frame* f, const char* target, const xf_buffer* q, const xf_buffer* k,
                                      const xf_buffer* v) {
  if (q->rank != 4 || k->rank != 4 || !st__same_shape(k, v) || k->dims[0] != q->dims[0] ||
      k->dims[1] != q->dims[1] || k->dims[3] != q->dims[3] || k->dims[2] < 1 || q->dims[2] % k->dims[2] ||
      st__handlers_count(q) == 0)
    return st__fail(f, "%s: shapes outside the contract (q [B, T, H, Dh], k and v [B, T, KV, Dh] with KV dividing "
                    "H, every size at least 1)", target);
  return NULL;
}

static xf_error* st__attention_fwd(xf_call_frame* f) {
  ST__HANDLER_PROLOGUE(f);
  xf_buffer *in[3], *out[2];
  xf_error* e = st__operands(f, ST_KERNEL_ATTENTION_FWD, 3, 2, in, out);
  if (e) return e;
  xf_buffer *q = in[0], *k = in[1], *v = in[2], *o = out[0], *lse = out[1];
  if ((e = st__attention_shapes(f, ST_KERNEL_ATTENTION_FWD, q, k, v))) return e;
  if (!st__same_shape(q, o) || lse->rank != 3 || lse->dims[0] != q->dims[0] || lse->dims[1] != q->dims[2] ||
      lse->dims[2] != q->dims[1])
    return st__fail(f, "%s: results outside the contract (o like q, lse [B, H, T])", ST_KERNEL_ATTENTION_FWD);
  if (st_kernel_attention_fwd(st_kernels_isa(), st__kernels_threads(), q->data, k->data, v->data, o->data, lse->data,
                              q->dims[0], q->dims[1], q->dims[2], k->dims[2], q->dims[3]))
    return st__fail(f, "%s: sizes outside the contract", ST_KERNEL_ATTENTION_FWD);
  return NULL;
}

/* attention bwd: (q, k, v, o, lse, do) -> (dq like q, dk like k, dv like v). */
static xf_error* st__attention_bwd(xf_call_frame* f) {
  ST__HANDLER_PROLOGUE(f);
  xf_buffer *in[6], *out[3];
  xf_error* e = st__operands(f, ST_KERNEL_ATTENTION_BWD, 6, 3, in, out);
  if (e) return e;
  xf_buffer *q = in[0], *k = in[1], *v = in[2], *o = in[3], *lse = in[4], *dout = in[5];
  if ((e = st__attention_shapes(f, ST_KERNEL_ATTENTION_BWD, q, k, v))) return e;
  if (!st__same_shape(q, o) || !st__same_shape(q, dout) || lse->rank != 3 || lse->dims[0] != q->dims[0] ||
      lse->dims[1] != q->dims[2] || lse->dims[2] != q->dims[1] || !st__same_shape(q, out[0]) ||
      !st__same_shape(k, out[1]) || !st__same_shape(k, out[2]))
    return st__fail(f, "%s: shapes outside the contract (o, do, dq like q; lse [B, H, T]; dk, dv like k)",
                    ST_KERNEL_ATTENTION_BWD);
  if (st_kernel_attention_bwd(st_kernels_isa(), st__kernels_threads(), q->data, k->data, v->data, o->data, lse->data,
                              dout->data, out[0]->data, out[1]->data, out[2]->data, q->dims[0], q->dims[1],
                              q->dims[2], k->dims[2], q->dims[3]))
    return st__fail(f, "%s: sizes outside the contract", ST_KERNEL_ATTENTION_BWD);
  return NULL;
}

/* Every handler as the plugin calls it: the call counted and timed
 * (stats.c) when it runs a kernel, not when XLA probes or prepares it. */
static int st__is_probe(const xf_call_frame* f) {
  for (const xf_ext* e = f->extension_start; e; e = e->next)
    if (e->type == XF_EXT_METADATA) return 1;
  return 0;
}

#define ST__TIMED(fn, target)                                                  \
  static xf_error* fn##_timed(xf_call_frame* f) {                              \
    if (st__is_probe(f) || f->stage != XF_STAGE_EXECUTE) return fn(f);        \
    static _Atomic int index = -2; /* -2: not looked up yet */                 \
    int i = atomic_load_explicit(&index, memory_order_relaxed);                \
    if (i == -2) atomic_store(&index, i = st__kernel_handler_index(target));   \
    double t0 = st_now();                                                      \
    xf_error* e = fn(f);                                                       \
    st__kernel_stats_record(i, t0, st_now());                                  \
    return e;                                                                  \
  }

ST__TIMED(st__rmsnorm_fwd, ST_KERNEL_RMSNORM_FWD)
ST__TIMED(st__rmsnorm_bwd, ST_KERNEL_RMSNORM_BWD)
ST__TIMED(st__swiglu_fwd, ST_KERNEL_SWIGLU_FWD)
ST__TIMED(st__swiglu_bwd, ST_KERNEL_SWIGLU_BWD)
ST__TIMED(st__cross_entropy_fwd, ST_KERNEL_CROSS_ENTROPY_FWD)
ST__TIMED(st__cross_entropy_bwd, ST_KERNEL_CROSS_ENTROPY_BWD)
ST__TIMED(st__attention_fwd, ST_KERNEL_ATTENTION_FWD)
ST__TIMED(st__attention_bwd, ST_KERNEL_ATTENTION_BWD)

/* The handlers compiled into strata. The version is the contract version
 * the code implements; st_kernels_check_contract holds it equal to the
 * embedded contract's, and a bundle naming another is refused (exit 4). */
const st_kernel_handler st__kernel_handlers[] = {
    {"rmsnorm", 1, "fwd", ST_KERNEL_RMSNORM_FWD, (void*)st__rmsnorm_fwd_timed},
    {"rmsnorm", 1, "bwd", ST_KERNEL_RMSNORM_BWD, (void*)st__rmsnorm_bwd_timed},
    {"swiglu", 1, "fwd", ST_KERNEL_SWIGLU_FWD, (void*)st__swiglu_fwd_timed},
    {"swiglu", 1, "bwd", ST_KERNEL_SWIGLU_BWD, (void*)st__swiglu_bwd_timed},
    {"cross_entropy", 1, "fwd", ST_KERNEL_CROSS_ENTROPY_FWD, (void*)st__cross_entropy_fwd_timed},
    {"cross_entropy", 1, "bwd", ST_KERNEL_CROSS_ENTROPY_BWD, (void*)st__cross_entropy_bwd_timed},
    {"attention", 1, "fwd", ST_KERNEL_ATTENTION_FWD, (void*)st__attention_fwd_timed},
    {"attention", 1, "bwd", ST_KERNEL_ATTENTION_BWD, (void*)st__attention_bwd_timed},
};
const int st__kernel_handler_count = (int)(sizeof(st__kernel_handlers) / sizeof(st__kernel_handlers[0]));

/* The same, as the runtime's registration list (static: the runtime only
 * borrows it during creation, the plugin keeps the function pointers). */
static const st_ffi_target kTargets[] = {
    {ST_KERNEL_RMSNORM_FWD, (void*)st__rmsnorm_fwd_timed},
    {ST_KERNEL_RMSNORM_BWD, (void*)st__rmsnorm_bwd_timed},
    {ST_KERNEL_SWIGLU_FWD, (void*)st__swiglu_fwd_timed},
    {ST_KERNEL_SWIGLU_BWD, (void*)st__swiglu_bwd_timed},
    {ST_KERNEL_CROSS_ENTROPY_FWD, (void*)st__cross_entropy_fwd_timed},
    {ST_KERNEL_CROSS_ENTROPY_BWD, (void*)st__cross_entropy_bwd_timed},
    {ST_KERNEL_ATTENTION_FWD, (void*)st__attention_fwd_timed},
    {ST_KERNEL_ATTENTION_BWD, (void*)st__attention_bwd_timed},
};

const st_ffi_target* st_kernels_ffi_target_table(int* count) {
  if (count) *count = (int)(sizeof(kTargets) / sizeof(kTargets[0]));
  return kTargets;
}
