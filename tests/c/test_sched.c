/* test_sched.c — the scheduler (docs/scheduling.md):
 *   - sched.remat parsing;
 *   - the offload pass on a small synthetic plan: where transfers go for
 *     prefetch depths 0, 1, 2, and the predicted live bytes, exactly;
 *   - the wait pass (eager / deferred) and the dependencies finalize
 *     computes; the plans finalize rejects;
 *   - st_buffer_copy_to_memory on the real CPU plugin;
 *   - pipeline stages on CPU devices: a hand-built 2-stage plan (one and
 *     two devices a stage) run by the executor, SEND ops, per-stage
 *     accounting, busy time and bubble, the trace's tracks; the pipelines
 *     finalize and the executor refuse;
 *   - the memory test: real training runs (exporter, CPU plugin) whose
 *     accounted peak live device bytes equal the plan's prediction at every
 *     op, and fall by exactly the predicted, independently derived amounts
 *     for sched.remat=full (vs none) and optimizer-state offload (vs none);
 *   - sched.remat=auto: the chooser on synthetic peaks, and on the real
 *     bundle's plans with an unlimited budget (none's plan), a budget
 *     between none's and full's peaks (some layers, peak within it), a
 *     tiny one (full, "does not fit") and a fraction with no device memory
 *     reported (config error); in the memory test, an auto run's accounted
 *     peak within its budget. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/config.h"
#include "strata/mesh.h"
#include "strata/runtime.h"
#include "strata/sched.h"
#include "strata/train.h"
#include "test_util.h"

static char* g_tmp;

static int setup(void** state) {
  (void)state;
  return tu_group_tmp_setup(&g_tmp, "sched");
}

static int teardown(void** state) {
  (void)state;
  return tu_group_tmp_teardown(&g_tmp);
}

/*===-------------------------------------------------------------------===*/
/* sched.remat                                                              */
/*===-------------------------------------------------------------------===*/

static void expect_remat(const char* spec, int n, const char* want /* '1' = recompute */) {
  bool r[16];
  memset(r, 0xAA, sizeof(r));
  ASSERT_OK(st_config_remat_parse(spec, n, r));
  char got[17] = {0};
  for (int l = 0; l < n; ++l) got[l] = r[l] ? '1' : '0';
  if (strcmp(got, want)) fail_msg("sched.remat '%s' over %d layers: got %s, want %s", spec, n, got, want);
}

static void expect_remat_error(const char* spec, int n, const char* needle) {
  bool r[16];
  st_status s = st_config_remat_parse(spec, n, r);
  if (!s) fail_msg("sched.remat '%s' was accepted", spec);
  assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
  if (!strstr(st_status_message(s), needle)) fail_msg("'%s': message '%s' lacks '%s'", spec, st_status_message(s), needle);
  st_status_free(s);
}

static void test_remat_parse(void** state) {
  (void)state;
  expect_remat("full", 4, "1111");
  expect_remat(NULL, 3, "000"); /* unset = auto, the default: the plan builder chooses, parse fills nothing */
  expect_remat("auto", 3, "000");
  assert_true(st_config_remat_is_auto(NULL) && st_config_remat_is_auto("") && st_config_remat_is_auto("auto"));
  assert_false(st_config_remat_is_auto("full") || st_config_remat_is_auto("none") || st_config_remat_is_auto("autox"));
  expect_remat("none", 4, "0000");
  expect_remat("every:2", 5, "10101");
  expect_remat("every:1", 3, "111");
  expect_remat("every:3", 7, "1001001");
  expect_remat("0,2", 4, "1010");
  expect_remat(" 3 , 1", 4, "0101");
  expect_remat("2", 3, "001");
  expect_remat_error("every:0", 4, "K must be a whole number >= 1");
  expect_remat_error("every:x", 4, "K must be");
  expect_remat_error("every:2x", 4, "K must be");
  expect_remat_error("some", 4, "expected auto, none, full, every:K");
  expect_remat_error("0,,1", 4, "unexpected");
  expect_remat_error("0;1", 4, "unexpected ';1'");
  expect_remat_error("1,4", 4, "lists layer 4, but the model has 4 layers (0..3)");
  /* Syntax only (the config check before the model is known). */
  ASSERT_OK(st_config_remat_parse("7,9", -1, NULL));
  assert_int_equal(st_sched_offload_parse("both"), ST_OFFLOAD_OPTIMIZER | ST_OFFLOAD_PARAMS);
  assert_int_equal(st_sched_offload_parse("params"), ST_OFFLOAD_PARAMS);
  assert_int_equal(st_sched_offload_parse("none"), 0);
  assert_int_equal(st_sched_offload_parse("gpu"), -1);
}

/* sched.optimizer=per_layer cannot clip: one rule (st_config_check_per_layer_clip),
 * enforced where a config is loaded (naming both keys' sources) and where a
 * plan is built from options that never saw a config. */
static st_bundle* test_bundle(void);

static void test_per_layer_clip_rule(void** state) {
  (void)state;
  char* ov[2] = {"sched.optimizer=per_layer", "train.grad_clip=1"};
  st_config* cfg = NULL;
  st_status s = st_config_load(STRATA_SOURCE_DIR "/configs/test.yml", 2, ov, &cfg);
  assert_non_null(s);
  assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
  const char* msg = st_status_message(s);
  if (!strstr(msg, "cannot clip") || !strstr(msg, "train.grad_clip (command line)"))
    fail_msg("config error '%s' lacks the rule or the sources", msg);
  st_status_free(s);
  st_config_destroy(cfg);
  st_bundle* b = test_bundle();
  st_plan_options o;
  memset(&o, 0, sizeof(o));
  o.microbatches = 1;
  o.batch_size = 2;
  o.eval_batches = 1;
  o.sched.per_layer_optimizer = true;
  o.grad_clip = 1.0;
  st_plan step, eval;
  s = st_plan_build(b, &o, &step, &eval, NULL);
  assert_non_null(s);
  assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
  assert_non_null(strstr(st_status_message(s), "cannot clip"));
  st_status_free(s);
  o.grad_clip = 0;
  ASSERT_OK(st_plan_build(b, &o, &step, &eval, NULL));
  st_plan_deinit(&step);
  st_plan_deinit(&eval);
  st_bundle_destroy(b);
}

/*===-------------------------------------------------------------------===*/
/* sched.remat=auto                                                         */
/*===-------------------------------------------------------------------===*/

static void test_memory_budget_parse(void** state) {
  (void)state;
  int64_t bytes = -1;
  double fraction = -1;
  ASSERT_OK(st_config_memory_budget_parse("0", &bytes, &fraction));
  assert_true(bytes == 0 && fraction == 0);
  ASSERT_OK(st_config_memory_budget_parse("123456789012", &bytes, &fraction));
  assert_true(bytes == 123456789012LL && fraction == 0);
  ASSERT_OK(st_config_memory_budget_parse("0.9", &bytes, &fraction));
  assert_true(bytes == 0 && fraction == 0.9);
  ASSERT_OK(st_config_memory_budget_parse("1.0", &bytes, &fraction));
  assert_true(fraction == 1.0);
  const char* bad[] = {"", "-1", "abc", "1.5", "0.0", "0.", "1e9", "12x", " 5", ".5", "99999999999999999999"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
    st_status s = st_config_memory_budget_parse(bad[i], &bytes, &fraction);
    if (!s) fail_msg("sched.memory_budget '%s' was accepted", bad[i]);
    assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
    st_status_free(s);
  }
}

/* A stand-in for the plan builder: the step's peak is 1000 B plus 100 B
 * for each layer among 0..L-2 that keeps its residuals, plus 100 B for
 * the top layer whether or not it recomputes (it is recomputed where the
 * peak is) — the shape of the real plans' peaks. Counts its calls. */
typedef struct {
  int L, calls;
  bool fail;
} fake_model;

static st_status fake_peak(void* user, const bool* remat, int64_t* out) {
  fake_model* m = user;
  m->calls++;
  if (m->fail && m->calls == 3) return st_status_make(ST_CODE_RUNTIME, "fake builder failed");
  int64_t p = 1000 + 100;
  for (int l = 0; l < m->L - 1; ++l) p += remat[l] ? 0 : 100;
  *out = p;
  return ST_OK;
}

static void expect_choice(int L, int64_t budget, const char* want_layers, int64_t want_peak, bool want_fits,
                          const char* why) {
  fake_model m = {L, 0, false};
  st_plan_remat_choice c;
  ASSERT_OK(st_plan_remat_auto(L, budget, fake_peak, &m, &c));
  char got[128];
  st_plan_remat_text(c.remat, L, got, sizeof(got));
  if (strcmp(got, want_layers) || c.predicted_peak != want_peak || c.fits != want_fits || !strstr(c.why, why))
    fail_msg("budget %lld over %d layers: chose %s (peak %lld, fits %d: %s); want %s (peak %lld, fits %d, '%s')",
             (long long)budget, L, got, (long long)c.predicted_peak, c.fits, c.why, want_layers, (long long)want_peak,
             want_fits, why);
  assert_true(c.automatic);
  assert_int_equal(c.plans_built, m.calls);
  assert_int_equal(c.none_peak, 1000 + 100 * L);
  int n = 0;
  for (int l = 0; l < L; ++l) n += c.remat[l];
  assert_int_equal(c.recomputed, n);
  st_plan_remat_choice_deinit(&c);
}

