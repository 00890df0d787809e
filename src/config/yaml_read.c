/*
 * yaml_read.c — one YAML config file -> a flat list of (dotted key, value,
 * line). Nested maps and dotted keys both flatten to "train.steps".
 *
 * Uses libyaml's event parser rather than its document loader: the loader
 * resolves aliases into shared (even cyclic) nodes, and a config file has no
 * use for aliases, so they are rejected here before they can blow up a walk.
 */
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config/internal.h"

enum { kMaxDepth = 32, kMaxEntries = 100000 };

typedef struct {
  yaml_parser_t parser;
  const char* name;
  const char* text; /* the input, for line and column of a byte offset */
  size_t len;
  st__cfg_doc* doc;
  st_strbuf key; /* dotted prefix of the mapping being read */
} st__reader;

static st_status st__syntax_error(st__reader* r) {
  yaml_parser_t* p = &r->parser;
  switch (p->error) {
    case YAML_MEMORY_ERROR: st_oom("libyaml");
    case YAML_READER_ERROR: {
      /* libyaml's reader knows only the byte offset; editors want line:column. */
      size_t off = p->problem_offset < r->len ? p->problem_offset : r->len;
      size_t line = 1, col = 1;
      for (size_t i = 0; i < off; ++i) {
        if (r->text[i] == '\n') {
          ++line;
          col = 1;
        } else {
          ++col;
        }
      }
      return st_status_make(ST_CODE_CONFIG, "%s:%zu:%zu: YAML error: %s (byte %zu)", r->name, line, col,
                            p->problem ? p->problem : "unreadable input", p->problem_offset);
    }
    default: break;
  }
  st_strbuf b = {0};
  st_strbuf_printf(&b, "%s:%zu:%zu: YAML syntax error: %s", r->name, p->problem_mark.line + 1,
                     p->problem_mark.column + 1, p->problem ? p->problem : "invalid YAML");
  if (p->context) st_strbuf_printf(&b, " (%s at line %zu)", p->context, p->context_mark.line + 1);
  st_status s = st_status_make(ST_CODE_CONFIG, "%s", b.data);
  st_strbuf_free(&b);
  return s;
}

static st_status st__next(st__reader* r, yaml_event_t* ev) {
  if (!yaml_parser_parse(&r->parser, ev)) return st__syntax_error(r);
  return ST_OK;
}

static st_status st__at(st__reader* r, const yaml_event_t* ev, const char* what) {
  return st_status_make(ST_CODE_CONFIG, "%s:%zu:%zu: %s", r->name, ev->start_mark.line + 1, ev->start_mark.column + 1,
                        what);
}

static bool st__is_null(const yaml_event_t* ev) {
  if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
  const char* v = (const char*)ev->data.scalar.value;
  size_t n = ev->data.scalar.length;
  return n == 0 || (n == 1 && v[0] == '~') ||
         (n == 4 && (!memcmp(v, "null", 4) || !memcmp(v, "Null", 4) || !memcmp(v, "NULL", 4)));
}

static st__cfg_entry* st__add_entry(st__reader* r, int line, int col, st_status* err) {
  st__cfg_doc* d = r->doc;
  for (int i = 0; i < d->count; ++i) {
    if (!strcmp(d->entries[i].key, r->key.data)) {
      *err = st_status_make(ST_CODE_CONFIG, "duplicate key '%s' in %s:%d (first set at line %d)", r->key.data, r->name,
                            line, d->entries[i].line);
      return NULL;
    }
  }
  if (d->count == kMaxEntries) {
    *err = st_status_make(ST_CODE_CONFIG, "%s: too many keys (more than %d)", r->name, kMaxEntries);
    return NULL;
  }
  if (d->count == d->cap) {
    int cap = d->cap ? d->cap * 2 : 32;
    d->entries = st_xrealloc(d->entries, (size_t)cap * sizeof(*d->entries));
    d->cap = cap;
  }
  st__cfg_entry* e = &d->entries[d->count];
  memset(e, 0, sizeof(*e));
  e->key = st_xstrdup(r->key.data);
  e->line = line;
  e->col = col;
  d->count++;
  return e;
}

