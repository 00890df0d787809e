/* checkpoint.c — checkpoint folders: snapshot, atomic save, retention,
 * verification, discovery of the newest valid one (docs/checkpoints.md).
 *
 * The commit recipe is the one databases use for their own files: write
 * everything under a name no reader looks at, make it durable, then make it
 * visible with one rename, then make the rename durable. A reader only ever
 * sees step_<N> folders that were complete and fsynced before the rename;
 * a crash leaves at worst a .tmp-* folder, which nothing treats as a
 * checkpoint and the next resume deletes. Verification on load is the
 * second line of defence: against bit rot, truncation, and tampering. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"

const char* st_ckpt_point_name(st_ckpt_point p) {
  switch (p) {
    case ST_CKPT_AT_BEGIN: return "begin";
    case ST_CKPT_AT_FILE_MIDDLE: return "file_middle";
    case ST_CKPT_AT_FILE_DONE: return "file_done";
    case ST_CKPT_AT_MANIFEST: return "manifest";
    case ST_CKPT_AT_RENAMED: return "renamed";
    case ST_CKPT_AT_COMMITTED: return "committed";
    case ST_CKPT_POINT_COUNT: break;
  }
  return "?";
}

/*===-------------------------------------------------------------------===*/
/* Snapshot                                                                 */
/*===-------------------------------------------------------------------===*/

struct st_ckpt_snapshot {
  int count;
  char** names;
  char** files;
  st_tensor_type* types;
  void** data;
  int64_t bytes;
  st_ckpt_meta meta;
  char* strs[3];  /* owned copies behind meta's strings */
  json_t* trees[4]; /* owned copies behind meta's config, model, lr_schedule and data_contract */
  /* Streaming (st_ckpt_snapshot_create_streaming): no data[]; the save
   * fills one tensor at a time into a staging buffer of the largest. */
  st_ckpt_fill_fn fill;
  void* fill_user;
};

/* The tables of a snapshot of |count| tensors; no data is allocated here:
 * a copying snapshot allocates each tensor at the first
 * st_ckpt_snapshot_data, i.e. the first save, so a run that saves only at
 * its end does not hold a second copy of the state for all its steps
 * (issue 18; the first save pays the page faults, later ones reuse the
 * pages), and a streaming one never does. */
static st_ckpt_snapshot* st__snapshot_new(int count, const char* const* names, const char* const* files,
                                          const st_tensor_type* types) {
  st_ckpt_snapshot* s = st_xcalloc(1, sizeof(*s));
  s->count = count;
  s->names = st_xcalloc((size_t)count + 1, sizeof(char*));
  s->files = st_xcalloc((size_t)count + 1, sizeof(char*));
  s->types = st_xcalloc((size_t)count + 1, sizeof(st_tensor_type));
  s->data = st_xcalloc((size_t)count + 1, sizeof(void*));
  for (int i = 0; i < count; ++i) {
    s->names[i] = st_xstrdup(names[i]);
    s->files[i] = st_xstrdup(files[i]);
    s->types[i] = types[i];
    s->bytes += (int64_t)st_tensor_type_bytes(&types[i]);
  }
  return s;
}

st_ckpt_snapshot* st_ckpt_snapshot_create(int count, const char* const* names, const char* const* files,
                                          const st_tensor_type* types) {
  return st__snapshot_new(count, names, files, types);
}

st_ckpt_snapshot* st_ckpt_snapshot_create_streaming(int count, const char* const* names, const char* const* files,
                                                    const st_tensor_type* types, st_ckpt_fill_fn fill, void* user) {
  st_ckpt_snapshot* s = st__snapshot_new(count, names, files, types);
  s->fill = fill;
  s->fill_user = user;
  return s;
}

bool st_ckpt_snapshot_is_streaming(const st_ckpt_snapshot* s) { return s && s->fill; }

int64_t st_ckpt_snapshot_staging_bytes(const st_ckpt_snapshot* s) {
  if (!s) return 0;
  if (!s->fill) return s->bytes;
  int64_t most = 0;
  for (int i = 0; i < s->count; ++i) {
    int64_t n = (int64_t)st_tensor_type_bytes(&s->types[i]);
    if (n > most) most = n;
  }
  return most;
}

void st_ckpt_snapshot_destroy(st_ckpt_snapshot* s) {
  if (!s) return;
  for (int i = 0; i < s->count; ++i) {
    free(s->names[i]);
    free(s->files[i]);
    free(s->data[i]);
  }
  free(s->names);
  free(s->files);
  free(s->types);
  free(s->data);
  for (int i = 0; i < 3; ++i) free(s->strs[i]);
  for (int i = 0; i < 4; ++i) json_decref(s->trees[i]);
  free(s);
}

