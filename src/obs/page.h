/* page.h — the pieces strata's self-contained HTML pages share (strata
 * report, src/obs/report.c; strata diff, src/obs/diff_html.c): the head
 * with its Content-Security-Policy and style, table rows, numbers, times,
 * JSON values and a run's notes. Every text is escaped (svg.h). Private to
 * obs. */
#ifndef STRATA_OBS_PAGE_H
#define STRATA_OBS_PAGE_H

#include <stddef.h>

#include "strata/base.h"

/* <!DOCTYPE html> ... <body><h1>: a page that has no script and loads
 * nothing (its policy forbids every fetch); |title| and |heading| escaped. */
void st_page_begin(st_strbuf* o, const char* title, const char* heading);
/* "Written by strata <version> <tool>, <now>." and the closing tags. */
void st_page_end(st_strbuf* o, const char* tool);

/* |t| (unix seconds) as "YYYY-mm-dd HH:MM:SS UTC"; "?" when not a date. */
void st_page_utc(double t, char* out, size_t n);
/* |v| with printf format |fmt|, or an en dash when not finite. */
void st_page_num(st_strbuf* o, double v, const char* fmt);
/* |b| bytes as "1.5 MiB"; an en dash when not finite. */
void st_page_human_bytes(st_strbuf* o, double b);
/* <tr><th>key</th><td>value</td></tr>, both escaped. */
void st_page_row(st_strbuf* o, const char* key, const char* value);
/* A JSON value as text: a string as itself, anything else as compact JSON
 * cut at 4000 bytes; escaped. */
void st_page_json_value(st_strbuf* o, const st_json* v);

/* A run's notes (notes.json read by st_notes_read; NULL: none): its
 * hypothesis and conclusion (the newest of each) and every entry, oldest
 * first. |error| (may be NULL): why notes.json could not be read, shown
 * instead. No heading: the caller writes it. */
void st_page_notes(st_strbuf* o, const st_json* notes, const char* error);

#endif
