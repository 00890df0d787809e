/* test_train.c — the decomposition's invariants, on the real exporter and
 * the real CPU plugin:
 *   - one block program serves every layer: bundles for 2 and 12 layers
 *     compile the same programs, each once (runtime counters);
 *   - the block backward program matches finite differences of the block
 *     forward program, input by input (directional derivatives, f32,
 *     small shapes);
 *   - the plan builder takes every program name from the bundle's program
 *     tables (renamed programs, a layer with programs of its own), and so
 *     does the generation driver (strata sample);
 *   - the host-side draw of the next token (temperature, top-k, top-p,
 *     the splitmix64 PRNG). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/runtime.h"
#include "strata/sched.h"
#include "strata/train.h"

static char g_tmp[256];

static const char* kModelFmt =
    "{\"vocab_size\": 256, \"d_model\": 32, \"n_layers\": %d, \"n_heads\": 2, \"d_ff\": 64, \"seq_len\": 16, "
    "\"tie_embeddings\": %s, \"compute_dtype\": \"f32\", \"rope_theta\": 10000, \"init_std\": 0.02, \"microbatch_size\": 2}";

static int setup(void** state) {
  (void)state;
  snprintf(g_tmp, sizeof(g_tmp), "/tmp/strata-test-train-XXXXXX");
  assert_non_null(mkdtemp(g_tmp));
  return 0;
}

static int teardown(void** state) {
  (void)state;
  st_status_free(st_fs_remove_tree(g_tmp));
  return 0;
}

#define ASSERT_OK(expr)                                                     \
  do {                                                                      \
    st_status s__ = (expr);                                                 \
    if (s__) fail_msg("%s: %s", #expr, st_status_message(s__));             \
  } while (0)

static st_bundle* ensure_bundle_ex(int layers, bool tied, bool* out_exported) {
  char model[1024];
  snprintf(model, sizeof(model), kModelFmt, layers, tied ? "true" : "false");
  st_bundle_request req = {model, g_tmp, NULL, NULL, NULL, false, 0};
  st_bundle* b = NULL;
  bool exported = false;
  ASSERT_OK(st_bundle_ensure(&req, &b, &exported));
  assert_int_equal(b->model.n_layers, layers);
  if (out_exported) *out_exported = exported;
  return b;
}

static st_bundle* ensure_bundle(int layers, bool tied) { return ensure_bundle_ex(layers, tied, NULL); }

/* Compiles every program a step and an eval plan use; returns the
 * runtime's compile counter. */
static int64_t compile_all(const st_bundle* b, int microbatches, int* out_unique) {
  st_runtime_options ro;
  st_runtime_options_init(&ro);
  ro.cpu_devices = 1;
  st_runtime* rt = NULL;
  ASSERT_OK(st_runtime_create(&ro, &rt));
  st_plan_options o;
  memset(&o, 0, sizeof(o));
  o.microbatches = microbatches;
  o.batch_size = 2 * microbatches;
  o.eval_batches = 1;
  st_plan step, eval;
  ASSERT_OK(st_plan_build(b, &o, &step, &eval, NULL));
  st_program** compiled = calloc((size_t)b->program_count, sizeof(st_program*));
  int unique = 0;
  const st_plan* plans[2] = {&step, &eval};
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < plans[p]->program_count; ++i) {
      const st_bundle_program* bp = st_bundle_program_find(b, plans[p]->programs[i]);
      assert_non_null(bp);
      int idx = (int)(bp - b->programs);
      if (compiled[idx]) continue;
      ASSERT_OK(st_program_compile_file(rt, bp->path, NULL, &compiled[idx]));
      ++unique;
    }
  }
  st_runtime_stats stats;
  st_runtime_get_stats(rt, &stats);
  for (int i = 0; i < b->program_count; ++i) st_program_destroy(compiled[i]);
  free(compiled);
  st_plan_deinit(&step);
  st_plan_deinit(&eval);
  st_runtime_destroy(rt);
  *out_unique = unique;
  return stats.compiles;
}

static void test_program_count_independent_of_depth(void** state) {
  (void)state;
  /* One bundle serves every depth: the second depth exports nothing and
   * gets its own parameter table, instantiated from the first's layer 0. */
  bool e2 = false, e12 = true;
  st_bundle* b2 = ensure_bundle_ex(2, true, &e2);
  st_bundle* b12 = ensure_bundle_ex(12, true, &e12);
  assert_true(e2);
  assert_false(e12);
  assert_string_equal(b2->dir, b12->dir);
  assert_string_equal(b2->key, b12->key);
  int per_layer = st_bundle_group_find(b2, "block")->param_count;
  assert_int_equal(b12->param_count, b2->param_count + 10 * per_layer);
  int last = st_bundle_param_index(b12, "layers.11.w_down");
  assert_true(last >= 0);
  assert_int_equal(b12->params[last].layer, 11);
  assert_string_equal(b12->params[last].group, "block");
  assert_int_equal(b12->params[last].type.dtype, b2->params[st_bundle_param_index(b2, "layers.1.w_down")].type.dtype);
  assert_true(st_bundle_param_index(b12, "layers.12.wq") < 0);
  assert_string_equal(b12->params[b12->param_count - 1].name, b2->params[b2->param_count - 1].name);
  assert_int_equal(b2->program_count, b12->program_count);
  int u2 = 0, u12 = 0;
  int64_t c2 = compile_all(b2, 2, &u2);
  int64_t c12 = compile_all(b12, 2, &u12);
  printf("# 2 layers: %lld compiles of %d programs; 12 layers: %lld compiles of %d programs\n", (long long)c2, u2,
         (long long)c12, u12);
  assert_int_equal(u2, u12);
  assert_int_equal(c2, u2);  /* each program compiled exactly once */
  assert_int_equal(c12, u12);
  /* The parameter table does grow with depth. */
  assert_true(b12->param_count > b2->param_count);
  st_bundle_destroy(b2);
  st_bundle_destroy(b12);
}

