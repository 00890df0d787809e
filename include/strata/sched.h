/*
 * strata/sched.h — the step as an explicit plan of typed ops, the policies
 * that shape it, and its executor (docs/design.md §5, docs/scheduling.md).
 *
 * A plan is built once per configuration and executed every step. It names
 * buffers by *slot* (an index into a table the executor owns), so the same
 * plan runs step after step and can be printed, inspected and replayed
 * without touching the trainer.
 *
 *   LAUNCH     run program P (for layer L, microbatch M) on input slots,
 *              filling output slots. Inputs the program donates are
 *              consumed: their slots become empty (the program's outputs
 *              usually refill them).
 *   RECOMPUTE  a LAUNCH that recomputes a forward inside the backward pass
 *              (sched.remat); counted and timed apart.
 *   H2D        fill a device slot: from the trainer's callback (no input: a
 *              batch tensor, a scalar) or from the slot's home in host
 *              memory (one input: an offloaded buffer coming back).
 *   D2H        copy a device slot to its home in host memory (offload).
 *   READ       device -> host copy of a slot into the trainer's memory (the
 *              loss, a squared norm).
 *   WAIT       block the host until the producers of the input slots are
 *              done; with no inputs, until everything issued so far is.
 *   HOST       host computation between device ops (clip scale from norms).
 *   FREE       destroy the buffer in a slot.
 *   COLLECTIVE run an SPMD collective program P (an all-reduce of one group
 *              instance's gradients over the data axis) on the per-device
 *              buffers of its input slots, all devices at once
 *              (st_program_execute_spmd); its outputs refill the slots.
 *
 * Data parallelism (plan->devices > 1, docs/parallelism.md): every device
 * slot is backed by one buffer per device; each LAUNCH, RECOMPUTE, H2D,
 * D2H, READ and FREE applies to every device's buffer (a launch runs the
 * one-device program once per device), and a slot's type is its
 * per-device type. A slot's |layout| says how the devices' buffers relate.
 *
 * Dependencies are explicit: st_plan_finalize gives every op the earlier ops
 * whose results it needs (deps). The executor issues ops in plan order
 * without blocking — PJRT orders each execution and copy after the
 * producers of its inputs — so the host only stops at WAIT and READ ops.
 * Where the WAITs go is itself policy (sched.wait): `deferred` waits only
 * where the host consumes a value, `eager` after every launch and transfer.
 *
 * Slots live in device memory unless `host` is set: a host slot is the home
 * of an offloaded device slot (its `twin`) between uses and never counts as
 * live device bytes.
 */
#ifndef STRATA_SCHED_H
#define STRATA_SCHED_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/base.h"
#include "strata/dist.h"
#include "strata/mesh.h"
#include "strata/obs.h"
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
  ST_OP_D2H,
  ST_OP_WAIT,
  ST_OP_RECOMPUTE,
  ST_OP_COLLECTIVE,
  /* A collective across the processes of a multi-process job (tag: its
   * st_collective_kind): each device index's buffer of input j is copied to
   * the host, reduced or gathered with the same index of the other
   * processes by MPI (st_dist_coll_*), and put into output j. An
   * all-reduce is in place (output j = input j); an all-gather goes from a
   * slot cut across the processes (st_slot.xblocks = plan->procs) to its
   * whole, a reduce-scatter the other way. Issued without blocking; the
   * first op that touches an output (or a WAIT on it) waits for it, and a
   * FREE of an input whose copy is still running hands that buffer to the
   * op (docs/multiprocess.md, "Cross-process ops"). */
  ST_OP_XPROC,
  /* Pipeline parallelism (plan->stages > 1; docs/parallelism.md,
   * "Pipeline"): input j, a slot of one stage, copied device to device
   * (st_buffer_copy_to_device) into output j, a slot of another stage
   * (op->stage), each device index to the same index of the other stage.
   * The input stays filled (a FREE follows where nothing else reads it).
   * Issued without blocking; PJRT orders the copy after the input's
   * producer and every later reader of the output after the copy. */
  ST_OP_SEND,
} st_op_kind;

