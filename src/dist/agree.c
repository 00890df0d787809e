/* agree.c — the start-up agreement's logic, without MPI: the hash each rank
 * sends, rank 0's list as one buffer, where another rank's list first
 * differs from it, and the error all ranks print. mpi.c does the exchange. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "strata/base.h"

static uint64_t st__dist_mix(uint64_t h, const void* data, size_t size) {
  uint64_t len = size;
  h = st_hash64(&len, sizeof(len), h);
  return st_hash64(data, size, h);
}

uint64_t st__dist_agree_hash(const char* const* keys, const char* const* values, size_t n) {
  uint64_t count = n;
  uint64_t h = st_hash64(&count, sizeof(count), 0x73747261u /* "stra" */);
  for (size_t i = 0; i < n; i++) {
    h = st__dist_mix(h, keys[i], strlen(keys[i]));
    h = st__dist_mix(h, values[i], strlen(values[i]));
  }
  return h;
}

char* dist_agree_pack(const char* const* keys, const char* const* values, size_t n, size_t* size) {
  st_strbuf b = {0};
  for (size_t i = 0; i < n; i++) {
    st_strbuf_append_n(&b, keys[i], strlen(keys[i]) + 1);
    st_strbuf_append_n(&b, values[i], strlen(values[i]) + 1);
  }
  *size = b.len;
  return st_strbuf_take(&b);
}

st_status st__dist_agree_unpack(const char* buf, size_t size, const char*** keys, const char*** values, size_t* n) {
  size_t strings = 0;
  for (size_t i = 0; i < size; i++) strings += buf[i] == '\0';
  if (strings % 2 != 0 || (size > 0 && buf[size - 1] != '\0'))
    return st_status_make(ST_CODE_INTERNAL, "agreement: rank 0's list of %zu bytes is not whole (key, value) pairs", size);
  size_t count = strings / 2;
  const char** k = st_xcalloc(count ? count : 1, sizeof(*k));
  const char** v = st_xcalloc(count ? count : 1, sizeof(*v));
  const char* p = buf;
  for (size_t i = 0; i < count; i++) {
    k[i] = p;
    p += strlen(p) + 1;
    v[i] = p;
    p += strlen(p) + 1;
  }
  *keys = k;
  *values = v;
  *n = count;
  return ST_OK;
}

static int64_t st__dist_find(const char* const* keys, size_t n, const char* key) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(keys[i], key) == 0) return (int64_t)i;
  return -1;
}

int64_t st__dist_agree_first_difference(const char* const* keys0, const char* const* values0, size_t n0,
                                    const char* const* keys, const char* const* values, size_t n,
                                    const char** key, const char** value0, const char** value) {
  for (size_t i = 0; i < n0; i++) {
    /* Same position first: the lists are usually in the same order, so the
     * search by name runs only where they are not. */
    int64_t j = (i < n && strcmp(keys[i], keys0[i]) == 0) ? (int64_t)i : st__dist_find(keys, n, keys0[i]);
    if (j >= 0 && strcmp(values[j], values0[i]) == 0) continue;
    *key = keys0[i];
    *value0 = values0[i];
    *value = j >= 0 ? values[j] : NULL;
    return (int64_t)i;
  }
  for (size_t j = 0; j < n; j++) {
    if (st__dist_find(keys0, n0, keys[j]) >= 0) continue;
    *key = keys[j];
    *value0 = NULL;
    *value = values[j];
    return (int64_t)(n0 + j);
  }
  /* Same pairs in another order: the hash still differs, and an order is
   * part of what ranks must share (it decides the order of their work). */
  for (size_t i = 0; i < n0 && i < n; i++) {
    if (strcmp(keys0[i], keys[i]) == 0) continue;
    *key = keys0[i];
    *value0 = values0[i];
    *value = values[st__dist_find(keys, n, keys0[i])];
    return (int64_t)i;
  }
  return -1;
}

st_status st__dist_agree_error(const char* key, const char* value0, int rank, const char* value) {
  st_strbuf b = {0};
  st_strbuf_printf(&b, "ranks resolved different runs: %s: ", key);
  if (value0)
    st_strbuf_printf(&b, "rank 0 has %s", value0);
  else
    st_strbuf_append(&b, "rank 0 has none");
  if (value)
    st_strbuf_printf(&b, ", rank %d has %s", rank, value);
  else
    st_strbuf_printf(&b, ", rank %d has none", rank);
  if (value0 && value && strcmp(value0, value) == 0)
    st_strbuf_append(&b, " (at another position: ranks must list their keys in the same order)");
  st_strbuf_append(&b, "; every rank must be started with the same config, overrides, bundle and kernels");
  st_status s = st_status_make(ST_CODE_CONFIG, "%s", st_strbuf_cstr(&b));
  st_strbuf_free(&b);
  return s;
}
