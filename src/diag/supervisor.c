/* supervisor.c — `strata run`: the trainer as a child process, restarted
 * on crashes and hangs, every incident measured (docs/checkpoints.md,
 * "Recovery metrics").
 *
 * The supervisor never touches training state. It learns what a child did
 * from the run directory the child writes anyway: metrics.jsonl (the last
 * step recorded before a crash) and events.jsonl (`resumed` with the step
 * and restore time, `first_step` when the restarted child has made
 * progress). That keeps it correct for any child, including one killed by
 * SIGKILL in the middle of a line write — the run log writes whole lines. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/diag.h"
#include "strata/obs.h"

static volatile sig_atomic_t g_stop_signal = 0;
static volatile sig_atomic_t g_child = 0;
/* A launcher child (mpirun) gets every stop signal as SIGUSR1, which it
 * forwards to the ranks; 0: the signal itself. */
static volatile sig_atomic_t g_forward_as = 0;

static void st__on_signal(int sig) {
  g_stop_signal = sig;
  if (g_child > 0) kill((pid_t)g_child, g_forward_as ? g_forward_as : sig);
}

static double st__supervisor_wall(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

static void st__sleep(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  nanosleep(&ts, NULL); /* a signal cuts it short, which is what stopping wants */
}

static double st__mtime(const char* path) {
  struct stat st;
  if (stat(path, &st) != 0) return 0;
  return (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec;
}

static long st__size(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

typedef struct {
  int n;
  int attempt; /* the attempt that failed */
  char cause[160];
  int exit_code, signal;
  double last_alive, detected_at, restarted_at, resumed_at, recovered_at;
  double backoff_s, restore_s;
  int64_t last_step, from_step;
  bool restarted, resumed, recovered;
  /* Exit 6: the trainer's watchdog bundle and the op it named ("": none). */
  char hang_dir[512];
  char hang_op[320];
} st__incident;

typedef struct {
  const st_supervisor_request* req;
  char* dir;
  char* events_path;
  char* metrics_path;
  int64_t max_restarts;
  double backoff_s, backoff_max_s, hang_timeout_s;
  double t_start;
  int restarts, attempts;
  st__incident* inc;
  int inc_count;
  long tail_offset; /* events.jsonl bytes already read */
  const char* outcome;
  int exit_code;
  int lock_fd; /* the run directory's lock, handed down to every child */
  /* The current child's last "hang" event (its watchdog fired): the
   * bundle and the op, for the incident of its exit 6. */
  char hang_dir[512];
  char hang_op[320];
  /* The current child's "failed" event's class ("": none yet), which says
   * more than its exit code: exit 4 "memory" is not restarted. */
  char failed_class[32];
} st__sup;

/*===-------------------------------------------------------------------===*/
/* Run directory reading                                                    */
/*===-------------------------------------------------------------------===*/

/* The step of the last metrics line with a loss: the last step the
 * crashed child recorded. */
static int64_t st__last_recorded_step(const st__sup* S) {
  /* The tail is enough: the last step line is near the end (eval and
   * checkpoint lines come between step lines, never many). */
  FILE* f = fopen(S->metrics_path, "rb");
  if (!f) return -1;
  long size = st__size(S->metrics_path);
  long from = size > (1 << 20) ? size - (1 << 20) : 0;
  char* text = st_xmalloc((size_t)(size - from) + 1);
  size_t got = fseek(f, from, SEEK_SET) == 0 ? fread(text, 1, (size_t)(size - from), f) : 0;
  fclose(f);
  text[got] = '\0';
  int64_t step = -1;
  char* line = text;
  if (from > 0) { /* skip the partial first line */
    char* nl = strchr(line, '\n');
    line = nl ? nl + 1 : NULL;
  }
  while (line && *line) {
    char* nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    if (strstr(line, "\"loss\"")) {
      json_t* j = NULL;
      st_status r = st_json_parse(line, strlen(line), "metrics.jsonl", &j);
      int64_t v = 0;
      if (!r && json_object_get(j, "loss") && !(r = st_json_get_int(j, "step", "metrics.jsonl", &v))) step = v;
      st_status_free(r);
      json_decref(j);
    }
    line = nl ? nl + 1 : NULL;
  }
  free(text);
  return step;
}

static void st__write_summary(st__sup* S);

/* events.jsonl lines in the run log's format. Not st_runlog: opening one
 * creates metrics.jsonl, and a run directory with metrics.jsonl is one the
 * first child would refuse. One write(2) per line, O_APPEND: whole lines
 * even while a child appends too. */
static void st__supervisor_event(st__sup* S, const char* name, json_t* fields /* stolen; may be NULL */) {
  json_t* e = st_json_obj();
  st_json_put(e, "time", st_json_fixed(st__supervisor_wall(), 3));
  st_json_put_str(e, "event", name);
  st_json_merge(e, fields);
  char* text = st_json_dump(e, 0);
  json_decref(e);
  st_strbuf b = {0};
  st_strbuf_append(&b, text);
  st_strbuf_append(&b, "\n");
  free(text);
  int fd = open(S->events_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, b.data, b.len) != (ssize_t)b.len)
    fprintf(stderr, "strata run: cannot append to %s: %s\n", S->events_path, strerror(errno));
  if (fd >= 0) close(fd);
  st_strbuf_free(&b);
}

static json_t* st__incident_json(const st__incident* I) {
  json_t* j = st_json_obj();
  st_json_put_int(j, "incident", I->n);
  st_json_put_int(j, "attempt", I->attempt);
  st_json_put_str(j, "cause", I->cause);
  if (I->hang_dir[0]) {
    st_json_put_str(j, "hang_bundle", I->hang_dir);
    st_json_put_str(j, "hang_op", I->hang_op);
  }
  st_json_put_int(j, "exit_code", I->exit_code);
  st_json_put_int(j, "signal", I->signal);
  st_json_put_int(j, "last_step", I->last_step);
  st_json_put(j, "last_alive", st_json_fixed(I->last_alive, 3));
  st_json_put(j, "detected_at", st_json_fixed(I->detected_at, 3));
  st_json_put(j, "detection_s", st_json_fixed(I->detected_at - I->last_alive, 3));
  if (I->restarted) {
    st_json_put(j, "backoff_s", st_json_fixed(I->backoff_s, 3));
    st_json_put(j, "restarted_at", st_json_fixed(I->restarted_at, 3));
    st_json_put(j, "restart_s", st_json_fixed(I->restarted_at - I->detected_at, 3));
  }
  if (I->resumed) {
    st_json_put_int(j, "from_step", I->from_step);
    st_json_put_int(j, "steps_lost", I->last_step > I->from_step ? I->last_step - I->from_step : 0);
    st_json_put(j, "startup_s", st_json_fixed(I->resumed_at - I->restarted_at, 3));
    st_json_put(j, "restore_s", st_json_fixed(I->restore_s, 6));
    st_json_put(j, "resumed_at", st_json_fixed(I->resumed_at, 3));
  }
  if (I->recovered) {
    st_json_put(j, "recovered_at", st_json_fixed(I->recovered_at, 3));
    st_json_put(j, "rto_s", st_json_fixed(I->recovered_at - I->detected_at, 3));
    st_json_put(j, "ttr_s", st_json_fixed(I->recovered_at - I->last_alive, 3));
  }
  st_json_put_bool(j, "recovered", I->recovered);
  return j;
}

/* New complete lines of events.jsonl since the last call: completes the
 * open incident with the restarted child's `resumed` and `first_step`. */
static void st__tail_events(st__sup* S) {
  long size = st__size(S->events_path);
  if (size <= S->tail_offset) return;
  FILE* f = fopen(S->events_path, "rb");
  if (!f) return;
  if (fseek(f, S->tail_offset, SEEK_SET) != 0) {
    fclose(f);
    return;
  }
  size_t want = (size_t)(size - S->tail_offset);
  char* buf = st_xmalloc(want + 1);
  size_t got = fread(buf, 1, want, f);
  fclose(f);
  buf[got] = '\0';
  char* line = buf;
  for (;;) {
    char* nl = strchr(line, '\n');
    if (!nl) break; /* a partial line: read it next time */
    *nl = '\0';
    S->tail_offset += (long)(nl - line) + 1;
    if (strstr(line, "\"event\": \"hang\"")) {
      json_t* j = NULL;
      st_status r = st_json_parse(line, strlen(line), S->events_path, &j);
      const char* dir = json_string_value(json_object_get(j, "dir"));
      const char* op = json_string_value(json_object_get(j, "summary"));
      if (!r && dir) {
        snprintf(S->hang_dir, sizeof(S->hang_dir), "%s", dir);
        snprintf(S->hang_op, sizeof(S->hang_op), "%s", op ? op : "");
      }
      st_status_free(r);
      json_decref(j);
    }
    if (strstr(line, "\"event\": \"failed\"")) {
      json_t* j = NULL;
      st_status r = st_json_parse(line, strlen(line), S->events_path, &j);
      const char* cls = r ? NULL : json_string_value(json_object_get(j, "class"));
      snprintf(S->failed_class, sizeof(S->failed_class), "%s", cls ? cls : "");
      st_status_free(r);
      json_decref(j);
    }
    st__incident* I = S->inc_count ? &S->inc[S->inc_count - 1] : NULL;
    if (I && I->restarted && !I->recovered && (strstr(line, "\"resumed\"") || strstr(line, "\"first_step\""))) {
      json_t* j = NULL;
      st_status r = st_json_parse(line, strlen(line), S->events_path, &j);
      const char* ev = json_string_value(json_object_get(j, "event")); /* NULL unless a string */
      const json_t* t = json_object_get(j, "time");
      double when = json_is_number(t) ? json_number_value(t) : st__supervisor_wall();
      if (ev && !strcmp(ev, "resumed")) {
        int64_t from = 0;
        st_status_free(st_json_get_int(j, "from_step", "", &from));
        const json_t* rs = json_object_get(j, "restore_s");
        I->from_step = from;
        I->restore_s = json_is_number(rs) ? json_number_value(rs) : 0;
        I->resumed_at = when;
        I->resumed = true;
      } else if (ev && !strcmp(ev, "first_step")) {
        I->recovered_at = when;
        I->recovered = true;
        st__supervisor_event(S, "recovered", st__incident_json(I));
        const long long lost = (long long)(I->last_step > I->from_step ? I->last_step - I->from_step : 0);
        fprintf(stderr, "strata run: recovered from incident %d: resumed at step %lld, %lld step%s lost, first good step %.2f s after detection\n",
                I->n, (long long)I->from_step, lost, lost == 1 ? "" : "s", I->recovered_at - I->detected_at);
        st__write_summary(S);
      }
      st_status_free(r);
      json_decref(j);
    }
    line = nl + 1;
  }
  free(buf);
}

/*===-------------------------------------------------------------------===*/
/* recovery.json                                                            */
/*===-------------------------------------------------------------------===*/

static void st__write_summary(st__sup* S) {
  double sum_ttr = 0, sum_det = 0, sum_restore = 0, sum_rto = 0;
  int n_rec = 0, n_res = 0;
  int64_t max_lost = 0, total_lost = 0;
  for (int i = 0; i < S->inc_count; ++i) {
    const st__incident* I = &S->inc[i];
    sum_det += I->detected_at - I->last_alive;
    if (I->resumed) {
      int64_t lost = I->last_step > I->from_step ? I->last_step - I->from_step : 0;
      total_lost += lost;
      if (lost > max_lost) max_lost = lost;
      sum_restore += I->restore_s;
      ++n_res;
    }
    if (I->recovered) {
      sum_ttr += I->recovered_at - I->last_alive;
      sum_rto += I->recovered_at - I->detected_at;
      ++n_rec;
    }
  }
  json_t* j = st_json_obj();
  st_json_put_str(j, "run_dir", S->dir);
  st_json_put_str(j, "outcome", S->outcome);
  st_json_put_int(j, "exit_code", S->exit_code);
  st_json_put_int(j, "attempts", S->attempts);
  st_json_put_int(j, "restarts", S->restarts);
  st_json_put_int(j, "max_restarts", S->max_restarts);
  st_json_put_int(j, "incidents_total", S->inc_count);
  st_json_put_int(j, "recovered", n_rec);
  st_json_put_num(j, "mttr_s", n_rec ? sum_ttr / n_rec : NAN);
  st_json_put_num(j, "mean_detection_s", S->inc_count ? sum_det / S->inc_count : NAN);
  st_json_put_num(j, "mean_restore_s", n_res ? sum_restore / n_res : NAN);
  st_json_put_num(j, "mean_rto_s", n_rec ? sum_rto / n_rec : NAN);
  st_json_put_int(j, "max_steps_lost", max_lost);
  st_json_put_int(j, "total_steps_lost", total_lost);
  st_json_put(j, "wall_s", st_json_fixed(st__supervisor_wall() - S->t_start, 3));
  json_t* incidents = st_json_arr();
  for (int i = 0; i < S->inc_count; ++i) st_json_push(incidents, st__incident_json(&S->inc[i]));
  st_json_put(j, "incidents", incidents);
  char* path = st_rundir_path(S->dir, ST_RUNDIR_RECOVERY);
  st_status s = st_json_write_file(path, j, 2);
  if (s) fprintf(stderr, "strata run: cannot write %s: %s\n", path, st_status_message(s));
  st_status_free(s);
  free(path);
  json_decref(j);
}

/*===-------------------------------------------------------------------===*/
/* Children                                                                 */
/*===-------------------------------------------------------------------===*/

/* Forks and execs the child; *out stays 0 when a stop signal came first.
 * The stop signals are blocked from before the fork until g_child is set,
 * so each one reaches the child exactly once (the handler forwards it)
 * or stops the supervisor before it spawns. */
static st_status st__spawn(char* const* argv, int lock_fd, pid_t* out) {
  *out = 0;
  fflush(stdout);
  fflush(stderr);
  sigset_t stops, old;
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGHUP);
  sigprocmask(SIG_BLOCK, &stops, &old);
  if (g_stop_signal) {
    sigprocmask(SIG_SETMASK, &old, NULL);
    return ST_OK;
  }
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    return st_status_make(ST_CODE_IO, "strata run: fork failed: %s", strerror(err));
  }
  if (pid == 0) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    /* A process group of its own: a terminal's Ctrl-C (sent to the whole
     * foreground group) then reaches the supervisor alone, which forwards
     * it once. Twice would abort the child's stop checkpoint. */
    setpgid(0, 0);
    sigprocmask(SIG_SETMASK, &old, NULL);
    st_fs_lock_hand_down(lock_fd);
    execvp(argv[0], argv); /* the launcher from PATH; the binary is an absolute path */
    fprintf(stderr, "strata run: cannot execute %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  g_child = pid;
  sigprocmask(SIG_SETMASK, &old, NULL);
  *out = pid;
  return ST_OK;
}

/* Waits for the child while tailing the run log and watching for a hang.
 * Returns the wait status; *out_hung when the supervisor killed it. */
static int st__wait_child(st__sup* S, pid_t pid, double spawned_at, bool* out_hung) {
  *out_hung = false;
  int status = 0;
  double hung_at = 0; /* a launcher asked to end, not yet SIGKILLed */
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    st__tail_events(S);
    if (S->hang_timeout_s > 0 && !*out_hung) {
      double alive = fmax(spawned_at, fmax(st__mtime(S->events_path), st__mtime(S->metrics_path)));
      if (st__supervisor_wall() - alive > S->hang_timeout_s) {
        fprintf(stderr, "strata run: no event or metrics line for %.1f s (recovery.hang_timeout_s); killing pid %ld as hung\n",
                st__supervisor_wall() - alive, (long)pid);
        /* A launcher is asked first: killed outright, mpirun would leave
         * its ranks behind (each has a process group of its own). */
        kill(pid, S->req->launcher_count ? SIGTERM : SIGKILL);
        *out_hung = true;
        hung_at = st__supervisor_wall();
      }
    } else if (*out_hung && hung_at > 0 && st__supervisor_wall() - hung_at > 10.0) {
      kill(pid, SIGKILL);
      hung_at = 0;
    }
    st__sleep(0.01);
  }
  st__tail_events(S);
  return status;
}

