/* checkpoint_io.c — training state <-> checkpoints (see checkpoint_io.h).
 *
 * The state is every persistent parameter and optimizer slot of the step
 * plan, by slot name ("layers.0.wq", "m:layers.0.wq", "v:..."): params go
 * to params.safetensors, m and v to optimizer.safetensors. Together with
 * the step (which fixes the data position, the LR and AdamW's t) that is
 * all a bitwise-exact resume needs: init, the sampler and the schedule are
 * pure functions of the seed and the step. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/ckpt.h"
#include "strata/diag.h"
#include "strata/obs.h"
#include "train/checkpoint_io.h"

struct st_train_ckpt {
  st_train_ckpt_init in;
  char* root; /* <run>/checkpoints */
  int64_t every, keep, keep_every;
  bool async, stop_on_error, resume, allow_bundle_change;

  int count; /* state tensors */
  int* slots;
  const char** names;
  const char** files;
  st_tensor_type* types;
  st_ckpt_snapshot* snap;
  bool snap_filled; /* a snapshot was copied into it: its pages are resident */
  bool streaming;   /* ckpt.staging resolved to chunked: snap is a streaming snapshot */
  st_event** events;

  st_faults* faults;
  /* The hang watchdog (borrowed; NULL: none) and the handle of the write
   * it watches (-1: none): begun on whichever thread writes, ended at
   * its commit or, for a save that failed, when it is reported. */
  st_watchdog* watchdog;
  atomic_int watch_handle;
  int watch_key;
  st_ckpt_save_options save_opts;
  st_ckpt_writer* writer;
  /* the save in flight on the writer */
  bool inflight;
  int64_t inflight_step;
  double inflight_blocking_s, inflight_waited_s;

  json_t* config; /* the resolved config, for the manifest */
  json_t* lr_schedule; /* st_plan_lr_schedule_json: the schedule's definition, for the manifest and the resume */
  json_t* model;  /* the sparse model JSON with the whole microbatch: its key is the one-device bundle key */
  json_t* desc;   /* the model description with the whole microbatch: the manifest's "model", the identity */
  json_t* implied; /* st_plan_model_implied: what an older manifest's missing fields meant */
  char key[17];   /* the one-device bundle key of |model|: the same on every mesh */
  char config_hash[17];
  int64_t last_saved_step; /* of the newest save that succeeded; 0: none yet */
  bool first_step_logged;
  double t_created;
  int64_t start_step;
  bool job; /* one rank of a job of several processes: saves and restores are collective */
  /* Per-rank shards (st_train_ckpt_init.sharded): each tensor's blocks
   * (parts[i]: the processes for a slot cut across them, else 1: rank 0
   * holds it whole), this rank's snapshot (its rows only) and, for each of
   * its tensors, the index in the whole list. */
  bool rows;
  int rank, nranks;
  int* parts;
  int* row_index;
};

static st_status st__save_hook(void* user, st_ckpt_point point, const char* path);

/* A parameter or optimizer slot whose value outlives the step: persistent
 * itself, or offloaded (a non-persistent device slot whose persistent home
 * is "host:<name>"). Checkpoints name the logical slot, never the home, so
 * a checkpoint does not depend on the offload policy that wrote it;
 * st_executor_get/set follow an offloaded slot to its home. */
static bool st__is_state_slot(const st_plan* p, const st_slot* s) {
  if (s->category != ST_SLOT_PARAM && s->category != ST_SLOT_OPT) return false;
  if (!strncmp(s->name, "host:", 5)) return false;
  if (s->persistent) return true;
  char home[600];
  snprintf(home, sizeof(home), "host:%s", s->name);
  return st_plan_slot_find(p, home) >= 0;
}

static st_status st__fill(void* user, int i, void* dst, size_t size);

/* Per-rank shards: how each tensor is cut, and this rank's snapshot of
 * its rows (one file, rank-<r>.safetensors; tensors it holds no row of are
 * left out). */
static st_status st__rows_create(st_train_ckpt* c) {
  c->rank = st_dist_rank(c->in.dist);
  c->nranks = st_dist_size(c->in.dist);
  c->parts = st_xcalloc((size_t)c->count + 1, sizeof(int));
  c->row_index = st_xcalloc((size_t)c->count + 1, sizeof(int));
  const char** files = st_xcalloc((size_t)c->count + 1, sizeof(char*));
  const char** names = st_xcalloc((size_t)c->count + 1, sizeof(char*));
  st_tensor_type* types = st_xcalloc((size_t)c->count + 1, sizeof(st_tensor_type));
  char file[64];
  snprintf(file, sizeof(file), ST_CKPT_RANK_FILE_FMT, c->rank);
  int n = 0;
  for (int i = 0; i < c->count; ++i) {
    const st_slot* sl = &c->in.plan->slots[c->slots[i]];
    c->parts[i] = sl->xblocks > 1 ? sl->xblocks : 1;
    int64_t b = 0, e = 0;
    st_ckpt_rows_of(c->types[i].dims[0], c->parts[i], c->rank, &b, &e);
    if (c->types[i].rank < 1)
      return st_status_make(ST_CODE_INTERNAL, "state slot '%s' is a scalar: per-rank shards hold rows of tensors", c->names[i]);
    if (b == e) continue;
    names[n] = c->names[i];
    files[n] = file;
    types[n] = c->types[i];
    types[n].dims[0] = e - b;
    c->row_index[n++] = i;
  }
  c->snap = st_ckpt_snapshot_create(n, names, files, types);
  free(files);
  free(names);
  free(types);
  return ST_OK;
}

