/* pipeline.c — pipeline schedules as task orders (docs/parallelism.md,
 * "Pipeline"). A schedule says, for each stage, in which order it runs
 * its microbatches' forwards and backwards through the model chunks it
 * holds; a small simulation then merges the stages' sequences into the one
 * order the plan issues ops in, and predicts the step's time and bubble
 * from each chunk's cost. The plan builder (step_plan.c) turns each task
 * into ops; `strata plan --explain` draws the simulated grid.
 *
 * The stage sequences are the published ones: GPipe (Huang et al. 2019:
 * every forward, then every backward), 1F1B (PipeDream-Flush, Narayanan et
 * al. 2021: P-1-s warm-up forwards on stage s, then one forward and one
 * backward alternately, then the remaining backwards) and interleaved 1F1B
 * (Megatron-LM, Narayanan et al. 2021: stage s holds chunks s, s+P, ...,
 * and microbatches go through them in groups of P). Backwards run in
 * microbatch order on every stage, so each gradient accumulates its
 * microbatches in the same order a single device does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_internal.h"
#include "strata/base.h"
#include "strata/plan.h"

/* One entry of a stage's sequence: local chunk |v|, microbatch |m|. */
typedef struct {
  int v, m;
  bool backward;
} st__step;

/* Stage |s|'s sequence (M x V x 2 entries into |q|). */
static void st__sequence(int kind, int P, int V, int M, int s, st__step* q) {
  int n = 0;
  if (kind == ST_PLAN_PIPE_GPIPE) {
    for (int m = 0; m < M; ++m) q[n++] = (st__step){0, m, false};
    for (int m = 0; m < M; ++m) q[n++] = (st__step){0, m, true};
    return;
  }
  if (kind == ST_PLAN_PIPE_1F1B) {
    int w = P - 1 - s < M ? P - 1 - s : M;
    for (int m = 0; m < w; ++m) q[n++] = (st__step){0, m, false};
    for (int i = 0; i < M - w; ++i) {
      q[n++] = (st__step){0, w + i, false};
      q[n++] = (st__step){0, i, true};
    }
    for (int m = M - w; m < M; ++m) q[n++] = (st__step){0, m, true};
    return;
  }
  /* Interleaved: the k-th forward of the stage is microbatch
   * (k / PV) P + k % P through local chunk (k % PV) / P; the k-th backward
   * the same microbatch through the chunks in reverse. */
  const int total = M * V, group = P * V;
  int warm = M == P ? total : (P - s - 1) * 2 + (V - 1) * P;
  if (warm > total) warm = total;
#define ST__FWD(k) ((st__step){((k) % group) / P, ((k) / group) * P + (k) % P, false})
#define ST__BWD(k) ((st__step){V - 1 - ((k) % group) / P, ((k) / group) * P + (k) % P, true})
  for (int k = 0; k < warm; ++k) q[n++] = ST__FWD(k);
  for (int k = 0; k < total - warm; ++k) {
    q[n++] = ST__FWD(warm + k);
    q[n++] = ST__BWD(k);
  }
  for (int k = total - warm; k < total; ++k) q[n++] = ST__BWD(k);
#undef ST__FWD
#undef ST__BWD
}

/* Index of (micro, chunk, direction) in the done table. */
static int st__key(int C, int m, int c, bool backward) { return (m * C + c) * 2 + (backward ? 1 : 0); }

/* When the task's inputs exist (its dependencies' end), or -1 when one of
 * them has not been scheduled yet. */
static double st__ready(const double* done, int C, int m, int c, bool backward) {
  double t = 0;
  if (!backward && c > 0) t = done[st__key(C, m, c - 1, false)];
  if (backward) {
    double f = done[st__key(C, m, c, false)];
    double b = c < C - 1 ? done[st__key(C, m, c + 1, true)] : 0;
    if (f < 0 || b < 0) return -1;
    t = f > b ? f : b;
  }
  return t;
}

