/* cache.c — the bundle cache's policy (docs/bundle.md): a bundle is found
 * under <cache_root>/bundles/<key>, exported when missing or stale, never
 * replaced at a bundle.dir the user named, and the cache entry is locked
 * while it is checked, exported and opened. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "bundle/bundle_internal.h"
#include "strata/base.h"
#include "strata/bundle.h"

/* model.n_layers of the request's model JSON; -1 when it has none. */
static int64_t st__requested_depth(const char* model_json) {
  json_t* m = NULL;
  int64_t n = -1;
  st_status s = st_json_parse(model_json, strlen(model_json), "model", &m);
  if (!s) s = st_json_get_int(m, "n_layers", "model", &n);
  if (s) n = -1;
  st_status_free(s);
  json_decref(m);
  return n;
}
/* Two strata processes on one machine share the cache: two runs started
 * together, or the test suite's parallel runners. Without a lock both see
 * the bundle missing and export it, and one can open the folder in the
 * moment the other's exporter swaps it into place. An exclusive flock on
 * <dir>.lock around the check, the export and the open serialises them; the
 * second finds the first's bundle and exports nothing. Polled, so a stop
 * signal while waiting ends the wait. -1 (no lock) when the lock file cannot
 * be created: a read-only cache still serves its bundles. */
static int st__lock_cache_entry(const char* dir, int (*stop_signal)(void), st_status* out_status) {
  *out_status = ST_OK;
  st_strbuf path = {0};
  st_strbuf_printf(&path, "%s.lock", dir);
  char* parent = st_xstrdup(dir);
  char* slash = strrchr(parent, '/');
  if (slash && slash != parent) {
    *slash = '\0';
    st_status_free(st_fs_mkdirs(parent));
  }
  free(parent);
  int fd = open(path.data, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  st_strbuf_free(&path);
  if (fd < 0) return -1;
  for (;;) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    if (errno != EWOULDBLOCK && errno != EINTR) {
      close(fd);
      return -1;
    }
    int sig = stop_signal ? stop_signal() : 0;
    if (sig) {
      close(fd);
      *out_status = st_status_make(ST_CODE_INTERRUPTED, "stopped by signal %d while waiting for another strata process to export '%s'",
                                   sig, dir);
      return -1;
    }
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}
static st_status st__ensure_locked(const st_bundle_request* req, st_bundle** out_bundle, bool* out_exported);

st_status st_bundle_ensure(const st_bundle_request* req, st_bundle** out_bundle, bool* out_exported) {
  *out_bundle = NULL;
  *out_exported = false;
  if (req->dir && req->dir[0]) return st__ensure_locked(req, out_bundle, out_exported); /* never exported into */
  char key[17];
  st_bundle_key(req, key);
  st_strbuf dir = {0};
  st_strbuf_printf(&dir, "%s/bundles/%s", req->cache_root, key);
  st_status s = ST_OK;
  int fd = st__lock_cache_entry(dir.data, req->stop_signal, &s);
  st_strbuf_free(&dir);
  if (s) return s;
  s = st__ensure_locked(req, out_bundle, out_exported);
  if (fd >= 0) close(fd); /* releases the flock */
  return s;
}
static st_status st__ensure_locked(const st_bundle_request* req, st_bundle** out_bundle, bool* out_exported) {
  *out_bundle = NULL;
  *out_exported = false;
  char key[17];
  st_bundle_key(req, key);
  char* dir;
  if (req->dir && req->dir[0]) {
    dir = st_xstrdup(req->dir);
  } else {
    st_strbuf d = {0};
    st_strbuf_printf(&d, "%s/bundles/%s", req->cache_root, key);
    dir = d.data;
  }
  st_bundle* b = NULL;
  st_bundle* previous = NULL;
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
      /* A cached bundle is ours to replace: stale means re-export. Its
       * manifest, when it still parses, is what the lint compares with. */
      previous = st__bundle_manifest_of(dir);
      fprintf(stderr, "strata: stale bundle, re-exporting: %s\n", st_status_message(s));
      st_status_free(s);
      s = ST_OK;
    }
  }
  if (!b) {
    st_bundle_export_args args = {.model_json = req->model_json, .mesh = req->mesh, .process_fsdp = req->process_fsdp, .key = key, .dir = dir,
                                  .progress = req->progress, .stop_signal = req->stop_signal};
    s = st_bundle_export(&args);
    if (!s) s = st_bundle_open(dir, &b);
    if (!s && strcmp(b->key, key) != 0)
      s = st_status_make(ST_CODE_RUNTIME, "exporter wrote bundle key '%s' into '%s', expected '%s'", b->key, dir, key);
    if (!s) *out_exported = true;
  }
  /* A bundle exported for another depth serves this one. */
  int64_t depth = st__requested_depth(req->model_json);
  if (!s && depth > 0) s = st__bundle_set_depth(b, depth);
  /* The compile contract (lint.c), against the cache's bundle of the same
   * key when this one is another (bundle.dir) or replaced it (re-export). */
  if (!s) {
    st_strbuf other = {0};
    st_strbuf_printf(&other, "%s/bundles/%s", req->cache_root ? req->cache_root : "", key);
    st_bundle* prev = previous;
    previous = NULL;
    if (!prev && req->dir && req->dir[0] && req->cache_root && strcmp(other.data, dir)) prev = st__bundle_manifest_of(other.data);
    st_lint_bundle(b, prev, &b->lint);
    st_bundle_destroy(prev);
    st_strbuf_free(&other);
    s = st_lint_status(&b->lint, dir);
  }
  st_bundle_destroy(previous);
  free(dir);
  if (s) {
    st_bundle_destroy(b);
    return s;
  }
  *out_bundle = b;
  return ST_OK;
}
