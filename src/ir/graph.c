/* graph.c — @main's dataflow graph (st_ir_main_graph, include/strata/ir.h):
 * one node per argument and op, one edge per use, from what reader.c reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir_internal.h"
#include "strata/base.h"
#include "strata/ir.h"

/* Value name -> node index, open addressing over pointers into the text. */
typedef struct st__vmap {
  const char** p;
  uint32_t* n;
  int* node;
  size_t cap, count;
} st__vmap;

static int st__vmap_get(const st__vmap* m, const char* s, size_t n) {
  if (!m->cap) return -1;
  for (size_t i = st__ir_hash(s, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (!m->p[i]) return -1;
    if (m->n[i] == n && !memcmp(m->p[i], s, n)) return m->node[i];
  }
}

static void st__vmap_put(st__vmap* m, const char* s, size_t n, int node) {
  if (2 * (m->count + 1) > m->cap) {
    st__vmap old = *m;
    m->cap = old.cap ? old.cap * 2 : 256;
    m->p = st_xcalloc(m->cap, sizeof(*m->p));
    m->n = st_xcalloc(m->cap, sizeof(*m->n));
    m->node = st_xcalloc(m->cap, sizeof(*m->node));
    m->count = 0;
    for (size_t i = 0; i < old.cap; ++i)
      if (old.p[i]) st__vmap_put(m, old.p[i], old.n[i], old.node[i]);
    free(old.p);
    free(old.n);
    free(old.node);
  }
  size_t i = st__ir_hash(s, n) & (m->cap - 1);
  while (m->p[i] && !(m->n[i] == n && !memcmp(m->p[i], s, n))) i = (i + 1) & (m->cap - 1);
  if (!m->p[i]) m->count++;
  m->p[i] = s;
  m->n[i] = (uint32_t)n;
  m->node[i] = node;
}

static int st__line_of(const st__ir_ctx* c, const char* at, const char** last, int* last_line) {
  for (const char* p = *last; p < at && p < c->end; ++p)
    if (*p == '\n') ++*last_line;
  *last = at > *last ? at : *last;
  return *last_line;
}

/* The first type of the list at |p| (after "->" or ':'), cut into |out|. */
static void st__first_type(const char* p, const char* e, char* out, size_t cap) {
  p = st_ir_skip_ws(p, e);
  if (p < e && *p == '(') p = st_ir_skip_ws(p + 1, e);
  const char* q = p;
  int depth = 0;
  while (q < e && *q != '\n') {
    if (*q == '<' || *q == '(') ++depth;
    if ((*q == '>' || *q == ')') && depth-- == 0) break;
    if (*q == ',' && depth == 0) break;
    if (*q == '{' && depth == 0) break;
    ++q;
  }
  while (q > p && (q[-1] == ' ' || q[-1] == '\t')) --q;
  snprintf(out, cap, "%.*s", (int)(q - p), p);
}

static int st__graph_node(st__ir_ctx* c, st_ir_graph* g, int* cap) {
  if (g->n_nodes >= ST_IR_MAX_GRAPH) {
    st__ir_fail(c, NULL, "more than 65536 ops in @main");
    return -1;
  }
  if (g->n_nodes == *cap) {
    *cap = *cap ? *cap * 2 : 64;
    g->nodes = st_xrealloc(g->nodes, (size_t)*cap * sizeof(*g->nodes));
  }
  memset(&g->nodes[g->n_nodes], 0, sizeof(g->nodes[0]));
  return g->n_nodes++;
}

st_status st_ir_main_graph(const char* text, size_t size, const char* name, st_ir_graph* out) {
  memset(out, 0, sizeof(*out));
  if (!name) name = "<program>";
  if (!text || size == 0) return st_status_make(ST_CODE_RUNTIME, "%s: empty StableHLO program", name);
  if (size > ST_IR_MAX_TEXT)
    return st_status_make(ST_CODE_RUNTIME, "%s: %zu bytes of program text, more than the limit %zu", name, size,
                          ST_IR_MAX_TEXT);
  st_ir_stats scratch;
  memset(&scratch, 0, sizeof(scratch));
  st__ir_ctx c = {.prog = name, .text = text, .end = text + size, .s = &scratch};
  st__ir_read_funcs(&c);
  const st__ir_func* m = c.err ? NULL : st__ir_lookup(&c, "main", 4);
  if (!c.err && !m) st__ir_fail(&c, NULL, "no func.func @main");
  st__vmap vals = {0};
  int ncap = 0, ecap = 0;
  const char* last = text;
  int last_line = 1;
  if (!c.err) { /* the arguments */
    const char* p = m->sig_b + 1;
    const char* close = st_ir_scan_to(p, m->sig_e, ')');
    while (!c.err && p < close) {
      p = st_ir_skip_ws(p, close);
      if (p >= close) break;
      const char* item = st_ir_scan_to(p, close, ',');
      size_t n = st__ir_name_at(p, item);
      int k = st__graph_node(&c, out, &ncap);
      if (k < 0) break;
      st_ir_node* nd = &out->nodes[k];
      snprintf(nd->op, sizeof(nd->op), "arg");
      snprintf(nd->value, sizeof(nd->value), "%.*s", (int)n, p);
      const char* colon = st_ir_find(p, item, ":");
      if (colon) st__first_type(colon + 1, item, nd->type, sizeof(nd->type));
      nd->line = st__line_of(&c, p, &last, &last_line);
      if (n) st__vmap_put(&vals, p, n, k);
      if (item >= close) break;
      p = item + 1;
    }
  }
  const char* p = c.err ? NULL : m->body_b;
  while (!c.err) {
    p = st__ir_skip_trivia(p, m->body_e);
    if (p >= m->body_e) break;
    st__ir_op op;
    if (!st__ir_read_op(&c, p, m->body_e, &op)) break;
    if (op.e <= p) {
      st__ir_fail(&c, p, "no progress");
      break;
    }
    int k = st__graph_node(&c, out, &ncap);
    if (k < 0) break;
    st_ir_node* nd = &out->nodes[k];
    const char* s = st__ir_short(op.name);
    snprintf(nd->op, sizeof(nd->op), "%.63s", st__ir_is_return(op.name) ? "return" : s);
    nd->line = st__line_of(&c, op.b, &last, &last_line);
    nd->collective = st__ir_is_collective(s);
    nd->custom_call = !strcmp(s, "custom_call");
    const char* uses = op.b;
    if (*op.b == '%') {
      size_t n0 = st__ir_name_at(op.b, op.e);
      snprintf(nd->value, sizeof(nd->value), "%.*s", (int)n0, op.b);
      while (uses < op.e && *uses != '=') ++uses;
    }
    if (op.colon) {
      const char* se = op.e;
      for (int i = 0; i < op.n_regions; ++i)
        if (op.rb[i] > op.colon && op.rb[i] < se) se = op.rb[i];
      const char* arrow = st_ir_find(op.colon, se, "->");
      st__first_type(arrow ? arrow + 2 : op.colon + 1, se, nd->type, sizeof(nd->type));
    }
    int first_edge = out->n_edges;
    for (const char* q = uses; q < op.e && !c.err;) {
      size_t n = st__ir_name_at(q, op.e);
      if (!n) {
        ++q;
        continue;
      }
      int from = st__vmap_get(&vals, q, n);
      q += n;
      if (from < 0) continue;
      bool dup = false;
      for (int i = first_edge; i < out->n_edges && !dup; ++i) dup = out->edges[i].from == from;
      if (dup) continue;
      if (out->n_edges >= ST_IR_MAX_GRAPH) {
        st__ir_fail(&c, op.b, "more than 65536 dataflow edges in @main");
        break;
      }
      if (out->n_edges == ecap) {
        ecap = ecap ? ecap * 2 : 64;
        out->edges = st_xrealloc(out->edges, (size_t)ecap * sizeof(*out->edges));
      }
      out->edges[out->n_edges++] = (st_ir_edge){from, k};
    }
    /* Its results ("%a, %b =" or "%a:2 ="), after its uses. */
    for (const char* q = op.b; *op.b == '%' && q < uses;) {
      size_t n = st__ir_name_at(q, uses);
      if (n) {
        st__vmap_put(&vals, q, n, k);
        q += n;
      } else {
        ++q;
      }
    }
    p = op.e;
  }
  free(vals.p);
  free(vals.n);
  free(vals.node);
  free(c.funcs);
  st_ir_stats_free(&scratch);
  if (c.err) {
    st_ir_graph_free(out);
    return c.err;
  }
  return ST_OK;
}

void st_ir_graph_free(st_ir_graph* g) {
  if (!g) return;
  free(g->nodes);
  free(g->edges);
  memset(g, 0, sizeof(*g));
}
