/* policy.c — parsing the sched.* values that are more than an enum. Kept
 * free of everything but strata/status.h so the config module's rules (and
 * the config fuzz target, tests/fuzz/run.sh) can use it. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "strata/sched.h"

#define ST__REMAT_HELP "expected none, full, every:K (K >= 1) or a comma-separated list of layers such as 0,2,5"

st_status st_sched_remat_parse(const char* spec, int n_layers, bool* out) {
  if (!spec || !spec[0]) spec = "full";
  bool all = !strcmp(spec, "full"), none = !strcmp(spec, "none");
  if (all || none) {
    for (int l = 0; out && l < n_layers; ++l) out[l] = all;
    return ST_OK;
  }
  if (!strncmp(spec, "every:", 6)) {
    const char* p = spec + 6;
    char* end = NULL;
    errno = 0;
    long k = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : -1;
    if (k < 1 || errno || !end || *end)
      return st_status_make(ST_CODE_CONFIG, "sched.remat '%s': K must be a whole number >= 1; " ST__REMAT_HELP, spec);
    for (int l = 0; out && l < n_layers; ++l) out[l] = l % k == 0;
    return ST_OK;
  }
  for (int l = 0; out && l < n_layers; ++l) out[l] = false;
  const char* p = spec;
  int count = 0;
  for (;;) {
    while (*p == ' ') ++p;
    if (!isdigit((unsigned char)*p))
      return st_status_make(ST_CODE_CONFIG, "sched.remat '%s': unexpected '%s'; " ST__REMAT_HELP, spec, *p ? p : "end");
    char* end = NULL;
    errno = 0;
    long l = strtol(p, &end, 10);
    if (errno || l > 1000000)
      return st_status_make(ST_CODE_CONFIG, "sched.remat '%s': layer index out of range; " ST__REMAT_HELP, spec);
    if (n_layers >= 0 && l >= n_layers)
      return st_status_make(ST_CODE_CONFIG, "sched.remat '%s' lists layer %ld, but the model has %d layers (0..%d)", spec,
                            l, n_layers, n_layers - 1);
    if (out && n_layers >= 0) out[l] = true;
    ++count;
    p = end;
    while (*p == ' ') ++p;
    if (!*p) break;
    if (*p != ',') return st_status_make(ST_CODE_CONFIG, "sched.remat '%s': unexpected '%s'; " ST__REMAT_HELP, spec, p);
    ++p;
  }
  return count ? ST_OK : st_status_make(ST_CODE_CONFIG, "sched.remat '%s': " ST__REMAT_HELP, spec);
}

int st_sched_offload_parse(const char* name) {
  if (!name) return -1;
  if (!strcmp(name, "none")) return 0;
  if (!strcmp(name, "optimizer")) return ST_OFFLOAD_OPTIMIZER;
  if (!strcmp(name, "params")) return ST_OFFLOAD_PARAMS;
  if (!strcmp(name, "both")) return ST_OFFLOAD_OPTIMIZER | ST_OFFLOAD_PARAMS;
  return -1;
}