static void test_remat_auto_chooser(void** state) {
  (void)state;
  /* 6 layers: none peaks at 1600 B, full (and 0..4) at 1100 B. */
  expect_choice(6, 0, "none", 1600, true, "no budget (sched.memory_budget=0): every layer keeps its residuals");
  expect_choice(6, 1600, "none", 1600, true, "fits without remat: predicted peak 1600 B <= budget 1600 B");
  expect_choice(6, 1599, "0", 1500, true, "recompute 1 of 6 layers (0): predicted peak 1500 B <= budget 1599 B");
  expect_choice(6, 1400, "0,1", 1400, true, "recompute 2 of 6 layers (0,1)");
  expect_choice(6, 1250, "0,1,2,3", 1200, true, "recompute 4 of 6 layers");
  /* Recomputing the top layer does not lower the peak: auto leaves it out. */
  expect_choice(6, 1100, "0,1,2,3,4", 1100, true, "recompute 5 of 6 layers");
  expect_choice(6, 1099, "full", 1100, false,
                "does not fit: even with every layer recomputed the predicted peak is 1100 B > budget 1099 B (without "
                "remat 1600 B); chose full");
  expect_choice(1, 1000, "full", 1100, false, "does not fit");
  /* Every count k from 1 to L-1 over a deeper model: the least that fits,
   * found in 2 + log2(L) plans, not L^2. */
  for (int k = 1; k < 40; ++k) {
    fake_model m = {40, 0, false};
    st_plan_remat_choice c;
    ASSERT_OK(st_plan_remat_auto(40, 1000 + 100 * (40 - k), fake_peak, &m, &c));
    assert_int_equal(c.recomputed, k);
    for (int l = 0; l < 40; ++l) assert_int_equal(c.remat[l], l < k);
    assert_true(c.plans_built <= 2 + 6);
    st_plan_remat_choice_deinit(&c);
  }
  /* The builder's error comes back. */
  fake_model m = {6, 0, true};
  st_plan_remat_choice c;
  st_status s = st_plan_remat_auto(6, 1300, fake_peak, &m, &c);
  assert_non_null(s);
  assert_string_equal(st_status_message(s), "fake builder failed");
  st_status_free(s);
  st_plan_remat_choice_deinit(&c);
}

static int count_ops(const st_plan* p, st_op_kind kind) {
  int n = 0;
  for (int i = 0; i < p->op_count; ++i) n += p->ops[i].kind == kind;
  return n;
}

/* Plans of the same ops, programs and slots. */
static void expect_same_plan(const st_plan* a, const st_plan* b) {
  assert_int_equal(a->op_count, b->op_count);
  assert_int_equal(a->slot_count, b->slot_count);
  for (int i = 0; i < a->op_count; ++i) {
    const st_op *x = &a->ops[i], *y = &b->ops[i];
    assert_int_equal(x->kind, y->kind);
    assert_int_equal(x->layer, y->layer);
    assert_int_equal(x->input_count, y->input_count);
    assert_int_equal(x->output_count, y->output_count);
    if (x->program >= 0 || y->program >= 0) assert_string_equal(a->programs[x->program], b->programs[y->program]);
    for (int k = 0; k < x->input_count; ++k) assert_string_equal(a->slots[x->inputs[k]].name, b->slots[y->inputs[k]].name);
  }
  assert_int_equal(st_plan_predict_live(a, NULL, NULL), st_plan_predict_live(b, NULL, NULL));
}

static void build(const st_bundle* b, st_plan_options* o, const char* remat, const char* budget, st_plan* step,
                  st_plan_remat_choice* c) {
  /* As the typed options read them (st_plan_options_from_config). */
  ASSERT_OK(st_config_remat_read(remat, (int)b->model.n_layers, &o->sched.remat));
  o->sched.memory_budget_text = budget;
  o->sched.memory_budget_bytes = 0;
  o->sched.memory_budget_fraction = 0;
  if (budget) ASSERT_OK(st_config_memory_budget_parse(budget, &o->sched.memory_budget_bytes, &o->sched.memory_budget_fraction));
  st_plan eval;
  ASSERT_OK(st_plan_build(b, o, step, &eval, c));
  st_plan_deinit(&eval);
}

static void test_remat_auto_plans(void** state) {
  (void)state;
  st_bundle* b = test_bundle();
  const int L = (int)b->model.n_layers;
  assert_int_equal(L, 3);
  st_plan_options o;
  memset(&o, 0, sizeof(o));
  o.microbatches = 2;
  o.batch_size = 4;
  o.eval_batches = 1;
  o.grad_clip = 1.0;
  st_plan none, full, one, step;
  st_plan_remat_choice c;
  build(b, &o, "none", NULL, &none, &c);
  assert_false(c.automatic);
  st_plan_remat_choice_deinit(&c);
  build(b, &o, "full", NULL, &full, &c);
  assert_int_equal(c.recomputed, L);
  st_plan_remat_choice_deinit(&c);
  build(b, &o, "0", NULL, &one, &c);
  st_plan_remat_choice_deinit(&c);
  const int64_t none_peak = st_plan_predict_live(&none, NULL, NULL), full_peak = st_plan_predict_live(&full, NULL, NULL);
  printf("# 3 layers, 2 microbatches: peak none %lld B, full %lld B\n", (long long)none_peak, (long long)full_peak);
  assert_true(full_peak < none_peak);

  /* Unlimited (unset, the default) and large budgets: none's plan, no RECOMPUTE. */
  const char* large[] = {NULL, "0", "1000000000"};
  for (int i = 0; i < 3; ++i) {
    build(b, &o, i == 0 ? NULL : "auto", large[i], &step, &c);
    expect_same_plan(&step, &none);
    assert_int_equal(count_ops(&step, ST_OP_RECOMPUTE), 0);
    assert_true(c.automatic && c.fits && c.recomputed == 0 && c.predicted_peak == none_peak);
    char want[256];
    snprintf(want, sizeof(want), "remat=auto:none memory_budget=%s offload=none", i == 2 ? "1000000000" : "0");
    if (strncmp(step.policy, want, strlen(want))) fail_msg("policy '%s', want '%s...'", step.policy, want);
    st_plan_deinit(&step);
    st_plan_remat_choice_deinit(&c);
  }

  /* Between none's and full's peaks: some layers, not all, within the budget. */
  char budget[32];
  snprintf(budget, sizeof(budget), "%lld", (long long)(none_peak - 1));
  build(b, &o, "auto", budget, &step, &c);
  int rec = count_ops(&step, ST_OP_RECOMPUTE);
  assert_true(rec > 0 && rec < L * (int)o.microbatches);
  assert_true(c.fits && c.recomputed > 0 && c.recomputed < L);
  assert_true(st_plan_predict_live(&step, NULL, NULL) <= none_peak - 1);
  assert_int_equal(c.predicted_peak, st_plan_predict_live(&step, NULL, NULL));
  /* One layer is enough here: layer 0, the plan of sched.remat=0. */
  assert_int_equal(c.recomputed, 1);
  assert_true(c.remat[0]);
  expect_same_plan(&step, &one);
  char want[512];
  snprintf(want, sizeof(want), "recompute 1 of 3 layers (0): predicted peak %lld B <= budget %lld B (without remat %lld B, over it)",
           (long long)st_plan_predict_live(&one, NULL, NULL), (long long)(none_peak - 1), (long long)none_peak);
  assert_string_equal(c.why, want);
  assert_non_null(strstr(step.policy, "remat=auto:0 memory_budget="));
  st_plan_deinit(&step);
  st_plan_remat_choice_deinit(&c);
  /* Exactly full's peak: every layer but the top one (it does not lower the peak). */
  snprintf(budget, sizeof(budget), "%lld", (long long)full_peak);
  build(b, &o, "auto", budget, &step, &c);
  assert_true(c.fits && c.recomputed == L - 1 && !c.remat[L - 1]);
  assert_int_equal(st_plan_predict_live(&step, NULL, NULL), full_peak);
  st_plan_deinit(&step);
  st_plan_remat_choice_deinit(&c);

  /* A tiny budget: even full does not fit; full, and the choice says so. */
  build(b, &o, "auto", "1", &step, &c);
  expect_same_plan(&step, &full);
  assert_int_equal(count_ops(&step, ST_OP_RECOMPUTE), L * (int)o.microbatches);
  assert_false(c.fits);
  snprintf(want, sizeof(want),
           "does not fit: even with every layer recomputed the predicted peak is %lld B > budget 1 B (without remat %lld "
           "B); chose full",
           (long long)full_peak, (long long)none_peak);
  assert_string_equal(c.why, want);
  json_t* j = st_plan_remat_choice_json(&c);
  char* text = st_json_dump(j, 0);
  json_decref(j);
  snprintf(want, sizeof(want),
           "{\"mode\": \"auto\", \"recompute\": [0, 1, 2], \"recomputed\": 3, \"layers\": 3, \"predicted_peak_bytes\": "
           "%lld, \"budget_bytes\": 1, \"none_peak_bytes\": %lld, \"fits\": false, \"plans_built\": 2, \"why\": \"%s\"}",
           (long long)full_peak, (long long)none_peak, c.why);
  assert_string_equal(text, want);
  free(text);
  st_plan_deinit(&step);
  st_plan_remat_choice_deinit(&c);

  /* A fraction: of the device memory the plugin reports; a config error
   * naming the key when it reports none (the CPU plugin). */
  o.sched.memory_budget_source = "command line";
  st_plan eval;
  o.sched.remat = (st_config_remat){.kind = ST_CONFIG_REMAT_AUTO, .text = "auto"};
  o.sched.memory_budget_text = "0.5";
  o.sched.memory_budget_bytes = 0;
  o.sched.memory_budget_fraction = 0.5;
  st_status s = st_plan_build(b, &o, &step, &eval, &c);
  assert_non_null(s);
  assert_int_equal(st_status_code(s), ST_CODE_CONFIG);
  assert_string_equal(st_status_message(s),
                      "sched.memory_budget '0.5' (command line) is a fraction of the device's memory, but the PJRT "
                      "plugin does not report its devices' memory (PJRT_Device_MemoryStats gives no bytes_limit); give "
                      "the budget in bytes, e.g. sched.memory_budget=1000000000");
  st_status_free(s);
  st_plan_remat_choice_deinit(&c);
  o.device_memory = 2 * none_peak; /* half of it: none fits exactly */
  build(b, &o, "auto", "0.5", &step, &c);
  assert_true(c.fits && c.recomputed == 0 && c.budget == none_peak && c.budget_fraction == 0.5);
  st_plan_deinit(&step);
  st_plan_remat_choice_deinit(&c);
  o.device_memory = 2 * none_peak - 2; /* now one byte short */
  build(b, &o, "auto", "0.5", &step, &c);
  assert_true(c.fits && c.recomputed == 1 && c.budget == none_peak - 1);
  st_plan_deinit(&step);
  st_plan_remat_choice_deinit(&c);
  /* Only auto reads the budget. */
  o.device_memory = 0;
  build(b, &o, "full", "0.5", &step, &c);
  expect_same_plan(&step, &full);
  st_plan_deinit(&step);
  st_plan_remat_choice_deinit(&c);

  st_plan_deinit(&none);
  st_plan_deinit(&full);
  st_plan_deinit(&one);
  st_bundle_destroy(b);
}

/*===-------------------------------------------------------------------===*/
/* Passes on a synthetic plan                                               */
/*===-------------------------------------------------------------------===*/

