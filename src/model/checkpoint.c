/*
 * checkpoint.c - NVFP4 MoE layers from and to model directories: ModelOpt per-expert tensors,
 * ModelOpt fused 3-D experts, compressed-tensors nvfp4-pack-quantized; unquantized (BF16/F16/F32)
 * source layers; quantization of a float layer the ModelOpt way.
 *
 * Loading resolves every tensor an expert needs, checks its dtype and shape against the config
 * before a byte is copied, and converts everything into the canonical layout of nvfp4moe_weights
 * (scale_2 in the dequantization form, w13 rows gate then up). Warnings are collected, never
 * printed. Expert biases and the router (under the module name the source used: gpt-oss's
 * mlp.router or mlp.gate) go through quantization and the writer unchanged.
 */
#include "model/model.h"
#include "reference/reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP4_E4M3_RANGE (6.0f * 448.0f) /* ModelOpt: scale_2 = amax / (6 * 448) */

// ---- tensor access ----

/* One value of a float tensor (F32, F64, BF16, F16) as float. */
static float tensor_float(const nvfp4moe_st_tensor *t, int64_t i) {
    const uint8_t *p = t->data;
    switch (t->dtype) {
    case NVFP4MOE_ST_F32: {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case NVFP4MOE_ST_F64: {
        double v;
        memcpy(&v, p + 8 * i, 8);
        return (float)v;
    }
    case NVFP4MOE_ST_BF16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return nvfp4moe_bf16_to_float(v);
    }
    case NVFP4MOE_ST_F16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return nvfp4moe_fp16_to_float(v);
    }
    default: return NAN;
    }
}

static bool is_float_dtype(nvfp4moe_st_dtype d) {
    return d == NVFP4MOE_ST_F32 || d == NVFP4MOE_ST_F64 || d == NVFP4MOE_ST_BF16 ||
           d == NVFP4MOE_ST_F16;
}

static void shape_str(const nvfp4moe_st_tensor *t, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int32_t i = 0; i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
}

static bool shape_is(const nvfp4moe_st_tensor *t, int32_t ndim, const int64_t *dims) {
    if (t->ndim != ndim) return false;
    for (int32_t i = 0; i < ndim; i++)
        if (t->shape[i] != dims[i]) return false;
    return true;
}

// ---- the loading context ----

typedef struct {
    uint8_t *w13, *w13_scale, *w2, *w2_scale;
    float *w13_scale_2, *w13_input_scale, *w2_scale_2, *w2_input_scale;
    float *w13_bias, *w2_bias, *correction_bias, *router, *router_bias;
} ckpt_storage;

typedef struct {
    const nvfp4moe_model_info *info;
    const nvfp4moe_st_model *tensors;
    char where[256];            /* the model directory, for messages */
    bool router_found;          /* a float router weight of the right shape exists */
    const nvfp4moe_st_tensor *router_t, *router_bias_t; /* what load_router accepted, or NULL */
    int32_t layer;
    nvfp4moe_config cfg;
    char base[160];             /* "model.layers.3.mlp." */
    const char *gate, *up, *down; /* projection names: gate_proj/up_proj/down_proj or w1/w3/w2 */
    bool check_only;
    nvfp4moe_warnings *warn;
    ckpt_storage *st;
    /* reconciliation statistics */
    int32_t n_differ, first_differ;
    float first_g, first_u;
    int32_t n_inexact;
    double max_change;
    int32_t n_input_differ;
} load_ctx;

/* The tensor base+suffix, or NOT_FOUND naming it. */
static nvfp4moe_status need(const load_ctx *c, const char *suffix, const nvfp4moe_st_tensor **out) {
    char name[320];
    snprintf(name, sizeof name, "%s%s", c->base, suffix);
    *out = nvfp4moe_st_model_find(c->tensors, name);
    NVFP4MOE_RETURN_IF(!*out, NVFP4MOE_ERR_NOT_FOUND, "%s: layer %d: tensor '%s' not found",
                       c->where, c->layer, name);
    return NVFP4MOE_OK;
}

static const nvfp4moe_st_tensor *maybe(const load_ctx *c, const char *suffix) {
    char name[320];
    snprintf(name, sizeof name, "%s%s", c->base, suffix);
    return nvfp4moe_st_model_find(c->tensors, name);
}

static nvfp4moe_status bad_shape(const nvfp4moe_st_tensor *t, const char *want) {
    char got[128];
    shape_str(t, got, sizeof got);
    return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT, "%s: tensor '%s': shape %s, expected %s",
                              t->file, t->name, got, want);
}

static nvfp4moe_status want_dtype(const nvfp4moe_st_tensor *t, nvfp4moe_st_dtype a,
                                  nvfp4moe_st_dtype b) {
    NVFP4MOE_RETURN_IF(t->dtype != a && t->dtype != b, NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': dtype %s, expected %s", t->file, t->name,
                       nvfp4moe_st_dtype_name(t->dtype), nvfp4moe_st_dtype_name(a));
    return NVFP4MOE_OK;
}

/* A per-tensor scale: one float value (shape [] or [1]). */
static nvfp4moe_status scalar(const nvfp4moe_st_tensor *t, float *v) {
    NVFP4MOE_RETURN_IF(!is_float_dtype(t->dtype), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': dtype %s, expected F32", t->file, t->name,
                       nvfp4moe_st_dtype_name(t->dtype));
    if (t->numel != 1) return bad_shape(t, "[] or [1] (one value)");
    *v = tensor_float(t, 0);
    return NVFP4MOE_OK;
}

/* A global scale must be finite and positive to mean anything; reciprocal for compressed-tensors. */
static nvfp4moe_status global_scale(const nvfp4moe_st_tensor *t, float v, bool reciprocal,
                                    float *out) {
    NVFP4MOE_RETURN_IF(!isfinite(v) || !(v > 0), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': value %g must be finite and > 0", t->file, t->name,
                       (double)v);
    float r = reciprocal ? 1.0f / v : v;
    NVFP4MOE_RETURN_IF(!isfinite(r) || !(r > 0), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': reciprocal of %g is not a usable scale", t->file, t->name,
                       (double)v);
    *out = r;
    return NVFP4MOE_OK;
}

/* Canonical w13 row of element i of a half (0 gate, 1 up). Gated activations stack gate then up,
 * except swigluoai, which interleaves them as gpt-oss does; non-gated ones only have "up". */
static int64_t w13_row(const nvfp4moe_config *cfg, int half, int64_t i) {
    if (!nvfp4moe_activation_is_gated(cfg->activation)) return i;
    if (cfg->activation == NVFP4MOE_ACT_SWIGLUOAI) return 2 * i + half;
    return (int64_t)half * cfg->intermediate_size + i;
}

// ---- gate/up reconciliation ----

/* The half with the smaller scale_2 gets its block scales multiplied by s_half / s_max (<= 1, so
 * no E4M3 overflow) and re-encoded, so both halves dequantize with s_max. Keeping the gate's scale
 * (vLLM's older path) would scale the up half by s_gate / s_up: wrong by that factor. */
static void rescale_half(load_ctx *c, uint8_t *scales /* [N1, H/16] of one expert */, int half,
                         float ratio) {
    const int64_t I = c->cfg.intermediate_size, kb = c->cfg.hidden_size / 16;
    for (int64_t i = 0; i < I; i++) {
        uint8_t *row = scales + w13_row(&c->cfg, half, i) * kb;
        for (int64_t k = 0; k < kb; k++) {
            float old = nvfp4moe_e4m3_decode(row[k]);
            float want = old * ratio;
            uint8_t code = nvfp4moe_e4m3_encode(want);
            float got = nvfp4moe_e4m3_decode(code);
            if (got != want) {
                c->n_inexact++;
                double ch = want != 0 ? fabs((double)got - want) / want : 0;
                if (ch > c->max_change) c->max_change = ch;
            }
            row[k] = code;
        }
    }
}

