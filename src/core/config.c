/*
 * config.c - the deployment config: defaults, names of the enumerations, validation.
 */
#include "core/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

// ---- names ----

typedef struct {
    const char *name;
    int value;
} name_entry;

static const name_entry k_dtype_names[] = {
    {"bf16", NVFP4MOE_DTYPE_BF16}, {"fp16", NVFP4MOE_DTYPE_FP16}, {"f32", NVFP4MOE_DTYPE_F32},
    /* aliases */
    {"bfloat16", NVFP4MOE_DTYPE_BF16}, {"float16", NVFP4MOE_DTYPE_FP16}, {"half", NVFP4MOE_DTYPE_FP16},
    {"fp32", NVFP4MOE_DTYPE_F32}, {"float32", NVFP4MOE_DTYPE_F32}, {"float", NVFP4MOE_DTYPE_F32},
};
static const int k_dtype_canonical = 3;

static const name_entry k_activation_names[] = {
    {"silu", NVFP4MOE_ACT_SILU},
    {"gelu", NVFP4MOE_ACT_GELU},
    {"gelu_tanh", NVFP4MOE_ACT_GELU_TANH},
    {"relu2", NVFP4MOE_ACT_RELU2},
    {"swigluoai", NVFP4MOE_ACT_SWIGLUOAI},
    {"swigluoai_uninterleave", NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE},
    {"swiglustep", NVFP4MOE_ACT_SWIGLUSTEP},
    {"situ", NVFP4MOE_ACT_SITU},
    {"silu_no_mul", NVFP4MOE_ACT_SILU_NO_MUL},
    {"gelu_no_mul", NVFP4MOE_ACT_GELU_NO_MUL},
    {"gelu_tanh_no_mul", NVFP4MOE_ACT_GELU_TANH_NO_MUL},
    {"relu2_no_mul", NVFP4MOE_ACT_RELU2_NO_MUL},
    /* aliases */
    {"gelu_pytorch_tanh", NVFP4MOE_ACT_GELU_TANH},
};
static const int k_activation_canonical = NVFP4MOE_ACT_COUNT;

static const name_entry k_routing_names[] = {
    {"softmax", NVFP4MOE_ROUTING_SOFTMAX_TOPK},
    {"renormalize", NVFP4MOE_ROUTING_RENORMALIZE},
    {"deepseek_v3", NVFP4MOE_ROUTING_DEEPSEEK_V3},
    {"llama4", NVFP4MOE_ROUTING_LLAMA4},
    {"renormalize_naive", NVFP4MOE_ROUTING_RENORMALIZE_NAIVE},
    {"sigmoid_renorm", NVFP4MOE_ROUTING_SIGMOID_RENORM},
    {"minimax2", NVFP4MOE_ROUTING_MINIMAX2},
    {"sigmoid", NVFP4MOE_ROUTING_SIGMOID},
    {"simulated", NVFP4MOE_ROUTING_SIMULATED},
    /* aliases */
    {"default", NVFP4MOE_ROUTING_SOFTMAX_TOPK},
    {"softmax_topk", NVFP4MOE_ROUTING_SOFTMAX_TOPK},
    {"deepseekv3", NVFP4MOE_ROUTING_DEEPSEEK_V3},
};
static const int k_routing_canonical = NVFP4MOE_ROUTING_COUNT;

static const name_entry k_scheme_names[] = {
    {"w4a4", NVFP4MOE_SCHEME_W4A4},
    {"w4a4-per-token", NVFP4MOE_SCHEME_W4A4_PER_TOKEN},
    {"w4a16", NVFP4MOE_SCHEME_W4A16},
    {"w4a8-mxfp8", NVFP4MOE_SCHEME_W4A8_MXFP8},
};
static const int k_scheme_canonical = NVFP4MOE_SCHEME_COUNT;

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *lookup_name(const name_entry *t, int canonical, int v) {
    for (int i = 0; i < canonical; i++)
        if (t[i].value == v) return t[i].name;
    return "?";
}