void* st_ckpt_snapshot_data(st_ckpt_snapshot* s, int i) {
  if (s->fill) return NULL; /* streaming: no copy */
  if (!s->data[i]) {
    size_t n = st_tensor_type_bytes(&s->types[i]);
    s->data[i] = st_xcalloc(n ? n : 1, 1);
  }
  return s->data[i];
}
int st_ckpt_snapshot_count(const st_ckpt_snapshot* s) { return s->count; }
int64_t st_ckpt_snapshot_bytes(const st_ckpt_snapshot* s) { return s->bytes; }
const st_ckpt_meta* st_ckpt_snapshot_meta(const st_ckpt_snapshot* s) { return &s->meta; }

void st_ckpt_snapshot_set_meta(st_ckpt_snapshot* s, const st_ckpt_meta* meta) {
  const char* src[3] = {meta->config_hash, meta->bundle_key, meta->tokenizer_hash};
  for (int i = 0; i < 3; ++i) {
    /* The strings rarely change between saves; keep the copy when equal. */
    if (s->strs[i] && src[i] && !strcmp(s->strs[i], src[i])) continue;
    free(s->strs[i]);
    s->strs[i] = st_xstrdup(src[i] ? src[i] : "");
  }
  /* Private deep copies: the writer thread dumps them while the caller's
   * trees may change or go. */
  const json_t* trees[4] = {meta->config, meta->model, meta->lr_schedule, meta->data_contract};
  for (int i = 0; i < 4; ++i) {
    if (s->trees[i] && trees[i] && json_equal(s->trees[i], (json_t*)trees[i])) continue;
    json_decref(s->trees[i]);
    s->trees[i] = trees[i] ? json_deep_copy(trees[i]) : st_json_obj();
    if (!s->trees[i]) st_oom("checkpoint metadata");
  }
  s->meta = *meta;
  s->meta.config_hash = s->strs[0];
  s->meta.bundle_key = s->strs[1];
  s->meta.tokenizer_hash = s->strs[2];
  s->meta.config = s->trees[0];
  s->meta.model = s->trees[1];
  s->meta.lr_schedule = meta->lr_schedule ? s->trees[2] : NULL;
  s->meta.data_contract = meta->data_contract ? s->trees[3] : NULL;
}

void st_ckpt_save_result_clear(st_ckpt_save_result* r) {
  free(r->dir);
  st_status_free(r->status);
  memset(r, 0, sizeof(*r));
}

/*===-------------------------------------------------------------------===*/
/* Save                                                                     */
/*===-------------------------------------------------------------------===*/

/* Any failure below is a checkpoint failure (exit 7), whatever its origin. */
static st_status st__as_ckpt(st_status s) {
  return st_status_set_code(s, ST_CODE_CKPT);
}

static st_status st__errno(const char* what, const char* path, int err) {
  return st_status_make(ST_CODE_CKPT, "%s '%s' failed: %s", what, path, strerror(err));
}

static st_status st__fsync_path(const char* path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return st__errno("opening folder", path, errno);
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  return rc == 0 ? ST_OK : st__errno("fsync of folder", path, err);
}

static st_status st__hook(const st_ckpt_save_options* o, st_ckpt_point p, const char* path) {
  if (!o->hook) return ST_OK;
  st_status s = o->hook(o->hook_user, p, path);
  return st__as_ckpt(s);
}

typedef struct {
  int fd;
  const char* path;
  XXH64_state_t* hash;
  size_t written, total;
  bool middle_done;
  const st_ckpt_save_options* o;
  st_progress_line* line; /* the whole save's progress; NULL when not shown */
  int64_t* saved;         /* bytes of every file so far, for |line| */
} st__out;

static st_status st__write_all(st__out* w, const void* data, size_t n) {
  const char* p = data;
  while (n > 0) {
    /* Chunks, so the mid-file hook point is reached with bytes on disk. */
    size_t chunk = n < (1u << 20) ? n : (1u << 20);
    if (!w->middle_done && w->written + chunk > w->total / 2 && w->written < w->total / 2) chunk = w->total / 2 - w->written;
    if (chunk == 0) chunk = n;
    ssize_t k = write(w->fd, p, chunk);
    if (k < 0) {
      if (errno == EINTR) continue;
      return st__errno("writing", w->path, errno);
    }
    XXH64_update(w->hash, p, (size_t)k);
    p += k;
    n -= (size_t)k;
    w->written += (size_t)k;
    if (w->line) st_progress_line_update(w->line, *w->saved += k);
    if (!w->middle_done && w->written >= w->total / 2) {
      w->middle_done = true;
      ST_RETURN(st__hook(w->o, ST_CKPT_AT_FILE_MIDDLE, w->path));
    }
  }
  return ST_OK;
}

