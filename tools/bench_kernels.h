/*
 * bench_kernels.h - the helper kernels of `nvfp4moe bench` (tools/bench_kernels.cu): random NVFP4
 * weights made on the GPU, the cuBLAS baseline's dequantization, gather and weighted combine, and
 * the copy whose bandwidth is the roofline floor. Part of the bench tool, not of libnvfp4moe.
 * Plain C, C linkage; all pointers are device pointers; each function only enqueues work on
 * `stream` and returns the launch's error.
 */
#ifndef NVFP4MOE_BENCH_KERNELS_H
#define NVFP4MOE_BENCH_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* n random bytes (any byte is two valid E2M1 codes), deterministic in seed. */
cudaError_t nvfp4moe_gpu_fill_random_bytes(uint8_t *out, size_t n, uint64_t seed, cudaStream_t stream);
/* n random positive E4M3 scale codes between 2^-3 and 448 (valid, never NaN or zero). */
cudaError_t nvfp4moe_gpu_fill_random_e4m3(uint8_t *out, size_t n, uint64_t seed, cudaStream_t stream);
/* n random 16-bit (bf16 or fp16) or float values, uniform in [-scale, scale). dtype: nvfp4moe_dtype. */
cudaError_t nvfp4moe_gpu_fill_random_values(void *out, size_t n, int32_t dtype, float scale,
                                            uint64_t seed, cudaStream_t stream);
/* out [E, N, K] bf16 = e2m1 * e4m3 * scale_2[e] of canonical NVFP4 weights. */
cudaError_t nvfp4moe_gpu_dequant_bf16(const uint8_t *w, const uint8_t *sf, const float *scale_2,
                                      int32_t E, int32_t N, int32_t K, void *out, cudaStream_t stream);
/* dst[r, :] = src[idx[r] / div, :] for r < rows (16-bit values, cols % 8 == 0). */
cudaError_t nvfp4moe_gpu_gather_rows(const void *src, const int32_t *idx, int32_t div, int64_t rows,
                                     int32_t cols, void *dst, cudaStream_t stream);
/* dst = src, bytes % 16 == 0, both 16-byte aligned: the copy whose bandwidth is the floor's.
 * blocks_per_sm: grid size per multiprocessor (0: 8). */
cudaError_t nvfp4moe_gpu_copy(void *dst, const void *src, size_t bytes, int32_t blocks_per_sm,
                              cudaStream_t stream);
/* out [M, H] (16-bit) = sum_j weights[t*k+j] * y[pos[t*k+j], :], y 16-bit. */
cudaError_t nvfp4moe_gpu_weighted_combine(const void *y, const int32_t *pos, const float *weights,
                                          int64_t M, int32_t top_k, int32_t H, int32_t is_bf16,
                                          void *out, cudaStream_t stream);

/* Reads `bytes` of buf (16-byte aligned) with (sm_count x 4) CTAs of 4 warps and discards them:
 * mode 0 linearly; mode 1 in the decode kernels' pattern over HOPPER_WGMMA's packed chunks (a
 * warp per pair of 16-row groups, over k_tiles 9216-byte chunks: 2 x 1 KB of codes and 2 x 128 B
 * of scales each); mode 2 the same bytes per warp with each group's k tiles contiguous. A probe
 * of what the memory system gives each access pattern (gpu_hopper_decode --stream). */
cudaError_t nvfp4moe_gpu_read_probe(const void *buf, size_t bytes, int32_t mode, int32_t k_tiles, uint32_t *sink,
                                    int32_t sm_count, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_BENCH_KERNELS_H