const char* st_op_kind_name(st_op_kind kind); /* "LAUNCH", ... */

/* What a COLLECTIVE op does (its st_op.tag), for the accounting by kind. */
typedef enum st_collective_kind {
  ST_COLL_OTHER,
  ST_COLL_ALL_REDUCE,
  ST_COLL_ALL_GATHER,
  ST_COLL_REDUCE_SCATTER,
  ST_COLL_KIND_COUNT,
} st_collective_kind;

const char* st_collective_kind_name(st_collective_kind kind); /* "all_reduce", ... */

typedef enum st_slot_category {
  ST_SLOT_PARAM,
  ST_SLOT_GRAD,
  ST_SLOT_OPT,   /* optimizer state m, v */
  ST_SLOT_ACT,   /* activations, residuals and their gradients */
  ST_SLOT_XFER,  /* batch tensors, scalars, read-back values */
  /* FSDP (parallel.fsdp > 1) only, so one-device and data-parallel plans
   * never use them: */
  ST_SLOT_GATHERED,  /* a layer's parameters all-gathered for its launches */
  ST_SLOT_UNREDUCED, /* a layer's whole gradient before its reduce-scatter */
  ST_SLOT_CATEGORY_COUNT,
} st_slot_category;

const char* st_slot_category_name(st_slot_category c);

/* How a slot's per-device buffers relate (plan->devices > 1). */
typedef enum st_slot_layout {
  ST_LAYOUT_REPLICATED, /* every device holds the same value (parameters, optimizer state, reduced gradients) */
  ST_LAYOUT_SPLIT,      /* device d holds its rows of the batch (batch tensors, activations, per-device losses) */
  ST_LAYOUT_PARTIAL,    /* the value is the sum over devices (gradients before their all-reduce) */
  ST_LAYOUT_SHARDED,    /* device d holds its block of |logical| as |sharding| cuts it over the plan's mesh (FSDP state) */
} st_slot_layout;

const char* st_slot_layout_name(st_slot_layout layout); /* "replicated", "split", "partial" */

typedef struct st_slot {
  char* name; /* "layers.1.wq", "grad:wte", "x[2]", "tokens[0]", "host:m:wte" */
  st_slot_category category;
  st_tensor_type type;
  bool persistent; /* lives across steps (params, optimizer state, host homes) */
  bool host;       /* lives in host memory: the home of an offloaded slot */
  int twin;        /* offloaded device slot <-> its host home; -1 when none */
  st_slot_layout layout; /* meaningful when plan->devices > 1 */
  /* ST_LAYOUT_SHARDED only: the whole tensor's type and how it is cut
   * (mesh axis bits in the plan's mesh order data, fsdp, tensor). |type|
   * is then one device's block, zero-padded (st_sharding_local_type). */
  st_tensor_type logical;
  st_sharding sharding;
  /* fsdp across processes (plan->procs > 1; docs/multiprocess.md): dim 0 of
   * |xwhole|, the tensor this device would hold in a process of its own, is
   * cut in |xblocks| blocks of ceil(d0 / xblocks) rows, the last
   * zero-padded, and this process keeps block |rank| (its dist rank) as
   * |type|. st_executor_put takes the whole value and keeps the block;
   * st_executor_to_host gathers every process's block (collective). 0: not
   * cut across processes. */
  int xblocks;
  st_tensor_type xwhole;
  /* Pipeline parallelism: the stage whose devices back this slot (device
   * index d of stage s is runtime device base + s * plan->devices + d); 0
   * without a pipeline. A host slot has its twin's stage. */
  int stage;
} st_slot;