/* Per-file facts collected while writing, for the manifest. */
typedef struct {
  const char* file;
  size_t bytes;
  uint64_t xxh64;
} st__file_rec;

typedef struct {
  size_t offset;
  uint64_t xxh64;
} st__tensor_rec;

static st_status st__write_tensor_file(const st_ckpt_save_options* o, const st_ckpt_snapshot* snap, const char* dir,
                                       const char* file, st__file_rec* frec, st__tensor_rec* trec, st_progress_line* line,
                                       int64_t* saved) {
  int n = 0;
  for (int i = 0; i < snap->count; ++i) n += !strcmp(snap->files[i], file);
  st_named_tensor* ts = st_xcalloc((size_t)n + 1, sizeof(*ts));
  void** zeros = st_xcalloc((size_t)n + 1, sizeof(void*));
  int* idx = st_xcalloc((size_t)n + 1, sizeof(int));
  int k = 0;
  for (int i = 0; i < snap->count; ++i) {
    if (strcmp(snap->files[i], file)) continue;
    ts[k].name = snap->names[i];
    ts[k].type = snap->types[i];
    ts[k].data = snap->data[i];
    idx[k++] = i;
    if (!snap->fill && !ts[k - 1].data) /* never filled (st_ckpt_snapshot_data not called): zeros, as before */
      ts[k - 1].data = zeros[k - 1] = st_xcalloc(st_tensor_type_bytes(&ts[k - 1].type) + 1, 1);
  }
  char* path = st_path_join(dir, file);
  char* header = NULL;
  size_t header_size = 0, data_size = 0;
  st_status s = st_safetensors_header(ts, n, path, &header, &header_size, &data_size);
  st__out w = {-1, path, XXH64_createState(), 0, header_size + data_size, false, o, line, saved};
  XXH64_reset(w.hash, 0);
  if (!s) {
    w.fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w.fd < 0) s = st__errno("creating", path, errno);
  }
  /* The progress line counts tensor bytes (its total), not headers. */
  w.line = NULL;
  if (!s) s = st__write_all(&w, header, header_size);
  w.line = line;
  size_t offset = header_size;
  /* A streaming snapshot: one staging buffer of the file's largest tensor,
   * mapped for this file only so that it never stays in malloc's free
   * pool (the host malloc policy keeps freed blocks: docs/runtime.md). */
  void* stage = NULL;
  size_t stage_size = 0;
  if (snap->fill) {
    for (int j = 0; j < n; ++j)
      if (st_tensor_type_bytes(&ts[j].type) > stage_size) stage_size = st_tensor_type_bytes(&ts[j].type);
    if (stage_size) {
      stage = mmap(NULL, stage_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (stage == MAP_FAILED) {
        stage = NULL;
        if (!s) s = st__errno("mapping the checkpoint staging buffer for", path, errno);
      }
    }
  }
  for (int j = 0; j < n && !s; ++j) {
    size_t bytes = st_tensor_type_bytes(&ts[j].type);
    const void* data = ts[j].data;
    if (snap->fill) {
      s = snap->fill(snap->fill_user, idx[j], stage, bytes);
      if (s) break;
      data = stage;
    }
    trec[idx[j]].offset = offset;
    trec[idx[j]].xxh64 = st_hash64(data, bytes, 0);
    s = st__write_all(&w, data, bytes);
    offset += bytes;
  }
  if (stage) munmap(stage, stage_size);
  if (!s && fsync(w.fd) != 0) s = st__errno("fsync of", path, errno);
  if (w.fd >= 0 && close(w.fd) != 0 && !s) s = st__errno("closing", path, errno);
  if (!s) {
    frec->file = file;
    frec->bytes = header_size + data_size;
    frec->xxh64 = XXH64_digest(w.hash);
    s = st__hook(o, ST_CKPT_AT_FILE_DONE, path);
  }
  XXH64_freeState(w.hash);
  free(header);
  free(path);
  for (int j = 0; j < n; ++j) free(zeros[j]);
  free(zeros);
  free(ts);
  free(idx);
  return s;
}

static void st__hex64(uint64_t v, char out[17]) { snprintf(out, 17, "%016" PRIx64, v); }

#define ST__MANIFEST_MARK "\"manifest_xxh64\""

