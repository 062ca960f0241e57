/*
 * nvfp4moe.h - the public header of libnvfp4moe: its stable API.
 *
 * The API here keeps its names, arguments and meaning within a major version. Expert parallelism
 * and the benchmark hooks are in nvfp4moe_experimental.h, which may change in any release.
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
 *  - Nothing in the library exits or aborts on user input. Every *_free / *_destroy / *_close
 *    function accepts NULL and ignores a pointer that is not a live object of its type (one freed
 *    already, or never returned by the library).
 *
 * Threads. The library's only shared state is the set of live objects (behind a mutex) and the
 * last error, which is per thread. So:
 *  - any function may run on many threads at once as long as they work on different objects;
 *  - an object that functions only read (a config, weights, a layer's tensors, a model_info, an
 *    st_file or st_model and their tensors, a ckpt_layer, a float_layer, a report) may be shared by
 *    any number of threads at once: the readers use pread, not a shared file position;
 *  - an object that a function changes (a plan in nvfp4moe_plan_forward, a writer being added to)
 *    must be used by one thread at a time: to run a layer on several threads at once, give each
 *    thread its own plan (plans made from the same weights share nothing; each keeps its own copy);
 *  - nothing may be freed while another thread still uses it.
 * CPU_FAST runs a forward on worker threads of its own: one pool per thread count, created with the
 * first plan that asks for it, shared by every plan with that count and ended with the last of them;
 * forwards of plans sharing a pool take turns. Workers poll for about a millisecond after a forward,
 * then sleep.
 */
#ifndef NVFP4MOE_H
#define NVFP4MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the library's exported functions: the shared library exports these and nothing else. */
#if defined(__GNUC__) || defined(__clang__)
#define NVFP4MOE_API __attribute__((visibility("default")))
#else
#define NVFP4MOE_API
#endif

#define NVFP4MOE_VERSION_MAJOR 0
#define NVFP4MOE_VERSION_MINOR 1
#define NVFP4MOE_VERSION_PATCH 0

/* "0.1.0 (cuda)" or "0.1.0 (cpu-only)": the version and whether CUDA backends were compiled in. */
NVFP4MOE_API const char *nvfp4moe_version(void);

/* True when this build contains the CUDA backends (it may still run on a machine without a GPU). */
NVFP4MOE_API bool nvfp4moe_built_with_cuda(void);

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
NVFP4MOE_API const char *nvfp4moe_status_str(nvfp4moe_status s);

/* The message of the last failing call made by this thread ("" if none). The pointer stays valid
 * until the next failing call on the same thread. */
NVFP4MOE_API const char *nvfp4moe_last_error(void);

// ---- NVFP4 codec ----
//
// E2M1 code: bit 3 = sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
// E4M3 ("fn"): bias 7, max 448, subnormals, no infinity, 0x7F/0xFF = NaN.

/* RNE with ties to even on the E2M1 grid, saturating at +-6; sign in bit 3 (-0 gives 0x8).
 * NaN encodes as +0 (0x0); +-Inf saturate to +-6. */
NVFP4MOE_API uint8_t nvfp4moe_e2m1_encode(float x);
/* Decodes the low 4 bits of code. */
NVFP4MOE_API float   nvfp4moe_e2m1_decode(uint8_t code);
/* FP8 E4M3 "fn": RNE, saturating to +-448 (Inf too); NaN -> 0x7F. */
NVFP4MOE_API uint8_t nvfp4moe_e4m3_encode(float x);
/* Exact; 0x7F and 0xFF decode to NaN. */
NVFP4MOE_API float   nvfp4moe_e4m3_decode(uint8_t code);

/* The NVFP4 block quantizers, by whose formula they follow. All three compute, per block of 16
 * along a row, an E4M3 block scale from the block's amax and E2M1 codes (RNE on the E2M1 grid,
 * saturating at 6), in float32 with IEEE operations in the source's order; they differ in how the
 * scale and its reciprocal are formed, and therefore at E2M1 and E4M3 rounding ties (common on
 * bf16 data), and in the per-tensor scale they take (tensor_scale):
 *
 *   VLLM_REF     vLLM's ref_nvfp4_quant (quantization/utils/nvfp4_emulation_utils.py); tensor_scale
 *                is the global scale gs (quantization form, 1/scale_2):
 *                    s   = e4m3(clamp(gs * (amax * (float)(1/6)), -448, 448))
 *                    inv = s * (1/gs) == 0 ? 1/1e8 : 1 / (s * (1/gs))
 *                    q   = e2m1(clamp(x * inv, -6, 6))
 *                vLLM's CUDA scaled_fp4_quant has the same structure with approximate reciprocals.
 *   VLLM_TRITON  the Triton quantize-dequantize kernel vLLM's EMULATION backend runs on GPUs
 *                (_nvfp4_quant_dequant_kernel, same file); tensor_scale is gs:
 *                    s = as VLLM_REF,  inv = s == 0 ? 0 : gs / s,  q = e2m1(clamp(x * inv, -6, 6))
 *                Triton emits its division as div.full.f32, which can differ from this correctly
 *                rounded one in the last bit.
 *   MODELOPT     ModelOpt's NVFP4QTensor export (the weights of ModelOpt checkpoints); tensor_scale
 *                is scale_2 (dequantization form, ModelOpt's weights_scaling_factor_2):
 *                    d   = amax / (6 * scale_2), 1 where it is 0;  sf = e4m3(d) with torch's
 *                          conversion: no clamp, NaN (0x7F) above 464
 *                    q   = e2m1(x / (sf * scale_2)), the sign bit set for x < 0 only, NaN -> 7
 *
 * A block holding a NaN gets the NaN scale code 0x7F in every quantizer. */
typedef enum nvfp4moe_quantizer {
    NVFP4MOE_QUANTIZER_VLLM_REF = 0,     /* "vllm_ref" */
    NVFP4MOE_QUANTIZER_VLLM_TRITON = 1,  /* "vllm_triton" */
    NVFP4MOE_QUANTIZER_MODELOPT = 2,     /* "modelopt" */
    NVFP4MOE_QUANTIZER_COUNT
} nvfp4moe_quantizer;

/* "vllm_ref", "vllm_triton", "modelopt" ("?" out of range). */
NVFP4MOE_API const char *nvfp4moe_quantizer_name(nvfp4moe_quantizer q);

/* Quantizes x [rows, cols] (cols % 16 == 0) with quantizer q.
 * packed: [rows, cols/2], element 2j in the low nibble, 2j+1 in the high nibble.
 * scales: [rows, cols/16] E4M3 codes. tensor_scale (see nvfp4moe_quantizer) must be finite and > 0.
 * SHAPE when cols is not a positive multiple of 16, rows is negative, or rows x cols floats
 * overflow 64-bit sizes. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_quantize_as(nvfp4moe_quantizer q, const float *x, int64_t rows, int64_t cols,
                                                  float tensor_scale, uint8_t *packed, uint8_t *scales);

/* nvfp4moe_quantize_as(NVFP4MOE_QUANTIZER_VLLM_REF, ...): bit-exact with vLLM's ref_nvfp4_quant,
 * ties included. global_scale = 1/scale_2. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_quantize(const float *x, int64_t rows, int64_t cols, float global_scale,
                                               uint8_t *packed, uint8_t *scales);

/* out [rows, cols] = e2m1_decode(q) * e4m3_decode(sf) * scale_2, rounded once (e2m1 * e4m3 is
 * exact). vLLM's and ModelOpt's dequantizers round twice, e2m1 * (e4m3 * scale_2), and can differ
 * in the last bit. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_dequantize(const uint8_t *packed, const uint8_t *scales, int64_t rows,
                                                 int64_t cols, float scale_2, float *out);

/* Number of bytes of the 128x4-swizzled scale layout of a [rows, kblocks] scale matrix:
 * round_up(rows, 128) * round_up(kblocks, 4); 0 when rows or kblocks is not positive or the size
 * does not fit a size_t (the (un)swizzle functions then return SHAPE). */
