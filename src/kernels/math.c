/*
 * math.c — the C kernels' arithmetic: RMSNorm and SwiGLU, forward and
 * backward, in f32 with f32 accumulation (docs/kernels.md, the contract).
 *
 * Two paths per kernel: AVX-512 (16 lanes, masked tails, so no padding is
 * needed) and a portable scalar one. The path is chosen once, at run time,
 * from the CPU (__builtin_cpu_supports), so one binary runs everywhere;
 * STRATA_KERNELS_ISA=portable forces the portable path (tests compare the
 * two). The exp of the AVX-512 sigmoid is a polynomial (below) within a few
 * ulp of expf, well inside the contract's tolerance.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/avx512.h"
#include "kernels/internal.h"
#include "strata/kernels.h"


static const float kEps = 1e-6f; /* the contract's (rmsnorm v1), model.NORM_EPS */

/*--- ISA choice ---------------------------------------------------------*/

static _Atomic int g_isa = -1; /* -1 unknown; cached: the CPU does not change */

st_kernel_isa st_kernels_isa(void) {
  int v = atomic_load(&g_isa);
  if (v >= 0) return (st_kernel_isa)v;
  v = ST_KERNEL_ISA_PORTABLE;
#ifdef ST_HAVE_AVX512_PATH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) v = ST_KERNEL_ISA_AVX512;
#endif
  const char* e = getenv("STRATA_KERNELS_ISA");
  if (e && !strcmp(e, "portable")) v = ST_KERNEL_ISA_PORTABLE;
  atomic_store(&g_isa, v);
  return (st_kernel_isa)v;
}

const char* st_kernels_isa_name(st_kernel_isa isa) { return isa == ST_KERNEL_ISA_AVX512 ? "avx512" : "portable"; }

/*--- portable -------------------------------------------------------------*/

static void rms_fwd_portable(const float* x, const float* g, float* y, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r, x += d, y += d) {
    float ss = 0.f;
    for (int64_t i = 0; i < d; ++i) ss += x[i] * x[i];
    float inv = 1.f / sqrtf(ss / (float)d + kEps);
    for (int64_t i = 0; i < d; ++i) y[i] = x[i] * inv * g[i];
  }
}

/* dx = inv * (dy*g) - x * inv^3 * mean((dy*g) * x); dg = sum over rows of dy * x * inv. */
static void rms_bwd_portable(const float* x, const float* g, const float* dy, float* dx, float* dg, int64_t rows,
                             int64_t d) {
  memset(dg, 0, (size_t)d * sizeof(float));
  for (int64_t r = 0; r < rows; ++r, x += d, dy += d, dx += d) {
    float ss = 0.f, dot = 0.f;
    for (int64_t i = 0; i < d; ++i) {
      ss += x[i] * x[i];
      dot += dy[i] * g[i] * x[i];
    }
    float inv = 1.f / sqrtf(ss / (float)d + kEps);
    float c = inv * inv * inv * dot / (float)d;
    for (int64_t i = 0; i < d; ++i) {
      dx[i] = inv * dy[i] * g[i] - x[i] * c;
      dg[i] += dy[i] * x[i] * inv;
    }
  }
}

static inline float sigmoidf(float v) { return 1.f / (1.f + expf(-v)); }

static void swiglu_fwd_portable(const float* a, const float* b, float* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] = a[i] * sigmoidf(a[i]) * b[i];
}

/* d silu(a)/da = s (1 + a (1 - s)). */
static void swiglu_bwd_portable(const float* a, const float* b, const float* dh, float* da, float* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float s = sigmoidf(a[i]);
    da[i] = dh[i] * b[i] * s * (1.f + a[i] * (1.f - s));
    db[i] = dh[i] * a[i] * s;
  }
}

/*--- AVX-512 ----------------------------------------------------------------*/

#ifdef ST_HAVE_AVX512_PATH

static AVX512 void rms_fwd_avx512(const float* x, const float* g, float* y, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r, x += d, y += d) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
      __mmask16 m = st__lanes(d - i);
      __m512 v = _mm512_maskz_loadu_ps(m, x + i);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    float inv = 1.f / sqrtf(_mm512_reduce_add_ps(acc) / (float)d + kEps);
    __m512 vinv = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < d; i += 16) {
      __mmask16 m = st__lanes(d - i);
      __m512 v = _mm512_maskz_loadu_ps(m, x + i), w = _mm512_maskz_loadu_ps(m, g + i);
      _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_mul_ps(v, vinv), w));
    }
  }
}

