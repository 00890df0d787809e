/*
 * strata/bundle.h — the program bundle (docs/bundle.md): the manifest the
 * front-end writes and the C framework reads. Reading validates the schema
 * version, every tensor type, and each program file's sha256.
 *
 * Errors are ST_CODE_RUNTIME (exit 4) and name the manifest or program file.
 */
#ifndef STRATA_BUNDLE_H
#define STRATA_BUNDLE_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/status.h"
#include "strata/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_BUNDLE_SCHEMA_VERSION 1

/* Bounds on every count a manifest holds (docs/bundle.md, "Limits"). A
 * manifest beyond one is refused (ST_CODE_RUNTIME, exit 4) before anything
 * is sized from it, so code that reads a bundle may rely on them. */
#define ST_BUNDLE_MAX_PROGRAMS 256
#define ST_BUNDLE_MAX_PROGRAM_TENSORS 256 /* inputs, and outputs, of one program */
#define ST_BUNDLE_MAX_GROUPS 64
#define ST_BUNDLE_MAX_GROUP_PARAMS 32 /* parameters of one group */
#define ST_BUNDLE_MAX_LAYERS 1024     /* model.n_layers (the config's bound too) */
#define ST_BUNDLE_MAX_PARAMS (ST_BUNDLE_MAX_LAYERS * ST_BUNDLE_MAX_GROUP_PARAMS + 2 * ST_BUNDLE_MAX_GROUP_PARAMS)
#define ST_BUNDLE_MAX_DIM (INT64_C(1) << 40) /* one tensor dimension; a tensor's bytes must fit size_t too */

typedef struct st_bundle_tensor {
  char* name;
  char* role; /* "param", "grad", "activation", "batch", "scalar", ... */
  st_tensor_type type;
} st_bundle_tensor;

typedef struct st_bundle_program {
  char* name;
  char* path; /* absolute or bundle-relative path of the .mlir file */
  char sha256[65];
  int input_count;
  st_bundle_tensor* inputs;
  int output_count;
  st_bundle_tensor* outputs;
  bool* donated; /* [input_count] */
  double flops;
} st_bundle_program;

typedef struct st_bundle_group {
  char* name;
  int param_count;
  char** params; /* local names, in program order */
  /* The group's optimizer programs (groups[].programs; point into
   * st_bundle.programs): accumulate two gradients, sum of squares of the
   * gradients, the update (role "update", or "adamw" in a bundle of adamw
   * everywhere): params, grads, the optimizer state tensors (role
   * "opt_<kind>", named "<kind>_<local>"), step, lr, gscale, hyper ->
   * params, state (docs/bundle.md). */
  const st_bundle_program* accum;
  const st_bundle_program* sqnorm;
  const st_bundle_program* update;
  /* diag.numerics (docs/diagnostics.md): the update that also returns the
   * group's f32[n, 8] statistics ("update_stats", else "adamw_stats"); NULL
   * in a bundle without it (a mesh with fsdp or tensor > 1, an older
   * exporter). */
  const st_bundle_program* update_stats;
  /* Bundles exported for a mesh with data > 1: the all-reduce of the
   * group's gradients over the data axis (points into
   * st_bundle.collectives; NULL otherwise). Its inputs and outputs are the
   * group's parameters in order, with their per-device types. */
  const st_bundle_program* data_all_reduce;
  /* Bundles exported for a mesh with fsdp > 1 (tensor = 1): the all-gather
   * of the group's parameters from their fsdp blocks, the reduce-scatter of
   * its whole gradients into blocks (both over fsdp; in st_bundle.
   * collectives), and the optimizer programs on one device's blocks
   * (groups[].shard_programs, in st_bundle.programs). A block is dim 0 cut
   * in ceil(d0 / fsdp) rows, zero-padded. With data > 1 too,
   * data_all_reduce works on the blocks. NULL otherwise. */
  const st_bundle_program* fsdp_all_gather;
  const st_bundle_program* fsdp_reduce_scatter;
  const st_bundle_program* shard_accum;
  const st_bundle_program* shard_sqnorm;
  const st_bundle_program* shard_update;
} st_bundle_group;

