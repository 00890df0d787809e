/*
 * config.c — loading: compose configs/base.yml -> base_config parents -> the
 * file -> command-line overrides, each value typed and range-checked against
 * the schema as it is applied (so its error names where it came from), then
 * the cross-field rules. Also the getters and the hash.
 *
 * Reentrant: all state lives in the st_config being built and in locals.
 */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* For XXH64_state_t on the stack: the hash then cannot fail to allocate. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "config/internal.h"
#include "strata/base.h"

/* The repository's configs/ folder (st_source_dir), with a trailing slash;
 * owned by caller. */
static char* st__configs_dir(void) { return st_path_join(st_source_dir(), "configs/"); }

enum {
  kMaxChain = 16,                  /* base_config parents, file included */
  kMaxFileBytes = 16 * 1024 * 1024 /* a config larger than this is a mistake */
};

typedef struct st__cfg_value {
  int64_t i;
  double f;
  bool b;
  char* s;      /* STRING and ENUM; owned */
  char** items; /* LIST; owned */
  int n;
  char* source; /* owned: "default", "configs/tiny.yml:4", "command line" */
} st__cfg_value;

struct st_config {
  int count; /* == schema size */
  st__cfg_value* v;
};


static void st__value_clear(st__cfg_value* v) {
  free(v->s);
  for (int j = 0; j < v->n; ++j) free(v->items[j]);
  free(v->items);
  free(v->source);
  memset(v, 0, sizeof(*v));
}

void st_config_destroy(st_config* config) {
  if (!config) return;
  for (int i = 0; i < config->count; ++i) st__value_clear(&config->v[i]);
  free(config->v);
  free(config);
}

/* ---- typed parsing ------------------------------------------------------ */

static st_status st__type_error(const st__cfg_key* k, const char* text, size_t len, const char* what, const char* src) {
  char shown[400], expected[200];
  st__cfg_quote(text, len, shown, sizeof(shown));
  st__cfg_expected(k, expected, sizeof(expected));
  return st_status_make(ST_CODE_CONFIG, "%s: '%s' is not %s (%s) (%s)", k->key, shown, what, expected, src);
}

static st_status st__range_error(const st__cfg_key* k, const char* text, size_t len, const char* src) {
  char shown[400], range[100];
  st__cfg_quote(text, len, shown, sizeof(shown));
  st__cfg_range(k, range, sizeof(range));
  return st_status_make(ST_CODE_CONFIG, "%s: %s is out of range %s (%s)", k->key, shown, range, src);
}

static bool st__in_range(const st__cfg_key* k, double x) {
  if (x < k->lo || (k->lo_open && x == k->lo)) return false;
  if (x > k->hi || (k->hi_open && x == k->hi)) return false;
  return true;
}

/* Decimal integer, optional sign, nothing else. *overflow when it does not
 * fit int64 (then reported as out of range, which is what it is). */
static bool st__parse_int(const char* s, size_t n, int64_t* out, bool* overflow) {
  *overflow = false;
  size_t i = 0;
  if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
  if (i == n) return false;
  for (size_t j = i; j < n; ++j)
    if (s[j] < '0' || s[j] > '9') return false;
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno == ERANGE) {
    *overflow = true;
    return true;
  }
  *out = (int64_t)v;
  return true;
}

/* Decimal float ("0.5", "1e-8", "3"): no hex, inf or nan, which strtod
 * would take but a config should not. *overflow for values past double. */
