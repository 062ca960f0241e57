/*
 * cli_tensor.c - tensors read from files for the command line (see cli_tensor.h).
 */
#include "cli_tensor.h"
#include "cli_model.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool g_quiet;

void cli_tensor_quiet(bool quiet) { g_quiet = quiet; }

/* Every message of this file: to stderr unless quiet. */
#define MSG(...) (g_quiet ? (void)0 : (void)fprintf(stderr, __VA_ARGS__))

nvfp4moe_st_dtype cli_st_dtype(nvfp4moe_dtype d) {
    return d == NVFP4MOE_DTYPE_BF16 ? NVFP4MOE_ST_BF16 : d == NVFP4MOE_DTYPE_FP16 ? NVFP4MOE_ST_F16 : NVFP4MOE_ST_F32;
}

const char *cli_tensor_where(const cli_tensor *t, char *buf, size_t len) {
    if (t->raw) snprintf(buf, len, "%s", t->path);
    else snprintf(buf, len, "tensor \"%s\" of %s", t->name, t->path);
    return buf;
}

const char *cli_tensor_meta(const cli_tensor *t, const char *key) {
    for (int i = 0; i < t->nmeta; i++)
        if (!strcmp(t->meta[i][0], key)) return t->meta[i][1];
    return NULL;
}

void cli_tensor_free(cli_tensor *t) {
    if (!t) return;
    free(t->f);
    free(t->i);
    t->f = NULL;
    t->i = NULL;
}

static bool accepted(nvfp4moe_st_dtype d, cli_tensor_kind kind) {
    if (kind == CLI_TENSOR_FLOAT)
        return d == NVFP4MOE_ST_F32 || d == NVFP4MOE_ST_BF16 || d == NVFP4MOE_ST_F16 || d == NVFP4MOE_ST_F64;
    return d == NVFP4MOE_ST_I32 || d == NVFP4MOE_ST_I64 || d == NVFP4MOE_ST_I16 || d == NVFP4MOE_ST_U8 ||
           d == NVFP4MOE_ST_I8;
}

/* Little-endian bytes of n values of dtype d into t's float or int values. */
static void convert(const uint8_t *b, int64_t n, nvfp4moe_st_dtype d, cli_tensor *t) {
    for (int64_t k = 0; k < n; k++) {
        const uint8_t *p = b + (size_t)k * (size_t)(nvfp4moe_st_dtype_bits(d) / 8);
        uint64_t u = 0;
        for (int j = nvfp4moe_st_dtype_bits(d) / 8 - 1; j >= 0; j--) u = (u << 8) | p[j];
        switch (d) {
        case NVFP4MOE_ST_F32: {
            uint32_t w = (uint32_t)u;
            float v;
            memcpy(&v, &w, 4);
            t->f[k] = v;
            break;
        }
        case NVFP4MOE_ST_F64: {
            double v;
            memcpy(&v, &u, 8);
            t->f[k] = (float)v;
            break;
        }
        case NVFP4MOE_ST_BF16: t->f[k] = nvfp4moe_bf16_to_float((uint16_t)u); break;
        case NVFP4MOE_ST_F16: t->f[k] = nvfp4moe_fp16_to_float((uint16_t)u); break;
        case NVFP4MOE_ST_I64: t->i[k] = (int64_t)u; break;
        case NVFP4MOE_ST_I32: t->i[k] = (int32_t)(uint32_t)u; break;
        case NVFP4MOE_ST_I16: t->i[k] = (int16_t)(uint16_t)u; break;
        case NVFP4MOE_ST_I8: t->i[k] = (int8_t)(uint8_t)u; break;
        case NVFP4MOE_ST_U8: t->i[k] = (uint8_t)u; break;
        default: break;
        }
    }
}

