/*
 * contract.c — the kernel contract: parsed from the JSON the build embeds
 * (python/strata_jax/kernel_contract.json, the same file the exporter
 * reads, so the two sides cannot drift), printed by `strata kernels list`.
 */
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "kernels/contract_json.h" /* generated: kContractJson, kContractJsonSize */
#include "kernels/contract_ops.h"  /* generated: ST__KERNEL_OPS */
#include "strata/base.h"
#include "strata/kernels.h"

static char* st__str(const json_t* o, const char* key) {
  const json_t* v = json_object_get(o, key);
  return st_xstrdup(json_is_string(v) ? json_string_value(v) : "");
}

/* "x [..., D] f32|bf16; gain [D] f32" from the inputs/outputs rows. */
static char* st__tensors(const json_t* arr) {
  st_strbuf b = {0};
  for (size_t i = 0; i < json_array_size(arr) && i < 16; ++i) {
    const json_t* t = json_array_get(arr, i);
    const json_t* dt = json_object_get(t, "dtypes");
    st_strbuf_printf(&b, "%s%s%s %s ", i ? "; " : "", json_is_true(json_object_get(t, "optional")) ? "optional " : "",
                     json_string_value(json_object_get(t, "name")) ?: "?",
                     json_string_value(json_object_get(t, "shape")) ?: "?");
    if (json_is_array(dt)) {
      for (size_t k = 0; k < json_array_size(dt) && k < 8; ++k)
        st_strbuf_printf(&b, "%s%s", k ? "|" : "", json_string_value(json_array_get(dt, k)) ?: "?");
    } else {
      st_strbuf_printf(&b, "%s", json_string_value(json_object_get(t, "dtype")) ?: "?");
    }
  }
  return st_strbuf_take(&b);
}

static st_status st__contract_num(const json_t* o, const char* key, const char* where, double* out) {
  const json_t* v = json_object_get(o, key);
  if (!json_is_number(v) || json_number_value(v) < 0)
    return st_status_make(ST_CODE_INTERNAL, "%s: %s is not a non-negative number", where, key);
  *out = json_number_value(v);
  return ST_OK;
}

/* Every target of ffi_targets: fwd, bwd, then the other keys (an optional
 * operand's form) in the file's order, as the handler table has them
 * (cmake/KernelContract.cmake). */
static st_status st__targets(const json_t* ft, const char* ctx, st_kernel_op* op) {
  if (ft && (!json_is_object(ft) || json_object_size(ft) > ST_KERNEL_MAX_TARGETS))
    return st_status_make(ST_CODE_INTERNAL, "%s: ffi_targets must be an object of at most %d targets", ctx,
                          ST_KERNEL_MAX_TARGETS);
  const char* firsts[2] = {"fwd", "bwd"};
  for (int pass = 0; pass < 3; ++pass) {
    const char* key;
    const json_t* v;
    json_object_foreach((json_t*)ft, key, v) {
      bool first = !strcmp(key, "fwd") || !strcmp(key, "bwd");
      if (pass < 2 ? strcmp(key, firsts[pass]) : first) continue;
      if (!json_is_string(v) || strlen(key) >= sizeof(op->target_dir[0]))
        return st_status_make(ST_CODE_INTERNAL, "%s: ffi_targets.%s must name a target (keys < 16 chars)", ctx, key);
      snprintf(op->target_dir[op->target_count], sizeof(op->target_dir[0]), "%s", key);
      op->targets[op->target_count++] = st_xstrdup(json_string_value(v));
    }
  }
  return ST_OK;
}

