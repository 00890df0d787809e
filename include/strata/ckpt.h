/*
 * strata/ckpt.h — tensors and training state on disk (docs/checkpoints.md).
 *
 *   safetensors   the tensor file format (readable by the Python
 *                 `safetensors` package): writer and validating reader.
 *   checkpoint    <run>/checkpoints/step_<N>/{params,optimizer}.safetensors
 *                 + manifest.json (step, data position, RNG, schedule,
 *                 resolved config, bundle key, shape/dtype/xxh64 per
 *                 tensor), committed atomically (temporary folder, fsync,
 *                 rename, then LATEST), verified on every load.
 *   writer        a thread that writes snapshots while training continues.
 *
 * Every failure is ST_CODE_CKPT (exit 7) and names the folder, the file and,
 * where one is involved, the tensor.
 *
 * Thread-safety: everything here is reentrant; an st_ckpt_writer is driven
 * from one thread (its own worker aside).
 */
#ifndef STRATA_CKPT_H
#define STRATA_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/tensor.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/*===-------------------------------------------------------------------===*/
/* safetensors                                                              */
/*===-------------------------------------------------------------------===*/

typedef struct st_named_tensor {
  const char* name;
  st_tensor_type type;
  const void* data; /* st_tensor_type_bytes(&type) bytes, borrowed */
} st_named_tensor;

/* Writes |count| tensors to |path| in the safetensors format (8-byte
 * little-endian header size, JSON header, raw little-endian data), through
 * a temporary file + fsync + rename. ST_CODE_CKPT on failure. */
st_status st_safetensors_write(const char* path, const st_named_tensor* tensors, int count);

/* The header of a safetensors file for |tensors| (laid out back to back in
 * order), padded to a multiple of 8, with the 8-byte length prefix:
 * |out_header| receives a new buffer (caller frees) of *out_header_size
 * bytes; *out_data_size is the size of the data that follows. */
st_status st_safetensors_header(const st_named_tensor* tensors, int count, const char* origin, char** out_header,
                                size_t* out_header_size, size_t* out_data_size);

/* Safetensors dtype spelling ("F32", "BF16", "I32", ...) and back. */
const char* st_safetensors_dtype_name(st_dtype dtype); /* NULL when not representable */
st_dtype st_safetensors_dtype_parse(const char* name);  /* ST_DTYPE_INVALID when unknown */

typedef struct st_safetensors_entry {
  char* name;
  st_tensor_type type;
  size_t offset; /* from the start of the file */
  size_t bytes;
} st_safetensors_entry;

/* The largest header the Python package reads (its MAX_HEADER_SIZE). */
#define ST_SAFETENSORS_MAX_HEADER 100000000u

/* A whole safetensors file in memory, structure checked: exactly the files
 * the Python `safetensors` package accepts (header length within the file
 * and ST_SAFETENSORS_MAX_HEADER, UTF-8 JSON by serde_json's rules, each
 * entry a known dtype, integer shape and data_offsets whose sizes do not
 * overflow and match, entries tiling the data region exactly, a repeated
 * name meaning its last entry), minus what strata cannot represent: dtypes
 * it has no type for, rank above ST_MAX_RANK, a dimension above INT64_MAX,
 * a NUL in a name (docs/checkpoints.md, "safetensors"). */
typedef struct st_safetensors {
  char* path;
  unsigned char* data; /* the file */
  size_t size;
  size_t data_start; /* 8 + header length */
  int count;
  st_safetensors_entry* entries; /* in header order, names unique */
} st_safetensors;

st_status st_safetensors_read(const char* path, st_safetensors** out /* owned by caller */);
/* Same, from bytes already in memory (takes ownership of |data|, malloc'ed,
 * also on failure); |path| only names the bytes in messages. */
