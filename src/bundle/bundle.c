/* bundle.c — read, validate and (re-)export the program bundle. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "strata/base.h"
#include "strata/bundle.h"

/*===-------------------------------------------------------------------===*/
/* Manifest parsing                                                         */
/*===-------------------------------------------------------------------===*/

static st_status st__tensor_type_from_json(const st_json* t, const char* where, st_tensor_type* out) {
  const char* dtype = NULL;
  const st_json* shape = NULL;
  ST_RETURN(st_json_get_string(t, "dtype", where, &dtype));
  ST_RETURN(st_json_get_array(t, "shape", where, &shape));
  memset(out, 0, sizeof(*out));
  out->dtype = st_dtype_parse(dtype);
  if (out->dtype == ST_DTYPE_INVALID) return st_status_make(ST_CODE_RUNTIME, "%s: unknown dtype '%s'", where, dtype);
  if (shape->count > ST_MAX_RANK) return st_status_make(ST_CODE_RUNTIME, "%s: rank %zu exceeds %d", where, shape->count, ST_MAX_RANK);
  out->rank = (int)shape->count;
  for (size_t i = 0; i < shape->count; ++i) {
    const st_json* d = &shape->items[i];
    if (d->kind != ST_JSON_NUMBER || d->number < 0 || d->number != (double)(int64_t)d->number)
      return st_status_make(ST_CODE_RUNTIME, "%s: dimension %zu is not a non-negative integer (dynamic shapes are not supported)",
                            where, i);
    out->dims[i] = (int64_t)d->number;
  }
  return ST_OK;
}

static st_status st__tensors_from_json(const st_json* arr, const char* where, int* out_count, st_bundle_tensor** out) {
  *out_count = (int)arr->count;
  *out = st_xcalloc(arr->count ? arr->count : 1, sizeof(st_bundle_tensor));
  for (size_t i = 0; i < arr->count; ++i) {
    char ctx[256];
    snprintf(ctx, sizeof(ctx), "%s[%zu]", where, i);
    const char* name = NULL;
    const char* role = NULL;
    ST_RETURN(st_json_get_string(&arr->items[i], "name", ctx, &name));
    ST_RETURN(st_json_get_string(&arr->items[i], "role", ctx, &role));
    (*out)[i].name = st_xstrdup(name);
    (*out)[i].role = st_xstrdup(role);
    ST_RETURN(st__tensor_type_from_json(&arr->items[i], ctx, &(*out)[i].type));
  }
  return ST_OK;
}

static st_status st__model_from_json(const st_json* m, const char* where, st_bundle_model* out) {
  if (!m || m->kind != ST_JSON_OBJECT) return st_status_make(ST_CODE_RUNTIME, "%s: 'model' is missing", where);
  ST_RETURN(st_json_get_int(m, "vocab_size", where, &out->vocab_size));
  ST_RETURN(st_json_get_int(m, "d_model", where, &out->d_model));
  ST_RETURN(st_json_get_int(m, "n_layers", where, &out->n_layers));
  ST_RETURN(st_json_get_int(m, "n_heads", where, &out->n_heads));
  ST_RETURN(st_json_get_int(m, "d_ff", where, &out->d_ff));
  ST_RETURN(st_json_get_int(m, "seq_len", where, &out->seq_len));
  ST_RETURN(st_json_get_int(m, "microbatch_size", where, &out->microbatch_size));
  const st_json* tie = st_json_get(m, "tie_embeddings");
  out->tie_embeddings = tie && tie->kind == ST_JSON_BOOL && tie->boolean;
  const char* cd = "f32";
  ST_RETURN(st_json_get_string(m, "compute_dtype", where, &cd));
  snprintf(out->compute_dtype, sizeof(out->compute_dtype), "%s", cd);
  const st_json* v = st_json_get(m, "rope_theta");
  out->rope_theta = v && v->kind == ST_JSON_NUMBER ? v->number : 0;
  v = st_json_get(m, "init_std");
  out->init_std = v && v->kind == ST_JSON_NUMBER ? v->number : 0;
  return ST_OK;
}

