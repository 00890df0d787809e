/* dataset.c — byte-level tokenizer, BPE through strata_jax.tokenize, token
 * files, splits and the sampler (docs/data.md is the specification; keep
 * the two in step). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/internal.h"
#include "strata/base.h"
#include "strata/data.h"


/*===-------------------------------------------------------------------===*/
/* Sampler                                                                  */
/*===-------------------------------------------------------------------===*/

uint64_t st__data_splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t st_data_window_start(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n_tokens, uint64_t seq_len) {
  return st__data_splitmix64(st__data_splitmix64(seed ^ (stream << 32)) ^ index) % (n_tokens - seq_len);
}

/*===-------------------------------------------------------------------===*/
/* Token files                                                              */
/*===-------------------------------------------------------------------===*/

static void st__data_put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static void st__data_put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t st__data_get_u32(const unsigned char* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t st__data_get_u64(const unsigned char* p) {
  return (uint64_t)st__data_get_u32(p) | (uint64_t)st__data_get_u32(p + 4) << 32;
}

st_status st_token_file_write(const char* path, uint32_t vocab_size, st_tokenizer_kind kind, const uint16_t* tokens,
                              uint64_t count) {
  return st_token_file_write_prompts(path, vocab_size, kind, tokens, count, NULL, 0, NULL);
}

st_status st_token_file_write_docs(const char* path, uint32_t vocab_size, st_tokenizer_kind kind, const uint16_t* tokens,
                                   uint64_t count, const uint64_t* doc_starts, uint64_t n_docs) {
  return st_token_file_write_prompts(path, vocab_size, kind, tokens, count, doc_starts, n_docs, NULL);
}

st_status st_token_file_write_prompts(const char* path, uint32_t vocab_size, st_tokenizer_kind kind,
                                      const uint16_t* tokens, uint64_t count, const uint64_t* doc_starts,
                                      uint64_t n_docs, const uint64_t* prompt_lens) {
  const uint64_t n_prompts = n_docs && prompt_lens ? n_docs : 0;
  const size_t docs_at = ST_TOKEN_FILE_HEADER_BYTES + (size_t)count * 2;
  size_t size = docs_at + (size_t)(n_docs + n_prompts) * 8;
  unsigned char* buf = st_xmalloc(size);
  memset(buf, 0, ST_TOKEN_FILE_HEADER_BYTES);
  memcpy(buf, ST_TOKEN_FILE_MAGIC, 8);
  st__data_put_u32(buf + 8, n_docs ? ST_TOKEN_FILE_VERSION_DOCS : ST_TOKEN_FILE_VERSION);
  /* Version 3: the document count in the reserved field, the table after
   * the tokens, then the prompt lengths when flagged. */
  st__data_put_u64(buf + 40, n_docs);
  for (uint64_t d = 0; d < n_docs; ++d) st__data_put_u64(buf + docs_at + 8 * d, doc_starts[d]);
  for (uint64_t d = 0; d < n_prompts; ++d) st__data_put_u64(buf + docs_at + 8 * (n_docs + d), prompt_lens[d]);
  st__data_put_u32(buf + 12, vocab_size);
  st__data_put_u32(buf + 16, 2);
  st__data_put_u32(buf + 20, (uint32_t)kind | (n_prompts ? ST_TOKEN_FILE_FLAG_PROMPTS << 16 : 0u));
  st__data_put_u64(buf + 24, count); /* bytes 32..47: the BPE hash (zero here) and reserved zeros */
  for (uint64_t i = 0; i < count; ++i) {
    buf[ST_TOKEN_FILE_HEADER_BYTES + 2 * i] = (unsigned char)(tokens[i] & 0xFF);
    buf[ST_TOKEN_FILE_HEADER_BYTES + 2 * i + 1] = (unsigned char)(tokens[i] >> 8);
  }
  st_status s = st_fs_write_atomic(path, buf, size);
  free(buf);
  return s;
}

static bool st__is_token_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return false;
  char magic[8];
  bool yes = fread(magic, 1, 8, f) == 8 && !memcmp(magic, ST_TOKEN_FILE_MAGIC, 8);
  fclose(f);
  return yes;
}

/* The header fields every version shares, and the version-2 tokenizer
 * fields; |size| >= 12 is known. */
