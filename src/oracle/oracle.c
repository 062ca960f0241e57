/*
 * oracle.c - NVFP4 MoE backend selection, a C port of vLLM's select_nvfp4_moe_backend
 * (vllm/model_executor/layers/fused_moe/oracle/nvfp4.py) with every candidate's reason recorded.
 *
 * The parts, in the order the file defines them:
 *   - kernel traits: what each vLLM experts class answers in FusedMoEExperts.is_supported_config
 *     (device, no-act-and-mul, activations, quant scheme, parallel config, routing, logits dtype,
 *     activation format, batch invariance, LoRA), checked by one function in vLLM's order;
 *   - the backend table: NvFp4MoeBackend values with their moe_backend name, place in the auto
 *     list, membership of the SwiGLU clamp set, library, and kernel classes in vLLM's order;
 *   - selection: the seed's algorithm step by step;
 *   - the text rendering of the report.
 *
 * Availability policy. vLLM folds "is FlashInfer importable" into _supports_current_device, so a
 * missing library reads "kernel does not support current device". We check the predicate first,
 * as if the library were installed, and availability last: when the predicate says no, that reason
 * is shown, because installing the library would not help; only a kernel that would otherwise run
 * gets "FlashInfer is not available in this build", the one thing the user can change.
 */
#include "core/internal.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ---- the facts a predicate reads ----

/* One deployment as vLLM's FusedMoEConfig sees it, derived once per selection. */
typedef struct oracle_ctx {
    const nvfp4moe_config *cfg;
    const nvfp4moe_device *dev;
    nvfp4moe_scheme scheme; /* cfg->scheme, or W4A16 once the B12X force-a16 override dropped the
                               activation key */
    bool use_ep;            /* ep_size > 1 */
    bool use_all2all;       /* use_all2all_kernels: use_ep and dp_size > 1 */
    bool batched;           /* activation format BatchedExperts: DeepEP low-latency or NIXL EP */
    char dev_str[16];       /* "sm_90" / "cpu" */
} oracle_ctx;

static bool family(const nvfp4moe_device *d, int fam) { return d->is_cuda && d->sm / 10 == fam / 10; }

static bool all2all_is(const oracle_ctx *c, const char *name) {
    return c->use_all2all && !strcmp(c->cfg->parallel.all2all, name);
}

// ---- kernel traits ----

#define ACT(x) (1u << NVFP4MOE_ACT_##x)
#define SCH(x) (1u << NVFP4MOE_SCHEME_##x)
#define ROUTE(x) (1u << NVFP4MOE_ROUTING_##x)
#define DT(x) (1u << NVFP4MOE_DTYPE_##x)

#define ACTS_ALL ((1u << NVFP4MOE_ACT_COUNT) - 1)
#define SCHEMES_ALL ((1u << NVFP4MOE_SCHEME_COUNT) - 1)
/* vLLM's apply_moe_activation_supported (CutlassExpertsFp4, MarlinExperts). */
#define ACTS_APPLY_MOE                                                                             \
    (ACT(SILU) | ACT(GELU) | ACT(GELU_TANH) | ACT(SITU) | ACT(SWIGLUOAI) |                         \
     ACT(SWIGLUOAI_UNINTERLEAVE) | ACT(SWIGLUSTEP) | ACT(SILU_NO_MUL) | ACT(GELU_NO_MUL) |          \
     ACT(GELU_TANH_NO_MUL) | ACT(RELU2_NO_MUL))
/* TritonExperts' list (EMULATION inherits it; the Humming experts declare the same set). */
#define ACTS_TRITON                                                                                \
    (ACT(SILU) | ACT(GELU) | ACT(GELU_TANH) | ACT(SWIGLUOAI) | ACT(SWIGLUSTEP) |                   \
     ACT(SILU_NO_MUL) | ACT(GELU_NO_MUL) | ACT(GELU_TANH_NO_MUL) | ACT(RELU2_NO_MUL))

/* What one experts class answers to FusedMoEExperts.is_supported_config. Optional callbacks may
 * be NULL (NULL = vLLM's default for that step). Reasons are written without the leading
 * "kernel does not support " only where noted. */
typedef struct kernel_def {
    const char *name;                                /* the class name: "MarlinExperts" */
    /* _supports_current_device: a predicate, or (device NULL) a CUDA GPU with sm_min <= sm and
     * (sm_max 0 or sm <= sm_max), so a new table line needs no new function. */
    bool (*device)(const nvfp4moe_device *dev);
    int32_t sm_min, sm_max;
    bool no_act_and_mul;                             /* _supports_no_act_and_mul */
    uint32_t activations;                            /* _supports_activation: ACT() bits */
    uint32_t schemes;                                /* _supports_quant_scheme: SCH() bits */
    /* (optional) a further quant rule with its own full reason (e.g. FI-CUTLASS needs sm_100+ for
     * NVFP4 W4A4); returns false after writing the reason. */
    bool (*quant_rule)(const oracle_ctx *c, char *reason, size_t len);
    bool (*parallel)(const oracle_ctx *c);           /* (optional) _supports_parallel_config */
    bool monolithic;                                 /* routes inside the kernel: checks routing */
    uint32_t routings;                               /* monolithic: ROUTE() bits */
    uint32_t logits_dtypes;                          /* monolithic: DT() bits */
    bool batched;                                    /* activation_format() is BatchedExperts */
    bool batch_invariant;                            /* _supports_batch_invariance */
    bool lora;                                       /* supports_lora */
    /* (optional) class-specific checks after the base ones, with their full reason. */
    bool (*extra)(const oracle_ctx *c, char *reason, size_t len);
} kernel_def;

// ---- the words of vLLM's reasons ----

/* FlashInfer's RoutingMethodType names, as vLLM prints the routing method. */
static const char *routing_type_name(nvfp4moe_routing r) {
    switch (r) {
    case NVFP4MOE_ROUTING_SOFTMAX_TOPK:      return "RoutingMethodType.Default";
    case NVFP4MOE_ROUTING_RENORMALIZE:       return "RoutingMethodType.Renormalize";
    case NVFP4MOE_ROUTING_DEEPSEEK_V3:       return "RoutingMethodType.DeepSeekV3";
    case NVFP4MOE_ROUTING_LLAMA4:            return "RoutingMethodType.Llama4";
    case NVFP4MOE_ROUTING_RENORMALIZE_NAIVE: return "RoutingMethodType.RenormalizeNaive";
    case NVFP4MOE_ROUTING_SIGMOID_RENORM:    return "RoutingMethodType.SigmoidRenorm";
    case NVFP4MOE_ROUTING_MINIMAX2:          return "RoutingMethodType.MiniMax2";
    case NVFP4MOE_ROUTING_SIGMOID:           return "RoutingMethodType.Sigmoid";
    case NVFP4MOE_ROUTING_SIMULATED:         return "RoutingMethodType.Simulated";
    case NVFP4MOE_ROUTING_COUNT:             break;
    }
    return "RoutingMethodType.Unspecified";
}

static const char *torch_dtype_name(nvfp4moe_dtype d) {
    switch (d) {
    case NVFP4MOE_DTYPE_BF16: return "torch.bfloat16";
    case NVFP4MOE_DTYPE_FP16: return "torch.float16";
    case NVFP4MOE_DTYPE_F32:  return "torch.float32";
    }
    return "torch.?";
}

