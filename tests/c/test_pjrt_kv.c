/* test_pjrt_kv.c — the PJRT key-value callbacks (src/runtime/kv_callbacks.c)
 * that a client across processes uses, called as a plugin would call them:
 * hand-built argument structs, and a fake callback_error standing in for
 * the plugin's. The fake is this suite's one mock, and on purpose: the
 * callbacks are only ever called by a GPU plugin forming a client across
 * processes, and this machine has no GPU plugin (the CPU plugin refuses
 * node_id and never calls them). What the fake records is exactly what a
 * plugin receives: the error code and message strata hands back.
 *
 * Also: the adapters over dist's store in a job of one (st_dist_runtime_kv;
 * across real MPI ranks: mpi_dist_test pjrtkv), st_runtime_create refusing
 * a half-given store, and the CPU plugin given node_id (it refuses it, which
 * shows the option reaches the plugin). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/rt_internal.h"
#include "strata/base.h"
#include "strata/dist.h"
#include "strata/runtime.h"
#include "test_util.h"

/*--- the fake plugin side: callback_error ----------------------------------*/

/* The plugin's callback_error makes a PJRT_Error holding a copy of the
 * message; this one records the last call and returns a token pointer. */
static struct {
  int calls;
  int code;
  char message[1024];
} g_err;
static char g_error_token; /* what the "plugin" recognises as its error */

static pj_error* fake_callback_error(int code, const char* message, size_t size) {
  g_err.calls++;
  g_err.code = code;
  size_t n = size < sizeof(g_err.message) - 1 ? size : sizeof(g_err.message) - 1;
  memcpy(g_err.message, message, n);
  g_err.message[n] = '\0';
  return (pj_error*)&g_error_token;
}
static pj_callback_error_fn g_callback_error = fake_callback_error;

static void reset_err(void) { memset(&g_err, 0, sizeof(g_err)); }

/* |e| is the fake's error, made with |code|, its message holding every needle. */
static void expect_pj_error(pj_error* e, int code, ...) {
  assert_ptr_equal(e, (pj_error*)&g_error_token);
  assert_int_equal(g_err.calls, 1);
  if (g_err.code != code) fail_msg("code %d, wanted %d: %s", g_err.code, code, g_err.message);
  va_list ap;
  va_start(ap, code);
  const char* needle;
  while ((needle = va_arg(ap, const char*)))
    if (!strstr(g_err.message, needle)) fail_msg("message lacks '%s': %s", needle, g_err.message);
  va_end(ap);
  reset_err();
}
#define EXPECT_PJ_ERROR(e, code, ...) expect_pj_error((e), (code), __VA_ARGS__, (const char*)NULL)

/*--- a store of the plain st_runtime_kv kind --------------------------------*/

typedef struct fake_store {
  char key[8][64];
  char value[8][64];
  size_t size[8];
  int n;
  int64_t last_timeout;
  int calls;
  bool fail; /* every call fails, as a broken store would */
} fake_store;

static st_status fake_put(void* user, const char* key, const void* value, size_t size) {
  fake_store* f = user;
  f->calls++;
  if (f->fail) return st_status_make(ST_CODE_RUNTIME, "the fake store is down");
  assert_true(f->n < 8 && strlen(key) < 64 && size < 64);
  strcpy(f->key[f->n], key);
  memcpy(f->value[f->n], value, size);
  f->size[f->n++] = size;
  return ST_OK;
}

static st_status fake_look(fake_store* f, const char* key, bool* found, void** value, size_t* size) {
  f->calls++;
  if (f->fail) return st_status_make(ST_CODE_RUNTIME, "the fake store is down");
  *found = false;
  for (int i = f->n - 1; i >= 0; i--)
    if (!strcmp(f->key[i], key)) {
      *found = true;
      *size = f->size[i];
      char* v = malloc(f->size[i] + 1);
      memcpy(v, f->value[i], f->size[i]);
      v[f->size[i]] = '\0';
      *value = v;
      return ST_OK;
    }
  return ST_OK;
}