NVFP4MOE_API size_t nvfp4moe_swizzled_scales_size(int64_t rows, int64_t kblocks);

/* linear [rows, kblocks] -> swizzled (CUTLASS/FlashInfer 128x4 layout, zero padded). The byte of
 * (m, kb) lands at (m/128)*(Kp/4)*512 + (kb/4)*512 + (m%32)*16 + ((m/32)%4)*4 + kb%4, Kp =
 * round_up(kblocks, 4). swizzled must hold nvfp4moe_swizzled_scales_size(rows, kblocks) bytes. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_swizzle_scales(const uint8_t *linear, int64_t rows, int64_t kblocks,
                                                     uint8_t *swizzled);
/* The inverse: reads the [rows, kblocks] part of a swizzled matrix back into linear. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_unswizzle_scales(const uint8_t *swizzled, int64_t rows, int64_t kblocks,
                                                       uint8_t *linear);

/* bf16 / fp16 conversions (round to nearest even; NaN stays NaN). */
NVFP4MOE_API uint16_t nvfp4moe_bf16_from_float(float x);
NVFP4MOE_API float    nvfp4moe_bf16_to_float(uint16_t h);
NVFP4MOE_API uint16_t nvfp4moe_fp16_from_float(float x);
NVFP4MOE_API float    nvfp4moe_fp16_to_float(uint16_t h);

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
NVFP4MOE_API const char *nvfp4moe_dtype_name(nvfp4moe_dtype d);
NVFP4MOE_API const char *nvfp4moe_activation_name(nvfp4moe_activation a);
NVFP4MOE_API const char *nvfp4moe_routing_name(nvfp4moe_routing r);
NVFP4MOE_API const char *nvfp4moe_scheme_name(nvfp4moe_scheme s);
/* Parse a name (case-insensitive, '-' and '_' equivalent, aliases accepted). NOT_FOUND lists the
 * accepted names in nvfp4moe_last_error(). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_dtype_parse(const char *s, nvfp4moe_dtype *out);
NVFP4MOE_API nvfp4moe_status nvfp4moe_activation_parse(const char *s, nvfp4moe_activation *out);
NVFP4MOE_API nvfp4moe_status nvfp4moe_routing_parse(const char *s, nvfp4moe_routing *out);
NVFP4MOE_API nvfp4moe_status nvfp4moe_scheme_parse(const char *s, nvfp4moe_scheme *out);

/* Converts n values of dtype at src (bf16/fp16 as uint16_t bit patterns, or f32) to float, and
 * back (round to nearest even). A NULL src or dst does nothing. */
NVFP4MOE_API void nvfp4moe_to_float(nvfp4moe_dtype dt, const void *src, int64_t n, float *dst);
NVFP4MOE_API void nvfp4moe_from_float(nvfp4moe_dtype dt, const float *src, int64_t n, void *dst);
/* Bytes of one value of dt. */
NVFP4MOE_API size_t nvfp4moe_dtype_size(nvfp4moe_dtype dt);

/* Fills dst with n standard-normal values in dtype dt, deterministic in seed (test and demo data).
 * A NULL dst does nothing. */
NVFP4MOE_API void nvfp4moe_fill_normal(void *dst, nvfp4moe_dtype dt, int64_t n, uint64_t seed);

/* True for the gated ("act_and_mul") activations: GEMM1 produces N1 = 2*I columns. */
NVFP4MOE_API bool nvfp4moe_activation_is_gated(nvfp4moe_activation a);

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

/* The largest hidden or intermediate size a config may have (no model comes near it; it keeps
 * 2*I and every tensor size of a layer well inside 64 bits). */
#define NVFP4MOE_MAX_DIM (1 << 20)

typedef struct nvfp4moe_config {
    int32_t num_experts;        /* E (global) */
    int32_t top_k;              /* experts per token */
    int32_t hidden_size;        /* H, multiple of 16, at most NVFP4MOE_MAX_DIM */
    int32_t intermediate_size;  /* I (per expert), multiple of 16, at most NVFP4MOE_MAX_DIM */
    nvfp4moe_dtype in_dtype;    /* hidden states: bf16 or fp16 (f32 for the CPU backends) */
    nvfp4moe_dtype out_dtype;   /* output */
    nvfp4moe_activation activation;
    bool  has_swiglu_limit;     /* swiglu_limit is optional: the clamp only applies when set */
    double swiglu_limit;        /* as the model gives it (vLLM prints this Python float in its
                                   messages); the kernels clamp with it rounded to float */
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
NVFP4MOE_API void nvfp4moe_config_init(nvfp4moe_config *cfg);

/* Checks every field and every combination the layer and the oracle rely on. On failure the
 * message names the field, e.g. "hidden_size=100 must be a multiple of 16". */
NVFP4MOE_API nvfp4moe_status nvfp4moe_config_validate(const nvfp4moe_config *cfg);

/* Columns of GEMM1's output: 2*I for gated activations, I otherwise (0 when 2*I does not fit an
 * int32_t, which only a config that fails nvfp4moe_config_validate can have). */
NVFP4MOE_API int32_t nvfp4moe_config_n1(const nvfp4moe_config *cfg);

/* The clamp/alpha/beta an activation uses once defaults are resolved. has_limit false: no clamp. */
typedef struct nvfp4moe_act_params {
    bool  has_limit;
    float limit, alpha, beta;
    float situ_beta, situ_linear_beta;
} nvfp4moe_act_params;
NVFP4MOE_API nvfp4moe_act_params nvfp4moe_config_act_params(const nvfp4moe_config *cfg);

/* One line describing the config ("E=128 top_k=8 H=2048 I=768 bf16 silu renormalize w4a4"). */
NVFP4MOE_API size_t nvfp4moe_config_describe(const nvfp4moe_config *cfg, char *buf, size_t len);

// ---- layer weights ----
//
// The canonical host layout, per expert e (ModelOpt naming, dequantization form):
//   w13        [E, N1, H/2]  packed E2M1; rows [0, I) gate (w1), [I, 2I) up (w3). For swigluoai
//                            the rows are interleaved as in gpt-oss: g0, u0, g1, u1, ...
//   w13_scale  [E, N1, H/16] E4M3 block scales, linear (not swizzled)
//   w13_scale_2 [E]          per-expert dequantization scale (1/global_scale) of the gate rows, and
//                            of every row when w13_up_scale_2 is NULL or the activation is not gated
//   w13_up_scale_2 [E]       optional: the up rows' own dequantization scale (gated activations),
//                            for checkpoints whose gate and up carry different weight_scale_2;
//                            every backend applies each half's scale exactly. NULL: w13_scale_2
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
    const float   *w13_up_scale_2;   /* [E] or NULL: see the layout above */
} nvfp4moe_weights;

/* Checks that every tensor the config needs is present (non-NULL) and that scales are finite and
 * positive. The message names the tensor and the expert. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_weights_validate(const nvfp4moe_config *cfg, const nvfp4moe_weights *w);

/* An owning container: a config plus weights in host memory. */
typedef struct nvfp4moe_layer {
    nvfp4moe_config  cfg;
    nvfp4moe_weights w;
    void *storage_;   /* private */
} nvfp4moe_layer;