typedef struct st_op {
  st_op_kind kind;
  int program; /* LAUNCH / RECOMPUTE / COLLECTIVE: index into the plan's program names */
  int layer;   /* -1 when not per layer */
  int micro;   /* microbatch, -1 when not per microbatch */
  int tag;     /* H2D / READ / HOST: what the trainer's callback should do; COLLECTIVE: its st_collective_kind */
  int input_count;
  int* inputs; /* slots */
  int output_count;
  int* outputs; /* slots */
  int dep_count;
  int* deps; /* earlier ops whose results this op needs (st_plan_finalize) */
  /* Pipeline parallelism: the stage whose devices run it (a SEND: the
   * stage it copies to); 0 without a pipeline. Its device slots are all of
   * this stage, except a SEND's inputs. */
  int stage;
  /* Pipeline parallelism: the schedule's task (index into
   * st_plan.pipe_tasks) whose work this op is; -1 for the rest (state,
   * the optimizer, the waits and transfers the passes weave in). */
  int task;
} st_op;

typedef struct st_plan {
  int slot_count;
  st_slot* slots;
  int op_count;
  st_op* ops;
  int program_count;
  char** programs; /* program names, index = st_op.program */
  char* policy;    /* one line naming the policies that built the plan (owned; may be NULL) */
  int devices;     /* devices each device slot is backed on (1: one device) */
  int mesh[3];     /* the mesh's axis sizes: data, fsdp, tensor (product = devices) */
  /* The executor starts each SPMD op (COLLECTIVE, or a LAUNCH of an SPMD
   * program) only once the previous one is done on every device. Needed
   * where SPMD programs with collectives over different device groups
   * mix (tensor parallelism with data or fsdp): XLA's CPU client starts an
   * execution when its inputs are ready, not in issue order, so two such
   * programs can start in different orders on different devices and wait
   * for each other forever (docs/parallelism.md, "Ordering"). */
  bool serialize_spmd;
  /* The processes the XPROC ops span (0 or 1: none). An XPROC all-gather
   * or reduce-scatter moves between a slot cut across them (st_slot.xblocks
   * = procs) and a whole one. */
  int procs;
  /* XLA's temporaries of each program per device (index = st_op.program),
   * from the compiled programs (st_program_memory_stats); NULL until
   * st_plan_set_program_temps. A launch holds them, on top of the live
   * slots, for as long as it runs (docs/scheduling.md, "Temporaries"). */
  int64_t* program_temps;
  /* Pipeline parallelism (parallel.pipeline; docs/parallelism.md,
   * "Pipeline"): the stages, each on |devices| devices of its own (the
   * mesh above is one stage's), so the plan runs on stages * devices
   * devices. 1: no pipeline. */
  int stages;
  /* The stage each program (index = st_op.program) is compiled for: an SPMD
   * program runs on that stage's devices and is compiled once per stage
   * that runs it, under one name each (st_plan_program_at); NULL: every
   * program is stage 0's. */
  int* program_stage;
  /* The pipeline schedule the plan was built from (NULL without a
   * pipeline): its tasks in plan order, each microbatch's forward or
   * backward through one model chunk on one stage, with the start and end
   * its simulation predicted from the chunks' FLOPs (st_pipe_schedule_make
   * in src/plan/pipeline.c); `strata plan --explain` draws them. Chunk c
   * is layers [pipe_first[c], pipe_first[c+1]) on stage c % stages. */
  int pipe_task_count;
  struct st_plan_pipe_task* pipe_tasks;
  int pipe_chunks;
  int* pipe_first; /* [pipe_chunks + 1] */
} st_plan;

typedef struct st_plan_pipe_task {
  int stage, chunk, micro;
  bool backward;
  double start, end;
} st_plan_pipe_task;

/* Sets |plan|'s pipeline schedule (copied). */
void st_plan_set_pipeline(st_plan* plan, const st_plan_pipe_task* tasks, int count, const int* first, int chunks);

#define ST_PLAN_MAX_STAGES 16

/* Axis bits of st_slot.sharding in a plan's mesh. */
enum { ST_PLAN_AXIS_DATA = 1u << 0, ST_PLAN_AXIS_FSDP = 1u << 1, ST_PLAN_AXIS_TENSOR = 1u << 2 };