/* The "tensors" entries of a snapshot written whole. */
static json_t* st__tensors_whole(const st_ckpt_snapshot* snap, const st__tensor_rec* trec) {
  char hex[17];
  json_t* ta = st_json_arr();
  for (int i = 0; i < snap->count; ++i) {
    st__hex64(trec[i].xxh64, hex);
    json_t* t = st_json_obj();
    st_json_put_str(t, "name", snap->names[i]);
    st_json_put_str(t, "file", snap->files[i]);
    st_json_put_str(t, "dtype", st_safetensors_dtype_name(snap->types[i].dtype));
    json_t* shape = st_json_arr();
    for (int d = 0; d < snap->types[i].rank; ++d) st_json_push(shape, st_json_int(snap->types[i].dims[d]));
    st_json_put(t, "shape", shape);
    st_json_put_int(t, "offset", (int64_t)trec[i].offset);
    st_json_put_int(t, "bytes", (int64_t)st_tensor_type_bytes(&snap->types[i]));
    st_json_put_str(t, "xxh64", hex);
    /* Whole on every mesh but fsdp across processes: the snapshot reads one
     * replica of each tensor (per-rank shards write "rows" instead). */
    st_json_put_str(t, "layout", "whole");
    st_json_push(ta, t);
  }
  return ta;
}

/* |tensors| (consumed) is the "tensors" array. */
static char* st__manifest_text(const st_ckpt_meta* m, const st__file_rec* files, int file_count, json_t* tensors) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  json_t* j = st_json_obj();
  st_json_put_str(j, "format", ST_CKPT_FORMAT);
  st_json_put_int(j, "version", ST_CKPT_VERSION);
  st_json_put(j, "created", st_json_fixed((double)tv.tv_sec + 1e-6 * (double)tv.tv_usec, 3));
  st_json_put_int(j, "step", m->step);
  st_json_put_int(j, "optimizer_step", m->optimizer_step);
  json_t* data = st_json_obj();
  st_json_put_int(data, "position", m->data_position);
  st_json_put_str(data, "unit", "sequences");
  st_json_put_int(data, "batch_size", m->batch_size);
  if (m->data_contract) {
    const char* key;
    json_t* v;
    json_object_foreach((json_t*)m->data_contract, key, v) st_json_put(data, key, json_incref(v));
  }
  st_json_put(j, "data", data);
  json_t* rng = st_json_obj();
  st_json_put_int(rng, "seed", (int64_t)m->seed);
  st_json_put_str(rng, "state",
                  "stateless: init and the sampler are pure functions of the seed and the position (docs/data.md)");
  st_json_put(j, "rng", rng);
  json_t* lr = st_json_obj();
  st_json_put_int(lr, "step", m->step);
  st_json_put_int(lr, "total_steps", m->total_steps);
  st_json_put_num(lr, "lr", m->lr);
  if (m->lr_schedule) {
    /* After step and lr, which the object always had; the definition's own
     * total_steps is the same number. */
    const char* key;
    json_t* v;
    json_object_foreach((json_t*)m->lr_schedule, key, v) st_json_put(lr, key, json_incref(v));
  }
  st_json_put(j, "lr_schedule", lr);
  st_json_put_str(j, "config_hash", m->config_hash);
  st_json_put_str(j, "bundle_key", m->bundle_key);
  if (m->tokenizer_hash && m->tokenizer_hash[0]) st_json_put_str(j, "tokenizer_hash", m->tokenizer_hash);
  st_json_put(j, "model", m->model ? json_incref((json_t*)m->model) : st_json_obj());
  st_json_put(j, "config", m->config ? json_incref((json_t*)m->config) : st_json_obj());
  int axes[3] = {m->mesh_data > 0 ? m->mesh_data : 1, m->mesh_fsdp > 0 ? m->mesh_fsdp : 1, m->mesh_tensor > 0 ? m->mesh_tensor : 1};
  json_t* mesh = st_json_obj();
  st_json_put_int(mesh, "data", axes[0]);
  st_json_put_int(mesh, "fsdp", axes[1]);
  st_json_put_int(mesh, "tensor", axes[2]);
  const int stages = m->mesh_pipeline > 1 ? m->mesh_pipeline : 1;
  st_json_put_int(mesh, "devices", (int64_t)axes[0] * axes[1] * axes[2] * stages);
  if (stages > 1) st_json_put_int(mesh, "pipeline", stages);
  if (m->mesh_processes > 1) st_json_put_int(mesh, "processes", m->mesh_processes);
  st_json_put(j, "mesh", mesh);
  char hex[17];
  json_t* fa = st_json_arr();
  for (int i = 0; i < file_count; ++i) {
    st__hex64(files[i].xxh64, hex);
    json_t* f = st_json_obj();
    st_json_put_str(f, "file", files[i].file);
    st_json_put_int(f, "bytes", (int64_t)files[i].bytes);
    st_json_put_str(f, "xxh64", hex);
    st_json_push(fa, f);
  }
  st_json_put(j, "files", fa);
  st_json_put(j, "tensors", tensors);
  /* The manifest checks itself: its last member is the xxh64 of every byte
   * before that member's line. jansson's indented text of a non-empty
   * object ends in "\n}"; the checksum member replaces that end. */
  char* text = st_json_dump(j, 2);
  json_decref(j);
  size_t n = strlen(text);
  st_strbuf b = {0};
  st_strbuf_append_n(&b, text, n - 2); /* drop "\n}" */
  free(text);
  st_strbuf_append(&b, ",\n");
  st__hex64(st_hash64(b.data, b.len, 0), hex);
  st_strbuf_printf(&b, "  " ST__MANIFEST_MARK ": \"%s\"\n}\n", hex);
  return st_strbuf_take(&b);
}

