/* job.c — the trainer's part of a job of several processes
 * (docs/multiprocess.md): joining the job, the run directory every rank
 * shares, the rows each rank trains on, and the per-step exchange that
 * makes every rank see the job's losses and stop requests. In one process
 * nothing here touches MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/config.h"
#include "strata/kernels.h"
#include "strata/diag.h"
#include "strata/dist.h"
#include "strata/obs.h"
#include "train/train_internal.h"

st_status st__job_init(st__trainer* t, st_plan_options* o) {
  st_dist_launch launch;
  ST_RETURN(st_dist_detect(&launch));
  if (!launch.multi) {
    if (o->procs > 1)
      return st_status_make(ST_CODE_CONFIG,
                            "parallel.processes=%d, but this process was not started by a launcher as one of %d: run "
                            "`mpirun -np %d strata train ...` (or srun), or set parallel.processes=1",
                            o->procs, o->procs, o->procs);
    return ST_OK;
  }
  if (o->procs != launch.world_size)
    return st_status_make(ST_CODE_CONFIG,
                          "started as rank %d of %d processes by %s, but parallel.processes=%d: leave "
                          "parallel.processes unset (strata train sets it from the launcher)",
                          launch.rank, launch.world_size, st_dist_launcher_name(launch.launcher), o->procs);
  ST_RETURN(st_dist_init(&launch, &t->dist));
  o->rank = st_dist_rank(t->dist);
  return ST_OK;
}

/* Rank 0 names the job's run directory (a generated run id differs per
 * process) and every rank gets it, |rank0_ok| false sending none so that
 * no rank waits for a directory that will not exist; rank r > 0 keeps its
 * own files in <run>/ranks/<r>/ (docs/multiprocess.md, "Files").
 * *out_job_dir is the job's directory, the caller's. */
st_status st__job_run_dir(st__trainer* t, const st_plan_options* o, bool rank0_ok, char** io_dir, char** out_job_dir) {
  *out_job_dir = NULL;
  if (!t->dist) return ST_OK;
  void* data = o->rank == 0 ? (rank0_ok ? *io_dir : "") : NULL;
  size_t size = o->rank == 0 ? strlen(data) + 1 : 0;
  ST_RETURN(st_dist_broadcast(t->dist, &data, &size));
  if (o->rank == 0) {
    *out_job_dir = st_xstrdup(*io_dir);
    return ST_OK;
  }
  char* job = data;
  if (size == 0 || job[size - 1] != '\0' || job[0] == '\0') {
    free(data);
    t->failed_together = true;
    return st_status_make(ST_CODE_CONFIG, "rank 0 could not make the job's run directory (its error is on rank 0's stderr)");
  }
  char* ranks = st_path_join(job, "ranks");
  st_status s = st_fs_mkdirs(ranks);
  free(ranks);
  if (s) {
    free(job);
    return s;
  }
  char sub[32];
  snprintf(sub, sizeof(sub), "ranks/%d", o->rank);
  free(*io_dir);
  *io_dir = st_path_join(job, sub);
  *out_job_dir = job;
  return ST_OK;
}

void st__job_fail(st__trainer* t, st_status s) {
  if (!s || !t->dist || !st_dist_multi(t->dist) || t->failed_together) return;
  const int code = st_status_exit_code(s);
  fprintf(stderr, "strata: %s: rank %d of %d: %s\n", st_code_name(st_status_code(s)), st_dist_rank(t->dist),
          st_dist_size(t->dist), st_status_message(s));
  fprintf(stderr, "strata: rank %d of %d failed alone: ending the job with exit %d (MPI_Abort; docs/multiprocess.md, \"Failures\")\n",
          st_dist_rank(t->dist), st_dist_size(t->dist), code);
  st_dist_abort(t->dist, code);
}

void st__fill_share(st__trainer* t, int stream, uint64_t first, int64_t n_micro) {
  const st_plan_options* o = t->o;
  if (!t->dist || o->procs <= 1) {
    st_dataset_fill(t->data, stream, first, n_micro * t->mb, t->tokens, t->targets, t->mask, NULL);
    return;
  }
  /* Microbatch m of the job is sequences [m * mb_job, (m+1) * mb_job);
   * rank r takes rows [r * mb, (r+1) * mb) of it, as mesh index r * local
   * shares would in one process of the whole mesh. */
  const int64_t mb_job = t->mb * o->procs;
  for (int64_t m = 0; m < n_micro; ++m) {
    size_t at = (size_t)(m * t->mb * t->T);
    st_dataset_fill(t->data, stream, first + (uint64_t)(m * mb_job + (int64_t)o->rank * t->mb), t->mb, t->tokens + at,
                    t->targets + at, t->mask + at, NULL);
  }
}

