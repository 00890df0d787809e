/* ir.h — a reader of StableHLO in MLIR text form (the form a bundle stores),
 * enough to count what a program does: FLOPs of dot_general and
 * convolution, elements of elementwise and reduce ops, bytes of arguments
 * and results, collectives, custom calls, while loops (trip count when
 * static), host callbacks, dynamic shapes and f64 use (docs/analysis.md).
 *
 * It is not an MLIR parser: it walks the printed text of functions and ops
 * with bounded scanning, follows func.call into callees (counted once a
 * call) and while bodies (times the trip count), and skips what it does not
 * know (an unknown op counts as 0 FLOPs). Every count and size it reads is
 * bounded (ST_IR_MAX_*); input beyond a bound, or not shaped like a module
 * with a @main function, is an ST_CODE_RUNTIME status (a bundle error,
 * exit 4) naming the program and the reason; it never aborts.
 *
 * The scanning helpers (st_ir_find ... st_ir_parse_type) are shared with the
 * runtime's reader of @main signatures (src/runtime/mlir_sig.c). */
#ifndef STRATA_IR_H
#define STRATA_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/status.h"
#include "strata/tensor.h"

#define ST_IR_MAX_TEXT ((size_t)1 << 30)  /* bytes of one program's text */
#define ST_IR_MAX_FUNCS 4096              /* func.func of one module */
#define ST_IR_MAX_NAME 256                /* a function's or op's name */
#define ST_IR_MAX_DEPTH 32                /* nested regions and calls */
#define ST_IR_MAX_RANK 16                 /* dims of one tensor type */
#define ST_IR_MAX_DIM ((int64_t)1 << 48)  /* one static dimension */
#define ST_IR_MAX_VISITS ((int64_t)1 << 22) /* op visits (calls re-walk their callee) */
#define ST_IR_MAX_TRIP ((int64_t)1 << 32) /* a static while trip count */
#define ST_IR_MAX_DISTINCT 256            /* distinct collectives, custom-call targets */
#define ST_IR_MAX_FINDINGS 64             /* hazard findings kept per program (more are counted) */
#define ST_IR_MAX_GRAPH 65536             /* ops and edges of one function's dataflow graph */

/* ---- scanning helpers (bounded: every function reads [p, e) only) ---- */

/* First occurrence of |needle| in [s, e), or NULL. */
const char* st_ir_find(const char* s, const char* e, const char* needle);
/* First non-whitespace position at or after |p| (|e| when none). */
const char* st_ir_skip_ws(const char* p, const char* e);
/* Position of the first top-level |stop| at or after |p| (or |e|), with
 * (), <>, {}, [] and "strings" nesting; "->" is not a closing '>'. An
 * unbalanced closing bracket also ends the scan (the enclosing list ends). */
const char* st_ir_scan_to(const char* p, const char* e, char stop);

/* One ranked tensor type. dims[i] is -1 for a dynamic ('?') dimension. */
typedef struct st_ir_type {
  st_dtype dtype; /* ST_DTYPE_INVALID for an element type strata does not name (complex, f8, ...) */
  int rank;
  int64_t dims[ST_IR_MAX_RANK];
  bool dynamic; /* a '?' dimension */
} st_ir_type;

/* Parses "tensor<4x?x8xf32>" (optionally with ", encoding") at |p| (after
 * whitespace): false when it is not a ranked tensor type within the bounds
 * (rank <= ST_IR_MAX_RANK, dims <= ST_IR_MAX_DIM). |out_end| is after '>'. */
bool st_ir_parse_type(const char* p, const char* e, st_ir_type* t, const char** out_end);
/* Elements (1 for rank 0); a dynamic dimension counts as 1. */
double st_ir_type_elements(const st_ir_type* t);
/* Bytes (elements x element size; 0 for an unknown element type). */
double st_ir_type_bytes(const st_ir_type* t);

/* ---- program analysis ---- */

typedef struct st_ir_collective {
  char kind[32];    /* "all_reduce", "all_gather", "reduce_scatter", "collective_permute", "all_to_all", ... */
  char groups[128]; /* "axes=data,fsdp" (mesh axes) or "groups=[[0,1]]" (replica groups), cut at 127 bytes; "" unknown */
  double count;     /* executions per program run (calls and trip counts multiplied in) */
  double bytes;     /* operand bytes per device, all executions together */
} st_ir_collective;

typedef struct st_ir_custom_call {
  char target[64]; /* call_target_name, cut at 63 bytes */
  double count;    /* executions per program run */
} st_ir_custom_call;

/* One hazard at one op, in the static pass over every function (ops as
 * written, dead or not): what `strata analyze --lint` and the bundle lint
 * judge (docs/analysis.md "Lint"). */
typedef enum st_ir_finding_kind {
  ST_IR_FIND_DYNAMIC_SHAPE, /* a '?' dimension in the op's types, or a dynamic_* shape op */
  ST_IR_FIND_HOST_CALLBACK, /* a custom call whose target names a callback */
  ST_IR_FIND_F64,           /* an f64 type in the op's types */
  ST_IR_FIND_CUSTOM_CALL,   /* any other custom call (the lint decides which targets it knows) */
} st_ir_finding_kind;

typedef struct st_ir_finding {
  st_ir_finding_kind kind;
  char op[64];      /* the op's name as written ("stablehlo.custom_call") */
  char func[64];    /* the function it is in, cut at 63 bytes */
  int line;         /* 1-based line of the op in the program text */
  char detail[64];  /* the custom-call target; the dynamic op; "" */
} st_ir_finding;

