/* watchdog.c — the in-process hang watchdog (strata/diag.h,
 * docs/diagnostics.md "Hang watchdog").
 *
 * Activities (plan ops per device, compiles, checkpoint writes, steps)
 * begin and end under one mutex; each gets a deadline when it begins, from
 * the slowest completed duration of its key. A thread looks every tick for
 * an activity past its deadline and, on the first one, writes the bundle
 * and ends the process with exit 6 (or calls the tests' on_hang).
 *
 * Host backtraces: the watchdog signals each thread of the process in turn
 * (tgkill, SIGURG) and the handler writes backtrace(3) frames with
 * backtrace_symbols_fd(3) to the bundle's threads.txt. A handler gets no
 * user pointer, so the fd, the thread addressed and the semaphore it posts
 * are the three process-wide variables here (g_bt_*); they are set only
 * while one dump runs (one watchdog fires once, and the dump is serialised
 * by g_bt_mu). SIGURG because its default action is to ignore it: a thread
 * that takes it late, after the old disposition is back, is not harmed. */
#include <dirent.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/diag.h"
#include "strata/obs.h"

#define ST__NAME_MAX 96

typedef struct {
  bool used;
  st_watch_phase phase;
  int key;
  char name[ST__NAME_MAX];
  char plan[8];
  char kind[16];
  int op, layer, micro, device;
  int64_t step;
  double begin;    /* st_now() */
  double wall;     /* unix time it began */
  double deadline; /* seconds after begin */
  double slowest;  /* the slowest seen of its key when it began (0: none) */
  int next_free;
} st__act;

struct st_watchdog {
  st_watchdog_options o;
  char* run_dir;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  bool running, stop, fired;
  st__act* acts;
  int cap, free_head;
  double* slowest; /* [keys] */
  int64_t* seen;   /* [keys] */
  int keys;
  st__act last;    /* the last completed activity (name "": none yet) */
  double last_end_wall;
  st__act last_op; /* the last completed plan op */
  double last_op_end_wall;
};

const char* st_watch_phase_name(st_watch_phase p) {
  switch (p) {
    case ST_WATCH_OP: return "op";
    case ST_WATCH_COMPILE: return "compile";
    case ST_WATCH_CKPT: return "checkpoint_write";
    case ST_WATCH_STEP: return "step";
    default: return "?";
  }
}

