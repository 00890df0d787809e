/*
 * fuzz_mlir_sig.c — libFuzzer target for the MLIR signature reader
 * (st__mlir_parse_main: `func.func public @main` of a program's text).
 *
 * Properties: "unknown" (false) leaves an empty signature; a read
 * signature has sane types (known dtype, rank <= ST_MAX_RANK, dims >= 0)
 * and a donation flag per input.
 */
#include <stdint.h>
#include <stdlib.h>

#include "runtime/rt_internal.h"

static void st__check(const st_tensor_type* t) {
  if (t->rank < 0 || t->rank > ST_MAX_RANK || t->dtype == ST_DTYPE_INVALID || !st_dtype_size(t->dtype)) abort();
  for (int d = 0; d < t->rank; ++d)
    if (t->dims[d] < 0) abort();
  (void)st_tensor_type_bytes(t); /* must not overflow (UBSan) */
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  st__signature sig;
  if (!st__mlir_parse_main((const char*)data, size, &sig)) {
    if (sig.inputs || sig.outputs || sig.donated || sig.input_count || sig.output_count) abort();
    return 0;
  }
  if (sig.input_count < 0 || sig.output_count < 0 || (sig.input_count && (!sig.inputs || !sig.donated))) abort();
  for (int i = 0; i < sig.input_count; ++i) st__check(&sig.inputs[i]);
  for (int i = 0; i < sig.output_count; ++i) st__check(&sig.outputs[i]);
  st__signature_free(&sig);
  return 0;
}
