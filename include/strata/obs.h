/*
 * strata/obs.h — the run directory's logs (docs/design.md §4): events.jsonl
 * (lifecycle transitions), metrics.jsonl (one object per step, eval lines),
 * and the terminal progress line.
 *
 * Each line is one write(2), so a crash never leaves a truncated JSON
 * object behind (a reader may at most miss the last line); a write cut
 * short by a full disk is taken back, and a torn line that survives (a
 * power loss) is cut when the log is next opened.
 *
 * Also the run directory's owner (src/obs/rundir.c, "The run directory"
 * below): its place, its lock and the name of every file in it.
 */
#ifndef STRATA_OBS_H
#define STRATA_OBS_H

#include <stdbool.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/config.h"
#include "strata/tensor.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/*===-------------------------------------------------------------------===*/
/* The run directory (src/obs/rundir.c; docs/architecture.md mirrors this)  */
/*===-------------------------------------------------------------------===*/

/* Every file and folder of a run directory, with its writer and when it is
 * written. Nothing else names them: a module gets a path from
 * st_rundir_path and friends, never by joining a name by hand.
 *
 *   entry                  name                writer                         when
 *   ST_RUNDIR_LOCK         .lock               obs/rundir.c st_rundir_claim   train, resume, run: held for the process's life
 *   ST_RUNDIR_CONFIG       config.yaml         obs/rundir.c (train/trainer.c) train: at the start; resume: once its checkpoint accepted it
 *   ST_RUNDIR_CONTEXT      context.json        obs/rundir.c (train/trainer.c) train, resume: once bundle and runtime are open
 *   ST_RUNDIR_EVENTS       events.jsonl        obs/runlog.c; diag/supervisor.c appended at each lifecycle transition
 *   ST_RUNDIR_METRICS      metrics.jsonl       obs/runlog.c (train/metrics.c) appended at each step and evaluation
 *   ST_RUNDIR_TOKENIZER    tokenizer.json      train/trainer.c                a BPE run: copied before its first step
 *   ST_RUNDIR_PARAMS       params.safetensors  train/trainer.c                the end of the run: final parameters
 *   ST_RUNDIR_SAMPLE       sample.txt          train/trainer.c                the end of the run, after params.safetensors
 *   ST_RUNDIR_CHECKPOINTS  checkpoints/        train/checkpoint_io.c (ckpt)   every ckpt.every steps, at a stop (docs/checkpoints.md)
 *   ST_RUNDIR_TB           tb/                 obs/tensorboard.c              obs.tensorboard=true: with each metrics line
 *   ST_RUNDIR_TRACE        trace/step_<N>.json train/metrics.c                trace.steps: after each traced step
 *   ST_RUNDIR_DIAG         diag/               train/nonfinite.c (nonfinite-step<N>/), diag/watchdog.c (hang-<time>/),
 *                                              diag/faults.c (faults.fired)   a non-finite value, a hang, a fault drill
 *   ST_RUNDIR_EVAL         eval/<name>.json    cli/cmd_eval.c                 strata eval
 *   ST_RUNDIR_RECOVERY     recovery.json       diag/supervisor.c              strata run: after each incident and at its end
 *   ST_RUNDIR_REPORT       report.html         cli/cmd_report.c (obs/report.c) strata report (unless --out)
 *   ST_RUNDIR_NOTES        notes.json          obs/notes.c (cli/cmd_note.c)   strata note: each note appended (never the trainer)
 *   ST_RUNDIR_DUMP         dump/step_<N>/      train/dump.c                   diag.dump=step:N: after step N (strata compare)
 */
typedef enum st_rundir_entry {
  ST_RUNDIR_LOCK,
  ST_RUNDIR_CONFIG,
  ST_RUNDIR_CONTEXT,
  ST_RUNDIR_EVENTS,
  ST_RUNDIR_METRICS,
  ST_RUNDIR_TOKENIZER,
  ST_RUNDIR_PARAMS,
  ST_RUNDIR_SAMPLE,
  ST_RUNDIR_CHECKPOINTS,
  ST_RUNDIR_TB,
  ST_RUNDIR_TRACE,
  ST_RUNDIR_DIAG,
  ST_RUNDIR_EVAL,
  ST_RUNDIR_RECOVERY,
  ST_RUNDIR_REPORT,
  ST_RUNDIR_NOTES,
  ST_RUNDIR_DUMP,
  ST_RUNDIR_ENTRY_COUNT
} st_rundir_entry;

