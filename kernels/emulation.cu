// emulation.cu - the EMULATION backend's kernels: vLLM's EMULATION path
// (vllm/model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py) with vLLM's rounding points
// and the instructions vLLM's GPU kernels use, so that a layer computes what vLLM computes:
//
//   input     prepare's a1 * topk_weights.to(a1.dtype), then the Triton quantize-dequantize
//             (_nvfp4_quant_dequant_kernel, quantization/utils/nvfp4_emulation_utils.py)
//   GEMMs     fused_moe_nvfp4_emulation_kernel: weights T(e2m1 * (e4m3 * scale_2)), float32
//             accumulation, x top-k weight in float32, the output stored as T
//   activation csrc/activation_kernels.cu (silu/gelu/gelu_tanh_and_mul, silu_and_mul_clamp,
//             swigluoai_and_mul, situ_and_mul), swiglustep_and_mul_triton, torch's F.silu/F.gelu/
//             relu+square for the _no_mul ones, each with its own roundings; then the Triton QDQ
//   moe_sum   csrc/moe/moe_align_sum_kernels.cu: top_k 2..4 accumulate in T, at::sum_out otherwise
//             (the combine kernel of kernels/moe_pipeline.cu in its vLLM mode)
//
// The host implementation (src/reference/emulation.c) computes the same with correctly rounded
// divisions and transcendental functions; this file uses what vLLM's kernels use: Triton's
// div.full.f32 and ex2.approx.f32 where Triton emits them, CUDA's expf/erff/tanhf elsewhere. So the
// two agree bit for bit except where those differ in the last bit. Correctness, not speed, is the
// point: the GEMM is a simple shared-memory tiling.
#include "nvfp4moe.h"
#include "nvfp4_dev.cuh"
#include "activation.cuh"
#include "emulation.h"

#include <math.h>

using namespace nvfp4moe_dev;

