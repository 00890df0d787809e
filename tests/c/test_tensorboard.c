/* test_tensorboard.c — TensorBoard event files (strata/obs.h): the
 * hand-written CRC-32C against the standard vectors (RFC 3720 B.4 and
 * "123456789"), the masking and a framed record against bytes that
 * TensorBoard's own Python implementation produced, and what
 * st_tb_write_metrics writes for a metrics object: a file-version record,
 * then one event per object holding its numbers (nested keys joined by
 * '/', the step as the event's step, values as float32 simple_value, 0
 * included; nulls, booleans, strings and arrays left out). The files are
 * decoded here with the same generated protobuf-c code;
 * tests/py/test_tensorboard.py reads real runs with TensorBoard. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
// clang-format off
#include <cmocka.h> /* after stddef.h, stdarg.h and setjmp.h, which it needs */
#include <jansson.h>
// clang-format on
#include "strata/base.h"
#include "strata/obs.h"
#include "tb_event.pb-c.h"
#include "test_util.h"

static void test_crc32c_vectors(void** state) {
  (void)state;
  unsigned char b[32];
  assert_int_equal(st_tb_crc32c("123456789", 9), 0xE3069283u);
  assert_int_equal(st_tb_crc32c("", 0), 0u);
  memset(b, 0, sizeof(b));
  assert_int_equal(st_tb_crc32c(b, 32), 0x8A9136AAu);
  memset(b, 0xFF, sizeof(b));
  assert_int_equal(st_tb_crc32c(b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) b[i] = (unsigned char)i;
  assert_int_equal(st_tb_crc32c(b, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) b[i] = (unsigned char)(31 - i);
  assert_int_equal(st_tb_crc32c(b, 32), 0x113FDB5Cu);
}

static void test_mask_and_frame(void** state) {
  (void)state;
  assert_int_equal(st_tb_mask_crc(0), 0xA282EAD8u);
  assert_int_equal(st_tb_mask_crc(1), 0xA282EAD8u + (1u << 17));
  assert_int_equal(st_tb_mask_crc(0x8000u), 0xA282EAD9u);
  /* tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c framing "hello". */
  assert_int_equal(st_tb_mask_crc(st_tb_crc32c("hello", 5)), 0x191C1FBBu);
  static const unsigned char want[] = {0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xea, 0xb2, 0x04,
                                       0x3e, 'h',  'e',  'l',  'l',  'o',  0xbb, 0x1f, 0x1c, 0x19};
  st_strbuf rec = {0};
  st_strbuf_append(&rec, "x"); /* appends after what is there */
  st_tb_frame(&rec, "hello", 5);
  assert_int_equal(rec.len, 1 + sizeof(want));
  assert_memory_equal(rec.data + 1, want, sizeof(want));
  st_strbuf_free(&rec);
}

static uint64_t get_le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/* The events of |path|, checking every record's framing; *out_count. */
static StrataTb__Event** read_events(const char* path, int* out_count) {
  size_t n = 0;
  unsigned char* data = (unsigned char*)tu_read_file(path, &n);
  assert_non_null(data);
  StrataTb__Event** evs = NULL;
  int count = 0;
  size_t at = 0;
  while (at < n) {
    assert_true(n - at >= 12);
    uint64_t len = get_le(data + at, 8);
    assert_int_equal(get_le(data + at + 8, 4), st_tb_mask_crc(st_tb_crc32c(data + at, 8)));
    assert_true(n - at - 12 >= len + 4);
    assert_int_equal(get_le(data + at + 12 + len, 4), st_tb_mask_crc(st_tb_crc32c(data + at + 12, len)));
    StrataTb__Event* ev = strata_tb__event__unpack(NULL, len, data + at + 12);
    assert_non_null(ev);
    evs = realloc(evs, (size_t)(count + 1) * sizeof(*evs));
    assert_non_null(evs);
    evs[count++] = ev;
    at += 12 + len + 4;
  }
  free(data);
  *out_count = count;
  return evs;
}

static void free_events(StrataTb__Event** evs, int count) {
  for (int i = 0; i < count; ++i) strata_tb__event__free_unpacked(evs[i], NULL);
  free(evs);
}

static void check_value(const StrataTb__Summary__Value* v, const char* tag, float value) {
  assert_string_equal(v->tag, tag);
  /* Set even for 0: a proto3 float outside a oneof would not be encoded. */
  assert_int_equal(v->value_case, STRATA_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
  assert_memory_equal(&v->simple_value, &value, sizeof(float)); /* bit for bit: infinities, -0 */
}

static void test_metrics_events(void** state) {
  (void)state;
  char* root = tu_tmpdir("tb");
  assert_non_null(root);
  char* dir = st_path_join(root, "a/tb"); /* created, parents too */
  st_tb_writer* w = NULL;
  ASSERT_OK(st_tb_open(dir, &w));
  json_error_t err;
  json_t* m = json_loads("{\"step\": 7, \"loss\": 2.5, \"peak\": 74094596, \"overlap_ratio\": null, "
                         "\"async\": true, \"policy\": \"x\", \"list\": [1, 2], \"lr\": 0.00030000000000000003, "
                         "\"recomputes\": 0, \"huge\": 1e300, "
                         "\"by\": {\"params\": 10, \"deep\": {\"n\": -3}, \"none\": null}}",
                         0, &err);
  assert_non_null(m);
  ASSERT_OK(st_tb_write_metrics(w, m));
  json_decref(m);
  m = json_loads("{\"step\": 7, \"eval_loss\": 0.25}", 0, &err);
  ASSERT_OK(st_tb_write_metrics(w, m));
  json_decref(m);
  m = json_loads("{\"step\": 8, \"note\": \"no numbers\"}", 0, &err);
  ASSERT_OK(st_tb_write_metrics(w, m)); /* writes nothing */
  json_decref(m);
  m = json_loads("{\"x\": 1}", 0, &err); /* no step: step 0 */
  ASSERT_OK(st_tb_write_metrics(w, m));
  json_decref(m);
  char* path = st_xstrdup(st_tb_path(w));
  st_tb_close(w);

  assert_non_null(strstr(path, "/a/tb/events.out.tfevents."));
  int count = 0;
  StrataTb__Event** evs = read_events(path, &count);
  assert_int_equal(count, 4);
  assert_int_equal(evs[0]->what_case, STRATA_TB__EVENT__WHAT_FILE_VERSION);
  assert_string_equal(evs[0]->file_version, "brain.Event:2");
  assert_true(evs[0]->wall_time > 1e9);

  assert_int_equal(evs[1]->what_case, STRATA_TB__EVENT__WHAT_SUMMARY);
  assert_int_equal(evs[1]->step, 7);
  assert_true(evs[1]->wall_time >= evs[0]->wall_time);
  const StrataTb__Summary* s = evs[1]->summary;
  assert_int_equal(s->n_value, 7);
  check_value(s->value[0], "loss", 2.5f);
  check_value(s->value[1], "peak", 74094592.0f); /* the nearest float */
  check_value(s->value[2], "lr", (float)0.00030000000000000003);
  check_value(s->value[3], "recomputes", 0.0f);
  check_value(s->value[4], "huge", INFINITY);
  check_value(s->value[5], "by/params", 10.0f);
  check_value(s->value[6], "by/deep/n", -3.0f);

  assert_int_equal(evs[2]->step, 7);
  assert_int_equal(evs[2]->summary->n_value, 1);
  check_value(evs[2]->summary->value[0], "eval_loss", 0.25f);
  assert_int_equal(evs[3]->step, 0);
  check_value(evs[3]->summary->value[0], "x", 1.0f);
  free_events(evs, count);

  /* A second writer in the same second and process: a file of its own. */
  st_tb_writer* w2 = NULL;
  ASSERT_OK(st_tb_open(dir, &w2));
  assert_string_not_equal(st_tb_path(w2), path);
  st_tb_close(w2);
  free(path);
  free(dir);
  tu_rmtree(root);
  free(root);
}

static void test_open_error(void** state) {
  (void)state;
  char* root = tu_tmpdir("tb");
  assert_non_null(root);
  char* file = st_path_join(root, "file");
  assert_int_equal(tu_write_file(file, "x", 1), 0);
  st_tb_writer* w = (st_tb_writer*)1;
  char* under = st_path_join(file, "tb"); /* a folder under a file cannot be made */
  st_status s = st_tb_open(under, &w);
  assert_non_null(s);
  assert_null(w);
  st_status_free(s);
  free(under);
  free(file);
  tu_rmtree(root);
  free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_crc32c_vectors),
      cmocka_unit_test(test_mask_and_frame),
      cmocka_unit_test(test_metrics_events),
      cmocka_unit_test(test_open_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
