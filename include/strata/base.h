/*
 * strata/base.h — small utilities every module uses: allocation, a growable
 * buffer, files written durably, the monotonic clock, hashes, and JSON
 * (jansson) reading and writing. Helpers more than one module needs live
 * here, once.
 *
 * Nothing here keeps global state; everything is reentrant. The one
 * exception is the out-of-memory hook below: one pointer, because malloc's
 * failure is the process's, installed and removed by whoever owns the
 * process's lifecycle (the trainer), as a signal handler is.
 *
 * Out of memory: strata has ONE policy. Every heap allocation in src/ goes
 * through st_xmalloc / st_xcalloc / st_xrealloc / st_xstrdup /
 * st_xstrndup, which print a message and abort() when the allocator fails,
 * as Redis's zmalloc does. So callers never test an allocation for NULL,
 * and none turns a failed allocation into a returned st_status: a
 * half-handled OOM deep in a call chain is worse than a clean end (the
 * ST_CODE_MEMORY statuses come from a prediction, the fit check, and
 * from PJRT's RESOURCE_EXHAUSTED, never from a NULL). The
 * corollary: a reader of untrusted bytes bounds every count and size BEFORE
 * it allocates from them, so a corrupt file is an st_status, never an
 * abort. Memory that third-party libraries allocate (libyaml, PJRT) is
 * checked where they report it, and reported through the same path.
 *
 * The trainer needs its run's final event even then (docs/architecture.md,
 * "Out of memory aborts, in one place"): while an st_oom_hook is installed,
 * the failing call runs the hook once (after freeing the hook's reserve,
 * so that the hook can format and write one event) and then _exit()s with
 * exit code 4 (ST_CODE_MEMORY) instead of aborting.
 */
#ifndef STRATA_BASE_H
#define STRATA_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/status.h"

/* A JSON value: jansson's json_t, opaque here so that no public header
 * carries a third-party type. The code that builds or reads JSON includes
 * <jansson.h> itself (docs/architecture.md, "JSON is jansson"); a json_t*
 * and an st_json* are the same pointer. */
typedef struct json_t st_json;

