/*
 * xent.c — the softmax cross-entropy over the vocabulary, forward and
 * backward (contract row cross_entropy v1; docs/kernels.md).
 *
 * Per row of V logits: the forward walks V in chunks of ST__CE_CHUNK with an
 * online max/sum (each chunk's max, then its exp-sum against the running
 * max, the running sum rescaled when the max moves), so the logits are read
 * from memory once (the chunk's second read hits L1) and no probabilities
 * are stored; it keeps lse per row for the backward. The backward writes
 * dlogits = dce * (exp(logits - lse) - onehot(target)) in one pass: the
 * probabilities are never materialised beside the gradient.
 *
 * Logits of -1e30 (a padded vocabulary's padding ids, model.mask_padding)
 * weigh exactly 0 in both paths: the vector exp returns 0 below -87
 * instead of clamping. Rows are split over threads (pool.c) when a call has
 * enough work to pay for them.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "kernels/avx512.h"
#include "kernels/internal.h"
#include "kernels/pool.h"
#include "strata/kernels.h"


#define ST__CE_CHUNK 2048
/* Rows per thread at least this many logits: some 0.25 ms of work, well
 * above a thread's start. */
#define ST__CE_GRAIN_ELEMS (1 << 18)

int64_t st_kernel_cross_entropy_bad_target(const int32_t* targets, int64_t rows, int64_t v) {
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] < 0 || targets[r] >= v) return r;
  return -1;
}

/*--- portable ---------------------------------------------------------------*/

static void ce_fwd_portable(const float* x, const int32_t* t, float* ce, float* lse, int64_t r0, int64_t r1,
                            int64_t v) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * v;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t c = 0; c < v; c += ST__CE_CHUNK) {
      int64_t e = c + ST__CE_CHUNK < v ? c + ST__CE_CHUNK : v;
      float cm = -FLT_MAX;
      for (int64_t i = c; i < e; ++i) cm = xr[i] > cm ? xr[i] : cm;
      float mn = cm > m ? cm : m;
      /* four partial sums: shorter rounding chains over a chunk */
      float p[4] = {0.f, 0.f, 0.f, 0.f};
      for (int64_t i = c; i < e; ++i) p[i & 3] += expf(xr[i] - mn);
      s = s * expf(m - mn) + ((p[0] + p[1]) + (p[2] + p[3]));
      m = mn;
    }
    float l = m + logf(s);
    lse[r] = l;
    ce[r] = l - xr[t[r]];
  }
}

static void ce_bwd_portable(const float* x, const int32_t* t, const float* lse, const float* dce, float* dl,
                            int64_t r0, int64_t r1, int64_t v) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * v;
    float* dr = dl + r * v;
    float g = dce[r], l = lse[r];
    for (int64_t i = 0; i < v; ++i) dr[i] = g * expf(xr[i] - l);
    dr[t[r]] -= g;
  }
}

/*--- AVX-512 ------------------------------------------------------------------*/

#ifdef ST_HAVE_AVX512_PATH

/* exp(v), and exactly 0 below -87 (where expf is 0 or subnormal), so the
 * padding ids' -1e30 weigh nothing; v <= 0 here (a max was subtracted). */
static inline AVX512 __m512 ce_exp(__m512 v) {
  __mmask16 live = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.f), _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(live, st__exp_avx512(v));
}

static AVX512 void ce_fwd_avx512(const float* x, const int32_t* t, float* ce, float* lse, int64_t r0, int64_t r1,
                                 int64_t v) {
  const __m512 lowest = _mm512_set1_ps(-FLT_MAX);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * v;
    float m = -FLT_MAX, s = 0.f;
    for (int64_t c = 0; c < v; c += ST__CE_CHUNK) {
      int64_t e = c + ST__CE_CHUNK < v ? c + ST__CE_CHUNK : v;
      __m512 vm = lowest;
      for (int64_t i = c; i < e; i += 16)
        vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(lowest, st__lanes(e - i), xr + i));
      float cm = _mm512_reduce_max_ps(vm);
      float mn = cm > m ? cm : m;
      __m512 vmn = _mm512_set1_ps(mn), acc = _mm512_setzero_ps();
      for (int64_t i = c; i < e; i += 16) {
        __mmask16 k = st__lanes(e - i);
        __m512 ex = ce_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + i), vmn));
        acc = _mm512_mask_add_ps(acc, k, acc, ex);
      }
      s = s * expf(m - mn) + _mm512_reduce_add_ps(acc);
      m = mn;
    }
    float l = m + logf(s);
    lse[r] = l;
    ce[r] = l - xr[t[r]];
  }
}

static AVX512 void ce_bwd_avx512(const float* x, const int32_t* t, const float* lse, const float* dce, float* dl,
                                 int64_t r0, int64_t r1, int64_t v) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * v;
    float* dr = dl + r * v;
    __m512 g = _mm512_set1_ps(dce[r]), l = _mm512_set1_ps(lse[r]);
    for (int64_t i = 0; i < v; i += 16) {
      __mmask16 k = st__lanes(v - i);
      __m512 ex = ce_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + i), l));
      _mm512_mask_storeu_ps(dr + i, k, _mm512_mul_ps(g, ex));
    }
    dr[t[r]] -= dce[r];
  }
}
#endif

/*--- dispatch -----------------------------------------------------------------*/

typedef struct ce_job {
  st_kernel_isa isa;
  const float* x;
  const int32_t* t;
  const float *lse_in, *dce;
  float *ce, *lse, *dl;
  int64_t v;
} ce_job;

