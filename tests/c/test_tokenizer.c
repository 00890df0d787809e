/*
 * test_tokenizer.c — token file headers (versions 1 and 2) and st_tokenizer
 * (decoding; docs/data.md, "Tokenizer"). tests/py/test_tokenizer.py holds
 * the C decoder to Hugging Face tokenizers on a real trained vocabulary.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h> /* after stddef.h, stdarg.h and setjmp.h, which it needs */

#include "strata/base.h"
#include "strata/data.h"
#include "test_util.h"

/* GPT-2's alphabet: 'a' is itself, U+0120 'Ġ' the space, U+010A 'Ċ' the
 * newline, U+0100 'Ā' byte 0, U+0121 'ġ' byte 0x7F, U+0143 'Ń' byte 0xAD,
 * 'ÿ' byte 0xFF. */
static const char kSmall[] =
    "{\"version\":\"1.0\",\"added_tokens\":[],\"model\":{\"type\":\"BPE\",\"vocab\":"
    "{\"a\":0,\"\xc4\xa0\":1,\"\xc4\x8a\":2,\"a\xc4\xa0\":3,\"\xc4\x80\":4,\"\xc3\xbf\":5,\"\xc4\xa1\":6,\"\xc5\x83\":"
    "7},"
    "\"merges\":[[\"a\",\"\xc4\xa0\"]]},\"decoder\":{\"type\":\"ByteLevel\"}}";

static st_status from_text(const char* text, st_tokenizer** out) {
  return st_tokenizer_from_json("t.json", (const unsigned char*)text, strlen(text), out);
}

static void test_byte_tokenizer(void** state) {
  (void)state;
  st_tokenizer* t = st_tokenizer_byte();
  assert_int_equal(st_tokenizer_vocab_size(t), 256);
  assert_string_equal(st_tokenizer_hash(t), "byte");
  int32_t ids[] = {72, 105, 0, 255};
  st_strbuf out = {0};
  ASSERT_OK(st_tokenizer_decode(t, ids, 4, &out));
  assert_int_equal(out.len, 4);
  assert_memory_equal(out.data, "Hi\0\xff", 4);
  int32_t bad[] = {65, 256};
  st_strbuf_reset(&out);
  ASSERT_ERROR(st_tokenizer_decode(t, bad, 2, &out), ST_CODE_DATA, "id 1 of 2 is 256", "tokenizer byte");
  assert_int_equal(out.len, 1); /* the ids before it */
  st_strbuf_free(&out);
  st_tokenizer_destroy(t);
}

static void test_bpe_decodes_the_byte_alphabet(void** state) {
  (void)state;
  st_tokenizer* t = NULL;
  ASSERT_OK(from_text(kSmall, &t));
  assert_int_equal(st_tokenizer_vocab_size(t), 8);
  char sha[65];
  st_sha256_hex(kSmall, strlen(kSmall), sha);
  assert_int_equal(strncmp(st_tokenizer_hash(t), sha, 16), 0);
  assert_int_equal(strlen(st_tokenizer_hash(t)), 16);
  int32_t ids[] = {3, 2, 4, 5, 6, 7, 0, 1};
  st_strbuf out = {0};
  ASSERT_OK(st_tokenizer_decode(t, ids, 8, &out));
  assert_int_equal(out.len, 9);
  assert_memory_equal(out.data,
                      "a \n\0\xff\x7f\xad"
                      "a ",
                      9);
  int32_t neg[] = {-1};
  ASSERT_ERROR(st_tokenizer_decode(t, neg, 1, &out), ST_CODE_DATA, "outside tokenizer");
  st_strbuf_free(&out);
  st_tokenizer_destroy(t);
}

/* |kSmall| with |from| replaced by |to|. */
static char* variant(const char* from, const char* to) {
  const char* at = strstr(kSmall, from);
  assert_non_null(at);
  st_strbuf b = {0};
  st_strbuf_append_n(&b, kSmall, (size_t)(at - kSmall));
  st_strbuf_append(&b, to);
  st_strbuf_append(&b, at + strlen(from));
  return st_strbuf_take(&b);
}

static void expect_refused(const char* from, const char* to, const char* needle) {
  char* text = variant(from, to);
  st_tokenizer* t = NULL;
  ASSERT_ERROR(from_text(text, &t), ST_CODE_DATA, "t.json", needle);
  assert_null(t);
  free(text);
}

