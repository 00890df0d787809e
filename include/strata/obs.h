/*
 * strata/obs.h — the run directory's logs (DESIGN §4): events.jsonl
 * (lifecycle transitions), metrics.jsonl (one object per step, eval lines),
 * and the terminal progress line.
 *
 * Lines are written whole and flushed, so a crash never leaves a truncated
 * JSON object behind (a reader may at most miss the last line).
 */
#ifndef STRATA_OBS_H
#define STRATA_OBS_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_runlog st_runlog;

/* Opens (appending) <dir>/events.jsonl and <dir>/metrics.jsonl. */
st_status st_runlog_open(const char* dir, st_runlog** out_log /* owned by caller */);
void st_runlog_close(st_runlog* log); /* NULL is a no-op */

/* Appends {"time": <unix s>, "event": <name>, <fields>} where |fields_json|
 * is "" or a comma-separated list of JSON members ("\"step\": 3"). */
st_status st_runlog_event(st_runlog* log, const char* name, const char* fields_json);
/* Appends one metrics object; |object_json| is a complete JSON object. */
st_status st_runlog_metrics(st_runlog* log, const char* object_json);

/* Progress line on stderr when it is a terminal (or |force|):
 * "step 120/600  loss 1.234  4.1k tok/s  ETA 1m52s". */
void st_progress_print(bool enabled, int64_t step, int64_t total, double loss, double tokens_per_s, double eta_s);
void st_progress_end(bool enabled);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_OBS_H */

/*===-------------------------------------------------------------------===*/
/* Task context (context.json)                                              */
/*===-------------------------------------------------------------------===*/

#include "strata/runtime.h"

/* Facts the caller knows; the rest (host, CPU, memory, git, environment)
 * is gathered here. Strings are borrowed. */
typedef struct st_context_facts {
  const char* run_id;
  const char* config_hash;
  const char* bundle_key;
  const char* jax_version; /* from the bundle manifest */
  const st_runtime* runtime;
} st_context_facts;

/* Builds the context as one JSON object (new string owned by the caller):
 * run id, strata version, git commit and dirtiness, jax/jaxlib/plugin
 * versions, PJRT platform, devices, host name, CPU model, cores, memory,
 * behaviour-changing environment variables, config hash and bundle key. */
char* st_context_json(const st_context_facts* facts);

#define STRATA_VERSION "0.1.0"