static uint64_t g_rng = 0x1234567;
static float frand(void) {
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(g_rng >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void fill(float* v, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) v[i] = frand() * scale;
}

/* <y(inputs), r> for block_fwd on the host copies |host|. */
static double block_objective(st_runtime* rt, st_program* fwd, float** host, const st_bundle_program* bp, const float* r) {
  st_buffer* in[32] = {0};
  for (int i = 0; i < bp->input_count; ++i) ASSERT_OK(st_buffer_from_host(rt, 0, &bp->inputs[i].type, host[i], &in[i]));
  st_buffer* out = NULL;
  ASSERT_OK(st_program_execute(fwd, 0, in, bp->input_count, &out, 1, NULL));
  int64_t n = st_tensor_type_elements(&bp->outputs[0].type);
  float* y = malloc((size_t)n * sizeof(float));
  ASSERT_OK(st_buffer_to_host(out, y, (size_t)n * sizeof(float)));
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += (double)y[i] * r[i];
  free(y);
  st_buffer_destroy(out);
  for (int i = 0; i < bp->input_count; ++i) st_buffer_destroy(in[i]);
  return acc;
}

/* The gradient of <y, r> with respect to each input of block_fwd (params...,
 * x) from a backward program: block_bwd, or block_fwd_res followed by
 * block_bwd_res when |residuals|. grads[i] is malloc'd, the caller frees it. */
static void analytic_gradient(st_runtime* rt, const st_bundle* b, bool residuals, float** host, const float* r,
                              float** grads) {
  const st_bundle_program* fp = st_bundle_program_find(b, "block_fwd");
  const st_bundle_program* bp = st_bundle_program_find(b, residuals ? "block_bwd_res" : "block_bwd");
  assert_non_null(bp);
  int n_in = fp->input_count; /* params..., x */
  st_program* bwd = NULL;
  ASSERT_OK(st_program_compile_file(rt, bp->path, NULL, &bwd));
  st_buffer* in[64] = {0};
  int n = 0;
  for (int i = 0; i < n_in; ++i) ASSERT_OK(st_buffer_from_host(rt, 0, &fp->inputs[i].type, host[i], &in[n++]));
  st_buffer* res[32] = {0};
  int n_res = 0;
  if (residuals) {
    const st_bundle_program* rp = st_bundle_program_find(b, "block_fwd_res");
    assert_non_null(rp);
    st_program* fres = NULL;
    ASSERT_OK(st_program_compile_file(rt, rp->path, NULL, &fres));
    n_res = rp->output_count;
    ASSERT_OK(st_program_execute(fres, 0, in, n_in, res, n_res, NULL));
    st_program_destroy(fres);
    for (int i = 1; i < n_res; ++i) in[n++] = res[i]; /* residuals after y */
  }
  st_buffer* dy = NULL;
  ASSERT_OK(st_buffer_from_host(rt, 0, &fp->outputs[0].type, r, &dy));
  in[n++] = dy;
  assert_int_equal(bp->input_count, n);
  st_buffer* outs[64] = {0};
  assert_int_equal(bp->output_count, n_in);
  ASSERT_OK(st_program_execute(bwd, 0, in, n, outs, bp->output_count, NULL));
  for (int i = 0; i < n_in; ++i) {
    int64_t k = st_tensor_type_elements(&fp->inputs[i].type);
    grads[i] = malloc((size_t)k * sizeof(float));
    ASSERT_OK(st_buffer_to_host(outs[i], grads[i], (size_t)k * sizeof(float)));
    st_buffer_destroy(outs[i]);
  }
  for (int i = 0; i < n_in; ++i) st_buffer_destroy(in[i]);
  for (int i = 0; i < n_res; ++i) st_buffer_destroy(res[i]);
  st_buffer_destroy(dy);
  st_program_destroy(bwd);
}

static double dot(const float* a, const float* b, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += (double)a[i] * b[i];
  return acc;
}

static void test_block_backward_matches_finite_differences(void** state) {
  (void)state;
  st_bundle* b = ensure_bundle(2, true);
  st_runtime_options ro;
  st_runtime_options_init(&ro);
  ro.cpu_devices = 1;
  ro.deterministic = true;
  st_runtime* rt = NULL;
  ASSERT_OK(st_runtime_create(&ro, &rt));
  const st_bundle_program* fp = st_bundle_program_find(b, "block_fwd");
  const st_bundle_program* bp = st_bundle_program_find(b, "block_bwd");
  assert_non_null(fp);
  assert_non_null(bp);
  st_program* fwd = NULL;
  ASSERT_OK(st_program_compile_file(rt, fp->path, NULL, &fwd));

  /* Inputs: block params (norm gains near 1, matrices small), then x. */
  int n_in = fp->input_count;
  float* host[32] = {0};
  float* dir[32] = {0};
  for (int i = 0; i < n_in; ++i) {
    int64_t n = st_tensor_type_elements(&fp->inputs[i].type);
    host[i] = malloc((size_t)n * sizeof(float));
    dir[i] = malloc((size_t)n * sizeof(float));
    bool gain = fp->inputs[i].type.rank == 1;
    fill(host[i], n, gain ? 0.1f : 0.3f);
    if (gain)
      for (int64_t k = 0; k < n; ++k) host[i][k] += 1.0f;
    fill(dir[i], n, 1.0f);
  }
  int64_t ny = st_tensor_type_elements(&fp->outputs[0].type);
  float* r = malloc((size_t)ny * sizeof(float));
  fill(r, ny, 1.0f);

  /* Analytic, through both backward paths the trainer can plan:
   * block_bwd (recompute inside, one program) and block_fwd_res ->
   * block_bwd_res (the RECOMPUTE op, then the backward from residuals). */
  float* grad[32] = {0};
  float* grad_res[32] = {0};
  analytic_gradient(rt, b, false, host, r, grad);
  analytic_gradient(rt, b, true, host, r, grad_res);

  /* One directional derivative per input, moving that input alone: a
   * backward that gets one input's gradient wrong fails here even when that
   * input's share of a derivative along all inputs at once is below the
   * tolerance (a norm gain's is a few percent of the whole). Central
   * differences in f32 on the device: eps balances truncation (O(eps^2))
   * against f32 rounding (O(ulp/eps)). */
  const float eps = 1e-2f;
  float* moved[32];
  for (int i = 0; i < n_in; ++i) moved[i] = host[i];
  double total = 0, worst = 0, worst_res = 0;
  for (int i = 0; i < n_in; ++i) {
    int64_t n = st_tensor_type_elements(&fp->inputs[i].type);
    float* shifted = malloc((size_t)n * sizeof(float));
    moved[i] = shifted;
    for (int64_t k = 0; k < n; ++k) shifted[k] = host[i][k] + eps * dir[i][k];
    double up = block_objective(rt, fwd, moved, fp, r);
    for (int64_t k = 0; k < n; ++k) shifted[k] = host[i][k] - eps * dir[i][k];
    double down = block_objective(rt, fwd, moved, fp, r);
    moved[i] = host[i];
    free(shifted);
    double fd = (up - down) / (2.0 * eps);
    double analytic = dot(grad[i], dir[i], n);
    double analytic_res = dot(grad_res[i], dir[i], n);
    double rel = fabs(fd - analytic) / fabs(analytic);
    double rel_res = fabs(fd - analytic_res) / fabs(analytic_res);
    printf("# %-10s analytic %12.6f, finite difference %12.6f, relative error %.2e (block_bwd), %.2e (block_bwd_res)\n",
           fp->inputs[i].name, analytic, fd, rel, rel_res);
    assert_true(fabs(analytic) > 1e-2); /* the check must not pass on zeros */
    assert_true(rel < 2e-2);
    assert_true(rel_res < 2e-2);
    total += analytic;
    worst = fmax(worst, rel);
    worst_res = fmax(worst_res, rel_res);
  }
  printf("# all inputs: analytic %.6f; worst relative error %.2e (block_bwd), %.2e (block_bwd_res)\n", total, worst,
         worst_res);

  for (int i = 0; i < n_in; ++i) {
    free(host[i]);
    free(dir[i]);
    free(grad[i]);
    free(grad_res[i]);
  }
  free(r);
  st_program_destroy(fwd);
  st_runtime_destroy(rt);
  st_bundle_destroy(b);
}

/* Rewrites a copy of a bundle's manifest (argv[1]): every program renamed
 * "<name>_v2", and layer 1 served by programs of its own ("layer1_*", the
 * same files). Tables an older manifest lacks are left alone. */
static const char* kRenameScript =
    "import json, sys\n"
    "p = sys.argv[1]\n"
    "m = json.load(open(p))\n"
    "for e in m['programs']: e['name'] += '_v2'\n"
    "tables = m['groups'] + m['layers'] + [m.get('embed'), m.get('head')]\n"
    "for t in tables:\n"
    "    if t and 'programs' in t: t['programs'] = {k: v + '_v2' for k, v in t['programs'].items()}\n"
    "byname = {e['name']: e for e in m['programs']}\n"
    "for role in ('fwd', 'fwd_res', 'bwd_res', 'prefill', 'decode'):\n"
    "    e = dict(byname['block_' + role + '_v2'], name='layer1_' + role)\n"
    "    m['programs'].append(e)\n"
    "    m['layers'][1]['programs'][role] = e['name']\n"
    "json.dump(m, open(p, 'w'), indent=2)\n";

static bool starts_with(const char* s, const char* prefix) { return !strncmp(s, prefix, strlen(prefix)); }
static bool ends_with(const char* s, const char* suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* The program of |plan| launched (or recomputed) at |layer| whose name
 * starts with |prefix|; NULL when none. */
static const char* launched(const st_plan* plan, st_op_kind kind, int layer, const char* prefix) {
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    if (op->kind == kind && op->layer == layer && starts_with(plan->programs[op->program], prefix))
      return plan->programs[op->program];
  }
  return NULL;
}

/* A copy of bundle |b| in g_tmp/|name| with every program renamed by
 * kRenameScript (new, owned by caller). */
static st_bundle* open_renamed_copy(const st_bundle* b, const char* name) {
  char dir[512], cmd[4096];
  snprintf(dir, sizeof(dir), "%s/%s", g_tmp, name);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s' && '%s/.venv/bin/python' -c \"$STRATA_RENAME\" '%s/manifest.json'",
           dir, b->dir, dir, STRATA_SOURCE_DIR, dir);
  setenv("STRATA_RENAME", kRenameScript, 1);
  assert_int_equal(system(cmd), 0);
  unsetenv("STRATA_RENAME");
  st_bundle* r = NULL;
  ASSERT_OK(st_bundle_open(dir, &r));
  return r;
}

