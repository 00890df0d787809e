/* test_base.c — src/base: the one out-of-memory policy, the growable
 * buffer, the float formatter, JSON through jansson. */
#include <dirent.h>
#include <math.h>
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
#include <jansson.h>

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

/* The trainer's hook (issue 24): runs once, may allocate a little, and the
 * process exits 4 (ST_CODE_MEMORY) instead of aborting. */
static void hook_report(void* ctx, size_t bytes, const char* what) {
  char* copy = st_xstrdup((const char*)ctx); /* the reserve was freed: this much works */
  json_t* j = st_json_obj();
  st_json_put_int(j, "bytes", (int64_t)bytes);
  char* text = st_json_dump(j, 0);
  fprintf(stderr, "hook %s %s what=[%s]\n", copy, text, what);
  free(text);
  json_decref(j);
  free(copy);
}
static void hook_then_malloc(void) {
  st_oom_hook h;
  st_oom_hook_install(&h, hook_report, "ctx1");
  oom_malloc();
}
static void hook_then_st_oom(void) {
  st_oom_hook h;
  st_oom_hook_install(&h, hook_report, "ctx1");
  st_oom("libyaml");
}
static void hook_nested_removed(void) {
  st_oom_hook outer, inner;
  st_oom_hook_install(&outer, hook_report, "outer");
  st_oom_hook_install(&inner, hook_report, "inner");
  st_oom_hook_remove(&inner); /* the outer one is back */
  oom_realloc();
}
static void hook_removed(void) {
  st_oom_hook h;
  st_oom_hook_install(&h, hook_report, "gone");
  st_oom_hook_remove(&h);
  oom_malloc();
}
static void hook_failing_inside(void* ctx, size_t bytes, const char* what) {
  (void)ctx, (void)bytes, (void)what;
  oom_malloc(); /* a failure inside the hook aborts, it does not recurse */
}
static void hook_recursive(void) {
  st_oom_hook h;
  st_oom_hook_install(&h, hook_failing_inside, NULL);
  oom_calloc_overflow();
}

static void test_oom_hook(void** state) {
  (void)state;
  char err[4096];
  int status = run_child(hook_then_malloc, err, sizeof(err));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 4);
  assert_int_equal(st_code_exit_code(ST_CODE_MEMORY), 4);
  char want[128];
  snprintf(want, sizeof(want), "hook ctx1 {\"bytes\": %zu} what=[]", (size_t)g_huge);
  if (!strstr(err, want)) fail_msg("stderr '%s' lacks '%s'", err, want);
  assert_null(strstr(err, "strata: out of memory")); /* the hook speaks, not base */

  status = run_child(hook_then_st_oom, err, sizeof(err));
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 4);
  assert_non_null(strstr(err, "hook ctx1 {\"bytes\": 0} what=[libyaml]"));

  status = run_child(hook_nested_removed, err, sizeof(err));
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 4);
  assert_non_null(strstr(err, "hook outer "));
  assert_null(strstr(err, "inner"));

  status = run_child(hook_removed, err, sizeof(err));
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  assert_non_null(strstr(err, "strata: out of memory allocating"));
  assert_null(strstr(err, "hook"));

  status = run_child(hook_recursive, err, sizeof(err));
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  assert_non_null(strstr(err, "strata: out of memory allocating"));
}