/* vLLM's (weight_key, activation_key) pair, printed as "{w}x{a}" with the QuantKey constants'
 * names, then our scheme name so a user can map it back to --scheme. */
static void quant_scheme_str(nvfp4moe_scheme s, char *buf, size_t len) {
    const char *a = "None";
    switch (s) {
    case NVFP4MOE_SCHEME_W4A4:           a = "kNvfp4Dynamic"; break;
    case NVFP4MOE_SCHEME_W4A4_PER_TOKEN: a = "kNvfp4DynamicToken"; break;
    case NVFP4MOE_SCHEME_W4A16:          a = "None"; break;
    case NVFP4MOE_SCHEME_W4A8_MXFP8:     a = "kMxfp8Dynamic"; break;
    case NVFP4MOE_SCHEME_COUNT:          break;
    }
    snprintf(buf, len, "kNvfp4Staticx%s (%s)", a, nvfp4moe_scheme_name(s));
}

/* FusedMoEParallelConfig's repr, reduced to the fields the predicates read. */
static void parallel_str(const oracle_ctx *c, char *buf, size_t len) {
    const nvfp4moe_parallel *p = &c->cfg->parallel;
    char a2a[40];
    if (p->all2all[0])
        snprintf(a2a, sizeof a2a, "'%s'", p->all2all);
    else
        nvfp4moe_strlcpy(a2a, "None", sizeof a2a);
    snprintf(buf, len,
             "FusedMoEParallelConfig(tp_size=%d, dp_size=%d, ep_size=%d, use_ep=%s, "
             "all2all_backend=%s, enable_eplb=%s)",
             (int)p->tp_size, (int)p->dp_size, (int)p->ep_size, c->use_ep ? "True" : "False", a2a,
             p->eplb ? "True" : "False");
}

// ---- device predicates ----

static bool dev_any(const nvfp4moe_device *d) { (void)d; return true; }
static bool dev_cuda(const nvfp4moe_device *d) { return d->is_cuda; }
static bool dev_sm75(const nvfp4moe_device *d) { return d->is_cuda && d->sm >= 75; }
static bool dev_sm10x(const nvfp4moe_device *d) { return family(d, 100); }
static bool dev_sm12x(const nvfp4moe_device *d) { return family(d, 120); }
/* FlashInfer CUTLASS: Hopper, SM10x, SM12x; SM110 is excluded (flashinfer#3134). */
static bool dev_fi_cutlass(const nvfp4moe_device *d) {
    return d->is_cuda && (d->sm == 90 || family(d, 100) || family(d, 120));
}
static bool dev_sm10x_11x_12x(const nvfp4moe_device *d) {
    return family(d, 100) || family(d, 110) || family(d, 120);
}

// ---- parallel predicates ----

/* The TRT-LLM monolithic kernel routes and reduces inside one launch: no all2all dispatch, and
 * no EPLB (whose logical-to-physical expert map the kernel cannot apply). */
static bool par_trtllm_mono(const oracle_ctx *c) { return !c->use_all2all && !c->cfg->parallel.eplb; }
/* b12x is TP only: no EP, expert map, all2all or EPLB. */
static bool par_tp_only(const oracle_ctx *c) {
    return !c->use_ep && c->cfg->parallel.ep_size == 1 && !c->use_all2all && !c->cfg->parallel.eplb;
}
/* No expert map: every expert on this rank. */
static bool par_no_ep(const oracle_ctx *c) { return c->cfg->parallel.ep_size == 1; }
static bool par_not_fi_nvl_two_sided(const oracle_ctx *c) {
    return !all2all_is(c, "flashinfer_nvlink_two_sided");
}
static bool par_not_fi_nvl(const oracle_ctx *c) {
    return !all2all_is(c, "flashinfer_nvlink_one_sided") && !all2all_is(c, "flashinfer_nvlink_two_sided");
}
/* FlashInfer's moe_ep CuTeDSL path exists for expert parallelism only. */
static bool par_needs_ep(const oracle_ctx *c) { return c->use_ep; }

// ---- class-specific rules ----

/* FlashInferExperts serves NVFP4 W4A4 only with has_device_capability(100): on Hopper the
 * device check passes (the class also serves FP8/bf16 there) and the quant check says no. */
static bool quant_fi_cutlass(const oracle_ctx *c, char *reason, size_t len) {
    if (c->dev->is_cuda && c->dev->sm >= 100) return true;
    char q[96];
    quant_scheme_str(c->scheme, q, sizeof q);
    snprintf(reason, len, "kernel does not support quantization scheme %s", q);
    return false;
}

static bool quant_trtllm(const oracle_ctx *c, char *reason, size_t len) {
    if (c->scheme == NVFP4MOE_SCHEME_W4A4_PER_TOKEN && !nvfp4moe_activation_is_gated(c->cfg->activation)) {
        snprintf(reason, len, "kernel does not support per-token NVFP4 activation scaling for non-gated MoE");
        return false;
    }
    return true;
}

static bool extra_b12x(const oracle_ctx *c, char *reason, size_t len) {
    const nvfp4moe_config *cfg = c->cfg;
    if (cfg->has_bias) {
        snprintf(reason, len, "kernel does not support expert biases");
        return false;
    }
    if (cfg->in_dtype != NVFP4MOE_DTYPE_BF16 && cfg->in_dtype != NVFP4MOE_DTYPE_FP16) {
        snprintf(reason, len, "kernel does not support %s input/output dtype", torch_dtype_name(cfg->in_dtype));
        return false;
    }
    if (cfg->activation == NVFP4MOE_ACT_SITU && (cfg->situ_beta != 4.0f || cfg->situ_linear_beta != 25.0f)) {
        snprintf(reason, len, "kernel supports only SiTU beta=4 and linear_beta=25");
        return false;
    }
    if (cfg->activation == NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE && c->scheme != NVFP4MOE_SCHEME_W4A16) {
        snprintf(reason, len, "kernel does not support swigluoai_uninterleave with W4A8");
        return false;
    }
    if (cfg->apply_router_weight_on_input && c->scheme != NVFP4MOE_SCHEME_W4A16) {
        snprintf(reason, len, "kernel supports apply_router_weight_on_input only with W4A16");
        return false;
    }
    return true;
}

static bool extra_no_bias(const oracle_ctx *c, char *reason, size_t len) {
    if (!c->cfg->has_bias) return true;
    snprintf(reason, len, "kernel does not support expert biases");
    return false;
}

/* For the Standard format vLLM keeps the Humming class whose GEMM type is
 * VLLM_HUMMING_MOE_GEMM_TYPE, "indexed" by default (we do not read that variable). */
static bool extra_humming_grouped(const oracle_ctx *c, char *reason, size_t len) {
    (void)c;
    snprintf(reason, len, "kernel is not the VLLM_HUMMING_MOE_GEMM_TYPE=indexed (default) GEMM type");
    return false;
}

// ---- the kernel classes ----
//
// One definition per vLLM experts class, from the class's own predicates (vLLM snapshots in
// ../shared/reference/vllm_nvfp4_moe.md §2.2). Ours follow at the end.

