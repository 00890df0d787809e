/* tokenizer.c — ids -> bytes for the byte tokenizer and byte-level BPE
 * (docs/data.md, "Tokenizer").
 *
 * A byte-level BPE tokenizer.json (Hugging Face tokenizers, written by
 * strata_jax.tokenize) spells each vocabulary entry in GPT-2's
 * bytes-to-unicode alphabet: every byte is one character, the printable
 * Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) as themselves and the
 * other 68 as U+0100, U+0101, ... in byte order. Decoding an id is mapping
 * its entry's characters back to bytes (the inverse is computed here, not
 * copied), and a sequence is the concatenation: no normalizer or special
 * token is involved (strata's tokenizers have none, and loading refuses one
 * that has added tokens). The file is untrusted: its size, the vocabulary's
 * size and every entry's length are bounded before anything is allocated
 * from them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>

#include "data/internal.h"
#include "strata/base.h"
#include "strata/data.h"

#define ST__MAX_VOCAB 65536u /* strata keeps tokens as u16 */

struct st_tokenizer {
  uint32_t vocab;
  char hash[ST_TOKENIZER_HASH_CHARS];
  unsigned char* bytes;        /* every entry's bytes, concatenated; NULL for the byte tokenizer */
  size_t* offsets;             /* [vocab + 1]: entry i is bytes[offsets[i] .. offsets[i+1]) */
  unsigned char identity[256]; /* the byte tokenizer's entries */
};

/* The bytes GPT-2's alphabet writes as themselves. */
static bool st__tok_printable(uint32_t b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* |remap|[k] = the k-th byte (in byte order) that is not printable, i.e.
 * the byte that U+0100 + k stands for. */
static void st__remap_table(unsigned char remap[68]) {
  int k = 0;
  for (uint32_t b = 0; b < 256; ++b)
    if (!st__tok_printable(b)) remap[k++] = (unsigned char)b;
}

/* One UTF-8 character of s[0..n); returns its length, 0 when malformed. */
static size_t st__utf8_next(const unsigned char* s, size_t n, uint32_t* cp) {
  if (n == 0) return 0;
  unsigned char c = s[0];
  size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || len > n) return 0;
  uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (size_t i = 1; i < len; ++i) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = v << 6 | (s[i] & 0x3Fu);
  }
  *cp = v;
  return len;
}

st_tokenizer* st_tokenizer_byte(void) {
  st_tokenizer* t = st_xcalloc(1, sizeof(*t));
  t->vocab = 256;
  snprintf(t->hash, sizeof(t->hash), "byte");
  for (int b = 0; b < 256; ++b) t->identity[b] = (unsigned char)b;
  return t;
}

void st_tokenizer_destroy(st_tokenizer* t) {
  if (!t) return;
  free(t->bytes);
  free(t->offsets);
  free(t);
}

uint32_t st_tokenizer_vocab_size(const st_tokenizer* t) { return t->vocab; }
const char* st_tokenizer_hash(const st_tokenizer* t) { return t->hash; }

const unsigned char* st_tokenizer_token(const st_tokenizer* t, int32_t id, size_t* out_len) {
  *out_len = 0;
  if (id < 0 || (uint32_t)id >= t->vocab) return NULL;
  if (!t->bytes) {
    *out_len = 1;
    return &t->identity[id];
  }
  *out_len = t->offsets[id + 1] - t->offsets[id];
  return t->bytes + t->offsets[id];
}

int32_t st_tokenizer_find(const st_tokenizer* t, const void* bytes, size_t n) {
  for (uint32_t i = 0; i < t->vocab; ++i) {
    size_t len = 0;
    const unsigned char* b = st_tokenizer_token(t, (int32_t)i, &len);
    if (len == n && !memcmp(b, bytes, n)) return (int32_t)i;
  }
  return -1;
}

st_status st_tokenizer_decode(const st_tokenizer* t, const int32_t* ids, size_t n, st_strbuf* out) {
  for (size_t i = 0; i < n; ++i) {
    size_t len = 0;
    const unsigned char* b = st_tokenizer_token(t, ids[i], &len);
    if (!b)
      return st_status_make(ST_CODE_DATA, "id %zu of %zu is %d, outside tokenizer %s's vocabulary of %u tokens", i, n,
                            (int)ids[i], t->hash, t->vocab);
    st_strbuf_append_n(out, (const char*)b, len);
  }
  return ST_OK;
}