/* The entry's name in the table above (static; a folder's without its
 * slash); NULL for a value outside the enum. */
const char* st_rundir_name(st_rundir_entry e);
/* <dir>/<name> (new string, caller frees). */
char* st_rundir_path(const char* dir, st_rundir_entry e);
/* <dir>/<folder's name>/<leaf> (new string): a file its writer names inside
 * one of the folders (trace/step_3.json, diag/faults.fired, eval/...). */
char* st_rundir_path_in(const char* dir, st_rundir_entry folder, const char* leaf);
/* <inner>/../../<name> (new string): the run's file seen from a folder two
 * levels below it (a checkpoint, checkpoints/step_N; a non-finite bundle,
 * diag/nonfinite-step<N>). The path is not resolved: messages show it so. */
char* st_rundir_path_above(const char* inner, st_rundir_entry e);
/* The run's id as the directory names it: its last path component
 * (borrowed from |dir|). */
const char* st_rundir_id(const char* dir);

/* Where a run writes (new string): |run_dir| (run.dir) when set, else
 * runs/<|run_id|> (run.id, validated as a plain name), else
 * runs/<YYYYmmdd-HHMMSS>-<pid> in local time. NULL counts as empty. */
char* st_rundir_default(const char* run_dir, const char* run_id);

typedef struct st_rundir_claim_options {
  /* Continue the run in the directory; else one that holds a run
   * (st_rundir_has_run) is refused, ST_CODE_CONFIG (exit 2). */
  bool resume;
  /* `strata run`'s claim: the refusal comes before the folder is created
   * or locked and names run.resume=true; no config.yaml is written (the
   * trainer it starts writes it) and *out_reused stays false. */
  bool supervisor;
  /* Written as config.yaml once the directory is claimed, unless resume
   * (borrowed; NULL: none). */
  const st_config* config;
} st_rundir_claim_options;

/* Makes run directory |dir| this process's alone (docs/checkpoints.md,
 * "One process per run directory"): creates it (with its parents), adopts
 * the lock `strata run` handed down or else takes <dir>/.lock, refuses a
 * directory that already holds a run unless o->resume, and writes
 * o->config as config.yaml. *out_lock_fd (owned by caller; close it last,
 * or let exit release it) is -1 on an error, and on success only when the
 * filesystem has no flock, which is warned about on stderr. Another live
 * holder is ST_CODE_CONFIG (exit 2) naming its pid. *out_reused (may be
 * NULL): the folder holds only what an earlier attempt that stopped before
 * its first step left (events.jsonl, no step). */
st_status st_rundir_claim(const char* dir, const st_rundir_claim_options* o, int* out_lock_fd, bool* out_reused);

/* The process holding run directory |dir| (st_rundir_claim's lock), read
 * without taking it: see st_fs_lock_probe for *out_holder. */
st_status st_rundir_holder(const char* dir, long* out_holder);

/* Whether run directory |dir| holds a run that recorded something: a step
 * in metrics.jsonl, a checkpoint or final parameters. A folder that only
 * holds what a run failing before its first step leaves (config.yaml,
 * context.json, events.jsonl, an empty metrics.jsonl) is an empty run:
 * `strata train` and `strata run` may reuse it. */
bool st_rundir_has_run(const char* dir);

/* Writes |config| (the resolved config the run trains with) as
 * <dir>/config.yaml, atomically (st_config_save). */
st_status st_rundir_write_config(const char* dir, const st_config* config);

typedef struct st_runlog st_runlog;

/*===-------------------------------------------------------------------===*/
/* The run's logs (events.jsonl, metrics.jsonl)                            */
/*===-------------------------------------------------------------------===*/

