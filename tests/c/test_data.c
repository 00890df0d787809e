/*
 * test_data.c — documents, packing and mixing (docs/data.md, "Packing",
 * "Document stream", "Mixing"), prompt weights (data.prompt_marker) and
 * the version-3 token file's bounds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/data.h"
#include "test_util.h"

#define T 16

static void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (unsigned char)(v >> (8 * i));
}

/* A version-3 file of |n| u16 tokens (1, 2, ...) and |nd| document starts. */
static size_t make_v3(unsigned char* buf, uint64_t n, const uint64_t* starts, uint64_t nd) {
  memset(buf, 0, 48);
  memcpy(buf, "STRATOK1", 8);
  buf[8] = 3;
  buf[12] = 0;
  buf[13] = 1; /* vocab 256 */
  buf[16] = 2;
  buf[20] = ST_TOKENIZER_BYTE;
  put_u64(buf + 24, n);
  put_u64(buf + 40, nd);
  for (uint64_t i = 0; i < n; ++i) {
    buf[48 + 2 * i] = (unsigned char)(i + 1);
    buf[48 + 2 * i + 1] = 0;
  }
  for (uint64_t d = 0; d < nd; ++d) put_u64(buf + 48 + 2 * n + 8 * d, starts[d]);
  return 48 + 2 * n + 8 * nd;
}

static void test_v3_parse_bounds(void** state) {
  (void)state;
  unsigned char buf[512];
  uint16_t* toks = NULL;
  uint64_t count = 0, *docs = NULL, nd = 0;
  st_token_file_info info;
  const uint64_t good[] = {0, 3, 7};
  size_t n = make_v3(buf, 10, good, 3);
  ASSERT_OK(st_token_file_parse_docs("v3.tok", buf, n, 256, &toks, &count, &docs, &nd, &info));
  assert_int_equal(count, 10);
  assert_int_equal(nd, 3);
  assert_int_equal(info.version, 3);
  assert_int_equal(info.documents, 3);
  assert_int_equal(docs[2], 7);
  free(toks);
  free(docs);
  /* st_token_file_parse takes it too (and drops the table). */
  ASSERT_OK(st_token_file_parse("v3.tok", buf, n, 256, &toks, &count, NULL));
  free(toks);
  const uint64_t not0[] = {1, 3}, flat[] = {0, 3, 3}, past[] = {0, 10}, down[] = {0, 5, 4};
  struct { const uint64_t* s; uint64_t nd; const char* needle; } bad[] = {
      {not0, 2, "is not 0"}, {flat, 3, "not above"}, {past, 2, "not below the token count"}, {down, 3, "not above"}};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
    n = make_v3(buf, 10, bad[i].s, bad[i].nd);
    ASSERT_ERROR(st_token_file_parse_docs("v3.tok", buf, n, 256, &toks, &count, &docs, &nd, &info), ST_CODE_DATA,
                 bad[i].needle);
    assert_null(toks);
    assert_null(docs);
  }
  /* Counts that do not match the size, or overflow any product. */
  n = make_v3(buf, 10, good, 3);
  ASSERT_ERROR(st_token_file_parse_docs("v3.tok", buf, n - 1, 256, &toks, &count, &docs, &nd, &info), ST_CODE_DATA,
               "truncated");
  for (uint64_t big = 1; big; big <<= 7) {
    put_u64(buf + 40, big + 3);
    ASSERT_ERROR(st_token_file_parse_docs("v3.tok", buf, n, 256, &toks, &count, &docs, &nd, &info), ST_CODE_DATA, "");
    put_u64(buf + 40, 3);
    put_u64(buf + 24, big + 10);
    ASSERT_ERROR(st_token_file_parse_docs("v3.tok", buf, n, 256, &toks, &count, &docs, &nd, &info), ST_CODE_DATA, "");
    put_u64(buf + 24, 10);
  }
  put_u64(buf + 40, 0);
  ASSERT_ERROR(st_token_file_parse_docs("v3.tok", buf, n, 256, &toks, &count, &docs, &nd, &info), ST_CODE_DATA,
               "document count of 0");
  /* More documents than tokens (each at least one token). */
  const uint64_t many[] = {0, 1, 2};
  n = make_v3(buf, 2, many, 3);
  ASSERT_ERROR(st_token_file_parse_docs("v3.tok", buf, n, 256, &toks, &count, &docs, &nd, &info), ST_CODE_DATA, "");
}

