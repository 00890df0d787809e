/* test_runtime.c — the PJRT runtime against the XLA CPU plugin: programs
 * exported by JAX run through strata and match JAX's own outputs; devices,
 * transfers and events; donation; input checking; bad programs and
 * options; plugin discovery. (Cache and determinism: test_runtime_cache.c.) */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "strata/runtime.h"
#include "test_util.h"

static tu_testprogs g_tp;
static st_runtime* g_rt; /* 2 CPU devices, shared by most tests */

static const tu_prog* prog(const char* name) {
  const tu_prog* p = tu_testprogs_get(&g_tp, name);
  if (!p) fail_msg("test program %s missing from the index", name);
  return p;
}

static st_program* compile(st_runtime* rt, const tu_prog* p) {
  st_program* out = NULL;
  ASSERT_OK(st_program_compile_file(rt, p->file, NULL, &out));
  return out;
}

static st_buffer* upload(st_runtime* rt, int device, const tu_tensor* t) {
  size_t n = 0;
  void* data = tu_read_file(t->file, &n);
  assert_non_null(data);
  assert_int_equal(n, st_tensor_type_bytes(&t->type));
  st_buffer* b = NULL;
  ASSERT_OK(st_buffer_from_host(rt, device, &t->type, data, &b));
  free(data); /* the runtime copied it during the call */
  return b;
}

/* Compares |b| with the JAX output |want|. */
static void expect_output(st_buffer* b, const tu_tensor* want, const char* what) {
  char tb[128], wb[128];
  st_tensor_type_format(st_buffer_type(b), tb, sizeof(tb));
  st_tensor_type_format(&want->type, wb, sizeof(wb));
  if (strcmp(tb, wb)) fail_msg("%s: output type %s, JAX says %s", what, tb, wb);
  size_t n = st_buffer_bytes(b);
  void* got = malloc(n ? n : 1);
  ASSERT_OK(st_buffer_to_host(b, got, n));
  size_t wn = 0;
  void* ref = tu_read_file(want->file, &wn);
  assert_non_null(ref);
  assert_int_equal(wn, n);
  char why[256];
  double rtol = want->type.dtype == ST_DTYPE_BF16 ? 1e-2 : 2e-6;
  double atol = want->type.dtype == ST_DTYPE_BF16 ? 1e-2 : 1e-6;
  if (!tu_close(&want->type, got, ref, rtol, atol, why, sizeof(why))) fail_msg("%s: %s", what, why);
  free(got);
  free(ref);
}

/* Runs |p| on |device| with its JAX inputs and checks every output. */
static void run_and_check(st_runtime* rt, const tu_prog* p, int device) {
  st_program* prg = compile(rt, p);
  assert_int_equal(st_program_output_count(prg), p->n_out);
  if (!p->bytecode) assert_int_equal(st_program_input_count(prg), p->n_in);
  st_buffer* in[TU_MAX_TENSORS] = {0};
  st_buffer* out[TU_MAX_TENSORS] = {0};
  for (int i = 0; i < p->n_in; ++i) in[i] = upload(rt, device, &p->in[i]);
  ASSERT_OK(st_program_execute(prg, device, in, p->n_in, out, p->n_out, NULL));
  for (int i = 0; i < p->n_out; ++i) {
    char what[128];
    snprintf(what, sizeof(what), "%s output %d on device %d", p->name, i, device);
    assert_int_equal(st_buffer_device(out[i]), device);
    expect_output(out[i], &p->out[i], what);
    st_buffer_destroy(out[i]);
  }
  for (int i = 0; i < p->n_in; ++i) st_buffer_destroy(in[i]);
  st_program_destroy(prg);
}

/*===-------------------------------------------------------------------===*/

static void test_dtypes(void** state) {
  (void)state;
  assert_int_equal(st_dtype_size(ST_DTYPE_BF16), 2);
  assert_int_equal(st_dtype_size(ST_DTYPE_PRED), 1);
  assert_int_equal(st_dtype_size(ST_DTYPE_F64), 8);
  assert_int_equal(st_dtype_size(ST_DTYPE_INVALID), 0);
  assert_string_equal(st_dtype_name(ST_DTYPE_S32), "s32");
  assert_int_equal(st_dtype_parse("float32"), ST_DTYPE_F32);
  assert_int_equal(st_dtype_parse("bfloat16"), ST_DTYPE_BF16);
  assert_int_equal(st_dtype_parse("bool"), ST_DTYPE_PRED);
  assert_int_equal(st_dtype_parse("uint32"), ST_DTYPE_U32);
  assert_int_equal(st_dtype_parse("u32"), ST_DTYPE_U32);
  assert_int_equal(st_dtype_parse("nope"), ST_DTYPE_INVALID);
  st_tensor_type t = {.dtype = ST_DTYPE_F32, .rank = 2, .dims = {4, 8}};
  char buf[64];
  assert_string_equal(st_tensor_type_format(&t, buf, sizeof(buf)), "f32[4,8]");
  assert_int_equal(st_tensor_type_elements(&t), 32);
  assert_int_equal(st_tensor_type_bytes(&t), 128);
  st_tensor_type s = {.dtype = ST_DTYPE_BF16, .rank = 0};
  assert_string_equal(st_tensor_type_format(&s, buf, sizeof(buf)), "bf16[]");
  assert_int_equal(st_tensor_type_bytes(&s), 2);
}