static void reconcile(load_ctx *c, int32_t e, float s_gate, float s_up, float in_gate,
                      float in_up) {
    ckpt_storage *st = c->st;
    float s = s_gate;
    if (s_gate != s_up) {
        if (c->n_differ++ == 0) c->first_differ = e, c->first_g = s_gate, c->first_u = s_up;
        s = s_gate > s_up ? s_gate : s_up;
        if (!c->check_only) {
            const int64_t N1 = nvfp4moe_config_n1(&c->cfg), kb = c->cfg.hidden_size / 16;
            uint8_t *sc = st->w13_scale + (int64_t)e * N1 * kb;
            if (s_gate < s) rescale_half(c, sc, 0, s_gate / s);
            else rescale_half(c, sc, 1, s_up / s);
        }
    }
    if (in_gate != in_up) c->n_input_differ++;
    if (!c->check_only) {
        st->w13_scale_2[e] = s;
        if (st->w13_input_scale) st->w13_input_scale[e] = in_gate > in_up ? in_gate : in_up;
    }
}

static void reconcile_warnings(load_ctx *c) {
    const int32_t E = c->cfg.num_experts;
    if (c->n_differ) {
        nvfp4moe_warn(c->warn,
                      "layer %d: %d of %d experts have different gate and up global scales (first: "
                      "expert %d, gate weight_scale_2 %g, up %g). vLLM would keep the gate's and "
                      "mis-scale the up half; nvfp4moe uses max(gate, up) and rescales the other "
                      "half's block scales (%d block scales rounded, max relative change %.3g)",
                      c->layer, c->n_differ, E, c->first_differ, (double)c->first_g,
                      (double)c->first_u, c->n_inexact, c->max_change);
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
    snprintf(suf, sizeof suf, "experts.%d.%s.%s", e, proj, ct ? "weight_packed" : "weight");
    NVFP4MOE_TRY(need(c, suf, &v->w));
    snprintf(suf, sizeof suf, "experts.%d.%s.weight_scale", e, proj);
    NVFP4MOE_TRY(need(c, suf, &v->s));
    snprintf(suf, sizeof suf, "experts.%d.%s.%s", e, proj, ct ? "weight_global_scale" : "weight_scale_2");
    NVFP4MOE_TRY(need(c, suf, &v->s2));
    snprintf(suf, sizeof suf, "experts.%d.%s.%s", e, proj, ct ? "input_global_scale" : "input_scale");
    v->in = NULL;
    if (!w4a16) NVFP4MOE_TRY(need(c, suf, &v->in));
    snprintf(suf, sizeof suf, "experts.%d.%s.bias", e, proj);
    v->bias = maybe(c, suf);

    NVFP4MOE_TRY(want_dtype(v->w, NVFP4MOE_ST_U8, NVFP4MOE_ST_U8));
    NVFP4MOE_TRY(want_dtype(v->s, NVFP4MOE_ST_F8_E4M3, NVFP4MOE_ST_U8));
    char want[96];
    int64_t dw[2] = {rows, cols / 2}, ds[2] = {rows, cols / 16};
    snprintf(want, sizeof want, "[%lld, %lld] (packed E2M1)", (long long)rows, (long long)cols / 2);
    if (!shape_is(v->w, 2, dw)) return bad_shape(v->w, want);
    snprintf(want, sizeof want, "[%lld, %lld] (one E4M3 scale per 16)", (long long)rows,
             (long long)cols / 16);
    if (!shape_is(v->s, 2, ds)) return bad_shape(v->s, want);
    float x;
    NVFP4MOE_TRY(scalar(v->s2, &x));
    NVFP4MOE_TRY(global_scale(v->s2, x, ct, &v->scale_2));
    v->input_scale = 0;
    if (v->in) {
        NVFP4MOE_TRY(scalar(v->in, &x));
        NVFP4MOE_TRY(global_scale(v->in, x, ct, &v->input_scale));
    }
    if (v->bias) {
        NVFP4MOE_RETURN_IF(!is_float_dtype(v->bias->dtype), NVFP4MOE_ERR_FORMAT,
                           "%s: tensor '%s': dtype %s, expected a float type", v->bias->file,
                           v->bias->name, nvfp4moe_st_dtype_name(v->bias->dtype));
        int64_t db[1] = {rows};
        snprintf(want, sizeof want, "[%lld]", (long long)rows);
        if (!shape_is(v->bias, 1, db)) return bad_shape(v->bias, want);
    }
    return NVFP4MOE_OK;
}

/* Copies the rows of a resolved projection into canonical w13 (half 0/1) or w2 (half -1). */
static void proj_copy(load_ctx *c, int32_t e, int half, const proj_view *v, int64_t rows,
                      int64_t cols) {
    ckpt_storage *st = c->st;
    const uint8_t *w = v->w->data, *s = v->s->data;
    const int64_t N1 = nvfp4moe_config_n1(&c->cfg);
    for (int64_t r = 0; r < rows; r++) {
        int64_t dr = half < 0 ? r : w13_row(&c->cfg, half, r);
        uint8_t *dw = half < 0 ? st->w2 + ((int64_t)e * rows + dr) * (cols / 2)
                               : st->w13 + ((int64_t)e * N1 + dr) * (cols / 2);
        uint8_t *ds = half < 0 ? st->w2_scale + ((int64_t)e * rows + dr) * (cols / 16)
                               : st->w13_scale + ((int64_t)e * N1 + dr) * (cols / 16);
        memcpy(dw, w + r * (cols / 2), (size_t)(cols / 2));
        memcpy(ds, s + r * (cols / 16), (size_t)(cols / 16));
        if (v->bias) {
            float *db = half < 0 ? st->w2_bias + (int64_t)e * rows + dr
                                 : st->w13_bias + (int64_t)e * N1 + dr;
            *db = tensor_float(v->bias, r);
        }
    }
}

static nvfp4moe_status load_per_expert(load_ctx *c, bool ct) {
    const nvfp4moe_config *cfg = &c->cfg;
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size;
    const bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    for (int32_t e = 0; e < cfg->num_experts; e++) {
        proj_view g = {0}, u = {0}, d = {0};
        if (gated) NVFP4MOE_TRY(proj_resolve(c, e, c->gate, I, H, ct, &g));
        NVFP4MOE_TRY(proj_resolve(c, e, c->up, I, H, ct, &u));
        NVFP4MOE_TRY(proj_resolve(c, e, c->down, H, I, ct, &d));
        if (gated && (!g.bias) != (!u.bias)) {
            const nvfp4moe_st_tensor *has = g.bias ? g.bias : u.bias;
            return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                                      "%s: tensor '%s' has no %s counterpart", has->file,
                                      has->name, g.bias ? "up" : "gate");
        }
        NVFP4MOE_RETURN_IF(e > 0 && (!u.bias) != !c->cfg.has_bias, NVFP4MOE_ERR_NOT_FOUND,
                           "%s: layer %d: expert %d %s biases but expert 0 %s", c->where,
                           c->layer, e, u.bias ? "has" : "lacks", u.bias ? "does not" : "does");
        NVFP4MOE_RETURN_IF(e > 0 && (!d.bias) != !c->cfg.has_bias, NVFP4MOE_ERR_NOT_FOUND,
                           "%s: layer %d: expert %d down_proj bias presence differs from expert 0",
                           c->where, c->layer, e);
        if (e == 0) c->cfg.has_bias = u.bias != NULL;
        if (!c->check_only) {
            if (gated) proj_copy(c, e, 0, &g, I, H);
            proj_copy(c, e, 1, &u, I, H);
            proj_copy(c, e, -1, &d, H, I);
            c->st->w2_scale_2[e] = d.scale_2;
            if (c->st->w2_input_scale) c->st->w2_input_scale[e] = d.input_scale;
        }
        if (gated) reconcile(c, e, g.scale_2, u.scale_2, g.input_scale, u.input_scale);
        else reconcile(c, e, u.scale_2, u.scale_2, u.input_scale, u.input_scale);
    }
    return NVFP4MOE_OK;
}

