/* diff.c — `strata diff RUN_A RUN_B`: what differs between two runs, from
 * their run directories alone (docs/using.md, "strata diff"): the resolved
 * configs, the contexts, the notes, and the loss curves down to the first
 * step whose loss differs.
 *
 * Everything read is untrusted (someone else's run, a run cut by a crash):
 * each file is bounded in size, metrics.jsonl is streamed with a bounded
 * line, and the step count is capped. Unlike strata report, which shows
 * what it can of a damaged run, a damaged file is an error here: the diff
 * answers "where do these runs first differ", and a skipped line could
 * hide the answer. Only an incomplete last line is left out (a run still
 * being written ends in one), and the output says so. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "obs/diff.h"
#include "obs/readback.h"
#include "strata/base.h"
#include "strata/config.h"
#include "strata/obs.h"

#define ST__DIFF_MAX_LINE (1 << 20)        /* a metrics line longer than this is damage */
#define ST__DIFF_MAX_STEPS ((int64_t)1 << 22) /* step or eval lines kept per run */
#define ST__DIFF_MAX_CONFIG (1 << 20)      /* config.yaml */
#define ST__DIFF_MAX_CONTEXT (1 << 20)     /* context.json */

double st_diff_rel(double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0.0 : INFINITY;
  if (a == b) return 0.0;
  double m = fmax(fabs(a), fabs(b));
  return isinf(m) ? INFINITY : fabs(a - b) / m;
}

/*===-------------------------------------------------------------------===*/
/* metrics.jsonl                                                            */
/*===-------------------------------------------------------------------===*/

typedef struct st__diff_reader {
  st_diff_run* run;
  const char* path;
  st_status error;
} st__diff_reader;

/* A number member, NaN when absent or null; false when it holds something
 * else (a damaged line). */
static bool st__diff_num(const json_t* line, const char* key, double* out) {
  const json_t* v = json_object_get(line, key);
  *out = NAN;
  if (!v || json_is_null(v)) return true;
  if (!json_is_number(v)) return false;
  *out = json_number_value(v);
  return true;
}

/* Keeps a step's slot: a step at or before the newest one (a resume
 * replaying from its checkpoint) first drops the steps it replaces, so the
 * kept values are those the run's final state came from. Returns the slot,
 * or NULL when the cap is reached. */
static void* st__diff_slot(void** items, int64_t* n, int64_t* cap, size_t size, int64_t step) {
  char* base = *items;
  while (*n > 0 && *(const int64_t*)(base + (size_t)(*n - 1) * size) >= step) --*n;
  if (*n == *cap) {
    if (*cap >= ST__DIFF_MAX_STEPS) return NULL;
    *cap = *cap ? *cap * 2 : 256;
    *items = base = st_xrealloc(base, (size_t)*cap * size);
  }
  return base + (size_t)(*n)++ * size;
}

