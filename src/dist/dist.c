/* dist.c — launch detection from the environment, and the public entry
 * points: a job of one is served here without MPI; a multi-process job goes
 * to mpi.c. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "dist/dist_internal.h"
#include "strata/base.h"

const char* st_dist_launcher_name(st_dist_launcher launcher) {
  switch (launcher) {
    case ST_DIST_LAUNCHER_NONE: return "none";
    case ST_DIST_LAUNCHER_OPENMPI: return "openmpi";
    case ST_DIST_LAUNCHER_SLURM: return "slurm";
    case ST_DIST_LAUNCHER_PMI: return "pmi";
    case ST_DIST_LAUNCHER_PMIX: return "pmix";
  }
  return "?";
}

/*--- detection ---------------------------------------------------------------*/

/* A variable as a non-negative int: 1 and *out when set and well formed,
 * 0 when unset, an error when set to anything else. */
static st_status env_int(st_dist_env_fn lookup, void* user, const char* name, int* out, bool* set) {
  const char* v = lookup(name, user);
  *set = v != NULL;
  if (!v) return ST_OK;
  char* end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end != '\0' || x < 0 || x > INT_MAX)
    return st_status_make(ST_CODE_CONFIG, "launcher environment: %s='%s' is not a non-negative number", name, v);
  *out = (int)x;
  return ST_OK;
}

/* Reads one launcher's (size, rank, local rank) variables; *found when its
 * marker variable (the rank) is set. */
static st_status read_launcher(st_dist_env_fn lookup, void* user, const char* size_name, const char* size_alt,
                               const char* rank_name, const char* local_name, bool* found, st_dist_launch* out) {
  bool rank_set = false, size_set = false, local_set = false;
  ST_RETURN(env_int(lookup, user, rank_name, &out->rank, &rank_set));
  *found = rank_set;
  if (!rank_set) return ST_OK;
  /* srun sets SLURM_NTASKS for the whole allocation too (an sbatch script's
   * own environment); the step's count is the one that matters. */
  if (size_alt) ST_RETURN(env_int(lookup, user, size_alt, &out->world_size, &size_set));
  if (!size_set && size_name) ST_RETURN(env_int(lookup, user, size_name, &out->world_size, &size_set));
  if (!size_set) out->world_size = 0;
  if (local_name) ST_RETURN(env_int(lookup, user, local_name, &out->local_rank, &local_set));
  if (!local_set) out->local_rank = -1;
  if (size_set && out->world_size == 0)
    return st_status_make(ST_CODE_CONFIG, "launcher environment: %s=0 (a job has at least one process)",
                          size_alt && lookup(size_alt, user) ? size_alt : size_name);
  if (size_set && out->rank >= out->world_size)
    return st_status_make(ST_CODE_CONFIG, "launcher environment: %s=%d is not below the job's size %d (%s)", rank_name,
                          out->rank, out->world_size, size_alt && lookup(size_alt, user) ? size_alt : size_name);
  return ST_OK;
}

