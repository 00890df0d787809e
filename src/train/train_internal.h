/* train_internal.h — the trainer's state, shared by the files of src/train/
 * that make up one run: trainer.c (the lifecycle), step_hooks.c (the
 * executor callbacks that feed and read a step) and metrics.c (the metrics
 * lines and events). Not a public interface. */
#ifndef STRATA_TRAIN_INTERNAL_H
#define STRATA_TRAIN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/dist.h"
#include "strata/bundle.h"
#include "strata/config.h"
#include "strata/data.h"
#include "strata/obs.h"
#include "strata/runtime.h"
#include "strata/sched.h"
#include "strata/status.h"
#include "strata/train.h"
#include "train/checkpoint_io.h"

typedef struct st__watch_ex st__watch_ex; /* watch.c */

typedef struct st__trainer {
  const st_plan_options* o;
  st_plan_opened opened; /* the bundle and runtime (st_plan_open); bundle and runtime below borrow them */
  const st_bundle* bundle;
  st_runtime* runtime;
  st_dataset* data;
  st_runlog* log;
  st_metrics_server* metrics; /* obs.metrics_port's endpoint (owned; NULL when off) */
  char* run_dir;

  /* compiled programs by bundle program index (owned) */
  st_program** compiled;
  double* compile_s; /* seconds each took to compile or load, same index */
  /* The runtime's counters when the step's compile began: the compile event
   * counts from here, not MFU's matmul-peak measurement before it. */
  int64_t compiles_before, cache_hits_before;
  /* SPMD collectives by pipeline stage and bundle collective index:
   * [stage * collective_count + c], ST_PLAN_MAX_STAGES stages (owned; NULL
   * without); stage 0 only without a pipeline. */
  st_program** compiled_coll;
  st_plan step_plan, eval_plan;
  st_plan_remat_choice remat; /* what sched.remat chose for step_plan, and why (the plan event) */
  st_program** step_programs; /* borrowed from compiled, by plan program index */
  st_program** eval_programs;
  st_executor* ex;      /* owns the persistent state (params, m, v) */
  st_executor* eval_ex; /* borrows the params from ex before every eval */

  /* per-step host state */
  int64_t mb;            /* microbatch rows this process trains on (of a job's several: its share) */
  int64_t T;
  int32_t* tokens;       /* [batch, T] (or eval batch) */
  int32_t* targets;
  float* mask;
  int32_t* positions;    /* data.packing=pack: each token's position in its document; else NULL */
  /* data.packing none or pack: the sum of the weights (mask) of the batch
   * last filled for each stream, over the whole job (docs/data.md, "Loss
   * normalisation"). */
  double weight_sum[2];
  double data_s;         /* the step's batch fill (st__fill_share), seconds: "data_s" */
  double* losses;        /* [microbatches] or [eval microbatches] */
  double* sqnorms;       /* [group instances] */
  int n_sq;
  int64_t step;          /* 0-based step being run */
  /* The blocks' metrics (st_plan_block_metrics; docs/bundle.md, "Block metrics"):
   * names borrowed from the bundle, and over the step's reads (layers,
   * microbatches, devices) the sum and count of a scalar's values, the
   * least and largest element of a vector's. step_hooks.c collects,
   * metrics.c writes; st__metrics_reset starts a step. */
  int n_metrics;
  const char* metric_names[ST_PLAN_MAX_METRICS];
  int metric_ranks[ST_PLAN_MAX_METRICS];
  double metric_sum[ST_PLAN_MAX_METRICS], metric_min[ST_PLAN_MAX_METRICS], metric_max[ST_PLAN_MAX_METRICS];
  int64_t metric_reads[ST_PLAN_MAX_METRICS];
  double grad_norm, gscale, lr;
  /* diag.on_nonfinite (docs/diagnostics.md): the HOST clip op found a
   * non-finite loss or gradient norm in this step and skipped its update;
   * |nonfinite_what| says which ("loss", "gradient norm"). Counts over
   * this process. */
  bool nonfinite;
  char nonfinite_what[64];
  double nonfinite_value;
  int64_t skipped_steps, rollbacks;
  bool update_dropped; /* the step just run changed no state (skip, rollback) */
  /* diag.numerics (docs/diagnostics.md), this step's, per stage s = 0
   * embed, 1..L blocks, L+1 head (the instance order): the columns of
   * update_stats summed over the stage's parameters (maxima for the _MAX
   * columns; NaN stays NaN), whether they were read; and per block its
   * output's (out) and input gradient's (dx) act_stats over microbatches
   * and devices: sum of squares, largest |x|, non-finite count, elements. */
  double (*num_opt)[ST_NSTAT_COLUMNS]; /* [n_sq] */
  bool* num_opt_read;                  /* [n_sq] */
  double (*num_act)[2][4];             /* [L][out, dx][sumsq, maxabs, nonfinite, numel] */
  /* faults.nan_at fired in this process: where (the checking re-execution
   * injects it again there); step 0 = not fired. */
  int64_t nan_fired_step;
  int nan_fired_layer, nan_fired_micro;
  char nan_fired_tensor[64]; /* as configured ("" = the first output) */
  char nan_fired_output[64]; /* the output's name */
  /* The drills armed in this process that had not fired when the last
   * step was done (st_faults_unfired; owned, NULL: no drill armed). */
  json_t* faults_unfired;
  /* faults.slow_program (step_hooks.c): on, the step plan's program index,
   * and when the current launch of it began (its inputs ready). */
  bool slow_on;
  int slow_program;
  double slow_t0;
  /* The checking re-execution of a non-finite step (nonfinite.c). */
  bool checking;
  struct st__check* check;
  /* diag.dump: the step being dumped (dump.c); NULL in every other step. */
  struct st__dump* dump;
  st_train_ckpt* ckpt;   /* checkpoints, resume, step faults (checkpoint_io.c) */
  int64_t start_step;    /* steps already done when resuming */
  /* What the end-of-run summary reports (trainer.c, st__summary). */
  int64_t steps_run;     /* steps this process ran */
  double train_s;        /* their summed step times */
  double last_loss, last_eval_loss; /* NAN until known */
  int64_t peak_bytes;    /* largest accounted per-device peak of a step */
  st_train_peak peak;    /* MFU's peak per device (mfu.c), resolved once the runtime exists */
  double model_flops_per_token; /* st_train_model_flops_per_token of the bundle's model */
  /* a stop signal ended the run early (trainer.c, st__stop) */
  int stop_signal;
  int64_t stop_step;
  bool stop_saved;       /* a checkpoint of stop_step was written */
  /* Diagnostics beside the step (watch.c; docs/diagnostics.md). */
  st_watchdog* watchdog;   /* diag.hang_timeout_s > 0 (owned; NULL: off) */
  st__watch_ex* watch_step, *watch_eval; /* the executors' monitors (owned) */
  int watch_compile_key, watch_step_key, watch_step_handle;
  st_spike* spike;         /* diag.spike_z > 0 (owned; NULL: off) */
  /* Where the process's memory goes (memory.c, the `memory` events):
   * snapshots before the plugin loaded, after it, after every program was
   * compiled; the largest RSS sampled since (after each step and save) and
   * the categories then. */
  st_mem_usage mem_base, mem_plugin, mem_compiled;
  int64_t mem_peak_rss;
  json_t* mem_peak; /* owned; NULL until the first sample */
  /* A job of several processes (docs/multiprocess.md): the job (NULL: one
   * process), whether this step's losses are already the job's mean (the
   * clip hook exchanges them), and whether any rank was asked to stop. */
  st_dist* dist;
  char* job_dir; /* the job's run directory (rank 0's run_dir); NULL in one process */
  bool losses_global;
  bool stop_any;
  /* The run's failure is one every rank meets at the same point (the
   * run directory rank 0 could not make, a stop all ranks agreed on): the
   * ranks end together. Any other failure of a rank ends the job
   * (st__job_fail). */
  bool failed_together;
  /* One PJRT client across the job's processes (st__job_runtime_kv), and
   * whether rank 0 has already let the others go (st__job_rank0_first):
   * such a client is created by all ranks at once, so rank 0 releases them
   * after the bundle, before the client. */
  bool shared_client;
  bool rank0_released;
} st__trainer;