/* Building (used by train/). */
void st_plan_init(st_plan* plan);
void st_plan_deinit(st_plan* plan);
int st_plan_slot(st_plan* plan, const char* name, st_slot_category category, const st_tensor_type* type, bool persistent);
int st_plan_slot_find(const st_plan* plan, const char* name); /* -1 when absent */
int st_plan_program(st_plan* plan, const char* name);          /* interned */
/* st_plan_program for the programs of stage |stage| (interned by name and
 * stage: the same program on two stages has two indices). */
int st_plan_program_at(st_plan* plan, const char* name, int stage);
/* The stage of program index |i| (0 without a pipeline). */
int st_plan_program_stage(const st_plan* plan, int i);
st_op* st_plan_add(st_plan* plan, st_op_kind kind, int program, int layer, int micro, int tag, int input_count,
                   const int* inputs, int output_count, const int* outputs);
void st_plan_set_policy(st_plan* plan, const char* policy);
/* Deep copy of |src| into |dst| (initialised here). */
void st_plan_copy(const st_plan* src, st_plan* dst);

/* Computes every op's deps and checks the plan: every input is live when
 * read (persistent slots start live), programs only see device slots, H2D
 * and D2H connect a slot with its twin, and every non-persistent slot is
 * empty again at the end (so step after step starts from the same state).
 * Errors (ST_CODE_INTERNAL) name the op and slot. */
st_status st_plan_finalize(st_plan* plan);

/* Predicted live device bytes after every op, by category. |out| has
 * op_count * ST_SLOT_CATEGORY_COUNT entries; persistent device slots count
 * as live from the start, host slots never. Returns the predicted peak
 * (all categories). |out_peak_by_category| (may be NULL) receives the
 * categories at the first op where the peak is reached (at the start, when
 * nothing exceeds the persistent state). */
int64_t st_plan_predict_live(const st_plan* plan, int64_t* out /* may be NULL */,
                             int64_t* out_peak_by_category /* [ST_SLOT_CATEGORY_COUNT], may be NULL */);
/* With a pipeline (plan->stages > 1) every stage's devices are counted
 * apart: st_plan_predict_live's out[op] is then the live bytes of the op's
 * own stage after it, and its peak the largest any stage reaches (the
 * categories at that stage's peak). This gives, per stage s and category
 * c, the most bytes of c live on s at once over the step, each category's
 * own maximum (out_stage_peaks[s * ST_SLOT_CATEGORY_COUNT + c], stages *
 * ST_SLOT_CATEGORY_COUNT entries), and returns the stage count. */
int st_plan_predict_stage_peaks(const st_plan* plan, int64_t* out_stage_peaks);
/* Sets the plan's program_temps (|temps| has program_count entries,
 * copied; NULL clears them). */
void st_plan_set_program_temps(st_plan* plan, const int64_t* temps);
/* The compiled programs' temporaries by plan program index (a new array of
 * program_count entries, owned by the caller; NULL programs count 0). Sets
 * *out_known (may be NULL) to whether every program's analysis was known. */
int64_t* st_plan_temps_of_programs(const st_plan* plan, st_program* const* programs, bool* out_known);

/* The predicted peak with temporaries: the most, over the start and every
 * op, of the live slot bytes after the op (st_plan_predict_live) plus, for a
 * LAUNCH, RECOMPUTE or COLLECTIVE, the temporaries of its program
 * (|temps| by program index; NULL: the plan's program_temps; neither: 0).
 * |out| (may be NULL) receives the op where it is reached (-1: the start),
 * the program temporaries there, and the slot bytes there. */
typedef struct st_plan_temps_peak {
  int64_t peak;  /* slots + temporaries */
  int op;        /* -1: the persistent state at the start */
  int64_t temps; /* the temporaries at that op */
  int64_t slots; /* the live slot bytes at that op */
  int64_t slots_peak; /* st_plan_predict_live's peak, for comparison */
} st_plan_temps_peak;
int64_t st_plan_predict_with_temps(const st_plan* plan, const int64_t* temps, st_plan_temps_peak* out);