st_status st__losses_global(st__trainer* t, double* losses, int64_t n) {
  if (!t->dist || !st_dist_multi(t->dist)) return ST_OK;
  const int P = st_dist_size(t->dist);
  const size_t w = (size_t)n + 1;
  double* in = st_xmalloc(w * sizeof(double));
  double* all = st_xmalloc(w * (size_t)P * sizeof(double));
  memcpy(in, losses, (size_t)n * sizeof(double));
  in[n] = st_stop_signal() ? 1.0 : 0.0;
  st_status s = st_dist_allgather_f64(t->dist, in, w, all);
  /* In rank order, so every rank computes the same bits (NaN spreads). */
  for (int64_t m = 0; !s && m < n; ++m) {
    double sum = 0;
    for (int r = 0; r < P; ++r) sum += all[(size_t)r * w + (size_t)m];
    losses[m] = sum / (double)P;
  }
  for (int r = 0; !s && r < P; ++r) t->stop_any |= all[(size_t)r * w + (size_t)n] != 0;
  free(in);
  free(all);
  return s ? st_status_annotate(s, "exchanging the step's losses between processes") : ST_OK;
}

/* fsdp across processes: each rank's squared norms are of its own blocks;
 * the job's are their sums, in rank order, so that every rank computes
 * the same bits and makes the same clip decision. Collective. Under data
 * across processes the norms are of the reduced gradients, equal already. */
st_status st__sqnorms_global(st__trainer* t) {
  if (!t->dist || !st_dist_multi(t->dist) || t->o->span_axis != ST_PLAN_SPAN_FSDP) return ST_OK;
  const int P = st_dist_size(t->dist);
  const size_t n = (size_t)t->n_sq;
  double* all = st_xmalloc((size_t)P * n * sizeof(double));
  st_status s = st_dist_allgather_f64(t->dist, t->sqnorms, n, all);
  for (size_t i = 0; !s && i < n; ++i) {
    double sum = 0;
    for (int r = 0; r < P; ++r) sum += all[(size_t)r * n + i];
    t->sqnorms[i] = sum;
  }
  free(all);
  return s ? st_status_annotate(s, "exchanging the step's gradient norms between processes") : ST_OK;
}

/* Phases that fill the shared caches (the bundle export, the executable
 * cache): rank 0 goes first and the others find what it made, instead of
 * every rank on a host exporting and compiling the same programs at once.
 * Call with |before| true before the phase and false after it; each rank
 * meets one barrier. */
st_status st__job_rank0_first(st__trainer* t, bool before) {
  if (!t->dist || !st_dist_multi(t->dist)) return ST_OK;
  if (before != (t->o->rank > 0)) return ST_OK;
  return st_dist_barrier(t->dist);
}

/* The CPU plugin refuses node_id and has no collectives across processes
 * to share a client for: its jobs keep one client per process, their
 * cross-process traffic all MPI's. A plugin whose file name says it is a
 * GPU or TPU one (st_runtime_guess_platform, before it is loaded) shares
 * one; a name that says nothing keeps today's client per process, since
 * it may well be a CPU plugin. runtime.shared_client=on|off overrides. */
void st__job_runtime_kv(st__trainer* t, st_plan_options* o) {
  t->shared_client = false;
  if (!t->dist || !st_dist_multi(t->dist)) return;
  bool shared = o->shared_client == 1;
  if (o->shared_client < 0) {
    char platform[32], basis[512];
    st_runtime_guess_platform(&o->runtime, platform, sizeof(platform), basis, sizeof(basis));
    shared = strcmp(platform, "cpu") != 0 && strcmp(platform, "unknown") != 0;
  }
  if (!shared) return;
  st_dist_runtime_kv(t->dist, &o->runtime.kv);
  t->shared_client = true;
}

/* The job's figures of a step, on every rank's metrics line (rank 0's is
 * the job's metrics.jsonl; docs/multiprocess.md, "Metrics"): the slowest
 * and fastest rank's step time (a straggler shows as their gap), and the
 * cross-process communication: bytes all ranks sent, the time some XPROC
 * op was in flight (the slowest rank's), how much of it launches hid (over
 * all ranks) and the host time blocked on it. Collective. */
