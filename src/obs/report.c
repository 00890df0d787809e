/* report.c — `strata report`: one self-contained HTML page about a run
 * (docs/using.md, "strata report"), from its run directory alone.
 *
 * Everything in a run directory is untrusted here (it may be cut by a
 * crash, edited, or someone else's): the logs are streamed with a bounded
 * line length (st_jsonl_read) and bad lines counted, not fatal; the step
 * series are thinned to at most ST__MAX_POINTS points whatever the run's
 * length; every other file is read up to a size bound; every text that
 * reaches the page is HTML-escaped. The page has no script and loads
 * nothing: its Content-Security-Policy forbids every fetch. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "obs/page.h"
#include "obs/readback.h"
#include "obs/svg.h"
#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/obs.h"

#define ST__MAX_POINTS 2048     /* per series, after thinning */
#define ST__MAX_LINE (1 << 20)  /* a metrics or events line longer than this is bad */
#define ST__MAX_EVENTS 2000     /* kept for the table and the timeline: the first and the last half */
#define ST__MAX_CATS 8          /* memory categories */
#define ST__MAX_TEXT (256 * 1024) /* config.yaml, sample.txt shown */
#define ST__MAX_JSON (1 << 20)  /* context.json */
#define ST__MAX_MANIFEST (16 << 20)
#define ST__MAX_CKPTS 200
#define ST__EVENT_TEXT 300 /* an event's details, cut */

/*===-------------------------------------------------------------------===*/
/* The step series                                                          */
/*===-------------------------------------------------------------------===*/

enum {
  F_STEP,
  F_TOKENS, /* cumulative */
  F_LOSS,
  F_LR,
  F_GNORM,
  F_TPS,
  F_STEP_TIME,
  F_WAIT,
  F_HOST,
  F_RECOMPUTE,
  F_TRANSFER,
  F_COMM_WAIT, /* a mesh only */
  F_PEAK,
  F_PEAK_PRED,
  F_CAT0,
  F_COUNT = F_CAT0 + ST__MAX_CATS
};

/* Points thinned by doubling: a line is kept when its index is a multiple
 * of |stride|; when the array is full every other point goes and the
 * stride doubles. So at most |cap| points, evenly spread, in O(1) memory. */
typedef struct st__series {
  double (*pt)[F_COUNT];
  int n, cap;
  int64_t seen, stride;
  double last[F_COUNT]; /* the newest line, kept even when thinned out */
  bool have_last, last_kept;
} st__series;

static void st__series_add(st__series* s, const double* v) {
  memcpy(s->last, v, sizeof(s->last));
  s->have_last = true;
  s->last_kept = false;
  if (s->seen++ % s->stride) return;
  if (s->n == s->cap) {
    int k = 0;
    for (int i = 0; i < s->n; i += 2) memcpy(s->pt[k++], s->pt[i], sizeof(s->pt[0]));
    s->n = k;
    s->stride *= 2;
    if ((s->seen - 1) % s->stride) return;
  }
  memcpy(s->pt[s->n++], v, sizeof(s->pt[0]));
  s->last_kept = true;
}

/* Appends the newest line when thinning dropped it (the plot ends where the run did). */
static void st__series_finish(st__series* s) {
  if (s->have_last && !s->last_kept) {
    if (s->n == s->cap) s->n--;
    memcpy(s->pt[s->n++], s->last, sizeof(s->pt[0]));
  }
}

/* A column of |s| as its own array (owned by the caller). */
static double* st__column(const st__series* s, int f) {
  double* c = st_xmalloc(sizeof(double) * (size_t)(s->n ? s->n : 1));
  for (int i = 0; i < s->n; ++i) c[i] = s->pt[i][f];
  return c;
}

typedef struct st__event {
  double time;
  char name[48];
  char* text; /* the other fields, compact JSON, cut */
} st__event;

typedef struct st__report {
  st__series steps, evals;
  int64_t step_lines, eval_lines, other_lines;
  double tokens_cum;
  int64_t last_step;
  int64_t last_tokens;
  char cats[ST__MAX_CATS][32];
  int cat_count;
  bool cat_used[ST__MAX_CATS];
  st_jsonl_stats metrics_stats, events_stats;
  bool have_metrics, have_events;
  /* Events: the first ST__MAX_EVENTS/2, then a ring of the newest. */
  st__event* events;
  int head_n;
  int64_t ring_seen; /* events past the head */
  double first_time;
  bool have_time;
  char* failure;            /* the newest "failed" event's error, cut */
  int64_t nonfinite_losses; /* step lines whose loss is null (non-finite) */
  int64_t first_nonfinite_step;
  bool have_comm; /* some line has comm_wait_s (a mesh) */
} st__report;

