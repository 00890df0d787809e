/*
 * emit.c — the resolved config out: YAML (the run snapshot), JSON (for other
 * tools), the sources table (`strata config`) and the Markdown reference
 * (`strata config --schema`, docs/config.md).
 *
 * Keys are dotted; output nests them by section. The schema keeps a
 * section's keys together (a test checks), so a single pass in schema order
 * opens and closes each section once.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>
#include <jansson.h>

#include "config/internal.h"
#include "strata/base.h"

enum { kMaxNesting = 16 };

/* Leading section components ("model" of "model.d_model") shared by a and b. */
static int st__shared_sections(const char* a, const char* b) {
  int shared = 0;
  for (;;) {
    const char* da = strchr(a, '.');
    const char* db = strchr(b, '.');
    if (!da || !db || da - a != db - b || memcmp(a, b, (size_t)(da - a))) return shared;
    ++shared;
    a = da + 1;
    b = db + 1;
  }
}

static int st__sections_of(const char* key) {
  int n = 0;
  for (const char* p = key; *p; ++p) n += *p == '.';
  return n;
}

/* Component |j| of |key|: its start, and its length in *len. */
static const char* st__component(const char* key, int j, size_t* len) {
  const char* p = key;
  for (int i = 0; i < j; ++i) p = strchr(p, '.') + 1;
  const char* dot = strchr(p, '.');
  *len = dot ? (size_t)(dot - p) : strlen(p);
  return p;
}

/* Visits keys in schema order with section open/close callbacks. */
typedef struct {
  void (*open)(void* ctx, const char* name, size_t len, int depth);
  void (*close)(void* ctx, int depth);
  void (*leaf)(void* ctx, int index, const char* name, int depth);
} st__walker;

static void st__cfg_walk(const st__walker* w, void* ctx) {
  int count;
  const st__cfg_key* keys = st__cfg_schema(&count);
  int depth = 0;
  const char* prev = "";
  for (int i = 0; i < count; ++i) {
    const char* key = keys[i].key;
    int want = st__sections_of(key);
    if (want > kMaxNesting) st__cfg_die("config key %s is nested too deeply", key);
    int shared = i ? st__shared_sections(prev, key) : 0;
    while (depth > shared) w->close(ctx, --depth);
    while (depth < want) {
      size_t len;
      const char* name = st__component(key, depth, &len);
      w->open(ctx, name, len, depth++);
    }
    size_t len;
    w->leaf(ctx, i, st__component(key, want, &len), depth);
    prev = key;
  }
  while (depth > 0) w->close(ctx, --depth);
}

/* ---- YAML --------------------------------------------------------------- */

typedef struct {
  const st_config* config;
  yaml_emitter_t emitter;
  bool failed;
} st__yaml_ctx;

static void st__cfg_emit(st__yaml_ctx* y, yaml_event_t* ev, int ok) {
  /* yaml_emitter_emit takes ownership of the event, on failure too. */
  if (y->failed || !ok) {
    if (ok) yaml_event_delete(ev);
    y->failed = true;
    return;
  }
  if (!yaml_emitter_emit(&y->emitter, ev)) y->failed = true;
}

static void st__emit_scalar(st__yaml_ctx* y, const char* text, size_t len, bool quoted) {
  yaml_event_t ev;
  int ok = yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t*)text, (int)len, !quoted, quoted,
                                        quoted ? YAML_DOUBLE_QUOTED_SCALAR_STYLE : YAML_PLAIN_SCALAR_STYLE);
  st__cfg_emit(y, &ev, ok);
}

static void st__yaml_open(void* ctx, const char* name, size_t len, int depth) {
  (void)depth;
  st__yaml_ctx* y = ctx;
  st__emit_scalar(y, name, len, false);
  yaml_event_t ev;
  st__cfg_emit(y, &ev, yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE));
}

static void st__yaml_close(void* ctx, int depth) {
  (void)depth;
  st__yaml_ctx* y = ctx;
  yaml_event_t ev;
  st__cfg_emit(y, &ev, yaml_mapping_end_event_initialize(&ev));
}