typedef struct st_bundle_param {
  char* name;  /* "layers.3.wq" */
  char* group; /* "block" */
  char* local; /* "wq" */
  int layer;   /* -1 for non-layer params */
  st_tensor_type type;
  bool decay;
} st_bundle_param;

/* One stage of the model and the programs that serve it, by role
 * (docs/bundle.md, "Program tables"): the embedding, one row of the layer
 * table, the head. The plan builder takes every program name from here.
 * Program pointers point into st_bundle.programs; NULL for a role the stage
 * does not have. */
typedef struct st_bundle_stage {
  int index;                    /* block index; -1 for the embedding and the head */
  char kind[32];                /* a layer's block kind (layer table "kind", e.g. "llama"; "" when absent) */
  const st_bundle_group* group; /* the stage's parameter group */
  const st_bundle_program* init;    /* every stage */
  const st_bundle_program* fwd;     /* embedding, block */
  const st_bundle_program* bwd;     /* embedding, block (a block's recomputes its forward) */
  const st_bundle_program* fwd_res; /* block: the forward that keeps the residuals */
  const st_bundle_program* bwd_res; /* block: the backward from the residuals */
  const st_bundle_program* loss;    /* head: loss, head gradients, dx */
  const st_bundle_program* eval;    /* head: loss only */
  /* Generation, batch 1 (strata sample; docs/bundle.md, "Generation
   * programs"); optional: NULL in a bundle from an older exporter. */
  const st_bundle_program* prefill; /* embedding: tokens [1,T] -> x; block: x [1,T,D] -> y, k and v caches */
  const st_bundle_program* decode;  /* embedding: token [1,1] -> x; block: x [1,1,D], caches, pos -> y, caches */
  const st_bundle_program* logits;  /* head: x [1,1,D] -> f32 logits [1,1,V] */
  /* block, optional (diag.numerics=layer): x [mb,T,D] -> f32[3] sum of
   * squares, largest |x|, non-finite count */
  const st_bundle_program* act_stats;
  /* embedding of a tied model whose group has more parameters than wte (the
   * gpt2 family's wpe): (grad wte, the head's grad wte) -> grad wte, in place
   * of the group's accum for the tied gradient; NULL otherwise. */
  const st_bundle_program* accum_tied;
} st_bundle_stage;

typedef struct st_bundle_model {
  int64_t vocab_size, d_model, n_layers, n_heads, d_ff, seq_len, microbatch_size;
  bool tie_embeddings;
  char compute_dtype[8];
  double rope_theta, init_std;
} st_bundle_model;

/* The compile-contract lint (src/bundle/lint.c, docs/analysis.md "Lint"):
 * what would not compile once and run in strata's runtime. */
typedef enum st_lint_severity { ST_LINT_WARNING, ST_LINT_ERROR } st_lint_severity;

typedef struct st_lint_finding {
  st_lint_severity severity;
  char kind[24];     /* "dynamic_shape", "host_callback", "f64", "custom_call", "per_layer_compile", "signature_changed" */
  char program[128]; /* the program (or "layers" for the layer table) */
  char op[64];       /* the op ("" for a bundle-level finding) */
  int line;          /* of the op in the program's text; 0 when none */
  char message[256]; /* one sentence: what and the likely fix */
} st_lint_finding;

typedef struct st_lint_report {
  int count, errors, warnings;
  st_lint_finding* findings; /* owned */
} st_lint_report;

/* One op of the manifest's "kernels" (docs/bundle.md, "Kernels"): the
 * implementation the programs use (xla, ffi, pallas), the contract version
 * they were exported against, and the FFI custom-call targets they call
 * (ffi only). fallback: the implementation some calls took instead, their
 * operands being outside the contract ("" when none did). */
