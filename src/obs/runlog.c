/* runlog.c — events.jsonl, metrics.jsonl and the progress line. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>

#include "strata/base.h"
#include "strata/obs.h"

st_status st_runlog_lock_dir(const char* dir, int* out_fd) {
  char* lock = st_path_join(dir, ".lock");
  long holder = 0;
  st_status s = ST_OK;
  *out_fd = st_fs_lock_inherited(lock);
  if (*out_fd < 0) s = st_fs_lock(lock, out_fd, &holder);
  if (!s && *out_fd < 0 && holder == -1)
    fprintf(stderr, "strata: warning: %s: this filesystem has no flock; nothing stops a second process from using %s\n",
            lock, dir);
  else if (!s && *out_fd < 0)
    s = st_status_make(ST_CODE_CONFIG,
                       "run directory '%s' is in use by another strata process (pid %ld holds %s); wait for it or stop "
                       "it, or set run.dir to a new folder",
                       dir, holder, lock);
  free(lock);
  return s;
}

bool st_runlog_dir_has_run(const char* dir) {
  /* metrics.jsonl gets its first line when the first step is recorded;
   * checkpoints and params.safetensors come later still. Events and
   * config.yaml alone are what a run that failed before its first step
   * leaves: an empty run, which may be reused. */
  char* metrics = st_path_join(dir, "metrics.jsonl");
  char* params = st_path_join(dir, "params.safetensors");
  char* ckpts = st_path_join(dir, "checkpoints");
  struct stat st;
  bool has = (stat(metrics, &st) == 0 && st.st_size > 0) || st_fs_exists(params);
  DIR* d = has ? NULL : opendir(ckpts);
  struct dirent* e;
  while (d && !has && (e = readdir(d)) != NULL) has = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  if (d) closedir(d);
  free(metrics);
  free(params);
  free(ckpts);
  return has;
}

struct st_runlog {
  FILE* events;
  FILE* metrics;
};

static st_status st__open_append(const char* dir, const char* name, FILE** out) {
  char* path = st_path_join(dir, name);
  *out = fopen(path, "a");
  st_status s = *out ? ST_OK : st_status_make(ST_CODE_IO, "cannot open '%s' for appending: %s", path, strerror(errno));
  free(path);
  return s;
}

st_status st_runlog_open(const char* dir, st_runlog** out_log) {
  *out_log = NULL;
  st_runlog* log = st_xcalloc(1, sizeof(*log));
  st_status s = st__open_append(dir, "events.jsonl", &log->events);
  if (!s) s = st__open_append(dir, "metrics.jsonl", &log->metrics);
  if (s) {
    st_runlog_close(log);
    return s;
  }
  *out_log = log;
  return ST_OK;
}

void st_runlog_close(st_runlog* log) {
  if (!log) return;
  if (log->events) fclose(log->events);
  if (log->metrics) fclose(log->metrics);
  free(log);
}

/* One fputs of a complete line, then fflush: the unit of durability. */
static st_status st__write_line(FILE* f, const char* line, const char* what) {
  if (fputs(line, f) < 0 || fflush(f) != 0) return st_status_make(ST_CODE_IO, "writing %s failed: %s", what, strerror(errno));
  return ST_OK;
}

st_status st_runlog_event(st_runlog* log, const char* name, const char* fields_json) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  st_strbuf b = {0};
  st_strbuf_printf(&b, "{\"time\": %.3f, \"event\": ", (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec);
  st_strbuf_json_string(&b, name);
  if (fields_json && fields_json[0]) st_strbuf_printf(&b, ", %s", fields_json);
  st_strbuf_append(&b, "}\n");
  st_status s = st__write_line(log->events, b.data, "events.jsonl");
  st_strbuf_free(&b);
  return s;
}

st_status st_runlog_metrics(st_runlog* log, const char* object_json) {
  st_strbuf b = {0};
  st_strbuf_printf(&b, "%s\n", object_json);
  st_status s = st__write_line(log->metrics, b.data, "metrics.jsonl");
  st_strbuf_free(&b);
  return s;
}

void st_progress_print(bool enabled, int64_t step, int64_t total, double loss, double tokens_per_s, double eta_s) {
  if (!enabled) return;
  int eta = eta_s > 0 ? (int)(eta_s + 0.5) : 0;
  fprintf(stderr, "\rstep %lld/%lld  loss %.4f  %.1fk tok/s  ETA %dm%02ds   ", (long long)step, (long long)total, loss,
          tokens_per_s / 1000.0, eta / 60, eta % 60);
  fflush(stderr);
}

void st_progress_end(bool enabled) {
  if (enabled) fputc('\n', stderr);
}