st_status st_train_ckpt_create(const st_train_ckpt_init* in, st_train_ckpt** out) {
  *out = NULL;
  st_train_ckpt* c = st_xcalloc(1, sizeof(*c));
  c->in = *in;
  c->t_created = st_now();
  const st_config* cfg = in->config;
  const st_plan_options* o = in->options;
  c->root = st_rundir_path(in->ckpt_run_dir ? in->ckpt_run_dir : in->run_dir, ST_RUNDIR_CHECKPOINTS);
  c->every = o->ckpt.every;
  c->keep = o->ckpt.keep;
  c->keep_every = o->ckpt.keep_every;
  c->async = o->ckpt.async;
  c->stop_on_error = o->ckpt.stop_on_error;
  c->resume = o->resume;
  c->allow_bundle_change = o->ckpt.allow_bundle_change;
  c->job = in->dist && st_dist_multi(in->dist);

  const st_plan* p = in->plan;
  c->slots = st_xcalloc((size_t)p->slot_count + 1, sizeof(int));
  c->names = st_xcalloc((size_t)p->slot_count + 1, sizeof(char*));
  c->files = st_xcalloc((size_t)p->slot_count + 1, sizeof(char*));
  c->types = st_xcalloc((size_t)p->slot_count + 1, sizeof(st_tensor_type));
  /* Parameters first, then optimizer state: the files read in that order. */
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < p->slot_count; ++i) {
      const st_slot* s = &p->slots[i];
      if (!st__is_state_slot(p, s) || (pass == 0) != (s->category == ST_SLOT_PARAM)) continue;
      c->slots[c->count] = i;
      c->names[c->count] = s->name;
      c->files[c->count] = pass == 0 ? ST_CKPT_PARAMS : ST_CKPT_OPTIMIZER;
      /* A sharded slot is saved whole (st_executor_to_host reassembles it);
       * a slot cut across processes is known by its whole too. */
      c->types[c->count] = p->devices > 1 && s->layout == ST_LAYOUT_SHARDED ? s->logical : s->type;
      if (s->xblocks > 1 && p->devices == 1) c->types[c->count] = s->xwhole;
      c->count++;
    }
  }
  /* ckpt.staging (docs/checkpoints.md, "Host staging"): a full host copy
   * lets the writer thread save while training goes on, at the price of a
   * second copy of the state in host memory for the whole run; chunked
   * streams one tensor at a time and saves synchronously. auto: chunked
   * where the device's memory is host memory (a CPU plugin: the copy would
   * double the state in RAM) or the copy would take over a quarter of it. */
  int64_t state = 0;
  for (int i = 0; i < c->count; ++i) state += (int64_t)st_tensor_type_bytes(&c->types[i]);
  c->streaming = st_plan_ckpt_streams(o, in->runtime, state);
  c->rows = in->sharded && c->job;
  st_status rs = ST_OK;
  if (c->rows) {
    /* Asked for in so many words (full staging, background saves): said,
     * not dropped in silence. */
    if (c->async && o->ckpt.staging == ST_CKPT_STAGING_FULL && o->rank == 0)
      fprintf(stderr, "strata: note: ckpt.async=true and ckpt.staging=full: saves of per-rank shards (fsdp across "
                      "processes) are synchronous on every rank (docs/checkpoints.md, \"Per-rank shards\")\n");
    c->async = c->streaming = false;
    rs = st__rows_create(c);
  } else {
    c->snap = c->streaming ? st_ckpt_snapshot_create_streaming(c->count, c->names, c->files, c->types, st__fill, c)
                           : st_ckpt_snapshot_create(c->count, c->names, c->files, c->types);
  }
  c->events = st_xcalloc((size_t)c->count + 1, sizeof(st_event*));

  c->config = st_config_json(cfg);
  c->lr_schedule = st_plan_lr_schedule_json(in->options);
  /* A checkpoint identifies the model, not how it was cut over devices: the
   * model JSON the bundle is exported with carries one device's share of a
   * microbatch and the bundle key hashes the mesh, so both would make a
   * data=2 checkpoint foreign to a one-device run. The manifest records the
   * whole microbatch and the key of the one-device bundle of that model
   * (which is this run's own key on one device, so checkpoints written
   * before meshes existed still match); the mesh goes in "mesh". */
  c->model = st_plan_model_json(in->options);
  c->desc = st_plan_model_desc(in->options);
  c->implied = st_plan_model_implied();
  st_status s = rs ? rs : c->model && c->desc ? ST_OK : st_status_make(ST_CODE_INTERNAL, "the options carry no model JSON (not built from a config)");
  if (!s) st_json_put_int(c->desc, "microbatch_size", o->batch_size / (o->microbatches > 0 ? o->microbatches : 1));
  /* A job's bundle is cut for its processes' shares even where this
   * process's own mesh is one device. */
  if (!s && (o->mesh[0] || o->procs > 1)) {
    st_json_put_int(c->model, "microbatch_size", o->batch_size / (o->microbatches > 0 ? o->microbatches : 1));
    char* text = st_json_dump(c->model, 0);
    st_bundle_key(&(st_bundle_request){.model_json = text}, c->key);
    free(text);
  } else if (!s) {
    snprintf(c->key, sizeof(c->key), "%s", in->bundle->key);
  }
  st_config_hash(cfg, NULL, 0, c->config_hash);

  /* A rank that writes no checkpoint files cannot fire a save drill: it
   * would end as a drill that never fired (docs/checkpoints.md). */
  st_faults_options fo = o->faults;
  if (in->no_save) fo.crash_in_save = fo.corrupt_latest = fo.io_error_at_save = fo.hang_in_save = 0;
  /* Per-rank shards: every rank writes (and can fire the save drills), but
   * rank 0 alone commits, where faults.corrupt_latest fires. */
  if (c->rows && c->rank > 0) fo.corrupt_latest = 0;
  if (!s) s = st_faults_create(&fo, in->run_dir, &c->faults);
  if (!s) {
    st_faults_set_log(c->faults, in->log);
    const char* armed = st_faults_armed(c->faults);
    const char* disarmed = st_faults_disarmed(c->faults);
    if (armed[0] || disarmed[0]) {
      if (armed[0]) fprintf(stderr, "strata: FAULT INJECTION ARMED: %s\n", armed);
      if (disarmed[0]) fprintf(stderr, "strata: fault injection: %s already fired in an earlier attempt; disarmed\n", disarmed);
      json_t* e = st_json_obj();
      st_json_put_str(e, "armed", armed);
      st_json_put_str(e, "disarmed", disarmed);
      s = st_runlog_event(in->log, "faults_armed", e);
    }
  }
  atomic_init(&c->watch_handle, -1);
  c->save_opts = (st_ckpt_save_options){
      .root = c->root, .keep = c->keep, .keep_every = c->keep_every, .hook = st__save_hook, .hook_user = c};
  if (!s && c->async && !in->no_save) s = st_ckpt_writer_create(&c->save_opts, &c->writer);
  if (s) {
    st_train_ckpt_destroy(c);
    return s;
  }
  *out = c;
  return ST_OK;
}

static void st__watch_end(st_train_ckpt* c) {
  int h = atomic_exchange(&c->watch_handle, -1);
  st_watchdog_end(c->watchdog, h);
}

/* Every save's hook: the watchdog's view of the write, then the faults. */
static st_status st__save_hook(void* user, st_ckpt_point point, const char* path) {
  st_train_ckpt* c = user;
  if (c->watchdog && point == ST_CKPT_AT_BEGIN) {
    const char* slash = strrchr(path, '/');
    st_watch_item it = {.phase = ST_WATCH_CKPT, .key = c->watch_key, .name = slash ? slash + 1 : path,
                        .op = -1, .layer = -1, .micro = -1, .device = -1};
    st__watch_end(c);
    atomic_store(&c->watch_handle, st_watchdog_begin(c->watchdog, &it));
  }
  if (point == ST_CKPT_AT_COMMITTED) st__watch_end(c);
  return st_faults_ckpt_hook(c->faults, point, path);
}

void st_train_ckpt_set_watchdog(st_train_ckpt* c, st_watchdog* w) {
  c->watchdog = w;
  c->watch_key = w ? st_watchdog_keys(w, 1) : -1;
}

st_faults* st_train_ckpt_faults(st_train_ckpt* c) { return c ? c->faults : NULL; }

/*===-------------------------------------------------------------------===*/
/* A job of several processes (docs/multiprocess.md, "Checkpoints")        */
/*===-------------------------------------------------------------------===*/

/* One vote of the commit protocol, at the same point on every rank: each
 * rank gives the outcome of its own part of |what| (*io; a rank that
 * writes nothing gives OK) and whether a failure of it ends the run
 * whatever ckpt.on_error says (*io_fatal); |step| tags the point (the
 * save's step), so ranks that got out of step fail instead of mixing up
 * two saves. On return every rank holds the same verdict: *io stays this
 * rank's own failure, or becomes one naming the first rank that failed,
 * and *io_fatal is true when any failure was. The return value is the
 * exchange's own failure. */