st_status st_pipe_schedule_make(int kind, int P, int V, int M, const double* fwd, const double* bwd,
                                st_pipe_schedule* out) {
  memset(out, 0, sizeof(*out));
  if (P < 1 || V < 1 || M < 1 || P > ST_PLAN_MAX_STAGES || (kind != ST_PLAN_PIPE_INTERLEAVED && V != 1) ||
      (kind == ST_PLAN_PIPE_INTERLEAVED && M % P != 0))
    return st_status_make(ST_CODE_CONFIG, "pipeline schedule: %d stages x %d chunks with %d microbatches is not a "
                          "shape this schedule takes", P, V, M);
  const int C = P * V, per = 2 * M * V, n = 2 * M * C;
  st__step* seq = st_xcalloc((size_t)P * (size_t)per, sizeof(st__step));
  for (int s = 0; s < P; ++s) st__sequence(kind, P, V, M, s, seq + (size_t)s * per);
  double* done = st_xmalloc((size_t)n * sizeof(double));
  for (int k = 0; k < n; ++k) done[k] = -1;
  int* at = st_xcalloc((size_t)P, sizeof(int));
  double* free_at = st_xcalloc((size_t)P, sizeof(double));
  out->tasks = st_xcalloc((size_t)n, sizeof(st_pipe_task));
  out->P = P, out->V = V, out->M = M, out->C = C;
  st_status s = ST_OK;
  /* List scheduling: of the stages whose next task's inputs exist, the one
   * that can start it earliest goes next (ties: the lower stage). */
  while (out->n < n) {
    int best = -1;
    double best_start = 0;
    for (int st = 0; st < P; ++st) {
      if (at[st] == per) continue;
      const st__step* q = &seq[(size_t)st * per + at[st]];
      double r = st__ready(done, C, q->m, q->v * P + st, q->backward);
      if (r < 0) continue;
      double start = r > free_at[st] ? r : free_at[st];
      if (best < 0 || start < best_start) best = st, best_start = start;
    }
    if (best < 0) {
      s = st_status_make(ST_CODE_INTERNAL, "pipeline schedule %d (%d stages, %d chunks, %d microbatches) deadlocks",
                         kind, P, V, M);
      break;
    }
    const st__step* q = &seq[(size_t)best * per + at[best]++];
    const int c = q->v * P + best;
    const double cost = q->backward ? (bwd ? bwd[c] : 2.0) : (fwd ? fwd[c] : 1.0);
    st_pipe_task* t = &out->tasks[out->n++];
    *t = (st_pipe_task){.stage = best, .chunk = c, .micro = q->m, .backward = q->backward, .start = best_start,
                        .end = best_start + cost};
    done[st__key(C, q->m, c, q->backward)] = t->end;
    free_at[best] = t->end;
    out->busy += cost;
    if (t->end > out->makespan) out->makespan = t->end;
  }
  free(seq);
  free(done);
  free(at);
  free(free_at);
  if (s) {
    st_pipe_schedule_free(out);
    return s;
  }
  out->bubble = out->makespan > 0 ? 1.0 - out->busy / ((double)P * out->makespan) : 0;
  out->theory = kind == ST_PLAN_PIPE_INTERLEAVED ? (double)(P - 1) / ((double)V * M + P - 1)
                                                 : (double)(P - 1) / (double)(M + P - 1);
  return ST_OK;
}

void st_pipe_schedule_free(st_pipe_schedule* s) {
  free(s->tasks);
  memset(s, 0, sizeof(*s));
}

