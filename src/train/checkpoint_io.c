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
  json_t* model;  /* the sparse model JSON with the whole microbatch: its key is the one-device bundle key */
  json_t* desc;   /* the model description with the whole microbatch: the manifest's "model", the identity */
  json_t* implied; /* st_plan_model_implied: what an older manifest's missing fields meant */
  char key[17];   /* the one-device bundle key of |model|: the same on every mesh */
  char config_hash[17];
  int64_t last_saved_step; /* of the newest save that succeeded; 0: none yet */
  bool first_step_logged;
  double t_created;
  int64_t start_step;
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
      /* A sharded slot is saved whole (st_executor_to_host reassembles it). */
      c->types[c->count] = p->devices > 1 && s->layout == ST_LAYOUT_SHARDED ? s->logical : s->type;
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
  c->snap = c->streaming ? st_ckpt_snapshot_create_streaming(c->count, c->names, c->files, c->types, st__fill, c)
                         : st_ckpt_snapshot_create(c->count, c->names, c->files, c->types);
  c->events = st_xcalloc((size_t)c->count + 1, sizeof(st_event*));

  c->config = st_config_json(cfg);
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
  st_status s = c->model && c->desc ? ST_OK : st_status_make(ST_CODE_INTERNAL, "the options carry no model JSON (not built from a config)");
  if (!s) st_json_put_int(c->desc, "microbatch_size", o->batch_size / (o->microbatches > 0 ? o->microbatches : 1));
  if (!s && o->mesh[0]) {
    st_json_put_int(c->model, "microbatch_size", o->batch_size / (o->microbatches > 0 ? o->microbatches : 1));
    char* text = st_json_dump(c->model, 0);
    st_bundle_key(&(st_bundle_request){.model_json = text}, c->key);
    free(text);
  } else if (!s) {
    snprintf(c->key, sizeof(c->key), "%s", in->bundle->key);
  }
  st_config_hash(cfg, NULL, 0, c->config_hash);

  if (!s) s = st_faults_create(&o->faults, in->run_dir, &c->faults);
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
  if (!s && c->async) s = st_ckpt_writer_create(&c->save_opts, &c->writer);
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