st_status st_dist_detect_from(st_dist_env_fn lookup, void* user, st_dist_launch* out) {
  if (!lookup || !out) return st_status_make(ST_CODE_INTERNAL, "st_dist_detect_from: NULL argument");
  static const struct {
    st_dist_launcher launcher;
    const char *size, *size_alt, *rank, *local;
  } kLaunchers[] = {
      {ST_DIST_LAUNCHER_OPENMPI, "OMPI_COMM_WORLD_SIZE", NULL, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {ST_DIST_LAUNCHER_SLURM, "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID"},
      {ST_DIST_LAUNCHER_PMI, "PMI_SIZE", NULL, "PMI_RANK", NULL},
      /* PMIx puts only the rank in the environment: the size comes from MPI. */
      {ST_DIST_LAUNCHER_PMIX, NULL, NULL, "PMIX_RANK", NULL},
  };
  for (size_t i = 0; i < sizeof(kLaunchers) / sizeof(kLaunchers[0]); i++) {
    st_dist_launch l = {.launcher = kLaunchers[i].launcher};
    bool found = false;
    st_status s = read_launcher(lookup, user, kLaunchers[i].size, kLaunchers[i].size_alt, kLaunchers[i].rank,
                                kLaunchers[i].local, &found, &l);
    if (s) return s;
    if (!found) continue;
    /* A job of one (mpirun -np 1, srun -n 1) runs as a plain process. */
    l.multi = l.world_size != 1;
    if (!l.multi && l.local_rank < 0) l.local_rank = 0;
    *out = l;
    return ST_OK;
  }
  *out = (st_dist_launch){.launcher = ST_DIST_LAUNCHER_NONE, .multi = false, .world_size = 1, .rank = 0, .local_rank = 0};
  return ST_OK;
}

static const char* process_env(const char* name, void* user) {
  (void)user;
  return getenv(name);
}

st_status st_dist_detect(st_dist_launch* out) { return st_dist_detect_from(process_env, NULL, out); }

st_status dist_thread_level_error(const char* provided) {
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
  dist_kv_init(&d->kv);
  if (d->multi) {
    st_status s = dist_mpi_init(d);
    if (s) {
      dist_kv_destroy(&d->kv);
      free(d);
      return s;
    }
  }
  *out = d;
  return ST_OK;
}

st_status st_dist_finalize(st_dist* d) {
  if (!d) return ST_OK;
  st_status s = d->multi ? dist_mpi_finalize(d) : ST_OK;
  dist_kv_destroy(&d->kv);
  free(d);
  return s;
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
  return dist_mpi_agree(d, keys, values, n);
}

/*--- the store ----------------------------------------------------------------------*/

static st_status check_key(const char* what, const st_dist* d, const char* key) {
  if (!d || !key) return st_status_make(ST_CODE_INTERNAL, "%s: NULL argument", what);
  if (!*key) return st_status_make(ST_CODE_INTERNAL, "%s: empty key", what);
  return ST_OK;
}

st_status st_dist_kv_put(st_dist* d, const char* key, const void* value, size_t size) {
  ST_RETURN(check_key("st_dist_kv_put", d, key));
  if (!value && size) return st_status_make(ST_CODE_INTERNAL, "st_dist_kv_put '%s': NULL value of %zu bytes", key, size);
  if (d->rank == 0) {
    dist_kv_put(&d->kv, key, value ? value : "", size);
    return ST_OK;
  }
  return dist_mpi_kv_put(d, key, value ? value : "", size);
}

st_status st_dist_kv_get(st_dist* d, const char* key, int64_t timeout_ms, void** value, size_t* size) {
  ST_RETURN(check_key("st_dist_kv_get", d, key));
  if (!value || !size) return st_status_make(ST_CODE_INTERNAL, "st_dist_kv_get '%s': NULL out", key);
  if (timeout_ms < 0)
    return st_status_make(ST_CODE_INTERNAL, "st_dist_kv_get '%s': negative timeout %lld ms", key, (long long)timeout_ms);
  *value = NULL;
  *size = 0;
  if (d->rank == 0) {
    char* v = dist_kv_wait(&d->kv, key, st_now() + (double)timeout_ms / 1e3, size);
    if (!v) return dist_kv_timeout_error(key, timeout_ms, d->size);
    *value = v;
    return ST_OK;
  }
  bool found = false;
  ST_RETURN(dist_mpi_kv_get(d, key, timeout_ms, &found, value, size));
  if (!found) return dist_kv_timeout_error(key, timeout_ms, d->size);
  return ST_OK;
}

st_status st_dist_kv_try_get(st_dist* d, const char* key, bool* found, void** value, size_t* size) {
  ST_RETURN(check_key("st_dist_kv_try_get", d, key));
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
  return dist_mpi_kv_get(d, key, -1, found, value, size);
}
