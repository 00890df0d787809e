/* cmd_plan.c — `strata plan [--json] [--explain] [--compile] CONFIG [k=v ...]`:
 * the ops of one training step (and of one evaluation), with predicted live
 * bytes; or, with --explain, where the plan puts every tensor on the mesh
 * and what it communicates (src/plan/explain.c). Exports the bundle if needed;
 * compiles nothing unless --compile, which compiles the plans' programs
 * (through the executable cache) to add XLA's temporaries per program. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <jansson.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/kernels.h"
#include "strata/train.h"

/* sched.remat=auto with a fractional sched.memory_budget needs the
 * devices' memory, which only the plugin knows; --compile and --fit
 * compile through it. Whether this plan needs the runtime at all. */
static bool st__plan_needs_runtime(const st_plan_options* o, bool compile, bool fit) {
  if (compile || fit) return true;
  return o->sched.remat.kind == ST_CONFIG_REMAT_AUTO && o->sched.memory_budget_fraction > 0;
}

/* The least device memory among the devices the plan uses. */
static void st__plan_device_memory(st_plan_options* o, st_runtime* rt) {
  int used = (o->parallel_data > 1 ? o->parallel_data : 1) * (o->parallel_fsdp > 1 ? o->parallel_fsdp : 1) *
             (o->parallel_tensor > 1 ? o->parallel_tensor : 1);
  for (int d = 0; d < used; ++d) {
    int64_t m = st_runtime_device_memory(rt, d);
    if (d == 0 || m < o->device_memory) o->device_memory = m;
  }
}

/* --fit: the predicted peak against the device's memory, the policies
 * that would fit, and exit 4 when it does not (unless
 * sched.allow_overcommit). */
static st_status st__plan_fit(st_plan_options* o, st_runtime* rt, const st_bundle* bundle, const st_plan* step,
                              bool json) {
  st_plan_fit_report r;
  st_status s = st_plan_fit(rt, bundle, o, step, true, &r);
  if (s) return s;
  if (json) {
    json_t* j = st_json_obj();
    st_json_put_str(j, "bundle", bundle->dir);
    st_json_put(j, "fit", st_plan_fit_json(&r));
    st_cli_print_json(j, 0);
    json_decref(j);
  } else {
    printf("# bundle %s\n# policy: %s\n", bundle->dir, step->policy ? step->policy : "");
    st_plan_fit_print(&r, stdout);
  }
  s = st_plan_fit_status(&r, o);
  if (s && o->allow_overcommit) {
    fprintf(stderr, "strata: warning: %s (sched.allow_overcommit=true: going on)\n", st_status_message(s));
    st_status_free(s);
    s = ST_OK;
  }
  return s;
}

/* Memory per layer, from the bundle's tables: its block kind, its
 * parameters (whole tensors) and its state (with their gradients and
 * optimizer state: AdamW's moments make it four times the parameters), the
 * residuals its training forward keeps per microbatch (per device), and
 * whether the plan recomputes it instead. Layers of different kinds differ
 * here, which is what a heterogeneous stack needs to see. */
static void st__print_layer_memory(const st_bundle* b, const st_plan_remat_choice* remat) {
  bool x4 = true; /* AdamW everywhere: the header says so, as it always did */
  for (int l = 0; l < b->layer_count; ++l) {
    int64_t params = 0;
    for (int i = 0; i < b->param_count; ++i)
      if (b->params[i].layer == l) params += st_tensor_type_bytes(&b->params[i].type);
    x4 = x4 && st_plan_layer_state_bytes(b, l) == 2 * params;
  }
  printf("# per layer: kind, parameter bytes (%s), residual bytes per microbatch\n",
         x4 ? "x4 with gradients and AdamW m, v" : "state: with gradients and optimizer state");
  for (int l = 0; l < b->layer_count; ++l) {
    const st_bundle_stage* st = &b->layers[l];
    int64_t params = 0, res = 0;
    for (int i = 0; i < b->param_count; ++i)
      if (b->params[i].layer == l) params += st_tensor_type_bytes(&b->params[i].type);
    /* after y and the block's metrics (docs/bundle.md, "Block metrics"), which are read, not kept */
    for (int i = st->fwd_res ? 1 + st_plan_metric_outputs(st->fwd_res) : 1; st->fwd_res && i < st->fwd_res->output_count; ++i)
      res += st_tensor_type_bytes(&st->fwd_res->outputs[i].type);
    bool recomputed = remat->remat && l < remat->layers && remat->remat[l];
    printf("# layer %-3d %-10s params %lld B  state %lld B  residuals %lld B%s\n", l, st->kind[0] ? st->kind : st->group->name,
           (long long)params, (long long)(2 * params + st_plan_layer_state_bytes(b, l)), (long long)res, recomputed ? " (recomputed: not kept)" : "");
  }
}

