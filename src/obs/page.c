/* page.c — the shared pieces of strata's HTML pages (page.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>

#include "obs/page.h"
#include "obs/svg.h"
#include "strata/base.h"
#include "strata/obs.h"

void st_page_utc(double t, char* out, size_t n) {
  if (!isfinite(t) || t < 0 || t > 1e11) {
    snprintf(out, n, "?");
    return;
  }
  time_t tt = (time_t)t;
  struct tm tm;
  gmtime_r(&tt, &tm);
  strftime(out, n, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

void st_page_num(st_strbuf* o, double v, const char* fmt) {
  if (isfinite(v)) st_strbuf_printf(o, fmt, v);
  else st_strbuf_append(o, "–");
}

void st_page_human_bytes(st_strbuf* o, double b) {
  static const char* const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (!isfinite(b)) {
    st_strbuf_append(o, "–");
    return;
  }
  int k = 0;
  while (b >= 1024 && k < 4) b /= 1024, ++k;
  st_strbuf_printf(o, k ? "%.1f %s" : "%.0f %s", b, u[k]);
}

static const char* kStyle =
    "body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#222;margin:0 auto;max-width:1320px;"
    "padding:12px 20px}\n"
    "h1{font-size:22px;margin:8px 0}h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #ddd}\n"
    "table{border-collapse:collapse}td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}\n"
    "th{font-weight:600;color:#555}\n"
    "table.list td,table.list th{border-bottom:1px solid #eee;padding:2px 12px 2px 4px}\n"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
    "pre{background:#f6f6f6;border:1px solid #e2e2e2;padding:8px;overflow:auto;max-height:480px;white-space:pre-wrap;"
    "word-break:break-word}\n"
    ".plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:10px}\n"
    "svg.plot{width:100%;height:auto;background:#fff;border:1px solid #e2e2e2}\n"
    "svg .frame{fill:none;stroke:#999}svg .grid{stroke:#eee}\n"
    "svg text{font-family:system-ui,sans-serif}svg .tick{font-size:11px;fill:#444}svg .legend{font-size:11px;fill:#333}\n"
    "svg .title{font-size:14px;font-weight:600;fill:#222}svg .label{font-size:12px;fill:#555}\n"
    "svg .line{fill:none;stroke-width:1.6;stroke-linejoin:round}svg .dashed{stroke-dasharray:5 3}\n"
    "svg .band{fill-opacity:.55;stroke-width:.6}svg .mark{stroke:#fff;stroke-width:.5}\n"
    ".note{color:#666;font-size:13px}.warn{color:#a40}\n"
    "td.ev{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}\n"
    "td.notetext{white-space:pre-wrap;word-break:break-word;max-width:900px}\n"
    "td.same{color:#888}td.differs{color:#a40;font-weight:600}\n";

void st_page_row(st_strbuf* o, const char* key, const char* value) {
  st_strbuf_append(o, "<tr><th>");
  st__html_text(o, key);
  st_strbuf_append(o, "</th><td>");
  st__html_text(o, value);
  st_strbuf_append(o, "</td></tr>\n");
}

void st_page_json_value(st_strbuf* o, const json_t* v) {
  if (json_is_string(v)) {
    st__html_text(o, json_string_value(v));
    return;
  }
  char* text = st_json_dump(v, 0);
  size_t n = strlen(text);
  if (n > 4000) n = 4000;
  st__html_escape(o, text, n);
  if (n < strlen(text)) st_strbuf_append(o, "…");
  free(text);
}

void st_page_begin(st_strbuf* o, const char* title, const char* heading) {
  st_strbuf_append(o,
                   "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                   "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
                   "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>");
  st__html_text(o, title);
  st_strbuf_printf(o, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<h1>", kStyle);
  st__html_text(o, heading);
  st_strbuf_append(o, "</h1>\n");
}

void st_page_end(st_strbuf* o, const char* tool) {
  char t[64];
  st_page_utc((double)time(NULL), t, sizeof(t));
  st_strbuf_printf(o, "<p class=\"note\">Written by strata %s %s, %s.</p>\n</body>\n</html>\n", STRATA_VERSION, tool, t);
}

/* One entry: when, who, what. */
static void st__page_note_row(st_strbuf* o, const json_t* e) {
  char t[64];
  st_page_utc(json_number_value(json_object_get(e, "time")), t, sizeof(t));
  st_strbuf_append(o, "<tr><td>");
  st__html_text(o, t);
  st_strbuf_append(o, "</td><td>");
  st__html_text(o, json_string_value(json_object_get(e, "author")));
  st_strbuf_append(o, "</td><td>");
  st__html_text(o, json_string_value(json_object_get(e, "kind")));
  st_strbuf_append(o, "</td><td class=\"notetext\">");
  st__html_text(o, json_string_value(json_object_get(e, "text")));
  st_strbuf_append(o, "</td></tr>\n");
}

void st_page_notes(st_strbuf* o, const json_t* notes, const char* error) {
  if (error) {
    st_strbuf_append(o, "<p class=\"warn\">");
    st__html_text(o, error);
    st_strbuf_append(o, "</p>\n");
    return;
  }
  const json_t* entries = notes ? json_object_get(notes, "entries") : NULL;
  if (!json_array_size(entries)) {
    st_strbuf_append(o, "<p class=\"note\">no notes (<code>strata note RUN --hypothesis \"...\"</code> adds one)</p>\n");
    return;
  }
  st_strbuf_append(o, "<table class=\"list\">\n");
  static const st_note_kind kinds[] = {ST_NOTE_HYPOTHESIS, ST_NOTE_CONCLUSION};
  for (int k = 0; k < 2; ++k) {
    const json_t* e = st_notes_latest(notes, kinds[k]);
    st_strbuf_printf(o, "<tr><th>%s</th><td class=\"notetext\" id=\"note-%s\">", st_note_kind_name(kinds[k]),
                     st_note_kind_name(kinds[k]));
    if (e) st__html_text(o, json_string_value(json_object_get(e, "text")));
    else st_strbuf_append(o, "–");
    st_strbuf_append(o, "</td></tr>\n");
  }
  st_strbuf_append(o, "</table>\n<table class=\"list\"><tr><th>time</th><th>author</th><th>kind</th><th>text</th></tr>\n");
  for (size_t i = 0; i < json_array_size(entries); ++i) st__page_note_row(o, json_array_get(entries, i));
  st_strbuf_append(o, "</table>\n");
}