/* The run directory made ready for a supervised run, before any event:
 * refused when it holds a run and this is no resume, created, locked for
 * the supervisor's whole life, its events.jsonl's torn tail cut. A phase
 * of its own because every failure here ends the supervisor before it
 * installs handlers or writes anything. */
static st_status st__open_run_dir(st__sup* S) {
  /* The supervisor holds the run directory's lock across restarts (each
   * child inherits it), so nothing else can slip in between two attempts,
   * and a second supervisor is refused before it writes an event. */
  st_rundir_claim_options claim = {.resume = S->req->resume, .supervisor = true};
  st_status s = st_rundir_claim(S->dir, &claim, &S->lock_fd, NULL);
  /* The child cuts a torn last line before it appends; the supervisor
   * appends to events.jsonl first, so it does the same there. */
  long cut = 0;
  if (!s) s = st_runlog_repair_tail(S->events_path, &cut);
  if (!s && cut) fprintf(stderr, "strata run: %s ended in a torn line (%ld bytes); cut it before appending\n", S->events_path, cut);
  return s;
}

/* The next attempt's argv (NULL-terminated; the strings borrowed from
 * |req| and |dir_arg|) and, in |cmd|, the same as a shell line for the
 * event and the console. Apart from the spawn so the choice between a
 * fresh train and a resume reads on its own. */