static st_status st__write_small(const char* path, const char* text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return st__errno("creating", path, errno);
  st_status s = st__as_ckpt(st_fs_write_all(fd, text, strlen(text), path));
  if (!s && fsync(fd) != 0) s = st__errno("fsync of", path, errno);
  if (close(fd) != 0 && !s) s = st__errno("closing", path, errno);
  return s;
}

/* A save's commit, once its tensor files are durable in |tmp|: the
 * manifest |text| (consumed) written and fsynced with the folder, the
 * folder renamed to |final| (<root>/|name|), <root> fsynced, LATEST
 * replaced, retention. *bytes grows by the manifest's. */
static st_status st__commit(const st_ckpt_save_options* o, const char* name, const char* tmp, const char* final, char* text,
                            int64_t* bytes, bool* out_renamed, int* out_removed) {
  char* mpath = st_path_join(tmp, ST_CKPT_MANIFEST);
  st_status s = st__write_small(mpath, text);
  *bytes += (int64_t)strlen(text);
  free(mpath);
  free(text);
  if (!s) s = st__fsync_path(tmp);
  if (!s) s = st__hook(o, ST_CKPT_AT_MANIFEST, tmp);
  /* Visible from here on. An existing step_<N> (one a resume skipped as
   * invalid, then re-reached) is moved aside first: rename(2) cannot
   * replace a non-empty folder. */
  bool renamed = false;
  if (!s) {
    char* old = NULL;
    if (st_fs_exists(final)) {
      char oldname[160];
      snprintf(oldname, sizeof(oldname), "%sold-%s-%ld", ST_CKPT_TMP_PREFIX, name, (long)getpid());
      old = st_path_join(o->root, oldname);
      st_status_free(st_fs_remove_tree(old));
      if (rename(final, old) != 0) s = st__errno("moving aside", final, errno);
    }
    if (!s && rename(tmp, final) != 0) {
      s = st__errno("renaming to step folder", tmp, errno);
      if (old) rename(old, final); /* put the previous one back */
    }
    if (!s) renamed = true;
    if (old) {
      if (renamed) st_status_free(st_fs_remove_tree(old));
      free(old);
    }
  }
  *out_renamed = renamed;
  if (!s) s = st__fsync_path(o->root);
  if (!s) s = st__hook(o, ST_CKPT_AT_RENAMED, final);
  if (!s) {
    char* latest = st_path_join(o->root, ST_CKPT_LATEST);
    char line[80];
    snprintf(line, sizeof(line), "%s\n", name);
    st_status w = st_fs_write_atomic(latest, line, strlen(line));
    if (w) {
      s = st_status_make(ST_CODE_CKPT, "updating %s: %s (%s itself is complete and valid)", latest, st_status_message(w), final);
      st_status_free(w);
    }
    free(latest);
  }
  if (!s) s = st__hook(o, ST_CKPT_AT_COMMITTED, final);
  if (!s) *out_removed = st_ckpt_retain(o->root, o->keep, o->keep_every);
  return s;
}

