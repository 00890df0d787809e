/* test_config.c — the config module: schema sanity, composition, overrides,
 * every error class (exact key, location and exit code), round trips, the
 * generated reference. Runs from the repository root (configs/, docs/). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

// clang-format off
#include <cmocka.h> /* after stddef.h, stdarg.h and setjmp.h, which it needs */
#include <jansson.h>
// clang-format on

#include <math.h>

#include "config/internal.h"
#include "strata/config.h"
#include "strata/ckpt.h"
#include "strata/plan.h"

/* ---- helpers ------------------------------------------------------------ */

typedef struct {
  char dir[64];
} fixture;

static int setup(void** state) {
  fixture* f = calloc(1, sizeof(*f));
  snprintf(f->dir, sizeof(f->dir), "/tmp/strata-test-config-XXXXXX");
  if (!mkdtemp(f->dir)) return -1;
  *state = f;
  return 0;
}

static int teardown(void** state) {
  fixture* f = *state;
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
  if (system(cmd) != 0) return -1;
  free(f);
  return 0;
}

/* Writes |text| to <dir>/<name>; returns the path (static per slot). */
static const char* put(const fixture* f, const char* name, const char* text) {
  static char paths[8][256];
  static int slot;
  char* p = paths[slot++ % 8];
  snprintf(p, 256, "%s/%s", f->dir, name);
  FILE* out = fopen(p, "w");
  assert_non_null(out);
  fputs(text, out);
  fclose(out);
  return p;
}

static char* fmt(const char* f, ...) {
  static char buf[4][1024];
  static int slot;
  char* b = buf[slot++ % 4];
  va_list ap;
  va_start(ap, f);
  vsnprintf(b, 1024, f, ap);
  va_end(ap);
  return b;
}

static st_config* load_ok(const char* path, int n, char** ov) {
  st_config* c = NULL;
  st_status s = st_config_load(path, n, ov, &c);
  if (s) fail_msg("unexpected error: %s", st_status_message(s));
  assert_non_null(c);
  return c;
}

/* Every config error: class CONFIG, exit code 2, exact message, no config. */
static void load_fails(const char* path, int n, char** ov, const char* message) {
  st_config* c = (st_config*)&c;
  st_status s = st_config_load(path, n, ov, &c);
  assert_non_null(s);
  assert_null(c);
  assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
  assert_int_equal(st_status_exit_code(s), 2);
  assert_string_equal(st_status_message(s), message);
  st_status_free(s);
}

static void override_fails(const char* arg, const char* message) {
  char* ov[] = {(char*)arg};
  load_fails("configs/test.yml", 1, ov, message);
}

static char* capture(st_status (*fn)(const st_config*, FILE*), const st_config* c) {
  char* data = NULL;
  size_t len = 0;
  FILE* m = open_memstream(&data, &len);
  assert_non_null(m);
  st_status s = fn(c, m);
  if (s) fail_msg("%s", st_status_message(s));
  fclose(m);
  return data;
}

static char* read_all(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  char* data = NULL;
  size_t len = 0;
  FILE* m = open_memstream(&data, &len);
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) fwrite(chunk, 1, n, m);
  fclose(f);
  fclose(m);
  return data;
}

static void hash_all(const st_config* c, char out[17]) { st_config_hash(c, NULL, 0, out); }

/* ---- schema ------------------------------------------------------------- */

static void test_schema_table(void** state) {
  (void)state;
  int n;
  const st__cfg_key* keys = st__cfg_schema(&n);
  assert_true(n > 30);
  for (int i = 0; i < n; ++i) {
    assert_non_null(keys[i].doc);
    assert_true(strlen(keys[i].doc) > 0);
    assert_null(strchr(keys[i].doc, '\n'));
    assert_int_equal(st__cfg_find(keys[i].key, strlen(keys[i].key)), i); /* unique */
    /* No key is also a section ("train" and "train.steps"). */
    assert_false(st__cfg_is_section(keys[i].key, strlen(keys[i].key)));
    if (keys[i].type == ST__CFG_ENUM) assert_non_null(keys[i].choices);
    if (keys[i].type == ST__CFG_INT || keys[i].type == ST__CFG_FLOAT) assert_true(keys[i].lo <= keys[i].hi);
    /* A section's keys are contiguous: the writers nest in one pass. */
    const char* dot = strrchr(keys[i].key, '.');
    size_t sec = dot ? (size_t)(dot - keys[i].key) : 0;
    for (int j = i + 2; j < n && sec; ++j) {
      const char* pd = strrchr(keys[j - 1].key, '.');
      size_t psec = pd ? (size_t)(pd - keys[j - 1].key) : 0;
      bool prev_same = psec == sec && !memcmp(keys[j - 1].key, keys[i].key, sec);
      const char* jd = strrchr(keys[j].key, '.');
      size_t jsec = jd ? (size_t)(jd - keys[j].key) : 0;
      bool same = jsec == sec && !memcmp(keys[j].key, keys[i].key, sec);
      if (same && !prev_same) fail_msg("section of %s is split by %s", keys[j].key, keys[j - 1].key);
    }
  }
}

static void test_defaults(void** state) {
  (void)state;
  st_config* c = load_ok(NULL, 0, NULL); /* every default parses and is in range */
  assert_int_equal(st_config_int(c, "seed"), 0);
  assert_int_equal(st_config_int(c, "model.d_model"), 128);
  assert_true(st_config_bool(c, "model.tie_embeddings"));
  assert_string_equal(st_config_string(c, "model.compute_dtype"), "f32");
  assert_true(st_config_float(c, "model.rope_theta") == 10000.0);
  assert_true(st_config_float(c, "train.eps") == 1e-8);
  assert_string_equal(st_config_string(c, "data.path"), "");
  assert_int_equal(st_config_list_count(c, "runtime.xla_options"), 0);
  assert_string_equal(st_config_source(c, "train.steps"), "default");
  st_config_destroy(c);
  st_config_destroy(NULL);
}

/* configs/base.yml is the commented mirror of the schema: it sets every key,
 * to the schema's default; but kernels.<op>, whose rows come from the
 * kernel contract (a new op's key is not written there, docs/kernels.md,
 * "How to add a kernel op"): those it sets are at their default. */
static void test_base_yml_mirrors_schema(void** state) {
  (void)state;
  st_config* b = load_ok("configs/base.yml", 0, NULL);
  int n;
  const st__cfg_key* keys = st__cfg_schema(&n);
  for (int i = 0; i < n; ++i) {
    const char* src = st_config_source(b, keys[i].key);
    /* A new kernel op's key need not be written there (its row comes from the contract). */
    bool kernel_op = !strncmp(keys[i].key, "kernels.", 8);
    if (!kernel_op && strncmp(src, "configs/base.yml:", 17)) fail_msg("configs/base.yml does not set %s", keys[i].key);
    if (!st_config_is_default(b, keys[i].key))
      fail_msg("configs/base.yml sets %s (%s) to another value than the schema's default %s", keys[i].key, src,
               keys[i].def);
  }
  st_config_destroy(b);
}

