/* documents.c — a corpus file's documents for data.packing none and pack
 * (docs/data.md, "Documents"): a *.jsonl file's lines are JSON objects, one
 * document each (the data.jsonl_field string); another file is split at
 * the lines that are exactly data.separator, or is one document. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "data/internal.h"
#include "strata/base.h"
#include "strata/data.h"

static void st__doc_append(st__data_docbuf* b, const unsigned char* bytes, size_t n) {
  for (size_t i = 0; i < n && b->n < b->cap; ++i) b->tokens[b->n++] = bytes[i];
}

/* Ends the document begun at b->open: an empty one is dropped (document
 * starts are strictly ascending). */
static void st__doc_end(st__data_docbuf* b) {
  if (b->n == b->open) return;
  if (b->n_docs == b->cap_docs) {
    b->cap_docs = b->cap_docs ? 2 * b->cap_docs : 1024;
    b->starts = st_xrealloc(b->starts, b->cap_docs * sizeof(uint64_t));
  }
  b->starts[b->n_docs++] = b->open;
  b->open = b->n;
}

static bool st__is_jsonl(const char* file) {
  size_t n = strlen(file);
  return n > 6 && !strcmp(file + n - 6, ".jsonl");
}

/* One JSON object per line; blank lines are skipped. */
static st_status st__jsonl_documents(const char* field, const char* file, const char* data, size_t size, st__data_docbuf* b) {
  uint64_t line = 0;
  for (size_t at = 0; at < size;) {
    const char* nl = memchr(data + at, '\n', size - at);
    size_t end = nl ? (size_t)(nl - data) : size;
    ++line;
    size_t i = at;
    while (i < end && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r')) ++i;
    if (i < end) {
      json_error_t err;
      json_t* j = json_loadb(data + at, end - at, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
      const json_t* v = json_is_object(j) ? json_object_get(j, field) : NULL;
      if (!json_is_string(v)) {
        st_status s = st_status_make(ST_CODE_DATA,
                                     "corpus file '%s' line %" PRIu64 ": %s; each line of a .jsonl file is a JSON object "
                                     "whose \"%s\" (data.jsonl_field) is the document's text",
                                     file, line, !j ? err.text : json_is_object(j) ? "no such string field" : "not an object",
                                     field);
        json_decref(j);
        return s;
      }
      st__doc_append(b, (const unsigned char*)json_string_value(v), json_string_length(v));
      st__doc_end(b);
      json_decref(j);
    }
    at = end + 1;
  }
  return ST_OK;
}

st_status st__data_file_documents(const st_data_options* o, const char* file, const char* data, size_t size,
                                  st__data_docbuf* b) {
  if (st__is_jsonl(file)) return st__jsonl_documents(o->jsonl_field && o->jsonl_field[0] ? o->jsonl_field : "text", file, data, size, b);
  const char* sep = o->separator ? o->separator : "";
  const size_t sep_len = strlen(sep);
  if (!sep_len) {
    st__doc_append(b, (const unsigned char*)data, size);
    st__doc_end(b);
    return ST_OK;
  }
  for (size_t at = 0; at < size;) {
    const char* nl = memchr(data + at, '\n', size - at);
    size_t end = nl ? (size_t)(nl - data) : size;
    if (end - at == sep_len && !memcmp(data + at, sep, sep_len))
      st__doc_end(b); /* the separator line is in no document */
    else
      st__doc_append(b, (const unsigned char*)data + at, (nl ? end + 1 : end) - at);
    at = end + 1;
  }
  st__doc_end(b); /* a file ends its last document */
  return ST_OK;
}
