/* compare.c — `strata compare RUN_A RUN_B`: two step dumps (diag.dump,
 * format strata-dump/1, written by src/train/dump.c) walked in A's plan
 * order; the first launch with a tensor that differs from B's beyond its
 * budget is named, and the rest summarised by layer (docs/diagnostics.md,
 * "Dump and compare": the budgets and why, what is matched).
 *
 * Tensors are matched by what they are, not by which program made them:
 * (phase, stage, layer, microbatch, in/out, tensor name, occurrence), so a
 * run of ffi kernels meets one of xla programs, a one-device run an fsdp
 * run's shard programs. The accumulation of gradients over microbatches is
 * schedule-dependent in its intermediate sums (the pairing changes with
 * the mesh), so of phase "accum" only each gradient's final sum is
 * compared.
 *
 * Everything read is bounded: index.json's size, the entry and tensor
 * counts, ranks and dimensions; the tensors through the kept safetensors
 * reader, each one's dtype and shape checked against the index. */
#include <dirent.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "strata/base.h"
#include "strata/ckpt.h"
#include "strata/diag.h"

#define ST__CMP_FORMAT "strata-dump/1"
#define ST__CMP_MAX_INDEX (512u << 20) /* bytes of index.json */
#define ST__CMP_MAX_ENTRIES 1000000
#define ST__CMP_MAX_TENSORS 4096 /* of one entry */

/* One tensor of a dump, in the order of the walk. */
typedef struct st__cmp_tensor {
  char* match;  /* the matching key (owned) */
  const json_t* entry, *tensor; /* borrowed from the index */
  const char* cls;
  st_tensor_type type;
  const unsigned char* data; /* borrowed from the safetensors file */
  int first, count; /* its entry's tensors: t[first .. first + count - 1] */
} st__cmp_tensor;

typedef struct st__cmp_dump {
  char* dir; /* the dump folder */
  json_t* index;
  st_safetensors* st;
  int64_t step;
  st__cmp_tensor* t;
  int n;
  json_t* by_match; /* match -> position in t (an object) */
} st__cmp_dump;

static void st__cmp_dump_free(st__cmp_dump* d) {
  for (int i = 0; i < d->n; ++i) free(d->t[i].match);
  free(d->t);
  json_decref(d->index);
  json_decref(d->by_match);
  st_safetensors_free(d->st);
  free(d->dir);
  memset(d, 0, sizeof(*d));
}

/* The dump folder of |path|: |path| itself when it holds index.json, else
 * its dump/step_<step>/ (the only one when |step| is 0). */
static st_status st__cmp_find(const char* path, int64_t step, char** out) {
  *out = NULL;
  char* index = st_path_join(path, "index.json");
  bool here = st_fs_exists(index);
  free(index);
  if (here) {
    *out = st_xstrdup(path);
    return ST_OK;
  }
  char* dumps = st_path_join(path, "dump");
  DIR* dir = opendir(dumps);
  if (!dir) {
    st_status s = st_status_make(ST_CODE_CONFIG,
                                 "%s is not a dump: it has neither index.json nor dump/step_<N>/; run `strata train` with "
                                 "diag.dump=step:N to write one (docs/diagnostics.md, \"Dump and compare\")",
                                 path);
    free(dumps);
    return s;
  }
  int found = 0;
  int64_t chosen = 0;
  st_strbuf list = {0};
  for (struct dirent* e; (e = readdir(dir)) != NULL;) {
    long long n = 0;
    char tail = 0;
    if (sscanf(e->d_name, "step_%lld%c", &n, &tail) != 1 || n < 1) continue;
    st_strbuf_printf(&list, "%s%lld", found ? ", " : "", n);
    if (step == 0 || n == step) chosen = n;
    found++;
  }
  closedir(dir);
  st_status s = ST_OK;
  if (found == 0)
    s = st_status_make(ST_CODE_CONFIG, "%s holds no step_<N>/ dump; write one with diag.dump=step:N", dumps);
  else if (step != 0 && chosen == 0)
    s = st_status_make(ST_CODE_CONFIG, "%s has no dump of step %lld (it has steps %s): choose one of those with --step, or "
                       "dump step %lld with diag.dump=step:%lld", dumps, (long long)step, st_strbuf_cstr(&list),
                       (long long)step, (long long)step);
  else if (step == 0 && found > 1)
    s = st_status_make(ST_CODE_CONFIG, "%s holds dumps of steps %s: choose one with --step N", dumps, st_strbuf_cstr(&list));
  if (!s) {
    char leaf[48];
    snprintf(leaf, sizeof(leaf), "step_%lld", (long long)chosen);
    *out = st_path_join(dumps, leaf);
  }
  st_strbuf_free(&list);
  free(dumps);
  return s;
}

/* A damaged or foreign dump: exit 2 naming the file and what to do. */
static st_status st__cmp_bad(const st__cmp_dump* d, const char* what) {
  return st_status_make(ST_CODE_CONFIG,
                        "%s/index.json: %s; the dump is damaged or not one strata wrote (format " ST__CMP_FORMAT
                        "): write it again with diag.dump=step:N",
                        d->dir, what);
}