static st_status st__header(const char* path, const unsigned char* p, size_t size, st_token_file_info* info,
                            size_t* out_header) {
  memset(info, 0, sizeof(*info));
  if (size < ST_TOKEN_FILE_HEADER_BYTES_V1 || memcmp(p, ST_TOKEN_FILE_MAGIC, 8) != 0)
    return st_status_make(ST_CODE_DATA, "token file '%s': bad header (no '%s' magic); rebuild it from the text corpus", path,
                          ST_TOKEN_FILE_MAGIC);
  info->version = st__data_get_u32(p + 8);
  if (info->version < 1 || info->version > ST_TOKEN_FILE_VERSION_DOCS)
    return st_status_make(ST_CODE_DATA, "token file '%s': version %u, this strata reads versions 1 to 3", path, info->version);
  info->vocab_size = st__data_get_u32(p + 12);
  if (info->version == 1) {
    /* Version 1 predates BPE: every such file is the byte tokenizer's. */
    info->kind = ST_TOKENIZER_BYTE;
    snprintf(info->hash, sizeof(info->hash), "byte");
    *out_header = ST_TOKEN_FILE_HEADER_BYTES_V1;
    return ST_OK;
  }
  if (size < ST_TOKEN_FILE_HEADER_BYTES)
    return st_status_make(ST_CODE_DATA, "token file '%s': %zu bytes, shorter than a version-%u header (%u bytes)", path, size,
                          info->version, ST_TOKEN_FILE_HEADER_BYTES);
  uint32_t kind = st__data_get_u32(p + 20);
  if (info->version == ST_TOKEN_FILE_VERSION_DOCS) {
    /* Version 3 keeps flags in the high half of the kind field (zero in
     * files without prompts, so those read as before). */
    const uint32_t flags = kind >> 16;
    kind &= 0xFFFFu;
    if (flags & ~ST_TOKEN_FILE_FLAG_PROMPTS)
      return st_status_make(ST_CODE_DATA, "token file '%s': version-3 flags 0x%x are unknown (0x1: prompt lengths)", path,
                            flags);
    info->prompts = (flags & ST_TOKEN_FILE_FLAG_PROMPTS) != 0;
  }
  if (kind > ST_TOKENIZER_BPE)
    return st_status_make(ST_CODE_DATA, "token file '%s': tokenizer kind %u is unknown (0 none, 1 byte, 2 bpe)", path, kind);
  info->kind = (st_tokenizer_kind)kind;
  if (kind == ST_TOKENIZER_BPE)
    for (int i = 0; i < 8; ++i) snprintf(info->hash + 2 * i, 3, "%02x", p[32 + i]);
  else
    snprintf(info->hash, sizeof(info->hash), "%s", kind == ST_TOKENIZER_BYTE ? "byte" : "none");
  if (info->version == ST_TOKEN_FILE_VERSION_DOCS) {
    info->documents = st__data_get_u64(p + 40);
    if (info->documents == 0)
      return st_status_make(ST_CODE_DATA, "token file '%s': version 3 with a document count of 0 (at least 1)", path);
  }
  *out_header = ST_TOKEN_FILE_HEADER_BYTES;
  return ST_OK;
}

st_status st_token_file_info_read(const char* path, st_token_file_info* out_info) {
  unsigned char head[ST_TOKEN_FILE_HEADER_BYTES];
  FILE* f = fopen(path, "rb");
  if (!f) return st_status_make(ST_CODE_DATA, "cannot open token file '%s': %s", path, strerror(errno));
  size_t n = fread(head, 1, sizeof(head), f);
  fclose(f);
  size_t header = 0;
  return st__header(path, head, n, out_info, &header);
}

st_status st_token_file_parse(const char* path, const unsigned char* p, size_t size, uint32_t vocab_size, uint16_t** out_tokens,
                              uint64_t* out_count, st_token_file_info* out_info) {
  uint64_t* docs = NULL;
  uint64_t n_docs = 0;
  st_status s = st_token_file_parse_docs(path, p, size, vocab_size, out_tokens, out_count, &docs, &n_docs, out_info);
  free(docs);
  return s;
}

/* A version-3 document table (|n| entries at |t|): first 0, strictly
 * ascending, each below |count|. */
static st_status st__doc_table(const char* path, const unsigned char* t, uint64_t n, uint64_t count, uint64_t** out) {
  uint64_t* docs = st_xmalloc((size_t)n * sizeof(uint64_t));
  for (uint64_t d = 0; d < n; ++d) {
    docs[d] = st__data_get_u64(t + 8 * d);
    const char* why = d == 0 && docs[d] != 0                ? "is not 0 (the first document starts the tokens)"
                      : d > 0 && docs[d] <= docs[d - 1]     ? "is not above the one before (documents are not empty)"
                      : docs[d] >= count                    ? "is not below the token count"
                                                            : NULL;
    if (why) {
      st_status s = st_status_make(ST_CODE_DATA, "token file '%s': document %" PRIu64 " starts at %" PRIu64 ", which %s",
                                   path, d, docs[d], why);
      free(docs);
      return s;
    }
  }
  *out = docs;
  return ST_OK;
}

/* A prompt table (|n| entries at |t|): each at most its document's length. */
static st_status st__prompt_table(const char* path, const unsigned char* t, const uint64_t* docs, uint64_t n, uint64_t count,
                                  uint64_t** out) {
  uint64_t* prompts = st_xmalloc((size_t)n * sizeof(uint64_t));
  for (uint64_t d = 0; d < n; ++d) {
    prompts[d] = st__data_get_u64(t + 8 * d);
    const uint64_t len = (d + 1 < n ? docs[d + 1] : count) - docs[d];
    if (prompts[d] > len) {
      st_status s = st_status_make(ST_CODE_DATA,
                                   "token file '%s': document %" PRIu64 " has a prompt of %" PRIu64
                                   " tokens, longer than its %" PRIu64 " tokens",
                                   path, d, prompts[d], len);
      free(prompts);
      return s;
    }
  }
  *out = prompts;
  return ST_OK;
}

st_status st_token_file_parse_docs(const char* path, const unsigned char* p, size_t size, uint32_t vocab_size,
                                   uint16_t** out_tokens, uint64_t* out_count, uint64_t** out_doc_starts,
                                   uint64_t* out_n_docs, st_token_file_info* out_info) {
  uint64_t* prompts = NULL;
  st_status s = st_token_file_parse_prompts(path, p, size, vocab_size, out_tokens, out_count, out_doc_starts, out_n_docs,
                                            &prompts, out_info);
  free(prompts);
  return s;
}

