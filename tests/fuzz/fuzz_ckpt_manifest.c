/*
 * fuzz_ckpt_manifest.c — libFuzzer target for the checkpoint manifest
 * reader (st_ckpt_parse_manifest, no file read).
 *
 * Input: one mode byte, then manifest text. Mode odd: the text is a body
 * ("{...,\n") that the target signs as strata does (appends the
 * "manifest_xxh64" line of the body's xxh64 and "}"), so the fuzzer gets
 * past the self-checksum to the fields and counts. Mode even: the text as
 * is (the checksum paths).
 *
 * Properties: a refusal is a checkpoint error with a message and no
 * result; an accepted manifest has counts within ST_CKPT_MAX_*, tensors
 * whose bytes match their types, in listed files, with unique names.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const char* body = (const char*)data + 1;
  size_t n = size - 1;
  char* text = malloc(n + 64);
  if (!text) return 0;
  memcpy(text, body, n);
  if (data[0] & 1) n += (size_t)snprintf(text + n, 64, "  \"manifest_xxh64\": \"%016llx\"\n}\n", (unsigned long long)st_hash64(body, n, 0));
  st_ckpt* c = NULL;
  st_status s = st_ckpt_parse_manifest("fuzz", text, n, &c);
  free(text);
  if (s) {
    if (st_status_code(s) != ST_CODE_CKPT || !st_status_message(s)[0] || c) {
      fprintf(stderr, "bad refusal: %s: %s\n", st_code_name(st_status_code(s)), st_status_message(s));
      abort();
    }
    st_status_free(s);
    return 0;
  }
  if (c->file_count > ST_CKPT_MAX_FILES || c->tensor_count > ST_CKPT_MAX_TENSORS || c->loaded) abort();
  for (int i = 0; i < c->tensor_count; ++i) {
    const st_ckpt_tensor_info* t = &c->tensors[i];
    if (st_tensor_type_bytes(&t->type) != t->bytes) abort();
    bool listed = false;
    for (int f = 0; f < c->file_count; ++f) listed |= !strcmp(c->files[f].file, t->file);
    if (!listed) abort();
    /* A name appears once, but for a tensor stored in rows: then once per
     * row range, and the ranges tile its dim 0 (c->wholes). */
    for (int k = 0; k < i; ++k)
      if (!strcmp(c->tensors[k].name, t->name) && (!t->rows || !c->tensors[k].rows || c->tensors[k].row_begin == t->row_begin)) abort();
    if (t->rows && (t->row_begin < 0 || t->row_end <= t->row_begin || t->row_end > t->dim0)) abort();
  }
  for (int w = 0; w < c->whole_count; ++w) {
    int64_t rows = 0;
    for (int i = 0; i < c->tensor_count; ++i)
      if (c->tensors[i].rows && !strcmp(c->tensors[i].name, c->wholes[w].name)) rows += c->tensors[i].row_end - c->tensors[i].row_begin;
    if (rows != c->wholes[w].type.dims[0] || st_tensor_type_bytes(&c->wholes[w].type) != c->wholes[w].bytes) abort();
  }
  st_ckpt_free(c);
  return 0;
}
