/* rundir.c — the run directory's owner: where it is, its lock, the name of
 * every file in it, and the writers of what describes the run as a whole
 * (config.yaml, context.json). The table in strata/obs.h ("The run
 * directory") says who writes each file and when; docs/architecture.md
 * mirrors it. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/config.h"
#include "strata/obs.h"

/* Indexed by st_rundir_entry; a folder's name carries no trailing slash. */
static const char* const kNames[ST_RUNDIR_ENTRY_COUNT] = {
    [ST_RUNDIR_LOCK] = ".lock",
    [ST_RUNDIR_CONFIG] = "config.yaml",
    [ST_RUNDIR_CONTEXT] = "context.json",
    [ST_RUNDIR_EVENTS] = "events.jsonl",
    [ST_RUNDIR_METRICS] = "metrics.jsonl",
    [ST_RUNDIR_TOKENIZER] = "tokenizer.json",
    [ST_RUNDIR_PARAMS] = "params.safetensors",
    [ST_RUNDIR_SAMPLE] = "sample.txt",
    [ST_RUNDIR_CHECKPOINTS] = "checkpoints",
    [ST_RUNDIR_TB] = "tb",
    [ST_RUNDIR_TRACE] = "trace",
    [ST_RUNDIR_DIAG] = "diag",
    [ST_RUNDIR_EVAL] = "eval",
    [ST_RUNDIR_RECOVERY] = "recovery.json",
    [ST_RUNDIR_REPORT] = "report.html",
    [ST_RUNDIR_NOTES] = "notes.json",
    [ST_RUNDIR_DUMP] = "dump",
};

const char* st_rundir_name(st_rundir_entry e) {
  return (unsigned)e < ST_RUNDIR_ENTRY_COUNT ? kNames[e] : NULL;
}

char* st_rundir_path(const char* dir, st_rundir_entry e) { return st_path_join(dir, st_rundir_name(e)); }

char* st_rundir_path_in(const char* dir, st_rundir_entry folder, const char* leaf) {
  char* f = st_rundir_path(dir, folder);
  char* p = st_path_join(f, leaf);
  free(f);
  return p;
}

/* Spelled "<inner>/../../<name>", not resolved: the path is what messages
 * show, and it stays right when the run directory is reached by a link. */
char* st_rundir_path_above(const char* inner, st_rundir_entry e) {
  char* up = st_path_join(inner, "../..");
  char* p = st_path_join(up, st_rundir_name(e));
  free(up);
  return p;
}

const char* st_rundir_id(const char* dir) {
  const char* slash = strrchr(dir, '/');
  return slash ? slash + 1 : dir;
}

char* st_rundir_default(const char* run_dir, const char* run_id) {
  if (run_dir && run_dir[0]) return st_xstrdup(run_dir);
  st_strbuf d = {0};
  if (run_id && run_id[0]) {
    st_strbuf_printf(&d, "runs/%s", run_id);
  } else {
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[64];
    strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
    st_strbuf_printf(&d, "runs/%s-%d", stamp, (int)getpid());
  }
  return st_strbuf_take(&d);
}

/*===-------------------------------------------------------------------===*/
/* The lock                                                                 */
/*===-------------------------------------------------------------------===*/

/* Adopts the lock `strata run` handed down, else takes <dir>/.lock. Two
 * processes training into one directory would interleave their metrics and
 * race each other's checkpoints; the lock dies with its process, so a
 * SIGKILLed run can be resumed at once. */
static st_status st__lock(const char* dir, int* out_fd) {
  char* lock = st_rundir_path(dir, ST_RUNDIR_LOCK);
  long holder = 0;
  st_status s = ST_OK;
  *out_fd = st_fs_lock_inherited(lock);
  if (*out_fd < 0) s = st_fs_lock(lock, out_fd, &holder);
  /* Rank 0 of a job `strata run` launched: the supervisor holds the lock for it. */
  if (!s && *out_fd < 0 && holder > 0 && st_fs_lock_held_by_ancestor(holder)) {
    free(lock);
    return ST_OK;
  }
  if (!s && *out_fd < 0 && holder == -1)
    fprintf(stderr, "strata: warning: %s: this filesystem has no flock; nothing stops a second process from using %s\n",
            lock, dir);
  else if (!s && *out_fd < 0)
    s = st_status_make(ST_CODE_CONFIG,
                       "run directory '%s' is in use by another strata process (pid %ld holds %s); wait for it or stop "
                       "it, or set run.dir to a new folder",
                       dir, holder, lock);
  free(lock);
  return s;
}

