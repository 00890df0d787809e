/* lint.c — the compile contract of a bundle (docs/analysis.md "Lint"):
 * every program must compile once, with static shapes, and run inside
 * strata's runtime with no Python beside it. Run by st_bundle_ensure on
 * every bundle a run or `strata plan`/`analyze` opens through it (errors
 * stop it: exit 4, naming program, line and op; warnings go to the run's
 * `bundle` event), and by `strata analyze --lint`.
 *
 * From the StableHLO reader's findings (src/ir/, one per op):
 *   dynamic_shape   error   a '?' dimension or a dynamic_* shape op: PJRT
 *                           compiles static shapes; strata sizes buffers
 *                           from the manifest
 *   host_callback   error   a Python callback: there is no Python in a run
 *   custom_call     error   a target not in kKnownTargets (XLA's own
 *                           sharding and placement annotations) nor among
 *                           the FFI targets of the manifest's "kernels"
 *                           (which the run then checks strata registers,
 *                           docs/kernels.md): a kernel the plugin may not have
 *   f64             warning slow or emulated on accelerators; JAX exports
 *                           f32 unless x64 is on
 * and from the manifest:
 *   per_layer_compile warning a layer-table role naming several programs
 *                           over the layers: each is compiled (one block
 *                           program should serve every layer)
 *   signature_changed error   a program of the same name whose inputs or
 *                           outputs differ from the previous bundle of the
 *                           same key: the key no longer names one contract */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/ir.h"

/* Custom-call targets XLA itself handles: sharding and memory-placement
 * annotations that jax.jit writes. */
static const char* const kKnownTargets[] = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
                                            "annotate_device_placement", "MoveToHost", "MoveToDevice", NULL};

static bool st__known_target(const char* t) {
  for (int i = 0; kKnownTargets[i]; ++i)
    if (!strcmp(t, kKnownTargets[i])) return true;
  return false;
}

static st_lint_finding* st__add(st_lint_report* r, st_lint_severity sev, const char* kind, const char* program,
                                const char* op, int line) {
  r->findings = st_xrealloc(r->findings, (size_t)(r->count + 1) * sizeof(*r->findings));
  st_lint_finding* f = &r->findings[r->count++];
  memset(f, 0, sizeof(*f));
  f->severity = sev;
  snprintf(f->kind, sizeof(f->kind), "%s", kind);
  snprintf(f->program, sizeof(f->program), "%s", program);
  snprintf(f->op, sizeof(f->op), "%s", op ? op : "");
  f->line = line;
  if (sev == ST_LINT_ERROR) r->errors++;
  else r->warnings++;
  return f;
}

/* A target the bundle's "kernels" declares (an ffi op's fwd/bwd). */
static bool st__declared_target(const st_bundle* b, const char* t) {
  for (int i = 0; b && i < b->kernel_count; ++i)
    for (int k = 0; k < b->kernels[i].target_count; ++k)
      if (!strcmp(b->kernels[i].targets[k], t)) return true;
  return false;
}

void st_lint_program_text(const char* program, const char* text, size_t size, st_lint_report* r) {
  st_lint_program_text_in(NULL, program, text, size, r);
}

void st_lint_program_text_in(const st_bundle* b, const char* program, const char* text, size_t size,
                             st_lint_report* r) {
  st_ir_stats st;
  st_status s = st_ir_analyze(text, size, program, &st);
  if (s) {
    st_lint_finding* f = st__add(r, ST_LINT_ERROR, "unreadable", program, "", 0);
    snprintf(f->message, sizeof(f->message), "%s", st_status_message(s));
    st_status_free(s);
    return;
  }
  for (int i = 0; i < st.n_findings; ++i) {
    const st_ir_finding* x = &st.findings[i];
    st_lint_finding* f = NULL;
    switch (x->kind) {
      case ST_IR_FIND_DYNAMIC_SHAPE:
        f = st__add(r, ST_LINT_ERROR, "dynamic_shape", program, x->op, x->line);
        snprintf(f->message, sizeof(f->message),
                 "a dynamic shape%s%s in @%s: programs must have static shapes (export with concrete shapes)",
                 x->detail[0] ? " op " : "", x->detail, x->func);
        break;
      case ST_IR_FIND_HOST_CALLBACK:
        f = st__add(r, ST_LINT_ERROR, "host_callback", program, x->op, x->line);
        snprintf(f->message, sizeof(f->message),
                 "a host callback (%s) in @%s: a run has no Python; remove jax.debug.print/pure_callback", x->detail,
                 x->func);
        break;
      case ST_IR_FIND_CUSTOM_CALL:
        if (st__known_target(x->detail) || st__declared_target(b, x->detail)) break;
        f = st__add(r, ST_LINT_ERROR, "custom_call", program, x->op, x->line);
        snprintf(f->message, sizeof(f->message),
                 "a custom call to '%s' in @%s: a kernel the PJRT plugin may not have; express it in StableHLO",
                 x->detail, x->func);
        break;
      case ST_IR_FIND_F64:
        f = st__add(r, ST_LINT_WARNING, "f64", program, x->op, x->line);
        snprintf(f->message, sizeof(f->message), "an f64 type in @%s: slow or emulated on accelerators (jax x64 on?)",
                 x->func);
        break;
    }
  }
  if (st.findings_dropped > 0) {
    st_lint_finding* f = st__add(r, ST_LINT_WARNING, "more", program, "", 0);
    snprintf(f->message, sizeof(f->message), "%lld more findings not listed", (long long)st.findings_dropped);
  }
  st_ir_stats_free(&st);
}

