/* cost.c — the cost pass over a StableHLO module (include/strata/ir.h,
 * docs/analysis.md): FLOPs, bytes, collectives, custom calls and hazards.
 * Two walks over what reader.c reads: a static one over every function
 * (op counts, f64 and dynamic shapes), and a cost one from @main that
 * follows calls and loops with a multiplier. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir_internal.h"
#include "strata/base.h"
#include "strata/ir.h"

#define ST__MAX_ITER_ARGS 256

typedef struct st__cost {
  double dot, conv, elementwise, reduce, other, transc, bytes, ew_elems, red_elems;
} st__cost;

enum { ST__STATIC, ST__COST, ST__REGION /* a reducer region: FLOPs only */ };

/* ---------------------------------------------------------- attributes */

/* Reads "[a, b, c]" at |p| into |v| (up to |max|); the count, -1 if not a list. */
static int st__int_list(const char* p, const char* e, int64_t* v, int max) {
  p = st_ir_skip_ws(p, e);
  if (p >= e || *p != '[') return -1;
  ++p;
  int n = 0;
  for (;;) {
    p = st_ir_skip_ws(p, e);
    if (p < e && *p == ']') return n;
    int64_t x = 0;
    const char* d = p;
    while (p < e && *p >= '0' && *p <= '9' && x < ((int64_t)1 << 40)) x = x * 10 + (*p++ - '0');
    if (p == d || n >= max) return -1;
    v[n++] = x;
    p = st_ir_skip_ws(p, e);
    if (p < e && *p == ',') ++p;
    else if (p < e && *p == ']') return n;
    else return -1;
  }
}

/* The size the dot contracts: the product of lhs's contracting dims. */
static double st__dot_contracted(const st__ir_op* op, const st__ir_sig* sig) {
  if (sig->n_in < 1) return 0;
  const st_ir_type* lhs = &sig->in[0];
  int64_t idx[ST_IR_MAX_RANK];
  int n = -1;
  const char* a = st_ir_find(op->after_name, op->colon, "lhs_contracting_dimensions = ");
  if (a) n = st__int_list(a + strlen("lhs_contracting_dimensions = "), op->colon, idx, ST_IR_MAX_RANK);
  if (!a && (a = st_ir_find(op->after_name, op->colon, "contracting_dims = ")))
    n = st__int_list(a + strlen("contracting_dims = "), op->colon, idx, ST_IR_MAX_RANK);
  if (!a && !strcmp(st__ir_short(op->name), "dot") && lhs->rank >= 1) {
    idx[0] = lhs->rank - 1;
    n = 1;
  }
  if (n < 0) return 0;
  double k = 1;
  for (int i = 0; i < n; ++i) {
    if (idx[i] >= lhs->rank) return 0;
    if (lhs->dims[idx[i]] > 0) k *= (double)lhs->dims[idx[i]];
  }
  return k;
}

/* A convolution's multiply-adds per output element: the kernel's elements
 * over its output-feature dimension ('o' in dim_numbers' kernel part). */
static double st__conv_per_output(const st__ir_op* op, const st__ir_sig* sig) {
  if (sig->n_in < 2) return 0;
  const st_ir_type* k = &sig->in[1];
  int o = k->rank - 1;
  const char* dn = st_ir_find(op->after_name, op->colon, "dim_numbers = ");
  const char* x = dn ? st_ir_find(dn, op->colon, "]x[") : NULL;
  if (x) {
    int i = 0;
    for (const char* p = x + 3; p < op->colon && *p != ']'; ++p) {
      if (*p == ',') ++i;
      if (*p == 'o') o = i;
    }
  }
  if (o < 0 || o >= k->rank || k->dims[o] <= 0) return 0;
  return st_ir_type_elements(k) / (double)k->dims[o];
}

/* "axes=data,fsdp" from replica_group_mesh_axes, or the replica_groups /
 * source_target_pairs text, cut to fit. */
