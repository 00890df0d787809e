/* executor.c — runs a plan: launches without blocking, waits only where a
 * READ needs a value (or after every launch in eager mode), and accounts
 * live device bytes by category exactly as st_plan_predict_live predicts. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strata/sched.h"

struct st_executor {
  const st_plan* plan;
  st_runtime* runtime;
  st_program* const* programs;
  int device;
  bool eager;
  st_buffer** slots; /* [slot_count], owned unless borrowed[slot] */
  bool* borrowed;
  st_executor_stats stats;
  /* scratch arrays sized for the widest op */
  st_buffer** in;
  st_buffer** out;
};

static double st__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

st_status st_executor_create(const st_plan* plan, st_runtime* runtime, st_program* const* programs, int device, bool eager,
                             st_executor** out_executor) {
  *out_executor = NULL;
  int widest = 1;
  for (int i = 0; i < plan->op_count; ++i) {
    if (plan->ops[i].input_count > widest) widest = plan->ops[i].input_count;
    if (plan->ops[i].output_count > widest) widest = plan->ops[i].output_count;
  }
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    if (op->kind != ST_OP_LAUNCH) continue;
    st_program* p = programs[op->program];
    if (!p) return st_status_make(ST_CODE_INTERNAL, "plan op %d: program '%s' is not compiled", i, plan->programs[op->program]);
    if (st_program_output_count(p) != op->output_count)
      return st_status_make(ST_CODE_RUNTIME, "plan op %d: program '%s' has %d outputs, the plan expects %d", i,
                            plan->programs[op->program], st_program_output_count(p), op->output_count);
  }
  st_executor* ex = calloc(1, sizeof(*ex));
  ex->plan = plan;
  ex->runtime = runtime;
  ex->programs = programs;
  ex->device = device;
  ex->eager = eager;
  ex->slots = calloc((size_t)plan->slot_count + 1, sizeof(st_buffer*));
  ex->borrowed = calloc((size_t)plan->slot_count + 1, sizeof(bool));
  ex->in = calloc((size_t)widest, sizeof(st_buffer*));
  ex->out = calloc((size_t)widest, sizeof(st_buffer*));
  *out_executor = ex;
  return ST_OK;
}

void st_executor_destroy(st_executor* ex) {
  if (!ex) return;
  for (int i = 0; i < ex->plan->slot_count; ++i)
    if (!ex->borrowed[i]) st_buffer_destroy(ex->slots[i]);
  free(ex->slots);
  free(ex->borrowed);
  free(ex->in);
  free(ex->out);
  free(ex);
}

static void st__account(st_executor* ex, int slot, int sign) {
  const st_slot* s = &ex->plan->slots[slot];
  ex->stats.live_bytes[s->category] += sign * (int64_t)st_tensor_type_bytes(&s->type);
}

void st_executor_set(st_executor* ex, int slot, st_buffer* buffer) {
  if (ex->slots[slot]) st__account(ex, slot, -1);
  if (!ex->borrowed[slot]) st_buffer_destroy(ex->slots[slot]);
  ex->slots[slot] = buffer;
  ex->borrowed[slot] = false;
  if (buffer) st__account(ex, slot, +1);
}

void st_executor_set_borrowed(st_executor* ex, int slot, st_buffer* buffer) {
  st_executor_set(ex, slot, NULL);
  ex->slots[slot] = buffer;
  ex->borrowed[slot] = buffer != NULL;
  if (buffer) st__account(ex, slot, +1);
}

st_buffer* st_executor_get(st_executor* ex, int slot) { return ex->slots[slot]; }

const st_executor_stats* st_executor_stats_get(const st_executor* ex) { return &ex->stats; }

static void st__track_peak(st_executor* ex) {
  int64_t total = 0;
  for (int k = 0; k < ST_SLOT_CATEGORY_COUNT; ++k) total += ex->stats.live_bytes[k];
  if (total > ex->stats.peak_live_bytes) ex->stats.peak_live_bytes = total;
}

static st_status st__launch(st_executor* ex, int index, const st_op* op) {
  const st_plan* plan = ex->plan;
  st_program* prog = ex->programs[op->program];
  for (int j = 0; j < op->input_count; ++j) {
    ex->in[j] = ex->slots[op->inputs[j]];
    if (!ex->in[j])
      return st_status_make(ST_CODE_INTERNAL, "plan op %d (%s layer %d): input slot '%s' is empty", index,
                            plan->programs[op->program], op->layer, plan->slots[op->inputs[j]].name);
  }
  st_event* done = NULL;
  st_status s = st_program_execute(prog, ex->device, ex->in, op->input_count, ex->out, op->output_count,
                                   ex->eager ? &done : NULL);
  if (s) {
    return st_status_annotate(s, "launching %s (layer %d, microbatch %d)", plan->programs[op->program], op->layer,
                              op->micro);
  }
  ex->stats.launches++;
  /* Donated inputs now hold nothing: drop them from their slots before the
   * outputs (which typically alias them) take their place. */
  for (int j = 0; j < op->input_count; ++j) {
    if (st_buffer_is_consumed(ex->in[j])) st_executor_set(ex, op->inputs[j], NULL);
  }
  for (int j = 0; j < op->output_count; ++j) st_executor_set(ex, op->outputs[j], ex->out[j]);
  st__track_peak(ex);
  if (done) {
    double t0 = st__now();
    s = st_event_await(done);
    ex->stats.read_wait_s += st__now() - t0;
    st_event_destroy(done);
    if (s) return st_status_annotate(s, "executing %s (layer %d, microbatch %d)", plan->programs[op->program], op->layer, op->micro);
  }
  return ST_OK;
}

st_status st_executor_run(st_executor* ex, const st_executor_hooks* hooks) {
  const st_plan* plan = ex->plan;
  int64_t live[ST_SLOT_CATEGORY_COUNT];
  memcpy(live, ex->stats.live_bytes, sizeof(live));
  memset(&ex->stats, 0, sizeof(ex->stats));
  memcpy(ex->stats.live_bytes, live, sizeof(live));
  st__track_peak(ex);
  for (int i = 0; i < plan->op_count; ++i) {
    const st_op* op = &plan->ops[i];
    switch (op->kind) {
      case ST_OP_LAUNCH:
        ST_RETURN(st__launch(ex, i, op));
        break;
      case ST_OP_H2D: {
        st_buffer* b = NULL;
        ST_RETURN(hooks->h2d(hooks->user, op, &b));
        ex->stats.h2d_bytes += (int64_t)st_buffer_bytes(b);
        st_executor_set(ex, op->outputs[0], b);
        st__track_peak(ex);
        break;
      }
      case ST_OP_READ: {
        st_buffer* b = ex->slots[op->inputs[0]];
        if (!b) return st_status_make(ST_CODE_INTERNAL, "plan op %d: READ of empty slot '%s'", i, plan->slots[op->inputs[0]].name);
        double t0 = st__now();
        ST_RETURN(hooks->read(hooks->user, op, b));
        ex->stats.read_wait_s += st__now() - t0;
        ex->stats.reads++;
        ex->stats.d2h_bytes += (int64_t)st_buffer_bytes(b);
        break;
      }
      case ST_OP_HOST:
        ST_RETURN(hooks->host(hooks->user, op));
        break;
      case ST_OP_FREE:
        for (int j = 0; j < op->input_count; ++j) st_executor_set(ex, op->inputs[j], NULL);
        break;
    }
  }
  return ST_OK;
}