st_status st_safetensors_parse(const char* path, unsigned char* data, size_t size, st_safetensors** out);
const st_safetensors_entry* st_safetensors_find(const st_safetensors* file, const char* name);
void st_safetensors_free(st_safetensors* file); /* NULL is a no-op */

/*===-------------------------------------------------------------------===*/
/* Checkpoints: layout and state                                            */
/*===-------------------------------------------------------------------===*/

#define ST_CKPT_FORMAT "strata-checkpoint"
#define ST_CKPT_VERSION 1
#define ST_CKPT_MANIFEST "manifest.json"
#define ST_CKPT_LATEST "LATEST"
/* The tensor files a training checkpoint holds (train/checkpoint_io.c). */
#define ST_CKPT_PARAMS "params.safetensors"
#define ST_CKPT_OPTIMIZER "optimizer.safetensors"
#define ST_CKPT_TMP_PREFIX ".tmp-" /* folders of saves in progress (or crashed) */

/* Bounds on the counts a manifest holds (docs/checkpoints.md, "Limits");
 * beyond them the checkpoint is refused (ST_CODE_CKPT, exit 7). strata
 * writes 2 files and 3 tensors per parameter (value, m, v), and a bundle
 * holds at most ST_BUNDLE_MAX_PARAMS parameters. */
#define ST_CKPT_MAX_FILES 16
#define ST_CKPT_MAX_TENSORS (3 * ST_BUNDLE_MAX_PARAMS)

/* What a checkpoint records besides tensors. Strings are borrowed. */
typedef struct st_ckpt_meta {
  int64_t step;           /* optimizer steps completed */
  int64_t optimizer_step; /* AdamW's t (bias correction) of the last update */
  int64_t data_position;  /* training sequences consumed (docs/data.md) */
  int64_t batch_size;
  uint64_t seed;          /* the only RNG state: init and sampler are pure functions of it */
  double lr;              /* learning rate of the last completed step */
  int64_t total_steps;    /* train.steps, for the schedule */
  /* The schedule's definition (an object, NULL writes none): its members
   * join "step", "total_steps" and "lr" in the manifest's "lr_schedule"
   * (st_plan_lr_schedule_json; docs/checkpoints.md). */
  const st_json* lr_schedule;
  /* The data contract (an object, NULL writes none): its members ("packing",
   * "sources": per source its name, content hash, documents, tokenizer and
   * documents drawn so far) join "position", "unit" and "batch_size" in the
   * manifest's "data" (docs/checkpoints.md, docs/data.md "Data contract"). */
  const st_json* data_contract;
  const st_json* config;   /* the resolved config (an object; NULL writes {}) */
  const char* config_hash;
  const char* bundle_key;
  /* The tokenizer of the training tokens ("tokenizer_hash"): "byte", "none"
   * or BPE's 16 hex digits (docs/data.md); NULL or "" writes none. */
  const char* tokenizer_hash;
  const st_json* model;    /* the model's identity (NULL writes {}): mesh-independent, see docs/checkpoints.md */
  /* The mesh the state was trained on ("mesh" in the manifest; 0 counts as
   * 1). Every tensor is written whole (layout "whole") whatever the mesh,
   * so any mesh the model allows can read it back. In a job of several
   * processes, the job's whole mesh, and |mesh_processes| how many
   * processes it spanned ("processes" in "mesh"; 0 or 1 writes none, so a
   * one-process manifest is as before). |mesh_pipeline|: the pipeline
   * stages, each on its own data x fsdp x tensor devices ("pipeline" in
   * "mesh"; 0 or 1 writes none). */
  int mesh_data, mesh_fsdp, mesh_tensor, mesh_processes, mesh_pipeline;
} st_ckpt_meta;

/* A host copy of the training state, ready to be written. The writer reads
 * it; the trainer fills it (st_ckpt_snapshot_data) and can reuse it for the
 * next save once the previous save has completed. */
typedef struct st_ckpt_snapshot st_ckpt_snapshot;

