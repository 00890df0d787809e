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
 * Vector work is one primitive, a row vector times a matrix (vecmat), plus a
 * row exp: the scores of one query against a key tile (against the tile
 * transposed to [Dh][64]), p times v, and the backward's four products are
 * all of that form. AVX-512 or portable, chosen by the caller's |isa|.
 *
 * Threads: the work is split over (b, h, query tile) in the forward and
 * over (b, key/value head) in the backward (a key/value head's dk and dv
 * then have one writer), taken from a shared counter by |threads| threads
 * that live for the call only: started here, joined before returning, so
 * the module keeps no pool and no state between calls. Scratch (the
 * transposed tiles, one tile of scores, per-query sums) is malloc'ed per
 * thread per call: a few hundred KiB at most, tiny next to the tensors.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/internal.h"
#include "strata/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ST_HAVE_AVX512_PATH 1
#include <immintrin.h>
#endif

#define TQ 64 /* query tile */
#define TK 64 /* key tile: a multiple of 16 (the vector path's 4 x 16 lanes) */

/*--- primitives ---------------------------------------------------------------*/

/* out[j] = (acc ? out[j] : 0) + alpha * sum_{i<m} a[i*lda] * M[i*ldm + j], j < n. */
typedef void (*st__vecmat_fn)(float* out, int acc, const float* a, int64_t lda, int64_t m, const float* M,
                              int64_t ldm, int64_t n, float alpha);
/* s[j] = exp(s[j] - shift) for j < n; returns their sum. */
typedef float (*st__exprow_fn)(float* s, int64_t n, float shift);