/* step_hooks.c: the executor's H2D / READ / HOST callbacks for a step or an
 * evaluation of |t| (the hooks' user pointer is |t|, borrowed). */
st_executor_hooks st__train_hooks(st__trainer* t);

/* trainer.c: compiles, as one batch, every bundle program |plans| or
 * |extra| name that t->compiled lacks (t->compiled and t->compile_s sized
 * by the bundle's program count). */
st_status st__compile_programs(st__trainer* t, const st_plan* const* plans, int plan_count, const char* const* extra,
                               int extra_count);
/* trainer.c: |plan|'s program indices to the compiled programs (a new
 * array, owned by the caller; the programs are borrowed). */
st_status st__plan_programs(st__trainer* t, const st_plan* plan, st_program*** out);

/* job.c. Joins the job when a launcher started this process (t->dist,
 * o->rank), checking parallel.processes against it. */
st_status st__job_init(st__trainer* t, st_plan_options* o);
st_status st__job_rank0_first(st__trainer* t, bool before);
/* In a job of several processes: whether its ranks share one PJRT client
 * (runtime.shared_client; auto: for a GPU or TPU plugin) and,
 * when they do, o->runtime.kv served from t->dist's store
 * (docs/multiprocess.md, "One PJRT client across processes"). Sets
 * t->shared_client. Nothing in one process. */