/* The matching key of tensor |x| of entry |e| ("" when it is not
 * compared: an accumulation's input). */
static void st__cmp_match(const json_t* e, const json_t* x, st_strbuf* out) {
  const char* phase = json_string_value(json_object_get(e, "phase"));
  const char* io = json_string_value(json_object_get(x, "io"));
  long long layer = json_integer_value(json_object_get(e, "layer"));
  long long micro = json_integer_value(json_object_get(e, "micro"));
  const char* stage = json_string_value(json_object_get(e, "stage"));
  const char* name = json_string_value(json_object_get(x, "name"));
  if (!strcmp(phase, "accum")) {
    /* The intermediate sums depend on the schedule: only the last output
     * of each (stage, layer, name), the accumulated gradient, counts. */
    if (!strcmp(io, "out")) st_strbuf_printf(out, "accum|%s|%lld|final|out|%s", stage ? stage : "", layer, name);
    return;
  }
  /* A recompute is the forward again (sched.remat): its residuals meet
   * the other run's forward's, the repeated inputs and y are occurrence 1. */
  if (!strcmp(phase, "recompute")) phase = "fwd";
  st_strbuf_printf(out, "%s|%s|%lld|%lld|%s|%s", phase, stage ? stage : "", layer, micro, io, name);
}

/* One tensor of the index checked against the safetensors file. */
static st_status st__cmp_tensor_load(st__cmp_dump* d, const json_t* e, const json_t* x, int ei, int ti, st__cmp_tensor* out) {
  char where[96];
  snprintf(where, sizeof(where), "entries[%d].tensors[%d]", ei, ti);
  const char* fields[] = {"io", "name", "class", "dtype"};
  for (int f = 0; f < 4; ++f)
    if (!json_is_string(json_object_get(x, fields[f]))) {
      char w[160];
      snprintf(w, sizeof(w), "%s has no string \"%s\"", where, fields[f]);
      return st__cmp_bad(d, w);
    }
  const char* io = json_string_value(json_object_get(x, "io"));
  const json_t* shape = json_object_get(x, "shape");
  const json_t* key = json_object_get(x, "key");
  memset(out, 0, sizeof(*out));
  out->type.dtype = st_dtype_parse(json_string_value(json_object_get(x, "dtype")));
  if ((strcmp(io, "in") && strcmp(io, "out")) || out->type.dtype == ST_DTYPE_INVALID || !json_is_array(shape) ||
      json_array_size(shape) > ST_MAX_RANK) {
    char w[200];
    snprintf(w, sizeof(w), "%s: io must be in or out, dtype a known one, shape an array of at most %d sizes", where,
             ST_MAX_RANK);
    return st__cmp_bad(d, w);
  }
  out->type.rank = (int)json_array_size(shape);
  for (int r = 0; r < out->type.rank; ++r) {
    const json_t* v = json_array_get(shape, (size_t)r);
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
      char w[160];
      snprintf(w, sizeof(w), "%s: shape[%d] is not a size", where, r);
      return st__cmp_bad(d, w);
    }
    out->type.dims[r] = json_integer_value(v);
  }
  out->entry = e;
  out->tensor = x;
  out->cls = json_string_value(json_object_get(x, "class"));
  if (json_is_null(key)) return ST_OK; /* listed, not stored: not compared */
  const st_safetensors_entry* se = json_is_string(key) ? st_safetensors_find(d->st, json_string_value(key)) : NULL;
  if (!se)
    return st_status_make(ST_CODE_CONFIG,
                          "%s/tensors.safetensors has no tensor '%s' that index.json's %s names: the two files are not "
                          "of one dump; write it again with diag.dump=step:N",
                          d->dir, json_is_string(key) ? json_string_value(key) : "(not a string)", where);
  bool same = se->type.dtype == out->type.dtype && se->type.rank == out->type.rank;
  for (int r = 0; same && r < out->type.rank; ++r) same = se->type.dims[r] == out->type.dims[r];
  if (!same) {
    char a[96], b[96];
    return st_status_make(ST_CODE_CONFIG,
                          "%s/tensors.safetensors: tensor '%s' is %s, index.json's %s says %s: the two files are not of "
                          "one dump; write it again with diag.dump=step:N",
                          d->dir, se->name, st_tensor_type_format(&se->type, a, sizeof(a)), where,
                          st_tensor_type_format(&out->type, b, sizeof(b)));
  }
  out->data = d->st->data + se->offset;
  return ST_OK;
}