static double st__report_get(const json_t* o, const char* key) {
  const json_t* v = json_object_get(o, key);
  return v && json_is_number(v) ? json_number_value(v) : NAN;
}

static bool st__report_metrics_line(void* user, json_t* m, int64_t byte) {
  (void)byte;
  st__report* r = user;
  int64_t step = 0;
  if (!st_json_as_int(json_object_get(m, "step"), &step) || step < 0) {
    r->other_lines++;
    return true;
  }
  double v[F_COUNT];
  for (int i = 0; i < F_COUNT; ++i) v[i] = NAN;
  v[F_STEP] = (double)step;
  if (json_object_get(m, "eval_loss") && !json_object_get(m, "loss")) {
    /* An eval line follows the step line of its step: it gets that step's tokens. */
    v[F_TOKENS] = step == r->last_step ? r->tokens_cum : (double)step * (double)r->last_tokens;
    v[F_LOSS] = st__report_get(m, "eval_loss");
    st__series_add(&r->evals, v);
    r->eval_lines++;
    return true;
  }
  if (!json_object_get(m, "loss")) {
    r->other_lines++;
    return true;
  }
  int64_t tokens = 0;
  if (!st_json_as_int(json_object_get(m, "tokens"), &tokens) || tokens < 0) tokens = 0;
  /* Steps in order add up; after a resume (steps repeat from the checkpoint)
   * or a gap, the count restarts from step x tokens per step. */
  if (step == r->last_step + 1) r->tokens_cum += (double)tokens;
  else r->tokens_cum = (double)step * (double)tokens;
  r->last_step = step;
  r->last_tokens = tokens;
  v[F_TOKENS] = r->tokens_cum;
  v[F_LOSS] = st__report_get(m, "loss");
  if (!isfinite(v[F_LOSS]) && !r->nonfinite_losses++) r->first_nonfinite_step = step;
  v[F_LR] = st__report_get(m, "lr");
  v[F_GNORM] = st__report_get(m, "grad_norm");
  v[F_TPS] = st__report_get(m, "tokens_per_s");
  v[F_STEP_TIME] = st__report_get(m, "step_time_s");
  v[F_WAIT] = st__report_get(m, "wait_s");
  if (isfinite(v[F_STEP_TIME]) && isfinite(v[F_WAIT])) v[F_HOST] = fmax(0.0, v[F_STEP_TIME] - v[F_WAIT]);
  v[F_RECOMPUTE] = st__report_get(m, "recompute_s");
  v[F_TRANSFER] = st__report_get(m, "transfer_s");
  v[F_COMM_WAIT] = st__report_get(m, "comm_wait_s");
  if (isfinite(v[F_COMM_WAIT])) r->have_comm = true;
  v[F_PEAK] = st__report_get(m, "peak_live_bytes");
  v[F_PEAK_PRED] = st__report_get(m, "peak_live_bytes_predicted");
  const json_t* cats = json_object_get(m, "peak_live_by_category");
  if (json_is_object(cats)) {
    const char* key;
    const json_t* val;
    json_object_foreach((json_t*)cats, key, val) {
      int k = 0;
      while (k < r->cat_count && strcmp(r->cats[k], key)) ++k;
      if (k == r->cat_count) {
        if (k == ST__MAX_CATS || strlen(key) >= sizeof(r->cats[0])) continue;
        snprintf(r->cats[k], sizeof(r->cats[0]), "%s", key);
        r->cat_count++;
      }
      double b = json_is_number(val) ? json_number_value(val) : NAN;
      v[F_CAT0 + k] = b;
      if (isfinite(b) && b != 0) r->cat_used[k] = true;
    }
  }
  st__series_add(&r->steps, v);
  r->step_lines++;
  return true;
}

static st__event* st__event_slot(st__report* r) {
  int half = ST__MAX_EVENTS / 2;
  if (r->head_n < half) return &r->events[r->head_n++];
  st__event* e = &r->events[half + r->ring_seen++ % half];
  free(e->text);
  e->text = NULL;
  return e;
}