static void test_info_and_devices(void** state) {
  (void)state;
  st_runtime_info info;
  st_runtime_get_info(g_rt, &info);
  assert_non_null(strstr(info.plugin_path, "pjrt"));
  assert_string_equal(info.platform_name, "cpu");
  assert_non_null(info.platform_version);
  assert_non_null(info.xla_version);
  assert_int_equal(info.api_major, 0);
  assert_true(info.api_minor >= 114);
  assert_int_equal(info.device_count, 2);
  for (int d = 0; d < 2; ++d) {
    st_device_info di;
    ASSERT_OK(st_runtime_device_info(g_rt, d, &di));
    assert_int_equal(di.id, d);
    assert_string_equal(di.kind, "cpu");
    assert_true(di.memory_count >= 1);
    assert_string_equal(di.memory_kinds[di.default_memory], "device");
  }
  st_device_info di;
  ASSERT_ERROR(st_runtime_device_info(g_rt, 2, &di), ST_CODE_RUNTIME, "device 2");
}

static void test_programs_match_jax(void** state) {
  (void)state;
  const char* names[] = {"elementwise", "matmul", "reduction", "multi_out", "donate",
                         "while_loop", "bf16", "ints", "elementwise_bc"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i) run_and_check(g_rt, prog(names[i]), 0);
}

static void test_signature_parsed(void** state) {
  (void)state;
  st_program* p = compile(g_rt, prog("ints"));
  char buf[64];
  assert_int_equal(st_program_input_count(p), 3);
  assert_string_equal(st_tensor_type_format(st_program_input_type(p, 0), buf, sizeof(buf)), "s32[16]");
  assert_string_equal(st_tensor_type_format(st_program_input_type(p, 2), buf, sizeof(buf)), "u32[]");
  assert_int_equal(st_program_output_count(p), 3);
  assert_string_equal(st_tensor_type_format(st_program_output_type(p, 1), buf, sizeof(buf)), "pred[16]");
  assert_false(st_program_input_donated(p, 0));
  assert_null(st_program_input_type(p, 3));
  st_program_destroy(p);

  p = compile(g_rt, prog("donate"));
  assert_true(st_program_input_donated(p, 0));
  assert_false(st_program_input_donated(p, 1));
  st_program_destroy(p);

  /* Attributes with strings, braces and commas; jax.buffer_donor; a single
   * unparenthesized result; ui8. */
  static const char tricky[] =
      "module @sig_test attributes {mhlo.num_partitions = 1 : i32} {\n"
      "  func.func public @main(%arg0: tensor<2x3xf32> {mhlo.sharding = \"{replicated}\", mhlo.layout_mode = "
      "\"default\"}, %arg1: tensor<i1> {jax.buffer_donor = true}, %arg2: tensor<4xui8>) -> tensor<2x3xf32> {\n"
      "    return %arg0 : tensor<2x3xf32>\n"
      "  }\n"
      "}\n";
  ASSERT_OK(st_program_compile(g_rt, "sig_test", tricky, sizeof(tricky) - 1, NULL, &p));
  assert_int_equal(st_program_input_count(p), 3);
  assert_string_equal(st_tensor_type_format(st_program_input_type(p, 0), buf, sizeof(buf)), "f32[2,3]");
  assert_string_equal(st_tensor_type_format(st_program_input_type(p, 1), buf, sizeof(buf)), "pred[]");
  assert_string_equal(st_tensor_type_format(st_program_input_type(p, 2), buf, sizeof(buf)), "u8[4]");
  assert_false(st_program_input_donated(p, 0));
  assert_true(st_program_input_donated(p, 1));
  assert_int_equal(st_program_output_count(p), 1);
  assert_string_equal(st_tensor_type_format(st_program_output_type(p, 0), buf, sizeof(buf)), "f32[2,3]");
  st_program_destroy(p);

  /* Bytecode: no signature, outputs counted by the plugin. */
  p = compile(g_rt, prog("elementwise_bc"));
  assert_int_equal(st_program_input_count(p), -1);
  assert_int_equal(st_program_output_count(p), 1);
  assert_null(st_program_input_type(p, 0));
  st_program_destroy(p);

  /* A caller-given signature for bytecode enables input checks. */
  const tu_prog* bc = prog("elementwise_bc");
  st_tensor_type ins[2] = {bc->in[0].type, bc->in[1].type};
  st_program_signature sig = {.input_count = 2, .inputs = ins, .output_count = 1, .outputs = &bc->out[0].type};
  ASSERT_OK(st_program_compile_file(g_rt, bc->file, &sig, &p));
  assert_int_equal(st_program_input_count(p), 2);
  st_buffer* in[2] = {upload(g_rt, 0, &bc->in[1]), upload(g_rt, 0, &bc->in[0])}; /* swapped */
  st_buffer* out[1];
  ASSERT_ERROR(st_program_execute(p, 0, in, 2, out, 1, NULL), ST_CODE_RUNTIME, "input 0: expected f32[4,8], given f32[8]");
  st_buffer_destroy(in[0]);
  st_buffer_destroy(in[1]);
  st_program_destroy(p);
}