/* Reads index.json (bounded) and checks its top level. */
static st_status st__cmp_read_index(st__cmp_dump* d) {
  char* path = st_path_join(d->dir, "index.json");
  struct stat sb;
  st_status s = ST_OK;
  if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
    s = st_status_make(ST_CODE_CONFIG, "%s is missing: %s is not a complete dump; write it again with diag.dump=step:N", path,
                       d->dir);
  else if ((uint64_t)sb.st_size > ST__CMP_MAX_INDEX)
    s = st_status_make(ST_CODE_CONFIG, "%s is %lld bytes, more than the %u a dump's index may have", path,
                       (long long)sb.st_size, ST__CMP_MAX_INDEX);
  char* text = NULL;
  size_t size = 0;
  if (!s) s = st_status_recode(st_fs_read_file(path, &text, &size), ST_CODE_CONFIG, "reading the dump's index");
  if (!s) s = st_status_recode(st_json_parse(text, size, path, &d->index), ST_CODE_CONFIG, "reading the dump's index");
  free(text);
  free(path);
  if (s) return s;
  const char* format = NULL;
  st_status_free(st_json_get_string(d->index, "format", "index.json", &format)); /* missing: said below */
  if (format && strcmp(format, ST__CMP_FORMAT)) {
    char w[200];
    snprintf(w, sizeof(w), "format is \"%.64s\", this strata reads \"" ST__CMP_FORMAT "\"", format);
    return st__cmp_bad(d, w);
  }
  if (!format) return st__cmp_bad(d, "no \"format\"");
  const json_t* entries = json_object_get(d->index, "entries");
  if (!json_is_integer(json_object_get(d->index, "step")) || !json_is_array(entries))
    return st__cmp_bad(d, "no integer \"step\" or no array \"entries\"");
  if (json_array_size(entries) > ST__CMP_MAX_ENTRIES) return st__cmp_bad(d, "more entries than a dump can have");
  d->step = json_integer_value(json_object_get(d->index, "step"));
  return ST_OK;
}

/* Reads a dump folder: the index, the tensors, the matching keys. */
static st_status st__cmp_load(const char* path, int64_t step, st__cmp_dump* d) {
  memset(d, 0, sizeof(*d));
  ST_RETURN(st__cmp_find(path, step, &d->dir));
  ST_RETURN(st__cmp_read_index(d));
  char* tpath = st_path_join(d->dir, "tensors.safetensors");
  st_status s = st_safetensors_read(tpath, &d->st);
  free(tpath);
  if (s)
    return st_status_recode(s, ST_CODE_CONFIG, "the dump's tensors (%s is incomplete: write it again with diag.dump=step:N)",
                            d->dir);
  const json_t* entries = json_object_get(d->index, "entries");
  d->by_match = st_json_obj();
  json_t* occ = st_json_obj();
  int cap = 0;
  st_strbuf m = {0};
  for (size_t i = 0; !s && i < json_array_size(entries); ++i) {
    const json_t* e = json_array_get(entries, i);
    const json_t* list = json_object_get(e, "tensors");
    const char* efields[] = {"program", "phase"};
    for (int f = 0; f < 2 && !s; ++f)
      if (!json_is_string(json_object_get(e, efields[f]))) s = st__cmp_bad(d, "an entry without a program or phase");
    if (!s && (!json_is_integer(json_object_get(e, "layer")) || !json_is_integer(json_object_get(e, "micro")) ||
               !json_is_integer(json_object_get(e, "op")) || !json_is_array(list) ||
               json_array_size(list) > ST__CMP_MAX_TENSORS))
      s = st__cmp_bad(d, "an entry without integer layer, micro and op, or without a tensors array (of a bounded size)");
    const int first = d->n;
    for (size_t j = 0; !s && j < json_array_size(list); ++j) {
      if (d->n == cap) {
        cap = cap ? 2 * cap : 1024;
        d->t = st_xrealloc(d->t, (size_t)cap * sizeof(*d->t));
      }
      st__cmp_tensor* x = &d->t[d->n];
      s = st__cmp_tensor_load(d, e, json_array_get(list, j), (int)i, (int)j, x);
      if (s) break;
      x->first = first;
      x->count = (int)json_array_size(list);
      d->n++;
      m.len = 0;
      if (m.data) m.data[0] = '\0';
      st__cmp_match(e, x->tensor, &m);
      if (!m.len || !x->data) continue;
      const bool accum = !strcmp(json_string_value(json_object_get(e, "phase")), "accum");
      if (!accum) {
        /* A repeated key (the same program twice in a microbatch) gets
         * its occurrence. */
        int64_t k = json_integer_value(json_object_get(occ, m.data));
        st_json_put_int(occ, m.data, k + 1);
        st_strbuf_printf(&m, "|%lld", (long long)k);
      } else {
        const json_t* prev = json_object_get(d->by_match, m.data);
        if (prev) { /* superseded by this later sum */
          free(d->t[json_integer_value(prev)].match);
          d->t[json_integer_value(prev)].match = NULL;
        }
      }
      x->match = st_xstrdup(m.data);
      st_json_put_int(d->by_match, m.data, d->n - 1);
    }
  }
  st_strbuf_free(&m);
  json_decref(occ);
  return s;
}

/*--- budgets (docs/diagnostics.md, "Budgets") -----------------------------*/

/* The unit roundoff of |dt|: half its ulp at 1. 0 for integers (exact). */
static double st__cmp_unit(st_dtype dt) {
  switch (dt) {
    case ST_DTYPE_F64: return 0x1p-53;
    case ST_DTYPE_F32: return 0x1p-24;
    case ST_DTYPE_F16: return 0x1p-11;
    case ST_DTYPE_BF16: return 0x1p-8;
    default: return 0;
  }
}

