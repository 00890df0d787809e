/* cmd_data_inspect.c — `strata data inspect CONFIG [k=v ...] --step N
 * [--microbatch M] [--sequence K] [--json]`: the batch that training step N
 * (1-based, as metrics count steps) trains on, as the trainer fills it
 * (st_dataset_fill: the same call, the same sampler position), shown per
 * sequence: each segment's decoded text, then per token the segment id,
 * position, target and loss weight, and a picture of the attention mask
 * the positions imply (docs/data.md, "Inspecting a batch").
 *
 * Segment ids are not stored anywhere: they follow from the positions (a
 * segment starts exactly where the position is 0), as the model derives
 * them (docs/model.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/train.h"

#define ST__PICTURE_CELLS 64 /* the mask picture's side, at most */

static const char st__inspect_usage[] =
    "usage: strata data inspect CONFIG [key=value ...] --step N [--microbatch M] [--sequence K] [--json]\n"
    "  the batch training step N (1..train.steps) trains on: microbatch M (default 0) of it, every sequence or\n"
    "  only row K; per sequence its segments' text, segment ids, positions, targets, loss weights and the\n"
    "  attention mask they imply (docs/data.md, \"Inspecting a batch\").\n";

typedef struct {
  int64_t step, micro, row; /* row -1: every row */
  bool json;
} st__inspect_args;

static st_status st__inspect_int(const char* flag, const char* v, int64_t lo, int64_t* out) {
  char* end = NULL;
  errno = 0;
  long long x = v ? strtoll(v, &end, 10) : 0;
  if (!v || end == v || *end || errno || x < lo)
    return st_status_make(ST_CODE_CONFIG, "%s needs a whole number >= %lld (got '%s')\n%s", flag, (long long)lo,
                          v ? v : "", st__inspect_usage);
  *out = x;
  return ST_OK;
}

/* Splits the flags off |argv|; what is left (CONFIG and k=v) goes to |rest|. */
static st_status st__inspect_parse(int argc, char** argv, st__inspect_args* a, char** rest, int* n_rest) {
  *a = (st__inspect_args){.step = -1, .micro = 0, .row = -1};
  *n_rest = 0;
  for (int i = 0; i < argc; ++i) {
    const char* f = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    st_status s = ST_OK;
    if (!strcmp(f, "--step")) s = st__inspect_int(f, v, 1, &a->step), ++i;
    else if (!strcmp(f, "--microbatch")) s = st__inspect_int(f, v, 0, &a->micro), ++i;
    else if (!strcmp(f, "--sequence")) s = st__inspect_int(f, v, 0, &a->row), ++i;
    else if (!strcmp(f, "--json")) a->json = true;
    else if (!strncmp(f, "--", 2)) s = st_status_make(ST_CODE_CONFIG, "unknown flag '%s'\n%s", f, st__inspect_usage);
    else rest[(*n_rest)++] = argv[i];
    if (s) return s;
  }
  if (a->step < 0) return st_status_make(ST_CODE_CONFIG, "--step N is required\n%s", st__inspect_usage);
  return ST_OK;
}

/* One sequence of the batch: T tokens from |at| of the filled arrays. */
typedef struct {
  const int32_t *in, *tgt, *pos;
  const float* w;
  int64_t T;
} st__seq;

static int32_t st__inspect_pos(const st__seq* q, int64_t i) { return q->pos ? q->pos[i] : (int32_t)i; }

/* The attention mask of |q|: query i sees key j iff i - pos[i] <= j <= i.
 * A picture of at most ST__PICTURE_CELLS cells a side; a cell stands for a
 * block of queries x keys: '#' all allowed, '+' some, '.' none. */
static void st__picture(const st__seq* q, st_strbuf* out) {
  const int64_t T = q->T;
  const int64_t cell = (T + ST__PICTURE_CELLS - 1) / ST__PICTURE_CELLS;
  const int64_t n = (T + cell - 1) / cell;
  st_strbuf_printf(out, "  attention (query rows, key columns; a cell = %lld x %lld tokens; # all, + some, . none):\n",
                   (long long)cell, (long long)cell);
  for (int64_t r = 0; r < n; ++r) {
    st_strbuf_append(out, "    ");
    for (int64_t c = 0; c < n; ++c) {
      int64_t seen = 0, all = 0;
      for (int64_t i = r * cell; i < (r + 1) * cell && i < T; ++i)
        for (int64_t j = c * cell; j < (c + 1) * cell && j < T; ++j) {
          ++all;
          seen += j <= i && j >= i - st__inspect_pos(q, i);
        }
      st_strbuf_append(out, seen == 0 ? "." : seen == all ? "#" : "+");
    }
    st_strbuf_append(out, "\n");
  }
}

