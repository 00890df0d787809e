/*
 * fuzz_tokens.c — libFuzzer target for the token file reader
 * (st_token_file_parse_prompts: header, tokens, the version-3 document
 * table and its optional prompt table as bytes).
 *
 * Input: 4 bytes of model.vocab_size (little-endian, folded into the
 * config's range [2, 1048576]), then the token file.
 *
 * Properties: a refusal is a data error with a message and no tokens; an
 * accepted file (version 1, 2 or 3) has at least one token, every token
 * below vocab_size, a header tokenizer of a known kind, and (version 3)
 * a document table of the header's count: first 0, strictly ascending,
 * below the token count (versions 1 and 2: none), and a prompt table
 * exactly when the header flags one: each prompt at most its document's
 * length. st_token_file_parse_docs agrees with it on accepting.
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
  uint64_t count = 0, *docs = NULL, n_docs = 0, *prompts = NULL;
  st_token_file_info info;
  st_status s = st_token_file_parse_prompts("fuzz.tok", data + 4, size - 4, vocab, &tokens, &count, &docs, &n_docs,
                                            &prompts, &info);
  /* The prompt-less entry point accepts exactly the same files. */
  uint16_t* t2 = NULL;
  uint64_t c2 = 0, *d2 = NULL, n2 = 0;
  st_status s2 = st_token_file_parse_docs("fuzz.tok", data + 4, size - 4, vocab, &t2, &c2, &d2, &n2, NULL);
  if (!s != !s2 || c2 != count || n2 != n_docs) abort();
  free(t2);
  free(d2);
  st_status_free(s2);
  if (s) {
    if (st_status_code(s) != ST_CODE_DATA || !st_status_message(s)[0] || tokens || count || docs || n_docs || prompts) {
      fprintf(stderr, "bad refusal: %s: %s\n", st_code_name(st_status_code(s)), st_status_message(s));
      abort();
    }
    st_status_free(s);
    return 0;
  }
  if (count == 0 || count > size) abort();
  /* The header's tokenizer: a known kind, a hash shown as text of its kind. */
  if (info.version < 1 || info.version > 3 || info.kind > ST_TOKENIZER_BPE || info.vocab_size > vocab) abort();
  if (info.version == 3 ? !docs || n_docs != info.documents || n_docs > count : docs || n_docs || info.documents) abort();
  for (uint64_t d = 0; d < n_docs; ++d)
    if (docs[d] >= count || (d == 0 ? docs[d] != 0 : docs[d] <= docs[d - 1])) abort();
  if (!prompts != !info.prompts || (info.prompts && info.version != 3)) abort();
  for (uint64_t d = 0; prompts && d < n_docs; ++d)
    if (prompts[d] > (d + 1 < n_docs ? docs[d + 1] : count) - docs[d]) abort();
  if (info.kind == ST_TOKENIZER_BPE ? strlen(info.hash) != 16 : strcmp(info.hash, info.kind == ST_TOKENIZER_BYTE ? "byte" : "none"))
    abort();
  for (uint64_t i = 0; i < count; ++i)
    if (tokens[i] >= vocab) abort();
  free(tokens);
  free(docs);
  free(prompts);
  return 0;
}
