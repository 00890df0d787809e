/*
 * fuzz_report.c — libFuzzer target for strata report's readers and page
 * (st_report_build over st_jsonl_read: metrics.jsonl, events.jsonl,
 * sample.txt of a run directory).
 *
 * Input: metrics.jsonl, NUL, events.jsonl, NUL, sample.txt (missing parts
 * are empty files), written into one scratch run directory.
 *
 * Properties: the build succeeds (bad lines are counted, never fatal); the
 * page is valid UTF-8 without control bytes other than tab and newline;
 * it has the 8 plots and no <script; no path coordinate is nan or inf;
 * lines counted do not exceed the input's newlines.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/base.h"
#include "strata/obs.h"
#include "fuzz_util.h"

static char g_dir[64];

/* The scratch run directory goes when the fuzzer exits. */
static void cleanup(void) {
  static const char* const names[] = {"metrics.jsonl", "events.jsonl", "sample.txt"};
  char path[128];
  for (int i = 0; i < 3; ++i) {
    snprintf(path, sizeof(path), "%s/%s", g_dir, names[i]);
    unlink(path);
  }
  rmdir(g_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!g_dir[0]) {
    snprintf(g_dir, sizeof(g_dir), "/tmp/fuzz_report_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    atexit(cleanup);
  }
  const uint8_t* parts[3] = {data, data + size, data + size};
  size_t lens[3] = {size, 0, 0};
  const uint8_t* nul = memchr(data, 0, size);
  if (nul) {
    lens[0] = (size_t)(nul - data);
    parts[1] = nul + 1;
    lens[1] = size - lens[0] - 1;
    const uint8_t* nul2 = memchr(parts[1], 0, lens[1]);
    if (nul2) {
      lens[1] = (size_t)(nul2 - parts[1]);
      parts[2] = nul2 + 1;
      lens[2] = size - (size_t)(parts[2] - data);
    }
  }
  fuzz_put_file(g_dir, "metrics.jsonl", parts[0], lens[0]);
  fuzz_put_file(g_dir, "events.jsonl", parts[1], lens[1]);
  fuzz_put_file(g_dir, "sample.txt", parts[2], lens[2]);
  char* html = NULL;
  st_report_stats stats;
  st_status s = st_report_build(g_dir, &html, &stats);
  if (s) {
    fprintf(stderr, "report failed: %s\n", st_status_message(s));
    abort();
  }
  size_t n = strlen(html);
  if (!fuzz_valid_utf8((const unsigned char*)html, n)) abort();
  if (strstr(html, "<script")) abort();
  int plots = 0;
  for (const char* p = html; (p = strstr(p, "<svg class=\"plot\"")); ++p) ++plots;
  if (plots != 8) abort();
  for (const char* p = html; (p = strstr(p, " d=\"")); ++p) {
    const char* end = strchr(p + 4, '"');
    if (!end) abort();
    for (const char* q = p + 4; q < end; ++q)
      if (*q == 'n' || *q == 'i') abort(); /* nan, inf ("a" arcs and letters M/L/Z are fine) */
  }
  size_t newlines = 0;
  for (size_t i = 0; i < size; ++i) newlines += data[i] == '\n';
  if ((size_t)(stats.step_lines + stats.eval_lines + stats.events + stats.bad_lines) > newlines) abort();
  free(html);
  return 0;
}
