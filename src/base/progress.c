/* progress.c — the line a long operation (export, compile, checkpoint
 * writing, tokenizing) draws on stderr while a person watches
 * (docs/using.md, "Progress of long operations"). Whether anyone watches
 * is the caller's to say (run.progress); this only draws. */
#include <stdio.h>
#include <string.h>

#include "strata/base.h"

bool st_progress_wanted(const st_progress_options* o, int64_t size) {
  return o && o->on && size >= o->min_size;
}

void st_progress_line_start(st_progress_line* l, const char* what, const char* unit, int64_t total) {
  *l = (st_progress_line){.what = what, .unit = unit, .total = total > 0 ? total : 0, .shown = -1, .ended = false};
  st_progress_line_update(l, 0);
}

void st_progress_line_update(st_progress_line* l, int64_t done) {
  if (l->ended) return;
  if (done > l->total) done = l->total;
  int pct = l->total > 0 ? (int)(done * 100 / l->total) : 100;
  if (pct == l->shown && done < l->total) return;
  l->shown = pct;
  const bool bytes = l->unit && !strcmp(l->unit, "MiB");
  /* Bytes: in MiB, or in KiB below one MiB (a test's small file). */
  const double scale = l->total >= 1048576 ? 1048576.0 : 1024.0;
  if (bytes)
    fprintf(stderr, "\r%s: %.1f/%.1f %s", l->what, (double)done / scale, (double)l->total / scale,
            scale > 1024.0 ? "MiB" : "KiB");
  else
    fprintf(stderr, "\r%s: %lld/%lld %s", l->what, (long long)done, (long long)l->total, l->unit ? l->unit : "");
  if (done >= l->total) {
    fputc('\n', stderr);
    l->ended = true;
  }
  fflush(stderr);
}