static void vecmat_portable(float* out, int acc, const float* a, int64_t lda, int64_t m, const float* M,
                            int64_t ldm, int64_t n, float alpha) {
  float buf[TK];
  for (int64_t j0 = 0; j0 < n; j0 += TK) {
    int64_t w = n - j0 < TK ? n - j0 : TK;
    memset(buf, 0, sizeof(buf));
    for (int64_t i = 0; i < m; ++i) {
      float ai = a[i * lda];
      const float* row = M + i * ldm + j0;
      for (int64_t j = 0; j < w; ++j) buf[j] += ai * row[j];
    }
    for (int64_t j = 0; j < w; ++j) out[j0 + j] = (acc ? out[j0 + j] : 0.f) + alpha * buf[j];
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

#ifdef ST_HAVE_AVX512_PATH
#define AVX512 __attribute__((target("avx512f")))

static inline AVX512 __mmask16 lanes(int64_t left) {
  return left <= 0 ? (__mmask16)0 : left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* 64 output columns per pass in four registers; masked loads of a partial
 * pass read nothing past the row (a zero mask suppresses the access). */
static AVX512 void vecmat_avx512(float* out, int acc, const float* a, int64_t lda, int64_t m, const float* M,
                                 int64_t ldm, int64_t n, float alpha) {
  for (int64_t j0 = 0; j0 < n; j0 += 64) {
    __mmask16 k0 = lanes(n - j0), k1 = lanes(n - j0 - 16), k2 = lanes(n - j0 - 32), k3 = lanes(n - j0 - 48);
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    const float* row = M + j0;
    if (k3) {
      for (int64_t i = 0; i < m; ++i, row += ldm) {
        __m512 ai = _mm512_set1_ps(a[i * lda]);
        c0 = _mm512_fmadd_ps(ai, _mm512_loadu_ps(row), c0);
        c1 = _mm512_fmadd_ps(ai, _mm512_loadu_ps(row + 16), c1);
        c2 = _mm512_fmadd_ps(ai, _mm512_loadu_ps(row + 32), c2);
        c3 = _mm512_fmadd_ps(ai, _mm512_maskz_loadu_ps(k3, row + 48), c3);
      }
    } else {
      for (int64_t i = 0; i < m; ++i, row += ldm) {
        __m512 ai = _mm512_set1_ps(a[i * lda]);
        c0 = _mm512_fmadd_ps(ai, _mm512_maskz_loadu_ps(k0, row), c0);
        c1 = _mm512_fmadd_ps(ai, _mm512_maskz_loadu_ps(k1, row + 16), c1);
        c2 = _mm512_fmadd_ps(ai, _mm512_maskz_loadu_ps(k2, row + 32), c2);
      }
    }
    __m512 al = _mm512_set1_ps(alpha);
    __m512 cs[4] = {c0, c1, c2, c3};
    __mmask16 ks[4] = {k0, k1, k2, k3};
    for (int u = 0; u < 4; ++u) {
      if (!ks[u]) break;
      float* o = out + j0 + 16 * u;
      __m512 prev = acc ? _mm512_maskz_loadu_ps(ks[u], o) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(o, ks[u], _mm512_fmadd_ps(cs[u], al, prev));
    }
  }
}

#endif

typedef struct st__att_ops {
  st__vecmat_fn vecmat;
  st__exprow_fn exprow;
} st__att_ops;

static st__att_ops st__ops(st_kernel_isa isa) {
#ifdef ST_HAVE_AVX512_PATH
  if (isa == ST_KERNEL_ISA_AVX512) return (st__att_ops){vecmat_avx512, st__exp_shift_sum_avx512};
#endif
  (void)isa;
  return (st__att_ops){vecmat_portable, exprow_portable};
}

/*--- threads -------------------------------------------------------------------*/

int st_kernels_threads(void) {
  const char* e = getenv("STRATA_KERNELS_THREADS");
  long n = e && *e ? strtol(e, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

typedef struct st__pool_job {
  int (*item)(void* ctx, void* scratch, int64_t i); /* 0, or -1 out of memory */
  void* ctx;
  size_t scratch_bytes;
  int64_t items;
  _Atomic int64_t next;
  _Atomic int failed;
} st__pool_job;

static void* st__worker(void* arg) {
  st__pool_job* j = arg;
  void* scratch = malloc(j->scratch_bytes);
  if (!scratch) return NULL; /* its share goes to the other threads */
  for (int64_t i; (i = atomic_fetch_add(&j->next, 1)) < j->items;)
    if (j->item(j->ctx, scratch, i)) atomic_store(&j->failed, 1);
  free(scratch);
  return NULL;
}

/* Runs item(0..items-1) on up to |threads| threads (the caller's one of
 * them). A thread that cannot be started just leaves its share to the
 * others. Returns 0, or -1 when scratch could not be allocated. */
static int st__parallel(st__pool_job* j, int threads) {
  if (threads > j->items) threads = (int)j->items;
  pthread_t tid[64];
  int started = 0;
  for (int t = 1; t < threads && t < 64; ++t)
    if (!pthread_create(&tid[started], NULL, st__worker, j)) ++started;
  st__worker(j);
  for (int t = 0; t < started; ++t) pthread_join(tid[t], NULL);
  /* Items are left untaken only when no thread got its scratch. */
  return atomic_load(&j->failed) || atomic_load(&j->next) < j->items ? -1 : 0;
}

/*--- forward -------------------------------------------------------------------*/

typedef struct st__att {
  st__att_ops ops;
  const float *q, *k, *v, *o, *lse, *dout;
  float *out_o, *out_lse, *dq, *dk, *dv;
  int64_t b, t, h, kv, dh, nq;
  float scale;
} st__att;

/* Scratch of one forward thread: the key tile transposed [dh][TK], one row
 * of scores [TK], and per query of the tile the running max, sum and
 * unnormalised output [TQ][dh]. */
static size_t st__fwd_scratch(int64_t dh) { return sizeof(float) * (size_t)(dh * TK + TK + 2 * TQ + TQ * dh); }

/* Copies rows k[k0..k0+w) of one head (row stride ld) to kt[d][c] (c < TK). */
static void st__transpose(float* kt, const float* k, int64_t ld, int64_t w, int64_t dh) {
  for (int64_t c = 0; c < w; ++c)
    for (int64_t d = 0; d < dh; ++d) kt[d * TK + c] = k[c * ld + d];
}

/* One (b, h, query tile). */
static int st__fwd_item(void* ctx, void* scratch, int64_t it) {
  const st__att* a = ctx;
  int64_t tile = it % a->nq, bh = it / a->nq, b = bh / a->h, h = bh % a->h;
  int64_t kvh = h / (a->h / a->kv), dh = a->dh;
  int64_t ldq = a->h * dh, ldk = a->kv * dh;
  float* kt = scratch;
  float* s = kt + dh * TK;
  float *mx = s + TK, *sum = mx + TQ, *acc = sum + TQ;
  int64_t q0 = tile * TQ, q1 = q0 + TQ < a->t ? q0 + TQ : a->t;
  const float* qb = a->q + (b * a->t) * ldq + h * dh;
  const float* kb = a->k + (b * a->t) * ldk + kvh * dh;
  const float* vb = a->v + (b * a->t) * ldk + kvh * dh;
  for (int64_t r = 0; r < q1 - q0; ++r) {
    mx[r] = -INFINITY;
    sum[r] = 0.f;
  }
  memset(acc, 0, sizeof(float) * (size_t)(TQ * dh));
  /* key tiles up to the diagonal; those wholly above it are skipped */
  for (int64_t k0 = 0; k0 < q1; k0 += TK) {
    int64_t w = k0 + TK < a->t ? TK : a->t - k0;
    st__transpose(kt, kb + k0 * ldk, ldk, w, dh);
    for (int64_t qi = q0 > k0 ? q0 : k0; qi < q1; ++qi) {
      int64_t r = qi - q0, nv = qi + 1 - k0 < w ? qi + 1 - k0 : w; /* keys <= qi */
      a->ops.vecmat(s, 0, qb + qi * ldq, 1, dh, kt, TK, nv, a->scale);
      float m = mx[r];
      for (int64_t c = 0; c < nv; ++c) m = s[c] > m ? s[c] : m;
      float alpha = expf(mx[r] - m); /* 0 on the first tile (mx = -inf) */
      float ps = a->ops.exprow(s, nv, m);
      sum[r] = sum[r] * alpha + ps;
      mx[r] = m;
      float* ar = acc + r * dh;
      if (alpha != 1.f)
        for (int64_t d = 0; d < dh; ++d) ar[d] *= alpha;
      a->ops.vecmat(ar, 1, s, 1, nv, vb + k0 * ldk, ldk, dh, 1.f);
    }
  }
  for (int64_t qi = q0; qi < q1; ++qi) {
    int64_t r = qi - q0;
    float inv = 1.f / sum[r];
    float* orow = a->out_o + (b * a->t + qi) * ldq + h * dh;
    for (int64_t d = 0; d < dh; ++d) orow[d] = acc[r * dh + d] * inv;
    a->out_lse[(b * a->h + h) * a->t + qi] = mx[r] + logf(sum[r]);
  }
  return 0;
}

int st_kernel_attention_fwd(st_kernel_isa isa, int threads, const float* q, const float* k, const float* v, float* o,
                            float* lse, int64_t b, int64_t t, int64_t h, int64_t kv, int64_t dh) {
  if (b < 1 || t < 1 || h < 1 || kv < 1 || dh < 1 || h % kv) return -2;
  st__att a = {.ops = st__ops(isa), .q = q, .k = k, .v = v, .out_o = o, .out_lse = lse, .b = b, .t = t, .h = h,
               .kv = kv, .dh = dh, .nq = (t + TQ - 1) / TQ, .scale = 1.f / sqrtf((float)dh)};
  st__pool_job j = {.item = st__fwd_item, .ctx = &a, .scratch_bytes = st__fwd_scratch(dh), .items = b * h * a.nq};
  return st__parallel(&j, threads);
}

/*--- backward ------------------------------------------------------------------*/

/* Scratch of one backward thread: k and v tiles transposed [dh][TK] each,
 * p and ds of a query tile against a key tile [TQ][TK] each, and delta =
 * rowsum(do * o) of one head [T]. */
static size_t st__bwd_scratch(int64_t dh, int64_t t) {
  return sizeof(float) * (size_t)(2 * dh * TK + 2 * TQ * TK + t);
}

/* One (b, key/value head): every query head of the group, so dk and dv of
 * that head have this one writer. Per query head: for each key tile, for
 * each query tile on or below the diagonal,
 *   p = exp(q k^T * scale - lse), dp = do v^T, ds = p (dp - delta),
 *   dq += scale ds k, dk += scale ds^T q, dv += p^T do. */
static int st__bwd_item(void* ctx, void* scratch, int64_t it) {
  const st__att* a = ctx;
  int64_t b = it / a->kv, kvh = it % a->kv, g = a->h / a->kv, dh = a->dh, T = a->t;
  int64_t ldq = a->h * dh, ldk = a->kv * dh;
  float *kt = scratch, *vt = kt + dh * TK, *p = vt + dh * TK, *ds = p + TQ * TK, *delta = ds + TQ * TK;
  const float* kb = a->k + (b * T) * ldk + kvh * dh;
  const float* vb = a->v + (b * T) * ldk + kvh * dh;
  float* dkb = a->dk + (b * T) * ldk + kvh * dh;
  float* dvb = a->dv + (b * T) * ldk + kvh * dh;
  for (int64_t t = 0; t < T; ++t) {
    memset(dkb + t * ldk, 0, sizeof(float) * (size_t)dh);
    memset(dvb + t * ldk, 0, sizeof(float) * (size_t)dh);
  }
  for (int64_t h = kvh * g; h < (kvh + 1) * g; ++h) {
    const float* qb = a->q + (b * T) * ldq + h * dh;
    const float* ob = a->o + (b * T) * ldq + h * dh;
    const float* db = a->dout + (b * T) * ldq + h * dh;
    const float* lb = a->lse + (b * a->h + h) * T;
    float* dqb = a->dq + (b * T) * ldq + h * dh;
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0.f;
      for (int64_t d = 0; d < dh; ++d) acc += db[t * ldq + d] * ob[t * ldq + d];
      delta[t] = acc;
      memset(dqb + t * ldq, 0, sizeof(float) * (size_t)dh);
    }
    for (int64_t k0 = 0; k0 < T; k0 += TK) {
      int64_t w = k0 + TK < T ? TK : T - k0;
      st__transpose(kt, kb + k0 * ldk, ldk, w, dh);
      st__transpose(vt, vb + k0 * ldk, ldk, w, dh);
      for (int64_t q0 = k0 - k0 % TQ; q0 < T; q0 += TQ) {
        int64_t q1 = q0 + TQ < T ? q0 + TQ : T, first = q0 > k0 ? q0 : k0;
        /* On the diagonal tile a row's keys past the query stay zero (the
         * dk/dv products below read whole columns); below it every row
         * fills all w columns. */
        if (first + 1 - k0 < w) {
          memset(p, 0, sizeof(float) * (size_t)(TQ * TK));
          memset(ds, 0, sizeof(float) * (size_t)(TQ * TK));
        }
        for (int64_t qi = first; qi < q1; ++qi) {
          int64_t r = qi - q0, nv = qi + 1 - k0 < w ? qi + 1 - k0 : w;
          float *pr = p + r * TK, *dr = ds + r * TK;
          a->ops.vecmat(pr, 0, qb + qi * ldq, 1, dh, kt, TK, nv, a->scale);
          a->ops.exprow(pr, nv, lb[qi]);
          a->ops.vecmat(dr, 0, db + qi * ldq, 1, dh, vt, TK, nv, 1.f);
          for (int64_t c = 0; c < nv; ++c) dr[c] = pr[c] * (dr[c] - delta[qi]);
          a->ops.vecmat(dqb + qi * ldq, 1, dr, 1, nv, kb + k0 * ldk, ldk, dh, a->scale);
        }
        int64_t rows = q1 - q0;
        for (int64_t c = 0; c < w; ++c) {
          a->ops.vecmat(dvb + (k0 + c) * ldk, 1, p + c, TK, rows, db + q0 * ldq, ldq, dh, 1.f);
          a->ops.vecmat(dkb + (k0 + c) * ldk, 1, ds + c, TK, rows, qb + q0 * ldq, ldq, dh, a->scale);
        }
      }
    }
  }
  return 0;
}

int st_kernel_attention_bwd(st_kernel_isa isa, int threads, const float* q, const float* k, const float* v,
                            const float* o, const float* lse, const float* dout, float* dq, float* dk, float* dv,
                            int64_t b, int64_t t, int64_t h, int64_t kv, int64_t dh) {
  if (b < 1 || t < 1 || h < 1 || kv < 1 || dh < 1 || h % kv) return -2;
  st__att a = {.ops = st__ops(isa), .q = q, .k = k, .v = v, .o = o, .lse = lse, .dout = dout, .dq = dq, .dk = dk,
               .dv = dv, .b = b, .t = t, .h = h, .kv = kv, .dh = dh, .scale = 1.f / sqrtf((float)dh)};
  st__pool_job j = {.item = st__bwd_item, .ctx = &a, .scratch_bytes = st__bwd_scratch(dh, t), .items = b * kv};
  return st__parallel(&j, threads);
}
