/*
 * strata/plan.h — what a run is before it steps (src/plan/): the typed
 * options (options.c, the one reader of config keys outside config), the
 * opener of a run's bundle and runtime (open.c), the step and evaluation
 * plans built from the bundle's program tables (step_plan.c; docs/
 * architecture.md shows what it emits), sched.remat=auto (remat_auto.c),
 * will it fit (fit.c), and what trained parameters a path names and what
 * they were trained as (locate.c, identity.c).
 */
#ifndef STRATA_PLAN_H
#define STRATA_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/config.h"
#include "strata/data.h"
#include "strata/diag.h"
#include "strata/kernels.h"
#include "strata/runtime.h"
#include "strata/sched.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The mesh axis a job's processes span (st_plan_options.span_axis). */
enum { ST_PLAN_SPAN_NONE = -1, ST_PLAN_SPAN_DATA = 0, ST_PLAN_SPAN_FSDP = 1, ST_PLAN_SPAN_TENSOR = 2 };

/* ckpt.staging (docs/checkpoints.md, "Host staging"). */
enum { ST_CKPT_STAGING_AUTO, ST_CKPT_STAGING_FULL, ST_CKPT_STAGING_CHUNKED };

/* Room for every op of the kernel contract (st_kernels_op_names). */
#define ST_PLAN_KERNEL_OPS ST_KERNEL_MAX_OPS

/* sched.*: what the plan builder applies (docs/scheduling.md), each read
 * once from the config. A zeroed struct is the plain plan: remat auto with
 * no budget (so none), nothing offloaded, deferred waits, the optimizer
 * after the backward. */
typedef struct st_plan_sched {
  st_config_remat remat; /* sched.remat */
  /* sched.memory_budget (sched.remat=auto): bytes per device (0: no
   * limit), or a fraction of the device's memory (then bytes is 0). */
  int64_t memory_budget_bytes;
  double memory_budget_fraction;
  const char* memory_budget_text;   /* as written, for messages; may be NULL */
  const char* memory_budget_source; /* where it was set, for errors ("command line", "file:line"); may be NULL */
  int offload;              /* sched.offload: ST_OFFLOAD_* bits */
  int prefetch_depth;       /* sched.prefetch_depth */
  bool eager;               /* sched.wait = eager */
  bool per_layer_optimizer; /* sched.optimizer = per_layer */
  bool bucketed_grad_reduce; /* sched.grad_reduce = bucketed (parallel.data > 1) */
  int64_t grad_bucket_bytes; /* sched.grad_bucket_bytes (0: one bucket) */
  int gather_prefetch;        /* sched.gather_prefetch (parallel.fsdp > 1) */
  bool reshard_after_forward; /* sched.reshard_after_forward (parallel.fsdp > 1) */
  int pipeline_schedule;      /* sched.pipeline_schedule: ST_PLAN_PIPE_* (parallel.pipeline > 1) */
  int pipeline_virtual;       /* sched.pipeline_virtual: model chunks per stage (interleaved) */
} st_plan_sched;

/* sched.pipeline_schedule (docs/parallelism.md, "Pipeline"). */
enum { ST_PLAN_PIPE_1F1B = 0, ST_PLAN_PIPE_GPIPE = 1, ST_PLAN_PIPE_INTERLEAVED = 2 };

/* train.lr_schedule (docs/model.md, "Learning-rate schedules"). */
enum { ST_PLAN_LR_COSINE = 0, ST_PLAN_LR_CONSTANT = 1, ST_PLAN_LR_LINEAR = 2, ST_PLAN_LR_WSD = 3 };