static void test_multi_device(void** state) {
  (void)state;
  run_and_check(g_rt, prog("matmul"), 1);
  run_and_check(g_rt, prog("multi_out"), 1);
  /* One compiled (portable) program on both devices. */
  const tu_prog* mp = prog("matmul");
  st_program* p = compile(g_rt, mp);
  for (int d = 0; d < 2; ++d) {
    st_buffer* in[2] = {upload(g_rt, d, &mp->in[0]), upload(g_rt, d, &mp->in[1])};
    st_buffer* out[1];
    ASSERT_OK(st_program_execute(p, d, in, 2, out, 1, NULL));
    assert_int_equal(st_buffer_device(out[0]), d);
    expect_output(out[0], &mp->out[0], "matmul (shared program)");
    st_buffer_destroy(out[0]);
    st_buffer_destroy(in[0]);
    st_buffer_destroy(in[1]);
  }
  /* Inputs on the wrong device are refused, naming both devices. */
  st_buffer* in[2] = {upload(g_rt, 0, &mp->in[0]), upload(g_rt, 1, &mp->in[1])};
  st_buffer* out[1];
  ASSERT_ERROR(st_program_execute(p, 1, in, 2, out, 1, NULL), ST_CODE_RUNTIME, "program '", "input 0",
               "on device 0", "runs on device 1");
  ASSERT_ERROR(st_program_execute(p, 7, in, 2, out, 1, NULL), ST_CODE_RUNTIME, "device 7");
  st_buffer_destroy(in[0]);
  st_buffer_destroy(in[1]);
  st_program_destroy(p);
}

typedef struct {
  atomic_int calls;
  atomic_int failures;
} cb_state;

static void on_ready_cb(st_status s, void* user) {
  cb_state* c = user;
  if (s) atomic_fetch_add(&c->failures, 1);
  st_status_free(s); /* the callback owns it */
  atomic_fetch_add(&c->calls, 1);
}

