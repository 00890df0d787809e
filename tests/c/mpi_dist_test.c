/* mpi_dist_test.c — strata/dist.h across real MPI processes. ctest runs each
 * case as `mpirun --oversubscribe -np 2 mpi_dist_test CASE` (CMakeLists.txt);
 * `plain` runs without a launcher and must neither initialise MPI nor print.
 *
 *   agree       same run: OK; one rank with another train.lr: both ranks
 *               fail naming it with both values; a key one rank lacks
 *   kv          put/get across ranks both ways, a get that waits for a later
 *               put, a get that times out (bounded, naming the key),
 *               try_get, empty and binary values, several threads of each
 *               rank putting and getting at once, finalize without hanging
 *   plain       a job of one: no MPI, local store, silent
 *
 * Each rank prints only failures ("rank R: ...") and exits 1 on one; mpirun
 * then exits non-zero. Two cases, not one per check: each mpirun and
 * MPI_Init costs about a second, and more under ASan's leak check. */
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strata/base.h"
#include "strata/dist.h"

/* Under ASan: the slow unwinder, so a leak inside Open MPI shows the
 * libmpi / libopen-pal frames that tests/c/lsan.supp names (the
 * libraries have no frame pointers, and MPI_Finalize unloads the
 * components the stacks start in). */
#if defined(__SANITIZE_ADDRESS__)
const char* __asan_default_options(void);
const char* __asan_default_options(void) { return "fast_unwind_on_malloc=0"; }
#endif

static int g_rank = -1;
static atomic_int g_failures; /* threads fail too */

static void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rank %d: ", g_rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  g_failures++;
}