typedef struct st_plan_options {
  int64_t steps, batch_size, microbatches, warmup_steps, eval_every, eval_batches;
  double lr, min_lr_ratio, weight_decay, beta1, beta2, eps, grad_clip;
  int lr_schedule;       /* train.lr_schedule: ST_PLAN_LR_* */
  double decay_fraction; /* train.decay_fraction (wsd) */
  uint64_t seed;
  const char* run_dir; /* run.dir ("" = runs/<run id>) */
  const char* run_id;  /* run.id ("" = generated) */
  int progress;        /* 0 off, 1 on, 2 when stderr is a terminal */
  /* run.progress resolved (on, or auto on a terminal) and
   * run.progress_min_bytes: what long operations (export, compile,
   * checkpoint writing, tokenizing) are told; the same is in data.progress
   * and runtime.progress. */
  st_progress_options long_progress;
  const char* bundle_dir;
  char* cache_root;    /* owned */
  char* model_json;    /* owned: the bundle's "model" object (fields at their default left out: the bundle key hashes it) */
  /* owned: the model description, every model.* field (block kind and
   * per-op kernel selection included) and microbatch_size: what a
   * checkpoint records as "model" and st_ckpt_identity_check compares
   * (docs/checkpoints.md, "Identity") */
  char* model_desc;
  /* owned, private to options.c: the JSON objects model_json and
   * model_desc are the text of (st_plan_model_json, st_plan_model_desc):
   * the model JSON is built once and never parsed back. */
  struct st_plan_model_trees* model_trees;
  /* kernels.<op> as resolved into model_json (docs/kernels.md,
   * "Selection"): auto takes the contract's default for kernel_platform,
   * the platform runtime.plugin is expected to serve (guessed before any
   * runtime exists, st_runtime_guess_platform; kernel_platform_basis says
   * on what). st_plan_check_kernel_platform holds the guess against the
   * runtime's platform once there is one. Order: st_kernels_op_names. */
  char kernel_platform[16];
  char kernel_platform_basis[640];
  const char* kernel_impl[ST_PLAN_KERNEL_OPS]; /* static strings: "xla", "ffi" or "pallas", never "auto" */
  bool kernel_auto[ST_PLAN_KERNEL_OPS];        /* whether kernels.<op> was auto */
  st_data_options data;
  bool data_allow_changed; /* data.allow_changed: resume on changed data sources (docs/data.md, "Data contract") */
  st_runtime_options runtime;
  st_plan_sched sched;    /* sched.*: remat, offload, prefetch, waits, optimizer placement */
  /* Bytes each device can hold, as the PJRT plugin reports them
   * (st_runtime_device_memory; the least over the devices used), 0 when
   * not reported or no runtime exists yet. Not a config key: the trainer
   * and `strata plan` set it, and sched.remat=auto needs it only for a
   * fractional sched.memory_budget. */
  int64_t device_memory;
  int64_t device_memory_config; /* runtime.device_memory_bytes: where the plugin reports none; 0: unknown */
  bool allow_overcommit;        /* sched.allow_overcommit */
  /* parallel.*: the mesh axis sizes (docs/parallelism.md). In a job of
   * several processes, after st_plan_options_span: this process's part of
   * the mesh (the axis that spans processes divided by their count). */
  int parallel_data, parallel_fsdp, parallel_tensor;
  /* parallel.pipeline: stages, each on its own parallel_data x fsdp x
   * tensor devices (1: no pipeline); parallel.pipeline_layers: layers per
   * stage chunk (pipeline x sched.pipeline_virtual entries; NULL: balanced
   * by predicted cost). Owned. */
  int parallel_pipeline;
  int* pipeline_layers;
  char mesh[64];          /* the mesh the bundle is exported for: "data=2"; "" for one device */
  /* A job of several processes (st_plan_options_span; docs/multiprocess.md):
   * how many, this one's rank, and the mesh axis they span
   * (ST_PLAN_SPAN_*). One process: procs 1, rank 0, span NONE. */
  int procs, rank, span_axis;
  /* runtime.shared_client: in a job of several processes, one PJRT client
   * across them (1), one per process (0), or -1 (auto): shared when the
   * plugin's file name says GPU or TPU (the trainer decides:
   * st__job_runtime_kv). */
  int shared_client;
  int global_data, global_fsdp, global_tensor; /* parallel.* as configured (the whole job's mesh) */
  int trace_step_count;   /* trace.steps: steps (1-based) written as Chrome traces */
  int metrics_port;       /* obs.metrics_port: the live metrics endpoint's port on 127.0.0.1; 0: none */
  int64_t* trace_steps;   /* owned */
  bool resume;            /* run.resume */
  bool tensorboard;       /* obs.tensorboard: <run>/tb/ event files */
  double peak_flops;      /* obs.peak_flops: per-device peak FLOP/s for MFU; 0: measured or datasheet */
  const char* author;     /* obs.author (borrowed from the config): context.json author; "": found (st_context_author) */
  struct {
    int64_t every, keep, keep_every;
    bool async;
    bool stop_on_error;       /* ckpt.on_error = stop */
    bool allow_bundle_change;
    int staging;              /* ckpt.staging: ST_CKPT_STAGING_* */
  } ckpt;                     /* ckpt.* */
  st_faults_options faults;   /* faults.* */
  st_recovery_options recovery; /* recovery.* (strata run) */
  struct {
    double timeout_s, factor, floor_s, compile_s;
  } hang;                     /* diag.hang_*: the watchdog (timeout_s 0: off) */
  struct {
    double z;                 /* 0: off */
    int64_t window;
  } spike;                    /* diag.spike_* */
  struct {
    int policy;                 /* diag.on_nonfinite: ST_NONFINITE_* */
    int64_t max_skipped, max_rollbacks; /* diag.max_skipped, diag.max_rollbacks */
  } nonfinite;
  int numerics; /* diag.numerics: ST_NUMERICS_* */
  /* diag.dump (docs/diagnostics.md, "Dump and compare"): step 0 = off;
   * layer_lo..layer_hi the block layers kept (-1 both: every launch). */
  struct {
    int64_t step;
    int layer_lo, layer_hi;
  } dump;
} st_plan_options;