/* Builds a layer of shape cfg with random weights: each expert's bf16 weights are drawn
 * approximately normal (Irwin-Hall, 4 terms) with deviation 1/sqrt(fan_in), quantized to NVFP4 the ModelOpt way (global_scale = 448*6/amax per expert
 * and tensor), with input scales calibrated on random unit-variance activations. Deterministic in
 * seed. Free with nvfp4moe_layer_free. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_layer_random(const nvfp4moe_config *cfg, uint64_t seed, nvfp4moe_layer **out);
/* A layer holding a copy of w (host memory), so the caller's buffers may be freed. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_layer_copy(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                                 nvfp4moe_layer **out);
NVFP4MOE_API void nvfp4moe_layer_free(nvfp4moe_layer *layer);

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
 * selection score, ties to the lower expert index) and topk_weights [M, top_k]. A token whose
 * logits hold a NaN or an infinity gets NaN weights (and the ids 0..top_k-1). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_route(const nvfp4moe_config *cfg, const float *logits, int64_t num_tokens,
                                            const float *correction_bias, int32_t *topk_ids, float *topk_weights);

/* The float64 CPU reference of the whole layer (the spec every backend is tested against).
 * Host pointers; io->workspace is not used.
 *
 * Non-finite inputs: a token whose hidden state, or router logits (unless routing is "simulated",
 * which does not read them, or topk_ids are given), hold a NaN or an infinity gets an all-NaN output
 * row, and the call still returns OK; every other row is exactly what it would be without that
 * token. The host backends (CPU_REFERENCE, CPU_FAST) and host expert parallelism follow this rule.
 * Precomputed topk_weights must be finite (INVALID_ARGUMENT otherwise). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_reference_forward(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                                        const nvfp4moe_io *io);

// ---- devices ----

typedef struct nvfp4moe_device {
    bool    is_cuda;     /* false: a CPU */
    int32_t sm;          /* compute capability as major*10 + minor (90 = sm_90); 0 for a CPU */
    int32_t sm_count;    /* multiprocessors, 0 if unknown */
    int32_t ordinal;     /* CUDA device index; -1 for a CPU or a what-if device */
    bool    detected;    /* read from real hardware (false: given by name) */
    char    name[64];    /* "NVIDIA H200", "cpu", or the name it was given as ("h200", "sm_90") */
} nvfp4moe_device;

/* The first CUDA GPU if this build has CUDA and one is present, else the CPU. Never fails for
 * lack of a GPU, a driver or a CUDA runtime: any CUDA error means "the CPU" (INVALID_ARGUMENT only
 * for dev == NULL). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_device_detect(nvfp4moe_device *dev);
/* A what-if device: "sm_90" / "sm90" / "sm_100a" (a compute capability a GPU has; case-insensitive),
 * the capability as torch prints it ("9.0", "10.3"), or a product name: a100, a800, a30 (sm_80),
 * a10, a10g, a40, rtx3090 (sm_86), l4, l40, l40s, rtx4090 (sm_89), h100, h200, h20, h800, gh200
 * (sm_90), b100, b200, gb200 (sm_100), b300, gb300 (sm_103), rtx5090, rtx-pro-6000 (sm_120),
 * dgx-spark, gb10 (sm_121), cpu; also as nvidia-smi prints it ("NVIDIA H100 80GB HBM3": words after
 * the product are ignored). Spaces, '-' and '_' are equivalent. NOT_FOUND (listing the accepted
 * names or capabilities) for anything else; dev is written only on success. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_device_parse(const char *s, nvfp4moe_device *dev);
/* "sm_90" or "cpu" (dev NULL: "cpu"): the form vLLM's messages use. Writes at most len bytes into
 * buf and returns buf. */
NVFP4MOE_API const char *nvfp4moe_device_str(const nvfp4moe_device *dev, char *buf, size_t len);

// ---- the oracle: backend selection ----
//
// nvfp4moe_select mirrors vLLM's select_nvfp4_moe_backend (oracle/nvfp4.py) at the revision
// nvfp4moe_vllm_revision() names: the same backends, kernel classes, support predicates (checked
// in vLLM's order), auto priority list, SwiGLU clamp set, explicit-request path, and the log line,
// exception messages and reasons character for character. Our own backends (HOPPER_WGMMA, CPU_FAST,
// CPU_REFERENCE) join the list unless vllm_only is set. What vLLM would not say (the device's sm, our
// scheme names, a library this build lacks) goes into the separate detail fields. A kernel whose
// library this build does not contain is rejected where vLLM checks the library: in its device check
// for FlashInfer and b12x ("current device cuda", the library named in the detail), after the
// predicate otherwise; the what-if option `installed` plans as if those libraries were present.
// docs/select.md has the user's view.

/* The vLLM revision whose oracle and kernel classes nvfp4moe_select mirrors, in words. */
NVFP4MOE_API const char *nvfp4moe_vllm_revision(void);

/* Libraries whose kernels this build does not contain; --installed plans as if they were present. */
#define NVFP4MOE_LIB_FLASHINFER  (1u << 0)   /* "flashinfer" */
#define NVFP4MOE_LIB_B12X        (1u << 1)   /* "b12x" */
#define NVFP4MOE_LIB_HUMMING     (1u << 2)   /* "humming" */
#define NVFP4MOE_LIB_VLLM_CUTLASS (1u << 3)  /* "cutlass": vLLM's own CUTLASS FP4 grouped GEMM (_C ops) */
#define NVFP4MOE_LIB_ALL         0xFFFFFFFFu

/* Parses the --installed value: "all", "none", or a comma-separated list of the library names
 * above (case-insensitive). NOT_FOUND names the unknown entry and lists the accepted ones. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_oracle_libs_parse(const char *s, uint32_t *mask);

typedef struct nvfp4moe_oracle_options {
    bool     installed_set;  /* false: availability is what this build contains */
    uint32_t installed;      /* NVFP4MOE_LIB_* mask, used when installed_set; vLLM's MARLIN and
                                EMULATION then count as vLLM's, present on every GPU vLLM runs
                                them on. Otherwise our implementations count where their kernels
                                run, on a what-if GPU in a CPU-only build too (as a CUDA build
                                would run them) */
    bool     vllm_only;      /* only vLLM's backends: decisions identical to vLLM */
} nvfp4moe_oracle_options;

typedef enum nvfp4moe_verdict {
    NVFP4MOE_VERDICT_CHOSEN = 0,      /* this kernel was selected */
    NVFP4MOE_VERDICT_SUPPORTED,       /* supported, but a higher-priority one was chosen */
    NVFP4MOE_VERDICT_REJECTED,        /* tried: reason says why not */
    NVFP4MOE_VERDICT_NOT_IN_LIST,     /* not a candidate (explicit-only, clamp filter, ...): reason */
} nvfp4moe_verdict;

/* "chosen", "supported", "rejected", "not in list" ("?" out of range). */
NVFP4MOE_API const char *nvfp4moe_verdict_name(nvfp4moe_verdict v);

#define NVFP4MOE_MAX_CANDIDATES 32

typedef struct nvfp4moe_candidate {
    char backend[40];     /* "MARLIN" */
    char kernel[48];      /* "MarlinExperts" */
    nvfp4moe_verdict verdict;
    bool supported;       /* the kernel can run this config here: its predicate said yes and its
                             implementation is available (for NOT_IN_LIST: it would be) */
    char reason[512];     /* vLLM's words: "kernel does not support current device cuda"; for
                             NOT_IN_LIST why it was not a candidate, then what it would have said */
    char detail[256];     /* our context, never part of vLLM's words: "device sm_90 (h200)",
                             "scheme w4a16", a library this build lacks, ... ("" when none) */
} nvfp4moe_candidate;

typedef struct nvfp4moe_report {
    char backend[40];     /* chosen backend, "" if none */
    char kernel[48];      /* chosen kernel class, "" if none */
    char log[640];        /* "Using 'MARLIN' NvFp4 MoE backend out of potential backends: [...].",
                             exactly the line vLLM logs; "" when vLLM would log nothing: nothing
                             chosen, a requantization source, or one of our backends chosen */
    char error_kind[24];  /* "" / "ValueError" / "NotImplementedError" */
    char error[640];      /* the exception's message */
    char device[16];      /* "sm_90" / "cpu" */
    char requested[32];   /* cfg->moe_backend normalised (lower case, '-' -> '_'): "auto", "marlin" */
    char detail[384];     /* our note on the decision (never vLLM's words): when one of our backends
                             is chosen, what vLLM itself would do; "" when none */
    int32_t n_candidates;
    nvfp4moe_candidate candidates[NVFP4MOE_MAX_CANDIDATES]; /* every kernel, priority order */
} nvfp4moe_report;

