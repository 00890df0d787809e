/* test_ckpt.c — checkpoints without a trainer: real files, real fork+exit
 * crashes, real threads.
 *   - safetensors: round trip; the reader refuses truncation, bad header
 *     lengths, gaps, unknown dtypes;
 *   - save/open round trip of every manifest field and every byte;
 *   - each corruption of issue 5 is detected and named (file, tensor), and
 *     st_ckpt_find_valid falls back past it;
 *   - a crash (child process _exit) at every hook point of a save leaves
 *     the old or the new checkpoint as the newest valid one, and nothing
 *     that looks committed fails verification;
 *   - an I/O error in the middle of a save leaves the previous checkpoint
 *     and LATEST untouched and no temporary behind;
 *   - retention (keep, keep_every, LATEST protected);
 *   - the writer thread (one save in flight);
 *   - fault injection: crash_in_save kills with SIGKILL and is recorded,
 *     a second st_faults disarms it; io_error_at_save; corrupt_checkpoint;
 *   - the run directory lock, across processes, SIGKILL and hand-down;
 *   - st_plan_locate_trained: a run directory or a checkpoint folder to the
 *     parameters to load, falling back past a damaged checkpoint. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/config.h"
#include "strata/diag.h"
#include "strata/train.h"
#include "test_util.h"

/* Fails unless |expr| fails with ST_CODE_CKPT and a message containing
 * every one of the NULL-terminated needles. */
static void expect_ckpt_error(st_status s, const char* what, ...) {
  if (!s) fail_msg("%s: expected a checkpoint error, got OK", what);
  const char* msg = st_status_message(s);
  if (st_status_code(s) != ST_CODE_CKPT) fail_msg("%s: code %s, want checkpoint error: %s", what, st_code_name(st_status_code(s)), msg);
  va_list ap;
  va_start(ap, what);
  for (const char* n = va_arg(ap, const char*); n; n = va_arg(ap, const char*))
    if (!strstr(msg, n)) fail_msg("%s: message lacks \"%s\": %s", what, n, msg);
  va_end(ap);
  printf("# %s -> %s\n", what, msg);
  st_status_free(s);
}

/*--- a small training state ------------------------------------------------*/

#define NT 4
static const char* kNames[NT] = {"wte", "layers.0.wq", "m:wte", "v:wte"};
static const char* kFiles[NT] = {"params.safetensors", "params.safetensors", "optimizer.safetensors", "optimizer.safetensors"};
static const char* kModel = "{\"d_model\": 8, \"n_layers\": 1, \"vocab_size\": 16}";

static st_tensor_type type_of(int i) {
  st_tensor_type t = {ST_DTYPE_F32, 2, {16, 8}};
  if (i == 1) t.dims[0] = 8;
  return t;
}

static st_ckpt_snapshot* make_snapshot(int64_t step) {
  st_tensor_type types[NT];
  for (int i = 0; i < NT; ++i) types[i] = type_of(i);
  st_ckpt_snapshot* s = st_ckpt_snapshot_create(NT, kNames, kFiles, types);
  for (int i = 0; i < NT; ++i) {
    float* d = st_ckpt_snapshot_data(s, i);
    int64_t n = st_tensor_type_elements(&types[i]);
    for (int64_t k = 0; k < n; ++k) d[k] = (float)(step * 1000 + i * 100 + k) * 0.5f;
  }
  st_ckpt_meta m = {.step = step,
                    .optimizer_step = step,
                    .data_position = step * 4,
                    .batch_size = 4,
                    .seed = 7,
                    .lr = 0.001 * (double)step,
                    .total_steps = 100,
                    .config_hash = "00112233aabbccdd",
                    .bundle_key = "bundlekey0000001",
                    .tokenizer_hash = "0123456789abcdef"};
  json_t* config = json_pack("{s:i}", "seed", 7);
  json_t* model = json_loads(kModel, 0, NULL);
  m.config = config;
  m.model = model;
  st_ckpt_snapshot_set_meta(s, &m);
  json_decref(config);
  json_decref(model);
  return s;
}

static st_ckpt_expect expect_model(void) {
  static st_tensor_type types[NT];
  for (int i = 0; i < NT; ++i) types[i] = type_of(i);
  /* Parsed once and kept: the expectation borrows it. */
  static json_t* model;
  if (!model) model = json_loads(kModel, 0, NULL);
  st_ckpt_expect e = {.bundle_key = "bundlekey0000001", .count = NT, .names = kNames, .types = types,
                      .identity = {model, "0123456789abcdef"},
                      .identity_options = {.recorded = "in the checkpoint", .flags = ST_CKPT_IDENTITY_MICROBATCH}};
  return e;
}

static void save_step(const char* root, int64_t step, int64_t keep) {
  st_ckpt_snapshot* s = make_snapshot(step);
  st_ckpt_save_options o = {root, keep, 0, NULL, NULL, {0}};
  st_ckpt_save_result r;
  ASSERT_OK(st_ckpt_save(&o, s, &r));
  assert_non_null(r.dir);
  assert_true(r.bytes > 0);
  st_ckpt_save_result_clear(&r);
  st_ckpt_snapshot_destroy(s);
}

static char* path2(const char* a, const char* b) { return st_path_join(a, b); }

static int64_t newest_valid_step(const char* root) {
  st_ckpt_expect e = expect_model();
  st_ckpt* c = NULL;
  int skipped = 0;
  ASSERT_OK(st_ckpt_find_valid(root, &e, NULL, NULL, &c, &skipped));
  int64_t step = c ? c->step : -1;
  st_ckpt_free(c);
  return step;
}

/*--- identity ----------------------------------------------------------------*/

/* st_ckpt_identity_check alone: every differing field is named with both
 * values; an older record's missing field is read for what it meant
 * (implied) or noted and not compared; --allow-mismatch lets named fields
 * through and records them; an allow entry naming nothing is exit 2. */
