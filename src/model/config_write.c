/*
 * config_write.c - config.json and hf_quant_config.json for a layer's config, as `nvfp4moe
 * quantize` writes them next to the tensors; config_read.c reads them back to the same config.
 */
#include "model/model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- writing ----

/* model_type and routing keys that read back as cfg's routing. */
static bool set_routing_fields(json_t *c, const nvfp4moe_config *cfg, int32_t first_moe) {
    bool ok = true;
    switch (cfg->routing) {
    case NVFP4MOE_ROUTING_DEEPSEEK_V3:
        ok = json_object_set_new(c, "model_type", json_string("deepseek_v3")) == 0 &&
             json_object_set_new(c, "n_routed_experts", json_integer(cfg->num_experts)) == 0 &&
             json_object_set_new(c, "scoring_func", json_string("sigmoid")) == 0 &&
             json_object_set_new(c, "topk_method", json_string(cfg->has_correction_bias
                                                                   ? "noaux_tc"
                                                                   : "group_limited_greedy")) == 0 &&
             json_object_set_new(c, "n_group", json_integer(cfg->n_group)) == 0 &&
             json_object_set_new(c, "topk_group", json_integer(cfg->topk_group)) == 0 &&
             json_object_set_new(c, "norm_topk_prob", json_true()) == 0 &&
             json_object_set_new(c, "first_k_dense_replace", json_integer(first_moe)) == 0 &&
             json_object_set_new(c, "moe_layer_freq", json_integer(1)) == 0;
        break;
    case NVFP4MOE_ROUTING_LLAMA4:
        ok = json_object_set_new(c, "model_type", json_string("llama4_text")) == 0;
        break;
    case NVFP4MOE_ROUTING_MINIMAX2:
        ok = json_object_set_new(c, "model_type", json_string("minimax_m2")) == 0 &&
             json_object_set_new(c, "scoring_func", json_string("sigmoid")) == 0 &&
             json_object_set_new(c, "use_routing_bias",
                                 json_boolean(cfg->has_correction_bias)) == 0;
        break;
    case NVFP4MOE_ROUTING_SIGMOID:
    case NVFP4MOE_ROUTING_SIGMOID_RENORM:
        ok = json_object_set_new(c, "model_type", json_string("nvfp4moe_layer")) == 0 &&
             json_object_set_new(c, "scoring_func", json_string("sigmoid")) == 0 &&
             json_object_set_new(c, "norm_topk_prob",
                                 json_boolean(cfg->routing == NVFP4MOE_ROUTING_SIGMOID_RENORM)) == 0;
        break;
    default:
        ok = json_object_set_new(c, "model_type",
                                 json_string(cfg->activation == NVFP4MOE_ACT_SWIGLUOAI
                                                 ? "gpt_oss"
                                                 : "qwen3_moe")) == 0 &&
             json_object_set_new(c, "norm_topk_prob",
                                 json_boolean(cfg->routing != NVFP4MOE_ROUTING_SOFTMAX_TOPK)) == 0;
        break;
    }
    if (cfg->routing != NVFP4MOE_ROUTING_DEEPSEEK_V3 && first_moe > 0) {
        json_t *dense = json_array();
        for (int32_t i = 0; i < first_moe && dense; i++) json_array_append_new(dense, json_integer(i));
        ok = ok && dense && json_object_set_new(c, "mlp_only_layers", dense) == 0;
    }
    return ok;
}

static const char *hf_act_name(nvfp4moe_activation a) {
    switch (a) {
    case NVFP4MOE_ACT_GELU_TANH: return "gelu_pytorch_tanh";
    default: return nvfp4moe_activation_name(a);
    }
}