/* Chooses the backend and kernel for cfg on dev (NULL: detect) as vLLM's select_nvfp4_moe_backend
 * does, recording every candidate's verdict. opt may be NULL (defaults: this build's libraries,
 * our backends included). Returns OK when one was chosen; INVALID_ARGUMENT when the config is
 * invalid (the report then holds no decision); NOT_FOUND ("ValueError", unknown moe_backend name)
 * or UNSUPPORTED ("ValueError" for an explicit request, "NotImplementedError" for auto) otherwise,
 * with the exception's message also in nvfp4moe_last_error(). The report is filled in every case;
 * it is a plain value (about 29 KiB): nothing to free. Pure: no allocation, no CUDA call unless
 * dev is NULL. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_select(const nvfp4moe_config *cfg, const nvfp4moe_device *dev,
                                             const nvfp4moe_oracle_options *opt, nvfp4moe_report *report);

/* Renders the report as the text `nvfp4moe select` prints: the chosen backend and kernel, the vLLM
 * log line or the exception, then a table of every candidate in priority order with its verdict
 * and reason. snprintf semantics: returns the length the full text needs; writes at most len
 * bytes, NUL-terminated (buf may be NULL when len is 0). */
NVFP4MOE_API size_t nvfp4moe_report_render(const nvfp4moe_report *report, char *buf, size_t len);

// ---- plans: a backend prepared for one layer ----

typedef struct nvfp4moe_plan nvfp4moe_plan;

typedef struct nvfp4moe_plan_options {
    const char *backend;            /* NULL: cfg->moe_backend ("auto": the oracle decides) */
    const nvfp4moe_device *device;  /* NULL: detect */
    bool weights_on_device;         /* the weights' pointers are CUDA device pointers */
    const nvfp4moe_oracle_options *oracle; /* NULL: defaults */
    int32_t num_threads;            /* host backends (CPU_FAST): threads, the caller's included;
                                       0: the environment's NVFP4MOE_NUM_THREADS, else every CPU
                                       this process may use */
} nvfp4moe_plan_options;

/* Selects a backend (as nvfp4moe_select) and prepares it for these weights: converts the weights
 * into the backend's layout once (the plan keeps its own copy; w may be freed afterwards).
 * Host weights are validated (nvfp4moe_weights_validate). Device weights get the same checks on
 * the device (NaN E4M3 block scales; per-expert scales, input scales and biases copied to the host
 * and checked), with the same messages. A plan is one layer on one device: cfg->lora and cfg->parallel.ep_size > 1 are
 * UNSUPPORTED here (the oracle still plans such deployments). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_plan_create(const nvfp4moe_config *cfg, const nvfp4moe_weights *w,
                                                  const nvfp4moe_plan_options *opt, nvfp4moe_plan **out);
/* The backend and kernel that run ("CPU_REFERENCE", "MARLIN", ...). */
NVFP4MOE_API const char *nvfp4moe_plan_backend(const nvfp4moe_plan *plan);
NVFP4MOE_API const char *nvfp4moe_plan_kernel(const nvfp4moe_plan *plan);
/* The oracle's report from creation. */
NVFP4MOE_API const nvfp4moe_report *nvfp4moe_plan_report(const nvfp4moe_plan *plan);
/* True when forward() takes CUDA device pointers and a cudaStream_t. */
NVFP4MOE_API bool nvfp4moe_plan_uses_device_memory(const nvfp4moe_plan *plan);
/* The numerics the backend computes with (MARLIN runs a W4A4 checkpoint as W4A16). */
NVFP4MOE_API nvfp4moe_scheme nvfp4moe_plan_effective_scheme(const nvfp4moe_plan *plan);
/* Workspace bytes a forward of num_tokens tokens needs. */
NVFP4MOE_API size_t nvfp4moe_plan_workspace_size(const nvfp4moe_plan *plan, int64_t num_tokens);
/* Runs the layer. stream: a cudaStream_t for device plans (NULL = default stream), ignored
 * otherwise. Device plans do not allocate, synchronize or branch on data on the host. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_plan_forward(nvfp4moe_plan *plan, const nvfp4moe_io *io, void *stream);
/* nvfp4moe_plan_forward with the fields of nvfp4moe_io as arguments, for callers that cannot build
 * a C struct (language bindings): the same checks, the same result. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_plan_run(nvfp4moe_plan *plan, int64_t num_tokens, const void *hidden,
                                               const void *router_logits, const int32_t *topk_ids,
                                               const float *topk_weights, void *output, void *workspace,
                                               size_t workspace_size, void *stream);
NVFP4MOE_API void nvfp4moe_plan_destroy(nvfp4moe_plan *plan);

// ---- checkpoints ----
//
// Reading and writing model directories: safetensors files (every rule of the format enforced;
// read with pread, and also mapped for zero-copy access), multi-shard models
// (model.safetensors.index.json), Hugging Face config.json (+ hf_quant_config.json /
// quantization_config), and NVFP4 MoE layers stored the ModelOpt way (per-expert or fused 3-D
// experts) or the compressed-tensors way (nvfp4-pack-quantized). Errors name the file and the
// tensor or field. Nothing here prints: warnings are returned. Only regular files are opened (a
// FIFO, a device or a directory is an IO error, without blocking), and sizes are checked against
// what the file holds before anything is allocated from them.

/* safetensors dtypes, as the format names them ("F8_E4M3"...). */
typedef enum nvfp4moe_st_dtype {
    NVFP4MOE_ST_BOOL = 0, NVFP4MOE_ST_U8, NVFP4MOE_ST_I8, NVFP4MOE_ST_F8_E5M2, NVFP4MOE_ST_F8_E4M3,
    NVFP4MOE_ST_F8_E8M0, NVFP4MOE_ST_F8_E4M3FNUZ, NVFP4MOE_ST_F8_E5M2FNUZ, NVFP4MOE_ST_I16,
    NVFP4MOE_ST_U16, NVFP4MOE_ST_F16, NVFP4MOE_ST_BF16, NVFP4MOE_ST_I32, NVFP4MOE_ST_U32,
    NVFP4MOE_ST_F32, NVFP4MOE_ST_C64, NVFP4MOE_ST_F64, NVFP4MOE_ST_I64, NVFP4MOE_ST_U64,
    NVFP4MOE_ST_F4, NVFP4MOE_ST_F6_E2M3, NVFP4MOE_ST_F6_E3M2,
    NVFP4MOE_ST_DTYPE_COUNT
} nvfp4moe_st_dtype;

/* "F8_E4M3"; "?" out of range. */
NVFP4MOE_API const char *nvfp4moe_st_dtype_name(nvfp4moe_st_dtype d);
/* Bits per element (4 for F4, 6 for F6_*, 8 for U8...); 0 out of range. */
NVFP4MOE_API int nvfp4moe_st_dtype_bits(nvfp4moe_st_dtype d);
/* Exact, case-sensitive name -> dtype. NOT_FOUND for an unknown name. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_st_dtype_parse(const char *s, nvfp4moe_st_dtype *out);

#define NVFP4MOE_ST_MAX_DIMS 8                    /* more dimensions is a format error */
#define NVFP4MOE_ST_MAX_HEADER (100u * 1000u * 1000u) /* header bytes, as the reference reader */

/* One tensor of an open file. Every pointer in it belongs to the file and stays valid until the
 * file (or the model holding it) is closed. data points into the read-only mapping. */
typedef struct nvfp4moe_st_tensor {
    const char *name;
    const char *file;                         /* path of the file holding it */
    nvfp4moe_st_dtype dtype;
    int32_t  ndim;                            /* 0 for a scalar */
    int64_t  shape[NVFP4MOE_ST_MAX_DIMS];
    int64_t  numel;                           /* product of shape (1 for a scalar) */
    uint64_t offset;                          /* from the start of the data section */
    uint64_t nbytes;                          /* == numel * bits / 8, checked */
    const void *data;                         /* into the read-only mapping; may be unaligned:
                                                 copy with memcpy. Touching it after another
                                                 process truncated the file raises SIGBUS, which
                                                 nvfp4moe_st_tensor_read reports as an error */
    const void *file_;                        /* private: the open file it is read from */
} nvfp4moe_st_tensor;