// ---- fused 3-D experts ----

/* A fused per-expert scale: one value for all ([] / [1]), one per expert ([E] / [E, 1]), or one
 * per expert and shard ([E, 2] / [E, 2, 1], gate then up). Writes [E][2]. */
static nvfp4moe_status fused_scales(const load_ctx *c, const nvfp4moe_st_tensor *t, bool two,
                                    float *out /* [E * 2] */) {
    const int64_t E = c->cfg.num_experts;
    NVFP4MOE_RETURN_IF(!is_float_dtype(t->dtype), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': dtype %s, expected F32", t->file, t->name,
                       nvfp4moe_st_dtype_name(t->dtype));
    int per;   // values per expert
    if (t->numel == 1) per = 0;
    else if (t->ndim >= 1 && t->shape[0] == E && t->numel == E) per = 1;
    else if (two && t->ndim >= 2 && t->shape[0] == E && t->shape[1] == 2 && t->numel == 2 * E)
        per = 2;
    else return bad_shape(t, two ? "[], [E], [E, 1] or [E, 2]" : "[], [E] or [E, 1]");
    for (int64_t e = 0; e < E; e++) {
        for (int k = 0; k < 2; k++) {
            float v = tensor_float(t, per == 0 ? 0 : per == 1 ? e : 2 * e + k);
            NVFP4MOE_RETURN_IF(!isfinite(v) || !(v > 0), NVFP4MOE_ERR_FORMAT,
                               "%s: tensor '%s': expert %lld: value %g must be finite and > 0",
                               t->file, t->name, (long long)e, (double)v);
            out[2 * e + k] = v;
        }
    }
    return NVFP4MOE_OK;
}

/* A fused [E, out, in/2] weight with [E, out, in/16] scales, or both transposed ([E, in/2, out],
 * the Hugging Face [in, out] layout Llama-4 exports use). The scales' shape decides, since
 * in/2 != in/16. Copies into dst [E, out, in/2] / dst_s [E, out, in/16]. */
static nvfp4moe_status fused_weight(load_ctx *c, const nvfp4moe_st_tensor *w,
                                    const nvfp4moe_st_tensor *s, int64_t out, int64_t in,
                                    uint8_t *dst, uint8_t *dst_s) {
    const int64_t E = c->cfg.num_experts;
    NVFP4MOE_TRY(want_dtype(w, NVFP4MOE_ST_U8, NVFP4MOE_ST_U8));
    NVFP4MOE_TRY(want_dtype(s, NVFP4MOE_ST_F8_E4M3, NVFP4MOE_ST_U8));
    int64_t s_om[3] = {E, out, in / 16}, s_im[3] = {E, in / 16, out};
    int64_t w_om[3] = {E, out, in / 2}, w_im[3] = {E, in / 2, out};
    char want[160];
    bool transposed;
    if (shape_is(s, 3, s_om)) transposed = false;
    else if (shape_is(s, 3, s_im)) transposed = true;
    else {
        snprintf(want, sizeof want, "[%lld, %lld, %lld] or transposed [%lld, %lld, %lld]",
                 (long long)E, (long long)out, (long long)in / 16, (long long)E,
                 (long long)in / 16, (long long)out);
        return bad_shape(s, want);
    }
    const int64_t *ww = transposed ? w_im : w_om;
    if (!shape_is(w, 3, ww)) {
        snprintf(want, sizeof want, "[%lld, %lld, %lld] (the layout its scales use)",
                 (long long)ww[0], (long long)ww[1], (long long)ww[2]);
        return bad_shape(w, want);
    }
    if (c->check_only) return NVFP4MOE_OK;
    const uint8_t *src = w->data, *srcs = s->data;
    if (!transposed) {
        memcpy(dst, src, (size_t)(E * out * (in / 2)));
        memcpy(dst_s, srcs, (size_t)(E * out * (in / 16)));
        return NVFP4MOE_OK;
    }
    for (int64_t e = 0; e < E; e++) {
        for (int64_t k = 0; k < in / 2; k++)
            for (int64_t n = 0; n < out; n++)
                dst[(e * out + n) * (in / 2) + k] = src[(e * (in / 2) + k) * out + n];
        for (int64_t k = 0; k < in / 16; k++)
            for (int64_t n = 0; n < out; n++)
                dst_s[(e * out + n) * (in / 16) + k] = srcs[(e * (in / 16) + k) * out + n];
    }
    return NVFP4MOE_OK;
}

static nvfp4moe_status load_fused(load_ctx *c) {
    const nvfp4moe_config *cfg = &c->cfg;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    const bool w4a16 = cfg->scheme == NVFP4MOE_SCHEME_W4A16;
    const nvfp4moe_st_tensor *gu, *gus, *gus2, *gin = NULL, *dn, *dns, *dns2, *din = NULL;
    NVFP4MOE_TRY(need(c, "experts.gate_up_proj", &gu));
    NVFP4MOE_TRY(need(c, "experts.gate_up_proj_weight_scale", &gus));
    NVFP4MOE_TRY(need(c, "experts.gate_up_proj_weight_scale_2", &gus2));
    NVFP4MOE_TRY(need(c, "experts.down_proj", &dn));
    NVFP4MOE_TRY(need(c, "experts.down_proj_weight_scale", &dns));
    NVFP4MOE_TRY(need(c, "experts.down_proj_weight_scale_2", &dns2));
    if (!w4a16) {
        NVFP4MOE_TRY(need(c, "experts.gate_up_proj_input_scale", &gin));
        NVFP4MOE_TRY(need(c, "experts.down_proj_input_scale", &din));
    }
    const nvfp4moe_st_tensor *gub = maybe(c, "experts.gate_up_proj_bias");
    const nvfp4moe_st_tensor *dnb = maybe(c, "experts.down_proj_bias");
    NVFP4MOE_RETURN_IF((!gub) != (!dnb), NVFP4MOE_ERR_NOT_FOUND,
                       "%s: layer %d: tensor '%sexperts.%s_bias' not found (its %s bias is "
                       "present)",
                       c->where, c->layer, c->base, gub ? "down_proj" : "gate_up_proj",
                       gub ? "gate_up_proj" : "down_proj");
    c->cfg.has_bias = gub != NULL;
    ckpt_storage *st = c->st;
    NVFP4MOE_TRY(fused_weight(c, gu, gus, N1, H, c->check_only ? NULL : st->w13,
                              c->check_only ? NULL : st->w13_scale));
    NVFP4MOE_TRY(fused_weight(c, dn, dns, H, I, c->check_only ? NULL : st->w2,
                              c->check_only ? NULL : st->w2_scale));
    if (gub) {
        int64_t db1[2] = {E, N1}, db2[2] = {E, H};
        char want[64];
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)E, (long long)N1);
        if (!is_float_dtype(gub->dtype) || !shape_is(gub, 2, db1)) return bad_shape(gub, want);
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)E, (long long)H);
        if (!is_float_dtype(dnb->dtype) || !shape_is(dnb, 2, db2)) return bad_shape(dnb, want);
        if (!c->check_only) {
            for (int64_t i = 0; i < E * N1; i++) st->w13_bias[i] = tensor_float(gub, i);
            for (int64_t i = 0; i < E * H; i++) st->w2_bias[i] = tensor_float(dnb, i);
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
            reconcile(c, e, s13[2 * e], s13[2 * e + 1], in13[2 * e], in13[2 * e + 1]);
            if (!c->check_only) {
                st->w2_scale_2[e] = s2[2 * e];
                if (st->w2_input_scale) st->w2_input_scale[e] = in2[2 * e];
            }
        }
    }
    free(tmp);
    return s;
}