static AVX512 void rms_bwd_avx512(const float* x, const float* g, const float* dy, float* dx, float* dg,
                                  int64_t rows, int64_t d) {
  memset(dg, 0, (size_t)d * sizeof(float));
  for (int64_t r = 0; r < rows; ++r, x += d, dy += d, dx += d) {
    __m512 ss = _mm512_setzero_ps(), dot = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
      __mmask16 m = st__lanes(d - i);
      __m512 v = _mm512_maskz_loadu_ps(m, x + i), w = _mm512_maskz_loadu_ps(m, g + i);
      __m512 e = _mm512_maskz_loadu_ps(m, dy + i);
      ss = _mm512_fmadd_ps(v, v, ss);
      dot = _mm512_fmadd_ps(_mm512_mul_ps(e, w), v, dot);
    }
    float inv = 1.f / sqrtf(_mm512_reduce_add_ps(ss) / (float)d + kEps);
    float c = inv * inv * inv * _mm512_reduce_add_ps(dot) / (float)d;
    __m512 vinv = _mm512_set1_ps(inv), vc = _mm512_set1_ps(c);
    for (int64_t i = 0; i < d; i += 16) {
      __mmask16 m = st__lanes(d - i);
      __m512 v = _mm512_maskz_loadu_ps(m, x + i), w = _mm512_maskz_loadu_ps(m, g + i);
      __m512 e = _mm512_maskz_loadu_ps(m, dy + i);
      __m512 ev = _mm512_mul_ps(e, vinv);
      _mm512_mask_storeu_ps(dx + i, m, _mm512_fnmadd_ps(v, vc, _mm512_mul_ps(ev, w)));
      __m512 acc = _mm512_maskz_loadu_ps(m, dg + i);
      _mm512_mask_storeu_ps(dg + i, m, _mm512_fmadd_ps(ev, v, acc));
    }
  }
}

static inline AVX512 __m512 sigmoid_avx512(__m512 a) {
  __m512 one = _mm512_set1_ps(1.f);
  return _mm512_div_ps(one, _mm512_add_ps(one, st__exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), a))));
}

static AVX512 void swiglu_fwd_avx512(const float* a, const float* b, float* h, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = st__lanes(n - i);
    __m512 va = _mm512_maskz_loadu_ps(m, a + i), vb = _mm512_maskz_loadu_ps(m, b + i);
    _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(_mm512_mul_ps(va, sigmoid_avx512(va)), vb));
  }
}

static AVX512 void swiglu_bwd_avx512(const float* a, const float* b, const float* dh, float* da, float* db,
                                     int64_t n) {
  __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = st__lanes(n - i);
    __m512 va = _mm512_maskz_loadu_ps(m, a + i), vb = _mm512_maskz_loadu_ps(m, b + i);
    __m512 e = _mm512_maskz_loadu_ps(m, dh + i);
    __m512 s = sigmoid_avx512(va);
    __m512 ds = _mm512_mul_ps(s, _mm512_fmadd_ps(va, _mm512_sub_ps(one, s), one));
    _mm512_mask_storeu_ps(da + i, m, _mm512_mul_ps(_mm512_mul_ps(e, vb), ds));
    _mm512_mask_storeu_ps(db + i, m, _mm512_mul_ps(_mm512_mul_ps(e, va), s));
  }
}
#endif

/*--- dispatch ---------------------------------------------------------------*/

#ifdef ST_HAVE_AVX512_PATH
#define ST__PICK(isa, name, ...)                                             \
  do {                                                                       \
    if ((isa) == ST_KERNEL_ISA_AVX512) name##_avx512(__VA_ARGS__);           \
    else name##_portable(__VA_ARGS__);                                       \
  } while (0)
#else
#define ST__PICK(isa, name, ...) name##_portable(__VA_ARGS__)
#endif

void st_kernel_rmsnorm_fwd(st_kernel_isa isa, const float* x, const float* gain, float* y, int64_t rows, int64_t d) {
  ST__PICK(isa, rms_fwd, x, gain, y, rows, d);
}

void st_kernel_rmsnorm_bwd(st_kernel_isa isa, const float* x, const float* gain, const float* dy, float* dx,
                           float* dgain, int64_t rows, int64_t d) {
  ST__PICK(isa, rms_bwd, x, gain, dy, dx, dgain, rows, d);
}

void st_kernel_swiglu_fwd(st_kernel_isa isa, const float* gate, const float* up, float* h, int64_t n) {
  ST__PICK(isa, swiglu_fwd, gate, up, h, n);
}

void st_kernel_swiglu_bwd(st_kernel_isa isa, const float* gate, const float* up, const float* dh, float* dgate,
                          float* dup, int64_t n) {
  ST__PICK(isa, swiglu_bwd, gate, up, dh, dgate, dup, n);
}

