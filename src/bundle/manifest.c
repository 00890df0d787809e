/* manifest.c — reads and validates a bundle's manifest.json and program
 * files (docs/bundle.md), and instantiates its parameter table for a depth. */
#include <stdio.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "bundle/bundle_internal.h"
#include "strata/base.h"
#include "strata/bundle.h"

/*===-------------------------------------------------------------------===*/
/* Manifest parsing                                                         */
/*===-------------------------------------------------------------------===*/

static st_status st__tensor_type_from_json(const json_t* t, const char* where, st_tensor_type* out) {
  const char* dtype = NULL;
  const json_t* shape = NULL;
  ST_RETURN(st_json_get_string(t, "dtype", where, &dtype));
  ST_RETURN(st_json_get_array(t, "shape", where, &shape));
  memset(out, 0, sizeof(*out));
  out->dtype = st_dtype_parse(dtype);
  if (out->dtype == ST_DTYPE_INVALID) return st_status_make(ST_CODE_RUNTIME, "%s: unknown dtype '%s'", where, dtype);
  size_t rank = json_array_size(shape);
  if (rank > ST_MAX_RANK) return st_status_make(ST_CODE_RUNTIME, "%s: rank %zu exceeds %d", where, rank, ST_MAX_RANK);
  out->rank = (int)rank;
  for (size_t i = 0; i < rank; ++i) {
    int64_t d = -1;
    if (!st_json_as_int(json_array_get(shape, i), &d) || d < 0)
      return st_status_make(ST_CODE_RUNTIME, "%s: dimension %zu is not a non-negative integer (dynamic shapes are not supported)",
                            where, i);
    if (d > ST_BUNDLE_MAX_DIM)
      return st_status_make(ST_CODE_RUNTIME, "%s: dimension %zu is %lld, above the limit of 2^40 (ST_BUNDLE_MAX_DIM)", where, i,
                            (long long)d);
    out->dims[i] = d;
  }
  if (st_tensor_type_bytes(out) == SIZE_MAX) return st_status_make(ST_CODE_RUNTIME, "%s: the tensor's size overflows", where);
  return ST_OK;
}

/* Every count read from the manifest is checked against its limit before
 * anything is sized from it. */
static st_status st__manifest_count(const json_t* arr, size_t limit, const char* where, const char* what, const char* name) {
  if (json_array_size(arr) > limit)
    return st_status_make(ST_CODE_RUNTIME, "%s: %zu %s exceeds the limit of %zu (%s, docs/bundle.md \"Limits\")", where,
                          json_array_size(arr), what, limit, name);
  return ST_OK;
}

static st_status st__tensors_from_json(const json_t* arr, const char* where, const char* what, int* out_count,
                                       st_bundle_tensor** out) {
  ST_RETURN(st__manifest_count(arr, ST_BUNDLE_MAX_PROGRAM_TENSORS, where, what, "ST_BUNDLE_MAX_PROGRAM_TENSORS"));
  size_t n = json_array_size(arr);
  *out_count = (int)n;
  *out = st_xcalloc(n ? n : 1, sizeof(st_bundle_tensor));
  for (size_t i = 0; i < n; ++i) {
    const json_t* t = json_array_get(arr, i);
    char ctx[256];
    snprintf(ctx, sizeof(ctx), "%s[%zu]", where, i);
    const char* name = NULL;
    const char* role = NULL;
    ST_RETURN(st_json_get_string(t, "name", ctx, &name));
    ST_RETURN(st_json_get_string(t, "role", ctx, &role));
    (*out)[i].name = st_xstrdup(name);
    (*out)[i].role = st_xstrdup(role);
    ST_RETURN(st__tensor_type_from_json(t, ctx, &(*out)[i].type));
  }
  return ST_OK;
}

static double st__number_or(const json_t* v, double fallback) { return json_is_number(v) ? json_number_value(v) : fallback; }

static st_status st__model_from_json(const json_t* m, const char* where, st_bundle_model* out) {
  if (!json_is_object(m)) return st_status_make(ST_CODE_RUNTIME, "%s: 'model' is missing", where);
  ST_RETURN(st_json_get_int(m, "vocab_size", where, &out->vocab_size));
  ST_RETURN(st_json_get_int(m, "d_model", where, &out->d_model));
  ST_RETURN(st_json_get_int(m, "n_layers", where, &out->n_layers));
  ST_RETURN(st_json_get_int(m, "n_heads", where, &out->n_heads));
  ST_RETURN(st_json_get_int(m, "d_ff", where, &out->d_ff));
  ST_RETURN(st_json_get_int(m, "seq_len", where, &out->seq_len));
  ST_RETURN(st_json_get_int(m, "microbatch_size", where, &out->microbatch_size));
  /* Sizes are computed from these; a positive int keeps every product in
   * range of the checks that follow. */
  const int64_t* ints[] = {&out->vocab_size, &out->d_model, &out->n_layers, &out->n_heads, &out->d_ff, &out->seq_len, &out->microbatch_size};
  const char* names[] = {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "seq_len", "microbatch_size"};
  for (int i = 0; i < 7; ++i)
    if (*ints[i] < 1 || *ints[i] > INT32_MAX)
      return st_status_make(ST_CODE_RUNTIME, "%s: model.%s is %lld, not in [1, 2^31)", where, names[i], (long long)*ints[i]);
  if (out->n_layers > ST_BUNDLE_MAX_LAYERS)
    return st_status_make(ST_CODE_RUNTIME, "%s: model.n_layers %lld exceeds the limit of %d (ST_BUNDLE_MAX_LAYERS)", where,
                          (long long)out->n_layers, ST_BUNDLE_MAX_LAYERS);
  out->tie_embeddings = json_is_true(json_object_get(m, "tie_embeddings"));
  const char* cd = "f32";
  ST_RETURN(st_json_get_string(m, "compute_dtype", where, &cd));
  snprintf(out->compute_dtype, sizeof(out->compute_dtype), "%s", cd);
  out->rope_theta = st__number_or(json_object_get(m, "rope_theta"), 0);
  out->init_std = st__number_or(json_object_get(m, "init_std"), 0);
  return ST_OK;
}