typedef struct nvfp4moe_st_file nvfp4moe_st_file;

/* Copies bytes [offset, offset + n) of t's data into dst, read from the file with pread rather
 * than through the mapping, so a file that shrank since it was opened is an IO error naming the
 * file and the tensor, never a signal. Every loader of the library reads this way.
 * INVALID_ARGUMENT when the range is not inside the tensor. Thread-safe. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_st_tensor_read(const nvfp4moe_st_tensor *t, uint64_t offset, uint64_t n,
                                                     void *dst);

/* Opens path (a regular file), reads and validates the whole header, and maps the file: 8-byte little-endian length (<= file size - 8 and <=
 * NVFP4MOE_ST_MAX_HEADER), UTF-8 JSON object starting with '{' (duplicate keys rejected), known
 * dtypes, shapes (<= 8 dims, no overflow), shape x dtype size == data_offsets span, offsets inside
 * the data section, sorted and contiguous (no overlap, no hole, nothing left uncovered),
 * "__metadata__" a string->string object. FORMAT / IO / NOT_FOUND with the file and tensor named.
 * Close with nvfp4moe_st_close. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_st_open(const char *path, nvfp4moe_st_file **out);
NVFP4MOE_API void nvfp4moe_st_close(nvfp4moe_st_file *f);   /* NULL is fine */
NVFP4MOE_API const char *nvfp4moe_st_file_path(const nvfp4moe_st_file *f);
/* Tensors in data order (ascending offset), i < count. */
NVFP4MOE_API size_t nvfp4moe_st_file_count(const nvfp4moe_st_file *f);
NVFP4MOE_API const nvfp4moe_st_tensor *nvfp4moe_st_file_tensor(const nvfp4moe_st_file *f, size_t i);
/* By name; NULL when absent (no error is set). */
NVFP4MOE_API const nvfp4moe_st_tensor *nvfp4moe_st_file_find(const nvfp4moe_st_file *f, const char *name);
/* A "__metadata__" value, NULL when absent. Owned by the file. */
NVFP4MOE_API const char *nvfp4moe_st_file_metadata(const nvfp4moe_st_file *f, const char *key);

/* All the tensors of a model directory. */
typedef struct nvfp4moe_st_model nvfp4moe_st_model;

/* Opens path: a .safetensors file; or a directory with model.safetensors.index.json (every shard
 * its weight_map names; each mapped tensor must be in its shard; shard names may not leave the
 * directory); or with model.safetensors; or else every *.safetensors in it. A tensor name in two
 * shards is a FORMAT error. Each file stays open (one descriptor per shard) until the model is
 * closed. Close with nvfp4moe_st_model_close. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_st_model_open(const char *path, nvfp4moe_st_model **out);
NVFP4MOE_API void nvfp4moe_st_model_close(nvfp4moe_st_model *m);   /* NULL is fine */
NVFP4MOE_API size_t nvfp4moe_st_model_num_files(const nvfp4moe_st_model *m);
NVFP4MOE_API const nvfp4moe_st_file *nvfp4moe_st_model_file(const nvfp4moe_st_model *m, size_t i);
/* Tensors sorted by name, i < count. */
NVFP4MOE_API size_t nvfp4moe_st_model_count(const nvfp4moe_st_model *m);
NVFP4MOE_API const nvfp4moe_st_tensor *nvfp4moe_st_model_tensor(const nvfp4moe_st_model *m, size_t i);
/* By name (binary search); NULL when absent (no error is set). */
NVFP4MOE_API const nvfp4moe_st_tensor *nvfp4moe_st_model_find(const nvfp4moe_st_model *m, const char *name);
/* Index of the first tensor whose name is >= name (count if none): with a prefix, the start of the
 * run of tensors that share it. */
NVFP4MOE_API size_t nvfp4moe_st_model_lower_bound(const nvfp4moe_st_model *m, const char *name);

/* Builds a safetensors file in memory. add() copies the data, so the caller's buffers may be
 * freed at once. Free with nvfp4moe_st_writer_free. */
typedef struct nvfp4moe_st_writer nvfp4moe_st_writer;
NVFP4MOE_API nvfp4moe_status nvfp4moe_st_writer_create(nvfp4moe_st_writer **out);
NVFP4MOE_API void nvfp4moe_st_writer_free(nvfp4moe_st_writer *w);   /* NULL is fine */
/* data holds numel(shape) * bits / 8 bytes (NULL allowed only when that is 0). Names must be new,
 * non-empty and not "__metadata__". Tensors are laid out in the order they are added. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_st_writer_add(nvfp4moe_st_writer *w, const char *name,
                                                    nvfp4moe_st_dtype dtype, int32_t ndim,
                                                    const int64_t *shape, const void *data);
NVFP4MOE_API nvfp4moe_status nvfp4moe_st_writer_set_metadata(nvfp4moe_st_writer *w, const char *key,
                                                             const char *value);
/* Writes the file (header padded with spaces to a multiple of 8) through path.tmp, fsynced and
 * renamed over path, then fsyncs the directory: path holds the old file or the complete new one,
 * never a partial file, even across a crash. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_st_writer_save(const nvfp4moe_st_writer *w, const char *path);

// ---- model configs ----

#define NVFP4MOE_MAX_WARNINGS 16

/* Warnings a load produced, in order (the library never prints them). */
typedef struct nvfp4moe_warnings {
    int32_t count;                               /* stored, <= NVFP4MOE_MAX_WARNINGS */
    int32_t dropped;                             /* more that did not fit */
    char    text[NVFP4MOE_MAX_WARNINGS][320];
} nvfp4moe_warnings;

typedef enum nvfp4moe_ckpt_format {
    NVFP4MOE_CKPT_UNQUANTIZED = 0,        /* "unquantized": bf16/fp16/f32 weights */
    NVFP4MOE_CKPT_MODELOPT,               /* "modelopt": per-expert Linear tensors */
    NVFP4MOE_CKPT_MODELOPT_FUSED,         /* "modelopt-fused": 3-D experts.gate_up_proj/down_proj */
    NVFP4MOE_CKPT_COMPRESSED_TENSORS,     /* "compressed-tensors": nvfp4-pack-quantized */
    NVFP4MOE_CKPT_FORMAT_COUNT
} nvfp4moe_ckpt_format;
NVFP4MOE_API const char *nvfp4moe_ckpt_format_name(nvfp4moe_ckpt_format f);
NVFP4MOE_API nvfp4moe_status nvfp4moe_ckpt_format_parse(const char *s, nvfp4moe_ckpt_format *out);

/* What config.json (+ hf_quant_config.json) says about a model's MoE layers. */
typedef struct nvfp4moe_model_info {
    nvfp4moe_config cfg;       /* the MoE layers' deployment config (defaults elsewhere) */
    bool   quantized;          /* an NVFP4 quantization config was found */
    bool   format_known;       /* false: the format is only known once tensors are seen */
    nvfp4moe_ckpt_format format; /* from the quantization config (MODELOPT for per-expert or fused
                                    ModelOpt: the tensors tell which) */
    char   model_type[64];     /* config.json model_type */
    char   quant_method[32];   /* "modelopt", "compressed-tensors", "" */
    char   quant_algo[32];     /* "NVFP4", "W4A16_NVFP4", "MIXED_PRECISION/<the experts' algo>",
                                  "nvfp4-pack-quantized" (CT format) */
    char   quant_source[32];   /* "hf_quant_config.json" / "config.json" / "" */
    char   prefix[64];         /* module prefix of the decoder layers: "model.layers" */
    int32_t num_layers;        /* num_hidden_layers */
    int32_t num_moe_layers;
    int32_t first_moe_layer;   /* -1 if none */
    int32_t num_shared_experts;/* n_shared_experts / shared_expert_intermediate_size > 0 */
    int32_t num_excluded;      /* exclude_modules / ignore entries */
    nvfp4moe_warnings warnings;/* e.g. config.json and hf_quant_config.json disagree */
    void   *storage_;          /* private */
} nvfp4moe_model_info;

