/*
 * cli_model.h - what `run --model`, `select --model`, `inspect` and `quantize` share: reading a
 * model directory into a deployment config with the command line's flags on top, printing load
 * warnings, and reading small files whole.
 */
#ifndef NVFP4MOE_CLI_MODEL_H
#define NVFP4MOE_CLI_MODEL_H

#include "cli.h"

/* Prints each warning to stderr as "nvfp4moe <cmd>: warning: ...". */
void cli_print_warnings(const char *cmd, const nvfp4moe_warnings *w);

/* select --model: cfg = the MoE config of dir/config.json, then the config flags of a applied
 * again on top (so flags override the model). An unquantized model gets a warning that the plan is
 * for the scheme the config ends with (W4A4 unless --scheme says otherwise). Prints the error and
 * returns -1 on failure. */
int cli_model_config(const char *cmd, const char *dir, const cli_args *a, nvfp4moe_config *cfg);

/* run --model: loads MoE layer `layer` (-1: the model's first MoE layer) of dir, prints its
 * warnings, and applies a's config flags on top of its config (flags that would change the
 * weights' shape, activation or bias layout are refused). *out is freed by the caller with
 * nvfp4moe_ckpt_layer_free; (*out)->layer.cfg holds the final config. Returns -1 after printing
 * the error. */
int cli_model_layer(const char *cmd, const char *dir, int layer, const cli_args *a, nvfp4moe_ckpt_layer **out);

/* Reads the whole regular file path (at most max bytes) into *buf (malloc'd, NUL-terminated),
 * *len its length. FIFOs, devices and directories are refused without blocking on them. Returns
 * -1 after printing an error naming flag and path. */
int cli_read_file(const char *cmd, const char *flag, const char *path, size_t max, char **buf, size_t *len);

#endif // NVFP4MOE_CLI_MODEL_H