static void test_memory_class_and_host(void** state) {
  (void)state;
  st_status s = st_status_make(ST_CODE_MEMORY, "x");
  assert_int_equal(st_status_exit_code(s), 4);
  assert_string_equal(st_code_name(ST_CODE_MEMORY), "out of memory");
  assert_string_equal(st_code_key(ST_CODE_MEMORY), "memory");
  assert_string_equal(st_code_key(ST_CODE_RUNTIME), "runtime");
  st_status_free(s);
  st_host_memory h;
  st_host_memory_read(&h);
  assert_true(h.known); /* Linux: /proc/meminfo */
  assert_true(h.total_bytes > 0 && h.available_bytes > 0 && h.available_bytes <= h.total_bytes);
  assert_true(h.available_bytes <= h.meminfo_available_bytes);
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
 * message in src/ outside base/alloc.c and the class's name in
 * base/status.c (an out-of-memory status is ST_CODE_MEMORY, made where
 * it is detected: the fit check, the st_xmalloc hook, PJRT's
 * RESOURCE_EXHAUSTED; never from a NULL test after an allocation). */
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
    if (!strcmp(e->d_name, "alloc.c") || !strcmp(e->d_name, "status.c")) continue;
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

/*--- JSON (jansson through st_json_*) ----------------------------------------*/

/* Any string survives a write and a read, and the text is valid JSON. */
static void test_json_strings_round_trip(void** state) {
  (void)state;
  const char* strs[] = {"plain", "q\"uote", "back\\slash", "new\nline\r\t", "ctl\x01\x1f\x7f", "non-ASCII é ü 漢 😀", "",
                        "{\"k\": [1, 2]}"};
  for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); ++i) {
    json_t* o = st_json_obj();
    st_json_put_str(o, strs[i], strs[i]); /* as key and as value */
    char* text = st_json_dump(o, 0);
    json_t* back = NULL;
    st_status s = st_json_parse(text, strlen(text), "test", &back);
    if (s) fail_msg("%s: %s", text, st_status_message(s));
    assert_string_equal(json_string_value(json_object_get(back, strs[i])), strs[i]);
    json_decref(back);
    json_decref(o);
    free(text);
  }
  /* Bytes that are not UTF-8 become U+FFFD: still valid JSON. */
  json_t* v = st_json_str("bad \xff\xfe end \xc3");
  char* text = st_json_dump(v, 0);
  assert_string_equal(text, "\"bad \xef\xbf\xbd\xef\xbf\xbd end \xef\xbf\xbd\"");
  json_t* back = NULL;
  assert_null(st_json_parse(text, strlen(text), "test", &back));
  json_decref(back);
  free(text);
  json_decref(v);
}

/* Reals read back to the same double; non-finite ones are null. */
static void test_json_numbers(void** state) {
  (void)state;
  const double xs[] = {0.1, 0.1 + 0.2, 1.0 / 3, 1e-8, 3e-4, 5e-324, 1.7976931348623157e308, -2.5, 10000.0, 5.5745022296905518};
  json_t* arr = st_json_arr();
  for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); ++i) st_json_push(arr, st_json_num(xs[i]));
  st_json_push(arr, st_json_num(NAN));
  st_json_push(arr, st_json_num(-INFINITY));
  char* text = st_json_dump(arr, 0);
  json_t* back = NULL;
  assert_null(st_json_parse(text, strlen(text), "test", &back));
  for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); ++i) assert_true(json_number_value(json_array_get(back, i)) == xs[i]);
  assert_true(json_is_null(json_array_get(back, sizeof(xs) / sizeof(xs[0]))));
  assert_true(json_is_null(json_array_get(back, sizeof(xs) / sizeof(xs[0]) + 1)));
  json_decref(back);
  free(text);
  json_decref(arr);
  /* Alone, short values are written short. */
  json_t* o = st_json_obj();
  st_json_put_num(o, "lr", 3e-4);
  st_json_put_num(o, "theta", 10000.0);
  st_json_put_num(o, "eps", 1e-8);
  st_json_put(o, "t", st_json_fixed(0.1234567, 3));
  st_json_put_int(o, "step", 7);
  text = st_json_dump(o, 0);
  assert_string_equal(text, "{\"lr\": 0.0003, \"theta\": 10000.0, \"eps\": 1e-8, \"t\": 0.123, \"step\": 7}");
  free(text);
  json_decref(o);
}

static void expect_parse_error(const char* text, const char* want) {
  json_t* j = NULL;
  st_status s = st_json_parse(text, strlen(text), "doc.json", &j);
  assert_null(j);
  if (!s) fail_msg("'%s' parsed", text);
  if (!strstr(st_status_message(s), want)) fail_msg("'%s': got '%s', want '%s'", text, st_status_message(s), want);
  assert_int_equal(st_status_code(s), ST_CODE_RUNTIME);
  st_status_free(s);
}

