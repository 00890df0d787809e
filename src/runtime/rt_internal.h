/*
 * rt_internal.h — private to src/runtime: the definitions of the objects
 * declared opaque in strata/runtime.h and helpers shared by its files.
 */
#ifndef STRATA_RUNTIME_RT_INTERNAL_H
#define STRATA_RUNTIME_RT_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/pjrt_abi.h"
#include "strata/base.h"
#include "strata/runtime.h"
#include "strata/status.h"

#define ST__MAX_MEMORIES 8

typedef struct st__device {
  pj_device* handle;
  int id;
  char* kind;
  char* description;
  int memory_count;
  char* memory_kinds[ST__MAX_MEMORIES];
  pj_memory* memories[ST__MAX_MEMORIES]; /* owned by the client */
  int default_memory;
} st__device;

struct st_runtime {
  const pj_api* api;
  pj_client* client;

  char* plugin_path;      /* as found (absolute when possible) */
  int64_t plugin_size;    /* for cache keys: a rebuilt plugin never hits */
  int64_t plugin_mtime_ns;
  char* platform_name;
  char* platform_version;
  char* xla_version; /* "" when the plugin has no such attribute */
  int api_major, api_minor;

  int device_count;
  st__device* devices;

  bool deterministic;
  int compile_threads; /* 0: one per online CPU */
  bool progress;       /* st_runtime_options.progress */
  char* cache_dir; /* NULL when the cache is off */
  char* autotune_dir; /* a GPU plugin's per-fusion autotuning cache; NULL: none (st__gpu_compile_defaults) */
  bool keep_optimized_hlo; /* runtime.keep_optimized_hlo (exe_cache.c) */
  char** ffi_targets; /* names registered through the FFI extension (ffi.c) */
  int ffi_target_count;
  /* A client across processes (st_runtime_options.kv; put NULL: this
   * process's own). The plugin's key-value callbacks get &kv as their user
   * argument, so it stays put for the client's life. */
  st_runtime_kv kv;

  /* The serialized xla.CompileOptionsProto every compile uses (owned). */
  uint8_t* compile_options;
  size_t compile_options_size;

  /* Counters: atomics because execute/transfer may run on several threads. */
  _Atomic int64_t n_compiles, n_cache_hits, n_cache_misses, n_cache_corrupt;
  _Atomic int64_t n_executions, n_h2d_bytes, n_d2h_bytes, n_live_buffers;
};

struct st_buffer {
  st_runtime* rt;
  pj_buffer* handle; /* kept after consumption: PJRT still needs Destroy */
  st_tensor_type type;
  int device;
  bool consumed;
  char consumed_by[96]; /* program that consumed it, for error messages */
  int memory;           /* index into the device's memory spaces; -1: its default */
};

struct st_event {
  const pj_api* api;
  pj_event* handle; /* NULL: an already-complete event */
  char* context;    /* prefixed to the event's error (owned) */
};

struct st_program {
  st_runtime* rt;
  char* name;
  pj_loaded_exe* exe;
  int input_count; /* -1 when unknown (bytecode without signature) */
  st_tensor_type* inputs;
  bool* donated; /* input_count entries; NULL when unknown */
  int output_count;
  st_tensor_type* outputs; /* NULL when output types are unknown */
  /* SPMD programs (mesh.c): the runtime device of each partition, in the
   * order Execute takes argument lists. 0 / NULL: a portable one-device
   * program. */
  int mesh_device_count;
  int* mesh_devices;   /* [partition] -> runtime device index */
  int* mesh_positions; /* [partition] -> index of its argument list in Execute */
  st_program_memory memory; /* XLA's memory analysis (st_program_memory_stats) */
  bool from_cache;          /* loaded from the executable cache, not compiled */
};

/*--- runtime.c --------------------------------------------------------------*/

/* On a GPU plugin (platform_name other than "cpu"): records the user's
 * xla_gpu_per_fusion_autotune_cache_dir, or with runtime.cache_dir adds
 * <cache_dir>/xla_autotune to the compile options (rt->autotune_dir). A
 * CPU plugin's options are left as they are. */
st_status st__gpu_compile_defaults(st_runtime* rt, const st_runtime_options* options);

/* Registers options->ffi_targets with the plugin (ffi.c). */
st_status st__register_ffi_targets(st_runtime* rt, const st_runtime_options* options);

/* Turns a plugin error into an ST_CODE_RUNTIME status "<context>: <plugin
 * message>" and destroys |error|. Returns ST_OK for a NULL error. */