/*===-------------------------------------------------------------------===*/
/* Program tables: which program plays which role (docs/bundle.md)         */
/*===-------------------------------------------------------------------===*/

/* A role's program: a name the "programs" list must have. */
static st_status st__role_program(const st_bundle* b, const json_t* progs, const char* role, const char* where,
                                  const st_bundle_program** out) {
  const json_t* v = json_object_get(progs, role);
  if (!v) return ST_OK;
  if (!json_is_string(v)) return st_status_make(ST_CODE_RUNTIME, "%s: programs.%s is not a program name", where, role);
  *out = st_bundle_program_find(b, json_string_value(v));
  if (!*out) *out = st_bundle_collective_find(b, json_string_value(v)); /* a tensor-parallel SPMD program */
  if (!*out)
    return st_status_make(ST_CODE_RUNTIME, "%s: programs.%s names '%s', which the bundle's programs list lacks", where,
                          role, json_string_value(v));
  return ST_OK;
}

/* Fills |out| from {"group": ..., "programs": {role: name}}; |required| is
 * a space-separated list of roles the stage must have. Unknown roles are
 * ignored: a newer exporter may name programs this reader does not use. */
static st_status st__stage_from_json(const st_bundle* b, const json_t* sj, const char* where, const char* required,
                                     st_bundle_stage* out) {
  if (!json_is_object(sj))
    return st_status_make(ST_CODE_RUNTIME, "%s is missing (a bundle from an older strata_jax: re-export it)", where);
  const char* group = NULL;
  ST_RETURN(st_json_get_string(sj, "group", where, &group));
  out->group = st_bundle_group_find(b, group);
  if (!out->group) return st_status_make(ST_CODE_RUNTIME, "%s: group '%s' is not in the groups list", where, group);
  const json_t* progs = json_object_get(sj, "programs");
  if (!json_is_object(progs)) return st_status_make(ST_CODE_RUNTIME, "%s: no programs object", where);
  ST_RETURN(st__role_program(b, progs, "init", where, &out->init));
  ST_RETURN(st__role_program(b, progs, "fwd", where, &out->fwd));
  ST_RETURN(st__role_program(b, progs, "bwd", where, &out->bwd));
  ST_RETURN(st__role_program(b, progs, "fwd_res", where, &out->fwd_res));
  ST_RETURN(st__role_program(b, progs, "bwd_res", where, &out->bwd_res));
  ST_RETURN(st__role_program(b, progs, "loss", where, &out->loss));
  ST_RETURN(st__role_program(b, progs, "eval", where, &out->eval));
  ST_RETURN(st__role_program(b, progs, "prefill", where, &out->prefill));
  ST_RETURN(st__role_program(b, progs, "decode", where, &out->decode));
  ST_RETURN(st__role_program(b, progs, "logits", where, &out->logits));
  ST_RETURN(st__role_program(b, progs, "act_stats", where, &out->act_stats));
  ST_RETURN(st__role_program(b, progs, "accum_tied", where, &out->accum_tied));
  char role[16];
  for (const char* r = required; *r;) {
    size_t n = strcspn(r, " ");
    snprintf(role, sizeof(role), "%.*s", (int)n, r);
    if (!json_object_get(progs, role)) return st_status_make(ST_CODE_RUNTIME, "%s: programs has no '%s'", where, role);
    r += n + (r[n] == ' ');
  }
  return ST_OK;
}