/* Cuts a torn last line off the JSON-lines file |path| (bytes after its
 * last newline, left by a write cut short: a full disk, a power loss), so
 * that the next append starts a line of its own. *out_cut: bytes removed
 * (0 when the file ends in a newline, is empty or does not exist). */
st_status st_runlog_repair_tail(const char* path, long* out_cut);

/* Opens (appending) <dir>/events.jsonl and <dir>/metrics.jsonl, first
 * cutting a torn last line off each (warned on stderr, and a log_repaired
 * event). Write failures (ENOSPC, EIO) are ST_CODE_IO (exit 9); the
 * partial line of a failed write is taken back when the file allows. */
st_status st_runlog_open(const char* dir, st_runlog** out_log /* owned by caller */);
void st_runlog_close(st_runlog* log); /* NULL is a no-op */

/* Appends {"time": <unix s>, "event": <name>, <fields' members>} as one
 * line. |fields| (an object, or NULL for none) is stolen. */
st_status st_runlog_event(st_runlog* log, const char* name, st_json* fields);
/* Appends |object| (stolen) as one line of metrics.jsonl. */
st_status st_runlog_metrics(st_runlog* log, st_json* object);

/* Also writes every metrics line (st_runlog_metrics) to a new TensorBoard
 * event file in folder |tb_dir| (created when missing; st_tb_open), so
 * TensorBoard and metrics.jsonl show the same numbers. The writer is the
 * log's: st_runlog_close closes it. */
st_status st_runlog_tensorboard(st_runlog* log, const char* tb_dir);

/*===-------------------------------------------------------------------===*/
/* Reading the logs back (strata status, strata report)                     */
/*===-------------------------------------------------------------------===*/

/* What st_jsonl_read saw. */
typedef struct st_jsonl_stats {
  int64_t lines;             /* objects handed to the callback */
  int64_t bad;               /* lines skipped: not JSON, not an object, longer than max_line */
  int64_t first_bad_byte;    /* file offset of the first of them; -1 when none */
  const char* first_bad_why; /* "not JSON", "not a JSON object", "too long" (static); NULL when none */
  bool torn;                 /* bytes after the last newline (a line being written, or cut by a crash): not read */
  int64_t skipped_bytes;     /* bytes before the tail window, not read */
} st_jsonl_stats;

/* Called per line with the parsed object (borrowed: json_incref to keep it)
 * and the line's file offset; returns false to stop reading. */
typedef bool (*st_jsonl_fn)(void* user, st_json* line, int64_t byte);

/* Streams JSON-lines file |path| (untrusted): each complete line that is a
 * JSON object goes to |fn|, oldest first; empty lines are ignored, bad ones
 * counted in |stats| and skipped. Only the bytes present at open are read;
 * |tail_bytes| > 0 reads only the last that many (the cut first line
 * dropped). Memory is bounded by |max_line| (+64 KiB), whatever the file's
 * size. Errors: the file cannot be read (ST_CODE_IO) or is not a regular
 * file (ST_CODE_CONFIG); a bad line is never an error here. */
st_status st_jsonl_read(const char* path, int64_t tail_bytes, size_t max_line, st_jsonl_fn fn, void* user,
                        st_jsonl_stats* stats);

/*===-------------------------------------------------------------------===*/
/* strata report: one self-contained HTML page about a run (docs/using.md)  */
/*===-------------------------------------------------------------------===*/

typedef struct st_report_stats {
  int64_t step_lines, eval_lines; /* metrics.jsonl lines read */
  int64_t events;                 /* events.jsonl lines read */
  int64_t bad_lines;              /* lines of either log skipped (not JSON, not an object, too long) */
  int points;                     /* step points plotted (thinned beyond 2048) */
} st_report_stats;

/* The report of run directory |dir| as one HTML page (*out_html owned by
 * the caller): summary, inline-SVG plots (loss and eval loss against steps
 * and tokens, lr, grad norm, tokens/s, step time as wait + host, memory by
 * category, the events on a time axis), sample.txt, checkpoints, context,
 * resolved config, the events. Every file of |dir| is untrusted: bad log
 * lines are counted in the page, sizes and counts are bounded, all text is
 * escaped. No script, and a Content-Security-Policy that loads nothing.
 * Errors: |dir| is not a folder or has neither log (ST_CODE_CONFIG), a log
 * cannot be read (ST_CODE_IO). |out_stats| may be NULL. */
