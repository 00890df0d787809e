/* cmd_compare.c — `strata compare RUN_A RUN_B [--step N] [--json]`: the
 * first tensor where two step dumps (diag.dump) differ beyond its budget,
 * then the rest by layer (docs/diagnostics.md, "Dump and compare"). Exit
 * 0: every matched tensor within its budget; 1: some differ; 2: bad input
 * (not a dump, a damaged one, different steps or models). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/diag.h"

static const char* kUsage =
    "usage: strata compare RUN_A RUN_B [--step N] [--json]\n"
    "  RUN_A, RUN_B: run directories with a dump (diag.dump=step:N writes RUN/dump/step_N/), or dump folders;\n"
    "  --step N picks the step when a run holds several dumps. Walks A's launches in plan order and names the\n"
    "  first tensor that differs from B's beyond its budget (program, layer, microbatch, tensor, max abs and max\n"
    "  rel error, budget), then the rest by layer. Exit 0: none over budget; 1: some differ; 2: bad input";

/* "attention ffi (A) / xla (B)" for each kernel op whose implementation differs. */
static void st__cmp_kernels_line(const json_t* r) {
  const json_t* ka = json_object_get(r, "kernels_a");
  const json_t* kb = json_object_get(r, "kernels_b");
  const char* key;
  const json_t* v;
  int n = 0;
  json_object_foreach((json_t*)ka, key, v) {
    const json_t* w = json_object_get(kb, key);
    if (json_is_string(v) && json_is_string(w) && strcmp(json_string_value(v), json_string_value(w)))
      printf("%s%s %s (A) / %s (B)", n++ ? ", " : "  kernels differ: ", key, json_string_value(v), json_string_value(w));
  }
  if (n) printf("\n");
  const json_t* ma = json_object_get(r, "mesh_a");
  const json_t* mb = json_object_get(r, "mesh_b");
  if (!json_equal(ma, mb)) {
    char* ta = st_json_dump(ma, 0);
    char* tb = st_json_dump(mb, 0);
    printf("  meshes differ: %s (A) / %s (B)\n", ta, tb);
    free(ta);
    free(tb);
  }
}

/* One tensor's numbers: "max abs 3.05e-04, max rel 9.77e-04, budget 1.62e-05 (60x)". */
static void st__cmp_numbers(const json_t* t, char* out, size_t size) {
  const json_t* why = json_object_get(t, "mismatch");
  if (json_is_string(why)) {
    snprintf(out, size, "shapes or dtypes differ: %s", json_string_value(why));
    return;
  }
  double abs_ = json_number_value(json_object_get(t, "max_abs")), rel = json_number_value(json_object_get(t, "max_rel"));
  double budget = json_number_value(json_object_get(t, "budget"));
  if (abs_ < 0) {
    snprintf(out, size, "non-finite on one side only (element %lld), budget %.3g", (long long)json_integer_value(json_object_get(t, "element")),
             budget);
    return;
  }
  double ratio = json_number_value(json_object_get(t, "ratio"));
  const char* allow = json_is_true(json_object_get(t, "adamw_allowance")) ? " + AdamW's allowance" : "";
  if (budget > 0 || allow[0])
    snprintf(out, size, "max abs %.3g, max rel %.3g, budget %.3g%s (%.2gx)", abs_, rel, budget, allow, ratio);
  else
    snprintf(out, size, "max abs %.3g, max rel %.3g, budget 0 (must be equal)", abs_, rel);
}

