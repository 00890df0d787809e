/* test_ir.c — the StableHLO text reader (src/ir/) on hand-written modules:
 * dot_general FLOPs with batching dims, elementwise and reduce counts,
 * bytes, while trip counts (static and not), nested calls counted per
 * call, dead code, collectives with mesh axes and replica groups, custom
 * calls and host callbacks, hazards, and malformed input as an error
 * (never a crash). The comparison with JAX's own cost analysis on real
 * programs is tests/py/test_analyze.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "strata/base.h"
#include "strata/ir.h"
#include "test_util.h"

static st_ir_stats analyze(const char* text) {
  st_ir_stats s;
  ASSERT_OK(st_ir_analyze(text, strlen(text), "test.mlir", &s));
  return s;
}

static void test_dot_general_batching(void** state) {
  (void)state;
  /* [b=4, h=2] batches, contracting 16: 2 * (4*2*32*32) * 16 FLOPs. */
  const char* text =
      "module @m {\n"
      "  func.func public @main(%arg0: tensor<4x32x2x16xf32>, %arg1: tensor<4x32x2x16xf32>) -> "
      "(tensor<4x2x32x32xf32> {jax.result_info = \"result[0]\"}) {\n"
      "    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0, 2] x [0, 2], contracting_dims = [3] x [3], "
      "precision = [DEFAULT, DEFAULT] : (tensor<4x32x2x16xf32>, tensor<4x32x2x16xf32>) -> tensor<4x2x32x32xf32>\n"
      "    return %0 : tensor<4x2x32x32xf32>\n"
      "  }\n"
      "}\n";
  st_ir_stats s = analyze(text);
  assert_true(s.dot_flops == 2.0 * 4 * 2 * 32 * 32 * 16);
  assert_true(s.flops == s.dot_flops);
  assert_int_equal(s.ops.dot, 1);
  assert_int_equal(s.n_args, 2);
  assert_int_equal(s.n_results, 1);
  assert_true(s.arg_bytes == 2.0 * 4 * 32 * 2 * 16 * 4);
  assert_true(s.result_bytes == 4.0 * 2 * 32 * 32 * 4);
  /* XLA's bytes: both operands and the result of the one op. */
  assert_true(s.bytes_accessed == s.arg_bytes + s.result_bytes);
  st_ir_stats_free(&s);

  /* The generic form's dimension numbers, contracting two dims. */
  const char* generic =
      "module @m {\n"
      "  func.func @main(%a: tensor<8x3x5xf32>, %b: tensor<3x5x7xf32>) -> tensor<8x7xf32> {\n"
      "    %0 = \"stablehlo.dot_general\"(%a, %b) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions "
      "= [1, 2], rhs_contracting_dimensions = [0, 1]>} : (tensor<8x3x5xf32>, tensor<3x5x7xf32>) -> tensor<8x7xf32>\n"
      "    return %0 : tensor<8x7xf32>\n"
      "  }\n"
      "}\n";
  s = analyze(generic);
  assert_true(s.dot_flops == 2.0 * 8 * 7 * 15);
  st_ir_stats_free(&s);
}

static void test_elementwise_and_reduce(void** state) {
  (void)state;
  const char* text =
      "module @m {\n"
      "  func.func public @main(%arg0: tensor<4x8xf32>) -> tensor<4xf32> {\n"
      "    %0 = stablehlo.multiply %arg0, %arg0 : tensor<4x8xf32>\n"
      "    %1 = stablehlo.exponential %0 : tensor<4x8xf32>\n"
      "    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>\n"
      "    %2 = stablehlo.reduce(%1 init: %cst) applies stablehlo.add across dimensions = [1] : "
      "(tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>\n"
      "    %3 = stablehlo.reduce(%2 init: %cst) across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>\n"
      "     reducer(%a: tensor<f32>, %b: tensor<f32>)  {\n"
      "      %m = stablehlo.maximum %a, %b : tensor<f32>\n"
      "      %n = stablehlo.add %m, %b : tensor<f32>\n"
      "      stablehlo.return %n : tensor<f32>\n"
      "    }\n"
      "    %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<f32>) -> tensor<4xf32>\n"
      "    return %4 : tensor<4xf32>\n"
      "  }\n"
      "}\n";
  st_ir_stats s = analyze(text);
  assert_true(s.elementwise_flops == 32);     /* the multiply */
  assert_true(s.transcendentals == 32);       /* exp: apart from flops */
  /* (32 - 4) reduced elements x 1 add, then (4 - 1) x the reducer's 2 ops. */
  assert_true(s.reduce_flops == 28 + 3 * 2);
  assert_true(s.flops == 32 + 28 + 6);
  assert_true(s.reduce_elements == 32 + 4);
  assert_int_equal(s.ops.reduce, 2);
  assert_int_equal(s.ops.elementwise, 2 + 2); /* the reducer's two ops are written ops too */
  st_ir_stats_free(&s);
}

