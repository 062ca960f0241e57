/*
 * nvfp4moe.h - the one public header of libnvfp4moe.
 *
 * nvfp4moe runs NVFP4-quantized Mixture-of-Experts layers (E2M1 weights, one FP8 E4M3 scale per 16
 * elements, one FP32 scale per tensor) and decides, for each deployment, which kernel backend runs
 * them, mirroring vLLM's NVFP4 MoE oracle.
 *
 * Conventions used everywhere in this header:
 *  - Functions that can fail return nvfp4moe_status. On failure they write nothing to their outputs
 *    and leave a message naming the offending field or tensor, read with nvfp4moe_last_error().
 *  - Matrices are row-major. Shapes are written [rows, cols]. E = experts, H = hidden size,
 *    I = intermediate size, M = tokens, N1 = 2*I for gated activations and I otherwise.
 *  - bf16 and fp16 values travel as uint16_t bit patterns.
 *  - The library never allocates memory that the caller must free, except through the matching
 *    *_free / *_destroy function named at the allocating call.
 *  - Nothing in the library exits or aborts on user input.
 */
#ifndef NVFP4MOE_H
#define NVFP4MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NVFP4MOE_VERSION_MAJOR 0
#define NVFP4MOE_VERSION_MINOR 1
#define NVFP4MOE_VERSION_PATCH 0

/* "0.1.0 (cuda)" or "0.1.0 (cpu-only)": the version and whether CUDA backends were compiled in. */
const char *nvfp4moe_version(void);

/* True when this build contains the CUDA backends (it may still run on a machine without a GPU). */
bool nvfp4moe_built_with_cuda(void);

// ---- status and errors ----

typedef enum nvfp4moe_status {
    NVFP4MOE_OK                   = 0,
    NVFP4MOE_ERR_INVALID_ARGUMENT = 1,  /* a NULL pointer, a bad value, a bad config field */
    NVFP4MOE_ERR_SHAPE            = 2,  /* sizes that do not fit the format (e.g. cols % 16 != 0) */
    NVFP4MOE_ERR_UNSUPPORTED      = 3,  /* valid, but no backend (or the requested one) can run it */
    NVFP4MOE_ERR_NOT_FOUND        = 4,  /* unknown name, missing file or tensor */
    NVFP4MOE_ERR_IO               = 5,  /* the operating system refused a read or a write */
    NVFP4MOE_ERR_FORMAT           = 6,  /* a malformed file: header, JSON, dtype, offsets */
    NVFP4MOE_ERR_OUT_OF_MEMORY    = 7,
    NVFP4MOE_ERR_CUDA             = 8,  /* the CUDA runtime reported an error */
    NVFP4MOE_ERR_BUFFER_TOO_SMALL = 9,
    NVFP4MOE_ERR_INTERNAL         = 10, /* a bug in nvfp4moe: please report it */
} nvfp4moe_status;

/* A fixed English name for a status, e.g. "invalid argument". Never NULL. */
const char *nvfp4moe_status_str(nvfp4moe_status s);

/* The message of the last failing call made by this thread ("" if none). The pointer stays valid
 * until the next failing call on the same thread. */
const char *nvfp4moe_last_error(void);

// ---- NVFP4 codec ----
//
// E2M1 code: bit 3 = sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
// E4M3 ("fn"): bias 7, max 448, subnormals, no infinity, 0x7F/0xFF = NaN.

/* RNE with ties to even on the E2M1 grid, saturating at +-6; sign in bit 3 (-0 gives 0x8).
 * NaN encodes as +0 (0x0); +-Inf saturate to +-6. */
uint8_t nvfp4moe_e2m1_encode(float x);
/* Decodes the low 4 bits of code. */
float   nvfp4moe_e2m1_decode(uint8_t code);
/* FP8 E4M3 "fn": RNE, saturating to +-448 (Inf too); NaN -> 0x7F. */
uint8_t nvfp4moe_e4m3_encode(float x);
/* Exact; 0x7F and 0xFF decode to NaN. */
float   nvfp4moe_e4m3_decode(uint8_t code);

