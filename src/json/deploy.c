/*
 * deploy.c - deployment keys, vLLM's names and ours, read from JSON objects into an
 * nvfp4moe_config; and the config written back with the canonical keys. The key list is in
 * include/nvfp4moe.h (the JSON interface) and docs/python.md.
 */
#include "json/json_internal.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

typedef enum {
    K_I32,          /* an int32 field, >= 0 */
    K_SEED,         /* the uint64 seed, >= 0 */
    K_F32,          /* a float field (null: its default) */
    K_BOOL,
    K_DTYPE,        /* one nvfp4moe_dtype field ("auto": unchanged) */
    K_DTYPE_BOTH,   /* in_dtype and out_dtype */
    K_ACTIVATION,
    K_ROUTING,
    K_SCHEME,
    K_BACKEND,      /* moe_backend */
    K_ALL2ALL,
    K_SWIGLU_LIMIT, /* a double; null: no limit */
    K_LORA_CONFIG,  /* vLLM's lora_config: an object turns LoRA on, null off */
    K_TP, K_DP, K_EP, K_EP_RANK, K_ENABLE_EP, K_EPLB,
    K_SECTION,      /* an object of the same keys (vLLM's config sections) */
} key_kind;

typedef struct key_def {
    const char *name;
    key_kind kind;
    size_t offset;   /* into nvfp4moe_config, for the field kinds */
    uint32_t given;  /* DEPLOY_GIVEN_* bit it sets */
} key_def;

#define F(field) offsetof(nvfp4moe_config, field)

/* The canonical names first (json_config_object writes them), then vLLM's where they differ. */
static const key_def k_keys[] = {
    {"num_experts", K_I32, F(num_experts), DEPLOY_GIVEN_EXPERTS},
    {"top_k", K_I32, F(top_k), DEPLOY_GIVEN_TOP_K},
    {"hidden_size", K_I32, F(hidden_size), DEPLOY_GIVEN_HIDDEN},
    {"intermediate_size", K_I32, F(intermediate_size), DEPLOY_GIVEN_INTER},
    {"in_dtype", K_DTYPE, F(in_dtype), 0},
    {"out_dtype", K_DTYPE, F(out_dtype), 0},
    {"activation", K_ACTIVATION, F(activation), 0},
    {"swiglu_limit", K_SWIGLU_LIMIT, 0, 0},
    {"swiglu_alpha", K_F32, F(swiglu_alpha), 0},
    {"swiglu_beta", K_F32, F(swiglu_beta), 0},
    {"situ_beta", K_F32, F(situ_beta), 0},
    {"situ_linear_beta", K_F32, F(situ_linear_beta), 0},
    {"routing", K_ROUTING, F(routing), 0},
    {"n_group", K_I32, F(n_group), 0},
    {"topk_group", K_I32, F(topk_group), 0},
    {"routed_scaling_factor", K_F32, F(routed_scaling_factor), 0},
    {"has_correction_bias", K_BOOL, F(has_correction_bias), DEPLOY_GIVEN_CORR},
    {"router_logits_dtype", K_DTYPE, F(router_logits_dtype), 0},
    {"apply_router_weight_on_input", K_BOOL, F(apply_router_weight_on_input), 0},
    {"scheme", K_SCHEME, F(scheme), 0},
    {"tp_size", K_TP, 0, 0},
    {"dp_size", K_DP, 0, 0},
    {"ep_size", K_EP, 0, 0},
    {"ep_rank", K_EP_RANK, 0, 0},
    {"all2all", K_ALL2ALL, 0, 0},
    {"eplb", K_EPLB, 0, 0},
    {"has_bias", K_BOOL, F(has_bias), DEPLOY_GIVEN_BIAS},
    {"lora", K_BOOL, F(lora), 0},
    {"batch_invariant", K_BOOL, F(batch_invariant), 0},
    {"requantization_source", K_BOOL, F(requantization_source), 0},
    {"force_a16", K_BOOL, F(force_a16), 0},
    {"moe_backend", K_BACKEND, 0, 0},
    {"seed", K_SEED, 0, 0},
    /* vLLM's names (engine arguments, config fields, environment variables) and Hugging Face's */
    {"n_routed_experts", K_I32, F(num_experts), DEPLOY_GIVEN_EXPERTS},
    {"num_local_experts", K_I32, F(num_experts), DEPLOY_GIVEN_EXPERTS},
    {"num_experts_per_tok", K_I32, F(top_k), DEPLOY_GIVEN_TOP_K},
    {"moe_intermediate_size", K_I32, F(intermediate_size), DEPLOY_GIVEN_INTER},
    /* vLLM's FusedMoEConfig fields */
    {"experts_per_token", K_I32, F(top_k), DEPLOY_GIVEN_TOP_K},
    {"hidden_dim", K_I32, F(hidden_size), DEPLOY_GIVEN_HIDDEN},
    {"intermediate_size_per_partition", K_I32, F(intermediate_size), DEPLOY_GIVEN_INTER},
    {"activation_situ_beta", K_F32, F(situ_beta), 0},
    {"activation_situ_linear_beta", K_F32, F(situ_linear_beta), 0},
    {"is_lora_enabled", K_BOOL, F(lora), 0},
    {"dtype", K_DTYPE_BOTH, 0, 0},
    {"hidden_act", K_ACTIVATION, F(activation), 0},
    {"tensor_parallel_size", K_TP, 0, 0},
    {"data_parallel_size", K_DP, 0, 0},
    {"enable_expert_parallel", K_ENABLE_EP, 0, 0},
    {"all2all_backend", K_ALL2ALL, 0, 0},
    {"enable_eplb", K_EPLB, 0, 0},
    {"enable_lora", K_BOOL, F(lora), 0},
    {"lora_config", K_LORA_CONFIG, 0, 0},
    {"VLLM_BATCH_INVARIANT", K_BOOL, F(batch_invariant), 0},
    {"VLLM_B12X_MOE_FP4_FORCE_A16", K_BOOL, F(force_a16), 0},
    {"parallel_config", K_SECTION, 0, 0},
    {"kernel_config", K_SECTION, 0, 0},
    {"model_config", K_SECTION, 0, 0},
};
#define N_KEYS ((int)(sizeof k_keys / sizeof k_keys[0]))

