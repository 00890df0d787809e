/* kv_store.c — the key-value store's keys and values in one process (rank
 * 0's, or a job of one's), with a condition variable so a local get can
 * wait for a put from another thread. mpi.c serves it to the other ranks. */
#include <stdlib.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "dist/dist_internal.h"
#include "strata/base.h"

void st__dist_kv_init(dist_kv* kv) {
  memset(kv, 0, sizeof(*kv));
  pthread_mutex_init(&kv->mu, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  /* Deadlines are on the monotonic clock (st_now), not the wall clock a
   * time step would move. */
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&kv->cv, &attr);
  pthread_condattr_destroy(&attr);
}

void st__dist_kv_destroy(dist_kv* kv) {
  for (size_t i = 0; i < kv->n; i++) {
    free(kv->keys[i]);
    free(kv->values[i]);
  }
  free(kv->keys);
  free(kv->values);
  free(kv->sizes);
  pthread_cond_destroy(&kv->cv);
  pthread_mutex_destroy(&kv->mu);
  memset(kv, 0, sizeof(*kv));
}

static size_t st__dist_find_locked(dist_kv* kv, const char* key) {
  for (size_t i = 0; i < kv->n; i++)
    if (strcmp(kv->keys[i], key) == 0) return i;
  return kv->n;
}

static char* copy_value(const char* value, size_t size) {
  char* c = st_xmalloc(size + 1);
  if (size) memcpy(c, value, size);
  c[size] = '\0';
  return c;
}

void st__dist_kv_put(dist_kv* kv, const char* key, const void* value, size_t size) {
  char* copy = copy_value(value, size);
  pthread_mutex_lock(&kv->mu);
  size_t i = st__dist_find_locked(kv, key);
  if (i == kv->n) {
    if (kv->n == kv->cap) {
      kv->cap = kv->cap ? 2 * kv->cap : 16;
      kv->keys = st_xrealloc(kv->keys, kv->cap * sizeof(*kv->keys));
      kv->values = st_xrealloc(kv->values, kv->cap * sizeof(*kv->values));
      kv->sizes = st_xrealloc(kv->sizes, kv->cap * sizeof(*kv->sizes));
    }
    kv->keys[i] = st_xstrdup(key);
    kv->values[i] = NULL;
    kv->n++;
  }
  free(kv->values[i]);
  kv->values[i] = copy;
  kv->sizes[i] = size;
  kv->version++;
  pthread_cond_broadcast(&kv->cv);
  pthread_mutex_unlock(&kv->mu);
}

static char* lookup_locked(dist_kv* kv, const char* key, size_t* size) {
  size_t i = st__dist_find_locked(kv, key);
  if (i == kv->n) return NULL;
  *size = kv->sizes[i];
  return copy_value(kv->values[i], kv->sizes[i]);
}

char* dist_kv_lookup(dist_kv* kv, const char* key, size_t* size) {
  pthread_mutex_lock(&kv->mu);
  char* v = lookup_locked(kv, key, size);
  pthread_mutex_unlock(&kv->mu);
  return v;
}

char* dist_kv_wait(dist_kv* kv, const char* key, double deadline, size_t* size) {
  struct timespec until;
  double whole = floor(deadline);
  until.tv_sec = (time_t)whole;
  until.tv_nsec = (long)((deadline - whole) * 1e9);
  pthread_mutex_lock(&kv->mu);
  char* v;
  while (!(v = lookup_locked(kv, key, size))) {
    if (st_now() >= deadline) break;
    int rc = pthread_cond_timedwait(&kv->cv, &kv->mu, &until);
    if (rc == ETIMEDOUT) {
      v = lookup_locked(kv, key, size);
      break;
    }
  }
  pthread_mutex_unlock(&kv->mu);
  return v;
}

uint64_t st__dist_kv_version(dist_kv* kv) {
  pthread_mutex_lock(&kv->mu);
  uint64_t v = kv->version;
  pthread_mutex_unlock(&kv->mu);
  return v;
}

st_status st__dist_kv_timeout_error(const char* key, int64_t timeout_ms, int world_size) {
  return st_status_make(ST_CODE_RUNTIME,
                        "key-value store: no rank put '%s' within %" PRId64 " ms (%d rank%s; rank 0 holds the store)",
                        key, timeout_ms, world_size, world_size == 1 ? "" : "s");
}