static nvfp4moe_status parse_name(const char *what, const name_entry *t, int n, int canonical,
                                  const char *s, int *out) {
    NVFP4MOE_RETURN_IF(!s, NVFP4MOE_ERR_INVALID_ARGUMENT, "%s name is NULL", what);
    for (int i = 0; i < n; i++) {
        if (nvfp4moe_name_eq(s, t[i].name)) {
            *out = t[i].value;
            return NVFP4MOE_OK;
        }
    }
    char list[512] = "";
    size_t used = 0;
    nvfp4moe_suggest sg;
    nvfp4moe_suggest_init(&sg, s);
    for (int i = 0; i < n; i++) nvfp4moe_suggest_add(&sg, t[i].name);
    for (int i = 0; i < canonical && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", t[i].name);
    const char *best = nvfp4moe_suggest_best(&sg);
    for (int i = 0; best && i < n; i++)   /* the nearest may be an alias: name what it stands for */
        if (t[i].name == best) best = lookup_name(t, canonical, t[i].value);
    return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND, "unknown %s '%s' (expected one of: %s)%s%s%s", what, s, list,
                              best ? "; did you mean '" : "", best ? best : "", best ? "'?" : "");
}

const char *nvfp4moe_dtype_name(nvfp4moe_dtype d) { return lookup_name(k_dtype_names, k_dtype_canonical, d); }
const char *nvfp4moe_activation_name(nvfp4moe_activation a) {
    return lookup_name(k_activation_names, k_activation_canonical, a);
}
const char *nvfp4moe_routing_name(nvfp4moe_routing r) { return lookup_name(k_routing_names, k_routing_canonical, r); }
const char *nvfp4moe_scheme_name(nvfp4moe_scheme s) { return lookup_name(k_scheme_names, k_scheme_canonical, s); }

nvfp4moe_status nvfp4moe_dtype_parse(const char *s, nvfp4moe_dtype *out) {
    int v = 0;
    NVFP4MOE_TRY(parse_name("dtype", k_dtype_names, COUNT(k_dtype_names), k_dtype_canonical, s, &v));
    *out = (nvfp4moe_dtype)v;
    return NVFP4MOE_OK;
}
nvfp4moe_status nvfp4moe_activation_parse(const char *s, nvfp4moe_activation *out) {
    int v = 0;
    NVFP4MOE_TRY(parse_name("activation", k_activation_names, COUNT(k_activation_names),
                            k_activation_canonical, s, &v));
    *out = (nvfp4moe_activation)v;
    return NVFP4MOE_OK;
}
nvfp4moe_status nvfp4moe_routing_parse(const char *s, nvfp4moe_routing *out) {
    int v = 0;
    NVFP4MOE_TRY(parse_name("routing method", k_routing_names, COUNT(k_routing_names),
                            k_routing_canonical, s, &v));
    *out = (nvfp4moe_routing)v;
    return NVFP4MOE_OK;
}
nvfp4moe_status nvfp4moe_scheme_parse(const char *s, nvfp4moe_scheme *out) {
    int v = 0;
    NVFP4MOE_TRY(parse_name("quantization scheme", k_scheme_names, COUNT(k_scheme_names),
                            k_scheme_canonical, s, &v));
    *out = (nvfp4moe_scheme)v;
    return NVFP4MOE_OK;
}

bool nvfp4moe_activation_is_gated(nvfp4moe_activation a) { return a < NVFP4MOE_ACT_SILU_NO_MUL; }

// ---- defaults ----

void nvfp4moe_config_init(nvfp4moe_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->num_experts = 128;   /* Qwen3-30B-A3B */
    cfg->top_k = 8;
    cfg->hidden_size = 2048;
    cfg->intermediate_size = 768;
    cfg->in_dtype = NVFP4MOE_DTYPE_BF16;
    cfg->out_dtype = NVFP4MOE_DTYPE_BF16;
    cfg->activation = NVFP4MOE_ACT_SILU;
    cfg->has_swiglu_limit = false;
    cfg->swiglu_limit = 0.0;
    cfg->swiglu_alpha = NAN;
    cfg->swiglu_beta = NAN;
    cfg->situ_beta = 4.0f;
    cfg->situ_linear_beta = 25.0f;
    cfg->routing = NVFP4MOE_ROUTING_RENORMALIZE;
    cfg->n_group = 1;
    cfg->topk_group = 1;
    cfg->routed_scaling_factor = 1.0f;
    cfg->router_logits_dtype = NVFP4MOE_DTYPE_F32;
    cfg->scheme = NVFP4MOE_SCHEME_W4A4;
    cfg->parallel.tp_size = 1;
    cfg->parallel.dp_size = 1;
    cfg->parallel.ep_size = 1;
    cfg->parallel.ep_rank = 0;
    nvfp4moe_strlcpy(cfg->moe_backend, "auto", sizeof cfg->moe_backend);
    cfg->seed = 0;
}

