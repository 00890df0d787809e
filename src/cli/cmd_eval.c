/* cmd_eval.c — `strata eval RUN_DIR|CHECKPOINT_DIR [key=value ...] [--json]`:
 * loss, perplexity and bits per byte of a trained model's parameters on
 * the validation split of the run's corpus, or of another corpus
 * (data.path=...), printed and written to <run>/eval/ (docs/using.md,
 * "strata eval"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/obs.h"
#include "strata/train.h"

static const char* kUsage =
    "usage: strata eval RUN_DIR|CHECKPOINT_DIR [key=value ...] [--allow-mismatch=FIELD[,FIELD...]] [--json]\n"
    "  evaluates the run's newest valid checkpoint (or its final parameters), or the checkpoint named,\n"
    "  on train.eval_batches batches of the validation split of the run's corpus or of data.path=FILE;\n"
    "  prints loss, perplexity and bits per byte (--json: the JSON instead) and writes <run>/eval/<name>.json.\n"
    "  A tokenizer or model.* that differs from the checkpoint's is exit 7 unless --allow-mismatch names it\n"
    "  (tokenizer, model.<key>, model, all); the record says what was overridden";

/* The evaluation's file name: the step, the token file's name (a content
 * hash for a tokenized corpus) and the given config's hash (overrides
 * included), so evaluations on other corpora or with other overrides sit
 * side by side and one never overwrites another's. */
static char* st__eval_name(const st_plan_trained_ref* ref, const st_eval_result* r, const char* config_hash) {
  const char* base = strrchr(r->token_file, '/');
  base = base ? base + 1 : r->token_file;
  size_t n = strlen(base);
  if (n > 4 && !strcmp(base + n - 4, ".tok")) n -= 4;
  st_strbuf b = {0};
  if (ref->step >= 0) st_strbuf_printf(&b, "step_%lld-%.*s-%.8s.json", (long long)ref->step, (int)n, base, config_hash);
  else st_strbuf_printf(&b, "final-%.*s-%.8s.json", (int)n, base, config_hash);
  return b.data;
}

static json_t* st__eval_json(const st_plan_trained_ref* ref, const st_eval_result* r, const char* config_hash, const char* const* ov,
                             int n_ov) {
  json_t* j = st_json_obj();
  st_json_put_str(j, "run_dir", ref->run_dir);
  st_json_put_str(j, "params", ref->params_path);
  st_json_put(j, "step", ref->step >= 0 ? st_json_int(ref->step) : json_null());
  st_json_put_str(j, "data_path", r->data_path);
  st_json_put_str(j, "token_file", r->token_file);
  st_json_put_str(j, "split", "validation");
  st_json_put_int(j, "split_tokens", r->split_tokens);
  st_json_put_int(j, "eval_batches", r->eval_batches);
  st_json_put_int(j, "batch_size", r->batch_size);
  st_json_put_int(j, "seq_len", r->seq_len);
  st_json_put_int(j, "tokens", r->tokens);
  st_json_put_num(j, "loss", r->loss);
  st_json_put_num(j, "perplexity", exp(r->loss));
  st_json_put(j, "bits_per_byte", r->bytes ? st_json_num(r->loss / log(2.0) / r->bytes_per_token) : json_null());
  st_json_put(j, "seconds", st_json_fixed(r->seconds, 3));
  st_json_put_str(j, "config_hash", config_hash);
  json_t* a = st_json_arr();
  for (int i = 0; i < n_ov; ++i) st_json_push(a, st_json_str(ov[i]));
  st_json_put(j, "overrides", a);
  /* Which identity fields differ from the record and were let through
   * (--allow-mismatch), and which the record did not have. */
  st_json_put(j, "identity", r->identity ? json_incref(r->identity) : json_null());
  return j;
}