st_status st_report_build(const char* dir, char** out_html, st_report_stats* out_stats);
/* st_report_build, written atomically to |out_path|. */
st_status st_report_write(const char* dir, const char* out_path, st_report_stats* out_stats);

/*===-------------------------------------------------------------------===*/
/* The experiment record: notes.json (strata note, src/obs/notes.c)          */
/*===-------------------------------------------------------------------===*/

/* notes.json: {"schema": 1, "entries": [{"time": <unix s>, "kind":
 * "note"|"hypothesis"|"conclusion", "author": "...", "text": "..."}, ...]},
 * oldest first. Entries are only appended: a run's hypothesis is its
 * newest "hypothesis" entry, and so for the conclusion. Written by
 * `strata note` alone (never the trainer, which rewrites context.json at
 * each start), atomically, with concurrent notes serialised. */
typedef enum st_note_kind { ST_NOTE_TEXT, ST_NOTE_HYPOTHESIS, ST_NOTE_CONCLUSION } st_note_kind;

#define ST_NOTES_MAX_TEXT (64 * 1024)  /* bytes of one entry's text */
#define ST_NOTES_MAX_ENTRIES 10000     /* entries of one run */
#define ST_NOTES_MAX_FILE (16 << 20)   /* notes.json read back */

/* "note", "hypothesis", "conclusion"; NULL outside the enum. */
const char* st_note_kind_name(st_note_kind kind);
/* Run directory |dir|'s notes.json, checked (untrusted: size, shape, every
 * entry). Missing: ST_OK and *out_notes NULL. Not JSON, the wrong shape or
 * too large: ST_CODE_CONFIG naming the file. */
st_status st_notes_read(const char* dir, st_json** out_notes /* owned by caller */);
/* The newest entry of |kind| in |notes| (from st_notes_read; borrowed), or NULL. */
const st_json* st_notes_latest(const st_json* notes, st_note_kind kind);
/* Appends an entry to <dir>/notes.json (created when missing), rewriting it
 * atomically under an flock on |dir| (waits up to 10 s for another note).
 * An existing notes.json that st_notes_read refuses is left untouched and
 * the error returned. |text| empty or longer than ST_NOTES_MAX_TEXT:
 * ST_CODE_CONFIG. |out_entry| (may be NULL): the entry written (owned by
 * the caller). The caller checks that |dir| is a run directory. */
st_status st_notes_add(const char* dir, st_note_kind kind, const char* text, const char* author, st_json** out_entry);

/*===-------------------------------------------------------------------===*/
/* strata diff: two runs side by side (src/obs/diff.c, docs/using.md)       */
/*===-------------------------------------------------------------------===*/

typedef struct st_diff_options {
  double rtol; /* the relative loss difference reported as the first real divergence; 0 is taken as 1e-6 */
  int samples; /* steps in the side-by-side table (evenly spaced, plus the first differing ones); 0 is taken as 10 */
} st_diff_options;

typedef struct st_diff st_diff;

/* Reads run directories |dir_a| and |dir_b| (untrusted: every file is
 * bounded and checked) and compares them: the resolved configs
 * (config.yaml, required), the contexts (context.json), the notes
 * (notes.json), and the step and eval lines of metrics.jsonl (required; a
 * resume's repeated steps replace the earlier ones; an incomplete last
 * line, a run being written, is left out and said). A missing or damaged
 * file is ST_CODE_CONFIG naming it (and the byte of a damaged log line). */
st_status st_diff_open(const char* dir_a, const char* dir_b, const st_diff_options* options, st_diff** out /* owned by caller */);
void st_diff_free(st_diff* diff); /* NULL is a no-op */
/* Everything found, as strata diff --json prints it (borrowed; format in
 * docs/using.md "strata diff"): config keys that differ first (the
 * experiment's, then run.* and obs.*), context keys that differ, notes,
 * the first step whose loss differs bitwise and the first whose relative
 * difference exceeds rtol, sampled steps side by side, evals, throughput. */
