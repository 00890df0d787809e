/* jsonl.c — reading a JSON-lines log (events.jsonl, metrics.jsonl) that may
 * be huge, still being written, cut by a crash or written by someone else.
 *
 * The file is streamed through one buffer of max_line + ST__CHUNK bytes, so
 * memory does not grow with the file, and only the bytes present when it
 * was opened are read (a live run's appends do not keep the reader going). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/obs.h"

#define ST__CHUNK (64 * 1024)

static void st__jsonl_bad(st_jsonl_stats* stats, int64_t at, const char* why) {
  if (!stats->bad) {
    stats->first_bad_byte = at;
    stats->first_bad_why = why;
  }
  stats->bad++;
}

/* One complete line [p, p + len) at file offset |at|. Returns false to stop. */
static bool st__line(const char* path, const char* p, size_t len, int64_t at, st_jsonl_fn fn, void* user,
                     st_jsonl_stats* stats) {
  if (len == 0) return true;
  json_t* v = NULL;
  st_status s = st_json_parse(p, len, path, &v);
  if (s) {
    st_status_free(s);
    st__jsonl_bad(stats, at, "not JSON");
    return true;
  }
  if (!json_is_object(v)) {
    json_decref(v);
    st__jsonl_bad(stats, at, "not a JSON object");
    return true;
  }
  stats->lines++;
  bool go = fn(user, v, at);
  json_decref(v);
  return go;
}

st_status st_jsonl_read(const char* path, int64_t tail_bytes, size_t max_line, st_jsonl_fn fn, void* user,
                        st_jsonl_stats* stats) {
  memset(stats, 0, sizeof(*stats));
  stats->first_bad_byte = -1;
  if (max_line < 2) max_line = 2;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return st_status_make(ST_CODE_IO, "cannot read '%s': %s; check its permissions", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return st_status_make(ST_CODE_CONFIG, "'%s' is not a regular file; is this a run directory?", path);
  }
  int64_t end = (int64_t)st.st_size;
  int64_t start = tail_bytes > 0 && end > tail_bytes ? end - tail_bytes : 0;
  stats->skipped_bytes = start;
  size_t cap = max_line + ST__CHUNK;
  char* buf = st_xmalloc(cap);
  size_t len = 0;        /* bytes in buf */
  int64_t buf_at = start; /* file offset of buf[0] */
  /* Mid-file: the bytes up to the first newline end a line cut by the window. */
  bool discard = start > 0;
  bool overlong = false; /* the line being discarded was too long: a bad line */
  int64_t overlong_at = 0;
  bool go = true;
  st_status s = ST_OK;
  while (go) {
    int64_t off = buf_at + (int64_t)len;
    size_t want = cap - len;
    if ((int64_t)want > end - off) want = (size_t)(end - off);
    ssize_t n = 0;
    if (want > 0) {
      n = pread(fd, buf + len, want, (off_t)off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        s = st_status_make(ST_CODE_IO, "cannot read '%s': %s", path, strerror(errno));
        break;
      }
    }
    bool eof = n == 0; /* reached the size seen at open, or the file shrank meanwhile */
    len += (size_t)n;
    size_t p = 0;
    while (go) {
      char* nl = memchr(buf + p, '\n', len - p);
      if (!nl) break;
      size_t ll = (size_t)(nl - (buf + p));
      if (discard) {
        if (overlong) st__jsonl_bad(stats, overlong_at, "too long");
        discard = overlong = false;
      } else if (ll > max_line) {
        st__jsonl_bad(stats, buf_at + (int64_t)p, "too long");
      } else {
        go = st__line(path, buf + p, ll, buf_at + (int64_t)p, fn, user, stats);
      }
      p += ll + 1;
    }
    memmove(buf, buf + p, len - p);
    len -= p;
    buf_at += (int64_t)p;
    if (!go) break;
    if (len > max_line) {
      /* No newline within max_line bytes: drop what is here and the rest of the line. */
      if (!discard) {
        overlong = true;
        overlong_at = buf_at;
      }
      discard = true;
      buf_at += (int64_t)len;
      len = 0;
    }
    if (eof) {
      stats->torn = len > 0 || (discard && overlong);
      break;
    }
  }
  close(fd);
  free(buf);
  return s;
}