static int alloc_values(const char *flag, cli_tensor *t, cli_tensor_kind kind) {
    const size_t n = (size_t)(t->numel ? t->numel : 1);
    if (kind == CLI_TENSOR_FLOAT) t->f = malloc(sizeof(float) * n);
    else t->i = malloc(sizeof(int64_t) * n);
    if (kind == CLI_TENSOR_FLOAT ? !t->f : !t->i) {
        MSG("%s: %s %s: out of memory for %lld values\n", cli_cmd_name(), flag, t->path,
                (long long)t->numel);
        return -1;
    }
    return 0;
}

static bool is_safetensors(const char *p) {
    const size_t n = strlen(p);
    return n >= 12 && !strcmp(p + n - 12, ".safetensors");
}

static int read_safetensors(const char *flag, const char *name, int32_t ndim, cli_tensor_kind kind, cli_tensor *t) {
    const char *cmd = cli_cmd_name();
    nvfp4moe_st_file *f = NULL;
    if (nvfp4moe_st_open(t->path, &f) != NVFP4MOE_OK) {
        MSG("%s: %s: %s\n", cmd, flag, nvfp4moe_last_error());
        return -1;
    }
    const nvfp4moe_st_tensor *st = name ? nvfp4moe_st_file_find(f, name) : NULL;
    int candidates = 0;
    if (!st && !t->name[0]) {   /* no tensor of that name: the only one of the rank asked for */
        for (size_t k = 0; k < nvfp4moe_st_file_count(f); k++) {
            const nvfp4moe_st_tensor *c = nvfp4moe_st_file_tensor(f, k);
            if ((ndim == 0 || c->ndim == ndim) && candidates++ == 0) st = c;
        }
        if (candidates > 1) st = NULL;
    }
    int rc = -1;
    if (!st) {
        if (t->name[0])
            MSG("%s: %s %s: no tensor \"%s\" in the file\n", cmd, flag, t->path, t->name);
        else if (candidates > 1 && ndim)
            MSG("%s: %s %s: no tensor \"%s\", and %d tensors of rank %d: name one as %s:NAME\n", cmd,
                    flag, t->path, name ? name : "", candidates, ndim, t->path);
        else if (candidates > 1)
            MSG("%s: %s %s: no tensor \"%s\", and %d others: name one as %s:NAME\n", cmd, flag,
                    t->path, name ? name : "", candidates, t->path);
        else if (ndim)
            MSG("%s: %s %s: no tensor \"%s\" (nor any other of rank %d)\n", cmd, flag, t->path,
                    name ? name : "", ndim);
        else
            MSG("%s: %s %s: no tensor \"%s\", nor any other\n", cmd, flag, t->path, name ? name : "");
        goto out;
    }
    snprintf(t->name, sizeof t->name, "%s", st->name);
    if (!accepted(st->dtype, kind)) {
        MSG("%s: %s %s: tensor \"%s\" is %s; expected %s\n", cmd, flag, t->path, st->name,
                nvfp4moe_st_dtype_name(st->dtype),
                kind == CLI_TENSOR_FLOAT ? "F32, BF16, F16 or F64" : "I32, I64, I16, I8 or U8");
        goto out;
    }
    t->dtype = st->dtype;
    t->ndim = st->ndim;
    memcpy(t->shape, st->shape, sizeof t->shape);
    t->numel = st->numel;
    if (alloc_values(flag, t, kind) != 0) goto out;
    // Read (not through the mapping, which may be unaligned and SIGBUS on a truncated file).
    uint8_t *tmp = malloc((size_t)st->nbytes + 1);
    if (!tmp) {
        MSG("%s: %s %s: out of memory\n", cmd, flag, t->path);
        goto out;
    }
    if (nvfp4moe_st_tensor_read(st, 0, st->nbytes, tmp) != NVFP4MOE_OK) {
        MSG("%s: %s: %s\n", cmd, flag, nvfp4moe_last_error());
        free(tmp);
        goto out;
    }
    convert(tmp, st->numel, st->dtype, t);
    free(tmp);
    static const char *const keys[] = {"backend", "kernel", "device", "config", "model", "layer", "dtype", "producer"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0] && t->nmeta < 8; k++) {
        const char *v = nvfp4moe_st_file_metadata(f, keys[k]);
        if (!v) continue;
        snprintf(t->meta[t->nmeta][0], sizeof t->meta[0][0], "%s", keys[k]);
        snprintf(t->meta[t->nmeta][1], sizeof t->meta[0][1], "%s", v);
        t->nmeta++;
    }
    rc = 0;
