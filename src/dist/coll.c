/* coll.c — the plan's cross-process collectives on host float buffers, and
 * the blocking exchanges the trainer needs (docs/multiprocess.md,
 * "Cross-process collectives").
 *
 * Fixed order. MPI's reductions (MPI_Iallreduce, MPI_Ireduce_scatter) do not
 * say in which order the ranks' values are added, and Open MPI picks its
 * algorithm by message size and process count, so one job could round
 * differently from one bucket size to the next. No reduction here is MPI's:
 * an MPI_Ialltoall hands each rank every rank's copy of its block, and the
 * rank adds them itself in rank order 0..size-1. Moving bytes is exact, so
 * the result depends only on the process count.
 *
 * Progress. Open MPI advances a nonblocking collective only inside MPI
 * calls. One thread of ours (started by the first collective) takes queued
 * collectives in order, calls before(), issues them and tests those in
 * flight, sleeping 20 to 50 us between rounds while any is in flight (the
 * host's cores run the compute: no hot spin) and on a condition variable
 * when none is.
 *
 * Communicators: four duplicates of the world, so nothing here can match
 * the store's or the agreement's messages. MPI matches the collectives on a
 * communicator by their order of issue, which must be the same on every
 * rank. Alltoalls (reduce-scatters, all-reduces' first phase) and plain
 * all-gathers are issued when dequeued, in queue order; an all-reduce's
 * all-gather only once its alltoall has completed on this rank, a moment
 * that differs from rank to rank. So each of those three streams has a
 * communicator of its own, and all-reduces issue their all-gathers in queue
 * order among themselves (one whose alltoall completes early waits for the
 * earlier ones). The fourth carries the blocking exchanges of the main
 * thread. */
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/dist_internal.h"
#include "strata/base.h"

#ifndef STRATA_NO_MPI
#include <mpi.h>
#endif

/* What pending() says (under the engine's mutex). */
typedef enum coll_state {
  kCollQueued, /* waiting for the thread */
  kCollBefore, /* in before() */
  kCollIssued, /* with MPI */
  kCollAfter,  /* in after() */
  kCollDone,
} coll_state;

/* Where the thread has it (the thread's alone). */
typedef enum coll_phase {
  kPhaseExchange, /* the alltoall, or a plain all-gather, in flight */
  kPhaseReduced,  /* an all-reduce, summed: its all-gather waits for the earlier all-reduces' */
  kPhaseGather,   /* an all-reduce's all-gather in flight */
  kPhaseFinished, /* result in |data|, or failed */
} coll_phase;

struct st_dist_coll {
  dist_coll_engine* eng;
  st_dist_coll_kind kind;
  float* data;
  size_t count, block;
  st_status (*before)(void* user);
  st_status (*after)(void* user);
  void* user;
  char* name;
  /* Under eng->mu. */
  coll_state state;
  st_dist_coll *live_prev, *live_next; /* started and not yet waited, in queue order */
  st_dist_coll* queue_next;            /* not yet taken by the thread */
  st_dist_coll_timing timing;          /* written under mu: pending() reads it */
  atomic_bool done;
  /* The thread's until done, then the waiter's. */
  coll_phase phase;
  bool mpi_failed;
  float* buf;  /* what MPI works on: |data|, or an all-reduce's zero-padded copy */
  float* recv; /* the alltoall's receive (size blocks); freed once summed */
  st_status status;
#ifndef STRATA_NO_MPI
  MPI_Request req;
#endif
};

struct dist_coll_engine {
  st_dist* d;
  pthread_mutex_t mu;
  pthread_cond_t work; /* the thread: something queued, or finalize */
  pthread_cond_t done; /* waiters: a collective completed */
  st_dist_coll *live_head, *live_tail;
  st_dist_coll *queue_head, *queue_tail;
  bool stopping, thread_running;
  pthread_t thread;
#ifndef STRATA_NO_MPI
  MPI_Comm exchange, reduced_gather, gather, blocking; /* MPI_COMM_NULL in a job of one */
#endif
};

