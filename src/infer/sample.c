/* sample.c — generation with a per-layer KV cache (`strata sample`, and the
 * sample at the end of `strata train`; docs/model.md, "Sampling").
 *
 * Driven layer by layer like training, with the programs the bundle's
 * program tables name for the roles prefill, decode (embedding, blocks) and
 * logits (head): the prompt but its last token is prefilled once (every
 * layer returns its key and value caches), then each token is one decode
 * launch per layer (the caches are donated and come back updated) and one
 * head launch; the next token is drawn on the host from the f32 logits. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/kernels.h"
#include "strata/infer.h"

/*===-------------------------------------------------------------------===*/
/* PRNG and the host-side draw                                              */
/*===-------------------------------------------------------------------===*/

void st_infer_rng_seed(st_infer_rng* rng, uint64_t seed) { rng->state = seed; }

uint64_t st_infer_rng_next(st_infer_rng* rng) {
  uint64_t z = (rng->state += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

double st_infer_rng_uniform(st_infer_rng* rng) { return (double)(st_infer_rng_next(rng) >> 11) * 0x1.0p-53; }

typedef struct {
  double z; /* logit / temperature */
  int32_t id;
} st__cand;

/* Largest first; equal values by id, so the order (and the draw) never
 * depends on qsort's stability. */
static int st__cand_cmp(const void* a, const void* b) {
  const st__cand *x = a, *y = b;
  if (x->z != y->z) return x->z > y->z ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

int32_t st_infer_pick(const float* logits, int n, int allowed, const st_infer_sample_options* o, st_infer_rng* rng) {
  if (allowed > n) allowed = n;
  if (allowed < 1) allowed = 1;
  if (o->temperature <= 0) {
    int32_t best = 0;
    for (int i = 1; i < allowed; ++i)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  st__cand* c = st_xcalloc((size_t)allowed, sizeof(*c));
  for (int i = 0; i < allowed; ++i) c[i] = (st__cand){(double)logits[i] / o->temperature, i};
  qsort(c, (size_t)allowed, sizeof(*c), st__cand_cmp);
  int keep = allowed;
  if (o->top_k > 0 && o->top_k < keep) keep = (int)o->top_k;
  double sum = 0;
  double* p = st_xcalloc((size_t)keep, sizeof(double));
  for (int i = 0; i < keep; ++i) sum += (p[i] = exp(c[i].z - c[0].z));
  if (o->top_p < 1) {
    double acc = 0;
    int k = 0;
    while (k < keep) {
      acc += p[k++] / sum;
      if (acc >= o->top_p) break;
    }
    keep = k;
    sum = 0;
    for (int i = 0; i < keep; ++i) sum += p[i];
  }
  double u = st_infer_rng_uniform(rng) * sum;
  int32_t pick = c[keep - 1].id;
  double acc = 0;
  for (int i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) {
      pick = c[i].id;
      break;
    }
  }
  free(p);
  free(c);
  return pick;
}

/*===-------------------------------------------------------------------===*/
/* The sampler                                                              */
/*===-------------------------------------------------------------------===*/

/* One compiled generation program. */
typedef struct {
  const st_bundle_program* bp;
  st_program* exe;
} st__gen_prog;

struct st_infer_sampler {
  st_runtime* rt;
  const st_bundle* b;
  int n_progs;
  st__gen_prog* progs; /* [n_progs]: each distinct generation program once */
  st_buffer** params; /* [param_count] on device 0 */
  /* caches per layer: k, v; NULL until prefilled */
  st_buffer** cache;
  double compile_s;
  int64_t T, V;
};

static st_program* st__exe(const st_infer_sampler* s, const st_bundle_program* bp) {
  for (int i = 0; i < s->n_progs; ++i)
    if (s->progs[i].bp == bp) return s->progs[i].exe;
  return NULL;
}

static int st__param_for(const st_bundle* b, const st_bundle_stage* st, const st_bundle_tensor* in) {
  int idx = st_bundle_param_of(b, st->group->name, st->index, in->name);
  return idx >= 0 ? idx : st_bundle_param_index(b, in->name);
}

/* Launches |bp| of stage |st|: its "param" inputs from the sampler's
 * parameters, the others from |rest| in order (|n_rest| of them; donated
 * ones are consumed). |outs| gets the outputs. */
static st_status st__infer_launch(st_infer_sampler* s, const st_bundle_stage* st, const st_bundle_program* bp, st_buffer* const* rest,
                            int n_rest, st_buffer** outs) {
  st_buffer* in[ST_BUNDLE_MAX_PROGRAM_TENSORS];
  int r = 0;
  for (int i = 0; i < bp->input_count; ++i) {
    if (!strcmp(bp->inputs[i].role, "param")) {
      int idx = st__param_for(s->b, st, &bp->inputs[i]);
      if (idx < 0)
        return st_status_make(ST_CODE_RUNTIME, "bundle %s: program '%s' input '%s' is no parameter of the table", s->b->dir,
                              bp->name, bp->inputs[i].name);
      in[i] = s->params[idx];
    } else {
      if (r >= n_rest)
        return st_status_make(ST_CODE_RUNTIME, "bundle %s: program '%s' has more non-parameter inputs than its role's %d",
                              s->b->dir, bp->name, n_rest);
      in[i] = rest[r++];
    }
  }
  if (r != n_rest)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: program '%s' has %d non-parameter inputs, its role takes %d", s->b->dir,
                          bp->name, r, n_rest);
  return st_program_execute(st__exe(s, bp), 0, in, bp->input_count, outs, bp->output_count, NULL);
}

/* The stage's generation programs exist and have the outputs the driver reads. */
static st_status st__check_roles(const st_bundle* b) {
  const char* fix = "re-export it (a bundle from an older strata_jax has no generation programs)";
  if (!b->embed.prefill || !b->embed.decode || !b->head.logits)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: embed needs the roles prefill and decode, head the role logits; %s", b->dir, fix);
  if (b->embed.prefill->output_count != 1 || b->embed.decode->output_count != 1 || b->head.logits->output_count != 1)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: embed prefill/decode and head logits must have one output", b->dir);
  const st_tensor_type* lt = &b->head.logits->outputs[0].type;
  if (lt->dtype != ST_DTYPE_F32 || st_tensor_type_elements(lt) != b->model.vocab_size)
    return st_status_make(ST_CODE_RUNTIME, "bundle %s: program '%s' must return f32 logits of model.vocab_size", b->dir,
                          b->head.logits->name);
  for (int l = 0; l < b->layer_count; ++l) {
    const st_bundle_stage* st = &b->layers[l];
    if (!st->prefill || !st->decode)
      return st_status_make(ST_CODE_RUNTIME, "bundle %s: layers[%d] needs the roles prefill and decode; %s", b->dir, l, fix);
    if (st->prefill->output_count != 3 || st->decode->output_count != 3)
      return st_status_make(ST_CODE_RUNTIME, "bundle %s: layers[%d] prefill and decode must return y, k cache, v cache", b->dir, l);
  }
  return ST_OK;
}

st_status st_infer_sampler_create(st_runtime* rt, const st_bundle* b, const void* const* params, st_infer_sampler** out) {
  *out = NULL;
  ST_RETURN(st__check_roles(b));
  st_infer_sampler* s = st_xcalloc(1, sizeof(*s));
  s->rt = rt;
  s->b = b;
  s->T = b->model.seq_len;
  s->V = b->model.vocab_size;
  /* One program set per distinct program, not per layer. */
  const int n_want = 3 + 2 * b->layer_count;
  const st_bundle_program** want = st_xcalloc((size_t)n_want, sizeof(*want));
  int n = 0;
  want[n++] = b->embed.prefill;
  want[n++] = b->embed.decode;
  want[n++] = b->head.logits;
  for (int l = 0; l < b->layer_count; ++l) {
    want[n++] = b->layers[l].prefill;
    want[n++] = b->layers[l].decode;
  }
  s->progs = st_xcalloc((size_t)n_want, sizeof(*s->progs));
  st_program_compile_job* jobs = st_xcalloc((size_t)n_want, sizeof(*jobs));
  st_program_signature* sigs = st_xcalloc((size_t)n_want, sizeof(*sigs));
  st_tensor_type** types = st_xcalloc((size_t)n_want, sizeof(*types));
  for (int i = 0; i < n; ++i) {
    bool seen = false;
    for (int j = 0; j < s->n_progs; ++j) seen |= s->progs[j].bp == want[i];
    if (seen) continue;
    const st_bundle_program* bp = want[i];
    int k = s->n_progs++;
    s->progs[k].bp = bp;
    types[k] = st_xcalloc((size_t)bp->input_count + (size_t)bp->output_count + 1, sizeof(st_tensor_type));
    for (int j = 0; j < bp->input_count; ++j) types[k][j] = bp->inputs[j].type;
    for (int j = 0; j < bp->output_count; ++j) types[k][bp->input_count + j] = bp->outputs[j].type;
    sigs[k] = (st_program_signature){bp->input_count, types[k], bp->output_count, types[k] + bp->input_count};
    jobs[k] = (st_program_compile_job){.path = bp->path, .signature = &sigs[k]};
  }
  double t0 = st_now();
  st_status st = st_program_compile_files(rt, jobs, s->n_progs);
  s->compile_s = st_now() - t0;
  for (int k = 0; k < s->n_progs; ++k) {
    if (!st) s->progs[k].exe = jobs[k].program;
    free(types[k]);
  }
  free(want);
  free(jobs);
  free(sigs);
  free(types);
  s->params = st_xcalloc((size_t)b->param_count + 1, sizeof(st_buffer*));
  for (int i = 0; i < b->param_count && !st; ++i)
    st = st_buffer_from_host(rt, 0, &b->params[i].type, params[i], &s->params[i]);
  s->cache = st_xcalloc(2 * (size_t)b->layer_count + 1, sizeof(st_buffer*));
  if (st) {
    st_infer_sampler_destroy(s);
    return st_status_annotate(st, "preparing generation");
  }
  *out = s;
  return ST_OK;
}

double st_infer_sampler_compile_seconds(const st_infer_sampler* s) { return s->compile_s; }

void st_infer_sampler_destroy(st_infer_sampler* s) {
  if (!s) return;
  if (s->cache)
    for (int i = 0; i < 2 * s->b->layer_count; ++i) st_buffer_destroy(s->cache[i]);
  if (s->params)
    for (int i = 0; i < s->b->param_count; ++i) st_buffer_destroy(s->params[i]);
  for (int i = 0; i < s->n_progs; ++i) st_program_destroy(s->progs[i].exe);
  free(s->cache);
  free(s->params);
  free(s->progs);
  free(s);
}

/* Fills every layer's caches from |tokens| (|n| < T of them; positions
 * from n on hold padding that no query attends to). */
static st_status st__prefill(st_infer_sampler* s, const int32_t* tokens, int64_t n) {
  const st_bundle* b = s->b;
  int32_t* row = st_xcalloc((size_t)s->T, sizeof(int32_t));
  memcpy(row, tokens, (size_t)n * sizeof(int32_t));
  st_buffer* tok = NULL;
  st_buffer* x = NULL;
  const st_bundle_tensor* tin = NULL;
  for (int i = 0; i < b->embed.prefill->input_count; ++i)
    if (strcmp(b->embed.prefill->inputs[i].role, "param")) tin = &b->embed.prefill->inputs[i];
  st_status st = tin && st_tensor_type_elements(&tin->type) == s->T && tin->type.dtype == ST_DTYPE_S32
                     ? ST_OK
                     : st_status_make(ST_CODE_RUNTIME, "bundle %s: program '%s' must take s32 tokens [1, seq_len]", b->dir,
                                      b->embed.prefill->name);
  if (!st) st = st_buffer_from_host(s->rt, 0, &tin->type, row, &tok);
  free(row);
  if (!st) st = st__infer_launch(s, &b->embed, b->embed.prefill, &tok, 1, &x);
  st_buffer_destroy(tok);
  for (int l = 0; l < b->layer_count && !st; ++l) {
    st_buffer* o[3] = {NULL, NULL, NULL};
    st = st__infer_launch(s, &b->layers[l], b->layers[l].prefill, &x, 1, o);
    st_buffer_destroy(x);
    x = o[0];
    st_buffer_destroy(s->cache[2 * l]);
    st_buffer_destroy(s->cache[2 * l + 1]);
    s->cache[2 * l] = o[1];
    s->cache[2 * l + 1] = o[2];
  }
  st_buffer_destroy(x);
  return st;
}

/* Runs |token| at position |pos| through every layer (updating the caches)
 * and the head; |logits| gets vocab_size floats. */
static st_status st__infer_decode(st_infer_sampler* s, int32_t token, int64_t pos, float* logits) {
  const st_bundle* b = s->b;
  st_tensor_type tt = {.dtype = ST_DTYPE_S32, .rank = 2, .dims = {1, 1}};
  st_tensor_type pt = {.dtype = ST_DTYPE_S32, .rank = 0};
  int32_t p32 = (int32_t)pos;
  st_buffer *tok = NULL, *pb = NULL, *x = NULL;
  st_status st = st_buffer_from_host(s->rt, 0, &tt, &token, &tok);
  if (!st) st = st_buffer_from_host(s->rt, 0, &pt, &p32, &pb);
  /* A learned-position embedding (the gpt2 family) also takes the position. */
  int embed_rest = 0;
  for (int i = 0; i < b->embed.decode->input_count; ++i) embed_rest += strcmp(b->embed.decode->inputs[i].role, "param") != 0;
  st_buffer* erest[2] = {tok, pb};
  if (!st) st = st__infer_launch(s, &b->embed, b->embed.decode, erest, embed_rest == 2 ? 2 : 1, &x);
  for (int l = 0; l < b->layer_count && !st; ++l) {
    st_buffer* rest[4] = {x, s->cache[2 * l], s->cache[2 * l + 1], pb};
    st_buffer* o[3] = {NULL, NULL, NULL};
    st = st__infer_launch(s, &b->layers[l], b->layers[l].decode, rest, 4, o);
    if (st) break;
    st_buffer_destroy(x);
    st_buffer_destroy(s->cache[2 * l]); /* donated: an empty handle now */
    st_buffer_destroy(s->cache[2 * l + 1]);
    x = o[0];
    s->cache[2 * l] = o[1];
    s->cache[2 * l + 1] = o[2];
  }
  st_buffer* lg = NULL;
  if (!st) st = st__infer_launch(s, &b->head, b->head.logits, &x, 1, &lg);
  if (!st) st = st_buffer_to_host(lg, logits, (size_t)s->V * sizeof(float));
  st_buffer_destroy(lg);
  st_buffer_destroy(x);
  st_buffer_destroy(tok);
  st_buffer_destroy(pb);
  return st;
}

static void st__emit(const st_infer_sample_options* o, int32_t id) {
  if (!o->out) return;
  size_t len = 0;
  const unsigned char* b = o->tokenizer ? st_tokenizer_token(o->tokenizer, id, &len) : NULL;
  if (o->tokenizer) {
    if (b && len) fwrite(b, 1, len, o->out);
  } else if (o->byte_text)
    fputc((unsigned char)id, o->out);
  else
    fprintf(o->out, " %d", (int)id);
  fflush(o->out);
}

st_status st_infer_generate(st_infer_sampler* s, const int32_t* prompt, int64_t prompt_len,
                                   const st_infer_sample_options* o, int32_t* out_ids) {
  if (prompt_len < 1) return st_status_make(ST_CODE_CONFIG, "the prompt is empty; generation starts from at least one token");
  if (o->tokens < 1 || o->tokens > ST_INFER_MAX_TOKENS)
    return st_status_make(ST_CODE_CONFIG, "tokens %lld: give 1 to %d", (long long)o->tokens, ST_INFER_MAX_TOKENS);
  for (int64_t i = 0; i < prompt_len; ++i)
    if (prompt[i] < 0 || prompt[i] >= s->V)
      return st_status_make(ST_CODE_CONFIG, "prompt token %lld is id %d, outside the vocabulary 0..%lld", (long long)i,
                            (int)prompt[i], (long long)s->V - 1);
  const int64_t total = prompt_len + o->tokens;
  int32_t* hist = st_xcalloc((size_t)total, sizeof(int32_t));
  memcpy(hist, prompt, (size_t)prompt_len * sizeof(int32_t));
  float* logits = st_xcalloc((size_t)s->V, sizeof(float));
  st_infer_rng rng;
  st_infer_rng_seed(&rng, o->seed);
  int allowed = o->byte_text && s->V > 256 ? 256 : (int)s->V;
  if (o->tokenizer && (int64_t)st_tokenizer_vocab_size(o->tokenizer) < s->V) allowed = (int)st_tokenizer_vocab_size(o->tokenizer);
  else if (o->tokenizer) allowed = (int)s->V;
  const int64_t keep = s->T / 2 > 0 ? s->T / 2 : 1;
  int64_t n = prompt_len, start = 0;
  bool filled = false;
  st_status st = ST_OK;
  for (int64_t g = 0; g < o->tokens && !st; ++g) {
    /* The token at n-1 goes to cache position n-1-start, which must be < T. */
    if (n - start > s->T) {
      start = n - keep;
      filled = false;
    }
    if (!filled) {
      st = st__prefill(s, hist + start, n - 1 - start);
      filled = true;
    }
    if (!st) st = st__infer_decode(s, hist[n - 1], n - 1 - start, logits);
    if (st) break;
    for (int64_t i = 0; i < s->V; ++i)
      if (!isfinite(logits[i])) {
        st = st_status_make(ST_CODE_NUMERICS, "generated token %lld: logit %lld is not finite (%g)", (long long)g + 1,
                            (long long)i, (double)logits[i]);
        break;
      }
    if (st) break;
    int32_t id = st_infer_pick(logits, (int)s->V, allowed, o, &rng);
    hist[n++] = id;
    if (out_ids) out_ids[g] = id;
    st__emit(o, id);
  }
  free(logits);
  free(hist);
  return st;
}

/*===-------------------------------------------------------------------===*/
/* strata sample PATH                                                       */
/*===-------------------------------------------------------------------===*/

/* The prompt as ids: its bytes (byte data), or space-separated ids
 * (synthetic data; BPE, whose text strata does not encode in C: |bpe|). */
static st_status st__prompt_ids(const char* prompt, bool bytes, bool bpe, int64_t vocab, int32_t** out, int64_t* out_n) {
  size_t len = strlen(prompt);
  int32_t* ids = st_xcalloc(len + 1, sizeof(int32_t));
  int64_t n = 0;
  if (bytes) {
    for (size_t i = 0; i < len; ++i) ids[n++] = (unsigned char)prompt[i];
  } else {
    const char* p = prompt;
    while (*p) {
      while (*p == ' ' || *p == ',') ++p;
      if (!*p) break;
      char* end = NULL;
      errno = 0;
      long long v = strtoll(p, &end, 10);
      if (end != p && !errno && (!*end || *end == ' ' || *end == ',') && (v < 0 || v >= vocab)) {
        free(ids);
        return st_status_make(ST_CODE_CONFIG, "--prompt '%s': token id %lld is outside this run's vocabulary of %lld %s (ids 0..%lld)",
                              prompt, v, (long long)vocab, bpe ? "BPE tokens" : "tokens", (long long)vocab - 1);
      }
      if (end == p || errno || (*end && *end != ' ' && *end != ',')) {
        free(ids);
        return st_status_make(ST_CODE_CONFIG, "--prompt '%s': %s, so a prompt is token ids 0..%lld separated by spaces, e.g. "
                                              "--prompt '3 14 15'", prompt,
                              bpe ? "this run's tokenizer is BPE, whose text strata does not encode in C (strata_jax.tokenize does)"
                                  : "this run has synthetic data (no text)",
                              (long long)vocab - 1);
      }
      ids[n++] = (int32_t)v;
      p = end;
    }
  }
  if (n == 0) {
    free(ids);
    return st_status_make(ST_CODE_CONFIG, "--prompt is empty; give at least one %s", bytes ? "character" : "token id");
  }
  *out = ids;
  *out_n = n;
  return ST_OK;
}

st_status st_infer_sample_main(const char* path, int n_overrides, char** overrides, const char* allow, const char* prompt,
                               const st_infer_sample_options* opts) {
  st_plan_trained_ref ref;
  ST_RETURN(st_plan_locate_trained(path, &ref));
  st_config* cfg = NULL;
  st_plan_options o;
  memset(&o, 0, sizeof(o));
  st_bundle* bundle = NULL;
  st_runtime* rt = NULL;
  st_safetensors* file = NULL;
  st_infer_sampler* sampler = NULL;
  const void** data = NULL;
  int32_t* ids = NULL;
  int64_t n_ids = 0;
  st_status s = st_config_load(ref.config_path, n_overrides, overrides, &cfg);
  if (s) s = st_status_annotate(s, "the run's config (%s)", ref.config_path);
  /* One device whatever the run's mesh: checkpoints and params.safetensors
   * hold whole tensors. */
  bool one_device = true;
  if (!s) {
    st_plan_options probe;
    s = st_plan_options_from_config(cfg, &probe);
    one_device = !probe.mesh[0];
    st_plan_options_deinit(&probe);
  }
  /* A job's run too: one process. */
  const char* axes[5] = {"parallel.data", "parallel.fsdp", "parallel.tensor", "parallel.processes", "parallel.pipeline"};
  for (int a = 0; a < 5 && !s; ++a) s = st_config_set(cfg, axes[a], "1", "strata sample: one device");
  /* A bundle.dir of a mesh run holds that mesh's bundle; one device uses the cache. */
  if (!s && !one_device) s = st_config_set(cfg, "bundle.dir", "", "strata sample: one device");
  if (!s) s = st_plan_options_from_config(cfg, &o);
  st_infer_sample_options so = *opts;
  so.byte_text = !o.data.synthetic;
  /* A BPE run decodes through its tokenizer.json (docs/data.md). */
  st_tokenizer* tok = NULL;
  const bool bpe = !s && o.data.tokenizer && !strcmp(o.data.tokenizer, "bpe");
  if (bpe) {
    s = st_tokenizer_open(ref.run_dir, &tok);
    if (!s && !strcmp(st_tokenizer_hash(tok), "byte"))
      s = st_status_make(ST_CODE_DATA, "run %s trained with data.tokenizer=bpe but its tokenizer.json is missing; copy the "
                                       "token file's X.tokenizer.json there as tokenizer.json", ref.run_dir);
    so.tokenizer = tok;
  }
  /* The model about to run is the one the parameters were trained as, and
   * its ids mean the text they were trained on. */
  if (!s) {
    char given[65] = "";
    if (tok) snprintf(given, sizeof(given), "%s", st_tokenizer_hash(tok));
    else s = st_plan_given_tokenizer(&o, NULL, given);
    st_plan_record rec = ref.record;
    rec.fallback_config = ref.config_path;
    json_t* report = NULL;
    if (!s) s = st_plan_check_identity(&rec, &o, given, allow, st_plan_identity_fix, &report);
    char* notes = report ? st_ckpt_identity_notes(report, rec.label ? rec.label : "in the record") : NULL;
    if (notes && notes[0]) fprintf(stderr, "strata: note: %s\n", notes);
    free(notes);
    json_decref(report);
  }
  if (!s && bpe && !prompt) {
    /* The default start, as for bytes: a newline (id 0 if no token is one). */
    int32_t nl = st_tokenizer_find(tok, "\n", 1);
    ids = st_xcalloc(1, sizeof(int32_t));
    ids[0] = nl >= 0 ? nl : 0;
    n_ids = 1;
  } else if (!s) {
    s = st__prompt_ids(prompt ? prompt : (so.byte_text && !bpe ? "\n" : "0"), so.byte_text && !bpe, bpe,
                       bpe ? (int64_t)st_tokenizer_vocab_size(tok) : (int64_t)o.data.vocab_size, &ids, &n_ids);
  }
  if (!s) s = st_status_recode(st_safetensors_read(ref.params_path, &file), ST_CODE_CKPT, "the trained parameters");
  st_plan_opened opened;
  memset(&opened, 0, sizeof(opened));
  if (!s) s = st_plan_open_bundle(&o, NULL, &opened);
  bundle = opened.bundle;
  /* Every tensor of the model, with the bundle's type: a checkpoint of
   * another model is refused here, not by a launch. */
  if (!s) {
    data = st_xcalloc((size_t)bundle->param_count + 1, sizeof(void*));
    for (int i = 0; i < bundle->param_count && !s; ++i) {
      const st_bundle_param* bp = &bundle->params[i];
      const st_safetensors_entry* e = st_safetensors_find(file, bp->name);
      char a[96], b[96];
      if (!e)
        s = st_status_make(ST_CODE_CKPT, "%s has no tensor '%s', which the model of %s needs", ref.params_path, bp->name,
                           ref.config_path);
      else if (e->type.dtype != bp->type.dtype || e->type.rank != bp->type.rank ||
               memcmp(e->type.dims, bp->type.dims, sizeof(int64_t) * (size_t)e->type.rank))
        s = st_status_make(ST_CODE_CKPT, "%s: tensor '%s' is %s, the model of %s needs %s", ref.params_path, bp->name,
                           st_tensor_type_format(&e->type, a, sizeof(a)), ref.config_path,
                           st_tensor_type_format(&bp->type, b, sizeof(b)));
      else
        data[i] = file->data + e->offset;
    }
  }
  if (!s) s = st_plan_open_runtime(&o, NULL, &opened);
  rt = opened.runtime;
  if (!s) s = st_infer_sampler_create(rt, bundle, data, &sampler);
  if (!s) {
    if (so.tokenizer) {
      st_strbuf text = {0};
      s = st_tokenizer_decode(so.tokenizer, ids, (size_t)n_ids, &text);
      if (!s && so.out && text.len) fwrite(text.data, 1, text.len, so.out);
      st_strbuf_free(&text);
    } else if (so.byte_text) {
      if (so.out) fwrite(prompt ? prompt : "\n", 1, (size_t)n_ids, so.out);
    } else {
      fprintf(stderr, "strata: this run trained on synthetic data (no tokenizer, no text): printing token ids\n");
      if (so.out)
        for (int64_t i = 0; i < n_ids; ++i) fprintf(so.out, i ? " %d" : "%d", (int)ids[i]);
    }
    if (so.out) fflush(so.out);
    if (!s) s = st_infer_generate(sampler, ids, n_ids, &so, NULL);
    if (so.out && ((!so.byte_text && !so.tokenizer) || isatty(fileno(so.out)))) fputc('\n', so.out);
  }
  st_infer_sampler_destroy(sampler);
  st_tokenizer_destroy(tok);
  st_plan_close(&opened);
  free(data);
  st_safetensors_free(file);
  free(ids);
  st_plan_options_deinit(&o);
  st_config_destroy(cfg);
  st_plan_trained_ref_deinit(&ref);
  return s;
}