/* The schema as st_config_key_at gives it, and the getters built on it. */
static void test_schema_rows_and_defaults(void** state) {
  (void)state;
  assert_true(st_config_key_count() > 30);
  int model_keys = 0, if_set = 0;
  for (int i = 0; i < st_config_key_count(); ++i) {
    st_config_key_info k = st_config_key_at(i);
    if (strncmp(k.key, "model.", 6)) {
      assert_int_equal(k.bundle, ST_CONFIG_BUNDLE_ALWAYS); /* only model keys enter the model JSON */
      continue;
    }
    ++model_keys;
    if_set += k.bundle != ST_CONFIG_BUNDLE_ALWAYS;
  }
  assert_int_equal(model_keys, 18);
  assert_int_equal(if_set, 8);
  st_config* c = load_ok("configs/tiny.yml", 0, NULL);
  assert_true(st_config_is_default(c, "model.n_kv_heads") && st_config_is_default(c, "model.moe_aux_weight"));
  assert_true(st_config_is_default(c, "model.layers") && st_config_is_default(c, "seed"));
  assert_false(st_config_is_default(c, "model.n_layers")); /* tiny.yml: 4 */
  assert_int_equal(st_config_int_resolved(c, "model.n_kv_heads"), 4); /* 0: model.n_heads */
  assert_int_equal(st_config_int_resolved(c, "data.vocab_size"), 256);
  st_config_destroy(c);
  char* ov[] = {"model.n_kv_heads=2", "model.moe_aux_weight=0.02", "model.layers=[llama, moe, llama, moe]"};
  c = load_ok("configs/tiny.yml", 3, ov);
  assert_false(st_config_is_default(c, "model.n_kv_heads") || st_config_is_default(c, "model.moe_aux_weight"));
  assert_false(st_config_is_default(c, "model.layers"));
  assert_int_equal(st_config_int_resolved(c, "model.n_kv_heads"), 2);
  st_config_destroy(c);
}

static void expect_ok(st_status s) {
  if (s) fail_msg("%s", st_status_message(s));
}

/* sched.remat read once into its typed form. */
static void test_remat_read(void** state) {
  (void)state;
  st_config_remat r;
  expect_ok(st_config_remat_read(NULL, 4, &r));
  assert_int_equal(r.kind, ST_CONFIG_REMAT_AUTO);
  expect_ok(st_config_remat_read("every:3", 4, &r));
  assert_int_equal(r.kind, ST_CONFIG_REMAT_EVERY);
  assert_int_equal(r.every, 3);
  assert_string_equal(r.text, "every:3");
  expect_ok(st_config_remat_read("3, 1", 4, &r));
  assert_int_equal(r.kind, ST_CONFIG_REMAT_LIST);
  bool layers[4];
  expect_ok(st_config_remat_layers(&r, 4, layers));
  assert_true(!layers[0] && layers[1] && !layers[2] && layers[3]);
  /* Read for 4 layers, laid over 2: layer 3 is not there. */
  st_status s = st_config_remat_layers(&r, 2, layers);
  assert_non_null(s);
  assert_string_equal(st_status_message(s), "sched.remat '3, 1' lists layer 3, but the model has 2 layers (0..1)");
  st_status_free(s);
  expect_ok(st_config_remat_read("full", 4, &r));
  expect_ok(st_config_remat_layers(&r, 4, layers));
  assert_true(layers[0] && layers[1] && layers[2] && layers[3]);
}

static void test_presets(void** state) {
  (void)state;
  st_config* c = load_ok("configs/tiny.yml", 0, NULL);
  assert_int_equal(st_config_int(c, "model.d_model"), 128);
  assert_int_equal(st_config_int(c, "model.n_layers"), 4);
  assert_int_equal(st_config_int(c, "model.n_heads"), 4);
  assert_int_equal(st_config_int(c, "model.d_ff"), 512);
  assert_int_equal(st_config_int(c, "model.seq_len"), 128);
  assert_int_equal(st_config_int(c, "train.steps"), 600);
  assert_int_equal(st_config_int(c, "train.batch_size"), 16);
  assert_int_equal(st_config_int(c, "train.microbatches"), 1);
  assert_true(st_config_float(c, "train.lr") == 3e-3);
  assert_int_equal(st_config_int(c, "train.warmup_steps"), 30);
  assert_int_equal(st_config_int(c, "train.eval_every"), 100);
  assert_int_equal(st_config_int(c, "train.eval_batches"), 4);
  assert_string_equal(st_config_source(c, "model.n_layers"), "configs/tiny.yml:6");
  assert_string_equal(st_config_source(c, "model.vocab_size"), "configs/base.yml:12");
  st_config_destroy(c);

  c = load_ok("configs/small.yml", 0, NULL);
  assert_int_equal(st_config_int(c, "model.d_model"), 256);
  assert_int_equal(st_config_int(c, "model.n_layers"), 8);
  assert_int_equal(st_config_int(c, "model.n_heads"), 8);
  assert_int_equal(st_config_int(c, "model.d_ff"), 1024);
  assert_int_equal(st_config_int(c, "model.seq_len"), 256);
  assert_int_equal(st_config_int(c, "train.batch_size"), 8);
  assert_int_equal(st_config_int(c, "train.steps"), 200);
  st_config_destroy(c);

  c = load_ok("configs/test.yml", 0, NULL);
  assert_int_equal(st_config_int(c, "model.d_model"), 32);
  assert_int_equal(st_config_int(c, "model.n_layers"), 2);
  assert_int_equal(st_config_int(c, "model.n_heads"), 2);
  assert_int_equal(st_config_int(c, "model.d_ff"), 64);
  assert_int_equal(st_config_int(c, "model.seq_len"), 16);
  assert_int_equal(st_config_int(c, "train.batch_size"), 4);
  assert_int_equal(st_config_int(c, "train.microbatches"), 2);
  assert_int_equal(st_config_int(c, "train.steps"), 10);
  assert_true(st_config_bool(c, "data.synthetic"));
  assert_int_equal(st_config_int(c, "train.eval_every"), 5);
  assert_int_equal(st_config_int(c, "train.eval_batches"), 1);
  st_config_destroy(c);
}

/* ---- composition and overrides ------------------------------------------ */

static void test_composition(void** state) {
  fixture* f = *state;
  put(f, "parent.yml", "model:\n  n_layers: 3\n  d_ff: 100\n");
  /* base_config relative to the including file; flat dotted keys and nested
   * maps mix; the file overrides its parent. */
  const char* exp = put(f, "exp.yml", "base_config: parent.yml\nmodel.d_ff: 200\ntrain: {steps: 7}\n");
  char* ov[] = {"train.steps=9", "model.n_layers=5", "model.n_layers=6", "runtime.xla_options=[a=1, 'b, c']"};
  st_config* c = load_ok(exp, 4, ov);
  assert_int_equal(st_config_int(c, "model.d_ff"), 200);
  assert_string_equal(st_config_source(c, "model.d_ff"), fmt("%s:2", exp));
  assert_int_equal(st_config_int(c, "model.n_layers"), 6); /* the last override wins */
  assert_string_equal(st_config_source(c, "model.n_layers"), "command line");
  assert_int_equal(st_config_int(c, "train.steps"), 9);
  assert_int_equal(st_config_list_count(c, "runtime.xla_options"), 2);
  assert_string_equal(st_config_list_item(c, "runtime.xla_options", 0), "a=1");
  assert_string_equal(st_config_list_item(c, "runtime.xla_options", 1), "b, c");
  assert_string_equal(st_config_source(c, "seed"), "configs/base.yml:9");
  st_config_destroy(c);

  /* Without the override, the parent's value and line show. */
  c = load_ok(exp, 0, NULL);
  assert_int_equal(st_config_int(c, "model.n_layers"), 3);
  assert_string_equal(st_config_source(c, "model.n_layers"), fmt("%s/parent.yml:2", f->dir));
  st_config_destroy(c);

  /* A parent not next to the file is looked up in configs/. */
  const char* exp2 = put(f, "exp2.yml", "base_config: tiny.yml\ntrain:\n  steps: 3\n");
  c = load_ok(exp2, 0, NULL);
  assert_int_equal(st_config_int(c, "model.n_layers"), 4);
  assert_string_equal(st_config_source(c, "model.n_layers"), "configs/tiny.yml:6");
  assert_int_equal(st_config_int(c, "train.steps"), 3);
  st_config_destroy(c);

  /* Empty and null values: strings become "", lists []; empty sections are fine. */
  const char* e = put(f, "empty.yml", "data:\n  path:\nruntime:\n  xla_options: ~\nmodel: {}\ntrain:\n");
  c = load_ok(e, 0, NULL);
  assert_string_equal(st_config_string(c, "data.path"), "");
  assert_int_equal(st_config_list_count(c, "runtime.xla_options"), 0);
  st_config_destroy(c);
  c = load_ok(put(f, "nothing.yml", "# only a comment\n"), 0, NULL);
  st_config_destroy(c);
}