/* Bytes in host slots (offloaded homes), which are all persistent. */
int64_t st_plan_host_bytes(const st_plan* plan);

/* Prints the plan, one op a line, with deps and predicted live bytes. */
void st_plan_print(const st_plan* plan, FILE* out);
/* The plan as a JSON object (docs/scheduling.md); a new reference owned by
 * the caller (json_decref). */
st_json* st_plan_json(const st_plan* plan);

/*===-------------------------------------------------------------------===*/
/* Policies and the passes that apply them                                  */
/*===-------------------------------------------------------------------===*/

enum {
  ST_OFFLOAD_OPTIMIZER = 1, /* m, v live in host memory between optimizer updates */
  ST_OFFLOAD_PARAMS = 2,    /* block parameters live in host memory between uses */
};


/* "none" | "optimizer" | "params" | "both" -> ST_OFFLOAD_* bits; -1 when unknown. */
int st_sched_offload_parse(const char* name);

/* Offload pass: every slot s with unit_of_slot[s] >= 0 becomes a
 * non-persistent device slot with a persistent host home ("host:<name>",
 * appended after the existing slots, so slot numbers do not move). Slots of
 * one unit travel together. Before each launch that uses a unit, the unit
 * is brought back (H2D from its home) if it is not on the device, and the
 * units of the next |prefetch_depth| unit-using launches are brought back
 * too; after a launch, a unit leaves the device (D2H home first when the
 * launch wrote it, else just FREE) unless a launch within the prefetch
 * window uses it again. Only LAUNCH / RECOMPUTE ops may touch unit slots.
 * |out| is initialised here. */
st_status st_plan_offload(const st_plan* in, const int* unit_of_slot, int prefetch_depth, st_plan* out);

/* Wait pass: a WAIT on the read slot before every READ; with |eager| also a
 * WAIT on the outputs of every LAUNCH, RECOMPUTE, H2D and D2H right after
 * it; and a final WAIT on everything (the step barrier, so a step's
 * accounting and timestamps are complete when it returns). |out| is
 * initialised here. */
void st_plan_add_waits(const st_plan* in, bool eager, st_plan* out);

/*===-------------------------------------------------------------------===*/
/* Executor                                                                 */
/*===-------------------------------------------------------------------===*/

typedef struct st_executor st_executor;

/* Called for H2D ops without an input (must return a new buffer for |op|'s
 * output slot on runtime device |device| in *out_buffer), READ (receives
 * the slot's buffer; copy it to the host) and HOST ops. With a
 * data-parallel plan, h2d and read are called once per device, |index| =
 * 0..devices-1 in order (|device| is its runtime device: with a pipeline,
 * index |index| of the op's stage); otherwise once with index 0. */
typedef struct st_executor_hooks {
  void* user;
  st_status (*h2d)(void* user, const st_op* op, int index, int device, st_buffer** out_buffer);
  st_status (*read)(void* user, const st_op* op, int index, st_buffer* buffer);
  st_status (*host)(void* user, const st_op* op);
  /* Optional (NULL: none). After a LAUNCH or RECOMPUTE was issued on
   * device index |index|, before its outputs go into their slots:
   * |outputs| (op->output_count, that device's) may be replaced, the hook
   * then destroying the one it replaces (the faults.nan_at drill). An SPMD
   * program (tensor parallelism) is issued once over every device; the
   * hook is then called for each device index in order, with that
   * device's shards. Not called for COLLECTIVE ops. */
  st_status (*launched)(void* user, const st_op* op, int index, st_buffer** outputs);
  /* Optional (NULL: none). Before a LAUNCH or RECOMPUTE is issued on
   * device index |index| (an SPMD one: for each device index before the
   * one issue), with its |inputs| (op->input_count,
   * borrowed): the checking re-execution of a non-finite step keeps a
   * copy of them (docs/diagnostics.md). */
  st_status (*launching)(void* user, const st_op* op, int index, st_buffer* const* inputs);
} st_executor_hooks;