/* Reads dir/config.json (and dir/hf_quant_config.json when present; when both carry a
 * quantization config, config.json's wins, as vLLM does). Expert count from num_experts /
 * n_routed_experts / num_local_experts; I from moe_intermediate_size (else intermediate_size);
 * top_k from num_experts_per_tok (or moe_topk / top_k); activation from hidden_act; routing from
 * scoring_func, n_group, topk_group, norm_topk_prob, routed_scaling_factor (and the model type);
 * MoE layers from first_k_dense_replace, moe_layer_freq, decoder_sparse_step, mlp_only_layers,
 * interleave_moe_layer_step; scheme W4A4 vs W4A16. Unknown fields are ignored; a field of the wrong
 * type is a FORMAT error naming it. Free with nvfp4moe_model_info_free. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_model_info_read(const char *dir, nvfp4moe_model_info **out);
/* The same from JSON texts (hf_quant_json may be NULL); name is used in messages. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_model_info_parse(const char *config_json, const char *hf_quant_json,
                                                       const char *name, nvfp4moe_model_info **out);
NVFP4MOE_API void nvfp4moe_model_info_free(nvfp4moe_model_info *info);   /* NULL is fine */
NVFP4MOE_API bool nvfp4moe_model_info_is_moe_layer(const nvfp4moe_model_info *info, int32_t layer);
/* The i-th exclude_modules / ignore pattern: fnmatch wildcards (* ? [seq] [!seq], matched against
 * the whole module name, as Python's fnmatch), or "re:" + a regular expression matched as Python's
 * re.match (anchored at the start): literals, ., classes, \d \w \s, groups, |, * + ? {n,m}, ^ $.
 * nvfp4moe_model_info_read refuses (FORMAT, naming the pattern) look-around, back-references, \b
 * and patterns over 1024 bytes or too complex once their repetitions are expanded; matching is
 * linear in the pattern and the name. */
NVFP4MOE_API const char *nvfp4moe_model_info_excluded(const nvfp4moe_model_info *info, int32_t i);
/* True when module (e.g. "model.layers.3.mlp.experts") matches an exclusion pattern. */
NVFP4MOE_API bool nvfp4moe_model_info_is_excluded(const nvfp4moe_model_info *info, const char *module);

// ---- checkpoint layers ----

/* An NVFP4 MoE layer read from a checkpoint. layer.w is in the canonical layout above and owned
 * by this object: never pass &layer to nvfp4moe_layer_free; free with nvfp4moe_ckpt_layer_free. */
typedef struct nvfp4moe_ckpt_layer {
    nvfp4moe_layer layer;       /* cfg + weights */
    int32_t index;              /* decoder layer number */
    nvfp4moe_ckpt_format format;/* what the tensors turned out to be */
    bool has_router;            /* the checkpoint has a float router weight for the layer */
    const float *router;        /* [E, H] router weight (mlp.gate.weight, gpt-oss mlp.router.weight)
                                   as float; NULL when absent or after a check-only load */
    nvfp4moe_st_dtype router_dtype; /* its dtype in the file (when has_router) */
    bool has_router_bias;       /* the router also has a bias [E] (gpt-oss mlp.router.bias) */
    const float *router_bias;   /* [E] or NULL: added to the router logits (see
                                   nvfp4moe_ckpt_router_logits); NULL when absent or check-only */
    char router_name[8];        /* the router's module under mlp.: "gate" or "router" (gpt-oss), as
                                   the checkpoint named it; nvfp4moe_ckpt_add_layer writes that
                                   name ("" = by activation, see there) */
    nvfp4moe_warnings warnings;
    void *storage_;             /* private */
} nvfp4moe_ckpt_layer;

/* Loads MoE layer `layer` of a model directory: config from config.json, tensors from its
 * safetensors. Gated layers whose gate and up global scales differ in some expert get both
 * (w13_scale_2 the gate's, w13_up_scale_2 the up's), exactly as stored, block scales untouched,
 * and a warning naming the first such expert (vLLM's loader keeps the gate's scale for both);
 * where they agree in every expert, w13_up_scale_2 is NULL.
 * Input scales: max over gate/up per expert. Every tensor's presence, dtype and shape is checked
 * (NOT_FOUND / FORMAT naming the tensor and the file). Free with nvfp4moe_ckpt_layer_free. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ckpt_layer_load(const char *dir, int32_t layer, nvfp4moe_ckpt_layer **out);
/* The same, from an already opened config and tensor set (both only borrowed). check_only: check
 * every tensor, produce the warnings, but copy no weight (*out then has NULL weight pointers). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ckpt_layer_load_from(const nvfp4moe_model_info *info,
                                                           const nvfp4moe_st_model *tensors, int32_t layer,
                                                           bool check_only, nvfp4moe_ckpt_layer **out);
NVFP4MOE_API void nvfp4moe_ckpt_layer_free(nvfp4moe_ckpt_layer *l);   /* NULL is fine */

/* The layer's router logits, as the model computes them: logits [M, E] = x [M, H] @ router^T
 * + router_bias (when the checkpoint has one), accumulated in float64 and rounded to float.
 * INVALID_ARGUMENT when l->router is NULL (no router weight, or a check-only load). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ckpt_router_logits(const nvfp4moe_ckpt_layer *l, const float *x,
                                                         int64_t num_tokens, float *logits);

/* An unquantized MoE layer in float: the source of `nvfp4moe quantize`. */
typedef struct nvfp4moe_float_layer {
    nvfp4moe_config cfg;        /* shape, activation, routing */
    float *w13;                 /* [E, N1, H] rows [0, I) gate, [I, 2I) up (gated) */
    float *w2;                  /* [E, H, I] */
    float *router;              /* [E, H] or NULL */
    float *router_bias;         /* [E] or NULL (gpt-oss); only with a router */
    float *correction_bias;     /* [E] when cfg.has_correction_bias, else NULL */
    float *w13_bias;            /* [E, N1] in w13's row order (gpt-oss: interleaved), and */
    float *w2_bias;             /* [E, H]: both when cfg.has_bias, else both NULL */
    char   router_name[8];      /* "gate" or "router": the router's module under mlp. in the
                                   source ("" = by activation, see nvfp4moe_ckpt_add_layer) */
    void  *storage_;            /* private */
} nvfp4moe_float_layer;

/* Random weights N(0, 1/sqrt(fan_in)) rounded to bf16, and a N(0, 1/sqrt(H)) router. The
 * swigluoai activation makes a gpt-oss-style layer: a N(0, 0.5) router bias, expert biases
 * N(0, 0.1) (sets cfg.has_bias) and router_name "router". cfg.has_bias gives any activation expert
 * biases. Biases are bf16-rounded too. Deterministic in seed. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_float_layer_random(const nvfp4moe_config *cfg, uint64_t seed,
                                                         nvfp4moe_float_layer **out);
/* Reads layer `layer` of an unquantized (BF16/F16/F32) checkpoint: per-expert
 * experts.E.{gate,up,down}_proj.weight (or w1/w3/w2, or experts.{gate,up,down}_proj.E.weight), or
 * fused experts.gate_up_proj [E, H, N1] / down_proj [E, I, H] (the Hugging Face [in, out] layout)
 * or [E, N1, H] / [E, H, I] (Transformers v5, Qwen3.5-MoE), and the router (gate.weight or router.weight,
 * with its bias gate.bias / router.bias when present; router_name says which). Expert biases
 * (per-expert experts.E.{gate,up,down}_proj.bias, or fused experts.gate_up_proj_bias [E, N1] and
 * down_proj_bias [E, H], gpt-oss) set cfg.has_bias; a bias without its counterparts, or on some
 * experts only, is an error naming the tensor. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_float_layer_load(const nvfp4moe_model_info *info,
                                                       const nvfp4moe_st_model *tensors, int32_t layer,
                                                       nvfp4moe_float_layer **out);
NVFP4MOE_API void nvfp4moe_float_layer_free(nvfp4moe_float_layer *l);   /* NULL is fine */

