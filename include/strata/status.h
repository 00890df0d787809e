/*
 * strata/status.h — the one error model of strata.
 *
 * Every call that can fail returns an st_status. ST_OK is NULL, so the happy
 * path costs nothing and `if (s) ...` reads naturally. A non-OK status owns a
 * heap message; whoever receives it either returns it upward (optionally
 * adding context with st_status_annotate) or frees it with st_status_free.
 *
 * The code is the *class* of failure, chosen so that cli/ can map it to the
 * documented exit codes (docs/design.md §4) without parsing messages:
 *
 *   ST_CODE_CONFIG   usage or configuration error (bad key, value, argument)  exit 2
 *   ST_CODE_DATA     corpus / token file / batch problems                      exit 3
 *   ST_CODE_RUNTIME  plugin, compile, execute, bundle or device errors         exit 4
 *   ST_CODE_MEMORY   out of memory, a runtime-class failure with its own class:
 *                    the step is predicted not to fit the device's memory (on
 *                    the CPU plugin the host's), an allocation failed on the
 *                    host (the st_xmalloc hook, strata/base.h) or PJRT said
 *                    RESOURCE_EXHAUSTED. `strata run` does not restart it
 *                    (the failed event's "class" is "memory")                exit 4
 *   ST_CODE_NUMERICS non-finite loss or gradients                              exit 5
 *   ST_CODE_HANG     a watchdog deadline passed                                exit 6
 *   ST_CODE_CKPT     checkpoint write, read or verification failure            exit 7
 *   ST_CODE_IO       other file-system failures (errno is in the message):
 *                    a full disk or a read-only run directory              exit 9
 *   ST_CODE_INTERNAL a broken invariant inside strata (a bug)                  exit 1
 *   ST_CODE_INTERRUPTED  stopped by SIGTERM, SIGINT or SIGHUP after the step in
 *                    progress, with a checkpoint written (strata resume goes on) exit 8
 *
 * Thread-safety: a status is a plain value; do not share one between threads.
 */
#ifndef STRATA_STATUS_H
#define STRATA_STATUS_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum st_code {
  ST_CODE_OK = 0,
  ST_CODE_CONFIG,
  ST_CODE_DATA,
  ST_CODE_RUNTIME,
  ST_CODE_NUMERICS,
  ST_CODE_HANG,
  ST_CODE_CKPT,
  ST_CODE_IO,
  ST_CODE_INTERNAL,
  ST_CODE_INTERRUPTED, /* not a failure of the run: stopped by a signal after a checkpoint */
  ST_CODE_MEMORY,      /* out of memory, predicted or real: exit 4 like ST_CODE_RUNTIME */
} st_code;

typedef struct st_status_s* st_status; /* NULL means OK */
#define ST_OK ((st_status)0)

/* Makes a status with a printf-style message. Returns a new status owned by
 * the caller; `code` must not be ST_CODE_OK. Never returns NULL (out of
 * memory aborts, see strata/base.h). */
st_status st_status_make(st_code code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
st_status st_status_makev(st_code code, const char* fmt, va_list ap);

/* Prefixes context to |status|'s message ("context: message") and returns
 * it. Consumes |status|; returns ST_OK when |status| is ST_OK. */
st_status st_status_annotate(st_status status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* Re-classes |status| as |code| (e.g. a file-system failure reading a token
 * file is a data error, exit 3) and prefixes context like
 * st_status_annotate. Consumes |status|; returns ST_OK when |status| is
 * ST_OK. st_status_set_code does the same without context. */
st_status st_status_recode(st_status status, st_code code, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
st_status st_status_set_code(st_status status, st_code code);

st_code st_status_code(st_status status);          /* ST_CODE_OK for NULL */
const char* st_status_message(st_status status);   /* "" for NULL; owned by status */
void st_status_free(st_status status);              /* NULL is a no-op */

/* Keeps the first failure: frees |second| if |first| failed, else returns it. */
st_status st_status_join(st_status first, st_status second);

/* Process exit code for a status class (0 for OK). */
int st_status_exit_code(st_status status);
int st_code_exit_code(st_code code);
/* The class for people ("runtime error", "out of memory") and for files:
 * st_code_key is a stable lower-case word ("runtime", "memory"), the
 * failed event's "class". */
const char* st_code_name(st_code code);
const char* st_code_key(st_code code);

/* Returns |expr|'s failure to the caller, with context prefixed. */
#define ST_RETURN_IF_ERROR(expr, ...)                         \
  do {                                                        \
    st_status st__s = (expr);                                 \
    if (st__s) return st_status_annotate(st__s, __VA_ARGS__); \
  } while (0)

/* Same without context. */
#define ST_RETURN(expr)          \
  do {                           \
    st_status st__s = (expr);    \
    if (st__s) return st__s;     \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif /* STRATA_STATUS_H */