static st_status fake_get(void* user, const char* key, int64_t timeout_ms, bool* found, void** value, size_t* size) {
  ((fake_store*)user)->last_timeout = timeout_ms;
  return fake_look(user, key, found, value, size);
}

static st_status fake_try_get(void* user, const char* key, bool* found, void** value, size_t* size) {
  return fake_look(user, key, found, value, size);
}

static st_runtime_kv fake_kv(fake_store* f) {
  memset(f, 0, sizeof(*f));
  st_runtime_kv kv = {.put = fake_put, .get = fake_get, .try_get = fake_try_get, .user = f, .node_id = 1, .num_nodes = 2};
  return kv;
}

/*--- argument structs as a plugin fills them ---------------------------------*/

static pj_error* put(st_runtime_kv* kv, const char* key, size_t key_size, const char* value, size_t value_size) {
  pj_kv_put_args a = {.struct_size = sizeof(a), .key = key, .key_size = key_size, .value = value,
                      .value_size = value_size, .callback_error = &g_callback_error, .user = kv};
  return st__pjrt_kv_put(&a);
}

/* Fills *a as the plugin does (garbage in the outputs, as it may leave). */
static pj_error* get(st_runtime_kv* kv, const char* key, size_t key_size, int timeout_ms, pj_kv_get_args* a) {
  memset(a, 0x5a, sizeof(*a));
  a->struct_size = sizeof(*a);
  a->ext = NULL;
  a->key = key;
  a->key_size = key_size;
  a->timeout_in_ms = timeout_ms;
  a->callback_error = &g_callback_error;
  a->user = kv;
  return st__pjrt_kv_get(a);
}

static pj_error* try_get(st_runtime_kv* kv, const char* key, size_t key_size, pj_kv_try_get_args* a) {
  memset(a, 0x5a, sizeof(*a));
  a->struct_size = sizeof(*a);
  a->ext = NULL;
  a->key = key;
  a->key_size = key_size;
  a->callback_error = &g_callback_error;
  a->user = kv;
  return st__pjrt_kv_try_get(a);
}

/* A value handed back: its bytes, then released through the deleter the
 * callback set, as the plugin does after copying it (ASan checks the free). */
static void expect_kv_value(char* value, size_t size, pj_kv_value_deleter_fn deleter, const void* want, size_t want_size) {
  assert_non_null(deleter);
  assert_int_equal(size, want_size);
  if (want_size) assert_memory_equal(value, want, want_size);
  deleter(value);
}

/*--- tests -------------------------------------------------------------------*/

static void test_put_then_get(void** state) {
  (void)state;
  reset_err();
  fake_store f;
  st_runtime_kv kv = fake_kv(&f);
  /* Keys come as (pointer, size), not NUL-terminated: only 5 bytes count. */
  assert_null(put(&kv, "gpu:0XYZ", 5, "a\0b", 3));
  assert_string_equal(f.key[0], "gpu:0");
  assert_int_equal(f.size[0], 3);
  pj_kv_get_args g;
  assert_null(get(&kv, "gpu:0", 5, 2500, &g));
  assert_int_equal(f.last_timeout, 2500);
  expect_kv_value(g.value, g.value_size, g.value_deleter, "a\0b", 3);
  pj_kv_try_get_args t;
  assert_null(try_get(&kv, "gpu:0", 5, &t));
  expect_kv_value(t.value, t.value_size, t.value_deleter, "a\0b", 3);
  /* An empty value, given as NULL of size 0. */
  assert_null(put(&kv, "empty", 5, NULL, 0));
  assert_null(get(&kv, "empty", 5, 0, &g));
  expect_kv_value(g.value, g.value_size, g.value_deleter, "", 0);
  assert_int_equal(g_err.calls, 0);
}

