/* status.c — st_status: a heap-allocated code + message, NULL for OK. */
#include "strata/status.h"

#include "strata/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An assert() in src/ is an invariant whose failure is a bug strata must not
 * run past (docs/architecture.md, "assert"): every build keeps them. */
#ifdef NDEBUG
#error "strata is built with assert() on: do not define NDEBUG (CMakeLists.txt takes it out of the build types)"
#endif

struct st_status_s {
  st_code code;
  char* message; /* owned */
};


static char* st__vformat(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) return st_xstrdup(fmt); /* a conversion failed: keep the template */
  char* buf = st_xmalloc((size_t)n + 1);
  vsnprintf(buf, (size_t)n + 1, fmt, ap);
  return buf;
}

st_status st_status_makev(st_code code, const char* fmt, va_list ap) {
  st_status s = st_xmalloc(sizeof(*s));
  s->code = code == ST_CODE_OK ? ST_CODE_INTERNAL : code;
  s->message = st__vformat(fmt, ap);
  return s;
}

st_status st_status_make(st_code code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  st_status s = st_status_makev(code, fmt, ap);
  va_end(ap);
  return s;
}

st_status st_status_annotate(st_status status, const char* fmt, ...) {
  if (!status) return status;
  va_list ap;
  va_start(ap, fmt);
  char* prefix = st__vformat(fmt, ap);
  va_end(ap);
  if (prefix[0] == '\0') {
    free(prefix);
    return status;
  }
  size_t n = strlen(prefix) + 2 + strlen(status->message) + 1;
  char* joined = st_xmalloc(n);
  snprintf(joined, n, "%s: %s", prefix, status->message);
  free(status->message);
  status->message = joined;
  free(prefix);
  return status;
}

st_status st_status_recode(st_status status, st_code code, const char* fmt, ...) {
  status = st_status_set_code(status, code);
  if (!status) return status;
  va_list ap;
  va_start(ap, fmt);
  char* prefix = st__vformat(fmt, ap);
  va_end(ap);
  status = st_status_annotate(status, "%s", prefix);
  free(prefix);
  return status;
}

st_status st_status_set_code(st_status status, st_code code) {
  if (status && code != ST_CODE_OK) status->code = code;
  return status;
}

st_code st_status_code(st_status status) { return status ? status->code : ST_CODE_OK; }

const char* st_status_message(st_status status) { return status ? status->message : ""; }

void st_status_free(st_status status) {
  if (!status) return;
  free(status->message);
  free(status);
}

st_status st_status_join(st_status first, st_status second) {
  if (first) {
    st_status_free(second);
    return first;
  }
  return second;
}

int st_status_exit_code(st_status status) { return st_code_exit_code(st_status_code(status)); }

int st_code_exit_code(st_code code) {
  switch (code) {
    case ST_CODE_OK: return 0;
    case ST_CODE_CONFIG: return 2;
    case ST_CODE_DATA: return 3;
    case ST_CODE_RUNTIME: return 4;
    case ST_CODE_NUMERICS: return 5;
    case ST_CODE_HANG: return 6;
    case ST_CODE_CKPT: return 7;
    case ST_CODE_IO: return 9;
    case ST_CODE_INTERNAL: return 1;
    case ST_CODE_INTERRUPTED: return 8;
    case ST_CODE_MEMORY: return 4;
  }
  return 1;
}

const char* st_code_name(st_code code) {
  switch (code) {
    case ST_CODE_OK: return "ok";
    case ST_CODE_CONFIG: return "config error";
    case ST_CODE_DATA: return "data error";
    case ST_CODE_RUNTIME: return "runtime error";
    case ST_CODE_NUMERICS: return "numerics error";
    case ST_CODE_HANG: return "hang";
    case ST_CODE_CKPT: return "checkpoint error";
    case ST_CODE_IO: return "i/o error";
    case ST_CODE_INTERNAL: return "internal error";
    case ST_CODE_INTERRUPTED: return "interrupted";
    case ST_CODE_MEMORY: return "out of memory";
  }
  return "unknown error";
}

const char* st_code_key(st_code code) {
  switch (code) {
    case ST_CODE_OK: return "ok";
    case ST_CODE_CONFIG: return "config";
    case ST_CODE_DATA: return "data";
    case ST_CODE_RUNTIME: return "runtime";
    case ST_CODE_NUMERICS: return "numerics";
    case ST_CODE_HANG: return "hang";
    case ST_CODE_CKPT: return "checkpoint";
    case ST_CODE_IO: return "io";
    case ST_CODE_INTERNAL: return "internal";
    case ST_CODE_INTERRUPTED: return "interrupted";
    case ST_CODE_MEMORY: return "memory";
  }
  return "unknown";
}
