/*
 * cli_model.c - model directories on the command line: config.json under the config flags,
 * checkpoint layers, hidden states from files. See cli_model.h.
 */
#include "cli_model.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void cli_print_warnings(const char *cmd, const nvfp4moe_warnings *w) {
    for (int32_t i = 0; i < w->count; i++) fprintf(stderr, "nvfp4moe %s: warning: %s\n", cmd, w->text[i]);
    if (w->dropped) fprintf(stderr, "nvfp4moe %s: warning: ... and %d more\n", cmd, w->dropped);
}

int cli_model_config(const char *cmd, const char *dir, const cli_args *a, nvfp4moe_config *cfg) {
    nvfp4moe_model_info *info = NULL;
    if (nvfp4moe_model_info_read(dir, &info) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe %s: --model: %s\n", cmd, nvfp4moe_last_error());
        return -1;
    }
    if (info->num_moe_layers == 0) {
        fprintf(stderr, "nvfp4moe %s: --model: %s has no MoE layers (no expert count in config.json)\n",
                cmd, dir);
        nvfp4moe_model_info_free(info);
        return -1;
    }
    cli_print_warnings(cmd, &info->warnings);
    *cfg = info->cfg;
    const bool quantized = info->quantized;
    nvfp4moe_model_info_free(info);
    if (cli_config_apply(a, cfg) != 0) return -1;
    if (!quantized)
        fprintf(stderr, "nvfp4moe %s: warning: %s is not quantized (no NVFP4 quantization config): planning %s, "
                "as for an NVFP4 checkpoint made from it by nvfp4moe quantize --in %s --out DIR%s\n", cmd, dir,
                nvfp4moe_scheme_name(cfg->scheme), dir,
                cli_config_given(a, "--scheme") ? "" : " (--scheme w4a16 plans weight-only NVFP4)");
    return 0;
}

int cli_model_layer(const char *cmd, const char *dir, int layer, const cli_args *a, nvfp4moe_ckpt_layer **out) {
    if (layer < 0) {
        nvfp4moe_model_info *info = NULL;
        if (nvfp4moe_model_info_read(dir, &info) != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe %s: --model: %s\n", cmd, nvfp4moe_last_error());
            return -1;
        }
        layer = info->first_moe_layer;
        nvfp4moe_model_info_free(info);
        if (layer < 0) {
            fprintf(stderr, "nvfp4moe %s: --model: %s has no MoE layers\n", cmd, dir);
            return -1;
        }
    }
    nvfp4moe_ckpt_layer *l = NULL;
    if (nvfp4moe_ckpt_layer_load(dir, layer, &l) != NVFP4MOE_OK) {
        fprintf(stderr, "nvfp4moe %s: --model: %s\n", cmd, nvfp4moe_last_error());
        return -1;
    }
    cli_print_warnings(cmd, &l->warnings);
    nvfp4moe_config cfg = l->layer.cfg;
    if (cli_config_apply(a, &cfg) != 0) {
        nvfp4moe_ckpt_layer_free(l);
        return -1;
    }
    // The weights fix these; a flag that changes them would describe a different layer.
    const nvfp4moe_config *w = &l->layer.cfg;
    const char *bad = cfg.num_experts != w->num_experts             ? "--num-experts"
                      : cfg.hidden_size != w->hidden_size           ? "--hidden-size"
                      : cfg.intermediate_size != w->intermediate_size ? "--intermediate-size"
                      : nvfp4moe_config_n1(&cfg) != nvfp4moe_config_n1(w) ? "--activation"
                      : cfg.has_bias != w->has_bias                 ? "the bias flag"
                                                                    : NULL;
    if (bad) {
        fprintf(stderr, "nvfp4moe %s: %s conflicts with the checkpoint's layer %d (%s)\n", cmd, bad,
                layer, dir);
        nvfp4moe_ckpt_layer_free(l);
        return -1;
    }
    if (cfg.has_correction_bias && !w->has_correction_bias) {
        fprintf(stderr, "nvfp4moe %s: layer %d of %s has no e_score_correction_bias\n", cmd, layer, dir);
        nvfp4moe_ckpt_layer_free(l);
        return -1;
    }
    l->layer.cfg = cfg;
    if (!cfg.has_correction_bias) l->layer.w.correction_bias = NULL;
    *out = l;
    return 0;
}