static bool st__diff_metrics_line(void* user, json_t* m, int64_t byte) {
  st__diff_reader* r = user;
  st_diff_run* run = r->run;
  const json_t* jstep = json_object_get(m, "step");
  bool is_eval = json_object_get(m, "eval_loss") && !json_object_get(m, "loss");
  if (!jstep || (!is_eval && !json_object_get(m, "loss"))) return true; /* not a step or eval line */
  int64_t step = 0;
  double v[5];
  bool ok = st_json_as_int(jstep, &step) && step >= 0;
  if (ok && is_eval) {
    ok = st__diff_num(m, "eval_loss", &v[0]);
  } else if (ok) {
    ok = st__diff_num(m, "loss", &v[0]) && st__diff_num(m, "lr", &v[1]) && st__diff_num(m, "grad_norm", &v[2]) &&
         st__diff_num(m, "tokens_per_s", &v[3]) && st__diff_num(m, "step_time_s", &v[4]);
  }
  if (!ok) {
    r->error = st_status_make(ST_CODE_CONFIG,
                              "%s: the line at byte %lld has a step, loss or metric that is not a number: the log is "
                              "damaged (strata diff compares every step and does not skip one)",
                              r->path, (long long)byte);
    return false;
  }
  void* slot = is_eval ? st__diff_slot((void**)&run->evals, &run->n_evals, &run->cap_evals, sizeof(st_diff_eval), step)
                       : st__diff_slot((void**)&run->steps, &run->n_steps, &run->cap_steps, sizeof(st_diff_step), step);
  if (!slot) {
    r->error = st_status_make(ST_CODE_CONFIG, "%s: more than %lld %s lines; strata diff compares at most that many",
                              r->path, (long long)ST__DIFF_MAX_STEPS, is_eval ? "eval" : "step");
    return false;
  }
  if (is_eval) {
    *(st_diff_eval*)slot = (st_diff_eval){.step = step, .loss = v[0]};
    run->eval_lines++;
  } else {
    *(st_diff_step*)slot = (st_diff_step){
        .step = step, .loss = v[0], .lr = v[1], .grad_norm = v[2], .tokens_per_s = v[3], .step_time_s = v[4]};
    run->step_lines++;
  }
  return true;
}

static st_status st__diff_read_metrics(st_diff_run* run) {
  char* path = st_rundir_path(run->dir, ST_RUNDIR_METRICS);
  st_status s = ST_OK;
  if (!st_fs_exists(path)) {
    s = st_status_make(ST_CODE_CONFIG, "%s: missing; strata diff compares the step lines of two runs that trained", path);
  } else {
    st__diff_reader r = {.run = run, .path = path};
    st_jsonl_stats stats = {0};
    s = st_jsonl_read(path, 0, ST__DIFF_MAX_LINE, st__diff_metrics_line, &r, &stats);
    if (!s) s = r.error;
    else st_status_free(r.error);
    if (!s && stats.bad)
      s = st_status_make(ST_CODE_CONFIG,
                         "%s: %lld damaged line%s, the first at byte %lld (%s): strata diff compares every step and "
                         "does not skip one; repair or cut the file",
                         path, (long long)stats.bad, stats.bad == 1 ? "" : "s", (long long)stats.first_bad_byte,
                         stats.first_bad_why);
    run->torn = stats.torn;
  }
  free(path);
  return s;
}

/*===-------------------------------------------------------------------===*/
/* config.yaml, context.json, notes.json                                    */
/*===-------------------------------------------------------------------===*/

/* Nested objects as one object of dotted keys (|prefix| "" at the top);
 * any other value is a leaf, compared whole. */
static void st__diff_flatten(const json_t* v, const char* prefix, json_t* out) {
  const char* key;
  json_t* member;
  json_object_foreach((json_t*)v, key, member) {
    st_strbuf k = {0};
    st_strbuf_printf(&k, "%s%s%s", prefix, prefix[0] ? "." : "", key);
    if (json_is_object(member) && json_object_size(member)) st__diff_flatten(member, st_strbuf_cstr(&k), out);
    else json_object_set(out, st_strbuf_cstr(&k), member);
    st_strbuf_free(&k);
  }
}

/* The resolved config the run trained with, loaded like any config (so
 * both runs' keys are this strata's schema, defaults filled in). */
static st_status st__diff_read_config(st_diff_run* run) {
  char* path = st_rundir_path(run->dir, ST_RUNDIR_CONFIG);
  char* text = NULL;
  size_t size = 0;
  bool cut = false;
  st_status s = ST_OK;
  if (!st_fs_exists(path))
    s = st_status_make(ST_CODE_CONFIG, "%s: missing; give a run directory strata train wrote (it writes config.yaml first)",
                       path);
  else if (!st_readback_bounded(path, ST__DIFF_MAX_CONFIG, &text, &size, &cut) || cut)
    s = st_status_make(ST_CODE_CONFIG, "%s: not a regular file of at most %d bytes", path, ST__DIFF_MAX_CONFIG);
  free(text);
  st_config* cfg = NULL;
  if (!s) {
    s = st_config_load(path, 0, NULL, &cfg);
    if (s) s = st_status_annotate(s, "%s does not load as a config of this strata", path);
  }
  if (!s) {
    json_t* nested = st_config_json(cfg);
    run->config = st_json_obj();
    st__diff_flatten(nested, "", run->config);
    json_decref(nested);
  }
  st_config_destroy(cfg);
  free(path);
  return s;
}