namespace {

constexpr int kThreads = 256;

inline unsigned grid_for(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// ---- the instructions Triton emits ----

// fp32 '/' in Triton: div.full.f32 (approximate, at most 2 ulp).
__device__ __forceinline__ float triton_div(float a, float b) {
    float r;
    asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
// tl.exp on float32: ex2.approx.f32 of x * log2(e).
__device__ __forceinline__ float triton_exp(float x) {
    float r;
    const float t = __fmul_rn(x, 1.4426950408889634f);
    asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(t));
    return r;
}

// ---- the Triton quantize-dequantize of one block of 16 ----

// _round_to_fp4: the E2M1 grid's thresholds, ties to even, times where(x < 0, -1, 1).
__device__ __forceinline__ float round_to_fp4(float x) {
    const float a = fabsf(x);
    float r = a > 5.0f ? 6.0f : 0.0f;
    if (a >= 3.5f && a <= 5.0f) r = 4.0f;
    if (a > 2.5f && a < 3.5f) r = 3.0f;
    if (a >= 1.75f && a <= 2.5f) r = 2.0f;
    if (a > 1.25f && a < 1.75f) r = 1.5f;
    if (a >= 0.75f && a <= 1.25f) r = 1.0f;
    if (a > 0.25f && a < 0.75f) r = 0.5f;
    return r * (x < 0.0f ? -1.0f : 1.0f);
}

// FP8 E4M3 "fn" round trip: cvt.rn.satfinite, as Triton's .to(tl.float8e4nv).
__device__ __forceinline__ float e4m3_round(float x) {
    return e4m3_decode((unsigned)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// v holds 16 values of dtype T (as floats); they become T(QDQ(v)). FLOAT4_E2M1_MAX_RECIPROCAL is the
// float32 rounding of 1/6; tl.max and tl.clamp take the non-NaN operand.
template <typename T> __device__ __forceinline__ void triton_qdq16(float *v, float gs) {
    float vec_max = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) vec_max = fmaxf(vec_max, fabsf(v[i]));
    float scale = gs * (vec_max * 0.16666667163372040f);
    scale = e4m3_round(fminf(fmaxf(scale, -448.0f), 448.0f));
    const float output_scale = scale == 0.0f ? 0.0f : triton_div(gs, scale);
    const float dequant_scale = triton_div(scale, gs);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const float x = fminf(fmaxf(v[i] * output_scale, -6.0f), 6.0f);
        v[i] = round_t<T>(round_to_fp4(x) * dequant_scale);
    }
}

// ---- the input: router weight, then QDQ (one thread = one block of 16) ----

template <typename T>
__global__ void __launch_bounds__(kThreads)
input_kernel(const T *in, T *out, int64_t rows, int cols, const float *row_weight, float gs) {
    int64_t r, o;
    if (!block16_of((int64_t)blockIdx.x * blockDim.x + threadIdx.x, rows, cols, &r, &o)) return;
    float v[16];
    load16<T>(in + o, v);
    if (row_weight) {
        const float w = round_t<T>(row_weight[r]);
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = round_t<T>(v[j] * w);
    }
    triton_qdq16<T>(v, gs);
    store16<T>(out + o, v);
}

// ---- the activations, as vLLM's kernels round them ----

// act_and_mul_kernel's packed path (silu_and_mul, silu_and_mul_clamp): the clamped gate is stored
// back as T, the clamped up stays float; the activation is T; (float)act * (up + beta) -> T.
template <typename T>
__device__ __forceinline__ float silu_and_mul(const nvfp4moe_gpu_act_params &p, float g, float u) {
    if (p.has_limit) {
        g = round_t<T>(fminf(g, p.limit));
        u = fmaxf(fminf(u, p.limit), -p.limit);
    }
    const float activated = round_t<T>(g / (1.0f + expf(-g * p.alpha)));
    return round_t<T>(activated * (u + p.beta));
}

// gelu_kernel / torch's GELU: x * 0.5 * (1 + erf(x * M_SQRT1_2))
__device__ __forceinline__ float vllm_gelu_erf(float f) {
    constexpr float kAlpha = M_SQRT1_2;
    return f * 0.5f * (1.0f + ::erff(f * kAlpha));
}
// gelu_tanh_kernel / torch's GELU(tanh); nvcc contracts f + KAPPA * x_cube here as it does there.
__device__ __forceinline__ float vllm_gelu_tanh(float f) {
    constexpr float kBeta = M_SQRT2 * M_2_SQRTPI * 0.5f;
    constexpr float kKappa = 0.044715;
    const float x_cube = f * f * f;
    const float inner = kBeta * (f + kKappa * x_cube);
    return 0.5f * f * (1.0f + ::tanhf(inner));
}

template <typename T>
__device__ __forceinline__ float vllm_act_gated(const nvfp4moe_gpu_act_params &p, float g, float u) {
    switch (p.activation) {
    case NVFP4MOE_ACT_SILU:
    case NVFP4MOE_ACT_SWIGLUOAI_UNINTERLEAVE: return silu_and_mul<T>(p, g, u);
    case NVFP4MOE_ACT_GELU: return round_t<T>(round_t<T>(vllm_gelu_erf(g)) * (u + 0.0f));
    case NVFP4MOE_ACT_GELU_TANH: return round_t<T>(round_t<T>(vllm_gelu_tanh(g)) * (u + 0.0f));
    case NVFP4MOE_ACT_SWIGLUOAI: {   // swigluoai_and_mul: one rounding
        const float gc = fminf(g, p.limit), uc = fmaxf(fminf(u, p.limit), -p.limit);
        return round_t<T>((uc + 1.0f) * gc / (1.0f + expf(-gc * p.alpha)));
    }
    case NVFP4MOE_ACT_SWIGLUSTEP: {  // Triton: tl.sigmoid(gate) * gate = 1 / (1 + tl.exp(-gate)) * gate
        const float gate_silu = triton_div(1.0f, 1.0f + triton_exp(-g)) * g;
        return round_t<T>(fminf(gate_silu, p.limit) * fminf(fmaxf(u, -p.limit), p.limit));
    }
    case NVFP4MOE_ACT_SITU: {        // situ_activation, reciprocals taken once
        const float b = p.situ_beta, lb = p.situ_linear_beta;
        const float inv_beta = 1.0f / b, inv_lb = lb > 0.0f ? 1.0f / lb : 0.0f;
        const float gate_out = b * tanhf(g * inv_beta) / (1.0f + expf(-g));
        const float up_out = lb > 0.0f ? lb * tanhf(u * inv_lb) : u;
        return round_t<T>(gate_out * up_out);
    }
    default: return NAN;
    }
}

template <typename T> __device__ __forceinline__ float vllm_act_plain(int act, float x) {
    switch (act) {
    case NVFP4MOE_ACT_SILU_NO_MUL: return round_t<T>(x / (1.0f + expf(-x)));       // F.silu
    case NVFP4MOE_ACT_GELU_NO_MUL: return round_t<T>(vllm_gelu_erf(x));                 // F.gelu
    case NVFP4MOE_ACT_GELU_TANH_NO_MUL: return round_t<T>(vllm_gelu_tanh(x));           // F.gelu(tanh)
    case NVFP4MOE_ACT_RELU2_NO_MUL: {                                              // relu_, square
        const float r = x > 0.0f ? x : (isnan(x) ? x : 0.0f);
        return round_t<T>(r * r);
    }
    default: return NAN;
    }
}

// One thread = 16 outputs of one row: one QDQ block.
template <typename T>
__global__ void __launch_bounds__(kThreads)
activation_kernel(const T *in, T *out, int64_t rows, int I, int N1, nvfp4moe_gpu_act_params p, float gs) {
    int64_t r, o;
    if (!block16_of((int64_t)blockIdx.x * blockDim.x + threadIdx.x, rows, I, &r, &o)) return;
    float v[16];
    act_row16<T>(in + r * N1, I, (int)(o - r * I), p.activation,
                 [&](float g, float u) { return vllm_act_gated<T>(p, g, u); },
                 [&](float a) { return vllm_act_plain<T>(p.activation, a); }, v);
    triton_qdq16<T>(v, gs);
    store16<T>(out + o, v);
}

// ---- the GEMM ----
//
// A block computes 16 rows (one grouping block, one expert) x 64 columns. K is walked 64 at a
// time: the 16 gathered activation rows and the 64 dequantized weight rows are staged in shared
// memory as floats; each thread accumulates 1 row x 4 columns, k in order, with fmaf (the
// products of two 16-bit values are exact in float32, so each step is one rounding of the sum).
constexpr int kEBM = NVFP4MOE_EMUL_BLOCK_M, kEBN = 64, kEBK = 64;

template <typename T>
__global__ void __launch_bounds__(256) gemm_kernel(nvfp4moe_emul_args a) {
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
    const T *A = (const T *)a.a;
    const int r = tid >> 4, cl = tid & 15;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int ra = tid >> 4, ca = (tid & 15) * 4;
    const int pa = rows[ra];
    const T *arow = pa < a.P ? A + (int64_t)(pa / a.a_row_div) * K : nullptr;
    const int nl = tid >> 2, kc = (tid & 3) * 16;
    const int nw = n0 + nl;
    const uint8_t *wrow = a.w + ((int64_t)e * N + nw) * (K / 2);
    const uint8_t *srow = a.sf + ((int64_t)e * N + nw) * (K / 16);
    // Row nw's global scale: its half's (gate, up) with scale_2_halves, else the expert's.
    const int up = a.scale_2_halves == 1 ? nw >= N / 2 : a.scale_2_halves == 2 && (nw & 1);
    const float s2 = a.scale_2[a.scale_2_halves ? 2 * e + up : e];
    for (int k0 = 0; k0 < K; k0 += kEBK) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int k = k0 + ca + q;
            As[ra][ca + q] = (arow && k < K) ? to_f<T>(arow[k]) : 0.0f;
        }
        const int kw = k0 + kc;
        if (nw < N && kw < K) {
            const uint2 pk = *reinterpret_cast<const uint2 *>(wrow + kw / 2);
            // b_scale = fp8 scale * w_global_scale; low/high nibble * b_scale; .to(compute_type)
            const float bs = e4m3_decode(srow[kw / 16]) * s2;
            const uint32_t wd[2] = {pk.x, pk.y};
#pragma unroll
            for (int j = 0; j < 16; j++)
                Ws[kc + j][nl] = round_t<T>(e2m1_decode((wd[j >> 3] >> (4 * (j & 7))) & 15u) * bs);
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
    const float rs = a.row_scale ? a.row_scale[p] : 1.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int n = n0 + cl + 16 * j;
        if (n >= N) continue;
        float v = acc[j];
        if (a.bias) v = __fadd_rn(v, a.bias[(int64_t)e * N + n]);
        if (a.row_scale) v = __fmul_rn(v, rs);
        ((T *)a.c)[(int64_t)p * N + n] = from_f<T>(v);
    }
}

// ---- the division's reciprocal, for the host model of the QDQ ----

__global__ void __launch_bounds__(kThreads) triton_rcp_kernel(const float *b, float *out, int32_t n) {
    const int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = triton_div(1.0f, b[i]);
}

}  // namespace

