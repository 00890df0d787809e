/*
 * strata/train.h — the training lifecycle (docs/design.md §3, "train"):
 * init -> compile -> run -> evaluate -> save, every transition an event in
 * <run>/events.jsonl.
 *
 * One step, top to bottom (src/plan/step_plan.c builds it as a plan from
 * the bundle's program tables; docs/architecture.md shows what it emits):
 *   batch -> embed fwd -> block fwd (remat layers) or fwd_res x L
 *   -> head loss (loss + head grads + dx) -> per block in reverse:
 *   [RECOMPUTE fwd_res] bwd_res -> embed bwd -> (accumulate over
 *   microbatches) -> squared norms -> clip scale on the host -> adamw per
 *   group instance (or, with sched.optimizer=per_layer, each instance's
 *   update inside the last backward).
 */
#ifndef STRATA_TRAIN_H
#define STRATA_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/config.h"
#include "strata/infer.h"
#include "strata/ir.h"
#include "strata/plan.h"
#include "strata/runtime.h"
#include "strata/sched.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Model FLOPs of one token of a training step, bench/flops.py's formula:
 * 3 x (2 x (the layers' matrix elements: the parameter table's rank-2
 * tensors, a rank-3 stack of experts as one) + n_layers x 4 seq_len d +
 * 2 d vocab); for llama 3 x (n_layers x (2 (4 d^2 + 3 d d_ff) + 4 seq_len d)
 * + 2 d vocab). The one formula of the summary, metrics.jsonl's mfu and
 * `strata analyze`. */
double st_train_model_flops_per_token(const st_bundle* bundle);

/* The peak a run's MFU is measured against, per device (src/train/mfu.c). */
typedef struct st_train_peak {
  double flops_per_s; /* 0: none */
  double bytes_per_s; /* memory bandwidth; 0: not measured */
  char source[16];    /* "config", "datasheet", "doctor", "train" (measured by a run), "none" */
  char detail[160];   /* which datasheet, which measurement, or why there is none */
} st_train_peak;

/* Resolves the peak for |runtime|'s device 0: |override_flops| > 0
 * (obs.peak_flops) first, then a datasheet figure for a known device
 * kind, then the measurement stored under |cache_root| for this plugin and
 * device kind, then, when |measure|, a measurement now (stored). Never
 * fails: no peak is source "none" with the reason in detail. */
void st_train_peak_resolve(st_runtime* runtime, const char* cache_root, double override_flops, bool measure,
                           st_train_peak* out);
/* {"flops_per_s", "bytes_per_s" (null when 0), "devices", "source",
 * "detail"}: a new reference, owned by the caller. */
st_json* st_train_peak_json(const st_train_peak* peak, int devices);

/* What `strata eval` measured (docs/using.md, "strata eval"). */
typedef struct st_eval_result {
  double loss;          /* mean cross-entropy per token, nats */
  int64_t eval_batches, batch_size, seq_len;
  int64_t sequences;    /* eval_batches x batch_size */
  int64_t tokens;       /* sequences x seq_len: the predictions averaged */
  bool bytes;           /* text tokens (not data.synthetic): bits per byte apply */
  double bytes_per_token; /* of the validation split: 1 for the byte tokenizer, more for BPE; 0: synthetic */
  char* data_path;      /* data.path ("" = the default corpus; owned) */
  char* token_file;     /* the token file evaluated (owned) */
  int64_t split_tokens; /* tokens in its validation split */
  double seconds;       /* data, bundle, compile and evaluation */
  st_json* identity;     /* owned: the identity check's report (st_plan_check_identity), also on a mismatch */
} st_eval_result;

/* Evaluates the parameters in |params_path| (a safetensors file, whole
 * tensors) on |cfg|'s validation split exactly as `strata train` does
 * every train.eval_every steps: train.eval_batches batches of
 * train.batch_size sequences, the same ones every time, the loss averaged
 * over the microbatches. One device: parallel.* must be 1 (exit 2);
 * sched.offload is ignored (the parameters load into device slots). A
 * parameter missing or of another shape: ST_CODE_CKPT (exit 7) naming it.
 * With data.tokenizer=bpe the corpus is tokenized with |tokenizer_json|
 * (the run's; a missing one is ST_CODE_DATA), never a newly trained
 * vocabulary, and a token file must be of that tokenizer (exit 3); other
 * tokenizers ignore it. Before any of that, |cfg|'s model and tokenizer
 * are checked against what |ref| records (st_plan_check_identity; |allow|
 * is --allow-mismatch): a mismatch is ST_CODE_CKPT (exit 7).
 * |out| is filled on success; st_eval_result_deinit it either way. */
st_status st_train_evaluate(const st_config* cfg, const st_plan_trained_ref* ref, const char* allow, st_eval_result* out);
void st_eval_result_deinit(st_eval_result* result);