static void st__cmp_print(const json_t* r) {
  long long compared = json_integer_value(json_object_get(r, "compared"));
  long long over = json_integer_value(json_object_get(r, "over_budget"));
  printf("strata compare: step %lld: %lld tensors compared, %lld over budget\n",
         (long long)json_integer_value(json_object_get(r, "step")), compared, over);
  printf("  A: %s\n  B: %s\n", json_string_value(json_object_get(r, "a")), json_string_value(json_object_get(r, "b")));
  st__cmp_kernels_line(r);
  const json_t* f = json_object_get(r, "first");
  char nums[256];
  if (json_is_object(f)) {
    const json_t* t = json_object_get(f, "tensor");
    long long layer = json_integer_value(json_object_get(f, "layer")), micro = json_integer_value(json_object_get(f, "micro"));
    printf("first over budget: program %s (%s, plan op %lld; in B %s, plan op %lld)", json_string_value(json_object_get(f, "program")),
           json_string_value(json_object_get(f, "kind")), (long long)json_integer_value(json_object_get(f, "op")),
           json_string_value(json_object_get(t, "program_b")), (long long)json_integer_value(json_object_get(t, "op_b")));
    if (layer >= 0) printf(", layer %lld", layer);
    if (micro >= 0) printf(", microbatch %lld", micro);
    printf(", phase %s\n", json_string_value(json_object_get(f, "phase")));
    st__cmp_numbers(t, nums, sizeof(nums));
    char shape[160] = "";
    size_t k, at = 0;
    const json_t* d;
    json_array_foreach(json_object_get(t, "shape"), k, d) if (at < sizeof(shape))
      at += (size_t)snprintf(shape + at, sizeof(shape) - at, "%s%lld", k ? "," : "", (long long)json_integer_value(d));
    printf("  tensor %s (%s %s, %s[%s]): %s\n", json_string_value(json_object_get(t, "tensor")),
           !strcmp(json_string_value(json_object_get(t, "io")), "in") ? "input" : "output",
           json_string_value(json_object_get(t, "class")), json_string_value(json_object_get(t, "dtype")), shape, nums);
    const json_t* all = json_object_get(f, "over_budget");
    printf("  %s; over budget in this launch: ", json_is_true(json_object_get(f, "inputs_within_budget"))
                                                   ? "its inputs are within budget: this program made the difference"
                                                   : "some of its inputs differ already (they came from outside the dumped launches)");
    size_t i;
    const json_t* x;
    json_array_foreach((json_t*)all, i, x) printf("%s%s", i ? ", " : "", json_string_value(json_object_get(x, "tensor")));
    printf("\n");
  } else {
    const json_t* m = json_object_get(r, "max_ratio_tensor");
    printf("no tensor over budget");
    if (json_is_object(m)) {
      long long layer = json_integer_value(json_object_get(m, "layer"));
      st__cmp_numbers(m, nums, sizeof(nums));
      printf("; the closest: %s", json_string_value(json_object_get(m, "program")));
      if (layer >= 0) printf(" layer %lld", layer);
      printf(" %s: %s", json_string_value(json_object_get(m, "tensor")), nums);
    }
    printf("\n");
  }
  printf("by layer (over budget / compared):\n");
  size_t i;
  const json_t* l;
  json_array_foreach(json_object_get(r, "by_layer"), i, l) {
    const json_t* w = json_object_get(l, "worst");
    printf("  %-10s %5lld / %-5lld", json_string_value(json_object_get(l, "where")),
           (long long)json_integer_value(json_object_get(l, "over_budget")), (long long)json_integer_value(json_object_get(l, "compared")));
    if (json_is_object(w)) {
      st__cmp_numbers(w, nums, sizeof(nums));
      long long micro = json_integer_value(json_object_get(w, "micro"));
      printf("  worst: %s", json_string_value(json_object_get(w, "program")));
      if (micro >= 0) printf(" microbatch %lld", micro);
      printf(" %s: %s", json_string_value(json_object_get(w, "tensor")), nums);
    }
    printf("\n");
  }
  long long oa = json_integer_value(json_object_get(r, "only_a")), ob = json_integer_value(json_object_get(r, "only_b"));
  printf("not matched (not compared): %lld tensors only in A, %lld only in B%s\n", oa, ob,
         oa || ob ? " (--json lists them; docs/diagnostics.md says what is matched)" : "");
}

int st_cli_compare(int argc, char** argv) {
  bool json = false;
  int64_t step = 0;
  const char** pos = st_xcalloc((size_t)argc + 1, sizeof(char*));
  char** rest = st_xcalloc((size_t)argc + 1, sizeof(char*));
  int nrest = 0;
  st_status s = ST_OK;
  for (int i = 0; i < argc && !s; ++i) {
    if (!strcmp(argv[i], "--step")) {
      char* end = NULL;
      errno = 0;
      long long v = i + 1 < argc ? strtoll(argv[i + 1], &end, 10) : 0;
      if (i + 1 >= argc || errno || !end || *end || v < 1)
        s = st_status_make(ST_CODE_CONFIG, "--step needs a step number from 1, e.g. --step 3\n%s", kUsage);
      step = v;
      ++i;
    } else {
      rest[nrest++] = argv[i];
    }
  }
  int npos = 0;
  if (!s && st_cli_json_args(nrest, rest, kUsage, &json, pos, 2, &npos)) {
    free(pos);
    free(rest);
    return 0;
  }
  if (!s && npos != 2) s = st_status_make(ST_CODE_CONFIG, "%s", kUsage);
  json_t* r = NULL;
  if (!s) s = st_compare_dumps(pos[0], pos[1], step, &r);
  free(pos);
  free(rest);
  if (s) return st_cli_report(s);
  if (json) st_cli_print_json(r, 2);
  else st__cmp_print(r);
  int code = json_is_true(json_object_get(r, "differ")) ? 1 : 0;
  json_decref(r);
  return code;
}