static void wait_calls(cb_state* c, int n) {
  for (int i = 0; i < 5000 && atomic_load(&c->calls) < n; ++i) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

static void test_async_and_events(void** state) {
  (void)state;
  const tu_prog* mp = prog("multi_out");
  st_program* p = compile(g_rt, mp);
  st_buffer* in[2] = {upload(g_rt, 1, &mp->in[0]), upload(g_rt, 1, &mp->in[1])};
  st_buffer* out[3];
  st_event* done = NULL;
  ASSERT_OK(st_program_execute(p, 1, in, 2, out, 3, &done));
  assert_non_null(done);
  cb_state cb = {0};
  ASSERT_OK(st_event_on_ready(done, on_ready_cb, &cb));
  ASSERT_OK(st_event_await(done));
  ASSERT_OK(st_event_await(done)); /* awaiting twice is fine */
  assert_true(st_event_is_ready(done));
  wait_calls(&cb, 1);
  assert_int_equal(atomic_load(&cb.calls), 1);
  assert_int_equal(atomic_load(&cb.failures), 0);
  st_event_destroy(done);

  /* Start all three copies, then wait: the copies overlap. */
  void* host[3];
  st_event* ev[3];
  for (int i = 0; i < 3; ++i) {
    st_event* ready = NULL;
    ASSERT_OK(st_buffer_ready_event(out[i], &ready));
    ASSERT_OK(st_event_await(ready));
    st_event_destroy(ready);
    host[i] = malloc(st_buffer_bytes(out[i]));
    ASSERT_OK(st_buffer_to_host_async(out[i], host[i], st_buffer_bytes(out[i]), &ev[i]));
    ASSERT_OK(st_event_on_ready(ev[i], on_ready_cb, &cb));
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(st_event_await(ev[i]));
    st_event_destroy(ev[i]);
    size_t n = 0;
    void* ref = tu_read_file(mp->out[i].file, &n);
    char why[256];
    if (!tu_close(&mp->out[i].type, host[i], ref, 2e-6, 1e-6, why, sizeof(why))) fail_msg("async output %d: %s", i, why);
    free(ref);
    free(host[i]);
  }
  wait_calls(&cb, 4);
  assert_int_equal(atomic_load(&cb.calls), 4);
  assert_int_equal(atomic_load(&cb.failures), 0);

  /* A wrong destination size is refused before anything starts. */
  char small[4];
  st_event* bad = NULL;
  ASSERT_ERROR(st_buffer_to_host_async(out[0], small, sizeof(small), &bad), ST_CODE_RUNTIME, "f32[3,5]", "4 bytes");
  assert_null(bad);
  for (int i = 0; i < 3; ++i) st_buffer_destroy(out[i]);
  st_buffer_destroy(in[0]);
  st_buffer_destroy(in[1]);
  st_program_destroy(p);
}

static void test_donation(void** state) {
  (void)state;
  const tu_prog* dp = prog("donate");
  st_program* p = compile(g_rt, dp);
  st_buffer* in[2] = {upload(g_rt, 0, &dp->in[0]), upload(g_rt, 0, &dp->in[1])};
  st_buffer* out[1];
  ASSERT_OK(st_program_execute(p, 0, in, 2, out, 1, NULL));
  assert_true(st_buffer_is_consumed(in[0]));
  assert_false(st_buffer_is_consumed(in[1]));
  expect_output(out[0], &dp->out[0], "donate");
  /* Any later use of the consumed buffer names it and its consumer. */
  float host[32];
  ASSERT_ERROR(st_buffer_to_host(in[0], host, sizeof(host)), ST_CODE_RUNTIME, "f32[4,8]", "consumed", "donate.mlir");
  st_event* ev = NULL;
  ASSERT_ERROR(st_buffer_ready_event(in[0], &ev), ST_CODE_RUNTIME, "consumed");
  st_buffer* out2[1];
  ASSERT_ERROR(st_program_execute(p, 0, in, 2, out2, 1, NULL), ST_CODE_RUNTIME, "program '", "input 0", "consumed",
               "donated to program");
  /* The output can be fed back (the usual training-state loop). */
  st_buffer* again[2] = {out[0], in[1]};
  ASSERT_OK(st_program_execute(p, 0, again, 2, out2, 1, NULL));
  assert_true(st_buffer_is_consumed(out[0]));
  st_buffer_destroy(out2[0]);
  st_buffer_destroy(out[0]);
  st_buffer_destroy(in[0]);
  st_buffer_destroy(in[1]);
  st_program_destroy(p);
}

/* Device to device (pipeline stages' SEND): the copy is on the other
 * device with the same values, and the source may be destroyed before the
 * copy is done (PJRT keeps what it reads alive). */
static void test_copy_to_device(void** state) {
  (void)state;
  const tu_prog* mp = prog("matmul");
  st_buffer* a = upload(g_rt, 0, &mp->in[0]);
  st_buffer* c = NULL;
  ASSERT_OK(st_buffer_copy_to_device(a, 1, &c));
  assert_int_equal(st_buffer_device(c), 1);
  assert_int_equal(st_buffer_device(a), 0); /* the source stays as it was */
  expect_output(c, &mp->in[0], "copy of matmul's input 0 to device 1");
  expect_output(a, &mp->in[0], "matmul's input 0 after its copy");
  st_buffer_destroy(c);

  /* A program's output, copied while it may still be computed and freed at once. */
  st_program* p = compile(g_rt, mp);
  st_buffer* b = upload(g_rt, 0, &mp->in[1]);
  for (int k = 0; k < 8; ++k) {
    st_buffer* in[2] = {a, b};
    st_buffer* out[1];
    ASSERT_OK(st_program_execute(p, 0, in, 2, out, 1, NULL));
    st_buffer* moved = NULL;
    ASSERT_OK(st_buffer_copy_to_device(out[0], 1, &moved));
    st_buffer_destroy(out[0]);
    assert_int_equal(st_buffer_device(moved), 1);
    expect_output(moved, &mp->out[0], "matmul's output copied to device 1");
    /* ... and back again, to the other device */
    st_buffer* back = NULL;
    ASSERT_OK(st_buffer_copy_to_device(moved, 0, &back));
    st_buffer_destroy(moved);
    assert_int_equal(st_buffer_device(back), 0);
    expect_output(back, &mp->out[0], "matmul's output copied back to device 0");
    st_buffer_destroy(back);
  }

  /* Errors name the devices and the buffer. */
  st_buffer* x = NULL;
  ASSERT_ERROR(st_buffer_copy_to_device(a, 0, &x), ST_CODE_RUNTIME, "f32[4,8]", "already on device 0");
  ASSERT_ERROR(st_buffer_copy_to_device(a, 7, &x), ST_CODE_RUNTIME, "device 7 does not exist", "2 devices");
  ASSERT_ERROR(st_buffer_copy_to_device(a, -1, &x), ST_CODE_RUNTIME, "device -1 does not exist");
  assert_null(x);
  const tu_prog* dp = prog("donate");
  st_program* dprog = compile(g_rt, dp);
  st_buffer* din[2] = {upload(g_rt, 0, &dp->in[0]), upload(g_rt, 0, &dp->in[1])};
  st_buffer* dout[1];
  ASSERT_OK(st_program_execute(dprog, 0, din, 2, dout, 1, NULL));
  ASSERT_ERROR(st_buffer_copy_to_device(din[0], 1, &x), ST_CODE_RUNTIME, "device->device copy", "consumed");
  assert_null(x);
  st_buffer_destroy(dout[0]);
  st_buffer_destroy(din[0]);
  st_buffer_destroy(din[1]);
  st_program_destroy(dprog);
  st_buffer_destroy(a);
  st_buffer_destroy(b);
  st_program_destroy(p);
}

static void test_input_errors(void** state) {
  (void)state;
  const tu_prog* mp = prog("matmul");
  st_program* p = compile(g_rt, mp);
  const char* name = mp->file; /* compile_file names programs by path */
  st_buffer* a = upload(g_rt, 0, &mp->in[0]); /* f32[4,8] */
  st_buffer* b = upload(g_rt, 0, &mp->in[1]); /* f32[8,4] */
  st_buffer* out[1];
  st_buffer* one[1] = {a};
  ASSERT_ERROR(st_program_execute(p, 0, one, 1, out, 1, NULL), ST_CODE_RUNTIME, name, "expected 2 inputs, given 1");
  st_buffer* swapped[2] = {b, a};
  ASSERT_ERROR(st_program_execute(p, 0, swapped, 2, out, 1, NULL), ST_CODE_RUNTIME, name,
               "input 0: expected f32[4,8], given f32[8,4]");
  int32_t ints[32] = {0};
  st_tensor_type it = {.dtype = ST_DTYPE_S32, .rank = 2, .dims = {8, 4}};
  st_buffer* c = NULL;
  ASSERT_OK(st_buffer_from_host(g_rt, 0, &it, ints, &c));
  st_buffer* wrong_dtype[2] = {a, c};
  ASSERT_ERROR(st_program_execute(p, 0, wrong_dtype, 2, out, 1, NULL), ST_CODE_RUNTIME,
               "input 1: expected f32[8,4], given s32[8,4]");
  st_buffer* with_null[2] = {a, NULL};
  ASSERT_ERROR(st_program_execute(p, 0, with_null, 2, out, 1, NULL), ST_CODE_RUNTIME, "input 1");
  st_buffer* ok[2] = {a, b};
  st_buffer* out2[2];
  ASSERT_ERROR(st_program_execute(p, 0, ok, 2, out2, 2, NULL), ST_CODE_RUNTIME, "1 output");

  /* The same check with a program named by the caller. */
  size_t n = 0;
  void* code = tu_read_file(mp->file, &n);
  st_program* named = NULL;
  ASSERT_OK(st_program_compile(g_rt, "matmul", code, n, NULL, &named));
  assert_string_equal(st_program_name(named), "matmul");
  ASSERT_ERROR(st_program_execute(named, 0, swapped, 2, out, 1, NULL), ST_CODE_RUNTIME,
               "program 'matmul': input 0: expected f32[4,8], given f32[8,4]");
  st_program_destroy(named);
  free(code);

  /* Bad host transfers. */
  st_tensor_type bad = {.dtype = ST_DTYPE_F32, .rank = 1, .dims = {-1}};
  st_buffer* x = NULL;
  ASSERT_ERROR(st_buffer_from_host(g_rt, 0, &bad, ints, &x), ST_CODE_RUNTIME, "negative");
  ASSERT_ERROR(st_buffer_from_host(g_rt, 5, &it, ints, &x), ST_CODE_RUNTIME, "device 5");
  assert_null(x);

  st_buffer_destroy(a);
  st_buffer_destroy(b);
  st_buffer_destroy(c);
  st_program_destroy(p);
}

static void test_bad_programs(void** state) {
  (void)state;
  st_program* p = NULL;
  static const char garbage[] = "this is not MLIR at all";
  ASSERT_ERROR(st_program_compile(g_rt, "garbage_prog", garbage, sizeof(garbage) - 1, NULL, &p), ST_CODE_RUNTIME,
               "program 'garbage_prog'", "compile failed", "error");
  assert_null(p);
  static const char undeclared[] =
      "module {\n  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n"
      "    %0 = stablehlo.add %arg0, %arg1 : tensor<4xf32>\n    return %0 : tensor<4xf32>\n  }\n}\n";
  ASSERT_ERROR(st_program_compile(g_rt, "undeclared", undeclared, sizeof(undeclared) - 1, NULL, &p), ST_CODE_RUNTIME,
               "program 'undeclared'", "undeclared SSA value");
  ASSERT_ERROR(st_program_compile(g_rt, "empty", "", 0, NULL, &p), ST_CODE_RUNTIME, "program 'empty'", "empty");

  /* Truncated text and truncated bytecode, from files: errors name the file. */
  char* dir = tu_tmpdir("bad");
  const char* srcs[2] = {prog("matmul")->file, prog("elementwise_bc")->file};
  for (int i = 0; i < 2; ++i) {
    size_t n = 0;
    void* code = tu_read_file(srcs[i], &n);
    assert_non_null(code);
    char path[512];
    snprintf(path, sizeof(path), "%s/truncated%d.mlir", dir, i);
    assert_int_equal(tu_write_file(path, code, n / 2), 0);
    ASSERT_ERROR(st_program_compile_file(g_rt, path, NULL, &p), ST_CODE_RUNTIME, path, "compile failed");
    assert_null(p);
    free(code);
  }
  char missing[512];
  snprintf(missing, sizeof(missing), "%s/no_such.mlir", dir);
  ASSERT_ERROR(st_program_compile_file(g_rt, missing, NULL, &p), ST_CODE_IO, missing);
  tu_rmtree(dir);
  free(dir);
}

static void test_xla_options(void** state) {
  (void)state;
  st_runtime_options o;
  st_runtime_options_init(&o);
  const char* unknown[] = {"xla_cpu_enable_fast_math=false", "xla_strata_no_such_option=true"};
  o.xla_options = unknown;
  o.xla_option_count = 2;
  st_runtime* rt = NULL;
  ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_RUNTIME, "xla_strata_no_such_option");
  assert_null(rt);
  const char* mistyped[] = {"xla_cpu_enable_fast_math=7"};
  o.xla_options = mistyped;
  o.xla_option_count = 1;
  ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_RUNTIME, "xla_cpu_enable_fast_math", "'7'");
  const char* malformed[] = {"xla_cpu_enable_fast_math"};
  o.xla_options = malformed;
  ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_CONFIG, "name=value");
  /* Valid options of every kind compile and run. */
  const char* valid[] = {"xla_cpu_enable_fast_math=false", "xla_backend_optimization_level=2",
                         "xla_cpu_multi_thread_eigen = true"};
  o.xla_options = valid;
  o.xla_option_count = 3;
  o.cpu_devices = 1;
  ASSERT_OK(st_runtime_create(&o, &rt));
  run_and_check(rt, prog("reduction"), 0);
  st_runtime_destroy(rt);
}