typedef __nv_bfloat16 B;
typedef __half F;

extern "C" cudaError_t nvfp4moe_emul_input(const void *in, void *out, int64_t rows, int32_t cols,
                                           const float *row_weight, float gs, int32_t is_bf16, cudaStream_t stream) {
    const int64_t n = rows * (cols / 16);
    if (n <= 0) return cudaSuccess;
    const unsigned g = grid_for(n, kThreads);
    if (is_bf16) input_kernel<B><<<g, kThreads, 0, stream>>>((const B *)in, (B *)out, rows, cols, row_weight, gs);
    else input_kernel<F><<<g, kThreads, 0, stream>>>((const F *)in, (F *)out, rows, cols, row_weight, gs);
    return cudaGetLastError();
}

extern "C" cudaError_t nvfp4moe_emul_gemm(const nvfp4moe_emul_args *args, cudaStream_t stream) {
    if (args->max_blocks <= 0 || args->N <= 0) return cudaSuccess;
    dim3 grid((unsigned)args->max_blocks, (unsigned)((args->N + kEBN - 1) / kEBN));
    if (args->is_bf16) gemm_kernel<B><<<grid, 256, 0, stream>>>(*args);
    else gemm_kernel<F><<<grid, 256, 0, stream>>>(*args);
    return cudaGetLastError();
}