/* diag.on_nonfinite (docs/diagnostics.md, "Policies"). */
enum { ST_NONFINITE_STOP = 0, ST_NONFINITE_SKIP, ST_NONFINITE_ROLLBACK };
const char* st_plan_nonfinite_name(int policy); /* "stop", "skip", "rollback" */
/* diag.numerics (docs/diagnostics.md, "What is measured"). */
enum { ST_NUMERICS_OFF = 0, ST_NUMERICS_STEP, ST_NUMERICS_LAYER };
/* Columns of the update_stats (adamw_stats_<group>) f32[n, 8] output, one row a parameter. */
enum { ST_NSTAT_PARAM_SQ, ST_NSTAT_UPDATE_SQ, ST_NSTAT_UPDATE_MAX, ST_NSTAT_UPDATE_BAD, ST_NSTAT_GRAD_SQ,
       ST_NSTAT_GRAD_MAX, ST_NSTAT_GRAD_BAD, ST_NSTAT_NUMEL, ST_NSTAT_COLUMNS };

/* After the runtime exists: an error (exit 4) when some kernels.<op>=auto
 * was resolved for a platform (o->kernel_platform) whose default differs
 * from that of the runtime's real platform: the bundle was exported for
 * the wrong one. Names the op, both platforms, and the fix (set it). */
st_status st_plan_check_kernel_platform(const st_plan_options* options, const st_runtime* runtime);

/* {"platform", "basis", "auto": [ops resolved from auto]}: the bundle
 * event's kernel_selection. New reference, owned by the caller. */
st_json* st_plan_kernel_selection_json(const st_plan_options* options);
/* st_ckpt_identity_options.implied for a record written before the model
 * description (a new object, caller owns): the value each field that the
 * older sparse "model" object left out had (docs/checkpoints.md, "Identity"). */
st_json* st_plan_model_implied(void);

/* The model JSON (model_json) and the model description (model_desc) as
 * JSON objects: new objects, owned by the caller (copies of the trees the
 * options built; the text is never parsed back). NULL for options that
 * st_plan_options_from_config did not fill. */