void st__job_runtime_kv(st__trainer* t, st_plan_options* o);
st_status st__job_agree(st__trainer* t, const st_config* cfg);
st_status st__job_step_metrics(st__trainer* t, double dt, json_t* m);
st_status st__job_run_dir(st__trainer* t, const st_plan_options* o, bool rank0_ok, char** io_dir, char** out_job_dir);
/* A rank's own failure |s| in a job of several processes (not
 * t->failed_together): says it on stderr as `strata` would, naming the
 * rank, and ends the whole job with its exit code (st_dist_abort): the
 * other ranks would wait for this one in their next collective forever.
 * The caller has written the failed event. Returns (doing nothing) in one
 * process or for a failure every rank shares. */
void st__job_fail(st__trainer* t, st_status s);
/* A job of several processes: the microbatch losses |losses| (|n|) become
 * the mean over ranks (equal shares), and every rank learns whether any was
 * asked to stop (t->stop_any). Collective; nothing in one process. */
st_status st__losses_global(st__trainer* t, double* losses, int64_t n);
st_status st__sqnorms_global(st__trainer* t);
/* The rows of |n_micro| microbatches from sequence |first| of |stream|
 * that this process trains on (all of them in one process). */
st_status st__fill_share(st__trainer* t, int stream, uint64_t first, int64_t n_micro);
/* What the summed microbatch means of a step (or an evaluation of
 * |stream|) are divided by: today's count of them (microbatches x
 * data-parallel shares) with data.packing=concat; with none or pack the
 * batch's weight sum over one program's token count, so that the loss is
 * sum(ce * w) / sum(w) over the whole batch (docs/data.md). */
double st__loss_divisor(const st__trainer* t, int stream, int64_t n_micro);
/* The mean loss of |n_micro| microbatch losses (each the job's mean over
 * its devices), normalised as st__loss_divisor says. */
double st__batch_loss(const st__trainer* t, int stream, const double* losses, int64_t n_micro);
/* evaluate.c: runs t->eval_ex over the first eval_batches x batch_size
 * sequences of the validation stream (the same ones every time) and
 * averages the microbatch losses; the eval plan's parameter slots must be
 * set. The one evaluation of `strata train` and `strata eval`. */
st_status st__eval_batches(st__trainer* t, double* out_loss);

/* mfu.c: the summary's line "X GFLOP/s of model FLOPs = Y% of the
 * measured matmul peak (Z GFLOP/s, strata doctor)", against t->peak. */
void st__summary_peak(const st__trainer* t, double model_gflops);

/* memory.c: samples the process's memory now (|at| says where: "step 3",
 * "checkpoint 10") and keeps the categories when its RSS is the largest
 * so far; st__memory_event writes a `memory` event of phase "start" (the
 * sample now) or "peak" (the kept one, with the kernel's high-water mark). */
void st__memory_sample(st__trainer* t, const char* at);
st_status st__memory_event(st__trainer* t, const char* phase);

/* step_hooks.c: forgets the last step's block metrics. */
void st__metrics_reset(st__trainer* t);
/* step_hooks.c: forgets the last step's diag.numerics statistics. */
void st__numerics_reset(st__trainer* t);

/* nonfinite.c (docs/diagnostics.md, "The first non-finite value"): the
 * executor hooks of the checking re-execution (t->checking), and the
 * re-execution itself: step t->step + 1 again from the state before it
 * (its update was dropped), every launch's outputs tested, the first
 * non-finite one named and its program's inputs, StableHLO, config and
 * sample indices written to <run>/diag/nonfinite-step<N>/; a
 * "nonfinite_located" event. *out_dir: that folder (caller frees) or NULL
 * when the re-execution produced no non-finite value. */
st_status st__nf_check_inputs(st__trainer* t, const st_op* op, int index, st_buffer* const* inputs);
st_status st__nf_check_outputs(st__trainer* t, const st_op* op, int index, st_buffer** outputs);
/* The checking re-execution's timing of the launch whose outputs are next
 * checked: inputs ready (copied to the host) to outputs ready; nonfinite.json
 * records the culprit's (strata repro --perf replays against it). */