static void test_plan_takes_program_names_from_the_bundle(void** state) {
  (void)state;
  st_bundle* b = ensure_bundle(2, true);
  st_bundle* r = open_renamed_copy(b, "renamed");

  st_plan_options o;
  memset(&o, 0, sizeof(o));
  o.microbatches = 2;
  o.batch_size = 4;
  o.eval_batches = 1;
  ASSERT_OK(st_config_remat_read("0", 2, &o.sched.remat)); /* layer 0 recomputes, layer 1 keeps its residuals */
  st_plan step, eval, step0, eval0;
  ASSERT_OK(st_plan_build(r, &o, &step, &eval, NULL));
  ASSERT_OK(st_plan_build(b, &o, &step0, &eval0, NULL));
  /* The same step, only the names differ. */
  assert_int_equal(step.op_count, step0.op_count);
  assert_int_equal(eval.op_count, eval0.op_count);
  assert_int_equal(step.program_count, step0.program_count + 2); /* layer1_fwd_res, layer1_bwd_res */
  const st_plan* plans[2] = {&step, &eval};
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < plans[p]->program_count; ++i) {
      const char* name = plans[p]->programs[i];
      if (!ends_with(name, "_v2") && !starts_with(name, "layer1_")) fail_msg("plan launches '%s', not in the tables", name);
    }
    for (int i = 0; i < plans[p]->op_count; ++i) {
      const st_op* op = &plans[p]->ops[i];
      if (op->kind != ST_OP_LAUNCH && op->kind != ST_OP_RECOMPUTE) continue;
      const char* name = plans[p]->programs[op->program];
      /* Layer 0 never runs layer 1's programs; layer 1 runs only its own
       * and its group's optimizer programs. */
      if (op->layer == 0 && starts_with(name, "layer1_")) fail_msg("layer 0 launches '%s'", name);
      if (op->layer == 1 && !starts_with(name, "layer1_") && !ends_with(name, "_block_v2"))
        fail_msg("layer 1 launches '%s'", name);
    }
  }
  assert_non_null(launched(&step, ST_OP_LAUNCH, 1, "layer1_fwd_res"));
  assert_non_null(launched(&step, ST_OP_LAUNCH, 1, "layer1_bwd_res"));
  assert_non_null(launched(&eval, ST_OP_LAUNCH, 1, "layer1_fwd"));
  assert_non_null(launched(&step, ST_OP_LAUNCH, 0, "block_fwd_v2"));
  assert_non_null(launched(&step, ST_OP_RECOMPUTE, 0, "block_fwd_res_v2"));
  assert_non_null(launched(&step, ST_OP_LAUNCH, -1, "head_loss_v2"));
  assert_non_null(launched(&step, ST_OP_LAUNCH, -1, "embed_bwd_v2"));
  assert_non_null(launched(&step, ST_OP_LAUNCH, 1, "adamw_block_v2"));
  assert_non_null(launched(&eval, ST_OP_LAUNCH, -1, "head_eval_v2"));
  assert_null(launched(&step, ST_OP_LAUNCH, 1, "block_"));

  /* Layer 1's own programs tie this table to its depth: another depth is
   * refused, naming the layer, rather than served with layer 0's row. */
  char model[1024];
  snprintf(model, sizeof(model), kModelFmt, 3, "true");
  st_bundle_request req = {model, g_tmp, r->dir, NULL, NULL, false, 0};
  st_bundle* r3 = NULL;
  bool exported = false;
  st_status s = st_bundle_ensure(&req, &r3, &exported);
  assert_non_null(s);
  assert_non_null(strstr(st_status_message(s), "gives layer 1 other programs than layer 0"));
  st_status_free(s);
  assert_null(r3);

  st_plan_deinit(&step);
  st_plan_deinit(&eval);
  st_plan_deinit(&step0);
  st_plan_deinit(&eval0);
  st_bundle_destroy(r);
  st_bundle_destroy(b);
}