/* |count| tensors; names and files ("params.safetensors") are copied. */
st_ckpt_snapshot* st_ckpt_snapshot_create(int count, const char* const* names, const char* const* files,
                                          const st_tensor_type* types);
void st_ckpt_snapshot_destroy(st_ckpt_snapshot* snapshot); /* NULL is a no-op */
/* A streaming snapshot (ckpt.staging=chunked, docs/checkpoints.md): it
 * holds no copy of the state. st_ckpt_save calls |fill(user, i, dst,
 * size)| for each tensor i as it writes it, with a staging buffer of the
 * largest tensor of that file (mapped for the save, unmapped after), so a
 * save needs one tensor of host memory instead of the whole state. It must
 * be saved while the state it reads stays put (synchronously: the writer
 * thread cannot take it). st_ckpt_snapshot_data returns NULL for it. */
typedef st_status (*st_ckpt_fill_fn)(void* user, int i, void* dst, size_t size);
st_ckpt_snapshot* st_ckpt_snapshot_create_streaming(int count, const char* const* names, const char* const* files,
                                                    const st_tensor_type* types, st_ckpt_fill_fn fill, void* user);
bool st_ckpt_snapshot_is_streaming(const st_ckpt_snapshot* snapshot);
/* Host bytes the snapshot stages: the whole state, or (streaming) its largest tensor. */
int64_t st_ckpt_snapshot_staging_bytes(const st_ckpt_snapshot* snapshot);
/* Host memory of tensor |i| (st_tensor_type_bytes bytes), owned by the snapshot. */
void* st_ckpt_snapshot_data(st_ckpt_snapshot* snapshot, int i);
int st_ckpt_snapshot_count(const st_ckpt_snapshot* snapshot);
int64_t st_ckpt_snapshot_bytes(const st_ckpt_snapshot* snapshot); /* tensor bytes */
/* Copies |meta| (strings included) into the snapshot. */
void st_ckpt_snapshot_set_meta(st_ckpt_snapshot* snapshot, const st_ckpt_meta* meta);
const st_ckpt_meta* st_ckpt_snapshot_meta(const st_ckpt_snapshot* snapshot);

/* Points in a save where a fault hook is called (fault injection, and the
 * crash-at-every-instant tests). |path| is the file or folder involved. */
typedef enum st_ckpt_point {
  ST_CKPT_AT_BEGIN,        /* temporary folder created, nothing written */
  ST_CKPT_AT_FILE_MIDDLE,  /* half of a tensor file's bytes written */
  ST_CKPT_AT_FILE_DONE,    /* a tensor file written and fsynced */
  ST_CKPT_AT_MANIFEST,     /* manifest written and fsynced, folder not renamed */
  ST_CKPT_AT_RENAMED,      /* step_<N> in place, LATEST not yet updated */
  ST_CKPT_AT_COMMITTED,    /* LATEST updated */
  ST_CKPT_POINT_COUNT,
} st_ckpt_point;
const char* st_ckpt_point_name(st_ckpt_point point);

/* Called at each point. A non-OK status makes the save fail there exactly
 * as an I/O error would (the hook's message is kept); the hook may also
 * end the process. */
typedef st_status (*st_ckpt_hook_fn)(void* user, st_ckpt_point point, const char* path);

typedef struct st_ckpt_save_options {
  const char* root;  /* <run>/checkpoints; created when missing */
  int64_t keep;      /* keep the newest N committed checkpoints (>= 1) */
  int64_t keep_every; /* also keep steps that are multiples of K; 0 = off */
  st_ckpt_hook_fn hook; /* may be NULL */
  void* hook_user;
  /* "checkpoint step_<N>: x/y MiB" on stderr while the tensor files are
   * written, for a snapshot of at least min_size bytes (run.progress; off
   * when zeroed). The trainer asks for it only for saves it waits on. */
  st_progress_options progress;
} st_ckpt_save_options;

