/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizer.json reader
 * (st_tokenizer_from_json: byte-level BPE, decoding only).
 *
 * Input: a tokenizer.json.
 *
 * Properties: a refusal is a data error with a message and no tokenizer;
 * an accepted one has 1 to 65536 entries, each 1 to
 * ST_TOKENIZER_MAX_TOKEN_BYTES bytes, and decoding every id gives the
 * concatenation of the entries; an id past the vocabulary is refused.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/data.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  st_tokenizer* t = NULL;
  st_status s = st_tokenizer_from_json("fuzz.json", data, size, &t);
  if (s) {
    if (st_status_code(s) != ST_CODE_DATA || !st_status_message(s)[0] || t) {
      fprintf(stderr, "bad refusal: %s: %s\n", st_code_name(st_status_code(s)), st_status_message(s));
      abort();
    }
    st_status_free(s);
    return 0;
  }
  uint32_t n = st_tokenizer_vocab_size(t);
  if (n == 0 || n > 65536 || strlen(st_tokenizer_hash(t)) != 16) abort();
  int32_t* ids = malloc(sizeof(int32_t) * (n + 1));
  size_t total = 0;
  for (uint32_t i = 0; i < n; ++i) {
    size_t len = 0;
    if (!st_tokenizer_token(t, (int32_t)i, &len) || len == 0 || len > ST_TOKENIZER_MAX_TOKEN_BYTES) abort();
    ids[i] = (int32_t)i;
    total += len;
  }
  st_strbuf out = {0};
  s = st_tokenizer_decode(t, ids, n, &out);
  if (s || out.len != total) abort();
  st_strbuf_reset(&out);
  ids[0] = (int32_t)n;
  s = st_tokenizer_decode(t, ids, 1, &out);
  if (!s || st_status_code(s) != ST_CODE_DATA || out.len) abort();
  st_status_free(s);
  st_strbuf_free(&out);
  free(ids);
  st_tokenizer_destroy(t);
  return 0;
}
