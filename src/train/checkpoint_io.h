/* checkpoint_io.h — the trainer's side of checkpoints (docs/checkpoints.md):
 * which executor slots are the training state, the device->host snapshot
 * at a step boundary, handing it to the writer thread, logging each save,
 * restoring the newest valid checkpoint on resume, and the step faults.
 *
 * trainer.c calls these from a few lines of its lifecycle:
 *   create      after the executor exists
 *   restore     after parameters are initialised (overwrites them on resume)
 *   step_ran    after a step ran on the device, before it is recorded
 *   step_done   after a step is recorded (metrics, eval)
 *   save_now    when a stop signal ends the run early
 *   destroy     at shutdown (finishes a save in flight) */
#ifndef STRATA_TRAIN_CHECKPOINT_IO_H
#define STRATA_TRAIN_CHECKPOINT_IO_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/bundle.h"
#include "strata/config.h"
#include "strata/dist.h"
#include "strata/runtime.h"
#include "strata/sched.h"
#include "strata/status.h"
#include "strata/train.h"

typedef struct st_train_ckpt st_train_ckpt;
/* strata/obs.h, not included here: it must be included once per file. */
typedef struct st_runlog st_runlog;

/* Everything borrowed; must outlive the st_train_ckpt. */
typedef struct st_train_ckpt_init {
  const st_config* config;          /* whole: its JSON and hash go into every checkpoint manifest */
  const st_plan_options* options;  /* every setting (ckpt.*, run.resume, faults.*) */
  const char* run_dir;
  const st_bundle* bundle;
  const st_plan* plan; /* the step plan: its persistent params and m/v slots are the state */
  st_executor* executor;
  st_runtime* runtime;
  st_runlog* log;
  const st_dataset* data; /* its tokenizer goes into every manifest and is checked on resume */
  /* A job of several processes (docs/multiprocess.md, "Checkpoints"): the
   * run directory whose checkpoints/ this rank saves to and resumes from
   * (NULL: run_dir), whether it writes files at all (a data-parallel job's
   * state is the same on every rank: rank 0 alone writes it), and the job
   * (NULL or a job of one: one process). In a job every save, restore and
   * rollback is collective: every rank calls them at the same steps, and
   * learns the same outcome (the commit protocol of the docs). */
  const char* ckpt_run_dir;
  bool no_save;
  st_dist* dist;
  /* No checkpoint is saved at all (fsdp across processes: no rank holds
   * the whole state and per-rank checkpoints are not built; the options
   * refuse periodic saves and resuming). */
  bool disabled;
  /* Per-rank shards (fsdp across processes, one device per process;
   * docs/checkpoints.md, "Per-rank shards"): every rank writes its rows of
   * each slot cut across the processes (st_slot.xblocks) to its own file,
   * rank 0 commits them with one manifest. Saves are synchronous. */
  bool sharded;
} st_train_ckpt_init;

st_status st_train_ckpt_create(const st_train_ckpt_init* init, st_train_ckpt** out /* owned by caller */);

/* data_contract.c (docs/data.md, "Data contract"): the contract of |data|
 * at training position |position| (sequences consumed), an object with
 * "packing" and "sources", into *out (owned by caller); and the check of
 * a checkpoint's recorded "data" against |now|: a changed source is
 * ST_CODE_DATA naming it and |where| unless |allow|, then *out_change
 * (owned by caller; NULL when nothing changed) lists the changes. */
st_status st_train_data_contract(const st_dataset* data, uint64_t position, json_t** out);
st_status st_train_data_contract_check(const json_t* recorded, const json_t* now, bool allow, const char* where,
                                       json_t** out_change);
/* With run.resume: removes temporaries of crashed saves, loads the newest
 * valid checkpoint into the executor (reporting every one it skips and
 * why) and sets *out_step to its step; 0 when starting fresh.
 * *out_restored says whether a checkpoint was loaded: then every parameter
 * and optimizer slot is set, and the run needs no init. */
st_status st_train_ckpt_restore(st_train_ckpt* ckpt, int64_t* out_step, bool* out_restored);
/* Step |step| (1-based) ran on the device: the step faults fire here. */
void st_train_ckpt_step_ran(st_train_ckpt* ckpt, int64_t step);
/* Step |step| is recorded: reports finished saves, saves when due (every
 * ckpt.every steps, and synchronously after the last step). */
st_status st_train_ckpt_step_done(st_train_ckpt* ckpt, int64_t step);
/* Makes sure a checkpoint of step |step| exists before the run stops early
 * (a stop signal): waits for a save of it in flight, else saves it now and
 * waits. Any failure is an error here whatever ckpt.on_error says: the
 * caller must not report a checkpoint that is not there. */
st_status st_train_ckpt_save_now(st_train_ckpt* ckpt, int64_t step);
/* The hang watchdog watches every checkpoint write from here on (borrowed;
 * NULL: none). Set before the first save. */
void st_train_ckpt_set_watchdog(st_train_ckpt* ckpt, st_watchdog* watchdog);
/* diag.on_nonfinite=rollback: waits for a save in flight, then loads the
 * newest valid checkpoint (of a step before |before_step|) into the
 * executor's state slots. *out_step is its step and *out_dir its folder
 * (caller frees), or -1 and NULL when there is none (nothing changed). */
st_status st_train_ckpt_rollback(st_train_ckpt* ckpt, int64_t before_step, int64_t* out_step, char** out_dir);
/* The run's armed faults (borrowed; NULL when |ckpt| is): faults.hang_in
 * fires in a launch, faults.nan_at in a forward. */
st_faults* st_train_ckpt_faults(st_train_ckpt* ckpt);
/* The host staging of checkpoints: the bytes of the snapshot buffer, and
 * (|out_filled|, may be NULL) whether a save has copied the state into it
 * yet (until then its pages were never touched). 0 for NULL. */
int64_t st_train_ckpt_staging_bytes(const st_train_ckpt* ckpt, bool* out_filled);
/* Waits for a save in flight and reports it (in a job, on this rank only:
 * never collective, so that a rank ending on an error cannot hang in it).
 * NULL is a no-op. */
void st_train_ckpt_destroy(st_train_ckpt* ckpt);

#endif
