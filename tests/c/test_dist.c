/* test_dist.c — strata/dist.h without MPI: launch detection from a given
 * environment, the agreement's hash, packing and first-difference logic,
 * the error texts, and a job of one (local store, agreement always OK),
 * and the collectives' pure parts (blocks, bytes, the ordered sum) and a
 * job of one's collectives and blocking exchanges.
 * The same module across real MPI processes: tests/c/mpi_dist_test.c. */
#include <setjmp.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dist/dist_internal.h"
#include "strata/base.h"
#include "strata/dist.h"
#include "test_util.h"

/* An environment as NULL-terminated "NAME=value" strings. */
static const char* lookup(const char* name, void* user) {
  const char* const* env = user;
  size_t n = strlen(name);
  for (; *env; env++)
    if (strncmp(*env, name, n) == 0 && (*env)[n] == '=') return *env + n + 1;
  return NULL;
}

static st_dist_launch detect(const char* const* env) {
  st_dist_launch l;
  memset(&l, 0xab, sizeof(l));
  ASSERT_OK(st_dist_detect_from(lookup, (void*)env, &l));
  return l;
}

static void test_detect_plain(void** state) {
  (void)state;
  const char* env[] = {"HOME=/root", "PATH=/usr/bin", NULL};
  st_dist_launch l = detect(env);
  assert_int_equal(l.launcher, ST_DIST_LAUNCHER_NONE);
  assert_false(l.multi);
  assert_int_equal(l.world_size, 1);
  assert_int_equal(l.rank, 0);
  assert_int_equal(l.local_rank, 0);
  assert_string_equal(st_dist_launcher_name(l.launcher), "none");
}

static void test_detect_openmpi(void** state) {
  (void)state;
  const char* env[] = {"OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_LOCAL_RANK=1",
                       /* mpirun inside a Slurm allocation: Open MPI's numbers win */
                       "SLURM_NTASKS=8", "SLURM_PROCID=0", NULL};
  st_dist_launch l = detect(env);
  assert_int_equal(l.launcher, ST_DIST_LAUNCHER_OPENMPI);
  assert_true(l.multi);
  assert_int_equal(l.world_size, 4);
  assert_int_equal(l.rank, 3);
  assert_int_equal(l.local_rank, 1);
}

static void test_detect_slurm(void** state) {
  (void)state;
  const char* env[] = {"SLURM_NTASKS=16", "SLURM_STEP_NUM_TASKS=2", "SLURM_PROCID=1", "SLURM_LOCALID=0", NULL};
  st_dist_launch l = detect(env);
  assert_int_equal(l.launcher, ST_DIST_LAUNCHER_SLURM);
  assert_true(l.multi);
  assert_int_equal(l.world_size, 2); /* the step's, not the allocation's */
  assert_int_equal(l.rank, 1);
  assert_int_equal(l.local_rank, 0);
  const char* env2[] = {"SLURM_NTASKS=3", "SLURM_PROCID=2", "SLURM_LOCALID=2", NULL};
  l = detect(env2);
  assert_int_equal(l.world_size, 3);
}

static void test_detect_pmi(void** state) {
  (void)state;
  const char* env[] = {"PMI_SIZE=2", "PMI_RANK=0", NULL};
  st_dist_launch l = detect(env);
  assert_int_equal(l.launcher, ST_DIST_LAUNCHER_PMI);
  assert_true(l.multi);
  assert_int_equal(l.world_size, 2);
  assert_int_equal(l.local_rank, -1); /* st_dist_init asks MPI */
  const char* envx[] = {"PMIX_RANK=5", NULL};
  l = detect(envx);
  assert_int_equal(l.launcher, ST_DIST_LAUNCHER_PMIX);
  assert_true(l.multi);
  assert_int_equal(l.world_size, 0); /* only MPI knows */
  assert_int_equal(l.rank, 5);
}

static void test_detect_job_of_one(void** state) {
  (void)state;
  const char* env[] = {"OMPI_COMM_WORLD_SIZE=1", "OMPI_COMM_WORLD_RANK=0", NULL};
  st_dist_launch l = detect(env);
  assert_int_equal(l.launcher, ST_DIST_LAUNCHER_OPENMPI);
  assert_false(l.multi); /* mpirun -np 1 runs like a plain process: no MPI */
  assert_int_equal(l.local_rank, 0);
}

