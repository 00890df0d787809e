/* diff_html.c — strata diff's HTML page (st_diff_html): the report's page
 * (obs/page.c: head, policy, style, rows, notes) and plots (obs/svg.c),
 * with both runs' curves overlaid. Tables come from the diff's JSON, the
 * curves from the step lines it kept, thinned for drawing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "obs/diff.h"
#include "obs/page.h"
#include "obs/svg.h"
#include "strata/base.h"
#include "strata/obs.h"

#define ST__DIFF_MAX_POINTS 2048 /* per series drawn: evenly spaced, and the last */

enum { ST__DF_LOSS, ST__DF_LR, ST__DF_GNORM, ST__DF_TPS, ST__DF_REL, ST__DF_EVAL };

/* The value of |field| at a union entry (ST__DF_REL: the relative loss
 * difference, NaN unless both runs have the step). */
static double st__diff_html_value(const st_diff* d, int r, int64_t k, int field) {
  if (field == ST__DF_EVAL) return d->run[r].evals[k].loss;
  if (field == ST__DF_REL) {
    const st_diff_union* u = &d->all[k];
    if (u->a < 0 || u->b < 0) return NAN;
    return st_diff_rel(d->run[0].steps[u->a].loss, d->run[1].steps[u->b].loss);
  }
  const st_diff_step* s = &d->run[r].steps[k];
  return field == ST__DF_LOSS ? s->loss : field == ST__DF_LR ? s->lr : field == ST__DF_GNORM ? s->grad_norm : s->tokens_per_s;
}

/* One series, thinned to at most ST__DIFF_MAX_POINTS (owned arrays in |out|). */
static void st__diff_html_series(const st_diff* d, int r, int field, const char* name, bool dashed, st_svg_series* out) {
  /* A is the palette's first colour and B its second in every plot; eval
   * losses are their run's colour, dashed. */
  int64_t n = field == ST__DF_EVAL ? d->run[r].n_evals : field == ST__DF_REL ? d->n_all : d->run[r].n_steps;
  int64_t stride = n > ST__DIFF_MAX_POINTS ? (n + ST__DIFF_MAX_POINTS - 2) / (ST__DIFF_MAX_POINTS - 1) : 1;
  double* x = st_xmalloc(sizeof(double) * (ST__DIFF_MAX_POINTS + 1));
  double* y = st_xmalloc(sizeof(double) * (ST__DIFF_MAX_POINTS + 1));
  int m = 0;
  for (int64_t k = 0; k < n; k += stride) {
    int64_t step = field == ST__DF_EVAL ? d->run[r].evals[k].step : field == ST__DF_REL ? d->all[k].step : d->run[r].steps[k].step;
    x[m] = (double)step;
    y[m++] = st__diff_html_value(d, r, k, field);
    if (k + stride >= n && k != n - 1) k = n - 1 - stride; /* the last point too */
  }
  *out = (st_svg_series){.name = name, .x = x, .y = y, .n = m, .dashed = dashed, .color = r + 1};
}

static void st__diff_html_free(st_svg_series* s, int n) {
  for (int i = 0; i < n; ++i) {
    free((void*)s[i].x);
    free((void*)s[i].y);
  }
}

/* A plot of |field| of both runs overlaid. */
static void st__diff_html_overlay(st_strbuf* o, const st_diff* d, const char* id, const char* title, const char* ylabel,
                                  int field, bool y_zero) {
  st_svg_series s[2];
  st__diff_html_series(d, 0, field, "A", false, &s[0]);
  st__diff_html_series(d, 1, field, "B", false, &s[1]);
  st_svg_plot p = {.id = id, .title = title, .x_label = "step", .y_label = ylabel, .y_zero = y_zero};
  st_svg_lines(o, &p, s, 2);
  st__diff_html_free(s, 2);
}

static void st__diff_html_plots(st_strbuf* o, const st_diff* d) {
  st_strbuf_append(o, "<h2>Curves</h2>\n<div class=\"plots\">\n");
  st_svg_series s[4];
  st__diff_html_series(d, 0, ST__DF_LOSS, "A train loss", false, &s[0]);
  st__diff_html_series(d, 1, ST__DF_LOSS, "B train loss", false, &s[1]);
  st__diff_html_series(d, 0, ST__DF_EVAL, "A eval loss", true, &s[2]);
  st__diff_html_series(d, 1, ST__DF_EVAL, "B eval loss", true, &s[3]);
  int n = d->run[0].n_evals || d->run[1].n_evals ? 4 : 2;
  st_svg_plot p = {.id = "plot-loss", .title = "Loss: A and B", .x_label = "step", .y_label = "loss (nats/token)"};
  st_svg_lines(o, &p, s, n);
  st__diff_html_free(s, 4);
  st__diff_html_series(d, 0, ST__DF_REL, "|A - B| / max(|A|, |B|)", false, &s[0]);
  /* The threshold as a flat line over the same steps. */
  double* ty = st_xmalloc(sizeof(double) * (size_t)(s[0].n ? s[0].n : 1));
  for (int i = 0; i < s[0].n; ++i) ty[i] = d->options.rtol;
  s[0].color = 5; /* neither run's colour: it is both */
  s[1] = (st_svg_series){.name = "rtol", .x = s[0].x, .y = ty, .n = s[0].n, .dashed = true, .color = 6};
  st_svg_plot rel = {.id = "plot-loss-rel", .title = "Relative loss difference, steps in both runs", .x_label = "step",
                     .y_label = "relative difference", .y_zero = true};
  st_svg_lines(o, &rel, s, 2);
  free(ty);
  st__diff_html_free(s, 1);
  st__diff_html_overlay(o, d, "plot-tokens-per-s", "Throughput: A and B", "tokens/s", ST__DF_TPS, true);
  st__diff_html_overlay(o, d, "plot-lr", "Learning rate: A and B", "lr", ST__DF_LR, true);
  st__diff_html_overlay(o, d, "plot-grad-norm", "Gradient norm: A and B", "global L2 norm", ST__DF_GNORM, true);
  st_strbuf_append(o, "</div>\n");
}

