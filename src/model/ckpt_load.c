/*
 * ckpt_load.c - NVFP4 MoE layers from model directories: ModelOpt per-expert tensors, ModelOpt
 * fused 3-D experts, compressed-tensors nvfp4-pack-quantized.
 *
 * Loading resolves every tensor an expert needs, checks its dtype and shape against the config
 * before a byte is copied, and converts everything into the canonical layout of nvfp4moe_weights
 * (scale_2 in the dequantization form, w13 rows gate then up). Warnings are collected, never
 * printed.
 */
#include "model/ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- gate and up global scales ----

/* Keeps each half's global scale exactly (w13_scale_2 the gate's, w13_up_scale_2 the up's), block
 * scales untouched; counts the experts where they differ for the warning. Input scales: one per
 * expert, since GEMM1 quantizes its input once: max over gate/up, as vLLM does. */
static void keep_scales(load_ctx *c, int32_t e, float s_gate, float s_up, float in_gate, float in_up) {
    ckpt_storage *st = c->st;
    if (s_gate != s_up && c->n_differ++ == 0) c->first_differ = e, c->first_g = s_gate, c->first_u = s_up;
    if (in_gate != in_up) c->n_input_differ++;
    if (!c->check_only) {
        st->w13_scale_2[e] = s_gate;
        if (st->w13_up_scale_2) st->w13_up_scale_2[e] = s_up;
        if (st->w13_input_scale) st->w13_input_scale[e] = in_gate > in_up ? in_gate : in_up;
    }
}

static void scale_warnings(load_ctx *c) {
    const int32_t E = c->cfg.num_experts;
    if (c->n_differ) {
        nvfp4moe_warn(c->warn,
                      "layer %d: %d of %d experts have different gate and up global scales (first: "
                      "expert %d, gate weight_scale_2 %g, up %g): nvfp4moe applies each half's own; "
                      "vLLM's loader keeps the gate's for both and mis-scales the up half",
                      c->layer, c->n_differ, E, c->first_differ, (double)c->first_g, (double)c->first_u);
    }
    if (c->n_input_differ && c->cfg.scheme != NVFP4MOE_SCHEME_W4A16) {
        nvfp4moe_warn(c->warn,
                      "layer %d: %d of %d experts have different gate and up input scales: using "
                      "the larger (max over gate/up), as vLLM does",
                      c->layer, c->n_input_differ, E);
    }
}

// ---- per-expert projections ----

typedef struct {
    const nvfp4moe_st_tensor *w, *s, *s2, *in, *bias;
    float scale_2, input_scale;
} proj_view;

/* Resolves and checks experts.E.<proj>.* for a [rows, cols] projection. */
static nvfp4moe_status proj_resolve(load_ctx *c, int32_t e, const char *proj, int64_t rows,
                                    int64_t cols, bool ct, proj_view *v) {
    char suf[160];
    const bool w4a16 = c->cfg.scheme == NVFP4MOE_SCHEME_W4A16;
    nvfp4moe_ckpt_expert_suffix(c, e, proj, ct ? "weight_packed" : "weight", suf, sizeof suf);
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, suf, &v->w));
    nvfp4moe_ckpt_expert_suffix(c, e, proj, "weight_scale", suf, sizeof suf);
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, suf, &v->s));
    nvfp4moe_ckpt_expert_suffix(c, e, proj, ct ? "weight_global_scale" : "weight_scale_2", suf, sizeof suf);
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, suf, &v->s2));
    nvfp4moe_ckpt_expert_suffix(c, e, proj, ct ? "input_global_scale" : "input_scale", suf, sizeof suf);
    v->in = NULL;
    if (!w4a16) NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, suf, &v->in));
    nvfp4moe_ckpt_expert_suffix(c, e, proj, "bias", suf, sizeof suf);
    v->bias = nvfp4moe_ckpt_maybe(c, suf);

    NVFP4MOE_TRY(nvfp4moe_ckpt_want_dtype(v->w, NVFP4MOE_ST_U8, NVFP4MOE_ST_U8));
    NVFP4MOE_TRY(nvfp4moe_ckpt_want_dtype(v->s, NVFP4MOE_ST_F8_E4M3, NVFP4MOE_ST_U8));
    char want[96];
    int64_t dw[2] = {rows, cols / 2}, ds[2] = {rows, cols / 16};
    snprintf(want, sizeof want, "[%lld, %lld] (packed E2M1)", (long long)rows, (long long)cols / 2);
    if (!nvfp4moe_ckpt_shape_is(v->w, 2, dw)) return nvfp4moe_ckpt_bad_shape(v->w, want);
    snprintf(want, sizeof want, "[%lld, %lld] (one E4M3 scale per 16)", (long long)rows,
             (long long)cols / 16);
    if (!nvfp4moe_ckpt_shape_is(v->s, 2, ds)) return nvfp4moe_ckpt_bad_shape(v->s, want);
    NVFP4MOE_TRY(nvfp4moe_ckpt_check_scales(v->s));
    float x;
    NVFP4MOE_TRY(nvfp4moe_ckpt_scalar(v->s2, &x));
    NVFP4MOE_TRY(nvfp4moe_ckpt_global_scale(v->s2, x, ct, &v->scale_2));
    v->input_scale = 0;
    if (v->in) {
        NVFP4MOE_TRY(nvfp4moe_ckpt_scalar(v->in, &x));
        NVFP4MOE_TRY(nvfp4moe_ckpt_global_scale(v->in, x, ct, &v->input_scale));
    }
    if (v->bias) {
        NVFP4MOE_RETURN_IF(!nvfp4moe_ckpt_is_float_dtype(v->bias->dtype), NVFP4MOE_ERR_FORMAT,
                           "%s: tensor '%s': dtype %s, expected a float type", v->bias->file,
                           v->bias->name, nvfp4moe_st_dtype_name(v->bias->dtype));
        int64_t db[1] = {rows};
        snprintf(want, sizeof want, "[%lld]", (long long)rows);
        if (!nvfp4moe_ckpt_shape_is(v->bias, 1, db)) return nvfp4moe_ckpt_bad_shape(v->bias, want);
        NVFP4MOE_TRY(nvfp4moe_ckpt_check_finite(v->bias));
    }
    return NVFP4MOE_OK;
}

