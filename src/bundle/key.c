/* key.c — the bundle key (docs/bundle.md, "Key"): what the cache entry of
 * a bundle is named by. Frozen: the text hashed here decides every key. */
#include <dirent.h>
#include <glob.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/bundle.h"

static int st__key_cmp_str(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

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
  json_t* m = NULL;
  st_status ps = st_json_parse(model_json, strlen(model_json), "model", &m);
  if (ps || !json_is_object(m)) {
    st_status_free(ps);
    json_decref(m);
    st_strbuf_append(s, model_json);
    return;
  }
  const char* key;
  json_t* v;
  json_object_foreach(m, key, v) {
    if (!strcmp(key, "n_layers")) continue;
    st_strbuf_printf(s, "%s=", key);
    if (json_is_string(v)) {
      char* text = st_json_dump(v, 0);
      st_strbuf_append(s, text);
      free(text);
    } else if (json_is_boolean(v)) {
      st_strbuf_append(s, json_is_true(v) ? "true" : "false");
    } else if (json_is_number(v)) {
      st__key_number(s, json_number_value(v));
    } else if (json_is_object(v) || json_is_array(v)) {
      /* kernels {"rmsnorm": "ffi"}, layers ["llama", "moe"]: their text,
       * members in order (the trainer writes them in a fixed order), so
       * two selections never share a key. */
      char* text = st_json_dump(v, 0);
      st_strbuf_append(s, text);
      free(text);
    } else {
      st_strbuf_append(s, "?");
    }
    st_strbuf_append(s, "\n");
  }
  json_decref(m);
}

static bool st__is_dir(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The strata_jax folder the exporter will import, in Python's order for
 * st_bundle_export's child: the source tree's python/ (put first on its
 * PYTHONPATH), then $PYTHONPATH's entries, then the site-packages of the
 * exporter's venv (an installed strata with a pip-installed front-end,
 * docs/install.md). NULL when none exists. Caller frees. */
static char* st__frontend_dir(void) {
  char* dir = st_path_join(st_source_dir(), "python/strata_jax");
  if (st__is_dir(dir)) return dir;
  free(dir);
  const char* pp = getenv("PYTHONPATH");
  if (pp) {
    char* copy = st_xstrdup(pp);
    char* save = NULL;
    for (char* e = strtok_r(copy, ":", &save); e; e = strtok_r(NULL, ":", &save)) {
      dir = st_path_join(e, "strata_jax");
      if (st__is_dir(dir)) {
        free(copy);
        return dir;
      }
      free(dir);
    }
    free(copy);
  }
  char* python = st_bundle_python();
  /* V/bin/python -> V, unresolved: a venv's python links out of it. */
  char* slash = strrchr(python, '/');
  if (slash) *slash = '\0';
  slash = strrchr(python, '/');
  dir = NULL;
  if (slash) {
    *slash = '\0';
    st_strbuf pattern = {0};
    st_strbuf_printf(&pattern, "%s/lib/python3*/site-packages/strata_jax", python[0] ? python : "/");
    glob_t g;
    memset(&g, 0, sizeof(g));
    if (glob(pattern.data, GLOB_ONLYDIR, NULL, &g) == 0 && g.gl_pathc > 0) dir = st_xstrdup(g.gl_pathv[g.gl_pathc - 1]);
    globfree(&g);
    st_strbuf_free(&pattern);
  }
  free(python);
  return dir;
}
void st_bundle_key(const st_bundle_request* request, char out[17]) {
  const char* mesh = request->mesh;
  st_strbuf s = {0};
  st_strbuf_printf(&s, "schema=%d\nmodel:\n", ST_BUNDLE_SCHEMA_VERSION);
  st__key_model(request->model_json, &s);
  /* Only a mesh adds a line: one-device keys stay what they were. */
  if (mesh && mesh[0]) st_strbuf_printf(&s, "mesh=%s\n", mesh);
  if (request->process_fsdp > 1) st_strbuf_printf(&s, "process_fsdp=%d\n", request->process_fsdp);
  /* The exporter's sources are part of the key: a changed model or export
   * rule must never be served from an old bundle. */
  char* folder = st__frontend_dir();
  DIR* d = folder ? opendir(folder) : NULL;
  if (d) {
    char** names = NULL;
    size_t n = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
      size_t len = strlen(e->d_name);
      /* .py and .json: the kernel contract (kernel_contract.json) is a source. */
      bool py = len >= 3 && !strcmp(e->d_name + len - 3, ".py");
      bool js = len >= 5 && !strcmp(e->d_name + len - 5, ".json");
      if (!py && !js) continue;
      names = st_xrealloc(names, (n + 1) * sizeof(char*));
      names[n++] = st_xstrdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(char*), st__key_cmp_str);
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