/* Three layers: P<l> (100 bytes, persistent), M<l> (200 bytes, persistent),
 * activations x0..x3 (40 bytes each):
 *   H2D x0; f(P0,x0)->x1; f(P1,x1)->x2; f(P2,x2)->x3; FREE x0..x2; READ x3;
 *   FREE x3; upd(P<l>,M<l>)->P<l>,M<l> for l = 0, 1, 2. */
static void synthetic(st_plan* p) {
  st_plan_init(p);
  st_tensor_type tp = {ST_DTYPE_F32, 1, {25}}, tm = {ST_DTYPE_F32, 1, {50}}, tx = {ST_DTYPE_F32, 1, {10}};
  int P[3], M[3], x[4];
  char name[16];
  for (int l = 0; l < 3; ++l) {
    snprintf(name, sizeof(name), "P%d", l);
    P[l] = st_plan_slot(p, name, ST_SLOT_PARAM, &tp, true);
  }
  for (int l = 0; l < 3; ++l) {
    snprintf(name, sizeof(name), "M%d", l);
    M[l] = st_plan_slot(p, name, ST_SLOT_OPT, &tm, true);
  }
  for (int l = 0; l < 4; ++l) {
    snprintf(name, sizeof(name), "x%d", l);
    x[l] = st_plan_slot(p, name, ST_SLOT_ACT, &tx, false);
  }
  int f = st_plan_program(p, "f"), upd = st_plan_program(p, "upd");
  st_plan_add(p, ST_OP_H2D, -1, -1, 0, 1, 0, NULL, 1, &x[0]);
  for (int l = 0; l < 3; ++l) {
    int in[2] = {P[l], x[l]};
    st_plan_add(p, ST_OP_LAUNCH, f, l, 0, 0, 2, in, 1, &x[l + 1]);
  }
  st_plan_add(p, ST_OP_FREE, -1, -1, 0, 0, 3, x, 0, NULL);
  st_plan_add(p, ST_OP_READ, -1, -1, 0, 2, 1, &x[3], 0, NULL);
  st_plan_add(p, ST_OP_FREE, -1, -1, 0, 0, 1, &x[3], 0, NULL);
  for (int l = 0; l < 3; ++l) {
    int io[2] = {P[l], M[l]};
    st_plan_add(p, ST_OP_LAUNCH, upd, l, -1, 0, 2, io, 2, io);
  }
}

/* "H2D P0" / "f" / "FREE P0 ..." / "D2H P0" per op, joined by "; ". */
static void describe(const st_plan* p, char* buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
  for (int i = 0; i < p->op_count && n + 64 < cap; ++i) {
    const st_op* op = &p->ops[i];
    const char* sep = i ? "; " : "";
    if (op->kind == ST_OP_LAUNCH)
      n += (size_t)snprintf(buf + n, cap - n, "%s%s%d", sep, p->programs[op->program], op->layer);
    else if (op->kind == ST_OP_WAIT && op->input_count == 0)
      n += (size_t)snprintf(buf + n, cap - n, "%sWAIT*", sep);
    else {
      int slot = op->kind == ST_OP_H2D ? op->outputs[0] : op->input_count ? op->inputs[0] : -1;
      n += (size_t)snprintf(buf + n, cap - n, "%s%s %s", sep, st_op_kind_name(op->kind), slot >= 0 ? p->slots[slot].name : "");
    }
  }
}

static void expect_offload(int depth, const char* want, int64_t want_peak) {
  st_plan base, off;
  synthetic(&base);
  int unit[10];
  for (int s = 0; s < base.slot_count; ++s) unit[s] = -1;
  for (int l = 0; l < 3; ++l) unit[st_plan_slot_find(&base, l == 0 ? "P0" : l == 1 ? "P1" : "P2")] = l;
  ASSERT_OK(st_plan_offload(&base, unit, depth, &off));
  ASSERT_OK(st_plan_finalize(&off));
  char got[4096];
  describe(&off, got, sizeof(got));
  if (strcmp(got, want)) fail_msg("prefetch_depth %d:\n got  %s\n want %s", depth, got, want);
  /* Homes are appended, the device slots keep their numbers and lose persistence. */
  assert_int_equal(off.slot_count, base.slot_count + 3);
  int p0 = st_plan_slot_find(&off, "P0"), h0 = st_plan_slot_find(&off, "host:P0");
  assert_int_equal(p0, 0);
  assert_true(h0 >= base.slot_count);
  assert_true(off.slots[h0].host && off.slots[h0].persistent && !off.slots[p0].persistent);
  assert_int_equal(off.slots[p0].twin, h0);
  assert_int_equal(off.slots[h0].twin, p0);
  assert_int_equal(st_plan_host_bytes(&off), 300);
  int64_t peak = st_plan_predict_live(&off, NULL, NULL);
  if (peak != want_peak) fail_msg("prefetch_depth %d: predicted peak %lld, want %lld", depth, (long long)peak, (long long)want_peak);
  st_plan_deinit(&base);
  st_plan_deinit(&off);
}

static void test_offload_pass(void** state) {
  (void)state;
  st_plan base;
  synthetic(&base);
  ASSERT_OK(st_plan_finalize(&base));
  /* Everything resident: 3*100 + 3*200 persistent, x0..x3 at once after f2. */
  int64_t by_cat[ST_SLOT_CATEGORY_COUNT];
  assert_int_equal(st_plan_predict_live(&base, NULL, by_cat), 900 + 160);
  assert_int_equal(by_cat[ST_SLOT_ACT], 160);
  assert_int_equal(by_cat[ST_SLOT_PARAM], 300);
  st_plan_deinit(&base);

  /* Depth 0: each parameter comes back right before its launch and leaves
   * right after; updated ones are written home first. */
  expect_offload(0,
                 "H2D x0; H2D P0; f0; FREE P0; H2D P1; f1; FREE P1; H2D P2; f2; FREE P2; FREE x0; READ x3; FREE x3; "
                 "H2D P0; upd0; D2H P0; FREE P0; H2D P1; upd1; D2H P1; FREE P1; H2D P2; upd2; D2H P2; FREE P2",
                 600 + 100 + 160);
  /* Depth 1: the next launch's parameter comes back one launch early (P0
   * for upd0 already during f2). */
  expect_offload(1,
                 "H2D x0; H2D P0; H2D P1; f0; FREE P0; H2D P2; f1; FREE P1; H2D P0; f2; FREE P2; FREE x0; READ x3; "
                 "FREE x3; H2D P1; upd0; D2H P0; FREE P0; H2D P2; upd1; D2H P1; FREE P1; upd2; D2H P2; FREE P2",
                 600 + 200 + 160);
  /* Depth 2: each parameter is needed again within the window (its update
   * is 3 launches later), so none leaves between forward and update. */
  expect_offload(2,
                 "H2D x0; H2D P0; H2D P1; H2D P2; f0; f1; f2; FREE x0; READ x3; FREE x3; upd0; D2H P0; FREE P0; upd1; "
                 "D2H P1; FREE P1; upd2; D2H P2; FREE P2",
                 600 + 300 + 160);
}

/* XLA's temporaries (issue 18): a launch holds its program's temporaries
 * on top of the slots live after it; the peak is the most of either. */
static void test_peak_with_temps(void** state) {
  (void)state;
  st_plan p;
  synthetic(&p);
  ASSERT_OK(st_plan_finalize(&p));
  st_plan_temps_peak tp;
  /* No temporaries known: the slots' peak, first reached after f2 (op 3). */
  assert_int_equal(st_plan_predict_with_temps(&p, NULL, &tp), 1060);
  assert_int_equal(tp.op, 3);
  assert_int_equal(tp.temps, 0);
  /* f's 50 B on top of the 1060 B live after f2. */
  int64_t small_upd[2] = {50, 100};
  assert_int_equal(st_plan_predict_with_temps(&p, small_upd, &tp), 1110);
  assert_int_equal(tp.op, 3);
  assert_int_equal(tp.temps, 50);
  assert_int_equal(tp.slots, 1060);
  assert_int_equal(tp.slots_peak, 1060);
  /* An optimizer update with large temporaries moves the peak to where the
   * slots alone are lowest (900 B + 250 B at upd0, op 7). */
  int64_t big_upd[2] = {10, 250};
  st_plan_set_program_temps(&p, big_upd);
  assert_int_equal(st_plan_predict_with_temps(&p, NULL, &tp), 1150);
  assert_int_equal(tp.op, 7);
  assert_int_equal(tp.slots, 900);
  /* A copy keeps them; a program added later has none. */
  st_plan c;
  st_plan_copy(&p, &c);
  assert_int_equal(st_plan_predict_with_temps(&c, NULL, NULL), 1150);
  int g = st_plan_program(&c, "g");
  assert_int_equal(c.program_temps[g], 0);
  st_plan_deinit(&c);
  st_plan_set_program_temps(&p, NULL);
  assert_int_equal(st_plan_predict_with_temps(&p, NULL, NULL), 1060);
  st_plan_deinit(&p);
}

static void test_wait_pass_and_deps(void** state) {
  (void)state;
  st_plan base, deferred, eager;
  synthetic(&base);
  st_plan_add_waits(&base, false, &deferred);
  st_plan_add_waits(&base, true, &eager);
  ASSERT_OK(st_plan_finalize(&deferred));
  ASSERT_OK(st_plan_finalize(&eager));
  char got[4096];
  describe(&deferred, got, sizeof(got));
  assert_string_equal(got, "H2D x0; f0; f1; f2; FREE x0; WAIT x3; READ x3; FREE x3; upd0; upd1; upd2; WAIT*");
  describe(&eager, got, sizeof(got));
  assert_string_equal(got,
                      "H2D x0; WAIT x0; f0; WAIT x1; f1; WAIT x2; f2; WAIT x3; FREE x0; WAIT x3; READ x3; FREE x3; upd0; "
                      "WAIT P0; upd1; WAIT P1; upd2; WAIT P2; WAIT*");
  /* Deps: each launch needs the one before; the read's wait needs f2; the
   * barrier every device op; persistent inputs written in an earlier step
   * add none. */
  const st_op* ops = deferred.ops;
  assert_int_equal(ops[1].dep_count, 1);
  assert_int_equal(ops[1].deps[0], 0);
  assert_int_equal(ops[3].dep_count, 1);
  assert_int_equal(ops[3].deps[0], 2);
  assert_int_equal(ops[5].kind, ST_OP_WAIT);
  assert_int_equal(ops[5].dep_count, 1);
  assert_int_equal(ops[5].deps[0], 3);
  assert_int_equal(ops[8].dep_count, 0);
  const st_op* barrier = &ops[deferred.op_count - 1];
  assert_int_equal(barrier->dep_count, 7); /* H2D, f0..f2, upd0..upd2 */
  st_plan_deinit(&base);
  st_plan_deinit(&deferred);
  st_plan_deinit(&eager);
}