int st_cli_eval(int argc, char** argv) {
  bool json = false;
  int npos = 0;
  const char* allow = NULL;
  st_status ts = st_cli_take_allow(&argc, argv, &allow);
  if (ts) return st_cli_report(ts);
  const char** pos = st_xcalloc((size_t)argc + 1, sizeof(char*));
  if (st_cli_json_args(argc, argv, kUsage, &json, pos, argc, &npos)) {
    free(pos);
    return 0;
  }
  if (npos < 1 || strchr(pos[0], '=') != NULL) {
    free(pos);
    return st_cli_report(st_status_make(ST_CODE_CONFIG, "%s", kUsage));
  }
  st_plan_trained_ref ref;
  st_status s = st_plan_locate_trained(pos[0], &ref);
  /* Checkpoints hold whole tensors: the evaluation runs on one device in
   * one process (a job's run too), the user's overrides first so a
   * parallel.* of theirs is refused, not lost. */
  const char* one_device[] = {"parallel.data=1", "parallel.fsdp=1", "parallel.tensor=1", "parallel.processes=1",
                              "parallel.pipeline=1"};
  int n_forced = (int)(sizeof(one_device) / sizeof(one_device[0]));
  char** ov = st_xcalloc((size_t)(npos + n_forced) + 1, sizeof(char*));
  int n = 0;
  for (int i = 0; i < n_forced; ++i) ov[n++] = (char*)one_device[i];
  for (int i = 1; i < npos; ++i) ov[n++] = (char*)pos[i];
  st_config* cfg = NULL;
  if (!s) s = st_config_load(ref.config_path, n, ov, &cfg);
  st_eval_result r;
  memset(&r, 0, sizeof(r));
  /* A BPE run's tokenizer (docs/data.md, <run>/tokenizer.json): the corpus is tokenized with it. */
  if (!s) s = st_train_evaluate(cfg, &ref, allow, &r);
  char* notes = r.identity ? st_ckpt_identity_notes(r.identity, ref.record.label ? ref.record.label : "in the record") : NULL;
  if (notes && notes[0]) fprintf(stderr, "strata: note: %s\n", notes);
  free(notes);
  if (!s) {
    char config_hash[17];
    st_config_hash(cfg, NULL, 0, config_hash);
    json_t* j = st__eval_json(&ref, &r, config_hash, pos + 1, npos - 1);
    char* dir = st_rundir_path(ref.run_dir, ST_RUNDIR_EVAL);
    char* name = st__eval_name(&ref, &r, config_hash);
    char* path = st_path_join(dir, name);
    s = st_fs_mkdirs(dir);
    if (!s) s = st_json_write_file(path, j, 2);
    if (!s && json) {
      st_cli_print_json(j, 2);
    } else if (!s) {
      if (ref.step >= 0) printf("evaluated:   %s (step %lld)\n", ref.params_path, (long long)ref.step);
      else printf("evaluated:   %s (step not recorded)\n", ref.params_path);
      printf("data:        %s, validation split (%lld tokens)\n", r.token_file, (long long)r.split_tokens);
      printf("tokens:      %lld (%lld batches x %lld sequences x %lld)\n", (long long)r.tokens, (long long)r.eval_batches,
             (long long)r.batch_size, (long long)r.seq_len);
      printf("loss:        %.6f\n", r.loss);
      printf("perplexity:  %.4f\n", exp(r.loss));
      if (r.bytes) printf("bits/byte:   %.4f\n", r.loss / log(2.0) / r.bytes_per_token);
      else printf("bits/byte:   n/a (synthetic data)\n");
      const json_t* over = json_object_get(r.identity, "overridden");
      for (size_t i = 0; i < json_array_size(over); ++i)
        printf("overridden:  %s (--allow-mismatch)\n", json_string_value(json_object_get(json_array_get(over, i), "field")));
      printf("written:     %s\n", path);
    }
    free(path);
    free(name);
    free(dir);
    json_decref(j);
  }
  st_eval_result_deinit(&r);
  st_config_destroy(cfg);
  st_plan_trained_ref_deinit(&ref);
  free(ov);
  free(pos);
  return st_cli_report(s);
}
