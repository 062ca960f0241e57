/*
 * table.c - the backend table: one row per NvFp4MoeBackend value (vLLM's, then ours), each with
 * the experts classes it tries and their trait predicates, its rank rule, and its implementation
 * in this build. The kernel traits are C ports of what vLLM's experts classes answer to
 * FusedMoEExperts.is_supported_config, in the words vLLM uses for its reasons (words.c). The
 * selection that reads the table is select.c; how to add a row: docs/architecture.md.
 */
#include "oracle/table.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static bool family(const nvfp4moe_device *d, int fam) { return d->is_cuda && d->sm / 10 == fam / 10; }

static bool all2all_is(const oracle_ctx *c, const char *name) {
    return c->use_all2all && !strcmp(c->cfg->parallel.all2all, name);
}

/* FusedMoEParallelConfig.use_fi_nvl_two_sided_kernels (fused_moe/config.py): the all2all kernels
 * with backend "flashinfer_all2allv" or "flashinfer_nvlink_two_sided"; and the one-sided one. */
static bool fi_nvl_two_sided(const oracle_ctx *c) {
    return all2all_is(c, "flashinfer_all2allv") || all2all_is(c, "flashinfer_nvlink_two_sided");
}
static bool fi_nvl_one_sided(const oracle_ctx *c) { return all2all_is(c, "flashinfer_nvlink_one_sided"); }

// ---- trait bits ----

#define ACT(x) (1u << NVFP4MOE_ACT_##x)
#define SCH(x) (1u << NVFP4MOE_SCHEME_##x)
#define ROUTE(x) (1u << NVFP4MOE_ROUTING_##x)
#define DT(x) (1u << NVFP4MOE_DTYPE_##x)

#define ACTS_ALL ((1u << NVFP4MOE_ACT_COUNT) - 1)
#define SCHEMES_ALL ((1u << NVFP4MOE_SCHEME_COUNT) - 1)
/* vLLM's apply_moe_activation_supported, _APPLY_MOE_ACTIVATIONS in fused_moe/activation.py
 * (CutlassExpertsFp4, MarlinExperts, TritonExperts). */
#define ACTS_APPLY_MOE                                                                             \
    (ACT(SILU) | ACT(GELU) | ACT(GELU_TANH) | ACT(SITU) | ACT(SWIGLUOAI) |                         \
     ACT(SWIGLUOAI_UNINTERLEAVE) | ACT(SWIGLUSTEP) | ACT(SILU_NO_MUL) | ACT(GELU_NO_MUL) |          \
     ACT(GELU_TANH_NO_MUL) | ACT(RELU2_NO_MUL))
/* The Humming experts' own list (experts/fused_humming_moe.py): the apply list less SiTU and
 * swigluoai_uninterleave. */
#define ACTS_HUMMING                                                                               \
    (ACT(SILU) | ACT(GELU) | ACT(GELU_TANH) | ACT(SWIGLUOAI) | ACT(SWIGLUSTEP) |                   \
     ACT(SILU_NO_MUL) | ACT(GELU_NO_MUL) | ACT(GELU_TANH_NO_MUL) | ACT(RELU2_NO_MUL))


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
/* flashinfer_moe_ep.supports_current_device: compute capability (10, 0) or (10, 3) exactly. */
static bool dev_sm100_sm103(const nvfp4moe_device *d) { return d->is_cuda && (d->sm == 100 || d->sm == 103); }

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
static bool par_not_fi_nvl_two_sided(const oracle_ctx *c) { return !fi_nvl_two_sided(c); }
static bool par_not_fi_nvl(const oracle_ctx *c) { return !fi_nvl_two_sided(c) && !fi_nvl_one_sided(c); }
/* FlashInferMoeEpExperts: the megakernel dispatches itself, so EP and never the batched format. */
static bool par_moe_ep(const oracle_ctx *c) { return c->use_ep && !c->batched; }

// ---- class-specific rules ----

/* FlashInferExperts serves NVFP4 W4A4 only with has_device_capability(100): on Hopper the
 * device check passes (the class also serves FP8/bf16 there) and the quant check says no. */
static bool quant_fi_cutlass(const oracle_ctx *c, char *reason, size_t len) {
    if (c->dev->is_cuda && c->dev->sm >= 100) return true;
    char q[96];
    nvfp4moe_quant_scheme_str(c->scheme, q, sizeof q);
    snprintf(reason, len, "kernel does not support quantization scheme %s", q);
    return false;
}