static void st__lint_file(const st_bundle* b, const st_bundle_program* p, st_lint_report* r) {
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(p->path, &text, &size);
  if (s) {
    st_lint_finding* f = st__add(r, ST_LINT_ERROR, "unreadable", p->name, "", 0);
    snprintf(f->message, sizeof(f->message), "%s", st_status_message(s));
    st_status_free(s);
    return;
  }
  st_lint_program_text_in(b, p->name, text, size, r);
  free(text);
}

static bool st__same_tensors(const st_bundle_tensor* a, int na, const st_bundle_tensor* b, int nb) {
  if (na != nb) return false;
  for (int i = 0; i < na; ++i) {
    if (a[i].type.dtype != b[i].type.dtype || a[i].type.rank != b[i].type.rank) return false;
    for (int d = 0; d < a[i].type.rank; ++d)
      if (a[i].type.dims[d] != b[i].type.dims[d]) return false;
  }
  return true;
}

bool st_bundle_same_signature(const st_bundle_program* a, const st_bundle_program* b) {
  return st__same_tensors(a->inputs, a->input_count, b->inputs, b->input_count) &&
         st__same_tensors(a->outputs, a->output_count, b->outputs, b->output_count);
}

void st_lint_bundle(const st_bundle* b, const st_bundle* previous, st_lint_report* r) {
  for (int i = 0; i < b->program_count; ++i) st__lint_file(b, &b->programs[i], r);
  for (int i = 0; i < b->collective_count; ++i) st__lint_file(b, &b->collectives[i], r);
  /* The layer table: one program per role should serve every layer. */
  static const char* const kRoles[] = {"init", "fwd", "bwd", "fwd_res", "bwd_res"};
  for (int k = 0; k < 5; ++k) {
    const st_bundle_program* first = NULL;
    int first_layer = -1;
    for (int l = 0; l < b->layer_count; ++l) {
      const st_bundle_stage* st = &b->layers[l];
      const st_bundle_program* p = k == 0 ? st->init : k == 1 ? st->fwd : k == 2 ? st->bwd : k == 3 ? st->fwd_res : st->bwd_res;
      if (!p) continue;
      if (!first) {
        first = p;
        first_layer = l;
        continue;
      }
      if (p == first || !strcmp(p->name, first->name)) continue;
      bool same_text = !strcmp(p->sha256, first->sha256);
      st_lint_finding* f = st__add(r, ST_LINT_WARNING, "per_layer_compile", "layers", "", 0);
      snprintf(f->message, sizeof(f->message),
               "the layer table's %s is %s at layer %d and %s at layer %d%s: each is compiled; one program "
               "should serve every layer",
               kRoles[k], first->name, first_layer, p->name, l, same_text ? " (identical text)" : "");
      break; /* one finding per role */
    }
  }
  if (previous && previous->key && b->key && !strcmp(previous->key, b->key)) {
    for (int i = 0; i < b->program_count; ++i) {
      const st_bundle_program* p = &b->programs[i];
      const st_bundle_program* q = st_bundle_program_find(previous, p->name);
      if (!q) continue;
      if (st_bundle_same_signature(p, q)) continue;
      st_lint_finding* f = st__add(r, ST_LINT_ERROR, "signature_changed", p->name, "", 0);
      snprintf(f->message, sizeof(f->message),
               "its inputs or outputs differ from the previous bundle of key %s (%d -> %d inputs, %d -> %d outputs): "
               "the key no longer names one contract",
               b->key, q->input_count, p->input_count, q->output_count, p->output_count);
    }
  }
}

st_status st_lint_status(const st_lint_report* r, const char* dir) {
  for (int i = 0; i < r->count; ++i) {
    const st_lint_finding* f = &r->findings[i];
    if (f->severity != ST_LINT_ERROR) continue;
    if (f->op[0])
      return st_status_make(ST_CODE_RUNTIME, "bundle %s: lint: program '%s', line %d, op %s: %s: %s%s", dir, f->program,
                            f->line, f->op, f->kind, f->message,
                            r->errors > 1 ? " (and more: strata analyze BUNDLE --lint)" : "");
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: lint: program '%s': %s: %s%s", dir, f->program, f->kind,
                          f->message, r->errors > 1 ? " (and more: strata analyze BUNDLE --lint)" : "");
  }
  return ST_OK;
}

json_t* st_lint_json(const st_lint_report* r) {
  json_t* a = st_json_arr();
  for (int i = 0; i < r->count; ++i) {
    const st_lint_finding* f = &r->findings[i];
    json_t* j = st_json_obj();
    st_json_put_str(j, "severity", f->severity == ST_LINT_ERROR ? "error" : "warning");
    st_json_put_str(j, "kind", f->kind);
    st_json_put_str(j, "program", f->program);
    st_json_put_str(j, "op", f->op);
    st_json_put_int(j, "line", f->line);
    st_json_put_str(j, "message", f->message);
    json_array_append_new(a, j);
  }
  return a;
}

void st_lint_report_free(st_lint_report* r) {
  if (!r) return;
  free(r->findings);
  memset(r, 0, sizeof(*r));
}