// ---- router and correction bias ----

static nvfp4moe_status load_router(load_ctx *c, nvfp4moe_ckpt_layer *out) {
    const int64_t E = c->cfg.num_experts, H = c->cfg.hidden_size;
    c->router_t = c->router_bias_t = NULL;
    // gpt-oss names it mlp.router; the name is kept so a writer can use the same one.
    const char *rname = "gate";
    const nvfp4moe_st_tensor *r = maybe(c, "gate.weight");
    if (!r) r = maybe(c, "router.weight"), rname = "router";
    if (r) {
        if (!is_float_dtype(r->dtype)) {
            nvfp4moe_warn(c->warn, "layer %d: router '%s' is %s, not a float type: not loaded "
                          "(routing needs logits given some other way)", c->layer, r->name,
                          nvfp4moe_st_dtype_name(r->dtype));
        } else {
            int64_t dims[2] = {E, H};
            char want[64];
            snprintf(want, sizeof want, "[%lld, %lld] (experts, hidden)", (long long)E,
                     (long long)H);
            if (!shape_is(r, 2, dims)) return bad_shape(r, want);
            out->router_dtype = r->dtype;
            out->has_router = true;
            c->router_found = true;
            c->router_t = r;
            nvfp4moe_strlcpy(out->router_name, rname, sizeof out->router_name);
            if (!c->check_only) {
                for (int64_t i = 0; i < E * H; i++) c->st->router[i] = tensor_float(r, i);
                out->router = c->st->router;
            }
        }
    }
    // gpt-oss's router is a Linear with a bias: logits = hidden @ weight^T + bias.
    const nvfp4moe_st_tensor *rb = maybe(c, "gate.bias");
    if (!rb) rb = maybe(c, "router.bias");
    if (rb && !c->router_t) {
        nvfp4moe_warn(c->warn, "layer %d: router bias '%s' without a usable router weight: not "
                      "loaded", c->layer, rb->name);
    } else if (rb) {
        NVFP4MOE_RETURN_IF(!is_float_dtype(rb->dtype), NVFP4MOE_ERR_FORMAT,
                           "%s: tensor '%s': dtype %s, expected a float type", rb->file, rb->name,
                           nvfp4moe_st_dtype_name(rb->dtype));
        int64_t dims[1] = {E};
        char want[48];
        snprintf(want, sizeof want, "[%lld] (experts)", (long long)E);
        if (!shape_is(rb, 1, dims)) return bad_shape(rb, want);
        out->has_router_bias = true;
        c->router_bias_t = rb;
        if (!c->check_only) {
            for (int64_t i = 0; i < E; i++) c->st->router_bias[i] = tensor_float(rb, i);
            out->router_bias = c->st->router_bias;
        }
    }
    const nvfp4moe_st_tensor *b = maybe(c, "gate.e_score_correction_bias");
    if (!b) b = maybe(c, "e_score_correction_bias");
    const bool uses_bias = c->cfg.routing == NVFP4MOE_ROUTING_DEEPSEEK_V3 ||
                           c->cfg.routing == NVFP4MOE_ROUTING_MINIMAX2;
    if (b && !uses_bias) {
        nvfp4moe_warn(c->warn, "layer %d: '%s' is present but routing %s takes no correction "
                      "bias: ignored", c->layer, b->name, nvfp4moe_routing_name(c->cfg.routing));
        b = NULL;
    }
    if (!b && c->cfg.has_correction_bias) {
        return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                                  "%s: layer %d: tensor '%sgate.e_score_correction_bias' not found "
                                  "(the config's routing uses a correction bias)",
                                  c->where, c->layer, c->base);
    }
    c->cfg.has_correction_bias = b != NULL;
    if (b) {
        int64_t dims[1] = {E};
        char want[32];
        snprintf(want, sizeof want, "[%lld]", (long long)E);
        if (!is_float_dtype(b->dtype) || !shape_is(b, 1, dims)) return bad_shape(b, want);
        if (!c->check_only)
            for (int64_t i = 0; i < E; i++) c->st->correction_bias[i] = tensor_float(b, i);
    }
    return NVFP4MOE_OK;
}

// ---- finding the layer ----

/* The directory of the model's first file: what messages name. */
static void model_where(const nvfp4moe_st_model *m, char *buf, size_t len) {
    const nvfp4moe_st_file *f = nvfp4moe_st_model_file(m, 0);
    nvfp4moe_strlcpy(buf, f ? nvfp4moe_st_file_path(f) : "model", len);
    char *slash = strrchr(buf, '/');
    if (slash && slash != buf) *slash = '\0';
}

static const char *const k_prefixes[] = {"model.layers", "language_model.model.layers",
                                         "model.language_model.layers", NULL};
static const char *const k_modules[] = {"mlp", "feed_forward", "block_sparse_moe", NULL};

/* True when some tensor name starts with prefix. */
static bool has_prefix(const nvfp4moe_st_model *m, const char *prefix) {
    size_t i = nvfp4moe_st_model_lower_bound(m, prefix);
    const nvfp4moe_st_tensor *t = nvfp4moe_st_model_tensor(m, i);
    return t && !strncmp(t->name, prefix, strlen(prefix));
}

/* Sets c->base to the layer's MoE module ("model.layers.3.mlp."), or NOT_FOUND. */
static nvfp4moe_status find_layer(load_ctx *c) {
    char probe[256];
    const char *first = c->info ? c->info->prefix : NULL;
    for (int p = -1; k_prefixes[p + 1] || p < 0; p++) {
        const char *pre = p < 0 ? first : k_prefixes[p];
        if (!pre || !*pre) continue;
        for (int m = 0; k_modules[m]; m++) {
            snprintf(probe, sizeof probe, "%s.%d.%s.experts.", pre, c->layer, k_modules[m]);
            if (has_prefix(c->tensors, probe)) {
                snprintf(c->base, sizeof c->base, "%s.%d.%s.", pre, c->layer, k_modules[m]);
                return NVFP4MOE_OK;
            }
        }
    }
    return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                              "%s: layer %d: no expert tensors (looked for "
                              "%s.%d.{mlp,feed_forward,block_sparse_moe}.experts.*)",
                              c->where, c->layer, first && *first ? first : "model.layers",
                              c->layer);
}

