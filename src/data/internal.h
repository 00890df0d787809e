/* data/internal.h — shared by the data module's files only. */
#ifndef STRATA_DATA_INTERNAL_H
#define STRATA_DATA_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/data.h"

/* Where a BPE token file's tokenizer.json lives: X.tok -> X.tokenizer.json
 * (a name without .tok: NAME.tokenizer.json). Caller frees. */
char* st__data_tokenizer_json_path(const char* token_path);

/* One corpus of the dataset: data.path, or one of data.sources. */
typedef struct st__data_source {
  char* given;          /* as the config names it ("synthetic" for data.synthetic) */
  char* token_path;
  char* tokenizer_json; /* BPE: the verified tokenizer.json beside the token file */
  st_token_file_info info;
  uint64_t count;
  uint16_t* tokens;     /* owned; u32 files are narrowed after the range check */
  uint64_t* docs;       /* version 3: document start offsets (owned); else NULL */
  uint64_t n_docs;
  uint64_t* prompts;    /* version 3 with the prompts flag: each document's prompt length (owned); else NULL */
  uint64_t n_train_docs; /* documents [0, n_train_docs) train, the rest validation */
  double weight;         /* normalised */
} st__data_source;

typedef struct st__data_cursor st__data_cursor;

struct st_dataset {
  st__data_source* src; /* n_src of them; concat: exactly one */
  int n_src;
  int packing;          /* st_data_packing */
  double cum[ST_DATA_MAX_SOURCES]; /* cumulative normalised weights, the last one 1 */
  double bytes_per_token[2]; /* per split; 0: no text (synthetic) */
  uint64_t count;            /* tokens, all sources */
  uint64_t n_split[2];       /* tokens of each split (concat: [0, n_train) of src[0] and the rest) */
  uint64_t seed;
  int64_t seq_len;
  st__data_cursor* cursor[2]; /* none/pack: the sequential position of each stream (mutable cache) */
};

/* documents.c: documents of corpus files, appended to a growing buffer
 * (tokens beyond |cap| are dropped: a file that grew since it was sized). */
typedef struct st__data_docbuf {
  uint16_t* tokens;
  uint64_t n, cap;
  uint64_t open; /* where the current document began */
  uint64_t* starts;
  uint64_t* prompts; /* per document: its prompt's tokens (data.prompt_marker; 0: none) */
  uint64_t n_docs, cap_docs;
  uint64_t prompt;     /* the open document's prompt length so far */
  bool marked;         /* the open document's marker line was seen */
} st__data_docbuf;
st_status st__data_file_documents(const st_data_options* o, const char* file, const char* data, size_t size,
                                  st__data_docbuf* b);

/* packing.c: the document stream and the packed fill (none/pack). */
st__data_cursor* st__data_cursor_new(const st_dataset* ds);
void st__data_cursor_free(st__data_cursor* cursor);
void st__data_fill_docs(const st_dataset* ds, int stream, uint64_t first, int64_t count, int32_t* inputs,
                        int32_t* targets, float* mask, int32_t* positions);
/* Moves |stream|'s cursor to sequence |index| and returns its per-source
 * draw counts (n_src of them; borrowed until the next fill). */
const uint64_t* st__data_drawn_at(const st_dataset* ds, int stream, uint64_t index);
uint64_t st__data_splitmix64(uint64_t x);

#endif /* STRATA_DATA_INTERNAL_H */