static double st__watchdog_wall(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

/* Under mu. */
static double st__deadline_locked(const st_watchdog* w, st_watch_phase phase, int key, double* out_slowest) {
  double slowest = key >= 0 && key < w->keys && w->seen[key] ? w->slowest[key] : 0;
  if (out_slowest) *out_slowest = slowest;
  double floor_s = phase == ST_WATCH_COMPILE ? w->o.compile_s : w->o.floor_s;
  return fmax(floor_s, w->o.factor * slowest) + w->o.timeout_s;
}

double st_watchdog_deadline(st_watchdog* w, st_watch_phase phase, int key) {
  pthread_mutex_lock(&w->mu);
  double d = st__deadline_locked(w, phase, key, NULL);
  pthread_mutex_unlock(&w->mu);
  return d;
}

int st_watchdog_keys(st_watchdog* w, int count) {
  if (!w) return 0;
  pthread_mutex_lock(&w->mu);
  int base = w->keys;
  w->keys += count > 0 ? count : 0;
  w->slowest = st_xrealloc(w->slowest, (size_t)(w->keys + 1) * sizeof(double));
  w->seen = st_xrealloc(w->seen, (size_t)(w->keys + 1) * sizeof(int64_t));
  for (int k = base; k < w->keys; ++k) {
    w->slowest[k] = 0;
    w->seen[k] = 0;
  }
  pthread_mutex_unlock(&w->mu);
  return base;
}

int st_watchdog_begin(st_watchdog* w, const st_watch_item* it) {
  if (!w) return -1;
  double now = st_now(), wall = st__watchdog_wall();
  pthread_mutex_lock(&w->mu);
  if (w->free_head < 0) {
    int old = w->cap;
    w->cap = old ? 2 * old : 64;
    w->acts = st_xrealloc(w->acts, (size_t)w->cap * sizeof(st__act));
    memset(w->acts + old, 0, (size_t)(w->cap - old) * sizeof(st__act));
    for (int i = w->cap - 1; i >= old; --i) {
      w->acts[i].next_free = w->free_head;
      w->free_head = i;
    }
  }
  int h = w->free_head;
  st__act* a = &w->acts[h];
  w->free_head = a->next_free;
  memset(a, 0, sizeof(*a));
  a->used = true;
  a->phase = it->phase;
  a->key = it->key;
  snprintf(a->name, sizeof(a->name), "%s", it->name ? it->name : "");
  snprintf(a->plan, sizeof(a->plan), "%s", it->plan ? it->plan : "");
  snprintf(a->kind, sizeof(a->kind), "%s", it->kind ? it->kind : "");
  a->op = it->op;
  a->layer = it->layer;
  a->micro = it->micro;
  a->device = it->device;
  a->step = it->step;
  a->begin = now;
  a->wall = wall;
  a->deadline = st__deadline_locked(w, it->phase, it->key, &a->slowest);
  pthread_mutex_unlock(&w->mu);
  return h;
}

void st_watchdog_end(st_watchdog* w, int h) {
  if (!w || h < 0) return;
  double now = st_now(), wall = st__watchdog_wall();
  pthread_mutex_lock(&w->mu);
  if (h < w->cap && w->acts[h].used) {
    st__act* a = &w->acts[h];
    double took = now - a->begin;
    if (a->key >= 0 && a->key < w->keys) {
      if (took > w->slowest[a->key]) w->slowest[a->key] = took;
      w->seen[a->key]++;
    }
    w->last = *a;
    w->last_end_wall = wall;
    if (a->phase == ST_WATCH_OP) {
      w->last_op = *a;
      w->last_op_end_wall = wall;
    }
    a->used = false;
    a->next_free = w->free_head;
    w->free_head = h;
  }
  pthread_mutex_unlock(&w->mu);
}

/*===-------------------------------------------------------------------===*/
/* The bundle                                                               */
/*===-------------------------------------------------------------------===*/

/* "LAUNCH block_fwd (step plan op 12, layer 1, microbatch 0, device 0, step 3)" */
static void st__describe(const st__act* a, char* out, size_t size) {
  st_strbuf b = {0};
  if (a->plan[0]) st_strbuf_printf(&b, "%s plan op %d", a->plan, a->op);
  if (a->layer >= 0) st_strbuf_printf(&b, "%slayer %d", b.len ? ", " : "", a->layer);
  if (a->micro >= 0) st_strbuf_printf(&b, "%smicrobatch %d", b.len ? ", " : "", a->micro);
  if (a->device >= 0) st_strbuf_printf(&b, "%sdevice %d", b.len ? ", " : "", a->device);
  if (a->step > 0) st_strbuf_printf(&b, "%sstep %lld", b.len ? ", " : "", (long long)a->step);
  snprintf(out, size, "%s %s%s%s%s", a->kind[0] ? a->kind : st_watch_phase_name(a->phase), a->name, b.len ? " (" : "",
           st_strbuf_cstr(&b), b.len ? ")" : "");
  st_strbuf_free(&b);
}

/* |now| > 0 adds the time it has run. */
static json_t* st__act_json(const st__act* a, double now) {
  json_t* j = st_json_obj();
  st_json_put_str(j, "phase", st_watch_phase_name(a->phase));
  st_json_put_str(j, "name", a->name);
  if (a->plan[0]) st_json_put_str(j, "plan", a->plan);
  if (a->kind[0]) st_json_put_str(j, "kind", a->kind);
  if (a->op >= 0) st_json_put_int(j, "op", a->op);
  if (a->layer >= 0) st_json_put_int(j, "layer", a->layer);
  if (a->micro >= 0) st_json_put_int(j, "microbatch", a->micro);
  if (a->device >= 0) st_json_put_int(j, "device", a->device);
  if (a->step > 0) st_json_put_int(j, "step", a->step);
  st_json_put(j, "issued_at", st_json_fixed(a->wall, 6));
  if (now > 0) st_json_put(j, "elapsed_s", st_json_fixed(now - a->begin, 6));
  st_json_put(j, "deadline_s", st_json_fixed(a->deadline, 6));
  st_json_put(j, "slowest_seen_s", st_json_fixed(a->slowest, 6));
  return j;
}

/* The backtrace handler's state (see the file comment). */
static volatile sig_atomic_t g_bt_fd = -1;
static volatile sig_atomic_t g_bt_tid = 0;
static sem_t g_bt_done;
static pthread_mutex_t g_bt_mu = PTHREAD_MUTEX_INITIALIZER;

static void st__bt_handler(int sig) {
  (void)sig;
  int saved = errno;
  if ((pid_t)syscall(SYS_gettid) == (pid_t)g_bt_tid && g_bt_fd >= 0) {
    void* frames[64];
    int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, (int)g_bt_fd);
    sem_post(&g_bt_done);
  }
  errno = saved;
}