static st_status st__tables_parse(st_bundle* b, const json_t* root, const char* mpath) {
  char where[300];
  const json_t* groups = json_object_get(root, "groups");
  for (int i = 0; i < b->group_count; ++i) {
    st_bundle_group* g = &b->groups[i];
    snprintf(where, sizeof(where), "%s: group '%s'", mpath, g->name);
    const json_t* progs = json_object_get(json_array_get(groups, (size_t)i), "programs");
    if (!json_is_object(progs))
      return st_status_make(ST_CODE_RUNTIME, "%s has no programs object (a bundle from an older strata_jax: re-export it)",
                            where);
    ST_RETURN(st__role_program(b, progs, "accum", where, &g->accum));
    ST_RETURN(st__role_program(b, progs, "sqnorm", where, &g->sqnorm));
    /* The update: "update" (any optimizer, docs/scheduling.md "Optimizer state"),
     * else "adamw" (a bundle of adamw everywhere, as every bundle before). */
    ST_RETURN(st__role_program(b, progs, "update", where, &g->update));
    if (!g->update) ST_RETURN(st__role_program(b, progs, "adamw", where, &g->update));
    ST_RETURN(st__role_program(b, progs, "update_stats", where, &g->update_stats));
    if (!g->update_stats) ST_RETURN(st__role_program(b, progs, "adamw_stats", where, &g->update_stats));
    if (!g->accum || !g->sqnorm || !g->update)
      return st_status_make(ST_CODE_RUNTIME, "%s: programs needs accum, sqnorm and update (or adamw)", where);
    const json_t* shard = json_object_get(json_array_get(groups, (size_t)i), "shard_programs");
    if (shard) {
      if (!json_is_object(shard)) return st_status_make(ST_CODE_RUNTIME, "%s: shard_programs is not an object", where);
      ST_RETURN(st__role_program(b, shard, "accum", where, &g->shard_accum));
      ST_RETURN(st__role_program(b, shard, "sqnorm", where, &g->shard_sqnorm));
      ST_RETURN(st__role_program(b, shard, "update", where, &g->shard_update));
      if (!g->shard_update) ST_RETURN(st__role_program(b, shard, "adamw", where, &g->shard_update));
      if (!g->shard_accum || !g->shard_sqnorm || !g->shard_update)
        return st_status_make(ST_CODE_RUNTIME, "%s: shard_programs needs accum, sqnorm and update (or adamw)", where);
    }
  }
  b->embed.index = b->head.index = -1;
  snprintf(where, sizeof(where), "%s: embed", mpath);
  ST_RETURN(st__stage_from_json(b, json_object_get(root, "embed"), where, "init fwd bwd", &b->embed));
  snprintf(where, sizeof(where), "%s: head", mpath);
  ST_RETURN(st__stage_from_json(b, json_object_get(root, "head"), where, "init loss eval", &b->head));
  const json_t* layers = NULL;
  ST_RETURN(st_json_get_array(root, "layers", mpath, &layers));
  size_t n_rows = json_array_size(layers);
  if ((int64_t)n_rows != b->model.n_layers)
    return st_status_make(ST_CODE_RUNTIME, "%s: the layer table has %zu rows for model.n_layers = %lld", mpath, n_rows,
                          (long long)b->model.n_layers);
  b->layers = st_xcalloc(n_rows + 1, sizeof(*b->layers));
  b->layer_count = (int)n_rows;
  for (int l = 0; l < b->layer_count; ++l) {
    snprintf(where, sizeof(where), "%s: layers[%d]", mpath, l);
    int64_t index = -1;
    const json_t* row = json_array_get(layers, (size_t)l);
    ST_RETURN(st_json_get_int(row, "index", where, &index));
    if (index != l) return st_status_make(ST_CODE_RUNTIME, "%s: index is %lld; rows go in block order", where, (long long)index);
    b->layers[l].index = l;
    ST_RETURN(st__stage_from_json(b, row, where, "init fwd fwd_res bwd_res", &b->layers[l]));
    const json_t* kind = json_object_get(row, "kind"); /* informational: strata plan prints it */
    if (json_is_string(kind)) snprintf(b->layers[l].kind, sizeof(b->layers[l].kind), "%s", json_string_value(kind));
  }
  return ST_OK;
}

/*===-------------------------------------------------------------------===*/
/* Mesh and collectives (docs/parallelism.md)                               */
/*===-------------------------------------------------------------------===*/

/* One collective's tensors: name, dtype and the per-device local_shape. */
/* |roles|: an SPMD compute program's tensors keep the exporter's roles (the
 * plan reads an update's "opt_<kind>" state by them); a collective's are
 * all "grad". */
static st_status st__collective_tensors(const json_t* arr, const char* where, bool roles, int* out_count,
                                        st_bundle_tensor** out) {
  size_t n = json_array_size(arr);
  if (n > 4096) return st_status_make(ST_CODE_RUNTIME, "%s: %zu tensors, more than 4096", where, n);
  *out_count = (int)n;
  *out = st_xcalloc(n ? n : 1, sizeof(st_bundle_tensor));
  for (size_t i = 0; i < n; ++i) {
    const json_t* t = json_array_get(arr, i);
    char ctx[300];
    snprintf(ctx, sizeof(ctx), "%s[%zu]", where, i);
    const char* name = NULL;
    const char* dtype = NULL;
    const json_t* shape = NULL;
    ST_RETURN(st_json_get_string(t, "name", ctx, &name));
    (*out)[i].name = st_xstrdup(name);
    const json_t* role = roles ? json_object_get(t, "role") : NULL;
    (*out)[i].role = st_xstrdup(json_is_string(role) ? json_string_value(role) : "grad");
    ST_RETURN(st_json_get_string(t, "dtype", ctx, &dtype));
    ST_RETURN(st_json_get_array(t, "local_shape", ctx, &shape));
    st_tensor_type* ty = &(*out)[i].type;
    ty->dtype = st_dtype_parse(dtype);
    if (ty->dtype == ST_DTYPE_INVALID) return st_status_make(ST_CODE_RUNTIME, "%s: unknown dtype '%s'", ctx, dtype);
    size_t rank = json_array_size(shape);
    if (rank > ST_MAX_RANK) return st_status_make(ST_CODE_RUNTIME, "%s: rank %zu exceeds %d", ctx, rank, ST_MAX_RANK);
    ty->rank = (int)rank;
    for (size_t k = 0; k < rank; ++k) {
      int64_t d = -1;
      if (!st_json_as_int(json_array_get(shape, k), &d) || d < 0)
        return st_status_make(ST_CODE_RUNTIME, "%s: local_shape[%zu] is not a non-negative integer", ctx, k);
      ty->dims[k] = d;
    }
  }
  return ST_OK;
}

static bool st__type_equal(const st_tensor_type* a, const st_tensor_type* b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int k = 0; k < a->rank; ++k)
    if (a->dims[k] != b->dims[k]) return false;
  return true;
}