st_status st_token_file_parse_prompts(const char* path, const unsigned char* p, size_t size, uint32_t vocab_size,
                                      uint16_t** out_tokens, uint64_t* out_count, uint64_t** out_doc_starts,
                                      uint64_t* out_n_docs, uint64_t** out_prompt_lens, st_token_file_info* out_info) {
  *out_tokens = NULL;
  *out_count = 0;
  *out_doc_starts = NULL;
  *out_n_docs = 0;
  *out_prompt_lens = NULL;
  st_token_file_info info;
  size_t header = 0;
  ST_RETURN(st__header(path, p, size, &info, &header));
  if (out_info) *out_info = info;
  uint32_t tb = st__data_get_u32(p + 16);
  if (tb != 2 && tb != 4) return st_status_make(ST_CODE_DATA, "token file '%s': token_bytes is %u, expected 2 or 4", path, tb);
  if (info.vocab_size > vocab_size)
    return st_status_make(ST_CODE_DATA, "token file '%s': written for vocab_size %u, but model.vocab_size is %u", path,
                          info.vocab_size, vocab_size);
  uint64_t count = st__data_get_u64(p + 24);
  /* Version 3: |documents| u64 offsets after the tokens (and as many
   * prompt lengths when flagged); both counts are bounded by the bytes
   * there before any product is formed. */
  const uint64_t nd = info.documents;
  const uint64_t tables = info.prompts ? 2 : 1;
  const size_t body = size - header;
  if (count > body / tb || nd > (body - count * tb) / (8 * tables) || count * tb + nd * 8 * tables != body)
    return st_status_make(ST_CODE_DATA, "token file '%s': header says %" PRIu64 " tokens of %u bytes%s but the file has %zu bytes after the header (truncated?)",
                          path, count, tb, !nd ? "" : info.prompts ? ", a document and a prompt table" : " and a document table",
                          body);
  if (count == 0) return st_status_make(ST_CODE_DATA, "token file '%s' holds no tokens", path);
  if (nd > count)
    return st_status_make(ST_CODE_DATA, "token file '%s': %" PRIu64 " documents but %" PRIu64 " tokens", path, nd, count);
  uint64_t* docs = NULL;
  uint64_t* prompts = NULL;
  if (nd) ST_RETURN(st__doc_table(path, p + header + count * tb, nd, count, &docs));
  if (nd && info.prompts) {
    st_status s = st__prompt_table(path, p + header + count * tb + nd * 8, docs, nd, count, &prompts);
    if (s) {
      free(docs);
      return s;
    }
  }
  uint16_t* tokens = st_xmalloc(count * sizeof(uint16_t));
  const unsigned char* t = p + header;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t v = tb == 2 ? (uint32_t)t[2 * i] | (uint32_t)t[2 * i + 1] << 8 : st__data_get_u32(t + 4 * i);
    if (v >= vocab_size) {
      free(tokens);
      free(docs);
      free(prompts);
      return st_status_make(ST_CODE_DATA, "token file '%s': token %" PRIu64 " is %u, not below model.vocab_size %u", path, i, v,
                            vocab_size);
    }
    /* Tokens are kept as u16: a larger one must not be silently narrowed. */
    if (v > UINT16_MAX) {
      free(tokens);
      free(docs);
      free(prompts);
      return st_status_make(ST_CODE_DATA, "token file '%s': token %" PRIu64 " is %u; strata keeps tokens as u16, so ids above 65535 are not supported",
                            path, i, v);
    }
    tokens[i] = (uint16_t)v;
  }
  *out_tokens = tokens;
  *out_count = count;
  *out_doc_starts = docs;
  *out_n_docs = nd;
  *out_prompt_lens = prompts;
  return ST_OK;
}

/* Reads and validates a token file (docs/data.md) into |ds|. */
static st_status st__token_file_read(const char* path, uint32_t vocab_size, st__data_source* src) {
  char* data = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &data, &size);
  /* A missing or unreadable token file is a data error (exit 3), not a generic I/O one. */
  if (s) return st_status_recode(s, ST_CODE_DATA, "cannot read token file");
  s = st_token_file_parse_prompts(path, (const unsigned char*)data, size, vocab_size, &src->tokens, &src->count,
                                  &src->docs, &src->n_docs, &src->prompts, &src->info);
  free(data);
  return s;
}

/*===-------------------------------------------------------------------===*/
/* Corpus -> token file                                                     */
/*===-------------------------------------------------------------------===*/

static int st__data_cmp_str(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

/* Lists the corpus files of |path| (a file, or a folder's regular files
 * that are not symlinks or *.dat indexes) sorted byte-wise. */
static st_status st__corpus_files(const char* path, char*** out_files, size_t* out_count) {
  *out_files = NULL;
  *out_count = 0;
  struct stat st;
  if (stat(path, &st) != 0)
    return st_status_make(ST_CODE_DATA, "data.path '%s' does not exist (%s); point data.path at a text file, a folder of text files or a token file",
                          path, strerror(errno));
  if (!S_ISDIR(st.st_mode)) {
    char** files = st_xmalloc(sizeof(char*));
    files[0] = st_xstrdup(path);
    *out_files = files;
    *out_count = 1;
    return ST_OK;
  }
  DIR* d = opendir(path);
  if (!d) return st_status_make(ST_CODE_DATA, "cannot open corpus folder '%s': %s", path, strerror(errno));
  char** files = NULL;
  size_t n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    size_t len = strlen(e->d_name);
    if (len > 4 && !strcmp(e->d_name + len - 4, ".dat")) continue;
    char* full = st_path_join(path, e->d_name);
    struct stat fst;
    if (lstat(full, &fst) != 0 || !S_ISREG(fst.st_mode)) {
      free(full);
      continue;
    }
    files = st_xrealloc(files, (n + 1) * sizeof(char*));
    files[n++] = full;
  }
  closedir(d);
  qsort(files, n, sizeof(char*), st__data_cmp_str);
  *out_files = files;
  *out_count = n;
  return ST_OK;
}

static void st__free_list(char** files, size_t n) {
  for (size_t i = 0; i < n; ++i) free(files[i]);
  free(files);
}

char* st__data_tokenizer_json_path(const char* token_path) {
  st_strbuf b = {0};
  size_t n = strlen(token_path);
  if (n > 4 && !strcmp(token_path + n - 4, ".tok")) n -= 4;
  st_strbuf_append_n(&b, token_path, n);
  st_strbuf_append(&b, ".tokenizer.json");
  return st_strbuf_take(&b);
}