typedef struct st_ckpt_save_result {
  int64_t step;
  char* dir;        /* committed folder (owned), NULL on failure */
  double write_s;   /* from creating the temporary folder to LATEST */
  int64_t bytes;    /* bytes written, manifest included */
  int removed;      /* older checkpoints removed by retention */
  st_status status; /* st_ckpt_writer_take only: the save's outcome (owned) */
} st_ckpt_save_result;
void st_ckpt_save_result_clear(st_ckpt_save_result* result); /* frees dir and status */

/* Writes |snapshot| as <root>/step_<N> (N = meta.step): files into
 * <root>/.tmp-step_<N>-<pid>, each fsynced, manifest last, folder fsynced,
 * renamed to step_<N> (replacing an existing one), <root> fsynced, then
 * LATEST replaced atomically; then retention. On failure the temporary
 * folder is removed and the previous checkpoints are untouched. |result|
 * (may be NULL) receives the timings and the folder; its status is not set. */
st_status st_ckpt_save(const st_ckpt_save_options* options, const st_ckpt_snapshot* snapshot, st_ckpt_save_result* result);

/* Per-rank shards (docs/checkpoints.md, "Per-rank shards"): in a job whose
 * ranks each hold rows of the state (fsdp across processes), every rank
 * writes one file, rank-<r>.safetensors, into the save's shared temporary
 * folder; rank 0 then commits them with one manifest whose tensor entries
 * have the layout "rows" (the file, and which rows of which whole tensor it
 * holds). Tensor |i| of |count| is cut in |parts[i]| blocks of
 * ceil(dim0 / parts[i]) rows; rank r holds block r (none when r >= parts[i]
 * or the block is past dim 0). */
#define ST_CKPT_RANK_FILE_FMT "rank-%d.safetensors"
#define ST_CKPT_SHARDS_TMP_SUFFIX "-ranks" /* .tmp-step_<N>-ranks: a sharded save's folder, the same on every rank */

/* Rows [*begin, *end) of a tensor of |dim0| rows cut in |parts| blocks
 * that block |r| holds (empty: *begin == *end). */
void st_ckpt_rows_of(int64_t dim0, int parts, int r, int64_t* begin, int64_t* end);

/* What one rank's write left for the manifest: its file and, for each of
 * the |count| tensors of the save (in the order of the whole list), the
 * offset and xxh64 of its rows in the file (unused where it holds none). */
typedef struct st_ckpt_part {
  size_t bytes;
  uint64_t xxh64;
  size_t* offsets;  /* [count], owned */
  uint64_t* hashes; /* [count], owned */
} st_ckpt_part;
void st_ckpt_part_clear(st_ckpt_part* part);

/* One rank's share of a sharded save of step |step|: <root>/.tmp-step_<N>-ranks
 * created when missing (every rank may), then |snapshot| (this rank's rows:
 * one file, rank-<rank>.safetensors; its tensors are those of the whole
 * list it holds rows of, |index|[k] the whole list's index of snapshot
 * tensor k) written and fsynced. The hook sees AT_BEGIN, AT_FILE_MIDDLE and
 * AT_FILE_DONE. |part| (count entries) receives the records. */
st_status st_ckpt_save_rank(const st_ckpt_save_options* options, const st_ckpt_snapshot* snapshot, int64_t step, const int* index,
                            int count, st_ckpt_part* part);

/* Rank 0's commit of a sharded save, once every rank's file is durable:
 * the manifest (meta from |meta|, the |count| whole tensors |names| and
 * |types| cut as |parts| says, each of the |ranks| files with its part's
 * records), fsync, rename of the folder to step_<N>, LATEST, retention, as
 * st_ckpt_save's tail. On failure the folder is removed. */
st_status st_ckpt_commit_ranks(const st_ckpt_save_options* options, const st_ckpt_meta* meta, int count, const char* const* names,
                               const st_tensor_type* types, const int* parts, int ranks, const st_ckpt_part* recs,
                               st_ckpt_save_result* result);