static void test_timeout_and_missing(void** state) {
  (void)state;
  reset_err();
  fake_store f;
  st_runtime_kv kv = fake_kv(&f);
  pj_kv_get_args g;
  EXPECT_PJ_ERROR(get(&kv, "nccl_id:7", 9, 300, &g), PJ_CODE_DEADLINE_EXCEEDED, "'nccl_id:7'", "300 ms",
                  "node 1 of 2");
  assert_null(g.value);
  assert_int_equal(g.value_size, 0);
  pj_kv_try_get_args t;
  EXPECT_PJ_ERROR(try_get(&kv, "nccl_id:7", 9, &t), PJ_CODE_NOT_FOUND, "'nccl_id:7'");
  assert_null(t.value);
}

static void test_refusals(void** state) {
  (void)state;
  reset_err();
  fake_store f;
  st_runtime_kv kv = fake_kv(&f);
  /* A key holding a NUL would name another key in a C-string store. */
  pj_kv_get_args g;
  pj_kv_try_get_args t;
  EXPECT_PJ_ERROR(put(&kv, "a\0b", 3, "v", 1), PJ_CODE_INVALID_ARGUMENT, "NUL byte at offset 1");
  EXPECT_PJ_ERROR(get(&kv, "a\0b", 3, 10, &g), PJ_CODE_INVALID_ARGUMENT, "NUL");
  EXPECT_PJ_ERROR(try_get(&kv, "ab\0", 3, &t), PJ_CODE_INVALID_ARGUMENT, "offset 2");
  EXPECT_PJ_ERROR(get(&kv, NULL, 4, 10, &g), PJ_CODE_INVALID_ARGUMENT, "NULL key");
  EXPECT_PJ_ERROR(get(&kv, "k", 1, -1, &g), PJ_CODE_INVALID_ARGUMENT, "-1 ms");
  EXPECT_PJ_ERROR(put(&kv, "k", 1, NULL, 4), PJ_CODE_INVALID_ARGUMENT, "NULL value");
  assert_int_equal(f.calls, 0); /* none reached the store */
  /* No store behind the user argument. */
  EXPECT_PJ_ERROR(get(NULL, "k", 1, 10, &g), PJ_CODE_INTERNAL, "no store");
  st_runtime_kv half = kv;
  half.try_get = NULL;
  EXPECT_PJ_ERROR(put(&half, "k", 1, "v", 1), PJ_CODE_INTERNAL, "no store");
}

static void test_store_failure(void** state) {
  (void)state;
  reset_err();
  fake_store f;
  st_runtime_kv kv = fake_kv(&f);
  f.fail = true;
  pj_kv_get_args g;
  pj_kv_try_get_args t;
  EXPECT_PJ_ERROR(put(&kv, "k", 1, "v", 1), PJ_CODE_INTERNAL, "put 'k'", "the fake store is down");
  EXPECT_PJ_ERROR(get(&kv, "k", 1, 10, &g), PJ_CODE_INTERNAL, "get 'k'", "node 1 of 2", "the fake store is down");
  EXPECT_PJ_ERROR(try_get(&kv, "k", 1, &t), PJ_CODE_INTERNAL, "try-get 'k'", "the fake store is down");
  assert_int_equal(f.calls, 3);
}

/* A plugin breaking the contract (no callback_error): nothing to report
 * through, so the failure goes to stderr and the outputs stay empty. */
static void test_without_callback_error(void** state) {
  (void)state;
  reset_err();
  fake_store f;
  st_runtime_kv kv = fake_kv(&f);
  pj_kv_get_args g = {.struct_size = sizeof(g), .key = "k", .key_size = 1, .timeout_in_ms = 0, .user = &kv};
  assert_null(st__pjrt_kv_get(&g));
  assert_null(g.value);
  assert_int_equal(g.value_size, 0);
  assert_non_null(g.value_deleter);
  pj_callback_error_fn none = NULL;
  pj_kv_put_args p = {.struct_size = sizeof(p), .key = "a\0", .key_size = 2, .callback_error = &none, .user = &kv};
  assert_null(st__pjrt_kv_put(&p));
  assert_int_equal(f.n, 0);
  assert_int_equal(g_err.calls, 0);
  assert_null(st__pjrt_kv_get(NULL));
}