/* Trains BPE on |files| (or applies |from|) and writes |token_path| and
 * |json_path| with `python -m strata_jax.tokenize` (as the exporter runs:
 * the interpreter of st_python_path, the source tree's python/ first on
 * PYTHONPATH), its output in <token_path>.log. |documents| (packing
 * none/pack): the byte tokenizer's version-3 file of the corpus's
 * documents, which the script encodes one by one (NULL: the corpus as one
 * stream, version 2). */
static st_status st__run_bpe(uint32_t vocab, const char* from, const char* documents, const char* token_path,
                             const char* json_path, char** files, size_t n) {
  st_strbuf log = {0};
  st_strbuf_printf(&log, "%s.log", token_path);
  char vocab_text[16];
  snprintf(vocab_text, sizeof(vocab_text), "%u", vocab);
  const char** args = st_xcalloc(11 + n, sizeof(char*));
  size_t k = 0;
  args[k++] = "--vocab-size";
  args[k++] = vocab_text;
  args[k++] = "--out";
  args[k++] = token_path;
  args[k++] = "--tokenizer-out";
  args[k++] = json_path;
  if (from) {
    args[k++] = "--tokenizer-in";
    args[k++] = from;
  }
  if (documents) {
    args[k++] = "--documents";
    args[k++] = documents;
  }
  args[k++] = "--";
  for (size_t i = 0; i < n; ++i) args[k++] = files[i];
  if (from)
    fprintf(stderr, "strata: tokenizing the corpus (%zu files) with the BPE tokenizer %s\n", n, from);
  else
    fprintf(stderr, "strata: training a BPE tokenizer of %u tokens on the corpus (%zu files)\n", vocab, n);
  st_python_job job = {.what = "tokenizing with BPE", .module = "strata_jax.tokenize", .args = args,
                       .log_path = log.data, .code = ST_CODE_DATA};
  st_status s = st_python_run(&job);
  free(args);
  st_strbuf_free(&log);
  return s;
}

/* The byte tokenizer's version-3 token file of |files|' documents at |out|. */
static st_status st__tokenize_documents(const st_data_options* o, const char* path, char** files, size_t n, uint64_t total,
                                        const char* out) {
  st__data_docbuf b = {.tokens = st_xmalloc(total * sizeof(uint16_t)), .cap = total};
  st_status s = ST_OK;
  for (size_t i = 0; i < n && !s; ++i) {
    char* data = NULL;
    size_t size = 0;
    s = st_fs_read_file(files[i], &data, &size);
    if (s) s = st_status_recode(s, ST_CODE_DATA, "reading corpus file");
    if (!s) s = st__data_file_documents(o, files[i], data, size, &b);
    free(data);
  }
  if (!s && b.n_docs == 0)
    s = st_status_make(ST_CODE_DATA, "corpus '%s' holds no documents (every one is empty)%s", path,
                       o->separator && o->separator[0] ? " after cutting at data.separator" : "");
  if (!s) {
    char* folder = st_path_join(o->cache_dir, "tokens");
    s = st_fs_mkdirs(folder);
    free(folder);
  }
  /* A marker writes the prompt table (zeros where a document has none). */
  const bool marked = o->prompt_marker && o->prompt_marker[0];
  if (!s) s = st_token_file_write_prompts(out, 256, ST_TOKENIZER_BYTE, b.tokens, b.n, b.starts, b.n_docs, marked ? b.prompts : NULL);
  free(b.tokens);
  free(b.starts);
  free(b.prompts);
  return s;
}

/* BPE's token file |out| (and its tokenizer.json) unless both are there.
 * With documents (packing none/pack) the split is the byte tokenizer's,
 * exactly: C writes the byte file of the documents beside |out| and the
 * script encodes each document (and its prompt) from it. */
static st_status st__tokenize_bpe(const st_data_options* o, const char* path, char** files, size_t n, uint64_t total,
                                  const char* out) {
  char* json = st__data_tokenizer_json_path(out);
  st_status s = ST_OK;
  if (!st__is_token_file(out) || access(json, R_OK) != 0) {
    char* folder = st_path_join(o->cache_dir, "tokens");
    s = st_fs_mkdirs(folder);
    free(folder);
    char* documents = NULL;
    if (!s && o->packing != ST_DATA_PACKING_CONCAT) {
      st_strbuf b = {0};
      st_strbuf_printf(&b, "%s.bytes-%ld", out, (long)getpid());
      documents = st_strbuf_take(&b);
      s = st__tokenize_documents(o, path, files, n, total, documents);
    }
    if (!s) s = st__run_bpe(o->tokenizer_vocab, o->tokenizer_from, documents, out, json, files, n);
    if (documents) remove(documents);
    free(documents);
  }
  free(json);
  return s;
}

/* Tokenizes the corpus at |path| into <cache>/tokens/<hash>.tok unless a
 * token file for the same names, sizes and mtimes is already there. */