/*--- the pure parts -------------------------------------------------------------------*/

const char* st_dist_coll_kind_name(st_dist_coll_kind kind) {
  switch (kind) {
    case ST_DIST_ALL_REDUCE: return "all_reduce";
    case ST_DIST_REDUCE_SCATTER: return "reduce_scatter";
    case ST_DIST_ALL_GATHER: return "all_gather";
  }
  return "unknown";
}

size_t st__dist_coll_block(st_dist_coll_kind kind, size_t count, int size) {
  size_t n = size > 0 ? (size_t)size : 1;
  return count / n + (kind == ST_DIST_ALL_REDUCE && count % n != 0);
}

int64_t st__dist_coll_bytes(st_dist_coll_kind kind, size_t count, int size) {
  if (size <= 1) return 0;
  int64_t phase = (int64_t)(size - 1) * (int64_t)st__dist_coll_block(kind, count, size) * (int64_t)sizeof(float);
  return kind == ST_DIST_ALL_REDUCE ? 2 * phase : phase;
}

int64_t st_dist_coll_bytes_sent(st_dist_coll_kind kind, size_t count, int size) {
  return st__dist_coll_bytes(kind, count, size);
}

void st__dist_coll_sum_ordered(const float* recv, size_t block, int size, float* out) {
  if (!block) return;
  /* Rank 0's value itself, not 0 + it: 0.0f + -0.0f would be +0.0f. */
  memcpy(out, recv, block * sizeof(float));
  for (int r = 1; r < size; r++) {
    const float* in = recv + (size_t)r * block;
    for (size_t i = 0; i < block; i++) out[i] += in[i];
  }
}

static void st__dist_coll_free(st_dist_coll* c) {
  if (c->buf != c->data) free(c->buf);
  free(c->recv);
  free(c->name);
  free(c);
}

static st_status st__dist_coll_callback_error(const st_dist_coll* c, const char* which, st_status s) {
  return st_status_annotate(s, "%s '%s': %s", st_dist_coll_kind_name(c->kind), c->name, which);
}

/* Unlinks |c| from the live list; under mu. */
static void st__dist_coll_unlink_locked(dist_coll_engine* e, st_dist_coll* c) {
  if (c->live_prev) c->live_prev->live_next = c->live_next;
  else e->live_head = c->live_next;
  if (c->live_next) c->live_next->live_prev = c->live_prev;
  else e->live_tail = c->live_prev;
  c->live_prev = c->live_next = NULL;
}

static void st__dist_coll_link_locked(dist_coll_engine* e, st_dist_coll* c) {
  c->live_prev = e->live_tail;
  if (e->live_tail) e->live_tail->live_next = c;
  else e->live_head = c;
  e->live_tail = c;
}

/*--- the progress thread (MPI) ---------------------------------------------------------*/

#ifndef STRATA_NO_MPI

static const double kNapFirst = 20e-6, kNapCap = 50e-6; /* the progress thread's */
static const double kBlockingNapCap = 200e-6;          /* the main thread's blocking exchanges */

static void st__dist_coll_nap(double* backoff, double cap) {
  struct timespec ts = {0, (long)(*backoff * 1e9)};
  nanosleep(&ts, NULL);
  *backoff = *backoff * 2 > cap ? cap : *backoff * 2;
}

typedef struct coll_active {
  st_dist_coll** items; /* in queue order */
  size_t n, cap;
} coll_active;

static void st__dist_coll_mpi_failed(st_dist_coll* c, int rc, const char* what) {
  st_status f = st__dist_mpi_fail(rc, "%s '%s': %s", st_dist_coll_kind_name(c->kind), c->name, what);
  c->status = st_status_join(c->status, f);
  c->mpi_failed = true;
  c->req = MPI_REQUEST_NULL;
  c->phase = kPhaseFinished;
}