const st_json* st_diff_json(const st_diff* diff);
/* The same as text for a terminal, appended to |out|. */
void st_diff_text(const st_diff* diff, st_strbuf* out);
/* The same as one self-contained HTML page (report's style, no script,
 * nothing loaded) with the curves of both runs overlaid as inline SVG; a
 * new string owned by the caller. */
char* st_diff_html(const st_diff* diff);

/* Progress line on stderr when it is a terminal (or |force|):
 * "step 120/600  loss 1.234  4.1k tok/s  ETA 1m52s". */
void st_progress_print(bool enabled, int64_t step, int64_t total, double loss, double tokens_per_s, double eta_s);
void st_progress_end(bool enabled);


/*===-------------------------------------------------------------------===*/
/* Task context (context.json)                                              */
/*===-------------------------------------------------------------------===*/

#define ST_CONTEXT_MAX_DEVICES 64

/* What the runtime says of itself (the caller asks it: obs does not depend
 * on the runtime). Strings are borrowed. */
typedef struct st_context_runtime {
  const char* plugin_path;
  const char* xla_version;
  const char* platform_name;
  const char* platform_version;
  int api_major, api_minor;
  int device_count; /* entries below, at most ST_CONTEXT_MAX_DEVICES */
  int device_ids[ST_CONTEXT_MAX_DEVICES];
  const char* device_kinds[ST_CONTEXT_MAX_DEVICES];
} st_context_runtime;

/* Facts the caller knows; the rest (host, CPU, memory, git, environment)
 * is gathered here. Strings are borrowed. */
typedef struct st_context_facts {
  const char* run_id;
  const char* config_hash;
  const char* bundle_key;
  const char* tokenizer_hash;        /* "byte", "none" or BPE's hash (docs/data.md); NULL: left out */
  const char* jax_version;           /* from the bundle manifest */
  const char* jaxlib_version;        /* from the bundle manifest (versions.jaxlib) */
  const st_context_runtime* runtime; /* NULL: no runtime facts */
  st_json* peak;                      /* borrowed: the peak MFU is measured against ("peak"); NULL: none */
  st_json* kernels;                   /* borrowed: each kernel op's implementation and the C kernels' ISA; NULL: none */
  st_json* model;                     /* borrowed: the model description (the identity of params.safetensors); NULL: none */
  st_json* data;                      /* borrowed: the data contract at the run's start ("data"; docs/data.md); NULL: none */
  const char* author;                 /* obs.author: who ran it; NULL or "": found by st_context_author */
} st_context_facts;

/* Who runs this (context.json "author", a note's "author"): |override|
 * when not empty (source "config"); else git's user.name and user.email of
 * the current folder ("Name <email>", either alone when only one is set;
 * source "git"); else $USER or $LOGNAME ("env"); else "unknown"
 * ("unknown"). Runs git without a shell and never fails: no git, no
 * identity, no repository just fall through. Writes at most |n| bytes
 * (cut) to |out|; returns the source (static). */
const char* st_context_author(const char* override, char* out, size_t n);

/* Builds the context as one JSON object (a new reference, owned by the caller):
 * run id, strata version, author and its source (st_context_author), git commit and dirtiness, jax/jaxlib/plugin
 * versions, PJRT platform, devices, host name, CPU model, cores, memory,
 * behaviour-changing environment variables, config hash, bundle key and
 * the peak MFU is measured against. */
st_json* st_context_json(const st_context_facts* facts);
/* Builds the context (st_context_json) and writes it as <dir>/context.json.
 * On success *out_context is the object written (a new reference, owned by
 * the caller: the trainer's init event carries it too); on an error NULL. */
st_status st_rundir_write_context(const char* dir, const st_context_facts* facts, st_json** out_context);

#define STRATA_VERSION "0.1.0"

/*===-------------------------------------------------------------------===*/
/* Chrome trace-event JSON (<run>/trace/, docs/scheduling.md)               */
/*===-------------------------------------------------------------------===*/

