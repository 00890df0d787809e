/* diff.h — what strata diff keeps of two runs (src/obs/diff.c reads and
 * compares them; src/obs/diff_html.c draws the page). Private to obs. */
#ifndef STRATA_OBS_DIFF_H
#define STRATA_OBS_DIFF_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/obs.h"

/* One step line of metrics.jsonl; a value the line lacks is NaN (a null
 * loss, a non-finite one, is NaN too). */
typedef struct st_diff_step {
  int64_t step;
  double loss, lr, grad_norm, tokens_per_s, step_time_s;
} st_diff_step;

/* One eval line. */
typedef struct st_diff_eval {
  int64_t step;
  double loss;
} st_diff_eval;

typedef struct st_diff_run {
  const char* dir;     /* borrowed from the caller */
  st_diff_step* steps; /* ascending by step; a resume's repeated steps replace the earlier ones */
  int64_t n_steps, cap_steps;
  st_diff_eval* evals; /* likewise */
  int64_t n_evals, cap_evals;
  int64_t step_lines, eval_lines; /* lines read, repeats included */
  bool torn;                      /* metrics.jsonl ended in an incomplete line, not read */
  st_json* config;                /* flattened resolved config: {"train.lr": 0.003, ...} in schema order */
  st_json* context;               /* flattened context.json; NULL: none */
  st_json* notes;                 /* notes.json as read (st_notes_read); NULL: none */
} st_diff_run;

/* A step present in either run: indices into each run's steps, -1 where
 * the run lacks it. */
typedef struct st_diff_union {
  int64_t step;
  int64_t a, b;
} st_diff_union;

struct st_diff {
  st_diff_run run[2];
  st_diff_options options;
  st_diff_union* all; /* the union of both runs' steps, ascending */
  int64_t n_all;
  st_json* json; /* everything strata diff --json prints */
};

/* The relative difference strata diff compares with its threshold:
 * |a - b| / max(|a|, |b|); 0 when a == b (both zero included); +inf when
 * exactly one is NaN; 0 when both are (a non-finite loss in both runs). */
double st_diff_rel(double a, double b);

#endif