static void st__cost_groups(const st__ir_op* op, char* out, size_t cap) {
  out[0] = '\0';
  const char* e = op->colon ? op->colon : op->e;
  const char* m = st_ir_find(op->after_name, e, "replica_group_mesh_axes");
  if (m) {
    const char* end = st_ir_scan_to(m, e, '>');
    size_t w = (size_t)snprintf(out, cap, "axes=");
    for (const char* p = m; p < end && w + 1 < cap;) {
      const char* q = st_ir_find(p, end, "name = \"");
      if (!q) break;
      q += 8;
      const char* z = q;
      while (z < end && *z != '"') ++z;
      size_t len = (size_t)(z - q);
      if (w + len + 2 >= cap) break;
      if (out[w - 1] != '=') out[w++] = ',';
      memcpy(out + w, q, len);
      w += len;
      out[w] = '\0';
      p = z;
    }
    return;
  }
  const char* key = "replica_groups = ";
  const char* g = st_ir_find(op->after_name, e, key);
  if (!g) g = st_ir_find(op->after_name, e, (key = "source_target_pairs = "));
  if (!g) return;
  const char* v = g + strlen(key);
  if (st__ir_starts(v, e, "dense<")) v += 6;
  const char* end = st_ir_scan_to(v, e, ',');
  const char* gt = st_ir_scan_to(v, e, '>');
  if (gt < end) end = gt;
  size_t len = (size_t)(end - v);
  const char* label = key[0] == 'r' ? "groups=" : "pairs=";
  snprintf(out, cap, "%s%.*s", label, (int)(len > cap ? cap : len), v);
}

static void st__custom_target(const st__ir_op* op, char* out, size_t cap) {
  out[0] = '\0';
  const char* e = op->colon ? op->colon : op->e;
  const char* p = st_ir_skip_ws(op->after_name, e);
  const char* t = NULL;
  if (p < e && *p == '@') {
    t = p + 1;
  } else if ((p = st_ir_find(op->after_name, e, "call_target_name = \""))) {
    t = p + strlen("call_target_name = \"");
  }
  if (!t) return;
  const char* z = t;
  while (z < e && *z != '"' && *z != '(' && *z != ' ' && *z != '\n') ++z;
  snprintf(out, cap, "%.*s", (int)((size_t)(z - t) < cap ? (size_t)(z - t) : cap - 1), t);
}

/* ------------------------------------------------------ record tables */

static void st__add_collective(st__ir_ctx* c, const char* kind, const char* groups, double count, double bytes) {
  st_ir_stats* s = c->s;
  for (int i = 0; i < s->n_collectives; ++i)
    if (!strcmp(s->collectives[i].kind, kind) && !strcmp(s->collectives[i].groups, groups)) {
      s->collectives[i].count += count;
      s->collectives[i].bytes += bytes;
      return;
    }
  if (s->n_collectives >= ST_IR_MAX_DISTINCT) {
    st__ir_fail(c, NULL, "more than 256 distinct collectives");
    return;
  }
  s->collectives = st_xrealloc(s->collectives, (size_t)(s->n_collectives + 1) * sizeof(*s->collectives));
  st_ir_collective* r = &s->collectives[s->n_collectives++];
  memset(r, 0, sizeof(*r));
  snprintf(r->kind, sizeof(r->kind), "%.31s", kind);
  snprintf(r->groups, sizeof(r->groups), "%.127s", groups);
  r->count = count;
  r->bytes = bytes;
}

static void st__add_custom(st__ir_ctx* c, const char* target, double count) {
  st_ir_stats* s = c->s;
  for (int i = 0; i < s->n_custom_calls; ++i)
    if (!strcmp(s->custom_calls[i].target, target)) {
      s->custom_calls[i].count += count;
      return;
    }
  if (s->n_custom_calls >= ST_IR_MAX_DISTINCT) {
    st__ir_fail(c, NULL, "more than 256 distinct custom-call targets");
    return;
  }
  s->custom_calls = st_xrealloc(s->custom_calls, (size_t)(s->n_custom_calls + 1) * sizeof(*s->custom_calls));
  st_ir_custom_call* r = &s->custom_calls[s->n_custom_calls++];
  memset(r, 0, sizeof(*r));
  snprintf(r->target, sizeof(r->target), "%.63s", target);
  r->count = count;
}

/* ------------------------------------------------------- while loops */

static bool st__tok_eq(const char* p, const char* e, const char* name, size_t n) {
  return (size_t)(e - p) >= n && !memcmp(p, name, n) && (p + n == e || !st__ir_ident(p[n]));
}

/* Reads "%name" at |p|: its length (0 if none). */
static size_t st__value(const char* p, const char* e) {
  if (p >= e || *p != '%') return 0;
  const char* q = p + 1;
  while (q < e && (st__ir_ident(*q) || *q == '#')) ++q;
  return (size_t)(q - p);
}

/* Where "%name = " is defined in [b, e): the text after "= ", or NULL. */
static const char* st__def(const char* b, const char* e, const char* name, size_t n) {
  for (const char* p = b; p < e;) {
    const char* q = st_ir_find(p, e, "%");
    if (!q) return NULL;
    if ((q == b || q[-1] == ' ' || q[-1] == '\n' || q[-1] == '\t') && st__tok_eq(q, e, name, n)) {
      const char* r = q + n;
      if (st__ir_starts(r, e, " = ")) return r + 3;
    }
    p = q + 1;
  }
  return NULL;
}

