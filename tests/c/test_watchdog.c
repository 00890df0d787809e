/* test_watchdog.c — the hang watchdog (deadlines learned from durations,
 * the bundle it writes on expiry, host backtraces) and the loss-spike
 * z-score (strata/diag.h, docs/diagnostics.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h> /* after stddef.h, stdarg.h and setjmp.h, which it needs */
#include <jansson.h>
#include "strata/base.h"
#include "strata/diag.h"
#include "test_util.h"

/* A whole file as a string; NULL when it cannot be read. Caller frees. */
static char* read_text(const char* path) {
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &text, &size);
  if (s) {
    st_status_free(s);
    return NULL;
  }
  return text;
}

static void sleep_s(double s) {
  double until = st_now() + s;
  while (st_now() < until) {
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL); /* a backtrace signal cuts it short: go on */
  }
}

typedef struct {
  pthread_mutex_t mu;
  int fired;
  double at;
  char dir[4096];
} hang_seen;

static void on_hang(void* user, const char* dir) {
  hang_seen* h = user;
  pthread_mutex_lock(&h->mu);
  h->fired++;
  h->at = st_now();
  snprintf(h->dir, sizeof(h->dir), "%s", dir);
  pthread_mutex_unlock(&h->mu);
}

static int fired(hang_seen* h) {
  pthread_mutex_lock(&h->mu);
  int n = h->fired;
  pthread_mutex_unlock(&h->mu);
  return n;
}

static st_watch_item op_item(const char* name, int op, int layer, int micro, int key) {
  st_watch_item it = {.phase = ST_WATCH_OP, .key = key, .name = name, .plan = "step", .kind = "LAUNCH", .op = op,
                      .layer = layer, .micro = micro, .device = 0, .step = 3};
  return it;
}

/* max(floor, K x slowest seen) + timeout, per key; compiles have their own floor. */
static void test_deadlines_learned(void** state) {
  (void)state;
  hang_seen seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
  st_watchdog_options o = {.timeout_s = 5, .factor = 4, .floor_s = 0.05, .compile_s = 100, .run_dir = "/nonexistent",
                           .on_hang = on_hang, .user = &seen};
  st_watchdog* w = NULL;
  ASSERT_OK(st_watchdog_create(&o, &w));
  int k = st_watchdog_keys(w, 2);
  assert_int_equal(st_watchdog_keys(w, 1), k + 2);
  assert_true(fabs(st_watchdog_deadline(w, ST_WATCH_OP, k) - 5.05) < 1e-9);
  assert_true(fabs(st_watchdog_deadline(w, ST_WATCH_COMPILE, -1) - 105) < 1e-9);
  st_watch_item it = op_item("block_fwd", 1, 0, 0, k);
  int h = st_watchdog_begin(w, &it);
  sleep_s(0.06);
  st_watchdog_end(w, h);
  double d = st_watchdog_deadline(w, ST_WATCH_OP, k);
  /* Learned: 4 x >= 0.06 s, above the floor. */
  assert_true(d >= 5 + 4 * 0.06 - 1e-9);
  assert_true(d < 5 + 4 * 1.0); /* the sleep did not take a second */
  /* The other key learned nothing. */
  assert_true(fabs(st_watchdog_deadline(w, ST_WATCH_OP, k + 1) - 5.05) < 1e-9);
  /* A shorter duration does not lower the slowest seen. */
  h = st_watchdog_begin(w, &it);
  st_watchdog_end(w, h);
  assert_true(fabs(st_watchdog_deadline(w, ST_WATCH_OP, k) - d) < 1e-12);
  st_watchdog_end(w, -1); /* no-ops */
  st_watchdog_end(NULL, 3);
  assert_int_equal(st_watchdog_begin(NULL, &it), -1);
  st_watchdog_destroy(w);
  assert_int_equal(fired(&seen), 0);
}

/* Activities that end within their deadlines never fire. */
static void test_no_false_alarm(void** state) {
  (void)state;
  hang_seen seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
  st_watchdog_options o = {.timeout_s = 0.15, .factor = 3, .floor_s = 0.02, .compile_s = 1, .tick_s = 0.01,
                           .run_dir = "/nonexistent", .on_hang = on_hang, .user = &seen};
  st_watchdog* w = NULL;
  ASSERT_OK(st_watchdog_create(&o, &w));
  int k = st_watchdog_keys(w, 1);
  for (int i = 0; i < 20; ++i) {
    st_watch_item it = op_item("block_fwd", 0, 0, 0, k);
    int h = st_watchdog_begin(w, &it);
    sleep_s(0.01);
    st_watchdog_end(w, h);
  }
  st_watchdog_destroy(w);
  assert_int_equal(fired(&seen), 0);
}