static st_status st__job_vote(st_train_ckpt* c, int64_t step, const char* what, st_status* io, bool* io_fatal) {
  if (!c->job) return ST_OK;
  const int P = st_dist_size(c->in.dist);
  double in[3] = {(double)step, (double)st_status_code(*io), *io_fatal ? 1.0 : 0.0};
  double* all = st_xmalloc((size_t)P * 3 * sizeof(double));
  st_status s = st_dist_allgather_f64(c->in.dist, in, 3, all);
  int failed = -1;
  for (int r = 0; !s && r < P; ++r) {
    const double* v = all + 3 * (size_t)r;
    if (v[0] != (double)step)
      s = st_status_make(ST_CODE_INTERNAL, "rank %d is at %s (tag %lld), rank %d at tag %lld: the ranks' checkpoints are out of step",
                         st_dist_rank(c->in.dist), what, (long long)step, r, (long long)v[0]);
    if (v[1] != 0 && failed < 0) failed = r;
    if (v[2] != 0) *io_fatal = true;
  }
  if (!s && failed >= 0 && !*io)
    *io = st_status_make((st_code)(int)all[3 * (size_t)failed + 1],
                         "rank %d failed %s (its error is on rank %d's stderr and in its events.jsonl)", failed, what, failed);
  free(all);
  return s ? st_status_annotate(s, "agreeing between processes on %s", what) : ST_OK;
}

/* A rank that wrote nothing learns that the job's checkpoint of a step is
 * committed: its own record, in its run directory's events.jsonl. */
static st_status st__report_committed(st_train_ckpt* c, st_ckpt_save_result* r) {
  c->last_saved_step = r->step;
  char name[40];
  snprintf(name, sizeof(name), "step_%lld", (long long)r->step);
  char* dir = st_path_join(c->root, name);
  json_t* e = st_json_obj();
  st_json_put_int(e, "step", r->step);
  st_json_put_str(e, "dir", dir);
  if (c->rows)
    st_json_put_bool(e, "shards", true); /* every rank wrote its file, rank 0 committed */
  else
    st_json_put_int(e, "written_by_rank", 0);
  free(dir);
  st_ckpt_save_result_clear(r);
  return st_runlog_event(c->in.log, "ckpt_committed", e);
}

/*===-------------------------------------------------------------------===*/
/* Restore                                                                  */
/*===-------------------------------------------------------------------===*/

static void st__on_skip(void* user, const st_ckpt_entry* entry, st_status why) {
  st_train_ckpt* c = user;
  fprintf(stderr, "strata: skipping checkpoint %s: %s\n", entry->name, st_status_message(why));
  json_t* e = st_json_obj();
  st_json_put_str(e, "checkpoint", entry->name);
  st_json_put_str(e, "reason", st_status_message(why));
  st_status_free(st_runlog_event(c->in.log, "ckpt_skipped", e));
}

/* What a checkpoint of this run must be: its bundle (unless
 * ckpt.allow_bundle_change), its state tensors, and its identity, the
 * microbatch included (it fixes the data position and the programs). */
static void st__expect(const st_train_ckpt* c, st_ckpt_expect* e) {
  memset(e, 0, sizeof(*e));
  e->bundle_key = c->allow_bundle_change ? NULL : c->key;
  e->count = c->count;
  e->names = c->names;
  e->types = c->types;
  e->identity = (st_ckpt_identity){c->desc, st_dataset_tokenizer_hash(c->in.data)};
  e->identity_options = (st_ckpt_identity_options){
      .recorded = "in the checkpoint",
      .implied = c->implied,
      .fix = "resume with the settings the checkpoint was written with (data.tokenizer, data.vocab_size, data.path, model.*, "
             "kernels.*, train.microbatches), or start a new run.dir",
      .flags = ST_CKPT_IDENTITY_MICROBATCH};
}

/* Every state tensor of the verified checkpoint |ck| into its slot. */
static st_status st__load_state(st_train_ckpt* c, st_ckpt* ck) {
  st_status s = ST_OK;
  for (int i = 0; i < c->count && !s; ++i) {
    const st_ckpt_tensor_info* info = NULL;
    const void* data = st_ckpt_tensor_data(ck, c->names[i], &info);
    if (!data) {
      s = st_status_make(ST_CODE_INTERNAL, "%s: verified checkpoint lacks '%s'", ck->dir, c->names[i]);
      break;
    }
    st_buffer* b = NULL;
    s = st_buffer_from_host(c->in.runtime, 0, &c->types[i], data, &b);
    if (!s) s = st_executor_put(c->in.executor, c->slots[i], b);
  }
  return s;
}

/* The data the checkpoint recorded against this run's (data_contract.c). */
static st_status st__data_check(const st_train_ckpt* c, const st_ckpt* ck, json_t** out_change) {
  json_t* now = NULL;
  ST_RETURN(st_train_data_contract(c->in.data, (uint64_t)ck->data_position, &now));
  char where[600];
  snprintf(where, sizeof(where), "checkpoint %s (step %lld)", ck->dir, (long long)ck->step);
  st_status s = st_train_data_contract_check(ck->data, now, c->in.options->data_allow_changed, where, out_change);
  json_decref(now);
  return s;
}

/* The checks of a found checkpoint that need only its manifest. */
static st_status st__check_found(const st_train_ckpt* c, const st_ckpt* ck) {
  const st_plan_options* o = c->in.options;
  if (ck->data_position != ck->step * o->batch_size)
    return st_status_make(ST_CODE_CKPT,
                          "%s: consumed %lld training sequences in %lld steps; with train.batch_size=%lld the sampler would be at %lld. "
                          "Resume with the batch size the checkpoint was written with (%lld)",
                          ck->dir, (long long)ck->data_position, (long long)ck->step, (long long)o->batch_size,
                          (long long)(ck->step * o->batch_size), (long long)ck->batch_size);
  if (ck->step > o->steps)
    return st_status_make(ST_CODE_CKPT, "%s: is at step %lld, past train.steps=%lld; raise train.steps to continue", ck->dir,
                          (long long)ck->step, (long long)o->steps);
  return ST_OK;
}

/* This process's choice of the checkpoint to resume from (*out NULL: none
 * yet): leftovers of crashed saves removed, the newest valid one found,
 * its manifest checked. |restoring| says whether an error is one of
 * restoring (annotated so) or of finding. */
static st_status st__pick_here(st_train_ckpt* c, st_ckpt** out, int* skipped, bool* restoring) {
  char* removed = NULL;
  ST_RETURN(st_ckpt_remove_temporaries(c->root, &removed));
  if (removed && removed[0]) {
    fprintf(stderr, "strata: removed unfinished checkpoint writes of a crashed attempt: %s\n", removed);
    json_t* e = st_json_obj();
    st_json_put_str(e, "removed", removed);
    st_status_free(st_runlog_event(c->in.log, "ckpt_temporaries_removed", e));
  }
  free(removed);

  /* The bundle key also hashes the exporter's sources; with
   * ckpt.allow_bundle_change only the model config and the tensors must match. */
  st_ckpt_expect expect;
  st__expect(c, &expect);
  ST_RETURN(st_ckpt_find_valid(c->root, &expect, st__on_skip, c, out, skipped));
  if (!*out && *skipped > 0)
    return st_status_make(ST_CODE_CKPT,
                          "no valid checkpoint in '%s': all %d were skipped (reasons above and in events.jsonl); corrupt data is "
                          "never loaded. To start over, use a new run.dir (or move '%s' away)",
                          c->root, *skipped, c->root);
  st_status s = *out ? st__check_found(c, *out) : ST_OK;
  if (s) {
    *restoring = true;
    st_ckpt_free(*out);
    *out = NULL;
  }
  return s;
}

