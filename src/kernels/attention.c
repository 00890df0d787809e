/*
 * attention.c — causal attention after RoPE (contract row "attention" v1),
 * forward and backward, flash-style: tiles of 64 queries x 64 keys, an
 * online softmax (running max and sum per query) in the forward, and in the
 * backward the probabilities recomputed per tile from the forward's
 * log-sum-exp, so no [T, T] matrix is ever held (docs/kernels.md, "The
 * attention kernel").
 *
 * Layouts: q, o, do [B, T, H, Dh]; k, v [B, T, KV, Dh]; lse [B, H, T]. Query
 * head h reads key/value head h / (H / KV) (grouped-query attention). The
 * scale 1/sqrt(Dh) and the causal mask are fixed by v1.
 *
 * Vector work is one small matrix product (gemm: 4 rows x 64 columns per
 * pass in 16 AVX-512 registers) plus row-wise exp, max and scaling: the
 * scores of a query tile against a key tile (against the tile transposed to
 * [Dh][64]), p times v, and the backward's five products all have that
 * form. AVX-512 or portable, chosen by the caller's |isa|.
 *
 * The seg form (contract input segment_ids [B, T] s32, targets
 * strata_attention_seg_fwd_v1 / _bwd_v1) adds to the causal mask "same
 * segment id". A query tile and a key tile whose id ranges cannot meet are
 * skipped like tiles above the diagonal; tiles inside one segment run the
 * plain code; only tiles with several segments mask per element. Without
 * segment ids (the v1 targets) nothing here runs: the plain form computes
 * exactly what it did before the operand existed.
 *
 * Threads: the work is split over (b, h, query tile) in the forward and
 * over (b, key/value head) in the backward (a key/value head's dk and dv
 * then have one writer), in contiguous ranges on up to |threads| threads
 * that live for the call only (pool.c: started and joined within it).
 * Scratch (the transposed tiles, one tile of scores, per-query sums) is
 * allocated per thread per call (st_xmalloc): a few hundred KiB at most.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/avx512.h"
#include "kernels/internal.h"
#include "kernels/pool.h"
#include "strata/base.h"
#include "strata/kernels.h"


#define TQ 64 /* query tile */
#define TK 64 /* key tile; the backward's walk assumes TQ == TK */

/*--- primitives ---------------------------------------------------------------*/

/* The one product: out[r][j] = (acc ? out[r][j] : 0) + alpha * sum_{i<m}
 * a[r*ars + i*ais] * M[i*ldm + j] for r < R, j < n; out rows ldo apart. The
 * strides let one routine take a row block times a matrix (ars = row
 * stride, ais = 1) and a transposed block times a matrix (ars = 1, ais =
 * row stride), which is all the attention needs. */
typedef void (*st__gemm_fn)(float* out, int64_t ldo, int acc, const float* a, int64_t ars, int64_t ais, int64_t R,
                            int64_t m, const float* M, int64_t ldm, int64_t n, float alpha);

typedef struct st__att_ops {
  st__gemm_fn gemm;
  float (*exprow)(float* s, int64_t n, float shift); /* s = exp(s - shift), returns the sum */
  float (*rowmax)(const float* s, int64_t n);
  void (*scal)(float* x, int64_t n, float alpha);                      /* x *= alpha */
  void (*dsrow)(float* ds, const float* p, int64_t n, float delta);    /* ds = p (ds - delta) */
} st__att_ops;

static void gemm_portable(float* out, int64_t ldo, int acc, const float* a, int64_t ars, int64_t ais, int64_t R,
                          int64_t m, const float* M, int64_t ldm, int64_t n, float alpha) {
  float buf[64];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j0 = 0; j0 < n; j0 += 64) {
      int64_t w = n - j0 < 64 ? n - j0 : 64;
      memset(buf, 0, sizeof(buf));
      for (int64_t i = 0; i < m; ++i) {
        float ai = a[r * ars + i * ais];
        const float* row = M + i * ldm + j0;
        for (int64_t j = 0; j < w; ++j) buf[j] += ai * row[j];
      }
      float* o = out + r * ldo + j0;
      for (int64_t j = 0; j < w; ++j) o[j] = (acc ? o[j] : 0.f) + alpha * buf[j];
    }
}

static float exprow_portable(float* s, int64_t n, float shift) {
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = expf(s[j] - shift);
    sum += s[j];
  }
  return sum;
}

static float rowmax_portable(const float* s, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
  return m;
}

static void scal_portable(float* x, int64_t n, float alpha) {
  for (int64_t j = 0; j < n; ++j) x[j] *= alpha;
}