/* before(), the staging buffers, and the first MPI operation. */
static void st__dist_coll_issue(dist_coll_engine* e, st_dist_coll* c) {
  st_status s = c->before ? c->before(c->user) : ST_OK;
  if (s) c->status = st__dist_coll_callback_error(c, "before()", s);
  size_t n = (size_t)e->d->size * c->block;
  c->buf = c->data;
  if (c->kind == ST_DIST_ALL_REDUCE && n != c->count) {
    c->buf = st_xmalloc(n * sizeof(float));
    if (c->count) memcpy(c->buf, c->data, c->count * sizeof(float));
    memset(c->buf + c->count, 0, (n - c->count) * sizeof(float));
  }
  if (c->kind != ST_DIST_ALL_GATHER && c->count) c->recv = st_xmalloc(n * sizeof(float));
  pthread_mutex_lock(&e->mu);
  c->state = kCollIssued;
  c->timing.started_s = st_now();
  pthread_mutex_unlock(&e->mu);
  c->req = MPI_REQUEST_NULL;
  c->phase = kPhaseExchange;
  if (!c->count) {
    /* Nothing to move; every rank skips it alike (same count everywhere). */
    c->phase = kPhaseFinished;
    return;
  }
  int block = (int)c->block;
  int rc = c->kind == ST_DIST_ALL_GATHER
               ? MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c->buf, block, MPI_FLOAT, e->gather, &c->req)
               : MPI_Ialltoall(c->buf, block, MPI_FLOAT, c->recv, block, MPI_FLOAT, e->exchange, &c->req);
  if (rc != MPI_SUCCESS) st__dist_coll_mpi_failed(c, rc, "issuing it");
}

/* The alltoall or a plain all-gather has completed: sum this rank's block. */
static void st__dist_coll_exchanged(dist_coll_engine* e, st_dist_coll* c) {
  if (c->kind == ST_DIST_ALL_GATHER) {
    c->phase = kPhaseFinished;
    return;
  }
  st__dist_coll_sum_ordered(c->recv, c->block, e->d->size, c->buf + (size_t)e->d->rank * c->block);
  free(c->recv);
  c->recv = NULL;
  c->phase = c->kind == ST_DIST_ALL_REDUCE ? kPhaseReduced : kPhaseFinished;
}

static void st__dist_coll_issue_gather(dist_coll_engine* e, st_dist_coll* c) {
  int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c->buf, (int)c->block, MPI_FLOAT, e->reduced_gather,
                          &c->req);
  if (rc != MPI_SUCCESS) st__dist_coll_mpi_failed(c, rc, "issuing its all-gather phase");
  else c->phase = kPhaseGather;
}

/* The result into |data|, after(), and done: the waiter may free |c| as
 * soon as the mutex is released, so |c| is not touched after. */
static void st__dist_coll_finish(dist_coll_engine* e, st_dist_coll* c) {
  if (c->buf != c->data) {
    if (!c->mpi_failed) memcpy(c->data, c->buf, c->count * sizeof(float));
    free(c->buf);
  }
  c->buf = c->data;
  free(c->recv);
  c->recv = NULL;
  bool call_after = !c->status && c->after;
  pthread_mutex_lock(&e->mu);
  c->timing.completed_s = st_now();
  if (call_after) c->state = kCollAfter;
  pthread_mutex_unlock(&e->mu);
  if (call_after) {
    st_status s = c->after(c->user);
    if (s) c->status = st__dist_coll_callback_error(c, "after()", s);
  }
  pthread_mutex_lock(&e->mu);
  c->state = kCollDone;
  atomic_store(&c->done, true);
  pthread_cond_broadcast(&e->done);
  pthread_mutex_unlock(&e->mu);
}

/* One round over the collectives in flight, in queue order. True when any
 * moved on (then the thread looks again at once instead of sleeping). */
