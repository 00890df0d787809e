/*
 * test_kernels.c — the kernel contract, the C kernels' two paths against a
 * double-precision reference, registration with the plugin proved by
 * compiling and running every FFI target (and a compile without it failing),
 * and the bundle check (docs/kernels.md).
 *
 * Order matters: the plugin's handler registry is process-wide and cannot
 * be emptied, so the test that compiles without registration runs before
 * any test registers.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/config.h"
#include "strata/kernels.h"
#include "strata/train.h"
#include "test_util.h"

static char* g_dir; /* the verification programs of rmsnorm, exported once */

static int setup(void** state) {
  (void)state;
  g_dir = tu_tmpdir("kernels");
  const char* args[] = {g_dir, "--op", "rmsnorm", NULL};
  char* log = st_path_join(g_dir, "export.log");
  st_python_job job = {.what = "exporting kernel programs", .module = "strata_jax.kernel_verify", .args = args,
                       .log_path = log, .code = ST_CODE_RUNTIME, .jax_platforms = "cpu"};
  st_status s = st_python_run(&job);
  free(log);
  if (s) {
    fprintf(stderr, "setup: %s\n", st_status_message(s));
    st_status_free(s);
    return -1;
  }
  return 0;
}

static int teardown(void** state) {
  (void)state;
  if (!getenv("STRATA_KEEP_TEST_FILES")) tu_rmtree(g_dir);
  free(g_dir);
  return 0;
}

/*--- the contract -----------------------------------------------------------*/

static void test_contract_matches_handlers(void** state) {
  (void)state;
  st_kernel_contract c;
  ASSERT_OK(st_kernel_contract_load(&c));
  assert_int_equal(c.contract_version, 1);
  const st_kernel_op* rms = st_kernel_contract_find(&c, "rmsnorm");
  const st_kernel_op* swi = st_kernel_contract_find(&c, "swiglu");
  assert_non_null(rms);
  assert_non_null(swi);
  assert_string_equal(rms->ffi_fwd, ST_KERNEL_RMSNORM_FWD);
  assert_string_equal(swi->ffi_bwd, ST_KERNEL_SWIGLU_BWD);
  assert_true(rms->has_backward);
  const st_kernel_tolerance* t = st_kernel_op_tolerance(rms, "f32");
  assert_non_null(t);
  assert_true(t->fwd_rtol > 0 && t->bwd_atol > 0);
  ASSERT_OK(st_kernels_check_contract(&c));
  st_kernel_contract_free(&c);
}

/* A contract whose version moved on without the handlers is caught. */
static void test_contract_version_drift_is_caught(void** state) {
  (void)state;
  const char* text =
      "{\"contract_version\": 1, \"ops\": [{\"name\": \"rmsnorm\", \"version\": 2, \"has_backward\": true,"
      " \"implementations\": [\"xla\", \"ffi\"], \"tolerance\": {\"f32\": {\"fwd\": {\"rtol\": 1e-5, \"atol\": 0},"
      " \"bwd\": {\"rtol\": 1e-4, \"atol\": 0}}}, \"ffi_targets\": {\"fwd\": \"strata_rmsnorm_fwd_v2\","
      " \"bwd\": \"strata_rmsnorm_bwd_v2\"}}, {\"name\": \"swiglu\", \"version\": 1, \"has_backward\": true,"
      " \"implementations\": [\"xla\"], \"tolerance\": {\"f32\": {\"fwd\": {\"rtol\": 0, \"atol\": 0},"
      " \"bwd\": {\"rtol\": 0, \"atol\": 0}}}}]}";
  st_kernel_contract c;
  ASSERT_OK(st_kernel_contract_parse(text, strlen(text), "test", &c));
  ASSERT_ERROR(st_kernels_check_contract(&c), ST_CODE_INTERNAL, "rmsnorm", "version 2", "version 1");
  st_kernel_contract_free(&c);
  /* Bounded: a bad row is an error, not a crash. */
  const char* bad = "{\"contract_version\": 1, \"ops\": [{\"name\": \"x\", \"version\": 1, \"implementations\": 3}]}";
  ASSERT_ERROR(st_kernel_contract_parse(bad, strlen(bad), "test", &c), ST_CODE_INTERNAL, "implementations");
}

/*--- the arithmetic -----------------------------------------------------------*/

static float frand(uint64_t* s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f * 4.0f - 2.0f;
}

static void check_close(const float* got, const double* want, int64_t n, double rtol, double atol, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (!(fabs((double)got[i] - want[i]) <= atol + rtol * fabs(want[i])))
      fail_msg("%s[%lld]: %.9g, reference %.9g", what, (long long)i, (double)got[i], want[i]);
}

/* Both paths (AVX-512 only where the CPU has it) against the formulas in
 * double, on sizes that are and are not multiples of the 16 lanes. */
