/* test_obs.c — the run log's line discipline (strata/obs.h): a torn last
 * line is cut before anything is appended, whatever its length and
 * wherever the previous newline is; whole lines are never touched; the
 * graceful-stop flag (strata/diag.h) records the first stop signal only;
 * the metrics endpoint's exposition text (escaping, nested objects,
 * non-finite values) and its refusal of a port in use; the run directory's
 * owner (names, paths, where a run goes, the claim and its lock); who ran
 * it (context.json's author). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/socket.h>
// clang-format off
#include <cmocka.h> /* after stddef.h, stdarg.h and setjmp.h, which it needs */
#include <jansson.h>
// clang-format on
#include "strata/base.h"
#include "strata/diag.h"
#include "strata/obs.h"
#include "test_util.h"

/* Writes |text| to <dir>/<name>, repairs it, checks the bytes cut and what is left. */
static void repair_case(const char* dir, const char* text, size_t len, long want_cut, size_t want_left) {
  char* path = st_path_join(dir, "log.jsonl");
  assert_int_equal(tu_write_file(path, text, len), 0);
  long cut = -1;
  st_status s = st_runlog_repair_tail(path, &cut);
  if (s) fail_msg("%s", st_status_message(s));
  assert_int_equal(cut, want_cut);
  size_t n = 0;
  char* left = tu_read_file(path, &n);
  assert_non_null(left);
  assert_int_equal(n, want_left);
  assert_memory_equal(left, text, n);
  free(left);
  free(path);
}

static void test_repair_tail(void** state) {
  (void)state;
  char* dir = tu_tmpdir("obs");
  assert_non_null(dir);
  repair_case(dir, "", 0, 0, 0);
  repair_case(dir, "{\"a\": 1}\n{\"b\": 2}\n", 18, 0, 18);
  repair_case(dir, "{\"a\": 1}\n{\"b\": ", 15, 6, 9);
  repair_case(dir, "{\"torn\": ", 9, 9, 0); /* no newline at all: all of it */
  /* A torn line longer than the 4096-byte read window, and one that ends
   * exactly at a window boundary. */
  size_t big = 10000;
  char* text = malloc(8192 + 4096 + 32); /* room for both cases */
  assert_non_null(text);
  memcpy(text, "{\"a\": 1}\n", 9);
  memset(text + 9, 'x', big - 9);
  repair_case(dir, text, big, (long)(big - 9), 9);
  memset(text, 'y', 8191);
  text[8191] = '\n';
  memset(text + 8192, 'z', 4096);
  repair_case(dir, text, 8192 + 4096, 4096, 8192);
  free(text);
  /* A missing file is nothing to repair. */
  char* none = st_path_join(dir, "none.jsonl");
  long cut = -1;
  assert_null(st_runlog_repair_tail(none, &cut));
  assert_int_equal(cut, 0);
  free(none);
  tu_rmtree(dir);
  free(dir);
}

/* st_runlog_open cuts the torn tails of both files and says so in a
 * log_repaired event; the next lines start lines of their own. */
static void test_open_repairs(void** state) {
  (void)state;
  char* dir = tu_tmpdir("obs");
  assert_non_null(dir);
  char* events = st_path_join(dir, "events.jsonl");
  char* metrics = st_path_join(dir, "metrics.jsonl");
  assert_int_equal(tu_write_file(events, "{\"event\": \"x\"}\n{\"ev", 19), 0);
  assert_int_equal(tu_write_file(metrics, "{\"step\": 1}\n{\"step\": 2, \"lo", 27), 0);
  st_runlog* log = NULL;
  fflush(stderr);
  int saved = dup(2);
  FILE* devnull = fopen("/dev/null", "w");
  dup2(fileno(devnull), 2); /* the warning is for users; the event is checked */
  st_status s = st_runlog_open(dir, &log);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fclose(devnull);
  if (s) fail_msg("%s", st_status_message(s));
  assert_null(st_runlog_metrics(log, json_pack("{s:i}", "step", 2)));
  st_runlog_close(log);
  size_t n = 0;
  char* m = tu_read_file(metrics, &n);
  assert_non_null(m);
  assert_int_equal(n, strlen("{\"step\": 1}\n{\"step\": 2}\n"));
  assert_memory_equal(m, "{\"step\": 1}\n{\"step\": 2}\n", n);
  free(m);
  char* e = tu_read_file(events, &n);
  assert_non_null(e);
  char* text = strndup(e, n);
  assert_true(!strncmp(text, "{\"event\": \"x\"}\n{\"time\": ", 24));
  assert_non_null(strstr(text, "\"event\": \"log_repaired\", \"file\": \"metrics.jsonl\", \"cut_bytes\": 15}\n"));
  assert_null(strstr(text, "{\"ev{"));
  free(text);
  free(e);
  free(events);
  free(metrics);
  tu_rmtree(dir);
  free(dir);
}

