/* run_status.c — what a run is doing or how it ended, from its run
 * directory alone (docs/design.md §6): `strata status` prints it.
 *
 * Nothing here writes to the run directory or takes its lock: the lock is
 * probed (st_rundir_holder), the logs are read from their tails only,
 * so a run being trained is never disturbed and a huge metrics.jsonl costs
 * at most ST__TAIL bytes. In train/ because train.steps and the metrics
 * port come through the typed options (plan/), the one reader of config
 * keys. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/config.h"
#include "strata/diag.h"
#include "strata/obs.h"
#include "strata/plan.h"
#include "strata/train.h"

/* Bytes read from the end of events.jsonl and metrics.jsonl. */
#define ST__TAIL (64 * 1024)
/* Step lines averaged for the ETA's step time. */
#define ST__RECENT 10

static bool st__keep_status_line(void* user, json_t* line, int64_t byte) {
  (void)byte;
  st_json_push((json_t*)user, json_incref(line));
  return true;
}

/* The complete lines among the last ST__TAIL bytes of |path|, parsed, oldest
 * first (a new array). *out_torn: the file ends in bytes after its last
 * newline (a line being written, or cut by a crash). A line that is not a
 * JSON object is an error: this is not a strata run log. */
static st_status st__status_tail_lines(const char* path, json_t** out, bool* out_torn) {
  *out = NULL;
  *out_torn = false;
  json_t* lines = st_json_arr();
  st_jsonl_stats js;
  st_status s = st_jsonl_read(path, ST__TAIL, ST__TAIL, st__keep_status_line, lines, &js);
  if (s) s = st_status_annotate(s, "strata status");
  else if (js.bad && !strcmp(js.first_bad_why, "not a JSON object"))
    s = st_status_make(ST_CODE_CONFIG, "strata status: '%s' holds a line that is not a JSON object; it is not a strata run log",
                       path);
  else if (js.bad)
    s = st_status_make(ST_CODE_CONFIG,
                       "strata status: '%s' holds a line that is not JSON (at byte %lld); it is not a strata run log, or "
                       "was edited",
                       path, (long long)js.first_bad_byte);
  if (s) {
    json_decref(lines);
    return s;
  }
  *out_torn = js.torn;
  *out = lines;
  return ST_OK;
}

/* The class name of a process exit code (README, "Exit codes"). */
static const char* st__status_exit_class(int64_t code) {
  static const struct {
    int exit;
    st_code code;
  } k[] = {{0, ST_CODE_OK},   {1, ST_CODE_INTERNAL}, {2, ST_CODE_CONFIG}, {3, ST_CODE_DATA},        {4, ST_CODE_RUNTIME},
           {5, ST_CODE_NUMERICS}, {6, ST_CODE_HANG},   {7, ST_CODE_CKPT},   {8, ST_CODE_INTERRUPTED}, {9, ST_CODE_IO}};
  for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); ++i)
    if (k[i].exit == code) return st_code_name(k[i].code);
  return "unknown";
}

/* The newest event named |name| among |events| (borrowed), or NULL. */
static const json_t* st__status_last_named(const json_t* events, const char* name) {
  for (size_t i = json_array_size(events); i-- > 0;) {
    const char* n = json_string_value(json_object_get(json_array_get(events, i), "event"));
    if (n && !strcmp(n, name)) return json_array_get(events, i);
  }
  return NULL;
}

static void st__status_put_copy(json_t* out, const char* key, const json_t* from, const char* from_key) {
  json_t* v = from ? json_object_get(from, from_key) : NULL;
  st_json_put(out, key, v ? json_incref(v) : json_null());
}

static double st__status_num(const json_t* obj, const char* key, bool* ok) {
  const json_t* v = obj ? json_object_get(obj, key) : NULL;
  *ok = v && json_is_number(v);
  return *ok ? json_number_value(v) : 0.0;
}

/* What st_train_run_status reads of the directory before it judges. */
typedef struct {
  long holder;  /* st_rundir_holder's */
  bool running; /* the lock is held */
  json_t* events;  /* owned; NULL without events.jsonl */
  json_t* metrics; /* owned; NULL without metrics.jsonl */
  st_config* cfg;  /* owned; NULL without config.yaml */
} st__run_read;

/* The reading phase: the lock probed, the logs' tails, config.yaml; a
 * folder that is no run directory is refused here, before anything is
 * judged, and a finished run's torn last line is warned about. */
