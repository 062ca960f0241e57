/*
 * config_read.c - Hugging Face config.json (+ hf_quant_config.json / quantization_config) into a
 * deployment config, which layers are MoE, which modules are excluded.
 *
 * Model families name the same fields differently; the rules each field follows are listed at
 * nvfp4moe_model_info_read in the header. A field of the wrong JSON type is an error naming it,
 * never a silent default.
 */
#include "model/model.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_LAYERS 100000       /* more layers than any model has: a corrupt config */
#define MAX_EXCLUDED 65536      /* exclusion patterns: real lists name a few thousand modules */
#define MAX_CONFIG_BYTES (64u << 20)

typedef struct {
    nvfp4moe_pattern **patterns;
    int32_t n;
    uint8_t *is_moe;            /* [num_layers] */
} info_storage;

// ---- typed JSON field access ----
//
// Each returns OK with *present false when the key is absent or null, FORMAT naming the field
// when it has the wrong type.

static nvfp4moe_status get_int(json_t *obj, const char *key, const char *src, int64_t *v,
                               bool *present) {
    json_t *j = json_object_get(obj, key);
    *present = false;
    if (!j || json_is_null(j)) return NVFP4MOE_OK;
    if (json_is_integer(j)) {
        *v = (int64_t)json_integer_value(j);
    } else if (json_is_real(j) && json_real_value(j) == floor(json_real_value(j)) &&
               fabs(json_real_value(j)) < 9e15) {
        *v = (int64_t)json_real_value(j);
    } else {
        return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT, "%s: field \"%s\" must be a whole number",
                                  src, key);
    }
    *present = true;
    return NVFP4MOE_OK;
}

static nvfp4moe_status get_num(json_t *obj, const char *key, const char *src, double *v,
                               bool *present) {
    json_t *j = json_object_get(obj, key);
    *present = false;
    if (!j || json_is_null(j)) return NVFP4MOE_OK;
    NVFP4MOE_RETURN_IF(!json_is_number(j), NVFP4MOE_ERR_FORMAT,
                       "%s: field \"%s\" must be a number", src, key);
    *v = json_number_value(j);
    *present = true;
    return NVFP4MOE_OK;
}

static nvfp4moe_status get_bool(json_t *obj, const char *key, const char *src, bool *v,
                                bool *present) {
    json_t *j = json_object_get(obj, key);
    *present = false;
    if (!j || json_is_null(j)) return NVFP4MOE_OK;
    NVFP4MOE_RETURN_IF(!json_is_boolean(j), NVFP4MOE_ERR_FORMAT,
                       "%s: field \"%s\" must be true or false", src, key);
    *v = json_is_true(j);
    *present = true;
    return NVFP4MOE_OK;
}

static nvfp4moe_status get_str(json_t *obj, const char *key, const char *src, const char **v) {
    json_t *j = json_object_get(obj, key);
    *v = NULL;
    if (!j || json_is_null(j)) return NVFP4MOE_OK;
    NVFP4MOE_RETURN_IF(!json_is_string(j), NVFP4MOE_ERR_FORMAT,
                       "%s: field \"%s\" must be a string", src, key);
    *v = json_string_value(j);
    return NVFP4MOE_OK;
}

/* A positive int32 field: the first of keys present. */
static nvfp4moe_status get_pos_int32(json_t *obj, const char *const *keys, const char *src,
                                     int32_t *v, const char **which) {
    *which = NULL;
    for (const char *const *k = keys; *k; k++) {
        int64_t x;
        bool present;
        NVFP4MOE_TRY(get_int(obj, *k, src, &x, &present));
        if (!present) continue;
        NVFP4MOE_RETURN_IF(x < 0 || x > INT32_MAX, NVFP4MOE_ERR_FORMAT,
                           "%s: field \"%s\"=%lld is out of range", src, *k, (long long)x);
        *v = (int32_t)x;
        *which = *k;
        return NVFP4MOE_OK;
    }
    return NVFP4MOE_OK;
}

// ---- activation and routing ----