static bool st__events_line(void* user, json_t* ev, int64_t byte) {
  (void)byte;
  st__report* r = user;
  const char* name = json_string_value(json_object_get(ev, "event"));
  double t = st__report_get(ev, "time");
  st__event* e = st__event_slot(r);
  snprintf(e->name, sizeof(e->name), "%s", name ? name : "?");
  e->time = t;
  if (isfinite(t) && !r->have_time) r->first_time = t, r->have_time = true;
  const char* err = json_string_value(json_object_get(ev, "error"));
  if (name && !strcmp(name, "failed") && err) {
    free(r->failure);
    r->failure = st_xstrdup(err);
    if (strlen(r->failure) > 4 * ST__EVENT_TEXT) r->failure[4 * ST__EVENT_TEXT] = '\0'; /* the escaper repairs a cut character */
  }
  json_t* rest = json_deep_copy(ev);
  json_object_del(rest, "time");
  json_object_del(rest, "event");
  json_object_del(rest, "context"); /* shown whole in its own section */
  char* text = st_json_dump(rest, 0);
  json_decref(rest);
  if (strlen(text) > ST__EVENT_TEXT) {
    /* Cut on a UTF-8 boundary and mark it. */
    size_t k = ST__EVENT_TEXT - 3; /* room for the 3-byte ellipsis and the NUL within the text */
    while (k > 0 && ((unsigned char)text[k] & 0xc0) == 0x80) --k;
    memcpy(text + k, "\xe2\x80\xa6", 4);
  }
  e->text = text;
  return true;
}

/* The kept events in order (borrowed pointers into r->events). */
static int st__events_ordered(const st__report* r, const st__event** out) {
  int half = ST__MAX_EVENTS / 2, n = 0;
  for (int i = 0; i < r->head_n; ++i) out[n++] = &r->events[i];
  int64_t ring = r->ring_seen < half ? r->ring_seen : half;
  for (int64_t i = 0; i < ring; ++i) out[n++] = &r->events[half + (r->ring_seen - ring + i) % half];
  return n;
}

/*===-------------------------------------------------------------------===*/
/* Files                                                                    */
/*===-------------------------------------------------------------------===*/

/*===-------------------------------------------------------------------===*/
/* The page                                                                 */
/*===-------------------------------------------------------------------===*/

static void st__plot(st_strbuf* o, const st__report* r, const char* id, const char* title, const char* xlabel, const char* ylabel,
                     bool y_zero, const int* fields, const char* const* names, int count, int xfield) {
  double* x = st__column(&r->steps, xfield);
  double* cols[8];
  st_svg_series s[8];
  for (int i = 0; i < count; ++i) {
    cols[i] = st__column(&r->steps, fields[i]);
    s[i] = (st_svg_series){.name = names[i], .x = x, .y = cols[i], .n = r->steps.n};
  }
  st_svg_plot p = {.id = id, .title = title, .x_label = xlabel, .y_label = ylabel, .y_zero = y_zero};
  st_svg_lines(o, &p, s, count);
  for (int i = 0; i < count; ++i) free(cols[i]);
  free(x);
}

static void st__loss_plot(st_strbuf* o, const st__report* r, const char* id, int xfield, const char* xlabel) {
  double* x = st__column(&r->steps, xfield);
  double* y = st__column(&r->steps, F_LOSS);
  double* ex = st__column(&r->evals, xfield);
  double* ey = st__column(&r->evals, F_LOSS);
  st_svg_series s[2] = {{.name = "train loss", .x = x, .y = y, .n = r->steps.n},
                        {.name = "eval loss", .x = ex, .y = ey, .n = r->evals.n}};
  char title[64];
  snprintf(title, sizeof(title), "Loss against %s", xfield == F_STEP ? "steps" : "tokens");
  st_svg_plot p = {.id = id, .title = title, .x_label = xlabel, .y_label = "loss (nats/token)"};
  st_svg_lines(o, &p, s, r->evals.n ? 2 : 1);
  free(x), free(y), free(ex), free(ey);
}

