/*
 * float_layer.c - unquantized (BF16/F16/F32) MoE layers: random ones, ones read from a model
 * directory, and their quantization to NVFP4 the ModelOpt way. Expert biases and the router go
 * through quantization unchanged.
 */
#include "model/ckpt.h"
#include "reference/reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP4_E4M3_RANGE (6.0f * 448.0f) /* ModelOpt: scale_2 = amax / (6 * 448) */

// ---- float layers ----

typedef struct {
    float *w13, *w2, *router, *bias, *router_bias, *w13_bias, *w2_bias;
} float_storage;

void nvfp4moe_float_layer_free(nvfp4moe_float_layer *l) {
    if (!nvfp4moe_handle_remove(l, NVFP4MOE_HANDLE_FLOAT_LAYER)) return;   // NULL, freed already, or not ours
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
    NVFP4MOE_RETURN_IF(!nvfp4moe_ckpt_checked_size(E, N1, H, 1, &n13) || !nvfp4moe_ckpt_checked_size(E, H, I, 1, &n2),
                       NVFP4MOE_ERR_SHAPE, "layer of E=%lld H=%lld I=%lld is absurdly large",
                       (long long)E, (long long)H, (long long)I);
    nvfp4moe_float_layer *l = calloc(1, sizeof *l);
    float_storage *s = calloc(1, sizeof *s);
    if (!l || !s || nvfp4moe_handle_add(l, NVFP4MOE_HANDLE_FLOAT_LAYER) != NVFP4MOE_OK) {
        free(l);
        free(s);
        return nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    }
    l->storage_ = s;
    l->cfg = *cfg;
    bool ok = (s->w13 = malloc(n13 * sizeof(float))) && (s->w2 = malloc(n2 * sizeof(float)));
    if (ok && router) ok = (s->router = malloc((size_t)(E * H) * sizeof(float)));
    if (ok && cfg->has_correction_bias) ok = (s->bias = calloc((size_t)E, sizeof(float)));
    if (ok && router_bias) ok = (s->router_bias = calloc((size_t)E, sizeof(float)));
    if (ok && cfg->has_bias)
        ok = (s->w13_bias = calloc((size_t)(E * N1), sizeof(float))) &&
             (s->w2_bias = calloc((size_t)(E * H), sizeof(float)));
    if (!ok) {
        nvfp4moe_float_layer_free(l);
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

/* A float matrix [rows, cols] from a float tensor at element offset_elems, optionally transposed
 * ([cols, rows] stored). */
static nvfp4moe_status float_matrix(const nvfp4moe_st_tensor *t, int64_t rows, int64_t cols,
                                    int64_t offset_elems, bool transposed, float *dst) {
    if (!transposed) return nvfp4moe_ckpt_read_floats(t, offset_elems, rows * cols, dst);
    float *tmp = malloc(sizeof(float) * (size_t)(rows * cols));
    NVFP4MOE_RETURN_IF(!tmp, NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: tensor '%s': out of memory", t->file, t->name);
    nvfp4moe_status s = nvfp4moe_ckpt_read_floats(t, offset_elems, rows * cols, tmp);
    for (int64_t r = 0; r < rows && s == NVFP4MOE_OK; r++)
        for (int64_t k = 0; k < cols; k++) dst[r * cols + k] = tmp[k * rows + r];
    free(tmp);
    return s;
}

/* A float bias tensor base+suffix of shape [rows] (ndim 1, n = 1) or [n, rows]: checked, and read
 * into dst unless dst is NULL. */
static nvfp4moe_status float_bias(const load_ctx *c, const char *suffix, int32_t ndim, int64_t n,
                                  int64_t rows, float *dst) {
    const nvfp4moe_st_tensor *t;
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, suffix, &t));
    NVFP4MOE_RETURN_IF(!nvfp4moe_ckpt_is_float_dtype(t->dtype), NVFP4MOE_ERR_FORMAT,
                       "%s: tensor '%s': dtype %s, expected a float type", t->file, t->name,
                       nvfp4moe_st_dtype_name(t->dtype));
    int64_t d1[1] = {rows}, d2[2] = {n, rows};
    char want[64];
    if (ndim == 1 && !nvfp4moe_ckpt_shape_is(t, 1, d1)) {
        snprintf(want, sizeof want, "[%lld]", (long long)rows);
        return nvfp4moe_ckpt_bad_shape(t, want);
    }
    if (ndim == 2 && !nvfp4moe_ckpt_shape_is(t, 2, d2)) {
        snprintf(want, sizeof want, "[%lld, %lld]", (long long)n, (long long)rows);
        return nvfp4moe_ckpt_bad_shape(t, want);
    }
    return dst ? nvfp4moe_ckpt_read_floats(t, 0, n * rows, dst) : NVFP4MOE_OK;
}

/* A float weight base+suffix of shape dims (ndim 2 or 3), or FORMAT naming what was expected. */
static nvfp4moe_status float_weight(const load_ctx *c, const char *suffix, int32_t ndim, const int64_t *dims,
                                    const nvfp4moe_st_tensor **out) {
    NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, suffix, out));
    if (nvfp4moe_ckpt_is_float_dtype((*out)->dtype) && nvfp4moe_ckpt_shape_is(*out, ndim, dims)) return NVFP4MOE_OK;
    char want[96];
    if (ndim == 3)
        snprintf(want, sizeof want, "[%lld, %lld, %lld] float", (long long)dims[0], (long long)dims[1],
                 (long long)dims[2]);
    else
        snprintf(want, sizeof want, "[%lld, %lld] float", (long long)dims[0], (long long)dims[1]);
    return nvfp4moe_ckpt_bad_shape(*out, want);
}