/* ---- error classes ------------------------------------------------------ */

static void test_unknown_key(void** state) {
  fixture* f = *state;
  const char* exp = put(f, "exp.yml", "# experiment\nmodel:\n  d_model: 64\ntrain.setps: 5\n");
  load_fails(exp, 0, NULL, fmt("unknown key 'train.setps' in %s:4 (did you mean 'train.steps'?)", exp));
  /* Nested form: the line of the key itself. */
  exp = put(f, "exp.yml", "train:\n  lr: 0.1\n  setps: 5\n");
  load_fails(exp, 0, NULL, fmt("unknown key 'train.setps' in %s:3 (did you mean 'train.steps'?)", exp));
  /* The right name in the wrong place. */
  exp = put(f, "exp.yml", "n_layers: 4\n");
  load_fails(exp, 0, NULL, fmt("unknown key 'n_layers' in %s:1 (did you mean 'model.n_layers'?)", exp));
  exp = put(f, "exp.yml", "trian: {}\n");
  load_fails(exp, 0, NULL, fmt("unknown key 'trian' in %s:1 (did you mean 'train'?)", exp));
  exp = put(f, "exp.yml", "model:\n  zzzzzz: 1\n");
  load_fails(exp, 0, NULL, fmt("unknown key 'model.zzzzzz' in %s:2 (see `strata config --schema`)", exp));
  /* base_config is a top-level key only. */
  exp = put(f, "exp.yml", "train:\n  base_config: x.yml\n");
  load_fails(exp, 0, NULL, fmt("unknown key 'train.base_config' in %s:2 (see `strata config --schema`)", exp));

  override_fails("train.setps=5", "unknown key 'train.setps' on the command line (did you mean 'train.steps'?)");
  override_fails("model.nlayers=5", "unknown key 'model.nlayers' on the command line (did you mean 'model.n_layers'?)");
  override_fails("bogus=1", "unknown key 'bogus' on the command line (see `strata config --schema`)");
  override_fails("train=1", "'train' is a section, not a key: set its keys (train.<key>) (command line)");
  override_fails("train.steps", "'train.steps' is not key=value (command line)");
  override_fails("=5", "'=5' is not key=value (command line)");
  override_fails("base_config=x.yml", "base_config can only be set in a file, not on the command line");
}

static void test_type_errors(void** state) {
  fixture* f = *state;
  /* The acceptance example. */
  override_fails("model.n_layers=x", "model.n_layers: 'x' is not an int (expected int in [1, 1024]) (command line)");
  override_fails("model.n_layers=4.0",
                 "model.n_layers: '4.0' is not an int (expected int in [1, 1024]) (command line)");
  override_fails("model.n_layers=", "model.n_layers: '' is not an int (expected int in [1, 1024]) (command line)");
  override_fails("train.lr=fast", "train.lr: 'fast' is not a float (expected float in [0, 10]) (command line)");
  override_fails("train.lr=nan", "train.lr: 'nan' is not a float (expected float in [0, 10]) (command line)");
  override_fails("train.lr=0x1p3", "train.lr: '0x1p3' is not a float (expected float in [0, 10]) (command line)");
  override_fails("data.synthetic=yes", "data.synthetic: 'yes' is not a bool (expected true or false) (command line)");
  override_fails("model.compute_dtype=fp16",
                 "model.compute_dtype: 'fp16' is not an allowed value (expected one of f32, bf16) (command line)");
  override_fails(
      "runtime.xla_options=a=b",
      "runtime.xla_options: 'a=b' is not a list (expected a list of strings, written [a, b]) (command line)");
  override_fails(
      "runtime.xla_options=[a,]",
      "runtime.xla_options: '[a,]' is not a list (expected a list of strings, written [a, b]) (command line)");
  override_fails("run.id=\xff\xfe", "run.id: value is not valid UTF-8 (command line)");

  const char* exp = put(f, "exp.yml", "model:\n  d_model: 64\n  n_layers: four\n");
  load_fails(exp, 0, NULL, fmt("model.n_layers: 'four' is not an int (expected int in [1, 1024]) (%s:3)", exp));
  exp = put(f, "exp.yml", "model:\n  n_layers: [1, 2]\n");
  load_fails(exp, 0, NULL, fmt("model.n_layers: got a list, expected int in [1, 1024] (%s:2)", exp));
  exp = put(f, "exp.yml", "model:\n  n_layers:\n    deep: 1\n");
  load_fails(exp, 0, NULL, fmt("model.n_layers: got a mapping, expected int in [1, 1024] (%s:2)", exp));
  exp = put(f, "exp.yml", "runtime:\n  xla_options: a=b\n");
  load_fails(exp, 0, NULL,
             fmt("runtime.xla_options: 'a=b' is not a list (expected a list of strings, written [a, b]) (%s:2)", exp));
  exp = put(f, "exp.yml", "runtime:\n  xla_options: [[a]]\n");
  load_fails(exp, 0, NULL,
             fmt("runtime.xla_options: list items must be plain values, not lists or mappings (%s:2)", exp));
  exp = put(f, "exp.yml", "data:\n  path: \"a\\0b\"\n");
  load_fails(exp, 0, NULL, fmt("data.path: value contains a NUL character (%s:2)", exp));
  exp = put(f, "exp.yml", "model: 5\n");
  load_fails(exp, 0, NULL, fmt("'model' is a section, not a key: set its keys (model.<key>) (%s:1)", exp));
  exp = put(f, "exp.yml", "data:\n  synthetic: on\n");
  load_fails(exp, 0, NULL, fmt("data.synthetic: 'on' is not a bool (expected true or false) (%s:2)", exp));
}

static void test_range_errors(void** state) {
  fixture* f = *state;
  const char* exp = put(f, "foo.yml", "train:\n  steps: 5\n  lr: 20\n");
  load_fails(exp, 0, NULL, fmt("train.lr: 20 is out of range [0, 10] (%s:3)", exp));
  override_fails("model.n_layers=0", "model.n_layers: 0 is out of range [1, 1024] (command line)");
  override_fails("model.n_layers=-3", "model.n_layers: -3 is out of range [1, 1024] (command line)");
  override_fails("model.n_layers=99999999999999999999",
                 "model.n_layers: 99999999999999999999 is out of range [1, 1024] (command line)");
  override_fails("model.rope_theta=0", "model.rope_theta: 0 is out of range (0, 1e9] (command line)");
  override_fails("train.beta2=1", "train.beta2: 1 is out of range [0, 1) (command line)");
  override_fails("train.eps=1e999", "train.eps: 1e999 is out of range (0, 1] (command line)");
  override_fails("model.seq_len=8193", "model.seq_len: 8193 is out of range [2, 8192] (command line)");
}

