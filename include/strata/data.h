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
#define ST_TOKEN_FILE_VERSION 2u           /* written without documents; version 1 is still read (as the byte tokenizer's) */
#define ST_TOKEN_FILE_VERSION_DOCS 3u      /* written with documents (data.packing none or pack): a document table after the tokens */
#define ST_TOKEN_FILE_HEADER_BYTES 48u     /* versions 2 and 3 */
#define ST_TOKEN_FILE_HEADER_BYTES_V1 32u
/* Version 3's flags: the high 16 bits of the u32 at offset 20 (the low 16
 * are the tokenizer kind; versions 1 and 2 have no flags). */
#define ST_TOKEN_FILE_FLAG_PROMPTS 0x1u /* a table of D u64 prompt lengths follows the document table */
#define ST_DATA_DEFAULT_CORPUS "/usr/share/games/fortunes"

/* The tokenizer kinds of a version-2 token file header (offset 20). */
typedef enum st_tokenizer_kind {
  ST_TOKENIZER_NONE = 0, /* generated tokens (data.synthetic): no tokenizer */
  ST_TOKENIZER_BYTE = 1, /* one token per byte, id = the byte */
  ST_TOKENIZER_BPE = 2,  /* byte-level BPE; its tokenizer.json's hash is in the header */
} st_tokenizer_kind;

/* A tokenizer's identity as manifests, context.json and messages show it:
 * "byte", "none" (synthetic tokens), or for BPE the 16 lowercase hex digits
 * of the first 8 bytes of SHA-256 of its tokenizer.json. */
#define ST_TOKENIZER_HASH_CHARS 17 /* with the NUL */

/* data.packing (docs/data.md, "Packing"). */
typedef enum st_data_packing {
  ST_DATA_PACKING_CONCAT = 0, /* random windows over the concatenated corpus (the default) */
  ST_DATA_PACKING_NONE = 1,   /* one document per sequence, padded */
  ST_DATA_PACKING_PACK = 2,   /* whole documents packed greedily, padded */
} st_data_packing;

#define ST_DATA_MAX_SOURCES 64 /* data.sources entries */