/* Per-op timestamps of the last run, in seconds since the run started.
 * issue: the host issued the op. complete: the op's PJRT event fired
 * (st_event_on_ready), or the host call returned for ops without one
 * (READ, WAIT, HOST, FREE). start: an estimate, since PJRT does not report
 * it — the later of issue and its deps' completion, and for a launch also
 * the previous launch's completion (one queue per device). Timestamps are
 * made causally consistent: nothing completes before it starts or starts
 * before its deps complete (docs/scheduling.md). */
typedef struct st_op_timing {
  double issue_s, start_s, complete_s;
  double blocked_s; /* WAIT / READ: host time spent blocked, as the host measured it */
  bool blocked;     /* WAIT: an awaited op was not done when the wait began */
} st_op_timing;

typedef struct st_executor_stats {
  int64_t launches;   /* LAUNCH and RECOMPUTE ops */
  int64_t recomputes; /* RECOMPUTE ops */
  double recompute_s; /* their summed start..complete time */
  int64_t reads;
  int64_t waits;         /* WAIT ops */
  int64_t waits_blocked; /* ... that found an awaited op not yet done */
  double wait_s;         /* host time blocked in WAIT and READ ops (unhidden waiting) */
  int64_t h2d_bytes, d2h_bytes; /* into / out of device memory (batch, reads, offload) */
  double transfer_s;        /* time some H2D or D2H op was in flight (union of start..complete) */
  double transfer_hidden_s; /* ... of it while some launch was running too */
  int max_inflight;         /* most issued-but-not-complete device ops at once */
  /* Device bytes live now, by category (one device index; with a pipeline
   * summed over the stages, one index of each). */
  int64_t live_bytes[ST_SLOT_CATEGORY_COUNT];
  /* Accounted peak over the run, all categories (with a pipeline: of the
   * fullest stage, as st_plan_predict_live predicts it). */
  int64_t peak_live_bytes;
  int64_t peak_by_category[ST_SLOT_CATEGORY_COUNT]; /* categories at the accounted peak */
  int64_t predicted_peak_bytes;               /* st_plan_predict_live of the plan */
  int64_t predicted_peak_by_category[ST_SLOT_CATEGORY_COUNT]; /* categories at the predicted peak */
  int live_mismatch_op; /* first op whose accounted live bytes differ from the prediction; -1: none */
  int64_t host_bytes;                         /* bytes held in host-memory slots */
  /* With XLA's temporaries (docs/scheduling.md, "Temporaries"): at every
   * launch the running program's temporaries are added to the live bytes.
   * Accounted from the buffers held and the programs' analyses; predicted
   * with st_plan_predict_with_temps over the same programs. */
  int64_t peak_with_temps_bytes;           /* accounted */
  int64_t peak_temps_bytes;                /* the temporaries at that peak */
  int peak_with_temps_op;                  /* the op where it was reached; -1: the start */
  int64_t predicted_peak_with_temps_bytes; /* predicted */
  int64_t max_temps_bytes;                 /* the largest temporaries of any launched program */
  int64_t collectives;       /* COLLECTIVE ops */
  /* Their message bytes per device (NCCL's "size": the larger of the input
   * and the output slots' bytes, i.e. the whole tensors of an all-gather
   * or a reduce-scatter), and both by st_collective_kind (op tag). */
  int64_t collective_bytes;
  int64_t collectives_by_kind[ST_COLL_KIND_COUNT];
  int64_t collective_bytes_by_kind[ST_COLL_KIND_COUNT];
  double collective_s;       /* time some collective was in flight (union of start..complete) */
  double collective_hidden_s; /* ... of it while some launch was running too */
  /* Unhidden communication wait (docs/scheduling.md): the union over ops
   * with a COLLECTIVE dep of [when the op could have started without those
   * deps, when they completed], each cut to the collective's own interval;
   * so comm_wait_s <= collective_s. comm_waits: ops that waited so. */
  double comm_wait_s;
  int64_t comm_waits;
  /* XPROC ops (a multi-process job): how many, the bytes this process sent
   * for them, the time some was in flight (union of issue..complete) and
   * how much of it some launch ran too, and the host time blocked waiting
   * for one at its consumer. */
  int64_t xprocs;
  int64_t xproc_bytes;
  double xproc_s;
  double xproc_hidden_s;
  double xproc_wait_s;
  /* Pipeline parallelism (plan->stages > 1; else stages = 1 and the rest
   * describe the one stage). SEND ops: how many, their bytes per device
   * index, the time some was in flight (union of start..complete) and how
   * much of it some launch ran too. Per stage: busy = the union of its
   * LAUNCH / RECOMPUTE / COLLECTIVE start..complete intervals; the step's
   * span = first op's issue to last op's completion; the bubble fraction =
   * 1 - sum(busy) / (stages * span). Per stage and category the most bytes
   * live at once, accounted (each category's own maximum, as
   * st_plan_predict_stage_peaks predicts). */
  int stages;
  int64_t sends;
  int64_t send_bytes;
  double send_s;
  double send_hidden_s;
  double span_s;
  double bubble_fraction;
  double stage_busy_s[ST_PLAN_MAX_STAGES];
  int64_t stage_peak_by_category[ST_PLAN_MAX_STAGES][ST_SLOT_CATEGORY_COUNT];
} st_executor_stats;

