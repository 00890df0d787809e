/* test_diag.c — diagnostics under the sanitizers (docs/diagnostics.md):
 *   - faults.nan_at's syntax (st_config_nan_at_parse);
 *   - diag.on_nonfinite=skip with offloaded parameters and optimizer state
 *     (the executor's skipped launches leave gradients, scalars and the
 *     brought-back state in non-persistent slots, which it frees): the run
 *     ends, skipped step's checkpoint tensors equal the step before's;
 *   - diag.on_nonfinite=rollback with sched.optimizer=per_layer: the
 *     checkpoint is loaded back into the executor mid-run;
 *   - diag.on_nonfinite=stop: ST_CODE_NUMERICS (exit 5) naming the step once;
 *   - the locator's bundle of the skip run, and st_train_repro on it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/config.h"
#include "strata/train.h"
#include "test_util.h"

static char* g_tmp;

static int setup(void** state) {
  (void)state;
  return tu_group_tmp_setup(&g_tmp, "diag");
}

static int teardown(void** state) {
  (void)state;
  return tu_group_tmp_teardown(&g_tmp);
}

static void test_nan_at_parse(void** state) {
  (void)state;
  int64_t step = -1;
  int layer = -1;
  char tensor[64] = "x";
  ASSERT_OK(st_config_nan_at_parse("", &step, &layer, tensor, sizeof(tensor)));
  assert_int_equal(step, 0);
  assert_string_equal(tensor, "");
  ASSERT_OK(st_config_nan_at_parse("7:2", &step, &layer, tensor, sizeof(tensor)));
  assert_int_equal(step, 7);
  assert_int_equal(layer, 2);
  assert_string_equal(tensor, "");
  ASSERT_OK(st_config_nan_at_parse("12:0:y", &step, &layer, tensor, sizeof(tensor)));
  assert_int_equal(step, 12);
  assert_int_equal(layer, 0);
  assert_string_equal(tensor, "y");
  const char* bad[] = {"0:1", "x", "7", "7:", "7:a", "-1:2", "7:2:", "7:2:a b", "7:2x", NULL};
  for (int i = 0; bad[i]; ++i) {
    st_status s = st_config_nan_at_parse(bad[i], &step, &layer, tensor, sizeof(tensor));
    if (!s) fail_msg("faults.nan_at '%s' was accepted", bad[i]);
    assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
    assert_non_null(strstr(st_status_message(s), "faults.nan_at"));
    st_status_free(s);
  }
}

/* `strata train configs/test.yml` (3 layers, 4 steps, a checkpoint every
 * step) with |extra| overrides into g_tmp/|tag|; returns its status. */
static st_status train(const char* tag, const char* const* extra) {
  char dir[1024], cache[1024];
  snprintf(dir, sizeof(dir), "run.dir=%s/%s", g_tmp, tag);
  snprintf(cache, sizeof(cache), "runtime.cache_dir=%s/cache", g_tmp);
  const char* base[] = {dir, cache, "train.steps=4", "runtime.deterministic=true", "runtime.cpu_devices=1",
                        "run.progress=off", "train.eval_every=0", "model.n_layers=3", "ckpt.every=1", "ckpt.keep=10",
                        "ckpt.async=false", "obs.tensorboard=false"};
  char* ov[32];
  int n = 0;
  for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); ++i) ov[n++] = (char*)base[i];
  for (int i = 0; extra && extra[i]; ++i) ov[n++] = (char*)extra[i];
  st_config* cfg = NULL;
  ASSERT_OK(st_config_load(STRATA_SOURCE_DIR "/configs/test.yml", n, ov, &cfg));
  st_status s = st_train_main(cfg);
  st_config_destroy(cfg);
  return s;
}

static bool same_file(const char* a, const char* b) {
  size_t na = 0, nb = 0;
  char* x = tu_read_file(a, &na);
  char* y = tu_read_file(b, &nb);
  assert_non_null(x);
  assert_non_null(y);
  bool same = na == nb && !memcmp(x, y, na);
  free(x);
  free(y);
  return same;
}

static void expect_same_state(const char* tag, int step_a, int step_b, bool want_same) {
  const char* files[] = {"params.safetensors", "optimizer.safetensors"};
  for (int i = 0; i < 2; ++i) {
    char a[1200], b[1200];
    snprintf(a, sizeof(a), "%s/%s/checkpoints/step_%d/%s", g_tmp, tag, step_a, files[i]);
    snprintf(b, sizeof(b), "%s/%s/checkpoints/step_%d/%s", g_tmp, tag, step_b, files[i]);
    if (same_file(a, b) != want_same)
      fail_msg("%s: step_%d and step_%d %s %s", tag, step_a, step_b, files[i], want_same ? "differ" : "are equal");
  }
}

static void test_skip_with_offload(void** state) {
  (void)state;
  const char* extra[] = {"faults.nan_at=3:1", "faults.nan_micro=1", "diag.on_nonfinite=skip", "sched.offload=both",
                         "sched.prefetch_depth=1", "sched.remat=every:2", NULL};
  ASSERT_OK(train("skip", extra));
  expect_same_state("skip", 2, 3, true);
  expect_same_state("skip", 3, 4, false);
  /* The locator ran on the offloaded plan; its bundle replays (repro.c
   * reading it under the sanitizers). */
  char dir[1100], path[1200];
  snprintf(dir, sizeof(dir), "%s/skip/diag/nonfinite-step3", g_tmp);
  snprintf(path, sizeof(path), "%s/nonfinite.json", dir);
  size_t n = 0;
  char* text = tu_read_file(path, &n);
  assert_non_null(text);
  json_t* j = NULL;
  ASSERT_OK(st_json_parse(text, n, path, &j));
  free(text);
  assert_int_equal(json_integer_value(json_object_get(j, "layer")), 1);
  assert_int_equal(json_integer_value(json_object_get(j, "microbatch")), 1);
  assert_string_equal(json_string_value(json_object_get(j, "output")), "y");
  assert_true(json_is_true(json_object_get(j, "inputs_finite")));
  json_decref(j);
  st_repro_result r;
  ASSERT_OK(st_train_repro(dir, NULL, &r));
  assert_true(r.reproduces);
  assert_true(r.injected);
  assert_int_equal(r.runs, 2);
  assert_int_equal(r.nonfinite, 1);
  st_repro_result_deinit(&r);
}

static void test_rollback_per_layer(void** state) {
  (void)state;
  const char* extra[] = {"faults.nan_at=3:0", "diag.on_nonfinite=rollback", "sched.optimizer=per_layer", "train.grad_clip=0",
                         NULL};
  ASSERT_OK(train("rollback", extra));
  /* The NaN update of step 3 was undone: step_3 holds step_2's state. */
  expect_same_state("rollback", 2, 3, true);
  expect_same_state("rollback", 3, 4, false);
}

static void test_stop(void** state) {
  (void)state;
  const char* extra[] = {"faults.nan_at=2:2", NULL};
  st_status s = train("stop", extra);
  if (!s) fail_msg("a NaN at step 2 did not stop the run");
  assert_int_equal(st_status_code(s), ST_CODE_NUMERICS);
  assert_int_equal(st_status_exit_code(s), 5);
  const char* msg = st_status_message(s);
  assert_non_null(strstr(msg, "step 2: loss of microbatch 0 is not finite"));
  assert_null(strstr(msg, "step 2: step 2"));
  st_status_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nan_at_parse),
      cmocka_unit_test(test_skip_with_offload),
      cmocka_unit_test(test_rollback_per_layer),
      cmocka_unit_test(test_stop),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