/* Copies a resolved projection into canonical w13 (half 0/1) or w2 (half -1): its rows land at
 * first, first + step, ... (step 2 for gpt-oss's interleaved gate/up). */
static nvfp4moe_status proj_copy(load_ctx *c, int32_t e, int half, const proj_view *v, int64_t rows,
                                 int64_t cols) {
    ckpt_storage *st = c->st;
    const int64_t N1 = nvfp4moe_config_n1(&c->cfg);
    const int64_t first = half < 0 ? 0 : nvfp4moe_ckpt_w13_row(&c->cfg, half, 0);
    const int64_t step = half < 0 ? 1 : nvfp4moe_ckpt_w13_row(&c->cfg, half, 1) - first;
    const int64_t row0 = (half < 0 ? (int64_t)e * rows : (int64_t)e * N1) + first;
    uint8_t *dw = (half < 0 ? st->w2 : st->w13) + row0 * (cols / 2);
    uint8_t *ds = (half < 0 ? st->w2_scale : st->w13_scale) + row0 * (cols / 16);
    NVFP4MOE_TRY(nvfp4moe_ckpt_read_rows(v->w, rows, cols / 2, dw, step * (cols / 2)));
    NVFP4MOE_TRY(nvfp4moe_ckpt_read_rows(v->s, rows, cols / 16, ds, step * (cols / 16)));
    if (!v->bias) return NVFP4MOE_OK;
    float *b = malloc(sizeof(float) * (size_t)rows);
    NVFP4MOE_RETURN_IF(!b, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    nvfp4moe_status s = nvfp4moe_ckpt_read_floats(v->bias, 0, rows, b);
    float *db = (half < 0 ? st->w2_bias : st->w13_bias) + row0;
    for (int64_t r = 0; r < rows && s == NVFP4MOE_OK; r++) db[r * step] = b[r];
    free(b);
    return s;
}

static nvfp4moe_status load_per_expert(load_ctx *c, bool ct) {
    const nvfp4moe_config *cfg = &c->cfg;
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size;
    const bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    // A bias without its counterparts would be dropped, or copied where no buffer was sized.
    NVFP4MOE_TRY(nvfp4moe_ckpt_bias_presence(c, false, &c->cfg.has_bias));
    for (int32_t e = 0; e < cfg->num_experts; e++) {
        proj_view g = {0}, u = {0}, d = {0};
        if (gated) NVFP4MOE_TRY(proj_resolve(c, e, c->gate, I, H, ct, &g));
        NVFP4MOE_TRY(proj_resolve(c, e, c->up, I, H, ct, &u));
        NVFP4MOE_TRY(proj_resolve(c, e, c->down, H, I, ct, &d));
        if (!c->check_only) {
            if (gated) NVFP4MOE_TRY(proj_copy(c, e, 0, &g, I, H));
            NVFP4MOE_TRY(proj_copy(c, e, 1, &u, I, H));
            NVFP4MOE_TRY(proj_copy(c, e, -1, &d, H, I));
            c->st->w2_scale_2[e] = d.scale_2;
            if (c->st->w2_input_scale) c->st->w2_input_scale[e] = d.input_scale;
        }
        if (gated) keep_scales(c, e, g.scale_2, u.scale_2, g.input_scale, u.input_scale);
        else keep_scales(c, e, u.scale_2, u.scale_2, u.input_scale, u.input_scale);
    }
    return NVFP4MOE_OK;
}

// ---- fused 3-D experts ----

/* A fused per-expert scale: one value for all ([] / [1]), one per expert ([E] / [E, 1]), or one
 * per expert and shard ([E, 2] / [E, 2, 1], gate then up). Writes [E][2]. */
static nvfp4moe_status fused_scales(const load_ctx *c, const nvfp4moe_st_tensor *t, bool two,
                                    float *out /* [E * 2] */) {
    const int64_t E = c->cfg.num_experts;
    NVFP4MOE_RETURN_IF(!nvfp4moe_ckpt_is_float_dtype(t->dtype), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': dtype %s, expected F32", t->file, t->name,
                       nvfp4moe_st_dtype_name(t->dtype));
    int per;   // values per expert
    if (t->numel == 1) per = 0;
    else if (t->ndim >= 1 && t->shape[0] == E && t->numel == E) per = 1;
    else if (two && t->ndim >= 2 && t->shape[0] == E && t->shape[1] == 2 && t->numel == 2 * E)
        per = 2;
    else return nvfp4moe_ckpt_bad_shape(t, two ? "[], [E], [E, 1] or [E, 2]" : "[], [E] or [E, 1]");
    float *vals = malloc(sizeof(float) * (size_t)t->numel);
    NVFP4MOE_RETURN_IF(!vals, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    nvfp4moe_status s = nvfp4moe_ckpt_read_floats(t, 0, t->numel, vals);
    for (int64_t e = 0; e < E && s == NVFP4MOE_OK; e++) {
        for (int k = 0; k < 2 && s == NVFP4MOE_OK; k++) {
            float v = vals[per == 0 ? 0 : per == 1 ? e : 2 * e + k];
            if (!isfinite(v) || !(v > 0))
                s = nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT, "%s: tensor '%s': expert %lld: value %g must be finite and > 0",
                                       t->file, t->name, (long long)e, (double)v);
            out[2 * e + k] = v;
        }
    }
    free(vals);
    return s;
}

/* A fused [E, out, in/2] weight with [E, out, in/16] scales, or both transposed ([E, in/2, out],
 * the Hugging Face [in, out] layout Llama-4 exports use). The scales' shape decides, since
 * in/2 != in/16. Copies into dst [E, out, in/2] / dst_s [E, out, in/16]. */
static nvfp4moe_status fused_weight(load_ctx *c, const nvfp4moe_st_tensor *w,
                                    const nvfp4moe_st_tensor *s, int64_t out, int64_t in,
                                    uint8_t *dst, uint8_t *dst_s) {
    const int64_t E = c->cfg.num_experts;
    NVFP4MOE_TRY(nvfp4moe_ckpt_want_dtype(w, NVFP4MOE_ST_U8, NVFP4MOE_ST_U8));
    NVFP4MOE_TRY(nvfp4moe_ckpt_want_dtype(s, NVFP4MOE_ST_F8_E4M3, NVFP4MOE_ST_U8));
    int64_t s_om[3] = {E, out, in / 16}, s_im[3] = {E, in / 16, out};
    int64_t w_om[3] = {E, out, in / 2}, w_im[3] = {E, in / 2, out};
    char want[160];
    bool transposed;
    if (nvfp4moe_ckpt_shape_is(s, 3, s_om)) transposed = false;
    else if (nvfp4moe_ckpt_shape_is(s, 3, s_im)) transposed = true;
    else {
        snprintf(want, sizeof want, "[%lld, %lld, %lld] or transposed [%lld, %lld, %lld]",
                 (long long)E, (long long)out, (long long)in / 16, (long long)E,
                 (long long)in / 16, (long long)out);
        return nvfp4moe_ckpt_bad_shape(s, want);
    }
    const int64_t *ww = transposed ? w_im : w_om;
    if (!nvfp4moe_ckpt_shape_is(w, 3, ww)) {
        snprintf(want, sizeof want, "[%lld, %lld, %lld] (the layout its scales use)",
                 (long long)ww[0], (long long)ww[1], (long long)ww[2]);
        return nvfp4moe_ckpt_bad_shape(w, want);
    }
    NVFP4MOE_TRY(nvfp4moe_ckpt_check_scales(s));
    if (c->check_only) return NVFP4MOE_OK;
    if (!transposed) {
        NVFP4MOE_TRY(nvfp4moe_st_tensor_read(w, 0, w->nbytes, dst));
        return nvfp4moe_st_tensor_read(s, 0, s->nbytes, dst_s);
    }
    // One expert at a time through a scratch copy, transposed into place.
    uint8_t *buf = malloc((size_t)(in / 2 * out));
    NVFP4MOE_RETURN_IF(!buf, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    nvfp4moe_status st = NVFP4MOE_OK;
    for (int64_t e = 0; e < E && st == NVFP4MOE_OK; e++) {
        st = nvfp4moe_st_tensor_read(w, (uint64_t)(e * (in / 2) * out), (uint64_t)(in / 2 * out), buf);
        for (int64_t k = 0; k < in / 2 && st == NVFP4MOE_OK; k++)
            for (int64_t n = 0; n < out; n++) dst[(e * out + n) * (in / 2) + k] = buf[k * out + n];
        if (st == NVFP4MOE_OK)
            st = nvfp4moe_st_tensor_read(s, (uint64_t)(e * (in / 16) * out), (uint64_t)(in / 16 * out), buf);
        for (int64_t k = 0; k < in / 16 && st == NVFP4MOE_OK; k++)
            for (int64_t n = 0; n < out; n++) dst_s[(e * out + n) * (in / 16) + k] = buf[k * out + n];
    }
    free(buf);
    return st;
}

static nvfp4moe_status load_fused(load_ctx *c) {
    const nvfp4moe_config *cfg = &c->cfg;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    const bool w4a16 = cfg->scheme == NVFP4MOE_SCHEME_W4A16;
    const nvfp4moe_st_tensor *gu, *gus, *gus2, *gin = NULL, *dn, *dns, *dns2, *din = NULL;
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, "experts.gate_up_proj", &gu));
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, "experts.gate_up_proj_weight_scale", &gus));
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, "experts.gate_up_proj_weight_scale_2", &gus2));
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, "experts.down_proj", &dn));
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, "experts.down_proj_weight_scale", &dns));
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, "experts.down_proj_weight_scale_2", &dns2));
    if (!w4a16) {
        NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, "experts.gate_up_proj_input_scale", &gin));
        NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, "experts.down_proj_input_scale", &din));
    }
    const nvfp4moe_st_tensor *gub = nvfp4moe_ckpt_maybe(c, "experts.gate_up_proj_bias");
    const nvfp4moe_st_tensor *dnb = nvfp4moe_ckpt_maybe(c, "experts.down_proj_bias");
    NVFP4MOE_TRY(nvfp4moe_ckpt_bias_presence(c, true, &c->cfg.has_bias));
    ckpt_storage *st = c->st;
    NVFP4MOE_TRY(fused_weight(c, gu, gus, N1, H, c->check_only ? NULL : st->w13,
                              c->check_only ? NULL : st->w13_scale));
    NVFP4MOE_TRY(fused_weight(c, dn, dns, H, I, c->check_only ? NULL : st->w2,
                              c->check_only ? NULL : st->w2_scale));
    if (gub) {
        int64_t db1[2] = {E, N1}, db2[2] = {E, H};
        char want[64];
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)E, (long long)N1);
        if (!nvfp4moe_ckpt_is_float_dtype(gub->dtype) || !nvfp4moe_ckpt_shape_is(gub, 2, db1)) return nvfp4moe_ckpt_bad_shape(gub, want);
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)E, (long long)H);
        if (!nvfp4moe_ckpt_is_float_dtype(dnb->dtype) || !nvfp4moe_ckpt_shape_is(dnb, 2, db2)) return nvfp4moe_ckpt_bad_shape(dnb, want);
        NVFP4MOE_TRY(nvfp4moe_ckpt_check_finite(gub));
        NVFP4MOE_TRY(nvfp4moe_ckpt_check_finite(dnb));
        if (!c->check_only) {
            NVFP4MOE_TRY(nvfp4moe_ckpt_read_floats(gub, 0, E * N1, st->w13_bias));
            NVFP4MOE_TRY(nvfp4moe_ckpt_read_floats(dnb, 0, E * H, st->w2_bias));
        }
    }
    // Per-expert scales, [E][gate, up]; down has no shards.
    float *tmp = malloc(sizeof(float) * (size_t)(8 * E));
    NVFP4MOE_RETURN_IF(!tmp, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    float *s13 = tmp, *in13 = tmp + 2 * E, *s2 = tmp + 4 * E, *in2 = tmp + 6 * E;
    nvfp4moe_status s = fused_scales(c, gus2, true, s13);
    if (s == NVFP4MOE_OK) s = fused_scales(c, dns2, false, s2);
    for (int64_t i = 0; i < 2 * E; i++) in13[i] = in2[i] = 0;
    if (s == NVFP4MOE_OK && gin) s = fused_scales(c, gin, true, in13);
    if (s == NVFP4MOE_OK && din) s = fused_scales(c, din, false, in2);
    if (s == NVFP4MOE_OK) {
        for (int32_t e = 0; e < E; e++) {
            keep_scales(c, e, s13[2 * e], s13[2 * e + 1], in13[2 * e], in13[2 * e + 1]);
            if (!c->check_only) {
                st->w2_scale_2[e] = s2[2 * e];
                if (st->w2_input_scale) st->w2_input_scale[e] = in2[2 * e];
            }
        }
    }
    free(tmp);
    return s;
}

