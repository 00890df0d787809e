/* analyze_views.c — `strata analyze` beside its table, printed: --dot
 * (Graphviz DOT of one program's dataflow, or of a run's step plan),
 * --diff (two bundles, program by program) and --lint (the compile
 * contract, also run on every export: src/bundle/). src/train/analyze.c
 * computes them. docs/analysis.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "cli/analyze_views.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/bundle.h"
#include "strata/train.h"

int st_analyze_dot(const char* dir, const char* program) {
  st_strbuf out = {0};
  st_status s = st_train_analyze_dot(dir, program, &out);
  if (!s) fwrite(out.data, 1, out.len, stdout);
  st_strbuf_free(&out);
  return st_cli_report(s);
}

static void st__print_pair(const json_t* j, const char* key, const char* label) {
  json_t* p = json_object_get(j, key);
  if (!json_is_array(p)) return;
  double a = json_number_value(json_array_get(p, 0)), b = json_number_value(json_array_get(p, 1));
  printf("    %-16s %.6g -> %.6g", label, a, b);
  if (a != 0) printf(" (%+.1f%%)", 100 * (b - a) / a);
  printf("\n");
}

int st_analyze_diff(const char* dir_a, const char* dir_b, bool json) {
  json_t* j = NULL;
  st_status s = st_train_analyze_diff(dir_a, dir_b, &j);
  if (!s && json) {
    st_cli_print_json(j, 0);
  } else if (!s) {
    printf("diff %s (a) -> %s (b)%s\n", json_string_value(json_object_get(j, "a")),
           json_string_value(json_object_get(j, "b")), json_is_true(json_object_get(j, "same_key")) ? " (same bundle key)" : "");
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
  return st_cli_report(s);
}

int st_analyze_lint(const char* path, bool json) {
  st_lint_report r;
  char* what = NULL;
  st_status s = st_train_analyze_lint(path, &r, &what);
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
  free(what);
  return st_cli_report(s);
}