static bool st__parse_float(const char* s, size_t n, double* out, bool* overflow) {
  *overflow = false;
  if (n == 0) return false;
  bool digit = false;
  for (size_t j = 0; j < n; ++j) {
    char c = s[j];
    if (c >= '0' && c <= '9')
      digit = true;
    else if (!(c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E'))
      return false;
  }
  if (!digit) return false;
  errno = 0;
  char* end = NULL;
  double v = strtod(s, &end);
  if (end != s + n) return false;
  if (!isfinite(v)) {
    *overflow = true;
    return true;
  }
  *out = v;
  return true;
}

static bool st__enum_has(const char* choices, const char* s, size_t n) {
  for (const char* p = choices;;) {
    const char* bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && !memcmp(p, s, n)) return true;
    if (!bar) return false;
    p = bar + 1;
  }
}

/* Checks text that goes into a string: no NUL (it would silently cut the
 * value), valid UTF-8 (the YAML writer needs it; files are checked by libyaml
 * but the command line is not). */
static st_status st__check_text(const st__cfg_key* k, const char* s, size_t n, const char* src) {
  /* Every string is a path, a name or a short option: a longer one is a
   * mistake, and would be echoed whole into messages, events and
   * config.yaml. */
  if (n > ST_CONFIG_MAX_STRING) {
    char shown[400];
    st__cfg_quote(s, n, shown, sizeof(shown));
    return st_status_make(ST_CODE_CONFIG, "%s: value is %zu bytes long, more than the %d allowed ('%s') (%s)", k->key, n,
                          ST_CONFIG_MAX_STRING, shown, src);
  }
  if (memchr(s, '\0', n)) return st_status_make(ST_CODE_CONFIG, "%s: value contains a NUL character (%s)", k->key, src);
  if (!st_utf8_valid(s, n))
    return st_status_make(ST_CODE_CONFIG, "%s: value is not valid UTF-8 (%s)", k->key, src);
  return ST_OK;
}

/* Parses entry |e| for key |k| into |out| (empty on entry). */
static st_status st__parse_value(const st__cfg_key* k, const st__cfg_entry* e, const char* src, st__cfg_value* out) {
  char expected[200];
  if (e->kind == ST__ENTRY_LIST && k->type != ST__CFG_LIST) {
    st__cfg_expected(k, expected, sizeof(expected));
    return st_status_make(ST_CODE_CONFIG, "%s: got a list, %s (%s)", k->key, expected, src);
  }
  if (e->kind == ST__ENTRY_EMPTY_MAP) {
    st__cfg_expected(k, expected, sizeof(expected));
    return st_status_make(ST_CODE_CONFIG, "%s: got a mapping, %s (%s)", k->key, expected, src);
  }
  const char* t = e->text ? e->text : "";
  size_t n = e->text ? e->text_len : 0;
  bool overflow;
  if (e->quoted && (k->type == ST__CFG_INT || k->type == ST__CFG_FLOAT || k->type == ST__CFG_BOOL)) {
    /* YAML reads "true" and "5" as strings; taking them for a bool or a
     * number would hide a type mismatch like any other. */
    char shown[400];
    st__cfg_quote(t, n, shown, sizeof(shown));
    st__cfg_expected(k, expected, sizeof(expected));
    return st_status_make(ST_CODE_CONFIG, "%s: \"%s\" is a quoted string, not %s (%s; write it without quotes) (%s)", k->key,
                          shown, k->type == ST__CFG_BOOL ? "a bool" : k->type == ST__CFG_INT ? "an int" : "a float", expected, src);
  }
  switch (k->type) {
    case ST__CFG_INT:
      if (!st__parse_int(t, n, &out->i, &overflow)) return st__type_error(k, t, n, "an int", src);
      if (overflow || !st__in_range(k, (double)out->i)) return st__range_error(k, t, n, src);
      return ST_OK;
    case ST__CFG_FLOAT:
      if (!st__parse_float(t, n, &out->f, &overflow)) return st__type_error(k, t, n, "a float", src);
      if (overflow || !st__in_range(k, out->f)) return st__range_error(k, t, n, src);
      return ST_OK;
    case ST__CFG_BOOL:
      /* YAML 1.1 also has yes/no/on/off; they surprise more than they help. */
      if ((n == 4 && (!memcmp(t, "true", 4) || !memcmp(t, "True", 4) || !memcmp(t, "TRUE", 4)))) {
        out->b = true;
        return ST_OK;
      }
      if ((n == 5 && (!memcmp(t, "false", 5) || !memcmp(t, "False", 5) || !memcmp(t, "FALSE", 5)))) {
        out->b = false;
        return ST_OK;
      }
      return st__type_error(k, t, n, "a bool", src);
    case ST__CFG_ENUM:
      if (!st__enum_has(k->choices, t, n)) return st__type_error(k, t, n, "an allowed value", src);
      out->s = st_xstrndup(t, n);
      return ST_OK;
    case ST__CFG_STRING:
      if (e->kind == ST__ENTRY_NULL) n = 0; /* "key:" or "key: ~" is the empty string */
      ST_RETURN(st__check_text(k, t, n, src));
      out->s = st_xstrndup(t, n);
      return ST_OK;
    case ST__CFG_LIST:
      if (e->kind == ST__ENTRY_NULL) return ST_OK; /* "key:" is the empty list */
      if (e->kind != ST__ENTRY_LIST) return st__type_error(k, t, n, "a list", src);
      if (e->item_count > 0) {
        out->items = st_xcalloc((size_t)e->item_count, sizeof(char*));
      }
      for (int j = 0; j < e->item_count; ++j) {
        ST_RETURN(st__check_text(k, e->items[j], e->item_lens[j], src));
        out->items[j] = st_xstrndup(e->items[j], e->item_lens[j]);
        out->n = j + 1;
      }
      return ST_OK;
  }
  assert(!"a schema type the switch above does not know"); /* the schema is compiled in */
  return st_status_make(ST_CODE_INTERNAL, "%s: unknown schema type", k->key);
}

/* ---- unknown keys ------------------------------------------------------- */

static const char* st__last_component(const char* key) {
  const char* dot = strrchr(key, '.');
  return dot ? dot + 1 : key;
}

/* The schema key (or section) closest to |key|, quoted, into |out|
 * ("'train.steps'"); "" when nothing is close enough to be a likely typo. */
static void st__suggest(const char* key, char* out, size_t cap) {
  int count;
  const st__cfg_key* keys = st__cfg_schema(&count);
  size_t kn = strlen(key);
  int best = INT_MAX;
  out[0] = '\0';
  for (int i = 0; i < count; ++i) {
    /* Candidates: every key and every section prefix of it. */
    const char* cand = keys[i].key;
    for (size_t len = strlen(cand); len > 0;) {
      int d = st__cfg_edit_distance(key, kn, cand, len);
      if (d < best) {
        best = d;
        snprintf(out, cap, "'%.*s'", (int)len, cand);
      }
      const char* dot = NULL;
      for (size_t j = len; j > 0; --j)
        if (cand[j - 1] == '.') {
          dot = cand + j - 1;
          break;
        }
      len = dot ? (size_t)(dot - cand) : 0;
    }
  }
  /* A typo is a couple of edits, or about a third of a long key. */
  if (best <= 2 || (size_t)best * 3 <= kn) return;
  out[0] = '\0';
  /* Not a typo: maybe the right name in the wrong section ("steps" ->
   * "train.steps"); every key with that name, when a few have it
   * ("'train.steps' or 'trace.steps'"). */
  const char* leaf = st__last_component(key);
  int found[4], n = 0;
  for (int i = 0; i < count; ++i) {
    if (!strcmp(st__last_component(keys[i].key), leaf)) {
      if (n == 4) return;
      found[n++] = i;
    }
  }
  size_t used = 0;
  for (int k = 0; k < n && used < cap; ++k)
    used += (size_t)snprintf(out + used, cap - used, "%s'%s'", k == 0 ? "" : k == n - 1 ? " or " : ", ", keys[found[k]].key);
}

static st_status st__unknown_key(const char* key, const char* where) {
  char suggestion[256], shown[400];
  st__suggest(key, suggestion, sizeof(suggestion));
  st__cfg_quote(key, strlen(key), shown, sizeof(shown));
  if (suggestion[0])
    return st_status_make(ST_CODE_CONFIG, "unknown key '%s' %s (did you mean %s?)", shown, where, suggestion);
  return st_status_make(ST_CODE_CONFIG, "unknown key '%s' %s (see `strata config --schema`)", shown, where);
}

/* ---- applying ----------------------------------------------------------- */

/* Applies one entry. |where| is "in exp.yml:4" / "on the command line" for
 * unknown keys, |src| is "exp.yml:4" / "command line" for the value. */
static st_status st__apply(st_config* c, const st__cfg_entry* e, const char* where, const char* src) {
  int idx = st__cfg_find(e->key, strlen(e->key));
  if (idx < 0) {
    if (st__cfg_is_section(e->key, strlen(e->key))) {
      /* "train:" with nothing under it, or "train: {}": harmless. */
      if (e->kind == ST__ENTRY_NULL || e->kind == ST__ENTRY_EMPTY_MAP) return ST_OK;
      return st_status_make(ST_CODE_CONFIG, "'%s' is a section, not a key: set its keys (%s.<key>) (%s)", e->key,
                            e->key, src);
    }
    return st__unknown_key(e->key, where);
  }
  int count;
  const st__cfg_key* k = &st__cfg_schema(&count)[idx];
  st__cfg_value v = {0};
  st_status s = st__parse_value(k, e, src, &v);
  if (!s) v.source = st_xstrdup(src);
  if (s) {
    st__value_clear(&v);
    return s;
  }
  st__value_clear(&c->v[idx]);
  c->v[idx] = v;
  return ST_OK;
}

static st_status st__apply_doc(st_config* c, const char* name, const st__cfg_doc* doc) {
  for (int i = 0; i < doc->count; ++i) {
    const st__cfg_entry* e = &doc->entries[i];
    char src[4200], where[4300];
    snprintf(src, sizeof(src), "%s:%d", name, e->line);
    snprintf(where, sizeof(where), "in %s", src);
    ST_RETURN(st__apply(c, e, where, src));
  }
  return ST_OK;
}

/* "[a, b]" -> items. Items may be quoted ('a, b' or "a, b") to hold commas;
 * inside double quotes \" and \\ escape. */
static bool st__split_list(const char* s, st__cfg_entry* e) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) --n;
  while (n && (*s == ' ' || *s == '\t')) ++s, --n;
  if (n < 2 || s[0] != '[' || s[n - 1] != ']') return false;
  const char* p = s + 1;
  const char* end = s + n - 1;
  for (;;) {
    while (p < end && (*p == ' ' || *p == '\t')) ++p;
    if (p == end) return true; /* only for "[]": after a comma an item must follow */
    st_strbuf item = {0};
    st_strbuf_append_n(&item, "", 0);
    if (*p == '"' || *p == '\'') {
      char q = *p++;
      for (;;) {
        if (p == end) {
          st_strbuf_free(&item);
          return false;
        }
        if (*p == q) {
          ++p;
          break;
        }
        if (q == '"' && *p == '\\' && p + 1 < end) ++p;
        st_strbuf_append_n(&item, p++, 1);
      }
      while (p < end && (*p == ' ' || *p == '\t')) ++p;
    } else {
      const char* a = p;
      while (p < end && *p != ',') ++p;
      const char* b = p;
      while (b > a && (b[-1] == ' ' || b[-1] == '\t')) --b;
      if (b == a) {
        st_strbuf_free(&item);
        return false;
      }
      st_strbuf_append_n(&item, a, (size_t)(b - a));
    }
    if (p < end && *p != ',') {
      st_strbuf_free(&item);
      return false;
    }
    e->items = st_xrealloc(e->items, (size_t)(e->item_count + 1) * sizeof(char*));
    e->item_lens = st_xrealloc(e->item_lens, (size_t)(e->item_count + 1) * sizeof(size_t));
    e->item_lens[e->item_count] = item.len;
    e->items[e->item_count] = st_strbuf_take(&item);
    e->item_count++;
    if (p == end) return true;
    ++p; /* the comma */
    while (p < end && (*p == ' ' || *p == '\t')) ++p;
    if (p == end) return false; /* trailing comma */
  }
}

