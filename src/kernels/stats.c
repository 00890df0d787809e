/*
 * stats.c — per-kernel calls and time (docs/kernels.md, "Observability").
 *
 * The one process-wide state of src/kernels, and why: XLA calls a handler
 * with its call frame only, and the FFI ABI gives strata no pointer of its
 * own there (a context would need the FFI's user-data API, which the PJRT
 * FFI extension's registration does not pass through). So the handlers
 * count into this table (atomics: handlers run on XLA's threads, several
 * at once), and the train loop reads and resets it at each step's end. A
 * process trains one run at a time, so the table is that run's; another
 * runtime in the same process (an evaluation) adds to the same counters,
 * which is why the train loop resets them when a step begins.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "kernels/internal.h"
#include "strata/base.h"
#include "strata/kernels.h"

#define ST__MAX_HANDLERS 64

static _Atomic int64_t g_calls[ST__MAX_HANDLERS];
static _Atomic int64_t g_ns[ST__MAX_HANDLERS];
static _Atomic bool g_spans_on;
static _Atomic int64_t g_span_next;
static st_kernel_span g_spans[ST_KERNEL_MAX_SPANS];
/* faults.wrong_kernel (a test-only drill): process-wide for the same
 * reason as the counters, one relaxed load per attention call. */
static _Atomic int g_wrong;

void st_kernels_set_wrong(int what) { atomic_store(&g_wrong, what); }
bool st__kernel_wrong_attention(void) { return atomic_load_explicit(&g_wrong, memory_order_relaxed) == ST_KERNEL_WRONG_ATTENTION; }

int st__kernel_handler_index(const char* target) {
  for (int i = 0; i < st__kernel_handler_count && i < ST__MAX_HANDLERS; ++i)
    if (!strcmp(st__kernel_handlers[i].target, target)) return i;
  return -1;
}

void st__kernel_stats_record(int handler, double start_s, double end_s) {
  if (handler < 0 || handler >= ST__MAX_HANDLERS) return;
  atomic_fetch_add_explicit(&g_calls[handler], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_ns[handler], (int64_t)((end_s - start_s) * 1e9), memory_order_relaxed);
  if (!atomic_load_explicit(&g_spans_on, memory_order_relaxed)) return;
  int64_t k = atomic_fetch_add_explicit(&g_span_next, 1, memory_order_relaxed);
  if (k < ST_KERNEL_MAX_SPANS) g_spans[k] = (st_kernel_span){handler, start_s, end_s - start_s};
}

int st_kernels_stats_take(st_kernel_stat* out, int cap) {
  int n = 0;
  for (int i = 0; i < st__kernel_handler_count && i < ST__MAX_HANDLERS; ++i) {
    int64_t calls = atomic_exchange(&g_calls[i], 0), ns = atomic_exchange(&g_ns[i], 0);
    if (!out || n >= cap) continue;
    const st_kernel_handler* h = &st__kernel_handlers[i];
    out[n++] = (st_kernel_stat){h->op, h->direction, h->target, calls, (double)ns * 1e-9};
  }
  return n;
}

void st_kernels_spans_record(bool on) {
  atomic_store(&g_span_next, 0);
  atomic_store(&g_spans_on, on);
}

int st_kernels_spans_take(st_kernel_span* out, int cap, int64_t* dropped) {
  int64_t next = atomic_exchange(&g_span_next, 0);
  int64_t kept = next < ST_KERNEL_MAX_SPANS ? next : ST_KERNEL_MAX_SPANS;
  if (dropped) *dropped = next - kept;
  int n = 0;
  for (int64_t i = 0; i < kept && out && n < cap; ++i) out[n++] = g_spans[i];
  return n;
}

void st_kernels_spans_take_trace(st_trace_spans* out) {
  *out = (st_trace_spans){.track = "kernels (FFI handlers)", .dropped_key = "kernel_spans_dropped"};
  st_kernel_span* spans = st_xcalloc(ST_KERNEL_MAX_SPANS, sizeof(*spans));
  int n = st_kernels_spans_take(spans, ST_KERNEL_MAX_SPANS, &out->dropped);
  int hn = 0;
  const st_kernel_handler* h = st_kernels_handlers(&hn);
  out->items = st_xcalloc((size_t)(n ? n : 1), sizeof(*out->items));
  for (int i = 0; i < n; ++i) {
    const st_kernel_span* k = &spans[i];
    if (k->handler < 0 || k->handler >= hn) continue;
    st_strbuf name = {0};
    st_strbuf_printf(&name, "kernel.%s %s", h[k->handler].op, h[k->handler].direction);
    json_t* args = st_json_obj();
    st_json_put_str(args, "target", h[k->handler].target);
    out->items[out->count++] = (st_trace_span){name.data, "kernel", k->start_s, k->dur_s, args};
  }
  free(spans);
}
