/* test_runtime_malloc.c — when the runtime applies its host malloc policy
 * (docs/runtime.md, "Host allocator"). The policy's effect, page faults per
 * step, is measured by `make bench` (a release build: under ASan, which these
 * tests run with, the sanitizer's allocator replaces glibc's). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "runtime/rt_internal.h"
#include "strata/runtime.h"

static void test_default_is_on(void** state) {
  (void)state;
  st_runtime_options o;
  st_runtime_options_init(&o);
  assert_true(o.tune_host_malloc);
  assert_true(st__malloc_tuning_wanted(o.tune_host_malloc, NULL, NULL, false));
}

static void test_option_and_opt_out(void** state) {
  (void)state;
  assert_false(st__malloc_tuning_wanted(false, NULL, NULL, false));
  assert_false(st__malloc_tuning_wanted(true, "0", NULL, false));
  /* Only "0" opts out; anything else keeps the default. */
  assert_true(st__malloc_tuning_wanted(true, "1", NULL, false));
  assert_true(st__malloc_tuning_wanted(true, "", NULL, false));
}

static void test_user_policy_wins(void** state) {
  (void)state;
  /* The user's own glibc malloc settings are never overridden... */
  assert_false(st__malloc_tuning_wanted(true, NULL, "glibc.malloc.arena_max=4", false));
  assert_false(st__malloc_tuning_wanted(true, NULL, "glibc.pthread.rseq=0:glibc.malloc.trim_threshold=1", false));
  assert_false(st__malloc_tuning_wanted(true, NULL, NULL, true)); /* MALLOC_ARENA_MAX & co */
  /* ...but tunables of other glibc subsystems do not count as a malloc policy. */
  assert_true(st__malloc_tuning_wanted(true, NULL, "glibc.pthread.rseq=0", false));
  assert_true(st__malloc_tuning_wanted(true, NULL, "", false));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_is_on),
      cmocka_unit_test(test_option_and_opt_out),
      cmocka_unit_test(test_user_policy_wins),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
