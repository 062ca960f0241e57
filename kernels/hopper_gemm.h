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
 *   is_bf16  the activations the kernels will multiply them with: 1 bf16, 0 fp16 (the bits of a
 *            word sit where that type's decode wants them: kernels/hopper_bits.h)
 * N and K are multiples of 16. Zero scales give exact zeros and negative scales flip the codes'
 * signs; E4M3 NaN scales (0x7F/0xFF) are not supported (read as 480). */
cudaError_t nvfp4moe_hopper_repack(const uint8_t *w, const uint8_t *sf, int32_t E, int32_t N,
                                   int32_t K, int32_t is_bf16, void *out, cudaStream_t stream);

/* The GEMM's arguments are MARLIN's (kernels/moe_gemm.h), field for field, so the backend glue
 * fills one struct for either kernel; here block_m is 8, 16, 32, 64 or 128. The workspace must
 * hold nvfp4moe_hopper_workspace_bytes and serve one launch at a time (the GEMM clears and
 * rewrites it; a launch with args->pdl or args->pdl_head finds its item counter zeroed by the
 * kernel ahead). With it, at block_m 32, 64 and 128 the CTAs claim work items from a counter in it
 * as they free up (a CTA that drew short items takes more), and K may be split; block_m 8 and 16
 * deal the items round robin. A NULL workspace deals them round robin and never splits K.
 * Block_m 32 runs two CTAs per multiprocessor, the others one.
 * token_subtiles is this GEMM's alone: at block_m 64 and 128 each work
 * item runs on the narrowest token tile that holds its block's pairs (block_m 64: 64, 32 or 16
 * token columns; block_m 128: 128 or 32), so an expert's last, mostly empty block costs a narrow
 * tile. 0 (the glue's zeroed default) and 2 choose so; 1 forces one tile of block_m columns, for
 * tests and benchmarks. block_m 8, 16 and 32 are always one tile. */
typedef nvfp4moe_marlin_args nvfp4moe_hopper_args;

/* Workspace bytes the GEMM uses at these sizes: a 16-byte item counter, plus the split-K partial
 * sums and arrival counters where it may split K; 0 for sizes it refuses. The workspace itself
 * must be 16-byte aligned. */
size_t nvfp4moe_hopper_workspace_bytes(int32_t P, int32_t N, int32_t K, int32_t max_blocks,
                                       int32_t block_m, int32_t sm_count);

/* C[p, :] = row_scale[p] * (scale_2[e] * (A[p / a_row_div, :] . dequant(W_e)^T) + bias[e, :])
 * (with scale_2_halves, column n's scale is its half's: scale_2[2 e + half(n)])
 * for every valid pair p in a block of expert e. Rows of padding (sentinel) are not written.
 * No allocation, no host synchronization: capturable in a CUDA graph (the workspace is
 * cleared with cudaMemsetAsync on the stream, except a PDL launch's item counter).
 * cudaErrorInvalidValue for N or K not a multiple of 16, block_m not one of 8, 16, 32, 64, 128,
 * C not 4-byte aligned (the epilogue stores two adjacent values at once; act_out likewise),
 * token_subtiles or row_tiles not 0, 1 or 2, or activations of 32 GiB or more (ceil(P /
 * a_row_div) rows of K values: the kernel addresses rows by 32-bit offsets). */
cudaError_t nvfp4moe_hopper_gemm(const nvfp4moe_hopper_args *args, cudaStream_t stream);

/* The token tile widths nvfp4moe_hopper_gemm(args) chooses from per work item: 1 (always
 * block_m), 3 (block_m 64: 64, 32, 16) or 2 (block_m 128: 128, 32); 0 for a block_m it does not
 * take, or for a token_subtiles or row_tiles the GEMM refuses. For tests and benchmarks to report
 * which form ran. Reads block_m, token_subtiles and row_tiles only. */
int32_t nvfp4moe_hopper_token_subtiles(const nvfp4moe_hopper_args *args);

/* The 128-row weight tiles per work item that nvfp4moe_hopper_gemm(args) runs (1 or 2; 0 for a
 * block_m it does not take, or for a row_tiles the GEMM refuses). With 2 (block_m 32, 64 and 128)
 * a CTA multiplies 256 weight rows with each stage of gathered token rows, half the activation
 * traffic per MMA of 1. row_tiles 0 chooses (2), 1 or 2 force it (for tests and benchmarks;
 * block_m 8 and 16 always run 1). Reads block_m and row_tiles only. */
int32_t nvfp4moe_hopper_row_tiles(const nvfp4moe_hopper_args *args);

/* 1 when nvfp4moe_hopper_gemm(args) applies GEMM1's gated activation itself: args->act_out and
 * args->act are set, the launch runs two weight tiles per item (nvfp4moe_hopper_row_tiles), the
 * activation is silu (SiLU-and-mul, with or without its limit) on stacked halves (gate rows
 * [0, N/2), up rows [N/2, N); scale_2_halves != 2) and N is a multiple of 256. Then the GEMM writes
 * act_out[p, j] = act(C[p, j], C[p, j + N/2]) for j < N/2, from C's values rounded to the 16-bit
 * type exactly as the activation kernel (kernels/pipeline.h) would read them back, and leaves C
 * untouched; otherwise (0) it writes C and ignores act_out. */
int32_t nvfp4moe_hopper_fuses_activation(const nvfp4moe_hopper_args *args);

/* The block_m the GEMM prefers for P pairs over E experts of intermediate size I (GEMM2's K): 128
 * from P/E >= 1.1 * 64; 32 from more than 3 up to 24 pairs per expert with 32 experts or more and
 * 0 < I <= 1536; else 64 from more than 3 pairs per expert (with fewer than 32 experts, from 16);
 * below that the first of 8, 16, 32 with P/E/block_m < 0.9 (up to 3 pairs per expert the decode
 * regime runs unless the GEMM is forced). */
int32_t nvfp4moe_hopper_block_m(int64_t P, int32_t E, int32_t I);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_HOPPER_GEMM_H
