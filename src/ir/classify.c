/* classify.c — the classes of StableHLO ops the cost pass and the graph
 * count by: transcendental, elementwise, data movement, collective,
 * dynamic-shape, terminator (docs/analysis.md). */
#include <stdbool.h>
#include <string.h>

#include "ir/ir_internal.h"

const char* st__ir_short(const char* name) {
  if (!strncmp(name, "stablehlo.", 10)) return name + 10;
  if (!strncmp(name, "mhlo.", 5)) return name + 5;
  return name;
}

static bool st__in(const char* s, const char* const* list) {
  for (; *list; ++list)
    if (!strcmp(s, *list)) return true;
  return false;
}

static const char* const kTransc[] = {"exponential", "exponential_minus_one", "log", "log_plus_one", "logistic",
                                      "power", "sqrt", "cbrt", "rsqrt", "tanh", "sine", "cosine", "tan", "atan2",
                                      "erf", NULL};
static const char* const kElementwise[] = {
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "and", "or", "xor", "not",
    "negate", "abs", "sign", "compare", "select", "clamp", "convert", "shift_left", "shift_right_logical",
    "shift_right_arithmetic", "floor", "ceil", "round_nearest_afz", "round_nearest_even", "is_finite", "popcnt",
    "count_leading_zeros", "real", "imag", "complex", "reduce_precision", NULL};
static const char* const kMovement[] = {
    "broadcast_in_dim", "broadcast", "reshape", "transpose", "slice", "concatenate", "pad", "gather",
    "dynamic_slice", "dynamic_update_slice", "iota", "reverse", "bitcast_convert", "get_tuple_element", "tuple",
    "optimization_barrier", "scatter", "sort", "copy", NULL};
static const char* const kCollective[] = {"all_reduce", "all_gather", "reduce_scatter", "collective_permute",
                                          "all_to_all", "collective_broadcast", NULL};
static const char* const kDynamic[] = {"dynamic_broadcast_in_dim", "dynamic_reshape", "real_dynamic_slice",
                                       "dynamic_iota", "dynamic_pad", "dynamic_gather", "dynamic_conv",
                                       "get_dimension_size", "set_dimension_size", NULL};

bool st__ir_is_return(const char* n) {
  return !strcmp(n, "return") || !strcmp(n, "func.return") || !strcmp(n, "stablehlo.return") ||
         !strcmp(n, "sdy.return") || !strcmp(n, "mhlo.return");
}

bool st__ir_is_transc(const char* s) {
  return st__in(s, kTransc) || !strncmp(s, "chlo.", 5);
}

bool st__ir_is_elementwise(const char* s) { return st__in(s, kElementwise); }
bool st__ir_is_movement(const char* s) { return st__in(s, kMovement); }
bool st__ir_is_collective(const char* s) { return st__in(s, kCollective); }
bool st__ir_is_dynamic(const char* s) { return st__in(s, kDynamic); }
