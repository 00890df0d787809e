/* cli_util.h — shared argument handling for subcommands that take
 * `CONFIG [key=value ...]`, or `[--json] ARG...`. */
#ifndef STRATA_CLI_UTIL_H
#define STRATA_CLI_UTIL_H

#include <stdbool.h>

#include <jansson.h>

#include "strata/config.h"
#include "strata/status.h"

/* Loads argv[0] as the config file and argv[1..] as overrides. Usage
 * errors (no CONFIG) are ST_CODE_CONFIG naming |command|. */
st_status st_cli_load_config(const char* command, int argc, char** argv, st_config** out_config);

/* Splits argv into --json (*out_json) and positional arguments (at most
 * |max| kept in |pos|, borrowed; *out_count counts them all, so more than
 * |max| shows as max + 1). -h/--help prints |usage| and returns true: the
 * command then exits 0. */
bool st_cli_json_args(int argc, char** argv, const char* usage, bool* out_json, const char** pos, int max, int* out_count);

/* Takes --allow-mismatch=FIELDS or --allow-mismatch FIELDS out of argv
 * (*argc shrinks; the rest keep their order): *out_allow (borrowed from
 * argv; NULL when absent) is the comma-separated list of identity fields
 * allowed to differ (docs/checkpoints.md, "Identity"). Given twice, or
 * without a value: ST_CODE_CONFIG. */
st_status st_cli_take_allow(int* argc, char** argv, const char** out_allow);

/* Prints |j| as JSON and a newline to stdout (|indent| as st_json_dump);
 * borrows |j|. */
void st_cli_print_json(const json_t* j, int indent);

#endif