static const kernel_def k_b12x = {
    .name = "B12xExperts", .device = dev_sm12x, .no_act_and_mul = true,
    .activations = ACT(SILU) | ACT(SITU) | ACT(SWIGLUOAI_UNINTERLEAVE) | ACT(RELU2_NO_MUL),
    .schemes = SCH(W4A4) | SCH(W4A8_MXFP8) | SCH(W4A16), .parallel = par_tp_only, .extra = extra_b12x,
};
/* TRT-LLM activations: SiTU needs a FlashInfer with has_flashinfer_situ_activation(); a what-if
 * install is assumed recent enough. */
#define ACTS_TRTLLM (ACT(SILU) | ACT(RELU2_NO_MUL) | ACT(GELU) | ACT(GELU_TANH) | ACT(SWIGLUOAI_UNINTERLEAVE) | ACT(SITU))
static const kernel_def k_trtllm_mono = {
    .name = "TrtLlmNvFp4ExpertsMonolithic", .device = dev_sm10x, .no_act_and_mul = true,
    .activations = ACTS_TRTLLM, .schemes = SCH(W4A4) | SCH(W4A4_PER_TOKEN), .quant_rule = quant_trtllm,
    .parallel = par_trtllm_mono, .monolithic = true,
    .routings = ROUTE(DEEPSEEK_V3) | ROUTE(RENORMALIZE) | ROUTE(RENORMALIZE_NAIVE) | ROUTE(LLAMA4) |
                ROUTE(SIGMOID_RENORM) | ROUTE(SIGMOID) | ROUTE(MINIMAX2) | ROUTE(SIMULATED),
    .logits_dtypes = DT(BF16) | DT(F32),
};
static const kernel_def k_trtllm_modular = {
    .name = "TrtLlmNvFp4ExpertsModular", .device = dev_sm10x, .no_act_and_mul = true,
    .activations = ACTS_TRTLLM, .schemes = SCH(W4A4) | SCH(W4A4_PER_TOKEN), .quant_rule = quant_trtllm,
};
static const kernel_def k_fi_cutlass = {
    .name = "FlashInferExperts", .device = dev_fi_cutlass, .no_act_and_mul = true,
    .activations = ACT(SILU) | ACT(RELU2_NO_MUL) | ACT(SWIGLUOAI), .schemes = SCH(W4A4),
    .quant_rule = quant_fi_cutlass,
};
/* The newest CuTeDSL class (the seed's generation): SILU, RELU2_NO_MUL, SWIGLUOAI; per-token. */
static const kernel_def k_fi_cutedsl = {
    .name = "FlashInferCuteDSLExperts", .device = dev_sm10x, .no_act_and_mul = true,
    .activations = ACT(SILU) | ACT(RELU2_NO_MUL) | ACT(SWIGLUOAI), .schemes = SCH(W4A4) | SCH(W4A4_PER_TOKEN),
};
static const kernel_def k_fi_cutedsl_batched = {
    .name = "FlashInferCuteDSLBatchedExperts", .device = dev_sm10x, .no_act_and_mul = false,
    .activations = ACT(SILU), .schemes = SCH(W4A4), .batched = true,
};
/* Not in the reference snapshot (only the seed's mapping names it): FlashInfer's moe_ep CuTeDSL
 * path, modelled on the CuTeDSL masked kernels it builds on: SM10x, W4A4, SILU, and it exists for
 * expert parallelism, so it requires EP. */
static const kernel_def k_fi_moe_ep_cutedsl = {
    .name = "FlashInferMoeEpCuteDSLExperts", .device = dev_sm10x, .no_act_and_mul = false,
    .activations = ACT(SILU), .schemes = SCH(W4A4), .parallel = par_needs_ep,
};
static const kernel_def k_fi_b12x = {
    .name = "FlashInferB12xExperts", .device = dev_sm12x, .no_act_and_mul = false,
    .activations = ACT(SILU), .schemes = SCH(W4A4) | SCH(W4A16),
};
static const kernel_def k_vllm_cutlass = {
    .name = "CutlassExpertsFp4", .device = dev_sm10x_11x_12x, .no_act_and_mul = true,
    .activations = ACTS_APPLY_MOE, .schemes = SCH(W4A4), .parallel = par_no_ep, .batch_invariant = true,
};
/* Marlin checks only the weight key: a W4A4 checkpoint runs as W4A16. */
static const kernel_def k_marlin = {
    .name = "MarlinExperts", .device = dev_sm75, .no_act_and_mul = true, .activations = ACTS_APPLY_MOE,
    .schemes = SCHEMES_ALL, .parallel = par_not_fi_nvl_two_sided, .batch_invariant = true, .lora = true,
};
static const kernel_def k_humming_batched = {
    .name = "BatchedHummingGroupedExperts", .device = dev_sm75, .no_act_and_mul = true,
    .activations = ACTS_TRITON, .schemes = SCHEMES_ALL, .parallel = par_not_fi_nvl, .batched = true,
};
static const kernel_def k_humming_grouped = {
    .name = "HummingGroupedExperts", .device = dev_sm75, .no_act_and_mul = true,
    .activations = ACTS_TRITON, .schemes = SCHEMES_ALL, .parallel = par_not_fi_nvl,
    .extra = extra_humming_grouped,
};
static const kernel_def k_humming_indexed = {
    .name = "HummingIndexedExperts", .device = dev_sm75, .no_act_and_mul = true,
    .activations = ACTS_TRITON, .schemes = SCHEMES_ALL, .parallel = par_not_fi_nvl,
};
static const kernel_def k_emulation = {
    .name = "Nvfp4QuantizationEmulationTritonExperts", .device = dev_cuda, .no_act_and_mul = true,
    .activations = ACTS_TRITON, .schemes = SCH(W4A4), .parallel = par_not_fi_nvl,
    .batch_invariant = true, .extra = extra_no_bias,
};
/* Ours: the Hopper wgmma W4A16 kernel. Built for sm_90a only (wgmma and setmaxnreg exist there
 * alone); weights decoded from NVFP4 to bf16/fp16 in registers, so any quant scheme runs as W4A16
 * as on MARLIN; every activation of the GPU pipeline, the clamp included; bf16/fp16 activations.
 * Standard format only (no batched class yet); under EP it runs the local experts. Split-K sums
 * with atomics, in an order that varies from run to run: not batch invariant. No LoRA. */
static bool extra_16bit_io(const oracle_ctx *c, char *reason, size_t len) {
    if (c->cfg->in_dtype == NVFP4MOE_DTYPE_BF16 || c->cfg->in_dtype == NVFP4MOE_DTYPE_FP16) return true;
    snprintf(reason, len, "kernel does not support %s input/output dtype", torch_dtype_name(c->cfg->in_dtype));
    return false;
}
static const kernel_def k_hopper_wgmma = {
    .name = "HopperWgmmaExperts", .sm_min = 90, .sm_max = 90, .no_act_and_mul = true,
    .activations = ACTS_ALL, .schemes = SCHEMES_ALL, .parallel = par_not_fi_nvl_two_sided,
    .extra = extra_16bit_io,
};
/* Ours: the float64 host reference (src/reference/moe_ref.c). Any device, since it runs on the host; every
 * activation and scheme; deterministic (batch invariant). It computes the whole layer on one rank,
 * so no expert parallelism and no batched (all2all-dispatched) input; no LoRA. */
static const kernel_def k_cpu_reference = {
    .name = "CpuReferenceExperts", .device = dev_any, .no_act_and_mul = true, .activations = ACTS_ALL,
    .schemes = SCHEMES_ALL, .parallel = par_no_ep, .batch_invariant = true,
};