static bool st__dist_coll_progress(dist_coll_engine* e, coll_active* a) {
  bool moved = false;
  bool gathers_wait = false; /* an earlier all-reduce has not issued its all-gather yet */
  size_t kept = 0;
  for (size_t i = 0; i < a->n; i++) {
    st_dist_coll* c = a->items[i];
    if (c->phase == kPhaseExchange || c->phase == kPhaseGather) {
      int flag = 0;
      int rc = MPI_Test(&c->req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        st__dist_coll_mpi_failed(c, rc, c->phase == kPhaseGather ? "its all-gather phase" : "its exchange");
        moved = true;
      } else if (flag) {
        moved = true;
        if (c->phase == kPhaseGather) c->phase = kPhaseFinished;
        else st__dist_coll_exchanged(e, c);
      }
    }
    if (c->phase == kPhaseReduced && !gathers_wait) {
      st__dist_coll_issue_gather(e, c);
      moved = true;
    }
    if (c->kind == ST_DIST_ALL_REDUCE && (c->phase == kPhaseExchange || c->phase == kPhaseReduced)) gathers_wait = true;
    if (c->phase == kPhaseFinished) {
      st__dist_coll_finish(e, c);
      continue;
    }
    a->items[kept++] = c;
  }
  a->n = kept;
  return moved;
}

static void* st__dist_coll_main(void* arg) {
  dist_coll_engine* e = arg;
  coll_active a = {0};
  double backoff = kNapFirst;
  for (;;) {
    pthread_mutex_lock(&e->mu);
    while (!e->queue_head && !a.n && !e->stopping) pthread_cond_wait(&e->work, &e->mu);
    st_dist_coll* next = e->queue_head;
    if (next) {
      e->queue_head = next->queue_next;
      if (!e->queue_head) e->queue_tail = NULL;
      next->queue_next = NULL;
      next->state = kCollBefore;
    }
    pthread_mutex_unlock(&e->mu);
    /* Stopping, with nothing queued or in flight: finalize drains first. */
    if (!next && !a.n) break;
    bool moved = false;
    if (next) {
      st__dist_coll_issue(e, next);
      if (a.n == a.cap) {
        a.cap = a.cap ? 2 * a.cap : 16;
        a.items = st_xrealloc(a.items, a.cap * sizeof(*a.items));
      }
      a.items[a.n++] = next;
      moved = true;
    }
    if (st__dist_coll_progress(e, &a)) moved = true;
    if (moved) backoff = kNapFirst;
    else st__dist_coll_nap(&backoff, kNapCap);
  }
  free(a.items);
  return NULL;
}

static st_status st__dist_coll_open_comms(dist_coll_engine* e) {
  MPI_Comm* comms[] = {&e->exchange, &e->reduced_gather, &e->gather, &e->blocking};
  for (size_t i = 0; i < sizeof(comms) / sizeof(comms[0]); i++) {
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, comms[i]);
    if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "MPI: duplicating the world communicator for the collectives");
  }
  return ST_OK;
}

static void st__dist_coll_close_comms(dist_coll_engine* e) {
  MPI_Comm* comms[] = {&e->exchange, &e->reduced_gather, &e->gather, &e->blocking};
  for (size_t i = 0; i < sizeof(comms) / sizeof(comms[0]); i++)
    if (*comms[i] != MPI_COMM_NULL) MPI_Comm_free(comms[i]);
}

/* Tests |req| until it completes, sleeping between tests: Open MPI's
 * blocking calls spin a core the compute or the progress thread needs. */
static st_status st__dist_coll_block_on(MPI_Request* req, const char* what) {
  double backoff = kNapFirst;
  for (;;) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "%s", what);
    if (done) return ST_OK;
    st__dist_coll_nap(&backoff, kBlockingNapCap);
  }
}

#endif /* !STRATA_NO_MPI */

/*--- the engine's start and end ---------------------------------------------------------*/

st_status st__dist_coll_init(st_dist* d) {
  dist_coll_engine* e = st_xcalloc(1, sizeof(*e));
  e->d = d;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->work, NULL);
  pthread_cond_init(&e->done, NULL);
  st_status s = ST_OK;
#ifndef STRATA_NO_MPI
  e->exchange = e->reduced_gather = e->gather = e->blocking = MPI_COMM_NULL;
  if (d->multi) s = st__dist_coll_open_comms(e);
  if (s) st__dist_coll_close_comms(e);