static const char* kLoop =
    "module @m {\n"
    "  func.func public @main(%arg0: tensor<16xf32>) -> tensor<16xf32> {\n"
    "    %c = stablehlo.constant dense<0> : tensor<i32>\n"
    "    %0:2 = stablehlo.while(%iterArg = %c, %iterArg_0 = %arg0) : tensor<i32>, tensor<16xf32>\n"
    "    cond {\n"
    "      %c_1 = stablehlo.constant dense<%LIMIT%> : tensor<i32>\n"
    "      %1 = stablehlo.compare  LT, %iterArg, %c_1,  SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>\n"
    "      stablehlo.return %1 : tensor<i1>\n"
    "    } do {\n"
    "      %c_1 = stablehlo.constant dense<1> : tensor<i32>\n"
    "      %1 = stablehlo.add %iterArg, %c_1 : tensor<i32>\n"
    "      %2 = stablehlo.multiply %iterArg_0, %iterArg_0 : tensor<16xf32>\n"
    "      stablehlo.return %1, %2 : tensor<i32>, tensor<16xf32>\n"
    "    }\n"
    "    return %0#1 : tensor<16xf32>\n"
    "  }\n"
    "}\n";

static char* loop_with(const char* limit) {
  st_strbuf b = {0};
  const char* at = strstr(kLoop, "%LIMIT%");
  st_strbuf_append_n(&b, kLoop, (size_t)(at - kLoop));
  st_strbuf_append(&b, limit);
  st_strbuf_append(&b, at + strlen("%LIMIT%"));
  return st_strbuf_take(&b);
}

static void test_while_trip_count(void** state) {
  (void)state;
  char* text = loop_with("7");
  st_ir_stats s = analyze(text);
  /* Per iteration: the compare (1), the counter add (1), the multiply (16). */
  assert_true(s.flops == 7 * (1 + 1 + 16));
  assert_true(s.max_trip == 7);
  assert_int_equal(s.while_loops, 1);
  assert_int_equal(s.while_unknown_trip, 0);
  st_ir_stats_free(&s);
  free(text);

  /* A bound that is not a constant: the body counts once, and says so. */
  text = loop_with("7> : tensor<i32>\n      %c_2 = stablehlo.add %c_1, %c_1 : tensor<i32>\n      %zz = stablehlo.constant dense<0");
  char* p = strstr(text, "LT, %iterArg, %c_1");
  assert_non_null(p);
  memcpy(p, "LT, %iterArg, %c_2", strlen("LT, %iterArg, %c_2"));
  s = analyze(text);
  assert_int_equal(s.while_unknown_trip, 1);
  assert_true(s.max_trip == 0);
  assert_true(s.elementwise_flops == 1 + 1 + 1 + 16);
  st_ir_stats_free(&s);
  free(text);
}