/* |programs[i]| is the compiled program for plan->programs[i] (borrowed).
 * |plan| must be finalized and outlive the executor. A data-parallel plan
 * (plan->devices = n > 1) runs index d on runtime device |device| + d:
 * its COLLECTIVE programs must be SPMD programs compiled for exactly those
 * devices in that order, every other program a one-device program. With
 * a pipeline (plan->stages = S > 1) stage s's index d runs on runtime
 * device |device| + s * n + d, and program i is compiled for the stage
 * st_plan_program_stage(plan, i) names (an SPMD program on that stage's n
 * devices in order; an error names program, stage and devices). The
 * runtime must have devices |device| .. |device| + S * n - 1 (an error
 * names runtime.cpu_devices). A plan with host slots
 * needs a host memory space on |device| ("pinned_host", else
 * "unpinned_host"; the same on every device of a stage with host slots);
 * without one this fails naming the device's spaces. */
st_status st_executor_create(const st_plan* plan, st_runtime* runtime, st_program* const* programs, int device,
                             st_executor** out_executor /* owned by caller */);
void st_executor_destroy(st_executor* executor); /* frees every slot's buffer */

/* The job an XPROC op communicates in (borrowed; must outlive the
 * executor). A plan with XPROC ops fails to run without one. */
void st_executor_set_dist(st_executor* executor, st_dist* dist);

/* The memory space offloaded slots live in ("" when the plan has none). */
const char* st_executor_host_memory(const st_executor* executor);

/* Puts |buffer| into slot |slot| between runs (takes ownership; frees what
 * was there). A buffer on another device than the slot's (its stage's
 * index 0) is first copied there (st_buffer_copy_to_device). With a
 * data-parallel plan the value is replicated: device
 * index 0 gets |buffer|, every other device a copy (through the host). An offloaded slot's value lives in its host home, so for
 * such a slot (or a host slot) the buffer is copied into host memory and
 * stored there, and |buffer| is destroyed. Errors only for that copy. */
st_status st_executor_put(st_executor* executor, int slot, st_buffer* buffer);
/* A sharded slot (ST_LAYOUT_SHARDED) takes the whole (logical) value and
 * each device keeps its block; st_executor_to_host reassembles it. */
/* Copies |slot|'s value between runs into |dst| (|size| bytes): the whole
 * (logical) tensor, reassembled from the devices' blocks for a sharded
 * slot, device index 0's (or its host home's) otherwise. Waits. */
