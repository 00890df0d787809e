/*
 * fuzz_json.c — libFuzzer target for the JSON reader behind manifests
 * (st_json_parse: strata's depth bound in front of jansson). Kept to the
 * reader's public entry point only, so it follows the reader when the
 * implementation changes.
 *
 * Properties: a refusal has a message and no tree; an accepted tree
 * survives a walk (every key found again: duplicates are refused), the
 * integer helper never misreads a number, and a dump parses back equal.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"

static void st__walk(const json_t* j, int depth) {
  if (depth > 1000) abort();
  if (json_is_object(j)) {
    const char* key;
    json_t* v;
    json_object_foreach((json_t*)j, key, v) {
      if (json_object_get(j, key) != v) abort();
      st__walk(v, depth + 1);
    }
  } else if (json_is_array(j)) {
    for (size_t i = 0; i < json_array_size(j); ++i) st__walk(json_array_get(j, i), depth + 1);
  } else if (json_is_number(j)) {
    int64_t n;
    if (st_json_as_int(j, &n) && json_is_integer(j) && n != (int64_t)json_integer_value(j)) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  json_t* j = NULL;
  st_status s = st_json_parse((const char*)data, size, "fuzz.json", &j);
  if (s) {
    if (!st_status_message(s)[0] || j) abort();
    st_status_free(s);
    return 0;
  }
  st__walk(j, 0);
  char* text = st_json_dump(j, 0);
  json_t* back = NULL;
  st_status r = st_json_parse(text, strlen(text), "dump", &back);
  if (r) {
    fprintf(stderr, "a dump does not parse back: %s\n%s\n", st_status_message(r), text);
    abort();
  }
  if (!st_json_same(j, back)) {
    fprintf(stderr, "a dump parses back different:\n%s\n", text);
    abort();
  }
  json_decref(back);
  free(text);
  json_decref(j);
  return 0;
}
