/* svg.c — the report's plots as inline SVG (no script, no external file):
 * a plot is a fixed viewBox the page scales, so every coordinate here is in
 * viewBox units. */
#include "obs/svg.h"

#include <stdlib.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define ST__W 640.0
#define ST__H 300.0
#define ST__L 68.0  /* left margin: y tick labels and the y label */
#define ST__R 16.0
#define ST__T 46.0  /* top: the title and the legend */
#define ST__B 44.0  /* bottom: x tick labels and the x label */
#define ST__LANE_H 22.0

static const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
#define ST__NCOLORS ((int)(sizeof(kColors) / sizeof(kColors[0])))

void st__html_escape(st_strbuf* out, const char* s, size_t n) {
  const unsigned char* p = (const unsigned char*)s;
  size_t i = 0, run = 0; /* bytes [i - run, i) pass through unchanged */
#define ST__FLUSH()                                                   \
  do {                                                                \
    if (run) st_strbuf_append_n(out, (const char*)p + i - run, run); \
    run = 0;                                                          \
  } while (0)
  while (i < n) {
    unsigned c = p[i];
    const char* rep = NULL;
    size_t len = 1;
    if (c == '&') rep = "&amp;";
    else if (c == '<') rep = "&lt;";
    else if (c == '>') rep = "&gt;";
    else if (c == '"') rep = "&quot;";
    else if (c == '\'') rep = "&#39;";
    else if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7f) rep = "\xef\xbf\xbd";
    else if (c >= 0x80) {
      /* A well-formed UTF-8 sequence (no overlong forms, no surrogates, <= U+10FFFF) passes. */
      uint32_t cp = 0;
      size_t need = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 0;
      if (c >= 0xf5) need = 0;
      bool ok = need > 0 && i + need <= n;
      if (ok) {
        cp = need == 2 ? c & 0x1f : need == 3 ? c & 0x0f : c & 0x07;
        for (size_t k = 1; k < need && ok; ++k) {
          ok = (p[i + k] & 0xc0) == 0x80;
          cp = cp << 6 | (p[i + k] & 0x3f);
        }
      }
      if (ok && need == 3) ok = cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff);
      if (ok && need == 4) ok = cp >= 0x10000 && cp <= 0x10ffff;
      /* U+FFFE, U+FFFF and the C1 controls are noncharacters or controls in HTML. */
      if (ok && (cp == 0xfffe || cp == 0xffff || (cp >= 0x80 && cp < 0xa0))) ok = false;
      if (ok) len = need;
      else rep = "\xef\xbf\xbd";
    }
    if (rep) {
      ST__FLUSH();
      st_strbuf_append(out, rep);
      i += len;
    } else {
      i += len;
      run += len;
    }
  }
  ST__FLUSH();
#undef ST__FLUSH
}

void st__html_text(st_strbuf* out, const char* s) {
  if (s) st__html_escape(out, s, strlen(s));
}