st_status st_ckpt_save(const st_ckpt_save_options* o, const st_ckpt_snapshot* snap, st_ckpt_save_result* result) {
  double t0 = st_now();
  char name[64];
  snprintf(name, sizeof(name), "step_%lld", (long long)snap->meta.step);
  if (result) {
    memset(result, 0, sizeof(*result));
    result->step = snap->meta.step;
  }
  if (snap->meta.step < 0) return st_status_make(ST_CODE_INTERNAL, "checkpoint with negative step %lld", (long long)snap->meta.step);
  st_status s = st_fs_mkdirs(o->root);
  if (s) return st_status_annotate(st__as_ckpt(s), "checkpoint %s", name);
  char tmpname[128];
  snprintf(tmpname, sizeof(tmpname), "%s%s-%ld", ST_CKPT_TMP_PREFIX, name, (long)getpid());
  char* tmp = st_path_join(o->root, tmpname);
  char* final = st_path_join(o->root, name);
  st_status_free(st_fs_remove_tree(tmp));
  bool created = false;
  if (mkdir(tmp, 0755) != 0) {
    s = st__errno("creating folder", tmp, errno);
  } else {
    created = true;
  }
  if (!s) s = st__hook(o, ST_CKPT_AT_BEGIN, tmp);

  /* Files in order of first appearance (params, then optimizer state). */
  int file_count = 0;
  const char** files = st_xcalloc((size_t)snap->count + 1, sizeof(char*));
  for (int i = 0; i < snap->count; ++i) {
    bool seen = false;
    for (int j = 0; j < file_count; ++j) seen |= !strcmp(files[j], snap->files[i]);
    if (!seen) files[file_count++] = snap->files[i];
  }
  st__file_rec* frec = st_xcalloc((size_t)file_count + 1, sizeof(*frec));
  st__tensor_rec* trec = st_xcalloc((size_t)snap->count + 1, sizeof(*trec));
  /* Headers and the manifest are small: the line counts tensor bytes. */
  st_progress_line line;
  int64_t saved = 0;
  const bool show = st_progress_wanted(&o->progress, snap->bytes);
  char what[96];
  snprintf(what, sizeof(what), "checkpoint %s", name);
  if (show) st_progress_line_start(&line, what, "MiB", snap->bytes);
  for (int f = 0; f < file_count && !s; ++f)
    s = st__write_tensor_file(o, snap, tmp, files[f], &frec[f], trec, show ? &line : NULL, &saved);
  if (show && !s) st_progress_line_update(&line, snap->bytes);
  else if (show && !line.ended) fputc('\n', stderr);
  int64_t bytes = 0;
  for (int f = 0; f < file_count; ++f) bytes += (int64_t)frec[f].bytes;
  bool renamed = false;
  int removed = 0;
  if (!s) s = st__commit(o, name, tmp, final, st__manifest_text(&snap->meta, frec, file_count, st__tensors_whole(snap, trec)), &bytes,
                         &renamed, &removed);
  if (s && created && !renamed) st_status_free(st_fs_remove_tree(tmp));
  if (result) {
    result->write_s = st_now() - t0;
    result->bytes = bytes;
    result->removed = removed;
    if (!s) result->dir = st_xstrdup(final);
  }
  free(files);
  free(frec);
  free(trec);
  free(tmp);
  free(final);
  if (s) return st_status_annotate(s, "checkpoint %s", name);
  return ST_OK;
}

/*===-------------------------------------------------------------------===*/
/* Per-rank shards (docs/checkpoints.md, "Per-rank shards")                 */
/*===-------------------------------------------------------------------===*/

void st_ckpt_rows_of(int64_t dim0, int parts, int r, int64_t* begin, int64_t* end) {
  if (parts < 1) parts = 1;
  const int64_t b = (dim0 + parts - 1) / parts;
  *begin = r < parts ? (int64_t)r * b : dim0;
  *end = r < parts ? (int64_t)(r + 1) * b : dim0;
  if (*begin > dim0) *begin = dim0;
  if (*end > dim0) *end = dim0;
}

void st_ckpt_part_clear(st_ckpt_part* p) {
  free(p->offsets);
  free(p->hashes);
  memset(p, 0, sizeof(*p));
}

static char* st__ranks_tmp(const char* root, int64_t step) {
  char name[128];
  snprintf(name, sizeof(name), "%sstep_%lld%s", ST_CKPT_TMP_PREFIX, (long long)step, ST_CKPT_SHARDS_TMP_SUFFIX);
  return st_path_join(root, name);
}

void st_ckpt_abort_ranks(const char* root, int64_t step) {
  char* tmp = st__ranks_tmp(root, step);
  st_status_free(st_fs_remove_tree(tmp));
  free(tmp);
}

st_status st_ckpt_save_rank(const st_ckpt_save_options* o, const st_ckpt_snapshot* snap, int64_t step, const int* index, int count,
                            st_ckpt_part* part) {
  memset(part, 0, sizeof(*part));
  part->offsets = st_xcalloc((size_t)count + 1, sizeof(size_t));
  part->hashes = st_xcalloc((size_t)count + 1, sizeof(uint64_t));
  st_status s = st_fs_mkdirs(o->root);
  char* tmp = st__ranks_tmp(o->root, step);
  /* Every rank may get here first; the folder is the same for all. */
  if (!s && mkdir(tmp, 0755) != 0 && errno != EEXIST) s = st__errno("creating folder", tmp, errno);
  if (!s) s = st__hook(o, ST_CKPT_AT_BEGIN, tmp);
  st__tensor_rec* trec = st_xcalloc((size_t)snap->count + 1, sizeof(*trec));
  st__file_rec frec = {0};
  if (!s && snap->count > 0) {
    /* A leftover of this very save's earlier try would block O_EXCL. */
    char* path = st_path_join(tmp, snap->files[0]);
    unlink(path);
    free(path);
    s = st__write_tensor_file(o, snap, tmp, snap->files[0], &frec, trec, NULL, &(int64_t){0});
  }
  for (int k = 0; !s && k < snap->count; ++k) {
    part->offsets[index[k]] = trec[k].offset;
    part->hashes[index[k]] = trec[k].xxh64;
  }
  part->bytes = frec.bytes;
  part->xxh64 = frec.xxh64;
  free(trec);
  free(tmp);
  if (s) return st_status_annotate(st__as_ckpt(s), "checkpoint step_%lld (this rank's file)", (long long)step);
  return ST_OK;
}

