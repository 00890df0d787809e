/* reader.c — reads the functions and ops of a StableHLO module in MLIR
 * text, for the cost pass (cost.c) and the dataflow graph (graph.c).
 *
 * Printed MLIR puts one op on a line; an op continues past the line while
 * a bracket is open (a region's `{` ends its line, `({` opens a generic
 * op's regions), and the pretty `while` continues on the `cond {` line.
 * Each op is read as: results `%a, %b =` or `%a:2 =`, a name (bare or
 * "quoted"), operands and attributes, regions, and a trailing type
 * signature after the last top-level ':'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir_internal.h"
#include "strata/base.h"
#include "strata/ir.h"

void st__ir_fail(st__ir_ctx* c, const char* at, const char* what) {
  if (c->err) return;
  int line = 1;
  for (const char* p = c->text; at && p < at && p < c->end; ++p)
    if (*p == '\n') ++line;
  c->err = st_status_make(ST_CODE_RUNTIME, "%s:%d: cannot analyze the StableHLO program: %s", c->prog, line, what);
}

bool st__ir_ident(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' ||
         ch == '$' || ch == '-';
}

bool st__ir_starts(const char* p, const char* e, const char* word) {
  size_t n = strlen(word);
  return (size_t)(e - p) >= n && !memcmp(p, word, n);
}

/* ---------------------------------------------------------------- types */

void st__ir_note_type(st__ir_ctx* c, const st_ir_type* t) {
  if (t->dtype == ST_DTYPE_F64) c->s->uses_f64 = true;
  if (t->dynamic) c->s->dynamic_shapes = true;
}

/* One list item [p, e) holding a type (maybe with attributes after it). */
static void st__sig_item(st__ir_ctx* c, const char* p, const char* e, bool in, st__ir_sig* s) {
  st_ir_type t;
  const char* after;
  if (!st_ir_parse_type(p, e, &t, &after)) memset(&t, 0, sizeof(t)); /* a token, tuple, ...: 0 bytes */
  st__ir_note_type(c, &t);
  if (in) {
    if (s->n_in < ST__IR_SIG_KEEP) s->in[s->n_in] = t;
    s->n_in++;
    s->in_bytes += st_ir_type_bytes(&t);
  } else {
    if (s->n_out < ST__IR_SIG_KEEP) s->out[s->n_out] = t;
    s->n_out++;
    s->out_bytes += st_ir_type_bytes(&t);
  }
}

/* A comma-separated list [p, e) of types. */
void st__ir_sig_list(st__ir_ctx* c, const char* p, const char* e, bool in, st__ir_sig* s) {
  for (int guard = 0; guard < 1 << 20; ++guard) {
    p = st_ir_skip_ws(p, e);
    if (p >= e) return;
    const char* item = st_ir_scan_to(p, e, ',');
    if (item > p) st__sig_item(c, p, item, in, s);
    if (item >= e || *item != ',') return;
    p = item + 1;
  }
}

/* The signature after a top-level ':' up to |e| (regions excluded). */
void st__ir_parse_sig(st__ir_ctx* c, const char* p, const char* e, st__ir_sig* s) {
  memset(s, 0, sizeof(*s));
  p = st_ir_skip_ws(p, e);
  if (p < e && *p == '(') {
    const char* close = st_ir_scan_to(p + 1, e, ')');
    if (close >= e) return;
    const char* arrow = st_ir_skip_ws(close + 1, e);
    if (!st__ir_starts(arrow, e, "->")) {
      st__ir_sig_list(c, p, e, false, s); /* not a function type */
      return;
    }
    s->functional = true;
    st__ir_sig_list(c, p + 1, close, true, s);
    const char* r = st_ir_skip_ws(arrow + 2, e);
    if (r < e && *r == '(') {
      const char* rc = st_ir_scan_to(r + 1, e, ')');
      st__ir_sig_list(c, r + 1, rc, false, s);
    } else {
      st__ir_sig_list(c, r, e, false, s);
    }
    return;
  }
  st__ir_sig_list(c, p, e, false, s);
}

/* ------------------------------------------------------------------ ops */

/* Skips whitespace, `// comments` and block labels (`^bb0(...):`). */
const char* st__ir_skip_trivia(const char* p, const char* e) {
  for (;;) {
    p = st_ir_skip_ws(p, e);
    if (p + 1 < e && p[0] == '/' && p[1] == '/') {
      while (p < e && *p != '\n') ++p;
      continue;
    }
    if (p < e && *p == '^') {
      const char* colon = st_ir_scan_to(p, e, ':');
      while (p < colon && *p != '\n') ++p; /* a label without ':' ends at its line */
      p = colon < e && p == colon ? colon + 1 : p;
      continue;
    }
    return p;
  }
}

/* True when the line from |p| holds only whitespace (a region's '{'). */
static bool st__rest_of_line_blank(const char* p, const char* e) {
  for (; p < e && *p != '\n'; ++p)
    if (*p != ' ' && *p != '\t' && *p != '\r') return false;
  return true;
}

/* Reads the op at |p| (after trivia) within [p, e). False (c->err set) on
 * malformed text. */
