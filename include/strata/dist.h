/*
 * strata/dist.h — one process of a multi-process job (docs/multiprocess.md).
 *
 * A run is started either plainly (one process: everything here is local,
 * MPI is never initialised and nothing is printed about it) or by a
 * launcher, `mpirun` or Slurm's `srun`, as one rank of several. This module
 * knows which (st_dist_detect, from the launcher's environment alone),
 * initialises MPI for the second kind, checks at start-up that every rank
 * resolved the same run (st_dist_agree), serves the key-value store a
 * GPU plugin's client uses to find its peers (st_dist_kv_*; one store, held
 * by rank 0, reached over MPI), and carries the plan's cross-process
 * collectives on host float buffers (st_dist_coll_*: queued by the caller,
 * progressed by a thread of dist's own, waited on where the result is
 * needed) and a few blocking exchanges (st_dist_allgather_f64, _barrier,
 * _broadcast).
 *
 * Objects and lifetimes
 *   st_dist   the process's place in the job. st_dist_init makes it (at most
 *             once per process: MPI cannot be initialised twice), and
 *             st_dist_finalize ends it; every rank must call finalize, since
 *             it waits for all ranks before rank 0 stops serving the store.
 *   st_dist_coll  one queued collective: st_dist_coll_start makes it, the
 *             caller owns it until st_dist_coll_wait frees it; its buffer
 *             is borrowed until then.
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
 * them, in the same order, from one thread; so are allgather_f64, barrier
 * and broadcast. st_dist_coll_start is called from one thread at a time
 * (its order is the order of issue); done, wait and pending from any.
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

/* Completes every queued collective (issuing those not yet issued, so no
 * other rank is left waiting on this one) and stops the progress thread,
 * frees the collectives not waited on (their handles die here; the failure
 * of one of them is returned), waits for every rank (multi-process), stops
 * rank 0's store, finalises MPI and frees |dist|. No st_dist_kv_* or
 * st_dist_coll_* call may be in progress or follow. NULL is a no-op.
 * Returns the first failure; |dist| is freed regardless. */
st_status st_dist_finalize(st_dist* dist);

/* Ends the whole job now, for a failure the other ranks do not share
 * (docs/multiprocess.md, "Failures"): without it they would wait for this
 * rank in their next collective forever. In a multi-process job: stdout
 * and stderr flushed, then MPI_Abort on the world with |exit_code|; Open
 * MPI's mpirun kills every other rank and exits with that code. Does not
 * return there (should MPI_Abort return, the process _exits with the
 * code). A no-op that returns for NULL, a job of one and a binary built
 * without MPI. The caller writes what must survive (its failed event, its
 * error) before: nothing after is cleaned up. */
void st_dist_abort(st_dist* dist, int exit_code);

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

/* The store as a PJRT client's key-value store (strata/runtime.h,
 * st_runtime_options.kv): put, get (a wait that runs out is *found false,
 * which the runtime answers the plugin with DEADLINE_EXCEEDED) and try_get
 * on |dist|, node_id its rank, num_nodes the world size. |dist| must
 * outlive the runtime created with it: finalize after st_runtime_destroy
 * (the plugin may still use the store after the client exists). NULL
 * |dist| zeroes *out (no store). */
struct st_runtime_kv;
void st_dist_runtime_kv(st_dist* dist, struct st_runtime_kv* out);

/*--- cross-process collectives -------------------------------------------*/

/* Cross-process collectives: the plan's XPROC ops (docs/multiprocess.md). Every reduction sums in rank order
 * 0..size-1 (so a fixed process count is bitwise reproducible): a reduce-scatter is an MPI_Ialltoall of the
 * size blocks followed by a sum of the received blocks in rank order; an all-reduce is that reduce-scatter
 * followed by an MPI_Iallgather of the reduced blocks; an all-gather is an MPI_Iallgather. */
typedef enum st_dist_coll_kind {
  ST_DIST_ALL_REDUCE,     /* data[0..count): this rank's contribution; after: the sum over ranks */
  ST_DIST_REDUCE_SCATTER, /* data[0..count): this rank's contribution; after: block |rank| (count/size elements
                             at data + rank*count/size) holds that block of the sum; the rest is unspecified */
  ST_DIST_ALL_GATHER,     /* block |rank| of data holds this rank's part; after: every rank's block */
} st_dist_coll_kind;
const char* st_dist_coll_kind_name(st_dist_coll_kind kind); /* "all_reduce", "reduce_scatter", "all_gather" */