static nvfp4moe_status parse_activation(const char *act, const char *model_type, const char *src,
                                        nvfp4moe_activation *out) {
    static const struct {
        const char *hf;
        nvfp4moe_activation a;
    } k_map[] = {
        {"silu", NVFP4MOE_ACT_SILU},           {"swish", NVFP4MOE_ACT_SILU},
        {"gelu", NVFP4MOE_ACT_GELU},           {"gelu_pytorch_tanh", NVFP4MOE_ACT_GELU_TANH},
        {"gelu_new", NVFP4MOE_ACT_GELU_TANH},  {"gelu_fast", NVFP4MOE_ACT_GELU_TANH},
        {"gelu_tanh", NVFP4MOE_ACT_GELU_TANH}, {"relu2", NVFP4MOE_ACT_RELU2},
    };
    // gpt-oss names no activation: its experts always run the clamped, interleaved SwiGLU.
    if (model_type && !strcmp(model_type, "gpt_oss")) {
        *out = NVFP4MOE_ACT_SWIGLUOAI;
        return NVFP4MOE_OK;
    }
    if (!act) {
        *out = NVFP4MOE_ACT_SILU;
        return NVFP4MOE_OK;
    }
    for (size_t i = 0; i < sizeof k_map / sizeof k_map[0]; i++) {
        if (!strcmp(act, k_map[i].hf)) {
            *out = k_map[i].a;
            // Nemotron-H's experts are plain (non-gated) squared-ReLU MLPs.
            if (*out == NVFP4MOE_ACT_RELU2 && model_type && strstr(model_type, "nemotron"))
                *out = NVFP4MOE_ACT_RELU2_NO_MUL;
            return NVFP4MOE_OK;
        }
    }
    if (nvfp4moe_activation_parse(act, out) == NVFP4MOE_OK) return NVFP4MOE_OK;
    return nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED, "%s: field \"hidden_act\"=\"%s\" is not an "
                              "activation nvfp4moe runs", src, act);
}

static bool str_in(const char *s, const char *const *list) {
    for (; s && *list; list++)
        if (!strcmp(s, *list)) return true;
    return false;
}

/* Routing from the config's fields. cfg->routing and friends are set. */
static nvfp4moe_status parse_routing(json_t *c, const char *src, const char *model_type,
                                     nvfp4moe_config *cfg, nvfp4moe_warnings *warn) {
    const char *scoring = NULL, *topk_method = NULL;
    NVFP4MOE_TRY(get_str(c, "scoring_func", src, &scoring));
    NVFP4MOE_TRY(get_str(c, "topk_method", src, &topk_method));
    bool norm = true, has_norm;    // Mixtral-style configs renormalize without saying so
    NVFP4MOE_TRY(get_bool(c, "norm_topk_prob", src, &norm, &has_norm));
    if (!has_norm) norm = true;
    int64_t n_group = 0, topk_group = 0;
    bool has_ng, has_tg, has_rsf, has_bias_flag;
    NVFP4MOE_TRY(get_int(c, "n_group", src, &n_group, &has_ng));
    NVFP4MOE_TRY(get_int(c, "topk_group", src, &topk_group, &has_tg));
    double rsf = 1.0;
    NVFP4MOE_TRY(get_num(c, "routed_scaling_factor", src, &rsf, &has_rsf));
    cfg->routed_scaling_factor = has_rsf ? (float)rsf : 1.0f;
    bool use_routing_bias = false;
    NVFP4MOE_TRY(get_bool(c, "use_routing_bias", src, &use_routing_bias, &has_bias_flag));

    static const char *const k_grouped[] = {"deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe",
                                            "glm4_moe_lite", "glm_moe_dsa", "mistral_large_3",
                                            NULL};
    bool sigmoid = scoring && !strcmp(scoring, "sigmoid");
    NVFP4MOE_RETURN_IF(scoring && !sigmoid && strcmp(scoring, "softmax") != 0,
                       NVFP4MOE_ERR_UNSUPPORTED,
                       "%s: field \"scoring_func\"=\"%s\" (expected softmax or sigmoid)", src,
                       scoring);
    cfg->has_correction_bias = false;
    cfg->apply_router_weight_on_input = false;
    if (model_type && !strncmp(model_type, "llama4", 6)) {
        cfg->routing = NVFP4MOE_ROUTING_LLAMA4;
        cfg->apply_router_weight_on_input = true;
    } else if (model_type && !strncmp(model_type, "minimax", 7) && (sigmoid || !scoring)) {
        cfg->routing = NVFP4MOE_ROUTING_MINIMAX2;
        cfg->has_correction_bias = has_bias_flag ? use_routing_bias : true;
    } else if (str_in(model_type, k_grouped) || (topk_method && !strcmp(topk_method, "noaux_tc")) ||
               (has_ng && sigmoid)) {
        // DeepSeek-V3-style grouped top-k: sigmoid scores, correction bias when noaux_tc.
        cfg->routing = NVFP4MOE_ROUTING_DEEPSEEK_V3;
        cfg->n_group = has_ng && n_group > 0 ? (int32_t)n_group : 1;
        cfg->topk_group = has_tg && topk_group > 0 ? (int32_t)topk_group : 1;
        cfg->has_correction_bias = (topk_method && !strcmp(topk_method, "noaux_tc")) ||
                                   (model_type && !strncmp(model_type, "glm", 3));
        if (!norm)
            nvfp4moe_warn(warn, "%s: norm_topk_prob=false with grouped top-k routing: "
                          "deepseek_v3 routing always renormalizes", src);
    } else if (sigmoid) {
        cfg->routing = norm ? NVFP4MOE_ROUTING_SIGMOID_RENORM : NVFP4MOE_ROUTING_SIGMOID;
    } else {
        if (has_ng && n_group > 1)
            nvfp4moe_warn(warn, "%s: grouped softmax routing (n_group=%lld, DeepSeek-V2 style) is "
                          "not modelled: using plain top-k", src, (long long)n_group);
        cfg->routing = norm ? NVFP4MOE_ROUTING_RENORMALIZE : NVFP4MOE_ROUTING_SOFTMAX_TOPK;
    }
    return NVFP4MOE_OK;
}

