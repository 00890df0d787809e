/* dist.c — the public entry points: a job of one is served here without
 * MPI; a multi-process job goes to mpi.c. Detection is in detect.c. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "strata/base.h"
#include "strata/runtime.h" /* st_runtime_kv */

st_status st__dist_thread_level_error(const char* provided) {
  return st_status_make(ST_CODE_RUNTIME,
                        "MPI provides %s, strata needs MPI_THREAD_MULTIPLE (rank 0's key-value store is served by "
                        "its own thread while other threads communicate): use an MPI built with thread support "
                        "(Open MPI: ompi_info says \"MPI_THREAD_MULTIPLE: yes\")",
                        provided);
}

/*--- the process's place -------------------------------------------------------*/

st_status st_dist_init(const st_dist_launch* launch, st_dist** out) {
  if (!out) return st_status_make(ST_CODE_INTERNAL, "st_dist_init: NULL out");
  *out = NULL;
  st_dist_launch detected;
  if (!launch) {
    ST_RETURN(st_dist_detect(&detected));
    launch = &detected;
  }
  st_dist* d = st_xcalloc(1, sizeof(*d));
  d->launch = *launch;
  d->multi = launch->multi;
  d->size = 1;
  d->rank = 0;
  d->local_rank = 0;
  st__dist_kv_init(&d->kv);
  st_status s = d->multi ? st__dist_mpi_init(d) : ST_OK;
  if (!s) {
    s = st__dist_coll_init(d);
    /* Every rank meets the same failure: all of them end MPI. */
    if (s && d->multi) st_status_free(st__dist_mpi_finalize(d));
  }
  if (s) {
    st__dist_kv_destroy(&d->kv);
    free(d);
    return s;
  }
  *out = d;
  return ST_OK;
}

st_status st_dist_finalize(st_dist* d) {
  if (!d) return ST_OK;
  /* Collectives first: a rank must not reach MPI's end while others still
   * wait for its part of one. */
  st_status s = st__dist_coll_finalize(d);
  if (d->multi) s = st_status_join(s, st__dist_mpi_finalize(d));
  st__dist_kv_destroy(&d->kv);
  free(d);
  return s;
}

void st_dist_abort(st_dist* d, int exit_code) {
  if (d && d->multi && d->mpi) st__dist_mpi_abort(d, exit_code);
}

bool st_dist_multi(const st_dist* d) { return d && d->multi; }
int st_dist_size(const st_dist* d) { return d ? d->size : 1; }
int st_dist_rank(const st_dist* d) { return d ? d->rank : 0; }
int st_dist_local_rank(const st_dist* d) { return d ? d->local_rank : 0; }

/*--- agreement -------------------------------------------------------------------*/

st_status st_dist_agree(st_dist* d, const char* const* keys, const char* const* values, size_t n) {
  if (!d || (n && (!keys || !values))) return st_status_make(ST_CODE_INTERNAL, "st_dist_agree: NULL argument");
  for (size_t i = 0; i < n; i++)
    if (!keys[i] || !values[i]) return st_status_make(ST_CODE_INTERNAL, "st_dist_agree: pair %zu has a NULL string", i);
  if (!d->multi) return ST_OK;
  return st__dist_mpi_agree(d, keys, values, n);
}

/*--- the store ----------------------------------------------------------------------*/

static st_status st__dist_check_key(const char* what, const st_dist* d, const char* key) {
  if (!d || !key) return st_status_make(ST_CODE_INTERNAL, "%s: NULL argument", what);
  if (!*key) return st_status_make(ST_CODE_INTERNAL, "%s: empty key", what);
  return ST_OK;
}

st_status st_dist_kv_put(st_dist* d, const char* key, const void* value, size_t size) {
  ST_RETURN(st__dist_check_key("st_dist_kv_put", d, key));
  if (!value && size) return st_status_make(ST_CODE_INTERNAL, "st_dist_kv_put '%s': NULL value of %zu bytes", key, size);
  if (d->rank == 0) {
    st__dist_kv_put(&d->kv, key, value ? value : "", size);
    return ST_OK;
  }
  return st__dist_mpi_kv_put(d, key, value ? value : "", size);
}

/* st_dist_kv_get with a wait that ran out as *found false, not an error:
 * the PJRT adapter answers it with DEADLINE_EXCEEDED, other failures with
 * INTERNAL. */
static st_status st__dist_kv_wait(st_dist* d, const char* key, int64_t timeout_ms, bool* found, void** value,
                                  size_t* size) {
  ST_RETURN(st__dist_check_key("st_dist_kv_get", d, key));
  if (!found || !value || !size) return st_status_make(ST_CODE_INTERNAL, "st_dist_kv_get '%s': NULL out", key);
  if (timeout_ms < 0)
    return st_status_make(ST_CODE_INTERNAL, "st_dist_kv_get '%s': negative timeout %lld ms", key, (long long)timeout_ms);
  *found = false;
  *value = NULL;
  *size = 0;
  if (d->rank == 0) {
    char* v = dist_kv_wait(&d->kv, key, st_now() + (double)timeout_ms / 1e3, size);
    *found = v != NULL;
    *value = v;
    return ST_OK;
  }
  return st__dist_mpi_kv_get(d, key, timeout_ms, found, value, size);
}

st_status st_dist_kv_get(st_dist* d, const char* key, int64_t timeout_ms, void** value, size_t* size) {
  bool found = false;
  ST_RETURN(st__dist_kv_wait(d, key, timeout_ms, &found, value, size));
  if (!found) return st__dist_kv_timeout_error(key, timeout_ms, d->size);
  return ST_OK;
}

st_status st_dist_kv_try_get(st_dist* d, const char* key, bool* found, void** value, size_t* size) {
  ST_RETURN(st__dist_check_key("st_dist_kv_try_get", d, key));
  if (!found || !value || !size) return st_status_make(ST_CODE_INTERNAL, "st_dist_kv_try_get '%s': NULL out", key);
  *found = false;
  *value = NULL;
  *size = 0;
  if (d->rank == 0) {
    char* v = dist_kv_lookup(&d->kv, key, size);
    *found = v != NULL;
    *value = v;
    return ST_OK;
  }
  return st__dist_mpi_kv_get(d, key, -1, found, value, size);
}

/*--- the store as a PJRT client's (st_runtime_kv) ----------------------------------*/

static st_status st__dist_rkv_put(void* user, const char* key, const void* value, size_t size) {
  return st_dist_kv_put(user, key, value, size);
}

static st_status st__dist_rkv_get(void* user, const char* key, int64_t timeout_ms, bool* found, void** value,
                                  size_t* size) {
  return st__dist_kv_wait(user, key, timeout_ms, found, value, size);
}

static st_status st__dist_rkv_try_get(void* user, const char* key, bool* found, void** value, size_t* size) {
  return st_dist_kv_try_get(user, key, found, value, size);
}

void st_dist_runtime_kv(st_dist* d, st_runtime_kv* out) {
  memset(out, 0, sizeof(*out));
  if (!d) return;
  out->put = st__dist_rkv_put;
  out->get = st__dist_rkv_get;
  out->try_get = st__dist_rkv_try_get;
  out->user = d;
  out->node_id = d->rank;
  out->num_nodes = d->size;
}