/* Quantizes a float layer the ModelOpt way: per expert and projection amax -> scale_2 =
 * amax / (6*448), gate and up sharing max(amax_gate, amax_up) as ModelOpt's export does; input
 * scales calibrated as amax / (6*448) of calib_tokens random N(0,1) hidden states (w13) and of the
 * activations they produce in each expert, w13 bias included (w2). The router weight and bias
 * stay unquantized (rounded to bf16, what the writer stores); expert biases (cfg.has_bias) are
 * kept exactly (the writer stores them as F32). router_name is carried over. Deterministic in
 * seed. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_float_layer_quantize(const nvfp4moe_float_layer *src, int32_t calib_tokens,
                                                           uint64_t seed, nvfp4moe_ckpt_layer **out);

/* Adds layer `index`'s tensors to a writer under "<prefix>.<index>.mlp." in format fmt
 * (UNQUANTIZED takes a float layer, the others a ckpt layer; pass the one that applies, NULL the
 * other). W4A16 configs store no input scales. The router is written as BF16 <name>.weight [E, H]
 * and, when it has one, <name>.bias [E], where <name> is the layer's router_name, or when that is
 * empty "router" for the swigluoai activation (gpt-oss, which vLLM loads as mlp.router) and "gate"
 * otherwise (nvfp4moe_ckpt_router_name). Expert biases (cfg.has_bias) are written where the
 * loader reads them: F32 experts.gate_up_proj_bias [E, N1] / down_proj_bias [E, H] (fused, w13's
 * row order, so gpt-oss's interleaved gate/up) or experts.E.{gate,up,down}_proj.bias (per-expert
 * and compressed-tensors; BF16 for UNQUANTIZED). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ckpt_add_layer(nvfp4moe_st_writer *w, nvfp4moe_ckpt_format fmt,
                                                     const char *prefix, int32_t index,
                                                     const nvfp4moe_ckpt_layer *q,
                                                     const nvfp4moe_float_layer *f);

// ---- quantizing a whole model ----

/* Where nvfp4moe_model_quantize is, for its progress callback (called after every tensor copied,
 * every chunk of a large copy and every expert quantized; from the calling thread). */
typedef struct nvfp4moe_quantize_progress {
    int64_t  tensors_done, tensors_total;   /* output tensors written whole / in all */
    uint64_t bytes_done, bytes_total;       /* their bytes */
    int32_t  layers_done, layers_total;     /* MoE layers quantized */
    int32_t  layer;                         /* the decoder layer being quantized, -1 while copying */
    int32_t  last_layer;                    /* the decoder layer quantized last, -1 before the first */
    int32_t  experts_done, experts_total;   /* of the layer being (or last) quantized */
    bool     expert_biases;                 /* that layer has expert biases */
} nvfp4moe_quantize_progress;

typedef struct nvfp4moe_quantize_options {
    nvfp4moe_ckpt_format format;   /* MODELOPT (default), MODELOPT_FUSED or COMPRESSED_TENSORS */
    bool     w4a16;                /* weight-only W4A16_NVFP4: no input scales (default false) */
    int32_t  layer;                /* -1 (default): every MoE layer; else only this decoder layer
                                      (the other MoE layers are copied and excluded) */
    int32_t  calib_tokens;         /* calibration tokens of the input scales (default 64) */
    uint64_t seed;                 /* calibration seed; layer L uses seed + L (default 0) */
    uint64_t max_shard_bytes;      /* tensor bytes per safetensors file (default 5e9, Hugging Face's
                                      "5GB"); one file of more than that holds a single tensor */
    void (*progress)(const nvfp4moe_quantize_progress *p, void *user);   /* or NULL */
    void    *user;
} nvfp4moe_quantize_options;

/* What nvfp4moe_model_quantize wrote. */
typedef struct nvfp4moe_quantize_result {
    int32_t  moe_layers;           /* MoE layers quantized */
    int64_t  tensors;              /* tensors written */
    int64_t  tensors_quantized;    /* of them: the experts' NVFP4 weights, scales (and biases) */
    int64_t  tensors_copied;       /* of them: the source's other tensors, copied bit for bit */
    uint64_t bytes;                /* tensor bytes written */
    int32_t  shards;               /* safetensors files (more than 1: with model.safetensors.index.json) */
    int32_t  excluded;             /* entries of the exclusion list */
    int32_t  files_copied;         /* other files of the source (tokenizer, generation config, ...) */
    bool     expert_biases;        /* some quantized layer has expert biases */
} nvfp4moe_quantize_result;

/* Writes a random unquantized (BF16) model directory of num_layers decoder layers into dir (an
 * existing, empty directory), one tensor at a time (memory: one expert's weights, whatever the
 * size): embeddings and lm_head (vocabulary 1024), per layer norms and attention projections
 * (q/k/v/o), dense MLPs before first_moe_layer, and MoE layers [first_moe_layer, num_layers) of
 * cfg's shape with exactly nvfp4moe_float_layer_random's weights, router (and biases) for seed
 * cfg->seed + layer, under the per-expert names (experts.E.{gate,up,down}_proj); in shards of at
 * most max_shard_bytes (0: 5e9); config.json describes it all. The source nvfp4moe quantize --random
 * writes. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_model_write_random(const char *dir, const nvfp4moe_config *cfg, int32_t num_layers,
                                                         int32_t first_moe_layer, uint64_t max_shard_bytes);

/* The defaults above. */
NVFP4MOE_API void nvfp4moe_quantize_options_init(nvfp4moe_quantize_options *opt);

/* Quantizes an unquantized (BF16/F16/F32) Hugging Face model directory in_dir into out_dir (an
 * existing, empty directory), one tensor at a time, so that memory stays bounded by one expert's
 * weights whatever the model's size:
 *  - every MoE layer's experts become NVFP4 the ModelOpt way (nvfp4moe_float_layer_quantize's
 *    rule: per expert and projection scale_2 = amax / (6*448), gate and up sharing one amax, input
 *    scales calibrated on calib_tokens random N(0, 1) hidden states), in opt->format, under the
 *    source's module and projection names; expert biases keep their dtype (BF16, F16 or F32, else
 *    F32) and values;
 *  - every other tensor (embeddings, attention, norms, routers, shared experts, lm_head, ...) is
 *    copied bit for bit;
 *  - the tensors go into shards of at most max_shard_bytes (model.safetensors, or
 *    model-0000i-of-0000N.safetensors with model.safetensors.index.json);
 *  - config.json is the source's with its quantization_config set (ModelOpt: as its export writes
 *    it, plus hf_quant_config.json; compressed-tensors: nvfp4-pack-quantized), whose exclusion list
 *    names every unquantized module that has a weight matrix (ModelOpt: summarized with prefix
 *    wildcards the way its export does; compressed-tensors: each module by name);
 *  - the directory's other files (tokenizer, generation config, chat template, ...; not weights
 *    of other formats) are copied.
 * Refused, with a message: a source that is quantized already or has no MoE layers, layer not a
 * MoE layer, any expert tensor missing or of the wrong dtype or shape, a tensor under a quantized
 * layer's experts module that is not one it reads. On failure nothing is left in out_dir. result
 * may be NULL. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_model_quantize(const char *in_dir, const char *out_dir,
                                                     const nvfp4moe_quantize_options *opt,
                                                     nvfp4moe_quantize_result *result);

/* The router's module name nvfp4moe_ckpt_add_layer writes: name when it is "gate" or "router",
 * else "router" for the swigluoai activation (gpt-oss) and "gate" otherwise. */
NVFP4MOE_API const char *nvfp4moe_ckpt_router_name(const char *name, const nvfp4moe_config *cfg);