/* |t| with dim 0 cut in |n| blocks of ceil(d0 / n) rows (an fsdp block). */
static st_tensor_type st__block(st_tensor_type t, int n) {
  if (t.rank > 0 && n > 1) t.dims[0] = (t.dims[0] + n - 1) / n;
  return t;
}

/* The collective's tensors are the group's parameters, in order, with the
 * parameter table's types, as fsdp blocks over |in_fsdp| / |out_fsdp|
 * devices (1: whole tensors). */
static st_status st__collective_fits_group(const st_bundle* b, const st_bundle_program* c, const st_bundle_group* g,
                                           const char* where, int in_fsdp, int out_fsdp) {
  if (c->input_count != g->param_count || c->output_count != g->param_count)
    return st_status_make(ST_CODE_RUNTIME, "%s: %d inputs for the %d parameters of group '%s'", where, c->input_count,
                          g->param_count, g->name);
  for (int k = 0; k < g->param_count; ++k) {
    int pi = -1;
    for (int i = 0; i < b->param_count && pi < 0; ++i)
      if (!strcmp(b->params[i].group, g->name) && !strcmp(b->params[i].local, g->params[k])) pi = i;
    st_tensor_type in = pi >= 0 ? st__block(b->params[pi].type, in_fsdp) : (st_tensor_type){0};
    st_tensor_type out = pi >= 0 ? st__block(b->params[pi].type, out_fsdp) : (st_tensor_type){0};
    if (strcmp(c->inputs[k].name, g->params[k]) != 0 || pi < 0 || !st__type_equal(&c->inputs[k].type, &in) ||
        !st__type_equal(&c->outputs[k].type, &out))
      return st_status_make(ST_CODE_RUNTIME, "%s: tensor %d is not group '%s''s parameter '%s' with its type", where, k,
                            g->name, g->params[k]);
  }
  return ST_OK;
}

static st_status st__collectives_parse(st_bundle* b, const json_t* root, const char* mpath) {
  b->mesh_data = b->mesh_fsdp = b->mesh_tensor = 1;
  b->process_fsdp = 1;
  const json_t* pf = json_object_get(root, "process_fsdp");
  int64_t pfv = 1;
  if (pf && (!st_json_as_int(pf, &pfv) || pfv < 1 || pfv > 4096))
    return st_status_make(ST_CODE_RUNTIME, "%s: process_fsdp is not a process count in 1..4096", mpath);
  b->process_fsdp = (int)pfv;
  const json_t* mesh = json_object_get(root, "mesh");
  if (mesh) {
    int64_t v[3] = {1, 1, 1};
    const char* axes[3] = {"data", "fsdp", "tensor"};
    for (int a = 0; a < 3; ++a) {
      const json_t* x = json_object_get(mesh, axes[a]);
      if (x && (!st_json_as_int(x, &v[a]) || v[a] < 1 || v[a] > 4096))
        return st_status_make(ST_CODE_RUNTIME, "%s: mesh.%s is not a size in 1..4096", mpath, axes[a]);
    }
    b->mesh_data = (int)v[0];
    b->mesh_fsdp = (int)v[1];
    b->mesh_tensor = (int)v[2];
  }
  const json_t* cols = json_object_get(root, "collectives");
  const json_t* tp = json_object_get(root, "spmd_programs");
  if (cols && !json_is_array(cols)) return st_status_make(ST_CODE_RUNTIME, "%s: collectives is not a list", mpath);
  if (tp && !json_is_array(tp)) return st_status_make(ST_CODE_RUNTIME, "%s: spmd_programs is not a list", mpath);
  size_t n = json_array_size(cols), n_tp = json_array_size(tp);
  if (n + n_tp > ST_BUNDLE_MAX_COLLECTIVES)
    return st_status_make(ST_CODE_RUNTIME, "%s: %zu collectives and SPMD programs, more than the %d strata reads", mpath,
                          n + n_tp, ST_BUNDLE_MAX_COLLECTIVES);
  b->collective_count = (int)(n + n_tp);
  b->collectives = st_xcalloc(n + n_tp + 1, sizeof(st_bundle_program));
  for (size_t i = 0; i < n + n_tp; ++i) {
    const bool is_tp = i >= n;
    const json_t* cj = is_tp ? json_array_get(tp, i - n) : json_array_get(cols, i);
    st_bundle_program* c = &b->collectives[i];
    char ctx[256];
    snprintf(ctx, sizeof(ctx), "%s: %s[%zu]", mpath, is_tp ? "spmd_programs" : "collectives", is_tp ? i - n : i);
    const char *name = NULL, *file = NULL, *sha = NULL, *kind = NULL, *axis = NULL, *group = NULL;
    ST_RETURN(st_json_get_string(cj, "name", ctx, &name));
    c->name = st_xstrdup(name);
    snprintf(ctx, sizeof(ctx), "%s: collective '%s'", mpath, name);
    ST_RETURN(st_json_get_string(cj, "file", ctx, &file));
    ST_RETURN(st_json_get_string(cj, "sha256", ctx, &sha));
    if (strlen(sha) != 64) return st_status_make(ST_CODE_RUNTIME, "%s: sha256 is not 64 hex digits", ctx);
    memcpy(c->sha256, sha, 65);
    c->path = st_path_join(b->dir, file);
    const json_t* arr = NULL;
    ST_RETURN(st_json_get_array(cj, "inputs", ctx, &arr));
    ST_RETURN(st__collective_tensors(arr, ctx, is_tp, &c->input_count, &c->inputs));
    ST_RETURN(st_json_get_array(cj, "outputs", ctx, &arr));
    ST_RETURN(st__collective_tensors(arr, ctx, is_tp, &c->output_count, &c->outputs));
    c->donated = st_xcalloc((size_t)c->input_count + 1, sizeof(bool));
    const json_t* don = json_object_get(cj, "donated");
    for (size_t k = 0; k < json_array_size(don); ++k) {
      int64_t d = -1;
      if (!st_json_as_int(json_array_get(don, k), &d) || d < 0 || d >= c->input_count)
        return st_status_make(ST_CODE_RUNTIME, "%s: donated[%zu] is not an input index (0..%d)", ctx, k, c->input_count - 1);
      c->donated[d] = true;
    }
    /* A tensor-parallel compute program: the program tables name it. */
    if (is_tp) continue;
    ST_RETURN(st_json_get_string(cj, "kind", ctx, &kind));
    ST_RETURN(st_json_get_string(cj, "axis", ctx, &axis));
    /* Older bundles name no group: such a collective is read but not linked. */
    if (!json_is_string(json_object_get(cj, "group"))) continue;
    group = json_string_value(json_object_get(cj, "group"));
    st_bundle_group* g = (st_bundle_group*)st_bundle_group_find(b, group);
    if (!g) return st_status_make(ST_CODE_RUNTIME, "%s: group '%s' is not in the groups list", ctx, group);
    /* With tensor, the block's collectives carry its tensor-cut blocks,
     * whose types the launches check. */
    const int F = b->mesh_fsdp;
    if (b->mesh_tensor != 1) {
      if (!strcmp(kind, "all_reduce") && !strcmp(axis, "data")) g->data_all_reduce = c;
      if (!strcmp(kind, "all_gather") && !strcmp(axis, "fsdp") && F > 1) g->fsdp_all_gather = c;
      if (!strcmp(kind, "reduce_scatter") && !strcmp(axis, "fsdp") && F > 1) g->fsdp_reduce_scatter = c;
      continue;
    }
    if (!strcmp(kind, "all_reduce") && !strcmp(axis, "data")) {
      ST_RETURN(st__collective_fits_group(b, c, g, ctx, F, F));
      g->data_all_reduce = c;
    } else if (!strcmp(kind, "all_gather") && !strcmp(axis, "fsdp") && F > 1) {
      ST_RETURN(st__collective_fits_group(b, c, g, ctx, F, 1));
      g->fsdp_all_gather = c;
    } else if (!strcmp(kind, "reduce_scatter") && !strcmp(axis, "fsdp") && F > 1) {
      ST_RETURN(st__collective_fits_group(b, c, g, ctx, 1, F));
      g->fsdp_reduce_scatter = c;
    }
  }
  return ST_OK;
}