typedef struct st_data_options {
  const char* path;      /* data.path: text file, folder or token file; "" = default corpus */
  int packing;           /* data.packing: st_data_packing */
  const char* separator;   /* data.separator: a line that separates documents; NULL or "": one document per file */
  const char* jsonl_field; /* data.jsonl_field: a *.jsonl line's field holding the document; NULL: "text" */
  /* data.prompt_marker: a document with a line exactly this splits into a
   * prompt (before it; its targets weigh 0) and a completion (after it);
   * the line is dropped. NULL or "": off. */
  const char* prompt_marker;
  /* data.sources / data.weights (packing none or pack): when n_sources > 0
   * they replace |path|; the weights are > 0 and need not sum to 1. */
  int n_sources;
  const char* sources[ST_DATA_MAX_SOURCES];
  double weights[ST_DATA_MAX_SOURCES];
  bool synthetic;        /* data.synthetic */
  const char* tokenizer; /* data.tokenizer: "byte" or "bpe" */
  uint32_t tokenizer_vocab; /* bpe: data.vocab_size (0 there: model.vocab_size), the tokens BPE trains to */
  /* bpe: a trained tokenizer.json to apply to the corpus instead of
   * training one (a run's, to evaluate it on another corpus); the tokens
   * used must then be of that tokenizer (else ST_CODE_DATA naming both
   * hashes). NULL: train (or take the token file's). */
  const char* tokenizer_from;
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
/* The tokenizer of the tokens in use: "byte", "none" or BPE's hash (see
 * ST_TOKENIZER_HASH_CHARS); what checkpoints and context.json record. */
const char* st_dataset_tokenizer_hash(const st_dataset* dataset);
/* BPE: the tokenizer.json beside the token file (verified against the
 * header's hash); NULL for the byte tokenizer and synthetic tokens. */
const char* st_dataset_tokenizer_json(const st_dataset* dataset);
/* The mean bytes of text one token of |stream|'s split stands for: 1 for
 * the byte tokenizer, the decoded length over the split for BPE, 0 for
 * synthetic tokens (no text). Bits per byte are loss / ln 2 / this. */
double st_dataset_bytes_per_token(const st_dataset* dataset, int stream);
uint64_t st_dataset_token_count(const st_dataset* dataset);
uint64_t st_dataset_split_tokens(const st_dataset* dataset, int stream); /* 0 train, 1 validation */

enum { ST_STREAM_TRAIN = 0, ST_STREAM_EVAL = 1 };

/* Fills |count| sequences of |stream| starting at sampler index |first|:
 * inputs[count*T] and targets[count*T] (s32), mask[count*T] (f32: the
 * loss weights, 1, or 0 for padding and for targets inside a document's
 * prompt), positions[count*T] (s32: 0 at each
 * segment start; concat: 0..T-1). mask and positions may be NULL.
 * packing none/pack: sequence i depends on the ones before it; a cursor
 * per stream makes in-order fills cost only the new sequences, and an
 * index before the cursor replays the stream from 0. Not thread-safe
 * (the cursor), though |dataset| is const for its callers. */
void st_dataset_fill(const st_dataset* dataset, int stream, uint64_t first, int64_t count, int32_t* inputs,
                     int32_t* targets, float* mask, int32_t* positions);

/* The packing mode the dataset was opened with (st_data_packing). */
int st_dataset_packing(const st_dataset* dataset);

/* One source of the dataset (data.sources[i], or data.path) as checkpoints
 * and context.json record it. */
typedef struct st_data_source_info {
  const char* path;       /* as given (data.sources[i] or data.path; "synthetic"); borrowed */
  const char* token_path; /* its token file; borrowed */
  char hash[ST_TOKENIZER_HASH_CHARS]; /* the first 16 hex digits of the SHA-256 of the token file's bytes */
  uint64_t documents;     /* documents in the token file (version 1/2: 1) */
  uint64_t drawn;         /* documents the training stream drew from it to make sequences 0..N-1 (concat: 0) */
  double weight;          /* normalised: the weights sum to 1 */
} st_data_source_info;

int st_dataset_source_count(const st_dataset* dataset);
/* Fills out[0 .. st_dataset_source_count()-1] for training-stream sequence
 * index |next_index| (the sampler position a checkpoint saves). Hashes the
 * token files (ST_CODE_DATA when one cannot be read). Moves the training
 * stream's cursor to |next_index| (replaying from 0 when it is past it). */
st_status st_dataset_sources(const st_dataset* dataset, uint64_t next_index, st_data_source_info* out);

/* The sampler rule of docs/data.md, exposed for tests. */
uint64_t st_data_window_start(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n_tokens, uint64_t seq_len);

/* Writes |count| u16 tokens as a version-2 token file at |path|
 * (atomically), of tokenizer |kind| (BPE's tokenizer.json is written by
 * strata_jax.tokenize, so C writes only byte and none files). */
st_status st_token_file_write(const char* path, uint32_t vocab_size, st_tokenizer_kind kind, const uint16_t* tokens,
                              uint64_t count);
/* The same with documents: |n_docs| > 0 writes version 3 with the
 * document table |doc_starts| (first 0, strictly ascending, < count);
 * |n_docs| == 0 is st_token_file_write. */
st_status st_token_file_write_docs(const char* path, uint32_t vocab_size, st_tokenizer_kind kind, const uint16_t* tokens,
                                   uint64_t count, const uint64_t* doc_starts, uint64_t n_docs);
/* st_token_file_write_docs with a prompt table: |prompt_lens| (n_docs of
 * them, each <= its document's length; NULL: none) sets the
 * ST_TOKEN_FILE_FLAG_PROMPTS flag and follows the document table. */
st_status st_token_file_write_prompts(const char* path, uint32_t vocab_size, st_tokenizer_kind kind,
                                      const uint16_t* tokens, uint64_t count, const uint64_t* doc_starts,
                                      uint64_t n_docs, const uint64_t* prompt_lens);

/* What a token file's header says about its tokenizer. */
typedef struct st_token_file_info {
  uint32_t version;    /* 1, 2 or 3 */
  uint64_t documents;  /* version 3: the documents in its table (>= 1); versions 1 and 2: 0 */
  bool prompts;        /* version 3 with ST_TOKEN_FILE_FLAG_PROMPTS: a prompt length per document */
  uint32_t vocab_size; /* the header's: every token is below it */
  st_tokenizer_kind kind;                /* version 1: ST_TOKENIZER_BYTE */
  char hash[ST_TOKENIZER_HASH_CHARS];    /* "byte", "none" or BPE's 16 hex digits */
} st_token_file_info;

/* Validates the bytes of a token file (|size| bytes, borrowed) as
 * st_dataset_open does: magic, version, token width, tokenizer kind,
 * vocabulary, size, every token below |vocab_size|. *out_tokens receives
 * the tokens (caller frees), *out_count their number (> 0), *out_info (may
 * be NULL) the header's tokenizer. |origin| names the bytes in messages.
 * ST_CODE_DATA on any problem. */
st_status st_token_file_parse(const char* origin, const unsigned char* data, size_t size, uint32_t vocab_size,
                              uint16_t** out_tokens /* owned by caller */, uint64_t* out_count,
                              st_token_file_info* out_info);

/* st_token_file_parse that also returns a version-3 file's document table
 * (*out_doc_starts, caller frees; *out_n_docs >= 1); a version 1 or 2
 * file gives NULL and 0. A prompt table is checked too (then dropped). */
st_status st_token_file_parse_docs(const char* origin, const unsigned char* data, size_t size, uint32_t vocab_size,
                                   uint16_t** out_tokens /* owned by caller */, uint64_t* out_count,
                                   uint64_t** out_doc_starts /* owned by caller */, uint64_t* out_n_docs,
                                   st_token_file_info* out_info);
/* st_token_file_parse_docs that also returns the prompt table
 * (*out_prompt_lens, caller frees; *out_n_docs entries, each <= its
 * document's length), or NULL when the file has none. */
st_status st_token_file_parse_prompts(const char* origin, const unsigned char* data, size_t size, uint32_t vocab_size,
                                      uint16_t** out_tokens /* owned by caller */, uint64_t* out_count,
                                      uint64_t** out_doc_starts /* owned by caller */, uint64_t* out_n_docs,
                                      uint64_t** out_prompt_lens /* owned by caller */, st_token_file_info* out_info);

/* Reads only the header of the token file at |path| (ST_CODE_DATA when it
 * is not one). */
st_status st_token_file_info_read(const char* path, st_token_file_info* out_info);

/*===-------------------------------------------------------------------===*/
/* Tokenizers: ids -> bytes (docs/data.md, "Tokenizer")                      */
/*===-------------------------------------------------------------------===*/

/* Decoding only: strata never encodes text in C (strata_jax.tokenize does,
 * at preparation time). */
typedef struct st_tokenizer st_tokenizer;

#define ST_TOKENIZER_MAX_JSON_BYTES (64u << 20) /* a tokenizer.json larger than this is refused */
#define ST_TOKENIZER_MAX_TOKEN_BYTES 1024u      /* one vocabulary entry, as bytes */

/* Opens the tokenizer of |path|:
 *   - a token file: its header's kind; BPE loads the tokenizer.json beside
 *     it (X.tok -> X.tokenizer.json) and checks it against the header hash;
 *   - a tokenizer.json (any other file): BPE;
 *   - a folder (a run directory): its tokenizer.json when there is one,
 *     else the byte tokenizer (byte runs write none).
 * ST_CODE_DATA on any problem, naming the file. */
st_status st_tokenizer_open(const char* path, st_tokenizer** out_tokenizer /* owned by caller */);
/* Loads a byte-level BPE tokenizer.json from |size| bytes (borrowed;
 * untrusted: every size and count is bounded). |origin| names them. */
st_status st_tokenizer_from_json(const char* origin, const unsigned char* data, size_t size,
                                 st_tokenizer** out_tokenizer /* owned by caller */);
/* The byte tokenizer: id b < 256 is the byte b. */
st_tokenizer* st_tokenizer_byte(void);
void st_tokenizer_destroy(st_tokenizer* tokenizer); /* NULL is a no-op */

/* Appends the bytes of |ids| to |out| (not NUL-terminated text: any byte
 * may come out). An id outside the vocabulary is ST_CODE_DATA naming it;
 * |out| then holds the bytes of the ids before it. */
st_status st_tokenizer_decode(const st_tokenizer* tokenizer, const int32_t* ids, size_t n, st_strbuf* out);
uint32_t st_tokenizer_vocab_size(const st_tokenizer* tokenizer);
const char* st_tokenizer_hash(const st_tokenizer* tokenizer); /* "byte" or BPE's 16 hex digits */
/* The byte sequence of one id (NULL outside the vocabulary); borrowed. */
const unsigned char* st_tokenizer_token(const st_tokenizer* tokenizer, int32_t id, size_t* out_len);
/* The lowest id whose bytes are exactly |bytes| (|n| of them); -1 when
 * none is (e.g. the newline a generation starts from). */
int32_t st_tokenizer_find(const st_tokenizer* tokenizer, const void* bytes, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_DATA_H */