// ---- quantization config ----

typedef struct {
    bool found;
    nvfp4moe_ckpt_format format;
    nvfp4moe_scheme scheme;
    char method[32], algo[32];
    json_t *excluded;           /* borrowed array of strings, or NULL */
} quant_desc;

/* A single ModelOpt quant_algo -> scheme; false if it is not an NVFP4 one. */
static bool nvfp4_algo(const char *algo, nvfp4moe_scheme *scheme) {
    if (!algo) return false;
    if (!strcmp(algo, "NVFP4")) *scheme = NVFP4MOE_SCHEME_W4A4;
    else if (!strcmp(algo, "W4A16_NVFP4") || !strcmp(algo, "NVFP4_W4A16")) *scheme = NVFP4MOE_SCHEME_W4A16;
    else return false;
    return true;
}

/* MIXED_PRECISION: per-module recipes in "quantized_layers" ({module: {"quant_algo": ...}}), or
 * config_groups whose targets name modules. The experts' recipe is the one that matters here. */
static nvfp4moe_status mixed_precision(json_t *quant, const char *src, quant_desc *q,
                                       nvfp4moe_warnings *warn) {
    json_t *ql = json_object_get(quant, "quantized_layers");
    const char *key;
    json_t *v;
    bool found = false;
    if (json_is_object(ql)) {
        json_object_foreach(ql, key, v) {
            if (!strstr(key, "experts") || strstr(key, "shared_expert")) continue;
            const char *a = json_string_value(json_object_get(v, "quant_algo"));
            nvfp4moe_scheme sc;
            if (!nvfp4_algo(a, &sc)) continue;
            if (found && sc != q->scheme)
                nvfp4moe_warn(warn, "%s: MIXED_PRECISION gives experts both %s and %s: using %s",
                              src, nvfp4moe_scheme_name(q->scheme), nvfp4moe_scheme_name(sc),
                              nvfp4moe_scheme_name(q->scheme));
            if (!found) {
                q->scheme = sc;
                nvfp4moe_strlcpy(q->algo, a, sizeof q->algo);
            }
            found = true;
        }
    }
    json_t *groups = json_object_get(quant, "config_groups");
    if (!found && json_is_object(groups)) {
        json_object_foreach(groups, key, v) {
            json_t *w = json_object_get(v, "weights"), *t = json_object_get(v, "targets");
            if (json_integer_value(json_object_get(w, "num_bits")) != 4) continue;
            bool experts = false;
            for (size_t i = 0; json_is_array(t) && i < json_array_size(t); i++) {
                const char *tn = json_string_value(json_array_get(t, i));
                experts |= tn && strstr(tn, "experts") && !strstr(tn, "shared_expert");
            }
            if (!experts) continue;
            json_t *ia = json_object_get(v, "input_activations");
            q->scheme = ia && !json_is_null(ia) ? NVFP4MOE_SCHEME_W4A4 : NVFP4MOE_SCHEME_W4A16;
            nvfp4moe_strlcpy(q->algo, q->scheme == NVFP4MOE_SCHEME_W4A4 ? "NVFP4" : "W4A16_NVFP4",
                             sizeof q->algo);
            found = true;
            break;
        }
    }
    NVFP4MOE_RETURN_IF(!found, NVFP4MOE_ERR_UNSUPPORTED,
                       "%s: quant_algo MIXED_PRECISION quantizes no routed experts with NVFP4", src);
    char expert_algo[32];
    nvfp4moe_strlcpy(expert_algo, q->algo, sizeof expert_algo);
    snprintf(q->algo, sizeof q->algo, "MIXED_PRECISION/%.15s", expert_algo);
    return NVFP4MOE_OK;
}