/* Removes a sharded save's folder of step |step| (a save that failed). */
void st_ckpt_abort_ranks(const char* root, int64_t step);

/* Removes step_<N> folders beyond the newest |keep|, except multiples of
 * |keep_every| and the one LATEST names. Returns how many were removed. */
int st_ckpt_retain(const char* root, int64_t keep, int64_t keep_every);

/* Removes .tmp-* folders left by crashed saves. *out_names (may be NULL)
 * receives a comma-separated list of what was removed (caller frees). */
st_status st_ckpt_remove_temporaries(const char* root, char** out_names);

/*===-------------------------------------------------------------------===*/
/* Checkpoints: reading and verification                                    */
/*===-------------------------------------------------------------------===*/

/*===-------------------------------------------------------------------===*/
/* Identity: is this the model the command is about to run?                 */
/*===-------------------------------------------------------------------===*/

/* What identifies a trained model (docs/checkpoints.md, "Identity"): the
 * tokenizer of its tokens and its model description (every model.* field,
 * block kind and the kernel selection included). Borrowed. */
typedef struct st_ckpt_identity {
  const st_json* model;        /* the "model" object; NULL: not recorded (nothing model-wise is compared) */
  const char* tokenizer_hash; /* "byte", "none" or BPE's hash; NULL: not recorded / not known (not compared) */
} st_ckpt_identity;

/* model.microbatch_size is compared only with this flag (resume: it fixes
 * the programs' shapes and the data position); eval, sample and repro pick
 * their own batch. */
#define ST_CKPT_IDENTITY_MICROBATCH 1u

typedef struct st_ckpt_identity_options {
  const char* where;    /* the record in messages: a manifest's path, ... */
  const char* recorded; /* how the record is named in messages: "in the checkpoint" */
  /* What an older record implies by leaving a field out (it omitted fields
   * at their default): flattened names ("block", "kernels.attention") to
   * values, or {"same_as": "n_heads"} for the record's own value of
   * another field. NULL: a missing field is only noted, not compared. */
  const st_json* implied;
  /* --allow-mismatch: comma-separated fields allowed to differ
   * ("tokenizer", "model.rope_theta", "model.kernels", "model", "all");
   * NULL or "": none. Each allowed difference is recorded in the report. */
  const char* allow;
  const char* fix; /* the likely fix, the end of a mismatch's message */
  unsigned flags;  /* ST_CKPT_IDENTITY_* */
} st_ckpt_identity_options;

/* Compares |given| against |recorded|, field by field (the tokenizer first,
 * then every model field; a nested object such as kernels field by field:
 * "model.kernels.attention"). A difference not allowed is ST_CODE_CKPT
 * (exit 7) naming every differing field with its recorded and given value.
 * A field the record lacks is compared against what |implied| says it
 * meant, or not compared at all, and noted either way. An |allow| entry
 * that names no field is ST_CODE_CONFIG. *out_report (may be NULL; a new
 * object, also on failure) gets {"mismatched": [fields], "overridden":
 * [{"field", "recorded", "given"}], "not_recorded": [{"field", "taken_as"
 * (null: not compared)}]}; *out_tokenizer_mismatch (may be NULL) whether
 * the tokenizer differs. */
st_status st_ckpt_identity_check(const st_ckpt_identity* recorded, const st_ckpt_identity* given,
                                 const st_ckpt_identity_options* options, st_json** out_report, bool* out_tokenizer_mismatch);
/* One line for stderr of the report's notes and overrides ("" when none;
 * caller frees): "not recorded in the checkpoint (an older format), taken
 * as: model.block "llama", ...; overridden (--allow-mismatch):
 * model.rope_theta 10000.0 in the checkpoint, 500.0 given". */
char* st_ckpt_identity_notes(const st_json* report, const char* recorded);