#define CHECK(cond, ...)          \
  do {                            \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

static void check_ok(st_status s, const char* what) {
  if (s) fail("%s: %s", what, st_status_message(s));
  st_status_free(s);
}

/* |s| failed with |code| and a message containing every needle (NULL-ended). */
static void check_error(st_status s, st_code code, const char* what, ...) {
  if (!s) {
    fail("%s: expected an error, got OK", what);
    return;
  }
  if (st_status_code(s) != code) fail("%s: code %s: %s", what, st_code_name(st_status_code(s)), st_status_message(s));
  va_list ap;
  va_start(ap, what);
  const char* needle;
  while ((needle = va_arg(ap, const char*)))
    if (!strstr(st_status_message(s), needle)) fail("%s: no '%s' in: %s", what, needle, st_status_message(s));
  va_end(ap);
  st_status_free(s);
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static st_dist* start(void) {
  st_dist_launch l;
  check_ok(st_dist_detect(&l), "st_dist_detect");
  CHECK(l.multi && l.world_size == 2 && l.launcher == ST_DIST_LAUNCHER_OPENMPI,
        "detect: multi %d size %d launcher %s", l.multi, l.world_size, st_dist_launcher_name(l.launcher));
  st_dist* d = NULL;
  st_status s = st_dist_init(&l, &d);
  if (s) {
    fprintf(stderr, "st_dist_init: %s\n", st_status_message(s));
    st_status_free(s);
    exit(1);
  }
  g_rank = st_dist_rank(d);
  CHECK(st_dist_multi(d) && st_dist_size(d) == 2, "size %d", st_dist_size(d));
  CHECK(st_dist_local_rank(d) == g_rank, "local rank %d", st_dist_local_rank(d));
  return d;
}

static int finish(st_dist* d) {
  double t0 = st_now();
  check_ok(st_dist_finalize(d), "st_dist_finalize");
  CHECK(st_now() - t0 < 5.0, "finalize took %.1f s", st_now() - t0);
  return g_failures ? 1 : 0;
}

/*--- agree -------------------------------------------------------------------------*/

static int case_agree(void) {
  st_dist* d = start();
  const char* keys[] = {"bundle.key", "train.lr", "train.steps", "kernels", "plan.hash"};
  const char* same[] = {"b3f1", "0.001", "20", "matmul=c", "9a7e"};
  check_ok(st_dist_agree(d, keys, same, 5), "agree on the same run");

  /* Rank 1 was given another train.lr and another plan: the first key in
   * rank 0's order is the one named, on both ranks. */
  const char* other[] = {"b3f1", "0.002", "20", "matmul=c", "0000"};
  check_error(st_dist_agree(d, keys, g_rank == 1 ? other : same, 5), ST_CODE_CONFIG, "agree, train.lr differs",
              "train.lr", "rank 0 has 0.001", "rank 1 has 0.002", (const char*)NULL);

  /* Rank 1 lacks a key rank 0 has. */
  check_error(st_dist_agree(d, keys, same, g_rank == 1 ? 4 : 5), ST_CODE_CONFIG, "agree, a key missing",
              "plan.hash", "rank 0 has 9a7e", "rank 1 has none", (const char*)NULL);

  /* And the job goes on: an agreement after a failed one still works. */
  check_ok(st_dist_agree(d, keys, same, 5), "agree again");
  return finish(d);
}

/*--- threads ------------------------------------------------------------------------*/

enum { kThreads = 4, kRounds = 20 };

typedef struct worker {
  st_dist* d;
  int id;
} worker;

/* Each thread of each rank puts its own keys and reads the other rank's
 * twin thread's keys: replies must reach the thread that asked. */
static void* worker_main(void* arg) {
  worker* w = arg;
  int other = 1 - g_rank;
  for (int i = 0; i < kRounds; i++) {
    char key[64], want[64];
    snprintf(key, sizeof(key), "r%d/t%d/%d", g_rank, w->id, i);
    st_status s = st_dist_kv_put(w->d, key, key, strlen(key));
    if (s) {
      fail("thread %d put %s: %s", w->id, key, st_status_message(s));
      st_status_free(s);
      continue;
    }
    snprintf(want, sizeof(want), "r%d/t%d/%d", other, w->id, i);
    void* v = NULL;
    size_t n = 0;
    s = st_dist_kv_get(w->d, want, 10000, &v, &n);
    if (s || n != strlen(want) || memcmp(v, want, n) != 0) {
      fail("thread %d get %s: %s", w->id, want, s ? st_status_message(s) : "wrong value");
    }
    st_status_free(s);
    free(v);
  }
  return NULL;
}

static void run_threads(st_dist* d) {
  pthread_t t[kThreads];
  worker w[kThreads];
  for (int i = 0; i < kThreads; i++) {
    w[i] = (worker){.d = d, .id = i};
    pthread_create(&t[i], NULL, worker_main, &w[i]);
  }
  for (int i = 0; i < kThreads; i++) pthread_join(t[i], NULL);
}

/*--- kv ----------------------------------------------------------------------------*/

static void expect_value(st_dist* d, const char* key, int64_t timeout_ms, const void* want, size_t want_size) {
  void* v = NULL;
  size_t n = 0;
  st_status s = st_dist_kv_get(d, key, timeout_ms, &v, &n);
  if (s) {
    fail("get '%s': %s", key, st_status_message(s));
    st_status_free(s);
    return;
  }
  CHECK(n == want_size && memcmp(v, want, n) == 0, "get '%s': %zu bytes, wanted %zu", key, n, want_size);
  free(v);
}

static int case_kv(void) {
  st_dist* d = start();
  /* Both ways across ranks. */
  check_ok(st_dist_kv_put(d, g_rank == 0 ? "from0" : "from1", g_rank == 0 ? "zero" : "one", g_rank == 0 ? 4 : 3), "put");
  expect_value(d, "from0", 5000, "zero", 4);
  expect_value(d, "from1", 5000, "one", 3);

  /* A put replaces; empty and binary values. */
  if (g_rank == 1) {
    check_ok(st_dist_kv_put(d, "empty", NULL, 0), "put empty");
    check_ok(st_dist_kv_put(d, "bin", "a\0b\0", 4), "put binary");
    check_ok(st_dist_kv_put(d, "bin", "x\0y\0z", 5), "put binary again");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_value(d, "empty", 1000, "", 0);
  expect_value(d, "bin", 1000, "x\0y\0z", 5);

  /* try_get: there and not there. */
  bool found = true;
  void* v = NULL;
  size_t n = 0;
  check_ok(st_dist_kv_try_get(d, "nobody-put-this", &found, &v, &n), "try_get missing");
  CHECK(!found && v == NULL, "try_get missing: found %d", found);
  check_ok(st_dist_kv_try_get(d, "from0", &found, &v, &n), "try_get present");
  CHECK(found && n == 4 && memcmp(v, "zero", 4) == 0, "try_get present: found %d size %zu", found, n);
  free(v);

  /* A get that waits for a put made later, by the other rank. */
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = st_now();
  const char* late = g_rank == 0 ? "late-for-0" : "late-for-1";
  const char* give = g_rank == 0 ? "late-for-1" : "late-for-0";
  if (g_rank == 0) {
    sleep_s(0.3);
    check_ok(st_dist_kv_put(d, give, "L", 1), "put late");
    expect_value(d, late, 10000, "L", 1);
  } else {
    expect_value(d, late, 10000, "L", 1);
    check_ok(st_dist_kv_put(d, give, "L", 1), "put late");
  }
  double waited = st_now() - t0;
  CHECK(waited >= 0.25 && waited < 5.0, "the late get waited %.2f s", waited);

  /* A key nobody puts: a bounded wait and an error naming the key. */
  t0 = st_now();
  n = 0;
  v = NULL;
  check_error(st_dist_kv_get(d, "never-put", 300, &v, &n), ST_CODE_RUNTIME, "get of a missing key", "never-put",
              "300 ms", (const char*)NULL);
  waited = st_now() - t0;
  CHECK(waited >= 0.29 && waited < 3.0, "the missing key's get took %.2f s", waited);
  CHECK(v == NULL, "a failed get left a value");
  run_threads(d);
  return finish(d);
}

/*--- plain ------------------------------------------------------------------------------*/

static int case_plain(void) {
  /* Whatever ctest ran under, this process is started plainly. */
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", "PMI_SIZE",
                        "PMI_RANK", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) unsetenv(vars[i]);
  g_rank = 0;
  st_dist* d = NULL;
  check_ok(st_dist_init(NULL, &d), "st_dist_init");
  if (!d) return 1;
  CHECK(!st_dist_multi(d) && st_dist_size(d) == 1 && st_dist_rank(d) == 0, "not a job of one");
  const char* keys[] = {"train.lr"};
  const char* values[] = {"0.001"};
  check_ok(st_dist_agree(d, keys, values, 1), "agree alone");
  check_ok(st_dist_kv_put(d, "k", "v", 1), "put");
  expect_value(d, "k", 0, "v", 1);
  void* v = NULL;
  size_t n = 0;
  check_error(st_dist_kv_get(d, "missing", 50, &v, &n), ST_CODE_RUNTIME, "get missing", "missing", (const char*)NULL);
  check_ok(st_dist_finalize(d), "st_dist_finalize");
  int inited = 1, finalized = 1;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  CHECK(!inited && !finalized, "a plain process touched MPI (initialized %d, finalized %d)", inited, finalized);
  return g_failures ? 1 : 0;
}

int main(int argc, char** argv) {
  const char* c = argc > 1 ? argv[1] : "";
  if (strcmp(c, "agree") == 0) return case_agree();
  if (strcmp(c, "kv") == 0) return case_kv();
  if (strcmp(c, "plain") == 0) return case_plain();
  fprintf(stderr, "usage: mpi_dist_test agree|kv|plain\n");
  return 2;
}
