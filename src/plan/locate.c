/* locate.c — from a path the user typed to the parameters of a trained
 * model: a run directory or one of its checkpoint folders (strata eval,
 * strata sample). A run directory's checkpoints are verified newest first,
 * as a resume does, so a damaged newest one falls back to the one before;
 * a checkpoint folder the user named is verified and never replaced by
 * another. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/obs.h"
#include "strata/plan.h"

void st_plan_trained_ref_deinit(st_plan_trained_ref* ref) {
  if (!ref) return;
  free(ref->run_dir);
  free(ref->config_path);
  free(ref->params_path);
  st_plan_record_deinit(&ref->record);
  memset(ref, 0, sizeof(*ref));
}

/* The steps of the last "run_done" event in <run>/events.jsonl: the run
 * wrote params.safetensors right after it. -1 when there is none. */
static int64_t st__run_done_steps(const char* run_dir) {
  char* path = st_rundir_path(run_dir, ST_RUNDIR_EVENTS);
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &text, &size);
  free(path);
  if (s) {
    st_status_free(s);
    return -1;
  }
  int64_t steps = -1;
  char* line = text;
  while (line < text + size) {
    char* end = memchr(line, '\n', (size_t)(text + size - line));
    size_t n = end ? (size_t)(end - line) : (size_t)(text + size - line);
    if (n > 0 && memmem(line, n, "\"run_done\"", 10)) {
      json_t* e = json_loadb(line, n, 0, NULL);
      const char* name = json_string_value(json_object_get(e, "event"));
      int64_t v = 0;
      if (name && !strcmp(name, "run_done") && st_json_as_int(json_object_get(e, "steps"), &v)) steps = v;
      json_decref(e);
    }
    line += n + 1;
  }
  free(text);
  return steps;
}

/* A path's parent folder (new string); "/" stays "/". */
static char* st__parent(const char* path) {
  char* p = st_xstrdup(path);
  char* slash = strrchr(p, '/');
  if (slash && slash != p) *slash = '\0';
  else if (slash) slash[1] = '\0';
  return p;
}

/* The identity a checkpoint's manifest records. */
static void st__record_of_ckpt(const st_ckpt* c, st_plan_record* r) {
  r->model = json_incref(c->model);
  r->tokenizer_hash = c->tokenizer_hash ? st_xstrdup(c->tokenizer_hash) : NULL;
  r->source = st_path_join(c->dir, ST_CKPT_MANIFEST);
  r->label = "in the checkpoint";
}

/* The final parameters have no manifest: the run's context.json records
 * the tokenizer and (since the description existed) the model. */
static void st__record_of_run(const char* run_dir, st_plan_record* r) {
  r->source = st_rundir_path(run_dir, ST_RUNDIR_CONTEXT);
  r->label = "in context.json";
  json_t* j = NULL;
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(r->source, &text, &size);
  if (!s) s = st_json_parse(text, size, r->source, &j);
  st_status_free(s);
  free(text);
  const json_t* m = json_object_get(j, "model");
  const char* tok = json_string_value(json_object_get(j, "tokenizer_hash"));
  if (json_is_object(m)) r->model = json_incref((json_t*)m);
  if (tok) r->tokenizer_hash = st_xstrdup(tok);
  json_decref(j);
}

