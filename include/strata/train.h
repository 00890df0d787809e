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
#include "strata/plan.h"
#include "strata/runtime.h"
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
  bool injected;                  /* faults.nan_at put the value there: the replay puts it there again */
  st_json* identity;               /* owned: the identity check's report (st_repro_result_deinit) */
  int injected_value;             /* faults.nan_value: 0 nan, 1 inf, 2 max */
  bool calls_kernels;             /* the program calls strata's ffi kernels (custom_call @strata_...) */
} st_repro_result;
/* The config of the replay: |overrides| (key=value, borrowed) on the
 * bundle's config.yaml (a runtime.* to replay elsewhere), and |allow|
 * (--allow-mismatch) for identity fields let differ. */
typedef struct st_repro_options {
  int n_overrides;
  char** overrides;
  const char* allow;
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

/* Runs `strata train`: the whole lifecycle. Prints the run directory. */
st_status st_train_main(const st_config* config);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_TRAIN_H */
