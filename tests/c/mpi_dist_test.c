/* mpi_dist_test.c — strata/dist.h across real MPI processes. ctest runs each
 * case as `mpirun --oversubscribe -np 2 mpi_dist_test CASE` (CMakeLists.txt;
 * coll also with -np 3); `plain` runs without a launcher and must neither
 * initialise MPI nor print.
 *
 *   agree       same run: OK; one rank with another train.lr: both ranks
 *               fail naming it with both values; a key one rank lacks
 *   kv          put/get across ranks both ways, a get that waits for a later
 *               put, a get that times out (bounded, naming the key),
 *               try_get, empty and binary values, several threads of each
 *               rank putting and getting at once, finalize without hanging
 *   coll        the collectives, any number of ranks: every kind at counts
 *               1, 7, 1000, 1<<20, all in flight at once, waited in reverse
 *               order, bitwise equal to a sum in rank order (values where
 *               the order matters with 3 ranks); the blocking exchanges
 *               meanwhile; before()/after() order and thread; a before()
 *               failing on one rank; pending naming a held collective;
 *               refusals; barrier, broadcast; finalize with one unwaited
 *   pjrtkv      the PJRT key-value callbacks (src/runtime/kv_callbacks.c)
 *               over dist's store (st_dist_runtime_kv), called as a GPU
 *               plugin would (hand-built argument structs; the plugin's
 *               callback_error is a stand-in: no GPU plugin here): put on
 *               rank 1, get on rank 0 and the reverse, a get that waits
 *               for a later put, a get that times out (DEADLINE_EXCEEDED
 *               naming the key, bounded), try-get NOT_FOUND, then present
 *   plain       a job of one: no MPI, local store, silent
 *
 * Each rank prints only failures ("rank R: ...") and exits 1 on one; mpirun
 * then exits non-zero. Two cases, not one per check: each mpirun and
 * MPI_Init costs about a second, and more under ASan's leak check. */
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/rt_internal.h" /* the PJRT key-value callbacks */
#include "strata/base.h"
#include "strata/dist.h"
#include "strata/runtime.h"

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

/* |size| ranks, or 0: any number above one. */
static st_dist* start_n(int size) {
  st_dist_launch l;
  check_ok(st_dist_detect(&l), "st_dist_detect");
  CHECK(l.multi && (size ? l.world_size == size : l.world_size > 1) && l.launcher == ST_DIST_LAUNCHER_OPENMPI,
        "detect: multi %d size %d launcher %s", l.multi, l.world_size, st_dist_launcher_name(l.launcher));
  size = l.world_size;
  st_dist* d = NULL;
  st_status s = st_dist_init(&l, &d);
  if (s) {
    fprintf(stderr, "st_dist_init: %s\n", st_status_message(s));
    st_status_free(s);
    exit(1);
  }
  g_rank = st_dist_rank(d);
  CHECK(st_dist_multi(d) && st_dist_size(d) == size, "size %d", st_dist_size(d));
  CHECK(st_dist_local_rank(d) == g_rank, "local rank %d", st_dist_local_rank(d));
  return d;
}

static st_dist* start(void) { return start_n(2); }

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

/*--- pjrtkv -----------------------------------------------------------------------------*/

/* The plugin's callback_error, as the plugin makes it: an error carrying a
 * copy of the code and message (freed by pj_err_take). */
typedef struct fake_pj_error {
  int code;
  char* message;
} fake_pj_error;

static pj_error* fake_callback_error(int code, const char* message, size_t size) {
  fake_pj_error* e = malloc(sizeof(*e));
  e->code = code;
  e->message = strndup(message, size);
  return (pj_error*)e;
}
static pj_callback_error_fn g_callback_error = fake_callback_error;

/* |e| is an error of |code| whose message holds |needle|; frees it. */
static void expect_pj(pj_error* e, int code, const char* needle, const char* what) {
  fake_pj_error* f = (fake_pj_error*)e;
  if (!f) {
    fail("%s: expected PJRT error %d, got success", what, code);
    return;
  }
  CHECK(f->code == code, "%s: PJRT error %d, wanted %d: %s", what, f->code, code, f->message);
  CHECK(strstr(f->message, needle) != NULL, "%s: message lacks '%s': %s", what, needle, f->message);
  free(f->message);
  free(f);
}