static void test_yaml_errors(void** state) {
  fixture* f = *state;
  const char* exp = put(f, "bad.yml", "model:\n  d_model: 64\n  n_heads: [4\n");
  load_fails(
      exp, 0, NULL,
      fmt("%s:4:1: YAML syntax error: did not find expected ',' or ']' (while parsing a flow sequence at line 3)",
          exp));
  exp = put(f, "bad.yml", "model:\n  d_model: 64\n   n_heads: 4\n");
  load_fails(exp, 0, NULL, fmt("%s:3:11: YAML syntax error: mapping values are not allowed in this context", exp));
  exp = put(f, "bad.yml", "seed: &a 1\nmodel:\n  n_layers: *a\n");
  load_fails(exp, 0, NULL, fmt("%s:3:13: YAML aliases are not supported in config files", exp));
  exp = put(f, "bad.yml", "seed: 1\n---\nseed: 2\n");
  load_fails(exp, 0, NULL, fmt("%s:2:1: only one YAML document per config file", exp));
  exp = put(f, "bad.yml", "- 1\n- 2\n");
  load_fails(exp, 0, NULL, fmt("%s:1:1: a config file must be a mapping of keys (key: value)", exp));
  exp = put(f, "bad.yml", "train:\n  steps: 1\ntrain.steps: 2\n");
  load_fails(exp, 0, NULL, fmt("duplicate key 'train.steps' in %s:3 (first set at line 2)", exp));
  /* libyaml's reader reports a byte offset; the message gives line:column too. */
  exp = put(f, "bad.yml", "seed: 1\n\xff\n");
  load_fails(exp, 0, NULL, fmt("%s:2:1: YAML error: invalid leading UTF-8 octet (byte 8)", exp));
  exp = put(f, "bad.yml", "seed: 1\nrun:\n  id: ab\xc3\n");
  load_fails(exp, 0, NULL, fmt("%s:3:10: YAML error: invalid trailing UTF-8 octet (byte 22)", exp));
}

/* A quoted scalar is a string in YAML: "true" is no bool, "5" no int. */
static void test_quoted_scalars(void** state) {
  fixture* f = *state;
  const char* exp = put(f, "q.yml", "data:\n  synthetic: \"true\"\n");
  load_fails(exp, 0, NULL,
             fmt("data.synthetic: \"true\" is a quoted string, not a bool (expected true or false; write it without "
                 "quotes) (%s:2)",
                 exp));
  exp = put(f, "q.yml", "data:\n  synthetic: 'false'\n");
  load_fails(exp, 0, NULL,
             fmt("data.synthetic: \"false\" is a quoted string, not a bool (expected true or false; write it without "
                 "quotes) (%s:2)",
                 exp));
  exp = put(f, "q.yml", "train:\n  steps: \"5\"\n");
  load_fails(exp, 0, NULL,
             fmt("train.steps: \"5\" is a quoted string, not an int (expected int in [1, 100000000]; write it without "
                 "quotes) (%s:2)",
                 exp));
  exp = put(f, "q.yml", "train:\n  lr: '0.1'\n");
  load_fails(exp, 0, NULL,
             fmt("train.lr: \"0.1\" is a quoted string, not a float (expected float in [0, 10]; write it without "
                 "quotes) (%s:2)",
                 exp));
  /* Unquoted they load; quoted strings and enums stay fine. */
  exp = put(f, "q.yml", "data:\n  synthetic: true\n  path: \"corpus.txt\"\nmodel:\n  compute_dtype: 'bf16'\n");
  st_config* c = load_ok(exp, 0, NULL);
  assert_true(st_config_bool(c, "data.synthetic"));
  assert_string_equal(st_config_string(c, "data.path"), "corpus.txt");
  assert_string_equal(st_config_string(c, "model.compute_dtype"), "bf16");
  st_config_destroy(c);
}

/* Runs st_config_load with stderr sent to a file; returns what it printed. */
static char* load_stderr(const fixture* f, const char* path, st_status* out) {
  char err_path[256];
  snprintf(err_path, sizeof(err_path), "%s/stderr.txt", f->dir);
  fflush(stderr);
  int saved = dup(2);
  FILE* e = fopen(err_path, "w");
  assert_non_null(e);
  dup2(fileno(e), 2);
  st_config* c = NULL;
  *out = st_config_load(path, 0, NULL, &c);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fclose(e);
  st_config_destroy(c);
  char* text = read_all(err_path);
  assert_non_null(text);
  return text;
}

static void test_empty_file_warns(void** state) {
  fixture* f = *state;
  const char* cases[] = {"", "# only a comment\n\n# and another\n", "---\n", "~\n"};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
    const char* exp = put(f, "empty.yml", cases[i]);
    st_status s = ST_OK;
    char* err = load_stderr(f, exp, &s);
    assert_null(s);
    char* want = fmt("strata: warning: config file '%s' is empty (or only comments): it sets nothing, the defaults of "
                     "configs/base.yml apply\n",
                     exp);
    assert_string_equal(err, want);
    free(err);
  }
  /* A file that sets something, or only names a parent, is quiet. */
  const char* quiet[] = {"seed: 3\n", "base_config: tiny.yml\n", "train:\n"};
  for (size_t i = 0; i < sizeof(quiet) / sizeof(quiet[0]); ++i) {
    const char* exp = put(f, "set.yml", quiet[i]);
    st_status s = ST_OK;
    char* err = load_stderr(f, exp, &s);
    assert_null(s);
    assert_string_equal(err, "");
    free(err);
  }
}

/* run.id is a folder name under runs/: no escape, no control bytes, no silent cut. */
static void test_run_id(void** state) {
  (void)state;
  const char* tail = "; run.id names a folder under runs/: use letters, digits, '.', '_' and '-', at most 128, not "
                     "starting with '.' (or set run.dir) (command line)";
  override_fails("run.id=../../x", fmt("run.id: '../../x' starts with '.' (7 bytes)%s", tail));
  override_fails("run.id=a/../../x", fmt("run.id: 'a/../../x' contains '/' (9 bytes)%s", tail));
  override_fails("run.id=a\nb",
                 fmt("run.id: 'a\\nb' contains a character other than letters, digits, '.', '_' and '-' (3 bytes)%s",
                     tail));
  override_fails("run.id=a b",
                 fmt("run.id: 'a b' contains a character other than letters, digits, '.', '_' and '-' (3 bytes)%s",
                     tail));
  char long_id[200];
  memset(long_id, 'a', 129);
  long_id[129] = '\0';
  char arg[256];
  snprintf(arg, sizeof(arg), "run.id=%s", long_id);
  override_fails(arg, fmt("run.id: '%.80s...' is too long (129 bytes)%s", long_id, tail));
  long_id[128] = '\0';
  snprintf(arg, sizeof(arg), "run.id=%s", long_id);
  char* ok[] = {arg};
  st_config* c = load_ok("configs/test.yml", 1, ok);
  assert_int_equal(strlen(st_config_string(c, "run.id")), 128);
  st_config_destroy(c);
  char* plain[] = {"run.id=exp-1.v2_b"};
  c = load_ok("configs/test.yml", 1, plain);
  st_config_destroy(c);
}