static const char* st__tok_type_of(const json_t* obj) {
  const json_t* v = json_is_object(obj) ? json_object_get(obj, "type") : NULL;
  return json_is_string(v) ? json_string_value(v) : NULL;
}

st_status st_tokenizer_from_json(const char* origin, const unsigned char* data, size_t size, st_tokenizer** out) {
  *out = NULL;
  if (size > ST_TOKENIZER_MAX_JSON_BYTES)
    return st_status_make(ST_CODE_DATA, "tokenizer '%s': %zu bytes, more than the %u a tokenizer.json may have", origin,
                          size, ST_TOKENIZER_MAX_JSON_BYTES);
  json_t* j = NULL;
  st_status s = st_json_parse((const char*)data, size, origin, &j);
  if (s) return st_status_recode(s, ST_CODE_DATA, "tokenizer '%s'", origin);
  st_tokenizer* t = NULL;
  const json_t* model = json_is_object(j) ? json_object_get(j, "model") : NULL;
  const json_t* vocab = json_is_object(model) ? json_object_get(model, "vocab") : NULL;
  const json_t* added = json_is_object(j) ? json_object_get(j, "added_tokens") : NULL;
  const char* mtype = st__tok_type_of(model);
  const char* dtype = st__tok_type_of(json_is_object(j) ? json_object_get(j, "decoder") : NULL);
  if (!json_is_object(j) || !json_is_object(vocab) || !mtype || strcmp(mtype, "BPE") != 0) {
    s = st_status_make(
        ST_CODE_DATA,
        "tokenizer '%s': not a BPE tokenizer.json (needs \"model\": {\"type\": \"BPE\", \"vocab\": {...}})", origin);
    goto done;
  }
  if (!dtype || strcmp(dtype, "ByteLevel") != 0) {
    s = st_status_make(
        ST_CODE_DATA,
        "tokenizer '%s': decoder is %s, strata decodes byte-level BPE only (\"decoder\": {\"type\": \"ByteLevel\"})",
        origin, dtype ? dtype : "missing");
    goto done;
  }
  if (added && !json_is_null(added) && (!json_is_array(added) || json_array_size(added) != 0)) {
    s = st_status_make(ST_CODE_DATA,
                       "tokenizer '%s': has added (special) tokens, which strata's tokenizers do not have and its "
                       "decoder does not handle",
                       origin);
    goto done;
  }
  size_t n = json_object_size(vocab);
  if (n == 0 || n > ST__MAX_VOCAB) {
    s = st_status_make(ST_CODE_DATA, "tokenizer '%s': a vocabulary of %zu entries; strata takes 1 to %u", origin, n,
                       ST__MAX_VOCAB);
    goto done;
  }
  unsigned char remap[68];
  st__remap_table(remap);
  t = st_xcalloc(1, sizeof(*t));
  t->vocab = (uint32_t)n;
  /* Each entry is first decoded into its slot of |scratch|, then packed. */
  size_t* lens = st_xcalloc(n, sizeof(size_t));
  bool* seen = st_xcalloc(n, sizeof(bool));
  unsigned char** entries = st_xcalloc(n, sizeof(unsigned char*));
  const char* key;
  const json_t* value;
  size_t total = 0;
  json_object_foreach((json_t*)vocab, key, value) {
    int64_t id = -1;
    if (!json_is_integer(value) || (id = (int64_t)json_integer_value(value)) < 0 || (uint64_t)id >= n || seen[id]) {
      s = st_status_make(
          ST_CODE_DATA,
          "tokenizer '%s': vocabulary entry '%.40s' has id %s; ids must be the integers 0..%zu, each once", origin, key,
          json_is_integer(value) ? (id < 0 || (uint64_t)id >= n ? "out of range" : "given twice") : "not an integer",
          n - 1);
      break;
    }
    seen[id] = true;
    const unsigned char* k = (const unsigned char*)key;
    size_t klen = strlen(key);
    if (klen == 0 || klen > 4 * (size_t)ST_TOKENIZER_MAX_TOKEN_BYTES) {
      s = st_status_make(ST_CODE_DATA,
                         "tokenizer '%s': vocabulary entry %lld is %zu bytes of text; an entry has 1 to %u symbols",
                         origin, (long long)id, klen, ST_TOKENIZER_MAX_TOKEN_BYTES);
      break;
    }
    unsigned char* out_bytes = st_xmalloc(klen);
    size_t m = 0;
    for (size_t i = 0; i < klen && !s;) {
      uint32_t cp = 0;
      size_t step = st__utf8_next(k + i, klen - i, &cp);
      if (step == 0)
        s = st_status_make(ST_CODE_DATA, "tokenizer '%s': vocabulary entry %lld is not UTF-8", origin, (long long)id);
      else if (cp < 256 && st__tok_printable(cp))
        out_bytes[m++] = (unsigned char)cp;
      else if (cp >= 256 && cp < 256 + 68)
        out_bytes[m++] = remap[cp - 256];
      else
        s = st_status_make(
            ST_CODE_DATA,
            "tokenizer '%s': vocabulary entry %lld has the character U+%04X, which is no byte of the ByteLevel "
            "alphabet",
            origin, (long long)id, (unsigned)cp);
      i += step ? step : klen;
    }
    if (!s && m > ST_TOKENIZER_MAX_TOKEN_BYTES)
      s = st_status_make(ST_CODE_DATA, "tokenizer '%s': vocabulary entry %lld is %zu bytes; at most %u", origin,
                         (long long)id, m, ST_TOKENIZER_MAX_TOKEN_BYTES);
    entries[id] = out_bytes;
    lens[id] = m;
    total += m;
    if (s) break;
  }
  if (!s) {
    t->bytes = st_xmalloc(total ? total : 1);
    t->offsets = st_xmalloc((n + 1) * sizeof(size_t));
    size_t at = 0;
    for (size_t i = 0; i < n; ++i) {
      t->offsets[i] = at;
      memcpy(t->bytes + at, entries[i], lens[i]);
      at += lens[i];
    }
    t->offsets[n] = at;
    char sha[65];
    st_sha256_hex(data, size, sha);
    memcpy(t->hash, sha, 16);
    t->hash[16] = '\0';
  }
  for (size_t i = 0; i < n; ++i) free(entries[i]);
  free(entries);
  free(seen);
  free(lens);
done:
  json_decref(j);
  if (s) {
    st_tokenizer_destroy(t);
    return s;
  }
  *out = t;
  return ST_OK;
}