static void st__entry_clear(st__cfg_entry* e) {
  for (int j = 0; j < e->item_count; ++j) free(e->items[j]);
  free(e->items);
  free(e->item_lens);
  memset(e, 0, sizeof(*e));
}

/* One "key=value" from the command line (or st_config_set). */
static st_status st__apply_override(st_config* c, const char* arg, const char* src) {
  const char* eq = strchr(arg, '=');
  if (!eq || eq == arg) {
    char shown[400];
    st__cfg_quote(arg, strlen(arg), shown, sizeof(shown));
    return st_status_make(ST_CODE_CONFIG, "'%s' is not key=value (%s)", shown, src);
  }
  char* key = st_xstrndup(arg, (size_t)(eq - arg));
  const char* value = eq + 1;
  st_status s = ST_OK;
  char where[300];
  snprintf(where, sizeof(where), "%s%s", strcmp(src, "command line") ? "from " : "on the ", src);
  if (!strcmp(key, "base_config")) {
    s = st_status_make(ST_CODE_CONFIG, "base_config can only be set in a file, not %s", where);
  } else {
    st__cfg_entry e = {0};
    e.key = key;
    e.kind = ST__ENTRY_SCALAR;
    e.text = (char*)value;
    e.text_len = strlen(value);
    int idx = st__cfg_find(key, strlen(key));
    int count;
    if (idx >= 0 && st__cfg_schema(&count)[idx].type == ST__CFG_LIST) {
      if (st__split_list(value, &e)) {
        e.kind = ST__ENTRY_LIST;
      } else {
        st__entry_clear(&e);
        e.key = key;
        e.kind = ST__ENTRY_SCALAR;
        e.text = (char*)value;
        e.text_len = strlen(value);
      }
    }
    s = st__apply(c, &e, where, src);
    e.text = NULL;
    e.key = NULL;
    st__entry_clear(&e);
  }
  free(key);
  return s;
}