/* An integer splat constant "stablehlo.constant dense<N>". */
static bool st__const_int(const char* p, const char* e, int64_t* v) {
  if (!p || !st__ir_starts(p, e, "stablehlo.constant dense<")) return false;
  p += strlen("stablehlo.constant dense<");
  bool neg = false;
  if (p < e && *p == '-') {
    neg = true;
    ++p;
  }
  int64_t x = 0;
  const char* d = p;
  while (p < e && *p >= '0' && *p <= '9' && x < ((int64_t)1 << 50)) x = x * 10 + (*p++ - '0');
  if (p == d || p >= e || *p != '>') return false;
  *v = neg ? -x : x;
  return true;
}

/* The static trip count of a `while` written like JAX's fori_loop: the
 * condition compares an iteration argument (initialised by a constant)
 * LT/LE a constant, and the body returns that argument plus 1. -1 when
 * not recognised. |scope_b| is where the enclosing region starts. */
static int64_t st__trip_count(const st__ir_op* op, const char* scope_b) {
  if (op->n_regions < 2) return -1;
  const char* e = op->colon ? op->colon : op->e;
  const char* h = st_ir_skip_ws(op->after_name, e);
  if (h >= e || *h != '(') return -1;
  const char* he = st_ir_scan_to(h + 1, e, ')');
  const char* cb = op->rb[0], *ce = op->re[0], *bb = op->rb[1], *be = op->re[1];
  const char* cmp = st_ir_find(cb, ce, "stablehlo.compare ");
  if (!cmp) return -1;
  const char* p = st_ir_skip_ws(cmp + strlen("stablehlo.compare "), ce);
  bool le = st__ir_starts(p, ce, "LE,");
  if (!le && !st__ir_starts(p, ce, "LT,")) return -1;
  p = st_ir_skip_ws(p + 3, ce);
  size_t na = st__value(p, ce);
  if (!na) return -1;
  const char* a = p;
  p = st_ir_skip_ws(p + na, ce);
  if (p >= ce || *p != ',') return -1;
  p = st_ir_skip_ws(p + 1, ce);
  size_t nb = st__value(p, ce);
  int64_t limit;
  if (!nb || !st__const_int(st__def(cb, ce, p, nb), ce, &limit)) return -1;
  /* Which iteration argument |a| is, and its initial value. */
  int pos = 0;
  int64_t init = 0;
  bool found = false;
  for (const char* q = h + 1; q < he && pos < ST__MAX_ITER_ARGS;) {
    q = st_ir_skip_ws(q, he);
    const char* item = st_ir_scan_to(q, he, ',');
    size_t ni = st__value(q, item);
    if (ni == na && !memcmp(q, a, na)) {
      const char* eq = st_ir_find(q, item, "= ");
      if (!eq) return -1;
      const char* iv = st_ir_skip_ws(eq + 2, item);
      size_t nv = st__value(iv, item);
      if (!nv || !st__const_int(st__def(scope_b, op->b, iv, nv), op->b, &init)) return -1;
      found = true;
      break;
    }
    ++pos;
    if (item >= he) break;
    q = item + 1;
  }
  if (!found) return -1;
  /* The body's returned value at |pos| must be "add %a, %one". */
  const char* ret = NULL;
  for (const char* q = bb; (q = st_ir_find(q, be, "stablehlo.return ")); ++q) ret = q;
  if (!ret) return -1;
  const char* r = ret + strlen("stablehlo.return ");
  const char* rl = r;
  while (rl < be && *rl != '\n' && *rl != ':') ++rl;
  for (int i = 0; i < pos; ++i) {
    const char* comma = st_ir_scan_to(r, rl, ',');
    if (comma >= rl) return -1;
    r = comma + 1;
  }
  r = st_ir_skip_ws(r, rl);
  size_t nr = st__value(r, rl);
  const char* def = nr ? st__def(bb, be, r, nr) : NULL;
  if (!def || !st__ir_starts(def, be, "stablehlo.add ")) return -1;
  const char* x = st_ir_skip_ws(def + strlen("stablehlo.add "), be);
  const char* other = NULL;
  size_t nx = st__value(x, be);
  const char* y = st_ir_skip_ws(x + nx, be);
  if (y >= be || *y != ',') return -1;
  y = st_ir_skip_ws(y + 1, be);
  size_t ny = st__value(y, be);
  size_t no = 0;
  if (nx == na && !memcmp(x, a, na)) other = y, no = ny;
  else if (ny == na && !memcmp(y, a, na)) other = x, no = nx;
  int64_t step;
  if (!other || !no || !st__const_int(st__def(bb, be, other, no), be, &step) || step != 1) return -1;
  int64_t trip = limit - init + (le ? 1 : 0);
  if (trip < 0) trip = 0;
  if (trip > ST_IR_MAX_TRIP) return -1;
  return trip;
}