static void test_paths_match_double_reference(void** state) {
  (void)state;
  const int64_t dims[] = {1, 7, 16, 17, 33, 257};
  st_kernel_isa isas[2] = {ST_KERNEL_ISA_PORTABLE, st_kernels_isa()};
  for (int ii = 0; ii < 2; ++ii) {
    for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); ++di) {
      int64_t d = dims[di], rows = 3, n = rows * d;
      uint64_t seed = 7 + (uint64_t)d;
      float *x = malloc(sizeof(float) * (size_t)n), *g = malloc(sizeof(float) * (size_t)d),
            *dy = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n),
            *dx = malloc(sizeof(float) * (size_t)n), *dg = malloc(sizeof(float) * (size_t)d),
            *y2 = malloc(sizeof(float) * (size_t)n);
      double *wy = calloc((size_t)n, sizeof(double)), *wdx = calloc((size_t)n, sizeof(double)),
             *wdg = calloc((size_t)d, sizeof(double)), *wh = calloc((size_t)n, sizeof(double)),
             *wda = calloc((size_t)n, sizeof(double)), *wdb = calloc((size_t)n, sizeof(double));
      for (int64_t i = 0; i < n; ++i) x[i] = frand(&seed), dy[i] = frand(&seed);
      for (int64_t i = 0; i < d; ++i) g[i] = 1.0f + 0.25f * frand(&seed);
      for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * d, *er = dy + r * d;
        double ss = 0, dot = 0;
        for (int64_t i = 0; i < d; ++i) ss += (double)xr[i] * xr[i], dot += (double)er[i] * g[i] * xr[i];
        double inv = 1.0 / sqrt(ss / (double)d + 1e-6);
        for (int64_t i = 0; i < d; ++i) {
          wy[r * d + i] = xr[i] * inv * g[i];
          wdx[r * d + i] = inv * er[i] * g[i] - xr[i] * inv * inv * inv * dot / (double)d;
          wdg[i] += er[i] * xr[i] * inv;
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        double a = x[i], b = dy[i], s = 1.0 / (1.0 + exp(-a));
        wh[i] = a * s * b;
        wda[i] = g[i % d] * b * s * (1 + a * (1 - s)); /* dh = g[i % d] below */
        wdb[i] = g[i % d] * a * s;
      }
      st_kernel_rmsnorm_fwd(isas[ii], x, g, y, rows, d);
      check_close(y, wy, n, 1e-5, 1e-6, "rmsnorm y");
      st_kernel_rmsnorm_bwd(isas[ii], x, g, dy, dx, dg, rows, d);
      check_close(dx, wdx, n, 1e-4, 1e-5, "rmsnorm dx");
      check_close(dg, wdg, d, 1e-4, 1e-5, "rmsnorm dgain");
      st_kernel_swiglu_fwd(isas[ii], x, dy, y2, n);
      check_close(y2, wh, n, 1e-5, 1e-6, "swiglu h");
      float* dh = malloc(sizeof(float) * (size_t)n);
      for (int64_t i = 0; i < n; ++i) dh[i] = g[i % d];
      st_kernel_swiglu_bwd(isas[ii], x, dy, dh, dx, y, n);
      check_close(dx, wda, n, 1e-5, 1e-6, "swiglu dgate");
      check_close(y, wdb, n, 1e-5, 1e-6, "swiglu dup");
      free(dh);
      free(x), free(g), free(dy), free(y), free(dx), free(dg), free(y2);
      free(wy), free(wdx), free(wdg), free(wh), free(wda), free(wdb);
    }
  }
}

/* The cross-entropy's two paths against the formulas in double: V odd and
 * off the 16 lanes and the 2048 chunk, padding ids at -1e30 (weight and
 * gradient exactly 0), and a call large enough to split its rows over
 * threads (pool.c). */
static void test_cross_entropy_matches_double_reference(void** state) {
  (void)state;
  const int64_t shapes[][3] = {/* rows, V, padding ids at the end */
                               {1, 1, 0}, {3, 7, 0}, {3, 17, 0}, {5, 2049, 0}, {3, 5003, 47}, {65, 8191, 0}};
  st_kernel_isa isas[2] = {ST_KERNEL_ISA_PORTABLE, st_kernels_isa()};
  for (int ii = 0; ii < 2; ++ii) {
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); ++si) {
      int64_t rows = shapes[si][0], v = shapes[si][1], pad = shapes[si][2], n = rows * v;
      uint64_t seed = 11 + (uint64_t)v;
      float *x = malloc(sizeof(float) * (size_t)n), *dl = malloc(sizeof(float) * (size_t)n);
      float *ce = malloc(sizeof(float) * (size_t)rows), *lse = malloc(sizeof(float) * (size_t)rows),
            *dce = malloc(sizeof(float) * (size_t)rows);
      int32_t* t = malloc(sizeof(int32_t) * (size_t)rows);
      double *wce = calloc((size_t)rows, sizeof(double)), *wdl = calloc((size_t)n, sizeof(double));
      for (int64_t i = 0; i < n; ++i) x[i] = 3.0f * frand(&seed);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = v - pad; i < v; ++i) x[r * v + i] = -1e30f;
        t[r] = (int32_t)((uint64_t)(frand(&seed) + 2.0f) * 977u % (uint64_t)(v - pad));
        dce[r] = frand(&seed);
        double m = -INFINITY, sum = 0;
        for (int64_t i = 0; i < v; ++i) m = fmax(m, x[r * v + i]);
        for (int64_t i = 0; i < v; ++i) sum += exp((double)x[r * v + i] - m);
        double l = m + log(sum);
        wce[r] = l - x[r * v + t[r]];
        for (int64_t i = 0; i < v; ++i)
          wdl[r * v + i] = dce[r] * (exp((double)x[r * v + i] - l) - (i == t[r] ? 1.0 : 0.0));
      }
      assert_int_equal(st_kernel_cross_entropy_bad_target(t, rows, v), -1);
      st_kernel_cross_entropy_fwd(isas[ii], x, t, ce, lse, rows, v);
      check_close(ce, wce, rows, 1e-5, 1e-5, "cross_entropy ce");
      st_kernel_cross_entropy_bwd(isas[ii], x, t, lse, dce, dl, rows, v);
      check_close(dl, wdl, n, 1e-4, 1e-7, "cross_entropy dlogits");
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = v - pad; i < v; ++i)
          if (dl[r * v + i] != 0.0f) fail_msg("padding id %lld of row %lld has gradient %g", (long long)i, (long long)r,
                                              (double)dl[r * v + i]);
      free(x), free(dl), free(ce), free(lse), free(dce), free(t), free(wce), free(wdl);
    }
  }
  int32_t bad[4] = {0, 5, -1, 9};
  assert_int_equal(st_kernel_cross_entropy_bad_target(bad, 4, 10), 2);
  bad[2] = 10;
  assert_int_equal(st_kernel_cross_entropy_bad_target(bad, 4, 10), 2);
  bad[2] = 9;
  assert_int_equal(st_kernel_cross_entropy_bad_target(bad, 4, 10), -1);
}

/* Causal attention in double, straight from the definition (the whole [T, T]
 * score matrix of a head): o, lse, and the gradients of sum(o * dout). With
 * |seg| ([B, T]; NULL: none) a key of another segment than the query's is
 * masked as a later key is (its score -inf, so its p is 0). */
