/* mfu.c — model FLOPs and the peak they are measured against: one formula
 * for the end-of-run summary, every metrics line (model_flops_per_s, mfu)
 * and `strata analyze`, and one resolution of the peak, named in
 * context.json (docs/analysis.md "MFU").
 *
 * The peak, first found wins: obs.peak_flops (a datasheet figure the user
 * gives), a datasheet figure for a known accelerator kind (bf16 dense),
 * the measurement `strata doctor` (or an earlier run) stored in the cache
 * for this plugin and device kind, else, when the caller allows it, a
 * measurement now (a third of a second of 512x512 matmuls), stored for
 * the next run. The CPU has no datasheet entry: its peak is measured. */
#include <stdio.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/runtime.h"
#include "strata/train.h"
#include "train/train_internal.h"

double st_train_model_flops_per_token(const st_bundle* b) {
  const st_bundle_model* m = &b->model;
  const double D = (double)m->d_model, T = (double)m->seq_len, V = (double)m->vocab_size, L = (double)m->n_layers;
  /* bench/flops.py: a multiply-add is 2 FLOPs; per layer every matrix of
   * its kind once (the parameter table's rank-2 tensors: llama's four
   * attention projections and three MLP matrices, gpt2's two MLP ones,
   * grouped-query k and v at their size), a stack of experts (rank 3) as
   * one expert; QK^T and PV over the full T x T square; the output
   * projection once over the real vocabulary (tied or not); backward =
   * 2 x forward. Biases and norms are not matmuls. */
  double matrices = 0;
  for (int i = 0; i < b->param_count; ++i) {
    const st_tensor_type* t = &b->params[i].type;
    if (b->params[i].layer < 0 || t->rank < 2) continue;
    double n = (double)st_tensor_type_elements(t);
    matrices += t->rank == 2 ? n : t->dims[0] > 0 ? n / (double)t->dims[0] : 0;
  }
  return 3 * (2 * matrices + L * 2 * 2 * T * D + 2 * D * V);
}

/* Dense bf16 tensor-core peaks from the vendors' datasheets, per device,
 * matched against the PJRT device kind (a substring). */
static const struct {
  const char* kind;
  double flops;
  double bytes;
  const char* name;
} kDatasheet[] = {
    {"H100 PCIe", 756e12, 2.0e12, "NVIDIA H100 PCIe datasheet (bf16 dense)"},
    {"H100", 989e12, 3.35e12, "NVIDIA H100 SXM datasheet (bf16 dense)"},
    {"H200", 989e12, 4.8e12, "NVIDIA H200 SXM datasheet (bf16 dense)"},
    {"A100", 312e12, 2.0e12, "NVIDIA A100 datasheet (bf16 dense)"},
    {"TPU v4", 275e12, 1.2e12, "Google TPU v4 datasheet (bf16)"},
};

void st_train_peak_resolve(st_runtime* rt, const char* cache_root, double override_flops, bool measure,
                           st_train_peak* out) {
  memset(out, 0, sizeof(*out));
  snprintf(out->source, sizeof(out->source), "none");
  if (override_flops > 0) {
    out->flops_per_s = override_flops;
    snprintf(out->source, sizeof(out->source), "config");
    snprintf(out->detail, sizeof(out->detail), "obs.peak_flops");
  }
  st_device_info d;
  st_status s = st_runtime_device_info(rt, 0, &d);
  const char* kind = s ? "" : d.kind;
  st_status_free(s);
  if (!out->flops_per_s) {
    for (size_t i = 0; i < sizeof(kDatasheet) / sizeof(kDatasheet[0]); ++i)
      if (strstr(kind, kDatasheet[i].kind)) {
        out->flops_per_s = kDatasheet[i].flops;
        out->bytes_per_s = kDatasheet[i].bytes;
        snprintf(out->source, sizeof(out->source), "datasheet");
        snprintf(out->detail, sizeof(out->detail), "%s", kDatasheet[i].name);
        return;
      }
  }
  st_matmul_peak p;
  bool have = st_runtime_matmul_peak_load(rt, cache_root, &p);
  if (!have && measure && !out->flops_per_s) {
    s = st_runtime_matmul_measure(rt, 0.3, &p);
    if (s) {
      snprintf(out->detail, sizeof(out->detail), "matmul not measured: %s", st_status_message(s));
      st_status_free(s);
      return;
    }
    snprintf(p.by, sizeof(p.by), "train");
    /* A cache: the run goes on without it. */
    st_status_free(st_runtime_matmul_peak_store(rt, cache_root, &p));
    have = true;
  }
  if (!have) return;
  /* The bandwidth is kept with a configured peak too (the roofline's other side). */
  out->bytes_per_s = p.best_gbps * 1e9;
  if (out->flops_per_s) return;
  out->flops_per_s = p.best_gflops * 1e9;
  snprintf(out->source, sizeof(out->source), "%s", p.by);
  snprintf(out->detail, sizeof(out->detail), "%dx%d f32 matmul on %s, best of %d runs", p.n, p.n, kind[0] ? kind : "device 0",
           p.runs);
}

json_t* st_train_peak_json(const st_train_peak* p, int devices) {
  json_t* j = st_json_obj();
  if (p->flops_per_s > 0) st_json_put_num(j, "flops_per_s", p->flops_per_s);
  else st_json_put(j, "flops_per_s", json_null());
  if (p->bytes_per_s > 0) st_json_put_num(j, "bytes_per_s", p->bytes_per_s);
  else st_json_put(j, "bytes_per_s", json_null());
  st_json_put_int(j, "devices", devices);
  st_json_put_str(j, "source", p->source);
  st_json_put_str(j, "detail", p->detail);
  return j;
}

void st__summary_peak(const st__trainer* t, double model_gflops) {
  int devices = st_executor_devices(t->ex) * st_executor_stats_get(t->ex)->stages; /* every pipeline stage's */
  if (devices < 1) devices = 1;
  const st_train_peak* p = &t->peak;
  if (p->flops_per_s <= 0) {
    fprintf(stderr, "  %.4g GFLOP/s of model FLOPs (no peak: %s)\n", model_gflops, p->detail[0] ? p->detail : "unknown");
    return;
  }
  double per = p->flops_per_s / 1e9, total = per * devices;
  char times[64] = "";
  if (devices > 1) snprintf(times, sizeof(times), "%d x ", devices);
  bool measured = strcmp(p->source, "config") && strcmp(p->source, "datasheet");
  if (measured)
    fprintf(stderr, "  %.4g GFLOP/s of model FLOPs = %.3g%% of the measured matmul peak (%s%.4g GFLOP/s, strata %s)\n",
            model_gflops, 100.0 * model_gflops / total, times, per, p->source);
  else
    fprintf(stderr, "  %.4g GFLOP/s of model FLOPs = %.3g%% of the peak (%s%.4g GFLOP/s, %s)\n", model_gflops,
            100.0 * model_gflops / total, times, per, p->detail);
}