bool st__ir_read_op(st__ir_ctx* c, const char* p, const char* e, st__ir_op* op) {
  memset(op, 0, sizeof(*op));
  op->b = p;
  if (*p == '%') { /* results */
    const char* q = p;
    while (q < e && *q != '=' && *q != '\n' && *q != '{' && *q != '(') ++q;
    if (q >= e || *q != '=') {
      st__ir_fail(c, p, "an op's results are not followed by '='");
      return false;
    }
    p = st_ir_skip_ws(q + 1, e);
  }
  const char* n = p;
  size_t len = 0;
  if (p < e && *p == '"') {
    const char* q = p + 1;
    while (q < e && *q != '"' && *q != '\n') ++q;
    if (q >= e || *q != '"') {
      st__ir_fail(c, p, "an unterminated op name");
      return false;
    }
    n = p + 1;
    len = (size_t)(q - n);
    p = q + 1;
  } else {
    while (p < e && st__ir_ident(*p)) ++p;
    len = (size_t)(p - n);
  }
  if (len == 0 || len >= sizeof(op->name)) {
    st__ir_fail(c, n, len ? "an op name longer than 63 bytes" : "expected an op");
    return false;
  }
  memcpy(op->name, n, len);
  op->name[len] = '\0';
  op->after_name = p;
  /* The op's extent: to the first newline outside brackets, regions read
   * whole; `cond`/`do`/`reducer` lines continue a pretty op. */
  int depth = 0;
  while (p < e) {
    char ch = *p;
    if (ch == '"') {
      ++p;
      while (p < e && *p != '"') p += (*p == '\\' && p + 1 < e) ? 2 : 1;
      if (p < e) ++p;
      continue;
    }
    if (ch == '-' && p + 1 < e && p[1] == '>') {
      p += 2;
      continue;
    }
    if (ch == '{' && st__rest_of_line_blank(p + 1, e)) {
      const char* close = st_ir_scan_to(p + 1, e, '}');
      if (close >= e) {
        st__ir_fail(c, p, "a region without its closing '}'");
        return false;
      }
      if (op->n_regions >= ST__IR_MAX_REGIONS) {
        st__ir_fail(c, p, "an op with more than 16 regions");
        return false;
      }
      op->rb[op->n_regions] = p + 1;
      op->re[op->n_regions] = close;
      op->n_regions++;
      p = close + 1;
      continue;
    }
    if (ch == '(' || ch == '[' || ch == '{' || ch == '<') ++depth;
    if ((ch == ')' || ch == ']' || ch == '}' || ch == '>') && depth > 0) --depth;
    if (depth == 0 && ch == ':') op->colon = p;
    if (ch == '%' && depth == 0 && !op->colon) op->n_operands++;
    if (ch == '\n' && depth == 0) {
      const char* nx = st_ir_skip_ws(p, e);
      if (st__ir_starts(nx, e, "cond ") || st__ir_starts(nx, e, "do ") || st__ir_starts(nx, e, "reducer")) {
        p = nx;
        continue;
      }
      break;
    }
    ++p;
  }
  op->e = p;
  return true;
}

uint64_t st__ir_hash(const char* s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

/* The name of the value at |p| ("%12" of "%12#3"), its length or 0. */
size_t st__ir_name_at(const char* p, const char* e) {
  if (p >= e || *p != '%') return 0;
  const char* q = p + 1;
  while (q < e && st__ir_ident(*q) && *q != '.' && *q != '-') ++q;
  return (size_t)(q - p);
}

const st__ir_func* st__ir_lookup(const st__ir_ctx* c, const char* name, size_t n) {
  for (int i = 0; i < c->n_funcs; ++i)
    if (c->funcs[i].name_len == n && !memcmp(c->funcs[i].name, name, n)) return &c->funcs[i];
  return NULL;
}

/* ------------------------------------------------------------- module */

void st__ir_read_funcs(st__ir_ctx* c) {
  const char* p = c->text;
  const char* e = c->end;
  while (!c->err) {
    const char* f = st_ir_find(p, e, "func.func ");
    if (!f) return;
    const char* at = f + 10;
    while (at < e && *at != '@' && *at != '(' && *at != '\n') ++at;
    if (at >= e || *at != '@') {
      st__ir_fail(c, f, "a func.func without a @name");
      return;
    }
    const char* nb = at + 1;
    const char* ne = nb;
    while (ne < e && st__ir_ident(*ne)) ++ne;
    if (ne == nb || ne - nb >= ST_IR_MAX_NAME) {
      st__ir_fail(c, f, "a function name that is empty or longer than 255 bytes");
      return;
    }
    if (ne >= e || *ne != '(') {
      st__ir_fail(c, ne, "a func.func without its argument list");
      return;
    }
    const char* close = st_ir_scan_to(ne + 1, e, ')');
    if (close >= e || *close != ')') {
      st__ir_fail(c, ne, "a func.func whose argument list does not close");
      return;
    }
    /* The body: the first '{' that ends its line, after results and attributes. */
    const char* q = close + 1;
    const char* body = NULL;
    while (q < e) {
      q = st_ir_scan_to(q, e, '{');
      if (q >= e) break;
      if (st__rest_of_line_blank(q + 1, e)) {
        body = q;
        break;
      }
      const char* attr_end = st_ir_scan_to(q + 1, e, '}');
      if (attr_end >= e) break;
      q = attr_end + 1;
    }
    if (!body) {
      st__ir_fail(c, f, "a func.func without a body");
      return;
    }
    const char* be = st_ir_scan_to(body + 1, e, '}');
    if (be >= e) {
      st__ir_fail(c, body, "a function body without its closing '}'");
      return;
    }
    if (c->n_funcs >= ST_IR_MAX_FUNCS) {
      st__ir_fail(c, f, "more than 4096 functions");
      return;
    }
    if (st__ir_lookup(c, nb, (size_t)(ne - nb))) {
      st__ir_fail(c, f, "a function defined twice");
      return;
    }
    c->funcs = st_xrealloc(c->funcs, (size_t)(c->n_funcs + 1) * sizeof(*c->funcs));
    c->funcs[c->n_funcs++] = (st__ir_func){nb, (size_t)(ne - nb), ne, body, body + 1, be};
    p = be + 1;
  }
}