/* The prompt table: flagged in the kind field's high half, D u64 after the
 * document table, each at most its document's length. */
static void test_v3_prompt_table(void** state) {
  (void)state;
  unsigned char buf[512];
  uint16_t* toks = NULL;
  uint64_t count = 0, *docs = NULL, nd = 0, *prompts = NULL;
  st_token_file_info info;
  const uint64_t starts[] = {0, 3, 7};
  size_t n = make_v3(buf, 10, starts, 3);
  buf[22] = ST_TOKEN_FILE_FLAG_PROMPTS; /* offset 20's u32, bit 16 */
  const uint64_t good[] = {3, 0, 3};    /* document 0 all prompt; 2: 3 of 3 */
  for (int d = 0; d < 3; ++d) put_u64(buf + n + 8 * d, good[d]);
  n += 24;
  ASSERT_OK(st_token_file_parse_prompts("p.tok", buf, n, 256, &toks, &count, &docs, &nd, &prompts, &info));
  assert_true(info.prompts);
  assert_int_equal(info.kind, ST_TOKENIZER_BYTE);
  assert_int_equal(prompts[0], 3);
  assert_int_equal(prompts[2], 3);
  free(toks);
  free(docs);
  free(prompts);
  /* st_token_file_parse_docs checks the table too. */
  ASSERT_OK(st_token_file_parse_docs("p.tok", buf, n, 256, &toks, &count, &docs, &nd, &info));
  free(toks);
  free(docs);
  /* A prompt longer than its document; a missing or extra table; unknown flags. */
  put_u64(buf + n - 24 + 8, 5); /* document 1 has 4 tokens */
  ASSERT_ERROR(st_token_file_parse_prompts("p.tok", buf, n, 256, &toks, &count, &docs, &nd, &prompts, &info), ST_CODE_DATA,
               "document 1 has a prompt of 5 tokens");
  assert_null(toks);
  assert_null(docs);
  assert_null(prompts);
  put_u64(buf + n - 24 + 8, 4);
  ASSERT_OK(st_token_file_parse_prompts("p.tok", buf, n, 256, &toks, &count, &docs, &nd, &prompts, &info));
  free(toks);
  free(docs);
  free(prompts);
  ASSERT_ERROR(st_token_file_parse_prompts("p.tok", buf, n - 8, 256, &toks, &count, &docs, &nd, &prompts, &info),
               ST_CODE_DATA, "truncated");
  buf[22] = 0;
  ASSERT_ERROR(st_token_file_parse_prompts("p.tok", buf, n, 256, &toks, &count, &docs, &nd, &prompts, &info), ST_CODE_DATA,
               "truncated");
  buf[22] = 2;
  ASSERT_ERROR(st_token_file_parse_prompts("p.tok", buf, n, 256, &toks, &count, &docs, &nd, &prompts, &info), ST_CODE_DATA,
               "flags 0x2");
  /* Version 2 has no flags: the high half makes an unknown kind. */
  buf[8] = 2;
  buf[22] = 1;
  put_u64(buf + 40, 0);
  ASSERT_ERROR(st_token_file_parse_prompts("p.tok", buf, 48 + 20, 256, &toks, &count, &docs, &nd, &prompts, &info),
               ST_CODE_DATA, "kind");
  /* A file without prompts gives NULL; the writer round-trips. */
  n = make_v3(buf, 10, starts, 3);
  ASSERT_OK(st_token_file_parse_prompts("p.tok", buf, n, 256, &toks, &count, &docs, &nd, &prompts, &info));
  assert_null(prompts);
  assert_false(info.prompts);
  char* dir = tu_tmpdir("data");
  char* path = st_path_join(dir, "w.tok");
  ASSERT_OK(st_token_file_write_prompts(path, 256, ST_TOKENIZER_BYTE, toks, count, docs, nd, good));
  free(toks);
  free(docs);
  size_t size = 0;
  unsigned char* raw = tu_read_file(path, &size);
  assert_int_equal(size, n + 24);
  ASSERT_OK(st_token_file_parse_prompts("w.tok", raw, size, 256, &toks, &count, &docs, &nd, &prompts, &info));
  assert_memory_equal(prompts, good, sizeof(good));
  free(raw);
  free(toks);
  free(docs);
  free(prompts);
  free(path);
  tu_rmtree(dir);
  free(dir);
}

