/*
 * cmd_select.c - `nvfp4moe select`: which NVFP4 MoE backend and kernel vLLM's oracle picks for a
 * deployment, on this machine or a what-if device and install, with every candidate's reason.
 * Exit status: 0 chosen, 2 ValueError, 3 NotImplementedError, 1 usage error (docs/select.md).
 */
#include "cli.h"
#include "cli_model.h"

#include <stdlib.h>
#include <string.h>

enum { O_DEVICE, O_INSTALLED, O_VLLM_ONLY, O_JSON, O_MODEL, O_COUNT };
static const cli_opt k_opts[O_COUNT] = {
    [O_DEVICE] = {"--device", "NAME", "plan for this device instead of the detected one: sm_XY (sm_90,\n"
                                      "sm_100, ...), a capability (9.0), a product as nvidia-smi names\n"
                                      "it (\"NVIDIA H200\"), or a100 a10g l4 l40 l40s rtx4090 h100 h200\n"
                                      "h20 h800 gh200 b100 b200 gb200 b300 gb300 rtx5090 rtx-pro-6000\n"
                                      "dgx-spark cpu (the full list: docs/select.md)"},
    [O_INSTALLED] = {"--installed", "LIBS", "plan as if these libraries were installed: all | none |\n"
                                            "flashinfer,b12x,humming,cutlass (default: what this build has)"},
    [O_VLLM_ONLY] = {"--vllm-only", NULL, "only vLLM's backends (none of ours): decisions identical to vLLM"},
    [O_JSON] = {"--json", NULL, "print one JSON object instead of text"},
    [O_MODEL] = {"--model", "DIR", "deployment config from DIR/config.json (+ hf_quant_config.json);\n"
                                   "the other flags override it"},
};

static void select_usage(FILE *f, const cli_args *a) {
    fprintf(f,
            "usage: nvfp4moe select [flags]\n\n"
            "Chooses the NVFP4 MoE backend and kernel for a deployment exactly as vLLM's\n"
            "select_nvfp4_moe_backend does, and shows why every other backend was or was not chosen.\n"
            "With no flags: the built-in default layer (Qwen3-30B-A3B), moe_backend auto, the detected\n"
            "device and the libraries this build contains.\n\n");
    cli_opts_help(f, k_opts, O_COUNT);
    fprintf(f, "  -h, --help                this text\n\n"
               "exit status: 0 a backend was chosen, 2 ValueError (unknown or unsupported explicit\n"
               "moe_backend), 3 NotImplementedError (no backend supports it), 1 usage error\n\n");
    cli_config_flags_help(f, a);
}

int cmd_select(int argc, char **argv) {
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    nvfp4moe_oracle_options opt = {0};
    nvfp4moe_device dev;
    bool have_dev = false, json = false;
    const char *model = NULL, *v = NULL;

    cli_args args;
    cli_args_init(&args, "select", k_opts, O_COUNT, true, 0, argc, argv);
    for (int o; (o = cli_args_next(&args, &v)) != CLI_ARGS_END;) {
        switch (o) {
        case CLI_ARGS_HELP:
            select_usage(stdout, &args);
            return CLI_EXIT_OK;
        case CLI_ARGS_ERROR:
            return CLI_EXIT_FAILURE;
        case O_DEVICE:
            if (nvfp4moe_device_parse(v, &dev) != NVFP4MOE_OK) {
                fprintf(stderr, "nvfp4moe select: --device: %s\n", nvfp4moe_last_error());
                return CLI_EXIT_FAILURE;
            }
            have_dev = true;
            break;
        case O_INSTALLED:
            if (nvfp4moe_oracle_libs_parse(v, &opt.installed) != NVFP4MOE_OK) {
                fprintf(stderr, "nvfp4moe select: --installed: %s\n", nvfp4moe_last_error());
                return CLI_EXIT_FAILURE;
            }
            opt.installed_set = true;
            break;
        case O_VLLM_ONLY: opt.vllm_only = true; break;
        case O_JSON: json = true; break;
        case O_MODEL: model = v; break;
        }
    }

    /* --model: the deployment config comes from config.json; the config flags then override it. */
    if (model ? cli_model_config("select", model, &args, &cfg) != 0 : cli_config_apply(&args, &cfg) != 0)
        return CLI_EXIT_FAILURE;

    if (!have_dev && nvfp4moe_device_detect(&dev) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe select: %s\n", nvfp4moe_last_error());
        return CLI_EXIT_FAILURE;
    }

    /* The report is ~29 KiB: static keeps it off small thread stacks. */
    static nvfp4moe_report report;
    nvfp4moe_status st = nvfp4moe_select(&cfg, &dev, &opt, &report);
    if (st != NVFP4MOE_OK && !report.error_kind[0]) {
        /* Not an oracle decision: the config itself is invalid (the message names the field). */
        fprintf(stderr, "nvfp4moe select: %s\n", nvfp4moe_last_error());
        return CLI_EXIT_FAILURE;
    }

    if (json) {
        /* the library's JSON form of the report: the Python package's select() returns the same */
        char *s = NULL;
        if (nvfp4moe_report_json(&report, &s) != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe select: %s\n", nvfp4moe_last_error());
            return CLI_EXIT_FAILURE;
        }
        printf("%s\n", s);
        nvfp4moe_json_free(s);
    } else {
        if (dev.detected && dev.is_cuda) printf("detected: %s\n", dev.name);
        size_t need = nvfp4moe_report_render(&report, NULL, 0);
        char *text = malloc(need + 1);
        if (!text) {
            fprintf(stderr, "nvfp4moe select: out of memory\n");
            return CLI_EXIT_FAILURE;
        }
        nvfp4moe_report_render(&report, text, need + 1);
        fputs(text, stdout);
        free(text);
    }

    if (st == NVFP4MOE_OK) return CLI_EXIT_OK;
    return strcmp(report.error_kind, "NotImplementedError") == 0 ? CLI_EXIT_NOT_IMPL : CLI_EXIT_VALUE;
}