/* What the layer's tensors are: sets *fmt, *quantized, and the projection names. */
static nvfp4moe_status detect_format(load_ctx *c, nvfp4moe_ckpt_format *fmt, bool *quantized) {
    const nvfp4moe_st_tensor *t = maybe(c, "experts.gate_up_proj");
    if (!t) t = maybe(c, "experts.down_proj");
    if (t) {
        *fmt = NVFP4MOE_CKPT_MODELOPT_FUSED;
        *quantized = t->dtype == NVFP4MOE_ST_U8;
        c->gate = "gate_proj", c->up = "up_proj", c->down = "down_proj";
        return NVFP4MOE_OK;
    }
    static const char *const k_names[][3] = {{"gate_proj", "up_proj", "down_proj"},
                                             {"w1", "w3", "w2"}};
    char suf[96];
    for (int n = 0; n < 2; n++) {
        const char *up = k_names[n][1];
        snprintf(suf, sizeof suf, "experts.0.%s.weight_packed", up);
        if (maybe(c, suf)) {
            *fmt = NVFP4MOE_CKPT_COMPRESSED_TENSORS;
            *quantized = true;
        } else {
            snprintf(suf, sizeof suf, "experts.0.%s.weight", up);
            if (!(t = maybe(c, suf))) continue;
            *quantized = t->dtype == NVFP4MOE_ST_U8;
            *fmt = *quantized ? NVFP4MOE_CKPT_MODELOPT : NVFP4MOE_CKPT_UNQUANTIZED;
        }
        c->gate = k_names[n][0], c->up = k_names[n][1], c->down = k_names[n][2];
        return NVFP4MOE_OK;
    }
    return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND,
                              "%s: layer %d: tensor '%sexperts.0.up_proj.weight' not found (nor "
                              "weight_packed, w3, or fused experts.gate_up_proj)",
                              c->where, c->layer, c->base);
}

// ---- owning containers ----

static void storage_free(ckpt_storage *s) {
    if (!s) return;
    free(s->w13);
    free(s->w13_scale);
    free(s->w2);
    free(s->w2_scale);
    free(s->w13_scale_2);
    free(s->w13_input_scale);
    free(s->w2_scale_2);
    free(s->w2_input_scale);
    free(s->w13_bias);
    free(s->w2_bias);
    free(s->correction_bias);
    free(s->router);
    free(s->router_bias);
    free(s);
}

void nvfp4moe_ckpt_layer_free(nvfp4moe_ckpt_layer *l) {
    if (!l) return;
    storage_free(l->storage_);
    free(l);
}

/* size = a * b * c / d bytes, overflow-checked against a sane bound. */
static bool checked_size(int64_t a, int64_t b, int64_t cc, int64_t d, size_t *out) {
    if (a < 0 || b < 0 || cc < 0) return false;
    double approx = (double)a * (double)b * (double)cc / (double)d;
    if (approx > 1.0e13) return false;   // 10 TB: no real layer; a corrupt config
    *out = (size_t)(a * b * cc / d);
    return true;
}

/* Allocates every buffer cfg needs (zeroed), and the router weight / bias when asked. */
static nvfp4moe_status storage_alloc(const nvfp4moe_config *cfg, bool router, bool router_bias,
                                     ckpt_storage **out) {
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    size_t n13, n13s, n2, n2s;
    NVFP4MOE_RETURN_IF(!checked_size(E, N1, H, 2, &n13) || !checked_size(E, N1, H, 16, &n13s) ||
                           !checked_size(E, H, I, 2, &n2) || !checked_size(E, H, I, 16, &n2s),
                       NVFP4MOE_ERR_SHAPE, "layer of E=%lld H=%lld I=%lld is absurdly large",
                       (long long)E, (long long)H, (long long)I);
    ckpt_storage *s = calloc(1, sizeof *s);
    NVFP4MOE_RETURN_IF(!s, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    bool ok = (s->w13 = calloc(n13 ? n13 : 1, 1)) && (s->w13_scale = calloc(n13s ? n13s : 1, 1)) &&
              (s->w2 = calloc(n2 ? n2 : 1, 1)) && (s->w2_scale = calloc(n2s ? n2s : 1, 1)) &&
              (s->w13_scale_2 = calloc((size_t)E, sizeof(float))) &&
              (s->w2_scale_2 = calloc((size_t)E, sizeof(float)));
    if (ok && cfg->scheme != NVFP4MOE_SCHEME_W4A16)
        ok = (s->w13_input_scale = calloc((size_t)E, sizeof(float))) &&
             (s->w2_input_scale = calloc((size_t)E, sizeof(float)));
    if (ok && cfg->has_bias)
        ok = (s->w13_bias = calloc((size_t)(E * N1), sizeof(float))) &&
             (s->w2_bias = calloc((size_t)(E * H), sizeof(float)));
    if (ok && cfg->has_correction_bias) ok = (s->correction_bias = calloc((size_t)E, sizeof(float)));
    if (ok && router) ok = (s->router = calloc((size_t)(E * H), sizeof(float)));
    if (ok && router_bias) ok = (s->router_bias = calloc((size_t)E, sizeof(float)));
    if (!ok) {
        storage_free(s);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY,
                                  "out of memory for a layer of E=%lld H=%lld I=%lld", (long long)E,
                                  (long long)H, (long long)I);
    }
    *out = s;
    return NVFP4MOE_OK;
}

static void point_weights(nvfp4moe_ckpt_layer *l, const ckpt_storage *s) {
    nvfp4moe_weights *w = &l->layer.w;
    w->w13 = s->w13, w->w13_scale = s->w13_scale, w->w13_scale_2 = s->w13_scale_2;
    w->w13_input_scale = s->w13_input_scale;
    w->w2 = s->w2, w->w2_scale = s->w2_scale, w->w2_scale_2 = s->w2_scale_2;
    w->w2_input_scale = s->w2_input_scale;
    w->w13_bias = s->w13_bias, w->w2_bias = s->w2_bias, w->correction_bias = s->correction_bias;
}

// ---- loading ----

/* Everything the layer's tensors say about the config, without copying: bias presence,
 * correction bias, router. Run once in check mode so buffers can be sized, then for real. */