static void test_nested_calls_count_per_call(void** state) {
  (void)state;
  const char* text =
      "module @m {\n"
      "  func.func public @main(%arg0: tensor<8xf32>) -> tensor<8xf32> {\n"
      "    %0 = call @twice(%arg0) : (tensor<8xf32>) -> tensor<8xf32>\n"
      "    %1 = func.call @twice(%0) : (tensor<8xf32>) -> tensor<8xf32>\n"
      "    %2 = call @unused(%1) : (tensor<8xf32>) -> tensor<8xf32>\n"
      "    return %1 : tensor<8xf32>\n"
      "  }\n"
      "  func.func private @twice(%arg0: tensor<8xf32>) -> tensor<8xf32> {\n"
      "    %0 = call @leaf(%arg0) : (tensor<8xf32>) -> tensor<8xf32>\n"
      "    %1 = call @leaf(%0) : (tensor<8xf32>) -> tensor<8xf32>\n"
      "    return %1 : tensor<8xf32>\n"
      "  }\n"
      "  func.func private @leaf(%arg0: tensor<8xf32>) -> tensor<8xf32> {\n"
      "    %0 = stablehlo.add %arg0, %arg0 : tensor<8xf32>\n"
      "    %1 = stablehlo.multiply %arg0, %arg0 : tensor<8xf32>\n"
      "    return %0 : tensor<8xf32>\n"
      "  }\n"
      "  func.func private @unused(%arg0: tensor<8xf32>) -> tensor<8xf32> {\n"
      "    %0 = stablehlo.add %arg0, %arg0 : tensor<8xf32>\n"
      "    return %0 : tensor<8xf32>\n"
      "  }\n"
      "}\n";
  st_ir_stats s = analyze(text);
  /* 2 calls x 2 leaves x the live add (8); the dead multiply and the dead
   * call to @unused count nothing, as XLA drops them. */
  assert_true(s.flops == 2 * 2 * 8);
  assert_int_equal(s.funcs, 4);
  assert_int_equal(s.ops.call, 5);
  st_ir_stats_free(&s);

  /* Recursion is refused at the depth bound, not followed forever. */
  const char* rec =
      "module @m {\n"
      "  func.func public @main(%arg0: tensor<8xf32>) -> tensor<8xf32> {\n"
      "    %0 = call @main(%arg0) : (tensor<8xf32>) -> tensor<8xf32>\n"
      "    return %0 : tensor<8xf32>\n"
      "  }\n"
      "}\n";
  ASSERT_ERROR(st_ir_analyze(rec, strlen(rec), "rec.mlir", &s), ST_CODE_RUNTIME, "rec.mlir", "deeper than 32");
}

static void test_collectives_and_custom_calls(void** state) {
  (void)state;
  const char* text =
      "module @m attributes {mhlo.num_partitions = 2 : i32} {\n"
      "  sdy.mesh @mesh_0 = <[\"data\"=2, \"fsdp\"=2]>\n"
      "  func.func public @main(%arg0: tensor<8x4xf32>, %arg1: tensor<8xf64>) -> (tensor<8x4xf32>, tensor<16x4xf32>, "
      "tensor<?xf32>) {\n"
      "    %0 = \"stablehlo.all_reduce\"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, "
      "replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "
      "\"data\">, #stablehlo.axis_ref<name = \"fsdp\">]>, use_global_device_ids}> ({\n"
      "    ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n"
      "      %s = stablehlo.add %a, %b : tensor<f32>\n"
      "      stablehlo.return %s : tensor<f32>\n"
      "    }) : (tensor<8x4xf32>) -> tensor<8x4xf32>\n"
      "    %1 = \"stablehlo.all_gather\"(%0) <{all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1], [2, 3]]> : "
      "tensor<2x2xi64>}> : (tensor<8x4xf32>) -> tensor<16x4xf32>\n"
      "    %2 = stablehlo.custom_call @xla_ffi_python_cpu_callback(%arg0) {has_side_effect = true} : "
      "(tensor<8x4xf32>) -> tensor<?xf32>\n"
      "    %3 = stablehlo.custom_call @my_kernel(%arg0) : (tensor<8x4xf32>) -> tensor<8x4xf32>\n"
      "    return %0, %1, %2 : tensor<8x4xf32>, tensor<16x4xf32>, tensor<?xf32>\n"
      "  }\n"
      "}\n";
  st_ir_stats s = analyze(text);
  assert_int_equal(s.n_collectives, 2);
  assert_string_equal(s.collectives[0].kind, "all_reduce");
  assert_string_equal(s.collectives[0].groups, "axes=data,fsdp");
  assert_true(s.collectives[0].bytes == 8 * 4 * 4);
  assert_true(s.collectives[0].count == 1);
  assert_string_equal(s.collectives[1].kind, "all_gather");
  assert_string_equal(s.collectives[1].groups, "groups=[[0, 1], [2, 3]]");
  assert_true(s.reduce_flops == 32); /* the all-reduce's region per element */
  assert_int_equal(s.n_custom_calls, 2);
  assert_string_equal(s.custom_calls[0].target, "xla_ffi_python_cpu_callback");
  assert_string_equal(s.custom_calls[1].target, "my_kernel"); /* dead, but a custom call may have effects */
  assert_int_equal(s.host_callbacks, 1);
  assert_true(s.dynamic_shapes);
  assert_true(s.uses_f64);
  assert_int_equal(s.ops.collective, 2);
  assert_int_equal(s.ops.custom_call, 2);
  st_ir_stats_free(&s);
}

