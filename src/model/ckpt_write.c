/*
 * ckpt_write.c - a quantized or float layer's tensors into a safetensors writer, in the
 * ModelOpt or compressed-tensors layout, the router under the module name the source used.
 */
#include "model/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- writing ----


/* Adds one tensor named "<base><suffix>". */
static nvfp4moe_status put(nvfp4moe_st_writer *w, const char *base, const char *suffix,
                           nvfp4moe_st_dtype dt, int32_t ndim, const int64_t *shape,
                           const void *data) {
    char name[320];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    return nvfp4moe_st_writer_add(w, name, dt, ndim, shape, data);
}

static nvfp4moe_status put_f32(nvfp4moe_st_writer *w, const char *base, const char *suffix,
                               int32_t ndim, int64_t n, float v) {
    int64_t shape[1] = {n};
    return put(w, base, suffix, NVFP4MOE_ST_F32, ndim, shape, &v);
}

static nvfp4moe_status put_bf16(nvfp4moe_st_writer *w, const char *base, const char *suffix,
                                int32_t ndim, const int64_t *shape, const float *x, int64_t n) {
    uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    NVFP4MOE_RETURN_IF(!b, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < n; i++) b[i] = nvfp4moe_bf16_from_float(x[i]);
    nvfp4moe_status s = put(w, base, suffix, NVFP4MOE_ST_BF16, ndim, shape, b);
    free(b);
    return s;
}

/* One quantized projection of one expert: rows of w13 (half 0/1) or w2 (half -1). */
static nvfp4moe_status put_proj(nvfp4moe_st_writer *w, const char *base, const nvfp4moe_config *cfg,
                                const nvfp4moe_weights *wt, int32_t e, int half, const char *proj,
                                bool ct, uint8_t *bw, uint8_t *bs, float *bb) {
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size, N1 = nvfp4moe_config_n1(cfg);
    const int64_t rows = half < 0 ? H : I, cols = half < 0 ? I : H;
    for (int64_t r = 0; r < rows; r++) {
        int64_t sr = half < 0 ? r : nvfp4moe_ckpt_w13_row(cfg, half, r);
        const uint8_t *sw = half < 0 ? wt->w2 + ((int64_t)e * H + sr) * (I / 2)
                                     : wt->w13 + ((int64_t)e * N1 + sr) * (H / 2);
        const uint8_t *ss = half < 0 ? wt->w2_scale + ((int64_t)e * H + sr) * (I / 16)
                                     : wt->w13_scale + ((int64_t)e * N1 + sr) * (H / 16);
        memcpy(bw + r * (cols / 2), sw, (size_t)(cols / 2));
        memcpy(bs + r * (cols / 16), ss, (size_t)(cols / 16));
        if (cfg->has_bias)
            bb[r] = half < 0 ? wt->w2_bias[(int64_t)e * H + sr] : wt->w13_bias[(int64_t)e * N1 + sr];
    }
    char suf[160];
    int64_t dw[2] = {rows, cols / 2}, ds[2] = {rows, cols / 16};
    float s2 = half < 0 ? wt->w2_scale_2[e] : nvfp4moe_w13_half_scale_2(wt, e, half);
    const float *ins = half < 0 ? wt->w2_input_scale : wt->w13_input_scale;
    snprintf(suf, sizeof suf, "experts.%d.%s.%s", e, proj, ct ? "weight_packed" : "weight");
    NVFP4MOE_TRY(put(w, base, suf, NVFP4MOE_ST_U8, 2, dw, bw));
    snprintf(suf, sizeof suf, "experts.%d.%s.weight_scale", e, proj);
    NVFP4MOE_TRY(put(w, base, suf, NVFP4MOE_ST_F8_E4M3, 2, ds, bs));
    // ModelOpt stores 0-d scalars in the dequantization form; compressed-tensors [1]-shaped
    // reciprocals.
    snprintf(suf, sizeof suf, "experts.%d.%s.%s", e, proj, ct ? "weight_global_scale" : "weight_scale_2");
    NVFP4MOE_TRY(put_f32(w, base, suf, ct ? 1 : 0, 1, ct ? 1.0f / s2 : s2));
    if (ins && cfg->scheme != NVFP4MOE_SCHEME_W4A16) {
        snprintf(suf, sizeof suf, "experts.%d.%s.%s", e, proj, ct ? "input_global_scale" : "input_scale");
        NVFP4MOE_TRY(put_f32(w, base, suf, ct ? 1 : 0, 1, ct ? 1.0f / ins[e] : ins[e]));
    }
    if (cfg->has_bias) {   // the Linear's own bias, unquantized: what proj_resolve reads back
        int64_t db[1] = {rows};
        snprintf(suf, sizeof suf, "experts.%d.%s.bias", e, proj);
        NVFP4MOE_TRY(put(w, base, suf, NVFP4MOE_ST_F32, 1, db, bb));
    }
    return NVFP4MOE_OK;
}