static void st__yaml_leaf(void* ctx, int index, const char* name, int depth) {
  (void)depth;
  st__yaml_ctx* y = ctx;
  int count;
  const st__cfg_key* k = &st__cfg_schema(&count)[index];
  const char* key = k->key;
  st__emit_scalar(y, name, strlen(name), false);
  char num[40];
  switch (k->type) {
    case ST__CFG_INT: snprintf(num, sizeof(num), "%lld", (long long)st_config_int(y->config, key)); break;
    case ST__CFG_FLOAT: st__cfg_fmt_float(st_config_float(y->config, key), num); break;
    case ST__CFG_BOOL: snprintf(num, sizeof(num), "%s", st_config_bool(y->config, key) ? "true" : "false"); break;
    case ST__CFG_STRING:
    case ST__CFG_ENUM: {
      /* Quoted: other YAML readers would take an unquoted `off` for false. */
      const char* s = st_config_string(y->config, key);
      st__emit_scalar(y, s, strlen(s), true);
      return;
    }
    case ST__CFG_LIST: {
      yaml_event_t ev;
      st__cfg_emit(y, &ev, yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, YAML_FLOW_SEQUENCE_STYLE));
      int n = st_config_list_count(y->config, key);
      for (int j = 0; j < n; ++j) {
        const char* item = st_config_list_item(y->config, key, j);
        st__emit_scalar(y, item, strlen(item), true);
      }
      st__cfg_emit(y, &ev, yaml_sequence_end_event_initialize(&ev));
      return;
    }
  }
  st__emit_scalar(y, num, strlen(num), false);
}

st_status st_config_write_yaml(const st_config* config, FILE* out) {
  char hash[17];
  st_config_hash(config, NULL, 0, hash);
  fprintf(out,
          "# strata resolved config: every key, fully composed (no base_config).\n"
          "# `strata train <this file>` reproduces the run. config hash %s\n",
          hash);
  fflush(out);
  st__yaml_ctx y;
  memset(&y, 0, sizeof(y));
  y.config = config;
  if (!yaml_emitter_initialize(&y.emitter)) st_oom("YAML emitter");
  yaml_emitter_set_output_file(&y.emitter, out);
  yaml_emitter_set_unicode(&y.emitter, 1);
  yaml_emitter_set_width(&y.emitter, -1); /* never fold long strings */
  yaml_emitter_set_indent(&y.emitter, 2);
  yaml_event_t ev;
  st__cfg_emit(&y, &ev, yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING));
  st__cfg_emit(&y, &ev, yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1));
  st__cfg_emit(&y, &ev, yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE));
  static const st__walker walker = {st__yaml_open, st__yaml_close, st__yaml_leaf};
  st__cfg_walk(&walker, &y);
  st__cfg_emit(&y, &ev, yaml_mapping_end_event_initialize(&ev));
  st__cfg_emit(&y, &ev, yaml_document_end_event_initialize(&ev, 1));
  st__cfg_emit(&y, &ev, yaml_stream_end_event_initialize(&ev));
  if (!y.failed && !yaml_emitter_flush(&y.emitter)) y.failed = true;
  st_status s = ST_OK;
  if (y.failed)
    s = st_status_make(ST_CODE_IO, "cannot write the config as YAML: %s",
                       y.emitter.problem ? y.emitter.problem : strerror(errno));
  yaml_emitter_delete(&y.emitter);
  if (!s && (fflush(out) != 0 || ferror(out)))
    s = st_status_make(ST_CODE_IO, "cannot write the config as YAML: %s", strerror(errno));
  return s;
}

st_status st_config_save(const st_config* config, const char* path) {
  char* buf = NULL;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  if (!f) st_oom("the config as YAML");
  st_status s = st_config_write_yaml(config, f);
  if (fclose(f) != 0) st_oom("the config as YAML");
  if (!s) s = st_fs_write_atomic(path, buf, size);
  free(buf);
  return s;
}

/* ---- JSON --------------------------------------------------------------- */

typedef struct {
  const st_config* config;
  json_t* at[kMaxNesting + 2]; /* the open object at each depth */
} st__json_ctx;

static void st__json_open(void* ctx, const char* name, size_t len, int depth) {
  st__json_ctx* j = ctx;
  char* key = st_xstrndup(name, len);
  j->at[depth + 1] = st_json_obj();
  st_json_put(j->at[depth], key, j->at[depth + 1]); /* the parent holds the reference */
  free(key);
}

static void st__json_close(void* ctx, int depth) {
  (void)ctx;
  (void)depth;
}