/* The adapters over dist's store in a job of one (no MPI): what
 * st_dist_runtime_kv hands the runtime. */
static void test_over_dist_job_of_one(void** state) {
  (void)state;
  reset_err();
  st_dist_launch one = {.launcher = ST_DIST_LAUNCHER_NONE, .multi = false, .world_size = 1, .rank = 0, .local_rank = 0};
  st_dist* d = NULL;
  ASSERT_OK(st_dist_init(&one, &d));
  st_runtime_kv kv;
  st_dist_runtime_kv(d, &kv);
  assert_int_equal(kv.node_id, 0);
  assert_int_equal(kv.num_nodes, 1);
  assert_ptr_equal(kv.user, d);
  assert_null(put(&kv, "topology", 8, "abc", 3));
  pj_kv_get_args g;
  assert_null(get(&kv, "topology", 8, 0, &g));
  expect_kv_value(g.value, g.value_size, g.value_deleter, "abc", 3);
  double t0 = st_now();
  EXPECT_PJ_ERROR(get(&kv, "absent", 6, 100, &g), PJ_CODE_DEADLINE_EXCEEDED, "'absent'", "100 ms");
  assert_true(st_now() - t0 >= 0.09);
  pj_kv_try_get_args t;
  EXPECT_PJ_ERROR(try_get(&kv, "absent", 6, &t), PJ_CODE_NOT_FOUND, "'absent'");
  assert_null(try_get(&kv, "topology", 8, &t));
  expect_kv_value(t.value, t.value_size, t.value_deleter, "abc", 3);
  /* The store's own refusal (an empty key) is INTERNAL with its message. */
  EXPECT_PJ_ERROR(put(&kv, "", 0, "v", 1), PJ_CODE_INTERNAL, "empty key");
  ASSERT_OK(st_dist_finalize(d));
  st_dist_runtime_kv(NULL, &kv);
  assert_null(kv.put);
}

/* st_runtime_create: a half-given store is refused before the plugin is
 * touched; a whole one reaches the CPU plugin as node_id, which it
 * refuses (the runtime says it was making a client across processes). */
static void test_runtime_create(void** state) {
  (void)state;
  fake_store f;
  st_runtime_options o;
  st_runtime_options_init(&o);
  o.cpu_devices = 1;
  o.kv = fake_kv(&f);
  o.kv.get = NULL;
  st_runtime* rt = NULL;
  ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_INTERNAL, "put, get and try_get");
  o.kv = fake_kv(&f);
  o.kv.node_id = 2;
  ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_INTERNAL, "node_id (2)");
  o.kv = fake_kv(&f);
  st_status s = st_runtime_create(&o, &rt);
  assert_int_equal(st_status_code(s), ST_CODE_RUNTIME);
  const char* msg = st_status_message(s);
  assert_non_null(strstr(msg, "one client across 2 processes (this one node 1)"));
  /* The plugin names whichever of the two it checked first. */
  if (!strstr(msg, "node_id") && !strstr(msg, "num_nodes")) fail_msg("the plugin's refusal names neither option: %s", msg);
  st_status_free(s);
  assert_null(rt);
  assert_int_equal(f.calls, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_then_get),       cmocka_unit_test(test_timeout_and_missing),
      cmocka_unit_test(test_refusals),           cmocka_unit_test(test_store_failure),
      cmocka_unit_test(test_without_callback_error), cmocka_unit_test(test_over_dist_job_of_one),
      cmocka_unit_test(test_runtime_create),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