#define ST_BUNDLE_MAX_KERNELS 64
#define ST_BUNDLE_MAX_KERNEL_TARGETS 8
typedef struct st_bundle_kernel {
  char* name;
  char* impl;
  int version;
  char* fallback;
  int target_count;
  char* targets[ST_BUNDLE_MAX_KERNEL_TARGETS];
} st_bundle_kernel;

typedef struct st_bundle {
  char* dir;
  char* key;
  int schema_version;
  char* jax_version;    /* manifest versions.jax ("" when absent) */
  char* jaxlib_version; /* manifest versions.jaxlib ("" when absent) */
  st_bundle_model model;
  int program_count;
  st_bundle_program* programs;
  int group_count;
  st_bundle_group* groups;
  int param_count;
  st_bundle_param* params;
  st_bundle_stage embed;  /* "embed" */
  st_bundle_stage head;   /* "head" */
  int layer_count;        /* == model.n_layers */
  st_bundle_stage* layers; /* "layers": the layer table, by block index */
  /* The mesh the bundle was exported for (manifest "mesh"; all 1 without
   * one) and its SPMD programs (docs/parallelism.md): the collectives
   * (manifest "collectives"), then the tensor-parallel compute programs
   * (manifest "spmd_programs", which the program tables may name). Tensor
   * types are the per-device (local) ones. */
  int mesh_data, mesh_fsdp, mesh_tensor;
  /* Manifest "process_fsdp" (1 without): the processes an fsdp axis spans,
   * for whom the shard programs were exported (blocks of 1/process_fsdp). */
  int process_fsdp;
  int collective_count;
  st_bundle_program* collectives;
  /* The manifest's "kernels" (none in a bundle without them). */
  int kernel_count;
  st_bundle_kernel* kernels;
  /* What st_bundle_ensure's lint found (warnings only: an error fails
   * the ensure); empty from st_bundle_open. */
  st_lint_report lint;
} st_bundle;

#define ST_BUNDLE_MAX_COLLECTIVES 256

/* Lints one program's text: its ops' hazards (dynamic shapes, host
 * callbacks and custom calls strata does not know are errors; f64 a
 * warning). Findings are appended to |report|. A text the reader refuses
 * is an error finding too. */
void st_lint_program_text(const char* program, const char* text, size_t size, st_lint_report* report);
/* The same, with custom calls to the FFI targets |bundle|'s "kernels"
 * declares allowed (|bundle| may be NULL: none are). */
void st_lint_program_text_in(const st_bundle* bundle, const char* program, const char* text, size_t size,
                             st_lint_report* report);
/* Lints every program and collective of |bundle| and its layer table (a
 * role that names several programs over the layers compiles each: a
 * warning), and, when |previous| (a bundle of the same key, e.g. the one a
 * re-export replaces; may be NULL) is given, every program whose
 * signature changed (an error). */
void st_lint_bundle(const st_bundle* bundle, const st_bundle* previous, st_lint_report* report);
/* Whether two programs take and return the same tensor types, in order. */
bool st_bundle_same_signature(const st_bundle_program* a, const st_bundle_program* b);
/* The first error as a bundle status (ST_CODE_RUNTIME, exit 4) naming
 * program, line and op; ST_OK when there is none. */
st_status st_lint_status(const st_lint_report* report, const char* bundle_dir);
st_json* st_lint_json(const st_lint_report* report); /* a new array */
void st_lint_report_free(st_lint_report* report);

/* Reads and validates <dir>/manifest.json and the program files' sha256. */
st_status st_bundle_open(const char* dir, st_bundle** out_bundle /* owned by caller */);
/* Validates manifest text (|size| bytes, borrowed) as st_bundle_open does,
 * without touching program files; |dir| is where the bundle would live
 * (program paths are joined to it, messages name <dir>/manifest.json). */