/* The bytes of ids [a, b) of |ids| as a quoted C-like string. */
static void st__quoted(const st_tokenizer* tok, const int32_t* ids, int64_t a, int64_t b, st_strbuf* out) {
  st_strbuf raw = {0};
  st_status s = st_tokenizer_decode(tok, ids + a, (size_t)(b - a), &raw);
  st_status_free(s); /* the ids were checked against the vocabulary when the token file was read */
  st_strbuf_append(out, "\"");
  for (size_t k = 0; k < raw.len; ++k) {
    unsigned char ch = (unsigned char)raw.data[k];
    if (ch == '\n') st_strbuf_append(out, "\\n");
    else if (ch == '"' || ch == '\\') st_strbuf_printf(out, "\\%c", ch);
    else if (ch < 0x20 || ch == 0x7f) st_strbuf_printf(out, "\\x%02x", ch);
    else st_strbuf_append_n(out, (const char*)&ch, 1);
  }
  st_strbuf_append(out, "\"");
  st_strbuf_free(&raw);
}

static void st__row(st_strbuf* out, const char* label, const st__seq* q, int what) {
  st_strbuf_printf(out, "  %-9s", label);
  int32_t seg = -1;
  for (int64_t i = 0; i < q->T; ++i) {
    if (st__inspect_pos(q, i) == 0) ++seg;
    if (what == 0) st_strbuf_printf(out, " %d", seg);
    else if (what == 1) st_strbuf_printf(out, " %d", st__inspect_pos(q, i));
    else if (what == 2) st_strbuf_printf(out, " %d", q->tgt[i]);
    else st_strbuf_printf(out, " %g", (double)q->w[i]);
  }
  st_strbuf_append(out, "\n");
}

/* The text form of sequence |q| (index |index| of the stream). */
static void st__text(const st__seq* q, const st_tokenizer* tok, uint64_t index, st_strbuf* out) {
  double w = 0;
  for (int64_t i = 0; i < q->T; ++i) w += q->w[i];
  st_strbuf_printf(out, "sequence %llu: loss weight %g of %lld targets\n", (unsigned long long)index, w, (long long)q->T);
  for (int64_t a = 0, k = 0; a < q->T; ++k) {
    int64_t b = a + 1;
    while (b < q->T && st__inspect_pos(q, b) != 0) ++b;
    double sw = 0;
    for (int64_t i = a; i < b; ++i) sw += q->w[i];
    st_strbuf_printf(out, "  segment %lld: tokens %lld..%lld, weight %g: ", (long long)k, (long long)a, (long long)b - 1, sw);
    st__quoted(tok, q->in, a, b, out);
    st_strbuf_append(out, "\n");
    a = b;
  }
  st__row(out, "segment", q, 0);
  st__row(out, "position", q, 1);
  st__row(out, "target", q, 2);
  st__row(out, "weight", q, 3);
  st__picture(q, out);
}

static json_t* st__inspect_ints(const int32_t* v, int64_t n) {
  json_t* a = st_json_arr();
  for (int64_t i = 0; i < n; ++i) st_json_push(a, st_json_int(v[i]));
  return a;
}

static json_t* st__json(const st__seq* q, const st_tokenizer* tok, uint64_t index) {
  json_t* j = st_json_obj();
  st_json_put_int(j, "index", (int64_t)index);
  json_t *seg = st_json_arr(), *pos = st_json_arr(), *w = st_json_arr(), *segs = st_json_arr();
  int32_t s = -1;
  for (int64_t i = 0; i < q->T; ++i) {
    if (st__inspect_pos(q, i) == 0) ++s;
    st_json_push(seg, st_json_int(s));
    st_json_push(pos, st_json_int(st__inspect_pos(q, i)));
    st_json_push(w, st_json_num(q->w[i]));
  }
  for (int64_t a = 0; a < q->T;) {
    int64_t b = a + 1;
    while (b < q->T && st__inspect_pos(q, b) != 0) ++b;
    st_strbuf raw = {0};
    st_status_free(st_tokenizer_decode(tok, q->in + a, (size_t)(b - a), &raw));
    json_t* o = st_json_obj();
    st_json_put_int(o, "start", a);
    st_json_put_int(o, "end", b);
    st_json_put(o, "text", st_json_strn(raw.data ? raw.data : "", raw.len));
    st_json_push(segs, o);
    st_strbuf_free(&raw);
    a = b;
  }
  st_json_put(j, "segments", segs);
  st_json_put(j, "inputs", st__inspect_ints(q->in, q->T));
  st_json_put(j, "targets", st__inspect_ints(q->tgt, q->T));
  st_json_put(j, "segment_ids", seg);
  st_json_put(j, "positions", pos);
  st_json_put(j, "weights", w);
  return j;
}

