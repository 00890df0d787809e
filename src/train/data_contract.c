/* data_contract.c — what a run's data is, recorded in every checkpoint and
 * in context.json, and checked when a run resumes (docs/data.md, "Data
 * contract"): per source its name, the content hash of its token file,
 * its documents, the tokenizer, its weight and the documents the training
 * stream drew from it so far; and the packing mode.
 *
 * A resume against changed data would continue a different stream while
 * claiming the same run: refused (exit 3, naming the source) unless
 * data.allow_changed=true, and then the change is said on stderr and
 * recorded in the resumed event. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/data.h"
#include "train/checkpoint_io.h"

static const char* st__packing_name(int packing) {
  return packing == ST_DATA_PACKING_PACK ? "pack" : packing == ST_DATA_PACKING_NONE ? "none" : "concat";
}

st_status st_train_data_contract(const st_dataset* data, uint64_t position, json_t** out) {
  *out = NULL;
  const int n = st_dataset_source_count(data);
  st_data_source_info* info = st_xcalloc((size_t)(n > 0 ? n : 1), sizeof(*info));
  st_status s = st_dataset_sources(data, position, info);
  if (s) {
    free(info);
    return s;
  }
  json_t* j = st_json_obj();
  st_json_put_str(j, "packing", st__packing_name(st_dataset_packing(data)));
  json_t* arr = st_json_arr();
  for (int k = 0; k < n; ++k) {
    json_t* e = st_json_obj();
    st_json_put_str(e, "name", info[k].path);
    st_json_put_str(e, "content_hash", info[k].hash);
    st_json_put_int(e, "documents", (int64_t)info[k].documents);
    st_json_put_str(e, "tokenizer_hash", st_dataset_tokenizer_hash(data));
    st_json_put_num(e, "weight", info[k].weight);
    st_json_put_int(e, "drawn", (int64_t)info[k].drawn);
    st_json_push(arr, e);
  }
  st_json_put(j, "sources", arr);
  free(info);
  *out = j;
  return ST_OK;
}

/* Appends "name: what was, what is" for source |k| to |why| when they differ. */
static bool st__source_changed(const json_t* was, const json_t* now, st_strbuf* why) {
  const char* keys[2] = {"content_hash", "documents"};
  bool changed = false;
  for (int i = 0; i < 2; ++i) {
    const json_t *a = json_object_get(was, keys[i]), *b = json_object_get(now, keys[i]);
    if (a && b && json_equal((json_t*)a, (json_t*)b)) continue;
    char* sa = a ? json_dumps(a, JSON_ENCODE_ANY) : NULL;
    char* sb = b ? json_dumps(b, JSON_ENCODE_ANY) : NULL;
    st_strbuf_printf(why, "%s%s %s recorded, %s now", changed ? ", " : "", keys[i], sa ? sa : "none", sb ? sb : "none");
    free(sa);
    free(sb);
    changed = true;
  }
  return changed;
}

st_status st_train_data_contract_check(const json_t* recorded, const json_t* now, bool allow, const char* where,
                                       json_t** out_change) {
  *out_change = NULL;
  const json_t* rs = json_object_get(recorded, "sources");
  const json_t* ns = json_object_get(now, "sources");
  if (!rs || !ns) return ST_OK; /* written before data contracts: nothing to compare */
  st_strbuf why = {0};
  json_t* change = st_json_arr();
  const size_t nr = json_array_size(rs), nn = json_array_size(ns);
  for (size_t k = 0; k < nr || k < nn; ++k) {
    const json_t* a = json_array_get(rs, k);
    const json_t* b = json_array_get(ns, k);
    const char* an = a ? json_string_value(json_object_get(a, "name")) : NULL;
    const char* bn = b ? json_string_value(json_object_get(b, "name")) : NULL;
    st_strbuf one = {0};
    bool changed;
    if (!a || !b) {
      st_strbuf_printf(&one, "%s", !a ? "not in the checkpoint's sources" : "no longer among data.sources");
      changed = true;
    } else if (strcmp(an ? an : "", bn ? bn : "")) {
      st_strbuf_printf(&one, "source %zu was '%s'", k, an ? an : "");
      changed = true;
    } else {
      changed = st__source_changed(a, b, &one);
    }
    if (changed) {
      st_strbuf_printf(&why, "%sdata source '%s' changed (%s)", why.len ? "; " : "", bn ? bn : an ? an : "?",
                       one.data ? one.data : "");
      json_t* e = st_json_obj();
      st_json_put_str(e, "source", bn ? bn : an ? an : "");
      st_json_put(e, "recorded", a ? json_incref((json_t*)a) : json_null());
      st_json_put(e, "now", b ? json_incref((json_t*)b) : json_null());
      st_json_push(change, e);
    }
    st_strbuf_free(&one);
  }
  if (!why.len) {
    json_decref(change);
    return ST_OK;
  }
  st_status s = ST_OK;
  if (!allow)
    s = st_status_make(ST_CODE_DATA,
                       "resume: %s since %s: the run would continue on other data. Restore the data, start a new "
                       "run.dir, or set data.allow_changed=true to resume anyway (the change is recorded)",
                       why.data, where);
  else
    fprintf(stderr, "strata: warning: resume: %s since %s (allowed by data.allow_changed; recorded in the resumed event)\n",
            why.data, where);
  st_strbuf_free(&why);
  if (s) json_decref(change);
  else *out_change = change;
  return s;
}