static st_status st__op(const json_t* j, const char* where, st_kernel_op* op) {
  char ctx[256];
  const char* name = NULL;
  int64_t version = 0;
  ST_RETURN(st_json_get_string(j, "name", where, &name));
  snprintf(ctx, sizeof(ctx), "%s: op '%s'", where, name);
  ST_RETURN(st_json_get_int(j, "version", ctx, &version));
  if (version < 1 || version > 1000000) return st_status_make(ST_CODE_INTERNAL, "%s: version out of range", ctx);
  op->name = st_xstrdup(name);
  op->version = (int)version;
  op->math = st__str(j, "math");
  op->inputs = st__tensors(json_object_get(j, "inputs"));
  op->outputs = st__tensors(json_object_get(j, "outputs"));
  op->layout = st__str(j, "layout");
  op->sharding = st__str(j, "sharding");
  op->accumulator = st__str(j, "accumulator");
  op->padding = st__str(j, "padding");
  op->tile = st__str(j, "tile");
  op->has_backward = json_is_true(json_object_get(j, "has_backward"));
  op->fallback = st__str(j, "fallback");
  op->profile_label = st__str(j, "profile_label");
  /* Optional: a row without it resolves auto to xla everywhere. */
  const json_t* def = json_object_get(j, "default");
  if (def && (!json_is_object(def) || json_object_size(def) > ST_KERNEL_MAX_DEFAULTS))
    return st_status_make(ST_CODE_INTERNAL,
                          "%s: default must be an object of at most %d platforms, each naming an implementation "
                          "({\"cpu\": \"ffi\", \"other\": \"xla\"})",
                          ctx, ST_KERNEL_MAX_DEFAULTS);
  const char* plat;
  const json_t* dv;
  json_object_foreach((json_t*)def, plat, dv) {
    if (!json_is_string(dv) || strlen(plat) >= sizeof(op->default_platform[0]))
      return st_status_make(ST_CODE_INTERNAL, "%s: default.%s must name an implementation (platform names < 16 chars)",
                            ctx, plat);
    snprintf(op->default_platform[op->default_count], sizeof(op->default_platform[0]), "%s", plat);
    op->default_impl[op->default_count++] = st_xstrdup(json_string_value(dv));
  }
  const json_t* ft = json_object_get(j, "ffi_targets");
  op->ffi_fwd = st__str(ft, "fwd");
  op->ffi_bwd = st__str(ft, "bwd");
  ST_RETURN(st__targets(ft, ctx, op));
  const json_t* impls = json_object_get(j, "implementations");
  if (!json_is_array(impls) || json_array_size(impls) < 1 || json_array_size(impls) > ST_KERNEL_MAX_IMPLS)
    return st_status_make(ST_CODE_INTERNAL, "%s: implementations must list 1..%d names", ctx, ST_KERNEL_MAX_IMPLS);
  for (size_t i = 0; i < json_array_size(impls); ++i) {
    const json_t* v = json_array_get(impls, i);
    if (!json_is_string(v)) return st_status_make(ST_CODE_INTERNAL, "%s: implementations[%zu] is not a name", ctx, i);
    op->impls[op->impl_count++] = st_xstrdup(json_string_value(v));
  }
  for (int d = 0; d < op->default_count; ++d) {
    bool known = false;
    for (int k = 0; k < op->impl_count; ++k) known = known || !strcmp(op->impls[k], op->default_impl[d]);
    if (!known)
      return st_status_make(ST_CODE_INTERNAL, "%s: default.%s=%s is not one of its implementations", ctx,
                            op->default_platform[d], op->default_impl[d]);
  }
  const json_t* tol = json_object_get(j, "tolerance");
  if (!json_is_object(tol) || json_object_size(tol) < 1 || json_object_size(tol) > ST_KERNEL_MAX_TOLERANCES)
    return st_status_make(ST_CODE_INTERNAL, "%s: tolerance must give 1..%d dtypes", ctx, ST_KERNEL_MAX_TOLERANCES);
  const char* dtype;
  const json_t* row;
  json_object_foreach((json_t*)tol, dtype, row) {
    st_kernel_tolerance* t = &op->tolerances[op->tolerance_count++];
    snprintf(t->dtype, sizeof(t->dtype), "%s", dtype);
    const json_t *fwd = json_object_get(row, "fwd"), *bwd = json_object_get(row, "bwd");
    ST_RETURN(st__contract_num(fwd, "rtol", ctx, &t->fwd_rtol));
    ST_RETURN(st__contract_num(fwd, "atol", ctx, &t->fwd_atol));
    if (op->has_backward) {
      ST_RETURN(st__contract_num(bwd, "rtol", ctx, &t->bwd_rtol));
      ST_RETURN(st__contract_num(bwd, "atol", ctx, &t->bwd_atol));
    }
  }
  return ST_OK;
}