/* A huge value is refused with a short quote, not echoed whole. */
static void test_long_values_capped(void** state) {
  fixture* f = *state;
  size_t n = 10 * 1024 * 1024;
  char* text = malloc(n + 64);
  assert_non_null(text);
  int head = snprintf(text, 64, "data:\n  path: ");
  memset(text + head, 'p', n);
  snprintf(text + head + n, 8, "\n");
  const char* exp = put(f, "huge.yml", text);
  free(text);
  st_config* c = NULL;
  st_status s = st_config_load(exp, 0, NULL, &c);
  assert_non_null(s);
  assert_null(c);
  assert_int_equal(st_status_exit_code(s), 2);
  assert_true(strlen(st_status_message(s)) < 512);
  assert_non_null(strstr(st_status_message(s), "data.path: value is 10485760 bytes long, more than the 4096 allowed"));
  st_status_free(s);
  char item[5000];
  memset(item, 'x', 4097);
  item[4097] = '\0';
  char arg[5100];
  snprintf(arg, sizeof(arg), "runtime.xla_options=[%s]", item);
  char* ov[] = {arg};
  s = st_config_load("configs/test.yml", 1, ov, &c);
  assert_non_null(s);
  assert_non_null(strstr(st_status_message(s), "runtime.xla_options: value is 4097 bytes long, more than the 4096 allowed"));
  st_status_free(s);
}

static void test_file_errors(void** state) {
  fixture* f = *state;
  load_fails(fmt("%s/none.yml", f->dir), 0, NULL,
             fmt("cannot read config file '%s/none.yml': No such file or directory", f->dir));
  load_fails(f->dir, 0, NULL, fmt("cannot read config file '%s': Is a directory", f->dir));
  const char* exp = put(f, "exp.yml", "seed: 1\nbase_config: models/nope.yml\n");
  load_fails(exp, 0, NULL,
             fmt("base_config 'models/nope.yml' named in %s:2 not found (looked for %s/models/nope.yml and "
                 "%s/configs/models/nope.yml)",
                 exp, f->dir, STRATA_SOURCE_DIR));
  const char* a = put(f, "a.yml", "base_config: b.yml\n");
  put(f, "b.yml", "base_config: a.yml\n");
  load_fails(a, 0, NULL, fmt("base_config cycle: %s -> %s/b.yml -> %s/a.yml", a, f->dir, f->dir));
  const char* self = put(f, "self.yml", "base_config: self.yml\n");
  load_fails(self, 0, NULL, fmt("base_config cycle: %s -> %s", self, self));
  exp = put(f, "exp.yml", "base_config: [a.yml]\n");
  load_fails(exp, 0, NULL, fmt("base_config: expected a file path (%s:1)", exp));
  /* An error in a parent names the parent. */
  put(f, "p.yml", "train:\n  lr: -1\n");
  exp = put(f, "exp.yml", "base_config: p.yml\n");
  load_fails(exp, 0, NULL, fmt("train.lr: -1 is out of range [0, 10] (%s/p.yml:2)", f->dir));
}

static void test_cross_field(void** state) {
  fixture* f = *state;
  char* heads[] = {"model.n_heads=3"};
  load_fails("configs/tiny.yml", 1, heads,
             "model.d_model (128, configs/tiny.yml:5) is not divisible by model.n_heads (3, command line)");
  char* odd[] = {"model.d_model=96", "model.n_heads=32"};
  load_fails("configs/tiny.yml", 2, odd,
             "head size model.d_model / model.n_heads = 96 / 32 = 3 must be even for RoPE "
             "(model.d_model: command line, model.n_heads: command line)");
  char* mb[] = {"train.microbatches=3"};
  load_fails("configs/tiny.yml", 1, mb,
             "train.batch_size (16, configs/tiny.yml:13) is not divisible by train.microbatches (3, command line)");
  const char* exp = put(f, "v.yml", "model:\n  vocab_size: 100\n");
  load_fails(exp, 0, NULL,
             fmt("model.vocab_size (100, %s:2) must be at least 256 for the byte tokenizer when data.synthetic is "
                 "false (configs/base.yml:54)",
                 exp));
  char* kv[] = {"model.n_kv_heads=3"};
  load_fails("configs/tiny.yml", 1, kv,
             "model.n_heads (4, configs/tiny.yml:7) is not divisible by model.n_kv_heads (3, command line): "
             "grouped-query attention shares each key/value head among model.n_heads / model.n_kv_heads query heads");
  char* kinds[] = {"model.layers=[llama,parallel]"};
  load_fails("configs/tiny.yml", 1, kinds,
             "model.layers (command line) names 2 block kinds, but model.n_layers is 4 (configs/tiny.yml:6): give "
             "one kind per layer, or leave model.layers empty to use model.block for every layer");
  char* kv_tp[] = {"model.n_kv_heads=1", "parallel.tensor=2"};
  load_fails("configs/tiny.yml", 2, kv_tp,
             "model.n_kv_heads (1, command line) is not divisible by parallel.tensor (2, command line): tensor "
             "parallelism splits the key/value heads");
  char* stack[] = {"model.n_kv_heads=2", "model.layers=[llama,parallel,llama,parallel]"};
  st_config_destroy(load_ok("configs/tiny.yml", 2, stack));
  char* synth[] = {"data.synthetic=true"};
  st_config* c = load_ok(exp, 1, synth);
  assert_int_equal(st_config_int(c, "model.vocab_size"), 100);
  st_config_destroy(c);
}

/* ---- output ------------------------------------------------------------- */

static void assert_same_values(const st_config* a, const st_config* b) {
  char ha[17], hb[17];
  hash_all(a, ha);
  hash_all(b, hb);
  assert_string_equal(ha, hb);
  int n;
  const st__cfg_key* keys = st__cfg_schema(&n);
  for (int i = 0; i < n; ++i) {
    st_strbuf x = {0}, y = {0};
    st__cfg_value_text(a, i, &x);
    st__cfg_value_text(b, i, &y);
    assert_string_equal(x.data, y.data);
    st_strbuf_free(&x);
    st_strbuf_free(&y);
  }
  (void)keys;
}

static void test_round_trip(void** state) {
  fixture* f = *state;
  char* ov[] = {"train.lr=0.00123456789012345",
                "run.id=on",
                "data.path=a \"quoted\" path: #x\\n",
                "runtime.xla_options=[x=1, '', \"y: z\"]",
                "run.dir=null",
                "model.init_std=1e-7",
                "run.progress=off",
                "seed=2147483647",
                "train.eps=3.0000000000000001e-9"};
  st_config* c = load_ok("configs/tiny.yml", 9, ov);
  char* yaml = capture(st_config_write_yaml, c);
  const char* path = put(f, "config.yaml", yaml);
  st_config* back = load_ok(path, 0, NULL);
  assert_same_values(c, back);
  assert_string_equal(st_config_string(back, "run.dir"), "null");
  assert_string_equal(st_config_string(back, "data.path"), "a \"quoted\" path: #x\\n");
  assert_string_equal(st_config_list_item(back, "runtime.xla_options", 1), "");
  /* A second round gives the same text. */
  char* yaml2 = capture(st_config_write_yaml, back);
  assert_string_equal(yaml, yaml2);
  st_config_destroy(back);

  /* st_config_save writes the same through a temporary file. */
  const char* saved = fmt("%s/run-config.yaml", f->dir);
  st_status s = st_config_save(c, saved);
  assert_null(s);
  char* text = read_all(saved);
  assert_string_equal(text, yaml);
  st_config_destroy(c);
  free(text);
  free(yaml);
  free(yaml2);
}

