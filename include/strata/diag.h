/*
 * strata/diag.h — diagnostics: fault injection for recovery drills, and the
 * supervisor that turns crashes into restarts (docs/checkpoints.md).
 *
 * Fault injection (config faults.*, all off by default) makes the failure
 * paths testable on purpose: crash at a step, crash in the middle of a
 * checkpoint write, corrupt the newest checkpoint, fail a save with ENOSPC
 * or EIO, stop making progress (in a step or in a save). Armed faults are announced loudly (stderr
 * and events.jsonl); each one fires once per run directory — it is recorded
 * durably in <run>/diag/faults.fired before it acts, and a resumed attempt
 * disarms it — unless faults.repeat is true.
 */
#ifndef STRATA_DIAG_H
#define STRATA_DIAG_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/dist.h"
#include "strata/ckpt.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/*===-------------------------------------------------------------------===*/
/* Fault injection                                                          */
/*===-------------------------------------------------------------------===*/

typedef struct st_faults st_faults;
typedef struct st_runlog st_runlog; /* strata/obs.h */

/* faults.* (docs/config.md); 0 = off. The typed options (plan/options.c)
 * fill it from the config. */
typedef struct st_faults_options {
  int64_t crash_at_step, crash_in_save, corrupt_latest, io_error_at_save, hang_at_step, hang_in_save;
  int io_errno; /* faults.io_error: ENOSPC or EIO */
  bool repeat;
  const char* hang_in; /* faults.hang_in: "PROGRAM" or "PROGRAM:STEP"; NULL or "": off (borrowed) */
  /* faults.nan_at=STEP:LAYER[:TENSOR] and faults.nan_micro: 0 = off. */
  int64_t nan_at_step;
  int nan_layer, nan_micro;
  char nan_tensor[64]; /* "" = the forward's first output */
  int nan_value;       /* faults.nan_value: 0 NaN, 1 +inf, 2 the largest finite f32 */
  int wrong_kernel;    /* faults.wrong_kernel: 0 off, ST_FAULT_WRONG_ATTENTION */
  /* faults.slow_program=PROGRAM:FRACTION: "" = off. */
  char slow_program[128];
  double slow_fraction;
} st_faults_options;

/* faults.wrong_kernel=attention (test-only): the ffi attention kernel's
 * output is scaled by 1 + 2^-10 (st_kernels_set_wrong, strata compare's
 * tests). */
#define ST_FAULT_WRONG_ATTENTION 1

/* Arms the faults of |options|. Faults already recorded in
 * <run_dir>/diag/faults.fired are disarmed (unless options->repeat). */
st_status st_faults_create(const st_faults_options* options, const char* run_dir, st_faults** out /* owned by caller */);
void st_faults_destroy(st_faults* faults); /* NULL is a no-op */

/* "crash_at_step=37, io_error_at_save=2 (ENOSPC)"; "" when nothing is armed.
 * Owned by |faults|. */
const char* st_faults_armed(const st_faults* faults);
/* Faults configured but disarmed because they fired in an earlier attempt
 * ("crash_at_step=37"); "" when none. Owned by |faults|. */
const char* st_faults_disarmed(const st_faults* faults);

/* Where firing faults are announced besides stderr (may be NULL; borrowed). */
void st_faults_set_log(st_faults* faults, st_runlog* log);

/* Called by the trainer after step |step| (1-based) ran on the device and
 * before it is recorded: crash_at_step kills the process here (SIGKILL,
 * nothing flushed beyond what is already durable), hang_at_step stops
 * here forever. Returns normally otherwise. */
void st_faults_at_step(st_faults* faults, int64_t step);
/* Whether st_faults_at_step will crash or hang at |step|. The trainer lets
 * an in-flight checkpoint write finish first, so a step fault's outcome
 * (which checkpoint the next attempt resumes from) does not depend on disk
 * speed; crashes at random moments are what the kill drill is for. */
bool st_faults_fire_at_step(const st_faults* faults, int64_t step);

/* faults.hang_in: called right before a launch of |program| is issued
 * (layer, microbatch, device for the announcement); when it is the armed
 * program (and step |step|, 1-based, when the fault names one) the calling
 * thread stops there, inside the launch, until a stop signal (the hang
 * watchdog or the supervisor ends the process first). Fires once. */