/* Per-rank shards, a rank > 0 loading what rank 0 picked (and verified
 * whole): when the checkpoint's rows in this rank's file are exactly its
 * blocks (the same job's cut), only that file is read and verified; else
 * (another process count, a checkpoint of whole tensors) every file is. */
static st_status st__open_own_rows(st_train_ckpt* c, const char* dir, const st_ckpt_expect* expect, st_ckpt** out) {
  char file[64];
  snprintf(file, sizeof(file), ST_CKPT_RANK_FILE_FMT, c->rank);
  st_ckpt* ck = NULL;
  ST_RETURN(st_ckpt_open_file(dir, expect, file, &ck));
  /* This rank's file holds, in the manifest's order (the writer's: the
   * tensors in order), exactly its rows of every tensor it holds rows of;
   * anything else (another writer's order too) reads every file. */
  int mine = 0, matched = 0, in_file = 0, k = 0;
  for (int i = 0; i < c->count; ++i) {
    int64_t b = 0, e = 0;
    st_ckpt_rows_of(c->types[i].dims[0], c->parts[i], c->rank, &b, &e);
    if (b == e) continue;
    ++mine;
    while (k < ck->tensor_count && strcmp(ck->tensors[k].file, file)) ++k;
    if (k == ck->tensor_count) break;
    const st_ckpt_tensor_info* t = &ck->tensors[k++];
    matched += t->rows && !strcmp(t->name, c->names[i]) && t->row_begin == b && t->row_end == e;
  }
  for (int q = 0; q < ck->tensor_count; ++q) in_file += !strcmp(ck->tensors[q].file, file);
  if (mine > 0 && matched == mine && in_file == mine) {
    *out = ck;
    return ST_OK;
  }
  st_ckpt_free(ck);
  return st_ckpt_open(dir, expect, out);
}

/* In a job, rank 0's pick of a checkpoint (|s| its error, *io its
 * checkpoint, NULL: none) made every rank's: rank 0 sends the folder's
 * name and every other rank opens and verifies that very folder (*io),
 * so no two ranks can load different steps (a checkpoint committed between
 * their looks, a file one of them reads damaged). *out_opening says an
 * error is this rank's opening of it. Collective in a job. */
static st_status st__job_share(st_train_ckpt* c, st_status s, st_ckpt** io, bool* out_opening) {
  *out_opening = false;
  if (!c->job) return s;
  const bool rank0 = st_dist_rank(c->in.dist) == 0;
  /* "" none, "!" rank 0 failed (its error is its own), else the folder. */
  char pick[64] = "";
  const char* slash = *io ? strrchr((*io)->dir, '/') : NULL;
  if (rank0) snprintf(pick, sizeof(pick), "%s", s ? "!" : *io ? (slash ? slash + 1 : (*io)->dir) : "");
  void* data = rank0 ? pick : NULL;
  size_t size = rank0 ? strlen(pick) + 1 : 0;
  st_status b = st_dist_broadcast(c->in.dist, &data, &size);
  if (b) b = st_status_annotate(b, "sending the checkpoint to load to every process");
  if (rank0 || b) {
    if (!rank0) free(data);
    if (!s && b) {
      st_ckpt_free(*io);
      *io = NULL;
      return b;
    }
    st_status_free(b);
    return s;
  }
  const char* name = data;
  if (!strcmp(name, "!")) {
    s = st_status_make(ST_CODE_CKPT, "rank 0 could not pick a checkpoint to load in '%s' (its error is on rank 0's stderr)", c->root);
  } else if (name[0]) {
    st_ckpt_expect expect;
    st__expect(c, &expect);
    char* dir = st_path_join(c->root, name);
    s = c->rows ? st__open_own_rows(c, dir, &expect, io) : st_ckpt_open(dir, &expect, io);
    if (s) s = st_status_annotate(s, "opening %s, the checkpoint rank 0 loads", dir);
    *out_opening = s != ST_OK;
    free(dir);
  }
  free(data);
  return s;
}

/* The checkpoint every rank resumes from: rank 0 (or the one process)
 * picks it, alone removing leftovers and reporting skipped checkpoints.
 * Collective in a job. */
static st_status st__pick(st_train_ckpt* c, st_ckpt** out, int* skipped, bool* restoring) {
  *out = NULL;
  *skipped = 0;
  *restoring = false;
  const bool rank0 = !c->job || st_dist_rank(c->in.dist) == 0;
  st_status s = rank0 ? st__pick_here(c, out, skipped, restoring) : ST_OK;
  bool opening = false;
  s = st__job_share(c, s, out, &opening);
  if (opening) *restoring = true;
  return s;
}

/* In a job, every rank's restore must succeed or none goes on: a rank
 * that failed keeps its error, the others get one naming it. Collective. */
static st_status st__job_restored(st_train_ckpt* c, st_status s, int64_t step) {
  bool fatal = s != ST_OK;
  st_status v = st__job_vote(c, step, "loading the checkpoint", &s, &fatal);
  if (v) {
    st_status_free(s);
    return v;
  }
  return s;
}

/* The schedule a resume continues with against the one the checkpoint
 * records (docs/checkpoints.md, "lr_schedule"). The same definition
 * continues the curve bitwise: st_plan_lr is a pure function of the step.
 * Another one is allowed, like any train.* change on resume (train.steps
 * moves cosine's curve too), and said: stderr names both and the lr of the
 * next step under each; the resumed event records both definitions. */
static void st__lr_schedule_resumed(const st_train_ckpt* c, const st_ckpt* ck, bool quiet, json_t* e) {
  json_t* rec = json_deep_copy(ck->lr_schedule);
  if (!rec) st_oom("the checkpoint's lr schedule");
  json_object_del(rec, "step");
  json_object_del(rec, "lr");
  st_json_put(e, "lr_schedule", json_incref(c->lr_schedule));
  st_plan_options was;
  if (!st_plan_lr_schedule_from_json(ck->lr_schedule, c->in.options, &was)) {
    /* written before schedules were recorded (train.lr_schedule was cosine) */
    json_decref(rec);
    st_json_put(e, "checkpoint_lr_schedule", json_null());
    st_json_put(e, "lr_schedule_changed", json_null());
    return;
  }
  const bool changed = !st_json_same(rec, c->lr_schedule);
  st_json_put(e, "checkpoint_lr_schedule", rec);
  st_json_put_bool(e, "lr_schedule_changed", changed);
  if (!changed || quiet) return;
  json_t* then_j = st_plan_lr_schedule_json(&was); /* the record in this run's key order, for reading side by side */
  char* then = st_json_dump(then_j, 0);
  json_decref(then_j);
  char* now = st_json_dump(c->lr_schedule, 0);
  const int64_t t = ck->step + 1;
  fprintf(stderr,
          "strata: note: the lr schedule differs from the checkpoint's: %s in the checkpoint, %s now; from step %lld the lr "
          "follows this run's (%.9g; the checkpoint's would be %.9g)\n",
          then, now, (long long)t, st_plan_lr(c->in.options, t), st_plan_lr(&was, t));
  free(then);
  free(now);
}

