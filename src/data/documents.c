/* documents.c — a corpus file's documents for data.packing none and pack
 * (docs/data.md, "Documents"): a *.jsonl file's lines are JSON objects, one
 * document each (the data.jsonl_field string); another file is split at
 * the lines that are exactly data.separator, or is one document. Inside a
 * document, the first line that is exactly data.prompt_marker ends its
 * prompt and is dropped. */
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
  const bool marked = b->marked;
  b->marked = false;
  if (b->n == b->open) return;
  if (b->n_docs == b->cap_docs) {
    b->cap_docs = b->cap_docs ? 2 * b->cap_docs : 1024;
    b->starts = st_xrealloc(b->starts, b->cap_docs * sizeof(uint64_t));
    b->prompts = st_xrealloc(b->prompts, b->cap_docs * sizeof(uint64_t));
  }
  b->starts[b->n_docs] = b->open;
  b->prompts[b->n_docs++] = marked ? b->prompt : 0; /* no marker: all completion */
  b->open = b->n;
}

/* A document's text: with a marker, cut into lines (each keeps its '\n');
 * the document's first line that is exactly the marker ends its prompt
 * and is in no document. */
static void st__doc_text(st__data_docbuf* b, const char* marker, const unsigned char* bytes, size_t n) {
  const size_t ml = marker ? strlen(marker) : 0;
  for (size_t at = 0; at < n;) {
    const unsigned char* nl = ml ? memchr(bytes + at, '\n', n - at) : NULL;
    const size_t end = nl ? (size_t)(nl - bytes) + 1 : n;
    const size_t body = end - at - (nl ? 1 : 0);
    if (ml && !b->marked && body == ml && !memcmp(bytes + at, marker, ml)) {
      b->marked = true;
      b->prompt = b->n - b->open;
    } else {
      st__doc_append(b, bytes + at, end - at);
    }
    at = end;
  }
}

static bool st__is_jsonl(const char* file) {
  size_t n = strlen(file);
  return n > 6 && !strcmp(file + n - 6, ".jsonl");
}

/* One JSON object per line; blank lines are skipped. */
static st_status st__jsonl_documents(const char* field, const char* marker, const char* file, const char* data, size_t size,
                                     st__data_docbuf* b) {
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
      st__doc_text(b, marker, (const unsigned char*)json_string_value(v), json_string_length(v));
      st__doc_end(b);
      json_decref(j);
    }
    at = end + 1;
  }
  return ST_OK;
}

st_status st__data_file_documents(const st_data_options* o, const char* file, const char* data, size_t size,
                                  st__data_docbuf* b) {
  const char* marker = o->prompt_marker;
  if (st__is_jsonl(file))
    return st__jsonl_documents(o->jsonl_field && o->jsonl_field[0] ? o->jsonl_field : "text", marker, file, data, size, b);
  const char* sep = o->separator ? o->separator : "";
  const size_t sep_len = strlen(sep);
  if (!sep_len) {
    st__doc_text(b, marker, (const unsigned char*)data, size);
    st__doc_end(b);
    return ST_OK;
  }
  for (size_t at = 0; at < size;) {
    const char* nl = memchr(data + at, '\n', size - at);
    size_t end = nl ? (size_t)(nl - data) : size;
    if (end - at == sep_len && !memcmp(data + at, sep, sep_len))
      st__doc_end(b); /* the separator line is in no document */
    else
      st__doc_text(b, marker, (const unsigned char*)data + at, (nl ? end + 1 : end) - at);
    at = end + 1;
  }
  st__doc_end(b); /* a file ends its last document */
  return ST_OK;
}