/* A corpus of |nd| documents with lengths from |len|: document d is 255
 * (a start marker), then 1 + d % 200 repeated, so a segment that begins a
 * document shows it and its first target names the document (mod 200;
 * the lengths below repeat with a period dividing 200). */
static char* write_docs(const char* dir, const char* name, uint64_t nd, uint64_t (*len)(uint64_t)) {
  uint64_t total = 0;
  for (uint64_t d = 0; d < nd; ++d) total += len(d);
  uint16_t* toks = malloc(total * sizeof(uint16_t));
  uint64_t* starts = malloc(nd * sizeof(uint64_t));
  uint64_t at = 0;
  for (uint64_t d = 0; d < nd; ++d) {
    starts[d] = at;
    for (uint64_t i = 0; i < len(d); ++i) toks[at++] = (uint16_t)(i == 0 ? 255 : 1 + d % 200);
  }
  char* path = st_path_join(dir, name);
  ASSERT_OK(st_token_file_write_docs(path, 256, ST_TOKENIZER_BYTE, toks, total, starts, nd));
  free(toks);
  free(starts);
  return path;
}

static uint64_t len_mixed(uint64_t d) { return 1 + (d * 7) % 40; } /* 1 (no pairs) .. 40 (longer than T) */
static uint64_t len_short(uint64_t d) { return 2 + d % 5; }

static st_dataset* open_docs(const char* path, int packing, uint64_t seed) {
  st_data_options o = {.path = path, .tokenizer = "byte", .tokenizer_vocab = 256, .vocab_size = 256,
                       .val_fraction = 0.1, .seq_len = T, .seed = seed, .cache_dir = "/nonexistent", .packing = packing};
  st_dataset* ds = NULL;
  ASSERT_OK(st_dataset_open(&o, &ds));
  return ds;
}

typedef struct rows {
  int32_t in[64 * T], tg[64 * T], pos[64 * T];
  float w[64 * T];
} rows;

/* Checks sequence |i| of |a| against the packing rules; returns its padding. */
static int check_sequence(const rows* a, int i, int packing, uint64_t (*len)(uint64_t)) {
  const int32_t* in = a->in + i * T;
  const int32_t* tg = a->tg + i * T;
  const int32_t* pos = a->pos + i * T;
  const float* w = a->w + i * T;
  int t = 0, segments = 0;
  while (t < T && w[t] != 0) {
    /* A segment: positions 0, 1, ... up to the next 0 or the padding. */
    assert_int_equal(pos[t], 0);
    int n = 1;
    while (t + n < T && w[t + n] != 0 && pos[t + n] != 0) {
      assert_int_equal(pos[t + n], n);
      assert_int_not_equal(in[t + n], 255); /* no document starts inside a segment */
      ++n;
    }
    if (in[t] == 255) {
      /* A document's start: whole when it has at most T pairs; else it
       * fills the rest of the sequence. */
      const uint64_t pairs = len((uint64_t)(tg[t] - 1)) - 1;
      assert_int_equal(n, pairs <= T ? (int)pairs : T - t);
    } else {
      assert_int_equal(t, 0); /* only a long document's remainder starts without its marker */
    }
    ++segments;
    t += n;
  }
  if (packing == ST_DATA_PACKING_NONE) assert_int_equal(segments, 1);
  /* Padding: to the end, ids 0, weight 0, positions of one more segment. */
  for (int j = t; j < T; ++j) {
    assert_true(w[j] == 0);
    assert_int_equal(in[j], 0);
    assert_int_equal(tg[j], 0);
    assert_int_equal(pos[j], j - t);
  }
  return T - t;
}