static json_t *make_config(const nvfp4moe_config *cfg, int32_t num_layers, int32_t first_moe) {
    json_t *c = json_object();
    if (!c) return NULL;
    bool ok = json_object_set_new(c, "architectures", json_pack("[s]", "NvFp4MoeLayer")) == 0 &&
              json_object_set_new(c, "hidden_size", json_integer(cfg->hidden_size)) == 0 &&
              json_object_set_new(c, "moe_intermediate_size",
                                  json_integer(cfg->intermediate_size)) == 0 &&
              json_object_set_new(c, "num_experts", json_integer(cfg->num_experts)) == 0 &&
              json_object_set_new(c, "num_experts_per_tok", json_integer(cfg->top_k)) == 0 &&
              json_object_set_new(c, "num_hidden_layers", json_integer(num_layers)) == 0 &&
              json_object_set_new(c, "hidden_act", json_string(hf_act_name(cfg->activation))) == 0 &&
              json_object_set_new(c, "routed_scaling_factor",
                                  json_real(cfg->routed_scaling_factor)) == 0 &&
              json_object_set_new(c, "torch_dtype", json_string(cfg->in_dtype == NVFP4MOE_DTYPE_FP16
                                                                    ? "float16"
                                                                    : "bfloat16")) == 0;
    if (ok && cfg->has_swiglu_limit)
        ok = json_object_set_new(c, "swiglu_limit", json_real(cfg->swiglu_limit)) == 0;
    ok = ok && set_routing_fields(c, cfg, first_moe);
    if (!ok) {
        json_decref(c);
        return NULL;
    }
    return c;
}

/* ModelOpt's quantization_config in config.json (what its export converts hf_quant_config.json
 * into): config_groups for NVFP4, the exclusions as "ignore", quant_algo, producer, quant_method. */
static json_t *modelopt_quant_config(const char *algo, json_t *excluded) {
    json_t *qc = json_object();
    bool ok = qc != NULL;
    if (ok && !strcmp(algo, "NVFP4")) {
        json_t *g = json_pack("{s:{s:{s:b,s:i,s:s,s:i},s:{s:b,s:i,s:s,s:i},s:[s]}}", "group_0", "input_activations",
                              "dynamic", 0, "num_bits", 4, "type", "float", "group_size", 16, "weights", "dynamic", 0,
                              "num_bits", 4, "type", "float", "group_size", 16, "targets", "Linear");
        ok = g && json_object_set_new(qc, "config_groups", g) == 0;
    }
    ok = ok && json_object_set(qc, "ignore", excluded) == 0 &&
         json_object_set_new(qc, "quant_algo", json_string(algo)) == 0 &&
         json_object_set_new(qc, "producer", json_pack("{s:s,s:s}", "name", "nvfp4moe", "version",
                                                       nvfp4moe_version())) == 0 &&
         json_object_set_new(qc, "quant_method", json_string("modelopt")) == 0;
    if (!ok && qc) json_decref(qc);
    return ok ? qc : NULL;
}

/* Writes dir/config.json (c, taken, with its quantization_config replaced per fmt) and, for ModelOpt,
 * dir/hf_quant_config.json; excluded (borrowed): the exclude_modules / ignore list. */
static nvfp4moe_status write_configs(const char *dir, json_t *c, nvfp4moe_ckpt_format fmt, bool w4a16,
                                     json_t *excluded) {
    json_object_del(c, "quantization_config");
    json_t *hfq = NULL;
    bool ok = excluded != NULL;
    if (ok && fmt == NVFP4MOE_CKPT_COMPRESSED_TENSORS) {
        json_t *ia = w4a16 ? json_null()
                           : json_pack("{s:i,s:s,s:s,s:i,s:b,s:s}", "num_bits", 4, "type", "float",
                                       "strategy", "tensor_group", "group_size", 16, "symmetric",
                                       1, "dynamic", "local");
        json_t *qc = json_pack("{s:s,s:s,s:{s:{s:{s:i,s:s,s:s,s:i,s:b,s:b},s:o,s:[s],s:s}},s:O}",
                               "quant_method", "compressed-tensors", "format",
                               "nvfp4-pack-quantized", "config_groups", "group_0", "weights",
                               "num_bits", 4, "type", "float", "strategy", "tensor_group",
                               "group_size", 16, "symmetric", 1, "dynamic", 0,
                               "input_activations", ia, "targets", "Linear", "format",
                               "nvfp4-pack-quantized", "ignore", excluded);
        ok = qc && json_object_set_new(c, "quantization_config", qc) == 0;
    } else if (ok && fmt != NVFP4MOE_CKPT_UNQUANTIZED) {
        const char *algo = w4a16 ? "W4A16_NVFP4" : "NVFP4";
        json_t *qc = modelopt_quant_config(algo, excluded);
        hfq = json_pack("{s:{s:s,s:s},s:{s:s,s:n,s:i,s:O}}", "producer", "name", "nvfp4moe", "version",
                        nvfp4moe_version(), "quantization", "quant_algo", algo, "kv_cache_quant_algo",
                        "group_size", 16, "exclude_modules", excluded);
        ok = qc && hfq && json_object_set_new(c, "quantization_config", qc) == 0;
    }
    char *text = ok ? json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    char *htext = ok && hfq ? json_dumps(hfq, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(c);
    if (hfq) json_decref(hfq);
    nvfp4moe_status s = NVFP4MOE_OK;
    if (!text || (hfq && !htext)) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "model_config_write: out of memory");
    } else {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", dir);
        s = nvfp4moe_write_text_file(path, text);
        if (s == NVFP4MOE_OK && htext) {
            snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
            s = nvfp4moe_write_text_file(path, htext);
        }
    }
    free(text);
    free(htext);
    return s;
}