void st_faults_in_launch(st_faults* faults, const char* program, int64_t step, int layer, int micro, int device);
/* The program faults.hang_in names while armed; NULL otherwise (borrowed). */
const char* st_faults_hang_in_program(const st_faults* faults);
/* faults.nan_at: whether the forward launch of layer |layer|, microbatch
 * |micro| in step |step| (1-based) is to be poisoned; when so, records the
 * fault as fired (diag/faults.fired, stderr, the fault_injected event) and
 * disarms it (unless faults.repeat), and gives the output name to poison
 * ("" = the first output) in *out_tensor (owned by |faults|). */
bool st_faults_nan_fire(st_faults* faults, int64_t step, int layer, int micro, const char** out_tensor);

/* Whether every drill armed in this process can fire in a run that
 * executes steps |first_step|..|last_step| (1-based: a resume starts after
 * its checkpoint) and begins at most |max_saves| checkpoint saves
 * (|saves_why| says how that bound was counted, for the message): a
 * CONFIG status (exit 2) naming the key, its value and why, so a drill is
 * never armed and silent. */
st_status st_faults_check_run(const st_faults* faults, int64_t first_step, int64_t last_step, int64_t max_saves,
                              const char* saves_why);
/* Whether any drill is armed in this process. */
bool st_faults_any_armed(const st_faults* faults);
/* The drills armed in this process that have not fired in it, as
 * "faults.KEY=VALUE" strings (a new array; empty when all fired). */
st_json* st_faults_unfired(const st_faults* faults);
/* Checkpoint saves this process began (what the save faults count). */
int64_t st_faults_saves(const st_faults* faults);

/* An st_ckpt_hook_fn (user = the st_faults). Counts saves (the N of
 * crash_in_save / io_error_at_save / corrupt_latest is the N-th save of
 * this process) and fires the save faults at their points. Called on the
 * writer thread. */
st_status st_faults_ckpt_hook(void* faults, st_ckpt_point point, const char* path);

/* Flips one byte of tensor data in checkpoint folder |dir| (fsynced): the
 * corrupt_latest fault, also used by tests. Returns the file changed
 * (caller frees) through |out_file| when not NULL. */
st_status st_faults_corrupt_checkpoint(const char* dir, char** out_file);

/*===-------------------------------------------------------------------===*/
/* Hang watchdog (diag.hang_*, docs/diagnostics.md "Hang watchdog")         */
/*===-------------------------------------------------------------------===*/

/* Watched activities: every op of a plan (per device), a compile batch, a
 * checkpoint write, and a whole training step. */
typedef enum st_watch_phase {
  ST_WATCH_OP,
  ST_WATCH_COMPILE,
  ST_WATCH_CKPT,
  ST_WATCH_STEP,
  ST_WATCH_PHASE_COUNT,
} st_watch_phase;
const char* st_watch_phase_name(st_watch_phase phase); /* "op", "compile", "checkpoint_write", "step" */

typedef struct st_watchdog st_watchdog;

typedef struct st_watchdog_options {
  double timeout_s; /* diag.hang_timeout_s: added to every deadline; must be > 0 */
  double factor;    /* diag.hang_factor: K of K x the slowest seen */
  double floor_s;   /* diag.hang_floor_s: the least deadline of an op, a step, a checkpoint write */
  double compile_s; /* diag.hang_compile_s: the least deadline of a compile */
  double tick_s;    /* how often the thread looks; 0: 0.05 s */
  const char* run_dir; /* bundles go to <run_dir>/diag/hang-<time>/ (copied) */
  st_runlog* log;      /* gets the "hang" event (borrowed; may be NULL) */
  /* Called on the watchdog thread once the bundle is written; NULL (the
   * trainer): print the bundle's path and _exit(6) — the stuck thread
   * cannot be unwound, and exit() would run atexit handlers beside it. */
  void (*on_hang)(void* user, const char* bundle_dir);
  void* user;
  /* A job of several processes (borrowed; NULL: one process): the bundle
   * and the hang event name this process's rank and what its cross-process
   * collectives are doing (st_dist_coll_pending). */
  st_dist* dist;
} st_watchdog_options;

/* One activity. Strings are copied (truncated to 95 bytes). */
typedef struct st_watch_item {
  st_watch_phase phase;
  int key;          /* its learned-duration slot (st_watchdog_keys); -1: none, the floor alone */
  const char* name; /* a program, "compile", "step_50"... */
  const char* plan; /* "step" | "eval" | NULL */
  const char* kind; /* "LAUNCH", "READ"... | NULL */
  int op;           /* index in the plan; -1 */
  int layer, micro, device; /* -1 when not per layer, microbatch, device */
  int64_t step;     /* 1-based step it belongs to; 0: none */
} st_watch_item;

