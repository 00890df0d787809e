/* signals.c — a graceful stop on SIGTERM, SIGINT and SIGHUP (strata/diag.h,
 * docs/checkpoints.md "Stopping a run").
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
}

void st_stop_signals_restore(st_stop_guard* guard) {
  if (!guard->installed) return;
  for (int i = 0; i < 3; ++i) sigaction(kStopSignals[i], &guard->old[i], NULL);
  guard->installed = false;
}

const char* st_signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}