static void expect_rejected(st_plan* p, const char* needle) {
  st_status s = st_plan_finalize(p);
  if (!s) fail_msg("plan was accepted; expected an error with '%s'", needle);
  if (!strstr(st_status_message(s), needle)) fail_msg("message '%s' lacks '%s'", st_status_message(s), needle);
  st_status_free(s);
  st_plan_deinit(p);
}

static void test_finalize_rejects(void** state) {
  (void)state;
  st_tensor_type t = {ST_DTYPE_F32, 1, {4}};
  st_plan p;
  /* Reading what nothing filled. */
  st_plan_init(&p);
  int a = st_plan_slot(&p, "a", ST_SLOT_ACT, &t, false), b = st_plan_slot(&p, "b", ST_SLOT_ACT, &t, false);
  st_plan_add(&p, ST_OP_LAUNCH, st_plan_program(&p, "f"), 0, 0, 0, 1, &a, 1, &b);
  expect_rejected(&p, "reads the empty slot 'a'");
  /* Leaving a step-local slot filled (the next step would start different). */
  st_plan_init(&p);
  a = st_plan_slot(&p, "a", ST_SLOT_ACT, &t, false);
  st_plan_add(&p, ST_OP_H2D, -1, -1, 0, 1, 0, NULL, 1, &a);
  expect_rejected(&p, "leaves slot 'a' filled");
  /* Freeing persistent state. */
  st_plan_init(&p);
  a = st_plan_slot(&p, "w", ST_SLOT_PARAM, &t, true);
  st_plan_add(&p, ST_OP_FREE, -1, -1, 0, 0, 1, &a, 0, NULL);
  expect_rejected(&p, "frees the persistent slot 'w'");
  /* Handing a program a host-memory buffer. */
  st_plan_init(&p);
  a = st_plan_slot(&p, "w", ST_SLOT_PARAM, &t, false);
  int h = st_plan_slot(&p, "host:w", ST_SLOT_PARAM, &t, true);
  p.slots[h].host = true;
  p.slots[h].twin = a;
  p.slots[a].twin = h;
  b = st_plan_slot(&p, "y", ST_SLOT_ACT, &t, false);
  st_plan_add(&p, ST_OP_LAUNCH, st_plan_program(&p, "f"), 0, 0, 0, 1, &h, 1, &b);
  expect_rejected(&p, "passes a program the host-memory slot 'host:w'");
  /* The offload pass refuses units touched by anything but launches. */
  st_plan_init(&p);
  a = st_plan_slot(&p, "w", ST_SLOT_PARAM, &t, true);
  st_plan_add(&p, ST_OP_READ, -1, -1, 0, 1, 1, &a, 0, NULL);
  int unit[1] = {0};
  st_plan off;
  st_status s = st_plan_offload(&p, unit, 1, &off);
  assert_non_null(s);
  assert_non_null(strstr(st_status_message(s), "touches offloaded slot 'w'"));
  st_status_free(s);
  st_plan_deinit(&p);
}

/* XPROC ops across processes (docs/multiprocess.md, "fsdp across
 * processes"): an all-reduce in place, an all-gather from a slot cut
 * across the plan's processes into its whole, a reduce-scatter back. */
static void xproc_plan(st_plan* p, int* cut, int* whole, int rows_cut) {
  st_tensor_type w = {ST_DTYPE_F32, 2, {5, 3}}, c = {ST_DTYPE_F32, 2, {rows_cut, 3}};
  st_plan_init(p);
  p->procs = 2;
  *cut = st_plan_slot(p, "w", ST_SLOT_PARAM, &c, true);
  p->slots[*cut].xblocks = 2;
  p->slots[*cut].xwhole = w;
  *whole = st_plan_slot(p, "full:w", ST_SLOT_GATHERED, &w, false);
}

static void test_xproc_out_of_place(void** state) {
  (void)state;
  st_plan p;
  int cut, whole;
  xproc_plan(&p, &cut, &whole, 3); /* ceil(5 / 2) rows */
  st_plan_add(&p, ST_OP_XPROC, -1, 0, 0, ST_COLL_ALL_GATHER, 1, &cut, 1, &whole);
  st_plan_add(&p, ST_OP_XPROC, -1, 0, 0, ST_COLL_REDUCE_SCATTER, 1, &whole, 1, &cut);
  st_plan_add(&p, ST_OP_FREE, -1, 0, 0, 0, 1, &whole, 0, NULL);
  ASSERT_OK(st_plan_finalize(&p));
  assert_int_equal(p.ops[1].dep_count, 1); /* the reduce-scatter reads the gather's output */
  assert_int_equal(p.ops[1].deps[0], 0);
  st_plan_deinit(&p);
  xproc_plan(&p, &cut, &whole, 2); /* a block of the wrong size */
  st_plan_add(&p, ST_OP_XPROC, -1, 0, 0, ST_COLL_ALL_GATHER, 1, &cut, 1, &whole);
  st_plan_add(&p, ST_OP_FREE, -1, 0, 0, 0, 1, &whole, 0, NULL);
  expect_rejected(&p, "must gather a slot cut across the processes into its whole; input slot 'w'");
  xproc_plan(&p, &cut, &whole, 3); /* scattered into the whole */
  st_plan_add(&p, ST_OP_XPROC, -1, 0, 0, ST_COLL_REDUCE_SCATTER, 1, &cut, 1, &whole);
  st_plan_add(&p, ST_OP_FREE, -1, 0, 0, 0, 1, &whole, 0, NULL);
  expect_rejected(&p, "must reduce-scatter a whole slot into its cut across the processes; input slot 'w'");
  xproc_plan(&p, &cut, &whole, 3); /* an all-reduce out of place */
  st_plan_add(&p, ST_OP_XPROC, -1, 0, 0, ST_COLL_ALL_REDUCE, 1, &cut, 1, &whole);
  st_plan_add(&p, ST_OP_FREE, -1, 0, 0, 0, 1, &whole, 0, NULL);
  expect_rejected(&p, "is not in place on slot 'w'");
}

/*===-------------------------------------------------------------------===*/
/* Memory spaces on the CPU plugin                                          */
/*===-------------------------------------------------------------------===*/

static void test_copy_to_memory(void** state) {
  (void)state;
  st_runtime_options ro;
  st_runtime_options_init(&ro);
  ro.cpu_devices = 1;
  st_runtime* rt = NULL;
  ASSERT_OK(st_runtime_create(&ro, &rt));
  assert_true(st_runtime_can_copy_to_memory(rt, 0, "pinned_host"));
  assert_false(st_runtime_can_copy_to_memory(rt, 0, "hbm_of_dreams"));
  /* The CPU plugin reports no device memory (PJRT_Device_MemoryStats), so
   * a fractional sched.memory_budget is a config error there
   * (docs/scheduling.md); a device that does not exist has none either. */
  assert_int_equal(st_runtime_device_memory(rt, 0), 0);
  assert_int_equal(st_runtime_device_memory(rt, 7), 0);
  assert_int_equal(st_runtime_device_memory(NULL, 0), 0);
  st_tensor_type t = {ST_DTYPE_F32, 2, {3, 5}};
  float v[15], back[15];
  for (int i = 0; i < 15; ++i) v[i] = (float)i * 0.5f - 3.0f;
  st_buffer *d = NULL, *h = NULL, *d2 = NULL;
  ASSERT_OK(st_buffer_from_host(rt, 0, &t, v, &d));
  assert_string_equal(st_buffer_memory_kind(d), "device");
  st_runtime_stats before, after;
  st_runtime_get_stats(rt, &before);
  ASSERT_OK(st_buffer_copy_to_memory(d, "pinned_host", &h));
  assert_string_equal(st_buffer_memory_kind(h), "pinned_host");
  ASSERT_OK(st_buffer_copy_to_memory(h, "device", &d2));
  assert_string_equal(st_buffer_memory_kind(d2), "device");
  st_runtime_get_stats(rt, &after);
  assert_int_equal(after.d2h_bytes - before.d2h_bytes, 60);
  assert_int_equal(after.h2d_bytes - before.h2d_bytes, 60);
  memset(back, 0, sizeof(back));
  ASSERT_OK(st_buffer_to_host(h, back, sizeof(back)));
  assert_memory_equal(back, v, sizeof(v));
  memset(back, 0, sizeof(back));
  ASSERT_OK(st_buffer_to_host(d2, back, sizeof(back)));
  assert_memory_equal(back, v, sizeof(v));
  st_buffer* bad = NULL;
  st_status s = st_buffer_copy_to_memory(d, "hbm_of_dreams", &bad);
  assert_non_null(s);
  assert_null(bad);
  assert_non_null(strstr(st_status_message(s), "no such memory space"));
  st_status_free(s);
  st_buffer_destroy(d);
  st_buffer_destroy(h);
  st_buffer_destroy(d2);
  st_runtime_destroy(rt);
}

/*===-------------------------------------------------------------------===*/
/* Pipeline stages on the CPU plugin                                        */
/*===-------------------------------------------------------------------===*/

/* Every slot of the pipeline tests: a 256 x 256 matrix, so that each
 * launch (a matmul, milliseconds) ends well after the copy that feeds it
 * and a stage's busy time is never rounded away. */
enum { PIPE_N = 256, PIPE_BYTES = PIPE_N * PIPE_N * 4 };
static const st_tensor_type kPipeT = {ST_DTYPE_F32, 2, {PIPE_N, PIPE_N}};

/* One device's matmul, compiled once and shared by both stages. */
static const char kPipeMatmul[] =
    "module @mm {\n"
    "  func.func public @main(%a: tensor<256x256xf32>, %b: tensor<256x256xf32>) -> tensor<256x256xf32> {\n"
    "    %0 = \"stablehlo.dot_general\"(%a, %b) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], "
    "rhs_contracting_dimensions = [0]>} : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>\n"
    "    return %0 : tensor<256x256xf32>\n"
    "  }\n"
    "}\n";

/* The all-reduce over data of one f32[256,256] per device, on 2 devices
 * (the exporter's form, strata_jax.parallel). */
