// ep_kernels.cu - expert parallelism's device kernels: the dispatch gather and the combine's
// top-k weighted sum (see ep_kernels.h). One thread handles 8 consecutive values of a row (16
// bytes of a 16-bit row). The arithmetic is the host's (src/ep/dispatch.c): float32, one multiply and one
// add per slot, rounded separately (__fmul_rn/__fadd_rn: no FMA contraction), slots in order.
#include "ep_kernels.h"
#include "nvfp4moe.h"
#include "nvfp4_dev.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

using namespace nvfp4moe_dev;

namespace {

constexpr int kThreads = 256;

inline unsigned grid_for(int64_t n) { return (unsigned)((n + kThreads - 1) / kThreads); }

// 8 values of any element type <-> floats (16-bit: one 16-byte load; float: two).
template <typename T> __device__ __forceinline__ void ld8(const T *p, float *v) { load8<T>(p, v); }
template <> __device__ __forceinline__ void ld8<float>(const float *p, float *v) {
    const float4 a = reinterpret_cast<const float4 *>(p)[0], b = reinterpret_cast<const float4 *>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
template <typename T> __device__ __forceinline__ void st8(T *p, const float *v) { store8<T>(p, v); }
template <> __device__ __forceinline__ void st8<float>(float *p, const float *v) {
    reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Plain gather: bytes only (no conversion), 8 elements of esz bytes per thread.
__global__ void __launch_bounds__(kThreads)
gather_copy_kernel(const char *x, int esz, int64_t H, const int32_t *row_pair, int64_t rows, int top_k, char *dst) {
    const int64_t vpr = H / 8;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * vpr) return;
    const int64_t r = idx / vpr, h0 = (idx % vpr) * 8;
    const int32_t pr = row_pair[r];
    char *d = dst + (r * H + h0) * esz;
    const int words = esz / 2;   // 16-byte words per 8 elements: 1 (16-bit) or 2 (float)
    for (int q = 0; q < words; q++) {
        uint4 u = make_uint4(0, 0, 0, 0);
        if (pr >= 0) u = reinterpret_cast<const uint4 *>(x + ((int64_t)(pr / top_k) * H + h0) * esz)[q];
        reinterpret_cast<uint4 *>(d)[q] = u;
    }
}

// Weighted gather (apply_router_weight_on_input): round(x * w) in the row's dtype.
template <typename T>
__global__ void __launch_bounds__(kThreads)
gather_weighted_kernel(const T *x, int64_t H, const int32_t *row_pair, int64_t rows, int top_k, const float *w,
                       T *dst) {
    const int64_t vpr = H / 8;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * vpr) return;
    const int64_t r = idx / vpr, h0 = (idx % vpr) * 8;
    const int32_t pr = row_pair[r];
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (pr >= 0) {
        ld8<T>(x + (int64_t)(pr / top_k) * H + h0, v);
        const float c = w[pr];
#pragma unroll
        for (int q = 0; q < 8; q++) v[q] = __fmul_rn(v[q], c);
    }
    st8<T>(dst + r * H + h0, v);   // the store rounds to T (16-bit: round to nearest even)
}

template <typename Y, typename O>
__global__ void __launch_bounds__(kThreads)
combine_kernel(const Y *y, const int32_t *pair_row, const float *w, int64_t M, int k, int64_t H, O *out) {
    const int64_t vpr = H / 8;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= M * vpr) return;
    const int64_t t = idx / vpr, h0 = (idx % vpr) * 8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < k; j++) {
        const float c = w ? w[t * k + j] : 1.0f;
        float v[8];
        ld8<Y>(y + (int64_t)pair_row[t * k + j] * H + h0, v);
#pragma unroll
        for (int q = 0; q < 8; q++) acc[q] = __fadd_rn(acc[q], __fmul_rn(c, v[q]));
    }
    st8<O>(out + t * H + h0, acc);
}

template <typename Y>
cudaError_t combine_to(const Y *y, const int32_t *pair_row, const float *w, int64_t M, int k, int64_t H, void *out,
                       int32_t out_dtype, cudaStream_t s) {
    const unsigned g = grid_for(M * (H / 8));
    if (out_dtype == NVFP4MOE_DTYPE_BF16)
        combine_kernel<Y, __nv_bfloat16><<<g, kThreads, 0, s>>>(y, pair_row, w, M, k, H, (__nv_bfloat16 *)out);
    else if (out_dtype == NVFP4MOE_DTYPE_FP16)
        combine_kernel<Y, __half><<<g, kThreads, 0, s>>>(y, pair_row, w, M, k, H, (__half *)out);
    else
        combine_kernel<Y, float><<<g, kThreads, 0, s>>>(y, pair_row, w, M, k, H, (float *)out);
    return cudaGetLastError();
}

__global__ void fill_kernel(float *p, int64_t n, float v) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

}  // namespace

extern "C" cudaError_t nvfp4moe_ep_gather_rows(const void *x, int32_t dtype, int64_t H, const int32_t *row_pair,
                                               int64_t rows, int32_t top_k, const float *weights, void *dst,
                                               cudaStream_t stream) {
    if (rows <= 0 || H <= 0) return cudaSuccess;
    if (H % 8 || top_k < 1) return cudaErrorInvalidValue;
    const unsigned g = grid_for(rows * (H / 8));
    if (!weights) {
        const int esz = dtype == NVFP4MOE_DTYPE_F32 ? 4 : 2;
        gather_copy_kernel<<<g, kThreads, 0, stream>>>((const char *)x, esz, H, row_pair, rows, top_k, (char *)dst);
    } else if (dtype == NVFP4MOE_DTYPE_BF16) {
        gather_weighted_kernel<__nv_bfloat16><<<g, kThreads, 0, stream>>>(
            (const __nv_bfloat16 *)x, H, row_pair, rows, top_k, weights, (__nv_bfloat16 *)dst);
    } else if (dtype == NVFP4MOE_DTYPE_FP16) {
        gather_weighted_kernel<__half><<<g, kThreads, 0, stream>>>((const __half *)x, H, row_pair, rows, top_k,
                                                                   weights, (__half *)dst);
    } else {
        gather_weighted_kernel<float><<<g, kThreads, 0, stream>>>((const float *)x, H, row_pair, rows, top_k, weights,
                                                                  (float *)dst);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t nvfp4moe_ep_combine_rows(const void *y, int32_t y_dtype, const int32_t *pair_row,
                                                const float *weights, int64_t M, int32_t top_k, int64_t H, void *out,
                                                int32_t out_dtype, cudaStream_t stream) {
    if (M <= 0 || H <= 0) return cudaSuccess;
    if (H % 8 || top_k < 1) return cudaErrorInvalidValue;
    if (y_dtype == NVFP4MOE_DTYPE_BF16)
        return combine_to((const __nv_bfloat16 *)y, pair_row, weights, M, top_k, H, out, out_dtype, stream);
    if (y_dtype == NVFP4MOE_DTYPE_FP16)
        return combine_to((const __half *)y, pair_row, weights, M, top_k, H, out, out_dtype, stream);
    return combine_to((const float *)y, pair_row, weights, M, top_k, H, out, out_dtype, stream);
}

extern "C" cudaError_t nvfp4moe_ep_fill_f32(float *p, int64_t n, float v, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, n, v);
    return cudaGetLastError();
}