/* ModelOpt's quant_algo -> scheme. quant is the object holding it (for MIXED_PRECISION). */
static nvfp4moe_status modelopt_algo(const char *algo, json_t *quant, const char *src, quant_desc *q,
                                     nvfp4moe_warnings *warn) {
    if (!algo)
        return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT, "%s: ModelOpt config has no \"quant_algo\"",
                                  src);
    if (!strcmp(algo, "MIXED_PRECISION")) {
        NVFP4MOE_TRY(mixed_precision(quant, src, q, warn));
    } else if (nvfp4_algo(algo, &q->scheme)) {   // NVFP4 / W4A16_NVFP4
        nvfp4moe_strlcpy(q->algo, algo, sizeof q->algo);
    } else {
        return nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                                  "%s: quant_algo \"%s\" is not an NVFP4 scheme (NVFP4, W4A16_NVFP4, "
                                  "or MIXED_PRECISION with NVFP4 experts)",
                                  src, algo);
    }
    q->found = true;
    q->format = NVFP4MOE_CKPT_MODELOPT;
    nvfp4moe_strlcpy(q->method, "modelopt", sizeof q->method);
    return NVFP4MOE_OK;
}

/* hf_quant_config.json: {"producer": ..., "quantization": {"quant_algo", "exclude_modules"}}. */
static nvfp4moe_status parse_hf_quant(json_t *root, const char *src, quant_desc *q,
                                      nvfp4moe_warnings *warn) {
    json_t *quant = json_object_get(root, "quantization");
    NVFP4MOE_RETURN_IF(!json_is_object(quant), NVFP4MOE_ERR_FORMAT,
                       "%s: missing or non-object \"quantization\"", src);
    const char *algo;
    NVFP4MOE_TRY(get_str(quant, "quant_algo", src, &algo));
    NVFP4MOE_TRY(modelopt_algo(algo, quant, src, q, warn));
    q->excluded = json_object_get(quant, "exclude_modules");
    return NVFP4MOE_OK;
}

/* compressed-tensors: the config group whose weights are 4-bit float in groups of 16. */
static nvfp4moe_status parse_ct(json_t *qc, const char *src, quant_desc *q) {
    const char *fmt = NULL;
    NVFP4MOE_TRY(get_str(qc, "format", src, &fmt));
    json_t *groups = json_object_get(qc, "config_groups");
    NVFP4MOE_RETURN_IF(!json_is_object(groups), NVFP4MOE_ERR_FORMAT,
                       "%s: compressed-tensors quantization_config has no \"config_groups\"", src);
    const char *gname;
    json_t *g;
    json_object_foreach(groups, gname, g) {
        json_t *wts = json_object_get(g, "weights");
        if (!json_is_object(wts)) continue;
        int64_t bits = 0, gs = 0;
        bool p1, p2;
        const char *type = NULL, *gfmt = NULL;
        NVFP4MOE_TRY(get_int(wts, "num_bits", src, &bits, &p1));
        NVFP4MOE_TRY(get_int(wts, "group_size", src, &gs, &p2));
        NVFP4MOE_TRY(get_str(wts, "type", src, &type));
        NVFP4MOE_TRY(get_str(g, "format", src, &gfmt));
        if (!(bits == 4 && gs == 16 && type && !strcmp(type, "float"))) continue;
        const char *f = gfmt ? gfmt : fmt;
        NVFP4MOE_RETURN_IF(!f || strcmp(f, "nvfp4-pack-quantized") != 0, NVFP4MOE_ERR_UNSUPPORTED,
                           "%s: config group '%s' is FP4 but its format is \"%s\", not "
                           "nvfp4-pack-quantized",
                           src, gname, f ? f : "(none)");
        json_t *ia = json_object_get(g, "input_activations");
        if (!ia || json_is_null(ia)) {
            q->scheme = NVFP4MOE_SCHEME_W4A16;
        } else {
            int64_t abits = 0;
            bool pa;
            NVFP4MOE_TRY(get_int(ia, "num_bits", src, &abits, &pa));
            // vLLM: "NVFP4 weight + INT8/FP8 activation is not supported."
            NVFP4MOE_RETURN_IF(abits != 4, NVFP4MOE_ERR_UNSUPPORTED,
                               "%s: config group '%s': NVFP4 weights with %lld-bit activations are "
                               "not supported",
                               src, gname, (long long)abits);
            q->scheme = NVFP4MOE_SCHEME_W4A4;
        }
        q->found = true;
        q->format = NVFP4MOE_CKPT_COMPRESSED_TENSORS;
        nvfp4moe_strlcpy(q->method, "compressed-tensors", sizeof q->method);
        nvfp4moe_strlcpy(q->algo, "nvfp4-pack-quantized", sizeof q->algo);
        q->excluded = json_object_get(qc, "ignore");
        return NVFP4MOE_OK;
    }
    return nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                              "%s: compressed-tensors config has no NVFP4 group (4-bit float "
                              "weights, group_size 16)",
                              src);
}

