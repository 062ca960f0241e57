/*
 * cli_config.c - the flags that set deployment-config fields, shared by run, select and bench.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *cli_flag_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "nvfp4moe: flag %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_parse_int(const char *flag, const char *s, long long min, long long *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > 2147483647LL) {
        fprintf(stderr, "nvfp4moe: %s expects a whole number >= %lld, got '%s'\n", flag, min, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_double(const char *flag, const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v)) {
        fprintf(stderr, "nvfp4moe: %s expects a finite number, got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

typedef enum { F_INT, F_FLOAT, F_BOOL, F_DTYPE, F_ACT, F_ROUTING, F_SCHEME, F_STRING } flag_kind;

typedef struct {
    const char *flag;
    flag_kind kind;
    const char *help;
} config_flag;

/* The table --help prints; cli_config_flag applies them in the switch below. */
static const config_flag k_flags[] = {
    {"--num-experts", F_INT, "experts E (global)"},
    {"--top-k", F_INT, "experts per token"},
    {"--hidden-size", F_INT, "hidden size H (multiple of 16)"},
    {"--intermediate-size", F_INT, "expert intermediate size I (multiple of 16)"},
    {"--dtype", F_DTYPE, "activation dtype in and out: bf16 | fp16 (f32 on CPU backends)"},
    {"--activation", F_ACT, "silu gelu gelu_tanh relu2 swigluoai swigluoai_uninterleave swiglustep situ\n"
                            "                          silu_no_mul gelu_no_mul gelu_tanh_no_mul relu2_no_mul"},
    {"--swiglu-limit", F_FLOAT, "SwiGLU clamp limit (unset: no clamp)"},
    {"--swiglu-alpha", F_FLOAT, "SwiGLU alpha (swigluoai default 1.702, uninterleave 1.0)"},
    {"--swiglu-beta", F_FLOAT, "SwiGLU beta (uninterleave default 0.0)"},
    {"--situ-beta", F_FLOAT, "SiTU beta (default 4)"},
    {"--situ-linear-beta", F_FLOAT, "SiTU linear beta (default 25)"},
    {"--routing", F_ROUTING, "softmax renormalize renormalize_naive deepseek_v3 llama4 sigmoid\n"
                             "                          sigmoid_renorm minimax2 simulated"},
    {"--n-group", F_INT, "deepseek_v3 expert groups"},
    {"--topk-group", F_INT, "deepseek_v3 groups kept"},
    {"--routed-scaling-factor", F_FLOAT, "multiplies the routing weights"},
    {"--correction-bias", F_BOOL, "the router has an e_score_correction_bias"},
    {"--router-logits-dtype", F_DTYPE, "bf16 | fp16 | fp32"},
    {"--scheme", F_SCHEME, "w4a4 | w4a4-per-token | w4a16 | w4a8-mxfp8"},
    {"--tp", F_INT, "tensor parallel size"},
    {"--ep", F_INT, "expert parallel size"},
    {"--ep-rank", F_INT, "this expert-parallel rank"},
    {"--dp", F_INT, "data parallel size"},
    {"--all2all", F_STRING, "all2all backend: allgather_reducescatter naive deepep_high_throughput\n"
                            "                          deepep_low_latency nixl_ep flashinfer_nvlink_one_sided ..."},
    {"--eplb", F_BOOL, "expert-parallel load balancer on"},
    {"--lora", F_BOOL, "LoRA on the experts"},
    {"--bias", F_BOOL, "experts have biases"},
    {"--batch-invariant", F_BOOL, "batch-invariant kernels required"},
    {"--apply-router-weight-on-input", F_BOOL, "multiply the input by the (top-1) weight"},
    {"--force-a16", F_BOOL, "VLLM_B12X_MOE_FP4_FORCE_A16: B12X with bf16 activations"},
    {"--requantization-source", F_BOOL, "the layer is a requantization source"},
    {"--moe-backend", F_STRING, "auto | a vLLM moe_backend name (marlin, flashinfer_trtllm, ...) | cpu_reference"},
    {"--seed", F_INT, "seed of random data and of the simulated routing"},
};

void cli_config_flags_help(FILE *f) {
    fprintf(f, "deployment config flags (default: the Qwen3-30B-A3B MoE layer):\n");
    for (size_t i = 0; i < sizeof k_flags / sizeof k_flags[0]; i++) {
        const char *arg = k_flags[i].kind == F_BOOL ? "" : k_flags[i].kind == F_INT ? " N"
                        : k_flags[i].kind == F_FLOAT ? " F" : " NAME";
        char lhs[64];
        snprintf(lhs, sizeof lhs, "%s%s", k_flags[i].flag, arg);
        fprintf(f, "  %-24s%s\n", lhs, k_flags[i].help);
    }
}

/* Reports a library parse failure for flag (the library's message lists the accepted names). */
static int bad_name(const char *flag) {
    fprintf(stderr, "nvfp4moe: %s: %s\n", flag, nvfp4moe_last_error());
    return -1;
}