/* Quantizes x [rows, cols] (cols % 16 == 0) with vLLM's reference quantizer, in float32, per block
 * of 16 along a row:
 *     s   = e4m3_decode(e4m3_encode(clamp(global_scale * amax / 6, -448, 448)))
 *     inv = s == 0 ? 0 : 1 / (s / global_scale)
 *     q   = e2m1_encode(clamp(x * inv, -6, 6))
 * packed: [rows, cols/2], element 2j in the low nibble, 2j+1 in the high nibble.
 * scales: [rows, cols/16] E4M3 codes. global_scale must be finite and > 0. */
nvfp4moe_status nvfp4moe_quantize(const float *x, int64_t rows, int64_t cols, float global_scale,
                                  uint8_t *packed, uint8_t *scales);

/* out [rows, cols] = e2m1_decode(q) * e4m3_decode(sf) * scale_2 (ModelOpt: scale_2 = 1/global_scale). */
nvfp4moe_status nvfp4moe_dequantize(const uint8_t *packed, const uint8_t *scales, int64_t rows,
                                    int64_t cols, float scale_2, float *out);

/* Number of bytes of the 128x4-swizzled scale layout of a [rows, kblocks] scale matrix:
 * round_up(rows, 128) * round_up(kblocks, 4). */
size_t nvfp4moe_swizzled_scales_size(int64_t rows, int64_t kblocks);

/* linear [rows, kblocks] -> swizzled (CUTLASS/FlashInfer 128x4 layout, zero padded). The byte of
 * (m, kb) lands at (m/128)*(Kp/4)*512 + (kb/4)*512 + (m%32)*16 + ((m/32)%4)*4 + kb%4, Kp =
 * round_up(kblocks, 4). swizzled must hold nvfp4moe_swizzled_scales_size(rows, kblocks) bytes. */
nvfp4moe_status nvfp4moe_swizzle_scales(const uint8_t *linear, int64_t rows, int64_t kblocks,
                                        uint8_t *swizzled);
/* The inverse: reads the [rows, kblocks] part of a swizzled matrix back into linear. */
nvfp4moe_status nvfp4moe_unswizzle_scales(const uint8_t *swizzled, int64_t rows, int64_t kblocks,
                                          uint8_t *linear);

/* bf16 / fp16 conversions (round to nearest even; NaN stays NaN). */
uint16_t nvfp4moe_bf16_from_float(float x);
float    nvfp4moe_bf16_to_float(uint16_t h);
uint16_t nvfp4moe_fp16_from_float(float x);
float    nvfp4moe_fp16_to_float(uint16_t h);

// ---- enumerations with stable names ----

typedef enum nvfp4moe_dtype {
    NVFP4MOE_DTYPE_BF16 = 0,
    NVFP4MOE_DTYPE_FP16 = 1,
    NVFP4MOE_DTYPE_F32  = 2,
} nvfp4moe_dtype;

typedef enum nvfp4moe_activation {   /* names as vLLM's MoEActivation values */
    NVFP4MOE_ACT_SILU = 0,            /* "silu": silu(g) * u, optional swiglu_limit clamp */
    NVFP4MOE_ACT_GELU,                /* "gelu" */
    NVFP4MOE_ACT_GELU_TANH,           /* "gelu_tanh" (alias "gelu_pytorch_tanh") */
    NVFP4MOE_ACT_RELU2,               /* "relu2": relu(g)^2 * u */
    NVFP4MOE_ACT_SWIGLUOAI,           /* "swigluoai": gpt-oss, interleaved [g0,u0,g1,u1,...] */
    NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE, /* "swigluoai_uninterleave": halves, needs swiglu_limit */
    NVFP4MOE_ACT_SWIGLUSTEP,          /* "swiglustep": min(silu(g), 7) * clamp(u, -7, 7) */
    NVFP4MOE_ACT_SITU,                /* "situ": Kimi SiTU-GLU */
    NVFP4MOE_ACT_SILU_NO_MUL,         /* "silu_no_mul" (non-gated from here on) */
    NVFP4MOE_ACT_GELU_NO_MUL,         /* "gelu_no_mul" */
    NVFP4MOE_ACT_GELU_TANH_NO_MUL,    /* "gelu_tanh_no_mul" */
    NVFP4MOE_ACT_RELU2_NO_MUL,        /* "relu2_no_mul" */
    NVFP4MOE_ACT_COUNT
} nvfp4moe_activation;

