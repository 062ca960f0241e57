// moe_pipeline.cu - the element-wise stages of the W4A16 backends' GPU pipeline (activation, input
// scaling by the router weight, top-k combine), and the combine's vLLM moe_sum mode for EMULATION,
// whose other kernels are in kernels/emulation.cu.
#include "nvfp4moe.h"
#include "nvfp4_dev.cuh"
#include "pipeline.h"
#include "emulation.h"
#include "activation.cuh"
#include "pdl.cuh"

#include <math.h>

using namespace nvfp4moe_dev;

namespace {

constexpr int kThreads = 256;

inline unsigned grid_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// One thread = 16 outputs of one row: out = T(act(in)), computed in float from the 16-bit inputs.
template <typename T>
__global__ void __launch_bounds__(kThreads)
activation_kernel(const T *in, T *out, int64_t rows, int I, int N1, nvfp4moe_gpu_act_params p) {
    int64_t r, o;
    if (!block16_of((int64_t)blockIdx.x * blockDim.x + threadIdx.x, rows, I, &r, &o)) return;
    float v[16];
    act_row16<T>(in + r * N1, I, (int)(o - r * I), p.activation, [&](float g, float u) { return act_gated(p, g, u); },
                 [&](float a) { return act_plain(p.activation, a); }, v);
    store16<T>(out + o, v);
}

// One thread = 16 values of one row: out = T(in * row_scale[r]).
template <typename T>
__global__ void __launch_bounds__(kThreads)
scale_kernel(const T *in, T *out, int64_t rows, int cols, const float *row_scale) {
    int64_t r, o;
    if (!block16_of((int64_t)blockIdx.x * blockDim.x + threadIdx.x, rows, cols, &r, &o)) return;
    float v[16];
    load16<T>(in + o, v);
    const float s = row_scale[r];
#pragma unroll
    for (int j = 0; j < 16; j++) v[j] = v[j] * s;
    store16<T>(out + o, v);
}

// One thread = 8 consecutive outputs of one token. kVllmMoeSum: vLLM's moe_sum (EMULATION's): for
// top_k 2..4 the slots are added in T one at a time (moe_sum_kernel<scalar_t, TOPK> accumulates in
// scalar_t), otherwise in float and rounded to T once (at::sum_out), then stored as out_dtype.
// Without it: a float sum in slot order rounded once to out_dtype.
template <typename T, bool kVllmMoeSum>
__global__ void __launch_bounds__(kThreads)
combine_kernel(const T *y, const int32_t *ids, int64_t M, int k, int E, int H, void *out, int out_dtype) {
    nvfp4moe_pdl::wait();  // launched with PDL (nvfp4moe_gpu_combine): the kernel ahead complete
    const int vpr = H / 8;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= M * vpr) return;
    const int64_t t = idx / vpr;
    const int h0 = (int)(idx % vpr) * 8;
    const bool in_t = kVllmMoeSum && k >= 2 && k <= 4;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < k; j++) {
        const int e = ids[t * k + j];
        if (e < 0 || e >= E) continue;
        float v[8];
        load8<T>(y + (t * k + j) * (int64_t)H + h0, v);
#pragma unroll
        for (int q = 0; q < 8; q++) acc[q] = in_t ? round_t<T>(acc[q] + v[q]) : acc[q] + v[q];
    }
    if (kVllmMoeSum) {
#pragma unroll
        for (int q = 0; q < 8; q++) acc[q] = round_t<T>(acc[q]);
    }
    const int64_t o = t * H + h0;
    if (out_dtype == NVFP4MOE_DTYPE_BF16) store8<__nv_bfloat16>((__nv_bfloat16 *)out + o, acc);
    else if (out_dtype == NVFP4MOE_DTYPE_FP16) store8<__half>((__half *)out + o, acc);
    else {
        float4 *f = reinterpret_cast<float4 *>((float *)out + o);
        f[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        f[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
}

template <bool kVllmMoeSum>
cudaError_t launch_combine(const void *y, const int32_t *ids, int64_t M, int32_t top_k, int32_t E, int32_t H,
                           int32_t is_bf16, void *out, int32_t out_dtype, bool pdl, cudaStream_t stream) {
    const int64_t n = M * (H / 8);
    if (n <= 0) return cudaSuccess;
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        nvfp4moe_pdl::config(dim3(grid_for(n, kThreads)), dim3(kThreads), 0, stream, pdl, &attr);
    cudaError_t err;
    if (is_bf16)
        err = cudaLaunchKernelEx(&cfg, combine_kernel<__nv_bfloat16, kVllmMoeSum>, (const __nv_bfloat16 *)y, ids, M,
                                 (int)top_k, (int)E, (int)H, out, (int)out_dtype);
    else
        err = cudaLaunchKernelEx(&cfg, combine_kernel<__half, kVllmMoeSum>, (const __half *)y, ids, M, (int)top_k,
                                 (int)E, (int)H, out, (int)out_dtype);
    return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t nvfp4moe_gpu_activation(const void *in, void *out, int64_t rows, int32_t I, int32_t N1,
                                               const nvfp4moe_gpu_act_params *ap, int32_t is_bf16, cudaStream_t stream) {
    const int64_t n = rows * (I / 16);
    if (n <= 0) return cudaSuccess;
    const unsigned g = grid_for(n, kThreads);
    typedef __nv_bfloat16 B;
    typedef __half F;
    if (is_bf16) activation_kernel<B><<<g, kThreads, 0, stream>>>((const B *)in, (B *)out, rows, I, N1, *ap);
    else activation_kernel<F><<<g, kThreads, 0, stream>>>((const F *)in, (F *)out, rows, I, N1, *ap);
    return cudaGetLastError();
}

extern "C" cudaError_t nvfp4moe_gpu_scale_rows(const void *in, void *out, int64_t rows, int32_t cols,
                                               const float *row_scale, int32_t is_bf16, cudaStream_t stream) {
    const int64_t n = rows * (cols / 16);
    if (n <= 0) return cudaSuccess;
    const unsigned g = grid_for(n, kThreads);
    typedef __nv_bfloat16 B;
    typedef __half F;
    if (is_bf16) scale_kernel<B><<<g, kThreads, 0, stream>>>((const B *)in, (B *)out, rows, cols, row_scale);
    else scale_kernel<F><<<g, kThreads, 0, stream>>>((const F *)in, (F *)out, rows, cols, row_scale);
    return cudaGetLastError();
}

extern "C" cudaError_t nvfp4moe_gpu_combine(const void *y, const int32_t *ids, int64_t M, int32_t top_k, int32_t E,
                                            int32_t H, int32_t is_bf16, void *out, int32_t out_dtype, int32_t pdl,
                                            cudaStream_t stream) {
    return launch_combine<false>(y, ids, M, top_k, E, H, is_bf16, out, out_dtype, pdl != 0, stream);
}

extern "C" cudaError_t nvfp4moe_emul_moe_sum(const void *y, const int32_t *ids, int64_t M, int32_t top_k, int32_t E,
                                             int32_t H, int32_t is_bf16, void *out, int32_t out_dtype,
                                             cudaStream_t stream) {
    return launch_combine<true>(y, ids, M, top_k, E, H, is_bf16, out, out_dtype, false, stream);
}

// ---- weight checks (plans over device-resident weights) ----

__global__ void find_e4m3_nan_kernel(const uint8_t *sf, size_t n, unsigned long long *first) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        if ((sf[i] & 0x7F) == 0x7F) {
            atomicMin(first, (unsigned long long)i);
            return;  // a later NaN of this thread cannot come first
        }
}

extern "C" cudaError_t nvfp4moe_gpu_find_e4m3_nan(const uint8_t *sf, size_t n, unsigned long long *first,
                                                  cudaStream_t stream) {
    const unsigned long long none = ~0ull;
    cudaError_t err = cudaMemcpyAsync(first, &none, sizeof none, cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess || !n) return err;
    int dev = 0, sms = 132;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const size_t want = (n + kThreads - 1) / kThreads;
    const unsigned blocks = (unsigned)(want < (size_t)sms * 8 ? want : (size_t)sms * 8);
    find_e4m3_nan_kernel<<<blocks, kThreads, 0, stream>>>(sf, n, first);
    return cudaGetLastError();
}