static void st__cost_walk(st__ir_ctx* c, const char* p, const char* e, double mult, int depth, int mode, st__cost* acc);

static void st__count_static(st__ir_ctx* c, const char* s) {
  st_ir_op_counts* k = &c->s->ops;
  k->total++;
  if (!strcmp(s, "dot_general") || !strcmp(s, "dot")) k->dot++;
  else if (!strcmp(s, "convolution")) k->convolution++;
  else if (st__ir_is_elementwise(s) || st__ir_is_transc(s)) k->elementwise++;
  else if (!strcmp(s, "reduce") || !strcmp(s, "reduce_window")) k->reduce++;
  else if (!strcmp(s, "constant")) k->constant++;
  else if (st__ir_is_collective(s)) k->collective++;
  else if (!strcmp(s, "custom_call")) k->custom_call++;
  else if (!strcmp(s, "while")) k->while_loop++;
  else if (!strcmp(s, "call") || !strcmp(s, "func.call")) k->call++;
  else if (st__ir_is_movement(s)) k->data_movement++;
  else k->other++;
}

/* The FLOPs of a reducer region for one application (the simplified form
 * `applies stablehlo.add` is one op). */
static void st__region_unit(st__ir_ctx* c, const st__ir_op* op, int depth, double* flops, double* transc) {
  *flops = 0;
  *transc = 0;
  if (op->n_regions > 0) {
    st__cost sub = {0};
    st__cost_walk(c, op->rb[0], op->re[0], 1, depth + 1, ST__REGION, &sub);
    *flops = sub.dot + sub.conv + sub.elementwise + sub.reduce + sub.other;
    *transc = sub.transc;
    return;
  }
  const char* a = st_ir_find(op->after_name, op->colon ? op->colon : op->e, "applies ");
  if (!a) return;
  a = st_ir_skip_ws(a + 8, op->e);
  char fn[64];
  size_t n = 0;
  while (a + n < op->e && st__ir_ident(a[n]) && n + 1 < sizeof(fn)) {
    fn[n] = a[n];
    ++n;
  }
  fn[n] = '\0';
  if (st__ir_is_transc(st__ir_short(fn))) *transc = 1;
  else *flops = 1;
}

const char* st_ir_finding_kind_name(st_ir_finding_kind k) {
  switch (k) {
    case ST_IR_FIND_DYNAMIC_SHAPE: return "dynamic_shape";
    case ST_IR_FIND_HOST_CALLBACK: return "host_callback";
    case ST_IR_FIND_F64: return "f64";
    case ST_IR_FIND_CUSTOM_CALL: return "custom_call";
  }
  return "?";
}

static void st__find(st__ir_ctx* c, st_ir_finding_kind kind, const st__ir_op* op, const char* detail) {
  st_ir_stats* s = c->s;
  if (s->n_findings >= ST_IR_MAX_FINDINGS) {
    s->findings_dropped++;
    return;
  }
  if (!s->findings) s->findings = st_xcalloc(ST_IR_MAX_FINDINGS, sizeof(*s->findings));
  st_ir_finding* f = &s->findings[s->n_findings++];
  memset(f, 0, sizeof(*f));
  f->kind = kind;
  snprintf(f->op, sizeof(f->op), "%s", op->name);
  if (c->cur_func) snprintf(f->func, sizeof(f->func), "%.*s", (int)c->cur_func->name_len, c->cur_func->name);
  snprintf(f->detail, sizeof(f->detail), "%s", detail ? detail : "");
  f->line = 1; /* counted only for a finding: findings are rare */
  for (const char* p = c->text; p < op->b && p < c->end; ++p)
    if (*p == '\n') ++f->line;
}

/* Whether the op's own text (its regions left out: their ops are visited
 * themselves) holds |needle| in a type: "f64" as an element type, or a
 * '?' dimension. */
static bool st__op_text_has(const st__ir_op* op, bool f64) {
  const char* p = op->b;
  for (int r = 0; r <= op->n_regions; ++r) {
    const char* e = r < op->n_regions ? op->rb[r] : op->e;
    for (const char* q = p; q < e; ++q) {
      if (f64) {
        if (q + 3 <= e && !memcmp(q, "f64", 3) && q > op->b && (q[-1] == 'x' || q[-1] == '<') &&
            (q + 3 == e || !st__ir_ident(q[3])))
          return true;
      } else if (*q == '?' && q > op->b && (q[-1] == 'x' || q[-1] == '<') && q + 1 < e &&
                 (q[1] == 'x' || q[1] == '>')) {
        return true;
      }
    }
    if (r < op->n_regions) p = op->re[r] + 1;
  }
  return false;
}