/* A table of {"key", "a", "b"} rows. */
static void st__diff_html_pairs(st_strbuf* o, const char* id, const json_t* pairs) {
  if (!json_array_size(pairs)) {
    st_strbuf_append(o, "<p class=\"note\">none</p>\n");
    return;
  }
  st_strbuf_printf(o, "<table class=\"list\" id=\"%s\"><tr><th>key</th><th>A</th><th>B</th></tr>\n", id);
  for (size_t i = 0; i < json_array_size(pairs); ++i) {
    const json_t* p = json_array_get(pairs, i);
    st_strbuf_append(o, "<tr><th>");
    st__html_text(o, json_string_value(json_object_get(p, "key")));
    st_strbuf_append(o, "</th>");
    for (int r = 0; r < 2; ++r) {
      const json_t* v = json_object_get(p, r ? "b" : "a");
      st_strbuf_append(o, "<td class=\"ev\">");
      if (v) st_page_json_value(o, v);
      else st_strbuf_append(o, "<i>absent</i>");
      st_strbuf_append(o, "</td>");
    }
    st_strbuf_append(o, "</tr>\n");
  }
  st_strbuf_append(o, "</table>\n");
}

/* One line of the summary: "step N (A x, B y; relative difference r)" or "none". */
static void st__diff_html_first(st_strbuf* o, const char* label, const json_t* f) {
  st_strbuf v = {0};
  if (json_is_object(f)) {
    const json_t* a = json_object_get(f, "a");
    const json_t* b = json_object_get(f, "b");
    const json_t* rel = json_object_get(f, "rel");
    st_strbuf_printf(&v, "step %lld (A %.17g, B %.17g; relative difference %.3g)",
                     (long long)json_integer_value(json_object_get(f, "step")), json_is_number(a) ? json_number_value(a) : NAN,
                     json_is_number(b) ? json_number_value(b) : NAN, json_is_number(rel) ? json_number_value(rel) : INFINITY);
  } else {
    st_strbuf_append(&v, "none");
  }
  st_page_row(o, label, st_strbuf_cstr(&v));
  st_strbuf_free(&v);
}

static void st__diff_html_summary(st_strbuf* o, const st_diff* d) {
  const json_t* j = d->json;
  st_strbuf_append(o, "<h2>Summary</h2>\n<table id=\"summary\">\n");
  const json_t* runs = json_object_get(j, "runs");
  for (int r = 0; r < 2; ++r) {
    const json_t* run = json_array_get(runs, (size_t)r);
    st_strbuf v = {0};
    st_strbuf_printf(&v, "%s: %lld steps, %lld evaluations%s", json_string_value(json_object_get(run, "dir")),
                     (long long)json_integer_value(json_object_get(run, "steps")),
                     (long long)json_integer_value(json_object_get(run, "evals")),
                     json_is_true(json_object_get(run, "incomplete_last_line")) ? " (an incomplete last line left out)" : "");
    st_page_row(o, r ? "run B" : "run A", st_strbuf_cstr(&v));
    st_strbuf_free(&v);
  }
  const json_t* l = json_object_get(j, "loss");
  st_strbuf v = {0};
  st_strbuf_printf(&v, "%lld", (long long)json_integer_value(json_object_get(l, "common_steps")));
  st_page_row(o, "steps in both runs", st_strbuf_cstr(&v));
  st_strbuf_reset(&v);
  st__diff_html_first(o, "first step whose loss differs (bitwise)", json_object_get(l, "first_bitwise"));
  st_strbuf_printf(&v, "first step whose relative loss difference exceeds %g", d->options.rtol);
  st__diff_html_first(o, st_strbuf_cstr(&v), json_object_get(l, "first_over_rtol"));
  st__diff_html_first(o, "largest relative loss difference", json_object_get(l, "max_rel"));
  st_strbuf_reset(&v);
  const json_t* t = json_object_get(j, "throughput");
  const json_t* tps = json_object_get(t, "median_tokens_per_s");
  const json_t* ratio = json_object_get(t, "ratio_b_over_a");
  st_strbuf_append(&v, "A ");
  st_page_num(&v, json_is_number(json_array_get(tps, 0)) ? json_number_value(json_array_get(tps, 0)) : NAN, "%.1f");
  st_strbuf_append(&v, ", B ");
  st_page_num(&v, json_is_number(json_array_get(tps, 1)) ? json_number_value(json_array_get(tps, 1)) : NAN, "%.1f");
  st_strbuf_append(&v, " (B/A ");
  st_page_num(&v, json_is_number(ratio) ? json_number_value(ratio) : NAN, "%.3f");
  st_strbuf_append(&v, ")");
  st_page_row(o, "median tokens/s after the first step", st_strbuf_cstr(&v));
  st_strbuf_free(&v);
  st_strbuf_append(o, "</table>\n");
}

