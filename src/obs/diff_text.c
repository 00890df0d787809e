/* diff_text.c — strata diff's text for a terminal (st_diff_text), written
 * from the same JSON --json prints, so the two never disagree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "obs/diff.h"
#include "strata/base.h"
#include "strata/obs.h"

#define ST__DIFF_TEXT_VALUE 80 /* characters of a value shown; --json has it whole */

/* A value as compact JSON (strings quoted, so "" shows; control bytes
 * escaped), cut; "(absent)" for NULL. New string. */
static char* st__diff_value_text(const json_t* v) {
  if (!v) return st_xstrdup("(absent)");
  char* t = st_json_dump(v, 0);
  if (strlen(t) > ST__DIFF_TEXT_VALUE) {
    size_t k = ST__DIFF_TEXT_VALUE - 3;
    while (k > 0 && ((unsigned char)t[k] & 0xc0) == 0x80) --k; /* a whole UTF-8 character */
    memcpy(t + k, "...", 4);
  }
  return t;
}

/* A free text (a note) on one line: control characters as '?'. */
static void st__diff_text_line(st_strbuf* o, const char* s) {
  for (; s && *s; ++s) {
    unsigned char c = (unsigned char)*s;
    char ch[2] = {(char)(c < 0x20 || c == 0x7f ? (c == '\n' || c == '\t' ? ' ' : '?') : c), 0};
    st_strbuf_append(o, ch);
  }
}

/* Rows of {"key", "a", "b"}: key, A's value, B's value, aligned. */
static void st__diff_pairs(st_strbuf* o, const json_t* pairs) {
  size_t n = json_array_size(pairs);
  int kw = 3, aw = 1;
  char** av = st_xcalloc(n + 1, sizeof(char*));
  char** bv = st_xcalloc(n + 1, sizeof(char*));
  for (size_t i = 0; i < n; ++i) {
    const json_t* p = json_array_get(pairs, i);
    int kl = (int)strlen(json_string_value(json_object_get(p, "key")));
    if (kl > kw) kw = kl < 48 ? kl : 48;
    av[i] = st__diff_value_text(json_object_get(p, "a"));
    bv[i] = st__diff_value_text(json_object_get(p, "b"));
    if ((int)strlen(av[i]) > aw) aw = (int)strlen(av[i]) < 40 ? (int)strlen(av[i]) : 40;
  }
  st_strbuf_printf(o, "  %-*s  %-*s  %s\n", kw, "key", aw, "A", "B");
  for (size_t i = 0; i < n; ++i) {
    const json_t* p = json_array_get(pairs, i);
    st_strbuf_printf(o, "  %-*s  %-*s  %s\n", kw, json_string_value(json_object_get(p, "key")), aw, av[i], bv[i]);
    free(av[i]);
    free(bv[i]);
  }
  free(av);
  free(bv);
}

static void st__diff_text_config(st_strbuf* o, const json_t* j) {
  const json_t* c = json_object_get(j, "config");
  const json_t* differs = json_object_get(c, "differs");
  const json_t* outside = json_object_get(c, "differs_outside_experiment");
  size_t n = json_array_size(differs);
  st_strbuf_printf(o, "\nconfig (the experiment: every key config_hash covers): %zu key%s differ%s, %lld the same\n", n,
                   n == 1 ? "" : "s", n == 1 ? "s" : "", (long long)json_integer_value(json_object_get(c, "same")));
  if (n) st__diff_pairs(o, differs);
  n = json_array_size(outside);
  st_strbuf_printf(o, "config outside the experiment (run.*, obs.*: where and how it ran): %zu key%s differ%s\n", n,
                   n == 1 ? "" : "s", n == 1 ? "s" : "");
  if (n) st__diff_pairs(o, outside);
}

static void st__diff_text_context(st_strbuf* o, const json_t* j) {
  const json_t* c = json_object_get(j, "context");
  const json_t* missing = json_object_get(c, "missing");
  bool ma = json_is_true(json_array_get(missing, 0)), mb = json_is_true(json_array_get(missing, 1));
  if (ma || mb) {
    st_strbuf_printf(o, "\ncontext: not compared: %s%s%s has no context.json\n", ma ? "A" : "", ma && mb ? " and " : "",
                     mb ? "B" : "");
    return;
  }
  const json_t* differs = json_object_get(c, "differs");
  size_t n = json_array_size(differs);
  st_strbuf_printf(o, "\ncontext (context.json): %zu key%s differ%s, %lld the same\n", n, n == 1 ? "" : "s",
                   n == 1 ? "s" : "", (long long)json_integer_value(json_object_get(c, "same")));
  if (n) st__diff_pairs(o, differs);
}