static void test_identity_check(void** state) {
  (void)state;
  json_t* full = json_loads("{\"d_model\": 8, \"block\": \"llama\", \"rope_theta\": 10000.0, \"n_heads\": 2, "
                            "\"n_kv_heads\": 2, \"kernels\": {\"attention\": \"xla\"}, \"microbatch_size\": 2}",
                            0, NULL);
  json_t* given = json_deep_copy(full);
  st_json_put_str(given, "block", "parallel");
  st_json_put_num(given, "rope_theta", 500.0);
  st_json_put_int(given, "microbatch_size", 4);
  st_ckpt_identity rec = {full, "byte"}, giv = {given, "byte"};
  st_ckpt_identity_options o = {.where = "M", .recorded = "in the checkpoint", .fix = "FIX"};
  json_t* report = NULL;
  bool tok = true;
  ASSERT_ERROR(st_ckpt_identity_check(&rec, &giv, &o, &report, &tok), ST_CODE_CKPT,
               "'M': identity mismatch: model.block \"llama\" in the checkpoint, \"parallel\" given; "
               "model.rope_theta 10000.0 in the checkpoint, 500.0 given; FIX");
  assert_false(tok);
  assert_int_equal(json_array_size(json_object_get(report, "mismatched")), 2); /* microbatch_size not compared */
  json_decref(report);
  /* With the flag the microbatch counts too. */
  o.flags = ST_CKPT_IDENTITY_MICROBATCH;
  ASSERT_ERROR(st_ckpt_identity_check(&rec, &giv, &o, NULL, NULL), ST_CODE_CKPT, "model.microbatch_size 2 in the checkpoint, 4 given");
  o.flags = 0;
  /* Allowed: recorded, not refused; allowing one field leaves the other refused. */
  o.allow = "model.block,model.rope_theta";
  ASSERT_OK(st_ckpt_identity_check(&rec, &giv, &o, &report, NULL));
  assert_int_equal(json_array_size(json_object_get(report, "overridden")), 2);
  char* notes = st_ckpt_identity_notes(report, "in the checkpoint");
  assert_non_null(strstr(notes, "overridden (--allow-mismatch): model.block \"llama\" in the checkpoint, \"parallel\" given"));
  free(notes);
  json_decref(report);
  o.allow = "model.block";
  ASSERT_ERROR(st_ckpt_identity_check(&rec, &giv, &o, NULL, NULL), ST_CODE_CKPT, "model.rope_theta 10000.0");
  o.allow = "model";
  ASSERT_OK(st_ckpt_identity_check(&rec, &giv, &o, NULL, NULL));
  o.allow = "model.rope_teta";
  ASSERT_ERROR(st_ckpt_identity_check(&rec, &giv, &o, NULL, NULL), ST_CODE_CONFIG, "'model.rope_teta' names no identity field");
  o.allow = NULL;
  /* The tokenizer, first, and flagged. */
  giv = (st_ckpt_identity){full, "fedcba9876543210"};
  ASSERT_ERROR(st_ckpt_identity_check(&rec, &giv, &o, NULL, &tok), ST_CODE_CKPT,
               "identity mismatch: tokenizer \"byte\" in the checkpoint, \"fedcba9876543210\" given");
  assert_true(tok);
  /* An older record: no block, no n_kv_heads, no kernels. */
  json_t* old = json_loads("{\"d_model\": 8, \"rope_theta\": 10000.0, \"n_heads\": 2, \"microbatch_size\": 2}", 0, NULL);
  json_t* implied = json_loads("{\"block\": \"llama\", \"n_kv_heads\": {\"same_as\": \"n_heads\"}, "
                               "\"kernels.attention\": \"xla\"}", 0, NULL);
  rec = (st_ckpt_identity){old, NULL};
  giv = (st_ckpt_identity){full, "byte"};
  o.implied = implied;
  ASSERT_OK(st_ckpt_identity_check(&rec, &giv, &o, &report, NULL));
  notes = st_ckpt_identity_notes(report, "in the checkpoint");
  assert_string_equal(notes, "not recorded in the checkpoint (an older format), taken as: model.block \"llama\", "
                             "model.n_kv_heads 2, model.kernels.attention \"xla\"; not recorded in the checkpoint (an older "
                             "format), not compared: tokenizer");
  free(notes);
  json_decref(report);
  giv = (st_ckpt_identity){given, NULL};
  ASSERT_ERROR(st_ckpt_identity_check(&rec, &giv, &o, NULL, NULL), ST_CODE_CKPT,
               "model.block not recorded in the checkpoint (an older format: it meant \"llama\"), \"parallel\" given");
  /* Nothing implied: noted, not compared. */
  o.implied = NULL;
  o.allow = "model.rope_theta";
  ASSERT_OK(st_ckpt_identity_check(&rec, &giv, &o, NULL, NULL));
  json_decref(implied);
  json_decref(old);
  json_decref(given);
  json_decref(full);
}

/*--- the tokenizer -----------------------------------------------------------*/

/* The manifest records the tokenizer; a checkpoint of another one is an
 * identity mismatch naming both hashes (exit 7) that stops the search, not
 * a corrupt checkpoint skipped in favour of an older one; without an
 * expected tokenizer it is not checked. */
static void test_tokenizer_hash(void** state) {
  (void)state;
  char* root = tu_tmpdir("tokhash");
  save_step(root, 2, 0);
  char* man = path2(root, "step_2/manifest.json");
  size_t size = 0;
  char* text = tu_read_file(man, &size);
  assert_non_null(strstr(text, "\"tokenizer_hash\": \"0123456789abcdef\""));
  st_ckpt_expect e = expect_model();
  assert_int_equal(newest_valid_step(root), 2);
  e.identity.tokenizer_hash = "fedcba9876543210";
  st_ckpt* c = NULL;
  int skipped = 0;
  ASSERT_ERROR(st_ckpt_find_valid(root, &e, NULL, NULL, &c, &skipped), ST_CODE_CKPT,
               "tokenizer \"0123456789abcdef\" in the checkpoint, \"fedcba9876543210\" given");
  assert_null(c);
  assert_int_equal(skipped, 0);
  char* dir = path2(root, "step_2");
  ASSERT_ERROR(st_ckpt_open(dir, &e, &c), ST_CODE_CKPT, "identity mismatch: tokenizer");
  free(dir);
  e.identity.tokenizer_hash = NULL; /* not checked */
  ASSERT_OK(st_ckpt_find_valid(root, &e, NULL, NULL, &c, &skipped));
  assert_non_null(c);
  assert_string_equal(c->tokenizer_hash, "0123456789abcdef");
  st_ckpt_free(c);
  free(text);
  free(man);
  tu_rmtree(root);
  free(root);
}

/*--- safetensors -----------------------------------------------------------*/

static void test_safetensors_round_trip_and_refusals(void** state) {
  (void)state;
  char* dir = tu_tmpdir("st");
  char* path = path2(dir, "a.safetensors");
  float a[6] = {1, 2, 3, 4, 5, 6};
  int32_t b[3] = {-1, 0, 7};
  st_named_tensor ts[2] = {{"a", {ST_DTYPE_F32, 2, {2, 3}}, a}, {"b.c", {ST_DTYPE_S32, 1, {3}}, b}};
  ASSERT_OK(st_safetensors_write(path, ts, 2));
  st_safetensors* f = NULL;
  ASSERT_OK(st_safetensors_read(path, &f));
  assert_int_equal(f->count, 2);
  assert_int_equal(f->data_start % 8, 0);
  const st_safetensors_entry* e = st_safetensors_find(f, "b.c");
  assert_non_null(e);
  assert_int_equal(e->type.dtype, ST_DTYPE_S32);
  assert_memory_equal(f->data + e->offset, b, sizeof(b));
  assert_memory_equal(f->data + st_safetensors_find(f, "a")->offset, a, sizeof(a));
  size_t size = f->size;
  st_safetensors_free(f);

  unsigned char* raw = tu_read_file(path, &size);
  /* truncated: the last tensor's bytes are gone */
  tu_write_file(path, raw, size - 4);
  expect_ckpt_error(st_safetensors_read(path, &f), "truncated safetensors", "'b.c'", "past the end", NULL);
  /* header length larger than the file */
  unsigned char* bad = malloc(size);
  memcpy(bad, raw, size);
  bad[0] = 0xff;
  bad[1] = 0xff;
  tu_write_file(path, bad, size);
  expect_ckpt_error(st_safetensors_read(path, &f), "header length", "does not fit", NULL);
  /* trailing bytes after the last tensor (what the Python package refuses too) */
  unsigned char* longer = malloc(size + 8);
  memcpy(longer, raw, size);
  memset(longer + size, 0, 8);
  tu_write_file(path, longer, size + 8);
  expect_ckpt_error(st_safetensors_read(path, &f), "trailing", "trailing bytes", NULL);
  /* unknown dtype: "F32" -> "X32" in the header */
  memcpy(bad, raw, size);
  char* hit = memmem(bad, size, "\"F32\"", 5);
  assert_non_null(hit);
  hit[1] = 'X';
  tu_write_file(path, bad, size);
  expect_ckpt_error(st_safetensors_read(path, &f), "dtype", "unknown dtype \"X32\"", NULL);
  free(longer);
  free(bad);
  free(raw);
  free(path);
  tu_rmtree(dir);
  free(dir);
}