static void attention_reference(const float* q, const float* k, const float* v, const int32_t* seg,
                                const float* dout, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t Dh, double* o,
                                double* lse, double* dq, double* dk, double* dv) {
  double* p = calloc((size_t)(T * T), sizeof(double));
  double* dp = calloc((size_t)(T * T), sizeof(double));
  double scale = 1.0 / sqrt((double)Dh);
  memset(dk, 0, sizeof(double) * (size_t)(B * T * KV * Dh));
  memset(dv, 0, sizeof(double) * (size_t)(B * T * KV * Dh));
#define QI(b, t, h, d) ((((b) * T + (t)) * H + (h)) * Dh + (d))
#define KI(b, t, h, d) ((((b) * T + (t)) * KV + (h)) * Dh + (d))
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      int64_t g = h / (H / KV);
      for (int64_t i = 0; i < T; ++i) {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < Dh; ++d) s += (double)q[QI(b, i, h, d)] * k[KI(b, j, g, d)];
          p[i * T + j] = seg && seg[b * T + i] != seg[b * T + j] ? -INFINITY : s * scale;
          if (p[i * T + j] > m) m = p[i * T + j];
        }
        for (int64_t j = 0; j <= i; ++j) sum += exp(p[i * T + j] - m);
        lse[(b * H + h) * T + i] = m + log(sum);
        for (int64_t j = 0; j <= i; ++j) p[i * T + j] = exp(p[i * T + j] - m) / sum;
        for (int64_t d = 0; d < Dh; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += p[i * T + j] * v[KI(b, j, g, d)];
          o[QI(b, i, h, d)] = acc;
        }
      }
      /* dp = dout v^T; ds = p (dp - sum_j p dp); dq = scale ds k; dk = scale ds^T q; dv = p^T dout */
      for (int64_t i = 0; i < T; ++i) {
        double rs = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < Dh; ++d) acc += (double)dout[QI(b, i, h, d)] * v[KI(b, j, g, d)];
          dp[i * T + j] = acc;
          rs += p[i * T + j] * acc;
        }
        for (int64_t j = 0; j <= i; ++j) dp[i * T + j] = p[i * T + j] * (dp[i * T + j] - rs) * scale;
        for (int64_t d = 0; d < Dh; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += dp[i * T + j] * k[KI(b, j, g, d)];
          dq[QI(b, i, h, d)] = acc;
        }
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t d = 0; d < Dh; ++d) {
            dk[KI(b, j, g, d)] += dp[i * T + j] * q[QI(b, i, h, d)];
            dv[KI(b, j, g, d)] += p[i * T + j] * dout[QI(b, i, h, d)];
          }
      }
    }
#undef QI
#undef KI
  free(p);
  free(dp);
}

/* The C attention (both paths, 1 and 3 threads) against the reference:
 * sequence lengths off the 64-query/64-key tile and across several tiles,
 * head dims off the 16 lanes and above 64, grouped-query attention. */
static void test_attention_matches_double_reference(void** state) {
  (void)state;
  /* B, T, H, KV, Dh */
  const int64_t shapes[][5] = {{1, 1, 1, 1, 8}, {2, 5, 2, 1, 3}, {1, 65, 4, 2, 17}, {1, 130, 2, 2, 64},
                               {2, 70, 4, 1, 128}, {1, 129, 6, 3, 20}};
  st_kernel_isa isas[2] = {ST_KERNEL_ISA_PORTABLE, st_kernels_isa()};
  for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); ++si) {
    int64_t B = shapes[si][0], T = shapes[si][1], H = shapes[si][2], KV = shapes[si][3], Dh = shapes[si][4];
    size_t nq = (size_t)(B * T * H * Dh), nk = (size_t)(B * T * KV * Dh), nl = (size_t)(B * H * T);
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float)),
          *dout = malloc(nq * sizeof(float)), *o = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float)),
          *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
    double *wo = malloc(nq * sizeof(double)), *wl = malloc(nl * sizeof(double)), *wdq = malloc(nq * sizeof(double)),
           *wdk = malloc(nk * sizeof(double)), *wdv = malloc(nk * sizeof(double));
    uint64_t seed = 11 + si;
    for (size_t i = 0; i < nq; ++i) q[i] = frand(&seed), dout[i] = frand(&seed);
    for (size_t i = 0; i < nk; ++i) k[i] = frand(&seed), v[i] = frand(&seed);
    attention_reference(q, k, v, NULL, dout, B, T, H, KV, Dh, wo, wl, wdq, wdk, wdv);
    for (int ii = 0; ii < 2; ++ii)
      for (int threads = 1; threads <= 3; threads += 2) {
        /* outputs are overwritten: start from garbage */
        memset(o, 0x7f, nq * sizeof(float));
        memset(dk, 0x7f, nk * sizeof(float));
        assert_int_equal(st_kernel_attention_fwd(isas[ii], threads, q, k, v, o, lse, B, T, H, KV, Dh), 0);
        check_close(o, wo, (int64_t)nq, 1e-5, 1e-5, "attention o");
        check_close(lse, wl, (int64_t)nl, 1e-5, 1e-5, "attention lse");
        assert_int_equal(
            st_kernel_attention_bwd(isas[ii], threads, q, k, v, o, lse, dout, dq, dk, dv, B, T, H, KV, Dh), 0);
        check_close(dq, wdq, (int64_t)nq, 1e-4, 1e-4, "attention dq");
        check_close(dk, wdk, (int64_t)nk, 1e-4, 1e-4, "attention dk");
        check_close(dv, wdv, (int64_t)nk, 1e-4, 1e-4, "attention dv");
      }
    free(q), free(k), free(v), free(dout), free(o), free(lse), free(dq), free(dk), free(dv);
    free(wo), free(wl), free(wdq), free(wdk), free(wdv);
  }
  /* sizes outside the contract are refused, not run */
  float x = 0;
  assert_int_equal(st_kernel_attention_fwd(st_kernels_isa(), 1, &x, &x, &x, &x, &x, 1, 1, 3, 2, 1), -2);
  assert_int_equal(st_kernel_attention_bwd(st_kernels_isa(), 1, &x, &x, &x, &x, &x, &x, &x, &x, &x, 1, 0, 1, 1, 1), -2);
}

