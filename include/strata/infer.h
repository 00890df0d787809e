/*
 * strata/infer.h — generation with a KV cache (src/infer/; docs/model.md
 * "Sampling"): the sampler a trained model generates with on one device,
 * the host-side draw, and `strata sample`.
 */
#ifndef STRATA_INFER_H
#define STRATA_INFER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/bundle.h"
#include "strata/data.h"
#include "strata/plan.h"
#include "strata/runtime.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the next token is drawn from the head's f32 logits, on the host. */
typedef struct st_infer_sample_options {
  int64_t tokens;     /* tokens to generate, 1 .. ST_INFER_MAX_TOKENS */
  double temperature; /* >= 0; 0: greedy (the first largest logit) */
  int64_t top_k;      /* >= 0; 0: no cut */
  double top_p;       /* in (0, 1]; 1: no cut */
  uint64_t seed;      /* the PRNG's seed: the same seed draws the same tokens */
  /* Ids are bytes (the byte tokenizer): ids >= 256 are never drawn and
   * tokens are written raw. Else (synthetic data, no text) ids are
   * written as decimal numbers, each after a space. */
  bool byte_text;
  /* A BPE run's tokenizer (borrowed; NULL otherwise): only its ids are
   * drawn and each is written as its bytes (byte_text is ignored). */
  const st_tokenizer* tokenizer;
  FILE* out;          /* each generated token is written here and flushed; NULL: nowhere */
} st_infer_sample_options;

#define ST_INFER_MAX_TOKENS 1000000

/* A seeded PRNG of strata's own (splitmix64), so a seed repeats exactly
 * on every platform. */
typedef struct st_infer_rng {
  uint64_t state;
} st_infer_rng;
void st_infer_rng_seed(st_infer_rng* rng, uint64_t seed);
uint64_t st_infer_rng_next(st_infer_rng* rng);
double st_infer_rng_uniform(st_infer_rng* rng); /* [0, 1), 53 bits */

/* The next token from |logits| (|n| of them): greedy at temperature 0,
 * else softmax(logits / temperature) cut to the top_k largest, then to the
 * smallest set of largest whose probability reaches top_p, drawn with one
 * uniform of |rng|. Only ids < |allowed| (<= n) are candidates. */
int32_t st_infer_pick(const float* logits, int n, int allowed, const st_infer_sample_options* options,
                             st_infer_rng* rng);

/* A model ready to generate on one device: the bundle's generation
 * programs (the embedding's, each distinct block's and the head's
 * prefill/decode/logits roles) compiled, the parameters on device 0. */
typedef struct st_infer_sampler st_infer_sampler;

/* |params|[i] is the data of bundle->params[i] (its type, dense), borrowed
 * for the call. |runtime| and |bundle| are borrowed and must outlive the
 * sampler. ST_CODE_RUNTIME when the bundle lacks the generation programs
 * (a bundle from an older exporter: re-export). */
st_status st_infer_sampler_create(st_runtime* runtime, const st_bundle* bundle, const void* const* params,
                                  st_infer_sampler** out /* owned by caller */);
/* Seconds the programs took to compile (or load from the executable cache). */
double st_infer_sampler_compile_seconds(const st_infer_sampler* sampler);
/* Generates options->tokens tokens after |prompt| (|prompt_len| >= 1 ids <
 * vocab), streaming each to options->out. With the sequence full
 * (model.seq_len positions), the window slides: the newest seq_len / 2
 * tokens are prefilled again and generation goes on (docs/model.md). The
 * generated ids go to |out_ids| (options->tokens of them; may be NULL). */
st_status st_infer_generate(st_infer_sampler* sampler, const int32_t* prompt, int64_t prompt_len,
                                   const st_infer_sample_options* options, int32_t* out_ids);
void st_infer_sampler_destroy(st_infer_sampler* sampler); /* NULL is a no-op */

/* `strata sample PATH`: PATH as st_plan_locate_trained takes it (a run
 * directory or a checkpoint folder). Loads the run's config.yaml on one
 * device (parallel.* = 1), the bundle (exported when missing), the
 * parameters, and streams the prompt and the generated text to
 * options->out. |prompt| NULL: a newline (byte data) or "0" (synthetic
 * data: space-separated ids). |overrides| (|n_overrides| key=value,
 * borrowed) apply on top of the run's config; its tokenizer and model
 * are checked against what the parameters record (st_plan_check_identity;
 * |allow|: --allow-mismatch). Exit classes: 2 bad PATH, override or
 * prompt, 7 a checkpoint that does not verify, an identity mismatch or
 * tensors of another model, 4 bundle/runtime. */
st_status st_infer_sample_main(const char* path, int n_overrides, char** overrides, const char* allow, const char* prompt,
                               const st_infer_sample_options* options);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_INFER_H */
