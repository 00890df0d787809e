/* avx512.h — private to src/kernels: what the AVX-512 paths of math.c,
 * xent.c and attention.c share. Nothing here is compiled with -mavx512f
 * globally: each function carries the target attribute, and callers reach
 * it only when st_kernels_isa() says the CPU has AVX-512F. */
#ifndef STRATA_KERNELS_AVX512_H
#define STRATA_KERNELS_AVX512_H

#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ST_HAVE_AVX512_PATH 1
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f")))

/* The lanes of a 16-float vector that hold the |left| remaining elements
 * of a row (none for left <= 0): masked loads and stores of a row's tail
 * touch nothing past it. */
static inline AVX512 __mmask16 st__lanes(int64_t left) {
  return left <= 0 ? (__mmask16)0 : left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* exp(v) for v in [-87, 88] (clamped there): v = n ln2 + t, |t| <= ln2/2,
 * e^t by a degree-6 Taylor polynomial (relative error below 2e-7), times
 * 2^n by scalef. */
static inline AVX512 __m512 st__exp_avx512(__m512 v) {
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 t = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), v);
  t = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), t);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}
#endif

#endif