int cli_read_hidden(const char *cmd, const char *path, int64_t hidden_size, float **x, int64_t *m) {
    size_t n = strlen(path);
    if (n > 12 && !strcmp(path + n - 12, ".safetensors")) {
        nvfp4moe_st_file *f = NULL;
        if (nvfp4moe_st_open(path, &f) != NVFP4MOE_OK) {
            fprintf(stderr, "nvfp4moe %s: --input: %s\n", cmd, nvfp4moe_last_error());
            return -1;
        }
        const nvfp4moe_st_tensor *t = nvfp4moe_st_file_find(f, "hidden_states");
        for (size_t i = 0; !t && i < nvfp4moe_st_file_count(f); i++) {
            const nvfp4moe_st_tensor *c = nvfp4moe_st_file_tensor(f, i);
            if (c->ndim == 2) {
                if (t) break;
                t = c;
            }
        }
        int rc = -1;
        if (!t || t->ndim != 2 || t->shape[1] != hidden_size ||
            (t->dtype != NVFP4MOE_ST_F32 && t->dtype != NVFP4MOE_ST_BF16 && t->dtype != NVFP4MOE_ST_F16)) {
            fprintf(stderr, "nvfp4moe %s: --input %s: needs a tensor \"hidden_states\" (or one 2-D tensor) "
                    "of shape [M, %lld] and dtype F32, BF16 or F16\n", cmd, path, (long long)hidden_size);
        } else if (!(*x = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1)))) {
            fprintf(stderr, "nvfp4moe %s: out of memory\n", cmd);
        } else {
            const nvfp4moe_dtype dt = t->dtype == NVFP4MOE_ST_F32   ? NVFP4MOE_DTYPE_F32
                                      : t->dtype == NVFP4MOE_ST_BF16 ? NVFP4MOE_DTYPE_BF16
                                                                    : NVFP4MOE_DTYPE_FP16;
            // Read (not through the mapping, which may be unaligned and SIGBUS on a truncated file).
            void *tmp = malloc((size_t)t->nbytes + 1);
            nvfp4moe_status s = tmp ? nvfp4moe_st_tensor_read(t, 0, t->nbytes, tmp) : NVFP4MOE_ERR_OUT_OF_MEMORY;
            if (s == NVFP4MOE_OK) {
                nvfp4moe_to_float(dt, tmp, t->numel, *x);
                *m = t->shape[0];
                rc = 0;
            } else {
                free(*x);
                *x = NULL;
                fprintf(stderr, "nvfp4moe %s: --input: %s\n", cmd, tmp ? nvfp4moe_last_error() : "out of memory");
            }
            free(tmp);
        }
        nvfp4moe_st_close(f);
        return rc;
    }
    char *buf = NULL;
    size_t size = 0;
    if (cli_read_file(cmd, "--input", path, (size_t)1 << 36, &buf, &size) != 0) return -1;
    const size_t row = (size_t)(4 * hidden_size);
    if (hidden_size <= 0 || size == 0 || size % row) {
        fprintf(stderr, "nvfp4moe %s: --input %s: %zu bytes is not a whole number of float32 rows of "
                "hidden size %lld (use a .safetensors file for other dtypes)\n", cmd, path, size,
                (long long)hidden_size);
        free(buf);
        return -1;
    }
    *x = (float *)(void *)buf;   // malloc'd: aligned for float
    *m = (int64_t)(size / row);
    return 0;
}

int cli_read_file(const char *cmd, const char *flag, const char *path, size_t max, char **buf, size_t *len) {
    // O_NONBLOCK: a FIFO would block the open until a writer came; fstat then refuses it.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    const char *why = fd < 0 ? strerror(errno) : fstat(fd, &st) != 0 ? strerror(errno)
                      : !S_ISREG(st.st_mode)                          ? "not a regular file"
                      : (uint64_t)st.st_size > max                    ? "too large"
                                                                      : NULL;
    char *b = why ? NULL : malloc((size_t)st.st_size + 1);
    size_t n = 0;
    while (b && n < (size_t)st.st_size) {   // the file may shrink meanwhile: stop at its end
        ssize_t r = read(fd, b + n, (size_t)st.st_size - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r < 0) why = strerror(errno);
            break;
        }
        n += (size_t)r;
    }
    if (!why && !b) why = "out of memory";
    if (fd >= 0) close(fd);
    if (why) {
        fprintf(stderr, "nvfp4moe %s: %s %s: %s\n", cmd, flag, path, why);
        free(b);
        return -1;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}
