/*
 * cli.h - what the nvfp4moe subcommands share: the table of subcommands, the command-line parser
 * and --help layout every subcommand uses, the config flags, and fail-fast helpers for the program
 * (never for the library).
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
    CLI_EXIT_DIFFERENT = 2, /* compare: the outputs differ beyond the tolerance */
};

/* Subcommands: each in its own tools/cmd_*.c. argv[0] is the subcommand's name. */
int cmd_run(int argc, char **argv);
int cmd_select(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_compare(int argc, char **argv);

// ---- the command line (tools/cli_args.c) ----
//
// Every subcommand parses its arguments the way GNU getopt_long does: "--flag value" or
// "--flag=value" for a flag with a value, a switch alone, "-h" or "--help", "--" ends the flags,
// and the arguments that are not flags (a directory, two files) may stand anywhere. Flag names are
// never abbreviated. An unknown flag names the nearest known one ("did you mean").

/* One flag of a subcommand. A subcommand's table is indexed by its own enum, so that the index
 * cli_args_next returns is the flag. */
typedef struct cli_opt {
    const char *name;   /* "--tokens" */
    const char *arg;    /* the value's placeholder in --help ("M", "FILE"); NULL for a switch */
    const char *help;   /* the --help text; "\n" starts a continuation line */
} cli_opt;

#define CLI_MAX_CONFIG_FLAGS 128
#define CLI_MAX_POSITIONAL 4

/* A parse of one subcommand's arguments. */
typedef struct cli_args {
    const char *cmd;                 /* "run", "bench --cpu": messages start "nvfp4moe <cmd>: " */
    const cli_opt *opts;             /* the subcommand's own flags, searched first */
    int nopts;
    bool config;                     /* the deployment-config flags as well (recorded, see below) */
    int max_positional;              /* arguments that are not flags (0: none) */
    int argc;
    char **argv;
    int i;                           /* the next argument to read */
    bool flags_done;                 /* after "--" */
    const char *pos[CLI_MAX_POSITIONAL];
    int npos;
    /* The config flags given, in order: their index in the config table and their value (NULL for
     * a switch). cli_config_apply applies them; a subcommand that reads a model's config first
     * applies them again on top of it. */
    int cfg_flag[CLI_MAX_CONFIG_FLAGS];
    const char *cfg_value[CLI_MAX_CONFIG_FLAGS];
    int ncfg;
} cli_args;

enum { CLI_ARGS_END = -1, CLI_ARGS_ERROR = -2, CLI_ARGS_HELP = -3 };

/* Starts a parse of argv[1..argc) (argv[0] is the subcommand). opts: the subcommand's table of
 * nopts flags; config: it takes the config flags too; max_positional: how many arguments that are
 * not flags it takes. */
void cli_args_init(cli_args *a, const char *cmd, const cli_opt *opts, int nopts, bool config, int max_positional,
                   int argc, char **argv);
/* The next of the subcommand's own flags: its index in opts, *value its value (NULL for a switch).
 * Config flags are recorded and skipped, arguments that are not flags collected in pos.
 * CLI_ARGS_END when every argument is read; CLI_ARGS_HELP for -h / --help; CLI_ARGS_ERROR after a
 * message naming the argument: an unknown flag (with the nearest known one), a missing value, a
 * value given to a switch, an argument that is not a flag where none (or no more) is taken. */
int cli_args_next(cli_args *a, const char **value);
/* Whether argv holds flag (alone or as flag=value) before any "--": how `bench` picks its mode
 * before parsing. */
bool cli_has_flag(int argc, char **argv, const char *flag);

/* --help layout: every flag's name and placeholder in a column of CLI_HELP_COL characters (the
 * help on the next line when they are longer), then its help, continuation lines indented to the
 * same column. */
#define CLI_HELP_COL 28
void cli_opts_help(FILE *f, const cli_opt *opts, int n);
/* The config flags' --help section; flags the subcommand's own table also has (in a, may be NULL)
 * are left out. */
void cli_config_flags_help(FILE *f, const cli_args *a);

/* Applies the config flags recorded in a to cfg, in the order given. Prints a message naming the
 * flag and returns -1 when a value is bad. */
int cli_config_apply(const cli_args *a, nvfp4moe_config *cfg);
/* Whether the config flag name ("--tokens") was given. */
bool cli_config_given(const cli_args *a, const char *name);

/* "nvfp4moe <cmd>" of the parse under way: the start of every message. */
const char *cli_cmd_name(void);

/* Parses a whole number for flag (>= min); prints an error naming the flag and returns -1 if
 * it is not one. */
int cli_parse_int(const char *flag, const char *s, long long min, long long *out);
int cli_parse_double(const char *flag, const char *s, double *out);

/* Creates the folders a file path needs (mkdir -p of everything before its last '/'). Prints a
 * message naming flag and returns -1 when one cannot be made. */
int cli_make_parent_dirs(const char *flag, const char *path);

/* Monotonic wall-clock seconds, for the timings the commands print. */
double cli_now_s(void);

/* FNV-1a 64 over n bytes continuing from h (start with CLI_FNV1A_INIT): the outputs' checksum. */
#define CLI_FNV1A_INIT 0xCBF29CE484222325ull
uint64_t cli_fnv1a(const void *p, size_t n, uint64_t h);

#endif // NVFP4MOE_CLI_H
