// moe_pipeline.cu - the element-wise stages of the GPU MoE pipeline (activation with optional
// NVFP4 QDQ, input scaling/QDQ, top-k combine) and the EMULATION GEMM.
#include "nvfp4moe.h"
#include "nvfp4_dev.cuh"
#include "pipeline.h"
#include "activation.cuh"

#include <math.h>

using namespace nvfp4moe_dev;

namespace {

constexpr int kThreads = 256;

inline unsigned grid_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// One thread = 16 outputs of one row (one NVFP4 block when QDQ follows).
// 8 consecutive inputs of type TI (16-bit or float) as floats.
template <typename TI> __device__ __forceinline__ void load8_any(const TI *p, float *v) { load8<TI>(p, v); }
template <> __device__ __forceinline__ void load8_any<float>(const float *p, float *v) {
    const float4 a = reinterpret_cast<const float4 *>(p)[0], b = reinterpret_cast<const float4 *>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// 8 floats stored as TO (16-bit, rounded to nearest even, or float as they are).
template <typename TO> __device__ __forceinline__ void store8_any(TO *p, const float *v) { store8<TO>(p, v); }
template <> __device__ __forceinline__ void store8_any<float>(float *p, const float *v) {
    reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// TI: input (16-bit or float), T: the activation dtype (the rounding), TO: output (T, or float to
// keep a QDQ result exact as the reference does).
template <typename TI, typename T, typename TO>
__global__ void __launch_bounds__(kThreads)
activation_kernel(const TI *in, TO *out, int64_t rows, int I, int N1, nvfp4moe_gpu_act_params p,
                  float qdq_gs) {
    const int bpr = I / 16;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * bpr) return;
    const int64_t r = idx / bpr;
    const int i0 = (int)(idx % bpr) * 16;
    const TI *x = in + r * N1;
    float v[16];
    if (p.activation >= NVFP4MOE_ACT_SILU_NO_MUL) {
        float a[16];
        load8_any<TI>(x + i0, a);
        load8_any<TI>(x + i0 + 8, a + 8);
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = act_plain(p.activation, a[j]);
    } else if (p.activation == NVFP4MOE_ACT_SWIGLUOAI) {
        float a[32];  // interleaved g0, u0, g1, u1, ...
#pragma unroll
        for (int q = 0; q < 4; q++) load8_any<TI>(x + 2 * i0 + 8 * q, a + 8 * q);
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = act_gated(p, a[2 * j], a[2 * j + 1]);
    } else {
        float g[16], u[16];
        load8_any<TI>(x + i0, g);
        load8_any<TI>(x + i0 + 8, g + 8);
        load8_any<TI>(x + I + i0, u);
        load8_any<TI>(x + I + i0 + 8, u + 8);
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = act_gated(p, g[j], u[j]);
    }
    // the activation's output is a tensor of the activation dtype before anything consumes it
#pragma unroll
    for (int j = 0; j < 16; j++) v[j] = round_t<T>(v[j]);
    if (qdq_gs > 0.0f) qdq16(v, qdq_gs);
    store8_any<TO>(out + r * I + i0, v);
    store8_any<TO>(out + r * I + i0 + 8, v + 8);
}

template <typename T, typename TO>
__global__ void __launch_bounds__(kThreads)
scale_qdq_kernel(const T *in, TO *out, int64_t rows, int cols, const float *row_scale, float gs) {
    const int bpr = cols / 16;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * bpr) return;
    const int64_t r = idx / bpr;
    const int64_t o = r * cols + (idx % bpr) * 16;
    float v[16];
    load8<T>(in + o, v);
    load8<T>(in + o + 8, v + 8);
    if (row_scale) {
        const float s = row_scale[r];
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = round_t<T>(v[j] * s);
    }
    if (gs > 0.0f) qdq16(v, gs);
    store8_any<TO>(out + o, v);
    store8_any<TO>(out + o + 8, v + 8);
}

// One thread = 8 consecutive outputs of one token.
template <typename T>
__global__ void __launch_bounds__(kThreads)
combine_kernel(const T *y, const int32_t *ids, int64_t M, int k, int E, int H, void *out, int out_dtype) {
    const int vpr = H / 8;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= M * vpr) return;
    const int64_t t = idx / vpr;
    const int h0 = (int)(idx % vpr) * 8;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < k; j++) {
        const int e = ids[t * k + j];
        if (e < 0 || e >= E) continue;
        float v[8];
        load8_any<T>(y + (t * k + j) * (int64_t)H + h0, v);
#pragma unroll
        for (int q = 0; q < 8; q++) acc[q] += v[q];
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

// ---- EMULATION GEMM ----
//
// A block computes 16 rows (one grouping block, one expert) x 64 columns. K is walked 64 at a
// time: the 16 gathered activation rows and the 64 weight rows (dequantized to e2m1*e4m3 in float,
// exact) are staged in shared memory, each thread accumulates 1 row x 4 columns in float. This is a
// correctness-first kernel: the numerics are the point (W4A4 emulation), not the speed.
__device__ __forceinline__ float to_fa(float x) { return x; }
__device__ __forceinline__ float to_fa(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_fa(__half x) { return __half2float(x); }

constexpr int kEBM = NVFP4MOE_EMUL_BLOCK_M, kEBN = 64, kEBK = 64;

// TA: the type of A (16-bit, or float for exact QDQ'd activations); T: the 16-bit dtype of C.
template <typename TA, typename T>
__global__ void __launch_bounds__(256) emul_gemm_kernel(nvfp4moe_emul_args a) {
    const int b = blockIdx.x;
    if (b >= *a.num_blocks) return;
    const int e = a.block_expert[b];
    if (e < 0 || e >= a.E) return;
    __shared__ float As[kEBM][kEBK + 4];
    __shared__ float Ws[kEBK][kEBN + 1];
    __shared__ int rows[kEBM];
    const int tid = threadIdx.x;
    const int N = a.N, K = a.K, n0 = blockIdx.y * kEBN;
    if (tid < kEBM) rows[tid] = a.sorted_ids[(int64_t)b * kEBM + tid];
    __syncthreads();
    const TA *A = (const TA *)a.a;
    const int r = tid >> 4, cl = tid & 15;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int ra = tid >> 4, ca = (tid & 15) * 4;
    const int pa = rows[ra];
    const TA *arow = pa < a.P ? A + (int64_t)(pa / a.a_row_div) * K : nullptr;
    const int nl = tid >> 2, kc = (tid & 3) * 16;
    const int nw = n0 + nl;
    const uint8_t *wrow = a.w + ((int64_t)e * N + nw) * (K / 2);
    const uint8_t *srow = a.sf + ((int64_t)e * N + nw) * (K / 16);
    for (int k0 = 0; k0 < K; k0 += kEBK) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int k = k0 + ca + q;
            As[ra][ca + q] = (arow && k < K) ? to_fa(arow[k]) : 0.0f;
        }
        const int kw = k0 + kc;
        if (nw < N && kw < K) {
            const uint2 pk = *reinterpret_cast<const uint2 *>(wrow + kw / 2);
            const float s = e4m3_decode(srow[kw / 16]);
            const uint32_t wd[2] = {pk.x, pk.y};
#pragma unroll
            for (int j = 0; j < 16; j++) Ws[kc + j][nl] = e2m1_decode((wd[j >> 3] >> (4 * (j & 7))) & 15u) * s;
        } else {
#pragma unroll
            for (int j = 0; j < 16; j++) Ws[kc + j][nl] = 0.0f;
        }
        __syncthreads();
#pragma unroll 16
        for (int kk = 0; kk < kEBK; kk++) {
            const float av = As[r][kk];
#pragma unroll
            for (int j = 0; j < 4; j++) acc[j] = fmaf(av, Ws[kk][cl + 16 * j], acc[j]);
        }
        __syncthreads();
    }
    const int p = rows[r];
    if (p >= a.P) return;
    const float s2 = a.scale_2[e];
    const float rs = a.row_scale ? a.row_scale[p] : 1.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int n = n0 + cl + 16 * j;
        if (n >= N) continue;
        float v = acc[j] * s2;
        if (a.bias) v += a.bias[(int64_t)e * N + n];
        v *= rs;
        if (a.c_f32) ((float *)a.c)[(int64_t)p * N + n] = v;
        else ((T *)a.c)[(int64_t)p * N + n] = from_f<T>(v);
    }
}

}  // namespace

