/* writer.c — the asynchronous checkpoint writer: one worker thread that
 * runs st_ckpt_save on a snapshot while the training thread goes on.
 *
 * At most one save is in flight. The trainer takes the previous result
 * before submitting the next snapshot, which (a) lets it reuse a single
 * host snapshot, (b) bounds the steps a crash can lose to about two save
 * intervals, and (c) keeps every run-log write on the training thread. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/ckpt.h"

struct st_ckpt_writer {
  st_ckpt_save_options options;
  char* root; /* owned copy behind options.root */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const st_ckpt_snapshot* pending; /* submitted, not yet saved */
  bool has_result;
  st_ckpt_save_result result;
  bool stop;
};

static void* st__writer_main(void* arg) {
  st_ckpt_writer* w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->stop && (!w->pending || w->has_result)) pthread_cond_wait(&w->cv, &w->mu);
    if (!w->pending || w->has_result) break; /* stopping with nothing to do */
    const st_ckpt_snapshot* snap = w->pending;
    pthread_mutex_unlock(&w->mu);
    st_ckpt_save_result r;
    st_status s = st_ckpt_save(&w->options, snap, &r);
    r.status = s;
    pthread_mutex_lock(&w->mu);
    w->result = r;
    w->has_result = true;
    w->pending = NULL;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

st_status st_ckpt_writer_create(const st_ckpt_save_options* options, st_ckpt_writer** out) {
  *out = NULL;
  st_ckpt_writer* w = st_xcalloc(1, sizeof(*w));
  w->options = *options;
  w->root = st_xstrdup(options->root);
  w->options.root = w->root;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  int rc = pthread_create(&w->thread, NULL, st__writer_main, w);
  if (rc != 0) {
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->root);
    free(w);
    return st_status_make(ST_CODE_CKPT, "cannot start the checkpoint writer thread (error %d)", rc);
  }
  *out = w;
  return ST_OK;
}

st_status st_ckpt_writer_submit(st_ckpt_writer* w, const st_ckpt_snapshot* snapshot) {
  if (st_ckpt_snapshot_is_streaming(snapshot))
    return st_status_make(ST_CODE_INTERNAL, "a streaming checkpoint snapshot reads the live state: save it synchronously");
  pthread_mutex_lock(&w->mu);
  bool busy = w->pending || w->has_result;
  if (!busy) {
    w->pending = snapshot;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  if (busy)
    return st_status_make(ST_CODE_INTERNAL, "checkpoint writer: a save is still in flight or unreported; take its result first");
  return ST_OK;
}

bool st_ckpt_writer_busy(st_ckpt_writer* w) {
  pthread_mutex_lock(&w->mu);
  bool busy = w->pending != NULL;
  pthread_mutex_unlock(&w->mu);
  return busy;
}

bool st_ckpt_writer_take(st_ckpt_writer* w, bool wait, st_ckpt_save_result* out) {
  pthread_mutex_lock(&w->mu);
  if (wait)
    while (w->pending && !w->has_result) pthread_cond_wait(&w->cv, &w->mu);
  bool got = w->has_result;
  if (got) {
    *out = w->result;
    memset(&w->result, 0, sizeof(w->result));
    w->has_result = false;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return got;
}

void st_ckpt_writer_destroy(st_ckpt_writer* w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  /* A save in flight is finished, not abandoned: it is a valid checkpoint. */
  while (w->pending && !w->has_result) pthread_cond_wait(&w->cv, &w->mu);
  w->stop = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  if (w->has_result) st_ckpt_save_result_clear(&w->result);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w->root);
  free(w);
}