static void st__diff_html_samples(st_strbuf* o, const json_t* j) {
  st_strbuf_append(o,
                   "<h2>Sampled steps</h2>\n<table class=\"list\" id=\"samples\"><tr><th>step</th><th>loss A</th><th>loss B</th>"
                   "<th>relative difference</th><th>lr A</th><th>lr B</th><th>tokens/s A</th><th>tokens/s B</th></tr>\n");
  const json_t* samples = json_object_get(j, "samples");
  for (size_t i = 0; i < json_array_size(samples); ++i) {
    const json_t* s = json_array_get(samples, i);
    const json_t* loss = json_object_get(s, "loss");
    double a = json_is_number(json_array_get(loss, 0)) ? json_number_value(json_array_get(loss, 0)) : NAN;
    double b = json_is_number(json_array_get(loss, 1)) ? json_number_value(json_array_get(loss, 1)) : NAN;
    st_strbuf_printf(o, "<tr><td class=\"num\">%lld</td>", (long long)json_integer_value(json_object_get(s, "step")));
    static const char* const fmts[] = {"%.7g", "%.7g", "%.2e"};
    const double v3[] = {a, b, isfinite(a) && isfinite(b) ? st_diff_rel(a, b) : NAN};
    for (int k = 0; k < 3; ++k) {
      st_strbuf_append(o, k == 2 && v3[2] != 0 ? "<td class=\"num differs\">" : "<td class=\"num\">");
      st_page_num(o, v3[k], fmts[k]);
      st_strbuf_append(o, "</td>");
    }
    static const char* const fields[] = {"lr", "tokens_per_s"};
    static const char* const ffmt[] = {"%.3g", "%.1f"};
    for (int f = 0; f < 2; ++f)
      for (int r = 0; r < 2; ++r) {
        const json_t* v = json_array_get(json_object_get(s, fields[f]), (size_t)r);
        st_strbuf_append(o, "<td class=\"num\">");
        st_page_num(o, json_is_number(v) ? json_number_value(v) : NAN, ffmt[f]);
        st_strbuf_append(o, "</td>");
      }
    st_strbuf_append(o, "</tr>\n");
  }
  st_strbuf_append(o, "</table>\n");
}

char* st_diff_html(const st_diff* d) {
  const json_t* j = d->json;
  st_strbuf o = {0};
  st_strbuf title = {0};
  st_strbuf_printf(&title, "strata diff: %s vs %s", st_rundir_id(d->run[0].dir), st_rundir_id(d->run[1].dir));
  st_page_begin(&o, st_strbuf_cstr(&title), st_strbuf_cstr(&title));
  st_strbuf_free(&title);
  st__diff_html_summary(&o, d);
  const json_t* c = json_object_get(j, "config");
  st_strbuf_printf(&o, "<h2>Config differences</h2>\n<p class=\"note\">The experiment: every key config_hash covers "
                       "(%lld keys the same).</p>\n",
                   (long long)json_integer_value(json_object_get(c, "same")));
  st__diff_html_pairs(&o, "config-diff", json_object_get(c, "differs"));
  st_strbuf_append(&o, "<p class=\"note\">Outside the experiment (run.*, obs.*: where and how it ran):</p>\n");
  st__diff_html_pairs(&o, "config-diff-outside", json_object_get(c, "differs_outside_experiment"));
  const json_t* ctx = json_object_get(j, "context");
  st_strbuf_append(&o, "<h2>Context differences</h2>\n");
  const json_t* missing = json_object_get(ctx, "missing");
  if (json_is_true(json_array_get(missing, 0)) || json_is_true(json_array_get(missing, 1)))
    st_strbuf_append(&o, "<p class=\"warn\">not compared: a run has no context.json</p>\n");
  else
    st__diff_html_pairs(&o, "context-diff", json_object_get(ctx, "differs"));
  st_strbuf_append(&o, "<h2>Notes</h2>\n");
  for (int r = 0; r < 2; ++r) {
    st_strbuf_printf(&o, "<h3>%s: ", r ? "B" : "A");
    st__html_text(&o, d->run[r].dir);
    st_strbuf_append(&o, "</h3>\n");
    st_page_notes(&o, d->run[r].notes, NULL);
  }
  st__diff_html_plots(&o, d);
  st__diff_html_samples(&o, j);
  st_page_end(&o, "diff");
  return st_strbuf_take(&o);
}