st_status st_kernel_contract_parse(const char* text, size_t size, const char* where, st_kernel_contract* out) {
  memset(out, 0, sizeof(*out));
  json_t* root = NULL;
  ST_RETURN(st_json_parse(text, size, where, &root));
  int64_t cv = 0;
  const json_t* ops = NULL;
  st_status s = st_json_get_int(root, "contract_version", where, &cv);
  if (!s) s = st_json_get_array(root, "ops", where, &ops);
  if (!s && json_array_size(ops) > ST_KERNEL_MAX_OPS)
    s = st_status_make(ST_CODE_INTERNAL, "%s: %zu ops exceed ST_KERNEL_MAX_OPS (%d)", where, json_array_size(ops),
                       ST_KERNEL_MAX_OPS);
  if (!s) {
    out->contract_version = (int)cv;
    out->ops = st_xcalloc(json_array_size(ops) + 1, sizeof(st_kernel_op));
    for (size_t i = 0; i < json_array_size(ops) && !s; ++i) {
      out->op_count = (int)i + 1;
      s = st__op(json_array_get(ops, i), where, &out->ops[i]);
    }
  }
  json_decref(root);
  if (s) st_kernel_contract_free(out);
  return s;
}

st_status st_kernel_contract_load(st_kernel_contract* out) {
  return st_kernel_contract_parse((const char*)kContractJson, kContractJsonSize,
                                  "the kernel contract compiled into strata (python/strata_jax/kernel_contract.json)",
                                  out);
}

#define ST__OP_NAME(op) #op,
static const char* const kOpNames[] = {ST__KERNEL_OPS(ST__OP_NAME)};

const char* const* st_kernels_op_names(int* count) {
  *count = (int)(sizeof(kOpNames) / sizeof(kOpNames[0]));
  return kOpNames;
}

void st_kernel_contract_free(st_kernel_contract* c) {
  if (!c) return;
  for (int i = 0; i < c->op_count; ++i) {
    st_kernel_op* o = &c->ops[i];
    char* strs[] = {o->name, o->math, o->inputs, o->outputs, o->layout, o->sharding, o->accumulator, o->padding,
                    o->tile, o->fallback, o->profile_label, o->ffi_fwd, o->ffi_bwd};
    for (size_t k = 0; k < sizeof(strs) / sizeof(strs[0]); ++k) free(strs[k]);
    for (int k = 0; k < o->default_count; ++k) free(o->default_impl[k]);
    for (int k = 0; k < o->impl_count; ++k) free(o->impls[k]);
    for (int k = 0; k < o->target_count; ++k) free(o->targets[k]);
  }
  free(c->ops);
  memset(c, 0, sizeof(*c));
}

const char* st_kernel_op_default(const st_kernel_op* op, const char* platform) {
  const char* other = "xla";
  for (int d = 0; op && d < op->default_count; ++d) {
    if (platform && platform[0] && !strcmp(op->default_platform[d], platform)) return op->default_impl[d];
    if (!strcmp(op->default_platform[d], "other")) other = op->default_impl[d];
  }
  return other;
}

const char* st_kernel_resolve(const st_kernel_contract* c, const char* op, const char* configured, const char* platform) {
  if (strcmp(configured, "auto")) return configured;
  const st_kernel_op* row = st_kernel_contract_find(c, op);
  return row ? st_kernel_op_default(row, platform) : "xla";
}

const st_kernel_op* st_kernel_contract_find(const st_kernel_contract* c, const char* name) {
  for (int i = 0; c && name && i < c->op_count; ++i)
    if (!strcmp(c->ops[i].name, name)) return &c->ops[i];
  return NULL;
}

const st_kernel_tolerance* st_kernel_op_tolerance(const st_kernel_op* op, const char* dtype) {
  for (int i = 0; op && i < op->tolerance_count; ++i)
    if (!strcmp(op->tolerances[i].dtype, dtype)) return &op->tolerances[i];
  return NULL;
}

static void st__impls(const st_kernel_op* o, char* buf, size_t n) {
  buf[0] = 0;
  for (int k = 0; k < o->impl_count; ++k) {
    size_t len = strlen(buf);
    snprintf(buf + len, n - len, "%s%s", k ? "|" : "", o->impls[k]);
  }
}