/* Starts the watchdog thread. A deadline is
 *   max(floor, factor x the slowest completed duration of its key) + timeout_s
 * (floor: compile_s for ST_WATCH_COMPILE, floor_s otherwise), fixed when
 * the activity begins. A step counts as past its deadline only while no
 * op is in flight (an op in flight has its own deadline, which names it). When an activity passes its deadline the thread
 * writes <run_dir>/diag/hang-<time>/ (hang.json: the expired activity, all
 * in flight with their issue times and deadlines, the last completed one;
 * threads.txt: every host thread's backtrace; events.tail.jsonl; maps.txt),
 * appends a "hang" event, and calls on_hang (default: exit 6). It fires
 * once. */
st_status st_watchdog_create(const st_watchdog_options* options, st_watchdog** out /* owned by caller */);
void st_watchdog_destroy(st_watchdog* watchdog); /* stops the thread; NULL is a no-op */
/* Reserves |count| learned-duration keys; returns the first. Thread-safe. */
int st_watchdog_keys(st_watchdog* watchdog, int count);
/* An activity begins now; returns its handle for st_watchdog_end (-1 when
 * |watchdog| is NULL). Thread-safe (plugin callback threads end ops). */
int st_watchdog_begin(st_watchdog* watchdog, const st_watch_item* item);
/* It completed: its duration teaches its key. -1 and NULL are no-ops. */
void st_watchdog_end(st_watchdog* watchdog, int handle);
/* The deadline an activity of |phase| and |key| beginning now would get. */
double st_watchdog_deadline(st_watchdog* watchdog, st_watch_phase phase, int key);

/*===-------------------------------------------------------------------===*/
/* Loss spikes (diag.spike_z, docs/diagnostics.md "Loss spikes")            */
/*===-------------------------------------------------------------------===*/

typedef struct st_spike st_spike;

/* The z-score of a loss against the last |window| losses (at least
 * |min_count| of them, else no verdict). */
typedef struct st_spike_result {
  double z, mean, std; /* over the window before this loss */
  int count;           /* losses in the window */
} st_spike_result;

st_spike* st_spike_create(int window, int min_count); /* owned by caller */
void st_spike_destroy(st_spike* spike);               /* NULL is a no-op */
/* Scores |loss| against the window, then adds it (a non-finite loss is
 * neither scored nor added). True when z > |threshold|: a rise, never a
 * drop; a window with no spread (std 0) gives no verdict. */
bool st_spike_push(st_spike* spike, double loss, double threshold, st_spike_result* out /* may be NULL */);

/*===-------------------------------------------------------------------===*/
/* Graceful stop (SIGTERM, SIGINT, SIGHUP)                                  */
/*===-------------------------------------------------------------------===*/

/* The dispositions st_stop_signals_install replaced (owned by the caller,
 * usually on its stack). */
typedef struct st_stop_guard {
  struct sigaction old[3]; /* SIGTERM, SIGINT, SIGHUP */
  struct sigaction old_usr1; /* when usr1 */
  bool installed;
  bool usr1; /* st_stop_signals_add_usr1 */
} st_stop_guard;

/* Installs the stop handlers for SIGTERM, SIGINT and SIGHUP. The handler
 * only records the first signal's number in a volatile sig_atomic_t, the
 * one process-wide variable of this API (a signal handler has no other
 * place to put it); it is reset here. The same signal a second time takes
 * its default action (the process ends at once: SA_RESETHAND). One guard
 * at a time per process; not for threads to share. */
void st_stop_signals_install(st_stop_guard* guard);
/* SIGUSR1 as a stop signal too, with the same handler, after
 * st_stop_signals_install (no-op before it); restored with the others.
 * For a job of several processes: Open MPI's mpirun forwards SIGUSR1 to
 * every rank, whereas on SIGTERM it kills them (docs/multiprocess.md,
 * "Failures"). A single process leaves SIGUSR1 alone. */