/* Segment layouts [B, T]: row 0 of a sequence of 70 or more fixed (two
 * single tokens, then a segment over the 64-key tile boundary, then runs
 * to the end), the others random (a third single tokens, the rest up to
 * T/2 long); with |scattered| the last row's ids come back (0 0 1 1 0 0
 * ...: a "segment" need not be contiguous in the contract, and the tile
 * skipping must not assume it). */
static void segment_layout(int32_t* ids, int64_t B, int64_t T, uint64_t* seed, bool scattered) {
  for (int64_t b = 0; b < B; ++b) {
    int32_t* row = ids + b * T;
    int32_t id = 0;
    for (int64_t t = 0; t < T; ++id) {
      int64_t len;
      if (b == 0 && T >= 70) len = t < 2 ? 1 : t == 2 ? 58 : 1 + (int64_t)((frand(seed) + 2.f) * 8.f); /* [2, 60), [60, ...) */
      else len = frand(seed) < -0.67f ? 1 : 1 + (int64_t)((frand(seed) + 2.f) / 4.f * (float)(T / 2));
      for (int64_t e = 0; e < len && t < T; ++e, ++t) row[t] = id;
    }
    if (scattered && b == B - 1 && B > 1)
      for (int64_t t = 0; t < T; ++t) row[t] = (int32_t)((t / 2) % 2);
  }
}

/* Outputs of the tokens outside segment |id| of sequence 0 are bitwise
 * unchanged when that segment's q, k and v change: no token reads across a
 * segment boundary (rows of |width| floats, token-major [B, T, ...] or, for
 * lse, [B, H, T]). */
static void check_untouched(const float* a, const float* b, const int32_t* seg, int32_t id, int64_t B, int64_t T,
                            int64_t rows_per_token, int64_t width, bool head_major, const char* what) {
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t t = 0; t < T; ++t) {
      if (bb == 0 && seg[t] == id) continue;
      for (int64_t r = 0; r < rows_per_token; ++r) {
        int64_t at = head_major ? ((bb * rows_per_token + r) * T + t) * width : ((bb * T + t) * rows_per_token + r) * width;
        if (memcmp(a + at, b + at, sizeof(float) * (size_t)width))
          fail_msg("%s: token %lld of sequence %lld (segment %d) changed with segment %d", what, (long long)t,
                   (long long)bb, seg[bb * T + t], id);
      }
    }
}

/* The seg form (st_kernel_attention_seg_fwd/bwd; strata_attention_seg_*_v1)
 * on both paths, 1 and 3 threads, against the double reference with the
 * same masks, within the contract's attention tolerance; then one segment
 * of sequence 0 perturbed leaves every other token's o, lse, dq, dk and dv
 * bitwise as they were. */
static void test_attention_segments_match_double_reference(void** state) {
  (void)state;
  st_kernel_contract c;
  ASSERT_OK(st_kernel_contract_load(&c));
  const st_kernel_tolerance* tol = st_kernel_op_tolerance(st_kernel_contract_find(&c, "attention"), "f32");
  assert_non_null(tol);
  /* B, T, H, KV, Dh */
  const int64_t shapes[][5] = {{1, 1, 1, 1, 8}, {2, 5, 2, 1, 3}, {2, 130, 4, 2, 17}, {1, 200, 2, 2, 64},
                               {3, 70, 4, 1, 128}, {2, 129, 6, 3, 20}};
  st_kernel_isa isas[2] = {ST_KERNEL_ISA_PORTABLE, st_kernels_isa()};
  for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); ++si) {
    int64_t B = shapes[si][0], T = shapes[si][1], H = shapes[si][2], KV = shapes[si][3], Dh = shapes[si][4];
    size_t nq = (size_t)(B * T * H * Dh), nk = (size_t)(B * T * KV * Dh), nl = (size_t)(B * H * T);
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float)),
          *dout = malloc(nq * sizeof(float)), *o = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float)),
          *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
    float *o2 = malloc(nq * sizeof(float)), *lse2 = malloc(nl * sizeof(float)), *dq2 = malloc(nq * sizeof(float)),
          *dk2 = malloc(nk * sizeof(float)), *dv2 = malloc(nk * sizeof(float));
    double *wo = malloc(nq * sizeof(double)), *wl = malloc(nl * sizeof(double)), *wdq = malloc(nq * sizeof(double)),
           *wdk = malloc(nk * sizeof(double)), *wdv = malloc(nk * sizeof(double));
    int32_t* seg = malloc((size_t)(B * T) * sizeof(int32_t));
    uint64_t seed = 101 + si;
    for (size_t i = 0; i < nq; ++i) q[i] = frand(&seed), dout[i] = frand(&seed);
    for (size_t i = 0; i < nk; ++i) k[i] = frand(&seed), v[i] = frand(&seed);
    segment_layout(seg, B, T, &seed, si % 2 == 0);
    attention_reference(q, k, v, seg, dout, B, T, H, KV, Dh, wo, wl, wdq, wdk, wdv);
    for (int ii = 0; ii < 2; ++ii)
      for (int threads = 1; threads <= 3; threads += 2) {
        memset(o, 0x7f, nq * sizeof(float));
        memset(dk, 0x7f, nk * sizeof(float));
        assert_int_equal(st_kernel_attention_seg_fwd(isas[ii], threads, q, k, v, seg, o, lse, B, T, H, KV, Dh), 0);
        check_close(o, wo, (int64_t)nq, tol->fwd_rtol, tol->fwd_atol, "seg attention o");
        check_close(lse, wl, (int64_t)nl, tol->fwd_rtol, tol->fwd_atol, "seg attention lse");
        assert_int_equal(st_kernel_attention_seg_bwd(isas[ii], threads, q, k, v, seg, o, lse, dout, dq, dk, dv, B, T,
                                                     H, KV, Dh), 0);
        check_close(dq, wdq, (int64_t)nq, tol->bwd_rtol, tol->bwd_atol, "seg attention dq");
        check_close(dk, wdk, (int64_t)nk, tol->bwd_rtol, tol->bwd_atol, "seg attention dk");
        check_close(dv, wdv, (int64_t)nk, tol->bwd_rtol, tol->bwd_atol, "seg attention dv");
      }
    /* perturb sequence 0's middle token's segment (its q, k, v) */
    int32_t id = seg[T / 2];
    for (int64_t t = 0; t < T; ++t) {
      if (seg[t] != id) continue;
      for (int64_t e = 0; e < H * Dh; ++e) q[t * H * Dh + e] += 0.5f;
      for (int64_t e = 0; e < KV * Dh; ++e) k[t * KV * Dh + e] -= 0.25f, v[t * KV * Dh + e] *= 1.5f;
    }
    st_kernel_isa isa = st_kernels_isa();
    assert_int_equal(st_kernel_attention_seg_fwd(isa, 3, q, k, v, seg, o2, lse2, B, T, H, KV, Dh), 0);
    assert_int_equal(st_kernel_attention_seg_bwd(isa, 3, q, k, v, seg, o2, lse2, dout, dq2, dk2, dv2, B, T, H, KV, Dh), 0);
    check_untouched(o, o2, seg, id, B, T, H, Dh, false, "o");
    check_untouched(lse, lse2, seg, id, B, T, H, 1, true, "lse");
    check_untouched(dq, dq2, seg, id, B, T, H, Dh, false, "dq");
    check_untouched(dk, dk2, seg, id, B, T, KV, Dh, false, "dk");
    check_untouched(dv, dv2, seg, id, B, T, KV, Dh, false, "dv");
    free(q), free(k), free(v), free(dout), free(o), free(lse), free(dq), free(dk), free(dv), free(seg);
    free(o2), free(lse2), free(dq2), free(dk2), free(dv2);
    free(wo), free(wl), free(wdq), free(wdk), free(wdv);
  }
  /* Every token its own segment: attention to itself only, o = v exactly
   * up to the softmax's 1/1, lse = its own score. */
  {
    float q[2 * 3] = {1, 2, 3, -1, 0.5f, 2}, kk[2 * 3] = {0.5f, -1, 2, 1, 1, 1}, vv[2 * 3] = {3, 4, 5, 6, 7, 8};
    int32_t seg[2] = {7, 8};
    float o[6], lse[2];
    assert_int_equal(st_kernel_attention_seg_fwd(st_kernels_isa(), 1, q, kk, vv, seg, o, lse, 1, 2, 1, 1, 3), 0);
    for (int i = 0; i < 6; ++i) assert_true(o[i] == vv[i]);
    assert_true(fabs(lse[1] - (-1 + 0.5 + 2) / sqrt(3.0)) < 1e-6);
  }
  st_kernel_contract_free(&c);
}