// ---- the backend table ----
//
// How to add a backend (say a fast CPU one, or a Hopper wgmma one):
//   1. Write its implementation in one file, src/backends/<name>.c, exporting a
//      nvfp4moe_backend_impl whose .name is the backend's name below (and list it where
//      nvfp4moe_impl_find looks), so that the row counts as available.
//   2. Add one line to k_backends: its name, the moe_backend string users type, its auto rank
//      (the auto list is sorted by rank: vLLM's run 10..80, so 75 lands between HUMMING and
//      EMULATION, 900 before CPU_REFERENCE), whether it applies the SwiGLU clamp, .ours = true,
//      lib 0, and its kernel's traits as a compound literal right in the line (a GPU kernel
//      states its sm range instead of a device function):
//        {"CPU_FAST", "cpu_fast", 900, true, true, 0, {&(const kernel_def){.name = "CpuFastExperts",
//         .device = dev_any, .no_act_and_mul = true, .activations = ACTS_ALL, .schemes = SCHEMES_ALL,
//         .parallel = par_no_ep, .batch_invariant = true}}},
//        {"HOPPER_WGMMA", "hopper_wgmma", 55, true, true, 0, {&(const kernel_def){.name =
//         "HopperWgmmaExperts", .sm_min = 90, .sm_max = 90, ...}}},
//   Ours never change a vllm_only decision (they are hidden then), and ranking one ahead of a vLLM
//   backend changes the non-vllm_only decision only: say why in the line's comment.
// The row order is map_nvfp4_backend's key order (it is the order of the unknown-name message).

#define MAX_KERNELS 4

typedef struct backend_def {
    const char *name;          /* NvFp4MoeBackend value: "MARLIN" */
    const char *moe_backend;   /* the user's name; NULL: reached only by a rewrite (CUTEDSL_BATCHED) */
    int auto_rank;             /* place in the auto list, lowest first; 0: explicit-only */
    bool clamp;                /* in NVFP4_BACKENDS_WITH_CLAMP: applies the SwiGLU clamp */
    bool ours;                 /* not one of vLLM's: hidden under vllm_only */
    uint32_t lib;              /* NVFP4MOE_LIB_* holding its implementation; 0: ours (impl_find) */
    const kernel_def *kernels[MAX_KERNELS]; /* in vLLM's order, the first supported one wins */
} backend_def;

static const backend_def k_backends[] = {
    {"B12X", "b12x", 0, true, false, NVFP4MOE_LIB_B12X, {&k_b12x}},
    {"VLLM_CUTLASS", "cutlass", 50, true, false, NVFP4MOE_LIB_VLLM_CUTLASS, {&k_vllm_cutlass}},
    /* "prefer Monolithic > Modular" */
    {"FLASHINFER_TRTLLM", "flashinfer_trtllm", 10, true, false, NVFP4MOE_LIB_FLASHINFER,
     {&k_trtllm_mono, &k_trtllm_modular}},
    {"FLASHINFER_CUTLASS", "flashinfer_cutlass", 40, true, false, NVFP4MOE_LIB_FLASHINFER, {&k_fi_cutlass}},
    {"FLASHINFER_CUTEDSL", "flashinfer_cutedsl", 20, true, false, NVFP4MOE_LIB_FLASHINFER, {&k_fi_cutedsl}},
    /* No name of its own: explicit flashinfer_cutedsl becomes it under the batched format. */
    {"FLASHINFER_CUTEDSL_BATCHED", NULL, 30, false, false, NVFP4MOE_LIB_FLASHINFER, {&k_fi_cutedsl_batched}},
    {"FLASHINFER_MOE_EP_CUTEDSL", "flashinfer_moe_ep_cutedsl", 0, true, false, NVFP4MOE_LIB_FLASHINFER,
     {&k_fi_moe_ep_cutedsl}},
    /* Excluded from auto until the upstream CUTLASS SM121 MMA op guard is resolved. */
    {"FLASHINFER_B12X", "flashinfer_b12x", 0, false, false, NVFP4MOE_LIB_FLASHINFER, {&k_fi_b12x}},
    /* Ours: W4A16 on Hopper's wgmma (src/backends/cuda.c, kernels/hopper_gemm.cu). Rank 55: ahead
     * of MARLIN (and of HUMMING, which prioritize_humming puts just before MARLIN), where the
     * layers it is faster on want it; auto_list moves it behind MARLIN for the others
     * (hopper_ahead_of_marlin). */
    {"HOPPER_WGMMA", "hopper_wgmma", 55, true, true, 0, {&k_hopper_wgmma}},
    {"MARLIN", "marlin", 60, true, false, 0, {&k_marlin}},
    /* Standard format: the indexed class by default; batched under DeepEP-LL / NIXL EP. */
    {"HUMMING", "humming", 70, true, false, NVFP4MOE_LIB_HUMMING,
     {&k_humming_batched, &k_humming_grouped, &k_humming_indexed}},
    {"EMULATION", "emulation", 80, true, false, 0, {&k_emulation}},
    /* Ours: the multi-threaded float32 host backend (src/backends/cpu_fast.c), the same function as
     * the reference, ahead of it because it is faster; fixed-order sums make it batch invariant. */
    {"CPU_FAST", "cpu_fast", 900, true, true, 0, {&(const kernel_def){.name = "CpuFastExperts",
     .device = dev_any, .no_act_and_mul = true, .activations = ACTS_ALL, .schemes = SCHEMES_ALL,
     .parallel = par_no_ep, .batch_invariant = true}}},
    /* Ours, always last: something always runs. Applies the clamp as vLLM's reference does. */
    {"CPU_REFERENCE", "cpu_reference", 1000, true, true, 0, {&k_cpu_reference}},
};

#define N_BACKENDS ((int)(sizeof k_backends / sizeof k_backends[0]))

static const backend_def *backend_by_name(const char *name) {
    for (int i = 0; i < N_BACKENDS; i++)
        if (!strcmp(k_backends[i].name, name)) return &k_backends[i];
    return NULL;
}

// ---- libraries ----

static const struct {
    const char *cli;   /* --installed name */
    const char *what;  /* how a reason names it */
    uint32_t bit;
} k_libs[] = {
    {"flashinfer", "FlashInfer", NVFP4MOE_LIB_FLASHINFER},
    {"b12x", "b12x", NVFP4MOE_LIB_B12X},
    {"humming", "humming", NVFP4MOE_LIB_HUMMING},
    {"cutlass", "vLLM's CUTLASS MoE library (_C ops)", NVFP4MOE_LIB_VLLM_CUTLASS},
};

#define N_LIBS ((int)(sizeof k_libs / sizeof k_libs[0]))