static void dsrow_portable(float* ds, const float* p, int64_t n, float delta) {
  for (int64_t j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - delta);
}

#ifdef ST_HAVE_AVX512_PATH

/* A 4 x 64 block of out per pass in 16 registers: per i, four loads of M's
 * row and four broadcasts of a feed 16 FMAs. Masked loads of a partial
 * block read nothing past the row (a zero mask suppresses the access); a
 * block of fewer than 4 rows repeats its last row and drops the copies. */
#define ST__FMA4(c, x, a)                 \
  do {                                    \
    c##0 = _mm512_fmadd_ps(a, x##0, c##0); \
    c##1 = _mm512_fmadd_ps(a, x##1, c##1); \
    c##2 = _mm512_fmadd_ps(a, x##2, c##2); \
    c##3 = _mm512_fmadd_ps(a, x##3, c##3); \
  } while (0)

static inline AVX512 void st__store4(float* o, int acc, __m512 alpha, __mmask16 k0, __mmask16 k1, __mmask16 k2,
                                     __mmask16 k3, __m512 c0, __m512 c1, __m512 c2, __m512 c3) {
  __m512 cs[4] = {c0, c1, c2, c3};
  __mmask16 ks[4] = {k0, k1, k2, k3};
  for (int u = 0; u < 4 && ks[u]; ++u) {
    __m512 prev = acc ? _mm512_maskz_loadu_ps(ks[u], o + 16 * u) : _mm512_setzero_ps();
    _mm512_mask_storeu_ps(o + 16 * u, ks[u], _mm512_fmadd_ps(cs[u], alpha, prev));
  }
}

static AVX512 void gemm_avx512(float* out, int64_t ldo, int acc, const float* a, int64_t ars, int64_t ais,
                               int64_t R, int64_t m, const float* M, int64_t ldm, int64_t n, float alpha) {
  __m512 al = _mm512_set1_ps(alpha);
  for (int64_t r0 = 0; r0 < R; r0 += 4) {
    int64_t rr = R - r0 < 4 ? R - r0 : 4;
    const float* a0 = a + r0 * ars;
    const float* a1 = a + (r0 + (rr > 1 ? 1 : 0)) * ars;
    const float* a2 = a + (r0 + (rr > 2 ? 2 : rr - 1)) * ars;
    const float* a3 = a + (r0 + (rr > 3 ? 3 : rr - 1)) * ars;
    for (int64_t j0 = 0; j0 < n; j0 += 64) {
      __mmask16 k0 = st__lanes(n - j0), k1 = st__lanes(n - j0 - 16), k2 = st__lanes(n - j0 - 32), k3 = st__lanes(n - j0 - 48);
      __m512 z = _mm512_setzero_ps();
      __m512 c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z;
      __m512 c20 = z, c21 = z, c22 = z, c23 = z, c30 = z, c31 = z, c32 = z, c33 = z;
      const float* row = M + j0;
      for (int64_t i = 0; i < m; ++i, row += ldm) {
        __m512 x0 = _mm512_maskz_loadu_ps(k0, row), x1 = _mm512_maskz_loadu_ps(k1, row + 16);
        __m512 x2 = _mm512_maskz_loadu_ps(k2, row + 32), x3 = _mm512_maskz_loadu_ps(k3, row + 48);
        int64_t ia = i * ais;
        __m512 b0 = _mm512_set1_ps(a0[ia]), b1 = _mm512_set1_ps(a1[ia]);
        __m512 b2 = _mm512_set1_ps(a2[ia]), b3 = _mm512_set1_ps(a3[ia]);
        ST__FMA4(c0, x, b0);
        ST__FMA4(c1, x, b1);
        ST__FMA4(c2, x, b2);
        ST__FMA4(c3, x, b3);
      }
      float* o = out + r0 * ldo + j0;
      st__store4(o, acc, al, k0, k1, k2, k3, c00, c01, c02, c03);
      if (rr > 1) st__store4(o + ldo, acc, al, k0, k1, k2, k3, c10, c11, c12, c13);
      if (rr > 2) st__store4(o + 2 * ldo, acc, al, k0, k1, k2, k3, c20, c21, c22, c23);
      if (rr > 3) st__store4(o + 3 * ldo, acc, al, k0, k1, k2, k3, c30, c31, c32, c33);
    }
  }
}

static AVX512 float rowmax_avx512(const float* s, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) m = _mm512_mask_max_ps(m, st__lanes(n - j), m, _mm512_maskz_loadu_ps(st__lanes(n - j), s + j));
  return _mm512_reduce_max_ps(m);
}