static nvfp4moe_status load_pass(load_ctx *c, nvfp4moe_ckpt_format fmt, nvfp4moe_ckpt_layer *l) {
    c->n_differ = c->n_inexact = c->n_input_differ = 0;
    c->max_change = 0;
    NVFP4MOE_TRY(load_router(c, l));
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
    model_where(tensors, where, sizeof where);
    NVFP4MOE_RETURN_IF(layer < 0 || layer >= info->num_layers, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "layer %d: the model has layers 0..%d", layer, info->num_layers - 1);
    NVFP4MOE_RETURN_IF(!nvfp4moe_model_info_is_moe_layer(info, layer), NVFP4MOE_ERR_NOT_FOUND,
                       "layer %d is not a MoE layer of this model (first MoE layer: %d)", layer,
                       info->first_moe_layer);
    nvfp4moe_ckpt_layer *l = calloc(1, sizeof *l);
    NVFP4MOE_RETURN_IF(!l, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
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
    if (s == NVFP4MOE_OK) s = find_layer(&c);
    if (s == NVFP4MOE_OK) s = detect_format(&c, &fmt, &quantized);
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
        s = storage_alloc(&c.cfg, c.router_found, c.router_bias_t != NULL, &st);
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
    if (s == NVFP4MOE_OK) reconcile_warnings(&c);
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
    if (l->storage_) point_weights(l, l->storage_);
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

// ---- float layers ----

typedef struct {
    float *w13, *w2, *router, *bias, *router_bias, *w13_bias, *w2_bias;
} float_storage;

void nvfp4moe_float_layer_free(nvfp4moe_float_layer *l) {
    if (!l) return;
    float_storage *s = l->storage_;
    if (s) {
        free(s->w13);
        free(s->w2);
        free(s->router);
        free(s->bias);
        free(s->router_bias);
        free(s->w13_bias);
        free(s->w2_bias);
        free(s);
    }
    free(l);
}

static nvfp4moe_status float_alloc(const nvfp4moe_config *cfg, bool router, bool router_bias,
                                   nvfp4moe_float_layer **out) {
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    size_t n13, n2;
    NVFP4MOE_RETURN_IF(!checked_size(E, N1, H, 1, &n13) || !checked_size(E, H, I, 1, &n2),
                       NVFP4MOE_ERR_SHAPE, "layer of E=%lld H=%lld I=%lld is absurdly large",
                       (long long)E, (long long)H, (long long)I);
    nvfp4moe_float_layer *l = calloc(1, sizeof *l);
    float_storage *s = calloc(1, sizeof *s);
    bool ok = l && s;
    if (ok) {
        l->storage_ = s;
        l->cfg = *cfg;
        ok = (s->w13 = malloc(n13 * sizeof(float))) && (s->w2 = malloc(n2 * sizeof(float)));
        if (ok && router) ok = (s->router = malloc((size_t)(E * H) * sizeof(float)));
        if (ok && cfg->has_correction_bias) ok = (s->bias = calloc((size_t)E, sizeof(float)));
        if (ok && router_bias) ok = (s->router_bias = calloc((size_t)E, sizeof(float)));
        if (ok && cfg->has_bias)
            ok = (s->w13_bias = calloc((size_t)(E * N1), sizeof(float))) &&
                 (s->w2_bias = calloc((size_t)(E * H), sizeof(float)));
    }
    if (!ok) {
        if (l) nvfp4moe_float_layer_free(l);
        else free(s);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    l->w13 = s->w13, l->w2 = s->w2, l->router = s->router, l->correction_bias = s->bias;
    l->router_bias = s->router_bias;
    l->w13_bias = s->w13_bias, l->w2_bias = s->w2_bias;
    *out = l;
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_float_layer_random(const nvfp4moe_config *cfg, uint64_t seed,
                                            nvfp4moe_float_layer **out) {
    NVFP4MOE_RETURN_IF(!cfg || !out, NVFP4MOE_ERR_INVALID_ARGUMENT, "float_layer_random: NULL");
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    nvfp4moe_float_layer *l;
    // gpt-oss (the swigluoai activation) is the family whose router carries a bias, whose experts
    // have biases, and whose router module is mlp.router.
    const bool goss = cfg->activation == NVFP4MOE_ACT_SWIGLUOAI;
    nvfp4moe_config fcfg = *cfg;
    fcfg.has_bias = cfg->has_bias || goss;
    NVFP4MOE_TRY(float_alloc(&fcfg, true, goss, &l));
    nvfp4moe_strlcpy(l->router_name, goss ? "router" : "gate", sizeof l->router_name);
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    uint64_t st = seed ^ 0x6a09e667f3bcc909ull;
    // bf16-rounded, as a real BF16 source checkpoint would be.
    const double s13 = 1.0 / sqrt((double)H), s2 = 1.0 / sqrt((double)I);
    for (int64_t i = 0; i < E * N1 * H; i++)
        l->w13[i] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16,
                                            (float)(nvfp4moe_rand_normal(&st) * s13));
    for (int64_t i = 0; i < E * H * I; i++)
        l->w2[i] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16,
                                           (float)(nvfp4moe_rand_normal(&st) * s2));
    for (int64_t i = 0; i < E * H; i++)
        l->router[i] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16,
                                               (float)(nvfp4moe_rand_normal(&st) * s13));
    if (l->correction_bias)
        for (int64_t e = 0; e < E; e++)
            l->correction_bias[e] = (float)(0.1 * nvfp4moe_rand_normal(&st));
    if (l->router_bias)
        for (int64_t e = 0; e < E; e++)
            l->router_bias[e] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16,
                                                        (float)(0.5 * nvfp4moe_rand_normal(&st)));
    // Drawn last, so the weights above do not depend on whether there are biases.
    if (l->w13_bias) {
        for (int64_t i = 0; i < E * N1; i++)
            l->w13_bias[i] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16,
                                                     (float)(0.1 * nvfp4moe_rand_normal(&st)));
        for (int64_t i = 0; i < E * H; i++)
            l->w2_bias[i] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16,
                                                    (float)(0.1 * nvfp4moe_rand_normal(&st)));
    }
    *out = l;
    return NVFP4MOE_OK;
}

/* A float matrix [rows, cols] from a float tensor, optionally transposed ([cols, rows] stored). */
static nvfp4moe_status float_matrix(const nvfp4moe_st_tensor *t, int64_t rows, int64_t cols,
                                    int64_t offset_elems, bool transposed, float *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++)
            dst[r * cols + k] = tensor_float(t, offset_elems + (transposed ? k * rows + r
                                                                           : r * cols + k));
    return NVFP4MOE_OK;
}

/* Whether an unquantized layer has expert biases: every one the layout names (fused
 * experts.{gate_up,down}_proj_bias; per expert experts.E.{gate,up,down}_proj.bias) or none, else
 * NOT_FOUND naming the first missing one, so no bias is dropped or half-applied. */
static nvfp4moe_status float_bias_presence(const load_ctx *c, bool fused, bool *has) {
    const bool gated = nvfp4moe_activation_is_gated(c->cfg.activation);
    const nvfp4moe_st_tensor *present = NULL;
    char suf[160], missing[320] = "";
    const int32_t E = fused ? 1 : c->cfg.num_experts;
    for (int32_t e = 0; e < E; e++) {
        for (int p = fused || gated ? 0 : 1; p < 3; p++) {
            if (fused && p == 2) break;
            if (fused) snprintf(suf, sizeof suf, "experts.%s_bias", p ? "down_proj" : "gate_up_proj");
            else snprintf(suf, sizeof suf, "experts.%d.%s.bias", e,
                          p == 0 ? c->gate : p == 1 ? c->up : c->down);
            const nvfp4moe_st_tensor *t = maybe(c, suf);
            if (t && !present) present = t;
            if (!t && !missing[0]) snprintf(missing, sizeof missing, "%s%s", c->base, suf);
        }
    }
    NVFP4MOE_RETURN_IF(present && missing[0], NVFP4MOE_ERR_NOT_FOUND,
                       "%s: layer %d: tensor '%s' not found ('%s' is present: expert biases must "
                       "be given for every projection and expert, or for none)",
                       c->where, c->layer, missing, present->name);
    *has = present != NULL;
    return NVFP4MOE_OK;
}

