/* cmd_diff.c — `strata diff RUN_A RUN_B [--html OUT] [--json] [--rtol R]`:
 * what differs between two runs (st_diff_open, src/obs/diff.c;
 * docs/using.md "strata diff"). Reads the run directories only; safe while
 * either run trains. Exit 0: the comparison was printed (whatever it
 * found); 2: a bad argument or run directory, named; 9: OUT cannot be
 * written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/obs.h"

static const char* kUsage =
    "usage: strata diff RUN_A RUN_B [--html OUT] [--json] [--rtol R] [--samples N]\n"
    "  what differs between two runs: config keys first (both values), then context (author, git commit, host,\n"
    "  bundle key, ...), notes, the first step whose loss differs bitwise and the first whose relative difference\n"
    "  exceeds R (default 1e-6), loss/lr/grad norm/tokens/s at N sampled steps side by side (default 10), eval\n"
    "  losses and throughput. --json: all of it as JSON; --html OUT: also a self-contained page with both runs'\n"
    "  curves overlaid. Exit 0: printed (whether or not the runs differ); 2: bad argument or run directory.";

typedef struct st__diff_args {
  const char* dirs[2];
  const char* html;
  bool json;
  st_diff_options o;
} st__diff_args;

/* A value option's value: "--opt V" or "--opt=V"; NULL when |arg| is not it. */
static const char* st__diff_value(int argc, char** argv, int* i, const char* opt) {
  size_t n = strlen(opt);
  if (!strncmp(argv[*i], opt, n) && argv[*i][n] == '=') return argv[*i] + n + 1;
  if (!strcmp(argv[*i], opt) && *i + 1 < argc) return argv[++*i];
  return NULL;
}

static st_status st__diff_parse(int argc, char** argv, st__diff_args* a, bool* help) {
  int ndirs = 0;
  for (int i = 0; i < argc; ++i) {
    const char* v;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      *help = true;
      return ST_OK;
    } else if (!strcmp(argv[i], "--json")) {
      a->json = true;
    } else if ((v = st__diff_value(argc, argv, &i, "--html"))) {
      if (!v[0]) return st_status_make(ST_CODE_CONFIG, "strata diff: --html needs a file name\n%s", kUsage);
      a->html = v;
    } else if ((v = st__diff_value(argc, argv, &i, "--rtol"))) {
      char* end = NULL;
      a->o.rtol = strtod(v, &end);
      if (!v[0] || *end || !(a->o.rtol > 0) || !(a->o.rtol < 1))
        return st_status_make(ST_CODE_CONFIG, "strata diff: --rtol '%s' is not a number between 0 and 1 (e.g. 1e-6)", v);
    } else if ((v = st__diff_value(argc, argv, &i, "--samples"))) {
      char* end = NULL;
      long n = strtol(v, &end, 10);
      if (!v[0] || *end || n < 2 || n > 1000)
        return st_status_make(ST_CODE_CONFIG, "strata diff: --samples '%s' is not a whole number from 2 to 1000", v);
      a->o.samples = (int)n;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return st_status_make(ST_CODE_CONFIG, "strata diff: unknown option '%s' (or it lacks its value)\n%s", argv[i], kUsage);
    } else if (ndirs < 2) {
      a->dirs[ndirs++] = argv[i];
    } else {
      return st_status_make(ST_CODE_CONFIG, "strata diff: compares two runs; '%s' is a third\n%s", argv[i], kUsage);
    }
  }
  if (ndirs != 2) return st_status_make(ST_CODE_CONFIG, "strata diff: give two run directories\n%s", kUsage);
  return ST_OK;
}

int st_cli_diff(int argc, char** argv) {
  st__diff_args a = {0};
  bool help = false;
  st_status s = st__diff_parse(argc, argv, &a, &help);
  if (s) return st_cli_report(s);
  if (help) {
    printf("%s\n", kUsage);
    return 0;
  }
  st_diff* d = NULL;
  s = st_diff_open(a.dirs[0], a.dirs[1], &a.o, &d);
  if (!s && a.html) {
    char* html = st_diff_html(d);
    s = st_status_annotate(st_fs_write_atomic(a.html, html, strlen(html)), "strata diff: writing %s", a.html);
    free(html);
  }
  if (!s) {
    if (a.json) {
      st_cli_print_json(st_diff_json(d), 2);
    } else {
      st_strbuf text = {0};
      st_diff_text(d, &text);
      fputs(st_strbuf_cstr(&text), stdout);
      if (a.html) printf("\nhtml: %s\n", a.html);
      st_strbuf_free(&text);
    }
  }
  st_diff_free(d);
  return st_cli_report(s);
}