/* A call that should have succeeded returned |e|: report it and free it. */
static void unexpected_pj(pj_error* e, const char* what) {
  fake_pj_error* f = (fake_pj_error*)e;
  fail("%s: PJRT error %d: %s", what, f->code, f->message);
  free(f->message);
  free(f);
}

static void pj_put(st_runtime_kv* kv, const char* key, const char* value, size_t size) {
  pj_kv_put_args a = {.struct_size = sizeof(a), .key = key, .key_size = strlen(key), .value = value,
                      .value_size = size, .callback_error = &g_callback_error, .user = kv};
  pj_error* e = st__pjrt_kv_put(&a);
  if (e) unexpected_pj(e, key);
}

static pj_error* pj_get(st_runtime_kv* kv, const char* key, int timeout_ms, pj_kv_get_args* a) {
  *a = (pj_kv_get_args){.struct_size = sizeof(*a), .key = key, .key_size = strlen(key), .timeout_in_ms = timeout_ms,
                        .callback_error = &g_callback_error, .user = kv};
  return st__pjrt_kv_get(a);
}

/* A get that succeeds with |want|; the value released through the deleter. */
static void pj_expect(st_runtime_kv* kv, const char* key, int timeout_ms, const char* want, size_t want_size) {
  pj_kv_get_args a;
  pj_error* e = pj_get(kv, key, timeout_ms, &a);
  if (e) {
    unexpected_pj(e, key);
    return;
  }
  CHECK(a.value_size == want_size && memcmp(a.value, want, want_size) == 0 && a.value_deleter,
        "get '%s': %zu bytes, wanted %zu", key, a.value_size, want_size);
  if (a.value_deleter) a.value_deleter(a.value);
}