nvfp4moe_status nvfp4moe_oracle_libs_parse(const char *s, uint32_t *mask) {
    NVFP4MOE_RETURN_IF(!s || !mask, NVFP4MOE_ERR_INVALID_ARGUMENT, "installed: NULL argument");
    char accepted[128] = "all, none";
    for (int i = 0; i < N_LIBS; i++) {
        strncat(accepted, ", ", sizeof accepted - strlen(accepted) - 1);
        strncat(accepted, k_libs[i].cli, sizeof accepted - strlen(accepted) - 1);
    }
    if (!strcasecmp(s, "all")) {
        *mask = NVFP4MOE_LIB_ALL;
        return NVFP4MOE_OK;
    }
    if (!strcasecmp(s, "none")) {
        *mask = 0;
        return NVFP4MOE_OK;
    }
    uint32_t m = 0;
    const char *p = s;
    for (;;) {
        size_t n = strcspn(p, ",");
        bool found = false;
        for (int i = 0; i < N_LIBS; i++) {
            if (strlen(k_libs[i].cli) == n && !strncasecmp(p, k_libs[i].cli, n)) {
                m |= k_libs[i].bit;
                found = true;
            }
        }
        if (!found)
            return nvfp4moe_set_error(NVFP4MOE_ERR_NOT_FOUND, "unknown library '%.*s' (expected "
                                      "one of: %s, or a comma-separated list)", (int)n, p, accepted);
        if (!p[n]) break;
        p += n + 1;
    }
    *mask = m;
    return NVFP4MOE_OK;
}

/* Whether b's implementation is in this build (or, what-if, installed). Writes the reason. */
static bool backend_available(const backend_def *b, const nvfp4moe_oracle_options *opt, char *reason,
                              size_t len) {
    if (nvfp4moe_impl_find(b->name)) return true;
    if (opt->installed_set && (b->lib == 0 || (opt->installed & b->lib))) return true;
    const char *what = NULL;
    for (int i = 0; i < N_LIBS; i++)
        if (b->lib & k_libs[i].bit) what = k_libs[i].what;
    if (what)
        snprintf(reason, len, "%s is not available in this build", what);
    else
        snprintf(reason, len, "the %s implementation is not available in this build%s", b->name,
                 nvfp4moe_built_with_cuda() ? "" : " (CPU-only build)");
    return false;
}

// ---- the predicate ----

#define REASON(...) (snprintf(reason, len, __VA_ARGS__), false)

/* FusedMoEExperts.is_supported_config: vLLM's checks in vLLM's order, stopping at the first
 * failure (hash routing and _supports_shape never fail for our configs and are not modelled). */
static bool kernel_supported(const kernel_def *k, const oracle_ctx *c, char *reason, size_t len) {
    const nvfp4moe_config *cfg = c->cfg;
    bool gated = nvfp4moe_activation_is_gated(cfg->activation);
    char buf[200];
    bool dev_ok = k->device ? k->device(c->dev)
                            : c->dev->is_cuda && c->dev->sm >= k->sm_min && (k->sm_max == 0 || c->dev->sm <= k->sm_max);
    if (!dev_ok)
        return REASON("kernel does not support current device %s", c->dev_str);
    if (!gated && !k->no_act_and_mul)
        return REASON("kernel does not support no act_and_mul MLP layer");
    if (!(k->activations & (1u << cfg->activation)))
        return REASON("kernel does not support %s activation", nvfp4moe_activation_name(cfg->activation));
    if (!(k->schemes & (1u << c->scheme))) {
        quant_scheme_str(c->scheme, buf, sizeof buf);
        return REASON("kernel does not support quantization scheme %s", buf);
    }
    if (k->quant_rule && !k->quant_rule(c, reason, len)) return false;
    if (k->parallel && !k->parallel(c)) {
        parallel_str(c, buf, sizeof buf);
        return REASON("kernel does not support parallel config %s", buf);
    }
    if (k->monolithic && !(k->routings & (1u << cfg->routing)))
        return REASON("kernel does not support routing method %s", routing_type_name(cfg->routing));
    if (k->monolithic && !(k->logits_dtypes & (1u << cfg->router_logits_dtype)))
        return REASON("kernel does not support router logits dtype %s", torch_dtype_name(cfg->router_logits_dtype));
    if (c->batched != k->batched)
        return REASON("kernel does not support %s activation format", c->batched ? "BatchedExperts" : "Standard");
    if (cfg->batch_invariant && !k->batch_invariant)
        return REASON("kernel does not support batch invariance");
    if (cfg->lora && !k->lora)
        return REASON("kernel does not support LoRA");
    if (k->extra && !k->extra(c, reason, len)) return false;
    reason[0] = '\0';
    return true;
}

/* The predicate, then availability (see the top of the file for why in this order). */
static bool kernel_runs(const backend_def *b, const kernel_def *k, const oracle_ctx *c,
                        const nvfp4moe_oracle_options *opt, char *reason, size_t len) {
    if (!kernel_supported(k, c, reason, len)) return false;
    if (!backend_available(b, opt, reason, len)) return false;
    reason[0] = '\0';
    return true;
}

// ---- Python's repr, for the messages vLLM formats with f-strings ----

/* repr(float): the shortest digits that read back as the same float32 (the value came from a
 * config file as a decimal), fixed notation for 1e-4 <= |x| < 1e16 with at least ".0", else
 * "1e-05" / "1.5e+16". */
static void py_float_repr(float x, char *out, size_t len) {
    if (isnan(x)) { nvfp4moe_strlcpy(out, "nan", len); return; }
    if (isinf(x)) { nvfp4moe_strlcpy(out, x < 0 ? "-inf" : "inf", len); return; }
    if (x == 0) { nvfp4moe_strlcpy(out, signbit(x) ? "-0.0" : "0.0", len); return; }
    char e[48];
    for (int p = 1; p <= 9; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, (double)x);
        if (strtof(e, NULL) == x) break;
    }
    /* e = "[-]d.ddde[+-]XX": split into sign, digits, exponent. */
    bool neg = e[0] == '-';
    const char *m = e + neg;
    char digits[16];
    int nd = 0;
    for (const char *q = m; *q && *q != 'e' && nd < 15; q++)
        if (isdigit((unsigned char)*q)) digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int exp10 = atoi(strchr(e, 'e') + 1);
    char body[64];
    if (exp10 >= -4 && exp10 < 16) {
        size_t u = 0;
        if (exp10 < 0) {
            u += (size_t)snprintf(body + u, sizeof body - u, "0.");
            for (int i = 0; i < -exp10 - 1; i++) body[u++] = '0';
            u += (size_t)snprintf(body + u, sizeof body - u, "%s", digits);
        } else {
            for (int i = 0; i <= exp10; i++) body[u++] = i < nd ? digits[i] : '0';
            body[u++] = '.';
            if (nd > exp10 + 1)
                u += (size_t)snprintf(body + u, sizeof body - u, "%s", digits + exp10 + 1);
            else
                body[u++] = '0';
            body[u] = '\0';
        }
    } else {
        snprintf(body, sizeof body, "%c%s%se%c%02d", digits[0], nd > 1 ? "." : "", digits + 1,
                 exp10 < 0 ? '-' : '+', abs(exp10));
    }
    snprintf(out, len, "%s%s", neg ? "-" : "", body);
}

/* repr(str) for the ASCII names moe_backend can hold: single quotes unless the text has one and
 * no double quote; backslash escapes; other bytes as \xNN. */
static void py_str_repr(const char *s, char *out, size_t len) {
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    size_t u = 0;
    if (len < 8) { if (len) out[0] = '\0'; return; }
    out[u++] = q;
    for (const unsigned char *p = (const unsigned char *)s; *p && u + 6 < len; p++) {
        if (*p == '\\' || *p == (unsigned char)q) {
            out[u++] = '\\';
            out[u++] = (char)*p;
        } else if (*p < 0x20 || *p >= 0x7f) {
            u += (size_t)snprintf(out + u, len - u, "\\x%02x", *p);
        } else {
            out[u++] = (char)*p;
        }
    }
    out[u++] = q;
    out[u] = '\0';
}

