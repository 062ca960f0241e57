/*
 * ep_kernels.h - the C interface of expert parallelism's device kernels (kernels/ep_kernels.cu):
 * the dispatch's gather of hidden rows into the per-destination send buffer, the combine's top-k
 * weighted sum in slot order, and a fill. Plain C, C linkage; includable from C and CUDA. All
 * pointers are device pointers. Each function only enqueues work on `stream` (no allocation, no
 * synchronization) and returns the launch's error (cudaGetLastError).
 *
 * Row and pair indices are the ones of nvfp4moe_ep_dispatch (include/nvfp4moe.h), narrowed to
 * int32 by the caller: pair p = token * top_k + slot.
 */
#ifndef NVFP4MOE_EP_KERNELS_H
#define NVFP4MOE_EP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[r, :] = x[row_pair[r] / top_k, :] for r < rows, or zeros where row_pair[r] < 0 (padding of
 * the batched format). With weights (NULL: a plain copy), the row is multiplied by
 * weights[row_pair[r]] in float and rounded to dtype, as apply_router_weight_on_input does on one
 * rank. dtype: nvfp4moe_dtype of x and dst. H % 8 == 0; x and dst 16-byte aligned. */
cudaError_t nvfp4moe_ep_gather_rows(const void *x, int32_t dtype, int64_t H, const int32_t *row_pair, int64_t rows,
                                    int32_t top_k, const float *weights, void *dst, cudaStream_t stream);

/* out[t, :] = round_to_out_dtype(sum over j = 0..top_k-1, in this order, of c_j * y[pair_row[t*top_k + j], :])
 * for t < M, accumulated in float32 without fused multiply-add (c_j = weights[t*top_k + j], or 1
 * when weights is NULL): the definition of nvfp4moe_ep_combine, on the device. y_dtype and
 * out_dtype: nvfp4moe_dtype. H % 8 == 0; y and out 16-byte aligned. */
cudaError_t nvfp4moe_ep_combine_rows(const void *y, int32_t y_dtype, const int32_t *pair_row, const float *weights,
                                     int64_t M, int32_t top_k, int64_t H, void *out, int32_t out_dtype,
                                     cudaStream_t stream);

/* p[i] = v for i < n. */
cudaError_t nvfp4moe_ep_fill_f32(float *p, int64_t n, float v, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif // NVFP4MOE_EP_KERNELS_H