/*--- registration -------------------------------------------------------------*/

/* Without registration the plugin refuses a program that calls the target:
 * so the compile below is a real proof, not a formality. Runs first. */
static void test_compile_without_registration_fails(void** state) {
  (void)state;
  st_runtime* rt = NULL;
  assert_int_equal(tu_runtime_create(1, &rt), 0);
  assert_int_equal(st_runtime_ffi_target_count(rt), 0);
  char* path = st_path_join(g_dir, "programs/rmsnorm_ffi_fwd_1.mlir");
  st_program* p = NULL;
  st_status s = st_program_compile_file(rt, path, NULL, &p);
  assert_null(p);
  ASSERT_ERROR(s, ST_CODE_RUNTIME, ST_KERNEL_RMSNORM_FWD);
  free(path);
  st_runtime_destroy(rt);
}

/* Every registered target compiles and runs in a program, and agrees with
 * the xla reference (strata kernels verify's engine, all ops). */
static void test_every_target_compiles_and_runs(void** state) {
  (void)state;
  st_runtime_options o;
  st_runtime_options_init(&o);
  o.cpu_devices = 1;
  o.ffi_targets = st_kernels_ffi_target_table(&o.ffi_target_count);
  st_runtime* rt = NULL;
  ASSERT_OK(st_runtime_create(&o, &rt));
  int n = 0;
  const st_ffi_target* t = st_kernels_ffi_target_table(&n);
  assert_int_equal(st_runtime_ffi_target_count(rt), n);
  assert_true(n >= 6);
  char* dir = tu_tmpdir("kverify");
  /* ffi only: the pallas programs (verified by tests/e2e/test_kernels.sh)
   * compile and run several times slower under ASan, and prove nothing
   * about registration. */
  st_kernels_verify_options vo = {.tolerance_scale = 1.0, .workdir = dir, .keep = true, .runtime = rt, .impl = "ffi"};
  st_kernels_verify_result r;
  st_kernels_stats_take(NULL, 0); /* from zero */
  ASSERT_OK(st_kernels_verify(&vo, &r));
  /* Each handler counted the calls it served (docs/kernels.md,
   * "Observability"): one per ffi case (4 verify shapes per op, 3 for
   * attention, whose seg form has its own handlers and cases), none for
   * XLA's probes at registration or for the xla
   * references; a forward whose residual the backward needs
   * (cross_entropy's lse, attention's o and lse) runs in the backward cases
   * too. */
  int want_cases = 0;
  {
    st_kernel_stat rows[64];
    int m = st_kernels_stats_take(rows, 64);
    assert_int_equal(m, n);
    for (int i = 0; i < m; ++i) {
      int shapes = !strcmp(rows[i].op, "attention") ? 3 : 4;
      const char* dir = rows[i].direction; /* fwd, bwd, or a form's: attention's seg_fwd, seg_bwd */
      bool is_fwd = strlen(dir) >= 3 && !strcmp(dir + strlen(dir) - 3, "fwd");
      bool fwd_with_residual = (!strcmp(rows[i].op, "cross_entropy") || !strcmp(rows[i].op, "attention")) && is_fwd;
      want_cases += shapes;
      if (rows[i].calls != (fwd_with_residual ? 2 : 1) * shapes)
        fail_msg("%s: %lld calls, want %d", rows[i].target, (long long)rows[i].calls,
                 (fwd_with_residual ? 2 : 1) * shapes);
      assert_true(rows[i].seconds > 0);
    }
    assert_int_equal(st_kernels_stats_take(rows, 64), n);
    for (int i = 0; i < m; ++i) assert_int_equal(rows[i].calls, 0); /* the take reset them */
  }
  /* Each verify shape fwd and bwd through ffi (only: .impl): each target ran
   * once per shape of its op. */
  assert_int_equal(r.ffi_cases, want_cases);
  assert_int_equal(r.cases, want_cases);
  assert_true(r.worst_ratio <= 1.0);
  /* Found, per target, in the programs that ran. */
  int hn = 0;
  const st_kernel_handler* h = st_kernels_handlers(&hn);
  assert_int_equal(hn, n);
  for (int i = 0; i < n; ++i) {
    assert_string_equal(h[i].target, t[i].name);
    char rel[128];
    snprintf(rel, sizeof(rel), "programs/%s_ffi_%s_1.mlir", h[i].op, h[i].direction);
    char* path = st_path_join(dir, rel);
    size_t size = 0;
    char* text = tu_read_file(path, &size);
    assert_non_null(text);
    assert_non_null(strstr(text, t[i].name));
    free(text);
    free(path);
  }
  /* A target outside the vocabulary is an error naming it, not a result. */
  {
    char* path = st_path_join(dir, "programs/cross_entropy_ffi_fwd_1.mlir"); /* logits [5, 256] */
    st_program* p = NULL;
    ASSERT_OK(st_program_compile_file(rt, path, NULL, &p));
    st_tensor_type lt = {.dtype = ST_DTYPE_F32, .rank = 2, .dims = {5, 256}};
    st_tensor_type tt = {.dtype = ST_DTYPE_S32, .rank = 1, .dims = {5}};
    float logits[5 * 256] = {0};
    int32_t targets[5] = {1, 2, 3, 256, 4};
    st_buffer* in[2] = {0};
    st_buffer* out[2] = {0}; /* the program returns ce only (lse stays inside it) */
    ASSERT_OK(st_buffer_from_host(rt, 0, &lt, logits, &in[0]));
    ASSERT_OK(st_buffer_from_host(rt, 0, &tt, targets, &in[1]));
    ASSERT_ERROR(st_program_execute(p, 0, in, 2, out, 1, NULL), ST_CODE_RUNTIME, ST_KERNEL_CROSS_ENTROPY_FWD,
                 "target 256 (row 3)", "outside the vocabulary [0, 256)");
    for (int i = 0; i < 2; ++i) {
      st_buffer_destroy(in[i]);
      st_buffer_destroy(out[i]);
    }
    st_program_destroy(p);
    free(path);
  }
  /* A tolerance of 0 makes the first inexact case fail, naming it. */
  vo.tolerance_scale = 0;
  vo.op = "swiglu";
  ASSERT_ERROR(st_kernels_verify(&vo, &r), ST_CODE_RUNTIME, "kernel '", "implementation ", "shape f32[",
               "largest error");
  tu_rmtree(dir);
  free(dir);
  st_runtime_destroy(rt);
}