/* config.json "quantization_config". */
static nvfp4moe_status parse_quant_config(json_t *qc, const char *src, quant_desc *q,
                                          nvfp4moe_warnings *warn) {
    const char *method = NULL;
    NVFP4MOE_TRY(get_str(qc, "quant_method", src, &method));
    NVFP4MOE_RETURN_IF(!method, NVFP4MOE_ERR_FORMAT,
                       "%s: quantization_config has no \"quant_method\"", src);
    if (!strcmp(method, "compressed-tensors")) return parse_ct(qc, src, q);
    if (!strcmp(method, "modelopt") || !strcmp(method, "modelopt_fp4")) {
        const char *algo = NULL;
        NVFP4MOE_TRY(get_str(qc, "quant_algo", src, &algo));
        json_t *nested = json_object_get(qc, "quantization");
        json_t *holder = qc;
        if (!algo && json_is_object(nested)) {
            NVFP4MOE_TRY(get_str(nested, "quant_algo", src, &algo));
            holder = nested;
        }
        NVFP4MOE_TRY(modelopt_algo(algo, holder, src, q, warn));
        q->excluded = json_object_get(qc, "ignore");
        if (!q->excluded) q->excluded = json_object_get(qc, "exclude_modules");
        if (!q->excluded && json_is_object(nested))
            q->excluded = json_object_get(nested, "exclude_modules");
        return NVFP4MOE_OK;
    }
    return nvfp4moe_set_error(NVFP4MOE_ERR_UNSUPPORTED,
                              "%s: quant_method \"%s\" is not NVFP4 (modelopt or "
                              "compressed-tensors)",
                              src, method);
}

// ---- exclusion patterns ----

/* Whether the exclusion pattern p covers module: it matches the name, or it is a plain module name
 * that contains it ("model.layers.3.mlp" covers model.layers.3.mlp.experts). */
static bool pattern_covers(const nvfp4moe_pattern *p, const char *module) {
    if (nvfp4moe_pattern_match(p, module)) return true;
    const char *pat = nvfp4moe_pattern_text(p);
    size_t n = strlen(pat);
    return n && !strncmp(pat, module, n) && module[n] == '.';
}

// ---- reading ----

void nvfp4moe_model_info_free(nvfp4moe_model_info *info) {
    if (!nvfp4moe_handle_remove(info, NVFP4MOE_HANDLE_MODEL_INFO)) return;   // NULL, freed already, or not ours
    info_storage *s = info->storage_;
    if (s) {
        for (int32_t i = 0; i < s->n; i++) nvfp4moe_pattern_free(s->patterns[i]);
        free(s->patterns);
        free(s->is_moe);
        free(s);
    }
    free(info);
}

bool nvfp4moe_model_info_is_moe_layer(const nvfp4moe_model_info *info, int32_t layer) {
    if (!info || layer < 0 || layer >= info->num_layers) return false;
    const info_storage *s = info->storage_;
    return s->is_moe[layer] != 0;
}

const char *nvfp4moe_model_info_excluded(const nvfp4moe_model_info *info, int32_t i) {
    if (!info || i < 0 || i >= info->num_excluded) return NULL;
    const info_storage *s = info->storage_;
    return nvfp4moe_pattern_text(s->patterns[i]);
}

bool nvfp4moe_model_info_is_excluded(const nvfp4moe_model_info *info, const char *module) {
    if (!info || !module) return false;
    const info_storage *s = info->storage_;
    for (int32_t i = 0; i < s->n; i++)
        if (pattern_covers(s->patterns[i], module)) return true;
    return false;
}

static nvfp4moe_status take_excluded(json_t *arr, const char *src, info_storage *s) {
    if (!arr || json_is_null(arr)) return NVFP4MOE_OK;
    NVFP4MOE_RETURN_IF(!json_is_array(arr), NVFP4MOE_ERR_FORMAT,
                       "%s: the excluded-modules list is not an array", src);
    size_t n = json_array_size(arr);
    NVFP4MOE_RETURN_IF(n > MAX_EXCLUDED, NVFP4MOE_ERR_FORMAT,
                       "%s: %zu excluded-module patterns, more than %d", src, n, MAX_EXCLUDED);
    s->patterns = calloc(n ? n : 1, sizeof *s->patterns);
    NVFP4MOE_RETURN_IF(!s->patterns, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(arr, i);
        NVFP4MOE_RETURN_IF(!json_is_string(e), NVFP4MOE_ERR_FORMAT,
                           "%s: excluded module %zu is not a string", src, i);
        NVFP4MOE_TRY(nvfp4moe_pattern_compile(json_string_value(e), src, &s->patterns[s->n]));
        s->n++;
    }
    return NVFP4MOE_OK;
}