static AVX512 void scal_avx512(float* x, int64_t n, float alpha) {
  __m512 al = _mm512_set1_ps(alpha);
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 k = st__lanes(n - j);
    _mm512_mask_storeu_ps(x + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), al));
  }
}

static AVX512 void dsrow_avx512(float* ds, const float* p, int64_t n, float delta) {
  __m512 dl = _mm512_set1_ps(delta);
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 k = st__lanes(n - j);
    __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, ds + j), dl);
    _mm512_mask_storeu_ps(ds + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + j), d));
  }
}
#endif

static st__att_ops st__ops(st_kernel_isa isa) {
#ifdef ST_HAVE_AVX512_PATH
  if (isa == ST_KERNEL_ISA_AVX512)
    return (st__att_ops){gemm_avx512, st__exp_shift_sum_avx512, rowmax_avx512, scal_avx512, dsrow_avx512};
#endif
  (void)isa;
  return (st__att_ops){gemm_portable, exprow_portable, rowmax_portable, scal_portable, dsrow_portable};
}

/*--- threads -------------------------------------------------------------------*/

/* A range of work items on one thread (pool.c): its scratch allocated once
 * for the range, through st_xmalloc like every allocation of strata (out of
 * memory aborts there, with a message; test_base's one-allocation-path
 * check). */
typedef struct st__att_job {
  void (*item)(const void* ctx, void* scratch, int64_t i);
  const void* ctx;
  size_t scratch_bytes;
} st__att_job;

static void st__att_range(void* p, int64_t begin, int64_t end) {
  st__att_job* j = p;
  void* scratch = st_xmalloc(j->scratch_bytes);
  for (int64_t i = begin; i < end; ++i) j->item(j->ctx, scratch, i);
  free(scratch);
}

static int st__att_run(st__att_job* j, int64_t items, int threads) {
  st__parallel_for_threads(items, 1, threads < 1 ? 1 : threads, st__att_range, j);
  return 0;
}

/*--- forward -------------------------------------------------------------------*/

typedef struct st__att {
  st__att_ops ops;
  const int32_t* seg; /* [b, t] segment ids; NULL: the plain (causal only) form */
  const float *q, *k, *v, *o, *lse, *dout;
  float *out_o, *out_lse, *dq, *dk, *dv;
  int64_t b, t, h, kv, dh, nq;
  float scale;
} st__att;

/* Scratch of one forward thread: the key tile transposed [dh][TK], the
 * scores of the query tile [TQ][TK], and per query the running max, sum
 * and unnormalised output [TQ][dh]. */
static size_t st__fwd_scratch(int64_t dh) { return sizeof(float) * (size_t)(dh * TK + TQ * TK + 2 * TQ + TQ * dh); }

/* Copies rows k[0..w) of one head (row stride ld) to kt[d][c] (c < TK). */
static void st__transpose(float* kt, const float* k, int64_t ld, int64_t w, int64_t dh) {
  for (int64_t c = 0; c < w; ++c)
    for (int64_t d = 0; d < dh; ++d) kt[d * TK + c] = k[c * ld + d];
}

/* Keys a query sees in the key tile [k0, k0 + w): those <= qi. */
static inline int64_t st__visible(int64_t qi, int64_t k0, int64_t w) { return qi + 1 - k0 < w ? qi + 1 - k0 : w; }

/*--- the seg form's masks ---------------------------------------------------*/

enum { ST__SEG_NONE = 0, ST__SEG_ONE = 1, ST__SEG_MIXED = 2 };

static void st__id_range(const int32_t* ids, int64_t n, int32_t* lo, int32_t* hi) {
  *lo = *hi = ids[0];
  for (int64_t i = 1; i < n; ++i) {
    *lo = ids[i] < *lo ? ids[i] : *lo;
    *hi = ids[i] > *hi ? ids[i] : *hi;
  }
}

/* How queries [q0, q1) meet keys [k0, k1) of one sequence's ids |sb|: NONE
 * (no id in common: the pair is skipped), ONE (all of them one segment: the
 * causal mask alone), MIXED (masked per element). Ranges, so any ids work,
 * contiguous segments or not; a packed batch's are contiguous, which makes
 * the test exact for all but the tiles a boundary crosses. */
static int st__seg_meet(const int32_t* sb, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  int32_t qlo, qhi, klo, khi;
  st__id_range(sb + q0, q1 - q0, &qlo, &qhi);
  st__id_range(sb + k0, k1 - k0, &klo, &khi);
  if (khi < qlo || klo > qhi) return ST__SEG_NONE;
  return qlo == qhi && klo == khi ? ST__SEG_ONE : ST__SEG_MIXED;
}

