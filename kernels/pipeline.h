/*
 * pipeline.h - the C interface of the GPU layer pipeline's own kernels (routing, token grouping,
 * activation, input scaling, combine); EMULATION's are in kernels/emulation.h. Plain C, C linkage;
 * includable from C and CUDA. All pointers are device pointers
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

/* Launch overlap between the routing, the grouping and the kernel after them (programmatic
 * dependent launch, sm_90; elsewhere plain launches).
 *   pdl   the grouping is launched as a programmatic dependent of the routing grid (when there is
 *         one), so it starts while the routing's last blocks finish, and waits for them; not the
 *         cluster grouping (tens of thousands of pairs) and not on a device without sm_90 code
 *   zero  an int32 the grouping sets to 0 before it finishes (the item counter of a GEMM launched
 *         next with PDL, which then needs no clear of its own), or NULL
 * Every grouping kernel, and the routing grid, lets a dependent launched with PDL start early;
 * such a kernel must wait (griddepcontrol.wait) before it reads what they write. */
typedef struct nvfp4moe_gpu_chain {
    int32_t pdl;
    int32_t *zero;
} nvfp4moe_gpu_chain;

/* Routing (when rp != NULL: logits [M, E] -> ids/weights [M, top_k], written here) followed by the
 * token grouping of the M*top_k (token, slot) pairs by expert into blocks of block_m rows. When rp
 * is NULL, ids (and weights) are the caller's precomputed top-k and are only read. Pairs whose id is
 * outside [0, E) are left out of the grouping. For small M both steps run in one single-block
 * kernel (one launch); otherwise a routing grid and a grouping kernel, one block for a few pairs
 * and a grid of blocks for more (kernels/moe_align.cu). chain: launch overlap, or NULL. */
cudaError_t nvfp4moe_gpu_route_and_group(const nvfp4moe_gpu_route_params *rp, const void *logits,
                                         int32_t *ids, float *weights, int64_t M, int32_t top_k,
                                         int32_t E, int32_t block_m, int32_t *sorted_ids,
                                         int32_t *block_expert, int32_t *num_blocks,
                                         int32_t max_blocks, const nvfp4moe_gpu_chain *chain,
                                         cudaStream_t stream);

/* Resolved activation parameters (nvfp4moe_act_params plus the activation). */
typedef struct nvfp4moe_gpu_act_params {
    int32_t activation;   /* nvfp4moe_activation */
    int32_t has_limit;
    float limit, alpha, beta, situ_beta, situ_linear_beta;
} nvfp4moe_gpu_act_params;

/* out [rows, I] = act(in [rows, N1]) for every row, computed in float from the 16-bit inputs and
 * rounded to the 16-bit dtype once (kernels/activation.cuh). N1 = 2*I for gated activations (gate
 * half first, or interleaved g0,u0,g1,u1.. for swigluoai), I otherwise. */
cudaError_t nvfp4moe_gpu_activation(const void *in, void *out, int64_t rows, int32_t I, int32_t N1,
                                    const nvfp4moe_gpu_act_params *ap, int32_t is_bf16, cudaStream_t stream);

/* out [rows, cols] = in * row_scale[r], rounded to the 16-bit dtype. cols % 16 == 0. */
cudaError_t nvfp4moe_gpu_scale_rows(const void *in, void *out, int64_t rows, int32_t cols, const float *row_scale,
                                    int32_t is_bf16, cudaStream_t stream);

/* out [M, H] (out_dtype: nvfp4moe_dtype) = sum over j of y[t*top_k + j, :] (16-bit, weights already
 * applied) for the pairs whose id is in [0, E), summed in float and rounded once. H % 8 == 0.
 * pdl: launched as a programmatic dependent of the kernel ahead (sm_90), which it waits for
 * before it reads anything; that kernel's CTAs may let it start as they finish. */
cudaError_t nvfp4moe_gpu_combine(const void *y, const int32_t *ids, int64_t M, int32_t top_k, int32_t E, int32_t H,
                                 int32_t is_bf16, void *out, int32_t out_dtype, int32_t pdl, cudaStream_t stream);

/* *first = the lowest index i < n whose E4M3 code sf[i] is NaN (0x7F or 0xFF), or ~0 when none
 * (device memory). Plans run it over device-resident block scales, which the host never reads. */
cudaError_t nvfp4moe_gpu_find_e4m3_nan(const uint8_t *sf, size_t n, unsigned long long *first,
                                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_PIPELINE_H
