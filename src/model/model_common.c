/*
 * model_common.c - what the model directory readers and writers share: collected warnings, small
 * text files, the checkpoint format names, and the module name the router is written under.
 */
#include "model/model.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ---- warnings and text files ----

void nvfp4moe_warn(nvfp4moe_warnings *w, const char *fmt, ...) {
    if (w->count >= NVFP4MOE_MAX_WARNINGS) {
        w->dropped++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->text[w->count], sizeof w->text[0], fmt, ap);
    va_end(ap);
    w->count++;
}

nvfp4moe_status nvfp4moe_read_text_file(const char *path, size_t max_bytes, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return nvfp4moe_set_error(errno == ENOENT ? NVFP4MOE_ERR_NOT_FOUND : NVFP4MOE_ERR_IO,
                                  "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    nvfp4moe_status s = NVFP4MOE_OK;
    while (buf) {
        if (n + 1 >= cap) {
            if (cap > max_bytes) {
                s = nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT, "%s: larger than %zu bytes", path,
                                       max_bytes);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: read failed", path);
            break;
        }
    }
    fclose(f);
    if (!buf) return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    if (s != NVFP4MOE_OK) {
        free(buf);
        return s;
    }
    buf[n] = '\0';
    *out = buf;
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_write_text_file(const char *path, const char *text) {
    size_t plen = strlen(path) + 8;
    char *tmp = malloc(plen);
    NVFP4MOE_RETURN_IF(!tmp, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    snprintf(tmp, plen, "%s.tmp", path);
    nvfp4moe_status s = NVFP4MOE_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        size_t n = strlen(text);
        bool ok = fwrite(text, 1, n, f) == n;
        ok = (fclose(f) == 0) && ok;
        if (!ok || rename(tmp, path) != 0) {
            s = nvfp4moe_set_error(NVFP4MOE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
            remove(tmp);
        }
    }
    free(tmp);
    return s;
}

// ---- formats ----

static const char *const k_format_names[NVFP4MOE_CKPT_FORMAT_COUNT] = {
    [NVFP4MOE_CKPT_UNQUANTIZED] = "unquantized",
    [NVFP4MOE_CKPT_MODELOPT] = "modelopt",
    [NVFP4MOE_CKPT_MODELOPT_FUSED] = "modelopt-fused",
    [NVFP4MOE_CKPT_COMPRESSED_TENSORS] = "compressed-tensors",
};

const char *nvfp4moe_ckpt_format_name(nvfp4moe_ckpt_format f) {
    return (unsigned)f < NVFP4MOE_CKPT_FORMAT_COUNT ? k_format_names[f] : "?";
}

nvfp4moe_status nvfp4moe_ckpt_format_parse(const char *s, nvfp4moe_ckpt_format *out) {
    NVFP4MOE_RETURN_IF(!s || !out, NVFP4MOE_ERR_INVALID_ARGUMENT, "ckpt_format_parse: NULL");
    for (int i = 0; i < NVFP4MOE_CKPT_FORMAT_COUNT; i++) {
        if (!strcasecmp(s, k_format_names[i])) {
            *out = (nvfp4moe_ckpt_format)i;
            return NVFP4MOE_OK;
        }
    }
    if (!strcasecmp(s, "ct") || !strcasecmp(s, "nvfp4-pack-quantized")) {
        *out = NVFP4MOE_CKPT_COMPRESSED_TENSORS;
        return NVFP4MOE_OK;
    }
    return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                              "unknown checkpoint format '%s' (expected one of: unquantized, "
                              "modelopt, modelopt-fused, compressed-tensors)",
                              s);
}

// ---- names ----

/* The router's module name: the source's, or the one the layer's family uses. */
const char *nvfp4moe_ckpt_router_name(const char *name, const nvfp4moe_config *cfg) {
    if (name && (!strcmp(name, "gate") || !strcmp(name, "router"))) return name;
    // No source name (a random layer): the swigluoai activation is what makes a layer gpt-oss
    // (nvfp4moe_model_config_write writes model_type gpt_oss for it).
    return cfg && cfg->activation == NVFP4MOE_ACT_SWIGLUOAI ? "router" : "gate";
}