/* Scores of keys of another segment than |id| among the first |nv| of a row
 * to -inf (max and exp then pass them over); returns how many keys are left. */
static int64_t st__seg_mask_row(float* sr, const int32_t* kid, int32_t id, int64_t nv) {
  int64_t left = 0;
  for (int64_t c = 0; c < nv; ++c) {
    if (kid[c] != id) sr[c] = -INFINITY;
    else ++left;
  }
  return left;
}

/* After exprow on a masked row: the masked keys' p to exactly 0 (the vector
 * exp clamps its argument at -87, so exp(-inf) is 1.6e-38 there, not 0) and
 * the row's sum over the others only. */
static float st__seg_p_row(float* pr, const int32_t* kid, int32_t id, int64_t nv) {
  float sum = 0.f;
  for (int64_t c = 0; c < nv; ++c) {
    if (kid[c] != id) pr[c] = 0.f;
    else sum += pr[c];
  }
  return sum;
}

/* One forward row against one key tile: the online softmax's update of
 * query r (running max mx, sum, unnormalised acc) with its scores sr of the
 * tile's first nv keys (those <= the query); the rest of the row to 0. With
 * |kid| (a MIXED tile of the seg form) keys of another segment than |id|
 * count as masked; a row left with none keeps its state and p = 0. */
static void st__fwd_row(const st__att_ops* op, float* sr, int64_t nv, int64_t w, float* mx, float* sum, float* acc,
                        int64_t dh, const int32_t* kid, int32_t id) {
  if (kid && !st__seg_mask_row(sr, kid, id, nv)) {
    memset(sr, 0, sizeof(float) * (size_t)w);
    return;
  }
  float m = op->rowmax(sr, nv);
  m = m > *mx ? m : *mx;
  float alpha = expf(*mx - m); /* 0 on the first tile (mx = -inf) */
  float e = op->exprow(sr, nv, m);
  if (kid) e = st__seg_p_row(sr, kid, id, nv);
  *sum = *sum * alpha + e;
  *mx = m;
  for (int64_t c = nv; c < w; ++c) sr[c] = 0.f; /* masked: p = 0 */
  if (alpha != 1.f) op->scal(acc, dh, alpha);
}

/* One (b, h, query tile): for each key tile up to the diagonal (those wholly
 * above it are skipped), s = scale q k^T; per query m' = max(m, max s),
 * p = exp(s - m'), l = l e^(m - m') + sum p, acc = acc e^(m - m') + p v.
 * Then o = acc / l and lse = m + log l. */
static void st__fwd_item(const void* ctx, void* scratch, int64_t it) {
  const st__att* a = ctx;
  const st__att_ops* op = &a->ops;
  /* Within a head the tiles go 0, nq-1, 1, nq-2, ...: a query tile costs its
   * index + 1 key tiles, so any contiguous range of items is near even. */
  int64_t j = it % a->nq, bh = it / a->nq, b = bh / a->h, h = bh % a->h;
  int64_t tile = j % 2 ? a->nq - 1 - j / 2 : j / 2;
  int64_t kvh = h / (a->h / a->kv), dh = a->dh;
  int64_t ldq = a->h * dh, ldk = a->kv * dh;
  float* kt = scratch;
  float* s = kt + dh * TK;
  float *mx = s + TQ * TK, *sum = mx + TQ, *acc = sum + TQ;
  int64_t q0 = tile * TQ, q1 = q0 + TQ < a->t ? q0 + TQ : a->t, rows = q1 - q0;
  const float* qb = a->q + (b * a->t + q0) * ldq + h * dh;
  const float* kb = a->k + (b * a->t) * ldk + kvh * dh;
  const float* vb = a->v + (b * a->t) * ldk + kvh * dh;
  for (int64_t r = 0; r < rows; ++r) {
    mx[r] = -INFINITY;
    sum[r] = 0.f;
  }
  memset(acc, 0, sizeof(float) * (size_t)(TQ * dh));
  const int32_t* sb = a->seg ? a->seg + b * a->t : NULL;
  for (int64_t k0 = 0; k0 < q1; k0 += TK) {
    int64_t w = k0 + TK < a->t ? TK : a->t - k0;
    int meet = sb ? st__seg_meet(sb, q0, q1, k0, k0 + w) : ST__SEG_ONE;
    if (meet == ST__SEG_NONE) continue; /* no query of the tile sees a key of it */
    st__transpose(kt, kb + k0 * ldk, ldk, w, dh);
    op->gemm(s, TK, 0, qb, ldq, 1, rows, dh, kt, TK, w, a->scale);
    for (int64_t r = 0; r < rows; ++r)
      st__fwd_row(op, s + r * TK, st__visible(q0 + r, k0, w), w, &mx[r], &sum[r], acc + r * dh, dh,
                  meet == ST__SEG_MIXED ? sb + k0 : NULL, sb ? sb[q0 + r] : 0);
    op->gemm(acc, dh, 1, s, TK, 1, rows, w, vb + k0 * ldk, ldk, dh, 1.f);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* orow = a->out_o + (b * a->t + q0 + r) * ldq + h * dh;
    float* lrow = &a->out_lse[(b * a->h + h) * a->t + q0 + r];
    if (!(sum[r] > 0.f)) { /* no visible key: cannot happen (a query sees itself); o = 0, not 0/0 */
      memset(orow, 0, sizeof(float) * (size_t)dh);
      *lrow = -INFINITY;
      continue;
    }
    memcpy(orow, acc + r * dh, sizeof(float) * (size_t)dh);
    op->scal(orow, dh, 1.f / sum[r]);
    *lrow = mx[r] + logf(sum[r]);
  }
}