void st_kernel_contract_print(const st_kernel_contract* c, FILE* out) {
  fprintf(out, "kernel contract v%d: %d op%s (docs/kernels.md); C kernels use %s on this CPU\n", c->contract_version,
          c->op_count, c->op_count == 1 ? "" : "s", st_kernels_isa_name(st_kernels_isa()));
  for (int i = 0; i < c->op_count; ++i) {
    const st_kernel_op* o = &c->ops[i];
    char impls[128];
    st__impls(o, impls, sizeof(impls));
    fprintf(out, "\n%s v%d  %s\n", o->name, o->version, o->math);
    fprintf(out, "  inputs        %s\n", o->inputs);
    fprintf(out, "  outputs       %s\n", o->outputs);
    fprintf(out, "  layout        %s\n", o->layout);
    fprintf(out, "  sharding      %s\n", o->sharding);
    fprintf(out, "  accumulator   %s\n", o->accumulator);
    fprintf(out, "  padding       %s\n", o->padding);
    fprintf(out, "  tile          %s\n", o->tile);
    fprintf(out, "  backward      %s\n", o->has_backward ? "yes" : "no");
    for (int t = 0; t < o->tolerance_count; ++t) {
      const st_kernel_tolerance* x = &o->tolerances[t];
      fprintf(out, "  tolerance     %s fwd rtol %g atol %g", x->dtype, x->fwd_rtol, x->fwd_atol);
      if (o->has_backward) fprintf(out, "; bwd rtol %g atol %g", x->bwd_rtol, x->bwd_atol);
      fprintf(out, "\n");
    }
    char defs[160] = "";
    for (int d = 0; d < o->default_count; ++d)
      snprintf(defs + strlen(defs), sizeof(defs) - strlen(defs), "%s%s %s", d ? ", " : "", o->default_platform[d],
               o->default_impl[d]);
    fprintf(out, "  impls         %s (auto: %s; fallback %s)\n", impls, defs, o->fallback);
    if (o->ffi_fwd[0]) {
      fprintf(out, "  ffi targets   %s, %s", o->ffi_fwd, o->ffi_bwd[0] ? o->ffi_bwd : "-");
      for (int k = 0; k < o->target_count; ++k)
        if (strcmp(o->target_dir[k], "fwd") && strcmp(o->target_dir[k], "bwd"))
          fprintf(out, "%s%s", k == 2 ? "; with the optional input: " : ", ", o->targets[k]);
      fprintf(out, "\n");
    }
    fprintf(out, "  profile       %s\n", o->profile_label);
  }
}

json_t* st_kernel_contract_json(const st_kernel_contract* c) {
  json_t* root = st_json_obj();
  st_json_put_int(root, "contract_version", c->contract_version);
  st_json_put_str(root, "isa", st_kernels_isa_name(st_kernels_isa()));
  json_t* ops = json_array();
  for (int i = 0; i < c->op_count; ++i) {
    const st_kernel_op* o = &c->ops[i];
    json_t* j = st_json_obj();
    st_json_put_str(j, "name", o->name);
    st_json_put_int(j, "version", o->version);
    st_json_put_str(j, "math", o->math);
    st_json_put_str(j, "inputs", o->inputs);
    st_json_put_str(j, "outputs", o->outputs);
    st_json_put_str(j, "layout", o->layout);
    st_json_put_str(j, "sharding", o->sharding);
    st_json_put_str(j, "accumulator", o->accumulator);
    st_json_put_str(j, "padding", o->padding);
    st_json_put_str(j, "tile", o->tile);
    st_json_put_bool(j, "has_backward", o->has_backward);
    json_t* tol = st_json_obj();
    for (int t = 0; t < o->tolerance_count; ++t) {
      const st_kernel_tolerance* x = &o->tolerances[t];
      json_t* row = st_json_obj();
      st_json_put_num(row, "fwd_rtol", x->fwd_rtol);
      st_json_put_num(row, "fwd_atol", x->fwd_atol);
      if (o->has_backward) {
        st_json_put_num(row, "bwd_rtol", x->bwd_rtol);
        st_json_put_num(row, "bwd_atol", x->bwd_atol);
      }
      json_object_set_new(tol, x->dtype, row);
    }
    json_object_set_new(j, "tolerance", tol);
    json_t* impls = json_array();
    for (int k = 0; k < o->impl_count; ++k) json_array_append_new(impls, json_string(o->impls[k]));
    json_object_set_new(j, "implementations", impls);
    json_t* defs = st_json_obj();
    for (int d = 0; d < o->default_count; ++d) st_json_put_str(defs, o->default_platform[d], o->default_impl[d]);
    json_object_set_new(j, "default", defs);
    st_json_put_str(j, "fallback", o->fallback);
    st_json_put_str(j, "ffi_fwd", o->ffi_fwd);
    st_json_put_str(j, "ffi_bwd", o->ffi_bwd);
    json_t* targets = st_json_obj();
    for (int k = 0; k < o->target_count; ++k) st_json_put_str(targets, o->target_dir[k], o->targets[k]);
    json_object_set_new(j, "ffi_targets", targets);
    st_json_put_str(j, "profile_label", o->profile_label);
    json_array_append_new(ops, j);
  }
  json_object_set_new(root, "ops", ops);
  return root;
}