static void test_json_reader_bounds(void** state) {
  (void)state;
  char deep[200];
  size_t n = 0;
  for (int i = 0; i < ST_JSON_MAX_DEPTH; ++i) deep[n++] = '[';
  for (int i = 0; i < ST_JSON_MAX_DEPTH; ++i) deep[n++] = ']';
  deep[n] = '\0';
  json_t* j = NULL;
  assert_null(st_json_parse(deep, n, "deep", &j));
  json_decref(j);
  memmove(deep + 1, deep, n + 1);
  deep[0] = '[';
  deep[n + 1] = ']';
  deep[n + 2] = '\0';
  expect_parse_error(deep, "doc.json:1:65: invalid JSON: nested deeper than 64 levels");
  /* Brackets inside strings do not count. */
  const char* in_string = "[\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"\"]";
  assert_null(st_json_parse(in_string, strlen(in_string), "s", &j));
  json_decref(j);
  expect_parse_error("{\"a\": 1,\n \"a\": 2}", "doc.json:2:");
  expect_parse_error("[\"a\\u0000b\"]", "invalid JSON");
  expect_parse_error("{\"a\": }", "doc.json:1:");
  expect_parse_error("[1] x", "invalid JSON");
  expect_parse_error("[99999999999999999999]", "invalid JSON");
  expect_parse_error("\"\xff\"", "invalid JSON");
}

static void test_json_getters(void** state) {
  (void)state;
  json_t* j = NULL;
  const char* text = "{\"i\": 3, \"r\": 4.0, \"f\": 4.5, \"s\": \"x\", \"a\": [1]}";
  assert_null(st_json_parse(text, strlen(text), "g", &j));
  int64_t v = 0;
  assert_null(st_json_get_int(j, "i", "g", &v));
  assert_int_equal(v, 3);
  assert_null(st_json_get_int(j, "r", "g", &v)); /* an integral real is an integer */
  assert_int_equal(v, 4);
  st_status s = st_json_get_int(j, "f", "g", &v);
  assert_non_null(strstr(st_status_message(s), "g: 'f' is missing or not an integer"));
  st_status_free(s);
  const char* str = NULL;
  assert_null(st_json_get_string(j, "s", "g", &str));
  assert_string_equal(str, "x");
  s = st_json_get_string(j, "i", "g", &str);
  assert_non_null(s);
  st_status_free(s);
  const json_t* a = NULL;
  assert_null(st_json_get_array(j, "a", "g", &a));
  s = st_json_get_array(NULL, "a", "g", &a);
  assert_non_null(s);
  st_status_free(s);
  assert_true(st_json_same(json_object_get(j, "i"), json_object_get(json_object_get(j, "a"), 0)) == false);
  json_t* one = json_integer(4);
  assert_true(st_json_same(one, json_object_get(j, "r")));
  json_decref(one);
  json_decref(j);
}

/* Every hint strata prints for pasting (`strata resume DIR`) must be one
 * shell word whatever the directory is called: checked by running sh. */
static void test_shell_quote(void** state) {
  (void)state;
  const char* plain = "runs/a-b_c.1=x:y";
  char* q = st_shell_quote(plain);
  assert_string_equal(q, plain);
  free(q);
  q = st_shell_quote("");
  assert_string_equal(q, "''");
  free(q);
  const char* odd[] = {"my run", "it's", "a;b", "$(echo x)", "`x`", "a\\b", "tab\there", "*", "~user", "\"q\""};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; ++i) {
    q = st_shell_quote(odd[i]);
    st_strbuf cmd = {0};
    st_strbuf_append(&cmd, "printf %s ");
    st_strbuf_append(&cmd, q);
    FILE* f = popen(cmd.data, "r");
    assert_non_null(f);
    char got[256] = {0};
    size_t n = fread(got, 1, sizeof got - 1, f);
    got[n] = '\0';
    assert_int_equal(pclose(f), 0);
    assert_string_equal(got, odd[i]);
    st_strbuf_free(&cmd);
    free(q);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_oom_aborts_with_message),
      cmocka_unit_test(test_oom_hook),
      cmocka_unit_test(test_memory_class_and_host),
      cmocka_unit_test(test_alloc_never_null),
      cmocka_unit_test(test_format_double),
      cmocka_unit_test(test_one_allocation_path),
      cmocka_unit_test(test_json_strings_round_trip),
      cmocka_unit_test(test_json_numbers),
      cmocka_unit_test(test_json_reader_bounds),
      cmocka_unit_test(test_json_getters),
      cmocka_unit_test(test_shell_quote),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