int32_t nvfp4moe_config_n1(const nvfp4moe_config *cfg) {
    if (!cfg) return 0;
    const int64_t n1 = (nvfp4moe_activation_is_gated(cfg->activation) ? 2 : 1) * (int64_t)cfg->intermediate_size;
    return n1 <= INT32_MAX && n1 >= INT32_MIN ? (int32_t)n1 : 0;
}

nvfp4moe_act_params nvfp4moe_config_act_params(const nvfp4moe_config *cfg) {
    nvfp4moe_act_params p = {0};
    if (!cfg) return p;
    p.has_limit = cfg->has_swiglu_limit;
    p.limit = (float)cfg->swiglu_limit;
    p.alpha = 1.0f;
    p.beta = 0.0f;
    p.situ_beta = cfg->situ_beta;
    p.situ_linear_beta = cfg->situ_linear_beta;
    switch (cfg->activation) {
    case NVFP4MOE_ACT_SWIGLUOAI:
        /* gpt-oss: alpha 1.702, limit 7, (u + 1); vLLM's kernel uses these when none is given. */
        p.has_limit = true;
        p.limit = cfg->has_swiglu_limit ? (float)cfg->swiglu_limit : 7.0f;
        p.alpha = isnan(cfg->swiglu_alpha) ? 1.702f : cfg->swiglu_alpha;
        p.beta = isnan(cfg->swiglu_beta) ? 1.0f : cfg->swiglu_beta;
        break;
    case NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE:
        p.alpha = isnan(cfg->swiglu_alpha) ? 1.0f : cfg->swiglu_alpha;
        p.beta = isnan(cfg->swiglu_beta) ? 0.0f : cfg->swiglu_beta;
        break;
    case NVFP4MOE_ACT_SWIGLUSTEP:
        /* Step-3.5: both halves limited at 7 unless the model gives its own limit. */
        p.has_limit = true;
        p.limit = cfg->has_swiglu_limit ? (float)cfg->swiglu_limit : 7.0f;
        break;
    default:
        break;
    }
    return p;
}

// ---- validation ----

static const char *const k_all2all_names[] = {
    "", "allgather_reducescatter", "naive", "pplx", "deepep_high_throughput", "deepep_low_latency",
    "nixl_ep", "mori", "flashinfer_all2allv", "flashinfer_nvlink_one_sided",
    "flashinfer_nvlink_two_sided",
};

bool nvfp4moe_config_uses_all2all(const nvfp4moe_config *cfg) {
    return cfg->parallel.ep_size > 1 && cfg->parallel.dp_size > 1;
}

bool nvfp4moe_config_batched_format(const nvfp4moe_config *cfg) {
    const char *a = cfg->parallel.all2all;
    return nvfp4moe_config_uses_all2all(cfg) && (!strcmp(a, "deepep_low_latency") || !strcmp(a, "nixl_ep"));
}

#define INVALID(...) nvfp4moe_set_error(NVFP4MOE_ERR_INVALID_ARGUMENT, __VA_ARGS__)