static nvfp4moe_status add_quantized(nvfp4moe_st_writer *w, nvfp4moe_ckpt_format fmt,
                                     const char *base, const nvfp4moe_ckpt_layer *q) {
    const nvfp4moe_config *cfg = &q->layer.cfg;
    const nvfp4moe_weights *wt = &q->layer.w;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    const bool w4a16 = cfg->scheme == NVFP4MOE_SCHEME_W4A16;
    NVFP4MOE_TRY(nvfp4moe_weights_validate(cfg, wt));
    if (fmt == NVFP4MOE_CKPT_MODELOPT_FUSED) {
        int64_t d13[3] = {E, N1, H / 2}, d13s[3] = {E, N1, H / 16};
        int64_t d2[3] = {E, H, I / 2}, d2s[3] = {E, H, I / 16}, de[1] = {E};
        NVFP4MOE_TRY(put(w, base, "experts.gate_up_proj", NVFP4MOE_ST_U8, 3, d13, wt->w13));
        NVFP4MOE_TRY(put(w, base, "experts.gate_up_proj_weight_scale", NVFP4MOE_ST_F8_E4M3, 3,
                         d13s, wt->w13_scale));
        // One global scale per expert ([E]), or per expert and half ([E, 2], gate then up) when the
        // halves have their own.
        bool halves = false;
        for (int64_t e = 0; e < E && wt->w13_up_scale_2 && nvfp4moe_activation_is_gated(cfg->activation); e++)
            halves |= wt->w13_up_scale_2[e] != wt->w13_scale_2[e];
        if (!halves) {
            NVFP4MOE_TRY(put(w, base, "experts.gate_up_proj_weight_scale_2", NVFP4MOE_ST_F32, 1, de,
                             wt->w13_scale_2));
        } else {
            float *pairs = malloc(sizeof(float) * (size_t)(2 * E));
            NVFP4MOE_RETURN_IF(!pairs, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
            for (int64_t e = 0; e < E; e++) pairs[2 * e] = wt->w13_scale_2[e], pairs[2 * e + 1] = wt->w13_up_scale_2[e];
            int64_t de2[2] = {E, 2};
            nvfp4moe_status s = put(w, base, "experts.gate_up_proj_weight_scale_2", NVFP4MOE_ST_F32, 2, de2, pairs);
            free(pairs);
            NVFP4MOE_TRY(s);
        }
        if (!w4a16 && wt->w13_input_scale)
            NVFP4MOE_TRY(put(w, base, "experts.gate_up_proj_input_scale", NVFP4MOE_ST_F32, 1, de,
                             wt->w13_input_scale));
        NVFP4MOE_TRY(put(w, base, "experts.down_proj", NVFP4MOE_ST_U8, 3, d2, wt->w2));
        NVFP4MOE_TRY(put(w, base, "experts.down_proj_weight_scale", NVFP4MOE_ST_F8_E4M3, 3, d2s,
                         wt->w2_scale));
        NVFP4MOE_TRY(put(w, base, "experts.down_proj_weight_scale_2", NVFP4MOE_ST_F32, 1, de,
                         wt->w2_scale_2));
        if (!w4a16 && wt->w2_input_scale)
            NVFP4MOE_TRY(put(w, base, "experts.down_proj_input_scale", NVFP4MOE_ST_F32, 1, de,
                             wt->w2_input_scale));
        if (cfg->has_bias) {
            int64_t b1[2] = {E, N1}, b2[2] = {E, H};
            NVFP4MOE_TRY(put(w, base, "experts.gate_up_proj_bias", NVFP4MOE_ST_F32, 2, b1,
                             wt->w13_bias));
            NVFP4MOE_TRY(put(w, base, "experts.down_proj_bias", NVFP4MOE_ST_F32, 2, b2,
                             wt->w2_bias));
        }
        return NVFP4MOE_OK;
    }
    const bool ct = fmt == NVFP4MOE_CKPT_COMPRESSED_TENSORS;
    const int64_t big = NVFP4MOE_MAX(I * H, H * I);
    uint8_t *bw = malloc((size_t)(big / 2)), *bs = malloc((size_t)(big / 16));
    float *bb = malloc(sizeof(float) * (size_t)NVFP4MOE_MAX(I, H));
    nvfp4moe_status s = bw && bs && bb ? NVFP4MOE_OK
                                       : nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY,
                                                            "out of memory");
    const bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    for (int32_t e = 0; e < E && s == NVFP4MOE_OK; e++) {
        if (gated) s = put_proj(w, base, cfg, wt, e, 0, "gate_proj", ct, bw, bs, bb);
        if (s == NVFP4MOE_OK) s = put_proj(w, base, cfg, wt, e, 1, "up_proj", ct, bw, bs, bb);
        if (s == NVFP4MOE_OK) s = put_proj(w, base, cfg, wt, e, -1, "down_proj", ct, bw, bs, bb);
    }
    free(bw);
    free(bs);
    free(bb);
    return s;
}