#endif
  if (s) {
    pthread_cond_destroy(&e->done);
    pthread_cond_destroy(&e->work);
    pthread_mutex_destroy(&e->mu);
    free(e);
    return s;
  }
  d->coll = e;
  return ST_OK;
}

st_status st__dist_coll_finalize(st_dist* d) {
  dist_coll_engine* e = d->coll;
  if (!e) return ST_OK;
  pthread_mutex_lock(&e->mu);
  e->stopping = true;
  pthread_cond_signal(&e->work);
  bool running = e->thread_running;
  pthread_mutex_unlock(&e->mu);
  /* The thread leaves once nothing is queued or in flight. */
  if (running) pthread_join(e->thread, NULL);
  st_status s = ST_OK;
  for (st_dist_coll* c = e->live_head; c;) {
    st_dist_coll* next = c->live_next;
    if (c->status)
      s = st_status_join(s, st_status_annotate(c->status, "st_dist_finalize: a collective not waited on failed"));
    st__dist_coll_free(c);
    c = next;
  }
#ifndef STRATA_NO_MPI
  st__dist_coll_close_comms(e);
#endif
  pthread_cond_destroy(&e->done);
  pthread_cond_destroy(&e->work);
  pthread_mutex_destroy(&e->mu);
  free(e);
  d->coll = NULL;
  return s;
}

/*--- the collectives ----------------------------------------------------------------------*/

static st_status st__dist_coll_check(const st_dist* d, const st_dist_coll_request* r, const char* name) {
  const char* kind = st_dist_coll_kind_name(r->kind);
  if (r->kind != ST_DIST_ALL_REDUCE && r->kind != ST_DIST_REDUCE_SCATTER && r->kind != ST_DIST_ALL_GATHER)
    return st_status_make(ST_CODE_INTERNAL, "collective '%s': unknown kind %d", name, (int)r->kind);
  if (!r->data && r->count)
    return st_status_make(ST_CODE_INTERNAL, "%s '%s': NULL data of %zu elements", kind, name, r->count);
  if (r->kind != ST_DIST_ALL_REDUCE && r->count % (size_t)d->size)
    return st_status_make(ST_CODE_INTERNAL, "%s '%s': %zu elements is not a multiple of the %d ranks", kind, name,
                          r->count, d->size);
  size_t block = st__dist_coll_block(r->kind, r->count, d->size);
  if (block > (size_t)INT_MAX || block > SIZE_MAX / sizeof(float) / (size_t)d->size)
    return st_status_make(ST_CODE_INTERNAL, "%s '%s': a block of %zu elements is more than MPI takes in one call",
                          kind, name, block);
  return ST_OK;
}

/* A job of one: nothing to exchange, and done before start returns. */
static void st__dist_coll_alone(st_dist_coll* c) {
  st_status s = c->before ? c->before(c->user) : ST_OK;
  c->timing.started_s = st_now();
  if (s) c->status = st__dist_coll_callback_error(c, "before()", s);
  c->timing.completed_s = st_now();
  if (!c->status && c->after) {
    s = c->after(c->user);
    if (s) c->status = st__dist_coll_callback_error(c, "after()", s);
  }
  c->state = kCollDone;
  atomic_store(&c->done, true);
}

/* Queues |c| for the thread, starting it on first use; under mu. */
static st_status st__dist_coll_enqueue_locked(dist_coll_engine* e, st_dist_coll* c) {
#ifdef STRATA_NO_MPI
  (void)e, (void)c;
  return st_status_make(ST_CODE_INTERNAL, "cross-process collective in a binary built without MPI");
#else
  if (e->stopping)
    return st_status_make(ST_CODE_INTERNAL, "st_dist_coll_start '%s': after st_dist_finalize began", c->name);
  if (!e->thread_running) {
    if (pthread_create(&e->thread, NULL, st__dist_coll_main, e) != 0)
      return st_status_make(ST_CODE_RUNTIME, "collectives: cannot start the progress thread");
    e->thread_running = true;
  }
  c->state = kCollQueued;
  if (e->queue_tail) e->queue_tail->queue_next = c;
  else e->queue_head = c;
  e->queue_tail = c;
  pthread_cond_signal(&e->work);
  return ST_OK;
#endif
}