typedef enum nvfp4moe_routing {      /* FlashInfer RoutingMethodType where one exists */
    NVFP4MOE_ROUTING_SOFTMAX_TOPK = 0,     /* "softmax": softmax -> top-k (Default) */
    NVFP4MOE_ROUTING_RENORMALIZE,          /* "renormalize": top-k -> softmax over the k */
    NVFP4MOE_ROUTING_DEEPSEEK_V3,          /* "deepseek_v3": grouped top-k, bias, scaling */
    NVFP4MOE_ROUTING_LLAMA4,               /* "llama4": top-1 then sigmoid, weight on input */
    NVFP4MOE_ROUTING_RENORMALIZE_NAIVE,    /* "renormalize_naive": softmax -> top-k -> renorm */
    NVFP4MOE_ROUTING_SIGMOID_RENORM,       /* "sigmoid_renorm": sigmoid -> top-k -> renorm */
    NVFP4MOE_ROUTING_MINIMAX2,             /* "minimax2": sigmoid + bias selects, renorm */
    NVFP4MOE_ROUTING_SIGMOID,              /* "sigmoid": sigmoid -> top-k */
    NVFP4MOE_ROUTING_SIMULATED,            /* "simulated": seeded uniform experts, weight 1/k */
    NVFP4MOE_ROUTING_COUNT
} nvfp4moe_routing;

typedef enum nvfp4moe_scheme {
    NVFP4MOE_SCHEME_W4A4 = 0,          /* "w4a4": NVFP4 weights, NVFP4 dynamic activations, static global scale */
    NVFP4MOE_SCHEME_W4A4_PER_TOKEN,    /* "w4a4-per-token": activation global scale per token */
    NVFP4MOE_SCHEME_W4A16,             /* "w4a16": activations stay bf16/fp16 */
    NVFP4MOE_SCHEME_W4A8_MXFP8,        /* "w4a8-mxfp8": MXFP8 (E4M3 + E8M0 per 32) activations */
    NVFP4MOE_SCHEME_COUNT
} nvfp4moe_scheme;

/* Name of a value ("bf16", "silu", "deepseek_v3", "w4a4"...); "?" for an out-of-range value. */
const char *nvfp4moe_dtype_name(nvfp4moe_dtype d);
const char *nvfp4moe_activation_name(nvfp4moe_activation a);
const char *nvfp4moe_routing_name(nvfp4moe_routing r);
const char *nvfp4moe_scheme_name(nvfp4moe_scheme s);
/* Parse a name (case-insensitive, '-' and '_' equivalent, aliases accepted). NOT_FOUND lists the
 * accepted names in nvfp4moe_last_error(). */
nvfp4moe_status nvfp4moe_dtype_parse(const char *s, nvfp4moe_dtype *out);
nvfp4moe_status nvfp4moe_activation_parse(const char *s, nvfp4moe_activation *out);
nvfp4moe_status nvfp4moe_routing_parse(const char *s, nvfp4moe_routing *out);
nvfp4moe_status nvfp4moe_scheme_parse(const char *s, nvfp4moe_scheme *out);