// ---- the report ----

/* A bounded string builder: never overflows, remembers the length the full text needs. */
typedef struct sbuf {
    char *buf;
    size_t len, need;
} sbuf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t avail = b->need < b->len ? b->len - b->need : 0;
    int n = vsnprintf(avail ? b->buf + b->need : NULL, avail, fmt, ap);
    va_end(ap);
    if (n > 0) b->need += (size_t)n;
}

static void add_candidate(nvfp4moe_report *r, const backend_def *b, const kernel_def *k,
                          nvfp4moe_verdict v, bool supported, const char *reason) {
    if (r->n_candidates >= NVFP4MOE_MAX_CANDIDATES) return; /* the table is far smaller */
    nvfp4moe_candidate *cd = &r->candidates[r->n_candidates++];
    nvfp4moe_strlcpy(cd->backend, b->name, sizeof cd->backend);
    nvfp4moe_strlcpy(cd->kernel, k->name, sizeof cd->kernel);
    cd->verdict = v;
    cd->supported = supported;
    nvfp4moe_strlcpy(cd->reason, reason, sizeof cd->reason);
}

/* Appends every kernel of b as NOT_IN_LIST: why it was no candidate, then what its predicate
 * would have said (so a what-if user sees e.g. that an explicit-only backend would run). */
static void add_not_in_list(nvfp4moe_report *r, const backend_def *b, const oracle_ctx *c,
                            const nvfp4moe_oracle_options *opt, const char *why) {
    for (int j = 0; j < MAX_KERNELS && b->kernels[j]; j++) {
        char verdict[320], reason[400];
        bool ok = kernel_runs(b, b->kernels[j], c, opt, verdict, sizeof verdict);
        if (ok)
            snprintf(reason, sizeof reason, "%s; would be supported", why);
        else
            snprintf(reason, sizeof reason, "%s; would be rejected: %s", why, verdict);
        add_candidate(r, b, b->kernels[j], NVFP4MOE_VERDICT_NOT_IN_LIST, ok, reason);
    }
}

const char *nvfp4moe_verdict_name(nvfp4moe_verdict v) {
    switch (v) {
    case NVFP4MOE_VERDICT_CHOSEN:      return "chosen";
    case NVFP4MOE_VERDICT_SUPPORTED:   return "supported";
    case NVFP4MOE_VERDICT_REJECTED:    return "rejected";
    case NVFP4MOE_VERDICT_NOT_IN_LIST: return "not in list";
    }
    return "?";
}

// ---- selection ----

/* HOPPER_WGMMA or MARLIN first? From the committed H200 table of whole-layer times,
 * bench/results/2026-12-02-h200-backends.md (MARLIN us / HOPPER_WGMMA us, M = 1 4 16 64 256 1024 4096):
 *   deepseek-v3     (H 7168, 256 experts)  0.98 0.91 1.26 1.26 1.18 1.05 1.18
 *   kimi-k2         (H 7168, 384 experts)  0.99 1.04 1.25 1.26 1.26 1.17 1.34
 *   qwen3-235b-a22b (H 4096, 128 experts)  1.03 0.79 1.17 0.86 0.63 1.00 1.11
 *   qwen3-30b-a3b   (H 2048, 128 experts)  1.01 0.80 0.87 0.86 0.69 0.55 1.01
 *   mixtral-8x7b    (H 4096,   8 experts)  0.80 0.95 0.97 0.91 0.78 1.01 1.39
 *   gpt-oss-120b    (H 2880, 128 experts)  0.79 0.77 0.75 0.67 0.97 0.84 1.11
 * The large-expert layers (hidden 7168) gain 1.05-1.34x from M = 16 up and lose at most 9 % below;
 * every other measured layer loses at most batch sizes. The oracle sees the shape, not the batch
 * size, so: ahead of MARLIN for hidden_size >= 7168, behind it otherwise. */
#define HOPPER_MIN_HIDDEN 7168
static bool hopper_ahead_of_marlin(const nvfp4moe_config *cfg) { return cfg->hidden_size >= HOPPER_MIN_HIDDEN; }

static bool visible(const backend_def *b, const nvfp4moe_oracle_options *opt) {
    return !(opt->vllm_only && b->ours);
}

/* The seed's AVAILABLE_BACKENDS (ours appended unless vllm_only): rows with an auto rank, by
 * rank, then prioritize_humming. Returns the count. */
static int auto_list(const oracle_ctx *c, const nvfp4moe_oracle_options *opt, const backend_def **out) {
    int n = 0;
    for (int i = 0; i < N_BACKENDS; i++)
        if (k_backends[i].auto_rank > 0 && visible(&k_backends[i], opt)) out[n++] = &k_backends[i];
    /* Insertion sort: stable, so equal ranks keep table order. */
    for (int i = 1; i < n; i++) {
        const backend_def *x = out[i];
        int j = i - 1;
        for (; j >= 0 && out[j]->auto_rank > x->auto_rank; j--) out[j + 1] = out[j];
        out[j + 1] = x;
    }
    /* prioritize_humming (v2): Humming's WGMMA beats Marlin on Hopper, so on sm_90 (only) HUMMING
     * is popped and re-inserted just before MARLIN; every other entry keeps its order. */
    if (c->dev->is_cuda && c->dev->sm == 90) {
        int h = -1, m = -1;
        for (int i = 0; i < n; i++) {
            if (!strcmp(out[i]->name, "HUMMING")) h = i;
            if (!strcmp(out[i]->name, "MARLIN")) m = i;
        }
        if (h > m && m >= 0) {
            const backend_def *hb = out[h];
            for (int i = h; i > m; i--) out[i] = out[i - 1];
            out[m] = hb;
        }
    }
    /* HOPPER_WGMMA goes just behind MARLIN on the layers where MARLIN is faster. */
    if (!hopper_ahead_of_marlin(c->cfg)) {
        int h = -1, m = -1;
        for (int i = 0; i < n; i++) {
            if (!strcmp(out[i]->name, "HOPPER_WGMMA")) h = i;
            if (!strcmp(out[i]->name, "MARLIN")) m = i;
        }
        if (h >= 0 && m > h) {
            const backend_def *hb = out[h];
            for (int i = h; i < m; i++) out[i] = out[i + 1];
            out[m] = hb;
        }
    }
    return n;
}

/* "['A', 'B']": Python's repr of the list of enum values. */
static void list_repr(const backend_def *const *list, int n, char *buf, size_t len) {
    sbuf b = {buf, len, 0};
    sb_printf(&b, "[");
    for (int i = 0; i < n; i++) sb_printf(&b, "%s'%s'", i ? ", " : "", list[i]->name);
    sb_printf(&b, "]");
}

static void make_log(nvfp4moe_report *r, const backend_def *chosen, const backend_def *const *list, int n) {
    char l[512];
    list_repr(list, n, l, sizeof l);
    snprintf(r->log, sizeof r->log, "Using '%s' NvFp4 MoE backend out of potential backends: %s.",
             chosen->name, l);
}

static nvfp4moe_status raise_error(nvfp4moe_report *r, nvfp4moe_status st, const char *kind, const char *msg) {
    nvfp4moe_strlcpy(r->error_kind, kind, sizeof r->error_kind);
    nvfp4moe_strlcpy(r->error, msg, sizeof r->error);
    return nvfp4moe_set_error(st, "%s", msg);
}

