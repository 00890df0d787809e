/* cmd_sample.c — `strata sample RUN_DIR|CHECKPOINT_DIR [--prompt TEXT]
 * [--tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]`:
 * generates text from a trained model, streamed to stdout (docs/using.md). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/train.h"

static const char* kUsage =
    "usage: strata sample RUN_DIR|CHECKPOINT_DIR [key=value ...] [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]\n"
    "                     [--top-p P] [--seed S] [--allow-mismatch=FIELD[,FIELD...]]\n"
    "  key=value          overrides on the run's config.yaml; a tokenizer or model.* that differs from the\n"
    "                     checkpoint's is exit 7 unless --allow-mismatch names it (tokenizer, model.<key>, model, all)\n"
    "  --prompt TEXT      text to continue (default: a newline; synthetic-data runs: token ids, default \"0\")\n"
    "  --tokens N         tokens to generate, 1..1000000 (default 256)\n"
    "  --temperature T    >= 0; 0 is greedy (default 0.8)\n"
    "  --top-k K          keep the K most likely tokens; 0: all (default 0)\n"
    "  --top-p P          keep the most likely tokens up to probability P, in (0, 1] (default 1)\n"
    "  --seed S           sampling seed, 0..2^64-1: the same seed repeats the same text (default 0)\n";

static st_status st__sample_flag_bad(const char* flag, const char* value, const char* want) {
  return st_status_make(ST_CODE_CONFIG, "strata sample: %s '%s': %s (see `strata sample --help`)", flag, value, want);
}

static bool st__int(const char* v, long long lo, long long hi, long long* out) {
  char* end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || errno || x < lo || x > hi) return false;
  *out = x;
  return true;
}

static bool st__sample_num(const char* v, double* out) {
  char* end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  if (end == v || *end || errno || !isfinite(x)) return false;
  *out = x;
  return true;
}

int st_cli_sample(int argc, char** argv) {
  st_infer_sample_options o = {.tokens = 256, .temperature = 0.8, .top_k = 0, .top_p = 1.0, .seed = 0, .out = stdout};
  const char* path = NULL;
  const char* prompt = NULL;
  const char* allow = NULL;
  st_status s = st_cli_take_allow(&argc, argv, &allow);
  char** ov = st_xcalloc((size_t)argc + 1, sizeof(char*));
  int n_ov = 0;
  for (int i = 0; i < argc && !s; ++i) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(kUsage, stdout);
      free(ov);
      return 0;
    }
    if (strncmp(a, "--", 2) != 0 && path && strchr(a, '=')) {
      ov[n_ov++] = argv[i];
      continue;
    }
    if (strncmp(a, "--", 2) != 0) {
      if (path) s = st_status_make(ST_CODE_CONFIG, "strata sample: one RUN_DIR or CHECKPOINT_DIR, got '%s' and '%s'", path, a);
      path = a;
      continue;
    }
    /* --flag VALUE or --flag=VALUE */
    char flag[32];
    const char* eq = strchr(a, '=');
    const char* v = NULL;
    snprintf(flag, sizeof(flag), "%.*s", (int)(eq ? (size_t)(eq - a) : strlen(a)), a);
    if (strcmp(flag, "--prompt") && strcmp(flag, "--tokens") && strcmp(flag, "--temperature") && strcmp(flag, "--top-k") &&
        strcmp(flag, "--top-p") && strcmp(flag, "--seed")) {
      s = st_status_make(ST_CODE_CONFIG,
                         "strata sample: unknown flag '%s'; the flags are --prompt, --tokens, --temperature, --top-k, --top-p, --seed, "
                         "--allow-mismatch",
                         a);
      break;
    }
    if (eq) {
      v = eq + 1;
    } else if (i + 1 < argc) {
      v = argv[++i];
    } else {
      s = st_status_make(ST_CODE_CONFIG, "strata sample: %s needs a value (%s VALUE)", flag, flag);
      break;
    }
    long long n = 0;
    double x = 0;
    if (!strcmp(flag, "--prompt")) {
      prompt = v;
    } else if (!strcmp(flag, "--tokens")) {
      if (!st__int(v, 1, ST_INFER_MAX_TOKENS, &n)) s = st__sample_flag_bad(flag, v, "give a whole number of tokens from 1 to 1000000");
      o.tokens = n;
    } else if (!strcmp(flag, "--temperature")) {
      if (!st__sample_num(v, &x) || x < 0) s = st__sample_flag_bad(flag, v, "give a number >= 0 (0 is greedy decoding)");
      o.temperature = x;
    } else if (!strcmp(flag, "--top-k")) {
      if (!st__int(v, 0, 1LL << 31, &n)) s = st__sample_flag_bad(flag, v, "give a whole number >= 0 (0 keeps every token)");
      o.top_k = n;
    } else if (!strcmp(flag, "--top-p")) {
      if (!st__sample_num(v, &x) || !(x > 0 && x <= 1)) s = st__sample_flag_bad(flag, v, "give a probability in (0, 1] (1 keeps every token)");
      o.top_p = x;
    } else { /* --seed */
      char* end = NULL;
      errno = 0;
      unsigned long long u = strtoull(v, &end, 10);
      if (end == v || *end || errno || v[0] == '-') s = st__sample_flag_bad(flag, v, "give a whole number from 0 to 18446744073709551615");
      o.seed = (uint64_t)u;
    }
  }
  if (!s && !path)
    s = st_status_make(ST_CODE_CONFIG, "strata sample needs a run directory or a checkpoint folder: strata sample runs/NAME [--prompt TEXT]");
  if (!s) s = st_infer_sample_main(path, n_ov, ov, allow, prompt, &o);
  free(ov);
  return st_cli_report(s);
}