/* True for the gated ("act_and_mul") activations: GEMM1 produces N1 = 2*I columns. */
bool nvfp4moe_activation_is_gated(nvfp4moe_activation a);

// ---- deployment config ----

typedef struct nvfp4moe_parallel {
    int32_t tp_size;        /* tensor parallel size (default 1) */
    int32_t dp_size;        /* data parallel size (default 1) */
    int32_t ep_size;        /* expert parallel size (default 1); > 1 means EP is used */
    int32_t ep_rank;        /* this rank, 0 <= ep_rank < ep_size */
    char    all2all[32];    /* all2all backend: "" (none), "allgather_reducescatter", "naive",
                               "deepep_high_throughput", "deepep_low_latency", "nixl_ep",
                               "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided" */
    bool    eplb;           /* expert-parallel load balancer */
} nvfp4moe_parallel;

typedef struct nvfp4moe_config {
    int32_t num_experts;        /* E (global) */
    int32_t top_k;              /* experts per token */
    int32_t hidden_size;        /* H, multiple of 16 */
    int32_t intermediate_size;  /* I (per expert), multiple of 16 */
    nvfp4moe_dtype in_dtype;    /* hidden states: bf16 or fp16 (f32 for the CPU backends) */
    nvfp4moe_dtype out_dtype;   /* output */
    nvfp4moe_activation activation;
    bool  has_swiglu_limit;     /* swiglu_limit is optional: the clamp only applies when set */
    float swiglu_limit;
    float swiglu_alpha;         /* NaN = the activation's default (swigluoai 1.702, uninterleave 1.0) */
    float swiglu_beta;          /* NaN = default (uninterleave 0.0; swigluoai uses a fixed +1) */
    float situ_beta;            /* SiTU beta (default 4) */
    float situ_linear_beta;     /* SiTU linear beta (default 25; <= 0 passes the up half through) */
    nvfp4moe_routing routing;
    int32_t n_group;            /* deepseek_v3: expert groups (E % n_group == 0) */
    int32_t topk_group;         /* deepseek_v3: groups kept */
    float routed_scaling_factor;/* multiplies the final weights (deepseek_v3, minimax2); default 1 */
    bool  has_correction_bias;  /* e_score_correction_bias present (deepseek_v3, minimax2) */
    nvfp4moe_dtype router_logits_dtype; /* bf16, fp16 or f32 (default f32) */
    bool  apply_router_weight_on_input; /* needs top_k == 1 */
    nvfp4moe_scheme scheme;
    nvfp4moe_parallel parallel;
    bool  has_bias;             /* expert biases */
    bool  lora;                 /* LoRA enabled on the experts */
    bool  batch_invariant;      /* VLLM_BATCH_INVARIANT */
    bool  requantization_source;/* the layer is a requantization source (vLLM: EMULATION at once) */
    bool  force_a16;            /* VLLM_B12X_MOE_FP4_FORCE_A16: B12X runs with bf16 activations */
    char  moe_backend[32];      /* "auto" or a vLLM moe_backend name ("marlin", "flashinfer_trtllm",
                                   ...) or one of ours ("cpu_reference") */
    uint64_t seed;              /* seed of the "simulated" routing method */
} nvfp4moe_config;

/* Defaults: the MoE layer of Qwen3-30B-A3B (E=128, top-8, H=2048, I=768), bf16, silu, no clamp,
 * renormalize routing, W4A4, tp=dp=ep=1, moe_backend "auto". */
void nvfp4moe_config_init(nvfp4moe_config *cfg);

/* Checks every field and every combination the layer and the oracle rely on. On failure the
 * message names the field, e.g. "hidden_size=100 must be a multiple of 16". */
nvfp4moe_status nvfp4moe_config_validate(const nvfp4moe_config *cfg);

/* Columns of GEMM1's output: 2*I for gated activations, I otherwise. */
int32_t nvfp4moe_config_n1(const nvfp4moe_config *cfg);