/* A call outside the contract (3 query heads over 2 key/value heads: KV does
 * not divide H) compiles, since XLA knows nothing of the contract, and then
 * fails at run time with the handler's FFI error naming the target: an
 * error, not a crash or a wrong result. */
static void test_attention_handler_refuses_shapes_outside_contract(void** state) {
  (void)state;
  st_runtime_options o;
  st_runtime_options_init(&o);
  o.cpu_devices = 1;
  o.ffi_targets = st_kernels_ffi_target_table(&o.ffi_target_count);
  st_runtime* rt = NULL;
  ASSERT_OK(st_runtime_create(&o, &rt));
  const char* text =
      "module @bad attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
      "  func.func public @main(%q: tensor<1x4x3x8xf32>, %k: tensor<1x4x2x8xf32>, %v: tensor<1x4x2x8xf32>)"
      " -> (tensor<1x4x3x8xf32>, tensor<1x3x4xf32>) {\n"
      "    %0:2 = stablehlo.custom_call @strata_attention_fwd_v1(%q, %k, %v) {api_version = 4 : i32,"
      " backend_config = {}} : (tensor<1x4x3x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>)"
      " -> (tensor<1x4x3x8xf32>, tensor<1x3x4xf32>)\n"
      "    return %0#0, %0#1 : tensor<1x4x3x8xf32>, tensor<1x3x4xf32>\n"
      "  }\n"
      "}\n";
  char* dir = tu_tmpdir("kbad");
  char* path = st_path_join(dir, "bad.mlir");
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  st_program* p = NULL;
  ASSERT_OK(st_program_compile_file(rt, path, NULL, &p));
  st_tensor_type tq = {.dtype = ST_DTYPE_F32, .rank = 4, .dims = {1, 4, 3, 8}};
  st_tensor_type tk = {.dtype = ST_DTYPE_F32, .rank = 4, .dims = {1, 4, 2, 8}};
  float data[96] = {0};
  st_buffer* in[3] = {0};
  ASSERT_OK(st_buffer_from_host(rt, 0, &tq, data, &in[0]));
  ASSERT_OK(st_buffer_from_host(rt, 0, &tk, data, &in[1]));
  ASSERT_OK(st_buffer_from_host(rt, 0, &tk, data, &in[2]));
  st_buffer* out[2] = {0};
  ASSERT_ERROR(st_program_execute(p, 0, in, 3, out, 2, NULL), ST_CODE_RUNTIME, ST_KERNEL_ATTENTION_FWD,
               "shapes outside the contract", "KV dividing H");
  for (int i = 0; i < 3; ++i) st_buffer_destroy(in[i]);
  for (int i = 0; i < 2; ++i) st_buffer_destroy(out[i]);
  st_program_destroy(p);
  /* The seg form's handler: segment ids of 3 tokens for a sequence of 4. */
  const char* seg_text =
      "module @badseg attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
      "  func.func public @main(%q: tensor<1x4x2x8xf32>, %s: tensor<1x3xi32>)"
      " -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>) {\n"
      "    %0:2 = stablehlo.custom_call @strata_attention_seg_fwd_v1(%q, %q, %q, %s) {api_version = 4 : i32,"
      " backend_config = {}} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x3xi32>)"
      " -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>)\n"
      "    return %0#0, %0#1 : tensor<1x4x2x8xf32>, tensor<1x2x4xf32>\n"
      "  }\n"
      "}\n";
  f = fopen(path, "w");
  assert_non_null(f);
  fputs(seg_text, f);
  fclose(f);
  ASSERT_OK(st_program_compile_file(rt, path, NULL, &p));
  st_tensor_type ts = {.dtype = ST_DTYPE_S32, .rank = 2, .dims = {1, 3}};
  int32_t ids[3] = {0, 0, 1};
  ASSERT_OK(st_buffer_from_host(rt, 0, &tk, data, &in[0]));
  ASSERT_OK(st_buffer_from_host(rt, 0, &ts, ids, &in[1]));
  in[2] = NULL;
  ASSERT_ERROR(st_program_execute(p, 0, in, 2, out, 2, NULL), ST_CODE_RUNTIME, ST_KERNEL_ATTENTION_SEG_FWD,
               "segment_ids outside the contract");
  for (int i = 0; i < 2; ++i) st_buffer_destroy(in[i]);
  for (int i = 0; i < 2; ++i) st_buffer_destroy(out[i]);
  st_program_destroy(p);
  tu_rmtree(dir);
  free(dir);
  free(path);
  st_runtime_destroy(rt);
}