static st_status st__tokenize_corpus(const st_data_options* o, const char* path, char** out_token_path) {
  const st_progress_options* progress = &o->progress;
  const char* cache_dir = o->cache_dir;
  bool bpe = o->tokenizer && !strcmp(o->tokenizer, "bpe");
  char** files = NULL;
  size_t n = 0;
  ST_RETURN(st__corpus_files(path, &files, &n));
  st_strbuf ident = {0};
  /* The kind and the vocabulary are part of the key: one corpus makes a
   * different token file for each tokenizer. */
  if (bpe) {
    st_strbuf_printf(&ident, "bpe-tokenizer-v1 vocab=%u\n", o->tokenizer_vocab);
    /* The trainer's source too: a changed training rule must not be served
     * from an old cache (an installed strata without the source tree
     * keys on the rest). */
    char* src = st_path_join(st_source_dir(), "python/strata_jax/tokenize.py");
    char sha[65];
    st_status r = st_sha256_file_hex(src, sha);
    if (!r) st_strbuf_printf(&ident, "tokenize.py=%s\n", sha);
    st_status_free(r);
    free(src);
    if (o->tokenizer_from) {
      /* Applied, not trained: keyed by the tokenizer's bytes. */
      r = st_sha256_file_hex(o->tokenizer_from, sha);
      if (r) {
        st_strbuf_free(&ident);
        st__free_list(files, n);
        return st_status_recode(r, ST_CODE_DATA, "the tokenizer to apply");
      }
      st_strbuf_printf(&ident, "apply=%s\n", sha);
    }
  } else
    st_strbuf_append(&ident, "byte-tokenizer-v1\n");
  /* Documents (packing none/pack) make another token file (version 3, no
   * separator lines); concat keeps today's key and file. */
  const bool docs = o->packing != ST_DATA_PACKING_CONCAT;
  if (docs) {
    const char* sep = o->separator ? o->separator : "";
    const char* field = o->jsonl_field && o->jsonl_field[0] ? o->jsonl_field : "text";
    st_strbuf_printf(&ident, "documents-v3 separator=%zu:%s jsonl_field=%zu:%s\n", strlen(sep), sep, strlen(field), field);
    /* A marker changes the tokens (its line dropped) and adds the prompt
     * table; without one the key is as before. */
    const char* marker = o->prompt_marker ? o->prompt_marker : "";
    if (marker[0]) st_strbuf_printf(&ident, "prompt_marker=%zu:%s\n", strlen(marker), marker);
  }
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    struct stat st;
    if (stat(files[i], &st) != 0) continue;
    st_strbuf_printf(&ident, "%s %lld %lld\n", files[i], (long long)st.st_size, (long long)st.st_mtime);
    total += (uint64_t)st.st_size;
  }
  if (n == 0 || total == 0) {
    st_strbuf_free(&ident);
    st__free_list(files, n);
    return st_status_make(ST_CODE_DATA, "corpus '%s' is empty (no text files with content); set data.path to a text corpus or data.synthetic=true",
                          path);
  }
  char hash[65];
  st_sha256_hex(ident.data, ident.len, hash);
  st_strbuf_free(&ident);
  char name[64];
  snprintf(name, sizeof(name), "tokens/%.16s.tok", hash);
  char* out = st_path_join(cache_dir, name);
  if (bpe) {
    st_status s = st__tokenize_bpe(o, path, files, n, total, out);
    st__free_list(files, n);
    if (s) {
      free(out);
      return s;
    }
    *out_token_path = out;
    return ST_OK;
  }
  if (st__is_token_file(out)) {
    st__free_list(files, n);
    *out_token_path = out;
    return ST_OK;
  }
  if (docs) {
    st_status s = st__tokenize_documents(o, path, files, n, total, out);
    st__free_list(files, n);
    if (s) {
      free(out);
      return s;
    }
    *out_token_path = out;
    return ST_OK;
  }
  uint16_t* tokens = st_xmalloc(total * sizeof(uint16_t));
  uint64_t k = 0;
  st_status s = ST_OK;
  /* A large corpus takes a while to read: bytes tokenized so far. */
  const bool show = st_progress_wanted(progress, (int64_t)total);
  st_progress_line line;
  if (show) st_progress_line_start(&line, "tokenize", "MiB", (int64_t)total);
  for (size_t i = 0; i < n && !s; ++i) {
    char* data = NULL;
    size_t size = 0;
    st_status r = st_fs_read_file(files[i], &data, &size);
    if (r) {
      s = st_status_recode(r, ST_CODE_DATA, "reading corpus file");
      break;
    }
    for (size_t j = 0; j < size && k < total; ++j) {
      tokens[k++] = (unsigned char)data[j];
      if (show && (k & 0xfffff) == 0) st_progress_line_update(&line, (int64_t)k);
    }
    free(data);
    if (show) st_progress_line_update(&line, (int64_t)k);
  }
  /* A file that shrank since it was sized ends short: end the line anyway
   * (an error ends it where it stopped). */
  if (show && !s) st_progress_line_update(&line, (int64_t)total);
  else if (show && !line.ended) fputc('\n', stderr);
  st__free_list(files, n);
  if (!s) {
    char* folder = st_path_join(cache_dir, "tokens");
    s = st_fs_mkdirs(folder);
    free(folder);
  }
  if (!s) s = st_token_file_write(out, 256, ST_TOKENIZER_BYTE, tokens, k);
  free(tokens);
  if (s) {
    free(out);
    return s;
  }
  *out_token_path = out;
  return ST_OK;
}

/* data.synthetic; with documents (packing none/pack), document d holds
 * 8 + (d * 7919) % 249 tokens (the last one the rest). */
static st_status st__synthetic(const st_data_options* o, const char* cache_dir, char** out_token_path) {
  const uint64_t n = 65536;
  const bool docs = o->packing != ST_DATA_PACKING_CONCAT;
  uint16_t* tokens = st_xmalloc(n * sizeof(uint16_t));
  for (uint64_t i = 0; i < n; ++i) tokens[i] = (uint16_t)((i % 97 + 3 * ((i / 97) % 13)) % o->vocab_size);
  uint64_t* starts = NULL;
  uint64_t n_docs = 0;
  for (uint64_t at = 0; docs && at < n; at += 8 + (n_docs * 7919) % 249) {
    starts = st_xrealloc(starts, (n_docs + 1) * sizeof(uint64_t));
    starts[n_docs++] = at;
  }
  char name[64];
  snprintf(name, sizeof(name), "tokens/synthetic-v%u%s.tok", o->vocab_size, docs ? "-docs" : "");
  char* out = st_path_join(cache_dir, name);
  char* folder = st_path_join(cache_dir, "tokens");
  st_status s = st_fs_mkdirs(folder);
  free(folder);
  if (!s) s = st_token_file_write_docs(out, o->vocab_size, ST_TOKENIZER_NONE, tokens, n, starts, n_docs);
  free(tokens);
  free(starts);
  if (s) {
    free(out);
    return s;
  }
  *out_token_path = out;
  return ST_OK;
}

