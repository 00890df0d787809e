/* input_stats.c — golden statistics of one tensor (issue 30 item 4b): what
 * a non-finite bundle records of each saved input (nonfinite.json
 * "input_stats") and what `strata repro` recomputes from
 * inputs.safetensors before it replays. The definitions are
 * tests/golden/golden.py's tensor_stats (tests/golden/README.md): the same
 * numbers for the same bytes. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/tensor.h"
#include "train/train_internal.h"

/* Element |i| of a float tensor as a double (bf16: the upper half of an
 * f32, exactly); integer tensors as their value. */
static double st__stat_value(st_dtype dtype, const unsigned char* data, int64_t i) {
  switch (dtype) {
    case ST_DTYPE_F32: {
      float f;
      memcpy(&f, data + i * 4, 4);
      return f;
    }
    case ST_DTYPE_BF16: {
      uint16_t h;
      memcpy(&h, data + i * 2, 2);
      uint32_t bits = (uint32_t)h << 16;
      float f;
      memcpy(&f, &bits, 4);
      return f;
    }
    case ST_DTYPE_S32: {
      int32_t v;
      memcpy(&v, data + i * 4, 4);
      return v;
    }
    case ST_DTYPE_S64: {
      int64_t v;
      memcpy(&v, data + i * 8, 8);
      return (double)v;
    }
    default:
      return 0.0;
  }
}

/* f32 -> bf16 bits, round to nearest even; every NaN 0x7FC0. */
static uint16_t st__stat_bf16(float f) {
  if (isnan(f)) return 0x7FC0;
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(((uint64_t)x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

json_t* st__tensor_stats_json(st_dtype dtype, const void* data, int64_t n) {
  const unsigned char* p = data;
  const bool is_float = dtype == ST_DTYPE_F32 || dtype == ST_DTYPE_BF16;
  const bool known = is_float || dtype == ST_DTYPE_S32 || dtype == ST_DTYPE_S64;
  /* norm and largest |x| of the finite elements, in order, in double: the
   * same sum wherever it runs (no reassociation without -ffast-math) */
  double ss = 0, mx = 0;
  int64_t bad = 0;
  for (int64_t i = 0; known && i < n; ++i) {
    double v = st__stat_value(dtype, p, i);
    if (!isfinite(v)) {
      ++bad;
      continue;
    }
    ss += v * v;
    if (fabs(v) > mx) mx = fabs(v);
  }
  json_t* o = st_json_obj();
  st_json_put(o, "norm", st_json_num(sqrt(ss)));
  st_json_put(o, "maxabs", st_json_num(mx));
  st_json_put_int(o, "nonfinite", bad);
  /* flat indices 0, n/3, 2n/3, n-1, ascending, without repeats */
  int64_t cand[4] = {0, n / 3, (2 * n) / 3, n > 0 ? n - 1 : 0};
  json_t* idx = st_json_arr();
  json_t* vals = st_json_arr();
  int64_t last = -1;
  for (int k = 0; k < 4 && n > 0; ++k) {
    if (cand[k] == last) continue;
    last = cand[k];
    json_array_append_new(idx, st_json_int(cand[k]));
    json_array_append_new(vals, known ? st_json_num(st__stat_value(dtype, p, cand[k])) : json_null());
  }
  st_json_put(o, "idx", idx);
  st_json_put(o, "values", vals);
  /* a float tensor: sha256 of its bf16 rounding (little-endian), 16 hex
   * digits; anything else: of its bytes */
  char hex[65];
  if (is_float) {
    uint16_t* h = st_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(uint16_t));
    for (int64_t i = 0; i < n; ++i) {
      /* a bf16 element rounds to itself */
      uint16_t b = st__stat_bf16((float)st__stat_value(dtype, p, i));
      unsigned char le[2] = {(unsigned char)(b & 0xFF), (unsigned char)(b >> 8)};
      memcpy(&h[i], le, 2);
    }
    st_sha256_hex(h, (size_t)n * sizeof(uint16_t), hex);
    free(h);
  } else {
    st_sha256_hex(data, (size_t)(n > 0 ? n : 0) * st_dtype_size(dtype), hex);
  }
  hex[16] = '\0';
  st_json_put_str(o, is_float ? "bf16_sha256" : "sha256", hex);
  return o;
}
