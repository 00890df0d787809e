/* packing.c — data.packing none and pack: the document stream of a seed
 * (weighted over the sources) and sequences filled from it
 * (docs/data.md, "Packing" and "Document stream"; python/strata_jax/data.py
 * mirrors it bit for bit). */
#include <stdlib.h>
#include <string.h>

#include "data/internal.h"
#include "strata/base.h"
#include "strata/data.h"

/* A stream's position: sequence |next| is made next. A document that was
 * drawn but not (wholly) placed yet starts sequence |next| at pair |p_off|. */
struct st__data_cursor {
  uint64_t next;
  uint64_t draws;  /* k: the stream's draws so far */
  uint64_t* drawn; /* c_s per source */
  int n_src;
  bool pending;
  int p_src;
  uint64_t p_doc; /* the document's index in its token file */
  uint64_t p_off; /* pairs of it already placed */
};

st__data_cursor* st__data_cursor_new(const st_dataset* ds) {
  st__data_cursor* c = st_xcalloc(1, sizeof(*c));
  c->n_src = ds->n_src;
  c->drawn = st_xcalloc((size_t)ds->n_src, sizeof(uint64_t));
  return c;
}

void st__data_cursor_free(st__data_cursor* c) {
  if (!c) return;
  free(c->drawn);
  free(c);
}

static void st__cursor_reset(st__data_cursor* c) {
  c->next = c->draws = 0;
  memset(c->drawn, 0, (size_t)c->n_src * sizeof(uint64_t));
  c->pending = false;
}

/* Documents of |stream|'s split of source |s|: the first index (in the
 * token file) and how many. */
static void st__split_docs(const st__data_source* src, int stream, uint64_t* first, uint64_t* n) {
  *first = stream == ST_STREAM_TRAIN ? 0 : src->n_train_docs;
  *n = stream == ST_STREAM_TRAIN ? src->n_train_docs : src->n_docs - src->n_train_docs;
}

/* (input, target) pairs of document |g|: its tokens less one. */
static uint64_t st__doc_pairs(const st__data_source* src, uint64_t g) {
  uint64_t end = g + 1 < src->n_docs ? src->docs[g + 1] : src->count;
  uint64_t len = end - src->docs[g];
  return len >= 2 ? len - 1 : 0;
}

/* Draw k of the stream: a source by weight, then a document of it. */
static void st__draw(const st_dataset* ds, int stream, st__data_cursor* c, int* out_src, uint64_t* out_doc) {
  const uint64_t base = st__data_splitmix64(ds->seed ^ ((uint64_t)stream << 32));
  const double u = (double)(st__data_splitmix64(st__data_splitmix64(base + 1) ^ c->draws) >> 11) * 0x1p-53;
  int s = ds->n_src - 1;
  for (int i = 0; i < ds->n_src; ++i)
    if (u < ds->cum[i]) {
      s = i;
      break;
    }
  const uint64_t draw = c->drawn[s]++;
  c->draws++;
  uint64_t first = 0, n = 0;
  st__split_docs(&ds->src[s], stream, &first, &n);
  *out_src = s;
  *out_doc = first + st__data_splitmix64(st__data_splitmix64(base + 2 + (uint64_t)s) ^ draw) % n;
}

/* The row being made: NULL arrays when a sequence is only skipped. */
typedef struct st__row {
  int32_t* in;
  int32_t* tg;
  float* w;
  int32_t* pos;
} st__row;

/* Places |len| pairs of document |g| of source |s| from pair |off| at
 * slot |at|: a segment, positions from 0. Pair i (target token i + 1)
 * weighs 0 when that target lies in the document's prompt. */
static void st__place(const st_dataset* ds, const st__row* r, int s, uint64_t g, uint64_t off, int64_t at, int64_t len) {
  if (!r->in) return;
  const uint16_t* t = ds->src[s].tokens + ds->src[s].docs[g] + off;
  const uint64_t prompt = ds->src[s].prompts ? ds->src[s].prompts[g] : 0;
  for (int64_t j = 0; j < len; ++j) {
    r->in[at + j] = t[j];
    r->tg[at + j] = t[j + 1];
    r->w[at + j] = off + (uint64_t)j + 1 < prompt ? 0.0f : 1.0f;
    r->pos[at + j] = (int32_t)j;
  }
}