static void check_packing(int packing) {
  char* dir = tu_tmpdir("data");
  char* path = write_docs(dir, "c.tok", 300, len_mixed);
  st_dataset* ds = open_docs(path, packing, 5);
  static rows a, b;
  st_dataset_fill(ds, ST_STREAM_TRAIN, 0, 64, a.in, a.tg, a.w, a.pos);
  int pads = 0;
  for (int i = 0; i < 64; ++i) pads += check_sequence(&a, i, packing, len_mixed);
  assert_true(pads > 0);
  /* Determinism: another dataset of the same seed; an earlier index
   * replays from 0; a later one skips ahead. */
  st_dataset* again = open_docs(path, packing, 5);
  st_dataset_fill(again, ST_STREAM_TRAIN, 10, 20, b.in, b.tg, b.w, b.pos);
  assert_memory_equal(b.in, a.in + 10 * T, 20 * T * sizeof(int32_t));
  assert_memory_equal(b.pos, a.pos + 10 * T, 20 * T * sizeof(int32_t));
  st_dataset_fill(again, ST_STREAM_TRAIN, 3, 5, b.in, b.tg, b.w, NULL);
  assert_memory_equal(b.in, a.in + 3 * T, 5 * T * sizeof(int32_t));
  assert_memory_equal(b.w, a.w + 3 * T, 5 * T * sizeof(float));
  st_dataset_fill(again, ST_STREAM_TRAIN, 40, 24, b.in, b.tg, b.w, b.pos);
  assert_memory_equal(b.tg, a.tg + 40 * T, 24 * T * sizeof(int32_t));
  /* Another seed, another stream. */
  st_dataset* other = open_docs(path, packing, 6);
  st_dataset_fill(other, ST_STREAM_TRAIN, 0, 64, b.in, b.tg, b.w, b.pos);
  assert_memory_not_equal(b.in, a.in, 64 * T * sizeof(int32_t));
  st_dataset_destroy(other);
  st_dataset_destroy(again);
  st_dataset_destroy(ds);
  free(path);
  tu_rmtree(dir);
  free(dir);
}

/* pack with short documents: several whole ones per sequence; the
 * validation stream too. */
static void test_pack_keeps_short_documents_whole(void** state) {
  (void)state;
  char* dir = tu_tmpdir("data");
  char* path = write_docs(dir, "s.tok", 400, len_short);
  st_dataset* ds = open_docs(path, ST_DATA_PACKING_PACK, 1);
  static rows a;
  for (int stream = 0; stream < 2; ++stream) {
    st_dataset_fill(ds, stream, 0, 64, a.in, a.tg, a.w, a.pos);
    int segments = 0;
    for (int i = 0; i < 64; ++i) {
      check_sequence(&a, i, ST_DATA_PACKING_PACK, len_short);
      for (int t = 0; t < T; ++t) segments += a.w[i * T + t] != 0 && a.pos[i * T + t] == 0;
    }
    assert_true(segments > 2 * 64);
  }
  st_dataset_destroy(ds);
  free(path);
  tu_rmtree(dir);
  free(dir);
}

static void test_packing_none(void** state) {
  (void)state;
  check_packing(ST_DATA_PACKING_NONE);
}
static void test_packing_pack(void** state) {
  (void)state;
  check_packing(ST_DATA_PACKING_PACK);
}