static const char kPipeAllReduce[] =
    "module @ar attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {\n"
    "  sdy.mesh @mesh = <[\"data\"=2, \"fsdp\"=1, \"tensor\"=1]>\n"
    "  func.func public @main(%arg0: tensor<512x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"data\", \"fsdp\", \"tensor\"}, {}]>})"
    " -> (tensor<512x256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"data\", \"fsdp\", \"tensor\"}, {}]>}) {\n"
    "    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{\"data\", \"fsdp\", \"tensor\"}, {}]>]"
    " out_shardings=[<@mesh, [{\"data\", \"fsdp\", \"tensor\"}, {}]>] manual_axes={\"data\", \"fsdp\", \"tensor\"}"
    " (%arg1: tensor<256x256xf32>) {\n"
    "      %1 = \"stablehlo.all_reduce\"(%arg1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,"
    " replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh, axes = [#stablehlo.axis_ref<name = \"data\">]>,"
    " use_global_device_ids}> ({\n"
    "      ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n"
    "        %2 = stablehlo.add %a, %b : tensor<f32>\n"
    "        stablehlo.return %2 : tensor<f32>\n"
    "      }) : (tensor<256x256xf32>) -> tensor<256x256xf32>\n"
    "      sdy.return %1 : tensor<256x256xf32>\n"
    "    } : (tensor<512x256xf32>) -> tensor<512x256xf32>\n"
    "    return %0 : tensor<512x256xf32>\n"
    "  }\n"
    "}\n";

static st_program* pipe_all_reduce(st_runtime* rt, int first_device) {
  static const char* const axes[3] = {"data", "fsdp", "tensor"};
  const int sizes[3] = {2, 1, 1}, devices[2] = {first_device, first_device + 1};
  st_mesh m;
  ASSERT_OK(st_mesh_make(3, axes, sizes, devices, &m));
  st_program_signature sig = {.input_count = 1, .inputs = &kPipeT, .output_count = 1, .outputs = &kPipeT};
  st_program* p = NULL;
  ASSERT_OK(st_program_compile_spmd(rt, "ar", kPipeAllReduce, sizeof(kPipeAllReduce) - 1, &m, &sig, &p));
  return p;
}

/* x (stage 0, from the hook) @ w0 -> a0; SEND a0 to a1 on stage 1, a0
 * freed at once (while the copy may still run, with deferred waits); a1 @
 * w1 -> z; with |collective| z all-reduced over the stage's devices; READ
 * z. |ndev| devices a stage; |eager| waits (sched.wait) or deferred. */
static void pipe_plan(st_plan* out, int ndev, bool collective, bool eager) {
  st_plan p;
  st_plan_init(&p);
  p.stages = 2;
  p.devices = ndev;
  p.mesh[0] = ndev;
  int w0 = st_plan_slot(&p, "w0", ST_SLOT_PARAM, &kPipeT, true);
  int w1 = st_plan_slot(&p, "w1", ST_SLOT_PARAM, &kPipeT, true);
  int x = st_plan_slot(&p, "x", ST_SLOT_XFER, &kPipeT, false);
  int a0 = st_plan_slot(&p, "a0", ST_SLOT_ACT, &kPipeT, false);
  int a1 = st_plan_slot(&p, "a1", ST_SLOT_ACT, &kPipeT, false);
  int z = st_plan_slot(&p, "z", ST_SLOT_ACT, &kPipeT, false);
  p.slots[w1].stage = p.slots[a1].stage = p.slots[z].stage = 1;
  int f0 = st_plan_program_at(&p, "mm", 0), f1 = st_plan_program_at(&p, "mm", 1);
  st_plan_add(&p, ST_OP_H2D, -1, -1, 0, 1, 0, NULL, 1, &x);
  int in0[2] = {x, w0}, in1[2] = {a1, w1};
  st_plan_add(&p, ST_OP_LAUNCH, f0, 0, 0, 0, 2, in0, 1, &a0);
  st_plan_add(&p, ST_OP_FREE, -1, -1, 0, 0, 1, &x, 0, NULL);
  st_plan_add(&p, ST_OP_SEND, -1, 0, 0, 0, 1, &a0, 1, &a1);
  st_plan_add(&p, ST_OP_FREE, -1, -1, 0, 0, 1, &a0, 0, NULL);
  st_plan_add(&p, ST_OP_LAUNCH, f1, 1, 0, 0, 2, in1, 1, &z);
  st_plan_add(&p, ST_OP_FREE, -1, -1, 0, 0, 1, &a1, 0, NULL);
  if (collective) st_plan_add(&p, ST_OP_COLLECTIVE, st_plan_program_at(&p, "ar", 1), 1, 0, ST_COLL_ALL_REDUCE, 1, &z, 1, &z);
  st_plan_add(&p, ST_OP_READ, -1, -1, 0, 2, 1, &z, 0, NULL);
  st_plan_add(&p, ST_OP_FREE, -1, -1, 0, 0, 1, &z, 0, NULL);
  st_plan_add_waits(&p, eager, out);
  st_plan_deinit(&p);
  ASSERT_OK(st_plan_finalize(out));
}

typedef struct {
  st_runtime* rt;
  int h2d_device[4], read_device[4];
  float* got[4]; /* PIPE_N * PIPE_N each */
} pipe_ctx;

/* x of device index |index|: small integers, so every product below is exact in f32. */
static float pipe_x(int index, int e) { return (float)((e % 7) + 3 * index); }

static st_status pipe_h2d(void* user, const st_op* op, int index, int device, st_buffer** out) {
  (void)op;
  pipe_ctx* c = user;
  c->h2d_device[index] = device;
  float* v = malloc(PIPE_BYTES);
  for (int e = 0; e < PIPE_N * PIPE_N; ++e) v[e] = pipe_x(index, e);
  st_status s = st_buffer_from_host(c->rt, device, &kPipeT, v, out);
  free(v);
  return s;
}

static st_status pipe_read(void* user, const st_op* op, int index, st_buffer* b) {
  (void)op;
  pipe_ctx* c = user;
  c->read_device[index] = st_buffer_device(b);
  return st_buffer_to_host(b, c->got[index], PIPE_BYTES);
}

static st_status pipe_host(void* user, const st_op* op) {
  (void)user;
  (void)op;
  return ST_OK;
}

/* w0 = 2 I on stage 0, w1 = 3 I on stage 1 (so z = 6 x), both made on
 * device 0 (st_executor_put moves w1 to its stage). */
static void pipe_params(st_executor* ex, st_runtime* rt, const st_plan* p) {
  float* w0 = calloc(PIPE_N * PIPE_N, sizeof(float));
  float* w1 = calloc(PIPE_N * PIPE_N, sizeof(float));
  for (int i = 0; i < PIPE_N; ++i) {
    w0[i * PIPE_N + i] = 2;
    w1[i * PIPE_N + i] = 3;
  }
  st_buffer *b0 = NULL, *b1 = NULL;
  ASSERT_OK(st_buffer_from_host(rt, 0, &kPipeT, w0, &b0));
  ASSERT_OK(st_buffer_from_host(rt, 0, &kPipeT, w1, &b1));
  free(w0);
  free(w1);
  ASSERT_OK(st_executor_put(ex, st_plan_slot_find(p, "w0"), b0));
  ASSERT_OK(st_executor_put(ex, st_plan_slot_find(p, "w1"), b1));
}

/* The per-stage statistics of a pipelined run. Each stage is busy some
 * time; with deferred waits only stage 0's is sure to be measured above 0
 * on the CPU plugin: a copy's completion callback can come after the
 * launch that consumed it (it ran first, on the thread that finished the
 * copy), and the executor then draws that launch from the copy's reported
 * completion to its own, which may be nothing. |eager|: both stages. */
static void expect_pipe_stats(const st_executor* ex, const st_plan* p, int64_t sends, bool eager) {
  const st_executor_stats* s = st_executor_stats_get(ex);
  assert_int_equal(s->stages, 2);
  assert_int_equal(s->sends, sends);
  assert_int_equal(s->send_bytes, (int64_t)PIPE_BYTES * sends);
  assert_int_equal(s->live_mismatch_op, -1);
  assert_int_equal(s->peak_live_bytes, s->predicted_peak_bytes);
  int64_t want[2 * ST_SLOT_CATEGORY_COUNT];
  assert_int_equal(st_plan_predict_stage_peaks(p, want), 2);
  for (int st = 0; st < 2; ++st)
    for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k)
      if (s->stage_peak_by_category[st][k] != want[st * ST_SLOT_CATEGORY_COUNT + k])
        fail_msg("stage %d %s: accounted peak %lld, predicted %lld", st, st_slot_category_name((st_slot_category)k),
                 (long long)s->stage_peak_by_category[st][k], (long long)want[st * ST_SLOT_CATEGORY_COUNT + k]);
  /* stage 0: w0, x, a0 at once; stage 1: w1, a1 and z */
  assert_int_equal(want[ST_SLOT_ACT], PIPE_BYTES);
  assert_int_equal(want[ST_SLOT_XFER], PIPE_BYTES);
  assert_int_equal(want[ST_SLOT_CATEGORY_COUNT + ST_SLOT_ACT], 2 * PIPE_BYTES);
  assert_int_equal(want[ST_SLOT_CATEGORY_COUNT + ST_SLOT_PARAM], PIPE_BYTES);
  assert_true(s->stage_busy_s[0] > 0 && s->stage_busy_s[1] >= 0);
  if (eager && !(s->stage_busy_s[1] > 0)) fail_msg("stage 1 busy %g s with eager waits", s->stage_busy_s[1]);
  assert_true(s->span_s >= s->stage_busy_s[0] && s->span_s >= s->stage_busy_s[1]);
  assert_true(s->bubble_fraction >= 0 && s->bubble_fraction < 1);
  assert_true(s->send_s >= 0 && s->send_hidden_s <= s->send_s + 1e-9);
  assert_int_equal(s->launches, 2);
}