extern "C" cudaError_t nvfp4moe_emul_activation(const void *in, void *out, int64_t rows, int32_t I, int32_t N1,
                                                const nvfp4moe_gpu_act_params *ap, float gs, int32_t is_bf16,
                                                cudaStream_t stream) {
    const int64_t n = rows * (I / 16);
    if (n <= 0) return cudaSuccess;
    const unsigned g = grid_for(n, kThreads);
    if (is_bf16) activation_kernel<B><<<g, kThreads, 0, stream>>>((const B *)in, (B *)out, rows, I, N1, *ap, gs);
    else activation_kernel<F><<<g, kThreads, 0, stream>>>((const F *)in, (F *)out, rows, I, N1, *ap, gs);
    return cudaGetLastError();
}

extern "C" cudaError_t nvfp4moe_emul_triton_rcp(const float *b, float *out, int32_t n) {
    if (n <= 0) return cudaSuccess;
    float *d = NULL;
    const size_t bytes = sizeof(float) * (size_t)n;
    cudaError_t e = cudaMalloc(&d, 2 * bytes);
    if (e != cudaSuccess) return e;
    e = cudaMemcpy(d, b, bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) {
        triton_rcp_kernel<<<grid_for(n, kThreads), kThreads>>>(d, d + n, n);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpy(out, d + n, bytes, cudaMemcpyDeviceToHost);
    const cudaError_t f = cudaFree(d);
    return e != cudaSuccess ? e : f;
}