/* Writes dir/config.json describing cfg (a model of num_layers layers whose MoE layers are
 * [first_moe_layer, num_layers)), and for fmt != UNQUANTIZED its quantization config
 * (config.json quantization_config, plus hf_quant_config.json for ModelOpt) whose exclusions
 * keep lm_head and the router module router_name (resolved by nvfp4moe_ckpt_router_name; pass
 * the layers' router_name) unquantized. If base_config_json is not NULL, that config is copied
 * instead of generated and only the quantization config is replaced. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_model_config_write(const char *dir, const nvfp4moe_config *cfg,
                                                         int32_t num_layers, int32_t first_moe_layer,
                                                         nvfp4moe_ckpt_format fmt,
                                                         const char *base_config_json,
                                                         const char *router_name);

// ---- the JSON interface: what language bindings call ----
//
// Requests are JSON objects, answers JSON texts, so that a caller that cannot read or build this
// header's structs (the Python package, other bindings) needs nothing but strings, pointers and
// integers. A response is allocated by the library: free it with nvfp4moe_json_free. Unknown keys
// in a request are INVALID_ARGUMENT naming the key (except inside "config", below); a value of the
// wrong type is INVALID_ARGUMENT naming its path ("deployment.top_k: expected an integer").
// On failure *response is NULL unless a function says otherwise. Keys may be added to responses
// within a major version; existing keys keep their meaning.
//
// A deployment is described by up to four sources, applied in this order (later ones win):
//   "model"        a model directory: its config.json (+ hf_quant_config.json), as
//                  nvfp4moe_model_info_read reads it (must have MoE layers);
//   "hf_config"    or: the config.json object itself, "hf_quant_config" beside it (optional);
//   "config"       an object of deployment keys read leniently, as a vLLM config dict is: unknown
//                  keys are ignored (an engine-arguments dict may be passed whole);
//   "deployment"   an object of deployment keys read strictly: an unknown key is an error.
// Deployment keys are this library's (nvfp4moe_config's field names) or vLLM's (engine
// arguments, FusedMoEConfig fields, environment variables) and Hugging Face's, in brackets:
//   num_experts (n_routed_experts, num_local_experts), top_k (num_experts_per_tok,
//   experts_per_token), hidden_size (hidden_dim), intermediate_size (the expert's:
//   moe_intermediate_size, intermediate_size_per_partition), dtype (in and out; "auto" keeps
//   them), in_dtype (the output's too unless out_dtype is given), out_dtype, activation
//   (hidden_act), swiglu_limit (null: none),
//   swiglu_alpha, swiglu_beta, situ_beta (activation_situ_beta), situ_linear_beta
//   (activation_situ_linear_beta), routing, n_group, topk_group, routed_scaling_factor,
//   has_correction_bias, router_logits_dtype, apply_router_weight_on_input, scheme, has_bias,
//   lora (enable_lora, is_lora_enabled; lora_config: an object turns it on, null off),
//   batch_invariant (VLLM_BATCH_INVARIANT), requantization_source, force_a16
//   (VLLM_B12X_MOE_FP4_FORCE_A16), moe_backend, seed; tp_size (tensor_parallel_size), dp_size
//   (data_parallel_size), enable_expert_parallel, ep_size, ep_rank, all2all (all2all_backend),
//   eplb (enable_eplb).
// Dtype names as nvfp4moe_dtype_parse reads them, also "torch.bfloat16". The objects
// "parallel_config", "kernel_config" and "model_config" (vLLM's config sections) hold the same keys.
// As vLLM does, enable_expert_parallel makes ep_size = tensor_parallel_size * data_parallel_size
// (1 when that is 1); an ep_size in the same object must agree with it; all2all_backend
// "allgather_reducescatter" (vLLM's default) without expert parallelism means none. JSON null for
// a key leaves it as it is (swiglu_limit and lora_config: unset it). The config is then checked by
// nvfp4moe_config_validate.

/* Frees a response of the JSON interface (NULL is fine). */
NVFP4MOE_API void nvfp4moe_json_free(char *s);

/* The report as the one JSON object `nvfp4moe select --json` prints (docs/select.md): backend,
 * kernel, log, device, detail, vllm_revision, candidates [{backend, kernel, supported, verdict,
 * reason, detail}], error (null or {kind, message}). Indented by 2. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_report_json(const nvfp4moe_report *report, char **out);

/* nvfp4moe_select from a JSON request: the sources above, and
 *   "device"     a what-if device as nvfp4moe_device_parse reads it ("h200", "sm_100", "cpu"), or
 *                "cuda" / "cuda:N" for a GPU of this machine; absent or null: detect;
 *   "installed"  "all", "none", a comma list or an array of library names
 *                (nvfp4moe_oracle_libs_parse); absent: this build's libraries;
 *   "vllm_only"  true: vLLM's backends only.
 * *response: {"report": <nvfp4moe_report_json's object>, "status", "status_name" (what this
 * call returns), "text": <nvfp4moe_report_render's text>, "config": <the deployment, canonical keys>, "device": {name, str, is_cuda, sm, ordinal,
 * detected}, "warnings": [<the model config's warnings>]}. Returns what nvfp4moe_select returns:
 * OK; NOT_FOUND or UNSUPPORTED when the oracle raises (the report's error says ValueError or
 * NotImplementedError; *response is filled then too); other statuses for a bad request, a bad
 * config or an unreadable model (*response NULL). */
NVFP4MOE_API nvfp4moe_status nvfp4moe_select_json(const char *request, char **response);

/* Loads a checkpoint layer (nvfp4moe_ckpt_layer_load) from {"path": DIR, "layer": N} ("layer"
 * absent or null: the model's first MoE layer). *response: {"index", "format", "config":
 * <canonical keys>, "tensors": {<name>: <tensor>} (the weights below that the layer has, in host
 * memory owned by *out), "router": <tensor> or null, "router_bias": <tensor> or null,
 * "router_name", "warnings": [...]}. Free *out with nvfp4moe_ckpt_layer_free. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_ckpt_layer_load_json(const char *request, nvfp4moe_ckpt_layer **out,
                                                           char **response);

/* nvfp4moe_plan_create from a JSON request: the sources above, "installed" and "vllm_only" as for
 * nvfp4moe_select_json, and
 *   "base"         instead of "model" / "hf_config": a complete config with the canonical keys (the
 *                  "config" of a response, e.g. nvfp4moe_ckpt_layer_load_json's), read strictly;
 *   "device"       "cpu", "cuda" (the first GPU) or "cuda:N": where the plan runs (absent or
 *                  null: detect);
 *   "num_threads"  host backends' threads (nvfp4moe_plan_options.num_threads);
 *   "weights"      {<name>: <tensor>} with the names of nvfp4moe_weights: w13, w13_scale,
 *                  w13_scale_2, w13_up_scale_2 (optional: the up half's own global scale),
 *                  w13_input_scale (W4A4 schemes), w2, w2_scale, w2_scale_2, w2_input_scale
 *                  (W4A4 schemes), w13_bias and w2_bias (expert biases), correction_bias
 *                  (has_correction_bias; ignored when that is set false).
 * A <tensor> is {"data": <address>, "shape": [...], "dtype": "u8" | "f8_e4m3" | "f32" | ...,
 * "device": "cpu" | "cuda:N"}, C-contiguous; every weight in the same memory; CUDA weights only
 * for a plan on that GPU. Packed weights are u8 (w13 [E, N1, H/2], w2 [E, H, I/2]), block scales
 * f8_e4m3 or u8 ([E, N1, H/16], [E, H, I/16]), the rest f32 ([E], biases [E, N1] and [E, H]).
 * num_experts, hidden_size and intermediate_size that no source gives are taken from w13 and w2;
 * has_bias and has_correction_bias from the tensors present; top_k must be given. A shape or
 * dtype that does not fit is INVALID_ARGUMENT naming the tensor.
 * *response: {"backend", "kernel", "device_memory", "effective_scheme", "config", "device",
 * "report"}. When the oracle raises, the status is nvfp4moe_select's and *response is
 * {"report": ...} with the error; on other failures NULL. Destroy *out with
 * nvfp4moe_plan_destroy; run it with nvfp4moe_plan_run or nvfp4moe_plan_forward. */
NVFP4MOE_API nvfp4moe_status nvfp4moe_plan_create_json(const char *request, nvfp4moe_plan **out, char **response);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_H