int st_kernel_attention_seg_fwd(st_kernel_isa isa, int threads, const float* q, const float* k, const float* v,
                                const int32_t* seg, float* o, float* lse, int64_t b, int64_t t, int64_t h, int64_t kv,
                                int64_t dh) {
  if (b < 1 || t < 1 || h < 1 || kv < 1 || dh < 1 || h % kv) return -2;
  st__att a = {.ops = st__ops(isa), .seg = seg, .q = q, .k = k, .v = v, .out_o = o, .out_lse = lse, .b = b, .t = t, .h = h,
               .kv = kv, .dh = dh, .nq = (t + TQ - 1) / TQ, .scale = 1.f / sqrtf((float)dh)};
  st__att_job j = {.item = st__fwd_item, .ctx = &a, .scratch_bytes = st__fwd_scratch(dh)};
  return st__att_run(&j, b * h * a.nq, threads);
}

int st_kernel_attention_fwd(st_kernel_isa isa, int threads, const float* q, const float* k, const float* v, float* o,
                            float* lse, int64_t b, int64_t t, int64_t h, int64_t kv, int64_t dh) {
  return st_kernel_attention_seg_fwd(isa, threads, q, k, v, NULL, o, lse, b, t, h, kv, dh);
}

/*--- backward ------------------------------------------------------------------*/

/* Scratch of one backward thread: k and v tiles transposed [dh][TK] each,
 * p and ds of a query tile against a key tile [TQ][TK] each, and delta =
 * rowsum(do * o) of each query head of the group [g][T]. */
static size_t st__bwd_scratch(int64_t dh, int64_t t, int64_t g) {
  return sizeof(float) * (size_t)(2 * dh * TK + 2 * TQ * TK + g * t);
}

/* One (b, key/value head): every query head of its group, so dk and dv of
 * that head have this one writer. For each key tile, each head of the
 * group and each query tile on or below the diagonal:
 *   p = exp(scale q k^T - lse), ds = p (do v^T - delta),
 *   dq += scale ds k, dk += scale ds^T q, dv += p^T do. */
