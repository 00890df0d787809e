/* runlog.c — events.jsonl, metrics.jsonl and the progress line. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/obs.h"

struct st_runlog {
  int events_fd;
  int metrics_fd;
  st_tb_writer* tb; /* NULL: no TensorBoard files (obs.tensorboard=false) */
};

st_status st_runlog_repair_tail(const char* path, long* out_cut) {
  *out_cut = 0;
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? ST_OK : st_status_make(ST_CODE_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat st;
  st_status s = ST_OK;
  if (fstat(fd, &st) != 0) s = st_status_make(ST_CODE_IO, "cannot stat '%s': %s", path, strerror(errno));
  off_t size = s ? 0 : st.st_size;
  /* Every line is written with its newline in one write(2): a file that
   * does not end in one was cut mid-write (a full disk, a power loss).
   * Scan back for the last newline; what follows it is the torn line. */
  off_t keep = size;
  char buf[4096];
  while (!s && keep > 0) {
    off_t from = keep > (off_t)sizeof(buf) ? keep - (off_t)sizeof(buf) : 0;
    ssize_t got = pread(fd, buf, (size_t)(keep - from), from);
    if (got != (ssize_t)(keep - from)) {
      s = st_status_make(ST_CODE_IO, "cannot read '%s': %s", path, got < 0 ? strerror(errno) : "short read");
      break;
    }
    ssize_t i = got;
    while (i > 0 && buf[i - 1] != '\n') --i;
    if (i > 0) {
      keep = from + i;
      break;
    }
    keep = from;
  }
  if (!s && keep < size) {
    if (ftruncate(fd, keep) != 0 || fsync(fd) != 0)
      s = st_status_make(ST_CODE_IO, "cannot cut the torn last line of '%s': %s", path, strerror(errno));
    else
      *out_cut = (long)(size - keep);
  }
  close(fd);
  return s;
}

static st_status st__open_append(const char* dir, st_rundir_entry e, int* out_fd, long* out_cut) {
  char* path = st_rundir_path(dir, e);
  st_status s = st_runlog_repair_tail(path, out_cut);
  *out_fd = s ? -1 : open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (!s && *out_fd < 0) s = st_status_make(ST_CODE_IO, "cannot open '%s' for appending: %s", path, strerror(errno));
  free(path);
  return s;
}

st_status st_runlog_open(const char* dir, st_runlog** out_log) {
  *out_log = NULL;
  st_runlog* log = st_xcalloc(1, sizeof(*log));
  log->events_fd = log->metrics_fd = -1;
  long cut[2] = {0, 0};
  st_status s = st__open_append(dir, ST_RUNDIR_EVENTS, &log->events_fd, &cut[0]);
  if (!s) s = st__open_append(dir, ST_RUNDIR_METRICS, &log->metrics_fd, &cut[1]);
  const char* names[2] = {st_rundir_name(ST_RUNDIR_EVENTS), st_rundir_name(ST_RUNDIR_METRICS)};
  for (int i = 0; i < 2 && !s; ++i) {
    if (!cut[i]) continue;
    fprintf(stderr, "strata: warning: %s/%s ended in a torn line (%ld bytes without a newline, from a write cut short); cut it "
                    "before appending\n",
            dir, names[i], cut[i]);
    json_t* e = st_json_obj();
    st_json_put_str(e, "file", names[i]);
    st_json_put_int(e, "cut_bytes", cut[i]);
    s = st_runlog_event(log, "log_repaired", e);
  }
  if (s) {
    st_runlog_close(log);
    return s;
  }
  *out_log = log;
  return ST_OK;
}

void st_runlog_close(st_runlog* log) {
  if (!log) return;
  if (log->events_fd >= 0) close(log->events_fd);
  if (log->metrics_fd >= 0) close(log->metrics_fd);
  st_tb_close(log->tb);
  free(log);
}

/* One write(2) of a complete line (O_APPEND): the unit of durability, and
 * whole lines even next to another appender (the supervisor). A write cut
 * short (a full disk) is taken back, so no torn line is left behind. */
static st_status st__write_line(int fd, const char* line, size_t n, const char* what) {
  struct stat st;
  off_t before = fstat(fd, &st) == 0 ? st.st_size : -1;
  size_t done = 0;
  while (done < n) {
    ssize_t w = write(fd, line + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int err = w < 0 ? errno : EIO;
      bool taken_back = false;
      if (done > 0 && before >= 0 && fstat(fd, &st) == 0 && st.st_size == before + (off_t)done)
        taken_back = ftruncate(fd, before) == 0;
      return st_status_make(ST_CODE_IO, "writing %s failed: %s%s", what, strerror(err),
                            done == 0      ? ""
                            : taken_back ? " (the partial line was removed)"
                                         : " (a partial line is left; the next resume cuts it)");
    }
    done += (size_t)w;
  }
  return ST_OK;
}

static st_status st__write_json_line(int fd, const json_t* v, const char* what) {
  char* text = st_json_dump(v, 0);
  st_strbuf line = {0};
  st_strbuf_append(&line, text);
  st_strbuf_append(&line, "\n");
  free(text);
  st_status s = st__write_line(fd, line.data, line.len, what);
  st_strbuf_free(&line);
  return s;
}

st_status st_runlog_event(st_runlog* log, const char* name, json_t* fields) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  json_t* e = st_json_obj();
  st_json_put(e, "time", st_json_fixed((double)tv.tv_sec + 1e-6 * (double)tv.tv_usec, 3));
  st_json_put_str(e, "event", name);
  st_json_merge(e, fields);
  st_status s = st__write_json_line(log->events_fd, e, st_rundir_name(ST_RUNDIR_EVENTS));
  json_decref(e);
  return s;
}

st_status st_runlog_metrics(st_runlog* log, json_t* object) {
  st_status s = st__write_json_line(log->metrics_fd, object, st_rundir_name(ST_RUNDIR_METRICS));
  if (!s && log->tb) s = st_tb_write_metrics(log->tb, object);
  json_decref(object);
  return s;
}

st_status st_runlog_tensorboard(st_runlog* log, const char* tb_dir) {
  st_tb_close(log->tb);
  log->tb = NULL;
  return st_tb_open(tb_dir, &log->tb);
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
