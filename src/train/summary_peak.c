/* summary_peak.c — the end-of-run summary's share of the machine's matmul
 * peak: model FLOP/s over the best rate of a 512x512 f32 matmul on one
 * device, times the devices the run used. The rate is the one `strata
 * doctor` stored in the cache (st_runtime_matmul_peak_load); without one,
 * the summary measures it once (about a third of a second) and stores it,
 * so only the first summary on a machine pays. */
#include <stdio.h>

#include "strata/base.h"
#include "strata/runtime.h"
#include "train/train_internal.h"

void st__summary_peak(const st__trainer* t, double model_gflops) {
  st_matmul_peak peak;
  if (!st_runtime_matmul_peak_load(t->runtime, t->o->cache_root, &peak)) {
    st_status s = st_runtime_matmul_measure(t->runtime, 0.3, &peak);
    if (s) {
      fprintf(stderr, "  %.4g GFLOP/s of model FLOPs (matmul peak not measured: %s)\n", model_gflops, st_status_message(s));
      st_status_free(s);
      return;
    }
    snprintf(peak.by, sizeof(peak.by), "train");
    /* A cache: the share is printed either way. */
    st_status_free(st_runtime_matmul_peak_store(t->runtime, t->o->cache_root, &peak));
  }
  int devices = st_executor_devices(t->ex);
  double total = peak.best_gflops * (devices > 0 ? devices : 1);
  char per[64] = "";
  if (devices > 1) snprintf(per, sizeof(per), "%d x ", devices);
  fprintf(stderr, "  %.4g GFLOP/s of model FLOPs = %.3g%% of the measured matmul peak (%s%.4g GFLOP/s, strata %s)\n",
          model_gflops, 100.0 * model_gflops / total, per, peak.best_gflops, peak.by);
}