/* TrtLlmNvFp4ExpertsBase.is_supported_config (experts/trtllm_nvfp4_moe.py), before the base
 * checks: per-token activation scales need the gated kernel. */
static bool pre_trtllm(const oracle_ctx *c, char *reason, size_t len) {
    if (c->scheme == NVFP4MOE_SCHEME_W4A4_PER_TOKEN && !nvfp4moe_activation_is_gated(c->cfg->activation)) {
        snprintf(reason, len, "kernel does not support per-token NVFP4 activation scaling for non-gated MoE");
        return false;
    }
    return true;
}

/* B12xExperts.is_supported_config (fused_moe/b12x.py), before the base checks. vLLM's W4A8 covers
 * every activation key: W4A4 too. (apply_router_weight_on_input with W4A4 is refused later, at
 * weight loading, so the oracle still picks B12X: select.c notes it.) */
static bool pre_b12x(const oracle_ctx *c, char *reason, size_t len) {
    const nvfp4moe_config *cfg = c->cfg;
    if (cfg->has_bias) {
        snprintf(reason, len, "kernel does not support expert biases");
        return false;
    }
    if (cfg->in_dtype != NVFP4MOE_DTYPE_BF16 && cfg->in_dtype != NVFP4MOE_DTYPE_FP16) {
        snprintf(reason, len, "kernel does not support %s input/output dtype", nvfp4moe_torch_dtype_name(cfg->in_dtype));
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
    return true;
}

/* Nvfp4QuantizationEmulationTritonExperts.is_supported_config (experts/nvfp4_emulation_moe.py):
 * LoRA, then bias, before TritonExperts' checks. */
static bool pre_emulation(const oracle_ctx *c, char *reason, size_t len) {
    if (c->cfg->lora) {
        snprintf(reason, len, "kernel does not support LoRA");
        return false;
    }
    if (c->cfg->has_bias) {
        snprintf(reason, len, "kernel does not support bias");
        return false;
    }
    return true;
}

/* TritonExperts.is_supported_config (experts/triton_moe.py), after the base checks on a CUDA GPU:
 * moe_align_block_size takes fewer than 1024 experts padded to a multiple of 32. */
static bool extra_triton(const oracle_ctx *c, char *reason, size_t len) {
    int padded = (c->cfg->num_experts + 31) / 32 * 32;
    if (!c->dev->is_cuda || padded < 1024) return true;
    snprintf(reason, len, "kernel's moe_align_block_size requires fewer than 1024 padded experts");
    return false;
}

/* FlashInferMoeEpExperts.is_supported_config (experts/flashinfer_moe_ep.py) after the base checks:
 * flashinfer_moe_ep_unsupported_reasons (fused_moe/flashinfer_moe_ep.py) for the CuTeDSL kernel,
 * every reason that applies, joined. NVFP4 weights are one of its formats; EPLB only stops the
 * DeepGEMM kernel; weight transfer, dual batch overlap and skip_final_all_reduce are never set
 * here. */
static bool extra_moe_ep(const oracle_ctx *c, char *reason, size_t len) {
    const nvfp4moe_config *cfg = c->cfg;
    const char *r[4];
    char dtype[48];
    int n = 0;
    if (c->scheme == NVFP4MOE_SCHEME_W4A16) r[n++] = "A16 activations with NVFP4 weights";
    if (cfg->in_dtype != NVFP4MOE_DTYPE_BF16) {
        snprintf(dtype, sizeof dtype, "activation dtype %s", nvfp4moe_torch_dtype_name(cfg->in_dtype));
        r[n++] = dtype;
    }
    if (cfg->has_bias) r[n++] = "expert bias";
    if (!isnan(cfg->swiglu_alpha) || !isnan(cfg->swiglu_beta)) r[n++] = "custom SwiGLU alpha or beta";
    if (n == 0) return true;
    sbuf b = {reason, len, 0};
    nvfp4moe_sb_printf(&b, "kernel does not support ");
    for (int i = 0; i < n; i++) nvfp4moe_sb_printf(&b, "%s%s", i ? ", " : "", r[i]);
    return false;
}

/* HummingExpertsBase.is_supported_config (experts/fused_humming_moe.py): once the base checks
 * pass, the Standard format keeps the class whose GEMM type is VLLM_HUMMING_MOE_GEMM_TYPE,
 * "indexed" by default (we do not read that variable). */
static bool extra_humming_grouped(const oracle_ctx *c, char *reason, size_t len) {
    (void)c;
    snprintf(reason, len, "preferred gemm type mismatched");
    return false;
}

// ---- the kernel classes ----
//
// One definition per vLLM experts class, from the class's own predicates (vLLM snapshots in
// ../shared/reference/vllm_nvfp4_moe.md §2.2). Ours follow at the end.

static const kernel_def k_b12x = {
    .name = "B12xExperts", .pre = pre_b12x, .device = dev_sm12x, .lib_in_device_check = true, .no_act_and_mul = true,
    .activations = ACT(SILU) | ACT(SITU) | ACT(SWIGLUOAI_UNINTERLEAVE) | ACT(RELU2_NO_MUL),
    .schemes = SCH(W4A4) | SCH(W4A8_MXFP8) | SCH(W4A16), .parallel = par_tp_only,
};
/* TRT-LLM activations: SiTU needs a FlashInfer with has_flashinfer_situ_activation(); a what-if
 * install is assumed recent enough. */
#define ACTS_TRTLLM (ACT(SILU) | ACT(RELU2_NO_MUL) | ACT(GELU) | ACT(GELU_TANH) | ACT(SWIGLUOAI_UNINTERLEAVE) | ACT(SITU))
static const kernel_def k_trtllm_mono = {
    .name = "TrtLlmNvFp4ExpertsMonolithic", .pre = pre_trtllm, .device = dev_sm10x, .lib_in_device_check = true,
    .no_act_and_mul = true, .activations = ACTS_TRTLLM, .schemes = SCH(W4A4) | SCH(W4A4_PER_TOKEN),
    .parallel = par_trtllm_mono, .monolithic = true,
    .routings = ROUTE(DEEPSEEK_V3) | ROUTE(RENORMALIZE) | ROUTE(RENORMALIZE_NAIVE) | ROUTE(LLAMA4) |
                ROUTE(SIGMOID_RENORM) | ROUTE(SIGMOID) | ROUTE(MINIMAX2) | ROUTE(SIMULATED),
    .logits_dtypes = DT(BF16) | DT(F32),
};
static const kernel_def k_trtllm_modular = {
    .name = "TrtLlmNvFp4ExpertsModular", .pre = pre_trtllm, .device = dev_sm10x, .lib_in_device_check = true,
    .no_act_and_mul = true, .activations = ACTS_TRTLLM, .schemes = SCH(W4A4) | SCH(W4A4_PER_TOKEN),
};
static const kernel_def k_fi_cutlass = {
    .name = "FlashInferExperts", .device = dev_fi_cutlass, .lib_in_device_check = true, .no_act_and_mul = true,
    .activations = ACT(SILU) | ACT(RELU2_NO_MUL) | ACT(SWIGLUOAI), .schemes = SCH(W4A4),
    .quant_rule = quant_fi_cutlass,
};
/* The newest CuTeDSL class (the seed's generation): SILU, RELU2_NO_MUL, SWIGLUOAI; per-token. */
static const kernel_def k_fi_cutedsl = {
    .name = "FlashInferCuteDSLExperts", .device = dev_sm10x, .lib_in_device_check = true, .no_act_and_mul = true,
    .activations = ACT(SILU) | ACT(RELU2_NO_MUL) | ACT(SWIGLUOAI), .schemes = SCH(W4A4) | SCH(W4A4_PER_TOKEN),
};
static const kernel_def k_fi_cutedsl_batched = {
    .name = "FlashInferCuteDSLBatchedExperts", .device = dev_sm10x, .lib_in_device_check = true, .no_act_and_mul = false,
    .activations = ACT(SILU), .schemes = SCH(W4A4), .batched = true,
};
/* FlashInfer's MoE-EP megakernel (experts/flashinfer_moe_ep.py, FlashInferMoeEpExperts): exactly
 * sm_100 / sm_103; gated SiLU only; any scheme with NVFP4 weights passes the quant check (the
 * weight key kNvfp4Static, or kMxfp4Static), its own reasons come after the base checks. Its
 * device check imports no library (FlashInfer is needed only when the kernel is built). */
static const kernel_def k_fi_moe_ep_cutedsl = {
    .name = "FlashInferMoeEpExperts", .device = dev_sm100_sm103, .no_act_and_mul = false,
    .activations = ACT(SILU), .schemes = SCHEMES_ALL, .parallel = par_moe_ep, .extra = extra_moe_ep,
};
static const kernel_def k_fi_b12x = {
    .name = "FlashInferB12xExperts", .device = dev_sm12x, .lib_in_device_check = true, .no_act_and_mul = false,
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
    .activations = ACTS_HUMMING, .schemes = SCHEMES_ALL, .parallel = par_not_fi_nvl, .batched = true,
};
static const kernel_def k_humming_grouped = {
    .name = "HummingGroupedExperts", .device = dev_sm75, .no_act_and_mul = true,
    .activations = ACTS_HUMMING, .schemes = SCHEMES_ALL, .parallel = par_not_fi_nvl,
    .extra = extra_humming_grouped,
};
static const kernel_def k_humming_indexed = {
    .name = "HummingIndexedExperts", .device = dev_sm75, .no_act_and_mul = true,
    .activations = ACTS_HUMMING, .schemes = SCHEMES_ALL, .parallel = par_not_fi_nvl,
};
/* TritonExperts' traits (experts/triton_moe.py): every activation apply_moe_activation supports. */
static const kernel_def k_emulation = {
    .name = "Nvfp4QuantizationEmulationTritonExperts", .pre = pre_emulation, .device = dev_cuda,
    .no_act_and_mul = true, .activations = ACTS_APPLY_MOE, .schemes = SCH(W4A4), .parallel = par_not_fi_nvl,
    .batch_invariant = true, .extra = extra_triton,
};
/* Ours: the Hopper wgmma W4A16 kernel. Built for sm_90a only (wgmma and setmaxnreg exist there
 * alone); weights decoded from NVFP4 to bf16/fp16 in registers, so any quant scheme runs as W4A16
 * as on MARLIN; every activation of the GPU pipeline, the clamp included; bf16/fp16 activations.
 * Standard format only (no batched class yet); under EP it runs the local experts. Split-K sums
 * with atomics, in an order that varies from run to run: not batch invariant. No LoRA. */
static bool extra_16bit_io(const oracle_ctx *c, char *reason, size_t len) {
    if (c->cfg->in_dtype == NVFP4MOE_DTYPE_BF16 || c->cfg->in_dtype == NVFP4MOE_DTYPE_FP16) return true;
    snprintf(reason, len, "kernel does not support %s input/output dtype", nvfp4moe_torch_dtype_name(c->cfg->in_dtype));
    return false;
}
static const kernel_def k_hopper_wgmma = {
    .name = "HopperWgmmaExperts", .sm_min = NVFP4MOE_SM_HOPPER_KERNELS, .sm_max = NVFP4MOE_SM_HOPPER_KERNELS,
    .no_act_and_mul = true,
    .activations = ACTS_ALL, .schemes = SCHEMES_ALL, .parallel = par_not_fi_nvl_two_sided,
    .extra = extra_16bit_io,
};
/* Ours: the SIMD host backend, the same function as the reference (W4A4 in exact integer sums, the
 * other schemes in fixed-order float32 sums), so batch invariant. Otherwise as CPU_REFERENCE. */
static const kernel_def k_cpu_fast = {
    .name = "CpuFastExperts", .device = dev_any, .no_act_and_mul = true, .activations = ACTS_ALL,
    .schemes = SCHEMES_ALL, .parallel = par_no_ep, .batch_invariant = true,
};
/* Ours: the float64 host reference (src/reference/moe_ref.c). Any device, since it runs on the
 * host; every activation and scheme; deterministic (batch invariant). It computes the whole layer
 * on one rank, so no expert parallelism and no batched (all2all-dispatched) input; no LoRA. */
static const kernel_def k_cpu_reference = {
    .name = "CpuReferenceExperts", .device = dev_any, .no_act_and_mul = true, .activations = ACTS_ALL,
    .schemes = SCHEMES_ALL, .parallel = par_no_ep, .batch_invariant = true,
};

// ---- rank rules ----

/* prioritize_humming (vLLM): Humming's WGMMA beats Marlin on Hopper, so on sm_90 (only) HUMMING
 * is popped and re-inserted just before MARLIN; every other entry keeps its order. */
static rank_move humming_on_hopper(const oracle_ctx *c, char *why, size_t len) {
    return c->dev->is_cuda && c->dev->sm == 90 ? RANK_BEFORE : RANK_KEEP;
}
static const rank_rule k_prioritize_humming = {"MARLIN", humming_on_hopper};

/* HOPPER_WGMMA ahead of MARLIN (no rank rule): in the committed H200 table of whole-layer times,
 * bench/results/2026-12-04-h200-prefill.md (raw: 2026-12-04-h200-prefill-raw/bench-auto.md), it is
 * faster on every preset at every batch size measured (MARLIN us / HOPPER_WGMMA us, M = 1 .. 4096):
 * 1.33-1.89x on deepseek-v3, 1.36-1.69x on kimi-k2, 1.23-2.02x on qwen3-235b-a22b, 1.04-1.71x on
 * qwen3-30b-a3b, 1.22-2.08x on mixtral-8x7b, 1.25-1.84x on gpt-oss-120b. */

// ---- the rows ----
//
// The row order is map_nvfp4_backend's key order (it is the order of the unknown-name message).
// auto_rank sorts the auto list: vLLM's run 10..80; ours are placed among them (and never change a
// vllm_only decision, since they are hidden then). A row ranked ahead of a vLLM backend says why.

/* A CUDA implementation of ours and the compute capabilities its kernels run on (its impl's
 * sm_min, sm_max; test_oracle checks they agree): a CPU-only build plans with the range. */
#ifdef NVFP4MOE_HAVE_CUDA
#define CUDA_IMPL(x, smin, smax) .impl = &(x), .planned_sm_min = (smin), .planned_sm_max = (smax)
#else
#define CUDA_IMPL(x, smin, smax) .not_built = "CPU-only build", .planned_sm_min = (smin), .planned_sm_max = (smax)
#endif

const backend_def nvfp4moe_backend_rows[] = {
    {.name = "B12X", .moe_backend = "b12x", .clamp = true, .lib = NVFP4MOE_LIB_B12X, .kernels = {&k_b12x},
     .a16_when_forced = true},
    {.name = "VLLM_CUTLASS", .moe_backend = "cutlass", .auto_rank = 50, .clamp = true,
     .lib = NVFP4MOE_LIB_VLLM_CUTLASS, .kernels = {&k_vllm_cutlass}},
    /* "prefer Monolithic > Modular" */
    {.name = "FLASHINFER_TRTLLM", .moe_backend = "flashinfer_trtllm", .auto_rank = 10, .clamp = true,
     .lib = NVFP4MOE_LIB_FLASHINFER, .kernels = {&k_trtllm_mono, &k_trtllm_modular}},
    {.name = "FLASHINFER_CUTLASS", .moe_backend = "flashinfer_cutlass", .auto_rank = 40, .clamp = true,
     .lib = NVFP4MOE_LIB_FLASHINFER, .kernels = {&k_fi_cutlass}},
    {.name = "FLASHINFER_CUTEDSL", .moe_backend = "flashinfer_cutedsl", .auto_rank = 20, .clamp = true,
     .lib = NVFP4MOE_LIB_FLASHINFER, .kernels = {&k_fi_cutedsl}, .batched_as = "FLASHINFER_CUTEDSL_BATCHED"},
    /* No name of its own: explicit flashinfer_cutedsl becomes it under the batched format. */
    {.name = "FLASHINFER_CUTEDSL_BATCHED", .auto_rank = 30, .lib = NVFP4MOE_LIB_FLASHINFER,
     .kernels = {&k_fi_cutedsl_batched}},
    {.name = "FLASHINFER_MOE_EP_CUTEDSL", .moe_backend = "flashinfer_moe_ep_cutedsl", .clamp = true,
     .lib = NVFP4MOE_LIB_FLASHINFER, .kernels = {&k_fi_moe_ep_cutedsl}},
    /* Excluded from auto until the upstream CUTLASS SM121 MMA op guard is resolved. */
    {.name = "FLASHINFER_B12X", .moe_backend = "flashinfer_b12x", .lib = NVFP4MOE_LIB_FLASHINFER,
     .kernels = {&k_fi_b12x}},
    /* Ours: W4A16 on Hopper's wgmma (src/backends/cuda.c, kernels/hopper_gemm.cu,
     * kernels/hopper_decode.cu). Rank 55: ahead of MARLIN, and of HUMMING, which
     * prioritize_humming puts just before MARLIN on sm_90 (the table above). */
    {.name = "HOPPER_WGMMA", .moe_backend = "hopper_wgmma", .auto_rank = 55, .clamp = true, .ours = true,
     .kernels = {&k_hopper_wgmma}, CUDA_IMPL(nvfp4moe_impl_hopper_wgmma, NVFP4MOE_SM_HOPPER_KERNELS, NVFP4MOE_SM_HOPPER_KERNELS)},
    {.name = "MARLIN", .moe_backend = "marlin", .auto_rank = 60, .clamp = true, .kernels = {&k_marlin},
     CUDA_IMPL(nvfp4moe_impl_marlin, NVFP4MOE_SM_AMPERE_KERNELS, 0)},
    /* Standard format: the indexed class by default; batched under DeepEP-LL / NIXL EP. */
    {.name = "HUMMING", .moe_backend = "humming", .auto_rank = 70, .clamp = true, .lib = NVFP4MOE_LIB_HUMMING,
     .kernels = {&k_humming_batched, &k_humming_grouped, &k_humming_indexed}, .rank = &k_prioritize_humming},
    {.name = "EMULATION", .moe_backend = "emulation", .auto_rank = 80, .clamp = true, .kernels = {&k_emulation},
     CUDA_IMPL(nvfp4moe_impl_emulation, NVFP4MOE_SM_AMPERE_KERNELS, 0)},
    /* Ours: the SIMD, multi-threaded host backend (src/backends/cpu_fast.c), ahead of the
     * reference because it is faster. */
    {.name = "CPU_FAST", .moe_backend = "cpu_fast", .auto_rank = 900, .clamp = true, .ours = true,
     .kernels = {&k_cpu_fast}, .impl = &nvfp4moe_impl_cpu_fast},
    /* Ours, always last: something always runs. Applies the clamp as vLLM's reference does. */
    {.name = "CPU_REFERENCE", .moe_backend = "cpu_reference", .auto_rank = 1000, .clamp = true, .ours = true,
     .kernels = {&k_cpu_reference}, .impl = &nvfp4moe_impl_cpu_reference},
};

const int nvfp4moe_backend_row_count = (int)(sizeof nvfp4moe_backend_rows / sizeof nvfp4moe_backend_rows[0]);
_Static_assert(sizeof nvfp4moe_backend_rows / sizeof nvfp4moe_backend_rows[0] <= MAX_BACKENDS, "MAX_BACKENDS");

const backend_def *nvfp4moe_backend_row(const char *name) {
    for (int i = 0; i < nvfp4moe_backend_row_count; i++)
        if (!strcmp(nvfp4moe_backend_rows[i].name, name)) return &nvfp4moe_backend_rows[i];
    return NULL;
}

const nvfp4moe_backend_impl *nvfp4moe_backend_impl_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < nvfp4moe_backend_row_count; i++)
        if (nvfp4moe_name_eq(nvfp4moe_backend_rows[i].name, name)) return nvfp4moe_backend_rows[i].impl;
    return NULL;
}

int nvfp4moe_backend_count(void) { return nvfp4moe_backend_row_count; }

const char *nvfp4moe_backend_name(int i) {
    return i >= 0 && i < nvfp4moe_backend_row_count ? nvfp4moe_backend_rows[i].name : NULL;
}

// ---- libraries ----

const lib_def nvfp4moe_oracle_libs[] = {
    {"flashinfer", "FlashInfer", NVFP4MOE_LIB_FLASHINFER},
    {"b12x", "b12x", NVFP4MOE_LIB_B12X},
    {"humming", "humming", NVFP4MOE_LIB_HUMMING},
    {"cutlass", "vLLM's CUTLASS MoE library (_C ops)", NVFP4MOE_LIB_VLLM_CUTLASS},
};

const int nvfp4moe_oracle_lib_count = (int)(sizeof nvfp4moe_oracle_libs / sizeof nvfp4moe_oracle_libs[0]);