static st_status st__diff_read_run(st_diff_run* run) {
  if (!st_fs_is_dir(run->dir))
    return st_status_make(ST_CODE_CONFIG, "%s: not a folder; give the run directory strata train printed", run->dir);
  ST_RETURN(st__diff_read_config(run));
  char* path = st_rundir_path(run->dir, ST_RUNDIR_CONTEXT);
  json_t* ctx = NULL;
  st_status s = st_readback_json_object(path, ST__DIFF_MAX_CONTEXT, &ctx);
  free(path);
  if (s) return s;
  if (ctx) {
    run->context = st_json_obj();
    st__diff_flatten(ctx, "", run->context);
    json_decref(ctx);
  }
  ST_RETURN(st_notes_read(run->dir, &run->notes));
  return st__diff_read_metrics(run);
}

/*===-------------------------------------------------------------------===*/
/* Comparing                                                                */
/*===-------------------------------------------------------------------===*/

/* {"key": k, "a": va, "b": vb}; a side that lacks the key has no member. */
static json_t* st__diff_pair(const char* key, const json_t* a, const json_t* b) {
  json_t* d = st_json_obj();
  st_json_put_str(d, "key", key);
  if (a) st_json_put(d, "a", json_incref((json_t*)a));
  if (b) st_json_put(d, "b", json_incref((json_t*)b));
  return d;
}

static json_t* st__diff_config(const st_diff* d) {
  const json_t* a = d->run[0].config;
  const json_t* b = d->run[1].config;
  json_t* experiment = st_json_arr();
  json_t* outside = st_json_arr();
  int64_t same = 0;
  const char* key;
  json_t* va;
  /* Both are this strata's schema: the same keys in the same order. */
  json_object_foreach((json_t*)a, key, va) {
    const json_t* vb = json_object_get(b, key);
    if (vb && st_json_same(va, vb)) {
      same++;
      continue;
    }
    st_json_push(st_config_key_identifies(key) ? experiment : outside, st__diff_pair(key, va, vb));
  }
  json_t* c = st_json_obj();
  st_json_put(c, "differs", experiment);
  st_json_put(c, "differs_outside_experiment", outside);
  st_json_put_int(c, "same", same);
  return c;
}

static json_t* st__diff_context(const st_diff* d) {
  const json_t* a = d->run[0].context;
  const json_t* b = d->run[1].context;
  json_t* c = st_json_obj();
  json_t* missing = st_json_arr();
  st_json_push(missing, st_json_bool(!a));
  st_json_push(missing, st_json_bool(!b));
  st_json_put(c, "missing", missing);
  json_t* differs = st_json_arr();
  int64_t same = 0;
  const char* key;
  json_t* v;
  if (a && b) {
    json_object_foreach((json_t*)a, key, v) {
      const json_t* vb = json_object_get(b, key);
      if (vb && st_json_same(v, vb)) same++;
      else st_json_push(differs, st__diff_pair(key, v, vb));
    }
    json_object_foreach((json_t*)b, key, v) {
      if (!json_object_get(a, key)) st_json_push(differs, st__diff_pair(key, NULL, v));
    }
  }
  st_json_put(c, "differs", differs);
  st_json_put_int(c, "same", same);
  return c;
}