static st_status st__check_rules(const st_config* c) {
  int n;
  const st__cfg_rule* rules = st__cfg_rules(&n);
  for (int i = 0; i < n; ++i) ST_RETURN(rules[i].check(c));
  return ST_OK;
}

static st_status st__defaults(st_config** out) {
  int count;
  const st__cfg_key* keys = st__cfg_schema(&count);
  st_config* c = st_xcalloc(1, sizeof(*c));
  c->v = st_xcalloc((size_t)count, sizeof(*c->v));
  c->count = count;
  for (int i = 0; i < count; ++i) {
    /* Defaults take the same path as user text: one parser, one range check. */
    st__cfg_entry e = {0};
    e.key = (char*)keys[i].key;
    e.kind = ST__ENTRY_SCALAR;
    e.text = (char*)keys[i].def;
    e.text_len = strlen(keys[i].def);
    if (keys[i].type == ST__CFG_LIST && !st__split_list(keys[i].def, &e))
      st__cfg_die("schema default of %s is not a list: %s", keys[i].key, keys[i].def);
    if (keys[i].type == ST__CFG_LIST) e.kind = ST__ENTRY_LIST;
    st_status s = st__apply(c, &e, "in the schema", "default");
    e.key = NULL;
    e.text = NULL;
    st__entry_clear(&e);
    if (s) {
      if (st_status_code(s) == ST_CODE_INTERNAL) {
        st_config_destroy(c);
        return s;
      }
      st__cfg_die("schema default is invalid: %s", st_status_message(s));
    }
  }
  *out = c;
  return ST_OK;
}

