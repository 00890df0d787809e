/*
 * fuzz_diff.c — libFuzzer target for strata diff's readers and outputs
 * (st_diff_open over metrics.jsonl, context.json and notes.json of two run
 * directories; st_diff_text, st_diff_html, st_diff_json).
 *
 * Input: A's metrics.jsonl, NUL, B's metrics.jsonl, NUL, B's context.json,
 * NUL, B's notes.json (a missing part: the file is absent; A has a fixed
 * context.json), written into two scratch run directories whose
 * config.yaml is fixed (A: train.lr 0.003, B: 0.001).
 *
 * Properties: st_diff_open succeeds or fails with ST_CODE_CONFIG (exit 2:
 * bad input, named); on success train.lr is the one experiment key that
 * differs; the text and the page are valid UTF-8 without control bytes
 * other than tab and newline; the page has its 5 plots, no <script and no
 * nan/inf path coordinate; the JSON reads back; a first step over rtol
 * has a first bitwise difference at or before it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/obs.h"
#include "fuzz_util.h"

static char g_root[64];
static char g_dir[2][96];

static const char* const kFiles[] = {"metrics.jsonl", "context.json", "notes.json", "config.yaml"};

/* The scratch run directories go when the fuzzer exits. */
static void cleanup(void) {
  char path[160];
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 4; ++i) {
      snprintf(path, sizeof(path), "%s/%s", g_dir[r], kFiles[i]);
      unlink(path);
    }
    rmdir(g_dir[r]);
  }
  rmdir(g_root);
}

static void check_outputs(st_diff* d) {
  st_strbuf text = {0};
  st_diff_text(d, &text);
  if (!fuzz_valid_utf8((const unsigned char*)st_strbuf_cstr(&text), strlen(st_strbuf_cstr(&text)))) abort();
  st_strbuf_free(&text);
  char* html = st_diff_html(d);
  if (!fuzz_valid_utf8((const unsigned char*)html, strlen(html)) || strstr(html, "<script")) abort();
  int plots = 0;
  for (const char* p = html; (p = strstr(p, "<svg class=\"plot\"")); ++p) ++plots;
  if (plots != 5) abort();
  for (const char* p = html; (p = strstr(p, " d=\"")); ++p) {
    const char* end = strchr(p + 4, '"');
    if (!end) abort();
    for (const char* q = p + 4; q < end; ++q)
      if (*q == 'n' || *q == 'i') abort(); /* nan, inf */
  }
  free(html);
  const json_t* j = st_diff_json(d);
  char* dumped = st_json_dump(j, 0);
  json_t* back = NULL;
  st_status s = st_json_parse(dumped, strlen(dumped), "diff json", &back);
  if (s) abort();
  const json_t* differs = json_object_get(json_object_get(j, "config"), "differs");
  if (json_array_size(differs) != 1 ||
      strcmp(json_string_value(json_object_get(json_array_get(differs, 0), "key")), "train.lr"))
    abort();
  const json_t* loss = json_object_get(j, "loss");
  const json_t* bits = json_object_get(loss, "first_bitwise");
  const json_t* over = json_object_get(loss, "first_over_rtol");
  if (json_is_object(over) &&
      (!json_is_object(bits) || json_integer_value(json_object_get(bits, "step")) >
                                    json_integer_value(json_object_get(over, "step"))))
    abort();
  json_decref(back);
  free(dumped);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!g_root[0]) {
    snprintf(g_root, sizeof(g_root), "/tmp/fuzz_diff_XXXXXX");
    if (!mkdtemp(g_root)) abort();
    atexit(cleanup);
    for (int r = 0; r < 2; ++r) {
      snprintf(g_dir[r], sizeof(g_dir[r]), "%s/%s", g_root, r ? "b" : "a");
      if (mkdir(g_dir[r], 0700) != 0) abort();
      const char* cfg = r ? "train:\n  lr: 0.001\n" : "train:\n  lr: 0.003\n";
      fuzz_put_file(g_dir[r], "config.yaml", cfg, strlen(cfg));
    }
    static const char ctx[] = "{\"run_id\": \"a\", \"author\": \"x\", \"peak\": {\"flops\": 1}}";
    fuzz_put_file(g_dir[0], "context.json", ctx, sizeof(ctx) - 1);
  }
  const uint8_t* parts[4] = {NULL, NULL, NULL, NULL};
  size_t lens[4] = {0, 0, 0, 0};
  const uint8_t* p = data;
  size_t left = size;
  for (int i = 0; i < 4; ++i) {
    parts[i] = p;
    const uint8_t* nul = i < 3 ? memchr(p, 0, left) : NULL;
    lens[i] = nul ? (size_t)(nul - p) : left;
    if (!nul) {
      for (int k = i + 1; k < 4; ++k) parts[k] = NULL;
      break;
    }
    left -= lens[i] + 1;
    p = nul + 1;
  }
  fuzz_put_file(g_dir[0], "metrics.jsonl", parts[0], lens[0]);
  fuzz_put_file(g_dir[1], "metrics.jsonl", parts[1] ? parts[1] : (const uint8_t*)"", lens[1]);
  fuzz_put_file(g_dir[1], "context.json", parts[2], lens[2]);
  fuzz_put_file(g_dir[1], "notes.json", parts[3], lens[3]);
  st_diff* d = NULL;
  st_diff_options o = {.rtol = 1e-6, .samples = 10};
  st_status s = st_diff_open(g_dir[0], g_dir[1], &o, &d);
  if (s) {
    if (st_status_code(s) != ST_CODE_CONFIG) {
      fprintf(stderr, "diff failed with a class other than config: %s\n", st_status_message(s));
      abort();
    }
    st_status_free(s);
    return 0;
  }
  check_outputs(d);
  st_diff_free(d);
  return 0;
}