static json_t* st__diff_notes(const st_diff* d) {
  json_t* arr = st_json_arr();
  for (int r = 0; r < 2; ++r) {
    const json_t* notes = d->run[r].notes;
    json_t* o = st_json_obj();
    const json_t* h = st_notes_latest(notes, ST_NOTE_HYPOTHESIS);
    const json_t* c = st_notes_latest(notes, ST_NOTE_CONCLUSION);
    st_json_put(o, "hypothesis", h ? json_incref(json_object_get(h, "text")) : json_null());
    st_json_put(o, "conclusion", c ? json_incref(json_object_get(c, "text")) : json_null());
    const json_t* entries = notes ? json_object_get(notes, "entries") : NULL;
    st_json_put(o, "entries", entries ? json_incref((json_t*)entries) : st_json_arr());
    st_json_push(arr, o);
  }
  return arr;
}

/* The union of both runs' steps, ascending (a merge of two sorted lists). */
static void st__diff_union(st_diff* d) {
  const st_diff_run* a = &d->run[0];
  const st_diff_run* b = &d->run[1];
  d->all = st_xmalloc(sizeof(st_diff_union) * (size_t)(a->n_steps + b->n_steps + 1));
  int64_t i = 0, j = 0, n = 0;
  while (i < a->n_steps || j < b->n_steps) {
    int64_t sa = i < a->n_steps ? a->steps[i].step : INT64_MAX;
    int64_t sb = j < b->n_steps ? b->steps[j].step : INT64_MAX;
    int64_t s = sa < sb ? sa : sb;
    d->all[n++] = (st_diff_union){.step = s, .a = sa == s ? i++ : -1, .b = sb == s ? j++ : -1};
  }
  d->n_all = n;
}

static json_t* st__diff_step_pair(int64_t step, double a, double b, bool with_rel) {
  json_t* o = st_json_obj();
  st_json_put_int(o, "step", step);
  st_json_put(o, "a", st_json_num(a));
  st_json_put(o, "b", st_json_num(b));
  if (with_rel) st_json_put(o, "rel", st_json_num(st_diff_rel(a, b)));
  return o;
}

/* The loss comparison over the steps both runs have. Bitwise: the doubles
 * read back from metrics.jsonl (written with round-trip digits, so these
 * are the bits the trainer computed); two NaNs (non-finite losses) count
 * as the same. */
static json_t* st__diff_loss(const st_diff* d, int64_t* out_first_bits, int64_t* out_first_rel) {
  const st_diff_step* sa = d->run[0].steps;
  const st_diff_step* sb = d->run[1].steps;
  int64_t common = 0, first_bits = -1, first_rel = -1, max_at = -1;
  double max_rel = 0;
  for (int64_t k = 0; k < d->n_all; ++k) {
    const st_diff_union* u = &d->all[k];
    if (u->a < 0 || u->b < 0) continue;
    common++;
    double a = sa[u->a].loss, b = sb[u->b].loss;
    bool same_bits = (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof(a)) == 0;
    if (!same_bits && first_bits < 0) first_bits = k;
    double rel = st_diff_rel(a, b);
    if (rel > d->options.rtol && first_rel < 0) first_rel = k;
    if (rel > max_rel || max_at < 0) max_rel = rel, max_at = k;
  }
  json_t* o = st_json_obj();
  st_json_put_num(o, "rtol", d->options.rtol);
  st_json_put_int(o, "common_steps", common);
  const int64_t firsts[2] = {first_bits, first_rel};
  static const char* const names[2] = {"first_bitwise", "first_over_rtol"};
  for (int f = 0; f < 2; ++f) {
    const st_diff_union* u = firsts[f] >= 0 ? &d->all[firsts[f]] : NULL;
    st_json_put(o, names[f], u ? st__diff_step_pair(u->step, sa[u->a].loss, sb[u->b].loss, true) : json_null());
  }
  const st_diff_union* m = max_at >= 0 ? &d->all[max_at] : NULL;
  st_json_put(o, "max_rel", m ? st__diff_step_pair(m->step, sa[m->a].loss, sb[m->b].loss, true) : json_null());
  *out_first_bits = first_bits;
  *out_first_rel = first_rel;
  return o;
}