/* cwd and the discovery environment, restored by the teardown even when a
 * check fails midway (cmocka longjmps out of the test). */
typedef struct {
  char cwd[4096];
  char* env_plugin;
  char* env_src;
  char* env_python;
  char* dir;
} saved_env;

static int discovery_setup(void** state) {
  saved_env* s = calloc(1, sizeof(*s));
  if (!s || !getcwd(s->cwd, sizeof(s->cwd))) return -1;
  const char* a = getenv("STRATA_PJRT_PLUGIN");
  const char* b = getenv("STRATA_SOURCE_DIR");
  s->env_plugin = a ? strdup(a) : NULL;
  s->env_src = b ? strdup(b) : NULL;
  const char* c = getenv("STRATA_PYTHON");
  s->env_python = c ? strdup(c) : NULL;
  s->dir = tu_tmpdir("plugin");
  *state = s;
  return s->dir ? 0 : -1;
}

static int discovery_teardown(void** state) {
  saved_env* s = *state;
  int rc = chdir(s->cwd);
  if (s->env_plugin) setenv("STRATA_PJRT_PLUGIN", s->env_plugin, 1);
  else unsetenv("STRATA_PJRT_PLUGIN");
  if (s->env_src) setenv("STRATA_SOURCE_DIR", s->env_src, 1);
  else unsetenv("STRATA_SOURCE_DIR");
  if (s->env_python) setenv("STRATA_PYTHON", s->env_python, 1);
  else unsetenv("STRATA_PYTHON");
  tu_rmtree(s->dir);
  free(s->dir);
  free(s->env_plugin);
  free(s->env_src);
  free(s->env_python);
  free(s);
  return rc;
}