/* The handler keeps the first stop signal; the same one twice would end
 * the process (SA_RESETHAND), so the second one here is another signal. */
static void test_stop_flag(void** state) {
  (void)state;
  st_stop_guard g;
  st_stop_signals_install(&g);
  assert_int_equal(st_stop_signal(), 0);
  raise(SIGHUP);
  assert_int_equal(st_stop_signal(), SIGHUP);
  raise(SIGINT);
  assert_int_equal(st_stop_signal(), SIGHUP);
  assert_string_equal(st_signal_name(SIGHUP), "SIGHUP");
  st_stop_signals_restore(&g);
  struct sigaction now;
  sigaction(SIGTERM, NULL, &now);
  assert_true(now.sa_handler == g.old[0].sa_handler);
}

/* One metrics object, every shape the renderer knows: integers, reals,
 * null (a non-finite value in metrics.jsonl), a boolean, an object of
 * numbers, an object of objects, and what it leaves out (strings, lists,
 * empty objects); label values with a backslash, a quote and a newline. */
static void test_metrics_render(void** state) {
  (void)state;
  json_t* m = json_loads("{\"step\": 7, \"loss\": 2.5, \"grad_norm\": null, \"step_time_s\": 0.125,"
                         " \"tokens_per_s\": 1e6, \"note\": \"x\", \"list\": [1], \"empty\": {}, \"ok\": true,"
                         " \"peak_live_by_category\": {\"params\": 10, \"a\\\"b\\\\c\\nd\": -3},"
                         " \"collectives_by_kind\": {\"all_reduce\": {\"count\": 2, \"bytes\": 64},"
                         " \"all_gather\": {\"bytes\": 8}}, \"odd\": {\"k\": 1.5}}",
                         0, NULL);
  assert_non_null(m);
  st_strbuf b = {0};
  st_metrics_render(m, "r\"1\\", &b);
  const char* want =
      "# HELP strata_step The latest metrics.jsonl value of step (docs/using.md).\n"
      "# TYPE strata_step gauge\n"
      "strata_step{run=\"r\\\"1\\\\\"} 7\n"
      "# HELP strata_loss The latest metrics.jsonl value of loss (docs/using.md).\n"
      "# TYPE strata_loss gauge\n"
      "strata_loss{run=\"r\\\"1\\\\\"} 2.5\n"
      "# HELP strata_grad_norm The latest metrics.jsonl value of grad_norm (docs/using.md).\n"
      "# TYPE strata_grad_norm gauge\n"
      "strata_grad_norm{run=\"r\\\"1\\\\\"} NaN\n"
      "# HELP strata_step_time_seconds The latest metrics.jsonl value of step_time_s (docs/using.md).\n"
      "# TYPE strata_step_time_seconds gauge\n"
      "strata_step_time_seconds{run=\"r\\\"1\\\\\"} 0.125\n"
      "# HELP strata_tokens_per_second The latest metrics.jsonl value of tokens_per_s (docs/using.md).\n"
      "# TYPE strata_tokens_per_second gauge\n"
      "strata_tokens_per_second{run=\"r\\\"1\\\\\"} 1e6\n"
      "# HELP strata_ok The latest metrics.jsonl value of ok (docs/using.md).\n"
      "# TYPE strata_ok gauge\n"
      "strata_ok{run=\"r\\\"1\\\\\"} 1\n"
      "# HELP strata_peak_live_by_category_bytes The latest metrics.jsonl value of peak_live_by_category, by category "
      "(docs/using.md).\n"
      "# TYPE strata_peak_live_by_category_bytes gauge\n"
      "strata_peak_live_by_category_bytes{run=\"r\\\"1\\\\\",category=\"params\"} 10\n"
      "strata_peak_live_by_category_bytes{run=\"r\\\"1\\\\\",category=\"a\\\"b\\\\c\\nd\"} -3\n"
      "# HELP strata_collectives_by_kind_count The latest metrics.jsonl value of collectives_by_kind (member count), "
      "by kind (docs/using.md).\n"
      "# TYPE strata_collectives_by_kind_count gauge\n"
      "strata_collectives_by_kind_count{run=\"r\\\"1\\\\\",kind=\"all_reduce\"} 2\n"
      "# HELP strata_collectives_by_kind_bytes The latest metrics.jsonl value of collectives_by_kind (member bytes), "
      "by kind (docs/using.md).\n"
      "# TYPE strata_collectives_by_kind_bytes gauge\n"
      "strata_collectives_by_kind_bytes{run=\"r\\\"1\\\\\",kind=\"all_reduce\"} 64\n"
      "strata_collectives_by_kind_bytes{run=\"r\\\"1\\\\\",kind=\"all_gather\"} 8\n"
      "# HELP strata_odd The latest metrics.jsonl value of odd, by key (docs/using.md).\n"
      "# TYPE strata_odd gauge\n"
      "strata_odd{run=\"r\\\"1\\\\\",key=\"k\"} 1.5\n";
  assert_string_equal(st_strbuf_cstr(&b), want);
  st_strbuf_free(&b);
  json_decref(m);

  char v[ST_DOUBLE_CHARS];
  st_metrics_format_value(NAN, v);
  assert_string_equal(v, "NaN");
  st_metrics_format_value(INFINITY, v);
  assert_string_equal(v, "+Inf");
  st_metrics_format_value(-INFINITY, v);
  assert_string_equal(v, "-Inf");
  st_metrics_format_value(0.1, v);
  assert_string_equal(v, "0.1");
  st_metrics_format_value(3.0000000000000004, v);
  assert_string_equal(v, "3.0000000000000004");
}