static int st__diff_cmp_double(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y; /* finite: the caller keeps no NaN */
  return (a > b) - (a < b);
}

static int st__diff_cmp_i64(const void* x, const void* y) {
  int64_t a = *(const int64_t*)x, b = *(const int64_t*)y;
  return (a > b) - (a < b);
}

/* Up to options.samples steps of the union, evenly spaced with the first
 * and the last, plus the first differing steps: both runs side by side. */
static json_t* st__diff_samples(const st_diff* d, int64_t first_bits, int64_t first_rel) {
  int k = d->options.samples;
  int64_t* pick = st_xmalloc(sizeof(int64_t) * (size_t)(k + 2));
  int n = 0;
  if (d->n_all > 0) {
    for (int i = 0; i < k; ++i) pick[n++] = k == 1 ? 0 : (int64_t)((double)i * (double)(d->n_all - 1) / (k - 1) + 0.5);
    if (first_bits >= 0) pick[n++] = first_bits;
    if (first_rel >= 0) pick[n++] = first_rel;
  }
  qsort(pick, (size_t)n, sizeof(int64_t), st__diff_cmp_i64);
  json_t* arr = st_json_arr();
  for (int i = 0; i < n; ++i) {
    if (i && pick[i] == pick[i - 1]) continue;
    const st_diff_union* u = &d->all[pick[i]];
    const st_diff_step* a = u->a >= 0 ? &d->run[0].steps[u->a] : NULL;
    const st_diff_step* b = u->b >= 0 ? &d->run[1].steps[u->b] : NULL;
    json_t* o = st_json_obj();
    st_json_put_int(o, "step", u->step);
    static const char* const fields[] = {"loss", "lr", "grad_norm", "tokens_per_s"};
    for (int f = 0; f < 4; ++f) {
      double va = !a ? NAN : f == 0 ? a->loss : f == 1 ? a->lr : f == 2 ? a->grad_norm : a->tokens_per_s;
      double vb = !b ? NAN : f == 0 ? b->loss : f == 1 ? b->lr : f == 2 ? b->grad_norm : b->tokens_per_s;
      json_t* pair = st_json_arr();
      st_json_push(pair, st_json_num(va));
      st_json_push(pair, st_json_num(vb));
      st_json_put(o, fields[f], pair);
    }
    st_json_push(arr, o);
  }
  free(pick);
  return arr;
}

/* Every eval step of either run, both losses side by side. */
static json_t* st__diff_evals(const st_diff* d) {
  const st_diff_run* a = &d->run[0];
  const st_diff_run* b = &d->run[1];
  json_t* arr = st_json_arr();
  int64_t i = 0, j = 0;
  while (i < a->n_evals || j < b->n_evals) {
    int64_t sa = i < a->n_evals ? a->evals[i].step : INT64_MAX;
    int64_t sb = j < b->n_evals ? b->evals[j].step : INT64_MAX;
    int64_t s = sa < sb ? sa : sb;
    st_json_push(arr, st__diff_step_pair(s, sa == s ? a->evals[i++].loss : NAN, sb == s ? b->evals[j++].loss : NAN, false));
  }
  return arr;
}

/* The median of a field over a run's steps but its first (whose time
 * includes the programs' first execution); NaN when none is finite. */
static double st__diff_median(const st_diff_run* r, bool step_time) {
  double* v = st_xmalloc(sizeof(double) * (size_t)(r->n_steps + 1));
  int64_t n = 0;
  for (int64_t i = r->n_steps > 1 ? 1 : 0; i < r->n_steps; ++i) {
    double x = step_time ? r->steps[i].step_time_s : r->steps[i].tokens_per_s;
    if (isfinite(x)) v[n++] = x;
  }
  qsort(v, (size_t)n, sizeof(double), st__diff_cmp_double);
  double m = n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  free(v);
  return m;
}