static st_status st__read_list(st__reader* r, st__cfg_entry* e) {
  for (;;) {
    yaml_event_t ev;
    ST_RETURN(st__next(r, &ev));
    if (ev.type == YAML_SEQUENCE_END_EVENT) {
      yaml_event_delete(&ev);
      return ST_OK;
    }
    if (ev.type != YAML_SCALAR_EVENT) {
      st_status s = st_status_make(ST_CODE_CONFIG, "%s: list items must be plain values, not %s (%s:%zu)", e->key,
                                   ev.type == YAML_ALIAS_EVENT ? "aliases" : "lists or mappings", r->name,
                                   ev.start_mark.line + 1);
      yaml_event_delete(&ev);
      return s;
    }
    e->items = st_xrealloc(e->items, (size_t)(e->item_count + 1) * sizeof(*e->items));
    e->item_lens = st_xrealloc(e->item_lens, (size_t)(e->item_count + 1) * sizeof(*e->item_lens));
    e->items[e->item_count] = st_xstrndup((const char*)ev.data.scalar.value, ev.data.scalar.length);
    e->item_lens[e->item_count] = ev.data.scalar.length;
    e->item_count++;
    yaml_event_delete(&ev);
  }
}

static st_status st__read_map(st__reader* r, int depth);

/* Reads the value of the key now in r->key; |kev| is the key's event. */
static st_status st__read_value(st__reader* r, const yaml_event_t* kev, int depth) {
  int line = (int)kev->start_mark.line + 1, col = (int)kev->start_mark.column + 1;
  yaml_event_t ev;
  ST_RETURN(st__next(r, &ev));
  st_status s = ST_OK;
  st__cfg_entry* e = NULL;
  switch (ev.type) {
    case YAML_SCALAR_EVENT:
      if (!(e = st__add_entry(r, line, col, &s))) break;
      e->kind = st__is_null(&ev) ? ST__ENTRY_NULL : ST__ENTRY_SCALAR;
      e->quoted = ev.data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
      e->text = st_xstrndup((const char*)ev.data.scalar.value, ev.data.scalar.length);
      e->text_len = ev.data.scalar.length;
      break;
    case YAML_SEQUENCE_START_EVENT:
      if (!(e = st__add_entry(r, line, col, &s))) break;
      e->kind = ST__ENTRY_LIST;
      s = st__read_list(r, e);
      break;
    case YAML_MAPPING_START_EVENT: {
      int idx = st__cfg_find(r->key.data, r->key.len);
      if (idx >= 0) {
        /* A schema leaf given a mapping: say what it wants instead of
         * reporting the children as unknown keys. */
        int n;
        const st__cfg_key* k = &st__cfg_schema(&n)[idx];
        char expected[160];
        st__cfg_expected(k, expected, sizeof(expected));
        s = st_status_make(ST_CODE_CONFIG, "%s: got a mapping, %s (%s:%d)", r->key.data, expected, r->name, line);
        break;
      }
      int before = r->doc->count;
      s = st__read_map(r, depth + 1);
      if (!s && r->doc->count == before) {
        if ((e = st__add_entry(r, line, col, &s))) e->kind = ST__ENTRY_EMPTY_MAP;
      }
      break;
    }
    case YAML_ALIAS_EVENT: s = st__at(r, &ev, "YAML aliases are not supported in config files"); break;
    default: s = st__at(r, &ev, "unexpected YAML event"); break;
  }
  yaml_event_delete(&ev);
  return s;
}