/* Resolves and checks every expert tensor of the layer (nothing is allocated from config.json's
 * sizes before the file is known to hold tensors of those sizes): fills the fused tensors and
 * their orientation into src. */
static nvfp4moe_status float_experts_check(nvfp4moe_float_src *src) {
    const load_ctx *c = &src->c;
    const nvfp4moe_config *cfg = &c->cfg;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size;
    const int64_t N1 = nvfp4moe_config_n1(cfg);
    if (src->fused) {
        // Unquantized fused experts: the Hugging Face [in, out] layout (gpt-oss, Llama-4,
        // Qwen3-VL-MoE: gate_up_proj [E, H, N1], down_proj [E, I, H]) or [out, in] (Transformers v5
        // and Qwen3.5-MoE: [E, N1, H], [E, H, I]). Where the shapes fit both (H == N1 and I == H),
        // the model type says how it stores them.
        const nvfp4moe_st_tensor *gu, *dn;
        NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, "experts.gate_up_proj", &gu));
        NVFP4MOE_TRY(nvfp4moe_ckpt_need(c, "experts.down_proj", &dn));
        const int64_t dgu_t[3] = {E, H, N1}, dgu_n[3] = {E, N1, H}, ddn_t[3] = {E, I, H}, ddn_n[3] = {E, H, I};
        const bool is_t = nvfp4moe_ckpt_shape_is(gu, 3, dgu_t) && nvfp4moe_ckpt_shape_is(dn, 3, ddn_t);
        const bool is_n = nvfp4moe_ckpt_shape_is(gu, 3, dgu_n) && nvfp4moe_ckpt_shape_is(dn, 3, ddn_n);
        if (!nvfp4moe_ckpt_is_float_dtype(gu->dtype) || (!is_t && !is_n)) {
            char want[320];
            snprintf(want, sizeof want,
                     "[%lld, %lld, %lld] float with down_proj [%lld, %lld, %lld], or [%lld, %lld, %lld] with "
                     "[%lld, %lld, %lld]", (long long)E, (long long)H, (long long)N1, (long long)E, (long long)I,
                     (long long)H, (long long)E, (long long)N1, (long long)H, (long long)E, (long long)H,
                     (long long)I);
            return nvfp4moe_ckpt_bad_shape(gu, want);
        }
        const char *mt = c->info ? c->info->model_type : "";
        src->transposed = is_t && (!is_n || !strcmp(mt, "gpt_oss") || !strncmp(mt, "llama4", 6) ||
                                   !strncmp(mt, "qwen3_vl_moe", 12));
        NVFP4MOE_TRY(float_weight(c, "experts.down_proj", 3, src->transposed ? ddn_t : ddn_n, &dn));
        src->gu = gu;
        src->dn = dn;
        // gate_up_proj_bias follows gate_up_proj's last dimension: w13's rows (gpt-oss interleaved).
        if (cfg->has_bias) {
            NVFP4MOE_TRY(float_bias(c, "experts.gate_up_proj_bias", 2, E, N1, NULL));
            NVFP4MOE_TRY(float_bias(c, "experts.down_proj_bias", 2, E, H, NULL));
            src->gub = nvfp4moe_ckpt_maybe(c, "experts.gate_up_proj_bias");
            src->dnb = nvfp4moe_ckpt_maybe(c, "experts.down_proj_bias");
        }
        return NVFP4MOE_OK;
    }
    const bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    for (int32_t e = 0; e < E; e++) {
        for (int p = gated ? 0 : 1; p < 3; p++) {
            const char *proj = p == 0 ? c->gate : p == 1 ? c->up : c->down;
            char suf[128];
            nvfp4moe_ckpt_expert_suffix(c, e, proj, "weight", suf, sizeof suf);
            const nvfp4moe_st_tensor *t;
            const int64_t dims[2] = {p < 2 ? I : H, p < 2 ? H : I};
            NVFP4MOE_TRY(float_weight(c, suf, 2, dims, &t));
            nvfp4moe_ckpt_expert_suffix(c, e, proj, "bias", suf, sizeof suf);
            if (cfg->has_bias) NVFP4MOE_TRY(float_bias(c, suf, 1, 1, dims[0], NULL));
        }
    }
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_float_src_open(const nvfp4moe_model_info *info, const nvfp4moe_st_model *tensors,
                                        int32_t layer, nvfp4moe_float_src *src) {
    char where[256];
    nvfp4moe_ckpt_model_where(tensors, where, sizeof where);
    NVFP4MOE_RETURN_IF(!nvfp4moe_model_info_is_moe_layer(info, layer), NVFP4MOE_ERR_NOT_FOUND,
                       "layer %d is not a MoE layer of this model", layer);
    memset(src, 0, sizeof *src);
    load_ctx *c = &src->c;
    *c = (load_ctx){.info = info, .tensors = tensors, .layer = layer, .cfg = info->cfg, .check_only = true,
                    .warn = &src->warnings};
    nvfp4moe_strlcpy(c->where, where, sizeof c->where);
    nvfp4moe_ckpt_format fmt;
    bool quantized;
    NVFP4MOE_TRY(nvfp4moe_config_validate(&c->cfg));
    NVFP4MOE_TRY(nvfp4moe_ckpt_find_layer(c));
    NVFP4MOE_TRY(nvfp4moe_ckpt_detect_format(c, &fmt, &quantized));
    NVFP4MOE_RETURN_IF(quantized, NVFP4MOE_ERR_UNSUPPORTED,
                       "%s: layer %d is already quantized (%s): quantize needs a BF16/F16/F32 "
                       "source", where, layer, nvfp4moe_ckpt_format_name(fmt));
    nvfp4moe_ckpt_layer probe = {0};
    c->cfg.has_correction_bias = false;
    NVFP4MOE_TRY(nvfp4moe_ckpt_load_router(c, &probe));   // check only: shapes and bias presence
    NVFP4MOE_TRY(nvfp4moe_config_validate(&c->cfg));
    src->fused = fmt == NVFP4MOE_CKPT_MODELOPT_FUSED;
    NVFP4MOE_TRY(nvfp4moe_ckpt_bias_presence(c, src->fused, &c->cfg.has_bias));
    NVFP4MOE_TRY(float_experts_check(src));
    src->router = c->router_t;
    src->router_bias = c->router_bias_t;
    if (c->cfg.has_correction_bias) {
        src->correction = nvfp4moe_ckpt_maybe(c, "gate.e_score_correction_bias");
        if (!src->correction) src->correction = nvfp4moe_ckpt_maybe(c, "e_score_correction_bias");
    }
    nvfp4moe_strlcpy(src->router_name, probe.router_name, sizeof src->router_name);
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_float_src_expert(const nvfp4moe_float_src *src, int32_t e, float *w13, float *w2,
                                          float *b13, float *b2) {
    const load_ctx *c = &src->c;
    const nvfp4moe_config *cfg = &c->cfg;
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size, N1 = nvfp4moe_config_n1(cfg);
    if (src->fused) {
        NVFP4MOE_TRY(float_matrix(src->gu, N1, H, (int64_t)e * H * N1, src->transposed, w13));
        NVFP4MOE_TRY(float_matrix(src->dn, H, I, (int64_t)e * I * H, src->transposed, w2));
        if (cfg->has_bias && b13) NVFP4MOE_TRY(nvfp4moe_ckpt_read_floats(src->gub, (int64_t)e * N1, N1, b13));
        if (cfg->has_bias && b2) NVFP4MOE_TRY(nvfp4moe_ckpt_read_floats(src->dnb, (int64_t)e * H, H, b2));
        return NVFP4MOE_OK;
    }
    const bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    float *rowbuf = malloc(sizeof(float) * (size_t)(I * H));
    NVFP4MOE_RETURN_IF(!rowbuf, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    nvfp4moe_status s = NVFP4MOE_OK;
    for (int p = gated ? 0 : 1; p < 3 && s == NVFP4MOE_OK; p++) {
        const char *proj = p == 0 ? c->gate : p == 1 ? c->up : c->down;
        char suf[128];
        nvfp4moe_ckpt_expert_suffix(c, e, proj, "weight", suf, sizeof suf);
        const nvfp4moe_st_tensor *t = nvfp4moe_ckpt_maybe(c, suf);
        nvfp4moe_ckpt_expert_suffix(c, e, proj, "bias", suf, sizeof suf);
        const nvfp4moe_st_tensor *bt = cfg->has_bias ? nvfp4moe_ckpt_maybe(c, suf) : NULL;
        if (p == 2) {
            s = float_matrix(t, H, I, 0, false, w2);
            if (s == NVFP4MOE_OK && bt && b2) s = nvfp4moe_ckpt_read_floats(bt, 0, H, b2);
            continue;
        }
        s = float_matrix(t, I, H, 0, false, rowbuf);
        for (int64_t r = 0; r < I && s == NVFP4MOE_OK; r++)
            memcpy(w13 + nvfp4moe_ckpt_w13_row(cfg, p, r) * H, rowbuf + r * H, sizeof(float) * (size_t)H);
        if (s == NVFP4MOE_OK && bt && b13) s = nvfp4moe_ckpt_read_floats(bt, 0, I, rowbuf);
        for (int64_t r = 0; bt && b13 && r < I && s == NVFP4MOE_OK; r++)
            b13[nvfp4moe_ckpt_w13_row(cfg, p, r)] = rowbuf[r];
    }
    free(rowbuf);
    return s;
}

nvfp4moe_status nvfp4moe_float_layer_load(const nvfp4moe_model_info *info,
                                          const nvfp4moe_st_model *tensors, int32_t layer,
                                          nvfp4moe_float_layer **out) {
    NVFP4MOE_RETURN_IF(!info || !tensors || !out, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "float_layer_load: NULL argument");
    nvfp4moe_float_src src;
    NVFP4MOE_TRY(nvfp4moe_float_src_open(info, tensors, layer, &src));
    const nvfp4moe_config *cfg = &src.c.cfg;
    const int64_t E = cfg->num_experts, H = cfg->hidden_size, I = cfg->intermediate_size, N1 = nvfp4moe_config_n1(cfg);
    nvfp4moe_float_layer *l;
    NVFP4MOE_TRY(float_alloc(cfg, src.router != NULL, src.router_bias != NULL, &l));
    nvfp4moe_strlcpy(l->router_name, src.router_name, sizeof l->router_name);
    nvfp4moe_status s = NVFP4MOE_OK;
    for (int32_t e = 0; e < E && s == NVFP4MOE_OK; e++)
        s = nvfp4moe_float_src_expert(&src, e, l->w13 + e * N1 * H, l->w2 + e * H * I,
                                      l->w13_bias ? l->w13_bias + e * N1 : NULL, l->w2_bias ? l->w2_bias + e * H : NULL);
    if (s == NVFP4MOE_OK && src.router) s = nvfp4moe_ckpt_read_floats(src.router, 0, E * H, l->router);
    if (s == NVFP4MOE_OK && src.router_bias) s = nvfp4moe_ckpt_read_floats(src.router_bias, 0, E, l->router_bias);
    if (s == NVFP4MOE_OK && l->correction_bias) s = nvfp4moe_ckpt_read_floats(src.correction, 0, E, l->correction_bias);
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

void nvfp4moe_calibration_tokens(uint64_t seed, int64_t M, int64_t H, float *x, float *in13) {
    uint64_t rs = seed ^ 0xbb67ae8584caa73bull;
    for (int64_t i = 0; i < M * H; i++) x[i] = (float)nvfp4moe_rand_normal(&rs);
    *in13 = modelopt_scale_2(amax_of(x, M * H));
}

/* h [M, N1] = x [M, H] . w [N1, H]^T + b, each dot product summed in float64 in k order (the order
 * fixes the bits; four rows and two tokens at a time only keep more sums in flight). */
static void calib_gemm(const float *x, int64_t M, const float *w, int64_t N1, int64_t H, const float *b,
                       double *h) {
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) {
        const float *x0 = x + m * H, *x1 = x0 + H;
        int64_t n = 0;
        for (; n + 4 <= N1; n += 4) {
            const float *w0 = w + n * H, *w1 = w0 + H, *w2 = w1 + H, *w3 = w2 + H;
            double a00 = 0, a01 = 0, a02 = 0, a03 = 0, a10 = 0, a11 = 0, a12 = 0, a13 = 0;
            for (int64_t k = 0; k < H; k++) {
                const double p = x0[k], q = x1[k];
                a00 += p * w0[k], a01 += p * w1[k], a02 += p * w2[k], a03 += p * w3[k];
                a10 += q * w0[k], a11 += q * w1[k], a12 += q * w2[k], a13 += q * w3[k];
            }
            double *h0 = h + m * N1 + n, *h1 = h0 + N1;
            h0[0] = a00, h0[1] = a01, h0[2] = a02, h0[3] = a03;
            h1[0] = a10, h1[1] = a11, h1[2] = a12, h1[3] = a13;
        }
        for (; n < N1; n++) {
            double a0 = 0, a1 = 0;
            for (int64_t k = 0; k < H; k++) a0 += (double)x0[k] * w[n * H + k], a1 += (double)x1[k] * w[n * H + k];
            h[m * N1 + n] = a0, h[(m + 1) * N1 + n] = a1;
        }
    }
    for (; m < M; m++)
        for (int64_t n = 0; n < N1; n++) {
            double acc = 0;
            for (int64_t k = 0; k < H; k++) acc += (double)x[m * H + k] * w[n * H + k];
            h[m * N1 + n] = acc;
        }
    for (int64_t i = 0; b && i < M; i++)
        for (int64_t n = 0; n < N1; n++) h[i * N1 + n] += b[n];
}

nvfp4moe_status nvfp4moe_quantize_expert(const nvfp4moe_config *cfg, const float *w13, const float *w2,
                                         const float *b13, const float *x, int64_t M, uint8_t *q13, uint8_t *sf13,
                                         float *s13_out, uint8_t *q2, uint8_t *sf2, float *s2_out, float *in2,
                                         float *wdq, double *g, double *a) {
    const int64_t H = cfg->hidden_size, I = cfg->intermediate_size, N1 = nvfp4moe_config_n1(cfg);
    // Gate and up share one amax (ModelOpt's preprocess_linear_fusion).
    const float s13 = modelopt_scale_2(amax_of(w13, N1 * H)), s2 = modelopt_scale_2(amax_of(w2, H * I));
    NVFP4MOE_TRY(nvfp4moe_quantize(w13, N1, H, 1.0f / s13, q13, sf13));
    NVFP4MOE_TRY(nvfp4moe_quantize(w2, H, I, 1.0f / s2, q2, sf2));
    NVFP4MOE_TRY(nvfp4moe_dequantize(q13, sf13, N1, H, s13, wdq));
    *s13_out = s13;
    *s2_out = s2;
    // Calibrate the down projection's input: amax of act(x W13^T + b13) over the tokens, a few
    // tokens at a time (g holds N1 sums per token).
    const int64_t chunk = 8;
    double *h = malloc(sizeof(double) * (size_t)(chunk * N1));
    NVFP4MOE_RETURN_IF(!h, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    float amax2 = 0;
    for (int64_t m0 = 0; m0 < M; m0 += chunk) {
        const int64_t mc = M - m0 < chunk ? M - m0 : chunk;
        calib_gemm(x + m0 * H, mc, wdq, N1, H, b13, h);
        for (int64_t m = 0; m < mc; m++) {
            memcpy(g, h + m * N1, sizeof(double) * (size_t)N1);
            nvfp4moe_activation_ref(cfg, g, a);
            for (int64_t i = 0; i < I; i++) amax2 = fmaxf(amax2, (float)fabs(a[i]));
        }
    }
    free(h);
    *in2 = modelopt_scale_2(amax2);
    return NVFP4MOE_OK;
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
    if (nvfp4moe_handle_add(l, NVFP4MOE_HANDLE_CKPT_LAYER) != NVFP4MOE_OK) {
        free(l);
        return NVFP4MOE_ERR_OUT_OF_MEMORY;
    }
    // Input scales are always computed; a W4A16 config simply has nowhere to keep them.
    const nvfp4moe_config qcfg = *cfg;
    ckpt_storage *st = NULL;
    nvfp4moe_status s = nvfp4moe_ckpt_storage_alloc(&qcfg, src->router != NULL,
                                      src->router != NULL && src->router_bias != NULL, &st);
    float *x = malloc(sizeof(float) * (size_t)(M * H));
    float *wdq = malloc(sizeof(float) * (size_t)(N1 * H));
    double *g = malloc(sizeof(double) * (size_t)N1), *a = malloc(sizeof(double) * (size_t)I);
    if (s == NVFP4MOE_OK && (!x || !wdq || !g || !a))
        s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    if (s == NVFP4MOE_OK) {
        l->storage_ = st;
        float in13;
        nvfp4moe_calibration_tokens(seed, M, H, x, &in13);
        for (int64_t e = 0; e < E && s == NVFP4MOE_OK; e++) {
            float in2;
            s = nvfp4moe_quantize_expert(cfg, src->w13 + e * N1 * H, src->w2 + e * H * I,
                                         src->w13_bias ? src->w13_bias + e * N1 : NULL, x, M,
                                         st->w13 + e * N1 * H / 2, st->w13_scale + e * N1 * H / 16,
                                         &st->w13_scale_2[e], st->w2 + e * H * I / 2,
                                         st->w2_scale + e * H * I / 16, &st->w2_scale_2[e], &in2, wdq, g, a);
            if (s != NVFP4MOE_OK) break;
            if (st->w13_input_scale) {
                st->w13_input_scale[e] = in13;
                st->w2_input_scale[e] = in2;
            }
        }
    }
    if (s == NVFP4MOE_OK) {   // one amax for both halves: one global scale, w13_scale_2
        free(st->w13_up_scale_2);
        st->w13_up_scale_2 = NULL;
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
        if (!l->storage_) nvfp4moe_ckpt_storage_free(st);
        nvfp4moe_ckpt_layer_free(l);
        return s;
    }
    l->layer.cfg = qcfg;
    l->index = 0;
    l->format = NVFP4MOE_CKPT_MODELOPT;
    nvfp4moe_ckpt_point_weights(l, st);
    *out = l;
    return NVFP4MOE_OK;
}