static json_t* st__diff_throughput(const st_diff* d) {
  json_t* o = st_json_obj();
  static const char* const names[2] = {"median_tokens_per_s", "median_step_time_s"};
  double tps[2] = {NAN, NAN};
  for (int f = 0; f < 2; ++f) {
    json_t* pair = st_json_arr();
    for (int r = 0; r < 2; ++r) {
      double m = st__diff_median(&d->run[r], f == 1);
      if (f == 0) tps[r] = m;
      st_json_push(pair, st_json_num(m));
    }
    st_json_put(o, names[f], pair);
  }
  st_json_put(o, "ratio_b_over_a", st_json_num(tps[0] > 0 ? tps[1] / tps[0] : NAN));
  return o;
}

static json_t* st__diff_run_json(const st_diff_run* r) {
  json_t* o = st_json_obj();
  st_json_put_str(o, "dir", r->dir);
  const json_t* id = r->context ? json_object_get(r->context, "run_id") : NULL;
  st_json_put(o, "run_id", json_is_string(id) ? json_incref((json_t*)id) : st_json_str(st_rundir_id(r->dir)));
  st_json_put_int(o, "steps", r->n_steps);
  st_json_put(o, "first_step", r->n_steps ? st_json_int(r->steps[0].step) : json_null());
  st_json_put(o, "last_step", r->n_steps ? st_json_int(r->steps[r->n_steps - 1].step) : json_null());
  st_json_put_int(o, "step_lines", r->step_lines);
  st_json_put_int(o, "evals", r->n_evals);
  st_json_put_bool(o, "incomplete_last_line", r->torn);
  return o;
}

st_status st_diff_open(const char* dir_a, const char* dir_b, const st_diff_options* options, st_diff** out) {
  *out = NULL;
  st_diff* d = st_xcalloc(1, sizeof(st_diff));
  d->options = options ? *options : (st_diff_options){0};
  if (!(d->options.rtol > 0)) d->options.rtol = 1e-6;
  if (d->options.samples <= 0) d->options.samples = 10;
  d->run[0].dir = dir_a;
  d->run[1].dir = dir_b;
  st_status s = ST_OK;
  for (int r = 0; r < 2 && !s; ++r)
    s = st_status_annotate(st__diff_read_run(&d->run[r]), "strata diff: run %s", r ? "B" : "A");
  if (s) {
    st_diff_free(d);
    return s;
  }
  st__diff_union(d);
  int64_t first_bits = -1, first_rel = -1;
  json_t* j = st_json_obj();
  st_json_put_int(j, "schema", 1);
  json_t* runs = st_json_arr();
  st_json_push(runs, st__diff_run_json(&d->run[0]));
  st_json_push(runs, st__diff_run_json(&d->run[1]));
  st_json_put(j, "runs", runs);
  st_json_put(j, "config", st__diff_config(d));
  st_json_put(j, "context", st__diff_context(d));
  st_json_put(j, "notes", st__diff_notes(d));
  st_json_put(j, "loss", st__diff_loss(d, &first_bits, &first_rel));
  st_json_put(j, "samples", st__diff_samples(d, first_bits, first_rel));
  st_json_put(j, "evals", st__diff_evals(d));
  st_json_put(j, "throughput", st__diff_throughput(d));
  d->json = j;
  *out = d;
  return ST_OK;
}

const json_t* st_diff_json(const st_diff* d) { return d->json; }

void st_diff_free(st_diff* d) {
  if (!d) return;
  for (int r = 0; r < 2; ++r) {
    free(d->run[r].steps);
    free(d->run[r].evals);
    json_decref(d->run[r].config);
    json_decref(d->run[r].context);
    json_decref(d->run[r].notes);
  }
  free(d->all);
  json_decref(d->json);
  free(d);
}