void st_pipe_balance(int L, int C, const double* cost, double first_extra, double last_extra, int* out_first) {
  /* best[c][l]: the least largest-chunk cost of layers [0, l) in c+1
   * chunks; cut[c][l]: where the last of them starts. */
  double* pre = st_xcalloc((size_t)L + 1, sizeof(double));
  for (int l = 0; l < L; ++l) pre[l + 1] = pre[l] + cost[l];
  double* best = st_xmalloc((size_t)C * (size_t)(L + 1) * sizeof(double));
  int* cut = st_xcalloc((size_t)C * (size_t)(L + 1), sizeof(int));
#define ST__AT(a, c, l) (a)[(size_t)(c) * (size_t)(L + 1) + (size_t)(l)]
  for (int c = 0; c < C; ++c)
    for (int l = 0; l <= L; ++l) {
      ST__AT(best, c, l) = INFINITY;
      if (c == 0) {
        if (l >= 1) ST__AT(best, 0, l) = pre[l] + first_extra + (C == 1 ? last_extra : 0);
        continue;
      }
      for (int k = c; k < l; ++k) { /* the last chunk is [k, l) */
        double chunk = pre[l] - pre[k] + (c == C - 1 ? last_extra : 0);
        double worst = fmax(ST__AT(best, c - 1, k), chunk);
        if (worst < ST__AT(best, c, l)) ST__AT(best, c, l) = worst, ST__AT(cut, c, l) = k;
      }
    }
  out_first[C] = L;
  for (int c = C - 1, l = L; c > 0; --c) l = out_first[c] = ST__AT(cut, c, l);
  out_first[0] = 0;
#undef ST__AT
  free(pre);
  free(best);
  free(cut);
}

double st_plan_pipeline_replay(const st_plan* plan, const double* seconds, double* out_makespan) {
  const int P = plan->stages, C = plan->pipe_chunks, n = plan->pipe_task_count;
  if (out_makespan) *out_makespan = 0;
  if (P <= 1 || n <= 0 || C <= 0) return 0;
  int M = 0;
  for (int k = 0; k < n; ++k)
    if (plan->pipe_tasks[k].micro + 1 > M) M = plan->pipe_tasks[k].micro + 1;
  double* done = st_xcalloc((size_t)(2 * M * C), sizeof(double));
  double* free_at = st_xcalloc((size_t)P, sizeof(double));
  double makespan = 0, busy = 0;
  /* The plan's order is a topological order of the tasks: one pass. */
  for (int k = 0; k < n; ++k) {
    const st_plan_pipe_task* t = &plan->pipe_tasks[k];
    double ready = st__ready(done, C, t->micro, t->chunk, t->backward);
    double start = ready > free_at[t->stage] ? ready : free_at[t->stage];
    double end = start + (seconds[k] > 0 ? seconds[k] : 0);
    done[st__key(C, t->micro, t->chunk, t->backward)] = end;
    free_at[t->stage] = end;
    busy += end - start;
    if (end > makespan) makespan = end;
  }
  free(done);
  free(free_at);
  if (out_makespan) *out_makespan = makespan;
  return makespan > 0 ? 1.0 - busy / ((double)P * makespan) : 0;
}

double st_plan_pipeline_bubble(const st_plan* plan, double* out_theory, double* out_makespan) {
  const int P = plan->stages, n = plan->pipe_task_count;
  double makespan = 0, busy = 0;
  int M = 0;
  for (int k = 0; k < n; ++k) {
    const st_plan_pipe_task* t = &plan->pipe_tasks[k];
    if (t->end > makespan) makespan = t->end;
    busy += t->end - t->start;
    if (t->micro + 1 > M) M = t->micro + 1;
  }
  const bool pipe = P > 1 && n > 0;
  const int V = pipe ? plan->pipe_chunks / P : 1;
  if (out_theory)
    *out_theory = !pipe  ? 0
                  : V > 1 ? (double)(P - 1) / ((double)V * M + P - 1)
                          : (double)(P - 1) / (double)(M + P - 1);
  if (out_makespan) *out_makespan = pipe ? makespan : 0;
  return pipe && makespan > 0 ? 1.0 - busy / ((double)P * makespan) : 0;
}