static st_status st__read_map(st__reader* r, int depth) {
  if (depth > kMaxDepth) return st_status_make(ST_CODE_CONFIG, "%s: mappings nested too deeply", r->name);
  size_t prefix_len = r->key.len;
  for (;;) {
    yaml_event_t ev;
    ST_RETURN(st__next(r, &ev));
    if (ev.type == YAML_MAPPING_END_EVENT) {
      yaml_event_delete(&ev);
      return ST_OK;
    }
    st_status s = ST_OK;
    if (ev.type == YAML_ALIAS_EVENT) {
      s = st__at(r, &ev, "YAML aliases are not supported in config files");
    } else if (ev.type != YAML_SCALAR_EVENT) {
      s = st__at(r, &ev, "keys must be plain strings, not lists or mappings");
    } else {
      const char* k = (const char*)ev.data.scalar.value;
      size_t kn = ev.data.scalar.length;
      if (kn == 0 || memchr(k, '\0', kn)) {
        s = st__at(r, &ev, kn == 0 ? "empty key" : "key contains a NUL character");
      } else if (depth == 0 && kn == 11 && !memcmp(k, "base_config", 11)) {
        /* The parent file: a plain string, top level only. */
        yaml_event_t v;
        s = st__next(r, &v);
        if (!s) {
          if (v.type != YAML_SCALAR_EVENT || st__is_null(&v) || v.data.scalar.length == 0 ||
              memchr(v.data.scalar.value, '\0', v.data.scalar.length)) {
            s = st_status_make(ST_CODE_CONFIG, "base_config: expected a file path (%s:%zu)", r->name,
                               ev.start_mark.line + 1);
          } else if (r->doc->base_config) {
            s = st_status_make(ST_CODE_CONFIG, "duplicate key 'base_config' in %s:%zu (first set at line %d)", r->name,
                               ev.start_mark.line + 1, r->doc->base_line);
          } else {
            r->doc->base_config = st_xstrndup((const char*)v.data.scalar.value, v.data.scalar.length);
            r->doc->base_line = (int)ev.start_mark.line + 1;
          }
          yaml_event_delete(&v);
        }
      } else {
        r->key.len = prefix_len;
        if (r->key.data) r->key.data[prefix_len] = '\0';
        if (prefix_len) st_strbuf_append_n(&r->key, ".", 1);
        st_strbuf_append_n(&r->key, k, kn);
        s = st__read_value(r, &ev, depth);
        r->key.len = prefix_len;
        if (r->key.data) r->key.data[prefix_len] = '\0';
      }
    }
    yaml_event_delete(&ev);
    if (s) return s;
  }
}

static st_status st__read_stream(st__reader* r) {
  yaml_event_t ev;
  ST_RETURN(st__next(r, &ev)); /* STREAM-START */
  yaml_event_delete(&ev);
  ST_RETURN(st__next(r, &ev));
  if (ev.type == YAML_STREAM_END_EVENT) { /* empty file, or only comments */
    yaml_event_delete(&ev);
    return ST_OK;
  }
  yaml_event_delete(&ev); /* DOCUMENT-START */
  ST_RETURN(st__next(r, &ev));
  st_status s = ST_OK;
  if (ev.type == YAML_MAPPING_START_EVENT) {
    s = st__read_map(r, 0);
  } else if (!(ev.type == YAML_SCALAR_EVENT && st__is_null(&ev))) {
    s = st__at(r, &ev, "a config file must be a mapping of keys (key: value)");
  }
  yaml_event_delete(&ev);
  if (s) return s;
  ST_RETURN(st__next(r, &ev)); /* DOCUMENT-END */
  yaml_event_delete(&ev);
  ST_RETURN(st__next(r, &ev));
  if (ev.type != YAML_STREAM_END_EVENT) s = st__at(r, &ev, "only one YAML document per config file");
  yaml_event_delete(&ev);
  return s;
}

st_status st__cfg_parse_yaml(const char* name, const char* text, size_t len, st__cfg_doc* doc) {
  st__reader r;
  memset(&r, 0, sizeof(r));
  if (!yaml_parser_initialize(&r.parser)) st_oom("YAML parser");
  yaml_parser_set_input_string(&r.parser, (const unsigned char*)text, len);
  r.name = name;
  r.text = text;
  r.len = len;
  r.doc = doc;
  st_strbuf_append_n(&r.key, "", 0);
  st_status s = st__read_stream(&r);
  st_strbuf_free(&r.key);
  yaml_parser_delete(&r.parser);
  return s;
}

void st__cfg_doc_free(st__cfg_doc* doc) {
  for (int i = 0; i < doc->count; ++i) {
    st__cfg_entry* e = &doc->entries[i];
    free(e->key);
    free(e->text);
    for (int j = 0; j < e->item_count; ++j) free(e->items[j]);
    free(e->items);
    free(e->item_lens);
  }
  free(doc->entries);
  free(doc->base_config);
  memset(doc, 0, sizeof(*doc));
}