const char* st_ir_finding_kind_name(st_ir_finding_kind kind); /* "dynamic_shape", "host_callback", "f64", "custom_call" */

/* Static op counts (ops as written, not executions), by kind. */
typedef struct st_ir_op_counts {
  int64_t total, dot, convolution, elementwise, reduce, data_movement, constant, collective, custom_call,
      while_loop, call, other;
} st_ir_op_counts;

/* What one program does per execution. FLOPs follow XLA's HloCostAnalysis
 * (a dot is 2 x result elements x contracted size; an elementwise op one
 * FLOP per result element, transcendental ones counted apart; a reduce its
 * region's FLOPs per reduced element), except that a while loop counts its
 * body trip-count times when the count is static (docs/analysis.md). */
typedef struct st_ir_stats {
  double flops;            /* dot + convolution + elementwise + reduce + other */
  double dot_flops;        /* dot_general and dot */
  double conv_flops;       /* convolution */
  double elementwise_flops;
  double reduce_flops;     /* reduce, reduce_window, scatter, all_reduce regions */
  double transcendentals;  /* exp, log, rsqrt, sin, power, ... (not in flops) */
  double elementwise_elements; /* result elements of elementwise ops (incl. transcendental) */
  double reduce_elements;      /* input elements of reduce ops */
  double bytes_accessed;   /* XLA's convention: per op, operand + result bytes, summed (unfused) */
  double arg_bytes;        /* @main's arguments: what a launch reads at least */
  double result_bytes;     /* @main's results: what it writes at least */
  int n_args, n_results;
  st_ir_op_counts ops;
  int64_t funcs;           /* func.func in the module */
  int64_t while_loops;     /* while ops (static) */
  int64_t while_unknown_trip; /* of them, trip count not static: body counted once */
  double max_trip;         /* the largest static trip count (0: none) */
  int64_t host_callbacks;  /* custom calls to a Python host callback */
  bool dynamic_shapes;     /* a '?' dimension or a dynamic_* shape op */
  bool uses_f64;           /* an f64 tensor anywhere */
  int n_collectives;
  st_ir_collective* collectives; /* owned; one entry per (kind, groups) */
  int n_custom_calls;
  st_ir_custom_call* custom_calls; /* owned; one entry per target */
  int n_findings;
  st_ir_finding* findings;  /* owned; in text order, at most ST_IR_MAX_FINDINGS */
  int64_t findings_dropped; /* beyond that bound */
} st_ir_stats;

/* Analyzes one module's text (|size| bytes, need not be NUL-terminated).
 * |name| names the program in error messages (a path). On success |out|
 * is filled (free it with st_ir_stats_free); on error it is left empty. */
st_status st_ir_analyze(const char* text, size_t size, const char* name, st_ir_stats* out);
/* Reads |path| and analyzes it. */
st_status st_ir_analyze_file(const char* path, st_ir_stats* out);
void st_ir_stats_free(st_ir_stats* stats); /* NULL and empty are fine */

/* ---- dataflow of @main (strata analyze --dot) ---- */

/* A node: one of @main's arguments (op "arg"), or one top-level op of its
 * body (a region's ops are inside their op). */
typedef struct st_ir_node {
  char op[64];    /* short op name: "dot_general", "arg", "return" */
  char value[24]; /* its first result ("%12", "%arg0"), cut; "" for none */
  char type[48];  /* its first result's type as written, cut at 47 bytes */
  int line;       /* 1-based */
  bool collective;
  bool custom_call;
} st_ir_node;

typedef struct st_ir_edge {
  int from, to; /* node indices: |to| uses a value |from| defines */
} st_ir_edge;

typedef struct st_ir_graph {
  int n_nodes, n_edges;
  st_ir_node* nodes; /* owned */
  st_ir_edge* edges; /* owned; one per (from, to) pair */
} st_ir_graph;

/* The dataflow graph of @main of one module's text. Beyond ST_IR_MAX_GRAPH
 * nodes or edges, or text the reader refuses: ST_CODE_RUNTIME naming
 * |name|, |out| empty. */
st_status st_ir_main_graph(const char* text, size_t size, const char* name, st_ir_graph* out);
void st_ir_graph_free(st_ir_graph* graph); /* NULL and empty are fine */

/* ---- XLA's optimized program (runtime.keep_optimized_hlo) ---- */

#define ST_IR_HLO_TOP 5 /* largest fusions kept */

typedef struct st_ir_fusion {
  char name[64]; /* the fusion instruction's name, cut */
  char kind[16]; /* "kLoop", "kInput", "kOutput", "kCustom"; "" unknown */
  int64_t ops;   /* instructions of its fused computation */
} st_ir_fusion;

typedef struct st_ir_hlo_summary {
  int64_t computations;
  int64_t instructions;       /* in every computation */
  int64_t entry_instructions; /* in the entry computation */
  int64_t fusions;            /* fusion instructions anywhere */
  int n_top;
  st_ir_fusion top[ST_IR_HLO_TOP]; /* the largest fusions, largest first */
} st_ir_hlo_summary;

/* Reads a serialized HloModuleProto (|format| "hlo") or
 * HloModuleProtoWithConfig ("hlo_with_config"), as PJRT's
 * OptimizedProgram returns it, with a bounded protobuf walk (no schema
 * compiled in: the few field numbers it needs are in src/ir/hlo_proto.c).
 * ST_CODE_RUNTIME naming |name| for bytes that are not such a message. */
st_status st_ir_hlo_summarize(const void* bytes, size_t size, const char* format, const char* name,
                              st_ir_hlo_summary* out);

#endif
