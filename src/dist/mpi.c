/* mpi.c — dist's transport: MPI's start and end, the agreement's exchange,
 * and the key-value store served by a thread on rank 0.
 *
 * Thread level: MPI_THREAD_MULTIPLE. Rank 0's service thread receives and
 * answers store requests while the main thread runs collectives (the
 * agreement now, the plan's cross-process collectives later), and the
 * other ranks' requests come from whatever thread PJRT calls its key-value
 * callbacks on. SERIALIZED would need all of that funnelled through one
 * thread of strata's; Open MPI 4.1 provides MULTIPLE (docs/multiprocess.md).
 *
 * The store's protocol, on its own communicator (a duplicate of the world,
 * so no request can match another message of strata's):
 *   request  to rank 0, tag kReqTag: req_head, the key, the value (put)
 *   reply    to the asker, on a tag the asker chose for this request (each
 *            thread waits on its own tag, so concurrent asks on one rank
 *            cannot take each other's replies): reply_head, the value
 * A get of a key not yet put waits on rank 0 (pending list), not on the
 * asker: rank 0 answers when a put arrives or at the deadline. The asker
 * still gives up kGraceSeconds after its own deadline, so a dead rank 0
 * cannot hold it forever. Messages are raw bytes of this build's structs:
 * every rank runs the same binary (the agreement checks it).
 *
 * Polling with MPI_Improbe and a short sleep (20 us growing to 1 ms) rather
 * than a blocking receive: Open MPI's blocking calls spin a core, and on a
 * loaded or oversubscribed host the store's thread must not take one. */
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/dist_internal.h"
#include "strata/base.h"

#ifdef STRATA_NO_MPI

static st_status st__dist_no_mpi(const st_dist* d) {
  return st_status_make(ST_CODE_RUNTIME,
                        "this binary was built without MPI (STRATA_NO_MPI, the portable build): it was started by %s "
                        "as rank %d of %d, but runs only as a single process; use a build with MPI (make build)",
                        st_dist_launcher_name(d->launch.launcher), d->launch.rank, d->launch.world_size);
}

st_status st__dist_mpi_init(st_dist* d) { return st__dist_no_mpi(d); }
st_status st__dist_mpi_finalize(st_dist* d) { return st__dist_no_mpi(d); }
void st__dist_mpi_abort(st_dist* d, int exit_code) { (void)d, (void)exit_code; }
st_status st__dist_mpi_agree(st_dist* d, const char* const* keys, const char* const* values, size_t n) {
  (void)keys, (void)values, (void)n;
  return st__dist_no_mpi(d);
}
st_status st__dist_mpi_kv_put(st_dist* d, const char* key, const void* value, size_t size) {
  (void)key, (void)value, (void)size;
  return st__dist_no_mpi(d);
}
st_status st__dist_mpi_kv_get(st_dist* d, const char* key, int64_t timeout_ms, bool* found, void** value, size_t* size) {
  (void)key, (void)timeout_ms, (void)found, (void)value, (void)size;
  return st__dist_no_mpi(d);
}

#else /* MPI */

#include <mpi.h>

enum { kReqTag = 1, kFirstReplyTag = 16 };
enum { kOpPut = 1, kOpGet = 2 };
static const double kGraceSeconds = 10.0;

typedef struct req_head {
  int32_t op;
  int32_t reply_tag;
  int64_t timeout_ms; /* get: < 0 looks once */
  uint32_t key_len, value_len;
} req_head;

typedef struct reply_head {
  int32_t found;
  uint32_t value_len;
} reply_head;

typedef struct pending_get {
  int source, tag;
  char* key;
  double deadline;
} pending_get;

typedef struct pending_send {
  MPI_Request req;
  char* buf;
} pending_send;

struct dist_mpi {
  MPI_Comm world; /* the agreement's and the barrier's */
  MPI_Comm kv;    /* the store's requests and replies */
  int tag_ub;
  atomic_int next_tag;
  pthread_t server;
  bool server_running;
  atomic_bool stop;
  st_status server_error; /* the service thread's failure, read after join */
};