/* A "nice" tick step (1, 2 or 5 times a power of ten) giving about |want| ticks over |span|. */
static double st__tick_step(double span, int want) {
  double raw = span / want;
  double mag = pow(10.0, floor(log10(raw)));
  double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

/* The power of 1000 an axis's labels are shown in (k, M, G, T), from its largest magnitude. */
static int st__axis_scale(double lo, double hi) {
  double m = fmax(fabs(lo), fabs(hi));
  int k = 0;
  while (m >= 1e4 && k < 4) m /= 1e3, ++k;
  return k;
}

/* A tick label: at most 4 significant digits, in the axis's scale. */
static void st__tick_label(double v, double step, int scale, char* out, size_t n) {
  static const char* const suffix[] = {"", "k", "M", "G", "T"};
  if (fabs(v) < step * 1e-6) {
    snprintf(out, n, "0");
    return;
  }
  snprintf(out, n, "%.4g%s", v / pow(1e3, scale), suffix[scale]);
}

typedef struct st__range {
  double lo, hi;
} st__range;

static void st__widen(st__range* r) {
  if (!(r->hi > r->lo)) {
    double d = fabs(r->lo) > 0 ? fabs(r->lo) * 0.05 : 1.0;
    r->lo -= d;
    r->hi += d;
  }
}

/* Axes and ticks of a plot area [x0,x1] x [y0,y1] (y0 at the bottom) for
 * the data ranges |rx| (NULL: no x ticks) and |ry| (NULL: no y ticks). */
static void st__axes(st_strbuf* o, const st_svg_plot* p, double x0, double x1, double y0, double y1, const st__range* rx,
                     const st__range* ry) {
  st_strbuf_printf(o, "<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", x0, y1, x1 - x0, y0 - y1);
  char lab[32];
  if (rx) {
    double step = st__tick_step(rx->hi - rx->lo, 6);
    int scale = st__axis_scale(rx->lo, rx->hi);
    for (double j = ceil(rx->lo / step); j * step <= rx->hi + step * 1e-9; j += 1) {
      double v = j * step;
      double px = x0 + (v - rx->lo) / (rx->hi - rx->lo) * (x1 - x0);
      st__tick_label(v, step, scale, lab, sizeof(lab));
      st_strbuf_printf(o, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", px, y1, px, y0);
      st_strbuf_printf(o, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px, y0 + 14, lab);
    }
  }
  if (ry) {
    double step = st__tick_step(ry->hi - ry->lo, 5);
    int scale = st__axis_scale(ry->lo, ry->hi);
    for (double j = ceil(ry->lo / step); j * step <= ry->hi + step * 1e-9; j += 1) {
      double v = j * step;
      double py = y0 - (v - ry->lo) / (ry->hi - ry->lo) * (y0 - y1);
      st__tick_label(v, step, scale, lab, sizeof(lab));
      st_strbuf_printf(o, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x0, py, x1, py);
      st_strbuf_printf(o, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", x0 - 5, py + 4, lab);
    }
  }
  st_strbuf_append(o, "<text class=\"title\" x=\"8\" y=\"17\">");
  st__html_text(o, p->title);
  st_strbuf_append(o, "</text>\n");
  if (p->x_label) {
    st_strbuf_printf(o, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (x0 + x1) / 2, ST__H - 6);
    st__html_text(o, p->x_label);
    st_strbuf_append(o, "</text>\n");
  }
  if (p->y_label) {
    st_strbuf_printf(o, "<text class=\"label\" transform=\"translate(14 %.1f) rotate(-90)\" text-anchor=\"middle\">", (y0 + y1) / 2);
    st__html_text(o, p->y_label);
    st_strbuf_append(o, "</text>\n");
  }
}

static void st__svg_open(st_strbuf* o, const st_svg_plot* p, double h, bool empty) {
  st_strbuf_append(o, "<svg class=\"plot\" id=\"");
  st__html_text(o, p->id);
  st_strbuf_printf(o, "\" viewBox=\"0 0 %.0f %.0f\" role=\"img\"%s aria-label=\"", ST__W, h, empty ? " data-empty=\"1\"" : "");
  st__html_text(o, p->title);
  st_strbuf_append(o, "\">\n");
}

void st_svg_lines(st_strbuf* o, const st_svg_plot* p, const st_svg_series* series, int count) {
  /* Ranges over the finite points; stacked series over their running sums. */
  st__range rx = {INFINITY, -INFINITY}, ry = {INFINITY, -INFINITY};
  int stack_n = 0;
  for (int s = 0; s < count; ++s)
    if (series[s].stacked && series[s].n > stack_n) stack_n = series[s].n;
  double* sum = stack_n ? st_xcalloc((size_t)stack_n, sizeof(double)) : NULL;
  bool any = false;
  for (int s = 0; s < count; ++s) {
    const st_svg_series* se = &series[s];
    for (int i = 0; i < se->n; ++i) {
      double x = se->x[i], y = se->y[i];
      if (se->stacked) {
        sum[i] += isfinite(y) ? y : 0;
        y = sum[i];
      }
      if (!isfinite(x) || !isfinite(y)) continue;
      any = true;
      rx.lo = fmin(rx.lo, x), rx.hi = fmax(rx.hi, x);
      ry.lo = fmin(ry.lo, y), ry.hi = fmax(ry.hi, y);
    }
  }
  st__svg_open(o, p, ST__H, !any);
  /* The legend's rows under the title: items wrap at the right edge. */
  double legend_x[64], legend_y[64];
  int rows = 1;
  double lx = 8;
  for (int k = 0; k < count && k < 64; ++k) {
    double w = 16 + 6.2 * (double)strlen(series[k].name ? series[k].name : "") + 14;
    if (lx > 8 && lx + w > ST__W - ST__R) lx = 8, ++rows;
    legend_x[k] = lx, legend_y[k] = 26 + 14.0 * (rows - 1);
    lx += w;
  }
  double x0 = ST__L, x1 = ST__W - ST__R, y0 = ST__H - ST__B, y1 = ST__T + 14.0 * (rows - 1);
  if (!any) {
    st__axes(o, p, x0, x1, y0, y1, NULL, NULL);
    st_strbuf_printf(o, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">no data</text>\n</svg>\n", (x0 + x1) / 2,
                     (y0 + y1) / 2);
    free(sum);
    return;
  }
  if (p->y_zero) ry.lo = fmin(ry.lo, 0), ry.hi = fmax(ry.hi, 0);
  st__widen(&rx);
  st__widen(&ry);
  /* A little headroom so a line at the extreme stays visible. */
  double pad = (ry.hi - ry.lo) * 0.04;
  if (!(p->y_zero && ry.lo == 0)) ry.lo -= pad;
  ry.hi += pad;
  st__axes(o, p, x0, x1, y0, y1, &rx, &ry);
#define PX(x) (x0 + ((x) - rx.lo) / (rx.hi - rx.lo) * (x1 - x0))
#define PY(y) (y0 - ((y) - ry.lo) / (ry.hi - ry.lo) * (y0 - y1))
  for (int s = 0; s < count && s < 64; ++s) {
    const char* col = kColors[(series[s].color > 0 ? series[s].color - 1 : s) % ST__NCOLORS];
    st_strbuf_printf(o,
                     "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"8\" fill=\"%s\"/><text class=\"legend\" x=\"%.1f\" "
                     "y=\"%.1f\">",
                     legend_x[s], legend_y[s], col, legend_x[s] + 16, legend_y[s] + 8);
    st__html_text(o, series[s].name);
    st_strbuf_append(o, "</text>\n");
  }
  if (sum) memset(sum, 0, (size_t)stack_n * sizeof(double));
  for (int s = 0; s < count; ++s) {
    const st_svg_series* se = &series[s];
    const char* col = kColors[(se->color > 0 ? se->color - 1 : s) % ST__NCOLORS];
    if (se->n <= 0) continue;
    st_strbuf d = {0};
    if (se->stacked) {
      /* The band between the running sum before and after this series. */
      for (int i = 0; i < se->n; ++i) {
        if (!isfinite(se->x[i])) continue;
        st_strbuf_printf(&d, "%s%.1f %.1f", d.len ? " L" : "M", PX(se->x[i]), PY(sum[i] + (isfinite(se->y[i]) ? se->y[i] : 0)));
      }
      for (int i = se->n; i-- > 0;) {
        if (!isfinite(se->x[i])) continue;
        st_strbuf_printf(&d, " L%.1f %.1f", PX(se->x[i]), PY(sum[i]));
      }
      if (d.len) st_strbuf_append(&d, " Z");
      for (int i = 0; i < se->n; ++i) sum[i] += isfinite(se->y[i]) ? se->y[i] : 0;
      if (d.len) st_strbuf_printf(o, "<path class=\"band\" fill=\"%s\" stroke=\"%s\" d=\"%s\"/>\n", col, col, st_strbuf_cstr(&d));
    } else {
      bool pen = false;
      for (int i = 0; i < se->n; ++i) {
        double x = se->x[i], y = se->y[i];
        if (!isfinite(x) || !isfinite(y)) {
          pen = false;
          continue;
        }
        double px = PX(x), py = PY(y);
        bool alone = !pen && (i + 1 >= se->n || !isfinite(se->x[i + 1]) || !isfinite(se->y[i + 1]));
        if (alone) /* an isolated point: a dot of radius 2.5 */
          st_strbuf_printf(&d, "%sM%.1f %.1f m-2.5 0 a2.5 2.5 0 1 0 5 0 a2.5 2.5 0 1 0 -5 0", d.len ? " " : "", px, py);
        else
          st_strbuf_printf(&d, "%s%.1f %.1f", pen ? " L" : d.len ? " M" : "M", px, py);
        pen = !alone;
      }
      if (d.len)
        st_strbuf_printf(o, "<path class=\"line%s\" stroke=\"%s\" d=\"%s\"><title>", se->dashed ? " dashed" : "", col, st_strbuf_cstr(&d));
      if (d.len) {
        st__html_text(o, se->name);
        st_strbuf_append(o, "</title></path>\n");
      }
    }
    st_strbuf_free(&d);
  }
#undef PX
#undef PY
  st_strbuf_append(o, "</svg>\n");
  free(sum);
}

void st_svg_timeline(st_strbuf* o, const st_svg_plot* p, const char* const* lanes, int lane_count, const st_svg_mark* marks,
                     int count) {
  double h = ST__T + ST__LANE_H * (lane_count > 0 ? lane_count : 1) + ST__B;
  st__range rx = {INFINITY, -INFINITY};
  for (int i = 0; i < count; ++i)
    if (isfinite(marks[i].t) && marks[i].lane >= 0 && marks[i].lane < lane_count)
      rx.lo = fmin(rx.lo, marks[i].t), rx.hi = fmax(rx.hi, marks[i].t);
  bool any = rx.lo <= rx.hi;
  st__svg_open(o, p, h, !any);
  double x0 = ST__L + 60, x1 = ST__W - ST__R, y0 = h - ST__B, y1 = ST__T - 10;
  if (!any) {
    st__axes(o, p, x0, x1, y0, y1, NULL, NULL);
    st_strbuf_printf(o, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">no events</text>\n</svg>\n",
                     (x0 + x1) / 2, (y0 + y1) / 2);
    return;
  }
  st__widen(&rx);
  double pad = (rx.hi - rx.lo) * 0.02;
  rx.lo -= pad, rx.hi += pad;
  st__axes(o, p, x0, x1, y0, y1, &rx, NULL);
  for (int l = 0; l < lane_count; ++l) {
    double cy = y1 + ST__LANE_H * (l + 0.5);
    st_strbuf_printf(o, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", x0 - 5, cy + 4);
    st__html_text(o, lanes[l]);
    st_strbuf_append(o, "</text>\n");
  }
  for (int i = 0; i < count; ++i) {
    const st_svg_mark* m = &marks[i];
    if (!isfinite(m->t) || m->lane < 0 || m->lane >= lane_count) continue;
    double px = x0 + (m->t - rx.lo) / (rx.hi - rx.lo) * (x1 - x0);
    double cy = y1 + ST__LANE_H * (m->lane + 0.5);
    st_strbuf_printf(o, "<path class=\"mark\" fill=\"%s\" d=\"M%.1f %.1f l5 6 l-5 6 l-5 -6 Z\"><title>",
                     kColors[m->lane % ST__NCOLORS], px, cy - 6);
    st__html_text(o, m->label);
    st_strbuf_append(o, "</title></path>\n");
  }
  st_strbuf_append(o, "</svg>\n");
}