st_status st_bundle_parse(const char* dir, const char* text, size_t size, st_bundle** out_bundle /* owned by caller */);
void st_bundle_destroy(st_bundle* bundle); /* NULL is a no-op */

/* Lookups; NULL when absent. */
const st_bundle_program* st_bundle_program_find(const st_bundle* bundle, const char* name);
const st_bundle_program* st_bundle_collective_find(const st_bundle* bundle, const char* name);
const st_bundle_group* st_bundle_group_find(const st_bundle* bundle, const char* name);
/* Index of parameter |name| in bundle->params, -1 when absent. */
int st_bundle_param_index(const st_bundle* bundle, const char* name);
/* Index of the parameter |local| of |group| at |layer| (-1 for groups that
 * are not per layer) in bundle->params, -1 when absent. */
int st_bundle_param_of(const st_bundle* bundle, const char* group, int layer, const char* local);

/* What the exporter needs, and where the bundle should live: the one
 * request st_bundle_key and st_bundle_ensure take. Borrowed strings. */
typedef struct st_bundle_request {
  const char* model_json; /* the "model" object of docs/bundle.md */
  const char* cache_root; /* bundles go to <cache_root>/bundles/<key> unless |dir| is set */
  const char* dir;        /* bundle.dir, may be NULL/"" */
  /* The device mesh to export collectives for ("data=2"), NULL or "" for
   * one device. Part of the bundle key only when set. */
  const char* mesh;
  /* Polled while the exporter runs (st_python_job.stop_signal); NULL: never. */
  int (*stop_signal)(void);
  /* An export draws "export: k/n programs" on this process's stderr
   * (run.progress; the exporter's own output goes to its log). */
  bool progress;
  /* fsdp across this many processes (docs/multiprocess.md): the groups'
   * shard programs on blocks of 1/process_fsdp. 0 or 1: none; part of the
   * bundle key only when above 1. */
  int process_fsdp;
} st_bundle_request;

/* Bundle key of |request| (its model_json and mesh; the rest is unused):
 * hash of the model JSON, the schema version, the mesh when set, and the
 * exporter's source files (so a changed exporter re-exports): those of the
 * strata_jax folder the exporter imports (the source tree's python/, else
 * the first on $PYTHONPATH, else the site-packages of st_bundle_python's
 * venv). 16 hex chars + NUL. */
void st_bundle_key(const st_bundle_request* request, char out[17]);

/* Opens the bundle for |request|, exporting it first when it is missing, its
 * key differs, or a program file is missing or altered (a stale bundle is
 * re-exported, never used). A stale bundle at an explicit |dir| is not
 * replaced but reported (ST_CODE_RUNTIME naming it). *out_exported tells
 * whether an export ran. */
st_status st_bundle_ensure(const st_bundle_request* request, st_bundle** out_bundle, bool* out_exported);

/* What one run of the exporter needs. Borrowed strings. */
typedef struct st_bundle_export_args {
  const char* model_json; /* the "model" object of docs/bundle.md */
  const char* mesh;       /* `--mesh |mesh|`; NULL/"": one device */
  int process_fsdp;       /* `--process-fsdp N` when above 1 */
  const char* key;        /* the bundle key it writes into the manifest */
  const char* dir;        /* where the bundle goes (its parent is created) */
  bool progress;          /* the exporter draws "export: k/n programs" on this process's stderr (`--progress-fd`) */
  int (*stop_signal)(void); /* polled while it runs (st_python_job.stop_signal); NULL: never */
} st_bundle_export_args;

/* Runs `python -m strata_jax.export` into |args->dir|; its output goes to
 * <dir>.export.log. */
st_status st_bundle_export(const st_bundle_export_args* args);

/* The Python interpreter strata uses for export: $STRATA_PYTHON, else the
 * repo's .venv. New string owned by caller. */
char* st_bundle_python(void);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_BUNDLE_H */
