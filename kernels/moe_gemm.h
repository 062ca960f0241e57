/*
 * moe_gemm.h - the C interface between the host glue (src/backends/cuda.c) and the MoE GEMM kernels
 * of the MARLIN-class W4A16 backend (kernels/marlin_*.cu). Plain C, C linkage; includable from C
 * and CUDA. All pointers are device pointers unless a comment says otherwise.
 *
 * Token grouping (moe_align style), shared by every grouped kernel:
 *   P = M * top_k (token, slot) pairs; pair p = t * top_k + j is token t's j-th expert.
 *   sorted_ids   [cap]            pair indices grouped by expert, each expert's run padded to a
 *                                 multiple of block_m with the sentinel value P
 *   block_expert [cap / block_m]  the expert of each block of block_m rows; -1 past num_blocks
 *   num_blocks   [1]              valid blocks (device memory: launches never read it on the host)
 *   cap = nvfp4moe_group_capacity(P, E, block_m)
 */
#ifndef NVFP4MOE_MOE_GEMM_H
#define NVFP4MOE_MOE_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of sorted_ids needed for P pairs over E experts with blocks of block_m rows. */
static inline int64_t nvfp4moe_group_capacity(int64_t P, int64_t E, int64_t block_m) {
    int64_t cap = P + E * (block_m - 1);
    return (cap + block_m - 1) / block_m * block_m;
}

/* Bytes of device memory the repacked weights of E experts of shape [N, K] take. */
size_t nvfp4moe_marlin_packed_bytes(int32_t E, int32_t N, int32_t K);

/* Repacks canonical NVFP4 weights into the kernel's layout, once, at plan creation.
 *   w     [E, N, K/2]  packed E2M1 (element 2j low nibble), device
 *   sf    [E, N, K/16] E4M3 block scales, linear layout, device
 *   out   nvfp4moe_marlin_packed_bytes(E, N, K) bytes, device
 * N and K are multiples of 16; the layout pads them to the kernel's tiles with zeros. */
cudaError_t nvfp4moe_marlin_repack(const uint8_t *w, const uint8_t *sf, int32_t E, int32_t N,
                                   int32_t K, void *out, cudaStream_t stream);

typedef struct nvfp4moe_marlin_args {
    const void *a;            /* activations, bf16 or fp16, rows of K values */
    int32_t a_row_div;        /* pair p reads A row p / a_row_div (GEMM1: top_k; GEMM2: 1) */
    const void *b;            /* repacked weights */
    const float *scale_2;     /* [E] per-expert dequantization scale (ModelOpt weight_scale_2), or
                                 [E, 2] (gate, up) per scale_2_halves */
    const float *bias;        /* [E, N] float added after scaling, or NULL */
    const float *row_scale;   /* [P] output row p is multiplied by row_scale[p] (GEMM2: top-k
                                 weights), or NULL */
    void *c;                  /* [P, N] output, row p = pair p, same dtype as a */
    const int32_t *sorted_ids;
    const int32_t *block_expert;
    const int32_t *num_blocks;
    int32_t P, N, K, E;
    int32_t block_m;          /* rows per block of sorted_ids (8, 16, 32, 48 or 64) */
    int32_t max_blocks;       /* cap / block_m: the grid is sized from this, never from num_blocks */
    int32_t is_bf16;          /* 1: bf16, 0: fp16 */
    void *workspace;          /* nvfp4moe_marlin_workspace_bytes(...) bytes (the Hopper GEMM:
                                 nvfp4moe_hopper_workspace_bytes), or NULL if 0; one launch at a
                                 time: the GEMM clears and rewrites it */
    int32_t sm_count;         /* multiprocessors of the device */
    int32_t scale_2_halves;   /* 0: scale_2 is [E], one scale per expert. GEMM1 of a gated
                                 activation, scale_2 [E, 2] (gate, up): 1, rows [0, N/2) gate and
                                 [N/2, N) up; 2, rows interleaved g0, u0, g1, u1 (swigluoai) */
    int32_t token_subtiles;   /* the Hopper GEMM at block_m 64 and 128 only (MARLIN and other
                                 block_m ignore it): 0 or 2 run each item on the narrowest token
                                 tile that holds its block's pairs, 1 forces one tile of block_m
                                 tokens (kernels/hopper_gemm.h) */
    int32_t row_tiles;        /* the Hopper GEMM at block_m 64 and 128 only: 0 chooses, 1 or 2
                                 force the 128-row weight tiles per work item (kernels/hopper_gemm.h) */
    void *act_out;            /* the Hopper GEMM only (MARLIN ignores both): GEMM1 may apply its
                                 gated activation itself and write act(C) [P, N/2] here instead of
                                 C, where nvfp4moe_hopper_fuses_activation says so; or NULL */
    const struct nvfp4moe_gpu_act_params *act;  /* that activation (kernels/pipeline.h), or NULL */
    /* The Hopper GEMM only (MARLIN ignores both): launch overlap between GEMM1 and GEMM2.
     * next_workspace: the workspace of the GEMM launched right after this one with pdl = 1 (a
     * region apart from this launch's); this launch zeroes that GEMM's item counter before it lets
     * a dependent start, or NULL. pdl = 1: launched as a programmatic dependent of the kernel
     * ahead on the stream, a GEMM whose next_workspace was this workspace and which let its
     * dependents start only once the grouping had finished; this launch then reads the grouping
     * and issues its first weight copies before it waits for the kernel ahead, and clears no item
     * counter.
     * Where the GEMM has no item counter to claim from (no workspace, block_m 8 or 16) or has to
     * clear its split-K area, the launch is a plain one.
     * pdl_head = 1 (the Hopper GEMM only): launched as a programmatic dependent of the grouping
     * kernel, which zeroed this launch's item counter (nvfp4moe_gpu_chain.zero, kernels/pipeline.h:
     * the first int32 of `workspace`); the launch waits for it before it reads anything, and lets
     * its own dependents start only after that wait. A launch that has to clear its split-K area
     * does so and is a plain one. */
    void *next_workspace;
    int32_t pdl;
    int32_t pdl_head;
} nvfp4moe_marlin_args;

/* Workspace the GEMM needs for these sizes (may be 0). */
size_t nvfp4moe_marlin_workspace_bytes(int32_t P, int32_t N, int32_t K, int32_t max_blocks,
                                       int32_t block_m, int32_t sm_count);

/* C[p, :] = row_scale[p] * (scale_2[e] * (A[p / a_row_div, :] . dequant(W_e)^T) + bias[e, :])
 * (with scale_2_halves, column n's scale is its half's: scale_2[2 e + half(n)])
 * for every valid pair p in a block of expert e. Rows of padding (sentinel) are not written.
 * No allocation, no host synchronization: capturable in a CUDA graph. */
cudaError_t nvfp4moe_marlin_gemm(const nvfp4moe_marlin_args *args, cudaStream_t stream);

/* The block_m the GEMM prefers for P pairs over E experts (vLLM: the first of 8, 16, 32, 48, 64
 * with P/E/block_m < 0.9, else 64). */
int32_t nvfp4moe_marlin_block_m(int64_t P, int32_t E);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_MOE_GEMM_H