/* The clamp/alpha/beta an activation uses once defaults are resolved. has_limit false: no clamp. */
typedef struct nvfp4moe_act_params {
    bool  has_limit;
    float limit, alpha, beta;
    float situ_beta, situ_linear_beta;
} nvfp4moe_act_params;
nvfp4moe_act_params nvfp4moe_config_act_params(const nvfp4moe_config *cfg);

/* One line describing the config ("E=128 top_k=8 H=2048 I=768 bf16 silu renormalize w4a4"). */
size_t nvfp4moe_config_describe(const nvfp4moe_config *cfg, char *buf, size_t len);

// ---- layer weights ----
//
// The canonical host layout, per expert e (ModelOpt naming, dequantization form):
//   w13        [E, N1, H/2]  packed E2M1; rows [0, I) gate (w1), [I, 2I) up (w3). For swigluoai
//                            the rows are interleaved as in gpt-oss: g0, u0, g1, u1, ...
//   w13_scale  [E, N1, H/16] E4M3 block scales, linear (not swizzled)
//   w13_scale_2 [E]          per-expert dequantization scale (1/global_scale)
//   w13_input_scale [E]      activation dequantization scale (ModelOpt input_scale; W4A4 only)
//   w2         [E, H, I/2], w2_scale [E, H, I/16], w2_scale_2 [E], w2_input_scale [E]
//   w13_bias [E, N1], w2_bias [E, H]          float, only when cfg.has_bias
//   correction_bias [E]                       float, only when cfg.has_correction_bias
typedef struct nvfp4moe_weights {
    const uint8_t *w13;
    const uint8_t *w13_scale;
    const float   *w13_scale_2;
    const float   *w13_input_scale;
    const uint8_t *w2;
    const uint8_t *w2_scale;
    const float   *w2_scale_2;
    const float   *w2_input_scale;
    const float   *w13_bias;
    const float   *w2_bias;
    const float   *correction_bias;
} nvfp4moe_weights;

/* Checks that every tensor the config needs is present (non-NULL) and that scales are finite and
 * positive. The message names the tensor and the expert. */
nvfp4moe_status nvfp4moe_weights_validate(const nvfp4moe_config *cfg, const nvfp4moe_weights *w);

/* An owning container: a config plus weights in host memory. */
typedef struct nvfp4moe_layer {
    nvfp4moe_config  cfg;
    nvfp4moe_weights w;
    void *storage_;   /* private */
} nvfp4moe_layer;

/* Builds a layer of shape cfg with random weights: each expert's bf16 weights are drawn
 * N(0, 1/sqrt(fan_in)), quantized to NVFP4 the ModelOpt way (global_scale = 448*6/amax per expert
 * and tensor), with input scales calibrated on random unit-variance activations. Deterministic in
 * seed. Free with nvfp4moe_layer_free. */
nvfp4moe_status nvfp4moe_layer_random(const nvfp4moe_config *cfg, uint64_t seed, nvfp4moe_layer **out);
void nvfp4moe_layer_free(nvfp4moe_layer *layer);

// ---- running a layer ----

/* The tensors of one forward call. Which memory (host or device) the pointers name depends on the
 * backend: see nvfp4moe_plan_uses_device_memory. */
typedef struct nvfp4moe_io {
    int64_t      num_tokens;     /* M >= 0 */
    const void  *hidden;         /* [M, H] cfg.in_dtype */
    const void  *router_logits;  /* [M, E] cfg.router_logits_dtype; NULL when topk_ids is given */
    const int32_t *topk_ids;     /* [M, top_k] precomputed routing, or NULL */
    const float *topk_weights;   /* [M, top_k], with topk_ids */
    void        *output;         /* [M, H] cfg.out_dtype */
    void        *workspace;      /* nvfp4moe_plan_workspace_size(plan, M) bytes (may be NULL if 0) */
    size_t       workspace_size;
} nvfp4moe_io;