int st_cli_plan(int argc, char** argv) {
  bool json = false, explain = false, compile = false, fit = false;
  while (argc > 0 && (!strcmp(argv[0], "--json") || !strcmp(argv[0], "--explain") || !strcmp(argv[0], "--compile") ||
                      !strcmp(argv[0], "--fit"))) {
    if (!strcmp(argv[0], "--json")) json = true;
    else if (!strcmp(argv[0], "--compile")) compile = true;
    else if (!strcmp(argv[0], "--fit")) fit = compile = true;
    else explain = true;
    --argc;
    ++argv;
  }
  st_config* cfg = NULL;
  st_status s = st_cli_load_config("plan", argc, argv, &cfg);
  st_plan_options o;
  st_plan_open_options how = {.progress = true};
  st_plan_opened opened;
  memset(&opened, 0, sizeof(opened));
  const st_bundle* bundle = NULL;
  st_plan step, eval;
  st_plan_init(&step);
  st_plan_init(&eval);
  st_plan_remat_choice remat;
  memset(&remat, 0, sizeof(remat));
  if (!s) {
    s = st_plan_options_from_config(cfg, &o);
    if (!s) st_plan_kernel_selection_note(&o, stderr);
    /* --compile and --fit compile the bundle's programs: the opener
     * registers the kernels they call before the client, as train does. */
    if (!s) s = st_plan_open_bundle(&o, &how, &opened);
    bundle = opened.bundle;
    if (!s && st__plan_needs_runtime(&o, compile, fit)) s = st_plan_open_runtime(&o, &how, &opened);
    if (!s && opened.runtime) st__plan_device_memory(&o, opened.runtime);
    if (!s) s = st_plan_build(bundle, &o, &step, &eval, &remat);
    if (!s && compile) {
      st_plan* plans[2] = {&step, &eval};
      s = st_plan_compile_temps(opened.runtime, bundle, plans, 2);
    }
    if (!s && fit) {
      s = st__plan_fit(&o, opened.runtime, bundle, &step, json);
    } else if (!s && explain) {
      json_t* e = st_plan_explain_json(&step, &eval, &o);
      if (json) {
        json_t* j = st_json_obj();
        st_json_put_str(j, "bundle", bundle->dir);
        st_json_put(j, "explain", e);
        st_cli_print_json(j, 0);
        json_decref(j);
      } else {
        printf("# bundle %s\n", bundle->dir);
        st_plan_explain_print(&step, e, stdout);
        json_decref(e);
      }
    } else if (!s && json) {
      json_t* j = st_json_obj();
      st_json_put_str(j, "bundle", bundle->dir);
      json_t* sj = st_plan_json(&step);
      st_json_put(sj, "remat", st_plan_remat_choice_json(&remat));
      st_json_put(j, "step", sj);
      st_json_put(j, "eval", st_plan_json(&eval));
      st_cli_print_json(j, 0);
      json_decref(j);
    } else if (!s) {
      printf("# bundle %s\n# training step\n", bundle->dir);
      if (remat.automatic) printf("# remat auto: %s\n", remat.why);
      st__print_layer_memory(bundle, &remat);
      st_plan_print(&step, stdout);
      printf("# evaluation\n");
      st_plan_print(&eval, stdout);
    }
    st_plan_close(&opened); /* before the options: the runtime borrows their runtime.cache_dir */
    st_plan_options_deinit(&o);
  }
  st_plan_deinit(&step);
  st_plan_deinit(&eval);
  st_plan_remat_choice_deinit(&remat);
  st_config_destroy(cfg);
  return st_cli_report(s);
}
