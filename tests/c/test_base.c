/* test_base.c — src/base: the one out-of-memory policy, the growable
 * buffer, the float formatter. */
#include <dirent.h>
#include <regex.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h> /* after stddef.h, stdarg.h and setjmp.h, which it needs */

#include "strata/base.h"
#include "test_util.h"

/* Under ASan an impossible allocation must come back as NULL, as it does
 * from glibc, so the test sees strata's own OOM path. */
const char* __asan_default_options(void);
const char* __asan_default_options(void) { return "allocator_may_return_null=1"; }

/* Runs |fn| in a child with stderr captured; returns the child's wait status. */
static int run_child(void (*fn)(void), char* err, size_t err_cap) {
  char path[] = "/tmp/strata-test-base-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fd, 2);
    fn();
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  ssize_t n = pread(fd, err, err_cap - 1, 0);
  err[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
  return status;
}

static volatile size_t g_huge = SIZE_MAX / 2; /* volatile: the compiler must not see through it */

static void oom_malloc(void) { free(st_xmalloc(g_huge)); }
static void oom_calloc_overflow(void) { free(st_xcalloc(g_huge, 4)); }
static void oom_realloc(void) {
  char* p = st_xmalloc(8);
  p = st_xrealloc(p, g_huge);
  free(p);
}
static void oom_strbuf(void) {
  st_strbuf b = {0};
  st_strbuf_append(&b, "x");
  b.len = g_huge; /* the next append asks for more than any host has */
  st_strbuf_append(&b, "y");
}

/* One policy: allocation failure aborts, with a message, from every path. */
static void test_oom_aborts_with_message(void** state) {
  (void)state;
  void (*fns[])(void) = {oom_malloc, oom_calloc_overflow, oom_realloc, oom_strbuf};
  for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); ++i) {
    char err[4096];
    int status = run_child(fns[i], err, sizeof(err));
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    assert_non_null(strstr(err, "strata: out of memory"));
  }
}

static void test_alloc_never_null(void** state) {
  (void)state;
  void* p = st_xmalloc(0);
  assert_non_null(p);
  free(p);
  p = st_xcalloc(0, 8);
  assert_non_null(p);
  free(p);
  char* s = st_xstrdup(NULL);
  assert_string_equal(s, "");
  free(s);
  s = st_xstrndup("abcdef", 3);
  assert_string_equal(s, "abc");
  free(s);
  /* Joining two empty parts used to return NULL (an empty buffer's data). */
  s = st_path_join("", "");
  assert_non_null(s);
  assert_string_equal(s, "");
  free(s);
  st_strbuf b = {0};
  s = st_strbuf_take(&b);
  assert_string_equal(s, "");
  free(s);
}

static void test_format_double(void** state) {
  (void)state;
  char b[ST_DOUBLE_CHARS];
  const double xs[] = {0.1, 0.1 + 0.2, 1e-8, 3e-4, 1e300, -2.5, 5e-324, 1.0 / 3, 123456789012345678.0, 0};
  for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); ++i) {
    st_format_double(xs[i], b);
    assert_true(strtod(b, NULL) == xs[i]);
  }
  st_format_double(0.1, b);
  assert_string_equal(b, "0.1");
  st_format_double(1e-8, b);
  assert_string_equal(b, "1e-8");
  st_format_double(1.0 / 0.0, b);
  assert_string_equal(b, "inf");
}

/* The policy holds everywhere: no raw allocator call and no "out of memory"
 * status in src/ outside base/alloc.c. */
static void scan_dir(const char* dir, regex_t* raw, int* bad) {
  DIR* d = opendir(dir);
  assert_non_null(d);
  struct dirent* e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[2048];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    size_t n = strlen(e->d_name);
    if (e->d_type == DT_DIR) {
      scan_dir(path, raw, bad);
      continue;
    }
    if (n < 2 || (strcmp(e->d_name + n - 2, ".c") && strcmp(e->d_name + n - 2, ".h"))) continue;
    if (!strcmp(e->d_name, "alloc.c")) continue;
    size_t size = 0;
    char* text = tu_read_file(path, &size);
    assert_non_null(text);
    text = realloc(text, size + 1);
    text[size] = '\0';
    int line = 1;
    for (char* p = text; *p;) {
      char* eol = strchr(p, '\n');
      if (eol) *eol = '\0';
      if (regexec(raw, p, 0, NULL, 0) == 0 || strstr(p, "\"out of memory") || strstr(p, "out of memory (")) {
        fprintf(stderr, "%s:%d: %s\n", path, line, p);
        ++*bad;
      }
      ++line;
      if (!eol) break;
      p = eol + 1;
    }
    free(text);
  }
  closedir(d);
}

static void test_one_allocation_path(void** state) {
  (void)state;
  regex_t raw;
  assert_int_equal(regcomp(&raw, "(^|[^_[:alnum:].>])(malloc|calloc|realloc|strdup|strndup)[[:space:]]*\\(", REG_EXTENDED),
                   0);
  int bad = 0;
  scan_dir(STRATA_SOURCE_DIR "/src", &raw, &bad);
  regfree(&raw);
  assert_int_equal(bad, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_oom_aborts_with_message),
      cmocka_unit_test(test_alloc_never_null),
      cmocka_unit_test(test_format_double),
      cmocka_unit_test(test_one_allocation_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