static void test_malformed_input_is_an_error(void** state) {
  (void)state;
  st_ir_stats s;
  const char* cases[][2] = {
      {"", "empty"},
      {"module @m {\n}\n", "no func.func @main"},
      {"module @m {\n  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n", "without its closing"},
      {"module @m {\n  func.func public @main(%a: tensor<4xf32> -> tensor<4xf32> {\n  }\n}\n", "does not close"},
      {"module @m {\n  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n    %0 stablehlo.add\n  }\n}\n",
       "not followed by '='"},
      {"module @m {\n  func.func public @main() {\n    %0 = call @nowhere() : () -> ()\n    return\n  }\n}\n",
       "does not define"},
      {"module @m {\n  func.func public @main() {\n    return\n  }\n  func.func @main() {\n    return\n  }\n}\n",
       "defined twice"},
      {"ML\xEFR\x01\x02", "bytecode"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
    st_status st = st_ir_analyze(cases[i][0], strlen(cases[i][0]), "bad.mlir", &s);
    if (!st) fail_msg("case %zu: expected an error", i);
    ASSERT_ERROR(st, ST_CODE_RUNTIME, "bad.mlir", cases[i][1]);
    assert_null(s.collectives);
  }
  /* Region nesting beyond the bound. */
  st_strbuf b = {0};
  st_strbuf_append(&b, "module @m {\n  func.func public @main(%a: tensor<f32>) -> tensor<f32> {\n");
  for (int i = 0; i < 40; ++i) st_strbuf_append(&b, "    %0 = \"stablehlo.case\"(%a) ({\n");
  for (int i = 0; i < 40; ++i) st_strbuf_append(&b, "    }) : (tensor<f32>) -> tensor<f32>\n");
  st_strbuf_append(&b, "    return %0 : tensor<f32>\n  }\n}\n");
  ASSERT_ERROR(st_ir_analyze(st_strbuf_cstr(&b), strlen(st_strbuf_cstr(&b)), "deep.mlir", &s), ST_CODE_RUNTIME,
               "deeper than 32");
  st_strbuf_free(&b);
}

static void test_scan_helpers_shared_with_the_runtime(void** state) {
  (void)state;
  st_ir_type t;
  const char* end;
  const char* ty = "tensor<2x?x8xbf16>";
  assert_true(st_ir_parse_type(ty, ty + strlen(ty), &t, &end));
  assert_int_equal(t.rank, 3);
  assert_true(t.dynamic);
  assert_int_equal(t.dims[1], -1);
  assert_int_equal(t.dtype, ST_DTYPE_BF16);
  assert_true(end == ty + strlen(ty));
  const char* big = "tensor<281474976710657xf32>"; /* 2^48 + 1 */
  assert_false(st_ir_parse_type(big, big + strlen(big), &t, &end));
  const char* s = "a(b, c), d";
  assert_true(st_ir_scan_to(s, s + strlen(s), ',') == s + 7);
  const char* arrow = "(x) -> y, z";
  assert_true(st_ir_scan_to(arrow, arrow + strlen(arrow), ',') == arrow + 8);
}

/* Protobuf wire bytes, built by hand: tag, then a varint or a payload. */
typedef struct pb {
  uint8_t b[512];
  size_t n;
} pb;

static void pb_varint(pb* o, uint64_t v) {
  do {
    uint8_t c = v & 0x7f;
    v >>= 7;
    o->b[o->n++] = (uint8_t)(c | (v ? 0x80 : 0));
  } while (v);
}
static void pb_bytes(pb* o, uint32_t field, const void* data, size_t n) {
  pb_varint(o, (uint64_t)field << 3 | 2);
  pb_varint(o, n);
  memcpy(o->b + o->n, data, n);
  o->n += n;
}
static void pb_str(pb* o, uint32_t field, const char* s) { pb_bytes(o, field, s, strlen(s)); }
static void pb_int(pb* o, uint32_t field, uint64_t v) {
  pb_varint(o, (uint64_t)field << 3);
  pb_varint(o, v);
}
static void pb_inst(pb* comp, const char* name, const char* opcode, const char* kind, int64_t called) {
  pb i = {0};
  pb_str(&i, 1, name);
  pb_str(&i, 2, opcode);
  if (kind) pb_str(&i, 11, kind);
  if (called >= 0) {
    pb ids = {0};
    pb_varint(&ids, (uint64_t)called);
    pb_bytes(&i, 38, ids.b, ids.n); /* packed, as XLA writes it */
  }
  pb_bytes(comp, 2, i.b, i.n);
}

/* XLA's optimized program (runtime.keep_optimized_hlo): two fusions, one
 * of 3 ops and one of 1, called from the entry; in the CPU plugin's
 * wrapper (hlo_with_config) and bare (hlo). */
static void test_hlo_fusions(void** state) {
  (void)state;
  pb big = {0}, small = {0}, entry = {0}, module = {0}, wrapped = {0};
  pb_str(&big, 1, "fused_computation");
  pb_inst(&big, "p0", "parameter", NULL, -1);
  pb_inst(&big, "a", "add", NULL, -1);
  pb_inst(&big, "m", "multiply", NULL, -1);
  pb_int(&big, 5, 7);
  pb_str(&small, 1, "fused_computation.1");
  pb_int(&small, 5, 9);
  pb_inst(&small, "c", "copy", NULL, -1);
  pb_str(&entry, 1, "main.3");
  pb_int(&entry, 5, 8);
  pb_inst(&entry, "Arg_0", "parameter", NULL, -1);
  pb_inst(&entry, "copy_fusion", "fusion", "kLoop", 9);
  pb_inst(&entry, "add_multiply_fusion", "fusion", "kInput", 7);
  pb_str(&module, 1, "jit_f");
  pb_str(&module, 2, "main.3");
  pb_bytes(&module, 3, big.b, big.n);
  pb_bytes(&module, 3, small.b, small.n);
  pb_bytes(&module, 3, entry.b, entry.n);
  pb_bytes(&wrapped, 1, module.b, module.n);
  pb_str(&wrapped, 2, "config bytes ignored");
  for (int k = 0; k < 2; ++k) {
    st_ir_hlo_summary s;
    if (k == 0) ASSERT_OK(st_ir_hlo_summarize(wrapped.b, wrapped.n, "hlo_with_config", "t.hlo", &s));
    else ASSERT_OK(st_ir_hlo_summarize(module.b, module.n, "hlo", "t.hlo", &s));
    assert_int_equal(s.computations, 3);
    assert_int_equal(s.instructions, 7);
    assert_int_equal(s.entry_instructions, 3);
    assert_int_equal(s.fusions, 2);
    assert_int_equal(s.n_top, 2);
    assert_string_equal(s.top[0].name, "add_multiply_fusion");
    assert_string_equal(s.top[0].kind, "kInput");
    assert_int_equal(s.top[0].ops, 3);
    assert_string_equal(s.top[1].name, "copy_fusion");
    assert_int_equal(s.top[1].ops, 1);
  }
  /* Cut anywhere inside, or in another format: an error naming the file. */
  st_ir_hlo_summary s;
  for (size_t cut = 1; cut < wrapped.n; cut += 7) {
    st_status st = st_ir_hlo_summarize(wrapped.b, cut, "hlo_with_config", "t.hlo", &s);
    if (st) {
      assert_non_null(strstr(st_status_message(st), "t.hlo"));
      assert_int_equal(s.fusions, 0);
      st_status_free(st);
    }
  }
  st_status st = st_ir_hlo_summarize(module.b, module.n, "mlir", "t.hlo", &s);
  assert_non_null(st);
  assert_non_null(strstr(st_status_message(st), "format 'mlir'"));
  st_status_free(st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dot_general_batching),
      cmocka_unit_test(test_elementwise_and_reduce),
      cmocka_unit_test(test_while_trip_count),
      cmocka_unit_test(test_nested_calls_count_per_call),
      cmocka_unit_test(test_collectives_and_custom_calls),
      cmocka_unit_test(test_malformed_input_is_an_error),
      cmocka_unit_test(test_scan_helpers_shared_with_the_runtime),
      cmocka_unit_test(test_hlo_fusions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