/* A port held by another listener is a config error naming the key and
 * the port; once free, the same port serves, and a publish merges. */
static void test_metrics_port_in_use(void** state) {
  (void)state;
  if (!st_metrics_server_available()) {
    st_metrics_server* none = NULL;
    st_status s = st_metrics_server_start(9, "r", &none);
    assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
    assert_non_null(strstr(st_status_message(s), "obs.metrics_port=9: this strata binary was built without"));
    st_status_free(s);
    return;
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr*)&a, sizeof(a)), 0);
  assert_int_equal(listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  assert_int_equal(getsockname(fd, (struct sockaddr*)&a, &len), 0);
  int port = ntohs(a.sin_port);

  st_metrics_server* srv = NULL;
  st_status s = st_metrics_server_start(port, "r", &srv);
  assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
  char want[96];
  snprintf(want, sizeof(want), "obs.metrics_port=%d: cannot serve metrics on 127.0.0.1:%d", port, port);
  assert_non_null(strstr(st_status_message(s), want));
  assert_null(srv);
  st_status_free(s);
  close(fd);

  s = st_metrics_server_start(port, "r", &srv);
  if (s) fail_msg("%s", st_status_message(s));
  json_t* m = json_pack("{s:i, s:f}", "step", 3, "loss", 1.5);
  st_metrics_server_publish(srv, m);
  st_metrics_server_publish(NULL, m);
  json_decref(m);
  st_metrics_server_stop(srv);
  st_metrics_server_stop(NULL);
  s = st_metrics_server_start(0, "r", &srv);
  assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
  st_status_free(s);
}

/* st_jsonl_read: what it hands over and counts, for every way a line can
 * be bad, with a line bound smaller than the reader's 64 KiB chunk and
 * larger, and through a tail window that starts mid-line. */
typedef struct jl_seen {
  int n;
  int64_t steps[16];
  int64_t bytes[16];
  int stop_after;
} jl_seen;

static bool jl_keep(void* user, json_t* line, int64_t byte) {
  jl_seen* s = user;
  int64_t step = -1;
  st_json_as_int(json_object_get(line, "step"), &step);
  if (s->n < 16) s->steps[s->n] = step, s->bytes[s->n] = byte;
  s->n++;
  return s->stop_after == 0 || s->n < s->stop_after;
}