/* Mixing: over 10^4 documents each source's share is within 2 % of its weight. */
static void test_mixing_share(void** state) {
  (void)state;
  char* dir = tu_tmpdir("data");
  char* p[3] = {write_docs(dir, "a.tok", 300, len_short), write_docs(dir, "b.tok", 50, len_mixed),
                write_docs(dir, "c.tok", 120, len_short)};
  st_data_options o = {.tokenizer = "byte", .tokenizer_vocab = 256, .vocab_size = 256, .val_fraction = 0.1,
                       .seq_len = T, .seed = 3, .cache_dir = "/nonexistent", .packing = ST_DATA_PACKING_PACK,
                       .n_sources = 3, .sources = {p[0], p[1], p[2]}, .weights = {5, 3, 2}};
  st_dataset* ds = NULL;
  ASSERT_OK(st_dataset_open(&o, &ds));
  assert_int_equal(st_dataset_source_count(ds), 3);
  st_data_source_info info[3];
  uint64_t N = 0, total = 0;
  /* Enough sequences for 10^4 draws. */
  for (N = 1000;; N += 500) {
    ASSERT_OK(st_dataset_sources(ds, N, info));
    total = info[0].drawn + info[1].drawn + info[2].drawn;
    if (total >= 10000) break;
  }
  const double want[3] = {0.5, 0.3, 0.2};
  for (int k = 0; k < 3; ++k) {
    assert_true(fabs(info[k].weight - want[k]) < 1e-12);
    double share = (double)info[k].drawn / (double)total;
    if (fabs(share - want[k]) > 0.02) fail_msg("source %d: share %.4f, weight %.2f", k, share, want[k]);
    assert_int_equal(strlen(info[k].hash), 16);
    assert_string_equal(info[k].path, p[k]);
  }
  assert_int_equal(info[1].documents, 50);
  /* The counts are a function of N: asking again (replaying) gives the same. */
  uint64_t d0 = info[0].drawn;
  ASSERT_OK(st_dataset_sources(ds, 10, info));
  ASSERT_OK(st_dataset_sources(ds, N, info));
  assert_int_equal(info[0].drawn, d0);
  st_dataset_destroy(ds);
  for (int k = 0; k < 3; ++k) free(p[k]);
  tu_rmtree(dir);
  free(dir);
}

/* data.prompt_marker on a folder of a separated text file and a JSONL
 * file. A marked document's prompt is lines of 'p' (its completion lines
 * of 'C'), an unmarked one's first lines are 'q': a target is in a prompt
 * exactly when it is 'p' or the '\n' ending a 'p' line. */
static void check_prompt_weights(int packing) {
  char* dir = tu_tmpdir("data");
  char* corpus = st_path_join(dir, "corpus");
  ASSERT_OK(st_fs_mkdirs(corpus));
  st_strbuf txt = {0}, jsl = {0};
  for (int d = 0; d < 120; ++d) {
    st_strbuf* b = d % 4 == 3 ? &jsl : &txt;
    /* Unmarked ('q' lines), an empty prompt (the marker first), or 'p' lines then the marker. */
    const int kind = d % 5 == 4 ? 0 : d % 7 == 0 ? 1 : 2;
    st_strbuf line = {0};
    if (kind == 1) st_strbuf_append(&line, "@@@\n");
    for (int l = 0; kind != 1 && l < 1 + d % 3; ++l) {
      for (int i = 0; i < 1 + (d * 7 + l) % 13; ++i) st_strbuf_append(&line, kind == 2 ? "p" : "q");
      st_strbuf_append(&line, "\n");
    }
    if (kind == 2) st_strbuf_append(&line, "@@@\n");
    for (int i = 0; i < 1 + d % 9; ++i) st_strbuf_append(&line, "C");
    st_strbuf_append(&line, "\n");
    if (b == &jsl) {
      st_strbuf_append(b, "{\"text\": \"");
      for (size_t i = 0; i < line.len; ++i) st_strbuf_append(b, line.data[i] == '\n' ? "\\n" : (char[]){line.data[i], 0});
      st_strbuf_append(b, "\"}\n");
    } else {
      st_strbuf_append_n(b, line.data, line.len);
      st_strbuf_append(b, "%\n");
    }
    st_strbuf_free(&line);
  }
  char* a = st_path_join(corpus, "a.txt");
  char* j = st_path_join(corpus, "b.jsonl");
  assert_int_equal(tu_write_file(a, txt.data, txt.len), 0);
  assert_int_equal(tu_write_file(j, jsl.data, jsl.len), 0);
  st_data_options o = {.path = corpus, .tokenizer = "byte", .tokenizer_vocab = 256, .vocab_size = 256,
                       .val_fraction = 0.1, .seq_len = T, .seed = 2, .cache_dir = dir, .packing = packing,
                       .separator = "%", .prompt_marker = "@@@"};
  st_dataset* ds = NULL;
  ASSERT_OK(st_dataset_open(&o, &ds));
  st_token_file_info info;
  ASSERT_OK(st_token_file_info_read(st_dataset_token_path(ds), &info));
  assert_true(info.prompts);
  static rows r;
  int prompt_targets = 0, completion_starts = 0, split_prompts = 0;
  for (int stream = 0; stream < 2; ++stream) {
    st_dataset_fill(ds, stream, 0, 64, r.in, r.tg, r.w, r.pos);
    for (int k = 0; k < 64 * T; ++k) {
      assert_int_not_equal(r.in[k], '@'); /* the marker line is in no document */
      if (r.in[k] == 0 && r.tg[k] == 0) {
        assert_true(r.w[k] == 0.0f); /* padding */
        continue;
      }
      const bool in_prompt = r.tg[k] == 'p' || (r.tg[k] == '\n' && r.in[k] == 'p');
      if (r.w[k] != (in_prompt ? 0.0f : 1.0f))
        fail_msg("slot %d: input %d target %d weight %g", k, r.in[k], r.tg[k], (double)r.w[k]);
      prompt_targets += in_prompt;
      completion_starts += r.in[k] == '\n' && r.tg[k] == 'C' && k > 0 && r.in[k - 1] == 'p';
      split_prompts += in_prompt && r.pos[k] == 0 && k % T == 0; /* a long prompt continued in the next sequence */
    }
  }
  assert_true(prompt_targets > 0 && completion_starts > 0);
  if (packing == ST_DATA_PACKING_NONE) assert_true(split_prompts > 0);
  /* The marker is in the cache key: without it, another token file, no prompts. */
  o.prompt_marker = NULL;
  st_dataset* plain = NULL;
  ASSERT_OK(st_dataset_open(&o, &plain));
  assert_string_not_equal(st_dataset_token_path(plain), st_dataset_token_path(ds));
  ASSERT_OK(st_token_file_info_read(st_dataset_token_path(plain), &info));
  assert_false(info.prompts);
  st_dataset_fill(plain, ST_STREAM_TRAIN, 0, 64, r.in, r.tg, r.w, r.pos);
  int markers = 0;
  for (int k = 0; k < 64 * T; ++k) {
    markers += r.in[k] == '@';
    if (r.in[k] || r.tg[k]) assert_true(r.w[k] == 1.0f);
  }
  assert_true(markers > 0);
  st_dataset_destroy(plain);
  st_dataset_destroy(ds);
  st_strbuf_free(&txt);
  st_strbuf_free(&jsl);
  free(a);
  free(j);
  free(corpus);
  tu_rmtree(dir);
  free(dir);
}