static void st__json_leaf(void* ctx, int index, const char* name, int depth) {
  st__json_ctx* j = ctx;
  int count;
  const st__cfg_key* k = &st__cfg_schema(&count)[index];
  json_t* v = NULL;
  switch (k->type) {
    case ST__CFG_INT: v = st_json_int(st_config_int(j->config, k->key)); break;
    case ST__CFG_FLOAT: v = st_json_num(st_config_float(j->config, k->key)); break;
    case ST__CFG_BOOL: v = st_json_bool(st_config_bool(j->config, k->key)); break;
    case ST__CFG_STRING:
    case ST__CFG_ENUM: v = st_json_str(st_config_string(j->config, k->key)); break;
    case ST__CFG_LIST: {
      v = st_json_arr();
      int n = st_config_list_count(j->config, k->key);
      for (int i = 0; i < n; ++i) st_json_push(v, st_json_str(st_config_list_item(j->config, k->key, i)));
      break;
    }
  }
  st_json_put(j->at[depth], name, v);
}

json_t* st_config_json(const st_config* config) {
  st__json_ctx j;
  memset(&j, 0, sizeof(j));
  j.config = config;
  j.at[0] = st_json_obj();
  static const st__walker walker = {st__json_open, st__json_close, st__json_leaf};
  st__cfg_walk(&walker, &j);
  return j.at[0];
}

st_status st_config_write_json(const st_config* config, FILE* out) {
  json_t* tree = st_config_json(config);
  char* text = st_json_dump(tree, 2);
  json_decref(tree);
  st_status s = ST_OK;
  if (fprintf(out, "%s\n", text) < 0 || fflush(out) != 0)
    s = st_status_make(ST_CODE_IO, "cannot write the config as JSON: %s", strerror(errno));
  free(text);
  return s;
}

/* ---- sources table ------------------------------------------------------ */

st_status st_config_print_sources(const st_config* config, FILE* out) {
  int count;
  const st__cfg_key* keys = st__cfg_schema(&count);
  st_strbuf* values = st_xcalloc((size_t)count, sizeof(st_strbuf));
  size_t key_w = 3, val_w = 5;
  for (int i = 0; i < count; ++i) {
    st__cfg_value_text(config, i, &values[i]);
    if (strlen(keys[i].key) > key_w) key_w = strlen(keys[i].key);
    /* A long path should not push every source off the screen. */
    if (values[i].len > val_w && values[i].len <= 40) val_w = values[i].len;
  }
  st_strbuf b = {0};
  st_strbuf_printf(&b, "%-*s  %-*s  %s\n", (int)key_w, "key", (int)val_w, "value", "source");
  for (int i = 0; i < count; ++i)
    st_strbuf_printf(&b, "%-*s  %-*s  %s\n", (int)key_w, keys[i].key, (int)val_w, st_strbuf_cstr(&values[i]),
                       st_config_source(config, keys[i].key));
  char hash[17];
  st_config_hash(config, NULL, 0, hash);
  st_strbuf_printf(&b, "\nconfig hash: %s\n", hash);
  for (int i = 0; i < count; ++i) st_strbuf_free(&values[i]);
  free(values);
  st_status s = ST_OK;
  if (fwrite(b.data, 1, b.len, out) != b.len || fflush(out) != 0)
    s = st_status_make(ST_CODE_IO, "cannot write the config: %s", strerror(errno));
  st_strbuf_free(&b);
  return s;
}

/* ---- Markdown reference ------------------------------------------------- */

/* Table cells: a '|' would end the cell. */
static void st__md_cell(st_strbuf* b, const char* s) {
  for (; *s; ++s) {
    if (*s == '|')
      st_strbuf_append(b, "\\|");
    else
      st_strbuf_append_n(b, s, 1);
  }
}

static void st__md_section_heading(st_strbuf* b, const char* section, size_t len) {
  int n;
  const st__cfg_section* sections = st__cfg_sections(&n);
  const char* doc = NULL;
  for (int i = 0; i < n; ++i)
    if (strlen(sections[i].name) == len && !memcmp(sections[i].name, section, len)) doc = sections[i].doc;
  if (len == 0)
    st_strbuf_append(b, "\n## Top level\n\n");
  else
    st_strbuf_printf(b, "\n## `%.*s`\n\n", (int)len, section);
  if (doc) st_strbuf_printf(b, "%s\n\n", doc);
  st_strbuf_append(b, "| Key | Type | Default | Allowed | Description |\n|---|---|---|---|---|\n");
}