/* A trace being assembled in memory: one process, named tracks (threads),
 * complete events ("ph": "X") and counters ("ph": "C"). Times are in
 * microseconds. The file is the JSON object format
 * {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}
 * that Perfetto (ui.perfetto.dev) and chrome://tracing open. */
typedef struct st_trace st_trace;

st_trace* st_trace_new(const char* process_name); /* free with st_trace_free */
void st_trace_free(st_trace* trace);              /* NULL is a no-op */
/* Names track |tid| and orders it among the tracks (sort index = tid). */
void st_trace_track(st_trace* trace, int tid, const char* name);
/* A slice [ts, ts + dur] on track |tid|. |args| (an object, or NULL) is
 * stolen and becomes the event's args. Slices of one track must nest or be
 * disjoint (the importer drops misnested ones). */
void st_trace_slice(st_trace* trace, int tid, const char* name, const char* category, double ts_us, double dur_us,
                    st_json* args);
/* A counter sample: |args| (stolen) holds the series ({"params": 10}). */
void st_trace_counter(st_trace* trace, const char* name, double ts_us, st_json* args);
/* Sets otherData[key] = |value| (stolen). */
void st_trace_meta(st_trace* trace, const char* key, st_json* value);
/* Writes the trace atomically to |path| (its folder must exist). */
st_status st_trace_write(const st_trace* trace, const char* path);

/* Lanes of one kind of slice: slices on one track must not overlap, so
 * overlapping slices of one kind are spread over numbered tracks
 * |base_tid|, |base_tid| + 1, ... named "<name>", "<name> (concurrent 2)",
 * ..., each named when first used. Start as {.base_tid = t, .name = n};
 * |name| is borrowed; free with st_trace_lanes_free. */
typedef struct st_trace_lanes {
  int base_tid;
  const char* name;
  int count;   /* lanes used so far */
  double* end; /* [count]: the last end of each lane (owned) */
} st_trace_lanes;

/* The tid of the first lane free at |start| (a new one when none is),
 * which is then busy until |end|. */
int st_trace_lane(st_trace* trace, st_trace_lanes* lanes, double start, double end);
void st_trace_lanes_free(st_trace_lanes* lanes);

/* A timed span from outside a step plan (an FFI kernel's call), on the
 * st_now() clock. */
typedef struct st_trace_span {
  char* name;           /* owned */
  const char* category; /* static */
  double start_s;
  double dur_s;
  st_json* args; /* owned; NULL: none */
} st_trace_span;

/* Spans of one source, drawn on lanes of their own (st_trace_add_spans). */
typedef struct st_trace_spans {
  const char* track;       /* the lanes' name (static) */
  const char* dropped_key; /* otherData key of |dropped| when > 0 (static) */
  st_trace_span* items;    /* [count], owned */
  int count;
  int64_t dropped; /* spans the source did not keep */
} st_trace_spans;

void st_trace_spans_free(st_trace_spans* spans); /* its items; NULL is a no-op */
/* Draws |spans| as slices on lanes from |base_tid|, their times relative
 * to |origin_s| (the trace's time origin, on the st_now() clock), and
 * sets otherData[dropped_key] when some were dropped. */
void st_trace_add_spans(st_trace* trace, const st_trace_spans* spans, int base_tid, double origin_s);

/*===-------------------------------------------------------------------===*/
/* The live metrics endpoint (obs.metrics_port, docs/using.md)              */
/*===-------------------------------------------------------------------===*/

/* The latest metrics of a run in the Prometheus text exposition format
 * (version 0.0.4) at http://127.0.0.1:<port>/metrics, served by
 * libmicrohttpd on a thread of its own while the trainer runs. The server
 * keeps one snapshot: every metrics object handed to it is merged into it
 * (a step line, then an eval line adds eval_loss), under a mutex. */
typedef struct st_metrics_server st_metrics_server;

/* Whether this binary can serve metrics: false in `make build-portable`,
 * which links its dependencies statically and leaves libmicrohttpd out
 * (its TLS library, gnutls, needs p11-kit, of which Debian ships no static
 * archive). */
bool st_metrics_server_available(void);