int cli_config_flag(int argc, char **argv, int *i, nvfp4moe_config *cfg) {
    const char *flag = argv[*i];
    const config_flag *def = NULL;
    for (size_t k = 0; k < sizeof k_flags / sizeof k_flags[0]; k++)
        if (!strcmp(flag, k_flags[k].flag)) def = &k_flags[k];
    if (!def) return 0;

    long long n = 0;
    /* read as a double: swiglu_limit keeps every digit the user gave (vLLM prints them) */
    double x = 0;
    const char *v = NULL;
    if (def->kind != F_BOOL) {
        if (!(v = cli_flag_value(argc, argv, i))) return -1;
        if (def->kind == F_INT && cli_parse_int(flag, v, 0, &n)) return -1;
        if (def->kind == F_FLOAT && cli_parse_double(flag, v, &x)) return -1;
    }

    if (!strcmp(flag, "--num-experts")) cfg->num_experts = (int32_t)n;
    else if (!strcmp(flag, "--top-k")) cfg->top_k = (int32_t)n;
    else if (!strcmp(flag, "--hidden-size")) cfg->hidden_size = (int32_t)n;
    else if (!strcmp(flag, "--intermediate-size")) cfg->intermediate_size = (int32_t)n;
    else if (!strcmp(flag, "--dtype")) {
        if (nvfp4moe_dtype_parse(v, &cfg->in_dtype) != NVFP4MOE_OK) return bad_name(flag);
        cfg->out_dtype = cfg->in_dtype;
    } else if (!strcmp(flag, "--activation")) {
        if (nvfp4moe_activation_parse(v, &cfg->activation) != NVFP4MOE_OK) return bad_name(flag);
    } else if (!strcmp(flag, "--swiglu-limit")) {
        cfg->has_swiglu_limit = true;
        cfg->swiglu_limit = x;
    } else if (!strcmp(flag, "--swiglu-alpha")) cfg->swiglu_alpha = (float)x;
    else if (!strcmp(flag, "--swiglu-beta")) cfg->swiglu_beta = (float)x;
    else if (!strcmp(flag, "--situ-beta")) cfg->situ_beta = (float)x;
    else if (!strcmp(flag, "--situ-linear-beta")) cfg->situ_linear_beta = (float)x;
    else if (!strcmp(flag, "--routing")) {
        if (nvfp4moe_routing_parse(v, &cfg->routing) != NVFP4MOE_OK) return bad_name(flag);
    } else if (!strcmp(flag, "--n-group")) cfg->n_group = (int32_t)n;
    else if (!strcmp(flag, "--topk-group")) cfg->topk_group = (int32_t)n;
    else if (!strcmp(flag, "--routed-scaling-factor")) cfg->routed_scaling_factor = (float)x;
    else if (!strcmp(flag, "--correction-bias")) cfg->has_correction_bias = true;
    else if (!strcmp(flag, "--router-logits-dtype")) {
        if (nvfp4moe_dtype_parse(v, &cfg->router_logits_dtype) != NVFP4MOE_OK) return bad_name(flag);
    } else if (!strcmp(flag, "--scheme")) {
        if (nvfp4moe_scheme_parse(v, &cfg->scheme) != NVFP4MOE_OK) return bad_name(flag);
    } else if (!strcmp(flag, "--tp")) cfg->parallel.tp_size = (int32_t)n;
    else if (!strcmp(flag, "--ep")) cfg->parallel.ep_size = (int32_t)n;
    else if (!strcmp(flag, "--ep-rank")) cfg->parallel.ep_rank = (int32_t)n;
    else if (!strcmp(flag, "--dp")) cfg->parallel.dp_size = (int32_t)n;
    else if (!strcmp(flag, "--all2all")) {
        if (strlen(v) >= sizeof cfg->parallel.all2all) {
            fprintf(stderr, "nvfp4moe: --all2all name '%s' is too long\n", v);
            return -1;
        }
        snprintf(cfg->parallel.all2all, sizeof cfg->parallel.all2all, "%s", v);
    } else if (!strcmp(flag, "--eplb")) cfg->parallel.eplb = true;
    else if (!strcmp(flag, "--lora")) cfg->lora = true;
    else if (!strcmp(flag, "--bias")) cfg->has_bias = true;
    else if (!strcmp(flag, "--batch-invariant")) cfg->batch_invariant = true;
    else if (!strcmp(flag, "--apply-router-weight-on-input")) cfg->apply_router_weight_on_input = true;
    else if (!strcmp(flag, "--force-a16")) cfg->force_a16 = true;
    else if (!strcmp(flag, "--requantization-source")) cfg->requantization_source = true;
    else if (!strcmp(flag, "--moe-backend")) {
        if (strlen(v) >= sizeof cfg->moe_backend) {
            fprintf(stderr, "nvfp4moe: --moe-backend name '%s' is too long\n", v);
            return -1;
        }
        snprintf(cfg->moe_backend, sizeof cfg->moe_backend, "%s", v);
    } else if (!strcmp(flag, "--seed")) cfg->seed = (uint64_t)n;
    return 1;
}

double cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t cli_fnv1a(const void *p, size_t n, uint64_t h) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}