/* Parses |header| (+ |data_size| zero bytes) as a safetensors file. */
static st_status parse_header(const char* header, size_t data_size, st_safetensors** f) {
  size_t n = strlen(header), size = 8 + n + data_size;
  unsigned char* buf = calloc(1, size);
  for (int i = 0; i < 8; ++i) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(buf + 8, header, n);
  return st_safetensors_parse("mem.safetensors", buf, size, f); /* takes |buf| */
}

/* Issue 11, item 2: a shape whose element count overflows was accepted
 * (signed overflow in st_tensor_type_elements, a UBSan report); repeated
 * fields and float offsets were accepted too. */
static void test_safetensors_hostile_headers(void** state) {
  (void)state;
  st_safetensors* f = NULL;
  expect_ckpt_error(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,0]}}", 0, &f),
                    "overflowing shape", "'a'", "overflows", NULL);
  assert_null(f);
  expect_ckpt_error(parse_header("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &f),
                    "repeated field", "repeats a field", NULL);
  expect_ckpt_error(parse_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1, &f), "float offset",
                    "non-negative integer", NULL);
  expect_ckpt_error(parse_header("{\"__metadata__\":{\"k\":1}}", 0, &f), "metadata number", "__metadata__", NULL);
  /* A repeated name means its last entry, as in the package. */
  ASSERT_OK(parse_header("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                         1, &f));
  assert_int_equal(f->count, 1);
  assert_int_equal(f->entries[0].bytes, 1);
  st_safetensors_free(f);
  /* The type helpers never overflow: -1 / SIZE_MAX instead. */
  st_tensor_type t = {ST_DTYPE_F32, 3, {4294967296LL, 4294967296LL, 4}};
  assert_int_equal(st_tensor_type_elements(&t), -1);
  assert_true(st_tensor_type_bytes(&t) == SIZE_MAX);
  st_tensor_type z = {ST_DTYPE_F32, 3, {INT64_MAX, INT64_MAX, 0}};
  assert_int_equal(st_tensor_type_elements(&z), 0);
}

/* A manifest body signed as strata signs it: |body| (which must end with
 * "],\n" or ",\n") + the manifest_xxh64 line of xxh64(body). */
static char* signed_manifest(const char* body) {
  char* out = malloc(strlen(body) + 64);
  sprintf(out, "%s  \"manifest_xxh64\": \"%016llx\"\n}\n", body, (unsigned long long)st_hash64(body, strlen(body), 0));
  return out;
}

static const char* kManifestHead =
    "{\n  \"format\": \"strata-checkpoint\",\n  \"version\": 1,\n  \"step\": 1,\n  \"optimizer_step\": 1,\n"
    "  \"data\": {\"position\": 0, \"batch_size\": 1},\n  \"rng\": {\"seed\": 1},\n"
    "  \"lr_schedule\": {\"lr\": 0.1, \"total_steps\": 2},\n  \"config_hash\": \"c\",\n  \"bundle_key\": \"b\",\n"
    "  \"model\": {},\n  \"config\": {},\n";

/* Issue 11, item 9: every count a checkpoint manifest holds is bounded. */
static void test_manifest_counts_bounded(void** state) {
  (void)state;
  st_strbuf b = {0};
  st_strbuf_append(&b, kManifestHead);
  st_strbuf_append(&b, "  \"files\": [");
  for (int i = 0; i <= ST_CKPT_MAX_FILES; ++i)
    st_strbuf_printf(&b, "%s{\"file\": \"f%d\", \"bytes\": 0, \"xxh64\": \"0000000000000000\"}", i ? ", " : "", i);
  st_strbuf_append(&b, "],\n  \"tensors\": [],\n");
  char* text = signed_manifest(b.data);
  st_ckpt* c = NULL;
  expect_ckpt_error(st_ckpt_parse_manifest("mem", text, strlen(text), &c), "too many files", "ST_CKPT_MAX_FILES", NULL);
  assert_null(c);
  free(text);
  st_strbuf_free(&b);
  /* Tensors: the count is checked before any entry is read. */
  st_strbuf_append(&b, kManifestHead);
  st_strbuf_append(&b, "  \"files\": [],\n  \"tensors\": [0");
  for (int i = 0; i < ST_CKPT_MAX_TENSORS; ++i) st_strbuf_append(&b, ",0");
  st_strbuf_append(&b, "],\n");
  text = signed_manifest(b.data);
  expect_ckpt_error(st_ckpt_parse_manifest("mem", text, strlen(text), &c), "too many tensors", "ST_CKPT_MAX_TENSORS", NULL);
  free(text);
  st_strbuf_free(&b);
  /* At the limits' low end the same manifest is fine. */
  st_strbuf_append(&b, kManifestHead);
  st_strbuf_append(&b, "  \"files\": [],\n  \"tensors\": [],\n");
  text = signed_manifest(b.data);
  ASSERT_OK(st_ckpt_parse_manifest("mem", text, strlen(text), &c));
  assert_int_equal(c->step, 1);
  assert_null(c->loaded);
  st_ckpt_free(c);
  free(text);
  st_strbuf_free(&b);
}

/*--- save / open -----------------------------------------------------------*/

static void test_save_open_round_trip(void** state) {
  (void)state;
  char* root = tu_tmpdir("ckpt");
  save_step(root, 20, 3);
  char* d = path2(root, "step_20");
  st_ckpt_expect e = expect_model();
  st_ckpt* c = NULL;
  ASSERT_OK(st_ckpt_open(d, &e, &c));
  assert_int_equal(c->step, 20);
  assert_int_equal(c->optimizer_step, 20);
  assert_int_equal(c->data_position, 80);
  assert_int_equal(c->batch_size, 4);
  assert_int_equal(c->seed, 7);
  assert_int_equal(c->total_steps, 100);
  assert_true(c->lr == 0.001 * 20);
  assert_string_equal(c->bundle_key, "bundlekey0000001");
  assert_string_equal(c->config_hash, "00112233aabbccdd");
  assert_int_equal(c->tensor_count, NT);
  assert_int_equal(c->file_count, 2);
  /* A meta without a mesh is one device: recorded as 1 x 1 x 1. */
  assert_int_equal(c->mesh_data, 1);
  assert_int_equal(c->mesh_fsdp, 1);
  assert_int_equal(c->mesh_tensor, 1);
  assert_int_equal(c->mesh_devices, 1);
  assert_int_equal(c->mesh_processes, 0); /* one process: not recorded */
  st_ckpt_snapshot* want = make_snapshot(20);
  for (int i = 0; i < NT; ++i) {
    const st_ckpt_tensor_info* info = NULL;
    const void* data = st_ckpt_tensor_data(c, kNames[i], &info);
    assert_non_null(data);
    assert_string_equal(info->file, kFiles[i]);
    st_tensor_type t = type_of(i);
    assert_memory_equal(data, st_ckpt_snapshot_data(want, i), st_tensor_type_bytes(&t));
  }
  /* The mesh it was written with comes back (docs/checkpoints.md, "Across meshes"). */
  st_ckpt_meta m = *st_ckpt_snapshot_meta(want);
  m.step = 21;
  m.mesh_data = 2;
  m.mesh_tensor = 3;
  m.mesh_processes = 2; /* a job of 2 processes (docs/multiprocess.md, "Checkpoints") */
  st_ckpt_snapshot_set_meta(want, &m);
  st_ckpt_save_options so = {root, 3, 0, NULL, NULL, {0}};
  ASSERT_OK(st_ckpt_save(&so, want, NULL));
  st_ckpt_snapshot_destroy(want);
  st_ckpt_free(c);
  char* d21 = path2(root, "step_21");
  ASSERT_OK(st_ckpt_open(d21, &e, &c));
  assert_int_equal(c->mesh_data, 2);
  assert_int_equal(c->mesh_fsdp, 1);
  assert_int_equal(c->mesh_tensor, 3);
  assert_int_equal(c->mesh_devices, 6);
  assert_int_equal(c->mesh_processes, 2);
  st_ckpt_free(c);
  free(d21);
  char* latest = st_ckpt_read_latest(root);
  assert_string_equal(latest, "step_21");
  free(latest);
  /* no temporaries left */
  char* names = NULL;
  ASSERT_OK(st_ckpt_remove_temporaries(root, &names));
  assert_true(!names || !names[0]);
  free(names);
  free(d);
  tu_rmtree(root);
  free(root);
}

/*--- the corruption matrix -------------------------------------------------*/

typedef void (*corrupt_fn)(const char* dir);

static void flip_byte(const char* path, long from_end) {
  size_t n = 0;
  unsigned char* b = tu_read_file(path, &n);
  assert_non_null(b);
  b[n - (size_t)from_end] ^= 0x01;
  tu_write_file(path, b, n);
  free(b);
}

static void c_truncate(const char* dir) {
  char* p = path2(dir, "optimizer.safetensors");
  size_t n = 0;
  unsigned char* b = tu_read_file(p, &n);
  tu_write_file(p, b, n / 2);
  free(b);
  free(p);
}
static void c_flip(const char* dir) {
  char* p = path2(dir, "params.safetensors");
  flip_byte(p, 10); /* inside the last params tensor */
  free(p);
}
static void c_no_manifest(const char* dir) {
  char* p = path2(dir, ST_CKPT_MANIFEST);
  unlink(p);
  free(p);
}
static void c_bad_manifest(const char* dir) {
  char* p = path2(dir, ST_CKPT_MANIFEST);
  tu_write_file(p, "{\"format\": \"strata-checkpoint\", \"step\": ", 40);
  free(p);
}
static void c_edited_manifest(const char* dir) {
  /* "step": 30 -> "step": 31: still JSON, only the checksum can tell. */
  char* p = path2(dir, ST_CKPT_MANIFEST);
  size_t n = 0;
  char* t = tu_read_file(p, &n);
  char* hit = memmem(t, n, "\"step\": 30", 10);
  assert_non_null(hit);
  hit[9] = '1';
  tu_write_file(p, t, n);
  free(t);
  free(p);
}
static void c_shape_in_file(const char* dir) {
  /* [8, 8] -> [4, 16] in the file header: same size, different shape. */
  char* p = path2(dir, "params.safetensors");
  size_t n = 0;
  char* t = tu_read_file(p, &n);
  char* hit = memmem(t, n, "\"shape\": [8, 8]", 15);
  assert_non_null(hit);
  memcpy(hit, "\"shape\": [4,16]", 15);
  tu_write_file(p, t, n);
  free(t);
  free(p);
}
static void c_missing_file(const char* dir) {
  char* p = path2(dir, "params.safetensors");
  unlink(p);
  free(p);
}

/* The "different model" and "different bundle" cases write a checkpoint
 * whose manifest is valid in itself but not for this model. */
static void write_foreign(const char* root, int64_t step, const char* model, const char* bundle, bool other_shape) {
  st_tensor_type types[NT];
  for (int i = 0; i < NT; ++i) {
    types[i] = type_of(i);
    if (other_shape && i == 1) types[i].dims[1] = 4;
  }
  st_ckpt_snapshot* s = st_ckpt_snapshot_create(NT, kNames, kFiles, types);
  st_ckpt_meta m = {.step = step, .optimizer_step = step, .data_position = step * 4, .batch_size = 4, .seed = 7, .total_steps = 100,
                    .config_hash = "0", .bundle_key = bundle};
  json_t* model_tree = json_loads(model, 0, NULL);
  assert_non_null(model_tree);
  m.model = model_tree;
  st_ckpt_snapshot_set_meta(s, &m);
  json_decref(model_tree);
  st_ckpt_save_options o = {root, 100, 0, NULL, NULL, {0}};
  ASSERT_OK(st_ckpt_save(&o, s, NULL));
  st_ckpt_snapshot_destroy(s);
}

static void test_corruption_matrix(void** state) {
  (void)state;
  struct {
    const char* what;
    corrupt_fn fn;
    const char* needle1;
    const char* needle2;
  } cases[] = {
      {"truncated tensor file", c_truncate, "optimizer.safetensors", "truncated"},
      {"flipped byte", c_flip, "params.safetensors", "checksum mismatch"},
      {"missing manifest", c_no_manifest, "manifest.json' is missing", "not a complete checkpoint"},
      {"malformed manifest", c_bad_manifest, "manifest.json' is malformed", "invalid JSON"},
      {"edited manifest", c_edited_manifest, "manifest.json' fails its checksum", "modified or damaged"},
      {"shape mismatch in file", c_shape_in_file, "tensor 'layers.0.wq' is f32[4,16] in the file but f32[8,8] in the manifest", "shape/dtype"},
      {"missing tensor file", c_missing_file, "params.safetensors", "missing"},
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); ++k) {
    char* root = tu_tmpdir("corrupt");
    save_step(root, 20, 10);
    save_step(root, 30, 10);
    char* d = path2(root, "step_30");
    cases[k].fn(d);
    st_ckpt_expect e = expect_model();
    st_ckpt* c = NULL;
    expect_ckpt_error(st_ckpt_open(d, &e, &c), cases[k].what, d, cases[k].needle1, cases[k].needle2, NULL);
    assert_null(c);
    /* fallback: step_30 skipped, step_20 chosen */
    int skipped = 0;
    ASSERT_OK(st_ckpt_find_valid(root, &e, NULL, NULL, &c, &skipped));
    assert_non_null(c);
    assert_int_equal(c->step, 20);
    assert_int_equal(skipped, 1);
    st_ckpt_free(c);
    free(d);
    tu_rmtree(root);
    free(root);
  }
  /* A checkpoint of another model, and one of another bundle, both newer. */
  char* root = tu_tmpdir("foreign");
  save_step(root, 20, 10);
  write_foreign(root, 40, "{\"d_model\": 4, \"n_layers\": 1, \"vocab_size\": 16}", "bundlekey0000001", true);
  write_foreign(root, 30, kModel, "otherbundle00002", false);
  st_ckpt_expect e = expect_model();
  char* d40 = path2(root, "step_40");
  char* d30 = path2(root, "step_30");
  st_ckpt* c = NULL;
  expect_ckpt_error(st_ckpt_open(d40, &e, &c), "different model", "identity mismatch",
                    "model.d_model 4 in the checkpoint, 8 given", NULL);
  expect_ckpt_error(st_ckpt_open(d30, &e, &c), "different bundle", "written with bundle otherbundle00002", "bundlekey0000001", NULL);
  /* Same model JSON, different tensor shape: the tensor is named. */
  st_ckpt_expect e2 = e;
  e2.identity.model = NULL;
  expect_ckpt_error(st_ckpt_open(d40, &e2, &c), "shape mismatch vs model", "tensor 'layers.0.wq' is f32[8,4] in the checkpoint",
                    "the model needs f32[8,8]", NULL);
  int skipped = 0;
  ASSERT_OK(st_ckpt_find_valid(root, &e, NULL, NULL, &c, &skipped));
  assert_non_null(c);
  assert_int_equal(c->step, 20);
  assert_int_equal(skipped, 2);
  st_ckpt_free(c);
  /* Without expectations (strata ckpt verify), both are valid checkpoints. */
  ASSERT_OK(st_ckpt_open(d40, NULL, &c));
  st_ckpt_free(c);
  free(d40);
  free(d30);
  tu_rmtree(root);
  free(root);
}