st_json* st_plan_model_json(const st_plan_options* options);
st_json* st_plan_model_desc(const st_plan_options* options);

/* One line on |out| saying how kernels.<op>=auto was resolved and on what
 * guess of the platform; nothing when no op is auto. For the commands that
 * export without a runtime (export, plan). */
void st_plan_kernel_selection_note(const st_plan_options* options, FILE* out);

/* Fills |out| from a validated config. The typed options are the one
 * reader of config keys: the rest of strata (trainer, checkpoints, faults,
 * supervisor) reads these fields; only whole-config uses (config.yaml, the
 * config hash, the checkpoint manifest's copy) take the st_config itself.
 * Free with st_plan_options_deinit, also after an error. (No key fails
 * today: the config was validated; the status is for rules that need more
 * than one key's type.) */
st_status st_plan_options_from_config(const st_config* config, st_plan_options* out);

void st_plan_options_deinit(st_plan_options* options);

/* Learning rate of optimizer step t (1-based): linear warm-up over
 * train.warmup_steps, then train.lr_schedule: constant at train.lr, or a
 * cosine, linear or warmup-stable-decay (wsd) decay to lr * min_lr_ratio
 * at train.steps (docs/model.md, "Learning-rate schedules"). A pure
 * function of t and the options, so a resume continues the curve. */
double st_plan_lr(const st_plan_options* options, int64_t t);

/* "constant", "linear", "cosine" or "wsd". */
const char* st_plan_lr_schedule_name(int schedule);

/* The steps at the end of the run over which linear and wsd decay
 * (linear: every step after the warm-up; wsd: decay_fraction of them,
 * rounded to nearest, at least 1); 0 for constant and cosine. */
int64_t st_plan_lr_decay_steps(const st_plan_options* options);

/* The schedule's definition as the checkpoint manifest records it in its
 * "lr_schedule" object (docs/checkpoints.md): "schedule", "peak_lr",
 * "warmup_steps", "total_steps", and what the schedule uses of
 * "min_lr_ratio", "decay_fraction", "decay_steps". A new object. */
st_json* st_plan_lr_schedule_json(const st_plan_options* options);

/* |base| with the schedule that |record| (a manifest's "lr_schedule")
 * defines, into |out| (a shallow copy, only for st_plan_lr; never deinit
 * it). False when |record| holds no definition (written before schedules
 * were recorded) or one strata cannot read. */
bool st_plan_lr_schedule_from_json(const st_json* record, const st_plan_options* base, st_plan_options* out);

/*===-------------------------------------------------------------------===*/
/* Opening a run's bundle and runtime (src/plan/open.c)                      */
/*===-------------------------------------------------------------------===*/

/* What a command asks of st_plan_open. Zero-initialised means: no export
 * progress, no stop signal, no mesh check. */
typedef struct st_plan_open_options {
  bool progress;       /* a cold export shows progress when run.progress says so (options->long_progress) */
  /* Polled while a cold export runs (st_stop_signal; NULL: never): a
   * stop signal ends the exporter at once (train: exit 8, nothing saved). */
  int (*stop)(void);
  bool check_mesh;     /* the mesh's device count against the plugin's devices (exit 2) */
} st_plan_open_options;

/* What is open. Owned by the struct; st_plan_close releases it. */
typedef struct st_plan_opened {
  st_bundle* bundle;    /* owned */
  st_runtime* runtime;  /* owned; NULL until st_plan_open_runtime */
  bool exported;        /* the bundle was exported by this open */
  bool calls_kernels;   /* its programs call strata's FFI kernels: the handlers are registered with the client */
  /* The process's memory just before and after the client was created:
   * what the plugin adds (the trainer's `memory` events). */
  st_mem_usage mem_before_runtime, mem_after_runtime;
} st_plan_opened;