/* A thread blocked on a condition variable, for the backtraces. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool go;
} blocker;

static void* block_fn(void* arg) {
  blocker* b = arg;
  pthread_mutex_lock(&b->mu);
  while (!b->go) pthread_cond_wait(&b->cv, &b->mu);
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

/* An op that never ends: detected within its deadline + 1 s; the bundle
 * names it, the ops in flight, the last completed op, every thread's
 * backtrace and the recent events. */
static void test_hang_bundle(void** state) {
  (void)state;
  char* dir = tu_tmpdir("watchdog");
  char* events = st_path_join(dir, "events.jsonl");
  const char* ev = "{\"event\": \"init\"}\n{\"event\": \"run\"}\n{\"event\": \"first_step\", \"step\": 1}\n";
  tu_write_file(events, ev, strlen(ev));
  hang_seen seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
  st_watchdog_options o = {.timeout_s = 0.3, .factor = 10, .floor_s = 0.1, .compile_s = 60, .run_dir = dir,
                           .on_hang = on_hang, .user = &seen};
  st_watchdog* w = NULL;
  ASSERT_OK(st_watchdog_create(&o, &w));
  int k = st_watchdog_keys(w, 8);
  blocker b = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .go = false};
  pthread_t other;
  assert_int_equal(pthread_create(&other, NULL, block_fn, &b), 0);

  /* Steps are slow (0.05 s seen: a deadline of 10 x 0.05 + 0.3), the op is
   * new (0.1 + 0.3): the op is the first past its deadline. */
  st_watch_item step = {.phase = ST_WATCH_STEP, .key = k + 7, .name = "step_2", .op = -1, .layer = -1, .micro = -1,
                        .device = -1, .step = 2};
  int hs = st_watchdog_begin(w, &step);
  sleep_s(0.05);
  st_watchdog_end(w, hs);
  st_watch_item done = op_item("embed_fwd", 0, -1, 1, k);
  st_watchdog_end(w, st_watchdog_begin(w, &done));
  step.name = "step_3";
  step.step = 3;
  hs = st_watchdog_begin(w, &step);
  sleep_s(0.02); /* the step began first */
  st_watch_item stuck = op_item("block_fwd", 4, 2, 1, k + 4);
  double deadline = st_watchdog_deadline(w, ST_WATCH_OP, k + 4);
  assert_true(fabs(deadline - 0.4) < 1e-9); /* nothing learned: floor + timeout */
  double t0 = st_now();
  int hh = st_watchdog_begin(w, &stuck);
  while (!fired(&seen) && st_now() - t0 < deadline + 3) sleep_s(0.01);
  assert_int_equal(fired(&seen), 1);
  double took = seen.at - t0;
  assert_true(took >= deadline);
  assert_true(took <= deadline + 1.0);

  char* path = st_path_join(seen.dir, "hang.json");
  char* text = read_text(path);
  assert_non_null(text);
  json_t* j = json_loads(text, 0, NULL);
  assert_non_null(j);
  json_t* x = json_object_get(j, "expired");
  assert_string_equal(json_string_value(json_object_get(x, "name")), "block_fwd");
  assert_string_equal(json_string_value(json_object_get(x, "kind")), "LAUNCH");
  assert_string_equal(json_string_value(json_object_get(x, "plan")), "step");
  assert_int_equal(json_integer_value(json_object_get(x, "op")), 4);
  assert_int_equal(json_integer_value(json_object_get(x, "layer")), 2);
  assert_int_equal(json_integer_value(json_object_get(x, "microbatch")), 1);
  assert_int_equal(json_integer_value(json_object_get(x, "device")), 0);
  assert_true(fabs(json_number_value(json_object_get(x, "deadline_s")) - 0.4) < 1e-6);
  assert_string_equal(json_string_value(json_object_get(j, "summary")),
                      "LAUNCH block_fwd (step plan op 4, layer 2, microbatch 1, device 0, step 3)");
  json_t* fl = json_object_get(j, "in_flight");
  assert_int_equal(json_array_size(fl), 2); /* oldest first: the step, then the op */
  assert_string_equal(json_string_value(json_object_get(json_array_get(fl, 0), "name")), "step_3");
  assert_string_equal(json_string_value(json_object_get(json_array_get(fl, 1), "name")), "block_fwd");
  assert_true(json_is_number(json_object_get(json_array_get(fl, 1), "issued_at")));
  json_t* last = json_object_get(j, "last_completed");
  assert_string_equal(json_string_value(json_object_get(last, "name")), "embed_fwd");
  assert_true(json_is_number(json_object_get(last, "completed_at")));
  json_t* last_op = json_object_get(j, "last_completed_op");
  assert_string_equal(json_string_value(json_object_get(last_op, "name")), "embed_fwd");
  assert_int_equal(json_integer_value(json_object_get(last_op, "microbatch")), 1);
  /* Every thread is listed; the main one (this test, sleeping) and the
   * blocked one answered with frames. */
  json_t* threads = json_object_get(j, "threads");
  assert_true(json_array_size(threads) >= 3);
  int answered = 0;
  for (size_t i = 0; i < json_array_size(threads); ++i)
    answered += !strcmp(json_string_value(json_object_get(json_array_get(threads, i), "backtrace")), "yes");
  assert_true(answered >= 2);
  json_decref(j);
  free(text);
  free(path);
  path = st_path_join(seen.dir, "threads.txt");
  text = read_text(path);
  assert_non_null(text);
  assert_non_null(strstr(text, "[the watchdog itself]"));
  assert_non_null(strstr(text, "pthread_cond_wait")); /* the blocked thread's frames */
  assert_non_null(strstr(text, "test_watchdog("));    /* frames of this binary */
  free(text);
  free(path);
  path = st_path_join(seen.dir, "events.tail.jsonl");
  text = read_text(path);
  assert_non_null(text);
  assert_string_equal(text, ev);
  free(text);
  free(path);
  path = st_path_join(seen.dir, "maps.txt");
  assert_true(st_fs_exists(path));
  free(path);
  /* It fires once. */
  sleep_s(0.2);
  assert_int_equal(fired(&seen), 1);
  st_watchdog_end(w, hh);
  st_watchdog_end(w, hs);
  st_watchdog_destroy(w);
  pthread_mutex_lock(&b.mu);
  b.go = true;
  pthread_cond_signal(&b.cv);
  pthread_mutex_unlock(&b.mu);
  pthread_join(other, NULL);
  tu_rmtree(dir);
  free(events);
  free(dir);
}

