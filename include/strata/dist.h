/*
 * strata/dist.h — one process of a multi-process job (docs/multiprocess.md).
 *
 * A run is started either plainly (one process: everything here is local,
 * MPI is never initialised and nothing is printed about it) or by a
 * launcher, `mpirun` or Slurm's `srun`, as one rank of several. This module
 * knows which (st_dist_detect, from the launcher's environment alone),
 * initialises MPI for the second kind, checks at start-up that every rank
 * resolved the same run (st_dist_agree), and serves the key-value store a
 * GPU plugin's client uses to find its peers (st_dist_kv_*; one store, held
 * by rank 0, reached over MPI).
 *
 * Objects and lifetimes
 *   st_dist   the process's place in the job. st_dist_init makes it (at most
 *             once per process: MPI cannot be initialised twice), and
 *             st_dist_finalize ends it; every rank must call finalize, since
 *             it waits for all ranks before rank 0 stops serving the store.
 *
 * Errors: a launcher environment that contradicts itself or MPI is
 * ST_CODE_CONFIG (exit 2); MPI failures (turned into statuses with MPI's own
 * message: MPI_ERRORS_RETURN, never an abort) and a thread level below the
 * one wanted are ST_CODE_RUNTIME (exit 4); ranks that resolved different
 * runs get ST_CODE_CONFIG naming the first differing key. A binary built
 * without MPI (STRATA_NO_MPI: build-portable) runs single processes as
 * usual and refuses a multi-process launch with ST_CODE_RUNTIME.
 *
 * Thread-safety: st_dist_kv_* may be called from any thread at any time
 * between init and finalize (PJRT calls its key-value callbacks from its
 * own threads). init, agree and finalize are collective: every rank calls
 * them, in the same order, from one thread.
 */
#ifndef STRATA_DIST_H
#define STRATA_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum st_dist_launcher {
  ST_DIST_LAUNCHER_NONE = 0, /* a plain process */
  ST_DIST_LAUNCHER_OPENMPI,  /* mpirun / mpiexec of Open MPI: OMPI_COMM_WORLD_* */
  ST_DIST_LAUNCHER_SLURM,    /* srun: SLURM_PROCID with SLURM_STEP_NUM_TASKS or SLURM_NTASKS */
  ST_DIST_LAUNCHER_PMI,      /* a PMI-1/2 launcher (MPICH's hydra, srun --mpi=pmi2): PMI_SIZE, PMI_RANK */
  ST_DIST_LAUNCHER_PMIX,     /* a PMIx launcher (prterun, srun --mpi=pmix): PMIX_RANK */
} st_dist_launcher;

/* "none", "openmpi", "slurm", "pmi", "pmix" (static strings). */
const char* st_dist_launcher_name(st_dist_launcher launcher);

/* What the launcher's environment says about this process. */
typedef struct st_dist_launch {
  st_dist_launcher launcher;
  /* One rank of a job of more than one process: st_dist_init initialises
   * MPI. False for a plain process and for a job of one (`mpirun -np 1`
   * runs exactly like a plain process). */
  bool multi;
  int world_size; /* 1 for a plain process; 0 when only MPI can tell (PMIx) */
  int rank;       /* 0 .. world_size-1 */
  int local_rank; /* rank among this host's processes; -1 when the launcher
                     does not say (st_dist_init then asks MPI) */
} st_dist_launch;

/* Reads this process's environment (getenv). Never initialises MPI and
 * prints nothing. Checked in the order Open MPI, Slurm, PMI, PMIx: mpirun
 * inside a Slurm allocation is an Open MPI launch. ST_CODE_CONFIG when the
 * variables of the launcher found are not numbers or contradict each other
 * (a rank outside 0..size-1), naming them. */
st_status st_dist_detect(st_dist_launch* out);

/* The same from another environment (tests; a supervisor that looks at a
 * child's environment): |lookup| returns a variable's value or NULL. */
typedef const char* (*st_dist_env_fn)(const char* name, void* user);
st_status st_dist_detect_from(st_dist_env_fn lookup, void* user, st_dist_launch* out);

typedef struct st_dist st_dist;

/* The process's place in the job. For |launch|->multi: MPI_Init_thread
 * asking MPI_THREAD_MULTIPLE (the key-value store is served and used from
 * several threads while the main thread communicates), with errors
 * returned, the world size and rank checked against |launch|, the local
 * rank taken from MPI where the launcher gave none. Otherwise no MPI call
 * at all: a job of one, with a store in this process. |launch| NULL means
 * st_dist_detect's. On success *out is owned by the caller (st_dist_finalize). */
st_status st_dist_init(const st_dist_launch* launch, st_dist** out);

/* Waits for every rank (multi-process), stops rank 0's store, finalises MPI
 * and frees |dist|. No st_dist_kv_* call may be in progress or follow.
 * NULL is a no-op. Returns the first failure; |dist| is freed regardless. */
st_status st_dist_finalize(st_dist* dist);

bool st_dist_multi(const st_dist* dist);
int st_dist_size(const st_dist* dist);
int st_dist_rank(const st_dist* dist);
int st_dist_local_rank(const st_dist* dist);

/* The start-up agreement. Each rank passes the run as it resolved it:
 * |n| (key, value) strings, in an order every rank shares (config keys,
 * bundle key, kernel selection, plan hash ...). Ranks exchange one hash;
 * where any rank's list differs from rank 0's, every rank returns the same
 * ST_CODE_CONFIG error naming the first differing key (in rank 0's order;
 * ties go to the lowest rank) with rank 0's value and the other rank's
 * ("train.lr: rank 0 has 0.001, rank 1 has 0.002"). A key one side lacks
 * is said to be absent. Always OK for a job of one. Collective. */
st_status st_dist_agree(st_dist* dist, const char* const* keys, const char* const* values, size_t n);

/* The key-value store (GPU bootstrap: PJRT_Client_Create's kv callbacks;
 * docs/multiprocess.md). Keys are NUL-terminated strings, values bytes. A
 * put of an existing key replaces its value. */
st_status st_dist_kv_put(st_dist* dist, const char* key, const void* value, size_t size);

/* Waits until some rank has put |key| or |timeout_ms| (>= 0) has passed.
 * On success *value (NUL-terminated after *size bytes, for text) is the
 * caller's (free). A key still missing at the deadline is
 * ST_CODE_RUNTIME naming the key and the wait. */
st_status st_dist_kv_get(st_dist* dist, const char* key, int64_t timeout_ms, void** value, size_t* size);

/* Looks once: *found false (and *value NULL) when no rank has put |key|. */
st_status st_dist_kv_try_get(st_dist* dist, const char* key, bool* found, void** value, size_t* size);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_DIST_H */