/* ---- files -------------------------------------------------------------- */

static st_status st__read_file(const char* path, char** out, size_t* out_len, int* err) {
  *out = NULL;
  *err = 0;
  FILE* f = fopen(path, "rb");
  if (!f) {
    *err = errno;
    return ST_OK;
  }
  st_strbuf b = {0};
  char chunk[8192];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
    st_strbuf_append_n(&b, chunk, n);
    if (b.len > kMaxFileBytes) break;
  }
  int read_err = ferror(f) ? errno : 0;
  fclose(f);
  if (read_err || b.len > kMaxFileBytes) {
    st_strbuf_free(&b);
    *err = read_err ? read_err : EFBIG;
    return ST_OK;
  }
  *out_len = b.len;
  *out = st_strbuf_take(&b);
  return ST_OK;
}

static bool st__exists(const char* path) { return access(path, F_OK) == 0; }

/* |rel| resolved against the folder of |from| ("configs/tiny.yml" + "base.yml"
 * -> "configs/base.yml"). */
static char* st__join_dir_of(const char* from, const char* rel) {
  if (rel[0] == '/') return st_xstrdup(rel);
  const char* slash = strrchr(from, '/');
  st_strbuf b = {0};
  if (slash) {
    st_strbuf_append_n(&b, from, (size_t)(slash - from) + 1);
  }
  st_strbuf_append(&b, rel);
  return st_strbuf_take(&b);
}

/* Paths under the current folder are shown relative to it: messages and
 * sources then read "configs/base.yml:3", not an absolute build path. */
static char* st__display_path(const char* path) {
  char cwd[4096];
  if (path[0] == '/' && getcwd(cwd, sizeof(cwd))) {
    size_t n = strlen(cwd);
    if (n > 1 && !strncmp(path, cwd, n) && path[n] == '/') return st_xstrdup(path + n + 1);
  }
  return st_xstrdup(path);
}

typedef struct {
  char* display; /* as shown in messages and sources */
  char* real;    /* realpath, for cycles and "is this configs/base.yml" */
  st__cfg_doc doc;
} st__cfg_file;

static void st__file_free(st__cfg_file* f) {
  free(f->display);
  free(f->real);
  st__cfg_doc_free(&f->doc);
}

static st_status st__load_file(st__cfg_file* f, const char* path, const char* missing_context) {
  char* text = NULL;
  size_t len = 0;
  int err = 0;
  memset(f, 0, sizeof(*f));
  ST_RETURN(st__read_file(path, &text, &len, &err));
  if (!text) {
    if (missing_context)
      return st_status_make(ST_CODE_CONFIG, "cannot read base_config '%s' %s: %s", path, missing_context,
                            strerror(err));
    return st_status_make(ST_CODE_CONFIG, "cannot read config file '%s': %s", path, strerror(err));
  }
  f->display = st_xstrdup(path);
  f->real = realpath(path, NULL);
  st_status s = f->real ? ST_OK : st_status_make(ST_CODE_CONFIG, "cannot resolve config file '%s': %s", path, strerror(errno));
  if (!s) s = st__cfg_parse_yaml(f->display, text, len, &f->doc);
  free(text);
  /* An empty file is valid YAML, but as a config it is most likely the
   * wrong file or an unsaved one: say so rather than silently train
   * configs/base.yml. */
  if (!s && f->doc.count == 0 && !f->doc.base_config)
    fprintf(stderr, "strata: warning: config file '%s' is empty (or only comments): it sets nothing, the defaults of "
                    "configs/base.yml apply\n", path);
  return s;
}

