/*
 * strata/config.h — configuration: YAML files composed base -> parents ->
 * file, then key=value overrides, checked against one typed schema
 * (src/config/schema.c) before any work starts.
 *
 * Only config/ reads YAML. Other modules take typed values through the
 * getters below (or typed options structs filled from them).
 *
 * Keys are dotted paths ("train.steps"). Asking a getter for a key that is
 * not in the schema, or with the wrong type, is a programmer error: it
 * aborts with the key named (never reachable from user input, which is
 * validated at load time).
 */
#ifndef STRATA_CONFIG_H
#define STRATA_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "strata/base.h"
#include "strata/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_config st_config;

/* The longest string value (and list item) a config accepts, in bytes:
 * every string is a path, a name or a short option. */
#define ST_CONFIG_MAX_STRING 4096
/* The longest run.id; run.id is a plain name (letters, digits, '.', '_',
 * '-', not starting with '.'), used as the folder under runs/. */
#define ST_CONFIG_MAX_RUN_ID 128

/* Loads |path| (NULL: schema defaults only), composing configs/base.yml and
 * any `base_config:` parents (resolved relative to the including file, then
 * to the configs/ folder), then applies |overrides| ("key=value", dotted
 * keys, lists as "[a, b]"). Validates types, ranges, allowed values and
 * cross-field rules. Errors are ST_CODE_CONFIG and name the key, the value,
 * what was expected and where the value came from (file:line or
 * "command line"), with a "did you mean" for unknown keys. */
st_status st_config_load(const char* path, int override_count, char* const* overrides,
                         st_config** out_config /* owned by caller */);
void st_config_destroy(st_config* config); /* NULL is a no-op */

int64_t st_config_int(const st_config* config, const char* key);
double st_config_float(const st_config* config, const char* key);
bool st_config_bool(const st_config* config, const char* key);
/* Strings and enums. Owned by the config. */
const char* st_config_string(const st_config* config, const char* key);
/* Lists (of strings; numbers are kept as written). Owned by the config. */
int st_config_list_count(const st_config* config, const char* key);
const char* st_config_list_item(const st_config* config, const char* key, int index);

/* Where a key's value came from: "default", "configs/tiny.yml:4", "command line". */
const char* st_config_source(const st_config* config, const char* key);

/* Writes the fully resolved config as YAML (every schema key, nested maps,
 * schema order). Feeding it back to st_config_load gives the same config. */
st_status st_config_write_yaml(const st_config* config, FILE* out);
/* Prints the resolved config with each value's source (`strata config`). */
st_status st_config_print_sources(const st_config* config, FILE* out);
/* Writes the schema reference as Markdown (`strata config --schema`, docs/config.md). */
st_status st_config_write_schema_markdown(FILE* out);

/* The resolved config as nested JSON objects in schema order: a new
 * reference owned by the caller (json_decref). */
st_json* st_config_json(const st_config* config);
/* Writes st_config_json's tree, indented (`strata config --json`; for tools
 * outside C, e.g. the Python reference trainer). */
st_status st_config_write_json(const st_config* config, FILE* out);
/* Writes st_config_write_yaml's output to |path| atomically (temporary file
 * in the same folder, fsync, rename): the run directory's config.yaml. */
st_status st_config_save(const st_config* config, const char* path);

/* Sets one key of a loaded config, parsed and checked exactly like a
 * command-line override ("key", "value" as typed after '='), recording
 * |source| (NULL: "command line") as its origin; the cross-field rules are
 * re-checked and on error the config is left unchanged. For values decided
 * at run time (a generated run.id) that the snapshot must record. */
st_status st_config_set(st_config* config, const char* key, const char* value, const char* source);

/* The schema's rows, for readers that walk a section instead of naming
 * each key (the model JSON and the model description: src/plan/options.c). */
typedef enum st_config_type {
  ST_CONFIG_INT,
  ST_CONFIG_FLOAT,
  ST_CONFIG_BOOL,
  ST_CONFIG_STRING, /* enums too: read with st_config_string */
  ST_CONFIG_LIST,
} st_config_type;
/* How a model.* key enters the model JSON that keys the bundle
 * (docs/bundle.md, "Bundle key"); the model description has them all. */
typedef enum st_config_bundle_use {
  ST_CONFIG_BUNDLE_ALWAYS = 0, /* always, among the leading fields */
  /* Only when it holds something other than what its default means, after
   * those: a key added later leaves the bundle keys of configs written
   * before it as they were. */
  ST_CONFIG_BUNDLE_IF_SET,
  ST_CONFIG_BUNDLE_IF_SET_AFTER_KERNELS, /* the same, after the kernel selection */
} st_config_bundle_use;
typedef struct st_config_key_info {
  const char* key; /* dotted: "model.d_model" */
  st_config_type type;
  st_config_bundle_use bundle; /* model.* keys */
  /* An int key whose 0 stands for another key's value ("model.n_heads"
   * for model.n_kv_heads); NULL when 0 is just 0. */
  const char* zero_means;
} st_config_key_info;
/* How many keys the schema has; st_config_key_at(0..count-1) in schema order. */
int st_config_key_count(void);
st_config_key_info st_config_key_at(int index);
/* Whether |key|'s value is its schema default. */
bool st_config_is_default(const st_config* config, const char* key);
/* An int key's value, its 0 replaced by the value it stands for (the
 * zero_means key's), e.g. model.n_kv_heads 0 -> model.n_heads. */