/* The "tensors" entries of a sharded save: every tensor's rows, by rank. */
static json_t* st__tensors_rows(int count, const char* const* names, const st_tensor_type* types, const int* parts, int ranks,
                                const st_ckpt_part* recs) {
  char hex[17], file[64];
  json_t* ta = st_json_arr();
  for (int i = 0; i < count; ++i) {
    for (int r = 0; r < ranks; ++r) {
      int64_t b = 0, e = 0;
      st_ckpt_rows_of(types[i].dims[0], parts[i], r, &b, &e);
      if (b == e) continue;
      st_tensor_type t = types[i];
      t.dims[0] = e - b;
      snprintf(file, sizeof(file), ST_CKPT_RANK_FILE_FMT, r);
      st__hex64(recs[r].hashes[i], hex);
      json_t* j = st_json_obj();
      st_json_put_str(j, "name", names[i]);
      st_json_put_str(j, "file", file);
      st_json_put_str(j, "dtype", st_safetensors_dtype_name(t.dtype));
      json_t* shape = st_json_arr();
      for (int d = 0; d < t.rank; ++d) st_json_push(shape, st_json_int(t.dims[d]));
      st_json_put(j, "shape", shape);
      st_json_put_int(j, "offset", (int64_t)recs[r].offsets[i]);
      st_json_put_int(j, "bytes", (int64_t)st_tensor_type_bytes(&t));
      st_json_put_str(j, "xxh64", hex);
      st_json_put_str(j, "layout", "rows");
      json_t* rows = st_json_arr();
      st_json_push(rows, st_json_int(b));
      st_json_push(rows, st_json_int(e));
      st_json_put(j, "rows", rows);
      st_json_put_int(j, "dim0", types[i].dims[0]);
      st_json_push(ta, j);
    }
  }
  return ta;
}

st_status st_ckpt_commit_ranks(const st_ckpt_save_options* o, const st_ckpt_meta* meta, int count, const char* const* names,
                               const st_tensor_type* types, const int* parts, int ranks, const st_ckpt_part* recs,
                               st_ckpt_save_result* result) {
  double t0 = st_now();
  char name[64];
  snprintf(name, sizeof(name), "step_%lld", (long long)meta->step);
  if (result) {
    memset(result, 0, sizeof(*result));
    result->step = meta->step;
  }
  if (ranks < 1 || ranks > ST_CKPT_MAX_FILES)
    return st_status_make(ST_CODE_CKPT, "checkpoint %s: %d rank files, the manifest holds 1 to %d (ST_CKPT_MAX_FILES)", name, ranks,
                          ST_CKPT_MAX_FILES);
  char* tmp = st__ranks_tmp(o->root, meta->step);
  char* final = st_path_join(o->root, name);
  st__file_rec* frec = st_xcalloc((size_t)ranks + 1, sizeof(*frec));
  char** fnames = st_xcalloc((size_t)ranks + 1, sizeof(char*));
  int64_t bytes = 0;
  for (int r = 0; r < ranks; ++r) {
    char file[64];
    snprintf(file, sizeof(file), ST_CKPT_RANK_FILE_FMT, r);
    fnames[r] = st_xstrdup(file);
    frec[r] = (st__file_rec){fnames[r], recs[r].bytes, recs[r].xxh64};
    bytes += (int64_t)recs[r].bytes;
  }
  bool renamed = false;
  int removed = 0;
  /* Every rank's file is fsynced; the folder's entries are, with the
   * manifest, by the commit's fsync of the folder. */
  st_status s = st__commit(o, name, tmp, final,
                           st__manifest_text(meta, frec, ranks, st__tensors_rows(count, names, types, parts, ranks, recs)), &bytes,
                           &renamed, &removed);
  if (s && !renamed) st_status_free(st_fs_remove_tree(tmp));
  if (result) {
    result->write_s = st_now() - t0;
    result->bytes = bytes;
    result->removed = removed;
    if (!s) result->dir = st_xstrdup(final);
  }
  for (int r = 0; r < ranks; ++r) free(fnames[r]);
  free(fnames);
  free(frec);
  free(tmp);
  free(final);
  if (s) return st_status_annotate(s, "checkpoint %s", name);
  return ST_OK;
}

/*===-------------------------------------------------------------------===*/
/* Listing, retention, temporaries                                          */
/*===-------------------------------------------------------------------===*/