/* Routing on the CPU, exactly as the reference does it. logits [M, E] float, correction_bias [E]
 * (NULL unless cfg.has_correction_bias). Writes topk_ids [M, top_k] (ordered by descending
 * selection score, ties to the lower expert index) and topk_weights [M, top_k]. */
nvfp4moe_status nvfp4moe_route(const nvfp4moe_config *cfg, const float *logits, int64_t num_tokens,
                               const float *correction_bias, int32_t *topk_ids, float *topk_weights);

/* The float64 CPU reference of the whole layer (the spec every backend is tested against).
 * Host pointers; io->workspace is not used. */
nvfp4moe_status nvfp4moe_reference_forward(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                           const nvfp4moe_io *io);

// ---- devices ----

typedef struct nvfp4moe_device {
    bool    is_cuda;     /* false: a CPU */
    int32_t sm;          /* compute capability as major*10 + minor (90 = sm_90); 0 for a CPU */
    int32_t sm_count;    /* multiprocessors, 0 if unknown */
    int32_t ordinal;     /* CUDA device index; -1 for a CPU or a what-if device */
    bool    detected;    /* read from real hardware (false: given by name) */
    char    name[64];    /* "NVIDIA H200", "cpu", or the name it was given as */
} nvfp4moe_device;

/* The first CUDA GPU if this build has CUDA and one is present, else the CPU. Never fails for
 * lack of a GPU. */
nvfp4moe_status nvfp4moe_device_detect(nvfp4moe_device *dev);
/* "sm_90" / "sm90" (any sm_XY or sm_XYZ) or a name: a100, l40s, h100, h200, b200, gb200, b300,
 * rtx5090, rtx-pro-6000, dgx-spark, cpu. */
nvfp4moe_status nvfp4moe_device_parse(const char *s, nvfp4moe_device *dev);
/* "sm_90" or "cpu": the form vLLM's messages use. */
const char *nvfp4moe_device_str(const nvfp4moe_device *dev, char *buf, size_t len);

// ---- the oracle: backend selection ----
//
// (declarations owned by src/oracle.c; see the README's "select" section)

/* Libraries whose kernels this build does not contain; --installed plans as if they were present. */
#define NVFP4MOE_LIB_FLASHINFER  (1u << 0)
#define NVFP4MOE_LIB_B12X        (1u << 1)
#define NVFP4MOE_LIB_HUMMING     (1u << 2)
#define NVFP4MOE_LIB_VLLM_CUTLASS (1u << 3)  /* vLLM's own CUTLASS FP4 grouped GEMM (_C ops) */
#define NVFP4MOE_LIB_ALL         0xFFFFFFFFu

typedef struct nvfp4moe_oracle_options {
    bool     installed_set;  /* false: availability is what this build contains */
    uint32_t installed;      /* NVFP4MOE_LIB_* mask, used when installed_set; also makes MARLIN and
                                EMULATION count as present */
    bool     vllm_only;      /* only vLLM's backends: decisions identical to vLLM */
} nvfp4moe_oracle_options;

typedef enum nvfp4moe_verdict {
    NVFP4MOE_VERDICT_CHOSEN = 0,      /* this kernel was selected */
    NVFP4MOE_VERDICT_SUPPORTED,       /* supported, but a higher-priority one was chosen */
    NVFP4MOE_VERDICT_REJECTED,        /* tried: reason says why not */
    NVFP4MOE_VERDICT_NOT_IN_LIST,     /* not a candidate (explicit-only, clamp filter, ...): reason */
} nvfp4moe_verdict;

#define NVFP4MOE_MAX_CANDIDATES 32

typedef struct nvfp4moe_candidate {
    char backend[40];     /* "MARLIN" */
    char kernel[48];      /* "MarlinExperts" */
    nvfp4moe_verdict verdict;
    bool supported;       /* the kernel's predicate said yes */
    char reason[256];     /* vLLM's wording: "kernel does not support current device sm_90" */
} nvfp4moe_candidate;