static void st__diff_text_notes(st_strbuf* o, const json_t* j) {
  st_strbuf_append(o, "\nnotes (strata note)\n");
  const json_t* notes = json_object_get(j, "notes");
  for (int r = 0; r < 2; ++r) {
    const json_t* n = json_array_get(notes, (size_t)r);
    static const char* const kinds[] = {"hypothesis", "conclusion"};
    for (int k = 0; k < 2; ++k) {
      const char* t = json_string_value(json_object_get(n, kinds[k]));
      st_strbuf_printf(o, "  %s %s: ", k ? " " : r ? "B" : "A", kinds[k]);
      if (t) st__diff_text_line(o, t);
      else st_strbuf_append(o, "(none)");
      st_strbuf_append(o, "\n");
    }
    size_t e = json_array_size(json_object_get(n, "entries"));
    st_strbuf_printf(o, "    %zu entr%s (strata note %s shows them)\n", e, e == 1 ? "y" : "ies",
                     json_string_value(json_object_get(json_array_get(json_object_get(j, "runs"), (size_t)r), "dir")));
  }
}

static void st__diff_text_loss(st_strbuf* o, const json_t* j) {
  const json_t* l = json_object_get(j, "loss");
  int64_t common = json_integer_value(json_object_get(l, "common_steps"));
  st_strbuf_printf(o, "\nloss: %lld step%s in both runs\n", (long long)common, common == 1 ? "" : "s");
  char rtol[ST_DOUBLE_CHARS];
  st_format_double(json_number_value(json_object_get(l, "rtol")), rtol);
  static const char* const keys[] = {"first_bitwise", "first_over_rtol", "max_rel"};
  for (int k = 0; k < 3; ++k) {
    const json_t* f = json_object_get(l, keys[k]);
    if (k == 0) st_strbuf_append(o, "  first step whose loss differs (bitwise): ");
    else if (k == 1) st_strbuf_printf(o, "  first step whose relative difference exceeds %s: ", rtol);
    else st_strbuf_append(o, "  largest relative difference: ");
    if (json_is_null(f) || !f) {
      st_strbuf_append(o, common ? "none\n" : "none (no step in both runs)\n");
      continue;
    }
    double a = json_is_number(json_object_get(f, "a")) ? json_number_value(json_object_get(f, "a")) : NAN;
    double b = json_is_number(json_object_get(f, "b")) ? json_number_value(json_object_get(f, "b")) : NAN;
    double rel = json_is_number(json_object_get(f, "rel")) ? json_number_value(json_object_get(f, "rel")) : INFINITY;
    st_strbuf_printf(o, "step %lld (A %.17g, B %.17g; relative difference %.3g)\n",
                     (long long)json_integer_value(json_object_get(f, "step")), a, b, rel);
  }
}