static st_status st__cycle_error(st__cfg_file* chain, int n, const char* again) {
  st_strbuf b = {0};
  for (int i = 0; i < n; ++i) st_strbuf_printf(&b, "%s -> ", chain[i].display);
  st_strbuf_append(&b, again);
  st_status s = st_status_make(ST_CODE_CONFIG, "base_config cycle: %s", b.data);
  st_strbuf_free(&b);
  return s;
}

/* Reads |path| and its base_config parents into chain[0..*n) (the file
 * first, its root parent last). */
static st_status st__load_chain(const char* path, st__cfg_file* chain, int* n) {
  *n = 1; /* even on failure, so the caller frees what was filled */
  ST_RETURN(st__load_file(&chain[0], path, NULL));
  while (chain[*n - 1].doc.base_config) {
    st__cfg_file* child = &chain[*n - 1];
    const char* rel = child->doc.base_config;
    char context[4200];
    snprintf(context, sizeof(context), "named in %s:%d", child->display, child->doc.base_line);
    /* Relative to the including file first, then to the configs/ folder, so
     * an experiment anywhere can say `base_config: small.yml`. */
    char* candidate = st__join_dir_of(child->display, rel);
    if (!st__exists(candidate) && rel[0] != '/') {
      char* configs = st__configs_dir();
      char* in_configs = st__join_dir_of(configs, rel);
      free(configs);
      if (st__exists(in_configs)) {
        free(candidate);
        candidate = st__display_path(in_configs);
        free(in_configs);
      } else {
        st_status s = st_status_make(ST_CODE_CONFIG, "base_config '%s' %s not found (looked for %s and %s)", rel,
                                     context, candidate, in_configs);
        free(candidate);
        free(in_configs);
        return s;
      }
    }
    char* real = realpath(candidate, NULL);
    for (int i = 0; real && i < *n; ++i) {
      if (!strcmp(chain[i].real, real)) {
        st_status s = st__cycle_error(chain, *n, candidate);
        free(real);
        free(candidate);
        return s;
      }
    }
    free(real);
    if (*n == kMaxChain) {
      free(candidate);
      return st_status_make(ST_CODE_CONFIG, "base_config chain from %s is longer than %d files", chain[0].display,
                            kMaxChain);
    }
    st_status s = st__load_file(&chain[*n], candidate, context);
    free(candidate);
    ++*n; /* even on failure, so the caller frees what was filled */
    if (s) return s;
  }
  return ST_OK;
}

static st_status st__load_files(st_config* c, const char* path) {
  st__cfg_file chain[kMaxChain + 1];
  int n = 0;
  memset(chain, 0, sizeof(chain));
  st_status s = st__load_chain(path, chain, &n);
  /* configs/base.yml is every file's implicit root (unless the chain already
   * names it): it holds the defaults the way MaxText's base.yml does. */
  st__cfg_file root;
  memset(&root, 0, sizeof(root));
  bool have_root = false;
  if (!s) {
    char* configs = st__configs_dir();
    char* root_path = st_path_join(configs, "base.yml");
    free(configs);
    char* root_real = realpath(root_path, NULL);
    bool in_chain = false;
    for (int i = 0; root_real && i < n; ++i) in_chain |= !strcmp(chain[i].real, root_real);
    if (root_real && !in_chain) {
      char* shown = st__display_path(root_path);
      s = st__load_file(&root, shown, NULL);
      free(shown);
      have_root = true;
      if (!s && root.doc.base_config)
        s = st_status_make(ST_CODE_CONFIG, "%s:%d: the root config cannot name a base_config", root.display,
                           root.doc.base_line);
    }
    free(root_real);
    free(root_path);
  }
  if (!s && have_root) s = st__apply_doc(c, root.display, &root.doc);
  for (int i = n - 1; !s && i >= 0; --i) s = st__apply_doc(c, chain[i].display, &chain[i].doc);
  if (have_root) st__file_free(&root);
  for (int i = 0; i < n; ++i) st__file_free(&chain[i]);
  return s;
}

static st_status st__finish(st_config* c, int override_count, char* const* overrides) {
  for (int i = 0; i < override_count; ++i) ST_RETURN(st__apply_override(c, overrides[i], "command line"));
  return st__check_rules(c);
}

st_status st_config_load(const char* path, int override_count, char* const* overrides, st_config** out_config) {
  *out_config = NULL;
  st_config* c = NULL;
  ST_RETURN(st__defaults(&c));
  st_status s = path ? st__load_files(c, path) : ST_OK;
  if (!s) s = st__finish(c, override_count, overrides);
  if (s) {
    st_config_destroy(c);
    return s;
  }
  *out_config = c;
  return ST_OK;
}