/* The static pass over one op (mode ST__STATIC): op counts, the lint's
 * findings (dynamic shapes, f64, custom calls, host callbacks), every
 * callee checked to exist, and the op's regions, each once. */
static void st__op_static(st__ir_ctx* c, const st__ir_op* op, const char* s, int depth, st__cost* acc) {
  st__count_static(c, s);
  if (st__ir_is_dynamic(s)) st__find(c, ST_IR_FIND_DYNAMIC_SHAPE, op, s);
  else if (st__op_text_has(op, false)) st__find(c, ST_IR_FIND_DYNAMIC_SHAPE, op, "");
  if (st__op_text_has(op, true)) st__find(c, ST_IR_FIND_F64, op, "");
  if (!strcmp(s, "custom_call")) {
    char t[64];
    st__custom_target(op, t, sizeof(t));
    st__find(c, strstr(t, "callback") ? ST_IR_FIND_HOST_CALLBACK : ST_IR_FIND_CUSTOM_CALL, op, t);
  }
  if (!strcmp(s, "call") || !strcmp(op->name, "func.call")) { /* every callee exists, live or not */
    const char* at = st_ir_skip_ws(op->after_name, op->e);
    const char* z = at < op->e && *at == '@' ? at + 1 : at;
    while (z < op->e && st__ir_ident(*z)) ++z;
    if (at >= op->e || *at != '@' || !st__ir_lookup(c, at + 1, (size_t)(z - at - 1))) {
      st__ir_fail(c, op->b, "a call to a function the module does not define");
      return;
    }
  }
  if (!strcmp(s, "while")) c->s->while_loops++;
  for (int i = 0; i < op->n_regions && !c->err; ++i)
    st__cost_walk(c, op->rb[i], op->re[i], 1, depth + 1, ST__STATIC, acc);
}