static void test_json(void** state) {
  (void)state;
  char* ov[] = {"runtime.xla_options=[a=\"1\"]", "run.dir=x\ty"};
  st_config* c = load_ok("configs/test.yml", 2, ov);
  char* json = capture(st_config_write_json, c);
  assert_non_null(strstr(json, "{\n  \"seed\": 0,\n  \"model\": {\n    \"vocab_size\": 256,\n    \"d_model\": 32,\n"));
  assert_non_null(strstr(json, "\"compute_dtype\": \"f32\",\n"));
  assert_non_null(strstr(json, "\"rope_theta\": 10000.0,\n"));
  assert_non_null(strstr(json, "\"eps\": 1e-8,\n"));
  assert_non_null(strstr(json, "\"synthetic\": true,\n"));
  assert_non_null(strstr(json, "\"xla_options\": [\n      \"a=\\\"1\\\"\"\n    ],\n"));
  assert_non_null(strstr(json, "\"dir\": \"x\\ty\",\n"));
  assert_non_null(strstr(json, "  \"bundle\": {\n    \"dir\": \"\"\n  }"));
  assert_non_null(strstr(json, "\n  }\n}\n")); /* the last section closes the object */
  /* And it parses, to the typed values. */
  json_error_t err;
  json_t* tree = json_loads(json, 0, &err);
  assert_non_null(tree);
  assert_true(json_real_value(json_object_get(json_object_get(tree, "model"), "rope_theta")) == 10000.0);
  assert_string_equal(json_string_value(json_object_get(json_object_get(tree, "run"), "dir")), "x\ty");
  assert_true(json_is_integer(json_object_get(tree, "seed")));
  json_decref(tree);
  free(json);
  st_config_destroy(c);
}

/* True when |text| has a line "<key> <value> <source>" (any spacing). */
static bool has_row(const char* text, const char* key, const char* value, const char* source) {
  for (const char* line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    size_t n = strlen(key);
    if (strncmp(line, key, n) || line[n] != ' ') continue;
    const char* p = line + n;
    while (*p == ' ') ++p;
    if (strncmp(p, value, strlen(value)) || p[strlen(value)] != ' ') continue;
    p += strlen(value);
    while (*p == ' ') ++p;
    if (!strncmp(p, source, strlen(source)) && p[strlen(source)] == '\n') return true;
  }
  return false;
}

static void test_print_sources(void** state) {
  (void)state;
  char* ov[] = {"train.steps=42"};
  st_config* c = load_ok("configs/tiny.yml", 1, ov);
  char* text = capture(st_config_print_sources, c);
  /* Columns are as wide as the longest key and value: compare words. */
  assert_true(has_row(text, "model.n_layers", "4", "configs/tiny.yml:6"));
  assert_true(has_row(text, "train.steps", "42", "command line"));
  char h[17];
  hash_all(c, h);
  assert_non_null(strstr(text, fmt("config hash: %s\n", h)));
  free(text);
  st_config_destroy(c);
}

/* docs/config.md is generated from the schema; it must not drift. */
static void test_docs_match_schema(void** state) {
  (void)state;
  char* doc = read_all("docs/config.md");
  assert_non_null(doc);
  char* data = NULL;
  size_t len = 0;
  FILE* m = open_memstream(&data, &len);
  assert_null(st_config_write_schema_markdown(m));
  fclose(m);
  if (strcmp(doc, data))
    fail_msg(
        "docs/config.md differs from `strata config --schema`; regenerate: ./build/strata config --schema > "
        "docs/config.md");
  free(doc);
  free(data);
}

static void test_hash(void** state) {
  (void)state;
  char* a_ov[] = {"train.steps=11"};
  char* b_ov[] = {"model.n_layers=3"};
  st_config* base = load_ok("configs/test.yml", 0, NULL);
  st_config* a = load_ok("configs/test.yml", 1, a_ov);
  st_config* b = load_ok("configs/test.yml", 1, b_ov);
  const char* model[] = {"model."};
  char h0[17], h1[17], m0[17], ma[17], mb[17];
  hash_all(base, h0);
  hash_all(a, h1);
  assert_int_equal(strlen(h0), 16);
  assert_string_not_equal(h0, h1);
  st_config_hash(base, model, 1, m0);
  st_config_hash(a, model, 1, ma);
  st_config_hash(b, model, 1, mb);
  assert_string_equal(m0, ma); /* train.* is not part of the model hash */
  assert_string_not_equal(m0, mb);
  /* Where a value came from is not part of it: same values, same hash. */
  char* same[] = {"train.steps=10"};
  st_config* s = load_ok("configs/test.yml", 1, same);
  hash_all(s, h1);
  assert_string_equal(h0, h1);
  st_config_destroy(s);
  /* Nor are run.* and obs.* (where it is written, which views of its
   * metrics): not the experiment. */
  char* views[] = {"obs.tensorboard=false", "run.progress=off"};
  s = load_ok("configs/test.yml", 2, views);
  hash_all(s, h1);
  assert_string_equal(h0, h1);
  st_config_destroy(s);
  st_config_destroy(base);
  st_config_destroy(a);
  st_config_destroy(b);
}

static void test_set(void** state) {
  (void)state;
  st_config* c = load_ok("configs/test.yml", 0, NULL);
  assert_null(st_config_set(c, "run.id", "20260101-120000", "generated"));
  assert_string_equal(st_config_string(c, "run.id"), "20260101-120000");
  assert_string_equal(st_config_source(c, "run.id"), "generated");
  st_status s = st_config_set(c, "model.n_heads", "3", NULL);
  assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
  assert_string_equal(st_status_message(s),
                      "model.d_model (32, configs/test.yml:6) is not divisible by model.n_heads (3, command line)");
  st_status_free(s);
  assert_int_equal(st_config_int(c, "model.n_heads"), 2); /* unchanged */
  assert_string_equal(st_config_source(c, "model.n_heads"), "configs/test.yml:8");
  s = st_config_set(c, "model.n_heads", "x", "test");
  assert_string_equal(st_status_message(s), "model.n_heads: 'x' is not an int (expected int in [1, 1024]) (test)");
  st_status_free(s);
  s = st_config_set(c, "nope", "1", "test");
  assert_string_equal(st_status_message(s), "unknown key 'nope' from test (see `strata config --schema`)");
  st_status_free(s);
  st_config_destroy(c);
}

static void test_load_text(void** state) {
  (void)state;
  st_config* c = NULL;
  const char* y = "model: {n_layers: 3}\n";
  char* ov[] = {"seed=5"};
  assert_null(st__cfg_load_text("mem.yml", y, strlen(y), 1, ov, &c));
  assert_int_equal(st_config_int(c, "model.n_layers"), 3);
  assert_string_equal(st_config_source(c, "model.n_layers"), "mem.yml:1");
  assert_string_equal(st_config_source(c, "model.d_model"), "default");
  st_config_destroy(c);
  const char* inc = "base_config: tiny.yml\n";
  st_status s = st__cfg_load_text("mem.yml", inc, strlen(inc), 0, NULL, &c);
  assert_string_equal(st_status_message(s), "mem.yml:1: base_config is not supported here");
  assert_null(c);
  st_status_free(s);
}

/* Getter misuse is a programmer error: abort, with the key named. */
static void expect_abort(void (*fn)(const st_config*), const st_config* c) {
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!freopen("/dev/null", "w", stderr)) _exit(3);
    fn(c);
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGABRT);
}
static void get_unknown(const st_config* c) { (void)st_config_int(c, "train.setps"); }
static void get_wrong_type(const st_config* c) { (void)st_config_int(c, "train.lr"); }
static void get_bad_index(const st_config* c) { (void)st_config_list_item(c, "runtime.xla_options", 0); }

