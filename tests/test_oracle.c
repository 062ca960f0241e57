/*
 * test_oracle.c - the oracle against vLLM's decisions and exact messages (select_nvfp4_moe_backend
 * and the kernel classes' is_supported_config), the device names, the report's text, and the
 * `nvfp4moe select` command's exit codes and JSON (the binary from $NVFP4MOE_CLI).
 *
 * Every expected decision and text below was written by reading vLLM's source at the revision
 * nvfp4moe_vllm_revision() names, never from our output. The files, under
 * vllm-project/vllm: vllm/model_executor/layers/
 *   fused_moe/oracle/nvfp4.py                 the seed: lists, clamp set, explicit path, messages
 *   fused_moe/modular_kernel.py               FusedMoEExperts.is_supported_config: order, reasons
 *   fused_moe/config.py                       FusedMoEParallelConfig, RoutingMethodType
 *   fused_moe/activation.py                   MoEActivation, _APPLY_MOE_ACTIVATIONS
 *   quantization/utils/quant_utils.py         QuantKey / ScaleDesc __str__ and the k* constants
 *   fused_moe/experts/trtllm_nvfp4_moe.py     TrtLlmNvFp4Experts{Monolithic,Modular}
 *   fused_moe/experts/triton_moe.py           TritonExperts (EMULATION's base)
 *   fused_moe/experts/nvfp4_emulation_moe.py  Nvfp4QuantizationEmulationTritonExperts
 *   fused_moe/b12x.py                         B12xExperts
 *   fused_moe/experts/flashinfer_moe_ep.py    FlashInferMoeEpExperts
 *   fused_moe/flashinfer_moe_ep.py            supports_current_device, its unsupported reasons
 *   fused_moe/experts/fused_humming_moe.py    the Humming experts
 *   quantization/utils/humming/priority.py    prioritize_humming
 * and Python's own printing: f"{x}" of an IntEnum is its int, of a plain Enum "Cls.NAME", of a
 * dataclass its repr, of a NamedTuple "GroupShape(row=1, col=16)", of a float repr(float).
 */
#include "harness.h"
#include "oracle/table.h"
#include "nvfp4moe.h"

#include <jansson.h>
#include <sys/wait.h>

// ---- the config mini-language of the table ----

/* Applies "key=value key ..." to cfg: be= (moe_backend), scheme=, act=, route=, logits=, dtype=,
 * limit=, alpha=, experts=, topk=, hidden=, ngroup=, topkgroup=, tp=, ep=, eprank=, dp=, a2a=, and
 * the switches eplb, lora, bias, bi (batch invariant), a16 (force_a16), arwi
 * (apply_router_weight_on_input), requant. */
static int apply_args(nvfp4moe_config *cfg, const char *args) {
    char copy[512], *save = NULL;
    snprintf(copy, sizeof copy, "%s", args ? args : "");
    for (char *tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *v = strchr(tok, '=');
        if (v) *v++ = '\0';
        nvfp4moe_status st = NVFP4MOE_OK;
        if (!strcmp(tok, "be")) snprintf(cfg->moe_backend, sizeof cfg->moe_backend, "%s", v);
        else if (!strcmp(tok, "scheme")) st = nvfp4moe_scheme_parse(v, &cfg->scheme);
        else if (!strcmp(tok, "act")) st = nvfp4moe_activation_parse(v, &cfg->activation);
        else if (!strcmp(tok, "route")) st = nvfp4moe_routing_parse(v, &cfg->routing);
        else if (!strcmp(tok, "logits")) st = nvfp4moe_dtype_parse(v, &cfg->router_logits_dtype);
        else if (!strcmp(tok, "dtype")) {
            st = nvfp4moe_dtype_parse(v, &cfg->in_dtype);
            cfg->out_dtype = cfg->in_dtype;
        } else if (!strcmp(tok, "limit")) {
            cfg->has_swiglu_limit = true;
            cfg->swiglu_limit = strtod(v, NULL);
        } else if (!strcmp(tok, "alpha")) cfg->swiglu_alpha = strtof(v, NULL);
        else if (!strcmp(tok, "experts")) cfg->num_experts = atoi(v);
        else if (!strcmp(tok, "topk")) cfg->top_k = atoi(v);
        else if (!strcmp(tok, "hidden")) cfg->hidden_size = atoi(v);
        else if (!strcmp(tok, "ngroup")) cfg->n_group = atoi(v);
        else if (!strcmp(tok, "topkgroup")) cfg->topk_group = atoi(v);
        else if (!strcmp(tok, "tp")) cfg->parallel.tp_size = atoi(v);
        else if (!strcmp(tok, "ep")) cfg->parallel.ep_size = atoi(v);
        else if (!strcmp(tok, "eprank")) cfg->parallel.ep_rank = atoi(v);
        else if (!strcmp(tok, "dp")) cfg->parallel.dp_size = atoi(v);
        else if (!strcmp(tok, "a2a")) snprintf(cfg->parallel.all2all, sizeof cfg->parallel.all2all, "%s", v);
        else if (!strcmp(tok, "eplb")) cfg->parallel.eplb = true;
        else if (!strcmp(tok, "lora")) cfg->lora = true;
        else if (!strcmp(tok, "bias")) cfg->has_bias = true;
        else if (!strcmp(tok, "bi")) cfg->batch_invariant = true;
        else if (!strcmp(tok, "a16")) cfg->force_a16 = true;
        else if (!strcmp(tok, "arwi")) cfg->apply_router_weight_on_input = true;
        else if (!strcmp(tok, "requant")) cfg->requantization_source = true;
        else return -1;
        if (st != NVFP4MOE_OK) return -1;
    }
    return 0;
}

// ---- the table ----

#define ALL NVFP4MOE_LIB_ALL
#define THIS_BUILD (-1)
#define OK NVFP4MOE_OK
#define UNSUP NVFP4MOE_ERR_UNSUPPORTED
#define NOTFOUND NVFP4MOE_ERR_NOT_FOUND

/* vLLM's AVAILABLE_BACKENDS as the success line prints it (oracle/nvfp4.py): seed order, on sm_90
 * after prioritize_humming (humming/priority.py: HUMMING moved just before MARLIN), with
 * swiglu_limit after the clamp filter. Ours never appear in it: vLLM does not know them. */
#define L_HEAD "['FLASHINFER_TRTLLM', 'FLASHINFER_CUTEDSL', "
#define L_MID "'FLASHINFER_CUTLASS', 'VLLM_CUTLASS', "
#define LIST_V L_HEAD "'FLASHINFER_CUTEDSL_BATCHED', " L_MID "'MARLIN', 'HUMMING', 'EMULATION']"
#define LIST_V90 L_HEAD "'FLASHINFER_CUTEDSL_BATCHED', " L_MID "'HUMMING', 'MARLIN', 'EMULATION']"
#define LIST_CLAMP L_HEAD L_MID "'MARLIN', 'HUMMING', 'EMULATION']"
#define LIST_CLAMP90 L_HEAD L_MID "'HUMMING', 'MARLIN', 'EMULATION']"
#define USING(b, list) "Using '" b "' NvFp4 MoE backend out of potential backends: " list "."
#define UNSUPPORTED_SINCE(b, why) "NvFp4 MoE backend '" b "' does not support the deployment configuration since " why "."
#define NOTHING "No NvFp4 MoE backend supports the deployment configuration."
#define KEYS_V "'b12x', 'cutlass', 'flashinfer_trtllm', 'flashinfer_cutlass', 'flashinfer_cutedsl', " \
               "'flashinfer_moe_ep_cutedsl', 'flashinfer_b12x', 'marlin', 'humming', 'emulation'"
#define CLAMP_MSG(lim, name) "Model sets swiglu_limit=" lim ", but the explicitly requested moe_backend='" name \
    "' does not apply the SwiGLU clamp. Use 'flashinfer_trtllm', 'flashinfer_cutlass', 'flashinfer_cutedsl', " \
    "'flashinfer_moe_ep_cutedsl', 'cutlass', 'b12x', 'marlin', or 'humming' instead."
/* is_supported_config's reasons (modular_kernel.py): "kernel does not support " + ... */
#define K "kernel does not support "
/* ... f"current device {current_platform.device_name}": "cuda" on every CUDA GPU, "cpu" on the CPU
 * platform; the sm is ours, in the detail. */
#define DEV_CUDA K "current device cuda"
#define DEV_CPU K "current device cpu"
/* ... f"parallel config {moe_parallel_config}": the FusedMoEParallelConfig dataclass repr, all 12
 * fields; FusedMoEParallelConfig.make gives tp_size 1 and ep_size = the flattened size under EP;
 * ParallelConfig.all2all_backend defaults to "allgather_reducescatter". */
#define PAR(tp, dp, ep, dprank, eprank, use_ep, a2a, eplb) K "parallel config FusedMoEParallelConfig(tp_size=" #tp \
    ", pcp_size=1, dp_size=" #dp ", ep_size=" #ep ", tp_rank=0, pcp_rank=0, dp_rank=" #dprank ", ep_rank=" #eprank \
    ", sp_size=1, use_ep=" use_ep ", all2all_backend='" a2a "', enable_eplb=" eplb ")"