static nvfp4moe_status add_float(nvfp4moe_st_writer *w, const char *base,
                                 const nvfp4moe_float_layer *f) {
    const nvfp4moe_config *cfg = &f->cfg;
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size, N1 = nvfp4moe_config_n1(cfg);
    const bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    NVFP4MOE_RETURN_IF(cfg->has_bias != (f->w13_bias != NULL) || cfg->has_bias != (f->w2_bias != NULL),
                       NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "float layer: cfg.has_bias is %s but w13_bias is %s and w2_bias %s",
                       cfg->has_bias ? "set" : "not set", f->w13_bias ? "given" : "NULL",
                       f->w2_bias ? "given" : "NULL");
    float *buf = malloc(sizeof(float) * (size_t)(I * H));
    NVFP4MOE_RETURN_IF(!buf, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    nvfp4moe_status s = NVFP4MOE_OK;
    char suf[128];
    for (int32_t e = 0; e < cfg->num_experts && s == NVFP4MOE_OK; e++) {
        for (int half = gated ? 0 : 1; half < 2 && s == NVFP4MOE_OK; half++) {
            const char *proj = half ? "up_proj" : "gate_proj";
            for (int64_t r = 0; r < I; r++)
                memcpy(buf + r * H, f->w13 + ((int64_t)e * N1 + nvfp4moe_ckpt_w13_row(cfg, half, r)) * H,
                       sizeof(float) * (size_t)H);
            int64_t d[2] = {I, H}, db[1] = {I};
            snprintf(suf, sizeof suf, "experts.%d.%s.weight", e, proj);
            s = put_bf16(w, base, suf, 2, d, buf, I * H);
            if (s != NVFP4MOE_OK || !cfg->has_bias) continue;
            for (int64_t r = 0; r < I; r++)
                buf[r] = f->w13_bias[(int64_t)e * N1 + nvfp4moe_ckpt_w13_row(cfg, half, r)];
            snprintf(suf, sizeof suf, "experts.%d.%s.bias", e, proj);
            s = put_bf16(w, base, suf, 1, db, buf, I);
        }
        int64_t d2[2] = {H, I}, db2[1] = {H};
        snprintf(suf, sizeof suf, "experts.%d.down_proj.weight", e);
        if (s == NVFP4MOE_OK) s = put_bf16(w, base, suf, 2, d2, f->w2 + (int64_t)e * H * I, H * I);
        snprintf(suf, sizeof suf, "experts.%d.down_proj.bias", e);
        if (s == NVFP4MOE_OK && cfg->has_bias)
            s = put_bf16(w, base, suf, 1, db2, f->w2_bias + (int64_t)e * H, H);
    }
    free(buf);
    return s;
}

nvfp4moe_status nvfp4moe_ckpt_add_layer(nvfp4moe_st_writer *w, nvfp4moe_ckpt_format fmt,
                                        const char *prefix, int32_t index,
                                        const nvfp4moe_ckpt_layer *q,
                                        const nvfp4moe_float_layer *f) {
    NVFP4MOE_RETURN_IF(!w || index < 0, NVFP4MOE_ERR_INVALID_ARGUMENT, "ckpt_add_layer: bad argument");
    NVFP4MOE_RETURN_IF((unsigned)fmt >= NVFP4MOE_CKPT_FORMAT_COUNT, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "ckpt_add_layer: bad format %d", (int)fmt);
    const bool unq = fmt == NVFP4MOE_CKPT_UNQUANTIZED;
    NVFP4MOE_RETURN_IF(unq ? !f : !q, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "ckpt_add_layer: format %s needs a %s layer", nvfp4moe_ckpt_format_name(fmt),
                       unq ? "float" : "quantized");
    char base[160];
    snprintf(base, sizeof base, "%s.%d.mlp.", prefix ? prefix : "model.layers", index);
    const nvfp4moe_config *cfg = unq ? &f->cfg : &q->layer.cfg;
    const float *router = unq ? f->router : q->router;
    const float *rbias = unq ? f->router_bias : q->router_bias;
    const float *cbias = unq ? f->correction_bias : q->layer.w.correction_bias;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size;
    if (router) {
        // gpt-oss's loaders (HF, vLLM) look for mlp.router, the others for mlp.gate.
        const char *rname = nvfp4moe_ckpt_router_name(unq ? f->router_name : q->router_name, cfg);
        char suf[32];
        int64_t d[2] = {E, H}, db[1] = {E};
        snprintf(suf, sizeof suf, "%s.weight", rname);
        NVFP4MOE_TRY(put_bf16(w, base, suf, 2, d, router, E * H));
        snprintf(suf, sizeof suf, "%s.bias", rname);
        if (rbias) NVFP4MOE_TRY(put_bf16(w, base, suf, 1, db, rbias, E));
    }
    if (cfg->has_correction_bias && cbias) {
        int64_t d[1] = {E};
        NVFP4MOE_TRY(put(w, base, "gate.e_score_correction_bias", NVFP4MOE_ST_F32, 1, d, cbias));
    }
    return unq ? add_float(w, base, f) : add_quantized(w, fmt, base, q);
}
