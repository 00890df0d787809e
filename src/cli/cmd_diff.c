#include "cli/commands.h"
int st_cli_diff(int argc, char** argv) { (void)argc; (void)argv; return 2; }