static void st__step_time_plot(st_strbuf* o, const st__report* r) {
  double* x = st__column(&r->steps, F_STEP);
  double* w = st__column(&r->steps, F_WAIT);
  double* h = st__column(&r->steps, F_HOST);
  double* rc = st__column(&r->steps, F_RECOMPUTE);
  double* tr = st__column(&r->steps, F_TRANSFER);
  double* cw = st__column(&r->steps, F_COMM_WAIT);
  int n = r->steps.n;
  st_svg_series s[5] = {{.name = "wait: host blocked on device work", .x = x, .y = w, .n = n, .stacked = true},
                        {.name = "host: issue, batch, clip", .x = x, .y = h, .n = n, .stacked = true},
                        {.name = "recompute", .x = x, .y = rc, .n = n, .dashed = true},
                        {.name = "transfers", .x = x, .y = tr, .n = n, .dashed = true},
                        {.name = "communication wait", .x = x, .y = cw, .n = n, .dashed = true}};
  st_svg_plot p = {.id = "plot-step-time", .title = "Step time: wait + host = step_time_s", .x_label = "step",
                   .y_label = "seconds", .y_zero = true};
  st_svg_lines(o, &p, s, r->have_comm ? 5 : 4);
  free(x), free(w), free(h), free(rc), free(tr), free(cw);
}

static void st__memory_plot(st_strbuf* o, const st__report* r) {
  double* x = st__column(&r->steps, F_STEP);
  double* cols[ST__MAX_CATS + 1];
  st_svg_series s[ST__MAX_CATS + 1];
  int n = 0;
  for (int k = 0; k < r->cat_count; ++k) {
    if (!r->cat_used[k]) continue;
    cols[n] = st__column(&r->steps, F_CAT0 + k);
    s[n] = (st_svg_series){.name = r->cats[k], .x = x, .y = cols[n], .n = r->steps.n, .stacked = true};
    ++n;
  }
  cols[n] = st__column(&r->steps, r->cat_count ? F_PEAK_PRED : F_PEAK);
  s[n] = (st_svg_series){.name = r->cat_count ? "predicted peak" : "peak live bytes", .x = x, .y = cols[n], .n = r->steps.n,
                         .dashed = r->cat_count > 0};
  ++n;
  st_svg_plot p = {.id = "plot-memory", .title = "Device memory at the step's peak, by category", .x_label = "step",
                   .y_label = "bytes", .y_zero = true};
  st_svg_lines(o, &p, s, n);
  for (int i = 0; i < n; ++i) free(cols[i]);
  free(x);
}

/* The timeline lane of an event name. */
static int st__lane(const char* name) {
  if (strstr(name, "eval")) return 1;
  if (!strncmp(name, "ckpt", 4) || strstr(name, "checkpoint")) return 2;
  static const char* const trouble[] = {"fail", "interrupt", "fault", "supervisor", "resum", "restart", "repair",
                                        "hang",  "error",     "nonfinite", "signal", "retry"};
  for (size_t i = 0; i < sizeof(trouble) / sizeof(trouble[0]); ++i)
    if (strstr(name, trouble[i])) return 3;
  return 0;
}

static void st__timeline(st_strbuf* o, const st__report* r, const st__event* const* ev, int n) {
  static const char* const lanes[] = {"run", "eval", "checkpoint", "fault / restart"};
  st_svg_mark* marks = st_xcalloc((size_t)(n ? n : 1), sizeof(st_svg_mark));
  char** labels = st_xcalloc((size_t)(n ? n : 1), sizeof(char*));
  for (int i = 0; i < n; ++i) {
    st_strbuf l = {0};
    double t = ev[i]->time - r->first_time;
    st_strbuf_printf(&l, "%s at %.3f s: %s", ev[i]->name, t, ev[i]->text ? ev[i]->text : "");
    labels[i] = st_strbuf_take(&l);
    marks[i] = (st_svg_mark){.t = r->have_time ? t : NAN, .lane = st__lane(ev[i]->name), .label = labels[i]};
  }
  st_svg_plot p = {.id = "plot-events", .title = "Events (hover a mark for its details)",
                   .x_label = "seconds since the first event"};
  st_svg_timeline(o, &p, lanes, 4, marks, n);
  for (int i = 0; i < n; ++i) free(labels[i]);
  free(labels);
  free(marks);
}

static void st__bad_note(st_strbuf* o, const char* file, const st_jsonl_stats* js) {
  if (js->bad) {
    st_strbuf_printf(o, "<p class=\"warn\">%s: %lld bad line%s skipped (the first at byte %lld: ", file, (long long)js->bad,
                     js->bad == 1 ? "" : "s", (long long)js->first_bad_byte);
    st__html_text(o, js->first_bad_why);
    st_strbuf_append(o, ")</p>\n");
  }
  if (js->torn)
    st_strbuf_printf(o, "<p class=\"note\">%s ends in an incomplete line (being written, or cut by a crash): not shown.</p>\n", file);
}