/* The manifest's "kernels" (docs/bundle.md, "Kernels"): each op's chosen
 * implementation, its contract version and the FFI targets its programs
 * call. Absent in a bundle without kernels: nothing. */
static st_status st__kernels_parse(st_bundle* b, const json_t* root, const char* mpath) {
  const json_t* k = json_object_get(root, "kernels");
  if (!k) return ST_OK;
  const json_t* ops = json_object_get(k, "ops");
  if (!json_is_array(ops)) return st_status_make(ST_CODE_RUNTIME, "%s: kernels.ops is not an array", mpath);
  ST_RETURN(st__manifest_count(ops, ST_BUNDLE_MAX_KERNELS, mpath, "kernels", "ST_BUNDLE_MAX_KERNELS"));
  size_t n = json_array_size(ops);
  b->kernels = st_xcalloc(n ? n : 1, sizeof(st_bundle_kernel));
  for (size_t i = 0; i < n; ++i) {
    const json_t* kj = json_array_get(ops, i);
    st_bundle_kernel* kb = &b->kernels[i];
    b->kernel_count = (int)i + 1;
    char ctx[256];
    snprintf(ctx, sizeof(ctx), "%s: kernels.ops[%zu]", mpath, i);
    const char *name = NULL, *impl = NULL;
    int64_t version = 0;
    ST_RETURN(st_json_get_string(kj, "name", ctx, &name));
    ST_RETURN(st_json_get_string(kj, "impl", ctx, &impl));
    ST_RETURN(st_json_get_int(kj, "version", ctx, &version));
    if (version < 0 || version > 1000000)
      return st_status_make(ST_CODE_RUNTIME, "%s: version %lld is out of range", ctx, (long long)version);
    kb->name = st_xstrdup(name);
    kb->impl = st_xstrdup(impl);
    kb->version = (int)version;
    const json_t* fb = json_object_get(kj, "fallback");
    kb->fallback = st_xstrdup(json_is_string(fb) ? json_string_value(fb) : "");
    const json_t* targets = json_object_get(kj, "targets");
    if (targets && !json_is_array(targets)) return st_status_make(ST_CODE_RUNTIME, "%s: targets is not an array", ctx);
    ST_RETURN(st__manifest_count(targets, ST_BUNDLE_MAX_KERNEL_TARGETS, ctx, "targets", "ST_BUNDLE_MAX_KERNEL_TARGETS"));
    for (size_t t = 0; t < json_array_size(targets); ++t) {
      const json_t* v = json_array_get(targets, t);
      if (!json_is_string(v) || !json_string_value(v)[0])
        return st_status_make(ST_CODE_RUNTIME, "%s: targets[%zu] is not a name", ctx, t);
      kb->targets[kb->target_count++] = st_xstrdup(json_string_value(v));
    }
  }
  return ST_OK;
}