/* The token file must come from the tokenizer the config names: a token
 * file of another tokenizer would train on ids that mean other text. BPE's
 * tokenizer.json beside the token file must be the one the header names. */
static st_status st__check_tokenizer(const st_data_options* o, st__data_source* ds) {
  st_token_file_info info;
  ST_RETURN(st_token_file_info_read(ds->token_path, &info));
  bool bpe = o->tokenizer && !strcmp(o->tokenizer, "bpe");
  if (!bpe && info.kind == ST_TOKENIZER_BPE)
    return st_status_make(ST_CODE_DATA,
                          "token file '%s' holds BPE tokens (tokenizer %s), but data.tokenizer is byte (tokenizer byte); "
                          "set data.tokenizer=bpe with its data.vocab_size, or point data.path at the text corpus",
                          ds->token_path, info.hash);
  if (!bpe) return ST_OK;
  if (info.kind != ST_TOKENIZER_BPE)
    return st_status_make(ST_CODE_DATA,
                          "token file '%s' holds %s tokens (tokenizer %s), but data.tokenizer is bpe; point data.path at "
                          "the text corpus (strata trains the tokenizer) or at a BPE token file",
                          ds->token_path, info.kind == ST_TOKENIZER_BYTE ? "byte" : "generated", info.hash);
  if (o->tokenizer_from) {
    /* First: the tokenizer to use is the cause to name. */
    char want[65];
    st_status r = st_sha256_file_hex(o->tokenizer_from, want);
    if (r) return st_status_recode(r, ST_CODE_DATA, "the tokenizer to apply");
    if (strncmp(want, info.hash, 16) != 0)
      return st_status_make(ST_CODE_DATA,
                            "token file '%s' holds tokens of BPE tokenizer %s, but the tokenizer to use is '%s', tokenizer "
                            "%.16s: its ids would mean other text; point data.path at the text corpus",
                            ds->token_path, info.hash, o->tokenizer_from, want);
  }
  char* json = st__data_tokenizer_json_path(ds->token_path);
  char sha[65];
  st_status s = st_sha256_file_hex(json, sha);
  if (s) {
    s = st_status_recode(s, ST_CODE_DATA,
                         "token file '%s' was made by BPE tokenizer %s, whose tokenizer.json belongs beside it as '%s'",
                         ds->token_path, info.hash, json);
  } else if (strncmp(sha, info.hash, 16) != 0) {
    s = st_status_make(ST_CODE_DATA,
                       "token file '%s' was made by BPE tokenizer %s, but '%s' beside it is tokenizer %.16s (SHA-256, "
                       "first 16 hex digits): the ids would decode to other text; re-tokenize the corpus",
                       ds->token_path, info.hash, json, sha);
  } else if (info.vocab_size != o->tokenizer_vocab) {
    s = st_status_make(ST_CODE_DATA,
                       "token file '%s' was made by BPE tokenizer %s of %u tokens, but data.vocab_size asks for %u "
                       "(0 there: model.vocab_size); set data.vocab_size=%u or re-tokenize the corpus",
                       ds->token_path, info.hash, info.vocab_size, o->tokenizer_vocab, info.vocab_size);
  }
  if (s) {
    free(json);
    return s;
  }
  ds->tokenizer_json = json;
  return ST_OK;
}

/* Where source |src|'s validation tokens begin. */
static uint64_t st__val_start(const st_dataset* ds, const st__data_source* src) {
  if (ds->packing == ST_DATA_PACKING_CONCAT) return ds->n_split[0];
  return src->n_train_docs < src->n_docs ? src->docs[src->n_train_docs] : src->count;
}

/* Bytes of text per token in each split (after the split is set). BPE
 * decodes through the tokenizer.json checked against the header. */
static st_status st__bytes_per_token(st_dataset* ds) {
  ds->bytes_per_token[0] = ds->bytes_per_token[1] = ds->src[0].info.kind == ST_TOKENIZER_NONE ? 0.0 : 1.0;
  if (ds->src[0].info.kind != ST_TOKENIZER_BPE) return ST_OK;
  uint64_t bytes[2] = {0, 0};
  for (int k = 0; k < ds->n_src; ++k) {
    const st__data_source* src = &ds->src[k];
    st_tokenizer* t = NULL;
    ST_RETURN(st_tokenizer_open(src->token_path, &t));
    const uint64_t val = st__val_start(ds, src);
    for (uint64_t i = 0; i < src->count; ++i) {
      size_t len = 0;
      if (!st_tokenizer_token(t, src->tokens[i], &len)) {
        uint32_t vocab = st_tokenizer_vocab_size(t);
        st_tokenizer_destroy(t);
        return st_status_make(ST_CODE_DATA, "token file '%s': token %" PRIu64 " is %u, outside its tokenizer's %u entries",
                              src->token_path, i, src->tokens[i], vocab);
      }
      bytes[i >= val] += len;
    }
    st_tokenizer_destroy(t);
  }
  for (int k = 0; k < 2; ++k) ds->bytes_per_token[k] = ds->n_split[k] ? (double)bytes[k] / (double)ds->n_split[k] : 0.0;
  return ST_OK;
}

