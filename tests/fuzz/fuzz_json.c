/*
 * fuzz_json.c — libFuzzer target for the JSON reader behind manifests
 * (st_json_parse). Kept to the reader's public entry point only, so it
 * follows the reader when the implementation changes.
 *
 * Properties: a refusal has a message and no tree; an accepted tree is
 * consistent (objects have a key per item, strings are present).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "strata/base.h"

static void st__walk(const st_json* j, int depth) {
  if (depth > 1000) abort();
  switch (j->kind) {
    case ST_JSON_STRING:
      if (!j->string) abort();
      break;
    case ST_JSON_OBJECT:
      for (size_t i = 0; i < j->count; ++i) {
        if (!j->keys || !j->keys[i]) abort();
        if (st_json_get(j, j->keys[i]) == NULL) abort();
      }
      /* fallthrough */
    case ST_JSON_ARRAY:
      for (size_t i = 0; i < j->count; ++i) st__walk(&j->items[i], depth + 1);
      break;
    default:
      break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  st_json* j = NULL;
  st_status s = st_json_parse((const char*)data, size, "fuzz.json", &j);
  if (s) {
    if (!st_status_message(s)[0] || j) abort();
    st_status_free(s);
    return 0;
  }
  st__walk(j, 0);
  st_json_free(j);
  return 0;
}