// ---- loading ----

/* Everything the layer's tensors say about the config, without copying: bias presence,
 * correction bias, router. Run once in check mode so buffers can be sized, then for real. */
static nvfp4moe_status load_pass(load_ctx *c, nvfp4moe_ckpt_format fmt, nvfp4moe_ckpt_layer *l) {
    c->n_differ = c->n_input_differ = 0;
    NVFP4MOE_TRY(nvfp4moe_ckpt_load_router(c, l));
    if (fmt == NVFP4MOE_CKPT_MODELOPT_FUSED) NVFP4MOE_TRY(load_fused(c));
    else NVFP4MOE_TRY(load_per_expert(c, fmt == NVFP4MOE_CKPT_COMPRESSED_TENSORS));
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_ckpt_layer_load_from(const nvfp4moe_model_info *info,
                                              const nvfp4moe_st_model *tensors, int32_t layer,
                                              bool check_only, nvfp4moe_ckpt_layer **out) {
    NVFP4MOE_RETURN_IF(!info || !tensors || !out, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "ckpt_layer_load: NULL argument");
    char where[256];
    nvfp4moe_ckpt_model_where(tensors, where, sizeof where);
    NVFP4MOE_RETURN_IF(layer < 0 || layer >= info->num_layers, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "layer %d: the model has layers 0..%d", layer, info->num_layers - 1);
    NVFP4MOE_RETURN_IF(!nvfp4moe_model_info_is_moe_layer(info, layer), NVFP4MOE_ERR_NOT_FOUND,
                       "layer %d is not a MoE layer of this model (first MoE layer: %d)", layer,
                       info->first_moe_layer);
    nvfp4moe_ckpt_layer *l = calloc(1, sizeof *l);
    NVFP4MOE_RETURN_IF(!l, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    if (nvfp4moe_handle_add(l, NVFP4MOE_HANDLE_CKPT_LAYER) != NVFP4MOE_OK) {
        free(l);
        return NVFP4MOE_ERR_OUT_OF_MEMORY;
    }
    load_ctx c = {.info = info, .tensors = tensors, .layer = layer, .cfg = info->cfg,
                  .check_only = true, .warn = &l->warnings};
    nvfp4moe_strlcpy(c.where, where, sizeof c.where);
    l->index = layer;
    nvfp4moe_ckpt_format fmt = NVFP4MOE_CKPT_UNQUANTIZED;
    bool quantized = false;
    // Every shape below is derived from the config: make sure it is sane before using it.
    nvfp4moe_status s = nvfp4moe_config_validate(&c.cfg);
    if (s != NVFP4MOE_OK)
        nvfp4moe_error_prefix("%s: layer %d: the config built from config.json is invalid", where,
                              layer);
    if (s == NVFP4MOE_OK) s = nvfp4moe_ckpt_find_layer(&c);
    if (s == NVFP4MOE_OK) s = nvfp4moe_ckpt_detect_format(&c, &fmt, &quantized);
    if (s == NVFP4MOE_OK && !quantized)
        s = nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                               "%s: layer %d is not NVFP4-quantized (its experts are BF16/F16/F32): "
                               "make an NVFP4 checkpoint with `nvfp4moe quantize`",
                               where, layer);
    if (s == NVFP4MOE_OK && info->quantized && info->format_known && info->format != fmt)
        nvfp4moe_warn(&l->warnings, "layer %d: the config says %s but the tensors are %s: reading "
                      "them as %s", layer, nvfp4moe_ckpt_format_name(info->format),
                      nvfp4moe_ckpt_format_name(fmt), nvfp4moe_ckpt_format_name(fmt));
    if (s == NVFP4MOE_OK) s = load_pass(&c, fmt, l);
    if (s == NVFP4MOE_OK && !check_only) {
        // Second pass: the first sized the buffers (bias, correction bias, router presence).
        ckpt_storage *st = NULL;
        s = nvfp4moe_ckpt_storage_alloc(&c.cfg, c.router_found, c.router_bias_t != NULL, &st);
        if (s == NVFP4MOE_OK) {
            l->storage_ = st;
            c.st = st;
            c.check_only = false;
            nvfp4moe_warnings discard = {0};
            c.warn = &discard;   // the check pass already reported them
            s = load_pass(&c, fmt, l);
            c.warn = &l->warnings;
        }
    }
    if (s == NVFP4MOE_OK) scale_warnings(&c);
    if (s == NVFP4MOE_OK && l->storage_ && !c.n_differ) {
        // The halves agree in every expert: one scale per expert, the layout every caller knows.
        ckpt_storage *st = l->storage_;
        free(st->w13_up_scale_2);
        st->w13_up_scale_2 = NULL;
    }
    if (s == NVFP4MOE_OK) {
        s = nvfp4moe_config_validate(&c.cfg);
        if (s != NVFP4MOE_OK)
            nvfp4moe_error_prefix("%s: layer %d: the config built from config.json is invalid",
                                  where, layer);
    }
    if (s != NVFP4MOE_OK) {
        nvfp4moe_ckpt_layer_free(l);
        return s;
    }
    l->format = fmt;
    l->layer.cfg = c.cfg;
    if (l->storage_) nvfp4moe_ckpt_point_weights(l, l->storage_);
    *out = l;
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_ckpt_layer_load(const char *dir, int32_t layer, nvfp4moe_ckpt_layer **out) {
    NVFP4MOE_RETURN_IF(!dir || !out, NVFP4MOE_ERR_INVALID_ARGUMENT, "ckpt_layer_load: NULL");
    nvfp4moe_model_info *info = NULL;
    nvfp4moe_st_model *m = NULL;
    NVFP4MOE_TRY(nvfp4moe_model_info_read(dir, &info));
    nvfp4moe_status s = nvfp4moe_st_model_open(dir, &m);
    if (s == NVFP4MOE_OK) s = nvfp4moe_ckpt_layer_load_from(info, m, layer, false, out);
    if (s == NVFP4MOE_OK) {
        // The config's own warnings (e.g. two disagreeing quantization configs) come first.
        nvfp4moe_warnings w = info->warnings;
        for (int32_t i = 0; i < (*out)->warnings.count; i++)
            nvfp4moe_warn(&w, "%s", (*out)->warnings.text[i]);
        w.dropped += (*out)->warnings.dropped;
        (*out)->warnings = w;
    }
    nvfp4moe_st_model_close(m);
    nvfp4moe_model_info_free(info);
    return s;
}

// ---- router logits ----

nvfp4moe_status nvfp4moe_ckpt_router_logits(const nvfp4moe_ckpt_layer *l, const float *x,
                                            int64_t num_tokens, float *logits) {
    NVFP4MOE_RETURN_IF(!l || (num_tokens > 0 && (!x || !logits)) || num_tokens < 0,
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "ckpt_router_logits: bad argument");
    NVFP4MOE_RETURN_IF(!l->router, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "layer %d: no router weight loaded (%s)", l->index,
                       l->has_router ? "a check-only load copies none" : "the checkpoint has none");
    const int64_t E = l->layer.cfg.num_experts, H = l->layer.cfg.hidden_size;
    for (int64_t m = 0; m < num_tokens; m++)
        for (int64_t e = 0; e < E; e++) {
            double acc = 0;
            for (int64_t k = 0; k < H; k++) acc += (double)x[m * H + k] * l->router[e * H + k];
            logits[m * E + e] = (float)(acc + (l->router_bias ? l->router_bias[e] : 0.0));
        }
    return NVFP4MOE_OK;
}