st_status st__cfg_load_text(const char* name, const char* text, size_t len, int override_count, char* const* overrides,
                            st_config** out_config) {
  *out_config = NULL;
  st_config* c = NULL;
  ST_RETURN(st__defaults(&c));
  st__cfg_doc doc;
  memset(&doc, 0, sizeof(doc));
  st_status s = st__cfg_parse_yaml(name, text, len, &doc);
  if (!s && doc.base_config)
    s = st_status_make(ST_CODE_CONFIG, "%s:%d: base_config is not supported here", name, doc.base_line);
  if (!s) s = st__apply_doc(c, name, &doc);
  st__cfg_doc_free(&doc);
  if (!s) s = st__finish(c, override_count, overrides);
  if (s) {
    st_config_destroy(c);
    return s;
  }
  *out_config = c;
  return ST_OK;
}

st_status st_config_set(st_config* config, const char* key, const char* value, const char* source) {
  assert(config && key && value); /* a caller's bug, not bad input */
  st_strbuf arg = {0};
  st_strbuf_printf(&arg, "%s=%s", key, value);
  /* Keep the old value so a rule violation leaves the config as it was. */
  int idx = st__cfg_find(key, strlen(key));
  st__cfg_value saved = {0};
  if (idx >= 0) {
    saved = config->v[idx];
    memset(&config->v[idx], 0, sizeof(saved));
  }
  st_status s = st__apply_override(config, arg.data, source ? source : "command line");
  if (!s) s = st__check_rules(config);
  if (idx >= 0) {
    if (s || !config->v[idx].source) {
      st__value_clear(&config->v[idx]);
      config->v[idx] = saved;
    } else {
      st__value_clear(&saved);
    }
  }
  st_strbuf_free(&arg);
  return s;
}

/* ---- getters ------------------------------------------------------------ */

static const st__cfg_value* st__cfg_get(const st_config* c, const char* key, st__cfg_type want, st__cfg_type also,
                                    const char* fn) {
  if (!c || !key) st__cfg_die("%s: NULL config or key", fn);
  int idx = st__cfg_find(key, strlen(key));
  if (idx < 0) st__cfg_die("%s: '%s' is not a config key (add it to src/config/schema.c)", fn, key);
  int count;
  const st__cfg_key* k = &st__cfg_schema(&count)[idx];
  if (k->type != want && k->type != also)
    st__cfg_die("%s: config key '%s' is a %s, not a %s", fn, key, st__cfg_type_name(k->type), st__cfg_type_name(want));
  return &c->v[idx];
}

int64_t st_config_int(const st_config* config, const char* key) {
  return st__cfg_get(config, key, ST__CFG_INT, ST__CFG_INT, __func__)->i;
}
double st_config_float(const st_config* config, const char* key) {
  return st__cfg_get(config, key, ST__CFG_FLOAT, ST__CFG_FLOAT, __func__)->f;
}
bool st_config_bool(const st_config* config, const char* key) {
  return st__cfg_get(config, key, ST__CFG_BOOL, ST__CFG_BOOL, __func__)->b;
}
const char* st_config_string(const st_config* config, const char* key) {
  return st__cfg_get(config, key, ST__CFG_STRING, ST__CFG_ENUM, __func__)->s;
}
int st_config_list_count(const st_config* config, const char* key) {
  return st__cfg_get(config, key, ST__CFG_LIST, ST__CFG_LIST, __func__)->n;
}
const char* st_config_list_item(const st_config* config, const char* key, int index) {
  const st__cfg_value* v = st__cfg_get(config, key, ST__CFG_LIST, ST__CFG_LIST, __func__);
  if (index < 0 || index >= v->n)
    st__cfg_die("st_config_list_item: index %d out of range for '%s' (%d items)", index, key, v->n);
  return v->items[index];
}

const char* st_config_source(const st_config* config, const char* key) {
  if (!config || !key) st__cfg_die("st_config_source: NULL config or key");
  int idx = st__cfg_find(key, strlen(key));
  if (idx < 0) st__cfg_die("st_config_source: '%s' is not a config key", key);
  return config->v[idx].source;
}

/* ---- the schema's rows ------------------------------------------------- */

int st_config_key_count(void) {
  int count;
  st__cfg_schema(&count);
  return count;
}

