/* python.c — running a strata_jax module in a child process.
 *
 * strata calls Python only at preparation time (the exporter, the BPE
 * tokenizer), never while training. Both callers need the same things: the
 * interpreter of st_python_path, the source tree's python/ first on
 * PYTHONPATH (so a checkout's strata_jax wins over an installed one), the
 * child's output in a log beside what it writes, and a failure that names
 * the command, its exit and the log's last lines. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "strata/base.h"

static char* st__log_tail(const char* path, size_t max) {
  char* data = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &data, &size);
  if (s) {
    st_status_free(s);
    return st_xstrdup("");
  }
  if (size > max) memmove(data, data + size - max, max + 1);
  return data;
}

/* Waits for |pid|. With |stop|, polls it every 20 ms; once it names a
 * signal the child gets SIGTERM (then SIGKILL after 5 s) and the signal is
 * returned; 0 when the child ended on its own. */
static int st__python_wait(pid_t pid, int (*stop)(void), int* status) {
  if (!stop) {
    while (waitpid(pid, status, 0) < 0 && errno == EINTR) {
    }
    return 0;
  }
  int sig = 0;
  double killed_at = 0;
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return sig;
    if (!sig && (sig = stop()) != 0) {
      kill(pid, SIGTERM);
      killed_at = st_now();
    } else if (sig && killed_at > 0 && st_now() - killed_at > 5.0) {
      kill(pid, SIGKILL);
      killed_at = -1;
    }
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

st_status st_python_run(const st_python_job* job) {
  char* python = st_python_path();
  size_t nargs = 0;
  while (job->args && job->args[nargs]) ++nargs;
  const char** argv = st_xcalloc(nargs + 4, sizeof(char*));
  argv[0] = python;
  argv[1] = "-m";
  argv[2] = job->module;
  for (size_t i = 0; i < nargs; ++i) argv[3 + i] = job->args[i];
  /* The child's stdout goes to the log: nothing of ours may be flushed twice. */
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    free(argv);
    free(python);
    return st_status_make(job->code, "%s: cannot fork %s: %s", job->what, job->module, strerror(e));
  }
  if (pid == 0) {
    FILE* f = freopen(job->log_path, "w", stdout);
    if (f) dup2(fileno(stdout), 2);
    const char* old = getenv("PYTHONPATH");
    st_strbuf pp = {0};
    st_strbuf_append(&pp, st_source_dir());
    st_strbuf_append(&pp, "/python");
    if (old && old[0]) st_strbuf_printf(&pp, ":%s", old);
    setenv("PYTHONPATH", pp.data, 1);
    if (job->jax_platforms) setenv("JAX_PLATFORMS", job->jax_platforms, 1);
    /* execvp: STRATA_PYTHON may be a bare name such as python3, found on PATH. */
    execvp(python, (char* const*)argv);
    fprintf(stderr, "cannot execute '%s': %s\n", python, strerror(errno));
    _exit(127);
  }
  free(argv);
  int status = 0;
  int stopped = st__python_wait(pid, job->stop_signal, &status);
  st_status s = ST_OK;
  if (stopped) {
    s = st_status_make(ST_CODE_INTERRUPTED, "%s: stopped by signal %d (%s), which ended the child %s -m %s (log %s)",
                       job->what, stopped, strsignal(stopped), python, job->module, job->log_path);
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    char* tail = st__log_tail(job->log_path, 1500);
    bool two = WIFEXITED(status) && WEXITSTATUS(status) == 2;
    s = st_status_make(two && job->code_on_exit2 ? job->code_on_exit2 : job->code,
                       "%s failed (%s -m %s, %s %d; log %s). Run `make setup` if the venv is missing. Last output:\n%s",
                       job->what, python, job->module, WIFEXITED(status) ? "exit" : "signal",
                       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), job->log_path, tail);
    free(tail);
  }
  free(python);
  return s;
}