static char** st__attempt_argv(const st__sup* S, char* dir_arg, st_strbuf* cmd) {
  const st_supervisor_request* req = S->req;
  /* First attempt: the user's command. Later ones resume from the
   * snapshot config.yaml the first one wrote (if it got that far). */
  char* config_yaml = st_rundir_path(S->dir, ST_RUNDIR_CONFIG);
  bool have_snapshot = st_fs_exists(config_yaml);
  free(config_yaml);
  int argc = 0;
  char** argv = st_xcalloc((size_t)req->override_count + (size_t)req->launcher_count + 8, sizeof(char*));
  /* A job: the launcher starts every rank; each attempt is `train` (the
   * resume of one process reads config.yaml alone, without the launcher's
   * process count), later ones with run.resume=true. */
  for (int i = 0; i < req->launcher_count; ++i) argv[argc++] = req->launcher[i];
  argv[argc++] = (char*)req->exe;
  if (S->attempts > 0 && have_snapshot && req->launcher_count == 0) {
    argv[argc++] = "resume";
    argv[argc++] = S->dir;
  } else {
    argv[argc++] = "train";
    argv[argc++] = (char*)req->config_path;
    /* The run directory is the supervisor's (same value, made explicit). */
    for (int i = 0; i < req->override_count; ++i)
      if (strncmp(req->overrides[i], "run.dir=", 8)) argv[argc++] = req->overrides[i];
    argv[argc++] = dir_arg;
    if (S->attempts > 0) argv[argc++] = "run.resume=true";
  }
  argv[argc] = NULL;
  /* The command as the user reads it: "strata train ..." for one process,
   * the launcher's words then the binary for a job. */
  for (int i = req->launcher_count ? 0 : 1; i < argc; ++i) {
    if (i > (req->launcher_count ? 0 : 1)) st_strbuf_append(cmd, " ");
    st_strbuf_append_shell(cmd, argv[i]);
  }
  return argv;
}

