/*
 * test_util.h — helpers shared by strata's C tests (header-only, static).
 *
 *   tu_tmpdir / tu_rmtree        scratch folders
 *   tu_group_tmp_*               a test group's scratch folder
 *   tu_read_file / tu_write_file whole-file I/O
 *   tu_testprogs_*               the JAX-exported test programs
 *                                (python -m strata_jax.testprogs DIR)
 */
#ifndef STRATA_TESTS_TEST_UTIL_H
#define STRATA_TESTS_TEST_UTIL_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata/runtime.h"

/* Assertions on st_status, for tests that include cmocka.h first. */
#ifdef fail_msg
#include <stdarg.h>

#define ASSERT_OK(expr)                                                      \
  do {                                                                       \
    st_status s_ = (expr);                                                   \
    if (s_) fail_msg("%s failed: %s", #expr, st_status_message(s_));         \
  } while (0)

/* Asserts |s| failed with |code| and a message containing every needle
 * (a NULL-terminated list); frees |s|. */
static inline void tu_assert_error(st_status s, st_code code, ...) {
  if (!s) fail_msg("expected an error, got OK");
  const char* msg = st_status_message(s);
  if (st_status_code(s) != code)
    fail_msg("expected code %s, got %s: %s", st_code_name(code), st_code_name(st_status_code(s)), msg);
  va_list ap;
  va_start(ap, code);
  const char* needle;
  while ((needle = va_arg(ap, const char*)) != NULL) {
    if (!strstr(msg, needle)) {
      va_end(ap);
      fail_msg("error message lacks '%s': %s", needle, msg);
    }
  }
  va_end(ap);
  st_status_free(s);
}
#define ASSERT_ERROR(expr, code, ...) tu_assert_error((expr), (code), __VA_ARGS__, (const char*)NULL)
#endif

#ifndef STRATA_SOURCE_DIR
#define STRATA_SOURCE_DIR "."
#endif

/* A runtime with |cpu_devices| CPU devices for a test group's setup: 0 on
 * success, else -1 with the reason on stderr. *out owned by the caller. */
static inline int tu_runtime_create(int cpu_devices, st_runtime** out) {
  st_runtime_options o;
  st_runtime_options_init(&o);
  o.cpu_devices = cpu_devices;
  st_status s = st_runtime_create(&o, out);
  if (s) {
    fprintf(stderr, "runtime: %s\n", st_status_message(s));
    st_status_free(s);
    return -1;
  }
  return 0;
}

/* A fresh folder under $TMPDIR (or /tmp); caller frees the string. */
static inline char* tu_tmpdir(const char* tag) {
  const char* base = getenv("TMPDIR");
  if (!base || !base[0]) base = "/tmp";
  size_t n = strlen(base) + strlen(tag) + 32;
  char* p = malloc(n);
  if (!p) return NULL;
  snprintf(p, n, "%s/strata-%s-XXXXXX", base, tag);
  if (!mkdtemp(p)) {
    free(p);
    return NULL;
  }
  return p;
}

static inline int tu__rm_one(const char* path, const struct stat* sb, int flag, struct FTW* ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static inline void tu_rmtree(const char* path) {
  if (path && path[0]) nftw(path, tu__rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A test group's scratch folder: created by the group's setup, removed by
 * its teardown unless STRATA_KEEP_TEST_FILES is set (to look at it after a
 * failure). */
static inline int tu_group_tmp_setup(char** slot, const char* tag) {
  *slot = tu_tmpdir(tag);
  return *slot ? 0 : -1;
}

static inline int tu_group_tmp_teardown(char** slot) {
  if (!getenv("STRATA_KEEP_TEST_FILES")) tu_rmtree(*slot);
  free(*slot);
  *slot = NULL;
  return 0;
}

/* Reads a whole file; NULL when it cannot. Caller frees. */
static inline void* tu_read_file(const char* path, size_t* out_size) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void* data = malloc(n > 0 ? (size_t)n : 1);
  if (data && n > 0 && fread(data, 1, (size_t)n, f) != (size_t)n) {
    free(data);
    data = NULL;
  }
  fclose(f);
  if (data && out_size) *out_size = (size_t)(n > 0 ? n : 0);
  return data;
}

static inline int tu_write_file(const char* path, const void* data, size_t n) {
  FILE* f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(data, 1, n, f) == n;
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

/*--- test programs --------------------------------------------------------*/

#define TU_MAX_TENSORS 8

typedef struct {
  char file[1024]; /* absolute */
  st_tensor_type type;
} tu_tensor;

typedef struct {
  char name[64];
  char file[1024]; /* absolute */
  int bytecode;
  int n_in, n_out;
  tu_tensor in[TU_MAX_TENSORS], out[TU_MAX_TENSORS];
} tu_prog;

typedef struct {
  char* dir;
  int count;
  tu_prog progs[32];
} tu_testprogs;

static inline int tu__parse_dims(const char* s, st_tensor_type* t) {
  t->rank = 0;
  if (!strcmp(s, "-")) return 0;
  const char* p = s;
  while (*p) {
    if (t->rank >= ST_MAX_RANK) return -1;
    char* end;
    t->dims[t->rank++] = strtoll(p, &end, 10);
    if (end == p) return -1;
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}

/* Runs the exporter into a fresh folder and parses its index. Returns 0 on
 * success. The exporter is the repo's venv python with python/ on the path,
 * so the test does not depend on `make setup` having installed the package. */
static inline int tu_testprogs_make(tu_testprogs* tp) {
  memset(tp, 0, sizeof(*tp));
  tp->dir = tu_tmpdir("progs");
  if (!tp->dir) return -1;
  char cmd[2048];
  snprintf(cmd, sizeof(cmd),
           "cd '%s' && PYTHONPATH='%s/python' JAX_PLATFORMS=cpu '%s/.venv/bin/python' -m strata_jax.testprogs '%s' "
           ">'%s/export.log' 2>&1",
           STRATA_SOURCE_DIR, STRATA_SOURCE_DIR, STRATA_SOURCE_DIR, tp->dir, tp->dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "test programs: exporter failed, see %s/export.log\n", tp->dir);
    return -1;
  }
  char index[1024];
  snprintf(index, sizeof(index), "%s/index.txt", tp->dir);
  FILE* f = fopen(index, "r");
  if (!f) return -1;
  char line[1024];
  while (fgets(line, sizeof(line), f)) {
    char kind[16], name[64], a[256], b[64], c[64], d[256];
    int n = sscanf(line, "%15s %63s %255s %63s %63s %255s", kind, name, a, b, c, d);
    if (strlen(tp->dir) > 600) break; /* keeps the joined paths in bounds */
    if (n >= 4 && !strcmp(kind, "program")) {
      if (tp->count >= 32) break;
      tu_prog* p = &tp->progs[tp->count++];
      snprintf(p->name, sizeof(p->name), "%s", name);
      snprintf(p->file, sizeof(p->file), "%s/%s", tp->dir, a);
      p->bytecode = !strcmp(b, "bytecode");
    } else if (n == 6 && (!strcmp(kind, "in") || !strcmp(kind, "out"))) {
      tu_prog* p = NULL;
      for (int i = 0; i < tp->count; ++i)
        if (!strcmp(tp->progs[i].name, name)) p = &tp->progs[i];
      int idx = atoi(a);
      if (!p || idx < 0 || idx >= TU_MAX_TENSORS) continue;
      tu_tensor* t = kind[0] == 'i' ? &p->in[idx] : &p->out[idx];
      t->type.dtype = st_dtype_parse(b);
      if (tu__parse_dims(c, &t->type) != 0) continue;
      snprintf(t->file, sizeof(t->file), "%s/%s", tp->dir, d);
      if (kind[0] == 'i' && idx + 1 > p->n_in) p->n_in = idx + 1;
      if (kind[0] == 'o' && idx + 1 > p->n_out) p->n_out = idx + 1;
    }
  }
  fclose(f);
  return tp->count > 0 ? 0 : -1;
}

static inline const tu_prog* tu_testprogs_get(const tu_testprogs* tp, const char* name) {
  for (int i = 0; i < tp->count; ++i)
    if (!strcmp(tp->progs[i].name, name)) return &tp->progs[i];
  return NULL;
}

static inline void tu_testprogs_free(tu_testprogs* tp) {
  if (!tp->dir) return;
  if (!getenv("STRATA_KEEP_TEST_FILES")) tu_rmtree(tp->dir);
  free(tp->dir);
  tp->dir = NULL;
}

/*--- numeric comparison -----------------------------------------------------*/

static inline float tu_bf16_to_float(uint16_t v) {
  uint32_t bits = (uint32_t)v << 16;
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

/* Compares |got| with |want| (both |type|): integers and pred exactly,
 * floats within |rtol|*|want| + |atol|. Writes the first mismatch into
 * |why| and returns 0 when they differ. */
static inline int tu_close(const st_tensor_type* type, const void* got, const void* want, double rtol, double atol,
                           char* why, size_t why_size) {
  int64_t n = st_tensor_type_elements(type);
  size_t es = st_dtype_size(type->dtype);
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char* g = (const unsigned char*)got + (size_t)i * es;
    const unsigned char* w = (const unsigned char*)want + (size_t)i * es;
    double gv, wv;
    switch (type->dtype) {
      case ST_DTYPE_F32: {
        float a, b;
        memcpy(&a, g, 4);
        memcpy(&b, w, 4);
        gv = a;
        wv = b;
        break;
      }
      case ST_DTYPE_F64: memcpy(&gv, g, 8); memcpy(&wv, w, 8); break;
      case ST_DTYPE_BF16: {
        uint16_t a, b;
        memcpy(&a, g, 2);
        memcpy(&b, w, 2);
        gv = tu_bf16_to_float(a);
        wv = tu_bf16_to_float(b);
        break;
      }
      default:
        if (memcmp(g, w, es)) {
          snprintf(why, why_size, "element %lld differs (exact compare of %s)", (long long)i, st_dtype_name(type->dtype));
          return 0;
        }
        continue;
    }
    double diff = gv > wv ? gv - wv : wv - gv;
    double tol = atol + rtol * (wv < 0 ? -wv : wv);
    if (!(diff <= tol)) {
      snprintf(why, why_size, "element %lld: got %.9g, want %.9g (tol %.3g)", (long long)i, gv, wv, tol);
      return 0;
    }
  }
  return 1;
}

#endif /* STRATA_TESTS_TEST_UTIL_H */