st_status st_dist_coll_start(st_dist* d, const st_dist_coll_request* req, st_dist_coll** out) {
  if (out) *out = NULL;
  if (!d || !d->coll || !req || !out) return st_status_make(ST_CODE_INTERNAL, "st_dist_coll_start: NULL argument");
  const char* name = req->name && *req->name ? req->name : "unnamed";
  ST_RETURN(st__dist_coll_check(d, req, name));
  dist_coll_engine* e = d->coll;
  st_dist_coll* c = st_xcalloc(1, sizeof(*c));
  c->eng = e;
  c->kind = req->kind;
  c->data = req->data;
  c->count = req->count;
  c->block = st__dist_coll_block(req->kind, req->count, d->size);
  c->before = req->before;
  c->after = req->after;
  c->user = req->user;
  c->name = st_xstrdup(name);
  c->buf = c->data;
  c->timing.queued_s = st_now();
  c->timing.bytes_sent = st__dist_coll_bytes(req->kind, req->count, d->size);
  atomic_init(&c->done, false);
  pthread_mutex_lock(&e->mu);
  bool stopping = e->stopping;
  pthread_mutex_unlock(&e->mu);
  if (stopping) {
    st__dist_coll_free(c);
    return st_status_make(ST_CODE_INTERNAL, "st_dist_coll_start '%s': after st_dist_finalize began", name);
  }
  if (d->size == 1) st__dist_coll_alone(c);
  pthread_mutex_lock(&e->mu);
  st_status s = d->size == 1 ? ST_OK : st__dist_coll_enqueue_locked(e, c);
  if (!s) st__dist_coll_link_locked(e, c);
  pthread_mutex_unlock(&e->mu);
  if (s) {
    st__dist_coll_free(c);
    return s;
  }
  *out = c;
  return ST_OK;
}

bool st_dist_coll_done(const st_dist_coll* c) { return c && atomic_load(&c->done); }

st_status st_dist_coll_wait(st_dist_coll* c, st_dist_coll_timing* timing) {
  if (!c) return st_status_make(ST_CODE_INTERNAL, "st_dist_coll_wait: NULL collective");
  dist_coll_engine* e = c->eng;
  pthread_mutex_lock(&e->mu);
  while (c->state != kCollDone) pthread_cond_wait(&e->done, &e->mu);
  st__dist_coll_unlink_locked(e, c);
  pthread_mutex_unlock(&e->mu);
  if (timing) *timing = c->timing;
  st_status s = c->status;
  st__dist_coll_free(c);
  return s;
}

bool st_dist_coll_pending(st_dist* d, char* buf, size_t size) {
  if (buf && size) buf[0] = '\0';
  if (!d || !d->coll) return false;
  dist_coll_engine* e = d->coll;
  pthread_mutex_lock(&e->mu);
  st_dist_coll* c = e->live_head;
  while (c && c->state == kCollDone) c = c->live_next;
  if (c && buf && size) {
    double now = st_now();
    char what[128];
    switch (c->state) {
      case kCollQueued:
        snprintf(what, sizeof(what), "queued %.1f s ago, not yet issued", now - c->timing.queued_s);
        break;
      case kCollBefore:
        snprintf(what, sizeof(what), "in its before() callback, queued %.1f s ago", now - c->timing.queued_s);
        break;
      case kCollIssued:
        snprintf(what, sizeof(what), "issued to MPI %.1f s ago, waiting for the other ranks",
                 now - c->timing.started_s);
        break;
      default:
        snprintf(what, sizeof(what), "in its after() callback, completed %.1f s ago", now - c->timing.completed_s);
        break;
    }
    snprintf(buf, size, "%s '%s': %s", st_dist_coll_kind_name(c->kind), c->name, what);
  }
  pthread_mutex_unlock(&e->mu);
  return c != NULL;
}

