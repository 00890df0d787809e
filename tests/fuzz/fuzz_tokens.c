/*
 * fuzz_tokens.c — libFuzzer target for the token file reader
 * (st_token_file_parse: header and tokens as bytes).
 *
 * Input: 4 bytes of model.vocab_size (little-endian, folded into the
 * config's range [2, 1048576]), then the token file.
 *
 * Properties: a refusal is a data error with a message and no tokens; an
 * accepted file (version 1 or 2) has at least one token, every token below
 * vocab_size, and a header tokenizer of a known kind.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/data.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t vocab = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
  vocab = 2 + vocab % 1048575u;
  uint16_t* tokens = NULL;
  uint64_t count = 0;
  st_token_file_info info;
  st_status s = st_token_file_parse("fuzz.tok", data + 4, size - 4, vocab, &tokens, &count, &info);
  if (s) {
    if (st_status_code(s) != ST_CODE_DATA || !st_status_message(s)[0] || tokens || count) {
      fprintf(stderr, "bad refusal: %s: %s\n", st_code_name(st_status_code(s)), st_status_message(s));
      abort();
    }
    st_status_free(s);
    return 0;
  }
  if (count == 0 || count > size) abort();
  /* The header's tokenizer: a known kind, a hash shown as text of its kind. */
  if ((info.version != 1 && info.version != 2) || info.kind > ST_TOKENIZER_BPE || info.vocab_size > vocab) abort();
  if (info.kind == ST_TOKENIZER_BPE ? strlen(info.hash) != 16 : strcmp(info.hash, info.kind == ST_TOKENIZER_BYTE ? "byte" : "none"))
    abort();
  for (uint64_t i = 0; i < count; ++i)
    if (tokens[i] >= vocab) abort();
  free(tokens);
  return 0;
}
