/*
 * cli_args.c - the command line of every subcommand: the parser (GNU getopt_long's conventions,
 * see cli.h), the --help layout, the deployment-config flags shared by run, select and quantize,
 * and small helpers (numbers, folders, clocks, checksums).
 *
 * The parser is ours rather than glibc's getopt_long: getopt_long keeps its position in globals
 * (the in-process fuzz target runs thousands of command lines), accepts abbreviated names, and
 * reports errors in its own words; this one has no state outside its cli_args, takes exact names
 * only, and names the nearest known flag.
 */
#include "cli.h"
#include "core/internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static char g_cmd[64] = "nvfp4moe";

const char *cli_cmd_name(void) { return g_cmd; }

// ---- numbers ----

int cli_parse_int(const char *flag, const char *s, long long min, long long *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > 2147483647LL) {
        fprintf(stderr, "%s: %s expects a whole number >= %lld, got '%s'\n", g_cmd, flag, min, s);
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
        fprintf(stderr, "%s: %s expects a finite number, got '%s'\n", g_cmd, flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

// ---- the config flags ----

typedef enum { F_INT, F_FLOAT, F_BOOL, F_DTYPE, F_ACT, F_ROUTING, F_SCHEME, F_STRING } flag_kind;

/* The table --help prints; cli_config_apply applies them in the switch below. */
enum {
    C_NUM_EXPERTS, C_TOP_K, C_HIDDEN, C_INTERMEDIATE, C_DTYPE, C_ACTIVATION, C_SWIGLU_LIMIT, C_SWIGLU_ALPHA,
    C_SWIGLU_BETA, C_SITU_BETA, C_SITU_LINEAR_BETA, C_ROUTING, C_N_GROUP, C_TOPK_GROUP, C_SCALING, C_CORRECTION_BIAS,
    C_LOGITS_DTYPE, C_SCHEME, C_TP, C_EP, C_EP_RANK, C_DP, C_ALL2ALL, C_EPLB, C_LORA, C_BIAS, C_BATCH_INVARIANT,
    C_ON_INPUT, C_FORCE_A16, C_REQUANT, C_MOE_BACKEND, C_SEED, C_COUNT
};

static const cli_opt k_config[C_COUNT] = {
    [C_NUM_EXPERTS] = {"--num-experts", "N", "experts E (global)"},
    [C_TOP_K] = {"--top-k", "N", "experts per token"},
    [C_HIDDEN] = {"--hidden-size", "N", "hidden size H (multiple of 16)"},
    [C_INTERMEDIATE] = {"--intermediate-size", "N", "expert intermediate size I (multiple of 16)"},
    [C_DTYPE] = {"--dtype", "NAME", "activation dtype in and out: bf16 | fp16 (f32 on CPU backends)"},
    [C_ACTIVATION] = {"--activation", "NAME", "silu gelu gelu_tanh relu2 swigluoai swigluoai_uninterleave\n"
                                              "swiglustep situ silu_no_mul gelu_no_mul gelu_tanh_no_mul\n"
                                              "relu2_no_mul"},
    [C_SWIGLU_LIMIT] = {"--swiglu-limit", "F", "SwiGLU clamp limit (unset: no clamp)"},
    [C_SWIGLU_ALPHA] = {"--swiglu-alpha", "F", "SwiGLU alpha (swigluoai default 1.702, uninterleave 1.0)"},
    [C_SWIGLU_BETA] = {"--swiglu-beta", "F", "SwiGLU beta (uninterleave default 0.0)"},
    [C_SITU_BETA] = {"--situ-beta", "F", "SiTU beta (default 4)"},
    [C_SITU_LINEAR_BETA] = {"--situ-linear-beta", "F", "SiTU linear beta (default 25)"},
    [C_ROUTING] = {"--routing", "NAME", "softmax renormalize renormalize_naive deepseek_v3 llama4\n"
                                        "sigmoid sigmoid_renorm minimax2 simulated"},
    [C_N_GROUP] = {"--n-group", "N", "deepseek_v3 expert groups"},
    [C_TOPK_GROUP] = {"--topk-group", "N", "deepseek_v3 groups kept"},
    [C_SCALING] = {"--routed-scaling-factor", "F", "multiplies the routing weights"},
    [C_CORRECTION_BIAS] = {"--correction-bias", NULL, "the router has an e_score_correction_bias"},
    [C_LOGITS_DTYPE] = {"--router-logits-dtype", "NAME", "bf16 | fp16 | fp32"},
    [C_SCHEME] = {"--scheme", "NAME", "w4a4 | w4a4-per-token | w4a16 | w4a8-mxfp8"},
    [C_TP] = {"--tp", "N", "tensor parallel size"},
    [C_EP] = {"--ep", "N", "expert parallel size"},
    [C_EP_RANK] = {"--ep-rank", "N", "this expert-parallel rank"},
    [C_DP] = {"--dp", "N", "data parallel size"},
    [C_ALL2ALL] = {"--all2all", "NAME", "all2all backend: allgather_reducescatter naive\n"
                                        "deepep_high_throughput deepep_low_latency nixl_ep\n"
                                        "flashinfer_nvlink_one_sided ..."},
    [C_EPLB] = {"--eplb", NULL, "expert-parallel load balancer on"},
    [C_LORA] = {"--lora", NULL, "LoRA on the experts"},
    [C_BIAS] = {"--bias", NULL, "experts have biases"},
    [C_BATCH_INVARIANT] = {"--batch-invariant", NULL, "batch-invariant kernels required"},
    [C_ON_INPUT] = {"--apply-router-weight-on-input", NULL, "multiply the input by the (top-1) weight"},
    [C_FORCE_A16] = {"--force-a16", NULL, "VLLM_B12X_MOE_FP4_FORCE_A16: B12X with bf16 activations"},
    [C_REQUANT] = {"--requantization-source", NULL, "the layer is a requantization source"},
    [C_MOE_BACKEND] = {"--moe-backend", "NAME", "auto | a vLLM moe_backend name (marlin, flashinfer_trtllm, ...)\n"
                                                "| one of ours (hopper_wgmma, cpu_fast, cpu_reference)"},
    [C_SEED] = {"--seed", "N", "seed of random data and of the simulated routing"},
};

static flag_kind config_kind(int k) {
    switch (k) {
    case C_DTYPE: case C_LOGITS_DTYPE: return F_DTYPE;
    case C_ACTIVATION: return F_ACT;
    case C_ROUTING: return F_ROUTING;
    case C_SCHEME: return F_SCHEME;
    case C_ALL2ALL: case C_MOE_BACKEND: return F_STRING;
    case C_SWIGLU_LIMIT: case C_SWIGLU_ALPHA: case C_SWIGLU_BETA: case C_SITU_BETA: case C_SITU_LINEAR_BETA:
    case C_SCALING: return F_FLOAT;
    default: return k_config[k].arg ? F_INT : F_BOOL;
    }
}

/* Reports a library parse failure for flag (the library's message lists the accepted names and
 * the nearest one). */
static int bad_name(const char *flag) {
    fprintf(stderr, "%s: %s: %s\n", g_cmd, flag, nvfp4moe_last_error());
    return -1;
}

static int copy_name(const char *flag, const char *v, char *dst, size_t len) {
    if (strlen(v) >= len) {
        fprintf(stderr, "%s: %s name '%s' is too long\n", g_cmd, flag, v);
        return -1;
    }
    snprintf(dst, len, "%s", v);
    return 0;
}

static int apply_one(int k, const char *v, nvfp4moe_config *cfg) {
    const char *flag = k_config[k].name;
    long long n = 0;
    /* read as a double: swiglu_limit keeps every digit the user gave (vLLM prints them) */
    double x = 0;
    const flag_kind kind = config_kind(k);
    if (kind == F_INT && cli_parse_int(flag, v, 0, &n)) return -1;
    if (kind == F_FLOAT && cli_parse_double(flag, v, &x)) return -1;
    switch (k) {
    case C_NUM_EXPERTS: cfg->num_experts = (int32_t)n; break;
    case C_TOP_K: cfg->top_k = (int32_t)n; break;
    case C_HIDDEN: cfg->hidden_size = (int32_t)n; break;
    case C_INTERMEDIATE: cfg->intermediate_size = (int32_t)n; break;
    case C_DTYPE:
        if (nvfp4moe_dtype_parse(v, &cfg->in_dtype) != NVFP4MOE_OK) return bad_name(flag);
        cfg->out_dtype = cfg->in_dtype;
        break;
    case C_ACTIVATION:
        if (nvfp4moe_activation_parse(v, &cfg->activation) != NVFP4MOE_OK) return bad_name(flag);
        break;
    case C_SWIGLU_LIMIT:
        cfg->has_swiglu_limit = true;
        cfg->swiglu_limit = x;
        break;
    case C_SWIGLU_ALPHA: cfg->swiglu_alpha = (float)x; break;
    case C_SWIGLU_BETA: cfg->swiglu_beta = (float)x; break;
    case C_SITU_BETA: cfg->situ_beta = (float)x; break;
    case C_SITU_LINEAR_BETA: cfg->situ_linear_beta = (float)x; break;
    case C_ROUTING:
        if (nvfp4moe_routing_parse(v, &cfg->routing) != NVFP4MOE_OK) return bad_name(flag);
        break;
    case C_N_GROUP: cfg->n_group = (int32_t)n; break;
    case C_TOPK_GROUP: cfg->topk_group = (int32_t)n; break;
    case C_SCALING: cfg->routed_scaling_factor = (float)x; break;
    case C_CORRECTION_BIAS: cfg->has_correction_bias = true; break;
    case C_LOGITS_DTYPE:
        if (nvfp4moe_dtype_parse(v, &cfg->router_logits_dtype) != NVFP4MOE_OK) return bad_name(flag);
        break;
    case C_SCHEME:
        if (nvfp4moe_scheme_parse(v, &cfg->scheme) != NVFP4MOE_OK) return bad_name(flag);
        break;
    case C_TP: cfg->parallel.tp_size = (int32_t)n; break;
    case C_EP: cfg->parallel.ep_size = (int32_t)n; break;
    case C_EP_RANK: cfg->parallel.ep_rank = (int32_t)n; break;
    case C_DP: cfg->parallel.dp_size = (int32_t)n; break;
    case C_ALL2ALL: return copy_name(flag, v, cfg->parallel.all2all, sizeof cfg->parallel.all2all);
    case C_EPLB: cfg->parallel.eplb = true; break;
    case C_LORA: cfg->lora = true; break;
    case C_BIAS: cfg->has_bias = true; break;
    case C_BATCH_INVARIANT: cfg->batch_invariant = true; break;
    case C_ON_INPUT: cfg->apply_router_weight_on_input = true; break;
    case C_FORCE_A16: cfg->force_a16 = true; break;
    case C_REQUANT: cfg->requantization_source = true; break;
    case C_MOE_BACKEND: return copy_name(flag, v, cfg->moe_backend, sizeof cfg->moe_backend);
    case C_SEED: cfg->seed = (uint64_t)n; break;
    }
    return 0;
}

int cli_config_apply(const cli_args *a, nvfp4moe_config *cfg) {
    for (int i = 0; i < a->ncfg; i++)
        if (apply_one(a->cfg_flag[i], a->cfg_value[i], cfg) != 0) return -1;
    return 0;
}

bool cli_config_given(const cli_args *a, const char *name) {
    for (int i = 0; i < a->ncfg; i++)
        if (!strcmp(k_config[a->cfg_flag[i]].name, name)) return true;
    return false;
}

// ---- --help ----

static void print_opt(FILE *f, const cli_opt *o) {
    char lhs[96];
    snprintf(lhs, sizeof lhs, "  %s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    const int n = (int)strlen(lhs);
    if (n + 2 > CLI_HELP_COL) fprintf(f, "%s\n%*s", lhs, CLI_HELP_COL, "");
    else fprintf(f, "%-*s", CLI_HELP_COL, lhs);
    for (const char *h = o->help; *h;) {
        const size_t len = strcspn(h, "\n");
        fprintf(f, "%.*s\n", (int)len, h);
        h += len;
        if (*h == '\n' && *++h) fprintf(f, "%*s", CLI_HELP_COL, "");
    }
}

void cli_opts_help(FILE *f, const cli_opt *opts, int n) {
    for (int i = 0; i < n; i++) print_opt(f, &opts[i]);
}

static int own_flag(const cli_args *a, const char *name, size_t len) {
    for (int i = 0; a && i < a->nopts; i++)
        if (strlen(a->opts[i].name) == len && !strncmp(a->opts[i].name, name, len)) return i;
    return -1;
}

void cli_config_flags_help(FILE *f, const cli_args *a) {
    fprintf(f, "deployment config flags (default: the Qwen3-30B-A3B MoE layer):\n");
    for (int k = 0; k < C_COUNT; k++)
        if (own_flag(a, k_config[k].name, strlen(k_config[k].name)) < 0) print_opt(f, &k_config[k]);
}

// ---- the parser ----

void cli_args_init(cli_args *a, const char *cmd, const cli_opt *opts, int nopts, bool config, int max_positional,
                   int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->opts = opts;
    a->nopts = nopts;
    a->config = config;
    a->max_positional = max_positional < CLI_MAX_POSITIONAL ? max_positional : CLI_MAX_POSITIONAL;
    a->argc = argc;
    a->argv = argv;
    a->i = 1;
    snprintf(g_cmd, sizeof g_cmd, "nvfp4moe %s", cmd);
}

static int config_flag(const char *name, size_t len) {
    for (int k = 0; k < C_COUNT; k++)
        if (strlen(k_config[k].name) == len && !strncmp(k_config[k].name, name, len)) return k;
    return -1;
}

/* A flag of this parse by its name (len bytes): *own the index in opts, or *cfg in the config
 * table, or both -1. */
static void find_flag(const cli_args *a, const char *name, size_t len, int *own, int *cfg) {
    *own = own_flag(a, name, len);
    *cfg = *own < 0 && a->config ? config_flag(name, len) : -1;
}

static bool is_help(const char *s) { return !strcmp(s, "-h") || !strcmp(s, "--help"); }

/* The message for an argument that names no flag of this subcommand. */
static void unknown_flag(const cli_args *a, const char *arg, size_t len) {
    char typed[96];
    const char *p = arg;
    while (*p == '-' && (size_t)(p - arg) < len) p++;
    snprintf(typed, sizeof typed, "%.*s", (int)(len - (size_t)(p - arg)), p);
    const char *best = NULL;
    /* the right name with the wrong dashes ("-tokens"), else the nearest name */
    for (int i = 0; i < a->nopts && !best; i++)
        if (nvfp4moe_name_eq(typed, a->opts[i].name + 2)) best = a->opts[i].name;
    for (int k = 0; a->config && k < C_COUNT && !best; k++)
        if (nvfp4moe_name_eq(typed, k_config[k].name + 2)) best = k_config[k].name;
    if (!best) {
        nvfp4moe_suggest sg;
        nvfp4moe_suggest_init(&sg, typed);
        for (int i = 0; i < a->nopts; i++) nvfp4moe_suggest_add(&sg, a->opts[i].name + 2);
        for (int k = 0; a->config && k < C_COUNT; k++) nvfp4moe_suggest_add(&sg, k_config[k].name + 2);
        static const char k_help[] = "--help";
        nvfp4moe_suggest_add(&sg, k_help + 2);
        best = nvfp4moe_suggest_best(&sg);
        if (best) best -= 2;   /* every candidate is a flag's name after its "--" */
    }
    if (best)
        fprintf(stderr, "%s: unknown flag '%.*s'; did you mean '%s'? (%s --help lists the flags)\n", g_cmd, (int)len,
                arg, best, g_cmd);
    else
        fprintf(stderr, "%s: unknown flag '%.*s' (%s --help lists the flags)\n", g_cmd, (int)len, arg, g_cmd);
}

int cli_args_next(cli_args *a, const char **value) {
    *value = NULL;
    while (a->i < a->argc) {
        const char *arg = a->argv[a->i++];
        const bool flag = !a->flags_done && arg[0] == '-' && arg[1] != '\0';
        if (!flag) {
            if (a->npos >= a->max_positional) {
                if (a->max_positional == 0)
                    fprintf(stderr, "%s: unexpected argument '%s': this command takes flags only (%s --help)\n",
                            g_cmd, arg, g_cmd);
                else
                    fprintf(stderr, "%s: unexpected argument '%s': at most %d besides the flags (%s --help)\n",
                            g_cmd, arg, a->max_positional, g_cmd);
                return CLI_ARGS_ERROR;
            }
            a->pos[a->npos++] = arg;
            continue;
        }
        if (!strcmp(arg, "--")) {
            a->flags_done = true;
            continue;
        }
        if (is_help(arg)) return CLI_ARGS_HELP;
        const char *eq = arg[1] == '-' ? strchr(arg, '=') : NULL;
        const size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        int own, cfg;
        find_flag(a, arg, len, &own, &cfg);
        if (own < 0 && cfg < 0) {
            if (len == 6 && !strncmp(arg, "--help", 6)) {
                fprintf(stderr, "%s: --help takes no value\n", g_cmd);
                return CLI_ARGS_ERROR;
            }
            unknown_flag(a, arg, len);
            return CLI_ARGS_ERROR;
        }
        const cli_opt *o = own >= 0 ? &a->opts[own] : &k_config[cfg];
        const char *v = NULL;
        if (!o->arg) {
            if (eq) {
                fprintf(stderr, "%s: %s is a switch and takes no value (got '%s')\n", g_cmd, o->name, arg);
                return CLI_ARGS_ERROR;
            }
        } else if (eq) {
            v = eq + 1;
            if (!*v) {
                fprintf(stderr, "%s: %s needs a value: %s=%s\n", g_cmd, o->name, o->name, o->arg);
                return CLI_ARGS_ERROR;
            }
        } else {
            if (a->i >= a->argc) {
                fprintf(stderr, "%s: %s needs a value: %s %s\n", g_cmd, o->name, o->name, o->arg);
                return CLI_ARGS_ERROR;
            }
            v = a->argv[a->i];
            /* "--model --tokens 3": the value was forgotten; a value that is a flag name is refused
             * (--flag=VALUE passes such a value anyway) */
            if (v[0] == '-' && v[1] == '-') {
                const char *veq = strchr(v, '=');
                const size_t vlen = veq ? (size_t)(veq - v) : strlen(v);
                int vo, vc;
                find_flag(a, v, vlen, &vo, &vc);
                if (vo >= 0 || vc >= 0 || is_help(v)) {
                    fprintf(stderr, "%s: %s needs a value: %s %s (the next argument, %s, is a flag)\n", g_cmd,
                            o->name, o->name, o->arg, v);
                    return CLI_ARGS_ERROR;
                }
            }
            a->i++;
        }
        if (own >= 0) {
            *value = v;
            return own;
        }
        if (a->ncfg == CLI_MAX_CONFIG_FLAGS) {
            fprintf(stderr, "%s: more than %d config flags\n", g_cmd, CLI_MAX_CONFIG_FLAGS);
            return CLI_ARGS_ERROR;
        }
        a->cfg_flag[a->ncfg] = cfg;
        a->cfg_value[a->ncfg++] = v;
    }
    return CLI_ARGS_END;
}

bool cli_has_flag(int argc, char **argv, const char *flag) {
    const size_t n = strlen(flag);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) return false;
        if (!strncmp(argv[i], flag, n) && (argv[i][n] == '\0' || argv[i][n] == '=')) return true;
    }
    return false;
}

// ---- files, clocks, checksums ----

int cli_make_parent_dirs(const char *flag, const char *path) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) {
        fprintf(stderr, "%s: %s %s: the path is too long\n", g_cmd, flag, path);
        return -1;
    }
    char *last = strrchr(p, '/');
    if (!last || last == p) return 0;
    *last = '\0';
    for (char *s = p + 1;; s++) {
        const bool end = *s == '\0';
        if (*s != '/' && !end) continue;
        *s = '\0';
        struct stat st;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "%s: %s %s: cannot create the folder %s: %s\n", g_cmd, flag, path, p, strerror(errno));
            return -1;
        }
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "%s: %s %s: %s is not a folder\n", g_cmd, flag, path, p);
            return -1;
        }
        if (end) break;
        *s = '/';
    }
    return 0;
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