/* Starts one attempt and records it (child_start or restart, the open
 * incident marked restarted). *out_pid is 0, and the outcome
 * "interrupted", when a stop signal came before the spawn. */
static st_status st__start_attempt(st__sup* S, char* dir_arg, pid_t* out_pid, double* out_spawned_at) {
  st_strbuf cmd = {0};
  char** argv = st__attempt_argv(S, dir_arg, &cmd);
  pid_t pid = 0;
  S->tail_offset = st__size(S->events_path);
  S->hang_dir[0] = S->hang_op[0] = S->failed_class[0] = '\0';
  st_status s = st__spawn(argv, S->lock_fd, &pid);
  free(argv);
  *out_pid = pid;
  if (s || !pid) {
    if (!s) S->outcome = "interrupted"; /* a stop signal before the spawn */
    st_strbuf_free(&cmd);
    return s;
  }
  double spawned_at = st__supervisor_wall();
  *out_spawned_at = spawned_at;
  S->attempts++;
  if (S->inc_count && !S->inc[S->inc_count - 1].restarted) {
    st__incident* I = &S->inc[S->inc_count - 1];
    I->restarted = true;
    I->restarted_at = spawned_at;
  }
  {
    json_t* e = st_json_obj();
    st_json_put_int(e, "attempt", S->attempts);
    st_json_put_int(e, "pid", (int64_t)pid);
    st_json_put_str(e, "command", cmd.data);
    st__supervisor_event(S, S->attempts == 1 ? "child_start" : "restart", e);
  }
  fprintf(stderr, "strata run: attempt %d: %s%s (pid %ld)\n", S->attempts, S->req->launcher_count ? "" : "strata ", cmd.data,
          (long)pid);
  st_strbuf_free(&cmd);
  return ST_OK;
}