extern "C" cudaError_t nvfp4moe_gpu_activation(const void *in, int32_t in_f32, void *out, int32_t out_f32,
                                               int64_t rows, int32_t I, int32_t N1,
                                               const nvfp4moe_gpu_act_params *ap, float qdq_gs, int32_t is_bf16,
                                               cudaStream_t stream) {
    const int64_t n = rows * (I / 16);
    if (n <= 0) return cudaSuccess;
    const unsigned g = grid_for(n, kThreads);
    typedef __nv_bfloat16 B;
    typedef __half F;
    const int sel = (in_f32 ? 4 : 0) | (out_f32 ? 2 : 0) | (is_bf16 ? 1 : 0);
    switch (sel) {
    case 0: activation_kernel<F, F, F><<<g, kThreads, 0, stream>>>((const F *)in, (F *)out, rows, I, N1, *ap, qdq_gs); break;
    case 1: activation_kernel<B, B, B><<<g, kThreads, 0, stream>>>((const B *)in, (B *)out, rows, I, N1, *ap, qdq_gs); break;
    case 2: activation_kernel<F, F, float><<<g, kThreads, 0, stream>>>((const F *)in, (float *)out, rows, I, N1, *ap, qdq_gs); break;
    case 3: activation_kernel<B, B, float><<<g, kThreads, 0, stream>>>((const B *)in, (float *)out, rows, I, N1, *ap, qdq_gs); break;
    case 4: activation_kernel<float, F, F><<<g, kThreads, 0, stream>>>((const float *)in, (F *)out, rows, I, N1, *ap, qdq_gs); break;
    case 5: activation_kernel<float, B, B><<<g, kThreads, 0, stream>>>((const float *)in, (B *)out, rows, I, N1, *ap, qdq_gs); break;
    case 6: activation_kernel<float, F, float><<<g, kThreads, 0, stream>>>((const float *)in, (float *)out, rows, I, N1, *ap, qdq_gs); break;
    default: activation_kernel<float, B, float><<<g, kThreads, 0, stream>>>((const float *)in, (float *)out, rows, I, N1, *ap, qdq_gs); break;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t nvfp4moe_gpu_scale_qdq_rows(const void *in, void *out, int32_t out_f32, int64_t rows,
                                                   int32_t cols, const float *row_scale, float qdq_gs,
                                                   int32_t is_bf16, cudaStream_t stream) {
    const int64_t n = rows * (cols / 16);
    if (n <= 0) return cudaSuccess;
    const unsigned g = grid_for(n, kThreads);
    typedef __nv_bfloat16 B;
    typedef __half F;
    if (is_bf16 && out_f32) scale_qdq_kernel<B, float><<<g, kThreads, 0, stream>>>((const B *)in, (float *)out, rows, cols, row_scale, qdq_gs);
    else if (is_bf16) scale_qdq_kernel<B, B><<<g, kThreads, 0, stream>>>((const B *)in, (B *)out, rows, cols, row_scale, qdq_gs);
    else if (out_f32) scale_qdq_kernel<F, float><<<g, kThreads, 0, stream>>>((const F *)in, (float *)out, rows, cols, row_scale, qdq_gs);
    else scale_qdq_kernel<F, F><<<g, kThreads, 0, stream>>>((const F *)in, (F *)out, rows, cols, row_scale, qdq_gs);
    return cudaGetLastError();
}

extern "C" cudaError_t nvfp4moe_gpu_combine(const void *y, int32_t y_f32, const int32_t *ids, int64_t M,
                                            int32_t top_k, int32_t E, int32_t H, int32_t is_bf16,
                                            void *out, int32_t out_dtype, cudaStream_t stream) {
    const int64_t n = M * (H / 8);
    if (n <= 0) return cudaSuccess;
    const unsigned g = grid_for(n, kThreads);
    if (y_f32)
        combine_kernel<float><<<g, kThreads, 0, stream>>>((const float *)y, ids, M, top_k, E, H, out, out_dtype);
    else if (is_bf16)
        combine_kernel<__nv_bfloat16><<<g, kThreads, 0, stream>>>((const __nv_bfloat16 *)y, ids, M, top_k, E, H,
                                                                  out, out_dtype);
    else
        combine_kernel<__half><<<g, kThreads, 0, stream>>>((const __half *)y, ids, M, top_k, E, H, out, out_dtype);
    return cudaGetLastError();
}

extern "C" cudaError_t nvfp4moe_emul_gemm(const nvfp4moe_emul_args *args, cudaStream_t stream) {
    if (args->max_blocks <= 0 || args->N <= 0) return cudaSuccess;
    dim3 grid((unsigned)args->max_blocks, (unsigned)((args->N + kEBN - 1) / kEBN));
    typedef __nv_bfloat16 B;
    if (args->a_f32 && args->is_bf16) emul_gemm_kernel<float, B><<<grid, 256, 0, stream>>>(*args);
    else if (args->a_f32) emul_gemm_kernel<float, __half><<<grid, 256, 0, stream>>>(*args);
    else if (args->is_bf16) emul_gemm_kernel<B, B><<<grid, 256, 0, stream>>>(*args);
    else emul_gemm_kernel<__half, __half><<<grid, 256, 0, stream>>>(*args);
    return cudaGetLastError();
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