#define AGRS "allgather_reducescatter"
/* ... f"quantization scheme {weight_key}x{activation_key}" with QuantKey.__str__ (quant_utils.py):
 * FP4_DTYPE is torch.uint8 ("u8"), the NVFP4 block scale ScaleDesc(FP8_DTYPE, static|dynamic,
 * GroupShape(1, 16)), scale2 kStaticTensorScale ("f32,static,per_tensor") or, per token,
 * kDynamicTokenScale; kMxfp8Dynamic = QuantKey(FP8_DTYPE, ScaleDesc(uint8, dynamic, (1, 32))). */
#define QK_W "QuantKey(u8,scale(f8e4m3fn,static,GroupShape(row=1, col=16)),scale2(f32,static,per_tensor),symmetric)"
#define QK_A "QuantKey(u8,scale(f8e4m3fn,dynamic,GroupShape(row=1, col=16)),scale2(f32,static,per_tensor),symmetric)"
#define QK_A_TOKEN "QuantKey(u8,scale(f8e4m3fn,dynamic,GroupShape(row=1, col=16)),scale2(f32,dynamic,per_token),symmetric)"
#define QK_A_MXFP8 "QuantKey(f8e4m3fn,scale(u8,dynamic,GroupShape(row=1, col=32)),symmetric)"
#define Q_W4A16 K "quantization scheme " QK_W "xNone"
#define Q_W4A4 K "quantization scheme " QK_W "x" QK_A
/* ... f"{activation_format.value} activation format": FusedMoEActivationFormat's tuple values. */
#define FMT_BATCHED K "('batched_experts',) activation format"
#define FMT_STANDARD K "('standard',) activation format"
/* ... f"{moe_config.activation} activation": MoEActivation is a plain Enum. */
#define ACT_REASON(x) K "MoEActivation." x " activation"
#define DEEPEP_LL "ep=2 dp=2 a2a=deepep_low_latency"
/* An exact expected reason (otherwise a substring). */
#define EXACT(x) "=" x

typedef struct oracle_case {
    const char *device;     /* what-if device */
    const char *args;       /* config changes from the default layer (apply_args) */
    long long inst;         /* THIS_BUILD, or an installed mask (what-if) */
    bool vllm_only;
    nvfp4moe_status st;
    const char *backend;    /* expected choice (NULL: none) */
    const char *kernel;
    const char *msg;        /* exact: the log line when OK ("" none), the exception's message otherwise (NULL: skip) */
    const char *cand;       /* "BACKEND/KernelClass" whose reason must contain cand_reason (NULL: skip) */
    const char *cand_reason;/* "": the kernel must be supported, lower priority; EXACT(x): equal to x */
    const char *cand_detail;/* (optional) a substring of that candidate's detail */
    const char *note;       /* (optional) a substring of the report's detail ("" : it must be empty) */
} oracle_case;

