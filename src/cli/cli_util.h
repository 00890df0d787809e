/* cli_util.h — shared argument handling for subcommands that take
 * `CONFIG [key=value ...]`. */
#ifndef STRATA_CLI_UTIL_H
#define STRATA_CLI_UTIL_H

#include "strata/config.h"
#include "strata/status.h"

/* Loads argv[0] as the config file and argv[1..] as overrides. Usage
 * errors (no CONFIG) are ST_CODE_CONFIG naming |command|. */
st_status st_cli_load_config(const char* command, int argc, char** argv, st_config** out_config);

#endif
