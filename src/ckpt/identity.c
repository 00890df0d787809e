/* identity.c — the one comparison of "the model these parameters were
 * trained as" against "the model this command is about to run" (resume,
 * eval, sample, repro, ckpt inspect; docs/checkpoints.md, "Identity").
 * Field by field, so a message names each field with both values, and an
 * older record that left a field out (it omitted fields at their default)
 * is read for what it meant instead of failing on a field its format never
 * had. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"

/* |model| with one level of nested objects spelled "key.sub" (kernels):
 * a new object of borrowed values, in the model's order. */
static json_t* st__flatten(const json_t* model) {
  json_t* flat = json_object();
  const char* key;
  json_t* v;
  json_object_foreach((json_t*)model, key, v) {
    if (!json_is_object(v)) {
      json_object_set(flat, key, v);
      continue;
    }
    const char* sub;
    json_t* w;
    json_object_foreach(v, sub, w) {
      char name[256];
      snprintf(name, sizeof(name), "%s.%s", key, sub);
      json_object_set(flat, name, w);
    }
  }
  return flat;
}

/* What |implied| says a missing |field| meant for the record |rec| (flat);
 * borrowed, NULL: nothing is implied. */
static const json_t* st__implied(const json_t* implied, const json_t* rec, const char* field) {
  const json_t* v = implied ? json_object_get(implied, field) : NULL;
  if (json_is_object(v)) {
    const char* other = json_string_value(json_object_get(v, "same_as"));
    return other ? json_object_get(rec, other) : NULL;
  }
  return v;
}

/* Does an --allow-mismatch entry cover |field|? "all", the field itself,
 * or a dotted prefix of it ("model", "model.kernels"). */
static bool st__covers(const char* entry, size_t n, const char* field) {
  if (n == 3 && !strncmp(entry, "all", 3)) return true;
  return !strncmp(entry, field, n) && (field[n] == '\0' || field[n] == '.');
}

static bool st__allowed(const char* allow, const char* field) {
  for (const char* p = allow ? allow : ""; *p;) {
    size_t n = strcspn(p, ",");
    if (n && st__covers(p, n, field)) return true;
    p += n + (p[n] == ',');
  }
  return false;
}

/* Every entry of |allow| names a field of |fields| (flat model names), the
 * tokenizer, "model" or "all": a typo must not silently allow nothing. */
static st_status st__check_allow(const char* allow, const json_t* fields) {
  for (const char* p = allow ? allow : ""; *p;) {
    size_t n = strcspn(p, ",");
    bool known = n == 0 || (n == 3 && !strncmp(p, "all", 3)) || (n == 9 && !strncmp(p, "tokenizer", 9)) ||
                 (n == 5 && !strncmp(p, "model", 5));
    const char* key;
    json_t* v;
    json_object_foreach((json_t*)fields, key, v) {
      char name[300];
      snprintf(name, sizeof(name), "model.%s", key);
      known = known || st__covers(p, n, name);
    }
    if (!known) {
      st_strbuf names = {0};
      json_object_foreach((json_t*)fields, key, v) st_strbuf_printf(&names, ", model.%s", key);
      st_status s = st_status_make(ST_CODE_CONFIG,
                                   "--allow-mismatch: '%.*s' names no identity field; the fields are tokenizer%s (or model, "
                                   "all)",
                                   (int)n, p, names.data ? names.data : "");
      st_strbuf_free(&names);
      return s;
    }
    p += n + (p[n] == ',');
  }
  return ST_OK;
}

static char* st__dump(const json_t* v) { return v ? st_json_dump(v, 0) : st_xstrdup("(absent)"); }

typedef struct {
  const st_ckpt_identity_options* o;
  json_t* report;
  st_strbuf refused; /* the differences not allowed, for the message */
  bool tokenizer;
} st__diff;

/* One differing field: allowed (recorded in "overridden") or refused. */
static void st__differs(st__diff* d, const char* field, const json_t* rec, bool implied, const json_t* given) {
  json_array_append_new(json_object_get(d->report, "mismatched"), json_string(field));
  if (st__allowed(d->o->allow, field)) {
    json_t* e = st_json_obj();
    st_json_put_str(e, "field", field);
    st_json_put(e, "recorded", rec ? json_deep_copy(rec) : json_null());
    st_json_put(e, "given", given ? json_deep_copy(given) : json_null());
    st_json_push(json_object_get(d->report, "overridden"), e);
    return;
  }
  char* a = st__dump(rec);
  char* b = st__dump(given);
  const char* where = d->o->recorded ? d->o->recorded : "recorded";
  if (d->refused.len) st_strbuf_append(&d->refused, "; ");
  if (!given)
    st_strbuf_printf(&d->refused, "%s %s %s, a field this strata does not know", field, a, where);
  else if (implied)
    st_strbuf_printf(&d->refused, "%s not recorded %s (an older format: it meant %s), %s given", field, where, a, b);
  else
    st_strbuf_printf(&d->refused, "%s %s %s, %s given", field, a, where, b);
  free(a);
  free(b);
}

