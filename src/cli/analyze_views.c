/* analyze_views.c — `strata analyze` beside its table: --dot (Graphviz DOT
 * of one program's dataflow, or of a run's step plan), --diff (two
 * bundles, program by program) and --lint (the compile contract, also run
 * on every export: src/bundle/). docs/analysis.md. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/analyze_target.h"
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

int st_analyze_diff(const char* a, const char* b, bool json) {
  (void)a;
  (void)b;
  (void)json;
  return st_cli_report(st_status_make(ST_CODE_CONFIG, "not yet"));
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
      char* text = st_json_dump(j, 0);
      printf("%s\n", text);
      free(text);
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