static st_status st__bundle_parse(st_bundle* b, const json_t* root, const char* mpath) {
  int64_t schema = 0;
  ST_RETURN(st_json_get_int(root, "schema_version", mpath, &schema));
  if (schema > ST_BUNDLE_SCHEMA_VERSION)
    return st_status_make(ST_CODE_RUNTIME, "%s: schema_version %lld is newer than this strata reads (%d); rebuild strata or re-export with a matching strata_jax",
                          mpath, (long long)schema, ST_BUNDLE_SCHEMA_VERSION);
  if (schema < 1) return st_status_make(ST_CODE_RUNTIME, "%s: schema_version %lld is invalid", mpath, (long long)schema);
  b->schema_version = (int)schema;
  const char* key = "";
  ST_RETURN(st_json_get_string(root, "bundle_key", mpath, &key));
  b->key = st_xstrdup(key);
  const json_t* versions = json_object_get(root, "versions");
  const json_t* jaxv = json_object_get(versions, "jax");
  b->jax_version = st_xstrdup(json_is_string(jaxv) ? json_string_value(jaxv) : "");
  const json_t* jaxlibv = json_object_get(versions, "jaxlib");
  b->jaxlib_version = st_xstrdup(json_is_string(jaxlibv) ? json_string_value(jaxlibv) : "");
  ST_RETURN(st__model_from_json(json_object_get(root, "model"), mpath, &b->model));

  const json_t* progs = NULL;
  ST_RETURN(st_json_get_array(root, "programs", mpath, &progs));
  ST_RETURN(st__manifest_count(progs, ST_BUNDLE_MAX_PROGRAMS, mpath, "programs", "ST_BUNDLE_MAX_PROGRAMS"));
  size_t n_progs = json_array_size(progs);
  b->program_count = (int)n_progs;
  b->programs = st_xcalloc(n_progs ? n_progs : 1, sizeof(st_bundle_program));
  for (size_t i = 0; i < n_progs; ++i) {
    const json_t* pj = json_array_get(progs, i);
    st_bundle_program* p = &b->programs[i];
    char ctx[256];
    snprintf(ctx, sizeof(ctx), "%s: programs[%zu]", mpath, i);
    const char* name = NULL;
    const char* file = NULL;
    const char* sha = NULL;
    ST_RETURN(st_json_get_string(pj, "name", ctx, &name));
    snprintf(ctx, sizeof(ctx), "%s: program '%s'", mpath, name);
    p->name = st_xstrdup(name);
    ST_RETURN(st_json_get_string(pj, "file", ctx, &file));
    ST_RETURN(st_json_get_string(pj, "sha256", ctx, &sha));
    if (strlen(sha) != 64) return st_status_make(ST_CODE_RUNTIME, "%s: sha256 is not 64 hex digits", ctx);
    memcpy(p->sha256, sha, 65);
    p->path = st_path_join(b->dir, file);
    const json_t* arr = NULL;
    ST_RETURN(st_json_get_array(pj, "inputs", ctx, &arr));
    ST_RETURN(st__tensors_from_json(arr, ctx, "inputs", &p->input_count, &p->inputs));
    ST_RETURN(st_json_get_array(pj, "outputs", ctx, &arr));
    ST_RETURN(st__tensors_from_json(arr, ctx, "outputs", &p->output_count, &p->outputs));
    p->donated = st_xcalloc((size_t)p->input_count + 1, sizeof(bool));
    const json_t* don = json_object_get(pj, "donated");
    for (size_t k = 0; k < json_array_size(don); ++k) {
      int64_t d = -1;
      if (!st_json_as_int(json_array_get(don, k), &d) || d < 0 || d >= p->input_count)
        return st_status_make(ST_CODE_RUNTIME, "%s: donated[%zu] is not an input index (0..%d)", ctx, k, p->input_count - 1);
      p->donated[d] = true;
    }
    p->flops = st__number_or(json_object_get(pj, "flops"), 0);
  }

  const json_t* groups = NULL;
  ST_RETURN(st_json_get_array(root, "groups", mpath, &groups));
  ST_RETURN(st__manifest_count(groups, ST_BUNDLE_MAX_GROUPS, mpath, "groups", "ST_BUNDLE_MAX_GROUPS"));
  size_t n_groups = json_array_size(groups);
  b->group_count = (int)n_groups;
  b->groups = st_xcalloc(n_groups ? n_groups : 1, sizeof(st_bundle_group));
  for (size_t i = 0; i < n_groups; ++i) {
    const json_t* g = json_array_get(groups, i);
    const char* name = NULL;
    const json_t* params = NULL;
    ST_RETURN(st_json_get_string(g, "name", mpath, &name));
    ST_RETURN(st_json_get_array(g, "params", mpath, &params));
    ST_RETURN(st__manifest_count(params, ST_BUNDLE_MAX_GROUP_PARAMS, mpath, "parameters in a group", "ST_BUNDLE_MAX_GROUP_PARAMS"));
    size_t n = json_array_size(params);
    b->groups[i].name = st_xstrdup(name);
    b->groups[i].param_count = (int)n;
    b->groups[i].params = st_xcalloc(n ? n : 1, sizeof(char*));
    for (size_t k = 0; k < n; ++k) {
      const json_t* v = json_array_get(params, k);
      if (!json_is_string(v)) return st_status_make(ST_CODE_RUNTIME, "%s: group '%s' has a non-string parameter", mpath, name);
      b->groups[i].params[k] = st_xstrdup(json_string_value(v));
    }
  }

  const json_t* params = NULL;
  ST_RETURN(st_json_get_array(root, "params", mpath, &params));
  ST_RETURN(st__manifest_count(params, ST_BUNDLE_MAX_PARAMS, mpath, "params", "ST_BUNDLE_MAX_PARAMS"));
  size_t n_params = json_array_size(params);
  b->param_count = (int)n_params;
  b->params = st_xcalloc(n_params ? n_params : 1, sizeof(st_bundle_param));
  for (size_t i = 0; i < n_params; ++i) {
    const json_t* pj = json_array_get(params, i);
    st_bundle_param* p = &b->params[i];
    const char *name = NULL, *group = NULL, *local = NULL;
    char ctx[256];
    snprintf(ctx, sizeof(ctx), "%s: params[%zu]", mpath, i);
    ST_RETURN(st_json_get_string(pj, "name", ctx, &name));
    ST_RETURN(st_json_get_string(pj, "group", ctx, &group));
    ST_RETURN(st_json_get_string(pj, "local", ctx, &local));
    p->name = st_xstrdup(name);
    p->group = st_xstrdup(group);
    p->local = st_xstrdup(local);
    int64_t layer = -1;
    if (json_object_get(pj, "layer") && (!st_json_as_int(json_object_get(pj, "layer"), &layer) || layer < -1 || layer >= ST_BUNDLE_MAX_LAYERS))
      return st_status_make(ST_CODE_RUNTIME, "%s: 'layer' is not -1 or an index below %d", ctx, ST_BUNDLE_MAX_LAYERS);
    p->layer = (int)layer;
    p->decay = json_is_true(json_object_get(pj, "decay"));
    ST_RETURN(st__tensor_type_from_json(pj, ctx, &p->type));
  }
  /* The SPMD programs first: the program tables may name them. */
  ST_RETURN(st__collectives_parse(b, root, mpath));
  ST_RETURN(st__kernels_parse(b, root, mpath));
  return st__tables_parse(b, root, mpath);
}