static void st__op_cost(st__ir_ctx* c, const st__ir_op* op, const char* scope_b, double mult, int depth, int mode,
                        st__cost* acc) {
  const char* s = st__ir_short(op->name);
  st__ir_sig sig;
  st__ir_parse_sig(c, op->colon ? op->colon + 1 : op->e, op->e, &sig);
  if (op->colon) {
    /* Regions after the signature (a pretty while) are not types. */
    const char* se = op->e;
    for (int i = 0; i < op->n_regions; ++i)
      if (op->rb[i] > op->colon && op->rb[i] < se) se = op->rb[i];
    if (se != op->e) st__ir_parse_sig(c, op->colon + 1, se, &sig);
  }
  if (st__ir_is_dynamic(s)) c->s->dynamic_shapes = true;
  if (mode == ST__STATIC) {
    st__op_static(c, op, s, depth, acc);
    return;
  }
  bool bytes = mode == ST__COST;
  double out_el = sig.n_out > 0 ? st_ir_type_elements(&sig.out[sig.n_out < ST__IR_SIG_KEEP ? sig.n_out - 1 : 0]) : 0;
  /* Operand bytes of the pretty one-type form: each operand has the result's type. */
  double in_b = sig.in_bytes, out_b = sig.out_bytes;
  if (!sig.functional && sig.n_out > 0 && sig.n_out <= ST__IR_SIG_KEEP) {
    const st_ir_type* r = &sig.out[sig.n_out - 1];
    out_b = st_ir_type_bytes(r);
    in_b = (double)op->n_operands * out_b;
    if (sig.n_out == 2 && !strcmp(s, "select")) in_b = st_ir_type_bytes(&sig.out[0]) + 2 * out_b;
    if (strcmp(s, "select") && sig.n_out > 1) { /* several results (a while): all of them */
      out_b = sig.out_bytes;
      in_b = 0;
    }
  }
  if (!strcmp(s, "dot_general") || !strcmp(s, "dot")) {
    acc->dot += mult * 2 * (sig.n_out ? st_ir_type_elements(&sig.out[0]) : 0) * st__dot_contracted(op, &sig);
  } else if (!strcmp(s, "convolution")) {
    acc->conv += mult * 2 * (sig.n_out ? st_ir_type_elements(&sig.out[0]) : 0) * st__conv_per_output(op, &sig);
  } else if (st__ir_is_transc(s)) {
    acc->transc += mult * out_el;
    acc->ew_elems += mult * out_el;
  } else if (st__ir_is_elementwise(s)) {
    acc->elementwise += mult * out_el;
    acc->ew_elems += mult * out_el;
  } else if (!strcmp(s, "reduce") || !strcmp(s, "reduce_window") || !strcmp(s, "scatter") ||
             !strcmp(s, "all_reduce") || !strcmp(s, "reduce_scatter")) {
    double f, t;
    st__region_unit(c, op, depth, &f, &t);
    double in_el = sig.n_in ? st_ir_type_elements(&sig.in[0]) : 0;
    double o_el = sig.n_out ? st_ir_type_elements(&sig.out[0]) : 0;
    double times = 0;
    if (!strcmp(s, "reduce")) times = in_el > o_el ? in_el - o_el : 0;
    else if (!strcmp(s, "scatter")) times = sig.n_in >= 3 ? st_ir_type_elements(&sig.in[sig.n_in < ST__IR_SIG_KEEP ? sig.n_in - 1 : 2]) : 0;
    else times = o_el;
    acc->reduce += mult * f * times;
    acc->transc += mult * t * times;
    if (!strcmp(s, "reduce")) acc->red_elems += mult * in_el;
  } else if (!strcmp(s, "sort")) { /* as XLA: n log2 n comparisons */
    double n = sig.n_in ? st_ir_type_elements(&sig.in[0]) : 0;
    double lg = 0;
    while (lg < 64 && pow(2, lg) < n) lg += 1;
    acc->other += mult * n * lg;
  }
  if (st__ir_is_collective(s) && mode == ST__COST) {
    char g[128];
    st__cost_groups(op, g, sizeof(g));
    st__add_collective(c, s, g, mult, mult * sig.in_bytes);
  }
  if (!strcmp(s, "custom_call") && mode == ST__COST) {
    char t[64];
    st__custom_target(op, t, sizeof(t));
    st__add_custom(c, t[0] ? t : "?", mult);
    if (strstr(t, "callback")) c->s->host_callbacks += (int64_t)(mult < 1e15 ? mult : 1e15);
  }
  /* Bytes (XLA's unfused convention) and the regions of structured ops. */
  if (!strcmp(s, "constant") || st__ir_is_return(op->name) || !strcmp(s, "get_tuple_element") || !strcmp(s, "tuple")) {
    return;
  }
  if (!strcmp(s, "call") || !strcmp(op->name, "func.call")) {
    const char* at = st_ir_skip_ws(op->after_name, op->e);
    if (at >= op->e || *at != '@') {
      st__ir_fail(c, op->b, "a call without a @callee");
      return;
    }
    const char* z = at + 1;
    while (z < op->e && st__ir_ident(*z)) ++z;
    const st__ir_func* f = st__ir_lookup(c, at + 1, (size_t)(z - at - 1));
    if (!f) {
      st__ir_fail(c, at, "a call to a function the module does not define");
      return;
    }
    if (depth + 1 > ST_IR_MAX_DEPTH) {
      st__ir_fail(c, op->b, "calls nested deeper than 32 (recursion?)");
      return;
    }
    st__cost_walk(c, f->body_b, f->body_e, mult, depth + 1, mode, acc);
    return;
  }
  if (!strcmp(s, "while")) {
    int64_t trip = st__trip_count(op, scope_b);
    if (trip < 0) c->s->while_unknown_trip++;
    else if ((double)trip > c->s->max_trip) c->s->max_trip = (double)trip;
    double m = mult * (double)(trip < 0 ? 1 : trip);
    for (int i = 0; i < op->n_regions && !c->err; ++i) st__cost_walk(c, op->rb[i], op->re[i], m, depth + 1, mode, acc);
    return;
  }
  if (!strcmp(s, "case") || !strcmp(s, "if")) {
    /* As XLA: the most of each property over the branches. */
    st__cost most = {0};
    for (int i = 0; i < op->n_regions && !c->err; ++i) {
      st__cost b = {0};
      st__cost_walk(c, op->rb[i], op->re[i], mult, depth + 1, mode, &b);
      double* m = &most.dot;
      const double* v = &b.dot;
      for (size_t k = 0; k < sizeof(most) / sizeof(double); ++k)
        if (v[k] > m[k]) m[k] = v[k];
    }
    double* a = &acc->dot;
    const double* m = &most.dot;
    for (size_t k = 0; k < sizeof(most) / sizeof(double); ++k) a[k] += m[k];
    return;
  }
  if (!strncmp(op->name, "sdy.", 4)) { /* a manual computation's body is the program itself */
    for (int i = 0; i < op->n_regions && !c->err; ++i) st__cost_walk(c, op->rb[i], op->re[i], mult, depth + 1, mode, acc);
    return;
  }
  if (!bytes) return;
  double b;
  if (!strcmp(s, "slice") || !strcmp(s, "dynamic_slice")) b = 2 * out_b;
  else if (!strcmp(s, "gather")) b = 2 * out_b + (sig.n_in >= 2 ? st_ir_type_bytes(&sig.in[1]) : 0);
  else if (!strcmp(s, "scatter") && sig.n_in == 3) b = 3 * st_ir_type_bytes(&sig.in[2]) + st_ir_type_bytes(&sig.in[1]);
  else if (!strcmp(s, "dynamic_update_slice")) b = 2 * (sig.n_in >= 2 ? st_ir_type_bytes(&sig.in[1]) : 0);
  else if (!strcmp(s, "iota")) b = out_b;
  else b = in_b + out_b;
  acc->bytes += mult * b;
}