st_status st__dist_mpi_fail(int rc, const char* fmt, ...) {
  char text[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = snprintf(text, sizeof(text), "unknown MPI error");
  text[len < 0 ? 0 : len] = '\0';
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  return st_status_make(ST_CODE_RUNTIME, "%s: %s (MPI error %d)", what, text, rc);
}

static const char* level_name(int level) {
  if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
  if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
  if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
  if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
  return "an unknown level";
}

static void st__dist_nap(double* backoff) {
  struct timespec ts = {0, (long)(*backoff * 1e9)};
  nanosleep(&ts, NULL);
  *backoff = *backoff * 2 > 1e-3 ? 1e-3 : *backoff * 2;
}

/* Tests |req| until it completes or |deadline| passes (then cancels it). */
static st_status st__dist_wait_until(MPI_Request* req, double deadline, const char* what, const char* key) {
  double backoff = 20e-6;
  for (;;) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "key-value store: %s '%s'", what, key);
    if (done) return ST_OK;
    if (st_now() >= deadline) {
      MPI_Cancel(req);
      MPI_Request_free(req);
      return st_status_make(ST_CODE_RUNTIME, "key-value store: %s '%s': rank 0 did not take it within %.0f s (is rank 0 alive?)",
                            what, key, kGraceSeconds);
    }
    st__dist_nap(&backoff);
  }
}

/*--- rank 0's service thread ---------------------------------------------------*/

typedef struct server_state {
  st_dist* d;
  pending_get* gets;
  size_t n_gets, cap_gets;
  pending_send* sends;
  size_t n_sends, cap_sends;
} server_state;

static st_status st__dist_reply(server_state* st, int dest, int tag, const char* value, size_t size, bool found) {
  size_t len = sizeof(reply_head) + (found ? size : 0);
  char* buf = st_xmalloc(len);
  reply_head h = {.found = found ? 1 : 0, .value_len = found ? (uint32_t)size : 0};
  memcpy(buf, &h, sizeof(h));
  if (found && size) memcpy(buf + sizeof(h), value, size);
  if (st->n_sends == st->cap_sends) {
    st->cap_sends = st->cap_sends ? 2 * st->cap_sends : 8;
    st->sends = st_xrealloc(st->sends, st->cap_sends * sizeof(*st->sends));
  }
  pending_send* ps = &st->sends[st->n_sends];
  ps->buf = buf;
  /* Nonblocking: an asker that gave up must not hold the service thread. */
  int rc = MPI_Isend(buf, (int)len, MPI_BYTE, dest, tag, st->d->mpi->kv, &ps->req);
  if (rc != MPI_SUCCESS) {
    free(buf);
    return st__dist_mpi_fail(rc, "key-value store: rank 0 answering rank %d", dest);
  }
  st->n_sends++;
  return ST_OK;
}

static st_status st__dist_answer_get(server_state* st, int source, int tag, const char* key, int64_t timeout_ms) {
  size_t size = 0;
  char* v = dist_kv_lookup(&st->d->kv, key, &size);
  if (v || timeout_ms < 0) {
    st_status s = st__dist_reply(st, source, tag, v, size, v != NULL);
    free(v);
    return s;
  }
  if (st->n_gets == st->cap_gets) {
    st->cap_gets = st->cap_gets ? 2 * st->cap_gets : 8;
    st->gets = st_xrealloc(st->gets, st->cap_gets * sizeof(*st->gets));
  }
  st->gets[st->n_gets++] =
      (pending_get){.source = source, .tag = tag, .key = st_xstrdup(key), .deadline = st_now() + (double)timeout_ms / 1e3};
  return ST_OK;
}