st_status st_bundle_parse(const char* dir, const char* text, size_t size, st_bundle** out_bundle) {
  *out_bundle = NULL;
  char* mpath = st_path_join(dir, "manifest.json");
  json_t* root = NULL;
  st_status s = st_json_parse(text, size, mpath, &root);
  if (s) s = st_status_set_code(s, ST_CODE_RUNTIME);
  st_bundle* b = st_xcalloc(1, sizeof(*b));
  b->dir = st_xstrdup(dir);
  if (!s) s = st__bundle_parse(b, root, mpath);
  json_decref(root);
  free(mpath);
  if (s) {
    st_bundle_destroy(b);
    return s;
  }
  *out_bundle = b;
  return ST_OK;
}

st_status st_bundle_open(const char* dir, st_bundle** out_bundle) {
  *out_bundle = NULL;
  char* mpath = st_path_join(dir, "manifest.json");
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(mpath, &text, &size);
  if (s) {
    free(mpath);
    return st_status_recode(s, ST_CODE_RUNTIME, "bundle manifest missing");
  }
  st_bundle* b = NULL;
  s = st_bundle_parse(dir, text, size, &b);
  free(text);
  /* A program file that is missing or differs from its manifest sha256 is
   * a stale or tampered bundle: never compile it. */
  for (int i = 0; b && !s && i < b->program_count + b->collective_count; ++i) {
    const st_bundle_program* p = i < b->program_count ? &b->programs[i] : &b->collectives[i - b->program_count];
    char sha[65];
    st_status r = st_sha256_file_hex(p->path, sha);
    if (r) {
      s = st_status_recode(r, ST_CODE_RUNTIME, "bundle program '%s' is missing", p->name);
    } else if (strcmp(sha, p->sha256) != 0) {
      s = st_status_make(ST_CODE_RUNTIME, "bundle program file '%s' was altered: sha256 %.16s… differs from the manifest's %.16s…",
                         p->path, sha, p->sha256);
    }
  }
  free(mpath);
  if (s) {
    st_bundle_destroy(b);
    return s;
  }
  *out_bundle = b;
  return ST_OK;
}

static void st__tensors_free(st_bundle_tensor* t, int n) {
  for (int i = 0; i < n; ++i) {
    free(t[i].name);
    free(t[i].role);
  }
  free(t);
}

static void st__programs_free(st_bundle_program* v, int n) {
  for (int i = 0; i < n; ++i) {
    st_bundle_program* p = &v[i];
    free(p->name);
    free(p->path);
    st__tensors_free(p->inputs, p->input_count);
    st__tensors_free(p->outputs, p->output_count);
    free(p->donated);
  }
  free(v);
}

void st_bundle_destroy(st_bundle* b) {
  if (!b) return;
  st__programs_free(b->programs, b->program_count);
  st__programs_free(b->collectives, b->collective_count);
  for (int i = 0; i < b->kernel_count; ++i) {
    st_bundle_kernel* k = &b->kernels[i];
    free(k->name);
    free(k->impl);
    free(k->fallback);
    for (int t = 0; t < k->target_count; ++t) free(k->targets[t]);
  }
  free(b->kernels);
  for (int i = 0; i < b->group_count; ++i) {
    for (int k = 0; k < b->groups[i].param_count; ++k) free(b->groups[i].params[k]);
    free(b->groups[i].params);
    free(b->groups[i].name);
  }
  free(b->groups);
  for (int i = 0; i < b->param_count; ++i) {
    free(b->params[i].name);
    free(b->params[i].group);
    free(b->params[i].local);
  }
  free(b->params);
  free(b->layers);
  st_lint_report_free(&b->lint);
  free(b->dir);
  free(b->key);
  free(b->jax_version);
  free(b->jaxlib_version);
  free(b);
}