static void ce_fwd_range(void* p, int64_t r0, int64_t r1) {
  const ce_job* j = p;
#ifdef ST_HAVE_AVX512_PATH
  if (j->isa == ST_KERNEL_ISA_AVX512) {
    ce_fwd_avx512(j->x, j->t, j->ce, j->lse, r0, r1, j->v);
    return;
  }
#endif
  ce_fwd_portable(j->x, j->t, j->ce, j->lse, r0, r1, j->v);
}

static void ce_bwd_range(void* p, int64_t r0, int64_t r1) {
  const ce_job* j = p;
#ifdef ST_HAVE_AVX512_PATH
  if (j->isa == ST_KERNEL_ISA_AVX512) {
    ce_bwd_avx512(j->x, j->t, j->lse_in, j->dce, j->dl, r0, r1, j->v);
    return;
  }
#endif
  ce_bwd_portable(j->x, j->t, j->lse_in, j->dce, j->dl, r0, r1, j->v);
}

static int64_t ce_grain(int64_t v) { return v >= ST__CE_GRAIN_ELEMS ? 1 : ST__CE_GRAIN_ELEMS / (v > 0 ? v : 1); }

void st_kernel_cross_entropy_fwd(st_kernel_isa isa, const float* logits, const int32_t* targets, float* ce,
                                 float* lse, int64_t rows, int64_t v) {
  if (v < 1) return;
  ce_job j = {.isa = isa, .x = logits, .t = targets, .ce = ce, .lse = lse, .v = v};
  st__parallel_for(rows, ce_grain(v), ce_fwd_range, &j);
}

void st_kernel_cross_entropy_bwd(st_kernel_isa isa, const float* logits, const int32_t* targets, const float* lse,
                                 const float* dce, float* dlogits, int64_t rows, int64_t v) {
  if (v < 1) return;
  ce_job j = {.isa = isa, .x = logits, .t = targets, .lse_in = lse, .dce = dce, .dl = dlogits, .v = v};
  st__parallel_for(rows, ce_grain(v), ce_bwd_range, &j);
}

/*--- FFI handlers (handlers.c registers them) ----------------------------*/

/* cross_entropy fwd: (logits [N, V] f32, targets [N] s32) -> (ce [N], lse [N]). */
static xf_error* st__ce_check_targets(xf_call_frame* f, const char* target, const xf_buffer* t, int64_t v) {
  int64_t bad = st_kernel_cross_entropy_bad_target(t->data, t->dims[0], v);
  if (bad < 0) return NULL;
  return st__ffi_fail(f, "%s: target %d (row %lld) is outside the vocabulary [0, %lld): the data has a token id the "
                  "model's vocabulary does not (model.vocab_size)",
                  target, (int)((const int32_t*)t->data)[bad], (long long)bad, (long long)v);
}

xf_error* st__ffi_strata_cross_entropy_fwd_v1(xf_call_frame* f) {
  ST__FFI_PROLOGUE(f);
  static const int kTypes[] = {XF_F32, XF_S32, XF_F32, XF_F32};
  xf_buffer *in[2], *out[2];
  xf_error* e = st__ffi_operands_typed(f, ST_KERNEL_CROSS_ENTROPY_FWD, 2, 2, kTypes, in, out);
  if (e) return e;
  xf_buffer *x = in[0], *t = in[1];
  if (x->rank != 2 || t->rank != 1 || t->dims[0] != x->dims[0] || !st__ffi_same_shape(t, out[0]) ||
      !st__ffi_same_shape(t, out[1]) || x->dims[1] < 1)
    return st__ffi_fail(f, "%s: shapes outside the contract (logits [N, V >= 1]; targets, ce, lse [N])",
                    ST_KERNEL_CROSS_ENTROPY_FWD);
  if ((e = st__ce_check_targets(f, ST_KERNEL_CROSS_ENTROPY_FWD, t, x->dims[1]))) return e;
  st_kernel_cross_entropy_fwd(st_kernels_isa(), x->data, t->data, out[0]->data, out[1]->data, x->dims[0],
                              x->dims[1]);
  return NULL;
}

/* cross_entropy bwd: (logits, targets, lse, dce) -> dlogits like logits. */
xf_error* st__ffi_strata_cross_entropy_bwd_v1(xf_call_frame* f) {
  ST__FFI_PROLOGUE(f);
  static const int kTypes[] = {XF_F32, XF_S32, XF_F32, XF_F32, XF_F32};
  xf_buffer *in[4], *out[1];
  xf_error* e = st__ffi_operands_typed(f, ST_KERNEL_CROSS_ENTROPY_BWD, 4, 1, kTypes, in, out);
  if (e) return e;
  xf_buffer *x = in[0], *t = in[1];
  if (x->rank != 2 || t->rank != 1 || t->dims[0] != x->dims[0] || !st__ffi_same_shape(t, in[2]) ||
      !st__ffi_same_shape(t, in[3]) || !st__ffi_same_shape(x, out[0]) || x->dims[1] < 1)
    return st__ffi_fail(f, "%s: shapes outside the contract (logits, dlogits [N, V >= 1]; targets, lse, dce [N])",
                    ST_KERNEL_CROSS_ENTROPY_BWD);
  if ((e = st__ce_check_targets(f, ST_KERNEL_CROSS_ENTROPY_BWD, t, x->dims[1]))) return e;
  st_kernel_cross_entropy_bwd(st_kernels_isa(), x->data, t->data, in[2]->data, in[3]->data, out[0]->data,
                              x->dims[0], x->dims[1]);
  return NULL;
}