/* Two stages of one device each: stage s on runtime device base + s. */
static void test_pipeline_two_stages(void** state) {
  (void)state;
  st_runtime* rt = NULL;
  assert_int_equal(tu_runtime_create(4, &rt), 0);
  st_program* mm = NULL;
  ASSERT_OK(st_program_compile(rt, "mm", kPipeMatmul, sizeof(kPipeMatmul) - 1, NULL, &mm));
  st_plan p, eager;
  pipe_plan(&p, 1, false, false);
  pipe_plan(&eager, 1, false, true);
  st_program* progs[2] = {mm, mm};
  /* Deferred waits from device 0, eager ones from device 2. */
  for (int base = 0; base <= 2; base += 2) {
    const st_plan* plan = base ? &eager : &p;
    st_executor* ex = NULL;
    ASSERT_OK(st_executor_create(plan, rt, progs, base, &ex));
    pipe_params(ex, rt, plan);
    assert_int_equal(st_buffer_device(st_executor_get(ex, st_plan_slot_find(plan, "w1"))), base + 1);
    pipe_ctx c = {.rt = rt, .got = {calloc(PIPE_N * PIPE_N, sizeof(float))}};
    st_executor_hooks h = {.user = &c, .h2d = pipe_h2d, .read = pipe_read, .host = pipe_host};
    for (int step = 0; step < 2; ++step) {
      memset(c.got[0], 0, PIPE_BYTES);
      ASSERT_OK(st_executor_run(ex, &h));
      assert_int_equal(c.h2d_device[0], base);
      assert_int_equal(c.read_device[0], base + 1);
      for (int e = 0; e < PIPE_N * PIPE_N; ++e)
        if (c.got[0][e] != 6 * pipe_x(0, e)) fail_msg("z[%d] = %g, want %g", e, c.got[0][e], 6 * pipe_x(0, e));
      expect_pipe_stats(ex, plan, 1, base != 0);
    }
    free(c.got[0]);
    const st_executor_stats* s = st_executor_stats_get(ex);
    printf("# pipeline from device %d (%s waits): busy %.3f + %.3f ms in a span of %.3f ms, bubble %.2f; "
           "send %.3f ms (%.3f hidden)\n",
           base, base ? "eager" : "deferred", s->stage_busy_s[0] * 1e3, s->stage_busy_s[1] * 1e3, s->span_s * 1e3,
           s->bubble_fraction, s->send_s * 1e3, s->send_hidden_s * 1e3);
    char path[1200];
    snprintf(path, sizeof(path), "%s/pipe_trace_%d.json", g_tmp, base);
    ASSERT_OK(st_executor_write_trace(ex, path, 1, NULL));
    size_t n = 0;
    char* raw = tu_read_file(path, &n);
    char* text = calloc(n + 1, 1);
    memcpy(text, raw, n);
    assert_non_null(strstr(text, "stage 0 compute"));
    assert_non_null(strstr(text, "stage 1 compute"));
    assert_non_null(strstr(text, "pipeline sends"));
    free(raw);
    free(text);
    st_executor_destroy(ex);
  }
  /* Stages need devices: 2 from device 3 is one more than 4. */
  st_executor* ex = NULL;
  ASSERT_ERROR(st_executor_create(&p, rt, progs, 3, &ex), ST_CODE_RUNTIME, "2 pipeline stages", "runtime devices 3..4",
               "runtime.cpu_devices");
  assert_null(ex);
  st_plan_deinit(&p);
  st_plan_deinit(&eager);
  st_program_destroy(mm);
  st_runtime_destroy(rt);
}

/* Two stages of two devices (data-parallel indices) each: stage s's index
 * d on device 2 s + d; an all-reduce of z compiled for stage 1's devices. */
static void test_pipeline_data_parallel(void** state) {
  (void)state;
  st_runtime* rt = NULL;
  assert_int_equal(tu_runtime_create(4, &rt), 0);
  st_program* mm = NULL;
  ASSERT_OK(st_program_compile(rt, "mm", kPipeMatmul, sizeof(kPipeMatmul) - 1, NULL, &mm));
  st_program* ar1 = pipe_all_reduce(rt, 2);
  st_program* ar0 = pipe_all_reduce(rt, 0);
  st_plan p;
  pipe_plan(&p, 2, true, false);
  assert_int_equal(p.program_count, 3);
  /* The stage 1 collective compiled for stage 0's devices is refused. */
  st_program* wrong[3] = {mm, mm, ar0};
  st_executor* ex = NULL;
  ASSERT_ERROR(st_executor_create(&p, rt, wrong, 0, &ex), ST_CODE_RUNTIME, "'ar'", "stage 1", "device 0", "devices 2..3");
  assert_null(ex);
  st_program* progs[3] = {mm, mm, ar1};
  ASSERT_OK(st_executor_create(&p, rt, progs, 0, &ex));
  pipe_params(ex, rt, &p);
  const int w1 = st_plan_slot_find(&p, "w1");
  assert_int_equal(st_buffer_device(st_executor_get_device(ex, w1, 0)), 2);
  assert_int_equal(st_buffer_device(st_executor_get_device(ex, w1, 1)), 3);
  pipe_ctx c = {.rt = rt, .got = {calloc(PIPE_N * PIPE_N, sizeof(float)), calloc(PIPE_N * PIPE_N, sizeof(float))}};
  st_executor_hooks h = {.user = &c, .h2d = pipe_h2d, .read = pipe_read, .host = pipe_host};
  for (int step = 0; step < 2; ++step) {
    ASSERT_OK(st_executor_run(ex, &h));
    for (int d = 0; d < 2; ++d) {
      assert_int_equal(c.h2d_device[d], d);
      assert_int_equal(c.read_device[d], 2 + d);
      /* the sum over both indices of 6 x_d */
      for (int e = 0; e < PIPE_N * PIPE_N; ++e)
        if (c.got[d][e] != 6 * (pipe_x(0, e) + pipe_x(1, e))) fail_msg("index %d: z[%d] = %g", d, e, c.got[d][e]);
    }
    expect_pipe_stats(ex, &p, 1, false);
    assert_int_equal(st_executor_stats_get(ex)->collectives, 1);
  }
  char path[1200];
  snprintf(path, sizeof(path), "%s/pipe_trace_dp.json", g_tmp);
  ASSERT_OK(st_executor_write_trace(ex, path, 1, NULL));
  size_t n = 0;
  char* raw = tu_read_file(path, &n);
  char* text = calloc(n + 1, 1);
  memcpy(text, raw, n);
  assert_non_null(strstr(text, "stage 1 device 3 compute"));
  assert_non_null(strstr(text, "stage 1 device 2 communication"));
  free(raw);
  free(text);
  st_executor_destroy(ex);
  free(c.got[0]);
  free(c.got[1]);
  st_plan_deinit(&p);
  st_program_destroy(ar0);
  st_program_destroy(ar1);
  st_program_destroy(mm);
  st_runtime_destroy(rt);
}

/* What st_plan_finalize refuses in a pipeline. */
static void test_pipeline_rejects(void** state) {
  (void)state;
  st_plan p;
  /* A SEND within one stage. */
  st_plan_init(&p);
  p.stages = 2;
  int a = st_plan_slot(&p, "a", ST_SLOT_ACT, &kPipeT, true), b = st_plan_slot(&p, "b", ST_SLOT_ACT, &kPipeT, false);
  st_plan_add(&p, ST_OP_SEND, -1, 0, 0, 0, 1, &a, 1, &b);
  st_plan_add(&p, ST_OP_FREE, -1, -1, 0, 0, 1, &b, 0, NULL);
  expect_rejected(&p, "sends within one stage");
  /* A LAUNCH reading another stage's slot. */
  st_plan_init(&p);
  p.stages = 2;
  a = st_plan_slot(&p, "a", ST_SLOT_ACT, &kPipeT, true);
  int w = st_plan_slot(&p, "w1", ST_SLOT_PARAM, &kPipeT, true);
  b = st_plan_slot(&p, "b", ST_SLOT_ACT, &kPipeT, false);
  p.slots[w].stage = 1;
  int in[2] = {a, w};
  st_plan_add(&p, ST_OP_LAUNCH, st_plan_program(&p, "f"), 0, 0, 0, 2, in, 1, &b);
  st_plan_add(&p, ST_OP_FREE, -1, -1, 0, 0, 1, &b, 0, NULL);
  expect_rejected(&p, "touches another stage's slot 'w1'");
  /* A SEND without stages. */
  st_plan_init(&p);
  a = st_plan_slot(&p, "a", ST_SLOT_ACT, &kPipeT, true);
  b = st_plan_slot(&p, "b", ST_SLOT_ACT, &kPipeT, false);
  st_plan_add(&p, ST_OP_SEND, -1, 0, 0, 0, 1, &a, 1, &b);
  st_plan_add(&p, ST_OP_FREE, -1, -1, 0, 0, 1, &b, 0, NULL);
  expect_rejected(&p, "SEND in a plan without pipeline stages");
}

/*===-------------------------------------------------------------------===*/
/* The memory test: real runs                                               */
/*===-------------------------------------------------------------------===*/

typedef struct {
  int steps;
  int64_t peak[8], predicted[8];
  int64_t peak_opt[8], peak_act[8];
  int64_t host_bytes, h2d_bytes, d2h_bytes, recomputes, waits;
  int64_t collectives, collective_bytes; /* data parallelism (0 when absent) */
} run_metrics;

/* Trains configs/test.yml for 3 steps with |extra| overrides (NULL-ended)
 * and reads back the per-step accounting from metrics.jsonl. */