/* A number of a [a, b] pair, NaN for null. */
static double st__diff_pair_num(const json_t* pair, int r) {
  const json_t* v = json_array_get(pair, (size_t)r);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

static void st__diff_cell(st_strbuf* o, double v, const char* fmt, int width) {
  char cell[64];
  if (isfinite(v)) snprintf(cell, sizeof(cell), fmt, v);
  else snprintf(cell, sizeof(cell), "-");
  st_strbuf_printf(o, " %*s", width, cell);
}

static void st__diff_text_samples(st_strbuf* o, const json_t* j) {
  const json_t* samples = json_object_get(j, "samples");
  const json_t* fb = json_object_get(json_object_get(j, "loss"), "first_bitwise");
  int64_t first = json_is_object(fb) ? json_integer_value(json_object_get(fb, "step")) : -1;
  st_strbuf_append(o, "\ncurves at sampled steps (* the first step whose loss differs; - absent)\n");
  st_strbuf_printf(o, "  %9s %12s %12s %9s %9s %9s %10s %10s %10s %10s\n", "step", "loss A", "loss B", "rel diff", "lr A", "lr B",
                   "gnorm A", "gnorm B", "tok/s A", "tok/s B");
  for (size_t i = 0; i < json_array_size(samples); ++i) {
    const json_t* s = json_array_get(samples, i);
    int64_t step = json_integer_value(json_object_get(s, "step"));
    const json_t* loss = json_object_get(s, "loss");
    st_strbuf_printf(o, "  %8lld%s", (long long)step, step == first ? "*" : " ");
    double a = st__diff_pair_num(loss, 0), b = st__diff_pair_num(loss, 1);
    st__diff_cell(o, a, "%.7g", 12);
    st__diff_cell(o, b, "%.7g", 12);
    st__diff_cell(o, isfinite(a) && isfinite(b) ? st_diff_rel(a, b) : NAN, "%.2e", 9);
    static const char* const fields[] = {"lr", "grad_norm", "tokens_per_s"};
    static const char* const fmts[] = {"%.3g", "%.4g", "%.1f"};
    static const int widths[] = {9, 10, 10};
    for (int f = 0; f < 3; ++f)
      for (int r = 0; r < 2; ++r) st__diff_cell(o, st__diff_pair_num(json_object_get(s, fields[f]), r), fmts[f], widths[f]);
    st_strbuf_append(o, "\n");
  }
}

static void st__diff_text_evals(st_strbuf* o, const json_t* j, int samples) {
  const json_t* evals = json_object_get(j, "evals");
  size_t n = json_array_size(evals);
  if (!n) {
    st_strbuf_append(o, "\neval loss: no evaluation in either run\n");
    return;
  }
  size_t show = n <= (size_t)samples * 2 ? n : (size_t)samples;
  st_strbuf_printf(o, "\neval loss (%zu evaluation step%s%s)\n", n, n == 1 ? "" : "s", show < n ? ", sampled" : "");
  st_strbuf_printf(o, "  %9s %12s %12s %9s\n", "step", "A", "B", "rel diff");
  size_t prev = (size_t)-1;
  for (size_t i = 0; i < show; ++i) {
    size_t k = show == n || show == 1 ? i : (size_t)((double)i * (double)(n - 1) / (double)(show - 1) + 0.5);
    if (k == prev) continue;
    prev = k;
    const json_t* e = json_array_get(evals, k);
    double a = json_is_number(json_object_get(e, "a")) ? json_number_value(json_object_get(e, "a")) : NAN;
    double b = json_is_number(json_object_get(e, "b")) ? json_number_value(json_object_get(e, "b")) : NAN;
    st_strbuf_printf(o, "  %9lld", (long long)json_integer_value(json_object_get(e, "step")));
    st__diff_cell(o, a, "%.7g", 12);
    st__diff_cell(o, b, "%.7g", 12);
    st__diff_cell(o, isfinite(a) && isfinite(b) ? st_diff_rel(a, b) : NAN, "%.2e", 9);
    st_strbuf_append(o, "\n");
  }
}

static void st__diff_text_throughput(st_strbuf* o, const json_t* j) {
  const json_t* t = json_object_get(j, "throughput");
  const json_t* tps = json_object_get(t, "median_tokens_per_s");
  const json_t* st = json_object_get(t, "median_step_time_s");
  st_strbuf_append(o, "\nthroughput (median over the steps after the first):\n  tokens/s  A");
  st__diff_cell(o, st__diff_pair_num(tps, 0), "%.1f", 10);
  st_strbuf_append(o, "  B");
  st__diff_cell(o, st__diff_pair_num(tps, 1), "%.1f", 10);
  const json_t* ratio = json_object_get(t, "ratio_b_over_a");
  st_strbuf_append(o, "  B/A");
  st__diff_cell(o, json_is_number(ratio) ? json_number_value(ratio) : NAN, "%.3f", 6);
  st_strbuf_append(o, "\n  step time A");
  st__diff_cell(o, st__diff_pair_num(st, 0), "%.4g", 10);
  st_strbuf_append(o, "  B");
  st__diff_cell(o, st__diff_pair_num(st, 1), "%.4g", 10);
  st_strbuf_append(o, " (seconds)\n");
}

void st_diff_text(const st_diff* d, st_strbuf* o) {
  const json_t* j = d->json;
  st_strbuf_append(o, "strata diff\n");
  const json_t* runs = json_object_get(j, "runs");
  for (int r = 0; r < 2; ++r) {
    const json_t* run = json_array_get(runs, (size_t)r);
    int64_t n = json_integer_value(json_object_get(run, "steps"));
    st_strbuf_printf(o, "  %s  %s: %lld step%s", r ? "B" : "A", json_string_value(json_object_get(run, "dir")), (long long)n,
                     n == 1 ? "" : "s");
    if (n)
      st_strbuf_printf(o, " (%lld..%lld)", (long long)json_integer_value(json_object_get(run, "first_step")),
                       (long long)json_integer_value(json_object_get(run, "last_step")));
    st_strbuf_printf(o, ", %lld evaluation%s\n", (long long)json_integer_value(json_object_get(run, "evals")),
                     json_integer_value(json_object_get(run, "evals")) == 1 ? "" : "s");
    if (json_is_true(json_object_get(run, "incomplete_last_line")))
      st_strbuf_printf(o, "     its metrics.jsonl ends in an incomplete line (the run may be writing it): left out\n");
  }
  st__diff_text_config(o, j);
  st__diff_text_context(o, j);
  st__diff_text_notes(o, j);
  st__diff_text_loss(o, j);
  st__diff_text_samples(o, j);
  st__diff_text_evals(o, j, d->options.samples);
  st__diff_text_throughput(o, j);
}