/* Opens source |given| (data.path or data.sources[i]) into |src|. */
static st_status st__source_open(const st_data_options* o, const char* given, st__data_source* src) {
  const char* path = given && given[0] ? given : ST_DATA_DEFAULT_CORPUS;
  src->given = st_xstrdup(o->synthetic ? "synthetic" : path);
  struct stat pst;
  /* Opening a FIFO blocks until a writer comes (forever, for a training
   * run); sockets and devices are no corpus either. Checked before any open. */
  if (!o->synthetic && stat(path, &pst) == 0 && !S_ISREG(pst.st_mode) && !S_ISDIR(pst.st_mode))
    return st_status_make(ST_CODE_DATA,
                          "data.path '%s' is a %s, not a regular file or a folder; point data.path at a text file, a "
                          "folder of text files or a token file",
                          path,
                          S_ISFIFO(pst.st_mode)                          ? "FIFO"
                          : S_ISSOCK(pst.st_mode)                        ? "socket"
                          : S_ISCHR(pst.st_mode) || S_ISBLK(pst.st_mode) ? "device"
                                                                         : "special file");
  st_status s = ST_OK;
  if (o->synthetic)
    s = st__synthetic(o, o->cache_dir, &src->token_path);
  else if (!st_fs_is_dir(path) && st__is_token_file(path))
    src->token_path = st_xstrdup(path);
  else
    s = st__tokenize_corpus(o, path, &src->token_path);
  if (!s && !o->synthetic) s = st__check_tokenizer(o, src);
  if (!s) s = st__token_file_read(src->token_path, o->vocab_size, src);
  return s;
}

/* Names what the user gave (data.path) and what was read (the token file,
 * often a cache file they never named). Caller frees. */
static char* st__source_name(const st_data_options* o, const st__data_source* src) {
  st_strbuf what = {0};
  if (o->synthetic)
    st_strbuf_printf(&what, "the synthetic corpus (token file '%s')", src->token_path);
  else if (!strcmp(src->given, src->token_path))
    st_strbuf_printf(&what, "token file '%s' (%s)", src->given, o->n_sources ? "data.sources" : "data.path");
  else
    st_strbuf_printf(&what, "corpus '%s' (%s; tokenized into '%s')", src->given, o->n_sources ? "data.sources" : "data.path",
                     src->token_path);
  return st_strbuf_take(&what);
}

/* concat: the last floor(N * f) tokens are validation; both splits hold a window. */
static st_status st__split_tokens(const st_data_options* o, st_dataset* ds) {
  const st__data_source* src = &ds->src[0];
  uint64_t n_val = (uint64_t)((double)src->count * o->val_fraction);
  ds->n_split[0] = src->count - n_val;
  ds->n_split[1] = n_val;
  uint64_t need = (uint64_t)o->seq_len + 1;
  if (ds->n_split[0] >= need && n_val >= need) return ST_OK;
  char* what = st__source_name(o, src);
  st_status s = st_status_make(ST_CODE_DATA,
                               "%s has %" PRIu64 " tokens: too few for a training and a validation split of at least model.seq_len+1 = %" PRIu64
                               " tokens each (data.val_fraction=%g); use a larger corpus or a shorter model.seq_len",
                               what, src->count, need, o->val_fraction);
  free(what);
  return s;
}

/* An empty split, or one of documents that are all shorter than 2 tokens,
 * would leave the stream nothing to draw. */
static bool st__split_has_pairs(const st__data_source* src, uint64_t first, uint64_t n) {
  for (uint64_t g = first; g < first + n; ++g) {
    uint64_t end = g + 1 < src->n_docs ? src->docs[g + 1] : src->count;
    if (end - src->docs[g] >= 2) return true;
  }
  return false;
}

/* none/pack: per source, the last floor(n_docs * f) documents are
 * validation; each split holds a document of at least 2 tokens. */
static st_status st__split_documents(const st_data_options* o, st_dataset* ds) {
  for (int k = 0; k < ds->n_src; ++k) {
    st__data_source* src = &ds->src[k];
    if (!src->docs) {
      return st_status_make(ST_CODE_DATA,
                            "token file '%s' (%s) is version %u, without documents: data.packing=%s needs a version-3 "
                            "token file; point %s at the text corpus (strata tokenizes it with its documents) or set "
                            "data.packing=concat",
                            src->token_path, src->given, src->info.version,
                            o->packing == ST_DATA_PACKING_PACK ? "pack" : "none", o->n_sources ? "data.sources" : "data.path");
    }
    if (k > 0 && strcmp(src->info.hash, ds->src[0].info.hash) != 0)
      return st_status_make(ST_CODE_DATA, "source '%s' holds tokens of tokenizer %s, but source '%s' of tokenizer %s: "
                            "the sources of a run share one tokenizer", src->given, src->info.hash, ds->src[0].given,
                            ds->src[0].info.hash);
    uint64_t n_val = (uint64_t)((double)src->n_docs * o->val_fraction);
    src->n_train_docs = src->n_docs - n_val;
    if (!n_val || !st__split_has_pairs(src, 0, src->n_train_docs) ||
        !st__split_has_pairs(src, src->n_train_docs, n_val)) {
      char* what = st__source_name(o, src);
      st_status s = st_status_make(ST_CODE_DATA,
                                   "%s has %" PRIu64 " documents: too few for a training and a validation split each "
                                   "holding a document of at least 2 tokens (the last floor(%" PRIu64 " * %g) = %" PRIu64
                                   " documents are validation); use a larger corpus, a larger data.val_fraction or "
                                   "check data.separator",
                                   what, src->n_docs, src->n_docs, o->val_fraction, n_val);
      free(what);
      return s;
    }
    const uint64_t val = st__val_start(ds, src);
    ds->n_split[0] += val;
    ds->n_split[1] += src->count - val;
  }
  return ST_OK;
}