st_status st_train_ckpt_restore(st_train_ckpt* c, int64_t* out_step, bool* out_restored) {
  *out_step = 0;
  *out_restored = false;
  if (!c->resume) return ST_OK;
  double t0 = st_now();
  st_ckpt* ck = NULL;
  int skipped = 0;
  bool restoring = false;
  st_status s = st__pick(c, &ck, &skipped, &restoring);
  json_t* data_change = NULL;
  if (!s && ck) s = st__data_check(c, ck, &data_change);
  if (!s && ck) {
    s = st__load_state(c, ck);
    restoring = true;
  }
  s = st__job_restored(c, s, -1);
  if (s) {
    st_ckpt_free(ck);
    json_decref(data_change);
    return restoring ? st_status_annotate(s, "restoring") : s;
  }
  const bool quiet = c->job && st_dist_rank(c->in.dist) > 0; /* rank 0 says it for the job */
  if (!ck) {
    if (!quiet) fprintf(stderr, "strata: resume: no checkpoint in '%s' yet; starting from step 0\n", c->root);
    json_t* e = st_json_obj();
    st_json_put_int(e, "from_step", 0);
    st_json_put(e, "checkpoint", json_null());
    st_json_put_int(e, "restore_s", 0);
    st_json_put_int(e, "skipped", 0);
    return st_runlog_event(c->in.log, "resumed", e);
  }
  const st_plan_options* o = c->in.options;
  double restore_s = st_now() - t0;
  char* latest = st_ckpt_read_latest(c->root);
  const char* slash = strrchr(ck->dir, '/');
  const char* name = slash ? slash + 1 : ck->dir;
  bool changed = strcmp(ck->config_hash, c->config_hash) != 0;
  bool bundle_changed = strcmp(ck->bundle_key, c->key) != 0;
  if (bundle_changed && !quiet)
    fprintf(stderr, "strata: warning: %s was written with bundle %s, this run uses %s (allowed by ckpt.allow_bundle_change)\n", ck->dir,
            ck->bundle_key, c->key);
  /* Every tensor is whole in the file, and st_executor_put gives each device
   * its replica: any mesh the config accepts lays it out (docs/checkpoints.md).
   * The meshes compared are jobs' whole meshes, with their process counts. */
  const bool job_mesh = o->procs > 1;
  int now[5] = {job_mesh ? o->global_data : o->parallel_data, job_mesh ? o->global_fsdp : o->parallel_fsdp,
                job_mesh ? o->global_tensor : o->parallel_tensor, o->procs, o->parallel_pipeline};
  int was[5] = {ck->mesh_data, ck->mesh_fsdp, ck->mesh_tensor, ck->mesh_processes, ck->mesh_pipeline};
  for (int a = 0; a < 5; ++a) {
    if (now[a] < 1) now[a] = 1;
    if (was[a] < 1) was[a] = 1;
  }
  if (memcmp(now, was, sizeof(now)) && !quiet) {
    char pn[40] = "", pw[40] = "", sn[24] = "", sw[24] = "";
    if (now[3] > 1 || was[3] > 1) {
      snprintf(pn, sizeof(pn), ", %d process%s", now[3], now[3] == 1 ? "" : "es");
      snprintf(pw, sizeof(pw), ", %d process%s", was[3], was[3] == 1 ? "" : "es");
    }
    if (now[4] > 1 || was[4] > 1) {
      snprintf(sn, sizeof(sn), " pipeline=%d", now[4]);
      snprintf(sw, sizeof(sw), " pipeline=%d", was[4]);
    }
    fprintf(stderr, "strata: %s was written on mesh data=%d fsdp=%d tensor=%d%s (%d devices%s); this run: data=%d fsdp=%d tensor=%d%s (%d devices%s). "
            "%s; losses continue within rounding, not bitwise\n",
            ck->dir, was[0], was[1], was[2], sw, was[0] * was[1] * was[2] * was[4], pw, now[0], now[1], now[2], sn,
            now[0] * now[1] * now[2] * now[4], pn,
            ck->whole_count > 0 ? "Its tensors are assembled whole from the ranks' rows, and each device gets its part"
                                : "Its tensors are whole, so each device gets its replica");
  }
  if (!quiet)
    fprintf(stderr, "strata: resuming from %s (step %lld)%s\n", ck->dir, (long long)ck->step,
            changed ? "; the config differs from the checkpoint's (see the resumed event)" : "");
  char* notes = ck->identity_report ? st_ckpt_identity_notes(ck->identity_report, "in the checkpoint") : NULL;
  if (notes && notes[0] && !quiet) fprintf(stderr, "strata: note: %s: %s\n", ck->dir, notes);
  free(notes);
  json_t* e = st_json_obj();
  st_json_put_int(e, "from_step", ck->step);
  st_json_put_str(e, "checkpoint", ck->dir);
  if (ck->identity_report) st_json_put(e, "identity", json_incref(ck->identity_report));
  st_json_put(e, "restore_s", st_json_fixed(restore_s, 6));
  st_json_put_int(e, "skipped", skipped);
  st_json_put(e, "latest", latest ? st_json_str(latest) : json_null());
  st_json_put_bool(e, "latest_was_newest_valid", latest && !strcmp(latest, name));
  st_json_put_str(e, "config_hash", c->config_hash);
  st_json_put_str(e, "checkpoint_config_hash", ck->config_hash);
  st_json_put_str(e, "bundle_key", c->key);
  st_json_put_str(e, "checkpoint_bundle_key", ck->bundle_key);
  st__lr_schedule_resumed(c, ck, quiet, e);
  if (data_change) st_json_put(e, "data_changed", data_change);
  const char* axis[3] = {"data", "fsdp", "tensor"};
  json_t* mesh_now = st_json_obj();
  json_t* mesh_was = st_json_obj();
  for (int a = 0; a < 3; ++a) {
    st_json_put_int(mesh_now, axis[a], now[a]);
    st_json_put_int(mesh_was, axis[a], was[a]);
  }
  st_json_put_int(mesh_now, "devices", now[0] * now[1] * now[2] * now[4]);
  st_json_put_int(mesh_was, "devices", was[0] * was[1] * was[2] * was[4]);
  if (now[4] > 1) st_json_put_int(mesh_now, "pipeline", now[4]);
  if (was[4] > 1) st_json_put_int(mesh_was, "pipeline", was[4]);
  /* Only for a job, as in the manifest: a one-process record is as before. */
  if (now[3] > 1) st_json_put_int(mesh_now, "processes", now[3]);
  if (was[3] > 1) st_json_put_int(mesh_was, "processes", was[3]);
  st_json_put(e, "mesh", mesh_now);
  /* null: written before manifests recorded the mesh (one device) */
  if (ck->mesh_devices > 0)
    st_json_put(e, "checkpoint_mesh", mesh_was);
  else {
    json_decref(mesh_was);
    st_json_put(e, "checkpoint_mesh", json_null());
  }
  s = st_runlog_event(c->in.log, "resumed", e);
  free(latest);
  *out_step = ck->step;
  *out_restored = true;
  c->start_step = ck->step;
  st_ckpt_free(ck);
  return s;
}