/* The ends of an attempt that stop the supervisor without an incident:
 * success, a stop signal to the supervisor, a planned stop of the child
 * (exit 8), a failure a restart would repeat. Returns true when the
 * supervisor stops (S->outcome set); false: an incident follows. Apart
 * from the incident so the restart policy reads as one list. */
static bool st__stops_without_incident(st__sup* S, int code, double detected_at) {
  /* A restarted child that finished without running a step (the crash
   * came after the last step) has still recovered. */
  if (code == 0 && S->inc_count && !S->inc[S->inc_count - 1].recovered && S->inc[S->inc_count - 1].restarted) {
    S->inc[S->inc_count - 1].recovered = true;
    S->inc[S->inc_count - 1].recovered_at = detected_at;
  }
  if (code == 0) {
    S->outcome = "completed";
    S->exit_code = 0;
    return true;
  }
  S->exit_code = code >= 0 ? code : 1;
  if (g_stop_signal) {
    S->outcome = "interrupted";
    json_t* f = st_json_obj();
    st_json_put_int(f, "signal", (int)g_stop_signal);
    st_json_put_int(f, "child_exit_code", code);
    st__supervisor_event(S, "supervisor_interrupted", f);
    fprintf(stderr, "strata run: stopped by signal %d; not restarting\n", (int)g_stop_signal);
    return true;
  }
  if (code == 8) {
    /* The child was stopped by a signal sent to it, not to us (a
     * scheduler, a user): it saved a checkpoint and exited 8. A planned
     * stop, not a crash: no incident, no restart. */
    S->outcome = "interrupted";
    json_t* f = st_json_obj();
    st_json_put_int(f, "exit_code", 8);
    st_json_put_str(f, "reason", "the trainer was stopped by a signal after writing a checkpoint");
    st__supervisor_event(S, "child_interrupted", f);
    char* q = st_shell_quote(S->dir);
    fprintf(stderr, "strata run: the trainer was stopped by a signal (exit 8) after writing a checkpoint; not restarting "
                    "(continue with strata resume %s)\n", q);
    free(q);
    return true;
  }
  /* Exit 4 with the failed event's class "memory": predicted not to fit,
   * or an allocation failed; the same config on the same host asks for
   * the same memory again. Other exit 4s (a plugin crash) are restarted. */
  bool oom = code == 4 && !strcmp(S->failed_class, "memory");
  if (code == 2 || code == 3 || code == 5 || oom) {
    /* Exit 5 (a non-finite loss or gradient norm that diag.on_nonfinite
     * did not absorb) is a numeric fault of the run, not a crash: a
     * restart resumes the same state on the same data and meets it again. */
    const char* what = oom ? st_code_name(ST_CODE_MEMORY) : code == 2 ? "config error" : code == 3 ? "data error" : "non-finite numerics error";
    S->outcome = "not_restartable";
    json_t* f = st_json_obj();
    st_json_put_int(f, "exit_code", code);
    if (oom) st_json_put_str(f, "class", "memory");
    st_json_put_str(f, "reason", oom         ? "memory: the step was predicted not to fit, or an allocation failed; a "
                                               "restart would ask for the same memory and fail the same way"
                                 : code == 2 ? "config error: a restart would fail the same way"
                                 : code == 3 ? "data error: a restart would fail the same way"
                                             : "non-finite numerics (diag.on_nonfinite): a restart would resume the same "
                                               "state and data and fail the same way");
    st__supervisor_event(S, "giving_up", f);
    fprintf(stderr, "strata run: the trainer exited %d (%s); not restarting\n", code, what);
    return true;
  }
  return false;
}

