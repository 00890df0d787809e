/*
 * strata/runtime.h — strata's only door to XLA: a PJRT plugin loaded with
 * dlopen, driven through strata's own declarations of the PJRT C ABI
 * (src/runtime/pjrt_abi.h; upstream's header is not copied).
 *
 * Objects and lifetimes
 *   st_runtime   one plugin + one client. Created by st_runtime_create,
 *                destroyed by st_runtime_destroy after every program, buffer
 *                and event made from it. The plugin is never dlclosed.
 *   st_program   a compiled (or cache-loaded) executable plus its signature.
 *   st_buffer    a device buffer with dtype and dims. A buffer passed as a
 *                *donated* input to st_program_execute is consumed: it stays
 *                a valid handle (destroy it as usual) but holds no data, and
 *                any later use is an error naming it.
 *   st_event     completion of an asynchronous transfer or execution.
 *
 * Every function that can fail returns st_status (ST_CODE_RUNTIME for
 * plugin/compile/execute errors) carrying strata's context (program name,
 * input index) and the plugin's own message.
 *
 * Thread-safety: an st_runtime may be used from several threads for
 * execute/transfer/await; create/destroy are thread-compatible. Event
 * callbacks may run on a plugin thread.
 */
#ifndef STRATA_RUNTIME_H
#define STRATA_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/status.h"
#include "strata/tensor.h" /* st_dtype, st_tensor_type */