static void test_hostile_tokenizer_json(void** state) {
  (void)state;
  st_tokenizer* t = NULL;
  ASSERT_ERROR(from_text("{\"model\":", &t), ST_CODE_DATA, "invalid JSON");
  ASSERT_ERROR(from_text("[]", &t), ST_CODE_DATA, "not a BPE tokenizer.json");
  expect_refused("\"BPE\"", "\"WordPiece\"", "not a BPE tokenizer.json");
  expect_refused("{\"type\":\"ByteLevel\"}", "{\"type\":\"Metaspace\"}", "decoder is Metaspace");
  expect_refused("\"added_tokens\":[]", "\"added_tokens\":[{\"id\":8,\"content\":\"<s>\"}]", "added (special) tokens");
  expect_refused("\"a\":0,", "\"a\":9,", "ids must be the integers 0..7"); /* out of range */
  expect_refused("\"a\":0,", "\"a\":3,", "given twice");                   /* 3 twice, 0 missing */
  expect_refused("\"a\":0,", "\"a\":\"0\",", "not an integer");
  expect_refused("\"a\":0,", "\"\xe2\x82\xac\":0,", "U+20AC"); /* '€': no byte symbol */
  expect_refused("\"a\":0,", "\"\":0,", "1 to 1024 symbols");
  /* An entry longer than ST_TOKENIZER_MAX_TOKEN_BYTES. */
  st_strbuf big = {0};
  st_strbuf_append(&big, "\"");
  for (unsigned i = 0; i <= ST_TOKENIZER_MAX_TOKEN_BYTES; ++i) st_strbuf_append(&big, "a");
  st_strbuf_append(&big, "\":0,");
  expect_refused("\"a\":0,", big.data, "at most 1024");
  st_strbuf_free(&big);
  /* More entries than strata's u16 tokens can name. */
  st_strbuf many = {0};
  st_strbuf_append(&many, "{\"model\":{\"type\":\"BPE\",\"vocab\":{");
  for (unsigned i = 0; i < 65537; ++i) st_strbuf_printf(&many, "%s\"%u\":%u", i ? "," : "", i, i);
  st_strbuf_append(&many, "}},\"decoder\":{\"type\":\"ByteLevel\"}}");
  ASSERT_ERROR(from_text(many.data, &t), ST_CODE_DATA, "65537 entries");
  st_strbuf_free(&many);
  /* Larger than a tokenizer.json may be: refused before it is parsed. */
  size_t huge = (size_t)ST_TOKENIZER_MAX_JSON_BYTES + 1;
  unsigned char* zeros = calloc(huge, 1);
  ASSERT_ERROR(st_tokenizer_from_json("t.json", zeros, huge, &t), ST_CODE_DATA, "more than");
  free(zeros);
}

/* A token file of |version| (2: 48-byte header) with kind, hash and tokens. */
static size_t make_tok(unsigned char* buf, unsigned version, uint32_t vocab, uint32_t kind, const unsigned char* hash8,
                       const uint16_t* tokens, size_t n) {
  size_t h = version == 1 ? 32 : 48;
  memset(buf, 0, h);
  memcpy(buf, "STRATOK1", 8);
  uint32_t f[4] = {version, vocab, 2, version == 1 ? 0 : kind};
  for (int i = 0; i < 4; ++i)
    for (int k = 0; k < 4; ++k) buf[8 + 4 * i + k] = (unsigned char)(f[i] >> (8 * k));
  for (int k = 0; k < 8; ++k) buf[24 + k] = (unsigned char)((uint64_t)n >> (8 * k));
  if (version == 2 && hash8) memcpy(buf + 32, hash8, 8);
  for (size_t i = 0; i < n; ++i) {
    buf[h + 2 * i] = (unsigned char)(tokens[i] & 0xFF);
    buf[h + 2 * i + 1] = (unsigned char)(tokens[i] >> 8);
  }
  return h + 2 * n;
}

static void test_token_file_versions(void** state) {
  (void)state;
  unsigned char buf[256];
  const uint16_t toks[] = {1, 2, 3, 7};
  const unsigned char hash8[8] = {0xde, 0xad, 0xbe, 0xef, 0x01, 0x23, 0x45, 0x67};
  uint16_t* out = NULL;
  uint64_t count = 0;
  st_token_file_info info;
  size_t n = make_tok(buf, 1, 256, 0, NULL, toks, 4);
  ASSERT_OK(st_token_file_parse("v1.tok", buf, n, 256, &out, &count, &info));
  assert_int_equal(count, 4);
  assert_int_equal(info.version, 1);
  assert_int_equal(info.kind, ST_TOKENIZER_BYTE);
  assert_string_equal(info.hash, "byte");
  free(out);
  n = make_tok(buf, 2, 8, ST_TOKENIZER_BPE, hash8, toks, 4);
  ASSERT_OK(st_token_file_parse("v2.tok", buf, n, 8, &out, &count, &info));
  assert_int_equal(count, 4);
  assert_int_equal(out[3], 7);
  assert_int_equal(info.kind, ST_TOKENIZER_BPE);
  assert_int_equal(info.vocab_size, 8);
  assert_string_equal(info.hash, "deadbeef01234567");
  free(out);
  n = make_tok(buf, 2, 256, ST_TOKENIZER_NONE, NULL, toks, 4);
  ASSERT_OK(st_token_file_parse("v2.tok", buf, n, 256, &out, &count, NULL));
  free(out);
  n = make_tok(buf, 2, 256, 7, NULL, toks, 4);
  ASSERT_ERROR(st_token_file_parse("v2.tok", buf, n, 256, &out, &count, &info), ST_CODE_DATA, "tokenizer kind 7");
  /* A version-1-sized file that says version 2 is too short for its header. */
  n = make_tok(buf, 2, 256, ST_TOKENIZER_BYTE, NULL, toks, 0);
  ASSERT_ERROR(st_token_file_parse("v2.tok", buf, 40, 256, &out, &count, &info), ST_CODE_DATA, "version-2 header");
  assert_null(out);
  buf[8] = 4;
  ASSERT_ERROR(st_token_file_parse("v4.tok", buf, n, 256, &out, &count, &info), ST_CODE_DATA, "version 4");
}

