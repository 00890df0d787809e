/*
 * fuzz_bundle.c — libFuzzer target for the bundle manifest reader
 * (st_bundle_parse: the manifest text, no program file opened).
 *
 * Properties: a refusal is a bundle error (ST_CODE_RUNTIME) with a message
 * and no bundle; an accepted bundle respects every ST_BUNDLE_MAX_* bound
 * (what the plan builder's arrays rely on) and its tensor types are sane.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "strata/bundle.h"

static void st__check_type(const st_tensor_type* t) {
  if (t->rank < 0 || t->rank > ST_MAX_RANK || st_tensor_type_elements(t) < 0) abort();
  for (int d = 0; d < t->rank; ++d)
    if (t->dims[d] < 0 || t->dims[d] > ST_BUNDLE_MAX_DIM) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  st_bundle* b = NULL;
  st_status s = st_bundle_parse("/fuzz/bundle", (const char*)data, size, &b);
  if (s) {
    if (st_status_code(s) != ST_CODE_RUNTIME || !st_status_message(s)[0] || b) {
      fprintf(stderr, "bad refusal: %s: %s\n", st_code_name(st_status_code(s)), st_status_message(s));
      abort();
    }
    st_status_free(s);
    return 0;
  }
  if (b->program_count > ST_BUNDLE_MAX_PROGRAMS || b->group_count > ST_BUNDLE_MAX_GROUPS || b->param_count > ST_BUNDLE_MAX_PARAMS ||
      b->model.n_layers < 1 || b->model.n_layers > ST_BUNDLE_MAX_LAYERS)
    abort();
  for (int i = 0; i < b->program_count; ++i) {
    const st_bundle_program* p = &b->programs[i];
    if (p->input_count > ST_BUNDLE_MAX_PROGRAM_TENSORS || p->output_count > ST_BUNDLE_MAX_PROGRAM_TENSORS) abort();
    for (int k = 0; k < p->input_count; ++k) st__check_type(&p->inputs[k].type);
    for (int k = 0; k < p->output_count; ++k) st__check_type(&p->outputs[k].type);
  }
  for (int i = 0; i < b->group_count; ++i)
    if (b->groups[i].param_count > ST_BUNDLE_MAX_GROUP_PARAMS) abort();
  for (int i = 0; i < b->param_count; ++i) {
    if (b->params[i].layer < -1 || b->params[i].layer >= ST_BUNDLE_MAX_LAYERS) abort();
    st__check_type(&b->params[i].type);
  }
  st_bundle_destroy(b);
  return 0;
}