st_status st__pj_status(const pj_api* api, pj_error* error, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Destroys |error| (NULL is fine) without looking at it. */
void st__pj_error_free(const pj_api* api, pj_error* error);
/* A copy of the plugin's message for |error| (caller frees); "" if none. */
char* st__pj_message(const pj_api* api, const pj_error* error);
void st__pj_event_free(const pj_api* api, pj_event* event);

char* st__sprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/*--- transfer.c -------------------------------------------------------------*/

/* Wraps |handle| (ownership moves in; NULL makes a completed event) with
 * |context_owned| (moved in) as the prefix of its error. On failure the
 * handle is destroyed. */
st_status st__event_make(const pj_api* api, pj_event* handle, char* context_owned, st_event** out);
/* Wraps a plugin buffer (ownership moves in; destroyed on failure). */
st_status st__buffer_wrap(st_runtime* rt, pj_buffer* handle, int device, const st_tensor_type* type, st_buffer** out);

/*--- kv_callbacks.c ---------------------------------------------------------*/

/* PJRT's key-value callbacks, served from the st_runtime_kv their user
 * argument points to. Plugin-facing: they never fail but through
 * *args->callback_error. get: a wait that ran out is DEADLINE_EXCEEDED;
 * try-get: an absent key is NOT_FOUND; a key holding a NUL byte (or a
 * negative timeout) is INVALID_ARGUMENT; a failing store is INTERNAL with
 * its message. A value handed back is the store's malloc'd copy with a
 * deleter that frees it. */
pj_error* st__pjrt_kv_get(pj_kv_get_args* args);
pj_error* st__pjrt_kv_try_get(pj_kv_try_get_args* args);
pj_error* st__pjrt_kv_put(pj_kv_put_args* args);

/*--- dtype.c ----------------------------------------------------------------*/

int st__dtype_to_pj(st_dtype dtype);
st_dtype st__dtype_from_pj(int pj_type);

/*--- mlir_sig.c -------------------------------------------------------------*/

typedef struct st__signature {
  int input_count;
  st_tensor_type* inputs;
  bool* donated;
  int output_count;
  st_tensor_type* outputs;
} st__signature;

/* True when |code| looks like MLIR bytecode (magic "ML\xEFR"). */
bool st__mlir_is_bytecode(const void* code, size_t size);
/* Parses `func.func public @main(...) -> ...` from MLIR text. On success
 * fills |sig| (caller frees with st__signature_free) and returns true;
 * returns false when the text has no parsable main signature. */
bool st__mlir_parse_main(const char* text, size_t size, st__signature* sig);
void st__signature_free(st__signature* sig);

/*--- compile_options.c ------------------------------------------------------*/

/* Builds the serialized xla.CompileOptionsProto for a portable single-device
 * executable with |count| "name=value" overrides (plus the deterministic
 * ones when |deterministic|). Errors name a malformed option. */
st_status st__compile_options_build(const char* const* xla_options, int count, bool deterministic,
                                    uint8_t** out_bytes, size_t* out_size);

/* The compile options of an SPMD program over |device_count| partitions
 * (one replica), partition p on plugin device id |device_ids[p]|, made from
 * |base| (the runtime's single-device options, whose XLA option overrides
 * it keeps). Caller frees *out_bytes. */
st_status st__compile_options_spmd(const uint8_t* base, size_t base_size, const int64_t* device_ids, int device_count,
                                   uint8_t** out_bytes, size_t* out_size);

/*--- program.c --------------------------------------------------------------*/

/* Compiles |code| with the serialized compile |options| (counts the compile). */
st_status st__xla_compile(st_runtime* rt, const char* name, const void* code, size_t code_size,
                          const uint8_t* options, size_t options_size, pj_loaded_exe** out);
/* The executable's output count and, when the plugin has the call, XLA's
 * memory analysis of it (|mem| zeroed with known = false otherwise). */
st_status st__num_outputs(st_runtime* rt, const char* name, pj_loaded_exe* exe, int* out, st_program_memory* mem);
/* Checks one device's input list against the program (count, runtime,
 * consumed, device, aliasing of donated inputs, types when known). */
st_status st__check_inputs(const st_program* p, int device, st_buffer* const* inputs, int input_count);
/* Output |i|'s type as the plugin reports it for buffer |h|. */
st_tensor_type st__output_type(const st_program* p, int i, pj_buffer* h);
/* True when the plugin says |h| was deleted (donated). */
bool st__plugin_deleted(const pj_api* api, pj_buffer* h);

/*--- exe_cache.c ------------------------------------------------------------*/

/* SHA-256 cache key (hex, 65 bytes with NUL) for |code| compiled with the
 * serialized compile |options| under |rt|. */
st_status st__cache_key(const st_runtime* rt, const uint8_t* options, size_t options_size, const void* code,
                        size_t code_size, char out_hex[65]);
/* Looks |key| up. On a hit returns the loaded executable in *out (owned by
 * the caller) and counts the hit. Otherwise sets *out = NULL and counts a
 * miss; a damaged entry (bad header, size, checksum, or refused by the
 * plugin) is also counted as corrupt, reported on stderr and removed. Never
 * fails: a cache problem only costs a compile. */
void st__cache_lookup(st_runtime* rt, const char* key, pj_loaded_exe** out);
/* Serializes |exe| and writes it atomically under |key|. Failures are not
 * fatal to compiling; the status says what went wrong. */
st_status st__cache_store(st_runtime* rt, const char* key, pj_loaded_exe* exe);
/* runtime.keep_optimized_hlo: writes <cache>/<key>.hlo and .hlo.json for
 * program |name| (its StableHLO text |code|) unless they exist. */
st_status st__cache_keep_optimized(st_runtime* rt, const char* key, const char* name, const void* code,
                                   size_t code_size, pj_loaded_exe* exe);

/* Whether to apply the host malloc policy (runtime.c), from the option and
 * the environment: $STRATA_MALLOC_TUNING, $GLIBC_TUNABLES and whether any
 * MALLOC_*_ variable of glibc is set. Pure, for tests. */
bool st__malloc_tuning_wanted(bool option, const char* strata_malloc_tuning, const char* glibc_tunables,
                              bool malloc_env_set);

#endif /* STRATA_RUNTIME_RT_INTERNAL_H */
