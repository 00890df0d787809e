/* detect.c — which kind of process this is, from the launcher's
 * environment alone (st_dist_detect). Its own file, calling no MPI, so that
 * a single-process strata, which asks only this, links no MPI library. */
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
static st_status st__dist_env_int(st_dist_env_fn lookup, void* user, const char* name, int* out, bool* set) {
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
static st_status st__dist_read_launcher(st_dist_env_fn lookup, void* user, const char* size_name, const char* size_alt,
                               const char* rank_name, const char* local_name, bool* found, st_dist_launch* out) {
  bool rank_set = false, size_set = false, local_set = false;
  ST_RETURN(st__dist_env_int(lookup, user, rank_name, &out->rank, &rank_set));
  *found = rank_set;
  if (!rank_set) return ST_OK;
  /* srun sets SLURM_NTASKS for the whole allocation too (an sbatch script's
   * own environment); the step's count is the one that matters. */
  if (size_alt) ST_RETURN(st__dist_env_int(lookup, user, size_alt, &out->world_size, &size_set));
  if (!size_set && size_name) ST_RETURN(st__dist_env_int(lookup, user, size_name, &out->world_size, &size_set));
  if (!size_set) out->world_size = 0;
  if (local_name) ST_RETURN(st__dist_env_int(lookup, user, local_name, &out->local_rank, &local_set));
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
    st_status s = st__dist_read_launcher(lookup, user, kLaunchers[i].size, kLaunchers[i].size_alt, kLaunchers[i].rank,
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

static const char* st__dist_process_env(const char* name, void* user) {
  (void)user;
  return getenv(name);
}

st_status st_dist_detect(st_dist_launch* out) { return st_dist_detect_from(st__dist_process_env, NULL, out); }