static void train(const char* tag, const char* const* extra, run_metrics* out) {
  char dir[1024], cache[1024];
  snprintf(dir, sizeof(dir), "run.dir=%s/%s", g_tmp, tag);
  snprintf(cache, sizeof(cache), "runtime.cache_dir=%s/cache", g_tmp);
  const char* base[] = {dir, cache, "train.steps=3", "runtime.deterministic=true", "runtime.cpu_devices=1",
                        "run.progress=off", "train.eval_every=0", "model.n_layers=3"};
  char* ov[32];
  int n = 0;
  for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); ++i) ov[n++] = (char*)base[i];
  for (int i = 0; extra && extra[i]; ++i) ov[n++] = (char*)extra[i];
  st_config* cfg = NULL;
  ASSERT_OK(st_config_load(STRATA_SOURCE_DIR "/configs/test.yml", n, ov, &cfg));
  ASSERT_OK(st_train_main(cfg));
  st_config_destroy(cfg);

  char path[1100];
  snprintf(path, sizeof(path), "%s/%s/metrics.jsonl", g_tmp, tag);
  size_t size = 0;
  char* raw = tu_read_file(path, &size);
  assert_non_null(raw);
  char* text = calloc(size + 1, 1); /* tu_read_file does not terminate */
  memcpy(text, raw, size);
  free(raw);
  memset(out, 0, sizeof(*out));
  for (char* line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    json_t* j = NULL;
    st_status ps = st_json_parse(line, strlen(line), path, &j);
    if (ps) fail_msg("%s: %s\nline: %s", tag, st_status_message(ps), line);
    int64_t v = 0;
    if (!json_object_get(j, "loss")) {
      json_decref(j);
      continue;
    }
    assert_true(out->steps < 8);
    int k = out->steps++;
    ASSERT_OK(st_json_get_int(j, "peak_live_bytes", path, &out->peak[k]));
    ASSERT_OK(st_json_get_int(j, "peak_live_bytes_predicted", path, &out->predicted[k]));
    const json_t* cat = json_object_get(j, "peak_live_by_category");
    assert_non_null(cat);
    ASSERT_OK(st_json_get_int(cat, "optimizer", path, &out->peak_opt[k]));
    ASSERT_OK(st_json_get_int(cat, "activations", path, &out->peak_act[k]));
    ASSERT_OK(st_json_get_int(j, "host_bytes", path, &out->host_bytes));
    ASSERT_OK(st_json_get_int(j, "h2d_bytes", path, &out->h2d_bytes));
    ASSERT_OK(st_json_get_int(j, "d2h_bytes", path, &out->d2h_bytes));
    ASSERT_OK(st_json_get_int(j, "recomputes", path, &out->recomputes));
    ASSERT_OK(st_json_get_int(j, "waits", path, &v));
    out->waits = v;
    if (json_object_get(j, "collectives")) {
      ASSERT_OK(st_json_get_int(j, "collectives", path, &out->collectives));
      ASSERT_OK(st_json_get_int(j, "collective_bytes", path, &out->collective_bytes));
    }
    ASSERT_OK(st_json_get_int(j, "live_mismatch_op", path, &v));
    if (v != -1) fail_msg("%s step %d: accounted live bytes differ from the plan's prediction after op %lld", tag, k + 1, (long long)v);
    json_decref(j);
  }
  free(text);
  assert_int_equal(out->steps, 3);
  for (int k = 0; k < out->steps; ++k) {
    if (out->peak[k] != out->predicted[k])
      fail_msg("%s step %d: accounted peak %lld != predicted %lld", tag, k + 1, (long long)out->peak[k],
               (long long)out->predicted[k]);
    assert_int_equal(out->peak[k], out->peak[0]); /* the same plan every step */
  }
}

/* The bundle the runs used, for numbers the plan builder did not make. */
static st_bundle* test_bundle(void) {
  char cache[1024];
  snprintf(cache, sizeof(cache), "runtime.cache_dir=%s/cache", g_tmp);
  char* ov[2] = {cache, "model.n_layers=3"};
  st_config* cfg = NULL;
  ASSERT_OK(st_config_load(STRATA_SOURCE_DIR "/configs/test.yml", 2, ov, &cfg));
  st_plan_options o;
  ASSERT_OK(st_plan_options_from_config(cfg, &o));
  st_bundle_request req = {o.model_json, o.cache_root, o.bundle_dir, NULL, NULL, false, 0};
  st_bundle* b = NULL;
  bool exported = false;
  ASSERT_OK(st_bundle_ensure(&req, &b, &exported));
  st_plan_options_deinit(&o);
  st_config_destroy(cfg);
  return b;
}

static void test_memory_accounting(void** state) {
  (void)state;
  run_metrics none, full, opt0, opt1, both;
  const char* r_none[] = {"sched.remat=none", NULL};
  const char* r_full[] = {"sched.remat=full", NULL};
  /* Offload is measured against full remat (its peak falls where full's is). */
  const char* o_opt0[] = {"sched.offload=optimizer", "sched.prefetch_depth=0", "sched.remat=full", NULL};
  const char* o_opt1[] = {"sched.offload=optimizer", "sched.prefetch_depth=1", "sched.remat=full", NULL};
  /* Everything at once, for the sanitizers: offload of both, per-layer
   * updates, eager waits, partial remat, a trace, and the hang watchdog
   * (every op's issue and completion through the executor's monitor). */
  const char* o_all[] = {"sched.offload=both", "sched.prefetch_depth=2", "sched.optimizer=per_layer", "train.grad_clip=0",
                         "sched.wait=eager", "sched.remat=every:2", "trace.steps=[2]", "diag.hang_timeout_s=600", NULL};
  train("none", r_none, &none);
  train("full", r_full, &full);
  train("opt0", o_opt0, &opt0);
  train("opt1", o_opt1, &opt1);
  train("all", o_all, &both);
  /* sched.remat=auto: the default (no budget) trains none's plan; a budget
   * one byte below none's peak recomputes layer 0 only, and the accounted
   * peak stays within it. */
  run_metrics autodef, autob;
  train("auto-default", NULL, &autodef);
  char budget[64];
  snprintf(budget, sizeof(budget), "sched.memory_budget=%lld", (long long)(none.peak[0] - 1));
  const char* r_autob[] = {budget, NULL};
  train("auto-budget", r_autob, &autob);

  st_bundle* b = test_bundle();
  const st_bundle_program* fr = st_bundle_program_find(b, "block_fwd_res");
  assert_non_null(fr);
  int64_t residual_bytes = 0; /* one layer's residuals: block_fwd_res's outputs after y */
  for (int i = 1; i < fr->output_count; ++i) residual_bytes += (int64_t)st_tensor_type_bytes(&fr->outputs[i].type);
  int64_t param_bytes = 0;
  for (int i = 0; i < b->param_count; ++i) param_bytes += (int64_t)st_tensor_type_bytes(&b->params[i].type);
  int64_t layers = b->model.n_layers;
  st_bundle_destroy(b);

  /* remat=full: the peak is the first backward launch of the last
   * microbatch, where remat=none holds every layer's residuals and full
   * only the one it just recomputed: L - 1 layers' residuals fewer. */
  int64_t remat_drop = none.peak[0] - full.peak[0];
  printf("# remat none: peak %lld B (activations %lld); full: %lld B (activations %lld); drop %lld B = (%lld - 1) x %lld B "
         "residuals per layer\n",
         (long long)none.peak[0], (long long)none.peak_act[0], (long long)full.peak[0], (long long)full.peak_act[0],
         (long long)remat_drop, (long long)layers, (long long)residual_bytes);
  assert_int_equal(remat_drop, (layers - 1) * residual_bytes);
  assert_int_equal(none.peak_act[0] - full.peak_act[0], (layers - 1) * residual_bytes);
  assert_int_equal(none.recomputes, 0);
  assert_int_equal(layers, 3);
  assert_int_equal(full.recomputes, 2 * layers); /* every layer, both microbatches */
  printf("# remat auto: default peak %lld B, %lld recomputes; budget %lld B: peak %lld B, %lld recomputes\n",
         (long long)autodef.peak[0], (long long)autodef.recomputes, (long long)(none.peak[0] - 1),
         (long long)autob.peak[0], (long long)autob.recomputes);
  assert_int_equal(autodef.peak[0], none.peak[0]);
  assert_int_equal(autodef.recomputes, 0);
  assert_true(autob.peak[0] <= none.peak[0] - 1);
  assert_int_equal(autob.peak[0], none.peak[0] - residual_bytes); /* layer 0's residuals */
  assert_int_equal(autob.recomputes, 2); /* layer 0, both microbatches */

  /* Optimizer offload, prefetch 0: no m or v is on the device during the
   * backward (the peak), so the peak falls by all of them: 2 x parameters. */
  int64_t opt_drop = full.peak[0] - opt0.peak[0];
  printf("# optimizer offload (prefetch 0): peak %lld B, drop %lld B = 2 x %lld B parameters; host %lld B\n",
         (long long)opt0.peak[0], (long long)opt_drop, (long long)param_bytes, (long long)opt0.host_bytes);
  assert_int_equal(opt_drop, 2 * param_bytes);
  assert_int_equal(opt0.peak_opt[0], 0);
  assert_int_equal(opt0.host_bytes, 2 * param_bytes);
  /* Every m and v goes down and comes back once a step; the batch and the
   * scalars go down, losses and norms come back, as in the default plan. */
  assert_int_equal(opt0.h2d_bytes - full.h2d_bytes, 2 * param_bytes);
  assert_int_equal(opt0.d2h_bytes - full.d2h_bytes, 2 * param_bytes);
  printf("# optimizer offload (prefetch 1): peak %lld B (accounted = predicted)\n", (long long)opt1.peak[0]);
  assert_true(opt1.peak[0] >= opt0.peak[0]); /* prefetching holds more, never less */
  printf("# offload both, per-layer optimizer, eager, every:2: peak %lld B, host %lld B\n", (long long)both.peak[0],
         (long long)both.host_bytes);
  char trace[1100];
  snprintf(trace, sizeof(trace), "%s/all/trace/step_2.json", g_tmp);
  size_t n = 0;
  char* text = tu_read_file(trace, &n);
  assert_non_null(text);
  json_t* j = NULL;
  ASSERT_OK(st_json_parse(text, n, trace, &j));
  assert_non_null(json_object_get(j, "traceEvents"));
  json_decref(j);
  free(text);
}

/* Data parallelism (docs/parallelism.md) under the sanitizers: per-device
 * slots, a launch per device, COLLECTIVE ops, with every pass at once in
 * the second run. train() checks accounted = predicted live bytes, which
 * are per device. */
static void test_data_parallel_accounting(void** state) {
  (void)state;
  run_metrics one, dp, all;
  const char* r_one[] = {"train.batch_size=8", "sched.remat=none", NULL};
  const char* r_dp[] = {"train.batch_size=8", "sched.remat=none", "parallel.data=2", "runtime.cpu_devices=2", NULL};
  const char* r_all[] = {"train.batch_size=8", "parallel.data=2", "runtime.cpu_devices=2", "sched.offload=both",
                         "sched.prefetch_depth=2", "sched.optimizer=per_layer", "train.grad_clip=0", "sched.wait=eager",
                         "sched.remat=every:2", "trace.steps=[2]", "diag.hang_timeout_s=600", NULL};
  train("dp_one", r_one, &one);
  train("dp2", r_dp, &dp);
  train("dp2_all", r_all, &all);
  st_bundle* b = test_bundle();
  int64_t param_bytes = 0;
  for (int i = 0; i < b->param_count; ++i) param_bytes += (int64_t)st_tensor_type_bytes(&b->params[i].type);
  int64_t layers = b->model.n_layers;
  st_bundle_destroy(b);
  printf("# data=2: peak %lld B per device (1 device: %lld B); %lld collectives, %lld B a step\n", (long long)dp.peak[0],
         (long long)one.peak[0], (long long)dp.collectives, (long long)dp.collective_bytes);
  /* Replicated optimizer state: the same bytes on each device as on one. */
  assert_int_equal(dp.peak_opt[0], one.peak_opt[0]);
  assert_int_equal(dp.peak_opt[0], 2 * param_bytes);
  /* Half the rows per device: fewer activation bytes at the peak. */
  assert_true(dp.peak[0] < one.peak[0]);
  /* One all-reduce per group instance, carrying every gradient once. */
  assert_int_equal(dp.collectives, layers + 2);
  assert_int_equal(dp.collective_bytes, param_bytes);
  assert_int_equal(all.collectives, layers + 2);
  assert_int_equal(one.collectives, 0);
}