const st_bundle_program* st_bundle_program_find(const st_bundle* b, const char* name) {
  for (int i = 0; i < b->program_count; ++i)
    if (!strcmp(b->programs[i].name, name)) return &b->programs[i];
  return NULL;
}

const st_bundle_program* st_bundle_collective_find(const st_bundle* b, const char* name) {
  for (int i = 0; i < b->collective_count; ++i)
    if (!strcmp(b->collectives[i].name, name)) return &b->collectives[i];
  return NULL;
}

const st_bundle_group* st_bundle_group_find(const st_bundle* b, const char* name) {
  for (int i = 0; i < b->group_count; ++i)
    if (!strcmp(b->groups[i].name, name)) return &b->groups[i];
  return NULL;
}

int st_bundle_param_index(const st_bundle* b, const char* name) {
  for (int i = 0; i < b->param_count; ++i)
    if (!strcmp(b->params[i].name, name)) return i;
  return -1;
}

int st_bundle_param_of(const st_bundle* b, const char* group, int layer, const char* local) {
  for (int i = 0; i < b->param_count; ++i) {
    const st_bundle_param* p = &b->params[i];
    if (p->layer == layer && !strcmp(p->group, group) && !strcmp(p->local, local)) return i;
  }
  return -1;
}


/* The block rows of layer 0 are the template of every layer (bundle_internal.h). */
st_status st__bundle_set_depth(st_bundle* b, int64_t n_layers) {
  if (b->model.n_layers == n_layers) return ST_OK;
  if (n_layers > ST_BUNDLE_MAX_LAYERS)
    return st_status_make(ST_CODE_RUNTIME, "model.n_layers %lld exceeds the limit of %d (ST_BUNDLE_MAX_LAYERS)", (long long)n_layers,
                          ST_BUNDLE_MAX_LAYERS);
  int first = -1, last = -1, per_layer = 0;
  for (int i = 0; i < b->param_count; ++i) {
    if (b->params[i].layer < 0) continue;
    if (first < 0) first = i;
    last = i;
    if (b->params[i].layer == 0) per_layer++;
  }
  if (first < 0 || per_layer == 0 || last - first + 1 != per_layer * (int)b->model.n_layers)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: its parameter table is not %lld layers of the same rows",
                          b->dir, (long long)b->model.n_layers);
  /* The layer table likewise: layer 0's row serves every layer, which
   * holds only when every row names the same programs. */
  for (int l = 1; l < b->layer_count; ++l) {
    const st_bundle_stage *a = &b->layers[0], *r = &b->layers[l];
    if (a->group != r->group || a->init != r->init || a->fwd != r->fwd || a->bwd != r->bwd || a->fwd_res != r->fwd_res ||
        a->bwd_res != r->bwd_res || a->prefill != r->prefill || a->decode != r->decode)
      return st_status_make(ST_CODE_RUNTIME,
                            "bundle %s: its layer table gives layer %d other programs than layer 0, so it serves only "
                            "model.n_layers = %lld, not %lld; set bundle.dir to a bundle exported for this depth",
                            b->dir, l, (long long)b->model.n_layers, (long long)n_layers);
  }
  if (b->layer_count < 1) return st_status_make(ST_CODE_RUNTIME, "bundle %s: its layer table is empty", b->dir);
  st_bundle_stage* stages = st_xcalloc((size_t)n_layers + 1, sizeof(*stages));
  for (int l = 0; l < n_layers; ++l) {
    stages[l] = b->layers[0];
    stages[l].index = l;
  }
  free(b->layers);
  b->layers = NULL;
  b->layer_count = 0;
  int n = b->param_count - (last - first + 1) + per_layer * (int)n_layers;
  st_bundle_param* v = st_xcalloc((size_t)n + 1, sizeof(*v));
  int k = 0;
  for (int i = 0; i < first; ++i) v[k++] = b->params[i];
  for (int l = 0; l < n_layers; ++l) {
    for (int j = 0; j < per_layer; ++j) {
      const st_bundle_param* t = &b->params[first + j];
      st_bundle_param* p = &v[k++];
      *p = *t;
      st_strbuf name = {0};
      st_strbuf_printf(&name, "layers.%d.%s", l, t->local);
      p->name = name.data;
      p->group = st_xstrdup(t->group);
      p->local = st_xstrdup(t->local);
      p->layer = l;
    }
  }
  for (int i = last + 1; i < b->param_count; ++i) v[k++] = b->params[i];
  for (int i = first; i <= last; ++i) {
    free(b->params[i].name);
    free(b->params[i].group);
    free(b->params[i].local);
  }
  free(b->params);
  b->params = v;
  b->param_count = n;
  b->layer_count = (int)n_layers;
  b->layers = stages;
  b->model.n_layers = n_layers;
  return ST_OK;
}
st_bundle* st__bundle_manifest_of(const char* dir) {
  char* path = st_path_join(dir, "manifest.json");
  char* text = NULL;
  size_t size = 0;
  st_bundle* b = NULL;
  st_status s = st_fs_exists(path) ? st_fs_read_file(path, &text, &size) : st_status_make(ST_CODE_RUNTIME, "none");
  if (!s) s = st_bundle_parse(dir, text, size, &b);
  st_status_free(s);
  free(text);
  free(path);
  return b;
}
