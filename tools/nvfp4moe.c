/*
 * nvfp4moe.c - the command-line tool's entry point: dispatches to the subcommands.
 */
#include "cli.h"

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
    {"bench", cmd_bench, "time the MARLIN backend against a cuBLAS bf16 baseline and the roofline floor"},
    {"inspect", cmd_inspect, "show a model directory's format, scheme, MoE layers and shapes, and check them"},
    {"quantize", cmd_quantize, "write an NVFP4 checkpoint from a BF16 safetensors model (or a random one)"},
};

static void usage(FILE *f) {
    fprintf(f, "nvfp4moe %s - run NVFP4 Mixture-of-Experts layers and choose their kernel backend\n\n",
            nvfp4moe_version());
    fprintf(f, "usage: nvfp4moe <command> [flags]     nvfp4moe <command> --help\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].summary);
    fprintf(f, "\n  --help     this text\n  --version  the version, whether CUDA is compiled in, and the vLLM revision select mirrors\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_FAILURE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("nvfp4moe %s\nselect mirrors %s\n", nvfp4moe_version(), nvfp4moe_vllm_revision());
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (!strcmp(argv[1], k_commands[i].name)) return k_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "nvfp4moe: unknown command '%s' (try nvfp4moe --help)\n", argv[1]);
    return CLI_EXIT_FAILURE;
}