/* `strata repro DIR` (src/train/repro.c, docs/diagnostics.md): the program
 * of a non-finite bundle (<run>/diag/nonfinite-step<N>/) replayed alone on
 * its saved inputs, twice, on the runtime of the bundle's config.yaml. */
typedef struct st_repro_result {
  char program[128], output[64]; /* the recorded program and output */
  int runs, runs_nonfinite;       /* replays, and those whose output had a non-finite element */
  int64_t nonfinite, elements;    /* the most non-finite elements of one replay, of so many */
  bool reproduces;                /* every replay was non-finite: deterministic */
  bool repeatable;                /* the replays' outputs were bitwise equal */
  int input_stats_checked;        /* inputs whose recorded golden statistics (nonfinite.json input_stats) the
                                   * saved ones have, all of them or the replay stops (exit 2); -1: none recorded */
  bool injected;                  /* faults.nan_at put the value there: the replay puts it there again */
  st_json* identity;               /* owned: the identity check's report (st_repro_result_deinit) */
  int injected_value;             /* faults.nan_value: 0 nan, 1 inf, 2 max */
  bool calls_kernels;             /* the program calls strata's ffi kernels (custom_call @strata_...) */
  /* --perf (options->perf_runs > 0): that many timed launches after one
   * untimed, each from its inputs ready to its outputs ready; the recorded
   * figure is nonfinite.json's launch_time.seconds (< 0: none recorded). */
  int perf_runs;
  double perf_median_s, perf_min_s, perf_max_s, perf_p10_s, perf_p90_s;
  double perf_recorded_s;
} st_repro_result;
/* The config of the replay: |overrides| (key=value, borrowed) on the
 * bundle's config.yaml (a runtime.* to replay elsewhere), and |allow|
 * (--allow-mismatch) for identity fields let differ. */
typedef struct st_repro_options {
  int n_overrides;
  char** overrides;
  const char* allow;
  int perf_runs; /* --perf: timed launches (0: none) */
} st_repro_options;
/* |options| may be NULL (none). The given config's tokenizer and model
 * are checked against nonfinite.json's record (st_plan_check_identity;
 * a bundle without one: against its config.yaml): the program replayed is
 * the recorded one whatever the config says, so a difference is refused
 * (ST_CODE_CKPT, exit 7) unless allowed; out->identity gets the report.
 * Errors: DIR not a bundle, a file missing, altered (sha256) or malformed,
 * an override that does not validate: ST_CODE_CONFIG (exit 2); runtime or
 * compile: exit 4. */
st_status st_train_repro(const char* dir, const st_repro_options* options, st_repro_result* out);
void st_repro_result_deinit(st_repro_result* result); /* frees identity */

/* What run directory |dir| is doing or how it ended (`strata status`,
 * docs/design.md §6), as a new object (*out, owned by the caller): state
 * (running with its pid, finished, interrupted, failed) with exit code,
 * class, error and signal; step, total steps, loss, tokens/s, mean step
 * time, ETA, live metrics URL; the newest valid checkpoint; the lock's
 * holder. Reads the logs' tails only and probes the lock without taking
 * it: a live run is not disturbed. A torn last line of a finished run is
 * warned about on stderr. A folder that is no run directory: ST_CODE_CONFIG. */
st_status st_train_run_status(const char* dir, st_json** out);

/* ---------------------------------------------------------- `strata analyze`
 * What `strata analyze` computes (src/train/analyze.c; src/cli/ prints it,
 * docs/analysis.md). */

/* A bundle directory (manifest.json), or a run directory (config.yaml):
 * its bundle (the same key, exported when missing) and its rebuilt step
 * plan. Everything is owned. */
typedef struct st_train_analyze_target {
  bool is_bundle, is_run;
  st_bundle* bundle;
  st_config* cfg;
  st_plan_options o; /* is_run */
  bool have_opts;
  st_plan step, eval; /* is_run: the plans the run built */
  st_plan_remat_choice remat;
} st_train_analyze_target;

/* Opens |dir|; a folder that is neither is ST_CODE_CONFIG (exit 2). |t|
 * must be closed either way. */
st_status st_train_analyze_target_open(const char* dir, st_train_analyze_target* t);
void st_train_analyze_target_close(st_train_analyze_target* t);