/* Block metrics (docs/bundle.md, "Block metrics"): every block's fwd and
 * fwd_res return, right after y, an f32 scalar and a vector of role
 * "metric" (as an MoE layer's auxiliary loss and expert loads). */
static const char* kMetricScript =
    "import json, sys\n"
    "p, drop = sys.argv[1], sys.argv[2]\n"
    "m = json.load(open(p))\n"
    "extra = [{'name': 'aux_loss', 'shape': [], 'dtype': 'f32', 'role': 'metric'},\n"
    "         {'name': 'expert_load', 'shape': [4], 'dtype': 'f32', 'role': 'metric'}]\n"
    "for e in m['programs']:\n"
    "    if e['name'] in ('block_fwd', 'block_fwd_res') and e['name'] != drop:\n"
    "        e['outputs'] = e['outputs'][:1] + extra + e['outputs'][1:]\n"
    "json.dump(m, open(p, 'w'), indent=2)\n";

static st_bundle* metric_bundle(const st_bundle* b, const char* drop) {
  char dir[512], cmd[4096];
  snprintf(dir, sizeof(dir), "%s/metrics-%s", g_tmp, drop);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s' && '%s/.venv/bin/python' -c \"$STRATA_METRICS\" '%s/manifest.json' %s",
           dir, b->dir, dir, STRATA_SOURCE_DIR, dir, drop);
  setenv("STRATA_METRICS", kMetricScript, 1);
  assert_int_equal(system(cmd), 0);
  unsetenv("STRATA_METRICS");
  st_bundle* r = NULL;
  ASSERT_OK(st_bundle_open(dir, &r));
  return r;
}