void st_stop_signals_add_usr1(st_stop_guard* guard);
/* The first stop signal received since st_stop_signals_install, or 0. */
int st_stop_signal(void);
/* Gives SIGTERM, SIGINT and SIGHUP (and SIGUSR1 when added) their default action (end at once): for
 * the stop's own checkpoint, which a second signal must abort, never delay. */
void st_stop_signals_default(void);
/* Puts back the dispositions from before st_stop_signals_install. */
void st_stop_signals_restore(st_stop_guard* guard);
/* "SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"; "a signal" for others. Static string. */
const char* st_signal_name(int sig);

/*===-------------------------------------------------------------------===*/
/* Supervisor (`strata run`)                                                */
/*===-------------------------------------------------------------------===*/

/* recovery.* (docs/config.md), filled by the typed options. */
typedef struct st_recovery_options {
  int64_t max_restarts;
  double backoff_s, backoff_max_s, hang_timeout_s;
} st_recovery_options;

typedef struct st_supervisor_request {
  const char* exe;         /* the strata binary to run children with */
  const char* config_path; /* CONFIG as the user gave it */
  int override_count;
  char* const* overrides;  /* key=value as the user gave them */
  /* From the same config, through the typed options: */
  const char* run_dir;     /* run.dir ("" = runs/<run.id or a generated id>) */
  const char* run_id;      /* run.id */
  bool resume;             /* run.resume */
  st_recovery_options recovery;
  /* A multi-process job (docs/multiprocess.md, "Failures"): the launcher's
   * words (e.g. "mpirun", "-np", "2"), put before every attempt's
   * `exe train CONFIG ...`; 0 words: one process, as before. */
  int launcher_count;
  char* const* launcher;
} st_supervisor_request;

/* Runs `strata train CONFIG k=v... run.dir=<dir>` as a child process and,
 * when it dies by a signal, exits non-zero (other than 2 config or 3 data
 * errors, 5 non-finite numerics, which a restart would meet again, or 8:
 * stopped by a signal after a checkpoint, which is no crash)
 * or stops making progress for recovery.hang_timeout_s, restarts
 * it as `strata resume <dir>` after recovery.backoff_s (doubling, capped
 * at recovery.backoff_max_s), at most recovery.max_restarts times. Each
 * incident is measured (detection, restart, restore, steps lost, time to
 * the first good step) into events.jsonl and <dir>/recovery.json.
 * SIGTERM, SIGINT and SIGHUP to the supervisor are forwarded to the child
 * once (the child has a process group of its own) and end supervision.
 * With a launcher: every attempt is `LAUNCHER exe train CONFIG k=v...
 * run.dir=<dir>` (later ones with run.resume=true), a stop signal reaches
 * the launcher as SIGUSR1 (mpirun forwards it to every rank; on SIGTERM it
 * would kill them), a hang gets SIGTERM (mpirun then ends every rank) and
 * SIGKILL 10 s later, and the ranks accept the run directory's lock held
 * by this supervisor (STRATA_RUN_LOCK_PID: mpirun closes inherited file
 * descriptors). A launcher's exit above 128 (mpirun: a rank killed by
 * signal N exits 128+N) is an incident like a crash.
 * *out_exit_code: 0 when the run completed, else the last attempt's exit
 * code (1 when it died by a signal). The status reports the supervisor's
 * own failures (run directory, fork). */
st_status st_supervise(const st_supervisor_request* request, int* out_exit_code);

/*===-------------------------------------------------------------------===*/
/* strata compare (src/diag/compare.c; docs/diagnostics.md, "Dump and      */
/* compare")                                                                */
/*===-------------------------------------------------------------------===*/

/* Compares two step dumps (diag.dump; |run_a| and |run_b| are run
 * directories holding dump/step_<N>/, or dump folders; |step| 0: the one
 * dump a run holds): A's tensors in plan order against B's matched by
 * (phase, stage, layer, microbatch, in/out, name, occurrence), each
 * against its budget by dtype and class. *out_report (a new object):
 * "compared", "over_budget", "differ", "first" (the first launch with a
 * tensor over budget and its worst tensor: program, layer, microbatch,
 * tensor, max_abs, max_rel, budget; null when none), "by_layer", the
 * unmatched counts, "budgets_f32". Bad input (not a dump, a damaged one,
 * different steps or models, nothing in common) is ST_CODE_CONFIG naming
 * the file and the fix. */
st_status st_compare_dumps(const char* run_a, const char* run_b, int64_t step, st_json** out_report);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_DIAG_H */