typedef struct st__cmp_model {
  double u_compute; /* the unit roundoff of the model's compute dtype */
  double n;         /* the longest reduction in a program */
  int depth;        /* blocks + embedding + head */
  int64_t step;     /* the dumped step */
} st__cmp_model;

static st_status st__cmp_model_of(const st__cmp_dump* d, st__cmp_model* out) {
  const json_t* m = json_object_get(d->index, "model");
  const char* keys[] = {"n_layers", "d_model", "d_ff", "seq_len", "vocab_size", "microbatch_rows"};
  int64_t v[6];
  for (int i = 0; i < 6; ++i) {
    const json_t* x = json_object_get(m, keys[i]);
    if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > ((int64_t)1 << 40)) {
      char w[120];
      snprintf(w, sizeof(w), "model.%s is missing or not a size", keys[i]);
      return st__cmp_bad(d, w);
    }
    v[i] = json_integer_value(x);
  }
  const json_t* cd = json_object_get(m, "compute_dtype");
  st_dtype dt = json_is_string(cd) ? st_dtype_parse(json_string_value(cd)) : ST_DTYPE_INVALID;
  if (st__cmp_unit(dt) == 0) return st__cmp_bad(d, "model.compute_dtype is missing or not a float dtype");
  /* The longest sum a program does: a feature (d_model, d_ff), the
   * vocabulary (softmax), the sequence (attention) or, for a weight
   * gradient, the microbatch's rows x positions. */
  double n = (double)v[1];
  const double cand[] = {(double)v[2], (double)v[3], (double)v[4], (double)v[5] * (double)v[3]};
  for (int i = 0; i < 4; ++i) n = cand[i] > n ? cand[i] : n;
  *out = (st__cmp_model){st__cmp_unit(dt), n > 1 ? n : 1, (int)v[0] + 2, d->step};
  return ST_OK;
}

/* The relative budget of a tensor of class |cls| and dtype |dt|: its
 * largest absolute difference over its largest magnitude may be this. */
static double st__cmp_budget(const st__cmp_model* m, const char* cls, st_dtype dt) {
  const double u_t = st__cmp_unit(dt);
  if (u_t == 0 || !strcmp(cls, "batch")) return 0; /* integers, the batch: exact */
  /* One program's error: a length-n sum accumulated in f32 (random-walk
   * growth, sqrt(n) u) plus the rounding of its result to the compute or
   * the tensor's dtype. */
  const double u_r = u_t > m->u_compute ? u_t : m->u_compute;
  const double g = sqrt(m->n) * 0x1p-24 + u_r;
  const double s = (double)(m->step > 0 ? m->step : 1), L = (double)m->depth;
  if (!strcmp(cls, "param")) return 8 * L * g * (s - 1) + 2 * u_r;
  if (!strcmp(cls, "activation") || !strcmp(cls, "loss")) return 4 * L * g * s;
  if (!strcmp(cls, "activation_grad") || !strcmp(cls, "gradient") || !strcmp(cls, "param_updated")) return 8 * L * g * s;
  return 16 * L * g * s; /* optimizer moments, squared norms, scalars from them (gscale), the rest */
}

/*--- errors ---------------------------------------------------------------*/

static bool st__cmp_same_type(const st_tensor_type* a, const st_tensor_type* b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int r = 0; r < a->rank; ++r)
    if (a->dims[r] != b->dims[r]) return false;
  return true;
}