static void test_plugin_discovery(void** state) {
  saved_env* saved = *state;
  const char* dir = saved->dir;
  st_runtime_options o;
  st_runtime_options_init(&o);
  st_runtime* rt = NULL;

  /* runtime.plugin pointing nowhere: named, and how to fix it. */
  o.plugin_path = "/nonexistent/strata/libnothing_pjrt.so";
  ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_RUNTIME, "/nonexistent/strata/libnothing_pjrt.so", "runtime.plugin");
  assert_null(rt);
  o.plugin_path = NULL;

  /* $STRATA_PJRT_PLUGIN garbage. */
  setenv("STRATA_PJRT_PLUGIN", "\x01garbage::not a path", 1);
  ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_RUNTIME, "STRATA_PJRT_PLUGIN", "garbage::not a path");

  /* A file that is not a shared library, and a library that is not a
   * plugin: both name the path. */
  char fake[512];
  snprintf(fake, sizeof(fake), "%s/fake_pjrt.so", dir);
  assert_int_equal(tu_write_file(fake, "not an ELF file", 15), 0);
  setenv("STRATA_PJRT_PLUGIN", fake, 1);
  ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_RUNTIME, "cannot load PJRT plugin", fake);
  unsetenv("STRATA_PJRT_PLUGIN");
  const char* libm[] = {"/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6", "/usr/lib/aarch64-linux-gnu/libm.so.6"};
  for (size_t i = 0; i < 3; ++i) {
    if (access(libm[i], R_OK) != 0) continue;
    o.plugin_path = libm[i];
    ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_RUNTIME, "GetPjrtApi", libm[i]);
    break;
  }
  o.plugin_path = NULL;

  /* Not found anywhere: no setting, a folder without .venv, and the source
   * folder pointed at the same empty place. */
  assert_int_equal(chdir(dir), 0);
  setenv("STRATA_SOURCE_DIR", dir, 1);
  unsetenv("STRATA_PYTHON");
  ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_RUNTIME, "no PJRT plugin found", "runtime.plugin (not set)",
               "STRATA_PJRT_PLUGIN", "lammps_jax_pjrt_cpu", dir, "set runtime.plugin=PATH or STRATA_PJRT_PLUGIN");

  /* An installed strata (docs/install.md): no source folder, but
   * $STRATA_PYTHON names a venv's python, and that venv has the plugin. A
   * python outside any venv layout adds nothing. */
  o.cpu_devices = 1;
  setenv("STRATA_PYTHON", "python3", 1);
  ASSERT_ERROR(st_runtime_create(&o, &rt), ST_CODE_RUNTIME, "no PJRT plugin found");
  char py[4200];
  snprintf(py, sizeof(py), "%s/.venv/bin/python", saved->cwd);
  setenv("STRATA_PYTHON", py, 1);
  ASSERT_OK(st_runtime_create(&o, &rt));
  st_runtime_info pinfo;
  st_runtime_get_info(rt, &pinfo);
  assert_non_null(strstr(pinfo.plugin_path, "/.venv/lib/python3"));
  st_runtime_destroy(rt);
  rt = NULL;
  unsetenv("STRATA_PYTHON");

  /* The source folder alone is enough to find the repo's plugin. */
  setenv("STRATA_SOURCE_DIR", saved->cwd, 1);
  ASSERT_OK(st_runtime_create(&o, &rt));
  st_runtime_info info;
  st_runtime_get_info(rt, &info);
  assert_non_null(strstr(info.plugin_path, "lammps_jax_pjrt_cpu"));
  assert_int_equal(info.device_count, 1);
  st_runtime_destroy(rt);
}