static void st__report_summary(st_strbuf* o, const st__report* r, const st__event* const* ev, int n, const json_t* ctx) {
  st_strbuf_append(o, "<h2>Summary</h2>\n<table>\n");
  const char* last = n ? ev[n - 1]->name : NULL;
  const char* state = !last                                   ? "unknown (no events)"
                      : !strcmp(last, "done")                 ? "finished"
                      : !strcmp(last, "failed")               ? "failed"
                      : !strcmp(last, "interrupted")          ? "interrupted"
                      : !strcmp(last, "supervisor_done")      ? "ended under strata run (see the events)"
                                                              : "running, or ended without a final event";
  st_page_row(o, "state", state);
  if (r->failure) st_page_row(o, "failure", r->failure);
  st_strbuf s = {0};
  const json_t* cid = ctx ? json_object_get(ctx, "run_id") : NULL;
  if (json_is_string(cid)) st_page_row(o, "run id", json_string_value(cid));
  if (r->have_time) {
    char t[64];
    st_page_utc(r->first_time, t, sizeof(t));
    st_page_row(o, "started", t);
  }
  const double* l = r->steps.have_last ? r->steps.last : NULL;
  st_strbuf_printf(&s, "%lld step lines", (long long)r->step_lines);
  if (l) st_strbuf_printf(&s, ", last step %.0f, %.0f tokens", l[F_STEP], l[F_TOKENS]);
  st_page_row(o, "steps", st_strbuf_cstr(&s));
  st_strbuf_reset(&s);
  if (l) {
    st_page_num(&s, l[F_LOSS], "%.4f");
    st_page_row(o, "final train loss", st_strbuf_cstr(&s));
    st_strbuf_reset(&s);
  }
  if (r->nonfinite_losses) {
    st_strbuf_printf(&s, "%lld step%s (the first at step %lld): gaps in the loss plots", (long long)r->nonfinite_losses,
                     r->nonfinite_losses == 1 ? "" : "s", (long long)r->first_nonfinite_step);
    st_page_row(o, "non-finite loss", st_strbuf_cstr(&s));
    st_strbuf_reset(&s);
  }
  if (r->evals.have_last) {
    st_page_num(&s, r->evals.last[F_LOSS], "%.4f");
    st_strbuf_printf(&s, " (step %.0f; %lld evaluations)", r->evals.last[F_STEP], (long long)r->eval_lines);
    st_page_row(o, "last eval loss", st_strbuf_cstr(&s));
    st_strbuf_reset(&s);
  }
  if (l) {
    st_page_num(&s, l[F_TPS], "%.1f");
    st_page_row(o, "tokens/s (last step)", st_strbuf_cstr(&s));
    st_strbuf_reset(&s);
    st_page_human_bytes(&s, l[F_PEAK]);
    st_page_row(o, "peak live device memory (last step)", st_strbuf_cstr(&s));
    st_strbuf_reset(&s);
  }
  st_strbuf_free(&s);
  st_strbuf_append(o, "</table>\n");
  if (!r->have_metrics) st_strbuf_append(o, "<p class=\"warn\">metrics.jsonl: missing</p>\n");
  if (!r->have_events) st_strbuf_append(o, "<p class=\"warn\">events.jsonl: missing</p>\n");
  st__bad_note(o, "metrics.jsonl", &r->metrics_stats);
  st__bad_note(o, "events.jsonl", &r->events_stats);
  if (r->steps.seen > r->steps.n)
    st_strbuf_printf(o, "<p class=\"note\">The plots show %d of %lld step lines (evenly spaced, and the last).</p>\n", r->steps.n,
                     (long long)r->steps.seen);
}