static void test_jsonl_read(void** state) {
  (void)state;
  char* dir = tu_tmpdir("jsonl");
  char* path = st_path_join(dir, "m.jsonl");
  st_strbuf b = {0};
  st_strbuf_append(&b, "{\"step\": 1}\n\nnot json\n[1]\n{\"step\": 2}\n");
  size_t long_at = b.len;
  st_strbuf_append(&b, "{\"step\": 3, \"pad\": \"");
  for (int i = 0; i < 200000; ++i) st_strbuf_append(&b, "x");
  st_strbuf_append(&b, "\"}\n{\"step\": 4}\n{\"step\": 5");
  assert_int_equal(tu_write_file(path, b.data, b.len), 0);
  for (int pass = 0; pass < 2; ++pass) {
    /* pass 0: a 1 KiB bound (the 200 kB line is too long); pass 1: 1 MiB (it is read). */
    jl_seen seen = {0};
    st_jsonl_stats js;
    st_status s = st_jsonl_read(path, 0, pass ? 1 << 20 : 1024, jl_keep, &seen, &js);
    if (s) fail_msg("%s", st_status_message(s));
    assert_int_equal(seen.n, pass ? 4 : 3);
    assert_int_equal(seen.steps[0], 1);
    assert_int_equal(seen.bytes[0], 0);
    assert_int_equal(seen.steps[1], 2);
    assert_int_equal(seen.steps[pass ? 3 : 2], 4);
    if (pass) assert_int_equal(seen.bytes[2], (int64_t)long_at);
    assert_int_equal(js.lines, seen.n);
    assert_int_equal(js.bad, pass ? 2 : 3);
    assert_int_equal(js.first_bad_byte, 13);
    assert_string_equal(js.first_bad_why, "not JSON");
    assert_true(js.torn);
    assert_int_equal(js.skipped_bytes, 0);
  }
  /* A tail window starting inside the long line: that line's end is dropped, not bad. */
  jl_seen seen = {0};
  st_jsonl_stats js;
  st_status s = st_jsonl_read(path, 1000, 1024, jl_keep, &seen, &js);
  if (s) fail_msg("%s", st_status_message(s));
  assert_int_equal(seen.n, 1);
  assert_int_equal(seen.steps[0], 4);
  assert_int_equal(js.bad, 0);
  assert_true(js.torn);
  assert_int_equal(js.skipped_bytes, (int64_t)b.len - 1000);
  /* The callback stops the read. */
  jl_seen first = {.stop_after = 1};
  s = st_jsonl_read(path, 0, 1024, jl_keep, &first, &js);
  if (s) fail_msg("%s", st_status_message(s));
  assert_int_equal(first.n, 1);
  /* Not a file. */
  ASSERT_ERROR(st_jsonl_read(dir, 0, 1024, jl_keep, &seen, &js), ST_CODE_CONFIG, "is not a regular file");
  char* missing = st_path_join(dir, "none.jsonl");
  ASSERT_ERROR(st_jsonl_read(missing, 0, 1024, jl_keep, &seen, &js), ST_CODE_IO, "cannot read");
  free(missing);
  st_strbuf_free(&b);
  free(path);
  tu_rmtree(dir);
  free(dir);
}

/* st_report_build: event details are cut to 300 bytes with an ellipsis;
 * texts of every length around the cut (one of them ends up 1 byte over)
 * must stay inside their buffer (ASan), and the page names the run. */
static void test_report_event_cut(void** state) {
  (void)state;
  char* dir = tu_tmpdir("report");
  char* path = st_path_join(dir, "events.jsonl");
  st_strbuf b = {0};
  for (int n = 230; n < 300; ++n) { /* dumped lengths 270 to 350 bytes */
    st_strbuf_append(&b, "{\"time\": 1, \"event\": \"e\", \"k\": \"");
    for (int i = 0; i < n; ++i) st_strbuf_append(&b, i % 7 ? "x" : "\u00e9");
    st_strbuf_append(&b, "\"}\n");
  }
  assert_int_equal(tu_write_file(path, b.data, b.len), 0);
  char* html = NULL;
  st_report_stats stats;
  st_status s = st_report_build(dir, &html, &stats);
  if (s) fail_msg("%s", st_status_message(s));
  assert_int_equal(stats.events, 70);
  assert_non_null(strstr(html, "\xe2\x80\xa6</td>"));
  assert_non_null(strstr(html, "no data"));
  free(html);
  ASSERT_ERROR(st_report_build(path, &html, NULL), ST_CODE_CONFIG, "is not a folder");
  st_strbuf_free(&b);
  free(path);
  tu_rmtree(dir);
  free(dir);
}

