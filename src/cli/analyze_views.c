/* analyze_views.c — `strata analyze` beside its table: --dot (Graphviz DOT
 * of one program's dataflow, or of a run's step plan), --diff (two
 * bundles, program by program) and --lint (the compile contract, also run
 * on every export: src/bundle/). docs/analysis.md. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>

#include "cli/analyze_target.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/ir.h"

static bool st__is_mlir_file(const char* path) {
  struct stat s;
  size_t n = strlen(path);
  return n > 5 && !strcmp(path + n - 5, ".mlir") && stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

/* A DOT string: quotes and backslashes escaped, newlines as \n. */
static void st__dot_str(st_strbuf* b, const char* s) {
  st_strbuf_append(b, "\"");
  for (; *s; ++s) {
    if (*s == '"' || *s == '\\') st_strbuf_printf(b, "\\%c", *s);
    else if (*s == '\n') st_strbuf_append(b, "\\n");
    else st_strbuf_append_n(b, s, 1);
  }
  st_strbuf_append(b, "\"");
}

/* ---------------------------------------------------------- --dot=PROGRAM */

static st_status st__program_dot(const char* path, const char* name, st_strbuf* out) {
  char* text = NULL;
  size_t size = 0;
  st_status s = st_fs_read_file(path, &text, &size);
  st_ir_graph g;
  memset(&g, 0, sizeof(g));
  if (!s) s = st_ir_main_graph(text, size, path, &g);
  free(text);
  if (s) return s;
  st_strbuf_append(out, "digraph ");
  st__dot_str(out, name);
  st_strbuf_append(out, " {\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
  for (int i = 0; i < g.n_nodes; ++i) {
    const st_ir_node* nd = &g.nodes[i];
    st_strbuf label = {0};
    st_strbuf_printf(&label, "%s%s%s\n%s", nd->op, nd->value[0] ? " " : "", nd->value, nd->type);
    st_strbuf_printf(out, "  n%d [label=", i);
    st__dot_str(out, label.data ? label.data : "");
    st_strbuf_free(&label);
    if (nd->collective) st_strbuf_append(out, ", shape=hexagon, style=filled, fillcolor=\"#f4a582\"");
    else if (nd->custom_call) st_strbuf_append(out, ", shape=octagon, style=filled, fillcolor=\"#fddbc7\"");
    else if (!strcmp(nd->op, "arg") || !strcmp(nd->op, "return")) st_strbuf_append(out, ", shape=ellipse");
    else if (!strcmp(nd->op, "dot_general") || !strcmp(nd->op, "dot") || !strcmp(nd->op, "convolution"))
      st_strbuf_append(out, ", style=filled, fillcolor=\"#92c5de\"");
    st_strbuf_append(out, "];\n");
  }
  for (int i = 0; i < g.n_edges; ++i) st_strbuf_printf(out, "  n%d -> n%d;\n", g.edges[i].from, g.edges[i].to);
  st_strbuf_append(out, "}\n");
  st_ir_graph_free(&g);
  return ST_OK;
}

/* ---------------------------------------------------------- --dot (plan) */

/* One node per launch, recompute or collective op of the step (an H2D
 * source "host" and a READ sink "read" beside them); an edge per slot
 * handed from the op that last wrote it to an op that reads it, labelled
 * with the slot (the first one, "+N" more). Persistent slots (parameters,
 * optimizer state) read before the step writes them are not drawn: they
 * would tie every launch to the state. */
static void st__plan_dot(const st_plan* p, st_strbuf* out) {
  int n = p->op_count;
  int* node = st_xcalloc((size_t)n + 1, sizeof(int)); /* op -> node id, -1 none */
  int* writer = st_xcalloc((size_t)p->slot_count + 1, sizeof(int));
  for (int i = 0; i < p->slot_count; ++i) writer[i] = -1;
  /* edges: (from, to) -> first slot, count */
  int cap = 64, ne = 0;
  int(*edges)[4] = st_xcalloc((size_t)cap, sizeof(*edges));
  const int HOST = -2, READ = -3;
  bool used_host = false, used_read = false;
  st_strbuf_append(out, "digraph \"step\" {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
  for (int k = 0; k < n; ++k) {
    const st_op* op = &p->ops[k];
    node[k] = -1;
    bool launch = op->kind == ST_OP_LAUNCH || op->kind == ST_OP_RECOMPUTE || op->kind == ST_OP_COLLECTIVE;
    int self = -1;
    if (launch) {
      self = k;
      node[k] = k;
      st_strbuf label = {0};
      st_strbuf_printf(&label, "%s%s", op->kind == ST_OP_RECOMPUTE ? "recompute " : "", p->programs[op->program]);
      if (op->layer >= 0) st_strbuf_printf(&label, "\nl=%d", op->layer);
      if (op->micro >= 0) st_strbuf_printf(&label, "%sm=%d", op->layer >= 0 ? " " : "\n", op->micro);
      st_strbuf_printf(out, "  op%d [label=", k);
      st__dot_str(out, label.data);
      st_strbuf_free(&label);
      if (op->kind == ST_OP_COLLECTIVE)
        st_strbuf_append(out, ", shape=hexagon, style=filled, fillcolor=\"#f4a582\"");
      else if (op->kind == ST_OP_RECOMPUTE)
        st_strbuf_append(out, ", style=\"filled,dashed\", fillcolor=\"#e0e0e0\"");
      st_strbuf_append(out, "];\n");
    } else if (op->kind == ST_OP_READ || op->kind == ST_OP_D2H) {
      self = READ;
    } else if (op->kind != ST_OP_H2D) {
      continue;
    }
    if (op->kind != ST_OP_H2D) {
      for (int i = 0; i < op->input_count; ++i) {
        int slot = op->inputs[i];
        if (slot < 0 || slot >= p->slot_count) continue;
        int from = writer[slot];
        if (from == -1) continue; /* state from the step before */
        int e = 0;
        while (e < ne && !(edges[e][0] == from && edges[e][1] == self)) ++e;
        if (e == ne) {
          if (ne == cap) {
            cap *= 2;
            edges = st_xrealloc(edges, (size_t)cap * sizeof(*edges));
          }
          edges[ne][0] = from;
          edges[ne][1] = self;
          edges[ne][2] = slot;
          edges[ne][3] = 0;
          ++ne;
        }
        edges[e][3]++;
        used_host |= from == HOST;
        used_read |= self == READ;
      }
    }
    for (int i = 0; i < op->output_count; ++i) {
      int slot = op->outputs[i];
      if (slot >= 0 && slot < p->slot_count) writer[slot] = op->kind == ST_OP_H2D ? HOST : self;
    }
  }
  if (used_host) st_strbuf_append(out, "  host [label=\"host (H2D)\", shape=ellipse];\n");
  if (used_read) st_strbuf_append(out, "  read [label=\"host (READ)\", shape=ellipse];\n");
  for (int e = 0; e < ne; ++e) {
    char from[24], to[24];
    if (edges[e][0] == HOST) snprintf(from, sizeof(from), "host");
    else snprintf(from, sizeof(from), "op%d", edges[e][0]);
    if (edges[e][1] == READ) snprintf(to, sizeof(to), "read");
    else snprintf(to, sizeof(to), "op%d", edges[e][1]);
    st_strbuf label = {0};
    st_strbuf_append(&label, p->slots[edges[e][2]].name);
    if (edges[e][3] > 1) st_strbuf_printf(&label, " +%d", edges[e][3] - 1);
    st_strbuf_printf(out, "  %s -> %s [label=", from, to);
    st__dot_str(out, label.data);
    st_strbuf_free(&label);
    st_strbuf_append(out, ", fontsize=8];\n");
  }
  st_strbuf_append(out, "}\n");
  free(edges);
  free(writer);
  free(node);
}

int st_analyze_dot(const char* dir, const char* program) {
  st_strbuf out = {0};
  st_status s = ST_OK;
  if (st__is_mlir_file(dir)) {
    if (program && program[0]) {
      s = st__program_dot(dir, program, &out);
    } else {
      const char* slash = strrchr(dir, '/');
      s = st__program_dot(dir, slash ? slash + 1 : dir, &out);
    }
  } else {
    st_analyze_target t;
    s = st_analyze_target_open(dir, &t);
    if (!s && program && program[0]) {
      const st_bundle_program* bp = st_bundle_program_find(t.bundle, program);
      if (!bp) bp = st_bundle_collective_find(t.bundle, program);
      if (!bp)
        s = st_status_make(ST_CODE_CONFIG, "strata analyze --dot=%s: the bundle %s has no such program", program,
                           t.bundle->dir);
      else
        s = st__program_dot(bp->path, program, &out);
    } else if (!s) {
      if (!t.is_run)
        s = st_status_make(ST_CODE_CONFIG,
                           "strata analyze --dot: a bundle has no step plan; pass a run directory, or name a "
                           "program (--dot=PROGRAM)");
      else
        st__plan_dot(&t.step, &out);
    }
    st_analyze_target_close(&t);
  }
  if (!s) fwrite(out.data, 1, out.len, stdout);
  st_strbuf_free(&out);
  return st_cli_report(s);
}

/* --------------------------------------------------------------- --diff */

static const st_bundle_program* st__find_any(const st_bundle* b, const char* name) {
  const st_bundle_program* p = st_bundle_program_find(b, name);
  return p ? p : st_bundle_collective_find(b, name);
}

static void st__pair(json_t* j, const char* key, double a, double b) {
  if (a == b) return;
  json_t* p = st_json_arr();
  json_array_append_new(p, json_real(a));
  json_array_append_new(p, json_real(b));
  st_json_put(j, key, p);
}

/* What changed between two analyses of one program: the counts that
 * differ as [a, b], the collectives and custom calls whose counts differ. */
static json_t* st__prog_diff(const char* name, const st_bundle_program* pa, const st_bundle_program* pb,
                             const st_ir_stats* a, const st_ir_stats* b) {
  json_t* j = st_json_obj();
  st_json_put_str(j, "name", name);
  st_json_put_bool(j, "text_changed", strcmp(pa->sha256, pb->sha256) != 0);
  st_json_put_bool(j, "signature_changed", !st_bundle_same_signature(pa, pb));
  st__pair(j, "flops", a->flops, b->flops);
  st__pair(j, "dot_flops", a->dot_flops, b->dot_flops);
  st__pair(j, "transcendentals", a->transcendentals, b->transcendentals);
  st__pair(j, "arg_bytes", a->arg_bytes, b->arg_bytes);
  st__pair(j, "result_bytes", a->result_bytes, b->result_bytes);
  st__pair(j, "bytes_accessed", a->bytes_accessed, b->bytes_accessed);
  json_t* ops = st_json_obj();
  const char* names[] = {"total", "dot", "convolution", "elementwise", "reduce", "data_movement", "constant",
                         "collective", "custom_call", "while", "call", "other"};
  const st_ir_op_counts *x = &a->ops, *y = &b->ops;
  const int64_t va[] = {x->total, x->dot, x->convolution, x->elementwise, x->reduce, x->data_movement,
                        x->constant, x->collective, x->custom_call, x->while_loop, x->call, x->other};
  const int64_t vb[] = {y->total, y->dot, y->convolution, y->elementwise, y->reduce, y->data_movement,
                        y->constant, y->collective, y->custom_call, y->while_loop, y->call, y->other};
  for (int k = 0; k < 12; ++k) st__pair(ops, names[k], (double)va[k], (double)vb[k]);
  st_json_put(j, "ops", ops);
  json_t* coll = st_json_arr();
  for (int side = 0; side < 2; ++side) {
    const st_ir_stats* x = side ? b : a;
    const st_ir_stats* y = side ? a : b;
    for (int i = 0; i < x->n_collectives; ++i) {
      const st_ir_collective* c = &x->collectives[i];
      const st_ir_collective* d = NULL;
      for (int k = 0; k < y->n_collectives && !d; ++k)
        if (!strcmp(y->collectives[k].kind, c->kind) && !strcmp(y->collectives[k].groups, c->groups))
          d = &y->collectives[k];
      if (side && d) continue; /* listed from a's side */
      double ca = side ? 0 : c->count, cb = side ? c->count : (d ? d->count : 0);
      double ba = side ? 0 : c->bytes, bb = side ? c->bytes : (d ? d->bytes : 0);
      if (ca == cb && ba == bb) continue;
      json_t* e = st_json_obj();
      st_json_put_str(e, "kind", c->kind);
      st_json_put_str(e, "groups", c->groups);
      st__pair(e, "count", ca, cb);
      st__pair(e, "bytes", ba, bb);
      json_array_append_new(coll, e);
    }
  }
  st_json_put(j, "collectives", coll);
  json_t* cc = st_json_arr();
  for (int side = 0; side < 2; ++side) {
    const st_ir_stats* x = side ? b : a;
    const st_ir_stats* y = side ? a : b;
    for (int i = 0; i < x->n_custom_calls; ++i) {
      const st_ir_custom_call* c = &x->custom_calls[i];
      const st_ir_custom_call* d = NULL;
      for (int k = 0; k < y->n_custom_calls && !d; ++k)
        if (!strcmp(y->custom_calls[k].target, c->target)) d = &y->custom_calls[k];
      if (side && d) continue;
      double ca = side ? 0 : c->count, cb = side ? c->count : (d ? d->count : 0);
      if (ca == cb) continue;
      json_t* e = st_json_obj();
      st_json_put_str(e, "target", c->target);
      st__pair(e, "count", ca, cb);
      json_array_append_new(cc, e);
    }
  }
  st_json_put(j, "custom_calls", cc);
  return j;
}

static void st__print_pair(const json_t* j, const char* key, const char* label) {
  json_t* p = json_object_get(j, key);
  if (!json_is_array(p)) return;
  double a = json_number_value(json_array_get(p, 0)), b = json_number_value(json_array_get(p, 1));
  printf("    %-16s %.6g -> %.6g", label, a, b);
  if (a != 0) printf(" (%+.1f%%)", 100 * (b - a) / a);
  printf("\n");
}

/* The names of both bundles' programs and collectives, a's order first. */
static int st__union_names(const st_bundle* a, const st_bundle* b, const char*** out) {
  int cap = a->program_count + a->collective_count + b->program_count + b->collective_count;
  const char** names = st_xcalloc((size_t)(cap > 0 ? cap : 1), sizeof(char*));
  int n = 0;
  const st_bundle* both[2] = {a, b};
  for (int s = 0; s < 2; ++s) {
    const st_bundle* x = both[s];
    for (int i = 0; i < x->program_count + x->collective_count; ++i) {
      const char* nm = i < x->program_count ? x->programs[i].name : x->collectives[i - x->program_count].name;
      bool seen = false;
      for (int k = 0; k < n && !seen; ++k) seen = !strcmp(names[k], nm);
      if (!seen) names[n++] = nm;
    }
  }
  *out = names;
  return n;
}

int st_analyze_diff(const char* dir_a, const char* dir_b, bool json) {
  st_analyze_target ta, tb;
  st_status s = st_analyze_target_open(dir_a, &ta);
  memset(&tb, 0, sizeof(tb));
  if (!s) s = st_analyze_target_open(dir_b, &tb);
  json_t* j = NULL;
  if (!s) {
    const st_bundle* a = ta.bundle;
    const st_bundle* b = tb.bundle;
    const char** names = NULL;
    int n = st__union_names(a, b, &names);
    json_t* added = st_json_arr();
    json_t* removed = st_json_arr();
    json_t* changed = st_json_arr();
    int same = 0;
    for (int i = 0; i < n && !s; ++i) {
      const st_bundle_program* pa = st__find_any(a, names[i]);
      const st_bundle_program* pb = st__find_any(b, names[i]);
      if (!pa) {
        json_array_append_new(added, json_string(names[i]));
        continue;
      }
      if (!pb) {
        json_array_append_new(removed, json_string(names[i]));
        continue;
      }
      if (!strcmp(pa->sha256, pb->sha256) && st_bundle_same_signature(pa, pb)) {
        ++same;
        continue;
      }
      st_ir_stats sa, sb;
      s = st_ir_analyze_file(pa->path, &sa);
      if (!s) {
        s = st_ir_analyze_file(pb->path, &sb);
        if (!s) json_array_append_new(changed, st__prog_diff(names[i], pa, pb, &sa, &sb));
        st_ir_stats_free(&sb);
      }
      st_ir_stats_free(&sa);
    }
    free(names);
    j = st_json_obj();
    st_json_put_str(j, "a", a->dir);
    st_json_put_str(j, "b", b->dir);
    st_json_put_bool(j, "same_key", !strcmp(a->key, b->key));
    st_json_put(j, "added", added);
    st_json_put(j, "removed", removed);
    st_json_put(j, "changed", changed);
    st_json_put_int(j, "unchanged", same);
  }
  if (!s && json) {
    st_cli_print_json(j, 0);
  } else if (!s) {
    printf("diff %s (a) -> %s (b)%s\n", ta.bundle->dir, tb.bundle->dir,
           !strcmp(ta.bundle->key, tb.bundle->key) ? " (same bundle key)" : "");
    size_t i;
    json_t* v;
    json_array_foreach(json_object_get(j, "added"), i, v) printf("  added    %s\n", json_string_value(v));
    json_array_foreach(json_object_get(j, "removed"), i, v) printf("  removed  %s\n", json_string_value(v));
    json_array_foreach(json_object_get(j, "changed"), i, v) {
      printf("  changed  %s%s%s\n", json_string_value(json_object_get(v, "name")),
             json_is_true(json_object_get(v, "text_changed")) ? " (text)" : "",
             json_is_true(json_object_get(v, "signature_changed")) ? " (signature)" : "");
      st__print_pair(v, "flops", "FLOPs");
      st__print_pair(v, "dot_flops", "dot FLOPs");
      st__print_pair(v, "arg_bytes", "read B");
      st__print_pair(v, "result_bytes", "write B");
      st__print_pair(v, "bytes_accessed", "xla B");
      json_t* ops = json_object_get(v, "ops");
      const char* key;
      json_t* pv;
      json_object_foreach(ops, key, pv) {
        char label[40];
        snprintf(label, sizeof(label), "ops %s", key);
        st__print_pair(ops, key, label);
      }
      size_t k;
      json_t* c;
      json_array_foreach(json_object_get(v, "collectives"), k, c) {
        char label[96];
        snprintf(label, sizeof(label), "%s(%s)", json_string_value(json_object_get(c, "kind")),
                 json_string_value(json_object_get(c, "groups")));
        st__print_pair(c, "count", label);
      }
      json_array_foreach(json_object_get(v, "custom_calls"), k, c) {
        char label[96];
        snprintf(label, sizeof(label), "call %s", json_string_value(json_object_get(c, "target")));
        st__print_pair(c, "count", label);
      }
    }
    printf("  unchanged %lld program%s\n", (long long)json_integer_value(json_object_get(j, "unchanged")),
           json_integer_value(json_object_get(j, "unchanged")) == 1 ? "" : "s");
  }
  json_decref(j);
  st_analyze_target_close(&ta);
  st_analyze_target_close(&tb);
  return st_cli_report(s);
}

/* ---------------------------------------------------------------- --lint */

int st_analyze_lint(const char* path, bool json) {
  st_lint_report r;
  memset(&r, 0, sizeof(r));
  st_status s = ST_OK;
  const char* what = path;
  st_bundle* b = NULL;
  st_analyze_target t;
  memset(&t, 0, sizeof(t));
  if (st__is_mlir_file(path)) {
    char* text = NULL;
    size_t size = 0;
    s = st_fs_read_file(path, &text, &size);
    const char* slash = strrchr(path, '/');
    if (!s) st_lint_program_text(slash ? slash + 1 : path, text, size, &r);
    free(text);
  } else {
    char* manifest = st_path_join(path, "manifest.json");
    bool is_bundle = st_fs_exists(manifest);
    free(manifest);
    if (is_bundle) {
      /* Against the cache's bundle of the same key, when this is another. */
      s = st_bundle_open(path, &b);
      st_bundle* prev = NULL;
      if (!s) {
        char* root = st_cache_root(NULL);
        st_strbuf other = {0};
        st_strbuf_printf(&other, "%s/bundles/%s", root, b->key);
        char* a = realpath(other.data, NULL);
        char* c = realpath(path, NULL);
        if (a && c && strcmp(a, c)) {
          st_status ps = st_bundle_open(other.data, &prev);
          st_status_free(ps);
        }
        free(a);
        free(c);
        st_strbuf_free(&other);
        free(root);
        st_lint_bundle(b, prev, &r);
        st_bundle_destroy(prev);
        what = b->dir;
      }
    } else {
      /* A run directory: its bundle through st_bundle_ensure, which lints
       * it (an error fails the open, naming program and op). */
      s = st_analyze_target_open(path, &t);
      if (!s) {
        r = t.bundle->lint;
        memset(&t.bundle->lint, 0, sizeof(t.bundle->lint));
        what = t.bundle->dir;
      }
    }
  }
  if (!s) {
    if (json) {
      json_t* j = st_json_obj();
      st_json_put_str(j, "target", what);
      st_json_put_int(j, "errors", r.errors);
      st_json_put_int(j, "warnings", r.warnings);
      st_json_put(j, "findings", st_lint_json(&r));
      st_cli_print_json(j, 0);
      json_decref(j);
    } else {
      printf("lint %s: %d error%s, %d warning%s\n", what, r.errors, r.errors == 1 ? "" : "s", r.warnings,
             r.warnings == 1 ? "" : "s");
      for (int i = 0; i < r.count; ++i) {
        const st_lint_finding* f = &r.findings[i];
        printf("%-7s %-17s %s", f->severity == ST_LINT_ERROR ? "error" : "warning", f->kind, f->program);
        if (f->line > 0) printf(":%d", f->line);
        if (f->op[0]) printf(" %s", f->op);
        printf(": %s\n", f->message);
      }
    }
    fflush(stdout);
    s = st_lint_status(&r, what);
  }
  st_lint_report_free(&r);
  st_bundle_destroy(b);
  st_analyze_target_close(&t);
  return st_cli_report(s);
}