static int case_pjrtkv(void) {
  st_dist* d = start();
  st_runtime_kv kv;
  st_dist_runtime_kv(d, &kv);
  CHECK(kv.node_id == g_rank && kv.num_nodes == 2 && kv.user == d, "st_dist_runtime_kv: node %d of %d", kv.node_id,
        kv.num_nodes);
  /* Put on rank 1, get on rank 0 (rank 0 holds the store: its get is
   * local), and the reverse (rank 1's get goes over MPI). Binary values. */
  if (g_rank == 1) pj_put(&kv, "topology:1", "t\0one", 5);
  if (g_rank == 0) pj_put(&kv, "topology:0", "t\0zero", 6);
  pj_expect(&kv, "topology:1", 5000, "t\0one", 5);
  pj_expect(&kv, "topology:0", 5000, "t\0zero", 6);

  /* A get waiting for a put rank 1 makes later. */
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = st_now();
  if (g_rank == 1) {
    sleep_s(0.3);
    pj_put(&kv, "nccl_unique_id", "id", 2);
  } else {
    pj_expect(&kv, "nccl_unique_id", 10000, "id", 2);
    double waited = st_now() - t0;
    CHECK(waited >= 0.25 && waited < 5.0, "the late get waited %.2f s", waited);
  }

  /* A key nobody puts: DEADLINE_EXCEEDED naming it, within a bounded time,
   * on both ranks (rank 0's wait is local, rank 1's is rank 0's). */
  t0 = st_now();
  pj_kv_get_args a;
  expect_pj(pj_get(&kv, "never-put", 300, &a), PJ_CODE_DEADLINE_EXCEEDED, "'never-put'", "get of a missing key");
  double waited = st_now() - t0;
  CHECK(waited >= 0.29 && waited < 3.0, "the missing key's get took %.2f s", waited);
  CHECK(a.value == NULL && a.value_size == 0, "a failed get left a value");

  /* try-get: NOT_FOUND at once for a missing key, the value for a present one. */
  pj_kv_try_get_args t = {.struct_size = sizeof(t), .key = "never-put", .key_size = 9,
                          .callback_error = &g_callback_error, .user = &kv};
  t0 = st_now();
  expect_pj(st__pjrt_kv_try_get(&t), PJ_CODE_NOT_FOUND, "'never-put'", "try-get of a missing key");
  CHECK(st_now() - t0 < 2.0, "try-get of a missing key took %.2f s", st_now() - t0);
  t = (pj_kv_try_get_args){.struct_size = sizeof(t), .key = "topology:1", .key_size = 10,
                           .callback_error = &g_callback_error, .user = &kv};
  pj_error* e = st__pjrt_kv_try_get(&t);
  if (e) {
    unexpected_pj(e, "try-get of a present key");
  } else {
    CHECK(t.value_size == 5 && memcmp(t.value, "t\0one", 5) == 0, "try-get: %zu bytes", t.value_size);
    t.value_deleter(t.value);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return finish(d);
}

/*--- coll ------------------------------------------------------------------------------*/

/* Rank r's value at element i: magnitudes far apart (1e8, 1, -1e8 ...), so
 * with three ranks or more the order of the sum changes the result. */
static float contribution(int r, size_t i) {
  static const float base[] = {1e8f, 1.0f, -1e8f, 0.1f, 3e-3f, -2.5f, 7.0f};
  return base[(i + (size_t)r) % 7] * (float)(1 + (i + 3 * (size_t)r) % 5);
}

/* The sum the engine promises: rank 0's value, plus rank 1's, ... */
static float rank_order_sum(int size, size_t i) {
  float acc = contribution(0, i);
  for (int r = 1; r < size; r++) acc += contribution(r, i);
  return acc;
}

/* The count a case of |kind| uses: any for an all-reduce, else a multiple
 * of the size near |count|. */
static size_t case_count(st_dist_coll_kind kind, size_t count, int size) {
  if (kind == ST_DIST_ALL_REDUCE) return count;
  return count < (size_t)size ? (size_t)size : count - count % (size_t)size;
}

/* This rank's input: its contribution, or (all-gather) its own block and
 * NaN elsewhere. */
static void fill(st_dist_coll_kind kind, float* data, size_t count, int size) {
  size_t block = count / (size_t)size;
  for (size_t i = 0; i < count; i++)
    data[i] = kind != ST_DIST_ALL_GATHER || i / block == (size_t)g_rank ? contribution(g_rank, i) : NAN;
}

/* |data| holds what |kind| promises, bitwise. */
static bool check_result(st_dist_coll_kind kind, const float* data, size_t count, int size, const char* what) {
  size_t block = count / (size_t)size;
  size_t lo = kind == ST_DIST_REDUCE_SCATTER ? (size_t)g_rank * block : 0;
  size_t hi = kind == ST_DIST_REDUCE_SCATTER ? lo + block : count;
  for (size_t i = lo; i < hi; i++) {
    float want = kind == ST_DIST_ALL_GATHER ? contribution((int)(i / block), i) : rank_order_sum(size, i);
    if (memcmp(&want, &data[i], sizeof(want)) != 0) {
      fail("%s: element %zu of %zu is %.9g, want %.9g", what, i, count, (double)data[i], (double)want);
      return false;
    }
  }
  return true;
}

enum { kCollCases = 12 };

/* Every kind at counts 1, 7, 1000 and 1<<20, all in flight at once and
 * waited in reverse order, with the blocking exchanges on the main thread
 * meanwhile. */
static void coll_all_at_once(st_dist* d) {
  int size = st_dist_size(d);
  if (size >= 3) {
    /* The values do test the order: some element sums otherwise backwards. */
    bool differs = false;
    for (size_t i = 0; i < 100 && !differs; i++) {
      float back = contribution(size - 1, i);
      for (int r = size - 2; r >= 0; r--) back += contribution(r, i);
      differs = back != rank_order_sum(size, i);
    }
    CHECK(differs, "the test's values sum alike in either order");
  }
  const size_t counts[] = {1, 7, 1000, (size_t)1 << 20};
  float* data[kCollCases];
  size_t n[kCollCases];
  st_dist_coll* c[kCollCases];
  char names[kCollCases][64];
  for (int k = 0; k < kCollCases; k++) {
    st_dist_coll_kind kind = (st_dist_coll_kind)(k % 3);
    n[k] = case_count(kind, counts[k / 3], size);
    data[k] = malloc(n[k] * sizeof(float));
    fill(kind, data[k], n[k], size);
    snprintf(names[k], sizeof(names[k]), "case:%s/%zu", st_dist_coll_kind_name(kind), n[k]);
    st_dist_coll_request req = {.kind = kind, .data = data[k], .count = n[k], .name = names[k]};
    c[k] = NULL;
    check_ok(st_dist_coll_start(d, &req, &c[k]), names[k]);
  }
  double mine[2] = {(double)g_rank, g_rank * 10.0 + 0.5};
  double* all = calloc((size_t)size * 2, sizeof(double));
  check_ok(st_dist_allgather_f64(d, mine, 2, all), "allgather_f64 with collectives in flight");
  for (int r = 0; r < size; r++)
    CHECK(all[2 * r] == r && all[2 * r + 1] == r * 10.0 + 0.5, "allgather_f64: rank %d's values", r);
  free(all);
  check_ok(st_dist_barrier(d), "barrier with collectives in flight");
  for (int k = kCollCases - 1; k >= 0; k--) {
    if (!c[k]) continue;
    st_dist_coll_kind kind = (st_dist_coll_kind)(k % 3);
    st_dist_coll_timing t;
    st_status s = st_dist_coll_wait(c[k], &t);
    if (s) fail("%s: %s", names[k], st_status_message(s));
    st_status_free(s);
    check_result(kind, data[k], n[k], size, names[k]);
    CHECK(t.queued_s <= t.started_s && t.started_s <= t.completed_s, "%s: timing %.6f %.6f %.6f", names[k],
          t.queued_s, t.started_s, t.completed_s);
    size_t block = kind == ST_DIST_ALL_REDUCE ? (n[k] + (size_t)size - 1) / (size_t)size : n[k] / (size_t)size;
    int64_t want = (int64_t)(size - 1) * (int64_t)block * 4 * (kind == ST_DIST_ALL_REDUCE ? 2 : 1);
    CHECK(t.bytes_sent == want, "%s: %lld bytes sent, want %lld", names[k], (long long)t.bytes_sent, (long long)want);
    free(data[k]);
  }
  /* One at a time too. */
  for (int k = 0; k < 3; k++) {
    st_dist_coll_kind kind = (st_dist_coll_kind)k;
    size_t count = case_count(kind, 7, size);
    float buf[8];
    fill(kind, buf, count, size);
    st_dist_coll_request req = {.kind = kind, .data = buf, .count = count, .name = "one-at-a-time"};
    st_dist_coll* one = NULL;
    check_ok(st_dist_coll_start(d, &req, &one), "one at a time");
    if (one) check_ok(st_dist_coll_wait(one, NULL), "one at a time");
    check_result(kind, buf, count, size, st_dist_coll_kind_name(kind));
  }
}

enum { kCallbackColls = 6, kFailing = 2 };

typedef struct callback_coll {
  float data[1000];
  int id, size;
  atomic_int before_seq, after_seq;
  pthread_t before_thread, after_thread;
  bool fail;
} callback_coll;

static atomic_int g_seq;

/* The "device-to-host copy": the input is written here, not before start. */
static st_status cb_before(void* user) {
  callback_coll* c = user;
  atomic_store(&c->before_seq, atomic_fetch_add(&g_seq, 1) + 1);
  c->before_thread = pthread_self();
  fill(ST_DIST_ALL_REDUCE, c->data, 1000, 1);
  return c->fail ? st_status_make(ST_CODE_RUNTIME, "device copy %d failed", c->id) : ST_OK;
}

static st_status cb_after(void* user) {
  callback_coll* c = user;
  atomic_store(&c->after_seq, atomic_fetch_add(&g_seq, 1) + 1);
  c->after_thread = pthread_self();
  check_result(ST_DIST_ALL_REDUCE, c->data, 1000, c->size, "the data when after() runs");
  return ST_OK;
}

/* before() in queue order on the progress thread, after() after it with the
 * result in place; a before() that fails on one rank fails that collective
 * there alone. */
static void coll_callbacks(st_dist* d) {
  int size = st_dist_size(d);
  callback_coll* cc = calloc(kCallbackColls, sizeof(*cc));
  st_dist_coll* c[kCallbackColls];
  char names[kCallbackColls][32];
  for (int k = 0; k < kCallbackColls; k++) {
    cc[k].id = k;
    cc[k].size = size;
    cc[k].fail = k == kFailing && g_rank == 1;
    for (size_t i = 0; i < 1000; i++) cc[k].data[i] = NAN;
    snprintf(names[k], sizeof(names[k]), "grad:%d", k);
    st_dist_coll_request req = {.kind = ST_DIST_ALL_REDUCE, .data = cc[k].data, .count = 1000, .before = cb_before,
                                .after = cb_after, .user = &cc[k], .name = names[k]};
    c[k] = NULL;
    check_ok(st_dist_coll_start(d, &req, &c[k]), names[k]);
  }
  for (int k = 0; k < kCallbackColls; k++) {
    if (!c[k]) continue;
    st_status s = st_dist_coll_wait(c[k], NULL);
    if (cc[k].fail) {
      check_error(s, ST_CODE_RUNTIME, "failing before()", "all_reduce 'grad:2'", "before()", "device copy 2 failed",
                  (const char*)NULL);
      CHECK(cc[k].after_seq == 0, "after() was called for a collective whose before() failed");
      continue;
    }
    check_ok(s, names[k]);
    check_result(ST_DIST_ALL_REDUCE, cc[k].data, 1000, size, names[k]);
    CHECK(cc[k].after_seq > cc[k].before_seq, "%s: after() (%d) not after before() (%d)", names[k],
          (int)cc[k].after_seq, (int)cc[k].before_seq);
    CHECK(pthread_equal(cc[k].after_thread, cc[0].before_thread), "%s: after() on another thread", names[k]);
  }
  for (int k = 0; k < kCallbackColls; k++) {
    CHECK(k == 0 || cc[k].before_seq > cc[k - 1].before_seq, "before() of %d ran before %d's", k, k - 1);
    CHECK(pthread_equal(cc[k].before_thread, cc[0].before_thread), "before() %d on another thread", k);
  }
  CHECK(!pthread_equal(cc[0].before_thread, pthread_self()), "before() on the main thread");
  free(cc);
}

typedef struct held {
  atomic_bool entered, release;
} held;

static st_status hold_before(void* user) {
  held* h = user;
  atomic_store(&h->entered, true);
  double t0 = st_now();
  while (!atomic_load(&h->release) && st_now() - t0 < 20) sleep_s(1e-3);
  return ST_OK;
}

/* Polls st_dist_coll_pending until its text has |needle| (10 s at most). */
static void expect_pending(st_dist* d, const char* needle) {
  char text[256] = "";
  double t0 = st_now();
  while (st_now() - t0 < 10) {
    if (st_dist_coll_pending(d, text, sizeof(text)) && strstr(text, needle) && strstr(text, "all_reduce 'grad:held'"))
      return;
    sleep_s(1e-3);
  }
  fail("pending never said '%s' of grad:held; last: '%s'", needle, text);
}

/* The watchdog's view: rank 0 is held in before(), so its collective is
 * "in its before() callback" there and waits for rank 0 elsewhere. The
 * ranks tell each other what they saw through the store. */
static void coll_pending(st_dist* d) {
  char text[256] = "x";
  CHECK(!st_dist_coll_pending(d, text, sizeof(text)) && !text[0], "pending with nothing pending: '%s'", text);
  float buf[10];
  fill(ST_DIST_ALL_REDUCE, buf, 10, st_dist_size(d));
  held h = {0};
  st_dist_coll_request req = {.kind = ST_DIST_ALL_REDUCE, .data = buf, .count = 10, .name = "grad:held"};
  if (g_rank == 0) {
    req.before = hold_before;
    req.user = &h;
  }
  st_dist_coll* c = NULL;
  check_ok(st_dist_coll_start(d, &req, &c), "start grad:held");
  if (g_rank == 0) {
    expect_pending(d, "in its before() callback");
    for (int r = 1; r < st_dist_size(d); r++) {
      char key[32];
      snprintf(key, sizeof(key), "pending-seen/%d", r);
      void* v = NULL;
      size_t n = 0;
      check_ok(st_dist_kv_get(d, key, 20000, &v, &n), key);
      free(v);
    }
    atomic_store(&h.release, true);
  } else {
    expect_pending(d, "waiting for the other ranks");
    char key[32];
    snprintf(key, sizeof(key), "pending-seen/%d", g_rank);
    check_ok(st_dist_kv_put(d, key, "1", 1), key);
  }
  if (c) check_ok(st_dist_coll_wait(c, NULL), "wait grad:held");
  check_result(ST_DIST_ALL_REDUCE, buf, 10, st_dist_size(d), "grad:held");
  CHECK(!st_dist_coll_pending(d, text, sizeof(text)), "pending after the wait: '%s'", text);
}

/* Refusals are alike on every rank and queue nothing; the blocking exchanges. */
static void coll_refusals_and_blocking(st_dist* d) {
  int size = st_dist_size(d);
  float buf[7] = {0};
  st_dist_coll* c = NULL;
  st_dist_coll_request bad = {.kind = ST_DIST_REDUCE_SCATTER, .data = buf, .count = 7, .name = "grad:odd"};
  check_error(st_dist_coll_start(d, &bad, &c), ST_CODE_INTERNAL, "odd reduce-scatter", "grad:odd",
              "not a multiple", (const char*)NULL);
  bad.kind = ST_DIST_ALL_GATHER;
  check_error(st_dist_coll_start(d, &bad, &c), ST_CODE_INTERNAL, "odd all-gather", "not a multiple", (const char*)NULL);
  fill(ST_DIST_ALL_REDUCE, buf, 7, size);
  st_dist_coll_request ok = {.kind = ST_DIST_ALL_REDUCE, .data = buf, .count = 7, .name = "after-refusals"};
  check_ok(st_dist_coll_start(d, &ok, &c), "start after refusals");
  if (c) check_ok(st_dist_coll_wait(c, NULL), "wait after refusals");
  check_result(ST_DIST_ALL_REDUCE, buf, 7, size, "after refusals");

  /* A barrier holds every rank until the last arrives. */
  double t0 = st_now();
  if (g_rank == size - 1) sleep_s(0.3);
  check_ok(st_dist_barrier(d), "barrier");
  CHECK(st_now() - t0 >= 0.25, "the barrier let rank %d through after %.3f s", g_rank, st_now() - t0);

  /* Broadcast: text, nothing, and rank 0 given NULL data (every rank fails). */
  void* data = g_rank == 0 ? (void*)"hello\0world" : NULL;
  size_t n = g_rank == 0 ? 11 : 99;
  check_ok(st_dist_broadcast(d, &data, &n), "broadcast");
  CHECK(n == 11 && data && memcmp(data, "hello\0world", 11) == 0, "broadcast: %zu bytes", n);
  if (g_rank != 0) free(data);
  data = g_rank == 0 ? (void*)"" : NULL;
  n = 0;
  check_ok(st_dist_broadcast(d, &data, &n), "broadcast of nothing");
  CHECK(n == 0 && data && ((char*)data)[0] == '\0', "broadcast of nothing: %zu bytes", n);
  if (g_rank != 0) free(data);
  data = NULL;
  n = 5;
  check_error(st_dist_broadcast(d, &data, &n), ST_CODE_INTERNAL, "broadcast of NULL", "rank 0 was given NULL data",
              (const char*)NULL);
  CHECK(g_rank == 0 || data == NULL, "a failed broadcast left data");
}

static int case_coll(void) {
  st_dist* d = start_n(0);
  coll_all_at_once(d);
  coll_callbacks(d);
  coll_pending(d);
  coll_refusals_and_blocking(d);
  /* One left unwaited: finalize completes it on every rank and frees it. */
  float buf[1000];
  fill(ST_DIST_ALL_REDUCE, buf, 1000, st_dist_size(d));
  st_dist_coll_request req = {.kind = ST_DIST_ALL_REDUCE, .data = buf, .count = 1000, .name = "unwaited"};
  st_dist_coll* c = NULL;
  check_ok(st_dist_coll_start(d, &req, &c), "start unwaited");
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
  if (strcmp(c, "coll") == 0) return case_coll();
  if (strcmp(c, "pjrtkv") == 0) return case_pjrtkv();
  if (strcmp(c, "plain") == 0) return case_plain();
  fprintf(stderr, "usage: mpi_dist_test agree|kv|pjrtkv|coll|plain\n");
  return 2;
}