static st_status st__load_json_file(const char* path, st_tokenizer** out) {
  struct stat st;
  if (stat(path, &st) != 0)
    return st_status_make(ST_CODE_DATA, "cannot read tokenizer '%s': %s", path, strerror(errno));
  if ((uint64_t)st.st_size > ST_TOKENIZER_MAX_JSON_BYTES)
    return st_status_make(ST_CODE_DATA, "tokenizer '%s': %lld bytes, more than the %u a tokenizer.json may have", path,
                          (long long)st.st_size, ST_TOKENIZER_MAX_JSON_BYTES);
  char* data = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &data, &size);
  if (s) return st_status_recode(s, ST_CODE_DATA, "reading tokenizer");
  s = st_tokenizer_from_json(path, (const unsigned char*)data, size, out);
  free(data);
  return s;
}

st_status st_tokenizer_open(const char* path, st_tokenizer** out) {
  *out = NULL;
  struct stat st;
  if (stat(path, &st) != 0)
    return st_status_make(ST_CODE_DATA, "cannot open tokenizer of '%s': %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    char* json = st_path_join(path, "tokenizer.json");
    st_status s = ST_OK;
    if (access(json, F_OK) == 0)
      s = st__load_json_file(json, out);
    else
      *out = st_tokenizer_byte(); /* a byte run writes no tokenizer.json */
    free(json);
    return s;
  }
  st_token_file_info info;
  st_status s = st_token_file_info_read(path, &info);
  if (s) {
    /* Not a token file: a tokenizer.json. */
    st_status_free(s);
    return st__load_json_file(path, out);
  }
  if (info.kind != ST_TOKENIZER_BPE) {
    *out = st_tokenizer_byte();
    return ST_OK;
  }
  char* json = st__data_tokenizer_json_path(path);
  st_tokenizer* t = NULL;
  s = st__load_json_file(json, &t);
  if (!s && strcmp(t->hash, info.hash) != 0)
    s = st_status_make(ST_CODE_DATA, "token file '%s' was made by BPE tokenizer %s, but '%s' beside it is tokenizer %s",
                       path, info.hash, json, t->hash);
  free(json);
  if (s) {
    st_tokenizer_destroy(t);
    return s;
  }
  *out = t;
  return ST_OK;
}