/* A float bias tensor base+suffix of shape [rows] (ndim 1, n = 1) or [n, rows] into dst. */
static nvfp4moe_status float_bias(const load_ctx *c, const char *suffix, int32_t ndim, int64_t n,
                                  int64_t rows, float *dst) {
    const nvfp4moe_st_tensor *t;
    NVFP4MOE_TRY(need(c, suffix, &t));
    NVFP4MOE_RETURN_IF(!is_float_dtype(t->dtype), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': dtype %s, expected a float type", t->file, t->name,
                       nvfp4moe_st_dtype_name(t->dtype));
    int64_t d1[1] = {rows}, d2[2] = {n, rows};
    char want[64];
    if (ndim == 1 && !shape_is(t, 1, d1)) {
        snprintf(want, sizeof want, "[%lld]", (long long)rows);
        return bad_shape(t, want);
    }
    if (ndim == 2 && !shape_is(t, 2, d2)) {
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)n, (long long)rows);
        return bad_shape(t, want);
    }
    for (int64_t i = 0; i < n * rows; i++) dst[i] = tensor_float(t, i);
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_float_layer_load(const nvfp4moe_model_info *info,
                                          const nvfp4moe_st_model *tensors, int32_t layer,
                                          nvfp4moe_float_layer **out) {
    NVFP4MOE_RETURN_IF(!info || !tensors || !out, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "float_layer_load: NULL argument");
    char where[256];
    model_where(tensors, where, sizeof where);
    NVFP4MOE_RETURN_IF(!nvfp4moe_model_info_is_moe_layer(info, layer), NVFP4MOE_ERR_NOT_FOUND,
                       "layer %d is not a MoE layer of this model", layer);
    nvfp4moe_warnings discard = {0};
    load_ctx c = {.info = info, .tensors = tensors, .layer = layer, .cfg = info->cfg,
                  .check_only = true, .warn = &discard};
    nvfp4moe_strlcpy(c.where, where, sizeof c.where);
    nvfp4moe_ckpt_format fmt;
    bool quantized;
    NVFP4MOE_TRY(nvfp4moe_config_validate(&c.cfg));
    NVFP4MOE_TRY(find_layer(&c));
    NVFP4MOE_TRY(detect_format(&c, &fmt, &quantized));
    NVFP4MOE_RETURN_IF(quantized, NVFP4MOE_ERR_UNSUPPORTED,
                       "%s: layer %d is already quantized (%s): quantize needs a BF16/F16/F32 "
                       "source", where, layer, nvfp4moe_ckpt_format_name(fmt));
    nvfp4moe_ckpt_layer probe = {0};
    c.cfg.has_correction_bias = false;
    NVFP4MOE_TRY(load_router(&c, &probe));   // check only: shapes and bias presence
    NVFP4MOE_TRY(nvfp4moe_config_validate(&c.cfg));
    NVFP4MOE_TRY(float_bias_presence(&c, fmt == NVFP4MOE_CKPT_MODELOPT_FUSED, &c.cfg.has_bias));
    const nvfp4moe_config *cfg = &c.cfg;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    const bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    const nvfp4moe_st_tensor *router = c.router_t, *router_bias = c.router_bias_t;
    nvfp4moe_float_layer *l;
    NVFP4MOE_TRY(float_alloc(cfg, router != NULL, router_bias != NULL, &l));
    nvfp4moe_strlcpy(l->router_name, probe.router_name, sizeof l->router_name);
    nvfp4moe_status s = NVFP4MOE_OK;
    char want[96];
    if (fmt == NVFP4MOE_CKPT_MODELOPT_FUSED) {
        // Unquantized fused experts keep the Hugging Face [in, out] layout.
        const nvfp4moe_st_tensor *gu = NULL, *dn = NULL;
        s = need(&c, "experts.gate_up_proj", &gu);
        if (s == NVFP4MOE_OK) s = need(&c, "experts.down_proj", &dn);
        int64_t dgu[3] = {E, H, N1}, ddn[3] = {E, I, H};
        if (s == NVFP4MOE_OK && (!is_float_dtype(gu->dtype) || !shape_is(gu, 3, dgu))) {
            snprintf(want, sizeof want, "[%lld, %lld, %lld] float", (long long)E, (long long)H,
                     (long long)N1);
            s = bad_shape(gu, want);
        }
        if (s == NVFP4MOE_OK && (!is_float_dtype(dn->dtype) || !shape_is(dn, 3, ddn))) {
            snprintf(want, sizeof want, "[%lld, %lld, %lld] float", (long long)E, (long long)I,
                     (long long)H);
            s = bad_shape(dn, want);
        }
        for (int64_t e = 0; s == NVFP4MOE_OK && e < E; e++) {
            float_matrix(gu, N1, H, e * H * N1, true, l->w13 + e * N1 * H);
            float_matrix(dn, H, I, e * I * H, true, l->w2 + e * H * I);
        }
        // gate_up_proj_bias follows gate_up_proj's last dimension: w13's rows (gpt-oss interleaved).
        if (s == NVFP4MOE_OK && cfg->has_bias)
            s = float_bias(&c, "experts.gate_up_proj_bias", 2, E, N1, l->w13_bias);
        if (s == NVFP4MOE_OK && cfg->has_bias)
            s = float_bias(&c, "experts.down_proj_bias", 2, E, H, l->w2_bias);
    } else {
        float *rowbuf = malloc(sizeof(float) * (size_t)(I * H));
        if (!rowbuf) s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        for (int32_t e = 0; s == NVFP4MOE_OK && e < E; e++) {
            for (int p = gated ? 0 : 1; p < 3 && s == NVFP4MOE_OK; p++) {
                const char *proj = p == 0 ? c.gate : p == 1 ? c.up : c.down;
                char suf[128];
                snprintf(suf, sizeof suf, "experts.%d.%s.weight", e, proj);
                const nvfp4moe_st_tensor *t;
                s = need(&c, suf, &t);
                if (s != NVFP4MOE_OK) break;
                int64_t rows = p < 2 ? I : H, cols = p < 2 ? H : I;
                int64_t dims[2] = {rows, cols};
                if (!is_float_dtype(t->dtype) || !shape_is(t, 2, dims)) {
                    snprintf(want, sizeof want, "[%lld, %lld] float", (long long)rows,
                             (long long)cols);
                    s = bad_shape(t, want);
                    break;
                }
                if (p == 2) {
                    float_matrix(t, H, I, 0, false, l->w2 + (int64_t)e * H * I);
                } else {
                    float_matrix(t, I, H, 0, false, rowbuf);
                    for (int64_t r = 0; r < I; r++)
                        memcpy(l->w13 + ((int64_t)e * N1 + w13_row(cfg, p, r)) * H, rowbuf + r * H,
                               sizeof(float) * (size_t)H);
                }
                if (!cfg->has_bias) continue;
                snprintf(suf, sizeof suf, "experts.%d.%s.bias", e, proj);
                if (p == 2) {
                    s = float_bias(&c, suf, 1, 1, H, l->w2_bias + (int64_t)e * H);
                } else {
                    s = float_bias(&c, suf, 1, 1, I, rowbuf);
                    for (int64_t r = 0; s == NVFP4MOE_OK && r < I; r++)
                        l->w13_bias[(int64_t)e * N1 + w13_row(cfg, p, r)] = rowbuf[r];
                }
            }
        }
        free(rowbuf);
    }
    if (s == NVFP4MOE_OK && router)
        for (int64_t i = 0; i < E * H; i++) l->router[i] = tensor_float(router, i);
    if (s == NVFP4MOE_OK && router_bias)
        for (int64_t i = 0; i < E; i++) l->router_bias[i] = tensor_float(router_bias, i);
    if (s == NVFP4MOE_OK && l->correction_bias) {
        const nvfp4moe_st_tensor *b = maybe(&c, "gate.e_score_correction_bias");
        if (!b) b = maybe(&c, "e_score_correction_bias");
        for (int64_t i = 0; i < E; i++) l->correction_bias[i] = tensor_float(b, i);
    }
    if (s != NVFP4MOE_OK) {
        nvfp4moe_float_layer_free(l);
        return s;
    }
    *out = l;
    return NVFP4MOE_OK;
}

// ---- quantization ----

/* scale_2 = amax / (6*448), nudged to a float whose reciprocal's reciprocal is itself, so the
 * ModelOpt form and the compressed-tensors form (1/scale_2) describe bit-identical scales. */
static float modelopt_scale_2(float amax) {
    float s = amax > 0 && isfinite(amax) ? amax / FP4_E4M3_RANGE : 1.0f;
    for (int i = 0; i < 8; i++) {
        float r = 1.0f / s;
        if (1.0f / r == s) break;
        s = 1.0f / r;
    }
    return s;
}

