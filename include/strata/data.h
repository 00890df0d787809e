/*
 * strata/data.h — corpus -> token file -> deterministic batches.
 *
 * The formats and the sampler rule are specified in docs/data.md; the
 * Python reference (strata_jax/data.py) implements the same rule, and the
 * equivalence test holds both to it.
 *
 * Errors on bad corpora or token files are ST_CODE_DATA (exit 3) and name
 * the file and the problem.
 */
#ifndef STRATA_DATA_H
#define STRATA_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_TOKEN_FILE_MAGIC "STRATOK1"
#define ST_TOKEN_FILE_VERSION 1u
#define ST_TOKEN_FILE_HEADER_BYTES 32u
#define ST_DATA_DEFAULT_CORPUS "/usr/share/games/fortunes"

typedef struct st_data_options {
  const char* path;      /* data.path: text file, folder or token file; "" = default corpus */
  bool synthetic;        /* data.synthetic */
  uint32_t vocab_size;   /* model.vocab_size */
  double val_fraction;   /* data.val_fraction */
  int64_t seq_len;       /* model.seq_len (T) */
  uint64_t seed;         /* seed */
  const char* cache_dir; /* where tokenized corpora are cached (<cache>/tokens) */
  st_progress_options progress; /* "tokenize: x/y MiB" on stderr for a corpus this large */
} st_data_options;

typedef struct st_dataset st_dataset;

/* Tokenizes the corpus if needed (cached by content identity) and opens it.
 * Validates header, size and every token against vocab_size. */
st_status st_dataset_open(const st_data_options* options, st_dataset** out_dataset /* owned by caller */);
void st_dataset_destroy(st_dataset* dataset); /* NULL is a no-op */

const char* st_dataset_token_path(const st_dataset* dataset); /* the .tok file in use */
uint64_t st_dataset_token_count(const st_dataset* dataset);
uint64_t st_dataset_split_tokens(const st_dataset* dataset, int stream); /* 0 train, 1 validation */

enum { ST_STREAM_TRAIN = 0, ST_STREAM_EVAL = 1 };

/* Fills |count| sequences of |stream| starting at sampler index |first|:
 * inputs[count*T] and targets[count*T] (s32), mask[count*T] (f32, ones). */
void st_dataset_fill(const st_dataset* dataset, int stream, uint64_t first, int64_t count, int32_t* inputs,
                     int32_t* targets, float* mask);

/* The sampler rule of docs/data.md, exposed for tests. */
uint64_t st_data_window_start(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n_tokens, uint64_t seq_len);

/* Writes |count| u16 tokens as a token file at |path| (atomically). */
st_status st_token_file_write(const char* path, uint32_t vocab_size, const uint16_t* tokens, uint64_t count);

/* Validates the bytes of a token file (|size| bytes, borrowed) as
 * st_dataset_open does: magic, version, token width, vocabulary, size,
 * every token below |vocab_size|. *out_tokens receives the tokens (caller
 * frees), *out_count their number (> 0). |origin| names the bytes in
 * messages. ST_CODE_DATA on any problem. */
st_status st_token_file_parse(const char* origin, const unsigned char* data, size_t size, uint32_t vocab_size,
                              uint16_t** out_tokens /* owned by caller */, uint64_t* out_count);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_DATA_H */
