/*
 * cli_ep.h - `nvfp4moe run --ep N` (tools/cmd_run_ep.c), called by cmd_run when the config's
 * parallel.ep_size > 1.
 */
#ifndef NVFP4MOE_CLI_EP_H
#define NVFP4MOE_CLI_EP_H

#include "cli.h"

/* Runs cfg's layer (weights w, host memory, the whole layer) with expert parallelism over
 * cfg->parallel.ep_size ranks, `tokens` tokens per rank: one process per GPU over NCCL when dev is
 * a detected GPU (argc/argv: cmd_run's, re-used to start the rank processes), else the loopback
 * simulation in this process. Prints one line per rank; returns a CLI_EXIT_* code. */
int cli_run_ep(const nvfp4moe_config *cfg, const nvfp4moe_weights *w, long long tokens, const nvfp4moe_device *dev,
               bool device_given, int argc, char **argv);

#endif // NVFP4MOE_CLI_EP_H
