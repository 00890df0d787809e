/* data/internal.h — shared by the data module's files only. */
#ifndef STRATA_DATA_INTERNAL_H
#define STRATA_DATA_INTERNAL_H

/* Where a BPE token file's tokenizer.json lives: X.tok -> X.tokenizer.json
 * (a name without .tok: NAME.tokenizer.json). Caller frees. */
char* st__data_tokenizer_json_path(const char* token_path);

#endif /* STRATA_DATA_INTERNAL_H */