st_status st_rundir_holder(const char* dir, long* out_holder) {
  char* lock = st_rundir_path(dir, ST_RUNDIR_LOCK);
  st_status s = st_fs_lock_probe(lock, out_holder);
  free(lock);
  return s;
}

bool st_rundir_has_run(const char* dir) {
  /* metrics.jsonl gets its first line when the first step is recorded;
   * checkpoints and params.safetensors come later still. Events and
   * config.yaml alone are what a run that failed before its first step
   * leaves: an empty run, which may be reused. */
  char* metrics = st_rundir_path(dir, ST_RUNDIR_METRICS);
  char* params = st_rundir_path(dir, ST_RUNDIR_PARAMS);
  char* ckpts = st_rundir_path(dir, ST_RUNDIR_CHECKPOINTS);
  struct stat st;
  bool has = (stat(metrics, &st) == 0 && st.st_size > 0) || st_fs_exists(params);
  DIR* d = has ? NULL : opendir(ckpts);
  struct dirent* e;
  while (d && !has && (e = readdir(d)) != NULL) has = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  if (d) closedir(d);
  free(metrics);
  free(params);
  free(ckpts);
  return has;
}

/* The refusal of a directory that holds a run, worded for the command. */
static st_status st__refuse_used(const char* dir, bool supervisor) {
  char* q = st_shell_quote(dir);
  st_status s = supervisor ? st_status_make(ST_CODE_CONFIG,
                                            "run directory '%s' already holds a run (steps in metrics.jsonl, checkpoints); set "
                                            "run.dir to a new folder, or continue it supervised with run.resume=true (or "
                                            "unsupervised: strata resume %s)",
                                            dir, q)
                           : st_status_make(ST_CODE_CONFIG,
                                            "run directory '%s' already holds a run (steps in metrics.jsonl, checkpoints); set "
                                            "run.dir to a new folder, or continue it with `strata resume %s`",
                                            dir, q);
  free(q);
  return s;
}

st_status st_rundir_claim(const char* dir, const st_rundir_claim_options* o, int* out_lock_fd, bool* out_reused) {
  *out_lock_fd = -1;
  if (out_reused) *out_reused = false;
  st_status s = ST_OK;
  /* The supervisor refuses before it creates or locks anything; the
   * trainer under it inherits the lock and checks again after it. */
  if (o->supervisor && !o->resume && st_rundir_has_run(dir)) s = st__refuse_used(dir, true);
  if (!s) s = st_fs_mkdirs(dir);
  if (!s) s = st__lock(dir, out_lock_fd);
  if (!o->supervisor) {
    bool used = st_rundir_has_run(dir);
    char* events = st_rundir_path(dir, ST_RUNDIR_EVENTS);
    if (out_reused) *out_reused = !used && st_fs_exists(events); /* an earlier attempt stopped before its first step */
    free(events);
    if (!s && used && !o->resume) s = st__refuse_used(dir, false);
    /* A resume writes the run's config only once its checkpoint accepted
     * it (st_rundir_write_config after the restore): a refused resume
     * (another tokenizer, another model) must leave the run as it was. */
    if (!s && !o->resume && o->config) s = st_rundir_write_config(dir, o->config);
  }
  if (s && *out_lock_fd >= 0) {
    close(*out_lock_fd);
    *out_lock_fd = -1;
  }
  return s;
}

/*===-------------------------------------------------------------------===*/
/* What describes the run as a whole                                        */
/*===-------------------------------------------------------------------===*/

st_status st_rundir_write_config(const char* dir, const st_config* config) {
  char* path = st_rundir_path(dir, ST_RUNDIR_CONFIG);
  st_status s = st_config_save(config, path);
  free(path);
  return s;
}

st_status st_rundir_write_context(const char* dir, const st_context_facts* facts, json_t** out_context) {
  *out_context = NULL;
  json_t* ctx = st_context_json(facts);
  char* path = st_rundir_path(dir, ST_RUNDIR_CONTEXT);
  st_status s = st_json_write_file(path, ctx, 0);
  free(path);
  if (s) json_decref(ctx);
  else *out_context = ctx;
  return s;
}