/* The whole opening sequence, in the one order every command uses: the
 * bundle for options->model_json and options->mesh (exported when missing
 * or stale; exit 4 on an exporter or manifest error), its kernels checked
 * against strata's handlers (exit 4), the handlers registered when its
 * programs call them, the runtime (options->runtime, its executable cache
 * under options->cache_root), the kernel platform check (exit 4) and, when
 * asked, the mesh check (exit 2). Sets options->runtime's ffi_targets and
 * cache_dir (freed by st_plan_options_deinit). |out| is zeroed first; on
 * error it holds what was opened: st_plan_close it either way. */
st_status st_plan_open(st_plan_options* options, const st_plan_open_options* how, st_plan_opened* out);
/* The first half: the bundle and its kernel check (|out| zeroed by the
 * caller). For commands that need no runtime (export, plan). */
st_status st_plan_open_bundle(st_plan_options* options, const st_plan_open_options* how, st_plan_opened* out);
/* The second half, after st_plan_open_bundle, or alone (out->bundle NULL,
 * out->calls_kernels set by the caller) for a program without a bundle
 * (strata repro) or a command that needs only the plugin. */
st_status st_plan_open_runtime(st_plan_options* options, const st_plan_open_options* how, st_plan_opened* out);
void st_plan_close(st_plan_opened* opened); /* NULL is a no-op */

/* Tags the trainer's callbacks use to recognise H2D / READ / HOST ops. */
enum {
  ST_TAG_TOKENS = 1,
  ST_TAG_TARGETS,
  ST_TAG_MASK,
  ST_TAG_STEP,
  ST_TAG_LR,
  ST_TAG_GSCALE,
  ST_TAG_HYPER,
  ST_TAG_LOSS,
  ST_TAG_SQNORM,
  ST_TAG_CLIP,
  ST_TAG_EVAL_TOKENS,
  ST_TAG_EVAL_TARGETS,
  ST_TAG_EVAL_MASK,
  ST_TAG_EVAL_LOSS,
  ST_TAG_SCHEDULE, /* HOST: lr and gscale before the backward (sched.optimizer=per_layer) */
  /* READ, diag.numerics: a group instance's update_stats (micro = the
   * instance), a block's output and its input gradient's act_stats. */
  ST_TAG_NUM_OPT,
  ST_TAG_NUM_OUT,
  ST_TAG_NUM_DX,
  /* H2D, data.packing=pack: each token's position in its document
   * (docs/data.md); one per stage that runs blocks. */
  ST_TAG_POSITIONS,
  ST_TAG_EVAL_POSITIONS,
  /* READ: ST_TAG_METRIC + s is the block metric st_plan_block_metrics
   * lists s-th (docs/bundle.md, "Block metrics"); keep it last. */
  ST_TAG_METRIC,
};

/* Block metrics: outputs of role "metric" that a layer's fwd and fwd_res
 * return right after y (an auxiliary loss, expert loads). At most
 * ST_PLAN_MAX_METRICS distinct names over all layers. */
#define ST_PLAN_MAX_METRICS 16
/* The number of metric outputs right after y of |p|'s outputs. */
int st_plan_metric_outputs(const st_bundle_program* p);
/* The distinct metric names of |bundle|'s layers, first seen first (layer
 * order, then output order): fills |names| (borrowed from the bundle; may
 * be NULL) and |ranks| (each metric's tensor rank: 0 a scalar, 1 a vector;
 * may be NULL) and returns how many. */
int st_plan_block_metrics(const st_bundle* bundle, const char** names, int* ranks);
/* Bytes of the optimizer state of layer |layer|'s parameters, whole
 * tensors: its group's update program's state inputs (docs/scheduling.md,
 * "Optimizer state"), a state of its parameter's type counted at the
 * whole parameter's bytes (AdamW: twice the parameters). */
int64_t st_plan_layer_state_bytes(const st_bundle* bundle, int layer);

/* What sched.remat chose for the step plan, and why (docs/scheduling.md,
 * "sched.remat=auto"). */