/* A set of SSA value names (pointers into the text), open addressing. */
typedef struct st__names {
  const char** p;
  uint32_t* n;
  size_t cap, count;
} st__names;


static bool st__names_has(const st__names* t, const char* s, size_t n) {
  if (!t->cap) return false;
  for (size_t i = st__ir_hash(s, n) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
    if (!t->p[i]) return false;
    if (t->n[i] == n && !memcmp(t->p[i], s, n)) return true;
  }
}

static void st__names_add(st__names* t, const char* s, size_t n) {
  if (st__names_has(t, s, n)) return;
  if ((t->count + 1) * 2 > t->cap) {
    st__names old = *t;
    t->cap = old.cap ? old.cap * 2 : 256;
    t->p = st_xcalloc(t->cap, sizeof(*t->p));
    t->n = st_xcalloc(t->cap, sizeof(*t->n));
    t->count = 0;
    for (size_t i = 0; i < old.cap; ++i)
      if (old.p[i]) st__names_add(t, old.p[i], old.n[i]);
    free(old.p);
    free(old.n);
  }
  size_t i = st__ir_hash(s, n) & (t->cap - 1);
  while (t->p[i]) i = (i + 1) & (t->cap - 1);
  t->p[i] = s;
  t->n[i] = (uint32_t)n;
  t->count++;
}

/* Whether the op's results are used by a later live op: XLA drops dead
 * code before it counts, so a dead dot (left by jax.vjp) costs nothing. */
static bool st__op_live(const st__ir_op* op, const st__names* used) {
  if (*op->b != '%') return true; /* no results: a terminator or an effect */
  const char* s = st__ir_short(op->name);
  if (!strcmp(s, "custom_call") || st__ir_is_collective(s)) return true;
  for (const char* p = op->b; p < op->e && *p != '=';) {
    size_t n = st__ir_name_at(p, op->e);
    if (n) {
      if (st__names_has(used, p, n)) return true;
      p += n;
    } else {
      ++p;
    }
  }
  return false;
}

static void st__mark_uses(const st__ir_op* op, st__names* used) {
  const char* p = op->b;
  if (*p == '%') /* skip the results */
    while (p < op->e && *p != '=') ++p;
  while (p < op->e) {
    size_t n = st__ir_name_at(p, op->e);
    if (n) {
      st__names_add(used, p, n);
      p += n;
    } else {
      ++p;
    }
  }
}

static void st__cost_walk(st__ir_ctx* c, const char* p, const char* e, double mult, int depth, int mode, st__cost* acc) {
  if (depth > ST_IR_MAX_DEPTH) {
    st__ir_fail(c, p, "regions nested deeper than 32");
    return;
  }
  const char* scope_b = p;
  st__ir_op* ops = NULL;
  size_t n = 0, cap = 0;
  while (!c->err) {
    p = st__ir_skip_trivia(p, e);
    if (p >= e) break;
    if (++c->visits > ST_IR_MAX_VISITS) {
      st__ir_fail(c, p, "more than 4194304 op visits (calls and loops re-walk their bodies)");
      break;
    }
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      ops = st_xrealloc(ops, cap * sizeof(*ops));
    }
    if (!st__ir_read_op(c, p, e, &ops[n])) break;
    if (ops[n].e <= p) {
      st__ir_fail(c, p, "no progress");
      break;
    }
    p = ops[n].e;
    ++n;
  }
  bool* live = st_xcalloc(n ? n : 1, sizeof(*live));
  if (!c->err) {
    st__names used = {0};
    for (size_t i = n; i-- > 0;) {
      live[i] = mode == ST__STATIC || st__op_live(&ops[i], &used);
      if (live[i]) st__mark_uses(&ops[i], &used);
    }
    free(used.p);
    free(used.n);
  }
  for (size_t i = 0; i < n && !c->err; ++i)
    if (live[i]) st__op_cost(c, &ops[i], scope_b, mult, depth, mode, acc);
  free(live);
  free(ops);
}