static st_status st__bundle_parse(st_bundle* b, const st_json* root, const char* mpath) {
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
  const st_json* versions = st_json_get(root, "versions");
  const st_json* jaxv = st_json_get(versions, "jax");
  b->jax_version = st_xstrdup(jaxv && jaxv->kind == ST_JSON_STRING ? jaxv->string : "");
  const st_json* jaxlibv = st_json_get(versions, "jaxlib");
  b->jaxlib_version = st_xstrdup(jaxlibv && jaxlibv->kind == ST_JSON_STRING ? jaxlibv->string : "");
  ST_RETURN(st__model_from_json(st_json_get(root, "model"), mpath, &b->model));

  const st_json* progs = NULL;
  ST_RETURN(st_json_get_array(root, "programs", mpath, &progs));
  b->program_count = (int)progs->count;
  b->programs = st_xcalloc(progs->count ? progs->count : 1, sizeof(st_bundle_program));
  for (size_t i = 0; i < progs->count; ++i) {
    const st_json* pj = &progs->items[i];
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
    const st_json* arr = NULL;
    ST_RETURN(st_json_get_array(pj, "inputs", ctx, &arr));
    ST_RETURN(st__tensors_from_json(arr, ctx, &p->input_count, &p->inputs));
    ST_RETURN(st_json_get_array(pj, "outputs", ctx, &arr));
    ST_RETURN(st__tensors_from_json(arr, ctx, &p->output_count, &p->outputs));
    p->donated = st_xcalloc((size_t)p->input_count + 1, sizeof(bool));
    const st_json* don = st_json_get(pj, "donated");
    for (size_t k = 0; don && don->kind == ST_JSON_ARRAY && k < don->count; ++k) {
      double d = don->items[k].number;
      if (d < 0 || d >= p->input_count) return st_status_make(ST_CODE_RUNTIME, "%s: donated index %g out of range", ctx, d);
      p->donated[(int)d] = true;
    }
    const st_json* fl = st_json_get(pj, "flops");
    p->flops = fl && fl->kind == ST_JSON_NUMBER ? fl->number : 0;
  }

  const st_json* groups = NULL;
  ST_RETURN(st_json_get_array(root, "groups", mpath, &groups));
  b->group_count = (int)groups->count;
  b->groups = st_xcalloc(groups->count ? groups->count : 1, sizeof(st_bundle_group));
  for (size_t i = 0; i < groups->count; ++i) {
    const char* name = NULL;
    const st_json* params = NULL;
    ST_RETURN(st_json_get_string(&groups->items[i], "name", mpath, &name));
    ST_RETURN(st_json_get_array(&groups->items[i], "params", mpath, &params));
    b->groups[i].name = st_xstrdup(name);
    b->groups[i].param_count = (int)params->count;
    b->groups[i].params = st_xcalloc(params->count ? params->count : 1, sizeof(char*));
    for (size_t k = 0; k < params->count; ++k) {
      if (params->items[k].kind != ST_JSON_STRING)
        return st_status_make(ST_CODE_RUNTIME, "%s: group '%s' has a non-string parameter", mpath, name);
      b->groups[i].params[k] = st_xstrdup(params->items[k].string);
    }
  }

  const st_json* params = NULL;
  ST_RETURN(st_json_get_array(root, "params", mpath, &params));
  b->param_count = (int)params->count;
  b->params = st_xcalloc(params->count ? params->count : 1, sizeof(st_bundle_param));
  for (size_t i = 0; i < params->count; ++i) {
    const st_json* pj = &params->items[i];
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
    const st_json* layer = st_json_get(pj, "layer");
    p->layer = layer && layer->kind == ST_JSON_NUMBER ? (int)layer->number : -1;
    const st_json* decay = st_json_get(pj, "decay");
    p->decay = decay && decay->kind == ST_JSON_BOOL && decay->boolean;
    ST_RETURN(st__tensor_type_from_json(pj, ctx, &p->type));
  }
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
  st_json* root = NULL;
  s = st_json_parse(text, size, mpath, &root);
  free(text);
  st_bundle* b = st_xcalloc(1, sizeof(*b));
  b->dir = st_xstrdup(dir);
  if (!s) s = st__bundle_parse(b, root, mpath);
  st_json_free(root);
  /* A program file that is missing or differs from its manifest sha256 is
   * a stale or tampered bundle: never compile it. */
  for (int i = 0; !s && i < b->program_count; ++i) {
    char sha[65];
    st_status r = st_sha256_file_hex(b->programs[i].path, sha);
    if (r) {
      s = st_status_recode(r, ST_CODE_RUNTIME, "bundle program '%s' is missing", b->programs[i].name);
    } else if (strcmp(sha, b->programs[i].sha256) != 0) {
      s = st_status_make(ST_CODE_RUNTIME, "bundle program file '%s' was altered: sha256 %.16s… differs from the manifest's %.16s…",
                         b->programs[i].path, sha, b->programs[i].sha256);
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

void st_bundle_destroy(st_bundle* b) {
  if (!b) return;
  for (int i = 0; i < b->program_count; ++i) {
    st_bundle_program* p = &b->programs[i];
    free(p->name);
    free(p->path);
    st__tensors_free(p->inputs, p->input_count);
    st__tensors_free(p->outputs, p->output_count);
    free(p->donated);
  }
  free(b->programs);
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

void st_bundle_program_signature(const st_bundle_program* p, st_tensor_type* inputs, st_tensor_type* outputs,
                                 st_program_signature* sig) {
  for (int i = 0; i < p->input_count; ++i) inputs[i] = p->inputs[i].type;
  for (int i = 0; i < p->output_count; ++i) outputs[i] = p->outputs[i].type;
  sig->input_count = p->input_count;
  sig->inputs = inputs;
  sig->output_count = p->output_count;
  sig->outputs = outputs;
}

/*===-------------------------------------------------------------------===*/
/* Key, export, ensure                                                      */
/*===-------------------------------------------------------------------===*/

static int st__cmp_str(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

/* The model JSON without its depth, members in their order, one per line.
 * No program depends on model.n_layers (block_init takes it as an input;
 * tests/py/test_export.py holds that), so one bundle serves every depth.
 * Text that is not a JSON object is hashed as it is. */
/* Frozen: this text is hashed, so changing it changes every bundle key. */
static void st__key_number(st_strbuf* s, double v) {
  if (!isfinite(v))
    st_strbuf_append(s, "null");
  else if (v == (double)(int64_t)v && fabs(v) < 9e15)
    st_strbuf_printf(s, "%lld", (long long)v);
  else
    st_strbuf_printf(s, "%.17g", v);
}

static void st__key_model(const char* model_json, st_strbuf* s) {
  st_json* m = NULL;
  st_status ps = st_json_parse(model_json, strlen(model_json), "model", &m);
  if (ps || m->kind != ST_JSON_OBJECT) {
    st_status_free(ps);
    st_json_free(m);
    st_strbuf_append(s, model_json);
    return;
  }
  for (size_t i = 0; i < m->count; ++i) {
    if (!strcmp(m->keys[i], "n_layers")) continue;
    const st_json* v = &m->items[i];
    st_strbuf_printf(s, "%s=", m->keys[i]);
    if (v->kind == ST_JSON_STRING) {
      json_t* str = st_json_str(v->string);
      char* text = st_json_dump(str, 0);
      st_strbuf_append(s, text);
      free(text);
      json_decref(str);
    } else if (v->kind == ST_JSON_BOOL) {
      st_strbuf_append(s, v->boolean ? "true" : "false");
    } else if (v->kind == ST_JSON_NUMBER) {
      st__key_number(s, v->number);
    } else {
      st_strbuf_append(s, "?");
    }
    st_strbuf_append(s, "\n");
  }
  st_json_free(m);
}

void st_bundle_key(const char* model_json, char out[17]) {
  st_strbuf s = {0};
  st_strbuf_printf(&s, "schema=%d\nmodel:\n", ST_BUNDLE_SCHEMA_VERSION);
  st__key_model(model_json, &s);
  /* The exporter's sources are part of the key: a changed model or export
   * rule must never be served from an old bundle. */
  char* folder = st_path_join(st_source_dir(), "python/strata_jax");
  DIR* d = opendir(folder);
  if (d) {
    char** names = NULL;
    size_t n = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
      size_t len = strlen(e->d_name);
      if (len < 3 || strcmp(e->d_name + len - 3, ".py") != 0) continue;
      names = st_xrealloc(names, (n + 1) * sizeof(char*));
      names[n++] = st_xstrdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(char*), st__cmp_str);
    for (size_t i = 0; i < n; ++i) {
      char* path = st_path_join(folder, names[i]);
      char sha[65] = "";
      st_status_free(st_sha256_file_hex(path, sha));
      st_strbuf_printf(&s, "%s=%s\n", names[i], sha);
      free(path);
      free(names[i]);
    }
    free(names);
  }
  free(folder);
  char sha[65];
  st_sha256_hex(s.data, s.len, sha);
  st_strbuf_free(&s);
  memcpy(out, sha, 16);
  out[16] = '\0';
}

char* st_bundle_python(void) {
  const char* env = getenv("STRATA_PYTHON");
  if (env && env[0]) return st_xstrdup(env);
  if (access(".venv/bin/python", X_OK) == 0) return st_xstrdup(".venv/bin/python");
  return st_path_join(st_source_dir(), ".venv/bin/python");
}

static char* st__tail_of_file(const char* path, size_t max) {
  char* data = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &data, &size);
  if (s) {
    st_status_free(s);
    return st_xstrdup("");
  }
  if (size > max) memmove(data, data + size - max, max + 1);
  return data;
}

st_status st_bundle_export(const char* model_json, const char* key, const char* dir) {
  char* python = st_bundle_python();
  char* log = NULL;
  {
    st_strbuf l = {0};
    st_strbuf_printf(&l, "%s.export.log", dir);
    log = l.data;
  }
  /* The parent folder must exist for the exporter's rename into place. */
  char* parent = st_xstrdup(dir);
  char* slash = strrchr(parent, '/');
  if (slash && slash != parent) {
    *slash = '\0';
    st_status s = st_fs_mkdirs(parent);
    if (s) {
      free(parent);
      free(python);
      free(log);
      return st_status_annotate(s, "creating the bundle folder");
    }
  }
  free(parent);
  pid_t pid = fork();
  if (pid < 0) {
    free(python);
    free(log);
    return st_status_make(ST_CODE_RUNTIME, "cannot fork the exporter: %s", strerror(errno));
  }
  if (pid == 0) {
    FILE* f = freopen(log, "w", stdout);
    if (f) dup2(fileno(stdout), 2);
    const char* old = getenv("PYTHONPATH");
    st_strbuf pp = {0};
    st_strbuf_append(&pp, st_source_dir());
    st_strbuf_append(&pp, "/python");
    if (old && old[0]) st_strbuf_printf(&pp, ":%s", old);
    setenv("PYTHONPATH", pp.data, 1);
    /* Export is trace + lower only: keep JAX off any accelerator. */
    setenv("JAX_PLATFORMS", "cpu", 1);
    execl(python, python, "-m", "strata_jax.export", "--model-json", model_json, "--out", dir, "--bundle-key", key,
          (char*)NULL);
    fprintf(stderr, "cannot execute '%s': %s\n", python, strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  st_status s = ST_OK;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    char* tail = st__tail_of_file(log, 1500);
    s = st_status_make(ST_CODE_RUNTIME,
                       "exporting the bundle failed (%s -m strata_jax.export, %s %d; log %s). Run `make setup` if the venv is missing. Last output:\n%s",
                       python, WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                       log, tail);
    free(tail);
  }
  free(python);
  free(log);
  return s;
}

/* Instantiates the parameter table for |n_layers| layers: the block rows
 * of layer 0 are the template of every layer. The bundle's programs are
 * the same for every depth; only this table and model.n_layers are not. */
static st_status st__bundle_set_depth(st_bundle* b, int64_t n_layers) {
  if (b->model.n_layers == n_layers) return ST_OK;
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
  b->model.n_layers = n_layers;
  return ST_OK;
}

/* model.n_layers of the request's model JSON; -1 when it has none. */
static int64_t st__requested_depth(const char* model_json) {
  st_json* m = NULL;
  int64_t n = -1;
  st_status s = st_json_parse(model_json, strlen(model_json), "model", &m);
  if (!s) s = st_json_get_int(m, "n_layers", "model", &n);
  if (s) n = -1;
  st_status_free(s);
  st_json_free(m);
  return n;
}

st_status st_bundle_ensure(const st_bundle_request* req, st_bundle** out_bundle, bool* out_exported) {
  *out_bundle = NULL;
  *out_exported = false;
  char key[17];
  st_bundle_key(req->model_json, key);
  char* dir;
  if (req->dir && req->dir[0]) {
    dir = st_xstrdup(req->dir);
  } else {
    st_strbuf d = {0};
    st_strbuf_printf(&d, "%s/bundles/%s", req->cache_root, key);
    dir = d.data;
  }
  st_bundle* b = NULL;
  st_status s = ST_OK;
  if (st_fs_exists(dir)) {
    s = st_bundle_open(dir, &b);
    if (!s && strcmp(b->key, key) != 0) {
      s = st_status_make(ST_CODE_RUNTIME, "bundle '%s' has key %s, the config needs %s", dir, b->key, key);
      st_bundle_destroy(b);
      b = NULL;
    }
    if (s && req->dir && req->dir[0]) {
      /* A bundle the user named (bundle.dir) is never overwritten: it may be
       * the artefact another team handed over. Say what is wrong with it. */
      free(dir);
      return st_status_annotate(s, "bundle.dir '%s' does not match this config (remove it, or unset bundle.dir to use the cache)",
                                req->dir);
    }
    if (s) {
      /* A cached bundle is ours to replace: stale means re-export. */
      fprintf(stderr, "strata: stale bundle, re-exporting: %s\n", st_status_message(s));
      st_status_free(s);
      s = ST_OK;
    }
  }
  if (!b) {
    s = st_bundle_export(req->model_json, key, dir);
    if (!s) s = st_bundle_open(dir, &b);
    if (!s && strcmp(b->key, key) != 0)
      s = st_status_make(ST_CODE_RUNTIME, "exporter wrote bundle key '%s' into '%s', expected '%s'", b->key, dir, key);
    if (!s) *out_exported = true;
  }
  /* A bundle exported for another depth serves this one. */
  int64_t depth = st__requested_depth(req->model_json);
  if (!s && depth > 0) s = st__bundle_set_depth(b, depth);
  free(dir);
  if (s) {
    st_bundle_destroy(b);
    return s;
  }
  *out_bundle = b;
  return ST_OK;
}