st_status st_config_write_schema_markdown(FILE* out) {
  st_config* defaults = NULL;
  ST_RETURN(st_config_load(NULL, 0, NULL, &defaults));
  int count;
  const st__cfg_key* keys = st__cfg_schema(&count);
  st_strbuf b = {0};
  st_strbuf_append(&b,
                   "# Configuration reference\n\n"
                   "<!-- Generated by `strata config --schema` from src/config/schema.c; do not edit.\n"
                   "     A test fails when this file and the schema differ. Regenerate with:\n"
                   "     ./build/strata config --schema > docs/config.md -->\n\n"
                   "Every key strata accepts, with its type, default and allowed values. Keys are\n"
                   "set in YAML files (nested maps or dotted keys) and on the command line as\n"
                   "`key=value`; see [config-guide.md](config-guide.md) for how files compose and\n"
                   "how `strata config` reports where each value came from. Ranges use `[` and `]`\n"
                   "for bounds that are allowed and `(` and `)` for bounds that are not.\n");
  const char* prev = NULL;
  for (int i = 0; i < count; ++i) {
    const st__cfg_key* k = &keys[i];
    const char* dot = strrchr(k->key, '.');
    size_t sec_len = dot ? (size_t)(dot - k->key) : 0;
    const char* pdot = prev ? strrchr(prev, '.') : NULL;
    size_t prev_len = pdot ? (size_t)(pdot - prev) : 0;
    if (!prev || sec_len != prev_len || memcmp(prev, k->key, sec_len)) st__md_section_heading(&b, k->key, sec_len);
    prev = k->key;

    st_strbuf def = {0}, allowed = {0};
    st__cfg_value_text(defaults, i, &def);
    char range[100];
    switch (k->type) {
      case ST__CFG_INT:
      case ST__CFG_FLOAT:
        st__cfg_range(k, range, sizeof(range));
        st_strbuf_append(&allowed, range);
        break;
      case ST__CFG_BOOL: st_strbuf_append(&allowed, "`true`, `false`"); break;
      case ST__CFG_STRING: st_strbuf_append(&allowed, "any string"); break;
      case ST__CFG_LIST: st_strbuf_append(&allowed, "list of strings"); break;
      case ST__CFG_ENUM:
        for (const char* p = k->choices; *p;) {
          const char* bar = strchr(p, '|');
          size_t len = bar ? (size_t)(bar - p) : strlen(p);
          st_strbuf_printf(&allowed, "%s`%.*s`", p == k->choices ? "" : ", ", (int)len, p);
          p = bar ? bar + 1 : p + len;
        }
        break;
    }
    st_strbuf_printf(&b, "| `%s` | %s | `", k->key, st__cfg_type_name(k->type));
    st__md_cell(&b, def.data ? def.data : "");
    st_strbuf_append(&b, "` | ");
    st__md_cell(&b, allowed.data ? allowed.data : "");
    st_strbuf_append(&b, " | ");
    st__md_cell(&b, k->doc);
    st_strbuf_append(&b, " |\n");
    st_strbuf_free(&def);
    st_strbuf_free(&allowed);
  }

  int n;
  const st__cfg_rule* rules = st__cfg_rules(&n);
  st_strbuf_append(&b, "\n## Cross-field rules\n\nChecked after every file and override is applied:\n\n");
  for (int i = 0; i < n; ++i) st_strbuf_printf(&b, "- %s\n", rules[i].doc);

  const st__cfg_env* envs = st__cfg_envs(&n);
  st_strbuf_append(&b,
                   "\n## Environment variables\n\n"
                   "Only these are read, and only where a key's empty default says so:\n\n"
                   "| Variable | Meaning |\n|---|---|\n");
  for (int i = 0; i < n; ++i) {
    st_strbuf_printf(&b, "| `%s` | ", envs[i].name);
    st__md_cell(&b, envs[i].doc);
    st_strbuf_append(&b, " |\n");
  }
  st_config_destroy(defaults);
  st_status s = ST_OK;
  if (fwrite(b.data, 1, b.len, out) != b.len || fflush(out) != 0)
    s = st_status_make(ST_CODE_IO, "cannot write the schema: %s", strerror(errno));
  st_strbuf_free(&b);
  return s;
}