static void test_detect_errors(void** state) {
  (void)state;
  st_dist_launch l;
  const char* bad[] = {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=two", NULL};
  tu_assert_error(st_dist_detect_from(lookup, (void*)bad, &l), ST_CODE_CONFIG, "OMPI_COMM_WORLD_RANK", "two", NULL);
  const char* out_of_range[] = {"SLURM_NTASKS=2", "SLURM_PROCID=2", NULL};
  tu_assert_error(st_dist_detect_from(lookup, (void*)out_of_range, &l), ST_CODE_CONFIG, "SLURM_PROCID=2",
                  "size 2", NULL);
  const char* zero[] = {"PMI_SIZE=0", "PMI_RANK=0", NULL};
  tu_assert_error(st_dist_detect_from(lookup, (void*)zero, &l), ST_CODE_CONFIG, "PMI_SIZE=0", NULL);
  const char* negative[] = {"PMIX_RANK=-1", NULL};
  tu_assert_error(st_dist_detect_from(lookup, (void*)negative, &l), ST_CODE_CONFIG, "PMIX_RANK", NULL);
}

/*--- the agreement's logic ----------------------------------------------------------*/

static const char* kKeys[] = {"bundle.key", "train.lr", "train.steps"};
static const char* kValues[] = {"b3f1", "0.001", "20"};

static void test_hash(void** state) {
  (void)state;
  uint64_t h = st__dist_agree_hash(kKeys, kValues, 3);
  assert_true(h == st__dist_agree_hash(kKeys, kValues, 3));
  const char* v2[] = {"b3f1", "0.002", "20"};
  assert_true(h != st__dist_agree_hash(kKeys, v2, 3));
  assert_true(h != st__dist_agree_hash(kKeys, kValues, 2));
  /* The boundary between key and value is part of the hash. */
  const char* ka[] = {"ab"}, *va[] = {"c"}, *kb[] = {"a"}, *vb[] = {"bc"};
  assert_true(st__dist_agree_hash(ka, va, 1) != st__dist_agree_hash(kb, vb, 1));
}

static void test_pack_unpack(void** state) {
  (void)state;
  size_t size = 0;
  char* buf = dist_agree_pack(kKeys, kValues, 3, &size);
  const char **k = NULL, **v = NULL;
  size_t n = 0;
  ASSERT_OK(st__dist_agree_unpack(buf, size, &k, &v, &n));
  assert_int_equal(n, 3);
  for (size_t i = 0; i < 3; i++) {
    assert_string_equal(k[i], kKeys[i]);
    assert_string_equal(v[i], kValues[i]);
  }
  free(k);
  free(v);
  /* Torn: a key without its value; bytes without their NUL. */
  tu_assert_error(st__dist_agree_unpack(buf, strlen(kKeys[0]) + 1, &k, &v, &n), ST_CODE_INTERNAL, "not whole", NULL);
  tu_assert_error(st__dist_agree_unpack(buf, size - 1, &k, &v, &n), ST_CODE_INTERNAL, "not whole", NULL);
  free(buf);
  buf = dist_agree_pack(NULL, NULL, 0, &size);
  ASSERT_OK(st__dist_agree_unpack(buf, size, &k, &v, &n));
  assert_int_equal(n, 0);
  free(k);
  free(v);
  free(buf);
}

static void test_first_difference(void** state) {
  (void)state;
  const char *key = NULL, *v0 = NULL, *v = NULL;
  assert_int_equal(st__dist_agree_first_difference(kKeys, kValues, 3, kKeys, kValues, 3, &key, &v0, &v), -1);

  const char* lr[] = {"b3f1", "0.002", "30"};
  assert_int_equal(st__dist_agree_first_difference(kKeys, kValues, 3, kKeys, lr, 3, &key, &v0, &v), 1);
  assert_string_equal(key, "train.lr");
  assert_string_equal(v0, "0.001");
  assert_string_equal(v, "0.002");

  /* The rank lacks a key: its value is absent. */
  assert_int_equal(st__dist_agree_first_difference(kKeys, kValues, 3, kKeys, kValues, 2, &key, &v0, &v), 2);
  assert_string_equal(key, "train.steps");
  assert_null(v);

  /* The rank has a key rank 0 lacks: past rank 0's end. */
  const char* k4[] = {"bundle.key", "train.lr", "train.steps", "train.seed"};
  const char* v4[] = {"b3f1", "0.001", "20", "7"};
  assert_int_equal(st__dist_agree_first_difference(kKeys, kValues, 3, k4, v4, 4, &key, &v0, &v), 6); /* n0 + its position in the rank's list */
  assert_string_equal(key, "train.seed");
  assert_null(v0);
  assert_string_equal(v, "7");

  /* Another order, same pairs: still a difference (named at rank 0's first
   * out-of-place key). */
  const char* kr[] = {"train.lr", "bundle.key", "train.steps"};
  const char* vr[] = {"0.001", "b3f1", "20"};
  assert_int_equal(st__dist_agree_first_difference(kKeys, kValues, 3, kr, vr, 3, &key, &v0, &v), 0);
  assert_string_equal(key, "bundle.key");
}

static void test_errors(void** state) {
  (void)state;
  tu_assert_error(st__dist_agree_error("train.lr", "0.001", 1, "0.002"), ST_CODE_CONFIG, "train.lr",
                  "rank 0 has 0.001", "rank 1 has 0.002", NULL);
  tu_assert_error(st__dist_agree_error("train.seed", NULL, 3, "7"), ST_CODE_CONFIG, "rank 0 has none", "rank 3 has 7", NULL);
  tu_assert_error(st__dist_agree_error("train.seed", "7", 2, NULL), ST_CODE_CONFIG, "rank 2 has none", NULL);
  tu_assert_error(st__dist_thread_level_error("MPI_THREAD_SERIALIZED"), ST_CODE_RUNTIME, "MPI_THREAD_SERIALIZED",
                  "needs MPI_THREAD_MULTIPLE", NULL);
  tu_assert_error(st__dist_kv_timeout_error("gpu:topology/1", 300, 2), ST_CODE_RUNTIME, "'gpu:topology/1'", "300 ms",
                  NULL);
  assert_int_equal(st_code_exit_code(ST_CODE_CONFIG), 2);
}

/*--- a job of one --------------------------------------------------------------------*/

static void test_job_of_one(void** state) {
  (void)state;
  st_dist_launch plain = {.launcher = ST_DIST_LAUNCHER_NONE, .world_size = 1, .local_rank = 0};
  st_dist* d = NULL;
  ASSERT_OK(st_dist_init(&plain, &d));
  assert_false(st_dist_multi(d));
  assert_int_equal(st_dist_size(d), 1);
  ASSERT_OK(st_dist_agree(d, kKeys, kValues, 3));
  tu_assert_error(st_dist_agree(d, NULL, kValues, 3), ST_CODE_INTERNAL, "NULL", NULL);

  ASSERT_OK(st_dist_kv_put(d, "a", "1", 1));
  ASSERT_OK(st_dist_kv_put(d, "a", "22", 2)); /* replaces */
  void* v = NULL;
  size_t n = 0;
  ASSERT_OK(st_dist_kv_get(d, "a", 0, &v, &n));
  assert_int_equal(n, 2);
  assert_string_equal((char*)v, "22");
  free(v);
  bool found = true;
  ASSERT_OK(st_dist_kv_try_get(d, "b", &found, &v, &n));
  assert_false(found);
  assert_null(v);
  double t0 = st_now();
  tu_assert_error(st_dist_kv_get(d, "b", 100, &v, &n), ST_CODE_RUNTIME, "'b'", "100 ms", NULL);
  double waited = st_now() - t0;
  assert_true(waited >= 0.09 && waited < 2.0);
  tu_assert_error(st_dist_kv_get(d, "b", -1, &v, &n), ST_CODE_INTERNAL, "negative timeout", NULL);
  tu_assert_error(st_dist_kv_put(d, "", "x", 1), ST_CODE_INTERNAL, "empty key", NULL);
  /* Nothing to abort in a job of one (or without one): it returns. */
  st_dist_abort(d, 4);
  st_dist_abort(NULL, 4);
  ASSERT_OK(st_dist_finalize(d));
  ASSERT_OK(st_dist_finalize(NULL));
}

/*--- collectives: the pure parts and a job of one ---------------------------------------*/

static void test_coll_pure(void** state) {
  (void)state;
  assert_string_equal(st_dist_coll_kind_name(ST_DIST_ALL_REDUCE), "all_reduce");
  assert_string_equal(st_dist_coll_kind_name(ST_DIST_REDUCE_SCATTER), "reduce_scatter");
  assert_string_equal(st_dist_coll_kind_name(ST_DIST_ALL_GATHER), "all_gather");
  /* An all-reduce pads to whole blocks; the others take multiples. */
  assert_int_equal(st__dist_coll_block(ST_DIST_ALL_REDUCE, 7, 3), 3);
  assert_int_equal(st__dist_coll_block(ST_DIST_ALL_REDUCE, 6, 3), 2);
  assert_int_equal(st__dist_coll_block(ST_DIST_ALL_REDUCE, 1, 3), 1);
  assert_int_equal(st__dist_coll_block(ST_DIST_ALL_REDUCE, 0, 3), 0);
  assert_int_equal(st__dist_coll_block(ST_DIST_REDUCE_SCATTER, 6, 3), 2);
  assert_int_equal(st__dist_coll_block(ST_DIST_ALL_GATHER, 1000, 2), 500);
  /* (size-1) blocks per phase, two phases for an all-reduce. */
  assert_int_equal(st__dist_coll_bytes(ST_DIST_ALL_REDUCE, 7, 3), 2 * 2 * 3 * 4);
  assert_int_equal(st__dist_coll_bytes(ST_DIST_REDUCE_SCATTER, 6, 3), 2 * 2 * 4);
  assert_int_equal(st__dist_coll_bytes(ST_DIST_ALL_GATHER, 1000, 2), 500 * 4);
  assert_int_equal(st__dist_coll_bytes(ST_DIST_ALL_REDUCE, 1000, 1), 0);

  /* Rank order: (1e8 + 1) - 1e8 is 0 in floats, 1 in any order that adds
   * the 1 last; rank 0's -0 stays -0 when alone. */
  const float recv[] = {1e8f, 1.0f, /* rank 1 */ 1.0f, 2.0f, /* rank 2 */ -1e8f, 3.0f};
  float out[2] = {42, 42};
  st__dist_coll_sum_ordered(recv, 2, 3, out);
  assert_true(out[0] == 0.0f);
  assert_true(out[1] == 6.0f);
  const float minus_zero[] = {-0.0f};
  st__dist_coll_sum_ordered(minus_zero, 1, 1, out);
  assert_true(out[0] == 0.0f && signbit(out[0]));
}

typedef struct coll_calls {
  int before, after;
  bool fail_before, fail_after;
} coll_calls;

static st_status coll_before(void* user) {
  coll_calls* c = user;
  c->before++;
  return c->fail_before ? st_status_make(ST_CODE_RUNTIME, "the copy to the host failed") : ST_OK;
}

static st_status coll_after(void* user) {
  coll_calls* c = user;
  c->after++;
  return c->fail_after ? st_status_make(ST_CODE_RUNTIME, "the copy back failed") : ST_OK;
}

static void test_coll_job_of_one(void** state) {
  (void)state;
  st_dist_launch plain = {.launcher = ST_DIST_LAUNCHER_NONE, .world_size = 1, .local_rank = 0};
  st_dist* d = NULL;
  ASSERT_OK(st_dist_init(&plain, &d));
  float data[7] = {1, 2, 3, 4, 5, 6, 7};
  coll_calls calls = {0};
  st_dist_coll_request req = {.kind = ST_DIST_ALL_REDUCE, .data = data, .count = 7, .before = coll_before,
                              .after = coll_after, .user = &calls, .name = "grad:w"};
  char text[128];
  for (int k = 0; k < 3; k++) {
    req.kind = (st_dist_coll_kind)k;
    st_dist_coll* c = NULL;
    ASSERT_OK(st_dist_coll_start(d, &req, &c));
    assert_true(st_dist_coll_done(c)); /* at once */
    assert_false(st_dist_coll_pending(d, text, sizeof(text)));
    st_dist_coll_timing t;
    ASSERT_OK(st_dist_coll_wait(c, &t));
    assert_true(t.queued_s <= t.started_s && t.started_s <= t.completed_s);
    assert_int_equal(t.bytes_sent, 0);
  }
  assert_int_equal(calls.before, 3);
  assert_int_equal(calls.after, 3);
  for (int i = 0; i < 7; i++) assert_true(data[i] == (float)(i + 1));

  /* A failing before(): the collective fails naming it; after() is not called. */
  calls = (coll_calls){.fail_before = true};
  st_dist_coll* c = NULL;
  ASSERT_OK(st_dist_coll_start(d, &req, &c));
  tu_assert_error(st_dist_coll_wait(c, NULL), ST_CODE_RUNTIME, "all_gather 'grad:w'", "before()",
                  "the copy to the host failed", NULL);
  assert_int_equal(calls.after, 0);
  calls = (coll_calls){.fail_after = true};
  ASSERT_OK(st_dist_coll_start(d, &req, &c));
  tu_assert_error(st_dist_coll_wait(c, NULL), ST_CODE_RUNTIME, "after()", "the copy back failed", NULL);

  /* Requests that cannot be carried out queue nothing. */
  st_dist_coll_request bad = req;
  bad.data = NULL;
  tu_assert_error(st_dist_coll_start(d, &bad, &c), ST_CODE_INTERNAL, "NULL data", "grad:w", NULL);
  assert_null(c);
  bad = req;
  bad.kind = (st_dist_coll_kind)9;
  tu_assert_error(st_dist_coll_start(d, &bad, &c), ST_CODE_INTERNAL, "unknown kind", NULL);
  tu_assert_error(st_dist_coll_start(d, &req, NULL), ST_CODE_INTERNAL, "NULL", NULL);
  tu_assert_error(st_dist_coll_wait(NULL, NULL), ST_CODE_INTERNAL, "NULL", NULL);
  bad = (st_dist_coll_request){.kind = ST_DIST_ALL_REDUCE, .count = 0}; /* nothing to do, no name */
  ASSERT_OK(st_dist_coll_start(d, &bad, &c));
  ASSERT_OK(st_dist_coll_wait(c, NULL));

  /* The blocking exchanges alone. */
  double in[2] = {1.5, -2}, out[2] = {0, 0};
  ASSERT_OK(st_dist_allgather_f64(d, in, 2, out));
  assert_true(out[0] == 1.5 && out[1] == -2);
  ASSERT_OK(st_dist_barrier(d));
  void* bytes = (void*)"abc";
  size_t n = 3;
  ASSERT_OK(st_dist_broadcast(d, &bytes, &n));
  assert_int_equal(n, 3);
  assert_string_equal((char*)bytes, "abc");
  tu_assert_error(st_dist_broadcast(d, NULL, &n), ST_CODE_INTERNAL, "NULL", NULL);

  /* Two not waited on: finalize frees them (ASan's leak check) and returns
   * the failed one's failure. */
  calls = (coll_calls){0};
  ASSERT_OK(st_dist_coll_start(d, &req, &c));
  calls.fail_before = true;
  ASSERT_OK(st_dist_coll_start(d, &req, &c));
  tu_assert_error(st_dist_finalize(d), ST_CODE_RUNTIME, "not waited on", "before()", NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_detect_plain),     cmocka_unit_test(test_detect_openmpi),
      cmocka_unit_test(test_detect_slurm),     cmocka_unit_test(test_detect_pmi),
      cmocka_unit_test(test_detect_job_of_one), cmocka_unit_test(test_detect_errors),
      cmocka_unit_test(test_hash),             cmocka_unit_test(test_pack_unpack),
      cmocka_unit_test(test_first_difference), cmocka_unit_test(test_errors),
      cmocka_unit_test(test_job_of_one),       cmocka_unit_test(test_coll_pure),
      cmocka_unit_test(test_coll_job_of_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