typedef struct st_plan_remat_choice {
  bool automatic;          /* sched.remat=auto */
  int layers;              /* blocks */
  bool* remat;             /* [layers]: the layers that recompute (owned) */
  int recomputed;          /* how many do */
  int64_t budget;          /* auto: sched.memory_budget in bytes per device; 0: no limit */
  double budget_fraction;  /* auto: the budget as configured, a fraction of device_memory; 0 when given in bytes */
  int64_t device_memory;   /* auto: the device memory the fraction is of (0: not reported) */
  int64_t predicted_peak;  /* the chosen step plan's predicted peak live bytes per device */
  int64_t none_peak;       /* auto: the same without any remat */
  bool fits;               /* auto: predicted_peak <= budget, or no budget */
  int plans_built;         /* auto: candidate step plans predicted to choose */
  char why[256];           /* auto: one sentence: budget, peak, choice */
} st_plan_remat_choice;
void st_plan_remat_choice_deinit(st_plan_remat_choice* choice); /* frees remat; NULL is a no-op */
/* The recomputing layers as text: "none", "full" or "0,1,3" (ending in
 * ",..." when they do not fit |size|). */
void st_plan_remat_text(const bool* remat, int layers, char* out, size_t size);

/* The choice as the plan event's "remat" object (docs/scheduling.md): a
 * new reference owned by the caller. */
st_json* st_plan_remat_choice_json(const st_plan_remat_choice* choice);

/* Predicts the step plan's peak live bytes per device for the layers
 * |remat| (one flag a block). */
typedef st_status (*st_plan_remat_peak_fn)(void* user, const bool* remat, int64_t* out_peak);

/* sched.remat=auto (src/plan/remat_auto.c): fills |out_choice| (and its
 * remat[layers], owned by it) with the fewest recomputing layers whose
 * plan's predicted peak, as |peak| predicts it, is within |budget| bytes
 * (0: no limit, so none); when even every layer does not fit, every layer,
 * with fits = false. Candidates are the lowest k layers (their residuals
 * live longest), k found by binary search (docs/scheduling.md). Fills
 * automatic, layers, remat, recomputed, budget, predicted_peak, none_peak,
 * fits, plans_built and why. */
st_status st_plan_remat_auto(int layers, int64_t budget, st_plan_remat_peak_fn peak, void* user,
                              st_plan_remat_choice* out_choice);

/* Builds the training-step plan and the evaluation plan for |bundle|.
 * sched.remat=auto chooses the layers here (st_plan_remat_auto); a
 * fractional sched.memory_budget needs options->device_memory (exit 2
 * naming the key when it is 0). |out_choice| (may be NULL) gets what
 * sched.remat chose and why; the caller deinits it, also after an error. */
st_status st_plan_build(const st_bundle* bundle, const st_plan_options* options, st_plan* out_step, st_plan* out_eval,
                        st_plan_remat_choice* out_choice);

/* Compiles (through the executable cache of |runtime|) every program
 * |plans| use and sets each plan's program_temps from XLA's analyses
 * (st_plan_set_program_temps): what `strata plan --compile` shows. */
st_status st_plan_compile_temps(st_runtime* runtime, const st_bundle* bundle, st_plan* const* plans, int plan_count);

