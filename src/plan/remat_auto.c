/* remat_auto.c — sched.remat=auto: which layers recompute their forward, so
 * that the step plan's predicted peak live bytes per device stays within
 * sched.memory_budget with the fewest recomputes (docs/scheduling.md,
 * "sched.remat=auto").
 *
 * The chooser sees the plan only through a peak function (the builder in
 * step_plan.c builds the candidate step plan with every policy applied and
 * predicts it), so what it weighs is exactly what `strata plan` prints and
 * the executor accounts: offload, prefetch, microbatches, data parallelism
 * and the optimizer placement all move the peak, and none of them is
 * modelled here.
 *
 * Which layers: the lowest ones. Every block runs the same programs, so
 * every layer's residuals have the same bytes, and their lifetimes nest:
 * layer l's residuals live from its forward to its backward, which runs in
 * reverse, so they outlive those of every layer above it (microbatches run
 * one after the other and free theirs). At any op the layers holding
 * residuals are therefore 0..j for some j, and recomputing layers 0..k-1
 * removes min(k, j+1) layers' residuals there: as many as any k layers
 * could, at every op at once. So for each count k the prefix 0..k-1 has
 * the lowest peak of all k-layer choices (up to the recomputed forward's
 * output, freed at once), and the chooser looks for the least k whose
 * prefix fits: binary search over k, 2 + log2(L) candidate plans, each
 * predicted exactly. Fitting is monotone in k in practice (a recompute's
 * transient output is smaller than the gradients the backward launch after
 * it writes), which the binary search relies on; were it not, the choice
 * would still fit, with perhaps more recomputes than needed. The last
 * layer comes last: it is recomputed right where the peak usually is (the
 * first backward launch), so it rarely helps, and auto leaves it out
 * whenever the others suffice. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/plan.h"

void st_plan_remat_choice_deinit(st_plan_remat_choice* c) {
  if (!c) return;
  free(c->remat);
  c->remat = NULL;
}

void st_plan_remat_text(const bool* remat, int L, char* out, size_t size) {
  int n = 0;
  for (int l = 0; l < L; ++l) n += remat[l];
  if (n == 0 || n == L) {
    snprintf(out, size, "%s", n == 0 ? "none" : "full");
    return;
  }
  size_t used = 0;
  out[0] = '\0';
  for (int l = 0; l < L; ++l) {
    if (!remat[l]) continue;
    char item[16];
    snprintf(item, sizeof(item), "%s%d", used ? "," : "", l);
    if (used + strlen(item) + 4 >= size) {
      snprintf(out + used, size - used, ",...");
      return;
    }
    memcpy(out + used, item, strlen(item) + 1);
    used += strlen(item);
  }
}

st_status st_plan_remat_auto(int L, int64_t budget, st_plan_remat_peak_fn peak, void* user, st_plan_remat_choice* c) {
  memset(c, 0, sizeof(*c));
  c->automatic = true;
  c->layers = L;
  c->budget = budget;
  c->remat = st_xcalloc((size_t)L + 1, sizeof(bool));
  int64_t p = 0;
  ST_RETURN(peak(user, c->remat, &p));
  c->plans_built = 1;
  c->none_peak = p;
  if (budget <= 0 || p <= budget) {
    c->predicted_peak = p;
    c->fits = true;
    if (budget <= 0)
      snprintf(c->why, sizeof(c->why),
               "no budget (sched.memory_budget=0): every layer keeps its residuals, predicted peak %" PRId64 " B", p);
    else
      snprintf(c->why, sizeof(c->why), "fits without remat: predicted peak %" PRId64 " B <= budget %" PRId64 " B", p, budget);
    return ST_OK;
  }
  /* Every layer recomputing is the most remat can do: if that does not fit,
   * no choice does. */
  for (int l = 0; l < L; ++l) c->remat[l] = true;
  int64_t full = 0;
  ST_RETURN(peak(user, c->remat, &full));
  c->plans_built++;
  if (full > budget) {
    c->predicted_peak = full;
    c->recomputed = L;
    c->fits = false;
    snprintf(c->why, sizeof(c->why),
             "does not fit: even with every layer recomputed the predicted peak is %" PRId64 " B > budget %" PRId64
             " B (without remat %" PRId64 " B); chose full",
             full, budget, p);
    return ST_OK;
  }
  /* The least k whose prefix 0..k-1 fits: none (k = 0) does not, full (k = L) does. */
  bool* trial = st_xcalloc((size_t)L + 1, sizeof(bool));
  int lo = 0, n = L;
  int64_t fit_peak = full;
  st_status s = ST_OK;
  while (!s && n - lo > 1) {
    int mid = lo + (n - lo) / 2;
    for (int l = 0; l < L; ++l) trial[l] = l < mid;
    int64_t q = 0;
    s = peak(user, trial, &q);
    c->plans_built++;
    if (s) break;
    if (q <= budget) {
      n = mid;
      fit_peak = q;
    } else {
      lo = mid;
    }
  }
  free(trial);
  if (s) return s;
  for (int l = 0; l < L; ++l) c->remat[l] = l < n;
  p = fit_peak;
  c->recomputed = n;
  c->predicted_peak = p;
  c->fits = p <= budget;
  char layers[128];
  st_plan_remat_text(c->remat, L, layers, sizeof(layers));
  snprintf(c->why, sizeof(c->why),
           "recompute %d of %d layers (%s): predicted peak %" PRId64 " B <= budget %" PRId64 " B (without remat %" PRId64
           " B, over it)",
           n, L, layers, p, budget, c->none_peak);
  return ST_OK;
}

json_t* st_plan_remat_choice_json(const st_plan_remat_choice* c) {
  json_t* j = st_json_obj();
  st_json_put_str(j, "mode", c->automatic ? "auto" : "fixed");
  json_t* layers = st_json_arr();
  for (int l = 0; c->remat && l < c->layers; ++l)
    if (c->remat[l]) st_json_push(layers, st_json_int(l));
  st_json_put(j, "recompute", layers);
  st_json_put_int(j, "recomputed", c->recomputed);
  st_json_put_int(j, "layers", c->layers);
  st_json_put_int(j, "predicted_peak_bytes", c->predicted_peak);
  if (!c->automatic) return j;
  st_json_put_int(j, "budget_bytes", c->budget);
  if (c->budget_fraction > 0) {
    st_json_put_num(j, "budget_fraction", c->budget_fraction);
    st_json_put_int(j, "device_memory_bytes", c->device_memory);
  }
  st_json_put_int(j, "none_peak_bytes", c->none_peak);
  st_json_put_bool(j, "fits", c->fits);
  st_json_put_int(j, "plans_built", c->plans_built);
  st_json_put_str(j, "why", c->why);
  return j;
}