/*--- attention's row exp (attention.c) ---------------------------------------*/

#ifdef ST_HAVE_AVX512_PATH
AVX512 float st__exp_shift_sum_avx512(float* s, int64_t n, float shift) {
  __m512 sh = _mm512_set1_ps(shift), acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = st__lanes(n - i);
    __m512 e = st__exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), sh));
    _mm512_mask_storeu_ps(s + i, m, e);
    acc = _mm512_mask_add_ps(acc, m, acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}
#endif

/*--- FFI handlers (handlers.c registers them) ----------------------------*/

/* rmsnorm fwd: (x [..., D], gain [D]) -> y like x. */
xf_error* st__ffi_strata_rmsnorm_fwd_v1(xf_call_frame* f) {
  ST__FFI_PROLOGUE(f);
  xf_buffer *in[2], *out[1];
  xf_error* e = st__ffi_operands(f, ST_KERNEL_RMSNORM_FWD, 2, 1, in, out);
  if (e) return e;
  xf_buffer *x = in[0], *g = in[1];
  if (x->rank < 1 || g->rank != 1 || g->dims[0] != x->dims[x->rank - 1] || !st__ffi_same_shape(x, out[0]))
    return st__ffi_fail(f, "%s: shapes outside the contract (x [..., D], gain [D], y like x)", ST_KERNEL_RMSNORM_FWD);
  int64_t d = g->dims[0];
  st_kernel_rmsnorm_fwd(st_kernels_isa(), x->data, g->data, out[0]->data, d ? st__ffi_count(x) / d : 0, d);
  return NULL;
}

/* rmsnorm bwd: (x, gain, dy) -> (dx like x, dgain [D]). */
xf_error* st__ffi_strata_rmsnorm_bwd_v1(xf_call_frame* f) {
  ST__FFI_PROLOGUE(f);
  xf_buffer *in[3], *out[2];
  xf_error* e = st__ffi_operands(f, ST_KERNEL_RMSNORM_BWD, 3, 2, in, out);
  if (e) return e;
  xf_buffer *x = in[0], *g = in[1], *dy = in[2];
  if (x->rank < 1 || g->rank != 1 || g->dims[0] != x->dims[x->rank - 1] || !st__ffi_same_shape(x, dy) ||
      !st__ffi_same_shape(x, out[0]) || !st__ffi_same_shape(g, out[1]))
    return st__ffi_fail(f, "%s: shapes outside the contract (x, dy, dx [..., D]; gain, dgain [D])", ST_KERNEL_RMSNORM_BWD);
  int64_t d = g->dims[0];
  st_kernel_rmsnorm_bwd(st_kernels_isa(), x->data, g->data, dy->data, out[0]->data, out[1]->data,
                        d ? st__ffi_count(x) / d : 0, d);
  return NULL;
}

xf_error* st__ffi_strata_swiglu_fwd_v1(xf_call_frame* f) {
  ST__FFI_PROLOGUE(f);
  xf_buffer *in[2], *out[1];
  xf_error* e = st__ffi_operands(f, ST_KERNEL_SWIGLU_FWD, 2, 1, in, out);
  if (e) return e;
  if (!st__ffi_same_shape(in[0], in[1]) || !st__ffi_same_shape(in[0], out[0]))
    return st__ffi_fail(f, "%s: gate, up and h must have one shape", ST_KERNEL_SWIGLU_FWD);
  st_kernel_swiglu_fwd(st_kernels_isa(), in[0]->data, in[1]->data, out[0]->data, st__ffi_count(in[0]));
  return NULL;
}

xf_error* st__ffi_strata_swiglu_bwd_v1(xf_call_frame* f) {
  ST__FFI_PROLOGUE(f);
  xf_buffer *in[3], *out[2];
  xf_error* e = st__ffi_operands(f, ST_KERNEL_SWIGLU_BWD, 3, 2, in, out);
  if (e) return e;
  for (int i = 1; i < 3; ++i)
    if (!st__ffi_same_shape(in[0], in[i])) return st__ffi_fail(f, "%s: gate, up and dh must have one shape", ST_KERNEL_SWIGLU_BWD);
  if (!st__ffi_same_shape(in[0], out[0]) || !st__ffi_same_shape(in[0], out[1]))
    return st__ffi_fail(f, "%s: dgate and dup must have gate's shape", ST_KERNEL_SWIGLU_BWD);
  st_kernel_swiglu_bwd(st_kernels_isa(), in[0]->data, in[1]->data, in[2]->data, out[0]->data, out[1]->data,
                       st__ffi_count(in[0]));
  return NULL;
}