/* Saves an environment variable and sets (|value|) or unsets (NULL) it. */
static char* swap_env(const char* name, const char* value) {
  const char* old = getenv(name);
  char* saved = old ? strdup(old) : NULL;
  if (value) setenv(name, value, 1);
  else unsetenv(name);
  return saved;
}

/* context.json's author, from each source in turn: the override, git's
 * identity (given through git's own GIT_CONFIG_COUNT, which overrides every
 * config file), the login name when git is absent (PATH without it), and
 * "unknown" when even that is unset; never an error. */
static void test_context_author(void** state) {
  (void)state;
  static const char* const names[] = {"GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0", "GIT_CONFIG_KEY_1",
                                      "GIT_CONFIG_VALUE_1", "PATH", "USER", "LOGNAME"};
  char* saved[8];
  for (int i = 0; i < 8; ++i) saved[i] = getenv(names[i]) ? strdup(getenv(names[i])) : NULL;
  char out[256];
  assert_string_equal(st_context_author("Ada <a@example.org>", out, sizeof(out)), "config");
  assert_string_equal(out, "Ada <a@example.org>");
  setenv("GIT_CONFIG_COUNT", "2", 1);
  setenv("GIT_CONFIG_KEY_0", "user.name", 1);
  setenv("GIT_CONFIG_VALUE_0", "Grace Git", 1);
  setenv("GIT_CONFIG_KEY_1", "user.email", 1);
  setenv("GIT_CONFIG_VALUE_1", "grace@example.org", 1);
  assert_string_equal(st_context_author("", out, sizeof(out)), "git");
  assert_string_equal(out, "Grace Git <grace@example.org>");
  assert_string_equal(st_context_author(NULL, out, 8), "git"); /* cut to the buffer */
  assert_string_equal(out, "Grace G");
  setenv("PATH", "/nonexistent-strata-test", 1); /* no git */
  setenv("USER", "tester", 1);
  assert_string_equal(st_context_author(NULL, out, sizeof(out)), "env");
  assert_string_equal(out, "tester");
  unsetenv("USER");
  unsetenv("LOGNAME");
  assert_string_equal(st_context_author(NULL, out, sizeof(out)), "unknown");
  assert_string_equal(out, "unknown");
  st_context_facts facts = {.run_id = "r", .author = "Someone"};
  json_t* ctx = st_context_json(&facts);
  assert_string_equal(json_string_value(json_object_get(ctx, "author")), "Someone");
  assert_string_equal(json_string_value(json_object_get(ctx, "author_source")), "config");
  json_decref(ctx);
  for (int i = 0; i < 8; ++i) {
    free(swap_env(names[i], saved[i]));
    free(saved[i]);
  }
}

/* The run directory's table: every entry named, no two alike, and the
 * paths built from it; where a run goes by default. */
static void test_rundir_names(void** state) {
  (void)state;
  for (int i = 0; i < ST_RUNDIR_ENTRY_COUNT; ++i) {
    const char* a = st_rundir_name((st_rundir_entry)i);
    assert_non_null(a);
    assert_null(strchr(a, '/'));
    for (int j = 0; j < i; ++j) assert_string_not_equal(a, st_rundir_name((st_rundir_entry)j));
  }
  assert_null(st_rundir_name(ST_RUNDIR_ENTRY_COUNT));
  char* p = st_rundir_path("runs/x", ST_RUNDIR_CONFIG);
  assert_string_equal(p, "runs/x/config.yaml");
  free(p);
  p = st_rundir_path_in("runs/x/", ST_RUNDIR_DIAG, "faults.fired");
  assert_string_equal(p, "runs/x/diag/faults.fired");
  free(p);
  p = st_rundir_path_above("runs/x/checkpoints/step_2", ST_RUNDIR_TOKENIZER);
  assert_string_equal(p, "runs/x/checkpoints/step_2/../../tokenizer.json");
  free(p);
  assert_string_equal(st_rundir_id("a/runs/my-run"), "my-run");
  assert_string_equal(st_rundir_id("my-run"), "my-run");
  p = st_rundir_default("elsewhere/r", "ignored");
  assert_string_equal(p, "elsewhere/r");
  free(p);
  p = st_rundir_default("", "my-run");
  assert_string_equal(p, "runs/my-run");
  free(p);
  p = st_rundir_default(NULL, NULL);
  char tail[32];
  snprintf(tail, sizeof(tail), "-%d", (int)getpid());
  assert_int_equal(strncmp(p, "runs/", 5), 0);
  assert_int_equal(strlen(p), strlen("runs/YYYYmmdd-HHMMSS") + strlen(tail));
  assert_string_equal(p + strlen(p) - strlen(tail), tail);
  free(p);
}

