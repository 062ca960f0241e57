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
        NVFP4MOE_RETURN_IF(!c || !json_is_object(c), NVFP4MOE_ERR_FORMAT,
                           "base config.json: not a JSON object: %s", c ? "" : err.text);
        json_object_del(c, "quantization_config");
    } else {
        c = make_config(cfg, num_layers, first_moe_layer);
        NVFP4MOE_RETURN_IF(!c, NVFP4MOE_ERR_OUT_OF_MEMORY, "model_config_write: out of memory");
    }
    bool w4a16 = cfg->scheme == NVFP4MOE_SCHEME_W4A16;
    // The router and everything that is not an expert stays unquantized, as real exports do. The
    // exclusion names the router module the tensors use (gpt-oss: mlp.router), or vLLM would
    // build that Linear as NVFP4 and look for scales it does not have.
    const char *router = nvfp4moe_ckpt_router_name(router_name, cfg);
    char ct_router[64], mo_router[64];
    snprintf(ct_router, sizeof ct_router, "re:.*mlp\\.%s$", router);
    snprintf(mo_router, sizeof mo_router, "*.mlp.%s", router);
    json_t *ignore = json_pack("[s,s]", "lm_head", ct_router);
    json_t *hfq = NULL;
    bool ok = ignore != NULL;
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
                               "nvfp4-pack-quantized", "ignore", ignore);
        ok = qc && json_object_set_new(c, "quantization_config", qc) == 0;
    } else if (ok && fmt != NVFP4MOE_CKPT_UNQUANTIZED) {
        const char *algo = w4a16 ? "W4A16_NVFP4" : "NVFP4";
        json_t *ex = json_pack("[s,s]", "lm_head", mo_router);
        json_t *qc = ex ? json_pack("{s:s,s:s,s:O,s:{s:s,s:s}}", "quant_method", "modelopt",
                                    "quant_algo", algo, "ignore", ex, "producer", "name",
                                    "nvfp4moe", "version", nvfp4moe_version())
                        : NULL;
        hfq = ex ? json_pack("{s:{s:s,s:s},s:{s:s,s:n,s:i,s:O}}", "producer", "name", "nvfp4moe",
                             "version", nvfp4moe_version(), "quantization", "quant_algo", algo,
                             "kv_cache_quant_algo", "group_size", 16, "exclude_modules", ex)
                 : NULL;
        ok = qc && hfq && json_object_set_new(c, "quantization_config", qc) == 0;
        if (ex) json_decref(ex);
    }
    if (ignore) json_decref(ignore);
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