/* One program or collective of the bundle, analyzed. */
typedef struct st_train_analyze_program {
  const char* name;      /* borrowed from the bundle */
  const char* kind;      /* "program" or "collective" */
  double manifest_flops; /* the exporter's cost analysis (0 unknown) */
  st_ir_stats st;
  char* error; /* owned; NULL when analyzed */
  double launches; /* per step (run directories) */
  const char* role;   /* forward, backward, loss, optimizer, collective, init, other */
  double measured_us; /* launch time in the run's traces, all launches together */
  double measured_n;  /* launches seen in the traces */
  double bound_us;    /* the roofline bound of one launch on this machine; 0: no peak */
  bool memory_bound;  /* its memory side is the larger */
  bool has_bound;     /* a peak is known (bound_us may be 0: nothing to do) */
  bool has_xla;       /* XLA's optimized program was kept (runtime.keep_optimized_hlo) */
  st_ir_hlo_summary xla;
  char* xla_error;    /* owned: a kept program that did not read */
} st_train_analyze_program;

/* A run directory's metrics.jsonl step lines. */
typedef struct st_train_analyze_steps {
  int count;         /* step lines read */
  double time_s;     /* mean step_time_s (steps after the first when more than one) */
  double wait_s;     /* mean wait_s: time the host waited for the device */
  double tokens;     /* tokens per step */
} st_train_analyze_steps;

/* A run directory's traces (<run>/trace/step_*.json), summed. */
typedef struct st_train_analyze_traces {
  int files;
  double span_us;   /* summed step spans (first event to last completion) */
  double wait_us;   /* host waits (WAIT, READ): time the host was blocked */
  double host_us;   /* host ops (HOST, FREE) */
  double launch_us; /* device work: launches, recomputes, collectives */
} st_train_analyze_traces;

/* The roles of a program in a step, in their order: forward, backward,
 * loss, optimizer, collective, init, other. st_train_analyze_role(r) is
 * the name of role r (a static string; NULL out of range). */
#define ST_TRAIN_ANALYZE_ROLES 7
const char* st_train_analyze_role(int r);

/* A run's step from its plan, measurements and the peak: the sums a
 * screen and --json both show, computed once. */
typedef struct st_train_analyze_totals {
  double flops, dot, read, write; /* per device, the step's launches */
  double model_flops;             /* the step's model FLOPs (run directories) */
  double devices;
  double bound_s; /* the launches' roofline bounds, per step */
  double mfu;     /* -1: unknown */
  int furthest;   /* the program furthest above its bound; -1 none */
  double role_us[ST_TRAIN_ANALYZE_ROLES]; /* measured launch time by role */
} st_train_analyze_totals;

typedef struct st_train_analyze_options {
  const char* dir; /* a bundle directory or a run directory; borrowed */
} st_train_analyze_options;

/* Everything the table and --json show. Owned by the result (programs,
 * the target) except dir, the options' borrowed path. */
typedef struct st_train_analyze_result {
  const char* dir;
  st_train_analyze_target target;
  st_train_analyze_program* programs; /* every program, then every collective */
  int program_count;
  st_train_analyze_steps steps;   /* run directories */
  st_train_analyze_traces traces; /* run directories */
  st_train_peak peak;
  st_train_analyze_totals totals;
} st_train_analyze_result;

/* Analyzes |options->dir|: every program (a program that does not read
 * carries its error), XLA's kept optimized programs, the peak and each
 * program's roofline bound; for a run directory also the launches per step
 * from its plan, its metrics and traces, and the step's totals. |out| must
 * be freed with st_train_analyze_result_free either way. */
st_status st_train_analyze(const st_train_analyze_options* options, st_train_analyze_result* out);
void st_train_analyze_result_free(st_train_analyze_result* result);
/* `strata analyze --json`'s object: a new reference, owned by the caller. */
st_json* st_train_analyze_json(const st_train_analyze_result* result);
/* FLOPs per argument and result byte (0 when it moves no bytes). */
double st_train_analyze_intensity(const st_ir_stats* stats);

/* Appends to |out| (the caller's) the DOT graph of |program|'s @main ops
 * (|path| a bundle, a run directory or an .mlir file), or with |program|
 * NULL or "" of a run directory's step plan (an .mlir file: its one program). */
st_status st_train_analyze_dot(const char* path, const char* program, st_strbuf* out);
/* Two bundles (or run directories' bundles) program by program: {"a", "b",
 * "same_key", "added", "removed", "changed" (per program the counts that
 * differ as [a, b]), "unchanged"} in *out, a new reference owned by the
 * caller (NULL on an error). */
st_status st_train_analyze_diff(const char* dir_a, const char* dir_b, st_json** out);
/* The compile-contract lint of |path| (an .mlir file; a bundle, against
 * the cache's bundle of the same key; a run directory's bundle) into |r|
 * (the caller frees it with st_lint_report_free), and in *what (owned by
 * the caller, always set) the name of what was linted. */
st_status st_train_analyze_lint(const char* path, st_lint_report* r, char** what);

/* Runs `strata train`: the whole lifecycle. Prints the run directory. */
st_status st_train_main(const st_config* config);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_TRAIN_H */