int64_t st_config_int_resolved(const st_config* config, const char* key);

/* Values with a syntax of their own, and rules between values, each stated
 * once (src/config/values.c): the schema's cross-field rules use them, and
 * so do the typed options and the plan builder for values that did not
 * come through a config file. Errors are ST_CODE_CONFIG and say what is
 * accepted. */

/* sched.remat, read once (st_config_remat_read) into what the plan builder
 * takes: a zeroed struct is auto. */
#define ST_CONFIG_REMAT_MAX_LAYERS 1024 /* model.n_layers' upper bound in the schema */
typedef enum st_config_remat_kind {
  ST_CONFIG_REMAT_AUTO = 0, /* the plan builder chooses (src/plan/remat_auto.c) */
  ST_CONFIG_REMAT_NONE,
  ST_CONFIG_REMAT_FULL,
  ST_CONFIG_REMAT_EVERY, /* layers 0, every, 2 x every, ... */
  ST_CONFIG_REMAT_LIST,  /* the layers whose bit |list| sets */
} st_config_remat_kind;
typedef struct st_config_remat {
  st_config_remat_kind kind;
  int every;                                      /* EVERY: K >= 1 */
  uint64_t list[ST_CONFIG_REMAT_MAX_LAYERS / 64]; /* LIST: bit l when layer l recomputes */
  /* The value as written (borrowed: the config's string), for the plan's
   * policy line and messages; NULL: the kind's name ("full", "every:K"). */
  const char* text;
} st_config_remat;

/* Reads sched.remat: "auto", "none", "full", "every:K" (recompute layers
 * 0, K, 2K, ...; K >= 1) or a comma-separated list of layer indices
 * ("0,2,5"). NULL or "" means "auto", the default. With n_layers >= 0
 * rejects listed layers >= n_layers; with n_layers < 0 checks the syntax
 * (a list's layers then kept only below ST_CONFIG_REMAT_MAX_LAYERS).
 * |out| borrows |spec| as its text. */
st_status st_config_remat_read(const char* spec, int n_layers, st_config_remat* out);
/* Which of |n_layers| layers |remat| recomputes, into |out| (n_layers
 * entries): an error naming the value when it lists a layer >= n_layers.
 * Auto fills no layer (the plan builder chooses). */
st_status st_config_remat_layers(const st_config_remat* remat, int n_layers, bool* out);
/* st_config_remat_read, then st_config_remat_layers into |out_remat|
 * (NULL: none) when n_layers >= 0. */
st_status st_config_remat_parse(const char* spec, int n_layers, bool* out_remat);
/* Whether |spec| is sched.remat=auto (NULL and "" included). */
bool st_config_remat_is_auto(const char* spec);
/* Parses sched.memory_budget: bytes as a whole number (0: no limit) into
 * *out_bytes, or a fraction of the device's memory in (0, 1], written with
 * a decimal point ("0.9"), into *out_fraction; the other gets 0. Either
 * out may be NULL. */
st_status st_config_memory_budget_parse(const char* spec, int64_t* out_bytes, double* out_fraction);
/* sched.optimizer=per_layer updates each layer before the global gradient
 * norm is known, so it cannot clip: an error when |per_layer| and
 * |grad_clip| > 0. */
st_status st_config_check_per_layer_clip(bool per_layer, double grad_clip);

/* Parses faults.nan_at: "" (off: *out_step = 0) or "STEP:LAYER[:TENSOR]",
 * STEP >= 1 (1-based, as steps are counted), LAYER >= 0, TENSOR an output
 * name of that layer's forward program (at most |tensor_size| - 1 chars;
 * "" when absent: the first output, y). Any out may be NULL. */
st_status st_config_nan_at_parse(const char* spec, int64_t* out_step, int* out_layer, char* out_tensor, size_t tensor_size);
/* diag.dump: "" (off: *out_step 0), "step:N" or "step:N,layers:A-B" (A, B
 * inclusive; -1 both when no range). ST_CODE_CONFIG naming the form. */
st_status st_config_dump_parse(const char* spec, int64_t* out_step, int* out_lo, int* out_hi);
/* diag.on_nonfinite=skip drops the update after the global gradient norm
 * is known; sched.optimizer=per_layer has updated every layer by then: an
 * error when |skip| and |per_layer|. */
st_status st_config_check_skip_per_layer(bool skip, bool per_layer);

/* Stable 64-bit hash (hex, 16 chars + NUL into |out|) of the resolved values
 * of every key whose dotted name starts with one of |prefixes| (all keys
 * when |prefix_count| is 0, except run.* and obs.*: where a run is written
 * and which views of its metrics it writes do not change the experiment).
 * Used for the config hash and bundle key. */
void st_config_hash(const st_config* config, const char* const* prefixes, int prefix_count, char out[17]);
/* Whether |key| is part of the whole-config hash (the experiment): all but
 * run.* (where and how a run is written) and obs.* (extra views of its
 * metrics, who ran it). strata diff lists the others apart. */
bool st_config_key_identifies(const char* key);

#ifdef __cplusplus
}
#endif
#endif /* STRATA_CONFIG_H */
