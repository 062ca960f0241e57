/*
 * cli_model.c - model directories on the command line: config.json under the config flags,
 * checkpoint layers, whole small files. See cli_model.h.
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
