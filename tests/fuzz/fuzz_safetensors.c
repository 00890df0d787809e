/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader
 * (st_safetensors_parse: the whole file as bytes, header and data).
 *
 * Properties besides "no crash, no sanitizer report, no leak":
 *   - a refusal is a checkpoint error with a message, and returns no file;
 *   - an accepted file's entries lie inside the data region, tile it
 *     exactly, each spans st_tensor_type_bytes of its type, and names are
 *     unique (st_safetensors_find finds each entry itself).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  unsigned char* copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);
  st_safetensors* f = NULL;
  st_status s = st_safetensors_parse("fuzz.safetensors", copy, size, &f); /* takes |copy| */
  if (s) {
    if (st_status_code(s) != ST_CODE_CKPT || !st_status_message(s)[0] || f) {
      fprintf(stderr, "bad refusal: %s: %s\n", st_code_name(st_status_code(s)), st_status_message(s));
      abort();
    }
    st_status_free(s);
    return 0;
  }
  size_t covered = 0;
  for (int i = 0; i < f->count; ++i) {
    const st_safetensors_entry* e = &f->entries[i];
    if (e->offset < f->data_start || e->offset > f->size || e->bytes > f->size - e->offset) abort();
    if (e->bytes != st_tensor_type_bytes(&e->type)) abort();
    if (e->type.rank < 0 || e->type.rank > ST_MAX_RANK || !st_safetensors_dtype_name(e->type.dtype)) abort();
    if (st_safetensors_find(f, e->name) != e) abort();
    covered += e->bytes;
  }
  if (covered != f->size - f->data_start) abort();
  st_safetensors_free(f);
  return 0;
}