/*--- crash at every instant ------------------------------------------------*/

typedef struct {
  st_ckpt_point point;
  int nth; /* which occurrence of the point */
  int seen;
} crash_at;

static st_status crash_hook(void* user, st_ckpt_point p, const char* path) {
  crash_at* c = user;
  (void)path;
  if (p == c->point && ++c->seen == c->nth) _exit(42); /* no cleanup: like a kill */
  return ST_OK;
}

static void test_crash_at_every_point(void** state) {
  (void)state;
  int cases = 0;
  for (int p = 0; p < ST_CKPT_POINT_COUNT; ++p) {
    int max_nth = (p == ST_CKPT_AT_FILE_MIDDLE || p == ST_CKPT_AT_FILE_DONE) ? 2 : 1;
    for (int nth = 1; nth <= max_nth; ++nth) {
      char* root = tu_tmpdir("crash");
      save_step(root, 10, 5);
      fflush(NULL);
      pid_t pid = fork();
      assert_true(pid >= 0);
      if (pid == 0) {
        crash_at c = {(st_ckpt_point)p, nth, 0};
        st_ckpt_snapshot* s = make_snapshot(20);
        st_ckpt_save_options o = {root, 5, 0, crash_hook, &c, {0}};
        st_status r = st_ckpt_save(&o, s, NULL);
        _exit(r ? 1 : 0);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      assert_true(WIFEXITED(status));
      assert_int_equal(WEXITSTATUS(status), 42);
      /* Every committed-looking folder verifies; the newest valid is old or new. */
      st_ckpt_entry* v = NULL;
      int n = 0;
      ASSERT_OK(st_ckpt_list(root, &v, &n));
      st_ckpt_expect e = expect_model();
      for (int i = 0; i < n; ++i) {
        st_ckpt* c = NULL;
        st_status s = st_ckpt_open(v[i].dir, &e, &c);
        if (s) fail_msg("crash at %s #%d left an invalid %s: %s", st_ckpt_point_name((st_ckpt_point)p), nth, v[i].name, st_status_message(s));
        st_ckpt_free(c);
      }
      st_ckpt_entries_free(v, n);
      int64_t newest = newest_valid_step(root);
      int64_t want = p >= ST_CKPT_AT_RENAMED ? 20 : 10;
      printf("# crash at %-11s #%d: newest valid step_%lld\n", st_ckpt_point_name((st_ckpt_point)p), nth, (long long)newest);
      assert_int_equal(newest, want);
      char* latest = st_ckpt_read_latest(root);
      assert_non_null(latest);
      /* LATEST names a valid checkpoint (the old one until it is replaced). */
      assert_string_equal(latest, p >= ST_CKPT_AT_COMMITTED ? "step_20" : "step_10");
      free(latest);
      /* The next resume removes what the crash left. */
      char* names = NULL;
      ASSERT_OK(st_ckpt_remove_temporaries(root, &names));
      if (p < ST_CKPT_AT_RENAMED) assert_true(names && strstr(names, ".tmp-step_20-"));
      free(names);
      /* ... and a save of the same step after it succeeds. */
      save_step(root, 20, 5);
      assert_int_equal(newest_valid_step(root), 20);
      tu_rmtree(root);
      free(root);
      ++cases;
    }
  }
  assert_int_equal(cases, ST_CKPT_POINT_COUNT + 2);
}

/*--- I/O errors ------------------------------------------------------------*/

static st_status enospc_hook(void* user, st_ckpt_point p, const char* path) {
  (void)user;
  if (p == ST_CKPT_AT_FILE_MIDDLE) return st_status_make(ST_CODE_IO, "writing '%s' failed: No space left on device", path);
  return ST_OK;
}

static void test_io_error_keeps_previous(void** state) {
  (void)state;
  char* root = tu_tmpdir("ioerr");
  save_step(root, 10, 5);
  st_ckpt_snapshot* s = make_snapshot(20);
  st_ckpt_save_options o = {root, 5, 0, enospc_hook, NULL, {0}};
  st_ckpt_save_result r;
  expect_ckpt_error(st_ckpt_save(&o, s, &r), "ENOSPC mid-save", "checkpoint step_20", "No space left on device", NULL);
  assert_null(r.dir);
  st_ckpt_save_result_clear(&r);
  char* latest = st_ckpt_read_latest(root);
  assert_string_equal(latest, "step_10");
  free(latest);
  assert_int_equal(newest_valid_step(root), 10);
  char* names = NULL;
  ASSERT_OK(st_ckpt_remove_temporaries(root, &names));
  assert_true(!names || !names[0]); /* the failed save cleaned up after itself */
  free(names);
  st_ckpt_snapshot_destroy(s);
  tu_rmtree(root);
  free(root);
}

/*--- retention -------------------------------------------------------------*/

static void test_retention(void** state) {
  (void)state;
  char* root = tu_tmpdir("keep");
  st_ckpt_snapshot* s = make_snapshot(0);
  for (int64_t step = 5; step <= 40; step += 5) {
    st_ckpt_meta m = *st_ckpt_snapshot_meta(s);
    m.step = step;
    st_ckpt_snapshot_set_meta(s, &m);
    st_ckpt_save_options o = {root, 2, 20, NULL, NULL, {0}};
    ASSERT_OK(st_ckpt_save(&o, s, NULL));
  }
  st_ckpt_entry* v = NULL;
  int n = 0;
  ASSERT_OK(st_ckpt_list(root, &v, &n));
  /* newest 2 (40, 35) + multiples of 20 (20; 40 already kept) */
  assert_int_equal(n, 3);
  assert_int_equal(v[0].step, 40);
  assert_int_equal(v[1].step, 35);
  assert_int_equal(v[2].step, 20);
  st_ckpt_entries_free(v, n);
  /* LATEST is protected even when it is not among the newest. */
  char* latest = path2(root, ST_CKPT_LATEST);
  tu_write_file(latest, "step_20\n", 8);
  free(latest);
  assert_int_equal(st_ckpt_retain(root, 1, 0), 1); /* 35 goes; 40 newest, 20 LATEST */
  ASSERT_OK(st_ckpt_list(root, &v, &n));
  assert_int_equal(n, 2);
  assert_int_equal(v[1].step, 20);
  st_ckpt_entries_free(v, n);
  st_ckpt_snapshot_destroy(s);
  tu_rmtree(root);
  free(root);
}

/*--- the writer thread -----------------------------------------------------*/

static void test_writer_thread(void** state) {
  (void)state;
  char* root = tu_tmpdir("writer");
  st_ckpt_save_options o = {root, 10, 0, NULL, NULL, {0}};
  st_ckpt_writer* w = NULL;
  ASSERT_OK(st_ckpt_writer_create(&o, &w));
  st_ckpt_save_result r;
  assert_false(st_ckpt_writer_take(w, true, &r)); /* nothing in flight */
  st_ckpt_snapshot* s = make_snapshot(10);
  ASSERT_OK(st_ckpt_writer_submit(w, s));
  /* a second submit before the first is taken is refused */
  st_status busy = st_ckpt_writer_submit(w, s);
  assert_non_null(busy);
  assert_int_equal(st_status_code(busy), ST_CODE_INTERNAL);
  st_status_free(busy);
  assert_true(st_ckpt_writer_take(w, true, &r));
  assert_null(r.status);
  assert_int_equal(r.step, 10);
  assert_non_null(strstr(r.dir, "step_10"));
  st_ckpt_save_result_clear(&r);
  for (int64_t step = 20; step <= 50; step += 10) {
    st_ckpt_meta m = *st_ckpt_snapshot_meta(s);
    m.step = step;
    st_ckpt_snapshot_set_meta(s, &m);
    ASSERT_OK(st_ckpt_writer_submit(w, s));
    assert_true(st_ckpt_writer_take(w, true, &r));
    assert_null(r.status);
    st_ckpt_save_result_clear(&r);
  }
  /* destroy with a save in flight finishes it */
  st_ckpt_meta m = *st_ckpt_snapshot_meta(s);
  m.step = 60;
  st_ckpt_snapshot_set_meta(s, &m);
  ASSERT_OK(st_ckpt_writer_submit(w, s));
  st_ckpt_writer_destroy(w);
  assert_int_equal(newest_valid_step(root), 60);
  st_ckpt_snapshot_destroy(s);
  tu_rmtree(root);
  free(root);
}

/*--- fault injection -------------------------------------------------------*/

static st_config* faults_config(const char* overrides) {
  char* ov[8];
  int n = 0;
  char* copy = strdup(overrides);
  for (char* t = strtok(copy, " "); t && n < 8; t = strtok(NULL, " ")) ov[n++] = t;
  st_config* c = NULL;
  ASSERT_OK(st_config_load(NULL, n, ov, &c));
  free(copy);
  return c;
}

/* The faults of |cfg|, read as the trainer reads them: through the typed options. */
static st_status faults_from(const st_config* cfg, const char* run, st_faults** f) {
  st_plan_options o;
  st_status s = st_plan_options_from_config(cfg, &o);
  if (!s) s = st_faults_create(&o.faults, run, f);
  st_plan_options_deinit(&o);
  return s;
}

/* st_faults_check_run's refusal: a config error (exit 2) with both parts. */
static void expect_drill_refused(st_status s, const char* a, const char* b) {
  if (!s) fail_msg("the drill was not refused (want \"%s\")", a);
  const char* msg = st_status_message(s);
  assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
  if (!strstr(msg, a) || !strstr(msg, b)) fail_msg("message lacks \"%s\" or \"%s\": %s", a, b, msg);
  st_status_free(s);
}

static void test_faults(void** state) {
  (void)state;
  char* run = tu_tmpdir("faults");
  char* root = path2(run, "checkpoints");
  save_step(root, 10, 5);
  /* crash_in_save=1: SIGKILL halfway through the first file of the first save */
  st_config* cfg = faults_config("faults.crash_in_save=1");
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    st_faults* f = NULL;
    if (faults_from(cfg, run, &f)) _exit(3);
    st_ckpt_snapshot* s = make_snapshot(20);
    st_ckpt_save_options o = {root, 5, 0, st_faults_ckpt_hook, f, {0}};
    st_status r = st_ckpt_save(&o, s, NULL);
    _exit(r ? 1 : 0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGKILL);
  assert_int_equal(newest_valid_step(root), 10);
  char* fired = path2(run, "diag/faults.fired");
  size_t n = 0;
  char* text = tu_read_file(fired, &n);
  assert_non_null(text);
  assert_non_null(strstr(text, "crash_in_save 1 "));
  free(text);
  /* the next attempt is told, and does not fire it again */
  st_faults* f = NULL;
  ASSERT_OK(faults_from(cfg, run, &f));
  assert_string_equal(st_faults_armed(f), "");
  assert_string_equal(st_faults_disarmed(f), "crash_in_save=1");
  /* disarmed is not armed: nothing can be left unfired */
  assert_false(st_faults_any_armed(f));
  json_t* unfired = st_faults_unfired(f);
  assert_int_equal(json_array_size(unfired), 0);
  json_decref(unfired);
  st_ckpt_snapshot* s = make_snapshot(20);
  st_ckpt_save_options o = {root, 5, 0, st_faults_ckpt_hook, f, {0}};
  ASSERT_OK(st_ckpt_save(&o, s, NULL));
  st_faults_destroy(f);
  st_config_destroy(cfg);
  /* faults.repeat keeps it armed */
  cfg = faults_config("faults.crash_in_save=1 faults.repeat=true");
  ASSERT_OK(faults_from(cfg, run, &f));
  assert_string_equal(st_faults_armed(f), "crash_in_save=1, repeat");
  st_faults_destroy(f);
  st_config_destroy(cfg);
  /* io_error_at_save=2 (EIO): the second save of this process fails, the first and third succeed */
  cfg = faults_config("faults.io_error_at_save=2 faults.io_error=EIO");
  ASSERT_OK(faults_from(cfg, run, &f));
  assert_string_equal(st_faults_armed(f), "io_error_at_save=2 (EIO)");
  /* a run that can begin one save only cannot fire it; two can */
  st_status r = st_faults_check_run(f, 1, 10, 1, "the test's bound");
  expect_drill_refused(r, "faults.io_error_at_save=2 cannot fire", "at most 1 (the test's bound)");
  ASSERT_OK(st_faults_check_run(f, 1, 10, 2, ""));
  unfired = st_faults_unfired(f);
  assert_int_equal(json_array_size(unfired), 1);
  assert_string_equal(json_string_value(json_array_get(unfired, 0)), "faults.io_error_at_save=2");
  json_decref(unfired);
  o.hook_user = f;
  for (int64_t step = 30; step <= 50; step += 10) {
    st_ckpt_meta m = *st_ckpt_snapshot_meta(s);
    m.step = step;
    st_ckpt_snapshot_set_meta(s, &m);
    st_status r = st_ckpt_save(&o, s, NULL);
    if (step == 40) {
      expect_ckpt_error(r, "injected EIO", "Input/output error", "faults.io_error_at_save=2", NULL);
      assert_int_equal(newest_valid_step(root), 30);
    } else {
      ASSERT_OK(r);
    }
  }
  assert_int_equal(newest_valid_step(root), 50);
  unfired = st_faults_unfired(f); /* fired at the second save */
  assert_int_equal(json_array_size(unfired), 0);
  json_decref(unfired);
  st_faults_destroy(f);
  st_config_destroy(cfg);
  /* a step drill: refused before a resume's checkpoint and beyond the last step */
  cfg = faults_config("faults.crash_at_step=5");
  ASSERT_OK(faults_from(cfg, run, &f));
  ASSERT_OK(st_faults_check_run(f, 1, 20, 0, ""));
  r = st_faults_check_run(f, 11, 20, 5, "");
  expect_drill_refused(r, "faults.crash_at_step=5 cannot fire", "resumes after step 10");
  r = st_faults_check_run(f, 21, 20, 5, "");
  expect_drill_refused(r, "faults.crash_at_step=5 cannot fire", "runs no step");
  st_faults_destroy(f);
  st_config_destroy(cfg);
  /* corrupt_checkpoint: detected as a checksum mismatch, fallback works */
  char* d50 = path2(root, "step_50");
  char* file = NULL;
  ASSERT_OK(st_faults_corrupt_checkpoint(d50, &file));
  assert_non_null(strstr(file, "params.safetensors"));
  st_ckpt* c = NULL;
  st_ckpt_expect e = expect_model();
  expect_ckpt_error(st_ckpt_open(d50, &e, &c), "corrupt_latest", "params.safetensors", "checksum mismatch", NULL);
  assert_int_equal(newest_valid_step(root), 30);
  free(file);
  free(d50);
  st_ckpt_snapshot_destroy(s);
  free(fired);
  free(root);
  tu_rmtree(run);
  free(run);
}

/* The run directory lock (st_fs_lock): busy for another open, also in
 * another process; released by close and by SIGKILL; handed to a child
 * through an inherited descriptor ($STRATA_RUN_LOCK_FD). */
static void test_run_dir_lock(void** state) {
  (void)state;
  char* dir = tu_tmpdir("lock");
  char path[1100], other[1100];
  snprintf(path, sizeof(path), "%s/.lock", dir);
  snprintf(other, sizeof(other), "%s/.other", dir);
  int fd = -1, busy = -1;
  long holder = 0;
  ASSERT_OK(st_fs_lock(path, &fd, &holder));
  assert_true(fd >= 0);
  char* text = NULL;
  size_t n = 0;
  ASSERT_OK(st_fs_read_file(path, &text, &n));
  assert_int_equal(strtol(text, NULL, 10), (long)getpid());
  free(text);
  /* A second open description is refused, naming the holder. */
  ASSERT_OK(st_fs_lock(path, &busy, &holder));
  assert_int_equal(busy, -1);
  assert_int_equal(holder, (long)getpid());
  /* The probe (strata status) sees the holder without taking the lock; a
   * missing lock file is nobody's. */
  long probed = 0;
  ASSERT_OK(st_fs_lock_probe(path, &probed));
  assert_int_equal(probed, (long)getpid());
  ASSERT_OK(st_fs_lock_probe(other, &probed));
  assert_int_equal(probed, 0);
  assert_false(st_fs_exists(other)); /* and creates nothing */

  /* Another process: refused while we hold it; a handed-down descriptor is
   * adopted, a descriptor of another file is not. */
  pid_t pid = fork();
  if (pid == 0) {
    int b = -1;
    long h = 0;
    if (st_fs_lock(path, &b, &h) || b != -1 || h != (long)getppid()) _exit(1);
    if (st_fs_lock_inherited(path) != -1) _exit(2); /* nothing handed down yet */
    unsetenv("STRATA_RUN_LOCK_PID");
    if (st_fs_lock_held_by_ancestor(h)) _exit(5);
    st_fs_lock_hand_down(fd);
    if (st_fs_lock_inherited(other) != -1) _exit(3);
    if (st_fs_lock_inherited(path) != fd) _exit(4);
    /* The holder named in $STRATA_RUN_LOCK_PID and an ancestor (a rank under
     * mpirun under strata run): held for us, also a generation further down;
     * another pid is not. */
    if (!st_fs_lock_held_by_ancestor(h) || st_fs_lock_held_by_ancestor((long)getpid())) _exit(6);
    pid_t grandchild = fork();
    if (grandchild == 0) _exit(st_fs_lock_held_by_ancestor(h) ? 0 : 1);
    int gs = 0;
    if (waitpid(grandchild, &gs, 0) != grandchild || !WIFEXITED(gs) || WEXITSTATUS(gs) != 0) _exit(7);
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);

  /* A holder killed by SIGKILL leaves no stale lock. */
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  pid = fork();
  if (pid == 0) {
    int b = -1;
    long h = 0;
    if (st_fs_lock(other, &b, &h) || b < 0) _exit(1);
    if (write(ready[1], "x", 1) != 1) _exit(2);
    pause();
    _exit(0);
  }
  char c;
  assert_int_equal(read(ready[0], &c, 1), 1);
  ASSERT_OK(st_fs_lock(other, &busy, &holder));
  assert_int_equal(busy, -1);
  assert_int_equal(holder, (long)pid);
  ASSERT_OK(st_fs_lock_probe(other, &probed));
  assert_int_equal(probed, (long)pid);
  kill(pid, SIGKILL);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  /* Dead holder: free, though its pid is still in the file. */
  ASSERT_OK(st_fs_lock_probe(other, &probed));
  assert_int_equal(probed, 0);
  ASSERT_OK(st_fs_lock(other, &busy, &holder));
  assert_true(busy >= 0);
  close(busy);
  close(ready[0]);
  close(ready[1]);

  /* Closing releases it. */
  close(fd);
  ASSERT_OK(st_fs_lock_probe(path, &probed));
  assert_int_equal(probed, 0);
  ASSERT_OK(st_fs_lock(path, &fd, &holder));
  assert_true(fd >= 0);
  close(fd);
  tu_rmtree(dir);
  free(dir);
}

/*--- st_plan_locate_trained: a run directory or a checkpoint folder -> parameters ---*/

static void write_text(const char* dir, const char* name, const char* text) {
  char* p = path2(dir, name);
  assert_int_equal(tu_write_file(p, text, strlen(text)), 0);
  free(p);
}

static void expect_params(const char* path, const char* want_suffix, int64_t want_step) {
  st_plan_trained_ref r;
  ASSERT_OK(st_plan_locate_trained(path, &r));
  size_t n = strlen(r.params_path), k = strlen(want_suffix);
  if (n < k || strcmp(r.params_path + n - k, want_suffix)) fail_msg("%s: params %s, want ...%s", path, r.params_path, want_suffix);
  assert_int_equal(r.step, want_step);
  assert_non_null(strstr(r.config_path, "/config.yaml"));
  assert_true(r.run_dir[0] == '/');
  st_plan_trained_ref_deinit(&r);
}

static void test_locate(void** state) {
  (void)state;
  char* run = tu_tmpdir("locate");
  char* root = path2(run, "checkpoints");
  /* Not yet a run: no config.yaml, no manifest. */
  ASSERT_ERROR(st_plan_locate_trained(run, &(st_plan_trained_ref){0}), ST_CODE_CONFIG, "neither a run directory",
               "config.yaml", "manifest.json");
  ASSERT_ERROR(st_plan_locate_trained("/nonexistent/strata-run", &(st_plan_trained_ref){0}), ST_CODE_CONFIG, "/nonexistent/strata-run");
  write_text(run, "config.yaml", "train:\n  steps: 30\n");
  /* A run with nothing to load yet. */
  ASSERT_ERROR(st_plan_locate_trained(run, &(st_plan_trained_ref){0}), ST_CODE_CONFIG, "no parameters to load", run);
  save_step(root, 10, 5);
  save_step(root, 20, 5);
  expect_params(run, "/checkpoints/step_20/params.safetensors", 20);
  /* A damaged newest checkpoint: the run falls back to the one before ... */
  char* s20 = path2(root, "step_20");
  c_flip(s20);
  expect_params(run, "/checkpoints/step_10/params.safetensors", 10);
  /* ... but the damaged one named by itself is an error, never replaced. */
  ASSERT_ERROR(st_plan_locate_trained(s20, &(st_plan_trained_ref){0}), ST_CODE_CKPT, "step_20", "params.safetensors");
  char* s10 = path2(root, "step_10");
  expect_params(s10, "/checkpoints/step_10/params.safetensors", 10);
  /* The final parameters of a finished run win over an older checkpoint;
   * not over one as new (the checkpoint is verified). */
  write_text(run, "params.safetensors", "x");
  write_text(run, "events.jsonl", "{\"event\":\"run_done\",\"steps\":30}\n{\"event\":\"saved\"}\n");
  expect_params(run, "/params.safetensors", 30);
  st_plan_trained_ref r;
  ASSERT_OK(st_plan_locate_trained(run, &r));
  assert_null(strstr(r.params_path, "checkpoints"));
  st_plan_trained_ref_deinit(&r);
  write_text(run, "events.jsonl", "{\"event\":\"run_done\",\"steps\":10}\n");
  expect_params(run, "/checkpoints/step_10/params.safetensors", 10);
  /* Every checkpoint damaged and no final parameters: a checkpoint error. */
  char* fin = path2(run, "params.safetensors");
  unlink(fin);
  free(fin);
  c_flip(s10);
  ASSERT_ERROR(st_plan_locate_trained(run, &(st_plan_trained_ref){0}), ST_CODE_CKPT, "every one failed verification", run);
  /* A checkpoint outside a run directory names what it looked for. */
  char* lone = tu_tmpdir("lone");
  char* lone_root = path2(lone, "checkpoints");
  save_step(lone_root, 10, 5);
  char* lone10 = path2(lone_root, "step_10");
  ASSERT_ERROR(st_plan_locate_trained(lone10, &(st_plan_trained_ref){0}), ST_CODE_CONFIG, "not inside a run directory", "config.yaml");
  tu_rmtree(lone);
  free(lone);
  free(lone_root);
  free(lone10);
  free(s10);
  free(s20);
  free(root);
  tu_rmtree(run);
  free(run);
}

/*--- per-rank shards ---------------------------------------------------------*/

/* Two ranks write their rows of the small state (layers.0.wq not cut: rank
 * 0 holds it whole), rank 0 commits; the reader assembles each tensor
 * whole, bit for bit; manifests whose rows leave a gap or overlap are
 * refused naming the tensor. */
static void test_rank_shards(void** state) {
  (void)state;
  char* root = tu_tmpdir("shards");
  st_ckpt_snapshot* whole = make_snapshot(5);
  st_tensor_type types[NT];
  for (int i = 0; i < NT; ++i) types[i] = type_of(i);
  const int parts[NT] = {2, 1, 2, 2};
  st_ckpt_save_options o = {root, 3, 0, NULL, NULL, {0}};
  st_ckpt_part recs[2];
  for (int r = 0; r < 2; ++r) {
    const char* names[NT];
    const char* files[NT];
    st_tensor_type pt[NT];
    int index[NT], n = 0;
    int64_t begin[NT];
    char file[64];
    snprintf(file, sizeof(file), ST_CKPT_RANK_FILE_FMT, r);
    for (int i = 0; i < NT; ++i) {
      int64_t b = 0, e = 0;
      st_ckpt_rows_of(types[i].dims[0], parts[i], r, &b, &e);
      if (b == e) continue;
      names[n] = kNames[i];
      files[n] = file;
      pt[n] = types[i];
      pt[n].dims[0] = e - b;
      begin[n] = b;
      index[n++] = i;
    }
    st_ckpt_snapshot* mine = st_ckpt_snapshot_create(n, names, files, pt);
    for (int k = 0; k < n; ++k) {
      const size_t row = st_tensor_type_bytes(&types[index[k]]) / (size_t)types[index[k]].dims[0];
      memcpy(st_ckpt_snapshot_data(mine, k), (char*)st_ckpt_snapshot_data(whole, index[k]) + (size_t)begin[k] * row,
             st_tensor_type_bytes(&pt[k]));
    }
    ASSERT_OK(st_ckpt_save_rank(&o, mine, 5, index, NT, &recs[r]));
    st_ckpt_snapshot_destroy(mine);
  }
  /* Before the commit nothing is a checkpoint: a rank killed here leaves none. */
  assert_int_equal(newest_valid_step(root), -1);
  st_ckpt_save_result res;
  ASSERT_OK(st_ckpt_commit_ranks(&o, st_ckpt_snapshot_meta(whole), NT, kNames, types, parts, 2, recs, &res));
  st_ckpt_save_result_clear(&res);
  for (int r = 0; r < 2; ++r) st_ckpt_part_clear(&recs[r]);
  st_ckpt_expect e = expect_model();
  st_ckpt* c = NULL;
  char* dir = path2(root, "step_5");
  ASSERT_OK(st_ckpt_open(dir, &e, &c));
  assert_int_equal(c->file_count, 2);
  assert_int_equal(c->whole_count, NT);
  for (int i = 0; i < NT; ++i) {
    const st_ckpt_tensor_info* info = NULL;
    const void* d = st_ckpt_tensor_data(c, kNames[i], &info);
    assert_non_null(d);
    assert_int_equal(info->bytes, st_tensor_type_bytes(&types[i]));
    assert_memory_equal(d, st_ckpt_snapshot_data(whole, i), info->bytes);
  }
  st_ckpt_free(c);
  assert_int_equal(newest_valid_step(root), 5);
  /* A rank reading its own file only: rank 1's rows of wte are there, rank
   * 0's (never read) are zeros. */
  c = NULL;
  ASSERT_OK(st_ckpt_open_file(dir, &e, "rank-1.safetensors", &c));
  assert_null(c->loaded[0]);
  assert_non_null(c->loaded[1]);
  const float* w = st_ckpt_tensor_data(c, "wte", NULL);
  const float* want = st_ckpt_snapshot_data(whole, 0);
  assert_true(w[0] == 0.0f && w[8 * 8] == want[8 * 8] && w[16 * 8 - 1] == want[16 * 8 - 1]);
  st_ckpt_free(c);
  /* Rows that do not tile dim 0. */
  const char* bad[2][2] = {{"[0, 8]", "[10, 16]"}, {"[0, 10]", "[8, 16]"}};
  for (int k = 0; k < 2; ++k) {
    st_strbuf b = {0};
    st_strbuf_append(&b, kManifestHead);
    st_strbuf_append(&b, "  \"files\": [{\"file\": \"rank-0.safetensors\", \"bytes\": 0, \"xxh64\": \"0000000000000000\"}],\n"
                         "  \"tensors\": [");
    for (int j = 0; j < 2; ++j) {
      int b0 = 0, b1 = 0;
      sscanf(bad[k][j], "[%d, %d]", &b0, &b1);
      st_strbuf_printf(&b, "%s{\"name\": \"wte\", \"file\": \"rank-0.safetensors\", \"dtype\": \"F32\", \"shape\": [%d, 8], "
                           "\"offset\": 0, \"bytes\": %d, \"xxh64\": \"0000000000000000\", \"layout\": \"rows\", \"rows\": %s, "
                           "\"dim0\": 16}",
                       j ? ", " : "", b1 - b0, (b1 - b0) * 32, bad[k][j]);
    }
    st_strbuf_append(&b, "],\n");
    char* text = signed_manifest(b.data);
    st_ckpt* m = NULL;
    expect_ckpt_error(st_ckpt_parse_manifest("x", text, strlen(text), &m), "rows with a gap or an overlap", "tensor 'wte'",
                      "do not tile rows 0 to 16", NULL);
    free(text);
    st_strbuf_free(&b);
  }
  free(dir);
  st_ckpt_snapshot_destroy(whole);
  tu_rmtree(root);
  free(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_safetensors_round_trip_and_refusals),
      cmocka_unit_test(test_safetensors_hostile_headers),
      cmocka_unit_test(test_manifest_counts_bounded),
      cmocka_unit_test(test_save_open_round_trip),
      cmocka_unit_test(test_rank_shards),
      cmocka_unit_test(test_corruption_matrix),
      cmocka_unit_test(test_crash_at_every_point),
      cmocka_unit_test(test_io_error_keeps_previous),
      cmocka_unit_test(test_retention),
      cmocka_unit_test(test_writer_thread),
      cmocka_unit_test(test_faults),
      cmocka_unit_test(test_run_dir_lock),
      cmocka_unit_test(test_locate),
      cmocka_unit_test(test_tokenizer_hash),
      cmocka_unit_test(test_identity_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
