/* notes.c — the experiment record a person keeps about a run (notes.json,
 * `strata note`, docs/using.md): a hypothesis, a conclusion and free notes.
 *
 * Why a file of its own, not members of context.json: the trainer writes
 * context.json whole at every start and resume (and `strata run` restarts
 * it), so a note merged into it would be lost at the next restart, and a
 * note written while the trainer writes would race it. notes.json has one
 * writer, `strata note`; concurrent notes are serialised by an flock on the
 * run directory itself (the trainer's lock is the .lock file, so a note
 * never waits for a running trainer), and each write replaces the file
 * atomically, so a crash leaves the old or the new list, never a mix.
 *
 * Entries are only ever appended: setting a new hypothesis keeps the old
 * one in the list, and readers take the newest of each kind. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "obs/readback.h"
#include "strata/base.h"
#include "strata/obs.h"

static const char* const kKinds[] = {"note", "hypothesis", "conclusion"};

const char* st_note_kind_name(st_note_kind kind) {
  return (unsigned)kind < sizeof(kKinds) / sizeof(kKinds[0]) ? kKinds[kind] : NULL;
}

/* Checks an entry of notes.json: kind, text, author, time. */
static st_status st__notes_entry_ok(const json_t* e, size_t i, const char* path) {
  if (!json_is_object(e)) return st_status_make(ST_CODE_CONFIG, "%s: entries[%zu] is not an object", path, i);
  const char* kind = json_string_value(json_object_get(e, "kind"));
  bool known = false;
  for (size_t k = 0; kind && k < sizeof(kKinds) / sizeof(kKinds[0]); ++k) known |= !strcmp(kind, kKinds[k]);
  if (!known)
    return st_status_make(ST_CODE_CONFIG, "%s: entries[%zu].kind is not one of note, hypothesis, conclusion", path, i);
  const json_t* text = json_object_get(e, "text");
  if (!json_is_string(text) || json_string_length(text) > ST_NOTES_MAX_TEXT)
    return st_status_make(ST_CODE_CONFIG, "%s: entries[%zu].text is not a string of at most %d bytes", path, i,
                          ST_NOTES_MAX_TEXT);
  if (!json_is_string(json_object_get(e, "author")))
    return st_status_make(ST_CODE_CONFIG, "%s: entries[%zu].author is not a string", path, i);
  if (!json_is_number(json_object_get(e, "time")))
    return st_status_make(ST_CODE_CONFIG, "%s: entries[%zu].time is not a number", path, i);
  return ST_OK;
}

st_status st_notes_read(const char* dir, json_t** out_notes) {
  *out_notes = NULL;
  char* path = st_rundir_path(dir, ST_RUNDIR_NOTES);
  json_t* notes = NULL;
  st_status s = st_readback_json_object(path, ST_NOTES_MAX_FILE, &notes);
  const json_t* entries = notes ? json_object_get(notes, "entries") : NULL;
  if (!s && notes && !json_is_array(entries)) s = st_status_make(ST_CODE_CONFIG, "%s: 'entries' is missing or not a list", path);
  if (!s && notes && json_array_size(entries) > ST_NOTES_MAX_ENTRIES)
    s = st_status_make(ST_CODE_CONFIG, "%s: more than %d entries", path, ST_NOTES_MAX_ENTRIES);
  for (size_t i = 0; !s && notes && i < json_array_size(entries); ++i) s = st__notes_entry_ok(json_array_get(entries, i), i, path);
  if (s) {
    s = st_status_annotate(s, "the run's notes (move the file aside to start a new list; strata note never overwrites it)");
    json_decref(notes);
  } else {
    *out_notes = notes;
  }
  free(path);
  return s;
}

const json_t* st_notes_latest(const json_t* notes, st_note_kind kind) {
  const json_t* entries = notes ? json_object_get(notes, "entries") : NULL;
  const char* name = st_note_kind_name(kind);
  for (size_t i = json_array_size(entries); i-- > 0;) {
    const json_t* e = json_array_get(entries, i);
    const char* k = json_string_value(json_object_get(e, "kind"));
    if (k && name && !strcmp(k, name)) return e;
  }
  return NULL;
}

/* An exclusive flock on the run directory (see the top of the file),
 * waited for up to |wait_s|. Returns the descriptor holding it; -1 with
 * ST_OK when the file system has no flock (the note is then written
 * unserialised, as st_fs_lock's callers do). */
static st_status st__notes_lock(const char* dir, double wait_s, int* out_fd) {
  *out_fd = -1;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return st_status_make(ST_CODE_CONFIG, "cannot open run directory '%s': %s", dir, strerror(errno));
  double deadline = st_now() + wait_s;
  for (;;) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) break;
    if (errno == EINTR) continue;
    if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS) {
      fprintf(stderr, "strata: warning: %s: the file system has no flock; the note is written without a lock\n", dir);
      close(fd);
      return ST_OK;
    }
    if (errno != EWOULDBLOCK || st_now() > deadline) {
      int e = errno;
      close(fd);
      return st_status_make(ST_CODE_IO, "cannot lock run directory '%s' to add a note: %s", dir,
                            e == EWOULDBLOCK ? "another strata note held it for too long; try again" : strerror(e));
    }
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  *out_fd = fd;
  return ST_OK;
}

st_status st_notes_add(const char* dir, st_note_kind kind, const char* text, const char* author, json_t** out_entry) {
  if (out_entry) *out_entry = NULL;
  if (!st_note_kind_name(kind)) return st_status_make(ST_CODE_INTERNAL, "st_notes_add: kind %d", (int)kind);
  size_t len = text ? strlen(text) : 0;
  if (len == 0) return st_status_make(ST_CODE_CONFIG, "strata note: the %s is empty; give its text", st_note_kind_name(kind));
  if (len > ST_NOTES_MAX_TEXT)
    return st_status_make(ST_CODE_CONFIG, "strata note: the %s is %zu bytes; at most %d are kept (shorten it, or keep a "
                          "file next to the run and note its name)", st_note_kind_name(kind), len, ST_NOTES_MAX_TEXT);
  int lock = -1;
  ST_RETURN(st__notes_lock(dir, 10.0, &lock));
  json_t* notes = NULL;
  st_status s = st_notes_read(dir, &notes);
  if (!s) {
    if (!notes) {
      notes = st_json_obj();
      st_json_put_int(notes, "schema", 1);
      st_json_put(notes, "entries", st_json_arr());
    }
    json_t* entries = json_object_get(notes, "entries");
    if (json_array_size(entries) >= ST_NOTES_MAX_ENTRIES) {
      s = st_status_make(ST_CODE_CONFIG, "strata note: %s/%s already holds %d entries, the most kept", dir,
                         st_rundir_name(ST_RUNDIR_NOTES), ST_NOTES_MAX_ENTRIES);
    } else {
      json_t* e = st_json_obj();
      struct timeval tv;
      gettimeofday(&tv, NULL);
      st_json_put(e, "time", st_json_fixed((double)tv.tv_sec + 1e-6 * (double)tv.tv_usec, 3));
      st_json_put_str(e, "kind", st_note_kind_name(kind));
      st_json_put_str(e, "author", author ? author : "");
      st_json_put_str(e, "text", text);
      st_json_push(entries, json_incref(e));
      char* path = st_rundir_path(dir, ST_RUNDIR_NOTES);
      s = st_status_annotate(st_json_write_file(path, notes, 2), "strata note: writing %s", path);
      free(path);
      if (!s && out_entry) *out_entry = json_incref(e);
      json_decref(e);
    }
  }
  json_decref(notes);
  if (lock >= 0) close(lock);
  return s;
}
