/* test_pipeline.c — the pipeline schedules (src/plan/pipeline.c): every
 * task once, each stage's order as the schedule defines it, dependencies
 * respected by the global order, the bubble of equal stages equal to its
 * closed form, and the layer balance. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "plan/plan_internal.h"

/* Every (micro, chunk, pass) once; a forward after the previous chunk's
 * forward, a backward after its own forward and the next chunk's backward
 * — in the global order and in simulated time; a stage runs one task at a
 * time; backwards of each chunk in microbatch order. */
static void check_valid(const st_pipe_schedule* s) {
  const int C = s->C, M = s->M;
  assert_int_equal(s->n, 2 * M * C);
  int* pos = malloc(sizeof(int) * (size_t)(2 * M * C));
  for (int k = 0; k < 2 * M * C; ++k) pos[k] = -1;
  for (int k = 0; k < s->n; ++k) {
    const st_pipe_task* t = &s->tasks[k];
    assert_int_equal(t->stage, t->chunk % s->P);
    int key = (t->micro * C + t->chunk) * 2 + t->backward;
    assert_int_equal(pos[key], -1);
    pos[key] = k;
  }
#define POS(m, c, b) pos[((m) * C + (c)) * 2 + (b)]
#define T(m, c, b) (&s->tasks[POS(m, c, b)])
  for (int m = 0; m < M; ++m)
    for (int c = 0; c < C; ++c) {
      if (c > 0) {
        assert_true(POS(m, c - 1, 0) < POS(m, c, 0));
        assert_true(T(m, c - 1, 0)->end <= T(m, c, 0)->start + 1e-12);
      }
      assert_true(POS(m, c, 0) < POS(m, c, 1));
      assert_true(T(m, c, 0)->end <= T(m, c, 1)->start + 1e-12);
      if (c < C - 1) {
        assert_true(POS(m, c + 1, 1) < POS(m, c, 1));
        assert_true(T(m, c + 1, 1)->end <= T(m, c, 1)->start + 1e-12);
      }
      if (m > 0) assert_true(POS(m - 1, c, 1) < POS(m, c, 1)); /* accumulation order of one device */
    }
  for (int a = 0; a < s->n; ++a)
    for (int b = a + 1; b < s->n; ++b)
      if (s->tasks[a].stage == s->tasks[b].stage)
        assert_true(s->tasks[a].end <= s->tasks[b].start + 1e-12 || s->tasks[b].end <= s->tasks[a].start + 1e-12);
#undef T
#undef POS
  free(pos);
}

/* Microbatches whose forward ran on stage |st| but whose backward had not
 * yet, at most over the schedule (what the stage's activations hold). */
static int most_in_flight(const st_pipe_schedule* s, int st) {
  int now = 0, most = 0;
  for (int k = 0; k < s->n; ++k) {
    if (s->tasks[k].stage != st) continue;
    now += s->tasks[k].backward ? -1 : 1;
    if (now > most) most = now;
  }
  return most;
}

static void test_one_f_one_b(void** state) {
  (void)state;
  st_pipe_schedule s;
  assert_int_equal(st_pipe_schedule_make(ST_PLAN_PIPE_1F1B, 4, 1, 8, NULL, NULL, &s), 0);
  check_valid(&s);
  /* Equal stages, forward 1 and backward 2: the makespan is (M + P - 1) x 3. */
  assert_true(fabs(s.makespan - (8 + 4 - 1) * 3.0) < 1e-9);
  assert_true(fabs(s.bubble - 3.0 / 11.0) < 1e-12);
  assert_true(fabs(s.theory - 3.0 / 11.0) < 1e-12);
  for (int st = 0; st < 4; ++st) assert_int_equal(most_in_flight(&s, st), 4 - st); /* P - s */
  /* Stage 0: P-1 warm-up forwards, then alternating. */
  int seen = 0;
  for (int k = 0; k < s.n && seen < 5; ++k) {
    if (s.tasks[k].stage != 0) continue;
    const bool want_backward = seen == 4;
    assert_int_equal(s.tasks[k].backward, want_backward);
    ++seen;
  }
  st_pipe_schedule_free(&s);
}

