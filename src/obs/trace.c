/* trace.c — Chrome trace-event JSON, assembled in memory and written
 * atomically. Only what the scheduler's trace needs: one process, named
 * tracks, complete events and counters (docs/scheduling.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/obs.h"

struct st_trace {
  json_t* events; /* array of event objects */
  json_t* meta;   /* otherData */
};

/* {"name": ..., "ph": ..., "pid": 1, "tid": ...}: the members every event starts with. */
static json_t* st__trace_event(const char* name, const char* ph, int tid) {
  json_t* e = st_json_obj();
  st_json_put_str(e, "name", name);
  st_json_put_str(e, "ph", ph);
  st_json_put_int(e, "pid", 1);
  st_json_put_int(e, "tid", tid);
  return e;
}

static json_t* st__args_or_empty(json_t* args) { return args ? args : st_json_obj(); }

st_trace* st_trace_new(const char* process_name) {
  st_trace* t = st_xcalloc(1, sizeof(*t));
  t->events = st_json_arr();
  t->meta = st_json_obj();
  json_t* e = st__trace_event("process_name", "M", 0);
  json_t* args = st_json_obj();
  st_json_put_str(args, "name", process_name ? process_name : "strata");
  st_json_put(e, "args", args);
  st_json_push(t->events, e);
  return t;
}

void st_trace_free(st_trace* t) {
  if (!t) return;
  json_decref(t->events);
  json_decref(t->meta);
  free(t);
}

void st_trace_track(st_trace* t, int tid, const char* name) {
  json_t* e = st__trace_event("thread_name", "M", tid);
  json_t* args = st_json_obj();
  st_json_put_str(args, "name", name);
  st_json_put(e, "args", args);
  st_json_push(t->events, e);
  e = st__trace_event("thread_sort_index", "M", tid);
  args = st_json_obj();
  st_json_put_int(args, "sort_index", tid);
  st_json_put(e, "args", args);
  st_json_push(t->events, e);
}

void st_trace_slice(st_trace* t, int tid, const char* name, const char* category, double ts_us, double dur_us,
                    json_t* args) {
  json_t* e = st_json_obj();
  st_json_put_str(e, "name", name);
  st_json_put_str(e, "cat", category);
  st_json_put_str(e, "ph", "X");
  st_json_put_int(e, "pid", 1);
  st_json_put_int(e, "tid", tid);
  /* Nanosecond resolution: Perfetto keeps the fraction of a microsecond. */
  st_json_put(e, "ts", st_json_fixed(ts_us, 3));
  st_json_put(e, "dur", st_json_fixed(dur_us < 0 ? 0.0 : dur_us, 3));
  st_json_put(e, "args", st__args_or_empty(args));
  st_json_push(t->events, e);
}

void st_trace_counter(st_trace* t, const char* name, double ts_us, json_t* args) {
  json_t* e = st__trace_event(name, "C", 0);
  st_json_put(e, "ts", st_json_fixed(ts_us, 3));
  st_json_put(e, "args", st__args_or_empty(args));
  st_json_push(t->events, e);
}

void st_trace_meta(st_trace* t, const char* key, json_t* value) { st_json_put(t->meta, key, value); }

st_status st_trace_write(const st_trace* t, const char* path) {
  json_t* doc = st_json_obj();
  st_json_put(doc, "traceEvents", json_incref(t->events));
  st_json_put_str(doc, "displayTimeUnit", "ms");
  st_json_put(doc, "otherData", json_incref(t->meta));
  st_status s = st_json_write_file(path, doc, 0);
  json_decref(doc);
  return s;
}

int st_trace_lane(st_trace* t, st_trace_lanes* g, double start, double end) {
  int k = 0;
  while (k < g->count && g->end[k] > start) ++k;
  if (k == g->count) {
    g->end = st_xrealloc(g->end, (size_t)(k + 1) * sizeof(double));
    g->end[k] = 0;
    char name[64];
    if (k == 0)
      snprintf(name, sizeof(name), "%s", g->name);
    else
      snprintf(name, sizeof(name), "%s (concurrent %d)", g->name, k + 1);
    st_trace_track(t, g->base_tid + k, name);
    g->count = k + 1;
  }
  if (end > g->end[k]) g->end[k] = end;
  return g->base_tid + k;
}

void st_trace_lanes_free(st_trace_lanes* g) {
  if (!g) return;
  free(g->end);
  g->end = NULL;
  g->count = 0;
}

void st_trace_spans_free(st_trace_spans* s) {
  if (!s) return;
  for (int i = 0; i < s->count; ++i) {
    free(s->items[i].name);
    json_decref(s->items[i].args);
  }
  free(s->items);
  s->items = NULL;
  s->count = 0;
}

void st_trace_add_spans(st_trace* t, const st_trace_spans* s, int base_tid, double origin_s) {
  if (!s || (s->count == 0 && s->dropped <= 0)) return;
  st_trace_lanes lanes = {.base_tid = base_tid, .name = s->track};
  for (int i = 0; i < s->count; ++i) {
    const st_trace_span* k = &s->items[i];
    double ts = k->start_s - origin_s;
    int tid = st_trace_lane(t, &lanes, ts, ts + k->dur_s);
    st_trace_slice(t, tid, k->name, k->category, ts * 1e6, k->dur_s * 1e6, k->args ? json_deep_copy(k->args) : NULL);
  }
  st_trace_lanes_free(&lanes);
  if (s->dropped > 0) st_trace_meta(t, s->dropped_key, st_json_int(s->dropped));
}
