/*
 * nvfp4moe.c - the command-line tool's entry point: dispatches to the subcommands.
 */
#include "cli.h"
#include "core/internal.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} subcommand;

/* One line per subcommand, in the order --help lists them. */
static const subcommand k_commands[] = {
    {"run", cmd_run, "run an NVFP4 MoE layer (built-in default, flags or --model) on the best backend"},
    {"select", cmd_select, "choose the NVFP4 MoE backend for a deployment, with every backend's reason"},
    {"compare", cmd_compare, "compare two outputs of run (--output files): error, verdict, exit status"},
    {"bench", cmd_bench, "time the GPU backends against cuBLAS bf16 and the roofline floor (--cpu, --ep N)"},
    {"inspect", cmd_inspect, "show a model directory's format, scheme, MoE layers and shapes, and check them"},
    {"quantize", cmd_quantize, "write an NVFP4 checkpoint from a BF16 safetensors model (or a random one)"},
};
#define N_COMMANDS ((int)(sizeof k_commands / sizeof k_commands[0]))

static void usage(FILE *f) {
    fprintf(f, "nvfp4moe %s - run NVFP4 Mixture-of-Experts layers and choose their kernel backend\n\n",
            nvfp4moe_version());
    fprintf(f, "usage: nvfp4moe <command> [flags]     nvfp4moe <command> --help\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].summary);
    fprintf(f, "\n  -h, --help     this text (nvfp4moe help <command>: that command's)\n"
               "  --version      the version, whether CUDA is compiled in, and the vLLM revision select mirrors\n\n"
               "Flags: --flag value or --flag=value; names are not abbreviated. Exit status: 0 success, 1 usage\n"
               "error or failure (the message names the flag, field or file); select: 2 ValueError,\n"
               "3 NotImplementedError; compare: 2 the outputs differ beyond the tolerance.\n");
}

static int find(const char *name) {
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, k_commands[i].name)) return i;
    return -1;
}

static int unknown(const char *what) {
    nvfp4moe_suggest sg;
    nvfp4moe_suggest_init(&sg, what[0] == '-' ? what + strspn(what, "-") : what);
    for (int i = 0; i < N_COMMANDS; i++) nvfp4moe_suggest_add(&sg, k_commands[i].name);
    nvfp4moe_suggest_add(&sg, "help");
    nvfp4moe_suggest_add(&sg, "version");
    const char *best = nvfp4moe_suggest_best(&sg);
    if (best && (!strcmp(best, "help") || !strcmp(best, "version")) && what[0] == '-')
        fprintf(stderr, "nvfp4moe: unknown command '%s'; did you mean '--%s'? (nvfp4moe --help lists them)\n", what,
                best);
    else if (best)
        fprintf(stderr, "nvfp4moe: unknown command '%s'; did you mean '%s'? (nvfp4moe --help lists them)\n", what,
                best);
    else
        fprintf(stderr, "nvfp4moe: unknown command '%s' (nvfp4moe --help lists them)\n", what);
    return CLI_EXIT_FAILURE;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_FAILURE;
    }
    const char *a = argv[1];
    if (!strcmp(a, "--help") || !strcmp(a, "-h") || (!strcmp(a, "help") && argc == 2)) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (!strcmp(a, "help")) {   /* nvfp4moe help <command>: <command> --help */
        const int k = find(argv[2]);
        if (k < 0) return unknown(argv[2]);
        char *hargv[] = {argv[2], "--help", NULL};
        return k_commands[k].fn(2, hargv);
    }
    if (!strcmp(a, "--version")) {
        printf("nvfp4moe %s\nselect mirrors %s\n", nvfp4moe_version(), nvfp4moe_vllm_revision());
        return CLI_EXIT_OK;
    }
    const int k = find(a);
    if (k < 0) return unknown(a);
    return k_commands[k].fn(argc - 1, argv + 1);
}
