/*
 * emulation.h - the C interface of the EMULATION backend's kernels (kernels/emulation.cu): vLLM's
 * EMULATION path (experts/nvfp4_emulation_moe.py) with its rounding points, the same computation as
 * the host implementation src/reference/emulation.c. Plain C, C linkage; includable from C and
 * CUDA. All pointers are device pointers; every function only enqueues work on `stream` and
 * returns the launch's error, so a forward can be captured in a CUDA graph. T below is the
 * activation dtype (bf16 when is_bf16, else fp16); every tensor between the kernels is of dtype T.
 * The token grouping arrays are those of kernels/moe_gemm.h. (nvfp4moe_emul_triton_rcp, for tests,
 * is the exception: host pointers, synchronous.)
 */
#ifndef NVFP4MOE_EMULATION_H
#define NVFP4MOE_EMULATION_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out [rows, cols] = T(QDQ_triton(x, gs)), x = in, or T(in * T(row_weight[r])) when row_weight is
 * not NULL (the router weight on the input, top_k == 1). QDQ_triton is vLLM's Triton
 * _nvfp4_quant_dequant_kernel, its divisions the div.full.f32 Triton emits. cols % 16 == 0. */
cudaError_t nvfp4moe_emul_input(const void *in, void *out, int64_t rows, int32_t cols, const float *row_weight,
                                float gs, int32_t is_bf16, cudaStream_t stream);

/* The fused dequantize + GEMM of fused_moe_nvfp4_emulation_kernel, for every valid pair p of a
 * block of expert e:
 *   C[p, n] = T((sum_k A[p / a_row_div, k] * W[e, n, k] + bias[e, n]) * row_scale[p])
 *   W[e, n, k] = T(e2m1 * (e4m3 * scale_2[e]))   (row n's half's scale with scale_2_halves)
 * float32 accumulation, k in order (bias and row_scale optional). Sentinel rows are not written. */
#define NVFP4MOE_EMUL_BLOCK_M 16
typedef struct nvfp4moe_emul_args {
    const void *a;            /* [rows, K] dtype T */
    int32_t a_row_div;        /* pair p reads A row p / a_row_div */
    const uint8_t *w;         /* [E, N, K/2] packed E2M1 */
    const uint8_t *sf;        /* [E, N, K/16] E4M3, linear */
    const float *scale_2;     /* [E], or [E, 2] (gate, up) per scale_2_halves */
    const float *bias;        /* [E, N] or NULL */
    const float *row_scale;   /* [P] or NULL */
    void *c;                  /* [P, N] dtype T */
    const int32_t *sorted_ids, *block_expert, *num_blocks;
    int32_t P, N, K, E;
    int32_t max_blocks;       /* grouping blocks of NVFP4MOE_EMUL_BLOCK_M rows */
    int32_t is_bf16;
    int32_t scale_2_halves;   /* as nvfp4moe_marlin_args': 0 [E]; GEMM1 [E, 2] with 1 stacked
                                 halves ([0, N/2) gate), 2 interleaved rows (even gate, odd up) */
} nvfp4moe_emul_args;
cudaError_t nvfp4moe_emul_gemm(const nvfp4moe_emul_args *args, cudaStream_t stream);

/* out [rows, I] = T(QDQ_triton(act(in), gs)): vLLM's activation kernel for ap's activation (with
 * its own roundings to T) on in [rows, N1], then the Triton quantize-dequantize. */
cudaError_t nvfp4moe_emul_activation(const void *in, void *out, int64_t rows, int32_t I, int32_t N1,
                                     const nvfp4moe_gpu_act_params *ap, float gs, int32_t is_bf16,
                                     cudaStream_t stream);

/* vLLM's moe_sum over the top-k slots of y [M * top_k, H] (dtype T) into out [M, H] (out_dtype:
 * nvfp4moe_dtype): top_k 2..4 add in T one slot at a time, other top_k sum in float32 and round to
 * T once; then T -> out_dtype. Slots whose id is outside [0, E) add nothing. H % 8 == 0. (The
 * combine kernel of kernels/moe_pipeline.cu.) */
cudaError_t nvfp4moe_emul_moe_sum(const void *y, const int32_t *ids, int64_t M, int32_t top_k, int32_t E, int32_t H,
                                  int32_t is_bf16, void *out, int32_t out_dtype, cudaStream_t stream);

/* out[i] = div.full.f32(1, b[i]) for i < n, computed on the GPU: the reciprocal that Triton's
 * division by b[i] multiplies with. Measured on the H100 over every positive E4M3 value s and 4097
 * values g in [2^-24, 2^24], s / g and g / s: div.full.f32(a, b) == fl(a * div.full.f32(1, b))
 * every time, and the reciprocal is the correctly rounded 1 / b or one ulp off. The host models the
 * QDQ's division by a global scale with it (src/format/format.h nvfp4moe_qdq_row_triton). Host
 * pointers; synchronous (device memory of its own, the legacy default stream); returns the first
 * CUDA error. */
cudaError_t nvfp4moe_emul_triton_rcp(const float *b, float *out, int32_t n);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_EMULATION_H
