/* cmd_kernels.c — `strata kernels list|verify|bench` (docs/kernels.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "strata/base.h"
#include "strata/kernels.h"

static const char* kUsage =
    "usage: strata kernels list [--json]           the kernel contract: ops, versions, shapes, tolerances, targets\n"
    "       strata kernels verify [--op NAME] [--impl ffi|pallas] [--tolerance-scale S] [--keep DIR]\n"
    "           every implementation against the xla reference on the contract's shapes, forward and backward\n"
    "           (exit 4 naming op, implementation, shape and the largest error when one is outside tolerance)\n"
    "       strata kernels bench [--op NAME] [--runs N]\n"
    "           time per call of every implementation on the contract's bench shapes, as a ratio to xla";

static int st__list(int argc, char** argv) {
  bool json = false;
  for (int i = 0; i < argc; ++i) {
    if (!strcmp(argv[i], "--json")) json = true;
    else {
      fprintf(stderr, "strata kernels list: unknown argument '%s'\n%s\n", argv[i], kUsage);
      return 2;
    }
  }
  st_kernel_contract c;
  st_status s = st_kernel_contract_load(&c);
  if (!s) s = st_kernels_check_contract(&c);
  if (s) {
    st_kernel_contract_free(&c);
    return st_cli_report(s);
  }
  if (json) {
    json_t* j = st_kernel_contract_json(&c);
    st_cli_print_json(j, 2);
    json_decref(j);
  } else {
    st_kernel_contract_print(&c, stdout);
  }
  st_kernel_contract_free(&c);
  return 0;
}

static int st__verify(int argc, char** argv, bool bench) {
  st_kernels_verify_options o = {.tolerance_scale = 1.0, .out = stdout, .bench = bench, .bench_runs = 20};
  const char* keep = NULL;
  for (int i = 0; i < argc; ++i) {
    const char* a = argv[i];
    if (!strcmp(a, "--op") && i + 1 < argc) o.op = argv[++i];
    else if (!strcmp(a, "--keep") && i + 1 < argc) keep = argv[++i];
    else if (!strcmp(a, "--impl") && i + 1 < argc) {
      o.impl = argv[++i];
      if (strcmp(o.impl, "ffi") && strcmp(o.impl, "pallas")) {
        fprintf(stderr, "strata kernels %s: --impl '%s' is not ffi or pallas (xla is the reference)\n",
                bench ? "bench" : "verify", o.impl);
        return 2;
      }
    }
    else if (bench && !strcmp(a, "--runs") && i + 1 < argc) {
      char* end = NULL;
      long v = strtol(argv[++i], &end, 10);
      if (!end || *end || v < 1 || v > 100000) {
        fprintf(stderr, "strata kernels bench: --runs '%s' is not a count in 1..100000\n", argv[i]);
        return 2;
      }
      o.bench_runs = (int)v;
    }
    else if (!bench && !strcmp(a, "--tolerance-scale") && i + 1 < argc) {
      char* end = NULL;
      o.tolerance_scale = strtod(argv[++i], &end);
      if (!end || *end || !(o.tolerance_scale >= 0)) {
        fprintf(stderr, "strata kernels verify: --tolerance-scale '%s' is not a number >= 0\n", argv[i]);
        return 2;
      }
    } else {
      fprintf(stderr, "strata kernels verify: unknown argument '%s'\n%s\n", a, kUsage);
      return 2;
    }
  }
  st_kernel_contract c;
  st_status s = st_kernel_contract_load(&c);
  if (!s) s = st_kernels_check_contract(&c);
  if (!s && o.op && !st_kernel_contract_find(&c, o.op)) {
    st_kernel_contract_free(&c);
    fprintf(stderr, "strata kernels verify: --op %s: no such kernel op (strata kernels list)\n", o.op);
    return 2;
  }
  st_kernel_contract_free(&c);
  if (s) return st_cli_report(s);
  char tmp[128];
  if (keep) {
    o.workdir = keep;
    o.keep = true;
  } else {
    const char* base = getenv("TMPDIR");
    snprintf(tmp, sizeof(tmp), "%s/strata-kverify-%ld", base && base[0] ? base : "/tmp", (long)getpid());
    o.workdir = tmp;
  }
  printf("kernels %s: C kernels use %s on this CPU\n", bench ? "bench" : "verify", st_kernels_isa_name(st_kernels_isa()));
  st_kernels_verify_result r;
  double t0 = st_now();
  s = st_kernels_verify(&o, &r);
  if (s) return st_cli_report(s);
  if (bench) {
    printf("kernels bench: median of %d calls each, launch to outputs ready; %.1f s\n", o.bench_runs, st_now() - t0);
    return 0;
  }
  printf("kernels verify: %d cases within tolerance (%d through FFI handlers); worst %.3g of the tolerance; %.1f s\n",
         r.cases, r.ffi_cases, r.worst_ratio, st_now() - t0);
  return 0;
}

int st_cli_kernels(int argc, char** argv) {
  if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
    fprintf(argc < 1 ? stderr : stdout, "%s\n", kUsage);
    return argc < 1 ? 2 : 0;
  }
  if (!strcmp(argv[0], "list")) return st__list(argc - 1, argv + 1);
  if (!strcmp(argv[0], "verify")) return st__verify(argc - 1, argv + 1, false);
  if (!strcmp(argv[0], "bench")) return st__verify(argc - 1, argv + 1, true);
  fprintf(stderr, "strata kernels: unknown subcommand '%s'\n%s\n", argv[0], kUsage);
  return 2;
}