static void st__bwd_item(const void* ctx, void* scratch, int64_t it) {
  const st__att* a = ctx;
  const st__att_ops* op = &a->ops;
  int64_t b = it / a->kv, kvh = it % a->kv, g = a->h / a->kv, dh = a->dh, T = a->t;
  int64_t ldq = a->h * dh, ldk = a->kv * dh;
  float *kt = scratch, *vt = kt + dh * TK, *p = vt + dh * TK, *ds = p + TQ * TK, *delta = ds + TQ * TK;
  const float* kb = a->k + (b * T) * ldk + kvh * dh;
  const float* vb = a->v + (b * T) * ldk + kvh * dh;
  float* dkb = a->dk + (b * T) * ldk + kvh * dh;
  float* dvb = a->dv + (b * T) * ldk + kvh * dh;
  const int32_t* sb = a->seg ? a->seg + b * T : NULL;
  for (int64_t t = 0; t < T; ++t) {
    memset(dkb + t * ldk, 0, sizeof(float) * (size_t)dh);
    memset(dvb + t * ldk, 0, sizeof(float) * (size_t)dh);
  }
  for (int64_t j = 0; j < g; ++j) {
    int64_t h = kvh * g + j;
    const float* ob = a->o + (b * T) * ldq + h * dh;
    const float* db = a->dout + (b * T) * ldq + h * dh;
    float* dqb = a->dq + (b * T) * ldq + h * dh;
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0.f;
      for (int64_t d = 0; d < dh; ++d) acc += db[t * ldq + d] * ob[t * ldq + d];
      delta[j * T + t] = acc;
      memset(dqb + t * ldq, 0, sizeof(float) * (size_t)dh);
    }
  }
  for (int64_t k0 = 0; k0 < T; k0 += TK) {
    int64_t w = k0 + TK < T ? TK : T - k0;
    st__transpose(kt, kb + k0 * ldk, ldk, w, dh);
    st__transpose(vt, vb + k0 * ldk, ldk, w, dh);
    for (int64_t j = 0; j < g; ++j) {
      int64_t h = kvh * g + j;
      const float* qb = a->q + (b * T) * ldq + h * dh;
      const float* db = a->dout + (b * T) * ldq + h * dh;
      const float* lb = a->lse + (b * a->h + h) * T;
      float* dqb = a->dq + (b * T) * ldq + h * dh;
      for (int64_t q0 = k0; q0 < T; q0 += TQ) { /* TQ == TK: query tiles from the diagonal on */
        int64_t rows = q0 + TQ < T ? TQ : T - q0;
        int meet = sb ? st__seg_meet(sb, q0, q0 + rows, k0, k0 + w) : ST__SEG_ONE;
        if (meet == ST__SEG_NONE) continue; /* p = 0 on the whole pair: nothing to add */
        const int32_t* kid = meet == ST__SEG_MIXED ? sb + k0 : NULL;
        op->gemm(p, TK, 0, qb + q0 * ldq, ldq, 1, rows, dh, kt, TK, w, a->scale);
        op->gemm(ds, TK, 0, db + q0 * ldq, ldq, 1, rows, dh, vt, TK, w, 1.f);
        for (int64_t r = 0; r < rows; ++r) {
          int64_t qi = q0 + r, nv = st__visible(qi, k0, w);
          float *pr = p + r * TK, *dr = ds + r * TK;
          if (kid && !st__seg_mask_row(pr, kid, sb[qi], nv)) {
            nv = 0; /* no key of its segment here: p = 0 */
          } else {
            op->exprow(pr, nv, lb[qi]);
            if (kid) st__seg_p_row(pr, kid, sb[qi], nv);
          }
          for (int64_t c = nv; c < w; ++c) pr[c] = 0.f; /* masked */
          op->dsrow(dr, pr, w, delta[j * T + qi]);
        }
        op->gemm(dqb + q0 * ldq, ldq, 1, ds, TK, 1, rows, w, kb + k0 * ldk, ldk, dh, a->scale);
        op->gemm(dvb + k0 * ldk, ldk, 1, p, 1, TK, w, rows, db + q0 * ldq, ldq, dh, 1.f);
        op->gemm(dkb + k0 * ldk, ldk, 1, ds, 1, TK, w, rows, qb + q0 * ldq, ldq, dh, a->scale);
      }
    }
  }
}

int st_kernel_attention_seg_bwd(st_kernel_isa isa, int threads, const float* q, const float* k, const float* v,
                                const int32_t* seg, const float* o, const float* lse, const float* dout, float* dq,
                                float* dk, float* dv, int64_t b, int64_t t, int64_t h, int64_t kv, int64_t dh) {
  if (b < 1 || t < 1 || h < 1 || kv < 1 || dh < 1 || h % kv) return -2;
  st__att a = {.ops = st__ops(isa), .seg = seg, .q = q, .k = k, .v = v, .o = o, .lse = lse, .dout = dout, .dq = dq, .dk = dk,
               .dv = dv, .b = b, .t = t, .h = h, .kv = kv, .dh = dh, .scale = 1.f / sqrtf((float)dh)};
  st__att_job j = {.item = st__bwd_item, .ctx = &a, .scratch_bytes = st__bwd_scratch(dh, t, h / kv)};
  return st__att_run(&j, b * kv, threads);
}

int st_kernel_attention_bwd(st_kernel_isa isa, int threads, const float* q, const float* k, const float* v,
                            const float* o, const float* lse, const float* dout, float* dq, float* dk, float* dv,
                            int64_t b, int64_t t, int64_t h, int64_t kv, int64_t dh) {
  return st_kernel_attention_seg_bwd(isa, threads, q, k, v, NULL, o, lse, dout, dq, dk, dv, b, t, h, kv, dh);
}