static st_status st__inspect_run(const st_plan_options* o, const st__inspect_args* a) {
  const int64_t B = o->batch_size, mb = B / o->microbatches, T = o->data.seq_len;
  if (a->step > o->steps)
    return st_status_make(ST_CODE_CONFIG, "--step %lld: the run has train.steps=%lld steps", (long long)a->step,
                          (long long)o->steps);
  if (a->micro >= o->microbatches)
    return st_status_make(ST_CODE_CONFIG, "--microbatch %lld: a step has train.microbatches=%lld (0..%lld)",
                          (long long)a->micro, (long long)o->microbatches, (long long)o->microbatches - 1);
  if (a->row >= mb)
    return st_status_make(ST_CODE_CONFIG, "--sequence %lld: a microbatch has %lld sequences (0..%lld)", (long long)a->row,
                          (long long)mb, (long long)mb - 1);
  st_dataset* ds = NULL;
  ST_RETURN(st_dataset_open(&o->data, &ds));
  st_tokenizer* tok = NULL;
  st_status s = st_tokenizer_open(st_dataset_token_path(ds), &tok);
  const size_t n = (size_t)(mb * T);
  int32_t* in = st_xcalloc(n, sizeof(int32_t));
  int32_t* tgt = st_xcalloc(n, sizeof(int32_t));
  int32_t* pos = st_xcalloc(n, sizeof(int32_t));
  float* w = st_xcalloc(n, sizeof(float));
  /* The trainer's sampler position for step N, microbatch M (docs/data.md). */
  const uint64_t first = (uint64_t)((a->step - 1) * B + a->micro * mb);
  if (!s) st_dataset_fill(ds, ST_STREAM_TRAIN, first, mb, in, tgt, w, pos);
  json_t* arr = st_json_arr();
  st_strbuf text = {0};
  if (!s) {
    st_strbuf_printf(&text, "step %lld, microbatch %lld: sequences %llu..%llu of the training stream (%s)\n",
                     (long long)a->step, (long long)a->micro, (unsigned long long)first,
                     (unsigned long long)(first + (uint64_t)mb - 1), st_dataset_token_path(ds));
    for (int64_t r = 0; r < mb; ++r) {
      if (a->row >= 0 && r != a->row) continue;
      const size_t at = (size_t)(r * T);
      st__seq q = {in + at, tgt + at, pos + at, w + at, T};
      if (a->json) st_json_push(arr, st__json(&q, tok, first + (uint64_t)r));
      else st__text(&q, tok, first + (uint64_t)r, &text);
    }
  }
  if (!s && a->json) {
    json_t* j = st_json_obj();
    st_json_put_int(j, "step", a->step);
    st_json_put_int(j, "microbatch", a->micro);
    st_json_put_str(j, "token_file", st_dataset_token_path(ds));
    st_json_put(j, "sequences", arr);
    arr = NULL;
    st_cli_print_json(j, 2);
    json_decref(j);
  } else if (!s) {
    fwrite(text.data, 1, text.len, stdout);
  }
  json_decref(arr);
  st_strbuf_free(&text);
  free(in);
  free(tgt);
  free(pos);
  free(w);
  st_tokenizer_destroy(tok);
  st_dataset_destroy(ds);
  return s;
}

int st_cli_data_inspect(int argc, char** argv) {
  char** rest = st_xcalloc((size_t)argc + 1, sizeof(char*));
  int n = 0;
  st__inspect_args a;
  st_status s = st__inspect_parse(argc, argv, &a, rest, &n);
  st_config* cfg = NULL;
  if (!s) s = st_cli_load_config("data inspect", n, rest, &cfg);
  if (!s) {
    st_plan_options o;
    s = st_plan_options_from_config(cfg, &o);
    if (!s) s = st__inspect_run(&o, &a);
    st_plan_options_deinit(&o);
  }
  st_config_destroy(cfg);
  free(rest);
  return st_cli_report(s);
}