/* Which layers are MoE. */
static nvfp4moe_status moe_layers(json_t *c, const char *src, nvfp4moe_model_info *info,
                                  info_storage *s) {
    int32_t L = info->num_layers;
    s->is_moe = calloc(L ? (size_t)L : 1, 1);
    NVFP4MOE_RETURN_IF(!s->is_moe, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    int64_t first_dense = 0, freq = 1, sparse_step = 1, interleave = 1;
    bool has_fd, has_freq, has_ss, has_il;
    NVFP4MOE_TRY(get_int(c, "first_k_dense_replace", src, &first_dense, &has_fd));
    NVFP4MOE_TRY(get_int(c, "moe_layer_freq", src, &freq, &has_freq));
    NVFP4MOE_TRY(get_int(c, "decoder_sparse_step", src, &sparse_step, &has_ss));
    NVFP4MOE_TRY(get_int(c, "interleave_moe_layer_step", src, &interleave, &has_il));
    NVFP4MOE_RETURN_IF(has_freq && freq < 1, NVFP4MOE_ERR_FORMAT,
                       "%s: field \"moe_layer_freq\"=%lld must be >= 1", src, (long long)freq);
    NVFP4MOE_RETURN_IF(has_ss && sparse_step < 1, NVFP4MOE_ERR_FORMAT,
                       "%s: field \"decoder_sparse_step\"=%lld must be >= 1", src,
                       (long long)sparse_step);
    NVFP4MOE_RETURN_IF(has_il && interleave < 1, NVFP4MOE_ERR_FORMAT,
                       "%s: field \"interleave_moe_layer_step\"=%lld must be >= 1", src,
                       (long long)interleave);
    json_t *mlp_only = json_object_get(c, "mlp_only_layers");
    json_t *moe_list = json_object_get(c, "moe_layers");
    NVFP4MOE_RETURN_IF(mlp_only && !json_is_null(mlp_only) && !json_is_array(mlp_only),
                       NVFP4MOE_ERR_FORMAT, "%s: field \"mlp_only_layers\" must be a list", src);
    NVFP4MOE_RETURN_IF(moe_list && !json_is_null(moe_list) && !json_is_array(moe_list),
                       NVFP4MOE_ERR_FORMAT, "%s: field \"moe_layers\" must be a list", src);
    for (int32_t i = 0; i < L; i++) {
        bool moe = i >= first_dense && i % freq == 0 && (i + 1) % sparse_step == 0 &&
                   (i + 1) % interleave == 0;
        s->is_moe[i] = moe;
    }
    if (json_is_array(mlp_only)) {
        for (size_t k = 0; k < json_array_size(mlp_only); k++) {
            json_t *e = json_array_get(mlp_only, k);
            NVFP4MOE_RETURN_IF(!json_is_integer(e), NVFP4MOE_ERR_FORMAT,
                               "%s: field \"mlp_only_layers\"[%zu] is not a layer number", src, k);
            json_int_t v = json_integer_value(e);
            if (v >= 0 && v < L) s->is_moe[v] = 0;
        }
    }
    if (json_is_array(moe_list)) {
        memset(s->is_moe, 0, (size_t)L);
        for (size_t k = 0; k < json_array_size(moe_list); k++) {
            json_t *e = json_array_get(moe_list, k);
            NVFP4MOE_RETURN_IF(!json_is_integer(e) || json_integer_value(e) < 0 ||
                                   json_integer_value(e) >= L,
                               NVFP4MOE_ERR_FORMAT,
                               "%s: field \"moe_layers\"[%zu] is not a layer number below %d", src,
                               k, L);
            s->is_moe[json_integer_value(e)] = 1;
        }
    }
    info->first_moe_layer = -1;
    for (int32_t i = 0; i < L; i++) {
        if (!s->is_moe[i]) continue;
        if (info->first_moe_layer < 0) info->first_moe_layer = i;
        info->num_moe_layers++;
    }
    return NVFP4MOE_OK;
}

static nvfp4moe_status parse_model(json_t *root, json_t *hfq, const char *name,
                                   nvfp4moe_model_info *info, info_storage *s) {
    char src[600], hsrc[600];
    snprintf(src, sizeof src, "%s/config.json", name);
    snprintf(hsrc, sizeof hsrc, "%s/hf_quant_config.json", name);
    NVFP4MOE_RETURN_IF(!json_is_object(root), NVFP4MOE_ERR_FORMAT, "%s: not a JSON object", src);
    nvfp4moe_config *cfg = &info->cfg;
    nvfp4moe_config_init(cfg);

    // Multimodal wrappers (Llama-4, ...) keep the language model's fields in text_config.
    json_t *c = root;
    json_t *tc = json_object_get(root, "text_config");
    if (json_is_object(tc) && !json_object_get(root, "hidden_size")) c = tc;

    const char *mt = NULL;
    NVFP4MOE_TRY(get_str(c, "model_type", src, &mt));
    if (!mt) NVFP4MOE_TRY(get_str(root, "model_type", src, &mt));
    nvfp4moe_strlcpy(info->model_type, mt ? mt : "", sizeof info->model_type);
    // Where the decoder layers' tensors are (the loaders try the others too): Llama-4's multimodal
    // wrapper, Qwen3-VL-MoE's and Qwen3.5-MoE's (model_type qwen3_vl_moe_text / qwen3_5_moe_text in
    // text_config), else the plain causal LM's.
    const char *prefix = "model.layers";
    if (mt && !strcmp(mt, "llama4")) prefix = "language_model.model.layers";
    else if (mt && (!strncmp(mt, "qwen3_vl_moe", 12) || !strncmp(mt, "qwen3_5_moe", 11)))
        prefix = "model.language_model.layers";
    nvfp4moe_strlcpy(info->prefix, prefix, sizeof info->prefix);

    static const char *const k_experts[] = {"num_experts", "n_routed_experts", "num_local_experts",
                                            "moe_num_experts", NULL};
    static const char *const k_inter[] = {"moe_intermediate_size", "intermediate_size", NULL};
    static const char *const k_topk[] = {"num_experts_per_tok", "moe_topk", "experts_per_token",
                                         "top_k", NULL};
    static const char *const k_hidden[] = {"hidden_size", NULL};
    static const char *const k_layers[] = {"num_hidden_layers", "n_layers", NULL};
    const char *which;
    int32_t E = 0, I = 0, K = 0, H = 0, L = 0;
    NVFP4MOE_TRY(get_pos_int32(c, k_experts, src, &E, &which));
    NVFP4MOE_TRY(get_pos_int32(c, k_inter, src, &I, &which));
    NVFP4MOE_TRY(get_pos_int32(c, k_topk, src, &K, &which));
    NVFP4MOE_TRY(get_pos_int32(c, k_hidden, src, &H, &which));
    NVFP4MOE_RETURN_IF(!which, NVFP4MOE_ERR_FORMAT, "%s: missing field \"hidden_size\"", src);
    NVFP4MOE_TRY(get_pos_int32(c, k_layers, src, &L, &which));
    NVFP4MOE_RETURN_IF(!which, NVFP4MOE_ERR_FORMAT, "%s: missing field \"num_hidden_layers\"", src);
    NVFP4MOE_RETURN_IF(L > MAX_LAYERS, NVFP4MOE_ERR_FORMAT,
                       "%s: field \"num_hidden_layers\"=%d is absurd (more than %d)", src, L,
                       MAX_LAYERS);
    info->num_layers = L;
    cfg->hidden_size = H;
    if (E > 0) {
        cfg->num_experts = E;
        NVFP4MOE_RETURN_IF(I <= 0, NVFP4MOE_ERR_FORMAT,
                           "%s: MoE model without \"moe_intermediate_size\" or "
                           "\"intermediate_size\"", src);
        NVFP4MOE_RETURN_IF(K <= 0, NVFP4MOE_ERR_FORMAT,
                           "%s: MoE model without \"num_experts_per_tok\"", src);
        cfg->intermediate_size = I;
        cfg->top_k = K;
    }

    int64_t nshared = 0, shared_i = 0;
    bool p1, p2;
    NVFP4MOE_TRY(get_int(c, "n_shared_experts", src, &nshared, &p1));
    NVFP4MOE_TRY(get_int(c, "shared_expert_intermediate_size", src, &shared_i, &p2));
    info->num_shared_experts = (int32_t)(nshared > 0 ? nshared : (shared_i > 0 ? 1 : 0));

    const char *act = NULL;
    NVFP4MOE_TRY(get_str(c, "hidden_act", src, &act));
    if (!act) NVFP4MOE_TRY(get_str(c, "mlp_hidden_act", src, &act));
    NVFP4MOE_TRY(parse_activation(act, mt, src, &cfg->activation));
    // gpt-oss's experts have biases (gate_up_proj_bias, down_proj_bias), which config.json does not
    // say; the oracle checks them (several kernels reject expert biases). Loading a layer sets
    // has_bias from the tensors actually present.
    if (mt && !strcmp(mt, "gpt_oss")) cfg->has_bias = true;
    double limit;
    bool has_limit;
    NVFP4MOE_TRY(get_num(c, "swiglu_limit", src, &limit, &has_limit));
    if (has_limit) {
        cfg->has_swiglu_limit = true;
        cfg->swiglu_limit = limit;
    }
    const char *dt = NULL;
    NVFP4MOE_TRY(get_str(c, "torch_dtype", src, &dt));
    if (!dt) NVFP4MOE_TRY(get_str(root, "torch_dtype", src, &dt));
    if (dt && (!strcmp(dt, "float16") || !strcmp(dt, "half")))
        cfg->in_dtype = cfg->out_dtype = NVFP4MOE_DTYPE_FP16;
    NVFP4MOE_TRY(parse_routing(c, src, mt, cfg, &info->warnings));
    if (E > 0) NVFP4MOE_TRY(moe_layers(c, src, info, s));
    else {   // no experts: every layer is dense, and the per-layer table says so for each
        s->is_moe = calloc(L ? (size_t)L : 1, 1);
        NVFP4MOE_RETURN_IF(!s->is_moe, NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
        info->first_moe_layer = -1;
    }

    // Quantization: config.json's quantization_config wins over hf_quant_config.json (what vLLM
    // reads first); a disagreement between the two is reported.
    quant_desc q = {0}, qh = {0};
    json_t *qc = json_object_get(root, "quantization_config");
    if (qc && !json_is_null(qc)) {
        NVFP4MOE_RETURN_IF(!json_is_object(qc), NVFP4MOE_ERR_FORMAT,
                           "%s: \"quantization_config\" is not an object", src);
        NVFP4MOE_TRY(parse_quant_config(qc, src, &q, &info->warnings));
        nvfp4moe_strlcpy(info->quant_source, "config.json", sizeof info->quant_source);
    }
    if (hfq) {
        NVFP4MOE_TRY(parse_hf_quant(hfq, hsrc, &qh, &info->warnings));
        if (!q.found) {
            q = qh;
            nvfp4moe_strlcpy(info->quant_source, "hf_quant_config.json", sizeof info->quant_source);
        } else if (strcmp(q.algo, qh.algo) != 0 && q.format == NVFP4MOE_CKPT_MODELOPT) {
            nvfp4moe_warn(&info->warnings,
                          "config.json says quant_algo \"%s\" but hf_quant_config.json says \"%s\": "
                          "using config.json's, as vLLM does", q.algo, qh.algo);
        }
    }
    if (q.found) {
        info->quantized = true;
        info->format_known = q.format == NVFP4MOE_CKPT_COMPRESSED_TENSORS;
        info->format = q.format;
        cfg->scheme = q.scheme;
        nvfp4moe_strlcpy(info->quant_method, q.method, sizeof info->quant_method);
        nvfp4moe_strlcpy(info->quant_algo, q.algo, sizeof info->quant_algo);
        NVFP4MOE_TRY(take_excluded(q.excluded, q.format == NVFP4MOE_CKPT_MODELOPT &&
                                                   !strcmp(info->quant_source, "hf_quant_config.json")
                                               ? hsrc : src, s));
        info->num_excluded = s->n;
    } else {
        info->format = NVFP4MOE_CKPT_UNQUANTIZED;
        info->format_known = true;
    }
    return NVFP4MOE_OK;
}

nvfp4moe_status nvfp4moe_model_info_parse(const char *config_json, const char *hf_quant_json,
                                          const char *name, nvfp4moe_model_info **out) {
    NVFP4MOE_RETURN_IF(!config_json || !out, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "model_info_parse: NULL argument");
    if (!name) name = ".";
    json_error_t err;
    json_t *root = json_loads(config_json, JSON_REJECT_DUPLICATES, &err);
    NVFP4MOE_RETURN_IF(!root, NVFP4MOE_ERR_FORMAT, "%s/config.json: not valid JSON: %s (line %d)",
                       name, err.text, err.line);
    json_t *hfq = NULL;
    if (hf_quant_json) {
        hfq = json_loads(hf_quant_json, JSON_REJECT_DUPLICATES, &err);
        if (!hfq) {
            json_decref(root);
            return nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                                      "%s/hf_quant_config.json: not valid JSON: %s (line %d)", name,
                                      err.text, err.line);
        }
    }
    nvfp4moe_model_info *info = calloc(1, sizeof *info);
    info_storage *s = calloc(1, sizeof *s);
    nvfp4moe_status st;
    if (!info || !s || nvfp4moe_handle_add(info, NVFP4MOE_HANDLE_MODEL_INFO) != NVFP4MOE_OK) {
        free(info);
        free(s);
        st = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "out of memory");
    } else {
        info->storage_ = s;
        st = parse_model(root, hfq, name, info, s);
        if (st != NVFP4MOE_OK) nvfp4moe_model_info_free(info);
        else *out = info;
    }
    json_decref(root);
    if (hfq) json_decref(hfq);
    return st;
}

nvfp4moe_status nvfp4moe_model_info_read(const char *dir, nvfp4moe_model_info **out) {
    NVFP4MOE_RETURN_IF(!dir || !out, NVFP4MOE_ERR_INVALID_ARGUMENT, "model_info_read: NULL");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *config = NULL, *hfq = NULL;
    NVFP4MOE_TRY(nvfp4moe_read_text_file(path, MAX_CONFIG_BYTES, &config));
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    nvfp4moe_status s = nvfp4moe_read_text_file(path, MAX_CONFIG_BYTES, &hfq);
    if (s == NVFP4MOE_ERR_NOT_FOUND) s = NVFP4MOE_OK, hfq = NULL;
    if (s == NVFP4MOE_OK) s = nvfp4moe_model_info_parse(config, hfq, dir, out);
    free(config);
    free(hfq);
    return s;
}