#ifdef __cplusplus
extern "C" {
#endif

/*===-------------------------------------------------------------------===*/
/* Runtime                                                                  */
/*===-------------------------------------------------------------------===*/

/* A C function the plugin calls for `stablehlo.custom_call @name` (XLA FFI's
 * typed calling convention, XLA_FFI_Error* fn(XLA_FFI_CallFrame*); the
 * kernels module's handlers, docs/kernels.md). */
typedef struct st_ffi_target {
  const char* name; /* the custom call's target name */
  void* handler;    /* the handler function, cast to void* */
} st_ffi_target;

/* A key-value store shared by the processes of a job, for a plugin whose
 * client spans them (a GPU plugin exchanges its devices and NCCL ids
 * through it while PJRT_Client_Create runs, and later when it forms
 * communicators; docs/multiprocess.md, "One PJRT client across
 * processes"). The runtime serves the plugin's key-value callbacks from
 * these functions; it knows nothing of who holds the store (the trainer
 * passes dist's, st_dist_runtime_kv). Each may be called from any thread,
 * at any time while a runtime created with them lives: |user| must outlive
 * the runtime. Keys are NUL-terminated strings; values are bytes. */
typedef struct st_runtime_kv {
  /* Stores a copy of |size| bytes under |key|; a second put replaces it. */
  st_status (*put)(void* user, const char* key, const void* value, size_t size);
  /* Waits until some process has put |key|, up to |timeout_ms| (>= 0):
   * OK with *found true and *value (malloc'd: the runtime frees it with
   * free; NUL-terminated after *size bytes) or, when the wait ran out, OK
   * with *found false. A status only for a failure of the store itself. */
  st_status (*get)(void* user, const char* key, int64_t timeout_ms, bool* found, void** value, size_t* size);
  /* Looks once; the same outputs as get. */
  st_status (*try_get)(void* user, const char* key, bool* found, void** value, size_t* size);
  void* user;
  int node_id;   /* this process, 0 .. num_nodes-1: the plugin's node_id option */
  int num_nodes; /* processes sharing the client: the plugin's num_nodes option */
} st_runtime_kv;

typedef struct st_runtime_options {
  /* Plugin path from config (runtime.plugin); NULL or "" to search:
   * then $STRATA_PJRT_PLUGIN, then the CPU plugin installed in .venv. */
  const char* plugin_path;
  int cpu_devices;    /* runtime.cpu_devices; only passed to CPU plugins */
  bool deterministic; /* runtime.deterministic: bitwise-repeatable execution */
  /* runtime.xla_options: "name=value" strings passed as per-compile option
   * overrides (env_option_overrides). Borrowed for the create call only. */
  const char* const* xla_options;
  int xla_option_count;
  /* Executable cache folder; NULL or "" disables the cache. */
  const char* cache_dir;
  /* Host allocator policy for XLA's CPU buffers (docs/runtime.md, "Host
   * allocator"): glibc keeps freed blocks for reuse instead of unmapping
   * them, so a program's buffers are not page-faulted in again on every
   * launch. Process-wide, applied once, at the first plugin load; skipped
   * when $STRATA_MALLOC_TUNING=0 or the environment already sets glibc's
   * malloc tunables (GLIBC_TUNABLES=glibc.malloc.*, MALLOC_*_). */
  bool tune_host_malloc;
  /* runtime.compile_threads: programs st_program_compile_files compiles at
   * once; 0 means one per two online CPUs (XLA's CPU compiler already uses
   * about 1.5 cores per program). */
  int compile_threads;
  /* "compile: k/n programs" on stderr while st_program_compile_files works
   * (run.progress; docs/using.md, "Progress of long operations"). */
  bool progress;
  /* runtime.keep_optimized_hlo: beside each executable cache entry
   * <key>.xexe it compiles, keep XLA's optimized program (<key>.hlo, as
   * the plugin returns it, and <key>.hlo.json naming the program, the
   * sha256 of its StableHLO text and the format) for `strata analyze`.
   * Needs the cache. */
  bool keep_optimized_hlo;
  /* FFI handlers registered with the plugin (through its PJRT FFI
   * extension, platform "Host") before the client exists, so before any
   * compile. Borrowed for the create call only; the handlers themselves
   * must live for the process (the plugin keeps them in a process-wide
   * registry and is never unloaded). A plugin without the extension is an
   * error when any are given. */
  const st_ffi_target* ffi_targets;
  int ffi_target_count;
  /* One client across the processes of a job: when kv.put is set (then
   * get and try_get must be too), PJRT_Client_Create gets the named
   * options node_id and num_nodes and key-value callbacks served from
   * these functions (copied; kv.user is borrowed for the runtime's life).
   * Zeroed (the default): a client of this process alone, as always. The
   * CPU plugin refuses node_id: the caller decides (the trainer: on for a
   * job's GPU or TPU plugin, runtime.shared_client). */
  st_runtime_kv kv;
} st_runtime_options;

/* Whether this process runs with the host malloc policy
 * (st_runtime_options.tune_host_malloc, applied at the first plugin load). */
bool st_runtime_malloc_tuned(void);

/* Gives the memory malloc holds freed back to the kernel (malloc_trim):
 * for the end of a phase that will not come again soon (init, a
 * checkpoint), whose freed blocks the policy above would otherwise keep for
 * the rest of the run. The next step faults its own buffers in once more. */
void st_runtime_release_host_memory(void);

/* Defaults: search for the plugin, 2 CPU devices, not deterministic, no
 * XLA options, no cache, host malloc tuning on, compile threads automatic. */
void st_runtime_options_init(st_runtime_options* options);

typedef struct st_runtime st_runtime;

/* The PJRT platform the plugin |options| would load is expected to serve,
 * without loading it (no client: commands that resolve kernels.<op>=auto
 * before a runtime exists; docs/kernels.md, "Selection"). A plugin found by
 * the .venv search is one of the CPU wheels strata knows: "cpu". An
 * explicit runtime.plugin / $STRATA_PJRT_PLUGIN is judged by its file name:
 * "cpu", "cuda", "rocm", "gpu" or "tpu" when the name says so, else
 * "unknown". No plugin found: "cpu" (what the search looks for; the
 * runtime's own error comes when one is created). |basis| gets a sentence
 * saying what the guess rests on. The runtime's platform_name is the truth
 * once it exists: callers check their guess against it. */
void st_runtime_guess_platform(const st_runtime_options* options, char* platform, size_t platform_size, char* basis,
                               size_t basis_size);

st_status st_runtime_create(const st_runtime_options* options, st_runtime** out_runtime /* owned by caller */);

/* The FFI targets registered at creation: count, and the i-th name (owned by
 * the runtime). The plugin drops registration errors silently, so a name
 * here is what strata asked for; a compile of a module calling it is what
 * proves the plugin has it (tests/c/test_kernels.c). */
int st_runtime_ffi_target_count(const st_runtime* rt);
const char* st_runtime_ffi_target_name(const st_runtime* rt, int i);
void st_runtime_destroy(st_runtime* runtime); /* NULL is a no-op */

/* Facts for `strata doctor`, context.json and cache keys. All strings are
 * owned by the runtime and live as long as it. */
typedef struct st_runtime_info {
  const char* plugin_path;
  const char* platform_name;    /* "cpu", "cuda", ... */
  const char* platform_version;
  const char* xla_version;      /* plugin attribute, "" when absent */
  int api_major, api_minor;     /* the plugin's PJRT C API version */
  int device_count;             /* addressable devices */
  /* A GPU plugin with runtime.cache_dir: XLA's per-fusion autotuning cache
   * (<cache_dir>/xla_autotune, or the user's xla_gpu_per_fusion_autotune_cache_dir);
   * "" otherwise. */
  const char* autotune_cache_dir;
} st_runtime_info;
void st_runtime_get_info(const st_runtime* runtime, st_runtime_info* out_info);

/* Description of device |device| ("TFRT_CPU_0"-like kind + id) and its
 * memory spaces' kinds ("device", "pinned_host", ...). Strings owned by the
 * runtime. */
typedef struct st_device_info {
  int id;
  const char* kind;
  const char* description;
  int memory_count;
  const char* memory_kinds[8];
  int default_memory; /* index into memory_kinds */
} st_device_info;
st_status st_runtime_device_info(const st_runtime* runtime, int device, st_device_info* out_info);

/* The bytes a program can allocate on device |device|, as the plugin
 * reports them (PJRT_Device_MemoryStats' bytes_limit); 0 when the plugin
 * does not report it (the CPU plugin) or |device| does not exist. */
int64_t st_runtime_device_memory(const st_runtime* runtime, int device);

/* Whether the devices' memory is this process's host memory (the CPU
 * plugin: every device buffer is host RAM, shared by all its devices and
 * with everything else on the host). NULL: false. */
bool st_runtime_device_memory_is_host(const st_runtime* runtime);

/* Counters, for tests and metrics. Monotonic over the runtime's life. */
typedef struct st_runtime_stats {
  int64_t compiles;        /* programs compiled by XLA */
  int64_t cache_hits;      /* programs loaded from the executable cache */
  int64_t cache_misses;    /* lookups that found nothing usable */
  int64_t cache_corrupt;   /* entries found damaged, discarded, recompiled */
  int64_t executions;
  int64_t h2d_bytes, d2h_bytes;
  int64_t live_buffers;    /* st_buffers not yet destroyed */
} st_runtime_stats;
void st_runtime_get_stats(const st_runtime* runtime, st_runtime_stats* out_stats);

/*===-------------------------------------------------------------------===*/
/* Events                                                                   */
/*===-------------------------------------------------------------------===*/

typedef struct st_event st_event;

/* Blocks until the event completes; returns the operation's error if any.
 * May be called more than once. */
st_status st_event_await(st_event* event);
bool st_event_is_ready(st_event* event);
/* Calls |fn(status, user)| once when the event completes (possibly at once,
 * possibly on a plugin thread). |fn| owns |status|. */
typedef void (*st_event_fn)(st_status status, void* user);
st_status st_event_on_ready(st_event* event, st_event_fn fn, void* user);
void st_event_destroy(st_event* event); /* NULL is a no-op; does not wait */

/*===-------------------------------------------------------------------===*/
/* Buffers                                                                  */
/*===-------------------------------------------------------------------===*/

typedef struct st_buffer st_buffer;

/* Copies |data| (dense, row-major, st_tensor_type_bytes(type) bytes) to
 * device |device|. The copy of |data| is taken during the call, so |data|
 * may be reused at once; the device side may still be in flight, which
 * later executions order after automatically. */
st_status st_buffer_from_host(st_runtime* runtime, int device, const st_tensor_type* type, const void* data,
                              st_buffer** out_buffer /* owned by caller */);

/* Starts a device->host copy into |dst| (|dst_size| must be the buffer's
 * byte size). |dst| must stay alive until *out_event completes. */
st_status st_buffer_to_host_async(st_buffer* buffer, void* dst, size_t dst_size,
                                  st_event** out_event /* owned by caller */);
/* Synchronous convenience: copy and wait. */
st_status st_buffer_to_host(st_buffer* buffer, void* dst, size_t dst_size);

const st_tensor_type* st_buffer_type(const st_buffer* buffer);
size_t st_buffer_bytes(const st_buffer* buffer);
int st_buffer_device(const st_buffer* buffer);
bool st_buffer_is_consumed(const st_buffer* buffer); /* donated away */
/* Event that fires when the buffer's contents are ready (its producer done). */
st_status st_buffer_ready_event(st_buffer* buffer, st_event** out_event /* owned by caller */);
void st_buffer_destroy(st_buffer* buffer); /* NULL is a no-op; frees device memory */

/* Memory spaces (st_device_info.memory_kinds). A buffer lives in one memory
 * space of its device: the default one ("device") unless copied elsewhere.
 * st_buffer_copy_to_memory copies |buffer| into memory space |memory_kind|
 * of the same device (PJRT_Buffer_CopyToMemory) and returns the copy
 * without waiting: later executions and copies order after it, and its
 * ready event says when it is done. |buffer| is left as it was. Errors name
 * the memory space when the device lacks it or the plugin lacks the call.
 * Programs run on buffers in the default memory; a buffer in a host memory
 * space is for keeping data between uses (see docs/scheduling.md). */
st_status st_buffer_copy_to_memory(st_buffer* buffer, const char* memory_kind, st_buffer** out_buffer /* owned by caller */);
const char* st_buffer_memory_kind(const st_buffer* buffer); /* "device", "pinned_host", ...; "" for NULL */
/* True when |device| has memory space |memory_kind| and the plugin can copy into it. */
bool st_runtime_can_copy_to_memory(const st_runtime* runtime, int device, const char* memory_kind);

/* Copies |buffer| to another device of the same runtime
 * (PJRT_Buffer_CopyToDevice), into that device's default memory, and
 * returns the copy without waiting: PJRT orders the copy after |buffer|'s
 * producer and later executions on |device| after the copy; its ready
 * event says when it is done. |buffer| is left as it was, still owned by
 * the caller, who may destroy it at once (the plugin keeps what the copy
 * reads alive until it is done). Errors: a consumed buffer, a device that
 * does not exist or is the buffer's own, a buffer outside its device's
 * default memory, a plugin that lacks the call. Pipeline stages' SEND ops. */
st_status st_buffer_copy_to_device(st_buffer* buffer, int device, st_buffer** out_buffer /* owned by caller */);

/*===-------------------------------------------------------------------===*/
/* Programs                                                                 */
/*===-------------------------------------------------------------------===*/

typedef struct st_program st_program;

/* What the caller knows of a program's interface. When |inputs| is NULL the
 * runtime parses the signature of `func.func public @main` from text MLIR
 * (bytecode programs without a signature are executed unchecked). */
typedef struct st_program_signature {
  int input_count;
  const st_tensor_type* inputs;
  int output_count;
  const st_tensor_type* outputs;
} st_program_signature;

/* Compiles |code| (StableHLO as MLIR text or bytecode, |code_size| bytes)
 * for single-device execution, through the executable cache when enabled.
 * |name| names the program in errors (e.g. "block_fwd" or a file path).
 * |signature| may be NULL. */
st_status st_program_compile(st_runtime* runtime, const char* name, const void* code, size_t code_size,
                             const st_program_signature* signature, st_program** out_program /* owned by caller */);
/* Reads |path| and compiles it; errors name the file. */
st_status st_program_compile_file(st_runtime* runtime, const char* path, const st_program_signature* signature,
                                  st_program** out_program /* owned by caller */);
void st_program_destroy(st_program* program); /* NULL is a no-op */

/* One program of a batch compile. */
typedef struct st_program_compile_job {
  const char* path;                      /* borrowed: the StableHLO file */
  const st_program_signature* signature; /* borrowed; may be NULL */
  st_program* program;                   /* out: owned by caller */
  double seconds;                        /* out: wall time of this job's compile or cache load */
} st_program_compile_job;

/* Compiles every job's file (as st_program_compile_file), several at once:
 * up to st_runtime_compile_threads threads, each compiling one program at a
 * time, the largest files first (a cold start compiles ~17 programs). All or nothing: on failure
 * every job's |program| is NULL and the status is the failure of the first
 * failing job in |jobs| order, so the error does not depend on timing. */
st_status st_program_compile_files(st_runtime* runtime, st_program_compile_job* jobs, int count);
/* The number of compile threads runtime.compile_threads resolves to (≥ 1). */
int st_runtime_compile_threads(const st_runtime* runtime);

const char* st_program_name(const st_program* program);
int st_program_input_count(const st_program* program);   /* -1 when unknown */
int st_program_output_count(const st_program* program);
/* Type of input/output |i|, NULL when unknown. */
const st_tensor_type* st_program_input_type(const st_program* program, int i);
const st_tensor_type* st_program_output_type(const st_program* program, int i);
/* True when the program donates input |i| (aliases it to an output). */
bool st_program_input_donated(const st_program* program, int i);

/* XLA's memory analysis of a compiled program
 * (PJRT_Executable_GetCompiledMemoryStats), per device it runs on: besides
 * the buffers its caller passes and receives, a launch allocates
 * |temp_bytes| of temporaries for as long as it runs. |known| is false when
 * the plugin lacks the call or refuses it (every count is then 0). */
typedef struct st_program_memory {
  bool known;
  int64_t temp_bytes;     /* XLA's temporaries while it runs */
  int64_t argument_bytes; /* its inputs */
  int64_t output_bytes;   /* its outputs */
  int64_t alias_bytes;    /* inputs reused as outputs (donated) */
  int64_t code_bytes;     /* generated code */
  int64_t host_temp_bytes; /* temporaries in host memory spaces */
} st_program_memory;
/* Copies |program|'s analysis into |out| (read once, when it was compiled
 * or loaded from the cache). */
void st_program_memory_stats(const st_program* program, st_program_memory* out);
/* Whether |program| was loaded from the executable cache (runtime.cache_dir)
 * rather than compiled by XLA. */
bool st_program_from_cache(const st_program* program);

/* Runs |program| on |device|. Inputs are checked (count, dtype, dims,
 * consumed) before launch; a mismatch names the input index, expected and
 * given. Donated inputs are consumed. |outputs| (array of
 * st_program_output_count entries) receives new buffers owned by the
 * caller. |out_done|, when not NULL, receives an event that completes when
 * the execution does; execution errors surface there or from awaiting any
 * output. Returns without waiting for the device. */
st_status st_program_execute(st_program* program, int device, st_buffer* const* inputs, int input_count,
                             st_buffer** outputs, int output_count, st_event** out_done /* owned by caller */);

/*===-------------------------------------------------------------------===*/
/* Matmul peak (strata doctor; the end-of-run summary's share of it)        */
/*===-------------------------------------------------------------------===*/

/* The rate of a square f32 matmul on device 0: what `strata doctor`
 * prints and what the end-of-run summary compares model FLOP/s with. */
typedef struct st_matmul_peak {
  int n;                /* the matmul is [n,n] x [n,n]: 2 n^3 FLOP */
  int runs;             /* timed runs */
  double median_gflops; /* the median run's rate */
  double best_gflops;   /* the fastest run's: the peak */
  char by[16];          /* the command that measured it: "doctor", "train" */
  /* Memory bandwidth (st_runtime_bandwidth_measure; 0 when not measured):
   * an elementwise add over |bw_bytes| bytes moved per run (two reads and
   * one write of a 32 MiB f32 tensor). */
  int64_t bw_bytes;
  int bw_runs;
  double median_gbps, best_gbps; /* 1e9 bytes per second */
} st_matmul_peak;

/* Compiles the matmul, checks a warm-up run's result (exact in f32), then
 * times up to 200 runs or about |max_seconds| on device 0, each from
 * launch to completion (no host copies). ST_CODE_RUNTIME on a wrong
 * result. |out->by| is left empty. */
st_status st_runtime_matmul_measure(st_runtime* runtime, double max_seconds, st_matmul_peak* out);
/* The memory side of the roofline: compiles c = a + b over 8M f32
 * elements, checks a warm-up run (exact), then times up to 200 runs or
 * about |max_seconds| on device 0; fills |out|'s bw_* and *_gbps fields
 * only (the matmul ones are left as they are). ST_CODE_RUNTIME on a wrong
 * result. */
st_status st_runtime_bandwidth_measure(st_runtime* runtime, double max_seconds, st_matmul_peak* out);

/* The stored measurement for this runtime's plugin and device 0's kind:
 * <cache_root>/matmul_peak/<key>.json, keyed by both. Returns false when
 * there is none or it is unreadable or implausible (a cache, never an
 * error: the caller measures again). */
bool st_runtime_matmul_peak_load(const st_runtime* runtime, const char* cache_root, st_matmul_peak* out);
/* Writes |peak| there (atomically), replacing an earlier one. */
st_status st_runtime_matmul_peak_store(const st_runtime* runtime, const char* cache_root, const st_matmul_peak* peak);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_RUNTIME_H */
