/* tensorboard.c — TensorBoard event files: every metrics line as scalars
 * (strata/obs.h, docs/using.md "TensorBoard").
 *
 * What is whose: the Event / Summary protos are encoded by libprotobuf-c
 * (Debian, from our own minimal tb_event.proto, compiled by protoc-c at
 * build time). The record framing (length, CRC-32C, masking) and the
 * CRC-32C itself are written here: the framing is TensorBoard's format
 * (no library of it in Debian), and the one Debian C library with a
 * CRC-32C (ISA-L, libisal-dev: crc32_iscsi) ships no static archive, which
 * the portable binary (make build-portable) needs; a dynamic-only
 * dependency for a ten-line loop was not worth it. The CRC is the bitwise
 * form (no table, so no global state): a step's record is a few kilobytes. */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/obs.h"
#include "tb_event.pb-c.h"

struct st_tb_writer {
  int fd;
  char* path;
  off_t size; /* bytes written so far: where a write cut short is cut back to */
};

uint32_t st_tb_crc32c(const void* data, size_t size) {
  const unsigned char* p = data;
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return crc ^ 0xFFFFFFFFu;
}

/* TensorBoard (after TensorFlow's record format) stores CRCs rotated and
 * offset, since a CRC of data that holds CRCs is weak. */
uint32_t st_tb_mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

static void st__put_le(st_strbuf* out, uint64_t v, int bytes) {
  char b[8];
  for (int i = 0; i < bytes; ++i) b[i] = (char)(unsigned char)(v >> (8 * i));
  st_strbuf_append_n(out, b, (size_t)bytes);
}

void st_tb_frame(st_strbuf* out, const void* data, size_t size) {
  size_t at = out->len;
  st__put_le(out, (uint64_t)size, 8);
  st__put_le(out, st_tb_mask_crc(st_tb_crc32c(out->data + at, 8)), 4);
  st_strbuf_append_n(out, data, size);
  st__put_le(out, st_tb_mask_crc(st_tb_crc32c(data, size)), 4);
}

/* One record, in one write(2) when the kernel allows: the file only ever
 * ends in whole records, but for a torn last one when the process dies
 * mid-write. A write that fails part-way is cut back off. */
static st_status st__append_record(st_tb_writer* w, const void* data, size_t size) {
  st_strbuf rec = {0};
  st_tb_frame(&rec, data, size);
  size_t done = 0;
  st_status s = ST_OK;
  while (done < rec.len) {
    ssize_t n = write(w->fd, rec.data + done, rec.len - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      bool back = done == 0 || ftruncate(w->fd, w->size) == 0;
      s = st_status_make(ST_CODE_IO,
                         "writing TensorBoard events to '%s' failed: %s%s; set obs.tensorboard=false to run "
                         "without them",
                         w->path, strerror(err),
                         back ? "" : " (a torn last record is left; TensorBoard stops reading there)");
      break;
    }
    done += (size_t)n;
  }
  if (!s) w->size += (off_t)done;
  st_strbuf_free(&rec);
  return s;
}

static double st__wall_time(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

static st_status st__write_event(st_tb_writer* w, StrataTb__Event* ev) {
  size_t n = strata_tb__event__get_packed_size(ev);
  uint8_t* buf = st_xmalloc(n ? n : 1);
  strata_tb__event__pack(ev, buf);
  st_status s = st__append_record(w, buf, n);
  free(buf);
  return s;
}

st_status st_tb_open(const char* dir, st_tb_writer** out_writer) {
  *out_writer = NULL;
  st_status s = st_fs_mkdirs(dir);
  if (s) return s;
  char host[256] = "localhost";
  if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "localhost");
  host[sizeof(host) - 1] = '\0';
  for (char* c = host; *c; ++c)
    if (*c == '/') *c = '_';
  /* TensorBoard reads a folder's files in name order: the time first keeps
   * a resumed run's file after the earlier ones. */
  long now = (long)st__wall_time();
  st_tb_writer* w = st_xcalloc(1, sizeof(*w));
  w->fd = -1;
  for (int n = 0; n < 1000 && w->fd < 0; ++n) {
    char name[512];
    if (n == 0)
      snprintf(name, sizeof(name), "events.out.tfevents.%ld.%s.%ld", now, host, (long)getpid());
    else
      snprintf(name, sizeof(name), "events.out.tfevents.%ld.%s.%ld.%d", now, host, (long)getpid(), n);
    free(w->path);
    w->path = st_path_join(dir, name);
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0 && errno != EEXIST) break;
  }
  if (w->fd < 0) {
    s = st_status_make(ST_CODE_IO,
                       "cannot create the TensorBoard event file '%s': %s; set obs.tensorboard=false to run without it",
                       w->path, strerror(errno));
    st_tb_close(w);
    return s;
  }
  StrataTb__Event ev = STRATA_TB__EVENT__INIT;
  ev.wall_time = st__wall_time();
  ev.what_case = STRATA_TB__EVENT__WHAT_FILE_VERSION;
  ev.file_version = (char*)"brain.Event:2";
  s = st__write_event(w, &ev);
  if (s) {
    st_tb_close(w);
    return s;
  }
  *out_writer = w;
  return ST_OK;
}