/*--- FFI handlers (handlers.c registers them) ----------------------------*/

/* attention fwd: (q [B, T, H, Dh], k [B, T, KV, Dh], v like k) -> (o like q,
 * lse [B, H, T]); KV divides H. */
static xf_error* st__att_shapes(xf_call_frame* f, const char* target, const xf_buffer* q, const xf_buffer* k,
                                      const xf_buffer* v) {
  if (q->rank != 4 || k->rank != 4 || !st__ffi_same_shape(k, v) || k->dims[0] != q->dims[0] ||
      k->dims[1] != q->dims[1] || k->dims[3] != q->dims[3] || k->dims[2] < 1 || q->dims[2] % k->dims[2] ||
      st__ffi_count(q) == 0)
    return st__ffi_fail(f, "%s: shapes outside the contract (q [B, T, H, Dh], k and v [B, T, KV, Dh] with KV dividing "
                    "H, every size at least 1)", target);
  return NULL;
}

/* faults.wrong_kernel=attention: o scaled by 1 + 2^-10 (exact in f32), a
 * deliberate bug for strata compare's tests; one load when off. */
static void st__wrong_o(xf_buffer* o) {
  if (!st__kernel_wrong_attention()) return;
  float* x = o->data;
  const int64_t n = st__ffi_count(o);
  for (int64_t i = 0; i < n; ++i) x[i] *= 1.0f + 0x1p-10f;
}

xf_error* st__ffi_strata_attention_fwd_v1(xf_call_frame* f) {
  ST__FFI_PROLOGUE(f);
  xf_buffer *in[3], *out[2];
  xf_error* e = st__ffi_operands(f, ST_KERNEL_ATTENTION_FWD, 3, 2, in, out);
  if (e) return e;
  xf_buffer *q = in[0], *k = in[1], *v = in[2], *o = out[0], *lse = out[1];
  if ((e = st__att_shapes(f, ST_KERNEL_ATTENTION_FWD, q, k, v))) return e;
  if (!st__ffi_same_shape(q, o) || lse->rank != 3 || lse->dims[0] != q->dims[0] || lse->dims[1] != q->dims[2] ||
      lse->dims[2] != q->dims[1])
    return st__ffi_fail(f, "%s: results outside the contract (o like q, lse [B, H, T])", ST_KERNEL_ATTENTION_FWD);
  if (st_kernel_attention_fwd(st_kernels_isa(), st__kernels_threads(), q->data, k->data, v->data, o->data, lse->data,
                              q->dims[0], q->dims[1], q->dims[2], k->dims[2], q->dims[3]))
    return st__ffi_fail(f, "%s: sizes outside the contract", ST_KERNEL_ATTENTION_FWD);
  st__wrong_o(o);
  return NULL;
}

/* attention bwd: (q, k, v, o, lse, do) -> (dq like q, dk like k, dv like v). */
xf_error* st__ffi_strata_attention_bwd_v1(xf_call_frame* f) {
  ST__FFI_PROLOGUE(f);
  xf_buffer *in[6], *out[3];
  xf_error* e = st__ffi_operands(f, ST_KERNEL_ATTENTION_BWD, 6, 3, in, out);
  if (e) return e;
  xf_buffer *q = in[0], *k = in[1], *v = in[2], *o = in[3], *lse = in[4], *dout = in[5];
  if ((e = st__att_shapes(f, ST_KERNEL_ATTENTION_BWD, q, k, v))) return e;
  if (!st__ffi_same_shape(q, o) || !st__ffi_same_shape(q, dout) || lse->rank != 3 || lse->dims[0] != q->dims[0] ||
      lse->dims[1] != q->dims[2] || lse->dims[2] != q->dims[1] || !st__ffi_same_shape(q, out[0]) ||
      !st__ffi_same_shape(k, out[1]) || !st__ffi_same_shape(k, out[2]))
    return st__ffi_fail(f, "%s: shapes outside the contract (o, do, dq like q; lse [B, H, T]; dk, dv like k)",
                    ST_KERNEL_ATTENTION_BWD);
  if (st_kernel_attention_bwd(st_kernels_isa(), st__kernels_threads(), q->data, k->data, v->data, o->data, lse->data,
                              dout->data, out[0]->data, out[1]->data, out[2]->data, q->dims[0], q->dims[1],
                              q->dims[2], k->dims[2], q->dims[3]))
    return st__ffi_fail(f, "%s: sizes outside the contract", ST_KERNEL_ATTENTION_BWD);
  return NULL;
}