st_status st_train_ckpt_restore(st_train_ckpt* c, int64_t* out_step, bool* out_restored) {
  *out_step = 0;
  *out_restored = false;
  if (!c->resume) return ST_OK;
  double t0 = st_now();
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
  st_ckpt* ck = NULL;
  int skipped = 0;
  ST_RETURN(st_ckpt_find_valid(c->root, &expect, st__on_skip, c, &ck, &skipped));
  if (!ck) {
    if (skipped > 0)
      return st_status_make(ST_CODE_CKPT,
                            "no valid checkpoint in '%s': all %d were skipped (reasons above and in events.jsonl); corrupt data is "
                            "never loaded. To start over, use a new run.dir (or move '%s' away)",
                            c->root, skipped, c->root);
    fprintf(stderr, "strata: resume: no checkpoint in '%s' yet; starting from step 0\n", c->root);
    json_t* e = st_json_obj();
    st_json_put_int(e, "from_step", 0);
    st_json_put(e, "checkpoint", json_null());
    st_json_put_int(e, "restore_s", 0);
    st_json_put_int(e, "skipped", 0);
    return st_runlog_event(c->in.log, "resumed", e);
  }
  const st_plan_options* o = c->in.options;
  st_status s = ST_OK;
  if (ck->data_position != ck->step * o->batch_size)
    s = st_status_make(ST_CODE_CKPT,
                       "%s: consumed %lld training sequences in %lld steps; with train.batch_size=%lld the sampler would be at %lld. "
                       "Resume with the batch size the checkpoint was written with (%lld)",
                       ck->dir, (long long)ck->data_position, (long long)ck->step, (long long)o->batch_size,
                       (long long)(ck->step * o->batch_size), (long long)ck->batch_size);
  if (!s && ck->step > o->steps)
    s = st_status_make(ST_CODE_CKPT, "%s: is at step %lld, past train.steps=%lld; raise train.steps to continue", ck->dir,
                       (long long)ck->step, (long long)o->steps);
  if (!s) s = st__load_state(c, ck);
  if (s) {
    st_ckpt_free(ck);
    return st_status_annotate(s, "restoring");
  }
  double restore_s = st_now() - t0;
  char* latest = st_ckpt_read_latest(c->root);
  const char* slash = strrchr(ck->dir, '/');
  const char* name = slash ? slash + 1 : ck->dir;
  bool changed = strcmp(ck->config_hash, c->config_hash) != 0;
  bool bundle_changed = strcmp(ck->bundle_key, c->key) != 0;
  if (bundle_changed)
    fprintf(stderr, "strata: warning: %s was written with bundle %s, this run uses %s (allowed by ckpt.allow_bundle_change)\n", ck->dir,
            ck->bundle_key, c->key);
  /* Every tensor is whole in the file, and st_executor_put gives each device
   * its replica: any mesh the config accepts lays it out (docs/checkpoints.md). */
  int now[3] = {o->parallel_data > 0 ? o->parallel_data : 1, o->parallel_fsdp > 0 ? o->parallel_fsdp : 1,
                o->parallel_tensor > 0 ? o->parallel_tensor : 1};
  int was[3] = {ck->mesh_data > 0 ? ck->mesh_data : 1, ck->mesh_fsdp > 0 ? ck->mesh_fsdp : 1, ck->mesh_tensor > 0 ? ck->mesh_tensor : 1};
  if (memcmp(now, was, sizeof(now)))
    fprintf(stderr, "strata: %s was written on mesh data=%d fsdp=%d tensor=%d (%d devices); this run: data=%d fsdp=%d tensor=%d (%d devices). "
            "Its tensors are whole, so each device gets its replica; losses continue within rounding, not bitwise\n",
            ck->dir, was[0], was[1], was[2], was[0] * was[1] * was[2], now[0], now[1], now[2], now[0] * now[1] * now[2]);
  fprintf(stderr, "strata: resuming from %s (step %lld)%s\n", ck->dir, (long long)ck->step,
          changed ? "; the config differs from the checkpoint's (see the resumed event)" : "");
  char* notes = ck->identity_report ? st_ckpt_identity_notes(ck->identity_report, "in the checkpoint") : NULL;
  if (notes && notes[0]) fprintf(stderr, "strata: note: %s: %s\n", ck->dir, notes);
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
  const char* axis[3] = {"data", "fsdp", "tensor"};
  json_t* mesh_now = st_json_obj();
  json_t* mesh_was = st_json_obj();
  for (int a = 0; a < 3; ++a) {
    st_json_put_int(mesh_now, axis[a], now[a]);
    st_json_put_int(mesh_was, axis[a], was[a]);
  }
  st_json_put_int(mesh_now, "devices", now[0] * now[1] * now[2]);
  st_json_put_int(mesh_was, "devices", was[0] * was[1] * was[2]);
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
  ST_RETURN(st_ckpt_find_valid(c->root, &expect, st__on_skip, c, &ck, &skipped));
  if (!ck) return ST_OK;
  st_status s = ST_OK;
  if (ck->step >= before_step)
    s = st_status_make(ST_CODE_INTERNAL, "rollback before step %lld found %s of step %lld", (long long)before_step, ck->dir,
                       (long long)ck->step);
  if (!s) s = st__load_state(c, ck);
  if (!s) {
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

/* Reports a save the writer finished; |wait| blocks for one in flight. */
static st_status st__collect(st_train_ckpt* c, bool wait, double* waited_s) {
  if (waited_s) *waited_s = 0;
  if (!c->writer || !c->inflight) return ST_OK;
  double t0 = st_now();
  st_ckpt_save_result r;
  if (!st_ckpt_writer_take(c->writer, wait, &r)) return ST_OK;
  if (waited_s) *waited_s = st_now() - t0;
  c->inflight = false;
  return st__report(c, &r, c->inflight_blocking_s, c->inflight_waited_s, false);
}

/* A streaming snapshot's tensor |i|, copied when the save writes it. */
static st_status st__fill(void* user, int i, void* dst, size_t size) {
  st_train_ckpt* c = user;
  st_status s = st_executor_to_host(c->in.executor, c->slots[i], dst, size);
  if (s) return st_status_recode(s, ST_CODE_CKPT, "checkpoint: copying state slot '%s'", c->names[i]);
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
  const st_plan_options* o = c->in.options;
  st_ckpt_meta m = {
      .step = step,
      .optimizer_step = step,
      .data_position = step * o->batch_size,
      .batch_size = o->batch_size,
      .seed = o->seed,
      .lr = st_plan_lr(o, step),
      .total_steps = o->steps,
      .config = c->config,
      .config_hash = c->config_hash,
      .bundle_key = c->key,
      .tokenizer_hash = st_dataset_tokenizer_hash(c->in.data),
      .model = c->desc,
      .mesh_data = o->parallel_data,
      .mesh_fsdp = o->parallel_fsdp,
      .mesh_tensor = o->parallel_tensor,
  };
  st_ckpt_snapshot_set_meta(c->snap, &m);
  c->snap_filled = !c->streaming;
  return ST_OK;
}

static st_status st__save(st_train_ckpt* c, int64_t step, bool last) {
  if (c->in.no_save) {
    c->last_saved_step = step; /* rank 0 saved it (st_train_ckpt_init.no_save) */
    return ST_OK;
  }
  double t0 = st_now();
  double waited = 0;
  /* Back-pressure: the previous save must be done before the snapshot it
   * reads is overwritten. */
  ST_RETURN(st__collect(c, true, &waited));
  ST_RETURN(st__snapshot(c, step));
  if (c->writer && !last && !c->streaming) {
    ST_RETURN(st_ckpt_writer_submit(c->writer, c->snap));
    c->inflight = true;
    c->inflight_step = step;
    c->inflight_blocking_s = st_now() - t0;
    c->inflight_waited_s = waited;
    return ST_OK;
  }
  /* The last save, or ckpt.async=false: the run waits for it, so it runs
   * on this thread (the writer is idle: collected above) and may draw its
   * progress, which a background save must not (it would cut into the
   * step line). */
  st_ckpt_save_options so = c->save_opts;
  so.progress = c->in.options->long_progress;
  st_ckpt_save_result r;
  r.status = st_ckpt_save(&so, c->snap, &r);
  return st__report(c, &r, st_now() - t0, waited, last);
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
  ST_RETURN(st__collect(c, false, NULL));
  bool last = step >= c->in.options->steps;
  if (last || (c->every > 0 && step % c->every == 0)) return st__save(c, step, last);
  return ST_OK;
}

st_status st_train_ckpt_save_now(st_train_ckpt* c, int64_t step) {
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
  json_decref(c->config);
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
