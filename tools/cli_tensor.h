/*
 * cli_tensor.h - tensors on the command line: `run --input / --router-logits / --topk-ids /
 * --topk-weights` read them, `run --output` writes them, `compare` reads two.
 *
 * A tensor file is a .safetensors file (the tensor by name, or its only tensor of the expected
 * rank; "FILE.safetensors:NAME" picks another) or anything else, read as raw little-endian values
 * of a dtype the caller states.
 */
#ifndef NVFP4MOE_CLI_TENSOR_H
#define NVFP4MOE_CLI_TENSOR_H

#include "cli.h"

typedef enum { CLI_TENSOR_FLOAT, CLI_TENSOR_INT } cli_tensor_kind;

typedef struct cli_tensor {
    char path[1024];          /* the file, without a ":NAME" */
    char name[256];           /* the tensor's name in a safetensors file; "" for a raw file */
    bool raw;
    nvfp4moe_st_dtype dtype;  /* as stored */
    int32_t ndim;
    int64_t shape[NVFP4MOE_ST_MAX_DIMS];
    int64_t numel;
    float *f;                 /* CLI_TENSOR_FLOAT: the values as float (NaN and Inf kept) */
    int64_t *i;               /* CLI_TENSOR_INT: the values */
    char meta[8][2][128];     /* a safetensors file's metadata (backend, kernel, ...), key/value */
    int nmeta;
} cli_tensor;

/* Reads spec (FILE or FILE.safetensors:NAME) for flag ("--router-logits"):
 *  - .safetensors: the tensor `name`, else the file's only tensor of rank `ndim` (0: any rank);
 *    float kinds accept F32, BF16, F16 and F64, int kinds I32, I64, I16, U8 and I8;
 *  - otherwise raw little-endian `raw_dtype` values (F32, BF16, F16 or I32), shaped
 *    [size / cols, cols] (cols > 0) or [n] (cols 0).
 * Returns -1 after a message naming flag, the file and the tensor. Free with cli_tensor_free. */
int cli_tensor_read(const char *flag, const char *spec, const char *name, int32_t ndim, int64_t cols,
                    cli_tensor_kind kind, nvfp4moe_st_dtype raw_dtype, cli_tensor *t);
void cli_tensor_free(cli_tensor *t);
/* Quiet: cli_tensor_read prints nothing (a tensor that may be missing). */
void cli_tensor_quiet(bool quiet);

/* Checks a 2-D shape [rows, cols] (rows < 0: any); prints "FLAG FILE: tensor "x" has shape [..],
 * expected [what]" and returns -1 otherwise. */
int cli_tensor_expect_2d(const cli_tensor *t, const char *flag, int64_t rows, int64_t cols, const char *what);

/* "tensor \"x\" of FILE" or "FILE" (raw) into buf, for messages. */
const char *cli_tensor_where(const cli_tensor *t, char *buf, size_t len);

/* The value a safetensors metadata key had, or NULL. */
const char *cli_tensor_meta(const cli_tensor *t, const char *key);

/* The safetensors dtype of a config dtype (BF16, F16, F32). */
nvfp4moe_st_dtype cli_st_dtype(nvfp4moe_dtype d);

#endif // NVFP4MOE_CLI_TENSOR_H