/* Pipelines trained in-process, for the sanitizers and the accounting:
 * 3 stages under 1F1B with partial remat, offload of both, per-layer
 * updates, eager waits, a trace and the hang watchdog; 2 stages x fsdp=2
 * under GPipe (tied embeddings: the wte gathered and sent to the head's
 * stage). Pipeline x data trains against one device in
 * tests/py/test_pipeline.py. Each step's accounted peak equals the plan's,
 * op for op (train() checks). */
static void test_pipeline_trains(void** state) {
  (void)state;
  run_metrics p3, p2f2;
  const char* r_p3[] = {"parallel.pipeline=3", "runtime.cpu_devices=3", "train.microbatches=3", "train.batch_size=6",
                        "sched.remat=every:2", "sched.wait=eager", "trace.steps=[2]", "diag.hang_timeout_s=600",
                        "sched.offload=both", "sched.optimizer=per_layer", "train.grad_clip=0", NULL};
  const char* r_p2f2[] = {"parallel.pipeline=2", "parallel.fsdp=2", "runtime.cpu_devices=4", "train.microbatches=2",
                          "train.batch_size=8", "sched.pipeline_schedule=gpipe", NULL};
  train("pp3", r_p3, &p3);
  train("pp2_fsdp2", r_p2f2, &p2f2);
  assert_true(p3.recomputes > 0);
  assert_true(p2f2.collectives > 3 + 2); /* gathers and reduce-scatters of every group instance, on its stage */
}


/*===-------------------------------------------------------------------===*/
/* Optimizer state from the update program (docs/bundle.md, "Optimizer state") */
/*===-------------------------------------------------------------------===*/

/* Rewrites a copy of a bundle's manifest (argv[1]) as an exporter of
 * another optimizer would write it: the groups' "adamw" roles become
 * "update"/"update_stats", and each update's state becomes kinds mu (every
 * parameter), nu (parameters of rank < 2), vr and vc (rank >= 2: f32 vectors
 * of dim 0 and of the rest, as Adafactor's factored moments). */
static const char* kOptimizerScript =
    "import json, sys\n"
    "p = sys.argv[1]\n"
    "m = json.load(open(p))\n"
    "upd = set()\n"
    "for g in m['groups']:\n"
    "    pr = g['programs']\n"
    "    for old, new in (('adamw', 'update'), ('adamw_stats', 'update_stats')):\n"
    "        if old in pr: pr[new] = pr.pop(old); upd.add(pr[new])\n"
    "def spec(kind, t, shape): return dict(t, name=kind + '_' + t['name'], shape=shape, role='opt_' + kind)\n"
    "for e in m['programs']:\n"
    "    if e['name'] not in upd: continue\n"
    "    ps = [t for t in e['inputs'] if t['role'] == 'param']\n"
    "    n = len(ps)\n"
    "    st = [spec('mu', t, t['shape']) for t in ps]\n"
    "    st += [spec('nu', t, t['shape']) for t in ps if len(t['shape']) < 2]\n"
    "    st += [spec('vr', t, t['shape'][:1]) for t in ps if len(t['shape']) >= 2]\n"
    "    st += [spec('vc', t, [max(1, __import__('math').prod(t['shape'][1:]))]) for t in ps if len(t['shape']) >= 2]\n"
    "    e['inputs'] = e['inputs'][:2 * n] + st + e['inputs'][-4:]\n"
    "    stats = [t for t in e['outputs'] if t['role'] == 'metric']\n"
    "    e['outputs'] = e['outputs'][:n] + st + stats\n"
    "    e['donated'] = list(range(n)) + list(range(2 * n, 2 * n + len(st)))\n"
    "json.dump(m, open(p, 'w'), indent=2)\n";

static st_bundle* optimizer_copy(const st_bundle* b) {
  char dir[512], cmd[4096];
  snprintf(dir, sizeof(dir), "%s/optimizer_copy", g_tmp);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s' && '%s/.venv/bin/python' -c \"$STRATA_REWRITE\" '%s/manifest.json'",
           dir, b->dir, dir, STRATA_SOURCE_DIR, dir);
  setenv("STRATA_REWRITE", kOptimizerScript, 1);
  assert_int_equal(system(cmd), 0);
  unsetenv("STRATA_REWRITE");
  st_bundle* r = NULL;
  ASSERT_OK(st_bundle_open(dir, &r));
  return r;
}

static int slot_of(const st_plan* p, const char* prefix, const char* name) {
  char full[320];
  snprintf(full, sizeof(full), "%s%s", prefix, name);
  return st_plan_slot_find(p, full);
}

static bool same_type(const st_tensor_type* a, const st_tensor_type* b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int d = 0; d < a->rank; ++d)
    if (a->dims[d] != b->dims[d]) return false;
  return true;
}

static void test_optimizer_state_slots(void** state) {
  (void)state;
  st_bundle* b = test_bundle();
  st_bundle* r = optimizer_copy(b);
  assert_non_null(r->groups[0].update);
  assert_non_null(strstr(r->groups[0].update->name, "adamw_"));
  st_plan_options o;
  memset(&o, 0, sizeof(o));
  o.microbatches = 2;
  o.batch_size = 4;
  o.eval_batches = 1;
  ASSERT_OK(st_config_remat_read("none", 3, &o.sched.remat));
  st_plan step, eval, step0, eval0;
  ASSERT_OK(st_plan_build(b, &o, &step0, &eval0, NULL));
  ASSERT_OK(st_plan_build(r, &o, &step, &eval, NULL));
  /* Every parameter's state under its kinds' names and types, nothing of AdamW's. */
  int n_opt = 0, want = 0;
  for (int s = 0; s < step.slot_count; ++s) n_opt += step.slots[s].category == ST_SLOT_OPT;
  for (int i = 0; i < r->param_count; ++i) {
    const st_bundle_param* p = &r->params[i];
    assert_true(slot_of(&step, "m:", p->name) < 0 && slot_of(&step, "v:", p->name) < 0);
    int mu = slot_of(&step, "mu:", p->name);
    assert_true(mu >= 0 && same_type(&step.slots[mu].type, &p->type) && step.slots[mu].persistent);
    assert_int_equal(step.slots[mu].category, ST_SLOT_OPT);
    if (p->type.rank < 2) {
      int nu = slot_of(&step, "nu:", p->name);
      assert_true(nu >= 0 && same_type(&step.slots[nu].type, &p->type));
      want += 2;
      continue;
    }
    int vr = slot_of(&step, "vr:", p->name), vc = slot_of(&step, "vc:", p->name);
    assert_true(vr >= 0 && vc >= 0);
    assert_int_equal(step.slots[vr].type.rank, 1);
    assert_int_equal(step.slots[vr].type.dims[0], p->type.dims[0]);
    assert_int_equal(step.slots[vc].type.dims[0], st_tensor_type_elements(&p->type) / p->type.dims[0]);
    assert_true(mu < vr && vr < vc); /* a parameter's state in the kinds' order */
    want += 3;
  }
  assert_int_equal(n_opt, want);
  /* The same step otherwise: one update launch per group instance. */
  assert_int_equal(step.op_count, step0.op_count);
  assert_int_equal(eval.op_count, eval0.op_count);
  st_plan_deinit(&step);
  st_plan_deinit(&eval);
  /* Offloaded optimizer state: every state slot has its host home. */
  o.sched.offload = ST_OFFLOAD_OPTIMIZER;
  ASSERT_OK(st_plan_build(r, &o, &step, &eval, NULL));
  for (int s = 0; s < step.slot_count; ++s)
    if (step.slots[s].category == ST_SLOT_OPT && strncmp(step.slots[s].name, "host:", 5))
      assert_true(slot_of(&step, "host:", step.slots[s].name) >= 0);
  st_plan_deinit(&step);
  st_plan_deinit(&eval);
  /* A state input that names no parameter of the group is refused. */
  st_bundle_tensor* t = &((st_bundle_program*)r->groups[0].update)->inputs[2 * r->groups[0].param_count];
  char* keep = t->name;
  t->name = "mu_nothing";
  st_status s = st_plan_build(r, &o, &step, &eval, NULL);
  t->name = keep;
  assert_non_null(s);
  assert_int_equal(st_status_code(s), ST_CODE_RUNTIME);
  if (!strstr(st_status_message(s), "input 'mu_nothing' (role 'opt_mu') is not a parameter's state"))
    fail_msg("unexpected: %s", st_status_message(s));
  st_status_free(s);
  st_plan_deinit(&step0);
  st_plan_deinit(&eval0);
  st_bundle_destroy(r);
  st_bundle_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_remat_parse),
      cmocka_unit_test(test_per_layer_clip_rule),
      cmocka_unit_test(test_optimizer_state_slots),
      cmocka_unit_test(test_memory_budget_parse),
      cmocka_unit_test(test_remat_auto_chooser),
      cmocka_unit_test(test_remat_auto_plans),
      cmocka_unit_test(test_offload_pass),
      cmocka_unit_test(test_peak_with_temps),
      cmocka_unit_test(test_wait_pass_and_deps),
      cmocka_unit_test(test_finalize_rejects),
      cmocka_unit_test(test_xproc_out_of_place),
      cmocka_unit_test(test_copy_to_memory),
      cmocka_unit_test(test_pipeline_two_stages),
      cmocka_unit_test(test_pipeline_data_parallel),
      cmocka_unit_test(test_pipeline_rejects),
      cmocka_unit_test(test_memory_accounting),
      cmocka_unit_test(test_data_parallel_accounting),
      cmocka_unit_test(test_pipeline_trains),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