static void st__read_small(const char* path, char* out, size_t size) {
  out[0] = '\0';
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, out, size - 1);
  close(fd);
  out[n > 0 ? n : 0] = '\0';
}

/* Whether thread |tid| blocks SIGURG (/proc/self/task/TID/status SigBlk). */
static bool st__blocks_sigurg(long tid) {
  char path[64], text[4096];
  snprintf(path, sizeof(path), "/proc/self/task/%ld/status", tid);
  st__read_small(path, text, sizeof(text));
  const char* p = strstr(text, "SigBlk:");
  if (!p) return false;
  unsigned long long mask = strtoull(p + 7, NULL, 16);
  return (mask >> (SIGURG - 1)) & 1ull;
}

/* Every thread's name, state and backtrace into |fd|; a JSON list of them
 * into |threads|. Bounded: at most 0.2 s a thread, 1.5 s in all. */
static void st__dump_threads(int fd, json_t* threads) {
  pthread_mutex_lock(&g_bt_mu);
  sem_init(&g_bt_done, 0, 0);
  struct sigaction sa, old;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = st__bt_handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGURG, &sa, &old);
  g_bt_fd = fd;
  long self = (long)syscall(SYS_gettid);
  pid_t pid = getpid();
  double t_end = st_now() + 1.5;
  DIR* d = opendir("/proc/self/task");
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    long tid = strtol(e->d_name, NULL, 10);
    char path[96], comm[64], stat[512];
    snprintf(path, sizeof(path), "/proc/self/task/%ld/comm", tid);
    st__read_small(path, comm, sizeof(comm));
    char* nl = strchr(comm, '\n');
    if (nl) *nl = '\0';
    /* The state is the field after the parenthesised name. */
    snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", tid);
    st__read_small(path, stat, sizeof(stat));
    const char* rp = strrchr(stat, ')');
    char state = rp && rp[1] == ' ' ? rp[2] : '?';
    snprintf(path, sizeof(path), "/proc/self/task/%ld/wchan", tid);
    char wchan[64];
    st__read_small(path, wchan, sizeof(wchan));
    char head[256];
    int hn = snprintf(head, sizeof(head), "\nthread %ld (%s) state %c%s%s%s\n", tid, comm, state, wchan[0] && strcmp(wchan, "0") ? " in " : "",
                      wchan[0] && strcmp(wchan, "0") ? wchan : "", tid == self ? " [the watchdog itself]" : "");
    if (write(fd, head, (size_t)hn) != hn) { /* best effort */
    }
    const char* got = "yes";
    if (tid == self) {
      got = "watchdog";
    } else if (st__blocks_sigurg(tid)) {
      got = "signal blocked";
    } else if (st_now() > t_end) {
      got = "out of time";
    } else {
      g_bt_tid = (sig_atomic_t)tid;
      if (syscall(SYS_tgkill, pid, (pid_t)tid, SIGURG) != 0) {
        got = "gone";
      } else {
        double until = fmin(st_now() + 0.2, t_end);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double left = until - st_now();
        ts.tv_sec += (time_t)left;
        ts.tv_nsec += (long)((left - floor(left)) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
          ts.tv_sec++;
          ts.tv_nsec -= 1000000000L;
        }
        int r;
        while ((r = sem_timedwait(&g_bt_done, &ts)) != 0 && errno == EINTR) {
        }
        if (r != 0) got = "no answer";
      }
      g_bt_tid = 0;
    }
    if (strcmp(got, "yes") != 0) {
      char line[64];
      int ln = snprintf(line, sizeof(line), "  (no backtrace: %s)\n", got);
      if (write(fd, line, (size_t)ln) != ln) {
      }
    }
    json_t* t = st_json_obj();
    st_json_put_int(t, "tid", tid);
    st_json_put_str(t, "name", comm);
    char st[2] = {state, '\0'};
    st_json_put_str(t, "state", st);
    st_json_put_str(t, "backtrace", got);
    st_json_push(threads, t);
  }
  if (d) closedir(d);
  g_bt_fd = -1;
  sigaction(SIGURG, &old, NULL);
  /* A handler still running for a thread that answered late posts to
   * nothing (g_bt_tid is 0), so the semaphore can go. */
  sem_destroy(&g_bt_done);
  pthread_mutex_unlock(&g_bt_mu);
}