static st_status st__status_read(const char* dir, st__run_read* r) {
  char* events_path = st_rundir_path(dir, ST_RUNDIR_EVENTS);
  char* metrics_path = st_rundir_path(dir, ST_RUNDIR_METRICS);
  char* config_path = st_rundir_path(dir, ST_RUNDIR_CONFIG);
  st_status s = st_rundir_holder(dir, &r->holder);
  r->running = r->holder > 0 || r->holder == -2;
  const bool running = r->running;
  /* A run just starting holds the lock before it opens its logs. */
  bool has_events = st_fs_exists(events_path);
  if (!s && !has_events && !running)
    s = st_status_make(ST_CODE_CONFIG,
                       "strata status: '%s' is not a run directory: it has no events.jsonl (strata train and strata run "
                       "write it when they start)",
                       dir);
  bool events_torn = false, metrics_torn = false;
  if (!s && has_events) s = st__status_tail_lines(events_path, &r->events, &events_torn);
  if (!s && st_fs_exists(metrics_path)) s = st__status_tail_lines(metrics_path, &r->metrics, &metrics_torn);
  bool has_config = st_fs_exists(config_path);
  if (!s && !has_config && !running)
    s = st_status_make(ST_CODE_CONFIG, "strata status: '%s' is not a run directory: it has no config.yaml (strata train writes it first)",
                       dir);
  if (!s && has_config) s = st_status_annotate(st_config_load(config_path, 0, NULL, &r->cfg), "strata status: reading %s", config_path);
  /* A torn last line is a write in progress while the run lives; once it
   * is over, what a crash left (the next resume cuts it). */
  if (!s && !running) {
    char* q = st_shell_quote(dir);
    if (events_torn)
      fprintf(stderr, "strata: warning: %s ends in a torn line (a crash mid-write); ignored here, `strata resume %s` cuts it\n",
              events_path, q);
    if (metrics_torn)
      fprintf(stderr, "strata: warning: %s ends in a torn line (a crash mid-write); ignored here, `strata resume %s` cuts it\n",
              metrics_path, q);
    free(q);
  }
  free(events_path);
  free(metrics_path);
  free(config_path);
  return s;
}

/* The state (running, finished, interrupted, failed) with its exit code,
 * class, error and signal, from the last events: under `strata run` the
 * supervisor's summary comes last and the child's own final event before
 * it has the details. */
static void st__status_outcome(json_t* o, const st__run_read* r) {
  const json_t* events = r->events;
  size_t ne = json_array_size(events);
  const json_t* last = ne ? json_array_get(events, ne - 1) : NULL;
  const char* last_name = last ? json_string_value(json_object_get(last, "event")) : NULL;
  const json_t* sup = last_name && !strcmp(last_name, "supervisor_done") ? last : NULL;
  const char* outcome = sup ? json_string_value(json_object_get(sup, "outcome")) : NULL;
  const char* state;
  int64_t code = -1;
  const char* reason = NULL;
  const json_t* why = NULL; /* the event whose "error" explains a failure */
  if (r->running) {
    state = "running";
  } else if (sup) {
    if (!st_json_as_int(json_object_get(sup, "exit_code"), &code)) code = 1;
    state = outcome && !strcmp(outcome, "completed") ? "finished" : outcome && !strcmp(outcome, "interrupted") ? "interrupted" : "failed";
    why = st__status_last_named(events, "failed");
    if (!why && !strcmp(state, "failed")) reason = "strata run stopped restarting it (see recovery.json)";
  } else if (last_name && !strcmp(last_name, "done")) {
    state = "finished";
    code = 0;
  } else if (last_name && !strcmp(last_name, "interrupted")) {
    state = "interrupted";
    code = 8;
  } else if (last_name && !strcmp(last_name, "failed")) {
    state = "failed";
    if (!st_json_as_int(json_object_get(last, "exit_code"), &code)) code = 1;
    why = last;
  } else {
    state = "failed";
    reason = "ended without a final event: killed (SIGKILL, out of memory) or crashed";
  }
  st_json_put_str(o, "state", state);
  st_json_put(o, "pid", r->running && r->holder > 0 ? st_json_int(r->holder) : json_null());
  st_json_put(o, "exit_code", code >= 0 ? st_json_int(code) : json_null());
  st_json_put(o, "exit_class", code >= 0 ? st_json_str(st__status_exit_class(code)) : json_null());
  if (!strcmp(state, "failed") && why)
    st__status_put_copy(o, "error", why, "error");
  else
    st_json_put(o, "error", !strcmp(state, "failed") && reason ? st_json_str(reason) : json_null());
  const char* signal = NULL;
  if (!strcmp(state, "interrupted")) {
    const json_t* child = st__status_last_named(events, "interrupted");
    const json_t* si = st__status_last_named(events, "supervisor_interrupted");
    int64_t num = 0;
    if (child) signal = json_string_value(json_object_get(child, "signal_name"));
    if (!signal && si && st_json_as_int(json_object_get(si, "signal"), &num)) signal = st_signal_name((int)num);
  }
  st_json_put(o, "signal", signal ? st_json_str(signal) : json_null());
  st_json_put(o, "supervisor_outcome", outcome ? st_json_str(outcome) : json_null());
  st_json_put(o, "last_event", last_name ? st_json_str(last_name) : json_null());
  st__status_put_copy(o, "last_event_time", last, "time");
}