st_config_key_info st_config_key_at(int index) {
  int count;
  const st__cfg_key* keys = st__cfg_schema(&count);
  if (index < 0 || index >= count) st__cfg_die("st_config_key_at: index %d out of range (%d keys)", index, count);
  const st__cfg_key* k = &keys[index];
  st_config_type type = ST_CONFIG_STRING;
  switch (k->type) {
    case ST__CFG_INT: type = ST_CONFIG_INT; break;
    case ST__CFG_FLOAT: type = ST_CONFIG_FLOAT; break;
    case ST__CFG_BOOL: type = ST_CONFIG_BOOL; break;
    case ST__CFG_STRING:
    case ST__CFG_ENUM: type = ST_CONFIG_STRING; break;
    case ST__CFG_LIST: type = ST_CONFIG_LIST; break;
  }
  return (st_config_key_info){k->key, type, k->bundle, k->zero_means};
}

bool st_config_is_default(const st_config* config, const char* key) {
  if (!config || !key) st__cfg_die("st_config_is_default: NULL config or key");
  int idx = st__cfg_find(key, strlen(key));
  if (idx < 0) st__cfg_die("st_config_is_default: '%s' is not a config key", key);
  /* The canonical text (the config hash's) compares every type, a float
   * by its exact value. */
  st_config* d = NULL;
  st_status s = st__defaults(&d);
  if (s) st__cfg_die("st_config_is_default: %s", st_status_message(s));
  st_strbuf a = {0}, b = {0};
  st__cfg_value_text(config, idx, &a);
  st__cfg_value_text(d, idx, &b);
  bool same = a.len == b.len && !memcmp(a.data, b.data, a.len);
  st_strbuf_free(&a);
  st_strbuf_free(&b);
  st_config_destroy(d);
  return same;
}

int64_t st_config_int_resolved(const st_config* config, const char* key) {
  int64_t v = st_config_int(config, key);
  int count;
  const st__cfg_key* k = &st__cfg_schema(&count)[st__cfg_find(key, strlen(key))];
  return v == 0 && k->zero_means ? st_config_int(config, k->zero_means) : v;
}

/* ---- canonical text and hash -------------------------------------------- */

void st__cfg_value_text(const st_config* c, int index, st_strbuf* out) {
  int count;
  const st__cfg_key* k = &st__cfg_schema(&count)[index];
  const st__cfg_value* v = &c->v[index];
  char num[40];
  switch (k->type) {
    case ST__CFG_INT: st_strbuf_printf(out, "%lld", (long long)v->i); return;
    case ST__CFG_FLOAT:
      st__cfg_fmt_float(v->f, num);
      st_strbuf_append(out, num);
      return;
    case ST__CFG_BOOL: st_strbuf_append(out, v->b ? "true" : "false"); return;
    case ST__CFG_ENUM: st_strbuf_append(out, v->s); return;
    case ST__CFG_STRING: st__cfg_quote_json(out, v->s); return;
    case ST__CFG_LIST:
      st_strbuf_append(out, "[");
      for (int j = 0; j < v->n; ++j) {
        if (j) st_strbuf_append(out, ", ");
        st__cfg_quote_json(out, v->items[j]);
      }
      st_strbuf_append(out, "]");
      return;
  }
}

/* The whole-config hash identifies the experiment: where a run is written
 * and how it reports progress (run.*) and which extra views of its metrics
 * it writes, and who ran it (obs.*) do not change it, so a run's
 * config.yaml replayed into a new run.dir hashes the same. */
bool st_config_key_identifies(const char* key) { return strncmp(key, "run.", 4) != 0 && strncmp(key, "obs.", 4) != 0; }

void st_config_hash(const st_config* config, const char* const* prefixes, int prefix_count, char out[17]) {
  if (!config) st__cfg_die("st_config_hash: NULL config");
  int count;
  const st__cfg_key* keys = st__cfg_schema(&count);
  /* Streamed so no allocation can fail: the hash has no error path. */
  XXH64_state_t state;
  XXH64_reset(&state, 0);
  for (int i = 0; i < count; ++i) {
    bool selected = prefix_count == 0 && st_config_key_identifies(keys[i].key);
    for (int p = 0; p < prefix_count && !selected; ++p)
      selected = !strncmp(keys[i].key, prefixes[p], strlen(prefixes[p]));
    if (!selected) continue;
    st_strbuf text = {0};
    st_strbuf_printf(&text, "%s=", keys[i].key);
    st__cfg_value_text(config, i, &text);
    st_strbuf_append(&text, "\n");
    XXH64_update(&state, text.data, text.len);
    st_strbuf_free(&text);
  }
  snprintf(out, 17, "%016llx", (unsigned long long)XXH64_digest(&state));
}