static void st__main_io(st__ir_ctx* c, const st__ir_func* m) {
  const char* p = m->sig_b + 1;
  const char* close = st_ir_scan_to(p, m->sig_e, ')');
  st_ir_stats* s = c->s;
  for (int guard = 0; guard < 1 << 20 && p < close; ++guard) {
    p = st_ir_skip_ws(p, close);
    if (p >= close) break;
    const char* item = st_ir_scan_to(p, close, ',');
    const char* colon = st_ir_find(p, item, ":");
    st_ir_type t;
    const char* after;
    if (colon && st_ir_parse_type(colon + 1, item, &t, &after)) {
      st__ir_note_type(c, &t);
      s->arg_bytes += st_ir_type_bytes(&t);
    }
    s->n_args++;
    if (item >= close) break;
    p = item + 1;
  }
  const char* r = st_ir_skip_ws(close + 1, m->sig_e);
  if (!st__ir_starts(r, m->sig_e, "->")) return;
  r = st_ir_skip_ws(r + 2, m->sig_e);
  st__ir_sig sig;
  memset(&sig, 0, sizeof(sig));
  if (r < m->sig_e && *r == '(') {
    st__ir_sig_list(c, r + 1, st_ir_scan_to(r + 1, m->sig_e, ')'), false, &sig);
  } else {
    st_ir_type t;
    const char* after;
    if (st_ir_parse_type(r, m->sig_e, &t, &after)) {
      st__ir_note_type(c, &t);
      sig.n_out = 1;
      sig.out_bytes = st_ir_type_bytes(&t);
    }
  }
  s->n_results = sig.n_out;
  s->result_bytes = sig.out_bytes;
}

st_status st_ir_analyze(const char* text, size_t size, const char* name, st_ir_stats* out) {
  memset(out, 0, sizeof(*out));
  if (!name) name = "<program>";
  if (!text || size == 0) return st_status_make(ST_CODE_RUNTIME, "%s: empty StableHLO program", name);
  if (size >= 4 && !memcmp(text, "ML\xEFR", 4))
    return st_status_make(ST_CODE_RUNTIME, "%s: MLIR bytecode, not text: strata analyze reads the text form", name);
  if (size > ST_IR_MAX_TEXT)
    return st_status_make(ST_CODE_RUNTIME, "%s: %zu bytes of program text, more than the limit %zu", name, size,
                          ST_IR_MAX_TEXT);
  st__ir_ctx c = {.prog = name, .text = text, .end = text + size, .s = out};
  st__ir_read_funcs(&c);
  const st__ir_func* m = c.err ? NULL : st__ir_lookup(&c, "main", 4);
  if (!c.err && !m) st__ir_fail(&c, NULL, "no func.func @main");
  st__cost static_cost = {0}, cost = {0};
  if (!c.err) {
    out->funcs = c.n_funcs;
    for (int i = 0; i < c.n_funcs && !c.err; ++i) {
      c.cur_func = &c.funcs[i];
      st__cost_walk(&c, c.funcs[i].body_b, c.funcs[i].body_e, 1, 0, ST__STATIC, &static_cost);
    }
  }
  if (!c.err) st__main_io(&c, m);
  if (!c.err) {
    c.visits = 0;
    st__cost_walk(&c, m->body_b, m->body_e, 1, 0, ST__COST, &cost);
  }
  free(c.funcs);
  if (c.err) {
    st_ir_stats_free(out);
    return c.err;
  }
  out->dot_flops = cost.dot;
  out->conv_flops = cost.conv;
  out->elementwise_flops = cost.elementwise;
  out->reduce_flops = cost.reduce;
  out->flops = cost.dot + cost.conv + cost.elementwise + cost.reduce + cost.other;
  out->transcendentals = cost.transc;
  out->elementwise_elements = cost.ew_elems;
  out->reduce_elements = cost.red_elems;
  out->bytes_accessed = cost.bytes;
  return ST_OK;
}

st_status st_ir_analyze_file(const char* path, st_ir_stats* out) {
  memset(out, 0, sizeof(*out));
  char* data = NULL;
  size_t size = 0;
  ST_RETURN(st_fs_read_file(path, &data, &size));
  st_status st = st_ir_analyze(data, size, path, out);
  free(data);
  return st;
}

void st_ir_stats_free(st_ir_stats* stats) {
  if (!stats) return;
  free(stats->collectives);
  free(stats->custom_calls);
  free(stats->findings);
  memset(stats, 0, sizeof(*stats));
}