static void st__context(st_strbuf* o, const char* dir, json_t** out_ctx) {
  *out_ctx = NULL;
  st_strbuf_append(o, "<h2>Context</h2>\n");
  char* path = st_rundir_path(dir, ST_RUNDIR_CONTEXT);
  char* text = NULL;
  size_t size = 0;
  bool cut = false;
  json_t* ctx = NULL;
  if (!st_readback_bounded(path, ST__MAX_JSON, &text, &size, &cut)) {
    st_strbuf_append(o, "<p class=\"note\">no context.json</p>\n");
  } else if (cut) {
    st_strbuf_printf(o, "<p class=\"warn\">context.json is larger than %d bytes: not shown</p>\n", ST__MAX_JSON);
  } else {
    st_status s = st_json_parse(text, size, "context.json", &ctx);
    if (s || !json_is_object(ctx)) {
      st_strbuf_append(o, "<p class=\"warn\">context.json is not a JSON object: ");
      st__html_text(o, s ? st_status_message(s) : "");
      st_strbuf_append(o, "</p>\n");
      st_status_free(s);
      json_decref(ctx);
      ctx = NULL;
    } else {
      st_strbuf_append(o, "<table class=\"list\">\n");
      const char* key;
      json_t* val;
      json_object_foreach(ctx, key, val) {
        st_strbuf_append(o, "<tr><th>");
        st__html_text(o, key);
        st_strbuf_append(o, "</th><td class=\"ev\">");
        st_page_json_value(o, val);
        st_strbuf_append(o, "</td></tr>\n");
      }
      st_strbuf_append(o, "</table>\n");
    }
  }
  free(text);
  free(path);
  *out_ctx = ctx;
}

/* The run's notes (strata note): a notes.json that cannot be read is
 * said on the page, not fatal, like every other file here. */
static void st__report_notes(st_strbuf* o, const char* dir) {
  st_strbuf_append(o, "<h2>Notes</h2>\n");
  json_t* notes = NULL;
  st_status s = st_notes_read(dir, &notes);
  st_page_notes(o, notes, s ? st_status_message(s) : NULL);
  st_status_free(s);
  json_decref(notes);
}

static void st__text_file(st_strbuf* o, const char* dir, st_rundir_entry file, const char* heading, const char* none) {
  st_strbuf_printf(o, "<h2>%s</h2>\n", heading);
  const char* name = st_rundir_name(file);
  char* path = st_rundir_path(dir, file);
  char* text = NULL;
  size_t size = 0;
  bool cut = false;
  if (!st_readback_bounded(path, ST__MAX_TEXT, &text, &size, &cut)) {
    st_strbuf_printf(o, "<p class=\"note\">%s</p>\n", none);
  } else {
    st_strbuf_printf(o, "<pre id=\"%s\">", name);
    st__html_escape(o, text, size);
    st_strbuf_append(o, "</pre>\n");
    if (cut) st_strbuf_printf(o, "<p class=\"note\">%s: only its first %d bytes are shown</p>\n", name, ST__MAX_TEXT);
  }
  free(text);
  free(path);
}

static void st__checkpoints(st_strbuf* o, const char* dir) {
  st_strbuf_append(o, "<h2>Checkpoints</h2>\n");
  char* root = st_rundir_path(dir, ST_RUNDIR_CHECKPOINTS);
  st_ckpt_entry* e = NULL;
  int n = 0;
  st_status s = st_fs_is_dir(root) ? st_ckpt_list(root, &e, &n) : ST_OK;
  if (s) {
    st_strbuf_append(o, "<p class=\"warn\">");
    st__html_text(o, st_status_message(s));
    st_strbuf_append(o, "</p>\n");
    st_status_free(s);
  } else if (n == 0) {
    st_strbuf_append(o, "<p class=\"note\">no checkpoints</p>\n");
  } else {
    char* latest = st_ckpt_read_latest(root);
    st_strbuf_append(o,
                     "<p class=\"note\">Manifests read, data not verified (<code>strata ckpt verify</code> does).</p>\n"
                     "<table class=\"list\"><tr><th>checkpoint</th><th>step</th><th>created</th><th>lr</th><th>size</th>"
                     "<th>manifest</th></tr>\n");
    for (int i = 0; i < n && i < ST__MAX_CKPTS; ++i) {
      char* mpath = st_path_join(e[i].dir, "manifest.json");
      char* text = NULL;
      size_t size = 0;
      bool cut = false;
      st_ckpt* c = NULL;
      st_status ms = ST_OK;
      if (!st_readback_bounded(mpath, ST__MAX_MANIFEST, &text, &size, &cut))
        ms = st_status_make(ST_CODE_CKPT, "no manifest.json (not committed)");
      else if (cut)
        ms = st_status_make(ST_CODE_CKPT, "manifest.json larger than %d bytes", ST__MAX_MANIFEST);
      else
        ms = st_ckpt_parse_manifest(e[i].dir, text, size, &c);
      st_strbuf_append(o, "<tr><td>");
      st__html_text(o, e[i].name);
      if (latest && !strcmp(latest, e[i].name)) st_strbuf_append(o, " (LATEST)");
      st_strbuf_printf(o, "</td><td class=\"num\">%lld</td><td>", (long long)e[i].step);
      if (c) {
        char t[64];
        st_page_utc(c->created, t, sizeof(t));
        st_strbuf_append(o, t);
        st_strbuf_append(o, "</td><td class=\"num\">");
        st_page_num(o, c->lr, "%.3g");
        double bytes = 0;
        for (int f = 0; f < c->file_count; ++f) bytes += (double)c->files[f].bytes;
        st_strbuf_append(o, "</td><td class=\"num\">");
        st_page_human_bytes(o, bytes);
        st_strbuf_append(o, "</td><td>ok");
      } else {
        st_strbuf_append(o, "</td><td></td><td></td><td class=\"warn\">");
        st__html_text(o, st_status_message(ms));
      }
      st_strbuf_append(o, "</td></tr>\n");
      st_status_free(ms);
      st_ckpt_free(c);
      free(text);
      free(mpath);
    }
    st_strbuf_append(o, "</table>\n");
    if (n > ST__MAX_CKPTS) st_strbuf_printf(o, "<p class=\"note\">%d more not listed</p>\n", n - ST__MAX_CKPTS);
    free(latest);
  }
  st_ckpt_entries_free(e, n);
  free(root);
}