st_status st__job_step_metrics(st__trainer* t, double dt, json_t* m) {
  if (!t->dist || !st_dist_multi(t->dist)) return ST_OK;
  const st_executor_stats* es = st_executor_stats_get(t->ex);
  enum { W = 5 };
  const int P = st_dist_size(t->dist);
  double in[W] = {dt, es->xproc_s, es->xproc_hidden_s, es->xproc_wait_s, (double)es->xproc_bytes};
  double* all = st_xmalloc((size_t)P * W * sizeof(double));
  st_status s = st_dist_allgather_f64(t->dist, in, W, all);
  if (s) {
    free(all);
    return st_status_annotate(s, "exchanging the step's figures between processes");
  }
  double lo = all[0], hi = all[0], xs = 0, xs_max = 0, hidden = 0, wait_max = 0, bytes = 0;
  int slowest = 0;
  for (int r = 0; r < P; ++r) {
    const double* v = all + (size_t)r * W;
    if (v[0] < lo) lo = v[0];
    if (v[0] > hi) {
      hi = v[0];
      slowest = r;
    }
    xs += v[1];
    if (v[1] > xs_max) xs_max = v[1];
    hidden += v[2];
    if (v[3] > wait_max) wait_max = v[3];
    bytes += v[4];
  }
  free(all);
  st_json_put_int(m, "processes", P);
  st_json_put(m, "step_time_s_min", st_json_fixed(lo, 6));
  st_json_put(m, "step_time_s_max", st_json_fixed(hi, 6));
  st_json_put_int(m, "slowest_rank", slowest);
  st_json_put_int(m, "xprocs", es->xprocs);
  st_json_put_int(m, "xproc_bytes", (int64_t)bytes);
  st_json_put(m, "xproc_s", st_json_fixed(xs_max, 6));
  st_json_put(m, "xproc_wait_s", st_json_fixed(wait_max, 6));
  st_json_put(m, "xproc_overlap_ratio", xs > 0 ? st_json_fixed(hidden / xs, 4) : json_null());
  return ST_OK;
}

/* The start-up agreement (docs/multiprocess.md, "The start-up
 * agreement"): every rank must run the same job. |cfg| given: every key of
 * the resolved config, before anything is created; |cfg| NULL: the bundle
 * key, the kernel selection and a hash of the step plan, once compiled.
 * A difference is exit 2 on every rank naming the first differing key. */
static void st__agree_add(char*** keys, char*** values, size_t* n, size_t* cap, const char* k, char* v) {
  if (*n == *cap) {
    *cap = *cap ? 2 * *cap : 64;
    *keys = st_xrealloc(*keys, *cap * sizeof(char*));
    *values = st_xrealloc(*values, *cap * sizeof(char*));
  }
  (*keys)[*n] = st_xstrdup(k);
  (*values)[(*n)++] = v;
}

static char* st__config_value_text(const json_t* root, const char* key) {
  const json_t* v = root;
  char part[128];
  for (const char* p = key; v && *p;) {
    const char* dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    if (len >= sizeof(part)) return st_xstrdup("(key too long)");
    memcpy(part, p, len);
    part[len] = '\0';
    v = json_object_get(v, part);
    p += len + (dot ? 1 : 0);
  }
  if (!v) return st_xstrdup("(none)");
  char* text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
  char* out = st_xstrdup(text ? text : "(unprintable)");
  free(text);
  return out;
}

st_status st__job_agree(st__trainer* t, const st_config* cfg) {
  if (!t->dist || !st_dist_multi(t->dist)) return ST_OK;
  char **keys = NULL, **values = NULL;
  size_t n = 0, cap = 0;
  if (cfg) {
    json_t* root = st_config_json(cfg);
    for (int i = 0; i < st_config_key_count(); ++i) {
      const char* k = st_config_key_at(i).key;
      st__agree_add(&keys, &values, &n, &cap, k, st__config_value_text(root, k));
    }
    json_decref(root);
  } else {
    st__agree_add(&keys, &values, &n, &cap, "bundle key", st_xstrdup(t->bundle->key));
    int n_ops = 0;
    const char* const* ops = st_kernels_op_names(&n_ops);
    for (int i = 0; i < n_ops; ++i) {
      char k[80];
      snprintf(k, sizeof(k), "kernel selection %s", ops[i]);
      st__agree_add(&keys, &values, &n, &cap, k, st_xstrdup(t->o->kernel_impl[i]));
    }
    json_t* pj = st_plan_json(&t->step_plan);
    char* text = json_dumps(pj, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(pj);
    char h[32];
    snprintf(h, sizeof(h), "%016llx", (unsigned long long)st_hash64(text, text ? strlen(text) : 0, 0));
    free(text);
    st__agree_add(&keys, &values, &n, &cap, "step plan (hash)", st_xstrdup(h));
  }
  st_status s = st_dist_agree(t->dist, (const char* const*)keys, (const char* const*)values, n);
  for (size_t i = 0; i < n; ++i) {
    free(keys[i]);
    free(values[i]);
  }
  free(keys);
  free(values);
  return s;
}