/* Tries b's kernels in order, recording each; returns the index of the first that runs (-1: none)
 * and leaves the last reason in last_reason. first_wins: the first that runs is CHOSEN (else all
 * that run are SUPPORTED, a higher-priority backend having won). */
static int try_backend(nvfp4moe_report *r, const backend_def *b, const oracle_ctx *c,
                       const nvfp4moe_oracle_options *opt, bool first_wins, char *last_reason, size_t len) {
    int chosen = -1;
    last_reason[0] = '\0';
    for (int j = 0; j < MAX_KERNELS && b->kernels[j]; j++) {
        char reason[320];
        bool ok = kernel_runs(b, b->kernels[j], c, opt, reason, sizeof reason);
        nvfp4moe_verdict v = NVFP4MOE_VERDICT_REJECTED;
        if (ok && first_wins && chosen < 0) {
            v = NVFP4MOE_VERDICT_CHOSEN;
            chosen = j;
            nvfp4moe_strlcpy(r->backend, b->name, sizeof r->backend);
            nvfp4moe_strlcpy(r->kernel, b->kernels[j]->name, sizeof r->kernel);
        } else if (ok) {
            v = NVFP4MOE_VERDICT_SUPPORTED;
            if (chosen < 0 && !first_wins) chosen = j;
        }
        if (chosen < 0) nvfp4moe_strlcpy(last_reason, reason, len);
        add_candidate(r, b, b->kernels[j], v, ok, ok ? "" : reason);
    }
    return chosen;
}

static bool in_list(const backend_def *b, const backend_def *const *list, int n) {
    for (int i = 0; i < n; i++)
        if (list[i] == b) return true;
    return false;
}

static bool reported(const nvfp4moe_report *r, const backend_def *b) {
    for (int k = 0; k < r->n_candidates; k++)
        if (!strcmp(r->candidates[k].backend, b->name)) return true;
    return false;
}

/* Records, as NOT_IN_LIST, every backend not yet in the report: first those of the auto list in
 * its order, then the others in table order. In auto mode the others say why they were no
 * candidate (the clamp filter, explicit-only); otherwise every one gets why. */
static void add_rest(nvfp4moe_report *r, const oracle_ctx *c, const nvfp4moe_oracle_options *opt,
                     const backend_def *const *list, int n, const backend_def *const *filtered, int nf,
                     bool auto_mode, const char *why) {
    for (int i = 0; i < n; i++)
        if (!reported(r, list[i])) add_not_in_list(r, list[i], c, opt, why);
    for (int i = 0; i < N_BACKENDS; i++) {
        const backend_def *b = &k_backends[i];
        if (!visible(b, opt) || reported(r, b)) continue;
        char own[200];
        if (auto_mode && in_list(b, filtered, nf))
            snprintf(own, sizeof own, "removed from the auto list by swiglu_limit: does not apply the SwiGLU clamp");
        else if (auto_mode && b->auto_rank == 0 && b->moe_backend)
            snprintf(own, sizeof own, "explicit-only, not in the auto list (request it with moe_backend='%s')",
                     b->moe_backend);
        else if (auto_mode)
            snprintf(own, sizeof own, "not in the auto list");
        else
            nvfp4moe_strlcpy(own, why, sizeof own);
        add_not_in_list(r, b, c, opt, own);
    }
}