/* The last |max_lines| lines of <run>/events.jsonl into |dst|. */
static void st__events_tail(const char* run_dir, const char* dst, int max_lines) {
  char* src = st_rundir_path(run_dir, ST_RUNDIR_EVENTS);
  int fd = open(src, O_RDONLY | O_CLOEXEC);
  free(src);
  if (fd < 0) return;
  off_t size = lseek(fd, 0, SEEK_END);
  off_t from = size > 65536 ? size - 65536 : 0;
  size_t n = (size_t)(size - from);
  char* buf = st_xmalloc(n + 1);
  ssize_t got = pread(fd, buf, n, from);
  close(fd);
  if (got < 0) got = 0;
  buf[got] = '\0';
  /* Whole lines only. */
  char* start = buf;
  int lines = 0;
  for (char* p = buf + got; p > buf; --p) {
    if (p[-1] == '\n' && p != buf + got && ++lines >= max_lines) {
      start = p;
      break;
    }
  }
  if (start == buf && from > 0) {
    char* nl = strchr(buf, '\n');
    start = nl ? nl + 1 : buf + got;
  }
  st_status_free(st_fs_write_atomic(dst, start, (size_t)(buf + got - start)));
  free(buf);
}

/* Executable mappings, so that addresses of static functions (which
 * backtrace_symbols_fd cannot name) can be resolved with addr2line. */
static void st__maps(const char* dst) {
  /* Read line by line: /proc files report a size of 0. */
  FILE* f = fopen("/proc/self/maps", "re");
  if (!f) return;
  st_strbuf b = {0};
  char line[4608];
  while (fgets(line, sizeof(line), f)) {
    char perms[8] = "";
    if (sscanf(line, "%*s %7s", perms) == 1 && strchr(perms, 'x')) st_strbuf_append(&b, line);
  }
  fclose(f);
  st_status_free(st_fs_write_atomic(dst, b.data ? b.data : "", b.len));
  st_strbuf_free(&b);
}

/* Writes the bundle for |expired| (index into |acts|, a snapshot of the
 * |n| activities in flight); returns its folder (caller frees). */