static st_status st__collect(st_train_ckpt* c, bool wait, double* waited_s);

st_status st_train_ckpt_rollback(st_train_ckpt* c, int64_t before_step, int64_t* out_step, char** out_dir) {
  *out_step = -1;
  *out_dir = NULL;
  /* A save in flight may be the newest checkpoint: let it land first. */
  ST_RETURN(st__collect(c, true, NULL));
  st_ckpt_expect expect;
  st__expect(c, &expect);
  st_ckpt* ck = NULL;
  int skipped = 0;
  st_status s = !c->job || st_dist_rank(c->in.dist) == 0 ? st_ckpt_find_valid(c->root, &expect, st__on_skip, c, &ck, &skipped) : ST_OK;
  bool opening = false;
  s = st__job_share(c, s, &ck, &opening);
  if (!s && ck && ck->step >= before_step)
    s = st_status_make(ST_CODE_INTERNAL, "rollback before step %lld found %s of step %lld", (long long)before_step, ck->dir,
                       (long long)ck->step);
  if (!s && ck) s = st__load_state(c, ck);
  s = st__job_restored(c, s, -1 - before_step); /* load tags are negative, save tags the step */
  if (!s && ck) {
    *out_step = ck->step;
    *out_dir = st_xstrdup(ck->dir);
  }
  st_ckpt_free(ck);
  return s;
}

/*===-------------------------------------------------------------------===*/
/* Save                                                                     */
/*===-------------------------------------------------------------------===*/

void st_train_ckpt_step_ran(st_train_ckpt* c, int64_t step) {
  if (st_faults_fire_at_step(c->faults, step)) st_status_free(st__collect(c, true, NULL));
  st_faults_at_step(c->faults, step);
}

/* Logs one finished save; applies ckpt.on_error to a failed one. */
static st_status st__report(st_train_ckpt* c, st_ckpt_save_result* r, double blocking_s, double waited_s, bool last) {
  st_status s = ST_OK;
  st__watch_end(c); /* a failed save never reached its commit */
  if (!r->status) {
    double mbps = r->write_s > 0 ? (double)r->bytes / 1e6 / r->write_s : 0;
    json_t* e = st_json_obj();
    st_json_put_int(e, "step", r->step);
    st_json_put_str(e, "dir", r->dir);
    st_json_put(e, "blocking_s", st_json_fixed(blocking_s, 6));
    st_json_put(e, "waited_for_previous_s", st_json_fixed(waited_s, 6));
    st_json_put(e, "write_s", st_json_fixed(r->write_s, 6));
    st_json_put_int(e, "bytes", r->bytes);
    st_json_put(e, "mb_per_s", st_json_fixed(mbps, 1));
    st_json_put_int(e, "removed", r->removed);
    st_json_put_bool(e, "async", c->async && !c->streaming);
    st_json_put_str(e, "staging", c->streaming ? "chunked" : "full");
    c->last_saved_step = r->step;
    s = st_runlog_event(c->in.log, "ckpt_saved", e);
    json_t* m = st_json_obj();
    st_json_put_int(m, "step", r->step);
    st_json_put(m, "ckpt_blocking_s", st_json_fixed(blocking_s, 6));
    st_json_put(m, "ckpt_write_s", st_json_fixed(r->write_s, 6));
    st_json_put_int(m, "ckpt_bytes", r->bytes);
    st_json_put(m, "ckpt_mb_per_s", st_json_fixed(mbps, 1));
    if (!s)
      s = st_runlog_metrics(c->in.log, m);
    else
      json_decref(m);
  } else {
    bool stop = c->stop_on_error;
    fprintf(stderr, "strata: checkpoint at step %lld FAILED: %s; %s\n", (long long)r->step, st_status_message(r->status),
            stop ? "stopping (ckpt.on_error=stop)" : last ? "the run ends without its final checkpoint (ckpt.on_error=continue)"
                                                          : "training continues (ckpt.on_error=continue)");
    json_t* e = st_json_obj();
    st_json_put_int(e, "step", r->step);
    st_json_put_str(e, "error", st_status_message(r->status));
    st_json_put_str(e, "on_error", stop ? "stop" : "continue");
    st_json_put(e, "write_s", st_json_fixed(r->write_s, 6));
    s = st_runlog_event(c->in.log, "ckpt_failed", e);
    if (stop && !s) {
      s = r->status;
      r->status = ST_OK;
      s = st_status_annotate(s, "saving a checkpoint (ckpt.on_error=stop; the previous checkpoint is intact)");
    }
  }
  st_ckpt_save_result_clear(r);
  return s;
}

/* A save's end: in a job the ranks vote on it (the commit protocol's
 * last vote: every rank learns the checkpoint is committed, or that it
 * failed, at the same point), then it is reported, and ckpt.on_error
 * applied, alike on every rank. */
static st_status st__ckpt_finish(st_train_ckpt* c, st_ckpt_save_result* r, double blocking_s, double waited_s, bool last, bool fatal) {
  char what[64];
  snprintf(what, sizeof(what), "the checkpoint of step %lld", (long long)r->step);
  st_status v = st__job_vote(c, r->step, what, &r->status, &fatal);
  if (v || fatal) {
    /* The exchange failed, or some rank's snapshot did: the run stops. */
    st__watch_end(c);
    st_status e = v ? v : r->status;
    if (v) st_status_free(r->status);
    r->status = ST_OK;
    st_ckpt_save_result_clear(r);
    return e;
  }
  if ((c->in.no_save || (c->rows && c->rank > 0)) && !r->status) return st__report_committed(c, r);
  return st__report(c, r, blocking_s, waited_s, last);
}

/* Reports a save the writer finished; |wait| blocks for one in flight. In
 * a job a background save is reported only where every rank waits for it
 * (the next save, a stop's save, a rollback): a look between steps would
 * find it done on some ranks and not on others. */
static st_status st__collect(st_train_ckpt* c, bool wait, double* waited_s) {
  if (waited_s) *waited_s = 0;
  if (!c->inflight || (c->job && !wait)) return ST_OK;
  double t0 = st_now();
  st_ckpt_save_result r = {.step = c->inflight_step};
  if (c->writer && !st_ckpt_writer_take(c->writer, wait, &r)) return ST_OK;
  if (waited_s) *waited_s = st_now() - t0;
  c->inflight = false;
  return st__ckpt_finish(c, &r, c->inflight_blocking_s, c->inflight_waited_s, false, false);
}

/* A streaming snapshot's tensor |i|, copied when the save writes it. */
static st_status st__fill(void* user, int i, void* dst, size_t size) {
  st_train_ckpt* c = user;
  st_status s = st_executor_to_host(c->in.executor, c->slots[i], dst, size);
  if (s) return st_status_recode(s, ST_CODE_CKPT, "checkpoint: copying state slot '%s'", c->names[i]);
  return ST_OK;
}

