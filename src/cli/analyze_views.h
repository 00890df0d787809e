/* analyze_views.h — the views of `strata analyze` beside its table
 * (analyze_views.c: --dot, --diff, --lint), printed; src/train/analyze.c
 * computes them. */
#ifndef STRATA_CLI_ANALYZE_VIEWS_H
#define STRATA_CLI_ANALYZE_VIEWS_H

#include <stdbool.h>

/* Each returns the process exit code. */
int st_analyze_dot(const char* dir, const char* program /* NULL: the step plan */);
int st_analyze_diff(const char* a, const char* b, bool json);
int st_analyze_lint(const char* path, bool json);

#endif