st_status st_executor_to_host(st_executor* executor, int slot, void* dst, size_t size);
/* st_executor_put without an error: a failed copy is reported on stderr
 * and leaves the slot empty (the next run then fails naming it). */
void st_executor_set(st_executor* executor, int slot, st_buffer* buffer);
/* The buffer holding |slot|'s value between runs (borrowed; NULL when
 * empty): the device buffer, or for an offloaded slot its host home. */
st_buffer* st_executor_get(st_executor* executor, int slot);
/* Puts |buffer| into |slot| without taking ownership (another executor owns
 * it); NULL empties the slot without freeing. Used to share parameters.
 * The buffer must be on the slot's device (with a pipeline, its stage's). */
void st_executor_set_borrowed(st_executor* executor, int slot, st_buffer* buffer); /* device index 0 */
void st_executor_set_borrowed_device(st_executor* executor, int slot, int index, st_buffer* buffer);
/* st_executor_get of device index |index| (NULL when out of range). */
st_buffer* st_executor_get_device(st_executor* executor, int slot, int index);
/* plan->devices (1 for a one-device plan). */
int st_executor_devices(const st_executor* executor);

/* Watching ops as they run (the hang watchdog, the faults.hang_in drill).
 * |issue| is called on the host thread right before op |op|'s work for
 * data-parallel index |index| is issued: for a LAUNCH / RECOMPUTE /
 * COLLECTIVE inside the launch, just before the program is executed (an
 * SPMD op: for every index, then the one execution); for H2D and D2H once
 * per index; for READ, WAIT, HOST and FREE once, index 0. |done| is called
 * once for each |issue| whose work completed: from a PJRT callback thread
 * for device work, on the host thread for the others. An op that fails
 * gets no |done| for what it did not issue; st_executor_run's caller
 * settles those. Both may be NULL. */
typedef struct st_executor_monitor {
  void* user;
  void (*issue)(void* user, int op, int index);
  void (*done)(void* user, int op, int index);
} st_executor_monitor;
/* Copied; NULL removes it. Set between runs. */
void st_executor_set_monitor(st_executor* executor, const st_executor_monitor* monitor);

/* Runs every op of the plan once. Statistics and timings are reset at the
 * start and complete when it returns (the executor waits for every op's
 * completion callback before returning). */
st_status st_executor_run(st_executor* executor, const st_executor_hooks* hooks);
/* Called from a hook during st_executor_run: the rest of this run issues
 * no LAUNCH, RECOMPUTE or COLLECTIVE (their slots keep what they hold, so
 * an update of persistent state is dropped, diag.on_nonfinite=skip), a
 * FREE, D2H or READ of an empty slot is no error, and at the end every
 * non-persistent slot still filled is freed. Reset by the next run. */
void st_executor_skip_launches(st_executor* executor);
/* Whether the last run skipped its launches from some op on. */
bool st_executor_skipped(const st_executor* executor);
const st_executor_stats* st_executor_stats_get(const st_executor* executor);
/* op_count entries for the last run (borrowed, valid until the next run). */
const st_op_timing* st_executor_timings(const st_executor* executor);
/* Predicted live bytes by category after every op (op_count *
 * ST_SLOT_CATEGORY_COUNT) and the accounted ones of the last run. */
const int64_t* st_executor_live_predicted(const st_executor* executor);
const int64_t* st_executor_live_accounted(const st_executor* executor);

/* Writes the last run as Chrome trace-event JSON (docs/scheduling.md):
 * launches, transfers and host waits on their own tracks, host ops on a
 * fourth, counters for live device bytes. A data-parallel plan draws each
 * launch and collective once per device instead, on a compute and a
 * communication track per device. |step| labels it. |spans| (NULL: none;
 * borrowed): slices from outside the plan on the same clock, on tracks of
 * their own (the FFI kernels' calls: st_kernels_spans_take_trace). */
st_status st_executor_write_trace(const st_executor* executor, const char* path, int64_t step,
                                  const st_trace_spans* spans);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_SCHED_H */