/* What the manifest records besides tensors, for a save of |step|. */
static st_status st__set_meta(st_train_ckpt* c, int64_t step) {
  const st_plan_options* o = c->in.options;
  json_t* contract = NULL;
  ST_RETURN(st_train_data_contract(c->in.data, (uint64_t)(step * o->batch_size), &contract));
  st_ckpt_meta m = {
      .step = step,
      .optimizer_step = step,
      .data_position = step * o->batch_size,
      .batch_size = o->batch_size,
      .seed = o->seed,
      .lr = st_plan_lr(o, step),
      .total_steps = o->steps,
      .lr_schedule = c->lr_schedule,
      .data_contract = contract,
      .config = c->config,
      .config_hash = c->config_hash,
      .bundle_key = c->key,
      .tokenizer_hash = st_dataset_tokenizer_hash(c->in.data),
      .model = c->desc,
      /* The job's whole mesh, not this process's part of it. */
      .mesh_data = o->procs > 1 ? o->global_data : o->parallel_data,
      .mesh_fsdp = o->procs > 1 ? o->global_fsdp : o->parallel_fsdp,
      .mesh_tensor = o->procs > 1 ? o->global_tensor : o->parallel_tensor,
      .mesh_pipeline = o->parallel_pipeline,
      .mesh_processes = o->procs,
  };
  st_ckpt_snapshot_set_meta(c->snap, &m); /* copies the contract */
  json_decref(contract);
  return ST_OK;
}

/* Per-rank shards: this rank's rows of every tensor it holds any of into
 * its snapshot. Its block of a slot cut across the processes starts at its
 * first row (the block is zero-padded past the tensor's end); a slot not
 * cut is whole on rank 0. */
static st_status st__snapshot_rows(st_train_ckpt* c, int64_t step) {
  st_status s = ST_OK;
  unsigned char* tmp = NULL;
  size_t tmp_size = 0;
  for (int k = 0; k < st_ckpt_snapshot_count(c->snap) && !s; ++k) {
    const int i = c->row_index[k];
    st_buffer* b = st_executor_get(c->in.executor, c->slots[i]);
    if (!b) {
      s = st_status_make(ST_CODE_INTERNAL, "checkpoint: state slot '%s' is empty at the end of step %lld", c->names[i], (long long)step);
      break;
    }
    const size_t n = st_buffer_bytes(b);
    if (n > tmp_size) {
      free(tmp);
      tmp = st_xmalloc(n);
      tmp_size = n;
    }
    int64_t r0 = 0, r1 = 0;
    st_ckpt_rows_of(c->types[i].dims[0], c->parts[i], c->rank, &r0, &r1);
    st_tensor_type piece = c->types[i];
    piece.dims[0] = r1 - r0;
    const size_t want = st_tensor_type_bytes(&piece);
    s = want <= n ? st_buffer_to_host(b, tmp, n)
                  : st_status_make(ST_CODE_INTERNAL, "slot '%s' holds %zu bytes, its rows %zu", c->names[i], n, want);
    if (!s) memcpy(st_ckpt_snapshot_data(c->snap, k), tmp, want);
  }
  free(tmp);
  if (s) return st_status_recode(s, ST_CODE_CKPT, "checkpoint snapshot at step %lld", (long long)step);
  ST_RETURN(st__set_meta(c, step));
  c->snap_filled = true;
  return ST_OK;
}

/* Device -> host copy of the whole state into the snapshot: all copies are
 * started, then awaited, so they overlap each other. A streaming snapshot
 * copies nothing now (st__fill does, tensor by tensor, while it is saved). */
static st_status st__snapshot(st_train_ckpt* c, int64_t step) {
  st_status s = ST_OK;
  int started = 0;
  for (int i = 0; i < c->count && !s && !c->streaming; ++i) {
    const st_slot* sl = &c->in.plan->slots[c->slots[i]];
    if (c->in.plan->devices > 1 && sl->layout == ST_LAYOUT_SHARDED) {
      /* Reassembled from every device's block, synchronously. */
      s = st_executor_to_host(c->in.executor, c->slots[i], st_ckpt_snapshot_data(c->snap, i), st_tensor_type_bytes(&c->types[i]));
      continue;
    }
    st_buffer* b = st_executor_get(c->in.executor, c->slots[i]);
    if (!b) {
      s = st_status_make(ST_CODE_INTERNAL, "checkpoint: state slot '%s' is empty at the end of step %lld", c->names[i], (long long)step);
      break;
    }
    s = st_buffer_to_host_async(b, st_ckpt_snapshot_data(c->snap, i), st_tensor_type_bytes(&c->types[i]), &c->events[i]);
    if (!s) started = i + 1;
  }
  for (int i = 0; i < started; ++i) {
    if (!c->events[i]) continue; /* a sharded slot, copied already */
    st_status w = st_event_await(c->events[i]);
    s = st_status_join(s, w);
    st_event_destroy(c->events[i]);
    c->events[i] = NULL;
  }
  if (s) return st_status_recode(s, ST_CODE_CKPT, "checkpoint snapshot at step %lld", (long long)step);
  ST_RETURN(st__set_meta(c, step));
  c->snap_filled = !c->streaming;
  return ST_OK;
}

/* Per-rank shards, the commit protocol's vote (docs/multiprocess.md,
 * "The commit protocol"): every rank gives its write's outcome and its
 * file's records (size, xxh64, each tensor's offset and xxh64; doubles
 * hold 64-bit hashes as two halves). On return every rank holds the same
 * verdict, as st__job_vote's, and rank 0 (recs non-NULL) every rank's
 * records. */
static st_status st__rows_vote(st_train_ckpt* c, int64_t step, st_status* io, bool* io_fatal, const st_ckpt_part* mine,
                               st_ckpt_part* recs) {
  const int P = c->nranks;
  const size_t n = 6 + 3 * (size_t)c->count;
  double* in = st_xcalloc(n, sizeof(double));
  in[0] = (double)step;
  in[1] = (double)st_status_code(*io);
  in[2] = *io_fatal ? 1.0 : 0.0;
  in[3] = (double)mine->bytes;
  in[4] = (double)(mine->xxh64 >> 32);
  in[5] = (double)(mine->xxh64 & 0xffffffffu);
  for (int i = 0; !*io && i < c->count; ++i) {
    in[6 + 3 * (size_t)i] = (double)mine->offsets[i];
    in[7 + 3 * (size_t)i] = (double)(mine->hashes[i] >> 32);
    in[8 + 3 * (size_t)i] = (double)(mine->hashes[i] & 0xffffffffu);
  }
  double* all = st_xmalloc((size_t)P * n * sizeof(double));
  st_status s = st_dist_allgather_f64(c->in.dist, in, n, all);
  int failed = -1;
  for (int r = 0; !s && r < P; ++r) {
    const double* v = all + n * (size_t)r;
    if (v[0] != (double)step)
      s = st_status_make(ST_CODE_INTERNAL, "rank %d is at the checkpoint of step %lld, rank %d at tag %lld: the ranks' checkpoints "
                         "are out of step", c->rank, (long long)step, r, (long long)v[0]);
    if (v[1] != 0 && failed < 0) failed = r;
    if (v[2] != 0) *io_fatal = true;
    if (!recs) continue;
    recs[r].bytes = (size_t)v[3];
    recs[r].xxh64 = ((uint64_t)v[4] << 32) | (uint64_t)v[5];
    recs[r].offsets = st_xcalloc((size_t)c->count + 1, sizeof(size_t));
    recs[r].hashes = st_xcalloc((size_t)c->count + 1, sizeof(uint64_t));
    for (int i = 0; i < c->count; ++i) {
      recs[r].offsets[i] = (size_t)v[6 + 3 * (size_t)i];
      recs[r].hashes[i] = ((uint64_t)v[7 + 3 * (size_t)i] << 32) | (uint64_t)v[8 + 3 * (size_t)i];
    }
  }
  if (!s && failed >= 0 && !*io)
    *io = st_status_make((st_code)(int)all[n * (size_t)failed + 1],
                         "rank %d failed writing its part of the checkpoint of step %lld (its error is on rank %d's stderr and in its "
                         "events.jsonl)",
                         failed, (long long)step, failed);
  free(in);
  free(all);
  return s ? st_status_annotate(s, "agreeing between processes on the checkpoint of step %lld", (long long)step) : ST_OK;
}