/* The canonical names, for an unknown key's message. */
static void key_list(char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_KEYS && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", k_keys[i].name);
}

static const key_def *find_key(const char *name) {
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(k_keys[i].name, name)) return &k_keys[i];
    return NULL;
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:  return "an object";
    case JSON_ARRAY:   return "an array";
    case JSON_STRING:  return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL:    return "a number";
    case JSON_TRUE:
    case JSON_FALSE:   return "a boolean";
    case JSON_NULL:    return "null";
    }
    return "?";
}

#define BAD(...) nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT, __VA_ARGS__)

void json_deploy_init(json_deploy *d) {
    memset(d, 0, sizeof *d);
    nvfp4moe_config_init(&d->cfg);
    d->enable_ep = -1;
}

void json_deploy_model(json_deploy *d, const nvfp4moe_model_info *info, json_t *warnings) {
    d->cfg = info->cfg;
    d->given |= DEPLOY_GIVEN_MODEL;
    d->ep_set = false;
    d->enable_ep = -1;
    d->ep_and_enable = false;
    for (int32_t i = 0; warnings && i < info->warnings.count; i++)
        json_array_append_new(warnings, json_string(info->warnings.text[i]));
    if (warnings && info->warnings.dropped) {
        char more[64];
        snprintf(more, sizeof more, "... and %d more", (int)info->warnings.dropped);
        json_array_append_new(warnings, json_string(more));
    }
}

/* A name value: a string, "torch." allowed before a dtype. */
static nvfp4moe_status name_value(const json_t *v, const char *where, const char *key, const char **out) {
    if (!json_is_string(v)) return BAD("%s.%s: expected a string, got %s", where, key, json_kind(v));
    *out = json_string_value(v);
    return NVFP4MOE_OK;
}