st_status st_dataset_open(const st_data_options* o, st_dataset** out_dataset) {
  *out_dataset = NULL;
  if (o->n_sources < 0 || o->n_sources > ST_DATA_MAX_SOURCES || (o->n_sources && o->packing == ST_DATA_PACKING_CONCAT))
    return st_status_make(ST_CODE_CONFIG, "data.sources (%d of them) needs data.packing none or pack and at most %d sources",
                          o->n_sources, ST_DATA_MAX_SOURCES);
  /* Documents matter to none and pack only: say so rather than ignore the
   * keys (data.prompt_marker and data.sources are refused by the schema). */
  const bool sep = o->separator && o->separator[0], field = o->jsonl_field && strcmp(o->jsonl_field, "text");
  if (o->packing == ST_DATA_PACKING_CONCAT && (sep || field))
    fprintf(stderr, "strata: warning: %s has no effect with data.packing=concat (windows over the whole corpus); "
            "documents are read by data.packing none or pack\n", sep ? "data.separator" : "data.jsonl_field");
  st_dataset* ds = st_xcalloc(1, sizeof(*ds));
  ds->seed = o->seed;
  ds->seq_len = o->seq_len;
  ds->packing = o->packing;
  ds->n_src = o->n_sources ? o->n_sources : 1;
  ds->src = st_xcalloc((size_t)ds->n_src, sizeof(st__data_source));
  double total = 0;
  for (int k = 0; k < ds->n_src; ++k) total += o->n_sources ? o->weights[k] : 1.0;
  /* Cumulative in order, as the Python mirror sums them. */
  double run = 0;
  for (int k = 0; k < ds->n_src; ++k) {
    const double w = o->n_sources ? o->weights[k] : 1.0;
    ds->src[k].weight = w / total;
    run += w;
    ds->cum[k] = run / total;
  }
  st_status s = ST_OK;
  for (int k = 0; k < ds->n_src && !s; ++k) s = st__source_open(o, o->n_sources ? o->sources[k] : o->path, &ds->src[k]);
  for (int k = 0; k < ds->n_src && !s; ++k) ds->count += ds->src[k].count;
  if (!s) s = ds->packing == ST_DATA_PACKING_CONCAT ? st__split_tokens(o, ds) : st__split_documents(o, ds);
  if (!s) s = st__bytes_per_token(ds);
  if (s) {
    st_dataset_destroy(ds);
    return s;
  }
  if (ds->packing != ST_DATA_PACKING_CONCAT)
    for (int i = 0; i < 2; ++i) ds->cursor[i] = st__data_cursor_new(ds);
  *out_dataset = ds;
  return ST_OK;
}

void st_dataset_destroy(st_dataset* ds) {
  if (!ds) return;
  for (int k = 0; k < ds->n_src; ++k) {
    free(ds->src[k].given);
    free(ds->src[k].token_path);
    free(ds->src[k].tokenizer_json);
    free(ds->src[k].tokens);
    free(ds->src[k].docs);
    free(ds->src[k].prompts);
  }
  free(ds->src);
  for (int i = 0; i < 2; ++i) st__data_cursor_free(ds->cursor[i]);
  free(ds);
}

const char* st_dataset_token_path(const st_dataset* ds) { return ds->src[0].token_path; }
const char* st_dataset_tokenizer_hash(const st_dataset* ds) { return ds->src[0].info.hash; }
const char* st_dataset_tokenizer_json(const st_dataset* ds) { return ds->src[0].tokenizer_json; }
double st_dataset_bytes_per_token(const st_dataset* ds, int stream) { return ds->bytes_per_token[stream == ST_STREAM_TRAIN ? 0 : 1]; }
uint64_t st_dataset_token_count(const st_dataset* ds) { return ds->count; }
uint64_t st_dataset_split_tokens(const st_dataset* ds, int stream) { return ds->n_split[stream == ST_STREAM_TRAIN ? 0 : 1]; }
int st_dataset_packing(const st_dataset* ds) { return ds->packing; }
int st_dataset_source_count(const st_dataset* ds) { return ds->n_src; }

st_status st_dataset_sources(const st_dataset* ds, uint64_t next_index, st_data_source_info* out) {
  const uint64_t* drawn = ds->packing == ST_DATA_PACKING_CONCAT ? NULL : st__data_drawn_at(ds, ST_STREAM_TRAIN, next_index);
  for (int k = 0; k < ds->n_src; ++k) {
    const st__data_source* src = &ds->src[k];
    char sha[65];
    st_status s = st_sha256_file_hex(src->token_path, sha);
    if (s) return st_status_recode(s, ST_CODE_DATA, "hashing the token file of source '%s'", src->given);
    out[k] = (st_data_source_info){.path = src->given, .token_path = src->token_path,
                                   .documents = src->docs ? src->n_docs : 1, .drawn = drawn ? drawn[k] : 0,
                                   .weight = src->weight};
    snprintf(out[k].hash, sizeof(out[k].hash), "%.16s", sha);
  }
  return ST_OK;
}

void st_dataset_fill(const st_dataset* ds, int stream, uint64_t first, int64_t count, int32_t* inputs, int32_t* targets,
                     float* mask, int32_t* positions) {
  if (ds->packing != ST_DATA_PACKING_CONCAT) {
    st__data_fill_docs(ds, stream, first, count, inputs, targets, mask, positions);
    return;
  }
  const st__data_source* src = &ds->src[0];
  const uint16_t* base = stream == ST_STREAM_TRAIN ? src->tokens : src->tokens + ds->n_split[0];
  uint64_t n = st_dataset_split_tokens(ds, stream);
  int64_t T = ds->seq_len;
  for (int64_t i = 0; i < count; ++i) {
    uint64_t s = st_data_window_start(ds->seed, (uint64_t)stream, first + (uint64_t)i, n, (uint64_t)T);
    for (int64_t t = 0; t < T; ++t) {
      inputs[i * T + t] = base[s + (uint64_t)t];
      targets[i * T + t] = base[s + (uint64_t)t + 1];
      if (mask) mask[i * T + t] = 1.0f;
      if (positions) positions[i * T + t] = (int32_t)t;
    }
  }
}