/* A save of per-rank shards, synchronous on every rank: snapshot of this
 * rank's rows, its file written and fsynced, the vote; then rank 0 commits
 * (manifest, rename, LATEST) or, when any rank failed, removes the folder;
 * the last vote tells every rank the outcome (st__ckpt_finish). A rank
 * killed before the vote leaves only a .tmp- folder: nobody commits. */
static st_status st__save_rows(st_train_ckpt* c, int64_t step, bool last, double t0, double waited) {
  st_status s = st__snapshot_rows(c, step);
  bool fatal = s != ST_OK;
  st_ckpt_part mine = {0};
  if (!s) s = st_ckpt_save_rank(&c->save_opts, c->snap, step, c->row_index, c->count, &mine);
  st_ckpt_part* recs = c->rank == 0 ? st_xcalloc((size_t)c->nranks + 1, sizeof(st_ckpt_part)) : NULL;
  st_status v = st__rows_vote(c, step, &s, &fatal, &mine, recs);
  st_ckpt_part_clear(&mine);
  st_ckpt_save_result r = {.step = step, .status = s};
  if (!v && c->rank == 0) {
    if (!s && !fatal)
      r.status = st_ckpt_commit_ranks(&c->save_opts, st_ckpt_snapshot_meta(c->snap), c->count, c->names, c->types, c->parts,
                                      c->nranks, recs, &r);
    else
      st_ckpt_abort_ranks(c->root, step);
  }
  for (int q = 0; recs && q < c->nranks; ++q) st_ckpt_part_clear(&recs[q]);
  free(recs);
  if (v) {
    st_ckpt_save_result_clear(&r);
    return v;
  }
  /* The last vote: rank 0's commit decides; every other rank gives the
   * write's verdict, which every rank holds alike already. */
  return st__ckpt_finish(c, &r, st_now() - t0, waited, last, fatal);
}

static st_status st__save(st_train_ckpt* c, int64_t step, bool last) {
  double t0 = st_now();
  double waited = 0;
  /* Back-pressure: the previous save must be done before the snapshot it
   * reads is overwritten. */
  ST_RETURN(st__collect(c, true, &waited));
  if (c->rows) return st__save_rows(c, step, last, t0, waited);
  /* On the writer thread, or on this one: the same choice on every rank of
   * a job (ckpt.async and the staging are). */
  const bool background = c->async && !last && !c->streaming;
  /* A rank that writes no files (st_train_ckpt_init.no_save) has done its
   * part at once; it takes part in the job's votes all the same. */
  st_status s = c->in.no_save ? ST_OK : st__snapshot(c, step);
  if (!s && background && !c->in.no_save) s = st_ckpt_writer_submit(c->writer, c->snap);
  /* A snapshot or hand-off that failed stops the run whatever
   * ckpt.on_error says; in a job every rank learns it in the save's vote. */
  const bool fatal = s != ST_OK;
  if (background && c->job) {
    /* The first vote of a background save: every rank's state is in its
     * snapshot and on its writer (the last comes where it is collected). */
    char what[64];
    snprintf(what, sizeof(what), "the snapshot for the checkpoint of step %lld", (long long)step);
    bool any_fatal = fatal;
    st_status v = st__job_vote(c, step, what, &s, &any_fatal);
    if (v) {
      st_status_free(s);
      return v;
    }
  }
  if (s && (!c->job || background)) return s;
  if (background) {
    c->inflight = true;
    c->inflight_step = step;
    c->inflight_blocking_s = st_now() - t0;
    c->inflight_waited_s = waited;
    return ST_OK;
  }
  st_ckpt_save_result r = {.step = step, .status = s};
  if (!s && !c->in.no_save) {
    /* The last save, or ckpt.async=false: the run waits for it, so it runs
     * on this thread (the writer is idle: collected above) and may draw its
     * progress, which a background save must not (it would cut into the
     * step line). */
    st_ckpt_save_options so = c->save_opts;
    so.progress = c->in.options->long_progress;
    r.status = st_ckpt_save(&so, c->snap, &r);
  }
  return st__ckpt_finish(c, &r, st_now() - t0, waited, last, fatal);
}

st_status st_train_ckpt_step_done(st_train_ckpt* c, int64_t step) {
  if (!c->first_step_logged) {
    c->first_step_logged = true;
    /* The supervisor's "first good step" after a restart (RTO). */
    json_t* f = st_json_obj();
    st_json_put_int(f, "step", step);
    st_json_put(f, "since_start_s", st_json_fixed(st_now() - c->t_created, 6));
    ST_RETURN(st_runlog_event(c->in.log, "first_step", f));
  }
  if (c->in.disabled) return ST_OK;
  ST_RETURN(st__collect(c, false, NULL));
  bool last = step >= c->in.options->steps;
  if (last || (c->every > 0 && step % c->every == 0)) return st__save(c, step, last);
  return ST_OK;
}

st_status st_train_ckpt_save_now(st_train_ckpt* c, int64_t step) {
  if (c->in.disabled) return ST_OK;
  /* A save of this very step may be in flight (it was due): wait for it
   * rather than write the same checkpoint twice. */
  ST_RETURN(st__collect(c, true, NULL));
  if (c->last_saved_step != step) ST_RETURN(st__save(c, step, true));
  if (c->last_saved_step != step)
    return st_status_make(ST_CODE_CKPT, "the checkpoint at step %lld failed (ckpt_failed in events.jsonl); resume starts from the newest valid one",
                          (long long)step);
  return ST_OK;
}

void st_train_ckpt_destroy(st_train_ckpt* c) {
  if (!c) return;
  if (c->writer && c->inflight) {
    st_ckpt_save_result r;
    if (st_ckpt_writer_take(c->writer, true, &r)) st_status_free(st__report(c, &r, c->inflight_blocking_s, c->inflight_waited_s, false));
  }
  st_ckpt_writer_destroy(c->writer);
  st_faults_destroy(c->faults);
  st_ckpt_snapshot_destroy(c->snap);
  free(c->events);
  free(c->slots);
  free(c->names);
  free(c->files);
  free(c->types);
  free(c->parts);
  free(c->row_index);
  json_decref(c->config);
  json_decref(c->lr_schedule);
  json_decref(c->model);
  json_decref(c->desc);
  json_decref(c->implied);
  free(c->root);
  free(c);
}

int64_t st_train_ckpt_staging_bytes(const st_train_ckpt* c, bool* out_filled) {
  if (out_filled) *out_filled = c && c->snap_filled;
  return c && c->snap ? st_ckpt_snapshot_staging_bytes(c->snap) : 0;
}