/* "step_<digits>" exactly; anything else is not a committed checkpoint. */
static bool st__parse_step_name(const char* name, int64_t* out) {
  if (strncmp(name, "step_", 5) != 0 || !name[5]) return false;
  int64_t v = 0;
  for (const char* p = name + 5; *p; ++p) {
    if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return false;
    v = v * 10 + (*p - '0');
  }
  *out = v;
  return true;
}

static int st__by_step_desc(const void* a, const void* b) {
  const st_ckpt_entry* x = a;
  const st_ckpt_entry* y = b;
  return x->step > y->step ? -1 : x->step < y->step;
}

st_status st_ckpt_list(const char* root, st_ckpt_entry** out_entries, int* out_count) {
  *out_entries = NULL;
  *out_count = 0;
  DIR* d = opendir(root);
  if (!d) {
    if (errno == ENOENT) return ST_OK;
    return st__errno("listing", root, errno);
  }
  int cap = 16, n = 0;
  st_ckpt_entry* v = st_xcalloc((size_t)cap, sizeof(*v));
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    int64_t step;
    if (!st__parse_step_name(e->d_name, &step)) continue;
    char* dir = st_path_join(root, e->d_name);
    if (!st_fs_is_dir(dir)) {
      free(dir);
      continue;
    }
    if (n == cap) {
      cap *= 2;
      v = st_xrealloc(v, (size_t)cap * sizeof(*v));
    }
    v[n].step = step;
    v[n].name = st_xstrdup(e->d_name);
    v[n].dir = dir;
    ++n;
  }
  closedir(d);
  qsort(v, (size_t)n, sizeof(*v), st__by_step_desc);
  *out_entries = v;
  *out_count = n;
  return ST_OK;
}

void st_ckpt_entries_free(st_ckpt_entry* v, int n) {
  if (!v) return;
  for (int i = 0; i < n; ++i) {
    free(v[i].name);
    free(v[i].dir);
  }
  free(v);
}

char* st_ckpt_read_latest(const char* root) {
  char* path = st_path_join(root, ST_CKPT_LATEST);
  char* data = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &data, &size);
  free(path);
  if (s) {
    st_status_free(s);
    return NULL;
  }
  while (size > 0 && (data[size - 1] == '\n' || data[size - 1] == ' ' || data[size - 1] == '\r')) data[--size] = '\0';
  return data;
}

const char* st_ckpt_latest_problem(const char* root, const char* latest) {
  int64_t step;
  if (!latest || !st__parse_step_name(latest, &step)) return "not a checkpoint name (step_<N>)";
  char* dir = st_path_join(root, latest);
  bool there = st_fs_is_dir(dir);
  free(dir);
  return there ? NULL : "names no checkpoint folder in this checkpoints folder";
}

int st_ckpt_retain(const char* root, int64_t keep, int64_t keep_every) {
  st_ckpt_entry* v = NULL;
  int n = 0;
  st_status s = st_ckpt_list(root, &v, &n);
  if (s) {
    st_status_free(s);
    return 0;
  }
  char* latest = st_ckpt_read_latest(root);
  int removed = 0;
  for (int i = 0; i < n; ++i) {
    bool keepit = i < keep || (keep_every > 0 && v[i].step % keep_every == 0) || (latest && !strcmp(latest, v[i].name));
    if (keepit) continue;
    st_status r = st_fs_remove_tree(v[i].dir);
    if (r) {
      st_status_free(r);
    } else {
      ++removed;
    }
  }
  free(latest);
  st_ckpt_entries_free(v, n);
  return removed;
}

st_status st_ckpt_remove_temporaries(const char* root, char** out_names) {
  if (out_names) *out_names = NULL;
  DIR* d = opendir(root);
  if (!d) return errno == ENOENT ? ST_OK : st__errno("listing", root, errno);
  st_strbuf names = {0};
  st_status s = ST_OK;
  struct dirent* e;
  while (!s && (e = readdir(d)) != NULL) {
    bool tmp = !strncmp(e->d_name, ST_CKPT_TMP_PREFIX, strlen(ST_CKPT_TMP_PREFIX)) ||
               !strncmp(e->d_name, ST_CKPT_LATEST ".tmp-", strlen(ST_CKPT_LATEST ".tmp-"));
    if (!tmp) continue;
    char* p = st_path_join(root, e->d_name);
    s = st_fs_remove_tree(p);
    free(p);
    if (!s) {
      if (names.len) st_strbuf_append(&names, ", ");
      st_strbuf_append(&names, e->d_name);
    }
  }
  closedir(d);
  if (s) {
    st_strbuf_free(&names);
    return st_status_annotate(st__as_ckpt(s), "removing temporaries of crashed saves");
  }
  if (out_names) {
    *out_names = names.data;
  } else {
    st_strbuf_free(&names);
  }
  return ST_OK;
}