out:
    nvfp4moe_st_close(f);
    return rc;
}

int cli_tensor_read(const char *flag, const char *spec, const char *name, int32_t ndim, int64_t cols,
                    cli_tensor_kind kind, nvfp4moe_st_dtype raw_dtype, cli_tensor *t) {
    const char *cmd = cli_cmd_name();
    memset(t, 0, sizeof *t);
    if (snprintf(t->path, sizeof t->path, "%s", spec) >= (int)sizeof t->path) {
        MSG("%s: %s: the path is too long\n", cmd, flag);
        return -1;
    }
    /* FILE.safetensors:NAME, unless a file has that whole name */
    struct stat sb;
    char *colon = strrchr(t->path, ':');
    if (colon && stat(t->path, &sb) != 0) {
        *colon = '\0';
        if (is_safetensors(t->path) && colon[1]) {
            snprintf(t->name, sizeof t->name, "%s", colon + 1);
        } else {
            *colon = ':';
        }
    }
    int rc;
    if (is_safetensors(t->path)) {
        rc = read_safetensors(flag, t->name[0] ? t->name : name, ndim, kind, t);
    } else {
        t->raw = true;
        t->dtype = raw_dtype;
        const size_t esz = (size_t)nvfp4moe_st_dtype_bits(raw_dtype) / 8;
        char *buf = NULL;
        size_t size = 0;
        const char *sub = strncmp(cmd, "nvfp4moe ", 9) ? cmd : cmd + 9;
        if (cli_read_file(sub, flag, t->path, (size_t)1 << 36, &buf, &size) != 0) return -1;
        const size_t row = esz * (size_t)(cols > 0 ? cols : 1);
        if (size == 0 || size % row) {
            if (cols > 0)
                MSG("%s: %s %s: %zu bytes is not a whole number of rows of %lld %s values (a raw "
                        "file holds little-endian %s; use a .safetensors file for other dtypes)\n", cmd, flag,
                        t->path, size, (long long)cols, nvfp4moe_st_dtype_name(raw_dtype),
                        nvfp4moe_st_dtype_name(raw_dtype));
            else
                MSG("%s: %s %s: %zu bytes is not a whole number of %s values\n", cmd, flag, t->path,
                        size, nvfp4moe_st_dtype_name(raw_dtype));
            free(buf);
            return -1;
        }
        t->numel = (int64_t)(size / esz);
        t->ndim = cols > 0 ? 2 : 1;
        t->shape[0] = cols > 0 ? (int64_t)(size / row) : t->numel;
        t->shape[1] = cols;
        rc = alloc_values(flag, t, kind);
        if (rc == 0) convert((const uint8_t *)buf, t->numel, raw_dtype, t);
        free(buf);
    }
    if (rc != 0) cli_tensor_free(t);
    return rc;
}

int cli_tensor_expect_2d(const cli_tensor *t, const char *flag, int64_t rows, int64_t cols, const char *what) {
    if (t->ndim == 2 && (rows < 0 || t->shape[0] == rows) && t->shape[1] == cols) return 0;
    char where[1400], shape[160] = "";
    size_t used = 0;
    for (int d = 0; d < t->ndim && used < sizeof shape; d++)
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    MSG("%s: %s: %s has shape [%s], expected %s\n", cli_cmd_name(), flag,
            cli_tensor_where(t, where, sizeof where), shape, what);
    return -1;
}