/* A step past its deadline with an op in flight waits for the op's own
 * deadline (the op is named); with no op in flight, the step fires. */
static void test_step_defers_to_ops(void** state) {
  (void)state;
  char* dir = tu_tmpdir("watchdog-step");
  hang_seen seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
  st_watchdog_options o = {.timeout_s = 0.1, .factor = 10, .floor_s = 0.05, .compile_s = 60, .tick_s = 0.01, .run_dir = dir,
                           .on_hang = on_hang, .user = &seen};
  st_watchdog* w = NULL;
  ASSERT_OK(st_watchdog_create(&o, &w));
  int k = st_watchdog_keys(w, 2);
  /* The op has a learned deadline of 10 x 0.04 + 0.1 = 0.5 s, the step
   * the floor's 0.15 s. */
  st_watch_item op = op_item("block_fwd", 1, 0, 0, k);
  int h = st_watchdog_begin(w, &op);
  sleep_s(0.04);
  st_watchdog_end(w, h);
  st_watch_item step = {.phase = ST_WATCH_STEP, .key = k + 1, .name = "step_3", .op = -1, .layer = -1, .micro = -1,
                        .device = -1, .step = 3};
  double t0 = st_now();
  int hs = st_watchdog_begin(w, &step);
  int ho = st_watchdog_begin(w, &op);
  double op_deadline = st_watchdog_deadline(w, ST_WATCH_OP, k);
  assert_true(op_deadline >= 0.5 - 1e-9);
  while (!fired(&seen) && st_now() - t0 < op_deadline + 2) sleep_s(0.01);
  assert_int_equal(fired(&seen), 1);
  assert_true(seen.at - t0 >= op_deadline); /* not at the step's 0.15 s */
  char* path = st_path_join(seen.dir, "hang.json");
  char* text = read_text(path);
  assert_non_null(text);
  json_t* j = json_loads(text, 0, NULL);
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "expired"), "name")), "block_fwd");
  json_decref(j);
  free(text);
  free(path);
  st_watchdog_end(w, ho);
  st_watchdog_end(w, hs);
  st_watchdog_destroy(w);

  /* No op in flight: the step itself fires at its deadline. */
  hang_seen seen2 = {.mu = PTHREAD_MUTEX_INITIALIZER};
  o.user = &seen2;
  ASSERT_OK(st_watchdog_create(&o, &w));
  t0 = st_now();
  hs = st_watchdog_begin(w, &step);
  while (!fired(&seen2) && st_now() - t0 < 2) sleep_s(0.01);
  assert_int_equal(fired(&seen2), 1);
  assert_true(seen2.at - t0 >= 0.15 - 1e-9 && seen2.at - t0 < 1.15);
  path = st_path_join(seen2.dir, "hang.json");
  text = read_text(path);
  j = json_loads(text, 0, NULL);
  assert_string_equal(json_string_value(json_object_get(j, "summary")), "step step_3 (step 3)");
  json_decref(j);
  free(text);
  free(path);
  st_watchdog_end(w, hs);
  st_watchdog_destroy(w);
  tu_rmtree(dir);
  free(dir);
}

