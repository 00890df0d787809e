/*
 * fuzz_config.c — libFuzzer target for the config path: YAML reading,
 * command-line overrides, schema checks, and the writers.
 *
 * Input: YAML text, then optionally a NUL and NUL-separated "key=value"
 * overrides (at most 8). Files are never opened: the text is loaded with
 * st__cfg_load_text, which rejects base_config.
 *
 * Besides "no crash, no sanitizer report, no leak", it checks properties:
 *   - every failure is a config error with a message (never internal);
 *   - a loaded config written as YAML loads back to the same hash, and
 *     writing that again gives the same bytes (the run snapshot promise).
 *
 * Build and run: `make fuzz` (FUZZ_SECONDS, default 60).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/internal.h"
#include "strata/config.h"

enum { kMaxOverrides = 8 };

static char* st__fuzz_write(st_status (*fn)(const st_config*, FILE*), const st_config* c, size_t* len) {
  char* data = NULL;
  FILE* m = open_memstream(&data, len);
  if (!m) abort();
  st_status s = fn(c, m);
  fclose(m);
  if (s) {
    fprintf(stderr, "writer failed: %s\n", st_status_message(s));
    abort();
  }
  return data;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  /* Copy so every override is NUL-terminated and nothing reads past |size|. */
  char* buf = malloc(size + 1);
  if (!buf) return 0;
  memcpy(buf, data, size);
  buf[size] = '\0';
  size_t yaml_len = strnlen(buf, size);
  char* overrides[kMaxOverrides];
  int n = 0;
  for (size_t pos = yaml_len + 1; pos < size && n < kMaxOverrides; pos += strlen(buf + pos) + 1)
    overrides[n++] = buf + pos;

  st_config* c = NULL;
  st_status s = st__cfg_load_text("fuzz.yml", buf, yaml_len, n, overrides, &c);
  if (s) {
    if (st_status_code(s) != ST_CODE_CONFIG || !st_status_message(s)[0]) {
      fprintf(stderr, "unexpected failure class: %s: %s\n", st_code_name(st_status_code(s)), st_status_message(s));
      abort();
    }
    if (c) abort(); /* no config on error */
    st_status_free(s);
    free(buf);
    return 0;
  }

  size_t yaml_out_len = 0, len = 0;
  char* yaml = st__fuzz_write(st_config_write_yaml, c, &yaml_out_len);
  free(st__fuzz_write(st_config_write_json, c, &len));
  free(st__fuzz_write(st_config_print_sources, c, &len));

  st_config* back = NULL;
  s = st__cfg_load_text("snapshot.yml", yaml, yaml_out_len, 0, NULL, &back);
  if (s) {
    fprintf(stderr, "the written YAML does not load: %s\n---\n%s---\n", st_status_message(s), yaml);
    abort();
  }
  char h1[17], h2[17];
  st_config_hash(c, NULL, 0, h1);
  st_config_hash(back, NULL, 0, h2);
  if (strcmp(h1, h2)) {
    fprintf(stderr, "hash changed across the snapshot: %s -> %s\n---\n%s---\n", h1, h2, yaml);
    abort();
  }
  size_t again_len = 0;
  char* again = st__fuzz_write(st_config_write_yaml, back, &again_len);
  if (again_len != yaml_out_len || memcmp(again, yaml, again_len)) {
    fprintf(stderr, "the snapshot is not stable:\n---\n%s---\n%s---\n", yaml, again);
    abort();
  }
  free(again);
  free(yaml);
  st_config_destroy(back);
  st_config_destroy(c);
  free(buf);
  return 0;
}
