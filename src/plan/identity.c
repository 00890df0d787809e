/* identity.c — the identity check of the commands that run a trained
 * model they did not train (strata eval, sample, repro): what the record
 * says the parameters were trained as, against what the given config and
 * tokenizer would run, through st_ckpt_identity_check, the comparison
 * resume makes too (docs/checkpoints.md, "Identity"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/config.h"
#include "strata/plan.h"

st_status st_plan_given_tokenizer(const st_plan_options* o, const char* tokenizer_json, char out[65]) {
  out[0] = '\0';
  if (o->data.synthetic) {
    snprintf(out, 65, "none");
    return ST_OK;
  }
  if (strcmp(o->data.tokenizer, "bpe")) {
    snprintf(out, 65, "byte");
    return ST_OK;
  }
  if (!tokenizer_json) return ST_OK;
  char sha[65];
  st_status s = st_sha256_file_hex(tokenizer_json, sha);
  if (s)
    return st_status_recode(s, ST_CODE_DATA,
                            "the run trained with data.tokenizer=bpe, and its tokenizer.json belongs at '%s' (copy the token "
                            "file's X.tokenizer.json there as tokenizer.json)",
                            tokenizer_json);
  snprintf(out, 65, "%.16s", sha);
  return ST_OK;
}

void st_plan_record_deinit(st_plan_record* r) {
  if (!r) return;
  json_decref(r->model);
  free(r->tokenizer_hash);
  free(r->source);
  memset(r, 0, sizeof(*r));
}

/* The model description of the config at |path| as it stands (the record
 * of a run that wrote none): a new object, NULL on error (*out_status). */
static json_t* st__desc_of_config(const char* path, st_status* out_status) {
  st_config* cfg = NULL;
  st_plan_options o;
  memset(&o, 0, sizeof(o));
  st_status s = st_config_load(path, 0, NULL, &cfg);
  if (!s) s = st_plan_options_from_config(cfg, &o);
  json_t* d = s ? NULL : st_plan_model_desc(&o);
  st_plan_options_deinit(&o);
  st_config_destroy(cfg);
  *out_status = s ? st_status_annotate(s, "the record of the model (%s)", path) : ST_OK;
  return d;
}

st_status st_plan_check_identity(const st_plan_record* rec, const st_plan_options* given, const char* given_tokenizer,
                                  const char* allow, const char* fix, json_t** out_report) {
  *out_report = NULL;
  st_status s = ST_OK;
  json_t* fallback = NULL;
  const char* model_from = rec->source;
  if (!rec->model && rec->fallback_config) {
    fallback = st__desc_of_config(rec->fallback_config, &s);
    if (s) return s;
    model_from = rec->fallback_config;
  }
  json_t* want = st_plan_model_desc(given);
  json_t* implied = st_plan_model_implied();
  char recorded[700];
  snprintf(recorded, sizeof(recorded), "in %s", model_from ? model_from : "the record");
  st_ckpt_identity r = {rec->model ? rec->model : fallback, rec->tokenizer_hash};
  st_ckpt_identity g = {want, given_tokenizer && given_tokenizer[0] ? given_tokenizer : NULL};
  st_ckpt_identity_options o = {.where = rec->source ? rec->source : model_from,
                                .recorded = rec->model ? (rec->label ? rec->label : "recorded") : recorded,
                                .implied = implied,
                                .allow = allow,
                                .fix = fix};
  s = st_ckpt_identity_check(&r, &g, &o, out_report, NULL);
  if (*out_report) {
    st_json_put(*out_report, "recorded_in", rec->source ? st_json_str(rec->source) : json_null());
    if (fallback) {
      st_json_put_str(*out_report, "model_recorded_in", rec->fallback_config);
      json_t* e = st_json_obj();
      st_json_put_str(e, "field", "model");
      st_json_put_str(e, "taken_as", rec->fallback_config);
      st_json_push(json_object_get(*out_report, "not_recorded"), e);
    }
  }
  json_decref(implied);
  json_decref(want);
  json_decref(fallback);
  return s;
}

const char* const st_plan_identity_fix =
    "drop the override, or restore the run's config.yaml and tokenizer.json; to run it anyway, name the fields in "
    "--allow-mismatch=FIELD[,FIELD...] (tokenizer, model.<key>, model, all), which the output records";