/* What the reader expects (the model being trained). Borrowed. */
typedef struct st_ckpt_expect {
  const char* bundle_key; /* NULL: not checked */
  int count;              /* 0: tensor set not checked */
  const char* const* names;
  const st_tensor_type* types;
  /* The model's identity (st_ckpt_identity_check; identity.model NULL: not
   * checked). A checkpoint of another tokenizer is not skipped as corrupt:
   * st_ckpt_find_valid stops there with the error, since every checkpoint
   * of the run has it; one of another model is skipped (a foreign folder). */
  st_ckpt_identity identity;
  st_ckpt_identity_options identity_options;
} st_ckpt_expect;

typedef struct st_ckpt_tensor_info {
  char* name;
  char* file;
  st_tensor_type type;
  size_t offset, bytes;
  uint64_t xxh64;
  /* layout "rows" (per-rank shards): this entry is rows [row_begin,
   * row_end) of a tensor of dim0 rows; |type| is the rows' own. */
  bool rows;
  int64_t row_begin, row_end, dim0;
} st_ckpt_tensor_info;

typedef struct st_ckpt_file_info {
  char* file;
  size_t bytes;
  uint64_t xxh64;
} st_ckpt_file_info;

#define ST_CKPT_MAX_DATA_SOURCES 64

/* A verified checkpoint: manifest fields, and the tensor data when loaded. */
typedef struct st_ckpt {
  char* dir;
  int version;
  int64_t step, optimizer_step, data_position, batch_size, total_steps;
  uint64_t seed;
  double lr, created;
  char* config_hash;
  char* bundle_key;
  char* tokenizer_hash; /* NULL: the manifest has none (written before tokenizers were recorded) */
  st_json* model;  /* the manifest's "model" object (owned reference) */
  st_json* config; /* the manifest's "config" object (owned reference) */
  st_json* lr_schedule; /* the manifest's "lr_schedule" object (owned reference) */
  /* The manifest's "data" object (owned reference), its contract checked:
   * "sources" (when present) an array of at most ST_CKPT_MAX_DATA_SOURCES
   * objects with a string "name" and "content_hash" and integer
   * "documents" and "drawn"; written before data contracts: no "sources". */
  st_json* data;
  st_json* identity_report; /* opened with an expected identity: st_ckpt_identity_check's report (owned); else NULL */
  /* The manifest's "mesh" (axis sizes, devices = their product); all 0 in a
   * checkpoint written before meshes were recorded (one device).
   * mesh_processes: the processes of the job that wrote it; 0 when not
   * recorded (one process). mesh_pipeline: its pipeline stages; 0 when not
   * recorded (none). devices = data x fsdp x tensor x stages. */
  int mesh_data, mesh_fsdp, mesh_tensor, mesh_devices, mesh_processes, mesh_pipeline;
  int tensor_count;
  st_ckpt_tensor_info* tensors;
  int file_count;
  st_ckpt_file_info* files;
  st_safetensors** loaded; /* [file_count], NULL when opened without data */
  /* The tensors stored in rows (per-rank shards), one entry each, whole
   * (file "(rows)", offset 0); their data is assembled from the pieces once
   * every file verified (whole_data, NULL when opened without data).
   * st_ckpt_tensor_data finds them by name as if they were stored whole. */
  int whole_count;
  st_ckpt_tensor_info* wholes;
  void** whole_data;
} st_ckpt;

/* Opens and verifies <dir>: manifest present, parseable, self-checksum,
 * format and version; then against |expect| (may be NULL); then every file:
 * size (truncation), safetensors structure, each tensor's dtype/shape/
 * offsets against the manifest, each tensor's xxh64, the file's xxh64.
 * The first problem is the error, naming <dir>, the file and the tensor.
 * Corrupt data is never returned. */