/* A claim creates the folder, writes config.yaml and holds the lock; a
 * second claim is refused while it is held (exit 2, naming the holder); a
 * folder that holds a run is refused unless resumed, in each command's
 * words. */
static void test_rundir_claim(void** state) {
  (void)state;
  char* root = tu_tmpdir("rundir");
  char* dir = st_path_join(root, "runs/r1");
  st_config* cfg = NULL;
  ASSERT_OK(st_config_load(STRATA_SOURCE_DIR "/configs/test.yml", 0, NULL, &cfg));
  int fd = -1, fd2 = -1;
  bool reused = true;
  st_rundir_claim_options fresh = {.config = cfg};
  ASSERT_OK(st_rundir_claim(dir, &fresh, &fd, &reused));
  assert_true(fd >= 0);
  assert_false(reused);
  char* yaml = st_rundir_path(dir, ST_RUNDIR_CONFIG);
  assert_true(st_fs_exists(yaml));
  long holder = 0;
  ASSERT_OK(st_rundir_holder(dir, &holder));
  assert_int_equal(holder, (long)getpid());
  char pid[32];
  snprintf(pid, sizeof(pid), "pid %ld holds", (long)getpid());
  ASSERT_ERROR(st_rundir_claim(dir, &fresh, &fd2, NULL), ST_CODE_CONFIG, "is in use by another strata process", pid);
  assert_int_equal(fd2, -1);
  close(fd);
  /* Events only: an earlier attempt that stopped before its first step. */
  char* events = st_rundir_path(dir, ST_RUNDIR_EVENTS);
  assert_int_equal(tu_write_file(events, "{}\n", 3), 0);
  ASSERT_OK(st_rundir_claim(dir, &fresh, &fd, &reused));
  assert_true(reused);
  close(fd);
  /* A step recorded: the folder holds a run. */
  char* metrics = st_rundir_path(dir, ST_RUNDIR_METRICS);
  assert_int_equal(tu_write_file(metrics, "{\"step\": 1}\n", 12), 0);
  assert_true(st_rundir_has_run(dir));
  ASSERT_ERROR(st_rundir_claim(dir, &fresh, &fd, NULL), ST_CODE_CONFIG, "already holds a run", "`strata resume ");
  assert_int_equal(fd, -1);
  st_rundir_claim_options sup = {.supervisor = true};
  ASSERT_ERROR(st_rundir_claim(dir, &sup, &fd, NULL), ST_CODE_CONFIG, "already holds a run", "run.resume=true");
  st_rundir_claim_options resume = {.resume = true, .config = cfg};
  assert_int_equal(unlink(yaml), 0);
  ASSERT_OK(st_rundir_claim(dir, &resume, &fd, NULL));
  assert_false(st_fs_exists(yaml)); /* a resume writes it only once its checkpoint accepted it */
  close(fd);
  st_config_destroy(cfg);
  free(yaml);
  free(events);
  free(metrics);
  free(dir);
  tu_rmtree(root);
  free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_metrics_render),
      cmocka_unit_test(test_metrics_port_in_use),
      cmocka_unit_test(test_repair_tail),
      cmocka_unit_test(test_open_repairs),
      cmocka_unit_test(test_stop_flag),
      cmocka_unit_test(test_jsonl_read),
      cmocka_unit_test(test_report_event_cut),
      cmocka_unit_test(test_rundir_names),
      cmocka_unit_test(test_context_author),
      cmocka_unit_test(test_rundir_claim),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