static st_status st__dist_serve_request(server_state* st, bool* served) {
  dist_mpi* m = st->d->mpi;
  int flag = 0;
  MPI_Message msg;
  MPI_Status status;
  int rc = MPI_Improbe(MPI_ANY_SOURCE, kReqTag, m->kv, &flag, &msg, &status);
  if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "key-value store: rank 0 probing for requests");
  *served = flag != 0;
  if (!flag) return ST_OK;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  char* buf = st_xmalloc(count > 0 ? (size_t)count : 1);
  rc = MPI_Mrecv(buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) {
    free(buf);
    return st__dist_mpi_fail(rc, "key-value store: rank 0 receiving a request of rank %d", status.MPI_SOURCE);
  }
  req_head h;
  st_status s = ST_OK;
  if ((size_t)count < sizeof(h)) {
    s = st_status_make(ST_CODE_INTERNAL, "key-value store: a request of %d bytes from rank %d", count, status.MPI_SOURCE);
  } else {
    memcpy(&h, buf, sizeof(h));
    if ((size_t)count != sizeof(h) + h.key_len + h.value_len)
      s = st_status_make(ST_CODE_INTERNAL, "key-value store: a torn request from rank %d", status.MPI_SOURCE);
  }
  if (!s) {
    char* key = st_xstrndup(buf + sizeof(h), h.key_len);
    if (h.op == kOpPut) {
      st__dist_kv_put(&st->d->kv, key, buf + sizeof(h) + h.key_len, h.value_len);
      s = st__dist_reply(st, status.MPI_SOURCE, h.reply_tag, NULL, 0, true);
    } else {
      s = st__dist_answer_get(st, status.MPI_SOURCE, h.reply_tag, key, h.timeout_ms);
    }
    free(key);
  }
  free(buf);
  return s;
}

/* Answers the waiting gets whose key has come or whose deadline has passed. */
static st_status st__dist_serve_pending(server_state* st) {
  double now = st_now();
  size_t kept = 0;
  st_status s = ST_OK;
  for (size_t i = 0; i < st->n_gets; i++) {
    pending_get* g = &st->gets[i];
    size_t size = 0;
    char* v = s ? NULL : dist_kv_lookup(&st->d->kv, g->key, &size);
    if (!s && (v || now >= g->deadline)) {
      s = st__dist_reply(st, g->source, g->tag, v, size, v != NULL);
      free(v);
      free(g->key);
      continue;
    }
    st->gets[kept++] = *g;
  }
  st->n_gets = kept;
  return s;
}

static st_status st__dist_reap_sends(server_state* st) {
  size_t kept = 0;
  st_status s = ST_OK;
  for (size_t i = 0; i < st->n_sends; i++) {
    int done = 0;
    int rc = MPI_Test(&st->sends[i].req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS && !s) s = st__dist_mpi_fail(rc, "key-value store: rank 0 sending a reply");
    if (done || rc != MPI_SUCCESS) {
      free(st->sends[i].buf);
      continue;
    }
    st->sends[kept++] = st->sends[i];
  }
  st->n_sends = kept;
  return s;
}

static void* server_main(void* arg) {
  server_state st = {.d = arg};
  dist_mpi* m = st.d->mpi;
  st_status s = ST_OK;
  double backoff = 20e-6;
  uint64_t seen = st__dist_kv_version(&st.d->kv);
  while (!s && !atomic_load(&m->stop)) {
    bool served = false;
    s = st__dist_serve_request(&st, &served);
    uint64_t version = st__dist_kv_version(&st.d->kv);
    if (!s && st.n_gets) s = st__dist_serve_pending(&st);
    if (!s && st.n_sends) s = st__dist_reap_sends(&st);
    if (served || version != seen) {
      backoff = 20e-6;
      seen = version;
    } else {
      st__dist_nap(&backoff);
    }
  }
  /* Every rank is past finalize's barrier: no asker is left waiting. What
   * is still unsent is a reply to an asker that gave up. */
  double deadline = st_now() + 1.0;
  while (st.n_sends && st_now() < deadline) {
    st_status r = st__dist_reap_sends(&st);
    if (r) {
      s = st_status_join(s, r);
      break;
    }
    if (st.n_sends) st__dist_nap(&backoff);
  }
  for (size_t i = 0; i < st.n_sends; i++) {
    MPI_Cancel(&st.sends[i].req);
    MPI_Request_free(&st.sends[i].req);
    free(st.sends[i].buf);
  }
  for (size_t i = 0; i < st.n_gets; i++) free(st.gets[i].key);
  free(st.sends);
  free(st.gets);
  m->server_error = s;
  return NULL;
}

/*--- start and end ----------------------------------------------------------------*/