st_status st_ckpt_open(const char* dir, const st_ckpt_expect* expect, st_ckpt** out /* owned by caller */);
void st_ckpt_free(st_ckpt* ckpt); /* NULL is a no-op */
/* st_ckpt_open reading and verifying only the tensor file |file| (a rank's
 * own file of per-rank shards; the manifest is checked whole): the other
 * files are not read (loaded[f] NULL), and the rows they hold read as
 * zeros in the assembled tensors. A |file| the manifest does not list
 * reads no file at all. */
st_status st_ckpt_open_file(const char* dir, const st_ckpt_expect* expect, const char* file, st_ckpt** out /* owned by caller */);
/* The manifest checks of st_ckpt_open on text in memory (|size| bytes,
 * borrowed): self-checksum, format, version, fields, limits. No file is
 * read; |dir| names the checkpoint in messages. The result has no data
 * (loaded is NULL). */
st_status st_ckpt_parse_manifest(const char* dir, const char* text, size_t size, st_ckpt** out /* owned by caller */);
/* Data of tensor |name| (NULL when absent); borrowed from |ckpt|. */
const void* st_ckpt_tensor_data(const st_ckpt* ckpt, const char* name, const st_ckpt_tensor_info** out_info);

/* The committed checkpoints under |root| (folders step_<N>), newest first. */
typedef struct st_ckpt_entry {
  int64_t step;
  char* name; /* "step_40" */
  char* dir;
} st_ckpt_entry;
st_status st_ckpt_list(const char* root, st_ckpt_entry** out_entries, int* out_count);
void st_ckpt_entries_free(st_ckpt_entry* entries, int count);
/* LATEST's content ("step_40"), NULL when missing or unreadable (caller frees). */
char* st_ckpt_read_latest(const char* root);
/* NULL when |latest| (LATEST's content) names a checkpoint folder under
 * |root|: a plain "step_<N>" name, no path, and that folder exists. Else
 * why not (a static string). strata only compares LATEST with folder
 * names, never follows it as a path; this is for reporting it. */
const char* st_ckpt_latest_problem(const char* root, const char* latest);

/* Called for each checkpoint skipped while looking for a valid one. */
typedef void (*st_ckpt_skip_fn)(void* user, const st_ckpt_entry* entry, st_status why /* borrowed */);

/* The newest checkpoint under |root| that verifies against |expect|,
 * skipping (and reporting) invalid ones. *out is NULL when there is none
 * (not an error); *out_skipped counts the skipped ones. */
st_status st_ckpt_find_valid(const char* root, const st_ckpt_expect* expect, st_ckpt_skip_fn on_skip, void* user,
                             st_ckpt** out, int* out_skipped);

/*===-------------------------------------------------------------------===*/
/* Asynchronous writer                                                      */
/*===-------------------------------------------------------------------===*/

/* One worker thread; at most one save in flight (a new submit while one is
 * running is refused: the caller waits first, which bounds both host memory
 * and the steps a crash can lose). */
typedef struct st_ckpt_writer st_ckpt_writer;

/* |options| strings are copied. */
st_status st_ckpt_writer_create(const st_ckpt_save_options* options, st_ckpt_writer** out /* owned by caller */);
/* Starts saving |snapshot| (borrowed until the save is reported done). */
st_status st_ckpt_writer_submit(st_ckpt_writer* writer, const st_ckpt_snapshot* snapshot);
bool st_ckpt_writer_busy(st_ckpt_writer* writer);
/* When a save has finished since the last call, moves its result into
 * |out| and returns true; |wait| blocks until the in-flight save is done
 * (returns false at once when none is in flight or pending). */
bool st_ckpt_writer_take(st_ckpt_writer* writer, bool wait, st_ckpt_save_result* out);
/* Waits for the in-flight save, then stops the thread. NULL is a no-op. An
 * unreported result is discarded (freed). */
void st_ckpt_writer_destroy(st_ckpt_writer* writer);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_CKPT_H */
