/* faults.c — fault injection (config faults.*) for recovery drills.
 *
 * A fault is recorded durably in <run>/diag/faults.fired *before* it acts,
 * so the attempt that resumes after it knows it already happened and does
 * not fire it again (a crash at step 37 would otherwise crash every
 * resumed attempt at step 37 too). faults.repeat=true keeps them armed,
 * which is how the "gives up after max_restarts" path is drilled. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/diag.h"
#include "strata/obs.h"

enum { F_CRASH_STEP, F_CRASH_SAVE, F_CORRUPT, F_IO_ERROR, F_HANG, F_HANG_SAVE,
       F_NAN,
       F_COUNT };
static const char* const kNames[F_COUNT] = {"crash_at_step",    "crash_in_save", "corrupt_latest",
                                            "io_error_at_save", "hang_at_step",  "hang_in_save",
                                            "nan_at"};
/* What N counts: a step (1-based) or the N-th checkpoint save of this process. */
static const bool kIsStep[F_COUNT] = {true, false, false, false, true, false, true};

struct st_faults {
  int64_t at[F_COUNT]; /* 0 = off (or disarmed) */
  int io_errno;
  bool repeat;
  int nan_layer, nan_micro, nan_value;
  char nan_tensor[64];
  char* fired_path;
  st_runlog* log;
  atomic_int saves; /* saves begun by this process */
  int64_t save_of_current;
  char armed[512];
  char disarmed[512];
  /* faults.hang_in: the program and the step (0: its first launch) */
  char hang_in[128];
  int64_t hang_in_step;
  char hang_in_spec[128]; /* as configured, while armed in this process ("" otherwise) */
  /* Armed in this process (at[] and hang_in_spec) and fired since: a run
   * that ends with one armed and not fired drilled nothing. The save
   * faults fire on the writer thread. */
  int64_t armed_at[F_COUNT];
  atomic_bool fired[F_COUNT];
  atomic_bool hang_in_fired;
};

/* Kinds listed in diag/faults.fired ("<kind> <n> <unix time> <pid>" lines). */
static bool st__already_fired(const char* text, const char* kind) {
  size_t n = strlen(kind);
  for (const char* p = text; p && *p;) {
    if (!strncmp(p, kind, n) && p[n] == ' ') return true;
    p = strchr(p, '\n');
    if (p) ++p;
  }
  return false;
}

st_status st_faults_create(const st_faults_options* o, const char* run_dir, st_faults** out) {
  *out = NULL;
  st_faults* f = st_xcalloc(1, sizeof(*f));
  const int64_t at[F_COUNT] = {o->crash_at_step,    o->crash_in_save, o->corrupt_latest,
                               o->io_error_at_save, o->hang_at_step,  o->hang_in_save,
                               o->nan_at_step};
  f->nan_layer = o->nan_layer;
  f->nan_micro = o->nan_micro;
  f->nan_value = o->nan_value;
  snprintf(f->nan_tensor, sizeof(f->nan_tensor), "%s", o->nan_tensor);
  for (int i = 0; i < F_COUNT; ++i) f->at[i] = at[i];
  f->io_errno = o->io_errno ? o->io_errno : ENOSPC;
  f->repeat = o->repeat;
  f->fired_path = st_rundir_path_in(run_dir, ST_RUNDIR_DIAG, "faults.fired");
  char* text = NULL;
  size_t size = 0;
  st_status r = st_fs_read_file(f->fired_path, &text, &size);
  st_status_free(r); /* absent: nothing fired yet */
  st_strbuf a = {0}, d = {0};
  for (int i = 0; i < F_COUNT; ++i) {
    if (!f->at[i]) continue;
    st_strbuf* b = &a;
    if (!f->repeat && text && st__already_fired(text, kNames[i])) {
      b = &d;
      st_strbuf_printf(b, "%s%s=%lld", b->len ? ", " : "", kNames[i], (long long)f->at[i]);
      f->at[i] = 0;
      continue;
    }
    st_strbuf_printf(b, "%s%s=%lld", b->len ? ", " : "", kNames[i], (long long)f->at[i]);
    if (i == F_IO_ERROR) st_strbuf_printf(b, " (%s)", f->io_errno == EIO ? "EIO" : "ENOSPC");
    if (i == F_NAN)
      st_strbuf_printf(b, ":%d%s%s microbatch %d", f->nan_layer, f->nan_tensor[0] ? ":" : "", f->nan_tensor, f->nan_micro);
  }
  if (o->hang_in && o->hang_in[0]) {
    /* "PROGRAM" or "PROGRAM:STEP" (the schema checked the syntax). */
    snprintf(f->hang_in, sizeof(f->hang_in), "%s", o->hang_in);
    char* colon = strrchr(f->hang_in, ':');
    if (colon) {
      f->hang_in_step = strtoll(colon + 1, NULL, 10);
      *colon = '\0';
    }
    st_strbuf* b = (!f->repeat && text && st__already_fired(text, "hang_in")) ? &d : &a;
    st_strbuf_printf(b, "%shang_in=%s", b->len ? ", " : "", o->hang_in);
    if (b == &d) f->hang_in[0] = '\0';
    else snprintf(f->hang_in_spec, sizeof(f->hang_in_spec), "%s", o->hang_in);
  }
  for (int i = 0; i < F_COUNT; ++i) {
    f->armed_at[i] = f->at[i];
    atomic_init(&f->fired[i], false);
  }
  atomic_init(&f->hang_in_fired, false);
  if (a.len && f->repeat) st_strbuf_append(&a, ", repeat");
  snprintf(f->armed, sizeof(f->armed), "%s", st_strbuf_cstr(&a));
  snprintf(f->disarmed, sizeof(f->disarmed), "%s", st_strbuf_cstr(&d));
  st_strbuf_free(&a);
  st_strbuf_free(&d);
  free(text);
  *out = f;
  return ST_OK;
}