static st_status st__dist_init_checked(st_dist* d) {
  dist_mpi* m = d->mpi;
  int rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "MPI: setting MPI_ERRORS_RETURN");
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const st_dist_launch* l = &d->launch;
  if ((l->world_size > 0 && size != l->world_size) || rank != l->rank)
    return st_status_make(ST_CODE_CONFIG,
                          "the launcher (%s) started this process as rank %d of %d, but MPI says rank %d of %d: "
                          "the launcher and this binary's MPI do not speak to each other (under Slurm: srun --mpi=pmix, "
                          "or mpirun inside the allocation)",
                          st_dist_launcher_name(l->launcher), l->rank, l->world_size, rank, size);
  d->size = size;
  d->rank = rank;
  rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->world);
  if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "MPI: duplicating the world communicator");
  rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->kv);
  if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "MPI: duplicating the world communicator");
  if (l->local_rank >= 0) {
    d->local_rank = l->local_rank;
  } else {
    MPI_Comm node;
    rc = MPI_Comm_split_type(m->world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "MPI: grouping this host's ranks");
    MPI_Comm_rank(node, &d->local_rank);
    MPI_Comm_free(&node);
  }
  int* ub = NULL;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  m->tag_ub = flag && ub ? *ub : 32767; /* the standard's least upper bound */
  atomic_store(&m->next_tag, kFirstReplyTag);
  if (rank == 0 && size > 1) {
    if (pthread_create(&m->server, NULL, server_main, d) != 0)
      return st_status_make(ST_CODE_RUNTIME, "key-value store: cannot start rank 0's service thread");
    m->server_running = true;
  }
  return ST_OK;
}

st_status st__dist_mpi_init(st_dist* d) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited || finalized)
    return st_status_make(ST_CODE_INTERNAL, "st_dist_init: MPI was %s in this process already (once per process)",
                          finalized ? "finalised" : "initialised");
  int provided = MPI_THREAD_SINGLE;
  int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "MPI_Init_thread");
  d->mpi = st_xcalloc(1, sizeof(*d->mpi));
  d->mpi->world = MPI_COMM_NULL;
  d->mpi->kv = MPI_COMM_NULL;
  st_status s = ST_OK;
  if (provided < MPI_THREAD_MULTIPLE)
    s = st__dist_thread_level_error(level_name(provided));
  if (!s) s = st__dist_init_checked(d);
  if (s) {
    /* Every rank meets the same failure (same MPI, same launch), so all of
     * them finalise; exiting without it makes mpirun report an abort. */
    if (d->mpi->world != MPI_COMM_NULL) MPI_Comm_free(&d->mpi->world);
    if (d->mpi->kv != MPI_COMM_NULL) MPI_Comm_free(&d->mpi->kv);
    MPI_Finalize();
    free(d->mpi);
    d->mpi = NULL;
  }
  return s;
}

void st__dist_mpi_abort(st_dist* d, int exit_code) {
  (void)d;
  fflush(stdout);
  fflush(stderr);
  /* The world itself, not dist's duplicates: MPI_Abort ends the processes of
   * its communicator's group, and the whole job is what must end. */
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  _exit(exit_code);
}

st_status st__dist_mpi_finalize(st_dist* d) {
  dist_mpi* m = d->mpi;
  /* No rank leaves while another may still ask rank 0's store. */
  int rc = MPI_Barrier(m->world);
  st_status s = rc == MPI_SUCCESS ? ST_OK : st__dist_mpi_fail(rc, "st_dist_finalize: waiting for every rank");
  if (m->server_running) {
    atomic_store(&m->stop, true);
    pthread_join(m->server, NULL);
    s = st_status_join(s, m->server_error);
  }
  MPI_Comm_free(&m->kv);
  MPI_Comm_free(&m->world);
  rc = MPI_Finalize();
  if (rc != MPI_SUCCESS) s = st_status_join(s, st__dist_mpi_fail(rc, "MPI_Finalize"));
  free(m);
  d->mpi = NULL;
  return s;
}

/*--- the agreement's exchange ---------------------------------------------------------*/