/*--- the bundle check ---------------------------------------------------------*/

static void test_bundle_check(void** state) {
  (void)state;
  st_bundle_kernel k[2];
  memset(k, 0, sizeof(k));
  k[0].name = "rmsnorm";
  k[0].impl = "ffi";
  k[0].version = 1;
  k[0].fallback = "";
  k[0].target_count = 2;
  k[0].targets[0] = ST_KERNEL_RMSNORM_FWD;
  k[0].targets[1] = ST_KERNEL_RMSNORM_BWD;
  k[1].name = "swiglu";
  k[1].impl = "xla";
  k[1].version = 7; /* xla needs no handler: any version */
  k[1].fallback = "";
  st_bundle b;
  memset(&b, 0, sizeof(b));
  b.dir = "/b";
  b.kernel_count = 2;
  b.kernels = k;
  ASSERT_OK(st_kernels_check_bundle(&b));
  assert_true(st_kernels_bundle_uses_ffi(&b));
  k[0].version = 2;
  ASSERT_ERROR(st_kernels_check_bundle(&b), ST_CODE_RUNTIME, "'rmsnorm'", "version 2", "version 1", "re-export");
  k[0].version = 1;
  k[0].targets[1] = "strata_rmsnorm_bwd_v9";
  ASSERT_ERROR(st_kernels_check_bundle(&b), ST_CODE_RUNTIME, "'rmsnorm'", "strata_rmsnorm_bwd_v9", "version 1");
  k[0].targets[1] = ST_KERNEL_RMSNORM_BWD;
  k[1].name = "conv2d";
  k[1].impl = "ffi";
  k[1].version = 1;
  ASSERT_ERROR(st_kernels_check_bundle(&b), ST_CODE_RUNTIME, "'conv2d'", "contract version 1",
               "registered version: none");
}

/* The kernel selection is part of the bundle key (docs/kernels.md,
 * "Selection and fallback"): two selections never share a bundle. */
static void test_bundle_key_hashes_the_selection(void** state) {
  (void)state;
  char a[17], b[17], c[17], d[17], e[17];
  st_bundle_key(&(st_bundle_request){.model_json = "{\"d_model\": 8, \"kernels\": {\"rmsnorm\": \"ffi\"}}"}, a);
  st_bundle_key(&(st_bundle_request){.model_json = "{\"d_model\": 8, \"kernels\": {\"rmsnorm\": \"pallas\"}}"}, b);
  st_bundle_key(&(st_bundle_request){.model_json = "{\"d_model\": 8, \"kernels\": {\"rmsnorm\": \"ffi\", \"cross_entropy\": \"ffi\"}}"}, c);
  st_bundle_key(&(st_bundle_request){.model_json = "{\"d_model\": 8, \"layers\": [\"llama\", \"moe\"]}"}, d);
  st_bundle_key(&(st_bundle_request){.model_json = "{\"d_model\": 8, \"layers\": [\"moe\", \"llama\"]}"}, e);
  assert_string_not_equal(a, b);
  assert_string_not_equal(a, c);
  assert_string_not_equal(d, e);
}


/*--- kernels.<op>=auto (docs/kernels.md, "Selection") ----------------------*/

static const char* const kOps[] = {"rmsnorm", "swiglu", "cross_entropy", "attention"};

/* The contract's per-platform default: ffi on cpu, xla elsewhere. "cuda" is
 * a stand-in for a GPU plugin's platform name (no GPU here): the resolver
 * only compares names. An explicit implementation always wins. */