static void st__events_table(st_strbuf* o, const st__report* r, const st__event* const* ev, int n) {
  st_strbuf_append(o, "<h2>Events</h2>\n");
  int64_t total = r->head_n + r->ring_seen;
  if (total > n)
    st_strbuf_printf(o, "<p class=\"note\">%lld events; the first %d and the last %d are shown.</p>\n", (long long)total,
                     ST__MAX_EVENTS / 2, n - ST__MAX_EVENTS / 2);
  st_strbuf_append(o, "<table class=\"list\"><tr><th>t (s)</th><th>event</th><th>details</th></tr>\n");
  for (int i = 0; i < n; ++i) {
    st_strbuf_append(o, "<tr><td class=\"num\">");
    st_page_num(o, r->have_time ? ev[i]->time - r->first_time : NAN, "%.3f");
    st_strbuf_append(o, "</td><td>");
    st__html_text(o, ev[i]->name);
    st_strbuf_append(o, "</td><td class=\"ev\">");
    st__html_text(o, ev[i]->text);
    st_strbuf_append(o, "</td></tr>\n");
  }
  st_strbuf_append(o, "</table>\n");
}

st_status st_report_build(const char* dir, char** out_html, st_report_stats* out_stats) {
  *out_html = NULL;
  if (!st_fs_is_dir(dir)) return st_status_make(ST_CODE_CONFIG, "strata report: '%s' is not a folder; give a run directory", dir);
  char* metrics_path = st_rundir_path(dir, ST_RUNDIR_METRICS);
  char* events_path = st_rundir_path(dir, ST_RUNDIR_EVENTS);
  st__report r = {0};
  r.steps = (st__series){.cap = ST__MAX_POINTS, .stride = 1};
  r.evals = (st__series){.cap = ST__MAX_POINTS, .stride = 1};
  r.steps.pt = st_xmalloc(sizeof(r.steps.pt[0]) * ST__MAX_POINTS);
  r.evals.pt = st_xmalloc(sizeof(r.evals.pt[0]) * ST__MAX_POINTS);
  r.events = st_xcalloc(ST__MAX_EVENTS, sizeof(st__event));
  r.last_step = -1;
  r.have_metrics = st_fs_exists(metrics_path);
  r.have_events = st_fs_exists(events_path);
  st_status s = ST_OK;
  if (!r.have_metrics && !r.have_events)
    s = st_status_make(ST_CODE_CONFIG,
                       "strata report: '%s' is not a run directory: it has neither metrics.jsonl nor events.jsonl", dir);
  if (!s && r.have_metrics) s = st_jsonl_read(metrics_path, 0, ST__MAX_LINE, st__report_metrics_line, &r, &r.metrics_stats);
  if (!s && r.have_events) s = st_jsonl_read(events_path, 0, ST__MAX_LINE, st__events_line, &r, &r.events_stats);
  if (s) s = st_status_annotate(s, "strata report");
  const st__event** ev = st_xcalloc(ST__MAX_EVENTS, sizeof(*ev));
  int nev = 0;
  st_strbuf o = {0};
  json_t* ctx = NULL;
  if (!s) {
    st__series_finish(&r.steps);
    st__series_finish(&r.evals);
    nev = st__events_ordered(&r, ev);
    /* The run's name: its folder's. */
    const char* base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    st_strbuf title = {0}, heading = {0};
    st_strbuf_printf(&title, "strata report: %s", base);
    st_strbuf_printf(&heading, "strata report: %s", dir);
    st_page_begin(&o, st_strbuf_cstr(&title), st_strbuf_cstr(&heading));
    st_strbuf_free(&title);
    st_strbuf_free(&heading);
    /* The context is read first (the summary names the run id) but shown later. */
    st_strbuf ctx_html = {0};
    st__context(&ctx_html, dir, &ctx);
    st__report_summary(&o, &r, ev, nev, ctx);

    st_strbuf_append(&o, "<h2>Plots</h2>\n<div class=\"plots\">\n");
    st__loss_plot(&o, &r, "plot-loss-steps", F_STEP, "step");
    st__loss_plot(&o, &r, "plot-loss-tokens", F_TOKENS, "tokens seen");
    static const int f_lr[] = {F_LR}, f_gn[] = {F_GNORM}, f_tps[] = {F_TPS};
    static const char* const n_lr[] = {"lr"}, *const n_gn[] = {"grad norm (before clipping)"}, *const n_tps[] = {"tokens/s"};
    st__plot(&o, &r, "plot-lr", "Learning rate", "step", "lr", true, f_lr, n_lr, 1, F_STEP);
    st__plot(&o, &r, "plot-grad-norm", "Gradient norm", "step", "global L2 norm", true, f_gn, n_gn, 1, F_STEP);
    st__plot(&o, &r, "plot-tokens-per-s", "Throughput", "step", "tokens/s", true, f_tps, n_tps, 1, F_STEP);
    st__step_time_plot(&o, &r);
    st__memory_plot(&o, &r);
    st__timeline(&o, &r, ev, nev);
    st_strbuf_append(&o, "</div>\n");
    st_strbuf_append(&o,
                     "<p class=\"note\">Step time: <b>wait</b> is <code>wait_s</code>, the host blocked in WAIT and READ "
                     "ops on device work it could not hide (compute and copies); <b>host</b> is <code>step_time_s</code> "
                     "&minus; <code>wait_s</code>, the host issuing launches and copies, filling the batch and clipping, "
                     "while the device computes behind it. strata does not time device compute on its own; "
                     "<code>recompute_s</code> (recomputed forwards) and <code>transfer_s</code> (copies in flight) are "
                     "device times that overlap both bands; on a mesh, <code>comm_wait_s</code> (communication nothing hid). "
                     "Memory: the accounted live bytes by category at the step's "
                     "peak (<code>peak_live_by_category</code>), the dashed line the plan's prediction.</p>\n");

    st__report_notes(&o, dir);
    st__text_file(&o, dir, ST_RUNDIR_SAMPLE, "Sample", "no sample");
    st__checkpoints(&o, dir);
    st_strbuf_append(&o, st_strbuf_cstr(&ctx_html));
    st_strbuf_free(&ctx_html);
    st__text_file(&o, dir, ST_RUNDIR_CONFIG, "Resolved config", "no config.yaml");
    st__events_table(&o, &r, ev, nev);
    st_page_end(&o, "report");
    if (out_stats) {
      *out_stats = (st_report_stats){.step_lines = r.step_lines,
                                     .eval_lines = r.eval_lines,
                                     .events = r.head_n + r.ring_seen,
                                     .bad_lines = r.metrics_stats.bad + r.events_stats.bad,
                                     .points = r.steps.n};
    }
    *out_html = st_strbuf_take(&o);
  }
  json_decref(ctx);
  st_strbuf_free(&o);
  free(ev);
  for (int i = 0; i < ST__MAX_EVENTS; ++i) free(r.events[i].text);
  free(r.events);
  free(r.failure);
  free(r.steps.pt);
  free(r.evals.pt);
  free(metrics_path);
  free(events_path);
  return s;
}

st_status st_report_write(const char* dir, const char* out_path, st_report_stats* out_stats) {
  char* html = NULL;
  st_status s = st_report_build(dir, &html, out_stats);
  if (!s) s = st_status_annotate(st_fs_write_atomic(out_path, html, strlen(html)), "strata report: writing %s", out_path);
  free(html);
  return s;
}
