/*
 * fuzz_ir.c — libFuzzer target for the StableHLO text reader
 * (st_ir_analyze, src/ir/: functions, ops, regions, calls, while loops).
 *
 * Properties: an error leaves empty stats and names the program; a read
 * program has finite, non-negative counts and its tables within bounds.
 * The dataflow graph of @main (st_ir_main_graph, strata analyze --dot):
 * an error leaves it empty; edges join existing nodes, earlier to later.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strata/ir.h"

static void st__finite(double v) {
  if (!isfinite(v) || v < 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  /* The same bytes as an optimized HloModuleProto, bare and wrapped (hlo_proto.c). */
  static const char* const kFormats[2] = {"hlo", "hlo_with_config"};
  for (int f = 0; f < 2; ++f) {
    st_ir_hlo_summary h;
    st_status hs = st_ir_hlo_summarize(data, size, kFormats[f], "fuzz.hlo", &h);
    if (hs) {
      if (h.fusions || h.n_top || st_status_code(hs) != ST_CODE_RUNTIME) abort();
      st_status_free(hs);
    } else if (h.fusions < 0 || h.n_top < 0 || h.n_top > ST_IR_HLO_TOP || h.n_top > h.fusions ||
               h.entry_instructions > h.instructions) {
      abort();
    }
  }
  st_ir_stats s;
  st_status st = st_ir_analyze((const char*)data, size, "fuzz.mlir", &s);
  if (st) {
    if (s.collectives || s.custom_calls || s.n_collectives || s.n_custom_calls || s.flops != 0) abort();
    if (st_status_code(st) != ST_CODE_RUNTIME || !strstr(st_status_message(st), "fuzz.mlir")) abort();
    st_status_free(st);
    return 0;
  }
  const double v[] = {s.flops, s.dot_flops, s.conv_flops, s.elementwise_flops, s.reduce_flops, s.transcendentals,
                      s.elementwise_elements, s.reduce_elements, s.bytes_accessed, s.arg_bytes, s.result_bytes,
                      s.max_trip};
  for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); ++i) st__finite(v[i]);
  if (s.n_args < 0 || s.n_results < 0 || s.ops.total < 0 || s.funcs < 1 || s.funcs > ST_IR_MAX_FUNCS) abort();
  if (s.n_collectives < 0 || s.n_collectives > ST_IR_MAX_DISTINCT || (s.n_collectives && !s.collectives)) abort();
  if (s.n_custom_calls < 0 || s.n_custom_calls > ST_IR_MAX_DISTINCT || (s.n_custom_calls && !s.custom_calls)) abort();
  for (int i = 0; i < s.n_collectives; ++i) {
    if (!memchr(s.collectives[i].kind, 0, sizeof(s.collectives[i].kind))) abort();
    if (!memchr(s.collectives[i].groups, 0, sizeof(s.collectives[i].groups))) abort();
    st__finite(s.collectives[i].count);
    st__finite(s.collectives[i].bytes);
  }
  for (int i = 0; i < s.n_custom_calls; ++i)
    if (!memchr(s.custom_calls[i].target, 0, sizeof(s.custom_calls[i].target))) abort();
  if (s.n_findings < 0 || s.n_findings > ST_IR_MAX_FINDINGS || (s.n_findings && !s.findings)) abort();
  for (int i = 0; i < s.n_findings; ++i)
    if (s.findings[i].line < 1 || !memchr(s.findings[i].op, 0, sizeof(s.findings[i].op))) abort();
  st_ir_stats_free(&s);
  st_ir_graph g;
  st = st_ir_main_graph((const char*)data, size, "fuzz.mlir", &g);
  if (st) {
    if (g.nodes || g.edges || g.n_nodes || g.n_edges) abort();
    st_status_free(st);
    return 0;
  }
  if (g.n_nodes < 0 || g.n_nodes > ST_IR_MAX_GRAPH || g.n_edges < 0 || g.n_edges > ST_IR_MAX_GRAPH) abort();
  for (int i = 0; i < g.n_edges; ++i)
    if (g.edges[i].from < 0 || g.edges[i].from >= g.edges[i].to || g.edges[i].to >= g.n_nodes) abort();
  st_ir_graph_free(&g);
  return 0;
}