static void test_auto_resolves_per_platform(void** state) {
  (void)state;
  st_kernel_contract c;
  ASSERT_OK(st_kernel_contract_load(&c));
  for (size_t i = 0; i < sizeof(kOps) / sizeof(kOps[0]); ++i) {
    assert_string_equal(st_kernel_resolve(&c, kOps[i], "auto", "cpu"), "ffi");
    assert_string_equal(st_kernel_resolve(&c, kOps[i], "auto", "cuda"), "xla");
    assert_string_equal(st_kernel_resolve(&c, kOps[i], "auto", "rocm"), "xla");
    assert_string_equal(st_kernel_resolve(&c, kOps[i], "auto", ""), "xla");
    assert_string_equal(st_kernel_resolve(&c, kOps[i], "auto", NULL), "xla");
    assert_string_equal(st_kernel_resolve(&c, kOps[i], "xla", "cpu"), "xla");
    assert_string_equal(st_kernel_resolve(&c, kOps[i], "pallas", "cpu"), "pallas");
    assert_string_equal(st_kernel_resolve(&c, kOps[i], "ffi", "cuda"), "ffi");
  }
  assert_string_equal(st_kernel_resolve(&c, "conv2d", "auto", "cpu"), "xla"); /* not in the contract */
  st_kernel_contract_free(&c);
  /* A row without "default" resolves auto to xla; one naming an
   * implementation the row lacks, or not an object, is refused. */
  const char* none =
      "{\"contract_version\": 1, \"ops\": [{\"name\": \"swiglu\", \"version\": 1, \"has_backward\": false,"
      " \"implementations\": [\"xla\", \"ffi\"], \"tolerance\": {\"f32\": {\"fwd\": {\"rtol\": 0, \"atol\": 0}}}}]}";
  ASSERT_OK(st_kernel_contract_parse(none, strlen(none), "test", &c));
  assert_string_equal(st_kernel_resolve(&c, "swiglu", "auto", "cpu"), "xla");
  st_kernel_contract_free(&c);
  const char* bad_impl =
      "{\"contract_version\": 1, \"ops\": [{\"name\": \"swiglu\", \"version\": 1, \"has_backward\": false,"
      " \"implementations\": [\"xla\", \"ffi\"], \"default\": {\"cpu\": \"pallas\", \"other\": \"xla\"},"
      " \"tolerance\": {\"f32\": {\"fwd\": {\"rtol\": 0, \"atol\": 0}}}}]}";
  ASSERT_ERROR(st_kernel_contract_parse(bad_impl, strlen(bad_impl), "test", &c), ST_CODE_INTERNAL, "default.cpu=pallas",
               "not one of its implementations");
  const char* bad_shape =
      "{\"contract_version\": 1, \"ops\": [{\"name\": \"swiglu\", \"version\": 1, \"has_backward\": false,"
      " \"implementations\": [\"xla\"], \"default\": \"xla\","
      " \"tolerance\": {\"f32\": {\"fwd\": {\"rtol\": 0, \"atol\": 0}}}}]}";
  ASSERT_ERROR(st_kernel_contract_parse(bad_shape, strlen(bad_shape), "test", &c), ST_CODE_INTERNAL,
               "default must be an object");
}

/* The options builder resolves auto before the model JSON (so the bundle
 * key) is built, for the platform guessed from runtime.plugin's file: a
 * file named like a CUDA plugin (an empty stand-in; the guess does not load
 * it) gives xla, one named like the CPU plugin ffi; an explicit value wins. */
static void check_options(const char* plugin, const char* swiglu, const char* want_platform, const char* want_json) {
  char pl[600], sw[64];
  snprintf(pl, sizeof(pl), "runtime.plugin=%s", plugin);
  snprintf(sw, sizeof(sw), "kernels.swiglu=%s", swiglu);
  char* ov[] = {pl, "kernels.rmsnorm=auto", sw, "kernels.cross_entropy=auto", "kernels.attention=auto"};
  st_config* cfg = NULL;
  ASSERT_OK(st_config_load("configs/test.yml", 5, ov, &cfg));
  st_plan_options o;
  ASSERT_OK(st_plan_options_from_config(cfg, &o));
  assert_string_equal(o.kernel_platform, want_platform);
  assert_non_null(strstr(o.kernel_platform_basis, plugin));
  json_t* m = json_loads(o.model_json, 0, NULL);
  assert_non_null(m);
  char* k = json_dumps(json_object_get(m, "kernels"), JSON_SORT_KEYS | JSON_COMPACT);
  if (strcmp(k ? k : "null", want_json)) fail_msg("plugin %s, swiglu=%s: kernels %s, want %s", plugin, swiglu, k, want_json);
  assert_true(o.kernel_auto[0] && o.kernel_auto[3]);
  assert_int_equal(o.kernel_auto[1], !strcmp(swiglu, "auto"));
  free(k);
  json_decref(m);
  st_plan_options_deinit(&o);
  st_config_destroy(cfg);
}

static void test_options_resolve_auto_for_the_plugin(void** state) {
  (void)state;
  char* dir = tu_tmpdir("plat");
  char* cuda = st_path_join(dir, "pjrt_c_api_cuda_plugin.so");
  char* cpu = st_path_join(dir, "pjrt_c_api_cpu_plugin.so");
  char* other = st_path_join(dir, "libsomething.so");
  assert_int_equal(tu_write_file(cuda, "", 0), 0);
  assert_int_equal(tu_write_file(cpu, "", 0), 0);
  assert_int_equal(tu_write_file(other, "", 0), 0);
  check_options(cuda, "auto", "cuda", "null");
  check_options(other, "auto", "unknown", "null");
  check_options(cpu, "auto", "cpu",
                "{\"attention\":\"ffi\",\"cross_entropy\":\"ffi\",\"rmsnorm\":\"ffi\",\"swiglu\":\"ffi\"}");
  check_options(cpu, "xla", "cpu", "{\"attention\":\"ffi\",\"cross_entropy\":\"ffi\",\"rmsnorm\":\"ffi\"}");
  check_options(cuda, "ffi", "cuda", "{\"swiglu\":\"ffi\"}");
  tu_rmtree(dir);
  free(cuda);
  free(cpu);
  free(other);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_contract_matches_handlers),
      cmocka_unit_test(test_contract_version_drift_is_caught),
      cmocka_unit_test(test_paths_match_double_reference),
      cmocka_unit_test(test_cross_entropy_matches_double_reference),
      cmocka_unit_test(test_attention_matches_double_reference),
      cmocka_unit_test(test_attention_segments_match_double_reference),
      cmocka_unit_test(test_compile_without_registration_fails),
      cmocka_unit_test(test_every_target_compiles_and_runs),
      cmocka_unit_test(test_attention_handler_refuses_shapes_outside_contract),
      cmocka_unit_test(test_bundle_check),
      cmocka_unit_test(test_bundle_key_hashes_the_selection),
      cmocka_unit_test(test_auto_resolves_per_platform),
      cmocka_unit_test(test_options_resolve_auto_for_the_plugin),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