static int op_index(const st_plan* plan, st_op_kind kind, int tag, const char* slot) {
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    if (op->kind != kind || (tag && op->tag != tag)) continue;
    for (int k = 0; k < op->input_count; ++k)
      if (!strcmp(plan->slots[op->inputs[k]].name, slot)) return i;
  }
  return -1;
}

static void test_plan_reads_block_metrics(void** state) {
  (void)state;
  st_bundle* b = ensure_bundle(2, true);
  st_bundle* r = metric_bundle(b, "none");
  const char* names[ST_PLAN_MAX_METRICS];
  int ranks[ST_PLAN_MAX_METRICS];
  assert_int_equal(st_plan_block_metrics(b, names, ranks), 0);
  assert_int_equal(st_plan_block_metrics(r, names, ranks), 2);
  assert_string_equal(names[0], "aux_loss");
  assert_string_equal(names[1], "expert_load");
  assert_int_equal(ranks[0], 0);
  assert_int_equal(ranks[1], 1);

  st_plan_options o;
  memset(&o, 0, sizeof(o));
  o.microbatches = 2;
  o.batch_size = 4;
  o.eval_batches = 1;
  ASSERT_OK(st_config_remat_read("0", 2, &o.sched.remat)); /* layer 0 runs fwd and recomputes, layer 1 runs fwd_res */
  st_plan step, eval, step0, eval0;
  ASSERT_OK(st_plan_build(r, &o, &step, &eval, NULL));
  ASSERT_OK(st_plan_build(b, &o, &step0, &eval0, NULL));
  /* Per microbatch and layer: a WAIT, a READ and a FREE of each metric
   * (the recompute frees its two with y_re); the evaluation frees each
   * layer's two in one op. */
  assert_int_equal(step.op_count, step0.op_count + 2 * 2 * 2 * 3);
  assert_int_equal(eval.op_count, eval0.op_count + 2 * 2);
  int last_loss = op_index(&step, ST_OP_READ, ST_TAG_LOSS, "loss[1]");
  assert_true(last_loss >= 0);
  char name[64];
  for (int m = 0; m < 2; ++m)
    for (int l = 0; l < 2; ++l)
      for (int s = 0; s < 2; ++s) {
        snprintf(name, sizeof(name), "metric[%d][%d].%s", m, l, names[s]);
        int rd = op_index(&step, ST_OP_READ, ST_TAG_METRIC + s, name);
        if (rd < 0) fail_msg("no READ of %s", name);
        assert_true(rd > last_loss); /* the host does not stop inside the forward */
        assert_int_equal(step.ops[rd].layer, l);
        assert_int_equal(step.ops[rd].micro, m);
        assert_true(op_index(&step, ST_OP_FREE, 0, name) > rd);
      }
  /* No backward takes a metric; the recompute's are dropped. */
  for (int i = 0; i < step.op_count; ++i) {
    const st_op* op = &step.ops[i];
    if (op->kind != ST_OP_LAUNCH && op->kind != ST_OP_RECOMPUTE) continue;
    const char* prog = step.programs[op->program];
    if (!strcmp(prog, "block_bwd_res"))
      for (int k = 0; k < op->input_count; ++k)
        if (starts_with(step.slots[op->inputs[k]].name, "metric")) fail_msg("%s takes %s", prog, step.slots[op->inputs[k]].name);
    if (op->kind == ST_OP_RECOMPUTE) {
      assert_int_equal(op->layer, 0);
      assert_string_equal(step.slots[op->outputs[1]].name, "metric_re.aux_loss");
      assert_string_equal(step.slots[op->outputs[2]].name, "metric_re.expert_load");
      assert_true(starts_with(step.slots[op->outputs[3]].name, "res[0]."));
    }
  }
  for (int i = 0; i < eval.op_count; ++i)
    assert_false(eval.ops[i].kind == ST_OP_READ && eval.ops[i].tag >= ST_TAG_METRIC);
  assert_true(op_index(&eval, ST_OP_FREE, 0, "metric_eval.aux_loss") >= 0);

  /* fwd and fwd_res must agree on the metrics. */
  st_bundle* bad = metric_bundle(b, "block_fwd_res");
  st_plan s2, e2;
  st_status s = st_plan_build(bad, &o, &s2, &e2, NULL);
  assert_non_null(s);
  assert_non_null(strstr(st_status_message(s), "return different metrics"));
  st_status_free(s);

  st_plan_deinit(&step);
  st_plan_deinit(&eval);
  st_plan_deinit(&step0);
  st_plan_deinit(&eval0);
  st_bundle_destroy(bad);
  st_bundle_destroy(r);
  st_bundle_destroy(b);
}

