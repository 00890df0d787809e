/* signals.c — a graceful stop on SIGTERM, SIGINT and SIGHUP, and in a job
 * of several processes SIGUSR1 too (strata/diag.h, docs/checkpoints.md
 * "Stopping a run", docs/multiprocess.md "Failures").
 *
 * The handler does the one thing a handler may safely do: it records the
 * signal number in a volatile sig_atomic_t. That flag is the only
 * process-wide state here, and it has to be: a handler gets no user
 * pointer. Everything else (the dispositions to restore) is owned by the
 * caller's st_stop_guard. The trainer polls the flag between steps. */
#include <signal.h>
#include <string.h>

#include "strata/diag.h"

static volatile sig_atomic_t g_stop_signal = 0;

static const int kStopSignals[3] = {SIGTERM, SIGINT, SIGHUP};
/* SIGUSR1 is a stop signal too (st_stop_signals_add_usr1): the default
 * reset must then cover it. Process-wide like the flag, and for the same
 * reason: st_stop_signals_default is called where no guard is at hand. */
static volatile sig_atomic_t g_usr1 = 0;

static void st__on_stop(int sig) {
  if (!g_stop_signal) g_stop_signal = sig;
}

void st_stop_signals_install(st_stop_guard* guard) {
  memset(guard, 0, sizeof(*guard));
  g_stop_signal = 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = st__on_stop;
  sigemptyset(&sa.sa_mask);
  /* SA_RESETHAND: the same signal again takes its default action (the
   * process ends at once); SA_RESTART: the step's blocking calls go on. */
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  for (int i = 0; i < 3; ++i) sigaction(kStopSignals[i], &sa, &guard->old[i]);
  guard->installed = true;
}

int st_stop_signal(void) { return (int)g_stop_signal; }

void st_stop_signals_default(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kStopSignals[i], &sa, NULL);
  if (g_usr1) sigaction(SIGUSR1, &sa, NULL);
}

void st_stop_signals_add_usr1(st_stop_guard* guard) {
  if (!guard->installed || guard->usr1) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = st__on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGUSR1, &sa, &guard->old_usr1);
  guard->usr1 = true;
  g_usr1 = 1;
}

void st_stop_signals_restore(st_stop_guard* guard) {
  if (!guard->installed) return;
  for (int i = 0; i < 3; ++i) sigaction(kStopSignals[i], &guard->old[i], NULL);
  if (guard->usr1) sigaction(SIGUSR1, &guard->old_usr1, NULL);
  guard->usr1 = false;
  g_usr1 = 0;
  guard->installed = false;
}

const char* st_signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}
