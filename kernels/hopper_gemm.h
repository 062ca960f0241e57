/*
 * hopper_gemm.h - the C interface of the Hopper-native (sm_90a, wgmma) W4A16 MoE GEMM
 * (kernels/hopper_gemm.cu). Same shape as the MARLIN GEMM's interface (kernels/moe_gemm.h): the
 * token grouping arrays, a repack done once, a workspace query and a graph-capturable GEMM, so the
 * pipeline glue can swap one GEMM for the other. Plain C, C linkage; includable from C and CUDA.
 * All pointers are device pointers unless a comment says otherwise.
 *
 * Runs on compute capability 9.0 only (the kernel is built for sm_90a); on any other device
 * nvfp4moe_hopper_gemm returns cudaErrorNoKernelImageForDevice and launches nothing.
 */
#ifndef NVFP4MOE_HOPPER_GEMM_H
#define NVFP4MOE_HOPPER_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "moe_gemm.h"  // nvfp4moe_group_capacity and the grouping conventions

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of device memory the repacked weights of E experts of shape [N, K] take (N is padded to
 * 128 and K to 128 with zeros). */
size_t nvfp4moe_hopper_packed_bytes(int32_t E, int32_t N, int32_t K);

/* Repacks canonical NVFP4 weights into the kernel's layout, once, at plan creation.
 *   w     [E, N, K/2]  packed E2M1 (element 2j low nibble), device
 *   sf    [E, N, K/16] E4M3 block scales, linear layout, device
 *   out   nvfp4moe_hopper_packed_bytes(E, N, K) bytes, device
 * N and K are multiples of 16. Zero scales give exact zeros and negative scales flip the codes'
 * signs; E4M3 NaN scales (0x7F/0xFF) are not supported (read as 480). */
cudaError_t nvfp4moe_hopper_repack(const uint8_t *w, const uint8_t *sf, int32_t E, int32_t N,
                                   int32_t K, void *out, cudaStream_t stream);

typedef struct nvfp4moe_hopper_args {
    const void *a;            /* activations, bf16 or fp16, rows of K values */
    int32_t a_row_div;        /* pair p reads A row p / a_row_div (GEMM1: top_k; GEMM2: 1) */
    const void *b;            /* repacked weights */
    const float *scale_2;     /* [E] per-expert dequantization scale (ModelOpt weight_scale_2) */
    const float *bias;        /* [E, N] float added after scaling, or NULL */
    const float *row_scale;   /* [P] output row p is multiplied by row_scale[p], or NULL */
    void *c;                  /* [P, N] output, row p = pair p, same dtype as a */
    const int32_t *sorted_ids;
    const int32_t *block_expert;
    const int32_t *num_blocks;
    int32_t P, N, K, E;
    int32_t block_m;          /* rows per block of sorted_ids (8, 16, 32, 64 or 128) */
    int32_t max_blocks;       /* cap / block_m: the grid is sized from this, never from num_blocks */
    int32_t is_bf16;          /* 1: bf16, 0: fp16 */
    void *workspace;          /* nvfp4moe_hopper_workspace_bytes(...) bytes, or NULL (no split-K) */
    int32_t sm_count;         /* multiprocessors of the device */
} nvfp4moe_hopper_args;

/* Workspace the GEMM can use for split-K at these sizes (0: it never splits K). */
size_t nvfp4moe_hopper_workspace_bytes(int32_t P, int32_t N, int32_t K, int32_t max_blocks,
                                       int32_t block_m, int32_t sm_count);

/* C[p, :] = row_scale[p] * (scale_2[e] * (A[p / a_row_div, :] . dequant(W_e)^T) + bias[e, :])
 * for every valid pair p in a block of expert e. Rows of padding (sentinel) are not written.
 * No allocation, no host synchronization: capturable in a CUDA graph (the split-K workspace is
 * cleared with cudaMemsetAsync on the stream). */
cudaError_t nvfp4moe_hopper_gemm(const nvfp4moe_hopper_args *args, cudaStream_t stream);

/* The block_m the GEMM prefers for P pairs over E experts: the first of 8, 16, 32, 64 with
 * P/E/block_m < 0.9, else 128 (wgmma's token dimension N = block_m). */
int32_t nvfp4moe_hopper_block_m(int64_t P, int32_t E);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_HOPPER_GEMM_H