void st_tb_close(st_tb_writer* writer) {
  if (!writer) return;
  if (writer->fd >= 0) close(writer->fd);
  free(writer->path);
  free(writer);
}

const char* st_tb_path(const st_tb_writer* writer) { return writer->path; }

typedef struct st__scalars {
  char** tags;
  double* values;
  size_t count, cap;
} st__scalars;

static void st__tb_collect(const json_t* obj, const char* prefix, st__scalars* out) {
  const char* key;
  json_t* v;
  json_object_foreach((json_t*)obj, key, v) {
    if (!*prefix && !strcmp(key, "step")) continue; /* the event's step, not a scalar */
    st_strbuf tag = {0};
    st_strbuf_printf(&tag, "%s%s%s", prefix, *prefix ? "/" : "", key);
    if (json_is_object(v)) {
      st__tb_collect(v, st_strbuf_cstr(&tag), out);
    } else if (json_is_number(v)) {
      if (out->count == out->cap) {
        out->cap = out->cap ? 2 * out->cap : 32;
        out->tags = st_xrealloc(out->tags, out->cap * sizeof(*out->tags));
        out->values = st_xrealloc(out->values, out->cap * sizeof(*out->values));
      }
      out->values[out->count] = json_number_value(v);
      out->tags[out->count++] = st_strbuf_take(&tag);
    }
    st_strbuf_free(&tag);
  }
}

/* TensorBoard's scalars are float32 (tf.summary.scalar casts to it, and
 * the data server behind `tensorboard` reads only float scalars). A double
 * beyond float's range becomes an infinity rather than the undefined cast. */
static float st__to_float(double v) {
  if (v > FLT_MAX) return INFINITY;
  if (v < -FLT_MAX) return -INFINITY;
  return (float)v;
}

st_status st_tb_write_metrics(st_tb_writer* writer, const json_t* object) {
  st__scalars sc = {0};
  st__tb_collect(object, "", &sc);
  if (!sc.count) return ST_OK;

  StrataTb__Summary__Value* values = st_xcalloc(sc.count, sizeof(*values));
  StrataTb__Summary__Value** value_ptrs = st_xcalloc(sc.count, sizeof(*value_ptrs));
  for (size_t i = 0; i < sc.count; ++i) {
    StrataTb__Summary__Value v = STRATA_TB__SUMMARY__VALUE__INIT;
    v.tag = sc.tags[i];
    v.value_case = STRATA_TB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = st__to_float(sc.values[i]);
    values[i] = v;
    value_ptrs[i] = &values[i];
  }
  StrataTb__Summary summary = STRATA_TB__SUMMARY__INIT;
  summary.n_value = sc.count;
  summary.value = value_ptrs;
  StrataTb__Event ev = STRATA_TB__EVENT__INIT;
  ev.wall_time = st__wall_time();
  json_t* step = json_object_get(object, "step");
  ev.step = json_is_integer(step) ? (int64_t)json_integer_value(step) : 0;
  ev.what_case = STRATA_TB__EVENT__WHAT_SUMMARY;
  ev.summary = &summary;
  st_status s = st__write_event(writer, &ev);

  for (size_t i = 0; i < sc.count; ++i) free(sc.tags[i]);
  free(sc.tags);
  free(sc.values);
  free(value_ptrs);
  free(values);
  return s;
}
