/*
 * cli.h - what the nvfp4moe subcommands share: the table of subcommands, the config flags every
 * subcommand accepts, and fail-fast helpers for the program (never for the library).
 */
#ifndef NVFP4MOE_CLI_H
#define NVFP4MOE_CLI_H

#include "nvfp4moe.h"

#include <stdio.h>

/* Exit codes of every subcommand. */
enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_FAILURE = 1,   /* usage error or a failed operation (message names the flag/field) */
    CLI_EXIT_VALUE = 2,     /* select: ValueError */
    CLI_EXIT_NOT_IMPL = 3,  /* select: NotImplementedError */
};

/* Subcommands: each in its own tools/cmd_*.c. argv[0] is the subcommand's name. */
int cmd_run(int argc, char **argv);
int cmd_select(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Flags that set a deployment-config field (shape, dtype, activation, routing, scheme, parallel
 * config, features). If argv[*i] is one, applies it (consuming its value, advancing *i) and
 * returns 1; returns 0 if argv[*i] is not a config flag; returns -1 after printing a message
 * naming the flag when its value is bad. */
int cli_config_flag(int argc, char **argv, int *i, nvfp4moe_config *cfg);

/* The --help text of the config flags. */
void cli_config_flags_help(FILE *f);

/* Parses a whole number for flag (>= min); prints an error naming the flag and returns -1 if
 * it is not one. */
int cli_parse_int(const char *flag, const char *s, long long min, long long *out);
int cli_parse_double(const char *flag, const char *s, double *out);

/* Value of a flag that needs one: argv[*i + 1], advancing *i; NULL (and a message) if missing. */
const char *cli_flag_value(int argc, char **argv, int *i);

/* Monotonic wall-clock seconds, for the timings the commands print. */
double cli_now_s(void);

/* FNV-1a 64 over n bytes continuing from h (start with CLI_FNV1A_INIT): the outputs' checksum. */
#define CLI_FNV1A_INIT 0xCBF29CE484222325ull
uint64_t cli_fnv1a(const void *p, size_t n, uint64_t h);

#endif // NVFP4MOE_CLI_H
