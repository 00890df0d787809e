/* cmd_note.c — `strata note RUN [--hypothesis|--conclusion] TEXT`: the
 * experiment record a person keeps about a run, in RUN/notes.json
 * (st_notes_add, src/obs/notes.c; docs/using.md "strata note"). Without a
 * text it prints the run's notes. Safe while the run trains: the trainer
 * never writes notes.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jansson.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/obs.h"

static const char* kUsage =
    "usage: strata note RUN_DIR TEXT                 add a timestamped note\n"
    "       strata note RUN_DIR --hypothesis TEXT    set the run's hypothesis (the newest one counts)\n"
    "       strata note RUN_DIR --conclusion TEXT    set the run's conclusion (the newest one counts)\n"
    "       strata note RUN_DIR [--json]             print the run's notes\n"
    "  --author NAME: who writes it (default: obs.author's fallbacks: git user.name <user.email>, $USER);\n"
    "  `--` ends the options (a text that starts with '-'). Notes go to RUN_DIR/notes.json, which the trainer\n"
    "  never writes: safe while the run trains; shown by strata report and strata diff.";

/* A note's text on a terminal: control characters (an escape sequence in
 * someone's notes.json) are shown as '?', newlines indented. */
static void st__note_print_text(const char* s) {
  for (; *s; ++s) {
    unsigned char c = (unsigned char)*s;
    if (c == '\n') fputs("\n    ", stdout);
    else if (c < 0x20 && c != '\t') putchar('?');
    else if (c == 0x7f) putchar('?');
    else putchar(c);
  }
}

static void st__note_print_entry(const json_t* e, bool with_kind) {
  char when[64] = "?";
  double t = json_number_value(json_object_get(e, "time"));
  if (t > 0 && t < 1e11) {
    time_t tt = (time_t)t;
    struct tm tm;
    gmtime_r(&tt, &tm);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
  }
  printf("  %s  ", when);
  st__note_print_text(json_string_value(json_object_get(e, "author")));
  if (with_kind) printf("  [%s]", json_string_value(json_object_get(e, "kind")));
  fputs("\n    ", stdout);
  st__note_print_text(json_string_value(json_object_get(e, "text")));
  putchar('\n');
}

static int st__note_show(const char* dir, bool json) {
  json_t* notes = NULL;
  st_status s = st_notes_read(dir, &notes);
  if (s) return st_cli_report(s);
  if (json) {
    json_t* empty = NULL;
    if (!notes) {
      empty = st_json_obj();
      st_json_put_int(empty, "schema", 1);
      st_json_put(empty, "entries", st_json_arr());
    }
    st_cli_print_json(notes ? notes : empty, 2);
    json_decref(empty);
    json_decref(notes);
    return 0;
  }
  printf("run: %s\n", dir);
  static const st_note_kind kinds[] = {ST_NOTE_HYPOTHESIS, ST_NOTE_CONCLUSION};
  for (int k = 0; k < 2; ++k) {
    const json_t* e = st_notes_latest(notes, kinds[k]);
    printf("%s:%s\n", st_note_kind_name(kinds[k]), e ? "" : " (none)");
    if (e) st__note_print_entry(e, false);
  }
  const json_t* entries = json_object_get(notes, "entries");
  printf("entries: %zu\n", json_array_size(entries));
  for (size_t i = 0; i < json_array_size(entries); ++i) st__note_print_entry(json_array_get(entries, i), true);
  json_decref(notes);
  return 0;
}

typedef struct st__note_args {
  const char* dir;
  const char* text;
  const char* author;
  st_note_kind kind;
  bool kind_set, json;
} st__note_args;

/* Parses argv; returns -1 to go on, else the exit code (help, usage error). */
static int st__note_parse(int argc, char** argv, st__note_args* a) {
  bool options = true;
  for (int i = 0; i < argc; ++i) {
    const char* arg = argv[i];
    if (options && (!strcmp(arg, "-h") || !strcmp(arg, "--help"))) {
      printf("%s\n", kUsage);
      return 0;
    }
    bool hyp = options && !strcmp(arg, "--hypothesis"), con = options && !strcmp(arg, "--conclusion");
    if (options && !strcmp(arg, "--")) {
      options = false;
    } else if (hyp || con) {
      if (a->kind_set) return st_cli_report(st_status_make(ST_CODE_CONFIG, "strata note: give one of --hypothesis, --conclusion\n%s", kUsage));
      a->kind = hyp ? ST_NOTE_HYPOTHESIS : ST_NOTE_CONCLUSION;
      a->kind_set = true;
    } else if (options && !strcmp(arg, "--json")) {
      a->json = true;
    } else if (options && !strcmp(arg, "--author") && i + 1 < argc && !a->author) {
      a->author = argv[++i];
    } else if (options && arg[0] == '-' && arg[1]) {
      return st_cli_report(st_status_make(ST_CODE_CONFIG, "strata note: unknown option '%s' (a text that starts with "
                                          "'-' goes after --)\n%s", arg, kUsage));
    } else if (!a->dir) {
      a->dir = arg;
    } else if (!a->text) {
      a->text = arg;
    } else {
      return st_cli_report(st_status_make(ST_CODE_CONFIG, "strata note: one text per note, quoted (\"...\"); '%s' is one "
                                          "word too many\n%s", arg, kUsage));
    }
  }
  if (!a->dir) return st_cli_report(st_status_make(ST_CODE_CONFIG, "%s", kUsage));
  if (a->kind_set && !a->text)
    return st_cli_report(st_status_make(ST_CODE_CONFIG, "strata note: --%s needs its text\n%s", st_note_kind_name(a->kind), kUsage));
  if (a->json && a->text)
    return st_cli_report(st_status_make(ST_CODE_CONFIG, "strata note: --json prints the notes; it takes no text\n%s", kUsage));
  return -1;
}

int st_cli_note(int argc, char** argv) {
  st__note_args a = {.kind = ST_NOTE_TEXT};
  int rc = st__note_parse(argc, argv, &a);
  if (rc >= 0) return rc;
  char* config = st_rundir_path(a.dir, ST_RUNDIR_CONFIG);
  char* events = st_rundir_path(a.dir, ST_RUNDIR_EVENTS);
  bool is_run = st_fs_is_dir(a.dir) && (st_fs_exists(config) || st_fs_exists(events));
  free(config);
  free(events);
  if (!is_run)
    return st_cli_report(st_status_make(ST_CODE_CONFIG, "strata note: '%s' is not a run directory (it has neither "
                                        "config.yaml nor events.jsonl); give the folder strata train printed", a.dir));
  if (!a.text) return st__note_show(a.dir, a.json);
  char author[512];
  st_context_author(a.author, author, sizeof(author));
  json_t* entry = NULL;
  st_status s = st_notes_add(a.dir, a.kind, a.text, author, &entry);
  if (!s) {
    char* path = st_rundir_path(a.dir, ST_RUNDIR_NOTES);
    printf("note: %s added to %s\n", st_note_kind_name(a.kind), path);
    free(path);
  }
  json_decref(entry);
  return st_cli_report(s);
}