static void test_watchdog_needs_timeout(void** state) {
  (void)state;
  st_watchdog_options o = {.timeout_s = 0, .factor = 10, .floor_s = 1};
  st_watchdog* w = NULL;
  ASSERT_ERROR(st_watchdog_create(&o, &w), ST_CODE_INTERNAL, "timeout_s");
  assert_null(w);
}

/* A crafted loss series: a slow noisy decline, one spike, a drop. */
static void test_loss_spike(void** state) {
  (void)state;
  st_spike* s = st_spike_create(20, 10);
  double series[40];
  for (int i = 0; i < 40; ++i) series[i] = 4.0 - 0.01 * i + ((i % 3) - 1) * 0.02;
  series[30] = 6.0;  /* the spike */
  series[35] = 1.0;  /* a drop is no spike */
  series[37] = NAN;  /* neither scored nor added */
  int flagged = 0, at = -1;
  st_spike_result r = {0};
  for (int i = 0; i < 40; ++i) {
    st_spike_result ri;
    if (st_spike_push(s, series[i], 6.0, &ri)) {
      flagged++;
      at = i;
      r = ri;
    }
    if (i < 9) assert_int_equal(ri.count, i); /* no verdict before 10 losses */
  }
  assert_int_equal(flagged, 1);
  assert_int_equal(at, 30);
  /* The z-score over the 20 losses before it, by hand. */
  double mean = 0, ss = 0;
  for (int i = 10; i < 30; ++i) mean += series[i];
  mean /= 20;
  for (int i = 10; i < 30; ++i) ss += (series[i] - mean) * (series[i] - mean);
  double std = sqrt(ss / 19);
  assert_int_equal(r.count, 20);
  assert_true(fabs(r.mean - mean) < 1e-12);
  assert_true(fabs(r.std - std) < 1e-12);
  assert_true(fabs(r.z - (6.0 - mean) / std) < 1e-9);
  st_spike_destroy(s);

  /* A window with no spread gives no verdict, however far the loss. */
  s = st_spike_create(5, 3);
  for (int i = 0; i < 5; ++i) assert_false(st_spike_push(s, 2.0, 1.0, NULL));
  st_spike_result rz;
  assert_false(st_spike_push(s, 100.0, 1.0, &rz));
  assert_true(rz.std == 0);
  /* The spike is in the window now: a second one is judged against it
   * (mean 21.6, std 43.8: z 1.79). */
  assert_true(st_spike_push(s, 100.0, 1.0, &rz));
  assert_true(fabs(rz.mean - 21.6) < 1e-12);
  assert_true(fabs(rz.z - (100.0 - 21.6) / rz.std) < 1e-12 && rz.z > 1.7 && rz.z < 1.8);
  st_spike_destroy(s);
  st_spike_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deadlines_learned),
      cmocka_unit_test(test_no_false_alarm),
      cmocka_unit_test(test_hang_bundle),
      cmocka_unit_test(test_step_defers_to_ops),
      cmocka_unit_test(test_watchdog_needs_timeout),
      cmocka_unit_test(test_loss_spike),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
