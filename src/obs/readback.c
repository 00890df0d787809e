/* readback.c — bounded reads of run-directory files (readback.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>

#include "obs/readback.h"
#include "strata/base.h"

bool st_readback_bounded(const char* path, size_t max, char** out, size_t* out_size, bool* out_cut) {
  *out = NULL;
  *out_size = 0;
  *out_cut = false;
  /* O_NONBLOCK: a FIFO planted under a file's name must not hang the reader
   * (fstat then turns it away). */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return false;
  }
  size_t want = (size_t)st.st_size < max ? (size_t)st.st_size : max;
  *out_cut = (size_t)st.st_size > max;
  char* buf = st_xmalloc(want + 1);
  size_t got = 0;
  while (got < want) {
    ssize_t n = pread(fd, buf + got, want - got, (off_t)got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  buf[got] = '\0';
  *out = buf;
  *out_size = got;
  return true;
}

st_status st_readback_json_object(const char* path, size_t max, json_t** out_json) {
  *out_json = NULL;
  if (!st_fs_exists(path)) return ST_OK;
  char* text = NULL;
  size_t size = 0;
  bool cut = false;
  if (!st_readback_bounded(path, max, &text, &size, &cut))
    return st_status_make(ST_CODE_CONFIG, "'%s' cannot be read as a regular file", path);
  st_status s = ST_OK;
  json_t* j = NULL;
  if (cut) {
    s = st_status_make(ST_CODE_CONFIG, "'%s' is larger than %zu bytes: not a file strata wrote", path, max);
  } else {
    st_status ps = st_json_parse(text, size, path, &j);
    /* The parser's class is runtime (a bundle's JSON); a run directory's
     * file is the user's input here: exit 2. */
    if (ps) s = st_status_make(ST_CODE_CONFIG, "%s", st_status_message(ps));
    else if (!json_is_object(j)) s = st_status_make(ST_CODE_CONFIG, "'%s' is not a JSON object", path);
    st_status_free(ps);
  }
  free(text);
  if (s) json_decref(j);
  else *out_json = j;
  return s;
}