/* Will it fit (src/plan/fit.c; docs/scheduling.md, "Will it fit"). */
typedef struct st_plan_fit_candidate {
  char policy[96];      /* the step plan's policy line, or the overrides of an alternative */
  int64_t peak;         /* predicted peak device bytes per device: live slots + the running program's temporaries */
  int64_t slots_peak;   /* the slots alone (st_plan_predict_live) */
  int64_t temps;        /* the temporaries at the peak */
  int64_t host_bytes;   /* host bytes strata holds: offload homes + checkpoint staging */
  int64_t host_homes, ckpt_staging;
  bool ckpt_chunked;    /* ckpt.staging resolves to chunked */
  int64_t need;         /* what is compared with the limit: |peak|, or on the host peak x devices + host_bytes */
  bool fits;            /* need <= the limit (or the limit is unknown) */
} st_plan_fit_candidate;
typedef struct st_plan_fit_report {
  int64_t limit;          /* device memory per device, or (host) the bytes this run may take of the host; 0: unknown */
  char limit_source[160]; /* "the PJRT plugin (bytes_limit)", "runtime.device_memory_bytes" or the host's memory */
  /* The limit is the host's memory (a plugin whose device memory is host
   * memory, no bytes_limit and no runtime.device_memory_bytes): |limit| is
   * the host's available memory less |kept_free|, and each candidate's
   * need is its peak on each of |devices| devices plus its host bytes. */
  bool host;
  int devices;
  st_host_memory host_memory;
  int64_t kept_free;
  bool fits;
  st_plan_fit_candidate current;
  int candidate_count;
  st_plan_fit_candidate candidates[8]; /* alternatives, when |current| does not fit */
} st_plan_fit_report;
/* The host's share that a run whose device memory is host memory leaves
 * free: the larger of 10 % of the host's memory and 1 GiB, but never more
 * than half of what is available (docs/scheduling.md, "Will it fit"). */
int64_t st_plan_host_kept_free(const st_host_memory* host);
/* ckpt.staging resolved: whether saves stream (chunked) for a state of
 * |state_bytes| on |runtime| (auto: a CPU plugin, or over a quarter of the
 * host's memory). */
bool st_plan_ckpt_streams(const st_plan_options* options, st_runtime* runtime, int64_t state_bytes);

/* Predicts |step| (its program_temps set: st_plan_compile_temps) against the
 * device memory (the plugin's, else options->device_memory_config, else,
 * where the device memory is host memory, the host's available memory less
 * st_plan_host_kept_free) and, when it does not fit and |candidates|, the
 * same bundle's plans with sched.remat=full and sched.offload=optimizer/both
 * (compiled through |runtime|'s cache). One-device plans only get
 * alternatives. */
st_status st_plan_fit(st_runtime* runtime, const st_bundle* bundle, const st_plan_options* options,
                       const st_plan* step, bool candidates, st_plan_fit_report* out);
st_json* st_plan_fit_json(const st_plan_fit_report* report);
void st_plan_fit_print(const st_plan_fit_report* report, FILE* out);
/* ST_OK when it fits or the memory is unknown; else ST_CODE_MEMORY (exit
 * 4, not restarted by strata run) naming the predicted need, the limit and
 * the alternatives that fit. */
st_status st_plan_fit_status(const st_plan_fit_report* report, const st_plan_options* options);

/* What a path names for the commands that use a trained model (strata
 * eval, strata sample): the run, its config and the parameters to load.
 * Strings owned (st_plan_trained_ref_deinit). */
/* What trained parameters were trained as (docs/checkpoints.md, "Identity"). */
typedef struct st_plan_record {
  st_json* model;        /* owned: the recorded model description; NULL: not recorded */
  char* tokenizer_hash; /* owned: the recorded tokenizer; NULL: not recorded */
  char* source;         /* owned: the file read (a checkpoint's manifest.json, context.json, nonfinite.json); NULL: none */
  const char* label;    /* static: how messages name it ("in the checkpoint") */
  /* borrowed: a config.yaml taken as the model's record when |model| is
   * NULL (a run or bundle written before the description was recorded) */
  const char* fallback_config;
} st_plan_record;
void st_plan_record_deinit(st_plan_record* record); /* NULL is a no-op */

typedef struct st_plan_trained_ref {
  char* run_dir;     /* the run directory (absolute) */
  char* config_path; /* <run_dir>/config.yaml */
  char* params_path; /* the params.safetensors to load */
  int64_t step;      /* optimizer steps the parameters hold; -1 when no record says */
  st_plan_record record; /* the checkpoint's manifest, or context.json for the final parameters */
} st_plan_trained_ref;