nvfp4moe_status nvfp4moe_config_validate(const nvfp4moe_config *c) {
    NVFP4MOE_RETURN_IF(!c, NVFP4MOE_ERR_INVALID_ARGUMENT, "config is NULL");
    if (c->num_experts < 1 || c->num_experts > 65536)
        return INVALID("num_experts=%d must be between 1 and 65536", c->num_experts);
    if (c->top_k < 1 || c->top_k > c->num_experts)
        return INVALID("top_k=%d must be between 1 and num_experts=%d", c->top_k, c->num_experts);
    if (c->hidden_size < 16 || c->hidden_size % 16 || c->hidden_size > NVFP4MOE_MAX_DIM)
        return INVALID("hidden_size=%d must be a positive multiple of 16 (NVFP4 blocks), at most %d",
                       c->hidden_size, NVFP4MOE_MAX_DIM);
    if (c->intermediate_size < 16 || c->intermediate_size % 16 || c->intermediate_size > NVFP4MOE_MAX_DIM)
        return INVALID("intermediate_size=%d must be a positive multiple of 16 (NVFP4 blocks), at most %d",
                       c->intermediate_size, NVFP4MOE_MAX_DIM);
    if ((int)c->in_dtype < 0 || c->in_dtype > NVFP4MOE_DTYPE_F32)
        return INVALID("in_dtype=%d is not a dtype", (int)c->in_dtype);
    if ((int)c->out_dtype < 0 || c->out_dtype > NVFP4MOE_DTYPE_F32)
        return INVALID("out_dtype=%d is not a dtype", (int)c->out_dtype);
    if ((int)c->router_logits_dtype < 0 || c->router_logits_dtype > NVFP4MOE_DTYPE_F32)
        return INVALID("router_logits_dtype=%d is not a dtype", (int)c->router_logits_dtype);
    if ((int)c->activation < 0 || c->activation >= NVFP4MOE_ACT_COUNT)
        return INVALID("activation=%d is not an activation", (int)c->activation);
    if ((int)c->routing < 0 || c->routing >= NVFP4MOE_ROUTING_COUNT)
        return INVALID("routing=%d is not a routing method", (int)c->routing);
    if ((int)c->scheme < 0 || c->scheme >= NVFP4MOE_SCHEME_COUNT)
        return INVALID("scheme=%d is not a quantization scheme", (int)c->scheme);
    if (c->scheme == NVFP4MOE_SCHEME_W4A8_MXFP8 && (c->hidden_size % 32 || c->intermediate_size % 32))
        return INVALID("w4a8-mxfp8 quantizes activations in blocks of 32: hidden_size=%d and "
                       "intermediate_size=%d must be multiples of 32", c->hidden_size, c->intermediate_size);

    /* activation parameters */
    if (c->has_swiglu_limit && !(isfinite(c->swiglu_limit) && c->swiglu_limit > 0))
        return INVALID("swiglu_limit=%g must be finite and > 0", c->swiglu_limit);
    if (c->has_swiglu_limit && c->activation != NVFP4MOE_ACT_SILU && c->activation != NVFP4MOE_ACT_SWIGLUOAI &&
        c->activation != NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE && c->activation != NVFP4MOE_ACT_SWIGLUSTEP)
        return INVALID("swiglu_limit is set but activation=%s applies no SwiGLU clamp (silu, swigluoai, "
                       "swigluoai_uninterleave and swiglustep do)", nvfp4moe_activation_name(c->activation));
    if (c->activation == NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE && !c->has_swiglu_limit)
        return INVALID("activation=swigluoai_uninterleave requires swiglu_limit (its clamp limit)");
    if (!isnan(c->swiglu_alpha) && !isfinite(c->swiglu_alpha))
        return INVALID("swiglu_alpha=%g must be finite (or NaN for the activation's default)", (double)c->swiglu_alpha);
    if (!isnan(c->swiglu_beta) && !isfinite(c->swiglu_beta))
        return INVALID("swiglu_beta=%g must be finite (or NaN for the activation's default)", (double)c->swiglu_beta);
    if (c->activation == NVFP4MOE_ACT_SITU) {
        if (!(isfinite(c->situ_beta) && c->situ_beta > 0))
            return INVALID("situ_beta=%g must be finite and > 0", (double)c->situ_beta);
        if (!isfinite(c->situ_linear_beta))
            return INVALID("situ_linear_beta=%g must be finite", (double)c->situ_linear_beta);
    }

    /* routing */
    if (!(isfinite(c->routed_scaling_factor) && c->routed_scaling_factor > 0))
        return INVALID("routed_scaling_factor=%g must be finite and > 0", (double)c->routed_scaling_factor);
    if (c->routing == NVFP4MOE_ROUTING_DEEPSEEK_V3) {
        if (c->n_group < 1 || c->num_experts % c->n_group)
            return INVALID("n_group=%d must be >= 1 and divide num_experts=%d", c->n_group, c->num_experts);
        if (c->topk_group < 1 || c->topk_group > c->n_group)
            return INVALID("topk_group=%d must be between 1 and n_group=%d", c->topk_group, c->n_group);
        if (c->top_k > c->topk_group * (c->num_experts / c->n_group))
            return INVALID("top_k=%d exceeds the %d experts of the topk_group=%d kept groups", c->top_k,
                           c->topk_group * (c->num_experts / c->n_group), c->topk_group);
    }
    if (c->has_correction_bias && c->routing != NVFP4MOE_ROUTING_DEEPSEEK_V3 &&
        c->routing != NVFP4MOE_ROUTING_MINIMAX2)
        return INVALID("has_correction_bias is set but routing=%s does not use a correction bias "
                       "(deepseek_v3 and minimax2 do)", nvfp4moe_routing_name(c->routing));
    if (c->routing == NVFP4MOE_ROUTING_LLAMA4 && c->top_k != 1)
        return INVALID("routing=llama4 is top-1: top_k=%d must be 1", c->top_k);
    if (c->apply_router_weight_on_input && c->top_k != 1)
        return INVALID("apply_router_weight_on_input needs top_k=1, got top_k=%d", c->top_k);

    /* parallel config */
    const nvfp4moe_parallel *p = &c->parallel;
    if (p->tp_size < 1) return INVALID("parallel.tp_size=%d must be >= 1", p->tp_size);
    if (p->dp_size < 1) return INVALID("parallel.dp_size=%d must be >= 1", p->dp_size);
    if (p->ep_size < 1) return INVALID("parallel.ep_size=%d must be >= 1", p->ep_size);
    if (p->ep_rank < 0 || p->ep_rank >= p->ep_size)
        return INVALID("parallel.ep_rank=%d must be in [0, ep_size=%d)", p->ep_rank, p->ep_size);
    if (c->num_experts % p->ep_size)
        return INVALID("num_experts=%d must be divisible by parallel.ep_size=%d", c->num_experts, p->ep_size);
    if (p->eplb && p->ep_size < 2) return INVALID("parallel.eplb needs expert parallelism (ep_size > 1)");
    if (memchr(p->all2all, '\0', sizeof p->all2all) == NULL)
        return INVALID("parallel.all2all is not NUL-terminated");
    bool known = false;
    for (int i = 0; i < COUNT(k_all2all_names); i++)
        if (!strcmp(p->all2all, k_all2all_names[i])) known = true;
    if (!known) {
        char list[512] = "";
        size_t used = 0;
        for (int i = 1; i < COUNT(k_all2all_names) && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i > 1 ? ", " : "", k_all2all_names[i]);
        return INVALID("parallel.all2all='%s' is not an all2all backend (expected one of: %s)", p->all2all, list);
    }
    if (p->all2all[0] && p->ep_size < 2)
        return INVALID("parallel.all2all='%s' needs expert parallelism (ep_size > 1)", p->all2all);

    if (memchr(c->moe_backend, '\0', sizeof c->moe_backend) == NULL || !c->moe_backend[0])
        return INVALID("moe_backend must be a non-empty name (\"auto\" to let the oracle choose)");
    return NVFP4MOE_OK;
}

size_t nvfp4moe_config_describe(const nvfp4moe_config *c, char *buf, size_t len) {
    if (!c) {
        if (buf && len) buf[0] = '\0';
        return 0;
    }
    char extra[128] = "";
    if (c->has_swiglu_limit) snprintf(extra, sizeof extra, " swiglu_limit=%g", c->swiglu_limit);
    int n = snprintf(buf, len, "E=%d top_k=%d H=%d I=%d %s %s%s routing=%s %s", c->num_experts, c->top_k,
                     c->hidden_size, c->intermediate_size, nvfp4moe_dtype_name(c->in_dtype),
                     nvfp4moe_activation_name(c->activation), extra, nvfp4moe_routing_name(c->routing),
                     nvfp4moe_scheme_name(c->scheme));
    return n < 0 ? 0 : (size_t)n;
}
