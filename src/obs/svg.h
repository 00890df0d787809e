/* svg.h — line plots and an event timeline as inline SVG, and HTML text
 * escaping, for strata report (src/obs/report.c). Private to obs. */
#ifndef STRATA_OBS_SVG_H
#define STRATA_OBS_SVG_H

#include <stdbool.h>
#include <stddef.h>

#include "strata/base.h"

/* Appends |n| bytes of |s| as HTML text (also fit for attribute values in
 * double quotes): & < > " ' escaped, bytes that are not UTF-8 and control
 * characters other than tab and newline become U+FFFD. */
void st__html_escape(st_strbuf* out, const char* s, size_t n);
/* st__html_escape of the C string |s| (NULL appends nothing). */
void st__html_text(st_strbuf* out, const char* s);

/* One series: |n| points (borrowed). A non-finite x or y breaks the line
 * there. A stacked series is drawn as a band on top of the stacked series
 * before it in the list (a non-finite y counts as 0 there); stacked series
 * must share the same x values. */
typedef struct st_svg_series {
  const char* name;
  const double* x;
  const double* y;
  int n;
  bool stacked;
  bool dashed;
  int color; /* 1-based palette entry (two runs' curves of one kind share it); 0: by position */
} st_svg_series;

typedef struct st_svg_plot {
  const char* id; /* the <svg>'s id */
  const char* title;
  const char* x_label;
  const char* y_label;
  bool y_zero; /* the y range includes 0 */
} st_svg_plot;

/* Appends an <svg class="plot"> with axes, ticks, labels, a legend and one
 * <path> per series with points. Linear axes; a single point is drawn as a
 * dot; without any finite point the plot says "no data" and has
 * data-empty="1". */
void st_svg_lines(st_strbuf* out, const st_svg_plot* plot, const st_svg_series* series, int count);

/* A mark on the timeline: at |t| on lane |lane|, |label| its tooltip. */
typedef struct st_svg_mark {
  double t;
  int lane;
  const char* label;
} st_svg_mark;

/* Appends an <svg class="plot"> with one row per lane and a marker <path>
 * per mark, against a linear time axis. */
void st_svg_timeline(st_strbuf* out, const st_svg_plot* plot, const char* const* lanes, int lane_count, const st_svg_mark* marks,
                     int count);

#endif