#ifdef __cplusplus
extern "C" {
#endif

/*===-------------------------------------------------------------------===*/
/* Allocation: never return NULL; abort with a message on out of memory.    */
/*===-------------------------------------------------------------------===*/

/* A size of 0 still returns a unique pointer (free it). All results are
 * owned by the caller (free). */
void* st_xmalloc(size_t n);
void* st_xcalloc(size_t count, size_t size); /* aborts when count*size overflows */
void* st_xrealloc(void* p, size_t n);

/* The process's memory now (docs/performance.md, "Where the memory goes"):
 * resident set from /proc/self/status (0 where unknown), and glibc
 * malloc's own counts (mallinfo2, every arena; malloc_known false
 * elsewhere). free_held_bytes is memory the program freed that the
 * allocator keeps for reuse instead of returning it to the kernel; it is
 * resident where it was touched before. */
typedef struct st_mem_usage {
  int64_t rss, hwm, rss_anon, rss_file; /* VmRSS, VmHWM (the peak so far), RssAnon, RssFile */
  bool malloc_known;
  int64_t heap_bytes;      /* in malloc's arenas (brk heap and arena heaps) */
  int64_t mmap_bytes;      /* in blocks malloc mapped on their own */
  int64_t in_use_bytes;    /* allocated and not freed */
  int64_t free_held_bytes; /* freed, kept by malloc */
} st_mem_usage;
void st_mem_usage_read(st_mem_usage* out);
/* The resident set alone (/proc/self/statm; 0 where unknown): cheap
 * enough for every step, unlike mallinfo2, which walks malloc's bins. */
int64_t st_mem_rss(void);
/* Copies of |s| (its first |n| bytes), NUL-terminated. st_xstrdup(NULL) is "". */
char* st_xstrndup(const char* s, size_t n);
char* st_xstrdup(const char* s);
/* Aborts through the same path: for third-party allocation failures
 * (libyaml's memory error, a PJRT buffer that could not be wrapped). */
_Noreturn void st_oom(const char* what);

/* The out-of-memory hook. |fn| gets |ctx|, the bytes asked for and what
 * asked ("" for st_xmalloc & co, st_oom's |what|); it runs at most once
 * per process, in the thread whose allocation failed, and must not return
 * control anywhere else: when it returns, the process _exit()s with
 * st_code_exit_code(ST_CODE_MEMORY) (4), without atexit handlers or stdio
 * flushes (other threads may be mid-allocation). Another thread whose
 * allocation fails meanwhile waits for that exit; an allocation failure
 * inside the hook itself aborts. Before |fn| runs, the hook's reserve
 * (ST_OOM_RESERVE_BYTES, allocated by st_oom_hook_install) is freed, so
 * |fn| may allocate a little (format a status, write a JSON line).
 *
 * Install and remove in one thread, in nesting order (install returns with
 * the previous hook saved in |hook|, remove puts it back); |hook| is the
 * caller's and must outlive the installation. */
typedef void (*st_oom_fn)(void* ctx, size_t bytes, const char* what);
typedef struct st_oom_hook {
  st_oom_fn fn;
  void* ctx;
  void* reserve;              /* owned while installed */
  struct st_oom_hook* previous;
  bool installed;
} st_oom_hook;
#define ST_OOM_RESERVE_BYTES ((size_t)4 << 20)
void st_oom_hook_install(st_oom_hook* hook, st_oom_fn fn, void* ctx);
void st_oom_hook_remove(st_oom_hook* hook);

/* The host's memory as the kernel reports it (/proc/meminfo, Linux):
 * MemTotal and MemAvailable, each lowered to the limit of this process's
 * cgroup (v2: memory.max, less memory.current for the available part)
 * where one is set. known is false where /proc/meminfo is unreadable. */
typedef struct st_host_memory {
  bool known;
  int64_t total_bytes, available_bytes;
  int64_t meminfo_available_bytes; /* MemAvailable as read, before the cgroup */
  bool cgroup_limited;             /* a cgroup limit lowered one of the two */
} st_host_memory;
void st_host_memory_read(st_host_memory* out);

/*===-------------------------------------------------------------------===*/
/* st_strbuf: THE growable buffer (text or bytes), always NUL-terminated    */
/*===-------------------------------------------------------------------===*/

typedef struct st_strbuf {
  char* data; /* owned; NULL until the first append */
  size_t len;
  size_t cap;
} st_strbuf;

void st_strbuf_append(st_strbuf* b, const char* s);
void st_strbuf_append_n(st_strbuf* b, const char* s, size_t n);
void st_strbuf_printf(st_strbuf* b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
const char* st_strbuf_cstr(const st_strbuf* b); /* "" when empty */
/* Takes the bytes out (owned by the caller, free; never NULL) and leaves |b| empty. */
char* st_strbuf_take(st_strbuf* b);
void st_strbuf_reset(st_strbuf* b);              /* keeps capacity */
/* |word| as one POSIX shell word: as is when it holds only characters no
 * shell treats specially, else in single quotes. For commands strata prints
 * for a person to paste (`strata resume DIR`, a supervisor's child command). */
void st_strbuf_append_shell(st_strbuf* b, const char* word);
char* st_shell_quote(const char* word); /* the same, owned by the caller (free) */
void st_strbuf_free(st_strbuf* b);

/* THE float formatter: the fewest %g digits that read back to exactly |x|
 * ("0.1", "1e-8", "3"), "nan"/"inf"/"-inf" when not finite. Callers that
 * want a display form (config's "10.0") adjust its output. */
enum { ST_DOUBLE_CHARS = 40 };
void st_format_double(double x, char out[ST_DOUBLE_CHARS]);

/*===-------------------------------------------------------------------===*/
/* Files                                                                    */
/*===-------------------------------------------------------------------===*/

/* Reads a whole file. *out_data is NUL-terminated (not counted in size) and
 * owned by the caller (free). Errors are ST_CODE_IO naming |path|. */
st_status st_fs_read_file(const char* path, char** out_data, size_t* out_size);
/* Writes |path| durably: temp file in the same folder, fsync, rename, fsync
 * of the folder. Either the old or the new content survives a crash. */
st_status st_fs_write_atomic(const char* path, const void* data, size_t size);
/* st_fs_write_atomic of |count| pieces written one after the other (a
 * header and a payload, without copying them into one buffer). */
typedef struct st_fs_piece {
  const void* data;
  size_t size;
} st_fs_piece;
st_status st_fs_write_atomic_pieces(const char* path, const st_fs_piece* pieces, int count);
/* Writes all |size| bytes to |fd|, across short writes and EINTR. Errors
 * are ST_CODE_IO naming |path| (the file |fd| is open on). */
st_status st_fs_write_all(int fd, const void* data, size_t size, const char* path);
/* mkdir -p. */
st_status st_fs_mkdirs(const char* path);
bool st_fs_exists(const char* path);
bool st_fs_is_dir(const char* path);
/* An exclusive advisory lock (flock) on |path|, created if missing, without
 * waiting. On success *out_fd (owned by caller: close it to release) holds
 * the lock and the file holds this process's pid. The kernel releases the
 * lock when the process exits, however it exits (SIGKILL included), so a
 * crashed holder never leaves a stale lock. When another process holds it:
 * *out_fd = -1, *out_holder = its pid (0 if unknown) and ST_OK. When the
 * filesystem has no flock (some network filesystems): *out_fd = -1,
 * *out_holder = -1 and ST_OK; the caller decides whether to go on unlocked. */
st_status st_fs_lock(const char* path, int* out_fd, long* out_holder);
/* Who holds the st_fs_lock lock on |path|, without taking it and without
 * writing anything: *out_holder = 0 when nobody does (or |path| is
 * missing), the holder's pid (0 if the file names none: then -2) when a
 * live process does, -1 when the filesystem has no flock. It probes with a
 * shared lock released at once, so an st_fs_lock racing the probe can see
 * it as a holder for that instant. */
st_status st_fs_lock_probe(const char* path, long* out_holder);
/* A lock a parent process took with st_fs_lock and handed to this child as
 * an inherited descriptor, whose number is in $STRATA_RUN_LOCK_FD (see
 * st_fs_lock_hand_down). Returns that descriptor (owned by caller, now
 * close-on-exec) when it is open on |path|'s file and holds the lock;
 * otherwise -1, and the caller locks for itself. */
int st_fs_lock_inherited(const char* path);
/* In a forked child before exec: lets |fd| (from st_fs_lock) survive the
 * exec and names it in $STRATA_RUN_LOCK_FD. Parent and child then share one
 * open file description, so one flock covers both: the lock stays held
 * across the child's death and the parent's restart of it. */
void st_fs_lock_hand_down(int fd);
/* Whether the lock's |holder| (a pid from st_fs_lock) is the process that
 * handed it down (its pid is in $STRATA_RUN_LOCK_PID, set by
 * st_fs_lock_hand_down) and an ancestor of this one: a rank of a job that
 * `strata run` launched through mpirun, which closes inherited descriptors
 * (docs/multiprocess.md, "Failures"). The lock is then held for it. */
bool st_fs_lock_held_by_ancestor(long holder);
/* rm -rf; missing is fine. */
st_status st_fs_remove_tree(const char* path);
/* The strata repository (python/, configs/, .venv/): $STRATA_SOURCE_DIR
 * when set and not empty, else the path the build was configured in. A
 * binary carried to another machine or moved tree sets the variable. Never
 * NULL; "" when neither is known. */
const char* st_source_dir(void);
/* The Python that runs strata_jax at preparation time (the exporter, the
 * BPE tokenizer): $STRATA_PYTHON, else ./.venv/bin/python when executable,
 * else <st_source_dir()>/.venv/bin/python. Caller frees. */
char* st_python_path(void);
/* One run of `<st_python_path()> -m <module> <args...>` (python.c). */
typedef struct st_python_job {
  const char* what;               /* "exporting the bundle": the failure's first words */
  const char* module;             /* "strata_jax.export" */
  const char* const* args;        /* after the module, NULL-terminated; borrowed */
  const char* log_path;           /* the child's stdout and stderr */
  int code;                       /* the st_status code of a failure */
  int code_on_exit2;              /* the code when the child exits 2 (its config error); 0: |code| */
  const char* jax_platforms;      /* JAX_PLATFORMS for the child; NULL: inherited */
  /* Polled while the child runs (NULL: never): a non-zero signal number
   * (a stop signal strata received, st_stop_signal) ends the child with
   * SIGTERM, then SIGKILL after 5 s, and the job with ST_CODE_INTERRUPTED.
   * A stop during a minute-long export is acted on at once, not after it. */
  int (*stop_signal)(void);
} st_python_job;
/* Runs |job| with the source tree's python/ first on PYTHONPATH and waits.
 * File descriptors not marked close-on-exec are inherited (the exporter's
 * progress descriptor). OK when the child exits 0; otherwise an error
 * naming the interpreter, the module, the exit or signal, the log and the
 * log's last 1500 bytes. */
st_status st_python_run(const st_python_job* job);
/* Joins two path parts into a new string owned by the caller (free). */
char* st_path_join(const char* a, const char* b);
/* Default cache root: $STRATA_CACHE_DIR, else $HOME/.cache/strata, else
 * ./.strata-cache. Returns a new string owned by the caller. */
char* st_cache_root(const char* configured /* runtime.cache_dir, may be NULL/"" */);

/*===-------------------------------------------------------------------===*/
/* Time                                                                     */
/*===-------------------------------------------------------------------===*/

/* Seconds on the monotonic clock: for durations, never for dates. */
double st_now(void);

/*===-------------------------------------------------------------------===*/
/* Progress of long operations                                              */
/*===-------------------------------------------------------------------===*/

/* Whether a long operation shows its progress (docs/using.md, "Progress of
 * long operations"): progress is on, and |size| (bytes) is at least
 * |min_size|. Callers pass what run.progress resolved to; nothing here
 * looks at the terminal. */
typedef struct st_progress_options {
  bool on;          /* run.progress: on, or auto on a terminal */
  int64_t min_size; /* run.progress_min_bytes: smaller operations stay quiet */
} st_progress_options;
bool st_progress_wanted(const st_progress_options* options, int64_t size);

/* One long operation's line on stderr, "<what>: <done>/<total> <unit>",
 * redrawn in place ('\r') and ended when done reaches total. |unit| "MiB"
 * shows byte counts in MiB (KiB when the total is below one MiB). Redraws once per percent: a forced display
 * into a log stays about a hundred updates long. Not thread-safe: one
 * thread draws (or the caller serialises). */
typedef struct st_progress_line {
  const char* what;
  const char* unit;
  int64_t total;
  int shown;  /* percent last drawn, -1 before the first */
  bool ended;
} st_progress_line;
void st_progress_line_start(st_progress_line* line, const char* what, const char* unit, int64_t total);
void st_progress_line_update(st_progress_line* line, int64_t done);

/*===-------------------------------------------------------------------===*/
/* Hashes                                                                   */
/*===-------------------------------------------------------------------===*/

void st_sha256_hex(const void* data, size_t size, char out[65]);
/* SHA-256 of a file; ST_CODE_IO naming |path| on failure. */
st_status st_sha256_file_hex(const char* path, char out[65]);
uint64_t st_hash64(const void* data, size_t size, uint64_t seed); /* XXH64 */

/*===-------------------------------------------------------------------===*/
/* JSON writing: jansson's json_t (st_json), through these helpers           */
/*===-------------------------------------------------------------------===*/

/* Every JSON document strata writes is a jansson tree dumped by
 * st_json_dump (docs/architecture.md, "JSON is jansson"), never printf
 * fragments, so it is valid JSON for any string a user can give (quotes,
 * backslashes, control bytes, non-ASCII; bytes that are not UTF-8 become
 * U+FFFD). The builders never return NULL (out of memory aborts). "Steals"
 * means the call takes the caller's reference, like jansson's *_new calls:
 * st_json_put(o, "k", st_json_int(3)) leaks nothing. */
st_json* st_json_str(const char* s); /* NULL is "" */
st_json* st_json_strn(const char* s, size_t n);
st_json* st_json_num(double v);                 /* non-finite (a NaN loss) is null */
st_json* st_json_fixed(double v, int decimals); /* rounded like %.<decimals>f: times, rates */
st_json* st_json_int(int64_t v);
st_json* st_json_bool(bool v);
st_json* st_json_obj(void);
st_json* st_json_arr(void);
void st_json_put(st_json* obj, const char* key, st_json* value); /* steals |value|; the last put of a key wins */
void st_json_put_str(st_json* obj, const char* key, const char* s);
void st_json_put_int(st_json* obj, const char* key, int64_t v);
void st_json_put_num(st_json* obj, const char* key, double v);
void st_json_put_bool(st_json* obj, const char* key, bool v);
void st_json_push(st_json* arr, st_json* value); /* steals |value| */
/* Appends |other|'s members to |obj| in order; steals |other| (NULL is a no-op). */
void st_json_merge(st_json* obj, st_json* other);
/* The text of |v|: one line ({"a": 1, "b": [2, 3]}) when |indent| is 0,
 * else |indent| spaces per level; keys in insertion order; every real
 * reads back to the same double. New string owned by the caller (free). */
char* st_json_dump(const st_json* v, int indent);
/* st_json_dump plus a newline, written with st_fs_write_atomic. */
st_status st_json_write_file(const char* path, const st_json* v, int indent);
/* Whether |s| (|n| bytes) is well-formed UTF-8 (no overlong forms or surrogates). */
bool st_utf8_valid(const char* s, size_t n);

/*===-------------------------------------------------------------------===*/
/* JSON reading: jansson, bounded                                            */
/*===-------------------------------------------------------------------===*/

enum { ST_JSON_MAX_DEPTH = 64 }; /* nesting of arrays and objects */

/* Parses |size| bytes as one JSON document (any value at the top). Rejects
 * what jansson rejects (invalid JSON or UTF-8) and also \u0000 in strings,
 * a key given twice in one object, nesting deeper than ST_JSON_MAX_DEPTH,
 * and integers outside int64. Errors are ST_CODE_RUNTIME
 * "<origin>:<line>:<column>: invalid JSON: <what>". The tree is a new
 * reference owned by the caller (json_decref). The caller bounds |size|. */
st_status st_json_parse(const char* text, size_t size, const char* origin, st_json** out_json);
/* |v| as an integer: a JSON integer, or a real with an integral value below
 * 2^53 (what a writer that has only doubles, e.g. Python's json for
 * float-typed fields, may write). */
bool st_json_as_int(const st_json* v, int64_t* out);
/* Typed members of an object (|obj| may be NULL or not an object); they
 * fail with ST_CODE_RUNTIME naming |origin| and |key|. Results are borrowed
 * from |obj|. */
st_status st_json_get_int(const st_json* obj, const char* key, const char* origin, int64_t* out);
st_status st_json_get_string(const st_json* obj, const char* key, const char* origin, const char** out);
st_status st_json_get_array(const st_json* obj, const char* key, const char* origin, const st_json** out);
/* Equal values, numbers compared by value (1 == 1.0, unlike json_equal). */
bool st_json_same(const st_json* a, const st_json* b);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_BASE_H */
