/* commands.h — one function per `strata` subcommand (docs/design.md §6).
 * Each takes the arguments after the subcommand name and returns a process
 * exit code (docs/design.md §4: 0 ok, 2 usage/config, 3 data, 4 runtime,
 * 5 numerics, 6 hang, 7 checkpoint). */
#ifndef STRATA_CLI_COMMANDS_H
#define STRATA_CLI_COMMANDS_H

#include "strata/status.h"

int st_cli_doctor(int argc, char** argv);
int st_cli_config(int argc, char** argv);
int st_cli_export(int argc, char** argv);
int st_cli_train(int argc, char** argv);
int st_cli_plan(int argc, char** argv);
int st_cli_data(int argc, char** argv);
int st_cli_data_inspect(int argc, char** argv); /* `strata data inspect ...` (cmd_data_inspect.c) */
int st_cli_resume(int argc, char** argv);
int st_cli_run(int argc, char** argv);
int st_cli_ckpt(int argc, char** argv);
int st_cli_status(int argc, char** argv);
int st_cli_make_report(int argc, char** argv); /* `strata report` (st_cli_report is the error printer) */
int st_cli_analyze(int argc, char** argv);
int st_cli_eval(int argc, char** argv);
int st_cli_sample(int argc, char** argv);
int st_cli_repro(int argc, char** argv);
int st_cli_compare(int argc, char** argv);
int st_cli_kernels(int argc, char** argv);
int st_cli_note(int argc, char** argv);
int st_cli_diff(int argc, char** argv);

/* Prints "strata: <class>: <message>" to stderr and returns the exit code. */
int st_cli_report(st_status status);

#endif