st_status st_ckpt_identity_check(const st_ckpt_identity* recorded, const st_ckpt_identity* given,
                                 const st_ckpt_identity_options* o, json_t** out_report, bool* out_tokenizer_mismatch) {
  if (out_report) *out_report = NULL;
  if (out_tokenizer_mismatch) *out_tokenizer_mismatch = false;
  st__diff d = {.o = o, .report = st_json_obj()};
  st_json_put(d.report, "mismatched", st_json_arr());
  st_json_put(d.report, "overridden", st_json_arr());
  st_json_put(d.report, "not_recorded", st_json_arr());
  json_t* notes = json_object_get(d.report, "not_recorded");
  json_t* gflat = given->model ? st__flatten(given->model) : json_object();
  json_t* rflat = recorded->model ? st__flatten(recorded->model) : json_object();
  st_status s = st__check_allow(o->allow, gflat);

  /* The tokenizer first: another one also changes the vocabulary, and it
   * is the cause to name. */
  if (!s && given->tokenizer_hash && !recorded->tokenizer_hash) {
    json_t* e = st_json_obj();
    st_json_put_str(e, "field", "tokenizer");
    st_json_put(e, "taken_as", json_null());
    st_json_push(notes, e);
  } else if (!s && given->tokenizer_hash && strcmp(given->tokenizer_hash, recorded->tokenizer_hash)) {
    d.tokenizer = true;
    json_t* a = json_string(recorded->tokenizer_hash);
    json_t* b = json_string(given->tokenizer_hash);
    st__differs(&d, "tokenizer", a, false, b);
    json_decref(a);
    json_decref(b);
  }
  if (!s && given->model && !recorded->model) {
    json_t* e = st_json_obj();
    st_json_put_str(e, "field", "model");
    st_json_put(e, "taken_as", json_null());
    st_json_push(notes, e);
  } else if (!s && given->model) {
    const bool micro = (o->flags & ST_CKPT_IDENTITY_MICROBATCH) != 0;
    const char* key;
    json_t* gv;
    json_object_foreach(gflat, key, gv) {
      if (!micro && !strcmp(key, "microbatch_size")) continue;
      char field[300];
      snprintf(field, sizeof(field), "model.%s", key);
      const json_t* rv = json_object_get(rflat, key);
      bool implied = false;
      if (!rv) {
        rv = st__implied(o->implied, rflat, key);
        implied = rv != NULL;
        json_t* e = st_json_obj();
        st_json_put_str(e, "field", field);
        st_json_put(e, "taken_as", rv ? json_deep_copy(rv) : json_null());
        st_json_push(notes, e);
        if (!rv) continue;
      }
      if (!st_json_same(rv, gv)) st__differs(&d, field, rv, implied, gv);
    }
    json_t* rv;
    json_object_foreach(rflat, key, rv) {
      if ((!micro && !strcmp(key, "microbatch_size")) || json_object_get(gflat, key)) continue;
      char field[300];
      snprintf(field, sizeof(field), "model.%s", key);
      st__differs(&d, field, rv, false, NULL);
    }
  }
  if (!s && d.refused.len)
    s = st_status_make(ST_CODE_CKPT, "'%s': identity mismatch: %s; %s", o->where ? o->where : "?", d.refused.data,
                       o->fix ? o->fix : "use the settings the parameters were trained with");
  if (out_tokenizer_mismatch) *out_tokenizer_mismatch = d.tokenizer;
  st_strbuf_free(&d.refused);
  json_decref(gflat);
  json_decref(rflat);
  if (out_report) *out_report = d.report;
  else json_decref(d.report);
  return s;
}

char* st_ckpt_identity_notes(const json_t* report, const char* recorded) {
  st_strbuf taken = {0}, skipped = {0}, b = {0};
  const json_t* nr = json_object_get(report, "not_recorded");
  size_t i;
  json_t* e;
  json_array_foreach((json_t*)nr, i, e) {
    const char* field = json_string_value(json_object_get(e, "field"));
    const json_t* as = json_object_get(e, "taken_as");
    if (!as || json_is_null(as)) {
      st_strbuf_printf(&skipped, "%s%s", skipped.len ? ", " : "", field ? field : "?");
      continue;
    }
    char* v = st__dump(as);
    st_strbuf_printf(&taken, "%s%s %s", taken.len ? ", " : "", field ? field : "?", v);
    free(v);
  }
  if (taken.len) st_strbuf_printf(&b, "not recorded %s (an older format), taken as: %s", recorded, taken.data);
  if (skipped.len)
    st_strbuf_printf(&b, "%snot recorded %s (an older format), not compared: %s", b.len ? "; " : "", recorded, skipped.data);
  st_strbuf_free(&taken);
  st_strbuf_free(&skipped);
  const json_t* ov = json_object_get(report, "overridden");
  json_array_foreach((json_t*)ov, i, e) {
    char* a = st__dump(json_object_get(e, "recorded"));
    char* g = st__dump(json_object_get(e, "given"));
    st_strbuf_append(&b, b.len ? "; " : "");
    st_strbuf_printf(&b, "overridden (--allow-mismatch): %s %s %s, %s given",
                     json_string_value(json_object_get(e, "field")), a, recorded, g);
    free(a);
    free(g);
  }
  return b.data ? b.data : st_xstrdup("");
}