static void test_gpipe(void** state) {
  (void)state;
  st_pipe_schedule s;
  assert_int_equal(st_pipe_schedule_make(ST_PLAN_PIPE_GPIPE, 4, 1, 8, NULL, NULL, &s), 0);
  check_valid(&s);
  assert_true(fabs(s.bubble - 3.0 / 11.0) < 1e-12);
  for (int st = 0; st < 4; ++st) assert_int_equal(most_in_flight(&s, st), 8); /* every microbatch */
  st_pipe_schedule_free(&s);
}

static void test_interleaved(void** state) {
  (void)state;
  st_pipe_schedule s;
  /* V chunks per stage, each 1/V of a stage's work: the bubble shrinks by V. */
  double f[8], b[8];
  for (int c = 0; c < 8; ++c) f[c] = 0.5, b[c] = 1.0;
  assert_int_equal(st_pipe_schedule_make(ST_PLAN_PIPE_INTERLEAVED, 4, 2, 8, f, b, &s), 0);
  check_valid(&s);
  assert_true(fabs(s.theory - 3.0 / (2 * 8 + 3)) < 1e-12);
  assert_true(s.bubble <= s.theory + 1e-12);
  st_pipe_schedule_free(&s);
  assert_int_equal(st_pipe_schedule_make(ST_PLAN_PIPE_INTERLEAVED, 2, 3, 4, NULL, NULL, &s), 0);
  check_valid(&s);
  st_pipe_schedule_free(&s);
  /* M equal to P: every forward first (Megatron's rule). */
  assert_int_equal(st_pipe_schedule_make(ST_PLAN_PIPE_INTERLEAVED, 2, 2, 2, NULL, NULL, &s), 0);
  check_valid(&s);
  st_pipe_schedule_free(&s);
  /* M not divisible by P: refused, not deadlocked. */
  st_status bad = st_pipe_schedule_make(ST_PLAN_PIPE_INTERLEAVED, 4, 2, 6, NULL, NULL, &s);
  assert_non_null(bad);
  assert_int_equal(st_status_code(bad), ST_CODE_CONFIG);
  st_status_free(bad);
}

static void test_every_shape_is_valid(void** state) {
  (void)state;
  for (int kind = 0; kind < 3; ++kind)
    for (int P = 1; P <= 5; ++P)
      for (int V = 1; V <= (kind == ST_PLAN_PIPE_INTERLEAVED ? 3 : 1); ++V)
        for (int M = P; M <= 2 * P + 3; ++M) {
          if (kind == ST_PLAN_PIPE_INTERLEAVED && M % P != 0) continue;
          st_pipe_schedule s;
          assert_int_equal(st_pipe_schedule_make(kind, P, V, M, NULL, NULL, &s), 0);
          check_valid(&s);
          assert_true(s.bubble >= -1e-12 && s.bubble < 1);
          st_pipe_schedule_free(&s);
        }
}

static void test_balance(void** state) {
  (void)state;
  int first[5];
  const double even[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  st_pipe_balance(8, 4, even, 0, 0, first);
  const int want_even[5] = {0, 2, 4, 6, 8};
  assert_memory_equal(first, want_even, sizeof(want_even));
  /* A heavy head (3 layers' worth) leaves the last stage one layer. */
  st_pipe_balance(8, 4, even, 0, 3, first);
  assert_int_equal(first[3], 7);
  int total = 0;
  for (int c = 0; c < 4; ++c) {
    assert_true(first[c + 1] > first[c]);
    total += first[c + 1] - first[c];
  }
  assert_int_equal(total, 8);
  /* As many chunks as layers: one each. */
  st_pipe_balance(4, 4, even, 10, 10, first);
  const int want_one[5] = {0, 1, 2, 3, 4};
  assert_memory_equal(first, want_one, sizeof(want_one));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_f_one_b), cmocka_unit_test(test_gpipe), cmocka_unit_test(test_interleaved),
      cmocka_unit_test(test_every_shape_is_valid), cmocka_unit_test(test_balance),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
