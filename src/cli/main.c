/* main.c — the `strata` binary: dispatch to one subcommand (docs/design.md §6). */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

typedef struct {
  const char* name;
  int (*fn)(int argc, char** argv);
  const char* usage;
} st_cli_command;

static const st_cli_command kCommands[] = {
    {"doctor", st_cli_doctor, "doctor                      environment: plugin, API version, devices, matmul GFLOP/s"},
    {"config", st_cli_config, "config CONFIG [k=v ...]     print the resolved config with sources (--schema: reference)"},
    {"export", st_cli_export, "export CONFIG [k=v ...]     write the program bundle"},
    {"train", st_cli_train, "train CONFIG [k=v ...]      train (exports the bundle if needed)"},
    {"resume", st_cli_resume, "resume RUN_DIR [k=v ...]     continue a run from its newest valid checkpoint"},
    {"run", st_cli_run, "run [--np N] CONFIG [k=v ...] train supervised: restart on crash or hang, resume, record recovery.json"},
    {"status", st_cli_status, "status RUN_DIR [--json]     state of a run: running (pid), finished, failed, interrupted; step, loss, ETA, checkpoint"},
    {"report", st_cli_make_report, "report RUN_DIR [--out FILE]  write RUN_DIR/report.html: plots, sample, checkpoints, context, config"},
    {"note", st_cli_note, "note RUN_DIR [--hypothesis|--conclusion] TEXT  record a note, hypothesis or conclusion (RUN_DIR/notes.json); no TEXT: print them"},
    {"diff", st_cli_diff, "diff RUN_A RUN_B [--html OUT] [--json] [--rtol R]  config, context and notes differences, curves side by side, first differing loss step"},
    {"analyze", st_cli_analyze, "analyze BUNDLE_DIR|RUN_DIR [--json]  per program FLOPs, bytes, intensity, collectives; per step totals"},
    {"eval", st_cli_eval, "eval RUN_DIR|CKPT_DIR [k=v ...] [--json]  loss, perplexity, bits per byte on the validation split (or data.path=)"},
    {"ckpt", st_cli_ckpt, "ckpt list|verify|inspect PATH  checkpoints of a run: list, verify checksums, show manifest and tensors"},
    {"data", st_cli_data, "data CONFIG [k=v ...]       tokenize the corpus; print the token file, split sizes, tokenizer; --decode IDS: ids -> bytes; data inspect CONFIG --step N: a step's batch"},
    {"sample", st_cli_sample, "sample RUN_DIR|CKPT_DIR [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]  generate text"},
    {"repro", st_cli_repro, "repro DIR [--json]          replay a non-finite bundle's program on its saved inputs: reproduces or not"},
    {"compare", st_cli_compare, "compare RUN_A RUN_B [--json]  two step dumps (diag.dump): the first tensor over its budget, then by layer; exit 1 if any"},
    {"kernels", st_cli_kernels, "kernels list|verify|bench   the kernel contract; every implementation against the reference; time per call"},
    {"plan", st_cli_plan, "plan CONFIG [k=v ...]       print the step plan (the ops one step runs; --json, --explain, --compile)"},
};

static void st_cli_usage(FILE* out) {
  fprintf(out, "usage: strata <command> [args]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof(kCommands) / sizeof(kCommands[0]); ++i) fprintf(out, "  %s\n", kCommands[i].usage);
  fprintf(out,
          "\nexit codes: 0 ok, 1 internal error, 2 usage/config, 3 data, 4 runtime/plugin/compile, 5 numerics, 6 hang, "
          "7 checkpoint, 8 stopped by a signal after a checkpoint, 9 file system (disk full)\n");
}

int st_cli_report(st_status status) {
  if (!status) return 0;
  fprintf(stderr, "strata: %s: %s\n", st_code_name(st_status_code(status)), st_status_message(status));
  int code = st_status_exit_code(status);
  st_status_free(status);
  return code;
}

int main(int argc, char** argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    st_cli_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < sizeof(kCommands) / sizeof(kCommands[0]); ++i) {
    if (!strcmp(argv[1], kCommands[i].name)) return kCommands[i].fn(argc - 2, argv + 2);
  }
  fprintf(stderr, "strata: unknown command '%s'\n\n", argv[1]);
  st_cli_usage(stderr);
  return 2;
}