typedef struct st_dist_coll_request {
  st_dist_coll_kind kind;
  float* data;   /* borrowed until st_dist_coll_wait returns */
  size_t count;  /* elements; REDUCE_SCATTER / ALL_GATHER: a multiple of the world size (ALL_REDUCE: any count,
                    the engine pads internally) */
  /* Optional, called on the progress thread: before() right before the MPI operation is issued, in queue
   * order (it may block, e.g. waiting for a device-to-host copy into |data|; nothing else progresses on this
   * rank meanwhile, so it must not wait for anything that needs an earlier collective's result); after() once
   * the result is in |data|, as each collective completes (not necessarily in queue order: a short all-gather
   * may complete before a long all-reduce queued ahead of it). A failure of either fails the collective with
   * that status (the collective is still carried out with the other ranks when before() failed, on whatever
   * |data| holds, so no rank is left waiting; after() is then not called, nor when MPI failed). In a job of
   * one both run inside st_dist_coll_start, on the caller's thread. */
  st_status (*before)(void* user);
  st_status (*after)(void* user);
  void* user;
  const char* name; /* copied; in errors and for the hang watchdog ("grad:layers.3.wq"); NULL: "unnamed" */
} st_dist_coll_request;

/* Bytes one rank sends for a collective of |count| elements over |size| ranks, as st_dist_coll_timing.bytes_sent
 * reports it: (size-1) blocks of count/size elements per phase, two phases (alltoall, then all-gather) and blocks
 * of the padded count for an all-reduce, so about 2(size-1)/size of the message; 0 when size <= 1. For `strata
 * plan --explain`, which counts the XPROC ops' traffic without running them. */
int64_t st_dist_coll_bytes_sent(st_dist_coll_kind kind, size_t count, int size);

typedef struct st_dist_coll st_dist_coll;
typedef struct st_dist_coll_timing {
  double queued_s, started_s, completed_s; /* st_now() seconds: queued, MPI issued (after before()), result in data */
  int64_t bytes_sent;                      /* bytes this rank sent for it: (size-1) blocks per phase (all-reduce:
                                              two phases, blocks of the padded count); 0 in a job of one */
} st_dist_coll_timing;

/* Queues a collective. Never blocks on other ranks. Every rank must queue the same collectives (kind, count) in
 * the same order; they are issued to MPI in queue order. In a job of one it completes at once (before/after still
 * called, data unchanged). *out is the caller's until st_dist_coll_wait. A request that cannot be carried out (a
 * count that is not a multiple of the world size, a block over INT_MAX elements, NULL data, after finalize has
 * begun) is ST_CODE_INTERNAL and queues nothing: every rank refuses it alike. */
st_status st_dist_coll_start(st_dist* dist, const st_dist_coll_request* req, st_dist_coll** out);
bool st_dist_coll_done(const st_dist_coll* coll);   /* never blocks */
/* Blocks until |coll| is complete, returns its status, fills |timing| (may be NULL) and frees |coll|. */
st_status st_dist_coll_wait(st_dist_coll* coll, st_dist_coll_timing* timing);
/* What the progress thread is doing now (for the hang watchdog's bundle): the name and kind of the oldest
 * collective not yet complete, into buf; false when none. Thread-safe. The text is the kind, the quoted
 * name and its state: "all_reduce 'grad:layers.3.wq': issued to MPI 12.3 s ago, waiting for the other ranks";
 * truncated to fit |size| (NUL-terminated when size > 0). */
bool st_dist_coll_pending(st_dist* dist, char* buf, size_t size);

/*--- blocking exchanges (main thread, per step or at start-up) ------------*/

/* Every rank's |n| doubles gathered, in rank order, into out[size*n] (MPI_Allgather on a communicator of its
 * own, main thread). A job of one copies. Collective. */
st_status st_dist_allgather_f64(st_dist* dist, const double* in, size_t n, double* out);
/* A barrier over every rank (MPI_Barrier on the same communicator); OK at once in a job of one. */
st_status st_dist_barrier(st_dist* dist);
/* Rank 0's bytes to every rank: on rank 0 *data and *size are the input; on the others they receive a new allocation
 * (the caller's, free; NUL-terminated after *size bytes, for text). A job of one returns at once. Collective.
 * Rank 0 given NULL data of a non-zero size fails, and so does every other rank (ST_CODE_INTERNAL). */
st_status st_dist_broadcast(st_dist* dist, void** data, size_t* size);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_DIST_H */