/* The exporter runs in a forked child that reopens stdout: output the
 * parent printed but had not flushed yet must not be written a second
 * time by the child (seen as a doubled "run directory" line when one
 * process trained and then exported another bundle). */
static void test_export_does_not_repeat_buffered_stdout(void** state) {
  (void)state;
  char path[512], dir[512];
  snprintf(path, sizeof(path), "%s/stdout.txt", g_tmp);
  snprintf(dir, sizeof(dir), "%s/bad-bundle", g_tmp);
  fflush(stdout);
  int saved = dup(1);
  assert_true(saved >= 0);
  assert_non_null(freopen(path, "w", stdout));
  printf("marker-line\n"); /* a file: fully buffered, still in the buffer at the fork */
  st_status s = st_bundle_export(&(st_bundle_export_args){.model_json = "{not a model", .key = "k", .dir = dir});
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  assert_non_null(s); /* the exporter rejects the model; only the stdout matters here */
  st_status_free(s);
  size_t n = 0;
  char* raw = NULL;
  ASSERT_OK(st_fs_read_file(path, &raw, &n));
  int count = 0;
  for (char* p = raw; (p = strstr(p, "marker-line")) != NULL; ++p) ++count;
  free(raw);
  assert_int_equal(count, 1);
}

/* A copy of |b| whose block_fwd_res keeps |extra| more residuals (and
 * block_bwd_res takes them), as a crafted manifest would. */
/* A copy of |b| named |name| under the scratch folder whose manifest the
 * Python statements |edit| changed (they see the manifest as `m`, its
 * programs by name as `p` and the integer |arg| as `arg`). Caller frees. */
static char* edited_bundle_copy(const st_bundle* b, const char* name, const char* edit, int arg) {
  char* dir = malloc(512);
  snprintf(dir, 512, "%s/%s", g_tmp, name);
  char* python = st_bundle_python();
  char cmd[4096];
  snprintf(cmd, sizeof(cmd),
           "rm -rf '%s' && cp -r '%s' '%s' && '%s' - '%s/manifest.json' %d <<'EOF'\n"
           "import json, sys\n"
           "path, arg = sys.argv[1], int(sys.argv[2])\n"
           "m = json.load(open(path))\n"
           "p = {q['name']: q for q in m['programs']}\n"
           "%s\n"
           "json.dump(m, open(path, 'w'))\n"
           "EOF",
           dir, b->dir, dir, python, dir, arg, edit);
  free(python);
  assert_int_equal(system(cmd), 0);
  return dir;
}

/* |extra| more residuals between block_fwd_res and block_bwd_res. */
static char* crafted_bundle(const st_bundle* b, int extra) {
  char name[64];
  snprintf(name, sizeof(name), "crafted-%d", extra);
  return edited_bundle_copy(b, name,
                            "r = p['block_fwd_res']['outputs'][1]\n"
                            "more = [dict(r, name='crafted%d' % i) for i in range(arg)]\n"
                            "p['block_fwd_res']['outputs'] += more\n"
                            "bwd = p['block_bwd_res']['inputs']\n"
                            "p['block_bwd_res']['inputs'] = bwd[:-1] + more + bwd[-1:]",
                            extra);
}

/* Options for building (not running) one-microbatch plans. */
static void plan_options(st_plan_options* o) {
  memset(o, 0, sizeof(*o));
  o->microbatches = 1;
  o->batch_size = 2;
  o->eval_batches = 1;
}