/* Several threads share one runtime and one program (the documented
 * thread-safety contract): each uploads, runs and reads back 20 times. */
typedef struct {
  st_program* prog;
  const tu_prog* tp;
  int device;
  int failures;
  char why[256];
} thread_job;

static void* thread_main(void* arg) {
  thread_job* j = arg;
  size_t n0 = 0, n1 = 0, nw = 0;
  void* d0 = tu_read_file(j->tp->in[0].file, &n0);
  void* d1 = tu_read_file(j->tp->in[1].file, &n1);
  void* want = tu_read_file(j->tp->out[0].file, &nw);
  void* got = malloc(nw);
  for (int r = 0; r < 20 && d0 && d1 && want && got; ++r) {
    st_buffer* in[2] = {NULL, NULL};
    st_buffer* out[1] = {NULL};
    st_status s = st_buffer_from_host(g_rt, j->device, &j->tp->in[0].type, d0, &in[0]);
    if (!s) s = st_buffer_from_host(g_rt, j->device, &j->tp->in[1].type, d1, &in[1]);
    if (!s) s = st_program_execute(j->prog, j->device, in, 2, out, 1, NULL);
    if (!s) s = st_buffer_to_host(out[0], got, nw);
    if (s) {
      snprintf(j->why, sizeof(j->why), "%s", st_status_message(s));
      st_status_free(s);
      ++j->failures;
    } else if (!tu_close(&j->tp->out[0].type, got, want, 2e-6, 1e-6, j->why, sizeof(j->why))) {
      ++j->failures;
    }
    st_buffer_destroy(out[0]);
    st_buffer_destroy(in[0]);
    st_buffer_destroy(in[1]);
  }
  free(d0);
  free(d1);
  free(want);
  free(got);
  return NULL;
}