/* Binds 127.0.0.1:|port| (1..65535) and starts serving. |run_id| (copied)
 * becomes the run="..." label of every series. A port that cannot be bound
 * (in use, privileged) or a binary without the endpoint is ST_CODE_CONFIG
 * (exit 2) naming obs.metrics_port and the port. */
st_status st_metrics_server_start(int port, const char* run_id, st_metrics_server** out /* owned by caller */);
/* Merges |metrics| (an object as written to metrics.jsonl; borrowed: deep-
 * copied, the caller keeps it) into the served snapshot. NULL |server| is a
 * no-op, so the caller needs no test of its own. */
void st_metrics_server_publish(st_metrics_server* server, const st_json* metrics);
/* Stops serving (joins the server's thread) and frees. NULL is a no-op. */
void st_metrics_server_stop(st_metrics_server* server);

/* The exposition text of |snapshot| (a metrics object, borrowed) appended
 * to |out|: for each numeric field F one gauge family strata_<F> with
 * `# HELP` and `# TYPE` lines (a trailing "_s" reads "_seconds", "_per_s"
 * "_per_second"); an object of numbers F = {"k": v} becomes
 * strata_<F>{<L>="k"}, L the word after "_by_" in F ("key" without one),
 * and an object of objects F = {"k": {"count": v}} becomes
 * strata_<F>_count{<L>="k"}. null (a non-finite value in metrics.jsonl)
 * is NaN. Strings and lists are left out. Every series carries
 * run="|run_id|" (escaped: backslash, double quote, newline). */
void st_metrics_render(const st_json* snapshot, const char* run_id, st_strbuf* out);
/* A sample value as the format writes it: shortest round-trip digits,
 * "NaN", "+Inf", "-Inf". */
void st_metrics_format_value(double x, char out[ST_DOUBLE_CHARS]);

/*===-------------------------------------------------------------------===*/
/* TensorBoard event files (<run>/tb/, docs/using.md "TensorBoard")         */
/*===-------------------------------------------------------------------===*/

/* One event file being appended to: events.out.tfevents.<unix s>.<host>.<pid>
 * (".<n>" added when that name exists), a sequence of records
 *   u64 length (LE) | u32 masked CRC32C of the length | data | u32 masked CRC32C of the data
 * whose data are Event protos (src/obs/tb_event.proto); the first is the
 * file version "brain.Event:2". Each record is one write(2) straight to the
 * file (no user-space buffer: TensorBoard sees a step as soon as it is
 * written); a write cut short is taken back, so a crash can leave at most a
 * torn last record, which TensorBoard's reader stops at. Writes only; reads
 * no bytes from anywhere (nothing here to fuzz). */
typedef struct st_tb_writer st_tb_writer;

/* Creates folder |dir| when missing and a new event file in it. */
st_status st_tb_open(const char* dir, st_tb_writer** out_writer /* owned by caller */);
void st_tb_close(st_tb_writer* writer);           /* NULL is a no-op */
const char* st_tb_path(const st_tb_writer* writer); /* the file; borrowed */

/* One event for the metrics line |object| (borrowed): step = its integer
 * "step" (0 without one), wall time = now, and one scalar per number in it,
 * tagged with its key; a nested object's numbers are tagged with the keys'
 * path ("peak_live_by_category/params"). "step" itself, nulls (a value not
 * measured, a non-finite loss), booleans, strings and arrays are left out.
 * A scalar is a Summary.Value simple_value: TensorBoard's scalars are
 * float32, so each is the float nearest the double of metrics.jsonl
 * (integers exact up to 2^24; metrics.jsonl stays the exact record). An
 * object without numbers writes nothing. */
st_status st_tb_write_metrics(st_tb_writer* writer, const st_json* object);

/* The record framing, exposed for its tests: CRC-32C (Castagnoli,
 * reflected 0x82F63B78, init and final xor 0xFFFFFFFF: "123456789" ->
 * 0xE3069283), TensorBoard's masking of it, and one framed record of
 * |data| appended to |out|. */
uint32_t st_tb_crc32c(const void* data, size_t size);
uint32_t st_tb_mask_crc(uint32_t crc);
void st_tb_frame(st_strbuf* out, const void* data, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_OBS_H */