static double st__cmp_value(st_dtype dt, const unsigned char* p, int64_t i) {
  switch (dt) {
    case ST_DTYPE_F32: {
      float f;
      memcpy(&f, p + 4 * i, 4);
      return f;
    }
    case ST_DTYPE_F64: {
      double f;
      memcpy(&f, p + 8 * i, 8);
      return f;
    }
    case ST_DTYPE_BF16: {
      uint32_t u = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case ST_DTYPE_F16: {
      unsigned h = (unsigned)(p[2 * i] | (p[2 * i + 1] << 8));
      int e = (int)((h >> 10) & 31);
      double mant = (double)(h & 1023);
      double v = e == 0 ? ldexp(mant, -24) : e == 31 ? (mant ? NAN : INFINITY) : ldexp(mant + 1024, e - 25);
      return (h & 0x8000) ? -v : v;
    }
    case ST_DTYPE_S32: {
      int32_t v;
      memcpy(&v, p + 4 * i, 4);
      return v;
    }
    case ST_DTYPE_S64: {
      int64_t v;
      memcpy(&v, p + 8 * i, 8);
      return (double)v;
    }
    case ST_DTYPE_U8:
    case ST_DTYPE_PRED: return p[i];
    default: return NAN;
  }
}

typedef struct st__cmp_err {
  double max_abs; /* the largest |a - b|; inf where one is finite and the other not */
  double scale;   /* the largest finite |a| or |b| */
  double rel;     /* max_abs / scale (0 when both are 0) */
  int64_t at;     /* the element of max_abs */
  double ratio;   /* the largest |a - b| over its element's budget: over budget above 1 */
} st__cmp_err;

/* |a| against |b| with the relative budget |budget| (of the scale) plus,
 * when |allow| is given, each element's absolute allowance. */
static st__cmp_err st__cmp_error(const st__cmp_tensor* a, const st__cmp_tensor* b, double budget, const double* allow) {
  st__cmp_err e = {0, 0, 0, -1, 0};
  const int64_t n = st_tensor_type_elements(&a->type);
  for (int64_t i = 0; i < n; ++i) {
    double x = fabs(st__cmp_value(a->type.dtype, a->data, i)), y = fabs(st__cmp_value(b->type.dtype, b->data, i));
    if (isfinite(x) && x > e.scale) e.scale = x;
    if (isfinite(y) && y > e.scale) e.scale = y;
  }
  for (int64_t i = 0; i < n; ++i) {
    double x = st__cmp_value(a->type.dtype, a->data, i), y = st__cmp_value(b->type.dtype, b->data, i);
    /* the same non-finite value on both sides agrees */
    double d = isfinite(x) && isfinite(y) ? fabs(x - y) : (isnan(x) && isnan(y)) || x == y ? 0 : INFINITY;
    if (d > e.max_abs) {
      e.max_abs = d;
      e.at = i;
    }
    double room = budget * e.scale + (allow ? allow[i] : 0);
    double r = d == 0 ? 0 : room > 0 ? d / room : INFINITY;
    if (r > e.ratio) e.ratio = r;
  }
  e.rel = e.max_abs == 0 ? 0 : e.scale > 0 ? e.max_abs / e.scale : INFINITY;
  return e;
}

/* The tensor of |a|'s entry with this io and name (NULL: none, or not stored). */
static const st__cmp_tensor* st__cmp_sibling(const st__cmp_dump* d, const st__cmp_tensor* a, const char* io, const char* name) {
  for (int k = a->first; k < a->first + a->count && k < d->n; ++k) {
    const st__cmp_tensor* x = &d->t[k];
    if (x->data && !strcmp(json_string_value(json_object_get(x->tensor, "io")), io) &&
        !strcmp(json_string_value(json_object_get(x->tensor, "name")), name))
      return x;
  }
  return NULL;
}

static bool st__cmp_scalars(const st__cmp_tensor* x, int64_t n, double* out) {
  if (!x || st_tensor_type_elements(&x->type) < n) return false;
  for (int64_t i = 0; i < n; ++i) out[i] = st__cmp_value(x->type.dtype, x->data, i);
  return true;
}

/* AdamW's parameters (docs/diagnostics.md, "Budgets"): the update
 * m^/(sqrt(v^) + eps) of an element whose gradient is within the
 * gradient budget of zero may move by up to 2 lr (at the first step it is
 * g/(|g| + eps): a sign). |u| is a parameter of an AdamW update's entry
 * (with lr, gscale, hyper, step, the gradient and v of the same name).
 * Each update adds lr min(2, d / (sqrt(v^) + eps)) per element, d the
 * gradient budget in gscale'd units: the input (the state the step starts
 * from: |input|) holds step - 1 of them, with v^ from the input v (this
 * step's lr standing for the earlier ones'); the output one more, with
 * v^ from the output v. NULL: not AdamW's, or step 1's input (no update
 * before it). */
static double* st__cmp_adamw_allowance(const st__cmp_dump* A, const st__cmp_tensor* u, double grad_budget, bool input) {
  const char* name = json_string_value(json_object_get(u->tensor, "name"));
  char gname[160], vname[160];
  snprintf(gname, sizeof(gname), "grad_%s", name);
  snprintf(vname, sizeof(vname), "v_%s", name);
  double lr, gscale, step, hyper[4];
  const st__cmp_tensor* g = st__cmp_sibling(A, u, "in", gname);
  const st__cmp_tensor* v_in = st__cmp_sibling(A, u, "in", vname);
  const st__cmp_tensor* v_out = st__cmp_sibling(A, u, "out", vname);
  if (!st__cmp_scalars(st__cmp_sibling(A, u, "in", "lr"), 1, &lr) ||
      !st__cmp_scalars(st__cmp_sibling(A, u, "in", "gscale"), 1, &gscale) ||
      !st__cmp_scalars(st__cmp_sibling(A, u, "in", "step"), 1, &step) ||
      !st__cmp_scalars(st__cmp_sibling(A, u, "in", "hyper"), 4, hyper) || !g || !v_in || !v_out)
    return NULL;
  const int64_t n = st_tensor_type_elements(&u->type);
  if (st_tensor_type_elements(&g->type) != n || st_tensor_type_elements(&v_in->type) != n ||
      st_tensor_type_elements(&v_out->type) != n || step < 1 || step > 1e9 || (input && step < 2))
    return NULL;
  double gmax = 0;
  for (int64_t i = 0; i < n; ++i) {
    double x = fabs(st__cmp_value(g->type.dtype, g->data, i));
    if (isfinite(x) && x > gmax) gmax = x;
  }
  const double delta = grad_budget * gmax * fabs(gscale), eps = hyper[2];
  const double corr_in = 1 - pow(hyper[1], step - 1), corr_out = 1 - pow(hyper[1], step);
  double* allow = st_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  for (int64_t i = 0; i < n; ++i) {
    double a = 0;
    for (int part = 0; part < (input ? 1 : 2); ++part) {
      const st__cmp_tensor* v = part == 0 ? v_in : v_out;
      const double corr = part == 0 ? corr_in : corr_out, times = part == 0 ? step - 1 : 1;
      if (times <= 0 || corr <= 0) continue;
      double vh = st__cmp_value(v->type.dtype, v->data, i) / corr;
      double k = delta / (sqrt(vh > 0 ? vh : 0) + eps);
      a += times * fabs(lr) * (k < 2 && isfinite(k) ? k : 2);
    }
    allow[i] = a;
  }
  return allow;
}

/* The allowance of a parameter tensor |a| of A (above): an update's
 * output; or an input anywhere, through the same-named input of its
 * update (the entry's stage, else the embedding's or the head's: the tied
 * wte is an input of the head). */
static double* st__cmp_param_allowance(const st__cmp_dump* A, const st__cmp_tensor* a, double grad_budget) {
  const json_t* e = a->entry;
  const bool out = !strcmp(json_string_value(json_object_get(a->tensor, "io")), "out");
  if (!strcmp(a->cls, "param_updated")) return out ? st__cmp_adamw_allowance(A, a, grad_budget, false) : NULL;
  if (strcmp(a->cls, "param") || out) return NULL;
  const char* stage = json_string_value(json_object_get(e, "stage"));
  const char* stages[] = {stage ? stage : "", "embed", "head"};
  for (int k = 0; k < 3; ++k) {
    char key[256];
    snprintf(key, sizeof(key), "update|%s|%lld|-1|in|%s|0", stages[k], (long long)json_integer_value(json_object_get(e, "layer")),
             json_string_value(json_object_get(a->tensor, "name")));
    const json_t* at = json_object_get(A->by_match, key);
    if (!at) continue;
    const st__cmp_tensor* u = &A->t[json_integer_value(at)];
    if (!st__cmp_same_type(&u->type, &a->type)) return NULL;
    return st__cmp_adamw_allowance(A, u, grad_budget, true);
  }
  return NULL;
}

/*--- the walk -------------------------------------------------------------*/

/* "layer 3", "embed", "head": where an entry belongs in the summary. */
static void st__cmp_where(const json_t* e, char* out, size_t size) {
  long long layer = json_integer_value(json_object_get(e, "layer"));
  const char* stage = json_string_value(json_object_get(e, "stage"));
  if (layer >= 0) snprintf(out, size, "layer %lld", layer);
  else snprintf(out, size, "%s", stage && stage[0] ? stage : "other");
}

/* One compared tensor as the report lists it. */
static json_t* st__cmp_item(const st__cmp_tensor* a, const st__cmp_tensor* b, const st__cmp_err* err, double budget,
                            const char* why) {
  json_t* j = st_json_obj();
  const json_t* e = a->entry;
  st_json_put_str(j, "program", json_string_value(json_object_get(e, "program")));
  st_json_put_str(j, "program_b", json_string_value(json_object_get(b->entry, "program")));
  st_json_put_int(j, "op", json_integer_value(json_object_get(e, "op")));
  st_json_put_int(j, "op_b", json_integer_value(json_object_get(b->entry, "op")));
  st_json_put_str(j, "phase", json_string_value(json_object_get(e, "phase")));
  st_json_put_int(j, "layer", json_integer_value(json_object_get(e, "layer")));
  st_json_put_int(j, "micro", json_integer_value(json_object_get(e, "micro")));
  st_json_put_str(j, "io", json_string_value(json_object_get(a->tensor, "io")));
  st_json_put_str(j, "tensor", json_string_value(json_object_get(a->tensor, "name")));
  st_json_put_str(j, "class", a->cls);
  st_json_put_str(j, "dtype", st_dtype_name(a->type.dtype));
  json_t* shape = st_json_arr();
  for (int r = 0; r < a->type.rank; ++r) st_json_push(shape, st_json_int(a->type.dims[r]));
  st_json_put(j, "shape", shape);
  if (why) {
    st_json_put_str(j, "mismatch", why);
    return j;
  }
  st_json_put_num(j, "max_abs", isinf(err->max_abs) ? -1 : err->max_abs); /* -1: a non-finite value on one side only */
  st_json_put_num(j, "max_rel", isinf(err->rel) ? -1 : err->rel);
  st_json_put_num(j, "scale", err->scale);
  st_json_put_num(j, "budget", budget);
  st_json_put_num(j, "ratio", isinf(err->ratio) ? -1 : err->ratio); /* the largest error over its budget: > 1 is over */
  st_json_put_int(j, "element", err->at);
  return j;
}

typedef struct st__cmp_walk {
  json_t* first;    /* the first entry's over-budget tensors (array) */
  const json_t* first_entry;
  double first_ratio;
  json_t* layers;   /* "layer 3" -> {compared, over, worst} */
  int64_t compared, over, mismatched, only_a, only_b;
  json_t* only_a_list, *only_b_list;
  double max_ratio;  /* the largest error / budget of any tensor: the headroom */
  json_t* max_item;  /* its tensor (owned; NULL: none compared with a budget) */
} st__cmp_walk;

static void st__cmp_count(st__cmp_walk* w, const st__cmp_tensor* a, json_t* item, double ratio, bool over) {
  char where[48];
  st__cmp_where(a->entry, where, sizeof(where));
  json_t* l = json_object_get(w->layers, where);
  if (!l) {
    l = st_json_obj();
    st_json_put_int(l, "compared", 0);
    st_json_put_int(l, "over", 0);
    st_json_put(l, "worst", json_null());
    st_json_put_num(l, "worst_ratio", 0);
    st_json_put(w->layers, where, l);
  }
  st_json_put_int(l, "compared", json_integer_value(json_object_get(l, "compared")) + 1);
  if (ratio > w->max_ratio || !w->max_item) {
    w->max_ratio = ratio > w->max_ratio ? ratio : w->max_ratio;
    json_decref(w->max_item);
    w->max_item = json_incref(item);
  }
  if (over) st_json_put_int(l, "over", json_integer_value(json_object_get(l, "over")) + 1);
  if (over && ratio > json_real_value(json_object_get(l, "worst_ratio"))) {
    st_json_put_num(l, "worst_ratio", ratio);
    st_json_put(l, "worst", json_incref(item));
  }
  if (!over) return;
  w->over++;
  if (!w->first_entry) {
    w->first_entry = a->entry;
    w->first = st_json_arr();
  }
  if (w->first_entry == a->entry) st_json_push(w->first, json_incref(item));
}

/* Walks A's tensors in plan order against B's. */
static void st__cmp_walk_dumps(const st__cmp_dump* A, const st__cmp_dump* B, const st__cmp_model* m, st__cmp_walk* w) {
  for (int i = 0; i < A->n; ++i) {
    const st__cmp_tensor* a = &A->t[i];
    if (!a->match) continue;
    const json_t* at = json_object_get(B->by_match, a->match);
    if (!at) {
      if (w->only_a++ < 20) st_json_push(w->only_a_list, st_json_str(a->match));
      continue;
    }
    const st__cmp_tensor* b = &B->t[json_integer_value(at)];
    w->compared++;
    if (!st__cmp_same_type(&a->type, &b->type)) {
      char ta[96], tb[96], why[220];
      snprintf(why, sizeof(why), "%s in A, %s in B", st_tensor_type_format(&a->type, ta, sizeof(ta)),
               st_tensor_type_format(&b->type, tb, sizeof(tb)));
      json_t* item = st__cmp_item(a, b, NULL, 0, why);
      w->mismatched++;
      st__cmp_count(w, a, item, INFINITY, true);
      json_decref(item);
      continue;
    }
    double budget = st__cmp_budget(m, a->cls, a->type.dtype);
    double* allow = st__cmp_param_allowance(A, a, st__cmp_budget(m, "gradient", a->type.dtype));
    st__cmp_err err = st__cmp_error(a, b, budget, allow);
    bool allowed = allow != NULL;
    free(allow);
    bool over = err.ratio > 1;
    double ratio = err.ratio;
    json_t* item = st__cmp_item(a, b, &err, budget, NULL);
    st_json_put_bool(item, "adamw_allowance", allowed);
    st__cmp_count(w, a, item, ratio, over);
    json_decref(item);
  }
  const char* key;
  json_t* v;
  json_object_foreach(B->by_match, key, v) {
    (void)v;
    if (!B->t[json_integer_value(v)].match || json_object_get(A->by_match, key)) continue;
    if (w->only_b++ < 20) st_json_push(w->only_b_list, st_json_str(key));
  }
}

/* The first launch's verdict: its over-budget tensors, the worst of them
 * (an output rather than an input when its inputs agree) named. */
static json_t* st__cmp_first(const st__cmp_walk* w) {
  if (!w->first_entry) return json_null();
  const json_t* e = w->first_entry;
  json_t* f = st_json_obj();
  st_json_put_str(f, "program", json_string_value(json_object_get(e, "program")));
  st_json_put_int(f, "op", json_integer_value(json_object_get(e, "op")));
  st_json_put_str(f, "kind", json_string_value(json_object_get(e, "kind")));
  st_json_put_str(f, "phase", json_string_value(json_object_get(e, "phase")));
  st_json_put_int(f, "layer", json_integer_value(json_object_get(e, "layer")));
  st_json_put_int(f, "micro", json_integer_value(json_object_get(e, "micro")));
  bool inputs_ok = true;
  size_t i;
  json_t* item;
  json_array_foreach(w->first, i, item) inputs_ok = inputs_ok && strcmp(json_string_value(json_object_get(item, "io")), "in");
  const json_t* worst = NULL;
  double best = -1;
  json_array_foreach(w->first, i, item) {
    const json_t* ratio = json_object_get(item, "ratio");
    double r = !json_is_number(ratio) || json_number_value(ratio) < 0 ? INFINITY : json_number_value(ratio);
    if (r > best) {
      best = r;
      worst = item;
    }
  }
  st_json_put(f, "tensor", json_incref((json_t*)worst));
  st_json_put_bool(f, "inputs_within_budget", inputs_ok);
  st_json_put(f, "over_budget", json_incref(w->first));
  return f;
}

static json_t* st__cmp_budgets(const st__cmp_model* m) {
  json_t* b = st_json_obj();
  const char* classes[] = {"param", "activation", "loss", "activation_grad", "gradient", "metric", "param_updated", "optimizer"};
  for (int i = 0; i < 8; ++i) st_json_put_num(b, classes[i], st__cmp_budget(m, classes[i], ST_DTYPE_F32));
  return b;
}

/* A new reference to |v|, or null when the index has none (a field only
 * reported, not needed). */
static json_t* st__cmp_copy(json_t* v) { return v ? json_incref(v) : json_null(); }

st_status st_compare_dumps(const char* run_a, const char* run_b, int64_t step, st_json** out_report) {
  *out_report = NULL;
  st__cmp_dump A, B;
  memset(&B, 0, sizeof(B));
  st_status s = st__cmp_load(run_a, step, &A);
  if (!s) s = st__cmp_load(run_b, step ? step : A.step, &B);
  st__cmp_model ma, mb;
  if (!s) s = st__cmp_model_of(&A, &ma);
  if (!s) s = st__cmp_model_of(&B, &mb);
  if (!s && A.step != B.step)
    s = st_status_make(ST_CODE_CONFIG, "mismatched steps: %s is step %lld, %s step %lld; compare dumps of the same step "
                       "(diag.dump=step:N in both runs)", A.dir, (long long)A.step, B.dir, (long long)B.step);
  if (!s && !json_equal(json_object_get(A.index, "model"), json_object_get(B.index, "model"))) {
    char* ta = st_json_dump(json_object_get(A.index, "model"), 0);
    char* tb = st_json_dump(json_object_get(B.index, "model"), 0);
    s = st_status_make(ST_CODE_CONFIG, "the dumps are of different models: %s has %s, %s has %s; compare runs of one model",
                       A.dir, ta, B.dir, tb);
    free(ta);
    free(tb);
  }
  if (s) {
    st__cmp_dump_free(&A);
    st__cmp_dump_free(&B);
    return s;
  }
  st__cmp_walk w = {.layers = st_json_obj(), .only_a_list = st_json_arr(), .only_b_list = st_json_arr()};
  st__cmp_walk_dumps(&A, &B, &ma, &w);
  if (w.compared == 0)
    s = st_status_make(ST_CODE_CONFIG, "no tensor of %s matches one of %s (different layer ranges, or not one model's "
                       "programs): nothing to compare", A.dir, B.dir);
  json_t* r = st_json_obj();
  st_json_put_str(r, "a", A.dir);
  st_json_put_str(r, "b", B.dir);
  st_json_put_int(r, "step", A.step);
  st_json_put(r, "kernels_a", st__cmp_copy(json_object_get(json_object_get(A.index, "config"), "kernels")));
  st_json_put(r, "kernels_b", st__cmp_copy(json_object_get(json_object_get(B.index, "config"), "kernels")));
  st_json_put(r, "mesh_a", st__cmp_copy(json_object_get(A.index, "mesh")));
  st_json_put(r, "mesh_b", st__cmp_copy(json_object_get(B.index, "mesh")));
  st_json_put_int(r, "compared", w.compared);
  st_json_put_int(r, "over_budget", w.over);
  st_json_put_int(r, "mismatched", w.mismatched);
  st_json_put_int(r, "only_a", w.only_a);
  st_json_put_int(r, "only_b", w.only_b);
  st_json_put(r, "only_a_examples", w.only_a_list);
  st_json_put(r, "only_b_examples", w.only_b_list);
  st_json_put_bool(r, "differ", w.over > 0);
  st_json_put(r, "first", st__cmp_first(&w));
  json_t* layers = st_json_arr();
  const char* key;
  json_t* v;
  json_object_foreach(w.layers, key, v) {
    json_t* l = st_json_obj();
    st_json_put_str(l, "where", key);
    st_json_put(l, "compared", json_incref(json_object_get(v, "compared")));
    st_json_put(l, "over_budget", json_incref(json_object_get(v, "over")));
    st_json_put(l, "worst", json_incref(json_object_get(v, "worst")));
    st_json_push(layers, l);
  }
  st_json_put(r, "by_layer", layers);
  st_json_put(r, "budgets_f32", st__cmp_budgets(&ma));
  st_json_put_num(r, "max_ratio", isinf(w.max_ratio) ? -1 : w.max_ratio);
  st_json_put(r, "max_ratio_tensor", w.max_item ? w.max_item : json_null());
  json_decref(w.layers);
  json_decref(w.first);
  st__cmp_dump_free(&A);
  st__cmp_dump_free(&B);
  if (s) {
    json_decref(r);
    return s;
  }
  *out_report = r;
  return ST_OK;
}