typedef struct nvfp4moe_report {
    char backend[40];     /* chosen backend, "" if none */
    char kernel[48];      /* chosen kernel class, "" if none */
    char log[640];        /* "Using 'MARLIN' NvFp4 MoE backend out of potential backends: [...]." */
    char error_kind[24];  /* "" / "ValueError" / "NotImplementedError" */
    char error[640];      /* the exception's message */
    char device[16];      /* "sm_90" / "cpu" */
    int32_t n_candidates;
    nvfp4moe_candidate candidates[NVFP4MOE_MAX_CANDIDATES];
} nvfp4moe_report;

/* Chooses the backend and kernel for cfg on dev (NULL: detect) as vLLM's select_nvfp4_moe_backend
 * does, recording every candidate's verdict. Returns OK when one was chosen; INVALID_ARGUMENT when
 * the config is invalid; NOT_FOUND ("ValueError", unknown moe_backend name) or UNSUPPORTED
 * ("ValueError" for an explicit request, "NotImplementedError" for auto) otherwise. The report is
 * filled in every case; it is a plain value: nothing to free. */
nvfp4moe_status nvfp4moe_select(const nvfp4moe_config *cfg, const nvfp4moe_device *dev,
                                const nvfp4moe_oracle_options *opt, nvfp4moe_report *report);

/* Renders the report as the text `nvfp4moe select` prints. snprintf semantics: returns the length
 * the full text needs; writes at most len bytes, NUL-terminated. */
size_t nvfp4moe_report_render(const nvfp4moe_report *report, char *buf, size_t len);

// ---- plans: a backend prepared for one layer ----

typedef struct nvfp4moe_plan nvfp4moe_plan;

typedef struct nvfp4moe_plan_options {
    const char *backend;            /* NULL: cfg->moe_backend ("auto": the oracle decides) */
    const nvfp4moe_device *device;  /* NULL: detect */
    bool weights_on_device;         /* the weights' pointers are CUDA device pointers */
    const nvfp4moe_oracle_options *oracle; /* NULL: defaults */
} nvfp4moe_plan_options;

/* Selects a backend (as nvfp4moe_select) and prepares it for these weights: converts the weights
 * into the backend's layout once (the plan keeps its own copy; w may be freed afterwards). */
nvfp4moe_status nvfp4moe_plan_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                     const nvfp4moe_plan_options *opt, nvfp4moe_plan **out);
/* The backend and kernel that run ("CPU_REFERENCE", "MARLIN", ...). */
const char *nvfp4moe_plan_backend(const nvfp4moe_plan *plan);
const char *nvfp4moe_plan_kernel(const nvfp4moe_plan *plan);
/* The oracle's report from creation. */
const nvfp4moe_report *nvfp4moe_plan_report(const nvfp4moe_plan *plan);
/* True when forward() takes CUDA device pointers and a cudaStream_t. */
bool nvfp4moe_plan_uses_device_memory(const nvfp4moe_plan *plan);
/* The numerics the backend computes with (MARLIN runs a W4A4 checkpoint as W4A16). */
nvfp4moe_scheme nvfp4moe_plan_effective_scheme(const nvfp4moe_plan *plan);
/* Workspace bytes a forward of num_tokens tokens needs. */
size_t nvfp4moe_plan_workspace_size(const nvfp4moe_plan *plan, int64_t num_tokens);
/* Runs the layer. stream: a cudaStream_t for device plans (NULL = default stream), ignored
 * otherwise. Device plans do not allocate, synchronize or branch on data on the host. */
nvfp4moe_status nvfp4moe_plan_forward(nvfp4moe_plan *plan, const nvfp4moe_io *io, void *stream);
void nvfp4moe_plan_destroy(nvfp4moe_plan *plan);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_H