void st__nf_time_launch(st__trainer* t, const st_op* op, int index, st_buffer** outputs);
st_status st__locate_nonfinite(st__trainer* t, char** out_dir);

/* dump.c (docs/diagnostics.md, "Dump and compare"): diag.dump=step:N.
 * st__dump_check, before the first step: refuses what the dump cannot
 * gather (parallel.tensor > 1, several processes, a step before the
 * resume) and arms faults.wrong_kernel (exit 2 without ffi attention).
 * st__dump_begin before step t->step + 1 runs (nothing unless it is the
 * dumped one), the hooks during it, st__dump_end after it (writes
 * <run>/dump/step_<N>/ and a "dump" event), st__dump_discard after a
 * failed step or at the end. */
typedef struct st__dump st__dump;
st_status st__dump_check(st__trainer* t);
void st__dump_begin(st__trainer* t);
st_status st__dump_inputs(st__trainer* t, const st_op* op, int index, st_buffer* const* inputs);
st_status st__dump_outputs(st__trainer* t, const st_op* op, int index, st_buffer** outputs);
st_status st__dump_end(st__trainer* t);
void st__dump_discard(st__trainer* t);

/* metrics.c: every line the run writes to metrics.jsonl and events.jsonl. */
/* One events.jsonl line; |fields| (an object, or NULL) is stolen. */
st_status st__event(st__trainer* t, const char* name, json_t* fields);
/* The metrics line of the step just run (t->step), its trace if trace.steps
 * asks for one. */
st_status st__step_metrics(st__trainer* t, double loss, double step_seconds);
/* Before step t->step runs: with trace.steps set and ffi kernels in the
 * bundle, the kernels' counters reset (the step's metrics line reads them)
 * and their spans recorded when this step is traced. */
void st__kernels_step_begin(st__trainer* t);
st_status st__eval_metrics(st__trainer* t, double eval_loss);
/* The policies and what the plan predicts, once, before the run. */
st_status st__plan_event(st__trainer* t);
/* Compile seconds, cache hits and per-program seconds, once, before the run. */
st_status st__compile_event(st__trainer* t, double seconds);
/* The "failed" event of a run that stops on |s| (borrowed). */
void st__failed_event(st__trainer* t, st_status s);
/* The "interrupted" event of a run a stop signal ended (|s|, borrowed, is
 * its ST_CODE_INTERRUPTED status): signal, step, checkpoint, exit code. */
void st__interrupted_event(st__trainer* t, st_status s);

/* watch.c: the hang watchdog (when diag.hang_timeout_s > 0) and the loss
 * spike window (when diag.spike_z > 0). */
st_status st__watch_start(st__trainer* t);
void st__watch_stop(st__trainer* t); /* both freed; safe when never started */
/* Monitors |ex| (running |plan|, labelled "step" or "eval"): every op to
 * the watchdog, every launch to faults.hang_in. Owned by the caller. */
st__watch_ex* st__watch_executor(st__trainer* t, st_executor* ex, const st_plan* plan, const char* label);
/* After a run of that executor: ends what a failed op left open. */
void st__watch_settle(st__watch_ex* w);
void st__watch_ex_free(st__watch_ex* w);
/* A compile of |programs| programs begins: its watchdog handle (-1: none). */
int st__watch_compile_begin(st__trainer* t, int programs);
/* Step t->step + 1 begins / ends (the step as a whole, host work included). */
void st__watch_step_begin(st__trainer* t);
void st__watch_step_end(st__trainer* t);
/* faults.nan_at names a layer whose training forward the step plan
 * launches in microbatch faults.nan_micro, and a float output of it
 * (exit 2 otherwise): checked before the first step. */
st_status st__check_nan_at(const st__trainer* t);
/* faults.slow_program names a program the step plan launches (exit 2);
 * arms the drill (step_hooks.c). */
st_status st__check_slow_program(st__trainer* t);
/* faults.hang_in names a program a plan launches, and a valid step (exit 2). */
st_status st__check_hang_in(const st__trainer* t);
/* Scores the step's loss against the recent ones; a loss_spike event when
 * it is diag.spike_z standard deviations above their mean. */
st_status st__loss_spike(st__trainer* t, double loss);
/* Golden statistics of a tensor of |n| elements (input_stats.c; the
 * definitions of tests/golden/golden.py's tensor_stats): a new object
 * {norm, maxabs, nonfinite, idx, values, bf16_sha256 (float) or sha256}. */
json_t* st__tensor_stats_json(st_dtype dtype, const void* data, int64_t n);

#endif