static char* st__watchdog_write_bundle(st_watchdog* w, const st__act* acts, int n, int expired, const st__act* last, double last_end,
                              const st__act* last_op, double last_op_end, double now) {
  double wall = st__watchdog_wall();
  time_t tt = (time_t)wall;
  struct tm tm;
  localtime_r(&tt, &tm);
  char stamp[64];
  strftime(stamp, sizeof(stamp), "hang-%Y%m%d-%H%M%S", &tm);
  char* dir = st_rundir_path_in(w->run_dir, ST_RUNDIR_DIAG, stamp);
  if (st_fs_exists(dir)) {
    char more[96];
    snprintf(more, sizeof(more), "%s-%ld", stamp, (long)getpid());
    free(dir);
    dir = st_rundir_path_in(w->run_dir, ST_RUNDIR_DIAG, more);
  }
  st_status_free(st_fs_mkdirs(dir));

  json_t* j = st_json_obj();
  st_json_put(j, "detected_at", st_json_fixed(wall, 6));
  st_json_put_int(j, "pid", (int64_t)getpid());
  const st__act* x = &acts[expired];
  char what[320];
  st__describe(x, what, sizeof(what));
  st_json_put_str(j, "summary", what);
  st_json_put(j, "expired", st__act_json(x, now));
  /* Oldest first. */
  int* order = st_xcalloc((size_t)n + 1, sizeof(int));
  for (int i = 0; i < n; ++i) order[i] = i;
  for (int i = 1; i < n; ++i)
    for (int k = i; k > 0 && acts[order[k]].begin < acts[order[k - 1]].begin; --k) {
      int tmp = order[k];
      order[k] = order[k - 1];
      order[k - 1] = tmp;
    }
  json_t* fl = st_json_arr();
  for (int i = 0; i < n; ++i) st_json_push(fl, st__act_json(&acts[order[i]], now));
  free(order);
  st_json_put(j, "in_flight", fl);
  const st__act* lasts[2] = {last, last_op};
  const double ends[2] = {last_end, last_op_end};
  const char* keys[2] = {"last_completed", "last_completed_op"};
  for (int k = 0; k < 2; ++k) {
    if (lasts[k]->used) {
      json_t* l = st__act_json(lasts[k], 0);
      st_json_put(l, "completed_at", st_json_fixed(ends[k], 6));
      st_json_put(j, keys[k], l);
    } else {
      st_json_put(j, keys[k], json_null());
    }
  }
  json_t* cfg = st_json_obj();
  st_json_put_num(cfg, "timeout_s", w->o.timeout_s);
  st_json_put_num(cfg, "factor", w->o.factor);
  st_json_put_num(cfg, "floor_s", w->o.floor_s);
  st_json_put_num(cfg, "compile_s", w->o.compile_s);
  st_json_put(j, "watchdog", cfg);
  /* A job: which rank hung, and whether it waits on the other ranks. */
  char coll[256] = "";
  if (st_dist_multi(w->o.dist)) {
    st_json_put_int(j, "rank", st_dist_rank(w->o.dist));
    st_json_put_int(j, "processes", st_dist_size(w->o.dist));
    if (st_dist_coll_pending(w->o.dist, coll, sizeof(coll))) st_json_put_str(j, "cross_process", coll);
    else coll[0] = '\0';
  }

  /* Backtraces before anything slower, while the stuck state is fresh. */
  char* tpath = st_path_join(dir, "threads.txt");
  int fd = open(tpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  json_t* threads = st_json_arr();
  if (fd >= 0) {
    const char* hdr = "# Host threads of the hung process: name, scheduler state (R running, S sleeping, D disk),\n"
                      "# kernel wait channel, and backtrace(3) frames (binary(function+offset) [address]; static\n"
                      "# functions show as binary(+offset): resolve with addr2line -f -e BINARY OFFSET, maps.txt).\n";
    if (write(fd, hdr, strlen(hdr)) < 0) { /* best effort */
    }
    st__dump_threads(fd, threads);
    fsync(fd);
    close(fd);
  }
  free(tpath);
  st_json_put(j, "threads", threads);
  char* hpath = st_path_join(dir, "hang.json");
  st_status_free(st_json_write_file(hpath, j, 2));
  free(hpath);
  char* epath = st_path_join(dir, "events.tail.jsonl");
  st__events_tail(w->run_dir, epath, 50);
  free(epath);
  char* mpath = st_path_join(dir, "maps.txt");
  st__maps(mpath);
  free(mpath);

  if (w->o.log) {
    json_t* e = st_json_obj();
    st_json_put_str(e, "dir", dir);
    st_json_put_str(e, "summary", what);
    st_json_put(e, "expired", st__act_json(x, now));
    st_json_put_int(e, "in_flight", n);
    if (st_dist_multi(w->o.dist)) st_json_put_int(e, "rank", st_dist_rank(w->o.dist));
    if (coll[0]) st_json_put_str(e, "cross_process", coll);
    st_status_free(st_runlog_event(w->o.log, "hang", e));
  }
  json_decref(j);
  return dir;
}

static void* st__thread(void* arg) {
  st_watchdog* w = arg;
  double tick = w->o.tick_s > 0 ? w->o.tick_s : 0.05;
  pthread_mutex_lock(&w->mu);
  while (!w->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)(tick * 1e9);
    while (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    if (w->stop) break;
    double now = st_now();
    int expired = -1;
    double worst = 0;
    /* A step holds ops: while one is in flight, its own deadline decides
     * and names it; the step's counts only for a hang between ops. */
    int ops = 0;
    for (int i = 0; i < w->cap; ++i) ops += w->acts[i].used && w->acts[i].phase == ST_WATCH_OP;
    for (int i = 0; i < w->cap; ++i) {
      const st__act* a = &w->acts[i];
      if (!a->used || (a->phase == ST_WATCH_STEP && ops > 0)) continue;
      double over = now - a->begin - a->deadline;
      if (over > 0 && (expired < 0 || over > worst)) {
        expired = i;
        worst = over;
      }
    }
    if (expired < 0) continue;
    /* Snapshot, then write without the lock: the stuck thread may still
     * end other activities, and the plugin's callbacks must not wait. */
    int n = 0, at = 0;
    for (int i = 0; i < w->cap; ++i) n += w->acts[i].used;
    st__act* snap = st_xcalloc((size_t)n + 1, sizeof(st__act));
    for (int i = 0; i < w->cap; ++i) {
      if (!w->acts[i].used) continue;
      if (i == expired) expired = at;
      snap[at++] = w->acts[i];
    }
    st__act last = w->last, last_op = w->last_op;
    double last_end = w->last_end_wall, last_op_end = w->last_op_end_wall;
    w->fired = true;
    pthread_mutex_unlock(&w->mu);
    const st__act* x = &snap[expired];
    char what[320];
    st__describe(x, what, sizeof(what));
    fprintf(stderr,
            "strata: HANG: %s has run %.2f s, past its deadline of %.2f s (max(floor, %.1f x slowest seen %.3f s) + "
            "diag.hang_timeout_s %.2f)\n",
            what, now - x->begin, x->deadline, w->o.factor, x->slowest, w->o.timeout_s);
    char* dir = st__watchdog_write_bundle(w, snap, n, expired, &last, last_end, &last_op, last_op_end, now);
    free(snap);
    if (w->o.on_hang) {
      w->o.on_hang(w->o.user, dir);
      free(dir);
      pthread_mutex_lock(&w->mu);
      break;
    }
    fprintf(stderr, "strata: hang bundle in %s; exiting with code 6 (docs/diagnostics.md, \"Hang watchdog\")\n", dir);
    fflush(stderr);
    _exit(6);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

st_status st_watchdog_create(const st_watchdog_options* o, st_watchdog** out) {
  *out = NULL;
  if (!(o->timeout_s > 0))
    return st_status_make(ST_CODE_INTERNAL, "watchdog: timeout_s must be > 0 (diag.hang_timeout_s=0 means no watchdog)");
  st_watchdog* w = st_xcalloc(1, sizeof(*w));
  w->o = *o;
  w->run_dir = st_xstrdup(o->run_dir ? o->run_dir : ".");
  w->o.run_dir = w->run_dir;
  w->free_head = -1;
  pthread_mutex_init(&w->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  /* backtrace(3) loads libgcc on its first call, which allocates: do it
   * now, never first in a signal handler. */
  void* frames[4];
  (void)backtrace(frames, 4);
  int r = pthread_create(&w->thread, NULL, st__thread, w);
  if (r != 0) {
    st_watchdog_destroy(w);
    return st_status_make(ST_CODE_INTERNAL, "watchdog: cannot start its thread: %s", strerror(r));
  }
  w->running = true;
  *out = w;
  return ST_OK;
}

void st_watchdog_destroy(st_watchdog* w) {
  if (!w) return;
  if (w->running) {
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
  }
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w->acts);
  free(w->slowest);
  free(w->seen);
  free(w->run_dir);
  free(w);
}

/*===-------------------------------------------------------------------===*/
/* Loss spikes                                                              */
/*===-------------------------------------------------------------------===*/

struct st_spike {
  int window, min_count, count, next;
  double* values; /* ring of the last |window| finite losses */
};

st_spike* st_spike_create(int window, int min_count) {
  st_spike* s = st_xcalloc(1, sizeof(*s));
  s->window = window > 1 ? window : 2;
  s->min_count = min_count > 2 ? min_count : 2;
  if (s->min_count > s->window) s->min_count = s->window;
  s->values = st_xcalloc((size_t)s->window, sizeof(double));
  return s;
}

void st_spike_destroy(st_spike* s) {
  if (!s) return;
  free(s->values);
  free(s);
}

bool st_spike_push(st_spike* s, double loss, double threshold, st_spike_result* out) {
  st_spike_result r = {0, 0, 0, s->count};
  bool spike = false;
  if (!isfinite(loss)) {
    if (out) *out = r;
    return false;
  }
  if (s->count >= s->min_count) {
    /* Two passes over at most |window| values: exact enough, no drift. */
    double sum = 0;
    for (int i = 0; i < s->count; ++i) sum += s->values[i];
    double mean = sum / s->count, ss = 0;
    for (int i = 0; i < s->count; ++i) ss += (s->values[i] - mean) * (s->values[i] - mean);
    double std = sqrt(ss / (s->count - 1));
    r.mean = mean;
    r.std = std;
    if (std > 0) {
      r.z = (loss - mean) / std;
      spike = r.z > threshold;
    }
  }
  s->values[s->next] = loss;
  s->next = (s->next + 1) % s->window;
  if (s->count < s->window) s->count++;
  if (out) *out = r;
  return spike;
}