/* |root|'s bytes to every rank: the length, then the bytes. */
static st_status st__dist_bcast_bytes(MPI_Comm comm, int root, char** buf, size_t* size) {
  uint64_t len = *size;
  int rc = MPI_Bcast(&len, 1, MPI_UINT64_T, root, comm);
  if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "agreement: broadcast from rank %d", root);
  if (len > INT_MAX) return st_status_make(ST_CODE_CONFIG, "agreement: rank %d's list is %" PRIu64 " bytes", root, len);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank != root) {
    *buf = st_xmalloc(len + 1);
    *size = len;
  }
  rc = MPI_Bcast(*buf, (int)len, MPI_BYTE, root, comm);
  if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "agreement: broadcast from rank %d", root);
  return ST_OK;
}

st_status st__dist_mpi_agree(st_dist* d, const char* const* keys, const char* const* values, size_t n) {
  dist_mpi* m = d->mpi;
  uint64_t h = st__dist_agree_hash(keys, values, n);
  uint64_t* all = st_xcalloc((size_t)d->size, sizeof(*all));
  int rc = MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, m->world);
  if (rc != MPI_SUCCESS) {
    free(all);
    return st__dist_mpi_fail(rc, "agreement: exchanging the run's hash");
  }
  bool same = true;
  for (int r = 1; r < d->size; r++) same = same && all[r] == all[0];
  bool mine_differs = all[d->rank] != all[0];
  free(all);
  if (same) return ST_OK;

  /* Some rank differs: every rank learns rank 0's list, finds its own first
   * difference, and all agree on which to report. Rare, so no economy. */
  size_t size0 = 0;
  char* packed0 = d->rank == 0 ? dist_agree_pack(keys, values, n, &size0) : NULL;
  const char **keys0 = NULL, **values0 = NULL;
  size_t n0 = 0;
  char* mine = NULL;
  st_status s = st__dist_bcast_bytes(m->world, 0, &packed0, &size0);
  if (!s) s = st__dist_agree_unpack(packed0, size0, &keys0, &values0, &n0);
  const char *key = NULL, *value0 = NULL, *value = NULL;
  int64_t where = -1;
  if (!s && mine_differs) where = st__dist_agree_first_difference(keys0, values0, n0, keys, values, n, &key, &value0, &value);
  int64_t* wheres = st_xcalloc((size_t)d->size, sizeof(*wheres));
  if (!s) {
    rc = MPI_Allgather(&where, 1, MPI_INT64_T, wheres, 1, MPI_INT64_T, m->world);
    if (rc != MPI_SUCCESS) s = st__dist_mpi_fail(rc, "agreement: exchanging where the ranks differ");
  }
  int bad = -1;
  for (int r = 0; !s && r < d->size; r++)
    if (wheres[r] >= 0 && (bad < 0 || wheres[r] < wheres[bad])) bad = r;
  free(wheres);
  if (!s && bad < 0) s = st_status_make(ST_CODE_INTERNAL, "agreement: the ranks' hashes differ but their lists do not");
  size_t mine_size = 0;
  if (!s) {
    /* The differing rank says the key and its value: "k\0" then "1v\0"
     * or "0\0" where it has none. */
    if (d->rank == bad) {
      st_strbuf b = {0};
      st_strbuf_append_n(&b, key, strlen(key) + 1);
      st_strbuf_append(&b, value ? "1" : "0");
      st_strbuf_append_n(&b, value ? value : "", (value ? strlen(value) : 0) + 1);
      mine_size = b.len;
      mine = st_strbuf_take(&b);
    }
    s = st__dist_bcast_bytes(m->world, bad, &mine, &mine_size);
  }
  if (!s) {
    mine[mine_size] = '\0'; /* bcast_bytes left room; the sender's own buffer ends in its NUL */
    const char* bad_key = mine;
    const char* tail = bad_key + strlen(bad_key) + 1;
    const char* bad_value = tail[0] == '1' ? tail + 1 : NULL;
    const char* root_value = NULL;
    for (size_t i = 0; i < n0; i++)
      if (strcmp(keys0[i], bad_key) == 0) root_value = values0[i];
    s = st__dist_agree_error(bad_key, root_value, bad, bad_value);
  }
  free(keys0);
  free(values0);
  free(packed0);
  free(mine);
  return s;
}

/*--- the store, from a rank other than 0 ------------------------------------------------*/

static int st__dist_take_tag(dist_mpi* m) {
  int span = m->tag_ub - kFirstReplyTag + 1;
  int t = atomic_fetch_add(&m->next_tag, 1);
  return kFirstReplyTag + (int)((unsigned)(t - kFirstReplyTag) % (unsigned)span);
}

