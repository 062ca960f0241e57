/*
 * model_common.c - what the model directory readers and writers share: collected warnings, the
 * checkpoint format names, and the module name the router is written under.
 */
#include "model/model.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ---- warnings ----

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