/* Issue 11, item 9: step_plan.c kept residuals in fixed arrays (res[32],
 * dead[33], a forward out[40]) while nothing bounded a program's output
 * count, so a crafted bundle overflowed the stack (UBSan: index 32 out of
 * bounds). Now the bundle reader refuses counts beyond
 * ST_BUNDLE_MAX_PROGRAM_TENSORS, and the plan builder refuses more
 * residuals than it holds. */
static void test_crafted_bundle_counts_are_bounded(void** state) {
  (void)state;
  st_bundle* b = ensure_bundle(2, true);
  /* 48 residuals: within the bundle's limit, beyond what the plan builder
   * handles; it says so (a bundle error), nothing overflows. */
  char* dir = crafted_bundle(b, 40);
  st_bundle* c = NULL;
  ASSERT_OK(st_bundle_open(dir, &c));
  st_plan_options o;
  plan_options(&o);
  st_plan step, eval;
  st_status s = st_plan_build(c, &o, &step, &eval, NULL);
  if (s) {
    assert_int_equal(st_status_code(s), ST_CODE_RUNTIME);
    st_status_free(s);
  } else {
    st_plan_deinit(&step);
    st_plan_deinit(&eval);
  }
  st_bundle_destroy(c);
  free(dir);
  /* Past the limit: refused as a bundle error (exit 4), naming the limit. */
  dir = crafted_bundle(b, ST_BUNDLE_MAX_PROGRAM_TENSORS);
  c = NULL;
  s = st_bundle_open(dir, &c);
  if (!s) {
    /* What the unbounded reader did: hand the plan builder the bundle. */
    st_status_free(st_plan_build(c, &o, &step, &eval, NULL));
    fail_msg("a bundle with %d residuals was accepted", ST_BUNDLE_MAX_PROGRAM_TENSORS + 8);
  }
  assert_int_equal(st_status_code(s), ST_CODE_RUNTIME);
  assert_non_null(strstr(st_status_message(s), "ST_BUNDLE_MAX_PROGRAM_TENSORS"));
  printf("# %s\n", st_status_message(s));
  st_status_free(s);
  assert_null(c);
  free(dir);
  st_bundle_destroy(b);
}

/* The embedding's programs take its group's parameters, then tokens (and
 * dx): the plan builder indexes their inputs by the group's count, so a
 * crafted embed_fwd without its tokens input is a bundle error, not a read
 * past the inputs (ASan: heap-buffer-overflow before the check). */
static void test_embed_programs_must_match_the_embed_group(void** state) {
  (void)state;
  st_bundle* b = ensure_bundle(2, true);
  char* dir = edited_bundle_copy(b, "crafted-embed", "p['embed_fwd']['inputs'] = p['embed_fwd']['inputs'][:1]", 0);
  st_bundle* c = NULL;
  ASSERT_OK(st_bundle_open(dir, &c));
  st_plan_options o;
  plan_options(&o);
  st_plan step, eval;
  st_status s = st_plan_build(c, &o, &step, &eval, NULL);
  assert_non_null(s);
  assert_int_equal(st_status_code(s), ST_CODE_RUNTIME);
  assert_non_null(strstr(st_status_message(s), "the embedding's programs do not match"));
  st_status_free(s);
  st_bundle_destroy(c);
  st_bundle_destroy(b);
  free(dir);
}

/* Greedy tokens of |b| with parameters |host| (by parameter index). */
static void generate(st_runtime* rt, const st_bundle* b, void** host, int32_t* ids, int n) {
  st_infer_sampler* sm = NULL;
  ASSERT_OK(st_infer_sampler_create(rt, b, (const void* const*)host, &sm));
  st_infer_sample_options o = {.tokens = n, .temperature = 0, .top_p = 1, .seed = 1, .byte_text = true};
  const int32_t prompt[3] = {'a', 'b', 'c'};
  ASSERT_OK(st_infer_generate(sm, prompt, 3, &o, ids));
  st_infer_sampler_destroy(sm);
}

/* The generation driver launches the programs the tables name for the
 * roles prefill, decode and logits: a bundle with every program renamed
 * and layer 1 served by programs of its own generates the same tokens
 * (past seq_len, so the window slides and prefills again). */