nvfp4moe_status nvfp4moe_model_config_write(const char *dir, const nvfp4moe_config *cfg,
                                            int32_t num_layers, int32_t first_moe_layer,
                                            nvfp4moe_ckpt_format fmt,
                                            const char *base_config_json,
                                            const char *router_name) {
    NVFP4MOE_RETURN_IF(!dir || !cfg, NVFP4MOE_ERR_INVALID_ARGUMENT, "model_config_write: NULL");
    NVFP4MOE_RETURN_IF((unsigned)fmt >= NVFP4MOE_CKPT_FORMAT_COUNT, NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "model_config_write: bad format %d", (int)fmt);
    NVFP4MOE_RETURN_IF(num_layers < 1 || first_moe_layer < 0 || first_moe_layer >= num_layers,
                       NVFP4MOE_ERR_INVALID_ARGUMENT,
                       "model_config_write: first_moe_layer=%d must be in [0, num_layers=%d)",
                       first_moe_layer, num_layers);
    json_t *c;
    if (base_config_json) {
        json_error_t err;
        c = json_loads(base_config_json, JSON_REJECT_DUPLICATES, &err);
        if (c && !json_is_object(c)) json_decref(c), c = NULL;
        NVFP4MOE_RETURN_IF(!c, NVFP4MOE_ERR_FORMAT, "base config.json: not a JSON object: %s", err.text);
    } else {
        c = make_config(cfg, num_layers, first_moe_layer);
        NVFP4MOE_RETURN_IF(!c, NVFP4MOE_ERR_OUT_OF_MEMORY, "model_config_write: out of memory");
    }
    // The router and everything that is not an expert stays unquantized, as real exports do. The
    // exclusion names the router module the tensors use (gpt-oss: mlp.router), or vLLM would
    // build that Linear as NVFP4 and look for scales it does not have.
    const char *router = nvfp4moe_ckpt_router_name(router_name, cfg);
    char pattern[64];
    if (fmt == NVFP4MOE_CKPT_COMPRESSED_TENSORS) snprintf(pattern, sizeof pattern, "re:.*mlp\\.%s$", router);
    else snprintf(pattern, sizeof pattern, "*.mlp.%s", router);
    json_t *excluded = json_pack("[s,s]", "lm_head", pattern);
    nvfp4moe_status s = write_configs(dir, c, fmt, cfg->scheme == NVFP4MOE_SCHEME_W4A16, excluded);
    if (excluded) json_decref(excluded);
    return s;
}

nvfp4moe_status nvfp4moe_model_config_write_quantized(const char *dir, const char *base_config_json,
                                                      nvfp4moe_ckpt_format fmt, bool w4a16,
                                                      const char *const *excluded, size_t n_excluded) {
    json_error_t err;
    json_t *c = json_loads(base_config_json, JSON_REJECT_DUPLICATES, &err);
    if (c && !json_is_object(c)) json_decref(c), c = NULL;
    NVFP4MOE_RETURN_IF(!c, NVFP4MOE_ERR_FORMAT, "config.json: not a JSON object: %s", err.text);
    json_t *ex = json_array();
    bool ok = ex != NULL;
    for (size_t i = 0; i < n_excluded && ok; i++) ok = json_array_append_new(ex, json_string(excluded[i])) == 0;
    if (!ok) {
        json_decref(c);
        if (ex) json_decref(ex);
        return nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT,
                                  "the exclusion list: cannot encode it (module names must be UTF-8)");
    }
    nvfp4moe_status s = write_configs(dir, c, fmt, w4a16, ex);
    json_decref(ex);
    return s;
}