static st_status st__from_run(char* run_dir, st_plan_trained_ref* out) {
  char* root = st_rundir_path(run_dir, ST_RUNDIR_CHECKPOINTS);
  st_ckpt* c = NULL;
  int skipped = 0;
  st_status s = st_fs_is_dir(root) ? st_ckpt_find_valid(root, NULL, NULL, NULL, &c, &skipped) : ST_OK;
  free(root);
  if (s) {
    free(run_dir);
    return s;
  }
  char* final = st_rundir_path(run_dir, ST_RUNDIR_PARAMS);
  int64_t final_steps = st_fs_exists(final) ? st__run_done_steps(run_dir) : -2;
  /* A checkpoint of per-rank shards (fsdp across processes) has no
   * params.safetensors; the run's own, whole, serves when it is as new. */
  if (c && c->whole_count > 0 && !(final_steps >= c->step)) {
    s = st_status_make(ST_CODE_CONFIG,
                       "run directory '%s': its newest checkpoint %s is per-rank shards (fsdp across processes), which this "
                       "command does not read (docs/checkpoints.md, \"Per-rank shards\"), and the run's params.safetensors is "
                       "%s; resume the run to its end (it writes params.safetensors whole) and try again",
                       run_dir, c->dir, final_steps == -2 ? "missing" : "older");
    free(final);
  } else if (c && c->whole_count == 0 && !(final_steps > c->step)) {
    out->params_path = st_path_join(c->dir, ST_CKPT_PARAMS);
    out->step = c->step;
    st__record_of_ckpt(c, &out->record);
    free(final);
  } else if (final_steps != -2) {
    out->params_path = final;
    out->step = final_steps;
    st__record_of_run(run_dir, &out->record);
  } else {
    free(final);
    /* Checkpoints that all fail verification are a checkpoint problem
     * (exit 7); none at all is a run that saved nothing yet (exit 2). */
    s = st_status_make(skipped ? ST_CODE_CKPT : ST_CODE_CONFIG,
                       "run directory '%s' has no parameters to load: no valid checkpoint under checkpoints/%s and no "
                       "params.safetensors (a run writes them as it trains and when it ends)",
                       run_dir, skipped ? " (every one failed verification; `strata ckpt verify` says why)" : "");
  }
  st_ckpt_free(c);
  if (s) {
    free(run_dir);
    return s;
  }
  out->run_dir = run_dir;
  out->config_path = st_rundir_path(run_dir, ST_RUNDIR_CONFIG);
  return ST_OK;
}

static st_status st__from_checkpoint(char* dir, st_plan_trained_ref* out) {
  st_ckpt* c = NULL;
  st_status s = st_ckpt_open(dir, NULL, &c);
  if (s) {
    free(dir);
    return s;
  }
  int64_t step = c->step;
  st__record_of_ckpt(c, &out->record);
  st_ckpt_free(c);
  char* parent = st__parent(dir);
  char* run_dir = st__parent(parent);
  const char* base = strrchr(parent, '/');
  char* config = st_rundir_path(run_dir, ST_RUNDIR_CONFIG);
  if (!base || strcmp(base + 1, st_rundir_name(ST_RUNDIR_CHECKPOINTS)) || !st_fs_exists(config)) {
    s = st_status_make(ST_CODE_CONFIG,
                       "checkpoint '%s' is not inside a run directory: looked for %s (a checkpoint is read from "
                       "<run>/checkpoints/step_N, next to the run's config.yaml)",
                       dir, config);
    free(parent);
    free(run_dir);
    free(config);
    free(dir);
    st_plan_record_deinit(&out->record);
    return s;
  }
  free(parent);
  out->run_dir = run_dir;
  out->config_path = config;
  out->params_path = st_path_join(dir, ST_CKPT_PARAMS);
  out->step = step;
  free(dir);
  return ST_OK;
}

st_status st_plan_locate_trained(const char* path, st_plan_trained_ref* out) {
  memset(out, 0, sizeof(*out));
  if (!path || !path[0]) return st_status_make(ST_CODE_CONFIG, "no run directory or checkpoint folder given");
  char buf[PATH_MAX];
  if (!realpath(path, buf))
    return st_status_make(ST_CODE_CONFIG, "'%s': %s (expected a run directory or a checkpoint folder)", path, strerror(errno));
  if (!st_fs_is_dir(buf))
    return st_status_make(ST_CODE_CONFIG, "'%s' is not a folder (expected a run directory or a checkpoint folder)", path);
  char* manifest = st_path_join(buf, ST_CKPT_MANIFEST);
  char* config = st_rundir_path(buf, ST_RUNDIR_CONFIG);
  bool is_ckpt = st_fs_exists(manifest), is_run = st_fs_exists(config);
  free(manifest);
  free(config);
  if (is_ckpt) return st__from_checkpoint(st_xstrdup(buf), out);
  if (is_run) return st__from_run(st_xstrdup(buf), out);
  return st_status_make(ST_CODE_CONFIG,
                        "'%s' is neither a run directory (no config.yaml) nor a checkpoint folder (no %s); name "
                        "runs/<id> or runs/<id>/checkpoints/step_<N>",
                        path, ST_CKPT_MANIFEST);
}