static void test_sampler_takes_program_names_from_the_bundle(void** state) {
  (void)state;
  st_bundle* b = ensure_bundle(2, true);
  st_bundle* r = open_renamed_copy(b, "renamed_gen");
  assert_string_equal(r->layers[1].decode->name, "layer1_decode");
  assert_string_equal(r->head.logits->name, "head_logits_v2");

  void** host = calloc((size_t)b->param_count, sizeof(void*));
  uint64_t x = 42;
  for (int i = 0; i < b->param_count; ++i) {
    int64_t n = st_tensor_type_elements(&b->params[i].type);
    float* f = calloc((size_t)n, sizeof(float));
    for (int64_t k = 0; k < n; ++k) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      /* norms 1, matrices a wide uniform init: varied greedy choices */
      f[k] = b->params[i].type.rank < 2 ? 1.0f : (float)((double)(x >> 40) / (double)(1 << 24) - 0.5);
    }
    host[i] = f;
  }
  st_runtime_options ro;
  st_runtime_options_init(&ro);
  ro.cpu_devices = 1;
  char cache[512];
  snprintf(cache, sizeof(cache), "%s/exe_gen", g_tmp);
  ro.cache_dir = cache; /* the renamed bundle's programs are the same texts: loaded, not compiled again */
  st_runtime* rt = NULL;
  ASSERT_OK(st_runtime_create(&ro, &rt));
  int32_t a[24], c[24];
  generate(rt, b, host, a, 24); /* 3 + 24 > seq_len 16 */
  generate(rt, r, host, c, 24);
  assert_memory_equal(a, c, sizeof(a));
  int distinct = 0;
  printf("# greedy ids:");
  for (int i = 0; i < 24; ++i) printf(" %d", (int)a[i]);
  printf("\n");
  for (int i = 0; i < 24; ++i) {
    assert_true(a[i] >= 0 && a[i] < 256);
    bool seen = false;
    for (int j = 0; j < i; ++j) seen |= a[j] == a[i];
    distinct += !seen;
  }
  assert_true(distinct > 2);

  /* A bundle without the generation roles (an older exporter) is refused by name. */
  r->head.logits = NULL;
  st_infer_sampler* sm = NULL;
  st_status s = st_infer_sampler_create(rt, r, (const void* const*)host, &sm);
  assert_int_equal(st_status_code(s), ST_CODE_RUNTIME);
  assert_non_null(strstr(st_status_message(s), "re-export"));
  st_status_free(s);
  for (int i = 0; i < b->param_count; ++i) free(host[i]);
  free(host);
  st_runtime_destroy(rt);
  st_bundle_destroy(r);
  st_bundle_destroy(b);
}

/* docs/model.md, "Sampling": greedy, the candidate restriction, top-k,
 * top-p, the temperature's distribution, and the PRNG. */
static void test_sample_pick(void** state) {
  (void)state;
  st_infer_rng rng;
  st_infer_rng_seed(&rng, 0);
  assert_true(st_infer_rng_next(&rng) == UINT64_C(0xE220A8397B1DCDAF)); /* splitmix64's published first value */
  const float l[6] = {0.5f, 2.0f, 2.0f, -1.0f, 1.9f, 9.0f};
  st_infer_sample_options o = {.tokens = 1, .temperature = 0, .top_k = 0, .top_p = 1, .seed = 0};
  assert_int_equal(st_infer_pick(l, 6, 6, &o, &rng), 5);
  assert_int_equal(st_infer_pick(l, 6, 5, &o, &rng), 1); /* id 5 not a candidate; a tie goes to the smaller id */
  o.temperature = 1.0;
  o.top_k = 1;
  for (int i = 0; i < 100; ++i) assert_int_equal(st_infer_pick(l, 6, 5, &o, &rng), 1);
  o.top_k = 0;
  o.top_p = 0.3; /* p(1) = p(2) ~ 0.33 each: 1 alone reaches 0.3 */
  for (int i = 0; i < 100; ++i) assert_int_equal(st_infer_pick(l, 6, 5, &o, &rng), 1);
  o.top_p = 0.5; /* 1 and 2 */
  int seen[6] = {0};
  for (int i = 0; i < 1000; ++i) seen[st_infer_pick(l, 6, 5, &o, &rng)]++;
  assert_true(seen[1] > 400 && seen[2] > 400 && seen[1] + seen[2] == 1000);
  /* Temperature: logits {0, ln 2} -> p = {1/3, 2/3}; at temperature 2, {0.414, 0.586}. */
  const float two[2] = {0.0f, (float)log(2.0)};
  o.top_p = 1;
  const double temps[2] = {1.0, 2.0}, want[2] = {2.0 / 3.0, 1.0 / (1.0 + pow(2.0, -0.5))};
  for (int t = 0; t < 2; ++t) {
    o.temperature = temps[t];
    int ones = 0;
    for (int i = 0; i < 20000; ++i) ones += st_infer_pick(two, 2, 2, &o, &rng);
    assert_true(fabs(ones / 20000.0 - want[t]) < 0.015);
  }
  /* The same seed draws the same ids. */
  int32_t a[50], b[50];
  for (int r = 0; r < 2; ++r) {
    st_infer_rng_seed(&rng, 77);
    for (int i = 0; i < 50; ++i) (r ? b : a)[i] = st_infer_pick(l, 6, 6, &o, &rng);
  }
  assert_memory_equal(a, b, sizeof(a));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_export_does_not_repeat_buffered_stdout),
      cmocka_unit_test(test_program_count_independent_of_depth),
      cmocka_unit_test(test_block_backward_matches_finite_differences),
      cmocka_unit_test(test_plan_takes_program_names_from_the_bundle),
      cmocka_unit_test(test_plan_reads_block_metrics),
      cmocka_unit_test(test_crafted_bundle_counts_are_bounded),
      cmocka_unit_test(test_embed_programs_must_match_the_embed_group),
      cmocka_unit_test(test_sampler_takes_program_names_from_the_bundle),
      cmocka_unit_test(test_sample_pick),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