nvfp4moe_status nvfp4moe_select(const nvfp4moe_config *cfg, const nvfp4moe_device *dev,
                                const nvfp4moe_oracle_options *opt_in, nvfp4moe_report *r) {
    NVFP4MOE_RETURN_IF(!r, NVFP4MOE_ERR_INVALID_ARGUMENT, "select: report is NULL");
    memset(r, 0, sizeof *r);
    NVFP4MOE_RETURN_IF(!cfg, NVFP4MOE_ERR_INVALID_ARGUMENT, "select: config is NULL");
    NVFP4MOE_RETURN_IF(!memchr(cfg->moe_backend, '\0', sizeof cfg->moe_backend),
                       NVFP4MOE_ERR_INVALID_ARGUMENT, "moe_backend is not NUL-terminated");
    /* Validate everything but the name: an unknown name is the oracle's ValueError, below. */
    nvfp4moe_config vc = *cfg;
    nvfp4moe_strlcpy(vc.moe_backend, cfg->moe_backend[0] ? "auto" : "", sizeof vc.moe_backend);
    NVFP4MOE_TRY(nvfp4moe_config_validate(&vc));

    nvfp4moe_oracle_options opt = {0};
    if (opt_in) opt = *opt_in;
    nvfp4moe_device detected;
    if (!dev) {
        NVFP4MOE_TRY(nvfp4moe_device_detect(&detected));
        dev = &detected;
    }

    oracle_ctx c = {.cfg = cfg, .dev = dev, .scheme = cfg->scheme};
    const nvfp4moe_parallel *p = &cfg->parallel;
    c.use_ep = p->ep_size > 1;
    c.use_all2all = c.use_ep && p->dp_size > 1;
    c.batched = c.use_all2all && (!strcmp(p->all2all, "deepep_low_latency") || !strcmp(p->all2all, "nixl_ep"));
    nvfp4moe_device_str(dev, c.dev_str, sizeof c.dev_str);
    nvfp4moe_strlcpy(r->device, c.dev_str, sizeof r->device);

    /* vLLM's config validator: value.lower().replace("-", "_"). */
    char name[sizeof cfg->moe_backend];
    for (size_t i = 0; i < sizeof name; i++) {
        char ch = (char)tolower((unsigned char)cfg->moe_backend[i]);
        name[i] = ch == '-' ? '_' : ch;
        if (!ch) break;
    }
    nvfp4moe_strlcpy(r->requested, name, sizeof r->requested);

    /* The auto list, prioritize_humming, then the SwiGLU clamp filter. vLLM builds it after the
     * requantization check; it has no side effect, and the report lists candidates in its order. */
    const backend_def *all[N_BACKENDS], *list[N_BACKENDS], *filtered[N_BACKENDS];
    int n_all = auto_list(&c, &opt, all), n = 0, nf = 0;
    for (int i = 0; i < n_all; i++) {
        if (cfg->has_swiglu_limit && !all[i]->clamp)
            filtered[nf++] = all[i];
        else
            list[n++] = all[i];
    }

    /* 1. A requantization source gets EMULATION at once, before any check or name lookup. */
    if (cfg->requantization_source) {
        const backend_def *emu = backend_by_name("EMULATION");
        char avail[200] = "";
        bool ok = backend_available(emu, &opt, avail, sizeof avail);
        char why[320];
        snprintf(why, sizeof why, "the layer is a requantization source: vLLM returns EMULATION without "
                 "checking it%s%s", ok ? "" : "; note: ", ok ? "" : avail);
        add_candidate(r, emu, emu->kernels[0], NVFP4MOE_VERDICT_CHOSEN, true, why);
        nvfp4moe_strlcpy(r->backend, emu->name, sizeof r->backend);
        nvfp4moe_strlcpy(r->kernel, emu->kernels[0]->name, sizeof r->kernel);
        add_rest(r, &c, &opt, list, n, filtered, nf, false, "not considered: the layer is a requantization source");
        return NVFP4MOE_OK;
    }

    /* 2. map_nvfp4_backend. */
    const backend_def *req = NULL;
    if (strcmp(name, "auto") != 0) {
        for (int i = 0; i < N_BACKENDS; i++)
            if (k_backends[i].moe_backend && visible(&k_backends[i], &opt) && !strcmp(k_backends[i].moe_backend, name))
                req = &k_backends[i];
        if (!req) {
            /* The mapping's keys: vLLM's in its order, then ours. */
            char keys[400], msg[640];
            sbuf kb = {keys, sizeof keys, 0};
            int nk = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int i = 0; i < N_BACKENDS; i++)
                    if (k_backends[i].moe_backend && visible(&k_backends[i], &opt) && k_backends[i].ours == (pass == 1))
                        sb_printf(&kb, "%s'%s'", nk++ ? ", " : "[", k_backends[i].moe_backend);
            sb_printf(&kb, "]");
            snprintf(msg, sizeof msg, "moe_backend='%s' is not supported for NvFP4 MoE. Expected one of %s.",
                     name, keys);
            char why[96];
            snprintf(why, sizeof why, "not considered: moe_backend='%.40s' is unknown", name);
            add_rest(r, &c, &opt, list, n, filtered, nf, false, why);
            return raise_error(r, NVFP4MOE_ERR_NOT_FOUND, "ValueError", msg);
        }
    }

    if (req) {
        /* 3. Explicit request. B12X runs with bf16 activations when forced: no activation key. */
        if (!strcmp(req->name, "B12X") && cfg->force_a16) c.scheme = NVFP4MOE_SCHEME_W4A16;
        const backend_def *asked = req;
        if (c.batched && !strcmp(req->name, "FLASHINFER_CUTEDSL")) req = backend_by_name("FLASHINFER_CUTEDSL_BATCHED");
        char name_repr[96], why[200];
        py_str_repr(name, name_repr, sizeof name_repr);
        if (req != asked)
            snprintf(why, sizeof why, "not requested (moe_backend=%s became %s under the BatchedExperts "
                     "activation format)", name_repr, req->name);
        else
            snprintf(why, sizeof why, "not requested (moe_backend=%s)", name_repr);

        if (cfg->has_swiglu_limit && !req->clamp) {
            char lim[80], msg[640];
            py_float_repr(cfg->swiglu_limit, lim, sizeof lim);
            snprintf(msg, sizeof msg,
                     "Model sets swiglu_limit=%s, but the explicitly requested moe_backend=%s does not "
                     "apply the SwiGLU clamp. Use 'flashinfer_trtllm', 'flashinfer_cutlass', "
                     "'flashinfer_cutedsl', 'flashinfer_moe_ep_cutedsl', 'cutlass', 'b12x', 'marlin', "
                     "or 'humming' instead.", lim, name_repr);
            for (int j = 0; j < MAX_KERNELS && req->kernels[j]; j++)
                add_candidate(r, req, req->kernels[j], NVFP4MOE_VERDICT_REJECTED, false,
                              "requested, but not in the SwiGLU clamp set while swiglu_limit is set");
            add_rest(r, &c, &opt, list, n, filtered, nf, false, why);
            return raise_error(r, NVFP4MOE_ERR_UNSUPPORTED, "ValueError", msg);
        }

        char last[320];
        int k = try_backend(r, req, &c, &opt, true, last, sizeof last);
        add_rest(r, &c, &opt, list, n, filtered, nf, false, why);
        if (k >= 0) {
            make_log(r, req, list, n);
            return NVFP4MOE_OK;
        }
        char msg[640];
        if (last[0])
            snprintf(msg, sizeof msg, "NvFp4 MoE backend '%s' does not support the deployment configuration "
                     "since %s.", req->name, last);
        else
            snprintf(msg, sizeof msg, "NvFp4 MoE backend '%s' does not support the deployment configuration.",
                     req->name);
        return raise_error(r, NVFP4MOE_ERR_UNSUPPORTED, "ValueError", msg);
    }

    /* 4. Auto: the first kernel that runs, in list order. The rest are still evaluated, for the
     * report (vLLM stops at the first). */
    const backend_def *chosen = NULL;
    for (int i = 0; i < n; i++) {
        char last[320];
        if (try_backend(r, list[i], &c, &opt, chosen == NULL, last, sizeof last) >= 0 && !chosen)
            chosen = list[i];
    }
    add_rest(r, &c, &opt, list, n, filtered, nf, true, "");
    /* Say why HOPPER_WGMMA lost to MARLIN when both run (the list order alone would not). */
    for (int i = 0; i < r->n_candidates && !hopper_ahead_of_marlin(cfg); i++) {
        nvfp4moe_candidate *cd = &r->candidates[i];
        if (!strcmp(cd->backend, "HOPPER_WGMMA") && cd->verdict == NVFP4MOE_VERDICT_SUPPORTED)
            snprintf(cd->reason, sizeof cd->reason, "ranked behind MARLIN for hidden_size=%d < %d: MARLIN "
                     "is faster on such layers on the H200 (bench/results/2026-12-02-h200-backends.md); "
                     "moe_backend='hopper_wgmma' selects it", cfg->hidden_size, HOPPER_MIN_HIDDEN);
    }
    if (chosen) {
        make_log(r, chosen, list, n);
        return NVFP4MOE_OK;
    }
    return raise_error(r, NVFP4MOE_ERR_UNSUPPORTED, "NotImplementedError",
                 "No NvFp4 MoE backend supports the deployment configuration.");
}

// ---- rendering ----

static const char *verdict_label(nvfp4moe_verdict v) {
    switch (v) {
    case NVFP4MOE_VERDICT_CHOSEN:      return "chosen";
    case NVFP4MOE_VERDICT_SUPPORTED:   return "supported, lower priority";
    case NVFP4MOE_VERDICT_REJECTED:    return "rejected";
    case NVFP4MOE_VERDICT_NOT_IN_LIST: return "not in the list";
    }
    return "?";
}

size_t nvfp4moe_report_render(const nvfp4moe_report *r, char *buf, size_t len) {
    sbuf b = {buf, buf ? len : 0, 0};
    if (b.len) buf[0] = '\0';
    if (!r) return 0;
    sb_printf(&b, "device:   %s\n", r->device[0] ? r->device : "?");
    sb_printf(&b, "request:  moe_backend=%s\n", r->requested[0] ? r->requested : "?");
    if (r->backend[0]) {
        sb_printf(&b, "backend:  %s\n", r->backend);
        sb_printf(&b, "kernel:   %s\n", r->kernel);
    } else {
        sb_printf(&b, "backend:  none\n");
    }
    if (r->log[0]) sb_printf(&b, "vllm log: %s\n", r->log);
    if (r->error_kind[0]) sb_printf(&b, "error:    %s: %s\n", r->error_kind, r->error);
    if (r->n_candidates > 0) {
        sb_printf(&b, "\ncandidates, in priority order:\n");
        sb_printf(&b, "  %-27s %-40s %-26s %s\n", "BACKEND", "KERNEL", "VERDICT", "REASON");
        for (int i = 0; i < r->n_candidates; i++) {
            const nvfp4moe_candidate *cd = &r->candidates[i];
            sb_printf(&b, "  %-27s %-40s %-26s %s\n", cd->backend, cd->kernel, verdict_label(cd->verdict),
                      cd->reason[0] ? cd->reason : "-");
        }
    }
    return b.need;
}