static float amax_of(const float *x, int64_t n) {
    float m = 0;
    for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

nvfp4moe_status nvfp4moe_float_layer_quantize(const nvfp4moe_float_layer *src, int32_t calib_tokens,
                                              uint64_t seed, nvfp4moe_ckpt_layer **out) {
    NVFP4MOE_RETURN_IF(!src || !out, NVFP4MOE_ERR_INVALID_ARGUMENT, "float_layer_quantize: NULL");
    NVFP4MOE_RETURN_IF(calib_tokens < 1, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "calib_tokens=%d must be >= 1", calib_tokens);
    const nvfp4moe_config *cfg = &src->cfg;
    NVFP4MOE_TRY(nvfp4moe_config_validate(cfg));
    // Biases go where has_bias says; one without the flag would otherwise be dropped unseen.
    NVFP4MOE_RETURN_IF(cfg->has_bias != (src->w13_bias != NULL) ||
                           cfg->has_bias != (src->w2_bias != NULL),
                       NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "float layer: cfg.has_bias is %s but w13_bias is %s and w2_bias %s",
                       cfg->has_bias ? "set" : "not set", src->w13_bias ? "given" : "NULL",
                       src->w2_bias ? "given" : "NULL");
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg), M = calib_tokens;
    nvfp4moe_ckpt_layer *l = calloc(1, sizeof *l);
    NVFP4MOE_RETURN_IF(!l, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    // Input scales are always computed; a W4A16 config simply has nowhere to keep them.
    const nvfp4moe_config qcfg = *cfg;
    ckpt_storage *st = NULL;
    nvfp4moe_status s = storage_alloc(&qcfg, src->router != NULL,
                                      src->router != NULL && src->router_bias != NULL, &st);
    float *x = malloc(sizeof(float) * (size_t)(M * H));
    float *wdq = malloc(sizeof(float) * (size_t)(N1 * H));
    double *g = malloc(sizeof(double) * (size_t)N1), *a = malloc(sizeof(double) * (size_t)I);
    if (s == NVFP4MOE_OK && (!x || !wdq || !g || !a))
        s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == NVFP4MOE_OK) {
        l->storage_ = st;
        uint64_t rs = seed ^ 0xbb67ae8584caa73bull;
        for (int64_t i = 0; i < M * H; i++) x[i] = (float)nvfp4moe_rand_normal(&rs);
        const float in13 = modelopt_scale_2(amax_of(x, M * H));
        for (int64_t e = 0; e < E && s == NVFP4MOE_OK; e++) {
            const float *w13 = src->w13 + e * N1 * H, *w2 = src->w2 + e * H * I;
            const float *b13 = src->w13_bias ? src->w13_bias + e * N1 : NULL;
            // Gate and up share one amax (ModelOpt's preprocess_linear_fusion).
            float amax13 = amax_of(w13, N1 * H);
            float s13 = modelopt_scale_2(amax13), s2 = modelopt_scale_2(amax_of(w2, H * I));
            s = nvfp4moe_quantize(w13, N1, H, 1.0f / s13, st->w13 + e * N1 * H / 2,
                                  st->w13_scale + e * N1 * H / 16);
            if (s == NVFP4MOE_OK)
                s = nvfp4moe_quantize(w2, H, I, 1.0f / s2, st->w2 + e * H * I / 2,
                                      st->w2_scale + e * H * I / 16);
            if (s == NVFP4MOE_OK)
                s = nvfp4moe_dequantize(st->w13 + e * N1 * H / 2, st->w13_scale + e * N1 * H / 16,
                                        N1, H, s13, wdq);
            if (s != NVFP4MOE_OK) break;
            st->w13_scale_2[e] = s13;
            st->w2_scale_2[e] = s2;
            // Calibrate the down projection's input: amax of act(x W13^T + b13) over the tokens.
            float amax2 = 0;
            for (int64_t m = 0; m < M; m++) {
                const float *xm = x + m * H;
                for (int64_t n = 0; n < N1; n++) {
                    const float *wr = wdq + n * H;
                    double acc = 0;
                    for (int64_t k = 0; k < H; k++) acc += (double)xm[k] * wr[k];
                    g[n] = acc + (b13 ? b13[n] : 0.0);
                }
                nvfp4moe_activation_ref(cfg, g, a);
                for (int64_t i = 0; i < I; i++) amax2 = fmaxf(amax2, (float)fabs(a[i]));
            }
            if (st->w13_input_scale) {
                st->w13_input_scale[e] = in13;
                st->w2_input_scale[e] = modelopt_scale_2(amax2);
            }
        }
    }
    if (s == NVFP4MOE_OK && src->correction_bias && st->correction_bias)
        memcpy(st->correction_bias, src->correction_bias, sizeof(float) * (size_t)E);
    if (s == NVFP4MOE_OK && cfg->has_bias) {   // exact: the writer stores them as F32
        memcpy(st->w13_bias, src->w13_bias, sizeof(float) * (size_t)(E * N1));
        memcpy(st->w2_bias, src->w2_bias, sizeof(float) * (size_t)(E * H));
    }
    if (s == NVFP4MOE_OK) nvfp4moe_strlcpy(l->router_name, src->router_name, sizeof l->router_name);
    if (s == NVFP4MOE_OK && src->router) {
        // The router stays unquantized, as real exports exclude it; keep what a bf16 file holds.
        for (int64_t i = 0; i < E * H; i++)
            st->router[i] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16, src->router[i]);
        l->router = st->router;
        l->has_router = true;
        l->router_dtype = NVFP4MOE_ST_BF16;
        if (src->router_bias) {   // written as BF16 next to the weight, so rounded the same way
            for (int64_t i = 0; i < E; i++)
                st->router_bias[i] = nvfp4moe_round_to_dtype(NVFP4MOE_DTYPE_BF16,
                                                             src->router_bias[i]);
            l->router_bias = st->router_bias;
            l->has_router_bias = true;
        }
    }
    free(x);
    free(wdq);
    free(g);
    free(a);
    if (s != NVFP4MOE_OK) {
        if (!l->storage_) storage_free(st);
        nvfp4moe_ckpt_layer_free(l);
        return s;
    }
    l->layer.cfg = qcfg;
    l->index = 0;
    l->format = NVFP4MOE_CKPT_MODELOPT;
    point_weights(l, st);
    *out = l;
    return NVFP4MOE_OK;
}

// ---- writing ----

const char *nvfp4moe_ckpt_router_name(const char *name, const nvfp4moe_config *cfg) {
    if (name && (!strcmp(name, "gate") || !strcmp(name, "router"))) return name;
    // No source name (a random layer): the swigluoai activation is what makes a layer gpt-oss
    // (nvfp4moe_model_config_write writes model_type gpt_oss for it).
    return cfg && cfg->activation == NVFP4MOE_ACT_SWIGLUOAI ? "router" : "gate";
}

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
        int64_t sr = half < 0 ? r : w13_row(cfg, half, r);
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
    float s2 = half < 0 ? wt->w2_scale_2[e] : wt->w13_scale_2[e];
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
        NVFP4MOE_TRY(put(w, base, "experts.gate_up_proj_weight_scale_2", NVFP4MOE_ST_F32, 1, de,
                         wt->w13_scale_2));
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
                memcpy(buf + r * H, f->w13 + ((int64_t)e * N1 + w13_row(cfg, half, r)) * H,
                       sizeof(float) * (size_t)H);
            int64_t d[2] = {I, H}, db[1] = {I};
            snprintf(suf, sizeof suf, "experts.%d.%s.weight", e, proj);
            s = put_bf16(w, base, suf, 2, d, buf, I * H);
            if (s != NVFP4MOE_OK || !cfg->has_bias) continue;
            for (int64_t r = 0; r < I; r++)
                buf[r] = f->w13_bias[(int64_t)e * N1 + w13_row(cfg, half, r)];
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