static void test_open_finds_the_tokenizer(void** state) {
  (void)state;
  char* dir = tu_tmpdir("tokenizer");
  st_tokenizer* t = NULL;
  /* A folder without tokenizer.json (a byte run): the byte tokenizer. */
  ASSERT_OK(st_tokenizer_open(dir, &t));
  assert_string_equal(st_tokenizer_hash(t), "byte");
  st_tokenizer_destroy(t);
  char* json = st_path_join(dir, "tokenizer.json");
  assert_int_equal(tu_write_file(json, kSmall, strlen(kSmall)), 0);
  char sha[65];
  st_sha256_hex(kSmall, strlen(kSmall), sha);
  ASSERT_OK(st_tokenizer_open(dir, &t));
  assert_int_equal(strncmp(st_tokenizer_hash(t), sha, 16), 0);
  st_tokenizer_destroy(t);
  ASSERT_OK(st_tokenizer_open(json, &t)); /* the file itself */
  assert_int_equal(st_tokenizer_vocab_size(t), 8);
  st_tokenizer_destroy(t);
  /* A BPE token file: X.tokenizer.json beside it, checked against the header. */
  unsigned char hash8[8], buf[128];
  for (int i = 0; i < 8; ++i) sscanf(sha + 2 * i, "%2hhx", &hash8[i]);
  const uint16_t toks[] = {3, 2};
  size_t n = make_tok(buf, 2, 8, ST_TOKENIZER_BPE, hash8, toks, 2);
  char* tok = st_path_join(dir, "x.tok");
  char* side = st_path_join(dir, "x.tokenizer.json");
  assert_int_equal(tu_write_file(tok, buf, n), 0);
  ASSERT_ERROR(st_tokenizer_open(tok, &t), ST_CODE_DATA, "x.tokenizer.json");
  assert_int_equal(tu_write_file(side, kSmall, strlen(kSmall)), 0);
  ASSERT_OK(st_tokenizer_open(tok, &t));
  st_strbuf out = {0};
  int32_t ids[] = {toks[0], toks[1]};
  ASSERT_OK(st_tokenizer_decode(t, ids, 2, &out));
  assert_string_equal(out.data, "a \n");
  st_strbuf_free(&out);
  st_tokenizer_destroy(t);
  /* Another tokenizer.json beside it: refused, naming both hashes. */
  char* other = variant("\"a\":0,", "\"b\":0,");
  assert_int_equal(tu_write_file(side, other, strlen(other)), 0);
  char sha2[65], h1[17], h2[17];
  st_sha256_hex(other, strlen(other), sha2);
  snprintf(h1, sizeof(h1), "%.16s", sha);
  snprintf(h2, sizeof(h2), "%.16s", sha2);
  ASSERT_ERROR(st_tokenizer_open(tok, &t), ST_CODE_DATA, h1, h2);
  free(other);
  /* A byte token file: the byte tokenizer. */
  n = make_tok(buf, 2, 256, ST_TOKENIZER_BYTE, NULL, toks, 2);
  assert_int_equal(tu_write_file(tok, buf, n), 0);
  ASSERT_OK(st_tokenizer_open(tok, &t));
  assert_string_equal(st_tokenizer_hash(t), "byte");
  st_tokenizer_destroy(t);
  free(tok);
  free(side);
  free(json);
  tu_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_byte_tokenizer),           cmocka_unit_test(test_bpe_decodes_the_byte_alphabet),
      cmocka_unit_test(test_hostile_tokenizer_json),   cmocka_unit_test(test_token_file_versions),
      cmocka_unit_test(test_open_finds_the_tokenizer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