/* Records a crash, a kill or a hang as an incident (event and console)
 * with its backoff. Returns true when max_restarts is reached (outcome
 * "gave_up"). Its own phase: what the recovery report is made of. */
static bool st__record_incident(st__sup* S, int code, int sig, bool hung, double spawned_at, double detected_at) {
  S->inc = st_xrealloc(S->inc, (size_t)(S->inc_count + 1) * sizeof(*S->inc));
  st__incident* I = &S->inc[S->inc_count++];
  memset(I, 0, sizeof(*I));
  I->n = S->inc_count;
  I->attempt = S->attempts;
  I->exit_code = code;
  I->signal = sig;
  if (hung) {
    snprintf(I->cause, sizeof(I->cause), "hang: no progress for %.1f s (recovery.hang_timeout_s), killed", S->hang_timeout_s);
  } else if (sig) {
    snprintf(I->cause, sizeof(I->cause), "killed by signal %d (%s)", sig, strsignal(sig));
  } else if (code == 6) {
    snprintf(I->cause, sizeof(I->cause), "exit 6 (hang detected by the trainer)");
    snprintf(I->hang_dir, sizeof(I->hang_dir), "%s", S->hang_dir);
    snprintf(I->hang_op, sizeof(I->hang_op), "%s", S->hang_op);
  } else if (S->req->launcher_count && code > 128 && code < 128 + 65) {
    snprintf(I->cause, sizeof(I->cause), "exit %d from the launcher: a rank killed by signal %d (%s)", code, code - 128,
             strsignal(code - 128));
  } else {
    snprintf(I->cause, sizeof(I->cause), "exit %d", code);
  }
  I->detected_at = detected_at;
  I->last_alive = fmax(spawned_at, fmax(st__mtime(S->events_path), st__mtime(S->metrics_path)));
  if (I->last_alive > detected_at) I->last_alive = detected_at;
  I->last_step = st__last_recorded_step(S);
  if (I->last_step < 0) I->last_step = 0;
  bool give_up = S->restarts >= S->max_restarts;
  I->backoff_s = give_up ? 0 : fmin(S->backoff_s * pow(2.0, S->restarts), S->backoff_max_s);
  {
    json_t* e = st__incident_json(I);
    st_json_put(e, "backoff_s", st_json_fixed(I->backoff_s, 3));
    st_json_put_bool(e, "will_restart", !give_up);
    st__supervisor_event(S, "incident", e);
  }
  if (I->hang_dir[0]) fprintf(stderr, "strata run: the trainer's watchdog named %s; bundle in %s\n", I->hang_op, I->hang_dir);
  fprintf(stderr, "strata run: incident %d: %s after step %lld; %s\n", I->n, I->cause, (long long)I->last_step,
          give_up ? "max_restarts reached, giving up" : "restarting");
  if (give_up) {
    S->outcome = "gave_up";
    json_t* f = st_json_obj();
    st_json_put_int(f, "restarts", S->restarts);
    st_json_put_int(f, "max_restarts", S->max_restarts);
    st__supervisor_event(S, "giving_up", f);
  }
  return give_up;
}

