/*
 * fuzz_compare.c — libFuzzer target for strata compare's dump reader
 * (st_compare_dumps: index.json against tensors.safetensors, the matching
 * and the budgets; docs/diagnostics.md, "Dump and compare").
 *
 * Input: index.json text, then optionally NUL and a tensors.safetensors
 * file (missing: a fixed one holding "k", f32[2], and "b", s32[2]),
 * written as a dump folder and compared with itself.
 *
 * Properties: a refusal is a config error (exit 2) with a message, never
 * another class; an accepted dump compares at least one tensor and finds
 * no difference with itself (the same non-finite values agree), and its
 * report's counts are consistent.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/diag.h"
#include "fuzz_util.h"

static char g_dir[64];

static void cleanup(void) {
  char path[128];
  snprintf(path, sizeof(path), "%s/index.json", g_dir);
  unlink(path);
  snprintf(path, sizeof(path), "%s/tensors.safetensors", g_dir);
  unlink(path);
  rmdir(g_dir);
}

/* The fixed tensors: k = [1.5, -2], b = [3, 4]. */
static void put_default_tensors(void) {
  static const float k[2] = {1.5f, -2.0f};
  static const int32_t b[2] = {3, 4};
  st_named_tensor t[2] = {{"k", {ST_DTYPE_F32, 1, {2}}, k}, {"b", {ST_DTYPE_S32, 1, {2}}, b}};
  char path[128];
  snprintf(path, sizeof(path), "%s/tensors.safetensors", g_dir);
  st_status s = st_safetensors_write(path, t, 2);
  if (s) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!g_dir[0]) {
    snprintf(g_dir, sizeof(g_dir), "/tmp/fuzz_compare_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    atexit(cleanup);
  }
  const uint8_t* nul = memchr(data, 0, size);
  size_t index_len = nul ? (size_t)(nul - data) : size;
  fuzz_put_file(g_dir, "index.json", data, index_len);
  if (nul) fuzz_put_file(g_dir, "tensors.safetensors", nul + 1, size - index_len - 1);
  else put_default_tensors();
  json_t* r = NULL;
  st_status s = st_compare_dumps(g_dir, g_dir, 0, &r);
  if (s) {
    if (st_status_code(s) != ST_CODE_CONFIG || !st_status_message(s)[0]) {
      fprintf(stderr, "compare refused with class %s: %s\n", st_code_name(st_status_code(s)), st_status_message(s));
      abort();
    }
    st_status_free(s);
    if (r) abort();
    return 0;
  }
  json_int_t compared = json_integer_value(json_object_get(r, "compared"));
  json_int_t over = json_integer_value(json_object_get(r, "over_budget"));
  if (!r || compared < 1 || over != 0 || json_is_true(json_object_get(r, "differ")) ||
      !json_is_null(json_object_get(r, "first")) || json_integer_value(json_object_get(r, "only_a")) != 0 ||
      json_integer_value(json_object_get(r, "only_b")) != 0) {
    char* text = r ? json_dumps(r, 0) : NULL;
    fprintf(stderr, "a dump differs from itself: %s\n", text ? text : "(no report)");
    abort();
  }
  json_decref(r);
  return 0;
}