static const oracle_case k_cases[] = {
    // -- sm_10x: the TRT-LLM kernels first --
    {"sm_100", "", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic",
     USING("FLASHINFER_TRTLLM", LIST_V), "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsModular", "", NULL, ""},
    {"b300", "", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic", USING("FLASHINFER_TRTLLM", LIST_V),
     NULL, NULL, NULL, NULL},
    {"sm_103", "scheme=w4a4-per-token", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic", NULL, NULL, NULL, NULL, NULL},
    // EP/EPLB and all2all: the monolithic kernel steps aside for the modular one
    {"b200", "ep=4 eplb", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular", NULL,
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(PAR(1, 1, 4, 0, 0, "True", AGRS, "True")), NULL, NULL},
    {"sm_100", "ep=2 dp=2 a2a=deepep_high_throughput", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular",
     NULL, "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic",
     EXACT(PAR(1, 2, 2, 0, 0, "True", "deepep_high_throughput", "False")), NULL, NULL},
    {"sm_100", "ep=4", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic", NULL, NULL, NULL, NULL, NULL},
    // routing methods and router-logits dtypes of the monolithic kernel: RoutingMethodType is an
    // IntEnum, so f"routing method {m, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL}" prints its value (Default = 0)
    {"sm_100", "route=softmax", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular", NULL,
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(K "routing method 0"), "RoutingMethodType.Default", NULL},
    {"sm_100", "logits=fp16", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular", NULL,
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(K "router logits dtype torch.float16"), NULL, NULL},
    {"sm_100", "route=deepseek_v3 ngroup=8 topkgroup=4 logits=bf16", ALL, true, OK, "FLASHINFER_TRTLLM",
     "TrtLlmNvFp4ExpertsMonolithic", NULL, NULL, NULL, NULL, NULL},
    {"sm_100", "route=llama4 topk=1 arwi", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic", NULL, NULL, NULL, NULL, NULL},
    {"sm_100", "route=minimax2", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic", NULL, NULL, NULL, NULL, NULL},
    // the batched activation format (DeepEP low-latency, NIXL EP); f"{format.value, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL} activation format"
    {"sm_100", DEEPEP_LL, ALL, true, OK, "FLASHINFER_CUTEDSL_BATCHED", "FlashInferCuteDSLBatchedExperts",
     USING("FLASHINFER_CUTEDSL_BATCHED", LIST_V), "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsModular", EXACT(FMT_BATCHED), NULL, NULL},
    {"sm_100", "ep=2 dp=2 a2a=nixl_ep", ALL, true, OK, "FLASHINFER_CUTEDSL_BATCHED", "FlashInferCuteDSLBatchedExperts",
     NULL, "FLASHINFER_CUTEDSL/FlashInferCuteDSLExperts", EXACT(FMT_BATCHED), NULL, NULL},
    {"sm_100", DEEPEP_LL " act=relu2_no_mul", ALL, true, OK, "HUMMING", "BatchedHummingGroupedExperts", NULL,
     "FLASHINFER_CUTEDSL_BATCHED/FlashInferCuteDSLBatchedExperts", EXACT(K "no act_and_mul MLP layer"), NULL, NULL},
    {"sm_100", "ep=2 dp=1 a2a=deepep_low_latency", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic",
     NULL, NULL, NULL, NULL, NULL}, /* no all2all kernels without dp > 1: Standard format */
    // quant keys and activations
    {"sm_100", "scheme=w4a4-per-token act=relu2_no_mul", ALL, true, OK, "FLASHINFER_CUTEDSL", "FlashInferCuteDSLExperts",
     NULL, "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsModular",
     EXACT("kernel does not support per-token NVFP4 activation scaling for non-gated MoE"), NULL, NULL},
    {"sm_100", "scheme=w4a16", ALL, true, OK, "MARLIN", "MarlinExperts", USING("MARLIN", LIST_V),
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(Q_W4A16), "scheme w4a16", NULL},
    {"sm_100", "act=silu_no_mul", ALL, true, OK, "VLLM_CUTLASS", "CutlassExpertsFp4", NULL,
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(ACT_REASON("SILU_NO_MUL")), NULL, NULL},
    {"sm_100", "act=swigluoai", ALL, true, OK, "FLASHINFER_CUTEDSL", "FlashInferCuteDSLExperts", NULL,
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(ACT_REASON("SWIGLUOAI")), NULL, NULL},
    /* relu2 (MoEActivation.RELU2) is in no NVFP4 kernel's list: only our CPU backends run it, and
     * vLLM logs nothing for ours */
    {"sm_100", "act=relu2", ALL, false, OK, "CPU_FAST", "CpuFastExperts", "",
     "MARLIN/MarlinExperts", EXACT(ACT_REASON("RELU2")), NULL, "vLLM itself would raise NotImplementedError"},
    {"sm_100", "bi", ALL, true, OK, "VLLM_CUTLASS", "CutlassExpertsFp4", NULL,
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(K "batch invariance"), NULL, NULL},
    {"sm_100", "lora", ALL, true, OK, "MARLIN", "MarlinExperts", NULL,
     "VLLM_CUTLASS/CutlassExpertsFp4", EXACT(K "LoRA"), NULL, NULL},
    // -- sm_90: Humming just before Marlin (prioritize_humming), on sm_90 only --
    {"h200", "", ALL, true, OK, "HUMMING", "HummingIndexedExperts", USING("HUMMING", LIST_V90),
     "FLASHINFER_CUTLASS/FlashInferExperts", EXACT(Q_W4A4), "scheme w4a4", NULL},
    {"sm_90", "", NVFP4MOE_LIB_FLASHINFER, true, OK, "MARLIN", "MarlinExperts", USING("MARLIN", LIST_V90),
     "HUMMING/HummingIndexedExperts", EXACT("humming is not available in this build"), "--installed humming", NULL},
    {"sm_90", "bi", ALL, true, OK, "MARLIN", "MarlinExperts", NULL, "HUMMING/HummingIndexedExperts",
     EXACT(K "batch invariance"), NULL, NULL},
    /* the Humming experts' own check once the base ones pass (fused_humming_moe.py) */
    {"sm_100", "be=humming", ALL, true, OK, "HUMMING", "HummingIndexedExperts", NULL, "HUMMING/HummingGroupedExperts",
     EXACT("preferred gemm type mismatched"), NULL, NULL},
    {"sm_75", "", ALL, true, OK, "MARLIN", "MarlinExperts", NULL, "HUMMING/BatchedHummingGroupedExperts",
     EXACT(FMT_STANDARD), NULL, NULL},
    // -- sm_90 with ours: HOPPER_WGMMA ahead of HUMMING and MARLIN on every layer
    //    (bench/results/2026-12-04-h200-prefill.md); hidden under vllm_only. vLLM's log line
    //    never lists ours, and there is none when ours is chosen --
    {"h200", "hidden=7168", ALL, false, OK, "HOPPER_WGMMA", "HopperWgmmaExperts", "",
     "HUMMING/HummingIndexedExperts", "", NULL, "vLLM itself would choose HUMMING (HummingIndexedExperts)"},
    {"h200", "", ALL, false, OK, "HOPPER_WGMMA", "HopperWgmmaExperts", "",
     "HUMMING/HummingIndexedExperts", "", "", "vLLM itself would choose HUMMING (HummingIndexedExperts)"},
    {"h200", "", NVFP4MOE_LIB_FLASHINFER, false, OK, "HOPPER_WGMMA", "HopperWgmmaExperts", "",
     "MARLIN/MarlinExperts", "", "", "vLLM itself would choose MARLIN (MarlinExperts)"},
    {"sm_90", "be=hopper_wgmma", NVFP4MOE_LIB_FLASHINFER, false, OK, "HOPPER_WGMMA", "HopperWgmmaExperts", "", NULL, NULL,
     NULL, "vLLM rejects moe_backend='hopper_wgmma' as unknown"},
    {"sm_90", "act=relu2", NVFP4MOE_LIB_FLASHINFER, false, OK, "HOPPER_WGMMA", "HopperWgmmaExperts", "",
     "MARLIN/MarlinExperts", EXACT(ACT_REASON("RELU2")), NULL, NULL},
    {"sm_90", "hidden=7168 limit=7", ALL, false, OK, "HOPPER_WGMMA", "HopperWgmmaExperts", NULL, NULL, NULL, NULL, NULL},
    {"sm_90", "bi", ALL, false, OK, "MARLIN", "MarlinExperts", NULL, "HOPPER_WGMMA/HopperWgmmaExperts",
     EXACT(K "batch invariance"), NULL, NULL},
    {"sm_90", "lora", ALL, false, OK, "MARLIN", "MarlinExperts", NULL, "HOPPER_WGMMA/HopperWgmmaExperts", EXACT(K "LoRA"), NULL, NULL},
    {"sm_90", DEEPEP_LL, ALL, false, OK, "HUMMING", "BatchedHummingGroupedExperts", NULL,
     "HOPPER_WGMMA/HopperWgmmaExperts", EXACT(FMT_BATCHED), NULL, NULL},
    {"sm_90", "hidden=7168 ep=8 scheme=w4a16", ALL, false, OK, "HOPPER_WGMMA", "HopperWgmmaExperts", NULL, NULL, NULL, NULL, NULL},
    {"sm_90", "be=hopper_wgmma dtype=f32", ALL, false, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("HOPPER_WGMMA", "kernel does not support torch.float32 input/output dtype"), NULL, NULL, NULL, NULL},
    {"sm_100", "be=hopper_wgmma", ALL, false, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("HOPPER_WGMMA", DEV_CUDA),
     "HOPPER_WGMMA/HopperWgmmaExperts", EXACT(DEV_CUDA), "device sm_100", NULL},
    {"a100", "be=hopper_wgmma", ALL, false, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("HOPPER_WGMMA", DEV_CUDA),
     "HOPPER_WGMMA/HopperWgmmaExperts", EXACT(DEV_CUDA), "device sm_80 (a100)", NULL},
    {"sm_90", "be=hopper_wgmma", ALL, true, NOTFOUND, NULL, NULL,
     "moe_backend='hopper_wgmma' is not supported for NvFP4 MoE. Expected one of [" KEYS_V "].", NULL, NULL, NULL, NULL},
    {"l40s", "", ALL, true, OK, "MARLIN", "MarlinExperts", USING("MARLIN", LIST_V),
     "FLASHINFER_CUTLASS/FlashInferExperts", EXACT(DEV_CUDA), "device sm_89 (l40s)", NULL},
    {"a100", "scheme=w4a16", ALL, true, OK, "MARLIN", "MarlinExperts", USING("MARLIN", LIST_V), NULL, NULL, NULL, NULL},
    {"sm_70", "", ALL, true, OK, "EMULATION", "Nvfp4QuantizationEmulationTritonExperts", USING("EMULATION", LIST_V),
     "MARLIN/MarlinExperts", EXACT(DEV_CUDA), "device sm_70", NULL},
    // -- sm_110 and sm_12x --
    {"sm_110", "", ALL, true, OK, "VLLM_CUTLASS", "CutlassExpertsFp4", NULL, "FLASHINFER_CUTLASS/FlashInferExperts",
     EXACT(DEV_CUDA), "device sm_110", NULL},
    {"rtx-pro-6000", "", ALL, true, OK, "FLASHINFER_CUTLASS", "FlashInferExperts", USING("FLASHINFER_CUTLASS", LIST_V),
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(DEV_CUDA), "device sm_120 (rtx-pro-6000)", NULL},
    {"dgx-spark", "", ALL, true, OK, "FLASHINFER_CUTLASS", "FlashInferExperts", NULL, "FLASHINFER_B12X/FlashInferB12xExperts",
     "explicit-only, not in the auto list (request it with moe_backend='flashinfer_b12x'); would be supported", NULL, NULL},
    /* FlashInfer missing: vLLM's FlashInfer kernels import it in _supports_current_device, so the
     * reason is the device one; the detail names the library */
    {"sm_120", "", NVFP4MOE_LIB_VLLM_CUTLASS, true, OK, "VLLM_CUTLASS", "CutlassExpertsFp4", NULL,
     "FLASHINFER_CUTLASS/FlashInferExperts", EXACT(DEV_CUDA), "FlashInfer is not available in this build", NULL},
    {"sm_120", "ep=2", NVFP4MOE_LIB_VLLM_CUTLASS, true, OK, "MARLIN", "MarlinExperts", NULL,
     "VLLM_CUTLASS/CutlassExpertsFp4", EXACT(PAR(1, 1, 2, 0, 0, "True", AGRS, "False")), NULL, NULL},
    {"sm_121", "", 0, true, OK, "MARLIN", "MarlinExperts", NULL,
     "VLLM_CUTLASS/CutlassExpertsFp4", EXACT("vLLM's CUTLASS MoE library (_C ops) is not available in this build"), NULL, NULL},
    // -- the CPU: nothing of vLLM's; our fast backend, then the reference --
    {"cpu", "", ALL, true, UNSUP, NULL, NULL, NOTHING, "EMULATION/Nvfp4QuantizationEmulationTritonExperts", EXACT(DEV_CPU), NULL, NULL},
    {"cpu", "", THIS_BUILD, false, OK, "CPU_FAST", "CpuFastExperts", "", NULL, NULL, NULL,
     "vLLM itself would raise NotImplementedError"},
    {"cpu", "lora", ALL, false, UNSUP, NULL, NULL, NOTHING, "CPU_REFERENCE/CpuReferenceExperts", EXACT(K "LoRA"), NULL, NULL},
    {"cpu", "ep=2", ALL, false, UNSUP, NULL, NULL, NOTHING, "CPU_REFERENCE/CpuReferenceExperts",
     EXACT(PAR(1, 1, 2, 0, 0, "True", AGRS, "False")), NULL, NULL},
    {"cpu", "scheme=w4a8-mxfp8 bias bi", ALL, false, OK, "CPU_FAST", "CpuFastExperts", NULL, NULL, NULL, NULL, NULL},
    {"cpu", "be=cpu_fast", ALL, false, OK, "CPU_FAST", "CpuFastExperts", "", NULL, NULL, NULL, NULL},
    {"cpu", "lora be=cpu_fast", ALL, false, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("CPU_FAST", "kernel does not support LoRA"),
     NULL, NULL, NULL, NULL},
    // -- swiglu_limit: the clamp set, auto and explicit --
    {"sm_100", "limit=7", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic",
     USING("FLASHINFER_TRTLLM", LIST_CLAMP), "FLASHINFER_CUTEDSL_BATCHED/FlashInferCuteDSLBatchedExperts",
     "removed from the auto list by swiglu_limit", NULL, NULL},
    {"sm_100", "limit=7 " DEEPEP_LL, ALL, true, OK, "HUMMING", "BatchedHummingGroupedExperts",
     USING("HUMMING", LIST_CLAMP), NULL, NULL, NULL, NULL},
    {"sm_100", "limit=10.5 be=flashinfer_cutedsl " DEEPEP_LL, ALL, true, UNSUP, NULL, NULL,
     CLAMP_MSG("10.5", "flashinfer_cutedsl"), NULL, NULL, NULL, NULL},
    {"sm_90", "limit=7 be=marlin", ALL, true, OK, "MARLIN", "MarlinExperts", USING("MARLIN", LIST_CLAMP90), NULL, NULL, NULL, NULL},
    {"cpu", "limit=7 be=cpu_reference", ALL, false, OK, "CPU_REFERENCE", "CpuReferenceExperts", "", NULL, NULL, NULL, NULL},
    // -- every explicit name --
    {"sm_120", "be=b12x", ALL, true, OK, "B12X", "B12xExperts", USING("B12X", LIST_V), NULL, NULL, NULL, NULL},
    {"sm_120", "be=b12x limit=7", ALL, true, OK, "B12X", "B12xExperts", USING("B12X", LIST_CLAMP), NULL, NULL, NULL, NULL},
    {"sm_100", "be=b12x", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("B12X", DEV_CUDA), NULL, NULL, NULL, NULL},
    {"sm_120", "be=b12x topk=1 arwi a16", ALL, true, OK, "B12X", "B12xExperts", NULL, NULL, NULL, NULL, ""},
    {"sm_120", "be=b12x scheme=w4a8-mxfp8", ALL, true, OK, "B12X", "B12xExperts", NULL, NULL, NULL, NULL, NULL},
    /* b12x missing: B12xExperts._supports_current_device asks get_b12x_fused_moe() */
    {"sm_120", "be=b12x", 0, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("B12X", DEV_CUDA), "B12X/B12xExperts",
     EXACT(DEV_CUDA), "b12x is not available in this build", NULL},
    {"sm_100", "be=cutlass", ALL, true, OK, "VLLM_CUTLASS", "CutlassExpertsFp4", USING("VLLM_CUTLASS", LIST_V), NULL, NULL, NULL, NULL},
    {"sm_100", "be=Flashinfer-TRTLLM eplb ep=2", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular", NULL,
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", "parallel config", NULL, NULL},
    {"sm_90", "be=flashinfer_cutlass", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("FLASHINFER_CUTLASS", Q_W4A4), NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_cutedsl", ALL, true, OK, "FLASHINFER_CUTEDSL", "FlashInferCuteDSLExperts", NULL, NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_cutedsl " DEEPEP_LL, ALL, true, OK, "FLASHINFER_CUTEDSL_BATCHED",
     "FlashInferCuteDSLBatchedExperts", NULL, NULL, NULL, NULL, NULL},
    {"sm_121", "be=flashinfer_b12x scheme=w4a16", ALL, true, OK, "FLASHINFER_B12X", "FlashInferB12xExperts", NULL, NULL, NULL, NULL, NULL},
    {"sm_100", "be=marlin", ALL, true, OK, "MARLIN", "MarlinExperts", USING("MARLIN", LIST_V), NULL, NULL, NULL, NULL},
    {"sm_70", "be=humming", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("HUMMING", DEV_CUDA), NULL, NULL, NULL, NULL},
    {"sm_90", "be=emulation", ALL, true, OK, "EMULATION", "Nvfp4QuantizationEmulationTritonExperts", NULL, NULL, NULL, NULL, NULL},
    {"sm_100", "be=cpu_reference", ALL, false, OK, "CPU_REFERENCE", "CpuReferenceExperts", "",
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", "not requested (moe_backend='cpu_reference'); would be supported", NULL, NULL},
    // -- unknown names --
    {"sm_100", "be=triton", ALL, true, NOTFOUND, NULL, NULL,
     "moe_backend='triton' is not supported for NvFP4 MoE. Expected one of [" KEYS_V "].", NULL, NULL, NULL, NULL},
    {"sm_100", "be=cpu_reference", ALL, true, NOTFOUND, NULL, NULL,
     "moe_backend='cpu_reference' is not supported for NvFP4 MoE. Expected one of [" KEYS_V "].", NULL, NULL, NULL, NULL},
    {"sm_100", "be=Bogus-Name", ALL, false, NOTFOUND, NULL, NULL,
     "moe_backend='bogus_name' is not supported for NvFP4 MoE. Expected one of [" KEYS_V ", 'hopper_wgmma', 'cpu_fast', 'cpu_reference'].", NULL, NULL, NULL, NULL},
    // -- requantization source: EMULATION at once, before the name is even looked at --
    {"sm_100", "requant be=bogus", ALL, true, OK, "EMULATION", "Nvfp4QuantizationEmulationTritonExperts", "", NULL, NULL, NULL, NULL},
    {"cpu", "requant", ALL, false, OK, "EMULATION", "Nvfp4QuantizationEmulationTritonExperts", "",
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", "not considered: the layer is a requantization source", NULL, NULL},
    // -- this build's availability (no what-if). The libraries vLLM imports in its device checks
    //    read as the device; our own GPU backends are planned for a what-if GPU in any build, so
    //    every build answers as the GPU machine would --
    {"sm_100", "", THIS_BUILD, true, OK, "MARLIN", "MarlinExperts", USING("MARLIN", LIST_V),
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(DEV_CUDA), "FlashInfer is not available in this build", NULL},
    {"h200", "", THIS_BUILD, false, OK, "HOPPER_WGMMA", "HopperWgmmaExperts", "", "MARLIN/MarlinExperts", "", "",
     "vLLM itself would choose MARLIN (MarlinExperts)"},
    {"h200", "hidden=7168", THIS_BUILD, false, OK, "HOPPER_WGMMA", "HopperWgmmaExperts", "", NULL, NULL, NULL,
     "vLLM itself would choose MARLIN (MarlinExperts)"},
    {"sm_75", "", THIS_BUILD, true, UNSUP, NULL, NULL, NOTHING,
     "MARLIN/MarlinExperts", EXACT("the MARLIN implementation is not available for this device: this build's kernels "
                                   "need sm_80 or newer (device is sm_75)"), NULL, NULL},
    {"sm_90", "be=flashinfer_trtllm", THIS_BUILD, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_TRTLLM", DEV_CUDA), "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(DEV_CUDA),
     "device sm_90", NULL},
    {"sm_100", "be=flashinfer_trtllm", THIS_BUILD, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_TRTLLM", DEV_CUDA), "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsModular", EXACT(DEV_CUDA),
     "FlashInfer is not available in this build", NULL},
    {"sm_100", "", NVFP4MOE_LIB_FLASHINFER, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsMonolithic", NULL, NULL, NULL, NULL, NULL},

    // ==== issue-level facts, one group per point, each from vLLM's code ====

    // 1. flashinfer_all2allv is FlashInfer's two-sided NVLink all2all (config.py,
    //    use_fi_nvl_two_sided_kernels): MarlinExperts refuses two-sided only (marlin_moe.py), the
    //    Humming experts and TritonExperts (EMULATION) refuse two- and one-sided
    {"sm_90", "ep=2 dp=2 a2a=flashinfer_all2allv", ALL, true, UNSUP, NULL, NULL, NOTHING, "MARLIN/MarlinExperts",
     EXACT(PAR(1, 2, 2, 0, 0, "True", "flashinfer_all2allv", "False")), NULL, NULL},
    {"sm_90", "ep=2 dp=2 a2a=flashinfer_all2allv", ALL, true, UNSUP, NULL, NULL, NOTHING,
     "EMULATION/Nvfp4QuantizationEmulationTritonExperts", EXACT(PAR(1, 2, 2, 0, 0, "True", "flashinfer_all2allv", "False")), NULL, NULL},
    {"sm_90", "ep=2 dp=2 a2a=flashinfer_nvlink_one_sided", ALL, true, OK, "MARLIN", "MarlinExperts", USING("MARLIN", LIST_V90),
     "HUMMING/HummingIndexedExperts", EXACT(PAR(1, 2, 2, 0, 0, "True", "flashinfer_nvlink_one_sided", "False")), NULL, NULL},
    /* without dp > 1 there are no all2all kernels: the backend name alone changes nothing */
    {"sm_90", "ep=2 a2a=flashinfer_all2allv", ALL, true, OK, "HUMMING", "HummingIndexedExperts", NULL, NULL, NULL, NULL, NULL},
    {"sm_100", "ep=2 dp=2 a2a=flashinfer_all2allv", ALL, true, OK, "FLASHINFER_TRTLLM", "TrtLlmNvFp4ExpertsModular", NULL,
     "FLASHINFER_TRTLLM/TrtLlmNvFp4ExpertsMonolithic", EXACT(PAR(1, 2, 2, 0, 0, "True", "flashinfer_all2allv", "False")), NULL, NULL},

    // 2. EMULATION is TritonExperts: every activation apply_moe_activation supports
    //    (activation.py _APPLY_MOE_ACTIVATIONS, SiTU and swigluoai_uninterleave included, relu2 not),
    //    and moe_align_block_size needs fewer than 1024 experts padded to 32 (triton_moe.py)
    {"sm_90", "be=emulation act=situ", ALL, true, OK, "EMULATION", "Nvfp4QuantizationEmulationTritonExperts", NULL, NULL, NULL, NULL, NULL},
    {"sm_90", "be=emulation act=swigluoai_uninterleave limit=7", ALL, true, OK, "EMULATION",
     "Nvfp4QuantizationEmulationTritonExperts", USING("EMULATION", LIST_CLAMP90), NULL, NULL, NULL, NULL},
    {"sm_90", "be=emulation act=relu2", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("EMULATION", ACT_REASON("RELU2")),
     NULL, NULL, NULL, NULL},
    {"sm_70", "act=situ", ALL, true, OK, "EMULATION", "Nvfp4QuantizationEmulationTritonExperts", NULL, NULL, NULL, NULL, NULL},
    {"sm_90", "be=emulation experts=992 topk=8", ALL, true, OK, "EMULATION", "Nvfp4QuantizationEmulationTritonExperts",
     NULL, NULL, NULL, NULL, NULL},
    {"sm_90", "be=emulation experts=993 topk=8", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("EMULATION", "kernel's moe_align_block_size requires fewer than 1024 padded experts"), NULL, NULL, NULL, NULL},
    {"sm_70", "experts=1024", ALL, true, UNSUP, NULL, NULL, NOTHING, "EMULATION/Nvfp4QuantizationEmulationTritonExperts",
     EXACT("kernel's moe_align_block_size requires fewer than 1024 padded experts"), NULL, NULL},
    /* the base checks come first: on the CPU platform the device says no before the expert count */
    {"cpu", "be=emulation experts=1024", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("EMULATION", DEV_CPU), NULL, NULL, NULL, NULL},

    // 3. B12xExperts checks apply_router_weight_on_input at weight loading
    //    (process_weights_after_loading), not in is_supported_config: the oracle picks B12X
    {"sm_120", "be=b12x topk=1 arwi", ALL, true, OK, "B12X", "B12xExperts", USING("B12X", LIST_V), NULL, NULL, NULL,
     "b12x MoE supports apply_router_weight_on_input only with W4A16"},
    {"sm_120", "be=b12x topk=1 arwi scheme=w4a16", ALL, true, OK, "B12X", "B12xExperts", NULL, NULL, NULL, NULL, ""},

    // 4. FLASHINFER_MOE_EP_CUTEDSL is FlashInferMoeEpExperts (experts/flashinfer_moe_ep.py; vLLM's
    //    test_megakernels_are_oracle_backends): sm_100/sm_103 only, weight key NVFP4 (any
    //    activation key), parallel `use_ep and not use_batched_activation_format`, no act-and-mul
    //    False, SiLU only; then flashinfer_moe_ep_unsupported_reasons, joined by ", "
    {"sm_100", "be=flashinfer_moe_ep_cutedsl ep=2", ALL, true, OK, "FLASHINFER_MOE_EP_CUTEDSL",
     "FlashInferMoeEpExperts", USING("FLASHINFER_MOE_EP_CUTEDSL", LIST_V), NULL, NULL, NULL, NULL},
    {"b300", "be=flashinfer_moe_ep_cutedsl ep=8 eplb", ALL, true, OK, "FLASHINFER_MOE_EP_CUTEDSL", "FlashInferMoeEpExperts",
     NULL, NULL, NULL, NULL, NULL}, /* EPLB stops the DeepGEMM megakernel only */
    {"sm_100", "be=flashinfer_moe_ep_cutedsl ep=2 limit=7", ALL, true, OK, "FLASHINFER_MOE_EP_CUTEDSL",
     "FlashInferMoeEpExperts", USING("FLASHINFER_MOE_EP_CUTEDSL", LIST_CLAMP), NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_moe_ep_cutedsl", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_MOE_EP_CUTEDSL", PAR(1, 1, 1, 0, 0, "False", AGRS, "False")), NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_moe_ep_cutedsl tp=2 dp=2", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_MOE_EP_CUTEDSL", PAR(4, 2, 1, 0, 0, "False", AGRS, "False")), NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_moe_ep_cutedsl " DEEPEP_LL, ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_MOE_EP_CUTEDSL", PAR(1, 2, 2, 0, 0, "True", "deepep_low_latency", "False")), NULL, NULL, NULL, NULL},
    {"sm_120", "be=flashinfer_moe_ep_cutedsl ep=2", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_MOE_EP_CUTEDSL", DEV_CUDA), NULL, NULL, NULL, NULL},
    {"sm_110", "be=flashinfer_moe_ep_cutedsl ep=2", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_MOE_EP_CUTEDSL", DEV_CUDA), NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_moe_ep_cutedsl ep=2 act=relu2_no_mul", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_MOE_EP_CUTEDSL", K "no act_and_mul MLP layer"), NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_moe_ep_cutedsl ep=2 act=gelu", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_MOE_EP_CUTEDSL", ACT_REASON("GELU")), NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_moe_ep_cutedsl ep=2 scheme=w4a16", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_MOE_EP_CUTEDSL", K "A16 activations with NVFP4 weights"), NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_moe_ep_cutedsl ep=2 scheme=w4a8-mxfp8", ALL, true, OK, "FLASHINFER_MOE_EP_CUTEDSL",
     "FlashInferMoeEpExperts", NULL, NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_moe_ep_cutedsl ep=2 dtype=fp16 bias alpha=1.5", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_MOE_EP_CUTEDSL",
                       K "activation dtype torch.float16, expert bias, custom SwiGLU alpha or beta"), NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_moe_ep_cutedsl ep=2 lora", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_MOE_EP_CUTEDSL", K "LoRA"), NULL, NULL, NULL, NULL},

    // 5. f"current device {current_platform.device_name, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL}": "cuda" (see the cases above), "cpu"
    {"cpu", "be=marlin", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("MARLIN", DEV_CPU), NULL, NULL, NULL, NULL},

    // 6. activations print as the enum
    {"sm_100", "act=swiglustep be=flashinfer_trtllm", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_TRTLLM", ACT_REASON("SWIGLUSTEP")), NULL, NULL, NULL, NULL},
    {"sm_100", "act=gelu_tanh_no_mul be=flashinfer_cutedsl", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_CUTEDSL", ACT_REASON("GELU_TANH_NO_MUL")), NULL, NULL, NULL, NULL},

    // 7. quantization schemes print QuantKey.__str__
    {"sm_90", "be=emulation scheme=w4a16", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("EMULATION", Q_W4A16), NULL, NULL, NULL, NULL},
    {"sm_100", "be=cutlass scheme=w4a4-per-token", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("VLLM_CUTLASS", K "quantization scheme " QK_W "x" QK_A_TOKEN), NULL, NULL, NULL, NULL},
    {"sm_100", "be=flashinfer_trtllm scheme=w4a8-mxfp8", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_TRTLLM", K "quantization scheme " QK_W "x" QK_A_MXFP8), NULL, NULL, NULL, NULL},

    // 8. the parallel config prints the whole dataclass: TP flattened across DP without EP, the
    //    rank's DP rank with EP (ep_rank over the ranks per DP group), the default all2all backend
    {"sm_120", "be=b12x ep=2", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("B12X", PAR(1, 1, 2, 0, 0, "True", AGRS, "False")), NULL, NULL, NULL, NULL},
    {"sm_120", "be=b12x ep=4 dp=2 eprank=3", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("B12X", PAR(1, 2, 4, 1, 3, "True", AGRS, "False")), NULL, NULL, NULL, NULL},
    {"sm_120", "be=b12x tp=2 dp=2", ALL, true, OK, "B12X", "B12xExperts", NULL, NULL, NULL, NULL, NULL},

    // 9. activation formats print their value (the cases above), 10. swiglu_limit prints as Python
    //    prints the float the model gave
    {"sm_100", "limit=7.123456789 be=flashinfer_b12x", ALL, true, UNSUP, NULL, NULL,
     CLAMP_MSG("7.123456789", "flashinfer_b12x"), NULL, NULL, NULL, NULL},
    {"sm_100", "limit=7 be=flashinfer_b12x", ALL, true, UNSUP, NULL, NULL, CLAMP_MSG("7.0", "flashinfer_b12x"), NULL, NULL, NULL, NULL},
    {"sm_100", "limit=0.1 be=flashinfer_b12x", ALL, true, UNSUP, NULL, NULL, CLAMP_MSG("0.1", "flashinfer_b12x"), NULL, NULL, NULL, NULL},
    {"sm_100", "limit=0.00001 be=flashinfer_b12x", ALL, true, UNSUP, NULL, NULL, CLAMP_MSG("1e-05", "flashinfer_b12x"), NULL, NULL, NULL, NULL},
    {"sm_100", "limit=100000000 be=flashinfer_b12x", ALL, true, UNSUP, NULL, NULL,
     CLAMP_MSG("100000000.0", "flashinfer_b12x"), NULL, NULL, NULL, NULL},
    {"sm_100", "limit=1e16 be=flashinfer_b12x", ALL, true, UNSUP, NULL, NULL, CLAMP_MSG("1e+16", "flashinfer_b12x"), NULL, NULL, NULL, NULL},

    // 11. EMULATION's own bias reason
    {"sm_100", "bias be=emulation", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("EMULATION", K "bias"), NULL, NULL, NULL, NULL},

    // 12. check order: the classes' own gates come before the base checks
    {"sm_100", "be=b12x bias", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("B12X", K "expert biases"), NULL, NULL, NULL, NULL},
    {"sm_100", "be=b12x dtype=f32", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("B12X", K "torch.float32 input/output dtype"), NULL, NULL, NULL, NULL},
    {"sm_90", "be=b12x act=swigluoai_uninterleave limit=7", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("B12X", K "swigluoai_uninterleave with W4A8"), NULL, NULL, NULL, NULL},
    {"sm_120", "be=b12x act=swigluoai_uninterleave limit=7 a16", ALL, true, OK, "B12X", "B12xExperts", NULL, NULL, NULL, NULL, NULL},
    {"cpu", "be=emulation lora bias", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("EMULATION", K "LoRA"), NULL, NULL, NULL, NULL},
    {"cpu", "be=emulation bias", ALL, true, UNSUP, NULL, NULL, UNSUPPORTED_SINCE("EMULATION", K "bias"), NULL, NULL, NULL, NULL},
    {"sm_90", "be=flashinfer_trtllm scheme=w4a4-per-token act=relu2_no_mul", ALL, true, UNSUP, NULL, NULL,
     UNSUPPORTED_SINCE("FLASHINFER_TRTLLM", "kernel does not support per-token NVFP4 activation scaling for non-gated MoE"),
     NULL, NULL, NULL, NULL},
};

/* The number of kernel classes the report must list: every one, vllm_only hiding ours (a new
 * backend in src/oracle/table.c adds its kernels here). */
static int expected_candidates(bool vllm_only) { return vllm_only ? 14 : 17; }

static const nvfp4moe_candidate *find_cand(const nvfp4moe_report *r, const char *spec) {
    char b[64];
    const char *slash = strchr(spec, '/');
    snprintf(b, sizeof b, "%.*s", (int)(slash - spec), spec);
    for (int i = 0; i < r->n_candidates; i++)
        if (!strcmp(r->candidates[i].backend, b) && !strcmp(r->candidates[i].kernel, slash + 1)) return &r->candidates[i];
    return NULL;
}

static void run_case(int idx, oracle_case c) {
    char name[200];
    snprintf(name, sizeof name, "#%d %s {%s} inst=%lld%s", idx, c.device, c.args, c.inst, c.vllm_only ? " vllm_only" : "");
    T_CASE(name);
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    CHECK(apply_args(&cfg, c.args) == 0, "bad args in the table");
    nvfp4moe_device dev;
    CHECK_OK(nvfp4moe_device_parse(c.device, &dev));
    nvfp4moe_oracle_options opt = {.installed_set = c.inst != THIS_BUILD,
                                   .installed = c.inst == THIS_BUILD ? 0 : (uint32_t)c.inst,
                                   .vllm_only = c.vllm_only};
    static nvfp4moe_report r;
    nvfp4moe_status st = nvfp4moe_select(&cfg, &dev, &opt, &r);
    CHECK(st == c.st, "status %s, want %s (%s)", nvfp4moe_status_str(st), nvfp4moe_status_str(c.st), nvfp4moe_last_error());
    CHECK(!strcmp(r.backend, c.backend ? c.backend : ""), "backend '%s', want '%s'", r.backend, c.backend ? c.backend : "");
    CHECK(!strcmp(r.kernel, c.kernel ? c.kernel : ""), "kernel '%s', want '%s'", r.kernel, c.kernel ? c.kernel : "");
    if (c.msg) {
        const char *got = c.st == OK ? r.log : r.error;
        CHECK(!strcmp(got, c.msg), "message\n  got:  %s\n  want: %s", got, c.msg);
    }
    if (c.st != OK) {
        /* vLLM: a bad or unsupported explicit request is a ValueError, an empty auto list not. */
        const char *kind = strcmp(cfg.moe_backend, "auto") ? "ValueError" : "NotImplementedError";
        CHECK(!strcmp(r.error_kind, kind), "error kind '%s', want '%s'", r.error_kind, kind);
        CHECK(!strcmp(nvfp4moe_last_error(), r.error), "last_error '%s' differs from the report", nvfp4moe_last_error());
    } else {
        CHECK(r.error_kind[0] == '\0' && r.error[0] == '\0', "error set on success: %s", r.error);
    }
    if (c.note && !c.note[0]) CHECK(!r.detail[0], "report detail '%s', want none", r.detail);
    if (c.note && c.note[0]) CHECK(strstr(r.detail, c.note) != NULL, "report detail '%s', want '%s' in it", r.detail, c.note);
    if (c.cand) {
        const nvfp4moe_candidate *cd = find_cand(&r, c.cand);
        CHECK(cd != NULL, "candidate %s missing", c.cand);
        if (cd && c.cand_reason[0] == '=')
            CHECK(!strcmp(cd->reason, c.cand_reason + 1), "%s reason\n  got:  %s\n  want: %s", c.cand, cd->reason,
                  c.cand_reason + 1);
        else if (cd && c.cand_reason[0])
            CHECK(strstr(cd->reason, c.cand_reason) != NULL, "%s reason '%s', want it to contain '%s'", c.cand,
                  cd->reason, c.cand_reason);
        if (cd && !c.cand_reason[0])
            CHECK(cd->supported && cd->verdict == NVFP4MOE_VERDICT_SUPPORTED, "%s: want supported, lower priority", c.cand);
        if (cd && c.cand_detail)
            CHECK(strstr(cd->detail, c.cand_detail) != NULL, "%s detail '%s', want '%s' in it", c.cand, cd->detail,
                  c.cand_detail);
    }
    /* Invariants of every report, one check per case: each kernel once, exactly one CHOSEN iff a
     * choice, reasons for every "no" and none for a "yes", nothing of ours under vllm_only, vLLM's
     * log line only when one of vLLM's backends is chosen. */
    char bad[400] = "";
    if (r.n_candidates != expected_candidates(c.vllm_only))
        snprintf(bad, sizeof bad, "%d candidates, want %d", r.n_candidates, expected_candidates(c.vllm_only));
    int chosen = 0;
    for (int i = 0; i < r.n_candidates && !bad[0]; i++) {
        const nvfp4moe_candidate *cd = &r.candidates[i];
        for (int j = 0; j < i; j++)
            if (!strcmp(cd->kernel, r.candidates[j].kernel)) snprintf(bad, sizeof bad, "%s listed twice", cd->kernel);
        if (cd->verdict == NVFP4MOE_VERDICT_CHOSEN) {
            chosen++;
            if (strcmp(cd->backend, r.backend) || strcmp(cd->kernel, r.kernel))
                snprintf(bad, sizeof bad, "CHOSEN row %s/%s is not the choice", cd->backend, cd->kernel);
        }
        if (cd->verdict == NVFP4MOE_VERDICT_REJECTED && (cd->supported || !cd->reason[0]))
            snprintf(bad, sizeof bad, "%s: rejected without a reason, or supported", cd->kernel);
        if (cd->verdict == NVFP4MOE_VERDICT_SUPPORTED && (!cd->supported || cd->reason[0]))
            snprintf(bad, sizeof bad, "%s: 'supported' with a reason, or unsupported", cd->kernel);
        if (cd->verdict == NVFP4MOE_VERDICT_NOT_IN_LIST && !cd->reason[0])
            snprintf(bad, sizeof bad, "%s: not in list without a reason", cd->kernel);
        if (c.vllm_only && nvfp4moe_backend_row(cd->backend)->ours) snprintf(bad, sizeof bad, "%s under vllm_only", cd->backend);
    }
    if (!bad[0] && chosen != (st == NVFP4MOE_OK ? 1 : 0)) snprintf(bad, sizeof bad, "%d CHOSEN rows", chosen);
    const backend_def *row = r.backend[0] ? nvfp4moe_backend_row(r.backend) : NULL;
    if (!bad[0] && row && row->ours && r.log[0]) snprintf(bad, sizeof bad, "a vLLM log line for our %s", r.backend);
    if (!bad[0] && strstr(r.log, "CPU_") ) snprintf(bad, sizeof bad, "our backends in vLLM's log line");
    CHECK(!bad[0], "report invariant: %s", bad);
}

// ---- the rest of the API ----

static void test_devices(void) {
    T_CASE("device_parse");
    /* Compute capabilities from NVIDIA's list of CUDA GPUs (developer.nvidia.com/cuda-gpus): the
     * names as users type them, as nvidia-smi prints them, and as torch's capability. */
    static const struct { const char *s; int sm; } ok[] = {
        {"sm_90", 90}, {"sm90", 90}, {"SM_100", 100}, {"sm_100a", 100}, {"sm_121", 121}, {"sm_75", 75},
        {"a100", 80}, {"l40s", 89}, {"h100", 90}, {"H200", 90}, {"b200", 100}, {"gb200", 100}, {"b300", 103},
        {"rtx5090", 120}, {"rtx-pro-6000", 120}, {"rtx_pro_6000", 120}, {"dgx-spark", 121}, {"cpu", 0},
        {"h20", 90}, {"h800", 90}, {"gh200", 90}, {"l4", 89}, {"l40", 89}, {"a10g", 86}, {"rtx4090", 89},
        {"b100", 100}, {"gb300", 103}, {"gb10", 121},
        {"NVIDIA H200", 90}, {"NVIDIA H100 80GB HBM3", 90}, {"NVIDIA A100-SXM4-80GB", 80},
        {"NVIDIA GeForce RTX 4090", 89}, {"NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 120},
        {"NVIDIA GH200 480GB", 90}, {"NVIDIA L40S", 89}, {"NVIDIA B200", 100},
        {"9.0", 90}, {"10.0", 100}, {"10.3", 103}, {"12.1", 121}, {"8.9", 89},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        nvfp4moe_device d;
        nvfp4moe_status st = nvfp4moe_device_parse(ok[i].s, &d);
        CHECK(st == NVFP4MOE_OK && d.sm == ok[i].sm && d.is_cuda == (ok[i].sm != 0) && !d.detected && d.ordinal == -1,
              "%s -> %s sm=%d", ok[i].s, nvfp4moe_status_str(st), d.sm);
    }
    static const char *const bad[] = {"sm_9", "sm_0900", "sm_", "gpu", "h300", "sm_90x", "", "NVIDIA", "9.", "09.0"};
    nvfp4moe_device d;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_ERR(nvfp4moe_device_parse(bad[i], &d), NVFP4MOE_ERR_NOT_FOUND, "dgx-spark");
    /* a capability no GPU has is a typo: rejected with the list of real ones */
    static const char *const no_gpu[] = {"sm_91", "sm_99", "9.1", "sm_130"};
    for (size_t i = 0; i < sizeof no_gpu / sizeof no_gpu[0]; i++)
        CHECK_ERR(nvfp4moe_device_parse(no_gpu[i], &d), NVFP4MOE_ERR_NOT_FOUND, "sm_90, sm_100, sm_101, sm_103");
    CHECK_ERR(nvfp4moe_device_parse(NULL, &d), NVFP4MOE_ERR_INVALID_ARGUMENT, "NULL");
    /* a typo names the nearest device; a word near none names none */
    CHECK_ERR(nvfp4moe_device_parse("h2000", &d), NVFP4MOE_ERR_NOT_FOUND, "); did you mean 'h200'?");
    CHECK_ERR(nvfp4moe_device_parse("rtx-pro-600", &d), NVFP4MOE_ERR_NOT_FOUND, "did you mean 'rtx-pro-6000'?");
    CHECK_ERR(nvfp4moe_device_parse("gpu", &d), NVFP4MOE_ERR_NOT_FOUND, "cpu)");
    CHECK(!strstr(nvfp4moe_last_error(), "did you mean"), "'gpu' got a suggestion: %s", nvfp4moe_last_error());

    T_CASE("device_str");
    char buf[16];
    CHECK_OK(nvfp4moe_device_parse("b300", &d));
    CHECK(!strcmp(nvfp4moe_device_str(&d, buf, sizeof buf), "sm_103"), "%s", buf);
    CHECK_OK(nvfp4moe_device_parse("cpu", &d));
    CHECK(!strcmp(nvfp4moe_device_str(&d, buf, sizeof buf), "cpu"), "%s", buf);

    T_CASE("device_detect");
    CHECK_OK(nvfp4moe_device_detect(&d));
    CHECK(d.detected && (d.is_cuda ? d.sm >= 30 && d.ordinal == 0 : d.sm == 0 && d.ordinal == -1),
          "detect: is_cuda=%d sm=%d ordinal=%d", d.is_cuda, d.sm, d.ordinal);
#ifndef NVFP4MOE_HAVE_CUDA
    CHECK(!d.is_cuda && !strcmp(d.name, "cpu"), "a CPU-only build detected '%s'", d.name);
#endif
}

static void test_libs_parse(void) {
    T_CASE("oracle_libs_parse");
    uint32_t m = 123;
    CHECK_OK(nvfp4moe_oracle_libs_parse("all", &m));
    CHECK(m == NVFP4MOE_LIB_ALL, "all -> %x", m);
    CHECK_OK(nvfp4moe_oracle_libs_parse("none", &m));
    CHECK(m == 0, "none -> %x", m);
    CHECK_OK(nvfp4moe_oracle_libs_parse("FlashInfer,humming", &m));
    CHECK(m == (NVFP4MOE_LIB_FLASHINFER | NVFP4MOE_LIB_HUMMING), "-> %x", m);
    CHECK_OK(nvfp4moe_oracle_libs_parse("cutlass,b12x", &m));
    CHECK(m == (NVFP4MOE_LIB_VLLM_CUTLASS | NVFP4MOE_LIB_B12X), "-> %x", m);
    m = 77;
    CHECK_ERR(nvfp4moe_oracle_libs_parse("flashinfer,deepgemm", &m), NVFP4MOE_ERR_NOT_FOUND, "'deepgemm'");
    CHECK(m == 77, "mask written on failure");
    CHECK_ERR(nvfp4moe_oracle_libs_parse("flashinfer,", &m), NVFP4MOE_ERR_NOT_FOUND, "unknown library ''");
    CHECK_ERR(nvfp4moe_oracle_libs_parse("flashinfer,humimng", &m), NVFP4MOE_ERR_NOT_FOUND,
              "unknown library 'humimng' (expected one of: all, none, flashinfer, b12x, humming, cutlass, or a "
              "comma-separated list); did you mean 'humming'?");

    T_CASE("an unknown moe_backend: vLLM's ValueError, the nearest name in our note");
    static nvfp4moe_report r;
    nvfp4moe_config cfg;
    nvfp4moe_config_init(&cfg);
    nvfp4moe_device dev;
    nvfp4moe_device_parse("h200", &dev);
    nvfp4moe_oracle_options vo = {.vllm_only = true};
    static const struct { const char *typed, *note; bool vllm_only; } typos[] = {
        {"marlinn", "did you mean moe_backend='marlin'?", false},
        {"flashinfer-trtlm", "did you mean moe_backend='flashinfer_trtllm'?", false},
        {"hopper_wgmm", "did you mean moe_backend='hopper_wgmma'?", false},
        {"hopper_wgmm", "", true},   /* --vllm-only: ours are not names */
        {"deepgemm", "", false},
    };
    for (size_t i = 0; i < sizeof typos / sizeof typos[0]; i++) {
        snprintf(cfg.moe_backend, sizeof cfg.moe_backend, "%s", typos[i].typed);
        nvfp4moe_status st = nvfp4moe_select(&cfg, &dev, typos[i].vllm_only ? &vo : NULL, &r);
        CHECK(st == NVFP4MOE_ERR_NOT_FOUND && !strcmp(r.error_kind, "ValueError") && !strcmp(r.detail, typos[i].note) &&
                  !strstr(r.error, "did you mean"),
              "%s: %s detail '%s' error '%s'", typos[i].typed, nvfp4moe_status_str(st), r.detail, r.error);
    }
}

static void test_invalid_and_render(void) {
    static nvfp4moe_report r;
    nvfp4moe_config cfg;
    nvfp4moe_device dev;
    nvfp4moe_device_parse("sm_100", &dev);

    T_CASE("invalid config");
    nvfp4moe_config_init(&cfg);
    cfg.hidden_size = 100;
    CHECK_ERR(nvfp4moe_select(&cfg, &dev, NULL, &r), NVFP4MOE_ERR_INVALID_ARGUMENT, "hidden_size=100");
    CHECK(r.error_kind[0] == '\0' && r.n_candidates == 0 && r.backend[0] == '\0', "no decision for an invalid config");
    nvfp4moe_config_init(&cfg);
    cfg.moe_backend[0] = '\0';
    CHECK_ERR(nvfp4moe_select(&cfg, &dev, NULL, &r), NVFP4MOE_ERR_INVALID_ARGUMENT, "moe_backend");
    CHECK_ERR(nvfp4moe_select(NULL, &dev, NULL, &r), NVFP4MOE_ERR_INVALID_ARGUMENT, "config");
    nvfp4moe_config_init(&cfg);
    CHECK_ERR(nvfp4moe_select(&cfg, &dev, NULL, NULL), NVFP4MOE_ERR_INVALID_ARGUMENT, "report");

    T_CASE("detect when dev is NULL");
    nvfp4moe_config_init(&cfg);
    nvfp4moe_oracle_options all = {.installed_set = true, .installed = NVFP4MOE_LIB_ALL};
    nvfp4moe_device det;
    nvfp4moe_device_detect(&det);
    char want[16];
    nvfp4moe_select(&cfg, NULL, &all, &r);
    CHECK(!strcmp(r.device, nvfp4moe_device_str(&det, want, sizeof want)), "device %s, want %s", r.device, want);

    T_CASE("render");
    nvfp4moe_config_init(&cfg);
    CHECK_OK(nvfp4moe_select(&cfg, &dev, &all, &r));
    char text[8192];
    size_t need = nvfp4moe_report_render(&r, text, sizeof text);
    CHECK(need == strlen(text) && need < sizeof text, "render length %zu vs %zu", need, strlen(text));
    CHECK(strstr(text, "backend:  FLASHINFER_TRTLLM\n") && strstr(text, "kernel:   TrtLlmNvFp4ExpertsMonolithic\n"),
          "render lacks the choice:\n%s", text);
    CHECK(strstr(text, r.log) != NULL, "render lacks the log line:\n%s", text);
    CHECK(strstr(text, "supported, lower priority") && strstr(text, "not in the list") && strstr(text, "chosen"),
          "render lacks verdicts:\n%s", text);
    /* Every candidate appears as a row, in report order. */
    const char *at = text;
    for (int i = 0; i < r.n_candidates; i++) {
        const char *p = strstr(at, r.candidates[i].kernel);
        CHECK(p != NULL, "row %d (%s) missing or out of order", i, r.candidates[i].kernel);
        if (p) at = p;
    }
    char small[32];
    size_t need2 = nvfp4moe_report_render(&r, small, sizeof small);
    CHECK(need2 == need && strlen(small) == sizeof small - 1 && !strncmp(small, text, sizeof small - 1),
          "truncated render: need %zu vs %zu, '%s'", need2, need, small);
    CHECK(nvfp4moe_report_render(&r, NULL, 0) == need, "size query");

    T_CASE("render error");
    snprintf(cfg.moe_backend, sizeof cfg.moe_backend, "b12x");
    CHECK(nvfp4moe_select(&cfg, &dev, &all, &r) == NVFP4MOE_ERR_UNSUPPORTED, "b12x on sm_100");
    nvfp4moe_report_render(&r, text, sizeof text);
    CHECK(strstr(text, "error:    ValueError: NvFp4 MoE backend 'B12X' does not support") && strstr(text, "backend:  none"),
          "render of an error:\n%s", text);

    T_CASE("verdict names");
    CHECK(!strcmp(nvfp4moe_verdict_name(NVFP4MOE_VERDICT_CHOSEN), "chosen") &&
          !strcmp(nvfp4moe_verdict_name(NVFP4MOE_VERDICT_NOT_IN_LIST), "not in list"), "verdict names");
}

// ---- the command line ----

/* Runs `$NVFP4MOE_CLI <command> <args>`, returning its exit status and stdout. */
static int run_tool(const char *cli, const char *command, const char *args, char *out, size_t len) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s %s 2>/dev/null", cli, command, args);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(out, 1, len - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run_cli(const char *cli, const char *args, char *out, size_t len) {
    return run_tool(cli, "select", args, out, len);
}

static void test_cli(void) {
    const char *cli = getenv("NVFP4MOE_CLI");
    if (!cli || !cli[0]) {
        printf("test_oracle: NVFP4MOE_CLI unset, skipping the nvfp4moe select checks\n");
        return;
    }
    static char out[65536];
    static const struct {
        const char *args;
        int rc;
        const char *backend; /* --json: expected "backend" (NULL: null); NULL args check text only */
        const char *error_kind;
        const char *in_message; /* (optional) a substring of the log line or the error message */
    } cases[] = {
        {"--device h200 --installed all --vllm-only --json", 0, "HUMMING", NULL, "Using 'HUMMING'"},
        {"--device b200 --installed all --json", 0, "FLASHINFER_TRTLLM", NULL, "Using 'FLASHINFER_TRTLLM'"},
        {"--device sm_100 --installed all --moe-backend b12x --json", 2, NULL, "ValueError", "current device cuda."},
        {"--device sm_100 --moe-backend triton --json", 2, NULL, "ValueError", NULL},
        {"--device cpu --vllm-only --json", 3, NULL, "NotImplementedError", NULL},
        {"--device cpu --json", 0, "CPU_FAST", NULL, ""}, /* ours: vLLM logs nothing */
        {"--device sm_100 --installed all --swiglu-limit 7 --moe-backend flashinfer_b12x --json", 2, NULL, "ValueError",
         "swiglu_limit=7.0,"},
        /* the flag keeps every digit the user gave, as the model's config would */
        {"--device sm_100 --installed all --swiglu-limit 7.123456789 --moe-backend flashinfer_b12x --json", 2, NULL,
         "ValueError", "swiglu_limit=7.123456789,"},
        {"--device 'NVIDIA H200' --installed all --vllm-only --json", 0, "HUMMING", NULL, "Using 'HUMMING'"},
        {"--device 9.0 --installed all --vllm-only --moe-backend flashinfer_trtllm --json", 2, NULL, "ValueError",
         "since kernel does not support current device cuda."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        T_CASE(cases[i].args);
        int rc = run_cli(cli, cases[i].args, out, sizeof out);
        CHECK(rc == cases[i].rc, "exit %d, want %d", rc, cases[i].rc);
        json_error_t err;
        json_t *j = json_loads(out, 0, &err);
        CHECK(j != NULL && json_is_object(j), "not one JSON object (%s): %.200s", err.text, out);
        if (!j) continue;
        json_t *b = json_object_get(j, "backend"), *e = json_object_get(j, "error");
        json_t *cands = json_object_get(j, "candidates");
        if (cases[i].backend)
            CHECK(json_is_string(b) && !strcmp(json_string_value(b), cases[i].backend), "backend %s",
                  json_is_string(b) ? json_string_value(b) : "null");
        else
            CHECK(json_is_null(b), "backend should be null");
        const char *said = "";
        if (cases[i].error_kind) {
            json_t *k = json_object_get(e, "kind"), *m = json_object_get(e, "message");
            CHECK(json_is_string(k) && !strcmp(json_string_value(k), cases[i].error_kind) && json_is_string(m) &&
                  json_string_length(m) > 10, "error object wrong");
            if (json_is_string(m)) said = json_string_value(m);
        } else {
            CHECK(json_is_null(e), "error should be null");
            json_t *l = json_object_get(j, "log");
            CHECK(json_is_string(l), "no log key");
            if (json_is_string(l)) said = json_string_value(l);
        }
        if (cases[i].in_message && !cases[i].in_message[0]) CHECK(!said[0], "a log line: %s", said);
        if (cases[i].in_message && cases[i].in_message[0])
            CHECK(strstr(said, cases[i].in_message) != NULL, "'%s' lacks '%s'", said, cases[i].in_message);
        json_t *rev = json_object_get(j, "vllm_revision");
        CHECK(json_is_string(rev) && !strcmp(json_string_value(rev), nvfp4moe_vllm_revision()), "vllm_revision");
        CHECK(json_is_string(json_object_get(j, "detail")), "no detail key");
        CHECK(json_is_array(cands) && json_array_size(cands) >= 14, "candidates");
        size_t k;
        json_t *cd;
        json_array_foreach(cands, k, cd) {
            CHECK(json_is_string(json_object_get(cd, "backend")) && json_is_string(json_object_get(cd, "kernel")) &&
                  json_is_boolean(json_object_get(cd, "supported")) && json_is_string(json_object_get(cd, "reason")) &&
                  json_is_string(json_object_get(cd, "detail")),
                  "candidate %zu lacks a key", k);
        }
        json_decref(j);
    }

    T_CASE("text and usage errors");
    int rc = run_cli(cli, "--device h200 --installed all --vllm-only", out, sizeof out);
    CHECK(rc == 0 && strstr(out, "backend:  HUMMING") && strstr(out, "HummingIndexedExperts"), "text: %d\n%s", rc, out);
    rc = run_cli(cli, "--device h200 --installed all --hidden-size 7168", out, sizeof out);
    CHECK(rc == 0 && strstr(out, "backend:  HOPPER_WGMMA") && strstr(out, "HopperWgmmaExperts"), "text: %d\n%s", rc, out);
    CHECK(run_cli(cli, "--device h300", out, sizeof out) == 1, "bad --device");
    CHECK(run_cli(cli, "--installed deepgemm", out, sizeof out) == 1, "bad --installed");
    CHECK(run_cli(cli, "--device", out, sizeof out) == 1, "missing value");
    CHECK(run_cli(cli, "--frobnicate", out, sizeof out) == 1, "unknown flag");
    CHECK(run_cli(cli, "--hidden-size 100", out, sizeof out) == 1, "invalid config");
    CHECK(run_cli(cli, "--help", out, sizeof out) == 0 && strstr(out, "--installed"), "help");
    CHECK(run_cli(cli, "--device sm_91", out, sizeof out) == 1, "a capability no GPU has");
    rc = run_tool(cli, "--version", "", out, sizeof out);
    CHECK(rc == 0 && strstr(out, nvfp4moe_vllm_revision()), "--version does not name the vLLM revision: %s", out);
}

/* The oracle and the plans read one implementation per row, so they agree on what runs where: a
 * row whose implementation is in this build is available exactly on the devices its kernels run
 * on (an sm_75 GPU gets no MARLIN from the oracle that plan_create would then refuse). A CPU-only
 * build has no GPU implementation, and plans a what-if GPU as a CUDA build would run it: with the
 * compute capabilities the row records, which are its CUDA implementation's own. */
static void test_available_where_it_runs(void) {
    static const char *const backends[] = {"MARLIN", "HOPPER_WGMMA", "EMULATION", "CPU_FAST", "CPU_REFERENCE"};
    static const char *const devices[] = {"sm_75", "sm_80", "sm_89", "sm_90", "sm_100", "sm_120", "cpu"};
    for (size_t b = 0; b < sizeof backends / sizeof backends[0]; b++) {
        const backend_def *row = nvfp4moe_backend_row(backends[b]);
        const nvfp4moe_backend_impl *impl = nvfp4moe_backend_impl_find(backends[b]);
        nvfp4moe_backend_impl planned = {.device_memory = true, .sm_min = row->planned_sm_min, .sm_max = row->planned_sm_max};
        if (impl && impl->device_memory) {
            T_CASE(backends[b]);
            CHECK(row->planned_sm_min == impl->sm_min && row->planned_sm_max == impl->sm_max,
                  "the table plans sm %d..%d, the implementation runs on sm %d..%d", row->planned_sm_min,
                  row->planned_sm_max, impl->sm_min, impl->sm_max);
        }
        if (!impl && row->planned_sm_min) impl = &planned;
        for (size_t d = 0; d < sizeof devices / sizeof devices[0]; d++) {
            char name[64];
            snprintf(name, sizeof name, "%s on %s", backends[b], devices[d]);
            T_CASE(name);
            nvfp4moe_config cfg;
            nvfp4moe_config_init(&cfg);
            nvfp4moe_strlcpy(cfg.moe_backend, backends[b], sizeof cfg.moe_backend);
            nvfp4moe_device dev;
            CHECK_OK(nvfp4moe_device_parse(devices[d], &dev));
            nvfp4moe_report r;
            nvfp4moe_status st = nvfp4moe_select(&cfg, &dev, NULL, &r);
            char why[96] = "";
            bool runs = impl && (!dev.is_cuda || nvfp4moe_impl_runs_on_sm(impl, dev.sm, why, sizeof why));
            bool device_ok = !impl || !impl->device_memory || dev.is_cuda;
            if (runs && device_ok)
                CHECK(st == NVFP4MOE_OK, "select: %s: %s", nvfp4moe_status_str(st), r.error);
            else
                CHECK(st != NVFP4MOE_OK, "select chose %s, whose implementation does not run here", r.backend);
            if (impl && dev.is_cuda && !runs)   /* the kernel's own device predicate may say it first */
                CHECK(strstr(r.error, why) || strstr(r.error, "does not support current device"),
                      "the refusal '%s' does not say '%s'", r.error, why);
            if (st == NVFP4MOE_OK && impl == &planned)
                CHECK(strstr(r.candidates[0].detail, "planned as a CUDA build would run it") != NULL,
                      "a planned choice without its detail: '%s'", r.candidates[0].detail);
        }
    }
}

int main(void) {
    int n = (int)(sizeof k_cases / sizeof k_cases[0]);
    test_available_where_it_runs();
    for (int i = 0; i < n; i++) run_case(i, k_cases[i]);
    test_devices();
    test_libs_parse();
    test_invalid_and_render();
    test_cli();
    printf("test_oracle: %d table cases\n", n);
    return t_finish("test_oracle");
}
