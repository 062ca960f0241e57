/*
 * weights.c - nvfp4moe_weights_validate: every tensor a config needs is there and every scale is
 * usable; and its pieces, which the CUDA backends reuse on device-resident weights.
 */
#include "core/internal.h"

#include <math.h>

nvfp4moe_status nvfp4moe_scale_nan_error(const char *name, uint8_t code, int64_t i, int64_t rows, int64_t kb) {
    return nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT,
                              "%s[expert %lld][row %lld][block %lld] is NaN (E4M3 code 0x%02X)", name,
                              (long long)(i / (rows * kb)), (long long)(i / kb % rows), (long long)(i % kb), code);
}

static nvfp4moe_status check_scales(const char *name, const uint8_t *sf, int64_t E, int64_t rows, int64_t kb) {
    for (int64_t i = 0; i < E * rows * kb; i++)
        if ((sf[i] & 0x7F) == 0x7F) return nvfp4moe_scale_nan_error(name, sf[i], i, rows, kb);
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_check_per_expert(const char *name, const float *v, int64_t E, bool positive) {
    for (int64_t e = 0; e < E; e++)
        if (!isfinite(v[e]) || (positive && !(v[e] > 0)))
            return nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT, "%s[expert %lld]=%g must be finite%s", name,
                                      (long long)e, (double)v[e], positive ? " and > 0" : "");
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_weights_validate(const nvfp4moe_config *cfg, const nvfp4moe_weights *w) {
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    NVFP4MOE_RETURN_IF(!w, NVFP4MOE_ERR_INVALID_ARGUMENT, "weights are NULL");
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    const struct { const void *p; const char *name; bool needed; } req[] = {
        {w->w13, "w13", true}, {w->w13_scale, "w13_scale", true}, {w->w13_scale_2, "w13_scale_2", true},
        {w->w2, "w2", true}, {w->w2_scale, "w2_scale", true}, {w->w2_scale_2, "w2_scale_2", true},
        {w->w13_input_scale, "w13_input_scale", cfg->scheme == NVFP4MOE_SCHEME_W4A4},
        {w->w2_input_scale, "w2_input_scale", cfg->scheme == NVFP4MOE_SCHEME_W4A4},
        {w->w13_bias, "w13_bias", cfg->has_bias}, {w->w2_bias, "w2_bias", cfg->has_bias},
        {w->correction_bias, "correction_bias", cfg->has_correction_bias},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        NVFP4MOE_RETURN_IF(req[i].needed && !req[i].p, NVFP4MOE_ERR_INVALID_ARGUMENT,
                           "weights.%s is NULL but the config needs it%s", req[i].name,
                           i >= 6 && i < 8 ? " (W4A4: the activation input scales)" : "");
    NVFP4MOE_TRY(nvfp4moe_check_per_expert("w13_scale_2", w->w13_scale_2, E, true));
    if (w->w13_up_scale_2) NVFP4MOE_TRY(nvfp4moe_check_per_expert("w13_up_scale_2", w->w13_up_scale_2, E, true));
    NVFP4MOE_TRY(nvfp4moe_check_per_expert("w2_scale_2", w->w2_scale_2, E, true));
    if (cfg->scheme == NVFP4MOE_SCHEME_W4A4) {
        NVFP4MOE_TRY(nvfp4moe_check_per_expert("w13_input_scale", w->w13_input_scale, E, true));
        NVFP4MOE_TRY(nvfp4moe_check_per_expert("w2_input_scale", w->w2_input_scale, E, true));
    }
    if (cfg->has_bias) {
        NVFP4MOE_TRY(nvfp4moe_check_per_expert("w13_bias", w->w13_bias, E * N1, false));
        NVFP4MOE_TRY(nvfp4moe_check_per_expert("w2_bias", w->w2_bias, E * H, false));
    }
    if (cfg->has_correction_bias)
        NVFP4MOE_TRY(nvfp4moe_check_per_expert("correction_bias", w->correction_bias, E, false));
    NVFP4MOE_TRY(check_scales("w13_scale", w->w13_scale, E, N1, H / 16));
    NVFP4MOE_TRY(check_scales("w2_scale", w->w2_scale, E, H, I / 16));
    return NVFP4MOE_OK;
}