/* Progress: the last step line, the mean step time of the recent ones,
 * the ETA against train.steps and the live metrics endpoint. */
static void st__status_progress(json_t* o, const st__run_read* r) {
  const json_t* metrics = r->metrics;
  const bool running = r->running;
  const json_t* step_line = NULL;
  double sum = 0;
  int recent = 0;
  for (size_t i = json_array_size(metrics); i-- > 0;) {
    const json_t* m = json_array_get(metrics, i);
    if (!json_object_get(m, "loss")) continue; /* eval lines */
    if (!step_line) step_line = m;
    bool ok;
    double dt = st__status_num(m, "step_time_s", &ok);
    if (ok && recent < ST__RECENT) {
      sum += dt;
      ++recent;
    }
  }
  /* train.steps through the typed options, the one reader of config keys. */
  int64_t total = 0;
  bool have_total = false;
  int metrics_port = 0;
  if (r->cfg) {
    st_plan_options opts;
    st_status os = st_plan_options_from_config(r->cfg, &opts);
    if (!os) {
      total = opts.steps;
      have_total = true;
      metrics_port = opts.metrics_port;
    }
    st_status_free(os);
    st_plan_options_deinit(&opts);
  }
  int64_t step = 0;
  if (step_line) st_json_as_int(json_object_get(step_line, "step"), &step);
  st_json_put(o, "step", step_line ? st_json_int(step) : json_null());
  st_json_put(o, "total_steps", have_total ? st_json_int(total) : json_null());
  st__status_put_copy(o, "loss", step_line, "loss");
  st__status_put_copy(o, "tokens_per_s", step_line, "tokens_per_s");
  double step_time = recent ? sum / recent : 0;
  st_json_put(o, "step_time_s", recent ? st_json_fixed(step_time, 6) : json_null());
  st_json_put_int(o, "step_time_steps", recent);
  bool eta = running && have_total && recent && total > step;
  st_json_put(o, "eta_s", eta ? st_json_fixed((double)(total - step) * step_time, 1) : json_null());
  /* The live endpoint serves while the process lives: config.yaml is
   * rewritten by every attempt before it binds (a port it cannot bind ends
   * the attempt, exit 2). */
  if (running && metrics_port > 0) {
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", metrics_port);
    st_json_put_str(o, "metrics_url", url);
  } else {
    st_json_put(o, "metrics_url", json_null());
  }
}

/* The checkpoint a resume would take (verified), and the lock's holder. */
static st_status st__status_checkpoint(json_t* o, const char* dir, const st__run_read* r) {
  char* ckpt_root = st_rundir_path(dir, ST_RUNDIR_CHECKPOINTS);
  st_ckpt* c = NULL;
  int skipped = 0;
  st_status s = st_ckpt_find_valid(ckpt_root, NULL, NULL, NULL, &c, &skipped);
  free(ckpt_root);
  if (s) return s;
  if (c) {
    const char* slash = strrchr(c->dir, '/');
    st_json_put_str(o, "checkpoint", slash ? slash + 1 : c->dir);
    st_json_put_int(o, "checkpoint_step", c->step);
  } else {
    st_json_put(o, "checkpoint", json_null());
    st_json_put(o, "checkpoint_step", json_null());
  }
  st_json_put_int(o, "checkpoints_invalid", skipped);
  st_ckpt_free(c);
  json_t* lock = st_json_obj();
  st_json_put_str(lock, "file", st_rundir_name(ST_RUNDIR_LOCK));
  st_json_put_bool(lock, "held", r->running);
  st_json_put(lock, "pid", r->holder > 0 ? st_json_int(r->holder) : json_null());
  if (r->holder == -1) st_json_put_str(lock, "note", "this filesystem has no flock: a live run cannot be detected");
  st_json_put(o, "lock", lock);
  return ST_OK;
}

st_status st_train_run_status(const char* dir, json_t** out) {
  *out = NULL;
  if (!st_fs_exists(dir))
    return st_status_make(ST_CODE_CONFIG, "strata status: '%s' does not exist; give the run directory strata train printed", dir);
  if (!st_fs_is_dir(dir)) return st_status_make(ST_CODE_CONFIG, "strata status: '%s' is not a run directory: not a folder", dir);
  st__run_read r;
  memset(&r, 0, sizeof(r));
  json_t* o = NULL;
  st_status s = st__status_read(dir, &r);
  if (!s) {
    o = st_json_obj();
    st_json_put_str(o, "run_dir", dir);
    st__status_outcome(o, &r);
    st__status_progress(o, &r);
    s = st__status_checkpoint(o, dir, &r);
  }
  if (s) {
    json_decref(o);
    o = NULL;
  }
  *out = o;
  json_decref(r.events);
  json_decref(r.metrics);
  st_config_destroy(r.cfg);
  return s;
}
