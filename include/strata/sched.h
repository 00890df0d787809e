/*
 * strata/sched.h — the step as an explicit plan of typed ops, and its
 * executor (DESIGN §5).
 *
 * A plan is built once per configuration and executed every step. It names
 * device buffers by *slot* (an index into a table the executor owns), so the
 * same plan runs step after step and can be printed, inspected and
 * reordered without touching the trainer.
 *
 *   LAUNCH  run program P (for layer L, microbatch M) on input slots, filling
 *           output slots. Inputs the program donates are consumed: their
 *           slots become empty (the program's outputs usually refill them).
 *   H2D     fill a slot from the host (a batch tensor, a scalar): the host
 *           side is produced by the trainer's callback.
 *   READ    device -> host copy of a slot into the trainer's memory (the
 *           loss, a squared norm); the only op that waits on the device.
 *   HOST    host computation between device ops (clip scale from norms).
 *   FREE    destroy the buffer in a slot.
 *
 * Launches do not block: PJRT orders each execution after the producers of
 * its inputs, so the host runs ahead until a READ needs a value (deferred
 * waits). `eager` mode waits after every launch instead, for comparison.
 */
#ifndef STRATA_SCHED_H
#define STRATA_SCHED_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/runtime.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum st_op_kind {
  ST_OP_LAUNCH,
  ST_OP_H2D,
  ST_OP_READ,
  ST_OP_HOST,
  ST_OP_FREE,
} st_op_kind;

typedef enum st_slot_category {
  ST_SLOT_PARAM,
  ST_SLOT_GRAD,
  ST_SLOT_OPT,   /* optimizer state m, v */
  ST_SLOT_ACT,   /* activations and their gradients */
  ST_SLOT_XFER,  /* batch tensors, scalars, read-back values */
  ST_SLOT_CATEGORY_COUNT,
} st_slot_category;

const char* st_slot_category_name(st_slot_category c);

typedef struct st_slot {
  char* name; /* "layers.1.wq", "grad:wte", "x[2]", "tokens[0]" */
  st_slot_category category;
  st_tensor_type type;
  bool persistent; /* lives across steps (params, optimizer state) */
} st_slot;

typedef struct st_op {
  st_op_kind kind;
  int program; /* LAUNCH: index into the plan's program names */
  int layer;   /* -1 when not per layer */
  int micro;   /* microbatch, -1 when not per microbatch */
  int tag;     /* H2D / READ / HOST: what the trainer's callback should do */
  int input_count;
  int* inputs; /* slots */
  int output_count;
  int* outputs; /* slots */
} st_op;

typedef struct st_plan {
  int slot_count;
  st_slot* slots;
  int op_count;
  st_op* ops;
  int program_count;
  char** programs; /* program names, index = st_op.program */
} st_plan;

/* Building (used by train/): all functions abort on out of memory. */
void st_plan_init(st_plan* plan);
void st_plan_deinit(st_plan* plan);
int st_plan_slot(st_plan* plan, const char* name, st_slot_category category, const st_tensor_type* type, bool persistent);
int st_plan_slot_find(const st_plan* plan, const char* name); /* -1 when absent */
int st_plan_program(st_plan* plan, const char* name);          /* interned */
st_op* st_plan_add(st_plan* plan, st_op_kind kind, int program, int layer, int micro, int tag, int input_count,
                   const int* inputs, int output_count, const int* outputs);

/* Predicted live device bytes after every op, by category. |out| has
 * op_count * ST_SLOT_CATEGORY_COUNT entries; persistent slots count as live
 * from the start. Returns the predicted peak (all categories). */
int64_t st_plan_predict_live(const st_plan* plan, int64_t* out /* may be NULL */);

/* Prints the plan, one op a line, with predicted live bytes. */
void st_plan_print(const st_plan* plan, FILE* out);
/* Prints the plan as JSON. */
void st_plan_print_json(const st_plan* plan, FILE* out);

/* Executor ---------------------------------------------------------------*/

typedef struct st_executor st_executor;

/* Called for H2D (must return a new buffer for |op|'s output slot in
 * *out_buffer), READ (receives the slot's buffer; copy it to the host) and
 * HOST ops. */
typedef struct st_executor_hooks {
  void* user;
  st_status (*h2d)(void* user, const st_op* op, st_buffer** out_buffer);
  st_status (*read)(void* user, const st_op* op, st_buffer* buffer);
  st_status (*host)(void* user, const st_op* op);
} st_executor_hooks;

typedef struct st_executor_stats {
  int64_t launches;
  int64_t reads;
  double read_wait_s; /* host time blocked in READ ops */
  int64_t h2d_bytes, d2h_bytes;
  int64_t live_bytes[ST_SLOT_CATEGORY_COUNT];
  int64_t peak_live_bytes; /* accounted peak over the step, all categories */
} st_executor_stats;

/* |programs[i]| is the compiled program for plan->programs[i] (borrowed). */
st_status st_executor_create(const st_plan* plan, st_runtime* runtime, st_program* const* programs, int device,
                             bool eager, st_executor** out_executor /* owned by caller */);
void st_executor_destroy(st_executor* executor); /* frees every slot's buffer */

/* Puts |buffer| into slot |slot| (takes ownership; frees what was there). */
void st_executor_set(st_executor* executor, int slot, st_buffer* buffer);
st_buffer* st_executor_get(st_executor* executor, int slot); /* borrowed, NULL when empty */
/* Puts |buffer| into |slot| without taking ownership (another executor owns
 * it); NULL empties the slot without freeing. Used to share parameters. */
void st_executor_set_borrowed(st_executor* executor, int slot, st_buffer* buffer);

/* Runs every op of the plan once. Statistics are reset at the start. */
st_status st_executor_run(st_executor* executor, const st_executor_hooks* hooks);
const st_executor_stats* st_executor_stats_get(const st_executor* executor);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_SCHED_H */
