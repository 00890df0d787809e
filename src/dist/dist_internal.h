/*
 * dist_internal.h — dist's pieces behind strata/dist.h: the agreement's
 * pure logic (agree.c), the in-process key-value store (kv_store.c) and
 * the MPI transport (mpi.c, or its refusals under STRATA_NO_MPI). The pure
 * parts are tested without MPI (tests/c/test_dist.c).
 */
#ifndef STRATA_DIST_INTERNAL_H
#define STRATA_DIST_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/dist.h"

/*--- the agreement's logic (agree.c) ----------------------------------------*/

/* One hash of the whole list: counts, keys and values, each length-prefixed,
 * so ("ab","c") and ("a","bc") differ. */
uint64_t st__dist_agree_hash(const char* const* keys, const char* const* values, size_t n);

/* The list as one buffer: "key\0value\0" for each pair, to send rank 0's
 * list to every rank. Owned by the caller (free); *size its length. */
char* dist_agree_pack(const char* const* keys, const char* const* values, size_t n, size_t* size);
/* Splits a packed list back into pointers into |buf| (which must outlive
 * them). ST_CODE_INTERNAL when |buf| is not a whole number of pairs. Arrays
 * owned by the caller (free). */
st_status st__dist_agree_unpack(const char* buf, size_t size, const char*** keys, const char*** values, size_t* n);

/* Where a rank's list first differs from rank 0's: the position in rank 0's
 * order of the first key whose value differs or that the rank lacks; past
 * the end (n0 + i) for the rank's i-th key that rank 0 lacks; -1 when the
 * lists agree. The key (and each side's value, NULL where absent) come back
 * through the out-pointers, which point into the lists. */
int64_t st__dist_agree_first_difference(const char* const* keys0, const char* const* values0, size_t n0,
                                    const char* const* keys, const char* const* values, size_t n,
                                    const char** key, const char** value0, const char** value);

/* The error every rank returns. value0 / value NULL mean absent. */
st_status st__dist_agree_error(const char* key, const char* value0, int rank, const char* value);

/*--- the store (kv_store.c) ------------------------------------------------*/

/* Keys and values in one process: rank 0's store, or a job of one's. A list
 * searched linearly: the bootstrap puts tens of keys. Thread-safe. */
typedef struct dist_kv {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* on CLOCK_MONOTONIC; broadcast on every put */
  uint64_t version;  /* bumped on every put: rank 0's server rechecks pending gets */
  size_t n, cap;
  char** keys;
  char** values;
  size_t* sizes;
} dist_kv;

void st__dist_kv_init(dist_kv* kv);
void st__dist_kv_destroy(dist_kv* kv);
void st__dist_kv_put(dist_kv* kv, const char* key, const void* value, size_t size);
/* A copy of |key|'s value (NUL-terminated, free) or NULL when absent. */
char* dist_kv_lookup(dist_kv* kv, const char* key, size_t* size);
/* Waits on the condition until |key| exists or |deadline| (st_now seconds)
 * passes; NULL then. */
char* dist_kv_wait(dist_kv* kv, const char* key, double deadline, size_t* size);
uint64_t st__dist_kv_version(dist_kv* kv);

/* The timeout error, the same text wherever the wait happened. */
st_status st__dist_kv_timeout_error(const char* key, int64_t timeout_ms, int world_size);

/*--- the process's place (dist.c) and the transport (mpi.c) ----------------*/

typedef struct dist_mpi dist_mpi;                 /* mpi.c's state; NULL for a job of one */
typedef struct dist_coll_engine dist_coll_engine; /* coll.c's state */

struct st_dist {
  st_dist_launch launch;
  bool multi;
  int size, rank, local_rank;
  dist_kv kv; /* the store, on rank 0 and in a job of one */
  dist_mpi* mpi;
  dist_coll_engine* coll;
};

/* A failed MPI call (|rc|) as ST_CODE_RUNTIME: what was being done, MPI's
 * own text and the code. MPI builds only. */
st_status st__dist_mpi_fail(int rc, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* The error when MPI gives less than MPI_THREAD_MULTIPLE (|provided|:
 * the level's name), ST_CODE_RUNTIME. */
st_status st__dist_thread_level_error(const char* provided);

/* MPI_Init_thread and the checks; the store's service thread on rank 0.
 * Fills size, rank, local_rank. */
st_status st__dist_mpi_init(st_dist* d);
st_status st__dist_mpi_finalize(st_dist* d);
void st__dist_mpi_abort(st_dist* d, int exit_code); /* does not return (MPI build) */
/* Collective: st_dist_agree across ranks (the exchange; agree.c's logic). */
st_status st__dist_mpi_agree(st_dist* d, const char* const* keys, const char* const* values, size_t n);
/* A rank other than 0 asks rank 0. timeout_ms < 0: look once (try_get). */
st_status st__dist_mpi_kv_put(st_dist* d, const char* key, const void* value, size_t size);
st_status st__dist_mpi_kv_get(st_dist* d, const char* key, int64_t timeout_ms, bool* found, void** value,
                          size_t* size);

/*--- cross-process collectives and the blocking exchanges (coll.c) ----------*/

/* The engine of a job (after st__dist_mpi_init for a multi-process one: its
 * communicators are duplicated here, a collective call). No thread yet. */
st_status st__dist_coll_init(st_dist* d);
/* Completes what is queued, stops the thread, frees the collectives not
 * waited on (returning the first failure among them) and the engine. */
st_status st__dist_coll_finalize(st_dist* d);

/* The pure parts, tested without MPI. Elements per rank's block: count/size,
 * rounded up for an all-reduce (whose count need not divide). */
size_t st__dist_coll_block(st_dist_coll_kind kind, size_t count, int size);
/* Bytes one rank sends: (size-1) blocks per phase, two phases for an
 * all-reduce. */
int64_t st__dist_coll_bytes(st_dist_coll_kind kind, size_t count, int size);
/* out[i] = ((recv[0][i] + recv[1][i]) + ...) + recv[size-1][i] for i <
 * block, where recv[r] = recv + r*block: the fixed order. |out| may be any
 * buffer that does not overlap |recv|. */
void st__dist_coll_sum_ordered(const float* recv, size_t block, int size, float* out);

#endif /* STRATA_DIST_INTERNAL_H */
