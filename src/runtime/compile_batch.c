/* compile_batch.c — compiling a set of programs on several threads.
 *
 * A cold start compiles every program of the step, the eval pass and the
 * init (17 files for the default model). XLA's CPU compiler spreads one
 * compile over ~1.5 cores, so on a small machine one compile at a time is
 * best; on a large one several compiles overlap, and the batch takes about
 * the sum of the compiles divided by the threads, bounded below by the
 * largest program (block_bwd_res). Starting the largest files first keeps
 * that bound: the longest compile is never the last to begin (LPT).
 *
 * PJRT clients are thread-safe for compilation (JAX compiles from several
 * threads too); the runtime's counters are atomics, and the executable
 * cache writes each entry through a uniquely named temporary file. */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/rt_internal.h"

typedef struct st__batch {
  st_runtime* rt;
  st_program_compile_job* jobs;
  st_status* results; /* by job index */
  const int* order;   /* job indices, largest file first */
  int count;
  _Atomic int next;   /* position in |order| of the next job to start */
  /* "compile: k/n programs" (runtime.progress), drawn under |lock| as each
   * compile ends, whichever thread ran it. */
  bool progress;
  pthread_mutex_t lock;
  int done;
  st_progress_line line;
} st__batch;

static void* st__batch_worker(void* arg) {
  st__batch* b = arg;
  for (;;) {
    int k = atomic_fetch_add(&b->next, 1);
    if (k >= b->count) break;
    int j = b->order[k];
    st_program_compile_job* job = &b->jobs[j];
    double t0 = st_now();
    b->results[j] = st_program_compile_file(b->rt, job->path, job->signature, &job->program);
    job->seconds = st_now() - t0;
    if (b->progress) {
      pthread_mutex_lock(&b->lock);
      st_progress_line_update(&b->line, ++b->done);
      pthread_mutex_unlock(&b->lock);
    }
  }
  return NULL;
}

typedef struct st__sized {
  int index;
  long long size;
} st__sized;

static int st__by_size_desc(const void* a, const void* b) {
  const st__sized* x = a;
  const st__sized* y = b;
  if (x->size != y->size) return x->size < y->size ? 1 : -1;
  return x->index - y->index; /* stable: equal sizes keep job order */
}

/* XLA's CPU compiler already spreads one compile over ~1.5 cores (measured
 * on 2 CPUs: 4.95 CPU-s in 3.23 s for the 17 programs of a cold start), so
 * two compiles per two CPUs only contend (3.62 s, 6.14 CPU-s). Hence one
 * compile per two CPUs. */
/* runtime.compile_threads=0: on a CPU plugin one per two online CPUs (XLA's
 * CPU compiler uses more threads of its own); on a GPU plugin one. There
 * the programs share fusions, XLA autotunes each on the one GPU, and the
 * H200 run measured 69 s of compile one at a time against 85 s with
 * eight threads (docs/performance.md, "GPU"); one at a time, each program
 * also finds the autotuning results of those before it in the per-fusion
 * cache (st__gpu_compile_defaults). */
int st_runtime_compile_threads(const st_runtime* rt) {
  if (!rt) return 1;
  long n = rt->compile_threads;
  if (n <= 0) n = rt->platform_name && strcmp(rt->platform_name, "cpu") ? 1 : sysconf(_SC_NPROCESSORS_ONLN) / 2;
  return n < 1 ? 1 : (int)n;
}

st_status st_program_compile_files(st_runtime* rt, st_program_compile_job* jobs, int count) {
  assert(rt); /* a caller's bug, not bad input */
  if (count < 0 || (count > 0 && !jobs)) return st_status_make(ST_CODE_INTERNAL, "st_program_compile_files: bad job list");
  if (count == 0) return ST_OK;
  for (int i = 0; i < count; ++i) {
    jobs[i].program = NULL;
    jobs[i].seconds = 0;
  }

  st__sized* sized = st_xcalloc((size_t)count, sizeof(*sized));
  int* order = st_xcalloc((size_t)count, sizeof(*order));
  st_status* results = st_xcalloc((size_t)count, sizeof(*results));
  for (int i = 0; i < count; ++i) {
    struct stat st;
    sized[i].index = i;
    /* A missing file sorts last; its compile reports the error. */
    sized[i].size = jobs[i].path && stat(jobs[i].path, &st) == 0 ? (long long)st.st_size : -1;
  }
  qsort(sized, (size_t)count, sizeof(*sized), st__by_size_desc);
  for (int i = 0; i < count; ++i) order[i] = sized[i].index;
  free(sized);

  st__batch b = {.rt = rt, .jobs = jobs, .results = results, .order = order, .count = count, .progress = rt->progress};
  atomic_init(&b.next, 0);
  pthread_mutex_init(&b.lock, NULL);
  if (b.progress) st_progress_line_start(&b.line, "compile", "programs", count);
  int n = st_runtime_compile_threads(rt);
  if (n > count) n = count;
  pthread_t* threads = st_xcalloc((size_t)n, sizeof(*threads));
  int started = 0;
  /* The calling thread is one of the n workers; a thread that cannot be
   * started only makes the batch slower. */
  for (int i = 1; i < n; ++i) {
    if (pthread_create(&threads[started], NULL, st__batch_worker, &b) != 0) break;
    started++;
  }
  st__batch_worker(&b);
  for (int i = 0; i < started; ++i) pthread_join(threads[i], NULL);
  pthread_mutex_destroy(&b.lock);
  free(threads);
  free(order);

  st_status first = ST_OK;
  for (int i = 0; i < count; ++i) {
    if (!results[i]) continue;
    if (!first) {
      first = results[i];
    } else {
      st_status_free(results[i]);
    }
  }
  free(results);
  if (first) {
    for (int i = 0; i < count; ++i) {
      st_program_destroy(jobs[i].program);
      jobs[i].program = NULL;
    }
  }
  return first;
}