/* Rewrites a name parser's failure (NOT_FOUND listing the accepted names) as a bad value of key. */
static nvfp4moe_status bad_name(nvfp4moe_status s, const char *where, const char *key) {
    if (s == NVFP4MOE_OK) return s;
    char msg[768];
    nvfp4moe_strlcpy(msg, nvfp4moe_last_error(), sizeof msg);
    return BAD("%s.%s: %s", where, key, msg);
}

static nvfp4moe_status int_value(const json_t *v, const char *where, const char *key, long long max, long long *out) {
    if (!json_is_integer(v)) return BAD("%s.%s: expected an integer, got %s", where, key, json_kind(v));
    long long x = json_integer_value(v);
    if (x < 0 || x > max) return BAD("%s.%s=%lld: must be in [0, %lld]", where, key, x, max);
    *out = x;
    return NVFP4MOE_OK;
}

static nvfp4moe_status apply_key(json_deploy *d, const key_def *k, json_t *v, const char *where, bool strict,
                                 bool *src_ep, bool *src_enable);

/* One object of keys (a source or one of its sections). */
static nvfp4moe_status apply_object(json_deploy *d, json_t *obj, const char *where, bool strict, bool *src_ep,
                                    bool *src_enable) {
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        const key_def *k = find_key(name);
        if (!k) {
            if (!strict) continue;
            char list[1536];
            key_list(list, sizeof list);
            return BAD("%s: unknown key '%s' (accepted: %s)", where, name, list);
        }
        NVFP4MOE_TRY(apply_key(d, k, v, where, strict, src_ep, src_enable));
    }
    return NVFP4MOE_OK;
}