/* |path| names a run directory (it holds config.yaml) or one checkpoint
 * folder (it holds manifest.json; its run is two levels up,
 * <run>/checkpoints/step_N). A run directory gives its newest checkpoint
 * that verifies (invalid ones skipped, as a resume does), unless the run's
 * final <run>/params.safetensors is newer (its last "run_done" event
 * counts more steps) or there is no valid checkpoint; a checkpoint folder
 * gives that checkpoint, verified. Errors: a path that is missing or
 * neither (ST_CODE_CONFIG, exit 2, naming the path and what was looked
 * for), or that has nothing to load yet (exit 2); a named checkpoint
 * that fails verification, or a run whose every checkpoint does and that
 * has no final parameters (ST_CODE_CKPT, exit 7).
 * |out| is zeroed first and left zeroed on error. */
st_status st_plan_locate_trained(const char* path, st_plan_trained_ref* out);
/* The tokenizer hash the options would give their tokens, known before
 * any data is read: "none" (data.synthetic), "byte", or for bpe the hash of
 * |tokenizer_json| (the tokenizer that will be applied; a missing file is
 * ST_CODE_DATA naming it); "" when bpe and |tokenizer_json| is NULL. */
st_status st_plan_given_tokenizer(const st_plan_options* options, const char* tokenizer_json, char out[65]);
/* The identity check of eval, sample and repro: |record| (a missing model
 * description read from record->fallback_config) against |given|'s model
 * description and |given_tokenizer| ("" or NULL: not compared), through
 * st_ckpt_identity_check (model.microbatch_size not compared). |allow|:
 * --allow-mismatch; |fix|: the end of a mismatch's message. *out_report
 * (caller owns; also on a mismatch) is the check's report plus
 * "recorded_in" (and "model_recorded_in" when the fallback was read).
 * Mismatch: ST_CODE_CKPT (exit 7). */
st_status st_plan_check_identity(const st_plan_record* record, const st_plan_options* given, const char* given_tokenizer,
                                  const char* allow, const char* fix, st_json** out_report /* owned by caller */);
void st_plan_trained_ref_deinit(st_plan_trained_ref* ref); /* frees the strings; NULL is a no-op */
/* The likely fix of an identity mismatch in eval, sample and repro (the
 * end of its message): drop the override, or --allow-mismatch. */
extern const char* const st_plan_identity_fix;

/* A pipeline plan's schedule replayed with measured task durations
 * (|seconds|: one per st_plan.pipe_tasks entry, e.g. each task's launches'
 * summed run time): every task starts once its stage is free and its
 * inputs exist, as with one device per stage and free transfers. Returns
 * the bubble, 1 - the tasks' summed time / (stages x the makespan), and
 * the makespan in |out_makespan| (may be NULL); 0 without a pipeline. */
double st_plan_pipeline_replay(const st_plan* plan, const double* seconds, double* out_makespan);

/* A pipeline plan's bubble as its schedule's simulation predicted it (1 -
 * the tasks' summed time / (stages x the makespan)), the theory for equal
 * stages in |out_theory| ((P-1)/(M+P-1); with V chunks a stage
 * (P-1)/(V M + P-1)) and the makespan in |out_makespan| (either may be
 * NULL); all 0 without a pipeline. */
double st_plan_pipeline_bubble(const st_plan* plan, double* out_theory, double* out_makespan);

/* `strata plan --explain` (docs/parallelism.md): the mesh, every tensor of
 * the step plan with its sharding, the collectives per layer with their
 * message and ring wire bytes, predicted per-device memory by category and
 * the communication volume per step; every tensor listed (returned, owned
 * by the caller). |step| and |eval| are the finalized plans built from |o|. */
st_json* st_plan_explain_json(const st_plan* step, const st_plan* eval, const st_plan_options* o);
/* The same for a screen: tensors grouped by category, sharding and name
 * pattern. |j| is st_plan_explain_json's result for |step|. */
void st_plan_explain_print(const st_plan* step, const st_json* j, FILE* out);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_PLAN_H */