static void test_threads(void** state) {
  (void)state;
  const tu_prog* mp = prog("matmul");
  st_program* p = compile(g_rt, mp);
  thread_job jobs[4];
  pthread_t th[4];
  for (int i = 0; i < 4; ++i) {
    jobs[i] = (thread_job){.prog = p, .tp = mp, .device = i % 2};
    assert_int_equal(pthread_create(&th[i], NULL, thread_main, &jobs[i]), 0);
  }
  for (int i = 0; i < 4; ++i) pthread_join(th[i], NULL);
  for (int i = 0; i < 4; ++i)
    if (jobs[i].failures) fail_msg("thread %d: %d failures, last: %s", i, jobs[i].failures, jobs[i].why);
  st_runtime_stats st;
  st_runtime_get_stats(g_rt, &st);
  assert_int_equal(st.live_buffers, 0);
  st_program_destroy(p);
}

static void test_stats(void** state) {
  (void)state;
  st_runtime_options o;
  st_runtime_options_init(&o);
  st_runtime* rt = NULL;
  ASSERT_OK(st_runtime_create(&o, &rt));
  st_runtime_stats s0;
  st_runtime_get_stats(rt, &s0);
  assert_int_equal(s0.compiles, 0);
  assert_int_equal(s0.live_buffers, 0);
  run_and_check(rt, prog("matmul"), 1);
  st_runtime_stats s;
  st_runtime_get_stats(rt, &s);
  assert_int_equal(s.compiles, 1);
  assert_int_equal(s.cache_hits + s.cache_misses + s.cache_corrupt, 0); /* no cache */
  assert_int_equal(s.executions, 1);
  assert_int_equal(s.h2d_bytes, 2 * 32 * 4);
  assert_int_equal(s.d2h_bytes, 16 * 4);
  assert_int_equal(s.live_buffers, 0);
  st_runtime_destroy(rt);
}

static int group_setup(void** state) {
  (void)state;
  if (tu_testprogs_make(&g_tp) != 0) return -1;
  return tu_runtime_create(2, &g_rt);
}

static int group_teardown(void** state) {
  (void)state;
  st_runtime_destroy(g_rt);
  tu_testprogs_free(&g_tp);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtypes),
      cmocka_unit_test(test_info_and_devices),
      cmocka_unit_test(test_programs_match_jax),
      cmocka_unit_test(test_signature_parsed),
      cmocka_unit_test(test_multi_device),
      cmocka_unit_test(test_async_and_events),
      cmocka_unit_test(test_donation),
      cmocka_unit_test(test_copy_to_device),
      cmocka_unit_test(test_input_errors),
      cmocka_unit_test(test_bad_programs),
      cmocka_unit_test(test_xla_options),
      cmocka_unit_test_setup_teardown(test_plugin_discovery, discovery_setup, discovery_teardown),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_stats),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