/* Sends one request and waits for its st__dist_reply (*reply_buf: reply_head, value). */
static st_status st__dist_ask(st_dist* d, int op, const char* key, const void* value, size_t size, int64_t timeout_ms,
                     char** reply_buf, int* reply_len) {
  dist_mpi* m = d->mpi;
  const char* what = op == kOpPut ? "put" : "get";
  size_t key_len = strlen(key);
  if (key_len > (size_t)INT_MAX / 2 || size > (size_t)INT_MAX / 2)
    return st_status_make(ST_CODE_INTERNAL, "key-value store: %s '%s': key or value over 1 GiB", what, key);
  req_head h = {.op = op, .reply_tag = st__dist_take_tag(m), .timeout_ms = timeout_ms, .key_len = (uint32_t)key_len,
                .value_len = (uint32_t)size};
  size_t len = sizeof(h) + key_len + size;
  char* buf = st_xmalloc(len);
  memcpy(buf, &h, sizeof(h));
  memcpy(buf + sizeof(h), key, key_len);
  if (size) memcpy(buf + sizeof(h) + key_len, value, size);
  double deadline = st_now() + (timeout_ms > 0 ? (double)timeout_ms / 1e3 : 0) + kGraceSeconds;
  MPI_Request req;
  int rc = MPI_Isend(buf, (int)len, MPI_BYTE, 0, kReqTag, m->kv, &req);
  st_status s = rc == MPI_SUCCESS ? st__dist_wait_until(&req, deadline, what, key)
                                  : st__dist_mpi_fail(rc, "key-value store: %s '%s' to rank 0", what, key);
  free(buf);
  if (s) return s;
  double backoff = 20e-6;
  for (;;) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status status;
    rc = MPI_Improbe(0, h.reply_tag, m->kv, &flag, &msg, &status);
    if (rc != MPI_SUCCESS) return st__dist_mpi_fail(rc, "key-value store: %s '%s': waiting for rank 0", what, key);
    if (flag) {
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      *reply_buf = st_xmalloc(count > 0 ? (size_t)count : 1);
      *reply_len = count;
      rc = MPI_Mrecv(*reply_buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        free(*reply_buf);
        *reply_buf = NULL;
        return st__dist_mpi_fail(rc, "key-value store: %s '%s': receiving rank 0's answer", what, key);
      }
      return ST_OK;
    }
    if (st_now() >= deadline)
      return st_status_make(ST_CODE_RUNTIME,
                            "key-value store: %s '%s': rank 0 did not answer within %.0f s of the deadline (is rank 0 alive?)",
                            what, key, kGraceSeconds);
    st__dist_nap(&backoff);
  }
}

st_status st__dist_mpi_kv_put(st_dist* d, const char* key, const void* value, size_t size) {
  char* r = NULL;
  int len = 0;
  ST_RETURN(st__dist_ask(d, kOpPut, key, value, size, 0, &r, &len));
  free(r);
  return ST_OK;
}

st_status st__dist_mpi_kv_get(st_dist* d, const char* key, int64_t timeout_ms, bool* found, void** value, size_t* size) {
  char* r = NULL;
  int len = 0;
  ST_RETURN(st__dist_ask(d, kOpGet, key, NULL, 0, timeout_ms, &r, &len));
  reply_head h;
  if ((size_t)len < sizeof(h)) {
    free(r);
    return st_status_make(ST_CODE_INTERNAL, "key-value store: get '%s': a reply of %d bytes", key, len);
  }
  memcpy(&h, r, sizeof(h));
  if ((size_t)len != sizeof(h) + h.value_len) {
    free(r);
    return st_status_make(ST_CODE_INTERNAL, "key-value store: get '%s': a torn reply", key);
  }
  *found = h.found != 0;
  if (*found) {
    char* v = st_xmalloc((size_t)h.value_len + 1);
    memcpy(v, r + sizeof(h), h.value_len);
    v[h.value_len] = '\0';
    *value = v;
    *size = h.value_len;
  }
  free(r);
  return ST_OK;
}

#endif /* MPI */