static nvfp4moe_status apply_key(json_deploy *d, const key_def *k, json_t *v, const char *where, bool strict,
                                 bool *src_ep, bool *src_enable) {
    nvfp4moe_config *c = &d->cfg;
    char *base = (char *)c;
    const char *key = k->name, *s = NULL;
    long long n = 0;

    if (json_is_null(v)) {   /* None: leave the key as it is, except the optional ones */
        if (k->kind == K_SWIGLU_LIMIT) {
            c->has_swiglu_limit = false;
            c->swiglu_limit = 0.0;
        } else if (k->kind == K_LORA_CONFIG) {
            c->lora = false;
        }
        return NVFP4MOE_OK;
    }
    switch (k->kind) {
    case K_SECTION: {
        if (!json_is_object(v)) return BAD("%s.%s: expected an object, got %s", where, key, json_kind(v));
        char sub[128];
        snprintf(sub, sizeof sub, "%s.%s", where, key);
        return apply_object(d, v, sub, strict, src_ep, src_enable);
    }
    case K_I32:
        NVFP4MOE_TRY(int_value(v, where, key, INT32_MAX, &n));
        *(int32_t *)(void *)(base + k->offset) = (int32_t)n;
        break;
    case K_SEED:
        NVFP4MOE_TRY(int_value(v, where, key, INT64_MAX, &n));
        c->seed = (uint64_t)n;
        break;
    case K_F32:
    case K_SWIGLU_LIMIT: {
        if (!json_is_number(v)) return BAD("%s.%s: expected a number, got %s", where, key, json_kind(v));
        double x = json_number_value(v);
        if (!isfinite(x)) return BAD("%s.%s: must be finite", where, key);
        if (k->kind == K_SWIGLU_LIMIT) {
            c->has_swiglu_limit = true;
            c->swiglu_limit = x;
        } else {
            *(float *)(void *)(base + k->offset) = (float)x;
        }
        break;
    }
    case K_BOOL:
    case K_ENABLE_EP:
    case K_EPLB:
        if (!json_is_boolean(v)) return BAD("%s.%s: expected true or false, got %s", where, key, json_kind(v));
        if (k->kind == K_ENABLE_EP) {
            d->enable_ep = json_is_true(v);
            *src_enable = true;
        } else if (k->kind == K_EPLB) {
            c->parallel.eplb = json_is_true(v);
        } else {
            *(bool *)(void *)(base + k->offset) = json_is_true(v);
        }
        break;
    case K_DTYPE:
    case K_DTYPE_BOTH: {
        NVFP4MOE_TRY(name_value(v, where, key, &s));
        if (!strncmp(s, "torch.", 6)) s += 6;
        if (!strcmp(s, "auto")) break;   /* vLLM: the model's dtype */
        nvfp4moe_dtype dt;
        NVFP4MOE_TRY(bad_name(nvfp4moe_dtype_parse(s, &dt), where, key));
        if (k->kind == K_DTYPE_BOTH) {
            c->in_dtype = c->out_dtype = dt;
        } else if (k->offset == offsetof(nvfp4moe_config, out_dtype)) {
            c->out_dtype = dt;
            d->out_dtype_given = true;
        } else if (k->offset == offsetof(nvfp4moe_config, in_dtype)) {
            /* vLLM has one activation dtype (FusedMoEConfig.in_dtype): the output's too, unless
             * out_dtype is given, before or after */
            c->in_dtype = dt;
            if (!d->out_dtype_given) c->out_dtype = dt;
        } else {
            *(nvfp4moe_dtype *)(void *)(base + k->offset) = dt;
        }
        break;
    }
    case K_ACTIVATION:
        NVFP4MOE_TRY(name_value(v, where, key, &s));
        NVFP4MOE_TRY(bad_name(nvfp4moe_activation_parse(s, &c->activation), where, key));
        break;
    case K_ROUTING:
        NVFP4MOE_TRY(name_value(v, where, key, &s));
        NVFP4MOE_TRY(bad_name(nvfp4moe_routing_parse(s, &c->routing), where, key));
        break;
    case K_SCHEME:
        NVFP4MOE_TRY(name_value(v, where, key, &s));
        NVFP4MOE_TRY(bad_name(nvfp4moe_scheme_parse(s, &c->scheme), where, key));
        break;
    case K_BACKEND:
    case K_ALL2ALL: {
        NVFP4MOE_TRY(name_value(v, where, key, &s));
        char *dst = k->kind == K_BACKEND ? c->moe_backend : c->parallel.all2all;
        size_t cap = k->kind == K_BACKEND ? sizeof c->moe_backend : sizeof c->parallel.all2all;
        if (strlen(s) >= cap) return BAD("%s.%s: '%s' is too long (at most %zu bytes)", where, key, s, cap - 1);
        nvfp4moe_strlcpy(dst, s, cap);
        break;
    }
    case K_LORA_CONFIG:
        if (!json_is_object(v)) return BAD("%s.%s: expected an object or null, got %s", where, key, json_kind(v));
        c->lora = true;
        break;
    case K_TP:
    case K_DP:
    case K_EP:
    case K_EP_RANK:
        NVFP4MOE_TRY(int_value(v, where, key, INT32_MAX, &n));
        if (k->kind == K_TP) c->parallel.tp_size = (int32_t)n;
        else if (k->kind == K_DP) c->parallel.dp_size = (int32_t)n;
        else if (k->kind == K_EP_RANK) c->parallel.ep_rank = (int32_t)n;
        else {
            d->ep = (int32_t)n;
            *src_ep = true;
        }
        break;
    }
    d->given |= k->given;
    return NVFP4MOE_OK;
}

nvfp4moe_status json_deploy_apply(json_deploy *d, json_t *obj, const char *where, bool strict) {
    if (!json_is_object(obj)) return BAD("%s: expected an object, got %s", where, json_kind(obj));
    bool src_ep = false, src_enable = false;
    NVFP4MOE_TRY(apply_object(d, obj, where, strict, &src_ep, &src_enable));
    /* The source that names expert parallelism last decides it: an explicit ep_size, or
     * enable_expert_parallel (derived at the end from the final TP and DP), or both (they must
     * agree). */
    if (src_ep) d->ep_set = true;
    if (src_ep && !src_enable) d->enable_ep = -1;
    if (src_enable && !src_ep) d->ep_set = false;
    if (src_ep || src_enable) d->ep_and_enable = src_ep && src_enable;
    return NVFP4MOE_OK;
}