/* Padding from slot |at| to T: one more segment, weight 0. */
static void st__pad(const st__row* r, int64_t at, int64_t T) {
  if (!r->in) return;
  for (int64_t j = at; j < T; ++j) {
    r->in[j] = r->tg[j] = 0;
    r->w[j] = 0.0f;
    r->pos[j] = (int32_t)(j - at);
  }
}

/* Makes sequence c->next of |stream| into |r| and advances the cursor. */
static void st__make_sequence(const st_dataset* ds, int stream, st__data_cursor* c, const st__row* r) {
  const int64_t T = ds->seq_len;
  const bool pack = ds->packing == ST_DATA_PACKING_PACK;
  int64_t p = 0;
  if (c->pending) {
    /* The rest of a long document, or a whole one that did not fit. */
    const uint64_t left = st__doc_pairs(&ds->src[c->p_src], c->p_doc) - c->p_off;
    const int64_t len = left > (uint64_t)T ? T : (int64_t)left;
    st__place(ds, r, c->p_src, c->p_doc, c->p_off, 0, len);
    c->p_off += (uint64_t)len;
    c->pending = c->p_off < st__doc_pairs(&ds->src[c->p_src], c->p_doc);
    p = len;
  }
  while (p < T && (pack || p == 0)) {
    int s = 0;
    uint64_t g = 0;
    st__draw(ds, stream, c, &s, &g);
    const uint64_t n = st__doc_pairs(&ds->src[s], g);
    if (n == 0) continue; /* fewer than 2 tokens: nothing to learn */
    if (n <= (uint64_t)(T - p)) {
      st__place(ds, r, s, g, 0, p, (int64_t)n);
      p += (int64_t)n;
      continue;
    }
    if (!pack || n > (uint64_t)T) {
      /* Longer than the room (none) or than T (pack): fill the rest, the
       * remainder starts the next sequence. */
      st__place(ds, r, s, g, 0, p, T - p);
      c->pending = true;
      c->p_src = s;
      c->p_doc = g;
      c->p_off = (uint64_t)(T - p);
      p = T;
      break;
    }
    /* pack: a whole document that does not fit starts the next sequence. */
    c->pending = true;
    c->p_src = s;
    c->p_doc = g;
    c->p_off = 0;
    break;
  }
  st__pad(r, p, T);
  c->next++;
}

/* Moves |stream|'s cursor to sequence |index| (from 0 when it is past). */
static st__data_cursor* st__seek(const st_dataset* ds, int stream, uint64_t index) {
  st__data_cursor* c = ds->cursor[stream == ST_STREAM_TRAIN ? 0 : 1];
  if (index < c->next) st__cursor_reset(c);
  const st__row skip = {0};
  while (c->next < index) st__make_sequence(ds, stream, c, &skip);
  return c;
}

void st__data_fill_docs(const st_dataset* ds, int stream, uint64_t first, int64_t count, int32_t* inputs,
                        int32_t* targets, float* mask, int32_t* positions) {
  const int64_t T = ds->seq_len;
  st__data_cursor* c = st__seek(ds, stream, first);
  /* Optional outputs go to a scratch row. */
  float* w_row = mask ? NULL : st_xmalloc((size_t)T * sizeof(float));
  int32_t* pos_row = positions ? NULL : st_xmalloc((size_t)T * sizeof(int32_t));
  for (int64_t i = 0; i < count; ++i) {
    const st__row r = {inputs + i * T, targets + i * T, mask ? mask + i * T : w_row,
                       positions ? positions + i * T : pos_row};
    st__make_sequence(ds, stream, c, &r);
  }
  free(w_row);
  free(pos_row);
}

const uint64_t* st__data_drawn_at(const st_dataset* ds, int stream, uint64_t index) {
  return st__seek(ds, stream, index)->drawn;
}