static void test_getters_abort(void** state) {
  (void)state;
  st_config* c = load_ok(NULL, 0, NULL);
  expect_abort(get_unknown, c);
  expect_abort(get_wrong_type, c);
  expect_abort(get_bad_index, c);
  st_config_destroy(c);
}

static void test_format_helpers(void** state) {
  (void)state;
  char b[40];
  st__cfg_fmt_float(10000, b);
  assert_string_equal(b, "10000.0");
  st__cfg_fmt_float(0.003, b);
  assert_string_equal(b, "0.003");
  st__cfg_fmt_float(1e-8, b);
  assert_string_equal(b, "1e-8");
  st__cfg_fmt_float(1e20, b);
  assert_string_equal(b, "1e20");
  st__cfg_fmt_float(0.1 + 0.2, b);
  assert_true(strtod(b, NULL) == 0.1 + 0.2);
  st__cfg_fmt_bound(1e9, b);
  assert_string_equal(b, "1e9");
  st__cfg_fmt_bound(10, b);
  assert_string_equal(b, "10");
  assert_int_equal(st__cfg_edit_distance("setps", 5, "steps", 5), 1);
  assert_int_equal(st__cfg_edit_distance("", 0, "abc", 3), 3);
  assert_true(st_utf8_valid("h\xc3\xa9", 3));
  assert_false(st_utf8_valid("\xc3", 1));
  assert_false(st_utf8_valid("\xed\xa0\x80", 3)); /* surrogate */
  assert_false(st_utf8_valid("\xc0\x80", 2));     /* overlong */
}

/* ---- train.lr_schedule (src/plan/lr_schedule.c) ------------------------- */

/* The schedule before train.lr_schedule existed, as it was written: the
 * default must stay it bit for bit (docs/model.md). */