nvfp4moe_status json_deploy_finish(json_deploy *d) {
    nvfp4moe_parallel *p = &d->cfg.parallel;
    if (d->enable_ep >= 0) {
        /* FusedMoEParallelConfig.make: use_ep = enable_expert_parallel and tp * dp > 1, and then
         * the experts are split over ep_size = tp * dp ranks. */
        const long long ranks = (long long)p->tp_size * (long long)p->dp_size;
        if (ranks > INT32_MAX)
            return BAD("tensor_parallel_size=%d x data_parallel_size=%d is too large", p->tp_size, p->dp_size);
        const int32_t derived = d->enable_ep && ranks > 1 ? (int32_t)ranks : 1;
        if (d->ep_and_enable && d->ep != derived)
            return BAD("ep_size=%d does not match enable_expert_parallel=%s with tensor_parallel_size=%d and "
                       "data_parallel_size=%d (which give ep_size=%d): give one of them", d->ep,
                       d->enable_ep ? "true" : "false", p->tp_size, p->dp_size, derived);
        p->ep_size = derived;
    } else if (d->ep_set) {
        p->ep_size = d->ep;
    }
    /* vLLM's default all2all backend names no all2all at all without expert parallelism. */
    if (p->ep_size <= 1 && !strcmp(p->all2all, "allgather_reducescatter")) p->all2all[0] = '\0';
    return NVFP4MOE_OK;
}

// ---- the canonical form ----

/* A float field: null when it is NaN (the "default" of the SwiGLU alpha and beta). */
static json_t *float_value(double x) { return isfinite(x) ? json_real(x) : json_null(); }

json_t *json_config_object(const nvfp4moe_config *c) {
    json_t *o = json_object();
    if (!o) return NULL;
    int bad = 0;
#define SET(k, v) (bad |= json_object_set_new(o, (k), (v)))
    SET("num_experts", json_integer(c->num_experts));
    SET("top_k", json_integer(c->top_k));
    SET("hidden_size", json_integer(c->hidden_size));
    SET("intermediate_size", json_integer(c->intermediate_size));
    SET("in_dtype", json_string(nvfp4moe_dtype_name(c->in_dtype)));
    SET("out_dtype", json_string(nvfp4moe_dtype_name(c->out_dtype)));
    SET("activation", json_string(nvfp4moe_activation_name(c->activation)));
    SET("swiglu_limit", c->has_swiglu_limit ? json_real(c->swiglu_limit) : json_null());
    SET("swiglu_alpha", float_value(c->swiglu_alpha));
    SET("swiglu_beta", float_value(c->swiglu_beta));
    SET("situ_beta", float_value(c->situ_beta));
    SET("situ_linear_beta", float_value(c->situ_linear_beta));
    SET("routing", json_string(nvfp4moe_routing_name(c->routing)));
    SET("n_group", json_integer(c->n_group));
    SET("topk_group", json_integer(c->topk_group));
    SET("routed_scaling_factor", float_value(c->routed_scaling_factor));
    SET("has_correction_bias", json_boolean(c->has_correction_bias));
    SET("router_logits_dtype", json_string(nvfp4moe_dtype_name(c->router_logits_dtype)));
    SET("apply_router_weight_on_input", json_boolean(c->apply_router_weight_on_input));
    SET("scheme", json_string(nvfp4moe_scheme_name(c->scheme)));
    SET("tp_size", json_integer(c->parallel.tp_size));
    SET("dp_size", json_integer(c->parallel.dp_size));
    SET("ep_size", json_integer(c->parallel.ep_size));
    SET("ep_rank", json_integer(c->parallel.ep_rank));
    SET("all2all", json_string(c->parallel.all2all));
    SET("eplb", json_boolean(c->parallel.eplb));
    SET("has_bias", json_boolean(c->has_bias));
    SET("lora", json_boolean(c->lora));
    SET("batch_invariant", json_boolean(c->batch_invariant));
    SET("requantization_source", json_boolean(c->requantization_source));
    SET("force_a16", json_boolean(c->force_a16));
    SET("moe_backend", json_string(c->moe_backend));
    SET("seed", json_integer((json_int_t)(c->seed > (uint64_t)INT64_MAX ? (uint64_t)INT64_MAX : c->seed)));
#undef SET
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}
