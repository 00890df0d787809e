/* trace.c — Chrome trace-event JSON, assembled in memory and written
 * atomically. Only what the scheduler's trace needs: one process, named
 * tracks, complete events and counters (docs/scheduling.md). */
#include <stdlib.h>
#include <string.h>

#include "strata/base.h"
#include "strata/obs.h"

struct st_trace {
  st_strbuf events; /* comma-separated event objects */
  st_strbuf meta;   /* comma-separated otherData members */
  int count;
};

static void st__sep(st_trace* t) {
  st_strbuf_append(&t->events, t->count++ ? ",\n" : "\n");
}

st_trace* st_trace_new(const char* process_name) {
  st_trace* t = st_xcalloc(1, sizeof(*t));
  st__sep(t);
  st_strbuf_append(&t->events, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, \"args\": {\"name\": ");
  st_strbuf_json_string(&t->events, process_name ? process_name : "strata");
  st_strbuf_append(&t->events, "}}");
  return t;
}

void st_trace_free(st_trace* t) {
  if (!t) return;
  st_strbuf_free(&t->events);
  st_strbuf_free(&t->meta);
  free(t);
}

void st_trace_track(st_trace* t, int tid, const char* name) {
  st__sep(t);
  st_strbuf_printf(&t->events, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": {\"name\": ", tid);
  st_strbuf_json_string(&t->events, name);
  st_strbuf_append(&t->events, "}}");
  st__sep(t);
  st_strbuf_printf(&t->events,
                   "{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": {\"sort_index\": %d}}",
                   tid, tid);
}

void st_trace_slice(st_trace* t, int tid, const char* name, const char* category, double ts_us, double dur_us,
                    const char* args_json) {
  st__sep(t);
  st_strbuf_append(&t->events, "{\"name\": ");
  st_strbuf_json_string(&t->events, name);
  st_strbuf_append(&t->events, ", \"cat\": ");
  st_strbuf_json_string(&t->events, category);
  /* Nanosecond resolution: Perfetto keeps the fraction of a microsecond. */
  st_strbuf_printf(&t->events, ", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {%s}}", tid,
                   ts_us, dur_us < 0 ? 0.0 : dur_us, args_json ? args_json : "");
}

void st_trace_counter(st_trace* t, const char* name, double ts_us, const char* args_json) {
  st__sep(t);
  st_strbuf_append(&t->events, "{\"name\": ");
  st_strbuf_json_string(&t->events, name);
  st_strbuf_printf(&t->events, ", \"ph\": \"C\", \"pid\": 1, \"tid\": 0, \"ts\": %.3f, \"args\": {%s}}", ts_us,
                   args_json ? args_json : "");
}

void st_trace_meta(st_trace* t, const char* key, const char* value_json) {
  if (t->meta.len) st_strbuf_append(&t->meta, ", ");
  st_strbuf_json_string(&t->meta, key);
  st_strbuf_append(&t->meta, ": ");
  st_strbuf_append(&t->meta, value_json);
}

st_status st_trace_write(const st_trace* t, const char* path) {
  st_strbuf b = {0};
  st_strbuf_append(&b, "{\"traceEvents\": [");
  st_strbuf_append(&b, st_strbuf_cstr(&t->events));
  st_strbuf_append(&b, "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {");
  st_strbuf_append(&b, st_strbuf_cstr(&t->meta));
  st_strbuf_append(&b, "}}\n");
  st_status s = st_fs_write_atomic(path, b.data, b.len);
  st_strbuf_free(&b);
  return s;
}