/* The attempts, until one ends the supervisor: start, wait, classify the
 * end, back off. Returns a spawn failure's status. */
static st_status st__attempts(st__sup* S) {
  char dir_arg[4200];
  snprintf(dir_arg, sizeof(dir_arg), "run.dir=%s", S->dir);
  for (;;) {
    pid_t pid = 0;
    double spawned_at = 0;
    st_status s = st__start_attempt(S, dir_arg, &pid, &spawned_at);
    if (s || !pid) return s;

    bool hung = false;
    int status = st__wait_child(S, pid, spawned_at, &hung);
    g_child = 0;
    double detected_at = st__supervisor_wall();
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (st__stops_without_incident(S, code, detected_at)) return ST_OK;
    if (st__record_incident(S, code, sig, hung, spawned_at, detected_at)) return ST_OK;
    st__write_summary(S);
    st__sleep(S->inc[S->inc_count - 1].backoff_s);
    if (g_stop_signal) {
      S->outcome = "interrupted";
      return ST_OK;
    }
    S->restarts++;
  }
}

st_status st_supervise(const st_supervisor_request* req, int* out_exit_code) {
  *out_exit_code = 1;
  st__sup S;
  memset(&S, 0, sizeof(S));
  S.lock_fd = -1;
  S.req = req;
  S.t_start = st__supervisor_wall();
  S.dir = st_rundir_default(req->run_dir, req->run_id);
  S.events_path = st_rundir_path(S.dir, ST_RUNDIR_EVENTS);
  S.metrics_path = st_rundir_path(S.dir, ST_RUNDIR_METRICS);
  S.max_restarts = req->recovery.max_restarts;
  S.backoff_s = req->recovery.backoff_s;
  S.backoff_max_s = req->recovery.backoff_max_s;
  S.hang_timeout_s = req->recovery.hang_timeout_s;
  S.outcome = "running";
  g_forward_as = req->launcher_count ? SIGUSR1 : 0;
  st_status s = st__open_run_dir(&S);
  if (s) goto done;
  S.tail_offset = st__size(S.events_path);

  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = st__on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int, old_term, old_hup;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);

  {
    json_t* f = st_json_obj();
    st_json_put_int(f, "pid", (int64_t)getpid());
    st_json_put_int(f, "max_restarts", S.max_restarts);
    st_json_put(f, "backoff_s", st_json_fixed(S.backoff_s, 3));
    st_json_put(f, "backoff_max_s", st_json_fixed(S.backoff_max_s, 3));
    st_json_put(f, "hang_timeout_s", st_json_fixed(S.hang_timeout_s, 3));
    if (req->launcher_count) {
      st_strbuf b = {0};
      for (int i = 0; i < req->launcher_count; ++i) {
        if (i) st_strbuf_append(&b, " ");
        st_strbuf_append_shell(&b, req->launcher[i]);
      }
      st_json_put_str(f, "launcher", b.data);
      st_strbuf_free(&b);
    }
    st__supervisor_event(&S, "supervisor_start", f);
  }
  s = st__attempts(&S);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGHUP, &old_hup, NULL);
  {
    json_t* e = st_json_obj();
    st_json_put_str(e, "outcome", S.outcome);
    st_json_put_int(e, "exit_code", S.exit_code);
    st_json_put_int(e, "attempts", S.attempts);
    st_json_put_int(e, "restarts", S.restarts);
    st__supervisor_event(&S, "supervisor_done", e);
  }
  st__write_summary(&S);
  if (!s) *out_exit_code = S.exit_code;
done:
  if (S.lock_fd >= 0) close(S.lock_fd);
  free(S.inc);
  free(S.dir);
  free(S.events_path);
  free(S.metrics_path);
  return s;
}
