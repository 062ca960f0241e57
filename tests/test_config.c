/*
 * test_config.c - deployment-config defaults, names and validation: every rejection names its field.
 */
#include "harness.h"
#include "nvfp4moe.h"

typedef void (*mutate_fn)(nvfp4moe_config *c);

#define BAD(name, body, needle)                                                                    \
    static void name(nvfp4moe_config *c) { body; }                                                 \
    static const char *name##_needle = needle;

BAD(m_experts, c->num_experts = 0, "num_experts=0")
BAD(m_topk, c->top_k = 200, "top_k=200")
BAD(m_hidden, c->hidden_size = 100, "hidden_size=100")
BAD(m_inter, c->intermediate_size = 8, "intermediate_size=8")
BAD(m_dtype, c->in_dtype = (nvfp4moe_dtype)7, "in_dtype=7")
BAD(m_act, c->activation = NVFP4MOE_ACT_COUNT, "activation=")
BAD(m_limit, (c->has_swiglu_limit = true, c->swiglu_limit = -1.0f), "swiglu_limit=-1")
BAD(m_limit_gelu, (c->has_swiglu_limit = true, c->swiglu_limit = 7.0f, c->activation = NVFP4MOE_ACT_GELU),
    "activation=gelu applies no SwiGLU clamp")
BAD(m_uninterleave, c->activation = NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE, "requires swiglu_limit")
BAD(m_alpha, c->swiglu_alpha = INFINITY, "swiglu_alpha=inf")
BAD(m_situ, (c->activation = NVFP4MOE_ACT_SITU, c->situ_beta = 0.0f), "situ_beta=0")
BAD(m_scale, c->routed_scaling_factor = 0.0f, "routed_scaling_factor=0")
BAD(m_ngroup, (c->routing = NVFP4MOE_ROUTING_DEEPSEEK_V3, c->n_group = 3), "n_group=3")
BAD(m_topkgroup, (c->routing = NVFP4MOE_ROUTING_DEEPSEEK_V3, c->n_group = 8, c->topk_group = 9), "topk_group=9")
BAD(m_grouptopk, (c->routing = NVFP4MOE_ROUTING_DEEPSEEK_V3, c->n_group = 64, c->topk_group = 1), "top_k=8 exceeds")
BAD(m_bias_route, c->has_correction_bias = true, "routing=renormalize does not use a correction bias")
BAD(m_llama4, c->routing = NVFP4MOE_ROUTING_LLAMA4, "routing=llama4 is top-1")
BAD(m_on_input, c->apply_router_weight_on_input = true, "apply_router_weight_on_input needs top_k=1")
BAD(m_tp, c->parallel.tp_size = 0, "parallel.tp_size=0")
BAD(m_eprank, (c->parallel.ep_size = 4, c->parallel.ep_rank = 4), "parallel.ep_rank=4")
BAD(m_epdiv, c->parallel.ep_size = 3, "divisible by parallel.ep_size=3")
BAD(m_eplb, c->parallel.eplb = true, "parallel.eplb")
BAD(m_all2all, (c->parallel.ep_size = 2, snprintf(c->parallel.all2all, 32, "deepep_fast")),
    "parallel.all2all='deepep_fast'")
BAD(m_all2all_noep, snprintf(c->parallel.all2all, 32, "nixl_ep"), "needs expert parallelism")
BAD(m_mxfp8, (c->scheme = NVFP4MOE_SCHEME_W4A8_MXFP8, c->intermediate_size = 48), "multiples of 32")
BAD(m_backend, c->moe_backend[0] = '\0', "moe_backend")