/* The seg form: the plain operands with segment_ids [B, T] s32 after v. */
static const int kSegFwdTypes[] = {XF_F32, XF_F32, XF_F32, XF_S32, XF_F32, XF_F32};
static const int kSegBwdTypes[] = {XF_F32, XF_F32, XF_F32, XF_S32, XF_F32, XF_F32, XF_F32, XF_F32, XF_F32, XF_F32};

static xf_error* st__seg_shape(xf_call_frame* f, const char* target, const xf_buffer* q, const xf_buffer* seg) {
  if (seg->rank != 2 || seg->dims[0] != q->dims[0] || seg->dims[1] != q->dims[1])
    return st__ffi_fail(f, "%s: segment_ids outside the contract ([B, T] s32, B and T those of q)", target);
  return NULL;
}

/* attention seg fwd: (q, k, v, segment_ids [B, T] s32) -> (o like q, lse [B, H, T]). */
xf_error* st__ffi_strata_attention_seg_fwd_v1(xf_call_frame* f) {
  ST__FFI_PROLOGUE(f);
  xf_buffer *in[4], *out[2];
  xf_error* e = st__ffi_operands_typed(f, ST_KERNEL_ATTENTION_SEG_FWD, 4, 2, kSegFwdTypes, in, out);
  if (e) return e;
  xf_buffer *q = in[0], *k = in[1], *v = in[2], *seg = in[3], *o = out[0], *lse = out[1];
  if ((e = st__att_shapes(f, ST_KERNEL_ATTENTION_SEG_FWD, q, k, v))) return e;
  if ((e = st__seg_shape(f, ST_KERNEL_ATTENTION_SEG_FWD, q, seg))) return e;
  if (!st__ffi_same_shape(q, o) || lse->rank != 3 || lse->dims[0] != q->dims[0] || lse->dims[1] != q->dims[2] ||
      lse->dims[2] != q->dims[1])
    return st__ffi_fail(f, "%s: results outside the contract (o like q, lse [B, H, T])", ST_KERNEL_ATTENTION_SEG_FWD);
  if (st_kernel_attention_seg_fwd(st_kernels_isa(), st__kernels_threads(), q->data, k->data, v->data, seg->data,
                                  o->data, lse->data, q->dims[0], q->dims[1], q->dims[2], k->dims[2], q->dims[3]))
    return st__ffi_fail(f, "%s: sizes outside the contract", ST_KERNEL_ATTENTION_SEG_FWD);
  st__wrong_o(o);
  return NULL;
}

/* attention seg bwd: (q, k, v, segment_ids, o, lse, do) -> (dq like q, dk like k, dv like v). */
xf_error* st__ffi_strata_attention_seg_bwd_v1(xf_call_frame* f) {
  ST__FFI_PROLOGUE(f);
  xf_buffer *in[7], *out[3];
  xf_error* e = st__ffi_operands_typed(f, ST_KERNEL_ATTENTION_SEG_BWD, 7, 3, kSegBwdTypes, in, out);
  if (e) return e;
  xf_buffer *q = in[0], *k = in[1], *v = in[2], *seg = in[3], *o = in[4], *lse = in[5], *dout = in[6];
  if ((e = st__att_shapes(f, ST_KERNEL_ATTENTION_SEG_BWD, q, k, v))) return e;
  if ((e = st__seg_shape(f, ST_KERNEL_ATTENTION_SEG_BWD, q, seg))) return e;
  if (!st__ffi_same_shape(q, o) || !st__ffi_same_shape(q, dout) || lse->rank != 3 || lse->dims[0] != q->dims[0] ||
      lse->dims[1] != q->dims[2] || lse->dims[2] != q->dims[1] || !st__ffi_same_shape(q, out[0]) ||
      !st__ffi_same_shape(k, out[1]) || !st__ffi_same_shape(k, out[2]))
    return st__ffi_fail(f, "%s: shapes outside the contract (o, do, dq like q; lse [B, H, T]; dk, dv like k)",
                        ST_KERNEL_ATTENTION_SEG_BWD);
  if (st_kernel_attention_seg_bwd(st_kernels_isa(), st__kernels_threads(), q->data, k->data, v->data, seg->data,
                                  o->data, lse->data, dout->data, out[0]->data, out[1]->data, out[2]->data,
                                  q->dims[0], q->dims[1], q->dims[2], k->dims[2], q->dims[3]))
    return st__ffi_fail(f, "%s: sizes outside the contract", ST_KERNEL_ATTENTION_SEG_BWD);
  return NULL;
}
