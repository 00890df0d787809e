/*
 * config/internal.h — what the files of src/config/ share, and what the
 * tests and the fuzz target reach below the public API. Not for other
 * modules: they use strata/config.h.
 */
#ifndef STRATA_CONFIG_INTERNAL_H
#define STRATA_CONFIG_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/base.h"
#include "strata/config.h"

/* ---- schema (schema.c) -------------------------------------------------- */

typedef enum st__cfg_type {
  ST__CFG_INT,
  ST__CFG_FLOAT,
  ST__CFG_BOOL,
  ST__CFG_STRING,
  ST__CFG_ENUM,
  ST__CFG_LIST, /* list of strings */
} st__cfg_type;

/* One schema key. The default is written as text in the same syntax a file or
 * an override would use, so defaults go through the one parser and the one
 * range check (a test loads every default). */
typedef struct st__cfg_key {
  const char* key; /* dotted: "train.steps" */
  st__cfg_type type;
  const char* def;
  /* int/float: allowed range; an open end excludes the bound itself. */
  double lo, hi;
  bool lo_open, hi_open;
  const char* choices; /* enum: "f32|bf16" */
  const char* doc;     /* one line */
  st_config_bundle_use bundle; /* model.*: how it enters the model JSON (strata/config.h) */
  const char* zero_means;      /* int: the key whose value a 0 stands for; NULL: none */
} st__cfg_key;

/* A rule across keys, checked after everything is applied. */
typedef struct st__cfg_rule {
  const char* doc; /* one line, for the reference */
  st_status (*check)(const st_config* config);
} st__cfg_rule;

typedef struct st__cfg_env {
  const char* name;
  const char* doc;
} st__cfg_env;

typedef struct st__cfg_section {
  const char* name; /* "" for top-level keys */
  const char* doc;
} st__cfg_section;

const st__cfg_key* st__cfg_schema(int* count);
const st__cfg_rule* st__cfg_rules(int* count);
const st__cfg_env* st__cfg_envs(int* count);
const st__cfg_section* st__cfg_sections(int* count);

/* Index of |key| in the schema, or -1. |len| bytes of |key| are compared. */
int st__cfg_find(const char* key, size_t len);
/* True when some schema key starts with "|prefix|." */
bool st__cfg_is_section(const char* prefix, size_t len);
const char* st__cfg_type_name(st__cfg_type type);
/* "expected int in [1, 1024]" and friends, into |buf|. */
void st__cfg_expected(const st__cfg_key* k, char* buf, size_t cap);
/* "[1, 1024]", "(0, 1e9]" into |buf|. */
void st__cfg_range(const st__cfg_key* k, char* buf, size_t cap);

/* ---- small helpers (util.c) --------------------------------------------- */

/* Shortest text that reads back to exactly |x|, always with a '.' or an
 * exponent so it stays a float in YAML and JSON ("10000.0", "1e-8"). */
void st__cfg_fmt_float(double x, char out[40]);
/* Shortest text for a range bound: "0", "1e9", "0.5". */
void st__cfg_fmt_bound(double x, char out[40]);

/* |s| quoted as in the canonical value text that st_config_hash hashes and
 * `config --sources` shows. Frozen: changing it changes every config hash. */
void st__cfg_quote_json(st_strbuf* b, const char* s);
/* |s| (|n| bytes) quoted for a message: control bytes escaped, long values cut. */
void st__cfg_quote(const char* s, size_t n, char* out, size_t cap);

/* Edit distance (optimal string alignment: a transposition costs 1). */
int st__cfg_edit_distance(const char* a, size_t an, const char* b, size_t bn);

/* A programmer error (getter misuse): prints and aborts. */
_Noreturn void st__cfg_die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- YAML reading (yaml_read.c) ----------------------------------------- */

typedef enum st__cfg_entry_kind {
  ST__ENTRY_SCALAR,
  ST__ENTRY_NULL, /* empty, ~ or null, unquoted */
  ST__ENTRY_LIST,
  ST__ENTRY_EMPTY_MAP, /* "key: {}": harmless for a section, unknown otherwise (a mapping
                        * under a schema leaf is rejected while reading) */
} st__cfg_entry_kind;

/* One leaf of a file, flattened to its dotted key. */
typedef struct st__cfg_entry {
  char* key; /* owned */
  st__cfg_entry_kind kind;
  char* text;      /* SCALAR: owned, NUL-terminated */
  size_t text_len; /* may differ from strlen when the YAML held "\0" */
  bool quoted;     /* SCALAR: quoted or block style in YAML, i.e. a string ("true" is no bool) */
  char** items;    /* LIST: owned */
  size_t* item_lens;
  int item_count;
  int line, col; /* 1-based, of the key */
} st__cfg_entry;

typedef struct st__cfg_doc {
  st__cfg_entry* entries;
  int count, cap;
  char* base_config; /* owned; NULL when the file names no parent */
  int base_line;
} st__cfg_doc;

/* Parses |len| bytes of YAML into |doc| (zeroed by the caller). |name| is
 * used in messages. Errors are ST_CODE_CONFIG. */
st_status st__cfg_parse_yaml(const char* name, const char* text, size_t len, st__cfg_doc* doc);
void st__cfg_doc_free(st__cfg_doc* doc);

/* ---- loading (config.c) ------------------------------------------------- */

/* Loads YAML text held in memory: no base_config parents, no implicit
 * configs/base.yml. For the fuzz target and tests. */
st_status st__cfg_load_text(const char* name, const char* text, size_t len, int override_count, char* const* overrides,
                            st_config** out_config);

/* Canonical text of one value ("128", "0.003", "true", "\"\"", "[\"a\"]"),
 * the form hashed, printed and written as JSON. */
void st__cfg_value_text(const st_config* config, int index, st_strbuf* out);

#endif /* STRATA_CONFIG_INTERNAL_H */