static void test_prompt_weights_none(void** state) {
  (void)state;
  check_prompt_weights(ST_DATA_PACKING_NONE);
}
static void test_prompt_weights_pack(void** state) {
  (void)state;
  check_prompt_weights(ST_DATA_PACKING_PACK);
}

/* A version-2 file with packing pack is refused naming it; too few
 * documents is refused naming the source. */
static void test_refusals(void** state) {
  (void)state;
  char* dir = tu_tmpdir("data");
  char* v2 = st_path_join(dir, "v2.tok");
  uint16_t toks[400];
  for (int i = 0; i < 400; ++i) toks[i] = (uint16_t)(i % 256);
  ASSERT_OK(st_token_file_write(v2, 256, ST_TOKENIZER_BYTE, toks, 400));
  st_data_options o = {.path = v2, .tokenizer = "byte", .tokenizer_vocab = 256, .vocab_size = 256,
                       .val_fraction = 0.1, .seq_len = T, .cache_dir = dir, .packing = ST_DATA_PACKING_NONE};
  st_dataset* ds = NULL;
  ASSERT_ERROR(st_dataset_open(&o, &ds), ST_CODE_DATA, v2, "version-3");
  char* few = write_docs(dir, "few.tok", 5, len_short); /* floor(5 * 0.1) = 0 validation documents */
  o.path = few;
  ASSERT_ERROR(st_dataset_open(&o, &ds), ST_CODE_DATA, few, "5 documents");
  assert_null(ds);
  free(few);
  free(v2);
  tu_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_v3_parse_bounds), cmocka_unit_test(test_packing_none),
      cmocka_unit_test(test_packing_pack),    cmocka_unit_test(test_pack_keeps_short_documents_whole),
      cmocka_unit_test(test_mixing_share),    cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_v3_prompt_table), cmocka_unit_test(test_prompt_weights_none),
      cmocka_unit_test(test_prompt_weights_pack),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