void st_faults_destroy(st_faults* f) {
  if (!f) return;
  free(f->fired_path);
  free(f);
}

const char* st_faults_armed(const st_faults* f) { return f->armed; }
const char* st_faults_disarmed(const st_faults* f) { return f->disarmed; }
void st_faults_set_log(st_faults* f, st_runlog* log) { f->log = log; }

/* Durable record first, then a loud line on stderr and in events.jsonl.
 * Runs on the training or the writer thread; stdio streams are locked per
 * call, and each event is one fputs, so lines stay whole. */
static void st__fire_named(st_faults* f, const char* kind, int64_t n, const char* detail) {
  char dir[4096];
  snprintf(dir, sizeof(dir), "%s", f->fired_path);
  char* slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  st_status_free(st_fs_mkdirs(dir));
  int fd = open(f->fired_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    char line[256];
    int len = snprintf(line, sizeof(line), "%s %lld %.3f %ld\n", kind, (long long)n,
                       (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec, (long)getpid());
    if (write(fd, line, (size_t)len) != len) { /* best effort: the fault fires anyway */
    }
    fsync(fd);
    close(fd);
  }
  fprintf(stderr, "strata: FAULT INJECTED: %s=%lld: %s\n", kind, (long long)n, detail);
  fflush(stderr);
  if (f->log) {
    json_t* e = st_json_obj();
    st_json_put_str(e, "fault", kind);
    st_json_put_int(e, "n", n);
    st_json_put_str(e, "detail", detail);
    st_status_free(st_runlog_event(f->log, "fault_injected", e));
  }
}

static void st__fire(st_faults* f, int kind, int64_t n, const char* detail) {
  atomic_store(&f->fired[kind], true);
  st__fire_named(f, kNames[kind], n, detail);
}

static void st__die(void) {
  /* SIGKILL: no handlers, no atexit, no flushing: the harshest crash. */
  raise(SIGKILL);
  _exit(137); /* not reached */
}

bool st_faults_fire_at_step(const st_faults* f, int64_t step) {
  return f && step > 0 && (f->at[F_CRASH_STEP] == step || f->at[F_HANG] == step);
}

void st_faults_at_step(st_faults* f, int64_t step) {
  if (!f) return;
  if (f->at[F_CRASH_STEP] && step == f->at[F_CRASH_STEP]) {
    st__fire(f, F_CRASH_STEP, step, "SIGKILL during the step, before it is recorded");
    st__die();
  }
  if (f->at[F_HANG] && step == f->at[F_HANG]) {
    st__fire(f, F_HANG, step, "the trainer stops making progress (sleeps until a stop signal)");
    /* A stop signal (SIGTERM, SIGINT, SIGHUP) ends the hang: the trainer
     * then finishes the step and stops with a checkpoint, as it would
     * from any slow step. SIGKILL (the supervisor's hang timeout) ends it
     * the hard way. */
    /* Polled, not pause(): a signal landing between the check and the
     * pause would be slept through. */
    while (!st_stop_signal()) {
      struct timespec ts = {0, 20 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
}

const char* st_faults_hang_in_program(const st_faults* f) { return f && f->hang_in[0] ? f->hang_in : NULL; }

void st_faults_in_launch(st_faults* f, const char* program, int64_t step, int layer, int micro, int device) {
  if (!f || !f->hang_in[0] || strcmp(program, f->hang_in) != 0) return;
  if (f->hang_in_step > 0 && step != f->hang_in_step) return;
  char d[512];
  snprintf(d, sizeof(d), "the launch of %s (step %lld, layer %d, microbatch %d, device %d) never returns (sleeps until a stop signal)",
           program, (long long)step, layer, micro, device);
  atomic_store(&f->hang_in_fired, true);
  st__fire_named(f, "hang_in", step, d);
  f->hang_in[0] = '\0'; /* once, even when a stop signal ends it */
  /* Polled, as hang_at_step: the in-process watchdog (exit 6), the
   * supervisor's hang timeout or a stop signal ends it. */
  while (!st_stop_signal()) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

bool st_faults_nan_fire(st_faults* f, int64_t step, int layer, int micro, const char** out_tensor) {
  if (!f || !f->at[F_NAN] || step != f->at[F_NAN] || layer != f->nan_layer || micro != f->nan_micro) return false;
  char d[256];
  snprintf(d, sizeof(d), "%s into the first element of layer %d's forward output %s, microbatch %d",
           f->nan_value == 1 ? "+inf" : f->nan_value == 2 ? "3.4e38 (the largest finite f32)" : "NaN", layer,
           f->nan_tensor[0] ? f->nan_tensor : "y", micro);
  st__fire(f, F_NAN, step, d);
  if (!f->repeat) f->at[F_NAN] = 0;
  if (out_tensor) *out_tensor = f->nan_tensor;
  return true;
}

/* "faults.KEY=VALUE" of armed kind |i|, as the config spells it. */
static void st__spec(const st_faults* f, int i, char* out, size_t size) {
  if (i == F_NAN)
    snprintf(out, size, "faults.nan_at=%lld:%d%s%s", (long long)f->armed_at[i], f->nan_layer, f->nan_tensor[0] ? ":" : "",
             f->nan_tensor);
  else
    snprintf(out, size, "faults.%s=%lld", kNames[i], (long long)f->armed_at[i]);
}

st_status st_faults_check_run(const st_faults* f, int64_t first_step, int64_t last_step, int64_t max_saves, const char* saves_why) {
  if (!f) return ST_OK;
  char spec[200];
  for (int i = 0; i < F_COUNT; ++i) {
    int64_t n = f->armed_at[i];
    if (!n) continue;
    st__spec(f, i, spec, sizeof(spec));
    if (first_step > last_step)
      return st_status_make(ST_CODE_CONFIG, "%s cannot fire: this run resumes after step %lld and train.steps is %lld, so it "
                            "runs no step; raise train.steps, or set it to 0 (off)",
                            spec, (long long)first_step - 1, (long long)last_step);
    if (kIsStep[i] && (n < first_step || n > last_step)) {
      if (first_step > 1 && n < first_step)
        return st_status_make(ST_CODE_CONFIG,
                              "%s cannot fire: this run resumes after step %lld, so step %lld never runs in it (and "
                              "diag/faults.fired has no record of it firing); name a step from %lld to %lld, or 0 (off)",
                              spec, (long long)first_step - 1, (long long)n, (long long)first_step, (long long)last_step);
      return st_status_make(ST_CODE_CONFIG, "%s cannot fire: the run's steps are %lld to %lld (train.steps); name a step in "
                            "that range, or 0 (off)",
                            spec, (long long)first_step, (long long)last_step);
    }
    if (!kIsStep[i] && n > max_saves)
      return st_status_make(ST_CODE_CONFIG, "%s cannot fire: it counts this process's checkpoint saves, and this run begins at "
                            "most %lld (%s); name a save from 1 to %lld, or 0 (off)",
                            spec, (long long)max_saves, saves_why ? saves_why : "", (long long)max_saves);
  }
  if (f->hang_in_spec[0] && f->hang_in_step > 0 && (f->hang_in_step < first_step || f->hang_in_step > last_step))
    return st_status_make(ST_CODE_CONFIG, "faults.hang_in=%s cannot fire: the run's steps are %lld to %lld%s; name a step in that "
                          "range, or the program alone (its first launch)",
                          f->hang_in_spec, (long long)first_step, (long long)last_step,
                          first_step > 1 ? " (it resumes after a checkpoint)" : "");
  return ST_OK;
}

json_t* st_faults_unfired(const st_faults* f) {
  json_t* a = json_array();
  if (!f) return a;
  char spec[200];
  for (int i = 0; i < F_COUNT; ++i) {
    if (!f->armed_at[i] || atomic_load(&f->fired[i])) continue;
    st__spec(f, i, spec, sizeof(spec));
    json_array_append_new(a, st_json_str(spec));
  }
  if (f->hang_in_spec[0] && !atomic_load(&f->hang_in_fired)) {
    snprintf(spec, sizeof(spec), "faults.hang_in=%s", f->hang_in_spec);
    json_array_append_new(a, st_json_str(spec));
  }
  return a;
}

bool st_faults_any_armed(const st_faults* f) {
  if (!f) return false;
  for (int i = 0; i < F_COUNT; ++i)
    if (f->armed_at[i]) return true;
  return f->hang_in_spec[0] != '\0';
}

int64_t st_faults_saves(const st_faults* f) { return f ? atomic_load(&((st_faults*)f)->saves) : 0; }

st_status st_faults_corrupt_checkpoint(const char* dir, char** out_file) {
  if (out_file) *out_file = NULL;
  /* The parameters file when present, else any tensor file. */
  char* path = st_path_join(dir, ST_CKPT_PARAMS);
  if (!st_fs_exists(path)) {
    free(path);
    path = NULL;
    DIR* d = opendir(dir);
    struct dirent* e;
    while (d && !path && (e = readdir(d)) != NULL) {
      size_t n = strlen(e->d_name);
      if (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")) path = st_path_join(dir, e->d_name);
    }
    if (d) closedir(d);
  }
  if (!path) return st_status_make(ST_CODE_CKPT, "%s: no tensor file to corrupt", dir);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct stat st;
  st_status s = ST_OK;
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < 16) {
    s = st_status_make(ST_CODE_CKPT, "%s: cannot open for corruption: %s", path, strerror(errno));
  } else {
    /* Three quarters in: tensor data, well past the header. */
    off_t at = st.st_size - st.st_size / 4;
    unsigned char b = 0;
    if (pread(fd, &b, 1, at) != 1) {
      s = st_status_make(ST_CODE_CKPT, "%s: read failed: %s", path, strerror(errno));
    } else {
      b ^= 0x40;
      if (pwrite(fd, &b, 1, at) != 1 || fsync(fd) != 0) s = st_status_make(ST_CODE_CKPT, "%s: write failed: %s", path, strerror(errno));
    }
  }
  if (fd >= 0) close(fd);
  if (!s && out_file) {
    *out_file = path;
  } else {
    free(path);
  }
  return s;
}

st_status st_faults_ckpt_hook(void* user, st_ckpt_point point, const char* path) {
  st_faults* f = user;
  if (point == ST_CKPT_AT_BEGIN) {
    f->save_of_current = atomic_fetch_add(&f->saves, 1) + 1;
    return ST_OK;
  }
  int64_t n = f->save_of_current;
  if (point == ST_CKPT_AT_FILE_MIDDLE) {
    if (f->at[F_CRASH_SAVE] && n == f->at[F_CRASH_SAVE]) {
      char d[4200];
      snprintf(d, sizeof(d), "SIGKILL halfway through writing %s", path);
      st__fire(f, F_CRASH_SAVE, n, d);
      st__die();
    }
    if (f->at[F_HANG_SAVE] && n == f->at[F_HANG_SAVE]) {
      char d[4200];
      snprintf(d, sizeof(d), "the save stops halfway through writing %s (sleeps forever)", path);
      st__fire(f, F_HANG_SAVE, n, d);
      /* Nothing ends this but the process: a second stop signal (its
       * default action) or SIGKILL. The drill for "a second signal during
       * the stop's checkpoint aborts at once". */
      for (;;) pause();
    }
    if (f->at[F_IO_ERROR] && n == f->at[F_IO_ERROR]) {
      char d[4200];
      snprintf(d, sizeof(d), "write of %s fails with %s", path, strerror(f->io_errno));
      st__fire(f, F_IO_ERROR, n, d);
      return st_status_make(ST_CODE_CKPT, "writing '%s' failed: %s (injected by faults.io_error_at_save=%lld)", path, strerror(f->io_errno),
                            (long long)n);
    }
  }
  if (point == ST_CKPT_AT_COMMITTED && f->at[F_CORRUPT] && n == f->at[F_CORRUPT]) {
    char* file = NULL;
    st_status s = st_faults_corrupt_checkpoint(path, &file);
    char d[4200];
    snprintf(d, sizeof(d), "flipped one byte of %s", file ? file : path);
    if (!s) st__fire(f, F_CORRUPT, n, d);
    free(file);
    st_status_free(s);
  }
  return ST_OK;
}