int main(void) {
    nvfp4moe_config c;
    T_CASE("defaults");
    nvfp4moe_config_init(&c);
    CHECK(c.num_experts == 128 && c.top_k == 8 && c.hidden_size == 2048 && c.intermediate_size == 768,
          "Qwen3-30B-A3B shape");
    CHECK(!strcmp(c.moe_backend, "auto") && c.scheme == NVFP4MOE_SCHEME_W4A4, "auto, w4a4");
    CHECK_OK(nvfp4moe_config_validate(&c));
    CHECK(nvfp4moe_config_n1(&c) == 1536, "gated N1 = 2I");
    c.activation = NVFP4MOE_ACT_RELU2_NO_MUL;
    CHECK(nvfp4moe_config_n1(&c) == 768, "non-gated N1 = I");

    const struct { mutate_fn f; const char *needle; } bad[] = {
        {m_experts, m_experts_needle}, {m_topk, m_topk_needle}, {m_hidden, m_hidden_needle},
        {m_inter, m_inter_needle}, {m_dtype, m_dtype_needle}, {m_act, m_act_needle}, {m_limit, m_limit_needle},
        {m_limit_gelu, m_limit_gelu_needle}, {m_uninterleave, m_uninterleave_needle}, {m_alpha, m_alpha_needle},
        {m_situ, m_situ_needle}, {m_scale, m_scale_needle}, {m_ngroup, m_ngroup_needle},
        {m_topkgroup, m_topkgroup_needle}, {m_grouptopk, m_grouptopk_needle}, {m_bias_route, m_bias_route_needle},
        {m_llama4, m_llama4_needle}, {m_on_input, m_on_input_needle}, {m_tp, m_tp_needle},
        {m_eprank, m_eprank_needle}, {m_epdiv, m_epdiv_needle}, {m_eplb, m_eplb_needle},
        {m_all2all, m_all2all_needle}, {m_all2all_noep, m_all2all_noep_needle}, {m_mxfp8, m_mxfp8_needle},
        {m_backend, m_backend_needle},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        T_CASE(bad[i].needle);
        nvfp4moe_config_init(&c);
        bad[i].f(&c);
        CHECK_ERR(nvfp4moe_config_validate(&c), NVFP4MOE_ERR_INVALID_ARGUMENT, bad[i].needle);
    }

    T_CASE("names round trip");
    for (int a = 0; a < NVFP4MOE_ACT_COUNT; a++) {
        nvfp4moe_activation got;
        CHECK(nvfp4moe_activation_parse(nvfp4moe_activation_name((nvfp4moe_activation)a), &got) == NVFP4MOE_OK &&
                  (int)got == a, "activation %d", a);
    }
    for (int r = 0; r < NVFP4MOE_ROUTING_COUNT; r++) {
        nvfp4moe_routing got;
        CHECK(nvfp4moe_routing_parse(nvfp4moe_routing_name((nvfp4moe_routing)r), &got) == NVFP4MOE_OK && (int)got == r,
              "routing %d", r);
    }
    for (int s = 0; s < NVFP4MOE_SCHEME_COUNT; s++) {
        nvfp4moe_scheme got;
        CHECK(nvfp4moe_scheme_parse(nvfp4moe_scheme_name((nvfp4moe_scheme)s), &got) == NVFP4MOE_OK && (int)got == s,
              "scheme %d", s);
    }
    nvfp4moe_activation a;
    nvfp4moe_dtype d;
    CHECK(nvfp4moe_activation_parse("GELU-PYTORCH-TANH", &a) == NVFP4MOE_OK && a == NVFP4MOE_ACT_GELU_TANH, "alias");
    CHECK(nvfp4moe_dtype_parse("fp32", &d) == NVFP4MOE_OK && d == NVFP4MOE_DTYPE_F32, "fp32 alias");
    CHECK_ERR(nvfp4moe_activation_parse("swish", &a), NVFP4MOE_ERR_NOT_FOUND, "unknown activation 'swish'");
    CHECK_ERR(nvfp4moe_dtype_parse("int8", &d), NVFP4MOE_ERR_NOT_FOUND, "expected one of: bf16, fp16, f32");
    CHECK(!strstr(nvfp4moe_last_error(), "did you mean"), "int8 got a suggestion: %s", nvfp4moe_last_error());
    /* a typo of a name (or of an alias) names it */
    nvfp4moe_routing rt;
    nvfp4moe_scheme sc;
    CHECK_ERR(nvfp4moe_dtype_parse("bf61", &d), NVFP4MOE_ERR_NOT_FOUND, "f32); did you mean 'bf16'?");
    CHECK_ERR(nvfp4moe_activation_parse("swigluoia", &a), NVFP4MOE_ERR_NOT_FOUND, "did you mean 'swigluoai'?");
    CHECK_ERR(nvfp4moe_routing_parse("deepseek", &rt), NVFP4MOE_ERR_NOT_FOUND, "did you mean 'deepseek_v3'?");
    CHECK_ERR(nvfp4moe_routing_parse("renormalise", &rt), NVFP4MOE_ERR_NOT_FOUND, "did you mean 'renormalize'?");
    CHECK_ERR(nvfp4moe_scheme_parse("w4a61", &sc), NVFP4MOE_ERR_NOT_FOUND, "did you mean 'w4a16'?");
    CHECK_ERR(nvfp4moe_activation_parse("gelu-pytorch-tanhh", &a), NVFP4MOE_ERR_NOT_FOUND,
              "did you mean 'gelu_tanh'?");   /* an alias's typo names the canonical name */
    CHECK_ERR(nvfp4moe_dtype_parse("bfloat61", &d), NVFP4MOE_ERR_NOT_FOUND, "did you mean 'bf16'?");
    return t_finish("test_config");
}
