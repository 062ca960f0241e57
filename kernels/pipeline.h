/*
 * pipeline.h - the C interface of the GPU layer pipeline's own kernels (routing, token grouping,
 * activation, NVFP4 quantize-dequantize, combine, the EMULATION GEMM). Plain C, C linkage; includable from C and CUDA. All pointers are device pointers
 * unless a comment says otherwise. Every function only enqueues work on `stream`: no allocation,
 * no host synchronization, no host branching on device data, so everything here can be captured
 * in a CUDA graph. Each returns the launch's error (cudaGetLastError after every launch).
 *
 * The token grouping arrays (sorted_ids, block_expert, num_blocks) are the ones documented in
 * kernels/moe_gemm.h.
 */
#ifndef NVFP4MOE_PIPELINE_H
#define NVFP4MOE_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest expert count the GPU router handles (one warp keeps a token's E scores in shared memory). */
#define NVFP4MOE_GPU_MAX_EXPERTS 1024
/* Largest top_k the GPU router handles (one lane holds one selected expert). */
#define NVFP4MOE_GPU_MAX_TOPK 32

/* Routing parameters, the fields of nvfp4moe_config the router reads (values as in the config). */
typedef struct nvfp4moe_gpu_route_params {
    int32_t method;                 /* nvfp4moe_routing */
    int32_t logits_dtype;           /* nvfp4moe_dtype of the router logits */
    int32_t num_experts;            /* E <= NVFP4MOE_GPU_MAX_EXPERTS */
    int32_t top_k;                  /* <= NVFP4MOE_GPU_MAX_TOPK */
    int32_t n_group, topk_group;    /* deepseek_v3 (n_group <= 32) */
    float routed_scaling_factor;
    const float *correction_bias;   /* [E] device, or NULL */
    uint64_t seed;                  /* simulated */
} nvfp4moe_gpu_route_params;

/* Routing (when rp != NULL: logits [M, E] -> ids/weights [M, top_k], written here) followed by the
 * token grouping of the M*top_k (token, slot) pairs by expert into blocks of block_m rows. When rp
 * is NULL, ids (and weights) are the caller's precomputed top-k and are only read. Pairs whose id is
 * outside [0, E) are left out of the grouping. For small M both steps run in one single-block
 * kernel (one launch); otherwise a routing grid and a single-block grouping kernel. */
cudaError_t nvfp4moe_gpu_route_and_group(const nvfp4moe_gpu_route_params *rp, const void *logits,
                                         int32_t *ids, float *weights, int64_t M, int32_t top_k,
                                         int32_t E, int32_t block_m, int32_t *sorted_ids,
                                         int32_t *block_expert, int32_t *num_blocks,
                                         int32_t max_blocks, cudaStream_t stream);

/* Resolved activation parameters (nvfp4moe_act_params plus the activation). */
typedef struct nvfp4moe_gpu_act_params {
    int32_t activation;   /* nvfp4moe_activation */
    int32_t has_limit;
    float limit, alpha, beta, situ_beta, situ_linear_beta;
} nvfp4moe_gpu_act_params;

/* out [rows, I] = act(in [rows, N1]) for every row, computed in float from the inputs (16-bit, or
 * float when in_f32) and rounded to the 16-bit dtype; when qdq_gs > 0 the rounded row is then NVFP4
 * quantize-dequantized with global scale qdq_gs (vLLM's reference quantizer). out is 16-bit, or
 * float when out_f32 (the QDQ result kept exact, as the reference keeps it). N1 = 2*I for gated
 * activations (gate half first, or interleaved g0,u0,g1,u1.. for swigluoai), I otherwise. */
cudaError_t nvfp4moe_gpu_activation(const void *in, int32_t in_f32, void *out, int32_t out_f32,
                                    int64_t rows, int32_t I, int32_t N1, const nvfp4moe_gpu_act_params *ap,
                                    float qdq_gs, int32_t is_bf16, cudaStream_t stream);

/* out [rows, cols] = QDQ(round(in * row_scale[r])) : the optional per-row scale (NULL: none) is
 * applied and rounded to the dtype first, then, when qdq_gs > 0, the NVFP4 quantize-dequantize with
 * global scale qdq_gs. out is 16-bit, or float when out_f32. cols % 16 == 0. */
cudaError_t nvfp4moe_gpu_scale_qdq_rows(const void *in, void *out, int32_t out_f32, int64_t rows, int32_t cols,
                                        const float *row_scale, float qdq_gs, int32_t is_bf16,
                                        cudaStream_t stream);

/* out [M, H] (out_dtype: nvfp4moe_dtype) = sum over j of y[t*top_k + j, :] for the pairs whose id
 * is in [0, E); y is 16-bit (is_bf16) or float (y_f32), weights already applied. H % 8 == 0. */
cudaError_t nvfp4moe_gpu_combine(const void *y, int32_t y_f32, const int32_t *ids, int64_t M, int32_t top_k,
                                 int32_t E, int32_t H, int32_t is_bf16, void *out, int32_t out_dtype,
                                 cudaStream_t stream);

/* The EMULATION GEMM: weights in the canonical NVFP4 layout, dequantized in the kernel
 * (e2m1 * e4m3, exact in float), float accumulation, per-expert scale_2 in the epilogue:
 *   C[p, :] = row_scale[p] * (scale_2[e] * (A[p / a_row_div, :] . (e2m1 * sf)_e^T) + bias[e, :])
 * for every valid pair p of a block of expert e. Sentinel rows are not written. */
#define NVFP4MOE_EMUL_BLOCK_M 16
typedef struct nvfp4moe_emul_args {
    const void *a;            /* activations, bf16 or fp16 (float when a_f32), rows of K values */
    int32_t a_f32;
    int32_t a_row_div;        /* pair p reads A row p / a_row_div */
    const uint8_t *w;         /* [E, N, K/2] packed E2M1 */
    const uint8_t *sf;        /* [E, N, K/16] E4M3, linear */
    const float *scale_2;     /* [E] */
    const float *bias;        /* [E, N] or NULL */
    const float *row_scale;   /* [P] or NULL */
    void *c;                  /* [P, N], dtype of a, or float when c_f32 */
    int32_t c_f32;
    const int32_t *sorted_ids, *block_expert, *num_blocks;
    int32_t P, N, K, E;
    int32_t max_blocks;       /* grouping blocks of NVFP4MOE_EMUL_BLOCK_M rows */
    int32_t is_bf16;
} nvfp4moe_emul_args;
cudaError_t nvfp4moe_emul_gemm(const nvfp4moe_emul_args *args, cudaStream_t stream);

/* *first = the lowest index i < n whose E4M3 code sf[i] is NaN (0x7F or 0xFF), or ~0 when none
 * (device memory). Plans run it over device-resident block scales, which the host never reads. */
cudaError_t nvfp4moe_gpu_find_e4m3_nan(const uint8_t *sf, size_t n, unsigned long long *first,
                                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_PIPELINE_H