static double old_cosine(const st_plan_options* o, int64_t t) {
  if (o->warmup_steps > 0 && t <= o->warmup_steps) return o->lr * (double)t / (double)o->warmup_steps;
  int64_t span = o->steps - o->warmup_steps;
  double p = (double)(t - o->warmup_steps) / (double)(span > 1 ? span : 1);
  if (p > 1) p = 1;
  double min_lr = o->lr * o->min_lr_ratio;
  return min_lr + (o->lr - min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}

static st_plan_options schedule_options(const char* schedule, const char* steps, const char* warmup, const char* fraction) {
  char a[64], b[64], c2[64], d[64];
  snprintf(a, sizeof(a), "train.lr_schedule=%s", schedule);
  snprintf(b, sizeof(b), "train.steps=%s", steps);
  snprintf(c2, sizeof(c2), "train.warmup_steps=%s", warmup);
  snprintf(d, sizeof(d), "train.decay_fraction=%s", fraction);
  char* ov[] = {a, b, c2, d, "train.lr=0.003", "train.min_lr_ratio=0.1"};
  st_config* c = load_ok("configs/test.yml", 6, ov);
  st_plan_options o;
  st_status s = st_plan_options_from_config(c, &o);
  if (s) fail_msg("options: %s", st_status_message(s));
  st_config_destroy(c);
  return o;
}


/* train.optimizer and its overrides: the rule's refusals (exit 2, naming
 * the key and the value), the model JSON (the optimizer only when not adamw
 * everywhere, so today's bundle keys hold), the description (always), and
 * the identity check refusing a resume with another assignment. */
static st_plan_options optimizer_options(int n, char** ov) {
  st_config* c = load_ok("configs/test.yml", n, ov);
  st_plan_options o;
  st_status s = st_plan_options_from_config(c, &o);
  if (s) fail_msg("options: %s", st_status_message(s));
  st_config_destroy(c);
  return o;
}

static void test_optimizers(void** state) {
  (void)state;
  override_fails("train.optimizer_groups=[embed]",
                 "train.optimizer_groups (command line): entry 1 'embed' is not SELECTOR=OPTIMIZER (e.g. matrices=muon)");
  override_fails("train.optimizer_groups=[matrices=muon, =sgd]",
                 "train.optimizer_groups (command line): entry 2 '=sgd' is not SELECTOR=OPTIMIZER (e.g. matrices=muon)");
  override_fails("train.optimizer_groups=[Embed=sgd]",
                 "train.optimizer_groups (command line): entry 1 'Embed=sgd': unknown selector 'Embed'; one of embed, "
                 "head, vectors, matrices or a block group's name (lowercase letters, digits and '_', e.g. block)");
  override_fails("train.optimizer_groups=[head=adam]",
                 "train.optimizer_groups (command line): entry 1 'head=adam': unknown optimizer 'adam'; one of adamw, "
                 "sgd, lion, adafactor, muon");
  override_fails("train.optimizer_groups=[vectors=muon]",
                 "train.optimizer_groups (command line): entry 1 'vectors=muon': muon updates hidden matrices only "
                 "(rank 2, outside the embedding and the head), and vectors has none; give vectors another optimizer, "
                 "and muon to matrices or a block group");
  override_fails("train.optimizer=adam",
                 "train.optimizer: 'adam' is not an allowed value (expected one of adamw, sgd, lion, adafactor, muon) (command line)");
  /* On one process's devices they gather (an SPMD update); fsdp across processes is refused. */
  char* fsdp_ok[] = {"train.optimizer=adafactor", "parallel.fsdp=2"};
  st_config_destroy(load_ok("configs/test.yml", 2, fsdp_ok));
  char* tp_ok[] = {"train.optimizer_groups=[embed=sgd, matrices=muon]", "parallel.tensor=2"};
  st_config_destroy(load_ok("configs/test.yml", 2, tp_ok));
  char* fsdp[] = {"train.optimizer=adafactor", "parallel.fsdp=2", "parallel.processes=2"};
  load_fails("configs/test.yml", 3, fsdp,
             "train.optimizer (command line) uses adafactor with parallel.fsdp=2 (command line) across "
             "parallel.processes=2 (command line): adafactor's update needs each parameter whole, gathered across "
             "processes, which is not built; use adamw, sgd or lion there, or put parallel.data across the processes "
             "(fsdp inside each)");
  char* tp[] = {"train.optimizer_groups=[embed=sgd, matrices=muon]", "parallel.fsdp=4", "parallel.processes=2"};
  load_fails("configs/test.yml", 3, tp,
             "train.optimizer_groups (command line) uses muon with parallel.fsdp=4 (command line) across "
             "parallel.processes=2 (command line): muon's update needs each parameter whole, gathered across "
             "processes, which is not built; use adamw, sgd or lion there, or put parallel.data across the processes "
             "(fsdp inside each)");
  char* lion_fsdp[] = {"train.optimizer=lion", "parallel.fsdp=2"};
  st_config_destroy(load_ok("configs/test.yml", 2, lion_fsdp));

  /* adamw everywhere (also spelled out): the model JSON as before, the description names it. */
  st_plan_options base = optimizer_options(0, NULL);
  char* same[] = {"train.optimizer_groups=[embed=adamw, block=adamw]", "train.momentum=0.5"};
  st_plan_options spelled = optimizer_options(2, same);
  assert_string_equal(base.model_json, spelled.model_json);
  assert_null(strstr(base.model_json, "optimizer"));
  assert_non_null(strstr(base.model_desc,
                         "\"optimizer\": {\"default\": \"adamw\", \"momentum\": 0.9, \"nesterov\": false, \"groups\": []}"));
  char* mixed[] = {"train.optimizer=sgd", "train.optimizer_groups=[matrices=muon, embed=adamw]", "train.nesterov=true"};
  st_plan_options other = optimizer_options(3, mixed);
  const char* want = "\"optimizer\": {\"default\": \"sgd\", \"momentum\": 0.9, \"nesterov\": true, \"groups\": "
                     "[\"matrices=muon\", \"embed=adamw\"]}";
  assert_non_null(strstr(other.model_json, want));
  assert_non_null(strstr(other.model_desc, want));

  /* A resume with another assignment: exit 7 naming both; a checkpoint
   * from before the field meant adamw everywhere. */
  json_t* rec = st_plan_model_desc(&base);
  json_t* giv = st_plan_model_desc(&other);
  json_t* implied = st_plan_model_implied();
  st_ckpt_identity_options io = {.where = "M", .recorded = "in the checkpoint", .implied = implied};
  st_ckpt_identity r = {rec, NULL}, g = {giv, NULL};
  st_status s = st_ckpt_identity_check(&r, &g, &io, NULL, NULL);
  assert_non_null(s);
  assert_int_equal(st_status_exit_code(s), 7);
  if (!strstr(st_status_message(s), "model.optimizer.default \"adamw\" in the checkpoint, \"sgd\" given; "
                                    "model.optimizer.nesterov false in the checkpoint, true given; "
                                    "model.optimizer.groups [] in the checkpoint, [\"matrices=muon\", \"embed=adamw\"] given"))
    fail_msg("unexpected: %s", st_status_message(s));
  st_status_free(s);
  json_object_del(rec, "optimizer"); /* an older checkpoint */
  s = st_ckpt_identity_check(&r, &g, &io, NULL, NULL);
  assert_non_null(s);
  if (!strstr(st_status_message(s), "model.optimizer.default not recorded in the checkpoint (an older format: it meant "
                                    "\"adamw\"), \"sgd\" given"))
    fail_msg("unexpected: %s", st_status_message(s));
  st_status_free(s);
  json_t* giv0 = st_plan_model_desc(&spelled); /* adamw everywhere, momentum 0.5: accepted */
  st_ckpt_identity g0 = {giv0, NULL};
  s = st_ckpt_identity_check(&r, &g0, &io, NULL, NULL);
  if (s) fail_msg("unexpected: %s", st_status_message(s));
  json_decref(giv0);
  json_decref(implied);
  json_decref(rec);
  json_decref(giv);
  st_plan_options_deinit(&base);
  st_plan_options_deinit(&spelled);
  st_plan_options_deinit(&other);
}

static void test_lr_schedules(void** state) {
  (void)state;
  const char* steps[] = {"1", "10", "40"};
  const char* warmups[] = {"0", "5", "10", "50"};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      st_plan_options cos_o = schedule_options("cosine", steps[i], warmups[j], "0.1");
      st_plan_options lin = schedule_options("linear", steps[i], warmups[j], "0.1");
      st_plan_options wsd1 = schedule_options("wsd", steps[i], warmups[j], "1");
      st_plan_options cst = schedule_options("constant", steps[i], warmups[j], "0.1");
      assert_int_equal(cos_o.lr_schedule, ST_PLAN_LR_COSINE);
      for (int64_t t = 1; t <= cos_o.steps + 2; ++t) {
        double want = old_cosine(&cos_o, t), got = st_plan_lr(&cos_o, t);
        assert_memory_equal(&want, &got, sizeof(double));
        want = st_plan_lr(&lin, t), got = st_plan_lr(&wsd1, t);
        assert_memory_equal(&want, &got, sizeof(double)); /* decay_fraction 1 is linear */
        assert_true(t <= cst.warmup_steps || st_plan_lr(&cst, t) == cst.lr);
        if (t <= cos_o.warmup_steps) assert_true(st_plan_lr(&lin, t) == st_plan_lr(&cos_o, t));
      }
      if (cos_o.steps > cos_o.warmup_steps) assert_true(st_plan_lr(&lin, lin.steps) == lin.lr * lin.min_lr_ratio);
      st_plan_options_deinit(&cos_o);
      st_plan_options_deinit(&lin);
      st_plan_options_deinit(&wsd1);
      st_plan_options_deinit(&cst);
    }
  /* wsd: D = round(fraction * (T - W)), to nearest (0.2 * 30 is 6.000000000000001, 0.1 * 35 is 3.5) */
  const char* fr[] = {"0.25", "0.1", "0.2", "0.001"};
  const char* st[] = {"40", "40", "35", "40"};
  const int64_t want_d[] = {9, 4, 6, 1};
  for (int i = 0; i < 4; ++i) {
    st_plan_options o = schedule_options("wsd", st[i], "5", fr[i]);
    int64_t d = st_plan_lr_decay_steps(&o);
    assert_int_equal(d, want_d[i]);
    assert_true(st_plan_lr(&o, o.steps - d) == o.lr);
    assert_true(st_plan_lr(&o, o.steps - d + 1) < o.lr);
    assert_true(st_plan_lr(&o, o.steps) == o.lr * o.min_lr_ratio);
    /* the manifest's record gives back the same schedule */
    st_json* rec = st_plan_lr_schedule_json(&o);
    st_plan_options back;
    st_plan_options other = schedule_options("constant", "7", "1", "0.5");
    assert_true(st_plan_lr_schedule_from_json(rec, &other, &back));
    for (int64_t t = 1; t <= o.steps; ++t) assert_true(st_plan_lr(&back, t) == st_plan_lr(&o, t));
    json_object_del(rec, "schedule");
    assert_false(st_plan_lr_schedule_from_json(rec, &other, &back)); /* written before schedules were recorded */
    json_object_set_new(rec, "schedule", json_string("step"));
    assert_false(st_plan_lr_schedule_from_json(rec, &other, &back));
    json_decref(rec);
    st_plan_options_deinit(&other);
    st_plan_options_deinit(&o);
  }
  override_fails("train.decay_fraction=0",
                 "train.decay_fraction: 0 is out of range (0, 1] (command line)");
  override_fails("train.lr_schedule=step",
                 "train.lr_schedule: 'step' is not an allowed value (expected one of constant, linear, cosine, wsd) (command line)");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schema_table),
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_base_yml_mirrors_schema),
      cmocka_unit_test(test_schema_rows_and_defaults),
      cmocka_unit_test(test_remat_read),
      cmocka_unit_test(test_lr_schedules),
      cmocka_unit_test(test_optimizers),
      cmocka_unit_test(test_presets),
      cmocka_unit_test_setup_teardown(test_composition, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unknown_key, setup, teardown),
      cmocka_unit_test_setup_teardown(test_type_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_range_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_yaml_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_quoted_scalars, setup, teardown),
      cmocka_unit_test_setup_teardown(test_empty_file_warns, setup, teardown),
      cmocka_unit_test(test_run_id),
      cmocka_unit_test_setup_teardown(test_long_values_capped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_file_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cross_field, setup, teardown),
      cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
      cmocka_unit_test(test_json),
      cmocka_unit_test(test_print_sources),
      cmocka_unit_test(test_docs_match_schema),
      cmocka_unit_test(test_hash),
      cmocka_unit_test(test_set),
      cmocka_unit_test(test_load_text),
      cmocka_unit_test(test_getters_abort),
      cmocka_unit_test(test_format_helpers),
  };
  return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