/*--- the blocking exchanges ---------------------------------------------------------------*/

st_status st_dist_allgather_f64(st_dist* d, const double* in, size_t n, double* out) {
  if (!d || (n && (!in || !out))) return st_status_make(ST_CODE_INTERNAL, "st_dist_allgather_f64: NULL argument");
  if (!d->multi) {
    if (n) memmove(out, in, n * sizeof(double));
    return ST_OK;
  }
#ifdef STRATA_NO_MPI
  return st_status_make(ST_CODE_INTERNAL, "st_dist_allgather_f64 in a binary built without MPI");
#else
  if (n > (size_t)INT_MAX)
    return st_status_make(ST_CODE_INTERNAL, "st_dist_allgather_f64: %zu values is more than MPI takes in one call", n);
  MPI_Request req;
  int rc = MPI_Iallgather(in, (int)n, MPI_DOUBLE, out, (int)n, MPI_DOUBLE, d->coll->blocking, &req);
  if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "st_dist_allgather_f64 of %zu values", n);
  return st__dist_coll_block_on(&req, "st_dist_allgather_f64");
#endif
}

st_status st_dist_barrier(st_dist* d) {
  if (!d) return st_status_make(ST_CODE_INTERNAL, "st_dist_barrier: NULL dist");
  if (!d->multi) return ST_OK;
#ifdef STRATA_NO_MPI
  return st_status_make(ST_CODE_INTERNAL, "st_dist_barrier in a binary built without MPI");
#else
  MPI_Request req;
  int rc = MPI_Ibarrier(d->coll->blocking, &req);
  if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "st_dist_barrier");
  return st__dist_coll_block_on(&req, "st_dist_barrier");
#endif
}

#ifndef STRATA_NO_MPI
/* The bytes in pieces of at most 1 GiB (MPI counts are ints). */
static st_status st__dist_coll_bcast_bytes(MPI_Comm comm, char* buf, uint64_t len) {
  const uint64_t piece = (uint64_t)1 << 30;
  for (uint64_t off = 0; off < len; off += piece) {
    int n = (int)(len - off < piece ? len - off : piece);
    MPI_Request req;
    int rc = MPI_Ibcast(buf + off, n, MPI_BYTE, 0, comm, &req);
    if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "st_dist_broadcast of %" PRIu64 " bytes", len);
    ST_RETURN(st__dist_coll_block_on(&req, "st_dist_broadcast"));
  }
  return ST_OK;
}
#endif

st_status st_dist_broadcast(st_dist* d, void** data, size_t* size) {
  if (!d || !data || !size) return st_status_make(ST_CODE_INTERNAL, "st_dist_broadcast: NULL argument");
  if (!d->multi) return ST_OK;
#ifdef STRATA_NO_MPI
  return st_status_make(ST_CODE_INTERNAL, "st_dist_broadcast in a binary built without MPI");
#else
  MPI_Comm comm = d->coll->blocking;
  bool root = d->rank == 0;
  /* UINT64_MAX: rank 0 has nothing to send, and every rank fails alike. */
  uint64_t len = root ? (*data || !*size ? (uint64_t)*size : UINT64_MAX) : 0;
  if (!root) {
    *data = NULL;
    *size = 0;
  }
  MPI_Request req;
  int rc = MPI_Ibcast(&len, 1, MPI_UINT64_T, 0, comm, &req);
  if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "st_dist_broadcast: the length");
  ST_RETURN(st__dist_coll_block_on(&req, "st_dist_broadcast: the length"));
  if (len == UINT64_MAX) return st_status_make(ST_CODE_INTERNAL, "st_dist_broadcast: rank 0 was given NULL data");
  char* buf = root ? *data : st_xmalloc((size_t)len + 1);
  st_status s = st__dist_coll_bcast_bytes(comm, buf, len);
  if (root) return s;
  if (s) {
    free(buf);
    return s;
  }
  buf[len] = '\0';
  *data = buf;
  *size = (size_t)len;
  return ST_OK;
#endif
}
